//! End-to-end test of a single-stack IPv6 node: `tapyard run` whose bridge and uplink have
//! only IPv6 addresses, pods and an outside host in network namespaces.
//!
//! ```text
//!  pod-a fd00:221:0:1::2 ─ TAP ─┐
//!  pod-b fd00:221:0:1::3 ─ TAP ─┴ bridge (gw fd00:221:0:1::1/64, no IPv4) ┐
//!                                                     tapyard node (own ns) ┤
//!  wire ns: Linux bridge ── uplink TAP (fd00:222::2/64, no IPv4) ──────────┘
//!     └─ veth ── outside ns: fd00:222::1 (no route to the pods: what it sees of
//!                them is masqueraded)
//! ```
//!
//! Cases, each run and reported before the test fails: pod to pod (ping -6); the gateway in
//! the pod's `ip -6 neigh` with its MAC; a TCP Service on an IPv6 ClusterIP reached with the
//! client's address kept; its NodePort on the uplink's IPv6 address from the outside host;
//! pod to outside masqueraded to the uplink's IPv6 address; the gateway answers no ARP (a
//! pod that gives itself an IPv4 address finds no IPv4 router); IPv4 sent to the gateway's
//! MAC dropped as `no_route` in `show stats`, unanswered; `show routes [--json]` IPv6 only;
//! after a takeover, a pod whose entry for the gateway held a wrong MAC (STALE) has the
//! gateway's MAC at once, from its unsolicited Neighbor Advertisement.
//!
//! A second test, `cni_ipv6_only_ipam`, attaches pods with the CNI plugin and `host-local`
//! IPAM holding only an IPv6 range, on an IPv6-only node: each pod gets its IPv6 address (no
//! IPv4) and a default route via the gateway's global address (1.0.0 and 0.4.0 results);
//! the pods ping the gateway and each other (`ping -6`) and talk TCP; CHECK passes; DEL
//! removes the port and the pod's `eth0` and frees the address; an `mtu` below IPv6's 1280 is
//! refused (code 7, saying why) with the lease given back.
//!
//! Needs root, `ip`, `ping` and `python3` (the CNI test also host-local); without them it says why and passes, except with
//! `CI=true`, where it fails. Every namespace has `accept_dad=0` and addresses are added with
//! `nodad`. Names carry the process id; a guard kills the node and deletes the namespaces on
//! success and failure alike. Traffic goes only to addresses inside the namespaces the test
//! creates. Run with `flock /tmp/e2e.lock` beside other root e2e tests.

use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::time::Duration;

use crate::common::cni_plugin;
use crate::common::*;
use cni_plugin::{cni, cni_ok, leases, net_conf};

const BIN: &str = env!("CARGO_BIN_EXE_tapyard");

const GW6: &str = "fd00:221:0:1::1";
const GW_MAC: &str = "02:00:0a:dd:01:01";
const POD_A6: &str = "fd00:221:0:1::2";
const POD_B6: &str = "fd00:221:0:1::3";
const UPLINK6: &str = "fd00:222::2";
const OUTSIDE6: &str = "fd00:222::1";
const WEB6: &str = "fd00:97::10";
const NODE_PORT: u16 = 30096;

fn skip_reason() -> Option<String> {
    missing6(&[
        ("ip", "-V", "iproute2"),
        ("ping", "-V", "iputils-ping"),
        ("python3", "-V", "python3"),
    ])
}

#[derive(Clone)]
struct Names {
    id: u32,
    cni: String,
    tap_a: String,
    tap_b: String,
    uplink: String,
    ns_node: String,
    ns_a: String,
    ns_b: String,
    ns_wire: String,
    ns_out: String,
    dir: PathBuf,
    socket: PathBuf,
    config: PathBuf,
    log: PathBuf,
}

impl Names {
    fn new() -> Names {
        let id = std::process::id() % 100_000;
        let dir = std::env::temp_dir().join(format!("tapyard-v6only-{id}"));
        Names {
            id,
            cni: format!("t7c{id}"),
            tap_a: format!("t7a{id}"),
            tap_b: format!("t7b{id}"),
            uplink: format!("t7u{id}"),
            ns_node: format!("t7-node-{id}"),
            ns_a: format!("t7-a-{id}"),
            ns_b: format!("t7-b-{id}"),
            ns_wire: format!("t7-wire-{id}"),
            ns_out: format!("t7-out-{id}"),
            socket: dir.join("ctl.sock"),
            config: dir.join("node.toml"),
            log: dir.join("run.log"),
            dir,
        }
    }

