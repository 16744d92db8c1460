//! The connection table outlives `tapyard run` (issue 12, scenarios 3 and 4), end to end.
//!
//! ```text
//!  pod ns: 10.219.1.2 ── TAP ── bridge (gateway 10.219.1.1/24) ┐
//!                                                              ├ tapyard (root namespace)
//!  server ns: 10.220.0.1 ── uplink TAP ── 10.220.0.2/24 ───────┘
//! ```
//!
//! Service `web` (10.96.0.10:80) goes to a TCP server in the server namespace
//! (10.220.0.1:8080); Service `flood` (10.96.0.20:80) to six endpoints 10.220.0.99-104:8080,
//! where nobody answers, so that every SYN to it stays in the table; pod traffic leaving the
//! cluster CIDR is masqueraded (so each endpoint takes at most 64,512 connections: the
//! masquerade ports). The table is in `<state_dir>/conntrack`, state_dir on a tmpfs (/dev/shm).
//!
//! * [`kill_9_during_a_syn_flood`]: a raw-socket SYN flood from the pod (spoofed sources in
//!   its subnet) fills a 262,144-entry table; tapyard is killed with SIGKILL while it runs,
//!   then started again: its log says the table was reused after a crash with the
//!   connections kept, `show conntrack` lists them, a new connection through `web` works, and
//!   after a clean stop the file opened by the library passes the table's invariants. The
//!   times from the restart to the control socket answering and to the first connection
//!   through the node are printed (the TAPs are persistent and re-attached where they are).
//!   The flood is stopped by the test (SIGINT): the persistent TAP outlives the node.
//! * [`corrupted_state_file_is_refused_and_replaced`]: a truncated file, one of another
//!   format version and one of random bytes are each refused with a log line naming why, and
//!   the node forwards with a fresh table.
//!
//! Needs root, `ip` and `python3`; without them the tests print why and pass, except with
//! `CI=true`, where they fail. Names carry the process id; a guard kills the node and deletes
//! the namespaces and files on success and failure alike. Traffic goes only to addresses in
//! namespaces the test creates (10.219.1.x, 10.220.0.x) and to 10.220.0.99-104, which are
//! inside the server namespace's subnet and answered by nobody.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common;
use crate::common::*;

use tapyard::conntrack::{Conntrack, CtConfig, Opened};

const GW: &str = "10.219.1.1";
const POD: &str = "10.219.1.2";
const SERVER: &str = "10.220.0.1";
const UPLINK: &str = "10.220.0.2";
const WEB_VIP: &str = "10.96.0.10";
const FLOOD_VIP: &str = "10.96.0.20";
const FULL: usize = 262_144;

fn skip_reason() -> Option<String> {
    missing(&[("python3", "-V", "the server, client and SYN flood")])
}

fn skip_or_fail(test: &str) -> bool {
    common::skip_or_fail(test, skip_reason())
}

/// A SYN flood through a raw IP socket: `src_prefix dst dport seconds`: SYNs from
/// `<src_prefix>.10` .. `.17`, every source port, to `dst:dport`, until `seconds` pass, the
/// interface refuses them or SIGINT. Prints how many it sent. (The node's TAPs are
/// persistent: killing the node does not take the interface away, so the test stops it.)
const FLOOD_PY: &str = r#"
import socket, struct, sys, time
prefix, dst, dport, secs = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
dstb = socket.inet_aton(dst)
end = time.monotonic() + secs
sent = 0
try:
    while time.monotonic() < end:
        for host in range(10, 18):
            srcb = socket.inet_aton("%s.%d" % (prefix, host))
            ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 40, 0, 0, 64, 6, 0, srcb, dstb)
            for sport in range(1024, 65536):
                tcp = struct.pack("!HHIIBBHHH", sport, dport, sport * 7919, 0, 0x50, 0x02, 65535, 0, 0)
                s.sendto(ip + tcp, (dst, 0))
                sent += 1
            if time.monotonic() >= end:
                break
except (OSError, KeyboardInterrupt) as e:
    print("stopped: %r" % e, flush=True)
print("sent %d" % sent, flush=True)
"#;

/// Everything a test made; removed on drop, on success and failure alike.
struct Node {
    id: String,
    dir: PathBuf,
    state: PathBuf,
    socket: PathBuf,
    config: PathBuf,
    log: PathBuf,
    ns_pod: String,
    ns_srv: String,
    tap_pod: String,
    tap_up: String,
    node: Option<Child>,
    children: Vec<Child>,
    namespaces: Vec<String>,
    max_entries: usize,
    /// How many times the node was started (each start appends to the log).
    starts: usize,
}

impl Drop for Node {
    fn drop(&mut self) {
        let procs = self.children.iter_mut().chain(self.node.as_mut());
        tear_down(procs, &self.namespaces, &self.log, &self.dir);
        let _ = std::fs::remove_dir_all(&self.state);
    }
}

