//! IPv6 packet rewrites for NAT, as Linux's `nf_nat_ipv6_manip_pkt` with the same L4
//! manipulations as IPv4 ([`super::rewrite`]) and `nf_nat_icmpv6_reply_translation`.
//!
//! What differs from IPv4 (the contract of the [module docs](super) holds otherwise: every
//! check before the first write, the packet untouched on error, no panic, no allocation, a
//! rewrite and its inverse restore the bytes):
//!
//! * IPv6 has no header checksum: an address change goes only into the checksums whose
//!   pseudo-header holds the addresses — TCP, UDP **and ICMPv6** (ICMPv4 has none).
//! * The upper-layer header is at `info.l4_off`, after the extension headers that
//!   [`crate::wire::ipv6::check`] walked; the extension headers are left as they are (a
//!   routing header's addresses are not translated, as in Linux).
//! * In [`CsumMode::Partial`] (virtio `NEEDS_CSUM`) the TCP, UDP and ICMPv6 fields hold the
//!   pseudo-header sum: only the address changes go into them.
//! * A UDP checksum of 0 is not allowed in IPv6 (RFC 8200 8.1); such a datagram is rewritten
//!   with its checksum left 0, as Linux's `udp_manip_pkt` does.
//! * The outer checksum of an ICMPv6 error covers its pseudo-header: it gets the outer
//!   address changes as well as every changed word of the message.

use std::net::Ipv6Addr;

use super::{rewrite_ports, CsumMode, RewriteError};
use crate::wire::checksum::Delta;
use crate::wire::icmpv6::{self, Icmpv6Packet};
use crate::wire::ipv4::{PROTO_TCP, PROTO_UDP};
use crate::wire::ipv6::{self, ExtHeaders, Ipv6Info, Ipv6Packet};
use crate::wire::tcp;
use crate::wire::tuple::{L4Kind, Tuple, PROTO_ICMPV6};
use crate::wire::udp;

/// Where the translated fields of an IPv6 packet are.
#[derive(Clone, Copy)]
enum Plan {
    /// TCP or UDP header at `l4`.
    Ports { l4: usize, udp: bool },
    /// ICMPv6 echo at `l4`.
    Echo { l4: usize },
    /// Addresses only.
    None,
}

/// Rewrites the addresses of the IPv6 header at `ip` (40 bytes checked by the caller) and
/// returns their change, which is also recorded in `outer`.
fn set_addrs6(ip: &mut [u8], src: Ipv6Addr, dst: Ipv6Addr, outer: &mut Delta) -> Delta {
    let mut p = Ipv6Packet::new_unchecked(ip);
    let (os, od) = (p.src_addr(), p.dst_addr());
    let (ns, nd) = (src.octets(), dst.octets());
    let mut d = Delta::default();
    for (o, n) in [(os, ns), (od, nd)] {
        for (a, b) in o.chunks_exact(2).zip(n.chunks_exact(2)) {
            d.word(
                u16::from_be_bytes([a[0], a[1]]),
                u16::from_be_bytes([b[0], b[1]]),
            );
        }
    }
    if os != ns {
        p.set_src_addr(src);
    }
    if od != nd {
        p.set_dst_addr(dst);
    }
    outer.add(d);
    d
}

/// Applies a [`Plan`] after the addresses changed by `addrs` (the pseudo-header's change);
/// every changed word of the L4 header goes into `outer`. `with_csum`: the L4 checksum is
/// within the bytes (always, except in a short quote).
fn apply6(
    pkt: &mut [u8],
    plan: Plan,
    addrs: Delta,
    new: &Tuple<Ipv6Addr>,
    mode: CsumMode,
    with_csum: bool,
    outer: &mut Delta,
) {
    match plan {
        Plan::Ports { l4, udp } => {
            if let Some(seg) = pkt.get_mut(l4..) {
                rewrite_ports(seg, udp, addrs, new, mode, with_csum, outer);
            }
        }
        Plan::Echo { l4 } => {
            let Some(seg) = pkt.get_mut(l4..) else {
                return;
            };
            let mut h = Icmpv6Packet::new_unchecked(seg);
            let mut id = Delta::default();
            let rest = h.rest();
            let new_rest = u32::from(new.sport) << 16 | (rest & 0xffff);
            id.word32(rest, new_rest);
            h.set_rest(new_rest);
            outer.add(id);
            let old = h.checksum();
            let c = match mode {
                CsumMode::Full => {
                    let mut d = addrs;
                    d.add(id);
                    d.apply_full(old)
                }
                CsumMode::Partial => addrs.apply_partial(old),
            };
            outer.word(old, c);
            h.set_checksum(c);
        }
        Plan::None => {}
    }
}

