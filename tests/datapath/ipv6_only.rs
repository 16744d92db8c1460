//! Router interfaces without an IPv4 address (a single-stack IPv6 node, or an IPv6-only
//! bridge beside a dual-stack uplink), without root: the pods' gateway cni0 has only
//! fd00:10:244:1::1/64; the uplink eth0 has 172.18.0.2/24 and fd00:172:18::2/64. An
//! IPv6-only interface does NDP and ICMPv6 as any other, answers no ARP, drops IPv4 sent to
//! the router's own addresses (counted as `no_ipv4_addr`), and forwards IPv4 a route sends
//! somewhere (as Linux with `rp_filter` 0); ICMP errors about such IPv4 take the uplink's
//! address, as Linux's `inet_select_addr`. A Service with an IPv6 ClusterIP is DNAT'd there.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV6};

use etherparse::{Icmpv4Type, PacketBuilder, SlicedPacket, TransportSlice};
use tapyard::l3::{IfaceConfig, NextHop, Route, RouteProto};
use tapyard::nat::{Endpoint, NatConfig, ServiceSpec};
use tapyard::wire::family::IpProto;
use tapyard::wire::icmpv6::{Icmpv6Packet, Icmpv6Repr};
use tapyard::wire::ipv6;
use tapyard::{BridgeConfig, ConfigError, Datapath, DropReason, Instant, MacAddr, PortId, Verdict};
use tapyard_testkit::frame::ip6 as a;
use tapyard_testkit::send;

const GW_MAC: MacAddr = MacAddr([0x02, 0xaa, 0, 0, 0, 1]);
const UP_MAC: MacAddr = MacAddr([0x02, 0xaa, 0, 0, 0, 2]);
const POD_A: MacAddr = MacAddr([0x02, 0, 0, 0, 1, 2]);
const POD_B: MacAddr = MacAddr([0x02, 0, 0, 0, 1, 3]);
const PEER: MacAddr = MacAddr([0x02, 0, 0, 0, 0x12, 3]);
const PA: PortId = PortId(0);

/// The uplink's port, beside the node.
struct Uplink {
    eth0: PortId,
}

type Node = tapyard_testkit::Node<Uplink>;

fn node() -> Node {
    let mut b = Datapath::builder();
    let br = b.add_bridge(BridgeConfig::new("cni0")).unwrap();
    let pa = b.add_port("pod-a", Some(br)).unwrap();
    b.add_port("pod-b", Some(br)).unwrap();
    let gw = IfaceConfig::new("cni0", GW_MAC, a("fd00:10:244:1::1"), 64);
    assert_eq!((gw.addr, gw.addr4()), (None, None));
    let (cni0, _) = b.add_router_iface(gw, Some(br)).unwrap();
    let mut up = IfaceConfig::new("eth0", UP_MAC, Ipv4Addr::new(172, 18, 0, 2), 24);
    up.addr6 = Some((a("fd00:172:18::2"), 64));
    let (eth0_if, eth0) = b.add_router_iface(up, None).unwrap();
    b.netfilter(NatConfig::default()).unwrap();
    let dp = b.build();
    assert_eq!(pa, PA);
    let r = dp.control().router().unwrap();
    assert_eq!(r.iface_addr::<Ipv4Addr>(cni0), None);
    assert_eq!(r.iface_addr(cni0), Some((a("fd00:10:244:1::1"), 64)));
    // No IPv4 connected route for cni0 (`ip route` shows only eth0's subnet).
    let v4: Vec<String> = r
        .routes::<Ipv4Addr>()
        .routes()
        .iter()
        .map(|r| format!("{}/{}", r.prefix, r.len))
        .collect();
    assert_eq!(v4, ["172.18.0.0/24"]);
    // A `dev` route through the IPv6-only interface (Linux accepts one too).
    dp.control()
        .add_route(Route {
            prefix: Ipv4Addr::new(10, 244, 1, 0),
            len: 24,
            next_hop: NextHop::Link(cni0),
            metric: 0,
            proto: RouteProto::Static,
            src: None,
        })
        .unwrap();
    let now = Instant::from_secs(1);
    dp.control()
        .add_static_neigh(eth0_if, Ipv4Addr::new(172, 18, 0, 3), PEER, now)
        .unwrap();
    dp.control()
        .add_static_neigh(cni0, a("fd00:10:244:1::3"), POD_B, now)
        .unwrap();
    let mut n = Node::with(dp, Uplink { eth0 });
    n.now = now;
    n
}

