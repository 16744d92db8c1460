//! The IPv6 router without root: frames go into a datapath with two bridges (pods on cni0,
//! gateway fd00:10:244:1::1/64 with Router Advertisements; pod C on cni1, gateway
//! fd00:10:244:2::1/64) and an uplink (eth0, fd00:172:18::2/64, MTU 1400), and what comes out
//! is checked as a Linux router would behave (`ip6_forward`, `ndisc_*`).

use crate::common;

use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use etherparse::{Icmpv6Type, PacketBuilder, SlicedPacket, TransportSlice};
use tapyard::l3::neigh::{NeighEntry, NeighState};
use tapyard::l3::{IfaceConfig, IfaceId, NextHop, RaConfig, Route, RouteProto};
use tapyard::wire::icmpv6::{Echo, Icmpv6Packet, Icmpv6Repr, NaFlags};
use tapyard::wire::ipv6;
use tapyard::{BridgeConfig, Datapath, DropReason, Instant, MacAddr, PortId, Verdict};
use tapyard_testkit::frame::ip6 as a;
use tapyard_testkit::{send, tick, Node};

const GW0_MAC: MacAddr = MacAddr([0x02, 0xaa, 0, 0, 0, 1]);
const GW1_MAC: MacAddr = MacAddr([0x02, 0xaa, 0, 0, 0, 3]);
const UP_MAC: MacAddr = MacAddr([0x02, 0xaa, 0, 0, 0, 2]);
const POD_A: MacAddr = MacAddr([0x02, 0, 0, 0, 1, 2]);
const POD_C: MacAddr = MacAddr([0x02, 0, 0, 0, 2, 2]);
const PA: PortId = PortId(0);
const PB: PortId = PortId(1);
const PC: PortId = PortId(3);
const ETH0: PortId = PortId(5);

fn node() -> Node {
    let mut b = Datapath::builder();
    let br0 = b.add_bridge(BridgeConfig::new("cni0")).unwrap();
    let br1 = b.add_bridge(BridgeConfig::new("cni1")).unwrap();
    let pa = b.add_port("pod-a", Some(br0)).unwrap();
    let pb = b.add_port("pod-b", Some(br0)).unwrap();
    let mut c0 = IfaceConfig::new("cni0", GW0_MAC, Ipv4Addr::new(10, 244, 1, 1), 24);
    c0.addr6 = Some((a("fd00:10:244:1::1"), 64));
    c0.ra = Some(RaConfig::default());
    b.add_router_iface(c0, Some(br0)).unwrap();
    let pc = b.add_port("pod-c", Some(br1)).unwrap();
    let mut c1 = IfaceConfig::new("cni1", GW1_MAC, Ipv4Addr::new(10, 244, 2, 1), 24);
    c1.addr6 = Some((a("fd00:10:244:2::1"), 64));
    b.add_router_iface(c1, Some(br1)).unwrap();
    let mut up = IfaceConfig::new("eth0", UP_MAC, Ipv4Addr::new(172, 18, 0, 2), 24);
    up.addr6 = Some((a("fd00:172:18::2"), 64));
    up.mtu = 1400;
    let (eth0_if, eth0) = b.add_router_iface(up, None).unwrap();
    let dp = b.build();
    let st = |p: &str, len, next_hop| Route {
        prefix: a(p),
        len,
        next_hop,
        metric: 1024,
        proto: RouteProto::Static,
        src: None,
    };
    dp.control()
        .add_route(st(
            "fd00:10:244:3::",
            64,
            NextHop::Via(eth0_if, a("fd00:172:18::3")),
        ))
        .unwrap();
    dp.control()
        .add_route(st("fd00:10:244:9::", 64, NextHop::Blackhole))
        .unwrap();
    dp.control()
        .add_route(st("fd00:10:244:8::", 64, NextHop::Unreachable))
        .unwrap();
    dp.control()
        .add_route(st("fd00:10:244:7::", 64, NextHop::Prohibit))
        .unwrap();
    assert!(dp
        .control()
        .add_route(st("fd00:99::", 64, NextHop::Via(eth0_if, a("fd00:1::1"))))
        .unwrap_err()
        .to_string()
        .contains("connected subnet"));
    // A link-local gateway is always on-link.
    dp.control()
        .add_route(st("fd00:98::", 64, NextHop::Via(eth0_if, a("fe80::1"))))
        .unwrap();
    dp.control()
        .add_static_neigh(
            eth0_if,
            a("fd00:172:18::3"),
            MacAddr([2, 0, 0, 0, 0x12, 3]),
            Instant::ZERO,
        )
        .unwrap();
    assert_eq!((pa, pb, pc, eth0), (PA, PB, PC, ETH0));
    Node::new(dp)
}

/// A UDP datagram from pod A (fd00:10:244:1::2, behind port A) to a pod on a remote node
/// (fd00:10:244:3::5), sent to the gateway, with hop limit `hop` and `len` payload bytes.
fn pod_a_to_remote(hop: u8, len: usize) -> Vec<u8> {
    udp6(
        POD_A,
        GW0_MAC,
        "fd00:10:244:1::2",
        "fd00:10:244:3::5",
        hop,
        len,
    )
}

fn udp6(src_mac: MacAddr, dst_mac: MacAddr, src: &str, dst: &str, hop: u8, len: usize) -> Vec<u8> {
    let mut f = Vec::new();
    PacketBuilder::ethernet2(src_mac.0, dst_mac.0)
        .ipv6(a(src).octets(), a(dst).octets(), hop)
        .udp(40000, 53)
        .write(&mut f, &vec![0x5a; len])
        .unwrap();
    f
}

