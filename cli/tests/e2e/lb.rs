//! End-to-end test of LoadBalancer IPs, external IPs and `load_balancer_source_ranges`: a
//! dual-stack `tapyard run` node, a pod server, a client pod and two outside hosts that route
//! the Services' addresses through the node (as a BGP-mode load balancer would make them).
//!
//! ```text
//!  pod-a 10.221.1.2 fd00:221:0:1::2 (server) ─ TAP ─┐
//!  pod-b 10.221.1.3 fd00:221:0:1::3 (client) ─ TAP ─┴ bridge (gw .1) ┐ tapyard node (own ns)
//!  wire ns: Linux bridge ── uplink TAP (10.222.0.2, fd00:222::2/64) ──┘
//!     ├─ veth ── out ns:  10.222.0.1, fd00:222::1 (inside the source ranges)
//!     └─ veth ── out2 ns: 10.222.0.5, fd00:222::5 (outside them)
//!  both outside hosts: 198.51.100.0/24 and 2001:db8:5::/64 via the node's uplink address
//! ```
//!
//! Checked as kube-proxy's KUBE-EXT-* and KUBE-FW-* rules would have it: policy Local keeps
//! the client's address on the LoadBalancer IP (`curl` over IPv4, a Python client over
//! IPv6) and on the external IP; policy Cluster masquerades (the server sees the bridge's
//! gateway); a client outside the ranges gets no answer from the LoadBalancer IP and the
//! drop is counted (`show stats`: `lb_source_range`) while the external IP still answers it;
//! pod-b reaches the Cluster Service's LoadBalancer IP (masqueraded) and the Local Service's
//! external IP (its address kept); `show services` lists the addresses (text and `--json`);
//! a `reload` that drops the ranges lets the other client in.
//!
//! Needs root, `ip`, `python3` and `curl`; without them the test skips, or fails under
//! `CI=true`. Traffic stays in namespaces the test creates.

use std::panic::AssertUnwindSafe;
use std::path::PathBuf;

use crate::common::*;

const GW4: &str = "10.221.1.1";
const GW6: &str = "fd00:221:0:1::1";
const POD_A4: &str = "10.221.1.2";
const POD_A6: &str = "fd00:221:0:1::2";
const POD_B4: &str = "10.221.1.3";
const POD_B6: &str = "fd00:221:0:1::3";
const UPLINK4: &str = "10.222.0.2";
const UPLINK6: &str = "fd00:222::2";
const OUT4: &str = "10.222.0.1";
const OUT6: &str = "fd00:222::1";
const OUT2_4: &str = "10.222.0.5";
const OUT2_6: &str = "fd00:222::5";
/// `lb-local`'s LoadBalancer IPs and external IP.
const LB4: &str = "198.51.100.10";
const LB6: &str = "2001:db8:5::10";
const EXT4: &str = "198.51.100.20";
/// `lb-cluster`'s LoadBalancer IP.
const LBC4: &str = "198.51.100.11";
const LBC6: &str = "2001:db8:5::11";

fn services(ranges: bool) -> String {
    let ranges = if ranges {
        format!("load_balancer_source_ranges = [\"{OUT4}/32\", \"{OUT6}/128\"]\n")
    } else {
        String::new()
    };
    format!(
        r#"
[[service]]
name = "lb-local"
cluster_ip = ["10.96.0.40", "fd00:96::40"]
port = 80
endpoints = ["{POD_A4}:8080", "[{POD_A6}]:8080"]
external_traffic_policy = "local"
load_balancer_ips = ["{LB4}", "{LB6}"]
external_ips = ["{EXT4}"]
{ranges}
[[service]]
name = "lb-cluster"
cluster_ip = ["10.96.0.41", "fd00:96::41"]
port = 80
endpoints = ["{POD_A4}:8080", "[{POD_A6}]:8080"]
load_balancer_ips = ["{LBC4}", "{LBC6}"]
"#
    )
}

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
    ns_out2: String,
    dir: PathBuf,
    socket: PathBuf,
    config: PathBuf,
    log: PathBuf,
}

impl Names {
    fn new() -> Names {
        let id = std::process::id() % 100_000;
        let dir = std::env::temp_dir().join(format!("tapyard-lb-{id}"));
        Names {
            id,
            cni: format!("tlc{id}"),
            tap_a: format!("tla{id}"),
            tap_b: format!("tlb{id}"),
            uplink: format!("tlu{id}"),
            ns_node: format!("tl-node-{id}"),
            ns_a: format!("tl-a-{id}"),
            ns_b: format!("tl-b-{id}"),
            ns_wire: format!("tl-wire-{id}"),
            ns_out: format!("tl-out-{id}"),
            ns_out2: format!("tl-out2-{id}"),
            socket: dir.join("ctl.sock"),
            config: dir.join("node.toml"),
            log: dir.join("run.log"),
            dir,
        }
    }

