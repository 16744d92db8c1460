//! The router without root: frames built byte by byte go into a datapath with a bridge (the
//! pods' side, gateway 10.244.1.1 on cni0) and an uplink (eth0, 172.18.0.2), and what comes out
//! is checked as a Linux router would behave.

use std::net::Ipv4Addr;
use std::time::Duration;

use etherparse::{icmpv4, Icmpv4Type, NetSlice, PacketBuilder, SlicedPacket, TransportSlice};
use tapyard::l3::IfaceConfig;
use tapyard::l3::{IfaceId, NextHop, Route, RouteProto};
use tapyard::wire::arp::ArpRepr;
use tapyard::{Batch, BridgeConfig, Datapath, DropReason, MacAddr, PacketBuf, PortId, Verdict};
use tapyard_testkit::{send, tick, Node};

const GW_MAC: MacAddr = MacAddr([0x02, 0xaa, 0, 0, 0, 1]);
const UP_MAC: MacAddr = MacAddr([0x02, 0xaa, 0, 0, 0, 2]);
const POD_A: MacAddr = MacAddr([0x02, 0, 0, 0, 1, 2]);
const PA: PortId = PortId(0);
const PB: PortId = PortId(1);
const ETH0: PortId = PortId(3);
const PEER: MacAddr = MacAddr([0x02, 0, 0, 0, 0x12, 3]);

fn node() -> Node {
    let mut b = Datapath::builder();
    let br = b.add_bridge(BridgeConfig::new("cni0")).unwrap();
    let pod_a = b.add_port("pod-a", Some(br)).unwrap();
    let pod_b = b.add_port("pod-b", Some(br)).unwrap();
    b.add_router_iface(
        IfaceConfig::new("cni0", GW_MAC, Ipv4Addr::new(10, 244, 1, 1), 24),
        Some(br),
    )
    .unwrap();
    let (eth0_if, eth0) = b
        .add_router_iface(
            IfaceConfig::new("eth0", UP_MAC, Ipv4Addr::new(172, 18, 0, 2), 24),
            None,
        )
        .unwrap();
    let dp = b.build();
    let st = |p: [u8; 4], len, nh| Route {
        prefix: Ipv4Addr::from(p),
        len,
        next_hop: nh,
        metric: 0,
        proto: RouteProto::Static,
        src: None,
    };
    dp.control()
        .add_route(st(
            [10, 244, 2, 0],
            24,
            NextHop::Via(eth0_if, Ipv4Addr::new(172, 18, 0, 3)),
        ))
        .unwrap();
    dp.control()
        .add_route(st([10, 244, 9, 0], 24, NextHop::Blackhole))
        .unwrap();
    dp.control()
        .add_route(st([10, 244, 8, 0], 24, NextHop::Unreachable))
        .unwrap();
    dp.control()
        .add_route(st([10, 244, 7, 0], 24, NextHop::Prohibit))
        .unwrap();
    assert!(dp
        .control()
        .add_route(st(
            [10, 9, 0, 0],
            16,
            NextHop::Via(eth0_if, Ipv4Addr::new(10, 0, 0, 1))
        ))
        .unwrap_err()
        .to_string()
        .contains("not on a connected subnet"));
    assert_eq!((pod_a, pod_b, eth0), (PA, PB, ETH0));
    Node::new(dp)
}

fn arp(op: u16, sha: MacAddr, spa: [u8; 4], tha: MacAddr, tpa: [u8; 4], dst: MacAddr) -> Vec<u8> {
    let mut f = [0u8; 60];
    let n = ArpRepr {
        operation: op,
        sha,
        spa: spa.into(),
        tha,
        tpa: tpa.into(),
    }
    .write_frame(sha, dst, &mut f)
    .unwrap();
    f[..n].to_vec()
}

fn udp(
    src_mac: MacAddr,
    dst_mac: MacAddr,
    src: [u8; 4],
    dst: [u8; 4],
    ttl: u8,
    len: usize,
) -> Vec<u8> {
    let mut f = Vec::new();
    PacketBuilder::ethernet2(src_mac.0, dst_mac.0)
        .ipv4(src, dst, ttl)
        .udp(33434, 33434)
        .write(&mut f, &vec![7u8; len])
        .unwrap();
    f
}

