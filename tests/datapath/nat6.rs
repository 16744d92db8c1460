//! IPv6 conntrack and NAT without root, as tests/datapath/nat.rs for IPv4: a dual-stack Kubernetes-like
//! node (pods on cni0 fd00:10:244:1::/64, an uplink eth0 fd00:172:18::2/64 to node B's pods
//! fd00:10:244:2::/64 and a default gateway), with IPv6 and dual-stack Services, IPv6
//! masquerade and NodePorts; frames built with etherparse go in, and what comes out is checked
//! as kube-proxy's ip6tables rules on a Linux node would make it, every checksum recomputed
//! from scratch.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV4, SocketAddrV6};
use std::path::{Path, PathBuf};

use etherparse::{Icmpv6Type, NetSlice, PacketBuilder, SlicedPacket, TransportSlice};
use tapyard::l3::{IfaceConfig, NextHop, Route, RouteProto};
use tapyard::nat::{Endpoint, NatConfig, NatRules};
use tapyard::nat::{LbAlgo, MasqueradeRule, PortRange, Prefix, ServiceSpec, SnatRule};
use tapyard::wire::family::IpProto;
use tapyard::{BridgeConfig, Clock, Datapath, DropReason, Instant, MacAddr, PortId, Verdict};
use tapyard_testkit::frame::ip6 as a;
use tapyard_testkit::frame::{self, tcp, udp, SYN, SYNACK};
use tapyard_testkit::{one, send, Node};

const GW_MAC: MacAddr = MacAddr([0x02, 0xaa, 0, 0, 0, 1]);
const UP_MAC: MacAddr = MacAddr([0x02, 0xaa, 0, 0, 0, 2]);
const POD_A: MacAddr = MacAddr([0x02, 0, 0, 0, 1, 2]);
const POD_B: MacAddr = MacAddr([0x02, 0, 0, 0, 1, 3]);
const PEER: MacAddr = MacAddr([0x02, 0, 0, 0, 0x12, 3]);
const OUTGW: MacAddr = MacAddr([0x02, 0, 0, 0, 0x12, 1]);
const PA: PortId = PortId(0);
const PB: PortId = PortId(1);
const ETH0: PortId = PortId(3);

const A: &str = "fd00:10:244:1::2";
const B: &str = "fd00:10:244:1::3";
const REMOTE: &str = "fd00:10:244:2::2";
const GW: &str = "fd00:10:244:1::1";
const NODE: &str = "fd00:172:18::2";
const WEB: &str = "fd00:10:96::10";
const DNS: &str = "fd00:10:96::53";
const SELF_SVC: &str = "fd00:10:96::11";
const EMPTY: &str = "fd00:10:96::99";
const DUAL: &str = "fd00:10:96::20";
const OUTSIDE: &str = "2001:db8::10";
const CLIENT: &str = "2001:db8::20";

const A4: [u8; 4] = [10, 244, 1, 2];
const B4: [u8; 4] = [10, 244, 1, 3];
const DUAL4: [u8; 4] = [10, 96, 0, 20];

fn ep6(ip: &str, port: u16, local: bool) -> Endpoint<Ipv6Addr> {
    Endpoint::new(SocketAddrV6::new(a(ip), port, 0, 0), local)
}

fn node() -> Node {
    node_at(None)
}

