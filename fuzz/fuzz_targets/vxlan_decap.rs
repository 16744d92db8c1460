//! A node with a VXLAN interface (as Flannel's `flannel.1`, one peer) fed datagrams whose
//! outer and inner headers are garbage in every way the input can choose: raw frames on the
//! uplink, VXLAN datagrams built with arbitrary source, UDP length and checksum, VXLAN flags
//! and VNI and inner frame, arbitrary offload metadata; and pod frames to be encapsulated.
//! Never panics; every frame received is forwarded, answered, queued or counted as a drop;
//! nothing is sent to the VXLAN interface's own port; every IPv4 frame leaving through the
//! uplink has a valid header checksum; the port-side completion of what leaves (checksums,
//! segmentation with the outer headers replicated) never panics either.
//!
//! The node is dual-stack with a second VXLAN interface over IPv6 (Flannel's `flannel-v6.1`):
//! IPv6 datagrams to it (any source, UDP length and checksum, zero included, VXLAN header and
//! inner frame) and IPv6 pod packets to be encapsulated over IPv6 are fed too.
//!
//! Input: records `[kind: u8][vnet: 10 bytes][len_hi: u8][len_lo: u8][bytes]`.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::net::{Ipv4Addr, Ipv6Addr};
use tapyard::l3::vxlan::default_mac;
use tapyard::l3::{IfaceConfig, VxlanConfig, VxlanPeer};
use tapyard::offload::VirtioNetHdr;
use tapyard::{Batch, BridgeConfig, Datapath, Instant, MacAddr, PacketBuf, PortId, Verdict};
use tapyard_testkit::frame::checksum_ok;

const GW: MacAddr = MacAddr([2, 0xaa, 0, 0, 0, 1]);
const UP: MacAddr = MacAddr([2, 0xaa, 0, 0, 0, 2]);
const POD: PortId = PortId(0);
const ETH0: PortId = PortId(2);
const VX_PORT: PortId = PortId(3);
const VX6_PORT: PortId = PortId(4);
const NODE6_A: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x172, 0x18, 0, 0, 0, 0, 2);
const NODE6_C: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x172, 0x18, 0, 0, 0, 0, 3);
const NET6_A: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0x244, 1, 0, 0, 0, 0);
const NET6_C: Ipv6Addr = Ipv6Addr::new(0xfd00, 0x10, 0x244, 2, 0, 0, 0, 0);

/// A VXLAN datagram over IPv6 to the uplink whose every field the input picks.
fn datagram6(r: &[u8]) -> Vec<u8> {
    let g = |i: usize| r.get(i).copied().unwrap_or(0);
    let vtep = default_mac(NET6_A);
    let body = r.get(16..).unwrap_or(&[]);
    let mut inner = Vec::new();
    let dst = if g(0) & 1 == 0 {
        vtep.0
    } else {
        [g(1), 2, 3, 4, 5, 6]
    };
    let src = default_mac(NET6_C).0;
    if g(0) & 2 == 0 {
        let mut to = NET6_A.octets();
        to[15] = g(3);
        let mut from = NET6_C.octets();
        from[15] = g(2);
        let b = etherparse::PacketBuilder::ethernet2(src, dst).ipv6(from, to, g(4) % 4 + 1);
        let _ = b.udp(1, 2).write(&mut inner, body);
    } else {
        inner.extend_from_slice(&dst);
        inner.extend_from_slice(body);
    }
    let vx: [u8; 8] = if g(5) & 3 != 0 {
        [0x08, 0, 0, 0, 0, 0, 1, 0]
    } else {
        [g(6), g(7), g(8), g(9), g(10), g(11), g(12), g(13)]
    };
    let mut payload = vx.to_vec();
    payload.extend_from_slice(&inner);
    let mut from = NODE6_C.octets();
    if g(14) & 1 != 0 {
        from[15] = g(15);
    }
    let dport = if g(14) & 2 == 0 { 8472 } else { 4789 };
    let mut f = Vec::new();
    let _ = etherparse::PacketBuilder::ethernet2([2, 0xaa, 0, 0, 0, 3], UP.0)
        .ipv6(from, NODE6_A.octets(), 64)
        .udp(40000, dport)
        .write(&mut f, &payload);
    // Lie in the UDP length or checksum (zero: refused over IPv6).
    lie_in_udp(&mut f, 14 + 40, g(14) >> 2 & 3, [g(6), g(7), g(8), g(9)]);
    f
}

