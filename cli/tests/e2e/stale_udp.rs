//! End-to-end test of kube-proxy's stale UDP flow cleanup and of `[node]
//! node_port_addresses`, both families, on `tapyard run`.
//!
//! ```text
//!  pod-a 10.225.1.2 fd00:225:1::2 ─ TAP ─┐  (the resolver: a fixed source port)
//!  pod-b 10.225.1.3 fd00:225:1::3 ─ TAP ─┴ bridge (gw .1) ┐ tapyard node (own ns)
//!  out ns: 10.226.0.1 fd00:226::1 ──── uplink TAP (.2) ───┘ default route; pods masqueraded
//! ```
//!
//! A DNS-like client in pod-a sends from a fixed source port to the `dns` ClusterIP before
//! the Service is in the config: the datagram follows the default route out, masqueraded,
//! and its entry stays (un-DNAT'd). Once `reload` adds the Service, the next datagram from the
//! same source port reaches the endpoint (a UDP echo server in pod-b) and the answer comes
//! back from the ClusterIP: the Service's creation flushed the stale entry, as kube-proxy's
//! conntrack cleanup. Then the Service's NodePort answers on the uplink address and not on
//! the gateway's with `node_port_addresses` listing the uplink's subnets only, the other way
//! round after a reload; `tapyard status` shows the list, `check` names a bad value.
//!
//! Needs root, `ip` and `python3`; without them it says why and passes, except with
//! `CI=true`, where it fails. Names carry the process id; a guard kills the node and deletes
//! the namespaces on success and failure alike. Traffic goes only to addresses inside the
//! namespaces the test creates.

use std::path::PathBuf;

use crate::common::*;

const GW: &str = "10.225.1.1";
const GW6: &str = "fd00:225:1::1";
const POD_A: &str = "10.225.1.2";
const POD_A6: &str = "fd00:225:1::2";
const POD_B: &str = "10.225.1.3";
const POD_B6: &str = "fd00:225:1::3";
const UPLINK: &str = "10.226.0.2";
const UPLINK6: &str = "fd00:226::2";
const OUT: &str = "10.226.0.1";
const OUT6: &str = "fd00:226::1";
const DNS_VIP: &str = "10.96.0.53";
const DNS_VIP6: &str = "fd00:96::53";
const NODE_PORT: u16 = 30053;

/// `<addr> <port> <source port> <tries>`: sends `q` from the source port (bound, as a
/// resolver's) up to `tries` times, 1 s apart, and prints the first answer (`<answer> from
/// <address>, try <n>`), or `timeout`.
const RESOLVER_PY: &str = r#"
import socket, sys
addr, port, sport, tries = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
v6 = ":" in addr
u = socket.socket(socket.AF_INET6 if v6 else socket.AF_INET, socket.SOCK_DGRAM)
u.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
u.bind(("::" if v6 else "0.0.0.0", sport))
u.settimeout(1)
for i in range(tries):
    u.sendto(b"q", (addr, port))
    try:
        d, p = u.recvfrom(2048)
        print("%s from %s, try %d" % (d.decode().strip(), p[0], i + 1), flush=True)
        break
    except OSError:
        pass
else:
    print("timeout", flush=True)
"#;

fn skip_reason() -> Option<String> {
    missing(&[("ip", "-V", "iproute2"), ("python3", "-V", "python3")])
}

struct Names {
    id: u32,
    tap_a: String,
    tap_b: String,
    uplink: String,
    ns_node: String,
    ns_a: String,
    ns_b: String,
    ns_out: String,
    dir: PathBuf,
    socket: PathBuf,
    config: PathBuf,
    log: PathBuf,
}

