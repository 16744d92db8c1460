//! The forwarding path, written once for both families and monomorphised per family: header
//! checks, the PREROUTING hook, local delivery (echo, port unreachable), the TTL / hop limit,
//! the route lookup with its ICMP errors, the MTU (fragmentation needed / packet too big),
//! neighbour resolution, and the ICMP errors the router sends, as Linux's `ip_forward` /
//! `ip6_forward` and `icmp_send` / `icmp6_send`.
//!
//! What the families really differ in is behind [`RouterFamily`] ([`super::ipv4`]: ARP,
//! fragmentation, directed broadcasts; [`super::ipv6`]: NDP, link-local scope).

use crate::base::IfaceId;
use crate::buf::PacketBuf;
use crate::l3::defrag::{Frags, FragsOf, Taken};
use crate::l3::neigh::{Enqueue, Refusal};
use crate::l3::route::{NextHop, RouteAddr, RouteReader};
use crate::narrow::low32;
use crate::stats::{DropReason, Shard};
use crate::time::Instant;
use crate::wire::ethernet::{copy_readdressed, EthernetFrame, HEADER_LEN as ETH_LEN};
use crate::wire::family::{Family, IpProto};
use crate::wire::mac::MacAddr;
use crate::wire::tcp;

use super::reply::{write_icmp_error, write_tcp_rst, IcmpHead};
use super::{ErrorNat, Hook, Iface, L3Batch, Memo, Prerouting, Router, Sink, L3};

/// The largest ICMP error the router writes, Ethernet header included (IPv6's minimum MTU;
/// IPv4's errors stop at 576 bytes).
pub(crate) const ICMP_ERROR_FRAME: usize = ETH_LEN + 1280;

/// What the forwarding path needs of an address family beyond [`Family`] and [`RouteAddr`]:
/// its checked header facts, its tables in the router and in a batch, and the few steps that
/// differ by protocol. Implemented on [`std::net::Ipv4Addr`] (in [`super::ipv4`]) and
/// [`std::net::Ipv6Addr`] (in [`super::ipv6`]).
pub(crate) trait RouterFamily: Family + RouteAddr + FragsOf {
    /// The checked header facts (`Ipv4Info`, `Ipv6Info`).
    type Info: Copy;
    /// Why a packet too big for its egress MTU is dropped.
    const TOO_BIG: DropReason;

    /// Checks the header at the start of `l3` as Linux's `ip_rcv` / `ipv6_rcv`.
    fn check(l3: &[u8]) -> Result<Self::Info, DropReason>;
    /// The header facts the forwarding path reads.
    fn facts(i: &Self::Info) -> Facts<Self>;
    /// The router may fragment it (IPv4 without DF).
    fn may_fragment(i: &Self::Info) -> bool;
    /// It is a fragment of a bigger datagram.
    fn is_fragment(i: &Self::Info) -> bool;
    /// Decrements the TTL / hop limit of the header at the start of `l3` (checked).
    fn decrement_ttl(l3: &mut [u8]);

    /// The batch's forwarding memo of this family.
    fn memo<'b>(batch: &'b mut L3Batch<'_>) -> &'b mut Memo<Self>;
    /// The batch's routing-table version of this family.
    fn routes<'b, 'a>(batch: &'b mut L3Batch<'a>) -> &'b RouteReader<'a, Self>;
    /// The router's neighbour entry for `ip` on `i`, if usable.
    #[inline(always)]
    fn neigh_lookup(r: &Router, i: IfaceId, ip: Self, now: Instant) -> Option<MacAddr> {
        r.neigh::<Self>().lookup(i, ip, now)
    }
    /// Queues `frame` on the neighbour entry for `ip` on `i`.
    fn neigh_enqueue(r: &Router, i: IfaceId, ip: Self, frame: &[u8], now: Instant) -> Enqueue {
        r.neigh::<Self>().enqueue(i, ip, frame, now)
    }
    /// Asks for `target` on `i` (ARP request, Neighbor Solicitation); to `unicast` for a probe.
    fn solicit(r: &Router, i: IfaceId, target: Self, unicast: Option<MacAddr>, sink: &mut dyn Sink);

    /// The family's own input steps before the hook (NDP, groups): `Some` is the verdict.
    fn early(
        r: &Router,
        b: &PacketBuf,
        rx: Rx,
        info: &Self::Info,
        sink: &mut dyn Sink,
    ) -> Option<L3>;
    /// Why a destination not in the memo and not local is not forwarded, if it is not.
    fn unroutable_dst(r: &Router, dst: Self) -> Option<DropReason>;
    /// Why a packet is not forwarded whatever its destination (a link-local source), if not.
    fn unroutable_src(i: &Self::Info) -> Option<DropReason>;
    /// Why `iface` takes no packet to the router's own addresses of this family, if it doesn't.
    fn refuse_local(iface: &Iface) -> Option<DropReason>;
    /// Fragments a datagram too big for `out.mtu` (TTL decremented) and sends the fragments.
    fn fragment(
        r: &Router,
        b: &mut PacketBuf,
        l3: usize,
        info: &Self::Info,
        out: Egress<Self>,
        sink: &mut dyn Sink,
    ) -> L3;

