//! Conntrack and NAT without root: a Kubernetes-like node (pods on cni0 10.244.1.0/24, an
//! uplink eth0 172.18.0.2/24 to node B's pods 10.244.2.0/24 and a default gateway), with
//! Services, masquerade and NodePorts configured; frames built with etherparse go in, and what
//! comes out is checked as kube-proxy's rules on a Linux node would make it, every checksum
//! recomputed.

use std::net::{Ipv4Addr, SocketAddrV4};

use etherparse::{NetSlice, PacketBuilder, SlicedPacket, TransportSlice};
use tapyard::l3::IfaceConfig;
use tapyard::l3::{IfaceId, NextHop, Route, RouteProto};
use tapyard::nat::{Endpoint, LbAlgo, ServiceSpec};
use tapyard::nat::{MasqueradeRule, NatConfig, NatRules, Prefix};
use tapyard::wire::family::IpProto;
use tapyard::{BridgeConfig, Datapath, DropReason, Instant, MacAddr, PortId, Verdict};
use tapyard_testkit::frame::{self, tcp, udp, ACK, SYN, SYNACK};
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

const A: [u8; 4] = [10, 244, 1, 2];
const B: [u8; 4] = [10, 244, 1, 3];
const REMOTE: [u8; 4] = [10, 244, 2, 2];
const WEB: [u8; 4] = [10, 96, 0, 10];
const DNS: [u8; 4] = [10, 96, 0, 53];
const SELF_SVC: [u8; 4] = [10, 96, 0, 11];
const EMPTY: [u8; 4] = [10, 96, 0, 99];
const OUTSIDE: [u8; 4] = [192, 0, 2, 10];
const CLIENT: [u8; 4] = [192, 0, 2, 20];
const NODE: [u8; 4] = [172, 18, 0, 2];
const GW: [u8; 4] = [10, 244, 1, 1];

fn ep(ip: [u8; 4], port: u16, local: bool) -> Endpoint {
    Endpoint::new(SocketAddrV4::new(ip.into(), port), local)
}