/// The node, its connection tables in `file` (and `file` + "6") when given.
fn node_at(file: Option<&Path>) -> Node {
    let mut b = Datapath::builder();
    let now = match file {
        Some(f) => {
            let now = Clock::new().now();
            b.conntrack_file(f, now);
            now
        }
        None => Instant::from_secs(1),
    };
    let br = b.add_bridge(BridgeConfig::new("cni0")).unwrap();
    assert_eq!(b.add_port("pod-a", Some(br)).unwrap(), PA);
    assert_eq!(b.add_port("pod-b", Some(br)).unwrap(), PB);
    let mut c0 = IfaceConfig::new("cni0", GW_MAC, Ipv4Addr::new(10, 244, 1, 1), 24);
    c0.addr6 = Some((a(GW), 64));
    let (cni0, _) = b.add_router_iface(c0, Some(br)).unwrap();
    let mut up = IfaceConfig::new("eth0", UP_MAC, Ipv4Addr::new(172, 18, 0, 2), 24);
    up.addr6 = Some((a(NODE), 64));
    let (eth0, port) = b.add_router_iface(up, None).unwrap();
    assert_eq!(port, ETH0);
    let cluster = Prefix::new(a("fd00:10:244::"), 56);
    b.netfilter(NatConfig {
        rules: NatRules {
            cluster_cidr6: Some(cluster),
            masquerade6: vec![MasqueradeRule {
                out: eth0,
                src: Some(cluster),
                except_dst: Some(cluster),
            }],
            ..NatRules::default()
        },
        ..NatConfig::default()
    })
    .unwrap();
    let dp = b.build();
    let route = |p: &str, len, next_hop| Route {
        prefix: a(p),
        len,
        next_hop,
        metric: 1024,
        proto: RouteProto::Static,
        src: None,
    };
    dp.control()
        .add_route(route(
            "fd00:10:244:2::",
            64,
            NextHop::Via(eth0, a("fd00:172:18::3")),
        ))
        .unwrap();
    dp.control()
        .add_route(route("::", 0, NextHop::Via(eth0, a("fd00:172:18::1"))))
        .unwrap();
    for (iface, ip, mac) in [
        (cni0, A, POD_A),
        (cni0, B, POD_B),
        (eth0, "fd00:172:18::3", PEER),
        (eth0, "fd00:172:18::1", OUTGW),
    ] {
        dp.control()
            .add_static_neigh(iface, a(ip), mac, now)
            .unwrap();
    }
    for (ip, mac) in [(A4, POD_A), (B4, POD_B)] {
        dp.control()
            .add_static_neigh(cni0, std::net::IpAddr::from(ip), mac, now)
            .unwrap();
    }
    let nf = dp.control().netfilter().unwrap();
    let mut web = ServiceSpec::new("web6", a(WEB), 80, IpProto::TCP);
    web.node_port = Some(30080);
    web.endpoints6 = vec![ep6(B, 8080, true), ep6(REMOTE, 8080, false)];
    nf.upsert_service(web, now).unwrap();
    let mut local = ServiceSpec::new("web6-local", a("fd00:10:96::12"), 80, IpProto::TCP);
    local.node_port = Some(30081);
    local.external_local = true;
    local.endpoints6 = vec![ep6(B, 8080, true), ep6(REMOTE, 8080, false)];
    nf.upsert_service(local, now).unwrap();
    let mut dns = ServiceSpec::new("dns6", a(DNS), 53, IpProto::UDP);
    dns.endpoints6 = vec![ep6(B, 5353, true)];
    nf.upsert_service(dns, now).unwrap();
    let mut me = ServiceSpec::new("self6", a(SELF_SVC), 80, IpProto::TCP);
    me.endpoints6 = vec![ep6(B, 8080, true)];
    me.algo = LbAlgo::Maglev;
    nf.upsert_service(me, now).unwrap();
    nf.upsert_service(ServiceSpec::new("empty6", a(EMPTY), 80, IpProto::TCP), now)
        .unwrap();
    nf.upsert_service(
        ServiceSpec::new("empty6-udp", a(EMPTY), 53, IpProto::UDP),
        now,
    )
    .unwrap();
    let mut dual = ServiceSpec::new("dual", Ipv4Addr::from(DUAL4), 80, IpProto::TCP);
    dual.vip6 = Some(a(DUAL));
    dual.endpoints = vec![Endpoint::new(SocketAddrV4::new(B4.into(), 8081), true)];
    dual.endpoints6 = vec![ep6(B, 8082, true)];
    nf.upsert_service(dual, now).unwrap();
    if file.is_some() {
        let nf = dp.control().netfilter().unwrap();
        nf.services().relink(nf.conntrack(), now);
        nf.services().relink(nf.conntrack_of::<Ipv6Addr>(), now);
    }
    let mut n = Node::with(dp, ());
    n.now = now;
    for (p, mac) in [(PA, POD_A), (PB, POD_B)] {
        n.announce(p, mac);
    }
    n
}

