//! Helpers shared by the end-to-end tests: why a root test cannot run, running commands with
//! a timeout, the cleanup [`Guard`] with its namespaces, `tapyard run` in a namespace, the
//! `[node]` section of a test's config, pings between namespaces, and tiny Python TCP/UDP
//! servers and clients (both families); [`cni_plugin`] runs the CNI plugin, [`flannel`] sets
//! up a Linux node as Flannel's VXLAN backend does.
//!
//! Root tests: a test that needs root (TAP devices, network namespaces) carries
//! `#[cfg_attr(not(tapyard_root), ignore = "needs root: ...")]`. The package's `build.rs` sets
//! `cfg(tapyard_root)` when the build runs as root (effective uid 0, unless
//! `TAPYARD_TEST_AS_USER=1`), so a user's `cargo test` lists these tests as `ignored` instead
//! of reporting `ok` for a test that did not run; as root (and in CI) they run. Running, they
//! still check for the tools they need: a missing one skips the test saying why, or fails it
//! under `CI=true`.

#![allow(dead_code, unused_imports)] // each test binary uses its own subset

pub mod cni_plugin;
pub mod flannel;

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub use tapyard_testkit::*;

/// `ip -n <ns> addr add <cidr> dev <dev>`, which must succeed.
pub fn addr_add(ns: &str, cidr: &str, dev: &str) {
    run(&["ip", "-n", ns, "addr", "add", cidr, "dev", dev]);
}

/// [`addr_add`] for an IPv6 address, without duplicate address detection (`nodad`): usable
/// at once.
pub fn addr_add6(ns: &str, cidr: &str, dev: &str) {
    run(&["ip", "-n", ns, "addr", "add", cidr, "dev", dev, "nodad"]);
}

/// Puts `addrs` (`a.b.c.d/n`, or IPv6 without duplicate address detection) on `dev` in `ns`
/// and brings `dev` and `lo` up.
pub fn link_up(ns: &str, dev: &str, addrs: &[&str]) {
    for a in addrs {
        if a.contains(':') {
            addr_add6(ns, a, dev);
        } else {
            addr_add(ns, a, dev);
        }
    }
    run(&["ip", "-n", ns, "link", "set", dev, "up"]);
    run(&["ip", "-n", ns, "link", "set", "lo", "up"]);
}

/// Three pings from `ns` to `to`, all answered.
pub fn ping_ok(ns: &str, to: &str) {
    let (ok, text) = ns_named(ns).ping(to, 3);
    assert!(
        ok,
        "ping {ns} -> {to} failed:
{text}"
    );
    println!("ping {ns} -> {to}: ok");
}

/// One ping from `ns` to `to`, unanswered.
pub fn ping_fails(ns: &str, to: &str) {
    let out = run_output(&[
        "ip", "netns", "exec", ns, "ping", "-n", "-c", "1", "-W", "1", to,
    ]);
    assert!(!out.status.success(), "ping {ns} -> {to} should fail");
}

/// A server on both families (`::`, not IPv6-only; plain IPv4 where the kernel has no IPv6):
/// TCP on `argv[2]` (each connection gets `<ident> <peer address>\n`, then is closed) unless
/// 0, UDP on `argv[3]` (each datagram is answered with `<ident> <peer address>`) unless 0.
/// IPv4 peers are shown as IPv4 addresses.
pub const SERVER_PY: &str = r#"
import socket, sys, threading
ident, tport, uport = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def peer(p):
    a = p[0]
    return a[7:] if a.startswith("::ffff:") else a
def sock(kind, port):
    try:
        s = socket.socket(socket.AF_INET6, kind)
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        any_addr = "::"
    except OSError:
        s = socket.socket(socket.AF_INET, kind)
        any_addr = "0.0.0.0"
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((any_addr, port))
    return s
def tcp():
    s = sock(socket.SOCK_STREAM, tport)
    s.listen(128)
    while True:
        c, p = s.accept()
        try:
            c.sendall(("%s %s\n" % (ident, peer(p))).encode())
        except OSError:
            pass
        c.close()
