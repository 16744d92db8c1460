//! TSO super-frames across the overlay, over either underlay: a pod's super-frame leaves the
//! uplink as one UDP-tunnel super-frame (for an offload TAP with UDP-tunnel GSO) or as right
//! segments (any other port), none lost in a full batch; the receiving node decapsulates a
//! tunnel super-frame whole; lying virtio headers from a pod or from the uplink are dropped
//! by reason; and, as root, the kernel takes what tapyard writes to real TAPs.

use super::*;

use tapyard::offload::{VirtioNetHdr, VIRTIO_NET_HDR_F_NEEDS_CSUM};
use tapyard::port::{Port, TapPort};
use tapyard::wire::virtio::VIRTIO_NET_HDR_F_UDP_TUNNEL_CSUM;
use tapyard::BufPool;

per_family!(
    a_tso_super_frame_crosses_the_underlay_whole_or_as_segments,
    a_full_batch_of_super_frames_loses_no_segment,
    lying_super_frames_from_a_pod_are_dropped_by_reason,
    a_tunnel_super_frame_from_the_uplink_is_decapsulated_whole_unless_it_lies,
);

/// Checks the UDP-tunnel super-frame A's encapsulation makes of [`pod_tso`]`(u, payload)`:
/// the virtio header a UDP-tunnel GSO TAP takes (the kernel's `virtio_net_hdr_tnl_to_skb`
/// wants the tunnel bit of the outer family and `csum_start` at the inner TCP header), the
/// outer lengths of the whole, its outer UDP checksum partial, the inner frame as routed
/// (VTEP MACs, TTL or hop limit 63, TCP segment unchanged with its checksum still partial).
fn check_tunnel_super_frame(u: Under, b: &PacketBuf, pod_frame: &[u8], payload: usize) {
    let o = u.overhead();
    assert_eq!(
        b.offload,
        VirtioNetHdr {
            flags: VIRTIO_NET_HDR_F_NEEDS_CSUM,
            gso_type: u.gso_tcp() | u.gso_tunnel(),
            hdr_len: u16::try_from(o + u.l4() + 20).unwrap(),
            gso_size: u.mss(),
            csum_start: u16::try_from(o + u.l4()).unwrap(),
            csum_offset: 16,
        }
    );
    let f = b.frame();
    assert_eq!(f.len(), o + u.l4() + 20 + payload);
    assert_eq!(f.len(), o + pod_frame.len());
    let udp_len = u16::try_from(f.len() - u.l4()).unwrap();
    match u {
        Under::V4 => {
            assert_eq!(&f[12..14], &[0x08, 0x00], "outer IPv4");
            assert_eq!(&f[16..18], &(udp_len + 20).to_be_bytes(), "total length");
            assert_eq!(f[23], 17);
        }
        Under::V6 => {
            assert_eq!(&f[12..14], &[0x86, 0xdd], "outer IPv6");
            assert_eq!(&f[18..20], &udp_len.to_be_bytes(), "payload length");
            assert_eq!(f[20], 17, "UDP right after the fixed header");
        }
    }
    let l4 = u.l4();
    assert_eq!(&f[l4 + 2..l4 + 4], &8472u16.to_be_bytes());
    assert_eq!(&f[l4 + 4..l4 + 6], &udp_len.to_be_bytes(), "UDP length");
    assert_eq!(
        &f[l4 + 6..l4 + 8],
        &pseudo_sum(u, f, 14).to_be_bytes(),
        "outer UDP checksum partial"
    );
    assert_eq!(&f[l4 + 8..o], &[0x08, 0, 0, 0, 0, 0, 1, 0]);
    let inner = &f[o..];
    assert_eq!(&inner[..6], &default_mac(u.pod(2, 0)).0);
    assert_eq!(&inner[6..12], &default_mac(u.pod(1, 0)).0);
    let ttl = match u {
        Under::V4 => 14 + 8,
        Under::V6 => 14 + 7,
    };
    assert_eq!(inner[ttl], 63, "TTL or hop limit decremented once");
    assert!(inner[l4..] == pod_frame[l4..], "the TCP segment unchanged");
}

