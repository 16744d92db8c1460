//! End-to-end test of endpoint conditions and traffic policies on a dual-stack node:
//! `tapyard run` with one bridge of pods and an uplink whose other end is an outside host.
//!
//! ```text
//!  pod-a 10.223.1.2 fd00:223:0:1::2 (client) ─ TAP ─┐
//!  pod-b 10.223.1.3 fd00:223:0:1::3 ─ TAP ──────────┼ bridge (gw 10.223.1.1, fd00:223:0:1::1/64) ┐
//!  pod-c 10.223.1.4 fd00:223:0:1::4 ─ TAP ──────────┘                       tapyard node (own ns) ┤
//!  outside ns: 10.224.0.1, fd00:224::1 ── uplink TAP (10.224.0.2, fd00:224::2) ─────────────────────┘
//! ```
//!
//! pod-c is on the bridge but its endpoints say `local = false`: it stands for a pod on
//! another node (the inline-table form of `endpoints` overrides the subnet rule), so the
//! traffic policies can be tried on one node. Cases, IPv4 and IPv6: internalTrafficPolicy
//! Local with a local endpoint (only it answers); without one (the connection times out: a
//! DROP, not a REJECT); a ClusterIP whose only serving endpoint terminates (it still answers;
//! a reload making another one ready moves new connections there); externalTrafficPolicy
//! Local through the NodePort from the outside host with only a terminating local endpoint
//! (it answers, the client address kept); `show services` (and `--json`) with conditions.
//!
//! Needs root, `ip`, `python3`; without them the test says why and passes, except with
//! `CI=true`. Names carry the process id; a guard kills the node and deletes the namespaces.

use std::path::PathBuf;

use crate::common::*;

const BIN: &str = env!("CARGO_BIN_EXE_tapyard");

const GW4: &str = "10.223.1.1";
const GW6: &str = "fd00:223:0:1::1";
const A4: &str = "10.223.1.2";
const A6: &str = "fd00:223:0:1::2";
const B4: &str = "10.223.1.3";
const B6: &str = "fd00:223:0:1::3";
const C4: &str = "10.223.1.4";
const C6: &str = "fd00:223:0:1::4";
const UP4: &str = "10.224.0.2";
const UP6: &str = "fd00:224::2";
const OUT4: &str = "10.224.0.1";
const OUT6: &str = "fd00:224::1";

/// The Services: `ready_c` makes pod-c's endpoints of `term` ready (a reload applies it).
fn services_toml(ready_c: bool) -> String {
    let c_cond = if ready_c {
        "ready = true"
    } else {
        "ready = false, serving = false"
    };
    format!(
        r#"
[[service]]
name = "itp"
cluster_ip = ["10.96.23.10", "fd00:96::23:10"]
port = 80
internal_traffic_policy = "local"
endpoints = ["{B4}:8080", "[{B6}]:8080", {{ addr = "{C4}:8080", local = false }}, {{ addr = "[{C6}]:8080", local = false }}]

[[service]]
name = "itp-none"
cluster_ip = ["10.96.23.11", "fd00:96::23:11"]
port = 80
internal_traffic_policy = "Local"
endpoints = [{{ addr = "{C4}:8080", local = false }}, {{ addr = "[{C6}]:8080", local = false }}]

[[service]]
name = "term"
cluster_ip = ["10.96.23.12", "fd00:96::23:12"]
port = 80
endpoints = [
  {{ addr = "{B4}:8080", ready = false, serving = true, terminating = true }},
  {{ addr = "[{B6}]:8080", ready = false, serving = true, terminating = true }},
  {{ addr = "{C4}:8080", local = false, {c_cond} }},
  {{ addr = "[{C6}]:8080", local = false, {c_cond} }},
]

[[service]]
name = "etp"
cluster_ip = ["10.96.23.13", "fd00:96::23:13"]
port = 80
node_port = 30923
external_traffic_policy = "local"
endpoints = [
  {{ addr = "{B4}:8080", ready = false, serving = true, terminating = true }},
  {{ addr = "[{B6}]:8080", ready = false, serving = true, terminating = true }},
  {{ addr = "{C4}:8080", local = false }},
  {{ addr = "[{C6}]:8080", local = false }},
]
"#
    )
}

