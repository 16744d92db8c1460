//! ICMP errors the router makes about packets it had NAT'd, without root: they must reach the
//! packet's original sender and quote the packet as that sender sent it, as on Linux (where
//! `icmp_send` attaches the offending packet's connection to the error and NAT translates it
//! like any RELATED packet). A node with pods on cni0 (10.244.1.0/24), an uplink eth0
//! (172.18.0.2/24, MTU 1400) whose default gateway may be dead (it never answers ARP), pod
//! traffic leaving the cluster masqueraded (`--random-fully`, so ports change), and two
//! Services: `web` (10.96.0.10:80) whose endpoint is on another node behind a dead next hop,
//! and `gone` (10.96.0.20:80) whose endpoint sits behind an `unreachable` route. Every
//! checksum of what comes out is checked: outer IPv4, ICMP, the quoted IPv4 header and, when
//! the quoted datagram is whole, its TCP/UDP checksum.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::time::Duration;

use etherparse::PacketBuilder;
use tapyard::l3::{IfaceConfig, NextHop, Route, RouteProto};
use tapyard::nat::{Endpoint, MasqueradeRule, NatConfig, NatRules, Prefix, ServiceSpec};
use tapyard::wire::family::IpProto;
use tapyard::{BridgeConfig, Datapath, DropReason, Instant, MacAddr, PortId, Verdict};
use tapyard_testkit::{send, tick, Node};

const GW_MAC: MacAddr = MacAddr([0x02, 0xaa, 0, 0, 0, 1]);
const UP_MAC: MacAddr = MacAddr([0x02, 0xaa, 0, 0, 0, 2]);
const POD_A: MacAddr = MacAddr([0x02, 0, 0, 0, 1, 2]);
const OUTGW: MacAddr = MacAddr([0x02, 0, 0, 0, 0x12, 1]);
const PA: PortId = PortId(0);
const ETH0: PortId = PortId(2);

const A: [u8; 4] = [10, 244, 1, 2];
const GW: [u8; 4] = [10, 244, 1, 1];
const NODE: [u8; 4] = [172, 18, 0, 2];
const DEFAULT_GW: [u8; 4] = [172, 18, 0, 1];
const REMOTE: [u8; 4] = [10, 244, 2, 2];
const WEB: [u8; 4] = [10, 96, 0, 10];
const GONE: [u8; 4] = [10, 96, 0, 20];
const OUTSIDE: [u8; 4] = [192, 0, 2, 10];

const TIME_EXCEEDED: u8 = 11;
const DEST_UNREACH: u8 = 3;
const HOST_UNREACH: u8 = 1;
const FRAG_NEEDED: u8 = 4;

/// The node; with `dead_gateway` the default gateway never answers ARP, else it is a static
/// neighbour. The next hop to node B's pods (172.18.0.3) is always dead.
fn node(dead_gateway: bool) -> Node {
    let mut b = Datapath::builder();
    let br = b.add_bridge(BridgeConfig::new("cni0")).unwrap();
    assert_eq!(b.add_port("pod-a", Some(br)).unwrap(), PA);
    let (cni0, _) = b
        .add_router_iface(
            IfaceConfig::new("cni0", GW_MAC, std::net::Ipv4Addr::from(GW), 24),
            Some(br),
        )
        .unwrap();
    let mut up = IfaceConfig::new("eth0", UP_MAC, std::net::Ipv4Addr::from(NODE), 24);
    up.mtu = 1400;
    let (eth0, port) = b.add_router_iface(up, None).unwrap();
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
            random_fully: true,
            ..NatRules::default()
        },
        ..NatConfig::default()
    })
    .unwrap();
    let dp = b.build();
    let now = Instant::from_secs(1);
    let route = |p: [u8; 4], len, next_hop| Route::<Ipv4Addr> {
        prefix: p.into(),
        len,
        next_hop,
        metric: 0,
        proto: RouteProto::Static,
        src: None,
    };
    let via = |gw: [u8; 4]| NextHop::Via(eth0, gw.into());
    dp.control()
        .add_route(route([0, 0, 0, 0], 0, via(DEFAULT_GW)))
        .unwrap();
    dp.control()
        .add_route(route([10, 244, 2, 0], 24, via([172, 18, 0, 3])))
        .unwrap();
    dp.control()
        .add_route(route([10, 244, 8, 0], 24, NextHop::Unreachable))
        .unwrap();
    dp.control()
        .add_static_neigh(cni0, std::net::IpAddr::from(A), POD_A, now)
        .unwrap();
    if !dead_gateway {
        dp.control()
            .add_static_neigh(eth0, std::net::IpAddr::from(DEFAULT_GW), OUTGW, now)
            .unwrap();
    }
    let nf = dp.control().netfilter().unwrap();
    for (name, vip, ep) in [("web", WEB, REMOTE), ("gone", GONE, [10, 244, 8, 8])] {
        let mut s = ServiceSpec::new(name, Ipv4Addr::from(vip), 80, IpProto::TCP);
        s.endpoints = vec![Endpoint::new(SocketAddrV4::new(ep.into(), 8080), false)];
        nf.upsert_service(s, now).unwrap();
    }
    let mut n = Node::with(dp, ());
    n.now = now;
    // Pod A announces itself so cni0 learns its port.
    n.announce(PA, POD_A);
    n
}

