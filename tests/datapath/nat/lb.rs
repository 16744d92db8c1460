//! LoadBalancer IPs, external IPs and `loadBalancerSourceRanges` (kube-proxy's `KUBE-EXT-*`
//! and `KUBE-FW-*`), both families: a client outside routes the addresses through the node.

use super::*;

use tapyard::nat::Prefix;

per_family!(
    lb_and_external_ips_follow_the_external_traffic_policy,
    source_ranges_drop_other_clients_of_the_lb_ip_only,
    a_removed_lb_ip_flushes_its_udp_flows,
    the_host_reaches_a_local_policy_lb_ip_masqueraded_on_every_endpoint,
);

/// Address `i` outside every subnet of the node (198.51.100.`i`, 2001:db8:5::`i`).
fn lb(p: &Plan, i: u8) -> IpAddr {
    if p.is_v6() {
        std::net::Ipv6Addr::new(0x2001, 0xdb8, 5, 0, 0, 0, 0, u16::from(i)).into()
    } else {
        std::net::Ipv4Addr::new(198, 51, 100, i).into()
    }
}

/// The node of the NAT tests, `web` (policy Cluster) with LoadBalancer IP 1 and external IP
/// 2, `web-local` (policy Local) with LoadBalancer IP 3 and external IP 4 (each of both
/// families).
fn lb_node() -> Node {
    let n = node();
    let nf = n.dp.control().netfilter().unwrap();
    for (name, l, e) in [("web", 1, 2), ("web-local", 3, 4)] {
        let mut s = nf.services().get(name).unwrap().spec().clone();
        s.load_balancer_ips = vec![lb(&Plan::V4, l), lb(&Plan::V6, l)];
        s.external_ips = vec![lb(&Plan::V4, e), lb(&Plan::V6, e)];
        nf.upsert_service(s, n.now).unwrap();
    }
    n
}

/// Changes Service `name` by `f`.
fn update(n: &Node, name: &str, f: impl FnOnce(&mut ServiceSpec)) {
    let nf = n.dp.control().netfilter().unwrap();
    let mut s = nf.services().get(name).unwrap().spec().clone();
    f(&mut s);
    nf.upsert_service(s, n.now).unwrap();
}

fn from_client(_: &Plan, src: IpAddr, sport: u16, dst: IpAddr) -> Vec<u8> {
    tcp(OUTGW, UP_MAC, src, sport, dst, 80, SYN)
}

