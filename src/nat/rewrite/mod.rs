//! Packet rewrites for NAT: addresses, ports and ICMP identifiers changed in place, every
//! checksum patched incrementally (RFC 1624), as Linux's `nf_nat_proto.c`: one L4 rewrite
//! (`tcp_manip_pkt`, `udp_manip_pkt`, `icmp_manip_pkt`) and one ICMP error translation
//! (`nf_nat_icmp_reply_translation`) for both families, generic over [`RewriteFamily`], with
//! per-family address steps (`nf_nat_ipv4_manip_pkt`, `nf_nat_ipv6_manip_pkt`).
//!
//! # Contract
//!
//! * `l3` starts at the IP header. An IPv4 header is re-checked cheaply (version, IHL equal to
//!   `hdr_len`, total length within `l3`), an IPv6 one against the `Ipv6Info` its check gave;
//!   bytes past the total length (Ethernet padding) are never read nor written. The IPv4
//!   header checksum is *not* verified: a wrong one stays exactly as wrong (that is what an
//!   incremental update does).
//! * Every check is made before the first byte is written: on `Err` the packet is untouched.
//! * Nothing panics on any input and nothing allocates.
//! * Only the words that change are folded into a checksum, so a rewrite to the tuple the
//!   packet already carries is a no-op, and rewriting to a new tuple and back restores the
//!   original bytes exactly. (A full-mode update never yields 0xffff — `!fold(x)` with `x`
//!   nonzero — except for UDP, where a 0 result is stored as 0xffff; and an update from 0xffff
//!   lands on the same ones-complement value, so the round trip holds for every packet whose
//!   checksums a standard implementation computed, the UDP 0xffff case included. A stored
//!   0xffff in a TCP, ICMP or IPv4 header checksum — never computed, since those sums are
//!   never zero — may come back as 0x0000, which is the same checksum.)
//!
//! # Checksum modes
//!
//! [`CsumMode::Full`]: the L4 checksum field holds a complete checksum; it is updated for the
//! pseudo-header addresses and for the ports (TCP/UDP) or identifier (ICMP echo). A UDP checksum
//! of 0 ("none", RFC 768) stays 0, and an update that yields 0 stores 0xffff (Linux's
//! `CSUM_MANGLED_0`).
//!
//! [`CsumMode::Partial`]: the frame came from an offload TAP with `VIRTIO_NET_HDR_F_NEEDS_CSUM`:
//! the TCP/UDP checksum field holds only the folded, *uncomplemented* pseudo-header sum and the
//! device (or [`crate::offload::complete_checksum`]) sums the L4 bytes over it later. As Linux's
//! `inet_proto_csum_replace4(.., pseudohdr = true)` under `CHECKSUM_PARTIAL`, only the
//! address changes go into the field (`field = fold(field + ~old + new)`); port and identifier
//! changes do not touch it, since the device will sum the new bytes. ICMP has no pseudo-header,
//! so in this mode no ICMP checksum is touched (for an ICMP error, the outer ICMP checksum is the
//! one left to the device; checksums *inside* the quoted packet are data and always updated in
//! full).
//!
//! # What differs in IPv6
//!
//! * IPv6 has no header checksum: an address change goes only into the checksums whose
//!   pseudo-header holds the addresses — TCP, UDP **and ICMPv6** (ICMPv4 has none), in both
//!   modes; so an ICMPv6 echo's or informational message's checksum, and the outer checksum
//!   of an ICMPv6 error, get the address change too.
//! * The upper-layer header is after the extension headers `ipv6::check` walked; they are left
//!   as they are (a routing header's addresses are not translated, as in Linux).
//! * A UDP checksum of 0 is not allowed in IPv6 (RFC 8200 8.1); such a datagram is rewritten
//!   with its checksum left 0, as Linux's `udp_manip_pkt` does.
//!
//! # Example
//!
//! DNAT of a UDP packet from a cluster IP to an endpoint:
//!
//! ```
//! use std::net::Ipv4Addr;
//! use tapyard::nat::{rewrite, CsumMode, Tuple};
//!
//! // 10.244.1.5:5000 -> 10.96.0.10:53, 1 byte of payload, header checksum 0 for now.
//! let mut p = vec![
//!     0x45, 0, 0, 29, 0, 0, 0x40, 0, 64, 17, 0, 0, 10, 244, 1, 5, 10, 96, 0, 10, // IPv4
//!     0x13, 0x88, 0, 53, 0, 9, 0, 0, b'x', // UDP, checksum 0 ("none")
//! ];
//! tapyard::wire::ipv4::Ipv4Packet::new_unchecked(&mut p[..]).fill_checksum();
//! let (t, kind) = Tuple::from_ipv4(&p, 20, p.len()).unwrap();
//! let new = Tuple { dst: Ipv4Addr::new(10, 244, 2, 7), dport: 5353, ..t };
//! rewrite(&mut p, 20, kind, &new, CsumMode::Full).unwrap();
//! assert_eq!(Tuple::from_ipv4(&p, 20, p.len()).unwrap().0, new);
//! let ip = tapyard::wire::ipv4::Ipv4Packet::new_checked(&p[..]).unwrap();
//! assert!(ip.verify_checksum()); // header checksum still valid
//! let udp = tapyard::wire::udp::UdpPacket::new_checked(ip.payload()).unwrap();
//! assert_eq!(udp.checksum(), 0); // no UDP checksum stays none
//! ```

