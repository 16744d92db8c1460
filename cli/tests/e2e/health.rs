//! End-to-end test of kube-proxy's health checks on the node's own addresses, answered by
//! tapyard's local TCP stack, and of closed ports refused as Linux refuses them.
//!
//! ```text
//!  pod-a 10.213.1.2, fd00:213:1::2 ── TAP ── bridge (gateway 10.213.1.1/24, fd00:213:1::1/64)
//!  wire ns: Linux bridge ── uplink TAP (10.214.0.2/24, fd00:214::2/64) ── tapyard
//!     └─ veth ── outside ns: 10.214.0.1/24, fd00:214::1/64
//! ```
//!
//! `store` is an externalTrafficPolicy Local Service with `health_check_node_port = 32000`
//! and its endpoint on pod-a. Checked with `curl -i` (the kernel's own TCP as the client):
//! from the outside host to the uplink's address, IPv4 and IPv6, and from pod-a to its
//! gateway: `200 OK` with kube-proxy's JSON body, `Content-Type: application/json`,
//! `X-Content-Type-Options: nosniff` and `X-Load-Balancing-Endpoint-Weight: 1`; `/healthz`
//! and `/livez` on the default port 10256; a closed port of the node's addresses gives
//! "Connection refused" at once, from outside (IPv4 and IPv6, with `[masquerade]` on the
//! uplink, which once turned the reset into one addressed to the node itself) and from the
//! pod, and so does a Service without endpoints (by NodePort and ClusterIP, both families);
//! `show services` and its `--json` name the health port. A `reload` that moves the
//! endpoints off the node (to a routed subnet behind the outside host) turns the answer into
//! `503 Service Unavailable` with `localEndpoints` 0 and weight 0; a reload that sets
//! `healthz_port = 0` closes `/healthz`.
//!
//! Needs root, `ip` and `curl`; without them the test skips, or fails under `CI=true`.
//! Traffic stays in namespaces the test creates.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::common;
use crate::common::*;

const GW: &str = "10.213.1.1";
const POD_A: &str = "10.213.1.2";
const GW6: &str = "fd00:213:1::1";
const POD_A6: &str = "fd00:213:1::2";
const NODE: &str = "10.214.0.2";
const NODE6: &str = "fd00:214::2";
const OUTSIDE: &str = "10.214.0.1";
const OUTSIDE6: &str = "fd00:214::1";
const HC: u16 = 32000;

fn skip_or_fail() -> bool {
    common::skip_or_fail(
        "health",
        missing(&[
            ("ip", "-V", "iproute2"),
            ("curl", "--version", "the health checks' client"),
        ]),
    )
}

struct Names {
    bridge: String,
    tap_a: String,
    uplink: String,
    ns_a: String,
    ns_wire: String,
    ns_out: String,
    socket: PathBuf,
    config: PathBuf,
}

impl Names {
    fn new(dir: &Path) -> Names {
        let id = std::process::id() % 100_000;
        Names {
            bridge: format!("tkc{id}"),
            tap_a: format!("tka{id}"),
            uplink: format!("tku{id}"),
            ns_a: format!("tk-pa-{id}"),
            ns_wire: format!("tk-wire-{id}"),
            ns_out: format!("tk-out-{id}"),
            socket: dir.join("ctl.sock"),
            config: dir.join("node.toml"),
        }
    }

    /// The config: `store`'s endpoints on pod-a (`local`) or behind the outside host, and
    /// `healthz_port` (`None`: the default).
    fn config(&self, local: bool, healthz: Option<u16>) -> String {
        let eps = if local {
            format!("\"{POD_A}:8080\", \"[{POD_A6}]:8080\"")
        } else {
            "\"10.212.0.5:8080\", \"[fd00:212::5]:8080\"".to_string()
        };
        let hz = healthz.map_or(String::new(), |p| format!("healthz_port = {p}\n"));
        format!(
            r#"{node}{hz}
[[bridge]]
name = "{bridge}"
address = ["{GW}/24", "{GW6}/64"]
ports = ["{a}"]

[[uplink]]
name = "{up}"
address = ["{NODE}/24", "{NODE6}/64"]

[[route]]
to = "10.212.0.0/24"
via = "{OUTSIDE}"

[[route]]
to = "fd00:212::/64"
via = "{OUTSIDE6}"

[[service]]
name = "store"
cluster_ip = ["10.97.1.80", "fd00:97::80"]
protocol = "tcp"
port = 80
node_port = 30081
endpoints = [{eps}]
external_traffic_policy = "local"
health_check_node_port = {HC}

[[service]]
name = "empty"
cluster_ip = ["10.97.1.81", "fd00:97::81"]
protocol = "tcp"
port = 80
node_port = 30082

[masquerade]
out = "{up}"
"#,
            node = node_toml(
                "health",
                r#"["10.213.0.0/16", "fd00:213::/48"]"#,
                &self.socket,
                Some(&self.socket.with_file_name("state")),
            ),
            bridge = self.bridge,
            a = self.tap_a,
            up = self.uplink,
        )
    }
}