    fn config(&self, ranges: bool) -> String {
        format!(
            r#"{node}
[[bridge]]
name = "{cni}"
address = ["{GW4}/24", "{GW6}/64"]
ports = ["{a}", "{b}"]

[[uplink]]
name = "{up}"
address = ["{UPLINK4}/24", "{UPLINK6}/64"]

[masquerade]
out = "{up}"
{services}"#,
            node = node_toml(
                &format!("lb-{}", self.id),
                r#"["10.221.0.0/16", "fd00:221::/56"]"#,
                &self.socket,
                Some(&self.dir.join("state")),
            ),
            cni = self.cni,
            a = self.tap_a,
            b = self.tap_b,
            up = self.uplink,
            services = services(ranges),
        )
    }
}

/// The uplink TAP into the wire namespace's Linux bridge, with both outside hosts on veths
/// routing the Services' addresses through the node.
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
    for (peer, v4, v6, end) in [
        (&n.ns_out, OUT4, OUT6, "vout"),
        (&n.ns_out2, OUT2_4, OUT2_6, "vout2"),
    ] {
        run(&[
            "ip", "-n", w, "link", "add", end, "type", "veth", "peer", "name", "eth0", "netns",
            peer,
        ]);
        run(&["ip", "-n", w, "link", "set", end, "master", "br0"]);
        run(&["ip", "-n", w, "link", "set", end, "up"]);
        addr_add(peer, &format!("{v4}/24"), "eth0");
        addr_add6(peer, &format!("{v6}/64"), "eth0");
        run(&["ip", "-n", peer, "link", "set", "eth0", "up"]);
        run(&["ip", "-n", peer, "link", "set", "lo", "up"]);
        run(&[
            "ip",
            "-n",
            peer,
            "route",
            "add",
            "198.51.100.0/24",
            "via",
            UPLINK4,
        ]);
        run(&[
            "ip",
            "-n",
            peer,
            "-6",
            "route",
            "add",
            "2001:db8:5::/64",
            "via",
            UPLINK6,
        ]);
    }
}

/// `curl --http0.9` from `ns` to `http://<addr>/` (the test server answers one line, no
/// HTTP header): `(server ident, client address it saw)`, or `None` when nothing answered.
fn curl(ns: &str, addr: &str) -> Option<(String, String)> {
    let host = if addr.contains(':') {
        format!("[{addr}]")
    } else {
        addr.to_string()
    };
    let (ok, out) = in_ns(
        ns,
        &[
            "curl",
            "-s",
            "--http0.9",
            "--max-time",
            "3",
            &format!("http://{host}/"),
        ],
    );
    // The server closes without reading the request: curl may end on a reset (exit 56)
    // after the answer; what counts is the answer.
    eprintln!("curl {ns} -> {addr}: ok {ok}: {out}");
    let line = out.lines().next().unwrap_or_default().trim();
    let (a, b) = line.split_once(' ')?;
    (!a.is_empty() && !a.starts_with("curl")).then(|| (a.to_string(), b.to_string()))
}

/// `count` TCP exchanges from `ns` with `addr`:80, each answered by pod-a seeing the client
/// address `want`.
fn sees(ns: &str, addr: &str, count: usize, want: &str) {
    let v = exchange(ns, "tcp", addr, 80, count);
    assert!(v.iter().all(|(w, s)| w == "a" && s == want), "{v:?}");
}