fn ping6(src_mac: MacAddr, dst_mac: MacAddr, src: &str, dst: &str) -> Vec<u8> {
    let mut f = Vec::new();
    PacketBuilder::ethernet2(src_mac.0, dst_mac.0)
        .ipv6(a(src).octets(), a(dst).octets(), 64)
        .icmpv6_echo_request(7, 1)
        .write(&mut f, b"ping6")
        .unwrap();
    f
}

/// An NDP (or other ICMPv6) frame built with tapyard's own writer.
fn icmp(
    src_mac: MacAddr,
    dst_mac: MacAddr,
    src: Ipv6Addr,
    dst: Ipv6Addr,
    r: &Icmpv6Repr,
) -> Vec<u8> {
    let mut f = vec![0u8; 200];
    let n = ipv6::write_icmp(&mut f, src_mac, dst_mac, src, dst, 255, r).unwrap();
    f.truncate(n);
    f
}

/// The ICMPv6 message of an output frame, parsed by tapyard and checked by etherparse.
fn parse_icmp(f: &[u8]) -> (Ipv6Addr, Ipv6Addr, Icmpv6Repr<'_>) {
    let p = SlicedPacket::from_ethernet(f).unwrap();
    assert!(
        matches!(p.transport, Some(TransportSlice::Icmpv6(_))),
        "not ICMPv6"
    );
    let info = ipv6::check(&f[14..]).unwrap();
    let m = Icmpv6Packet::new_checked(&f[14 + info.l4_off..14 + info.total_len()]).unwrap();
    (
        info.src,
        info.dst,
        Icmpv6Repr::parse(&m, info.src, info.dst).unwrap(),
    )
}

/// The router's NDP table.
fn ndp_dump(n: &Node) -> Vec<NeighEntry<Ipv6Addr>> {
    n.dp.control()
        .router()
        .unwrap()
        .neigh::<Ipv6Addr>()
        .dump(n.now)
}

fn neigh_state(n: &Node, ip: &str) -> Option<NeighState> {
    ndp_dump(n)
        .into_iter()
        .find(|e| e.ip == a(ip))
        .map(|e| e.state)
}

/// Pod A learns its gateway by NDP (multicast NS, answered by the router), so the router
/// has pod A as a STALE neighbour.
fn pod_a_resolves_gateway(n: &mut Node) {
    let gw = a("fd00:10:244:1::1");
    let g = ipv6::solicited_node(gw);
    let ns = Icmpv6Repr::NeighborSolicit {
        target: gw,
        source_lladdr: Some(POD_A),
    };
    let (v, out) = send(
        n,
        PA,
        &icmp(POD_A, ipv6::multicast_mac(g), a("fd00:10:244:1::2"), g, &ns),
    );
    assert!(matches!(v, Verdict::Flood(_)), "{v:?}");
    let na = out
        .iter()
        .find(|(p, f)| *p == PA && f[..6] == POD_A.0)
        .expect("NA to pod A");
    let (src, dst, r) = parse_icmp(&na.1);
    assert_eq!((src, dst), (gw, a("fd00:10:244:1::2")));
    assert_eq!(
        r,
        Icmpv6Repr::NeighborAdvert {
            flags: NaFlags {
                router: true,
                solicited: true,
                override_: true
            },
            target: gw,
            target_lladdr: Some(GW0_MAC),
        }
    );
    assert_eq!(neigh_state(n, "fd00:10:244:1::2"), Some(NeighState::Stale));
}

#[test]
fn pod_to_pod_across_bridges_resolves_by_ndp_and_queues() {
    let mut n = node();
    pod_a_resolves_gateway(&mut n);
    let f = udp6(
        POD_A,
        GW0_MAC,
        "fd00:10:244:1::2",
        "fd00:10:244:2::2",
        64,
        20,
    );
    let (v, out) = send(&mut n, PA, &f);
    assert_eq!(v, Verdict::Queued);
    // A multicast NS for pod C's address on cni1, from the router's global address.
    let (p, ns) = out.iter().find(|(p, _)| *p == PC).expect("NS on cni1");
    assert_eq!(*p, PC);
    assert_eq!(&ns[..6], &[0x33, 0x33, 0xff, 0, 0, 2]);
    let (src, dst, r) = parse_icmp(ns);
    assert_eq!((src, dst), (a("fd00:10:244:2::1"), a("ff02::1:ff00:2")));
    assert_eq!(
        r,
        Icmpv6Repr::NeighborSolicit {
            target: a("fd00:10:244:2::2"),
            source_lladdr: Some(GW1_MAC)
        }
    );
    assert_eq!(
        neigh_state(&n, "fd00:10:244:2::2"),
        Some(NeighState::Incomplete)
    );
    // Pod C answers: the queued packet is released to it, hop limit decremented.
    let na = Icmpv6Repr::NeighborAdvert {
        flags: NaFlags {
            router: false,
            solicited: true,
            override_: true,
        },
        target: a("fd00:10:244:2::2"),
        target_lladdr: Some(POD_C),
    };
    let (v, out) = send(
        &mut n,
        PC,
        &icmp(
            POD_C,
            GW1_MAC,
            a("fd00:10:244:2::2"),
            a("fd00:10:244:2::1"),
            &na,
        ),
    );
    assert_eq!(v, Verdict::Local);
    assert_eq!(out.len(), 1);
    let (p, rel) = &out[0];
    assert_eq!(
        (*p, &rel[..6], &rel[6..12]),
        (PC, &POD_C.0[..], &GW1_MAC.0[..])
    );
    assert_eq!(ipv6::check(&rel[14..]).unwrap().hop_limit, 63);
    assert_eq!(
        neigh_state(&n, "fd00:10:244:2::2"),
        Some(NeighState::Reachable)
    );
    // The next packet goes straight through.
    let (v, out) = send(&mut n, PA, &f);
    assert_eq!(v, Verdict::Output(PC));
    assert_eq!(&out[0].1[..6], &POD_C.0);
    // `ip -6 neigh`-style dump.
    let mut s = String::new();
    n.dp.control().fmt_neigh(n.now, &mut s).unwrap();
    assert!(
        s.contains("fd00:10:244:2::2 dev cni1 lladdr 02:00:00:00:02:02 REACHABLE"),
        "{s}"
    );
    let mut r = String::new();
    n.dp.control().fmt_routes(&mut r).unwrap();
    assert!(
        r.contains("fd00:10:244:1::/64 dev cni0 proto kernel metric 256"),
        "{r}"
    );
    assert!(
        r.contains("fd00:10:244:3::/64 via fd00:172:18::3 dev eth0 proto static metric 1024"),
        "{r}"
    );
    let st = n.dp.control().stats();
    assert_eq!(st.accounted(), 4);
}