def udp():
    u = sock(socket.SOCK_DGRAM, uport)
    while True:
        d, p = u.recvfrom(2048)
        u.sendto(("%s %s" % (ident, peer(p))).encode(), p)
ts = [threading.Thread(target=f, daemon=True) for f, p in ((tcp, tport), (udp, uport)) if p]
for t in ts:
    t.start()
for t in ts:
    t.join()
"#;

/// `tcp|udp|once <addr> <port> <count>` (either family): `count` exchanges, one line each:
/// the server's answer (`<ident> <client address it saw>`), or `error <why>` (tcp and udp
/// retry for 5 s: a server that is still starting refuses; `once` is one TCP connection
/// attempt, to see how it is refused).
pub const CLIENT_PY: &str = r#"
import socket, sys, time
mode, addr, port, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
for i in range(count):
    deadline = time.monotonic() + (0 if mode == "once" else 5)
    while True:
        try:
            if mode in ("tcp", "once"):
                c = socket.socket(fam, socket.SOCK_STREAM)
                c.settimeout(3)
                c.connect((addr, port))
                data = b""
                while not data.endswith(b"\n"):
                    d = c.recv(256)
                    if not d:
                        break
                    data += d
                c.close()
            else:
                u = socket.socket(fam, socket.SOCK_DGRAM)
                u.settimeout(2)
                u.connect((addr, port))
                u.send(b"q")
                data = u.recv(2048)
                u.close()
            print(data.decode().strip(), flush=True)
            break
        except OSError as e:
            if time.monotonic() >= deadline:
                print("error %s" % e, flush=True)
                break
            time.sleep(0.2)
"#;

/// Runs [`CLIENT_PY`] in `ns`: `(server ident, client address it saw)` of each exchange, an
/// `error` among them (see [`exchange`]).
pub fn talk(ns: &str, mode: &str, addr: &str, port: u16, count: usize) -> Vec<(String, String)> {
    let port = port.to_string();
    let count_s = count.to_string();
    let out = run(&[
        "ip", "netns", "exec", ns, "python3", "-c", CLIENT_PY, mode, addr, &port, &count_s,
    ]);
    let v: Vec<(String, String)> = out
        .lines()
        .map(|l| {
            let (a, b) = l.split_once(' ').unwrap_or((l, ""));
            (a.to_string(), b.to_string())
        })
        .collect();
    assert_eq!(v.len(), count, "{mode} {ns} -> {addr}:{port}: {out}");
    v
}

/// [`talk`], every exchange answered.
pub fn exchange(
    ns: &str,
    mode: &str,
    addr: &str,
    port: u16,
    count: usize,
) -> Vec<(String, String)> {
    let v = talk(ns, mode, addr, port, count);
    for (who, seen) in &v {
        assert_ne!(who, "error", "{mode} {ns} -> {addr}:{port}: {seen}");
    }
    println!("{mode} {ns} -> {addr}:{port}: {v:?}");
    v
}

/// Waits for a TCP listener on `port` in `ns` (`ss -ltn`), else a short pause.
pub fn wait_listening(ns: &str, port: u16) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        let out = run_output(&["ip", "netns", "exec", ns, "ss", "-ltnH"]);
        if !out.status.success() {
            std::thread::sleep(Duration::from_millis(500));
            return;
        }
        if String::from_utf8_lossy(&out.stdout).contains(&format!(":{port} ")) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("nothing listens on port {port} in {ns}");
}

/// The `tapyard` binary under test.
pub const TAPYARD: &str = env!("CARGO_BIN_EXE_tapyard");

/// `tapyard ARGS --socket SOCKET`.
pub fn tapyard_at(socket: &Path, args: &[&str]) -> Output {
    let mut v = vec![TAPYARD];
    v.extend_from_slice(args);
    let s = socket.display().to_string();
    v.extend(["--socket", &s]);
    run_output(&v)
}

