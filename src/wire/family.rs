//! The address family as a type, and IP protocol numbers as a type.
//!
//! [`Family`] names what IPv4 and IPv6 differ in at the packet level, once, and is implemented
//! on the address types themselves ([`Ipv4Addr`], [`Ipv6Addr`]), so a table, a tuple or a
//! forwarding step generic over `A: Family` is written once and monomorphised per family (as
//! Linux's `nf_nat_proto.c` has one L4 rewrite with per-family address and checksum steps).
//! The layers above extend it with their own per-family pieces (the router's
//! [`RouteAddr`](crate::l3::route::RouteAddr), conntrack's key); per-family code stays only
//! where the protocols really differ (ARP vs NDP, extension headers, IPv4 options).
//!
//! ```
//! use std::net::{Ipv4Addr, Ipv6Addr};
//! use tapyard::wire::family::{Family, IpProto};
//!
//! fn icmp_of<A: Family>() -> IpProto {
//!     A::ICMP
//! }
//! assert_eq!(icmp_of::<Ipv4Addr>(), IpProto::ICMP);
//! assert_eq!(icmp_of::<Ipv6Addr>(), IpProto::ICMPV6);
//! assert_eq!(IpProto::TCP.to_string(), "tcp");
//! assert_eq!(IpProto::from(200).to_string(), "200");
//! ```

use std::fmt;
use std::hash::Hash;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::checksum::PseudoHeader;
use super::ethernet::{EthernetFrame, EthernetRepr, HEADER_LEN as ETH_LEN};
use super::mac::MacAddr;

/// An IP protocol (IPv6: the upper-layer "next header") number, as a type: `IpProto::TCP`
/// rather than a bare `6`. Any number is representable, so a frame's byte converts without
/// loss; the named constants are the ones tapyard tracks.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
#[repr(transparent)]
pub struct IpProto(pub u8);

impl IpProto {
    /// ICMP (1).
    pub const ICMP: IpProto = IpProto(1);
    /// TCP (6).
    pub const TCP: IpProto = IpProto(6);
    /// UDP (17).
    pub const UDP: IpProto = IpProto(17);
    /// ICMPv6 (58).
    pub const ICMPV6: IpProto = IpProto(58);
    /// SCTP (132).
    pub const SCTP: IpProto = IpProto(132);

    /// The number as carried in the header.
    #[inline]
    pub const fn number(self) -> u8 {
        self.0
    }

    /// The lower-case name `iptables`/`conntrack` print ("tcp", "udp", "icmp", "ipv6-icmp",
    /// "sctp"), or `None` for an unnamed protocol.
    pub const fn name(self) -> Option<&'static str> {
        match self.0 {
            1 => Some("icmp"),
            6 => Some("tcp"),
            17 => Some("udp"),
            58 => Some("ipv6-icmp"),
            132 => Some("sctp"),
            _ => None,
        }
    }
}

impl From<u8> for IpProto {
    #[inline]
    fn from(n: u8) -> IpProto {
        IpProto(n)
    }
}

impl From<IpProto> for u8 {
    #[inline]
    fn from(p: IpProto) -> u8 {
        p.0
    }
}

impl fmt::Display for IpProto {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) => f.write_str(n),
            None => write!(f, "{}", self.0),
        }
    }
}

impl fmt::Debug for IpProto {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IpProto({self})")
    }
}

/// An address family, implemented on its address type: [`Ipv4Addr`] or [`Ipv6Addr`].
///
/// Sealed: tapyard's generic code relies on there being exactly these two.
pub trait Family:
    Copy
    + Eq
    + Ord
    + Hash
    + fmt::Debug
    + fmt::Display
    + Into<IpAddr>
    + Send
    + Sync
    + sealed::Sealed
    + 'static
{
    /// The IP version, 4 or 6.
    const VERSION: u8;
    /// The Ethernet type of the family's packets (0x0800, 0x86dd).
    const ETHERTYPE: u16;
    /// The family's ICMP protocol: [`IpProto::ICMP`] or [`IpProto::ICMPV6`].
    const ICMP: IpProto;
    /// The fixed header's length (20, 40).
    const HEADER_LEN: usize;
    /// The smallest MTU a link of this family may have (68, 1280).
    const MIN_MTU: usize;
    /// The unspecified address (0.0.0.0, ::).
    const UNSPECIFIED: Self;
    /// The family as messages name it: "IPv4" or "IPv6".
    const NAME: &'static str;

    /// The address if `ip` is of this family.
    fn from_ip(ip: IpAddr) -> Option<Self>;
    /// The largest datagram an ICMP error of this family may be, quote included (576 as
    /// RFC 1812 4.3.2.3 and Linux, IPv6's minimum MTU 1280 as RFC 4443 2.4 (c)).
    const ICMP_ERROR_MAX: usize;
}

