//! VXLAN without root: two nodes (A: pods on 10.244.1.0/24, C: pods on 10.244.2.0/24), each
//! a datapath with a bridge `cni0`, an uplink `eth0` and a VXLAN interface `flannel.1` set up
//! as Flannel does. Frames built byte by byte go in; what leaves A's uplink is checked as
//! Linux's vxlan would send it, then fed to C, whose pod must get the inner packet. Every
//! bad input is dropped under its own reason. One root test (skipped otherwise) sends a VXLAN
//! super-frame through real TAPs with UDP-tunnel GSO.

use crate::common;

use std::net::Ipv4Addr;

use etherparse::{Icmpv4Type, NetSlice, PacketBuilder, SlicedPacket, TransportSlice};
use tapyard::l3::vxlan::default_mac;
use tapyard::l3::{IfaceConfig, VxlanConfig, VxlanPeer};
use tapyard::offload::VirtioNetHdr;
use tapyard::port::{Port, TapPort};
use tapyard::wire::virtio::{VIRTIO_NET_HDR_F_UDP_TUNNEL_CSUM, VIRTIO_NET_HDR_GSO_UDP_TUNNEL_IPV4};
use tapyard::{
    Batch, BridgeConfig, BufPool, Datapath, DropReason, Instant, MacAddr, PacketBuf, PortId,
    Verdict, Worker,
};

const POD: PortId = PortId(0);
const ETH0: PortId = PortId(2);

struct Node {
    dp: Datapath,
    w: Worker,
    gw_mac: MacAddr,
    up_mac: MacAddr,
    now: Instant,
}

/// Node `n` (1 = A, 2 = C): pods 10.244.n.0/24 behind gateway .1, uplink 172.18.0.(n+1),
/// VTEP 10.244.n.0/32 with MAC 0a:58:0a:f4:0n:00, a peer for the other node.
fn node(n: u8) -> Node {
    let other = 3 - n;
    let gw_mac = MacAddr([2, 0xaa, n, 0, 0, 1]);
    let up_mac = MacAddr([2, 0xaa, n, 0, 0, 2]);
    let mut b = Datapath::builder();
    let br = b.add_bridge(BridgeConfig::new("cni0")).unwrap();
    assert_eq!(b.add_port("pod", Some(br)).unwrap(), POD);
    b.add_router_iface(
        IfaceConfig::new("cni0", gw_mac, Ipv4Addr::new(10, 244, n, 1), 24),
        Some(br),
    )
    .unwrap();
    let (_, eth0) = b
        .add_router_iface(
            IfaceConfig::new("eth0", up_mac, Ipv4Addr::new(172, 18, 0, n + 1), 24),
            None,
        )
        .unwrap();
    assert_eq!(eth0, ETH0);
    let mut bad = VxlanConfig::new(
        "flannel.1",
        1 << 24,
        8472,
        "eth0",
        Ipv4Addr::new(10, 244, n, 0),
    );
    assert!(b
        .add_vxlan(bad.clone())
        .unwrap_err()
        .to_string()
        .contains("vni = 16777216"));
    bad.vni = 1;
    bad.uplink = "eth9".into();
    assert!(b
        .add_vxlan(bad.clone())
        .unwrap_err()
        .to_string()
        .contains("uplink = eth9"));
    bad.uplink = "eth0".into();
    bad.mtu = Some(1451);
    assert!(b
        .add_vxlan(bad)
        .unwrap_err()
        .to_string()
        .contains("mtu = 1451"));
    b.add_vxlan(VxlanConfig::new(
        "flannel.1",
        1,
        8472,
        "eth0",
        Ipv4Addr::new(10, 244, n, 0),
    ))
    .unwrap();
    let dp = b.build();
    let now = Instant::from_secs(1);
    dp.control()
        .add_vxlan_peer("flannel.1", peer(other), now)
        .unwrap();
    // The other node's uplink MAC is known (as after ARP).
    let eth0_if = dp.control().iface_by_name("eth0").unwrap();
    dp.control()
        .add_static_neigh(
            eth0_if,
            node_ip(other),
            MacAddr([2, 0xaa, other, 0, 0, 2]),
            now,
        )
        .unwrap();
    let pod_mac = MacAddr([2, 0, n, 0, 0, 2]);
    dp.control()
        .add_static_neigh(
            dp.control().iface_by_name("cni0").unwrap(),
            Ipv4Addr::new(10, 244, n, 2),
            pod_mac,
            now,
        )
        .unwrap();
    let w = dp.worker();
    Node {
        dp,
        w,
        gw_mac,
        up_mac,
        now,
    }
}

fn node_ip(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(172, 18, 0, n + 1)
}

fn peer(n: u8) -> VxlanPeer {
    VxlanPeer {
        node_ip: node_ip(n).into(),
        vtep_mac: default_mac(Ipv4Addr::new(10, 244, n, 0)),
        pod_cidr: Ipv4Addr::new(10, 244, n, 0).into(),
        pod_prefix_len: 24,
    }
}

impl Node {
    /// Runs one frame received on `port`; returns (verdict, every frame sent with its port).
    fn run(&mut self, port: PortId, frame: &[u8]) -> (Verdict, Vec<(PortId, Vec<u8>)>) {
        self.run_buf({
            let mut b = PacketBuf::from_frame(frame);
            b.port = port;
            b
        })
    }

