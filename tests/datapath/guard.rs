//! The spoof guard on the packet path, without root: two guarded pods and an unguarded one on
//! cni0 (gateway 10.244.1.1 and fd00:10:244:1::1). The attacker, pod A, sends with the
//! victim's (pod B's) address and MAC, answers ARP and NDP for it: every frame is dropped and
//! counted by reason and on pod A's port, and neither the bridge's FDB nor the router's
//! neighbour tables learn anything from them, while both pods' own traffic (DHCP, DAD,
//! link-local NDP included) passes as before. Router advertisements, redirects and DHCP
//! server messages from a guarded pod are dropped too (RA and DHCP guard).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use etherparse::{Icmpv6Type, PacketBuilder};
use tapyard::l2::guard::PortGuard;
use tapyard::l3::IfaceConfig;
use tapyard::wire::arp::ArpRepr;
use tapyard::{BridgeConfig, ConfigError, Datapath, DropReason, MacAddr, PortId, Verdict};
use tapyard_testkit::frame::{ip6, udp};
use tapyard_testkit::{send, Node};

const GW_MAC: MacAddr = MacAddr([0x02, 0xaa, 0, 0, 0, 1]);
const A_MAC: MacAddr = MacAddr([0x02, 0, 0, 0, 1, 2]);
const B_MAC: MacAddr = MacAddr([0x02, 0, 0, 0, 1, 3]);
const GW: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 1);
const A4: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 2);
const B4: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 3);
const PA: PortId = PortId(0);
const PB: PortId = PortId(1);
const PC: PortId = PortId(2);

fn a6() -> Ipv6Addr {
    ip6("fd00:10:244:1::2")
}

fn b6() -> Ipv6Addr {
    ip6("fd00:10:244:1::3")
}

/// cni0 with pods A, B (guarded when `guarded`) and C (never guarded), and the gateway.
fn node(guarded: bool) -> Node {
    let mut b = Datapath::builder();
    let br = b.add_bridge(BridgeConfig::new("cni0")).unwrap();
    let pa = b.add_port("pod-a", Some(br)).unwrap();
    let pb = b.add_port("pod-b", Some(br)).unwrap();
    let pc = b.add_port("pod-c", Some(br)).unwrap();
    let mut gw = IfaceConfig::new("cni0", GW_MAC, GW, 24);
    gw.addr6 = Some((ip6("fd00:10:244:1::1"), 64));
    b.add_router_iface(gw, Some(br)).unwrap();
    let dp = b.build();
    assert_eq!((pa, pb, pc), (PA, PB, PC));
    if guarded {
        let g = |mac, a: Ipv4Addr, b: Ipv6Addr| {
            PortGuard::new(mac, [IpAddr::V4(a), IpAddr::V6(b)]).unwrap()
        };
        let ctl = dp.control();
        ctl.set_port_guard(PA, Some(g(A_MAC, A4, a6()))).unwrap();
        ctl.set_port_guard(PB, Some(g(B_MAC, B4, b6()))).unwrap();
    }
    Node::new(dp)
}

/// An ARP packet in a frame from `eth_src` (broadcast for a request, to the gateway for a
/// reply).
fn arp(op: u16, eth_src: MacAddr, sha: MacAddr, spa: Ipv4Addr, tpa: Ipv4Addr) -> Vec<u8> {
    let dst = if op == 1 { MacAddr::BROADCAST } else { GW_MAC };
    let mut f = [0u8; 60];
    let n = ArpRepr {
        operation: op,
        sha,
        spa,
        tha: if op == 1 { MacAddr::ZERO } else { GW_MAC },
        tpa,
    }
    .write_frame(sha, dst, &mut f)
    .unwrap();
    f[6..12].copy_from_slice(&eth_src.0);
    f[..n].to_vec()
}

