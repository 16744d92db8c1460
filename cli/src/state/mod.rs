//! What outlives the process: the record of the node's ports in `<state_dir>/ports.json`,
//! the network namespaces they were moved to, and the MAC addresses derived from names.
//!
//! tapyard's TAPs are persistent ([`tapyard::port::TapPort::set_persist`]): a crash, a
//! `kill -9` or a clean stop leaves every pod's interface in place. The record says where each
//! one is, so that the next `tapyard run` re-attaches to it instead of creating a new one:
//!
//! ```json
//! {"version": 1, "node": "node-a", "ports": [
//!   {"name": "ty1a2b3c4d", "tap": "ty1a2b3c4d", "ifname": "eth0", "mac": "0a:58:...",
//!    "kind": "pod", "bridge": "cni0", "origin": "cni", "owner": "ctr1/eth0",
//!    "netns": {"path": "/var/run/netns/pod1", "dev": 4, "ino": 4026532301},
//!    "ifindex": 2, "offload": false}]}
//! ```
//!
//! `netns` is absent for a TAP in tapyard's own namespace. A namespace is identified by the
//! device and inode of its nsfs file (what `stat /var/run/netns/pod1` shows), which do not
//! change while it exists; the path is how it was reached (`/var/run/netns/X`,
//! `/proc/PID/ns/net`) and is checked against them. Inode numbers are reused once a namespace
//! is gone, so a TAP found again is confirmed by its ifindex and MAC.
//!
//! The file is written atomically (a temporary file, then `rename`), so a crash leaves the old
//! record or the new one. A file that cannot be trusted (truncated, not JSON, another version,
//! another node's) is set aside with a log line saying why, and the node starts as if there
//! were none: the ports it lists are not re-attached (a config port is created again).

use std::fs::File;
use std::hash::Hasher;
use std::io::{self, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tapyard::MacAddr;

pub mod secure;

/// Where a port came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Origin {
    /// A bridge's `ports` or an uplink in the config file: a reload adds and removes it.
    Config,
    /// `tapyard port add`: a reload never touches it.
    Command,
    /// The CNI plugin (`port_add` with an owner): a reload never touches it.
    Cni,
}

impl Origin {
    /// Its name in `show ports`.
    pub fn name(self) -> &'static str {
        match self {
            Origin::Config => "config",
            Origin::Command => "port add",
            Origin::Cni => "cni",
        }
    }
}

/// What a port is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// A bridge port (a pod's interface, or anything plugged into the bridge).
    Pod,
    /// An uplink's TAP (a router interface of its own).
    Uplink,
    /// The host port's TAP (`[[host]]`: a router interface whose other side is the node's
    /// own IP stack).
    Host,
}

impl Kind {
    /// Its name in `show ports`.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Pod => "pod",
            Kind::Uplink => "uplink",
            Kind::Host => "host",
        }
    }
}

/// The takeover socket's file name in the state directory ([`crate::takeover`]).
pub const TAKEOVER_SOCKET: &str = "takeover.sock";

/// The record's format version.
pub const VERSION: u32 = 1;

/// The record's file name in the state directory.
pub const PORTS_FILE: &str = "ports.json";

/// A record larger than this is refused (4096 ports take well under 2 MiB).
pub const MAX_RECORD_BYTES: u64 = 16 << 20;

/// The identity of a network namespace: the device and inode of its nsfs file.
pub type NsId = (u64, u64);

/// Where a port's interface lives, when not in tapyard's namespace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetnsRecord {
    /// How the namespace was reached (`/var/run/netns/X`, `/proc/PID/ns/net`).
    pub path: String,
    /// The nsfs file's device.
    pub dev: u64,
    /// The nsfs file's inode.
    pub ino: u64,
}

impl NetnsRecord {
    /// Its identity.
    pub fn id(&self) -> NsId {
        (self.dev, self.ino)
    }
}

/// One port of the record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortRecord {
    /// tapyard's name for it (the datapath port's).
    pub name: String,
    /// The TAP's name when it was created.
    pub tap: String,
    /// Its name where it lives now.
    pub ifname: String,
    /// Its MAC, `aa:bb:cc:dd:ee:ff`.
    pub mac: String,
    /// Bridge port or uplink.
    pub kind: Kind,
    /// Its bridge (none for an uplink).
    pub bridge: Option<String>,
    /// Where it came from.
    pub origin: Origin,
    /// The CNI owner key.
    pub owner: Option<String>,
    /// The namespace it was moved to (absent: tapyard's own).
    pub netns: Option<NetnsRecord>,
    /// Its ifindex in that namespace.
    pub ifindex: u32,
    /// Opened with a virtio-net header (it must be opened again the same way).
    pub offload: bool,
    /// The addresses its spoof guard allows (absent: none, no guard).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ips: Vec<std::net::IpAddr>,
}

