//! The plugin driven exactly as a runtime drives it: `CNI_*` variables in the environment, the
//! network configuration on stdin. The ADD/CHECK/DEL tests run as root in namespaces they
//! create, with host-local from containernetworking-plugins and a fake tapyard that makes real
//! TAPs; they skip (saying so) without root or host-local.

use crate::common::*;
use serde_json::{json, Value};

fn attachment(ns: &Netns, plugins: &std::path::Path) -> Env {
    Env {
        container_id: unique("ctr"),
        netns: ns.path(),
        ifname: "eth0".into(),
        path: format!("/nonexistent:{}", plugins.display()),
    }
}

#[test]
fn version_lists_the_supported_versions() {
    let out = run_plugin(&[("CNI_COMMAND", "VERSION")], r#"{"cniVersion":"0.4.0"}"#);
    assert_eq!(
        out.ok().json(),
        json!({"cniVersion": "0.4.0", "supportedVersions": ["0.4.0", "1.0.0"]})
    );
    let out = run_plugin(&[("CNI_COMMAND", "VERSION")], "");
    assert_eq!(out.ok().json()["cniVersion"], "1.0.0");
}

#[test]
fn bad_input_has_the_right_code_and_allocates_nothing() {
    let data = TempDir::new("tapyard-cni-");
    let netns = "/var/run/netns/tapyard-cni-does-not-exist";
    let env = Env {
        container_id: "c1".into(),
        netns: netns.into(),
        ifname: "eth0".into(),
        path: plugin_dir()
            .map(|d| d.display().to_string())
            .unwrap_or_default(),
    };
    let conf = config("1.0.0", "/nonexistent/tapyard.sock", &data.0);
    let add = env.vars("ADD");

    assert_eq!(run_plugin(&add, "{not json").error_code(), 6);
    let mut old = conf.clone();
    old["cniVersion"] = "0.3.1".into();
    assert_eq!(run_plugin(&add, &old.to_string()).error_code(), 1);
    let mut no_bridge = conf.clone();
    no_bridge.as_object_mut().unwrap().remove("bridge");
    let out = run_plugin(&add, &no_bridge.to_string());
    assert_eq!(out.error_code(), 7);
    assert!(
        out.json()["msg"].as_str().unwrap().contains("bridge"),
        "{out:?}"
    );
    let mut bad_mtu = conf.clone();
    bad_mtu["mtu"] = json!(-5);
    assert_eq!(run_plugin(&add, &bad_mtu.to_string()).error_code(), 7);
    for missing in ["CNI_COMMAND", "CNI_CONTAINERID", "CNI_NETNS", "CNI_IFNAME"] {
        let vars: Vec<_> = add.iter().copied().filter(|(k, _)| *k != missing).collect();
        let out = run_plugin(&vars, &conf.to_string());
        assert_eq!(out.error_code(), 4, "without {missing}");
        assert!(
            out.json()["msg"].as_str().unwrap().contains(missing),
            "{out:?}"
        );
    }
    // The namespace does not exist: the container is unknown, nothing is allocated.
    let out = run_plugin(&add, &conf.to_string());
    assert_eq!(out.error_code(), 3, "{out:?}");
    assert!(out.stdout.contains(netns));
    assert_eq!(data.leases(), Vec::<String>::new());
}

/// A `CNI_NETNS` that is not a network namespace: ADD and CHECK refuse it with code 4 and the
/// reason, at once (a FIFO with no writer must not block the open), before IPAM or tapyard is
/// asked anything; DEL, which never opens the namespace, still succeeds. Needs host-local (to
/// show it never ran), not root: every path here is one a user can make or open.
#[test]
fn a_cni_netns_that_is_not_a_network_namespace_is_code_4_before_ipam() {
    let Some(plugins) = plugin_dir().or_else(|| {
        skip(
            "not_a_netns",
            "host-local not found (apt-get install containernetworking-plugins)",
        )
    }) else {
        return;
    };
    let (data, scratch) = (TempDir::new("tapyard-cni-"), TempDir::new("tapyard-cni-"));
    let tapyard = FakeTapyard::start(&scratch.0);
    let fifo = scratch.0.join("fifo");
    sh(&["mkfifo", fifo.to_str().unwrap()]);
    let file = scratch.0.join("file");
    std::fs::write(&file, "not a namespace").unwrap();
    let conf = config("1.0.0", tapyard.socket(), &data.0);
    let mut check = conf.clone();
    check["prevResult"] = json!({ "cniVersion": "1.0.0",
        "interfaces": [{ "name": "eth0", "sandbox": "/var/run/netns/x" }] });
    let cases = [
        (fifo.to_str().unwrap(), "is a FIFO, not a network namespace"),
        (file.to_str().unwrap(), "not nsfs"),
        (
            scratch.0.to_str().unwrap(),
            "is a directory, not a network namespace",
        ),
        (
            "/proc/self/ns/mnt",
            "is a mount namespace, not a network namespace",
        ),
    ];
    // Far more than an answer takes; only there so a regression fails instead of hanging.
    let limit = std::time::Duration::from_secs(10);
    let mut refused = Vec::new();
    for (netns, why) in cases {
        let env = Env {
            container_id: unique("ctr"),
            netns: netns.into(),
            ifname: "eth0".into(),
            path: plugins.display().to_string(),
        };
        for (command, stdin) in [("ADD", &conf), ("CHECK", &check)] {
            let out = run_plugin_within(&env.vars(command), &stdin.to_string(), limit);
            assert_eq!(out.error_code(), 4, "{command} {netns}: {out:?}");
            let msg = out.json()["msg"].as_str().unwrap().to_string();
            assert!(
                msg.contains(netns) && msg.contains(why),
                "{command} {netns}: {msg}"
            );
        }
        assert_eq!(data.leases(), Vec::<String>::new(), "{netns}: a lease");
        // host-local leaves `lock` and `last_reserved_ip.0` even after a lease is released:
        // nothing at all means it never ran.
        assert_eq!(
            data.files(),
            Vec::<std::path::PathBuf>::new(),
            "{netns}: IPAM ran"
        );
        refused.push(env);
    }
    // DEL runs host-local (whose lock file appears then), so after every ADD.
    for env in &refused {
        run_plugin_within(&env.vars("DEL"), &conf.to_string(), limit).ok();
    }
    assert!(
        tapyard
            .served
            .lock()
            .unwrap()
            .iter()
            .all(|(cmd, _)| cmd != "port_add"),
        "tapyard was asked for a port"
    );
}

#[test]
#[cfg_attr(
    not(tapyard_root),
    ignore = "needs root: TAP devices and network namespaces (runs as root, as in CI)"
)]
fn tapyard_not_running_is_try_again_later_and_releases_the_lease() {
    let Some(plugins) = privileged("tapyard_not_running") else {
        return;
    };
    let (ns, data) = (Netns::new("tycni"), TempDir::new("tapyard-cni-"));
    let env = attachment(&ns, &plugins);
    let socket = data.0.join("nobody-listens.sock");
    let conf = config("1.0.0", socket.to_str().unwrap(), &data.0);
    let out = run_plugin(&env.vars("ADD"), &conf.to_string());
    assert_eq!(out.error_code(), 11, "{out:?}");
    assert!(out.json()["msg"]
        .as_str()
        .unwrap()
        .contains(socket.to_str().unwrap()));
    assert_eq!(
        data.leases(),
        Vec::<String>::new(),
        "the lease was not released"
    );
    assert!(!ns.has_link("eth0"));
    // DEL with tapyard down still succeeds, with or without the namespace.
    run_plugin(&env.vars("DEL"), &conf.to_string()).ok();
    let no_netns: Vec<_> = env
        .vars("DEL")
        .into_iter()
        .filter(|(k, _)| *k != "CNI_NETNS")
        .collect();
    run_plugin(&no_netns, &conf.to_string()).ok();
}