impl Node {
    fn new(test: &str, max_entries: usize) -> Node {
        let id = format!("{test}{}", std::process::id() % 100_000);
        let dir = std::env::temp_dir().join(format!("tapyard-restart-{id}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // The state on a tmpfs, as /run on a node.
        let shm = Path::new("/dev/shm");
        let state = if shm.is_dir() {
            shm.join(format!("tapyard-restart-{id}"))
        } else {
            dir.join("state")
        };
        let _ = std::fs::remove_dir_all(&state);
        let mut n = Node {
            socket: dir.join("ctl.sock"),
            config: dir.join("node.toml"),
            log: dir.join("run.log"),
            ns_pod: format!("ty-rp-{id}"),
            ns_srv: format!("ty-rs-{id}"),
            tap_pod: format!("tyrp{}", std::process::id() % 100_000),
            tap_up: format!("tyru{}", std::process::id() % 100_000),
            id,
            dir,
            state,
            node: None,
            children: Vec::new(),
            namespaces: Vec::new(),
            max_entries,
            starts: 0,
        };
        if test.starts_with('c') {
            // Two tests may run at once: different TAP names.
            n.tap_pod = format!("tycp{}", std::process::id() % 100_000);
            n.tap_up = format!("tycu{}", std::process::id() % 100_000);
        }
        for ns in [n.ns_pod.clone(), n.ns_srv.clone()] {
            run(&["ip", "netns", "add", &ns]);
            n.namespaces.push(ns);
        }
        std::fs::write(&n.config, n.config_text()).unwrap();
        n
    }

    fn config_text(&self) -> String {
        format!(
            r#"[node]
name = "restart-{id}"
cluster_cidr = "10.219.0.0/16"
socket = "{socket}"
state_dir = "{state}"
workers = 2

[[bridge]]
name = "tyb{id}"
address = "{GW}/24"
ports = ["{pod}"]

[[uplink]]
name = "{up}"
address = "{UPLINK}/24"

[masquerade]
out = "{up}"

[[service]]
name = "web"
cluster_ip = "{WEB_VIP}"
protocol = "tcp"
port = 80
endpoints = ["{SERVER}:8080"]

[[service]]
name = "flood"
cluster_ip = "{FLOOD_VIP}"
protocol = "tcp"
port = 80
endpoints = ["10.220.0.99:8080", "10.220.0.100:8080", "10.220.0.101:8080", "10.220.0.102:8080", "10.220.0.103:8080", "10.220.0.104:8080"]

[conntrack]
max_entries = {max}
"#,
            id = self.id.chars().rev().take(8).collect::<String>(),
            socket = self.socket.display(),
            state = self.state.display(),
            pod = self.tap_pod,
            up = self.tap_up,
            max = self.max_entries,
        )
    }

    fn table_file(&self) -> PathBuf {
        self.state.join("conntrack")
    }

    /// Starts `tapyard run` and waits for its control socket; returns how long that took.
    fn start(&mut self) -> Duration {
        let mut log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        self.starts += 1;
        writeln!(log, "---- start {} ----", self.starts).unwrap();
        let t = Instant::now();
        self.node = Some(
            Command::new(TAPYARD)
                .arg("run")
                .arg(&self.config)
                .env("RUST_LOG", "info")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("start tapyard run"),
        );
        wait_for_socket(self.node.as_mut(), &self.socket);
        t.elapsed()
    }

    /// Moves the node's TAPs into the pod and server namespaces and configures them, unless
    /// they are there already (persistent TAPs that a restarted node found again).
    fn plumb(&mut self) {
        let (pod, srv) = (self.ns_pod.clone(), self.ns_srv.clone());
        if !run_output(&["ip", "-n", &pod, "link", "show", &self.tap_pod])
            .status
            .success()
        {
            let t = &self.tap_pod;
            run(&["ip", "link", "set", t, "netns", &pod]);
            addr_add(&pod, &format!("{POD}/24"), t);
            run(&["ip", "-n", &pod, "link", "set", "lo", "up"]);
            run(&["ip", "-n", &pod, "link", "set", t, "up"]);
            run(&["ip", "-n", &pod, "route", "add", "default", "via", GW]);
        }
        if !run_output(&["ip", "-n", &srv, "link", "show", &self.tap_up])
            .status
            .success()
        {
            let t = &self.tap_up;
            run(&["ip", "link", "set", t, "netns", &srv]);
            addr_add(&srv, &format!("{SERVER}/24"), t);
            run(&["ip", "-n", &srv, "link", "set", "lo", "up"]);
            run(&["ip", "-n", &srv, "link", "set", t, "up"]);
            run(&[
                "ip",
                "-n",
                &srv,
                "route",
                "add",
                "10.219.0.0/16",
                "via",
                UPLINK,
            ]);
        }
    }

    fn start_server(&mut self) {
        let srv = self.ns_srv.clone();
        spawn_in(
            &mut self.children,
            &srv,
            &["python3", "-c", SERVER_PY, "server", "8080", "0"],
        );
        wait_listening(&srv, 8080);
    }

    /// One TCP exchange through `web`, retried for up to `within` (the node may still be
    /// learning the pod's MAC): the server's ident.
    fn web_works(&self, within: Duration) -> Duration {
        let t = Instant::now();
        loop {
            let out = run_output(&[
                "ip",
                "netns",
                "exec",
                &self.ns_pod,
                "python3",
                "-c",
                CLIENT_PY,
                "tcp",
                WEB_VIP,
                "80",
                "1",
            ]);
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            if text.starts_with("server ") {
                // Masqueraded: the server sees the node's uplink address.
                assert_eq!(text.trim(), format!("server {UPLINK}"));
                return t.elapsed();
            }
            assert!(t.elapsed() < within, "no connection through web: {text}");
        }
    }

    fn kill_9(&mut self) {
        let mut c = self.node.take().unwrap();
        c.kill().unwrap();
        c.wait().unwrap();
    }

    /// SIGTERM, and the node's exit status.
    fn stop(&mut self) {
        let mut c = self.node.take().unwrap();
        run(&["kill", "-TERM", &c.id().to_string()]);
        let st = c.wait().unwrap();
        assert!(st.success(), "tapyard run exited with {st}");
    }

    /// The `conntrack:` lines the latest start logged.
    fn conntrack_log(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap();
        let last = log
            .rsplit(&format!("---- start {} ----", self.starts))
            .next()
            .unwrap_or_default();
        last.lines()
            .filter(|l| l.contains("conntrack:"))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The connections in the table (`connections` on the `nat:` line of `show stats`).
    fn entries(&self) -> usize {
        let out = tapyard_ok_at(&self.socket, &["show", "stats"]);
        out.lines()
            .filter(|l| l.starts_with("nat:"))
            .find_map(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                let i = w.iter().position(|x| *x == "connections")?;
                w.get(i + 1)?.parse().ok()
            })
            .unwrap_or_else(|| panic!("no connections count in show stats:\n{out}"))
    }
}

/// "kept N connections" in a log line.
fn kept_in(log: &str) -> usize {
    let i = log
        .find(" connections kept")
        .unwrap_or_else(|| panic!("{log}"));
    log[..i]
        .rsplit(' ')
        .next()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{log}"))
}

#[test]
#[cfg_attr(
    not(tapyard_root),
    ignore = "needs root: TAP devices and network namespaces (runs as root, as in CI)"
)]
fn kill_9_during_a_syn_flood() {
    if skip_or_fail("kill_9_during_a_syn_flood") {
        return;
    }
    let mut n = Node::new("k", FULL);
    n.start();
    assert!(
        n.conntrack_log().contains("new connection table"),
        "{}",
        n.conntrack_log()
    );
    n.plumb();
    n.start_server();
    n.web_works(Duration::from_secs(10));

    // The flood, until the table is full.
    let flood = Command::new("ip")
        .args(["netns", "exec", &n.ns_pod, "python3", "-c", FLOOD_PY])
        .args(["10.219.1", FLOOD_VIP, "80", "120"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    n.children.push(flood);
    let t = Instant::now();
    let mut entries = 0;
    while t.elapsed() < Duration::from_secs(100) {
        entries = n.entries();
        if entries >= FULL {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    println!(
        "flood: {entries} connections after {:.1} s",
        t.elapsed().as_secs_f64()
    );
    assert_eq!(entries, FULL, "the flood did not fill the table");
    // A little more flooding (early drops, inserts in flight), then SIGKILL mid-flood.
    std::thread::sleep(Duration::from_millis(300));
    n.kill_9();
    let flood = n.children.pop().unwrap();
    run(&["kill", "-INT", &flood.id().to_string()]);
    let out = wait_output(flood, Duration::from_secs(20), "flood");
    println!("flood: {}", String::from_utf8_lossy(&out.stdout).trim());

    // The restart.
    let to_socket = n.start();
    let log = n.conntrack_log();
    println!("{log}");
    assert!(log.contains("reused after a crash"), "{log}");
    let kept = kept_in(&log);
    assert!(kept > FULL * 9 / 10, "kept {kept} of {FULL}: {log}");
    n.plumb();
    let to_forwarding = to_socket + n.web_works(Duration::from_secs(10));
    println!(
        "restart with a full table ({kept} connections): control socket after {:.0} ms, \
         first connection through the node after {:.0} ms (the TAPs re-plumbed by the test \
         included)",
        to_socket.as_secs_f64() * 1000.0,
        to_forwarding.as_secs_f64() * 1000.0
    );
    // `show conntrack` lists the kept connections and the new one.
    // Into a file: the output is megabytes, more than a pipe holds while `wait_output` waits.
    let t = Instant::now();
    let listing = n.dir.join("conntrack.txt");
    let child = Command::new(TAPYARD)
        .args(["show", "conntrack", "--socket"])
        .arg(&n.socket)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&listing).unwrap())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = wait_output(child, Duration::from_secs(60), "tapyard show conntrack");
    assert!(out.status.success(), "{out:?}");
    let shown = std::fs::read_to_string(&listing).unwrap();
    let flood_rows = shown.lines().filter(|l| l.contains(FLOOD_VIP)).count();
    println!(
        "show conntrack: {} lines in {:.0} ms",
        shown.lines().count(),
        t.elapsed().as_secs_f64() * 1000.0
    );
    assert!(
        flood_rows + 8 >= kept.min(FULL - 8),
        "{flood_rows} flood rows, {kept} kept"
    );
    assert!(
        shown
            .lines()
            .any(|l| l.contains(&format!("dst={WEB_VIP}")) && l.contains(&format!("src={SERVER}"))),
        "the new connection through web is listed"
    );
    // New connections through the full table (early drop of unassured flood entries).
    for _ in 0..3 {
        n.web_works(Duration::from_secs(5));
    }

    // A clean stop, then the library opens the file: consistent, and detached cleanly.
    n.stop();
    let cfg = CtConfig {
        max_entries: FULL,
        ..CtConfig::default()
    };
    let (ct, rec) = Conntrack::open_file(cfg, &n.table_file(), tapyard::Clock::new().now())
        .expect("open the table file");
    assert_eq!(rec.opened, Opened::Reused, "{rec}");
    assert!(rec.clean, "{rec}");
    assert_eq!(rec.invalid + rec.duplicates, 0, "{rec}");
    ct.check_invariants().expect("the table's invariants");
    assert!(ct.len() > FULL * 9 / 10, "{rec}");
    println!("after a clean stop: {rec}");
}

/// (what, how to do it to the file, what the log must say).
type Corruption<'a> = (&'a str, &'a dyn Fn(&Path), &'a str);

#[test]
#[cfg_attr(
    not(tapyard_root),
    ignore = "needs root: TAP devices and network namespaces (runs as root, as in CI)"
)]
fn corrupted_state_file_is_refused_and_replaced() {
    if skip_or_fail("corrupted_state_file_is_refused_and_replaced") {
        return;
    }
    let mut n = Node::new("c", 4096);
    n.start();
    n.plumb();
    n.start_server();
    n.web_works(Duration::from_secs(10));
    // An IPv4-only node: its IPv6 table is the minimal one (it routes no IPv6), and `show
    // conntrack` lists the IPv4 connections all the same.
    let log = std::fs::read_to_string(&n.log).unwrap();
    assert!(
        log.contains("conntrack6: at most 64 IPv6 connections"),
        "{log}"
    );
    let shown = tapyard_ok_at(&n.socket, &["show", "conntrack"]);
    assert!(
        shown.lines().any(|l| l.contains(&format!("dst={WEB_VIP}"))),
        "{shown}"
    );
    let file = n.table_file();
    let corruptions: [Corruption; 3] = [
        (
            "truncated",
            &|p| {
                let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
                let len = f.metadata().unwrap().len();
                f.set_len(len / 3).unwrap();
            },
            "refused (file length",
        ),
        (
            "wrong version",
            &|p| {
                use std::os::unix::fs::FileExt;
                let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
                f.write_all_at(&99u64.to_le_bytes(), 8).unwrap();
            },
            "refused (format version 99, this build reads 1)",
        ),
        (
            "random bytes",
            &|p| {
                let len = usize::try_from(std::fs::metadata(p).unwrap().len()).unwrap();
                let mut x = 0x2545_f491_4f6c_dd1du64;
                let bytes: Vec<u8> = (0..len)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        x.to_le_bytes()[3]
                    })
                    .collect();
                std::fs::write(p, bytes).unwrap();
            },
            "refused (magic",
        ),
    ];
    for (what, corrupt, want) in corruptions {
        n.stop();
        corrupt(&file);
        n.start();
        let log = n.conntrack_log();
        println!("{what}: {log}");
        assert!(
            log.contains(want) && log.contains("new table"),
            "{what}: {log}"
        );
        assert!(log.contains("WARN"), "{what}: logged as a warning: {log}");
        n.plumb();
        n.web_works(Duration::from_secs(10));
        let shown = tapyard_ok_at(&n.socket, &["show", "conntrack"]);
        assert!(
            shown.lines().any(|l| l.contains(&format!("dst={WEB_VIP}"))),
            "{what}: {shown}"
        );
    }
}
