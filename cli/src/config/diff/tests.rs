use super::*;
use crate::config::check_str;

const EXAMPLE: &str = include_str!("../../../../examples/node.toml");

fn cfg(src: &str) -> Config {
    let c = check_str(src);
    c.config.unwrap_or_else(|| panic!("{:?}", c.diags))
}

/// The configuration recorded after a partly refused reload: the refused changes are as
/// before, the others as in the new file, so diffing it with the file again finds exactly
/// the refused ones (what the next reload retries).
#[test]
fn the_running_config_keeps_refused_changes_out() {
    let dual = include_str!("../../../../examples/node-dual-stack.toml");
    let vx = crate::config::tests::VXLAN;
    let old = cfg(&format!(
        "{dual}\n[[route]]\nto = \"fd00:99::/64\"\nvia = \"fd00:172:18::7\"\n"
    ));
    let new = cfg(&format!(
        "{}\n[[neighbor]]\nip = \"fe80::3\"\nmac = \"02:00:00:00:00:03\"\ndev = \"eth0\"\n",
        dual.replace("via = \"fd00:172:18::3\"", "via = \"fd00:172:18::4\"")
            .replace(
                "\"[fd00:10:244:2::2]:8080\"]\n\n# A dual",
                "\"[fd00:10:244:2::3]:8080\"]\n\n# A dual"
            )
            .replace("fd00:10:244::/56", "fd00:10:240::/52")
            .replace(
                "ports = [\"pod-a\", \"pod-b\"]",
                "ports = [\"pod-a\", \"pod-c\"]"
            )
    ));
    let d = diff(&old, &new).unwrap();
    assert_eq!(d.summary.len(), 7, "{:?}", d.summary);
    assert_eq!(d.items.len(), d.summary.len());
    let lines = |d: &Diff| d.summary.clone();
    // Nothing refused: the new file runs.
    let all = running(&old, &new, &[]);
    assert!(diff(&all, &new).unwrap().is_empty());
    // Everything refused, each the way the library leaves it: nothing changed.
    let route = d.routes_added[0].to;
    let metric = d.routes_added[0].metric;
    let removed = d.routes_removed.iter().find(|r| r.to != route).unwrap();
    let refuse = |item: Item, old_kept: bool| Refusal {
        item,
        reason: "no".into(),
        old_kept,
    };
    let ip = "fe80::3".parse().unwrap();
    let every = [
        refuse(Item::Route(route, metric), true),
        refuse(Item::Route(removed.to, removed.metric), true),
        refuse(Item::Neighbor("eth0".into(), ip), false),
        refuse(Item::Service("web6".into()), true),
        refuse(Item::NatRules, true),
        refuse(Item::Port("cni0".into(), "pod-b".into()), true),
        refuse(Item::Port("cni0".into(), "pod-c".into()), false),
    ];
    let none = running(&old, &new, &every);
    assert!(
        diff(&old, &none).unwrap().is_empty(),
        "{:?}",
        diff(&old, &none).unwrap().summary
    );
    assert_eq!(lines(&diff(&none, &new).unwrap()), lines(&d));
    // Only the Service and the new port refused: the next reload retries just them.
    let part = running(&old, &new, &[every[3].clone(), every[6].clone()]);
    assert_eq!(
        lines(&diff(&part, &new).unwrap()),
        [
            "port \"pod-c\" added to bridge \"cni0\"",
            "service \"web6\" changed (endpoints +[fd00:10:244:2::3]:8080 -[fd00:10:244:2::2]:8080)"
        ]
    );
    assert_eq!(diff(&old, &part).unwrap().summary.len(), 5);
    // A neighbour whose old entry could not be removed and new one not added: the old
    // one runs.
    let b = cfg(&format!(
        "{dual}\n[[neighbor]]\nip = \"fe80::3\"\nmac = \"02:00:00:00:00:03\"\ndev = \"eth0\"\n"
    ));
    let c = cfg(&format!(
        "{dual}\n[[neighbor]]\nip = \"fe80::3\"\nmac = \"02:00:00:00:00:04\"\ndev = \"eth0\"\n"
    ));
    let r = running(
        &b,
        &c,
        &[
            refuse(Item::Neighbor("eth0".into(), ip), true),
            refuse(Item::Neighbor("eth0".into(), ip), false),
        ],
    );
    assert!(diff(&b, &r).unwrap().is_empty());
    let r = running(&b, &c, &[refuse(Item::Neighbor("eth0".into(), ip), false)]);
    assert!(r.neighbors.iter().all(|n| n.ip != ip));
    // A peer refused.
    let a = cfg(vx);
    let b = cfg(&vx.replace("172.18.0.3", "172.18.0.5"));
    let ip5 = "172.18.0.5".parse().unwrap();
    let r = running(
        &a,
        &b,
        &[refuse(Item::Peer("flannel.1".into(), ip5), false)],
    );
    assert!(r.vxlans[0].peers.is_empty());
    assert_eq!(lines(&diff(&r, &b).unwrap()).len(), 1);
}