#[test]
fn unanswered_next_hop_gets_address_unreachable() {
    let mut n = node();
    pod_a_resolves_gateway(&mut n);
    let f = udp6(
        POD_A,
        GW0_MAC,
        "fd00:10:244:1::2",
        "fd00:10:244:2::99",
        64,
        20,
    );
    assert_eq!(send(&mut n, PA, &f).0, Verdict::Queued);
    let mut errors = Vec::new();
    let mut solicits = 0;
    for _ in 0..50 {
        for (p, o) in tick(&mut n, Duration::from_millis(200)) {
            if p == PC {
                solicits += 1;
            } else if p == PA && o[0] & 1 == 0 {
                // (Router Advertisements are flooded on cni0 meanwhile.)
                errors.push(o);
            }
        }
    }
    assert!(solicits >= 2, "retransmitted NS: {solicits}");
    // Pod A's own entry (used to send the error) is probed with unicast NS meanwhile.
    errors.retain(|f| !matches!(parse_icmp(f).2, Icmpv6Repr::NeighborSolicit { .. }));
    assert_eq!(errors.len(), 1, "one address unreachable to pod A");
    let (src, dst, r) = parse_icmp(&errors[0]);
    assert_eq!((src, dst), (a("fd00:10:244:1::1"), a("fd00:10:244:1::2")));
    assert!(
        matches!(r, Icmpv6Repr::DstUnreachable { code: 3, .. }),
        "{r:?}"
    );
    assert_eq!(
        n.dp.control().stats().drop_count(DropReason::NeighFailed),
        1
    );
}

#[test]
fn ns_answered_for_link_local_and_dad_defended() {
    let mut n = node();
    let ll = ipv6::link_local_from_mac(GW0_MAC);
    assert_eq!(
        n.dp.control().router().unwrap().link_local(IfaceId(0)),
        Some(ll)
    );
    assert_eq!(
        n.dp.control().router().unwrap().local_iface(ll),
        Some(IfaceId(0))
    );
    let g = ipv6::solicited_node(ll);
    let ns = Icmpv6Repr::NeighborSolicit {
        target: ll,
        source_lladdr: Some(POD_A),
    };
    let (_, out) = send(
        &mut n,
        PA,
        &icmp(POD_A, ipv6::multicast_mac(g), a("fe80::2"), g, &ns),
    );
    let (_, na) = out.iter().find(|(_, f)| f[..6] == POD_A.0).expect("NA");
    let (src, dst, r) = parse_icmp(na);
    assert_eq!((src, dst), (ll, a("fe80::2")));
    assert!(
        matches!(r, Icmpv6Repr::NeighborAdvert { target, target_lladdr: Some(GW0_MAC), .. } if target == ll)
    );
    // DAD for the global address: defended with an NA to all nodes.
    let gw = a("fd00:10:244:1::1");
    let g = ipv6::solicited_node(gw);
    let dad = Icmpv6Repr::NeighborSolicit {
        target: gw,
        source_lladdr: None,
    };
    let (_, out) = send(
        &mut n,
        PB,
        &icmp(
            MacAddr([2, 0, 0, 0, 1, 3]),
            ipv6::multicast_mac(g),
            Ipv6Addr::UNSPECIFIED,
            g,
            &dad,
        ),
    );
    let (_, na) = out
        .iter()
        .find(|(_, f)| f[..6] == [0x33, 0x33, 0, 0, 0, 1])
        .expect("NA to all nodes");
    let (_, dst, r) = parse_icmp(na);
    assert_eq!(dst, ipv6::ALL_NODES);
    assert!(matches!(
        r,
        Icmpv6Repr::NeighborAdvert {
            flags: NaFlags {
                solicited: false,
                override_: true,
                ..
            },
            ..
        }
    ));
    // Bad NDP: hop limit not 255 (sent to the router's MAC so it is counted).
    let mut bad = icmp(
        POD_A,
        GW0_MAC,
        a("fd00:10:244:1::2"),
        gw,
        &Icmpv6Repr::NeighborSolicit {
            target: gw,
            source_lladdr: Some(POD_A),
        },
    );
    bad[14 + 7] = 64;
    assert_eq!(send(&mut n, PA, &bad).0, Verdict::Drop(DropReason::BadNdp));
    // Bad checksum.
    let mut bad = icmp(
        POD_A,
        GW0_MAC,
        a("fd00:10:244:1::2"),
        gw,
        &Icmpv6Repr::NeighborSolicit {
            target: gw,
            source_lladdr: Some(POD_A),
        },
    );
    let last = bad.len() - 1;
    bad[last] ^= 0xff;
    assert_eq!(
        send(&mut n, PA, &bad).0,
        Verdict::Drop(DropReason::BadIcmpv6Checksum)
    );
    // Unsolicited NA for an unknown address creates nothing.
    let na = Icmpv6Repr::NeighborAdvert {
        flags: NaFlags {
            router: false,
            solicited: false,
            override_: true,
        },
        target: a("fd00:10:244:1::77"),
        target_lladdr: Some(POD_A),
    };
    let _ = send(
        &mut n,
        PA,
        &icmp(
            POD_A,
            ipv6::multicast_mac(ipv6::ALL_NODES),
            a("fd00:10:244:1::77"),
            ipv6::ALL_NODES,
            &na,
        ),
    );
    assert_eq!(neigh_state(&n, "fd00:10:244:1::77"), None);
}