struct Names {
    id: u32,
    cni: String,
    taps: [String; 3],
    uplink: String,
    ns_node: String,
    ns_pods: [String; 3],
    ns_out: String,
    dir: PathBuf,
    socket: PathBuf,
    config: PathBuf,
    log: PathBuf,
}

impl Names {
    fn new() -> Names {
        let id = std::process::id() % 100_000;
        let dir = std::env::temp_dir().join(format!("tapyard-eps-{id}"));
        Names {
            id,
            cni: format!("tbr{id}"),
            taps: ["a", "b", "c"].map(|p| format!("tp{p}{id}")),
            uplink: format!("tup{id}"),
            ns_node: format!("te-node-{id}"),
            ns_pods: ["a", "b", "c"].map(|p| format!("te-{p}-{id}")),
            ns_out: format!("te-out-{id}"),
            socket: dir.join("ctl.sock"),
            config: dir.join("node.toml"),
            log: dir.join("run.log"),
            dir,
        }
    }

    fn config(&self, ready_c: bool) -> String {
        format!(
            r#"{node}
[[bridge]]
name = "{cni}"
address = ["{GW4}/24", "{GW6}/64"]
ports = ["{a}", "{b}", "{c}"]

[[uplink]]
name = "{up}"
address = ["{UP4}/24", "{UP6}/64"]
{services}"#,
            node = node_toml(
                &format!("eps-{}", self.id),
                r#"["10.223.0.0/16", "fd00:223::/56"]"#,
                &self.socket,
                Some(&self.dir.join("state")),
            ),
            cni = self.cni,
            a = self.taps[0],
            b = self.taps[1],
            c = self.taps[2],
            up = self.uplink,
            services = services_toml(ready_c),
        )
    }
}

/// Who answered each exchange.
fn who(v: &[(String, String)]) -> Vec<&str> {
    v.iter().map(|(w, _)| w.as_str()).collect()
}