    fn config(&self) -> String {
        format!(
            r#"{node}
[[bridge]]
name = "{cni}"
address = "{GW6}/64"
mac = "{GW_MAC}"
ports = ["{a}", "{b}"]

[[uplink]]
name = "{up}"
address = ["{UPLINK6}/64"]

[[route]]
to = "::/0"
via = "{OUTSIDE6}"

[[service]]
name = "web6"
cluster_ip = "{WEB6}"
port = 80
node_port = {NODE_PORT}
endpoints = ["[{POD_B6}]:8080"]

[masquerade]
out = "{up}"
"#,
            node = node_toml(
                &format!("v6only-{}", self.id),
                r#""fd00:221::/56""#,
                &self.socket,
                Some(&self.dir.join("state")),
            ),
            cni = self.cni,
            a = self.tap_a,
            b = self.tap_b,
            up = self.uplink,
        )
    }
}

/// A guard for the run's directory and its node's log.
fn guard(n: &Names) -> Guard {
    Guard::new(&n.dir, &n.log)
}

fn attach_pod(n: &Names, ns: &str, tap: &str, v6: &str) {
    ns_named(ns).attach(Some(&n.ns_node), tap, &[&format!("{v6}/64")], &[GW6]);
}

/// The uplink TAP into the wire namespace's Linux bridge, with the outside host on a veth.
fn build_wire(n: &Names) {
    let w = &n.ns_wire;
    run(&["ip", "-n", &n.ns_node, "link", "set", &n.uplink, "netns", w]);
    run(&[
        "ip",
        "-n",
        w,
        "link",
        "add",
        "br0",
        "type",
        "bridge",
        "mcast_snooping",
        "0",
    ]);
    run(&["ip", "-n", w, "link", "set", "br0", "up"]);
    run(&["ip", "-n", w, "link", "set", &n.uplink, "master", "br0"]);
    run(&["ip", "-n", w, "link", "set", &n.uplink, "up"]);
    run(&[
        "ip", "-n", w, "link", "add", "vout", "type", "veth", "peer", "name", "eth0", "netns",
        &n.ns_out,
    ]);
    run(&["ip", "-n", w, "link", "set", "vout", "master", "br0"]);
    run(&["ip", "-n", w, "link", "set", "vout", "up"]);
    addr_add6(&n.ns_out, &format!("{OUTSIDE6}/64"), "eth0");
    run(&["ip", "-n", &n.ns_out, "link", "set", "eth0", "up"]);
}

