//! Network namespaces and the cleanup [`Guard`]: what a test makes is removed when it ends,
//! whether it passed or failed.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{mpsc, Arc};

use tapyard::port::Port;
use tapyard::runtime::Runtime;
use tapyard::PortId;

use crate::host::{run, run_output, unique, CMD_TIMEOUT};

/// A network namespace, by name (made by [`Guard::ns`] or [`Netns`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ns {
    /// Its name (`/var/run/netns/<name>`).
    pub name: String,
}

impl Ns {
    /// Creates namespace `name` with `lo` up and, where the kernel has IPv6, no duplicate
    /// address detection (`accept_dad` 0): an IPv6 address given to an interface made in or
    /// moved to it is usable at once, never tentative. Nothing deletes it: see [`Guard::ns`]
    /// and [`Netns`].
    pub fn create(name: &str) -> Ns {
        run(&["ip", "netns", "add", name]);
        let ns = Ns {
            name: name.to_string(),
        };
        if Path::new("/proc/sys/net/ipv6").exists() {
            ns.sh("echo 0 > /proc/sys/net/ipv6/conf/default/accept_dad; echo 0 > /proc/sys/net/ipv6/conf/all/accept_dad");
        }
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    /// Its path, as a CNI runtime passes it (`/var/run/netns/<name>`).
    pub fn path(&self) -> String {
        format!("/var/run/netns/{}", self.name)
    }

    /// `args` prefixed to run inside the namespace (`ip netns exec <ns> ...`).
    pub fn exec<'a>(&'a self, args: &[&'a str]) -> Vec<&'a str> {
        let mut v = vec!["ip", "netns", "exec", self.name.as_str()];
        v.extend_from_slice(args);
        v
    }

    /// `ip -n <ns> <args>`, which must succeed: its stdout.
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

    /// `sh -c SCRIPT` inside the namespace, which must succeed: its stdout.
    pub fn sh(&self, script: &str) -> String {
        run(&self.exec(&["sh", "-c", script]))
    }

    /// A command inside the namespace: (success, stdout + stderr).
    pub fn cmd(&self, args: &[&str]) -> (bool, String) {
        let out = run_output(&self.exec(args));
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    }

    /// Whether interface `ifname` exists here.
    pub fn has_link(&self, ifname: &str) -> bool {
        self.ip_output(&["link", "show", ifname]).status.success()
    }

    /// Moves interface `dev` (in the test's namespace) here, gives it `cidr` (if any) and
    /// brings it up.
    pub fn take_link(&self, dev: &str, cidr: Option<&str>) {
        run(&["ip", "link", "set", dev, "netns", &self.name]);
        if let Some(c) = cidr {
            self.ip(&["addr", "add", c, "dev", dev]);
        }
        self.ip(&["link", "set", dev, "up"]);
    }

    /// Moves interface `dev` from namespace `from` (`None`: the test's own) here, gives it
    /// each of `cidrs` (either family; IPv6 without duplicate address detection), brings `lo`
    /// and it up and adds a default route via each of `gateways` (either family): a pod's
    /// interface, attached.
    pub fn attach(&self, from: Option<&str>, dev: &str, cidrs: &[&str], gateways: &[&str]) {
        let mut mv = vec!["ip"];
        if let Some(from) = from {
            mv.extend(["-n", from]);
        }
        mv.extend(["link", "set", dev, "netns", &self.name]);
        run(&mv);
        for cidr in cidrs {
            if cidr.contains(':') {
                self.ip(&["addr", "add", cidr, "dev", dev, "nodad"]);
            } else {
                self.ip(&["addr", "add", cidr, "dev", dev]);
            }
        }
        self.ip(&["link", "set", "lo", "up"]);
        self.ip(&["link", "set", dev, "up"]);
        for gw in gateways {
            let family = if gw.contains(':') { "-6" } else { "-4" };
            self.ip(&[family, "route", "add", "default", "via", gw]);
        }
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

    /// `count` pings to `to` (either family), 0.2 s apart: whether every reply came, and
    /// ping's output.
    pub fn ping(&self, to: &str, count: u32) -> (bool, String) {
        let count = count.to_string();
        let out = run_output(&self.exec(&["ping", "-n", "-c", &count, "-i", "0.2", "-W", "2", to]));
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (
            out.status.success() && text.contains(" 0% packet loss"),
            text,
        )
    }

    /// Pings `to` and panics unless every reply came.
    pub fn ping_ok(&self, to: &str) {
        let (ok, text) = self.ping(to, 2);
        assert!(ok, "ping {} -> {to} failed:\n{text}", self.name);
    }
}

/// Deletes namespace `name` (and the interfaces in it), warning if it cannot. Never panics.
fn delete_namespace(name: &str) {
    let ok = Command::new("ip")
        .args(["netns", "del", name])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("warning: could not delete network namespace {name}; `ip netns del {name}`");
    }
}

/// A network namespace of its own, deleted (with its interfaces) on drop; it derefs to its
/// [`Ns`].
#[derive(Debug)]
pub struct Netns(Ns);

impl Netns {
    /// A new namespace named `<prefix><unique suffix>` ([`Ns::create`]).
    pub fn new(prefix: &str) -> Netns {
        Netns(Ns::create(&unique(prefix)))
    }
}

impl std::ops::Deref for Netns {
    type Target = Ns;
    fn deref(&self) -> &Ns {
        &self.0
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        delete_namespace(&self.0.name);
    }
}

/// Owns everything a test makes and removes it on drop, on success and failure alike, in
/// order: its processes killed (`children`, then `node`), the runtime stopped (joining its
/// workers), the TAP ports closed (which deletes the devices, wherever they are), the `links`
/// left in the test's own namespace deleted, the `namespaces` deleted (with the veths and
/// bridges inside), each of `logs` printed if the test is failing, `dir` removed. Never
/// panics.
#[derive(Default)]
pub struct Guard {
    /// A process the test stops and starts again (a node), killed after `children`.
    pub node: Option<Child>,
    /// Every other process: servers, clients, more nodes.
    pub children: Vec<Child>,
    /// The runtime driving the ports.
    pub rt: Option<Runtime>,
    /// The ports the test opened.
    pub ports: Vec<(PortId, Arc<dyn Port>)>,
    /// Links in the test's own namespace (a TAP a node left there).
    pub links: Vec<String>,
    /// Namespaces made with [`Guard::ns`].
    pub namespaces: Vec<String>,
    /// The logs worth reading when the test fails.
    pub logs: Vec<PathBuf>,
    /// The test's directory (configs, sockets, state, logs); empty for none.
    pub dir: PathBuf,
}

impl Guard {
    /// A guard for the test's directory `dir` (created) and the `log` worth reading when it
    /// fails; [`Guard::default`] has neither.
    pub fn new(dir: &Path, log: &Path) -> Guard {
        std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let mut g = Guard::default();
        g.logs.push(log.to_path_buf());
        g.dir = dir.to_path_buf();
        g
    }

    /// Creates namespace `name` ([`Ns::create`]), deleted on drop.
    pub fn ns(&mut self, name: &str) -> Ns {
        let ns = Ns::create(name);
        self.namespaces.push(ns.name.clone());
        ns
    }

    /// Starts `args` as a server that prints `ready` once it listens; its later output lines
    /// are printed prefixed with `label` when `TAPYARD_E2E_VERBOSE` is set. Killed on drop;
    /// returns its index for [`Guard::kill_child`].
    pub fn spawn_server(&mut self, label: &str, args: &[&str]) -> usize {
        let lines = self.spawn_ready(label, args);
        let label = label.to_string();
        std::thread::spawn(move || {
            for line in lines {
                if std::env::var_os("TAPYARD_E2E_VERBOSE").is_some() {
                    println!("  [{label}] {line}");
                }
            }
        });
        self.children.len() - 1
    }

    /// Like [`Guard::spawn_server`], for a server that reports: its output lines after
    /// `ready` come through the receiver (what it received, from whom).
    pub fn spawn_reporting_server(&mut self, label: &str, args: &[&str]) -> mpsc::Receiver<String> {
        self.spawn_ready(label, args)
    }

    /// Starts `args` (killed on drop), waits up to [`CMD_TIMEOUT`] for its first output line,
    /// which must be `ready`, and returns the receiver of the lines after it.
    fn spawn_ready(&mut self, label: &str, args: &[&str]) -> mpsc::Receiver<String> {
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
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let ready = rx
            .recv_timeout(CMD_TIMEOUT)
            .unwrap_or_else(|_| panic!("{label} did not start"));
        assert_eq!(ready, "ready", "unexpected output from {label}");
        rx
    }

    /// Kills the child at `idx` (from [`Guard::spawn_server`]) and waits for it; the slot
    /// stays so later indices remain valid.
    pub fn kill_child(&mut self, idx: usize) {
        let c = &mut self.children[idx];
        let _ = c.kill();
        let _ = c.wait();
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        for c in self.children.iter_mut().chain(self.node.as_mut()) {
            let _ = c.kill();
            let _ = c.wait();
        }
        if let Some(rt) = self.rt.take() {
            rt.stop();
        }
        self.ports.clear();
        clean_up(
            std::iter::empty(),
            &self.links,
            &self.namespaces,
            &self.logs,
            &self.dir,
        );
    }
}

/// Starts a long-running `args` inside namespace `ns` (output discarded) into `children`
/// (a [`Guard`]'s kill it on drop).
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

/// What a test leaves behind, undone (what [`Guard`] does on drop, for a test that keeps
/// its own): kills `procs`, deletes `links` (in the test's own namespace) and `namespaces`
/// (with the devices in them), prints each of `logs` if the test is failing, removes `dir`
/// (unless empty). Never panics.
pub fn clean_up<'a>(
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
    for link in links {
        let _ = Command::new("ip")
            .args(["link", "del", link])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
    for ns in namespaces {
        delete_namespace(ns);
    }
    if std::thread::panicking() {
        for log in logs {
            if let Ok(text) = std::fs::read_to_string(log) {
                eprintln!("---- {} ----\n{text}---- end ----", log.display());
            }
        }
    }
    if !dir.as_os_str().is_empty() {
        let _ = std::fs::remove_dir_all(dir);
    }
}
