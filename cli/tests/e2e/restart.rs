//! Restarts lose no pod: `kill -9` and a clean stop of `tapyard run` leave the pods' interfaces
//! in place, and the next run re-attaches to them where they live.
//!
//! ```text
//!  pod-a ns: eth0 = the config file's TAP, moved and renamed by the test  ┐
//!  pod-b ns: eth0 = a `tapyard port add` TAP, moved and renamed by the test├ bridge cni0
//!  pod-c ns: eth0 = made by the CNI plugin (host-local IPAM)              ┘ (gw 10.230.1.1/24)
//!                                                    tapyard node (own namespace) uplink
//!  node-b ns: the uplink TAP 10.231.0.3/24, its pod 10.230.2.2 on lo ──────── 10.231.0.2/24
//! ```
//!
//! Checked ([`kill_and_clean_stop_keep_the_pods`]): after `kill -9`, every pod keeps `eth0`
//! with its address and default route; the restarted node re-attaches to the three TAPs (and
//! the uplink's, in node-b's namespace) instead of creating new ones; ping and TCP between the
//! pods, to the gateway and to node-b's pod work again; the gateway's MAC in the pods'
//! neighbour caches is unchanged; `show ports` lists them where they are. The same after a
//! clean stop (SIGTERM, exit 0) and start. The time from the restart (exec) to the first reply
//! of a ping running through the gap is printed. ([`gone_namespace_port_del_and_cleanup`]): a
//! pod namespace deleted while tapyard is down is dropped from the record at the next start,
//! with a log line; `port del` and a reload that drops a config port delete the TAP in the pod's
//! namespace; `tapyard cleanup` is refused while the node answers, then deletes every TAP and
//! the state directory; a garbage record is logged and ignored, and the node starts.
//! ([`flows_survive_restart`]): a TCP connection through a ClusterIP Service (DNAT'd to node-b's
//! pod, reached by a route), a TCP connection to an outside host (masqueraded to the uplink's
//! address) and a UDP flow to a ClusterIP, each one connection for the whole test, run across
//! `kill -9` + restart and a clean stop + start: no reset, the same endpoint (of two each
//! Service has) and masquerade port throughout (the servers echo their ident and the peer they
//! see), answers again after each restart, and `show
//! conntrack` lists them again with the same NAT right after the restart; routed and
//! masqueraded pings time the restarts. ([`full_table_restart_time`]): with the connection
//! table full (262,144 SYN_SENT entries), every entry is kept across `kill -9` and a clean stop
//! and routed traffic resumes within a second. ([`port_add_never_leaves_an_unrecorded_tap`]):
//! a record that cannot be written refuses `port add`, and a node killed in the middle of one
//! leaves no persistent TAP that no record lists.
//!
//! Needs root, `ip`, `ping`, `python3` and host-local (`$TAPYARD_CNI_PLUGINS`, `/usr/lib/cni`
//! or `/opt/cni/bin`); without them each test prints why and passes, except with `CI=true`,
//! where it fails. Namespaces carry the process id and are deleted (with the TAPs in them) by
//! a guard on success and failure alike; traffic goes only to addresses inside them.

use crate::common;
use crate::common::cni_plugin;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use crate::common::*;
use cni_plugin::{cni, cni_ok};
use serde_json::{json, Value};

const GW: &str = "10.230.1.1";
const POD_A: &str = "10.230.1.2";
const POD_B: &str = "10.230.1.3";
const UPLINK: &str = "10.231.0.2";
const NODE_B: &str = "10.231.0.3";
const NODE_B_POD: &str = "10.230.2.2";
/// The outside host, behind the uplink (the default route): pods reach it masqueraded.
const OUTSIDE: &str = "10.231.0.1";
const WEB_VIP: &str = "10.96.0.10";
const DNS_VIP: &str = "10.96.0.53";

/// `ident tport uport`: echoes each line of each TCP connection on `tport` (and each datagram
/// on `uport`) prefixed with `<ident> <peer ip>:<peer port>`, so a client sees whether the
/// server still talks to the same endpoint.
const ECHO_PY: &str = r#"
import socket, sys, threading
ident, tport, uport = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def conn(c, peer):
    f = c.makefile("rb")
    try:
        for line in f:
            c.sendall(("%s %s:%d %s" % (ident, peer[0], peer[1], line.decode())).encode())
    except OSError:
        pass
    c.close()
def tcp():
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", tport))
    s.listen(16)
    while True:
        c, peer = s.accept()
        threading.Thread(target=conn, args=(c, peer), daemon=True).start()
def udp():
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.bind(("0.0.0.0", uport))
    while True:
        d, peer = u.recvfrom(2048)
        u.sendto(("%s %s:%d %s" % (ident, peer[0], peer[1], d.decode())).encode(), peer)
ts = [threading.Thread(target=f, daemon=True) for f, p in ((tcp, tport), (udp, uport)) if p]
for t in ts:
    t.start()
for t in ts:
    t.join()
"#;

/// `tcp|udp addr port seconds`: one connection (or one connected UDP socket) for `seconds`,
/// a numbered line every 50 ms, each answer printed as `ok <unix time> <answer>`; a UDP
/// datagram unanswered within 300 ms is `lost <time>`; a TCP error ends it with
/// `error <time> <why>` (a reset, or 20 s without an answer).
const FLOW_PY: &str = r#"
import socket, sys, time
mode, addr, port, secs = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
end = time.monotonic() + secs
i = 0
if mode == "tcp":
    c = socket.create_connection((addr, port), timeout=5)
    c.settimeout(20)
    f = c.makefile("rb")
    while time.monotonic() < end:
        i += 1
        try:
            c.sendall(b"%d\n" % i)
            line = f.readline()
            if not line:
                raise OSError("closed by the peer")
            print("ok %.6f %s" % (time.time(), line.decode().strip()), flush=True)
        except OSError as e:
            print("error %.6f %s" % (time.time(), e), flush=True)
            sys.exit(1)
        time.sleep(0.05)
else:
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.connect((addr, port))
    u.settimeout(0.3)
    while time.monotonic() < end:
        i += 1
        u.send(b"%d" % i)
        try:
            print("ok %.6f %s" % (time.time(), u.recv(2048).decode().strip()), flush=True)
        except OSError:
            print("lost %.6f" % time.time(), flush=True)
        time.sleep(0.05)
"#;

/// Why this machine cannot run the tests, if it cannot.
fn skip_reason() -> Option<String> {
    missing(&[("ping", "-V"), ("python3", "-V")]).or_else(|| {
        plugin_dir().is_none().then(|| {
            "host-local not found in $TAPYARD_CNI_PLUGINS, /usr/lib/cni or /opt/cni/bin".into()
        })
    })
}

/// Skips with a message, or fails under `CI=true`.
fn skip(test: &str) -> bool {
    common::skip_or_fail(test, skip_reason())
}

/// A node with three pods and node-b; everything is removed on drop (the node killed, the
/// namespaces deleted with the TAPs in them, the directory with the state).
struct Rig {
    tag: String,
    dir: PathBuf,
    ns_node: String,
    ns_b: String,
    ns_a: String,
    ns_pb: String,
    ns_c: String,
    ns_w: String,
    ns_out: String,
    tap_a: String,
    tap_b: String,
    ctr_c: String,
    pod_c: String,
    result_c: Value,
    namespaces: Vec<String>,
    node: Option<Child>,
    children: Vec<Child>,
    socket: PathBuf,
    config: PathBuf,
    state: PathBuf,
    log: PathBuf,
    /// `TAPYARD_TEST_FAILPOINT` for the next start (debug builds only).
    failpoint: String,
}