#[test]
#[cfg_attr(
    not(tapyard_root),
    ignore = "needs root: TAP devices and network namespaces (runs as root, as in CI)"
)]
fn ipv6_only_node() {
    if skip_or_fail("ipv6_only", skip_reason()) {
        return;
    }
    let n = Names::new();
    let _ = std::fs::remove_dir_all(&n.dir);
    std::fs::create_dir_all(&n.dir).unwrap();
    std::fs::write(&n.config, n.config()).unwrap();
    let check = run(&[BIN, "check", &n.config.display().to_string()]);
    assert!(check.contains("ok"), "{check}");
    let mut g = guard(&n);
    g.ns(&n.ns_node);
    g.start_node(Some(&n.ns_node), &n.config, &[], &n.socket);
    for ns in [&n.ns_a, &n.ns_b, &n.ns_wire, &n.ns_out] {
        g.ns(ns);
    }
    attach_pod(&n, &n.ns_a, &n.tap_a, POD_A6);
    attach_pod(&n, &n.ns_b, &n.tap_b, POD_B6);
    build_wire(&n);
    spawn_in(
        &mut g.children,
        &n.ns_b,
        &["python3", "-c", SERVER_PY, "b", "8080", "0"],
    );
    spawn_in(
        &mut g.children,
        &n.ns_out,
        &["python3", "-c", SERVER_PY, "out", "9000", "0"],
    );
    wait_listening(&n.ns_b, 8080);
    wait_listening(&n.ns_out, 9000);
    let (a, out) = (n.ns_a.clone(), n.ns_out.clone());
    let tapyard_ok = |args: &[&str]| tapyard_ok_at(&n.socket, args);

    let mut results: Vec<(&str, Result<(), String>)> = Vec::new();
    let mut case = |name: &'static str, f: &mut dyn FnMut()| {
        eprintln!("---- case: {name}");
        let r = std::panic::catch_unwind(AssertUnwindSafe(f)).map_err(|e| {
            e.downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "panicked".into())
        });
        results.push((name, r));
    };

    case("pod to pod (ping -6)", &mut || {
        ping_ok(&a, POD_B6);
        ping_ok(&a, GW6);
    });
    case("the gateway in the pod's ip -6 neigh", &mut || {
        let (_, text) = in_ns(&a, &["ip", "-6", "neigh", "show", GW6]);
        assert!(
            text.contains(&format!("lladdr {GW_MAC}"))
                && ["REACHABLE", "STALE", "DELAY", "PROBE"]
                    .iter()
                    .any(|s| text.contains(s)),
            "pod-a's neighbour entry for the gateway: {text}"
        );
    });
    case(
        "TCP Service on an IPv6 ClusterIP, client address kept",
        &mut || {
            let v = exchange(&a, "tcp", WEB6, 80, 3);
            assert!(v.iter().all(|(w, s)| w == "b" && s == POD_A6), "{v:?}");
        },
    );
    case("NodePort on the uplink's IPv6 address", &mut || {
        let v = exchange(&out, "tcp", UPLINK6, NODE_PORT, 2);
        // externalTrafficPolicy Cluster: the client is masqueraded, as kube-proxy does.
        assert!(v.iter().all(|(w, _)| w == "b"), "{v:?}");
    });
    case(
        "pod to outside, masqueraded to the uplink's IPv6 address",
        &mut || {
            let v = exchange(&a, "tcp", OUTSIDE6, 9000, 2);
            assert!(v.iter().all(|(w, s)| w == "out" && s == UPLINK6), "{v:?}");
        },
    );
    case("the gateway answers no ARP", &mut || {
        // The pod gives itself an IPv4 address and looks for a router at .1: no answer.
        addr_add(&a, "10.221.1.2/24", &n.tap_a);
        ping_fails(&a, "10.221.1.1");
        let (_, text) = in_ns(&a, &["ip", "-4", "neigh", "show", "10.221.1.1"]);
        assert!(
            !text.contains("lladdr"),
            "an ARP answer on an IPv6-only bridge: {text}"
        );
        run(&[
            "ip",
            "-n",
            &a,
            "addr",
            "del",
            "10.221.1.2/24",
            "dev",
            &n.tap_a,
        ]);
    });
    case(
        "IPv4 sent to the gateway's MAC is dropped and counted",
        &mut || {
            // Sent to the gateway's MAC by hand: a static neighbour and a route.
            addr_add(&a, "10.221.1.2/24", &n.tap_a);
            run(&[
                "ip",
                "-n",
                &a,
                "neigh",
                "replace",
                "10.221.1.1",
                "lladdr",
                GW_MAC,
                "dev",
                &n.tap_a,
            ]);
            ping_fails(&a, "10.221.1.1");
            run(&[
                "ip",
                "-n",
                &a,
                "addr",
                "del",
                "10.221.1.2/24",
                "dev",
                &n.tap_a,
            ]);
            let st = tapyard_ok(&["show", "stats", "--json"]);
            let v: serde_json::Value = serde_json::from_str(&st).unwrap();
            // The node has no IPv4 address and no IPv4 route: `no_route` (with no ICMP error:
            // there is no IPv4 source to send one from).
            assert!(
                v["drops"]["no_route"].as_u64().is_some_and(|d| d > 0),
                "{st}"
            );
            assert_eq!(v["router"]["icmp_errors"], 0, "{st}");
        },
    );
    case("show routes and --json: IPv6 only", &mut || {
        let text = tapyard_ok(&["show", "routes"]);
        assert!(
            text.contains(&format!("fd00:221:0:1::/64 dev {}", n.cni)),
            "{text}"
        );
        assert!(
            text.contains(&format!("default via {OUTSIDE6} dev {}", n.uplink)),
            "{text}"
        );
        assert!(!text.contains('.'), "an IPv4 route:\n{text}");
        let json = tapyard_ok(&["show", "routes", "--json"]);
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert!(v.as_array().is_some_and(|a| !a.is_empty()), "{json}");
        assert!(!json.contains("0.0.0.0"), "{json}");
    });
    case(
        "a takeover corrects a pod's wrong entry for the gateway (unsolicited NA)",
        &mut || {
            // Pod A holds a wrong MAC for its gateway, STALE (as after a node that had
            // another MAC). A takeover keeps the TAPs up (a restart takes their carrier
            // down, which flushes the pod's entries anyway); the new process announces the
            // gateway, where Linux (`ndisc_notify` 0) would announce nothing and the pod
            // would keep the wrong MAC until it next sends and its probes fail.
            let wrong = "02:00:0a:dd:01:99";
            run(&[
                "ip", "-n", &a, "-6", "neigh", "replace", GW6, "lladdr", wrong, "nud", "stale",
                "dev", &n.tap_a,
            ]);
            let neigh = || in_ns(&a, &["ip", "-6", "neigh", "show", GW6]).1;
            std::thread::sleep(Duration::from_secs(1));
            let text = neigh();
            assert!(text.contains(wrong), "the wrong entry did not stay: {text}");
            let mut old = g.node.take().expect("the node runs");
            g.children.push(
                tapyard_run(Some(&n.ns_node), &n.config, &["--takeover"], &n.log)
                    .spawn()
                    .expect("start tapyard run --takeover"),
            );
            wait_for(
                "the old process's exit",
                Duration::from_secs(20),
                || match old.try_wait().unwrap() {
                    Some(_) => Ok(()),
                    None => Err("running".into()),
                },
            );
            g.node = g.children.pop();
            wait_for_socket(g.node.as_mut(), &n.socket);
            // No traffic from the pod: only the gateway's NA can change the entry.
            wait_for(
                "pod-a's entry for the gateway after the takeover",
                Duration::from_secs(3),
                || {
                    let text = neigh();
                    match text.contains(&format!("lladdr {GW_MAC}")) {
                        true => Ok(()),
                        false => Err(text),
                    }
                },
            );
            ping_ok(&a, GW6);
        },
    );

    let failed: Vec<String> = results
        .iter()
        .filter_map(|(name, r)| r.as_ref().err().map(|e| format!("{name}: {e}")))
        .collect();
    for (name, r) in &results {
        eprintln!(
            "case {name}: {}",
            if r.is_ok() { "passed" } else { "FAILED" }
        );
    }
    assert!(failed.is_empty(), "failed cases:\n{}", failed.join("\n"));
}

