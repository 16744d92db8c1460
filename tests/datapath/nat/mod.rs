//! Conntrack and NAT without root, on the dual-stack Kubernetes node of the test kit
//! ([`tapyard_testkit::kube`]: pods A and B on cni0, an uplink to node B's pods and a default
//! gateway) with dual-stack Services, masquerade and NodePorts configured; frames built byte
//! by byte go in, and what comes out is checked as kube-proxy's rules on a Linux node would
//! make it, every checksum recomputed. What both families share is written once over a
//! [`Plan`] and runs once per family (`nat::generic::v4::name`, `..::v6::name`); what one
//! family alone has lives in `ipv4` and `ipv6`.

mod conditions;
mod frags;
mod generic;
mod host;
mod ipv4;
mod ipv6;
mod lb;
mod stale;

use std::net::{IpAddr, SocketAddr};

use tapyard::nat::{Endpoint, LbAlgo, ServiceSpec};
use tapyard::wire::family::IpProto;
use tapyard::{DropReason, Verdict};
use tapyard_testkit::frame::{self, tcp, udp, ACK, SYN, SYNACK};
use tapyard_testkit::kube::{
    kube_node, Ifaces, KubeOptions, Plan, ETH0, GW_MAC, OUTGW, PA, PB, PEER, POD_A, POD_B, UP_MAC,
};
use tapyard_testkit::{one, send};

type Node = tapyard_testkit::Node<Ifaces>;

/// Runs `$name(Plan::V4)` as `v4::$name` and `$name(Plan::V6)` as `v6::$name`.
macro_rules! per_family {
    ($($name:ident),* $(,)?) => {
        mod v4 {
            $(#[test] fn $name() { super::$name(tapyard_testkit::kube::Plan::V4) })*
        }
        mod v6 {
            $(#[test] fn $name() { super::$name(tapyard_testkit::kube::Plan::V6) })*
        }
    };
}
use per_family;

/// Endpoints: `(address, port, on this node)`.
type Eps = Vec<(IpAddr, u16, bool)>;

/// Sets the endpoints of `spec` of `addr`'s family: `(address, port, on this node)`.
fn set_endpoints(spec: &mut ServiceSpec, eps: &[(IpAddr, u16, bool)]) {
    for family_v6 in [false, true] {
        let of = |a: &IpAddr| a.is_ipv6() == family_v6;
        if !eps.iter().any(|(a, ..)| of(a)) {
            continue;
        }
        if family_v6 {
            spec.endpoints6 = eps
                .iter()
                .filter_map(|&(a, port, local)| match SocketAddr::new(a, port) {
                    SocketAddr::V6(s) => Some(Endpoint::<std::net::Ipv6Addr>::new(s, local)),
                    SocketAddr::V4(_) => None,
                })
                .collect();
        } else {
            spec.endpoints = eps
                .iter()
                .filter_map(|&(a, port, local)| match SocketAddr::new(a, port) {
                    SocketAddr::V4(s) => Some(Endpoint::new(s, local)),
                    SocketAddr::V6(_) => None,
                })
                .collect();
        }
    }
}

/// A dual-stack Service `name` on `svc(n)` of both plans, port `port`, with endpoints
/// `eps(plan)` in each family.
fn dual(name: &str, n: u8, port: u16, proto: IpProto, eps: &dyn Fn(&Plan) -> Eps) -> ServiceSpec {
    let mut s = ServiceSpec::new(name, Plan::V4.svc(n), port, proto);
    let IpAddr::V6(vip6) = Plan::V6.svc(n) else {
        unreachable!()
    };
    s.vip6 = Some(vip6);
    for p in [Plan::V4, Plan::V6] {
        set_endpoints(&mut s, &eps(&p));
    }
    s
}

/// The kit's node with the Services of these tests, dual-stack (ClusterIPs `svc(..)` of
/// each plan):
/// - `web` (0x10, TCP 80, NodePort 30080): endpoints B (local) and the remote pod, port 8080;
/// - `web-local` (0x12, NodePort 30081, externalTrafficPolicy Local): the same endpoints;
/// - `dns` (0x53, UDP 53): B, port 5353;
/// - `self` (0x11, TCP 80, Maglev): B, port 8080 (B reaching itself: hairpin);
/// - `empty` (0x99, TCP 80 and UDP 53 as `empty-udp`): no endpoints.
fn node() -> Node {
    node_with(KubeOptions::default())
}

fn node_with(opts: KubeOptions<'_>) -> Node {
    let n = kube_node(opts);
    let nf = n.dp.control().netfilter().unwrap();
    let web = |p: &Plan| vec![(p.b, 8080, true), (p.remote, 8080, false)];
    let mut s = dual("web", 0x10, 80, IpProto::TCP, &web);
    s.node_port = Some(30080);
    nf.upsert_service(s, n.now).unwrap();
    let mut s = dual("web-local", 0x12, 80, IpProto::TCP, &web);
    s.node_port = Some(30081);
    s.external_local = true;
    nf.upsert_service(s, n.now).unwrap();
    let s = dual("dns", 0x53, 53, IpProto::UDP, &|p| vec![(p.b, 5353, true)]);
    nf.upsert_service(s, n.now).unwrap();
    let mut s = dual("self", 0x11, 80, IpProto::TCP, &|p| vec![(p.b, 8080, true)]);
    s.algo = LbAlgo::Maglev;
    nf.upsert_service(s, n.now).unwrap();
    nf.upsert_service(dual("empty", 0x99, 80, IpProto::TCP, &|_| vec![]), n.now)
        .unwrap();
    nf.upsert_service(
        dual("empty-udp", 0x99, 53, IpProto::UDP, &|_| vec![]),
        n.now,
    )
    .unwrap();
    n
}

/// What a frame carries: (src, sport, dst, dport) for TCP/UDP of either family, every
/// checksum checked.
fn flow(f: &[u8]) -> (IpAddr, u16, IpAddr, u16) {
    frame::flow(f)
}

/// The connection table of `p`'s family as `conntrack -L` prints it.
fn ct_dump(n: &Node, p: &Plan) -> String {
    let nf = n.dp.control().netfilter().unwrap();
    if p.is_v6() {
        nf.conntrack_of::<std::net::Ipv6Addr>().fmt_dump(n.now)
    } else {
        nf.conntrack().fmt_dump(n.now)
    }
}

/// The entries of `p`'s family's connection table.
fn ct_len(n: &Node, p: &Plan) -> usize {
    let nf = n.dp.control().netfilter().unwrap();
    if p.is_v6() {
        nf.conntrack_of::<std::net::Ipv6Addr>().len()
    } else {
        nf.conntrack().len()
    }
}

/// Pod A's TCP segment to `dst`:`dport` from `sport`.
fn from_a(p: &Plan, sport: u16, dst: IpAddr, dport: u16, flags: u8) -> Vec<u8> {
    tcp(POD_A, GW_MAC, p.a, sport, dst, dport, flags)
}

/// Frames dropped for `r` so far.
fn drops(n: &Node, r: DropReason) -> u64 {
    n.dp.control().stats().drop_count(r)
}