impl Drop for Rig {
    fn drop(&mut self) {
        let procs = self.children.iter_mut().chain(self.node.as_mut());
        tear_down(procs, &self.namespaces, &self.log, &self.dir);
    }
}

impl Rig {
    fn new(test: &str) -> Rig {
        let tag = format!("{test}{}", std::process::id() % 100_000);
        let dir = std::env::temp_dir().join(format!("tapyard-restart-{tag}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("ipam")).unwrap();
        let mut r = Rig {
            ns_node: format!("tyn-{tag}"),
            ns_b: format!("tyb-{tag}"),
            ns_a: format!("typa-{tag}"),
            ns_pb: format!("typb-{tag}"),
            ns_c: format!("typc-{tag}"),
            ns_w: format!("tyw-{tag}"),
            ns_out: format!("tyo-{tag}"),
            tap_a: format!("tya{tag}"),
            tap_b: format!("tyb{tag}"),
            ctr_c: format!("ctr-{tag}"),
            pod_c: String::new(),
            result_c: Value::Null,
            socket: dir.join("ctl.sock"),
            config: dir.join("node.toml"),
            state: dir.join("state"),
            log: dir.join("run.log"),
            failpoint: String::new(),
            tag,
            dir,
            namespaces: Vec::new(),
            node: None,
            children: Vec::new(),
        };
        for ns in [
            r.ns_node.clone(),
            r.ns_b.clone(),
            r.ns_a.clone(),
            r.ns_pb.clone(),
            r.ns_c.clone(),
            r.ns_w.clone(),
            r.ns_out.clone(),
        ] {
            run(&["ip", "netns", "add", &ns]);
            r.namespaces.push(ns.clone());
            run(&["ip", "-n", &ns, "link", "set", "lo", "up"]);
        }
        let text = r.config_text(true);
        std::fs::write(&r.config, text).unwrap();
        r
    }

    fn config_text(&self, with_pod_a: bool) -> String {
        let ports = if with_pod_a {
            format!("ports = [\"{}\"]", self.tap_a)
        } else {
            String::new()
        };
        format!(
            r#"[node]
name = "rs-{tag}"
cluster_cidr = "10.230.0.0/16"
socket = "{socket}"
state_dir = "{state}"
workers = 2

[[bridge]]
name = "cni0"
address = "{GW}/24"
{ports}

[[uplink]]
name = "up0"
address = "{UPLINK}/24"

[[route]]
to = "10.230.2.0/24"
via = "{NODE_B}"

[[route]]
to = "0.0.0.0/0"
via = "{OUTSIDE}"

[[service]]
name = "web"
cluster_ip = "{WEB_VIP}"
protocol = "tcp"
port = 80
endpoints = ["{NODE_B_POD}:8081", "{NODE_B_POD}:8082"]

[[service]]
name = "dns"
cluster_ip = "{DNS_VIP}"
protocol = "udp"
port = 53
endpoints = ["{NODE_B_POD}:5353", "{NODE_B_POD}:5354"]

[masquerade]
out = "up0"
"#,
            tag = self.tag,
            socket = self.socket.display(),
            state = self.state.display(),
        )
    }

    /// Starts `tapyard run` in its namespace (its log appended to `run.log`); returns when
    /// its control socket answers, with the time it was started.
    fn start(&mut self) -> SystemTime {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let t0 = SystemTime::now();
        self.node = Some(
            Command::new("ip")
                .args(["netns", "exec", &self.ns_node, TAPYARD, "run"])
                .arg(&self.config)
                .env("RUST_LOG", "info")
                .env("TAPYARD_TEST_FAILPOINT", &self.failpoint)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("start tapyard run"),
        );
        wait_for_socket(self.node.as_mut(), &self.socket);
        t0
    }

    /// `kill -9` (`ip netns exec` has exec'd tapyard: the child is tapyard itself).
    fn kill9(&mut self) {
        let mut c = self.node.take().expect("the node runs");
        c.kill().unwrap();
        c.wait().unwrap();
    }

    /// SIGTERM, and the exit status must be 0.
    fn stop(&mut self) {
        let c = self.node.take().expect("the node runs");
        run(&["kill", "-TERM", &c.id().to_string()]);
        let out = wait_output(c, Duration::from_secs(10), "tapyard run (SIGTERM)");
        assert!(out.status.success(), "tapyard run exited {}", out.status);
    }

    fn tapyard(&self, args: &[&str]) -> String {
        tapyard_ok_at(&self.socket, args)
    }

    /// `show ports --json` (which also records TAPs moved or renamed since the last look).
    fn ports(&self) -> Vec<Value> {
        let out = self.tapyard(&["show", "ports", "--json"]);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("show ports --json: {e}: {out}"))
    }

    fn port(&self, name: &str) -> Option<Value> {
        self.ports()
            .into_iter()
            .find(|p| p["name"] == name || p["owner"] == name)
    }

    /// The record file, parsed.
    fn record(&self) -> Value {
        let text = std::fs::read_to_string(self.state.join("ports.json")).expect("ports.json");
        serde_json::from_str(&text).unwrap()
    }

    fn recorded(&self, name: &str) -> bool {
        self.record()["ports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == name || p["owner"] == name)
    }

    /// The plugin's network configuration.
    fn net_conf(&self) -> Value {
        json!({
            "cniVersion": "1.0.0", "name": "tapyard", "type": "tapyard-cni", "bridge": "cni0",
            "socket": self.socket.display().to_string(), "mtu": 1500,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": "10.230.1.0/24", "gateway": GW,
                             "rangeStart": "10.230.1.10", "rangeEnd": "10.230.1.20"}]],
                "routes": [{"dst": "0.0.0.0/0"}],
                "dataDir": self.dir.join("ipam").display().to_string(),
            }
        })
    }

    /// Gives `ns` the interface `tap` of the node's namespace as `eth0` with `addr`/24 and a
    /// default route through the gateway, as a runtime without CNI would.
    fn plug(&self, tap: &str, ns: &str, addr: &str) {
        run(&["ip", "-n", &self.ns_node, "link", "set", tap, "netns", ns]);
        run(&["ip", "-n", ns, "link", "set", tap, "name", "eth0"]);
        let a = format!("{addr}/24");
        run(&["ip", "-n", ns, "addr", "add", &a, "dev", "eth0"]);
        run(&["ip", "-n", ns, "link", "set", "eth0", "up"]);
        run(&["ip", "-n", ns, "route", "add", "default", "via", GW]);
    }

    /// Node-b, the outside host, the three pods and a TCP server in pod-a and node-b; the
    /// node runs. The uplink's TAP is on a Linux bridge in the wire namespace, with a veth to
    /// node-b and one to the outside host. Node-b answers pods from its pod's address (a UDP
    /// server bound to 0.0.0.0 answers from the route's source).
    fn set_up(&mut self) {
        self.start();
        let (w, nb, out) = (self.ns_w.clone(), self.ns_b.clone(), self.ns_out.clone());
        run(&["ip", "-n", &self.ns_node, "link", "set", "up0", "netns", &w]);
        let cmds: [&[&str]; 14] = [
            &["-n", &w, "link", "add", "br0", "type", "bridge"],
            &["-n", &w, "link", "set", "br0", "up"],
            &["-n", &w, "link", "set", "up0", "master", "br0", "up"],
            &[
                "-n", &w, "link", "add", "wb0", "type", "veth", "peer", "name", "nb0", "netns", &nb,
            ],
            &["-n", &w, "link", "set", "wb0", "master", "br0", "up"],
            &[
                "-n", &w, "link", "add", "wo0", "type", "veth", "peer", "name", "ob0", "netns",
                &out,
            ],
            &["-n", &w, "link", "set", "wo0", "master", "br0", "up"],
            &["-n", &nb, "addr", "add", "10.231.0.3/24", "dev", "nb0"],
            &["-n", &nb, "link", "set", "nb0", "up"],
            &["-n", &nb, "addr", "add", "10.230.2.2/32", "dev", "lo"],
            &[
                "-n",
                &nb,
                "route",
                "add",
                "10.230.1.0/24",
                "via",
                UPLINK,
                "src",
                NODE_B_POD,
            ],
            &["-n", &out, "addr", "add", "10.231.0.1/24", "dev", "ob0"],
            &["-n", &out, "link", "set", "ob0", "up"],
            &["-n", &out, "link", "set", "lo", "up"],
        ];
        for c in cmds {
            let mut v = vec!["ip"];
            v.extend_from_slice(c);
            run(&v);
        }
        self.plug(&self.tap_a, &self.ns_a, POD_A);
        self.tapyard(&["port", "add", "cni0", &self.tap_b]);
        self.plug(&self.tap_b, &self.ns_pb, POD_B);
        let r = cni_ok("ADD", &self.ctr_c, &self.ns_c, &self.net_conf());
        let ip = r["ips"][0]["address"].as_str().unwrap();
        self.pod_c = ip.split('/').next().unwrap().to_string();
        self.result_c = r.clone();
        let (a, b) = (self.ns_a.clone(), self.ns_b.clone());
        spawn_in(
            &mut self.children,
            &a,
            &["python3", "-c", SERVER_PY, "pod-a", "7000", "0"],
        );
        spawn_in(
            &mut self.children,
            &b,
            &["python3", "-c", SERVER_PY, "node-b", "8080", "0"],
        );
        wait_listening(&a, 7000);
        wait_listening(&b, 8080);
        // tapyard follows its TAPs by itself and records where they went...
        let deadline = Instant::now() + Duration::from_secs(3);
        let moved = |r: &Value| {
            r["ports"].as_array().is_some_and(|ps| {
                ps.iter()
                    .any(|p| p["name"] == self.tap_a.as_str() && p["ifname"] == "eth0")
            })
        };
        while !moved(&self.record()) {
            assert!(
                Instant::now() < deadline,
                "pod-a's TAP not recorded as eth0: {}",
                self.record()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        // ...and show ports looks at once.
        let p = self.port(&self.tap_a).expect("pod-a's port");
        assert_eq!(p["ifname"], "eth0", "{p}");
        assert_eq!(p["netns"], format!("/var/run/netns/{}", self.ns_a), "{p}");
        let p = self.port(&self.tap_b).expect("pod-b's port");
        assert_eq!(p["ifname"], "eth0", "{p}");
        let p = self.port("up0").expect("the uplink's port");
        assert_eq!(p["netns"], format!("/var/run/netns/{}", self.ns_w), "{p}");
    }

    fn pods(&self) -> [(String, String); 3] {
        [
            (self.ns_a.clone(), POD_A.to_string()),
            (self.ns_pb.clone(), POD_B.to_string()),
            (self.ns_c.clone(), self.pod_c.clone()),
        ]
    }

    /// Each pod still has `eth0` with its address and its default route via the gateway.
    fn pods_intact(&self) {
        for (ns, ip) in self.pods() {
            let addr = run(&["ip", "-n", &ns, "-o", "-4", "addr", "show", "dev", "eth0"]);
            assert!(addr.contains(&format!("{ip}/24")), "{ns}: {addr}");
            let route = run(&["ip", "-n", &ns, "route", "show", "default"]);
            assert!(
                route.contains(&format!("via {GW} dev eth0")),
                "{ns}: {route}"
            );
        }
    }

    /// Ping and TCP between the pods, to the gateway and to node-b's pod.
    fn traffic_works(&self) {
        let [(a, _), (b, _), (c, ip_c)] = self.pods();
        ping_ok(&a, POD_B);
        ping_ok(&b, &ip_c);
        ping_ok(&c, POD_A);
        for ns in [&a, &b, &c] {
            ping_ok(ns, GW);
        }
        ping_ok(&a, NODE_B_POD);
        let got = exchange(&c, "tcp", POD_A, 7000, 1);
        assert_eq!(got[0], ("pod-a".to_string(), ip_c.clone()));
        let got = exchange(&b, "tcp", NODE_B_POD, 8080, 1);
        assert_eq!(got[0], ("node-b".to_string(), POD_B.to_string()));
    }

    /// The gateway's MAC in `ns`'s neighbour cache.
    fn gw_mac_seen(&self, ns: &str) -> String {
        let out = run(&["ip", "-n", ns, "neigh", "show", GW]);
        out.split_whitespace()
            .skip_while(|w| *w != "lladdr")
            .nth(1)
            .unwrap_or_else(|| panic!("no lladdr for {GW} in {ns}: {out}"))
            .to_string()
    }

    /// The gateway's MAC, from `tapyard status`.
    fn gw_mac(&self) -> String {
        let v: Value = serde_json::from_str(&self.tapyard(&["status", "--json"])).unwrap();
        v["interfaces"]
            .as_array()
            .unwrap()
            .iter()
            .find(|i| i["name"] == "cni0")
            .map(|i| i["mac"].as_str().unwrap().to_string())
            .unwrap()
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Stops the node with `how` while pod-a pings pod-b every 10 ms, starts it again after
    /// half a second, and returns the time from the start (exec) to the first reply after it.
    fn restart_measured(&mut self, how: fn(&mut Rig)) -> Duration {
        let out = self.ping_bg(POD_B);
        std::thread::sleep(Duration::from_millis(300));
        how(self);
        std::thread::sleep(Duration::from_millis(500));
        let t0 = unix(self.start());
        let gap = first_reply_after(&out, t0);
        if let Some(mut c) = self.children.pop() {
            let _ = c.kill();
            let _ = c.wait();
        }
        gap
    }

    /// Starts pinging `to` from pod-a every 10 ms (the process in `children`), each reply
    /// with its time (`ping -D`) in the file returned.
    fn ping_bg(&mut self, to: &str) -> PathBuf {
        let out = self
            .dir
            .join(format!("ping-{to}-{}.txt", self.children.len()));
        let child = Command::new("ip")
            .args([
                "netns", "exec", &self.ns_a, "ping", "-D", "-n", "-i", "0.01", to,
            ])
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(Stdio::null())
            .spawn()
            .expect("ping");
        self.children.push(child);
        out
    }
}

/// Seconds since the epoch.
fn unix(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// The time from `t0` to the first reply after it in the output of [`Rig::ping_bg`]; fails
/// after 10 s without one.
fn first_reply_after(out: &std::path::Path, t0: f64) -> Duration {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(out).unwrap_or_default();
        let first = text
            .lines()
            .filter(|l| l.contains("bytes from"))
            .filter_map(|l| l.strip_prefix('[')?.split(']').next()?.parse::<f64>().ok())
            .find(|&ts| ts > t0);
        if let Some(ts) = first {
            return Duration::from_secs_f64(ts - t0);
        }
        assert!(
            Instant::now() < deadline,
            "no ping reply within 10 s of the restart ({}):\n{text}",
            out.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `wait_output` reads a child's stdout and stderr while it runs: a child writing more than
/// a pipe holds on both finishes at once instead of blocking until the timeout. No root
/// needed.
#[test]
fn wait_output_collects_more_than_a_pipe_holds() {
    let child = Command::new("sh")
        .args([
            "-c",
            "head -c 300000 /dev/zero | tr '\\0' a; head -c 200000 /dev/zero | tr '\\0' b >&2",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    let out = wait_output(child, Duration::from_secs(10), "sh (500 kB of output)");
    assert!(out.status.success(), "{}", out.status);
    assert_eq!(out.stdout.len(), 300_000);
    assert!(out.stdout.iter().all(|&b| b == b'a'));
    assert_eq!(out.stderr.len(), 200_000);
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
}

#[test]
#[cfg_attr(
    not(tapyard_root),
    ignore = "needs root: TAP devices and network namespaces (runs as root, as in CI)"
)]
fn kill_and_clean_stop_keep_the_pods() {
    if skip("kill_and_clean_stop_keep_the_pods") {
        return;
    }
    let mut r = Rig::new("ks");
    r.set_up();
    r.traffic_works();
    let gw_mac = r.gw_mac();
    for (ns, _) in r.pods() {
        assert_eq!(r.gw_mac_seen(&ns), gw_mac, "{ns}");
    }
    let ports_before: Vec<(Value, Value, Value)> = r
        .ports()
        .iter()
        .map(|p| (p["name"].clone(), p["mac"].clone(), p["ifindex"].clone()))
        .collect();

    let rounds = [
        ("kill -9", Rig::kill9 as fn(&mut Rig)),
        ("SIGTERM", Rig::stop),
    ];
    for (n, (round, how)) in rounds.into_iter().enumerate() {
        how(&mut r);
        // Nobody serves the pods, but their interfaces are all there.
        r.pods_intact();
        let link = run(&["ip", "-n", &r.ns_w, "-o", "link", "show", "up0"]);
        assert!(link.contains("up0"), "{link}");
        let gap = r.restart_measured(|_| {});
        println!("{round}: from restart (exec) to the first ping reply pod-a -> pod-b: {gap:?}");
        r.pods_intact();
        r.traffic_works();
        // The same devices (MAC, ifindex), found again where they are.
        let now: Vec<(Value, Value, Value)> = r
            .ports()
            .iter()
            .map(|p| (p["name"].clone(), p["mac"].clone(), p["ifindex"].clone()))
            .collect();
        assert_eq!(now, ports_before, "{round}");
        let log = r.log_text();
        assert_eq!(
            log.matches("(4 re-attached from the last run)").count(),
            n + 1,
            "{round}: {log}"
        );
        // The gateway kept its MAC: the pods' neighbour caches are right.
        assert_eq!(r.gw_mac(), gw_mac, "{round}");
        for (ns, _) in r.pods() {
            assert_eq!(r.gw_mac_seen(&ns), gw_mac, "{round}: {ns}");
        }
        let p = r.port(&format!("{}/eth0", r.ctr_c)).expect("pod-c's port");
        assert_eq!(p["netns"], format!("/var/run/netns/{}", r.ns_c), "{p}");
        assert_eq!(p["origin"], "cni");
        // A CNI CHECK still passes on the re-attached pod.
        let mut check = r.net_conf();
        check["prevResult"] = r.result_c.clone();
        let (ok, v) = cni("CHECK", &r.ctr_c, &r.ns_c, &check);
        assert!(ok, "CHECK after {round}: {v}");
    }
    // The gap itself, measured the other way round: a ping running across a kill -9.
    let gap = r.restart_measured(Rig::kill9);
    println!("kill -9 while pinging: from restart (exec) to the first reply: {gap:?}");
    assert!(gap < Duration::from_secs(5), "{gap:?}");
}

/// `port add` never leaves a persistent TAP that no record lists (it would stay in the
/// node's namespace, unknown to tapyard and `cleanup`, and block `port add` of its name): a
/// record that cannot be written (its temporary file's name taken by a directory, as a full
/// disk would refuse it) refuses the port; and a `kill -9` between recording the port and
/// making its TAP persistent (a failure point: debug builds only) leaves a TAP that went with
/// the process, dropped from the record at the next start, and the name can be added again.
#[test]
#[cfg_attr(
    not(tapyard_root),
    ignore = "needs root: TAP devices and network namespaces (runs as root, as in CI)"
)]
fn port_add_never_leaves_an_unrecorded_tap() {
    if skip("port_add_never_leaves_an_unrecorded_tap") {
        return;
    }
    let mut r = Rig::new("pa");
    if cfg!(debug_assertions) {
        r.failpoint = "port-add-recorded=exit".into();
    }
    r.start();
    let gone = |r: &Rig, tap: &str| {
        let deadline = Instant::now() + Duration::from_secs(3);
        while run_output(&["ip", "-n", &r.ns_node, "link", "show", tap])
            .status
            .success()
        {
            if Instant::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        true
    };

    let tmp = r.state.join("ports.json.tmp");
    std::fs::create_dir(&tmp).unwrap();
    let tap_y = format!("tyy{}", r.tag);
    let out = tapyard_at(&r.socket, &["port", "add", "cni0", &tap_y]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "port add succeeded without a record");
    assert!(
        err.contains("cannot write") && err.contains("not added"),
        "{err}"
    );
    assert!(gone(&r, &tap_y), "TAP {tap_y} stayed, unrecorded");
    std::fs::remove_dir(&tmp).unwrap();

    if !cfg!(debug_assertions) {
        eprintln!("release build: no failure points, the kill in port add is not tried");
        return;
    }
    let tap = format!("tyx{}", r.tag);
    let out = tapyard_at(&r.socket, &["port", "add", "cni0", &tap]);
    assert!(!out.status.success(), "port add answered: {out:?}");
    let st = r.node.take().unwrap().wait().unwrap();
    assert_eq!(st.code(), Some(137), "{st}");
    r.failpoint.clear();
    r.start();
    assert!(
        gone(&r, &tap) || r.port(&tap).is_some(),
        "TAP {tap} exists but the restarted node does not know it: {:?}",
        r.ports()
    );
    assert!(!r.recorded(&tap), "{}", r.record());
    for t in [&tap, &tap_y] {
        r.tapyard(&["port", "add", "cni0", t]);
        assert!(r.recorded(t));
        assert!(r.port(t).is_some());
    }
}

#[test]
#[cfg_attr(
    not(tapyard_root),
    ignore = "needs root: TAP devices and network namespaces (runs as root, as in CI)"
)]
fn gone_namespace_port_del_and_cleanup() {
    if skip("gone_namespace_port_del_and_cleanup") {
        return;
    }
    let mut r = Rig::new("gc");
    r.set_up();
    let owner_c = format!("{}/eth0", r.ctr_c);
    assert!(r.recorded(&owner_c));

    // Pod C goes away while tapyard is down: its record is dropped at the next start.
    r.kill9();
    run(&["ip", "netns", "del", &r.ns_c]);
    r.namespaces.retain(|n| *n != r.ns_c);
    r.start();
    assert!(r.port(&owner_c).is_none(), "{:?}", r.ports());
    assert!(!r.recorded(&owner_c), "{}", r.record());
    let log = r.log_text();
    assert!(
        log.contains(&format!(
            "(owner {owner_c}): dropped from the record: its network namespace /var/run/netns/{}",
            r.ns_c
        )) && log.contains("is gone"),
        "{log}"
    );
    ping_ok(&r.ns_a, POD_B);

    // port del deletes the TAP in the pod's namespace, for real.
    r.tapyard(&["port", "del", &r.tap_b]);
    assert!(
        !run_output(&["ip", "-n", &r.ns_pb, "link", "show", "eth0"])
            .status
            .success(),
        "pod-b's eth0 survived port del"
    );
    assert!(!r.recorded(&r.tap_b));

    // A reload that drops the config's port deletes its TAP, renamed in pod-a's namespace.
    std::fs::write(&r.config, r.config_text(false)).unwrap();
    let out = r.tapyard(&["reload"]);
    assert!(
        out.contains(&format!("port \"{}\" removed", r.tap_a)),
        "{out}"
    );
    assert!(
        !run_output(&["ip", "-n", &r.ns_a, "link", "show", "eth0"])
            .status
            .success(),
        "pod-a's eth0 survived the reload"
    );
    assert!(!r.recorded(&r.tap_a));

    // cleanup: refused while the node answers; then every TAP and the state go.
    let tap_d = format!("tyd{}", r.tag);
    r.tapyard(&["port", "add", "cni0", &tap_d]);
    let cfg = r.config.display().to_string();
    let out = run_output(&[TAPYARD, "cleanup", &cfg]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("still answers") && err.contains("nothing deleted"),
        "{}: {err}",
        out.status
    );
    assert!(r.state.join("ports.json").exists());
    r.stop();
    // A clean stop leaves them all.
    run(&["ip", "-n", &r.ns_w, "link", "show", "up0"]);
    run(&["ip", "-n", &r.ns_node, "link", "show", &tap_d]);
    // Run from another namespace than the node's (here, the test's): the record says where
    // the node ran, and its TAPs are looked for there.
    let out = run(&[TAPYARD, "cleanup", &cfg]);
    println!("cleanup:\n{out}");
    assert!(out.contains("TAP up0 in /var/run/netns/"), "{out}");
    assert!(out.contains(&format!("TAP {tap_d} in ")), "{out}");
    assert!(!out.contains("gone already"), "{out}");
    for (ns, dev) in [(&r.ns_w, "up0"), (&r.ns_node, tap_d.as_str())] {
        assert!(
            !run_output(&["ip", "-n", ns, "link", "show", dev])
                .status
                .success(),
            "{dev} in {ns} survived cleanup"
        );
    }
    assert!(!r.state.exists(), "the state directory survived cleanup");

    // A record that cannot be trusted is logged and ignored; the node starts.
    std::fs::create_dir_all(&r.state).unwrap();
    std::fs::write(r.state.join("ports.json"), b"{\"version\": 1, \"node\": tr").unwrap();
    r.start();
    let log = r.log_text();
    assert!(
        log.contains("ignoring the port record") && log.contains("not a valid record"),
        "{log}"
    );
    assert_eq!(r.ports().len(), 1, "{:?}", r.ports());
    assert!(r.recorded("up0"));
}

impl Rig {
    /// Starts [`FLOW_PY`] in `ns` for `secs` seconds (its process in `children`); its output
    /// goes to the file returned.
    fn flow(&mut self, ns: &str, mode: &str, addr: &str, port: u16, secs: f64) -> PathBuf {
        let out = self.dir.join(format!("flow-{mode}-{addr}-{port}.txt"));
        let child = Command::new("ip")
            .args(["netns", "exec", ns, "python3", "-c", FLOW_PY, mode, addr])
            .args([port.to_string(), secs.to_string()])
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 flow");
        self.children.push(child);
        out
    }

    /// `show conntrack --json`'s entry whose original direction goes to `dst:dport`/`proto`.
    fn ct_entry(&self, proto: u64, dst: &str, dport: u16) -> Option<Value> {
        let out = self.tapyard(&["show", "conntrack", "--json"]);
        let rows: Vec<Value> = serde_json::from_str(&out).unwrap();
        rows.into_iter()
            .find(|e| e["proto"] == proto && e["orig"]["dst"] == dst && e["orig"]["dport"] == dport)
    }
}

/// A flow's output: `(time, answer)` of each answer, and its errors.
fn flow_lines(path: &std::path::Path) -> (Vec<(f64, String)>, Vec<String>) {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut ok = Vec::new();
    let mut errors = Vec::new();
    for l in text.lines() {
        let mut w = l.splitn(3, ' ');
        match (w.next(), w.next(), w.next()) {
            (Some("ok"), Some(t), Some(rest)) => ok.push((t.parse().unwrap(), rest.to_string())),
            (Some("error"), _, _) => errors.push(l.to_string()),
            _ => {}
        }
    }
    (ok, errors)
}

#[test]
#[cfg_attr(
    not(tapyard_root),
    ignore = "needs root: TAP devices and network namespaces (runs as root, as in CI)"
)]
fn flows_survive_restart() {
    if skip("flows_survive_restart") {
        return;
    }
    let mut r = Rig::new("fl");
    r.set_up();
    let (a, b, out) = (r.ns_a.clone(), r.ns_b.clone(), r.ns_out.clone());
    spawn_in(
        &mut r.children,
        &b,
        &["python3", "-c", ECHO_PY, "node-b", "8081", "5353"],
    );
    // Each Service has a second endpoint, answering with another ident: a connection whose
    // NAT binding were lost would be balanced anew (and a UDP flow would show it).
    spawn_in(
        &mut r.children,
        &b,
        &["python3", "-c", ECHO_PY, "node-b2", "8082", "5354"],
    );
    spawn_in(
        &mut r.children,
        &out,
        &["python3", "-c", ECHO_PY, "outside", "9000", "0"],
    );
    wait_listening(&b, 8081);
    wait_listening(&b, 8082);
    wait_listening(&out, 9000);
    // Three flows from pod-a, each one connection for the whole test: TCP to a ClusterIP
    // (DNAT'd to node-b's pod, reached by a route), TCP to the outside host (masqueraded to
    // the uplink's address), UDP to a ClusterIP.
    let flows = [
        ("web", "tcp", WEB_VIP, 80u16, 6u64),
        ("outside", "tcp", OUTSIDE, 9000, 6),
        ("dns", "udp", DNS_VIP, 53, 17),
    ];
    // And pings, routed to node-b's pod and masqueraded to the outside host, to time the
    // restarts.
    let pings = [
        ("routed ping", r.ping_bg(NODE_B_POD)),
        ("masqueraded ping", r.ping_bg(OUTSIDE)),
    ];
    // Longer than the test: they are stopped once both restarts are done.
    let secs = 120.0;
    let files: Vec<PathBuf> = flows
        .iter()
        .map(|(_, mode, addr, port, _)| r.flow(&a, mode, addr, *port, secs))
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    let before: Vec<Value> = flows
        .iter()
        .map(|(name, _, addr, port, proto)| {
            r.ct_entry(*proto, addr, *port)
                .unwrap_or_else(|| panic!("{name}: no conntrack entry"))
        })
        .collect();
    let mut restarts = Vec::new();
    let rounds = [
        ("kill -9", Rig::kill9 as fn(&mut Rig)),
        ("SIGTERM", Rig::stop),
    ];
    for (round, how) in rounds {
        how(&mut r);
        std::thread::sleep(Duration::from_millis(500));
        let t0 = unix(r.start());
        restarts.push((round, t0));
        for (what, out) in &pings {
            let gap = first_reply_after(out, t0);
            println!("{round}: {what}: first reply {gap:?} after the restart (exec)");
            // The gateway announces itself at start: the pod does not wait for its next ARP
            // retry (up to a second).
            assert!(gap < Duration::from_secs(2), "{round}: {what}: {gap:?}");
        }
        // The connections are listed again, with the same NAT (the reply tuple holds the
        // endpoint chosen and the masquerade port).
        for ((name, _, addr, port, proto), old) in flows.iter().zip(&before) {
            let e = r
                .ct_entry(*proto, addr, *port)
                .unwrap_or_else(|| panic!("{round}: {name}: no conntrack entry after the restart"));
            assert_eq!(e["orig"], old["orig"], "{round}: {name}");
            assert_eq!(e["reply"], old["reply"], "{round}: {name}");
        }
        std::thread::sleep(Duration::from_millis(2500));
    }
    // Each flow ran the whole time: no reset, the same endpoint throughout, answers again
    // after each restart.
    for c in r.children.iter_mut().rev().take(flows.len()) {
        assert!(c.try_wait().unwrap().is_none(), "a flow ended early");
        let _ = c.kill();
        let _ = c.wait();
    }
    for ((name, ..), file) in flows.iter().zip(&files) {
        let (ok, errors) = flow_lines(file);
        assert!(errors.is_empty(), "{name}: {errors:?}");
        assert!(
            ok.len() > 20,
            "{name}: {} answers:\n{}",
            ok.len(),
            std::fs::read_to_string(file).unwrap_or_default()
        );
        // `<ident> <peer as the server saw it> <n>`: one endpoint (the ident) and one peer
        // throughout.
        let peer = |s: &String| s.rsplit_once(' ').map(|(p, _)| p.to_string()).unwrap();
        let first = peer(&ok[0].1);
        assert!(
            ok.iter().all(|(_, s)| peer(s) == first),
            "{name}: the server saw another peer: {:?}",
            ok.iter().map(|(_, s)| s).collect::<Vec<_>>()
        );
        for (round, t0) in &restarts {
            let resumed = ok
                .iter()
                .find(|(t, _)| t > t0)
                .unwrap_or_else(|| panic!("{name}: no answer after the {round} restart"));
            println!(
                "{name} ({first}): first answer {:.0} ms after the {round} restart (exec)",
                (resumed.0 - t0) * 1000.0
            );
        }
    }
}