#[test]
fn vxlan_peers_are_added_and_removed_live_and_settings_need_a_restart() {
    let vx = crate::config::tests::VXLAN;
    let a = cfg(vx);
    let b = cfg(&vx.replace("172.18.0.3", "172.18.0.5"));
    let d = diff(&a, &b).unwrap();
    assert_eq!(d.peers_removed.len(), 1);
    assert_eq!(d.peers_added.len(), 1);
    assert_eq!(d.peers_added[0].1.node_ip.to_string(), "172.18.0.5");
    assert!(
        d.summary[0].contains("peer 172.18.0.3 (0a:58:0a:f4:02:00, 10.244.2.0/24) removed"),
        "{:?}",
        d.summary
    );
    let e = diff(&a, &cfg(&vx.replace("vni = 1", "vni = 2"))).unwrap_err();
    assert_eq!(
        e,
        vec![
            "vxlan \"flannel.1\" changed (vni 1 -> 2): this needs a restart of tapyard".to_string()
        ]
    );
}

#[test]
fn ipv6_routes_neighbours_and_services_are_live() {
    let dual = include_str!("../../../../examples/node-dual-stack.toml");
    let a = cfg(dual);
    let b = cfg(&format!(
        "{}\n[[neighbor]]\nip = \"fe80::3\"\nmac = \"02:00:00:00:00:03\"\ndev = \"eth0\"\n",
        dual.replace("via = \"fd00:172:18::3\"", "via = \"fd00:172:18::4\"")
            .replace(
                "\"[fd00:10:244:2::2]:8080\"]\n\n# A dual",
                "\"[fd00:10:244:2::3]:8080\"]\n\n# A dual"
            )
            .replace("fd00:10:244::/56", "fd00:10:240::/52")
    ));
    let d = diff(&a, &b).unwrap();
    assert_eq!(
        d.summary,
        [
            "route fd00:10:244:2::/64 via fd00:172:18::3 -> fd00:10:244:2::/64 via fd00:172:18::4",
            "neighbor fe80::3 lladdr 02:00:00:00:00:03 dev eth0 added",
            "service \"web6\" changed (endpoints +[fd00:10:244:2::3]:8080 -[fd00:10:244:2::2]:8080)",
            "node.cluster_cidr (IPv6) fd00:10:244::/56 -> fd00:10:240::/52"
        ]
    );
    assert!(d.nat_rules);
    assert_eq!(d.routes_added[0].via.unwrap().to_string(), "fd00:172:18::4");
    // A second ClusterIP added to a Service is a live change too.
    let c = cfg(&dual.replace(
        "cluster_ip = \"fd00:10:96::10\"",
        "cluster_ip = [\"10.96.0.11\", \"fd00:10:96::10\"]",
    ));
    assert_eq!(
        diff(&a, &c).unwrap().summary,
        ["service \"web6\" changed (settings)"]
    );
    // The bridge's IPv6 address and RA need a restart.
    let e = diff(
        &a,
        &cfg(&dual
            .replace("fd00:10:244:1::1/64", "fd00:10:244:1::fe/64")
            .replace("ra = true", "ra = false")),
    )
    .unwrap_err();
    assert_eq!(
        e,
        ["bridge \"cni0\" changed (IPv6 address fd00:10:244:1::1/64 -> fd00:10:244:1::fe/64, ra true -> false): this needs a restart of tapyard"]
    );
}

#[test]
fn identical_configs_differ_in_nothing_even_when_laid_out_differently() {
    let a = cfg(EXAMPLE);
    let b = cfg(&format!("\n\n# moved down\n{EXAMPLE}"));
    assert!(diff(&a, &b).unwrap().is_empty());
}

