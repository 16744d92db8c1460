//! Fragments in front of conntrack, as Linux's `nf_defrag_ipv4`/`nf_defrag_ipv6` and OVS's
//! `ipf`: a datagram that comes in fragments is put together, tracked and translated as a
//! whole, and leaves as the fragments it came in, each with the translated addresses
//! (checked by putting them together again with the test kit's own model,
//! [`frame::reassemble`], and reading the whole datagram's checksums and content).

use super::*;

use std::time::Duration;

per_family!(
    a_fragmented_datagram_leaving_the_cluster_is_masqueraded_whole_and_so_is_its_answer,
    a_fragmented_datagram_to_a_cluster_ip_reaches_its_endpoint_and_the_switched_answer_is_translated,
    fragments_of_an_unfinished_datagram_are_freed_at_their_timeout_and_counted,
    overlapping_and_tiny_fragments_are_refused_and_counted,
    fragments_bigger_than_the_egress_mtu_are_cut_again_over_ipv4_and_refused_over_ipv6,
    a_fragmented_ping_to_the_gateway_is_answered_in_fragments_with_nat_or_without,
);

/// A `len`-byte UDP payload whose bytes say where they are.
fn payload(len: usize) -> Vec<u8> {
    (0..len).map(|i| u8::try_from(i % 251).unwrap()).collect()
}

/// Sends `frags` on `port` one by one: every fragment but the last is held (nothing sent);
/// what the last one makes is returned.
fn send_fragments(n: &mut Node, port: tapyard::PortId, frags: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let (last, held) = frags.split_last().unwrap();
    for f in held {
        let (v, out) = send(n, port, f);
        assert_eq!(v, Verdict::Queued, "a fragment is held");
        assert!(out.is_empty(), "{out:?}");
    }
    let (v, out) = send(n, port, last);
    assert_eq!(
        v,
        Verdict::Local,
        "the last fragment completes the datagram"
    );
    out.into_iter().map(|(_, f)| f).collect()
}

/// The UDP payload of the whole frame `f`.
fn udp_payload(f: &[u8]) -> &[u8] {
    let hl = if f[14] >> 4 == 6 {
        40
    } else {
        usize::from(f[14] & 15) * 4
    };
    &f[14 + hl + 8..]
}

fn a_fragmented_datagram_leaving_the_cluster_is_masqueraded_whole_and_so_is_its_answer(p: Plan) {
    let mut n = node();
    for (len, id) in [(3000, 7), (9000, 8)] {
        let data = payload(len);
        let sport = 46000 + u16::try_from(id).unwrap();
        let whole = frame::udp_with(POD_A, GW_MAC, (p.a, sport), (p.outside, 53), 64, &data);
        let frags = frame::fragments(&whole, 1500, id);
        let out = send_fragments(&mut n, PA, &frags);
        assert_eq!(out.len(), frags.len(), "sent as the fragments it came in");
        for (o, i) in out.iter().zip(&frags) {
            assert_eq!(o.len(), i.len(), "each fragment keeps its size");
            assert_eq!(&o[0..6], &OUTGW.0);
        }
        let back = frame::reassemble(&out).expect("fragments of one datagram");
        assert_eq!(
            flow(&back),
            (p.node, sport, p.outside, 53),
            "masqueraded whole"
        );
        assert_eq!(udp_payload(&back), &data[..]);
        // The answer, as big, comes back in fragments to the node's address and reaches
        // the pod translated, whole.
        let answer = frame::udp_with(OUTGW, UP_MAC, (p.outside, 53), (p.node, sport), 64, &data);
        let out = send_fragments(&mut n, ETH0, &frame::fragments(&answer, 1400, id + 100));
        let back = frame::reassemble(&out).expect("fragments of one datagram");
        assert_eq!(&back[0..6], &POD_A.0);
        assert_eq!(flow(&back), (p.outside, 53, p.a, sport));
        assert_eq!(udp_payload(&back), &data[..]);
    }
    let s = n.dp.control().stats();
    assert_eq!(s.reassembled, 4);
}

fn a_fragmented_datagram_to_a_cluster_ip_reaches_its_endpoint_and_the_switched_answer_is_translated(
    p: Plan,
) {
    let mut n = node();
    let dns = p.svc(0x53);
    let data = payload(3000);
    let query = frame::udp_with(POD_A, GW_MAC, (p.a, 44100), (dns, 53), 64, &data);
    let out = send_fragments(&mut n, PA, &frame::fragments(&query, 1500, 9));
    let back = frame::reassemble(&out).expect("fragments of one datagram");
    assert_eq!(&back[0..6], &POD_B.0, "to the endpoint, pod B");
    assert_eq!(flow(&back), (p.a, 44100, p.b, 5353));
    assert_eq!(udp_payload(&back), &data[..]);
    // Pod B's answer is switched on cni0 straight to pod A (br_netfilter): put together,
    // translated back to the Service address, and sent on as its fragments.
    let answer = frame::udp_with(POD_B, POD_A, (p.b, 5353), (p.a, 44100), 64, &data);
    let frags = frame::fragments(&answer, 1500, 10);
    let out = send_fragments(&mut n, PB, &frags);
    assert_eq!(out.len(), frags.len());
    let back = frame::reassemble(&out).expect("fragments of one datagram");
    assert_eq!(&back[0..6], &POD_A.0);
    assert_eq!(flow(&back), (dns, 53, p.a, 44100));
    assert_eq!(udp_payload(&back), &data[..]);
}

