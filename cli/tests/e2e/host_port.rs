//! End-to-end test of the host port (`[[host]]`): `tapyard run` inside a namespace that plays
//! the node, its host port's kernel side being that namespace's own IP stack.
//!
//! ```text
//!  node ns (tapyard runs here; its kernel holds 10.219.0.2/32 on the host TAP,
//!           routes 10.216.0.0/16, 10.97.0.0/16 and the default via 169.254.0.1)
//!    host TAP ── tapyard: host port 169.254.0.1/32
//!  pod-a 10.216.1.2 ── TAP ── bridge (gateway 10.216.1.1/24)
//!  wire ns: Linux bridge ── uplink TAP (10.219.0.2/24, the node's address too)
//!     └─ veth ── outside ns: 10.219.0.1/24, route 10.216.0.0/16 via 10.219.0.2
//!                 (also node B: a Linux node routing its pod CIDR, ip_forward, and
//!                  kube-proxy's DNAT of `hostsvc` by iptables)
//!                   └─ veth ── pod-b ns 10.216.2.2/24 (gateway 10.216.2.1)
//! ```
//!
//! Checked, as kube-proxy's rules on a Linux node would have it: (1) the node's own clients
//! (python and `curl`) reach the ClusterIP `web` (pod-a's server sees the gateway's address:
//! node traffic to a Service is masqueraded), its NodePort on tapyard's addresses behind the
//! host port, and pod-a directly (with the node's address); (2) pod-a reaches `hostsvc`, whose
//! endpoint is a server in the node namespace itself, with its own address; (3) the outside
//! host reaches `hostsvc`'s NodePort on the node's address (masqueraded to the host port's
//! address) and the node's own server directly (unmasqueraded, answered through the host
//! port's default route), and the node reaches the outside host with its own address by that
//! route; (5) a pod on another node (pod-b, behind node B) reaches the node's own server at
//! the node's address with its own address (as after node B's kube-proxy DNAT'd `hostsvc`'s
//! ClusterIP: node B's iptables does it here), both directly and through that DNAT, and the
//! NodePorts to the node's server and to pod-a (masqueraded, policy Cluster); the answers go
//! back through the host port and tapyard's route to node B; `show ports` lists the host port, `show routes` its host route, the node's kernel
//! its routes; (4) all of it again after a restart and after a `run --takeover`.
//!
//! The node's own `<address>:<NodePort>` (which its kernel would deliver to itself) reaches
//! tapyard by policy routing: one rule per NodePort before the `local` table's (moved from
//! priority 0 to 100). Checked: python and `curl` from the node to its own address's
//! NodePorts (to pod-a and to the node's own server), the rules there once each after the
//! restart and the takeover, a Service removed by `reload` taking its rule with it (and
//! brought back), a node without the host port leaving no rule and `local` at 0, and
//! `tapyard cleanup` after the last stop removing them. The host port's `routes` change by
//! `reload`.
//!
//! The node is dual-stack (the outside host is IPv4 only): pod-a also has fd00:216:1::2, the
//! uplink and the host port hold fd00:219::2 as well, and the node reaches the IPv6
//! ClusterIPs (python, `curl -6`), its own `[fd00:219::2]:<NodePort>` and pod-a's IPv6
//! address the same way.
//!
//! Needs root, `ip` and `python3` (`curl` is used when present); without them the test skips,
//! or fails under `CI=true`. Traffic stays in namespaces the test creates.

use std::path::{Path, PathBuf};

use crate::common;
use crate::common::*;

