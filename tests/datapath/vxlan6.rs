//! VXLAN over an IPv6 underlay without root, as Flannel's dual-stack mode sets a node up: two
//! dual-stack nodes (A: pods 10.244.1.0/24 and fd00:10:244:1::/64; C: .2), each with
//! `flannel.1` over IPv4 and `flannel-v6.1` over IPv6 on one uplink. Frames built byte by
//! byte go in; what leaves A's uplink is checked as Linux's vxlan sends it over IPv6, then fed
//! to C, whose pod must get the inner packet. Bad input is dropped under its own reason. A
//! pod's TSO super-frame leaves the uplink as one UDP-tunnel-IPv6 super-frame (for an offload
//! TAP with UDP-tunnel GSO) or as correct segments (any other port), none lost in the batch.

use crate::common;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use etherparse::{NetSlice, PacketBuilder, SlicedPacket, TransportSlice};
use tapyard::l3::vxlan::{default_mac, PeerError};
use tapyard::l3::{IfaceConfig, VxlanConfig, VxlanPeer};
use tapyard::offload::{
    VirtioNetHdr, VIRTIO_NET_HDR_F_NEEDS_CSUM, VIRTIO_NET_HDR_GSO_TCPV4, VIRTIO_NET_HDR_GSO_TCPV6,
};
use tapyard::port::{Port, TapPort};
use tapyard::wire::virtio::{VIRTIO_NET_HDR_F_UDP_TUNNEL_CSUM, VIRTIO_NET_HDR_GSO_UDP_TUNNEL_IPV6};
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

fn v6(s: &str) -> Ipv6Addr {
    s.parse().unwrap()
}

fn node_ip6(n: u8) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, 0x172, 0x18, 0, 0, 0, 0, u16::from(n) + 1)
}

fn pod_net6(n: u8) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, 0x10, 0x244, u16::from(n), 0, 0, 0, 0)
}

fn pod6(n: u8) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, 0x10, 0x244, u16::from(n), 0, 0, 0, 2)
}

fn peer6(n: u8) -> VxlanPeer {
    VxlanPeer::new(node_ip6(n), default_mac(pod_net6(n)), pod_net6(n), 64)
}

fn peer4(n: u8) -> VxlanPeer {
    VxlanPeer::new(
        Ipv4Addr::new(172, 18, 0, n + 1),
        default_mac(Ipv4Addr::new(10, 244, n, 0)),
        Ipv4Addr::new(10, 244, n, 0),
        24,
    )
}

