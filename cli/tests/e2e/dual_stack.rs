//! End-to-end test of a dual-stack node: `tapyard run` with IPv4 and IPv6 on its bridges and
//! uplink, pods, a second (Linux) node and an outside host in network namespaces.
//!
//! ```text
//!  pod-a 10.219.1.2 fd00:219:0:1::2 ─ TAP ─┐
//!  pod-b 10.219.1.3 fd00:219:0:1::3 ─ TAP ─┴ bridge (gw 10.219.1.1, fd00:219:0:1::1/64) ┐
//!  pod-r 10.219.5.2 fd00:219:0:5::2 ─ TAP ── bridge with ra = true (fd00:219:0:5::1/64) ┤
//!                                                                   tapyard node (own ns) ┤
//!  wire ns: Linux bridge ── uplink TAP (10.220.0.2, fd00:220::2/64, MTU 1400) ───────────┘
//!     ├─ veth ── node-b ns (Linux): 10.220.0.3, fd00:220::3; pods 10.219.2.2 and
//!     │          fd00:219:0:2::2 on lo, routes to node A's pods via the uplink
//!     └─ veth ── outside ns: 10.220.0.1, fd00:220::1 (the default gateway); no route to
//!                the pods (what it sees of them is masqueraded)
//! ```
//!
//! Each case runs whatever happened to the ones before it, and the test reports every case
//! (passed or failed, with the reason) before it fails: pod to pod (ping -6, TCP); NDP as
//! the pods see it (`ip -6 neigh`: the gateway with its MAC); cross-node routed; node-b's
//! host to a pod; a ClusterIP spread over its endpoints with the client's address kept;
//! hairpin (masqueraded to the gateway); NodePort with `externalTrafficPolicy` Cluster
//! (masqueraded) and Local (client kept, local endpoint only), and not on the node's IPv4
//! address for an IPv6-only Service; pod to outside masqueraded to the uplink's IPv6 address;
//! a UDP Service; a Service without endpoints refused at once; `traceroute -6` showing the
//! gateway as the first hop; an unreachable next hop reported as ICMPv6 address unreachable;
//! packet too big with the uplink's MTU and `tracepath -6` finding it; a dual-stack Service on
//! both ClusterIPs; Router Advertisements (pod-r learns `default via fe80::… proto ra`);
//! `show neigh|routes|conntrack|services` printing IPv6 and `--json`; after a restart the
//! router's link-local address is the same (pod-r reaches it) and traffic flows again.
//!
//! Needs root, `ip`, `ping`, `python3`, `traceroute` and `tracepath` (Debian's
//! iputils-tracepath); without them the test says why and passes, except with `CI=true`,
//! where it fails. Addresses are added with `nodad` and every namespace has `accept_dad=0`,
//! so no address is tentative. Names carry the process id; a guard kills the node and deletes
//! the namespaces on success and failure alike. Traffic goes only to addresses inside the
//! namespaces the test creates.

use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::time::Duration;

use crate::common::cni_plugin;
use crate::common::*;
use cni_plugin::{cni, cni_ok, leases, net_conf};

const BIN: &str = env!("CARGO_BIN_EXE_tapyard");

const GW4: &str = "10.219.1.1";
const GW6: &str = "fd00:219:0:1::1";
const GW_MAC: &str = "02:00:0a:db:01:01";
const POD_A4: &str = "10.219.1.2";
const POD_A6: &str = "fd00:219:0:1::2";
const POD_B4: &str = "10.219.1.3";
const POD_B6: &str = "fd00:219:0:1::3";
const POD_R4: &str = "10.219.5.2";
const POD_R6: &str = "fd00:219:0:5::2";
const UPLINK4: &str = "10.220.0.2";
const UPLINK6: &str = "fd00:220::2";
const NODE_B4: &str = "10.220.0.3";
const NODE_B6: &str = "fd00:220::3";
const NODE_B_POD4: &str = "10.219.2.2";
const NODE_B_POD6: &str = "fd00:219:0:2::2";
const OUTSIDE4: &str = "10.220.0.1";
const OUTSIDE6: &str = "fd00:220::1";
/// Routed via a next hop nobody answers for.
const DEAD6: &str = "fd00:219:0:3::2";
const UPLINK_MTU: u16 = 1400;