/// `src dst count [first_dport]`: `count` TCP SYNs from `src` to `dst` over a raw socket, each
/// with its own (source port, destination port from `first_dport`, default 1), checksums
/// right, paced so that the TAP queue keeps up.
const SYNS_PY: &str = r#"
import socket, struct, sys, time
src, dst, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
first = int(sys.argv[4]) if len(sys.argv) > 4 else 1
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
S, D = socket.inet_aton(src), socket.inet_aton(dst)
def csum(b):
    t = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    while t >> 16:
        t = (t & 0xffff) + (t >> 16)
    return ~t & 0xffff
for i in range(n):
    sport, dport = 1024 + i % 64000, first + i // 64000
    tcp = struct.pack("!HHIIBBHHH", sport, dport, i, 0, 5 << 4, 0x02, 65535, 0, 0)
    c = csum(S + D + struct.pack("!BBH", 0, 6, 20) + tcp)
    tcp = tcp[:16] + struct.pack("!H", c) + tcp[18:]
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 40, i & 0xffff, 0, 64, 6, 0, S, D)
    while True:
        try:
            s.sendto(ip + tcp, (dst, 0))
            break
        except OSError:
            time.sleep(0.001)
    if i % 1000 == 999:
        time.sleep(0.01)
"#;

impl Rig {
    /// The `connections` gauge of `show stats`.
    fn connections(&self) -> u64 {
        let out = self.tapyard(&["show", "stats"]);
        out.split_whitespace()
            .skip_while(|w| *w != "connections")
            .nth(1)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no connections gauge in show stats: {out}"))
    }
}