/// What a frame carries: (src, sport, dst, dport) for TCP/UDP over IPv6, every checksum
/// checked.
fn flow(f: &[u8]) -> (Ipv6Addr, u16, Ipv6Addr, u16) {
    frame::flow(f)
}

#[test]
fn pod_to_ipv6_cluster_ip_spreads_keeps_the_client_and_replies_come_from_the_cluster_ip() {
    let mut n = node();
    let mut seen = [0u32; 2];
    for sport in 40000..40040u16 {
        let (_, out) = send(&mut n, PA, &tcp(POD_A, GW_MAC, A, sport, WEB, 80, SYN));
        let (port, f) = one(&out);
        let (src, sp, dst, dp) = flow(f);
        assert_eq!((src, sp, dp), (a(A), sport, 8080), "client address kept");
        match port {
            PB => {
                assert_eq!(dst, a(B));
                seen[0] += 1;
                // The reply is un-NAT'd: it comes from the ClusterIP.
                let (_, back) = send(&mut n, PB, &tcp(POD_B, GW_MAC, B, 8080, A, sport, SYNACK));
                let (p, f) = one(&back);
                assert_eq!(p, PA);
                assert_eq!(flow(f), (a(WEB), 80, a(A), sport));
            }
            ETH0 => {
                assert_eq!(dst, a(REMOTE));
                seen[1] += 1;
                let (_, back) = send(
                    &mut n,
                    ETH0,
                    &tcp(PEER, UP_MAC, REMOTE, 8080, A, sport, SYNACK),
                );
                let (p, f) = one(&back);
                assert_eq!(p, PA);
                assert_eq!(flow(f), (a(WEB), 80, a(A), sport));
            }
            p => panic!("out on {p:?}"),
        }
    }
    assert!(seen[0] > 5 && seen[1] > 5, "{seen:?}");
    let c = n.dp.control().netfilter().unwrap().counters();
    assert_eq!(c.dnat, 40);
}

#[test]
fn hairpin_is_masqueraded_to_the_gateway_address() {
    let mut n = node();
    let (_, out) = send(&mut n, PB, &tcp(POD_B, GW_MAC, B, 41000, SELF_SVC, 80, SYN));
    let (p, f) = one(&out);
    assert_eq!(p, PB);
    let (src, sp, dst, dp) = flow(f);
    assert_eq!(
        (src, dst, dp),
        (a(GW), a(B), 8080),
        "hairpin: source is cni0's address"
    );
    let (_, back) = send(&mut n, PB, &tcp(POD_B, GW_MAC, B, 8080, GW, sp, SYNACK));
    let (p, f) = one(&back);
    assert_eq!(p, PB);
    assert_eq!(flow(f), (a(SELF_SVC), 80, a(B), 41000));
}

