//! A pod's packets across the overlay, over either underlay: what leaves A's uplink is what
//! Linux's vxlan sends, C hands the inner packet to its pod; peers come and go; the overlay's
//! MTU; bad input dropped under its own reason.

use super::*;

per_family!(
    a_pod_reaches_a_remote_pod_through_the_overlay,
    removing_a_peer_stops_traffic_both_ways_at_once,
    the_overlay_mtu_is_enforced_with_an_icmp_error,
    bad_input_is_dropped_under_its_own_reason,
    peers_are_checked,
);

fn a_pod_reaches_a_remote_pod_through_the_overlay(u: Under) {
    let (mut a, mut c) = (node(1), node(2));
    let inner = pod_udp(u, 1, a.gw_mac, u.pod(2, 2), 100);
    let (v, out) = a.run(POD, &inner);
    assert_eq!(v, Verdict::Output(ETH0));
    assert_eq!(out.len(), 1);
    let (port, wire) = &out[0];
    assert_eq!(*port, ETH0);
    // What Linux's vxlan sends: outer MACs of the uplinks, node 1 -> node 2, TTL (hop limit)
    // 64, no DF over IPv4, traffic class and flow label 0 over IPv6, UDP to 8472 from a port
    // in 32768..=60999 with a computed checksum, VXLAN I flag and VNI 1, the inner frame
    // from A's VTEP MAC to C's.
    assert_eq!(wire.len(), u.overhead() + inner.len());
    assert_eq!(&wire[..6], &c.up_mac.0);
    assert_eq!(&wire[6..12], &a.up_mac.0);
    let s = SlicedPacket::from_ethernet(wire).unwrap();
    let (src, dst) = match (u, &s.net) {
        (Under::V4, Some(NetSlice::Ipv4(ip))) => {
            let h = ip.header();
            assert!(!h.dont_fragment());
            assert_eq!(h.ttl(), 64);
            (h.source_addr().into(), h.destination_addr().into())
        }
        (Under::V6, Some(NetSlice::Ipv6(ip))) => {
            let h = ip.header();
            assert_eq!(h.hop_limit(), 64);
            assert_eq!((h.traffic_class(), h.flow_label().value()), (0, 0));
            (
                IpAddr::from(h.source_addr()),
                IpAddr::from(h.destination_addr()),
            )
        }
        _ => panic!("outer header not {u:?}: {wire:02x?}"),
    };
    assert_eq!((src, dst), (u.node_ip(1), u.node_ip(2)));
    let Some(TransportSlice::Udp(udp)) = s.transport else {
        panic!()
    };
    assert_eq!(udp.destination_port(), 8472);
    assert!((32768..=60999).contains(&udp.source_port()));
    assert_ne!(udp.checksum(), 0);
    assert!(udp_checksum_ok(wire));
    assert_eq!(&udp.payload()[..8], &[0x08, 0, 0, 0, 0, 0, 1, 0]);
    let inner_out = &udp.payload()[8..];
    assert_eq!(&inner_out[..6], &default_mac(u.pod(2, 0)).0);
    assert_eq!(&inner_out[6..12], &default_mac(u.pod(1, 0)).0);
    // The same flow keeps its source port; flows spread over source ports (Linux hashes
    // the inner flow).
    let sport = u.l4()..u.l4() + 2;
    let (_, again) = a.run(POD, &inner);
    assert_eq!(again[0].1[sport.clone()], wire[sport.clone()]);
    let mut ports = std::collections::BTreeSet::new();
    for p in 0..64u16 {
        let mut f = inner.clone();
        f[sport.clone()].copy_from_slice(&(1000 + p).to_be_bytes());
        let (_, o) = a.run(POD, &f);
        ports.insert(o[0].1[sport.clone()].to_vec());
    }
    assert!(ports.len() > 40, "source ports: {}", ports.len());

    // C decapsulates and routes to its pod, TTL (hop limit) 64 - 2. The pod's MAC was
    // never learned on C's bridge: flooded to its only port.
    let (v, out) = c.run(ETH0, wire);
    assert!(
        matches!(v, Verdict::Output(POD) | Verdict::Flood(_)),
        "{v:?}"
    );
    assert_eq!(out[0].0, POD);
    let s = SlicedPacket::from_ethernet(&out[0].1).unwrap();
    let (dst, ttl) = match s.net {
        Some(NetSlice::Ipv4(ip)) => (ip.header().destination_addr().into(), ip.header().ttl()),
        Some(NetSlice::Ipv6(ip)) => (
            IpAddr::from(ip.header().destination_addr()),
            ip.header().hop_limit(),
        ),
        _ => panic!(),
    };
    assert_eq!((dst, ttl), (u.pod(2, 2), 62));
    assert_eq!(tcp_or_udp_payload(&out[0].1), vec![0x5a; 100]);
    let t = c.dp.control().tunnel_by_name(u.tunnel()).unwrap();
    assert_eq!(t.local().is_ipv6(), u == Under::V6);
    assert_eq!(usize::from(t.mtu()), u.mtu());
    assert_eq!(t.local(), u.node_ip(2));
    let p = t.peers().by_ip(u.node_ip(1)).unwrap().stats();
    assert_eq!((p.rx_packets, p.rx_bytes), (1, inner_out.len() as u64));
    let t = a.dp.control().tunnel_by_name(u.tunnel()).unwrap();
    assert_eq!(
        t.peers().by_ip(u.node_ip(2)).unwrap().stats().tx_packets,
        66
    );

    // The other family on the same nodes still rides its own interface.
    let o = u.other();
    let (v, out) = a.run(POD, &pod_udp(o, 1, a.gw_mac, o.pod(2, 2), 20));
    assert_eq!(v, Verdict::Output(ETH0));
    assert_eq!(out[0].1.len(), o.overhead() + 14 + o.ip_len() + 8 + 20);
    let (v, _) = c.run(ETH0, &out[0].1);
    assert!(matches!(v, Verdict::Output(POD) | Verdict::Flood(_)));

    check_peer_tables(&a, u);
    // Every frame C got is accounted for.
    let st = c.dp.control().stats();
    assert_eq!(st.accounted(), 2, "{st:?}");
}

