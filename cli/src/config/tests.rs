use super::*;

const EXAMPLE: &str = include_str!("../../../examples/node.toml");

fn errors(src: &str) -> Vec<String> {
    check_str(src)
        .diags
        .iter()
        .filter(|d| !d.warning)
        .map(|d| d.render("f"))
        .collect()
}

/// The `[[vxlan]]` of the issue, as Flannel sets a node up.
pub(crate) const VXLAN: &str = r#"[node]
name = "node-a"
cluster_cidr = "10.244.0.0/16"

[[bridge]]
name = "cni0"
address = "10.244.1.1/24"

[[uplink]]
name = "eth0"
address = "172.18.0.2/24"

[[vxlan]]
name = "flannel.1"
vni = 1
port = 8472
uplink = "eth0"
address = "10.244.1.0/32"
mac = "0a:58:0a:f4:01:00"

[[vxlan.peer]]
node_ip = "172.18.0.3"
vtep_mac = "0a:58:0a:f4:02:00"
pod_cidr = "10.244.2.0/24"

[[service]]
name = "web"
cluster_ip = "10.96.0.10"
port = 80
endpoints = ["10.244.2.5:8080"]
"#;

#[test]
fn vxlan_as_flannel_sets_it_up_is_valid() {
    let ch = check_str(VXLAN);
    assert_eq!(ch.diags, Vec::new());
    let c = ch.config.unwrap();
    let v = &c.vxlans[0];
    assert_eq!(
        (v.vni, v.port, v.uplink.as_str(), v.mtu),
        (1, 8472, "eth0", None)
    );
    assert_eq!(v.address.to_string(), "10.244.1.0/32");
    assert_eq!(v.src_ports, (32768, 60999));
    assert_eq!(v.peers[0].pod_cidr.to_string(), "10.244.2.0/24");
    assert_eq!(v.peers[0].lines.of("vtep_mac"), 23);
    // Defaults: port 8472, MAC from the address.
    let c = check_str(
        &VXLAN
            .replace("port = 8472\n", "")
            .replace("mac = \"0a:58:0a:f4:01:00\"\n", ""),
    );
    assert!(c.config.is_some(), "{:?}", c.diags);
}

#[test]
fn vxlan_errors_name_the_field_and_value() {
    let bad = VXLAN
        .replace("vni = 1", "vni = 16777216")
        .replace("uplink = \"eth0\"", "uplink = \"eth9\"")
        .replace("node_ip = \"172.18.0.3\"", "node_ip = \"172.18.0.2\"")
        + "\n[[vxlan.peer]]\nnode_ip = \"172.18.0.4\"\nvtep_mac = \"0a:58:0a:f4:02:00\"\npod_cidr = \"10.244.2.128/25\"\n";
    let e = errors(&bad).join("\n");
    for want in [
        "f:15: vxlan \"flannel.1\": vni = 16777216 is out of range",
        "f:17: vxlan \"flannel.1\": uplink = \"eth9\": no [[uplink]]",
        "f:22: vxlan \"flannel.1\" peer 172.18.0.2: node_ip = \"172.18.0.2\" is this node's own uplink address",
        "peer 172.18.0.4: vtep_mac = \"0a:58:0a:f4:02:00\" is already a peer's (line 23)",
        "peer 172.18.0.4: pod_cidr = \"10.244.2.128/25\" overlaps another peer's 10.244.2.0/24 (line 24)",
    ] {
        assert!(e.contains(want), "{want}\nnot in\n{e}");
    }
    let e = errors(&VXLAN.replace("mac = \"0a:58:0a:f4:01:00\"", "mtu = 1451")).join("\n");
    assert!(
        e.contains("mtu = 1451 is above uplink \"eth0\"'s MTU 1500 minus 50"),
        "{e}"
    );
    let e = errors(&VXLAN.replace(
        "pod_cidr = \"10.244.2.0/24\"",
        "pod_cidr = \"10.244.1.0/24\"",
    ))
    .join("\n");
    assert!(e.contains("overlaps this node's cni0 subnet"), "{e}");
    let e = errors(&VXLAN.replace("[[vxlan.peer]]", "[[vxlan.peer]]\nfoo = 1")).join("\n");
    assert!(e.contains("unknown field `foo`"), "{e}");
    // A Service endpoint behind a removed peer is a warning, not an error.
    let gone = VXLAN.replace("[[vxlan.peer]]\nnode_ip = \"172.18.0.3\"\nvtep_mac = \"0a:58:0a:f4:02:00\"\npod_cidr = \"10.244.2.0/24\"\n", "");
    let ch = check_str(&gone);
    assert!(ch.config.is_some(), "{:?}", ch.diags);
    assert!(ch.diags.iter().any(|d| d.warning
        && d.msg
            .contains("endpoint 10.244.2.5:8080 is in no peer's pod_cidr")));
}

/// Flannel's dual-stack node: flannel.1 over IPv4 and flannel-v6.1 over IPv6.
pub(crate) const VXLAN6: &str = r#"[node]
name = "node-a"
cluster_cidr = ["10.244.0.0/16", "fd00:10:244::/56"]

