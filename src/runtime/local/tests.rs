//! The local stack without root: a smoltcp client on the far side of a routed port talks to
//! the node's health check through the datapath (NAT on), the router's hand-off and
//! [`LocalTcp`]; closed ports are reset; a full queue drops.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV4, SocketAddrV6};

use smoltcp::iface::{Config, Interface, SocketSet};
use smoltcp::socket::tcp;
use smoltcp::wire::{HardwareAddress, IpAddress, IpCidr};

use super::*;
use crate::base::PortId;
use crate::buf::PacketBuf;
use crate::l3::IfaceConfig;
use crate::nat::{Endpoint, NatConfig, ServiceSpec};
use crate::wire::family::IpProto;
use crate::{Instant, Verdict, Worker};

const NODE_MAC: MacAddr = MacAddr([2, 0, 0, 0, 0, 1]);
const CLIENT_MAC: MacAddr = MacAddr([2, 0, 0, 0, 0, 2]);
const NODE: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 1);
const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 9, 0, 2);
const NODE6: Ipv6Addr = Ipv6Addr::new(0xfd00, 9, 0, 0, 0, 0, 0, 1);
const CLIENT6: Ipv6Addr = Ipv6Addr::new(0xfd00, 9, 0, 0, 0, 0, 0, 2);
const HC: u16 = 32000;

/// A node with one routed uplink (both families), NAT, and a Local Service with a health
/// check node port and one endpoint on the node (IPv4) and none (IPv6).
fn node() -> (Arc<Datapath>, PortId) {
    let mut b = Datapath::builder();
    let mut cfg = IfaceConfig::new("eth0", NODE_MAC, NODE, 24);
    cfg.addr6 = Some((NODE6, 64));
    let (_, port) = b.add_router_iface(cfg, None).unwrap();
    b.netfilter(NatConfig::default()).unwrap();
    let dp = Arc::new(b.build());
    let mut web = ServiceSpec::new(
        "shop/web:http",
        Ipv4Addr::new(10, 96, 0, 10),
        80,
        IpProto::TCP,
    );
    web.vip6 = Some(Ipv6Addr::new(0xfd00, 96, 0, 0, 0, 0, 0, 10));
    web.node_port = Some(30080);
    web.external_local = true;
    web.health_check_node_port = Some(HC);
    web.endpoints = vec![Endpoint::new(
        SocketAddrV4::new(Ipv4Addr::new(10, 244, 1, 2), 8080),
        true,
    )];
    web.endpoints6 = vec![Endpoint::new(
        SocketAddrV6::new(Ipv6Addr::new(0xfd00, 244, 0, 0, 0, 0, 0, 2), 8080, 0, 0),
        false,
    )];
    let nf = dp.control().netfilter().unwrap();
    nf.upsert_service(web, crate::Instant::from_secs(1))
        .unwrap();
    (dp, port)
}

/// The client's datagram as a frame from the client to the node.
fn frame(ip: &[u8]) -> Vec<u8> {
    let et = if ip[0] >> 4 == 6 { 0x86dd_u16 } else { 0x0800 };
    let mut f = NODE_MAC.0.to_vec();
    f.extend_from_slice(&CLIENT_MAC.0);
    f.extend_from_slice(&et.to_be_bytes());
    f.extend_from_slice(ip);
    f
}

/// Runs `frames` through the datapath: the frames it sends out of `port`.
fn process(dp: &Datapath, w: &mut Worker, port: PortId, frames: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let mut batch = Batch::new();
    for f in frames {
        let mut b = PacketBuf::from_frame(f);
        b.port = port;
        batch.push(b).unwrap();
    }
    dp.process(w, Instant::from_secs(2), &mut batch);
    let mut out = Vec::new();
    for (b, v) in batch.bufs().iter().zip(batch.verdicts()) {
        if *v == Verdict::Output(port) {
            out.push(b.frame().to_vec());
        }
    }
    dp.quiesce(w);
    out
}

