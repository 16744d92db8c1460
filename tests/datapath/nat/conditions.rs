//! Endpoint conditions and traffic policies through the datapath, as kube-proxy's
//! `CategorizeEndpoints` and its filter rules make them: internalTrafficPolicy Local sends
//! ClusterIP traffic to local endpoints only and drops it (no RST) when there are none here
//! but some elsewhere; terminating endpoints that still serve take connections only when no
//! endpoint of the policy's set is ready (ClusterIP, and NodePort with
//! externalTrafficPolicy Local); a Service whose endpoints are none usable rejects; UDP flows
//! to an endpoint that stops serving are flushed.

use super::*;

use tapyard::nat::EndpointConditions;

per_family!(
    internal_local_goes_to_the_local_endpoint_only,
    internal_local_without_a_local_endpoint_drops_without_reset,
    cluster_ip_falls_back_to_serving_terminating_endpoints,
    external_local_falls_back_to_a_local_terminating_endpoint,
    endpoints_none_usable_are_rejected,
    udp_flows_to_an_endpoint_that_stops_serving_are_flushed,
);

/// `(address, port, local, conditions)`.
type CondEps = Vec<(IpAddr, u16, bool, EndpointConditions)>;

/// A Service `name` on `svc(n)` of `p`'s family, port 80 (NodePort `np`), with `eps`.
fn svc(p: &Plan, name: &str, n: u8, proto: IpProto, np: Option<u16>, eps: &CondEps) -> ServiceSpec {
    let mut s = ServiceSpec::new(name, p.svc(n), 80, proto);
    s.node_port = np;
    let plain: Eps = eps.iter().map(|&(a, port, l, _)| (a, port, l)).collect();
    set_endpoints(&mut s, &plain);
    for (e, &(.., c)) in s.endpoints.iter_mut().zip(eps.iter()) {
        e.conditions = c;
    }
    for (e, &(.., c)) in s.endpoints6.iter_mut().zip(eps.iter()) {
        e.conditions = c;
    }
    s
}

/// Adds or changes the Service.
fn up(n: &Node, s: ServiceSpec) {
    let nf = n.dp.control().netfilter().unwrap();
    nf.upsert_service(s, n.now).unwrap();
}

const R: EndpointConditions = EndpointConditions::READY;
const T: EndpointConditions = EndpointConditions::TERMINATING;
const GONE: EndpointConditions = EndpointConditions {
    ready: false,
    serving: false,
    terminating: true,
};

/// Where pod A's SYNs to `dst`:80 from ports `sports` go (output port and destination).
fn targets(n: &mut Node, p: &Plan, dst: IpAddr, sports: std::ops::Range<u16>) -> Vec<IpAddr> {
    let mut out = Vec::new();
    for sport in sports {
        let (_, o) = send(n, PA, &from_a(p, sport, dst, 80, SYN));
        out.push(flow(one(&o).1).2);
    }
    out
}

fn internal_local_goes_to_the_local_endpoint_only(p: Plan) {
    let mut n = node();
    let eps = vec![(p.b, 8080, true, R), (p.remote, 8080, false, R)];
    let mut s = svc(&p, "itp", 0x20, IpProto::TCP, Some(30090), &eps);
    s.internal_local = true;
    up(&n, s);
    let got = targets(&mut n, &p, p.svc(0x20), 40000..40030);
    assert!(got.iter().all(|&d| d == p.b), "{got:?}");
    // NodePort traffic keeps the external policy (Cluster): both endpoints.
    let mut seen = std::collections::HashSet::new();
    for sport in 50000..50030u16 {
        let f = tcp(OUTGW, UP_MAC, p.client, sport, p.node, 30090, SYN);
        let (_, out) = send(&mut n, ETH0, &f);
        seen.insert(flow(one(&out).1).2);
    }
    assert_eq!(seen.len(), 2, "{seen:?}");
}

fn internal_local_without_a_local_endpoint_drops_without_reset(p: Plan) {
    let mut n = node();
    let eps = vec![(p.remote, 8080, false, R)];
    let mut s = svc(&p, "itp", 0x20, IpProto::TCP, Some(30090), &eps);
    s.internal_local = true;
    up(&n, s);
    let before = drops(&n, DropReason::NoEndpoint);
    let (v, out) = send(&mut n, PA, &from_a(&p, 40000, p.svc(0x20), 80, SYN));
    assert_eq!(v, Verdict::Drop(DropReason::NoEndpoint));
    assert!(out.is_empty(), "dropped, not refused: {out:?}");
    assert_eq!(drops(&n, DropReason::NoEndpoint), before + 1);
    // From outside, the NodePort (policy Cluster) still reaches the remote endpoint.
    let f = tcp(OUTGW, UP_MAC, p.client, 50000, p.node, 30090, SYN);
    let (_, out) = send(&mut n, ETH0, &f);
    assert_eq!(flow(one(&out).1).2, p.remote);
}