[[bridge]]
name = "cni0"
address = ["10.244.1.1/24", "fd00:10:244:1::1/64"]

[[uplink]]
name = "eth0"
address = ["172.18.0.2/24", "fd00:172:18::2/64"]

[[vxlan]]
name = "flannel.1"
uplink = "eth0"
address = "10.244.1.0/32"

[[vxlan.peer]]
node_ip = "172.18.0.3"
vtep_mac = "0a:58:0a:f4:02:00"
pod_cidr = "10.244.2.0/24"

[[vxlan]]
name = "flannel-v6.1"
uplink = "eth0"
address = "fd00:10:244:1::/128"

[[vxlan.peer]]
node_ip = "fd00:172:18::3"
vtep_mac = "0a:58:02:44:00:02"
pod_cidr = "fd00:10:244:2::/64"
"#;

#[test]
fn vxlan_over_ipv6_as_flannel_dual_stack_is_valid_and_family_checked() {
    let ch = check_str(VXLAN6);
    assert_eq!(ch.diags, Vec::new());
    let c = ch.config.unwrap();
    let v = &c.vxlans[1];
    assert!(v.address.is_v6());
    assert_eq!(v.peers[0].node_ip.to_string(), "fd00:172:18::3");
    assert_eq!(v.peers[0].pod_cidr.to_string(), "fd00:10:244:2::/64");
    // An IPv6 peer on the IPv4-underlay interface and the reverse; a pod subnet of the
    // other family.
    let mixed = VXLAN6
        .replacen(
            "node_ip = \"172.18.0.3\"",
            "node_ip = \"fd00:172:18::4\"",
            1,
        )
        .replacen(
            "node_ip = \"fd00:172:18::3\"",
            "node_ip = \"172.18.0.4\"",
            1,
        )
        .replacen(
            "pod_cidr = \"fd00:10:244:2::/64\"",
            "pod_cidr = \"10.244.3.0/24\"",
            1,
        );
    let e = errors(&mixed).join("\n");
    for want in [
        "f:19: vxlan \"flannel.1\" peer fd00:172:18::4: node_ip = \"fd00:172:18::4\" is IPv6, but this [[vxlan]]'s address = \"10.244.1.0/32\" makes its underlay IPv4",
        "f:29: vxlan \"flannel-v6.1\" peer 172.18.0.4: node_ip = \"172.18.0.4\" is IPv4, but this [[vxlan]]'s address = \"fd00:10:244:1::/128\" makes its underlay IPv6",
        "f:31: vxlan \"flannel-v6.1\" peer 172.18.0.4: pod_cidr = \"10.244.3.0/24\" is IPv4, but this [[vxlan]]'s address = \"fd00:10:244:1::/128\" is IPv6",
    ] {
        assert!(e.contains(want), "{want}\nnot in\n{e}");
    }
    // An uplink without an IPv6 address cannot carry an IPv6 underlay.
    let v4_uplink = VXLAN6.replace(
        "address = [\"172.18.0.2/24\", \"fd00:172:18::2/64\"]",
        "address = \"172.18.0.2/24\"",
    );
    let e = errors(&v4_uplink).join("\n");
    assert!(
        e.contains("f:25: vxlan \"flannel-v6.1\": uplink = \"eth0\" has no IPv6 address"),
        "{e}"
    );
    let e = errors(&VXLAN6.replace(
        "address = \"fd00:10:244:1::/128\"",
        "address = \"fd00:10:244:1::/128\"\nmtu = 1431",
    ))
    .join("\n");
    assert!(
        e.contains("mtu = 1431 is above uplink \"eth0\"'s MTU 1500 minus 70"),
        "{e}"
    );
    // Overlapping IPv6 pod subnets and a node_ip that is this node's own.
    let e = errors(
        &(VXLAN6.replace("node_ip = \"fd00:172:18::3\"", "node_ip = \"fd00:172:18::2\"")
            + "\n[[vxlan.peer]]\nnode_ip = \"fd00:172:18::5\"\nvtep_mac = \"0a:58:02:44:00:05\"\npod_cidr = \"fd00:10:244:2::/63\"\n"),
    )
    .join("\n");
    assert!(
        e.contains("node_ip = \"fd00:172:18::2\" is this node's own uplink address"),
        "{e}"
    );
    assert!(
        e.contains("pod_cidr = \"fd00:10:244:2::/63\" overlaps another peer's fd00:10:244:2::/64"),
        "{e}"
    );
}