/// The ones'-complement sum of `b` (odd length padded), folded.
fn sum(b: &[u8], init: u32) -> u16 {
    let mut s = init;
    for c in b.chunks(2) {
        s += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
    }
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    u16::try_from(s).unwrap()
}

fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}

fn addr(b: &[u8]) -> [u8; 4] {
    [b[0], b[1], b[2], b[3]]
}

/// An ICMP error as a pod would read it.
#[derive(Debug, PartialEq, Eq)]
struct IcmpErr {
    src: [u8; 4],
    dst: [u8; 4],
    ty: u8,
    code: u8,
    /// The 32-bit word after the checksum (the MTU for fragmentation needed).
    rest: u32,
    /// The quoted packet: source, source port (ICMP echo: its identifier), destination,
    /// destination port (ICMP echo: 0).
    quoted: ([u8; 4], u16, [u8; 4], u16),
}

/// Parses an Ethernet + IPv4 + ICMP error frame, checking every checksum it can.
fn icmp_error(f: &[u8]) -> IcmpErr {
    assert_eq!(be16(&f[12..]), 0x0800, "not IPv4: {f:?}");
    let ip = &f[14..];
    let ihl = usize::from(ip[0] & 15) * 4;
    let total = usize::from(be16(&ip[2..]));
    assert_eq!(sum(&ip[..ihl], 0), 0xffff, "outer IPv4 checksum");
    assert_eq!(ip[9], 1, "not ICMP");
    let icmp = &ip[ihl..total];
    assert_eq!(sum(icmp, 0), 0xffff, "ICMP checksum");
    let q = &icmp[8..];
    let qihl = usize::from(q[0] & 15) * 4;
    assert_eq!(sum(&q[..qihl], 0), 0xffff, "quoted IPv4 checksum");
    let (qsrc, qdst, proto) = (addr(&q[12..]), addr(&q[16..]), q[9]);
    let l4 = &q[qihl..];
    let ports = match proto {
        1 => (be16(&l4[4..]), 0),
        _ => (be16(l4), be16(&l4[2..])),
    };
    // A whole quoted TCP/UDP datagram carries a checksum that must still verify.
    let qtotal = usize::from(be16(&q[2..]));
    if matches!(proto, 6 | 17) && qtotal <= q.len() {
        let seg = &q[qihl..qtotal];
        let len = u32::try_from(seg.len()).unwrap();
        let pseudo = u32::from(sum(&q[12..20], 0)) + u32::from(proto) + len;
        let zero_udp = proto == 17 && be16(&seg[6..]) == 0;
        assert!(zero_udp || sum(seg, pseudo) == 0xffff, "quoted L4 checksum");
    }
    IcmpErr {
        src: addr(&ip[12..]),
        dst: addr(&ip[16..]),
        ty: icmp[0],
        code: icmp[1],
        rest: u32::from_be_bytes([icmp[4], icmp[5], icmp[6], icmp[7]]),
        quoted: (qsrc, ports.0, qdst, ports.1),
    }
}

fn udp_from_a(dst: [u8; 4], ttl: u8, df: bool, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    PacketBuilder::ethernet2(POD_A.0, GW_MAC.0)
        .ipv4(A, dst, ttl)
        .udp(5353, 53)
        .write(&mut f, payload)
        .unwrap();
    if df {
        f[14 + 6] |= 0x40;
        f[14 + 10..14 + 12].copy_from_slice(&[0, 0]);
        let c = !sum(&f[14..34], 0);
        f[14 + 10..14 + 12].copy_from_slice(&c.to_be_bytes());
    }
    f
}

