//! Helpers shared by the root end-to-end tests: the skip logic (root, tools, `/dev/net/tun`;
//! with `CI=true` a skip is a failure), running commands with a timeout, a cleanup [`Guard`],
//! network namespaces ([`Ns`]) and long-running servers inside them.
//!
//! Each test binary (`datapath`, `e2e`) uses only part of this module.
//!
//! Root tests: a test that needs root (TAP devices, network namespaces) carries
//! `#[cfg_attr(not(tapyard_root), ignore = "needs root: ...")]`. The package's `build.rs` sets
//! `cfg(tapyard_root)` when the build runs as root (effective uid 0, unless
//! `TAPYARD_TEST_AS_USER=1`), so a user's `cargo test` lists these tests as `ignored` instead
//! of reporting `ok` for a test that did not run; as root (and in CI) they run. Running, they
//! still check for the tools they need: a missing one skips the test saying why, or fails it
//! under `CI=true`.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tapyard::l3::{mask, NextHop, Route, RouteProto};
use tapyard::port::{Port, TapPort};
use tapyard::runtime::Runtime;
use tapyard::PortId;

/// Upper bound on each external command.
pub const CMD_TIMEOUT: Duration = Duration::from_secs(20);

/// The effective uid, from `/proc/self/status` (no `unsafe` needed).
pub fn euid() -> Option<u32> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// Whether `cmd arg` runs and succeeds.
pub fn have(cmd: &str, arg: &str) -> bool {
    Command::new(cmd)
        .arg(arg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// True when running under CI (`CI=true`), where a skip must be a failure.
pub fn in_ci() -> bool {
    std::env::var("CI").as_deref() == Ok("true")
}

/// Why this machine cannot run the root tests, if it cannot; `tools` are extra commands
/// (with an argument that makes them print their version) the test needs.
pub fn skip_reason(tools: &[(&str, &str)]) -> Option<String> {
    if euid() != Some(0) {
        return Some("skipping: needs root to create TAP devices and network namespaces".into());
    }
    if !have("ip", "-V") {
        return Some("skipping: `ip` (iproute2) is not installed".into());
    }
    for (cmd, arg) in tools {
        if !have(cmd, arg) {
            return Some(format!("skipping: `{cmd}` is not installed"));
        }
    }
    if !std::path::Path::new("/dev/net/tun").exists() {
        return Some("skipping: /dev/net/tun does not exist".into());
    }
    None
}

/// Prints why the test is skipped, or panics under `CI=true`.
pub fn skip(why: &str) {
    // CI runs as root with the tools installed: a skip there is a failure.
    assert!(!in_ci(), "CI=true but {why}");
    eprintln!("{why}");
}

/// Runs `args` to completion (at most [`CMD_TIMEOUT`]); returns its output whatever the status.
pub fn run_output(args: &[&str]) -> Output {
    let child = Command::new(args[0])
        .args(&args[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run `{}`: {e}", args.join(" ")));
    wait_with_timeout(child, CMD_TIMEOUT, &args.join(" "))
}

/// Runs `args` and panics with its output unless it succeeds; returns its stdout.
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

/// Waits for `child`, killing it and panicking after `timeout`.
pub fn wait_with_timeout(mut child: Child, timeout: Duration, what: &str) -> Output {
    let drain = |s: Option<Box<dyn std::io::Read + Send>>| {
        s.map(|mut s| {
            std::thread::spawn(move || {
                let mut v = Vec::new();
                let _ = s.read_to_end(&mut v);
                v
            })
        })
    };
    let stdout = drain(
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
    );
    let stderr = drain(
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn std::io::Read + Send>),
    );
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break st,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("`{what}` did not finish within {timeout:?}");
            }
            Err(e) => panic!("waiting for `{what}`: {e}"),
        }
    };
    Output {
        status,
        stdout: stdout.map_or_else(Vec::new, |t| t.join().unwrap_or_default()),
        stderr: stderr.map_or_else(Vec::new, |t| t.join().unwrap_or_default()),
    }
}

/// Owns everything a test creates and removes it on drop, in order: child processes, the
/// runtime (joining its workers), the TAP ports (closing the fds deletes the devices, wherever
/// they are), then the namespaces (with the veths and bridges inside). Never panics.
#[derive(Default)]
pub struct Guard {
    pub children: Vec<Child>,
    pub rt: Option<Runtime>,
    pub ports: Vec<(PortId, Arc<dyn Port>)>,
    pub namespaces: Vec<String>,
}

