//! The host port (`host0`, [`KubeOptions::host_port`]): the node's own IP stack behind a router
//! interface, holding the node's address (the uplink's too). The host reaches ClusterIPs and
//! pods through it, masqueraded as kube-proxy masquerades node-originated Service traffic; a
//! Service may have the node's address as an endpoint (a hostNetwork server), reached from
//! pods with their own addresses and from outside through a NodePort, masqueraded; what
//! arrives for the node's address and is no NodePort and no reply goes to the host instead of
//! being answered by the router.

use super::*;

use tapyard_testkit::kube::{HOST0, HOST_MAC, KERNEL};

per_family!(
    a_pod_reaches_a_service_whose_endpoint_is_the_host_with_its_own_address,
    outside_clients_reach_the_host_endpoint_through_a_node_port_masqueraded,
    the_host_reaches_a_cluster_ip_masqueraded_and_a_pod_unmasqueraded,
    what_no_rule_translates_for_the_node_address_goes_to_the_host,
    the_host_reaches_its_own_local_policy_node_port_masqueraded_on_every_endpoint,
);

/// The kit's node with a host port and the Services of [`node`], plus `hostsvc` (0x20, TCP
/// 80, NodePort 30090): one endpoint, the node's own address port 8080 (on this node).
fn host_node(p: &Plan) -> Node {
    let n = node_with(KubeOptions {
        host_port: true,
        ..KubeOptions::default()
    });
    let nf = n.dp.control().netfilter().unwrap();
    let mut s = dual("hostsvc", 0x20, 80, IpProto::TCP, &|p| {
        vec![(p.node, 8080, true)]
    });
    s.node_port = Some(30090);
    nf.upsert_service(s, n.now).unwrap();
    assert!(n.dp.control().router().unwrap().is_host_addr(p.node));
    n
}

/// A TCP segment from the host (the kernel's side of `host0`).
fn from_host(src: IpAddr, sport: u16, dst: IpAddr, dport: u16, flags: u8) -> Vec<u8> {
    tcp(KERNEL, HOST_MAC, src, sport, dst, dport, flags)
}

fn a_pod_reaches_a_service_whose_endpoint_is_the_host_with_its_own_address(p: Plan) {
    let mut n = host_node(&p);
    let vip = p.svc(0x20);
    let (v, out) = send(&mut n, PA, &from_a(&p, 45000, vip, 80, SYN));
    assert_eq!(v, Verdict::Output(HOST0));
    let (port, f) = one(&out);
    assert_eq!(port, HOST0);
    assert_eq!(&f[0..6], &KERNEL.0, "to the host's MAC");
    // kube-proxy keeps a pod's address towards a Service (no KUBE-MARK-MASQ).
    assert_eq!(flow(f), (p.a, 45000, p.node, 8080));
    // The host's server answers through the host port: from the ClusterIP again.
    let (v, out) = send(&mut n, HOST0, &from_host(p.node, 8080, p.a, 45000, SYNACK));
    assert_eq!(v, Verdict::Output(PA));
    assert_eq!(flow(one(&out).1), (vip, 80, p.a, 45000));
}

fn outside_clients_reach_the_host_endpoint_through_a_node_port_masqueraded(p: Plan) {
    let mut n = host_node(&p);
    let syn = tcp(OUTGW, UP_MAC, p.client, 46000, p.node, 30090, SYN);
    let (v, out) = send(&mut n, ETH0, &syn);
    assert_eq!(v, Verdict::Output(HOST0));
    let (src, sport, dst, dport) = flow(one(&out).1);
    // KUBE-EXT-* (policy Cluster) masquerades, here to the host port's own address.
    assert_eq!((src, dst, dport), (p.host_gw, p.node, 8080));
    let (v, out) = send(
        &mut n,
        HOST0,
        &from_host(p.node, 8080, p.host_gw, sport, SYNACK),
    );
    assert_eq!(v, Verdict::Output(ETH0));
    assert_eq!(flow(one(&out).1), (p.node, 30090, p.client, 46000));
}

