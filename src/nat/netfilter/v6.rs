//! IPv6 in the NAT engine: the IPv6 connection table ([`Conntrack6`]) and the hooks the
//! router calls for IPv6 packets, as `ip6tables`' conntrack and NAT tables.
//!
//! What is done (same rules as IPv4, see the [module docs](super)):
//!
//! * every IPv6 TCP, UDP and ICMPv6 echo packet through the router is tracked in the IPv6
//!   table (INVALID ones dropped, as the IPv4 path, unless `liberal`); other ICMPv6 (NDP, MLD,
//!   RS/RA) passes untracked;
//! * a packet of a connection whose entry translates (DNAT or SNAT: reply tuple other than the
//!   inverse of the original) is translated with [`crate::nat::rewrite6`] (pseudo-header
//!   checksums, full or virtio-partial);
//! * an ICMPv6 error (types below 128, as Linux's `icmpv6_error`) quoting a tracked
//!   connection is RELATED and translated inner header and all
//!   ([`crate::nat::rewrite_icmp_error6`]), both when it crosses the router and when the
//!   router makes it (`ErrorNat::translate_error6`);
//! * bridged IPv6 frames of a NAT'd connection ([`Netfilter::bridged6`], `br_netfilter`).
//!
//! * a new connection to a Service's IPv6 ClusterIP, or to a node port on one of the node's
//!   IPv6 addresses (Services with an IPv6 ClusterIP only, as kube-proxy's ip6tables), is
//!   DNAT'd to an IPv6 endpoint, or rejected (TCP RST / ICMPv6 port unreachable, answered by
//!   the router) without one; masqueraded to the egress interface's global IPv6 address on
//!   the same marks as IPv4 (outside [`super::NatRules::cluster_cidr6`], NodePort with
//!   policy Cluster, hairpin) or by a [`super::MasqueradeRule6`], else source-NAT'd to a
//!   fixed address by a [`super::SnatRule6`], with a free source port from the IPv6 table
//!   ([`crate::nat::alloc_source`]).
//!
//! The IPv6 table is made with the engine ([`Netfilter::new`], with
//! [`super::NatConfig::conntrack6`] or else the IPv4 table's settings), beside the IPv4 one in
//! a file when that is kept in a file (`DatapathBuilder::conntrack_file`: `<path>6`). An
//! engine made on a caller's IPv4 table alone ([`Netfilter::with_conntrack`]) makes it on
//! first use unless one is installed with [`Netfilter::set_conntrack6`].

use std::net::Ipv6Addr;
use std::sync::OnceLock;

use super::{csum_mode, NatCtx, Netfilter, Routing6};
use crate::buf::PacketBuf;
use crate::conntrack::CtTag;
use crate::conntrack::{Conntrack6, CtHit, Dir, InsertError, Pkt, Track};
#[cfg(test)]
use crate::l3::router::ErrorNat;
use crate::l3::router::Hook;
use crate::narrow::len32;
use crate::narrow::low32;
use crate::nat::PortRange;
use crate::nat::{self, CsumMode};
use crate::stats::DropReason;
use crate::time::Instant;
use crate::wire::ipv4::PROTO_TCP;
use crate::wire::ipv6::{self, Ipv6Info};
use crate::wire::tcp::TcpPacket;
use crate::wire::tuple::{L4Kind, Tuple, PROTO_ICMPV6};

/// The IPv6 table of a [`Netfilter`], made on first use.
#[derive(Debug, Default)]
pub(super) struct Ct6(OnceLock<Conntrack6>);

/// The translation for a packet travelling in `hit.dir`: the tuple it must carry after NAT.
#[inline]
fn target6(hit: &CtHit<Tuple<Ipv6Addr>>) -> Tuple<Ipv6Addr> {
    match hit.dir {
        Dir::Original => hit.reply.invert(),
        Dir::Reply => hit.orig.invert(),
    }
}

#[inline]
fn is_natted6(hit: &CtHit<Tuple<Ipv6Addr>>) -> bool {
    hit.orig.invert() != hit.reply
}

/// A flow hash of an IPv6 tuple (Maglev's key, the port search's start).
fn flow_hash6(t: &Tuple<Ipv6Addr>) -> u64 {
    let h = t.to_words().iter().fold(0x9e37_79b9_7f4a_7c15u64, |h, &w| {
        (h ^ w).wrapping_mul(0xbf58_476d_1ce4_e5b9).rotate_left(29)
    });
    (h ^ (h >> 31)).wrapping_mul(0x94d0_49bb_1331_11eb)
}