#[test]
fn node_port_cluster_masquerades_and_local_keeps_the_client() {
    let mut n = node();
    let mut ports = std::collections::HashSet::new();
    for sport in 50000..50030u16 {
        let (_, out) = send(
            &mut n,
            ETH0,
            &tcp(OUTGW, UP_MAC, CLIENT, sport, NODE, 30080, SYN),
        );
        let (p, f) = one(&out);
        let (src, _, dst, dp) = flow(f);
        assert_eq!(dp, 8080);
        match p {
            PB => assert_eq!((src, dst), (a(GW), a(B)), "Cluster policy: masqueraded"),
            ETH0 => assert_eq!((src, dst), (a(NODE), a(REMOTE))),
            p => panic!("{p:?}"),
        }
        ports.insert(p);
    }
    assert_eq!(ports.len(), 2);
    // Local: only the local endpoint, the client's address kept.
    for sport in 51000..51010u16 {
        let (_, out) = send(
            &mut n,
            ETH0,
            &tcp(OUTGW, UP_MAC, CLIENT, sport, NODE, 30081, SYN),
        );
        let (p, f) = one(&out);
        assert_eq!(p, PB);
        assert_eq!(flow(f), (a(CLIENT), sport, a(B), 8080));
    }
    // An IPv6-only Service's node port does not answer on IPv4 (as kube-proxy).
    let mut f = Vec::new();
    PacketBuilder::ethernet2(OUTGW.0, UP_MAC.0)
        .ipv4([192, 0, 2, 20], [172, 18, 0, 2], 64)
        .tcp(52000, 30080, 1, 64240)
        .syn()
        .write(&mut f, b"")
        .unwrap();
    let (_, out) = send(&mut n, ETH0, &f);
    assert!(
        out.iter().all(|(p, _)| *p == ETH0),
        "not forwarded to a pod: {out:?}"
    );
}

#[test]
fn pod_to_outside_is_masqueraded_to_the_uplink_ipv6_address() {
    let mut n = node();
    let (_, out) = send(&mut n, PA, &tcp(POD_A, GW_MAC, A, 43000, OUTSIDE, 443, SYN));
    let (p, f) = one(&out);
    assert_eq!(p, ETH0);
    assert_eq!(&f[..6], &OUTGW.0);
    let (src, sp, dst, dp) = flow(f);
    assert_eq!((src, dst, dp), (a(NODE), a(OUTSIDE), 443));
    let (_, back) = send(
        &mut n,
        ETH0,
        &tcp(OUTGW, UP_MAC, OUTSIDE, 443, NODE, sp, SYNACK),
    );
    let (p, f) = one(&back);
    assert_eq!(p, PA);
    assert_eq!(flow(f), (a(OUTSIDE), 443, a(A), 43000));
    // Pod to pod across nodes (inside the cluster CIDR): not masqueraded.
    let (_, out) = send(&mut n, PA, &tcp(POD_A, GW_MAC, A, 43001, REMOTE, 80, SYN));
    let (p, f) = one(&out);
    assert_eq!(p, ETH0);
    assert_eq!(flow(f), (a(A), 43001, a(REMOTE), 80));
}

#[test]
fn udp_service_over_ipv6() {
    let mut n = node();
    let (_, out) = send(&mut n, PA, &udp(POD_A, GW_MAC, A, 33000, DNS, 53));
    let (p, f) = one(&out);
    assert_eq!(p, PB);
    assert_eq!(flow(f), (a(A), 33000, a(B), 5353));
    let (_, back) = send(&mut n, PB, &udp(POD_B, GW_MAC, B, 5353, A, 33000));
    let (p, f) = one(&back);
    assert_eq!(p, PA);
    assert_eq!(flow(f), (a(DNS), 53, a(A), 33000));
}

