//! Connections outlive the datapath: a node whose connection table is kept in a file
//! (`DatapathBuilder::conntrack_file`) is built, carries a Service connection (DNAT) and a
//! masqueraded one (SNAT), and is built again on the same file, as `tapyard run` after a
//! restart: the replies of both connections are still translated, the pod's next packet
//! goes to the same endpoint, and the source-port allocator does not hand out the kept port.

use crate::common;

use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::{Path, PathBuf};

use etherparse::{NetSlice, SlicedPacket, TransportSlice};
use tapyard::conntrack::{CtConfig, Opened};
use tapyard::nat::{Endpoint, ServiceSpec};
use tapyard::wire::family::IpProto;
use tapyard::{Clock, PortId};
use tapyard_testkit::frame::{tcp, ACK, SYN, SYNACK};
use tapyard_testkit::kube::{
    kube_node, Ifaces, KubeOptions, ETH0, GW_MAC, OUTGW, PA, PB, PEER, POD_A, POD_B, UP_MAC,
};

type Node = tapyard_testkit::Node<Ifaces>;

const A: [u8; 4] = [10, 244, 1, 2];
const B: [u8; 4] = [10, 244, 1, 3];
const WEB: [u8; 4] = [10, 96, 0, 10];
const OTHER: [u8; 4] = [10, 96, 0, 20];
const OUTSIDE: [u8; 4] = [192, 0, 2, 10];
const NODE: [u8; 4] = [172, 18, 0, 2];

/// Removes the table's file, and the IPv6 table's beside it, when the test ends, however it
/// ends.
struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
        let _ = std::fs::remove_file(tapyard::conntrack6_path(&self.0));
    }
}

/// The test kit's Kubernetes node with its tables in `file` (4,096 entries) and one Service,
/// `web` (10.96.0.10:80, eight endpoints on node B's pods, client affinity).
/// `services_first_other` adds an unrelated Service before `web`, so `web` gets another id
/// than in a node built without it (as after reloads in the previous process).
fn node(file: &Path, services_first_other: bool) -> (Node, Opened) {
    let n = kube_node(KubeOptions {
        conntrack_file: Some(file),
        conntrack: Some(CtConfig {
            max_entries: 4096,
            ..CtConfig::default()
        }),
        ..KubeOptions::default()
    });
    let now = n.now;
    let nf = n.dp.control().netfilter().unwrap();
    if services_first_other {
        let mut other = ServiceSpec::new("other", Ipv4Addr::from(OTHER), 80, IpProto::TCP);
        other.endpoints = vec![Endpoint::new(SocketAddrV4::new(B.into(), 9090), true)];
        nf.upsert_service(other, now).unwrap();
    }
    // Eight endpoints on node B's pods, with client affinity.
    let mut web = ServiceSpec::new("web", Ipv4Addr::from(WEB), 80, IpProto::TCP);
    web.endpoints = (2..10)
        .map(|i| Endpoint::new(SocketAddrV4::new([10, 244, 2, i].into(), 8080), false))
        .collect();
    web.affinity = Some(std::time::Duration::from_secs(600));
    nf.upsert_service(web, now).unwrap();
    nf.services().relink(nf.conntrack(), now);
    let opened = n.ext.opened.clone().expect("a table file");
    (n, opened)
}

fn send(n: &mut Node, port: PortId, frame: &[u8]) -> Vec<(PortId, Vec<u8>)> {
    common::send_one(&n.dp, &mut n.w, Clock::new().now(), port, frame).1
}

/// (src, sport, dst, dport) of the one frame sent, and its port.
fn one(out: &[(PortId, Vec<u8>)]) -> (PortId, [u8; 4], u16, [u8; 4], u16) {
    assert_eq!(out.len(), 1, "{out:?}");
    let p = SlicedPacket::from_ethernet(&out[0].1).unwrap();
    let Some(NetSlice::Ipv4(ip)) = &p.net else {
        panic!("not IPv4")
    };
    let h = ip.header().to_header();
    let Some(TransportSlice::Tcp(t)) = &p.transport else {
        panic!("not TCP")
    };
    let want = t.to_header().calc_checksum_ipv4(&h, t.payload()).unwrap();
    assert_eq!(t.checksum(), want, "TCP checksum");
    (
        out[0].0,
        h.source,
        t.source_port(),
        h.destination,
        t.destination_port(),
    )
}