fn node() -> Node {
    let mut b = Datapath::builder();
    let br = b.add_bridge(BridgeConfig::new("cni0")).unwrap();
    assert_eq!(b.add_port("pod-a", Some(br)).unwrap(), PA);
    assert_eq!(b.add_port("pod-b", Some(br)).unwrap(), PB);
    let (cni0, _) = b
        .add_router_iface(
            IfaceConfig::new("cni0", GW_MAC, std::net::Ipv4Addr::from(GW), 24),
            Some(br),
        )
        .unwrap();
    let (eth0, port) = b
        .add_router_iface(
            IfaceConfig::new("eth0", UP_MAC, std::net::Ipv4Addr::from(NODE), 24),
            None,
        )
        .unwrap();
    assert_eq!(port, ETH0);
    let cluster = Prefix::new(Ipv4Addr::new(10, 244, 0, 0), 16);
    b.netfilter(NatConfig {
        rules: NatRules {
            cluster_cidr: Some(cluster),
            masquerade: vec![MasqueradeRule {
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
    let now = Instant::from_secs(1);
    let route = |p: [u8; 4], len, nh| Route {
        prefix: p.into(),
        len,
        next_hop: nh,
        metric: 0,
        proto: RouteProto::Static,
        src: None,
    };
    dp.control()
        .add_route(route(
            [10, 244, 2, 0],
            24,
            NextHop::Via(eth0, Ipv4Addr::new(172, 18, 0, 3)),
        ))
        .unwrap();
    dp.control()
        .add_route(route(
            [0, 0, 0, 0],
            0,
            NextHop::Via(eth0, Ipv4Addr::new(172, 18, 0, 1)),
        ))
        .unwrap();
    for (iface, ip, mac) in [
        (cni0, A, POD_A),
        (cni0, B, POD_B),
        (eth0, [172, 18, 0, 3], PEER),
        (eth0, [172, 18, 0, 1], OUTGW),
    ] {
        dp.control()
            .add_static_neigh(iface, std::net::IpAddr::from(ip), mac, now)
            .unwrap();
    }
    let nf = dp.control().netfilter().unwrap();
    let mut web = ServiceSpec::new("web", Ipv4Addr::from(WEB), 80, IpProto::TCP);
    web.node_port = Some(30080);
    web.endpoints = vec![ep(B, 8080, true), ep(REMOTE, 8080, false)];
    nf.upsert_service(web, now).unwrap();
    let mut local = ServiceSpec::new(
        "web-local",
        Ipv4Addr::from([10, 96, 0, 12]),
        80,
        IpProto::TCP,
    );
    local.node_port = Some(30081);
    local.external_local = true;
    local.endpoints = vec![ep(B, 8080, true), ep(REMOTE, 8080, false)];
    nf.upsert_service(local, now).unwrap();
    let mut dns = ServiceSpec::new("dns", Ipv4Addr::from(DNS), 53, IpProto::UDP);
    dns.endpoints = vec![ep(B, 5353, true)];
    nf.upsert_service(dns, now).unwrap();
    let mut me = ServiceSpec::new("self", Ipv4Addr::from(SELF_SVC), 80, IpProto::TCP);
    me.endpoints = vec![ep(B, 8080, true)];
    me.algo = LbAlgo::Maglev;
    nf.upsert_service(me, now).unwrap();
    nf.upsert_service(
        ServiceSpec::new("empty", Ipv4Addr::from(EMPTY), 80, IpProto::TCP),
        now,
    )
    .unwrap();
    nf.upsert_service(
        ServiceSpec::new("empty-udp", Ipv4Addr::from(EMPTY), 53, IpProto::UDP),
        now,
    )
    .unwrap();
    let mut n = Node::new(dp);
    // The pods announce themselves so cni0 learns their ports.
    for (p, mac) in [(PA, POD_A), (PB, POD_B)] {
        n.announce(p, mac);
    }
    n
}

/// What a frame carries: (src, sport, dst, dport) for TCP/UDP, every checksum checked.
fn flow(f: &[u8]) -> ([u8; 4], u16, [u8; 4], u16) {
    frame::flow(f)
}

#[test]
fn pod_to_cluster_ip_spreads_over_endpoints_and_replies_come_from_the_cluster_ip() {
    let mut n = node();
    let mut seen = [0u32; 2];
    for sport in 40000..40040u16 {
        let (v, out) = send(&mut n, PA, &tcp(POD_A, GW_MAC, A, sport, WEB, 80, SYN));
        let (port, f) = one(&out);
        let (src, sp, dst, dp) = flow(f);
        // The pod's own address is kept (pod-to-Service inside the cluster).
        assert_eq!((src, sp, dp), (A, sport, 8080));
        match (v, port, dst) {
            (Verdict::Output(PB), PB, B) => seen[0] += 1,
            (Verdict::Output(ETH0), ETH0, REMOTE) => {
                assert_eq!(&f[0..6], &PEER.0, "routed to node B");
                seen[1] += 1
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(
        seen[0] > 0 && seen[1] > 0,
        "both endpoints chosen: {seen:?}"
    );
    // A connection to the local endpoint: its reply is switched on cni0 straight to pod A
    // and translated back there (br_netfilter).
    let sport = (40000..40040u16)
        .find(|&s| {
            n.dp.control()
                .netfilter()
                .unwrap()
                .conntrack()
                .dump(n.now)
                .iter()
                .any(|c| c.orig.sport == s && c.reply.src == Ipv4Addr::from(B))
        })
        .unwrap();
    let (v, out) = send(&mut n, PB, &tcp(POD_B, POD_A, B, 8080, A, sport, SYNACK));
    assert_eq!(v, Verdict::Output(PA));
    assert_eq!(flow(one(&out).1), (WEB, 80, A, sport));
    // And one through node B: the reply comes back over eth0 and is routed to pod A.
    let sport = (40000..40040u16)
        .find(|&s| {
            n.dp.control()
                .netfilter()
                .unwrap()
                .conntrack()
                .dump(n.now)
                .iter()
                .any(|c| c.orig.sport == s && c.reply.src == Ipv4Addr::from(REMOTE))
        })
        .unwrap();
    let (v, out) = send(
        &mut n,
        ETH0,
        &tcp(PEER, UP_MAC, REMOTE, 8080, A, sport, SYNACK),
    );
    assert_eq!(v, Verdict::Output(PA));
    let (_, f) = one(&out);
    assert_eq!(&f[0..6], &POD_A.0);
    assert_eq!(flow(f), (WEB, 80, A, sport));
    // The handshake completes: ESTABLISHED and ASSURED in the dump.
    send(&mut n, PA, &tcp(POD_A, GW_MAC, A, sport, WEB, 80, ACK));
    let dump =
        n.dp.control()
            .netfilter()
            .unwrap()
            .conntrack()
            .fmt_dump(n.now);
    let line = dump
        .lines()
        .find(|l| l.contains(&format!("sport={sport} dport=80")))
        .unwrap();
    assert!(
        line.contains("ESTABLISHED") && line.contains("[ASSURED]"),
        "{line}"
    );
    assert!(
        line.contains("src=10.244.2.2 dst=10.244.1.2 sport=8080"),
        "{line}"
    );
}

#[test]
fn endpoint_changes_keep_established_connections() {
    let mut n = node();
    let (_, out) = send(&mut n, PA, &tcp(POD_A, GW_MAC, A, 41000, WEB, 80, SYN));
    let first = flow(one(&out).1).2;
    // The Service now has only the other endpoint.
    let other = if first == B { REMOTE } else { B };
    // The endpoint answers (switched on cni0, or back over eth0).
    let reply = if first == B {
        send(&mut n, PB, &tcp(POD_B, POD_A, B, 8080, A, 41000, SYNACK))
    } else {
        send(
            &mut n,
            ETH0,
            &tcp(PEER, UP_MAC, REMOTE, 8080, A, 41000, SYNACK),
        )
    };
    assert_eq!(reply.0, Verdict::Output(PA));
    let nf = n.dp.control().netfilter().unwrap();
    let mut web = nf.services().get("web").unwrap().spec().clone();
    web.endpoints = vec![ep(other, 8080, other == B)];
    nf.upsert_service(web, n.now).unwrap();
    // The established connection keeps its endpoint; a new one takes the new list.
    let (_, out) = send(&mut n, PA, &tcp(POD_A, GW_MAC, A, 41000, WEB, 80, ACK));
    assert_eq!(flow(one(&out).1).2, first);
    let (_, out) = send(&mut n, PA, &tcp(POD_A, GW_MAC, A, 41001, WEB, 80, SYN));
    assert_eq!(flow(one(&out).1).2, other);
}

#[test]
fn hairpin_is_masqueraded_to_the_gateway() {
    let mut n = node();
    // Pod B reaches itself through its Service.
    let (v, out) = send(&mut n, PB, &tcp(POD_B, GW_MAC, B, 42000, SELF_SVC, 80, SYN));
    assert_eq!(v, Verdict::Output(PB));
    let (src, sport, dst, dport) = flow(one(&out).1);
    assert_eq!(
        (src, dst, dport),
        (GW, B, 8080),
        "source becomes the gateway"
    );
    // The reply goes to the gateway, is routed, and arrives from the Service address.
    let (v, out) = send(&mut n, PB, &tcp(POD_B, GW_MAC, B, 8080, GW, sport, SYNACK));
    assert_eq!(v, Verdict::Output(PB));
    assert_eq!(flow(one(&out).1), (SELF_SVC, 80, B, 42000));
    assert_eq!(n.dp.control().netfilter().unwrap().counters().hairpin, 1);
}

#[test]
fn service_without_endpoints_is_refused_at_once() {
    let mut n = node();
    let (v, out) = send(&mut n, PA, &tcp(POD_A, GW_MAC, A, 43000, EMPTY, 80, SYN));
    assert_eq!(v, Verdict::Drop(DropReason::NoEndpoint));
    let (port, f) = one(&out);
    assert_eq!(port, PA);
    assert_eq!(flow(f), (EMPTY, 80, A, 43000));
    let p = SlicedPacket::from_ethernet(f).unwrap();
    let Some(TransportSlice::Tcp(t)) = p.transport else {
        panic!()
    };
    assert!(t.rst() && t.ack());
    // UDP gets ICMP port unreachable quoting the datagram.
    let (v, out) = send(&mut n, PA, &udp(POD_A, GW_MAC, A, 43001, EMPTY, 53));
    assert_eq!(v, Verdict::Drop(DropReason::NoEndpoint));
    let (port, f) = one(&out);
    assert_eq!(port, PA);
    let p = SlicedPacket::from_ethernet(f).unwrap();
    let Some(TransportSlice::Icmpv4(i)) = p.transport else {
        panic!("not ICMP")
    };
    assert!(matches!(
        i.icmp_type(),
        etherparse::Icmpv4Type::DestinationUnreachable(
            etherparse::icmpv4::DestUnreachableHeader::Port
        )
    ));
}

#[test]
fn udp_service_and_an_icmp_error_from_its_endpoint_are_translated() {
    let mut n = node();
    let (v, out) = send(&mut n, PA, &udp(POD_A, GW_MAC, A, 44000, DNS, 53));
    assert_eq!(v, Verdict::Output(PB));
    assert_eq!(flow(one(&out).1), (A, 44000, B, 5353));
    // The answer, switched on cni0 back to pod A, comes from the Service address.
    let (_, out) = send(&mut n, PB, &udp(POD_B, POD_A, B, 5353, A, 44000));
    assert_eq!(flow(one(&out).1), (DNS, 53, A, 44000));
    // Pod B's port closes: its ICMP port unreachable quotes the translated datagram; pod A
    // must see it about the Service address.
    let quoted = udp(POD_A, POD_B, A, 44000, B, 5353);
    let mut icmp = Vec::new();
    PacketBuilder::ethernet2(POD_B.0, POD_A.0)
        .ipv4(B, A, 64)
        .icmpv4(etherparse::Icmpv4Type::DestinationUnreachable(
            etherparse::icmpv4::DestUnreachableHeader::Port,
        ))
        .write(&mut icmp, &quoted[14..])
        .unwrap();
    let (v, out) = send(&mut n, PB, &icmp);
    assert_eq!(v, Verdict::Output(PA));
    let (_, f) = one(&out);
    let p = SlicedPacket::from_ethernet(f).unwrap();
    let Some(NetSlice::Ipv4(ip)) = &p.net else {
        panic!()
    };
    let h = ip.header().to_header();
    assert_eq!((h.source, h.destination), (DNS, A));
    assert_eq!(h.header_checksum, h.calc_header_checksum());
    let Some(TransportSlice::Icmpv4(i)) = &p.transport else {
        panic!()
    };
    assert_eq!(i.checksum(), i.icmp_type().calc_checksum(i.payload()));
    // The quoted datagram is pod A's own, to the Service.
    let inner = &i.payload();
    let q = etherparse::Ipv4HeaderSlice::from_slice(inner).unwrap();
    assert_eq!((q.source(), q.destination()), (A, DNS));
    let qh = q.to_header();
    assert_eq!(qh.header_checksum, qh.calc_header_checksum());
    let ports = &inner[q.slice().len()..];
    assert_eq!(
        (
            u16::from_be_bytes([ports[0], ports[1]]),
            u16::from_be_bytes([ports[2], ports[3]])
        ),
        (44000, 53)
    );
}

#[test]
fn pod_traffic_leaving_the_cluster_is_masqueraded() {
    let mut n = node();
    let (v, out) = send(&mut n, PA, &tcp(POD_A, GW_MAC, A, 45000, OUTSIDE, 80, SYN));
    assert_eq!(v, Verdict::Output(ETH0));
    let (_, f) = one(&out);
    assert_eq!(&f[0..6], &OUTGW.0);
    assert_eq!(flow(f), (NODE, 45000, OUTSIDE, 80), "source port kept");
    let (v, out) = send(
        &mut n,
        ETH0,
        &tcp(OUTGW, UP_MAC, OUTSIDE, 80, NODE, 45000, SYNACK),
    );
    assert_eq!(v, Verdict::Output(PA));
    assert_eq!(flow(one(&out).1), (OUTSIDE, 80, A, 45000));
    // Pod to pod on another node keeps its address.
    let (_, out) = send(&mut n, PA, &tcp(POD_A, GW_MAC, A, 45001, REMOTE, 80, SYN));
    assert_eq!(flow(one(&out).1), (A, 45001, REMOTE, 80));
}

#[test]
fn node_port_with_both_traffic_policies() {
    let mut n = node();
    // Cluster: the client is masqueraded to the egress interface's address.
    let mut seen_local = false;
    for sport in 50000..50020u16 {
        let (_, out) = send(
            &mut n,
            ETH0,
            &tcp(OUTGW, UP_MAC, CLIENT, sport, NODE, 30080, SYN),
        );
        let (port, f) = one(&out);
        let (src, _, dst, dport) = flow(f);
        assert_eq!(dport, 8080);
        match dst {
            B => {
                assert_eq!((port, src), (PB, GW));
                seen_local = true;
            }
            REMOTE => assert_eq!((port, src), (ETH0, NODE)),
            other => panic!("{other:?}"),
        }
    }
    assert!(seen_local);
    // Local: only the local endpoint, and the client's address is kept.
    for sport in 51000..51010u16 {
        let (_, out) = send(
            &mut n,
            ETH0,
            &tcp(OUTGW, UP_MAC, CLIENT, sport, NODE, 30081, SYN),
        );
        let (port, f) = one(&out);
        assert_eq!(port, PB);
        assert_eq!(flow(f), (CLIENT, sport, B, 8080));
    }
    // The local endpoint's reply goes to the client via its default route (the gateway) and
    // leaves from the node port.
    let (v, out) = send(
        &mut n,
        PB,
        &tcp(POD_B, GW_MAC, B, 8080, CLIENT, 51000, SYNACK),
    );
    assert_eq!(v, Verdict::Output(ETH0));
    assert_eq!(flow(one(&out).1), (NODE, 30081, CLIENT, 51000));
}

#[test]
fn a_first_packet_without_syn_is_invalid() {
    let mut n = node();
    let (v, out) = send(&mut n, PA, &tcp(POD_A, GW_MAC, A, 46000, REMOTE, 80, ACK));
    assert_eq!(v, Verdict::Drop(DropReason::CtInvalid));
    assert!(out.is_empty());
    let s = n.dp.control().stats();
    assert_eq!(s.drop_count(DropReason::CtInvalid), 1, "{s}");
    let _ = IfaceId(0);
}

#[test]
fn masquerade_never_reuses_a_tuple_and_snat_counts_exhaustion() {
    let mut n = node();
    // Two pods, one source port, one outside server: the second gets another port.
    let (_, out) = send(&mut n, PA, &tcp(POD_A, GW_MAC, A, 47000, OUTSIDE, 80, SYN));
    assert_eq!(
        flow(one(&out).1),
        (NODE, 47000, OUTSIDE, 80),
        "port kept when free"
    );
    let (_, out) = send(&mut n, PB, &tcp(POD_B, GW_MAC, B, 47000, OUTSIDE, 80, SYN));
    let (src, sport, dst, dport) = flow(one(&out).1);
    assert_eq!((src, dst, dport), (NODE, OUTSIDE, 80));
    assert_ne!(sport, 47000, "the taken tuple is not handed out again");
    assert!(sport >= 1024);
    // Replies reach the right pod.
    let (v, _) = send(
        &mut n,
        ETH0,
        &tcp(OUTGW, UP_MAC, OUTSIDE, 80, NODE, sport, SYNACK),
    );
    assert_eq!(v, Verdict::Output(PB));
    let (v, _) = send(
        &mut n,
        ETH0,
        &tcp(OUTGW, UP_MAC, OUTSIDE, 80, NODE, 47000, SYNACK),
    );
    assert_eq!(v, Verdict::Output(PA));

    // SNAT to a fixed address with a range of two ports, replacing the masquerade rule.
    let nf = n.dp.control().netfilter().unwrap();
    let eth0 = n.dp.control().iface_by_name("eth0").unwrap();
    nf.set_rules(NatRules {
        cluster_cidr: Some(Prefix::new(Ipv4Addr::new(10, 244, 0, 0), 16)),
        snat: vec![tapyard::nat::SnatRule {
            out: Some(eth0),
            src: Prefix::new(Ipv4Addr::new(10, 244, 1, 0), 24),
            to: Ipv4Addr::new(172, 18, 0, 50),
            ports: Some(tapyard::nat::PortRange { lo: 5000, hi: 5001 }),
        }],
        ..NatRules::default()
    });
    let mut ports = Vec::new();
    for sport in [48000u16, 48001] {
        let (_, out) = send(&mut n, PA, &tcp(POD_A, GW_MAC, A, sport, OUTSIDE, 443, SYN));
        let (src, p, _, _) = flow(one(&out).1);
        assert_eq!(src, [172, 18, 0, 50]);
        ports.push(p);
    }
    ports.sort();
    assert_eq!(ports, vec![5000, 5001]);
    // The range is used up: the next new connection is dropped and counted.
    let (v, out) = send(&mut n, PA, &tcp(POD_A, GW_MAC, A, 48002, OUTSIDE, 443, SYN));
    assert_eq!(v, Verdict::Drop(DropReason::NatExhausted));
    assert!(out.is_empty());
    assert_eq!(
        n.dp.control().stats().drop_count(DropReason::NatExhausted),
        1
    );
    // Established connections made under the old rules keep their translation.
    let (_, out) = send(&mut n, PB, &tcp(POD_B, GW_MAC, B, 47000, OUTSIDE, 80, ACK));
    assert_eq!(flow(one(&out).1), (NODE, sport, OUTSIDE, 80));

    // SNAT without a port range, as iptables' `-j SNAT --to-source 172.18.0.50`: the
    // original port when free, else one of its class (a privileged port stays privileged).
    n.dp.control().netfilter().unwrap().set_rules(NatRules {
        cluster_cidr: Some(Prefix::new(Ipv4Addr::new(10, 244, 0, 0), 16)),
        snat: vec![tapyard::nat::SnatRule {
            out: Some(eth0),
            src: Prefix::new(Ipv4Addr::new(10, 244, 1, 0), 24),
            to: Ipv4Addr::new(172, 18, 0, 50),
            ports: None,
        }],
        ..NatRules::default()
    });
    let (_, out) = send(&mut n, PA, &tcp(POD_A, GW_MAC, A, 700, OUTSIDE, 443, SYN));
    assert_eq!(flow(one(&out).1), ([172, 18, 0, 50], 700, OUTSIDE, 443));
    // The same source port from the other pod: taken, so another of 600-1023.
    let (_, out) = send(&mut n, PB, &tcp(POD_B, GW_MAC, B, 700, OUTSIDE, 443, SYN));
    let (src, p, _, _) = flow(one(&out).1);
    assert_eq!(src, [172, 18, 0, 50]);
    assert!((600..=1023).contains(&p) && p != 700, "port {p}");
    let (_, out) = send(&mut n, PB, &tcp(POD_B, GW_MAC, B, 40000, OUTSIDE, 443, SYN));
    assert_eq!(flow(one(&out).1).1, 40000);
}

// -- TSO super-frames from offload TAPs, routed and NAT'd ------------------------------------

/// Bytes of TCP payload in the test super-frames: a little over three 1448-byte segments.
const SUPER_PAYLOAD: usize = 3 * 1448 + 700;
const MSS: u16 = 1448;

/// One's complement sum of big-endian 16-bit words, folded.
#[allow(
    clippy::cast_possible_truncation,
    reason = "test frames: lengths, indices and sums below 64 KiB, payload bytes wrap on purpose"
)]
fn fold_sum(mut s: u32, data: &[u8]) -> u16 {
    for w in data.chunks(2) {
        s += u32::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)]));
    }
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    s as u16
}

/// What Linux puts in the TCP checksum field of a `CHECKSUM_PARTIAL` (TSO) packet: the folded
/// pseudo-header sum for the whole TCP length, not complemented (`tcp_v4_send_check`).
#[allow(
    clippy::cast_possible_truncation,
    reason = "test frames: lengths, indices and sums below 64 KiB, payload bytes wrap on purpose"
)]
fn pseudo_partial(src: [u8; 4], dst: [u8; 4], tcp_len: usize) -> u16 {
    let mut p = Vec::new();
    p.extend_from_slice(&src);
    p.extend_from_slice(&dst);
    p.extend_from_slice(&[0, 6]);
    p.extend_from_slice(&(tcp_len as u16).to_be_bytes());
    fold_sum(0, &p)
}