/// The TCP flags of the segment at `info.l4_off` (0 for other kinds or a short segment).
fn tcp_flags6(ip: &[u8], info: &Ipv6Info, kind: L4Kind) -> u8 {
    match kind {
        L4Kind::Tcp => ip
            .get(info.l4_off..)
            .and_then(|s| TcpPacket::new_checked(s).ok())
            .map_or(0, |t| t.flags()),
        _ => 0,
    }
}

impl Netfilter {
    /// The IPv6 connection table (made now, with the IPv4 table's configuration, if no IPv6
    /// packet made it yet): lookups, `conntrack -L -f ipv6` dumps, flushes.
    pub fn conntrack6(&self) -> &Conntrack6 {
        self.ct6.0.get_or_init(|| {
            let mut cfg = *self.ct.config();
            cfg.max_entries = cfg.max_entries.max(1);
            // The IPv4 table's configuration was validated when it was made.
            Conntrack6::new(cfg).unwrap_or_else(|_| {
                Conntrack6::new(crate::conntrack::CtConfig::default())
                    .expect("the default configuration is valid")
            })
        })
    }

    /// Installs the IPv6 table (e.g. one kept in a file, [`Conntrack6::open_file`]). Returns
    /// it back if the engine already has one (made by [`Netfilter::conntrack6`] or an IPv6
    /// packet): install it before traffic flows.
    pub fn set_conntrack6(&self, ct: Conntrack6) -> Result<(), Box<Conntrack6>> {
        self.ct6.0.set(ct).map_err(Box::new)
    }

    /// Whether the IPv6 table exists yet (without making it).
    pub(super) fn ct6_if_made(&self) -> Option<&Conntrack6> {
        self.ct6.0.get()
    }

    /// The PREROUTING hook for the IPv6 packet at offset `l3` of `b`, checked into `info` by
    /// [`crate::wire::ipv6::check`] (updated when the packet is translated): tracks it,
    /// translates packets of NAT'd connections and RELATED ICMPv6 errors. See the [module
    /// docs](self) for what new connections get.
    pub(crate) fn prerouting6(
        &self,
        routing: &impl Routing6,
        b: &mut PacketBuf,
        l3: usize,
        info: &mut Ipv6Info,
        cx: &mut NatCtx,
        now: Instant,
    ) -> Hook {
        let mode = csum_mode(b);
        let end = l3 + info.total_len();
        let Some(ip) = b.frame_mut().get_mut(l3..end) else {
            return Hook::Drop(DropReason::Truncated);
        };
        let Some((t, kind)) = Tuple::from_ipv6(ip, info) else {
            self.counters.untracked.add(1);
            return Hook::Accept;
        };
        if t.proto == PROTO_ICMPV6 && kind == L4Kind::Other {
            // NDP, MLD, router solicitations and advertisements and other informational
            // ICMPv6: link-local control traffic, not connections (Linux's `icmpv6_new`
            // refuses to create entries for them); never dropped as INVALID here.
            self.counters.untracked.add(1);
            return Hook::Accept;
        }
        let ct = self.conntrack6();
        if let L4Kind::IcmpError { inner_l3 } = kind {
            let inner = usize::from(inner_l3);
            return self.related6(
                ip,
                info,
                t,
                inner,
                mode,
                now,
                Hook::Drop(DropReason::CtInvalid),
            );
        }
        let pkt = Pkt {
            kind,
            tcp_flags: tcp_flags6(ip, info, kind),
            len: len32(info.total_len()),
        };
        if let Some(hit) = ct.lookup(&t, now) {
            match ct.track(&hit, &pkt, now) {
                Track::Ok(_) | Track::Ignored | Track::Related | Track::Closed => {}
                Track::Invalid(_) if ct.config().liberal => {}
                Track::Invalid(_) => return Hook::Drop(DropReason::CtInvalid),
                Track::Reopen | Track::Gone => {
                    return self.new_connection6(routing, ip, info, t, kind, &pkt, cx, now, mode)
                }
            }
            return self.apply6(ip, info, &t, kind, &hit, mode);
        }
        self.new_connection6(routing, ip, info, t, kind, &pkt, cx, now, mode)
    }

