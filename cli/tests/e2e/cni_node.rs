//! Pods that come and go: `tapyard port add|del`, `show ports` and the CNI plugin against a
//! real `tapyard run` in a network namespace of its own.
//!
//! ```text
//!  pod namespaces (eth0 = a TAP tapyard made, moved and renamed)
//!     └─ bridge cni0 (gateway 10.244.1.1/24) ┐
//!                                            ├ tapyard node (own namespace), uplink 10.245.0.2/24
//!  node-b namespace: the uplink TAP, 10.245.0.3/24, its pod 10.244.2.2 on lo ──┘
//!  ClusterIP Service web 10.96.0.10:80 -> 10.244.2.2:8080
//! ```
//!
//! Checked: `port add` / `show ports --json` / `port del` (fields, counters, traffic, the TAP
//! gone, errors naming the field) and a reload that adds and removes a config port while a
//! `port add` one stays; the `tapyard-cni` plugin run exactly as a runtime runs it (`CNI_*`
//! environment, configuration on stdin, `host-local` IPAM with a private `dataDir`): three pods
//! reach each other, their gateway, the ClusterIP Service and node-b's pod (ping and TCP),
//! CHECK passes, DEL removes every trace (port, TAP, lease, FDB entries) and a second DEL
//! succeeds, the gateway's MAC never changes; churn: 200 pods added and deleted, a few at a
//! time, while an iperf3 stream runs between two long-lived pods, after which the node's ports,
//! FDB and open file descriptors are back where they started.
//!
//! Needs root, `ip`, `ping`, `python3` and host-local (`$TAPYARD_CNI_PLUGINS`, `/usr/lib/cni`
//! or `/opt/cni/bin`); churn needs `iperf3`. Without them each test prints why and passes.
//! Everything lives in namespaces named after the process id, removed (with the node) on
//! success and failure alike.

use crate::common::cni_plugin;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;
use cni_plugin::{cni, cni_ok, leases, net_conf};
use serde_json::{json, Value};

pub(super) const GW: &str = "10.244.1.1";
const UPLINK: &str = "10.245.0.2";
const NODE_B: &str = "10.245.0.3";
pub(super) const NODE_B_POD: &str = "10.244.2.2";
pub(super) const WEB_VIP: &str = "10.96.0.10";

/// Why this machine cannot run the tests, if it cannot.
fn skip_reason() -> Option<String> {
    missing(&[
        ("ip", "-V", "iproute2"),
        ("ping", "-V", "iputils"),
        ("python3", "-V", "python3"),
    ])
    .or_else(|| {
        plugin_dir().is_none().then(|| {
            "host-local not found in $TAPYARD_CNI_PLUGINS, /usr/lib/cni or /opt/cni/bin".into()
        })
    })
}

/// Skips with a message, or fails under `CI=true`.
pub(super) fn skip(test: &str) -> bool {
    skip_or_fail(test, skip_reason())
}

/// A running node, node-b and the pods' namespaces; all removed on drop.
pub(super) struct Node {
    pub(super) tag: String,
    dir: PathBuf,
    pub(super) ns_node: String,
    pub(super) ns_b: String,
    socket: PathBuf,
    pub(super) config: PathBuf,
    /// The node's process, the servers, the namespaces, the directory.
    pub(super) g: Guard,
}

