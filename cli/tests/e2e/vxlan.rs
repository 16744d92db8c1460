//! End-to-end test of the VXLAN overlay: three nodes on one underlay, as a Flannel cluster.
//!
//! ```text
//!  node A: tapyard (socket a.sock)           node C: tapyard (socket c.sock)
//!   pod-a 10.216.1.2 ── TAP ─ cni0 .1/24      pod-c 10.216.3.2 ── TAP ─ cni0 .1/24
//!   flannel.1 10.216.1.0/32                   flannel.1 10.216.3.0/32
//!   uplink TAP 10.219.0.2/24 ─┐               uplink TAP 10.219.0.4/24 ─┐
//!  wire ns: Linux bridge br0 ─┴───────────────────────────────────────────┴─ veth ─┐
//!  node B ns: Linux, eth0 10.219.0.3/24, flannel.1 (kernel vxlan, as Flannel), 10.216.2.0/32
//!   pod-b ns 10.216.2.2/24 ── veth ── 10.216.2.1 (node B routes, ip_forward)
//! ```
//!
//! Checked: PMTU across the overlay from a pod with MTU 1500 (a DF ping with 1422 bytes of
//! payload passes, 1423 gets fragmentation needed with MTU 1450 from node A); pods on all
//! three nodes ping each other; TCP both ways keeps the client's address; 24 MiB from pod-a
//! to pod-b (Linux) and pod-c (tapyard), and pod-b to pod-a, arrive intact (SHA-256); a
//! ClusterIP Service on node A with an endpoint on B and one on C spreads connections over
//! both and keeps the client's address; the underlay carries pod traffic only as UDP to port
//! 8472 (tcpdump on the wire bridge); `show vxlan|routes|neigh|fdb [--json]` list the peers
//! and count their packets; a reload that removes node C's peer on node A stops traffic to
//! and from it at once (dropped as `vxlan_unknown_peer`), and one that adds it back restores
//! it.
//!
//! Needs root, `ip`, `bridge`, `ping`, `python3` and `tcpdump`; without them it prints why and
//! passes, except under `CI=true`, where it fails. Names carry the process id; a guard kills
//! both nodes and deletes the namespaces on success and failure alike. Traffic goes only to
//! addresses in namespaces the test creates (10.216.x.y, 10.219.0.x).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common;
use crate::common::flannel;
use crate::common::*;
use flannel::{linux_flannel, transfer_checked, Remote};

const BIN: &str = env!("CARGO_BIN_EXE_tapyard");

const POD_A: &str = "10.216.1.2";
const POD_B: &str = "10.216.2.2";
const POD_C: &str = "10.216.3.2";
const NODE_A: &str = "10.219.0.2";
const NODE_B: &str = "10.219.0.3";
const NODE_C: &str = "10.219.0.4";
const VTEP_A: &str = "0a:58:0a:d8:01:00";
const VTEP_B: &str = "0a:58:0a:d8:02:00";
const VTEP_C: &str = "0a:58:0a:d8:03:00";
const WEB_VIP: &str = "10.96.0.10";

fn skip_reason() -> Option<String> {
    missing(&[
        ("ip", "-V", "iproute2"),
        ("bridge", "-V", "iproute2"),
        ("ping", "-V", "iputils"),
        ("python3", "-V", "servers, clients, the checked transfer"),
        ("tcpdump", "--version", "the underlay check"),
    ])
}

fn skip_or_fail() -> bool {
    common::skip_or_fail("vxlan", skip_reason())
}

/// One run's names.
struct Names {
    id: u32,
    dir: PathBuf,
    ns_wire: String,
    ns_b: String,
    ns_pa: String,
    ns_pb: String,
    ns_pc: String,
}

impl Names {
    fn tap(&self, what: &str) -> String {
        format!("tyv{what}{}", self.id)
    }

    fn sock(&self, node: &str) -> PathBuf {
        self.dir.join(format!("{node}.sock"))
    }

