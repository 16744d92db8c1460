//! The IPv6 half of the router: `ipv6_rcv` checks, NDP (answering Neighbor Solicitations for
//! the interfaces' global and link-local addresses, defending them against DAD, soliciting
//! next hops, learning from NS/NA/RS as Linux's `ndisc_recv_*`), Router Advertisements,
//! forwarding as Linux's `ip6_forward`, ICMPv6 errors and echo.
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
use crate::l3::neigh::{Enqueue, NeighEvent6, Refusal, Released6};
use crate::l3::route::NextHop;
use crate::l3::router::{ErrorNat, Hook, L3Batch, Prerouting, Router, Sink, L3};
use crate::stats::DropReason;
use crate::time::Instant;
use crate::wire::ethernet::{copy_readdressed, EthernetFrame, HEADER_LEN as ETH_LEN};
use crate::wire::icmpv6::{self, codes, Icmpv6Packet, Icmpv6Repr, NaFlags, PrefixInfo};
use crate::wire::ipv6::{self, Ipv6Info, Ipv6Packet};
use crate::wire::mac::MacAddr;
use crate::wire::tcp;

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

/// An ICMPv6 error the router sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Icmp6Error {
    /// Time exceeded, hop limit (code 0).
    HopLimit,
    /// Destination unreachable with this code.
    Unreach(u8),
    /// Packet too big, with the MTU.
    TooBig(u16),
}

impl Icmp6Error {
    fn repr(self) -> Icmpv6Repr<'static> {
        match self {
            Icmp6Error::HopLimit => Icmpv6Repr::TimeExceeded {
                code: codes::HOP_LIMIT_EXCEEDED,
                data: &[],
            },
            Icmp6Error::Unreach(code) => Icmpv6Repr::DstUnreachable { code, data: &[] },
            Icmp6Error::TooBig(mtu) => Icmpv6Repr::PacketTooBig {
                mtu: u32::from(mtu),
                data: &[],
            },
        }
    }
}

impl Router {
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

