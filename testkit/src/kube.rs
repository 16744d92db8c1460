//! The Kubernetes node of the NAT tests, fuzz targets and benches, written once: a dual-stack
//! node as kube-proxy and a bridge CNI plugin set it up, for a test to add its Services to.
//!
//! - bridge `cni0` with pod A on port 0 and pod B on port 1 ([`PA`], [`PB`]), the gateway
//!   (`cni0`, its router port 2) at [`Plan::gw`];
//! - the uplink `eth0` ([`ETH0`], port 3) at [`Plan::node`];
//! - routes: the other node's pod network ([`Plan::remote`]'s /24 or /64) via that node
//!   ([`Plan::peer`]), a default route via [`Plan::default_gw`];
//! - static neighbours: both pods, the other node ([`PEER`]) and the default gateway
//!   ([`OUTGW`]);
//! - netfilter with the cluster CIDR and MASQUERADE of traffic from it to outside it, for
//!   both families (kube-proxy's `KUBE-POSTROUTING` with `--cluster-cidr`).
//!
//! [`Plan::V4`] and [`Plan::V6`] name each family's addresses, so that a test can be written
//! once and run for both.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;

use tapyard::conntrack::{CtConfig, Opened};
use tapyard::l3::{IfaceConfig, IfaceId, NextHop, Route, RouteProto};
use tapyard::nat::{MasqueradeRule, NatConfig, NatRules, Prefix};
use tapyard::{BridgeConfig, Clock, Datapath, Instant, MacAddr, PortId};

use crate::node::Node;

/// The gateway's MAC (`cni0`).
pub const GW_MAC: MacAddr = MacAddr([0x02, 0xaa, 0, 0, 0, 1]);
/// The uplink's MAC (`eth0`).
pub const UP_MAC: MacAddr = MacAddr([0x02, 0xaa, 0, 0, 0, 2]);
/// Pod A's MAC.
pub const POD_A: MacAddr = MacAddr([0x02, 0, 0, 0, 1, 2]);
/// Pod B's MAC.
pub const POD_B: MacAddr = MacAddr([0x02, 0, 0, 0, 1, 3]);
/// The other node's MAC (on the uplink's network).
pub const PEER: MacAddr = MacAddr([0x02, 0, 0, 0, 0x12, 3]);
/// The default gateway's MAC.
pub const OUTGW: MacAddr = MacAddr([0x02, 0, 0, 0, 0x12, 1]);
/// Pod A's port.
pub const PA: PortId = PortId(0);
/// Pod B's port.
pub const PB: PortId = PortId(1);
/// The uplink's port.
pub const ETH0: PortId = PortId(3);
/// The host port's port ([`KubeOptions::host_port`]).
pub const HOST0: PortId = PortId(4);
/// The host port's MAC (`host0`, tapyard's side).
pub const HOST_MAC: MacAddr = MacAddr([0x02, 0xaa, 0, 0, 0, 4]);
/// The host's MAC (the kernel's side of the host port).
pub const KERNEL: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0x99]);

/// One family's addresses on the node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Pod A (10.244.1.2, fd00:10:244:1::2).
    pub a: IpAddr,
    /// Pod B (.3).
    pub b: IpAddr,
    /// A pod on the other node (10.244.2.2, fd00:10:244:2::2).
    pub remote: IpAddr,
    /// The gateway, `cni0` (.1).
    pub gw: IpAddr,
    /// This node, `eth0` (172.18.0.2, fd00:172:18::2).
    pub node: IpAddr,
    /// The other node (.3).
    pub peer: IpAddr,
    /// The default gateway (.1).
    pub default_gw: IpAddr,
    /// A host outside the cluster (192.0.2.10, 2001:db8::10).
    pub outside: IpAddr,
    /// A client outside the cluster (192.0.2.20, 2001:db8::20).
    pub client: IpAddr,
    /// The cluster's pod CIDR (10.244.0.0/16, fd00:10:244::/56).
    pub cluster: (IpAddr, u8),
    /// A node's pod network's prefix length (24, 64).
    pub pod_len: u8,
    /// The Service CIDR's first address (10.96.0.0, fd00:10:96::); see [`Plan::svc`].
    pub services: IpAddr,
    /// The host port's own address, tapyard's side (169.254.0.1, fd00:a9fe::1), with
    /// [`KubeOptions::host_port`].
    pub host_gw: IpAddr,
}

const fn v4(a: u8, b: u8, c: u8, d: u8) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(a, b, c, d))
}

const fn v6(s: [u16; 8]) -> IpAddr {
    IpAddr::V6(Ipv6Addr::new(
        s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7],
    ))
}

impl Plan {
    /// IPv4's addresses.
    pub const V4: Plan = Plan {
        a: v4(10, 244, 1, 2),
        b: v4(10, 244, 1, 3),
        remote: v4(10, 244, 2, 2),
        gw: v4(10, 244, 1, 1),
        node: v4(172, 18, 0, 2),
        peer: v4(172, 18, 0, 3),
        default_gw: v4(172, 18, 0, 1),
        outside: v4(192, 0, 2, 10),
        client: v4(192, 0, 2, 20),
        cluster: (v4(10, 244, 0, 0), 16),
        pod_len: 24,
        services: v4(10, 96, 0, 0),
        host_gw: v4(169, 254, 0, 1),
    };