    fn conf(&self, node: &str) -> PathBuf {
        self.dir.join(format!("{node}.toml"))
    }

    /// Node A's or C's config (`n` = 1 or 3), with the given peers (node, pod subnet
    /// number, VTEP MAC).
    fn config(&self, node: &str, n: u8, peers: &[(&str, u8, &str)]) -> String {
        let mut s = format!(
            r#"{node}
[[bridge]]
name = "cni0"
address = "10.216.{n}.1/24"
ports = ["{pod}"]

[[uplink]]
name = "eth0"
tap = "{up}"
address = "10.219.0.{host}/24"

[[vxlan]]
name = "flannel.1"
vni = 1
port = 8472
uplink = "eth0"
address = "10.216.{n}.0/32"

[masquerade]
out = "eth0"
"#,
            node = node_toml(
                &format!("vx-{node}"),
                r#""10.216.0.0/16""#,
                &self.sock(node),
                None,
            ),
            pod = self.tap(&format!("p{node}")),
            up = self.tap(&format!("u{node}")),
            host = n + 1,
        );
        for (ip, sub, mac) in peers {
            s += &format!(
                "\n[[vxlan.peer]]\nnode_ip = \"{ip}\"\nvtep_mac = \"{mac}\"\npod_cidr = \"10.216.{sub}.0/24\"\n"
            );
        }
        if node == "a" {
            s += &format!(
                "\n[[service]]\nname = \"web\"\ncluster_ip = \"{WEB_VIP}\"\nprotocol = \"tcp\"\nport = 80\nendpoints = [\"{POD_B}:8080\", \"{POD_C}:8080\"]\n"
            );
        }
        s
    }
}

fn start_node(g: &mut Guard, n: &Names, node: &str, conf: &str) {
    std::fs::write(n.conf(node), conf).unwrap();
    let check = run(&[BIN, "check", &n.conf(node).display().to_string()]);
    assert!(check.contains("1 vxlan interface"), "{check}");
    let log = n.dir.join(format!("{node}.log"));
    let mut child = tapyard_run(None, &n.conf(node), &[], &log)
        .spawn()
        .expect("start tapyard run");
    wait_for_socket(Some(&mut child), &n.sock(node));
    g.children.push(child);
}

/// A pod TAP into its namespace: address, MTU 1500, default route via the gateway.
fn attach_pod(ns: &str, tap: &str, addr: &str, gw: &str) {
    ns_named(ns).attach(None, tap, &[&format!("{addr}/24")], &[gw]);
}

fn show(n: &Names, node: &str, args: &[&str]) -> String {
    tapyard_ok_at(&n.sock(node), args)
}

fn drops(n: &Names, node: &str, reason: &str) -> u64 {
    let v: serde_json::Value =
        serde_json::from_str(&show(n, node, &["show", "stats", "--json"])).unwrap();
    v["drops"][reason].as_u64().unwrap_or(0)
}

