//! kube-proxy's stale UDP flow cleanup (`CleanStaleEntries`) on Service creation and endpoint
//! changes, and the node-level NAT settings (`--masquerade-all`, `--nodeport-addresses`),
//! both families.

use super::*;

use tapyard::nat::{NatRules, Prefix};

per_family!(
    a_udp_flow_from_before_its_service_is_flushed_when_the_service_comes,
    a_udp_flow_to_a_node_port_from_before_the_service_is_flushed,
    a_udp_flow_to_a_removed_endpoint_moves_to_a_serving_one,
    an_unchanged_service_leaves_its_flows_alone,
    masquerade_all_masquerades_pods_to_cluster_ips,
    node_ports_answer_only_on_the_listed_node_addresses,
    a_node_address_that_starts_answering_a_node_port_gets_its_flows_flushed,
);

/// The family's datagram of pod A from `sport` to `dst`:`dport`.
fn dgram_a(p: &Plan, sport: u16, dst: IpAddr, dport: u16) -> Vec<u8> {
    udp(POD_A, GW_MAC, p.a, sport, dst, dport)
}

/// A UDP Service `name` on `svc(0x60)`:53 of `p`'s family over pod B:5353.
fn dns_svc(p: &Plan, node_port: Option<u16>) -> ServiceSpec {
    let mut s = ServiceSpec::new("late-dns", p.svc(0x60), 53, IpProto::UDP);
    set_endpoints(&mut s, &[(p.b, 5353, true)]);
    s.node_port = node_port;
    s
}

fn a_udp_flow_from_before_its_service_is_flushed_when_the_service_comes(p: Plan) {
    let mut n = node();
    let vip = p.svc(0x60);
    // No Service yet: the resolver's query follows the default route out of the node,
    // masqueraded (pod traffic leaving the cluster CIDR), and its entry stays.
    let (_, out) = send(&mut n, PA, &dgram_a(&p, 33000, vip, 53));
    let (port, f) = one(&out);
    assert_eq!(port, ETH0);
    assert_eq!(flow(f), (p.node, 33000, vip, 53));
    let (_, out) = send(&mut n, PA, &dgram_a(&p, 33000, vip, 53));
    assert_eq!(one(&out).0, ETH0, "the entry holds");
    // A flow of another port and one to another address are not the Service's.
    send(&mut n, PA, &dgram_a(&p, 33001, vip, 54));
    send(&mut n, PA, &dgram_a(&p, 33002, p.outside, 53));
    assert_eq!(ct_len(&n, &p), 3);
    upsert(&n, dns_svc(&p, None));
    assert_eq!(
        ct_len(&n, &p),
        2,
        "only the un-DNAT'd flow to the frontend is flushed"
    );
    // The same source port's next query reaches the endpoint, and the answer comes back
    // from the ClusterIP.
    let (v, out) = send(&mut n, PA, &dgram_a(&p, 33000, vip, 53));
    assert_eq!(v, Verdict::Output(PB));
    assert_eq!(flow(one(&out).1), (p.a, 33000, p.b, 5353));
    let (_, out) = send(&mut n, PB, &udp(POD_B, POD_A, p.b, 5353, p.a, 33000));
    assert_eq!(flow(one(&out).1), (vip, 53, p.a, 33000));
}

fn a_udp_flow_to_a_node_port_from_before_the_service_is_flushed(p: Plan) {
    let mut n = node();
    let from_client = |sport| udp(OUTGW, UP_MAC, p.client, sport, p.node, 30053);
    // No Service: the datagram is for the node itself, which has nothing on the port.
    send(&mut n, ETH0, &from_client(34000));
    assert_eq!(ct_len(&n, &p), 1);
    upsert(&n, dns_svc(&p, Some(30053)));
    assert_eq!(ct_len(&n, &p), 0);
    let (_, out) = send(&mut n, ETH0, &from_client(34000));
    let (port, f) = one(&out);
    assert_eq!(port, PB);
    assert_eq!(
        flow(f),
        (p.gw, 34000, p.b, 5353),
        "NodePort, policy Cluster"
    );
}

fn a_udp_flow_to_a_removed_endpoint_moves_to_a_serving_one(p: Plan) {
    let mut n = node();
    let vip = p.svc(0x60);
    upsert(&n, dns_svc(&p, None));
    let (_, out) = send(&mut n, PA, &dgram_a(&p, 33000, vip, 53));
    assert_eq!(flow(one(&out).1), (p.a, 33000, p.b, 5353));
    // The endpoint moves to the other node.
    let mut s = dns_svc(&p, None);
    set_endpoints(&mut s, &[(p.remote, 5353, false)]);
    upsert(&n, s);
    assert_eq!(ct_len(&n, &p), 0);
    let (_, out) = send(&mut n, PA, &dgram_a(&p, 33000, vip, 53));
    let (port, f) = one(&out);
    assert_eq!(port, ETH0);
    assert_eq!(flow(f), (p.a, 33000, p.remote, 5353));
    // All endpoints gone: flushed too, and the next datagram is refused at once.
    upsert(&n, ServiceSpec::new("late-dns", vip, 53, IpProto::UDP));
    assert_eq!(ct_len(&n, &p), 0);
    let (v, _) = send(&mut n, PA, &dgram_a(&p, 33000, vip, 53));
    assert_eq!(v, Verdict::Drop(DropReason::NoEndpoint));
}

