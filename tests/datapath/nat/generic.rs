//! kube-proxy's behaviour that both families share: ClusterIPs spread over endpoints with
//! replies from the ClusterIP, endpoint changes, hairpin, Services without endpoints,
//! UDP Services and ICMP errors about them, masquerade, NodePorts under both traffic
//! policies, invalid first packets, retransmitted SYNs, tuples never reused, SNAT ranges.

use super::*;

use etherparse::{NetSlice, PacketBuilder, SlicedPacket, TransportSlice};
use tapyard::nat::{NatRules, PortRange, Prefix, SnatRule};

per_family!(
    pod_to_cluster_ip_spreads_over_endpoints_and_replies_come_from_the_cluster_ip,
    endpoint_changes_keep_established_connections,
    hairpin_is_masqueraded_to_the_gateway,
    a_service_without_endpoints_is_refused_at_once_with_rst_or_port_unreachable,
    udp_service_and_an_icmp_error_from_its_endpoint_are_translated,
    pod_traffic_leaving_the_cluster_is_masqueraded,
    node_port_with_both_traffic_policies,
    a_first_packet_without_syn_is_invalid,
    retransmitted_syns_keep_their_endpoint,
    masquerade_never_reuses_a_tuple,
    snat_to_a_fixed_address_and_port_range_counts_exhaustion,
    connections_are_kept_across_a_reopen_of_the_table_file,
    a_changed_cluster_ip_flushes_the_old_frontends_udp_flows_only,
    a_single_family_services_node_port_does_not_answer_in_the_other_family,
    a_syn_to_a_node_address_without_a_listener_gets_a_reset,
    a_pod_at_its_connection_limit_is_refused_while_others_connect,
);

fn pod_to_cluster_ip_spreads_over_endpoints_and_replies_come_from_the_cluster_ip(p: Plan) {
    let mut n = node();
    let web = p.svc(0x10);
    let mut to = std::collections::HashMap::new();
    for sport in 40000..40040u16 {
        let (v, out) = send(&mut n, PA, &from_a(&p, sport, web, 80, SYN));
        let (port, f) = one(&out);
        let (src, sp, dst, dp) = flow(f);
        // The pod's own address is kept (pod-to-Service inside the cluster).
        assert_eq!((src, sp, dp), (p.a, sport, 8080));
        match (v, port) {
            (Verdict::Output(PB), PB) => assert_eq!(dst, p.b),
            (Verdict::Output(ETH0), ETH0) => {
                assert_eq!(dst, p.remote);
                assert_eq!(&f[0..6], &PEER.0, "routed to node B");
            }
            other => panic!("unexpected {other:?}"),
        }
        to.insert(sport, port);
    }
    let local = to.iter().filter(|(_, &port)| port == PB).count();
    assert!(
        local > 5 && local < 35,
        "both endpoints chosen: {local} of 40 local"
    );
    assert_eq!(n.dp.control().netfilter().unwrap().counters().dnat, 40);
    // A connection to the local endpoint: its reply is switched on cni0 straight to pod A
    // and translated back there (br_netfilter).
    let (&s_local, _) = to.iter().find(|(_, &port)| port == PB).unwrap();
    let (v, out) = send(
        &mut n,
        PB,
        &tcp(POD_B, POD_A, p.b, 8080, p.a, s_local, SYNACK),
    );
    assert_eq!(v, Verdict::Output(PA));
    assert_eq!(flow(one(&out).1), (web, 80, p.a, s_local));
    // And one through node B: the reply comes back over eth0 and is routed to pod A.
    let (&sport, _) = to.iter().find(|(_, &port)| port == ETH0).unwrap();
    let reply = tcp(PEER, UP_MAC, p.remote, 8080, p.a, sport, SYNACK);
    let (v, out) = send(&mut n, ETH0, &reply);
    assert_eq!(v, Verdict::Output(PA));
    let (_, f) = one(&out);
    assert_eq!(&f[0..6], &POD_A.0);
    assert_eq!(flow(f), (web, 80, p.a, sport));
    // The handshake completes: ESTABLISHED and ASSURED in the dump.
    send(&mut n, PA, &from_a(&p, sport, web, 80, ACK));
    let dump = ct_dump(&n, &p);
    let line = dump
        .lines()
        .find(|l| l.contains(&format!("sport={sport} dport=80")))
        .unwrap();
    assert!(
        line.contains("ESTABLISHED") && line.contains("[ASSURED]"),
        "{line}"
    );
    let reply_dir = format!("src={} dst={} sport=8080", p.remote, p.a);
    assert!(line.contains(&reply_dir), "{line}");
}