use std::fmt;
use std::net::Ipv4Addr;

use crate::stats::DropReason;
use crate::wire::checksum::{self, diff32, fold32, Delta};
use crate::wire::family::Family;
use crate::wire::icmp::{self, IcmpPacket, Icmpv4Packet};
use crate::wire::ipv4::{Ipv4Packet, PROTO_ICMP, PROTO_TCP, PROTO_UDP};
use crate::wire::tcp::{self, TcpPacket};
use crate::wire::tuple::{L4Kind, L4Ports, Tuple};
use crate::wire::udp::{self, UdpPacket};
use family::steps::Steps;

/// How the L4 checksum field of the packet is to be read: see the [module docs](self).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum CsumMode {
    /// The field holds a complete checksum.
    #[default]
    Full,
    /// The field holds the pseudo-header sum only (virtio `NEEDS_CSUM`); the device finishes it.
    Partial,
}

/// Why a packet could not be rewritten. The packet is left untouched.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RewriteError {
    /// The IP header is not what the caller said: IPv4, version not 4, IHL not `hdr_len` or
    /// below 20, total length shorter than the header or longer than the buffer; IPv6, not a
    /// 40-byte version 6 header, payload longer than the buffer, or the `Ipv6Info`'s
    /// upper-layer offset outside the packet.
    BadIpHeader,
    /// The L4 header is shorter than the fields to rewrite (TCP needs 20 bytes, UDP and ICMP 8;
    /// in a quoted packet, the ports or identifier).
    Truncated,
    /// The new tuple's protocol is not the packet's (NAT never changes the protocol).
    ProtoMismatch {
        /// The packet's (or quoted packet's) protocol.
        packet: u8,
        /// The protocol of the tuple asked for.
        new: u8,
    },
    /// `kind` does not describe this packet: TCP/UDP kind for another protocol, `IcmpEcho` for
    /// another ICMP type, `Other` for TCP/UDP, or `IcmpError` given to [`rewrite`] (use
    /// [`rewrite_icmp_error`]).
    KindMismatch,
    /// A fragment other than the first (or quoting one): it has no L4 header. Use
    /// [`rewrite_addrs`] for it.
    LaterFragment,
    /// Not an ICMP error, or the quoted packet is malformed (not IPv4, bad IHL, quoted at an
    /// offset other than right after the 8-byte ICMP header, or an ICMP error quoting an ICMP
    /// error).
    BadIcmpError,
}

