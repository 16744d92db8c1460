//! Both families at once: IPv6 pods over the IPv4 underlay (Flannel's dual-stack VXLAN
//! without an IPv6 underlay), and peers and interfaces checked against their family.

use super::*;

use tapyard::l3::vxlan::PeerError;
use tapyard::offload::VirtioNetHdr;
use tapyard::wire::virtio::VIRTIO_NET_HDR_F_UDP_TUNNEL_CSUM;

/// IPv6 pod traffic inside the overlay, over the IPv4 underlay (as flannel's dual-stack
/// VXLAN with an IPv4 underlay): an IPv6 route via the peer's link-local VTEP address on
/// `flannel.1` (`fd00:10:244:2::/64 via fe80::... dev flannel.1`) and its static NDP entry
/// with the peer's VTEP MAC, as `ip -6 route` / `ip -6 neigh` show on a flannel node.
/// Pod `h` of node `n`'s IPv6 pod network (fd00:10:244:n::/64).
fn v6(n: u8, h: u16) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, 0x10, 0x244, u16::from(n), 0, 0, 0, h)
}

/// Nodes A and C as dual-stack Flannel nodes whose IPv6 pods ride the IPv4 underlay
/// (flannel.1): the remote pod /64 via the other VTEP's link-local address, its neighbour
/// permanent.
fn dual_stack_nodes() -> (Node, Node) {
    let vtep_ll =
        |n: u8| tapyard::wire::ipv6::link_local_from_mac(default_mac(Ipv4Addr::new(10, 244, n, 0)));
    let (a, c) = (node_with(1, false), node_with(2, false));
    for (n, node) in [(1u8, &a), (2u8, &c)] {
        let other = 3 - n;
        let dp = &node.dp;
        let flannel = dp.control().iface_by_name("flannel.1").unwrap();
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
        (
            IpAddr::from(ip.header().source_addr()),
            IpAddr::from(ip.header().destination_addr())
        ),
        (Under::V4.node_ip(1), Under::V4.node_ip(2))
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
    assert_eq!(
        &sf.frame()[40..42],
        &pseudo_sum(Under::V4, sf.frame(), 14).to_be_bytes()
    );
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

#[test]
fn peers_and_interfaces_are_family_checked() {
    let a = node(1);
    let e =
        a.dp.control()
            .add_vxlan_peer("flannel-v6.1", Under::V4.peer(3), a.now)
            .unwrap_err();
    assert!(matches!(e, PeerError::WrongFamily("node_ip", _)), "{e}");
    let e =
        a.dp.control()
            .add_vxlan_peer("flannel.1", Under::V6.peer(3), a.now)
            .unwrap_err();
    assert!(matches!(e, PeerError::WrongFamily("node_ip", _)), "{e}");
    let mut mixed = Under::V6.peer(3);
    mixed.pod_cidr = Ipv4Addr::new(10, 244, 3, 0).into();
    mixed.pod_prefix_len = 24;
    let e =
        a.dp.control()
            .add_vxlan_peer("flannel-v6.1", mixed, a.now)
            .unwrap_err();
    assert!(matches!(e, PeerError::WrongFamily("pod_cidr", _)), "{e}");
    let mut own = Under::V6.peer(3);
    own.node_ip = Under::V6.node_ip(1);
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
            Under::V6.pod(1, 0),
        ))
        .unwrap_err()
        .to_string();
    assert!(e.contains("IPv6 address"), "{e}");
}