const GW: &str = "10.216.1.1";
const POD_A: &str = "10.216.1.2";
const NODE: &str = "10.219.0.2";
const GW6: &str = "fd00:216:1::1";
const POD_A6: &str = "fd00:216:1::2";
/// The node's IPv6 address (the uplink's and the host port's).
const NODE6: &str = "fd00:219::2";
const WEB_VIP6: &str = "fd00:97::10";
const HTTP_VIP6: &str = "fd00:97::11";
const OUTSIDE: &str = "10.219.0.1";
/// A pod on node B (the outside namespace routes its pod CIDR 10.216.2.0/24).
const POD_B: &str = "10.216.2.2";
/// tapyard's side of the host port.
const HOST_GW: &str = "169.254.0.1";
/// tapyard's side of the host port, IPv6 (the default).
const HOST_GW6: &str = "fc00::a9fe:1";
const WEB_VIP: &str = "10.97.0.10";
const HOST_VIP: &str = "10.97.0.20";
/// `web-http`: pod-a's `python3 -m http.server`, for `curl`.
const HTTP_VIP: &str = "10.97.0.11";
/// The node's own server (hostNetwork), `hostsvc`'s endpoint.
const NODE_PORT_SRV: u16 = 8081;
/// The NodePorts: `web`, `hostsvc`, `web-http`.
const NODE_PORTS: [u16; 3] = [30080, 30081, 30088];
/// The table of the node's own NodePort traffic (tapyard's `NODEPORT_TABLE`).
const NODEPORT_TABLE: &str = "29817";

/// An HTTP server on port `argv[1]` (both families): each request is answered 200 with the
/// client's address.
const HTTP_PY: &str = r#"
import socket, sys
s = socket.socket(socket.AF_INET6)
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("::", int(sys.argv[1])))
s.listen(16)
while True:
    c, p = s.accept()
    try:
        c.settimeout(3)
        req = b""
        while b"\r\n\r\n" not in req:
            d = c.recv(1024)
            if not d:
                break
            req += d
        body = p[0].removeprefix("::ffff:").encode()
        c.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    except OSError:
        pass
    c.close()
"#;

struct Names {
    bridge: String,
    tap_a: String,
    uplink: String,
    host: String,
    ns_node: String,
    ns_a: String,
    ns_wire: String,
    ns_out: String,
    ns_b: String,
    socket: PathBuf,
    config: PathBuf,
}

impl Names {
    fn new(dir: &Path) -> Names {
        let id = std::process::id() % 100_000;
        Names {
            bridge: format!("thc{id}"),
            tap_a: format!("tha{id}"),
            uplink: format!("thu{id}"),
            host: format!("thh{id}"),
            ns_node: format!("th-node-{id}"),
            ns_a: format!("th-pa-{id}"),
            ns_wire: format!("th-wire-{id}"),
            ns_out: format!("th-out-{id}"),
            ns_b: format!("th-pb-{id}"),
            socket: dir.join("ctl.sock"),
            config: dir.join("node.toml"),
        }
    }

    /// The config, with the host port or (`host` false) without it and without `hostsvc`'s
    /// endpoint on the node.
    fn config(&self, host: bool) -> String {
        let full = self.config_with_host();
        if host {
            return full;
        }
        let without = full.replace(
            &format!(
                "[[host]]\nname = \"{}\"\naddress = [\"{NODE}\", \"{NODE6}\"]\nroutes = [\"0.0.0.0/0\"]\n",
                self.host
            ),
            "",
        );
        let without = without.replace(&format!("\"{NODE}:{NODE_PORT_SRV}\""), "");
        assert_ne!(without, full);
        without
    }

    /// The config with the host port, without the Service `web-http`.
    fn config_without_web_http(&self) -> String {
        let full = self.config_with_host();
        let without = full.replace(
            &format!(
                "[[service]]\nname = \"web-http\"\ncluster_ip = [\"{HTTP_VIP}\", \"{HTTP_VIP6}\"]\nport = 80\nnode_port = 30088\nendpoints = [\"{POD_A}:8088\", \"[{POD_A6}]:8088\"]\n"
            ),
            "",
        );
        assert_ne!(without, full);
        without
    }