#[test]
fn hop_limit_too_big_routes_and_link_local() {
    let mut n = node();
    pod_a_resolves_gateway(&mut n);
    let err = |out: &[(PortId, Vec<u8>)]| -> String {
        let (_, f) = out
            .iter()
            .find(|(_, f)| f[..6] == POD_A.0)
            .expect("an error to pod A");
        format!("{:?}", parse_icmp(f).2)
    };
    // Hop limit 1: time exceeded.
    let (v, out) = send(&mut n, PA, &pod_a_to_remote(1, 8));
    assert_eq!(v, Verdict::Drop(DropReason::TtlExpired));
    assert!(
        err(&out).starts_with("TimeExceeded { code: 0"),
        "{}",
        err(&out)
    );
    // Bigger than eth0's MTU: packet too big with 1400, quoting at most 1280 bytes in all.
    let (v, out) = send(&mut n, PA, &pod_a_to_remote(64, 1400));
    assert_eq!(v, Verdict::Drop(DropReason::PacketTooBig));
    let (_, f) = out.iter().find(|(_, f)| f[..6] == POD_A.0).unwrap();
    assert_eq!(f.len(), 14 + 1280);
    let p = SlicedPacket::from_ethernet(f).unwrap();
    let Some(TransportSlice::Icmpv6(i)) = p.transport else {
        panic!()
    };
    assert_eq!(i.icmp_type(), Icmpv6Type::PacketTooBig { mtu: 1400 });
    // Fits: forwarded to the static neighbour on eth0.
    let (v, _) = send(&mut n, PA, &pod_a_to_remote(64, 1300));
    assert_eq!(v, Verdict::Output(ETH0));
    // Blackhole: silent. Unreachable: code 0; prohibit: code 6; no route: code 0;
    // link-local source or destination: never forwarded, no error; UDP to the router: port
    // unreachable. Each error 2 s after the last (ICMPv6's rate limit).
    let cases: [(&str, &str, DropReason, Option<&str>); 7] = [
        (
            "fd00:10:244:1::2",
            "fd00:10:244:9::5",
            DropReason::Blackhole,
            None,
        ),
        (
            "fd00:10:244:1::2",
            "fd00:10:244:8::5",
            DropReason::Unreachable,
            Some("DstUnreachable { code: 0"),
        ),
        (
            "fd00:10:244:1::2",
            "fd00:10:244:7::5",
            DropReason::Unreachable,
            Some("DstUnreachable { code: 6"),
        ),
        (
            "fd00:10:244:1::2",
            "2001:db8::1",
            DropReason::NoRoute,
            Some("DstUnreachable { code: 0"),
        ),
        (
            "fe80::2",
            "fd00:10:244:3::5",
            DropReason::Ipv6LinkLocal,
            None,
        ),
        (
            "fd00:10:244:1::2",
            "fe80::9",
            DropReason::Ipv6LinkLocal,
            None,
        ),
        (
            "fd00:10:244:1::2",
            "fd00:10:244:1::1",
            DropReason::LocalNoService,
            Some("DstUnreachable { code: 4"),
        ),
    ];
    for (src, dst, reason, error) in cases {
        n.now = n.now + Duration::from_secs(2);
        let (v, out) = send(&mut n, PA, &udp6(POD_A, GW0_MAC, src, dst, 64, 8));
        assert_eq!(v, Verdict::Drop(reason), "{src} -> {dst}");
        match error {
            Some(e) => assert!(err(&out).starts_with(e), "{src} -> {dst}: {}", err(&out)),
            None => assert!(out.is_empty(), "{src} -> {dst}: {out:?}"),
        }
    }
    let s = n.dp.control().stats();
    assert_eq!(
        s.accounted(),
        s.ports.iter().map(|p| p.rx_packets).sum::<u64>()
    );
}

#[test]
fn echo_answered_on_global_and_link_local() {
    let mut n = node();
    for (src, dst) in [
        ("fd00:10:244:1::2", "fd00:10:244:1::1"),
        ("fd00:10:244:1::2", "fd00:10:244:2::1"),
        ("fe80::2", "fe80::aa:ff:fe00:1"),
    ] {
        let (v, out) = send(&mut n, PA, &ping6(POD_A, GW0_MAC, src, dst));
        assert_eq!(v, Verdict::Local, "{dst}");
        let (p, f) = &out[0];
        assert_eq!((*p, &f[..6]), (PA, &POD_A.0[..]));
        let (s, d, r) = parse_icmp(f);
        assert_eq!((s, d), (a(dst), a(src)));
        assert!(matches!(
            r,
            Icmpv6Repr::EchoReply(Echo {
                ident: 7,
                seq_no: 1,
                data: b"ping6"
            })
        ));
    }
}