fn endpoint_changes_keep_established_connections(p: Plan) {
    let mut n = node();
    let web = p.svc(0x10);
    let (_, out) = send(&mut n, PA, &from_a(&p, 41000, web, 80, SYN));
    let first = flow(one(&out).1).2;
    // The Service now has only the other endpoint.
    let other = if first == p.b { p.remote } else { p.b };
    // The endpoint answers (switched on cni0, or back over eth0).
    let reply = if first == p.b {
        send(
            &mut n,
            PB,
            &tcp(POD_B, POD_A, p.b, 8080, p.a, 41000, SYNACK),
        )
    } else {
        let f = tcp(PEER, UP_MAC, p.remote, 8080, p.a, 41000, SYNACK);
        send(&mut n, ETH0, &f)
    };
    assert_eq!(reply.0, Verdict::Output(PA));
    let nf = n.dp.control().netfilter().unwrap();
    let mut spec = nf.services().get("web").unwrap().spec().clone();
    set_endpoints(&mut spec, &[(other, 8080, other == p.b)]);
    nf.upsert_service(spec, n.now).unwrap();
    // The established connection keeps its endpoint; a new one takes the new list.
    let (_, out) = send(&mut n, PA, &from_a(&p, 41000, web, 80, ACK));
    assert_eq!(flow(one(&out).1).2, first);
    let (_, out) = send(&mut n, PA, &from_a(&p, 41001, web, 80, SYN));
    assert_eq!(flow(one(&out).1).2, other);
}

fn hairpin_is_masqueraded_to_the_gateway(p: Plan) {
    let mut n = node();
    let me = p.svc(0x11);
    // Pod B reaches itself through its Service.
    let (v, out) = send(&mut n, PB, &tcp(POD_B, GW_MAC, p.b, 42000, me, 80, SYN));
    assert_eq!(v, Verdict::Output(PB));
    let (src, sport, dst, dport) = flow(one(&out).1);
    assert_eq!(
        (src, dst, dport),
        (p.gw, p.b, 8080),
        "hairpin: the source is cni0's address"
    );
    // The reply goes to the gateway, is routed, and arrives from the Service address.
    let (v, out) = send(
        &mut n,
        PB,
        &tcp(POD_B, GW_MAC, p.b, 8080, p.gw, sport, SYNACK),
    );
    assert_eq!(v, Verdict::Output(PB));
    assert_eq!(flow(one(&out).1), (me, 80, p.b, 42000));
    assert_eq!(n.dp.control().netfilter().unwrap().counters().hairpin, 1);
}

fn a_service_without_endpoints_is_refused_at_once_with_rst_or_port_unreachable(p: Plan) {
    let mut n = node();
    let empty = p.svc(0x99);
    let (v, out) = send(&mut n, PA, &from_a(&p, 43000, empty, 80, SYN));
    assert_eq!(v, Verdict::Drop(DropReason::NoEndpoint));
    let (port, f) = one(&out);
    assert_eq!(port, PA);
    assert_eq!(flow(f), (empty, 80, p.a, 43000));
    let s = SlicedPacket::from_ethernet(f).unwrap();
    let Some(TransportSlice::Tcp(t)) = s.transport else {
        panic!()
    };
    assert!(t.rst() && t.ack());
    // UDP gets ICMP port unreachable quoting the datagram.
    let (v, out) = send(&mut n, PA, &udp(POD_A, GW_MAC, p.a, 43001, empty, 53));
    assert_eq!(v, Verdict::Drop(DropReason::NoEndpoint));
    let (port, f) = one(&out);
    assert_eq!(port, PA);
    let s = SlicedPacket::from_ethernet(f).unwrap();
    let port_unreachable = match &s.transport {
        Some(TransportSlice::Icmpv4(i)) => matches!(
            i.icmp_type(),
            etherparse::Icmpv4Type::DestinationUnreachable(
                etherparse::icmpv4::DestUnreachableHeader::Port
            )
        ),
        Some(TransportSlice::Icmpv6(i)) => matches!(
            i.icmp_type(),
            etherparse::Icmpv6Type::DestinationUnreachable(
                etherparse::icmpv6::DestUnreachableCode::Port
            )
        ),
        _ => false,
    };
    assert!(port_unreachable, "{s:?}");
    assert_eq!(n.dp.control().netfilter().unwrap().counters().rejected, 2);
}