/// `tapyard ARGS --socket SOCKET`, which must succeed: its stdout.
pub fn tapyard_ok_at(socket: &Path, args: &[&str]) -> String {
    let out = tapyard_at(socket, args);
    assert!(
        out.status.success(),
        "tapyard {args:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Waits until the node's control socket answers (`show routes`); fails if the node exits.
pub fn wait_for_socket(node: Option<&mut Child>, socket: &Path) {
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut node = node;
    loop {
        if let Some(Ok(Some(st))) = node.as_mut().map(|c| c.try_wait()) {
            panic!("tapyard run exited early: {st}");
        }
        if socket.exists() && tapyard_at(socket, &["show", "routes"]).status.success() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the control socket never answered"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What a test leaves behind: kills `procs`, deletes `namespaces` (and the devices in them),
/// prints the node's `log` if the test is failing, removes `dir`.
pub fn tear_down<'a>(
    procs: impl Iterator<Item = &'a mut Child>,
    namespaces: &[String],
    log: &Path,
    dir: &Path,
) {
    clean_up(procs, &[], namespaces, &[log.to_path_buf()], dir);
}

/// What [`Guard`] adds for a test with a node: starting and stopping `tapyard run`.
pub trait NodeGuard {
    /// Starts the node ([`tapyard_run`]) as [`Guard::node`] and waits for its control
    /// socket.
    fn start_node(&mut self, ns: Option<&str>, config: &Path, args: &[&str], socket: &Path);

    /// Stops the node with SIGTERM (`ip netns exec` has exec'd tapyard) and waits for it (10 s
    /// at most): its exit status.
    fn stop_node(&mut self) -> std::process::ExitStatus;
}

impl NodeGuard for Guard {
    fn start_node(&mut self, ns: Option<&str>, config: &Path, args: &[&str], socket: &Path) {
        let log = self
            .logs
            .first()
            .cloned()
            .unwrap_or_else(|| self.dir.join("run.log"));
        let child = tapyard_run(ns, config, args, &log)
            .spawn()
            .expect("start tapyard run");
        self.node = Some(child);
        wait_for_socket(self.node.as_mut(), socket);
    }

    fn stop_node(&mut self) -> std::process::ExitStatus {
        let c = self.node.take().expect("a running node");
        run(&["kill", "-TERM", &c.id().to_string()]);
        wait_output(c, Duration::from_secs(10), "tapyard run (SIGTERM)").status
    }
}

/// `tapyard run CONFIG ARGS`, in namespace `ns` (else in the test's own), with `RUST_LOG=info`
/// and its stderr appended to `log`; the caller adds what it needs and spawns it.
pub fn tapyard_run(ns: Option<&str>, config: &Path, args: &[&str], log: &Path) -> Command {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap_or_else(|e| panic!("{}: {e}", log.display()));
    let mut c = match ns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, TAPYARD]);
            c
        }
        None => Command::new(TAPYARD),
    };
    c.arg("run")
        .arg(config)
        .args(args)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
    c
}

/// The `[node]` section of a test's config: node `name`, `cluster_cidr` (its TOML value: a
/// quoted prefix or a list), the control `socket`, the `state` directory (none: tapyard's
/// default), two workers.
pub fn node_toml(name: &str, cluster_cidr: &str, socket: &Path, state: Option<&Path>) -> String {
    let state = state.map_or(String::new(), |s| {
        format!("state_dir = \"{}\"\n", s.display())
    });
    format!(
        "[node]\nname = \"{name}\"\ncluster_cidr = {cluster_cidr}\nsocket = \"{}\"\n{state}workers = 2\n",
        socket.display()
    )
}

/// `sh -c SCRIPT` in `ns`, which must succeed; its stdout.
pub fn sh(ns: &str, script: &str) -> String {
    ns_named(ns).sh(script)
}

/// A command in `ns`: (success, stdout + stderr).
pub fn in_ns(ns: &str, args: &[&str]) -> (bool, String) {
    ns_named(ns).cmd(args)
}

/// Namespace `ns`, by name.
pub fn ns_named(ns: &str) -> Ns {
    Ns {
        name: ns.to_string(),
    }
}
