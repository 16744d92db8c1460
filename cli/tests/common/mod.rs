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

#![allow(dead_code)] // each test binary uses its own subset

pub mod cni_plugin;
pub mod flannel;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// True when test `test` should skip, having said why (`why` is what it lacks, `None` when it
/// can run); under `CI=true` a test that cannot run fails instead.
pub fn skip_or_fail(test: &str, why: Option<String>) -> bool {
    match why {
        None => false,
        Some(why) if std::env::var("CI").is_ok_and(|v| v == "true") => {
            panic!("CI=true and the root end-to-end test {test} cannot run: {why}")
        }
        Some(why) => {
            eprintln!("skipping {test}: {why}");
            true
        }
    }
}

/// Why this machine cannot run a root end-to-end test, if it cannot: not root, one of `tools`
/// (`(command, an argument that makes it print its version, what it is or its package)`)
/// missing, no `/dev/net/tun`.
pub fn missing(tools: &[(&str, &str, &str)]) -> Option<String> {
    if euid() != Some(0) {
        return Some("needs root to create TAP devices and network namespaces".into());
    }
    for (cmd, arg, what) in tools {
        if !have(cmd, arg) {
            return Some(format!("`{cmd}` ({what}) is not installed"));
        }
    }
    if !Path::new("/dev/net/tun").exists() {
        return Some("/dev/net/tun does not exist".into());
    }
    None
}

/// [`missing`], and a kernel without IPv6 too.
pub fn missing6(tools: &[(&str, &str, &str)]) -> Option<String> {
    missing(tools).or_else(|| {
        (!Path::new("/proc/sys/net/ipv6").exists()).then(|| "the kernel has no IPv6".into())
    })
}

/// The directory holding the CNI reference plugins (host-local, bridge): `TAPYARD_CNI_PLUGINS`,
/// else Debian's `/usr/lib/cni`, else `/opt/cni/bin`.
pub fn plugin_dir() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("TAPYARD_CNI_PLUGINS")
        .map(PathBuf::from)
        .into_iter()
        .collect();
    dirs.extend(["/usr/lib/cni", "/opt/cni/bin"].map(PathBuf::from));
    dirs.into_iter().find(|d| d.join("host-local").is_file())
}

/// How long one command may take.
pub const CMD_TIMEOUT: Duration = Duration::from_secs(20);

/// The effective user id.
pub fn euid() -> Option<u32> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// Whether `cmd arg` runs.
pub fn have(cmd: &str, arg: &str) -> bool {
    Command::new(cmd)
        .arg(arg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

/// Waits for `child` (its output collected), killing it after `timeout`. Its stdout and
/// stderr, when piped, are read by two threads while it runs, so that a child writing more
/// than a pipe holds (64 KiB) is not blocked on a full pipe until the timeout.
pub fn wait_output(mut child: Child, timeout: Duration, what: &str) -> Output {
    use std::io::Read;
    fn drain(r: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut buf);
            }
            buf
        })
    }
    let out = drain(child.stdout.take());
    let err = drain(child.stderr.take());
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break Some(st),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    // The readers end when every holder of the pipes' write ends has exited (the child's own
    // children may keep them open: they are not waited for past a short grace).
    let collect = |h: std::thread::JoinHandle<Vec<u8>>| {
        let grace = Instant::now() + Duration::from_secs(2);
        while !h.is_finished() && Instant::now() < grace {
            std::thread::sleep(Duration::from_millis(5));
        }
        if h.is_finished() {
            h.join().unwrap_or_default()
        } else {
            Vec::new()
        }
    };
    let (stdout, stderr) = (collect(out), collect(err));
    match status {
        Some(status) => Output {
            status,
            stdout,
            stderr,
        },
        None => panic!(
            "`{what}` did not finish within {timeout:?}: stdout {:?}, stderr {:?}",
            String::from_utf8_lossy(&stdout),
            String::from_utf8_lossy(&stderr)
        ),
    }
}

/// `ip -n <ns> addr add <cidr> dev <dev>`, which must succeed.
pub fn addr_add(ns: &str, cidr: &str, dev: &str) {
    run(&["ip", "-n", ns, "addr", "add", cidr, "dev", dev]);
}

/// [`addr_add`] for an IPv6 address, without duplicate address detection (`nodad`): usable
/// at once.
pub fn addr_add6(ns: &str, cidr: &str, dev: &str) {
    run(&["ip", "-n", ns, "addr", "add", cidr, "dev", dev, "nodad"]);
}