impl Node {
    /// Starts `tapyard run` in a namespace of its own with bridge cni0 (`ports` from the
    /// file), an uplink to node-b and the Service; wires node-b.
    pub(super) fn start(test: &str, ports: &[&str]) -> Node {
        let tag = format!("{test}{}", std::process::id() % 100_000);
        let dir = std::env::temp_dir().join(format!("tapyard-cni-node-{tag}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("ipam")).unwrap();
        let mut n = Node {
            ns_node: format!("tyn-{tag}"),
            ns_b: format!("tyb-{tag}"),
            socket: dir.join("ctl.sock"),
            config: dir.join("node.toml"),
            g: Guard::new(&dir, &dir.join("run.log")),
            tag,
            dir,
        };
        let (node_ns, b) = (n.ns_node.clone(), n.ns_b.clone());
        n.ns(&node_ns);
        n.ns(&b);
        std::fs::write(&n.config, n.config_text(ports)).unwrap();
        n.g.start_node(Some(&node_ns), &n.config, &[], &n.socket);
        // node-b: the uplink TAP, its address and pod, the route back to cni0's pods.
        let nb = &n.ns_b;
        run(&["ip", "-n", &n.ns_node, "link", "set", "up0", "netns", nb]);
        for args in [
            vec!["addr", "add", "10.245.0.3/24", "dev", "up0"],
            vec!["link", "set", "up0", "up"],
            vec!["link", "set", "lo", "up"],
            vec!["addr", "add", "10.244.2.2/32", "dev", "lo"],
            vec!["route", "add", "10.244.1.0/24", "via", UPLINK],
        ] {
            let mut v = vec!["ip", "-n", nb];
            v.extend(args);
            run(&v);
        }
        n
    }

    fn config_text(&self, ports: &[&str]) -> String {
        let ports = if ports.is_empty() {
            String::new()
        } else {
            let q: Vec<String> = ports.iter().map(|p| format!("{p:?}")).collect();
            format!("ports = [{}]\n", q.join(", "))
        };
        format!(
            r#"{node}
[[bridge]]
name = "cni0"
address = "{GW}/24"
{ports}
[[uplink]]
name = "up0"
address = "{UPLINK}/24"

[[route]]
to = "10.244.2.0/24"
via = "{NODE_B}"

[[service]]
name = "web"
cluster_ip = "{WEB_VIP}"
protocol = "tcp"
port = 80
endpoints = ["{NODE_B_POD}:8080"]
"#,
            node = node_toml(
                &format!("cni-{}", self.tag),
                r#""10.244.0.0/16""#,
                &self.socket,
                Some(&self.socket.with_file_name("state")),
            ),
        )
    }

    /// Creates a namespace removed on drop.
    fn ns(&mut self, name: &str) {
        self.g.ns(name);
    }

    fn pid(&self) -> u32 {
        self.g.node.as_ref().expect("the node runs").id()
    }

    fn tapyard(&self, args: &[&str]) -> Output {
        tapyard_at(&self.socket, args)
    }

    pub(super) fn tapyard_ok(&self, args: &[&str]) -> String {
        tapyard_ok_at(&self.socket, args)
    }

    /// `tapyard ARGS` must fail with a message containing `want`.
    fn tapyard_err(&self, args: &[&str], want: &str) {
        let out = self.tapyard(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains(want),
            "tapyard {args:?}: expected an error with {want:?}, got {}: {err}",
            out.status
        );
    }

    pub(super) fn json(&self, what: &str) -> Vec<Value> {
        let out = self.tapyard_ok(&["show", what, "--json"]);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("show {what} --json: {e}:\n{out}"))
    }

    /// `show ports --json`'s port called `name` (or whose owner is `name`).
    pub(super) fn port(&self, name: &str) -> Option<Value> {
        self.json("ports")
            .into_iter()
            .find(|p| p["name"] == name || p["owner"] == name)
    }

    /// The (mac, dev) pairs of the FDB.
    fn fdb(&self) -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = self
            .json("fdb")
            .into_iter()
            .map(|e| (e["mac"].to_string(), e["dev"].to_string()))
            .collect();
        v.sort();
        v
    }

    /// The node's open file descriptors.
    fn fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .map(|d| d.count())
            .unwrap_or(0)
    }

    /// The plugin's network configuration (as the runtime hands it over).
    fn net_conf(&self) -> Value {
        let ranges = json!([[{"subnet": "10.244.1.0/24", "gateway": GW}]]);
        let routes = json!([{"dst": "0.0.0.0/0"}]);
        net_conf(
            "1.0.0",
            "cni0",
            &self.socket,
            ranges,
            routes,
            &self.dir.join("ipam"),
        )
    }

    /// The lease files host-local holds.
    fn leases(&self) -> Vec<String> {
        leases(&self.dir.join("ipam"))
    }

    /// The gateway's MAC, from `tapyard status`.
    pub(super) fn gateway_mac(&self) -> String {
        let out = self.tapyard_ok(&["status", "--json"]);
        let v: Value = serde_json::from_str(&out).unwrap();
        v["interfaces"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["name"] == "cni0")
            .map(|i| i["mac"].as_str().unwrap().to_string())
            .unwrap()
    }
}

