//! End-to-end test of the per-pod connection limit (`[conntrack] max_per_source`): one pod
//! holds its limit of TCP connections open and its next one is refused, while another pod's
//! new connection goes through; when the first pod closes one of its connections it opens
//! another at once (a closed connection stops counting as it closes, as Linux's
//! nf_conncount, not when it expires), and once all are closed it connects again at once.
//!
//! ```text
//!  pod-a 10.223.1.2 ─ TAP ─┐
//!  pod-b 10.223.1.3 ─ TAP ─┴ bridge (gw 10.223.1.1/24) ┐ tapyard node (own ns)
//!  server ns: 10.224.0.1 ── uplink TAP (10.224.0.2/24) ┘ pods masqueraded to it
//! ```
//!
//! Needs root, `ip` and `python3`; without them it says why and passes, except with
//! `CI=true`, where it fails. Names carry the process id; a guard kills the node and deletes
//! the namespaces on success and failure alike. Traffic goes only to addresses inside the
//! namespaces the test creates.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;

const GW: &str = "10.223.1.1";
const POD_A: &str = "10.223.1.2";
const POD_B: &str = "10.223.1.3";
const UPLINK: &str = "10.224.0.2";
const SERVER: &str = "10.224.0.1";
const PORT: u16 = 8080;
/// The limit: connections pod A may hold.
const LIMIT: usize = 20;

/// A TCP server on `argv[1]` that greets each connection with `hi`, keeps it open and closes
/// it when the client does.
const HOLD_SERVER_PY: &str = r#"
import selectors, socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1])))
s.listen(512)
sel = selectors.DefaultSelector()
sel.register(s, selectors.EVENT_READ)
while True:
    for key, _ in sel.select():
        if key.fileobj is s:
            c, p = s.accept()
            try:
                c.sendall(b"hi\n")
                sel.register(c, selectors.EVENT_READ)
            except OSError:
                c.close()
        else:
            try:
                d = key.fileobj.recv(256)
            except OSError:
                d = b""
            if not d:
                sel.unregister(key.fileobj)
                key.fileobj.close()
"#;

/// `addr port n`: opens `n` connections and keeps them (each greeted), prints `held n`,
/// tries one more (3 s) and prints `extra connected` or `extra refused <why>`; at a line on
/// its standard input closes one and opens another, printing `reopened connected` or
/// `reopened refused <why>`; closes them all when its standard input closes, then prints
/// `closed`.
const HOLD_CLIENT_PY: &str = r#"
import socket, sys, time
addr, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
held = []
for i in range(n):
    c = socket.create_connection((addr, port), timeout=10)
    c.settimeout(10)
    if not c.recv(16).startswith(b"hi"):
        raise SystemExit("no greeting")
    held.append(c)
print("held %d" % len(held), flush=True)
try:
    socket.create_connection((addr, port), timeout=3)
    print("extra connected", flush=True)
except OSError as e:
    print("extra refused %s" % e, flush=True)
sys.stdin.readline()
held.pop().close()
time.sleep(0.3)
try:
    c = socket.create_connection((addr, port), timeout=3)
    c.settimeout(10)
    if not c.recv(16).startswith(b"hi"):
        raise SystemExit("no greeting")
    held.append(c)
    print("reopened connected", flush=True)
except OSError as e:
    print("reopened refused %s" % e, flush=True)
sys.stdin.readline()
for c in held:
    c.close()
print("closed", flush=True)
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
    ns_srv: String,
    dir: PathBuf,
    socket: PathBuf,
    config: PathBuf,
    log: PathBuf,
}

impl Names {
    fn new() -> Names {
        let id = std::process::id() % 100_000;
        let dir = std::env::temp_dir().join(format!("tapyard-ctlimit-{id}"));
        Names {
            id,
            tap_a: format!("tla{id}"),
            tap_b: format!("tlb{id}"),
            uplink: format!("tlu{id}"),
            ns_node: format!("tl-node-{id}"),
            ns_a: format!("tl-a-{id}"),
            ns_b: format!("tl-b-{id}"),
            ns_srv: format!("tl-srv-{id}"),
            socket: dir.join("ctl.sock"),
            config: dir.join("node.toml"),
            log: dir.join("run.log"),
            dir,
        }
    }

    fn config(&self) -> String {
        format!(
            r#"{node}
[[bridge]]
name = "tlc{id}"
address = "{GW}/24"
ports = ["{a}", "{b}"]

[[uplink]]
name = "{up}"
address = "{UPLINK}/24"

[masquerade]
out = "{up}"

[conntrack]
max_per_source = {LIMIT}
tcp_time_wait_timeout = 2
"#,
            node = node_toml(
                &format!("ctlimit-{}", self.id),
                r#""10.223.0.0/16""#,
                &self.socket,
                Some(&self.dir.join("state")),
            ),
            id = self.id,
            a = self.tap_a,
            b = self.tap_b,
            up = self.uplink,
        )
    }