/// The whole file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Record {
    /// [`VERSION`].
    pub version: u32,
    /// The node's name.
    pub node: String,
    /// The namespace tapyard ran in (its ports without `netns` live there).
    #[serde(default)]
    pub own_netns: Option<NetnsRecord>,
    /// Its ports.
    pub ports: Vec<PortRecord>,
}

/// A node's state directory: where its record is written, and what identifies the node and
/// its namespace.
#[derive(Debug)]
pub struct StateDir {
    /// The directory (`[node] state_dir`).
    pub dir: PathBuf,
    /// The node's name (recorded, and the seed of derived MACs).
    pub node: String,
    /// tapyard's own network namespace.
    pub own_ns: Option<NsId>,
    write: std::sync::Mutex<()>,
}

impl StateDir {
    /// The state directory `dir` of node `node`.
    pub fn new(dir: PathBuf, node: &str) -> StateDir {
        StateDir {
            dir,
            node: node.to_string(),
            own_ns: own_ns().ok(),
            write: std::sync::Mutex::new(()),
        }
    }

    /// This process's namespace as the record names it.
    pub fn own_netns(&self) -> Option<NetnsRecord> {
        self.own_ns.map(|(dev, ino)| NetnsRecord {
            path: format!("/proc/{}/ns/net", std::process::id()),
            dev,
            ino,
        })
    }

    /// Serialises writes of the record.
    pub fn lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.write.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The record's ports, or none when there is no record; a record that cannot be trusted
    /// is logged (saying why), set aside, and treated as none. When the record was written
    /// from another namespace than this process's (`tapyard cleanup` run elsewhere, a node
    /// moved), its ports without `netns` are placed in that one.
    pub fn load_ports(&self) -> Vec<PortRecord> {
        match load(&self.dir, &self.node) {
            Ok(Some(mut r)) => {
                if let Some(o) = r.own_netns.filter(|o| Some(o.id()) != self.own_ns) {
                    log::info!(
                        "the port record was written by a tapyard in another network namespace (inode {}): its ports there are looked for there",
                        o.ino
                    );
                    for p in r.ports.iter_mut().filter(|p| p.netns.is_none()) {
                        p.netns = Some(o.clone());
                    }
                }
                r.ports
            }
            Ok(None) => Vec::new(),
            Err(why) => {
                log::warn!(
                    "ignoring the port record {why}; set aside as {}.bad, starting without it (TAPs it listed are not re-attached)",
                    PORTS_FILE
                );
                set_aside(&self.dir);
                Vec::new()
            }
        }
    }
}

/// Reads `<dir>/ports.json`: `Ok(None)` when there is none, `Err(why)` when it cannot be
/// trusted (the caller logs it and starts afresh).
pub fn load(dir: &Path, node: &str) -> Result<Option<Record>, RecordError> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join(PORTS_FILE);
    // Not through a symbolic link, and only a file of ours that nobody else can write.
    let mut file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(&path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(RecordError::Open(e).at(&path)),
    };
    crate::state::secure::check_open(&path, &file).map_err(|e| RecordError::Unsafe(e).at(&path))?;
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    if len > MAX_RECORD_BYTES {
        return Err(RecordError::TooBig(len).at(&path));
    }
    let mut text = Vec::new();
    file.read_to_end(&mut text)
        .map_err(|e| RecordError::Read(e).at(&path))?;
    parse(&text, node).map(Some).map_err(|e| e.at(&path))
}