/// The uplink TAP into the wire namespace's Linux bridge, joined by a veth to the outside
/// host.
fn build_wire(n: &Names) {
    let (w, out) = (&n.ns_wire, &n.ns_out);
    run(&["ip", "link", "set", &n.uplink, "netns", w]);
    run(&["ip", "-n", w, "link", "add", "br0", "type", "bridge"]);
    run(&["ip", "-n", w, "link", "set", "br0", "up"]);
    run(&["ip", "-n", w, "link", "set", &n.uplink, "master", "br0"]);
    run(&["ip", "-n", w, "link", "set", &n.uplink, "up"]);
    run(&[
        "ip", "-n", w, "link", "add", "vout", "type", "veth", "peer", "name", "eth0", "netns", out,
    ]);
    run(&["ip", "-n", w, "link", "set", "vout", "master", "br0"]);
    run(&["ip", "-n", w, "link", "set", "vout", "up"]);
    addr_add(out, &format!("{OUTSIDE}/24"), "eth0");
    addr_add6(out, &format!("{OUTSIDE6}/64"), "eth0");
    run(&["ip", "-n", out, "link", "set", "eth0", "up"]);
    run(&["ip", "-n", out, "link", "set", "lo", "up"]);
}

/// `curl FLAG` from `ns` to `url`: (exit code, stdout, stderr).
fn curl_with(ns: &str, flag: &str, url: &str) -> (i32, String, String) {
    let out = run_output(&[
        "ip",
        "netns",
        "exec",
        ns,
        "curl",
        "-sS",
        flag,
        "-g",
        "--max-time",
        "5",
        url,
    ]);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `curl -i` from `ns` to `url`: (exit code, output: headers and body, or curl's error).
fn curl(ns: &str, url: &str) -> (i32, String) {
    let (code, out, err) = curl_with(ns, "-i", url);
    (code, out + &err)
}

/// `curl -i` until it gets an answer (the first neighbour resolution, a reload's health
/// ports read again): the answer.
fn curl_ok(ns: &str, url: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (code, text) = curl(ns, url);
        if code == 0 {
            println!("curl {ns} {url}: {}", text.lines().next().unwrap_or(""));
            return text;
        }
        assert!(Instant::now() < deadline, "curl {url} from {ns}: {text}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The answer is kube-proxy's for `store` with `n` local endpoints.
fn assert_health(text: &str, n: usize) {
    let status = if n > 0 {
        "HTTP/1.1 200 OK"
    } else {
        "HTTP/1.1 503 Service Unavailable"
    };
    assert!(text.starts_with(status), "{text}");
    for h in [
        "Content-Type: application/json".to_string(),
        "X-Content-Type-Options: nosniff".to_string(),
        format!("X-Load-Balancing-Endpoint-Weight: {n}"),
    ] {
        assert!(text.contains(&format!("{h}\r\n")), "no {h}: {text}");
    }
    let body = text.split("\r\n\r\n").nth(1).unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
    assert_eq!(v["service"]["namespace"], "default", "{body}");
    assert_eq!(v["service"]["name"], "store", "{body}");
    assert_eq!(v["localEndpoints"], n, "{body}");
    assert_eq!(v["serviceProxyHealthy"], true, "{body}");
}

/// `curl` to a closed port: refused at once (exit 7, "Connection refused" in its verbose
/// output: a reset, not an ICMP error), not a timeout.
fn refused(ns: &str, url: &str) {
    let t = Instant::now();
    let (code, _, text) = curl_with(ns, "-v", url);
    assert_eq!(code, 7, "curl {url} from {ns}: {text}");
    assert!(text.contains("Connection refused"), "{text}");
    assert!(t.elapsed() < Duration::from_secs(3), "{:?}", t.elapsed());
    println!("curl {ns} {url}: refused");
}

#[test]
#[cfg_attr(
    not(tapyard_root),
    ignore = "needs root: TAP devices and network namespaces (runs as root, as in CI)"
)]
fn health_checks_and_closed_ports_on_the_node_addresses() {
    if skip_or_fail() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("tapyard-e2e-health-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let n = Names::new(&dir);
    let mut g = Guard::new(&dir, &dir.join("run.log"));
    std::fs::write(&n.config, n.config(true, None)).unwrap();
    let check = run(&[TAPYARD, "check", &n.config.display().to_string()]);
    assert!(check.contains("ok"), "{check}");
    g.start_node(None, &n.config, &[], &n.socket);
    for ns in [&n.ns_a, &n.ns_wire, &n.ns_out] {
        g.ns(ns);
    }
    ns_named(&n.ns_a).attach(
        None,
        &n.tap_a,
        &[&format!("{POD_A}/24"), &format!("{POD_A6}/64")],
        &[GW, GW6],
    );
    build_wire(&n);

    // The health check: 200 with the endpoint on the node, from outside (both families)
    // and from the pod.
    let out = &n.ns_out;
    assert_health(&curl_ok(out, &format!("http://{NODE}:{HC}/")), 1);
    assert_health(&curl_ok(out, &format!("http://[{NODE6}]:{HC}/")), 1);
    assert_health(&curl_ok(&n.ns_a, &format!("http://{GW}:{HC}/healthz")), 1);
    // kube-proxy's own health server.
    let hz = curl_ok(out, &format!("http://{NODE}:10256/healthz"));
    assert!(hz.starts_with("HTTP/1.1 200 OK"), "{hz}");
    let body = hz.split("\r\n\r\n").nth(1).unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
    assert_eq!(v["nodeEligible"], true, "{body}");
    assert!(
        v["lastUpdated"]
            .as_str()
            .is_some_and(|t| t.contains(" +0000 UTC m=+")),
        "{body}"
    );
    let lz = curl_ok(out, &format!("http://[{NODE6}]:10256/livez"));
    assert!(
        lz.starts_with("HTTP/1.1 200 OK") && lz.contains("\"currentTime\""),
        "{lz}"
    );

    // Closed ports: refused at once, both families, from outside and from the pod.
    refused(out, &format!("http://{NODE}:9/"));
    refused(out, &format!("http://[{NODE6}]:9/"));
    refused(&n.ns_a, &format!("http://{GW}:9/"));
    refused(&n.ns_a, &format!("http://[{GW6}]:9/"));
    refused(&n.ns_a, &format!("http://{NODE}:9/"));
    // A Service without endpoints (kube-proxy's REJECT; tapyard answers TCP with a reset,
    // see ARCHITECTURE.md): refused alike, by its NodePort and its ClusterIP.
    refused(out, &format!("http://{NODE}:30082/"));
    refused(out, &format!("http://[{NODE6}]:30082/"));
    refused(&n.ns_a, "http://10.97.1.81/");
    refused(&n.ns_a, "http://[fd00:97::81]/");

    let shown = tapyard_ok_at(&n.socket, &["show", "services"]);
    assert!(shown.contains(&format!("healthcheck {HC}")), "{shown}");
    let json = tapyard_ok_at(&n.socket, &["show", "services", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let store = v
        .as_array()
        .and_then(|a| a.iter().find(|s| s["name"] == "store"));
    assert_eq!(
        store.map(|s| s["health_check_node_port"].clone()),
        Some(HC.into()),
        "{json}"
    );

    // The endpoints move off the node: 503, weight 0, at once.
    std::fs::write(&n.config, n.config(false, None)).unwrap();
    let r = tapyard_ok_at(&n.socket, &["reload"]);
    println!("{r}");
    assert_health(&curl_ok(out, &format!("http://{NODE}:{HC}/")), 0);
    assert_health(&curl_ok(out, &format!("http://[{NODE6}]:{HC}/")), 0);
    // And back.
    std::fs::write(&n.config, n.config(true, None)).unwrap();
    tapyard_ok_at(&n.socket, &["reload"]);
    assert_health(&curl_ok(out, &format!("http://{NODE}:{HC}/")), 1);

    // /healthz switched off by a reload: refused once the ports are read again.
    std::fs::write(&n.config, n.config(true, Some(0))).unwrap();
    let r = tapyard_ok_at(&n.socket, &["reload"]);
    assert!(r.contains("node.healthz_port 10256 -> 0"), "{r}");
    std::thread::sleep(Duration::from_millis(1200));
    refused(out, &format!("http://{NODE}:10256/healthz"));

    let status = g.stop_node();
    assert!(status.success(), "exit status after SIGTERM: {status}");
}