#[test]
#[cfg_attr(
    not(tapyard_root),
    ignore = "needs root: TAP devices and network namespaces (runs as root, as in CI)"
)]
fn a_refused_port_and_a_failed_route_roll_everything_back() {
    let Some(plugins) = privileged("rollback") else {
        return;
    };
    let (ns, data) = (Netns::new("tycni"), TempDir::new("tapyard-cni-"));
    let tapyard = FakeTapyard::start(&data.0);
    let env = attachment(&ns, &plugins);

    tapyard
        .refuse
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let conf = config("1.0.0", tapyard.socket(), &data.0);
    let out = run_plugin(&env.vars("ADD"), &conf.to_string());
    assert_eq!(out.error_code(), 101, "{out:?}");
    assert!(out.json()["msg"]
        .as_str()
        .unwrap()
        .contains("refused by the test"));
    assert_eq!(data.leases(), Vec::<String>::new());
    tapyard
        .refuse
        .store(false, std::sync::atomic::Ordering::SeqCst);

    // A gateway off every subnet of the pod: the route fails after the port exists.
    let mut conf = conf;
    conf["ipam"]["routes"] = json!([{ "dst": "10.99.0.0/16", "gw": "192.0.2.1" }]);
    let out = run_plugin(&env.vars("ADD"), &conf.to_string());
    assert_eq!(out.error_code(), 102, "{out:?}");
    assert!(
        out.json()["msg"].as_str().unwrap().contains("10.99.0.0/16"),
        "{out:?}"
    );
    assert_eq!(data.leases(), Vec::<String>::new(), "lease left behind");
    assert!(
        tapyard.ports.lock().unwrap().is_empty(),
        "port left in tapyard"
    );
    assert!(!ns.has_link("eth0"), "interface left in the namespace");
}

