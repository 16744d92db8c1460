//! VXLAN without root, as Flannel sets a dual-stack node up: two nodes (A: pods on
//! 10.244.1.0/24 and fd00:10:244:1::/64; C: .2), each a datapath with a bridge `cni0`, an
//! uplink `eth0` and two VXLAN interfaces, `flannel.1` over the IPv4 underlay and
//! `flannel-v6.1` over the IPv6 one. Frames built byte by byte go in; what leaves A's uplink
//! is checked as Linux's vxlan sends it, then fed to C, whose pod must get the inner packet.
//! Every test that both underlays share is written once over [`Under`] and runs once per
//! family (`vxlan::..::v4::name`, `..::v6::name`); what only one family has (IPv6 pods over
//! the IPv4 underlay, the IPv4 header checksum, ICMP's "fragmentation needed" shape) says
//! so in its name. Two tests (one per family) cross real TAPs with UDP-tunnel GSO, as root.

mod dual_stack;
mod overlay;
mod super_frames;

use crate::common;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use etherparse::{NetSlice, PacketBuilder, SlicedPacket, TransportSlice};
use tapyard::l3::vxlan::default_mac;
use tapyard::l3::{IfaceConfig, IfaceId, NextHop, Route, RouteProto, VxlanConfig, VxlanPeer};
use tapyard::offload::{VIRTIO_NET_HDR_GSO_TCPV4, VIRTIO_NET_HDR_GSO_TCPV6};
use tapyard::wire::virtio::{
    VIRTIO_NET_HDR_GSO_UDP_TUNNEL_IPV4, VIRTIO_NET_HDR_GSO_UDP_TUNNEL_IPV6,
};
use tapyard::{
    Batch, BridgeConfig, Datapath, DropReason, Instant, MacAddr, PacketBuf, PortId, Verdict, Worker,
};

const POD: PortId = PortId(0);
const ETH0: PortId = PortId(2);

/// Runs `$name(Under::V4)` as `v4::$name` and `$name(Under::V6)` as `v6::$name`.
macro_rules! per_family {
    ($($name:ident),* $(,)?) => {
        mod v4 {
            $(#[test] fn $name() { super::$name(super::super::Under::V4) })*
        }
        mod v6 {
            $(#[test] fn $name() { super::$name(super::super::Under::V6) })*
        }
    };
}
use per_family;

/// The underlay a test runs over, and the family of the pods it carries there: IPv4 pods
/// over `flannel.1` or IPv6 pods over `flannel-v6.1`.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Under {
    V4,
    V6,
}

impl Under {
    /// The VXLAN interface of this underlay.
    fn tunnel(self) -> &'static str {
        match self {
            Under::V4 => "flannel.1",
            Under::V6 => "flannel-v6.1",
        }
    }

    /// Node `n`'s uplink address: 172.18.0.(n+1) or fd00:172:18::(n+1).
    fn node_ip(self, n: u8) -> IpAddr {
        match self {
            Under::V4 => Ipv4Addr::new(172, 18, 0, n + 1).into(),
            Under::V6 => Ipv6Addr::new(0xfd00, 0x172, 0x18, 0, 0, 0, 0, u16::from(n) + 1).into(),
        }
    }

    /// Host `h` of node `n`'s pod network (h = 0: the network, which is also the VTEP
    /// address Flannel gives `flannel.1`; 1: the gateway; 2: the pod).
    fn pod(self, n: u8, h: u8) -> IpAddr {
        match self {
            Under::V4 => Ipv4Addr::new(10, 244, n, h).into(),
            Under::V6 => {
                Ipv6Addr::new(0xfd00, 0x10, 0x244, u16::from(n), 0, 0, 0, u16::from(h)).into()
            }
        }
    }

    /// The pod network's prefix length.
    fn pod_len(self) -> u8 {
        match self {
            Under::V4 => 24,
            Under::V6 => 64,
        }
    }

    /// The peer entry for node `n` on this underlay's VXLAN interface.
    fn peer(self, n: u8) -> VxlanPeer {
        VxlanPeer::new(
            self.node_ip(n),
            default_mac(self.pod(n, 0)),
            self.pod(n, 0),
            self.pod_len(),
        )
    }

    /// Bytes of the IP header (no options, no extension headers here).
    fn ip_len(self) -> usize {
        match self {
            Under::V4 => 20,
            Under::V6 => 40,
        }
    }

    /// Where the UDP header starts in a frame of this family: Ethernet + IP.
    fn l4(self) -> usize {
        14 + self.ip_len()
    }

    /// Bytes encapsulation adds: Ethernet, IP, UDP and VXLAN headers.
    fn overhead(self) -> usize {
        self.l4() + 8 + 8
    }

    /// The overlay's MTU: the underlay's 1500 less the outer IP, UDP and VXLAN headers.
    fn mtu(self) -> usize {
        1500 - self.overhead()
    }

    /// The MSS of the pod's TSO super-frames: the overlay's MTU less IP and TCP headers,
    /// less 12 bytes of timestamps over IPv4 (what a pod learns after PMTU discovery).
    fn mss(self) -> u16 {
        match self {
            Under::V4 => 1398,
            Under::V6 => 1370,
        }
    }

    /// The virtio GSO type of a TCP super-frame of this family.
    fn gso_tcp(self) -> u8 {
        match self {
            Under::V4 => VIRTIO_NET_HDR_GSO_TCPV4,
            Under::V6 => VIRTIO_NET_HDR_GSO_TCPV6,
        }
    }

    /// The virtio GSO bit of a UDP tunnel over this family.
    fn gso_tunnel(self) -> u8 {
        match self {
            Under::V4 => VIRTIO_NET_HDR_GSO_UDP_TUNNEL_IPV4,
            Under::V6 => VIRTIO_NET_HDR_GSO_UDP_TUNNEL_IPV6,
        }
    }

    /// The other family.
    fn other(self) -> Under {
        match self {
            Under::V4 => Under::V6,
            Under::V6 => Under::V4,
        }
    }
}