/// Checks one VXLAN segment of a pod's TCP flow as a receiver would: at most the underlay's
/// 1500 bytes, outer lengths (and the IPv4 header checksum), a nonzero and right outer UDP
/// checksum, a right inner TCP checksum, the sequence number `seq` (advanced past its
/// payload, which is appended to `got`).
fn check_segment(u: Under, w: &[u8], seq: &mut u32, got: &mut Vec<u8>) {
    assert!(w.len() <= 14 + 1500, "{}", w.len());
    let s = SlicedPacket::from_ethernet(w).unwrap();
    let Some(TransportSlice::Udp(udp)) = s.transport else {
        panic!("not UDP")
    };
    match (u, s.net) {
        (Under::V4, Some(NetSlice::Ipv4(ip))) => {
            let h = ip.header().to_header();
            assert_eq!(
                h.calc_header_checksum(),
                h.header_checksum,
                "outer IPv4 checksum"
            );
            assert_eq!(usize::from(h.total_len), w.len() - 14);
        }
        (Under::V6, Some(NetSlice::Ipv6(ip))) => {
            assert_eq!(usize::from(ip.header().payload_length()), w.len() - u.l4());
        }
        (_, n) => panic!("outer not {u:?}: {n:?}"),
    }
    assert_eq!(usize::from(udp.length()), w.len() - u.l4());
    assert_ne!(udp.checksum(), 0);
    assert!(udp_checksum_ok(w), "outer UDP checksum");
    let inner = &udp.payload()[8..];
    let s = SlicedPacket::from_ethernet(inner).unwrap();
    let Some(TransportSlice::Tcp(t)) = s.transport else {
        panic!("inner not TCP")
    };
    assert_eq!(t.sequence_number(), *seq, "sequence numbers contiguous");
    let payload = tcp_payload_checked(inner);
    *seq = seq.wrapping_add(u32::try_from(payload.len()).unwrap());
    got.extend_from_slice(&payload);
}

/// The segments a port without UDP-tunnel GSO sends of a tunnel super-frame carrying
/// [`pod_tso`]`(u, payload)`, each checked by [`check_segment`]; returns them.
fn check_tunnel_segments(u: Under, b: &PacketBuf, payload: usize) -> Vec<Vec<u8>> {
    let segs = segments(b);
    assert_eq!(segs.len(), payload.div_ceil(usize::from(u.mss())));
    let (mut got, mut seq) = (Vec::new(), 1000u32);
    for w in &segs {
        check_segment(u, w, &mut seq, &mut got);
    }
    assert!(got == pattern(payload), "reassembled payload");
    segs
}

/// Checks the inner TCP super-frame C hands its pod after decapsulating a tunnel
/// super-frame whole: the pod's virtio header, and right segments of the whole payload.
fn check_inner_super_frame(u: Under, b: &PacketBuf, payload: usize) {
    assert_eq!(b.offload, inner_offload(u));
    assert_eq!(b.len(), u.l4() + 20 + payload);
    let segs = segments(b);
    assert_eq!(segs.len(), payload.div_ceil(usize::from(u.mss())));
    let got: Vec<u8> = segs.iter().flat_map(|s| tcp_payload_checked(s)).collect();
    assert!(got == pattern(payload), "inner payload");
}

/// A tunnel super-frame as C's UDP-tunnel TAP hands it over: `sf` with the outer checksum
/// marked partial.
fn received(sf: &PacketBuf) -> PacketBuf {
    let mut b = common::copy_buf(sf);
    b.offload.flags |= VIRTIO_NET_HDR_F_UDP_TUNNEL_CSUM;
    b.port = ETH0;
    b
}

fn a_tso_super_frame_crosses_the_underlay_whole_or_as_segments(u: Under) {
    let (mut a, mut c) = (node(1), node(2));
    let payload = 10 * usize::from(u.mss());
    let pod = pod_tso(u, &a, payload);
    let pod_frame = pod.frame().to_vec();
    let (v, out) = a.run_whole(pod);
    assert_eq!(v, Verdict::Output(ETH0));
    assert_eq!(
        out.len(),
        1,
        "one super-frame, no segments made in the batch"
    );
    let (port, sf) = &out[0];
    assert_eq!(*port, ETH0);
    // An offload uplink with UDP-tunnel GSO takes it as it is.
    check_tunnel_super_frame(u, sf, &pod_frame, payload);
    let st = a.dp.control().stats();
    assert_eq!((st.generated, st.generated_lost), (0, 0), "{st:?}");
    assert_eq!(st.accounted(), 1);
    let t = a.dp.control().tunnel_by_name(u.tunnel()).unwrap();
    let p = t.peers().by_ip(u.node_ip(2)).unwrap().stats();
    assert_eq!((p.tx_packets, p.tx_bytes), (1, pod_frame.len() as u64));

    // Any other uplink sends it as 10 right segments, each of which C decapsulates and
    // routes to its pod.
    let segs = check_tunnel_segments(u, sf, payload);
    assert_eq!(segs.len(), 10);
    let mut got = Vec::new();
    for w in &segs {
        let (v, o) = c.run(ETH0, w);
        assert!(
            matches!(v, Verdict::Output(POD) | Verdict::Flood(_)),
            "{v:?}"
        );
        assert_eq!(o[0].0, POD);
        got.extend(tcp_payload_checked(&o[0].1));
    }
    assert!(got == pattern(payload));

    // What a UDP-tunnel TAP on C's side hands over (the kernel keeps it whole, outer
    // checksum partial): decapsulated whole into the inner TCP super-frame.
    let (v, o) = c.run_whole(received(sf));
    assert!(
        matches!(v, Verdict::Output(POD) | Verdict::Flood(_)),
        "{v:?}"
    );
    assert_eq!(o.len(), 1);
    check_inner_super_frame(u, &o[0].1, payload);
}