    /// A source address as a batch's memo of the last source that passed keeps it
    /// ([`Memo::source_ok`]): its bytes as a native-endian word (no byte swap).
    type SourceKey: Copy + PartialEq;
    /// A key that no packet's source has on this path: the memo's empty value (IPv4: a
    /// 64-bit word above 32 bits; IPv6: all ones, a multicast address, which [`Self::check`]
    /// refuses as a source).
    const NO_SOURCE: Self::SourceKey;
    /// `src` as a [`Self::SourceKey`].
    fn source_key(src: Self) -> Self::SourceKey;
    /// True when `src` is a martian source of this family by its range alone, or by the
    /// family's own rule (IPv4: an interface's directed broadcast); `dst` for IPv4's one
    /// exception, `0.0.0.0` to the limited broadcast (DHCP). The router's own addresses
    /// are checked by [`Router::martian_source`] for both families.
    fn martian_src(r: &Router, src: Self, dst: Self) -> bool;

    /// True when an ICMP error may be sent about the datagram `l3` (RFC 1122 / RFC 4443).
    fn may_send_icmp_error(l3: &[u8], info: &Self::Info, l2_group_dst: bool) -> bool;
    /// The family's ICMP type, code and second word for `err`.
    fn icmp_head(err: IcmpError) -> IcmpHead;
    /// Where an error to `dst` leaves: the interface and next hop.
    fn icmp_route(r: &Router, dst: Self, in_if: Option<IfaceId>) -> Option<(IfaceId, Self)>;
    /// The source address of what the router sends to `dst` out of `i`.
    fn src_for(r: &Router, i: IfaceId, dst: Self) -> Option<Self>;
    /// Sets the source of the error datagram `ip` to `src` and refreshes its checksums.
    fn set_icmp_src(ip: &mut [u8], src: Self, dst: Self);
    /// Turns the echo request in `frame` into its reply in place: the reply's frame length.
    fn echo_reply(
        frame: &mut [u8],
        l3: usize,
        info: &Self::Info,
        our_mac: MacAddr,
    ) -> Option<usize>;
    /// The TCP segment of the datagram `orig_l3` (header checked, facts in `info`), if it
    /// has a TCP header (not a later fragment).
    fn tcp_segment<'a>(orig_l3: &'a [u8], info: &Self::Info) -> Option<&'a [u8]>;
}

/// The facts of a checked header the forwarding path reads, whatever the family.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Facts<A> {
    /// The source address.
    pub(crate) src: A,
    /// The destination address.
    pub(crate) dst: A,
    /// The TTL / hop limit.
    pub(crate) ttl: u8,
    /// The upper-layer protocol.
    pub(crate) proto: IpProto,
    /// The datagram's length.
    pub(crate) total_len: usize,
    /// Where the upper-layer header starts, from the IP header.
    pub(crate) l4_off: usize,
}

/// Where a packet the router takes in is: its L3 offset, the interface it came in on, the
/// time, and whether its frame went to an L2 group.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rx {
    /// The offset of the L3 header in the frame.
    pub(crate) l3: usize,
    /// The interface it came in on.
    pub(crate) in_if: IfaceId,
    /// Now.
    pub(crate) now: Instant,
    /// The frame went to an L2 group (multicast or broadcast MAC), read as it came in (before
    /// the datagram's padding is trimmed, when the caller has the frame's bounds at hand).
    pub(crate) group: bool,
}

/// Where a packet leaves: the egress interface, its next hop, the interface's MTU and MAC.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Egress<A> {
    /// The egress interface.
    pub(crate) iface: IfaceId,
    /// The next hop (the destination itself on-link).
    pub(crate) nh: A,
    /// The egress interface's MTU.
    pub(crate) mtu: usize,
    /// The egress interface's MAC.
    pub(crate) mac: MacAddr,
    /// Now.
    pub(crate) now: Instant,
}

/// An ICMP error the router sends about a packet it did not deliver, as Linux's `icmp_send`
/// and `icmp6_send` callers do; each family maps it to its type and code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum IcmpError {
    /// Time exceeded: the TTL / hop limit ran out in transit.
    TtlExceeded,
    /// No route (ICMP net unreachable, ICMPv6 no route).
    NoRoute,
    /// An `unreachable` route (ICMP host unreachable, ICMPv6 no route).
    Unreachable,
    /// A `prohibit` route (ICMP communication administratively prohibited, ICMPv6 reject
    /// route).
    Prohibited,
    /// Nothing serves the port on the router's own address.
    PortUnreachable,
    /// The next hop did not answer ARP / NDP (ICMP host unreachable, ICMPv6 address
    /// unreachable).
    NeighFailed,
    /// Too big for the egress MTU (ICMP fragmentation needed, ICMPv6 packet too big).
    TooBig {
        /// The egress interface's MTU.
        mtu: u16,
    },
}