/// The TCP/UDP/ICMPv6 pseudo-header of a `proto` segment of `len` bytes from `src` to `dst`.
#[inline]
#[allow(dead_code)] // taken up as the L4 rewrite and the ICMP builders become generic
pub(crate) fn pseudo_header<A: Family>(src: A, dst: A, proto: IpProto, len: u32) -> PseudoHeader {
    A::pseudo(src, dst, proto, len)
}

impl Family for Ipv4Addr {
    const VERSION: u8 = 4;
    const ETHERTYPE: u16 = 0x0800;
    const ICMP: IpProto = IpProto::ICMP;
    const HEADER_LEN: usize = 20;
    const MIN_MTU: usize = 68;
    const UNSPECIFIED: Self = Ipv4Addr::UNSPECIFIED;
    const NAME: &'static str = "IPv4";

    #[inline]
    fn from_ip(ip: IpAddr) -> Option<Self> {
        match ip {
            IpAddr::V4(a) => Some(a),
            IpAddr::V6(_) => None,
        }
    }
    const ICMP_ERROR_MAX: usize = super::ipv4::ICMP_ERROR_MAX;
}

#[allow(private_interfaces)]
impl sealed::Sealed for Ipv4Addr {
    #[inline]
    fn pseudo(src: Self, dst: Self, proto: IpProto, len: u32) -> PseudoHeader {
        PseudoHeader::Ipv4 {
            src: src.octets(),
            dst: dst.octets(),
            proto: proto.0,
            len: crate::narrow::low16(u64::from(len)),
        }
    }
    #[inline]
    fn emit_header(h: &IpHead<Self>, l3: &mut [u8]) {
        super::ipv4::Ipv4Repr {
            src_addr: h.src,
            dst_addr: h.dst,
            protocol: h.proto.0,
            payload_len: h.payload_len,
            ttl: h.ttl,
            tos: h.tos,
            dont_frag: h.dont_frag,
        }
        .emit(&mut super::ipv4::Ipv4Packet::new_unchecked(l3));
    }
    const TTL_AT: usize = super::ipv4::field::TTL;
    const PROTO_AT: usize = super::ipv4::field::PROTO;
    const SRC_AT: usize = super::ipv4::field::SRC.start;
    const DST_AT: usize = super::ipv4::field::DST.start;
    #[inline(always)]
    fn read_addr(b: &[u8]) -> Self {
        let a: [u8; 4] = b[..4].try_into().expect("4 bytes");
        Ipv4Addr::from(a)
    }
    #[inline(always)]
    fn write_addr(self, b: &mut [u8]) {
        b[..4].copy_from_slice(&self.octets());
    }
}

impl Family for Ipv6Addr {
    const VERSION: u8 = 6;
    const ETHERTYPE: u16 = 0x86dd;
    const ICMP: IpProto = IpProto::ICMPV6;
    const HEADER_LEN: usize = 40;
    const MIN_MTU: usize = 1280;
    const UNSPECIFIED: Self = Ipv6Addr::UNSPECIFIED;
    const NAME: &'static str = "IPv6";

    #[inline]
    fn from_ip(ip: IpAddr) -> Option<Self> {
        match ip {
            IpAddr::V6(a) => Some(a),
            IpAddr::V4(_) => None,
        }
    }
    const ICMP_ERROR_MAX: usize = super::ipv6::MIN_MTU;
}

#[allow(private_interfaces)]
impl sealed::Sealed for Ipv6Addr {
    #[inline]
    fn pseudo(src: Self, dst: Self, proto: IpProto, len: u32) -> PseudoHeader {
        PseudoHeader::Ipv6 {
            src: src.octets(),
            dst: dst.octets(),
            next_header: proto.0,
            len,
        }
    }
    #[inline]
    fn emit_header(h: &IpHead<Self>, l3: &mut [u8]) {
        super::ipv6::Ipv6Repr {
            src_addr: h.src,
            dst_addr: h.dst,
            next_header: h.proto.0,
            payload_len: h.payload_len,
            hop_limit: h.ttl,
        }
        .emit(&mut super::ipv6::Ipv6Packet::new_unchecked(l3));
    }
    const TTL_AT: usize = super::ipv6::field::HOP_LIMIT;
    const PROTO_AT: usize = super::ipv6::field::NEXT_HEADER;
    const SRC_AT: usize = super::ipv6::field::SRC_ADDR.start;
    const DST_AT: usize = super::ipv6::field::DST_ADDR.start;
    #[inline(always)]
    fn read_addr(b: &[u8]) -> Self {
        let a: [u8; 16] = b[..16].try_into().expect("16 bytes");
        Ipv6Addr::from(a)
    }
    #[inline(always)]
    fn write_addr(self, b: &mut [u8]) {
        b[..16].copy_from_slice(&self.octets());
    }
}