const WEB6: &str = "fd00:96::10";
const SELF6: &str = "fd00:96::11";
const LOCAL6: &str = "fd00:96::12";
const DNS6: &str = "fd00:96::53";
const EMPTY6: &str = "fd00:96::99";
const DUAL4: &str = "10.96.0.30";
const DUAL6: &str = "fd00:96::30";

/// Why this machine cannot run the test, if it cannot.
fn skip_reason() -> Option<String> {
    missing6(&[
        ("ip", "-V", "iproute2"),
        ("ping", "-V", "iputils-ping"),
        ("python3", "-V", "python3"),
        ("traceroute", "--version", "traceroute"),
        ("tracepath", "-V", "iputils-tracepath"),
    ])
}

/// The Services, added by a reload once the node runs.
fn services_toml() -> String {
    format!(
        r#"
[[service]]
name = "web6"
cluster_ip = "{WEB6}"
port = 80
node_port = 30086
endpoints = ["[{POD_B6}]:8080", "[{NODE_B_POD6}]:8080"]

[[service]]
name = "self6"
cluster_ip = "{SELF6}"
port = 80
endpoints = ["[{POD_A6}]:8080"]

[[service]]
name = "local6"
cluster_ip = "{LOCAL6}"
port = 80
node_port = 30087
external_traffic_policy = "local"
endpoints = ["[{POD_B6}]:8080", "[{NODE_B_POD6}]:8080"]

[[service]]
name = "dns6"
cluster_ip = "{DNS6}"
protocol = "udp"
port = 53
endpoints = ["[{POD_B6}]:5353"]

[[service]]
name = "empty6"
cluster_ip = "{EMPTY6}"
port = 80

[[service]]
name = "dual"
cluster_ip = ["{DUAL4}", "{DUAL6}"]
port = 80
endpoints = ["{POD_B4}:8080", "[{POD_B6}]:8080"]
"#
    )
}

/// Names and paths of one run.
#[derive(Clone)]
struct Names {
    id: u32,
    cni: String,
    rab: String,
    tap_a: String,
    tap_b: String,
    tap_r: String,
    uplink: String,
    ns_node: String,
    ns_a: String,
    ns_b: String,
    ns_r: String,
    ns_wire: String,
    ns_nb: String,
    ns_out: String,
    dir: PathBuf,
    socket: PathBuf,
    config: PathBuf,
    log: PathBuf,
}

impl Names {
    fn new() -> Names {
        let id = std::process::id() % 100_000;
        let dir = std::env::temp_dir().join(format!("tapyard-dual-{id}"));
        Names {
            id,
            cni: format!("t6c{id}"),
            rab: format!("t6r{id}"),
            tap_a: format!("t6a{id}"),
            tap_b: format!("t6b{id}"),
            tap_r: format!("t6p{id}"),
            uplink: format!("t6u{id}"),
            ns_node: format!("t6-node-{id}"),
            ns_a: format!("t6-a-{id}"),
            ns_b: format!("t6-b-{id}"),
            ns_r: format!("t6-r-{id}"),
            ns_wire: format!("t6-wire-{id}"),
            ns_nb: format!("t6-nb-{id}"),
            ns_out: format!("t6-out-{id}"),
            socket: dir.join("ctl.sock"),
            config: dir.join("node.toml"),
            log: dir.join("run.log"),
            dir,
        }
    }

    /// The node's file; `services`: with the Services (a reload adds them).
    fn config(&self, services: bool) -> String {
        let mut c = self.base_config();
        if services {
            c.push_str(&services_toml());
        }
        c
    }