fn lb_and_external_ips_follow_the_external_traffic_policy(p: Plan) {
    let mut n = lb_node();
    for ip in [lb(&p, 1), lb(&p, 2)] {
        // Cluster: every client masqueraded, to any endpoint.
        let mut ports = std::collections::HashSet::new();
        for sport in 50000..50030u16 {
            let (_, out) = send(&mut n, ETH0, &from_client(&p, p.client, sport, ip));
            let (port, f) = one(&out);
            let (src, _, dst, dport) = flow(f);
            assert_eq!(dport, 8080);
            match port {
                PB => assert_eq!((src, dst), (p.gw, p.b), "masqueraded"),
                ETH0 => assert_eq!((src, dst), (p.node, p.remote)),
                other => panic!("{other:?}"),
            }
            ports.insert(port);
        }
        assert_eq!(ports.len(), 2, "{ip}");
        // A pod too (KUBE-EXT-* masquerades every source under policy Cluster).
        let (_, out) = send(&mut n, PA, &from_a(&p, 40000, ip, 80, SYN));
        let (src, ..) = flow(one(&out).1);
        assert!(src == p.gw || src == p.node, "{src}");
    }
    for (ip, base) in [(lb(&p, 3), 51000), (lb(&p, 4), 51100)] {
        // Local: the client's address is kept, local endpoints only.
        for sport in base..base + 10u16 {
            let (_, out) = send(&mut n, ETH0, &from_client(&p, p.client, sport, ip));
            let (port, f) = one(&out);
            assert_eq!(port, PB);
            assert_eq!(flow(f), (p.client, sport, p.b, 8080));
        }
        // The endpoint's reply comes back from the address the client asked.
        let reply = tcp(POD_B, GW_MAC, p.b, 8080, p.client, base, SYNACK);
        let (v, out) = send(&mut n, PB, &reply);
        assert_eq!(v, Verdict::Output(ETH0));
        assert_eq!(flow(one(&out).1), (ip, 80, p.client, base));
        // A pod goes to every endpoint, unmasqueraded.
        let mut seen = std::collections::HashSet::new();
        for sport in base - 10000..base - 9970 {
            let (_, out) = send(&mut n, PA, &from_a(&p, sport, ip, 80, SYN));
            let (port, f) = one(&out);
            let (src, _, dst, _) = flow(f);
            assert_eq!(src, p.a, "pod traffic keeps its address");
            seen.insert((port, dst));
        }
        assert_eq!(seen.len(), 2, "{seen:?}");
    }
    // Local without a local endpoint: external clients dropped, pods still served.
    update(&n, "web-local", |s| {
        set_endpoints(s, &[(p.remote, 8080, false)])
    });
    let before = drops(&n, DropReason::NoEndpoint);
    let (v, _) = send(&mut n, ETH0, &from_client(&p, p.client, 52000, lb(&p, 3)));
    assert_eq!(v, Verdict::Drop(DropReason::NoEndpoint));
    assert_eq!(drops(&n, DropReason::NoEndpoint), before + 1);
    let (_, out) = send(&mut n, PA, &from_a(&p, 42000, lb(&p, 3), 80, SYN));
    assert_eq!(flow(one(&out).1), (p.a, 42000, p.remote, 8080));
    // Another port of the address is no Service.
    let other = tcp(OUTGW, UP_MAC, p.client, 52001, lb(&p, 1), 81, SYN);
    let (_, out) = send(&mut n, ETH0, &other);
    assert_ne!(flow(one(&out).1).3, 8080);
}

fn source_ranges_drop_other_clients_of_the_lb_ip_only(p: Plan) {
    let mut n = lb_node();
    // This family's range holds the client only; the other family's holds everything of
    // its own, which filters nothing here.
    let other = if p.is_v6() { Plan::V4 } else { Plan::V6 };
    let ranges = vec![
        Prefix {
            addr: p.client,
            len: if p.is_v6() { 128 } else { 32 },
        },
        Prefix {
            addr: other.outside,
            len: 8,
        },
    ];
    update(&n, "web-local", |s| s.load_balancer_source_ranges = ranges);
    let (_, out) = send(&mut n, ETH0, &from_client(&p, p.client, 53000, lb(&p, 3)));
    assert_eq!(flow(one(&out).1), (p.client, 53000, p.b, 8080));
    // Another client: dropped and counted.
    let (v, out) = send(&mut n, ETH0, &from_client(&p, p.outside, 53001, lb(&p, 3)));
    assert_eq!(v, Verdict::Drop(DropReason::LbSourceRange));
    assert!(out.is_empty());
    assert_eq!(drops(&n, DropReason::LbSourceRange), 1);
    // A pod outside the ranges too (KUBE-FW-* comes before the pods' short cut).
    let (v, _) = send(&mut n, PA, &from_a(&p, 43000, lb(&p, 3), 80, SYN));
    assert_eq!(v, Verdict::Drop(DropReason::LbSourceRange));
    assert_eq!(drops(&n, DropReason::LbSourceRange), 2);
    // The external IP, the node port and the ClusterIP are not filtered.
    let (_, out) = send(&mut n, ETH0, &from_client(&p, p.outside, 53002, lb(&p, 4)));
    assert_eq!(flow(one(&out).1), (p.outside, 53002, p.b, 8080));
    let np = tcp(OUTGW, UP_MAC, p.outside, 53003, p.node, 30081, SYN);
    let (_, out) = send(&mut n, ETH0, &np);
    assert_eq!(flow(one(&out).1), (p.outside, 53003, p.b, 8080));
    let (_, out) = send(&mut n, PA, &from_a(&p, 43001, p.svc(0x12), 80, SYN));
    assert_eq!(flow(one(&out).1).0, p.a);
    assert_eq!(drops(&n, DropReason::LbSourceRange), 2);
    // Established connections are not filtered again when the ranges change.
    update(&n, "web-local", |s| {
        s.load_balancer_source_ranges.truncate(1);
        s.load_balancer_source_ranges[0].addr = p.outside;
    });
    let reply = tcp(POD_B, GW_MAC, p.b, 8080, p.client, 53000, SYNACK);
    let (_, out) = send(&mut n, PB, &reply);
    assert_eq!(flow(one(&out).1), (lb(&p, 3), 80, p.client, 53000));
    let (v, _) = send(&mut n, ETH0, &from_client(&p, p.client, 53010, lb(&p, 3)));
    assert_eq!(v, Verdict::Drop(DropReason::LbSourceRange));
}