    fn config_with_host(&self) -> String {
        format!(
            r#"{node}service_cidr = ["10.97.0.0/16", "fd00:97::/112"]

[[bridge]]
name = "{bridge}"
address = ["{GW}/24", "{GW6}/64"]
ports = ["{a}"]

[[uplink]]
name = "{up}"
address = ["{NODE}/24", "{NODE6}/64"]

[[host]]
name = "{host}"
address = ["{NODE}", "{NODE6}"]
routes = ["0.0.0.0/0"]

[[route]]
to = "0.0.0.0/0"
via = "{OUTSIDE}"

[[service]]
name = "web"
cluster_ip = ["{WEB_VIP}", "{WEB_VIP6}"]
port = 80
node_port = 30080
endpoints = ["{POD_A}:8080", "[{POD_A6}]:8080"]

[[service]]
name = "web-http"
cluster_ip = ["{HTTP_VIP}", "{HTTP_VIP6}"]
port = 80
node_port = 30088
endpoints = ["{POD_A}:8088", "[{POD_A6}]:8088"]

[[service]]
name = "hostsvc"
cluster_ip = "{HOST_VIP}"
port = 80
node_port = 30081
endpoints = ["{NODE}:{NODE_PORT_SRV}"]

[masquerade]
out = "{up}"
"#,
            node = node_toml(
                "e2e-host",
                r#"["10.216.0.0/16", "fd00:216::/32"]"#,
                &self.socket,
                Some(&self.socket.with_file_name("state")),
            ),
            bridge = self.bridge,
            a = self.tap_a,
            up = self.uplink,
            host = self.host,
        )
    }
}

fn skip_or_fail() -> bool {
    common::skip_or_fail(
        "host_port",
        missing(&[("ip", "-V"), ("python3", "-V"), ("iptables", "-V")]),
    )
}

/// The uplink TAP (made in the node namespace) into the wire namespace's Linux bridge, with
/// the outside host on a veth.
fn build_wire(n: &Names) {
    let (w, out) = (&n.ns_wire, &n.ns_out);
    run(&["ip", "-n", &n.ns_node, "link", "set", &n.uplink, "netns", w]);
    run(&["ip", "-n", w, "link", "add", "br0", "type", "bridge"]);
    run(&["ip", "-n", w, "link", "set", "br0", "up"]);
    run(&["ip", "-n", w, "link", "set", &n.uplink, "master", "br0"]);
    run(&["ip", "-n", w, "link", "set", &n.uplink, "up"]);
    run(&[
        "ip", "-n", w, "link", "add", "vout", "type", "veth", "peer", "name", "eth0", "netns", out,
    ]);
    run(&["ip", "-n", w, "link", "set", "vout", "master", "br0"]);
    run(&["ip", "-n", w, "link", "set", "vout", "up"]);
    link_up(out, "eth0", &[&format!("{OUTSIDE}/24")]);
    run(&[
        "ip",
        "-n",
        out,
        "route",
        "add",
        "10.216.0.0/16",
        "via",
        NODE,
    ]);
    build_node_b(n);
}

/// Node B in the outside namespace: a Linux node with pod-b on a veth, routing its pod CIDR
/// (the rest of the cluster CIDR goes to this node), and the DNAT kube-proxy's rules on node
/// B would make for `hostsvc` (ClusterIP:80 to the node's server at the node's address).
fn build_node_b(n: &Names) {
    let (out, b) = (&n.ns_out, &n.ns_b);
    run(&[
        "ip", "-n", out, "link", "add", "vpb", "type", "veth", "peer", "name", "eth0", "netns", b,
    ]);
    addr_add(out, "10.216.2.1/24", "vpb");
    run(&["ip", "-n", out, "link", "set", "vpb", "up"]);
    run(&[
        "ip",
        "netns",
        "exec",
        out,
        "sysctl",
        "-qw",
        "net.ipv4.ip_forward=1",
    ]);
    link_up(b, "eth0", &[&format!("{POD_B}/24")]);
    run(&[
        "ip",
        "-n",
        b,
        "route",
        "add",
        "default",
        "via",
        "10.216.2.1",
    ]);
    let to = format!("{NODE}:{NODE_PORT_SRV}");
    run(&[
        "ip",
        "netns",
        "exec",
        out,
        "iptables",
        "-t",
        "nat",
        "-A",
        "PREROUTING",
        "-d",
        HOST_VIP,
        "-p",
        "tcp",
        "--dport",
        "80",
        "-j",
        "DNAT",
        "--to-destination",
        &to,
    ]);
}