/// The packet an ICMP error is about: its frame, where its IP header starts, that header's
/// checked facts, and the interface it came in on when that is known (a packet released from
/// a neighbour queue no longer knows it): when the error goes back out of that interface,
/// the packet's own source MAC is a usable next hop.
#[derive(Clone, Copy)]
pub(crate) struct Offending<'a, A: RouterFamily> {
    pub(crate) frame: &'a [u8],
    pub(crate) l3: usize,
    pub(crate) info: &'a A::Info,
    pub(crate) in_if: Option<IfaceId>,
    /// The packet had waited for its next hop: in Linux it had passed POSTROUTING, its source
    /// NAT applied, which decides the error's source address (see [`Router::icmp_error`]).
    pub(crate) queued: bool,
}

impl Rx {
    /// The frame in `b`, whose L3 header is at `l3`, come in on `in_if` at `now`.
    #[inline(always)]
    pub(crate) fn new(b: &PacketBuf, l3: usize, in_if: IfaceId, now: Instant) -> Rx {
        let group = b.frame().first().is_some_and(|d| d & 1 == 1);
        Rx {
            l3,
            in_if,
            now,
            group,
        }
    }
}

/// Cuts a datagram put together from fragments (as a frame, rewritten or not) back where
/// it was cut, handing each fragment's frame on: how many.
type Cut<'c> = &'c mut dyn FnMut(&[u8], &mut dyn FnMut(&[u8])) -> usize;

/// A datagram to the router's own address, put together from fragments (see
/// [`Router::reply_in_fragments`]).
struct Reassembled<'c> {
    /// Bytes of frame it came to.
    len: usize,
    /// Its largest fragment, bytes of IP packet (Linux's `frag_max_size`).
    max: usize,
    /// Cuts it back.
    cut: Cut<'c>,
}

/// Decrements the TTL / hop limit of the datagram at `frame[l3..]` (its header checked).
#[inline(always)]
fn decrement_ttl<A: RouterFamily>(frame: &mut [u8], l3: usize) {
    if let Some(ip) = frame.get_mut(l3..) {
        A::decrement_ttl(ip);
    }
}

impl<'a, A: RouterFamily> Offending<'a, A> {
    /// A packet the router is looking at as it came in.
    #[inline]
    pub(crate) fn arrived(b: &'a PacketBuf, rx: Rx, info: &'a A::Info) -> Self {
        Offending {
            frame: b.frame(),
            l3: rx.l3,
            info,
            in_if: Some(rx.in_if),
            queued: false,
        }
    }
}