#[test]
fn no_endpoints_answered_at_once_with_rst_or_port_unreachable() {
    let mut n = node();
    let (v, out) = send(&mut n, PA, &tcp(POD_A, GW_MAC, A, 44000, EMPTY, 80, SYN));
    assert!(matches!(v, Verdict::Drop(_)), "{v:?}");
    let (p, f) = one(&out);
    assert_eq!(p, PA);
    let (src, sp, dst, dp) = flow(f);
    assert_eq!((src, sp, dst, dp), (a(EMPTY), 80, a(A), 44000));
    let s = SlicedPacket::from_ethernet(f).unwrap();
    let Some(TransportSlice::Tcp(t)) = s.transport else {
        panic!()
    };
    assert!(t.rst(), "TCP RST");
    let (_, out) = send(&mut n, PA, &udp(POD_A, GW_MAC, A, 44001, EMPTY, 53));
    let (p, f) = one(&out);
    assert_eq!(p, PA);
    let s = SlicedPacket::from_ethernet(f).unwrap();
    let Some(TransportSlice::Icmpv6(i)) = s.transport else {
        panic!("{s:?}")
    };
    assert!(
        matches!(
            i.icmp_type(),
            Icmpv6Type::DestinationUnreachable(etherparse::icmpv6::DestUnreachableCode::Port)
        ),
        "{:?}",
        i.icmp_type()
    );
    assert_eq!(n.dp.control().netfilter().unwrap().counters().rejected, 2);
}

#[test]
fn dual_stack_service_reachable_on_both_cluster_ips() {
    let mut n = node();
    let (_, out) = send(&mut n, PA, &tcp(POD_A, GW_MAC, A, 45000, DUAL, 80, SYN));
    let (p, f) = one(&out);
    assert_eq!(p, PB);
    assert_eq!(
        flow(f),
        (a(A), 45000, a(B), 8082),
        "IPv6 frontend, IPv6 endpoint"
    );
    let mut f4 = Vec::new();
    PacketBuilder::ethernet2(POD_A.0, GW_MAC.0)
        .ipv4(A4, DUAL4, 64)
        .tcp(45001, 80, 1000, 64240)
        .syn()
        .write(&mut f4, b"hello")
        .unwrap();
    let (_, out) = send(&mut n, PA, &f4);
    let (p, f) = one(&out);
    assert_eq!(p, PB);
    let s = SlicedPacket::from_ethernet(f).unwrap();
    let Some(NetSlice::Ipv4(ip)) = &s.net else {
        panic!()
    };
    let Some(TransportSlice::Tcp(t)) = &s.transport else {
        panic!()
    };
    assert_eq!(
        (ip.header().destination(), t.destination_port()),
        (B4, 8081),
        "IPv4 frontend, IPv4 endpoint"
    );
}

#[test]
fn retransmitted_syns_keep_their_endpoint() {
    let mut n = node();
    let (_, out) = send(&mut n, PA, &tcp(POD_A, GW_MAC, A, 46000, WEB, 80, SYN));
    let first = flow(one(&out).1);
    for _ in 0..5 {
        let (_, out) = send(&mut n, PA, &tcp(POD_A, GW_MAC, A, 46000, WEB, 80, SYN));
        assert_eq!(flow(one(&out).1), first);
    }
}

/// Removes the tables' files when the test ends, however it ends.
struct TempFiles(PathBuf);

impl Drop for TempFiles {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
        let _ = std::fs::remove_file(tapyard::conntrack6_path(&self.0));
    }
}

#[test]
fn ipv6_connections_are_kept_across_a_reopen_of_the_table_file() {
    let dir = std::env::temp_dir();
    let f = TempFiles(dir.join(format!("tapyard-nat6-{}.ct", std::process::id())));
    let (sport, ep) = {
        let mut n = node_at(Some(&f.0));
        let (_, out) = send(&mut n, PA, &tcp(POD_A, GW_MAC, A, 47000, WEB, 80, SYN));
        let (port, fr) = one(&out);
        let (_, _, dst, _) = flow(fr);
        (47000, (port, dst))
    };
    assert!(
        tapyard::conntrack6_path(&f.0).exists(),
        "IPv6 table file beside"
    );
    // A new process on the same files: the endpoint's reply is still un-NAT'd.
    let mut n = node_at(Some(&f.0));
    assert_eq!(
        n.dp.control()
            .netfilter()
            .unwrap()
            .conntrack_of::<Ipv6Addr>()
            .len(),
        1
    );
    let reply = match ep {
        (PB, d) => {
            assert_eq!(d, a(B));
            tcp(POD_B, GW_MAC, B, 8080, A, sport, SYNACK)
        }
        (_, d) => {
            assert_eq!(d, a(REMOTE));
            tcp(PEER, UP_MAC, REMOTE, 8080, A, sport, SYNACK)
        }
    };
    let (_, back) = send(&mut n, ep.0, &reply);
    let (p, fr) = one(&back);
    assert_eq!(p, PA);
    assert_eq!(flow(fr), (a(WEB), 80, a(A), sport));
}

