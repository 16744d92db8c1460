//! Test helpers: run the plugin as a runtime does, network namespaces that clean up after
//! themselves, a private host-local data directory, and a fake tapyard control server that
//! creates real TAPs.
//!
//! Root tests: a test that needs root (TAP devices, network namespaces) carries
//! `#[cfg_attr(not(tapyard_root), ignore = "needs root: ...")]`. The package's `build.rs` sets
//! `cfg(tapyard_root)` when the build runs as root (effective uid 0, unless
//! `TAPYARD_TEST_AS_USER=1`), so a user's `cargo test` lists these tests as `ignored` instead
//! of reporting `ok` for a test that did not run; as root (and in CI) they run. Running, they
//! still look for host-local ([`privileged`]) and skip, saying why, without it.

#![allow(dead_code, unused_imports)]

use serde_json::{json, Value};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use tapyard_testkit::{
    is_root as root, plugin_dir, run as sh, skip_or_fail, unique, Netns, Ns, TempDir,
};

/// Skips (returns `None` and says why) unless root and host-local are available; under
/// `CI=true` (where `.ci/run` installs both and runs as root) a test that cannot run fails.
pub fn privileged(test: &str) -> Option<PathBuf> {
    if !root() {
        return skip(test, "needs root (network namespaces and TAPs)");
    }
    plugin_dir().or_else(|| {
        skip(
            test,
            "host-local not found in $TAPYARD_CNI_PLUGINS, /usr/lib/cni or /opt/cni/bin \
             (apt-get install containernetworking-plugins)",
        )
    })
}

/// Says why `test` skips, or fails under `CI=true`.
pub fn skip<T>(test: &str, why: &str) -> Option<T> {
    skip_or_fail(test, Some(why.to_string()));
    None
}

/// `ip -n <ns> -j <args>` as JSON.
pub trait IpJson {
    /// `ip -n <ns> -j <args>` as JSON (`null` if not JSON).
    fn ip_json(&self, args: &[&str]) -> Value;
}

impl IpJson for Ns {
    fn ip_json(&self, args: &[&str]) -> Value {
        let mut cmd = vec!["-j"];
        cmd.extend_from_slice(args);
        serde_json::from_str(&self.ip(&cmd)).unwrap_or(Value::Null)
    }
}

/// The network configuration of the brief, with a private socket and host-local `dataDir`.
pub fn config(version: &str, socket: &str, data_dir: &Path) -> Value {
    json!({
        "cniVersion": version, "name": "tapyard", "type": "tapyard-cni", "bridge": "cni0",
        "socket": socket, "mtu": 1500,
        "ipam": {
            "type": "host-local",
            "ranges": [[{ "subnet": "10.244.1.0/24", "gateway": "10.244.1.1" }]],
            "routes": [{ "dst": "0.0.0.0/0" }],
            "dataDir": data_dir,
        }
    })
}

/// What one plugin run gave.
#[derive(Debug)]
pub struct Outcome {
    pub status: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Outcome {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("{e}: {self:?}"))
    }

    /// The error code, checking the object is a whole CNI error.
    pub fn error_code(&self) -> u64 {
        assert_ne!(self.status, 0, "expected a failure: {self:?}");
        let v = self.json();
        assert!(v["cniVersion"].is_string() && v["msg"].is_string(), "{v}");
        assert!(v.get("details").is_some(), "{v}");
        v["code"].as_u64().unwrap_or_else(|| panic!("no code: {v}"))
    }

    pub fn ok(&self) -> &Self {
        assert_eq!(self.status, 0, "{self:?}");
        self
    }
}

/// Runs the plugin with exactly `env` (nothing inherited but PATH) and `stdin`.
pub fn run_plugin(env: &[(&str, &str)], stdin: &str) -> Outcome {
    run_exe(Path::new(env!("CARGO_BIN_EXE_tapyard-cni")), env, stdin)
}