impl Router {
    /// The IP input and forwarding of a frame addressed to the router, for family `A`. Inlined
    /// into its callers (the datapath's routed paths): one call per packet, not two.
    ///
    /// `WHOLE`: `b` holds a datagram put together from fragments (see [`crate::l3::defrag`]),
    /// sent on as the fragments it came in; its own monomorphised copy, so the path of every
    /// other packet has no check for it.
    #[inline(always)]
    pub(crate) fn ip_input<A: RouterFamily, const WHOLE: bool>(
        &self,
        b: &mut PacketBuf,
        rx: Rx,
        ctx: &mut L3Batch<'_>,
        hook: &mut impl Prerouting<A>,
        sink: &mut dyn Sink,
    ) -> L3 {
        let (l3, now) = (rx.l3, rx.now);
        let mut info = match A::check(b.frame().get(l3..).unwrap_or(&[])) {
            Ok(i) => i,
            Err(r) => return L3::Drop(r),
        };
        // Ethernet padding after the datagram is not forwarded (Linux trims it in ip_rcv).
        b.set_len(l3 + A::facts(&info).total_len);
        if let Some(v) = A::early(self, b, rx, &info, sink) {
            return v;
        }
        // Martian sources, before the hook so that they make no connection (see
        // `martian_source`): one compare for a batch's packets from one source.
        if A::source_key(A::facts(&info).src) != A::memo(ctx).source_ok
            && self.martian_source(A::memo(ctx), &info, rx.in_if)
        {
            return L3::Drop(DropReason::MartianSource);
        }
        match hook.prerouting(self, ctx, b, l3, &mut info, now) {
            Hook::Accept => {}
            Hook::Drop(r) => return L3::Drop(r),
            Hook::Reject { tcp } => {
                self.reject::<A>(b.frame(), rx, &info, tcp, sink);
                return L3::Drop(DropReason::NoEndpoint);
            }
            // A datagram put together is no fragment: only a lying one comes here twice.
            Hook::Fragment if WHOLE => return L3::Drop(DropReason::FragMalformed),
            Hook::Fragment => return L3::Fragment(rx.in_if),
        }
        let dst = A::facts(&info).dst;
        // The memo holds only forwarded (so neither local nor broadcast) destinations.
        let m = A::memo(ctx);
        let memo = match m.last {
            Some(x) if x.0 == dst => Some(x.1),
            _ => m.older.take(dst, &mut m.last).map(|x| x.1),
        };
        if memo.is_none() {
            if self.local_iface(dst).is_some() && !self.is_host_addr(dst.into()) {
                if WHOLE || A::is_fragment(&info) {
                    return self.local_datagram::<A, WHOLE>(b, rx, &info, ctx, hook, sink);
                }
                return self.local_alone::<A>(b, rx, &info, hook.error_nat(), sink);
            }
            if let Some(r) = A::unroutable_dst(self, dst) {
                return L3::Drop(r);
            }
        }
        if let Some(r) = A::unroutable_src(&info) {
            return L3::Drop(r);
        }
        if A::facts(&info).ttl <= 1 {
            self.icmp_error::<A>(
                Offending::arrived(b, rx, &info),
                IcmpError::TtlExceeded,
                hook.error_nat(),
                now,
                sink,
            );
            return L3::Drop(DropReason::TtlExpired);
        }
        let (out_if, nh) = match memo {
            Some((out_if, nh, _)) => (out_if, nh),
            None => match A::routes(ctx).lookup(dst) {
                None => {
                    self.icmp_error::<A>(
                        Offending::arrived(b, rx, &info),
                        IcmpError::NoRoute,
                        hook.error_nat(),
                        now,
                        sink,
                    );
                    return L3::Drop(DropReason::NoRoute);
                }
                Some(NextHop::Blackhole) => return L3::Drop(DropReason::Blackhole),
                Some(hop @ (NextHop::Unreachable | NextHop::Prohibit)) => {
                    // Linux's `unreachable` route type answers with host unreachable (no
                    // route), its `prohibit` with administratively prohibited (reject route).
                    let e = if hop == NextHop::Prohibit {
                        IcmpError::Prohibited
                    } else {
                        IcmpError::Unreachable
                    };
                    self.icmp_error::<A>(
                        Offending::arrived(b, rx, &info),
                        e,
                        hook.error_nat(),
                        now,
                        sink,
                    );
                    return L3::Drop(DropReason::Unreachable);
                }
                Some(NextHop::Link(i)) => (i, dst),
                Some(NextHop::Via(i, gw)) => (i, gw),
            },
        };
        let Some(egress) = self.iface(out_if) else {
            return L3::Drop(DropReason::NoRoute);
        };
        if WHOLE {
            let out = Egress {
                iface: out_if,
                nh,
                mtu: usize::from(egress.cfg.mtu),
                mac: egress.cfg.mac,
                now,
            };
            return self.forward_reassembled::<A>(b, rx, &info, out, hook, sink);
        }
        let mtu = usize::from(egress.cfg.mtu);
        // A TCP super-frame (TSO from an offload TAP) leaves as segments of `gso_size` payload
        // bytes: check their size, as Linux's `ip_exceeds_mtu` / `skb_gso_validate_network_len`.
        let gso = b.offload.is_gso();
        let total_len = A::facts(&info).total_len;
        let wire_len = if gso && A::facts(&info).proto == IpProto::TCP {
            let l4 = A::facts(&info).l4_off;
            let doff = b
                .frame()
                .get(l3 + l4..)
                .and_then(tcp::claimed_header_len)
                .unwrap_or(tcp::HEADER_LEN);
            (l4 + doff + usize::from(b.offload.gso_size)).min(total_len)
        } else {
            total_len
        };
        if wire_len > mtu && (gso || !A::may_fragment(&info)) {
            let e = IcmpError::TooBig {
                mtu: egress.cfg.mtu,
            };
            self.icmp_error::<A>(
                Offending::arrived(b, rx, &info),
                e,
                hook.error_nat(),
                now,
                sink,
            );
            return L3::Drop(A::TOO_BIG);
        }
        if wire_len > mtu {
            decrement_ttl::<A>(b.frame_mut(), l3);
            let out = Egress {
                iface: out_if,
                nh,
                mtu,
                mac: egress.cfg.mac,
                now,
            };
            return A::fragment(self, b, l3, &info, out, sink);
        }
        let mac = match memo {
            Some((.., m)) => Some(m),
            None => A::neigh_lookup(self, out_if, nh, now),
        };
        let Some(mac) = mac else {
            decrement_ttl::<A>(b.frame_mut(), l3);
            return self.queue_unresolved(b, out_if, nh, now, sink);
        };
        // One look at the frame for both rewrites: the TTL / hop limit, then the MACs.
        let f = b.frame_mut();
        decrement_ttl::<A>(f, l3);
        if let Ok(mut e) = EthernetFrame::new_checked(f) {
            e.set_dst_addr(mac);
            e.set_src_addr(egress.cfg.mac);
        }
        if memo.is_none() {
            let slot = A::memo(ctx);
            let old = slot.last.replace((dst, (out_if, nh, mac)));
            slot.older.push(old);
        }
        L3::Forward(out_if)
    }