/// The UDP payload of a frame of either family.
fn tcp_or_udp_payload(frame: &[u8]) -> Vec<u8> {
    let s = SlicedPacket::from_ethernet(frame).unwrap();
    let Some(TransportSlice::Udp(u)) = s.transport else {
        panic!("not UDP")
    };
    assert!(udp_checksum_ok(frame), "inner UDP checksum");
    u.payload().to_vec()
}

fn removing_a_peer_stops_traffic_both_ways_at_once(u: Under) {
    let (mut a, mut c) = (node(1), node(2));
    let to_c = |a: &Node| pod_udp(u, 1, a.gw_mac, u.pod(2, 2), 10);
    let (_, out) = a.run(POD, &to_c(&a));
    let wire = out[0].1.clone();
    c.dp.control()
        .remove_vxlan_peer(u.tunnel(), u.node_ip(1))
        .unwrap();
    assert_eq!(
        c.run(ETH0, &wire).0,
        Verdict::Drop(DropReason::VxlanUnknownPeer)
    );
    a.dp.control()
        .remove_vxlan_peer(u.tunnel(), u.node_ip(2))
        .unwrap();
    // The route went with the peer: no route (ICMP unreachable to the pod).
    assert_eq!(a.run(POD, &to_c(&a)).0, Verdict::Drop(DropReason::NoRoute));
    assert!(a
        .dp
        .control()
        .remove_vxlan_peer(u.tunnel(), u.node_ip(2))
        .is_err());
    // And back.
    a.dp.control()
        .add_vxlan_peer(u.tunnel(), u.peer(2), a.now)
        .unwrap();
    assert_eq!(a.run(POD, &to_c(&a)).0, Verdict::Output(ETH0));
}