    fn run_buf(&mut self, buf: PacketBuf) -> (Verdict, Vec<(PortId, Vec<u8>)>) {
        let mut batch = Batch::new();
        batch.push(buf).unwrap();
        self.dp.process(&mut self.w, self.now, &mut batch);
        let v = batch.verdicts()[0];
        let mut out = Vec::new();
        self.dp.dispatch(&mut self.w, &batch, |p, b| {
            // What a port without offloads would put on the wire.
            let mut frames = Vec::new();
            if b.offload.is_none() {
                frames.push(b.frame().to_vec());
            } else {
                let mut scratch = vec![0u8; 70_000];
                tapyard::offload::segment(b.frame(), &b.offload, &mut scratch, &mut |f| {
                    frames.push(f.to_vec())
                })
                .unwrap();
            }
            out.extend(frames.into_iter().map(|f| (p, f)));
            Ok(())
        });
        (v, out)
    }

    /// Like [`Node::run_buf`], but every frame as the datapath hands it to a port, with its
    /// offload header (super-frames whole).
    fn run_whole(&mut self, buf: PacketBuf) -> (Verdict, Vec<(PortId, PacketBuf)>) {
        let mut batch = Batch::new();
        batch.push(buf).unwrap();
        self.dp.process(&mut self.w, self.now, &mut batch);
        let v = batch.verdicts()[0];
        let mut out = Vec::new();
        self.dp.dispatch(&mut self.w, &batch, |p, b| {
            let c = common::copy_buf(b);
            out.push((p, c));
            Ok(())
        });
        (v, out)
    }

    fn drops(&self, r: DropReason) -> u64 {
        self.dp.control().stats().drop_count(r)
    }
}

/// A pod's UDP datagram to `dst` (through its gateway), `payload` bytes, DF set.
fn pod_udp(n: u8, gw: MacAddr, dst: [u8; 4], payload: usize) -> Vec<u8> {
    let mut f = Vec::new();
    PacketBuilder::ethernet2([2, 0, n, 0, 0, 2], gw.0)
        .ipv4([10, 244, n, 2], dst, 64)
        .udp(40000, 5201)
        .write(&mut f, &vec![0x5a; payload])
        .unwrap();
    f
}

#[test]
fn a_pod_reaches_a_remote_pod_through_the_overlay() {
    let (mut a, mut c) = (node(1), node(2));
    let inner = pod_udp(1, a.gw_mac, [10, 244, 2, 2], 100);
    let (v, out) = a.run(POD, &inner);
    assert_eq!(v, Verdict::Output(ETH0));
    assert_eq!(out.len(), 1);
    let (port, wire) = &out[0];
    assert_eq!(*port, ETH0);
    // What Linux's vxlan sends: outer MACs of the uplinks, 172.18.0.2 -> .3, UDP to 8472
    // from a port in 32768..=60999 with a checksum, VXLAN I flag and VNI 1, inner frame from
    // A's VTEP to C's.
    let s = SlicedPacket::from_ethernet(wire).unwrap();
    let Some(etherparse::LinkSlice::Ethernet2(e)) = s.link else {
        panic!()
    };
    assert_eq!((e.source(), e.destination()), (a.up_mac.0, c.up_mac.0));
    let Some(NetSlice::Ipv4(ip)) = s.net else {
        panic!()
    };
    assert_eq!(ip.header().source_addr(), node_ip(1));
    assert_eq!(ip.header().destination_addr(), node_ip(2));
    assert!(!ip.header().dont_fragment());
    let Some(TransportSlice::Udp(u)) = s.transport else {
        panic!()
    };
    assert_eq!(u.destination_port(), 8472);
    assert!((32768..=60999).contains(&u.source_port()));
    assert_ne!(u.checksum(), 0);
    assert_eq!(
        u.to_header()
            .calc_checksum_ipv4(&ip.header().to_header(), u.payload())
            .unwrap(),
        u.checksum()
    );
    let vx = &u.payload()[..8];
    assert_eq!(vx, &[0x08, 0, 0, 0, 0, 0, 1, 0]);
    let inner_out = &u.payload()[8..];
    assert_eq!(
        &inner_out[..6],
        &default_mac(Ipv4Addr::new(10, 244, 2, 0)).0
    );
    assert_eq!(
        &inner_out[6..12],
        &default_mac(Ipv4Addr::new(10, 244, 1, 0)).0
    );
    // The same flow keeps its source port.
    let (_, again) = a.run(POD, &inner);
    assert_eq!(again[0].1[34..36], wire[34..36]);

    // Node C decapsulates and routes to its pod, TTL 64 - 2.
    let (v, out) = c.run(ETH0, wire);
    // The pod's MAC was never learned on C's bridge: flooded to its only port.
    assert!(
        matches!(v, Verdict::Output(POD) | Verdict::Flood(_)),
        "{v:?}"
    );
    assert_eq!(out[0].0, POD);
    let s = SlicedPacket::from_ethernet(&out[0].1).unwrap();
    let Some(NetSlice::Ipv4(ip)) = s.net else {
        panic!()
    };
    assert_eq!(ip.header().destination_addr(), Ipv4Addr::new(10, 244, 2, 2));
    assert_eq!(ip.header().ttl(), 62);
    let st = c.dp.control().tunnel_by_name("flannel.1").unwrap().peers();
    let p = st.by_ip(node_ip(1)).unwrap().stats();
    assert_eq!((p.rx_packets, p.rx_bytes), (1, inner_out.len() as u64));
    let st = a.dp.control().tunnel_by_name("flannel.1").unwrap().peers();
    assert_eq!(st.by_ip(node_ip(2)).unwrap().stats().tx_packets, 2);

    // The tables show what the peer implies, as ip route / ip neigh / bridge fdb do.
    let mut t = String::new();
    a.dp.control().fmt_routes(&mut t).unwrap();
    assert!(
        t.contains("10.244.2.0/24 via 10.244.2.0 dev flannel.1 onlink"),
        "{t}"
    );
    t.clear();
    a.dp.control().fmt_neigh(a.now, &mut t).unwrap();
    assert!(
        t.contains("10.244.2.0 dev flannel.1 lladdr 0a:58:0a:f4:02:00 PERMANENT"),
        "{t}"
    );
    t.clear();
    a.dp.control().fmt_vxlan_fdb(&mut t).unwrap();
    assert_eq!(
        t,
        "0a:58:0a:f4:02:00 dev flannel.1 dst 172.18.0.3 self permanent\n"
    );
}