#[test]
fn example_parses_into_the_model() {
    let ch = check_str(EXAMPLE);
    assert_eq!(ch.errors().count(), 0, "{:?}", ch.diags);
    let c = ch.config.unwrap();
    assert_eq!(c.node.name, "node-a");
    assert_eq!(c.node.cluster_cidr.unwrap().to_string(), "10.244.0.0/16");
    assert_eq!(c.node.node_port_range, (30000, 32767));
    assert_eq!(
        c.node.socket_path(),
        PathBuf::from("/run/tapyard/node-a.sock")
    );
    assert_eq!(c.bridges[0].ports, ["pod-a", "pod-b", "pod-c"]);
    let pod_c = c.bridges[0].port_def("pod-c").unwrap();
    assert_eq!(pod_c.ips, [IpAddr::from([10, 244, 1, 4])]);
    assert_eq!(pod_c.mac, Some("02:00:0a:f4:01:04".parse().unwrap()));
    assert_eq!(c.bridges[0].address.unwrap().to_string(), "10.244.1.1/24");
    assert_eq!(c.uplinks[0].tap, "eth0");
    assert_eq!(c.routes.len(), 2);
    assert_eq!(c.routes[1].to.prefix_len(), 0);
    let web = &c.services[0];
    assert_eq!(web.proto, 6);
    assert_eq!(web.node_port, Some(30080));
    assert_eq!(web.vip4(), Some(Ipv4Addr::new(10, 96, 0, 10)));
    assert_eq!(web.endpoints.len(), 2);
    assert_eq!(c.services[1].proto, 17);
    assert_eq!(c.services[1].affinity, None);
    assert!(web.endpoints[0].local && !web.endpoints[1].local);
    assert_eq!(c.masquerade.as_ref().unwrap().out, "eth0");
    assert_eq!(
        c.connected_iface("172.18.0.3".parse().unwrap()).as_deref(),
        Some("eth0")
    );
}

const DUAL: &str = include_str!("../../../examples/node-dual-stack.toml");
const V6ONLY: &str = include_str!("../../../examples/node-ipv6-only.toml");

/// A single-stack IPv6 node: interfaces and cluster without IPv4; what could never work
/// there (an IPv4 gateway, an IPv4 Service, an IPv4 route or neighbour out of an
/// IPv6-only interface) is refused at its line.
#[test]
fn ipv6_only_example_parses_and_ipv4_items_are_refused_at_their_line() {
    let ch = check_str(V6ONLY);
    assert_eq!(ch.diags, Vec::new());
    let c = ch.config.unwrap();
    assert_eq!(c.node.cluster_cidr, None);
    assert_eq!(
        c.node.cluster_cidr6.unwrap().to_string(),
        "fd00:10:244::/56"
    );
    assert_eq!(c.bridges[0].address, None);
    assert_eq!(
        c.bridges[0].address6.unwrap().to_string(),
        "fd00:10:244:1::1/64"
    );
    assert_eq!(c.uplinks[0].address, None);
    let conn = c.connected();
    assert_eq!(conn.len(), 2);
    assert!(conn
        .iter()
        .all(|i| i.address.is_none() && i.address6.is_some()));
    assert_eq!(c.connected_iface("172.18.0.3".parse().unwrap()), None);
    let bad = format!(
        "{V6ONLY}
[[route]]
to = \"10.244.2.0/24\"
via = \"172.18.0.3\"

[[route]]
to = \"10.244.3.0/24\"
dev = \"eth0\"

[[neighbor]]
ip = \"172.18.0.9\"
mac = \"02:00:00:00:00:09\"
dev = \"eth0\"

[[neighbor]]
ip = \"fd00:172:18::9\"
mac = \"02:00:00:00:00:09\"
dev = \"eth0\"

[[service]]
name = \"web4\"
cluster_ip = \"10.96.0.10\"
port = 80
"
    );
    let line = |pat: &str| bad.lines().position(|l| l == pat).unwrap() + 1;
    let ch = check_str(&bad);
    let errs: Vec<(usize, String)> = ch.errors().map(|d| (d.line, d.msg.clone())).collect();
    let has = |l: usize, s: &str| errs.iter().any(|(x, m)| *x == l && m.contains(s));
    assert!(
        has(
            line("via = \"172.18.0.3\""),
            "no bridge or uplink has an IPv4 address"
        ),
        "{errs:?}"
    );
    assert!(
        has(line("dev = \"eth0\""), "has no IPv4 address (an IPv4 route"),
        "{errs:?}"
    );
    assert!(
        has(
            line("ip = \"172.18.0.9\"") + 2,
            "has no IPv4 address (an ARP entry"
        ),
        "{errs:?}"
    );
    assert!(
        has(
            line("cluster_ip = \"10.96.0.10\""),
            "is IPv4, and no bridge or uplink has an IPv4 address"
        ),
        "{errs:?}"
    );
    // The IPv6 neighbour on the same interface is fine.
    assert!(
        !errs.iter().any(|(_, m)| m.contains("fd00:172:18::9")),
        "{errs:?}"
    );
    // VXLAN over an IPv6-only uplink.
    let vx = format!("{V6ONLY}\n[[vxlan]]\nname = \"flannel.1\"\nvni = 1\nuplink = \"eth0\"\naddress = \"10.244.1.0/32\"\n");
    let l = vx.lines().position(|l| l == "uplink = \"eth0\"").unwrap() + 1;
    assert!(
        check_str(&vx).errors().any(|d| d.line == l
            && d.msg
                .contains("has no IPv4 address, but address = \"10.244.1.0/32\" is IPv4")),
        "{:?}",
        check_str(&vx).diags
    );
    // VXLAN over IPv6 (Flannel's flannel-v6.1) on the same IPv6-only uplink is fine.
    let vx6 = format!("{V6ONLY}\n[[vxlan]]\nname = \"flannel-v6.1\"\nvni = 1\nuplink = \"eth0\"\naddress = \"fd00:10:244:1::/128\"\n");
    let first = vx6
        .lines()
        .position(|l| l == "name = \"flannel-v6.1\"")
        .unwrap()
        + 1;
    assert!(
        !check_str(&vx6).errors().any(|d| d.line >= first),
        "{:?}",
        check_str(&vx6).diags
    );
    // An IPv4 bridge in an IPv6-only cluster.
    let ch = check_str(&V6ONLY.replace(
        "address = \"fd00:10:244:1::1/64\"",
        "address = [\"10.244.1.1/24\", \"fd00:10:244:1::1/64\"]",
    ));
    assert!(
        ch.errors()
            .any(|d| d.msg.contains("node.cluster_cidr has no IPv4 prefix")),
        "{:?}",
        ch.diags
    );
}