/// Runs the plugin as [`run_plugin`] does, but kills it and panics if it has not exited
/// within `limit`: a test of something that must not block fails instead of hanging.
pub fn run_plugin_within(env: &[(&str, &str)], stdin: &str, limit: Duration) -> Outcome {
    run_exe_within(
        Path::new(env!("CARGO_BIN_EXE_tapyard-cni")),
        env,
        stdin,
        Some(limit),
    )
}

/// Runs the executable `exe` as a runtime runs a plugin: exactly `env` (nothing inherited but
/// PATH), `stdin` written whole.
pub fn run_exe(exe: &Path, env: &[(&str, &str)], stdin: &str) -> Outcome {
    run_exe_within(exe, env, stdin, None)
}

/// [`run_exe`], killing `exe` and panicking if it runs longer than `limit`.
pub fn run_exe_within(
    exe: &Path,
    env: &[(&str, &str)],
    stdin: &str,
    limit: Option<Duration>,
) -> Outcome {
    let mut child = Command::new(exe)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {}: {e}", exe.display()));
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let Some(limit) = limit else {
        let out = child.wait_with_output().unwrap();
        return Outcome {
            status: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        };
    };
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut buf);
            }
            String::from_utf8_lossy(&buf).into_owned()
        })
    };
    let stdout = drain(child.stdout.take().map(|p| Box::new(p) as _));
    let stderr = drain(child.stderr.take().map(|p| Box::new(p) as _));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{} {env:?} still running after {limit:?}: killed (stderr: {})",
                exe.display(),
                stderr.join().unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Outcome {
        status: status.code().unwrap_or(-1),
        stdout: stdout.join().unwrap(),
        stderr: stderr.join().unwrap(),
    }
}

/// The `CNI_*` variables of one attachment.
pub struct Env {
    pub container_id: String,
    pub netns: String,
    pub ifname: String,
    pub path: String,
}

impl Env {
    pub fn vars<'a>(&'a self, command: &'a str) -> Vec<(&'a str, &'a str)> {
        vec![
            ("CNI_COMMAND", command),
            ("CNI_CONTAINERID", &self.container_id),
            ("CNI_NETNS", &self.netns),
            ("CNI_IFNAME", &self.ifname),
            ("CNI_PATH", &self.path),
            ("CNI_ARGS", "IgnoreUnknown=1;K8S_POD_NAME=web-0"),
        ]
    }
}

/// A port the fake server made.
#[derive(Debug, Clone)]
pub struct FakePort {
    pub netns: String,
    pub ifname: String,
    pub mac: String,
    pub ifindex: u32,
}

/// A fake tapyard: answers the control protocol on a Unix socket, making real TAPs with `ip`
/// and moving them into the requested namespace. Stops (and deletes what it made) on drop.
pub struct FakeTapyard {
    pub socket: PathBuf,
    pub ports: Arc<Mutex<HashMap<String, FakePort>>>,
    /// When set, port_add answers `ok:false` without creating anything.
    pub refuse: Arc<AtomicBool>,
    /// How long each request took to serve: `(cmd, time)`.
    pub served: Arc<Mutex<Vec<(String, std::time::Duration)>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl FakeTapyard {
    pub fn start(dir: &Path) -> FakeTapyard {
        let socket = dir.join("tapyard.sock");
        let listener = UnixListener::bind(&socket).unwrap();
        let ports = Arc::new(Mutex::new(HashMap::new()));
        let refuse = Arc::new(AtomicBool::new(false));
        let stop = Arc::new(AtomicBool::new(false));
        let served = Arc::new(Mutex::new(Vec::new()));
        let thread = {
            let (ports, refuse, stop) = (ports.clone(), refuse.clone(), stop.clone());
            let served = served.clone();
            std::thread::spawn(move || {
                for conn in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        break;
                    }
                    if let Ok(conn) = conn {
                        serve(conn, &ports, &refuse, &served);
                    }
                }
            })
        };
        FakeTapyard {
            socket,
            ports,
            refuse,
            served,
            stop,
            thread: Some(thread),
        }
    }

    pub fn socket(&self) -> &str {
        self.socket.to_str().unwrap()
    }
}