/// The overlay's MTU (1450 over IPv4, 1430 over IPv6): a packet of that size passes and
/// fills the underlay's 1500 bytes; one byte more gets the ICMP error of its family from
/// the gateway, naming the MTU ("fragmentation needed" for DF over IPv4, "packet too
/// big" over IPv6).
fn the_overlay_mtu_is_enforced_with_an_icmp_error(u: Under) {
    let mut a = node(1);
    let udp =
        |a: &Node, ip_size: usize| pod_udp(u, 1, a.gw_mac, u.pod(2, 2), ip_size - u.ip_len() - 8);
    let (v, out) = a.run(POD, &udp(&a, u.mtu()));
    assert_eq!(v, Verdict::Output(ETH0));
    assert_eq!(out[0].1.len(), 14 + 1500);
    let (v, out) = a.run(POD, &udp(&a, u.mtu() + 1));
    let s = SlicedPacket::from_ethernet(&out[0].1).unwrap();
    let mtu = u32::try_from(u.mtu()).unwrap();
    match (s.net, s.transport) {
        (Some(NetSlice::Ipv4(ip)), Some(TransportSlice::Icmpv4(icmp))) => {
            assert_eq!(v, Verdict::Drop(DropReason::FragNeeded));
            assert_eq!(IpAddr::from(ip.header().source_addr()), u.pod(1, 1));
            assert_eq!(
                icmp.icmp_type(),
                etherparse::Icmpv4Type::DestinationUnreachable(
                    etherparse::icmpv4::DestUnreachableHeader::FragmentationNeeded {
                        next_hop_mtu: u16::try_from(mtu).unwrap()
                    }
                )
            );
        }
        (Some(NetSlice::Ipv6(_)), Some(TransportSlice::Icmpv6(icmp))) => {
            assert_eq!(v, Verdict::Drop(DropReason::PacketTooBig));
            assert_eq!(
                icmp.icmp_type(),
                etherparse::Icmpv6Type::PacketTooBig { mtu }
            );
        }
        (n, t) => panic!("no ICMP error of {u:?}: {n:?} {t:?}"),
    }
}