fn a_removed_lb_ip_flushes_its_udp_flows(p: Plan) {
    let mut n = node();
    update(&n, "dns", |s| {
        s.load_balancer_ips = vec![lb(&Plan::V4, 5), lb(&Plan::V6, 5)];
        s.external_ips = vec![lb(&Plan::V4, 6), lb(&Plan::V6, 6)];
    });
    let q = |ip, sport| udp(POD_A, GW_MAC, p.a, sport, ip, 53);
    let (_, out) = send(&mut n, PA, &q(lb(&p, 5), 35000));
    // Policy Cluster: the pod is masqueraded (KUBE-EXT-*).
    assert_eq!(flow(one(&out).1), (p.gw, 35000, p.b, 5353));
    send(&mut n, PA, &q(lb(&p, 6), 35001));
    send(&mut n, PA, &q(p.svc(0x53), 35002));
    assert_eq!(ct_len(&n, &p), 3);
    // The LoadBalancer IP goes: its flow only.
    update(&n, "dns", |s| s.load_balancer_ips.clear());
    assert_eq!(ct_len(&n, &p), 2, "{}", ct_dump(&n, &p));
    update(&n, "dns", |s| s.external_ips.clear());
    assert_eq!(ct_len(&n, &p), 1, "{}", ct_dump(&n, &p));
    // And the address answers no more.
    let (_, out) = send(&mut n, PA, &q(lb(&p, 5), 35003));
    assert_ne!(flow(one(&out).1).3, 5353);
}

fn the_host_reaches_a_local_policy_lb_ip_masqueraded_on_every_endpoint(p: Plan) {
    use tapyard_testkit::kube::{HOST0, HOST_MAC, KERNEL};
    let mut n = node_with(KubeOptions {
        host_port: true,
        ..KubeOptions::default()
    });
    update(&n, "web-local", |s| {
        s.load_balancer_ips = vec![lb(&Plan::V4, 3), lb(&Plan::V6, 3)];
    });
    // KUBE-EXT-*'s "masquerade LOCAL traffic": the node's own connection to the LoadBalancer
    // IP goes to any endpoint, masqueraded, where an external client gets B only.
    let (mut to_b, mut remote) = (0, 0);
    for sport in 49000..49064 {
        let syn = tcp(KERNEL, HOST_MAC, p.node, sport, lb(&p, 3), 80, SYN);
        let (v, out) = send(&mut n, HOST0, &syn);
        let (src, _, dst, _) = flow(one(&out).1);
        match v {
            Verdict::Output(PB) => {
                to_b += 1;
                assert_eq!((src, dst), (p.gw, p.b));
            }
            Verdict::Output(ETH0) => {
                remote += 1;
                assert_eq!((src, dst), (p.node, p.remote));
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(to_b > 0 && remote > 0, "B {to_b}, remote {remote}");
}