    /// The last step of a datagram put together from fragments (routed, TTL / hop limit not
    /// yet decremented): sent on as the fragments it came in, as Linux refragments at
    /// `frag_max_size` after `nf_defrag` (and as OVS sends the original fragments), each
    /// with the datagram's new addresses. A fragment bigger than the egress MTU makes the
    /// datagram too big: IPv4 without DF is cut again for the MTU, anything else answered
    /// with fragmentation needed / packet too big (Linux's `ip_exceeds_mtu` /
    /// `ip6_pkt_too_big` with `frag_max_size`).
    #[cold]
    #[inline(never)]
    fn forward_reassembled<A: RouterFamily>(
        &self,
        b: &mut PacketBuf,
        rx: Rx,
        info: &A::Info,
        out: Egress<A>,
        hook: &mut impl Prerouting<A>,
        sink: &mut dyn Sink,
    ) -> L3 {
        let l3 = rx.l3;
        if hook.max_frag_size() > out.mtu {
            if A::may_fragment(info) {
                decrement_ttl::<A>(b.frame_mut(), l3);
                return A::fragment(self, b, l3, info, out, sink);
            }
            let e = IcmpError::TooBig {
                mtu: u16::try_from(out.mtu).unwrap_or(u16::MAX),
            };
            self.icmp_error::<A>(
                Offending::arrived(b, rx, info),
                e,
                hook.error_nat(),
                out.now,
                sink,
            );
            return L3::Drop(A::TOO_BIG);
        }
        decrement_ttl::<A>(b.frame_mut(), l3);
        let mac = A::neigh_lookup(self, out.iface, out.nh, out.now);
        let sent = hook.refragment(b.frame(), &mut |f| match mac {
            Some(m) => sink.emit(out.iface, &mut |o| copy_readdressed(o, f, out.mac, m)),
            None => {
                let _ = self.resolve_later(out.iface, out.nh, f, out.now, sink);
            }
        });
        if sent == 0 {
            return L3::Drop(DropReason::FragMalformed);
        }
        L3::Local
    }

    /// True when the source of the packet `info` the router takes in (to forward or to one of its
    /// own addresses), is martian, as Linux's `ip_route_input_slow` (IPv4, `martian_source`)
    /// and `ip6_rcv_core` / `ip6_forward` (IPv6) find: a source of the family's martian
    /// ranges ([`RouterFamily::martian_src`]), or one of the router's own addresses (a pod
    /// impersonating its gateway or its node, whose address would escape masquerade; Linux's
    /// `fib_validate_source`). Otherwise the source is remembered in `memo` for the batch's next
    /// packets (`0.0.0.0`, allowed only to the limited broadcast, is not).
    #[cold]
    #[inline(never)]
    ///
    /// The node's own address is no martian coming from the host behind the host port
    /// (`in_if`), whose processes send with it (never remembered: a pod's packet with it in
    /// the same batch is still a martian).
    fn martian_source<A: RouterFamily>(
        &self,
        memo: &mut Memo<A>,
        info: &A::Info,
        in_if: IfaceId,
    ) -> bool {
        let Facts { src, dst, .. } = A::facts(info);
        if A::martian_src(self, src, dst) {
            return true;
        }
        if self.local_iface(src).is_some() {
            let from_host = self
                .host_port()
                .is_some_and(|(i, _)| i == in_if && self.is_host_addr(src.into()));
            return !from_host;
        }
        if src != A::UNSPECIFIED {
            memo.source_ok = A::source_key(src);
        }
        false
    }

    /// A packet whose next hop is not resolved yet (TTL / hop limit decremented): queued on
    /// its neighbour entry (see [`Router::resolve_later`]).
    #[cold]
    #[inline(never)]
    fn queue_unresolved<A: RouterFamily>(
        &self,
        b: &mut PacketBuf,
        out_if: IfaceId,
        nh: A,
        now: Instant,
        sink: &mut dyn Sink,
    ) -> L3 {
        if b.offload.is_none() {
            return self.resolve_later(out_if, nh, b.frame(), now, sink);
        }
        // The neighbour queue holds plain frames: finish the offload work (partial checksum,
        // TSO segmentation) before queueing, or it would be lost.
        let mut last = L3::Queued;
        let r = crate::offload::send_completed(b, &mut |f| {
            last = self.resolve_later(out_if, nh, f, now, sink);
            Ok(())
        });
        match r {
            Ok(()) => last,
            Err(reason) => L3::Drop(reason),
        }
    }

