//! Martian sources, over both families, on the test kit's Kubernetes node
//! ([`tapyard_testkit::kube`]: NAT and masquerade configured): a pod's packet whose source is
//! a loopback, unspecified, multicast, broadcast, reserved or IPv4-mapped address, a directed
//! broadcast of one of the node's subnets, or one of the router's own addresses (the gateway's,
//! the node's uplink address) is dropped and counted as `martian_source`, as Linux's
//! `ip_route_input_slow` / `ip6_rcv_core` drop them: nothing leaves, and no connection is
//! made (checked before the NAT hook). Ordinary sources pass.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use tapyard::wire::ipv6::link_local_from_mac;
use tapyard::{Batch, DropReason, PacketBuf, Verdict};
use tapyard_testkit::frame::{self, udp, SYN};
use tapyard_testkit::kube::{kube_node, KubeOptions, Plan, ETH0, GW_MAC, PA, POD_A};
use tapyard_testkit::send;

/// Every martian source of `p`'s family on the test kit's node.
fn martians(p: &Plan) -> Vec<IpAddr> {
    let v4 = |a: [u8; 4]| IpAddr::V4(Ipv4Addr::from(a));
    let v6 = |s: &str| IpAddr::V6(s.parse::<Ipv6Addr>().unwrap());
    let mut m = if p.is_v6() {
        vec![
            v6("::"),
            v6("::1"),
            v6("::ffff:10.244.1.2"),
            v6("::ffff:127.0.0.1"),
            // The gateway's link-local address (fe80:: + EUI-64 of its MAC).
            IpAddr::V6(link_local_from_mac(GW_MAC)),
        ]
    } else {
        vec![
            v4([127, 0, 0, 1]),
            v4([127, 255, 255, 254]),
            v4([0, 0, 0, 0]),
            v4([0, 1, 2, 3]),
            v4([255, 255, 255, 255]),
            v4([224, 0, 0, 5]),
            v4([239, 255, 255, 250]),
            v4([240, 0, 0, 1]),
            v4([250, 1, 2, 3]),
            // The directed broadcasts of cni0 (the ingress interface's) and eth0.
            v4([10, 244, 1, 255]),
            v4([172, 18, 0, 255]),
        ]
    };
    // The router's own addresses: the pods' gateway and the node's uplink address.
    m.extend([p.gw, p.node]);
    m
}

/// IPv6 multicast sources: refused by the header check already (`bad_ipv6_header`), as
/// Linux's `ip6_rcv_core` counts them among header errors.
const MULTICAST6: [&str; 3] = ["ff02::1", "ff05::1:3", "ff0e::5"];

fn drops(n: &tapyard_testkit::Node<tapyard_testkit::kube::Ifaces>) -> u64 {
    n.dp.control().stats().drop_count(DropReason::MartianSource)
}

fn connections(n: &tapyard_testkit::Node<tapyard_testkit::kube::Ifaces>, p: &Plan) -> usize {
    let nf = n.dp.control().netfilter().unwrap();
    if p.is_v6() {
        nf.conntrack_of::<Ipv6Addr>().len()
    } else {
        nf.conntrack_of::<Ipv4Addr>().len()
    }
}

/// Every martian source, to a destination routed out of the uplink (masqueraded), to a pod
/// on node B, to a Service and to the node itself, UDP and TCP: dropped, counted, nothing
/// sent, no connection made. Then the pod's own address still passes.
fn every_martian_source_is_dropped_and_counted(p: Plan) {
    let mut n = kube_node(KubeOptions::default());
    let dsts = [p.outside, p.remote, p.svc(0x10), p.node];
    let mut sent = 0;
    for src in martians(&p) {
        for dst in dsts {
            for f in [
                udp(POD_A, GW_MAC, src, 5353, dst, 53),
                frame::tcp(POD_A, GW_MAC, src, 40000, dst, 80, SYN),
            ] {
                let (v, out) = send(&mut n, PA, &f);
                assert_eq!(
                    v,
                    Verdict::Drop(DropReason::MartianSource),
                    "{src} -> {dst}"
                );
                assert!(out.is_empty(), "{src} -> {dst}: {out:?}");
                sent += 1;
            }
        }
    }
    assert_eq!(drops(&n), sent);
    if p.is_v6() {
        for m in MULTICAST6 {
            let f = udp(
                POD_A,
                GW_MAC,
                m.parse::<Ipv6Addr>().unwrap(),
                5353,
                p.outside,
                53,
            );
            let (v, out) = send(&mut n, PA, &f);
            assert_eq!(v, Verdict::Drop(DropReason::BadIpv6Header), "{m}");
            assert!(out.is_empty());
        }
    }
    assert_eq!(connections(&n, &p), 0, "a martian made a connection");
    // An ordinary source passes, masqueraded out of the uplink, and is not counted.
    let (v, _) = send(&mut n, PA, &udp(POD_A, GW_MAC, p.a, 5353, p.outside, 53));
    assert_eq!(v, Verdict::Output(ETH0));
    assert_eq!(drops(&n), sent);
}