#[test]
#[cfg_attr(
    not(tapyard_root),
    ignore = "needs root: TAP devices and network namespaces (runs as root, as in CI)"
)]
fn overlay_with_linux_and_tapyard_nodes() {
    if skip_or_fail() {
        return;
    }
    let id = std::process::id() % 100_000;
    let dir = std::env::temp_dir().join(format!("tapyard-vxlan-{id}"));
    std::fs::create_dir_all(&dir).unwrap();
    let n = Names {
        id,
        dir: dir.clone(),
        ns_wire: format!("tyv-wire-{id}"),
        ns_b: format!("tyv-b-{id}"),
        ns_pa: format!("tyv-pa-{id}"),
        ns_pb: format!("tyv-pb-{id}"),
        ns_pc: format!("tyv-pc-{id}"),
    };
    let mut g = Guard::new(&dir, &dir.join("a.log"));
    g.logs.push(dir.join("c.log"));
    let a_peers = [(NODE_B, 2, VTEP_B), (NODE_C, 3, VTEP_C)];
    start_node(&mut g, &n, "a", &n.config("a", 1, &a_peers));
    start_node(
        &mut g,
        &n,
        "c",
        &n.config("c", 3, &[(NODE_A, 1, VTEP_A), (NODE_B, 2, VTEP_B)]),
    );
    for ns in [&n.ns_wire, &n.ns_b, &n.ns_pa, &n.ns_pb, &n.ns_pc] {
        g.ns(ns);
    }
    attach_pod(&n.ns_pa, &n.tap("pa"), POD_A, "10.216.1.1");
    attach_pod(&n.ns_pc, &n.tap("pc"), POD_C, "10.216.3.1");
    // The underlay: both uplink TAPs and node B's veth on one Linux bridge.
    let w = &n.ns_wire;
    run(&["ip", "-n", w, "link", "add", "br0", "type", "bridge"]);
    run(&["ip", "-n", w, "link", "set", "br0", "up"]);
    for up in [n.tap("ua"), n.tap("uc")] {
        run(&["ip", "link", "set", &up, "netns", w]);
        run(&["ip", "-n", w, "link", "set", &up, "master", "br0"]);
        run(&["ip", "-n", w, "link", "set", &up, "up"]);
    }
    run(&[
        "ip", "-n", w, "link", "add", "vb", "type", "veth", "peer", "name", "eth0", "netns",
        &n.ns_b,
    ]);
    run(&["ip", "-n", w, "link", "set", "vb", "master", "br0"]);
    run(&["ip", "-n", w, "link", "set", "vb", "up"]);
    // Node B: Linux, with Flannel's vxlan device and a pod behind a veth.
    let b = &n.ns_b;
    link_up(b, "eth0", &[&format!("{NODE_B}/24")]);
    run(&[
        "ip",
        "netns",
        "exec",
        b,
        "sysctl",
        "-qw",
        "net.ipv4.ip_forward=1",
    ]);
    linux_flannel(
        b,
        "eth0",
        NODE_B,
        "10.216.2.0",
        VTEP_B,
        &[
            Remote {
                node_ip: NODE_A,
                vtep_mac: VTEP_A,
                pod_cidr: "10.216.1.0/24",
            },
            Remote {
                node_ip: NODE_C,
                vtep_mac: VTEP_C,
                pod_cidr: "10.216.3.0/24",
            },
        ],
    );
    run(&[
        "ip", "-n", b, "link", "add", "vpod", "type", "veth", "peer", "name", "eth0", "netns",
        &n.ns_pb,
    ]);
    run(&["ip", "-n", b, "addr", "add", "10.216.2.1/24", "dev", "vpod"]);
    run(&["ip", "-n", b, "link", "set", "vpod", "up"]);
    let pb = &n.ns_pb;
    addr_add(pb, &format!("{POD_B}/24"), "eth0");
    run(&["ip", "-n", pb, "link", "set", "eth0", "up"]);
    run(&["ip", "-n", pb, "link", "set", "lo", "up"]);
    run(&[
        "ip",
        "-n",
        pb,
        "route",
        "add",
        "default",
        "via",
        "10.216.2.1",
    ]);

    // The underlay, captured for the whole run.
    let pcap = dir.join("wire.pcap");
    let dump = Command::new("ip")
        .args([
            "netns", "exec", w, "tcpdump", "-i", "br0", "-nn", "-U", "-s", "128", "-w",
        ])
        .arg(&pcap)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start tcpdump");
    let dump_pid = dump.id();
    g.children.push(dump);
    let deadline = Instant::now() + Duration::from_secs(5);
    while !pcap.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));

    pmtu(&n);
    // Every pod reaches every other.
    for (from, to) in [
        (&n.ns_pa, POD_B),
        (&n.ns_pa, POD_C),
        (&n.ns_pb, POD_A),
        (&n.ns_pb, POD_C),
        (&n.ns_pc, POD_A),
        (&n.ns_pc, POD_B),
    ] {
        ping_ok(from, to);
    }
    // TCP both ways, the client's address kept (no masquerade inside the cluster CIDR).
    for (ns, ident) in [
        (&n.ns_pa, "pod-a"),
        (&n.ns_pb, "pod-b"),
        (&n.ns_pc, "pod-c"),
    ] {
        spawn_in(
            &mut g.children,
            ns,
            &["python3", "-c", SERVER_PY, ident, "8080", "0"],
        );
    }
    for ns in [&n.ns_pa, &n.ns_pb, &n.ns_pc] {
        wait_listening(ns, 8080);
    }
    for (from, src, to, ident) in [
        (&n.ns_pa, POD_A, POD_B, "pod-b"),
        (&n.ns_pb, POD_B, POD_A, "pod-a"),
        (&n.ns_pa, POD_A, POD_C, "pod-c"),
        (&n.ns_pc, POD_C, POD_A, "pod-a"),
        (&n.ns_pc, POD_C, POD_B, "pod-b"),
    ] {
        let got = exchange(from, "tcp", to, 8080, 2);
        assert!(
            got.iter().all(|(who, seen)| who == ident && seen == src),
            "{got:?}"
        );
    }
    // Large transfers, checked end to end.
    transfer_checked(&n.ns_pa, &n.ns_pb, POD_B, 9001, 24);
    transfer_checked(&n.ns_pb, &n.ns_pa, POD_A, 9002, 24);
    transfer_checked(&n.ns_pa, &n.ns_pc, POD_C, 9003, 24);
    transfer_checked(&n.ns_pc, &n.ns_pa, POD_A, 9004, 24);
    // A ClusterIP on node A with endpoints on B and C: spread, client address kept.
    let got = exchange(&n.ns_pa, "tcp", WEB_VIP, 80, 24);
    for ident in ["pod-b", "pod-c"] {
        assert!(
            got.iter().any(|(who, _)| who == ident),
            "never reached {ident}: {got:?}"
        );
    }
    assert!(got.iter().all(|(_, seen)| seen == POD_A), "{got:?}");

    tables(&n);

    // The underlay saw pod traffic only as UDP to 8472.
    run(&["kill", "-INT", &dump_pid.to_string()]);
    std::thread::sleep(Duration::from_millis(500));
    let p = pcap.display().to_string();
    // (The wire bridge's own IGMP reports from 0.0.0.0 are link noise, not pod traffic.)
    let other = run(&[
        "tcpdump",
        "-nn",
        "-r",
        &p,
        "ip and not udp port 8472 and not igmp",
    ]);
    assert!(
        other.trim().is_empty(),
        "IPv4 on the underlay other than VXLAN:\n{other}"
    );
    for (src, dst) in [
        (NODE_A, NODE_B),
        (NODE_B, NODE_A),
        (NODE_A, NODE_C),
        (NODE_C, NODE_A),
        (NODE_B, NODE_C),
        (NODE_C, NODE_B),
    ] {
        let f = format!("src host {src} and dst host {dst} and udp dst port 8472");
        let one = run(&["tcpdump", "-nn", "-q", "-c", "1", "-r", &p, &f]);
        assert!(
            !one.trim().is_empty(),
            "no VXLAN from {src} to {dst} on the underlay"
        );
    }
    println!("underlay: VXLAN between every pair of nodes, no other IPv4");

    reload_removes_a_peer(&n);
}