fn syn_from_a(dst: [u8; 4], ttl: u8) -> Vec<u8> {
    let mut f = Vec::new();
    PacketBuilder::ethernet2(POD_A.0, GW_MAC.0)
        .ipv4(A, dst, ttl)
        .tcp(40000, 80, 1000, 64240)
        .syn()
        .write(&mut f, &[])
        .unwrap();
    f
}

/// The frames on `port` among `out`.
fn on(out: &[(PortId, Vec<u8>)], port: PortId) -> Vec<&[u8]> {
    out.iter()
        .filter(|(p, _)| *p == port)
        .map(|(_, f)| f.as_slice())
        .collect()
}

/// Runs the timers every 100 ms for up to 5 s; the frames sent on `port` and when the first
/// one came, after the start.
fn wait_on(n: &mut Node, port: PortId) -> (Vec<Vec<u8>>, Duration) {
    let start = n.now;
    for _ in 0..50 {
        let out = tick(n, Duration::from_millis(100));
        let got: Vec<Vec<u8>> = on(&out, port).into_iter().map(<[u8]>::to_vec).collect();
        if !got.is_empty() {
            return (got, n.now.saturating_since(start));
        }
    }
    (Vec::new(), n.now.saturating_since(start))
}

/// A pod pings and sends UDP outside the cluster through a default gateway that never answers
/// ARP. The packets are masqueraded before they wait for ARP, so the errors tapyard builds when
/// resolution fails are about packets from the node's own address; translated back through
/// their connections, they reach the pod within ~3 s as on Linux, quoting what the pod sent,
/// from the address the packets had left with (Linux's choice: its route back to a
/// masqueraded source is a local one).
#[test]
fn masqueraded_packets_to_a_dead_gateway_get_host_unreachable_back() {
    let mut n = node(true);
    let mut ping = Vec::new();
    PacketBuilder::ethernet2(POD_A.0, GW_MAC.0)
        .ipv4(A, OUTSIDE, 64)
        .icmpv4_echo_request(0x4242, 1)
        .write(&mut ping, b"are you there")
        .unwrap();
    let (v, out) = send(&mut n, PA, &ping);
    assert_eq!(v, Verdict::Queued);
    assert_eq!(on(&out, ETH0).len(), 1, "an ARP request for the gateway");
    let (v, _) = send(&mut n, PA, &udp_from_a(OUTSIDE, 64, false, b"query"));
    assert_eq!(v, Verdict::Queued);
    // Masqueraded (and, with --random-fully, the UDP port changed) before queueing.
    let ct = n.dp.control().netfilter().unwrap().conntrack().dump(n.now);
    assert!(
        ct.iter().all(|e| e.reply.dst == Ipv4Addr::from(NODE)),
        "{ct:?}"
    );
    let (got, after) = wait_on(&mut n, PA);
    assert!(after <= Duration::from_millis(3100), "took {after:?}");
    let errs: Vec<IcmpErr> = got.iter().map(|f| icmp_error(f)).collect();
    let want = |quoted| IcmpErr {
        src: NODE,
        dst: A,
        ty: DEST_UNREACH,
        code: HOST_UNREACH,
        rest: 0,
        quoted,
    };
    assert_eq!(
        errs,
        vec![want((A, 0x4242, OUTSIDE, 0)), want((A, 5353, OUTSIDE, 53))]
    );
    let st = n.dp.control().stats();
    assert_eq!(st.drop_count(DropReason::NeighFailed), 2);
}

/// A pod connects to a Service whose endpoint is on another node behind a dead next hop: the
/// SYN was DNAT'd to the endpoint before it waited, and the host unreachable that comes back
/// quotes the Service address the pod connected to (else its socket would never match it),
/// from the pod's gateway.
#[test]
fn a_dnat_packet_to_a_dead_next_hop_gets_host_unreachable_quoting_the_service() {
    let mut n = node(true);
    let (v, _) = send(&mut n, PA, &syn_from_a(WEB, 64));
    assert_eq!(v, Verdict::Queued);
    let (got, _) = wait_on(&mut n, PA);
    assert_eq!(got.len(), 1);
    assert_eq!(
        icmp_error(&got[0]),
        IcmpErr {
            src: GW,
            dst: A,
            ty: DEST_UNREACH,
            code: HOST_UNREACH,
            rest: 0,
            quoted: (A, 40000, WEB, 80),
        }
    );
}

