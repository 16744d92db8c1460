//! The ports added and removed while the node runs (see [`crate::ports`]).

use std::fs::File;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant as StdInstant};

use tapyard::port::{Observed, Port, TapPort};
use tapyard::{BridgeId, PacketBuf, PortId};
use tapyard_cni::netlink::{Link, Netlink};
use tapyard_cni::netns;
use tapyard_control::show::PortRow;
use tapyard_control::PortInfo;

use crate::capture::CaptureTap;
use crate::config::values::{parse_ifname, parse_mac, BadValue};
use crate::ports::{BoxError, PortError};
use std::net::IpAddr;

use crate::node::Node;
use crate::state::{self, MacFor};

use crate::ports::GONE_TIMEOUT;
use crate::ports::{PortEntry, SharedTap};
use crate::state::{Kind, Origin};

fn value(field: &'static str, value: &str, source: BadValue) -> PortError {
    PortError::Value {
        field,
        value: value.to_string(),
        source,
    }
}

fn field(name: &str, value: &str, why: impl std::fmt::Display) -> PortError {
    PortError::field(name, value, why)
}

/// A port being built: undoes what was done (runtime, datapath; the TAP closes with the last
/// `Arc`) unless [`Pending::keep`] is called.
struct Pending<'a> {
    node: &'a Node,
    id: PortId,
    kept: bool,
}

impl Pending<'_> {
    fn keep(mut self) {
        self.kept = true;
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if self.kept {
            return;
        }
        if let Err(e) = self.node.unplug(self.id) {
            log::warn!("undoing port {:?}: {e}", self.id);
        }
    }
}

impl Node {
    /// Takes port `id` from the workers and the datapath; its driver, if it had one (the
    /// TAP closes when that last reference goes).
    fn unplug(&self, id: PortId) -> Result<Option<Arc<dyn Port>>, BoxError> {
        match self
            .with_runtime(|rt| crate::ports::detach(rt, id))
            .flatten()
        {
            Some(port) => Ok(Some(port)),
            None => crate::ports::remove_port(&self.dp, id).map(|()| None),
        }
    }

    fn open_tap(&self, name: &str) -> Result<TapPort, PortError> {
        crate::ports::tap::open_tap_mode(name, self.offload)
            .map_err(|e| PortError::io(format!("cannot create TAP {name:?}"), e))
    }

    /// Writes the registry to `<state_dir>/ports.json`; a failure is logged (the ports work,
    /// but would not be found again after a restart).
    pub fn save_ports(&self) {
        if let Err(e) = self.try_save_ports() {
            log::error!("{e} (the ports would not be found again after a restart)");
        }
    }

    /// [`Node::save_ports`], saying why it failed.
    fn try_save_ports(&self) -> Result<(), PortError> {
        let _w = self.state.lock();
        let r = state::Record {
            version: state::VERSION,
            node: self.state.node.clone(),
            own_netns: self.state.own_netns(),
            ports: self.ports.list().iter().map(PortEntry::record).collect(),
        };
        state::save(&self.state.dir, &r).map_err(|e| {
            PortError::io(
                format!(
                    "cannot write {}",
                    self.state.dir.join(state::PORTS_FILE).display()
                ),
                e,
            )
        })
    }