#[test]
fn extension_header_chains_are_walked_and_bounded() {
    let mut n = node();
    pod_a_resolves_gateway(&mut n);
    // UDP after hop-by-hop and destination options: forwarded.
    let build = |chain: &[u8], hdrs: usize| {
        let mut f = pod_a_to_remote(64, 8);
        let mut ext = Vec::new();
        for (i, k) in chain.iter().enumerate().take(hdrs) {
            let next = chain.get(i + 1).copied().unwrap_or(17);
            let _ = k;
            ext.extend_from_slice(&[next, 0, 1, 4, 0, 0, 0, 0]);
        }
        let first = chain.first().copied().unwrap_or(17);
        f[20] = first;
        let pl = u16::from_be_bytes([f[18], f[19]]) + u16::try_from(ext.len()).unwrap();
        f[18..20].copy_from_slice(&pl.to_be_bytes());
        f.splice(54..54, ext);
        f
    };
    let ok = build(&[0, 60, 60], 3);
    assert_eq!(send(&mut n, PA, &ok).0, Verdict::Output(ETH0));
    let long = build(&[60; 9], 9);
    assert_eq!(
        send(&mut n, PA, &long).0,
        Verdict::Drop(DropReason::BadIpv6Header)
    );
    let misplaced = build(&[60, 0], 2);
    assert_eq!(
        send(&mut n, PA, &misplaced).0,
        Verdict::Drop(DropReason::BadIpv6Header)
    );
    let mut cut = build(&[60, 60], 2);
    cut[55] = 200;
    assert_eq!(
        send(&mut n, PA, &cut).0,
        Verdict::Drop(DropReason::BadIpv6Header)
    );
    // Garbage after an IPv6 EtherType to the router: counted, never a crash.
    let mut seed = 7u64;
    for len in 0..300 {
        let mut f = pod_a_to_remote(64, 8);
        f.truncate(14);
        for _ in 0..len {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            f.push(seed.to_le_bytes()[0]);
        }
        if len > 0 {
            f[14] = 0x60 | (f[14] & 0x0f);
        }
        let _ = send(&mut n, PA, &f);
    }
    let s = n.dp.control().stats();
    assert_eq!(
        s.accounted(),
        s.ports.iter().map(|p| p.rx_packets).sum::<u64>()
    );
}

#[test]
fn router_advertisements_periodic_and_solicited() {
    let mut n = node();
    let out = tick(&mut n, Duration::from_millis(100));
    let ras: Vec<_> = out
        .iter()
        .filter(|(_, f)| f[..6] == [0x33, 0x33, 0, 0, 0, 1])
        .collect();
    assert!(
        ras.iter().any(|(p, _)| *p == PA) && ras.iter().any(|(p, _)| *p == PB),
        "RA flooded on cni0"
    );
    assert!(
        !ras.iter().any(|(p, _)| *p == PC || *p == ETH0),
        "no RA where not configured"
    );
    let (src, dst, r) = parse_icmp(&ras[0].1);
    assert_eq!(
        (src, dst),
        (ipv6::link_local_from_mac(GW0_MAC), ipv6::ALL_NODES)
    );
    let Icmpv6Repr::RouterAdvert {
        router_lifetime,
        source_lladdr,
        prefix_info: Some(pi),
        mtu,
        ..
    } = r
    else {
        panic!("{r:?}")
    };
    assert_eq!(
        (router_lifetime, source_lladdr, mtu),
        (1800, Some(GW0_MAC), None)
    );
    assert_eq!(
        (pi.prefix, pi.prefix_len, pi.on_link, pi.autonomous),
        (a("fd00:10:244:1::"), 64, true, true)
    );
    // Nothing until the next one is due (≤ 16 s: one of the first three).
    assert!(tick(&mut n, Duration::from_secs(1)).is_empty());
    // An RS is answered within 0.5 s (and 3 s after the last RA).
    n.now = n.now + Duration::from_secs(3);
    let rs = Icmpv6Repr::RouterSolicit {
        source_lladdr: Some(POD_A),
    };
    let (v, _) = send(
        &mut n,
        PA,
        &icmp(
            POD_A,
            ipv6::multicast_mac(ipv6::ALL_ROUTERS),
            a("fe80::2"),
            ipv6::ALL_ROUTERS,
            &rs,
        ),
    );
    assert!(matches!(v, Verdict::Flood(_)), "{v:?}");
    let out = tick(&mut n, Duration::from_millis(500));
    assert!(
        out.iter()
            .any(|(p, f)| *p == PA && f[..6] == [0x33, 0x33, 0, 0, 0, 1]),
        "solicited RA"
    );
    assert!(n.dp.control().router().unwrap().counters.snapshot().ra_sent >= 2);
}