/// The endpoint's ICMP error (port unreachable) quoting `quoted` (an IP packet), from B to A.
fn port_unreachable_from_b(p: &Plan, quoted: &[u8]) -> Vec<u8> {
    let mut f = Vec::new();
    let eth = PacketBuilder::ethernet2(POD_B.0, POD_A.0);
    match (p.b, p.a) {
        (IpAddr::V4(b), IpAddr::V4(a)) => eth
            .ipv4(b.octets(), a.octets(), 64)
            .icmpv4(etherparse::Icmpv4Type::DestinationUnreachable(
                etherparse::icmpv4::DestUnreachableHeader::Port,
            ))
            .write(&mut f, quoted),
        (IpAddr::V6(b), IpAddr::V6(a)) => eth
            .ipv6(b.octets(), a.octets(), 64)
            .icmpv6(etherparse::Icmpv6Type::DestinationUnreachable(
                etherparse::icmpv6::DestUnreachableCode::Port,
            ))
            .write(&mut f, quoted),
        _ => unreachable!(),
    }
    .unwrap();
    f
}

fn udp_service_and_an_icmp_error_from_its_endpoint_are_translated(p: Plan) {
    let mut n = node();
    let dns = p.svc(0x53);
    let (v, out) = send(&mut n, PA, &udp(POD_A, GW_MAC, p.a, 44000, dns, 53));
    assert_eq!(v, Verdict::Output(PB));
    assert_eq!(flow(one(&out).1), (p.a, 44000, p.b, 5353));
    // The answer, switched on cni0 back to pod A, comes from the Service address.
    let (_, out) = send(&mut n, PB, &udp(POD_B, POD_A, p.b, 5353, p.a, 44000));
    assert_eq!(flow(one(&out).1), (dns, 53, p.a, 44000));
    // Pod B's port closes: its ICMP port unreachable quotes the translated datagram; pod A
    // must see it about the Service address, every checksum right.
    let quoted = udp(POD_A, POD_B, p.a, 44000, p.b, 5353);
    let (v, out) = send(&mut n, PB, &port_unreachable_from_b(&p, &quoted[14..]));
    assert_eq!(v, Verdict::Output(PA));
    let (_, f) = one(&out);
    let s = SlicedPacket::from_ethernet(f).unwrap();
    let inner = match (&s.net, &s.transport) {
        (Some(NetSlice::Ipv4(ip)), Some(TransportSlice::Icmpv4(i))) => {
            let h = ip.header().to_header();
            assert_eq!(
                (IpAddr::from(h.source), IpAddr::from(h.destination)),
                (dns, p.a)
            );
            assert_eq!(h.header_checksum, h.calc_header_checksum());
            assert_eq!(i.checksum(), i.icmp_type().calc_checksum(i.payload()));
            i.payload()
        }
        (Some(NetSlice::Ipv6(ip)), Some(TransportSlice::Icmpv6(i))) => {
            let h = ip.header().to_header();
            assert_eq!(
                (IpAddr::from(h.source), IpAddr::from(h.destination)),
                (dns, p.a)
            );
            let want = i
                .icmp_type()
                .calc_checksum(h.source, h.destination, i.payload());
            assert_eq!(i.checksum(), want.unwrap());
            i.payload()
        }
        other => panic!("not an ICMP error of {p:?}: {other:?}"),
    };
    // The quoted datagram is pod A's own, to the Service.
    let q = SlicedPacket::from_ip(inner).unwrap();
    let (src, dst) = match &q.net {
        Some(NetSlice::Ipv4(ip)) => {
            let h = ip.header().to_header();
            assert_eq!(h.header_checksum, h.calc_header_checksum());
            (IpAddr::from(h.source), IpAddr::from(h.destination))
        }
        Some(NetSlice::Ipv6(ip)) => (
            IpAddr::from(ip.header().source_addr()),
            IpAddr::from(ip.header().destination_addr()),
        ),
        _ => panic!(),
    };
    assert_eq!((src, dst), (p.a, dns));
    let Some(TransportSlice::Udp(u)) = &q.transport else {
        panic!()
    };
    assert_eq!((u.source_port(), u.destination_port()), (44000, 53));
}