    /// IPv6's addresses.
    pub const V6: Plan = Plan {
        a: v6([0xfd00, 0x10, 0x244, 1, 0, 0, 0, 2]),
        b: v6([0xfd00, 0x10, 0x244, 1, 0, 0, 0, 3]),
        remote: v6([0xfd00, 0x10, 0x244, 2, 0, 0, 0, 2]),
        gw: v6([0xfd00, 0x10, 0x244, 1, 0, 0, 0, 1]),
        node: v6([0xfd00, 0x172, 0x18, 0, 0, 0, 0, 2]),
        peer: v6([0xfd00, 0x172, 0x18, 0, 0, 0, 0, 3]),
        default_gw: v6([0xfd00, 0x172, 0x18, 0, 0, 0, 0, 1]),
        outside: v6([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x10]),
        client: v6([0x2001, 0xdb8, 0, 0, 0, 0, 0, 0x20]),
        cluster: (v6([0xfd00, 0x10, 0x244, 0, 0, 0, 0, 0]), 56),
        pod_len: 64,
        services: v6([0xfd00, 0x10, 0x96, 0, 0, 0, 0, 0]),
        host_gw: v6([0xfd00, 0xa9fe, 0, 0, 0, 0, 0, 1]),
    };

    /// Whether this is IPv6's plan.
    pub fn is_v6(&self) -> bool {
        self.a.is_ipv6()
    }

    /// Service address `n` (0x10: 10.96.0.16, fd00:10:96::10 — the same digits read in hex
    /// over IPv6, as the tests' names have them: `svc(0x10)`, `svc(0x53)`).
    pub fn svc(&self, n: u8) -> IpAddr {
        match self.services {
            IpAddr::V4(a) => {
                let o = a.octets();
                // 0x10 → 10, 0x53 → 53: the hex digits as decimal, as the IPv4 tests wrote.
                let dec = (n >> 4) * 10 + (n & 0x0f);
                v4(o[0], o[1], o[2], dec)
            }
            IpAddr::V6(a) => {
                let mut s = a.segments();
                s[7] = u16::from(n);
                IpAddr::V6(Ipv6Addr::from(s))
            }
        }
    }

    /// A name for this family's copy of a Service: `name` over IPv4, `name6` over IPv6.
    pub fn name(&self, name: &str) -> String {
        if self.is_v6() {
            format!("{name}6")
        } else {
            name.to_string()
        }
    }
}

/// What differs between the node's uses.
#[derive(Clone, Copy, Debug, Default)]
pub struct KubeOptions<'a> {
    /// The connection tables (IPv4's; IPv6's beside it) in this file, at the clock's time.
    pub conntrack_file: Option<&'a Path>,
    /// The connection table's limits (the default's otherwise).
    pub conntrack: Option<CtConfig>,
    /// The bridge's FDB limit.
    pub fdb_max_entries: Option<usize>,
    /// The limit of client-affinity entries.
    pub max_affinity_entries: Option<usize>,
    /// A host port `host0` ([`HOST0`], [`HOST_MAC`], address [`Plan::host_gw`] /32 or
    /// /128), the host behind it holding the node's address ([`Plan::node`], as the uplink
    /// does) at [`KERNEL`] (a static neighbour).
    pub host_port: bool,
    /// No conntrack and NAT: a plain router (the NAT options above are then unused).
    pub without_nat: bool,
}

/// The node's interfaces, for a test that adds routes or neighbours, and how its table
/// file was opened.
#[derive(Clone, Debug)]
pub struct Ifaces {
    /// `cni0`.
    pub cni0: IfaceId,
    /// `eth0`.
    pub eth0: IfaceId,
    /// `host0`, with [`KubeOptions::host_port`].
    pub host0: Option<IfaceId>,
    /// With [`KubeOptions::conntrack_file`]: whether the IPv4 table was made or reused.
    pub opened: Option<Opened>,
}