/// The client address each exchange's server saw, all from server `ident`.
fn seen(ns: &str, mode: &str, addr: &str, port: u16, ident: &str) -> Vec<String> {
    exchange(ns, mode, addr, port, 3)
        .into_iter()
        .map(|(who, saw)| {
            assert_eq!(who, ident, "{ns} -> {addr}:{port}");
            saw
        })
        .collect()
}

/// Every client sees `want`.
fn all_from(ns: &str, addr: &str, port: u16, ident: &str, want: &str) {
    let got = seen(ns, "tcp", addr, port, ident);
    assert!(
        got.iter().all(|s| s == want),
        "{ns} -> {addr}:{port}: the server saw {got:?}, expected {want}"
    );
}

/// `curl http://<addr>:<port>/` from `ns`: what the server answered (the client address it
/// saw), `None` when it fails.
fn curl(ns: &str, addr: &str, port: u16) -> Option<String> {
    let url = if addr.contains(':') {
        format!("http://[{addr}]:{port}/")
    } else {
        format!("http://{addr}:{port}/")
    };
    let (ok, out) = in_ns(ns, &["curl", "-s", "--max-time", "5", &url]);
    ok.then(|| out.trim().to_string())
}

/// The node namespace's policy rules: tapyard's NodePort rule for each of `ports` (the IPv6
/// ones: those of the Services with an IPv6 ClusterIP), once, none for the other NodePorts;
/// with a host port (`ports` not empty) the `local` table's rule at 100, else at 0; both
/// families.
fn node_rules(n: &Names, ports: &[u16]) {
    for (fam, node, v6_too) in [("-4", NODE, [true; 3]), ("-6", NODE6, [true, false, true])] {
        let rules = run(&["ip", fam, "-n", &n.ns_node, "rule", "show"]);
        for (p, has6) in NODE_PORTS.into_iter().zip(v6_too) {
            let rule = format!(
                "99:\tfrom all to {node} iif lo ipproto tcp dport {p} lookup {NODEPORT_TABLE}"
            );
            let want = usize::from(ports.contains(&p) && has6);
            assert_eq!(
                rules.lines().filter(|l| l.starts_with(&rule)).count(),
                want,
                "{want} rule(s) {rule:?} expected in:\n{rules}"
            );
        }
        let local = if ports.is_empty() { "0:" } else { "100:" };
        assert!(
            rules
                .lines()
                .any(|l| l.starts_with(&format!("{local}\tfrom all lookup local"))),
            "the local table's rule is not at {local} in:\n{rules}"
        );
        let others = rules
            .lines()
            .filter(|l| l.contains("lookup local") && !l.starts_with(local))
            .count();
        assert_eq!(others, 0, "the local table's rule twice:\n{rules}");
    }
}