fn pod_traffic_leaving_the_cluster_is_masqueraded(p: Plan) {
    let mut n = node();
    let (v, out) = send(&mut n, PA, &from_a(&p, 45000, p.outside, 80, SYN));
    assert_eq!(v, Verdict::Output(ETH0));
    let (_, f) = one(&out);
    assert_eq!(&f[0..6], &OUTGW.0);
    assert_eq!(flow(f), (p.node, 45000, p.outside, 80), "source port kept");
    let back = tcp(OUTGW, UP_MAC, p.outside, 80, p.node, 45000, SYNACK);
    let (v, out) = send(&mut n, ETH0, &back);
    assert_eq!(v, Verdict::Output(PA));
    assert_eq!(flow(one(&out).1), (p.outside, 80, p.a, 45000));
    // Pod to pod on another node (inside the cluster CIDR) keeps its address.
    let (_, out) = send(&mut n, PA, &from_a(&p, 45001, p.remote, 80, SYN));
    let (port, f) = one(&out);
    assert_eq!(port, ETH0);
    assert_eq!(flow(f), (p.a, 45001, p.remote, 80));
}

fn node_port_with_both_traffic_policies(p: Plan) {
    let mut n = node();
    let client = |sport, dport| tcp(OUTGW, UP_MAC, p.client, sport, p.node, dport, SYN);
    // Cluster: the client is masqueraded to the egress interface's address.
    let mut ports = std::collections::HashSet::new();
    for sport in 50000..50030u16 {
        let (_, out) = send(&mut n, ETH0, &client(sport, 30080));
        let (port, f) = one(&out);
        let (src, _, dst, dport) = flow(f);
        assert_eq!(dport, 8080);
        match port {
            PB => assert_eq!((src, dst), (p.gw, p.b), "Cluster policy: masqueraded"),
            ETH0 => assert_eq!((src, dst), (p.node, p.remote)),
            other => panic!("{other:?}"),
        }
        ports.insert(port);
    }
    assert_eq!(ports.len(), 2);
    // Local: only the local endpoint, and the client's address is kept.
    for sport in 51000..51010u16 {
        let (_, out) = send(&mut n, ETH0, &client(sport, 30081));
        let (port, f) = one(&out);
        assert_eq!(port, PB);
        assert_eq!(flow(f), (p.client, sport, p.b, 8080));
    }
    // The local endpoint's reply goes to the client via its default route (the gateway)
    // and leaves from the node port.
    let reply = tcp(POD_B, GW_MAC, p.b, 8080, p.client, 51000, SYNACK);
    let (v, out) = send(&mut n, PB, &reply);
    assert_eq!(v, Verdict::Output(ETH0));
    assert_eq!(flow(one(&out).1), (p.node, 30081, p.client, 51000));
}

fn a_first_packet_without_syn_is_invalid(p: Plan) {
    let mut n = node();
    let (v, out) = send(&mut n, PA, &from_a(&p, 46000, p.remote, 80, ACK));
    assert_eq!(v, Verdict::Drop(DropReason::CtInvalid));
    assert!(out.is_empty());
    assert_eq!(drops(&n, DropReason::CtInvalid), 1);
}