fn a_full_batch_of_super_frames_loses_no_segment(u: Under) {
    // 32 super-frames of 46 segments each (~64 KiB, what a pod's TCP sends in bulk): before,
    // each was segmented before encapsulation into the batch's extra frames, at most
    // MAX_EXTRA (256) of them, and the rest counted as `generated_lost`.
    let mut a = node(1);
    let payload = 46 * usize::from(u.mss());
    let bufs: Vec<PacketBuf> = (0..32).map(|_| pod_tso(u, &a, payload)).collect();
    let pod_frame = bufs[0].frame().to_vec();
    const { assert!(32 * 46 > tapyard::MAX_EXTRA) };
    let (v, out) = a.run_batch_whole(bufs);
    assert!(v.iter().all(|v| *v == Verdict::Output(ETH0)), "{v:?}");
    assert_eq!(out.len(), 32);
    let mut segs = 0;
    for (_, sf) in &out {
        check_tunnel_super_frame(u, sf, &pod_frame, payload);
        segs += check_tunnel_segments(u, sf, payload).len();
    }
    assert_eq!(segs, 32 * 46);
    let st = a.dp.control().stats();
    assert_eq!((st.generated, st.generated_lost), (0, 0), "{st:?}");
    assert_eq!(st.accounted(), 32);
}