/// Why a port record is not used (the node starts as if there were none).
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// Not JSON, or not a record.
    #[error("not a valid record: {0}")]
    Json(#[source] serde_json::Error),
    /// No `version`.
    #[error("not a valid record: no version")]
    NoVersion,
    /// Another version's record.
    #[error("version {0}, this tapyard reads version {VERSION}")]
    Version(u64),
    /// Another node's record.
    #[error("the record of node {found:?}, not of {node:?}")]
    OtherNode {
        /// The record's node.
        found: String,
        /// This node.
        node: String,
    },
    /// The file cannot be opened.
    #[error("cannot open it: {0}")]
    Open(#[source] io::Error),
    /// The file is not safe to trust (a link, another owner, writable by others).
    #[error("{}", .0.why)]
    Unsafe(#[source] secure::Refused),
    /// Larger than [`MAX_RECORD_BYTES`].
    #[error("{0} bytes, more than the {MAX_RECORD_BYTES} a record may take")]
    TooBig(u64),
    /// The file cannot be read.
    #[error("{0}")]
    Read(#[source] io::Error),
    /// One of the above, about the file at `path`.
    #[error("{}: {source}", path.display())]
    At {
        /// The record's file.
        path: PathBuf,
        /// Why.
        #[source]
        source: Box<RecordError>,
    },
}

impl RecordError {
    /// The same error, about the file at `path`.
    fn at(self, path: &Path) -> RecordError {
        RecordError::At {
            path: path.to_path_buf(),
            source: Box::new(self),
        }
    }
}

/// Parses a record of node `node`.
pub fn parse(text: &[u8], node: &str) -> Result<Record, RecordError> {
    // The version first, so that another version's record is refused for that reason.
    let v: serde_json::Value = serde_json::from_slice(text).map_err(RecordError::Json)?;
    match v.get("version").and_then(serde_json::Value::as_u64) {
        Some(n) if n == u64::from(VERSION) => {}
        Some(n) => return Err(RecordError::Version(n)),
        None => return Err(RecordError::NoVersion),
    }
    let r: Record = serde_json::from_value(v).map_err(RecordError::Json)?;
    if r.node != node {
        return Err(RecordError::OtherNode {
            found: r.node,
            node: node.to_string(),
        });
    }
    Ok(r)
}

/// Writes `<dir>/ports.json` atomically (a temporary file in `dir`, synced, then renamed over
/// it), creating `dir` (mode 0700) if needed. The directory is checked first
/// ([`crate::state::secure::check_dir`]); the temporary file is created anew (`O_EXCL`, never
/// through a link) with mode 0600.
pub fn save(dir: &Path, r: &Record) -> io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    crate::state::secure::check_dir(dir, true).map_err(io::Error::other)?;
    let tmp = dir.join(format!("{PORTS_FILE}.tmp"));
    match std::fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)?;
    let mut text = serde_json::to_vec_pretty(r).map_err(io::Error::other)?;
    text.push(b'\n');
    f.write_all(&text)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, dir.join(PORTS_FILE))?;
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

/// Moves an untrusted record aside (`ports.json.bad`) so that it is looked at once, not at
/// every start; errors are ignored (the record is rewritten soon anyway).
pub fn set_aside(dir: &Path) {
    let _ = std::fs::rename(dir.join(PORTS_FILE), dir.join(format!("{PORTS_FILE}.bad")));
}

/// The identity of the namespace file at `path` (or of an open one).
pub fn ns_id(path: &Path) -> io::Result<NsId> {
    let m = std::fs::metadata(path)?;
    Ok((m.dev(), m.ino()))
}

/// The identity of an open namespace file.
pub fn ns_id_of(f: &File) -> io::Result<NsId> {
    let m = f.metadata()?;
    Ok((m.dev(), m.ino()))
}

/// The identity of tapyard's own network namespace.
pub fn own_ns() -> io::Result<NsId> {
    ns_id(Path::new("/proc/self/ns/net"))
}

/// A path to the namespace whose identity is `id`: a name under `/var/run/netns` (as `ip netns`
/// makes them), else `/proc/PID/ns/net` of a process that lives in it. `None` when no such
/// namespace is reachable (it is gone).
pub fn find_ns(id: NsId) -> Option<PathBuf> {
    for dir in ["/var/run/netns", "/run/netns"] {
        if let Ok(rd) = std::fs::read_dir(dir) {
            for e in rd.flatten() {
                if ns_id(&e.path()).ok() == Some(id) {
                    return Some(e.path());
                }
            }
        }
    }
    let rd = std::fs::read_dir("/proc").ok()?;
    for e in rd.flatten() {
        let name = e.file_name();
        if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let p = e.path().join("ns/net");
        if ns_id(&p).ok() == Some(id) {
            return Some(p);
        }
    }
    None
}

/// Opens the namespace a record names: at its path if that is still the same namespace, else
/// wherever it is reachable now. `None` when it is gone.
pub fn open_ns(r: &NetnsRecord) -> Option<(File, PathBuf)> {
    let at = |p: PathBuf| -> Option<(File, PathBuf)> {
        // Never blocks, and only a network namespace passes (the record may be stale).
        let f = tapyard_cni::netns::open(&p).ok()?;
        (ns_id_of(&f).ok()? == r.id()).then_some((f, p))
    };
    at(PathBuf::from(&r.path)).or_else(|| at(find_ns(r.id())?))
}

/// What a derived MAC is for: the two ends of a link must not share one (an uplink's router
/// interface and its TAP have the same name).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MacFor {
    /// A router interface of the node (a bridge's gateway, an uplink).
    Iface,
    /// A TAP device (the pod's end).
    Tap,
}