/// Node `n` (1 = A, 2 = C), dual-stack, both VXLAN interfaces, a peer for the other node on
/// each.
fn node(n: u8) -> Node {
    let other = 3 - n;
    let gw_mac = MacAddr([2, 0xaa, n, 0, 0, 1]);
    let up_mac = MacAddr([2, 0xaa, n, 0, 0, 2]);
    let mut b = Datapath::builder();
    let br = b.add_bridge(BridgeConfig::new("cni0")).unwrap();
    assert_eq!(b.add_port("pod", Some(br)).unwrap(), POD);
    let mut cni0 = IfaceConfig::new("cni0", gw_mac, Ipv4Addr::new(10, 244, n, 1), 24);
    cni0.addr6 = Some((
        Ipv6Addr::new(0xfd00, 0x10, 0x244, u16::from(n), 0, 0, 0, 1),
        64,
    ));
    b.add_router_iface(cni0, Some(br)).unwrap();
    let mut eth0 = IfaceConfig::new("eth0", up_mac, Ipv4Addr::new(172, 18, 0, n + 1), 24);
    eth0.addr6 = Some((node_ip6(n), 64));
    let (_, port) = b.add_router_iface(eth0, None).unwrap();
    assert_eq!(port, ETH0);
    b.add_vxlan(VxlanConfig::new(
        "flannel.1",
        1,
        8472,
        "eth0",
        Ipv4Addr::new(10, 244, n, 0),
    ))
    .unwrap();
    let mut bad = VxlanConfig::new("flannel-v6.1", 1, 8472, "eth0", pod_net6(n));
    bad.mtu = Some(1431);
    let e = b.add_vxlan(bad).unwrap_err().to_string();
    assert!(e.contains("mtu = 1431"), "{e}");
    let cfg = VxlanConfig::new("flannel-v6.1", 1, 8472, "eth0", pod_net6(n));
    assert_eq!(cfg.prefix_len, 128);
    b.add_vxlan(cfg).unwrap();
    let dp = b.build();
    let now = Instant::from_secs(1);
    dp.control()
        .add_vxlan_peer("flannel.1", peer4(other), now)
        .unwrap();
    dp.control()
        .add_vxlan_peer("flannel-v6.1", peer6(other), now)
        .unwrap();
    let eth0 = dp.control().iface_by_name("eth0").unwrap();
    let other_mac = MacAddr([2, 0xaa, other, 0, 0, 2]);
    dp.control()
        .add_static_neigh(eth0, Ipv4Addr::new(172, 18, 0, other + 1), other_mac, now)
        .unwrap();
    dp.control()
        .add_static_neigh(eth0, node_ip6(other), other_mac, now)
        .unwrap();
    let cni0 = dp.control().iface_by_name("cni0").unwrap();
    let pod_mac = MacAddr([2, 0, n, 0, 0, 2]);
    dp.control()
        .add_static_neigh(cni0, Ipv4Addr::new(10, 244, n, 2), pod_mac, now)
        .unwrap();
    dp.control()
        .add_static_neigh(cni0, pod6(n), pod_mac, now)
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

impl Node {
    /// Runs one frame received on `port`; returns (verdict, every frame sent with its port,
    /// as a port without offloads puts them on the wire).
    fn run(&mut self, port: PortId, frame: &[u8]) -> (Verdict, Vec<(PortId, Vec<u8>)>) {
        let mut b = PacketBuf::from_frame(frame);
        b.port = port;
        self.run_buf(b)
    }

    fn run_buf(&mut self, buf: PacketBuf) -> (Verdict, Vec<(PortId, Vec<u8>)>) {
        let mut batch = Batch::new();
        batch.push(buf).unwrap();
        self.dp.process(&mut self.w, self.now, &mut batch);
        let v = batch.verdicts()[0];
        let mut out = Vec::new();
        self.dp.dispatch(&mut self.w, &batch, |p, b| {
            if b.offload.is_none() {
                out.push((p, b.frame().to_vec()));
            } else {
                let mut scratch = vec![0u8; 70_000];
                tapyard::offload::segment(b.frame(), &b.offload, &mut scratch, &mut |f| {
                    out.push((p, f.to_vec()))
                })
                .unwrap();
            }
            Ok(())
        });
        (v, out)
    }

    fn drops(&self, r: DropReason) -> u64 {
        self.dp.control().stats().drop_count(r)
    }
}

/// A pod's UDP datagram over IPv6 to `dst` through its gateway, `payload` bytes.
fn pod_udp6(n: u8, gw: MacAddr, dst: Ipv6Addr, payload: usize) -> Vec<u8> {
    let mut f = Vec::new();
    PacketBuilder::ethernet2([2, 0, n, 0, 0, 2], gw.0)
        .ipv6(pod6(n).octets(), dst.octets(), 64)
        .udp(40000, 5201)
        .write(&mut f, &vec![0x5a; payload])
        .unwrap();
    f
}

/// The outer UDP checksum of a frame encapsulated over IPv6, recomputed.
fn udp6_checksum_ok(wire: &[u8]) -> bool {
    let s = SlicedPacket::from_ethernet(wire).unwrap();
    let (Some(NetSlice::Ipv6(ip)), Some(TransportSlice::Udp(u))) = (s.net, s.transport) else {
        return false;
    };
    u.to_header()
        .calc_checksum_ipv6(&ip.header().to_header(), u.payload())
        .unwrap()
        == u.checksum()
}

#[test]
fn ipv6_pods_cross_an_ipv6_underlay_and_ipv4_still_crosses_ipv4() {
    let (mut a, mut c) = (node(1), node(2));
    let inner = pod_udp6(1, a.gw_mac, pod6(2), 100);
    let (v, out) = a.run(POD, &inner);
    assert_eq!(v, Verdict::Output(ETH0));
    assert_eq!(out.len(), 1);
    let wire = &out[0].1;
    // What Linux's vxlan sends over IPv6: outer MACs of the uplinks, fd00:172:18::2 -> ::3,
    // hop limit 64, traffic class and flow label 0, UDP to 8472 from 32768..=60999 with a
    // computed checksum, VXLAN I flag and VNI 1, inner frame from A's VTEP to C's.
    assert_eq!(wire.len(), 70 + inner.len());
    assert_eq!(&wire[..6], &c.up_mac.0);
    assert_eq!(&wire[6..12], &a.up_mac.0);
    let s = SlicedPacket::from_ethernet(wire).unwrap();
    let Some(NetSlice::Ipv6(ip)) = s.net else {
        panic!("not IPv6: {wire:02x?}")
    };
    let h = ip.header();
    assert_eq!(h.source_addr(), node_ip6(1));
    assert_eq!(h.destination_addr(), node_ip6(2));
    assert_eq!(h.hop_limit(), 64);
    assert_eq!((h.traffic_class(), h.flow_label().value()), (0, 0));
    let Some(TransportSlice::Udp(u)) = s.transport else {
        panic!()
    };
    assert_eq!(u.destination_port(), 8472);
    assert!((32768..=60999).contains(&u.source_port()));
    assert_ne!(u.checksum(), 0);
    assert!(udp6_checksum_ok(wire));
    assert_eq!(&u.payload()[..8], &[0x08, 0, 0, 0, 0, 0, 1, 0]);
    let inner_out = &u.payload()[8..];
    assert_eq!(&inner_out[..6], &default_mac(pod_net6(2)).0);
    assert_eq!(&inner_out[6..12], &default_mac(pod_net6(1)).0);
    assert_eq!(default_mac(pod_net6(2)).to_string(), "0a:58:02:44:00:02");

    // Flows spread over source ports (Linux hashes the inner flow).
    let mut ports = std::collections::BTreeSet::new();
    for sport in 0..64u16 {
        let mut f = inner.clone();
        f[54..56].copy_from_slice(&(1000 + sport).to_be_bytes());
        let (_, o) = a.run(POD, &f);
        ports.insert(u16::from_be_bytes([o[0].1[54], o[0].1[55]]));
    }
    assert!(ports.len() > 40, "source ports: {}", ports.len());

    // C decapsulates and routes to its pod: hop limit 64 - 2.
    let (v, out) = c.run(ETH0, wire);
    assert!(
        matches!(v, Verdict::Output(POD) | Verdict::Flood(_)),
        "{v:?}"
    );
    let s = SlicedPacket::from_ethernet(&out[0].1).unwrap();
    let Some(NetSlice::Ipv6(ip)) = s.net else {
        panic!()
    };
    assert_eq!(ip.header().destination_addr(), pod6(2));
    assert_eq!(ip.header().hop_limit(), 62);
    let t = c.dp.control().tunnel_by_name("flannel-v6.1").unwrap();
    assert!(t.is_v6());
    assert_eq!(t.mtu(), 1430);
    assert_eq!(t.local(), IpAddr::V6(node_ip6(2)));
    let p = t.peers().by_ip(node_ip6(1)).unwrap().stats();
    assert_eq!((p.rx_packets, p.rx_bytes), (1, inner_out.len() as u64));
    let t = a.dp.control().tunnel_by_name("flannel-v6.1").unwrap();
    assert_eq!(t.peers().by_ip(node_ip6(2)).unwrap().stats().tx_packets, 65);

    // IPv4 on the same nodes still rides flannel.1 over the IPv4 underlay.
    let mut f4 = Vec::new();
    PacketBuilder::ethernet2([2, 0, 1, 0, 0, 2], a.gw_mac.0)
        .ipv4([10, 244, 1, 2], [10, 244, 2, 2], 64)
        .udp(40000, 5201)
        .write(&mut f4, &[1; 20])
        .unwrap();
    let (v, out) = a.run(POD, &f4);
    assert_eq!(v, Verdict::Output(ETH0));
    assert_eq!(&out[0].1[12..14], &[0x08, 0x00], "outer IPv4");
    assert_eq!(out[0].1.len(), 50 + f4.len());
    let (v, _) = c.run(ETH0, &out[0].1);
    assert!(matches!(v, Verdict::Output(POD) | Verdict::Flood(_)));

    // The tables show what the peers imply, as ip -6 route / ip -6 neigh / bridge fdb do.
    let mut s = String::new();
    a.dp.control().fmt_routes(&mut s).unwrap();
    assert!(
        s.contains(
            "fd00:10:244:2::/64 via fd00:10:244:2:: dev flannel-v6.1 proto static metric 0 onlink"
        ),
        "{s}"
    );
    assert!(s.contains("10.244.2.0/24 via 10.244.2.0 dev flannel.1 onlink"));
    s.clear();
    a.dp.control().fmt_neigh(a.now, &mut s).unwrap();
    assert!(
        s.contains("fd00:10:244:2:: dev flannel-v6.1 lladdr 0a:58:02:44:00:02 PERMANENT"),
        "{s}"
    );
    s.clear();
    a.dp.control().fmt_vxlan_fdb(&mut s).unwrap();
    assert_eq!(
        s,
        "0a:58:0a:f4:02:00 dev flannel.1 dst 172.18.0.3 self permanent\n\
         0a:58:02:44:00:02 dev flannel-v6.1 dst fd00:172:18::3 self permanent\n"
    );
    let st = c.dp.control().stats();
    assert_eq!(st.accounted(), 2, "{st:?}");
}

#[test]
fn ipv6_underlay_drops_by_reason() {
    let (mut a, mut c) = (node(1), node(2));
    let (_, out) = a.run(POD, &pod_udp6(1, a.gw_mac, pod6(2), 100));
    let good = out[0].1.clone();
    // UDP checksum at 14 + 40 + 6.
    let mut zero = good.clone();
    zero[60..62].fill(0);
    assert_eq!(
        c.run(ETH0, &zero).0,
        Verdict::Drop(DropReason::VxlanZeroChecksum)
    );
    let mut bad = good.clone();
    bad[60] ^= 0x40;
    assert_eq!(
        c.run(ETH0, &bad).0,
        Verdict::Drop(DropReason::VxlanBadChecksum)
    );
    let mut vni = good.clone();
    vni[14 + 40 + 8 + 6] = 2;
    assert_eq!(c.run(ETH0, &vni).0, Verdict::Drop(DropReason::VxlanBadVni));
    let mut stranger = good.clone();
    stranger[14 + 8 + 15] = 9;
    assert_eq!(
        c.run(ETH0, &stranger).0,
        Verdict::Drop(DropReason::VxlanUnknownPeer)
    );
    // A UDP length that lies (shorter than the payload).
    let mut short = good.clone();
    short[58..60].copy_from_slice(&20u16.to_be_bytes());
    assert_eq!(c.run(ETH0, &short).0, Verdict::Drop(DropReason::VxlanShort));
    // Not for this VTEP's MAC (recomputing nothing: the checksum fails first, so the
    // inner MAC is changed and the checksum fixed by hand).
    let mut mac = good.clone();
    mac[70] ^= 1;
    mac[60..62].fill(0);
    let sum = {
        let dgram = &mac[54..];
        let mut s: u32 = 0;
        for w in mac[22..54].chunks(2).chain(dgram.chunks(2)) {
            s += u32::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)]));
        }
        s += 17 + u32::try_from(dgram.len()).unwrap();
        while s > 0xffff {
            s = (s & 0xffff) + (s >> 16);
        }
        !u16::try_from(s).unwrap()
    };
    mac[60..62].copy_from_slice(&sum.to_be_bytes());
    assert!(udp6_checksum_ok(&mac));
    assert_eq!(
        c.run(ETH0, &mac).0,
        Verdict::Drop(DropReason::VxlanUnknownMac)
    );
    for r in [
        DropReason::VxlanZeroChecksum,
        DropReason::VxlanBadChecksum,
        DropReason::VxlanBadVni,
        DropReason::VxlanUnknownPeer,
        DropReason::VxlanShort,
        DropReason::VxlanUnknownMac,
    ] {
        assert_eq!(c.drops(r), 1, "{r:?}");
    }
    assert_eq!(DropReason::VxlanZeroChecksum.name(), "vxlan_zero_checksum");
    // The good one still passes.
    assert!(matches!(
        c.run(ETH0, &good).0,
        Verdict::Output(POD) | Verdict::Flood(_)
    ));
    // A peer removed stops its traffic at once.
    c.dp.control()
        .remove_vxlan_peer("flannel-v6.1", node_ip6(1))
        .unwrap();
    assert_eq!(
        c.run(ETH0, &good).0,
        Verdict::Drop(DropReason::VxlanUnknownPeer)
    );
    let st = c.dp.control().stats();
    assert_eq!(st.accounted(), 8, "{st:?}");
}