#[test]
fn removing_a_peer_stops_traffic_both_ways_at_once() {
    let (mut a, mut c) = (node(1), node(2));
    let (_, out) = a.run(POD, &pod_udp(1, a.gw_mac, [10, 244, 2, 2], 10));
    let wire = out[0].1.clone();
    c.dp.control()
        .remove_vxlan_peer("flannel.1", node_ip(1))
        .unwrap();
    assert_eq!(
        c.run(ETH0, &wire).0,
        Verdict::Drop(DropReason::VxlanUnknownPeer)
    );
    a.dp.control()
        .remove_vxlan_peer("flannel.1", node_ip(2))
        .unwrap();
    // The route went with the peer: no route (ICMP net unreachable to the pod).
    assert_eq!(
        a.run(POD, &pod_udp(1, a.gw_mac, [10, 244, 2, 2], 10)).0,
        Verdict::Drop(DropReason::NoRoute)
    );
    assert!(a
        .dp
        .control()
        .remove_vxlan_peer("flannel.1", node_ip(2))
        .is_err());
    // And back.
    a.dp.control()
        .add_vxlan_peer("flannel.1", peer(2), a.now)
        .unwrap();
    assert_eq!(
        a.run(POD, &pod_udp(1, a.gw_mac, [10, 244, 2, 2], 10)).0,
        Verdict::Output(ETH0)
    );
}

#[test]
fn pmtu_across_the_overlay() {
    let mut a = node(1);
    // 1422 bytes of ICMP payload: 1450-byte packets pass; 1423 gets frag needed, MTU 1450.
    let gw = a.gw_mac;
    let ping = |size: usize| {
        let mut f = Vec::new();
        PacketBuilder::ethernet2([2, 0, 1, 0, 0, 2], gw.0)
            .ipv4([10, 244, 1, 2], [10, 244, 2, 2], 64)
            .icmpv4_echo_request(1, 1)
            .write(&mut f, &vec![0u8; size])
            .unwrap();
        // etherparse sets DF by default.
        f
    };
    let (v, out) = a.run(POD, &ping(1422));
    assert_eq!(v, Verdict::Output(ETH0));
    assert_eq!(out[0].1.len(), 14 + 1450 + 50);
    let (v, out) = a.run(POD, &ping(1423));
    assert_eq!(v, Verdict::Drop(DropReason::FragNeeded));
    let s = SlicedPacket::from_ethernet(&out[0].1).unwrap();
    let Some(NetSlice::Ipv4(ip)) = s.net else {
        panic!()
    };
    assert_eq!(ip.header().source_addr(), Ipv4Addr::new(10, 244, 1, 1));
    let Some(TransportSlice::Icmpv4(icmp)) = s.transport else {
        panic!()
    };
    let Icmpv4Type::DestinationUnreachable(d) = icmp.icmp_type() else {
        panic!()
    };
    assert_eq!(
        d,
        etherparse::icmpv4::DestUnreachableHeader::FragmentationNeeded { next_hop_mtu: 1450 }
    );
}

/// `n` bytes of payload: byte `k` is `k % 251`.
fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|k| u8::try_from(k % 251).unwrap()).collect()
}

/// A TSO super-frame from pod A's offload TAP: `payload` bytes of TCP payload (byte `k` is
/// `k % 251`), MSS 1398 (what a pod learns after PMTU discovery), partial checksum.
fn pod_tso(a: &Node, payload: usize) -> PacketBuf {
    let data: Vec<u8> = pattern(payload);
    let mut f = Vec::new();
    PacketBuilder::ethernet2([2, 0, 1, 0, 0, 2], a.gw_mac.0)
        .ipv4([10, 244, 1, 2], [10, 244, 2, 2], 64)
        .tcp(40000, 5201, 1000, 65535)
        .ack(1)
        .write(&mut f, &data)
        .unwrap();
    let mut b = PacketBuf::new(70_000);
    b.room_mut()[..f.len()].copy_from_slice(&f);
    b.set_len(f.len());
    b.port = POD;
    // Partial checksum: the pseudo-header sum in the field.
    let tcp_len = u32::try_from(f.len() - 34).unwrap();
    let mut s: u32 = 0;
    for w in [[10u8, 244], [1, 2], [10, 244], [2, 2]] {
        s += u32::from(u16::from_be_bytes(w));
    }
    s += 6 + tcp_len;
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    b.frame_mut()[50..52].copy_from_slice(&u16::try_from(s).unwrap().to_be_bytes());
    b.offload = VirtioNetHdr {
        flags: tapyard::offload::VIRTIO_NET_HDR_F_NEEDS_CSUM,
        gso_type: tapyard::offload::VIRTIO_NET_HDR_GSO_TCPV4,
        hdr_len: 54,
        gso_size: 1398,
        csum_start: 34,
        csum_offset: 16,
    };
    b
}