/// One request line on the control socket: the reply.
fn control(socket: &Path, req: &Value) -> Value {
    use std::io::{BufRead, BufReader, Write};
    let mut s = std::os::unix::net::UnixStream::connect(socket).expect("connect");
    s.write_all(format!("{req}\n").as_bytes()).unwrap();
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).unwrap();
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("{req}: {e}: {line}"))
}

/// A pod: its namespace (made by the caller), container id and ADD result.
pub(super) struct Pod {
    pub(super) ns: String,
    id: String,
    pub(super) result: Value,
}

impl Pod {
    pub(super) fn ip(&self) -> String {
        let a = self.result["ips"][0]["address"].as_str().unwrap();
        a.split('/').next().unwrap().to_string()
    }

    pub(super) fn owner(&self) -> String {
        format!("{}/eth0", self.id)
    }
}

pub(super) fn add_pod(n: &mut Node, i: usize) -> Pod {
    let ns = format!("typ{i}-{}", n.tag);
    n.ns(&ns);
    let id = format!("ctr{i}-{}", n.tag);
    let result = cni_ok("ADD", &id, &ns, &n.net_conf());
    Pod { ns, id, result }
}

/// The pod's `eth0` exists.
fn has_eth0(ns: &str) -> bool {
    run_output(&["ip", "-n", ns, "link", "show", "eth0"])
        .status
        .success()
}