/// A neighbour solicitation (135) or advertisement (136) from `src` for `target`, with a
/// link-layer address option carrying `ll` (none from `::`), to the solicited-node group of
/// the target (NS) or to all nodes (an unsolicited, overriding NA).
fn ndp(kind: u8, src: Ipv6Addr, target: Ipv6Addr, ll: MacAddr) -> Vec<u8> {
    let t = target.octets();
    let (dst, dst_mac) = if kind == 135 {
        let d = Ipv6Addr::from([
            0xff, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, t[13], t[14], t[15],
        ]);
        (d, MacAddr([0x33, 0x33, 0xff, t[13], t[14], t[15]]))
    } else {
        (ip6("ff02::1"), MacAddr([0x33, 0x33, 0, 0, 0, 1]))
    };
    let mut body = t.to_vec();
    if !src.is_unspecified() {
        body.extend_from_slice(&[if kind == 135 { 1 } else { 2 }, 1]);
        body.extend_from_slice(&ll.0);
    }
    let mut f = Vec::new();
    PacketBuilder::ethernet2(A_MAC.0, dst_mac.0)
        .ipv6(src.octets(), dst.octets(), 255)
        .icmpv6(Icmpv6Type::Unknown {
            type_u8: kind,
            code_u8: 0,
            bytes5to8: if kind == 136 { [0x20, 0, 0, 0] } else { [0; 4] },
        })
        .write(&mut f, &body)
        .unwrap();
    f
}

/// Whether the guard let a frame pass (the router may still drop it for its own reasons).
fn unguarded(v: Verdict) -> bool {
    !matches!(v, Verdict::Drop(r) if r.is_spoofed())
}

/// `f` sent from `mac` (its Ethernet source rewritten).
fn from(mut f: Vec<u8>, mac: MacAddr) -> Vec<u8> {
    f[6..12].copy_from_slice(&mac.0);
    f
}

/// Pod B makes itself known: ARP for the gateway, an NS for it from its IPv6 address.
fn victim_announces(n: &mut Node) {
    let (v, _) = send(n, PB, &arp(1, B_MAC, B_MAC, B4, GW));
    assert_eq!(v, Verdict::Flood(tapyard::BridgeId(0)));
    let (v, _) = send(
        n,
        PB,
        &from(ndp(135, b6(), ip6("fd00:10:244:1::1"), B_MAC), B_MAC),
    );
    assert!(!matches!(v, Verdict::Drop(_)), "{v:?}");
}

/// What the bridge and the router believe about pod B now.
fn beliefs(n: &Node) -> (Option<PortId>, Option<MacAddr>, Option<MacAddr>) {
    let dp = &n.dp;
    let br = dp.control().bridge(tapyard::BridgeId(0)).unwrap();
    let r = dp.control().router().unwrap();
    let i = dp.control().iface_by_name("cni0").unwrap();
    (
        br.fdb().lookup(B_MAC, n.now),
        r.neigh::<Ipv4Addr>().lookup(i, B4, n.now),
        r.neigh::<Ipv6Addr>().lookup(i, b6(), n.now),
    )
}

