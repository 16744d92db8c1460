//! The IPv6 half of the router: what IPv6 does differently from IPv4 ([`RouterFamily`] for
//! [`Ipv6Addr`]): NDP (answering Neighbor Solicitations for the interfaces' global and
//! link-local addresses, defending them against DAD, soliciting next hops, learning from
//! NS/NA/RS as Linux's `ndisc_recv_*`), Router Advertisements, link-local scope, extension
//! headers (an echo reply drops them), and the ICMPv6 shapes of errors, echo replies and TCP
//! resets. Forwarding itself is [`super::forward`]'s, as Linux's `ip6_forward`.
//!
//! Where tapyard differs from Linux, on purpose: no redirects; packets to the router's own
//! addresses are answered only for ICMPv6 echo (UDP gets a port unreachable, TCP a drop);
//! an echo request with extension headers gets a reply without them, as Linux, but a
//! fragmented one is not answered (no reassembly) and a routing header with segments left is
//! not processed (Linux would forward to its next segment or answer with a parameter
//! problem); hop-by-hop options are not processed (forwarded untouched, as
//! Linux does with the unknown options whose action is "skip"); IPv6 multicast is not
//! routed (NDP groups are taken in, the rest is bridged by flooding); RS are answered with a
//! multicast RA to all nodes (radvd without `AdvRASolicitedUnicast`). As Linux, an NA
//! without the override flag for a `REACHABLE` entry with another MAC makes it `STALE` with
//! its MAC kept (`NEIGH_UPDATE_F_WEAK_OVERRIDE`).

use std::net::Ipv6Addr;
use std::time::Duration;

use crate::base::IfaceId;
use crate::buf::PacketBuf;
use crate::l3::neigh::{Advert, Released};
use crate::l3::route::RouteReader;
use crate::stats::DropReason;
use crate::time::Instant;
use crate::wire::ethernet::{copy_readdressed, EthernetFrame, HEADER_LEN as ETH_LEN};
use crate::wire::family::IpProto;
use crate::wire::icmpv6::{self, codes, Icmpv6Packet, Icmpv6Repr, NaFlags, PrefixInfo};
use crate::wire::ipv6::{self, Ipv6Info, Ipv6Packet, HEADER_LEN, NH_ICMPV6, NH_TCP};
use crate::wire::mac::MacAddr;

use super::forward::{Egress, Facts, IcmpError, RouterFamily, Rx};
use super::reply::IcmpHead;
use super::{Iface, L3Batch, Memo, Router, Sink, L3};

/// RFC 4861 10: MAX_INITIAL_RTR_ADVERTISEMENTS and their largest interval.
const INITIAL_RAS: u8 = 3;
const INITIAL_RA_INTERVAL: Duration = Duration::from_secs(16);
/// MAX_RA_DELAY_TIME: the largest delay before answering an RS.
const RA_DELAY: u64 = 500_000;
/// MIN_DELAY_BETWEEN_RAS.
const MIN_RA_GAP: u64 = 3_000_000;

/// The RA schedule of one interface.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct RaState {
    /// When the next unsolicited RA is due (µs; 0: at once).
    next: u64,
    /// Unsolicited RAs sent so far (the first few come faster).
    sent: u8,
    /// When the last RA went out.
    last: Option<u64>,
    /// A pseudo-random state for the intervals.
    rng: u64,
}

fn xorshift(s: &mut u64) -> u64 {
    let mut x = (*s).max(1);
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *s = x;
    x
}

impl RouterFamily for Ipv6Addr {
    type Info = Ipv6Info;
    const TOO_BIG: DropReason = DropReason::PacketTooBig;

    #[inline(always)]
    fn check(l3: &[u8]) -> Result<Ipv6Info, DropReason> {
        ipv6::check(l3).map_err(|_| DropReason::BadIpv6Header)
    }
    #[inline(always)]
    fn facts(i: &Ipv6Info) -> Facts<Ipv6Addr> {
        let total_len = i.total_len();
        Facts {
            src: i.src,
            dst: i.dst,
            proto: IpProto(i.next_header),
            ttl: i.hop_limit,
            total_len,
            l4_off: i.l4_off,
        }
    }
    #[inline(always)]
    fn may_fragment(_: &Ipv6Info) -> bool {
        // Routers never fragment IPv6 (RFC 8200 5).
        false
    }
    #[inline(always)]
    fn is_fragment(i: &Ipv6Info) -> bool {
        i.is_fragment()
    }
    #[inline(always)]
    fn decrement_ttl(l3: &mut [u8]) {
        ipv6::decrement_hop_limit(l3);
    }