fn fragments_of_an_unfinished_datagram_are_freed_at_their_timeout_and_counted(p: Plan) {
    let mut n = node();
    let whole = frame::udp_with(POD_A, GW_MAC, (p.a, 1), (p.outside, 2), 64, &payload(4000));
    let frags = frame::fragments(&whole, 1500, 11);
    for f in &frags[..frags.len() - 1] {
        assert_eq!(send(&mut n, PA, f).0, Verdict::Queued);
    }
    let drops = |n: &Node| n.dp.control().stats().drop_count(DropReason::FragTimeout);
    n.tick(Duration::from_secs(14));
    assert_eq!(drops(&n), 0);
    n.tick(Duration::from_secs(2));
    assert_eq!(
        drops(&n),
        frags.len() as u64 - 1,
        "every held fragment freed"
    );
    // The last fragment alone now starts a new list: held, nothing sent.
    assert_eq!(send(&mut n, PA, frags.last().unwrap()).0, Verdict::Queued);
}

fn overlapping_and_tiny_fragments_are_refused_and_counted(p: Plan) {
    let mut n = node();
    let whole = frame::udp_with(POD_A, GW_MAC, (p.a, 1), (p.outside, 2), 64, &payload(3000));
    // Cut at 600 bytes: fragments other than the last below the minimum (1200 / 1280).
    let tiny = frame::fragments(&whole, 600, 12);
    assert_eq!(
        send(&mut n, PA, &tiny[0]).0,
        Verdict::Drop(DropReason::FragTooSmall)
    );
    // Two cuts of one datagram (same identification) overlap: the datagram is discarded.
    let a = frame::fragments(&whole, 1500, 13);
    let b = frame::fragments(&whole, 1300, 13);
    assert_eq!(send(&mut n, PA, &a[0]).0, Verdict::Queued);
    assert_eq!(
        send(&mut n, PA, &b[1]).0,
        Verdict::Drop(DropReason::FragOverlap)
    );
    let s = n.dp.control().stats();
    assert_eq!(s.drop_count(DropReason::FragTooSmall), 1);
    assert_eq!(s.drop_count(DropReason::FragOverlap), 1);
}

fn fragments_bigger_than_the_egress_mtu_are_cut_again_over_ipv4_and_refused_over_ipv6(p: Plan) {
    let mut n = node();
    let data = payload(9000);
    let whole = frame::udp_with(POD_A, GW_MAC, (p.a, 47000), (p.outside, 53), 64, &data);
    // Fragments of 4000 bytes for eth0's 1500: as Linux forwards after `nf_defrag` with
    // `frag_max_size` above the MTU.
    let frags = frame::fragments(&whole, 4000, 14);
    let (last, held) = frags.split_last().unwrap();
    for f in held {
        assert_eq!(send(&mut n, PA, f).0, Verdict::Queued);
    }
    let (v, out) = send(&mut n, PA, last);
    if p.is_v6() {
        // IPv6 routers never fragment: packet too big, MTU 1500, back to the pod.
        assert_eq!(v, Verdict::Drop(DropReason::PacketTooBig));
        let (port, f) = one(&out);
        assert_eq!(port, PA);
        assert_eq!(
            (
                f[14 + 40],
                u32::from_be_bytes(f[58..62].try_into().unwrap())
            ),
            (2, 1500)
        );
    } else {
        // IPv4 without DF: cut again for the MTU, masqueraded.
        assert_eq!(v, Verdict::Local);
        let out: Vec<_> = out.into_iter().map(|(_, f)| f).collect();
        assert!(out.iter().all(|f| f.len() <= 14 + 1500));
        assert_eq!(out.len(), 7, "9008 bytes of UDP in 1480-byte pieces");
        let back = frame::reassemble(&out).expect("fragments of one datagram");
        assert_eq!(flow(&back), (p.node, 47000, p.outside, 53));
        assert_eq!(udp_payload(&back), &data[..]);
    }
}

/// `f`, an IPv6 fragment of [`frame::fragments`] (its fragment header right after the fixed
/// header), with a destination options header (8 bytes of padding) put in front of the
/// fragment header, as a sender may (RFC 8200 4.1: it is in each fragment's unfragmentable
/// part).
fn with_dest_opts(f: &[u8]) -> Vec<u8> {
    let mut o = f[..54].to_vec();
    o[20] = 60;
    let plen = u16::from_be_bytes([f[18], f[19]]) + 8;
    o[18..20].copy_from_slice(&plen.to_be_bytes());
    o.extend_from_slice(&[44, 0, 1, 4, 0, 0, 0, 0]);
    o.extend_from_slice(&f[54..]);
    o
}