/// A TSO super-frame as an offload TAP hands it over: an IPv4 total length over the MTU, a
/// partial TCP checksum and the virtio-net header asking for segmentation into `MSS`.
#[allow(
    clippy::cast_possible_truncation,
    reason = "test frames: lengths, indices and sums below 64 KiB, payload bytes wrap on purpose"
)]
fn super_frame(
    src_mac: MacAddr,
    dst_mac: MacAddr,
    src: [u8; 4],
    sport: u16,
    dst: [u8; 4],
    dport: u16,
) -> (Vec<u8>, tapyard::Offload) {
    let mut f = Vec::new();
    let payload: Vec<u8> = (0..SUPER_PAYLOAD).map(|i| (i * 7 + 3) as u8).collect();
    PacketBuilder::ethernet2(src_mac.0, dst_mac.0)
        .ipv4(src, dst, 64)
        .tcp(sport, dport, 7000, 64240)
        .ack(5000)
        .psh()
        .write(&mut f, &payload)
        .unwrap();
    let tcp_len = f.len() - 34;
    f[34 + 16..34 + 18].copy_from_slice(&pseudo_partial(src, dst, tcp_len).to_be_bytes());
    let hdr = tapyard::Offload {
        flags: tapyard::offload::VIRTIO_NET_HDR_F_NEEDS_CSUM,
        gso_type: tapyard::offload::VIRTIO_NET_HDR_GSO_TCPV4,
        hdr_len: 54,
        gso_size: MSS,
        csum_start: 34,
        csum_offset: 16,
    };
    (f, hdr)
}

