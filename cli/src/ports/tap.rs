//! TAP devices where they live: re-attached from a record, or deleted.

use std::fs::File;
use std::path::Path;

use tapyard::port::TapPort;
use tapyard_cni::netlink::{Link, Netlink};
use tapyard_cni::netns;

use super::PortError;
use crate::state::{self, NsId, PortRecord};
use tapyard_cni::error::CniError;

/// Looks up link `name` inside the namespace `ns` (opened from `path`).
pub fn link_in(ns: &File, path: &Path, name: &str) -> Result<Option<Link>, CniError> {
    use tapyard_cni::error::NETNS_CONFIG;
    let err = |e: std::io::Error| CniError::new(NETNS_CONFIG, format!("rtnetlink: {e}"));
    netns::run_in(ns, path, || {
        Netlink::open()
            .map_err(err)?
            .link_by_name(name)
            .map_err(err)
    })
}

/// Opens (creates, or attaches to) TAP `name` in the calling thread's namespace, with a
/// virtio-net header when `offload`.
pub fn open_tap_mode(name: &str, offload: bool) -> std::io::Result<TapPort> {
    if offload {
        TapPort::open_offload(name)
    } else {
        TapPort::open(name)
    }
}

/// A recorded port found again: the device, its name and link where it lives, and that
/// namespace (path and identity; none for tapyard's own).
pub struct Found {
    /// The re-attached device.
    pub tap: TapPort,
    /// Its name now.
    pub ifname: String,
    /// Its MAC and ifindex.
    pub link: Link,
    /// Where it lives, if not in tapyard's namespace.
    pub netns: Option<(String, NsId)>,
}

/// The interface of record `r` in the namespace the netlink socket belongs to: by ifindex,
/// else by name, confirmed by MAC either way (an ifindex or a name may have been given to
/// another interface since).
pub fn find_link(nl: &mut Netlink, r: &PortRecord) -> std::io::Result<Option<(String, Link)>> {
    if r.ifindex != 0 {
        if let Some((name, l)) = nl.link_by_index(r.ifindex)? {
            if l.mac == r.mac {
                return Ok(Some((name, l)));
            }
        }
    }
    match nl.link_by_name(&r.ifname)? {
        Some(l) if l.mac == r.mac => Ok(Some((r.ifname.clone(), l))),
        _ => Ok(None),
    }
}

/// Finds the TAP of record `r` where it lives now and re-attaches to it (`TUNSETIFF` by its
/// current name, from inside its namespace, with the flags it was created with). `Err(why)`
/// when it is not there (its namespace is gone, no interface with its ifindex or name and
/// MAC) or cannot be opened. `own` is tapyard's namespace.
pub fn reattach(r: &PortRecord, own: Option<NsId>) -> Result<Found, PortError> {
    let here = |nl: &mut Netlink| -> Result<(TapPort, String, Link), PortError> {
        let (name, link) = find_link(nl, r)
            .map_err(|e| PortError::io("rtnetlink", e))?
            .ok_or_else(|| {
                PortError::Missing(format!(
                    "no interface with ifindex {} or name {:?} and mac {}",
                    r.ifindex, r.ifname, r.mac
                ))
            })?;
        let tap = open_tap_mode(&name, r.offload)
            .map_err(|e| PortError::io(format!("cannot re-attach to TAP {name:?}"), e))?;
        Ok((tap, name, link))
    };
    match r.netns.as_ref().filter(|ns| Some(ns.id()) != own) {
        None => {
            let mut nl = Netlink::open().map_err(|e| PortError::io("rtnetlink", e))?;
            let (tap, ifname, link) = here(&mut nl).map_err(|e| PortError::Here(Box::new(e)))?;
            Ok(Found {
                tap,
                ifname,
                link,
                netns: None,
            })
        }
        Some(ns) => {
            let (f, path) = state::open_ns(ns).ok_or_else(|| {
                PortError::Missing(format!(
                    "its network namespace {} (inode {}) is gone",
                    ns.path, ns.ino
                ))
            })?;
            let (tap, ifname, link) = netns::run_in(&f, &path, || {
                use tapyard_cni::error::NETNS_CONFIG;
                let mut nl = Netlink::open()
                    .map_err(|e| CniError::new(NETNS_CONFIG, format!("rtnetlink: {e}")))?;
                here(&mut nl).map_err(|e| CniError::new(NETNS_CONFIG, e.to_string()))
            })
            .map_err(|source| PortError::InNetns {
                path: path.display().to_string(),
                source,
            })?;
            let p = path.display().to_string();
            Ok(Found {
                tap,
                ifname,
                link,
                netns: Some((p, ns.id())),
            })
        }
    }
}

/// Deletes the TAP of record `r` where it lives: the interface with the record's ifindex or
/// name and its MAC is attached to as the TAP it was created as (`TUNSETIFF`, which only a
/// TAP device accepts: a bridge, a veth or the host's `eth0` named by a forged record is
/// refused by the kernel and left in place, with an error saying so), its persist flag is
/// cleared and it goes when closed. `Ok(false)` if it is not there (its namespace went with
/// it).
pub fn delete_recorded(r: &PortRecord, own: Option<NsId>) -> Result<bool, PortError> {
    let del = |nl: &mut Netlink| -> Result<bool, PortError> {
        let Some((name, l)) = find_link(nl, r).map_err(|e| PortError::io("rtnetlink", e))? else {
            return Ok(false);
        };
        let tap = open_tap_mode(&name, r.offload).map_err(|e| {
            PortError::Missing(format!(
                "interface {name:?} (ifindex {}, mac {}) is not a TAP device tapyard created ({e}): left in place",
                l.index, l.mac
            ))
        })?;
        tap.set_persist(false).map_err(|e| {
            PortError::io(format!("TAP {name:?}: cannot clear its persist flag"), e)
        })?;
        drop(tap);
        Ok(true)
    };
    match r.netns.as_ref().filter(|ns| Some(ns.id()) != own) {
        None => del(&mut Netlink::open().map_err(|e| PortError::io("rtnetlink", e))?),
        Some(ns) => {
            let Some((f, path)) = state::open_ns(ns) else {
                return Ok(false);
            };
            netns::run_in(&f, &path, || {
                use tapyard_cni::error::NETNS_CONFIG;
                let mut nl = Netlink::open()
                    .map_err(|e| CniError::new(NETNS_CONFIG, format!("rtnetlink: {e}")))?;
                del(&mut nl).map_err(|e| CniError::new(NETNS_CONFIG, e.to_string()))
            })
            .map_err(|source| PortError::InNetns {
                path: path.display().to_string(),
                source,
            })
        }
    }
}

/// Deletes TAP `name` of tapyard's namespace if there is one: attached to (which only works
/// on a TAP: another kind of interface of that name is left alone), persist flag cleared,
/// closed. Whether one was deleted.
pub fn delete_local_tap(name: &str) -> Result<bool, PortError> {
    let mut nl = Netlink::open().map_err(|e| PortError::io("rtnetlink", e))?;
    if nl
        .link_by_name(name)
        .map_err(|e| PortError::io("rtnetlink", e))?
        .is_none()
    {
        return Ok(false);
    }
    let tap = TapPort::open(name)
        .map_err(|e| PortError::io(format!("TAP {name:?}: cannot open it"), e))?;
    tap.set_persist(false)
        .map_err(|e| PortError::io(format!("TAP {name:?}: cannot clear its persist flag"), e))?;
    drop(tap);
    Ok(true)
}