fn retransmitted_syns_keep_their_endpoint(p: Plan) {
    let mut n = node();
    let web = p.svc(0x10);
    let (_, out) = send(&mut n, PA, &from_a(&p, 46000, web, 80, SYN));
    let first = flow(one(&out).1);
    for _ in 0..5 {
        let (_, out) = send(&mut n, PA, &from_a(&p, 46000, web, 80, SYN));
        assert_eq!(flow(one(&out).1), first);
    }
}

fn masquerade_never_reuses_a_tuple(p: Plan) {
    let mut n = node();
    // Two pods, one source port, one outside server: the second gets another port.
    let (_, out) = send(&mut n, PA, &from_a(&p, 47000, p.outside, 80, SYN));
    assert_eq!(
        flow(one(&out).1),
        (p.node, 47000, p.outside, 80),
        "port kept when free"
    );
    let from_b = tcp(POD_B, GW_MAC, p.b, 47000, p.outside, 80, SYN);
    let (_, out) = send(&mut n, PB, &from_b);
    let (src, sport, dst, dport) = flow(one(&out).1);
    assert_eq!((src, dst, dport), (p.node, p.outside, 80));
    assert_ne!(sport, 47000, "the taken tuple is not handed out again");
    assert!(sport >= 1024);
    // Replies reach the right pod.
    for (port, pod) in [(sport, PB), (47000, PA)] {
        let back = tcp(OUTGW, UP_MAC, p.outside, 80, p.node, port, SYNACK);
        assert_eq!(send(&mut n, ETH0, &back).0, Verdict::Output(pod));
    }
}

/// The node's rules with `SNAT --to-source to[:ports]` for pod network 1 out of eth0 in
/// `p`'s family, in place of its masquerade rule.
fn snat_rules(n: &Node, p: &Plan, to: IpAddr, ports: Option<PortRange>) -> NatRules {
    let eth0 = n.ext.eth0;
    match (p.cluster.0, p.gw, to) {
        (IpAddr::V4(c), IpAddr::V4(gw), IpAddr::V4(to)) => NatRules {
            cluster_cidr: Some(Prefix::new(c, p.cluster.1)),
            snat: vec![SnatRule {
                out: Some(eth0),
                src: Prefix::new(gw, p.pod_len),
                to,
                ports,
            }],
            ..NatRules::default()
        },
        (IpAddr::V6(c), IpAddr::V6(gw), IpAddr::V6(to)) => NatRules {
            cluster_cidr6: Some(Prefix::new(c, p.cluster.1)),
            snat6: vec![SnatRule {
                out: Some(eth0),
                src: Prefix::new(gw, p.pod_len),
                to,
                ports,
            }],
            ..NatRules::default()
        },
        _ => unreachable!(),
    }
}