#[test]
fn dual_stack_example_parses_into_the_model() {
    let ch = check_str(DUAL);
    assert_eq!(ch.diags, Vec::new());
    let c = ch.config.unwrap();
    assert_eq!(c.node.cluster_cidr.unwrap().to_string(), "10.244.0.0/16");
    assert_eq!(
        c.node.cluster_cidr6.unwrap().to_string(),
        "fd00:10:244::/56"
    );
    let b = &c.bridges[0];
    assert_eq!(b.address.unwrap().to_string(), "10.244.1.1/24");
    assert_eq!(b.address6.unwrap().to_string(), "fd00:10:244:1::1/64");
    assert!(b.ra);
    assert_eq!(
        c.uplinks[0].address6.unwrap().to_string(),
        "fd00:172:18::2/64"
    );
    let routes: Vec<String> = c.routes.iter().map(|r| r.describe()).collect();
    assert_eq!(
        routes,
        [
            "10.244.2.0/24 via 172.18.0.3",
            "fd00:10:244:2::/64 via fd00:172:18::3",
            "0.0.0.0/0 via 172.18.0.1",
            "::/0 via fd00:172:18::1"
        ]
    );
    let web6 = &c.services[0];
    assert_eq!(web6.vip4(), None);
    assert_eq!(web6.vip6(), Some("fd00:10:96::10".parse().unwrap()));
    let spec6 = web6.spec();
    assert!(!spec6.has_frontend::<std::net::Ipv4Addr>());
    assert_eq!(spec6.vip6, web6.vip6());
    assert!(spec6.endpoints.is_empty());
    assert_eq!(spec6.endpoints6.len(), 2);
    assert_eq!((spec6.port, spec6.node_port), (80, Some(30086)));
    let eps: Vec<(String, bool)> = web6
        .endpoints
        .iter()
        .map(|e| (e.addr.to_string(), e.local))
        .collect();
    assert_eq!(
        eps,
        [
            ("[fd00:10:244:1::2]:8080".to_string(), true),
            ("[fd00:10:244:2::2]:8080".to_string(), false)
        ]
    );
    let web = &c.services[1];
    assert_eq!(web.describe_frontends(), "10.96.0.10:80,[fd00:10:96::a]:80");
    // Each frontend takes the endpoints of its family.
    let spec = web.spec();
    assert_eq!(spec.vip, Some(Ipv4Addr::new(10, 96, 0, 10)));
    assert_eq!(spec.vip6, Some("fd00:10:96::a".parse().unwrap()));
    assert_eq!(spec.endpoints.len(), 2);
    assert_eq!(
        spec.endpoints6.len(),
        web.endpoints.iter().filter(|e| e.addr.is_ipv6()).count()
    );
    assert_eq!(web.lines.of("cluster_ip.1"), web.lines.of("cluster_ip"));
    // A single string is the same as a list of one.
    let one = check_str(&DUAL.replace(
        "cluster_cidr = [\"10.244.0.0/16\", \"fd00:10:244::/56\"]",
        "cluster_cidr = \"10.244.0.0/16\"",
    ));
    assert!(one.config.as_ref().unwrap().node.cluster_cidr6.is_none());
    // Without IPv6 on the bridge the pods are outside the cluster: a warning.
    assert!(one.diags.iter().all(|d| d.warning), "{:?}", one.diags);
    // Link-local gateways with their interface, static NDP entries.
    let ll = check_str(&format!(
        "{DUAL}\n[[route]]\nto = \"fd00:99::/64\"\nvia = \"fe80::1\"\ndev = \"eth0\"\n\n[[neighbor]]\nip = \"fe80::1\"\nmac = \"02:00:00:00:00:01\"\ndev = \"eth0\"\n\n[[neighbor]]\nip = \"fd00:172:18::3\"\nmac = \"02:00:00:00:00:03\"\ndev = \"eth0\"\n"
    ));
    assert_eq!(ll.errors().count(), 0, "{:?}", ll.diags);
    assert_eq!(
        ll.config.unwrap().neighbors[1].ip.to_string(),
        "fd00:172:18::3"
    );
}