    /// Translates a packet of a known connection (a no-op for one that is not NAT'd).
    fn apply6(
        &self,
        ip: &mut [u8],
        info: &mut Ipv6Info,
        from: &Tuple<Ipv6Addr>,
        kind: L4Kind,
        hit: &CtHit<Tuple<Ipv6Addr>>,
        mode: CsumMode,
    ) -> Hook {
        if !is_natted6(hit) {
            return Hook::Accept;
        }
        let to = target6(hit);
        if to == *from {
            return Hook::Accept;
        }
        match nat::rewrite6(ip, info, kind, &to, mode) {
            Ok(()) => {
                info.src = to.src;
                info.dst = to.dst;
                Hook::Accept
            }
            Err(e) => Hook::Drop(e.drop_reason()),
        }
    }

    /// The first packet of an IPv6 connection, as the IPv4 path's `new_connection`: a
    /// Service's ClusterIP (or a node port on one of the node's IPv6 addresses) is DNAT'd to
    /// an IPv6 endpoint (REJECT without one), the new destination routed, masqueraded to the
    /// egress interface's global IPv6 address when marked (from outside `cluster_cidr6`,
    /// NodePort with policy Cluster, hairpin) or when a [`super::MasqueradeRule6`] matches,
    /// a free source port taken from the IPv6 table, and the entry inserted.
    #[allow(clippy::too_many_arguments)]
    fn new_connection6(
        &self,
        routing: &impl Routing6,
        ip: &mut [u8],
        info: &mut Ipv6Info,
        t: Tuple<Ipv6Addr>,
        kind: L4Kind,
        pkt: &Pkt,
        cx: &mut NatCtx,
        now: Instant,
        mode: CsumMode,
    ) -> Hook {
        let ct = self.conntrack6();
        let rules = self.rules.load();
        let outside = |a| rules.cluster_cidr6.is_some_and(|c| !c.contains(a));
        let hash = flow_hash6(&t);
        let mut tag = CtTag::default();
        let mut masq = false;
        let mut after = t;
        let mut hairpin = false;
        if matches!(kind, L4Kind::Tcp | L4Kind::Udp) {
            let (svc, node_port) = match self.services.by_vip6(t.dst, t.dport, t.proto) {
                Some(s) => (Some(s), false),
                None if routing.is_local6(t.dst) => {
                    (self.services.by_node_port6(t.dport, t.proto), true)
                }
                None => (None, false),
            };
            if let Some(svc) = svc {
                let from_pod = rules.cluster_cidr6.is_some_and(|c| c.contains(t.src));
                let local_only = node_port && svc.spec().external_local && !from_pod;
                let r = cx.rng.next_u64();
                let Some(ep) = self.services.select6(&svc, t.src, hash, r, local_only, now) else {
                    self.counters.rejected.add(1);
                    return if local_only && !svc.endpoints6().is_empty() {
                        Hook::Drop(DropReason::NoEndpoint)
                    } else {
                        Hook::Reject {
                            tcp: t.proto == PROTO_TCP,
                        }
                    };
                };
                after.dst = *ep.ip();
                after.dport = ep.port();
                tag.service = svc.id().get();
                // The endpoint tag is 32 bits: the low word of the IPv6 address.
                tag.endpoint = low32(u64::from_be_bytes(
                    ep.ip().octets()[8..].try_into().unwrap_or_default(),
                ));
                hairpin = after.dst == t.src;
                masq = if node_port {
                    !svc.spec().external_local
                } else {
                    outside(t.src)
                } || hairpin;
            }
        }
        let mut snat: Option<(Ipv6Addr, Option<PortRange>)> = None;
        if let Some((out, addr)) = routing.egress6(after.dst) {
            let rule = || {
                rules.masquerade6.iter().any(|r| {
                    r.out == out
                        && r.src.is_none_or(|p| p.contains(t.src))
                        && r.except_dst.is_none_or(|p| !p.contains(after.dst))
                })
            };
            if masq || rule() {
                // MASQUERADE on an interface without a global address: Linux drops the
                // packet (no source address to take); so do we.
                match addr {
                    Some(a) => snat = Some((a, rules.masquerade_ports)),
                    None => return Hook::Drop(DropReason::NatExhausted),
                }
            } else if let Some(r) = rules
                .snat6
                .iter()
                .find(|r| r.out.is_none_or(|o| o == out) && r.src.contains(t.src))
            {
                snat = Some((r.to, r.ports));
            }
        }
        let fin = match snat {
            None => after,
            Some((addr, ports)) => {
                let range = ports.unwrap_or_else(|| PortRange::linux_default(after.sport));
                let in_use = |c: &Tuple<Ipv6Addr>| ct.tuple_in_use(c, now);
                let chosen = if rules.random_fully {
                    nat::alloc_source_random_fully(&after, addr, range, hash, in_use)
                } else {
                    nat::alloc_source(&after, addr, range, hash, in_use)
                };
                match chosen {
                    Some(c) => c,
                    None => return Hook::Drop(DropReason::NatExhausted),
                }
            }
        };
        let hit = match ct.insert(t, fin.invert(), tag, pkt, now) {
            Ok(h) => h,
            Err(InsertError::Clash { existing: Some(h) }) => {
                let _ = ct.track(&h, pkt, now);
                return self.apply6(ip, info, &t, kind, &h, mode);
            }
            Err(InsertError::Clash { existing: None }) => {
                return Hook::Drop(DropReason::NatExhausted)
            }
            Err(InsertError::Full) => return Hook::Drop(DropReason::CtFull),
            Err(InsertError::Invalid(_)) if ct.config().liberal => return Hook::Accept,
            Err(InsertError::Invalid(_)) => return Hook::Drop(DropReason::CtInvalid),
        };
        let c = &self.counters;
        c.new.add(1);
        if after != t {
            c.dnat.add(1);
        }
        if fin.src != t.src || fin.sport != t.sport {
            c.snat.add(1);
        }
        if hairpin {
            c.hairpin.add(1);
        }
        self.apply6(ip, info, &t, kind, &hit, mode)
    }