#[test]
#[cfg_attr(
    not(tapyard_root),
    ignore = "needs root: TAP devices and network namespaces (runs as root, as in CI)"
)]
fn port_add_show_del_and_reload() {
    if skip("port_add_show_del_and_reload") {
        return;
    }
    let mut n = Node::start("pa", &[]);
    let ports = n.json("ports");
    assert_eq!(ports.len(), 1, "{ports:?}");
    assert_eq!(ports[0]["kind"], "uplink");
    assert_eq!(ports[0]["origin"], "config");

    let name = format!("tyt{}", n.tag);
    let mac = "02:00:0a:f4:01:32";
    let out = n.tapyard_ok(&["port", "add", "cni0", &name, "--mac", mac]);
    assert!(out.contains(&format!("port {name} added")), "{out}");
    let p = n.port(&name).expect("the port is listed");
    assert_eq!(p["kind"], "pod");
    assert_eq!(p["bridge"], "cni0");
    assert_eq!(p["mac"], mac);
    assert_eq!(p["origin"], "port add");
    assert!(p["netns"].is_null());
    let ifindex = p["ifindex"].as_u64().expect("an ifindex");
    let link = run(&["ip", "-n", &n.ns_node, "-o", "link", "show", &name]);
    assert!(link.starts_with(&format!("{ifindex}: {name}:")), "{link}");

    // Errors name the field and value; nothing changes.
    n.tapyard_err(&["port", "add", "cni0", &name], &format!("name {name:?}"));
    n.tapyard_err(&["port", "add", "nosuch", "tyx"], "bridge \"nosuch\"");
    n.tapyard_err(
        &["port", "add", "cni0", "tyx", "--mac", "01:00:00:00:00:01"],
        "mac",
    );
    n.tapyard_err(&["port", "del", "tynosuch"], "name \"tynosuch\"");
    n.tapyard_err(&["port", "del", "up0"], "config file");
    assert_eq!(n.json("ports").len(), 2);

    // Traffic: the TAP moved by hand into a pod namespace.
    let pod = format!("typ-{}", n.tag);
    n.ns(&pod);
    run(&["ip", "-n", &n.ns_node, "link", "set", &name, "netns", &pod]);
    run(&[
        "ip",
        "-n",
        &pod,
        "addr",
        "add",
        "10.244.1.50/24",
        "dev",
        &name,
    ]);
    run(&["ip", "-n", &pod, "link", "set", &name, "up"]);
    run(&["ip", "-n", &pod, "route", "add", "default", "via", GW]);
    ping_ok(&pod, GW);
    ping_ok(&pod, NODE_B_POD);
    let p = n.port(&name).unwrap();
    for k in ["rx_packets", "tx_packets", "rx_bytes", "tx_bytes"] {
        assert!(p[k].as_u64().unwrap() > 0, "{k}: {p}");
    }
    println!("show ports:\n{}", n.tapyard_ok(&["show", "ports"]));

    // A reload adds and removes the file's ports, never the `port add` one.
    let cfg_port = format!("tyr{}", n.tag);
    std::fs::write(&n.config, n.config_text(&[&cfg_port])).unwrap();
    let out = n.tapyard_ok(&["reload"]);
    assert!(
        out.contains(&format!("port {cfg_port:?} added to bridge \"cni0\"")),
        "{out}"
    );
    assert_eq!(n.port(&cfg_port).unwrap()["origin"], "config");
    assert!(n.port(&name).is_some());
    std::fs::write(&n.config, n.config_text(&[])).unwrap();
    let out = n.tapyard_ok(&["reload"]);
    assert!(out.contains(&format!("port {cfg_port:?} removed")), "{out}");
    assert!(n.port(&cfg_port).is_none());
    assert!(
        !run_output(&["ip", "-n", &n.ns_node, "link", "show", &cfg_port])
            .status
            .success()
    );
    assert!(
        n.port(&name).is_some(),
        "a reload removed a `port add` port"
    );

    // port del: gone from the node and from the pod's namespace.
    let out = n.tapyard_ok(&["port", "del", &name]);
    assert!(out.contains("removed"), "{out}");
    assert!(n.port(&name).is_none());
    assert!(
        !run_output(&["ip", "-n", &pod, "link", "show", &name])
            .status
            .success(),
        "the TAP survived port del"
    );
    assert!(n.fdb().iter().all(|(_, dev)| !dev.contains(&name)));
}