// `Sealed` cannot be named outside this module, so its crate-private return type is unreachable.
#[allow(private_interfaces)]
mod sealed {
    use super::{IpHead, IpProto, PseudoHeader};

    /// The per-family pieces that stay crate-private (checksum internals).
    pub trait Sealed: Sized {
        fn pseudo(src: Self, dst: Self, proto: IpProto, len: u32) -> PseudoHeader;
        /// Writes the fixed header `h` at the start of `l3` (IPv4: with its checksum).
        fn emit_header(h: &IpHead<Self>, l3: &mut [u8]);
        /// The offsets in the fixed header of the TTL / hop limit, the protocol / next
        /// header, and the source and destination addresses.
        const TTL_AT: usize;
        /// See `TTL_AT`.
        const PROTO_AT: usize;
        /// See `TTL_AT`.
        const SRC_AT: usize;
        /// See `TTL_AT`.
        const DST_AT: usize;
        /// The address at the start of `b` (checked by the caller to be there).
        fn read_addr(b: &[u8]) -> Self;
        /// Writes the address at the start of `b`.
        fn write_addr(self, b: &mut [u8]);
    }
}

/// The IP header of a packet tapyard makes itself (an ICMP error, a TCP reset, NDP), either
/// family: no options or extension headers; IPv4 identification 0, IPv6 traffic class and
/// flow label 0 (`tos` and `dont_frag` are IPv4's only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct IpHead<A> {
    /// Source address.
    pub(crate) src: A,
    /// Destination address.
    pub(crate) dst: A,
    /// The upper-layer protocol.
    pub(crate) proto: IpProto,
    /// Bytes after the header.
    pub(crate) payload_len: usize,
    /// TTL / hop limit.
    pub(crate) ttl: u8,
    /// IPv4 type of service.
    pub(crate) tos: u8,
    /// IPv4 DF flag.
    pub(crate) dont_frag: bool,
}

/// Writes Ethernet (`src` to `dst`, the family's EtherType) + `ip` and lets `l4` fill the
/// payload; the frame length, or `None` when `out` is too small.
pub(crate) fn emit_frame<A: Family>(
    out: &mut [u8],
    (src, dst): (MacAddr, MacAddr),
    ip: &IpHead<A>,
    l4: impl FnOnce(&mut [u8]),
) -> Option<usize> {
    let len = ETH_LEN + A::HEADER_LEN + ip.payload_len;
    let f = out.get_mut(..len)?;
    EthernetRepr {
        src_addr: src,
        dst_addr: dst,
        ethertype: A::ETHERTYPE,
    }
    .emit(&mut EthernetFrame::new_unchecked(&mut *f));
    let (l3, payload) = f.get_mut(ETH_LEN..)?.split_at_mut(A::HEADER_LEN);
    A::emit_header(ip, l3);
    l4(payload);
    Some(len)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check<A: Family>(a: A, other: IpAddr) {
        assert_eq!(A::from_ip(a.into()), Some(a));
        assert_eq!(A::from_ip(other), None);
        assert!(A::MIN_MTU >= A::HEADER_LEN + 8);
    }

    #[test]
    fn both_families_round_trip_through_ipaddr() {
        check(Ipv4Addr::new(10, 0, 0, 1), Ipv6Addr::LOCALHOST.into());
        check(Ipv6Addr::LOCALHOST, Ipv4Addr::LOCALHOST.into());
    }

    #[test]
    fn protocol_names_follow_iptables() {
        for (p, n) in [
            (IpProto::ICMP, "icmp"),
            (IpProto::ICMPV6, "ipv6-icmp"),
            (IpProto(47), "47"),
        ] {
            assert_eq!(p.to_string(), n);
        }
        assert_eq!(u8::from(IpProto::UDP), 17);
    }
}