#[test]
fn packet_too_big_about_a_dnat_connection_reaches_the_client_translated() {
    let mut n = node();
    // A connection that the Service sent over the uplink (to the remote endpoint).
    let (sport, sent) = (48000..48100u16)
        .find_map(|sport| {
            let (_, out) = send(&mut n, PA, &tcp(POD_A, GW_MAC, A, sport, WEB, 80, SYN));
            let (p, f) = one(&out);
            (p == ETH0).then(|| (sport, f[14..].to_vec()))
        })
        .expect("some connection goes to the remote endpoint");
    // A router on the path answers with a packet too big quoting the DNAT'd packet.
    let mut f = Vec::new();
    PacketBuilder::ethernet2(PEER.0, UP_MAC.0)
        .ipv6(a("fd00:172:18::3").octets(), a(A).octets(), 64)
        .icmpv6(Icmpv6Type::PacketTooBig { mtu: 1280 })
        .write(&mut f, &sent)
        .unwrap();
    let (_, out) = send(&mut n, ETH0, &f);
    let (p, fr) = one(&out);
    assert_eq!(p, PA);
    let s = SlicedPacket::from_ethernet(fr).unwrap();
    let Some(NetSlice::Ipv6(ip)) = &s.net else {
        panic!()
    };
    let h = ip.header().to_header();
    let Some(TransportSlice::Icmpv6(i)) = &s.transport else {
        panic!("{s:?}")
    };
    assert_eq!(i.icmp_type(), Icmpv6Type::PacketTooBig { mtu: 1280 });
    let want = i
        .icmp_type()
        .calc_checksum(h.source, h.destination, i.payload())
        .unwrap();
    assert_eq!(i.checksum(), want, "ICMPv6 checksum");
    // The quoted packet reads as the client sent it: to the ClusterIP, TCP checksum right.
    let q = SlicedPacket::from_ip(i.payload()).unwrap();
    let Some(NetSlice::Ipv6(qip)) = &q.net else {
        panic!()
    };
    let qh = qip.header().to_header();
    let Some(TransportSlice::Tcp(t)) = &q.transport else {
        panic!()
    };
    assert_eq!((Ipv6Addr::from(qh.source), t.source_port()), (a(A), sport));
    assert_eq!(
        (Ipv6Addr::from(qh.destination), t.destination_port()),
        (a(WEB), 80)
    );
    let want = t.to_header().calc_checksum_ipv6(&qh, t.payload()).unwrap();
    assert_eq!(t.checksum(), want, "quoted TCP checksum");
}

/// The UDP flows a dual-stack Service has to `endpoint` (by reply source), per family.
fn udp_flows_to(n: &Node, ep4: Ipv4Addr, ep6: Ipv6Addr) -> (usize, usize) {
    let nf = n.dp.control().netfilter().unwrap();
    let v4 = nf
        .conntrack()
        .dump(n.now)
        .iter()
        .filter(|v| v.proto == 17 && v.reply.src == ep4)
        .count();
    let v6 = nf
        .conntrack_of::<Ipv6Addr>()
        .dump(n.now)
        .iter()
        .filter(|v| v.proto == 17 && v.reply.src == ep6)
        .count();
    (v4, v6)
}