#[test]
fn echo_with_extension_headers_answered_without_them_as_linux() {
    let mut n = node();
    // Hop-by-hop (PadN) and destination options before the echo request, as `ping -6` with
    // options would send: Linux answers with a plain echo reply.
    let mut f = ping6(POD_A, GW0_MAC, "fd00:10:244:1::2", "fd00:10:244:1::1");
    let ext = [60u8, 0, 1, 4, 0, 0, 0, 0, 58, 0, 1, 4, 0, 0, 0, 0];
    f[20] = 0;
    let pl = u16::from_be_bytes([f[18], f[19]]) + 16;
    f[18..20].copy_from_slice(&pl.to_be_bytes());
    f.splice(54..54, ext);
    let (v, out) = send(&mut n, PA, &f);
    assert_eq!(v, Verdict::Local);
    let (p, r) = &out[0];
    assert_eq!(*p, PA);
    assert_eq!(
        r.len(),
        f.len() - 16,
        "the reply carries no extension headers"
    );
    let (s, d, m) = parse_icmp(r);
    assert_eq!((s, d), (a("fd00:10:244:1::1"), a("fd00:10:244:1::2")));
    assert!(matches!(
        m,
        Icmpv6Repr::EchoReply(Echo {
            ident: 7,
            seq_no: 1,
            data: b"ping6"
        })
    ));
    // A fragment of an echo request is not reassembled: no answer, counted.
    let mut frag = ping6(POD_A, GW0_MAC, "fd00:10:244:1::2", "fd00:10:244:1::1");
    frag[20] = 44;
    let pl = u16::from_be_bytes([frag[18], frag[19]]) + 8;
    frag[18..20].copy_from_slice(&pl.to_be_bytes());
    frag.splice(54..54, [58u8, 0, 0, 1, 0, 0, 0, 9]);
    let (v, out) = send(&mut n, PA, &frag);
    assert!(matches!(v, Verdict::Drop(_)), "{v:?}");
    assert!(out.is_empty());
}

#[test]
fn na_without_override_makes_reachable_entry_stale_as_linux() {
    let mut n = node();
    pod_a_resolves_gateway(&mut n);
    let pod = a("fd00:10:244:1::2");
    let gw = a("fd00:10:244:1::1");
    let na = |mac: MacAddr, solicited: bool, override_: bool| {
        let r = Icmpv6Repr::NeighborAdvert {
            flags: NaFlags {
                router: false,
                solicited,
                override_,
            },
            target: pod,
            target_lladdr: Some(mac),
        };
        icmp(mac, GW0_MAC, pod, gw, &r)
    };
    // A solicited NA with pod A's MAC confirms it.
    assert_eq!(send(&mut n, PA, &na(POD_A, true, true)).0, Verdict::Local);
    assert_eq!(
        neigh_state(&n, "fd00:10:244:1::2"),
        Some(NeighState::Reachable)
    );
    // Another MAC without the override flag: REACHABLE -> STALE, the MAC kept
    // (neigh_update with NEIGH_UPDATE_F_WEAK_OVERRIDE).
    let other = MacAddr([0x02, 0, 0, 0, 1, 9]);
    assert_eq!(send(&mut n, PA, &na(other, true, false)).0, Verdict::Local);
    let dump = ndp_dump(&n);
    let e = dump.iter().find(|e| e.ip == pod).unwrap();
    assert_eq!((e.state, e.mac), (NeighState::Stale, Some(POD_A)));
    // Again, now STALE: ignored (the MAC still kept).
    assert_eq!(send(&mut n, PA, &na(other, false, false)).0, Verdict::Local);
    let dump = ndp_dump(&n);
    let e = dump.iter().find(|e| e.ip == pod).unwrap();
    assert_eq!((e.state, e.mac), (NeighState::Stale, Some(POD_A)));
    // With the override flag the new MAC is taken.
    assert_eq!(send(&mut n, PA, &na(other, false, true)).0, Verdict::Local);
    let dump = ndp_dump(&n);
    let e = dump.iter().find(|e| e.ip == pod).unwrap();
    assert_eq!(e.mac, Some(other));
}

/// Linux answers a unicast probe (NS to its own address) with a solicited NA without a Target
/// Link-Layer Address option (`ndisc_recv_ns`: the option only for a multicast NS): that NA
/// confirms the entry's MAC (RFC 4861 7.2.5). Here pod A is in PROBE when it sends to a next
/// hop that never answers: it must answer the probes and so get the address unreachable,
/// instead of going FAILED before the error is due (the dual-stack e2e case).
#[test]
fn probe_answered_without_target_lladdr_confirms_and_error_is_delivered() {
    let mut n = node();
    pod_a_resolves_gateway(&mut n);
    let pod_a = a("fd00:10:244:1::2");
    // Pod C pings pod A: the STALE entry is used (DELAY), then probed 5 s later.
    let (v, _) = send(
        &mut n,
        PC,
        &ping6(POD_C, GW1_MAC, "fd00:10:244:2::2", "fd00:10:244:1::2"),
    );
    assert_eq!(v, Verdict::Output(PA));
    assert_eq!(neigh_state(&n, "fd00:10:244:1::2"), Some(NeighState::Delay));
    let is_probe = |f: &[u8]| {
        f[..6] == POD_A.0
            && f[12..14] == [0x86, 0xdd]
            && matches!(parse_icmp(f).2, Icmpv6Repr::NeighborSolicit { target, .. } if target == pod_a)
    };
    let mut probes = Vec::new();
    for _ in 0..26 {
        for (p, f) in tick(&mut n, Duration::from_millis(200)) {
            if p == PA && is_probe(&f) {
                probes.push(f);
            }
        }
    }
    assert_eq!(probes.len(), 1, "one unicast probe so far");
    assert_eq!(neigh_state(&n, "fd00:10:244:1::2"), Some(NeighState::Probe));
    // Pod A sends to a next hop on cni1 that never answers.
    let f = udp6(
        POD_A,
        GW0_MAC,
        "fd00:10:244:1::2",
        "fd00:10:244:2::99",
        64,
        20,
    );
    assert_eq!(send(&mut n, PA, &f).0, Verdict::Queued);
    let na = Icmpv6Repr::NeighborAdvert {
        flags: NaFlags {
            router: false,
            solicited: true,
            override_: false,
        },
        target: pod_a,
        target_lladdr: None,
    };
    let answer = icmp(POD_A, GW0_MAC, pod_a, a("fd00:10:244:1::1"), &na);
    let mut answered = false;
    let mut errors = Vec::new();
    for _ in 0..50 {
        for (p, f) in tick(&mut n, Duration::from_millis(200)) {
            if p != PA || f[0] & 1 == 1 {
                continue;
            }
            if is_probe(&f) {
                probes.push(f);
            } else if matches!(parse_icmp(&f).2, Icmpv6Repr::DstUnreachable { .. }) {
                errors.push(f);
            }
        }
        // Pod A's kernel answers the probe it got (once, as a pod answers at once).
        if probes.len() > 1 && !answered {
            answered = true;
            assert_eq!(send(&mut n, PA, &answer).0, Verdict::Local);
            assert_eq!(
                neigh_state(&n, "fd00:10:244:1::2"),
                Some(NeighState::Reachable),
                "a solicited NA without a target link-layer address confirms the entry"
            );
        }
    }
    assert!(answered, "probes: {}", probes.len());
    assert_eq!(errors.len(), 1, "one address unreachable to pod A");
    let (src, dst, r) = parse_icmp(&errors[0]);
    assert_eq!((src, dst), (a("fd00:10:244:1::1"), pod_a));
    assert!(
        matches!(r, Icmpv6Repr::DstUnreachable { code: 3, .. }),
        "{r:?}"
    );
    assert_eq!(
        n.dp.control().stats().drop_count(DropReason::NeighFailed),
        1
    );
}