impl RewriteError {
    /// The drop reason to count when a packet is dropped for this error.
    pub fn drop_reason(self) -> DropReason {
        match self {
            RewriteError::Truncated => DropReason::Truncated,
            _ => DropReason::BadIpHeader,
        }
    }
}

impl fmt::Display for RewriteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RewriteError::BadIpHeader => f.write_str("malformed IPv4 header"),
            RewriteError::Truncated => f.write_str("L4 header truncated"),
            RewriteError::ProtoMismatch { packet, new } => write!(
                f,
                "packet protocol {packet} differs from the new tuple's protocol {new}"
            ),
            RewriteError::KindMismatch => f.write_str("L4 kind does not match the packet"),
            RewriteError::LaterFragment => f.write_str("later fragment has no L4 header"),
            RewriteError::BadIcmpError => f.write_str("not a well-formed ICMP error"),
        }
    }
}

impl std::error::Error for RewriteError {}

/// Rewrites only the IPv4 source and destination addresses of the packet at `l3` and patches
/// the header checksum.
///
/// For packets without an L4 header to translate: fragments other than the first (the first
/// carries the L4 header and goes through [`rewrite`]), and protocols whose checksum has no
/// pseudo-header. On a whole TCP/UDP packet it would leave the L4 checksum wrong: use
/// [`rewrite`] there.
///
/// # Errors
/// [`RewriteError::BadIpHeader`] if the header is malformed; the packet is untouched.
pub fn rewrite_addrs(l3: &mut [u8], src: Ipv4Addr, dst: Ipv4Addr) -> Result<(), RewriteError> {
    let hdr_len = usize::from(l3.first().copied().unwrap_or(0) & 0x0f) * 4;
    Ipv4Addr::outer(l3, hdr_len)?;
    Ipv4Addr::set_addrs(l3, src, dst, &mut Delta::default());
    Ok(())
}

/// Where the L4 checksum and the translated fields of a packet are.
#[derive(Clone, Copy)]
enum L4Plan {
    /// TCP or UDP: ports at `l4`, then the header whose checksum is updated; `udp` for the
    /// zero rule and the checksum's place.
    Ports { l4: usize, udp: bool },
    /// ICMP echo: identifier and checksum.
    Echo { l4: usize },
    /// Another ICMPv6 message (not an error): its checksum's pseudo-header change.
    IcmpOther { l4: usize },
    /// Addresses only.
    None,
}

/// Whether packets of protocol `proto` of family `A` carry an L4 header the rewrite
/// translates (so that a later fragment, without it, is refused).
#[inline]
fn has_l4<A: Family>(proto: u8) -> bool {
    proto == PROTO_TCP || proto == PROTO_UDP || proto == A::ICMP.number()
}

/// The plan for the upper-layer header of protocol `proto` and kind `kind` at `l4` of `pkt`
/// (the datagram, up to its end).
#[inline]
fn plan<A: RewriteFamily>(
    pkt: &[u8],
    proto: u8,
    kind: L4Kind,
    l4: usize,
) -> Result<L4Plan, RewriteError> {
    let avail = pkt.len().saturating_sub(l4);
    let icmp = A::ICMP.number();
    Ok(match kind {
        L4Kind::Tcp if proto == PROTO_TCP => {
            if avail < tcp::HEADER_LEN {
                return Err(RewriteError::Truncated);
            }
            L4Plan::Ports { l4, udp: false }
        }
        L4Kind::Udp if proto == PROTO_UDP => {
            if avail < udp::HEADER_LEN {
                return Err(RewriteError::Truncated);
            }
            L4Plan::Ports { l4, udp: true }
        }
        L4Kind::IcmpEcho { .. } if proto == icmp => {
            let h = icmp_at::<A>(pkt, l4).ok_or(RewriteError::Truncated)?;
            if !A::is_echo(h.msg_type()) {
                return Err(RewriteError::KindMismatch);
            }
            L4Plan::Echo { l4 }
        }
        // Any other ICMPv6 message still has a pseudo-header checksum to keep right.
        L4Kind::Other if A::ICMP_PSEUDO && proto == icmp => {
            let h = icmp_at::<A>(pkt, l4).ok_or(RewriteError::Truncated)?;
            if A::is_error(h.msg_type()) {
                return Err(RewriteError::KindMismatch);
            }
            L4Plan::IcmpOther { l4 }
        }
        L4Kind::Other if !matches!(proto, PROTO_TCP | PROTO_UDP) => L4Plan::None,
        _ => return Err(RewriteError::KindMismatch),
    })
}