    /// Queues a packet until its next hop resolves; asks for the next hop (ARP request,
    /// Neighbor Solicitation) when the table says so.
    #[cold]
    #[inline(never)]
    pub(crate) fn resolve_later<A: RouterFamily>(
        &self,
        out_if: IfaceId,
        nh: A,
        frame: &[u8],
        now: Instant,
        sink: &mut dyn Sink,
    ) -> L3 {
        let Some(egress) = self.iface(out_if) else {
            return L3::Drop(DropReason::NoRoute);
        };
        match A::neigh_enqueue(self, out_if, nh, frame, now) {
            Enqueue::Resolved(mac) => {
                let src = egress.cfg.mac;
                sink.emit(out_if, &mut |out| copy_readdressed(out, frame, src, mac));
                L3::Local
            }
            Enqueue::Queued { solicit, dropped } => {
                if solicit {
                    A::solicit(self, out_if, nh, None, sink);
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

    /// A packet to one of the router's own addresses: an echo request is answered (turned
    /// into its reply in place: `L3::Forward` back out of `in_if`, which the caller sends as
    /// a copy), UDP gets a port unreachable and TCP a reset (no socket listens on the
    /// router), the rest is dropped.
    #[cold]
    #[inline(never)]
    fn local_input<A: RouterFamily>(
        &self,
        b: &mut PacketBuf,
        rx: Rx,
        info: &A::Info,
        nat: Option<&dyn ErrorNat<A>>,
        sink: &mut dyn Sink,
    ) -> L3 {
        let Some(iface) = self.iface(rx.in_if) else {
            return L3::Drop(DropReason::LocalNoService);
        };
        if let Some(r) = A::refuse_local(iface) {
            return L3::Drop(r);
        }
        if A::facts(info).proto == A::ICMP {
            if let Some(len) = A::echo_reply(b.frame_mut(), rx.l3, info, iface.cfg.mac) {
                b.set_len(len);
                self.counters.echo_replies.add(1);
                // The reply goes back the way the request came (dst MAC = the request's
                // source). The caller sends a copy as a frame the router makes: the request
                // itself was consumed (`local`, not `forwarded`, like an answered ARP
                // request). Copied there rather than here: emitting here cost 13
                // instructions per routed frame (callgrind), the codegen of the hot caller
                // changing with this function's results.
                return L3::Forward(rx.in_if);
            }
        }
        let f = A::facts(info);
        if f.proto == IpProto::UDP {
            let about = Offending::arrived(b, rx, info);
            self.icmp_error::<A>(about, IcmpError::PortUnreachable, nat, rx.now, sink);
        } else if f.proto == IpProto::TCP {
            // No socket listens here: a reset, as Linux's `tcp_v4_rcv`/`tcp_v6_rcv` send
            // (`tcp_v4_send_reset`), unless the segment is a reset itself (`write_tcp_rst`
            // refuses those) or its checksum is wrong (trusted when partial, from a sender on
            // this host, as Linux trusts CHECKSUM_PARTIAL).
            let seg = b.frame().get(rx.l3 + f.l4_off..rx.l3 + f.total_len);
            let len = seg.map_or(0, <[u8]>::len);
            let sum_ok = b.offload.needs_csum()
                || seg.is_some_and(|s| {
                    crate::wire::family::pseudo_header(
                        f.src,
                        f.dst,
                        IpProto::TCP,
                        low32(len as u64),
                    )
                    .verifies(s)
                });
            if sum_ok {
                if let Some(v) = self.to_local_stack(b, rx, f) {
                    return v;
                }
                self.reject::<A>(b.frame(), rx, info, true, sink);
            }
        }
        L3::Drop(DropReason::LocalNoService)
    }

    /// A datagram to the router's own address that came in fragments, put together before
    /// delivery as Linux's `ip_local_deliver` / `ipv6_frag_rcv` do: `WHOLE`, put together
    /// in front of the router already (by the NAT hook, which cuts it back); otherwise a
    /// fragment, held in the batch's reassembly ([`L3Batch::frags`]) until its datagram is
    /// complete (with none, it is taken alone, as before reassembly existed).
    #[cold]
    #[inline(never)]
    fn local_datagram<A: RouterFamily, const WHOLE: bool>(
        &self,
        b: &mut PacketBuf,
        rx: Rx,
        info: &A::Info,
        ctx: &mut L3Batch<'_>,
        hook: &mut impl Prerouting<A>,
        sink: &mut dyn Sink,
    ) -> L3 {
        if WHOLE {
            let len = b.len();
            let done = self.local_input::<A>(b, rx, info, hook.error_nat(), sink);
            let whole = Reassembled {
                len,
                max: hook.max_frag_size(),
                cut: &mut |w, out| hook.refragment(w, out),
            };
            return self.reply_in_fragments::<A>(done, b, rx, whole, sink);
        }
        let Some((frags, shard)) = ctx.frags.take() else {
            return self.local_alone::<A>(b, rx, info, hook.error_nat(), sink);
        };
        let done = self.local_fragment::<A>(b, rx, info, frags, shard, sink);
        ctx.frags = Some((frags, shard));
        done
    }

    /// A fragment to the router's own address (a datapath without NAT), put together in
    /// the worker's `frags` (its timeouts and datagrams counted in `shard`): held, or the
    /// whole datagram delivered in its place, its echo reply cut back as the request was.
    fn local_fragment<A: RouterFamily>(
        &self,
        b: &mut PacketBuf,
        rx: Rx,
        info: &A::Info,
        frags: &mut Frags,
        shard: &Shard,
        sink: &mut dyn Sink,
    ) -> L3 {
        let expired = match frags.take::<A>(b, rx.l3, rx.now) {
            Err(r) => return L3::Drop(r),
            Ok(Taken::Held { expired }) => {
                shard.count_drops(DropReason::FragTimeout, expired);
                return L3::Queued;
            }
            // Not one to reassembly (a fragment header it does not look for): taken alone.
            Ok(Taken::NotFragment) => return self.local_alone::<A>(b, rx, info, None, sink),
            Ok(Taken::Whole { expired }) => expired,
        };
        shard.count_drops(DropReason::FragTimeout, expired);
        shard.totals.reassembled.add(1);
        let done = match A::check(b.frame().get(rx.l3..).unwrap_or(&[])) {
            Err(r) => L3::Drop(r),
            Ok(whole) => {
                let len = b.len();
                let done = self.local_input::<A>(b, rx, &whole, None, sink);
                let whole = Reassembled {
                    len,
                    max: frags.max_frag_size(),
                    cut: &mut |w, out| frags.refragment::<A>(w, out),
                };
                self.reply_in_fragments::<A>(done, b, rx, whole, sink)
            }
        };
        frags.restore(b);
        done
    }

    /// What [`Router::local_input`] did (`done`) with a datagram put together from fragments
    /// (`whole`). Its echo reply (`L3::Forward`: in `b`, in the request's place, as long as
    /// it) leaves the way the request came, cut where the request was cut, so each fragment
    /// is the size one of the request's was on that link, with the reply's addresses (as the
    /// NAT hook cuts a translated datagram back; Linux fragments a reply at the MTU, which
    /// those sizes fit). When the request's fragments were bigger than the interface's MTU,
    /// IPv4 without DF is fragmented for the MTU instead ([`RouterFamily::fragment`]);
    /// anything else is dropped as too big (the router does not fragment IPv6).
    fn reply_in_fragments<A: RouterFamily>(
        &self,
        done: L3,
        b: &mut PacketBuf,
        rx: Rx,
        whole: Reassembled<'_>,
        sink: &mut dyn Sink,
    ) -> L3 {
        let Reassembled { len, max, cut } = whole;
        let L3::Forward(back) = done else {
            return done;
        };
        let Some(iface) = self.iface(back) else {
            return L3::Drop(DropReason::NoRoute);
        };
        // IPv6's reply leaves extension headers out; then the request's fragments' headers
        // no longer fit it.
        let eth = EthernetFrame::new_checked(b.frame())
            .ok()
            .filter(|_| b.len() == len);
        let Some((to, from)) = eth.map(|e| (e.dst_addr(), e.src_addr())) else {
            return L3::Drop(DropReason::FragMalformed);
        };
        let mtu = usize::from(iface.cfg.mtu);
        if max > mtu {
            let reply = match A::check(b.frame().get(rx.l3..).unwrap_or(&[])) {
                Ok(i) => i,
                Err(r) => return L3::Drop(r),
            };
            if !A::may_fragment(&reply) {
                return L3::Drop(A::TOO_BIG);
            }
            let out = Egress {
                iface: back,
                nh: A::facts(&reply).dst,
                mtu,
                mac: iface.cfg.mac,
                now: rx.now,
            };
            return A::fragment(self, b, rx.l3, &reply, out, sink);
        }
        let sent = cut(b.frame(), &mut |f| {
            sink.emit(back, &mut |o| copy_readdressed(o, f, from, to));
        });
        if sent == 0 {
            return L3::Drop(DropReason::FragMalformed);
        }
        L3::Local
    }

    /// [`Router::local_input`] on a packet taken alone, its echo reply sent as a copy.
    #[inline(always)]
    fn local_alone<A: RouterFamily>(
        &self,
        b: &mut PacketBuf,
        rx: Rx,
        info: &A::Info,
        nat: Option<&dyn ErrorNat<A>>,
        sink: &mut dyn Sink,
    ) -> L3 {
        match self.local_input::<A>(b, rx, info, nat, sink) {
            L3::Forward(back) => Self::send_copy(back, b.frame(), sink),
            other => other,
        }
    }

    /// A TCP segment to one of the router's addresses, on a port the local stack serves:
    /// handed to it (`L3::Local`), or dropped when its queue is full; `None` for any other
    /// port (the caller resets it).
    #[cold]
    #[inline(never)]
    fn to_local_stack<A: RouterFamily>(&self, b: &PacketBuf, rx: Rx, f: Facts<A>) -> Option<L3> {
        let l4 = b.frame().get(rx.l3 + f.l4_off..rx.l3 + f.total_len)?;
        let dport = u16::from_be_bytes([*l4.get(2)?, *l4.get(3)?]);
        if !self.local.serves(dport) {
            return None;
        }
        let ip = b.frame().get(rx.l3..rx.l3 + f.total_len)?;
        let peer = MacAddr::from_slice(b.frame().get(6..12)?);
        Some(if self.local.hand_off(ip, rx.in_if, peer) {
            L3::Local
        } else {
            L3::Drop(DropReason::LocalStackFull)
        })
    }

    /// Sends a copy of `frame` (addressed already) out of `via`, as a frame the router makes;
    /// the frame it came from was consumed (`L3::Local`).
    #[cold]
    #[inline(never)]
    fn send_copy(via: IfaceId, frame: &[u8], sink: &mut dyn Sink) -> L3 {
        sink.emit(via, &mut |out| {
            out.get_mut(..frame.len())?.copy_from_slice(frame);
            Some(frame.len())
        });
        L3::Local
    }

    /// Refuses a connection as kube-proxy's REJECT rule: a TCP reset for TCP, ICMP port
    /// unreachable otherwise, sent back the way the packet came.
    #[cold]
    #[inline(never)]
    fn reject<A: RouterFamily>(
        &self,
        frame: &[u8],
        rx: Rx,
        info: &A::Info,
        tcp: bool,
        sink: &mut dyn Sink,
    ) {
        if !tcp {
            let about = Offending {
                frame,
                l3: rx.l3,
                info,
                in_if: Some(rx.in_if),
                queued: false,
            };
            // Refused before any translation: the packet is as its sender sent it.
            self.icmp_error::<A>(about, IcmpError::PortUnreachable, None, rx.now, sink);
            return;
        }
        let (Some(iface), Some(src), Some(orig)) = (
            self.iface(rx.in_if),
            frame.get(6..12),
            frame.get(rx.l3..rx.l3 + A::facts(info).total_len),
        ) else {
            return;
        };
        let macs = (iface.cfg.mac, MacAddr::from_slice(src));
        sink.emit(rx.in_if, &mut |out| {
            write_tcp_rst::<A>(out, macs, orig, info)
        });
    }

    /// Sends an ICMP error about the packet at `frame[l3..]` back to its source, if allowed
    /// (see [`RouterFamily::may_send_icmp_error`]) and within the rate limit. With `nat`, the
    /// error is first translated back through the packet's connection (see [`ErrorNat`]), so
    /// it reaches the original sender quoting what that sender sent. It is routed like any
    /// packet the router sends; when the way back is the interface the packet came in on, the
    /// packet's own source MAC is the next hop.
    ///
    /// Its source address is the one Linux's `icmp_send` picks: the address of the interface
    /// that leads back to the sender (IPv6: its global address, link-local for a link-local
    /// destination), except for a packet that had waited for its next hop (in Linux it had
    /// passed POSTROUTING) whose source was translated to one of our addresses (masquerade):
    /// that address, as Linux's route back to it is a local one. (Linux would take the
    /// interface towards a foreign SNAT address; tapyard the one towards the sender.)
    #[cold]
    #[inline(never)]
    pub(crate) fn icmp_error<A: RouterFamily>(
        &self,
        about: Offending<'_, A>,
        err: IcmpError,
        nat: Option<&dyn ErrorNat<A>>,
        now: Instant,
        sink: &mut dyn Sink,
    ) {
        let Offending {
            frame,
            l3,
            info,
            in_if,
            queued,
        } = about;
        let group = frame.first().is_some_and(|d| d & 1 == 1);
        let Some(orig) = frame.get(l3..l3 + A::facts(info).total_len) else {
            return;
        };
        if !A::may_send_icmp_error(orig, info, group) {
            return;
        }
        let src = A::facts(info).src;
        let src_ip = (queued && self.local_iface(src).is_some()).then_some(src);
        // Built first (MACs and, when not known yet, the source address filled in below),
        // so that NAT can translate it as it will leave.
        let mut buf = [0u8; ICMP_ERROR_FRAME];
        let Some(len) = write_icmp_error(
            &mut buf,
            (MacAddr::ZERO, MacAddr::ZERO),
            (src_ip.unwrap_or(A::UNSPECIFIED), src),
            A::icmp_head(err),
            orig,
        ) else {
            return;
        };
        let mut dst_ip = src;
        if let Some(nat) = nat {
            let Some(ip) = buf.get_mut(ETH_LEN..len) else {
                return;
            };
            let Ok(mut out) = A::check(ip) else {
                return;
            };
            if !nat.translate_error(ip, &mut out, now) {
                return;
            }
            dst_ip = A::facts(&out).dst;
        }
        // Nobody to tell: an error about a packet the router sent itself.
        if self.local_iface(dst_ip).is_some() {
            return;
        }
        let Some((out_if, nh)) = A::icmp_route(self, dst_ip, in_if) else {
            return;
        };
        if !self.icmp.allow(dst_ip.into(), now) {
            self.counters.icmp_rate_limited.add(1);
            return;
        }
        let Some(egress) = self.iface(out_if) else {
            return;
        };
        let dst_mac = match A::neigh_lookup(self, out_if, nh, now) {
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
        let src_ip = match src_ip {
            Some(s) => s,
            None => match A::src_for(self, out_if, dst_ip) {
                Some(s) => s,
                None => return,
            },
        };
        A::set_icmp_src(ip, src_ip, dst_ip);
        self.counters.icmp_errors.add(1);
        let error = &buf[..len];
        let src_mac = egress.cfg.mac;
        sink.emit(out_if, &mut |out| {
            copy_readdressed(out, error, src_mac, dst_mac)
        });
    }

    /// A packet whose next hop failed to resolve: dropped, counted, and answered with an ICMP
    /// error (translated back through `nat`: it waited after its translation).
    pub(crate) fn neigh_failed<A: RouterFamily>(
        &self,
        frame: &[u8],
        nat: Option<&dyn ErrorNat<A>>,
        now: Instant,
        sink: &mut dyn Sink,
    ) {
        sink.dropped(DropReason::NeighFailed);
        self.counters.neigh_failed.add(1);
        if let Ok(info) = A::check(frame.get(ETH_LEN..).unwrap_or(&[])) {
            // The packet's TTL was already decremented; Linux quotes it that way too.
            let about = Offending {
                frame,
                l3: ETH_LEN,
                info: &info,
                // It waited on its way out: where it came in is not known.
                in_if: None,
                queued: true,
            };
            self.icmp_error::<A>(about, IcmpError::NeighFailed, nat, now, sink);
        }
    }
}