/// A client stack (medium IP) that fetches `GET /` from `server` through the node; returns
/// what it read.
fn fetch(server: IpAddress, client: IpCidr, path: &str) -> String {
    let (dp, port) = node();
    let stack = dp.control().local_stack().unwrap();
    let mut w = dp.worker();
    let mut srv = LocalTcp::new();
    srv.set_ports(
        &dp.control().netfilter().unwrap().services().health_ports(),
        Some(10256),
    );
    stack.set_ports(&srv.ports());

    let mut dev = Queues::default();
    let mut iface = Interface::new(
        Config::new(HardwareAddress::Ip),
        &mut dev,
        smoltcp::time::Instant::ZERO,
    );
    iface.update_ip_addrs(|a| {
        a.push(client).unwrap();
    });
    let mut sockets = SocketSet::new(Vec::new());
    let sock = tcp::Socket::new(
        tcp::SocketBuffer::new(vec![0; 4096]),
        tcp::SocketBuffer::new(vec![0; 4096]),
    );
    let h = sockets.add(sock);
    let port_no = if path == "/healthz" { 10256 } else { HC };
    sockets
        .get_mut::<tcp::Socket>(h)
        .connect(iface.context(), (server, port_no), 40000)
        .unwrap();
    let mut got = Vec::new();
    let mut sent = false;
    let svc = dp.control().netfilter().map(|nf| nf.services());
    for step in 0..200 {
        let now = smoltcp::time::Instant::from_millis(step * 10);
        iface.poll(now, &mut dev, &mut sockets);
        let s = sockets.get_mut::<tcp::Socket>(h);
        if s.can_send() && !sent {
            s.send_slice(format!("GET {path} HTTP/1.1\r\nHost: node\r\n\r\n").as_bytes())
                .unwrap();
            sent = true;
        }
        let mut buf = [0u8; 1024];
        while let Ok(n) = s.recv_slice(&mut buf) {
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        if !s.is_open() && sent {
            break;
        }
        iface.poll(now, &mut dev, &mut sockets);
        let frames: Vec<Vec<u8>> = dev.tx.drain(..).map(|ip| frame(&ip)).collect();
        assert!(process(&dp, &mut w, port, &frames).is_empty(), "no reset");
        while let Some(seg) = stack.try_recv() {
            assert_eq!((seg.peer_mac, seg.iface), (CLIENT_MAC, crate::IfaceId(0)));
            srv.input(&seg, now);
            stack.recycle(seg);
        }
        let mut answer = |local, path: Option<&str>| {
            super::answer(svc, Some(10256), local, path, Duration::ZERO)
        };
        let mac_of = |_| Some(NODE_MAC);
        srv.poll(
            now,
            &mut answer,
            &mut |via, f| {
                assert_eq!(via, crate::IfaceId(0));
                assert_eq!((&f[..6], &f[6..12]), (&CLIENT_MAC.0[..], &NODE_MAC.0[..]));
                dev.rx.push_back(f[ETH_LEN..].to_vec());
            },
            &mac_of,
        );
    }
    String::from_utf8(got).unwrap()
}

#[test]
fn a_health_check_is_answered_through_the_datapath_200_on_ipv4() {
    let got = fetch(NODE.into(), IpCidr::new(CLIENT.into(), 24), "/");
    assert!(got.starts_with("HTTP/1.1 200 OK\r\n"), "{got}");
    assert!(
        got.contains("X-Load-Balancing-Endpoint-Weight: 1\r\n"),
        "{got}"
    );
    assert!(got.ends_with("\"namespace\": \"shop\",\n\t\t\"name\": \"web\"\n\t},\n\t\"localEndpoints\": 1,\n\t\"serviceProxyHealthy\": true\n}"), "{got}");
}

#[test]
fn ipv6_counts_its_own_family_none_local_503_and_healthz_answers() {
    let got = fetch(NODE6.into(), IpCidr::new(CLIENT6.into(), 64), "/");
    assert!(
        got.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
        "{got}"
    );
    assert!(got.contains("\"localEndpoints\": 0,"), "{got}");
    let got = fetch(NODE6.into(), IpCidr::new(CLIENT6.into(), 64), "/healthz");
    assert!(got.starts_with("HTTP/1.1 200 OK\r\n"), "{got}");
    assert!(got.contains("\"nodeEligible\": true}"), "{got}");
}

/// A SYN from the client to `dport` of the node, as a frame.
fn syn(dport: u16, sport: u16) -> Vec<u8> {
    let mut f = Vec::new();
    etherparse::PacketBuilder::ethernet2(CLIENT_MAC.0, NODE_MAC.0)
        .ipv4(CLIENT.octets(), NODE.octets(), 64)
        .tcp(sport, dport, 1, 65535)
        .syn()
        .write(&mut f, &[])
        .unwrap();
    f
}

#[test]
fn a_closed_port_is_reset_and_a_full_queue_drops() {
    let (dp, port) = node();
    let stack = dp.control().local_stack().unwrap();
    stack.set_ports(&[HC]);
    let mut w = dp.worker();
    // A closed port: a reset back to the client (not masqueraded or tracked one way).
    let out = process(&dp, &mut w, port, &[syn(9999, 1000)]);
    assert_eq!(out.len(), 1);
    let rst = &out[0];
    assert_eq!(&rst[..6], &CLIENT_MAC.0);
    assert_eq!(&rst[30..34], &CLIENT.octets(), "to the client");
    assert_eq!(rst[14 + 20 + 13] & 0x04, 0x04, "RST");
    assert!(stack.try_recv().is_none());
    // The health port: handed to the stack, until its queue is full.
    for sport in 2000..2000 + crate::l3::local::MAX_SEGMENTS + 10 {
        let sport = u16::try_from(sport).unwrap();
        let out = process(&dp, &mut w, port, &[syn(HC, sport)]);
        assert!(out.is_empty());
    }
    let mut n = 0;
    while let Some(s) = stack.try_recv() {
        n += 1;
        stack.recycle(s);
    }
    assert_eq!(n, crate::l3::local::MAX_SEGMENTS);
    let stats = dp.control().stats();
    let full = stats
        .drops
        .iter()
        .find(|d| d.0 == DropReason::LocalStackFull);
    assert_eq!(full.map(|d| d.1), Some(10));
    // No conntrack entry for them.
    let nf = dp.control().netfilter().unwrap();
    assert_eq!(nf.conntrack().len(), 1, "only the closed port's connection");
}