/// From pod-a (MTU 1500): a DF ping with 1422 bytes of payload (1450 in all) passes through
/// the overlay; 1423 gets fragmentation needed with MTU 1450 from node A's gateway.
fn pmtu(n: &Names) {
    for to in [POD_C, POD_B] {
        let ok = run_output(&[
            "ip", "netns", "exec", &n.ns_pa, "ping", "-n", "-c", "1", "-W", "3", "-M", "do", "-s",
            "1422", to,
        ]);
        assert!(
            ok.status.success(),
            "1422 to {to}: {}",
            String::from_utf8_lossy(&ok.stdout)
        );
        let big = run_output(&[
            "ip", "netns", "exec", &n.ns_pa, "ping", "-n", "-c", "1", "-W", "3", "-M", "do", "-s",
            "1423", to,
        ]);
        let text = String::from_utf8_lossy(&big.stdout).to_string()
            + &String::from_utf8_lossy(&big.stderr);
        assert!(!big.status.success(), "1423 to {to} passed:\n{text}");
        assert!(
            text.contains("From 10.216.1.1") && text.contains("mtu = 1450"),
            "1423 to {to}: expected frag needed (mtu 1450) from node A:\n{text}"
        );
        // Forget the learned path MTU for the next destination's check.
        run(&["ip", "-n", &n.ns_pa, "route", "flush", "cache"]);
        println!("PMTU to {to}: 1422 passes, 1423 gets frag needed mtu 1450 from node A");
    }
}