/// Processes one frame with its offload header; returns its verdict and every frame sent
/// with the offload header it leaves with.
fn send_offload(
    n: &mut Node,
    port: PortId,
    frame: &[u8],
    hdr: tapyard::Offload,
) -> (Verdict, Vec<(PortId, Vec<u8>, tapyard::Offload)>) {
    let mut batch = tapyard::Batch::new();
    let mut b = tapyard::PacketBuf::from_frame(frame);
    b.port = port;
    b.offload = hdr;
    batch.push(b).unwrap();
    n.dp.process(&mut n.w, n.now, &mut batch);
    let v = batch.verdicts()[0];
    let mut out = Vec::new();
    n.dp.dispatch(&mut n.w, &batch, |p, b| {
        out.push((p, b.frame().to_vec(), b.offload));
        Ok(())
    });
    batch.recycle(&mut n.w.pool);
    (v, out)
}

/// Segments a TSO super-frame as the Linux receiver of an offload TAP does (`tcp_gso_segment`
/// then the checksum completed from `csum_start`): the partial checksum left in the frame is
/// only adjusted for each segment's length, so a wrong pseudo-header sum gives segments with
/// bad checksums.
#[allow(
    clippy::cast_possible_truncation,
    reason = "test frames: lengths, indices and sums below 64 KiB, payload bytes wrap on purpose"
)]
fn kernel_segment(f: &[u8], hdr: &tapyard::Offload) -> Vec<Vec<u8>> {
    let l3 = 14;
    let l4 = l3 + usize::from(f[l3] & 0xf) * 4;
    let start = usize::from(hdr.csum_start);
    let field = start + usize::from(hdr.csum_offset);
    assert_eq!(start, l4, "csum_start is the TCP header");
    assert_eq!(field, l4 + 16, "csum_offset is the TCP checksum field");
    let payload_off = l4 + usize::from(f[l4 + 12] >> 4) * 4;
    let payload = &f[payload_off..];
    let full_tcp_len = f.len() - l4;
    let partial = u16::from_be_bytes([f[field], f[field + 1]]);
    let mss = usize::from(hdr.gso_size);
    let id0 = u16::from_be_bytes([f[l3 + 4], f[l3 + 5]]);
    let seq0 = u32::from_be_bytes(f[l4 + 4..l4 + 8].try_into().unwrap());
    let chunks: Vec<&[u8]> = payload.chunks(mss).collect();
    let mut segs = Vec::new();
    for (i, chunk) in chunks.iter().enumerate() {
        let mut s = f[..payload_off].to_vec();
        s.extend_from_slice(chunk);
        let tcp_len = s.len() - l4;
        let total = (s.len() - l3) as u16;
        s[l3 + 2..l3 + 4].copy_from_slice(&total.to_be_bytes());
        s[l3 + 4..l3 + 6].copy_from_slice(&id0.wrapping_add(i as u16).to_be_bytes());
        s[l3 + 10..l3 + 12].copy_from_slice(&[0, 0]);
        let ipc = !fold_sum(0, &s[l3..l4]);
        s[l3 + 10..l3 + 12].copy_from_slice(&ipc.to_be_bytes());
        let seq = seq0.wrapping_add((i * mss) as u32);
        s[l4 + 4..l4 + 8].copy_from_slice(&seq.to_be_bytes());
        if i + 1 != chunks.len() {
            s[l4 + 13] &= !0x09; // FIN, PSH only on the last segment
        }
        // The pseudo-header sum with this segment's length instead of the whole one.
        let adj = fold_sum(
            u32::from(partial) + u32::from(!(full_tcp_len as u16)) + tcp_len as u32,
            &[],
        );
        s[field..field + 2].copy_from_slice(&adj.to_be_bytes());
        let c = !fold_sum(0, &s[start..]);
        s[field..field + 2].copy_from_slice(&c.to_be_bytes());
        segs.push(s);
    }
    segs
}