fn add_check_del(version: &str) {
    let Some(plugins) = privileged("add_check_del") else {
        return;
    };
    let (ns, data) = (Netns::new("tycni"), TempDir::new("tapyard-cni-"));
    let tapyard = FakeTapyard::start(&data.0);
    let env = attachment(&ns, &plugins);
    let conf = config(version, tapyard.socket(), &data.0);

    let out = run_plugin(&env.vars("ADD"), &conf.to_string());
    let result = out.ok().json();
    // The result, as the spec writes it.
    assert_eq!(result["cniVersion"], version);
    let port = tapyard
        .ports
        .lock()
        .unwrap()
        .values()
        .next()
        .cloned()
        .expect("a port");
    assert_eq!(
        result["interfaces"],
        json!([{ "name": "eth0", "mac": port.mac, "sandbox": ns.path() }])
    );
    let ip = &result["ips"][0];
    assert_eq!(ip["interface"], 0);
    assert_eq!(ip["gateway"], "10.244.1.1");
    let address = ip["address"].as_str().unwrap().to_string();
    assert!(
        address.starts_with("10.244.1.") && address.ends_with("/24"),
        "{address}"
    );
    assert_eq!(
        ip.get("version").map(|v| v.as_str()),
        (version == "0.4.0").then_some(Some("4"))
    );
    assert_eq!(
        result["routes"],
        json!([{ "dst": "0.0.0.0/0", "gw": "10.244.1.1" }])
    );
    assert!(result["dns"].is_object());
    assert_eq!(
        data.leases(),
        vec![address.split('/').next().unwrap().to_string()]
    );

    // The interface, for real: up, the MTU, the address, the default route via the gateway.
    let link = &ns.ip_json(&["link", "show", "eth0"])[0];
    assert!(
        link["flags"].as_array().unwrap().contains(&json!("UP")),
        "{link}"
    );
    assert_eq!(link["mtu"], 1500);
    let addrs = &ns.ip_json(&["-4", "addr", "show", "eth0"])[0]["addr_info"];
    let (local, len) = address.split_once('/').unwrap();
    assert_eq!(addrs[0]["local"], local);
    assert_eq!(addrs[0]["prefixlen"].to_string(), len);
    let default = &ns.ip_json(&["route", "show", "default"])[0];
    assert_eq!(
        (&default["gateway"], &default["dev"]),
        (&json!("10.244.1.1"), &json!("eth0"))
    );

    // CHECK with prevResult passes; an interface taken down fails it, by name.
    let mut check = conf.clone();
    check["prevResult"] = result.clone();
    run_plugin(&env.vars("CHECK"), &check.to_string()).ok();
    sh(&["ip", "-n", &ns.name, "link", "set", "eth0", "down"]);
    let out = run_plugin(&env.vars("CHECK"), &check.to_string());
    assert_eq!(out.error_code(), 103);
    assert!(
        out.json()["msg"].as_str().unwrap().contains("down"),
        "{out:?}"
    );
    sh(&["ip", "-n", &ns.name, "link", "set", "eth0", "up"]);
    // The route is gone again after `down`: CHECK names it.
    let out = run_plugin(&env.vars("CHECK"), &check.to_string());
    assert_eq!(out.error_code(), 103);
    assert!(
        out.json()["msg"].as_str().unwrap().contains("0.0.0.0/0"),
        "{out:?}"
    );

    // DEL (with prevResult, as a 1.0.0 runtime sends it) removes the lease and the port; a
    // second DEL succeeds too.
    run_plugin(&env.vars("DEL"), &check.to_string()).ok();
    assert_eq!(data.leases(), Vec::<String>::new());
    assert!(tapyard.ports.lock().unwrap().is_empty());
    assert!(!ns.has_link("eth0"));
    run_plugin(&env.vars("DEL"), &conf.to_string()).ok();
    // CHECK now fails (host-local, asked first, no longer has the lease).
    let out = run_plugin(&env.vars("CHECK"), &check.to_string());
    assert!(out.error_code() >= 100, "{out:?}");
}

