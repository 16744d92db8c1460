//! Running the `tapyard-cni` plugin as a container runtime does (`CNI_*` environment, the
//! network configuration on stdin), for the end-to-end tests that attach pods with it.

#![allow(dead_code)] // each test binary uses its own subset

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use serde_json::Value;

use super::{plugin_dir, wait_output, CMD_TIMEOUT, TAPYARD};
/// What host-local leased, as the tests read it.
pub use tapyard_testkit::leases;

/// The `tapyard-cni` binary beside `tapyard`, built (same profile) if it is not there yet.
pub fn plugin_exe() -> PathBuf {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        let dir = Path::new(TAPYARD).parent().expect("the binary's directory");
        let exe = dir.join("tapyard-cni");
        let release = dir.ends_with("release");
        let mut cmd = Command::new(env!("CARGO"));
        cmd.args(["build", "-q", "-p", "tapyard-cni", "--manifest-path"])
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.toml"));
        if release {
            cmd.arg("--release");
        }
        let st = cmd.status().expect("run cargo build -p tapyard-cni");
        assert!(
            st.success() && exe.is_file(),
            "cannot build {}",
            exe.display()
        );
        exe
    })
    .clone()
}

/// One plugin run for container `container` in `/var/run/netns/<netns>` (`CNI_IFNAME=eth0`):
/// `(exit status success, stdout as JSON)`.
pub fn cni(cmd: &str, container: &str, netns: &str, conf: &Value) -> (bool, Value) {
    use std::io::Write;
    let dir = plugin_dir().expect("host-local");
    let mut child = Command::new(plugin_exe())
        .env("CNI_COMMAND", cmd)
        .env("CNI_CONTAINERID", container)
        .env("CNI_NETNS", format!("/var/run/netns/{netns}"))
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", &dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run tapyard-cni");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(conf.to_string().as_bytes())
        .unwrap();
    let out = wait_output(child, CMD_TIMEOUT, &format!("tapyard-cni {cmd}"));
    let text = String::from_utf8_lossy(&out.stdout);
    let v = if text.trim().is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{cmd}: {e}: {text}"))
    };
    (out.status.success(), v)
}

/// [`cni`], which must succeed.
pub fn cni_ok(cmd: &str, container: &str, netns: &str, conf: &Value) -> Value {
    let (ok, v) = cni(cmd, container, netns, conf);
    assert!(ok, "CNI {cmd} {container} failed: {v}");
    v
}

/// The plugin's network configuration, as the runtime hands it over: spec `version`, the
/// tapyard `bridge` at control `socket`, MTU 1500, `host-local` IPAM with `ranges` and
/// `routes` (JSON arrays, as in the spec) keeping its leases in `data_dir`.
pub fn net_conf(
    version: &str,
    bridge: &str,
    socket: &Path,
    ranges: Value,
    routes: Value,
    data_dir: &Path,
) -> Value {
    serde_json::json!({
        "cniVersion": version,
        "name": "tapyard",
        "type": "tapyard-cni",
        "bridge": bridge,
        "socket": socket.display().to_string(),
        "mtu": 1500,
        "ipam": {
            "type": "host-local",
            "ranges": ranges,
            "routes": routes,
            "dataDir": data_dir.display().to_string(),
        }
    })
}