#[test]
fn replace_route6_moves_a_route_to_another_gateway_in_one_update() {
    let mut n = node();
    let (peer3, peer4) = (
        MacAddr([2, 0, 0, 0, 0x12, 3]),
        MacAddr([2, 0, 0, 0, 0x12, 4]),
    );
    let eth0 = IfaceId(2);
    n.dp.control()
        .add_static_neigh(eth0, a("fd00:172:18::4"), peer4, n.now)
        .unwrap();
    let to_remote = |n: &mut Node| {
        let (_, out) = send(n, PA, &pod_a_to_remote(64, 8));
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!(out[0].0, ETH0);
        MacAddr(out[0].1[..6].try_into().unwrap())
    };
    assert_eq!(to_remote(&mut n), peer3);
    let route = |gw: &str| Route {
        prefix: a("fd00:10:244:3::"),
        len: 64,
        next_hop: NextHop::Via(eth0, a(gw)),
        metric: 1024,
        proto: RouteProto::Static,
        src: None,
    };
    // `ip -6 route replace`: the route with that prefix and metric is swapped, returned.
    let old =
        n.dp.control()
            .replace_route(route("fd00:172:18::4"))
            .unwrap();
    assert_eq!(old, Some(route("fd00:172:18::3")));
    assert_eq!(to_remote(&mut n), peer4);
    // Checked as an add: a gateway off every connected subnet is refused, and the route in
    // place is kept (a remove + add would have lost it).
    assert!(n
        .dp
        .control()
        .replace_route(route("fd00:1::1"))
        .unwrap_err()
        .to_string()
        .contains("connected subnet"));
    assert_eq!(to_remote(&mut n), peer4);
    let routes = n.dp.control().routes::<Ipv6Addr>().unwrap().routes();
    assert_eq!(
        routes
            .iter()
            .filter(|r| r.prefix == a("fd00:10:244:3::"))
            .count(),
        1
    );
    // A prefix without a route: added.
    let new = Route {
        prefix: a("fd00:10:244:4::"),
        ..route("fd00:172:18::4")
    };
    assert_eq!(n.dp.control().replace_route(new), Ok(None));
    assert_eq!(
        n.dp.control()
            .routes::<Ipv6Addr>()
            .unwrap()
            .lookup(a("fd00:10:244:4::1")),
        Some(new.next_hop)
    );
}

