#![allow(unused_imports)]
use super::plan::*;
use super::translate::*;
use super::*;
use crate::capture::CaptureTap;
use crate::config::check_str;
use crate::config::diff::{self, Diff, Item, Refusal};
use crate::config::{
    self, proto_name, Config, IpCidr, NeighborCfg, PeerCfg, RouteCfg, RouteType, ServiceCfg,
};
use crate::ports::{self, Kind, Origin, PortEntry, Registry, SharedTap};
use crate::state::{self, MacFor, StateDir};
use std::net::{IpAddr, Ipv6Addr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tapyard::conntrack::CtTimeouts;
use tapyard::conntrack::Opened;
use tapyard::l3::{IfaceConfig, RaConfig, VxlanConfig, VxlanPeer};
use tapyard::l3::{IfaceId, NextHop, Route, RouteProto};
use tapyard::nat::LbAlgo;
use tapyard::nat::ServiceError;
use tapyard::nat::{MasqueradeRule, NatConfig, NatRules, PortRange, Prefix, SnatRule};
use tapyard::port::{Observed, Port, TapPort};
use tapyard::runtime::{Runtime, RuntimeConfig};
use tapyard::{BridgeConfig, BridgeId, Clock, Datapath, Instant, MacAddr, PortId};
use tapyard_cni::netlink::{Link, Netlink};

const EXAMPLE: &str = include_str!("../../../examples/node.toml");

fn cfg(src: &str) -> Config {
    let c = check_str(src);
    c.config.unwrap_or_else(|| panic!("{:?}", c.diags))
}

#[test]
fn services_map_to_the_library() {
    let c = cfg(&EXAMPLE
        .replacen("session_affinity = \"none\"", "session_affinity = \"client-ip\"\nsession_affinity_timeout = 600\nalgorithm = \"maglev\"", 1)
        .replace("external_traffic_policy = \"cluster\"", "external_traffic_policy = \"local\""));
    let web = c.services[0].spec();
    assert_eq!(web.name, "web");
    assert_eq!(web.vip, Some(std::net::Ipv4Addr::new(10, 96, 0, 10)));
    assert_eq!(
        (web.port, web.proto, web.node_port),
        (80, tapyard::wire::family::IpProto::TCP, Some(30080))
    );
    let eps: Vec<(String, bool)> = web
        .endpoints
        .iter()
        .map(|e| (e.addr.to_string(), e.local))
        .collect();
    assert_eq!(
        eps,
        [
            ("10.244.1.2:8080".to_string(), true),
            ("10.244.2.2:8080".to_string(), false)
        ]
    );
    assert_eq!(web.affinity, Some(Duration::from_secs(600)));
    assert_eq!(web.algo, LbAlgo::Maglev);
    assert!(web.external_local);
    let dns = c.services[1].spec();
    assert_eq!(
        (dns.port, dns.proto, dns.node_port),
        (53, tapyard::wire::family::IpProto::UDP, None)
    );
    assert_eq!(dns.affinity, None);
    assert_eq!(dns.algo, LbAlgo::Random);
    assert!(!dns.external_local);
    assert!(dns.endpoints[0].local);
}

#[test]
fn a_refused_service_names_the_file_line_and_key() {
    let c = cfg(EXAMPLE);
    let web = &c.services[0];
    let line = |key: &str| {
        EXAMPLE
            .lines()
            .position(|l| l.starts_with(&format!("{key} =")))
            .unwrap()
            + 1
    };
    let e = ServiceError::DuplicateNodePort {
        service: "web".into(),
        node_port: 30080,
        proto: 6,
        other: "other".into(),
    };
    let msg = service_error(std::path::Path::new("node.toml"), web, &e);
    assert_eq!(
        msg,
        format!(
            "node.toml:{}: service \"web\": node_port 30080/TCP already used by service \"other\" (config key node_port)",
            line("node_port")
        )
    );
    let e = ServiceError::DuplicateVip {
        service: "web".into(),
        vip: web.vip4().unwrap().into(),
        port: 80,
        proto: 6,
        other: "x".into(),
    };
    let msg = service_error(std::path::Path::new("node.toml"), web, &e);
    let cluster_ip_line = EXAMPLE
        .lines()
        .position(|l| l.starts_with("cluster_ip = \"10.96.0.10\""))
        .unwrap()
        + 1;
    assert!(
        msg.starts_with(&format!(
            "node.toml:{cluster_ip_line}: service \"web\": vip:port"
        )),
        "{msg}"
    );
    assert!(msg.ends_with("(config key cluster_ip)"), "{msg}");
}

/// An IPv6 frontend or endpoint the library refuses is reported at the line of the
/// ClusterIP or the endpoint of that family.
#[test]
fn a_refused_ipv6_service_names_the_line_of_its_family() {
    let text = include_str!("../../../examples/node-dual-stack.toml").replace(
        "cluster_ip = [\"10.96.0.10\", \"fd00:10:96::a\"]",
        "cluster_ip = [\n  \"10.96.0.10\",\n  \"fd00:10:96::a\",\n]",
    ).replace(
        "endpoints = [\"10.244.1.2:8080\", \"10.244.2.2:8080\", \"[fd00:10:244:1::2]:8080\", \"[fd00:10:244:2::2]:8080\"]",
        "endpoints = [\n  \"10.244.1.2:8080\",\n  \"[fd00:10:244:1::2]:8080\",\n  \"10.244.2.2:8080\",\n  \"[fd00:10:244:2::2]:8080\",\n]",
    );
    let c = cfg(&text);
    let web = c.services.iter().find(|s| s.name == "web").unwrap();
    let line = |pat: &str| text.lines().position(|l| l.contains(pat)).unwrap() + 1;
    let file = std::path::Path::new("node.toml");
    let vip6: std::net::Ipv6Addr = "fd00:10:96::a".parse().unwrap();
    let e = ServiceError::DuplicateVip {
        service: "web".into(),
        vip: vip6.into(),
        port: 80,
        proto: 6,
        other: "web6".into(),
    };
    let msg = service_error(file, web, &e);
    assert!(
        msg.starts_with(&format!(
            "node.toml:{}: service \"web\": vip6:port [fd00:10:96::a]:80/TCP",
            line("\"fd00:10:96::a\",")
        )),
        "{msg}"
    );
    assert!(msg.ends_with("(config key cluster_ip)"), "{msg}");
    let e = ServiceError::BadVip {
        service: "web".into(),
        vip: std::net::Ipv4Addr::new(10, 96, 0, 10).into(),
    };
    assert!(service_error(file, web, &e)
        .starts_with(&format!("node.toml:{}:", line("\"10.96.0.10\","))));
    let e = ServiceError::DuplicateEndpoint {
        service: "web".into(),
        endpoint: "[fd00:10:244:2::2]:8080".parse().unwrap(),
    };
    let msg = service_error(file, web, &e);
    assert!(
        msg.starts_with(&format!(
            "node.toml:{}:",
            line("\"[fd00:10:244:2::2]:8080\",")
        )),
        "{msg}"
    );
    assert!(msg.ends_with("(config key endpoints)"), "{msg}");
    let e = ServiceError::NoClusterIp {
        service: "web".into(),
        field: "endpoints6",
    };
    assert!(service_error(file, web, &e).starts_with(&format!(
        "node.toml:{}:",
        line("\"[fd00:10:244:2::2]:8080\",")
    )));
}

/// The dual-stack example builds: the interfaces' IPv6 addresses (and RA on cni0), the
/// IPv6 routes beside the IPv4 ones, as `ip -6 route` prints them.
#[test]
fn dual_stack_config_builds_the_ipv6_router() {
    let dir = std::env::temp_dir().join(format!("tapyard-plan6-{}", std::process::id()));
    let text = include_str!("../../../examples/node-dual-stack.toml").replace(
        "name = \"node-a\"\n",
        &format!("name = \"node-a\"\nstate_dir = \"{}\"\n", dir.display()),
    );
    let mut c = cfg(&text);
    c.routes.push(
        cfg(&format!(
            "{text}\n[[route]]\nto = \"fd00:99::/64\"\nvia = \"fe80::1\"\ndev = \"eth0\"\n"
        ))
        .routes
        .pop()
        .unwrap(),
    );
    let built = Plan::new(c, PathBuf::from("x.toml"), &[])
        .unwrap()
        .build(None)
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let dp = &built.dp;
    let r = dp.control().router().unwrap();
    let cni0 = dp.control().iface_by_name("cni0").unwrap();
    let eth0 = dp.control().iface_by_name("eth0").unwrap();
    assert_eq!(
        r.iface_addr::<std::net::Ipv6Addr>(cni0),
        Some(("fd00:10:244:1::1".parse().unwrap(), 64))
    );
    assert_eq!(
        r.iface_addr::<std::net::Ipv6Addr>(eth0),
        Some(("fd00:172:18::2".parse().unwrap(), 64))
    );
    assert!(r
        .link_local(cni0)
        .unwrap()
        .to_string()
        .starts_with("fe80::"));
    let mut text = String::new();
    dp.control().fmt_routes(&mut text).unwrap();
    for want in [
        "10.244.2.0/24 via 172.18.0.3 dev eth0",
        "fd00:10:244:2::/64 via fd00:172:18::3 dev eth0",
        "fd00:99::/64 via fe80::1 dev eth0",
        "default via fd00:172:18::1 dev eth0",
        "fd00:10:244:1::/64 dev cni0",
    ] {
        assert!(text.contains(want), "no {want:?} in\n{text}");
    }
}

/// The IPv6-only example builds: its interfaces have no IPv4 address and no IPv4
/// connected route; the NAT rules have no IPv4 masquerade.
#[test]
fn ipv6_only_config_builds_a_router_without_ipv4() {
    let dir = std::env::temp_dir().join(format!("tapyard-plan6only-{}", std::process::id()));
    let text = include_str!("../../../examples/node-ipv6-only.toml").replace(
        "name = \"node-a\"\n",
        &format!("name = \"node-a\"\nstate_dir = \"{}\"\n", dir.display()),
    );
    let c = cfg(&text);
    let rules = to_nat_rules(&c, |n| (n == "eth0").then_some(IfaceId(1))).unwrap();
    assert!(rules.masquerade.is_empty() && rules.cluster_cidr.is_none());
    assert_eq!(rules.masquerade6.len(), 1);
    let built = Plan::new(c, PathBuf::from("x.toml"), &[])
        .unwrap()
        .build(None)
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let dp = &built.dp;
    let r = dp.control().router().unwrap();
    for name in ["cni0", "eth0"] {
        let i = dp.control().iface_by_name(name).unwrap();
        assert_eq!(r.iface_addr::<std::net::Ipv4Addr>(i), None);
        assert!(r.iface_addr::<std::net::Ipv6Addr>(i).is_some());
    }
    let mut text = String::new();
    dp.control().fmt_routes(&mut text).unwrap();
    assert!(text.contains("fd00:10:244:1::/64 dev cni0"), "{text}");
    assert!(
        text.contains("default via fd00:172:18::1 dev eth0"),
        "{text}"
    );
    assert!(
        !text.contains('.'),
        "an IPv4 route on an IPv6-only node:\n{text}"
    );
}

#[test]
fn the_state_dir_file_system_is_found() {
    assert_eq!(
        fs_type(std::path::Path::new("/proc/self")).as_deref(),
        Some("proc")
    );
    if std::path::Path::new("/dev/shm").is_dir() {
        assert_eq!(
            fs_type(std::path::Path::new("/dev/shm")).as_deref(),
            Some("tmpfs")
        );
    }
    assert_eq!(fs_type(std::path::Path::new("/no/such/dir")), None);
}

#[test]
fn conntrack_settings_map_to_the_library() {
    let d = cfg(EXAMPLE).conntrack;
    let linux = CtTimeouts::default();
    assert_eq!(d.max_entries, 262_144);
    assert!(!d.liberal);
    // No per-pod limit unless asked for, as Linux.
    assert_eq!(d.max_per_source, 0);
    // kube-proxy's --conntrack-tcp-timeout-established and -close-wait.
    assert_eq!(d.timeouts.tcp_established, Duration::from_secs(86_400));
    assert_eq!(d.timeouts.tcp_close_wait, Duration::from_secs(3_600));
    // Absent: Linux's defaults for the states a key stands for.
    assert_eq!(d.timeouts.tcp_syn_recv, linux.tcp_syn_recv);
    assert_eq!(d.timeouts.tcp_last_ack, linux.tcp_last_ack);
    assert_eq!(d.timeouts.tcp_close, linux.tcp_close);
    assert_eq!(
        CtTimeouts {
            tcp_established: linux.tcp_established,
            tcp_close_wait: linux.tcp_close_wait,
            ..d.timeouts
        },
        linux
    );
    let c = cfg(&format!(
        "{EXAMPLE}\n[conntrack]\nmax_entries = 1000\ntcp_syn_timeout = 20\ntcp_time_wait_timeout = 5\nudp_timeout = 7\nudp_stream_timeout = 8\nicmp_timeout = 9\ntcp_close_wait_timeout = 11\nliberal = true\n"
    ));
    let t = c.conntrack;
    assert_eq!(t.max_entries, 1000);
    assert!(t.liberal);
    let limited = cfg(&format!("{EXAMPLE}\n[conntrack]\nmax_per_source = 500\n"));
    assert_eq!(limited.conntrack.max_per_source, 500);
    assert_eq!(limited.conntrack6().max_per_source, 500);
    let s = Duration::from_secs;
    assert_eq!(
        (t.timeouts.tcp_syn_sent, t.timeouts.tcp_syn_recv),
        (s(20), s(20))
    );
    assert_eq!(
        [
            t.timeouts.tcp_time_wait,
            t.timeouts.tcp_fin_wait,
            t.timeouts.tcp_last_ack,
            t.timeouts.tcp_close
        ],
        [s(5); 4]
    );
    assert_eq!(
        (
            t.timeouts.udp,
            t.timeouts.udp_stream,
            t.timeouts.icmp,
            t.timeouts.tcp_close_wait
        ),
        (s(7), s(8), s(9), s(11))
    );
    tapyard::nat::Netfilter::new(NatConfig {
        conntrack: t,
        ..Default::default()
    })
    .unwrap();
}

#[test]
fn nat_rules_from_cluster_cidr_and_masquerade() {
    let c = cfg(EXAMPLE);
    let ids = |n: &str| match n {
        "cni0" => Some(IfaceId(0)),
        "eth0" => Some(IfaceId(1)),
        _ => None,
    };
    let r = to_nat_rules(&c, ids).unwrap();
    let cluster = Prefix::new(std::net::Ipv4Addr::new(10, 244, 0, 0), 16);
    assert_eq!(r.cluster_cidr, Some(cluster));
    assert_eq!(
        r.masquerade,
        [MasqueradeRule {
            out: IfaceId(1),
            src: Some(cluster),
            except_dst: Some(cluster)
        }]
    );
    assert!(r.snat.is_empty() && !r.random_fully);
    // An IPv4-only file: no IPv6 rules.
    assert_eq!(r.cluster_cidr6, None);
    assert!(r.masquerade6.is_empty());
    assert!(to_nat_rules(&c, |_| None)
        .unwrap_err()
        .to_string()
        .contains("[masquerade]: out = \"eth0\""));
    let mut none = c.clone();
    none.masquerade = None;
    assert!(to_nat_rules(&none, ids).unwrap().masquerade.is_empty());
    // The node-level keys, each family's node_port_addresses on its own.
    let mut all = c.clone();
    all.node.masquerade_all = true;
    all.node.random_fully = true;
    all.node.node_port_addresses = vec![
        "172.18.0.9/24"
            .parse::<crate::config::Cidr>()
            .map(crate::config::IpCidr::V4)
            .unwrap(),
        "fd00:172:18::/64"
            .parse::<crate::config::Cidr6>()
            .map(crate::config::IpCidr::V6)
            .unwrap(),
    ];
    let r = to_nat_rules(&all, ids).unwrap();
    assert!(r.masquerade_all && r.random_fully);
    assert_eq!(
        r.node_port_addresses,
        [Prefix::new(std::net::Ipv4Addr::new(172, 18, 0, 0), 24)]
    );
    assert_eq!(r.node_port_addresses6.len(), 1);
}

/// The IPv6 table follows `max_entries` on a node with an IPv6 address, is minimal on one
/// without, and `max_entries6` sets it on both; changing it needs a restart.
#[test]
fn ipv6_conntrack_size_follows_the_node_s_families() {
    let dual = include_str!("../../../examples/node-dual-stack.toml");
    let v4 = cfg(EXAMPLE);
    assert_eq!(v4.conntrack6().max_entries, crate::config::MIN_CONNTRACK6);
    assert_eq!(v4.conntrack.max_entries, 262_144);
    let c = cfg(dual);
    assert_eq!(c.conntrack6().max_entries, 262_144);
    let c = cfg(&format!("{dual}\n[conntrack]\nmax_entries = 5000\n"));
    assert_eq!(c.conntrack6().max_entries, 5000);
    assert_eq!(c.conntrack6().timeouts, c.conntrack.timeouts);
    let own = cfg(&format!(
        "{dual}\n[conntrack]\nmax_entries = 5000\nmax_entries6 = 700\n"
    ));
    assert_eq!(
        (own.conntrack.max_entries, own.conntrack6().max_entries),
        (5000, 700)
    );
    let v4own = cfg(&format!("{EXAMPLE}\n[conntrack]\nmax_entries6 = 300\n"));
    assert_eq!(v4own.conntrack6().max_entries, 300);
    let e = crate::config::diff::diff(&c, &own).unwrap_err();
    assert_eq!(e, ["[conntrack] changed: this needs a restart of tapyard"]);
    // The tables are made with them.
    let nf = tapyard::nat::Netfilter::new(NatConfig {
        conntrack: v4.conntrack,
        conntrack6: Some(v4.conntrack6()),
        ..Default::default()
    })
    .unwrap();
    assert_eq!(nf.conntrack_of::<Ipv6Addr>().config().max_entries, 64);
    assert!(nf.conntrack_of::<Ipv6Addr>().memory_bytes() < 64 << 10);
    assert!(nf
        .conntrack_of::<Ipv6Addr>()
        .fmt_dump(Instant::ZERO)
        .is_empty());
}

/// `[[snat]]`s go to the rules of their family, in file order, with their ports and
/// interface (`ip6tables -t nat -A POSTROUTING -s fd00:10:244:1::/64 -j SNAT
/// --to-source [fd00:172:18::50]:1024-65535` for the second).
#[test]
fn snat_rules_of_both_families() {
    let src = format!(
        "{}\n[[snat]]\nsrc = \"10.244.1.0/24\"\nto = \"172.18.0.50\"\nout = \"eth0\"\nports = \"5000-5999\"\n\n[[snat]]\nsrc = \"fd00:10:244:1::/64\"\nto = \"fd00:172:18::50\"\n",
        include_str!("../../../examples/node-dual-stack.toml")
    );
    let c = cfg(&src);
    let ids = |n: &str| (n == "eth0").then_some(IfaceId(1));
    let r = to_nat_rules(&c, ids).unwrap();
    assert_eq!(
        r.snat,
        [SnatRule {
            out: Some(IfaceId(1)),
            src: Prefix::new(std::net::Ipv4Addr::new(10, 244, 1, 0), 24),
            to: std::net::Ipv4Addr::new(172, 18, 0, 50),
            ports: Some(PortRange { lo: 5000, hi: 5999 }),
        }]
    );
    assert_eq!(
        r.snat6,
        [SnatRule {
            out: None,
            src: Prefix::new("fd00:10:244:1::".parse().unwrap(), 64),
            to: "fd00:172:18::50".parse().unwrap(),
            // No range given: iptables' default, the original port's class.
            ports: None,
        }]
    );
    // A reload that changes them sets the rules anew.
    let d = crate::config::diff::diff(
        &cfg(include_str!("../../../examples/node-dual-stack.toml")),
        &c,
    )
    .unwrap();
    assert!(d.nat_rules, "{:?}", d.summary);
    assert!(
        d.summary.iter().any(|l| l.starts_with("snat none -> 10.244.1.0/24 to 172.18.0.50:5000-5999 out eth0, fd00:10:244:1::/64 to fd00:172:18::50")),
        "{:?}",
        d.summary
    );
}

/// A dual-stack file: the IPv6 cluster CIDR and `[masquerade]` for IPv6 too
/// (`ip6tables -t nat -A POSTROUTING -s fd00:10:244::/56 ! -d fd00:10:244::/56 -o eth0
/// -j MASQUERADE`); without `[masquerade]` none of either family.
#[test]
fn nat_rules_for_both_families() {
    let c = cfg(include_str!("../../../examples/node-dual-stack.toml"));
    let ids = |n: &str| match n {
        "cni0" => Some(IfaceId(0)),
        "eth0" => Some(IfaceId(1)),
        _ => None,
    };
    let r = to_nat_rules(&c, ids).unwrap();
    let c6 = Prefix::new("fd00:10:244::".parse().unwrap(), 56);
    assert_eq!(r.cluster_cidr6, Some(c6));
    assert_eq!(
        r.masquerade6,
        [MasqueradeRule {
            out: IfaceId(1),
            src: Some(c6),
            except_dst: Some(c6)
        }]
    );
    assert_eq!(r.masquerade.len(), 1);
    let mut none = c.clone();
    none.masquerade = None;
    let r = to_nat_rules(&none, ids).unwrap();
    assert!(r.masquerade.is_empty() && r.masquerade6.is_empty());
    assert_eq!(r.cluster_cidr6, Some(c6));
}

/// A `[[bridge.port]]` is one of the plan's TAPs, and its guard comes from the file (its
/// `ips` and `mac`), whatever its record says; `spoof_guard = false` turns it off; a port
/// of the file without one, and any other port, keep the recorded addresses and TAP MAC.
#[test]
fn a_bridge_port_of_the_file_is_guarded_with_its_addresses() {
    let dir = std::env::temp_dir().join(format!("tapyard-planguard-{}", std::process::id()));
    let text = EXAMPLE.replace(
        "name = \"node-a\"\n",
        &format!("name = \"node-a\"\nstate_dir = \"{}\"\n", dir.display()),
    );
    let c = cfg(&text);
    let plan = Plan::new(c.clone(), PathBuf::from("x.toml"), &[]).unwrap();
    assert!(
        plan.taps
            .iter()
            .any(|(_, n, t, b)| n == "pod-c" && t == "pod-c" && b.as_deref() == Some("cni0")),
        "{:?}",
        plan.taps
    );
    let entry = |name: &str, origin: Origin, ips: Vec<IpAddr>| PortEntry {
        id: PortId(7),
        name: name.into(),
        tap: name.into(),
        ifname: name.into(),
        owner: None,
        kind: Kind::Pod,
        bridge: Some("cni0".into()),
        link: Some(Link {
            index: 9,
            mac: "02:00:00:00:00:09".into(),
            mtu: 1500,
            up: true,
        }),
        netns: None,
        netns_id: None,
        origin,
        capture: Arc::default(),
        dev: None,
        offload: false,
        ips,
    };
    let recorded: Vec<IpAddr> = vec!["10.244.1.9".parse().unwrap()];
    let g = super::guard::guard_of(&c, &entry("pod-c", Origin::Config, recorded.clone()))
        .unwrap()
        .expect("pod-c is guarded");
    assert_eq!(g.mac().to_string(), "02:00:0a:f4:01:04");
    assert_eq!(
        g.ipv4(),
        ["10.244.1.4".parse::<std::net::Ipv4Addr>().unwrap()]
    );
    assert!(g.ipv6().is_empty());
    // Without `mac`: the TAP's.
    let no_mac = cfg(&text.replace("mac = \"02:00:0a:f4:01:04\"", ""));
    let g = super::guard::guard_of(&no_mac, &entry("pod-c", Origin::Config, vec![]))
        .unwrap()
        .unwrap();
    assert_eq!(g.mac().to_string(), "02:00:00:00:00:09");
    // A port of `ports` has no addresses; a CNI port has its recorded ones.
    let guard = |c: &Config, e| super::guard::guard_of(c, &e).unwrap();
    assert_eq!(guard(&c, entry("pod-a", Origin::Config, vec![])), None);
    let cni = guard(&c, entry("tap1", Origin::Cni, recorded.clone())).unwrap();
    assert_eq!(
        cni.ipv4(),
        ["10.244.1.9".parse::<std::net::Ipv4Addr>().unwrap()]
    );
    let off = cfg(&text.replacen(
        "ports = [\"pod-a\", \"pod-b\"]",
        "ports = [\"pod-a\", \"pod-b\"]\nspoof_guard = false",
        1,
    ));
    assert_eq!(guard(&off, entry("pod-c", Origin::Config, vec![])), None);
    let _ = std::fs::remove_dir_all(&dir);
}