    fn base_config(&self) -> String {
        format!(
            r#"{node}
[[bridge]]
name = "{cni}"
address = ["{GW4}/24", "{GW6}/64"]
mac = "{GW_MAC}"
ports = ["{a}", "{b}"]

[[bridge]]
name = "{rab}"
address = ["10.219.5.1/24", "fd00:219:0:5::1/64"]
ports = ["{r}"]
ra = true

[[uplink]]
name = "{up}"
address = ["{UPLINK4}/24", "{UPLINK6}/64"]
mtu = {UPLINK_MTU}

[[route]]
to = "10.219.2.0/24"
via = "{NODE_B4}"

[[route]]
to = "fd00:219:0:2::/64"
via = "{NODE_B6}"

[[route]]
to = "fd00:219:0:3::/64"
via = "fd00:220::77"

[[route]]
to = "0.0.0.0/0"
via = "{OUTSIDE4}"

[[route]]
to = "::/0"
via = "{OUTSIDE6}"

[masquerade]
out = "{up}"
"#,
            node = node_toml(
                &format!("dual-{}", self.id),
                r#"["10.219.0.0/16", "fd00:219::/56"]"#,
                &self.socket,
                Some(&self.dir.join("state")),
            ),
            cni = self.cni,
            rab = self.rab,
            a = self.tap_a,
            b = self.tap_b,
            r = self.tap_r,
            up = self.uplink,
        )
    }
}

/// Starts the node in its namespace (its log appended to).
fn start(g: &mut Guard, n: &Names) {
    g.start_node(Some(&n.ns_node), &n.config, &[], &n.socket);
}

/// A pod: its TAP moved in from tapyard's namespace, addresses (IPv6 without DAD), and the
/// default routes via the gateways (`gw6` none: from Router Advertisements).
fn attach_pod(n: &Names, ns: &str, tap: &str, v4: &str, v6: &str, gw4: &str, gw6: Option<&str>) {
    let gws: Vec<&str> = std::iter::once(gw4).chain(gw6).collect();
    let cidrs = [format!("{v4}/24"), format!("{v6}/64")];
    ns_named(ns).attach(Some(&n.ns_node), tap, &[&cidrs[0], &cidrs[1]], &gws);
}

/// The uplink TAP into the wire namespace's Linux bridge (multicast snooping off: tapyard
/// sends no MLD reports), joined by veths to node-b and the outside host.
fn build_wire(n: &Names) {
    let w = &n.ns_wire;
    let mtu = UPLINK_MTU.to_string();
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
        (&n.ns_nb, NODE_B4, NODE_B6, "vnb"),
        (&n.ns_out, OUTSIDE4, OUTSIDE6, "vout"),
    ] {
        run(&[
            "ip", "-n", w, "link", "add", end, "mtu", &mtu, "type", "veth", "peer", "name", "eth0",
            "mtu", &mtu, "netns", peer,
        ]);
        run(&["ip", "-n", w, "link", "set", end, "master", "br0"]);
        run(&["ip", "-n", w, "link", "set", end, "up"]);
        addr_add(peer, &format!("{v4}/24"), "eth0");
        addr_add6(peer, &format!("{v6}/64"), "eth0");
        run(&["ip", "-n", peer, "link", "set", "eth0", "up"]);
    }
    let nb = &n.ns_nb;
    addr_add(nb, &format!("{NODE_B_POD4}/32"), "lo");
    addr_add6(nb, &format!("{NODE_B_POD6}/128"), "lo");
    run(&[
        "ip",
        "-n",
        nb,
        "route",
        "add",
        "10.219.0.0/16",
        "via",
        UPLINK4,
    ]);
    run(&[
        "ip",
        "-n",
        nb,
        "-6",
        "route",
        "add",
        "fd00:219::/56",
        "via",
        UPLINK6,
    ]);
}

fn tapyard_ok(n: &Names, args: &[&str]) -> String {
    tapyard_ok_at(&n.socket, args)
}

fn json(n: &Names, what: &str) -> serde_json::Value {
    let out = tapyard_ok(n, &["show", what, "--json"]);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("show {what} --json: {e}:\n{out}"))
}

/// pod-r's IPv6 default route learned from Router Advertisements: its `via` (fe80::…).
fn ra_default_router(n: &Names) -> String {
    wait_for(
        "pod-r's default route from RA",
        Duration::from_secs(40),
        || {
            let (_, text) = in_ns(&n.ns_r, &["ip", "-6", "route", "show", "default"]);
            let line = text
                .lines()
                .find(|l| l.contains("proto ra"))
                .ok_or_else(|| text.clone())?;
            let via = line
                .split_whitespace()
                .skip_while(|w| *w != "via")
                .nth(1)
                .filter(|v| v.starts_with("fe80::"))
                .ok_or_else(|| line.to_string())?;
            Ok(via.to_string())
        },
    )
}

