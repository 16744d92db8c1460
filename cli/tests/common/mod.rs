//! Helpers shared by the end-to-end tests: running commands with a timeout, pings between
//! namespaces, and tiny Python TCP/UDP servers and clients.

#![allow(dead_code)] // each test binary uses its own subset

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

/// A server: TCP on `argv[2]` (each connection gets `<ident> <peer address>\n`, then is
/// closed) unless 0, and UDP on `argv[3]` (each datagram is answered with `<ident> <peer
/// address>`) unless 0.
pub const SERVER_PY: &str = r#"
import socket, sys, threading
ident, tport, uport = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def tcp():
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", tport))
    s.listen(128)
    while True:
        c, peer = s.accept()
        try:
            c.sendall(("%s %s\n" % (ident, peer[0])).encode())
        except OSError:
            pass
        c.close()
def udp():
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.bind(("0.0.0.0", uport))
    while True:
        d, peer = u.recvfrom(2048)
        u.sendto(("%s %s" % (ident, peer[0])).encode(), peer)
ts = [threading.Thread(target=f, daemon=True) for f, p in ((tcp, tport), (udp, uport)) if p]
for t in ts:
    t.start()
for t in ts:
    t.join()
"#;

/// `tcp|udp <addr> <port> <count>`: `count` exchanges, one line each: the server's answer
/// (`<ident> <client address it saw>`), or `error <why>` after 5 s of retries (a server that
/// is still starting refuses).
pub const CLIENT_PY: &str = r#"
import socket, sys, time
mode, addr, port, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
for i in range(count):
    deadline = time.monotonic() + 5
    while True:
        try:
            if mode == "tcp":
                c = socket.create_connection((addr, port), timeout=3)
                data = b""
                while not data.endswith(b"\n"):
                    d = c.recv(256)
                    if not d:
                        break
                    data += d
                c.close()
            else:
                u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                u.settimeout(2)
                u.connect((addr, port))
                u.send(b"q")
                data = u.recv(2048)
                u.close()
            print(data.decode().strip(), flush=True)
            break
        except OSError as e:
            if time.monotonic() > deadline:
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

/// Runs [`CLIENT_PY`] in `ns`: `(server ident, client address it saw)` of each exchange.
pub fn exchange(
    ns: &str,
    mode: &str,
    addr: &str,
    port: u16,
    count: usize,
) -> Vec<(String, String)> {
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
    for c in procs {
        let _ = c.kill();
        let _ = c.wait();
    }
    for ns in namespaces {
        let _ = Command::new("ip")
            .args(["netns", "del", ns])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
    if std::thread::panicking() {
        if let Ok(log) = std::fs::read_to_string(log) {
            eprintln!("---- tapyard run log ----\n{log}---- end ----");
        }
    }
    let _ = std::fs::remove_dir_all(dir);
}