#[test]
fn peers_and_interfaces_are_family_checked() {
    let a = node(1);
    let e =
        a.dp.control()
            .add_vxlan_peer("flannel-v6.1", peer4(3), a.now)
            .unwrap_err();
    assert!(matches!(e, PeerError::WrongFamily("node_ip", _)), "{e}");
    let e =
        a.dp.control()
            .add_vxlan_peer("flannel.1", peer6(3), a.now)
            .unwrap_err();
    assert!(matches!(e, PeerError::WrongFamily("node_ip", _)), "{e}");
    let mut mixed = peer6(3);
    mixed.pod_cidr = Ipv4Addr::new(10, 244, 3, 0).into();
    mixed.pod_prefix_len = 24;
    let e =
        a.dp.control()
            .add_vxlan_peer("flannel-v6.1", mixed, a.now)
            .unwrap_err();
    assert!(matches!(e, PeerError::WrongFamily("pod_cidr", _)), "{e}");
    let mut own = peer6(3);
    own.node_ip = node_ip6(1).into();
    assert!(matches!(
        a.dp.control().add_vxlan_peer("flannel-v6.1", own, a.now),
        Err(PeerError::BadNodeIp(_))
    ));
    // An uplink without an IPv6 address cannot carry an IPv6 underlay.
    let mut b = Datapath::builder();
    b.add_router_iface(
        IfaceConfig::new(
            "eth0",
            MacAddr([2, 0, 0, 0, 0, 9]),
            Ipv4Addr::new(172, 18, 0, 9),
            24,
        ),
        None,
    )
    .unwrap();
    let e = b
        .add_vxlan(VxlanConfig::new(
            "flannel-v6.1",
            1,
            8472,
            "eth0",
            pod_net6(1),
        ))
        .unwrap_err()
        .to_string();
    assert!(e.contains("IPv6 address"), "{e}");
    let _ = v6("::1");
}

