//! `tapyard check` on broken configs: each must fail with its message naming the file, the
//! line and the field; `examples/node.toml` must pass. Runs the built binary.

use std::path::PathBuf;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_tapyard");

/// A valid base every case starts from (line numbers below refer to it).
const BASE: &str = r#"[node]
name = "node-a"
cluster_cidr = "10.244.0.0/16"

[[bridge]]
name = "cni0"
address = "10.244.1.1/24"
ports = ["pod-a", "pod-b"]

[[uplink]]
name = "eth0"
address = "172.18.0.2/24"

[[route]]
to = "10.244.2.0/24"
via = "172.18.0.3"

[[service]]
name = "web"
cluster_ip = "10.96.0.10"
protocol = "tcp"
port = 80
node_port = 30080
endpoints = ["10.244.1.2:8080", "10.244.2.2:8080"]
"#;

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

fn check_file(name: &str, text: &str) -> (Out, String) {
    // One directory per case: the cases run in parallel and each removes its own.
    let dir = std::env::temp_dir().join(format!("tapyard-check-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path: PathBuf = dir.join(name);
    std::fs::write(&path, text).unwrap();
    let o = Command::new(BIN).arg("check").arg(&path).output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    (
        Out {
            code: o.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&o.stdout).into(),
            stderr: String::from_utf8_lossy(&o.stderr).into(),
        },
        path.display().to_string(),
    )
}

/// Checks `text` and expects each `(line, fragment)` as an error line `FILE:LINE: ...fragment...`.
fn expect_errors(case: &str, text: &str, want: &[(usize, &str)]) {
    let (o, file) = check_file(&format!("{case}.toml"), text);
    assert_eq!(o.code, 1, "{case}: expected exit 1\nstderr:\n{}", o.stderr);
    for (line, frag) in want {
        let prefix = format!("{file}:{line}: ");
        assert!(
            o.stderr
                .lines()
                .any(|l| l.starts_with(&prefix) && l.contains(frag)),
            "{case}: no error line `{prefix}...{frag}...` in:\n{}",
            o.stderr
        );
    }
    assert!(
        o.stderr.contains("error") && o.stderr.contains("found"),
        "{case}: no summary line:\n{}",
        o.stderr
    );
}

#[test]
fn a_bridge_without_ports_passes_and_a_node_with_nothing_fails() {
    // A CNI node: the bridge's pods all arrive through the plugin.
    let cni = "[node]\nname = \"node-a\"\ncluster_cidr = \"10.244.0.0/16\"\n\n[[bridge]]\nname = \"cni0\"\naddress = \"10.244.1.1/24\"\n";
    let (o, _) = check_file("cni.toml", cni);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(
        o.stdout.contains("ok: node \"node-a\": 1 bridge, 0 ports"),
        "{}",
        o.stdout
    );
    expect_errors(
        "nothing",
        "[node]\nname = \"node-a\"\ncluster_cidr = \"10.244.0.0/16\"\n",
        &[(1, "nothing to run: add a [[bridge]]")],
    );
}

#[test]
fn example_passes() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/node.toml");
    let o = Command::new(BIN).args(["check", root]).output().unwrap();
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert!(o.status.success(), "stdout: {out}\nstderr: {err}");
    assert!(
        out.contains("ok: node \"node-a\": 1 bridge, 3 ports, 1 uplink, 2 routes"),
        "{out}"
    );
    assert!(err.is_empty(), "unexpected diagnostics: {err}");
    let (o, _) = check_file("base.toml", BASE);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stdout.contains("ok"));
}

#[test]
fn toml_syntax_error_has_its_line() {
    let text = BASE.replace("port = 80\n", "port = = 80\n");
    expect_errors("syntax", &text, &[(22, "TOML syntax")]);
}

#[test]
fn unknown_keys_are_all_reported() {
    let text = BASE
        .replace("name = \"cni0\"\n", "name = \"cni0\"\ncolour = \"red\"\n")
        .replace("port = 80\n", "port = 80\nnodeport = 30080\n");
    expect_errors(
        "unknown",
        &text,
        &[
            (7, "bridge \"cni0\": unknown field `colour`"),
            (24, "service \"web\": unknown field `nodeport`"),
        ],
    );
    let (o, _) = check_file("toplevel.toml", &format!("{BASE}\n[extra]\nx = 1\n"));
    assert!(
        o.stderr.contains("top level: unknown field `extra`"),
        "{}",
        o.stderr
    );
}