struct Node {
    dp: Datapath,
    w: Worker,
    gw_mac: MacAddr,
    up_mac: MacAddr,
    now: Instant,
}

/// Node `n` (1 = A, 2 = C), dual-stack: `cni0` with gateways 10.244.n.1/24 and
/// fd00:10:244:n::1/64, `eth0` with 172.18.0.(n+1)/24 and fd00:172:18::(n+1)/64, MAC
/// 02:aa:0n:00:00:02, `flannel.1` (VNI 1, port 8472, VTEP 10.244.n.0) and, with
/// `v6_underlay`, `flannel-v6.1` (VTEP fd00:10:244:n::); a peer for the other node on each,
/// its uplink MAC known, and pod .2 of each family a static neighbour on `cni0`. Bad
/// VXLAN configurations are refused on the way, naming the field.
fn node_with(n: u8, v6_underlay: bool) -> Node {
    let other = 3 - n;
    let gw_mac = MacAddr([2, 0xaa, n, 0, 0, 1]);
    let up_mac = MacAddr([2, 0xaa, n, 0, 0, 2]);
    let mut b = Datapath::builder();
    let br = b.add_bridge(BridgeConfig::new("cni0")).unwrap();
    assert_eq!(b.add_port("pod", Some(br)).unwrap(), POD);
    let mut cni0 = IfaceConfig::new("cni0", gw_mac, Ipv4Addr::new(10, 244, n, 1), 24);
    let IpAddr::V6(gw6) = Under::V6.pod(n, 1) else {
        unreachable!()
    };
    cni0.addr6 = Some((gw6, 64));
    b.add_router_iface(cni0, Some(br)).unwrap();
    let mut eth0 = IfaceConfig::new("eth0", up_mac, Ipv4Addr::new(172, 18, 0, n + 1), 24);
    let IpAddr::V6(up6) = Under::V6.node_ip(n) else {
        unreachable!()
    };
    eth0.addr6 = Some((up6, 64));
    assert_eq!(b.add_router_iface(eth0, None).unwrap().1, ETH0);
    let unders: &[Under] = if v6_underlay {
        &[Under::V4, Under::V6]
    } else {
        &[Under::V4]
    };
    for &u in unders {
        let good = VxlanConfig::new(u.tunnel(), 1, 8472, "eth0", u.pod(n, 0));
        let too_big = u16::try_from(u.mtu() + 1).unwrap();
        for (edit, what) in [
            (
                &(|c: &mut VxlanConfig| c.vni = 1 << 24) as &dyn Fn(&mut VxlanConfig),
                "vni = 16777216".to_string(),
            ),
            (&|c| c.uplink = "eth9".into(), "uplink = eth9".to_string()),
            (&|c| c.mtu = Some(too_big), format!("mtu = {too_big}")),
        ] {
            let mut bad = good.clone();
            edit(&mut bad);
            let e = b.add_vxlan(bad).unwrap_err().to_string();
            assert!(e.contains(&what), "{e}");
        }
        if u == Under::V6 {
            assert_eq!(good.prefix_len, 128);
        }
        b.add_vxlan(good).unwrap();
    }
    let dp = b.build();
    let now = Instant::from_secs(1);
    let eth0 = dp.control().iface_by_name("eth0").unwrap();
    let cni0 = dp.control().iface_by_name("cni0").unwrap();
    let pod_mac = MacAddr([2, 0, n, 0, 0, 2]);
    for &u in unders {
        dp.control()
            .add_vxlan_peer(u.tunnel(), u.peer(other), now)
            .unwrap();
    }
    for u in [Under::V4, Under::V6] {
        dp.control()
            .add_static_neigh(
                eth0,
                u.node_ip(other),
                MacAddr([2, 0xaa, other, 0, 0, 2]),
                now,
            )
            .unwrap();
        dp.control()
            .add_static_neigh(cni0, u.pod(n, 2), pod_mac, now)
            .unwrap();
    }
    let w = dp.worker();
    Node {
        dp,
        w,
        gw_mac,
        up_mac,
        now,
    }
}