#[test]
#[cfg_attr(
    not(tapyard_root),
    ignore = "needs root: TAP devices and network namespaces (runs as root, as in CI)"
)]
fn dual_stack_node() {
    if skip_or_fail("dual_stack", skip_reason()) {
        return;
    }
    let n = Names::new();
    let _ = std::fs::remove_dir_all(&n.dir);
    std::fs::create_dir_all(&n.dir).unwrap();
    // The whole file is valid; the node starts without its Services (a reload adds them).
    std::fs::write(&n.config, n.config(true)).unwrap();
    let check = run(&[BIN, "check", &n.config.display().to_string()]);
    assert!(check.contains("ok"), "{check}");
    std::fs::write(&n.config, n.config(false)).unwrap();
    let mut g = Guard::new(&n.dir, &n.log);
    g.ns(&n.ns_node);
    start(&mut g, &n);
    for ns in [&n.ns_a, &n.ns_b, &n.ns_r, &n.ns_wire, &n.ns_nb, &n.ns_out] {
        g.ns(ns);
    }
    let n = &n;
    attach_pod(n, &n.ns_a, &n.tap_a, POD_A4, POD_A6, GW4, Some(GW6));
    attach_pod(n, &n.ns_b, &n.tap_b, POD_B4, POD_B6, GW4, Some(GW6));
    attach_pod(n, &n.ns_r, &n.tap_r, POD_R4, POD_R6, "10.219.5.1", None);
    build_wire(n);
    let (a, b, nb, out) = (
        n.ns_a.clone(),
        n.ns_b.clone(),
        n.ns_nb.clone(),
        n.ns_out.clone(),
    );
    for (ns, ident, tport, uport) in [
        (&a, "a", "8080", "0"),
        (&b, "b", "8080", "5353"),
        (&nb, "nb", "8080", "0"),
        (&out, "out", "9000", "0"),
    ] {
        spawn_in(
            &mut g.children,
            ns,
            &["python3", "-c", SERVER_PY, ident, tport, uport],
        );
    }
    for (ns, port) in [(&a, 8080), (&b, 8080), (&nb, 8080), (&out, 9000)] {
        wait_listening(ns, port);
    }

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

    case("a normal start shows no transmit error", &mut || {
        // Frames flooded to the pods' TAPs before their links came up are `tx_link_down`.
        let st = tapyard_ok(n, &["show", "stats"]);
        assert!(!st.contains("tx_error"), "{st}");
    });
    case("pod to pod (ping -6, TCP)", &mut || {
        ping_ok(&a, POD_B6);
        let v = exchange(&a, "tcp", POD_B6, 8080, 2);
        assert!(v.iter().all(|(w, s)| w == "b" && s == POD_A6), "{v:?}");
        // IPv4 beside it, unchanged.
        ping_ok(&a, POD_B4);
    });
    case("NDP as the pods see it", &mut || {
        ping_ok(&a, GW6);
        let (_, text) = in_ns(&a, &["ip", "-6", "neigh", "show", GW6]);
        assert!(
            text.contains(&format!("lladdr {GW_MAC}"))
                && ["REACHABLE", "STALE", "DELAY", "PROBE"]
                    .iter()
                    .any(|s| text.contains(s)),
            "pod-a's neighbour entry for the gateway: {text}"
        );
    });
    case("cross-node routed (ping -6, TCP)", &mut || {
        ping_ok(&a, NODE_B_POD6);
        let v = exchange(&a, "tcp", NODE_B_POD6, 8080, 2);
        assert!(v.iter().all(|(w, s)| w == "nb" && s == POD_A6), "{v:?}");
        ping_ok(&a, NODE_B_POD4);
    });
    case("node to pod", &mut || {
        ping_ok(&nb, POD_A6);
        let v = exchange(&nb, "tcp", POD_A6, 8080, 1);
        assert_eq!(v, [("a".to_string(), NODE_B6.to_string())]);
    });
    let mut services_in = false;
    case("reload adds the IPv6 and dual-stack Services", &mut || {
        std::fs::write(&n.config, n.config(true)).unwrap();
        let out = tapyard_ok(n, &["reload"]);
        for s in ["web6", "self6", "local6", "dns6", "empty6", "dual"] {
            assert!(out.contains(&format!("service \"{s}\" was added")), "{out}");
        }
        services_in = true;
    });
    case("ClusterIP spread, client address kept", &mut || {
        let v = exchange(&a, "tcp", WEB6, 80, 16);
        assert!(v.iter().all(|(_, s)| s == POD_A6), "{v:?}");
        for who in ["b", "nb"] {
            assert!(
                v.iter().any(|(w, _)| w == who),
                "no connection to {who}: {v:?}"
            );
        }
    });
    case("hairpin (masqueraded to the gateway)", &mut || {
        let v = exchange(&a, "tcp", SELF6, 80, 2);
        assert!(v.iter().all(|(w, s)| w == "a" && s == GW6), "{v:?}");
    });
    case("NodePort, externalTrafficPolicy Cluster", &mut || {
        let v = exchange(&out, "tcp", UPLINK6, 30086, 8);
        assert!(
            v.iter()
                .all(|(w, s)| (w == "b" || w == "nb") && s != OUTSIDE6),
            "{v:?}"
        );
        // An IPv6-only Service has no node port on the node's IPv4 address.
        let v = talk(&out, "once", UPLINK4, 30086, 1);
        assert_eq!(v[0].0, "error", "{v:?}");
    });
    case("NodePort, externalTrafficPolicy Local", &mut || {
        let v = exchange(&out, "tcp", UPLINK6, 30087, 6);
        assert!(v.iter().all(|(w, s)| w == "b" && s == OUTSIDE6), "{v:?}");
    });
    case(
        "pod to outside, masqueraded to the uplink's IPv6 address",
        &mut || {
            let v = exchange(&a, "tcp", OUTSIDE6, 9000, 2);
            assert!(v.iter().all(|(w, s)| w == "out" && s == UPLINK6), "{v:?}");
        },
    );
    case("UDP Service", &mut || {
        let v = exchange(&a, "udp", DNS6, 53, 3);
        assert!(v.iter().all(|(w, s)| w == "b" && s == POD_A6), "{v:?}");
    });
    case("no endpoints: refused at once", &mut || {
        let v = talk(&a, "once", EMPTY6, 80, 1);
        assert!(
            v[0].0 == "error" && v[0].1.contains("refused"),
            "expected connection refused: {v:?}"
        );
    });
    case("dual-stack Service on both ClusterIPs", &mut || {
        let v = exchange(&a, "tcp", DUAL4, 80, 2);
        assert!(v.iter().all(|(w, s)| w == "b" && s == POD_A4), "{v:?}");
        let v = exchange(&a, "tcp", DUAL6, 80, 2);
        assert!(v.iter().all(|(w, s)| w == "b" && s == POD_A6), "{v:?}");
    });
    case("traceroute -6 shows the gateway's hop", &mut || {
        let (_, text) = in_ns(
            &a,
            &[
                "traceroute",
                "-6",
                "-n",
                "-q",
                "1",
                "-w",
                "2",
                "-m",
                "4",
                NODE_B_POD6,
            ],
        );
        let hop1 = text
            .lines()
            .find(|l| l.trim_start().starts_with("1 "))
            .unwrap_or_default();
        assert!(hop1.contains(GW6), "hop 1 is not the gateway:\n{text}");
        assert!(text.contains(NODE_B_POD6), "{text}");
    });
    case(
        "unreachable next hop: ICMPv6 address unreachable",
        &mut || {
            let (ok, text) = in_ns(&a, &["ping", "-n", "-c", "1", "-W", "10", DEAD6]);
            // From the router, not pod-a's own kernel failing to resolve its gateway.
            assert!(
                !ok && text
                    .lines()
                    .any(|l| l.contains("Address unreachable") && !l.contains(POD_A6)),
                "expected Destination unreachable: Address unreachable from the router:\n{text}\n{}\n{}",
                tapyard_ok(n, &["show", "stats"]),
                tapyard_ok(n, &["show", "neigh"])
            );
        },
    );
    case("packet too big, tracepath -6 finds the PMTU", &mut || {
        let size = (1500 - 48).to_string();
        let (ok, text) = in_ns(
            &a,
            &[
                "ping",
                "-n",
                "-c",
                "1",
                "-W",
                "3",
                "-M",
                "do",
                "-s",
                &size,
                NODE_B_POD6,
            ],
        );
        assert!(
            !ok && text.contains("Packet too big") && text.contains(&format!("mtu={UPLINK_MTU}")),
            "expected Packet too big: mtu={UPLINK_MTU}:\n{text}"
        );
        run(&["ip", "-n", &a, "-6", "route", "flush", "cache"]);
        let (_, text) = in_ns(&a, &["tracepath", "-6", "-n", "-m", "4", NODE_B_POD6]);
        assert!(
            text.contains(&format!("pmtu {UPLINK_MTU}")),
            "tracepath found no pmtu {UPLINK_MTU}:\n{text}"
        );
        // Packets that fit go through.
        let fits = (usize::from(UPLINK_MTU) - 48).to_string();
        let (ok, text) = in_ns(
            &a,
            &[
                "ping",
                "-n",
                "-c",
                "1",
                "-W",
                "3",
                "-M",
                "do",
                "-s",
                &fits,
                NODE_B_POD6,
            ],
        );
        assert!(ok, "{text}");
    });
    let mut router_ll = String::new();
    case("RA: the pod learns its default router", &mut || {
        router_ll = ra_default_router(n);
        ping_ok(&n.ns_r, POD_A6);
    });
    case("show neigh/routes print IPv6 (and --json)", &mut || {
        let neigh = tapyard_ok(n, &["show", "neigh"]);
        assert!(
            neigh
                .lines()
                .any(|l| l.starts_with(&format!("{POD_A6} dev {}", n.cni)) && l.contains("lladdr")),
            "show neigh:\n{neigh}"
        );
        let rows = json(n, "neigh");
        assert!(
            rows.as_array().is_some_and(|r| r
                .iter()
                .any(|e| e["dst"] == POD_A6 && e["dev"] == n.cni.as_str())),
            "{rows}"
        );
        let routes = tapyard_ok(n, &["show", "routes"]);
        for want in [
            format!("fd00:219:0:2::/64 via {NODE_B6} dev {}", n.uplink),
            format!("default via {OUTSIDE6} dev {}", n.uplink),
            format!("fd00:219:0:1::/64 dev {}", n.cni),
        ] {
            assert!(
                routes.contains(&want),
                "no `{want}` in show routes:\n{routes}"
            );
        }
    });
    case(
        "show conntrack lists IPv6 connections (and --json)",
        &mut || {
            // A routed connection (closed: its entry stays for TIME_WAIT).
            exchange(&a, "tcp", NODE_B_POD6, 8080, 1);
            let ct = tapyard_ok(n, &["show", "conntrack"]);
            assert!(
                ct.lines()
                    .any(|l| l.contains(&format!("src={POD_A6} dst={NODE_B_POD6}"))),
                "show conntrack:\n{ct}"
            );
            let rows = json(n, "conntrack");
            assert!(
                rows.as_array()
                    .is_some_and(|r| r.iter().any(|e| e["orig"]["src"] == POD_A6)),
                "{rows}"
            );
        },
    );
    case(
        "show services lists both ClusterIPs of a dual-stack Service",
        &mut || {
            let svcs = json(n, "services");
            let dual = svcs
                .as_array()
                .and_then(|s| s.iter().find(|s| s["name"] == "dual"))
                .unwrap_or_else(|| panic!("no Service dual: {svcs}"));
            assert_eq!(
                dual["cluster_ips"],
                serde_json::json!([DUAL4, DUAL6]),
                "{dual}"
            );
            let text = tapyard_ok(n, &["show", "services"]);
            assert!(
                text.contains(WEB6) || text.contains(&format!("[{WEB6}]")),
                "{text}"
            );
            let neigh = json(n, "neigh");
            assert!(neigh.to_string().contains(POD_A6), "{neigh}");
        },
    );
    // The RA bridge's link-local address, as `status` gives it.
    let status_ll = |n: &Names| -> String {
        let out = tapyard_ok(n, &["status", "--json"]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
        v["interfaces"]
            .as_array()
            .and_then(|i| i.iter().find(|i| i["name"] == n.rab.as_str()))
            .and_then(|i| i["link_local6"].as_str())
            .unwrap_or_default()
            .to_string()
    };
    let ll_before = status_ll(n);
    // A restart: the pods keep their interfaces, the router its link-local address.
    if !services_in {
        // The restart case is about the router, not the Services the node refused.
        std::fs::write(&n.config, n.config(false)).unwrap();
    }
    let restarted = std::panic::catch_unwind(AssertUnwindSafe(|| {
        let st = g.stop_node();
        assert!(st.success(), "exit status {st}");
        start(&mut g, n);
    }));
    case(
        "after a restart: the same link-local router, traffic again",
        &mut || {
            assert!(restarted.is_ok(), "the restart failed");
            assert!(
                !router_ll.is_empty(),
                "no router address was learned before"
            );
            assert_eq!(ll_before, router_ll, "status and the pod's RA route differ");
            assert_eq!(status_ll(n), router_ll, "status after the restart");
            // The IPv6 connection table was kept (<state_dir>/conntrack6).
            let ct = tapyard_ok(n, &["show", "conntrack"]);
            assert!(
                ct.contains(&format!("src={POD_A6} dst={NODE_B_POD6}")),
                "the IPv6 connection of before the restart is gone:\n{ct}"
            );
            let to = format!("{router_ll}%{}", n.tap_r);
            wait_for(
                "pod-r reaches its router's link-local address",
                Duration::from_secs(10),
                || {
                    let (ok, text) = in_ns(&n.ns_r, &["ping", "-n", "-c", "1", "-W", "1", &to]);
                    if ok {
                        Ok(())
                    } else {
                        Err(text)
                    }
                },
            );
            ping_ok(&a, NODE_B_POD6);
            ping_ok(&n.ns_r, POD_A6);
        },
    );

    eprintln!("==== dual-stack cases ====");
    for (name, r) in &results {
        match r {
            Ok(()) => eprintln!("PASS {name}"),
            Err(e) => {
                eprintln!("FAIL {name}: {}", e.lines().next().unwrap_or_default());
                for l in e.lines().skip(1).take(200) {
                    eprintln!("     {l}");
                }
            }
        }
    }
    let failed: Vec<&str> = results
        .iter()
        .filter(|(_, r)| r.is_err())
        .map(|(n, _)| *n)
        .collect();
    assert!(failed.is_empty(), "failed cases: {failed:?}");
}

/// The CNI plugin with a dual-stack IPAM result: `host-local` with a range of each family
/// hands out both addresses, the pod's `eth0` gets both and a default route of each family
/// (IPv6 via the bridge's global address), the ADD result lists both (1.0.0, and 0.4.0 with
/// each IP's `version`), the pods reach each other and their gateway over IPv6, CHECK passes,
/// DEL releases both leases.
#[test]
#[cfg_attr(
    not(tapyard_root),
    ignore = "needs root: TAP devices and network namespaces (runs as root, as in CI)"
)]
fn cni_dual_stack_ipam() {
    let why = skip_reason().or_else(|| {
        plugin_dir().is_none().then(|| {
            "host-local not found in $TAPYARD_CNI_PLUGINS, /usr/lib/cni or /opt/cni/bin".into()
        })
    });
    if skip_or_fail("cni_dual_stack_ipam", why) {
        return;
    }
    let id = std::process::id() % 100_000;
    let dir = std::env::temp_dir().join(format!("tapyard-cni6-{id}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("ipam")).unwrap();
    let mut n = Names::new();
    n.ns_node = format!("t6c-node-{id}");
    n.dir = dir.clone();
    n.socket = dir.join("ctl.sock");
    n.config = dir.join("node.toml");
    n.log = dir.join("run.log");
    let bridge = format!("t6k{id}");
    let node = node_toml(
        &format!("cni6-{id}"),
        r#"["10.219.0.0/16", "fd00:219::/56"]"#,
        &n.socket,
        Some(&dir.join("state")),
    );
    std::fs::write(
        &n.config,
        format!(
            "{node}\n[[bridge]]\nname = \"{bridge}\"\naddress = [\"{GW4}/24\", \"{GW6}/64\"]\n"
        ),
    )
    .unwrap();
    let mut g = Guard::new(&n.dir, &n.log);
    g.ns(&n.ns_node);
    start(&mut g, &n);
    let pods = [format!("t6c-p1-{id}"), format!("t6c-p2-{id}")];
    for p in &pods {
        g.ns(p);
    }
    let ipam_dir = dir.join("ipam");
    let conf = |version: &str| {
        let ranges = serde_json::json!([
            [{"subnet": "10.219.1.0/24", "gateway": GW4}],
            [{"subnet": "fd00:219:0:1::/64", "gateway": GW6}]
        ]);
        let routes = serde_json::json!([{"dst": "0.0.0.0/0"}, {"dst": "::/0"}]);
        net_conf(version, &bridge, &n.socket, ranges, routes, &ipam_dir)
    };
    let mut addrs6 = Vec::new();
    for (i, (p, version)) in pods.iter().zip(["1.0.0", "0.4.0"]).enumerate() {
        let ctr = format!("ctr{i}-{id}");
        let r = cni_ok("ADD", &ctr, p, &conf(version));
        let ips = r["ips"].as_array().cloned().unwrap_or_default();
        assert_eq!(ips.len(), 2, "ADD result: {r}");
        let v6 = ips
            .iter()
            .find(|ip| ip["address"].as_str().is_some_and(|a| a.contains(':')))
            .unwrap_or_else(|| panic!("no IPv6 address in {r}"));
        let v4 = ips
            .iter()
            .find(|ip| ip["address"].as_str().is_some_and(|a| !a.contains(':')))
            .unwrap_or_else(|| panic!("no IPv4 address in {r}"));
        assert_eq!(v6["gateway"], GW6, "{r}");
        assert_eq!(v4["gateway"], GW4, "{r}");
        assert_eq!(
            (v4["interface"].clone(), v6["interface"].clone()),
            (0.into(), 0.into())
        );
        if version == "0.4.0" {
            assert_eq!(
                (v4["version"].clone(), v6["version"].clone()),
                ("4".into(), "6".into()),
                "{r}"
            );
        }
        let routes = r["routes"].to_string();
        for want in [
            format!(r#"{{"dst":"0.0.0.0/0","gw":"{GW4}"}}"#),
            format!(r#"{{"dst":"::/0","gw":"{GW6}"}}"#),
        ] {
            assert!(routes.contains(&want), "no {want} in {routes}");
        }
        let a6 = v6["address"].as_str().unwrap().to_string();
        let (_, addr) = in_ns(p, &["ip", "-6", "addr", "show", "dev", "eth0"]);
        assert!(addr.contains(&a6) && !addr.contains("tentative"), "{addr}");
        let (_, rt) = in_ns(p, &["ip", "-6", "route", "show", "default"]);
        assert!(rt.contains(&format!("via {GW6} dev eth0")), "{rt}");
        let (_, rt) = in_ns(p, &["ip", "-4", "route", "show", "default"]);
        assert!(rt.contains(&format!("via {GW4} dev eth0")), "{rt}");
        // CHECK with the ADD result as prevResult.
        let mut c = conf(version);
        c["prevResult"] = r.clone();
        cni_ok("CHECK", &ctr, p, &c);
        addrs6.push(a6.split('/').next().unwrap().to_string());
    }
    ping_ok(&pods[0], &addrs6[1]);
    ping_ok(&pods[1], &addrs6[0]);
    ping_ok(&pods[0], GW6);
    for (i, (p, version)) in pods.iter().zip(["1.0.0", "0.4.0"]).enumerate() {
        let ctr = format!("ctr{i}-{id}");
        let (ok, v) = cni("DEL", &ctr, p, &conf(version));
        assert!(ok, "DEL: {v}");
    }
    let leases = leases(&ipam_dir);
    assert!(leases.is_empty(), "leases left: {leases:?}");
}