/// The ICMP header of family `A` at `at`, if its 8 bytes are there.
#[inline]
fn icmp_at<A: Family>(pkt: &[u8], at: usize) -> Option<IcmpPacket<&[u8], A>> {
    IcmpPacket::new_checked(pkt.get(at..)?).ok()
}

/// Rewrites the ports of the TCP or UDP header `seg` (`udp`) to `new`'s and, `with_csum`,
/// its checksum for them and for the pseudo-header change `addrs` (either family: the
/// checksum is the same ones-complement sum, as Linux's `tcp_manip_pkt` and
/// `udp_manip_pkt` serve both); every changed word goes into `outer`.
#[inline]
fn rewrite_ports<A: Family>(
    seg: &mut [u8],
    udp: bool,
    addrs: Delta,
    new: &Tuple<A>,
    mode: CsumMode,
    with_csum: bool,
    outer: &mut Delta,
) {
    let mut ports = Delta::default();
    let mut p = L4Ports::new_unchecked(&mut *seg);
    ports.word(p.src_port(), new.sport);
    ports.word(p.dst_port(), new.dport);
    p.set_src_port(new.sport);
    p.set_dst_port(new.dport);
    outer.add(ports);
    if !with_csum {
        return;
    }
    // The caller checked the whole header is there (TCP 20 bytes, UDP 8).
    let old = if udp {
        UdpPacket::new_unchecked(&*seg).checksum()
    } else {
        TcpPacket::new_unchecked(&*seg).checksum()
    };
    if udp && old == 0 && mode == CsumMode::Full {
        return; // No checksum (RFC 768): stays none.
    }
    let mut c = match mode {
        CsumMode::Full => {
            let mut d = addrs;
            d.add(ports);
            d.apply_full(old)
        }
        CsumMode::Partial => addrs.apply_partial(old),
    };
    if udp && c == 0 {
        c = 0xffff;
    }
    outer.word(old, c);
    if udp {
        UdpPacket::new_unchecked(seg).set_checksum(c);
    } else {
        TcpPacket::new_unchecked(seg).set_checksum(c);
    }
}