/// [`with_dest_opts`] undone: the fragment header right after the fixed header again.
fn without_dest_opts(f: &[u8]) -> Vec<u8> {
    assert_eq!(f[20], 60, "the destination options header is kept");
    let mut o = f[..54].to_vec();
    o[20] = f[54];
    let plen = u16::from_be_bytes([f[18], f[19]]) - 8;
    o[18..20].copy_from_slice(&plen.to_be_bytes());
    o.extend_from_slice(&f[62..]);
    o
}

/// An IPv6 fragment header behind another extension header is found too: the datagram is
/// put together and masqueraded whole, its fragments keep their destination options.
#[test]
fn ipv6_fragments_behind_a_destination_options_header_are_put_together() {
    let p = tapyard_testkit::kube::Plan::V6;
    let mut n = node();
    let data = payload(3000);
    let whole = frame::udp_with(POD_A, GW_MAC, (p.a, 46100), (p.outside, 53), 64, &data);
    let frags: Vec<_> = frame::fragments(&whole, 1492, 77)
        .iter()
        .map(|f| with_dest_opts(f))
        .collect();
    let out = send_fragments(&mut n, PA, &frags);
    assert_eq!(out.len(), frags.len(), "sent as the fragments it came in");
    let out: Vec<_> = out.iter().map(|f| without_dest_opts(f)).collect();
    let back = frame::reassemble(&out).expect("fragments of one datagram");
    assert_eq!(
        flow(&back),
        (p.node, 46100, p.outside, 53),
        "masqueraded whole"
    );
    assert_eq!(udp_payload(&back), &data[..]);
}

/// `ping -s 3000 <gateway>` from a pod: the echo request's fragments are put together
/// before delivery (by the NAT hook in front of the router, or without NAT by the router
/// itself, as Linux reassembles local input without conntrack), and the echo reply, as big,
/// goes back cut where the request was, from the gateway's MAC to the pod's.
fn a_fragmented_ping_to_the_gateway_is_answered_in_fragments_with_nat_or_without(p: Plan) {
    use etherparse::{Icmpv4Type, Icmpv6Type, SlicedPacket, TransportSlice};
    for without_nat in [false, true] {
        let mut n = tapyard_testkit::kube::kube_node(tapyard_testkit::kube::KubeOptions {
            without_nat,
            ..Default::default()
        });
        assert_eq!(n.dp.control().netfilter().is_none(), without_nat);
        let data = payload(3000);
        let ping = frame::ip(POD_A, GW_MAC, p.a, p.gw, 64);
        let mut whole = Vec::new();
        if p.is_v6() {
            ping.icmpv6_echo_request(7, 1).write(&mut whole, &data)
        } else {
            ping.icmpv4_echo_request(7, 1).write(&mut whole, &data)
        }
        .unwrap();
        let frags = frame::fragments(&whole, 1500, 21);
        let out = send_fragments(&mut n, PA, &frags);
        assert_eq!(out.len(), frags.len(), "answered in as many fragments");
        for (o, i) in out.iter().zip(&frags) {
            assert_eq!(o.len(), i.len(), "each the size of the request's");
            assert_eq!((&o[0..6], &o[6..12]), (&POD_A.0[..], &GW_MAC.0[..]));
        }
        let reply = frame::reassemble(&out).expect("fragments of one datagram");
        assert!(frame::l4_checksums_ok(&reply[14..]));
        let s = SlicedPacket::from_ethernet(&reply).unwrap();
        let (id_seq, body) = match s.transport {
            Some(TransportSlice::Icmpv4(i)) => match i.icmp_type() {
                Icmpv4Type::EchoReply(h) => ((h.id, h.seq), i.payload().to_vec()),
                t => panic!("{t:?}"),
            },
            Some(TransportSlice::Icmpv6(i)) => match i.icmp_type() {
                Icmpv6Type::EchoReply(h) => ((h.id, h.seq), i.payload().to_vec()),
                t => panic!("{t:?}"),
            },
            t => panic!("{t:?}"),
        };
        assert_eq!(id_seq, (7, 1));
        assert_eq!(body, data);
        let (src, dst) = match s.net {
            Some(etherparse::NetSlice::Ipv4(i)) => (
                std::net::IpAddr::from(i.header().source_addr()),
                std::net::IpAddr::from(i.header().destination_addr()),
            ),
            Some(etherparse::NetSlice::Ipv6(i)) => (
                std::net::IpAddr::from(i.header().source_addr()),
                std::net::IpAddr::from(i.header().destination_addr()),
            ),
            t => panic!("{t:?}"),
        };
        assert_eq!((src, dst), (p.gw, p.a));
        assert_eq!(n.dp.control().stats().reassembled, 1);
    }
}