fn udp4(dst_mac: MacAddr, src: [u8; 4], dst: [u8; 4], ttl: u8) -> Vec<u8> {
    let mut f = Vec::new();
    PacketBuilder::ethernet2(POD_A.0, dst_mac.0)
        .ipv4(src, dst, ttl)
        .udp(40000, 53)
        .write(&mut f, b"hello")
        .unwrap();
    f
}

#[test]
fn an_interface_needs_an_address_of_some_family() {
    let mut b = Datapath::builder();
    let none = IfaceConfig::new("x", GW_MAC, Ipv6Addr::UNSPECIFIED, 0);
    assert!(matches!(
        b.add_router_iface(none, None),
        Err(ConfigError::OutOfRange {
            field: "address",
            ..
        })
    ));
}

#[test]
fn ipv6_only_gateway_answers_echo6_but_no_arp() {
    let mut n = node();
    // ARP for any address on cni0: flooded to the other pod, never answered by the router.
    let mut arp = Vec::new();
    PacketBuilder::ethernet2(POD_A.0, [0xff; 6])
        .arp(
            etherparse::ArpPacket::new(
                etherparse::ArpHardwareId::ETHERNET,
                etherparse::EtherType::IPV4,
                etherparse::ArpOperation::REQUEST,
                &POD_A.0,
                &[10, 244, 1, 2],
                &[0; 6],
                &[10, 244, 1, 1],
            )
            .unwrap(),
        )
        .write(&mut arp)
        .unwrap();
    let (_, out) = send(&mut n, PA, &arp);
    assert!(
        out.iter().all(|(_, f)| f[6..12] != GW_MAC.0),
        "the router answered ARP on an IPv6-only interface: {out:?}"
    );
    assert_eq!(
        n.dp.control()
            .router()
            .unwrap()
            .counters
            .snapshot()
            .arp_replies,
        0
    );
    // ICMPv6 echo to the gateway's address is answered.
    let mut ping = Vec::new();
    PacketBuilder::ethernet2(POD_A.0, GW_MAC.0)
        .ipv6(
            a("fd00:10:244:1::2").octets(),
            a("fd00:10:244:1::1").octets(),
            64,
        )
        .icmpv6_echo_request(7, 1)
        .write(&mut ping, b"ping6")
        .unwrap();
    let (_, out) = send(&mut n, PA, &ping);
    let reply = out
        .iter()
        .find(|(p, f)| *p == PA && f[6..12] == GW_MAC.0)
        .expect("an echo reply");
    let info = ipv6::check(&reply.1[14..]).unwrap();
    let m = Icmpv6Packet::new_checked(&reply.1[14 + info.l4_off..14 + info.total_len()]).unwrap();
    assert!(matches!(
        Icmpv6Repr::parse(&m, info.src, info.dst).unwrap(),
        Icmpv6Repr::EchoReply(_)
    ));
}

/// An IPv6-only gateway announces itself with unsolicited NAs (global, then link-local
/// address; router and override flags) and no gratuitous ARP: it has no IPv4 address.
#[test]
fn ipv6_only_gateway_announces_with_nas_and_no_arp() {
    let n = node();
    let r = n.dp.control().router().unwrap();
    let cni0 = n.dp.control().iface_by_name("cni0").unwrap();
    let mut frames = Vec::new();
    r.announce(cni0, |f| frames.push(f.to_vec()));
    let mut targets = Vec::new();
    for f in &frames {
        assert_eq!(&f[..6], &[0x33, 0x33, 0, 0, 0, 1], "to all nodes");
        let info = ipv6::check(&f[14..]).unwrap();
        assert_eq!((info.hop_limit, info.dst), (255, ipv6::ALL_NODES));
        let m = Icmpv6Packet::new_checked(&f[14 + info.l4_off..14 + info.total_len()]).unwrap();
        assert!(m.verify_checksum(info.src, info.dst));
        match Icmpv6Repr::parse(&m, info.src, info.dst).unwrap() {
            Icmpv6Repr::NeighborAdvert {
                flags,
                target,
                target_lladdr,
            } => {
                assert!(flags.router && flags.override_ && !flags.solicited);
                assert_eq!((info.src, target_lladdr), (target, Some(GW_MAC)));
                targets.push(target);
            }
            other => panic!("not an NA: {other:?}"),
        }
    }
    assert_eq!(
        targets,
        [a("fd00:10:244:1::1"), ipv6::link_local_from_mac(GW_MAC)]
    );
}