#[test]
#[cfg_attr(
    not(tapyard_root),
    ignore = "needs root: TAP devices and network namespaces (runs as root, as in CI)"
)]
fn endpoint_conditions_and_traffic_policies() {
    let why = missing6(&[("ip", "-V", "iproute2"), ("python3", "-V", "python3")]);
    if skip_or_fail("endpoints", why) {
        return;
    }
    let n = Names::new();
    let _ = std::fs::remove_dir_all(&n.dir);
    std::fs::create_dir_all(&n.dir).unwrap();
    std::fs::write(&n.config, n.config(false)).unwrap();
    let check = run(&[BIN, "check", &n.config.display().to_string()]);
    assert!(check.contains("ok"), "{check}");
    let mut g = Guard::new(&n.dir, &n.log);
    g.ns(&n.ns_node);
    g.start_node(Some(&n.ns_node), &n.config, &[], &n.socket);
    for ns in n.ns_pods.iter().chain([&n.ns_out]) {
        g.ns(ns);
    }
    let pods = [(A4, A6), (B4, B6), (C4, C6)];
    for ((ns, tap), (v4, v6)) in n.ns_pods.iter().zip(&n.taps).zip(pods) {
        let cidrs = [format!("{v4}/24"), format!("{v6}/64")];
        ns_named(ns).attach(Some(&n.ns_node), tap, &[&cidrs[0], &cidrs[1]], &[GW4, GW6]);
    }
    // The outside host: the uplink TAP's other end, routing nothing but its link.
    let out = n.ns_out.clone();
    run(&[
        "ip", "-n", &n.ns_node, "link", "set", &n.uplink, "netns", &out,
    ]);
    addr_add(&out, &format!("{OUT4}/24"), &n.uplink);
    addr_add6(&out, &format!("{OUT6}/64"), &n.uplink);
    run(&["ip", "-n", &out, "link", "set", &n.uplink, "up"]);
    let [a, b, c] = n.ns_pods.clone();
    for (ns, ident) in [(&b, "b"), (&c, "c")] {
        spawn_in(
            &mut g.children,
            ns,
            &["python3", "-c", SERVER_PY, ident, "8080", "0"],
        );
    }
    for ns in [&b, &c] {
        wait_listening(ns, 8080);
    }
    ping_ok(&a, B6);

    // internalTrafficPolicy Local, a local endpoint: only it answers (both families).
    for vip in ["10.96.23.10", "fd00:96::23:10"] {
        let v = exchange(&a, "tcp", vip, 80, 8);
        assert!(who(&v).iter().all(|w| *w == "b"), "{vip}: {v:?}");
    }
    // ... none local (pod-c is "elsewhere"): dropped, so the client times out, no refusal.
    for vip in ["10.96.23.11", "fd00:96::23:11"] {
        let v = talk(&a, "once", vip, 80, 1);
        assert!(
            v[0].0 == "error" && v[0].1.contains("timed out"),
            "{vip}: expected a timeout (DROP), not a refusal: {v:?}"
        );
    }
    // The ClusterIP's only serving endpoint terminates: it still answers (KEP-1669).
    for vip in ["10.96.23.12", "fd00:96::23:12"] {
        let v = exchange(&a, "tcp", vip, 80, 6);
        assert!(who(&v).iter().all(|w| *w == "b"), "{vip}: {v:?}");
    }
    // externalTrafficPolicy Local from outside: the local endpoint terminates while a remote
    // one is ready; the local set falls back to it on its own, the client address is kept.
    for (node, client) in [(UP4, OUT4), (UP6, OUT6)] {
        let v = exchange(&out, "tcp", node, 30923, 6);
        assert!(
            v.iter().all(|(w, s)| w == "b" && s == client),
            "{node}: {v:?}"
        );
    }
    // Pods get the cluster-wide set of the same Service: the ready remote endpoint.
    let v = exchange(&a, "tcp", "fd00:96::23:13", 80, 4);
    assert!(who(&v).iter().all(|w| *w == "c"), "{v:?}");

    // show services: the conditions and which set uses each endpoint.
    let text = tapyard_ok_at(&n.socket, &["show", "services"]);
    assert!(
        text.contains("internal-local") && text.contains("serving,terminating"),
        "{text}"
    );
    let rows: serde_json::Value =
        serde_json::from_str(&tapyard_ok_at(&n.socket, &["show", "services", "--json"])).unwrap();
    let svc = |name: &str| {
        rows.as_array()
            .and_then(|r| r.iter().find(|s| s["name"] == name))
            .cloned()
            .unwrap_or_else(|| panic!("no {name}: {rows}"))
    };
    assert_eq!(svc("itp")["internal_traffic_policy"], "local");
    let term = svc("term");
    let b6 = term["endpoints"]
        .as_array()
        .and_then(|e| e.iter().find(|e| e["address"] == format!("[{B6}]:8080")))
        .cloned()
        .unwrap_or_else(|| panic!("{term}"));
    assert_eq!(
        (&b6["ready"], &b6["serving"], &b6["terminating"]),
        (&false.into(), &true.into(), &true.into()),
        "{b6}"
    );
    assert_eq!(
        b6["used_by"],
        serde_json::json!(["cluster", "local"]),
        "{b6}"
    );

    // A reload makes pod-c's endpoints of `term` ready: new connections go there, live.
    std::fs::write(&n.config, n.config(true)).unwrap();
    let r = tapyard_ok_at(&n.socket, &["reload"]);
    assert!(r.contains("service \"term\" changed"), "{r}");
    for vip in ["10.96.23.12", "fd00:96::23:12"] {
        let v = exchange(&a, "tcp", vip, 80, 6);
        assert!(who(&v).iter().all(|w| *w == "c"), "{vip}: {v:?}");
    }
}