    #[inline(always)]
    fn memo<'b>(batch: &'b mut L3Batch<'_>) -> &'b mut Memo<Ipv6Addr> {
        &mut batch.memo6
    }
    #[inline]
    fn routes<'b, 'a>(batch: &'b mut L3Batch<'a>) -> &'b RouteReader<'a, Ipv6Addr> {
        batch.ipv6_routes()
    }
    fn solicit(
        r: &Router,
        i: IfaceId,
        target: Ipv6Addr,
        unicast: Option<MacAddr>,
        sink: &mut dyn Sink,
    ) {
        r.send_ns(i, target, unicast, sink);
    }
    #[inline(always)]
    fn early(
        r: &Router,
        b: &PacketBuf,
        rx: Rx,
        info: &Ipv6Info,
        sink: &mut dyn Sink,
    ) -> Option<L3> {
        if info.dst.is_multicast() {
            if info.next_header == NH_ICMPV6 && r.is_our_group(rx.in_if, info.dst) {
                return Some(r.ndp_verdict(b.frame(), rx, info, sink));
            }
            return Some(L3::Drop(DropReason::L3Multicast));
        }
        if rx.group {
            return Some(L3::Drop(DropReason::L3Multicast));
        }
        // NDP to one of our addresses is taken in before the hook.
        if info.next_header == NH_ICMPV6 && r.ipv6_iface(info.dst).is_some() {
            let ty = b.frame().get(rx.l3 + info.l4_off).copied().unwrap_or(0);
            if icmpv6::is_ndp(ty) {
                return Some(r.ndp_verdict(b.frame(), rx, info, sink));
            }
        }
        None
    }
    #[inline]
    fn unroutable_dst(_: &Router, dst: Ipv6Addr) -> Option<DropReason> {
        ipv6::is_link_local(&dst).then_some(DropReason::Ipv6LinkLocal)
    }
    #[inline(always)]
    fn unroutable_src(i: &Ipv6Info) -> Option<DropReason> {
        ipv6::is_link_local(&i.src).then_some(DropReason::Ipv6LinkLocal)
    }
    type SourceKey = u128;
    const NO_SOURCE: u128 = u128::MAX;
    #[inline(always)]
    fn source_key(src: Ipv6Addr) -> u128 {
        u128::from_ne_bytes(src.octets())
    }
    fn martian_src(_: &Router, src: Ipv6Addr, _: Ipv6Addr) -> bool {
        martian_src(src)
    }
    fn refuse_local(_: &Iface) -> Option<DropReason> {
        None
    }
    fn fragment(
        _: &Router,
        _: &mut PacketBuf,
        _: usize,
        _: &Ipv6Info,
        _: Egress<Ipv6Addr>,
        _: &mut dyn Sink,
    ) -> L3 {
        // Not reached: `may_fragment` is false.
        L3::Drop(DropReason::PacketTooBig)
    }