#[test]
fn bad_addresses_and_macs() {
    let text = BASE
        .replace("10.244.1.1/24", "10.244.1.300/24")
        .replace(
            "address = \"172.18.0.2/24\"",
            "address = \"172.18.0.2/24\"\nmac = \"zz:00:00:00:00:01\"",
        )
        .replace("to = \"10.244.2.0/24\"", "to = \"10.244.2.0/40\"")
        .replace("cluster_ip = \"10.96.0.10\"", "cluster_ip = \"10.96.0\"");
    expect_errors(
        "addresses",
        &text,
        &[
            (7, "bridge \"cni0\": address = \"10.244.1.300/24\""),
            (
                13,
                "uplink \"eth0\": mac = \"zz:00:00:00:00:01\" is not a MAC address",
            ),
            (
                16,
                "to = \"10.244.2.0/40\" has prefix length \"40\", expected 0 to 32",
            ),
            (
                21,
                "service \"web\": cluster_ip = \"10.96.0\" is not an IPv4 address",
            ),
        ],
    );
}

/// A `[[bridge.port]]`'s bad addresses and MAC, each at its line with the field and value.
#[test]
fn bad_bridge_port_addresses_and_macs() {
    let text = BASE.replace(
        "ports = [\"pod-a\", \"pod-b\"]\n",
        "ports = [\"pod-a\", \"pod-b\"]\n\n[[bridge.port]]\nname = \"pod-c\"\nips = [\"10.244.1.4\", \"10.244.1.400\"]\nmac = \"ff:ff:ff:ff:ff:ff\"\n",
    );
    expect_errors(
        "bridge-port",
        &text,
        &[
            (
                12,
                "bridge \"cni0\" port \"pod-c\": ips[1] = \"10.244.1.400\" is not an IPv4 address",
            ),
            (
                13,
                "bridge \"cni0\" port \"pod-c\": mac = \"ff:ff:ff:ff:ff:ff\" is not a unicast",
            ),
        ],
    );
}

#[test]
fn duplicate_names_and_ports() {
    let text = format!(
        "{BASE}\n[[bridge]]\nname = \"eth0\"\nports = [\"pod-c\", \"pod-a\", \"pod-c\"]\n\n[[service]]\nname = \"web\"\ncluster_ip = \"10.96.0.11\"\nport = 80\n"
    );
    expect_errors(
        "dups",
        &text,
        &[
            (
                11,
                "uplink \"eth0\": name \"eth0\" is already used by bridge \"eth0\"",
            ),
            (
                28,
                "port \"pod-a\" is listed twice (already a port of bridge \"cni0\")",
            ),
            (28, "port \"pod-c\" is listed twice"),
            (
                31,
                "service \"web\": name \"web\" is already used by the service on line 19",
            ),
        ],
    );
}

#[test]
fn overlapping_subnets_and_long_names() {
    let text = BASE
        .replace("172.18.0.2/24", "10.244.1.200/16")
        .replace("\"pod-b\"", "\"pod-b-is-far-too-long\"");
    expect_errors(
        "overlap",
        &text,
        &[
            (12, "uplink \"eth0\": address = \"10.244.1.200/16\" overlaps cni0's subnet 10.244.1.0/24"),
            (8, "ports[1] = \"pod-b-is-far-too-long\" is 21 bytes long, longer than Linux allows for an interface name (15, IFNAMSIZ)"),
        ],
    );
}

#[test]
fn route_problems() {
    let text = format!(
        "{}\n[[route]]\nto = \"10.244.3.0/24\"\nvia = \"172.18.0.3\"\ntype = \"blackhole\"\n\n[[route]]\nto = \"10.244.4.0/24\"\n\n[[route]]\nto = \"10.244.5.1/24\"\ndev = \"eth9\"\n",
        BASE.replace("via = \"172.18.0.3\"", "via = \"192.168.7.1\"")
    );
    expect_errors(
        "routes",
        &text,
        &[
            (
                16,
                "route to 10.244.2.0/24: via = \"192.168.7.1\" is not on a connected subnet",
            ),
            (
                29,
                "route to 10.244.3.0/24: give either `via`/`dev` or `type",
            ),
            (
                31,
                "route to 10.244.4.0/24: needs `via` (a gateway), `dev` (an interface) or `type",
            ),
            (
                35,
                "to = \"10.244.5.1/24\" has host bits set (expected \"10.244.5.0/24\")",
            ),
            (36, "dev = \"eth9\": no bridge or uplink is named \"eth9\""),
        ],
    );
}

