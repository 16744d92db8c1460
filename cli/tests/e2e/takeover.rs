//! End-to-end test of `tapyard run --takeover`: an upgrade while traffic flows.
//!
//! ```text
//!  pod-a 10.219.1.2 ── TAP ─┐
//!  pod-b 10.219.1.3 ── TAP ─┼ bridge (gateway 10.219.1.1/24), tapyard in the test's namespace
//!  a `port add` TAP ────────┘ (left in tapyard's namespace)
//! ```
//!
//! Checked: an iperf3 TCP stream from pod-a to a ClusterIP Service (DNAT'd to pod-b) runs
//! across a `--takeover` and completes with exit 0, its connection still in `show conntrack`
//! (the table is handed over), and so does an IPv6 stream beside it to the Service's IPv6
//! ClusterIP (the node is dual-stack: the IPv6 table, `<conntrack>6`, is handed over too); the old process exits 0; the control socket answers afterwards and `show
//! ports` lists the same ports (name, origin, bridge, MAC); a second takeover works too, with
//! a UDP stream at a fixed rate across it whose loss is printed (the frames lost during a
//! takeover) with the handover time from both processes' logs; a third one with a port taken
//! out of the file deletes that port's TAP; a `--takeover` for another
//! node name is refused (exit 2), and one that fails or dies after the old process paused and
//! sent its descriptors leaves the old one forwarding and answering with the same ports.
//!
//! Needs root, `ip`, `ping`, `iperf3`; without them the test prints why and passes, except
//! with `CI=true`, where it fails. Names carry the process id; a guard kills every tapyard
//! and iperf3 it started, deletes the namespaces and the TAP it added, on success and failure
//! alike. Traffic goes only to addresses in namespaces the test creates (10.219.1.x,
//! fd00:219:1::x).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common;
use crate::common::*;

const POD_A: &str = "10.219.1.2";
const POD_B: &str = "10.219.1.3";
const GW: &str = "10.219.1.1";
/// A ClusterIP Service whose endpoint is pod-b's iperf3: the stream is DNAT'd, so it lives
/// only if the connection table survives the takeover.
const VIP: &str = "10.96.0.30";
const POD_A6: &str = "fd00:219:1::2";
const POD_B6: &str = "fd00:219:1::3";
const GW6: &str = "fd00:219:1::1";
/// The Service's IPv6 ClusterIP, DNAT'd to pod-b's second iperf3 (port 5202): an IPv6 stream
/// lives across a takeover only if the IPv6 connection table survives it.
const VIP6: &str = "fd00:96::30";

fn skip_reason() -> Option<String> {
    missing(&[
        ("ip", "-V", "iproute2"),
        ("ping", "-V", "iputils"),
        ("iperf3", "--version", "iperf3"),
    ])
}

fn skip_or_fail() -> bool {
    common::skip_or_fail("takeover", skip_reason())
}

struct Names {
    bridge: String,
    tap_a: String,
    tap_b: String,
    extra: String,
    ns_a: String,
    ns_b: String,
    socket: PathBuf,
    config: PathBuf,
    state: PathBuf,
}

impl Names {
    fn new(dir: &Path) -> Names {
        let id = std::process::id() % 100_000;
        Names {
            bridge: format!("tkc{id}"),
            tap_a: format!("tka{id}"),
            tap_b: format!("tkb{id}"),
            extra: format!("tkx{id}"),
            ns_a: format!("ty-tka-{id}"),
            ns_b: format!("ty-tkb-{id}"),
            socket: dir.join("ctl.sock"),
            config: dir.join("node.toml"),
            state: dir.join("state"),
        }
    }

    fn config(&self, node: &str) -> String {
        format!(
            r#"{node}
[[bridge]]
name = "{bridge}"
address = ["{GW}/24", "{GW6}/64"]
ports = ["{a}", "{b}"]

[[service]]
name = "bulk"
cluster_ip = ["{VIP}", "{VIP6}"]
protocol = "tcp"
port = 5201
endpoints = ["{POD_B}:5201", "[{POD_B6}]:5202"]
"#,
            node = node_toml(
                node,
                r#"["10.219.0.0/16", "fd00:219::/56"]"#,
                &self.socket,
                Some(&self.state),
            ),
            bridge = self.bridge,
            a = self.tap_a,
            b = self.tap_b,
        )
    }
}