fn snat_to_a_fixed_address_and_port_range_counts_exhaustion(p: Plan) {
    let mut n = node();
    // An established masqueraded connection, made under the old rules.
    let (_, out) = send(
        &mut n,
        PB,
        &tcp(POD_B, GW_MAC, p.b, 47000, p.outside, 80, SYN),
    );
    let old = flow(one(&out).1);
    let back = tcp(OUTGW, UP_MAC, p.outside, 80, old.0, old.1, SYNACK);
    assert_eq!(send(&mut n, ETH0, &back).0, Verdict::Output(PB));
    // iptables -t nat -A POSTROUTING -s <pod network> -o eth0 -j SNAT
    //   --to-source <node .50>:5000-5001
    let to = match p.node {
        IpAddr::V4(a) => IpAddr::V4(std::net::Ipv4Addr::from(u32::from(a) & !0xff | 50)),
        IpAddr::V6(a) => IpAddr::V6(std::net::Ipv6Addr::from(u128::from(a) & !0xffff | 0x50)),
    };
    let nf = n.dp.control().netfilter().unwrap();
    nf.set_rules(snat_rules(
        &n,
        &p,
        to,
        Some(PortRange { lo: 5000, hi: 5001 }),
    ));
    let mut ports = Vec::new();
    for sport in [48000u16, 48001] {
        let (_, out) = send(&mut n, PA, &from_a(&p, sport, p.outside, 443, SYN));
        let (port, f) = one(&out);
        assert_eq!(port, ETH0);
        let (src, sp, dst, dp) = flow(f);
        assert_eq!((src, dst, dp), (to, p.outside, 443));
        ports.push((sp, sport));
    }
    ports.sort();
    assert_eq!(
        ports.iter().map(|x| x.0).collect::<Vec<_>>(),
        vec![5000, 5001]
    );
    // The reply to the SNAT address reaches the pod, un-NAT'd.
    let (sp, sport) = ports[0];
    let back = tcp(OUTGW, UP_MAC, p.outside, 443, to, sp, SYNACK);
    let (_, out) = send(&mut n, ETH0, &back);
    let (port, f) = one(&out);
    assert_eq!(port, PA);
    assert_eq!(flow(f), (p.outside, 443, p.a, sport));
    // The range is used up: the next new connection is dropped and counted.
    let (v, out) = send(&mut n, PA, &from_a(&p, 48002, p.outside, 443, SYN));
    assert_eq!(v, Verdict::Drop(DropReason::NatExhausted));
    assert!(out.is_empty());
    assert_eq!(drops(&n, DropReason::NatExhausted), 1);
    // Established connections made under the old rules keep their translation.
    let (_, out) = send(
        &mut n,
        PB,
        &tcp(POD_B, GW_MAC, p.b, 47000, p.outside, 80, ACK),
    );
    assert_eq!(flow(one(&out).1), old);
    // Sources outside the rule's prefix are not translated by it.
    let (_, out) = send(
        &mut n,
        ETH0,
        &tcp(OUTGW, UP_MAC, p.client, 48100, p.remote, 80, SYN),
    );
    let (port, f) = one(&out);
    assert_eq!(port, ETH0);
    assert_eq!(flow(f), (p.client, 48100, p.remote, 80));

    // SNAT without a port range, as `-j SNAT --to-source <node .50>`: the original port
    // when free, else one of its class (a privileged port stays privileged).
    let nf = n.dp.control().netfilter().unwrap();
    nf.set_rules(snat_rules(&n, &p, to, None));
    let (_, out) = send(&mut n, PA, &from_a(&p, 700, p.outside, 443, SYN));
    assert_eq!(flow(one(&out).1), (to, 700, p.outside, 443));
    // The same source port from the other pod: taken, so another of 600-1023.
    let (_, out) = send(
        &mut n,
        PB,
        &tcp(POD_B, GW_MAC, p.b, 700, p.outside, 443, SYN),
    );
    let (src, port, _, _) = flow(one(&out).1);
    assert_eq!(src, to);
    assert!((600..=1023).contains(&port) && port != 700, "port {port}");
    let (_, out) = send(
        &mut n,
        PB,
        &tcp(POD_B, GW_MAC, p.b, 40000, p.outside, 443, SYN),
    );
    assert_eq!(flow(one(&out).1).1, 40000);
}

/// Removes the tables' files when the test ends, however it ends.
struct TempFiles(std::path::PathBuf);

impl Drop for TempFiles {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
        let _ = std::fs::remove_file(tapyard::conntrack6_path(&self.0));
    }
}