fn the_host_reaches_a_cluster_ip_masqueraded_and_a_pod_unmasqueraded(p: Plan) {
    let mut n = host_node(&p);
    // `dns` (UDP, endpoint pod B): the host is outside the cluster CIDR, so KUBE-MARK-MASQ;
    // the masquerade takes cni0's address, the way out to B.
    let q = udp(KERNEL, HOST_MAC, p.node, 47000, p.svc(0x53), 53);
    let (v, out) = send(&mut n, HOST0, &q);
    assert_eq!(v, Verdict::Output(PB));
    let (src, sport, dst, dport) = flow(one(&out).1);
    assert_eq!((src, dst, dport), (p.gw, p.b, 5353));
    let a = udp(POD_B, GW_MAC, p.b, 5353, p.gw, sport);
    let (v, out) = send(&mut n, PB, &a);
    assert_eq!(v, Verdict::Output(HOST0));
    let (port, f) = one(&out);
    assert_eq!((port, &f[0..6]), (HOST0, &KERNEL.0[..]));
    assert_eq!(flow(f), (p.svc(0x53), 53, p.node, 47000));
    // Straight to pod A: the node's address, kept; A's answer goes back to the host.
    let (v, out) = send(&mut n, HOST0, &from_host(p.node, 47001, p.a, 8080, SYN));
    assert_eq!(v, Verdict::Output(PA));
    assert_eq!(flow(one(&out).1), (p.node, 47001, p.a, 8080));
    let (v, out) = send(&mut n, PA, &from_a(&p, 8080, p.node, 47001, SYNACK));
    assert_eq!(v, Verdict::Output(HOST0));
    assert_eq!(flow(one(&out).1), (p.a, 8080, p.node, 47001));
}

fn what_no_rule_translates_for_the_node_address_goes_to_the_host(p: Plan) {
    let mut n = host_node(&p);
    // Not a NodePort: the host's own service (sshd), reached unchanged.
    let syn = tcp(OUTGW, UP_MAC, p.client, 48000, p.node, 22, SYN);
    let (v, out) = send(&mut n, ETH0, &syn);
    assert_eq!(v, Verdict::Output(HOST0));
    assert_eq!(flow(one(&out).1), (p.client, 48000, p.node, 22));
    // A NodePort still answers on the node's address (`web`, to its local endpoint or node B).
    let syn = tcp(OUTGW, UP_MAC, p.client, 48001, p.node, 30080, SYN);
    let (v, _) = send(&mut n, ETH0, &syn);
    assert!(matches!(v, Verdict::Output(PB | ETH0)), "{v:?}");
    // Pod traffic masqueraded to the node's address: its replies are the pod's, not the host's.
    let (v, out) = send(&mut n, PA, &from_a(&p, 48002, p.outside, 443, SYN));
    assert_eq!(v, Verdict::Output(ETH0));
    let (src, sport, ..) = flow(one(&out).1);
    assert_eq!(src, p.node);
    let back = tcp(OUTGW, UP_MAC, p.outside, 443, p.node, sport, SYNACK);
    let (v, _) = send(&mut n, ETH0, &back);
    assert_eq!(v, Verdict::Output(PA));
    // The gateway's address is still the router's own: a SYN there is refused by the router.
    let (v, _) = send(&mut n, PA, &from_a(&p, 48003, p.gw, 22, SYN));
    assert_eq!(v, Verdict::Drop(DropReason::LocalNoService));
}

fn the_host_reaches_its_own_local_policy_node_port_masqueraded_on_every_endpoint(p: Plan) {
    let mut n = host_node(&p);
    // `web-local` (NodePort 30081, policy Local; endpoints B here and the remote pod): from
    // the node itself, kube-proxy's KUBE-EXT-* masquerades ("LOCAL traffic") and sends it to
    // any endpoint, remote ones too; an external client would get B only, unmasqueraded.
    let (mut to_b, mut remote) = (0, 0);
    for sport in 49000..49064 {
        let (v, out) = send(&mut n, HOST0, &from_host(p.node, sport, p.node, 30081, SYN));
        let (src, _, dst, dport) = flow(one(&out).1);
        assert_eq!(dport, 8080);
        match v {
            Verdict::Output(PB) => {
                to_b += 1;
                assert_eq!((src, dst), (p.gw, p.b), "masqueraded to cni0's address");
            }
            Verdict::Output(ETH0) => {
                remote += 1;
                assert_eq!(
                    (src, dst),
                    (p.node, p.remote),
                    "masqueraded to eth0's address"
                );
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(to_b > 0 && remote > 0, "B {to_b}, remote {remote}");
}