/// Applies an [`L4Plan`] after the addresses changed by `addrs` (the pseudo-header's change).
/// Every changed word of the L4 header is recorded in `outer` (for an enclosing ICMP
/// checksum). `with_csum`: the L4 checksum is within the bytes (always, except in a short
/// quote).
#[inline]
fn apply_l4<A: RewriteFamily>(
    pkt: &mut [u8],
    plan: L4Plan,
    addrs: Delta,
    new: &Tuple<A>,
    mode: CsumMode,
    with_csum: bool,
    outer: &mut Delta,
) {
    // What an ICMP checksum sees of the address change: all of it in ICMPv6
    // (pseudo-header), nothing in ICMPv4.
    let icmp_addrs = if A::ICMP_PSEUDO {
        addrs
    } else {
        Delta::default()
    };
    match plan {
        L4Plan::Ports { l4, udp } => {
            if let Some(seg) = pkt.get_mut(l4..) {
                rewrite_ports(seg, udp, addrs, new, mode, with_csum, outer);
            }
        }
        L4Plan::Echo { l4 } => {
            let Some(seg) = pkt.get_mut(l4..) else {
                return;
            };
            let mut h = IcmpPacket::<_, A>::new_unchecked(seg);
            let mut id = Delta::default();
            id.word(h.echo_ident(), new.sport);
            h.set_echo_ident(new.sport);
            outer.add(id);
            let old = h.checksum();
            let c = match mode {
                CsumMode::Full => {
                    let mut d = icmp_addrs;
                    d.add(id);
                    d.apply_full(old)
                }
                // ICMPv4: no pseudo-header, so nothing for the field.
                CsumMode::Partial => icmp_addrs.apply_partial(old),
            };
            outer.word(old, c);
            h.set_checksum(c);
        }
        L4Plan::IcmpOther { l4 } => {
            let Some(seg) = pkt.get_mut(l4..) else {
                return;
            };
            let mut h = IcmpPacket::<_, A>::new_unchecked(seg);
            let old = h.checksum();
            let c = match mode {
                CsumMode::Full => icmp_addrs.apply_full(old),
                CsumMode::Partial => icmp_addrs.apply_partial(old),
            };
            outer.word(old, c);
            h.set_checksum(c);
        }
        L4Plan::None => {}
    }
}

/// Translates the packet at `l3` in place so that it carries `new` (same protocol): the
/// addresses, TCP/UDP ports or the ICMP echo identifier (`new.sport`), and every checksum
/// updated incrementally according to `mode` (see the [module docs](self)), for either family
/// ([`RewriteFamily`]).
///
/// `hdr` is the IPv4 header length, or the [`Ipv6Info`](crate::wire::ipv6::Ipv6Info)
/// [`crate::wire::ipv6::check`] gave; `kind` the [`L4Kind`] [`Tuple::from_ipv4`] (or
/// [`Tuple::from_ipv6`]) gave for this packet. A first fragment is rewritten like a whole
/// packet (its L4 checksum covers the whole datagram, and the incremental update is still
/// right for it). `new.zone` is ignored. [`L4Kind::Other`] rewrites addresses only (for ICMP
/// types other than echo and for protocols without a pseudo-header checksum; an ICMPv6
/// message gets its checksum's pseudo-header change too).
///
/// # Errors
/// See [`RewriteError`]: [`RewriteError::LaterFragment`] for a non-first fragment of
/// TCP/UDP/ICMP (IPv4: use [`rewrite_addrs`]), [`RewriteError::KindMismatch`] for an ICMP
/// error (use [`rewrite_icmp_error`]). On error the packet is untouched.
#[inline]
pub fn rewrite<A: RewriteFamily>(
    l3: &mut [u8],
    hdr: A::Hdr<'_>,
    kind: L4Kind,
    new: &Tuple<A>,
    mode: CsumMode,
) -> Result<(), RewriteError> {
    let h = A::outer(l3, hdr)?;
    if h.proto != new.proto {
        return Err(RewriteError::ProtoMismatch {
            packet: h.proto,
            new: new.proto,
        });
    }
    if h.later && has_l4::<A>(h.proto) {
        return Err(RewriteError::LaterFragment);
    }
    // Work on the datagram only (no padding).
    let pkt = l3.get_mut(..h.end).ok_or(RewriteError::BadIpHeader)?;
    let plan = plan::<A>(pkt, h.proto, kind, h.l4)?;
    let mut unused = Delta::default();
    let addrs = A::set_addrs(pkt, new.src, new.dst, &mut unused);
    apply_l4(pkt, plan, addrs, new, mode, true, &mut unused);
    Ok(())
}

/// Which L4 fields a [`Prepared`] translation touches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fast {
    Tcp,
    Udp,
    Echo,
    Addrs,
}

