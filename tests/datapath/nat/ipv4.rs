//! What only IPv4 has here: TSO super-frames from offload TAPs (TCP/IPv4 GSO with a partial
//! checksum), routed, masqueraded and DNAT'd whole.

use super::*;

use etherparse::PacketBuilder;
use tapyard::{MacAddr, PortId};

const A: [u8; 4] = [10, 244, 1, 2];
const B: [u8; 4] = [10, 244, 1, 3];
const REMOTE: [u8; 4] = [10, 244, 2, 2];
const WEB: [u8; 4] = [10, 96, 0, 10];
const OUTSIDE: [u8; 4] = [192, 0, 2, 10];
const NODE: [u8; 4] = [172, 18, 0, 2];

/// What a frame carries over IPv4.
fn flow4(f: &[u8]) -> ([u8; 4], u16, [u8; 4], u16) {
    frame::flow(f)
}

// -- TSO super-frames from offload TAPs, routed and NAT'd ------------------------------------

/// Bytes of TCP payload in the test super-frames: a little over three 1448-byte segments.
const SUPER_PAYLOAD: usize = 3 * 1448 + 700;
const MSS: u16 = 1448;

/// One's complement sum of big-endian 16-bit words, folded.
#[allow(
    clippy::cast_possible_truncation,
    reason = "test frames: lengths, indices and sums below 64 KiB, payload bytes wrap on purpose"
)]
fn fold_sum(mut s: u32, data: &[u8]) -> u16 {
    for w in data.chunks(2) {
        s += u32::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)]));
    }
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    s as u16
}

/// What Linux puts in the TCP checksum field of a `CHECKSUM_PARTIAL` (TSO) packet: the folded
/// pseudo-header sum for the whole TCP length, not complemented (`tcp_v4_send_check`).
#[allow(
    clippy::cast_possible_truncation,
    reason = "test frames: lengths, indices and sums below 64 KiB, payload bytes wrap on purpose"
)]
fn pseudo_partial(src: [u8; 4], dst: [u8; 4], tcp_len: usize) -> u16 {
    let mut p = Vec::new();
    p.extend_from_slice(&src);
    p.extend_from_slice(&dst);
    p.extend_from_slice(&[0, 6]);
    p.extend_from_slice(&(tcp_len as u16).to_be_bytes());
    fold_sum(0, &p)
}

/// A TSO super-frame as an offload TAP hands it over: an IPv4 total length over the MTU, a
/// partial TCP checksum and the virtio-net header asking for segmentation into `MSS`.
#[allow(
    clippy::cast_possible_truncation,
    reason = "test frames: lengths, indices and sums below 64 KiB, payload bytes wrap on purpose"
)]
fn super_frame(
    src_mac: MacAddr,
    dst_mac: MacAddr,
    src: [u8; 4],
    sport: u16,
    dst: [u8; 4],
    dport: u16,
) -> (Vec<u8>, tapyard::Offload) {
    let mut f = Vec::new();
    let payload: Vec<u8> = (0..SUPER_PAYLOAD).map(|i| (i * 7 + 3) as u8).collect();
    PacketBuilder::ethernet2(src_mac.0, dst_mac.0)
        .ipv4(src, dst, 64)
        .tcp(sport, dport, 7000, 64240)
        .ack(5000)
        .psh()
        .write(&mut f, &payload)
        .unwrap();
    let tcp_len = f.len() - 34;
    f[34 + 16..34 + 18].copy_from_slice(&pseudo_partial(src, dst, tcp_len).to_be_bytes());
    let hdr = tapyard::Offload {
        flags: tapyard::offload::VIRTIO_NET_HDR_F_NEEDS_CSUM,
        gso_type: tapyard::offload::VIRTIO_NET_HDR_GSO_TCPV4,
        hdr_len: 54,
        gso_size: MSS,
        csum_start: 34,
        csum_offset: 16,
    };
    (f, hdr)
}

/// Processes one frame with its offload header; returns its verdict and every frame sent
/// with the offload header it leaves with.
fn send_offload(
    n: &mut Node,
    port: PortId,
    frame: &[u8],
    hdr: tapyard::Offload,
) -> (Verdict, Vec<(PortId, Vec<u8>, tapyard::Offload)>) {
    let mut batch = tapyard::Batch::new();
    let mut b = tapyard::PacketBuf::from_frame(frame);
    b.port = port;
    b.offload = hdr;
    batch.push(b).unwrap();
    n.dp.process(&mut n.w, n.now, &mut batch);
    let v = batch.verdicts()[0];
    let mut out = Vec::new();
    n.dp.dispatch(&mut n.w, &batch, |p, b| {
        out.push((p, b.frame().to_vec(), b.offload));
        Ok(())
    });
    batch.recycle(&mut n.w.pool);
    (v, out)
}

