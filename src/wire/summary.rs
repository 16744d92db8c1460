//! Frame parsing on top of etherparse.
//!
//! [`EthMeta::parse`] is the fast-path parse the bridge needs: both MAC addresses, up to two
//! VLAN tags, the EtherType and where L3 starts. It is done once per frame, and later stages read
//! its offsets instead of parsing again. It never panics: any byte string gives either a meta or
//! [`DropReason::Truncated`].
//!
//! [`Summary::parse`] walks every layer (etherparse's lax slicer, which tolerates truncated and
//! lying lengths) to describe a frame for traces, dumps and the demo; it is not on the fast path.

use std::fmt;
use std::net::IpAddr;

use etherparse::{
    EtherType, Ethernet2HeaderSlice, LaxNetSlice, LaxSlicedPacket, SingleVlanHeaderSlice,
    TransportSlice,
};

use crate::stats::DropReason;
use crate::wire::ethernet::{ethertype, EthernetFrame};
use crate::wire::mac::MacAddr;

/// Length of an Ethernet II header.
pub const ETH_HDR_LEN: usize = crate::wire::ethernet::HEADER_LEN;
/// [`ETH_HDR_LEN`] as the 16-bit offset a summary stores.
const ETH_HDR_LEN16: u16 = crate::narrow::len16(ETH_HDR_LEN);

/// The link-layer facts about a frame, parsed once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EthMeta {
    /// Destination MAC.
    pub dst: MacAddr,
    /// Source MAC.
    pub src: MacAddr,
    /// VLAN id of the outer 802.1Q/802.1ad tag, if tagged.
    pub vlan: Option<u16>,
    /// The EtherType after any VLAN tags.
    pub ether_type: EtherType,
    /// Offset of the L3 header (14, 18 or 22).
    pub l3: u16,
}

fn is_vlan(t: EtherType) -> bool {
    ethertype::is_vlan(t.0)
}

impl EthMeta {
    /// Parses the Ethernet header and up to two VLAN tags.
    #[inline]
    pub fn parse(frame: &[u8]) -> Result<EthMeta, DropReason> {
        // Fast path: an untagged frame needs only its first 14 bytes.
        if let Ok(e) = EthernetFrame::new_checked(frame) {
            let ether_type = EtherType(e.ethertype());
            if ether_type == EtherType::IPV4 || !is_vlan(ether_type) {
                return Ok(EthMeta {
                    dst: e.dst_addr(),
                    src: e.src_addr(),
                    vlan: None,
                    ether_type,
                    l3: ETH_HDR_LEN16,
                });
            }
        }
        let eth = Ethernet2HeaderSlice::from_slice(frame).map_err(|_| DropReason::Truncated)?;
        let mut meta = EthMeta {
            dst: MacAddr(eth.destination()),
            src: MacAddr(eth.source()),
            vlan: None,
            ether_type: eth.ether_type(),
            l3: ETH_HDR_LEN16,
        };
        for _ in 0..2 {
            if !is_vlan(meta.ether_type) {
                break;
            }
            let rest = frame.get(usize::from(meta.l3)..).unwrap_or(&[]);
            let tag = SingleVlanHeaderSlice::from_slice(rest).map_err(|_| DropReason::Truncated)?;
            meta.vlan.get_or_insert(tag.vlan_identifier().value());
            meta.ether_type = tag.ether_type();
            meta.l3 += 4;
        }
        Ok(meta)
    }
}

/// What a frame carries, layer by layer, as far as it parses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Summary {
    /// Link-layer facts; `None` if shorter than an Ethernet header.
    pub eth: Option<EthMeta>,
    /// Source and destination IP addresses, for IPv4 and IPv6.
    pub ip: Option<(IpAddr, IpAddr)>,
    /// The L4 protocol and, for TCP and UDP, the ports.
    pub l4: Option<L4>,
    /// For ARP: operation (1 request, 2 reply), sender and target IPv4 addresses.
    pub arp: Option<(u16, IpAddr, IpAddr)>,
    /// Where parsing stopped with an error (a truncated or malformed header), if it did.
    pub error: Option<String>,
}

/// The transport part of a [`Summary`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum L4 {
    /// TCP with ports and flags (FIN 1, SYN 2, RST 4, PSH 8, ACK 16).
    Tcp {
        /// Source port.
        src: u16,
        /// Destination port.
        dst: u16,
        /// Flag bits.
        flags: u8,
    },
    /// UDP with ports.
    Udp {
        /// Source port.
        src: u16,
        /// Destination port.
        dst: u16,
    },
    /// ICMPv4 with type and code.
    Icmp4 {
        /// ICMP type.
        ty: u8,
        /// ICMP code.
        code: u8,
    },
    /// ICMPv6 with type and code.
    Icmp6 {
        /// ICMP type.
        ty: u8,
        /// ICMP code.
        code: u8,
    },
    /// Any other IP protocol number.
    Other(u8),
}

