//! The node's ports: a registry of every TAP the node serves, and the ports added and removed
//! while it runs.
//!
//! A port comes from the config file (a bridge's `ports`, an uplink), from `tapyard port add`
//! (a TAP left in tapyard's namespace) or from the CNI plugin (`port_add` with a namespace):
//! tapyard creates the TAP, keeps its file descriptor, moves the device into the pod's
//! namespace and renames it there in one rtnetlink request, and reads back its ifindex and MAC
//! inside that namespace. A TAP made without `--mac` gets a MAC derived from the node's and the
//! port's names ([`crate::state::stable_mac`]).
//!
//! Once a port is in place its TAP is persistent, and the registry is written to
//! `<state_dir>/ports.json` ([`crate::state`]) at every change: the pods' interfaces outlive
//! the process (a crash, `kill -9`, a clean stop), and the next start re-attaches to each
//! where it lives now ([`reattach`]), renamed or not. tapyard follows its TAPs while it runs
//! ([`Node::refresh_ports`](crate::node::Node::refresh_ports): the namespace and name each has now, read from its fd), so that a
//! TAP moved and renamed by hand is found again too. Removing a port (`port del`, CNI DEL, a
//! reload that drops it) clears the persist flag before the last `Arc` of the device goes (the
//! runtime's and the registry's): the fd closes and the kernel deletes the device, in
//! whichever namespace it lives; [`Node::port_remove`](crate::node::Node::port_remove) waits until it is gone.
//!
//! Thread safety: the registry's entries sit behind a mutex held only to read or change the
//! list; adding and removing ports (and a reload's port changes) are serialised by a second
//! mutex, held for the whole change, so that name and owner checks and the change they guard
//! are one step.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tapyard::port::{Port, TapPort};
use tapyard::{Batch, BufPool, DropReason, PacketBuf, PortId};
use tapyard_cni::netlink::Link;
use tapyard_control::PortInfo;

use crate::capture::CaptureTap;

use crate::state::{NetnsRecord, NsId, PortRecord};

mod error;
mod live;
pub mod tap;

pub use crate::state::{Kind, Origin};
pub use error::{BoxError, PortError};
pub use live::{add_port, attach, detach, remove_port};
pub use tap::{delete_local_tap, delete_recorded, open_tap_mode, reattach, Found};

/// How long a removal waits for the kernel to delete the TAP.
pub const GONE_TIMEOUT: Duration = Duration::from_secs(2);

/// One port of the registry.
#[derive(Clone, Debug)]
pub struct PortEntry {
    /// The datapath port.
    pub id: PortId,
    /// The datapath port's name: unique on the node (`show fdb`'s `dev`, `capture`, `port
    /// del`). A CNI port's is its TAP's temporary name, `ty` + 8 hex digits.
    pub name: String,
    /// The TAP's name in tapyard's namespace (when it was created).
    pub tap: String,
    /// The interface's name where it lives now (a CNI port's `ifname`).
    pub ifname: String,
    /// The CNI owner key, `<CNI_CONTAINERID>/<CNI_IFNAME>`.
    pub owner: Option<String>,
    /// Bridge port or uplink.
    pub kind: Kind,
    /// The bridge it is attached to (none for an uplink).
    pub bridge: Option<String>,
    /// The interface's MAC and ifindex where it lives.
    pub link: Option<Link>,
    /// The namespace the interface was moved to (a CNI port's `netns`, or where tapyard found
    /// it), as a path; none while it is in tapyard's namespace.
    pub netns: Option<String>,
    /// That namespace's identity (see [`crate::state`]).
    pub netns_id: Option<NsId>,
    /// Where it came from.
    pub origin: Origin,
    /// Its capture state.
    pub capture: Arc<CaptureTap>,
    /// The TAP device (shared with the workers): its persist flag is cleared when the port is
    /// removed, and where it lives now is read from it.
    pub dev: Option<Arc<TapPort>>,
    /// Opened with a virtio-net header.
    pub offload: bool,
    /// The addresses it may send from (`port add --ip`, the CNI plugin's IPAM): with any,
    /// and its bridge's `spoof_guard` on, its spoof guard pins it to them and its MAC.
    pub ips: Vec<std::net::IpAddr>,
}

