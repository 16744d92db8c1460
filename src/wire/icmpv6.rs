//! ICMPv6 (RFC 4443) and Neighbor Discovery (RFC 4861): the view [`Icmpv6Packet`] over the
//! 4-byte header, the second word and the body (the ICMP view shared with ICMPv4, with its
//! pseudo-header checksum), the NDP options walker ([`NdOptions`]), and the
//! messages the router sends and answers as values ([`Icmpv6Repr`]: echo, errors quoting a
//! packet, Router Solicitation/Advertisement, Neighbor Solicitation/Advertisement).
//!
//! The checksum covers the IPv6 pseudo-header (RFC 4443 2.3): verifying and filling take the
//! packet's source and destination addresses.
//!
//! ```
//! use std::net::Ipv6Addr;
//! use tapyard::wire::icmpv6::{Icmpv6Packet, Icmpv6Repr};
//! use tapyard::MacAddr;
//!
//! let (src, dst): (Ipv6Addr, Ipv6Addr) = ("fe80::1".parse().unwrap(), "ff02::1:ff00:2".parse().unwrap());
//! let ns = Icmpv6Repr::NeighborSolicit {
//!     target: "fd00::2".parse().unwrap(),
//!     source_lladdr: Some(MacAddr([2, 0, 0, 0, 0, 1])),
//! };
//! let mut buf = vec![0u8; ns.buffer_len()];
//! ns.emit(&mut Icmpv6Packet::new_unchecked(&mut buf[..]), src, dst);
//! let p = Icmpv6Packet::new_checked(&buf[..]).unwrap();
//! assert_eq!(Icmpv6Repr::parse(&p, src, dst), Ok(ns));
//! ```

use std::net::Ipv6Addr;

use crate::narrow::low8;
pub use crate::wire::icmp::Echo;
use crate::wire::ipv6::{l4_checksum, l4_verifies, NH_ICMPV6};
use crate::wire::mac::MacAddr;
use crate::wire::Error;

/// Length of the ICMPv6 header: type, code, checksum and the second 32-bit word (the same as
/// ICMPv4's: one view, [`IcmpPacket`](super::icmp::IcmpPacket), reads both).
pub const HEADER_LEN: usize = super::icmp::HEADER_LEN;

/// ICMPv6 types and codes tapyard reads and sends.
pub mod codes {
    /// Destination unreachable.
    pub const DST_UNREACH: u8 = 1;
    /// Packet too big.
    pub const PACKET_TOO_BIG: u8 = 2;
    /// Time exceeded.
    pub const TIME_EXCEEDED: u8 = 3;
    /// Parameter problem.
    pub const PARAM_PROBLEM: u8 = 4;
    /// Echo request.
    pub const ECHO_REQUEST: u8 = 128;
    /// Echo reply.
    pub const ECHO_REPLY: u8 = 129;
    /// Router Solicitation.
    pub const ROUTER_SOLICIT: u8 = 133;
    /// Router Advertisement.
    pub const ROUTER_ADVERT: u8 = 134;
    /// Neighbor Solicitation.
    pub const NEIGHBOR_SOLICIT: u8 = 135;
    /// Neighbor Advertisement.
    pub const NEIGHBOR_ADVERT: u8 = 136;
    /// Redirect.
    pub const REDIRECT: u8 = 137;
    /// Destination unreachable code: no route to destination.
    pub const NO_ROUTE: u8 = 0;
    /// Destination unreachable code: administratively prohibited.
    pub const ADMIN_PROHIBITED: u8 = 1;
    /// Destination unreachable code: address unreachable.
    pub const ADDR_UNREACH: u8 = 3;
    /// Destination unreachable code: port unreachable.
    pub const PORT_UNREACH: u8 = 4;
    /// Destination unreachable code: reject route to destination.
    pub const REJECT_ROUTE: u8 = 6;
    /// Time exceeded code: hop limit exceeded in transit.
    pub const HOP_LIMIT_EXCEEDED: u8 = 0;
}

/// NDP option types (RFC 4861 4.6).
pub mod opt {
    /// Source link-layer address.
    pub const SOURCE_LLADDR: u8 = 1;
    /// Target link-layer address.
    pub const TARGET_LLADDR: u8 = 2;
    /// Prefix information.
    pub const PREFIX_INFO: u8 = 3;
    /// MTU.
    pub const MTU: u8 = 5;
}