impl Summary {
    /// Describes `frame`; never panics, whatever the bytes.
    pub fn parse(frame: &[u8]) -> Summary {
        let mut s = Summary {
            eth: EthMeta::parse(frame).ok(),
            ip: None,
            l4: None,
            arp: None,
            error: None,
        };
        let p = match LaxSlicedPacket::from_ethernet(frame) {
            Ok(p) => p,
            Err(e) => {
                s.error = Some(e.to_string());
                return s;
            }
        };
        if let Some((e, layer)) = &p.stop_err {
            s.error = Some(format!("{layer:?}: {e}"));
        }
        match &p.net {
            Some(LaxNetSlice::Ipv4(v4)) => {
                let h = v4.header();
                s.ip = Some((h.source_addr().into(), h.destination_addr().into()));
                s.l4 = Some(L4::Other(v4.payload().ip_number.0));
            }
            Some(LaxNetSlice::Ipv6(v6)) => {
                let h = v6.header();
                s.ip = Some((h.source_addr().into(), h.destination_addr().into()));
                s.l4 = Some(L4::Other(v6.payload().ip_number.0));
            }
            Some(LaxNetSlice::Arp(a)) => {
                let spa = a.sender_protocol_addr();
                let tpa = a.target_protocol_addr();
                if let (Ok(sa), Ok(ta)) = (<[u8; 4]>::try_from(spa), <[u8; 4]>::try_from(tpa)) {
                    s.arp = Some((a.operation().0, IpAddr::from(sa), IpAddr::from(ta)));
                }
            }
            None => {}
        }
        match &p.transport {
            Some(TransportSlice::Tcp(t)) => {
                let mut flags = 0u8;
                for (on, bit) in [
                    (t.fin(), 1),
                    (t.syn(), 2),
                    (t.rst(), 4),
                    (t.psh(), 8),
                    (t.ack(), 16),
                ] {
                    if on {
                        flags |= bit;
                    }
                }
                s.l4 = Some(L4::Tcp {
                    src: t.source_port(),
                    dst: t.destination_port(),
                    flags,
                });
            }
            Some(TransportSlice::Udp(u)) => {
                s.l4 = Some(L4::Udp {
                    src: u.source_port(),
                    dst: u.destination_port(),
                })
            }
            Some(TransportSlice::Icmpv4(i)) => {
                s.l4 = Some(L4::Icmp4 {
                    ty: i.type_u8(),
                    code: i.code_u8(),
                })
            }
            Some(TransportSlice::Icmpv6(i)) => {
                s.l4 = Some(L4::Icmp6 {
                    ty: i.type_u8(),
                    code: i.code_u8(),
                })
            }
            _ => {}
        }
        s
    }
}

impl fmt::Display for Summary {
    /// One line in the style of `tcpdump -e`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Some(e) = &self.eth else {
            return write!(f, "runt frame");
        };
        write!(f, "{} > {}", e.src, e.dst)?;
        if let Some(v) = e.vlan {
            write!(f, " vlan {v}")?;
        }
        if let Some((op, sa, ta)) = self.arp {
            match op {
                1 => write!(f, " ARP who-has {ta} tell {sa}")?,
                2 => write!(f, " ARP reply {sa} is-at {}", e.src)?,
                _ => write!(f, " ARP op {op}")?,
            }
        } else if let Some((sa, da)) = self.ip {
            match self.l4 {
                Some(L4::Tcp { src, dst, flags }) => {
                    let mut fl = String::new();
                    for (bit, c) in [(2, 'S'), (1, 'F'), (4, 'R'), (8, 'P'), (16, '.')] {
                        if flags & bit != 0 {
                            fl.push(c);
                        }
                    }
                    write!(f, " {sa}.{src} > {da}.{dst} TCP [{fl}]")?
                }
                Some(L4::Udp { src, dst }) => write!(f, " {sa}.{src} > {da}.{dst} UDP")?,
                Some(L4::Icmp4 { ty, code }) => {
                    write!(f, " {sa} > {da} ICMP type {ty} code {code}")?
                }
                Some(L4::Icmp6 { ty, code }) => {
                    write!(f, " {sa} > {da} ICMPv6 type {ty} code {code}")?
                }
                Some(L4::Other(p)) => write!(f, " {sa} > {da} proto {p}")?,
                None => write!(f, " {sa} > {da}")?,
            }
        } else {
            write!(f, " ethertype {:#06x}", e.ether_type.0)?;
        }
        if let Some(err) = &self.error {
            write!(f, " [{err}]")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use etherparse::PacketBuilder;

    #[test]
    fn parses_untagged_and_tagged_frames() {
        let mut f = Vec::new();
        PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
            .single_vlan(etherparse::VlanId::try_new(42).unwrap())
            .ipv4([10, 0, 0, 1], [10, 0, 0, 2], 64)
            .tcp(1234, 80, 1, 1000)
            .syn()
            .write(&mut f, b"hi")
            .unwrap();
        let m = EthMeta::parse(&f).unwrap();
        assert_eq!(m.vlan, Some(42));
        assert_eq!(m.ether_type, EtherType::IPV4);
        assert_eq!(m.l3, 18);
        let s = Summary::parse(&f);
        assert_eq!(
            s.to_string(),
            "02:00:00:00:00:01 > 02:00:00:00:00:02 vlan 42 10.0.0.1.1234 > 10.0.0.2.80 TCP [S]"
        );
        // Every truncation parses or errors, never panics.
        for n in 0..f.len() {
            let _ = EthMeta::parse(&f[..n]);
            let _ = Summary::parse(&f[..n]).to_string();
        }
        assert_eq!(EthMeta::parse(&f[..13]), Err(DropReason::Truncated));
        assert_eq!(EthMeta::parse(&f[..16]), Err(DropReason::Truncated));
    }
}