impl Guard {
    /// Creates namespace `name` (removed on drop) with `lo` up.
    pub fn add_namespace(&mut self, name: &str) -> Ns {
        run(&["ip", "netns", "add", name]);
        self.namespaces.push(name.to_string());
        let ns = Ns {
            name: name.to_string(),
        };
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    /// Starts `args` as a server that prints `ready` once it listens; its later output lines
    /// are printed prefixed with `label` when `TAPYARD_E2E_VERBOSE` is set. Killed on drop;
    /// returns its index for [`Guard::kill_child`].
    pub fn spawn_server(&mut self, label: &str, args: &[&str]) -> usize {
        let mut child = Command::new(args[0])
            .args(&args[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {label}: {e}"));
        let stdout = child.stdout.take().expect("server stdout");
        self.children.push(child);
        let (tx, rx) = mpsc::channel::<String>();
        let label2 = label.to_string();
        std::thread::spawn(move || {
            let mut first = true;
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if first {
                    first = false;
                    let _ = tx.send(line);
                } else if std::env::var_os("TAPYARD_E2E_VERBOSE").is_some() {
                    println!("  [{label2}] {line}");
                }
            }
        });
        let ready = rx
            .recv_timeout(CMD_TIMEOUT)
            .unwrap_or_else(|_| panic!("{label} did not start"));
        assert_eq!(ready, "ready", "unexpected output from {label}");
        self.children.len() - 1
    }

    /// Kills the child at `idx` (from [`Guard::spawn_server`]) and waits for it; the slot stays
    /// so later indices remain valid.
    pub fn kill_child(&mut self, idx: usize) {
        let c = &mut self.children[idx];
        let _ = c.kill();
        let _ = c.wait();
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some(rt) = self.rt.take() {
            rt.stop();
        }
        self.ports.clear();
        for ns in &self.namespaces {
            let ok = Command::new("ip")
                .args(["netns", "del", ns])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if !ok {
                eprintln!("warning: could not delete network namespace {ns}; `ip netns del {ns}`");
            }
        }
    }
}

/// A network namespace created by [`Guard::add_namespace`].
#[derive(Clone, Debug)]
pub struct Ns {
    pub name: String,
}

impl Ns {
    /// `args` prefixed to run inside the namespace.
    pub fn exec<'a>(&'a self, args: &[&'a str]) -> Vec<&'a str> {
        let mut v = vec!["ip", "netns", "exec", self.name.as_str()];
        v.extend_from_slice(args);
        v
    }

    /// `ip -n <ns> <args>`, which must succeed.
    pub fn ip(&self, args: &[&str]) -> String {
        let mut v = vec!["ip", "-n", self.name.as_str()];
        v.extend_from_slice(args);
        run(&v)
    }

    /// `ip -n <ns> <args>`, whatever its status.
    pub fn ip_output(&self, args: &[&str]) -> Output {
        let mut v = vec!["ip", "-n", self.name.as_str()];
        v.extend_from_slice(args);
        run_output(&v)
    }

    /// Moves interface `dev` (in the root namespace) here, gives it `cidr` (if any) and
    /// brings it up.
    pub fn take_link(&self, dev: &str, cidr: Option<&str>) {
        run(&["ip", "link", "set", dev, "netns", &self.name]);
        if let Some(c) = cidr {
            self.ip(&["addr", "add", c, "dev", dev]);
        }
        self.ip(&["link", "set", dev, "up"]);
    }

    /// `sysctl -w key=value` inside the namespace.
    pub fn sysctl(&self, key: &str, value: &str) {
        run(&self.exec(&["sysctl", "-qw", &format!("{key}={value}")]));
    }

    /// Turns IPv6 off for every interface (those moved in later too), so that no router
    /// solicitations, MLD reports or DAD probes add to the traffic under test.
    pub fn disable_ipv6(&self) {
        self.sysctl("net.ipv6.conf.all.disable_ipv6", "1");
        self.sysctl("net.ipv6.conf.default.disable_ipv6", "1");
    }

    /// `ip route add <dst> via <via>`.
    pub fn route(&self, dst: &str, via: &str) {
        self.ip(&["route", "add", dst, "via", via]);
    }

    /// Runs `python3 -c <script> <args>` inside the namespace; panics unless it succeeds and
    /// returns its stdout.
    pub fn python(&self, script: &str, args: &[&str]) -> String {
        let mut v = self.exec(&["python3", "-c", script]);
        v.extend_from_slice(args);
        run(&v)
    }

    /// Pings `to` and panics unless every reply came.
    pub fn ping_ok(&self, to: &str) {
        let out = run_output(&self.exec(&["ping", "-n", "-c", "2", "-i", "0.2", "-W", "2", to]));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains(" 0% packet loss"),
            "ping {} -> {to} failed ({}):\n{text}{}",
            self.name,
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// How a test opens its TAP ports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TapKind {
    /// No virtio-net header: the kernel segments and checksums.
    Plain,
    /// Virtio-net header, checksum and TSO offloads (the production default).
    Offload,
}

/// Opens TAP `name` as `kind`.
pub fn open_tap(kind: TapKind, name: &str) -> std::io::Result<TapPort> {
    match kind {
        TapKind::Plain => TapPort::open(name),
        TapKind::Offload => TapPort::open_offload(name),
    }
}

/// A datapath with one bridge, `br0`, holding ports `a` and `b`: the datapath and the ports'
/// ids.
pub fn two_port_bridge(a: &str, b: &str) -> (tapyard::Datapath, PortId, PortId) {
    let mut builder = tapyard::Datapath::builder();
    let br = builder
        .add_bridge(tapyard::BridgeConfig::new("br0"))
        .unwrap();
    let ia = builder.add_port(a.to_owned(), Some(br)).unwrap();
    let ib = builder.add_port(b.to_owned(), Some(br)).unwrap();
    (builder.build(), ia, ib)
}

/// Opens (plain) TAP `name`; `None`, having said why the test skips, when this process may
/// not create TAP devices. Any other error panics.
pub fn open_tap_or_skip(name: &str) -> Option<Arc<dyn Port>> {
    match TapPort::open(name) {
        Ok(p) => Some(Arc::new(p)),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            skip(&format!("skipping: cannot create TAP {name} ({e})"));
            None
        }
        Err(e) => panic!("cannot open TAP {name}: {e}"),
    }
}

/// A static route to `dst/len`.
pub fn route(dst: &str, len: u8, next_hop: NextHop) -> Route {
    let prefix = dst.parse().expect("prefix");
    assert_eq!(mask(prefix, len), prefix);
    Route {
        prefix,
        len,
        next_hop,
        metric: 0,
        proto: RouteProto::Static,
        src: None,
    }
}

/// A tag that keeps names of tests run concurrently or one after another apart.
pub fn name_tag() -> (u32, u64) {
    let pid = std::process::id();
    let tag = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() % 100_000);
    (pid, tag)
}

/// Frames flooded towards a TAP before its interface is up are refused (`EIO`, counted as
/// `tx_link_down`): IPv6 router solicitations, MLD reports and the like. Allow a few of them.
pub const MAX_EARLY_LINK_DOWN: u64 = 50;

/// Panics, printing the counters, if any of `reasons` counted a drop, if a transmit failed
/// with an error, or if more frames met a link not up than the few expected before the links
/// came up.
pub fn assert_no_drops(st: &tapyard::StatsSnapshot, reasons: &[tapyard::DropReason]) {
    for &r in reasons {
        assert_eq!(st.drop_count(r), 0, "unexpected {r} drops:\n{st}");
    }
    let tx_err = st.drop_count(tapyard::DropReason::TxError);
    assert_eq!(tx_err, 0, "transmit errors:\n{st}");
    let down = st.drop_count(tapyard::DropReason::TxLinkDown);
    assert!(
        down <= MAX_EARLY_LINK_DOWN,
        "{down} frames to links not up (more than the few expected before the links came up):\n{st}"
    );
}

/// Processes one frame received on `port` through `dp` at `now` (no root needed); returns its
/// verdict and every frame sent, as `(port, bytes)`, expanded as `dispatch` does.
pub fn send_one(
    dp: &tapyard::Datapath,
    w: &mut tapyard::Worker,
    now: tapyard::Instant,
    port: PortId,
    frame: &[u8],
) -> (tapyard::Verdict, Vec<(PortId, Vec<u8>)>) {
    let mut batch = tapyard::Batch::new();
    let mut b = tapyard::PacketBuf::from_frame(frame);
    b.port = port;
    batch.push(b).expect("an empty batch has room");
    dp.process(w, now, &mut batch);
    let v = batch.verdicts()[0];
    let mut out = Vec::new();
    dp.dispatch(w, &batch, |p, b| {
        out.push((p, b.frame().to_vec()));
        Ok(())
    });
    batch.recycle(&mut w.pool);
    (v, out)
}

/// Reads frames from `tap` for up to two seconds, until `done` says it has them all.
pub fn read_until(
    tap: &TapPort,
    pool: &mut tapyard::BufPool,
    done: &mut dyn FnMut(&tapyard::PacketBuf) -> bool,
) -> bool {
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        let mut batch = tapyard::Batch::new();
        match tap.recv_batch(pool, &mut batch) {
            Ok(0) | Err(_) => std::thread::sleep(Duration::from_millis(5)),
            Ok(_) => {
                let hit = batch.bufs().iter().any(&mut *done);
                batch.recycle(pool);
                if hit {
                    return true;
                }
            }
        }
    }
    false
}

/// A copy of `b` (frame and offload header) in a buffer of its own, with room for any
/// super-frame.
pub fn copy_buf(b: &tapyard::PacketBuf) -> tapyard::PacketBuf {
    let mut c = tapyard::PacketBuf::new(70_000);
    c.room_mut()[..b.len()].copy_from_slice(b.frame());
    c.set_len(b.len());
    c.offload = b.offload;
    c
}