fn icmp_of(f: &[u8]) -> (Ipv4Addr, Ipv4Addr, Icmpv4Type) {
    let p = SlicedPacket::from_ethernet(f).unwrap();
    let Some(NetSlice::Ipv4(ip)) = p.net else {
        panic!("not IPv4")
    };
    let Some(TransportSlice::Icmpv4(i)) = p.transport else {
        panic!("not ICMP")
    };
    (
        ip.header().source_addr(),
        ip.header().destination_addr(),
        i.icmp_type(),
    )
}

/// Pod A announces itself (ARP for its gateway) so the bridge and the router know it.
fn pod_a_arps(n: &mut Node) -> Vec<(PortId, Vec<u8>)> {
    let (_, out) = send(
        n,
        PA,
        &arp(
            1,
            POD_A,
            [10, 244, 1, 2],
            MacAddr::ZERO,
            [10, 244, 1, 1],
            MacAddr::BROADCAST,
        ),
    );
    out
}

#[test]
fn answers_arp_and_ping_for_its_address() {
    let mut n = node();
    let out = pod_a_arps(&mut n);
    // The request is flooded to pod-b, and the gateway's reply goes to pod-a only.
    let reply: Vec<_> = out.iter().filter(|(p, _)| *p == PA).collect();
    assert_eq!(reply.len(), 1);
    let a = ArpRepr::parse_bytes(&reply[0].1[14..]).unwrap();
    assert_eq!(
        (a.operation, a.sha, a.spa),
        (2, GW_MAC, Ipv4Addr::new(10, 244, 1, 1))
    );
    assert!(out.iter().any(|(p, _)| *p == PB));
    // Ping the gateway.
    let mut f = Vec::new();
    PacketBuilder::ethernet2(POD_A.0, GW_MAC.0)
        .ipv4([10, 244, 1, 2], [10, 244, 1, 1], 64)
        .icmpv4_echo_request(1, 1)
        .write(&mut f, b"hello")
        .unwrap();
    let (_, out) = send(&mut n, PA, &f);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0, PA);
    let (s, d, t) = icmp_of(&out[0].1);
    assert_eq!(
        (s, d),
        (Ipv4Addr::new(10, 244, 1, 1), Ipv4Addr::new(10, 244, 1, 2))
    );
    assert!(matches!(t, Icmpv4Type::EchoReply(_)));
    let mut neigh = String::new();
    n.dp.control().fmt_neigh(n.now, &mut neigh).unwrap();
    assert!(
        neigh.contains("10.244.1.2 dev cni0 lladdr 02:00:00:00:01:02"),
        "{neigh}"
    );
    // Nothing can be received on the gateway's virtual bridge port (it has no driver).
    let (v, out) = send(&mut n, PortId(2), &f);
    assert_eq!(v, Verdict::Drop(DropReason::UnknownPort));
    assert!(out.is_empty());
}

#[test]
fn routes_to_another_node_after_resolving_the_gateway() {
    let mut n = node();
    pod_a_arps(&mut n);
    let pkt = udp(POD_A, GW_MAC, [10, 244, 1, 2], [10, 244, 2, 7], 64, 100);
    let (v, out) = send(&mut n, PA, &pkt);
    assert_eq!(v, Verdict::Queued);
    // An ARP request for the gateway 172.18.0.3 goes out of eth0.
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0, ETH0);
    let req = ArpRepr::parse_bytes(&out[0].1[14..]).unwrap();
    assert_eq!(
        (req.operation, req.spa, req.tpa),
        (
            1,
            Ipv4Addr::new(172, 18, 0, 2),
            Ipv4Addr::new(172, 18, 0, 3)
        )
    );
    // The gateway answers; the queued packet leaves with the right MACs and TTL 63.
    let (_, out) = send(
        &mut n,
        ETH0,
        &arp(2, PEER, [172, 18, 0, 3], UP_MAC, [172, 18, 0, 2], UP_MAC),
    );
    assert_eq!(out.len(), 1);
    let (p, f) = &out[0];
    assert_eq!(*p, ETH0);
    assert_eq!(&f[0..6], &PEER.0);
    assert_eq!(&f[6..12], &UP_MAC.0);
    assert_eq!(f[14 + 8], 63);
    assert_eq!(tapyard::wire::ipv4::check_header(&f[14..]).unwrap().ttl, 63);
    assert_eq!(&f[34..], &pkt[34..], "payload untouched");
    // Later packets go straight through.
    let (v, out) = send(&mut n, PA, &pkt);
    assert_eq!(v, Verdict::Output(ETH0));
    assert_eq!(out.len(), 1);
    // And the way back: from the peer to pod A (resolved from pod A's earlier ARP).
    let back = udp(PEER, UP_MAC, [10, 244, 2, 7], [10, 244, 1, 2], 64, 10);
    let (v, out) = send(&mut n, ETH0, &back);
    assert_eq!(v, Verdict::Output(PA), "{out:?}");
    assert_eq!(&out[0].1[0..6], &POD_A.0);
    assert_eq!(&out[0].1[6..12], &GW_MAC.0);
}