/// In one batch, martian and ordinary sources to one destination are judged packet by packet
/// (the batch's memo of the last good source lets no martian through).
fn a_batch_mixing_martian_and_ordinary_sources_is_judged_per_packet(p: Plan) {
    let mut n = kube_node(KubeOptions::default());
    let good = udp(POD_A, GW_MAC, p.a, 5353, p.outside, 53);
    let mut frames = vec![good.clone()];
    for src in martians(&p) {
        frames.push(udp(POD_A, GW_MAC, src, 5353, p.outside, 53));
        frames.push(good.clone());
    }
    let mut batch = Batch::new();
    for f in &frames {
        let mut b = PacketBuf::from_frame(f);
        b.port = PA;
        batch.push(b).unwrap();
    }
    n.dp.process(&mut n.w, n.now, &mut batch);
    for (i, v) in batch.verdicts()[..frames.len()].iter().enumerate() {
        let want = if i % 2 == 0 {
            Verdict::Output(ETH0)
        } else {
            Verdict::Drop(DropReason::MartianSource)
        };
        assert_eq!(*v, want, "frame {i}");
    }
    batch.recycle(&mut n.w.pool);
    assert_eq!(drops(&n), martians(&p).len() as u64);
}

/// Sources that are not martian: other pods' and outside addresses, and (IPv4) a DHCP client's
/// `0.0.0.0` to the limited broadcast, which Linux takes as broadcast input (never forwarded:
/// counted as `l3_multicast`, not as a martian).
fn ordinary_sources_pass(p: Plan) {
    let mut n = kube_node(KubeOptions::default());
    for src in [p.a, p.b, p.remote, p.client, p.outside] {
        let (v, _) = send(&mut n, PA, &udp(POD_A, GW_MAC, src, 5353, p.peer, 53));
        assert_eq!(v, Verdict::Output(ETH0), "{src}");
    }
    if !p.is_v6() {
        let dhcp = udp(
            POD_A,
            GW_MAC,
            Ipv4Addr::UNSPECIFIED,
            68,
            Ipv4Addr::BROADCAST,
            67,
        );
        let (v, out) = send(&mut n, PA, &dhcp);
        assert_eq!(v, Verdict::Drop(DropReason::L3Multicast));
        assert!(out.is_empty());
        // ... and the same source to anywhere else still is a martian afterwards.
        let (v, _) = send(
            &mut n,
            PA,
            &udp(POD_A, GW_MAC, Ipv4Addr::UNSPECIFIED, 68, p.outside, 67),
        );
        assert_eq!(v, Verdict::Drop(DropReason::MartianSource));
    }
    assert_eq!(drops(&n), u64::from(!p.is_v6()));
}

mod v4 {
    #[test]
    fn every_martian_source_is_dropped_and_counted() {
        super::every_martian_source_is_dropped_and_counted(super::Plan::V4)
    }
    #[test]
    fn a_batch_mixing_martian_and_ordinary_sources_is_judged_per_packet() {
        super::a_batch_mixing_martian_and_ordinary_sources_is_judged_per_packet(super::Plan::V4)
    }
    #[test]
    fn ordinary_sources_pass() {
        super::ordinary_sources_pass(super::Plan::V4)
    }
}

mod v6 {
    #[test]
    fn every_martian_source_is_dropped_and_counted() {
        super::every_martian_source_is_dropped_and_counted(super::Plan::V6)
    }
    #[test]
    fn a_batch_mixing_martian_and_ordinary_sources_is_judged_per_packet() {
        super::a_batch_mixing_martian_and_ordinary_sources_is_judged_per_packet(super::Plan::V6)
    }
    #[test]
    fn ordinary_sources_pass() {
        super::ordinary_sources_pass(super::Plan::V6)
    }
}