fn lying_super_frames_from_a_pod_are_dropped_by_reason(u: Under) {
    let mut a = node(1);
    let good = pod_tso(u, &a, 5_000);
    let lie = |edit: &dyn Fn(&mut PacketBuf)| {
        let mut b = common::copy_buf(&good);
        edit(&mut b);
        b
    };
    let ip_mid = u16::try_from(14 + u.ip_len() / 2).unwrap();
    let tcp_mid = u16::try_from(u.l4() + 6).unwrap();
    let other_tcp = u.other().gso_tcp();
    let tunnel = u.gso_tunnel();
    let lies: [&dyn Fn(&mut PacketBuf); 9] = [
        &|b| b.offload.flags = 0,            // no partial checksum
        &|b| b.offload.csum_start = ip_mid,  // inside the IP header
        &|b| b.offload.csum_start = tcp_mid, // inside the TCP header
        &|b| b.offload.csum_offset = 6,      // UDP's field, not TCP's
        &|b| b.offload.gso_size = 0,         // no segment size
        &|b| b.offload.gso_type = other_tcp, // the other family
        &|b| b.offload.gso_type = 5,         // USO
        &|b| b.offload.hdr_len = 60_000,     // past the frame
        &|b| b.offload.gso_type |= tunnel,   // a tunnel already
    ];
    for (i, edit) in lies.into_iter().enumerate() {
        let before = a.drops(DropReason::BadOffload);
        let (v, out) = a.run_batch_whole(vec![lie(edit)]);
        assert_eq!(v, [Verdict::Drop(DropReason::BadOffload)], "lie {i}");
        assert!(out.is_empty());
        assert_eq!(a.drops(DropReason::BadOffload), before + 1);
    }
    // UDP under a TCP GSO type (the router forwards it; encapsulation refuses it).
    let udp = pod_udp(u, 1, a.gw_mac, u.pod(2, 2), 3000);
    let mut b = PacketBuf::new(70_000);
    b.room_mut()[..udp.len()].copy_from_slice(&udp);
    b.set_len(udp.len());
    b.port = POD;
    b.offload = good.offload;
    let (v, _) = a.run_batch_whole(vec![b]);
    assert!(matches!(v[0], Verdict::Drop(_)), "{v:?}");

    // Fuzz-ish: random virtio headers and random header bytes never panic; every frame is
    // accounted for (forwarded, flooded or dropped under a reason), and whatever leaves the
    // uplink is either a super-frame `offload::segment` turns into right segments or one it
    // refuses (a port counts that as `bad_offload`).
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let before = a.dp.control().stats().accounted();
    let bad_before = a.drops(DropReason::BadOffload);
    let (rounds, mut sent) = (3000, 0);
    for _ in 0..rounds {
        let mut b = common::copy_buf(&good);
        let r = rnd();
        let rb = r.to_le_bytes();
        let o = &mut b.offload;
        match r % 6 {
            0 => o.flags = rb[1],
            1 => o.gso_type = rb[1],
            2 => o.csum_start = ((r >> 8) % 200) as u16,
            3 => o.csum_offset = ((r >> 8) % 40) as u16,
            4 => o.hdr_len = u16::from_le_bytes([rb[1], rb[2]]),
            _ => o.gso_size = ((r >> 8) % 3000) as u16,
        }
        for _ in 0..(rnd() % 3) {
            let at = (rnd() % 120) as usize;
            b.frame_mut()[at] = rnd().to_le_bytes()[0];
        }
        if rnd() % 4 == 0 {
            let cut = 14 + (rnd() % 200) as usize;
            b.set_len(cut.min(b.len()));
        }
        let (_, out) = a.run_batch_whole(vec![b]);
        for (_, o) in out.iter().filter(|(p, _)| *p == ETH0) {
            sent += 1;
            let mut scratch = vec![0u8; 70_000];
            let _ = tapyard::offload::segment(o.frame(), &o.offload, &mut scratch, &mut |f| {
                assert!(udp_checksum_ok(f), "a segment with a wrong outer checksum");
            });
        }
    }
    assert_eq!(a.dp.control().stats().accounted() - before, rounds);
    // Both outcomes were exercised.
    let refused = a.drops(DropReason::BadOffload) - bad_before;
    assert!(
        sent > 100 && refused > 100,
        "sent {sent}, refused {refused}"
    );
}