#[test]
#[cfg_attr(
    not(tapyard_root),
    ignore = "needs root: TAP devices and network namespaces (runs as root, as in CI)"
)]
fn add_check_del_1_0_0() {
    add_check_del("1.0.0");
}

#[test]
#[cfg_attr(
    not(tapyard_root),
    ignore = "needs root: TAP devices and network namespaces (runs as root, as in CI)"
)]
fn add_check_del_0_4_0() {
    add_check_del("0.4.0");
}

#[test]
#[cfg_attr(
    not(tapyard_root),
    ignore = "needs root: TAP devices and network namespaces (runs as root, as in CI)"
)]
fn a_second_add_of_the_same_owner_is_refused_and_keeps_the_first() {
    let Some(plugins) = privileged("second_add") else {
        return;
    };
    let (ns, data) = (Netns::new("tycni"), TempDir::new("tapyard-cni-"));
    let tapyard = FakeTapyard::start(&data.0);
    let env = attachment(&ns, &plugins);
    let conf = config("1.0.0", tapyard.socket(), &data.0);
    let first: Value = run_plugin(&env.vars("ADD"), &conf.to_string()).ok().json();
    let out = run_plugin(&env.vars("ADD"), &conf.to_string());
    assert!(out.error_code() >= 100, "{out:?}");
    // host-local refuses a second lease for the same container and interface, so the failed
    // ADD allocated nothing and rolled back nothing: the first attachment is intact.
    let mut check = conf.clone();
    check["prevResult"] = first;
    run_plugin(&env.vars("CHECK"), &check.to_string()).ok();
    run_plugin(&env.vars("DEL"), &conf.to_string()).ok();
    assert_eq!(data.leases(), Vec::<String>::new());
    assert!(tapyard.ports.lock().unwrap().is_empty());
}