#[test]
fn packet_too_big_across_the_ipv6_overlay() {
    let mut a = node(1);
    // MTU 1430: a 1430-byte IPv6 packet passes (1500 on the wire), 1431 gets packet too big.
    let ok = pod_udp6(1, a.gw_mac, pod6(2), 1430 - 48);
    let (v, out) = a.run(POD, &ok);
    assert_eq!(v, Verdict::Output(ETH0));
    assert_eq!(out[0].1.len(), 14 + 1500);
    let big = pod_udp6(1, a.gw_mac, pod6(2), 1431 - 48);
    let (v, out) = a.run(POD, &big);
    assert!(matches!(v, Verdict::Drop(_)), "{v:?}");
    let s = SlicedPacket::from_ethernet(&out[0].1).unwrap();
    let Some(TransportSlice::Icmpv6(icmp)) = s.transport else {
        panic!("no ICMPv6: {out:?}")
    };
    assert_eq!(
        icmp.icmp_type(),
        etherparse::Icmpv6Type::PacketTooBig { mtu: 1430 }
    );
}

/// Bytes of TCP payload: byte `k` is `k % 251`.
fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|k| u8::try_from(k % 251).unwrap()).collect()
}

/// The folded sum of 16-bit big-endian words (a pseudo-header's, unfinished).
fn fold(words: impl IntoIterator<Item = u32>) -> u16 {
    let mut s: u32 = words.into_iter().sum();
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    u16::try_from(s).unwrap()
}

/// The words of two IPv6 addresses.
fn addr_words(a: Ipv6Addr, b: Ipv6Addr) -> Vec<u32> {
    a.segments()
        .into_iter()
        .chain(b.segments())
        .map(u32::from)
        .collect()
}

/// A TSO super-frame from pod A's offload TAP, as its kernel hands it over: TCP/IPv6 from
/// pod A to pod C, `payload` bytes of [`pattern`] from sequence number 1000, MSS 1370 (the
/// overlay's MTU 1430 - 40 - 20), the TCP checksum partial (the pseudo-header sum).
fn pod_tso6(a: &Node, payload: usize) -> PacketBuf {
    let mut f = Vec::new();
    PacketBuilder::ethernet2([2, 0, 1, 0, 0, 2], a.gw_mac.0)
        .ipv6(pod6(1).octets(), pod6(2).octets(), 64)
        .tcp(40000, 5201, 1000, 65535)
        .ack(1)
        .write(&mut f, &pattern(payload))
        .unwrap();
    let mut b = PacketBuf::new(70_000);
    b.room_mut()[..f.len()].copy_from_slice(&f);
    b.set_len(f.len());
    b.port = POD;
    let tcp_len = u32::try_from(f.len() - 54).unwrap();
    let mut words = addr_words(pod6(1), pod6(2));
    words.extend([6, tcp_len]);
    b.frame_mut()[70..72].copy_from_slice(&fold(words).to_be_bytes());
    b.offload = VirtioNetHdr {
        flags: VIRTIO_NET_HDR_F_NEEDS_CSUM,
        gso_type: VIRTIO_NET_HDR_GSO_TCPV6,
        hdr_len: 74,
        gso_size: 1370,
        csum_start: 54,
        csum_offset: 16,
    };
    b
}