/// The node (see the module docs), its clock at 1 s, or at the real clock's time when its
/// tables are in a file; the pods have announced themselves, so `cni0` knows their ports.
pub fn kube_node(opts: KubeOptions<'_>) -> Node<Ifaces> {
    let mut b = Datapath::builder();
    let now = match opts.conntrack_file {
        Some(f) => {
            let now = Clock::new().now();
            b.conntrack_file(f, now);
            now
        }
        None => Instant::from_secs(1),
    };
    let mut bc = BridgeConfig::new("cni0");
    if let Some(n) = opts.fdb_max_entries {
        bc.fdb_max_entries = n;
    }
    let br = b.add_bridge(bc).expect("cni0");
    assert_eq!(b.add_port("pod-a", Some(br)).expect("pod-a"), PA);
    assert_eq!(b.add_port("pod-b", Some(br)).expect("pod-b"), PB);
    let iface = |name: &str, mac, p: fn(&Plan) -> IpAddr, len: u8| {
        let (IpAddr::V4(a4), IpAddr::V6(a6)) = (p(&Plan::V4), p(&Plan::V6)) else {
            unreachable!()
        };
        let mut c = IfaceConfig::new(name, mac, a4, len);
        c.addr6 = Some((a6, 64));
        c
    };
    let (cni0, _) = b
        .add_router_iface(iface("cni0", GW_MAC, |p| p.gw, 24), Some(br))
        .expect("cni0's address");
    let (eth0, port) = b
        .add_router_iface(iface("eth0", UP_MAC, |p| p.node, 24), None)
        .expect("eth0");
    assert_eq!(port, ETH0);
    let host0 = opts.host_port.then(|| {
        let (IpAddr::V4(g4), IpAddr::V6(g6)) = (Plan::V4.host_gw, Plan::V6.host_gw) else {
            unreachable!()
        };
        let mut c = IfaceConfig::new("host0", HOST_MAC, g4, 32);
        c.addr6 = Some((g6, 128));
        let (host0, port) = b.add_router_iface(c, None).expect("host0");
        assert_eq!(port, HOST0);
        b.host_port(host0, &[Plan::V4.node, Plan::V6.node])
            .expect("the host port");
        host0
    });
    let prefix4 = |(a, len): (IpAddr, u8)| match a {
        IpAddr::V4(a) => Prefix::new(a, len),
        IpAddr::V6(_) => unreachable!(),
    };
    let prefix6 = |(a, len): (IpAddr, u8)| match a {
        IpAddr::V6(a) => Prefix::new(a, len),
        IpAddr::V4(_) => unreachable!(),
    };
    let (c4, c6) = (prefix4(Plan::V4.cluster), prefix6(Plan::V6.cluster));
    let mut cfg = NatConfig {
        rules: NatRules {
            cluster_cidr: Some(c4),
            masquerade: vec![MasqueradeRule {
                out: eth0,
                src: Some(c4),
                except_dst: Some(c4),
            }],
            cluster_cidr6: Some(c6),
            masquerade6: vec![MasqueradeRule {
                out: eth0,
                src: Some(c6),
                except_dst: Some(c6),
            }],
            ..NatRules::default()
        },
        ..NatConfig::default()
    };
    if let Some(ct) = opts.conntrack {
        cfg.conntrack = ct;
    }
    if opts.max_affinity_entries.is_some() {
        cfg.max_affinity_entries = opts.max_affinity_entries;
    }
    if !opts.without_nat {
        b.netfilter(cfg).expect("netfilter");
    }
    let opened = b.recovery::<Ipv4Addr>().map(|r| r.opened.clone());
    let dp = b.build();
    let c = dp.control();
    for p in [Plan::V4, Plan::V6] {
        // The other node's pod network (the remote pod's, host bits cleared) and the default.
        let remote_net = match p.remote {
            IpAddr::V4(a) => IpAddr::V4(Ipv4Addr::from(u32::from(a) & !0xff)),
            IpAddr::V6(a) => IpAddr::V6(Ipv6Addr::from(u128::from(a) & !0xffff_ffff_ffff_ffff)),
        };
        for (dst, len, via) in [
            (remote_net, p.pod_len, p.peer),
            (p.services, 0, p.default_gw),
        ] {
            let dst = if len == 0 { unspecified(dst) } else { dst };
            match (dst, via) {
                (IpAddr::V4(d), IpAddr::V4(v)) => {
                    c.add_route(static_route(d, len, eth0, v)).expect("a route")
                }
                (IpAddr::V6(d), IpAddr::V6(v)) => {
                    c.add_route(static_route(d, len, eth0, v)).expect("a route")
                }
                _ => unreachable!(),
            }
        }
        for (i, ip, mac) in [
            (cni0, p.a, POD_A),
            (cni0, p.b, POD_B),
            (eth0, p.peer, PEER),
            (eth0, p.default_gw, OUTGW),
        ] {
            c.add_static_neigh(i, ip, mac, now).expect("a neighbour");
        }
        if let Some(h) = host0 {
            c.add_static_neigh(h, p.node, KERNEL, now)
                .expect("the host's neighbour");
        }
    }
    let mut n = Node::with(
        dp,
        Ifaces {
            cni0,
            eth0,
            host0,
            opened,
        },
    );
    n.now = now;
    for (p, mac) in [(PA, POD_A), (PB, POD_B)] {
        n.announce(p, mac);
    }
    n
}

fn unspecified(a: IpAddr) -> IpAddr {
    match a {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    }
}

fn static_route<A>(prefix: A, len: u8, out: IfaceId, via: A) -> Route<A> {
    Route {
        prefix,
        len,
        next_hop: NextHop::Via(out, via),
        metric: 0,
        proto: RouteProto::Static,
        src: None,
    }
}