#[test]
fn routes_added_removed_and_changed() {
    let a = cfg(EXAMPLE);
    let src = EXAMPLE
        .replace("to = \"10.244.2.0/24\"                 # node B's pods\nvia = \"172.18.0.3\"", "to = \"10.244.2.0/24\"\nvia = \"172.18.0.4\"")
        .replace("to = \"0.0.0.0/0\"\nvia = \"172.18.0.1\"\n", "to = \"10.244.3.0/24\"\nvia = \"172.18.0.5\"\n\n[[route]]\nto = \"10.244.9.0/24\"\ntype = \"blackhole\"\n");
    let b = cfg(&src);
    let d = diff(&a, &b).unwrap();
    let added: Vec<String> = d.routes_added.iter().map(|r| r.describe()).collect();
    let removed: Vec<String> = d.routes_removed.iter().map(|r| r.describe()).collect();
    assert_eq!(
        removed,
        ["10.244.2.0/24 via 172.18.0.3", "0.0.0.0/0 via 172.18.0.1"]
    );
    assert_eq!(
        added,
        [
            "10.244.2.0/24 via 172.18.0.4",
            "10.244.3.0/24 via 172.18.0.5",
            "blackhole 10.244.9.0/24"
        ]
    );
    assert!(d.services.is_none());
    assert_eq!(d.summary.len(), 4, "{:?}", d.summary);
}

#[test]
fn neighbours_and_services() {
    let a = cfg(EXAMPLE);
    let src = format!(
        "{}\n[[neighbor]]\nip = \"172.18.0.9\"\nmac = \"02:00:00:00:00:09\"\ndev = \"eth0\"\n",
        EXAMPLE.replace("\"10.244.1.3:5353\"", "\"10.244.1.4:5353\"")
    );
    let b = cfg(&src);
    let d = diff(&a, &b).unwrap();
    assert_eq!(d.neighbors_added.len(), 1);
    assert!(d.neighbors_removed.is_empty());
    assert_eq!(
        d.services.as_ref().unwrap()[1].endpoints[0]
            .addr
            .to_string(),
        "10.244.1.4:5353"
    );
    assert!(
        d.summary.contains(
            &"service \"dns\" changed (endpoints +10.244.1.4:5353 -10.244.1.3:5353)".to_string()
        ),
        "{:?}",
        d.summary
    );
    // And back: the neighbour is removed.
    let back = diff(&b, &a).unwrap();
    assert_eq!(back.neighbors_removed.len(), 1);
}

#[test]
fn masquerade_and_cluster_cidr_are_live_and_conntrack_needs_a_restart() {
    let a = cfg(EXAMPLE);
    let no_masq = cfg(&EXAMPLE.replace("[masquerade]\nout = \"eth0\"", "# no masquerade"));
    let d = diff(&a, &no_masq).unwrap();
    assert!(d.nat_rules);
    assert!(d.services.is_none());
    assert_eq!(d.summary, ["masquerade out eth0 -> none"]);
    let back = diff(&no_masq, &a).unwrap();
    assert_eq!(back.summary, ["masquerade none -> out eth0"]);
    let wider = cfg(&EXAMPLE.replace("10.244.0.0/16", "10.240.0.0/12"));
    let d = diff(&a, &wider).unwrap();
    assert!(d.nat_rules);
    assert_eq!(
        d.summary,
        ["node.cluster_cidr 10.244.0.0/16 -> 10.240.0.0/12"]
    );
    assert!(!diff(&a, &a).unwrap().nat_rules);
    let ct = cfg(&format!("{EXAMPLE}\n[conntrack]\nmax_entries = 1024\n"));
    let e = diff(&a, &ct).unwrap_err();
    assert_eq!(e, ["[conntrack] changed: this needs a restart of tapyard"]);
}

#[test]
fn services_removed_added_and_endpoints_changed() {
    let a = cfg(EXAMPLE);
    let src = EXAMPLE
        .replace(
            "endpoints = [\"10.244.1.2:8080\", \"10.244.2.2:8080\"]",
            "endpoints = [\"10.244.2.2:8080\", \"10.244.2.3:8080\"]",
        )
        .replace("name = \"dns\"", "name = \"dns2\"");
    let b = cfg(&src);
    let d = diff(&a, &b).unwrap();
    assert!(!d.nat_rules);
    let s = d.services.as_ref().unwrap();
    assert_eq!(s.len(), a.services.len(), "one removed, one added");
    assert_eq!(s[0].endpoints.len(), 2);
    assert_eq!(s[0].endpoints[1].addr.to_string(), "10.244.2.3:8080");
    assert_eq!(
        d.summary,
        [
            "service \"web\" changed (endpoints +10.244.2.3:8080 -10.244.1.2:8080)",
            "service \"dns\" was removed",
            "service \"dns2\" was added"
        ]
    );
}