/// The TCP payload of an IPv4 or IPv6 frame whose TCP checksum must be complete and right.
fn tcp_payload_checked(frame: &[u8]) -> Vec<u8> {
    let s = SlicedPacket::from_ethernet(frame).unwrap();
    let Some(TransportSlice::Tcp(t)) = s.transport else {
        panic!("not TCP")
    };
    let want = match s.net {
        Some(NetSlice::Ipv4(ip)) => t
            .to_header()
            .calc_checksum_ipv4(&ip.header().to_header(), t.payload()),
        Some(NetSlice::Ipv6(ip)) => t
            .to_header()
            .calc_checksum_ipv6(&ip.header().to_header(), t.payload()),
        _ => panic!("not IP"),
    };
    assert_eq!(want.unwrap(), t.checksum(), "TCP checksum");
    t.payload().to_vec()
}

/// The segments of a TCP super-frame, as a port without offloads sends them.
fn segments(b: &PacketBuf) -> Vec<Vec<u8>> {
    let mut frames = Vec::new();
    let mut scratch = vec![0u8; 70_000];
    tapyard::offload::segment(b.frame(), &b.offload, &mut scratch, &mut |f| {
        frames.push(f.to_vec())
    })
    .unwrap();
    frames
}

#[test]
fn offloaded_super_frames_are_segmented_to_the_inner_mtu() {
    let (mut a, mut c) = (node(1), node(2));
    let b = pod_tso(&a, 10_000);
    let (v, out) = a.run_buf(b);
    assert_eq!(v, Verdict::Output(ETH0));
    assert_eq!(out.len(), 10_000usize.div_ceil(1398));
    let mut total = 0;
    for (_, seg) in &out {
        assert!(seg.len() <= 14 + 1500, "{}", seg.len());
        let s = SlicedPacket::from_ethernet(seg).unwrap();
        let Some(NetSlice::Ipv4(ip)) = s.net else {
            panic!()
        };
        let Some(TransportSlice::Udp(u)) = s.transport else {
            panic!()
        };
        assert_eq!(
            u.to_header()
                .calc_checksum_ipv4(&ip.header().to_header(), u.payload())
                .unwrap(),
            u.checksum(),
            "outer checksum of every segment"
        );
        // Each one decapsulates on C and reaches its pod with a valid TCP checksum.
        let (v, got) = c.run(ETH0, seg);
        assert!(
            matches!(v, Verdict::Output(POD) | Verdict::Flood(_)),
            "{v:?}"
        );
        assert_eq!(got[0].0, POD);
        let s = SlicedPacket::from_ethernet(&got[0].1).unwrap();
        let Some(NetSlice::Ipv4(ip)) = s.net else {
            panic!()
        };
        let Some(TransportSlice::Tcp(t)) = s.transport else {
            panic!()
        };
        assert_eq!(
            t.to_header()
                .calc_checksum_ipv4(&ip.header().to_header(), t.payload())
                .unwrap(),
            t.checksum()
        );
        total += t.payload().len();
    }
    assert_eq!(total, 10_000);
}

#[test]
fn bad_input_is_dropped_under_its_own_reason() {
    let (mut a, mut c) = (node(1), node(2));
    let (_, out) = a.run(POD, &pod_udp(1, a.gw_mac, [10, 244, 2, 2], 64));
    let good = out[0].1.clone();
    let fix_ip = |f: &mut Vec<u8>| {
        let total = u16::try_from(f.len() - 14).unwrap();
        f[16..18].copy_from_slice(&total.to_be_bytes());
        f[24..26].fill(0);
        let mut s: u32 = 0;
        for i in (14..34).step_by(2) {
            s += u32::from(u16::from_be_bytes([f[i], f[i + 1]]));
        }
        while s > 0xffff {
            s = (s & 0xffff) + (s >> 16);
        }
        f[24..26].copy_from_slice(&(!u16::try_from(s).unwrap()).to_be_bytes());
    };
    let mut cases: Vec<(Vec<u8>, DropReason)> = Vec::new();
    // Zero the outer checksum, so edits below need no checksum fix (zero is accepted).
    let mut base = good.clone();
    base[40..42].fill(0);
    let mut f = base.clone();
    f[42] = 0x0c; // flags other than I
    cases.push((f, DropReason::VxlanBadFlags));
    let mut f = base.clone();
    f[48] = 2; // VNI 2
    cases.push((f, DropReason::VxlanBadVni));
    let mut f = base.clone();
    f[50] ^= 0xff; // inner destination not this VTEP
    cases.push((f, DropReason::VxlanUnknownMac));
    let mut f = good.clone();
    let last = f.len() - 1;
    f[last] ^= 0xff; // payload changed under a checksum
    cases.push((f, DropReason::VxlanBadChecksum));
    let mut f = base.clone();
    f.truncate(14 + 20 + 8 + 4); // short
    f[38..40].copy_from_slice(&12u16.to_be_bytes());
    fix_ip(&mut f);
    cases.push((f, DropReason::VxlanShort));
    let mut f = base.clone();
    f[26..30].copy_from_slice(&[172, 18, 0, 9]); // not a peer
    fix_ip(&mut f);
    cases.push((f, DropReason::VxlanUnknownPeer));
    for (f, r) in cases {
        let before = c.drops(r);
        assert_eq!(c.run(ETH0, &f).0, Verdict::Drop(r));
        assert_eq!(c.drops(r), before + 1, "{r}");
    }
    // Another UDP port on the uplink address is not VXLAN: the router answers it (port
    // unreachable), as before.
    let mut f = base.clone();
    f[36..38].copy_from_slice(&4789u16.to_be_bytes());
    assert_eq!(c.run(ETH0, &f).0, Verdict::Drop(DropReason::LocalNoService));
    // Encapsulation to a MAC that is no peer's.
    let t = a.dp.control().iface_by_name("flannel.1").unwrap();
    a.dp.control()
        .add_static_neigh(
            t,
            Ipv4Addr::new(10, 244, 1, 250),
            MacAddr([2, 9, 9, 9, 9, 9]),
            a.now,
        )
        .unwrap();
    a.dp.control()
        .add_route(tapyard::l3::Route {
            prefix: Ipv4Addr::new(10, 244, 1, 250),
            len: 32,
            next_hop: tapyard::l3::NextHop::Link(t),
            metric: 0,
            proto: tapyard::l3::RouteProto::Static,
            src: None,
        })
        .unwrap();
    assert_eq!(
        a.run(POD, &pod_udp(1, a.gw_mac, [10, 244, 1, 250], 1)).0,
        Verdict::Drop(DropReason::VxlanNoPeer)
    );
    // Peers are checked.
    for (bad, what) in [
        (
            VxlanPeer {
                node_ip: node_ip(1).into(),
                ..peer(3)
            },
            "node_ip = 172.18.0.2",
        ),
        (
            VxlanPeer {
                pod_cidr: Ipv4Addr::new(10, 244, 2, 0).into(),
                ..peer(3)
            },
            "overlaps",
        ),
        (
            VxlanPeer {
                pod_cidr: Ipv4Addr::new(10, 244, 1, 0).into(),
                ..peer(3)
            },
            "overlaps",
        ),
        (
            VxlanPeer {
                vtep_mac: MacAddr::BROADCAST,
                ..peer(3)
            },
            "vtep_mac",
        ),
    ] {
        let e =
            a.dp.control()
                .add_vxlan_peer("flannel.1", bad, a.now)
                .unwrap_err()
                .to_string();
        assert!(e.contains(what), "{e}");
    }
}