#[test]
fn icmp_errors_like_linux() {
    let mut n = node();
    pod_a_arps(&mut n);
    // TTL 1: time exceeded from the gateway address (what traceroute shows).
    let (v, out) = send(
        &mut n,
        PA,
        &udp(POD_A, GW_MAC, [10, 244, 1, 2], [10, 244, 2, 7], 1, 20),
    );
    assert_eq!(v, Verdict::Drop(DropReason::TtlExpired));
    let (s, d, t) = icmp_of(&out[0].1);
    assert_eq!(
        (s, d),
        (Ipv4Addr::new(10, 244, 1, 1), Ipv4Addr::new(10, 244, 1, 2))
    );
    assert_eq!(
        t,
        Icmpv4Type::TimeExceeded(icmpv4::TimeExceededCode::TtlExceededInTransit)
    );
    // No route: net unreachable.
    let (v, out) = send(
        &mut n,
        PA,
        &udp(POD_A, GW_MAC, [10, 244, 1, 2], [192, 0, 2, 1], 64, 20),
    );
    assert_eq!(v, Verdict::Drop(DropReason::NoRoute));
    assert_eq!(
        icmp_of(&out[0].1).2,
        Icmpv4Type::DestinationUnreachable(icmpv4::DestUnreachableHeader::Network)
    );
    // Blackhole: silent.
    let (v, out) = send(
        &mut n,
        PA,
        &udp(POD_A, GW_MAC, [10, 244, 1, 2], [10, 244, 9, 1], 64, 20),
    );
    assert_eq!(v, Verdict::Drop(DropReason::Blackhole));
    assert!(out.is_empty());
    // Unreachable route: host unreachable, as Linux's `unreachable` type.
    let (v, out) = send(
        &mut n,
        PA,
        &udp(POD_A, GW_MAC, [10, 244, 1, 2], [10, 244, 8, 1], 64, 20),
    );
    assert_eq!(v, Verdict::Drop(DropReason::Unreachable));
    assert_eq!(
        icmp_of(&out[0].1).2,
        Icmpv4Type::DestinationUnreachable(icmpv4::DestUnreachableHeader::Host)
    );
    // Prohibit route: communication administratively prohibited (code 13), as Linux's
    // `prohibit` type.
    let (v, out) = send(
        &mut n,
        PA,
        &udp(POD_A, GW_MAC, [10, 244, 1, 2], [10, 244, 7, 1], 64, 20),
    );
    assert_eq!(v, Verdict::Drop(DropReason::Unreachable));
    assert_eq!(
        icmp_of(&out[0].1).2,
        Icmpv4Type::DestinationUnreachable(icmpv4::DestUnreachableHeader::FilterProhibited)
    );
    // Too big with DF: fragmentation needed carrying the MTU.
    let mut f = Vec::new();
    let mut ip = etherparse::Ipv4Header::new(
        8 + 2000,
        64,
        etherparse::IpNumber::UDP,
        [10, 244, 1, 2],
        [10, 244, 1, 3],
    )
    .unwrap();
    ip.dont_fragment = true;
    PacketBuilder::ethernet2(POD_A.0, GW_MAC.0)
        .ip(etherparse::IpHeaders::Ipv4(ip, Default::default()))
        .udp(1, 2)
        .write(&mut f, &[0u8; 2000])
        .unwrap();
    let (v, out) = send(&mut n, PA, &f);
    assert_eq!(v, Verdict::Drop(DropReason::FragNeeded));
    assert_eq!(
        icmp_of(&out[0].1).2,
        Icmpv4Type::DestinationUnreachable(icmpv4::DestUnreachableHeader::FragmentationNeeded {
            next_hop_mtu: 1500
        })
    );
    // A bad header checksum is dropped and counted, nothing sent.
    let mut bad = udp(POD_A, GW_MAC, [10, 244, 1, 2], [10, 244, 2, 7], 64, 20);
    bad[24] ^= 0xff;
    let (v, out) = send(&mut n, PA, &bad);
    assert_eq!(v, Verdict::Drop(DropReason::BadIpChecksum));
    assert!(out.is_empty());
}