    fn may_send_icmp_error(l3: &[u8], info: &Ipv6Info, l2_group_dst: bool) -> bool {
        ipv6::may_send_icmp_error(l3, info, l2_group_dst)
    }
    fn icmp_head(err: IcmpError) -> IcmpHead {
        let (ty, code, rest) = match err {
            IcmpError::TtlExceeded => (codes::TIME_EXCEEDED, codes::HOP_LIMIT_EXCEEDED, 0),
            IcmpError::NoRoute | IcmpError::Unreachable => (codes::DST_UNREACH, codes::NO_ROUTE, 0),
            IcmpError::Prohibited => (codes::DST_UNREACH, codes::REJECT_ROUTE, 0),
            IcmpError::PortUnreachable => (codes::DST_UNREACH, codes::PORT_UNREACH, 0),
            IcmpError::NeighFailed => (codes::DST_UNREACH, codes::ADDR_UNREACH, 0),
            IcmpError::TooBig { mtu } => (codes::PACKET_TOO_BIG, 0, u32::from(mtu)),
        };
        IcmpHead { ty, code, rest }
    }
    fn icmp_route(
        r: &Router,
        dst: Ipv6Addr,
        in_if: Option<IfaceId>,
    ) -> Option<(IfaceId, Ipv6Addr)> {
        // Never to a link-local destination from off its link.
        if ipv6::is_link_local(&dst) {
            return in_if.map(|i| (i, dst));
        }
        r.routes6.lookup(dst)?.hop(dst)
    }
    fn src_for(r: &Router, i: IfaceId, dst: Ipv6Addr) -> Option<Ipv6Addr> {
        r.src_for_dst(i, dst)
    }
    fn set_icmp_src(ip: &mut [u8], src: Ipv6Addr, dst: Ipv6Addr) {
        let mut p = Ipv6Packet::new_unchecked(ip);
        p.set_src_addr(src);
        Icmpv6Packet::new_unchecked(p.payload_mut()).fill_checksum(src, dst);
    }
    fn echo_reply(frame: &mut [u8], l3: usize, info: &Ipv6Info, our_mac: MacAddr) -> Option<usize> {
        echo_reply_in_place(frame, l3, info, our_mac)
    }
    fn tcp_segment<'a>(orig_l3: &'a [u8], info: &Ipv6Info) -> Option<&'a [u8]> {
        if info.next_header != NH_TCP || info.is_later_fragment() {
            return None;
        }
        orig_l3.get(info.l4_off..info.total_len())
    }
}

/// True when `src` is an IPv6 martian source by its range, as Linux's `ip6_rcv_core` and
/// `ip6_forward`: the unspecified address `::` (DAD's, never forwarded; NDP is taken before),
/// loopback `::1` (RFC 4291 2.5.3), multicast `ff00::/8` (RFC 4291 2.7), and IPv4-mapped
/// `::ffff:0:0/96` (Linux drops those on input, as security rules could be fooled by
/// `::ffff:127.0.0.1`).
fn martian_src(src: Ipv6Addr) -> bool {
    src.is_unspecified()
        || src.is_loopback()
        || src.is_multicast()
        || src.to_ipv4_mapped().is_some()
}

impl Router {
    /// [`Router::ndp_input`] as the router's verdict on the frame.
    #[cold]
    fn ndp_verdict(&self, frame: &[u8], rx: Rx, info: &Ipv6Info, sink: &mut dyn Sink) -> L3 {
        match self.ndp_input(frame, rx.l3, info, rx.in_if, rx.now, sink) {
            Ok(()) => L3::Local,
            Err(r) => L3::Drop(r),
        }
    }

    /// True when `dst` is a multicast group the router listens to on `i`: all-nodes,
    /// all-routers, or the solicited-node group of one of its addresses there.
    fn is_our_group(&self, i: IfaceId, dst: Ipv6Addr) -> bool {
        let Some(iface) = self.iface(i) else {
            return false;
        };
        dst == ipv6::ALL_NODES
            || dst == ipv6::ALL_ROUTERS
            || dst == ipv6::solicited_node(iface.ll6)
            || iface
                .cfg
                .addr6
                .is_some_and(|(a, _)| dst == ipv6::solicited_node(a))
    }

    /// The source address for what the router sends to `dst` out of `i`: its link-local
    /// address for a link-local destination or without a global one, else its global one.
    fn src_for_dst(&self, i: IfaceId, dst: Ipv6Addr) -> Option<Ipv6Addr> {
        let iface = self.iface(i)?;
        Some(match iface.cfg.addr6 {
            Some((g, _)) if !ipv6::is_link_local(&dst) => g,
            _ => iface.ll6,
        })
    }

    /// Sends a Neighbor Solicitation for `target` out of `i`: to its solicited-node group, or
    /// unicast to `unicast` (a probe).
    fn send_ns(&self, i: IfaceId, target: Ipv6Addr, unicast: Option<MacAddr>, sink: &mut dyn Sink) {
        let (Some(iface), Some(src)) = (self.iface(i), self.src_for_dst(i, target)) else {
            return;
        };
        self.counters.ndp_solicits.add(1);
        let (dst_ip, dst_mac) = match unicast {
            Some(m) => (target, m),
            None => {
                let g = ipv6::solicited_node(target);
                (g, ipv6::multicast_mac(g))
            }
        };
        let ns = Icmpv6Repr::NeighborSolicit {
            target,
            source_lladdr: Some(iface.cfg.mac),
        };
        let mac = iface.cfg.mac;
        sink.emit(i, &mut |out| {
            ipv6::write_icmp(out, mac, dst_mac, src, dst_ip, 255, &ns)
        });
    }