/// The folded pseudo-header sum of the outer UDP header of an encapsulated frame (what a
/// partial checksum field holds), big-endian.
fn outer_udp_partial(f: &[u8]) -> [u8; 2] {
    let mut s: u32 = 17 + u32::try_from(f.len() - 34).unwrap();
    for i in (26..34).step_by(2) {
        s += u32::from(u16::from_be_bytes([f[i], f[i + 1]]));
    }
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    u16::try_from(s).unwrap().to_be_bytes()
}

/// Checks a UDP-tunnel super-frame as A sends it to C: one encapsulated TCP super-frame,
/// its inner checksum and the outer UDP one partial.
fn check_tunnel_super_frame(b: &PacketBuf, payload: usize) {
    let off = b.offload;
    assert_eq!(
        off.gso_type,
        tapyard::offload::VIRTIO_NET_HDR_GSO_TCPV4 | VIRTIO_NET_HDR_GSO_UDP_TUNNEL_IPV4
    );
    assert!(off.needs_csum());
    assert_eq!(
        (off.gso_size, off.csum_start, off.csum_offset),
        (1398, 84, 16)
    );
    let f = b.frame();
    assert_eq!(f.len(), 50 + 54 + payload);
    assert_eq!(&f[36..38], &8472u16.to_be_bytes());
    assert_eq!(
        &f[40..42],
        &outer_udp_partial(f),
        "outer UDP checksum partial"
    );
}

/// The inner TCP super-frame C hands its pod after decapsulating a tunnel super-frame.
fn check_inner_super_frame(b: &PacketBuf, payload: usize) {
    assert_eq!(
        b.offload,
        VirtioNetHdr {
            flags: tapyard::offload::VIRTIO_NET_HDR_F_NEEDS_CSUM,
            gso_type: tapyard::offload::VIRTIO_NET_HDR_GSO_TCPV4,
            hdr_len: 54,
            gso_size: 1398,
            csum_start: 34,
            csum_offset: 16,
        }
    );
    assert_eq!(b.len(), 54 + payload);
    let segs = segments(b);
    assert_eq!(segs.len(), payload.div_ceil(1398));
    let got: Vec<u8> = segs.iter().flat_map(|s| tcp_payload_checked(s)).collect();
    let want: Vec<u8> = pattern(payload);
    assert!(got == want, "inner payload");
}