#[test]
#[cfg_attr(
    not(tapyard_root),
    ignore = "needs root: TAP devices and network namespaces (runs as root, as in CI)"
)]
fn cni_pods_end_to_end() {
    if skip("cni_pods_end_to_end") {
        return;
    }
    let mut n = Node::start("ce", &[]);
    let nb = n.ns_b.clone();
    spawn_in(
        &mut n.g.children,
        &nb,
        &["python3", "-c", SERVER_PY, "node-b", "8080", "0"],
    );
    let gw_mac = n.gateway_mac();
    let pods: Vec<Pod> = (0..3).map(|i| add_pod(&mut n, i)).collect();
    for p in &pods {
        let r = &p.result;
        assert_eq!(r["interfaces"][0]["name"], "eth0", "{r}");
        assert_eq!(r["ips"][0]["gateway"], GW, "{r}");
        let port = n.port(&p.owner()).expect("the pod's port is listed");
        assert_eq!(port["kind"], "pod");
        assert_eq!(port["origin"], "cni");
        assert_eq!(port["bridge"], "cni0");
        assert_eq!(port["ifname"], "eth0");
        assert_eq!(port["netns"], format!("/var/run/netns/{}", p.ns));
        assert_eq!(port["mac"], r["interfaces"][0]["mac"], "{port} {r}");
        let link = run(&["ip", "-n", &p.ns, "-o", "link", "show", "eth0"]);
        assert!(
            link.starts_with(&format!("{}: eth0:", port["ifindex"])),
            "{link}"
        );
        let mut check = n.net_conf();
        check["prevResult"] = r.clone();
        cni_ok("CHECK", &p.id, &p.ns, &check);
    }
    // Pod to pod, to the gateway, to node-b's pod; TCP to the ClusterIP and between pods.
    for (i, p) in pods.iter().enumerate() {
        ping_ok(&p.ns, GW);
        ping_ok(&p.ns, &pods[(i + 1) % 3].ip());
        ping_ok(&p.ns, NODE_B_POD);
        let got = exchange(&p.ns, "tcp", WEB_VIP, 80, 1);
        assert_eq!(got[0], ("node-b".to_string(), p.ip()));
    }
    let p0 = pods[0].ns.clone();
    spawn_in(
        &mut n.g.children,
        &p0,
        &["python3", "-c", SERVER_PY, "pod0", "7000", "0"],
    );
    wait_listening(&p0, 7000);
    let got = exchange(&pods[1].ns, "tcp", &pods[0].ip(), 7000, 1);
    assert_eq!(got[0], ("pod0".to_string(), pods[1].ip()));
    println!("show ports:\n{}", n.tapyard_ok(&["show", "ports"]));

    // A second ADD of the same container is refused (by host-local already); the first port
    // and its lease stay.
    let (ok, err) = cni("ADD", &pods[0].id, &pods[0].ns, &n.net_conf());
    assert!(!ok, "{err}");
    assert!(n.port(&pods[0].owner()).is_some());
    assert!(n.leases().contains(&pods[0].ip()));
    // tapyard's own refusals name the owner or the interface; nothing is left behind.
    let ports_before = n.json("ports").len();
    let netns = format!("/var/run/netns/{}", pods[0].ns);
    let add = |owner: &str, ifname: &str, mtu: u32| {
        json!({"cmd": "port_add", "bridge": "cni0", "owner": owner, "netns": netns,
               "ifname": ifname, "mtu": mtu})
    };
    for (req, want) in [
        (add(&pods[0].owner(), "eth1", 1500), pods[0].owner()),
        (
            add("other/eth0", "eth0", 1500),
            format!("ifname \"eth0\" exists already in netns {netns}"),
        ),
        (add("other/eth1", "eth1", 40), "mtu 40".to_string()),
        (
            add("other/eth1", "bad/name", 1500),
            "ifname \"bad/name\"".to_string(),
        ),
        (
            json!({"cmd": "port_add", "bridge": "nope", "owner": "o/eth0", "netns": netns,
                   "ifname": "eth1", "mtu": 1500}),
            "bridge \"nope\"".to_string(),
        ),
        (
            json!({"cmd": "port_add", "bridge": "cni0", "owner": "o/eth0",
                   "netns": "/var/run/netns/nosuch", "ifname": "eth1", "mtu": 1500}),
            "netns \"/var/run/netns/nosuch\"".to_string(),
        ),
        (
            json!({"cmd": "port_show", "owner": "nobody/eth0"}),
            "no such port".to_string(),
        ),
    ] {
        let r = control(&n.socket, &req);
        assert_eq!(r["ok"], false, "{req}: {r}");
        assert!(r["error"].as_str().unwrap().contains(&want), "{req}: {r}");
    }
    let r = control(
        &n.socket,
        &json!({"cmd": "port_del", "owner": "nobody/eth0"}),
    );
    assert_eq!(r, json!({"ok": true, "data": {"removed": false}}));
    assert_eq!(n.json("ports").len(), ports_before);
    assert!(
        !run_output(&["ip", "-n", &pods[0].ns, "link", "show", "eth1"])
            .status
            .success()
    );

    for (i, p) in pods.iter().enumerate() {
        let port = n.port(&p.owner()).unwrap();
        let name = port["name"].as_str().unwrap().to_string();
        assert!(n.fdb().iter().any(|(_, dev)| dev.contains(&name)));
        cni_ok("DEL", &p.id, &p.ns, &n.net_conf());
        assert!(n.port(&p.owner()).is_none(), "port of {} left", p.id);
        assert!(!has_eth0(&p.ns), "eth0 left in {}", p.ns);
        assert!(!n.leases().contains(&p.ip()), "lease of {} left", p.ip());
        assert!(
            n.fdb().iter().all(|(_, dev)| !dev.contains(&name)),
            "FDB entries of {name} left: {:?}",
            n.fdb()
        );
        // DEL again: nothing to do, still a success.
        cni_ok("DEL", &p.id, &p.ns, &n.net_conf());
        // The pods left still reach the gateway, whose MAC has not changed.
        for q in &pods[i + 1..] {
            ping_ok(&q.ns, GW);
            let neigh = run(&["ip", "-n", &q.ns, "neigh", "show", GW]);
            assert!(neigh.contains(&gw_mac), "{neigh} vs {gw_mac}");
        }
    }
    assert_eq!(n.gateway_mac(), gw_mac);
    assert!(n.leases().is_empty(), "{:?}", n.leases());
    assert_eq!(n.json("ports").len(), 1);
}