/// Cases (1) to (3).
fn cases(n: &Names) {
    // (1) The node's own clients. A ClusterIP: masqueraded (the node is outside the cluster
    // CIDR), to cni0's address, the way out to pod-a.
    all_from(&n.ns_node, WEB_VIP, 80, "pod-a", GW);
    if have("curl", "--version") {
        let url = format!("http://{HTTP_VIP}/");
        let out = run(&[
            "ip",
            "netns",
            "exec",
            &n.ns_node,
            "curl",
            "-s",
            "--max-time",
            "5",
            &url,
        ]);
        assert_eq!(
            out.trim(),
            GW,
            "curl {url} from the node: the address pod-a saw"
        );
        println!("curl {url} from the node: pod-a saw {}", out.trim());
    }
    // The NodePort on tapyard's addresses behind the host port (the node's own address is
    // the kernel's: it delivers that locally).
    all_from(&n.ns_node, GW, 30080, "pod-a", GW);
    all_from(&n.ns_node, HOST_GW, 30080, "pod-a", GW);
    // The node's own address: its policy rules send it to tapyard (not delivered locally),
    // masqueraded as kube-proxy does (policy Cluster), to pod-a and to the node's own server.
    all_from(&n.ns_node, NODE, 30080, "pod-a", GW);
    all_from(&n.ns_node, NODE, 30081, "node", HOST_GW);
    if have("curl", "--version") {
        assert_eq!(
            curl(&n.ns_node, NODE, 30088).as_deref(),
            Some(GW),
            "curl http://{NODE}:30088/ from the node"
        );
    }
    // A pod directly: the node's address, kept.
    all_from(&n.ns_node, POD_A, 8080, "pod-a", NODE);
    // The same over IPv6: an IPv6 ClusterIP (masqueraded to the bridge's IPv6 address), the
    // node's own [address]:NodePort, the pod directly.
    all_from(&n.ns_node, WEB_VIP6, 80, "pod-a", GW6);
    all_from(&n.ns_node, NODE6, 30080, "pod-a", GW6);
    all_from(&n.ns_node, POD_A6, 8080, "pod-a", NODE6);
    if have("curl", "--version") {
        for (addr, port) in [(HTTP_VIP6, 80), (NODE6, 30088)] {
            assert_eq!(
                curl(&n.ns_node, addr, port).as_deref(),
                Some(GW6),
                "curl -6 http://[{addr}]:{port}/ from the node"
            );
        }
    }
    // (2) A pod to a Service whose endpoint is the node's own server: its address, kept
    // (kube-proxy marks no masquerade for a pod source).
    all_from(&n.ns_a, HOST_VIP, 80, "node", POD_A);
    // ... and the node's server reached from a pod directly.
    all_from(&n.ns_a, NODE, NODE_PORT_SRV, "node", POD_A);
    // (3) From outside: the NodePort on the node's address, to the node's own server,
    // masqueraded (policy Cluster) to the host port's address.
    all_from(&n.ns_out, NODE, 30081, "node", HOST_GW);
    // The node's server directly (no NodePort): to the kernel, unmasqueraded; it answers
    // through the host port's default route.
    all_from(&n.ns_out, NODE, NODE_PORT_SRV, "node", OUTSIDE);
    // The node to the outside host, by the host port's default route: its own address.
    all_from(&n.ns_node, OUTSIDE, 9000, "outside", NODE);
    // A NodePort to a pod still answers on the node's address.
    let got = seen(&n.ns_out, "tcp", NODE, 30080, "pod-a");
    assert!(got.iter().all(|s| s == GW), "{got:?}");
    // (5) A pod on another node: the node's server at the node's address sees the pod's own
    // address (it answers through the host port, and tapyard routes the answer to node B),
    // also when node B's kube-proxy DNAT'd `hostsvc`'s ClusterIP to it; the NodePorts
    // masquerade it (policy Cluster), to the node's server and to pod-a.
    all_from(&n.ns_b, NODE, NODE_PORT_SRV, "node", POD_B);
    all_from(&n.ns_b, HOST_VIP, 80, "node", POD_B);
    all_from(&n.ns_b, NODE, 30081, "node", HOST_GW);
    all_from(&n.ns_b, NODE, 30080, "pod-a", GW);
}

fn show_ports(n: &Names) {
    let ports = tapyard_ok_at(&n.socket, &["show", "ports"]);
    let line = ports
        .lines()
        .find(|l| l.contains(&n.host))
        .unwrap_or_else(|| panic!("show ports lacks the host port:\n{ports}"));
    assert!(line.contains("host"), "{line}");
    let routes = tapyard_ok_at(&n.socket, &["show", "routes"]);
    assert!(
        routes.contains(&format!("{NODE} dev {}", n.host)),
        "no host route in:\n{routes}"
    );
    let kernel = run(&["ip", "-n", &n.ns_node, "route", "show"]);
    for want in [
        format!("10.216.0.0/16 via {HOST_GW} dev {}", n.host),
        format!("10.97.0.0/16 via {HOST_GW} dev {}", n.host),
        format!("default via {HOST_GW} dev {}", n.host),
    ] {
        assert!(
            kernel.contains(&want),
            "the node's routes lack {want:?}:\n{kernel}"
        );
    }
    let kernel6 = run(&["ip", "-6", "-n", &n.ns_node, "route", "show"]);
    for want in [
        format!("fd00:216::/32 via {HOST_GW6} dev {}", n.host),
        format!("fd00:97::/112 via {HOST_GW6} dev {}", n.host),
    ] {
        assert!(
            kernel6.contains(&want),
            "the node's IPv6 routes lack {want:?}:\n{kernel6}"
        );
    }
    node_rules(n, &NODE_PORTS);
    println!("show ports:\n{ports}node's routes:\n{kernel}{kernel6}");
}