#[test]
fn unresolved_next_hop_fails_with_host_unreachable() {
    let mut n = node();
    pod_a_arps(&mut n);
    let (v, out) = send(
        &mut n,
        PA,
        &udp(POD_A, GW_MAC, [10, 244, 1, 2], [10, 244, 1, 99], 64, 20),
    );
    assert_eq!(v, Verdict::Queued);
    // The ARP request for 10.244.1.99 is flooded on the bridge (pods a and b).
    assert_eq!(out.len(), 2);
    let mut requests = 1;
    let mut unreachable = Vec::new();
    for _ in 0..40 {
        for (_, f) in tick(&mut n, Duration::from_millis(100)) {
            if f[12..14] == [0x08, 0x06] {
                requests += 1;
            } else {
                unreachable.push(f);
            }
        }
    }
    // Three solicitations in all (1 s apart), each flooded to two ports, then failure.
    assert_eq!(requests, 1 + 2 * 2);
    assert_eq!(unreachable.len(), 1);
    let (s, d, t) = icmp_of(&unreachable[0]);
    assert_eq!(
        (s, d),
        (Ipv4Addr::new(10, 244, 1, 1), Ipv4Addr::new(10, 244, 1, 2))
    );
    assert_eq!(
        t,
        Icmpv4Type::DestinationUnreachable(icmpv4::DestUnreachableHeader::Host)
    );
    let st = n.dp.control().stats();
    assert_eq!(st.drop_count(DropReason::NeighFailed), 1, "{st}");
    let mut neigh = String::new();
    n.dp.control().fmt_neigh(n.now, &mut neigh).unwrap();
    assert!(neigh.contains("10.244.1.99 dev cni0  FAILED"), "{neigh}");
}

#[test]
fn route_dump_like_ip_route() {
    let n = node();
    let mut s = String::new();
    n.dp.control().fmt_routes(&mut s).unwrap();
    assert_eq!(
        s,
        "10.244.1.0/24 dev cni0 proto kernel scope link src 10.244.1.1\n\
         10.244.2.0/24 via 172.18.0.3 dev eth0\n\
         prohibit 10.244.7.0/24\n\
         unreachable 10.244.8.0/24\n\
         blackhole 10.244.9.0/24\n\
         172.18.0.0/24 dev eth0 proto kernel scope link src 172.18.0.2\n"
    );
    let _ = IfaceId(0);
}

#[test]
fn tso_super_frames_are_checked_by_segment_size() {
    let mut n = node();
    pod_a_arps(&mut n);
    // Pod B (10.244.1.3) is known to the router through a static entry.
    n.dp.control()
        .add_static_neigh(
            IfaceId(0),
            Ipv4Addr::new(10, 244, 1, 3),
            MacAddr([2, 0, 0, 0, 1, 3]),
            n.now,
        )
        .unwrap();
    let mut f = Vec::new();
    let ip = etherparse::Ipv4Header::new(
        20 + 7000,
        64,
        etherparse::IpNumber::TCP,
        [10, 244, 1, 2],
        [10, 244, 1, 3],
    )
    .unwrap();
    let mut ip = ip;
    ip.dont_fragment = true;
    PacketBuilder::ethernet2(POD_A.0, GW_MAC.0)
        .ip(etherparse::IpHeaders::Ipv4(ip, Default::default()))
        .tcp(1, 2, 100, 1000)
        .write(&mut f, &[0u8; 7000])
        .unwrap();
    let mut batch = Batch::new();
    let mut b = PacketBuf::from_frame(&f);
    b.port = PA;
    b.offload.gso_type = tapyard::offload::VIRTIO_NET_HDR_GSO_TCPV4;
    b.offload.gso_size = 1448;
    batch.push(b).unwrap();
    n.dp.process(&mut n.w, n.now, &mut batch);
    // 20 + 20 + 1448 fits a 1500 MTU: routed whole, segmented later by the egress port
    // (flooded on the bridge, which has not heard from pod B yet).
    assert_eq!(batch.verdicts()[0], Verdict::Flood(tapyard::BridgeId(0)));
    batch.recycle(&mut n.w.pool);
    // Without the offload metadata, the same 7 KB datagram with DF needs fragmentation.
    let (v, _) = send(&mut n, PA, &f);
    assert_eq!(v, Verdict::Drop(DropReason::FragNeeded));
}