/// Pod A's attacks on pod B, each with the reason the guard drops it for.
fn attacks() -> Vec<(&'static str, Vec<u8>, DropReason)> {
    vec![
        (
            "udp from B's address",
            udp(A_MAC, GW_MAC, B4, 4000, Ipv4Addr::new(10, 244, 2, 9), 53),
            DropReason::SpoofedIp,
        ),
        (
            "udp from B's MAC",
            udp(B_MAC, GW_MAC, A4, 4000, Ipv4Addr::new(10, 244, 2, 9), 53),
            DropReason::SpoofedMac,
        ),
        (
            "broadcast from B's MAC",
            tapyard_testkit::announce_frame(B_MAC),
            DropReason::SpoofedMac,
        ),
        (
            "ARP reply claiming B's address",
            arp(2, A_MAC, A_MAC, B4, GW),
            DropReason::SpoofedArp,
        ),
        (
            "gratuitous ARP claiming B's address",
            arp(1, A_MAC, A_MAC, B4, B4),
            DropReason::SpoofedArp,
        ),
        (
            "ARP with B's MAC inside",
            arp(2, A_MAC, B_MAC, B4, GW),
            DropReason::SpoofedMac,
        ),
        (
            "udp from B's IPv6 address",
            udp(A_MAC, GW_MAC, b6(), 4000, ip6("fd00:10:244:2::9"), 53),
            DropReason::SpoofedIp,
        ),
        (
            "NA claiming B's IPv6 address",
            ndp(136, a6(), b6(), A_MAC),
            DropReason::SpoofedNd,
        ),
        (
            "DAD probe for B's IPv6 address",
            ndp(135, Ipv6Addr::UNSPECIFIED, b6(), A_MAC),
            DropReason::SpoofedNd,
        ),
        (
            "NS with B's MAC as its link-layer address",
            ndp(135, a6(), ip6("fd00:10:244:1::1"), B_MAC),
            DropReason::SpoofedMac,
        ),
        (
            "router advertisement from its own link-local address",
            ndp(134, ip6("fe80::ff:fe00:102"), Ipv6Addr::UNSPECIFIED, A_MAC),
            DropReason::RaGuard,
        ),
        (
            "redirect from a link-local address (the gateway's, to B)",
            ndp(137, ip6("fe80::1"), b6(), A_MAC),
            DropReason::RaGuard,
        ),
        (
            "DHCP offer from its own address",
            udp(A_MAC, MacAddr::BROADCAST, A4, 67, Ipv4Addr::BROADCAST, 68),
            DropReason::DhcpGuard,
        ),
        (
            "DHCPv6 advertise from its own link-local address",
            udp(
                A_MAC,
                B_MAC,
                ip6("fe80::ff:fe00:102"),
                547,
                ip6("fe80::ff:fe00:103"),
                546,
            ),
            DropReason::DhcpGuard,
        ),
    ]
}

#[test]
fn a_guarded_pod_cannot_take_another_pods_address_or_mac() {
    let mut n = node(true);
    victim_announces(&mut n);
    let before = beliefs(&n);
    assert_eq!(before, (Some(PB), Some(B_MAC), Some(B_MAC)));
    let attacks = attacks();
    for (what, f, reason) in &attacks {
        let (v, out) = send(&mut n, PA, f);
        assert_eq!(v, Verdict::Drop(*reason), "{what}");
        assert!(out.is_empty(), "{what}: {out:?}");
    }
    // Nothing learned from them: pod B is where it was, with its own MAC.
    assert_eq!(beliefs(&n), before);
    let s = n.dp.control().stats();
    for r in [
        DropReason::SpoofedIp,
        DropReason::SpoofedMac,
        DropReason::SpoofedArp,
        DropReason::SpoofedNd,
        DropReason::RaGuard,
        DropReason::DhcpGuard,
    ] {
        let want = attacks.iter().filter(|a| a.2 == r).count() as u64;
        assert_eq!(s.drop_count(r), want, "{r}");
    }
    assert_eq!(s.port("pod-a").unwrap().spoofed, attacks.len() as u64);
    assert_eq!(s.port("pod-b").unwrap().spoofed, 0);
    assert_eq!(
        s.accounted(),
        s.ports.iter().map(|p| p.rx_packets).sum::<u64>()
    );
}

#[test]
fn a_guarded_pods_own_traffic_passes() {
    let mut n = node(true);
    victim_announces(&mut n);
    let ll = ip6("fe80::ff:fe00:102");
    let own: Vec<(&str, Vec<u8>)> = vec![
        ("ARP for the gateway", arp(1, A_MAC, A_MAC, A4, GW)),
        (
            "ARP probe (RFC 5227)",
            arp(1, A_MAC, A_MAC, Ipv4Addr::UNSPECIFIED, A4),
        ),
        (
            "DHCP discover",
            udp(
                A_MAC,
                MacAddr::BROADCAST,
                Ipv4Addr::UNSPECIFIED,
                68,
                Ipv4Addr::BROADCAST,
                67,
            ),
        ),
        (
            "DAD of its address",
            ndp(135, Ipv6Addr::UNSPECIFIED, a6(), A_MAC),
        ),
        (
            "DAD of its link-local address",
            ndp(135, Ipv6Addr::UNSPECIFIED, ll, A_MAC),
        ),
        (
            "NS for the gateway",
            ndp(135, a6(), ip6("fd00:10:244:1::1"), A_MAC),
        ),
        ("NA for its link-local address", ndp(136, ll, ll, A_MAC)),
        (
            "router solicitation",
            ndp(133, ll, Ipv6Addr::UNSPECIFIED, A_MAC),
        ),
        (
            "DHCP request to a server",
            udp(A_MAC, MacAddr::BROADCAST, A4, 68, Ipv4Addr::BROADCAST, 67),
        ),
        ("udp to pod B", udp(A_MAC, B_MAC, A4, 4000, B4, 53)),
        (
            "udp to pod B over IPv6",
            udp(A_MAC, B_MAC, a6(), 4000, b6(), 53),
        ),
    ];
    for (what, f) in &own {
        let (v, _) = send(&mut n, PA, f);
        assert!(!matches!(v, Verdict::Drop(_)), "{what}: {v:?}");
    }
    // Pod A is learned where it is, and pod B's traffic reaches it.
    let (v, _) = send(&mut n, PB, &udp(B_MAC, A_MAC, B4, 53, A4, 4000));
    assert_eq!(v, Verdict::Output(PA));
    let s = n.dp.control().stats();
    assert!(s.drops.iter().all(|d| d.1 == 0), "{s}");
    assert_eq!(s.port("pod-a").unwrap().spoofed, 0);
}