/// An unsolicited NA of [`tapyard::l3::Router::announce`], checked by etherparse: to
/// all-nodes from the address itself, hop limit 255, router and override flags set,
/// solicited clear, the checksum right. Returns the target and its link-layer address.
fn check_unsolicited_na(f: &[u8], mac: MacAddr) -> (Ipv6Addr, Option<MacAddr>) {
    let p = SlicedPacket::from_ethernet(f).unwrap();
    let eth = p.link.as_ref().unwrap().to_header().unwrap();
    let eth = match eth {
        etherparse::LinkHeader::Ethernet2(e) => e,
        other => panic!("not Ethernet II: {other:?}"),
    };
    assert_eq!(
        (eth.source, eth.destination),
        (mac.0, [0x33, 0x33, 0, 0, 0, 1])
    );
    let Some(etherparse::NetSlice::Ipv6(ip)) = &p.net else {
        panic!("not IPv6")
    };
    let h = ip.header();
    assert_eq!(h.hop_limit(), 255);
    assert_eq!(h.destination_addr(), ipv6::ALL_NODES);
    let Some(TransportSlice::Icmpv6(icmp)) = &p.transport else {
        panic!("not ICMPv6")
    };
    assert!(icmp.is_checksum_valid(h.source(), h.destination()));
    let Icmpv6Type::NeighborAdvertisement(na) = icmp.icmp_type() else {
        panic!("not an NA: {:?}", icmp.icmp_type())
    };
    assert!(na.router && na.r#override && !na.solicited, "{na:?}");
    let (src, dst, r) = parse_icmp(f);
    assert_eq!(dst, ipv6::ALL_NODES);
    let Icmpv6Repr::NeighborAdvert {
        target,
        target_lladdr,
        ..
    } = r
    else {
        panic!("{r:?}")
    };
    assert_eq!(src, target, "sent from the address it announces");
    (target, target_lladdr)
}

/// A router interface comes up (tapyard starts, or takes over from another process): it
/// announces itself with a gratuitous ARP and, having an IPv6 address, an unsolicited NA for
/// its global and one for its link-local address, so that a pod holding another MAC for its
/// gateway takes the right one at once (Linux does this only with `arp_notify` and
/// `ndisc_notify` set). An IPv4-only interface sends no IPv6.
#[test]
fn announce_sends_gratuitous_arp_and_unsolicited_nas_for_both_addresses() {
    let n = node();
    let r = n.dp.control().router().unwrap();
    let cni0 = n.dp.control().iface_by_name("cni0").unwrap();
    let mut frames = Vec::new();
    r.announce(cni0, |f| frames.push(f.to_vec()));
    assert_eq!(frames.len(), 3, "ARP, then an NA per address");
    // The gratuitous ARP, as before: broadcast, sender = target = the IPv4 address.
    let arp = etherparse::ArpPacketSlice::from_slice(&frames[0][14..]).unwrap();
    assert_eq!(frames[0].len(), 60);
    assert_eq!(&frames[0][..6], &[0xff; 6]);
    assert_eq!(arp.sender_protocol_addr(), [10, 244, 1, 1]);
    assert_eq!(arp.target_protocol_addr(), [10, 244, 1, 1]);
    let ll = r.link_local(cni0).unwrap();
    assert_eq!(ll, ipv6::link_local_from_mac(GW0_MAC));
    assert_eq!(
        check_unsolicited_na(&frames[1], GW0_MAC),
        (a("fd00:10:244:1::1"), Some(GW0_MAC))
    );
    assert_eq!(
        check_unsolicited_na(&frames[2], GW0_MAC),
        (ll, Some(GW0_MAC))
    );
    // The uplink announces its own addresses, from its own MAC.
    let eth0 = n.dp.control().iface_by_name("eth0").unwrap();
    let mut up = Vec::new();
    r.announce(eth0, |f| up.push(f.to_vec()));
    assert_eq!(up.len(), 3);
    assert_eq!(check_unsolicited_na(&up[1], UP_MAC).0, a("fd00:172:18::2"));
    // An unknown interface: nothing.
    let mut none = 0;
    r.announce(IfaceId(99), |_| none += 1);
    assert_eq!(none, 0);

    // An IPv4-only interface: the gratuitous ARP alone.
    let mut b = Datapath::builder();
    let br = b.add_bridge(BridgeConfig::new("cni0")).unwrap();
    let c = IfaceConfig::new("cni0", GW0_MAC, Ipv4Addr::new(10, 244, 1, 1), 24);
    let (v4, _) = b.add_router_iface(c, Some(br)).unwrap();
    let dp4 = b.build();
    let mut only = Vec::new();
    dp4.control()
        .router()
        .unwrap()
        .announce(v4, |f| only.push(f.to_vec()));
    assert_eq!(only.len(), 1);
    assert_eq!(&only[0][12..14], &[0x08, 0x06], "ARP, no IPv6");
}

/// What a neighbour does with the announcement, with tapyard's own NDP (Linux's state
/// machine) as the pod: an entry for the gateway holding another MAC (learned from an NS
/// sent from an old MAC) takes the announced MAC at once and becomes STALE (the override
/// flag; `ndisc_recv_na`), for the global and the link-local address alike.
#[test]
fn an_unsolicited_na_corrects_a_neighbours_stale_entry() {
    let gw = a("fd00:10:244:1::1");
    let n = node();
    let r = n.dp.control().router().unwrap();
    let cni0 = n.dp.control().iface_by_name("cni0").unwrap();
    let ll = r.link_local(cni0).unwrap();
    let mut frames = Vec::new();
    r.announce(cni0, |f| frames.push(f.to_vec()));

    // The pod: a router interface of its own on an uplink port, in the gateway's subnet.
    let mut b = Datapath::builder();
    let pod_ip = a("fd00:10:244:1::2");
    let (pod_if, pod_port) = b
        .add_router_iface(IfaceConfig::new("eth0", POD_A, pod_ip, 64), None)
        .unwrap();
    let pod = b.build();
    let mut w = pod.worker();
    let now = Instant::from_secs(5);
    let old = MacAddr([0x02, 0xaa, 0, 0, 0, 0x99]);
    for src in [gw, ll] {
        // The old gateway asked for the pod from an old MAC: the pod keeps that MAC, STALE.
        let ns = Icmpv6Repr::NeighborSolicit {
            target: pod_ip,
            source_lladdr: Some(old),
        };
        let g = ipv6::solicited_node(pod_ip);
        let f = icmp(old, ipv6::multicast_mac(g), src, g, &ns);
        common::send_one(&pod, &mut w, now, pod_port, &f);
    }
    let entry = |ip: Ipv6Addr| {
        pod.control()
            .router()
            .unwrap()
            .neigh::<Ipv6Addr>()
            .dump(now)
            .into_iter()
            .find(|e| e.ip == ip && e.iface == pod_if)
            .map(|e| (e.state, e.mac))
    };
    assert_eq!(entry(gw), Some((NeighState::Stale, Some(old))));
    assert_eq!(entry(ll), Some((NeighState::Stale, Some(old))));
    for f in &frames[1..] {
        let (v, _) = common::send_one(&pod, &mut w, now, pod_port, f);
        assert_eq!(v, Verdict::Local, "taken in by the pod");
    }
    assert_eq!(entry(gw), Some((NeighState::Stale, Some(GW0_MAC))));
    assert_eq!(entry(ll), Some((NeighState::Stale, Some(GW0_MAC))));
}