impl Names {
    fn new() -> Names {
        let id = std::process::id() % 100_000;
        let dir = std::env::temp_dir().join(format!("tapyard-staleudp-{id}"));
        Names {
            id,
            tap_a: format!("tsa{id}"),
            tap_b: format!("tsb{id}"),
            uplink: format!("tsu{id}"),
            ns_node: format!("ts-node-{id}"),
            ns_a: format!("ts-a-{id}"),
            ns_b: format!("ts-b-{id}"),
            ns_out: format!("ts-out-{id}"),
            socket: dir.join("ctl.sock"),
            config: dir.join("node.toml"),
            log: dir.join("run.log"),
            dir,
        }
    }

    /// The node's config: `node_keys` in `[node]`, and the `dns` Service (UDP, NodePort
    /// 30053, pod-b's echo server) when `dns`.
    fn config(&self, node_keys: &str, dns: bool) -> String {
        let svc = if dns {
            format!(
                r#"
[[service]]
name = "dns"
cluster_ip = ["{DNS_VIP}", "{DNS_VIP6}"]
protocol = "udp"
port = 53
node_port = {NODE_PORT}
endpoints = ["{POD_B}:5353", "[{POD_B6}]:5353"]
"#
            )
        } else {
            String::new()
        };
        format!(
            r#"{node}{node_keys}
[[bridge]]
name = "tsc{id}"
address = ["{GW}/24", "{GW6}/64"]
ports = ["{a}", "{b}"]

[[uplink]]
name = "{up}"
address = ["{UPLINK}/24", "{UPLINK6}/64"]

[[route]]
to = "0.0.0.0/0"
via = "{OUT}"

[[route]]
to = "::/0"
via = "{OUT6}"

[masquerade]
out = "{up}"
{svc}"#,
            node = node_toml(
                &format!("staleudp-{}", self.id),
                r#"["10.225.0.0/16", "fd00:225::/32"]"#,
                &self.socket,
                Some(&self.dir.join("state")),
            ),
            id = self.id,
            a = self.tap_a,
            b = self.tap_b,
            up = self.uplink,
        )
    }

    fn reload(&self, node_keys: &str, dns: bool) {
        std::fs::write(&self.config, self.config(node_keys, dns)).unwrap();
        let out = tapyard_ok_at(&self.socket, &["reload"]);
        println!("reload: {}", out.trim());
    }
}

/// [`RESOLVER_PY`] in `ns`: its one line.
fn resolve(ns: &str, addr: &str, port: u16, sport: u16, tries: u32) -> String {
    let out = run(&[
        "ip",
        "netns",
        "exec",
        ns,
        "python3",
        "-c",
        RESOLVER_PY,
        addr,
        &port.to_string(),
        &sport.to_string(),
        &tries.to_string(),
    ]);
    out.trim().to_string()
}