    /// Announces each router interface on its link ([`tapyard::l3::Router::announce`]): a
    /// gratuitous ARP request (sender and target its IPv4 address) and, when it has an IPv6
    /// address, unsolicited Neighbor Advertisements (router and override flags) for its
    /// global and link-local addresses, from its MAC, out of every TAP of its bridge (or its
    /// uplink's TAP). As Linux with `arp_notify` and `ndisc_notify` set (both 0 by default):
    /// a pod that was resolving its gateway while nobody served it (its ARP retries come every
    /// second) takes the answer at once instead of waiting for its next retry, and one whose
    /// entry holds another MAC (a takeover with another `mac`) is corrected at once (it keeps
    /// it `STALE`, so its next packet confirms it). Sent at start and at a takeover
    /// (addresses change only with a restart); a TAP that refuses a frame is skipped.
    pub fn announce(&self) {
        let Some(router) = self.dp.control().router() else {
            return;
        };
        let ports = self.ports.list();
        let mut sent = 0;
        for (name, _, _) in &self.ifaces {
            let Some(iid) = self.dp.control().iface_by_name(name) else {
                continue;
            };
            let on_link = |e: &&PortEntry| match e.kind {
                Kind::Pod => e.bridge.as_deref() == Some(name.as_str()),
                Kind::Uplink | Kind::Host => e.name == *name,
            };
            router.announce(iid, |frame| {
                let buf = PacketBuf::from_frame(frame);
                for e in ports.iter().filter(on_link) {
                    if let Some(dev) = &e.dev {
                        sent += usize::from(dev.send(&buf).is_ok());
                    }
                }
            });
        }
        log::debug!("gratuitous ARP and unsolicited NA: {sent} frame(s) sent on the TAPs");
    }

    /// Reads where each TAP lives now (its namespace and name, from its fd) and records the
    /// ports that moved or were renamed (a pod's TAP moved by hand and renamed `eth0`), with
    /// their ifindex and MAC there. Cheap when nothing moved: two ioctls and a stat per TAP.
    pub fn refresh_ports(&self) {
        let mut changed = false;
        for e in self.ports.list() {
            let Some(dev) = &e.dev else { continue };
            let (Ok(name), Ok(nsfd)) = (dev.current_name(), dev.netns()) else {
                continue;
            };
            let nsf = File::from(nsfd);
            let Ok(id) = state::ns_id_of(&nsf) else {
                continue;
            };
            let ns_now = (Some(id) != self.state.own_ns).then_some(id);
            if name == e.ifname && ns_now == e.netns_id {
                continue;
            }
            let path = match ns_now {
                None => None,
                Some(_) if ns_now == e.netns_id => e.netns.clone(),
                Some(id) => state::find_ns(id).map(|p| p.display().to_string()),
            };
            let link = match (&ns_now, &path) {
                (None, _) => Netlink::open()
                    .ok()
                    .and_then(|mut nl| nl.link_by_name(&name).ok().flatten()),
                (Some(_), Some(p)) => crate::ports::tap::link_in(&nsf, Path::new(p), &name)
                    .ok()
                    .flatten(),
                (Some(_), None) => None,
            };
            let Some(link) = link else { continue };
            log::info!(
                "port {} is now {name} in {} (ifindex {}, mac {})",
                e.name,
                path.as_deref().unwrap_or("tapyard's namespace"),
                link.index,
                link.mac
            );
            self.ports.update(e.id, |e| {
                e.ifname = name;
                e.link = Some(link);
                e.netns = path;
                e.netns_id = ns_now;
            });
            changed = true;
        }
        if changed {
            self.save_ports();
        }
    }

    fn bridge_id(&self, bridge: &str) -> Result<BridgeId, PortError> {
        self.dp.control().bridge_by_name(bridge).ok_or_else(|| {
            let names: Vec<&str> = self
                .dp
                .control()
                .bridges()
                .iter()
                .map(|b| b.name())
                .collect();
            field(
                "bridge",
                bridge,
                format!(
                    "is not a bridge of this node (bridges: {})",
                    names.join(", ")
                ),
            )
        })
    }

    /// A name no port, datapath port or interface of tapyard's namespace has.
    fn check_free(&self, nl: &mut Netlink, what: &str, name: &str) -> Result<(), PortError> {
        if let Some(e) = self.ports.by_name(name) {
            return Err(field(
                what,
                name,
                format!("is taken by a port ({} on {})", e.origin.name(), e.ifname),
            ));
        }
        if self.dp.control().port_by_name(name).is_some()
            || self.dp.control().iface_by_name(name).is_some()
        {
            return Err(field(what, name, "is taken by a port of the datapath"));
        }
        match nl.link_by_name(name) {
            Ok(None) => Ok(()),
            Ok(Some(_)) => Err(field(
                what,
                name,
                "exists already as an interface in tapyard's namespace",
            )),
            Err(e) => Err(PortError::io(
                format!("rtnetlink: cannot look up {name:?}"),
                e,
            )),
        }
    }