impl Node {
    /// Like [`Node::run_buf`] for a whole batch, but every frame as the datapath hands it to
    /// a port, with its offload header (super-frames whole), as an offload TAP gets it.
    fn run_batch_whole(
        &mut self,
        bufs: Vec<PacketBuf>,
    ) -> (Vec<Verdict>, Vec<(PortId, PacketBuf)>) {
        let mut batch = Batch::new();
        for b in bufs {
            batch.push(b).unwrap();
        }
        self.dp.process(&mut self.w, self.now, &mut batch);
        let v = batch.verdicts().to_vec();
        let mut out = Vec::new();
        self.dp.dispatch(&mut self.w, &batch, |p, b| {
            let c = common::copy_buf(b);
            out.push((p, c));
            Ok(())
        });
        (v, out)
    }
}

/// Checks the UDP-tunnel-IPv6 super-frame A's encapsulation makes of [`pod_tso6`]`(payload)`:
/// the virtio header a UDP-tunnel GSO TAP takes (the kernel's `virtio_net_hdr_tnl_to_skb`
/// wants the tunnel bit of the outer family and `csum_start` at the inner TCP header), the
/// outer IPv6 and UDP lengths of the whole, its outer UDP checksum partial, the inner frame
/// as routed (VTEP MACs, hop limit 63, TCP checksum still partial).
fn check_tunnel6_super_frame(b: &PacketBuf, pod_frame: &[u8], payload: usize) {
    assert_eq!(
        b.offload,
        VirtioNetHdr {
            flags: VIRTIO_NET_HDR_F_NEEDS_CSUM,
            gso_type: VIRTIO_NET_HDR_GSO_TCPV6 | VIRTIO_NET_HDR_GSO_UDP_TUNNEL_IPV6,
            hdr_len: 70 + 74,
            gso_size: 1370,
            csum_start: 70 + 54,
            csum_offset: 16,
        }
    );
    let f = b.frame();
    assert_eq!(f.len(), 70 + 74 + payload);
    assert_eq!(&f[12..14], &[0x86, 0xdd], "outer IPv6");
    let udp_len = u16::try_from(f.len() - 54).unwrap();
    assert_eq!(&f[18..20], &udp_len.to_be_bytes(), "outer payload length");
    assert_eq!(f[20], 17, "UDP right after the fixed header");
    assert_eq!(&f[22..38], &node_ip6(1).octets());
    assert_eq!(&f[38..54], &node_ip6(2).octets());
    assert_eq!(&f[56..58], &8472u16.to_be_bytes());
    assert_eq!(&f[58..60], &udp_len.to_be_bytes(), "outer UDP length");
    let mut words = addr_words(node_ip6(1), node_ip6(2));
    words.extend([17, u32::from(udp_len)]);
    assert_eq!(
        &f[60..62],
        &fold(words).to_be_bytes(),
        "outer UDP checksum partial"
    );
    assert_eq!(&f[62..70], &[0x08, 0, 0, 0, 0, 0, 1, 0]);
    let inner = &f[70..];
    assert_eq!(&inner[..6], &default_mac(pod_net6(2)).0);
    assert_eq!(&inner[6..12], &default_mac(pod_net6(1)).0);
    assert_eq!(inner[14 + 7], 63, "hop limit decremented once");
    assert!(inner[12..21] == pod_frame[12..21] && inner[22..] == pod_frame[22..]);
}

/// The segments a port without UDP-tunnel GSO sends of a VXLAN-over-IPv6 super-frame
/// carrying [`pod_tso6`]`(payload)`, checked one by one as a receiver would (outer IPv6
/// payload length, UDP length, nonzero and right UDP checksum, inner TCP checksum, sequence
/// numbers contiguous, at most the underlay's 1500 bytes); returns them.
fn check_tunnel6_segments(b: &PacketBuf, payload: usize) -> Vec<Vec<u8>> {
    let mut segs = Vec::new();
    let mut scratch = vec![0u8; 70_000];
    tapyard::offload::segment(b.frame(), &b.offload, &mut scratch, &mut |f| {
        segs.push(f.to_vec())
    })
    .unwrap();
    assert_eq!(segs.len(), payload.div_ceil(1370));
    let (mut got, mut seq) = (Vec::new(), 1000u32);
    for w in &segs {
        check_segment6(w, &mut seq, &mut got);
    }
    assert!(got == pattern(payload), "reassembled payload");
    segs
}