#[test]
fn tunnel_super_frames_cross_whole_both_ways() {
    let (mut a, mut c) = (node(1), node(2));
    // Encapsulation keeps the super-frame whole, outer UDP checksum partial.
    let (v, out) = a.run_whole(pod_tso(&a, 30_000));
    assert_eq!(v, Verdict::Output(ETH0));
    assert_eq!(out.len(), 1);
    let sf = &out[0].1;
    check_tunnel_super_frame(sf, 30_000);
    // What a UDP-tunnel TAP hands over: the same super-frame, outer checksum partial too.
    let received = |edit: &dyn Fn(&mut PacketBuf)| {
        let mut b = common::copy_buf(sf);
        b.offload.flags |= VIRTIO_NET_HDR_F_UDP_TUNNEL_CSUM;
        b.port = ETH0;
        edit(&mut b);
        b
    };
    let (v, got) = c.run_whole(received(&|_| {}));
    assert!(
        matches!(v, Verdict::Output(POD) | Verdict::Flood(_)),
        "{v:?}"
    );
    assert_eq!(got.len(), 1);
    check_inner_super_frame(&got[0].1, 30_000);
    // Segmented in software instead (a port without UDP-tunnel GSO), every segment still
    // reaches C's pod.
    let mut total = 0;
    for seg in segments(sf) {
        let (v, got) = c.run(ETH0, &seg);
        assert!(
            matches!(v, Verdict::Output(POD) | Verdict::Flood(_)),
            "{v:?}"
        );
        total += tcp_payload_checked(&got[0].1).len();
    }
    assert_eq!(total, 30_000);
    // Lying tunnel headers are dropped and counted.
    let lies: [&dyn Fn(&mut PacketBuf); 5] = [
        &|b| b.offload.flags = 0,       // no partial checksum
        &|b| b.offload.csum_start = 20, // inside the outer header
        &|b| b.offload.csum_offset = 6, // not TCP's field
        &|b| b.offload.gso_type = VIRTIO_NET_HDR_GSO_UDP_TUNNEL_IPV4 | 5, // USO inside
        &|b| b.offload.gso_size = 0,
    ];
    for lie in lies {
        let before = c.drops(DropReason::BadOffload);
        assert_eq!(
            c.run_whole(received(lie)).0,
            Verdict::Drop(DropReason::BadOffload)
        );
        assert_eq!(c.drops(DropReason::BadOffload), before + 1);
    }
    // A tunnel super-frame that is not VXLAN for this node (another UDP port).
    let other = received(&|b| b.frame_mut()[36..38].copy_from_slice(&4789u16.to_be_bytes()));
    assert_eq!(c.run_whole(other).0, Verdict::Drop(DropReason::BadOffload));
}

/// Root: a VXLAN super-frame written to a TAP with UDP-tunnel GSO crosses a Linux bridge
/// whole to another such TAP (read back as one tunnel super-frame, which C decapsulates into
/// one inner TCP super-frame) and as correct segments to a plain TAP (the kernel segments it,
/// outer headers replicated and each outer UDP checksum computed).
#[test]
#[cfg_attr(
    not(tapyard_root),
    ignore = "needs root: TAP devices and network namespaces (runs as root, as in CI)"
)]
fn tunnel_super_frame_crosses_real_taps_both_ways() {
    if let Some(why) = common::skip_reason(&[]) {
        common::skip(&why);
        return;
    }
    let (pid, tag) = common::name_tag();
    let name = |i: u8| format!("tyvt{}{i}", pid % 10_000);
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
    let mut g = common::Guard::default();
    let ns = g.ns(&format!("tyvt-{pid}-{tag}"));
    ns.disable_ipv6();
    ns.ip(&["link", "add", "br0", "type", "bridge"]);
    ns.ip(&["link", "set", "br0", "up"]);
    for i in 1..=3 {
        common::run(&["ip", "link", "set", &name(i), "netns", &ns.name]);
        ns.ip(&["link", "set", &name(i), "master", "br0"]);
        ns.ip(&["link", "set", &name(i), "up"]);
    }
    let (mut a, mut c) = (node(1), node(2));
    let (_, out) = a.run_whole(pod_tso(&a, 30_000));
    let sf = &out[0].1;
    check_tunnel_super_frame(sf, 30_000);
    let is_vxlan = |b: &PacketBuf| b.frame().get(36..38) == Some(&8472u16.to_be_bytes()[..]);
    // The bridge has not learned C's MAC: it floods to both other TAPs.
    t1.send(sf).unwrap();
    let mut pool = BufPool::new(t2.frame_room(), 64);
    let mut whole = None;
    assert!(
        common::read_until(&t2, &mut pool, &mut |b| {
            let hit = is_vxlan(b);
            if hit {
                let c = common::copy_buf(b);
                whole = Some(c);
            }
            hit
        }),
        "no super-frame on the UDP-tunnel TAP"
    );
    let mut whole = whole.unwrap();
    check_tunnel_super_frame(&whole, 30_000);
    assert!(
        whole.frame() == sf.frame(),
        "the super-frame crossed unchanged"
    );
    whole.port = ETH0;
    let (v, got) = c.run_whole(whole);
    assert!(
        matches!(v, Verdict::Output(POD) | Verdict::Flood(_)),
        "{v:?}"
    );
    check_inner_super_frame(&got[0].1, 30_000);
    // The plain TAP gets segments: complete, right checksums, each decapsulated by C.
    let mut pool = BufPool::new(t3.frame_room(), 64);
    let (mut payload, mut n) = (Vec::new(), 0);
    let want_segs = 30_000usize.div_ceil(1398);
    assert!(
        common::read_until(&t3, &mut pool, &mut |b| {
            if !is_vxlan(b) {
                return false;
            }
            let f = b.frame();
            assert!(f.len() <= 14 + 1500, "{}", f.len());
            let s = SlicedPacket::from_ethernet(f).unwrap();
            let (Some(NetSlice::Ipv4(ip)), Some(TransportSlice::Udp(u))) = (s.net, s.transport)
            else {
                panic!("not UDP/IPv4")
            };
            let h = ip.header().to_header();
            assert_eq!(
                h.calc_header_checksum(),
                h.header_checksum,
                "outer IPv4 checksum"
            );
            assert_eq!(
                u.to_header().calc_checksum_ipv4(&h, u.payload()).unwrap(),
                u.checksum(),
                "outer UDP checksum of segment {n}"
            );
            let (v, got) = c.run(ETH0, f);
            assert!(
                matches!(v, Verdict::Output(POD) | Verdict::Flood(_)),
                "{v:?}"
            );
            payload.extend(tcp_payload_checked(&got[0].1));
            n += 1;
            n == want_segs
        }),
        "{n} of {want_segs} segments on the plain TAP"
    );
    let want: Vec<u8> = pattern(30_000);
    assert!(payload == want, "segments' payload");
    drop((t1, t2, t3));
}