    /// Attaches an open TAP as datapath port `name` of `bridge`: the datapath port, then the
    /// runtime. On failure both are undone and the TAP is closed (deleted).
    fn attach_tap(
        &self,
        name: &str,
        tap: Arc<TapPort>,
        bridge: BridgeId,
    ) -> Result<(Pending<'_>, Arc<CaptureTap>), PortError> {
        let id = crate::ports::add_port(&self.dp, name, bridge).map_err(|source| {
            PortError::Datapath {
                what: format!("port {name:?}: cannot add it to the datapath"),
                source,
            }
        })?;
        let p = Pending {
            node: self,
            id,
            kept: false,
        };
        let ct = Arc::new(CaptureTap::default());
        let port: Arc<dyn Port> = Arc::new(Observed::new(SharedTap(tap), ct.clone()));
        self.with_runtime(|rt| crate::ports::attach(rt, id, port))
            .unwrap_or_else(|| Err(std::io::Error::other("the node is stopping")))
            .map_err(|e| {
                PortError::io(format!("port {name:?}: cannot hand it to the workers"), e)
            })?;
        Ok((p, ct))
    }

    /// `port add BRIDGE NAME [--mac MAC]` (and a reload's added `ports`): a TAP called `name`
    /// that stays in tapyard's namespace.
    pub fn port_add_local(
        &self,
        bridge: &str,
        name: &str,
        mac: Option<&str>,
        ips: Vec<IpAddr>,
        origin: Origin,
    ) -> Result<PortEntry, PortError> {
        let _change = self.ports.changing();
        let bid = self.bridge_id(bridge)?;
        parse_ifname(name).map_err(|e| value("name", name, e))?;
        let mac = mac
            .map(|m| parse_mac(m).map_err(|e| value("mac", m, e)))
            .transpose()?;
        let mut nl = Netlink::open().map_err(|e| PortError::io("rtnetlink", e))?;
        self.check_free(&mut nl, "name", name)?;
        let tap = self.open_tap(name)?;
        let tap_name = tap.name().to_string();
        let mut link = nl
            .link_by_name(&tap_name)
            .map_err(|e| PortError::io(format!("rtnetlink: cannot read TAP {tap_name:?}"), e))?
            .ok_or_else(|| PortError::Missing(format!("TAP {tap_name:?} vanished")))?;
        let m = mac.unwrap_or_else(|| state::stable_mac(MacFor::Tap, &self.state.node, name));
        nl.set_mac(link.index, m.0)
            .map_err(|e| PortError::io(format!("mac {m}: cannot set it on {tap_name:?}"), e))?;
        link.mac = m.to_string();
        let offload = tap.offloads();
        let tap = Arc::new(tap);
        let guard = self.guard_for(bridge, &m.to_string(), &ips)?;
        let (pending, capture) = self.attach_tap(name, tap.clone(), bid)?;
        self.set_guard(name, pending.id, guard.as_ref())?;
        let e = PortEntry {
            id: pending.id,
            name: name.to_string(),
            tap: tap_name.clone(),
            ifname: tap_name,
            owner: None,
            kind: Kind::Pod,
            bridge: Some(bridge.to_string()),
            link: Some(link),
            netns: None,
            netns_id: None,
            origin,
            capture,
            dev: Some(tap.clone()),
            offload,
            ips,
        };
        self.record_then_persist(&e, &tap)?;
        pending.keep();
        log::info!(
            "port {name} added to bridge {bridge} ({}) mac {}",
            origin.name(),
            e.info().mac
        );
        Ok(e)
    }