/// A tunnel super-frame built here byte by byte (not by tapyard), as node A's uplink TAP
/// with UDP-tunnel GSO hands it to C: decapsulated whole into the inner TCP super-frame for
/// C's pod (no tunnel bit, the partial checksum now from the inner frame's start). Each lie
/// in its virtio header, or another UDP port, is dropped as `bad_offload`.
fn a_tunnel_super_frame_from_the_uplink_is_decapsulated_whole_unless_it_lies(u: Under) {
    let mut c = node(2);
    let payload = 5 * usize::from(u.mss());
    let mut pod = pod_tso(u, &c, payload);
    // As A's router sends it: from A's VTEP MAC to C's, TTL or hop limit 63.
    let f = pod.frame_mut();
    f[..6].copy_from_slice(&default_mac(u.pod(2, 0)).0);
    f[6..12].copy_from_slice(&default_mac(u.pod(1, 0)).0);
    match u {
        Under::V4 => {
            f[22] = 63;
            f[24..26].fill(0);
            let h = etherparse::Ipv4HeaderSlice::from_slice(&f[14..34]).unwrap();
            let sum = h.to_header().calc_header_checksum();
            f[24..26].copy_from_slice(&sum.to_be_bytes());
        }
        Under::V6 => f[21] = 63,
    }
    let inner = pod.frame().to_vec();
    let mut vxlan = vec![0x08, 0, 0, 0, 0, 0, 1, 0];
    vxlan.extend_from_slice(&inner);
    let mut f = Vec::new();
    let eth = PacketBuilder::ethernet2([2, 0xaa, 1, 0, 0, 2], c.up_mac.0);
    match (u.node_ip(1), u.node_ip(2)) {
        (IpAddr::V4(s), IpAddr::V4(d)) => eth
            .ipv4(s.octets(), d.octets(), 64)
            .udp(40001, 8472)
            .write(&mut f, &vxlan),
        (IpAddr::V6(s), IpAddr::V6(d)) => eth
            .ipv6(s.octets(), d.octets(), 64)
            .udp(40001, 8472)
            .write(&mut f, &vxlan),
        _ => unreachable!(),
    }
    .unwrap();
    let sum = pseudo_sum(u, &f, 14);
    f[u.l4() + 6..u.l4() + 8].copy_from_slice(&sum.to_be_bytes());
    let o = u.overhead();
    let tunnel = |edit: &dyn Fn(&mut PacketBuf)| {
        let mut b = PacketBuf::new(70_000);
        b.room_mut()[..f.len()].copy_from_slice(&f);
        b.set_len(f.len());
        b.port = ETH0;
        b.offload = VirtioNetHdr {
            flags: VIRTIO_NET_HDR_F_NEEDS_CSUM | VIRTIO_NET_HDR_F_UDP_TUNNEL_CSUM,
            gso_type: u.gso_tcp() | u.gso_tunnel(),
            hdr_len: u16::try_from(o + u.l4() + 20).unwrap(),
            gso_size: u.mss(),
            csum_start: u16::try_from(o + u.l4()).unwrap(),
            csum_offset: 16,
        };
        edit(&mut b);
        b
    };
    let (v, got) = c.run_whole(tunnel(&|_| {}));
    assert!(
        matches!(v, Verdict::Output(POD) | Verdict::Flood(_)),
        "{v:?}"
    );
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].0, POD);
    assert_eq!(got[0].1.len(), inner.len());
    check_inner_super_frame(u, &got[0].1, payload);

    let (tcp, tun, other_tun) = (u.gso_tcp(), u.gso_tunnel(), u.other().gso_tunnel());
    let dport = u.l4() + 2;
    let lies: [&dyn Fn(&mut PacketBuf); 7] = [
        &|b| b.offload.flags = 0,          // no partial checksum
        &|b| b.offload.csum_start = 20,    // inside the outer header
        &|b| b.offload.csum_offset = 6,    // not TCP's field
        &|b| b.offload.gso_type = tun | 5, // USO inside
        &|b| b.offload.gso_size = 0,
        &|b| b.offload.gso_type = tcp | other_tun, // the other family's tunnel bit
        // Not VXLAN for this node (another UDP port).
        &|b| b.frame_mut()[dport..dport + 2].copy_from_slice(&4789u16.to_be_bytes()),
    ];
    for (i, lie) in lies.into_iter().enumerate() {
        let before = c.drops(DropReason::BadOffload);
        assert_eq!(
            c.run_whole(tunnel(lie)).0,
            Verdict::Drop(DropReason::BadOffload),
            "lie {i}"
        );
        assert_eq!(c.drops(DropReason::BadOffload), before + 1);
    }
}

#[test]
#[cfg_attr(
    not(tapyard_root),
    ignore = "needs root: TAP devices and network namespaces (runs as root, as in CI)"
)]
fn a_tunnel_super_frame_crosses_real_taps_over_ipv4() {
    tunnel_super_frame_crosses_real_taps(Under::V4);
}

#[test]
#[cfg_attr(
    not(tapyard_root),
    ignore = "needs root: TAP devices and network namespaces (runs as root, as in CI)"
)]
fn a_tunnel_super_frame_crosses_real_taps_over_ipv6() {
    tunnel_super_frame_crosses_real_taps(Under::V6);
}