#[test]
fn every_error_is_reported_with_its_line() {
    let src = "[node]\nname = \"n\"\ncluster_cidr = \"10.244.0.0/16\"\nbogus = 1\n\n[[bridge]]\nname = \"cni0\"\naddress = \"10.244.1.300/24\"\nports = [\"a\"]\ncolor = \"red\"\n";
    let e = errors(src);
    assert_eq!(e.len(), 3, "{e:?}");
    assert!(
        e[0].starts_with("f:4: [node]: unknown field `bogus`"),
        "{e:?}"
    );
    assert!(
        e[1].starts_with(
            "f:8: bridge \"cni0\": address = \"10.244.1.300/24\" has \"10.244.1.300\""
        ),
        "{e:?}"
    );
    assert!(
        e[2].starts_with("f:10: bridge \"cni0\": unknown field `color`"),
        "{e:?}"
    );
}

#[test]
fn syntax_errors_have_lines() {
    let e = errors("[node]\nname = \"n\"\ncluster_cidr = = 3\n");
    assert!(e[0].starts_with("f:3: TOML syntax"), "{e:?}");
}

#[test]
fn no_panic_on_truncated_or_mangled_files() {
    for (i, _) in EXAMPLE.char_indices() {
        let _ = check_str(&EXAMPLE[..i]);
    }
    let lines: Vec<&str> = EXAMPLE.lines().collect();
    for junk in [
        "= =",
        "[[",
        "x = [1, \"a\"]",
        "ports = 3",
        "port = -1",
        "port = 99999999999999999999",
        "[node.x]",
        "\u{0}",
    ] {
        for i in 0..lines.len() {
            let mut l = lines.clone();
            l[i] = junk;
            let ch = check_str(&l.join("\n"));
            assert!(ch.config.is_none() || ch.errors().count() == 0);
        }
    }
}

#[test]
fn cidr_relations() {
    let a: Cidr = "10.244.0.0/16".parse().unwrap();
    let b: Cidr = "10.244.1.1/24".parse().unwrap();
    assert!(a.covers(&b) && !b.covers(&a) && a.overlaps(&b) && b.overlaps(&a));
    assert!(!b.overlaps(&"10.244.2.1/24".parse().unwrap()));
    assert!("10.0.0.0/33".parse::<Cidr>().is_err());
    assert_eq!(LineMap::new("a\nb\nc").line(2), 2);
}

#[test]
fn the_per_pod_connection_limit_is_checked() {
    let e = errors(&format!("{EXAMPLE}\n[conntrack]\nmax_per_source = -1\n")).join("\n");
    assert!(e.contains("max_per_source = -1 is out of range"), "{e}");
    let e = errors(&format!(
        "{EXAMPLE}\n[conntrack]\nmax_per_source = \"many\"\n"
    ))
    .join("\n");
    assert!(e.contains("max_per_source"), "{e}");
    assert!(errors(&format!("{EXAMPLE}\n[conntrack]\nmax_per_source = 1000\n")).is_empty());
}

/// A bridge with a port of `ports` and one declared as a `[[bridge.port]]`.
const PORTS: &str = r#"[node]
name = "n"
cluster_cidr = "10.244.0.0/16"

[[bridge]]
name = "cni0"
address = "10.244.1.1/24"
ports = ["pod-a"]

[[bridge.port]]
name = "pod-b"
ips = ["10.244.1.3", "fd00:10:244:1::3", "10.244.1.30"]
mac = "02:00:0a:f4:01:03"
"#;

#[test]
fn a_bridge_port_declares_its_addresses_and_mac() {
    let ch = check_str(PORTS);
    assert_eq!(ch.diags, Vec::new());
    let c = ch.config.unwrap();
    let b = &c.bridges[0];
    assert_eq!(b.ports, ["pod-a", "pod-b"]);
    let p = b.port_def("pod-b").unwrap();
    let ips: Vec<String> = p.ips.iter().map(ToString::to_string).collect();
    assert_eq!(ips, ["10.244.1.3", "fd00:10:244:1::3", "10.244.1.30"]);
    assert_eq!(p.mac.unwrap().to_string(), "02:00:0a:f4:01:03");
    assert!(b.port_def("pod-a").is_none());
    // Name alone: a port like those of `ports`.
    let c = check_str(&PORTS.replace("ips = [", "# [").replace("mac =", "# mac ="));
    assert!(c.config.unwrap().bridges[0]
        .port_def("pod-b")
        .unwrap()
        .ips
        .is_empty());
}