/// A translation from one tuple to another, prepared once ([`prepare`]) so that every packet
/// carrying the first tuple is translated by [`apply_prepared`] with a few stores and constant
/// checksum adjustments: the ones-complement sums of the changed address words, and of the
/// changed address and port (or identifier) words, folded ahead. The result is bit-for-bit
/// what [`rewrite`] writes (same zero rules, same modes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Prepared {
    src: Ipv4Addr,
    dst: Ipv4Addr,
    sport: u16,
    dport: u16,
    /// Folded sum of the address changes (0: none), for the IPv4 header and pseudo-header.
    addrs: u16,
    /// Folded sum of the address and port (identifier) changes (0: none).
    all: u16,
    /// Folded sum of the port (identifier) changes alone (0: none).
    l4: u16,
    /// Whether an address changes (its words may sum to 0 all the same: 0xffff -> 0).
    addr_change: bool,
    fast: Fast,
}

/// Prepares the translation of packets that carry `from` (of kind `kind`, as
/// [`Tuple::from_ipv4`] gave it) to `to`. `None` when [`rewrite`] would refuse it whatever the
/// packet (protocol change, ICMP error, kind that does not fit the protocol).
pub(crate) fn prepare(from: &Tuple, kind: L4Kind, to: &Tuple) -> Option<Prepared> {
    if from.proto != to.proto {
        return None;
    }
    let fast = match kind {
        L4Kind::Tcp if from.proto == PROTO_TCP => Fast::Tcp,
        L4Kind::Udp if from.proto == PROTO_UDP => Fast::Udp,
        L4Kind::IcmpEcho { .. } if from.proto == PROTO_ICMP => Fast::Echo,
        L4Kind::Other if !matches!(from.proto, PROTO_TCP | PROTO_UDP) => Fast::Addrs,
        _ => return None,
    };
    let addrs = diff32(from.src.into(), to.src.into()) + diff32(from.dst.into(), to.dst.into());
    let ports = |t: &Tuple| u32::from(t.sport) << 16 | u32::from(t.dport);
    let l4 = match fast {
        Fast::Tcp | Fast::Udp => diff32(ports(from), ports(to)),
        // The identifier only (`sport`; the low half compares equal to itself).
        Fast::Echo => diff32(u32::from(from.sport) << 16, u32::from(to.sport) << 16),
        Fast::Addrs => 0,
    };
    Some(Prepared {
        src: to.src,
        dst: to.dst,
        sport: to.sport,
        dport: to.dport,
        addrs: fold32(addrs),
        all: fold32(addrs + l4),
        l4: fold32(l4),
        addr_change: from.src != to.src || from.dst != to.dst,
        fast,
    })
}

impl Prepared {
    /// The source address after the translation.
    #[inline]
    pub(crate) fn new_src(&self) -> Ipv4Addr {
        self.src
    }
    /// The destination address after the translation.
    #[inline]
    pub(crate) fn new_dst(&self) -> Ipv4Addr {
        self.dst
    }
}

