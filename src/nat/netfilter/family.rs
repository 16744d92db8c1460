//! What the hooks of [`Netfilter`] do differently per address family: the header facts the
//! router hands over, the tuple extraction, the connection table, the rewrite, the rules and
//! the Service lookups of each family. Everything else (tracking, Services, masquerade, SNAT,
//! RELATED errors, `br_netfilter`) is written once in the parent module, generic over
//! [`NatFamily`], and monomorphised per family.

use std::net::{Ipv4Addr, Ipv6Addr};

use super::{
    apply_xlat, tcp_flags, tcp_udp_key, xlat, FlowMemo, Memo, NatRulesOf, Netfilter, Xlat,
};
use crate::conntrack::{CtFamily, CtHit, CtTable};
use crate::conntrack::{Pkt, Track};
use crate::l3::route::RouteAddr;
use crate::l3::router::Hook;
use crate::narrow::len32;
use crate::nat::service::{FrontendKind, ServiceRef, Services};

/// A Service found by one of its LoadBalancer or external IPs, with the frontend's kind.
type ExtHit = (ServiceRef, FrontendKind);
use crate::nat::{self, CsumMode, RewriteFamily};
use crate::stats::DropReason;
use crate::time::Instant;
use crate::wire::ipv4::{self, Ipv4Info};
use crate::wire::ipv6::{self, Ipv6Info};
use crate::wire::tuple::{L4Kind, Tuple, TupleWords};

/// The per-family pieces of the NAT hooks, on the family's address type (`W`: the tuple's
/// words in the connection table).
pub(crate) trait NatFamily<const W: usize>:
    TupleWords<W> + RouteAddr + NatRulesOf + CtFamily<Table = CtTable<Tuple<Self>, W>> + RewriteFamily
{
    /// The checked header facts the router hands over ([`Ipv4Info`], [`Ipv6Info`]).
    type Info;
    /// A translation prepared for one packet tuple.
    type Xlat: Copy;
    /// Whether ICMP messages that are neither echo nor errors pass untracked (IPv6: NDP, MLD,
    /// RS/RA are link-local control traffic, not connections, as Linux's `icmpv6_new`).
    const UNTRACKED_INFO_ICMP: bool;

    /// The header facts of the packet at `l3`, if its header is well-formed.
    fn check(l3: &[u8]) -> Option<Self::Info>;
    /// The datagram's length (header included).
    fn total_len(info: &Self::Info) -> usize;
    /// Whether the packet is a fragment of a bigger datagram (reassembled in front of
    /// conntrack; an IPv6 atomic fragment is not one).
    fn is_fragment(info: &Self::Info) -> bool;
    /// The upper-layer header's offset.
    fn l4_off(info: &Self::Info) -> usize;
    /// The source address.
    fn src(info: &Self::Info) -> Self;
    /// Records translated addresses.
    fn set_addrs(info: &mut Self::Info, src: Self, dst: Self);
    /// The packet's tuple (of an ICMP error: the quoted packet's) and kind.
    fn tuple(ip: &[u8], info: &Self::Info) -> Option<(Tuple<Self>, L4Kind)>;

    /// A hash of a connection's original tuple, for Maglev and port allocation.
    fn flow_hash(t: &Tuple<Self>) -> u64;

    /// Prepares the translation of a packet carrying `from` (of kind `kind`) to `to`.
    fn xlat(from: &Tuple<Self>, kind: L4Kind, to: &Tuple<Self>) -> Self::Xlat;
    /// Applies a prepared translation to the packet it was prepared for.
    fn apply_xlat(ip: &mut [u8], info: &mut Self::Info, x: &Self::Xlat, mode: CsumMode) -> Hook;
    /// The header facts as the rewrites take them ([`RewriteFamily::Hdr`]).
    fn hdr(info: &Self::Info) -> Self::Hdr<'_>;

    /// The worker's memo's verdict on the packet (see `FlowMemo`), `None`: take the full path.
    fn memo_hit(
        nf: &Netfilter,
        ip: &mut [u8],
        info: &mut Self::Info,
        memo: &mut FlowMemo,
        now: Instant,
        mode: CsumMode,
    ) -> Option<Hook>;
    /// Remembers (`keep`) or forgets the connection `hit` found for the packet tuple `t`.
    fn remember(
        memo: &mut FlowMemo,
        t: &Tuple<Self>,
        hit: &CtHit<Tuple<Self>>,
        x: &Self::Xlat,
        keep: bool,
        now: Instant,
    );

    /// The Service whose ClusterIP of the family is `dst:dport`.
    fn by_vip(s: &Services, dst: Self, dport: u16, proto: u8) -> Option<ServiceRef>;
    /// The Service of node port `dport` that has a frontend of the family.
    fn by_node_port(s: &Services, dport: u16, proto: u8) -> Option<ServiceRef>;
    /// The Service one of whose LoadBalancer or external IPs of the family is `dst:dport`.
    fn by_external(s: &Services, dst: Self, dport: u16, proto: u8) -> Option<ExtHit>;
    /// An endpoint of the family for a new connection from `client`.
    fn select(
        s: &Services,
        svc: &ServiceRef,
        client: Self,
        flow: (u64, u64),
        local_only: bool,
        now: Instant,
    ) -> Option<(Self, u16)>;
    /// Whether the Service has endpoints of the family a connection may go to (ready, or
    /// serving and terminating; kube-proxy's `hasEndpoints`).
    fn has_endpoints(svc: &ServiceRef) -> bool;
}