/// Lies in the UDP header at `udp` as `how` says: 1 its length, 2 its checksum (both from
/// `bytes`), 3 a zero checksum; 0 no lie.
fn lie_in_udp(f: &mut [u8], udp: usize, how: u8, bytes: [u8; 4]) {
    let Some(h) = f.get_mut(udp + 4..udp + 8) else {
        return;
    };
    match how {
        1 => h[..2].copy_from_slice(&bytes[..2]),
        2 => h[2..].copy_from_slice(&bytes[2..]),
        3 => h[2..].fill(0),
        _ => {}
    }
}

/// A pod's IPv6 packet to the peer's pods (encapsulated over IPv6) or elsewhere.
fn pod_packet6(r: &[u8]) -> Vec<u8> {
    let g = |i: usize| r.get(i).copied().unwrap_or(0);
    let mut f = Vec::new();
    let len = usize::from(g(1)) * 8;
    let mut src = NET6_A.octets();
    src[15] = 2;
    let mut dst = if g(2) & 1 == 0 {
        NET6_C.octets()
    } else {
        NET6_A.octets()
    };
    dst[15] = g(3);
    let _ = etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 1, 2], GW.0)
        .ipv6(src, dst, g(4) % 3 + 1)
        .tcp(40000, 80, 1, 1000)
        .write(&mut f, &vec![g(5); len]);
    f
}

/// A VXLAN datagram to the uplink whose every field the input picks.
fn datagram(r: &[u8]) -> Vec<u8> {
    let g = |i: usize| r.get(i).copied().unwrap_or(0);
    let vtep = default_mac(Ipv4Addr::new(10, 244, 1, 0));
    // The inner frame: to this VTEP or not, IPv4 built or raw.
    let body = r.get(16..).unwrap_or(&[]);
    let mut inner = Vec::new();
    let dst = if g(0) & 1 == 0 {
        vtep.0
    } else {
        [g(1), 2, 3, 4, 5, 6]
    };
    let src = [0x0a, 0x58, 10, 244, 2, 0];
    if g(0) & 2 == 0 {
        let b = etherparse::PacketBuilder::ethernet2(src, dst).ipv4(
            [10, 244, 2, g(2)],
            [10, 244, 1, g(3)],
            g(4) % 4 + 1,
        );
        let _ = b.udp(1, 2).write(&mut inner, body);
    } else {
        inner.extend_from_slice(&dst);
        inner.extend_from_slice(body);
    }
    let vx: [u8; 8] = if g(5) & 3 != 0 {
        [0x08, 0, 0, 0, 0, 0, 1, 0]
    } else {
        [g(6), g(7), g(8), g(9), g(10), g(11), g(12), g(13)]
    };
    let mut payload = vx.to_vec();
    payload.extend_from_slice(&inner);
    let from = if g(14) & 1 == 0 {
        [172, 18, 0, 3]
    } else {
        [172, 18, 0, g(15)]
    };
    let dport = if g(14) & 2 == 0 { 8472 } else { 4789 };
    let mut f = Vec::new();
    let _ = etherparse::PacketBuilder::ethernet2([2, 0xaa, 0, 0, 0, 3], UP.0)
        .ipv4(from, [172, 18, 0, 2], 64)
        .udp(40000, dport)
        .write(&mut f, &payload);
    // Lie in the UDP length or checksum.
    lie_in_udp(&mut f, 14 + 20, g(14) >> 2 & 3, [g(6), g(7), g(8), g(9)]);
    f
}

/// A pod's packet to the peer's pods (encapsulated) or elsewhere.
fn pod_packet(r: &[u8]) -> Vec<u8> {
    let g = |i: usize| r.get(i).copied().unwrap_or(0);
    let mut f = Vec::new();
    let len = usize::from(g(1)) * 8;
    let _ = etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 1, 2], GW.0)
        .ipv4([10, 244, 1, 2], [10, 244, g(2) % 3 + 1, g(3)], g(4) % 3 + 1)
        .tcp(40000, 80, 1, 1000)
        .write(&mut f, &vec![g(5); len]);
    f
}