#[test]
#[cfg_attr(
    not(tapyard_root),
    ignore = "needs root: TAP devices and network namespaces (runs as root, as in CI)"
)]
fn churn_while_a_stream_runs() {
    let why = skip_reason().or_else(|| {
        (!have("iperf3", "--version")).then(|| "`iperf3` (iperf3) is not installed".into())
    });
    if skip_or_fail("churn_while_a_stream_runs", why) {
        return;
    }
    let mut n = Node::start("ch", &[]);
    let a = add_pod(&mut n, 0);
    let b = add_pod(&mut n, 1);
    ping_ok(&b.ns, &a.ip());
    let (ports0, fdb0, fds0) = (n.json("ports").len(), n.fdb(), n.fds());
    spawn_in(&mut n.g.children, &a.ns, &["iperf3", "-s", "-p", "5201"]);
    wait_listening(&a.ns, 5201);
    let stream = Command::new("ip")
        .args(["netns", "exec", &b.ns, "iperf3", "-c", &a.ip(), "-t", "20"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("iperf3 -c");
    let started = Instant::now();
    // 200 pods, 4 at a time: each thread adds and deletes its own.
    let (conf, tag) = (n.net_conf(), n.tag.clone());
    let times: Vec<Vec<(Duration, Duration)>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..4)
            .map(|t| {
                let (conf, tag) = (&conf, &tag);
                s.spawn(move || {
                    let mut times = Vec::new();
                    for i in 0..50 {
                        let ns = format!("tyc{t}-{i}-{tag}");
                        run(&["ip", "netns", "add", &ns]);
                        let id = format!("churn{t}-{i}-{tag}");
                        let t0 = Instant::now();
                        let (ok, v) = cni("ADD", &id, &ns, conf);
                        let t1 = Instant::now();
                        let (ok2, v2) = cni("DEL", &id, &ns, conf);
                        let t2 = Instant::now();
                        let _ = run_output(&["ip", "netns", "del", &ns]);
                        assert!(ok, "ADD {id}: {v}");
                        assert!(ok2, "DEL {id}: {v2}");
                        times.push((t1 - t0, t2 - t1));
                    }
                    times
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    let churn = started.elapsed();
    let out = wait_output(stream, Duration::from_secs(60), "iperf3 -c");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "iperf3 failed during churn: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    println!("{text}");
    let mut add: Vec<Duration> = times.iter().flatten().map(|t| t.0).collect();
    let mut del: Vec<Duration> = times.iter().flatten().map(|t| t.1).collect();
    assert_eq!(add.len(), 200);
    add.sort();
    del.sort();
    println!(
        "churn: 200 pods in {churn:?}; ADD p50 {:?} p99 {:?}; DEL p50 {:?} p99 {:?}",
        add[100], add[198], del[100], del[198]
    );
    // Back where it started (a DEL waits until the TAP is gone; give the kernel a moment for
    // the fds of sockets that are closing).
    assert_eq!(n.json("ports").len(), ports0);
    assert_eq!(n.fdb(), fdb0);
    let deadline = Instant::now() + Duration::from_secs(5);
    while n.fds() != fds0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(n.fds(), fds0, "open fds of tapyard");
    assert_eq!(n.leases().len(), 2);
}