/// Node `n` with both underlays.
fn node(n: u8) -> Node {
    node_with(n, true)
}

/// The tables of node A, as `ip route`, `ip neigh` and `bridge fdb` show them, hold what
/// the peer for C on `u`'s interface implies.
fn check_peer_tables(a: &Node, u: Under) {
    let (route, neigh, fdb) = match u {
        Under::V4 => (
            "10.244.2.0/24 via 10.244.2.0 dev flannel.1 onlink",
            "10.244.2.0 dev flannel.1 lladdr 0a:58:0a:f4:02:00 PERMANENT",
            "0a:58:0a:f4:02:00 dev flannel.1 dst 172.18.0.3 self permanent\n",
        ),
        Under::V6 => (
            "fd00:10:244:2::/64 via fd00:10:244:2:: dev flannel-v6.1 proto static metric 0 onlink",
            "fd00:10:244:2:: dev flannel-v6.1 lladdr 0a:58:02:44:00:02 PERMANENT",
            "0a:58:02:44:00:02 dev flannel-v6.1 dst fd00:172:18::3 self permanent\n",
        ),
    };
    let mut t = String::new();
    a.dp.control().fmt_routes(&mut t).unwrap();
    assert!(t.contains(route), "{t}");
    t.clear();
    a.dp.control().fmt_neigh(a.now, &mut t).unwrap();
    assert!(t.contains(neigh), "{t}");
    t.clear();
    a.dp.control().fmt_vxlan_fdb(&mut t).unwrap();
    assert!(t.contains(fdb), "{t}");
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
        let (v, out) = self.run_batch_whole(vec![buf]);
        let out = out
            .iter()
            .flat_map(|(p, b)| segments(b).into_iter().map(move |f| (*p, f)))
            .collect();
        (v[0], out)
    }

    /// Like [`Node::run_buf`], but every frame as the datapath hands it to a port, with its
    /// offload header (super-frames whole), as an offload TAP gets it.
    fn run_whole(&mut self, buf: PacketBuf) -> (Verdict, Vec<(PortId, PacketBuf)>) {
        let (v, out) = self.run_batch_whole(vec![buf]);
        (v[0], out)
    }

    /// [`Node::run_whole`] for a whole batch.
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
            out.push((p, common::copy_buf(b)));
            Ok(())
        });
        (v, out)
    }

    fn drops(&self, r: DropReason) -> u64 {
        self.dp.control().stats().drop_count(r)
    }
}