/// The IPv6 header at `l3` as `info` describes it: its end (the payload's end), or
/// [`RewriteError::BadIpHeader`].
fn end6(l3: &[u8], info: &Ipv6Info) -> Result<usize, RewriteError> {
    let p = Ipv6Packet::new_checked(l3).map_err(|_| RewriteError::BadIpHeader)?;
    let end = p.total_len();
    if info.l4_off < ipv6::HEADER_LEN || info.l4_off > end {
        return Err(RewriteError::BadIpHeader);
    }
    Ok(end)
}

/// The plan for the upper-layer header of protocol `proto` at `l4` (`avail` bytes of it).
fn plan6(
    pkt: &[u8],
    proto: u8,
    kind: L4Kind,
    l4: usize,
    avail: usize,
) -> Result<Plan, RewriteError> {
    Ok(match kind {
        L4Kind::Tcp if proto == PROTO_TCP => {
            if avail < tcp::HEADER_LEN {
                return Err(RewriteError::Truncated);
            }
            Plan::Ports { l4, udp: false }
        }
        L4Kind::Udp if proto == PROTO_UDP => {
            if avail < udp::HEADER_LEN {
                return Err(RewriteError::Truncated);
            }
            Plan::Ports { l4, udp: true }
        }
        L4Kind::IcmpEcho { .. } if proto == PROTO_ICMPV6 => {
            let h = pkt
                .get(l4..)
                .and_then(|b| Icmpv6Packet::new_checked(b).ok())
                .filter(|_| avail >= icmpv6::HEADER_LEN)
                .ok_or(RewriteError::Truncated)?;
            if !matches!(
                h.msg_type(),
                icmpv6::codes::ECHO_REQUEST | icmpv6::codes::ECHO_REPLY
            ) {
                return Err(RewriteError::KindMismatch);
            }
            Plan::Echo { l4 }
        }
        L4Kind::Other if !matches!(proto, PROTO_TCP | PROTO_UDP) => Plan::None,
        _ => return Err(RewriteError::KindMismatch),
    })
}

/// Translates the IPv6 packet at `l3` (checked into `info` by [`crate::wire::ipv6::check`])
/// in place so that it carries `new` (same protocol): addresses, TCP/UDP ports or the ICMPv6
/// echo identifier (`new.sport`), every checksum updated incrementally (see the [module
/// docs](super); for IPv6: no header checksum, and the address change goes into the TCP, UDP
/// and ICMPv6 checksums, whose pseudo-headers hold the addresses). `kind` is what [`Tuple::from_ipv6`] gave for this packet; `new.zone` is
/// ignored. [`L4Kind::Other`] rewrites the addresses only (ICMPv6 types other than echo
/// and errors get their checksum's pseudo-header change too).
///
/// # Errors
/// As [`super::rewrite`]; an ICMPv6 error goes through [`rewrite_icmp_error6`]. On error the
/// packet is untouched.
pub fn rewrite6(
    l3: &mut [u8],
    info: &Ipv6Info,
    kind: L4Kind,
    new: &Tuple<Ipv6Addr>,
    mode: CsumMode,
) -> Result<(), RewriteError> {
    let end = end6(l3, info)?;
    let proto = info.next_header;
    if proto != new.proto {
        return Err(RewriteError::ProtoMismatch {
            packet: proto,
            new: new.proto,
        });
    }
    if matches!(proto, PROTO_TCP | PROTO_UDP | PROTO_ICMPV6) && info.is_later_fragment() {
        return Err(RewriteError::LaterFragment);
    }
    let l4 = info.l4_off;
    let pkt = l3.get_mut(..end).ok_or(RewriteError::BadIpHeader)?;
    let mut plan = plan6(pkt, proto, kind, l4, end - l4)?;
    // Any other ICMPv6 message still has a pseudo-header checksum to keep right.
    let other_icmp = matches!(plan, Plan::None) && proto == PROTO_ICMPV6;
    if other_icmp {
        let h = pkt
            .get(l4..)
            .and_then(|b| Icmpv6Packet::new_checked(b).ok())
            .ok_or(RewriteError::Truncated)?;
        if icmpv6::is_error(h.msg_type()) {
            return Err(RewriteError::KindMismatch);
        }
        plan = Plan::None;
    }
    let mut unused = Delta::default();
    let addrs = set_addrs6(pkt, new.src, new.dst, &mut unused);
    apply6(pkt, plan, addrs, new, mode, true, &mut unused);
    if other_icmp {
        if let Some(seg) = pkt.get_mut(l4..) {
            let mut h = Icmpv6Packet::new_unchecked(seg);
            let old = h.checksum();
            h.set_checksum(match mode {
                CsumMode::Full => addrs.apply_full(old),
                CsumMode::Partial => addrs.apply_partial(old),
            });
        }
    }
    Ok(())
}