/// A MAC derived from the node's and the interface's names: locally administered, unicast,
/// the same at every start (so the pods' neighbour caches stay right across a restart) and,
/// with 40 bits of hash, different for different names. The hash is 64-bit FNV-1a, fixed
/// here so that an upgrade keeps the addresses.
pub fn stable_mac(what: MacFor, node: &str, name: &str) -> MacAddr {
    let mut h = Fnv1a::default();
    h.write(match what {
        MacFor::Iface => b"iface\0",
        MacFor::Tap => b"tap\0",
    });
    h.write(node.as_bytes());
    h.write(&[0]);
    h.write(name.as_bytes());
    let v = h.finish().to_be_bytes();
    // 0x0a: locally administered (bit 1), unicast (bit 0 clear), as 0a:58:... of the
    // Kubernetes bridge plugins.
    MacAddr([0x0a, v[0], v[1], v[2], v[3], v[4]])
}

/// 64-bit FNV-1a.
struct Fnv1a(u64);

impl Default for Fnv1a {
    fn default() -> Fnv1a {
        Fnv1a(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for Fnv1a {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Record {
        Record {
            version: VERSION,
            node: "node-a".into(),
            own_netns: None,
            ports: vec![PortRecord {
                name: "ty00000001".into(),
                tap: "ty00000001".into(),
                ifname: "eth0".into(),
                mac: "0a:00:00:00:00:01".into(),
                ips: vec!["10.244.1.5".parse().unwrap()],
                kind: Kind::Pod,
                bridge: Some("cni0".into()),
                origin: Origin::Cni,
                owner: Some("c1/eth0".into()),
                netns: Some(NetnsRecord {
                    path: "/var/run/netns/p1".into(),
                    dev: 4,
                    ino: 4026532301,
                }),
                ifindex: 2,
                offload: true,
            }],
        }
    }

    #[test]
    fn records_round_trip_and_bad_ones_say_why() {
        let dir = std::env::temp_dir().join(format!("tapyard-state-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(load(&dir, "node-a").ok(), Some(None));
        let r = sample();
        save(&dir, &r).unwrap();
        assert_eq!(load(&dir, "node-a").ok(), Some(Some(r.clone())));
        assert!(!dir.join("ports.json.tmp").exists());
        let err = load(&dir, "node-b").unwrap_err().to_string();
        assert!(err.contains("the record of node \"node-a\""), "{err}");

        let text = serde_json::to_string(&r).unwrap();
        for (bad, want) in [
            (text[..text.len() / 2].to_string(), "not a valid record"),
            ("\u{1}\u{2}garbage".to_string(), "not a valid record"),
            (text.replace("\"version\":1", "\"version\":7"), "version 7"),
            (text.replace("\"version\":1,", ""), "no version"),
            (
                text.replace("\"kind\":\"pod\"", "\"kind\":\"vm\""),
                "unknown variant `vm`",
            ),
            (
                text.replace("\"offload\"", "\"extra\":1,\"offload\""),
                "extra",
            ),
        ] {
            std::fs::write(dir.join(PORTS_FILE), &bad).unwrap();
            let err = load(&dir, "node-a").unwrap_err().to_string();
            assert!(err.contains(want), "{bad}: {err}");
            assert!(err.contains("ports.json"), "{err}");
        }
        set_aside(&dir);
        assert_eq!(load(&dir, "node-a").ok(), Some(None));
        assert!(dir.join("ports.json.bad").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn derived_macs_are_stable_unicast_local_and_distinct() {
        let a = stable_mac(MacFor::Iface, "node-a", "cni0");
        // Fixed: an upgrade must not change the gateway's MAC.
        assert_eq!(a, stable_mac(MacFor::Iface, "node-a", "cni0"));
        assert_eq!(a.0[0], 0x0a);
        assert_eq!(a.0[0] & 1, 0, "unicast");
        assert_eq!(a.0[0] & 2, 2, "locally administered");
        assert_ne!(a, stable_mac(MacFor::Iface, "node-b", "cni0"));
        assert_ne!(a, stable_mac(MacFor::Iface, "node-a", "cni1"));
        assert_ne!(a, stable_mac(MacFor::Tap, "node-a", "cni0"));
        assert_ne!(
            stable_mac(MacFor::Iface, "node-a", "b"),
            stable_mac(MacFor::Iface, "node-ab", "")
        );
        assert_eq!(
            stable_mac(MacFor::Iface, "node-a", "cni0").to_string(),
            "0a:e6:e4:2f:68:0b"
        );
    }
}