#[test]
fn translations_survive_a_rebuild_on_the_same_file() {
    let file =
        TempFile(std::env::temp_dir().join(format!("tapyard-nat-restart-{}", std::process::id())));
    let _ = std::fs::remove_file(&file.0);
    let (mut n, opened) = node(&file.0, false);
    assert_eq!(opened, Opened::Created);
    // Pod A to the Service (DNAT to one of eight endpoints) and to an outside host
    // (masqueraded to the node's address).
    let (_, _, _, ep, ep_port) = one(&send(
        &mut n,
        PA,
        &tcp(POD_A, GW_MAC, A, 40001, WEB, 80, SYN),
    ));
    assert_eq!(ep_port, 8080);
    let (port, src, masq_port, dst, _) = one(&send(
        &mut n,
        PA,
        &tcp(POD_A, GW_MAC, A, 40000, OUTSIDE, 443, SYN),
    ));
    assert_eq!((port, src, dst), (ETH0, NODE, OUTSIDE));
    let before =
        n.dp.control()
            .netfilter()
            .unwrap()
            .conntrack()
            .dump(Clock::new().now());
    assert_eq!(before.len(), 2);
    drop(n);

    // The restart: the same file, the Services added in another order.
    let (mut n, opened) = node(&file.0, true);
    assert_eq!(opened, Opened::Reused);
    let ct = n.dp.control().netfilter().unwrap().conntrack();
    ct.check_invariants().unwrap();
    let after = ct.dump(Clock::new().now());
    assert_eq!(after.len(), 2);
    for (b, a) in before.iter().zip(&after) {
        assert_eq!((b.orig, b.reply, b.state), (a.orig, a.reply, a.state));
    }
    // The Service connection keeps its tag under the Service's new id.
    let web_id =
        n.dp.control()
            .netfilter()
            .unwrap()
            .services()
            .get("web")
            .unwrap()
            .id()
            .get();
    assert!(after
        .iter()
        .any(|v| v.service == web_id && v.orig.dst == Ipv4Addr::from(WEB)));
    // The endpoint's SYN-ACK comes back from the ClusterIP.
    let reply = tcp(PEER, UP_MAC, ep, 8080, A, 40001, SYNACK);
    let (port, src, sport, dst, dport) = one(&send(&mut n, ETH0, &reply));
    assert_eq!((port, src, sport, dst, dport), (PA, WEB, 80, A, 40001));
    // The pod's ACK goes to the same endpoint.
    let (_, _, _, dst, dport) = one(&send(
        &mut n,
        PA,
        &tcp(POD_A, GW_MAC, A, 40001, WEB, 80, ACK),
    ));
    assert_eq!((dst, dport), (ep, 8080));
    // A new connection of the same client sticks to that endpoint (affinity restored).
    for sport in 41000..41010 {
        let (_, _, _, dst, _) = one(&send(
            &mut n,
            PA,
            &tcp(POD_A, GW_MAC, A, sport, WEB, 80, SYN),
        ));
        assert_eq!(dst, ep, "affinity after the restart");
    }
    // The outside host's SYN-ACK reaches pod A, untranslated back.
    let reply = tcp(OUTGW, UP_MAC, OUTSIDE, 443, NODE, masq_port, SYNACK);
    let (port, src, sport, dst, dport) = one(&send(&mut n, ETH0, &reply));
    assert_eq!((port, src, sport, dst, dport), (PA, OUTSIDE, 443, A, 40000));
    // Pod B, same source port, same server: the kept binding's port is not handed out again.
    let (_, src, sport, _, _) = one(&send(
        &mut n,
        PB,
        &tcp(POD_B, GW_MAC, B, 40000, OUTSIDE, 443, SYN),
    ));
    assert_eq!(src, NODE);
    assert_ne!(sport, masq_port);
}