    fn release_ndp(&self, r: Released<Ipv6Addr>, sink: &mut dyn Sink) {
        self.counters.released.add(1);
        let Some(src) = self.iface(r.iface).map(|i| i.cfg.mac) else {
            return;
        };
        let mac = r.mac;
        sink.emit(r.iface, &mut |out| {
            copy_readdressed(out, &r.frame, src, mac)
        });
    }

    /// Processes an NDP message to the router or flooded on its bridge (RFC 4861 validation:
    /// hop limit 255, checksum, code 0, options; then NS answered for our addresses and
    /// learned from, NA learned from, RS answered with an RA where configured).
    pub(crate) fn ndp_input(
        &self,
        frame: &[u8],
        l3: usize,
        info: &Ipv6Info,
        in_if: IfaceId,
        now: Instant,
        sink: &mut dyn Sink,
    ) -> Result<(), DropReason> {
        let Some(iface) = self.iface(in_if) else {
            return Err(DropReason::NotForRouter);
        };
        let msg = frame
            .get(l3 + info.l4_off..l3 + info.total_len())
            .ok_or(DropReason::BadNdp)?;
        let p = Icmpv6Packet::new_checked(msg).map_err(|_| DropReason::BadNdp)?;
        if !icmpv6::is_ndp(p.msg_type()) {
            return Err(DropReason::BadNdp);
        }
        if info.hop_limit != 255 || info.frag.is_some() {
            return Err(DropReason::BadNdp);
        }
        if !p.verify_checksum(info.src, info.dst) {
            return Err(DropReason::BadIcmpv6Checksum);
        }
        let repr = Icmpv6Repr::parse(&p, info.src, info.dst).map_err(|_| DropReason::BadNdp)?;
        let l2_src = EthernetFrame::new_checked(frame)
            .map(|e| e.src_addr())
            .map_err(|_| DropReason::BadNdp)?;
        let our_mac = iface.cfg.mac;
        match repr {
            Icmpv6Repr::NeighborSolicit {
                target,
                source_lladdr,
            } => {
                let dad = info.src.is_unspecified();
                if dad && (source_lladdr.is_some() || info.dst != ipv6::solicited_node(target)) {
                    return Err(DropReason::BadNdp);
                }
                let for_us = iface.has_ipv6(target);
                if !dad {
                    if let Some(m) = source_lladdr {
                        let _ =
                            self.neigh6
                                .input_solicit(in_if, info.src, m, for_us, now, &mut |r| {
                                    self.release_ndp(r, sink)
                                });
                    }
                }
                if !for_us {
                    return Ok(());
                }
                self.counters.ndp_adverts.add(1);
                let (dst_ip, dst_mac, solicited) = if dad {
                    // Defend the address (RFC 4862 5.4.3, as Linux): NA to all nodes.
                    (ipv6::ALL_NODES, ipv6::multicast_mac(ipv6::ALL_NODES), false)
                } else {
                    (info.src, source_lladdr.unwrap_or(l2_src), true)
                };
                let na = Icmpv6Repr::NeighborAdvert {
                    flags: NaFlags {
                        router: true,
                        solicited,
                        override_: true,
                    },
                    target,
                    target_lladdr: Some(our_mac),
                };
                sink.emit(in_if, &mut |out| {
                    ipv6::write_icmp(out, our_mac, dst_mac, target, dst_ip, 255, &na)
                });
            }
            Icmpv6Repr::NeighborAdvert {
                flags,
                target,
                target_lladdr,
            } => {
                if flags.solicited && info.dst.is_multicast() {
                    return Err(DropReason::BadNdp);
                }
                if iface.has_ipv6(target) {
                    // Someone else claims our address: nothing to learn.
                    return Ok(());
                }
                // Without a target link-layer address (Linux's answer to a unicast probe),
                // it confirms the entry's own MAC.
                let advert = Advert {
                    ip: target,
                    mac: target_lladdr,
                    solicited: flags.solicited,
                    override_: flags.override_,
                };
                let _ = self
                    .neigh6
                    .input_advert(in_if, advert, now, &mut |r| self.release_ndp(r, sink));
            }
            Icmpv6Repr::RouterSolicit { source_lladdr } => {
                if info.src.is_unspecified() && source_lladdr.is_some() {
                    return Err(DropReason::BadNdp);
                }
                if let Some(m) = source_lladdr {
                    let _ = self
                        .neigh6
                        .input_solicit(in_if, info.src, m, true, now, &mut |r| {
                            self.release_ndp(r, sink)
                        });
                }
                if iface.cfg.ra.is_some() {
                    let mut ra = self.ra.lock();
                    if let Some(s) = ra.get_mut(usize::from(in_if.0)) {
                        let t = now.micros();
                        let delay = xorshift(&mut s.rng) % RA_DELAY;
                        let mut at = t + delay;
                        if let Some(last) = s.last {
                            at = at.max(last + MIN_RA_GAP);
                        }
                        s.next = s.next.min(at);
                    }
                }
            }
            // Other routers' advertisements and redirects: nothing to do.
            _ => {}
        }
        Ok(())
    }