/// Starts `tapyard run CONFIG [ARGS]`, its stderr in `log`.
fn start(g: &mut Guard, config: &Path, args: &[&str], log: &str) -> usize {
    start_failing(g, config, args, log, "")
}

/// [`start`] with `TAPYARD_TEST_FAILPOINT` set to `failpoint` (debug builds only).
fn start_failing(g: &mut Guard, config: &Path, args: &[&str], log: &str, failpoint: &str) -> usize {
    let log = g.dir.join(log);
    let child = tapyard_run(None, config, args, &log)
        .env("TAPYARD_TEST_FAILPOINT", failpoint)
        .spawn()
        .expect("start tapyard run");
    g.logs.push(log);
    g.children.push(child);
    g.children.len() - 1
}

/// Waits for process `i` to exit (at most `secs`); its status.
fn wait_exit(g: &mut Guard, i: usize, secs: u64) -> std::process::ExitStatus {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(st) = g.children[i].try_wait().unwrap() {
            return st;
        }
        assert!(
            Instant::now() < deadline,
            "process {i} did not exit within {secs} s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn attach_pod(ns: &str, tap: &str, addr: &str, addr6: &str) {
    let cidrs = [format!("{addr}/24"), format!("{addr6}/64")];
    ns_named(ns).attach(None, tap, &[&cidrs[0], &cidrs[1]], &[GW, GW6]);
}

/// `show ports --json`, reduced to what must not change: name, origin, bridge, MAC.
fn ports(n: &Names) -> Vec<(String, String, String, String)> {
    let out = tapyard_ok_at(&n.socket, &["show", "ports", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let s = |p: &serde_json::Value, k: &str| p[k].as_str().unwrap_or("-").to_string();
    let mut l: Vec<_> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (s(p, "name"), s(p, "origin"), s(p, "bridge"), s(p, "mac")))
        .collect();
    l.sort();
    l
}

/// The `ports` of the node's port record (`<state_dir>/ports.json`), by name.
fn recorded(n: &Names) -> Vec<serde_json::Value> {
    let path = n.state.join("ports.json");
    let t = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let v: serde_json::Value = serde_json::from_str(&t).unwrap();
    let mut p = v["ports"].as_array().cloned().unwrap_or_default();
    p.sort_by_key(|p| p["name"].as_str().unwrap_or_default().to_string());
    p
}

/// Starts an iperf3 client in `ns` with `args`, its JSON report in `out`.
fn iperf3(g: &mut Guard, ns: &str, args: &[&str], out: &Path) -> usize {
    let f = std::fs::File::create(out).unwrap();
    let child = Command::new("ip")
        .args(["netns", "exec", ns, "iperf3", "-J"])
        .args(args)
        .stdin(Stdio::null())
        .stdout(f)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    g.children.push(child);
    g.children.len() - 1
}

fn report(path: &Path) -> serde_json::Value {
    let t = std::fs::read_to_string(path).unwrap();
    serde_json::from_str(&t).unwrap_or_else(|e| panic!("iperf3 report {e}: {t}"))
}

/// The first number after `key` in the log's line that contains `line`.
fn logged_ms(log: &Path, line: &str, key: &str) -> f64 {
    let t = std::fs::read_to_string(log).unwrap();
    let l = t
        .lines()
        .find(|l| l.contains(line))
        .unwrap_or_else(|| panic!("{} has no line with {line:?}:\n{t}", log.display()));
    let rest = &l[l.find(key).unwrap_or_else(|| panic!("{l}")) + key.len()..];
    let num: String = rest
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    num.parse()
        .unwrap_or_else(|_| panic!("no number after {key:?} in {l}"))
}

#[test]
#[cfg_attr(
    not(tapyard_root),
    ignore = "needs root: TAP devices and network namespaces (runs as root, as in CI)"
)]
fn takeover_keeps_a_tcp_stream_and_the_ports() {
    if skip_or_fail() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("tapyard-takeover-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let n = Names::new(&dir);
    // Every tapyard it starts goes into `children`, its log into `logs`.
    let mut g = Guard::new(&dir, &dir.join("run1.log"));
    g.logs.clear();
    g.links.push(n.extra.clone());
    let node = format!("tko{}", std::process::id() % 100_000);
    std::fs::write(&n.config, n.config(&node)).unwrap();
    let first = start(&mut g, &n.config, &[], "run1.log");
    wait_for_socket(Some(&mut g.children[first]), &n.socket);
    for ns in [&n.ns_a, &n.ns_b] {
        g.ns(ns);
    }
    attach_pod(&n.ns_a, &n.tap_a, POD_A, POD_A6);
    attach_pod(&n.ns_b, &n.tap_b, POD_B, POD_B6);
    tapyard_ok_at(&n.socket, &["port", "add", &n.bridge, &n.extra]);
    ping_ok(&n.ns_a, POD_B);
    ping_ok(&n.ns_a, GW);
    ping_ok(&n.ns_a, POD_B6);
    ping_ok(&n.ns_a, GW6);
    let before = ports(&n);
    assert_eq!(before.len(), 3, "{before:?}");
    let record = recorded(&n);
    assert_eq!(record.len(), 3, "{record:?}");

    // Another node's name: refused before anything stops; the node goes on.
    let other = dir.join("other.toml");
    std::fs::write(&other, n.config("someone-else")).unwrap();
    let out = run_output(&[TAPYARD, "run", &other.display().to_string(), "--takeover"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("node name \"someone-else\""), "{err}");
    assert!(err.contains("goes on forwarding"), "{err}");
    ping_ok(&n.ns_a, POD_B);
    assert_eq!(ports(&n), before);

    // `tapyard cleanup` of a config whose socket is not the one the node serves (it was
    // started with `--socket`, or the file changed): refused all the same, nothing deleted.
    let elsewhere = dir.join("elsewhere.toml");
    let moved = n.config(&node).replace(
        &n.socket.display().to_string(),
        &dir.join("nobody.sock").display().to_string(),
    );
    std::fs::write(&elsewhere, moved).unwrap();
    let out = run_output(&[TAPYARD, "cleanup", &elsewhere.display().to_string()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("nothing deleted"), "{err}");
    assert!(n.state.join("ports.json").exists());
    ping_ok(&n.ns_a, POD_B);
    assert_eq!(ports(&n), before);

    // The new process fails (or dies) once the old one paused and sent the descriptors,
    // or once it mapped the connection table and forwarded: the old one takes the table
    // back, resumes forwarding and serving, as if nothing happened. (The failure points
    // exist in debug builds only.)
    let failures = [
        ("takeover-new-after-fds=abort", Some(2)),
        ("takeover-new-after-fds=exit", Some(3)),
        ("takeover-new-after-start=abort", Some(2)),
    ];
    if cfg!(debug_assertions) {
        for (how, code) in failures {
            let log = dir.join(format!("failed-{how}.log"));
            let out = Command::new(TAPYARD)
                .arg("run")
                .arg(&n.config)
                .arg("--takeover")
                .env("TAPYARD_TEST_FAILPOINT", how)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .unwrap();
            let st = wait_output(out, CMD_TIMEOUT, "tapyard run --takeover (failing)").status;
            let err = std::fs::read_to_string(&log).unwrap();
            assert_eq!(st.code(), code, "{how}: {err}");
            if how.ends_with("abort") {
                assert!(err.contains("failing on purpose"), "{err}");
                assert!(err.contains("goes on forwarding"), "{err}");
            }
            assert!(
                g.children[first].try_wait().unwrap().is_none(),
                "the old process exited after a failed takeover ({how})"
            );
            ping_ok(&n.ns_a, POD_B);
            ping_ok(&n.ns_a, GW);
            assert_eq!(ports(&n), before);
            assert_eq!(recorded(&n), record, "{how}");
        }
        let t = std::fs::read_to_string(&g.logs[0]).unwrap();
        assert_eq!(
            t.matches("takeover failed, forwarding goes on here")
                .count(),
            4,
            "{t}"
        );
        // Each failure after the descriptors were sent: the table is taken back.
        assert_eq!(
            t.matches("takeover: connection table taken back").count(),
            3,
            "{t}"
        );
    } else {
        println!("release build: no failure points, the failed takeovers are not tried");
    }

    spawn_in(&mut g.children, &n.ns_b, &["iperf3", "-s", "-p", "5201"]);
    spawn_in(&mut g.children, &n.ns_b, &["iperf3", "-s", "-p", "5202"]);
    wait_listening(&n.ns_b, 5201);
    wait_listening(&n.ns_b, 5202);

    // Takeover 1, under two 8 s TCP streams through the ClusterIPs, one per family.
    let tcp_out = dir.join("tcp.json");
    let tcp = iperf3(
        &mut g,
        &n.ns_a,
        &["-c", VIP, "-p", "5201", "-t", "8"],
        &tcp_out,
    );
    let tcp6_out = dir.join("tcp6.json");
    let tcp6 = iperf3(
        &mut g,
        &n.ns_a,
        &["-6", "-c", VIP6, "-p", "5201", "-t", "8"],
        &tcp6_out,
    );
    std::thread::sleep(Duration::from_secs(2));
    let ct = tapyard_ok_at(&n.socket, &["show", "conntrack"]);
    assert!(
        ct.contains(&format!("dst={VIP6}")) && ct.contains(&format!("src={POD_B6}")),
        "{ct}\niperf3 -6: {}",
        std::fs::read_to_string(&tcp6_out).unwrap_or_default(),
    );
    assert!(
        ct.contains(&format!("dst={VIP}")),
        "{ct}\niperf3: {}\n{}\n{}",
        std::fs::read_to_string(&tcp_out).unwrap_or_default(),
        tapyard_ok_at(&n.socket, &["show", "stats"]),
        run(&["ip", "netns", "exec", &n.ns_a, "ss", "-tn"])
    );
    let second = start(&mut g, &n.config, &["--takeover"], "run2.log");
    let st = wait_exit(&mut g, first, 20);
    assert!(st.success(), "the old process exited with {st}");
    assert!(
        g.children[second].try_wait().unwrap().is_none(),
        "the new process is not running"
    );
    for (family, proc, out) in [("IPv4", tcp, &tcp_out), ("IPv6", tcp6, &tcp6_out)] {
        let st = wait_exit(&mut g, proc, 20);
        assert!(
            st.success(),
            "{family} iperf3 failed across the takeover: {st}"
        );
        let r = report(out);
        assert!(r.get("error").is_none(), "{family} iperf3: {}", r["error"]);
        let secs = r["end"]["sum_received"]["seconds"].as_f64().unwrap_or(0.0);
        let bytes = r["end"]["sum_received"]["bytes"].as_f64().unwrap_or(0.0);
        let retrans = r["end"]["sum_sent"]["retransmits"].as_u64().unwrap_or(0);
        assert!(secs >= 7.5, "the {family} stream stopped early: {secs} s");
        assert!(bytes > 0.0);
        println!(
            "takeover 1 under TCP ({family}): {:.0} Mbit/s over {secs:.1} s, {retrans} retransmits",
            bytes * 8.0 / secs / 1e6
        );
    }
    wait_for_socket(Some(&mut g.children[second]), &n.socket);
    assert_eq!(ports(&n), before, "show ports changed across the takeover");
    assert_eq!(
        recorded(&n),
        record,
        "the port record changed across the takeover"
    );
    let ct = tapyard_ok_at(&n.socket, &["show", "conntrack"]);
    assert!(
        ct.contains(&format!("dst={VIP}")),
        "the connection was lost: {ct}"
    );
    assert!(
        ct.contains(&format!("dst={VIP6}")),
        "the IPv6 connection was lost: {ct}"
    );
    ping_ok(&n.ns_a, POD_B);
    ping_ok(&n.ns_a, POD_B6);
    ping_ok(&n.ns_a, GW);
    let log1 = g.logs[0].clone();
    let log2 = g.logs[1].clone();
    let t = std::fs::read_to_string(&log1).unwrap();
    assert!(t.contains("handed over to pid"), "{t}");

    // Takeover 2, under a UDP stream at a fixed rate (5000 datagrams/s): its loss against
    // the same stream without a takeover is the takeover's.
    let udp_args = [
        "-c", POD_B, "-p", "5201", "-u", "-b", "40M", "-l", "1000", "-t", "5",
    ];
    let base_out = dir.join("udp-base.json");
    let base = iperf3(&mut g, &n.ns_a, &udp_args, &base_out);
    assert!(wait_exit(&mut g, base, 20).success());
    let lost_of = |r: &serde_json::Value| {
        let sum = &r["end"]["sum"];
        (
            sum["lost_packets"].as_u64().unwrap_or(0),
            sum["packets"].as_u64().unwrap_or(0),
        )
    };
    let (base_lost, base_total) = lost_of(&report(&base_out));
    let udp_out = dir.join("udp.json");
    let rate_pps = 5000;
    let udp = iperf3(&mut g, &n.ns_a, &udp_args, &udp_out);
    std::thread::sleep(Duration::from_secs(2));
    let third = start(&mut g, &n.config, &["--takeover"], "run3.log");
    let st = wait_exit(&mut g, second, 20);
    assert!(st.success(), "the second process exited with {st}");
    let st = wait_exit(&mut g, udp, 20);
    assert!(st.success(), "iperf3 -u failed across the takeover: {st}");
    let r = report(&udp_out);
    let (lost, total) = lost_of(&r);
    assert!(total > 0, "{r}");
    wait_for_socket(Some(&mut g.children[third]), &n.socket);
    assert_eq!(
        ports(&n),
        before,
        "show ports changed across the second takeover"
    );
    assert_eq!(recorded(&n), record);
    ping_ok(&n.ns_a, POD_B);
    let paused = logged_ms(&log2, "handed over to pid", "paused");
    let adopted = logged_ms(&g.logs[2], "took over:", "forwarding");
    let whole = logged_ms(&g.logs[2], "took over from pid", "in");
    println!(
        "takeover 2 under UDP at ~{rate_pps} packets/s: {lost} of {total} datagrams lost (without a takeover: {base_lost} of {base_total}); old workers paused {paused:.1} ms until the ack, new forwarding {adopted:.1} ms after the descriptors arrived, whole handshake {whole:.0} ms"
    );
    let _ = log1;

    // Takeover 3 with pod-b's port taken out of the file: not taken over, and its TAP is
    // deleted once the old process is gone, as a reload would.
    let without_b = n.config(&node).replace(&format!(", \"{}\"", n.tap_b), "");
    assert_ne!(without_b, n.config(&node));
    std::fs::write(&n.config, without_b).unwrap();
    let fourth = start(&mut g, &n.config, &["--takeover"], "run4.log");
    let st = wait_exit(&mut g, third, 20);
    assert!(st.success(), "the third process exited with {st}");
    wait_for_socket(Some(&mut g.children[fourth]), &n.socket);
    let left: Vec<String> = ports(&n).into_iter().map(|p| p.0).collect();
    assert!(!left.contains(&n.tap_b), "{left:?}");
    assert_eq!(left.len(), 2, "{left:?}");
    let deadline = Instant::now() + Duration::from_secs(5);
    while run_output(&["ip", "-n", &n.ns_b, "link", "show", &n.tap_b])
        .status
        .success()
    {
        assert!(Instant::now() < deadline, "pod-b's TAP was not deleted");
        std::thread::sleep(Duration::from_millis(50));
    }
    ping_ok(&n.ns_a, GW);

    // The old process dies once it has sent the descriptors (before the ack): the new one,
    // holding them all, goes on with the node instead of stopping it too.
    let last = if cfg!(debug_assertions) {
        let pid = g.children[fourth].id().to_string();
        run(&["kill", "-TERM", &pid]);
        assert!(wait_exit(&mut g, fourth, 10).success());
        let fifth = start_failing(
            &mut g,
            &n.config,
            &[],
            "run5.log",
            "takeover-old-after-handover=exit",
        );
        wait_for_socket(Some(&mut g.children[fifth]), &n.socket);
        ping_ok(&n.ns_a, GW);
        let sixth = start(&mut g, &n.config, &["--takeover"], "run6.log");
        let st = wait_exit(&mut g, fifth, 20);
        assert_eq!(st.code(), Some(137), "the old process exited with {st}");
        wait_for_socket(Some(&mut g.children[sixth]), &n.socket);
        let t = std::fs::read_to_string(g.logs.last().unwrap()).unwrap();
        assert!(t.contains("it died after handing over"), "{t}");
        ping_ok(&n.ns_a, GW);
        let left: Vec<String> = ports(&n).into_iter().map(|p| p.0).collect();
        assert_eq!(left.len(), 2, "{left:?}");
        sixth
    } else {
        fourth
    };

    // A clean stop of the last one: exit 0, its socket files removed.
    let pid = g.children[last].id().to_string();
    run(&["kill", "-TERM", &pid]);
    let st = wait_exit(&mut g, last, 10);
    assert!(st.success(), "{st}");
    assert!(!n.socket.exists(), "the control socket was left behind");
    assert!(!n.state.join("takeover.sock").exists());
}