/// IPv6 pod traffic inside the overlay, over the IPv4 underlay (as flannel's dual-stack
/// VXLAN with an IPv4 underlay): an IPv6 route via the peer's link-local VTEP address on
/// `flannel.1` (`fd00:10:244:2::/64 via fe80::... dev flannel.1`) and its static NDP entry
/// with the peer's VTEP MAC, as `ip -6 route` / `ip -6 neigh` show on a flannel node.
/// Pod `h` of node `n`'s IPv6 pod network (fd00:10:244:n::/64).
fn v6(n: u8, h: u16) -> std::net::Ipv6Addr {
    std::net::Ipv6Addr::new(0xfd00, 0x10, 0x244, u16::from(n), 0, 0, 0, h)
}

/// Nodes A and C as dual-stack Flannel nodes whose IPv6 pods ride the IPv4 underlay
/// (flannel.1): the remote pod /64 via the other VTEP's link-local address, its neighbour
/// permanent, pod 2 of each node a static neighbour.
fn dual_stack_nodes() -> (Node, Node) {
    use tapyard::l3::{NextHop, Route, RouteProto};
    let vtep_ll =
        |n: u8| tapyard::wire::ipv6::link_local_from_mac(default_mac(Ipv4Addr::new(10, 244, n, 0)));
    let (a, c) = (node(1), node(2));
    for (n, node) in [(1u8, &a), (2u8, &c)] {
        let other = 3 - n;
        let dp = &node.dp;
        let flannel = dp.control().iface_by_name("flannel.1").unwrap();
        let cni0 = dp.control().iface_by_name("cni0").unwrap();
        dp.control()
            .add_route(Route {
                prefix: v6(n, 0),
                len: 64,
                next_hop: NextHop::Link(cni0),
                metric: 256,
                proto: RouteProto::Kernel,
                src: None,
            })
            .unwrap();
        dp.control()
            .add_route(Route {
                prefix: v6(other, 0),
                len: 64,
                next_hop: NextHop::Via(flannel, vtep_ll(other)),
                metric: 1024,
                proto: RouteProto::Static,
                src: None,
            })
            .unwrap();
        dp.control()
            .add_static_neigh(
                flannel,
                vtep_ll(other),
                default_mac(Ipv4Addr::new(10, 244, other, 0)),
                node.now,
            )
            .unwrap();
        dp.control()
            .add_static_neigh(cni0, v6(n, 2), MacAddr([2, 0, n, 0, 0, 2]), node.now)
            .unwrap();
    }
    (a, c)
}

#[test]
fn ipv6_pod_traffic_crosses_the_ipv4_underlay() {
    let (mut a, mut c) = dual_stack_nodes();
    let mut inner = Vec::new();
    PacketBuilder::ethernet2([2, 0, 1, 0, 0, 2], a.gw_mac.0)
        .ipv6(v6(1, 2).octets(), v6(2, 2).octets(), 64)
        .udp(40000, 5201)
        .write(&mut inner, &[0x5a; 100])
        .unwrap();
    let (v, out) = a.run(POD, &inner);
    assert_eq!(v, Verdict::Output(ETH0));
    let (port, wire) = &out[0];
    assert_eq!(*port, ETH0);
    // Outer IPv4 + UDP to 8472, VNI 1; inner an IPv6 frame between the VTEPs, hop limit 63.
    let s = SlicedPacket::from_ethernet(wire).unwrap();
    let Some(NetSlice::Ipv4(ip)) = s.net else {
        panic!("outer not IPv4")
    };
    assert_eq!(
        (ip.header().source_addr(), ip.header().destination_addr()),
        (node_ip(1), node_ip(2))
    );
    let Some(TransportSlice::Udp(u)) = s.transport else {
        panic!()
    };
    assert_eq!(u.destination_port(), 8472);
    assert_eq!(
        u.to_header()
            .calc_checksum_ipv4(&ip.header().to_header(), u.payload())
            .unwrap(),
        u.checksum()
    );
    let inner_out = &u.payload()[8..];
    assert_eq!(
        &inner_out[..6],
        &default_mac(Ipv4Addr::new(10, 244, 2, 0)).0
    );
    assert_eq!(&inner_out[12..14], &[0x86, 0xdd]);
    let i = SlicedPacket::from_ethernet(inner_out).unwrap();
    let Some(NetSlice::Ipv6(i6)) = i.net else {
        panic!("inner not IPv6")
    };
    assert_eq!(i6.header().hop_limit(), 63);
    assert_eq!(i6.header().destination_addr(), v6(2, 2));

    // Node C decapsulates and routes to its pod: hop limit 62, UDP checksum still valid.
    let (v, out) = c.run(ETH0, wire);
    assert!(
        matches!(v, Verdict::Output(POD) | Verdict::Flood(_)),
        "{v:?}"
    );
    let (p, f) = &out[0];
    assert_eq!(*p, POD);
    assert_eq!(&f[..6], &[2, 0, 2, 0, 0, 2]);
    let s = SlicedPacket::from_ethernet(f).unwrap();
    let Some(NetSlice::Ipv6(i6)) = s.net else {
        panic!()
    };
    assert_eq!(i6.header().hop_limit(), 62);
    assert_eq!(i6.header().source_addr(), v6(1, 2));
    let Some(TransportSlice::Udp(u)) = s.transport else {
        panic!()
    };
    assert_eq!(
        u.to_header()
            .calc_checksum_ipv6(&i6.header().to_header(), u.payload())
            .unwrap(),
        u.checksum()
    );
    assert_eq!(u.payload(), &[0x5a; 100][..]);
    // Every frame on both nodes accounted.
    for n in [&a, &c] {
        let st = n.dp.control().stats();
        assert_eq!(
            st.accounted(),
            st.ports.iter().map(|p| p.rx_packets).sum::<u64>()
        );
    }
}