#[test]
fn proxy_arp_answers_for_addresses_routed_elsewhere() {
    // Calico-style: the pod's interface answers ARP for anything routed out of another
    // interface, and not for addresses on the pod's own link.
    let mut b = Datapath::builder();
    let br = b.add_bridge(BridgeConfig::new("cni0")).unwrap();
    let pod = b.add_port("pod-a", Some(br)).unwrap();
    let mut cfg = IfaceConfig::new("cni0", GW_MAC, Ipv4Addr::new(10, 244, 1, 1), 24);
    cfg.proxy_arp = true;
    b.add_router_iface(cfg, Some(br)).unwrap();
    b.add_router_iface(
        IfaceConfig::new("eth0", UP_MAC, Ipv4Addr::new(172, 18, 0, 2), 24),
        None,
    )
    .unwrap();
    let dp = b.build();
    let mut n = Node::new(dp);
    let ask = |t: [u8; 4]| {
        arp(
            1,
            POD_A,
            [10, 244, 1, 2],
            MacAddr::ZERO,
            t,
            MacAddr::BROADCAST,
        )
    };
    let (_, out) = send(&mut n, pod, &ask([172, 18, 0, 9]));
    let replies: Vec<_> = out.iter().filter(|(_, f)| f[12..14] == [8, 6]).collect();
    assert_eq!(replies.len(), 1, "{out:?}");
    let a = ArpRepr::parse_bytes(&replies[0].1[14..]).unwrap();
    assert_eq!(
        (a.operation, a.sha, a.spa),
        (2, GW_MAC, Ipv4Addr::new(172, 18, 0, 9))
    );
    // On-link address: the pod itself must answer, not the proxy.
    let (_, out) = send(&mut n, pod, &ask([10, 244, 1, 7]));
    assert!(out.is_empty(), "{out:?}");
    // Unrouted address: no answer.
    let (_, out) = send(&mut n, pod, &ask([192, 0, 2, 1]));
    assert!(out.is_empty(), "{out:?}");
}

/// A batch with several packets to one destination (one flow) shares the route and neighbour
/// lookups, but each packet is still judged on its own: TTL, size and DF per packet.
#[test]
fn a_flow_in_one_batch_is_judged_packet_by_packet() {
    let mut n = node();
    pod_a_arps(&mut n);
    // Resolve the uplink gateway first.
    let ok = udp(POD_A, GW_MAC, [10, 244, 1, 2], [10, 244, 2, 7], 64, 100);
    assert_eq!(send(&mut n, PA, &ok).0, Verdict::Queued);
    send(
        &mut n,
        ETH0,
        &arp(2, PEER, [172, 18, 0, 3], UP_MAC, [172, 18, 0, 2], UP_MAC),
    );
    let expiring = udp(POD_A, GW_MAC, [10, 244, 1, 2], [10, 244, 2, 7], 1, 100);
    let mut big = udp(POD_A, GW_MAC, [10, 244, 1, 2], [10, 244, 2, 7], 64, 1600);
    // Set DF on the big one and fix its header checksum.
    let mut ip = tapyard::wire::ipv4::Ipv4Packet::new_checked(&mut big[14..]).unwrap();
    ip.set_frag_field(ip.frag_field() | tapyard::wire::ipv4::DF);
    ip.fill_checksum();
    let local = udp(POD_A, GW_MAC, [10, 244, 1, 2], [10, 244, 1, 1], 64, 10);
    let mut batch = Batch::new();
    for f in [&ok, &expiring, &ok, &big, &ok, &local, &ok] {
        let mut b = PacketBuf::from_frame(f);
        b.port = PA;
        batch.push(b).unwrap();
    }
    n.dp.process(&mut n.w, n.now, &mut batch);
    let v = &batch.verdicts()[..7];
    assert_eq!(
        v,
        &[
            Verdict::Output(ETH0),
            Verdict::Drop(DropReason::TtlExpired),
            Verdict::Output(ETH0),
            Verdict::Drop(DropReason::FragNeeded),
            Verdict::Output(ETH0),
            // UDP to the router itself: port unreachable, as Linux.
            Verdict::Drop(DropReason::LocalNoService),
            Verdict::Output(ETH0),
        ]
    );
    // Every forwarded copy left with TTL 63 and the gateway's MAC.
    for (i, b) in batch.bufs()[..7].iter().enumerate() {
        if v[i] == Verdict::Output(ETH0) {
            assert_eq!(&b.frame()[0..6], &PEER.0);
            assert_eq!(b.frame()[14 + 8], 63);
        }
    }
    batch.recycle(&mut n.w.pool);
}