/// The CNI plugin with IPv6-only IPAM on an IPv6-only node (see the module docs).
#[test]
#[cfg_attr(
    not(tapyard_root),
    ignore = "needs root: TAP devices and network namespaces (runs as root, as in CI)"
)]
fn cni_ipv6_only_ipam() {
    let why = skip_reason().or_else(|| {
        plugin_dir().is_none().then(|| {
            "host-local not found in $TAPYARD_CNI_PLUGINS, /usr/lib/cni or /opt/cni/bin".into()
        })
    });
    if skip_or_fail("cni_ipv6_only_ipam", why) {
        return;
    }
    const GW: &str = "fd00:223:0:1::1";
    let id = std::process::id() % 100_000;
    let mut n = Names::new();
    n.dir = std::env::temp_dir().join(format!("tapyard-cni-v6only-{id}"));
    n.ns_node = format!("t7k-node-{id}");
    n.socket = n.dir.join("ctl.sock");
    n.config = n.dir.join("node.toml");
    n.log = n.dir.join("run.log");
    let bridge = format!("t7k{id}");
    let _ = std::fs::remove_dir_all(&n.dir);
    std::fs::create_dir_all(n.dir.join("ipam")).unwrap();
    let node = node_toml(
        &format!("cni-v6only-{id}"),
        r#""fd00:223::/56""#,
        &n.socket,
        Some(&n.dir.join("state")),
    );
    std::fs::write(
        &n.config,
        format!("{node}\n[[bridge]]\nname = \"{bridge}\"\naddress = \"{GW}/64\"\n"),
    )
    .unwrap();
    let mut g = guard(&n);
    g.ns(&n.ns_node);
    g.start_node(Some(&n.ns_node), &n.config, &[], &n.socket);
    let pods = [format!("t7k-p1-{id}"), format!("t7k-p2-{id}")];
    for p in &pods {
        g.ns(p);
    }
    let ipam_dir = n.dir.join("ipam");
    let conf = |version: &str| {
        let ranges = serde_json::json!([[{"subnet": "fd00:223:0:1::/64", "gateway": GW}]]);
        let routes = serde_json::json!([{"dst": "::/0"}]);
        net_conf(version, &bridge, &n.socket, ranges, routes, &ipam_dir)
    };
    let leases = || leases(&ipam_dir);
    // An MTU IPv6 cannot have is refused with its reason; the lease taken is given back.
    let mut small = conf("1.0.0");
    small["mtu"] = 1000.into();
    let (ok, err) = cni("ADD", &format!("small-{id}"), &pods[0], &small);
    assert!(!ok, "ADD with mtu 1000: {err}");
    assert_eq!(err["code"], 7, "{err}");
    assert!(
        err["msg"].as_str().is_some_and(|m| m.contains("1280")),
        "{err}"
    );
    assert!(leases().is_empty(), "the lease was kept: {:?}", leases());
    let (has, _) = in_ns(&pods[0], &["ip", "link", "show", "eth0"]);
    assert!(!has, "an eth0 was left in {}", pods[0]);
    let versions = ["1.0.0", "0.4.0"];
    let mut addrs = Vec::new();
    for (i, (p, version)) in pods.iter().zip(versions).enumerate() {
        let ctr = format!("ctr{i}-{id}");
        let r = cni_ok("ADD", &ctr, p, &conf(version));
        let ips = r["ips"].as_array().cloned().unwrap_or_default();
        assert_eq!(ips.len(), 1, "ADD result: {r}");
        let a6 = ips[0]["address"].as_str().unwrap().to_string();
        assert!(
            a6.starts_with("fd00:223:0:1::") && a6.ends_with("/64"),
            "{r}"
        );
        assert_eq!(ips[0]["gateway"], GW, "{r}");
        assert_eq!(ips[0]["interface"], 0, "{r}");
        if version == "0.4.0" {
            assert_eq!(ips[0]["version"], "6", "{r}");
        }
        assert_eq!(
            r["routes"],
            serde_json::json!([{"dst": "::/0", "gw": GW}]),
            "{r}"
        );
        let (_, addr) = in_ns(p, &["ip", "-6", "addr", "show", "dev", "eth0"]);
        assert!(addr.contains(&a6) && !addr.contains("tentative"), "{addr}");
        let (_, addr4) = in_ns(p, &["ip", "-4", "addr", "show", "dev", "eth0"]);
        assert!(addr4.trim().is_empty(), "an IPv4 address on eth0: {addr4}");
        let (_, rt) = in_ns(p, &["ip", "-6", "route", "show", "default"]);
        assert!(rt.contains(&format!("via {GW} dev eth0")), "{rt}");
        let ports = tapyard_ok_at(&n.socket, &["show", "ports", "--json"]);
        assert!(ports.contains(&format!("{ctr}/eth0")), "{ports}");
        let mut c = conf(version);
        c["prevResult"] = r.clone();
        cni_ok("CHECK", &ctr, p, &c);
        addrs.push(a6.split('/').next().unwrap().to_string());
    }
    assert_eq!(leases().len(), 2, "{:?}", leases());
    for (p, other) in [(&pods[0], &addrs[1]), (&pods[1], &addrs[0])] {
        for to in [GW, other.as_str()] {
            let (ok, text) = in_ns(
                p,
                &["ping", "-6", "-n", "-c", "3", "-i", "0.2", "-W", "2", to],
            );
            assert!(
                ok && text.contains(" 0% packet loss"),
                "ping -6 {p} -> {to}:\n{text}"
            );
        }
    }
    spawn_in(
        &mut g.children,
        &pods[1],
        &["python3", "-c", SERVER_PY, "p2", "8080", "0"],
    );
    wait_listening(&pods[1], 8080);
    let v = exchange(&pods[0], "tcp", &addrs[1], 8080, 2);
    assert!(v.iter().all(|(w, s)| w == "p2" && *s == addrs[0]), "{v:?}");
    for (i, (p, version)) in pods.iter().zip(versions).enumerate() {
        let ctr = format!("ctr{i}-{id}");
        cni_ok("DEL", &ctr, p, &conf(version));
        let (has, _) = in_ns(p, &["ip", "link", "show", "eth0"]);
        assert!(!has, "eth0 left in {p}");
        assert!(
            !leases().contains(&addrs[i]),
            "the lease of {} left",
            addrs[i]
        );
        let ports = tapyard_ok_at(&n.socket, &["show", "ports", "--json"]);
        assert!(!ports.contains(&ctr), "the port of {ctr} left: {ports}");
        // DEL again: nothing to do, still a success.
        cni_ok("DEL", &ctr, p, &conf(version));
    }
    assert!(leases().is_empty(), "leases left: {:?}", leases());
}