/// Every way a received VXLAN datagram can be wrong, each dropped and counted under its
/// own reason; the edits keep the rest of the frame right (lengths, checksums), so each
/// case tests one fault.
fn bad_input_is_dropped_under_its_own_reason(u: Under) {
    let (mut a, mut c) = (node(1), node(2));
    let (_, out) = a.run(POD, &pod_udp(u, 1, a.gw_mac, u.pod(2, 2), 64));
    let good = out[0].1.clone();
    let (l4, vx) = (u.l4(), u.l4() + 8);
    let src = match u {
        Under::V4 => 26..30,
        Under::V6 => 22..38,
    };
    let edit = |e: &dyn Fn(&mut Vec<u8>)| {
        let mut f = good.clone();
        e(&mut f);
        fix_outer(u, &mut f);
        f
    };
    let mut cases: Vec<(Vec<u8>, DropReason)> = vec![
        (edit(&|f| f[vx] = 0x0c), DropReason::VxlanBadFlags),
        (edit(&|f| f[vx + 6] = 2), DropReason::VxlanBadVni),
        // The inner destination MAC is not this VTEP's.
        (edit(&|f| f[vx + 8] ^= 0xff), DropReason::VxlanUnknownMac),
        (
            edit(&|f| {
                f.truncate(vx + 4);
                f[l4 + 4..l4 + 6].copy_from_slice(&12u16.to_be_bytes());
            }),
            DropReason::VxlanShort,
        ),
        // A UDP length that lies (shorter than the payload).
        (
            edit(&|f| f[l4 + 4..l4 + 6].copy_from_slice(&20u16.to_be_bytes())),
            DropReason::VxlanShort,
        ),
        // Not a peer.
        (
            edit(&|f| *f[src.clone()].last_mut().unwrap() = 9),
            DropReason::VxlanUnknownPeer,
        ),
    ];
    // The payload changed under a checksum.
    let mut f = good.clone();
    *f.last_mut().unwrap() ^= 0xff;
    cases.push((f, DropReason::VxlanBadChecksum));
    // A zero UDP checksum means "none" over IPv4 (Linux's vxlan sends it so without
    // `udpcsum`), and is refused over IPv6 (RFC 6935 would need `udp6zerocsumrx`).
    let mut zero = good.clone();
    zero[l4 + 6..l4 + 8].fill(0);
    if u == Under::V6 {
        cases.push((zero, DropReason::VxlanZeroChecksum));
    } else {
        assert!(matches!(
            c.run(ETH0, &zero).0,
            Verdict::Output(POD) | Verdict::Flood(_)
        ));
    }
    for (f, r) in cases {
        let before = c.drops(r);
        assert_eq!(c.run(ETH0, &f).0, Verdict::Drop(r), "{r}");
        assert_eq!(c.drops(r), before + 1, "{r}");
    }
    assert_eq!(DropReason::VxlanZeroChecksum.name(), "vxlan_zero_checksum");
    // Another UDP port on the uplink address is not VXLAN: the router answers it (port
    // unreachable), as before.
    let other = edit(&|f| f[l4 + 2..l4 + 4].copy_from_slice(&4789u16.to_be_bytes()));
    assert_eq!(
        c.run(ETH0, &other).0,
        Verdict::Drop(DropReason::LocalNoService)
    );
    // The good one still passes; a peer removed stops its traffic at once.
    assert!(matches!(
        c.run(ETH0, &good).0,
        Verdict::Output(POD) | Verdict::Flood(_)
    ));
    c.dp.control()
        .remove_vxlan_peer(u.tunnel(), u.node_ip(1))
        .unwrap();
    assert_eq!(
        c.run(ETH0, &good).0,
        Verdict::Drop(DropReason::VxlanUnknownPeer)
    );
    let st = c.dp.control().stats();
    assert_eq!(
        st.accounted(),
        st.ports.iter().map(|p| p.rx_packets).sum::<u64>()
    );

    // Encapsulation to a MAC that is no peer's: a neighbour on the VXLAN interface with a
    // stranger's MAC and a route to it there.
    let t = a.dp.control().iface_by_name(u.tunnel()).unwrap();
    let stranger = u.pod(1, 250);
    a.dp.control()
        .add_static_neigh(t, stranger, MacAddr([2, 9, 9, 9, 9, 9]), a.now)
        .unwrap();
    add_host_route(&a, t, stranger);
    assert_eq!(
        a.run(POD, &pod_udp(u, 1, a.gw_mac, stranger, 1)).0,
        Verdict::Drop(DropReason::VxlanNoPeer)
    );
}

/// A peer is refused, naming the field, when its node address is the node's own, its pod
/// network overlaps this node's or another peer's, or its VTEP MAC is not unicast.
fn peers_are_checked(u: Under) {
    let a = node(1);
    let own = u.node_ip(1).to_string();
    for (bad, what) in [
        (
            VxlanPeer {
                node_ip: u.node_ip(1),
                ..u.peer(3)
            },
            format!("node_ip = {own}"),
        ),
        (
            VxlanPeer {
                pod_cidr: u.pod(2, 0),
                ..u.peer(3)
            },
            "overlaps".into(),
        ),
        (
            VxlanPeer {
                pod_cidr: u.pod(1, 0),
                ..u.peer(3)
            },
            "overlaps".into(),
        ),
        (
            VxlanPeer {
                vtep_mac: MacAddr::BROADCAST,
                ..u.peer(3)
            },
            "vtep_mac".into(),
        ),
    ] {
        let e =
            a.dp.control()
                .add_vxlan_peer(u.tunnel(), bad, a.now)
                .unwrap_err()
                .to_string();
        assert!(e.contains(&what), "{e}");
    }
}