/// Checks one VXLAN-over-IPv6 segment of a pod's TCP/IPv6 flow as a receiver would: at most
/// the underlay's 1500 bytes, outer IPv6 payload length and UDP length, a nonzero and right
/// outer UDP checksum, a right inner TCP checksum, the sequence number `seq` (advanced past
/// its payload, which is appended to `got`).
fn check_segment6(w: &[u8], seq: &mut u32, got: &mut Vec<u8>) {
    assert!(w.len() <= 14 + 1500, "{}", w.len());
    let s = SlicedPacket::from_ethernet(w).unwrap();
    let (Some(NetSlice::Ipv6(ip)), Some(TransportSlice::Udp(u))) = (s.net, s.transport) else {
        panic!("not UDP/IPv6")
    };
    assert_eq!(usize::from(ip.header().payload_length()), w.len() - 54);
    assert_eq!(usize::from(u.length()), w.len() - 54);
    assert_ne!(u.checksum(), 0);
    assert!(udp6_checksum_ok(w), "outer UDP checksum");
    let inner = SlicedPacket::from_ethernet(&u.payload()[8..]).unwrap();
    let (Some(NetSlice::Ipv6(ip)), Some(TransportSlice::Tcp(t))) = (inner.net, inner.transport)
    else {
        panic!("inner not TCP/IPv6")
    };
    assert_eq!(
        t.to_header()
            .calc_checksum_ipv6(&ip.header().to_header(), t.payload())
            .unwrap(),
        t.checksum(),
        "inner TCP checksum"
    );
    assert_eq!(t.sequence_number(), *seq, "sequence numbers contiguous");
    *seq = seq.wrapping_add(u32::try_from(t.payload().len()).unwrap());
    got.extend_from_slice(t.payload());
}

#[test]
fn a_tso_super_frame_crosses_an_ipv6_underlay_whole_or_as_segments() {
    let (mut a, mut c) = (node(1), node(2));
    let pod = pod_tso6(&a, 13_700);
    let pod_frame = pod.frame().to_vec();
    let (v, out) = a.run_batch_whole(vec![pod]);
    assert_eq!(v, [Verdict::Output(ETH0)]);
    assert_eq!(
        out.len(),
        1,
        "one super-frame, no segments made in the batch"
    );
    let (port, sf) = &out[0];
    assert_eq!(*port, ETH0);
    // An offload uplink with UDP-tunnel GSO takes it as it is.
    check_tunnel6_super_frame(sf, &pod_frame, 13_700);
    let st = a.dp.control().stats();
    assert_eq!((st.generated, st.generated_lost), (0, 0), "{st:?}");
    assert_eq!(st.accounted(), 1);
    let t = a.dp.control().tunnel_by_name("flannel-v6.1").unwrap();
    let p = t.peers().by_ip(node_ip6(2)).unwrap().stats();
    assert_eq!((p.tx_packets, p.tx_bytes), (1, pod_frame.len() as u64));

    // Any other uplink sends it as 10 correct segments, each of which C decapsulates and
    // routes to its pod.
    let segs = check_tunnel6_segments(sf, 13_700);
    assert_eq!(segs.len(), 10);
    let mut got = Vec::new();
    for w in &segs {
        let (v, o) = c.run(ETH0, w);
        assert!(
            matches!(v, Verdict::Output(POD) | Verdict::Flood(_)),
            "{v:?}"
        );
        let s = SlicedPacket::from_ethernet(&o[0].1).unwrap();
        let Some(TransportSlice::Tcp(t)) = s.transport else {
            panic!()
        };
        got.extend_from_slice(t.payload());
    }
    assert!(got == pattern(13_700));

    // And what a UDP-tunnel TAP on C's side hands over (the kernel keeps it whole, outer
    // checksum partial): decapsulated whole into the inner TCP/IPv6 super-frame.
    let mut rx = common::copy_buf(sf);
    rx.offload.flags |= VIRTIO_NET_HDR_F_UDP_TUNNEL_CSUM;
    rx.port = ETH0;
    let (v, o) = c.run_batch_whole(vec![rx]);
    assert!(
        matches!(v[0], Verdict::Output(POD) | Verdict::Flood(_)),
        "{v:?}"
    );
    let inner = &o[0].1;
    assert_eq!(inner.len(), 74 + 13_700);
    assert_eq!(
        (
            inner.offload.gso_type,
            inner.offload.csum_start,
            inner.offload.gso_size
        ),
        (VIRTIO_NET_HDR_GSO_TCPV6, 54, 1370)
    );
}

#[test]
fn a_full_batch_of_super_frames_loses_no_segment() {
    // 32 super-frames of 47 segments each (64 KiB, what a pod's TCP sends in bulk): before,
    // each was segmented before encapsulation into the batch's extra frames, at most
    // MAX_EXTRA (256) of them, and the rest counted as `generated_lost`.
    let mut a = node(1);
    let payload = 47 * 1370;
    let bufs: Vec<PacketBuf> = (0..32).map(|_| pod_tso6(&a, payload)).collect();
    let pod_frame = bufs[0].frame().to_vec();
    const { assert!(32 * 47 > tapyard::MAX_EXTRA) };
    let (v, out) = a.run_batch_whole(bufs);
    assert!(v.iter().all(|v| *v == Verdict::Output(ETH0)), "{v:?}");
    assert_eq!(out.len(), 32);
    let mut segs = 0;
    for (_, sf) in &out {
        check_tunnel6_super_frame(sf, &pod_frame, payload);
        segs += check_tunnel6_segments(sf, payload).len();
    }
    assert_eq!(segs, 32 * 47);
    let st = a.dp.control().stats();
    assert_eq!((st.generated, st.generated_lost), (0, 0), "{st:?}");
    assert_eq!(st.accounted(), 32);
}