    /// An ICMPv6 error quoting a packet with tuple `q`: RELATED to its connection (translated
    /// back through it when NAT'd); `on_miss` when there is none.
    #[allow(clippy::too_many_arguments)]
    fn related6(
        &self,
        ip: &mut [u8],
        info: &mut Ipv6Info,
        q: Tuple<Ipv6Addr>,
        inner_l3: usize,
        mode: CsumMode,
        now: Instant,
        on_miss: Hook,
    ) -> Hook {
        let Some(ct) = self.ct6_if_made() else {
            return on_miss;
        };
        let Some(hit) = ct.lookup(&q.invert(), now) else {
            return on_miss;
        };
        self.counters.related.add(1);
        if !is_natted6(&hit) {
            return Hook::Accept;
        }
        let (this_dir, quoted_was) = match hit.dir {
            Dir::Reply => (hit.reply, hit.orig),
            Dir::Original => (hit.orig, hit.reply),
        };
        let t = target6(&hit);
        // As IPv4: the outer destination becomes the original sender; the outer source
        // changes only when it is the connection's own peer.
        let outer_src = if info.src == this_dir.src {
            t.src
        } else {
            info.src
        };
        let outer_dst = t.dst;
        match nat::rewrite_icmp_error6(ip, info, inner_l3, &quoted_was, outer_src, outer_dst, mode)
        {
            Ok(()) => {
                info.src = outer_src;
                info.dst = outer_dst;
                Hook::Accept
            }
            Err(_) => Hook::Drop(DropReason::NatUntranslatable),
        }
    }

    /// The hook for an IPv6 frame switched between two ports of one bridge (`br_netfilter`):
    /// a packet of a NAT'd connection the router tracks is tracked and translated; anything
    /// else passes untouched. `l3` is the IPv6 header's offset.
    pub(crate) fn bridged6(&self, b: &mut PacketBuf, l3: usize, now: Instant) -> Hook {
        let Some(ct) = self.ct6_if_made().filter(|c| !c.is_empty()) else {
            return Hook::Accept;
        };
        let mode = csum_mode(b);
        let Ok(mut info) = ipv6::check(b.frame().get(l3..).unwrap_or(&[])) else {
            return Hook::Accept;
        };
        let end = l3 + info.total_len();
        let Some(ip) = b.frame_mut().get_mut(l3..end) else {
            return Hook::Accept;
        };
        let Some((t, kind)) = Tuple::from_ipv6(ip, &info) else {
            return Hook::Accept;
        };
        if let L4Kind::IcmpError { inner_l3 } = kind {
            let inner = usize::from(inner_l3);
            return self.related6(ip, &mut info, t, inner, mode, now, Hook::Accept);
        }
        let Some(hit) = ct.lookup(&t, now) else {
            return Hook::Accept;
        };
        let pkt = Pkt {
            kind,
            tcp_flags: tcp_flags6(ip, &info, kind),
            len: len32(info.total_len()),
        };
        match ct.track(&hit, &pkt, now) {
            Track::Invalid(_) if !ct.config().liberal => Hook::Drop(DropReason::CtInvalid),
            _ => self.apply6(ip, &mut info, &t, kind, &hit, mode),
        }
    }

