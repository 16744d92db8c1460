//! A real container runtime drives `tapyard-cni`: podman (CNI network backend, `runc`) runs
//! busybox containers on a network whose conflist names `tapyard-cni`, against a real
//! `tapyard run`.
//!
//! ```text
//!  podman containers a, b (eth0 = a TAP tapyard made, moved into podman's netns and renamed)
//!     └─ bridge cni0 (gateway 10.246.1.1/24, host-local IPAM) ┐
//!                                                             ├ tapyard node (own namespace), uplink 10.247.0.2/24
//!  web namespace: the uplink TAP, 10.247.0.3/24; busybox httpd on 10.246.2.2:8080 (lo) ──┘
//!  ClusterIP Service web 10.96.0.80:80 -> 10.246.2.2:8080
//! ```
//!
//! Checked: `podman run --network` gets each container an address from host-local and a port
//! on cni0 (`tapyard show ports --json`: owner `<container id>/eth0`, podman's netns path, the
//! container's MAC); the containers ping each other and the gateway; busybox `wget` in each
//! fetches the page from the Service's ClusterIP; `podman rm` removes that container's port
//! and lease while the other keeps working; with both gone only the uplink is left.
//!
//! The image is made here: a tarball of Debian's `busybox-static` (`/bin/busybox` and a symlink
//! per applet) loaded with `podman import`; no registry is needed.
//!
//! Nothing global is changed (beyond what podman itself writes outside its root: the CNI
//! result cache /var/lib/cni/results, emptied by each DEL, and the image library's blob-info
//! cache under /var/lib/containers/cache): every podman call gets a private `--root`,
//! `--runroot`, `--tmpdir` and `--network-config-dir`, and `CONTAINERS_CONF` points at a
//! containers.conf in the test's directory that names the CNI plugin directory (tapyard-cni
//! and a link to host-local) and the ulimits. What works on the 2-core development machines
//! (learnt first with the reference `bridge` plugin):
//!
//! ```text
//! podman --root D/root --runroot D/runroot --storage-driver vfs --tmpdir D/tmp \
//!        --runtime runc --network-backend cni --network-config-dir D/net.d \
//!        --cgroup-manager cgroupfs --events-backend file \
//!        run -d --network NET IMAGE sleep 600          # with CONTAINERS_CONF=D/containers.conf
//! ```
//!
//! * `crun` is refused the cgroups it wants; `runc` works.
//! * podman's default ulimits for root (nofile and nproc 1048576) are above the sandbox's hard
//!   limits, so runc fails with "error setting rlimit type 7 (then 6): operation not
//!   permitted" (`--ulimit host` does not help in podman 4.3): containers.conf sets
//!   `default_ulimits` to nofile and nproc 1024.
//! * `vfs` storage leaves no mount behind (overlay keeps a bind mount of its home after
//!   `podman rm`); the image is 2 MB, so copying it is cheap.
//! * busybox 1.35's static `wget -T` segfaults: the time limit is busybox `timeout`.
//!
//! Needs root, `podman`, `runc`, `ip`, `tar`, a static `/bin/busybox` and host-local
//! (`$TAPYARD_CNI_PLUGINS`, `/usr/lib/cni` or `/opt/cni/bin`). Without them it prints why and
//! passes, except with `CI=true`, where it fails. A guard removes the containers, the image
//! and podman's storage, the node, the namespaces and the directory on success and failure
//! alike.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_tapyard");
const SUBNET: &str = "10.246.1.0/24";
const GW: &str = "10.246.1.1";
const UPLINK: &str = "10.247.0.2";
const WEB_HOST: &str = "10.247.0.3";
const WEB_POD: &str = "10.246.2.2";
const WEB_VIP: &str = "10.96.0.80";
/// The CNI network's name (the conflist's `name`, and host-local's lease directory).
const NET: &str = "tapyard-e2e";
const IMAGE: &str = "localhost/tapyard-busybox:e2e";
/// What the web server serves.
const PAGE: &str = "hello from behind the Service";

/// Whether the ELF file at `path` has no program interpreter (a static executable).
fn is_static_elf(path: &Path) -> bool {
    let Ok(b) = std::fs::read(path) else {
        return false;
    };
    if b.len() < 64 || &b[..4] != b"\x7fELF" || b[4] != 2 {
        return false;
    }
    let u16_at = |o: usize| usize::from(u16::from_le_bytes([b[o], b[o + 1]]));
    let Ok(phoff) = usize::try_from(u64::from_le_bytes(b[0x20..0x28].try_into().unwrap())) else {
        return false;
    };
    let (phentsize, phnum) = (u16_at(0x36), u16_at(0x38));
    (0..phnum).all(|i| {
        let o = phoff + i * phentsize;
        // PT_INTERP = 3
        b.get(o..o + 4) != Some(&3u32.to_le_bytes()[..])
    })
}