#[test]
fn ipv4_to_the_router_on_an_ipv6_only_interface_is_dropped_and_counted() {
    let mut n = node();
    let (v, out) = send(
        &mut n,
        PA,
        &udp4(GW_MAC, [10, 244, 1, 2], [172, 18, 0, 2], 64),
    );
    assert_eq!(v, Verdict::Drop(DropReason::NoIpv4Addr));
    assert!(out.is_empty(), "{out:?}");
    let st = n.dp.control().stats();
    assert_eq!(st.drop_count(DropReason::NoIpv4Addr), 1);
    assert_eq!(st.accounted(), 1);
}

#[test]
fn ipv4_from_an_ipv6_only_interface_is_forwarded_and_errors_take_the_uplinks_address() {
    let mut n = node();
    // Routed: out of eth0 to the neighbour, TTL decremented.
    let (v, out) = send(
        &mut n,
        PA,
        &udp4(GW_MAC, [10, 244, 1, 2], [172, 18, 0, 3], 64),
    );
    assert!(matches!(v, Verdict::Output(_)), "{v:?}");
    let (p, f) = &out[0];
    assert_eq!((*p, &f[..6]), (n.eth0, &PEER.0[..]));
    let ip = etherparse::Ipv4HeaderSlice::from_slice(&f[14..]).unwrap();
    assert_eq!(ip.ttl(), 63);
    // TTL 1: time exceeded, from eth0's address (cni0 has none), back to pod A.
    let (v, out) = send(
        &mut n,
        PA,
        &udp4(GW_MAC, [10, 244, 1, 2], [172, 18, 0, 3], 1),
    );
    assert_eq!(v, Verdict::Drop(DropReason::TtlExpired));
    let (p, f) = out.first().expect("an ICMP time exceeded");
    assert_eq!((*p, &f[..6]), (PA, &POD_A.0[..]));
    let s = SlicedPacket::from_ethernet(f).unwrap();
    let Some(etherparse::NetSlice::Ipv4(ip)) = &s.net else {
        panic!("not IPv4")
    };
    assert_eq!(ip.header().source_addr(), Ipv4Addr::new(172, 18, 0, 2));
    assert!(matches!(
        s.transport,
        Some(TransportSlice::Icmpv4(ref i)) if matches!(i.icmp_type(), Icmpv4Type::TimeExceeded(_))
    ));
}

#[test]
fn a_service_with_an_ipv6_cluster_ip_is_dnatted_on_the_ipv6_only_bridge() {
    let mut n = node();
    let nf = n.dp.control().netfilter().unwrap();
    let vip = a("fd00:10:96::10");
    let mut web = ServiceSpec::new("web6", vip, 80, IpProto::TCP);
    web.endpoints6 = vec![Endpoint::new(
        SocketAddrV6::new(a("fd00:10:244:1::3"), 8080, 0, 0),
        true,
    )];
    nf.upsert_service(web, n.now).unwrap();
    let mut syn = Vec::new();
    PacketBuilder::ethernet2(POD_A.0, GW_MAC.0)
        .ipv6(a("fd00:10:244:1::2").octets(), vip.octets(), 64)
        .tcp(40000, 80, 1, 65535)
        .syn()
        .write(&mut syn, &[])
        .unwrap();
    let (_, out) = send(&mut n, PA, &syn);
    let (_, f) = out
        .iter()
        .find(|(_, f)| f[..6] == POD_B.0)
        .expect("the SYN DNAT'd to pod B");
    let s = SlicedPacket::from_ethernet(f).unwrap();
    let Some(etherparse::NetSlice::Ipv6(ip)) = &s.net else {
        panic!("not IPv6")
    };
    assert_eq!(ip.header().source_addr(), a("fd00:10:244:1::2"));
    assert_eq!(ip.header().destination_addr(), a("fd00:10:244:1::3"));
    let Some(TransportSlice::Tcp(t)) = &s.transport else {
        panic!("not TCP")
    };
    assert_eq!(t.destination_port(), 8080);
}
