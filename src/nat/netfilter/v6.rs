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
//! * bridged IPv6 frames of a NAT'd connection (`Netfilter::bridged`, `br_netfilter`).
//!
//! * a new connection to a Service's IPv6 ClusterIP, or to a node port on one of the node's
//!   IPv6 addresses (Services with an IPv6 ClusterIP only, as kube-proxy's ip6tables), is
//!   DNAT'd to an IPv6 endpoint, or rejected (TCP RST / ICMPv6 port unreachable, answered by
//!   the router) without one; masqueraded to the egress interface's global IPv6 address on
//!   the same marks as IPv4 (outside [`super::NatRules::cluster_cidr6`], NodePort with
//!   policy Cluster, hairpin) or by a [`super::MasqueradeRule<Ipv6Addr>`], else source-NAT'd to a
//!   fixed address by a [`super::SnatRule<Ipv6Addr>`], with a free source port from the IPv6 table
//!   ([`crate::nat::alloc_source`]).
//!
//! The IPv6 table is made with the engine ([`Netfilter::new`], with
//! [`super::NatConfig::conntrack6`] or else the IPv4 table's settings), beside the IPv4 one in
//! a file when that is kept in a file (`DatapathBuilder::conntrack_file`: `<path>6`). An
//! engine made on a caller's IPv4 table alone ([`Netfilter::with_conntrack`]) makes it on
//! first use unless one is installed with [`Netfilter::set_conntrack6`].

use std::sync::OnceLock;

use super::Netfilter;
use crate::conntrack::Conntrack6;

/// The IPv6 table of a [`Netfilter`], made on first use.
#[derive(Debug, Default)]
pub(super) struct Ct6(OnceLock<Conntrack6>);

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
}

#[cfg(test)]
mod tests {
    use std::net::Ipv6Addr;

    use etherparse::{Icmpv6Type, PacketBuilder};

    use super::super::{NatCtx, Routing};
    use super::*;
    use crate::buf::PacketBuf;
    use crate::conntrack::{tcp::flags, CtTag, Pkt};
    use crate::l3::router::{ErrorNat, Hook};
    use crate::nat::NatConfig;
    use crate::stats::DropReason;
    use crate::time::Instant;
    use crate::wire::ipv6;
    use crate::wire::tuple::{L4Kind, Tuple};

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
    impl Routing<Ipv6Addr> for NoRoutes {
        fn is_local(&self, _: Ipv6Addr) -> bool {
            false
        }
        fn egress(&self, _: Ipv6Addr) -> Option<(crate::IfaceId, Option<Ipv6Addr>)> {
            None
        }
    }

    fn run(nf: &Netfilter, frame: &[u8], now: Instant) -> (Hook, Vec<u8>) {
        let mut b = PacketBuf::from_frame(frame);
        let mut info = ipv6::check(&frame[14..]).unwrap();
        let mut cx = NatCtx::new(1);
        let h = nf.prerouting(&NoRoutes, &mut b, 14, &mut info, &mut cx, now);
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
        assert!(matches!(
            nf.bridged::<Ipv6Addr, 5>(&mut b, 14, now),
            Hook::Accept
        ));
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
        let (h, _) = (nf.bridged::<Ipv6Addr, 5>(&mut b, 14, now), ());
        assert!(matches!(h, Hook::Accept));
        assert_eq!(b.frame(), &tcp_frame(&ep, true)[..]);
        let mut other = PacketBuf::from_frame(&tcp_frame(&Tuple { sport: 9, ..c }, false));
        assert!(matches!(
            nf.bridged::<Ipv6Addr, 5>(&mut other, 14, now),
            Hook::Accept
        ));
    }
}