#[test]
fn lying_super_frames_from_a_pod_are_dropped_by_reason() {
    let mut a = node(1);
    let good = pod_tso6(&a, 5_000);
    let copy = |g: &PacketBuf| {
        let mut b = PacketBuf::new(70_000);
        b.room_mut()[..g.len()].copy_from_slice(g.frame());
        b.set_len(g.len());
        b.port = g.port;
        b.offload = g.offload;
        b
    };
    let lie = |edit: &dyn Fn(&mut PacketBuf)| {
        let mut b = copy(&good);
        edit(&mut b);
        b
    };
    let lies: [&dyn Fn(&mut PacketBuf); 9] = [
        &|b| b.offload.flags = 0,                           // no partial checksum
        &|b| b.offload.csum_start = 40,                     // inside the IPv6 header
        &|b| b.offload.csum_start = 60,                     // inside the TCP header
        &|b| b.offload.csum_offset = 6,                     // UDP's field, not TCP's
        &|b| b.offload.gso_size = 0,                        // no segment size
        &|b| b.offload.gso_type = VIRTIO_NET_HDR_GSO_TCPV4, // the other family
        &|b| b.offload.gso_type = 5,                        // USO
        &|b| b.offload.hdr_len = 60_000,                    // past the frame
        &|b| b.offload.gso_type |= VIRTIO_NET_HDR_GSO_UDP_TUNNEL_IPV6, // a tunnel already
    ];
    for (i, edit) in lies.into_iter().enumerate() {
        let before = a.drops(DropReason::BadOffload);
        let (v, out) = a.run_batch_whole(vec![lie(edit)]);
        assert_eq!(v, [Verdict::Drop(DropReason::BadOffload)], "lie {i}");
        assert!(out.is_empty());
        assert_eq!(a.drops(DropReason::BadOffload), before + 1);
    }
    // UDP under a TCP GSO type (the router forwards it; encapsulation refuses it).
    let mut udp = pod_udp6(1, a.gw_mac, pod6(2), 3000);
    udp.resize(3000, 0);
    let mut b = PacketBuf::new(70_000);
    b.room_mut()[..udp.len()].copy_from_slice(&udp);
    b.set_len(udp.len());
    b.port = POD;
    b.offload = good.offload;
    let (v, _) = a.run_batch_whole(vec![b]);
    assert!(matches!(v[0], Verdict::Drop(_)), "{v:?}");

    // Fuzz-ish: random virtio headers and random header bytes never panic; every frame is
    // accounted for (forwarded, flooded or dropped under a reason), and whatever leaves the uplink
    // is either a super-frame `offload::segment` turns into right segments or one it
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
        let mut b = copy(&good);
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
                assert!(udp6_checksum_ok(f), "a segment with a wrong outer checksum");
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

#[test]
fn a_udp_tunnel_ipv6_super_frame_is_decapsulated_whole() {
    let mut c = node(2);
    // From node A's uplink TAP with UDP-tunnel GSO: one IPv6 VXLAN super-frame whose inner
    // frame is a TCP/IPv6 super-frame of 5 segments of 1370, checksums partial.
    let data: Vec<u8> = (0..6850u32).map(|k| (k % 251) as u8).collect();
    let mut inner = Vec::new();
    PacketBuilder::ethernet2(default_mac(pod_net6(1)).0, default_mac(pod_net6(2)).0)
        .ipv6(pod6(1).octets(), pod6(2).octets(), 63)
        .tcp(40000, 5201, 1000, 65535)
        .ack(1)
        .write(&mut inner, &data)
        .unwrap();
    let mut payload = vec![0x08, 0, 0, 0, 0, 0, 1, 0];
    payload.extend_from_slice(&inner);
    let mut f = Vec::new();
    PacketBuilder::ethernet2([2, 0xaa, 1, 0, 0, 2], c.up_mac.0)
        .ipv6(node_ip6(1).octets(), node_ip6(2).octets(), 64)
        .udp(40001, 8472)
        .write(&mut f, &payload)
        .unwrap();
    // The super-frame as the uplink TAP hands it over, with GSO type `tunnel`.
    let super_frame = |tunnel: u8| {
        let mut b = PacketBuf::new(70_000);
        b.room_mut()[..f.len()].copy_from_slice(&f);
        b.set_len(f.len());
        b.port = ETH0;
        let inner_l4 = 70 + 14 + 40;
        b.offload = VirtioNetHdr {
            flags: tapyard::offload::VIRTIO_NET_HDR_F_NEEDS_CSUM,
            gso_type: tapyard::offload::VIRTIO_NET_HDR_GSO_TCPV6 | tunnel,
            hdr_len: u16::try_from(inner_l4 + 20).unwrap(),
            gso_size: 1370,
            csum_start: u16::try_from(inner_l4).unwrap(),
            csum_offset: 16,
        };
        let mut batch = Batch::new();
        batch.push(b).unwrap();
        batch
    };
    let mut batch = super_frame(tapyard::wire::virtio::VIRTIO_NET_HDR_GSO_UDP_TUNNEL_IPV6);
    c.dp.process(&mut c.w, c.now, &mut batch);
    let v = batch.verdicts()[0];
    assert!(
        matches!(v, Verdict::Output(POD) | Verdict::Flood(_)),
        "{v:?}"
    );
    let mut got = Vec::new();
    c.dp.dispatch(&mut c.w, &batch, |p, b| {
        got.push((p, b.len(), b.offload));
        Ok(())
    });
    let (p, len, off) = got[0];
    assert_eq!(p, POD);
    // The inner super-frame whole for the pod's offload TAP: TCPv6 GSO, no tunnel bit, the
    // partial checksum now from the inner frame's start.
    assert_eq!(len, inner.len());
    assert_eq!(off.gso_type, tapyard::offload::VIRTIO_NET_HDR_GSO_TCPV6);
    assert_eq!((off.csum_start, off.gso_size), (54, 1370));
    assert_eq!(off.hdr_len, 74);
    // A super-frame whose GSO type lies (IPv4 tunnel bit on an IPv6 outer header) is refused.
    let mut batch = super_frame(tapyard::wire::virtio::VIRTIO_NET_HDR_GSO_UDP_TUNNEL_IPV4);
    c.dp.process(&mut c.w, c.now, &mut batch);
    assert_eq!(batch.verdicts()[0], Verdict::Drop(DropReason::BadOffload));
}

/// Root: the kernel takes tapyard's VXLAN-over-IPv6 super-frame as it is written to a TAP
/// with UDP-tunnel GSO (Linux checks its header in `virtio_net_hdr_tnl_to_skb`): across a
/// Linux bridge it reaches another such TAP whole (read back as one UDP-tunnel-IPv6
/// super-frame, which C decapsulates whole) and a plain TAP as segments the kernel made
/// (outer IPv6 header replicated, each outer UDP checksum computed). Written to an offload
/// TAP without UDP-tunnel GSO instead, it is segmented by tapyard and the plain TAP gets the
/// same right segments.
#[test]
#[cfg_attr(
    not(tapyard_root),
    ignore = "needs root: TAP devices and network namespaces (runs as root, as in CI)"
)]
fn tunnel6_super_frame_crosses_real_taps() {
    if let Some(why) = common::skip_reason(&[]) {
        common::skip(&why);
        return;
    }
    let (pid, tag) = common::name_tag();
    let name = |i: u8| format!("tyv6{}{i}", pid % 10_000);
    let mut t1 = TapPort::open_offload(&name(1)).unwrap();
    if let Err(e) = t1.enable_tunnel_offload() {
        common::skip(&format!(
            "skipping: the kernel refuses UDP-tunnel GSO on a TAP ({e})"
        ));
        return;
    }
    let mut t2 = TapPort::open_offload(&name(2)).unwrap();
    t2.enable_tunnel_offload().unwrap();
    let t3 = TapPort::open(&name(3)).unwrap();
    let t4 = TapPort::open_offload(&name(4)).unwrap();
    assert!(!t4.tunnel_offload());
    let mut g = common::Guard::default();
    let ns = g.ns(&format!("tyv6-{pid}-{tag}"));
    ns.disable_ipv6();
    ns.ip(&["link", "add", "br0", "type", "bridge"]);
    ns.ip(&["link", "set", "br0", "up"]);
    for i in 1..=4 {
        common::run(&["ip", "link", "set", &name(i), "netns", &ns.name]);
        ns.ip(&["link", "set", &name(i), "master", "br0"]);
        ns.ip(&["link", "set", &name(i), "up"]);
    }
    let (mut a, mut c) = (node(1), node(2));
    let pod = pod_tso6(&a, 30_000);
    let pod_frame = pod.frame().to_vec();
    let (_, out) = a.run_batch_whole(vec![pod]);
    let sf = &out[0].1;
    check_tunnel6_super_frame(sf, &pod_frame, 30_000);
    let is_vxlan6 = |b: &PacketBuf| {
        b.frame().get(12..14) == Some(&[0x86, 0xdd][..])
            && b.frame().get(56..58) == Some(&8472u16.to_be_bytes()[..])
    };
    let want_segs = 30_000usize.div_ceil(1370);
    // Nobody has C's MAC: the bridge floods to the other TAPs.
    t1.send(sf).unwrap();
    let mut pool = BufPool::new(t2.frame_room(), 64);
    let mut whole = None;
    assert!(
        common::read_until(&t2, &mut pool, &mut |b| {
            let hit = is_vxlan6(b);
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
    assert_eq!(
        whole.offload.gso_type,
        VIRTIO_NET_HDR_GSO_TCPV6 | VIRTIO_NET_HDR_GSO_UDP_TUNNEL_IPV6
    );
    assert_eq!(
        (whole.offload.csum_start, whole.offload.gso_size),
        (70 + 54, 1370)
    );
    whole.port = ETH0;
    let (v, o) = c.run_batch_whole(vec![whole]);
    assert!(
        matches!(v[0], Verdict::Output(POD) | Verdict::Flood(_)),
        "{v:?}"
    );
    assert_eq!(o[0].1.len(), 74 + 30_000);
    assert_eq!(o[0].1.offload.gso_type, VIRTIO_NET_HDR_GSO_TCPV6);
    // The plain TAP gets the kernel's segments; then the ones tapyard makes for an offload
    // TAP without UDP-tunnel GSO.
    let mut pool = BufPool::new(t3.frame_room(), 64);
    for (sender, what) in [(None, "the kernel's"), (Some(&t4), "tapyard's")] {
        if let Some(t) = sender {
            t.send(sf).unwrap();
        }
        let (mut got, mut seq, mut n) = (Vec::new(), 1000u32, 0);
        assert!(
            common::read_until(&t3, &mut pool, &mut |b| {
                if !is_vxlan6(b) {
                    return false;
                }
                check_segment6(b.frame(), &mut seq, &mut got);
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
        assert!(got == pattern(30_000), "{what} segments' payload");
    }
    drop((t1, t2, t3, t4));
}