/// The time from a restart to forwarding again with a full connection table (262,144
/// entries, the default `max_entries`): SYNs from pod-a to an address behind node-b that never
/// answers fill it (each stays SYN_SENT for 120 s), then the node is killed and restarted while
/// pod-a pings node-b's pod. Every connection is kept, and forwarding resumes within a
/// second (the issue's target; about 0.15 s measured in a debug build). Then `kill -9` in the
/// middle of a second SYN flood (new connections evicting old ones from the full table): the
/// restarted node keeps a full table and new connections work.
#[test]
#[cfg_attr(
    not(tapyard_root),
    ignore = "needs root: TAP devices and network namespaces (runs as root, as in CI)"
)]
fn full_table_restart_time() {
    if skip("full_table_restart_time") {
        return;
    }
    let mut r = Rig::new("ft");
    r.set_up();
    let ping = r.ping_bg(NODE_B_POD);
    let a = r.ns_a.clone();
    let t = Instant::now();
    let out = run_output(&[
        "ip",
        "netns",
        "exec",
        &a,
        "python3",
        "-c",
        SYNS_PY,
        POD_A,
        "10.230.2.99",
        "300000",
    ]);
    assert!(out.status.success(), "{out:?}");
    let n = r.connections();
    println!("{n} connections after {:?} of SYNs", t.elapsed());
    assert!(n >= 250_000, "only {n} connections");
    for (round, how) in [
        ("kill -9", Rig::kill9 as fn(&mut Rig)),
        ("SIGTERM", Rig::stop),
    ] {
        how(&mut r);
        std::thread::sleep(Duration::from_millis(300));
        let t0 = unix(r.start());
        let gap = first_reply_after(&ping, t0);
        let n = r.connections();
        println!("{round} with {n} connections: first routed ping reply {gap:?} after the restart (exec)");
        assert!(n >= 250_000, "{round}: only {n} connections kept");
        // Generous for a loaded CI machine; the figure is printed.
        assert!(gap < Duration::from_secs(3), "{round}: {gap:?}");
    }
    // kill -9 during a SYN flood of new connections into the full table.
    let flood = Command::new("ip")
        .args([
            "netns",
            "exec",
            &a,
            "python3",
            "-c",
            SYNS_PY,
            POD_A,
            "10.230.2.98",
        ])
        .args(["300000", "100"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("SYN flood");
    r.children.push(flood);
    std::thread::sleep(Duration::from_millis(1500));
    r.kill9();
    if let Some(mut c) = r.children.pop() {
        let _ = c.kill();
        let _ = c.wait();
    }
    r.start();
    let n = r.connections();
    println!("kill -9 during a SYN flood: {n} connections kept");
    assert!(n >= 250_000, "only {n} connections kept");
    let got = exchange(&r.ns_pb, "tcp", NODE_B_POD, 8080, 3);
    assert!(got.iter().all(|(who, _)| who == "node-b"), "{got:?}");
    ping_ok(&r.ns_a, NODE_B_POD);
    let log = r.log_text();
    for l in log
        .lines()
        .filter(|l| l.contains("conntrack:") || l.contains("running"))
    {
        println!("{l}");
    }
}

/// The config of the small node of the hardening tests: bridge cni0 with TAP `tap`, its
/// state in `state`.
fn small_node(dir: &std::path::Path, state: &std::path::Path, tap: &str) -> (PathBuf, PathBuf) {
    let socket = dir.join("node.sock");
    let config = dir.join("node.toml");
    let text = format!(
        "{}\n[[bridge]]\nname = \"cni0\"\naddress = \"10.244.1.1/24\"\nports = [\"{tap}\"]\n",
        node_toml("hs", "\"10.244.0.0/16\"", &socket, Some(state))
    );
    std::fs::write(&config, text).unwrap();
    (config, socket)
}

/// The small node's test rig: its directory (`tapyard-<what>-<tag>` under the temp dir,
/// removed first), the node's log, the cleanup guard and the node's namespace (`ty<ab><tag>`,
/// `ab` two letters naming the test): `(tag, dir, log, guard, namespace)`.
fn small_rig(what: &str, ab: &str) -> (String, PathBuf, PathBuf, Guard, String) {
    let tag = format!("{}", std::process::id() % 100_000);
    let dir = std::env::temp_dir().join(format!("tapyard-{what}-{tag}"));
    let _ = std::fs::remove_dir_all(&dir);
    let log = dir.join("run.log");
    let mut g = Guard::new(&dir, &log);
    let ns = format!("ty{ab}{tag}");
    g.ns(&ns);
    (tag, dir, log, g, ns)
}

/// `tapyard run` that must be refused at start: exit status 2, and its log names `path`
/// and says `why`.
fn refused_start(
    ns: &str,
    config: &std::path::Path,
    log: &std::path::Path,
    path: &std::path::Path,
    why: &str,
) {
    let before = std::fs::read_to_string(log).map_or(0, |t| t.len());
    let child = tapyard_run(Some(ns), config, &[], log).spawn().unwrap();
    let out = wait_output(child, CMD_TIMEOUT, "tapyard run (to be refused)");
    let text = std::fs::read_to_string(log).unwrap_or_default()[before..].to_string();
    assert_eq!(out.status.code(), Some(2), "{}: {text}", path.display());
    assert!(
        text.contains(&path.display().to_string()) && text.contains(why),
        "expected {why:?} about {}: {text}",
        path.display()
    );
}

fn mode_of(p: &std::path::Path) -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

fn set_mode(p: &std::path::Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
#[cfg_attr(
    not(tapyard_root),
    ignore = "needs root: TAP devices and network namespaces (runs as root, as in CI)"
)]
fn a_hostile_state_directory_is_refused_and_a_forged_record_deletes_no_other_link() {
    if skip("a_hostile_state_directory_is_refused_and_a_forged_record_deletes_no_other_link") {
        return;
    }
    let (tag, dir, log, mut g, ns) = small_rig("hostile", "hs");
    let state = dir.join("state");
    let tap = format!("tyhs{tag}");
    let (config, socket) = small_node(&dir, &state, &tap);
    let victim = dir.join("victim");
    std::fs::write(&victim, "root's file").unwrap();

    // A state directory another user made (and so could fill with links).
    std::fs::create_dir(&state).unwrap();
    set_mode(&state, 0o700);
    run(&["chown", "65534:65534", &state.display().to_string()]);
    refused_start(&ns, &config, &log, &state, "is owned by uid 65534");
    run(&["chown", "0:0", &state.display().to_string()]);

    // Links planted where tapyard writes: refused, the victim untouched.
    for name in ["ports.json.tmp", "conntrack", "conntrack6", "ports.json"] {
        let link = state.join(name);
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        refused_start(&ns, &config, &log, &link, "is a symbolic link");
        std::fs::remove_file(&link).unwrap();
    }
    // A table file others may write (mapped shared, it would be theirs to rewrite).
    let ct = state.join("conntrack");
    std::fs::write(&ct, "").unwrap();
    set_mode(&ct, 0o666);
    refused_start(
        &ns,
        &config,
        &log,
        &ct,
        "has mode 0666: writable by group or others",
    );
    std::fs::remove_file(&ct).unwrap();
    // A hard link to root's file.
    std::fs::hard_link(&victim, &ct).unwrap();
    refused_start(&ns, &config, &log, &ct, "hard links");
    std::fs::remove_file(&ct).unwrap();
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "root's file");
    // A parent others may write to (without the sticky bit of /tmp).
    let open = dir.join("open");
    std::fs::create_dir(&open).unwrap();
    set_mode(&open, 0o777);
    let (config2, _) = small_node(&dir, &open.join("state"), &tap);
    refused_start(&ns, &config2, &log, &open, "(a parent) has mode 0777");
    assert!(!open.join("state").exists());
    small_node(&dir, &state, &tap);
    // The state directory itself a link to another directory.
    std::fs::rename(&state, dir.join("real-state")).unwrap();
    std::os::unix::fs::symlink(dir.join("real-state"), &state).unwrap();
    refused_start(&ns, &config, &log, &state, "is a symbolic link");
    std::fs::remove_file(&state).unwrap();
    std::fs::rename(dir.join("real-state"), &state).unwrap();

    // Modes that let others read are fixed at start, with a log line; the files tapyard
    // writes are 0600, the directory 0700.
    set_mode(&state, 0o755);
    std::fs::write(state.join("ports.json"), b"not a record").unwrap();
    set_mode(&state.join("ports.json"), 0o644);
    g.start_node(Some(&ns), &config, &[], &socket);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains(&format!(
            "{} had mode 0755, readable by others: set to 0700",
            state.display()
        )),
        "{text}"
    );
    assert!(
        text.contains("had mode 0644, readable by others: set to 0600"),
        "{text}"
    );
    wait_for("the port record", Duration::from_secs(10), || {
        std::fs::read_to_string(state.join("ports.json"))
            .ok()
            .filter(|t| t.contains(&tap))
            .ok_or_else(|| "not written yet".to_string())
    });
    assert_eq!(mode_of(&state), 0o700);
    for f in ["ports.json", "conntrack", "takeover.sock"] {
        assert_eq!(mode_of(&state.join(f)), 0o600, "{f}");
    }
    assert!(g.stop_node().success());

    // A forged record naming a bridge and a veth (as it could name the host's eth0, whose
    // name, ifindex and MAC are public): cleanup deletes the node's own TAP only.
    let bridge = format!("tyhb{tag}");
    let dummy = format!("tyhd{tag}");
    run(&["ip", "-n", &ns, "link", "add", &bridge, "type", "bridge"]);
    let peer = format!("tyhe{tag}");
    run(&[
        "ip", "-n", &ns, "link", "add", &dummy, "type", "veth", "peer", "name", &peer,
    ]);
    let mut rec: Value =
        serde_json::from_str(&std::fs::read_to_string(state.join("ports.json")).unwrap()).unwrap();
    let links: Value =
        serde_json::from_str(&run(&["ip", "-n", &ns, "-j", "link", "show"])).unwrap();
    for name in [&bridge, &dummy] {
        let l = links
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["ifname"] == name.as_str())
            .unwrap();
        let mut forged = rec["ports"][0].clone();
        forged["name"] = json!(name);
        forged["tap"] = json!(name);
        forged["ifname"] = json!(name);
        forged["mac"] = l["address"].clone();
        forged["ifindex"] = l["ifindex"].clone();
        rec["ports"].as_array_mut().unwrap().push(forged);
    }
    std::fs::write(state.join("ports.json"), serde_json::to_vec(&rec).unwrap()).unwrap();
    set_mode(&state.join("ports.json"), 0o600);
    let out = run_output(&[
        "ip",
        "netns",
        "exec",
        &ns,
        TAPYARD,
        "cleanup",
        &config.display().to_string(),
    ]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    println!("cleanup:\n{stdout}{stderr}");
    assert!(!out.status.success(), "{stdout}{stderr}");
    assert!(
        stdout.contains(&format!("TAP {tap} in tapyard's namespace deleted")),
        "{stdout}"
    );
    for name in [&bridge, &dummy] {
        assert!(
            stderr.contains(&format!("interface \"{name}\""))
                && stderr.contains("is not a TAP device tapyard created"),
            "{stderr}"
        );
        run(&["ip", "-n", &ns, "link", "show", name]);
    }
    assert!(!run_output(&["ip", "-n", &ns, "link", "show", &tap])
        .status
        .success());
}