#[test]
#[cfg_attr(
    not(tapyard_root),
    ignore = "needs root: TAP devices and network namespaces (runs as root, as in CI)"
)]
fn a_udp_flow_from_before_its_service_reaches_it_once_the_service_comes() {
    if skip_or_fail("stale_udp", skip_reason()) {
        return;
    }
    let n = Names::new();
    let _ = std::fs::remove_dir_all(&n.dir);
    std::fs::create_dir_all(&n.dir).unwrap();
    std::fs::write(&n.config, n.config("", false)).unwrap();
    // `check` names a bad node_port_addresses value at its line.
    let bad = n.dir.join("bad.toml");
    std::fs::write(
        &bad,
        n.config("node_port_addresses = [\"10.226.0.0/40\"]\n", true),
    )
    .unwrap();
    let out = run_output(&[TAPYARD, "check", &bad.display().to_string()]);
    let text = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success()
            && text.contains("bad.toml:")
            && text.contains("node_port_addresses[0] = \"10.226.0.0/40\""),
        "{text}"
    );

    let mut g = Guard::new(&n.dir, &n.log);
    g.ns(&n.ns_node);
    g.start_node(Some(&n.ns_node), &n.config, &[], &n.socket);
    for ns in [&n.ns_a, &n.ns_b, &n.ns_out] {
        g.ns(ns);
    }
    let pod = |ns: &str, tap: &str, a: &str, a6: &str| {
        ns_named(ns).attach(
            Some(&n.ns_node),
            tap,
            &[&format!("{a}/24"), &format!("{a6}/64")],
            &[GW, GW6],
        );
    };
    pod(&n.ns_a, &n.tap_a, POD_A, POD_A6);
    pod(&n.ns_b, &n.tap_b, POD_B, POD_B6);
    let out_ns = ns_named(&n.ns_out);
    out_ns.attach(
        Some(&n.ns_node),
        &n.uplink,
        &[&format!("{OUT}/24"), &format!("{OUT6}/64")],
        &[],
    );
    out_ns.route("10.225.0.0/16", UPLINK);
    out_ns.ip(&["-6", "route", "add", "fd00:225::/32", "via", UPLINK6]);
    spawn_in(
        &mut g.children,
        &n.ns_b,
        &["python3", "-c", SERVER_PY, "b", "0", "5353"],
    );

    for (vip, sport) in [(DNS_VIP, 5300), (DNS_VIP6, 5306)] {
        // No Service yet: the query leaves by the default route, masqueraded; no answer.
        assert_eq!(resolve(&n.ns_a, vip, 53, sport, 2), "timeout");
        let ct = tapyard_ok_at(&n.socket, &["show", "conntrack"]);
        let line = ct
            .lines()
            .find(|l| l.contains(&format!("dst={vip} sport={sport} dport=53")))
            .unwrap_or_else(|| panic!("no entry of the query:\n{ct}"));
        println!("before the Service: {line}");
        let masq = if vip.contains(':') { UPLINK6 } else { UPLINK };
        assert!(
            line.contains(&format!("dst={masq} ")),
            "masqueraded: {line}"
        );
    }
    // The Service comes with a reload: the same source ports' next queries are answered.
    n.reload("", true);
    for (vip, sport, pod_a) in [(DNS_VIP, 5300, POD_A), (DNS_VIP6, 5306, POD_A6)] {
        let got = resolve(&n.ns_a, vip, 53, sport, 3);
        println!("after the Service, {vip} from port {sport}: {got}");
        // The first query after the reload is answered (a stale entry would hold every
        // retry: each refreshes it).
        assert_eq!(got, format!("b {pod_a} from {vip}, try 1"));
    }

    // node_port_addresses: the uplink's subnets only, then the gateway's only.
    let client = |to: &str, sport| resolve(&n.ns_out, to, NODE_PORT, sport, 2);
    n.reload(
        "node_port_addresses = [\"10.226.0.0/24\", \"fd00:226::/64\"]\n",
        true,
    );
    let status = tapyard_ok_at(&n.socket, &["status"]);
    assert!(
        status.contains("node_port_addresses 10.226.0.0/24,fd00:226::/64"),
        "{status}"
    );
    for ((allowed, other), sport) in [(UPLINK, GW), (UPLINK6, GW6)].into_iter().zip([6000, 6010]) {
        let got = client(allowed, sport);
        assert!(got.starts_with("b "), "NodePort on {allowed}: {got}");
        assert_eq!(client(other, sport + 1), "timeout", "NodePort on {other}");
    }
    n.reload(
        "node_port_addresses = [\"10.225.1.0/24\", \"fd00:225:1::/64\"]\n",
        true,
    );
    for ((allowed, other), sport) in [(GW, UPLINK), (GW6, UPLINK6)].into_iter().zip([6100, 6110]) {
        let got = client(allowed, sport);
        assert!(got.starts_with("b "), "NodePort on {allowed}: {got}");
        assert_eq!(client(other, sport + 1), "timeout", "NodePort on {other}");
    }
    // Back to every address.
    n.reload("", true);
    assert!(client(UPLINK, 6200).starts_with("b "));
    assert!(client(GW, 6201).starts_with("b "));
}