/// Runs a command (with [`CMD_TIMEOUT`]).
pub fn run_output(args: &[&str]) -> Output {
    let child = Command::new(args[0])
        .args(&args[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run `{}`: {e}", args.join(" ")));
    wait_output(child, CMD_TIMEOUT, &args.join(" "))
}

/// Runs a command that must succeed; its stdout.
pub fn run(args: &[&str]) -> String {
    let out = run_output(args);
    assert!(
        out.status.success(),
        "`{}` failed ({}):\nstdout: {}\nstderr: {}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Three pings from `ns` to `to`, all answered.
pub fn ping_ok(ns: &str, to: &str) {
    let out = run_output(&[
        "ip", "netns", "exec", ns, "ping", "-n", "-c", "3", "-i", "0.2", "-W", "2", to,
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains(" 0% packet loss"),
        "ping {ns} -> {to} failed:\n{text}{}",
        String::from_utf8_lossy(&out.stderr)
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

/// Starts a long-running process in `ns` (killed by the guard).
pub fn spawn_in(children: &mut Vec<Child>, ns: &str, args: &[&str]) {
    let child = Command::new("ip")
        .args(["netns", "exec", ns])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {args:?} in {ns}: {e}"));
    children.push(child);
}

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

/// [`tear_down`] with links of the test's own namespace to delete (after the processes) and
/// any number of logs.
fn clean_up<'a>(
    procs: impl Iterator<Item = &'a mut Child>,
    links: &[String],
    namespaces: &[String],
    logs: &[PathBuf],
    dir: &Path,
) {
    for c in procs {
        let _ = c.kill();
        let _ = c.wait();
    }
    for (what, name) in links
        .iter()
        .map(|l| (["link", "del"], l))
        .chain(namespaces.iter().map(|ns| (["netns", "del"], ns)))
    {
        let _ = Command::new("ip")
            .args(what)
            .arg(name)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
    if std::thread::panicking() {
        for log in logs {
            if let Ok(text) = std::fs::read_to_string(log) {
                eprintln!("---- {} ----\n{text}---- end ----", log.display());
            }
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// Everything an end-to-end test made, undone on drop, on success and failure alike: its
/// processes killed (`children`, then `node`), the `links` it left in the test's own
/// namespace deleted, its `namespaces` deleted (with the TAPs and veths in them), each of
/// `logs` printed if the test is failing, `dir` removed.
pub struct Guard {
    /// The node (`tapyard run`), when the test has one it stops and starts again.
    pub node: Option<Child>,
    /// Every other process: servers, clients, more nodes.
    pub children: Vec<Child>,
    /// Namespaces made with [`Guard::ns`].
    pub namespaces: Vec<String>,
    /// Links in the test's own namespace (a TAP tapyard left there).
    pub links: Vec<String>,
    /// The logs worth reading when the test fails.
    pub logs: Vec<PathBuf>,
    /// The test's directory (configs, sockets, state, logs).
    pub dir: PathBuf,
}

impl Guard {
    /// A guard for the test's directory `dir` (created) and its node's `log`.
    pub fn new(dir: &Path, log: &Path) -> Guard {
        std::fs::create_dir_all(dir).unwrap();
        Guard {
            node: None,
            children: Vec::new(),
            namespaces: Vec::new(),
            links: Vec::new(),
            logs: vec![log.to_path_buf()],
            dir: dir.to_path_buf(),
        }
    }

    /// Creates network namespace `name` (deleted on drop) with `lo` up and, where the kernel
    /// has IPv6, no duplicate address detection (`accept_dad` 0): an IPv6 address given to
    /// an interface made in or moved to it is usable at once, never tentative.
    pub fn ns(&mut self, name: &str) {
        run(&["ip", "netns", "add", name]);
        self.namespaces.push(name.to_string());
        if Path::new("/proc/sys/net/ipv6").exists() {
            sh(
                name,
                "echo 0 > /proc/sys/net/ipv6/conf/default/accept_dad; echo 0 > /proc/sys/net/ipv6/conf/all/accept_dad",
            );
        }
        run(&["ip", "-n", name, "link", "set", "lo", "up"]);
    }

    /// Starts the node ([`tapyard_run`]) as [`Guard::node`] and waits for its control
    /// socket.
    pub fn start_node(&mut self, ns: Option<&str>, config: &Path, args: &[&str], socket: &Path) {
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
}

impl Guard {
    /// Stops the node with SIGTERM (`ip netns exec` has exec'd tapyard) and waits for it (10 s
    /// at most): its exit status.
    pub fn stop_node(&mut self) -> std::process::ExitStatus {
        let c = self.node.take().expect("a running node");
        run(&["kill", "-TERM", &c.id().to_string()]);
        wait_output(c, Duration::from_secs(10), "tapyard run (SIGTERM)").status
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let procs = self.children.iter_mut().chain(self.node.as_mut());
        clean_up(procs, &self.links, &self.namespaces, &self.logs, &self.dir);
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
    run(&["ip", "netns", "exec", ns, "sh", "-c", script])
}

/// A command in `ns`: (success, stdout + stderr).
pub fn in_ns(ns: &str, args: &[&str]) -> (bool, String) {
    let mut v = vec!["ip", "netns", "exec", ns];
    v.extend_from_slice(args);
    let out = run_output(&v);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Polls `f` every 100 ms until it returns `Ok`, at most `limit`; the last state is in the
/// failure message.
pub fn wait_for<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        match f() {
            Ok(v) => return v,
            Err(last) if Instant::now() >= deadline => {
                panic!("{what}: not within {limit:?}; last: {last}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}