#[test]
fn a_service_setting_change_is_named() {
    let a = cfg(EXAMPLE);
    let b = cfg(&EXAMPLE.replace(
        "session_affinity = \"none\"",
        "session_affinity = \"client-ip\"",
    ));
    let d = diff(&a, &b).unwrap();
    assert_eq!(d.summary, ["service \"web\" changed (settings)"]);
    assert_eq!(
        d.services.unwrap()[0].affinity,
        Some(std::time::Duration::from_secs(10_800))
    );
}

#[test]
fn topology_changes_are_refused_and_named() {
    let a = cfg(EXAMPLE);
    let b = cfg(&EXAMPLE
        .replace("10.244.1.1/24", "10.244.1.254/24")
        .replace("ports = [\"pod-a\", \"pod-b\"]", "ports = [\"pod-a\"]")
        .replace("172.18.0.2/24", "172.18.0.7/24"));
    let e = diff(&a, &b).unwrap_err();
    assert_eq!(e.len(), 2, "{e:?}");
    assert_eq!(
        e[0],
        "bridge \"cni0\" changed (address 10.244.1.1/24 -> 10.244.1.254/24): this needs a restart of tapyard"
    );
    assert!(e[0].ends_with("needs a restart of tapyard"));
    assert!(
        e[1].contains("uplink \"eth0\" changed (address 172.18.0.2/24 -> 172.18.0.7/24)"),
        "{e:?}"
    );
}

#[test]
fn ports_of_a_bridge_are_live() {
    let a = cfg(EXAMPLE);
    let b = cfg(&EXAMPLE.replace(
        "ports = [\"pod-a\", \"pod-b\"]",
        "ports = [\"pod-b\", \"pod-d\"]",
    ));
    let d = diff(&a, &b).unwrap();
    let pair = |b: &str, p: &str| (b.to_string(), p.to_string());
    assert_eq!(d.ports_removed, [pair("cni0", "pod-a")]);
    assert_eq!(d.ports_added, [pair("cni0", "pod-d")]);
    assert_eq!(
        d.summary,
        [
            "port \"pod-a\" removed from bridge \"cni0\"",
            "port \"pod-d\" added to bridge \"cni0\""
        ]
    );
    // A bridge with no ports at all (its pods come through the CNI plugin).
    let c = cfg(&EXAMPLE.replace("ports = [\"pod-a\", \"pod-b\"]", ""));
    let d = diff(&a, &c).unwrap();
    assert_eq!(d.ports_removed.len(), 2);
    assert!(diff(&c, &c).unwrap().is_empty());
}

#[test]
fn a_bridges_spoof_guard_is_live_and_a_refusal_keeps_the_old_value() {
    let a = cfg(EXAMPLE);
    assert!(a.bridges[0].spoof_guard, "on by default");
    let off = EXAMPLE.replacen(
        "ports = [\"pod-a\", \"pod-b\"]",
        "ports = [\"pod-a\", \"pod-b\"]\nspoof_guard = false",
        1,
    );
    let b = cfg(&off);
    assert!(!b.bridges[0].spoof_guard);
    let d = diff(&a, &b).unwrap();
    assert_eq!(d.guards, [("cni0".to_string(), false)]);
    assert_eq!(d.summary, ["bridge \"cni0\": spoof_guard true -> false"]);
    assert_eq!(d.items, [Item::SpoofGuard("cni0".into())]);
    let refused = Refusal {
        item: Item::SpoofGuard("cni0".into()),
        reason: "x".into(),
        old_kept: true,
    };
    assert!(running(&a, &b, &[refused]).bridges[0].spoof_guard);
    // A wrong value is named with its line.
    let bad = crate::config::check_str(&off.replace("spoof_guard = false", "spoof_guard = 1"));
    let msg = format!("{:?}", bad.diags);
    assert!(bad.config.is_none() && msg.contains("spoof_guard"), "{msg}");
}