#[test]
fn unguarded_ports_are_not_checked_and_the_same_attack_poisons_them() {
    // The same frames from an unguarded port: forwarded, learned (the test's attacks are
    // real ones), and pod C, never guarded, sends from anything.
    let mut n = node(false);
    victim_announces(&mut n);
    for (what, f, _) in attacks() {
        let (v, _) = send(&mut n, PA, &f);
        assert!(unguarded(v), "{what}: {v:?}");
    }
    let (fdb, arp, nd) = beliefs(&n);
    assert_eq!(fdb, Some(PA), "the FDB moved pod B's MAC to the attacker");
    assert_eq!(
        arp,
        Some(A_MAC),
        "the router's ARP entry for pod B is the attacker's"
    );
    assert_eq!(
        nd,
        Some(A_MAC),
        "the router's NDP entry for pod B is the attacker's"
    );
    let mut n = node(true);
    let (v, _) = send(&mut n, PC, &udp(B_MAC, GW_MAC, B4, 1, GW, 7));
    assert!(unguarded(v), "{v:?}");
    assert_eq!(n.dp.control().port_guard(PC), None);
}

#[test]
fn guards_are_set_replaced_and_taken_away_live() {
    let mut n = node(true);
    let spoof = udp(A_MAC, GW_MAC, B4, 4000, Ipv4Addr::new(10, 244, 1, 1), 7);
    assert_eq!(
        send(&mut n, PA, &spoof).0,
        Verdict::Drop(DropReason::SpoofedIp)
    );
    // Pod A gets B's address as a secondary one: allowed from the next batch on.
    let wider = PortGuard::new(A_MAC, [A4.into(), B4.into()]).unwrap();
    n.dp.control().set_port_guard(PA, Some(wider)).unwrap();
    assert_eq!(n.dp.control().port_guard(PA), Some(wider));
    assert!(unguarded(send(&mut n, PA, &spoof).0));
    n.dp.control().set_port_guard(PA, None).unwrap();
    assert_eq!(n.dp.control().port_guard(PA), None);
    let other = udp(A_MAC, GW_MAC, Ipv4Addr::new(1, 2, 3, 4), 1, GW, 7);
    assert!(unguarded(send(&mut n, PA, &other).0));
    // Only external ports on a bridge can be guarded.
    let g = PortGuard::new(A_MAC, []).unwrap();
    let gw_port = PortId(3);
    let ctl2 = n.dp.control();
    assert_eq!(ctl2.port_name(gw_port).as_deref(), Some("cni0"));
    assert!(matches!(
        ctl2.set_port_guard(gw_port, Some(g)),
        Err(ConfigError::NotGuardable { .. })
    ));
    assert_eq!(
        ctl2.set_port_guard(PortId(99), Some(g)),
        Err(ConfigError::NoSuchPort(PortId(99)))
    );
    // A removed port's guard leaves with it.
    ctl2.remove_port(PB).unwrap();
    assert_eq!(ctl2.port_guard(PB), None);
}