#[test]
fn bad_bridge_port_addresses_and_macs_name_line_field_and_value() {
    let e = |src: String| errors(&src).join("\n");
    let ctx = "bridge \"cni0\" port \"pod-b\"";
    for (from, to, want) in [
        (
            "\"10.244.1.30\"",
            "\"10.244.1.300\"",
            format!("f:12: {ctx}: ips[2] = \"10.244.1.300\" is not an IPv4 address"),
        ),
        (
            "\"10.244.1.30\"",
            "\"224.0.0.1\"",
            format!("f:12: {ctx}: ips[2] = \"224.0.0.1\" is not a unicast host address"),
        ),
        (
            "\"10.244.1.30\"",
            "\"fe80::3\"",
            format!("f:12: {ctx}: ips[2] = \"fe80::3\" is not a unicast host address"),
        ),
        (
            "\"10.244.1.30\"",
            "\"10.244.1.3\"",
            format!("f:12: {ctx}: ips[2] = \"10.244.1.3\" is listed twice"),
        ),
        (
            "\"10.244.1.30\"",
            "\"10.244.1.5\", \"10.244.1.6\", \"10.244.1.7\", \"10.244.1.8\"",
            format!("f:12: {ctx}: ips has 5 IPv4 addresses, at most 4 of each family"),
        ),
        (
            "mac = \"02:00:0a:f4:01:03\"",
            "mac = \"01:00:5e:00:00:01\"",
            format!(
                "f:13: {ctx}: mac = \"01:00:5e:00:00:01\" is not a unicast, non-zero MAC address"
            ),
        ),
        (
            "mac = \"02:00:0a:f4:01:03\"",
            "mac = \"02:00\"",
            format!("f:13: {ctx}: mac = \"02:00\" is not a MAC address"),
        ),
        (
            "mac = \"02:00:0a:f4:01:03\"",
            "ip = \"10.244.1.3\"",
            format!("f:13: {ctx}: unknown field `ip`"),
        ),
        (
            "name = \"pod-b\"",
            "name = \"pod-a\"",
            "f:11: bridge \"cni0\": port \"pod-a\" is listed twice".to_string(),
        ),
        (
            "ips = [\"10.244.1.3\", \"fd00:10:244:1::3\", \"10.244.1.30\"]",
            "ips = \"10.244.1.3\"",
            format!("f:12: {ctx}: ips = \"10.244.1.3\" is a string, expected an array"),
        ),
    ] {
        let got = e(PORTS.replace(from, to));
        assert!(got.contains(&want), "{to}: expected {want:?} in\n{got}");
    }
    // A port table without a name names itself by position.
    let got = e(PORTS.replace("name = \"pod-b\"\n", ""));
    assert!(
        got.contains("f:10: bridge \"cni0\" port #1: missing field `name`"),
        "{got}"
    );
}

#[test]
fn a_bridge_ports_addresses_are_its_own() {
    let two = format!(
        "{PORTS}\n[[bridge.port]]\nname = \"pod-c\"\nips = [\"10.244.1.1\", \"fd00:10:244:1::3\"]\n"
    );
    let got = errors(&two).join("\n");
    for want in [
        "f:17: bridge \"cni0\" port \"pod-c\": ips has \"10.244.1.1\", the bridge's own address (its gateway)",
        "f:17: bridge \"cni0\" port \"pod-c\": ips has \"fd00:10:244:1::3\", already port \"pod-b\"'s (line 12)",
    ] {
        assert!(got.contains(want), "expected {want:?} in\n{got}");
    }
}

/// A dual-stack LoadBalancer Service after the dual-stack example's.
fn with_lb(extra: &str) -> String {
    format!(
        "{DUAL}\n[[service]]\nname = \"lb\"\ncluster_ip = [\"10.96.0.80\", \"fd00:10:96::80\"]\nport = 80\nendpoints = [\"10.244.1.2:8080\"]\n{extra}"
    )
}

/// The 1-based line of the first line holding `needle`.
fn line_of(src: &str, needle: &str) -> usize {
    src.lines().position(|l| l.contains(needle)).unwrap() + 1
}

#[test]
fn lb_ips_external_ips_and_source_ranges_parse_into_the_spec() {
    let src = with_lb("load_balancer_ips = [\"198.51.100.10\", \"2001:db8:5::10\"]\nexternal_ips = [\"198.51.100.20\"]\nload_balancer_source_ranges = [\"203.0.113.0/24\", \"2001:db8:1::/48\"]\n");
    let ch = check_str(&src);
    assert_eq!(ch.diags, Vec::new());
    let c = ch.config.unwrap();
    let spec = c.services.iter().find(|s| s.name == "lb").unwrap().spec();
    let ips = |v: &[IpAddr]| v.iter().map(|i| i.to_string()).collect::<Vec<_>>();
    assert_eq!(
        ips(&spec.load_balancer_ips),
        ["198.51.100.10", "2001:db8:5::10"]
    );
    assert_eq!(ips(&spec.external_ips), ["198.51.100.20"]);
    let r: Vec<String> = spec
        .load_balancer_source_ranges
        .iter()
        .map(|p| p.to_string())
        .collect();
    assert_eq!(r, ["203.0.113.0/24", "2001:db8:1::/48"]);
    // The library takes it as it is.
    tapyard::nat::Services::new(0).upsert(spec).unwrap();
}

