//! IPv6 through the NAT engine's hooks: tracking, DNAT both ways, RELATED errors (crossing the
//! router and made by it), bridged frames.

use std::net::Ipv6Addr;

use etherparse::{Icmpv6Type, PacketBuilder};

use super::{Bridged, NatCtx, Netfilter, Routing};
use crate::buf::PacketBuf;
use crate::conntrack::{tcp::flags, CtTag, Pkt};
use crate::l3::router::{ErrorNat, Hook};
use crate::nat::NatConfig;
use crate::stats::DropReason;
use crate::time::Instant;
use crate::wire::ipv6;
use crate::wire::tuple::{L4Kind, Tuple};

fn addr(s: &str) -> Ipv6Addr {
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
        src: addr("fd00:10:244:1::2"),
        dst: addr("fd00:10:96::10"),
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
        dst: addr("fd00:10:244:2::7"),
        ..client()
    };
    let (h, out) = run(&nf, &tcp_frame(&t, true), now);
    assert!(matches!(h, Hook::Accept));
    assert_eq!(out, tcp_frame(&t, true), "not NAT'd: untouched");
    let d = nf.conntrack_of::<Ipv6Addr>().dump(now);
    assert_eq!((d.len(), d[0].orig, d[0].protocol), (1, t, "tcp"));
    // Neighbour discovery is not a connection: accepted untracked.
    let mut ns = Vec::new();
    PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
        .ipv6(
            addr("fe80::1").octets(),
            addr("ff02::1:ff00:2").octets(),
            255,
        )
        .icmpv6(Icmpv6Type::NeighborSolicitation)
        .write(&mut ns, &[0; 16])
        .unwrap();
    assert!(matches!(run(&nf, &ns, now).0, Hook::Accept));
    assert_eq!(nf.conntrack_of::<Ipv6Addr>().len(), 1);
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
        dst: addr("fd00:10:244:2::7"),
        dport: 8080,
        ..c
    };
    // The entry a Service's DNAT makes: reply from the endpoint.
    nf.conntrack_of::<Ipv6Addr>()
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
    let router = addr("fd00:172:18::1");
    let seg = &tcp_frame(&ep, true)[14..];
    let (h, out) = run(&nf, &ptb_frame(router, c.src, seg), now);
    assert!(matches!(h, Hook::Accept));
    assert_eq!(out, ptb_frame(router, c.src, &tcp_frame(&c, true)[14..]));
    assert_eq!(nf.counters().related, 1);
    // The router's own error about it (translate_error) is translated the same way.
    let mut own = ptb_frame(router, c.src, seg)[14..].to_vec();
    let mut info = ipv6::check(&own).unwrap();
    assert!(ErrorNat::<Ipv6Addr>::translate_error(
        &nf, &mut own, &mut info, now
    ));
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
        dst: addr("fd00:10:244:1::7"),
        dport: 8080,
        ..c
    };
    let mut b = PacketBuf::from_frame(&tcp_frame(&c, true));
    // No IPv6 table yet: nothing to do, and none is made.
    assert!(matches!(
        nf.bridged::<Ipv6Addr, 5>(&mut b, 14, now),
        Bridged::Accept
    ));
    nf.conntrack_of::<Ipv6Addr>()
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
    assert!(matches!(h, Bridged::Accept));
    assert_eq!(b.frame(), &tcp_frame(&ep, true)[..]);
    let mut other = PacketBuf::from_frame(&tcp_frame(&Tuple { sport: 9, ..c }, false));
    assert!(matches!(
        nf.bridged::<Ipv6Addr, 5>(&mut other, 14, now),
        Bridged::Accept
    ));
}