/// Checks a forwarded super-frame: its offload header is the one it came in with, its IPv4
/// header checksum is valid, its TTL is `ttl`, and the segments the receiving kernel makes of
/// it carry `want` (every checksum checked by `flow`) and the payload in order.
#[allow(
    clippy::cast_possible_truncation,
    reason = "test frames: lengths, indices and sums below 64 KiB, payload bytes wrap on purpose"
)]
fn check_super(f: &[u8], hdr: &tapyard::Offload, sent: &tapyard::Offload, ttl: u8, want: Flow) {
    assert_eq!(hdr, sent, "virtio-net header kept");
    let ip = etherparse::Ipv4HeaderSlice::from_slice(&f[14..]).unwrap();
    let h = ip.to_header();
    assert_eq!(h.header_checksum, h.calc_header_checksum(), "IPv4 checksum");
    assert_eq!(h.time_to_live, ttl, "TTL");
    assert_eq!(usize::from(h.total_len) + 14, f.len(), "IPv4 total length");
    let segs = kernel_segment(f, hdr);
    assert_eq!(segs.len(), SUPER_PAYLOAD.div_ceil(usize::from(MSS)));
    let mut data = Vec::new();
    for s in &segs {
        assert!(s.len() - 14 <= 1500, "segment fits the MTU");
        assert_eq!(flow(s), want, "segment's flow and checksums");
        data.extend_from_slice(&s[54..]);
    }
    let payload: Vec<u8> = (0..SUPER_PAYLOAD).map(|i| (i * 7 + 3) as u8).collect();
    assert_eq!(data, payload);
}