#[test]
fn bad_lb_ips_external_ips_and_source_ranges_name_line_key_and_value() {
    let src = with_lb(concat!(
        "load_balancer_ips = [\"198.51.100.10\", \"224.0.0.1\", \"198.51.100.10\"]\n",
        "external_ips = [\"10.96.0.10\", \"nope\"]\n",
        "load_balancer_source_ranges = [\"203.0.113.0/33\"]\n",
    ));
    let e = errors(&src);
    let l = line_of(&src, "load_balancer_ips =");
    let x = line_of(&src, "external_ips =");
    let r = line_of(&src, "load_balancer_source_ranges =");
    let want = [
        format!(
            "f:{l}: service \"lb\": load_balancer_ips[1] = \"224.0.0.1\" is not a unicast address"
        ),
        format!("f:{x}: service \"lb\": external_ips[1] = \"nope\""),
        format!("f:{r}: service \"lb\": load_balancer_source_ranges[0] = \"203.0.113.0/33\""),
    ];
    for w in &want {
        assert!(
            e.iter().any(|m| m.starts_with(w.as_str())),
            "{w}\nin {e:#?}"
        );
    }
    // The cross-checks, once every item reads.
    let src = with_lb(concat!(
        "load_balancer_ips = [\"198.51.100.10\", \"198.51.100.10\"]\n",
        "external_ips = [\"10.96.0.10\", \"10.96.0.80\"]\n",
    ));
    let e = errors(&src);
    let l = line_of(&src, "load_balancer_ips =");
    let x = line_of(&src, "external_ips =");
    let web = line_of(&src, "cluster_ip = [\"10.96.0.10\"") + 1;
    assert_eq!(
        e,
        [
            format!("f:{l}: service \"lb\": load_balancer_ips[1] = \"198.51.100.10\" is listed twice, or is the Service's cluster_ip"),
            format!("f:{x}: service \"lb\": external_ips[0] = \"10.96.0.10\": 10.96.0.10:80/tcp is already service \"web\"'s (line {web})"),
            format!("f:{x}: service \"lb\": external_ips[1] = \"10.96.0.80\" is listed twice, or is the Service's cluster_ip"),
        ]
    );
    // An IPv6 address on an IPv4-only Service; ranges without LoadBalancer IPs warn.
    let src = format!("{DUAL}\n[[service]]\nname = \"lb4\"\ncluster_ip = \"10.96.0.81\"\nport = 80\nendpoints = [\"10.244.1.2:8080\"]\nexternal_ips = [\"2001:db8:5::1\"]\nload_balancer_source_ranges = [\"203.0.113.0/24\"]\n");
    let x = line_of(&src, "external_ips =");
    let ch = check_str(&src);
    let all: Vec<String> = ch.diags.iter().map(|d| d.render("f")).collect();
    assert!(all.contains(&format!("f:{x}: service \"lb4\": external_ips[0] = \"2001:db8:5::1\" is IPv6 but the Service has no IPv6 cluster_ip (a frontend needs a ClusterIP of its family, as in kube-proxy)")), "{all:#?}");
    assert!(
        all.iter()
            .any(|m| m.contains("warning") && m.contains("has no effect without load_balancer_ips")),
        "{all:#?}"
    );
}

/// `VXLAN`'s node with its `web` Service's endpoints and keys replaced.
fn with_endpoints(endpoints: &str, more: &str) -> String {
    VXLAN.replace(
        "endpoints = [\"10.244.2.5:8080\"]",
        &format!("endpoints = {endpoints}\n{more}"),
    )
}

#[test]
fn endpoints_take_conditions_in_inline_tables_beside_strings() {
    let src = with_endpoints(
        "[\"10.244.2.5:8080\", { addr = \"10.244.1.7:8080\", ready = false, serving = true, terminating = true },\n  { addr = \"10.244.2.6:8080\", local = true, ready = false }]",
        "internal_traffic_policy = \"Local\"",
    );
    let ch = check_str(&src);
    assert!(ch.errors().next().is_none(), "{:?}", ch.diags);
    let web = &ch.config.as_ref().unwrap().services[0];
    assert!(web.internal_local && !web.external_local);
    let eps: Vec<(String, bool, EndpointConditions)> = web
        .endpoints
        .iter()
        .map(|e| (e.addr.to_string(), e.local, e.conditions))
        .collect();
    let not_ready = EndpointConditions {
        ready: false,
        ..EndpointConditions::READY
    };
    assert_eq!(
        eps,
        [
            ("10.244.2.5:8080".into(), false, EndpointConditions::READY),
            // Inside cni0's subnet: local without saying so.
            (
                "10.244.1.7:8080".into(),
                true,
                EndpointConditions::TERMINATING
            ),
            // `local = true` overrides the subnet rule.
            ("10.244.2.6:8080".into(), true, not_ready),
        ]
    );
    let spec = web.spec();
    assert!(spec.internal_local);
    assert_eq!(
        spec.endpoints[1].conditions,
        EndpointConditions::TERMINATING
    );
    // The local set is the terminating 10.244.1.7 (10.244.2.6 is neither ready nor
    // terminating): no warning about ClusterIP traffic being dropped.
    assert!(
        !ch.diags.iter().any(|d| d.msg.contains("will be dropped")),
        "{:?}",
        ch.diags
    );
}