/// Pod 2 of node `n`'s UDP datagram to `dst` through its gateway, `payload` bytes of 0x5a,
/// source port 40000, DF set over IPv4.
fn pod_udp(u: Under, n: u8, gw: MacAddr, dst: IpAddr, payload: usize) -> Vec<u8> {
    let mut f = Vec::new();
    let eth = PacketBuilder::ethernet2([2, 0, n, 0, 0, 2], gw.0);
    let data = vec![0x5a; payload];
    match (u.pod(n, 2), dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => eth
            .ipv4(s.octets(), d.octets(), 64)
            .udp(40000, 5201)
            .write(&mut f, &data),
        (IpAddr::V6(s), IpAddr::V6(d)) => eth
            .ipv6(s.octets(), d.octets(), 64)
            .udp(40000, 5201)
            .write(&mut f, &data),
        _ => panic!("{u:?} and {dst}"),
    }
    .unwrap();
    f
}

/// Bytes of TCP payload: byte `k` is `k % 251`.
fn pattern(n: usize) -> Vec<u8> {
    (0..n).map(|k| u8::try_from(k % 251).unwrap()).collect()
}

/// The folded sum of a frame's pseudo-header (addresses, protocol, L4 length) of family
/// `u`, the packet at `at`: what a partial checksum field holds.
fn pseudo_sum(u: Under, f: &[u8], at: usize) -> u16 {
    let (addrs, proto) = match u {
        Under::V4 => (&f[at + 12..at + 20], f[at + 9]),
        Under::V6 => (&f[at + 8..at + 40], f[at + 6]),
    };
    let l4_len = f.len() - at - u.ip_len();
    let mut s = u32::from(proto) + u32::try_from(l4_len).unwrap();
    for w in addrs.chunks(2) {
        s += u32::from(u16::from_be_bytes([w[0], w[1]]));
    }
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    u16::try_from(s).unwrap()
}

/// A TSO super-frame from pod A's offload TAP, as its kernel hands it over: TCP from pod A
/// to pod C over `u`'s family, `payload` bytes of [`pattern`] from sequence number 1000, MSS
/// [`Under::mss`], the TCP checksum partial (the pseudo-header sum).
fn pod_tso(u: Under, a: &Node, payload: usize) -> PacketBuf {
    let mut f = Vec::new();
    let eth = PacketBuilder::ethernet2([2, 0, 1, 0, 0, 2], a.gw_mac.0);
    match (u.pod(1, 2), u.pod(2, 2)) {
        (IpAddr::V4(s), IpAddr::V4(d)) => eth
            .ipv4(s.octets(), d.octets(), 64)
            .tcp(40000, 5201, 1000, 65535)
            .ack(1)
            .write(&mut f, &pattern(payload)),
        (IpAddr::V6(s), IpAddr::V6(d)) => eth
            .ipv6(s.octets(), d.octets(), 64)
            .tcp(40000, 5201, 1000, 65535)
            .ack(1)
            .write(&mut f, &pattern(payload)),
        _ => unreachable!(),
    }
    .unwrap();
    let sum = pseudo_sum(u, &f, 14);
    f[u.l4() + 16..u.l4() + 18].copy_from_slice(&sum.to_be_bytes());
    let mut b = PacketBuf::new(70_000);
    b.room_mut()[..f.len()].copy_from_slice(&f);
    b.set_len(f.len());
    b.port = POD;
    b.offload = inner_offload(u);
    b
}