fn an_unchanged_service_leaves_its_flows_alone(p: Plan) {
    let mut n = node();
    let vip = p.svc(0x60);
    upsert(&n, dns_svc(&p, None));
    send(&mut n, PA, &dgram_a(&p, 33000, vip, 53));
    // An endpoint added: the flow to the one that stays serving is kept.
    let mut s = dns_svc(&p, None);
    set_endpoints(&mut s, &[(p.b, 5353, true), (p.remote, 5353, false)]);
    upsert(&n, s.clone());
    assert_eq!(ct_len(&n, &p), 1);
    // The same spec again (or a change of a setting that is neither a frontend nor an
    // endpoint): nothing is flushed.
    upsert(&n, s.clone());
    s.affinity = Some(std::time::Duration::from_secs(60));
    upsert(&n, s);
    assert_eq!(ct_len(&n, &p), 1);
}

/// Adds or changes Service `s`.
fn upsert(n: &Node, s: ServiceSpec) {
    let nf = n.dp.control().netfilter().unwrap();
    nf.upsert_service(s, n.now).unwrap();
}

/// The node's NAT rules with `f` applied.
fn set_rules(n: &Node, f: impl FnOnce(&mut NatRules)) {
    let nf = n.dp.control().netfilter().unwrap();
    let mut r = NatRules::clone(&nf.rules());
    f(&mut r);
    nf.set_rules(r);
}

fn masquerade_all_masquerades_pods_to_cluster_ips(p: Plan) {
    let mut n = node();
    let web = p.svc(0x10);
    set_rules(&n, |r| r.masquerade_all = true);
    let mut seen = std::collections::HashSet::new();
    for sport in 41000..41020u16 {
        let (_, out) = send(&mut n, PA, &tcp(POD_A, GW_MAC, p.a, sport, web, 80, SYN));
        let (port, f) = one(&out);
        let (src, _, _, _) = flow(f);
        match port {
            PB => assert_eq!(src, p.gw, "masqueraded to cni0's address"),
            ETH0 => assert_eq!(src, p.node, "masqueraded to eth0's address"),
            other => panic!("{other:?}"),
        }
        seen.insert(port);
    }
    assert_eq!(seen.len(), 2);
    // Off again: a new connection keeps the pod's address.
    set_rules(&n, |r| r.masquerade_all = false);
    let (_, out) = send(&mut n, PA, &tcp(POD_A, GW_MAC, p.a, 41100, web, 80, SYN));
    assert_eq!(flow(one(&out).1).0, p.a);
}

/// A prefix of `a`'s family, as the family's `node_port_addresses`.
fn node_port_addresses(r: &mut NatRules, a: IpAddr, len: u8) {
    match a {
        IpAddr::V4(a) => r.node_port_addresses = vec![Prefix::new(a, len)],
        IpAddr::V6(a) => r.node_port_addresses6 = vec![Prefix::new(a, len)],
    }
}

fn node_ports_answer_only_on_the_listed_node_addresses(p: Plan) {
    let mut n = node();
    let syn = |sport| tcp(OUTGW, UP_MAC, p.client, sport, p.node, 30080, SYN);
    // Only the pod gateway's subnet: eth0's address no longer answers the NodePort (the
    // node's own stack resets the connection, as for any closed port).
    set_rules(&n, |r| node_port_addresses(r, p.gw, p.pod_len));
    let (v, _) = send(&mut n, ETH0, &syn(52000));
    assert_eq!(v, Verdict::Drop(DropReason::LocalNoService));
    // The other family's list does not restrict this one.
    set_rules(&n, |r| {
        let o = if p.is_v6() { Plan::V4 } else { Plan::V6 };
        *r = NatRules {
            node_port_addresses: Vec::new(),
            node_port_addresses6: Vec::new(),
            ..r.clone()
        };
        node_port_addresses(r, o.gw, o.pod_len);
    });
    let (_, out) = send(&mut n, ETH0, &syn(52001));
    assert!(matches!(one(&out).0, PB | ETH0));
    // eth0's subnet listed: answered.
    set_rules(&n, |r| {
        node_port_addresses(r, p.node, if p.is_v6() { 64 } else { 24 })
    });
    let (_, out) = send(&mut n, ETH0, &syn(52002));
    let (port, f) = one(&out);
    assert!(matches!(port, PB | ETH0));
    assert_eq!(flow(f).3, 8080, "DNAT'd to an endpoint");
}

fn a_node_address_that_starts_answering_a_node_port_gets_its_flows_flushed(p: Plan) {
    let mut n = node();
    upsert(&n, dns_svc(&p, Some(30053)));
    set_rules(&n, |r| node_port_addresses(r, p.gw, p.pod_len));
    // eth0's address does not answer the node port: the datagram is the node's own.
    let from_client = || udp(OUTGW, UP_MAC, p.client, 34000, p.node, 30053);
    let (_, out) = send(&mut n, ETH0, &from_client());
    assert!(out.iter().all(|(port, _)| *port != PB), "{out:?}");
    assert_eq!(ct_len(&n, &p), 1);
    // It answers from now on: the flow from before is stale, and flushed.
    set_rules(&n, |r| {
        *r = NatRules {
            node_port_addresses: Vec::new(),
            node_port_addresses6: Vec::new(),
            ..r.clone()
        }
    });
    let nf = n.dp.control().netfilter().unwrap();
    assert_eq!(nf.flush_stale_udp(n.now), 1);
    assert_eq!(nf.flush_stale_udp(n.now), 0);
    let (_, out) = send(&mut n, ETH0, &from_client());
    let (port, f) = one(&out);
    assert_eq!(port, PB);
    assert_eq!(flow(f), (p.gw, 34000, p.b, 5353));
}