/// Errors the router makes before the packet would leave (TTL exceeded, fragmentation needed,
/// an unreachable route) about packets it had already translated at PREROUTING: masqueraded
/// ones and DNAT'd ones reach the pod, from its gateway (as Linux, where source NAT comes
/// after these checks), quoting what the pod sent.
#[test]
fn errors_about_translated_packets_before_they_leave_reach_the_pod() {
    let mut n = node(false);
    let err = |n: &mut Node, f: &[u8], why: DropReason| {
        let (v, out) = send(n, PA, f);
        assert_eq!(v, Verdict::Drop(why));
        let got = on(&out, PA);
        assert_eq!(got.len(), 1, "{why:?}: {out:?}");
        icmp_error(got[0])
    };
    let from_gw = |ty, code, rest, quoted| IcmpErr {
        src: GW,
        dst: A,
        ty,
        code,
        rest,
        quoted,
    };
    // Masqueraded, TTL 1: time exceeded.
    let e = err(
        &mut n,
        &udp_from_a(OUTSIDE, 1, false, b"query"),
        DropReason::TtlExpired,
    );
    assert_eq!(e, from_gw(TIME_EXCEEDED, 0, 0, (A, 5353, OUTSIDE, 53)));
    // Masqueraded, larger than eth0's MTU with DF: fragmentation needed, MTU 1400.
    let big = udp_from_a(OUTSIDE, 64, true, &[7; 1450]);
    let e = err(&mut n, &big, DropReason::FragNeeded);
    assert_eq!(
        e,
        from_gw(DEST_UNREACH, FRAG_NEEDED, 1400, (A, 5353, OUTSIDE, 53))
    );
    // DNAT'd to the endpoint, TTL 1: time exceeded quoting the Service address.
    let e = err(&mut n, &syn_from_a(WEB, 1), DropReason::TtlExpired);
    assert_eq!(e, from_gw(TIME_EXCEEDED, 0, 0, (A, 40000, WEB, 80)));
    // DNAT'd to an endpoint behind an `unreachable` route: host unreachable, same.
    let e = err(&mut n, &syn_from_a(GONE, 64), DropReason::Unreachable);
    assert_eq!(
        e,
        from_gw(DEST_UNREACH, HOST_UNREACH, 0, (A, 40000, GONE, 80))
    );
}

/// The reply direction: a reply from outside to a masqueraded pod is un-SNAT'd at once; when
/// the router cannot deliver it (TTL 1 here), the error goes back to the outside host quoting
/// the packet it sent (to the node's address and port), never the pod's address.
#[test]
fn an_error_about_a_reply_to_a_masqueraded_pod_quotes_what_the_outside_host_sent() {
    let mut n = node(false);
    let (v, out) = send(&mut n, PA, &udp_from_a(OUTSIDE, 64, false, b"query"));
    assert!(matches!(v, Verdict::Output(ETH0)), "{v:?}");
    let f = on(&out, ETH0)[0];
    let ip = &f[14..];
    assert_eq!(addr(&ip[12..]), NODE, "masqueraded");
    let mport = be16(&ip[20..]);
    let mut reply = Vec::new();
    PacketBuilder::ethernet2(OUTGW.0, UP_MAC.0)
        .ipv4(OUTSIDE, NODE, 1)
        .udp(53, mport)
        .write(&mut reply, b"answer")
        .unwrap();
    let (v, out) = send(&mut n, ETH0, &reply);
    assert_eq!(v, Verdict::Drop(DropReason::TtlExpired));
    let got = on(&out, ETH0);
    assert_eq!(got.len(), 1, "{out:?}");
    assert_eq!(&got[0][..6], &OUTGW.0, "through the default gateway");
    assert_eq!(
        icmp_error(got[0]),
        IcmpErr {
            src: NODE,
            dst: OUTSIDE,
            ty: TIME_EXCEEDED,
            code: 0,
            rest: 0,
            quoted: (OUTSIDE, 53, NODE, mport),
        }
    );
}