/// Why this machine cannot run the test, if it cannot.
fn skip_reason() -> Option<String> {
    missing(&[
        ("podman", "--version"),
        ("runc", "--version"),
        ("tar", "--version"),
    ])
    .or_else(|| {
        (!is_static_elf(Path::new("/bin/busybox")))
            .then(|| "/bin/busybox is missing or not static (Debian's busybox-static)".into())
    })
    .or_else(|| {
        plugin_dir().is_none().then(|| {
            "host-local not found in $TAPYARD_CNI_PLUGINS, /usr/lib/cni or /opt/cni/bin".into()
        })
    })
}

/// Prints why the test is skipped, or fails under `CI=true`.
fn skip() -> bool {
    skip_or_fail("podman", skip_reason())
}

/// The `tapyard-cni` binary beside `tapyard`, built (same profile) if it is not there yet.
fn plugin_exe() -> PathBuf {
    let dir = Path::new(BIN).parent().expect("the binary's directory");
    let exe = dir.join("tapyard-cni");
    let mut cmd = Command::new(env!("CARGO"));
    cmd.args(["build", "-q", "-p", "tapyard-cni", "--manifest-path"])
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.toml"));
    if dir.ends_with("release") {
        cmd.arg("--release");
    }
    let st = cmd.status().expect("run cargo build -p tapyard-cni");
    assert!(
        st.success() && exe.is_file(),
        "cannot build {}",
        exe.display()
    );
    exe
}

/// Everything the test made; removed on drop in order: the containers (podman runs the
/// plugin's DEL while the node still answers), the image, podman's mounts and any netns it
/// left, the node and the web server, the namespaces, the directory.
struct Env {
    tag: String,
    dir: PathBuf,
    ns_node: String,
    ns_web: String,
    namespaces: Vec<String>,
    node: Option<Child>,
    children: Vec<Child>,
    /// The containers' netns paths, removed on drop if podman left them.
    sandboxes: Vec<String>,
    podman_used: bool,
    socket: PathBuf,
    log: PathBuf,
}

impl Env {
    fn new() -> Env {
        let tag = format!("{}", std::process::id() % 100_000);
        let dir = std::env::temp_dir().join(format!("typm-{tag}"));
        let _ = std::fs::remove_dir_all(&dir);
        for d in ["cni-bin", "net.d", "tmp", "ipam", "www", "rootfs/bin"] {
            std::fs::create_dir_all(dir.join(d)).unwrap();
        }
        Env {
            ns_node: format!("typm-node-{tag}"),
            ns_web: format!("typm-web-{tag}"),
            socket: dir.join("ctl.sock"),
            log: dir.join("run.log"),
            tag,
            dir,
            namespaces: Vec::new(),
            node: None,
            children: Vec::new(),
            sandboxes: Vec::new(),
            podman_used: false,
        }
    }

    fn ns(&mut self, name: &str) {
        run(&["ip", "netns", "add", name]);
        self.namespaces.push(name.to_string());
        run(&["ip", "-n", name, "link", "set", "lo", "up"]);
    }

    /// `tapyard run` in its own namespace: bridge cni0 (no ports in the file), an uplink to
    /// the web namespace, the route to the web pod and the Service; then the web namespace
    /// with busybox httpd.
    fn start_node(&mut self) {
        let (node_ns, web_ns) = (self.ns_node.clone(), self.ns_web.clone());
        self.ns(&node_ns);
        self.ns(&web_ns);
        let config = self.dir.join("node.toml");
        std::fs::write(
            &config,
            format!(
                r#"[node]
name = "podman-{tag}"
cluster_cidr = "10.246.0.0/16"
socket = "{socket}"
state_dir = "{state}"
workers = 2

[[bridge]]
name = "cni0"
address = "{GW}/24"

[[uplink]]
name = "up0"
address = "{UPLINK}/24"

[[route]]
to = "10.246.2.0/24"
via = "{WEB_HOST}"

[[service]]
name = "web"
cluster_ip = "{WEB_VIP}"
protocol = "tcp"
port = 80
endpoints = ["{WEB_POD}:8080"]
"#,
                tag = self.tag,
                socket = self.socket.display(),
                state = self.socket.with_file_name("state").display(),
            ),
        )
        .unwrap();
        let log = std::fs::File::create(&self.log).unwrap();
        self.node = Some(
            Command::new("ip")
                .args(["netns", "exec", &node_ns, BIN, "run"])
                .arg(&config)
                .env("RUST_LOG", "info")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("start tapyard run"),
        );
        wait_for_socket(self.node.as_mut(), &self.socket);
        run(&["ip", "-n", &node_ns, "link", "set", "up0", "netns", &web_ns]);
        for args in [
            vec!["addr", "add", "10.247.0.3/24", "dev", "up0"],
            vec!["link", "set", "up0", "up"],
            vec!["addr", "add", "10.246.2.2/32", "dev", "lo"],
            vec!["route", "add", "10.246.1.0/24", "via", UPLINK],
        ] {
            let mut v = vec!["ip", "-n", &web_ns];
            v.extend(args);
            run(&v);
        }
        let www = self.dir.join("www");
        std::fs::write(www.join("index.html"), format!("{PAGE}\n")).unwrap();
        let www = www.display().to_string();
        spawn_in(
            &mut self.children,
            &web_ns,
            &[
                "/bin/busybox",
                "httpd",
                "-f",
                "-p",
                &format!("{WEB_POD}:8080"),
                "-h",
                &www,
            ],
        );
        wait_listening(&web_ns, 8080);
    }