    fn ct_limit_drops(&self) -> u64 {
        let out = tapyard_ok_at(&self.socket, &["show", "stats", "--json"]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v["drops"]["ct_limit"].as_u64().unwrap_or(0)
    }
}

#[test]
#[cfg_attr(
    not(tapyard_root),
    ignore = "needs root: TAP devices and network namespaces (runs as root, as in CI)"
)]
fn a_pod_at_its_connection_limit_does_not_starve_another() {
    if skip_or_fail("ct_limit", skip_reason()) {
        return;
    }
    let n = Names::new();
    let _ = std::fs::remove_dir_all(&n.dir);
    std::fs::create_dir_all(&n.dir).unwrap();
    std::fs::write(&n.config, n.config()).unwrap();
    // `check` names a bad value of the key.
    let bad = n.dir.join("bad.toml");
    std::fs::write(
        &bad,
        n.config()
            .replace(&format!("max_per_source = {LIMIT}"), "max_per_source = -1"),
    )
    .unwrap();
    let out = run_output(&[TAPYARD, "check", &bad.display().to_string()]);
    let text =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert!(
        !out.status.success() && text.contains("max_per_source") && text.contains("-1"),
        "{text}"
    );

    let mut g = Guard::new(&n.dir, &n.log);
    g.ns(&n.ns_node);
    g.start_node(Some(&n.ns_node), &n.config, &[], &n.socket);
    for ns in [&n.ns_a, &n.ns_b, &n.ns_srv] {
        g.ns(ns);
    }
    ns_named(&n.ns_a).attach(Some(&n.ns_node), &n.tap_a, &[&format!("{POD_A}/24")], &[GW]);
    ns_named(&n.ns_b).attach(Some(&n.ns_node), &n.tap_b, &[&format!("{POD_B}/24")], &[GW]);
    ns_named(&n.ns_srv).attach(Some(&n.ns_node), &n.uplink, &[&format!("{SERVER}/24")], &[]);
    let port = PORT.to_string();
    spawn_in(
        &mut g.children,
        &n.ns_srv,
        &["python3", "-c", HOLD_SERVER_PY, &port],
    );
    wait_listening(&n.ns_srv, PORT);
    // Both pods reach the server (masqueraded), one connection each, closed at once.
    exchange(&n.ns_b, "tcp", SERVER, PORT, 1);

    // Pod A takes its whole limit (the connection above was pod B's).
    let mut a = Command::new("ip")
        .args(["netns", "exec", &n.ns_a, "python3", "-c", HOLD_CLIENT_PY])
        .args([SERVER, &port, &LIMIT.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut stdin = a.stdin.take();
    let mut lines = BufReader::new(a.stdout.take().unwrap()).lines();
    g.children.push(a);
    let mut next = || lines.next().and_then(Result::ok).unwrap_or_default();
    assert_eq!(next(), format!("held {LIMIT}"));
    let extra = next();
    println!("pod A's connection {}: {extra}", LIMIT + 1);
    assert!(extra.starts_with("extra refused"), "{extra}");
    let refused = n.ct_limit_drops();
    assert!(refused >= 1, "ct_limit {refused}");
    // Pod B is not starved.
    let v = exchange(&n.ns_b, "tcp", SERVER, PORT, 3);
    assert!(v.iter().all(|(w, _)| w == "hi"), "{v:?}");
    let conntrack = tapyard_ok_at(&n.socket, &["show", "conntrack"]);
    let from_a = conntrack
        .lines()
        .filter(|l| l.contains(&format!("src={POD_A} ")))
        .count();
    println!("pod A holds {from_a} connections");
    assert_eq!(from_a, LIMIT, "{conntrack}");

    // Pod A closes one connection and opens another at once: the closed one (TIME_WAIT)
    // no longer counts, long before the sweep (a full pass over the 262,144 entries takes
    // some 20 s on an idle node) would remove it.
    {
        use std::io::Write;
        let w = stdin.as_mut().unwrap();
        w.write_all(b"one\n").unwrap();
        w.flush().unwrap();
    }
    let again = next();
    assert_eq!(
        again,
        "reopened connected",
        "ct_limit {}",
        n.ct_limit_drops()
    );

    // Pod A lets go of them all: it connects again at once.
    drop(stdin);
    assert_eq!(next(), "closed");
    let t = Instant::now();
    loop {
        let v = talk(&n.ns_a, "once", SERVER, PORT, 1);
        if v[0].0 == "hi" {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "pod A still refused after its connections closed: {v:?}\n{}\n{}",
            tapyard_ok_at(&n.socket, &["show", "conntrack"]),
            tapyard_ok_at(&n.socket, &["show", "stats"])
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    println!(
        "pod A connects again {:.1} s after closing; ct_limit {}",
        t.elapsed().as_secs_f64(),
        n.ct_limit_drops()
    );
}