    /// `ErrorNat::translate_error6`: an ICMPv6 error the router makes about a packet of a
    /// NAT'd connection goes to the original sender, quoting what it sent.
    fn translate_error6_impl(&self, ip: &mut [u8], info: &mut Ipv6Info, now: Instant) -> bool {
        let Some((q, L4Kind::IcmpError { inner_l3 })) = Tuple::from_ipv6(ip, info) else {
            return true;
        };
        let inner = usize::from(inner_l3);
        matches!(
            self.related6(ip, info, q, inner, CsumMode::Full, now, Hook::Accept),
            Hook::Accept
        )
    }
}

/// Exposed to the ErrorNat impl in the parent module.
pub(super) fn translate_error6(
    nf: &Netfilter,
    ip: &mut [u8],
    info: &mut Ipv6Info,
    now: Instant,
) -> bool {
    nf.translate_error6_impl(ip, info, now)
}

#[cfg(test)]
mod tests {
    use std::net::Ipv6Addr;

    use etherparse::{Icmpv6Type, PacketBuilder};

    use super::*;
    use crate::conntrack::{tcp::flags, CtTag};
    use crate::nat::NatConfig;

    fn a6(s: &str) -> Ipv6Addr {
        s.parse().unwrap()
    }

    fn nf() -> Netfilter {
        Netfilter::new(NatConfig {
            conntrack: crate::conntrack::CtConfig {
                max_entries: 1024,
                ..Default::default()
            },
            ..NatConfig::default()
        })
        .unwrap()
    }

    /// An Ethernet frame (14 bytes, never read) around a TCP segment of tuple `t`.
    fn tcp_frame(t: &Tuple<Ipv6Addr>, syn: bool) -> Vec<u8> {
        let mut v = Vec::new();
        let b = PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
            .ipv6(t.src.octets(), t.dst.octets(), 64)
            .tcp(t.sport, t.dport, 1000, 64240);
        if syn { b.syn() } else { b.ack(2000) }
            .write(&mut v, b"data")
            .unwrap();
        v
    }

    fn ptb_frame(router: Ipv6Addr, to: Ipv6Addr, quote: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
            .ipv6(router.octets(), to.octets(), 64)
            .icmpv6(Icmpv6Type::PacketTooBig { mtu: 1400 })
            .write(&mut v, quote)
            .unwrap();
        v
    }

    /// No local address, no route: what the hook sees of a router without IPv6 routes.
    struct NoRoutes;
    impl Routing6 for NoRoutes {
        fn is_local6(&self, _: Ipv6Addr) -> bool {
            false
        }
        fn egress6(&self, _: Ipv6Addr) -> Option<(crate::IfaceId, Option<Ipv6Addr>)> {
            None
        }
    }

    fn run(nf: &Netfilter, frame: &[u8], now: Instant) -> (Hook, Vec<u8>) {
        let mut b = PacketBuf::from_frame(frame);
        let mut info = ipv6::check(&frame[14..]).unwrap();
        let mut cx = NatCtx::new(1);
        let h = nf.prerouting6(&NoRoutes, &mut b, 14, &mut info, &mut cx, now);
        (h, b.frame().to_vec())
    }

    fn client() -> Tuple<Ipv6Addr> {
        Tuple {
            src: a6("fd00:10:244:1::2"),
            dst: a6("fd00:10:96::10"),
            sport: 40000,
            dport: 80,
            proto: 6,
            zone: 0,
        }
    }

    #[test]
    fn ipv6_connections_are_tracked_and_invalid_packets_dropped() {
        let nf = nf();
        let now = Instant::from_secs(1);
        let t = Tuple {
            dst: a6("fd00:10:244:2::7"),
            ..client()
        };
        let (h, out) = run(&nf, &tcp_frame(&t, true), now);
        assert!(matches!(h, Hook::Accept));
        assert_eq!(out, tcp_frame(&t, true), "not NAT'd: untouched");
        let d = nf.conntrack6().dump(now);
        assert_eq!((d.len(), d[0].orig, d[0].protocol), (1, t, "tcp"));
        // Neighbour discovery is not a connection: accepted untracked.
        let mut ns = Vec::new();
        PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
            .ipv6(a6("fe80::1").octets(), a6("ff02::1:ff00:2").octets(), 255)
            .icmpv6(Icmpv6Type::NeighborSolicitation)
            .write(&mut ns, &[0; 16])
            .unwrap();
        assert!(matches!(run(&nf, &ns, now).0, Hook::Accept));
        assert_eq!(nf.conntrack6().len(), 1);
        // An ACK of no connection is INVALID (not liberal), as in IPv4.
        let other = Tuple { sport: 40001, ..t };
        assert!(matches!(
            run(&nf, &tcp_frame(&other, false), now).0,
            Hook::Drop(DropReason::CtInvalid)
        ));
    }