    /// The CNI plugin directory (tapyard-cni, host-local), the conflist and containers.conf.
    fn write_podman_config(&self) {
        let bin = self.dir.join("cni-bin");
        std::fs::copy(plugin_exe(), bin.join("tapyard-cni")).expect("copy tapyard-cni");
        std::os::unix::fs::symlink(
            plugin_dir().unwrap().join("host-local"),
            bin.join("host-local"),
        )
        .unwrap();
        let conflist = serde_json::json!({
            "cniVersion": "1.0.0",
            "name": NET,
            "plugins": [{
                "type": "tapyard-cni",
                "bridge": "cni0",
                "socket": self.socket.display().to_string(),
                "mtu": 1500,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": SUBNET, "gateway": GW}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": self.dir.join("ipam").display().to_string(),
                }
            }]
        });
        std::fs::write(
            self.dir.join(format!("net.d/{NET}.conflist")),
            serde_json::to_string_pretty(&conflist).unwrap(),
        )
        .unwrap();
        std::fs::write(
            self.dir.join("containers.conf"),
            format!(
                r#"[containers]
# podman's defaults for root (1048576) are above this machine's hard limits: runc fails.
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"

[network]
network_backend = "cni"
cni_plugin_dirs = ["{bin}"]
network_config_dir = "{netd}"
"#,
                bin = bin.display(),
                netd = self.dir.join("net.d").display(),
            ),
        )
        .unwrap();
    }

    /// `podman` with the private storage and configuration, then `args`.
    fn podman(&mut self, args: &[&str]) -> Output {
        self.podman_used = true;
        podman_cmd(&self.dir, args)
    }

    fn podman_ok(&mut self, args: &[&str]) -> String {
        let out = self.podman(args);
        assert!(
            out.status.success(),
            "podman {args:?} failed ({}):\nstdout: {}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The image: /bin/busybox and a symlink per applet in /bin, plus /tmp, imported.
    fn build_image(&mut self) {
        let rootfs = self.dir.join("rootfs");
        std::fs::copy("/bin/busybox", rootfs.join("bin/busybox")).unwrap();
        let list = run(&["/bin/busybox", "--list"]);
        for applet in list.lines().map(str::trim).filter(|a| !a.is_empty()) {
            if applet != "busybox" {
                std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet)).unwrap();
            }
        }
        for d in ["tmp", "etc", "proc", "sys", "dev"] {
            std::fs::create_dir_all(rootfs.join(d)).unwrap();
        }
        let tarball = self.dir.join("busybox.tar").display().to_string();
        run(&[
            "tar",
            "-C",
            &rootfs.display().to_string(),
            "-cf",
            &tarball,
            ".",
        ]);
        self.podman_ok(&["import", "-q", &tarball, IMAGE]);
    }

    fn tapyard_ok(&self, args: &[&str]) -> String {
        tapyard_ok_at(&self.socket, args)
    }

    fn ports(&self) -> Vec<Value> {
        let out = self.tapyard_ok(&["show", "ports", "--json"]);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("show ports --json: {e}:\n{out}"))
    }

    /// Leases host-local holds on the network.
    fn leases(&self) -> Vec<String> {
        leases(&self.dir.join("ipam").join(NET))
    }

    /// `podman run -d` a container that sleeps on the network; what `podman inspect` says.
    fn run_container(&mut self, name: &str) -> Container {
        let started = Instant::now();
        self.podman_ok(&[
            "run",
            "-d",
            "--name",
            name,
            "--network",
            NET,
            IMAGE,
            "sleep",
            "600",
        ]);
        let took = started.elapsed();
        let out = self.podman_ok(&["inspect", name]);
        let v: Value =
            serde_json::from_str(&out).unwrap_or_else(|e| panic!("podman inspect: {e}: {out}"));
        let c = &v[0];
        let net = &c["NetworkSettings"]["Networks"][NET];
        let ct = Container {
            name: name.to_string(),
            id: c["Id"].as_str().expect("Id").to_string(),
            ip: net["IPAddress"].as_str().expect("IPAddress").to_string(),
            mac: net["MacAddress"].as_str().expect("MacAddress").to_string(),
            sandbox: c["NetworkSettings"]["SandboxKey"]
                .as_str()
                .expect("SandboxKey")
                .to_string(),
        };
        self.sandboxes.push(ct.sandbox.clone());
        println!(
            "podman run {name}: {} {} in {} ({took:?})",
            ct.ip, ct.mac, ct.sandbox
        );
        ct
    }

    /// `podman exec NAME ARGS`: its output, whatever the status.
    fn exec(&mut self, name: &str, args: &[&str]) -> Output {
        let mut v = vec!["exec", name];
        v.extend_from_slice(args);
        self.podman(&v)
    }

    fn ping_ok(&mut self, from: &str, to: &str) {
        let out = self.exec(from, &["ping", "-c", "3", "-i", "0.2", "-W", "2", to]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains(" 0% packet loss"),
            "ping {from} -> {to} failed ({}):\n{text}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        println!("ping {from} -> {to}: ok");
    }

    /// busybox wget of the Service's page (busybox's own `-T` crashes: `timeout` bounds it).
    fn fetch_ok(&mut self, from: &str) {
        let url = format!("http://{WEB_VIP}/");
        let out = self.exec(from, &["timeout", "10", "wget", "-q", "-O", "-", &url]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.trim() == PAGE,
            "wget {url} in {from} ({}): {text:?} {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        println!("wget {url} in {from}: {:?}", text.trim());
    }
}

/// `podman` with the test's private storage and configuration under `dir`, started.
fn podman_child(dir: &Path, args: &[&str]) -> std::io::Result<Child> {
    let d = |s: &str| dir.join(s).display().to_string();
    Command::new("podman")
        .args(["--root", &d("root"), "--runroot", &d("runroot")])
        .args(["--storage-driver", "vfs", "--tmpdir", &d("tmp")])
        .args(["--runtime", "runc", "--network-backend", "cni"])
        .args(["--network-config-dir", &d("net.d")])
        .args(["--cgroup-manager", "cgroupfs", "--events-backend", "file"])
        .args(args)
        .env("CONTAINERS_CONF", d("containers.conf"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
}

/// `podman ARGS` to completion (at most [`CMD_TIMEOUT`]).
fn podman_cmd(dir: &Path, args: &[&str]) -> Output {
    let child = podman_child(dir, args).expect("run podman");
    wait_output(child, CMD_TIMEOUT, &format!("podman {}", args.join(" ")))
}

/// For the guard: `podman ARGS`, at most 30 s, never panicking; failures are printed.
fn podman_cleanup(dir: &Path, args: &[&str]) {
    let Ok(mut child) = podman_child(dir, args) else {
        return;
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                break;
            }
        }
    }
    if let Ok(out) = child.wait_with_output() {
        if !out.status.success() {
            eprintln!(
                "cleanup: podman {args:?} ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        if self.podman_used {
            podman_cleanup(&self.dir, &["rm", "-a", "-f", "-t", "0"]);
            podman_cleanup(&self.dir, &["rmi", "-a", "-f"]);
            // Whatever podman still has mounted under the directory (deepest first).
            let root = self.dir.display().to_string();
            let below = format!("{root}/");
            let mut mounts: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
                .filter(|m| *m == root || m.starts_with(&below))
                .collect();
            mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
            for m in mounts {
                eprintln!("cleanup: unmounting {m}");
                let _ = Command::new("umount").args(["-l", &m]).status();
            }
            for sb in &self.sandboxes {
                if Path::new(sb).exists() {
                    eprintln!("cleanup: podman left {sb}");
                    let _ = Command::new("umount").arg(sb).status();
                    let _ = std::fs::remove_file(sb);
                }
            }
        }
        let procs = self.children.iter_mut().chain(self.node.as_mut());
        tear_down(procs, &self.namespaces, &self.log, &self.dir);
    }
}

/// A running container, from `podman inspect`.
struct Container {
    name: String,
    id: String,
    ip: String,
    mac: String,
    sandbox: String,
}

impl Container {
    fn owner(&self) -> String {
        format!("{}/eth0", self.id)
    }
}

#[test]
#[cfg_attr(
    not(tapyard_root),
    ignore = "needs root: TAP devices and network namespaces (runs as root, as in CI)"
)]
fn podman_containers_on_a_tapyard_cni_network() {
    if skip() {
        return;
    }
    let started = Instant::now();
    let mut env = Env::new();
    env.start_node();
    env.write_podman_config();
    env.build_image();
    let nets = env.podman_ok(&["network", "ls", "--format", "{{.Name}} {{.Driver}}"]);
    assert!(nets.contains(&format!("{NET} tapyard-cni")), "{nets}");

    let a = env.run_container(&format!("typm-a-{}", env.tag));
    let b = env.run_container(&format!("typm-b-{}", env.tag));
    assert_ne!(a.ip, b.ip);
    let mut leases = env.leases();
    leases.sort();
    let mut want = vec![a.ip.clone(), b.ip.clone()];
    want.sort();
    assert_eq!(leases, want);

    // Each container has its port on cni0, named by podman's container id.
    let ports = env.ports();
    for c in [&a, &b] {
        let p = ports
            .iter()
            .find(|p| p["owner"] == c.owner().as_str())
            .unwrap_or_else(|| panic!("no port for {}: {ports:?}", c.name));
        assert_eq!(p["kind"], "pod", "{p}");
        assert_eq!(p["origin"], "cni", "{p}");
        assert_eq!(p["bridge"], "cni0", "{p}");
        assert_eq!(p["ifname"], "eth0", "{p}");
        assert_eq!(p["netns"], c.sandbox.as_str(), "{p}");
        assert_eq!(p["mac"], c.mac.as_str(), "{p}");
        // The container sees the address host-local gave and the default route.
        let addr = env.exec(&c.name, &["ip", "-4", "-o", "addr", "show", "eth0"]);
        let addr = String::from_utf8_lossy(&addr.stdout);
        assert!(addr.contains(&format!("inet {}/24", c.ip)), "{addr}");
        let routes = env.exec(&c.name, &["ip", "route"]);
        let routes = String::from_utf8_lossy(&routes.stdout);
        assert!(
            routes.contains(&format!("default via {GW} dev eth0")),
            "{routes}"
        );
    }
    assert_eq!(ports.len(), 3, "uplink and two pods: {ports:?}");

    env.ping_ok(&a.name, &b.ip);
    env.ping_ok(&b.name, &a.ip);
    env.ping_ok(&a.name, GW);
    env.fetch_ok(&a.name);
    env.fetch_ok(&b.name);
    let stats: Value = serde_json::from_str(&env.tapyard_ok(&["show", "stats", "--json"])).unwrap();
    assert!(stats["nat"]["dnat"].as_u64().unwrap_or(0) >= 2, "{stats}");
    let ports = env.ports();
    let pa = ports
        .iter()
        .find(|p| p["owner"] == a.owner().as_str())
        .unwrap();
    assert!(
        pa["rx_packets"].as_u64().unwrap() > 0 && pa["tx_packets"].as_u64().unwrap() > 0,
        "{pa}"
    );
    println!("show ports:\n{}", env.tapyard_ok(&["show", "ports"]));

    // podman rm: the plugin's DEL removes a's port and lease; b keeps working.
    env.podman_ok(&["rm", "-f", "-t", "0", &a.name]);
    let ports = env.ports();
    assert!(
        !ports.iter().any(|p| p["owner"] == a.owner().as_str()),
        "a's port is still there after podman rm: {ports:?}"
    );
    assert!(
        ports.iter().any(|p| p["owner"] == b.owner().as_str()),
        "{ports:?}"
    );
    assert_eq!(env.leases(), vec![b.ip.clone()]);
    assert!(!Path::new(&a.sandbox).exists(), "{} is left", a.sandbox);
    env.ping_ok(&b.name, GW);
    env.fetch_ok(&b.name);

    env.podman_ok(&["rm", "-f", "-t", "0", &b.name]);
    let ports = env.ports();
    assert_eq!(ports.len(), 1, "{ports:?}");
    assert_eq!(ports[0]["kind"], "uplink");
    assert!(env.leases().is_empty(), "{:?}", env.leases());
    let ps = env.podman_ok(&["ps", "-a", "-q"]);
    assert!(ps.trim().is_empty(), "{ps}");
    let log = std::fs::read_to_string(&env.log).unwrap();
    assert!(
        log.contains(&format!("({}) added to bridge cni0", a.owner())),
        "{log}"
    );
    println!("podman end to end: {:?}", started.elapsed());
}