#[test]
fn an_ipv6_pods_super_frame_crosses_the_ipv4_underlay_whole_or_as_segments() {
    use tapyard::offload::{VIRTIO_NET_HDR_F_NEEDS_CSUM, VIRTIO_NET_HDR_GSO_TCPV6};
    let (mut a, mut c) = dual_stack_nodes();
    // A TSO super-frame from IPv6 pod A2 to C2: MSS 1378, TCP checksum partial (the
    // pseudo-header sum in the field).
    let payload = 20_000;
    let mut f = Vec::new();
    PacketBuilder::ethernet2([2, 0, 1, 0, 0, 2], a.gw_mac.0)
        .ipv6(v6(1, 2).octets(), v6(2, 2).octets(), 64)
        .tcp(40000, 5201, 1000, 65535)
        .ack(1)
        .write(&mut f, &pattern(payload))
        .unwrap();
    let mut sum = 6 + u32::try_from(f.len() - 54).unwrap();
    for w in f[22..54].chunks(2) {
        sum += u32::from(u16::from_be_bytes([w[0], w[1]]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    f[70..72].copy_from_slice(&u16::try_from(sum).unwrap().to_be_bytes());
    let mut b = PacketBuf::new(70_000);
    b.room_mut()[..f.len()].copy_from_slice(&f);
    b.set_len(f.len());
    b.port = POD;
    b.offload = VirtioNetHdr {
        flags: VIRTIO_NET_HDR_F_NEEDS_CSUM,
        gso_type: VIRTIO_NET_HDR_GSO_TCPV6,
        hdr_len: 74,
        gso_size: 1378,
        csum_start: 54,
        csum_offset: 16,
    };
    let mut lying = PacketBuf::new(70_000);
    lying.room_mut()[..f.len()].copy_from_slice(&f);
    lying.set_len(f.len());
    lying.port = POD;
    lying.offload = VirtioNetHdr {
        csum_start: 34, // not the TCP header of an IPv6 packet
        ..b.offload
    };

    // Encapsulated whole: UDP-tunnel-IPv4 GSO of an inner TCP/IPv6 super-frame, as Linux's
    // vxlan device hands it to a device with tunnel GSO.
    let (v, out) = a.run_whole(b);
    assert_eq!(v, Verdict::Output(ETH0));
    assert_eq!(out.len(), 1);
    let sf = &out[0].1;
    assert_eq!(
        sf.offload,
        VirtioNetHdr {
            flags: VIRTIO_NET_HDR_F_NEEDS_CSUM,
            gso_type: VIRTIO_NET_HDR_GSO_TCPV6 | VIRTIO_NET_HDR_GSO_UDP_TUNNEL_IPV4,
            hdr_len: 74 + 50,
            gso_size: 1378,
            csum_start: 54 + 50,
            csum_offset: 16,
        }
    );
    assert_eq!(sf.len(), 50 + f.len());
    assert_eq!(&sf.frame()[40..42], &outer_udp_partial(sf.frame()));
    let st = a.dp.control().stats();
    assert_eq!((st.generated, st.generated_lost), (0, 0), "{st:?}");

    // Segmented in software (a port without UDP-tunnel GSO): every segment reaches C's pod
    // with its TCP checksum right, the payload whole and in order.
    let segs = segments(sf);
    assert_eq!(segs.len(), payload.div_ceil(1378));
    let mut got = Vec::new();
    for seg in &segs {
        let (v, o) = c.run(ETH0, seg);
        assert!(
            matches!(v, Verdict::Output(POD) | Verdict::Flood(_)),
            "{v:?}"
        );
        got.extend(tcp_payload_checked(&o[0].1));
    }
    assert!(got == pattern(payload), "inner payload");

    // Whole, from a UDP-tunnel TAP on C's side: decapsulated into the inner TCP/IPv6
    // super-frame, which C's pod TAP takes whole.
    let mut rx = common::copy_buf(sf);
    rx.offload.flags |= VIRTIO_NET_HDR_F_UDP_TUNNEL_CSUM;
    rx.port = ETH0;
    let (v, o) = c.run_whole(rx);
    assert!(
        matches!(v, Verdict::Output(POD) | Verdict::Flood(_)),
        "{v:?}"
    );
    let inner = &o[0].1;
    assert_eq!(inner.len(), f.len());
    assert_eq!(
        (
            inner.offload.gso_type,
            inner.offload.csum_start,
            inner.offload.gso_size
        ),
        (VIRTIO_NET_HDR_GSO_TCPV6, 54, 1378)
    );
    let got: Vec<u8> = segments(inner)
        .iter()
        .flat_map(|s| tcp_payload_checked(s))
        .collect();
    assert!(got == pattern(payload), "inner payload after decapsulation");

    // A lying TCP/IPv6 super-frame is refused before it is encapsulated.
    assert_eq!(a.run_whole(lying).0, Verdict::Drop(DropReason::BadOffload));
    assert_eq!(a.drops(DropReason::BadOffload), 1);
}
