//! The packet-view layer: headers read and written in place, and parsed into values.
//!
//! One file per header. Everything that knows a field's offset or folds a checksum lives here;
//! the layers above (the bridge, the router, conntrack and NAT) call these views.
//!
//! # Shape of a header module
//!
//! Each header has, as smoltcp's `wire`:
//!
//! * a **view** `XPacket<T: AsRef<[u8]>>` over a buffer: `new_unchecked(buf)`, `new_checked(buf)`
//!   that checks the lengths the header declares *once* and returns an [`Error`], then
//!   infallible getters; setters where `T: AsMut<[u8]>`. Field offsets are named once in a
//!   private `field` module per file.
//! * a **`Repr`**, a plain value with `parse(&view)`, `buffer_len()` and `emit(&mut view)`, for
//!   what is parsed into values or built from them (ARP, ICMP errors and echo replies, TCP
//!   resets). `parse(emit(x)) == x` is a property test next to each.
//!
//! # Contract
//!
//! **After `new_checked` succeeds, no accessor panics**, whatever the bytes: every length a
//! getter relies on was checked, and the fixed part of each header is read through a
//! fixed-size array (`&[u8; N]`), so the compiler also drops the bounds checks. A view made
//! with `new_unchecked` panics on a buffer too short for the field read; use it on buffers
//! the caller has just checked or sized (as the builders do). Getters never trust a length
//! field beyond the buffer. Nothing here allocates.
//!
//! Big-endian access and the Internet checksum (`checksum`, crate-private: full sums,
//! RFC 1624 incremental updates, pseudo-headers, partial checksums) are private to this
//! layer; nothing outside `wire` reads a header at an offset.
//!
//! ```
//! use tapyard::wire::ipv4::{Ipv4Packet, Ipv4Repr, PROTO_UDP};
//!
//! let repr = Ipv4Repr {
//!     src_addr: [10, 0, 0, 1].into(),
//!     dst_addr: [10, 0, 1, 2].into(),
//!     protocol: PROTO_UDP,
//!     payload_len: 8,
//!     ttl: 64,
//!     tos: 0,
//!     dont_frag: true,
//! };
//! let mut buf = [0u8; 28];
//! repr.emit(&mut Ipv4Packet::new_unchecked(&mut buf[..]));
//! let p = Ipv4Packet::new_checked(&buf[..]).unwrap();
//! assert!(p.verify_checksum());
//! assert_eq!(Ipv4Repr::parse(&p), Ok(repr));
//! assert!(Ipv4Packet::new_checked(&buf[..27]).is_err());
//! ```
//!
//! # Where the next protocols go
//!
//! * [`ipv6`]: the fixed header ([`ipv6::Ipv6Packet`], [`ipv6::Ipv6Repr`]), the bounded
//!   extension-header walker ([`ipv6::ExtHeaders`]) and the `ipv6_rcv` checks
//!   ([`ipv6::check`] → [`ipv6::Ipv6Info`]); its pseudo-header is a variant of
//!   `checksum::PseudoHeader`, so TCP/UDP/ICMPv6 checksums share the summing code.
//! * [`icmpv6`]: ICMPv6 and NDP ([`icmpv6::Icmpv6Repr`]: echo, errors, RS/RA, NS/NA and
//!   their options); the router's NDP takes it as its ARP takes [`arp`].
//! * [`vxlan`]: the 8-byte `VxlanPacket` (flags, VNI) after [`udp`], and the outer
//!   [`ethernet`] + [`ipv4`] + [`udp`] + VXLAN headers encapsulation writes into a buffer's
//!   headroom; an IPv6 underlay adds an outer IPv6 variant beside it.
//! * [`tuple`](mod@tuple) grows an address family when conntrack does.

pub mod arp;
pub(crate) mod checksum;
pub mod ethernet;
pub mod family;
pub mod icmp;
pub mod icmpv6;
pub mod ip;
pub mod ipv4;
pub mod ipv6;
pub mod mac;
mod summary;
pub mod tcp;
pub mod tuple;
pub mod udp;
pub mod virtio;
pub mod vxlan;