impl NatFamily<2> for Ipv4Addr {
    type Info = Ipv4Info;
    type Xlat = Xlat;
    const UNTRACKED_INFO_ICMP: bool = false;

    #[inline]
    fn check(l3: &[u8]) -> Option<Ipv4Info> {
        ipv4::check_header(l3).ok()
    }
    #[inline(always)]
    fn total_len(info: &Ipv4Info) -> usize {
        info.total_len
    }
    #[inline(always)]
    fn is_fragment(info: &Ipv4Info) -> bool {
        info.is_fragment()
    }
    #[inline(always)]
    fn l4_off(info: &Ipv4Info) -> usize {
        info.hdr_len
    }
    #[inline(always)]
    fn src(info: &Ipv4Info) -> Ipv4Addr {
        info.src
    }
    #[inline(always)]
    fn set_addrs(info: &mut Ipv4Info, src: Ipv4Addr, dst: Ipv4Addr) {
        info.src = src;
        info.dst = dst;
    }
    #[inline(always)]
    fn tuple(ip: &[u8], info: &Ipv4Info) -> Option<(Tuple, L4Kind)> {
        Tuple::from_ipv4(ip, info.hdr_len, info.total_len)
    }

    #[inline]
    fn flow_hash(t: &Tuple) -> u64 {
        let [a, b] = t.to_words();
        let h = (a ^ 0x9e37_79b9_7f4a_7c15).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        (h ^ b ^ (h >> 29)).wrapping_mul(0x94d0_49bb_1331_11eb) ^ (b >> 17)
    }

    #[inline(always)]
    fn xlat(from: &Tuple, kind: L4Kind, to: &Tuple) -> Xlat {
        xlat(from, kind, to)
    }
    #[inline(always)]
    fn apply_xlat(ip: &mut [u8], info: &mut Ipv4Info, x: &Xlat, mode: CsumMode) -> Hook {
        apply_xlat(ip, info, x, mode)
    }
    #[inline(always)]
    fn hdr(info: &Ipv4Info) -> usize {
        info.hdr_len
    }