/// Segments a TSO super-frame as the Linux receiver of an offload TAP does (`tcp_gso_segment`
/// then the checksum completed from `csum_start`): the partial checksum left in the frame is
/// only adjusted for each segment's length, so a wrong pseudo-header sum gives segments with
/// bad checksums.
#[allow(
    clippy::cast_possible_truncation,
    reason = "test frames: lengths, indices and sums below 64 KiB, payload bytes wrap on purpose"
)]
fn kernel_segment(f: &[u8], hdr: &tapyard::Offload) -> Vec<Vec<u8>> {
    let l3 = 14;
    let l4 = l3 + usize::from(f[l3] & 0xf) * 4;
    let start = usize::from(hdr.csum_start);
    let field = start + usize::from(hdr.csum_offset);
    assert_eq!(start, l4, "csum_start is the TCP header");
    assert_eq!(field, l4 + 16, "csum_offset is the TCP checksum field");
    let payload_off = l4 + usize::from(f[l4 + 12] >> 4) * 4;
    let payload = &f[payload_off..];
    let full_tcp_len = f.len() - l4;
    let partial = u16::from_be_bytes([f[field], f[field + 1]]);
    let mss = usize::from(hdr.gso_size);
    let id0 = u16::from_be_bytes([f[l3 + 4], f[l3 + 5]]);
    let seq0 = u32::from_be_bytes(f[l4 + 4..l4 + 8].try_into().unwrap());
    let chunks: Vec<&[u8]> = payload.chunks(mss).collect();
    let mut segs = Vec::new();
    for (i, chunk) in chunks.iter().enumerate() {
        let mut s = f[..payload_off].to_vec();
        s.extend_from_slice(chunk);
        let tcp_len = s.len() - l4;
        let total = (s.len() - l3) as u16;
        s[l3 + 2..l3 + 4].copy_from_slice(&total.to_be_bytes());
        s[l3 + 4..l3 + 6].copy_from_slice(&id0.wrapping_add(i as u16).to_be_bytes());
        s[l3 + 10..l3 + 12].copy_from_slice(&[0, 0]);
        let ipc = !fold_sum(0, &s[l3..l4]);
        s[l3 + 10..l3 + 12].copy_from_slice(&ipc.to_be_bytes());
        let seq = seq0.wrapping_add((i * mss) as u32);
        s[l4 + 4..l4 + 8].copy_from_slice(&seq.to_be_bytes());
        if i + 1 != chunks.len() {
            s[l4 + 13] &= !0x09; // FIN, PSH only on the last segment
        }
        // The pseudo-header sum with this segment's length instead of the whole one.
        let adj = fold_sum(
            u32::from(partial) + u32::from(!(full_tcp_len as u16)) + tcp_len as u32,
            &[],
        );
        s[field..field + 2].copy_from_slice(&adj.to_be_bytes());
        let c = !fold_sum(0, &s[start..]);
        s[field..field + 2].copy_from_slice(&c.to_be_bytes());
        segs.push(s);
    }
    segs
}

/// Checks a forwarded super-frame: its offload header is the one it came in with, its IPv4
/// header checksum is valid, its TTL is `ttl`, and the segments the receiving kernel makes of
/// it carry `want` (every checksum checked by `flow`) and the payload in order.
#[allow(
    clippy::cast_possible_truncation,
    reason = "test frames: lengths, indices and sums below 64 KiB, payload bytes wrap on purpose"
)]
fn check_super(f: &[u8], hdr: &tapyard::Offload, sent: &tapyard::Offload, ttl: u8, want: Flow) {
    assert_eq!(hdr, sent, "virtio-net header kept");
    let ip = etherparse::Ipv4HeaderSlice::from_slice(&f[14..]).unwrap();
    let h = ip.to_header();
    assert_eq!(h.header_checksum, h.calc_header_checksum(), "IPv4 checksum");
    assert_eq!(h.time_to_live, ttl, "TTL");
    assert_eq!(usize::from(h.total_len) + 14, f.len(), "IPv4 total length");
    let segs = kernel_segment(f, hdr);
    assert_eq!(segs.len(), SUPER_PAYLOAD.div_ceil(usize::from(MSS)));
    let mut data = Vec::new();
    for s in &segs {
        assert!(s.len() - 14 <= 1500, "segment fits the MTU");
        assert_eq!(flow4(s), want, "segment's flow and checksums");
        data.extend_from_slice(&s[54..]);
    }
    let payload: Vec<u8> = (0..SUPER_PAYLOAD).map(|i| (i * 7 + 3) as u8).collect();
    assert_eq!(data, payload);
}