/// `show stats --json`'s `drops.lb_source_range`.
fn lb_source_range_drops(n: &Names) -> u64 {
    let j = tapyard_ok_at(&n.socket, &["show", "stats", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&j).unwrap();
    v["drops"]["lb_source_range"].as_u64().unwrap_or(0)
}

#[test]
#[cfg_attr(
    not(tapyard_root),
    ignore = "needs root: TAP devices and network namespaces (runs as root, as in CI)"
)]
fn load_balancer_and_external_ips() {
    let why = missing6(&[
        ("ip", "-V", "iproute2"),
        ("python3", "-V", "python3"),
        ("curl", "-V", "curl"),
    ]);
    if skip_or_fail("lb", why) {
        return;
    }
    let n = Names::new();
    let _ = std::fs::remove_dir_all(&n.dir);
    std::fs::create_dir_all(&n.dir).unwrap();
    std::fs::write(&n.config, n.config(true)).unwrap();
    let check = run(&[TAPYARD, "check", &n.config.display().to_string()]);
    assert!(check.contains("ok"), "{check}");
    let mut g = Guard::new(&n.dir, &n.log);
    g.ns(&n.ns_node);
    g.start_node(Some(&n.ns_node), &n.config, &[], &n.socket);
    for ns in [&n.ns_a, &n.ns_b, &n.ns_wire, &n.ns_out, &n.ns_out2] {
        g.ns(ns);
    }
    let n = &n;
    for (ns, tap, v4, v6) in [
        (&n.ns_a, &n.tap_a, POD_A4, POD_A6),
        (&n.ns_b, &n.tap_b, POD_B4, POD_B6),
    ] {
        let cidrs = [format!("{v4}/24"), format!("{v6}/64")];
        ns_named(ns).attach(Some(&n.ns_node), tap, &[&cidrs[0], &cidrs[1]], &[GW4, GW6]);
    }
    build_wire(n);
    spawn_in(
        &mut g.children,
        &n.ns_a,
        &["python3", "-c", SERVER_PY, "a", "8080", "0"],
    );
    wait_listening(&n.ns_a, 8080);
    let (b, out, out2) = (n.ns_b.clone(), n.ns_out.clone(), n.ns_out2.clone());

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

    case(
        "LoadBalancer IP, policy Local: client kept (curl, IPv4)",
        &mut || {
            let r = curl(&out, LB4);
            assert_eq!(r, Some(("a".into(), OUT4.into())));
        },
    );
    case(
        "LoadBalancer IP, policy Local: client kept (IPv6)",
        &mut || {
            sees(&out, LB6, 3, OUT6);
        },
    );
    case("LoadBalancer IP, policy Cluster: masqueraded", &mut || {
        assert_eq!(curl(&out, LBC4), Some(("a".into(), GW4.into())));
        sees(&out, LBC6, 2, GW6);
    });
    case("outside the source ranges: no answer, counted", &mut || {
        let before = lb_source_range_drops(n);
        assert_eq!(curl(&out2, LB4), None);
        let v = talk(&out2, "once", LB6, 80, 1);
        assert_eq!(v[0].0, "error", "{v:?}");
        assert!(lb_source_range_drops(n) > before, "not counted");
    });
    case(
        "external IP from outside the ranges: answered, client kept",
        &mut || {
            assert_eq!(curl(&out2, EXT4), Some(("a".into(), OUT2_4.into())));
        },
    );
    case(
        "a pod to the LoadBalancer IP (Cluster: masqueraded)",
        &mut || {
            sees(&b, LBC4, 2, GW4);
            sees(&b, LBC6, 2, GW6);
        },
    );
    case(
        "a pod to the external IP (Local: its address kept)",
        &mut || {
            sees(&b, EXT4, 2, POD_B4);
        },
    );
    case("show services lists them", &mut || {
        let text = tapyard_ok_at(&n.socket, &["show", "services"]);
        assert!(
            text.contains(&format!(
                "loadbalancer {LB4} external {EXT4} ranges {OUT4}/32"
            )),
            "{text}"
        );
        assert!(
            text.contains(&format!("loadbalancer {LB6} ranges {OUT6}/128")),
            "{text}"
        );
        let j = tapyard_ok_at(&n.socket, &["show", "services", "--json"]);
        let v: serde_json::Value = serde_json::from_str(&j).unwrap();
        let row = v
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == "lb-local")
            .unwrap_or_else(|| panic!("{j}"));
        assert_eq!(row["load_balancer_ips"], serde_json::json!([LB4, LB6]));
        assert_eq!(row["external_ips"], serde_json::json!([EXT4]));
    });
    case(
        "reload without the ranges lets the other client in",
        &mut || {
            std::fs::write(&n.config, n.config(false)).unwrap();
            let r = tapyard_ok_at(&n.socket, &["reload"]);
            assert!(r.contains("service \"lb-local\" changed"), "{r}");
            assert_eq!(curl(&out2, LB4), Some(("a".into(), OUT2_4.into())));
            sees(&out2, LB6, 1, OUT2_6);
        },
    );

    eprintln!("==== load balancer cases ====");
    for (name, r) in &results {
        match r {
            Ok(()) => eprintln!("PASS {name}"),
            Err(e) => eprintln!("FAIL {name}: {e}"),
        }
    }
    let failed: Vec<&str> = results
        .iter()
        .filter(|(_, r)| r.is_err())
        .map(|(n, _)| *n)
        .collect();
    assert!(failed.is_empty(), "failed cases: {failed:?}");
}