    /// A TCP or UDP packet of a connection in the worker's memo (see `FlowMemo`): its tuple words
    /// are read straight from the header and compared with the memo's, and on a match the
    /// packet is tracked and translated without a lookup. `None`: not the memo's connection
    /// (or the connection is gone): take the full path.
    #[inline]
    fn memo_hit(
        nf: &Netfilter,
        ip: &mut [u8],
        info: &mut Ipv4Info,
        memo: &mut FlowMemo,
        now: Instant,
        mode: CsumMode,
    ) -> Option<Hook> {
        if memo.slots.is_empty() {
            return None;
        }
        let (key, kind) = tcp_udp_key(ip, info.hdr_len)?;
        let now_us = now.micros();
        let slot = FlowMemo::slot(&key);
        let m = memo.get(slot, &key)?;
        // Trusted only while the connection cannot have expired unseen (see `memo_window_us`).
        if now_us.saturating_sub(m.seen_us) > nf.memo_window_us {
            return None;
        }
        let pkt = Pkt {
            kind,
            tcp_flags: tcp_flags(ip, info.hdr_len, kind),
            len: len32(info.total_len),
        };
        // Tracked against the entry's current control word: a FIN, RST, invalid packet or
        // removal is seen exactly as without the memo.
        Some(
            match nf.conntrack().track_id(m.id, m.dir, m.proto, &pkt, now) {
                Track::Ok(_) => {
                    memo.touch(slot, now_us);
                    apply_xlat(ip, info, &m.xlat, mode)
                }
                Track::Ignored | Track::Related => apply_xlat(ip, info, &m.xlat, mode),
                Track::Closed => {
                    let h = apply_xlat(ip, info, &m.xlat, mode);
                    memo.forget(slot);
                    h
                }
                Track::Invalid(_) if nf.conntrack().config().liberal => {
                    apply_xlat(ip, info, &m.xlat, mode)
                }
                Track::Invalid(_) => Hook::Drop(DropReason::CtInvalid),
                // Removed or closed since: look it up again.
                Track::Reopen | Track::Gone => {
                    memo.forget(slot);
                    return None;
                }
            },
        )
    }

    #[inline(always)]
    fn remember(memo: &mut FlowMemo, t: &Tuple, hit: &CtHit, x: &Xlat, keep: bool, now: Instant) {
        let key = t.to_words();
        if keep {
            memo.put(Memo {
                key,
                id: hit.id,
                dir: hit.dir,
                proto: hit.orig.proto,
                xlat: *x,
                seen_us: now.micros(),
            });
        } else {
            memo.forget(FlowMemo::slot(&key));
        }
    }

    fn by_vip(s: &Services, dst: Ipv4Addr, dport: u16, proto: u8) -> Option<ServiceRef> {
        s.by_vip(dst, dport, proto)
    }
    fn by_node_port(s: &Services, dport: u16, proto: u8) -> Option<ServiceRef> {
        s.by_node_port::<Ipv4Addr>(dport, proto)
    }
    fn by_external(s: &Services, dst: Ipv4Addr, dport: u16, proto: u8) -> Option<ExtHit> {
        s.by_external(dst, dport, proto)
    }
    fn select(
        s: &Services,
        svc: &ServiceRef,
        client: Ipv4Addr,
        (hash, rand): (u64, u64),
        local_only: bool,
        now: Instant,
    ) -> Option<(Ipv4Addr, u16)> {
        let ep = s.select(svc, client, hash, rand, local_only, now)?;
        Some((*ep.ip(), ep.port()))
    }
    fn has_endpoints(svc: &ServiceRef) -> bool {
        svc.has_usable_endpoints::<Ipv4Addr>()
    }
}

/// [`NatFamily::Xlat`] of IPv6: the kind and the tuple to rewrite to (`None`: keep).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Xlat6To(Option<(L4Kind, Tuple<Ipv6Addr>)>);

impl NatFamily<5> for Ipv6Addr {
    type Info = Ipv6Info;
    type Xlat = Xlat6To;
    const UNTRACKED_INFO_ICMP: bool = true;