#[test]
fn removed_ipv6_udp_endpoints_lose_their_flows_and_clients_move_on_as_kube_proxy_does() {
    let mut n = node();
    let nf = n.dp.control().netfilter().unwrap();
    // A dual-stack UDP Service (DNS-like) with one IPv4 and two IPv6 endpoints.
    let (vip4, vip6) = ([10, 96, 0, 54], "fd00:10:96::54");
    let mut dns = ServiceSpec::new("dns-dual", Ipv4Addr::from(vip4), 53, IpProto::UDP);
    dns.vip6 = Some(a(vip6));
    dns.endpoints = vec![Endpoint::new(SocketAddrV4::new(B4.into(), 5353), true)];
    dns.endpoints6 = vec![ep6(B, 5353, true), ep6(REMOTE, 5353, false)];
    nf.upsert_service(dns.clone(), n.now).unwrap();
    // Clients send queries from many ports: some flows go to each IPv6 endpoint.
    let mut to_remote = Vec::new();
    for sport in 34000..34040u16 {
        let (_, out) = send(&mut n, PA, &udp(POD_A, GW_MAC, A, sport, vip6, 53));
        let (_, _, dst, _) = flow(one(&out).1);
        if dst == a(REMOTE) {
            to_remote.push(sport);
        }
    }
    let mut f4 = Vec::new();
    PacketBuilder::ethernet2(POD_A.0, GW_MAC.0)
        .ipv4(A4, vip4, 64)
        .udp(34100, 53)
        .write(&mut f4, b"query")
        .unwrap();
    send(&mut n, PA, &f4);
    assert!(to_remote.len() > 5 && to_remote.len() < 35, "{to_remote:?}");
    let before = udp_flows_to(&n, B4.into(), a(REMOTE));
    assert_eq!(before, (1, to_remote.len()));
    let on_b = udp_flows_to(&n, B4.into(), a(B)).1;
    assert_eq!(on_b, 40 - to_remote.len());
    // A masqueraded UDP flow to the outside is no Service's: kept throughout.
    send(&mut n, PA, &udp(POD_A, GW_MAC, A, 34200, OUTSIDE, 53));

    // The remote endpoint goes away: its UDP flows are deleted (`conntrack -D -f ipv6`),
    // the other endpoint's and the IPv4 family's are kept.
    let nf = n.dp.control().netfilter().unwrap();
    dns.endpoints6 = vec![ep6(B, 5353, true)];
    nf.upsert_service(dns.clone(), n.now).unwrap();
    assert_eq!(udp_flows_to(&n, B4.into(), a(REMOTE)), (1, 0));
    assert_eq!(udp_flows_to(&n, B4.into(), a(B)).1, on_b);
    // The client's next datagram on a flow that went to the removed endpoint now reaches
    // the remaining one, instead of being sent to the gone pod until the flow times out.
    for &sport in &to_remote {
        let (_, out) = send(&mut n, PA, &udp(POD_A, GW_MAC, A, sport, vip6, 53));
        let (p, f) = one(&out);
        assert_eq!(p, PB);
        assert_eq!(flow(f), (a(A), sport, a(B), 5353));
    }

    // The Service is removed: all its UDP flows go, in both families; others stay.
    let nf = n.dp.control().netfilter().unwrap();
    nf.remove_service("dns-dual", n.now).unwrap();
    assert_eq!(udp_flows_to(&n, B4.into(), a(B)), (0, 0));
    let rest: Vec<_> = nf
        .conntrack_of::<Ipv6Addr>()
        .dump(n.now)
        .into_iter()
        .filter(|v| v.proto == 17)
        .map(|v| v.orig.dst)
        .collect();
    assert_eq!(rest, vec![a(OUTSIDE)], "the masqueraded flow is kept");
}

