//! The TCP state machine: Linux's `tcp_conntracks[2][6][TCP_CONNTRACK_MAX]` table
//! (`net/netfilter/nf_conntrack_proto_tcp.c`, as of Linux 6.x), without window tracking.

use super::Dir;

/// A TCP connection's state, as Linux's `enum tcp_conntrack` (names as `conntrack -L` prints
/// them). Entries of other protocols are always [`CtState::None`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize),
    serde(rename_all = "snake_case")
)]
pub enum CtState {
    /// No TCP state (also the state of every non-TCP entry).
    None = 0,
    /// A SYN was seen in the original direction.
    SynSent = 1,
    /// The SYN-ACK was seen.
    SynRecv = 2,
    /// The handshake's ACK (or a picked-up mid-stream packet) was seen.
    Established = 3,
    /// A FIN was seen.
    FinWait = 4,
    /// The first FIN was acknowledged.
    CloseWait = 5,
    /// FINs were seen in both directions; waiting for the last ACK.
    LastAck = 6,
    /// The last ACK was seen.
    TimeWait = 7,
    /// Reset.
    Close = 8,
    /// A SYN was seen in the reply direction too: simultaneous open.
    SynSent2 = 9,
}

impl CtState {
    /// Every state, in discriminant order.
    pub const ALL: [CtState; 10] = [
        CtState::None,
        CtState::SynSent,
        CtState::SynRecv,
        CtState::Established,
        CtState::FinWait,
        CtState::CloseWait,
        CtState::LastAck,
        CtState::TimeWait,
        CtState::Close,
        CtState::SynSent2,
    ];

    /// The state of discriminant `v` (`None` for anything out of range).
    pub fn from_u8(v: u8) -> CtState {
        CtState::ALL
            .get(usize::from(v))
            .copied()
            .unwrap_or(CtState::None)
    }

    /// The name `conntrack -L` prints (`ESTABLISHED`, `TIME_WAIT`, ...).
    pub fn name(self) -> &'static str {
        match self {
            CtState::None => "NONE",
            CtState::SynSent => "SYN_SENT",
            CtState::SynRecv => "SYN_RECV",
            CtState::Established => "ESTABLISHED",
            CtState::FinWait => "FIN_WAIT",
            CtState::CloseWait => "CLOSE_WAIT",
            CtState::LastAck => "LAST_ACK",
            CtState::TimeWait => "TIME_WAIT",
            CtState::Close => "CLOSE",
            CtState::SynSent2 => "SYN_SENT2",
        }
    }
}

/// TCP flag bits in the header's flags byte (the TCP view's).
pub use crate::wire::tcp::flags;

/// The table's packet classes (Linux's `enum tcp_bit_set`).
pub(crate) const SYN_SET: usize = 0;
pub(crate) const SYNACK_SET: usize = 1;
pub(crate) const FIN_SET: usize = 2;
pub(crate) const ACK_SET: usize = 3;
pub(crate) const RST_SET: usize = 4;
pub(crate) const NONE_SET: usize = 5;

/// Linux's `get_conntrack_index`: RST wins, then SYN (with or without ACK), FIN, ACK.
pub(crate) fn flag_index(f: u8) -> usize {
    if f & flags::RST != 0 {
        RST_SET
    } else if f & flags::SYN != 0 {
        if f & flags::ACK != 0 {
            SYNACK_SET
        } else {
            SYN_SET
        }
    } else if f & flags::FIN != 0 {
        FIN_SET
    } else if f & flags::ACK != 0 {
        ACK_SET
    } else {
        NONE_SET
    }
}

/// A cell of the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Next {
    /// Move to (or stay in) this state.
    To(CtState),
    /// `sIV`: the packet is invalid for the connection.
    Invalid,
    /// `sIG`: let it through without changing anything (it may resync a connection).
    Ignore,
}

use CtState::{
    Close as CL, CloseWait as CW, Established as ES, FinWait as FW, LastAck as LA, None as NO,
    SynRecv as SR, SynSent as SS, SynSent2 as S2, TimeWait as TW,
};
use Next::{Ignore as IG, Invalid as IV};

const fn t(s: CtState) -> Next {
    Next::To(s)
}

/// `TCP_CONNTRACKS[dir][flag index][old state]`, columns in [`CtState`] order:
/// sNO, sSS, sSR, sES, sFW, sCW, sLA, sTW, sCL, sS2.
#[rustfmt::skip]
pub(crate) const TCP_CONNTRACKS: [[[Next; 10]; 6]; 2] = [
    // ORIGINAL
    [
        /*syn*/    [t(SS), t(SS), IG,    IG,    IG,    IG,    IG,    t(SS), t(SS), t(S2)],
        /*synack*/ [IV,    IV,    t(SR), IV,    IV,    IV,    IV,    IV,    IV,    t(SR)],
        /*fin*/    [IV,    IV,    t(FW), t(FW), t(LA), t(LA), t(LA), t(TW), t(CL), IV   ],
        /*ack*/    [t(ES), IV,    t(ES), t(ES), t(CW), t(CW), t(TW), t(TW), t(CL), IV   ],
        /*rst*/    [IV,    t(CL), t(CL), t(CL), t(CL), t(CL), t(CL), t(CL), t(CL), t(CL)],
        /*none*/   [IV,    IV,    IV,    IV,    IV,    IV,    IV,    IV,    IV,    IV   ],
    ],
    // REPLY
    [
        /*syn*/    [IV,    t(S2), IV,    IV,    IV,    IV,    IV,    t(SS), IV,    t(S2)],
        /*synack*/ [IV,    t(SR), IG,    IG,    IG,    IG,    IG,    IG,    IG,    t(SR)],
        /*fin*/    [IV,    IV,    t(FW), t(FW), t(LA), t(LA), t(LA), t(TW), t(CL), IV   ],
        /*ack*/    [IV,    IG,    t(SR), t(ES), t(CW), t(CW), t(TW), t(TW), t(CL), IG   ],
        /*rst*/    [IV,    t(CL), t(CL), t(CL), t(CL), t(CL), t(CL), t(CL), t(CL), t(CL)],
        /*none*/   [IV,    IV,    IV,    IV,    IV,    IV,    IV,    IV,    IV,    IV   ],
    ],
];

/// The table lookup for a packet with TCP flags `f` travelling in `dir` on a connection in
/// state `old`.
pub(crate) fn next(dir: Dir, f: u8, old: CtState) -> Next {
    TCP_CONNTRACKS[dir as usize][flag_index(f)][old as usize]
}

// Keep the `NO` alias used (it documents the first column).
const _: CtState = NO;

#[cfg(test)]
mod tests {
    use super::flags::*;
    use super::*;

    #[test]
    fn flag_classes_follow_linux_priority() {
        assert_eq!(flag_index(SYN), SYN_SET);
        assert_eq!(flag_index(SYN | ACK), SYNACK_SET);
        assert_eq!(flag_index(FIN | ACK), FIN_SET);
        assert_eq!(flag_index(ACK | PSH), ACK_SET);
        assert_eq!(flag_index(RST | ACK), RST_SET);
        assert_eq!(flag_index(RST | SYN), RST_SET);
        assert_eq!(flag_index(PSH), NONE_SET);
        assert_eq!(flag_index(0), NONE_SET);
    }

    #[test]
    fn states_round_trip() {
        for s in CtState::ALL {
            assert_eq!(CtState::from_u8(s as u8), s);
        }
        assert_eq!(CtState::from_u8(200), CtState::None);
    }
}