    /// Looks at an IPv6 frame flooded on the bridge of `in_if`: NDP to one of our groups is
    /// processed (its errors are not counted: the frame is flooded anyway).
    pub(crate) fn observe_ndp(
        &self,
        frame: &[u8],
        l3: usize,
        in_if: IfaceId,
        now: Instant,
        sink: &mut dyn Sink,
    ) {
        let Ok(info) = ipv6::check(frame.get(l3..).unwrap_or(&[])) else {
            return;
        };
        if info.next_header == ipv6::NH_ICMPV6 && self.is_our_group(in_if, info.dst) {
            let _ = self.ndp_input(frame, l3, &info, in_if, now, sink);
        }
    }

    /// Sends the Router Advertisement of interface `i` to all nodes.
    fn send_ra(&self, i: IfaceId, sink: &mut dyn Sink) {
        let Some(iface) = self.iface(i) else { return };
        let Some(cfg) = iface.cfg.ra else { return };
        self.counters.ra_sent.add(1);
        let ra = Icmpv6Repr::RouterAdvert {
            hop_limit: cfg.hop_limit,
            flags: 0,
            router_lifetime: cfg.router_lifetime,
            reachable_time: 0,
            retrans_time: 0,
            source_lladdr: Some(iface.cfg.mac),
            mtu: (iface.cfg.mtu != 1500).then_some(u32::from(iface.cfg.mtu)),
            prefix_info: iface.cfg.addr6.map(|(a, len)| PrefixInfo {
                prefix_len: len,
                on_link: true,
                autonomous: len == 64,
                valid_lifetime: cfg.valid_lifetime,
                preferred_lifetime: cfg.preferred_lifetime,
                prefix: ipv6::mask(a, len),
            }),
        };
        let (mac, src) = (iface.cfg.mac, iface.ll6);
        let dst_mac = ipv6::multicast_mac(ipv6::ALL_NODES);
        sink.emit(i, &mut |out| {
            ipv6::write_icmp(out, mac, dst_mac, src, ipv6::ALL_NODES, 255, &ra)
        });
    }

    /// Sends the Router Advertisements due at `now` (RFC 4861 6.2.4: the first ones at most
    /// 16 s apart, then between the interface's min and max interval).
    pub(super) fn poll_ra(&self, now: Instant, sink: &mut dyn Sink) {
        let t = now.micros();
        let mut due = Vec::new();
        {
            let mut ra = self.ra.lock();
            for (n, (s, iface)) in ra.iter_mut().zip(&self.ifaces).enumerate() {
                let Some(cfg) = iface.cfg.ra else { continue };
                if s.rng == 0 {
                    s.rng = iface.cfg.mac.to_u64() ^ 0x9e37_79b9_7f4a_7c15;
                }
                if s.next > t {
                    continue;
                }
                let lo = u64::try_from(cfg.min_interval.as_micros()).unwrap_or(u64::MAX);
                let hi = u64::try_from(cfg.max_interval.as_micros())
                    .unwrap_or(u64::MAX)
                    .max(lo + 1);
                let mut gap = lo + xorshift(&mut s.rng) % (hi - lo);
                if s.sent < INITIAL_RAS {
                    gap =
                        gap.min(u64::try_from(INITIAL_RA_INTERVAL.as_micros()).unwrap_or(u64::MAX));
                }
                s.sent = s.sent.saturating_add(1);
                s.last = Some(t);
                s.next = t + gap;
                if let Ok(i) = u16::try_from(n) {
                    due.push(IfaceId(i));
                }
            }
        }
        for i in due {
            self.send_ra(i, sink);
        }
    }