type Flow = ([u8; 4], u16, [u8; 4], u16);

#[test]
fn tso_super_frames_are_routed_and_natted_whole_with_partial_checksums_kept_right() {
    let mut n = node();
    // Routed, no NAT: pod A to node B's pod over eth0, TTL decremented.
    send(&mut n, PA, &tcp(POD_A, GW_MAC, A, 42000, REMOTE, 5201, SYN));
    let (v, _) = send(
        &mut n,
        ETH0,
        &tcp(PEER, UP_MAC, REMOTE, 5201, A, 42000, SYNACK),
    );
    assert_eq!(v, Verdict::Output(PA));
    let (sf, hdr) = super_frame(POD_A, GW_MAC, A, 42000, REMOTE, 5201);
    let (v, out) = send_offload(&mut n, PA, &sf, hdr);
    assert_eq!(v, Verdict::Output(ETH0));
    assert_eq!(out.len(), 1, "one super-frame out, not segments");
    let (p, f, h) = &out[0];
    assert_eq!(*p, ETH0);
    assert_eq!(
        &f[0..12],
        &[PEER.0, UP_MAC.0].concat()[..],
        "MACs rewritten"
    );
    check_super(f, h, &hdr, 63, (A, 42000, REMOTE, 5201));

    // Masqueraded: pod A to the outside through eth0, source rewritten to the node's address
    // (and maybe its port): the partial sum must follow the new source address.
    let (_, out) = send(&mut n, PA, &tcp(POD_A, GW_MAC, A, 42001, OUTSIDE, 443, SYN));
    let (_, msport, _, _) = flow4(one(&out).1);
    let (v, _) = send(
        &mut n,
        ETH0,
        &tcp(OUTGW, UP_MAC, OUTSIDE, 443, NODE, msport, SYNACK),
    );
    assert_eq!(v, Verdict::Output(PA));
    let (sf, hdr) = super_frame(POD_A, GW_MAC, A, 42001, OUTSIDE, 443);
    let (v, out) = send_offload(&mut n, PA, &sf, hdr);
    assert_eq!(v, Verdict::Output(ETH0));
    assert_eq!(out.len(), 1);
    let (_, f, h) = &out[0];
    check_super(f, h, &hdr, 63, (NODE, msport, OUTSIDE, 443));

    // Pod A to the ClusterIP, DNAT'd to pod B on the same bridge (routed through cni0), and
    // pod B's data back, un-DNAT'd to come from the ClusterIP.
    let sport = (43000..43100u16)
        .find(|&s| {
            let (_, out) = send(&mut n, PA, &tcp(POD_A, GW_MAC, A, s, WEB, 80, SYN));
            flow4(one(&out).1).2 == B
        })
        .expect("pod B chosen for one of 100 connections");
    let (v, _) = send(&mut n, PB, &tcp(POD_B, POD_A, B, 8080, A, sport, SYNACK));
    assert_eq!(v, Verdict::Output(PA));
    let (sf, hdr) = super_frame(POD_A, GW_MAC, A, sport, WEB, 80);
    let (v, out) = send_offload(&mut n, PA, &sf, hdr);
    assert_eq!(v, Verdict::Output(PB));
    assert_eq!(out.len(), 1);
    let (_, f, h) = &out[0];
    assert_eq!(&f[0..6], &POD_B.0);
    check_super(f, h, &hdr, 63, (A, sport, B, 8080));
    let (sf, hdr) = super_frame(POD_B, POD_A, B, 8080, A, sport);
    let (v, out) = send_offload(&mut n, PB, &sf, hdr);
    assert_eq!(v, Verdict::Output(PA));
    assert_eq!(out.len(), 1);
    let (_, f, h) = &out[0];
    // Switched on cni0 (pod B addressed pod A's MAC) and translated there: TTL kept.
    check_super(f, h, &hdr, 64, (WEB, 80, A, sport));
}