#[test]
fn bad_endpoint_tables_name_line_key_and_value() {
    let src = with_endpoints(
        "[\n  \"10.244.2.5:8080\",\n  { addr = \"10.244.2.6:0\" },\n  { addr = \"10.244.2.7:80\", ready = \"yes\" },\n  { addr = \"10.244.2.8:80\", zone = \"a\" },\n  { ready = true },\n  7,\n]",
        "internal_traffic_policy = \"sometimes\"",
    );
    let line = |pat: &str| src.lines().position(|l| l.contains(pat)).unwrap() + 1;
    let e = errors(&src);
    let has = |l: usize, s: &str| {
        e.iter()
            .any(|m| m.starts_with(&format!("f:{l}: ")) && m.contains(s))
    };
    assert!(
        has(
            line("10.244.2.6:0"),
            "service \"web\": endpoints[1].addr = \"10.244.2.6:0\" has port 0"
        ),
        "{e:?}"
    );
    assert!(
        has(
            line("ready = \"yes\""),
            "endpoints[2].ready = \"yes\" is a string, expected true or false"
        ),
        "{e:?}"
    );
    assert!(has(line("zone = \"a\""), "endpoints[3]: unknown field `zone` (expected one of: addr, ready, serving, terminating, local)"), "{e:?}");
    assert!(
        has(
            line("{ ready = true }"),
            "endpoints[4]: missing field `addr`"
        ),
        "{e:?}"
    );
    assert!(
        has(
            line("  7,"),
            "endpoints[5] = 7 is a integer, expected an IP:PORT string or a table"
        ),
        "{e:?}"
    );
    assert!(
        has(
            line("sometimes"),
            "internal_traffic_policy = \"sometimes\" is not a traffic policy"
        ),
        "{e:?}"
    );
    assert_eq!(e.len(), 6, "{e:?}");
}

#[test]
fn internal_local_without_a_usable_local_endpoint_warns() {
    let src = with_endpoints(
        "[\"10.244.2.5:8080\"]",
        "internal_traffic_policy = \"local\"",
    );
    let ch = check_str(&src);
    assert!(ch.errors().next().is_none(), "{:?}", ch.diags);
    assert!(
        ch.diags.iter().any(|d| d.warning
            && d.msg
                .contains("ClusterIP traffic on this node will be dropped")),
        "{:?}",
        ch.diags
    );
    let src = with_endpoints(
        "[{ addr = \"10.244.2.5:8080\", ready = false, serving = false }]",
        "",
    );
    let ch = check_str(&src);
    assert!(
        ch.diags.iter().any(|d| d.warning
            && d.msg
                .contains("no endpoint is ready, nor serving and terminating")),
        "{:?}",
        ch.diags
    );
}

/// `[node] masquerade_all`, `random_fully` and `node_port_addresses`: parsed into the model,
/// each bad value reported at its line with the key and the value.
#[test]
fn node_nat_keys_parse_and_bad_values_name_their_line() {
    let with = |keys: &str| {
        EXAMPLE.replacen(
            "cluster_cidr = \"10.244.0.0/16\"",
            &format!("cluster_cidr = \"10.244.0.0/16\"\n{keys}"),
            1,
        )
    };
    let c = check_str(&with(
        "masquerade_all = true\nrandom_fully = true\nnode_port_addresses = [\"172.18.0.0/24\", \"fd00:172:18::/64\"]",
    ))
    .config
    .unwrap();
    assert!(c.node.masquerade_all && c.node.random_fully);
    let np: Vec<String> = c
        .node
        .node_port_addresses
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(np, ["172.18.0.0/24", "fd00:172:18::/64"]);
    let d = check_str(EXAMPLE).config.unwrap();
    assert!(!d.node.masquerade_all && !d.node.random_fully);
    assert!(d.node.node_port_addresses.is_empty());
    // Bad values, at their lines (the keys go on lines 12 and 13).
    let e = errors(&with(
        "masquerade_all = \"yes\"\nnode_port_addresses = [\"172.18.0.0/24\", \"172.18.0.0/33\"]",
    ));
    assert!(
        e.iter()
            .any(|l| l.starts_with("f:12: [node]: masquerade_all = \"yes\" is a string")),
        "{e:?}"
    );
    assert!(
        e.iter()
            .any(|l| l.starts_with("f:13: [node]: node_port_addresses[1] = \"172.18.0.0/33\"")),
        "{e:?}"
    );
    let e = errors(&with("node_port_addresses = \"172.18.0.0/24\""));
    assert!(
        e.iter().any(|l| l.contains(
            "f:12: [node]: node_port_addresses = \"172.18.0.0/24\" is a string, expected an array"
        )),
        "{e:?}"
    );
}