impl Drop for FakeTapyard {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = UnixStream::connect(&self.socket);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        for port in self.ports.lock().unwrap().values() {
            delete_port(port);
        }
    }
}

fn delete_port(port: &FakePort) {
    let _ = Command::new("nsenter")
        .args([
            &format!("--net={}", port.netns),
            "ip",
            "link",
            "del",
            &port.ifname,
        ])
        .stderr(Stdio::null())
        .status();
}

type Served = Mutex<Vec<(String, std::time::Duration)>>;

fn serve(
    conn: UnixStream,
    ports: &Mutex<HashMap<String, FakePort>>,
    refuse: &AtomicBool,
    served: &Served,
) {
    let mut line = String::new();
    if BufReader::new(&conn).read_line(&mut line).is_err() {
        return;
    }
    let start = std::time::Instant::now();
    let reply = match serde_json::from_str::<Value>(&line) {
        Ok(req) => {
            let reply = handle(&req, ports, refuse);
            let cmd = req["cmd"].as_str().unwrap_or_default().to_string();
            served.lock().unwrap().push((cmd, start.elapsed()));
            reply
        }
        Err(e) => json!({"ok": false, "error": format!("bad request: {e}")}),
    };
    let _ = (&conn).write_all(format!("{reply}\n").as_bytes());
}

fn handle(req: &Value, ports: &Mutex<HashMap<String, FakePort>>, refuse: &AtomicBool) -> Value {
    let s = |k: &str| req[k].as_str().unwrap_or_default().to_string();
    let owner = s("owner");
    let mut ports = ports.lock().unwrap();
    let info = |p: &FakePort| json!({"name": p.ifname, "ifindex": p.ifindex, "mac": p.mac, "bridge": "cni0", "netns": p.netns});
    match req["cmd"].as_str() {
        Some("port_add") => {
            if refuse.load(Ordering::SeqCst) {
                return json!({"ok": false, "error": "refused by the test"});
            }
            if ports.contains_key(&owner) {
                return json!({"ok": false, "error": format!("port {owner} exists")});
            }
            let tap = unique("tyt");
            let run = |args: &[&str]| {
                Command::new("ip")
                    .args(args)
                    .status()
                    .is_ok_and(|s| s.success())
            };
            if !run(&["tuntap", "add", "dev", &tap, "mode", "tap"]) {
                return json!({"ok": false, "error": "ip tuntap add failed"});
            }
            let read = |f: &str| std::fs::read_to_string(format!("/sys/class/net/{tap}/{f}"));
            let mac = read("address").unwrap_or_default().trim().to_string();
            let ifindex = read("ifindex")
                .unwrap_or_default()
                .trim()
                .parse()
                .unwrap_or(0);
            let (netns, ifname) = (s("netns"), s("ifname"));
            if !run(&["link", "set", "dev", &tap, "netns", &netns, "name", &ifname]) {
                let _ = run(&["link", "del", &tap]);
                return json!({"ok": false, "error": format!("cannot move {tap} into {netns}")});
            }
            let port = FakePort {
                netns,
                ifname,
                mac,
                ifindex,
            };
            let data = info(&port);
            ports.insert(owner, port);
            json!({"ok": true, "data": data})
        }
        Some("port_del") => {
            let removed = ports.remove(&owner).inspect(delete_port).is_some();
            json!({"ok": true, "data": {"removed": removed}})
        }
        Some("port_show") => match ports.get(&owner) {
            Some(p) => json!({"ok": true, "data": info(p)}),
            None => json!({"ok": false, "error": "no such port"}),
        },
        _ => json!({"ok": false, "error": "unknown cmd"}),
    }
}