    /// The IPv6 input of a frame addressed to the router (`group`: to an L2 group). Inlined
    /// into its one caller (`Router::input6`, itself inlined into the datapath's out-of-line
    /// IPv6 route): one call per packet, not two.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(crate) fn ip6_input(
        &self,
        b: &mut PacketBuf,
        l3: usize,
        in_if: IfaceId,
        group: bool,
        ctx: &mut L3Batch<'_>,
        hook: &mut impl Prerouting,
        now: Instant,
        sink: &mut dyn Sink,
    ) -> L3 {
        let mut info = match ipv6::check(b.frame().get(l3..).unwrap_or(&[])) {
            Ok(i) => i,
            Err(_) => return L3::Drop(DropReason::BadIpv6Header),
        };
        b.set_len(l3 + info.total_len());
        if info.dst.is_multicast() {
            if info.next_header == ipv6::NH_ICMPV6 && self.is_our_group(in_if, info.dst) {
                return match self.ndp_input(b.frame(), l3, &info, in_if, now, sink) {
                    Ok(()) => L3::Local,
                    Err(r) => L3::Drop(r),
                };
            }
            return L3::Drop(DropReason::L3Multicast);
        }
        if group {
            return L3::Drop(DropReason::L3Multicast);
        }
        let local = self.local_iface6(info.dst).is_some();
        if local && info.next_header == ipv6::NH_ICMPV6 {
            let ty = b.frame().get(l3 + info.l4_off).copied().unwrap_or(0);
            if icmpv6::is_ndp(ty) {
                return match self.ndp_input(b.frame(), l3, &info, in_if, now, sink) {
                    Ok(()) => L3::Local,
                    Err(r) => L3::Drop(r),
                };
            }
        }
        let dst = info.dst;
        match hook.prerouting6(self, ctx, b, l3, &mut info, now) {
            Hook::Accept => {}
            Hook::Drop(r) => return L3::Drop(r),
            Hook::Reject { tcp } => {
                self.reject6(b.frame(), l3, &info, in_if, tcp, now, sink);
                return L3::Drop(DropReason::NoEndpoint);
            }
        }
        let nat = hook.error_nat();
        // The hook may have translated the destination (DNAT): only then look again.
        let local = if info.dst == dst {
            local
        } else {
            self.local_iface6(info.dst).is_some()
        };
        if local {
            return self.local_input6(b, l3, &info, in_if, nat, now, sink);
        }
        if ipv6::is_link_local(&info.src) || ipv6::is_link_local(&info.dst) {
            return L3::Drop(DropReason::Ipv6LinkLocal);
        }
        let err = |e, b: &PacketBuf, info: &Ipv6Info, sink: &mut dyn Sink| {
            self.icmp6_error(b.frame(), l3, info, Some(in_if), e, nat, now, sink)
        };
        if info.hop_limit <= 1 {
            err(Icmp6Error::HopLimit, b, &info, sink);
            return L3::Drop(DropReason::TtlExpired);
        }
        // A run of packets to one destination (a flow) does the route and neighbour
        // lookups once per batch, as the IPv4 memo.
        let memo = match ctx.memo6 {
            Some(m) if m.0 == info.dst => Some(m.1),
            _ => ctx.older6.take(info.dst, &mut ctx.memo6).map(|m| m.1),
        };
        let (out_if, nh) = match memo.map(|m| m.0) {
            Some(o) => (o, info.dst),
            None => match ctx.routes6().lookup(info.dst) {
                None => {
                    err(Icmp6Error::Unreach(codes::NO_ROUTE), b, &info, sink);
                    return L3::Drop(DropReason::NoRoute);
                }
                Some(NextHop::Blackhole) => return L3::Drop(DropReason::Blackhole),
                Some(hop @ (NextHop::Unreachable | NextHop::Prohibit)) => {
                    let code = if hop == NextHop::Prohibit {
                        codes::REJECT_ROUTE
                    } else {
                        codes::NO_ROUTE
                    };
                    err(Icmp6Error::Unreach(code), b, &info, sink);
                    return L3::Drop(DropReason::Unreachable);
                }
                Some(NextHop::Link(i)) => (i, info.dst),
                Some(NextHop::Via(i, gw)) => (i, gw),
            },
        };
        let Some(egress) = self.iface(out_if) else {
            return L3::Drop(DropReason::NoRoute);
        };
        let mtu = usize::from(egress.cfg.mtu);
        let gso = b.offload.is_gso();
        let wire_len = if gso && info.next_header == ipv6::NH_TCP {
            let doff = b
                .frame()
                .get(l3 + info.l4_off..)
                .and_then(tcp::claimed_header_len)
                .unwrap_or(tcp::HEADER_LEN);
            (info.l4_off + doff + usize::from(b.offload.gso_size)).min(info.total_len())
        } else {
            info.total_len()
        };
        if wire_len > mtu {
            err(Icmp6Error::TooBig(egress.cfg.mtu), b, &info, sink);
            return L3::Drop(DropReason::PacketTooBig);
        }
        let mac = match memo {
            Some((.., m)) => Some(m),
            None => self.neigh6.lookup(out_if, nh, now),
        };
        let frame = b.frame_mut();
        if let Some(ip) = frame.get_mut(l3..) {
            ipv6::decrement_hop_limit(ip);
        }
        match mac {
            Some(m) => {
                if let Ok(mut e) = EthernetFrame::new_checked(frame) {
                    e.set_dst_addr(m);
                    e.set_src_addr(egress.cfg.mac);
                }
                if memo.is_none() {
                    let old = ctx.memo6.replace((info.dst, (out_if, m)));
                    ctx.older6.push(old);
                }
                L3::Forward(out_if)
            }
            None if b.offload.is_none() => self.resolve_later6(out_if, nh, b.frame(), now, sink),
            None => {
                let mut last = L3::Queued;
                let r = crate::offload::send_completed(b, &mut |f| {
                    last = self.resolve_later6(out_if, nh, f, now, sink);
                    Ok(())
                });
                match r {
                    Ok(()) => last,
                    Err(reason) => L3::Drop(reason),
                }
            }
        }
    }

    /// Queues a packet until its IPv6 next hop resolves; sends an NS when the table says so.
    #[cold]
    pub(crate) fn resolve_later6(
        &self,
        out_if: IfaceId,
        nh: Ipv6Addr,
        frame: &[u8],
        now: Instant,
        sink: &mut dyn Sink,
    ) -> L3 {
        let Some(egress) = self.iface(out_if) else {
            return L3::Drop(DropReason::NoRoute);
        };
        match self.neigh6.enqueue(out_if, nh, frame, now) {
            Enqueue::Resolved(mac) => {
                let src = egress.cfg.mac;
                sink.emit(out_if, &mut |out| copy_readdressed(out, frame, src, mac));
                L3::Local
            }
            Enqueue::Queued { solicit, dropped } => {
                if solicit {
                    self.send_ns(out_if, nh, None, sink);
                }
                for _ in dropped {
                    sink.dropped(DropReason::NeighQueueOverflow);
                }
                L3::Queued
            }
            Enqueue::Refused(Refusal::TableFull) => L3::Drop(DropReason::NeighTableFull),
            Enqueue::Refused(Refusal::FrameTooBig) => L3::Drop(DropReason::NeighQueueOverflow),
            Enqueue::Refused(Refusal::BadAddress) => L3::Drop(DropReason::NoRoute),
        }
    }

    /// The source address for what the router sends to `dst` out of `i`: its link-local
    /// address for a link-local destination or without a global one, else its global one.
    fn src6_for(&self, i: IfaceId, dst: Ipv6Addr) -> Option<Ipv6Addr> {
        let iface = self.iface(i)?;
        Some(match iface.cfg.addr6 {
            Some((g, _)) if !ipv6::is_link_local(&dst) => g,
            _ => iface.ll6,
        })
    }

    /// Sends a Neighbor Solicitation for `target` out of `i`: to its solicited-node group, or
    /// unicast to `unicast` (a probe).
    fn send_ns(&self, i: IfaceId, target: Ipv6Addr, unicast: Option<MacAddr>, sink: &mut dyn Sink) {
        let (Some(iface), Some(src)) = (self.iface(i), self.src6_for(i, target)) else {
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

    fn release6(&self, r: Released6, sink: &mut dyn Sink) {
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
                let for_us = iface.has_addr6(target);
                if !dad {
                    if let Some(m) = source_lladdr {
                        let _ =
                            self.neigh6
                                .input_solicit(in_if, info.src, m, for_us, now, &mut |r| {
                                    self.release6(r, sink)
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
                if iface.has_addr6(target) {
                    // Someone else claims our address: nothing to learn.
                    return Ok(());
                }
                // Without a target link-layer address (Linux's answer to a unicast probe),
                // it confirms the entry's own MAC.
                let _ = self.neigh6.input_advert(
                    in_if,
                    target,
                    target_lladdr,
                    flags.solicited,
                    flags.override_,
                    now,
                    &mut |r| self.release6(r, sink),
                );
            }
            Icmpv6Repr::RouterSolicit { source_lladdr } => {
                if info.src.is_unspecified() && source_lladdr.is_some() {
                    return Err(DropReason::BadNdp);
                }
                if let Some(m) = source_lladdr {
                    let _ = self
                        .neigh6
                        .input_solicit(in_if, info.src, m, true, now, &mut |r| {
                            self.release6(r, sink)
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
    pub(crate) fn observe6(
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

    #[allow(clippy::too_many_arguments)]
    #[cold]
    fn local_input6(
        &self,
        b: &mut PacketBuf,
        l3: usize,
        info: &Ipv6Info,
        in_if: IfaceId,
        nat: Option<&dyn ErrorNat>,
        now: Instant,
        sink: &mut dyn Sink,
    ) -> L3 {
        let Some(iface) = self.iface(in_if) else {
            return L3::Drop(DropReason::LocalNoService);
        };
        let reply = match info.next_header {
            ipv6::NH_ICMPV6 => ipv6::echo_reply_in_place(b.frame_mut(), l3, info, iface.cfg.mac),
            _ => None,
        };
        if let Some(len) = reply {
            b.set_len(len);
            self.counters.echo_replies.add(1);
            let f = b.frame();
            sink.emit(in_if, &mut |out| {
                out.get_mut(..f.len())?.copy_from_slice(f);
                Some(f.len())
            });
            return L3::Local;
        }
        if info.next_header == ipv6::NH_UDP {
            self.icmp6_error(
                b.frame(),
                l3,
                info,
                Some(in_if),
                Icmp6Error::Unreach(codes::PORT_UNREACH),
                nat,
                now,
                sink,
            );
        }
        L3::Drop(DropReason::LocalNoService)
    }

    /// Refuses a connection as kube-proxy's REJECT for IPv6: a TCP reset or ICMPv6 port
    /// unreachable, back the way the packet came.
    #[allow(clippy::too_many_arguments)]
    #[cold]
    fn reject6(
        &self,
        frame: &[u8],
        l3: usize,
        info: &Ipv6Info,
        in_if: IfaceId,
        tcp: bool,
        now: Instant,
        sink: &mut dyn Sink,
    ) {
        if !tcp {
            let e = Icmp6Error::Unreach(codes::PORT_UNREACH);
            self.icmp6_error(frame, l3, info, Some(in_if), e, None, now, sink);
            return;
        }
        let (Some(iface), Some(src), Some(orig)) = (
            self.iface(in_if),
            frame.get(6..12),
            frame.get(l3..l3 + info.total_len()),
        ) else {
            return;
        };
        let (ours, peer) = (iface.cfg.mac, MacAddr::from_slice(src));
        sink.emit(in_if, &mut |out| {
            ipv6::write_tcp_rst(out, ours, peer, orig, info)
        });
    }

    /// Sends an ICMPv6 error about the packet at `frame[l3..]` back to its source, if allowed
    /// (see [`ipv6::may_send_icmp_error`]; never to a link-local source from off its link)
    /// and within the rate limit, translated back through `nat` first. Its source address is
    /// the global address of the interface that leads back (link-local for a link-local
    /// destination).
    #[allow(clippy::too_many_arguments)]
    #[cold]
    #[inline(never)]
    pub(crate) fn icmp6_error(
        &self,
        frame: &[u8],
        l3: usize,
        info: &Ipv6Info,
        in_if: Option<IfaceId>,
        err: Icmp6Error,
        nat: Option<&dyn ErrorNat>,
        now: Instant,
        sink: &mut dyn Sink,
    ) {
        let group = frame.first().is_some_and(|d| d & 1 == 1);
        let Some(orig) = frame.get(l3..l3 + info.total_len()) else {
            return;
        };
        if !ipv6::may_send_icmp_error(orig, info, group) {
            return;
        }
        let mut buf = [0u8; ETH_LEN + ipv6::MIN_MTU];
        let Some(len) = ipv6::write_icmp_error(
            &mut buf,
            MacAddr::ZERO,
            MacAddr::ZERO,
            Ipv6Addr::UNSPECIFIED,
            info.src,
            err.repr(),
            orig,
        ) else {
            return;
        };
        let mut dst_ip = info.src;
        if let Some(nat) = nat {
            let Some(ip) = buf.get_mut(ETH_LEN..len) else {
                return;
            };
            let Ok(mut out) = ipv6::check(ip) else {
                return;
            };
            if !nat.translate_error6(ip, &mut out, now) {
                return;
            }
            dst_ip = out.dst;
        }
        if self.local_iface6(dst_ip).is_some() {
            return;
        }
        let (out_if, nh) = if ipv6::is_link_local(&dst_ip) {
            match in_if {
                Some(i) => (i, dst_ip),
                None => return,
            }
        } else {
            match self.routes6.lookup(dst_ip) {
                Some(NextHop::Link(i)) => (i, dst_ip),
                Some(NextHop::Via(i, gw)) => (i, gw),
                _ => return,
            }
        };
        if !self.icmp.allow(dst_ip.into(), now) {
            self.counters.icmp_rate_limited.add(1);
            return;
        }
        let (Some(egress), Some(src_ip)) = (self.iface(out_if), self.src6_for(out_if, dst_ip))
        else {
            return;
        };
        let dst_mac = match self.neigh6.lookup(out_if, nh, now) {
            Some(m) => m,
            None if in_if == Some(out_if) => match EthernetFrame::new_checked(frame) {
                Ok(e) => e.src_addr(),
                Err(_) => return,
            },
            None => return,
        };
        let Some(ip) = buf.get_mut(ETH_LEN..len) else {
            return;
        };
        let mut p = Ipv6Packet::new_unchecked(&mut *ip);
        p.set_src_addr(src_ip);
        Icmpv6Packet::new_unchecked(p.payload_mut()).fill_checksum(src_ip, dst_ip);
        self.counters.icmp_errors.add(1);
        let error = &buf[..len];
        let src_mac = egress.cfg.mac;
        sink.emit(out_if, &mut |out| {
            copy_readdressed(out, error, src_mac, dst_mac)
        });
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
    fn poll_ra(&self, now: Instant, sink: &mut dyn Sink) {
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
    pub(crate) fn announce6(&self, i: IfaceId, out: &mut [u8], emit: &mut dyn FnMut(&[u8])) {
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

    /// Runs the IPv6 timers due at `now`: NS retransmissions and probes, ICMPv6 address
    /// unreachable for packets whose next hop failed, Router Advertisements.
    pub(crate) fn poll6(&self, now: Instant, nat: Option<&dyn ErrorNat>, sink: &mut dyn Sink) {
        self.neigh6.poll(now, &mut |ev| match ev {
            NeighEvent6::Solicit { iface, ip, unicast } => self.send_ns(iface, ip, unicast, sink),
            NeighEvent6::Unreachable { frame, .. } => {
                sink.dropped(DropReason::NeighFailed);
                self.counters.neigh_failed.add(1);
                if let Ok(info) = ipv6::check(frame.get(ETH_LEN..).unwrap_or(&[])) {
                    let e = Icmp6Error::Unreach(codes::ADDR_UNREACH);
                    self.icmp6_error(&frame, ETH_LEN, &info, None, e, nat, now, sink);
                }
            }
        });
        self.poll_ra(now, sink);
    }
}