    /// The unsolicited Neighbor Advertisements announcing interface `i`'s IPv6 addresses
    /// (RFC 4861 7.2.6), its global address then its link-local one, each written into
    /// `out` and handed to `emit`; none for an interface without a global IPv6 address (an
    /// IPv4-only interface announces nothing in IPv6). See [`Router::announce`].
    pub(crate) fn announce_ndp(&self, i: IfaceId, out: &mut [u8], emit: &mut dyn FnMut(&[u8])) {
        let Some(iface) = self.iface(i) else { return };
        let Some((global, _)) = iface.cfg.addr6 else {
            return;
        };
        let mac = iface.cfg.mac;
        let dst_mac = ipv6::multicast_mac(ipv6::ALL_NODES);
        for target in [global, iface.ll6] {
            let na = Icmpv6Repr::NeighborAdvert {
                // The router flag (tapyard forwards on every interface, as Linux with
                // `forwarding` 1), override set, not solicited: Linux's `ndisc_send_unsol_na`.
                flags: NaFlags {
                    router: true,
                    solicited: false,
                    override_: true,
                },
                target,
                target_lladdr: Some(mac),
            };
            // From the address itself, to all nodes, hop limit 255 (else receivers drop it).
            if let Some(n) = ipv6::write_icmp(out, mac, dst_mac, target, ipv6::ALL_NODES, 255, &na)
            {
                emit(&out[..n]);
            }
        }
    }
}

/// Turns an ICMPv6 echo request frame addressed to us into the echo reply, in place: MACs
/// swapped (`our_mac` as the source), the reply's source `from` (the address the request was
/// sent to), destination the requester, hop limit 64, type 129, checksum recomputed. A request
/// with extension headers (hop-by-hop, destination options, a routing header) is answered as
/// Linux's `icmpv6_echo_reply` does: the reply carries none, its ICMPv6 message moved up to
/// right after the fixed header. A fragment is not answered (tapyard does not reassemble).
/// Returns the reply's frame length (at most the request's), or `None` (frame untouched) if
/// it is not a well-formed, unfragmented echo request.
pub(crate) fn echo_reply_in_place(
    frame: &mut [u8],
    l3: usize,
    info: &Ipv6Info,
    our_mac: MacAddr,
) -> Option<usize> {
    if info.next_header != NH_ICMPV6
        || info.frag.is_some()
        || info.l4_off < HEADER_LEN
        || l3 < ETH_LEN
    {
        return None;
    }
    let (start, end) = (l3 + info.l4_off, l3 + info.total_len());
    let msg = frame.get(start..end)?;
    let req = Icmpv6Packet::new_checked(msg).ok()?;
    if req.msg_type() != icmpv6::codes::ECHO_REQUEST
        || req.code() != 0
        || !req.verify_checksum(info.src, info.dst)
    {
        return None;
    }
    let mut eth = EthernetFrame::new_unchecked(&mut *frame);
    let peer = eth.src_addr();
    eth.set_dst_addr(peer);
    eth.set_src_addr(our_mac);
    // Extension headers dropped: the message follows the fixed header.
    let msg_len = end - start;
    frame.copy_within(start..end, l3 + HEADER_LEN);
    let end = l3 + HEADER_LEN + msg_len;
    let mut ip = Ipv6Packet::new_unchecked(&mut frame[l3..end]);
    ip.set_src_addr(info.dst);
    ip.set_dst_addr(info.src);
    ip.set_ttl(64);
    ip.set_protocol(NH_ICMPV6);
    ip.set_payload_len(u16::try_from(msg_len).ok()?);
    let mut icmp = Icmpv6Packet::new_unchecked(ip.payload_mut());
    icmp.set_msg_type(icmpv6::codes::ECHO_REPLY);
    icmp.fill_checksum(info.dst, info.src);
    Some(end)
}