/// True for the error messages (types below 128), which quote the packet that caused them.
#[inline]
pub const fn is_error(ty: u8) -> bool {
    ty < 128
}

/// True for the NDP messages (133..=137).
#[inline]
pub const fn is_ndp(ty: u8) -> bool {
    matches!(ty, 133..=137)
}

pub use super::icmp::Icmpv6Packet;

impl<T: AsRef<[u8]>> Icmpv6Packet<T> {
    /// The MTU of a packet too big message.
    #[inline]
    pub fn mtu(&self) -> u32 {
        self.rest()
    }

    /// True when the checksum over the pseudo-header (`src`, `dst`) and the whole message
    /// verifies.
    #[inline]
    pub fn verify_checksum(&self, src: Ipv6Addr, dst: Ipv6Addr) -> bool {
        l4_verifies(src, dst, NH_ICMPV6, self.as_bytes())
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Icmpv6Packet<T> {
    /// Recomputes the checksum over the pseudo-header (`src`, `dst`) and the whole message.
    #[inline]
    pub fn fill_checksum(&mut self, src: Ipv6Addr, dst: Ipv6Addr) {
        self.set_checksum(0);
        let c = l4_checksum(src, dst, NH_ICMPV6, self.as_bytes());
        self.set_checksum(c);
    }
}

/// One NDP option: its type and its body (after the 2-byte type and length).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NdOption<'a> {
    /// The option type (see [`opt`]).
    pub kind: u8,
    /// The bytes after type and length (the option's length × 8 − 2).
    pub body: &'a [u8],
}

/// Walks the options of an NDP message body (RFC 4861 4.6): yields each option; an option
/// of length 0 is [`Error::Malformed`] (as the RFC says a node must discard the packet) and
/// one running past the end [`Error::Truncated`]; the walk stops at the first error.
#[derive(Clone, Debug)]
pub struct NdOptions<'a> {
    rest: &'a [u8],
}

impl<'a> NdOptions<'a> {
    /// A walker over the options area `b`.
    pub fn new(b: &'a [u8]) -> NdOptions<'a> {
        NdOptions { rest: b }
    }
}

impl<'a> Iterator for NdOptions<'a> {
    type Item = Result<NdOption<'a>, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let r = match self.rest {
            [_] => Err(Error::Truncated),
            [_, 0, ..] => Err(Error::Malformed),
            [kind, len, ..] => {
                let n = usize::from(*len) * 8;
                match self.rest.get(2..n) {
                    Some(body) => {
                        let kind = *kind;
                        self.rest = &self.rest[n..];
                        return Some(Ok(NdOption { kind, body }));
                    }
                    None => Err(Error::Truncated),
                }
            }
            [] => return None,
        };
        self.rest = &[];
        Some(r)
    }
}

/// The prefix information option of a router advertisement (RFC 4861 4.6.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PrefixInfo {
    /// Prefix length.
    pub prefix_len: u8,
    /// The L flag: the prefix is on-link.
    pub on_link: bool,
    /// The A flag: hosts may form addresses in it (SLAAC).
    pub autonomous: bool,
    /// Valid lifetime in seconds (`u32::MAX`: infinite).
    pub valid_lifetime: u32,
    /// Preferred lifetime in seconds.
    pub preferred_lifetime: u32,
    /// The prefix.
    pub prefix: Ipv6Addr,
}

/// The flags of a neighbor advertisement (RFC 4861 4.4).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct NaFlags {
    /// R: the sender is a router.
    pub router: bool,
    /// S: sent in answer to a solicitation.
    pub solicited: bool,
    /// O: override an existing cache entry.
    pub override_: bool,
}

impl NaFlags {
    fn word(self) -> u32 {
        (u32::from(self.router) << 31)
            | (u32::from(self.solicited) << 30)
            | (u32::from(self.override_) << 29)
    }
    fn from_word(w: u32) -> NaFlags {
        NaFlags {
            router: w & (1 << 31) != 0,
            solicited: w & (1 << 30) != 0,
            override_: w & (1 << 29) != 0,
        }
    }
}