type Flow = ([u8; 4], u16, [u8; 4], u16);

#[test]
fn tso_super_frames_are_routed_and_natted_whole_with_partial_checksums_kept_right() {
    let mut n = node();
    // Routed, no NAT: pod A to node B's pod over eth0, TTL decremented.
    send(&mut n, PA, &tcp(POD_A, GW_MAC, A, 42000, REMOTE, 5201, SYN));
    let (v, _) = send(
        &mut n,
        ETH0,
        &tcp(PEER, UP_MAC, REMOTE, 5201, A, 42000, SYNACK),
    );
    assert_eq!(v, Verdict::Output(PA));
    let (sf, hdr) = super_frame(POD_A, GW_MAC, A, 42000, REMOTE, 5201);
    let (v, out) = send_offload(&mut n, PA, &sf, hdr);
    assert_eq!(v, Verdict::Output(ETH0));
    assert_eq!(out.len(), 1, "one super-frame out, not segments");
    let (p, f, h) = &out[0];
    assert_eq!(*p, ETH0);
    assert_eq!(
        &f[0..12],
        &[PEER.0, UP_MAC.0].concat()[..],
        "MACs rewritten"
    );
    check_super(f, h, &hdr, 63, (A, 42000, REMOTE, 5201));

    // Masqueraded: pod A to the outside through eth0, source rewritten to the node's address
    // (and maybe its port): the partial sum must follow the new source address.
    let (_, out) = send(&mut n, PA, &tcp(POD_A, GW_MAC, A, 42001, OUTSIDE, 443, SYN));
    let (_, msport, _, _) = flow(one(&out).1);
    let (v, _) = send(
        &mut n,
        ETH0,
        &tcp(OUTGW, UP_MAC, OUTSIDE, 443, NODE, msport, SYNACK),
    );
    assert_eq!(v, Verdict::Output(PA));
    let (sf, hdr) = super_frame(POD_A, GW_MAC, A, 42001, OUTSIDE, 443);
    let (v, out) = send_offload(&mut n, PA, &sf, hdr);
    assert_eq!(v, Verdict::Output(ETH0));
    assert_eq!(out.len(), 1);
    let (_, f, h) = &out[0];
    check_super(f, h, &hdr, 63, (NODE, msport, OUTSIDE, 443));

    // Pod A to the ClusterIP, DNAT'd to pod B on the same bridge (routed through cni0), and
    // pod B's data back, un-DNAT'd to come from the ClusterIP.
    let sport = (43000..43100u16)
        .find(|&s| {
            let (_, out) = send(&mut n, PA, &tcp(POD_A, GW_MAC, A, s, WEB, 80, SYN));
            flow(one(&out).1).2 == B
        })
        .expect("pod B chosen for one of 100 connections");
    let (v, _) = send(&mut n, PB, &tcp(POD_B, POD_A, B, 8080, A, sport, SYNACK));
    assert_eq!(v, Verdict::Output(PA));
    let (sf, hdr) = super_frame(POD_A, GW_MAC, A, sport, WEB, 80);
    let (v, out) = send_offload(&mut n, PA, &sf, hdr);
    assert_eq!(v, Verdict::Output(PB));
    assert_eq!(out.len(), 1);
    let (_, f, h) = &out[0];
    assert_eq!(&f[0..6], &POD_B.0);
    check_super(f, h, &hdr, 63, (A, sport, B, 8080));
    let (sf, hdr) = super_frame(POD_B, POD_A, B, 8080, A, sport);
    let (v, out) = send_offload(&mut n, PB, &sf, hdr);
    assert_eq!(v, Verdict::Output(PA));
    assert_eq!(out.len(), 1);
    let (_, f, h) = &out[0];
    // Switched on cni0 (pod B addressed pod A's MAC) and translated there: TTL kept.
    check_super(f, h, &hdr, 64, (WEB, 80, A, sport));
}