#[cfg(test)]
mod tests {
    use super::super::reply::{write_icmp_error, write_tcp_rst};
    use super::*;
    use crate::wire::ipv6::MIN_MTU;
    use crate::wire::ipv6::{check, may_send_icmp_error};

    #[test]
    fn errors_quote_up_to_1280_bytes_and_parse_in_etherparse() {
        let mut f = Vec::new();
        etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
            .ipv6(
                [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
                [0xfd, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2],
                1,
            )
            .udp(1000, 2000)
            .write(&mut f, &[0xab; 1452])
            .unwrap();
        let info = check(&f[14..]).unwrap();
        assert!(may_send_icmp_error(&f[14..], &info, false));
        assert!(!may_send_icmp_error(&f[14..], &info, true));
        let mut out = [0u8; 1400];
        let gw: Ipv6Addr = "fd00::fe".parse().unwrap();
        let n = write_icmp_error(
            &mut out,
            (MacAddr::local(9), MacAddr::local(1)),
            (gw, info.src),
            Ipv6Addr::icmp_head(IcmpError::TooBig { mtu: 1400 }),
            &f[14..],
        )
        .unwrap();
        assert_eq!(n, 14 + MIN_MTU);
        let p = etherparse::SlicedPacket::from_ethernet(&out[..n]).unwrap();
        let Some(etherparse::TransportSlice::Icmpv6(i)) = p.transport else {
            panic!("not ICMPv6")
        };
        assert_eq!(
            i.icmp_type(),
            etherparse::Icmpv6Type::PacketTooBig { mtu: 1400 }
        );
        let e = check(&out[14..n]).unwrap();
        let m = Icmpv6Packet::new_checked(&out[14 + 40..n]).unwrap();
        assert!(m.verify_checksum(e.src, e.dst));
        assert_eq!(&m.data()[..40], &f[14..54]);
        // Never about an ICMPv6 error.
        assert!(!may_send_icmp_error(&out[14..n], &e, false));
    }

    #[test]
    fn echo_reply_and_tcp_reset() {
        let (a, b) = (
            [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1],
            [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xfe],
        );
        let mut f = Vec::new();
        etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 9])
            .ipv6(a, b, 64)
            .icmpv6_echo_request(3, 4)
            .write(&mut f, b"ping")
            .unwrap();
        let info = check(&f[14..]).unwrap();
        assert_eq!(
            echo_reply_in_place(&mut f, 14, &info, MacAddr::local(9)),
            Some(f.len())
        );
        let p = etherparse::SlicedPacket::from_ethernet(&f).unwrap();
        let Some(etherparse::TransportSlice::Icmpv6(i)) = p.transport else {
            panic!()
        };
        assert!(
            matches!(i.icmp_type(), etherparse::Icmpv6Type::EchoReply(h) if h.id == 3 && h.seq == 4)
        );
        let e = check(&f[14..]).unwrap();
        assert_eq!((e.src.octets(), e.dst.octets()), (b, a));
        assert!(Icmpv6Packet::new_checked(&f[54..])
            .unwrap()
            .verify_checksum(e.src, e.dst));

        let mut s = Vec::new();
        etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 9])
            .ipv6(a, b, 64)
            .tcp(40000, 80, 1000, 64240)
            .syn()
            .write(&mut s, &[])
            .unwrap();
        let info = check(&s[14..]).unwrap();
        let mut out = [0u8; 128];
        let n = write_tcp_rst::<Ipv6Addr>(
            &mut out,
            (MacAddr::local(9), MacAddr::local(1)),
            &s[14..],
            &info,
        )
        .unwrap();
        let p = etherparse::SlicedPacket::from_ethernet(&out[..n]).unwrap();
        let (Some(etherparse::NetSlice::Ipv6(ip)), Some(etherparse::TransportSlice::Tcp(t))) =
            (&p.net, &p.transport)
        else {
            panic!()
        };
        assert!(t.rst() && t.ack());
        assert_eq!(t.acknowledgment_number(), 1001);
        let want = t
            .to_header()
            .calc_checksum_ipv6(&ip.header().to_header(), &[])
            .unwrap();
        assert_eq!(t.checksum(), want);
    }
}