#[test]
fn service_problems() {
    let text = format!(
        "{}\n[[service]]\nname = \"dup\"\ncluster_ip = \"10.96.0.10\"\nport = 80\nnode_port = 30080\nendpoints = [\"10.244.1.5:80\"]\n\n[[service]]\nname = \"inlink\"\ncluster_ip = \"10.244.1.50\"\nprotocol = \"sctp\"\nport = 53\n",
        BASE.replace("node_port = 30080", "node_port = 20080")
            .replace("\"10.244.2.2:8080\"", "\"192.168.9.9:8080\"")
    );
    expect_errors(
        "services",
        &text,
        &[
            (23, "service \"web\": node_port = 20080 is outside 30000-32767 (set node.node_port_range to allow it)"),
            (24, "service \"web\": endpoint 192.168.9.9:8080 is outside every connected subnet and route"),
            (29, "service \"dup\": 10.96.0.10:80/tcp is already service \"web\"'s (line 22)"),
            (35, "service \"inlink\": cluster_ip = \"10.244.1.50\" is inside cni0's connected subnet"),
            (36, "service \"inlink\": protocol = \"sctp\" is not a protocol: expected \"tcp\" or \"udp\""),
        ],
    );
    // Node ports collide per protocol.
    let text = format!(
        "{BASE}\n[[service]]\nname = \"other\"\ncluster_ip = \"10.96.0.12\"\nport = 81\nnode_port = 30080\nendpoints = [\"10.244.1.5:80\"]\n"
    );
    expect_errors(
        "nodeport",
        &text,
        &[(
            30,
            "node_port = 30080/tcp is already service \"web\"'s (line 23)",
        )],
    );
}

#[test]
fn masquerade_workers_and_cluster_cidr() {
    let text = format!(
        "{}\n[masquerade]\nout = \"eth1\"\n",
        BASE.replace(
            "cluster_cidr = \"10.244.0.0/16\"",
            "cluster_cidr = \"10.245.0.0/16\"\nworkers = 0"
        )
    );
    let (o, file) = check_file("masq.toml", &text);
    assert_eq!(o.code, 1, "{}", o.stderr);
    for want in [
        format!("{file}:4: [node]: workers = 0 is not allowed"),
        format!("{file}:28: [masquerade]: out = \"eth1\": no bridge or uplink is named \"eth1\""),
        format!("{file}:8: warning: bridge \"cni0\": address = \"10.244.1.1/24\" is outside node.cluster_cidr 10.245.0.0/16"),
    ] {
        assert!(o.stderr.contains(&want), "missing {want:?} in:\n{}", o.stderr);
    }
}

#[test]
fn warnings_do_not_fail_the_check() {
    let text = BASE.replace(
        "node_port = 30080\n",
        "node_port = 30080\nexternal_traffic_policy = \"local\"\nsession_affinity_timeout = 60\n",
    ).replace("\"10.244.1.2:8080\", ", "");
    let (o, file) = check_file("warnings.toml", &text);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stderr.contains(&format!("{file}:24: warning: service \"web\": external_traffic_policy = \"local\" but no endpoint is on this node's bridges")), "{}", o.stderr);
    assert!(
        o.stderr.contains(&format!(
            "{file}:25: warning: service \"web\": session_affinity_timeout has no effect"
        )),
        "{}",
        o.stderr
    );
}

#[test]
fn missing_required_fields_and_wrong_types() {
    let text = BASE
        .replace("name = \"node-a\"\n", "")
        .replace("port = 80\n", "port = \"80\"\n");
    expect_errors(
        "missing",
        &text,
        &[
            (1, "[node]: missing field `name`"),
            (
                21,
                "service \"web\": port = \"80\" is a string, expected an integer",
            ),
        ],
    );
}