fn connections_are_kept_across_a_reopen_of_the_table_file(p: Plan) {
    let dir = std::env::temp_dir();
    let name = format!("tapyard-nat-{}-{}.ct", p.name("reopen"), std::process::id());
    let f = TempFiles(dir.join(name));
    let web = p.svc(0x10);
    let sport = 47000;
    let (port, ep) = {
        let mut n = node_with(KubeOptions {
            conntrack_file: Some(&f.0),
            ..KubeOptions::default()
        });
        let (_, out) = send(&mut n, PA, &from_a(&p, sport, web, 80, SYN));
        let (port, fr) = one(&out);
        (port, flow(fr).2)
    };
    if p.is_v6() {
        assert!(
            tapyard::conntrack6_path(&f.0).exists(),
            "IPv6 table file beside"
        );
    }
    // A new process on the same files: the endpoint's reply is still un-NAT'd.
    let mut n = node_with(KubeOptions {
        conntrack_file: Some(&f.0),
        ..KubeOptions::default()
    });
    let nf = n.dp.control().netfilter().unwrap();
    nf.services().relink(nf.conntrack(), n.now);
    nf.services()
        .relink(nf.conntrack_of::<std::net::Ipv6Addr>(), n.now);
    assert_eq!(ct_len(&n, &p), 1);
    let reply = if port == PB {
        assert_eq!(ep, p.b);
        tcp(POD_B, GW_MAC, p.b, 8080, p.a, sport, SYNACK)
    } else {
        assert_eq!(ep, p.remote);
        tcp(PEER, UP_MAC, p.remote, 8080, p.a, sport, SYNACK)
    };
    let (_, back) = send(&mut n, port, &reply);
    let (to, fr) = one(&back);
    assert_eq!(to, PA);
    assert_eq!(flow(fr), (web, 80, p.a, sport));
}

fn a_changed_cluster_ip_flushes_the_old_frontends_udp_flows_only(p: Plan) {
    let mut n = node();
    send(&mut n, PA, &udp(POD_A, GW_MAC, p.a, 35000, p.svc(0x53), 53));
    assert_eq!(ct_len(&n, &p), 1);
    let nf = n.dp.control().netfilter().unwrap();
    let mut dns = nf.services().get("dns").unwrap().spec().clone();
    // The other family's ClusterIP changes: this family's flow stays.
    let (IpAddr::V4(new4), IpAddr::V6(new6)) = (Plan::V4.svc(0x54), Plan::V6.svc(0x54)) else {
        unreachable!()
    };
    if p.is_v6() {
        dns.vip = Some(new4);
    } else {
        dns.vip6 = Some(new6);
    }
    nf.upsert_service(dns.clone(), n.now).unwrap();
    assert_eq!(ct_len(&n, &p), 1);
    // This family's ClusterIP changes: the flow to the old one is deleted.
    if p.is_v6() {
        dns.vip6 = Some(new6);
    } else {
        dns.vip = Some(new4);
    }
    nf.upsert_service(dns, n.now).unwrap();
    assert_eq!(ct_len(&n, &p), 0);
}

fn a_single_family_services_node_port_does_not_answer_in_the_other_family(p: Plan) {
    let mut n = node();
    // A Service of the other family only, on NodePort 30090 (as kube-proxy programs an
    // IPv4-only or IPv6-only Service in one family's tables).
    let o = if p.is_v6() { Plan::V4 } else { Plan::V6 };
    let mut s = ServiceSpec::new("single", o.svc(0x20), 80, IpProto::TCP);
    set_endpoints(&mut s, &[(o.b, 8080, true)]);
    s.node_port = Some(30090);
    let nf = n.dp.control().netfilter().unwrap();
    nf.upsert_service(s, n.now).unwrap();
    let (_, out) = send(
        &mut n,
        ETH0,
        &tcp(OUTGW, UP_MAC, o.client, 52000, o.node, 30090, SYN),
    );
    assert_eq!(one(&out).0, PB, "answered in its own family");
    let (_, out) = send(
        &mut n,
        ETH0,
        &tcp(OUTGW, UP_MAC, p.client, 52000, p.node, 30090, SYN),
    );
    assert!(
        out.iter().all(|(port, _)| *port == ETH0),
        "not forwarded to a pod: {out:?}"
    );
}