/// One takeover message as the protocol frames it: a little-endian length, then JSON.
fn takeover_send(s: &mut std::os::unix::net::UnixStream, v: &Value) {
    use std::io::Write;
    let body = serde_json::to_vec(v).unwrap();
    s.write_all(&u32::try_from(body.len()).unwrap().to_le_bytes())
        .unwrap();
    s.write_all(&body).unwrap();
}

fn takeover_recv(s: &mut std::os::unix::net::UnixStream) -> Value {
    use std::io::Read;
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut len = [0u8; 4];
    s.read_exact(&mut len).unwrap();
    let mut body = vec![0u8; u32::from_le_bytes(len) as usize];
    s.read_exact(&mut body).unwrap();
    serde_json::from_slice(&body).unwrap()
}

#[test]
#[cfg_attr(
    not(tapyard_root),
    ignore = "needs root: TAP devices and network namespaces (runs as root, as in CI)"
)]
fn a_stalled_takeover_peer_blocks_no_one_and_sigterm_ends_it() {
    if skip("a_stalled_takeover_peer_blocks_no_one_and_sigterm_ends_it") {
        return;
    }
    let (tag, dir, log, mut g, ns) = small_rig("stall", "st");
    let state = dir.join("state");
    let (config, socket) = small_node(&dir, &state, &format!("tyst{tag}"));
    g.start_node(Some(&ns), &config, &[], &socket);
    let hello = json!({"msg": "hello", "version": 1, "node": "hs", "pid": 4242});

    // A peer says hello, takes the offer and stalls: the node goes on answering control
    // requests, read-only and changing ones alike.
    let mut peer = std::os::unix::net::UnixStream::connect(state.join("takeover.sock")).unwrap();
    takeover_send(&mut peer, &hello);
    let offer = takeover_recv(&mut peer);
    assert_eq!(offer["msg"], "offer", "{offer}");
    let t0 = Instant::now();
    let status = tapyard_ok_at(&socket, &["status"]);
    assert!(status.contains("node hs"), "{status}");
    let added = format!("tysp{tag}");
    tapyard_ok_at(&socket, &["port", "add", "cni0", &added]);
    assert!(tapyard_ok_at(&socket, &["show", "ports"]).contains(&added));
    println!(
        "3 control requests answered during the stall in {:?}",
        t0.elapsed()
    );
    // Ready at last: the node changed meanwhile, so nothing is handed over.
    takeover_send(&mut peer, &json!({"msg": "ready"}));
    let abort = takeover_recv(&mut peer);
    assert_eq!(abort["msg"], "abort", "{abort}");
    assert!(
        abort["error"]
            .as_str()
            .unwrap()
            .contains("the node's ports changed"),
        "{abort}"
    );
    drop(peer);
    // The node forwards and answers as before.
    tapyard_ok_at(&socket, &["status"]);

    // Stalled again, then SIGTERM: the node stops at once (exit 0), whatever the peer does.
    let mut peer = std::os::unix::net::UnixStream::connect(state.join("takeover.sock")).unwrap();
    takeover_send(&mut peer, &hello);
    assert_eq!(takeover_recv(&mut peer)["msg"], "offer");
    let node = g.node.take().unwrap();
    let t0 = Instant::now();
    run(&["kill", "-TERM", &node.id().to_string()]);
    let out = wait_output(
        node,
        Duration::from_secs(5),
        "tapyard run after SIGTERM during a stalled takeover",
    );
    println!("stopped {:?} after SIGTERM", t0.elapsed());
    assert!(out.status.success(), "{}", out.status);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("stopping (signal)"), "{text}");
}