/// A `[[bridge.port]]`'s addresses change live (that port's guard alone); a refusal keeps the
/// old ones running; a port added with addresses is added, then guarded.
#[test]
fn a_bridge_ports_addresses_are_live() {
    let a = cfg(EXAMPLE);
    let b = cfg(&EXAMPLE.replace(
        "ips = [\"10.244.1.4\"]",
        "ips = [\"10.244.1.4\", \"10.244.1.40\"]",
    ));
    let d = diff(&a, &b).unwrap();
    let pair = |b: &str, p: &str| (b.to_string(), p.to_string());
    assert_eq!(d.port_guards, [pair("cni0", "pod-c")]);
    assert_eq!(
        d.summary,
        ["port \"pod-c\" of bridge \"cni0\": ips [10.244.1.4] mac 02:00:0a:f4:01:04 -> ips [10.244.1.4, 10.244.1.40] mac 02:00:0a:f4:01:04"]
    );
    assert_eq!(d.items, [Item::PortGuard("cni0".into(), "pod-c".into())]);
    assert!(d.ports_added.is_empty() && d.guards.is_empty());
    let refused = Refusal {
        item: Item::PortGuard("cni0".into(), "pod-c".into()),
        reason: "x".into(),
        old_kept: true,
    };
    let run = running(&a, &b, &[refused]);
    assert_eq!(
        run.bridges[0].port_def("pod-c"),
        a.bridges[0].port_def("pod-c")
    );
    assert_eq!(diff(&run, &b).unwrap().port_guards, [pair("cni0", "pod-c")]);
    // Added with addresses: the port, then its guard.
    let c = cfg(&format!(
        "{EXAMPLE}\n[[bridge]]\nname = \"br1\"\n\n[[bridge.port]]\nname = \"pod-e\"\n"
    ));
    let e = cfg(&format!(
        "{EXAMPLE}\n[[bridge]]\nname = \"br1\"\n\n[[bridge.port]]\nname = \"pod-e\"\n\n[[bridge.port]]\nname = \"pod-f\"\nips = [\"fd00::6\"]\n"
    ));
    let d = diff(&c, &e).unwrap();
    assert_eq!(d.ports_added, [pair("br1", "pod-f")]);
    assert_eq!(d.port_guards, [pair("br1", "pod-f")]);
    // A refused addition leaves neither the port nor its addresses running: retried whole.
    let refused = Refusal {
        item: Item::Port("br1".into(), "pod-f".into()),
        reason: "x".into(),
        old_kept: false,
    };
    let run = running(&c, &e, &[refused]);
    assert!(run.bridges[1].port_def("pod-f").is_none());
    let again = diff(&run, &e).unwrap();
    assert_eq!(again.ports_added, [pair("br1", "pod-f")]);
    assert_eq!(again.port_guards, [pair("br1", "pod-f")]);
}

#[test]
fn endpoint_conditions_and_internal_policy_change_live() {
    let a = cfg(EXAMPLE);
    let src = EXAMPLE
        .replace(
            "endpoints = [\"10.244.1.2:8080\", \"10.244.2.2:8080\"]",
            "endpoints = [{ addr = \"10.244.1.2:8080\", ready = false, terminating = true }, \"10.244.2.2:8080\"]",
        )
        .replace(
            "internal_traffic_policy = \"local\"",
            "internal_traffic_policy = \"cluster\"",
        );
    let b = cfg(&src);
    let d = diff(&a, &b).unwrap();
    assert!(!d.nat_rules);
    let s = d.services.as_ref().unwrap();
    assert_eq!(
        s[0].endpoints[0].conditions,
        tapyard::nat::EndpointConditions::TERMINATING
    );
    assert!(!s[1].internal_local);
    assert_eq!(
        d.summary,
        [
            "service \"web\" changed (endpoints ~10.244.1.2:8080 serving,terminating,local)",
            "service \"dns\" changed (settings)",
        ]
    );
}

/// The node-level NAT keys change live, as NAT rules; a refused change keeps the old ones.
#[test]
fn node_nat_keys_are_live_nat_rule_changes() {
    let old = cfg(EXAMPLE);
    let new = cfg(&EXAMPLE.replacen(
        "cluster_cidr = \"10.244.0.0/16\"",
        "cluster_cidr = \"10.244.0.0/16\"\nmasquerade_all = true\nrandom_fully = true\nnode_port_addresses = [\"172.18.0.0/24\"]",
        1,
    ));
    let d = diff(&old, &new).unwrap();
    assert!(d.nat_rules);
    assert_eq!(
        d.summary,
        [
            "node.masquerade_all false -> true",
            "node.random_fully false -> true",
            "node.node_port_addresses all -> [172.18.0.0/24]",
        ]
    );
    assert!(d.items.iter().all(|i| *i == Item::NatRules));
    let refused = Refusal {
        item: Item::NatRules,
        reason: "no".into(),
        old_kept: true,
    };
    let run = running(&old, &new, &[refused]);
    assert_eq!(run.node, old.node);
    assert!(diff(&run, &new).unwrap().nat_rules);
}