/// An ARP frame the router refuses is counted under `bad_arp`, never as `local` (it used to
/// be: every frame not forwarded is counted under its reason): a truncated or non-IPv4 ARP
/// packet, an unknown operation, a sender MAC other than the frame's source, a sender
/// claiming the gateway's address; unicast to the gateway on the bridge and on the uplink.
/// A well-formed request is still `local`.
#[test]
fn refused_arp_frames_are_counted_as_bad_arp() {
    let mut n = node();
    pod_a_arps(&mut n);
    let gw_ip = [10, 244, 1, 1];
    let good = arp(1, POD_A, [10, 244, 1, 2], MacAddr::ZERO, gw_ip, GW_MAC);
    let mut truncated = good.clone();
    truncated.truncate(14 + 20);
    let mut not_ipv4 = good.clone();
    not_ipv4[14 + 2..14 + 4].copy_from_slice(&[0x86, 0xdd]); // protocol type IPv6
    let mut bad_op = good.clone();
    bad_op[14 + 7] = 9;
    let mut other_sha = good.clone();
    other_sha[14 + 8..14 + 14].copy_from_slice(&[2, 0, 0, 0, 9, 9]);
    let claims_gw = arp(2, POD_A, gw_ip, GW_MAC, gw_ip, GW_MAC);
    let peer = |mut f: Vec<u8>| {
        f[..6].copy_from_slice(&UP_MAC.0);
        f[6..12].copy_from_slice(&PEER.0);
        f[14 + 8..14 + 14].copy_from_slice(&PEER.0);
        f
    };
    let cases: Vec<(&str, PortId, Vec<u8>)> = vec![
        ("truncated", PA, truncated.clone()),
        ("protocol type not IPv4", PA, not_ipv4),
        ("operation 9", PA, bad_op),
        ("sender MAC not the frame's source", PA, other_sha),
        ("sender claims the gateway's address", PA, claims_gw),
        ("truncated, on the uplink", ETH0, peer(truncated)),
    ];
    for (what, port, f) in cases {
        let before = n.dp.control().stats();
        let (v, out) = send(&mut n, port, &f);
        let after = n.dp.control().stats();
        assert_eq!(v, Verdict::Drop(DropReason::BadArp), "{what}");
        assert!(out.is_empty(), "{what}: nothing answers it");
        assert_eq!(after.local, before.local, "{what}: not counted as local");
        assert_eq!(
            after.drop_count(DropReason::BadArp),
            before.drop_count(DropReason::BadArp) + 1,
            "{what}"
        );
        let rx: u64 = after.ports.iter().map(|p| p.rx_packets).sum();
        assert_eq!(after.accounted(), rx, "{what}");
    }
    // A good unicast request to the gateway is consumed and answered.
    let before = n.dp.control().stats();
    let (v, out) = send(&mut n, PA, &good);
    assert_eq!(v, Verdict::Local);
    assert_eq!(out.len(), 1);
    assert_eq!(n.dp.control().stats().local, before.local + 1);
}

/// A ping to the gateway is answered, and counted as the router's: the request is `local`
/// (consumed, as an answered ARP request), the reply `generated`; nothing is `forwarded`
/// (it used to be: the request was rewritten in place into the reply and counted as a
/// forwarded frame).
#[test]
fn an_answered_ping_is_counted_local_not_forwarded() {
    let mut n = node();
    pod_a_arps(&mut n);
    let mut f = Vec::new();
    PacketBuilder::ethernet2(POD_A.0, GW_MAC.0)
        .ipv4([10, 244, 1, 2], [10, 244, 1, 1], 64)
        .icmpv4_echo_request(7, 1)
        .write(&mut f, b"hello")
        .unwrap();
    let before = n.dp.control().stats();
    let (v, out) = send(&mut n, PA, &f);
    let after = n.dp.control().stats();
    assert_eq!(v, Verdict::Local);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0, PA);
    assert_eq!(&out[0].1[..6], &POD_A.0);
    let (s, d, t) = icmp_of(&out[0].1);
    assert_eq!(
        (s, d),
        (Ipv4Addr::new(10, 244, 1, 1), Ipv4Addr::new(10, 244, 1, 2))
    );
    assert!(matches!(t, Icmpv4Type::EchoReply(_)));
    assert_eq!(after.local, before.local + 1);
    assert_eq!(after.forwarded, before.forwarded);
    assert_eq!(after.generated, before.generated + 1);
    let rx: u64 = after.ports.iter().map(|p| p.rx_packets).sum();
    assert_eq!(after.accounted(), rx);
}