/// Linux answers a TCP segment to one of its addresses on a port nothing listens on with a
/// reset (`tcp_v4_send_reset`), and so does tapyard for its own addresses (the uplink's,
/// the gateway's) on ports that are no NodePort: a client learns at once instead of
/// retrying until its timeout. Resets and segments with a wrong checksum get nothing.
fn a_syn_to_a_node_address_without_a_listener_gets_a_reset(p: Plan) {
    let mut n = node();
    // From outside, to the node's address.
    let syn = tcp(OUTGW, UP_MAC, p.client, 52000, p.node, 22, SYN);
    let (v, out) = send(&mut n, ETH0, &syn);
    assert_eq!(v, Verdict::Drop(DropReason::LocalNoService));
    let (port, f) = one(&out);
    assert_eq!(port, ETH0);
    assert_eq!(&f[..6], &OUTGW.0, "back to the sender's MAC");
    assert_eq!(flow(f), (p.node, 22, p.client, 52000));
    let s = SlicedPacket::from_ethernet(f).unwrap();
    let Some(TransportSlice::Tcp(t)) = s.transport else {
        panic!()
    };
    assert!(t.rst() && t.ack() && !t.syn());
    // RFC 793's reset for a segment without ACK: sequence 0, acknowledging all it carried.
    let sent = SlicedPacket::from_ethernet(&syn).unwrap();
    let Some(TransportSlice::Tcp(st)) = sent.transport else {
        panic!()
    };
    let carried = u32::try_from(st.payload().len()).unwrap() + 1;
    assert_eq!(
        (t.sequence_number(), t.acknowledgment_number()),
        (0, st.sequence_number() + carried)
    );
    // From a pod, to its gateway.
    let (_, out) = send(&mut n, PA, &from_a(&p, 52001, p.gw, 8080, SYN));
    let (port, f) = one(&out);
    assert_eq!(port, PA);
    assert_eq!(flow(f), (p.gw, 8080, p.a, 52001));
    // A reset, or a segment whose checksum is wrong: nothing back.
    let rst = tcp(
        OUTGW,
        UP_MAC,
        p.client,
        52002,
        p.node,
        22,
        tapyard_testkit::frame::RST,
    );
    assert!(send(&mut n, ETH0, &rst).1.is_empty());
    let mut bad = syn.clone();
    let last = bad.len() - 1;
    bad[last] ^= 0xff;
    let (v, out) = send(&mut n, ETH0, &bad);
    assert!(out.is_empty(), "{v:?} {out:?}");
}

/// `[conntrack] max_per_source`: pod A at its limit (3 connections, masqueraded and DNAT'd
/// alike) has its next new connection dropped as `ct_limit`, while its own connections go on
/// (a retransmitted SYN finds its entry) and pod B connects; once A's entries expire and are
/// swept, A connects again.
fn a_pod_at_its_connection_limit_is_refused_while_others_connect(p: Plan) {
    let ct = tapyard::conntrack::CtConfig {
        max_per_source: 3,
        ..Default::default()
    };
    let mut n = node_with(KubeOptions {
        conntrack: Some(ct),
        ..KubeOptions::default()
    });
    let web = p.svc(0x10);
    for (sport, dst, dport) in [
        (40000, p.outside, 443),
        (40001, p.outside, 443),
        (40002, web, 80),
    ] {
        let (v, _) = send(&mut n, PA, &from_a(&p, sport, dst, dport, SYN));
        assert!(matches!(v, Verdict::Output(_)), "{sport}: {v:?}");
    }
    let (v, out) = send(&mut n, PA, &from_a(&p, 40003, p.outside, 443, SYN));
    assert_eq!(v, Verdict::Drop(DropReason::CtLimit));
    assert!(out.is_empty());
    assert_eq!(drops(&n, DropReason::CtLimit), 1);
    assert_eq!(ct_len(&n, &p), 3);
    // A's connections go on.
    let (v, _) = send(&mut n, PA, &from_a(&p, 40000, p.outside, 443, SYN));
    assert_eq!(v, Verdict::Output(ETH0));
    // Pod B is not affected.
    let b = tcp(POD_B, GW_MAC, p.b, 41000, p.outside, 443, SYN);
    assert_eq!(send(&mut n, PB, &b).0, Verdict::Output(ETH0));
    // A's SYN_SENT entries expire (120 s) and are swept: A connects again.
    tapyard_testkit::tick(&mut n, std::time::Duration::from_secs(125));
    let (v, _) = send(&mut n, PA, &from_a(&p, 40003, p.outside, 443, SYN));
    assert_eq!(v, Verdict::Output(ETH0));
    assert_eq!(drops(&n, DropReason::CtLimit), 1);
}