impl PortEntry {
    /// Its line in `<state_dir>/ports.json`.
    pub fn record(&self) -> PortRecord {
        PortRecord {
            name: self.name.clone(),
            tap: self.tap.clone(),
            ifname: self.ifname.clone(),
            mac: self
                .link
                .as_ref()
                .map(|l| l.mac.clone())
                .unwrap_or_default(),
            kind: self.kind,
            bridge: self.bridge.clone(),
            origin: self.origin,
            owner: self.owner.clone(),
            netns: match (&self.netns, self.netns_id) {
                (Some(path), Some((dev, ino))) => Some(NetnsRecord {
                    path: path.clone(),
                    dev,
                    ino,
                }),
                _ => None,
            },
            ifindex: self.link.as_ref().map_or(0, |l| l.index),
            offload: self.offload,
            ips: self.ips.clone(),
        }
    }

    /// The CNI protocol's description of it.
    pub fn info(&self) -> PortInfo {
        PortInfo {
            name: self.ifname.clone(),
            ifindex: self.link.as_ref().map_or(0, |l| l.index),
            mac: self
                .link
                .as_ref()
                .map(|l| l.mac.clone())
                .unwrap_or_default(),
            bridge: self.bridge.clone().unwrap_or_default(),
            netns: self.netns.clone().unwrap_or_default(),
        }
    }
}

/// The registry: every port of the node.
#[derive(Debug, Default)]
pub struct Registry {
    entries: Mutex<Vec<PortEntry>>,
    changes: Mutex<()>,
}

impl Registry {
    /// The entries, in the order they were added.
    pub fn list(&self) -> Vec<PortEntry> {
        self.lock().clone()
    }

    /// How many ports there are.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// The entry called `name` (datapath port or TAP name).
    pub fn by_name(&self, name: &str) -> Option<PortEntry> {
        self.lock()
            .iter()
            .find(|e| e.name == name || e.tap == name)
            .cloned()
    }

    /// The entry of CNI owner `owner`.
    pub fn by_owner(&self, owner: &str) -> Option<PortEntry> {
        self.lock()
            .iter()
            .find(|e| e.owner.as_deref() == Some(owner))
            .cloned()
    }

    /// Adds an entry (the caller checked its name and owner are free).
    pub fn insert(&self, e: PortEntry) {
        self.lock().push(e);
    }

    /// Takes the entry of port `id` out.
    pub fn remove(&self, id: PortId) {
        self.lock().retain(|e| e.id != id);
    }

    /// Changes the entry of port `id` in place.
    pub fn update(&self, id: PortId, f: impl FnOnce(&mut PortEntry)) {
        if let Some(e) = self.lock().iter_mut().find(|e| e.id == id) {
            f(e);
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<PortEntry>> {
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Serialises additions and removals (held for a whole change).
    pub fn changing(&self) -> MutexGuard<'_, ()> {
        self.changes.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The temporary TAP name of a CNI port: `ty` and 8 hex digits of a hash of the owner key
/// (its top 32 bits, SipHash with fixed keys: the same owner always gets the same name).
pub fn temp_name(owner: &str) -> String {
    let mut h = DefaultHasher::new();
    owner.hash(&mut h);
    format!("ty{:08x}", h.finish() >> 32)
}

/// A TAP shared by the workers (through [`Observed`](tapyard::port::Observed)) and the registry, which keeps it to
/// clear its persist flag on removal and to read where it lives.
pub struct SharedTap(pub Arc<TapPort>);

impl Port for SharedTap {
    fn name(&self) -> &str {
        self.0.name()
    }

    fn recv_batch(&self, pool: &mut BufPool, batch: &mut Batch) -> std::io::Result<usize> {
        self.0.recv_batch(pool, batch)
    }

    fn send(&self, buf: &PacketBuf) -> Result<(), DropReason> {
        self.0.send(buf)
    }

    fn send_batch(&self, bufs: &[&PacketBuf], done: &mut dyn FnMut(usize, Result<(), DropReason>)) {
        self.0.send_batch(bufs, done)
    }

    fn rx_fd(&self) -> Option<RawFd> {
        self.0.rx_fd()
    }

    fn frame_room(&self) -> usize {
        self.0.frame_room()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::values::parse_ifname;

    #[test]
    fn temp_names_are_stable_and_short() {
        let a = temp_name("c1/eth0");
        assert_eq!(a, temp_name("c1/eth0"));
        assert_ne!(a, temp_name("c2/eth0"));
        assert_eq!(a.len(), 10);
        assert!(a.starts_with("ty"));
        assert!(parse_ifname(&a).is_ok());
    }
}