    #[test]
    fn a_dnat_connection_is_translated_both_ways_and_its_packet_too_big_goes_back_translated() {
        let nf = nf();
        let now = Instant::from_secs(1);
        let c = client();
        let ep = Tuple {
            dst: a6("fd00:10:244:2::7"),
            dport: 8080,
            ..c
        };
        // The entry a Service's DNAT makes: reply from the endpoint.
        nf.conntrack6()
            .insert(
                c,
                ep.invert(),
                CtTag::default(),
                &Pkt {
                    kind: L4Kind::Tcp,
                    tcp_flags: flags::SYN,
                    len: 60,
                },
                Instant::from_millis(500),
            )
            .unwrap();
        // The client's SYN (again) goes to the endpoint; checksums as a fresh packet's.
        let (h, out) = run(&nf, &tcp_frame(&c, true), now);
        assert!(matches!(h, Hook::Accept), "{h:?}");
        assert_eq!(out, tcp_frame(&ep, true));
        // The endpoint's answer comes back from the ClusterIP.
        let (h, out) = run(&nf, &tcp_frame(&ep.invert(), true), now);
        assert!(matches!(h, Hook::Accept), "{h:?}");
        // A SYN-ACK: the builder's flags differ, so compare the addresses and ports.
        let back = tcp_frame(&c.invert(), true);
        assert_eq!(&out[14 + 8..14 + 44], &back[14 + 8..14 + 44]);
        // A router on the way to the endpoint says the client's segment was too big: the
        // client gets it about the packet it sent (to the ClusterIP), checksums right.
        let router = a6("fd00:172:18::1");
        let seg = &tcp_frame(&ep, true)[14..];
        let (h, out) = run(&nf, &ptb_frame(router, c.src, seg), now);
        assert!(matches!(h, Hook::Accept));
        assert_eq!(out, ptb_frame(router, c.src, &tcp_frame(&c, true)[14..]));
        assert_eq!(nf.counters().related, 1);
        // The router's own error about it (translate_error6) is translated the same way.
        let mut own = ptb_frame(router, c.src, seg)[14..].to_vec();
        let mut info = ipv6::check(&own).unwrap();
        assert!(ErrorNat::translate_error6(&nf, &mut own, &mut info, now));
        assert_eq!(
            own,
            ptb_frame(router, c.src, &tcp_frame(&c, true)[14..])[14..]
        );
        // An error about nothing tracked is INVALID at PREROUTING.
        let stray = Tuple { sport: 1, ..ep };
        let (h, _) = run(
            &nf,
            &ptb_frame(router, c.src, &tcp_frame(&stray, false)[14..]),
            now,
        );
        assert!(matches!(h, Hook::Drop(DropReason::CtInvalid)));
    }

    #[test]
    fn bridged_ipv6_of_a_nat_connection_is_translated_and_other_frames_pass() {
        let nf = nf();
        let now = Instant::from_secs(1);
        let c = client();
        let ep = Tuple {
            dst: a6("fd00:10:244:1::7"),
            dport: 8080,
            ..c
        };
        let mut b = PacketBuf::from_frame(&tcp_frame(&c, true));
        // No IPv6 table yet: nothing to do, and none is made.
        assert!(matches!(nf.bridged6(&mut b, 14, now), Hook::Accept));
        nf.conntrack6()
            .insert(
                c,
                ep.invert(),
                CtTag::default(),
                &Pkt {
                    kind: L4Kind::Tcp,
                    tcp_flags: flags::SYN,
                    len: 60,
                },
                now,
            )
            .unwrap();
        let (h, _) = (nf.bridged6(&mut b, 14, now), ());
        assert!(matches!(h, Hook::Accept));
        assert_eq!(b.frame(), &tcp_frame(&ep, true)[..]);
        let mut other = PacketBuf::from_frame(&tcp_frame(&Tuple { sport: 9, ..c }, false));
        assert!(matches!(nf.bridged6(&mut other, 14, now), Hook::Accept));
    }
}