/// The virtio header of a pod's TCP super-frame of family `u` (as [`pod_tso`] makes it and
/// as decapsulation hands it to the pod).
fn inner_offload(u: Under) -> tapyard::offload::VirtioNetHdr {
    tapyard::offload::VirtioNetHdr {
        flags: tapyard::offload::VIRTIO_NET_HDR_F_NEEDS_CSUM,
        gso_type: u.gso_tcp(),
        hdr_len: u16::try_from(u.l4() + 20).unwrap(),
        gso_size: u.mss(),
        csum_start: u16::try_from(u.l4()).unwrap(),
        csum_offset: 16,
    }
}

/// Whether a frame's UDP checksum (over either family) is right.
fn udp_checksum_ok(wire: &[u8]) -> bool {
    let s = SlicedPacket::from_ethernet(wire).unwrap();
    let Some(TransportSlice::Udp(u)) = s.transport else {
        return false;
    };
    let want = match s.net {
        Some(NetSlice::Ipv4(ip)) => u
            .to_header()
            .calc_checksum_ipv4(&ip.header().to_header(), u.payload()),
        Some(NetSlice::Ipv6(ip)) => u
            .to_header()
            .calc_checksum_ipv6(&ip.header().to_header(), u.payload()),
        _ => return false,
    };
    want.unwrap() == u.checksum()
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

/// The frames a port without offloads sends of `b`: `b` itself, or a super-frame's
/// segments.
fn segments(b: &PacketBuf) -> Vec<Vec<u8>> {
    if b.offload.is_none() {
        return vec![b.frame().to_vec()];
    }
    let mut frames = Vec::new();
    let mut scratch = vec![0u8; 70_000];
    tapyard::offload::segment(b.frame(), &b.offload, &mut scratch, &mut |f| {
        frames.push(f.to_vec())
    })
    .unwrap();
    frames
}

/// Sets the outer IP lengths of an encapsulated frame of family `u` from its size, then its
/// IPv4 header checksum and its UDP checksum, as a sender that means the edits would.
fn fix_outer(u: Under, f: &mut [u8]) {
    let ip_payload = u16::try_from(f.len() - u.l4()).unwrap();
    match u {
        Under::V4 => {
            f[16..18].copy_from_slice(&(ip_payload + 20).to_be_bytes());
            f[24..26].fill(0);
            let mut s: u32 = 0;
            for w in f[14..34].chunks(2) {
                s += u32::from(u16::from_be_bytes([w[0], w[1]]));
            }
            while s > 0xffff {
                s = (s & 0xffff) + (s >> 16);
            }
            f[24..26].copy_from_slice(&(!u16::try_from(s).unwrap()).to_be_bytes());
        }
        Under::V6 => f[18..20].copy_from_slice(&ip_payload.to_be_bytes()),
    }
    let l4 = u.l4();
    f[l4 + 6..l4 + 8].fill(0);
    let mut s = u32::from(pseudo_sum(u, f, 14));
    for w in f[l4..].chunks(2) {
        s += u32::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)]));
    }
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    let sum = match !u16::try_from(s).unwrap() {
        0 => 0xffff,
        x => x,
    };
    f[l4 + 6..l4 + 8].copy_from_slice(&sum.to_be_bytes());
}

/// Adds a host route (/32 or /128) to `addr` on the interface `iface`, as `ip route add
/// ADDR dev IFACE` does.
fn add_host_route(n: &Node, iface: IfaceId, addr: IpAddr) {
    let c = n.dp.control();
    match addr {
        IpAddr::V4(a) => c.add_route(link_route(a, 32, iface)).unwrap(),
        IpAddr::V6(a) => c.add_route(link_route(a, 128, iface)).unwrap(),
    }
}

/// A static on-link route to `prefix`/`len` on `iface`.
fn link_route<A>(prefix: A, len: u8, iface: IfaceId) -> Route<A> {
    Route {
        prefix,
        len,
        next_hop: NextHop::Link(iface),
        metric: 0,
        proto: RouteProto::Static,
        src: None,
    }
}