/// Translates a packet whose tuple (from [`Tuple::from_ipv4`] on this very packet) is the
/// `from` of [`prepare`]: the caller guarantees it, and that `l3` is exactly the datagram
/// (`l3.len()` its total length) with a checked IPv4 header of `hdr_len` bytes. The L4
/// header length is checked here. Same result as [`rewrite`] to the prepared `to`.
///
/// # Errors
/// [`RewriteError::Truncated`] if the L4 header is too short; the packet is untouched.
#[inline]
pub(crate) fn apply_prepared(
    l3: &mut [u8],
    hdr_len: usize,
    p: &Prepared,
    mode: CsumMode,
) -> Result<(), RewriteError> {
    if hdr_len > l3.len() {
        return Err(RewriteError::Truncated);
    }
    let (ip, l4) = l3.split_at_mut(hdr_len);
    let ip: &mut [u8; 20] = ip.first_chunk_mut().ok_or(RewriteError::Truncated)?;
    // Views over fixed-size arrays: every index below is checked at compile time. The L4
    // header is checked before the first write.
    match p.fast {
        Fast::Tcp => {
            let h: &mut [u8; tcp::HEADER_LEN] =
                l4.first_chunk_mut().ok_or(RewriteError::Truncated)?;
            set_ip(ip, p);
            let mut t = TcpPacket::new_unchecked(h);
            t.set_src_port(p.sport);
            t.set_dst_port(p.dport);
            let old = t.checksum();
            t.set_checksum(match mode {
                CsumMode::Full => checksum::update(old, p.all),
                CsumMode::Partial => checksum::update_partial(old, p.addrs),
            });
        }
        Fast::Udp => {
            let h: &mut [u8; udp::HEADER_LEN] =
                l4.first_chunk_mut().ok_or(RewriteError::Truncated)?;
            set_ip(ip, p);
            let mut u = UdpPacket::new_unchecked(h);
            u.set_src_port(p.sport);
            u.set_dst_port(p.dport);
            let old = u.checksum();
            let mut c = match mode {
                // No checksum (RFC 768): stays none.
                CsumMode::Full if old == 0 => return Ok(()),
                CsumMode::Full => checksum::update(old, p.all),
                CsumMode::Partial => checksum::update_partial(old, p.addrs),
            };
            if c == 0 {
                c = 0xffff;
            }
            u.set_checksum(c);
        }
        Fast::Echo => {
            let h: &mut [u8; icmp::HEADER_LEN] =
                l4.first_chunk_mut().ok_or(RewriteError::Truncated)?;
            set_ip(ip, p);
            let mut e = Icmpv4Packet::new_unchecked(h);
            e.set_echo_ident(p.sport);
            if mode == CsumMode::Full {
                // No pseudo-header: the identifier change alone.
                let old = e.checksum();
                e.set_checksum(checksum::update(old, p.l4));
            }
        }
        Fast::Addrs => set_ip(ip, p),
    }
    Ok(())
}

/// The addresses and header checksum of a prepared translation.
#[inline(always)]
fn set_ip(ip: &mut [u8; 20], p: &Prepared) {
    if p.addr_change {
        let mut v = Ipv4Packet::new_unchecked(ip);
        v.set_src_addr(p.src);
        v.set_dst_addr(p.dst);
        let hc = v.checksum();
        v.set_checksum(checksum::update(hc, p.addrs));
    }
}