/// The ICMPv6 messages tapyard parses and builds, as values borrowing their data.
///
/// NDP messages carry the options tapyard uses; others are skipped when parsed (an RA keeps
/// its first prefix information option).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Icmpv6Repr<'a> {
    /// Echo request.
    EchoRequest(Echo<'a>),
    /// Echo reply.
    EchoReply(Echo<'a>),
    /// Destination unreachable (codes in [`codes`]: 0 no route, 1 admin, 3 address, 4 port,
    /// 6 reject route).
    DstUnreachable {
        /// Code.
        code: u8,
        /// The quoted packet.
        data: &'a [u8],
    },
    /// Packet too big, with the MTU of the next link.
    PacketTooBig {
        /// The MTU.
        mtu: u32,
        /// The quoted packet.
        data: &'a [u8],
    },
    /// Time exceeded (code 0: hop limit exceeded in transit).
    TimeExceeded {
        /// Code.
        code: u8,
        /// The quoted packet.
        data: &'a [u8],
    },
    /// Parameter problem.
    ParamProblem {
        /// Code.
        code: u8,
        /// Offset of the faulty byte in the quoted packet.
        pointer: u32,
        /// The quoted packet.
        data: &'a [u8],
    },
    /// Router Solicitation.
    RouterSolicit {
        /// The source link-layer address option.
        source_lladdr: Option<MacAddr>,
    },
    /// Router Advertisement.
    RouterAdvert {
        /// Cur hop limit for hosts (0: unspecified).
        hop_limit: u8,
        /// The M (managed) and O (other configuration) flags, as the byte's two high bits.
        flags: u8,
        /// Router lifetime in seconds (0: not a default router).
        router_lifetime: u16,
        /// Reachable time in ms (0: unspecified).
        reachable_time: u32,
        /// Retransmission timer in ms (0: unspecified).
        retrans_time: u32,
        /// The source link-layer address option.
        source_lladdr: Option<MacAddr>,
        /// The MTU option.
        mtu: Option<u32>,
        /// The (first) prefix information option.
        prefix_info: Option<PrefixInfo>,
    },
    /// Neighbor Solicitation.
    NeighborSolicit {
        /// The address asked about.
        target: Ipv6Addr,
        /// The source link-layer address option.
        source_lladdr: Option<MacAddr>,
    },
    /// Neighbor Advertisement.
    NeighborAdvert {
        /// R, S and O.
        flags: NaFlags,
        /// The address advertised.
        target: Ipv6Addr,
        /// The target link-layer address option.
        target_lladdr: Option<MacAddr>,
    },
}

fn lladdr(body: &[u8]) -> Result<MacAddr, Error> {
    // Ethernet: the option is 8 bytes, its body the 6-byte MAC.
    match body {
        [a, b, c, d, e, f] => Ok(MacAddr([*a, *b, *c, *d, *e, *f])),
        _ => Err(Error::Malformed),
    }
}

fn addr_at(b: &[u8], at: usize) -> Result<Ipv6Addr, Error> {
    let a: &[u8; 16] = b
        .get(at..at + 16)
        .and_then(|s| s.first_chunk())
        .ok_or(Error::Truncated)?;
    Ok(Ipv6Addr::from(*a))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    match b.get(at..at + 4) {
        Some(&[a, b2, c, d]) => u32::from_be_bytes([a, b2, c, d]),
        _ => 0,
    }
}

impl<'a> Icmpv6Repr<'a> {
    /// Reads a checked message from `src` to `dst`: [`Error::Malformed`] for a bad checksum,
    /// a nonzero code where only 0 is defined (echo, NDP), NDP options with length 0 or a
    /// link-layer option that is not 6 bytes, a multicast NS/NA target, or a type tapyard does
    /// not handle; [`Error::Truncated`] for an NDP body shorter than its fixed part or an
    /// option past the end.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(
        p: &Icmpv6Packet<&'a T>,
        src: Ipv6Addr,
        dst: Ipv6Addr,
    ) -> Result<Self, Error> {
        if !p.verify_checksum(src, dst) {
            return Err(Error::Malformed);
        }
        let data = p.borrowed_data();
        let (ty, code) = (p.msg_type(), p.code());
        if is_ndp(ty) && code != 0 {
            return Err(Error::Malformed);
        }
        Ok(match ty {
            codes::ECHO_REQUEST if code == 0 => Icmpv6Repr::EchoRequest(p.echo()),
            codes::ECHO_REPLY if code == 0 => Icmpv6Repr::EchoReply(p.echo()),
            codes::DST_UNREACH => Icmpv6Repr::DstUnreachable { code, data },
            codes::PACKET_TOO_BIG => Icmpv6Repr::PacketTooBig { mtu: p.mtu(), data },
            codes::TIME_EXCEEDED => Icmpv6Repr::TimeExceeded { code, data },
            codes::PARAM_PROBLEM => Icmpv6Repr::ParamProblem {
                code,
                pointer: p.rest(),
                data,
            },
            codes::ROUTER_SOLICIT => {
                let mut source_lladdr = None;
                for o in NdOptions::new(data) {
                    let o = o?;
                    if o.kind == opt::SOURCE_LLADDR {
                        source_lladdr = Some(lladdr(o.body)?);
                    }
                }
                Icmpv6Repr::RouterSolicit { source_lladdr }
            }
            codes::ROUTER_ADVERT => {
                // Fixed part: hop limit, flags, lifetime (in the second word), then reachable
                // time and retrans timer (8 bytes of the body).
                let fixed = data.get(..8).ok_or(Error::Truncated)?;
                let rest = p.rest();
                let (mut source_lladdr, mut mtu, mut prefix_info) = (None, None, None);
                for o in NdOptions::new(&data[8..]) {
                    let o = o?;
                    match o.kind {
                        opt::SOURCE_LLADDR => source_lladdr = Some(lladdr(o.body)?),
                        opt::MTU => mtu = Some(u32_at(o.body, 2)),
                        opt::PREFIX_INFO if prefix_info.is_none() => {
                            if o.body.len() != 30 {
                                return Err(Error::Malformed);
                            }
                            let b = o.body;
                            prefix_info = Some(PrefixInfo {
                                prefix_len: b[0],
                                on_link: b[1] & 0x80 != 0,
                                autonomous: b[1] & 0x40 != 0,
                                valid_lifetime: u32_at(b, 2),
                                preferred_lifetime: u32_at(b, 6),
                                prefix: addr_at(b, 14)?,
                            });
                        }
                        _ => {}
                    }
                }
                Icmpv6Repr::RouterAdvert {
                    hop_limit: low8(u64::from(rest >> 24)),
                    flags: low8(u64::from(rest >> 16)),
                    router_lifetime: u16::try_from(rest & 0xffff).unwrap_or(0),
                    reachable_time: u32_at(fixed, 0),
                    retrans_time: u32_at(fixed, 4),
                    source_lladdr,
                    mtu,
                    prefix_info,
                }
            }
            codes::NEIGHBOR_SOLICIT | codes::NEIGHBOR_ADVERT => {
                let target = addr_at(data, 0)?;
                if target.is_multicast() {
                    return Err(Error::Malformed);
                }
                let mut ll = None;
                let want = if ty == codes::NEIGHBOR_SOLICIT {
                    opt::SOURCE_LLADDR
                } else {
                    opt::TARGET_LLADDR
                };
                for o in NdOptions::new(&data[16..]) {
                    let o = o?;
                    if o.kind == want {
                        ll = Some(lladdr(o.body)?);
                    }
                }
                if ty == codes::NEIGHBOR_SOLICIT {
                    Icmpv6Repr::NeighborSolicit {
                        target,
                        source_lladdr: ll,
                    }
                } else {
                    Icmpv6Repr::NeighborAdvert {
                        flags: NaFlags::from_word(p.rest()),
                        target,
                        target_lladdr: ll,
                    }
                }
            }
            _ => return Err(Error::Malformed),
        })
    }

    /// The same error carrying `data` as its quote; `None` for a message that is not an error.
    pub fn with_data<'b>(self, data: &'b [u8]) -> Option<Icmpv6Repr<'b>> {
        Some(match self {
            Icmpv6Repr::DstUnreachable { code, .. } => Icmpv6Repr::DstUnreachable { code, data },
            Icmpv6Repr::PacketTooBig { mtu, .. } => Icmpv6Repr::PacketTooBig { mtu, data },
            Icmpv6Repr::TimeExceeded { code, .. } => Icmpv6Repr::TimeExceeded { code, data },
            Icmpv6Repr::ParamProblem { code, pointer, .. } => Icmpv6Repr::ParamProblem {
                code,
                pointer,
                data,
            },
            _ => return None,
        })
    }

    /// Length of the message.
    pub fn buffer_len(&self) -> usize {
        let ll = |o: &Option<MacAddr>| if o.is_some() { 8 } else { 0 };
        HEADER_LEN
            + match self {
                Icmpv6Repr::EchoRequest(Echo { data, .. })
                | Icmpv6Repr::EchoReply(Echo { data, .. })
                | Icmpv6Repr::DstUnreachable { data, .. }
                | Icmpv6Repr::PacketTooBig { data, .. }
                | Icmpv6Repr::TimeExceeded { data, .. }
                | Icmpv6Repr::ParamProblem { data, .. } => data.len(),
                Icmpv6Repr::RouterSolicit { source_lladdr } => ll(source_lladdr),
                Icmpv6Repr::RouterAdvert {
                    source_lladdr,
                    mtu,
                    prefix_info,
                    ..
                } => {
                    8 + ll(source_lladdr)
                        + if mtu.is_some() { 8 } else { 0 }
                        + if prefix_info.is_some() { 32 } else { 0 }
                }
                Icmpv6Repr::NeighborSolicit { source_lladdr, .. } => 16 + ll(source_lladdr),
                Icmpv6Repr::NeighborAdvert { target_lladdr, .. } => 16 + ll(target_lladdr),
            }
    }

    /// Writes the message and its checksum (from `src` to `dst`) into a packet of
    /// [`Icmpv6Repr::buffer_len`] bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        p: &mut Icmpv6Packet<T>,
        src: Ipv6Addr,
        dst: Ipv6Addr,
    ) {
        fn put_ll(b: &mut [u8], kind: u8, mac: MacAddr) -> usize {
            b[0] = kind;
            b[1] = 1;
            b[2..8].copy_from_slice(&mac.0);
            8
        }
        let (ty, code, rest) = match *self {
            Icmpv6Repr::EchoRequest(e) | Icmpv6Repr::EchoReply(e) => {
                let ty = if matches!(self, Icmpv6Repr::EchoRequest(_)) {
                    codes::ECHO_REQUEST
                } else {
                    codes::ECHO_REPLY
                };
                p.set_echo(ty, &e);
                p.fill_checksum(src, dst);
                return;
            }
            Icmpv6Repr::DstUnreachable { code, .. } => (codes::DST_UNREACH, code, 0),
            Icmpv6Repr::PacketTooBig { mtu, .. } => (codes::PACKET_TOO_BIG, 0, mtu),
            Icmpv6Repr::TimeExceeded { code, .. } => (codes::TIME_EXCEEDED, code, 0),
            Icmpv6Repr::ParamProblem { code, pointer, .. } => (codes::PARAM_PROBLEM, code, pointer),
            Icmpv6Repr::RouterSolicit { .. } => (codes::ROUTER_SOLICIT, 0, 0),
            Icmpv6Repr::RouterAdvert {
                hop_limit,
                flags,
                router_lifetime,
                ..
            } => (
                codes::ROUTER_ADVERT,
                0,
                (u32::from(hop_limit) << 24)
                    | (u32::from(flags) << 16)
                    | u32::from(router_lifetime),
            ),
            Icmpv6Repr::NeighborSolicit { .. } => (codes::NEIGHBOR_SOLICIT, 0, 0),
            Icmpv6Repr::NeighborAdvert { flags, .. } => (codes::NEIGHBOR_ADVERT, 0, flags.word()),
        };
        p.set_msg_type(ty);
        p.set_code(code);
        p.set_rest(rest);
        let d = p.data_mut();
        match *self {
            Icmpv6Repr::EchoRequest(_) | Icmpv6Repr::EchoReply(_) => {}
            Icmpv6Repr::DstUnreachable { data, .. }
            | Icmpv6Repr::PacketTooBig { data, .. }
            | Icmpv6Repr::TimeExceeded { data, .. }
            | Icmpv6Repr::ParamProblem { data, .. } => d[..data.len()].copy_from_slice(data),
            Icmpv6Repr::RouterSolicit { source_lladdr } => {
                if let Some(m) = source_lladdr {
                    put_ll(d, opt::SOURCE_LLADDR, m);
                }
            }
            Icmpv6Repr::RouterAdvert {
                reachable_time,
                retrans_time,
                source_lladdr,
                mtu,
                prefix_info,
                ..
            } => {
                d[0..4].copy_from_slice(&reachable_time.to_be_bytes());
                d[4..8].copy_from_slice(&retrans_time.to_be_bytes());
                let mut at = 8;
                if let Some(m) = source_lladdr {
                    at += put_ll(&mut d[at..], opt::SOURCE_LLADDR, m);
                }
                if let Some(mtu) = mtu {
                    let o = &mut d[at..at + 8];
                    o[0] = opt::MTU;
                    o[1] = 1;
                    o[2..4].fill(0);
                    o[4..8].copy_from_slice(&mtu.to_be_bytes());
                    at += 8;
                }
                if let Some(pi) = prefix_info {
                    let o = &mut d[at..at + 32];
                    o[0] = opt::PREFIX_INFO;
                    o[1] = 4;
                    o[2] = pi.prefix_len;
                    o[3] = (u8::from(pi.on_link) << 7) | (u8::from(pi.autonomous) << 6);
                    o[4..8].copy_from_slice(&pi.valid_lifetime.to_be_bytes());
                    o[8..12].copy_from_slice(&pi.preferred_lifetime.to_be_bytes());
                    o[12..16].fill(0);
                    o[16..32].copy_from_slice(&pi.prefix.octets());
                }
            }
            Icmpv6Repr::NeighborSolicit {
                target,
                source_lladdr: ll,
            }
            | Icmpv6Repr::NeighborAdvert {
                target,
                target_lladdr: ll,
                ..
            } => {
                d[..16].copy_from_slice(&target.octets());
                if let Some(m) = ll {
                    let kind = if ty == codes::NEIGHBOR_SOLICIT {
                        opt::SOURCE_LLADDR
                    } else {
                        opt::TARGET_LLADDR
                    };
                    put_ll(&mut d[16..], kind, m);
                }
            }
        }
        p.fill_checksum(src, dst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const A: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);
    const B: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 1, 0xff00, 2);

    #[test]
    fn echo_request_checksum_matches_etherparse() {
        let mut f = Vec::new();
        etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
            .ipv6(A.octets(), Ipv6Addr::LOCALHOST.octets(), 64)
            .icmpv6_echo_request(7, 9)
            .write(&mut f, b"hello")
            .unwrap();
        let p = Icmpv6Packet::new_checked(&f[54..]).unwrap();
        assert!(p.verify_checksum(A, Ipv6Addr::LOCALHOST));
        assert!(!p.verify_checksum(A, B));
        assert_eq!(
            Icmpv6Repr::parse(&p, A, Ipv6Addr::LOCALHOST),
            Ok(Icmpv6Repr::EchoRequest(Echo {
                ident: 7,
                seq_no: 9,
                data: b"hello"
            }))
        );
    }

    #[test]
    fn ndp_option_lengths_are_checked() {
        let ns = Icmpv6Repr::NeighborSolicit {
            target: "fd00::2".parse().unwrap(),
            source_lladdr: Some(MacAddr([2, 0, 0, 0, 0, 1])),
        };
        let mut b = vec![0u8; ns.buffer_len()];
        ns.emit(&mut Icmpv6Packet::new_unchecked(&mut b[..]), A, B);
        // Option length 0: malformed even with a good checksum.
        b[25] = 0;
        Icmpv6Packet::new_unchecked(&mut b[..]).fill_checksum(A, B);
        let p = Icmpv6Packet::new_checked(&b[..]).unwrap();
        assert_eq!(Icmpv6Repr::parse(&p, A, B), Err(Error::Malformed));
        // Option length past the end: truncated.
        b[25] = 2;
        Icmpv6Packet::new_unchecked(&mut b[..]).fill_checksum(A, B);
        let p = Icmpv6Packet::new_checked(&b[..]).unwrap();
        assert_eq!(Icmpv6Repr::parse(&p, A, B), Err(Error::Truncated));
        // Multicast target and nonzero code: malformed.
        let bad = Icmpv6Repr::NeighborSolicit {
            target: B,
            source_lladdr: None,
        };
        let mut b = vec![0u8; bad.buffer_len()];
        bad.emit(&mut Icmpv6Packet::new_unchecked(&mut b[..]), A, B);
        assert_eq!(
            Icmpv6Repr::parse(&Icmpv6Packet::new_checked(&b[..]).unwrap(), A, B),
            Err(Error::Malformed)
        );
    }

    fn mac() -> impl Strategy<Value = Option<MacAddr>> {
        proptest::option::of(any::<[u8; 6]>().prop_map(MacAddr))
    }

    fn addr() -> impl Strategy<Value = Ipv6Addr> {
        any::<u128>().prop_map(|a| Ipv6Addr::from(a & !(0xff << 120)))
    }

    fn repr(data: &[u8]) -> impl Strategy<Value = Icmpv6Repr<'_>> {
        prop_oneof![
            (any::<u16>(), any::<u16>()).prop_map(move |(ident, seq_no)| Icmpv6Repr::EchoRequest(
                Echo {
                    ident,
                    seq_no,
                    data
                }
            )),
            (any::<u16>(), any::<u16>()).prop_map(move |(ident, seq_no)| Icmpv6Repr::EchoReply(
                Echo {
                    ident,
                    seq_no,
                    data
                }
            )),
            any::<u8>().prop_map(move |code| Icmpv6Repr::DstUnreachable { code, data }),
            any::<u32>().prop_map(move |mtu| Icmpv6Repr::PacketTooBig { mtu, data }),
            any::<u8>().prop_map(move |code| Icmpv6Repr::TimeExceeded { code, data }),
            (any::<u8>(), any::<u32>()).prop_map(move |(code, pointer)| Icmpv6Repr::ParamProblem {
                code,
                pointer,
                data
            }),
            mac().prop_map(|source_lladdr| Icmpv6Repr::RouterSolicit { source_lladdr }),
            (
                any::<(u8, u8, u16, u32, u32)>(),
                mac(),
                proptest::option::of(any::<u32>()),
                proptest::option::of((any::<(u8, bool, bool, u32, u32)>(), addr()))
            )
                .prop_map(
                    |(
                        (hop_limit, flags, router_lifetime, reachable_time, retrans_time),
                        source_lladdr,
                        mtu,
                        pi,
                    )| {
                        Icmpv6Repr::RouterAdvert {
                            hop_limit,
                            flags,
                            router_lifetime,
                            reachable_time,
                            retrans_time,
                            source_lladdr,
                            mtu,
                            prefix_info: pi.map(
                                |(
                                    (
                                        prefix_len,
                                        on_link,
                                        autonomous,
                                        valid_lifetime,
                                        preferred_lifetime,
                                    ),
                                    prefix,
                                )| PrefixInfo {
                                    prefix_len,
                                    on_link,
                                    autonomous,
                                    valid_lifetime,
                                    preferred_lifetime,
                                    prefix,
                                },
                            ),
                        }
                    }
                ),
            (addr(), mac()).prop_map(|(target, source_lladdr)| Icmpv6Repr::NeighborSolicit {
                target,
                source_lladdr
            }),
            (any::<(bool, bool, bool)>(), addr(), mac()).prop_map(
                |((router, solicited, override_), target, target_lladdr)| {
                    Icmpv6Repr::NeighborAdvert {
                        flags: NaFlags {
                            router,
                            solicited,
                            override_,
                        },
                        target,
                        target_lladdr,
                    }
                }
            ),
        ]
    }

    proptest! {
        #[test]
        fn round_trip(data in proptest::collection::vec(any::<u8>(), 0..64), seed in any::<u64>()) {
            let mut runner = proptest::test_runner::TestRunner::new_with_rng(
                Default::default(),
                proptest::test_runner::TestRng::from_seed(
                    proptest::test_runner::RngAlgorithm::ChaCha,
                    &[&seed.to_le_bytes()[..], &[0u8; 24]].concat(),
                ),
            );
            let r = proptest::strategy::ValueTree::current(&repr(&data).new_tree(&mut runner).unwrap());
            let mut b = vec![0u8; r.buffer_len()];
            r.emit(&mut Icmpv6Packet::new_unchecked(&mut b[..]), A, B);
            let p = Icmpv6Packet::new_checked(&b[..]).unwrap();
            prop_assert_eq!(Icmpv6Repr::parse(&p, A, B), Ok(r));
            for n in 0..HEADER_LEN {
                prop_assert!(Icmpv6Packet::new_checked(&b[..n]).is_err());
            }
            for n in HEADER_LEN..b.len() {
                let _ = Icmpv6Repr::parse(&Icmpv6Packet::new_checked(&b[..n]).unwrap(), A, B);
            }
        }

        #[test]
        fn garbage_never_panics(b in proptest::collection::vec(any::<u8>(), 0..128), fix in any::<bool>()) {
            let mut b = b;
            if b.len() >= HEADER_LEN && fix {
                Icmpv6Packet::new_unchecked(&mut b[..]).fill_checksum(A, B);
            }
            if let Ok(p) = Icmpv6Packet::new_checked(&b[..]) {
                let _ = (p.msg_type(), p.code(), p.rest(), p.data(), p.mtu());
                let _ = Icmpv6Repr::parse(&p, A, B);
            }
            for o in NdOptions::new(&b).take(64) {
                let _ = o;
            }
        }
    }
}