fuzz_target!(|data: &[u8]| {
    let mut b = Datapath::builder();
    let br = b.add_bridge(BridgeConfig::new("cni0")).unwrap();
    b.add_port("pod0", Some(br)).unwrap();
    let mut cni0 = IfaceConfig::new("cni0", GW, Ipv4Addr::new(10, 244, 1, 1), 24);
    cni0.addr6 = Some((Ipv6Addr::new(0xfd00, 0x10, 0x244, 1, 0, 0, 0, 1), 64));
    b.add_router_iface(cni0, Some(br)).unwrap();
    let mut up = IfaceConfig::new("eth0", UP, Ipv4Addr::new(172, 18, 0, 2), 24);
    up.addr6 = Some((NODE6_A, 64));
    let (eth0, _) = b.add_router_iface(up, None).unwrap();
    b.add_vxlan(VxlanConfig::new(
        "flannel.1",
        1,
        8472,
        "eth0",
        Ipv4Addr::new(10, 244, 1, 0),
    ))
    .unwrap();
    b.add_vxlan(VxlanConfig::new("flannel-v6.1", 1, 8472, "eth0", NET6_A))
        .unwrap();
    let dp = b.build();
    let now = Instant::from_secs(1);
    dp.control()
        .add_vxlan_peer(
            "flannel.1",
            VxlanPeer::new(
                Ipv4Addr::new(172, 18, 0, 3),
                default_mac(Ipv4Addr::new(10, 244, 2, 0)),
                Ipv4Addr::new(10, 244, 2, 0),
                24,
            ),
            now,
        )
        .unwrap();
    dp.control()
        .add_vxlan_peer(
            "flannel-v6.1",
            VxlanPeer::new(NODE6_C, default_mac(NET6_C), NET6_C, 64),
            now,
        )
        .unwrap();
    dp.control()
        .add_static_neigh(eth0, NODE6_C, MacAddr([2, 0xaa, 0, 0, 0, 3]), now)
        .unwrap();
    dp.control()
        .add_static_neigh(
            eth0,
            Ipv4Addr::new(172, 18, 0, 3),
            MacAddr([2, 0xaa, 0, 0, 0, 3]),
            now,
        )
        .unwrap();
    let mut w = dp.worker();
    let mut batch = Batch::new();
    let mut rest = data;
    let mut received = 0u64;
    let mut scratch = vec![0u8; 70_000];
    while rest.len() >= 13 {
        let kind = rest[0];
        let vnet = VirtioNetHdr::parse(&rest[1..11]).unwrap_or_default();
        let len = usize::from(u16::from_be_bytes([rest[11], rest[12]]) % 4096);
        rest = &rest[13..];
        let len = len.min(rest.len());
        let raw = &rest[..len];
        rest = &rest[len..];
        let (port, frame) = match kind % 5 {
            0 => (ETH0, raw.to_vec()),
            1 => (ETH0, datagram(raw)),
            2 => (POD, pod_packet(raw)),
            3 => (ETH0, datagram6(raw)),
            _ => (POD, pod_packet6(raw)),
        };
        let mut pb = PacketBuf::new(frame.len().max(64) + 256);
        pb.room_mut()[..frame.len()].copy_from_slice(&frame);
        pb.set_len(frame.len());
        pb.port = port;
        if kind & 0x80 != 0 {
            pb.offload = vnet;
        }
        let _ = batch.push(pb);
        received += 1;
        if batch.is_full() || rest.len() < 13 {
            dp.process(&mut w, now, &mut batch);
            for (buf, v) in batch.bufs().iter().zip(batch.verdicts()) {
                if let Verdict::Output(p) = v {
                    assert_ne!(*p, VX_PORT, "sent to the VXLAN interface's own port");
                    assert_ne!(*p, VX6_PORT, "sent to the IPv6 VXLAN interface's own port");
                    let f = buf.frame();
                    if *p == ETH0 && f.len() >= 34 && f[12..14] == [8, 0] {
                        let hl = usize::from(f[14] & 15) * 4;
                        assert!(checksum_ok(&f[14..14 + hl]), "bad outer header checksum");
                    }
                }
                if !buf.offload.is_none() {
                    let _ = tapyard::offload::segment(
                        buf.frame(),
                        &buf.offload,
                        &mut scratch,
                        &mut |_| {},
                    );
                }
            }
            dp.dispatch(&mut w, &batch, |p, _| {
                assert_ne!(p, VX_PORT);
                assert_ne!(p, VX6_PORT);
                Ok(())
            });
            batch.recycle(&mut w.pool);
        }
    }
    let s = dp.control().stats();
    assert_eq!(s.accounted(), received, "{s}");
});