    /// The CNI plugin's `port_add`: a TAP on `bridge`, moved into `netns` as `ifname` with
    /// MTU `mtu`. The TAP is created and moved first, then attached (datapath port, workers):
    /// a name clash in the namespace touches neither, and any later failure closes the fd,
    /// which deletes the device in the pod's namespace.
    pub fn port_add_cni(
        &self,
        bridge: &str,
        owner: &str,
        netns_path: &str,
        ifname: &str,
        mtu: u32,
        ips: &[IpAddr],
    ) -> Result<PortInfo, PortError> {
        let _change = self.ports.changing();
        let bid = self.bridge_id(bridge)?;
        if owner.is_empty() {
            return Err(PortError::EmptyOwner);
        }
        if let Some(e) = self.ports.by_owner(owner) {
            return Err(field(
                "owner",
                owner,
                format!("has a port already ({} in {})", e.ifname, e.info().netns),
            ));
        }
        parse_ifname(ifname).map_err(|e| value("ifname", ifname, e))?;
        if !(68..=65535).contains(&mtu) {
            return Err(PortError::Mtu(mtu));
        }
        let path = Path::new(netns_path);
        // Checked as the plugin checks CNI_NETNS: never blocks (a FIFO), only a network
        // namespace passes.
        let ns = netns::open(path).map_err(|source| PortError::Netns {
            path: netns_path.to_string(),
            source,
        })?;
        let tmp = crate::ports::temp_name(owner);
        let mut nl = Netlink::open().map_err(|e| PortError::io("rtnetlink", e))?;
        self.check_free(&mut nl, "temporary TAP name", &tmp)?;
        let exists =
            crate::ports::tap::link_in(&ns, path, ifname).map_err(|source| PortError::Netns {
                path: netns_path.to_string(),
                source,
            })?;
        if exists.is_some() {
            return Err(PortError::Missing(format!(
                "ifname {ifname:?} exists already in netns {netns_path}"
            )));
        }
        // Until it is attached and made persistent, dropping `tap` (the last reference)
        // deletes the device.
        let tap = self.open_tap(&tmp)?;
        let here = nl
            .link_by_name(&tmp)
            .map_err(|e| PortError::io(format!("rtnetlink: cannot read TAP {tmp:?}"), e))?
            .ok_or_else(|| PortError::Missing(format!("TAP {tmp:?} vanished")))?;
        let mac = state::stable_mac(MacFor::Tap, &self.state.node, &tmp);
        nl.set_mac(here.index, mac.0)
            .map_err(|e| PortError::io(format!("mac {mac}: cannot set it on {tmp:?}"), e))?;
        let ns_id =
            state::ns_id_of(&ns).map_err(|e| PortError::io(format!("netns {netns_path:?}"), e))?;
        {
            use std::os::fd::AsFd;
            nl.move_to_netns(here.index, ns.as_fd(), ifname, mtu)
        }
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                PortError::Missing(format!(
                    "ifname {ifname:?} exists already in netns {netns_path}"
                ))
            } else {
                PortError::io(
                    format!("cannot move TAP {tmp:?} into netns {netns_path} as {ifname:?}"),
                    e,
                )
            }
        })?;
        let link = crate::ports::tap::link_in(&ns, path, ifname)
            .map_err(|source| PortError::InNetns {
                path: netns_path.to_string(),
                source,
            })?
            .ok_or_else(|| {
                PortError::Missing(format!(
                    "{ifname:?} is not in netns {netns_path} after the move"
                ))
            })?;
        let offload = tap.offloads();
        let tap = Arc::new(tap);
        let guard = self.guard_for(bridge, &link.mac, ips)?;
        let (pending, capture) = self.attach_tap(&tmp, tap.clone(), bid)?;
        self.set_guard(&tmp, pending.id, guard.as_ref())?;
        let e = PortEntry {
            id: pending.id,
            name: tmp.clone(),
            tap: tmp,
            ifname: ifname.to_string(),
            owner: Some(owner.to_string()),
            kind: Kind::Pod,
            bridge: Some(bridge.to_string()),
            link: Some(link),
            netns: Some(netns_path.to_string()),
            netns_id: (Some(ns_id) != self.state.own_ns).then_some(ns_id),
            origin: Origin::Cni,
            capture,
            dev: Some(tap.clone()),
            offload,
            ips: ips.to_vec(),
        };
        self.record_then_persist(&e, &tap)?;
        pending.keep();
        log::info!(
            "port {} ({owner}) added to bridge {bridge}: {ifname} in {netns_path}, mac {}",
            e.name,
            e.info().mac
        );
        Ok(e.info())
    }

    /// Adds a new port's entry to the registry and its record, then makes its TAP persistent:
    /// in this order, a crash in between leaves a record of a TAP that went with the process
    /// (dropped at the next start), never a persistent TAP that no record lists (which would
    /// stay, unknown to tapyard and to `cleanup`, and block its name). A record that cannot
    /// be written (a full disk) refuses the port for the same reason. On failure the entry
    /// is taken out again (the caller undoes the rest).
    fn record_then_persist(&self, e: &PortEntry, tap: &TapPort) -> Result<(), PortError> {
        self.ports.insert(e.clone());
        if let Err(err) = self.try_save_ports() {
            self.ports.remove(e.id);
            self.save_ports();
            return Err(PortError::NotRecorded(Box::new(err)));
        }
        // For the tests (debug builds only): die between the two steps.
        if crate::failpoint::is("port-add-recorded", "exit") {
            std::process::exit(137);
        }
        if let Err(err) = tap.set_persist(true) {
            self.ports.remove(e.id);
            self.save_ports();
            return Err(PortError::io(
                format!("cannot make TAP {:?} persistent", tap.name()),
                err,
            ));
        }
        Ok(())
    }

    /// Removes a port: from the workers, from the datapath, from the registry and its
    /// record; then clears its TAP's persist flag and waits until the kernel has deleted it
    /// (the fd closes with the last `Arc`).
    pub fn port_remove(&self, mut e: PortEntry) -> Result<(), PortError> {
        let port = self.unplug(e.id).map_err(|source| PortError::Datapath {
            what: format!("port {:?}: cannot remove it", e.name),
            source,
        })?;
        self.ports.remove(e.id);
        self.save_ports();
        if let Some(dev) = e.dev.take() {
            if let Err(err) = dev.set_persist(false) {
                log::warn!(
                    "port {}: cannot clear the TAP's persist flag: {err}",
                    e.name
                );
            }
        }
        drop(port);
        self.wait_gone(&e)?;
        log::info!(
            "port {} removed ({}{})",
            e.name,
            e.origin.name(),
            e.owner
                .as_deref()
                .map_or(String::new(), |o| format!(", owner {o}"))
        );
        Ok(())
    }

    /// Waits until the TAP of `e` no longer exists (in its namespace), up to [`GONE_TIMEOUT`](crate::ports::GONE_TIMEOUT).
    /// A namespace that is gone took the device with it.
    fn wait_gone(&self, e: &PortEntry) -> Result<(), PortError> {
        let deadline = StdInstant::now() + crate::ports::GONE_TIMEOUT;
        let index = e.link.as_ref().map(|l| l.index);
        let present = || -> Option<bool> {
            let same = |l: Option<Link>| l.is_some_and(|l| index.is_none_or(|i| i == l.index));
            match &e.netns {
                None => Some(same(Netlink::open().ok()?.link_by_name(&e.ifname).ok()?)),
                Some(p) => {
                    let path = Path::new(p);
                    let ns = netns::open(path).ok()?;
                    let l = crate::ports::tap::link_in(&ns, path, &e.ifname).ok()?;
                    Some(same(l))
                }
            }
        };
        while present() == Some(true) {
            if StdInstant::now() >= deadline {
                return Err(PortError::NotGone {
                    port: e.name.clone(),
                    tap: e.ifname.clone(),
                    after: GONE_TIMEOUT,
                });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }

    /// The CNI plugin's `port_del`: whether a port was removed.
    pub fn port_del_owner(&self, owner: &str) -> Result<bool, PortError> {
        let _change = self.ports.changing();
        match self.ports.by_owner(owner) {
            None => Ok(false),
            Some(e) => self.port_remove(e).map(|()| true),
        }
    }

    /// `port del NAME`: a port added by `port add` or the CNI plugin (a port of the config
    /// file is removed by taking it out of the file and reloading).
    pub fn port_del_name(&self, name: &str) -> Result<(), PortError> {
        let _change = self.ports.changing();
        let Some(e) = self.ports.by_name(name) else {
            return Err(field("name", name, "is not a port of this node"));
        };
        if e.origin == Origin::Config {
            return Err(field(
                "name",
                name,
                "comes from the config file: remove it from the bridge's `ports` and reload",
            ));
        }
        self.port_remove(e)
    }

    /// `show ports --json`: every port with its fields and counters.
    pub fn ports_rows(&self) -> Vec<PortRow> {
        self.refresh_ports();
        let stats = self.dp.control().stats();
        let mut nl = Netlink::open().ok();
        self.ports
            .list()
            .into_iter()
            .map(|e| {
                // A config port may have been moved away by hand: read it where it was made.
                let link = e.link.clone().or_else(|| {
                    nl.as_mut()
                        .and_then(|nl| nl.link_by_name(&e.tap).ok().flatten())
                });
                let counters = stats.ports.iter().find(|p| p.name == e.name);
                let c = |f: fn(&tapyard::stats::PortStats) -> u64| counters.map_or(0, f);
                let guard = self.dp.control().port_guard(e.id);
                PortRow {
                    bridge: e.bridge,
                    guard: guard.map_or_else(Vec::new, |g| {
                        let v4 = g.ipv4().iter().map(ToString::to_string);
                        v4.chain(g.ipv6().iter().map(ToString::to_string)).collect()
                    }),
                    ifindex: link.as_ref().map(|l| l.index),
                    ifname: e.ifname,
                    kind: e.kind.name().into(),
                    mac: link.map(|l| l.mac),
                    name: e.name,
                    netns: e.netns,
                    origin: e.origin.name().into(),
                    owner: e.owner,
                    rx_bytes: c(|p| p.rx_bytes),
                    rx_packets: c(|p| p.rx_packets),
                    spoofed: c(|p| p.spoofed),
                    tap: e.tap,
                    tx_bytes: c(|p| p.tx_bytes),
                    tx_packets: c(|p| p.tx_packets),
                }
            })
            .collect()
    }

    /// `show ports`: one line per port (`-` for what a port does not have).
    pub fn ports_text(&self) -> String {
        let mut out = String::new();
        let s = |v: Option<&str>| v.unwrap_or("-").to_string();
        for p in self.ports_rows() {
            out.push_str(&format!(
                "{} {} bridge {} ifname {} mac {} ifindex {} netns {} origin {}{}{} rx {} pkts {} bytes tx {} pkts {} bytes\n",
                p.name,
                p.kind,
                s(p.bridge.as_deref()),
                p.ifname,
                s(p.mac.as_deref()),
                p.ifindex.map_or("-".into(), |i| i.to_string()),
                s(p.netns.as_deref()),
                p.origin,
                p.owner.map_or(String::new(), |o| format!(" owner {o}")),
                if p.guard.is_empty() {
                    String::new()
                } else {
                    format!(" guard {} spoofed {}", p.guard.join(","), p.spoofed)
                },
                p.rx_packets,
                p.rx_bytes,
                p.tx_packets,
                p.tx_bytes,
            ));
        }
        out
    }
}