use std::fmt;

pub use summary::{EthMeta, Summary, ETH_HDR_LEN, L4};

/// Why a buffer is not a header of the kind asked for. Kept small: on the fast path a drop
/// reason is all a caller needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Error {
    /// The buffer ends before the header (or a length it declares) does.
    Truncated,
    /// A field has a value the header cannot have (version, header length below its minimum,
    /// a length field shorter than the header, a checksum that fails in a `Repr::parse`).
    Malformed,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Error::Truncated => "buffer shorter than the header",
            Error::Malformed => "malformed header",
        })
    }
}

impl std::error::Error for Error {}

#[cfg(test)]
mod tests {
    //! The contract of the module docs, on arbitrary bytes: after `new_checked` succeeds no
    //! accessor panics.
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn checked_views_never_panic(b in proptest::collection::vec(any::<u8>(), 0..96)) {
            if let Ok(e) = ethernet::EthernetFrame::new_checked(&b[..]) {
                let _ = (e.dst_addr(), e.src_addr(), e.ethertype(), e.payload(), e.l3(), e.addr_words());
            }
            for p in [ipv4::Ipv4Packet::new_checked(&b[..]), ipv4::Ipv4Packet::new_checked_header(&b[..])]
                .into_iter()
                .flatten()
            {
                let _ = (p.header_len(), p.total_len(), p.ident(), p.frag_offset(), p.ttl());
                let _ = (p.protocol(), p.checksum(), p.src_addr(), p.dst_addr());
                let _ = (p.verify_checksum(), p.payload(), p.after_header(), p.header());
                let _ = ipv4::Ipv4Repr::parse(&p);
            }
            if let Ok(p) = icmp::Icmpv4Packet::new_checked(&b[..]) {
                let _ = (p.msg_type(), p.code(), p.echo_ident(), p.rest(), p.data());
                let _ = icmp::Icmpv4Repr::parse(&p);
            }
            let a = std::net::Ipv4Addr::LOCALHOST;
            if let Ok(p) = tcp::TcpPacket::new_checked(&b[..]) {
                let _ = (p.src_port(), p.seq_number(), p.ack_number(), p.flags(), p.payload());
                let _ = (tcp::TcpRepr::parse(&p, a, a), tcp::TcpRepr::reset_for(&p));
            }
            if let Ok(p) = udp::UdpPacket::new_checked(&b[..]) {
                let _ = (p.src_port(), p.len(), p.payload(), udp::UdpRepr::parse(&p, a, a));
            }
            if let Ok(p) = arp::ArpPacket::new_checked(&b[..]) {
                let _ = arp::ArpRepr::parse(&p);
            }
            if let Ok(p) = vxlan::VxlanPacket::new_checked(&b[..]) {
                let _ = (p.flags(), p.vni(), p.is_plain(), p.payload(), vxlan::VxlanRepr::parse(&p));
            }
            if let Ok(p) = ipv6::Ipv6Packet::new_checked(&b[..]) {
                let _ = (p.payload(), p.traffic_class(), p.flow_label(), ipv6::Ipv6Repr::parse(&p));
            }
            if let Ok(i) = ipv6::check(&b) {
                prop_assert!(i.l4_off <= i.total_len() && i.total_len() <= b.len());
                let _ = ipv6::may_send_icmp_error(&b, &i, false);
            }
            let a6 = std::net::Ipv6Addr::LOCALHOST;
            if let Ok(p) = icmpv6::Icmpv6Packet::new_checked(&b[..]) {
                let _ = (p.msg_type(), p.code(), p.rest(), p.data(), icmpv6::Icmpv6Repr::parse(&p, a6, a6));
            }
            let _ = vxlan::flow_words(&b);
            let _ = (vxlan::is_outer(&b, false), vxlan::is_outer(&b, true));
            let _ = virtio::VirtioNetHdr::parse(&b);
            let _ = tuple::Tuple::from_ipv4(&b, 20, b.len());
        }
    }
}
