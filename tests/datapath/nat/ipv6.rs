//! What only IPv6 has here: ICMPv6 packet too big about a DNAT'd connection, and a
//! dual-stack UDP Service losing one IPv6 endpoint while its IPv4 side stays.

use super::*;

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV4};

use etherparse::{Icmpv6Type, NetSlice, PacketBuilder, SlicedPacket, TransportSlice};
use tapyard_testkit::frame::ip6 as a;

const A: &str = "fd00:10:244:1::2";
const B: &str = "fd00:10:244:1::3";
const REMOTE: &str = "fd00:10:244:2::2";
const WEB: &str = "fd00:10:96::10";
const OUTSIDE: &str = "2001:db8::10";
const A4: [u8; 4] = [10, 244, 1, 2];
const B4: [u8; 4] = [10, 244, 1, 3];

/// What a frame carries over IPv6.
fn flow6(f: &[u8]) -> (Ipv6Addr, u16, Ipv6Addr, u16) {
    frame::flow(f)
}

fn ep6(ip: &str, port: u16, local: bool) -> Endpoint<Ipv6Addr> {
    Endpoint::new(std::net::SocketAddrV6::new(a(ip), port, 0, 0), local)
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
        .conntrack_of::<std::net::Ipv6Addr>()
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
        let (_, _, dst, _) = flow6(one(&out).1);
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
        assert_eq!(flow6(f), (a(A), sport, a(B), 5353));
    }

    // The Service is removed: all its UDP flows go, in both families; others stay.
    let nf = n.dp.control().netfilter().unwrap();
    nf.remove_service("dns-dual", n.now).unwrap();
    assert_eq!(udp_flows_to(&n, B4.into(), a(B)), (0, 0));
    let rest: Vec<_> = nf
        .conntrack_of::<std::net::Ipv6Addr>()
        .dump(n.now)
        .into_iter()
        .filter(|v| v.proto == 17)
        .map(|v| v.orig.dst)
        .collect();
    assert_eq!(rest, vec![a(OUTSIDE)], "the masqueraded flow is kept");
}