/// Root: the kernel takes tapyard's VXLAN super-frame as it is written to a TAP with
/// UDP-tunnel GSO (Linux checks its header in `virtio_net_hdr_tnl_to_skb`): across a Linux
/// bridge it reaches another such TAP whole (read back as one UDP-tunnel super-frame, which
/// C decapsulates whole) and a plain TAP as segments the kernel made (outer headers
/// replicated, each outer UDP checksum computed). Written to an offload TAP without
/// UDP-tunnel GSO instead, it is segmented by tapyard and the plain TAP gets the same right
/// segments.
fn tunnel_super_frame_crosses_real_taps(u: Under) {
    if let Some(why) = common::skip_reason(&[]) {
        common::skip(&why);
        return;
    }
    let (pid, tag) = common::name_tag();
    let fam = if u == Under::V4 { 4 } else { 6 };
    let name = |i: u8| format!("tyv{fam}{}{i}", pid % 10_000);
    let mut t1 = TapPort::open_offload(&name(1)).unwrap();
    if let Err(e) = t1.enable_tunnel_offload() {
        common::skip(&format!(
            "skipping: the kernel refuses UDP-tunnel GSO on a TAP ({e})"
        ));
        return;
    }
    let mut t2 = TapPort::open_offload(&name(2)).unwrap();
    t2.enable_tunnel_offload().unwrap();
    assert!(t1.tunnel_offload() && t2.tunnel_offload());
    // Adopting the descriptor finds the 24-byte header again.
    let dup = TapPort::from_fd(t2.handover_fd().try_clone_to_owned().unwrap(), true).unwrap();
    assert!(dup.tunnel_offload());
    drop(dup);
    // A TAP without a virtio-net header cannot take UDP-tunnel GSO: refused, left as it was
    // (the per-segment path).
    let mut t3 = TapPort::open(&name(3)).unwrap();
    assert!(t3.enable_tunnel_offload().is_err());
    assert!(!t3.tunnel_offload());
    let t4 = TapPort::open_offload(&name(4)).unwrap();
    assert!(!t4.tunnel_offload());
    let mut g = common::Guard::default();
    let ns = g.ns(&format!("tyv{fam}-{pid}-{tag}"));
    ns.disable_ipv6();
    ns.ip(&["link", "add", "br0", "type", "bridge"]);
    ns.ip(&["link", "set", "br0", "up"]);
    for i in 1..=4 {
        common::run(&["ip", "link", "set", &name(i), "netns", &ns.name]);
        ns.ip(&["link", "set", &name(i), "master", "br0"]);
        ns.ip(&["link", "set", &name(i), "up"]);
    }
    let (mut a, mut c) = (node(1), node(2));
    let payload = 30_000;
    let pod = pod_tso(u, &a, payload);
    let pod_frame = pod.frame().to_vec();
    let (_, out) = a.run_whole(pod);
    let sf = &out[0].1;
    check_tunnel_super_frame(u, sf, &pod_frame, payload);
    let ethertype = if u == Under::V4 {
        [0x08, 0]
    } else {
        [0x86, 0xdd]
    };
    let dport = u.l4() + 2..u.l4() + 4;
    let is_vxlan = |b: &PacketBuf| {
        b.frame().get(12..14) == Some(&ethertype[..])
            && b.frame().get(dport.clone()) == Some(&8472u16.to_be_bytes()[..])
    };
    let want_segs = payload.div_ceil(usize::from(u.mss()));
    // Nobody has C's MAC: the bridge floods to the other TAPs.
    t1.send(sf).unwrap();
    let mut pool = BufPool::new(t2.frame_room(), 64);
    let mut whole = None;
    assert!(
        common::read_until(&t2, &mut pool, &mut |b| {
            let hit = is_vxlan(b);
            if hit {
                whole = Some(common::copy_buf(b));
            }
            hit
        }),
        "no super-frame on the UDP-tunnel TAP"
    );
    let mut whole = whole.unwrap();
    assert!(
        whole.frame() == sf.frame(),
        "the super-frame crossed unchanged"
    );
    assert_eq!(whole.offload.gso_type, u.gso_tcp() | u.gso_tunnel());
    assert_eq!(
        (whole.offload.csum_start, whole.offload.gso_size),
        (sf.offload.csum_start, u.mss())
    );
    whole.port = ETH0;
    let (v, o) = c.run_whole(whole);
    assert!(
        matches!(v, Verdict::Output(POD) | Verdict::Flood(_)),
        "{v:?}"
    );
    check_inner_super_frame(u, &o[0].1, payload);
    // The plain TAP gets the kernel's segments; then the ones tapyard makes for an offload
    // TAP without UDP-tunnel GSO. Each is right and reaches C's pod.
    let mut pool = BufPool::new(t3.frame_room(), 64);
    for (sender, what) in [(None, "the kernel's"), (Some(&t4), "tapyard's")] {
        if let Some(t) = sender {
            t.send(sf).unwrap();
        }
        let (mut got, mut seq, mut n) = (Vec::new(), 1000u32, 0);
        assert!(
            common::read_until(&t3, &mut pool, &mut |b| {
                if !is_vxlan(b) {
                    return false;
                }
                check_segment(u, b.frame(), &mut seq, &mut got);
                let (v, o) = c.run(ETH0, b.frame());
                assert!(
                    matches!(v, Verdict::Output(POD) | Verdict::Flood(_)),
                    "{v:?}"
                );
                assert_eq!(o[0].0, POD);
                n += 1;
                n == want_segs
            }),
            "{n} of {want_segs} of {what} segments on the plain TAP"
        );
        assert!(got == pattern(payload), "{what} segments' payload");
    }
    drop((t1, t2, t3, t4));
}