#[test]
#[cfg_attr(
    not(tapyard_root),
    ignore = "needs root: TAP devices and network namespaces (runs as root, as in CI)"
)]
fn the_node_reaches_services_and_serves_them_through_its_host_port() {
    if skip_or_fail() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("tapyard-host-{}", std::process::id()));
    let n = Names::new(&dir);
    let mut g = Guard::new(&dir, &dir.join("run.log"));
    for ns in [&n.ns_node, &n.ns_a, &n.ns_wire, &n.ns_out, &n.ns_b] {
        g.ns(ns);
    }
    run(&["ip", "-n", &n.ns_node, "link", "set", "lo", "up"]);
    std::fs::write(&n.config, n.config(true)).unwrap();
    let check = run(&[TAPYARD, "check", &n.config.display().to_string()]);
    assert!(check.contains("ok"), "{check}");
    g.start_node(Some(&n.ns_node), &n.config, &[], &n.socket);
    ns_named(&n.ns_a).attach(
        Some(&n.ns_node),
        &n.tap_a,
        &[&format!("{POD_A}/24"), &format!("{POD_A6}/64")],
        &[GW, GW6],
    );
    build_wire(&n);
    spawn_in(
        &mut g.children,
        &n.ns_a,
        &["python3", "-c", SERVER_PY, "pod-a", "8080", "0"],
    );
    if have("curl", "--version") {
        spawn_in(
            &mut g.children,
            &n.ns_a,
            &["python3", "-c", HTTP_PY, "8088"],
        );
        wait_listening(&n.ns_a, 8088);
    }
    let port = NODE_PORT_SRV.to_string();
    spawn_in(
        &mut g.children,
        &n.ns_node,
        &["python3", "-c", SERVER_PY, "node", &port, "0"],
    );
    spawn_in(
        &mut g.children,
        &n.ns_out,
        &["python3", "-c", SERVER_PY, "outside", "9000", "0"],
    );
    wait_listening(&n.ns_a, 8080);
    wait_listening(&n.ns_node, NODE_PORT_SRV);
    wait_listening(&n.ns_out, 9000);

    cases(&n);
    show_ports(&n);

    // (4) A restart: the ports are re-attached, the kernel side set up again.
    let st = g.stop_node();
    assert!(st.success(), "exit status after SIGTERM: {st}");
    g.start_node(Some(&n.ns_node), &n.config, &[], &n.socket);
    cases(&n);
    show_ports(&n);
    // And a takeover: the running node hands its TAPs over to a new process.
    let log2 = dir.join("run2.log");
    g.logs.push(log2.clone());
    let second = tapyard_run(Some(&n.ns_node), &n.config, &["--takeover"], &log2)
        .spawn()
        .expect("tapyard run --takeover");
    g.children.push(second);
    let mut first = g.node.take().expect("the first node");
    let st = wait_output_status(&mut first, 20);
    assert!(st.success(), "the old process exited with {st}");
    wait_for_socket(g.children.last_mut(), &n.socket);
    cases(&n);
    show_ports(&n);

    // A Service removed by a reload takes its NodePort rule with it (the node's own
    // address:30088 is then local: refused); put back, the rule is back.
    std::fs::write(&n.config, n.config_without_web_http()).unwrap();
    tapyard_ok_at(&n.socket, &["reload"]);
    node_rules(&n, &NODE_PORTS[..2]);
    if have("curl", "--version") {
        assert_eq!(curl(&n.ns_node, NODE, 30088), None, "web-http is gone");
    }
    all_from(&n.ns_node, NODE, 30080, "pod-a", GW);
    std::fs::write(&n.config, n.config(true)).unwrap();
    tapyard_ok_at(&n.socket, &["reload"]);
    node_rules(&n, &NODE_PORTS);
    cases(&n);
    // The host port's `routes` change live: a reload adds the kernel's route, and takes it
    // away again.
    let extra = format!("192.0.2.0/24 via {HOST_GW} dev {}", n.host);
    let more = n.config(true).replace(
        "routes = [\"0.0.0.0/0\"]",
        "routes = [\"0.0.0.0/0\", \"192.0.2.0/24\"]",
    );
    for (text, present) in [(more, true), (n.config(true), false)] {
        std::fs::write(&n.config, text).unwrap();
        let out = tapyard_ok_at(&n.socket, &["reload"]);
        assert!(out.contains("routes [0.0.0.0/0"), "{out}");
        let kernel = run(&["ip", "-n", &n.ns_node, "route", "show"]);
        assert_eq!(kernel.contains(&extra), present, "{extra:?} in:\n{kernel}");
    }
    cases(&n);

    // Removing the host port: a reload refuses it (a restart is needed); a takeover with the
    // new file removes it (its TAP and the kernel's routes go) while the pod keeps working;
    // another takeover brings it back.
    std::fs::write(&n.config, n.config(false)).unwrap();
    let out = tapyard_at(&n.socket, &["reload"]);
    let text =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(
        !out.status.success() && text.contains(&format!("host \"{}\" removed", n.host)),
        "{text}"
    );
    for (i, host) in [(3, false), (4, true)] {
        std::fs::write(&n.config, n.config(host)).unwrap();
        let log = dir.join(format!("run{i}.log"));
        g.logs.push(log.clone());
        let next = tapyard_run(Some(&n.ns_node), &n.config, &["--takeover"], &log)
            .spawn()
            .expect("tapyard run --takeover");
        let mut old = g.children.pop().expect("the running node");
        g.children.push(next);
        let st = wait_output_status(&mut old, 20);
        assert!(st.success(), "the old process exited with {st}");
        wait_for_socket(g.children.last_mut(), &n.socket);
        let ports = tapyard_ok_at(&n.socket, &["show", "ports"]);
        assert_eq!(ports.contains(&n.host), host, "{ports}");
        let node_ns = ns_named(&n.ns_node);
        assert!(
            eventually(std::time::Duration::from_secs(5), || node_ns
                .has_link(&n.host)
                == host),
            "the host TAP is {}in the node's namespace",
            if host { "not " } else { "still " }
        );
        if host {
            cases(&n);
            show_ports(&n);
        } else {
            node_rules(&n, &[]);
            all_from(&n.ns_out, NODE, 30080, "pod-a", GW);
            all_from(&n.ns_a, OUTSIDE, 9000, "outside", NODE);
        }
    }

    // A clean stop keeps the rules (as the TAPs); `tapyard cleanup`, run from another
    // namespace than the node's, removes them there and puts `local` back at 0.
    let mut last = g.children.pop().expect("the running node");
    run(&["kill", "-TERM", &last.id().to_string()]);
    let st = wait_output_status(&mut last, 20);
    assert!(st.success(), "exit status after SIGTERM: {st}");
    node_rules(&n, &NODE_PORTS);
    let out = run(&[TAPYARD, "cleanup", &n.config.display().to_string()]);
    println!("cleanup:\n{out}");
    assert!(
        out.contains("ip rule: the local table's rule back at pref 0")
            && out.contains("ip -6 rule: the local table's rule back at pref 0"),
        "{out}"
    );
    node_rules(&n, &[]);
}

/// Waits (at most `secs`) for `c` to exit: its status.
fn wait_output_status(c: &mut std::process::Child, secs: u64) -> std::process::ExitStatus {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        if let Some(st) = c.try_wait().expect("wait") {
            return st;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the old process did not exit"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}