#[test]
fn unreadable_file_and_bad_usage() {
    let o = Command::new(BIN)
        .args(["check", "/nonexistent/tapyard.toml"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr)
        .contains("/nonexistent/tapyard.toml: cannot read the file"));
    let o = Command::new(BIN).args(["check"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    let o = Command::new(BIN).args(["frobnicate"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn run_refuses_an_invalid_config_with_the_same_messages() {
    let dir = std::env::temp_dir().join(format!("tapyard-run-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.toml");
    std::fs::write(
        &path,
        BASE.replace("node_port = 30080", "node_port = 20080"),
    )
    .unwrap();
    let o = Command::new(BIN)
        .arg("run")
        .arg(&path)
        .arg("--socket")
        .arg(dir.join("s.sock"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!(
            "{}:23: service \"web\": node_port = 20080",
            path.display()
        )),
        "{err}"
    );
    assert!(!dir.join("s.sock").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn busy_poll_us_is_checked() {
    let with = |v: &str| {
        BASE.replace(
            "cluster_cidr = \"10.244.0.0/16\"",
            &format!("cluster_cidr = \"10.244.0.0/16\"\nbusy_poll_us = {v}"),
        )
    };
    let (o, _) = check_file("busy-ok.toml", &with("50000"));
    assert_eq!(o.code, 0, "{}", o.stderr);
    for (v, why) in [
        ("1000001", "busy_poll_us = 1000001"),
        ("-1", "busy_poll_us = -1"),
        ("\"50\"", "busy_poll_us = \"50\""),
    ] {
        let (o, file) = check_file("busy-bad.toml", &with(v));
        assert_eq!(o.code, 1, "{}", o.stderr);
        let want = format!("{file}:4: [node]: {why}");
        assert!(
            o.stderr.contains(&want),
            "missing {want:?} in:\n{}",
            o.stderr
        );
    }
}

/// A valid dual-stack base (line numbers below refer to it).
const BASE6: &str = r#"[node]
name = "node-a"
cluster_cidr = ["10.244.0.0/16", "fd00:10:244::/56"]

[[bridge]]
name = "cni0"
address = ["10.244.1.1/24", "fd00:10:244:1::1/64"]
ports = ["pod-a", "pod-b"]

[[uplink]]
name = "eth0"
address = ["172.18.0.2/24", "fd00:172:18::2/64"]

[[route]]
to = "fd00:10:244:2::/64"
via = "fd00:172:18::3"

[[service]]
name = "web"
cluster_ip = ["10.96.0.10", "fd00:10:96::10"]
port = 80
node_port = 30080
endpoints = ["10.244.1.2:8080", "[fd00:10:244:1::2]:8080"]
"#;

#[test]
fn dual_stack_base_and_example_pass() {
    let (o, _) = check_file("base6.toml", BASE6);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stderr.is_empty(), "{}", o.stderr);
    let root = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/node-dual-stack.toml"
    );
    let o = Command::new(BIN).args(["check", root]).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success() && err.is_empty(), "{err}");
}

#[test]
fn dual_stack_addresses_one_prefix_per_family() {
    let text = BASE6
        .replace(
            "address = [\"10.244.1.1/24\", \"fd00:10:244:1::1/64\"]",
            "address = [\"10.244.1.1/24\",\n  \"fd00:10:244:1::1/64\",\n  \"fd00:10:244:9::1/64\"]",
        )
        .replace(
            "cluster_cidr = [\"10.244.0.0/16\", \"fd00:10:244::/56\"]",
            "cluster_cidr = [\"10.244.0.0/16\", \"10.245.0.0/16\"]",
        );
    expect_errors(
        "two-per-family",
        &text,
        &[
            (
                3,
                "[node]: cluster_cidr[1] = \"10.245.0.0/16\" is a second IPv4 value after 10.244.0.0/16 (at most one per family)",
            ),
            (
                9,
                "bridge \"cni0\": address[2] = \"fd00:10:244:9::1/64\" is a second IPv6 value after fd00:10:244:1::1/64",
            ),
        ],
    );
    // An interface may have only an IPv6 address (an IPv6-only uplink passes), but not a
    // link-local one; an IPv4 gateway behind it is refused at its line.
    let v6_uplink = BASE6.replace(
        "address = [\"172.18.0.2/24\", \"fd00:172:18::2/64\"]",
        "address = \"fd00:172:18::2/64\"",
    );
    let (o, _) = check_file("v6-uplink.toml", &v6_uplink);
    assert_eq!(o.code, 0, "{}", o.stderr);
    let text = format!("{v6_uplink}\n[[route]]\nto = \"10.244.2.0/24\"\nvia = \"172.18.0.3\"\n")
        .replace("fd00:10:244:1::1/64", "fe80::1/64");
    expect_errors(
        "v6-only",
        &text,
        &[
            (
                7,
                "bridge \"cni0\": address[1] = \"fe80::1/64\" is link-local",
            ),
            (
                27,
                "route to 10.244.2.0/24: via = \"172.18.0.3\" is not on a connected subnet (connected: cni0 10.244.1.0/24)",
            ),
        ],
    );
    let text = BASE6.replace("fd00:10:244:1::1/64", "fd00:10:244:1::/64");
    expect_errors(
        "v6-anycast",
        &text,
        &[(
            7,
            "address[1] = \"fd00:10:244:1::/64\" is the subnet-router anycast address",
        )],
    );
}

#[test]
fn dual_stack_mtu_ra_and_routes() {
    let text = BASE6
        .replace(
            "ports = [\"pod-a\", \"pod-b\"]",
            "ports = [\"pod-a\", \"pod-b\"]\nmtu = 1279\nra = true",
        )
        .replace(
            "address = [\"172.18.0.2/24\", \"fd00:172:18::2/64\"]",
            "address = [\"172.18.0.2/24\", \"fd00:172:18::2/64\"]\nmtu = 1000",
        );
    expect_errors(
        "mtu",
        &text,
        &[
            (
                9,
                "bridge \"cni0\": mtu = 1279 is below 1280, IPv6's minimum MTU",
            ),
            (15, "uplink \"eth0\": mtu = 1000 is below 1280"),
        ],
    );
    // A v4-only bridge: RA needs an IPv6 address; below 1280 is fine without one.
    let text = BASE6
        .replace(
            "address = [\"10.244.1.1/24\", \"fd00:10:244:1::1/64\"]",
            "address = \"10.244.1.1/24\"\nra = true\nmtu = 576",
        )
        .replace(", \"[fd00:10:244:1::2]:8080\"", "");
    expect_errors(
        "ra",
        &text,
        &[(8, "bridge \"cni0\": ra = true needs an IPv6 address")],
    );
    let (o, _) = check_file("ra-off.toml", &text.replace("ra = true\n", ""));
    assert_eq!(o.code, 0, "{}", o.stderr);
    let routes = format!(
        "{BASE6}\n[[route]]\nto = \"fd00:99::/64\"\nvia = \"172.18.0.3\"\n\n[[route]]\nto = \"10.99.0.0/16\"\nvia = \"fd00:172:18::3\"\n\n[[route]]\nto = \"fd00:98::/64\"\nvia = \"fe80::1\"\n\n[[route]]\nto = \"fd00:97::/64\"\nvia = \"fd00:173::1\"\n\n[[route]]\nto = \"fd00:96::1/64\"\nvia = \"fd00:172:18::2\"\n"
    );
    expect_errors(
        "routes6",
        &routes,
        &[
            (
                27,
                "route to fd00:99::/64: via = \"172.18.0.3\" is an IPv4 address but to = \"fd00:99::/64\" is IPv6",
            ),
            (
                31,
                "route to 10.99.0.0/16: via = \"fd00:172:18::3\" is an IPv6 address but to = \"10.99.0.0/16\" is IPv4",
            ),
            (35, "via = \"fe80::1\" is link-local: give `dev`"),
            (
                39,
                "via = \"fd00:173::1\" is not on a connected IPv6 subnet (connected: cni0 fd00:10:244:1::/64, eth0 fd00:172:18::/64)",
            ),
            (42, "to = \"fd00:96::1/64\" has host bits set (expected \"fd00:96::/64\")"),
            (43, "via = \"fd00:172:18::2\" is this node's own address"),
        ],
    );
    // A dev without IPv6 for an IPv6 route; a link-local gateway with its dev is fine.
    let text = format!(
        "{}\n[[uplink]]\nname = \"eth1\"\naddress = \"172.19.0.2/24\"\n\n[[route]]\nto = \"fd00:95::/64\"\ndev = \"eth1\"\n\n[[route]]\nto = \"fd00:94::/64\"\nvia = \"fe80::1\"\ndev = \"eth0\"\n",
        BASE6
    );
    expect_errors(
        "dev6",
        &text,
        &[(
            31,
            "route to fd00:95::/64: dev = \"eth1\" has no IPv6 address",
        )],
    );
}

#[test]
fn dual_stack_services_and_neighbours() {
    // An endpoint of a family without a ClusterIP; two ClusterIPs of one family.
    let text = BASE6
        .replace(
            "cluster_ip = [\"10.96.0.10\", \"fd00:10:96::10\"]",
            "cluster_ip = \"10.96.0.10\"",
        )
        + "\n[[service]]\nname = \"two\"\ncluster_ip = [\"fd00:10:96::11\", \"fd00:10:96::12\"]\nport = 80\n\n[[service]]\nname = \"in-pods\"\ncluster_ip = \"fd00:10:244:5::1\"\nport = 80\nendpoints = [\"[fd00:10:244:1::2]:80\", \"[fd00:10:244:1::1]:80\", \"[fd00:77::1]:80\"]\n";
    expect_errors(
        "svc6",
        &text,
        &[
            (
                23,
                "service \"web\": endpoint [fd00:10:244:1::2]:8080 is IPv6 but the Service has no IPv6 cluster_ip",
            ),
            (
                27,
                "service \"two\": cluster_ip[1] = \"fd00:10:96::12\" is a second IPv6 value after fd00:10:96::11",
            ),
            (
                32,
                "service \"in-pods\": cluster_ip = \"fd00:10:244:5::1\" is inside node.cluster_cidr fd00:10:244::/56",
            ),
            (
                34,
                "service \"in-pods\": endpoint [fd00:10:244:1::1]:80 is this node's own address",
            ),
            (
                34,
                "service \"in-pods\": endpoint [fd00:77::1]:80 is outside every connected subnet and route",
            ),
        ],
    );
    let text = format!(
        "{BASE6}\n[[neighbor]]\nip = \"fd00:172:19::3\"\nmac = \"02:00:00:00:00:03\"\ndev = \"eth0\"\n\n[[uplink]]\nname = \"eth1\"\naddress = \"172.19.0.2/24\"\n\n[[neighbor]]\nip = \"fe80::3\"\nmac = \"02:00:00:00:00:03\"\ndev = \"eth1\"\n"
    );
    expect_errors(
        "neigh6",
        &text,
        &[
            (
                26,
                "neighbor fd00:172:19::3: ip = \"fd00:172:19::3\" is not in eth0's IPv6 subnet fd00:172:18::/64",
            ),
            (37, "neighbor fe80::3: dev = \"eth1\" has no IPv6 address"),
        ],
    );
}

#[test]
fn snat_rules_of_both_families_and_a_family_mix_up() {
    // Valid: an IPv4 and an IPv6 rule (a dual-stack node), with and without `out`/`ports`.
    let dual = BASE
        .replace(
            "cluster_cidr = \"10.244.0.0/16\"",
            "cluster_cidr = [\"10.244.0.0/16\", \"fd00:10:244::/56\"]",
        )
        .replace(
            "address = \"172.18.0.2/24\"",
            "address = [\"172.18.0.2/24\", \"fd00:172:18::2/64\"]",
        );
    let ok = format!(
        "{dual}\n[[snat]]\nsrc = \"10.244.1.0/24\"\nto = \"172.18.0.50\"\nout = \"eth0\"\nports = \"5000-5999\"\n\n[[snat]]\nsrc = \"fd00:10:244:1::/64\"\nto = \"fd00:172:18::50\"\n"
    );
    let (o, _) = check_file("snat-ok.toml", &ok);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stderr.is_empty(), "{}", o.stderr);
    // BASE has 24 lines: the first [[snat]] starts on line 26.
    let text = format!(
        "{BASE}\n[[snat]]\nsrc = \"10.244.1.0/24\"\nto = \"fd00:172:18::50\"\n\n[[snat]]\nsrc = \"fd00:10:244:1::/64\"\nto = \"172.18.0.50\"\nout = \"eth0\"\n\n[[snat]]\nsrc = \"10.244.2.0/24\"\nto = \"172.18.0.51\"\nout = \"eth9\"\nports = \"6000-5000\"\n"
    );
    expect_errors(
        "snat",
        &text,
        &[
            (
                28,
                "snat from 10.244.1.0/24: to = \"fd00:172:18::50\" is an IPv6 address but src = \"10.244.1.0/24\" is IPv4",
            ),
            (
                32,
                "snat from fd00:10:244:1::/64: to = \"172.18.0.50\" is an IPv4 address but src = \"fd00:10:244:1::/64\" is IPv6",
            ),
            (39, "snat from 10.244.2.0/24: ports = \"6000-5000\" is not a port range"),
        ],
    );
    let (o, file) = check_file(
        "snat-out.toml",
        &format!(
            "{BASE}\n[[snat]]\nsrc = \"10.244.2.0/24\"\nto = \"172.18.0.51\"\nout = \"eth9\"\n"
        ),
    );
    assert_eq!(o.code, 1, "{}", o.stderr);
    let want = format!(
        "{file}:29: snat from 10.244.2.0/24: out = \"eth9\": no bridge or uplink is named \"eth9\""
    );
    assert!(
        o.stderr.contains(&want),
        "missing {want:?} in:\n{}",
        o.stderr
    );
}