/// Translates an ICMP (ICMPv6) error about a NAT'd connection, as Linux's
/// `nf_nat_icmp_reply_translation` (`nf_nat_icmpv6_reply_translation`): the *quoted* packet is
/// rewritten to carry `new_inner` (inner addresses and, IPv4, inner header checksum; inner
/// TCP/UDP ports; the inner L4 checksum only when it lies inside the quoted bytes — TCP needs
/// 20 quoted L4 bytes, as Linux's `tcp_manip_pkt`, UDP 8 and a nonzero checksum; the inner
/// echo identifier and checksum), then the outer source and destination become `outer_src` /
/// `outer_dst` (IPv4: outer header checksum), and the outer ICMP checksum is updated for every
/// changed word of the message and, ICMPv6, the outer pseudo-header (in [`CsumMode::Partial`]
/// the message is left for the device to sum: only the pseudo-header change goes in).
///
/// `hdr` is as for [`rewrite()`]; `inner_l3` is the offset of the quoted header given by
/// [`L4Kind::IcmpError`]: the ICMP header's offset + 8. The inner checksums are updated
/// incrementally whatever their state: a quoted checksum that covers bytes not quoted is
/// still right for the original datagram. An IPv6 quote's extension headers are walked within
/// the quoted bytes.
///
/// # Errors
/// [`RewriteError::BadIcmpError`] if the packet is not an ICMP error (ICMPv4 types 3, 4, 5,
/// 11, 12; ICMPv6 types below 128, as Linux's `icmpv6_error`) or the quote is malformed (or
/// quotes an error), [`RewriteError::Truncated`] if the quoted L4 header lacks the ports
/// (TCP/UDP: 4 bytes) or the echo header (8 bytes), [`RewriteError::ProtoMismatch`] if
/// `new_inner.proto` is not the quoted protocol, [`RewriteError::LaterFragment`] if either the
/// error or the quoted packet is a non-first fragment. The packet is untouched on error.
pub fn rewrite_icmp_error<A: RewriteFamily>(
    l3: &mut [u8],
    hdr: A::Hdr<'_>,
    inner_l3: usize,
    new_inner: &Tuple<A>,
    outer_src: A,
    outer_dst: A,
    mode: CsumMode,
) -> Result<(), RewriteError> {
    let h = A::outer(l3, hdr)?;
    let icmp = A::ICMP.number();
    if h.proto != icmp {
        return Err(RewriteError::BadIcmpError);
    }
    if h.later {
        return Err(RewriteError::LaterFragment);
    }
    let icmp_off = h.l4;
    if h.end < icmp_off + icmp::HEADER_LEN {
        return Err(RewriteError::Truncated);
    }
    // Work on the datagram only (no padding).
    let pkt = l3.get_mut(..h.end).ok_or(RewriteError::BadIpHeader)?;
    let ty = icmp_at::<A>(pkt, icmp_off)
        .ok_or(RewriteError::Truncated)?
        .msg_type();
    if !A::is_error(ty) || inner_l3 != icmp_off + icmp::HEADER_LEN {
        return Err(RewriteError::BadIcmpError);
    }
    let q = A::quoted(pkt.get(inner_l3..).unwrap_or(&[]))?;
    if q.proto != new_inner.proto {
        return Err(RewriteError::ProtoMismatch {
            packet: q.proto,
            new: new_inner.proto,
        });
    }
    if q.later && has_l4::<A>(q.proto) {
        return Err(RewriteError::LaterFragment);
    }
    let il4 = inner_l3 + q.l4;
    let avail = h.end.saturating_sub(il4);
    let (plan, with_csum) = match q.proto {
        PROTO_TCP | PROTO_UDP => {
            if avail < 4 {
                return Err(RewriteError::Truncated);
            }
            let udp = q.proto == PROTO_UDP;
            let need = if udp {
                udp::HEADER_LEN
            } else {
                tcp::HEADER_LEN
            };
            (L4Plan::Ports { l4: il4, udp }, avail >= need)
        }
        p if p == icmp => match icmp_at::<A>(pkt, il4)
            .ok_or(RewriteError::Truncated)?
            .msg_type()
        {
            ty if A::is_echo(ty) => (L4Plan::Echo { l4: il4 }, true),
            ty if A::is_error(ty) => return Err(RewriteError::BadIcmpError),
            _ => (L4Plan::None, false),
        },
        _ => (L4Plan::None, false),
    };
    // All checks done: mutate. `msg` collects every changed word of the ICMP message.
    let mut msg = Delta::default();
    let addrs = A::set_addrs(&mut pkt[inner_l3..], new_inner.src, new_inner.dst, &mut msg);
    // Checksums inside the quote are data: always complete ones.
    apply_l4(
        pkt,
        plan,
        addrs,
        new_inner,
        CsumMode::Full,
        with_csum,
        &mut msg,
    );
    let outer = A::set_addrs(pkt, outer_src, outer_dst, &mut Delta::default());
    // The outer pseudo-header's change, for an ICMPv6 checksum.
    let pseudo = if A::ICMP_PSEUDO {
        outer
    } else {
        Delta::default()
    };
    let mut e = IcmpPacket::<_, A>::new_unchecked(&mut pkt[icmp_off..]);
    let old = e.checksum();
    e.set_checksum(match mode {
        CsumMode::Full => {
            msg.add(pseudo);
            msg.apply_full(old)
        }
        CsumMode::Partial => pseudo.apply_partial(old),
    });
    Ok(())
}

mod family;

pub use family::RewriteFamily;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_family;