    #[inline]
    fn check(l3: &[u8]) -> Option<Ipv6Info> {
        ipv6::check(l3).ok()
    }
    #[inline(always)]
    fn total_len(info: &Ipv6Info) -> usize {
        info.total_len()
    }
    #[inline(always)]
    fn is_fragment(info: &Ipv6Info) -> bool {
        info.is_fragment()
    }
    #[inline(always)]
    fn l4_off(info: &Ipv6Info) -> usize {
        info.l4_off
    }
    #[inline(always)]
    fn src(info: &Ipv6Info) -> Ipv6Addr {
        info.src
    }
    #[inline(always)]
    fn set_addrs(info: &mut Ipv6Info, src: Ipv6Addr, dst: Ipv6Addr) {
        info.src = src;
        info.dst = dst;
    }
    #[inline(always)]
    fn tuple(ip: &[u8], info: &Ipv6Info) -> Option<(Tuple<Ipv6Addr>, L4Kind)> {
        Tuple::from_ipv6(ip, info)
    }

    fn flow_hash(t: &Tuple<Ipv6Addr>) -> u64 {
        let h = t.to_words().iter().fold(0x9e37_79b9_7f4a_7c15u64, |h, &w| {
            (h ^ w).wrapping_mul(0xbf58_476d_1ce4_e5b9).rotate_left(29)
        });
        (h ^ (h >> 31)).wrapping_mul(0x94d0_49bb_1331_11eb)
    }

    #[inline]
    fn xlat(from: &Tuple<Ipv6Addr>, kind: L4Kind, to: &Tuple<Ipv6Addr>) -> Xlat6To {
        Xlat6To((to != from).then_some((kind, *to)))
    }
    #[inline]
    fn apply_xlat(ip: &mut [u8], info: &mut Ipv6Info, x: &Xlat6To, mode: CsumMode) -> Hook {
        let Some((kind, to)) = x.0 else {
            return Hook::Accept;
        };
        match nat::rewrite(ip, Self::hdr(info), kind, &to, mode) {
            Ok(()) => {
                <Self as NatFamily<5>>::set_addrs(info, to.src, to.dst);
                Hook::Accept
            }
            Err(e) => Hook::Drop(e.drop_reason()),
        }
    }
    #[inline(always)]
    fn hdr(info: &Ipv6Info) -> &Ipv6Info {
        info
    }

    #[inline(always)]
    fn memo_hit(
        _: &Netfilter,
        _: &mut [u8],
        _: &mut Ipv6Info,
        _: &mut FlowMemo,
        _: Instant,
        _: CsumMode,
    ) -> Option<Hook> {
        None
    }
    #[inline(always)]
    fn remember(
        _: &mut FlowMemo,
        _: &Tuple<Ipv6Addr>,
        _: &CtHit<Tuple<Ipv6Addr>>,
        _: &Xlat6To,
        _: bool,
        _: Instant,
    ) {
    }

    fn by_vip(s: &Services, dst: Ipv6Addr, dport: u16, proto: u8) -> Option<ServiceRef> {
        s.by_vip(dst, dport, proto)
    }
    fn by_node_port(s: &Services, dport: u16, proto: u8) -> Option<ServiceRef> {
        s.by_node_port::<Ipv6Addr>(dport, proto)
    }
    fn by_external(s: &Services, dst: Ipv6Addr, dport: u16, proto: u8) -> Option<ExtHit> {
        s.by_external(dst, dport, proto)
    }
    fn select(
        s: &Services,
        svc: &ServiceRef,
        client: Ipv6Addr,
        (hash, rand): (u64, u64),
        local_only: bool,
        now: Instant,
    ) -> Option<(Ipv6Addr, u16)> {
        let ep = s.select(svc, client, hash, rand, local_only, now)?;
        Some((*ep.ip(), ep.port()))
    }
    fn has_endpoints(svc: &ServiceRef) -> bool {
        svc.has_usable_endpoints::<Ipv6Addr>()
    }
}