/// Unmounts a test's tmpfs on drop, failing or not.
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = run_output(&["umount", "-l", &self.0.display().to_string()]);
    }
}

#[test]
#[cfg_attr(
    not(tapyard_root),
    ignore = "needs root: TAP devices and network namespaces (runs as root, as in CI)"
)]
fn a_state_tmpfs_without_room_for_the_table_is_a_start_error() {
    if skip("a_state_tmpfs_without_room_for_the_table_is_a_start_error") {
        return;
    }
    let (tag, dir, log, mut g, ns) = small_rig("small", "sm");
    let small = dir.join("small");
    std::fs::create_dir(&small).unwrap();
    run(&[
        "mount",
        "-t",
        "tmpfs",
        "-o",
        "size=40m",
        "tmpfs",
        &small.display().to_string(),
    ]);
    let _mounted = Mounted(small.clone());
    let state = small.join("state");
    let tap = format!("tysm{tag}");
    let (config, socket) = small_node(&dir, &state, &tap);
    // The default table (262,144 entries, 32 MiB) fits: reserved whole at start.
    g.start_node(Some(&ns), &config, &[], &socket);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("; reserved, on "), "{text}");
    assert!(g.stop_node().success());
    // Twice the entries no longer fit: refused at start, naming the file, the bytes needed
    // and the bytes free, instead of a SIGBUS at some later new connection.
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        format!("{text}\n[conntrack]\nmax_entries = 524288\n"),
    )
    .unwrap();
    refused_start(
        &ns,
        &config,
        &log,
        &state.join("conntrack"),
        "no room for the table",
    );
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("bytes needed") && text.contains("bytes free"),
        "{text}"
    );
}