fn cluster_ip_falls_back_to_serving_terminating_endpoints(p: Plan) {
    let mut n = node();
    // B terminates but still serves; the remote one is gone (not serving): B takes all.
    let eps = vec![(p.b, 8080, true, T), (p.remote, 8080, false, GONE)];
    up(&n, svc(&p, "term", 0x21, IpProto::TCP, None, &eps));
    let got = targets(&mut n, &p, p.svc(0x21), 40000..40020);
    assert!(got.iter().all(|&d| d == p.b), "{got:?}");
    let reply = tcp(POD_B, POD_A, p.b, 8080, p.a, 40000, SYNACK);
    assert_eq!(send(&mut n, PB, &reply).0, Verdict::Output(PA));
    // A ready endpoint appears: it takes every new connection; B's connection stays.
    let eps = vec![(p.b, 8080, true, T), (p.remote, 8080, false, R)];
    up(&n, svc(&p, "term", 0x21, IpProto::TCP, None, &eps));
    let got = targets(&mut n, &p, p.svc(0x21), 41000..41020);
    assert!(got.iter().all(|&d| d == p.remote), "{got:?}");
    let (_, out) = send(&mut n, PA, &from_a(&p, 40000, p.svc(0x21), 80, ACK));
    assert_eq!(flow(one(&out).1).2, p.b);
}

fn external_local_falls_back_to_a_local_terminating_endpoint(p: Plan) {
    let mut n = node();
    // The local endpoint terminates while a remote one is ready: the Local policy's set falls
    // back to it on its own (external traffic keeps its client address and stays here).
    let eps = vec![(p.b, 8080, true, T), (p.remote, 8080, false, R)];
    let mut s = svc(&p, "etp", 0x22, IpProto::TCP, Some(30091), &eps);
    s.external_local = true;
    up(&n, s.clone());
    for sport in 51000..51010u16 {
        let f = tcp(OUTGW, UP_MAC, p.client, sport, p.node, 30091, SYN);
        let (_, out) = send(&mut n, ETH0, &f);
        let (port, f) = one(&out);
        assert_eq!(port, PB);
        assert_eq!(flow(f), (p.client, sport, p.b, 8080));
    }
    // Pods get the cluster-wide set: the ready remote endpoint only.
    let got = targets(&mut n, &p, p.svc(0x22), 42000..42010);
    assert!(got.iter().all(|&d| d == p.remote), "{got:?}");
    // The local endpoint stops serving: external traffic is dropped (no local endpoint).
    let eps = vec![(p.b, 8080, true, GONE), (p.remote, 8080, false, R)];
    let mut s = svc(&p, "etp", 0x22, IpProto::TCP, Some(30091), &eps);
    s.external_local = true;
    up(&n, s);
    let f = tcp(OUTGW, UP_MAC, p.client, 52000, p.node, 30091, SYN);
    let (v, out) = send(&mut n, ETH0, &f);
    assert_eq!(v, Verdict::Drop(DropReason::NoEndpoint));
    assert!(out.is_empty());
}

fn endpoints_none_usable_are_rejected(p: Plan) {
    let mut n = node();
    // Listed but none ready nor serving-terminating: kube-proxy's "has no endpoints": REJECT,
    // under either internal policy.
    let eps = vec![(p.b, 8080, true, GONE), (p.remote, 8080, false, GONE)];
    let mut s = svc(&p, "dead", 0x23, IpProto::TCP, None, &eps);
    s.internal_local = true;
    up(&n, s);
    let (v, out) = send(&mut n, PA, &from_a(&p, 40000, p.svc(0x23), 80, SYN));
    assert_eq!(v, Verdict::Drop(DropReason::NoEndpoint));
    let (port, f) = one(&out);
    assert_eq!(port, PA);
    assert_eq!(
        flow(f),
        (p.svc(0x23), 80, p.a, 40000),
        "a reset from the ClusterIP"
    );
}

fn udp_flows_to_an_endpoint_that_stops_serving_are_flushed(p: Plan) {
    let mut n = node();
    let eps = vec![(p.b, 5353, true, R)];
    let dns = |eps: &CondEps| svc(&p, "dns2", 0x24, IpProto::UDP, None, eps);
    up(&n, dns(&eps));
    send(&mut n, PA, &udp(POD_A, GW_MAC, p.a, 35000, p.svc(0x24), 80));
    assert_eq!(ct_len(&n, &p), 1);
    // Terminating but serving: the flow stays (CleanStaleEntries keeps serving endpoints).
    up(&n, dns(&vec![(p.b, 5353, true, T)]));
    assert_eq!(ct_len(&n, &p), 1, "{}", ct_dump(&n, &p));
    // No longer serving: flushed.
    up(&n, dns(&vec![(p.b, 5353, true, GONE)]));
    assert_eq!(ct_len(&n, &p), 0, "{}", ct_dump(&n, &p));
}