fn tables(n: &Names) {
    let routes = show(n, "a", &["show", "routes"]);
    assert!(
        routes.contains("10.216.2.0/24 via 10.216.2.0 dev flannel.1 onlink"),
        "{routes}"
    );
    assert!(
        routes.contains("10.216.3.0/24 via 10.216.3.0 dev flannel.1 onlink"),
        "{routes}"
    );
    let neigh = show(n, "a", &["show", "neigh"]);
    assert!(
        neigh.contains(&format!(
            "10.216.2.0 dev flannel.1 lladdr {VTEP_B} PERMANENT"
        )),
        "{neigh}"
    );
    let fdb = show(n, "a", &["show", "fdb"]);
    assert!(
        fdb.contains(&format!(
            "{VTEP_C} dev flannel.1 dst {NODE_C} self permanent"
        )),
        "{fdb}"
    );
    let text = show(n, "a", &["show", "vxlan"]);
    assert!(
        text.contains("flannel.1: vxlan id 1 dstport 8472 local 10.219.0.2 dev eth0"),
        "{text}"
    );
    println!("show vxlan (node A):\n{text}");
    let v: serde_json::Value =
        serde_json::from_str(&show(n, "a", &["show", "vxlan", "--json"])).unwrap();
    let t = &v[0];
    assert_eq!(
        (t["name"].as_str(), t["mtu"].as_u64(), t["mac"].as_str()),
        (Some("flannel.1"), Some(1450), Some(VTEP_A))
    );
    for p in t["peers"].as_array().unwrap() {
        assert!(
            p["rx_packets"].as_u64().unwrap() > 0 && p["tx_packets"].as_u64().unwrap() > 0,
            "{p}"
        );
    }
}

/// Node A's file without node C's peer: from the reload on, nothing goes to C or is taken
/// from it; the peer back restores it.
fn reload_removes_a_peer(n: &Names) {
    std::fs::write(n.conf("a"), n.config("a", 1, &[(NODE_B, 2, VTEP_B)])).unwrap();
    let out = show(n, "a", &["reload"]);
    assert!(out.contains("peer 10.219.0.4"), "{out}");
    ping_fails(&n.ns_pa, POD_C);
    let before = drops(n, "a", "vxlan_unknown_peer");
    ping_fails(&n.ns_pc, POD_A);
    assert!(
        drops(n, "a", "vxlan_unknown_peer") > before,
        "C's packets were not refused by A"
    );
    ping_ok(&n.ns_pa, POD_B);
    let v: serde_json::Value =
        serde_json::from_str(&show(n, "a", &["show", "vxlan", "--json"])).unwrap();
    assert_eq!(v[0]["peers"].as_array().unwrap().len(), 1);
    std::fs::write(
        n.conf("a"),
        n.config("a", 1, &[(NODE_B, 2, VTEP_B), (NODE_C, 3, VTEP_C)]),
    )
    .unwrap();
    show(n, "a", &["reload"]);
    ping_ok(&n.ns_pa, POD_C);
    ping_ok(&n.ns_pc, POD_A);
    println!("reload: node C's peer removed (traffic stopped at once) and added back");
}