/// Translates an ICMPv6 error about a NAT'd connection (types below 128, as Linux's
/// `icmpv6_error`), as `nf_nat_icmpv6_reply_translation`: the quoted packet is rewritten to
/// carry `new_inner` (its addresses, its TCP/UDP ports and checksum — when the quote holds
/// it —, or its echo identifier and checksum), then the outer addresses become `outer_src` /
/// `outer_dst`, and the outer ICMPv6 checksum is updated for the outer pseudo-header and
/// every changed word of the message ([`CsumMode::Partial`]: the pseudo-header change only,
/// the device sums the message).
///
/// `inner_l3` is [`L4Kind::IcmpError`]'s offset of the quoted header (`info.l4_off + 8`); the
/// quote's extension headers are walked within the quoted bytes.
///
/// # Errors
/// [`RewriteError::BadIcmpError`] when the packet is not an ICMPv6 error or the quote is not
/// an IPv6 packet (or quotes an error), [`RewriteError::Truncated`] when the quote lacks the
/// ports or echo header, [`RewriteError::ProtoMismatch`], [`RewriteError::LaterFragment`].
/// The packet is untouched on error.
pub fn rewrite_icmp_error6(
    l3: &mut [u8],
    info: &Ipv6Info,
    inner_l3: usize,
    new_inner: &Tuple<Ipv6Addr>,
    outer_src: Ipv6Addr,
    outer_dst: Ipv6Addr,
    mode: CsumMode,
) -> Result<(), RewriteError> {
    let end = end6(l3, info)?;
    if info.next_header != PROTO_ICMPV6 {
        return Err(RewriteError::BadIcmpError);
    }
    if info.is_later_fragment() {
        return Err(RewriteError::LaterFragment);
    }
    let icmp_at = info.l4_off;
    if end < icmp_at + icmpv6::HEADER_LEN {
        return Err(RewriteError::Truncated);
    }
    let pkt = l3.get_mut(..end).ok_or(RewriteError::BadIpHeader)?;
    let ty = Icmpv6Packet::new_unchecked(&pkt[icmp_at..]).msg_type();
    if !icmpv6::is_error(ty) || inner_l3 != icmp_at + icmpv6::HEADER_LEN {
        return Err(RewriteError::BadIcmpError);
    }
    let quote = pkt.get(inner_l3..).unwrap_or(&[]);
    if quote.len() < ipv6::HEADER_LEN || Ipv6Packet::new_unchecked(quote).version() != 6 {
        return Err(RewriteError::BadIcmpError);
    }
    let mut w = ExtHeaders::new(quote);
    let mut later = false;
    for h in &mut w {
        let h = h.map_err(|_| RewriteError::BadIcmpError)?;
        if h.kind == ipv6::NH_FRAGMENT {
            // Fragment offset (bytes 2..4 of the 8 the walker checked).
            let b = quote
                .get(h.offset + 2..h.offset + 4)
                .ok_or(RewriteError::BadIcmpError)?;
            later = u16::from_be_bytes([b[0], b[1]]) >> 3 != 0;
        }
    }
    let (iproto, ioff) = w.position();
    if iproto != new_inner.proto {
        return Err(RewriteError::ProtoMismatch {
            packet: iproto,
            new: new_inner.proto,
        });
    }
    if later && matches!(iproto, PROTO_TCP | PROTO_UDP | PROTO_ICMPV6) {
        return Err(RewriteError::LaterFragment);
    }
    let il4 = inner_l3 + ioff;
    let avail = end.saturating_sub(il4);
    let (plan, with_csum) = match iproto {
        PROTO_TCP | PROTO_UDP => {
            if avail < 4 {
                return Err(RewriteError::Truncated);
            }
            let udp = iproto == PROTO_UDP;
            let need = if udp {
                udp::HEADER_LEN
            } else {
                tcp::HEADER_LEN
            };
            (Plan::Ports { l4: il4, udp }, avail >= need)
        }
        PROTO_ICMPV6 => {
            let q = pkt
                .get(il4..)
                .and_then(|b| Icmpv6Packet::new_checked(b).ok())
                .ok_or(RewriteError::Truncated)?;
            match q.msg_type() {
                icmpv6::codes::ECHO_REQUEST | icmpv6::codes::ECHO_REPLY => {
                    (Plan::Echo { l4: il4 }, true)
                }
                t if icmpv6::is_error(t) => return Err(RewriteError::BadIcmpError),
                _ => (Plan::None, false),
            }
        }
        _ => (Plan::None, false),
    };
    // All checks done: mutate. `msg` collects every changed word of the ICMPv6 message.
    let mut msg = Delta::default();
    let addrs = set_addrs6(&mut pkt[inner_l3..], new_inner.src, new_inner.dst, &mut msg);
    apply6(
        pkt,
        plan,
        addrs,
        new_inner,
        CsumMode::Full,
        with_csum,
        &mut msg,
    );
    let outer = set_addrs6(pkt, outer_src, outer_dst, &mut Delta::default());
    let mut h = Icmpv6Packet::new_unchecked(&mut pkt[icmp_at..]);
    let old = h.checksum();
    h.set_checksum(match mode {
        CsumMode::Full => {
            msg.add(outer);
            msg.apply_full(old)
        }
        CsumMode::Partial => outer.apply_partial(old),
    });
    Ok(())
}