#[test]
fn a_changed_ipv6_cluster_ip_flushes_the_old_frontend_s_udp_flows_only() {
    let mut n = node();
    send(&mut n, PA, &udp(POD_A, GW_MAC, A, 35000, DNS, 53));
    let nf = n.dp.control().netfilter().unwrap();
    assert_eq!(nf.conntrack_of::<Ipv6Addr>().len(), 1);
    // Same endpoints, the IPv4 side added: the IPv6 flow stays.
    let mut dns = nf.services().get("dns6").unwrap().spec().clone();
    dns.vip = Some(Ipv4Addr::new(10, 96, 0, 53));
    dns.endpoints = vec![Endpoint::new(SocketAddrV4::new(B4.into(), 5353), true)];
    nf.upsert_service(dns.clone(), n.now).unwrap();
    assert_eq!(nf.conntrack_of::<Ipv6Addr>().len(), 1);
    // The IPv6 ClusterIP changes: the flow to the old one is deleted.
    dns.vip6 = Some(a("fd00:10:96::5353"));
    nf.upsert_service(dns, n.now).unwrap();
    assert_eq!(nf.conntrack_of::<Ipv6Addr>().len(), 0);
}

#[test]
fn snat6_rule_translates_to_a_fixed_address_and_port_range_and_counts_exhaustion() {
    let mut n = node();
    let nf = n.dp.control().netfilter().unwrap();
    let eth0 = n.dp.control().iface_by_name("eth0").unwrap();
    let to = a("fd00:172:18::50");
    // ip6tables -t nat -A POSTROUTING -s fd00:10:244:1::/64 -o eth0 -j SNAT
    //   --to-source [fd00:172:18::50]:5000-5001 (the masquerade rule replaced by it).
    nf.set_rules(NatRules {
        cluster_cidr6: Some(Prefix::new(a("fd00:10:244::"), 56)),
        snat6: vec![SnatRule {
            out: Some(eth0),
            src: Prefix::new(a("fd00:10:244:1::"), 64),
            to,
            ports: Some(PortRange { lo: 5000, hi: 5001 }),
        }],
        ..NatRules::default()
    });
    let mut ports = Vec::new();
    for sport in [48000u16, 48001] {
        let (_, out) = send(&mut n, PA, &tcp(POD_A, GW_MAC, A, sport, OUTSIDE, 443, SYN));
        let (p, f) = one(&out);
        assert_eq!(p, ETH0);
        let (src, sp, dst, dp) = flow(f);
        assert_eq!((src, dst, dp), (to, a(OUTSIDE), 443));
        ports.push((sp, sport));
    }
    ports.sort();
    assert_eq!(
        ports.iter().map(|p| p.0).collect::<Vec<_>>(),
        vec![5000, 5001]
    );
    // The reply to the SNAT address reaches the pod, un-NAT'd.
    let (sp, sport) = ports[0];
    let (_, back) = send(
        &mut n,
        ETH0,
        &tcp(OUTGW, UP_MAC, OUTSIDE, 443, to, sp, SYNACK),
    );
    let (p, f) = one(&back);
    assert_eq!(p, PA);
    assert_eq!(flow(f), (a(OUTSIDE), 443, a(A), sport));
    // The range is used up: the next new connection is dropped and counted.
    let (v, out) = send(&mut n, PA, &tcp(POD_A, GW_MAC, A, 48002, OUTSIDE, 443, SYN));
    assert_eq!(v, Verdict::Drop(DropReason::NatExhausted));
    assert!(out.is_empty());
    assert_eq!(
        n.dp.control().stats().drop_count(DropReason::NatExhausted),
        1
    );
    // Sources outside the rule's prefix are not translated by it.
    let (_, out) = send(
        &mut n,
        ETH0,
        &tcp(OUTGW, UP_MAC, CLIENT, 48100, REMOTE, 80, SYN),
    );
    let (p, f) = one(&out);
    assert_eq!(p, ETH0);
    assert_eq!(flow(f), (a(CLIENT), 48100, a(REMOTE), 80));
    assert_eq!(n.dp.control().netfilter().unwrap().counters().snat, 2);
}
