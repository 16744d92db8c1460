//! The datapath a node starts with: built from the config ([`Plan`]), then run with its ports ([`Built`]).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use tapyard::conntrack::Opened;
use tapyard::l3::IfaceId;
use tapyard::l3::{IfaceConfig, RaConfig, VxlanConfig};
use tapyard::nat::NatConfig;
use tapyard::port::{Observed, Port, TapPort};
use tapyard::runtime::{Runtime, RuntimeConfig};
use tapyard::{BridgeConfig, BridgeId, Clock, Datapath, MacAddr, PortId};
use tapyard_cni::netlink::{Link, Netlink};

use crate::config::{self, Config};
use crate::ports::{self, Kind, Origin, PortEntry, Registry, SharedTap};
use crate::state::{self, MacFor, StateDir};

use super::translate::{add_neighbor, add_peer, add_route};
use super::NodeError;
use super::{apply_services, to_nat_rules, Node};

/// The MTU of a config TAP: its uplink's, or its bridge's (`mtu` sets the router
/// interface's and the TAP devices'), 1500 for a bridge without an address.
pub(super) fn tap_mtu(cfg: &Config, name: &str, bridge: Option<&str>) -> u16 {
    match bridge {
        Some(b) => cfg
            .bridges
            .iter()
            .find(|x| x.name == b)
            .map_or(1500, |x| x.mtu),
        None => cfg
            .uplinks
            .iter()
            .find(|u| u.name == name)
            .map(|u| u.mtu)
            .or_else(|| cfg.hosts.iter().find(|h| h.name == name).map(|h| h.mtu))
            .unwrap_or(1500),
    }
}

/// What config TAP `name` is: a bridge's port (on `bridge`), the host port, or an uplink.
pub(super) fn config_kind(cfg: &Config, name: &str, bridge: Option<&str>) -> Kind {
    if bridge.is_some() {
        Kind::Pod
    } else if cfg.hosts.iter().any(|h| h.name == name) {
        Kind::Host
    } else {
        Kind::Uplink
    }
}

/// Creates (or attaches to) TAP `tap` of config port `name` (of `bridge`, if a bridge's) in
/// tapyard's namespace; a TAP it creates gets the MAC derived from the node's and its names,
/// and every one its `[[bridge.port]]`'s `mac` if given and the MTU of [`tap_mtu`]. Returns
/// it with its link, when readable.
pub(super) fn open_config_tap(
    cfg: &Config,
    name: &str,
    tap: &str,
    bridge: Option<&str>,
) -> Result<(TapPort, Option<Link>), NodeError> {
    let mtu = tap_mtu(cfg, name, bridge);
    let given = bridge.and_then(|b| cfg.port_def(b, name)?.mac);
    let mut nl = Netlink::open().ok();
    let existed = nl
        .as_mut()
        .and_then(|nl| nl.link_by_name(tap).ok().flatten())
        .is_some();
    let dev = ports::open_tap_mode(tap, cfg.node.offload).map_err(|source| NodeError::Tap {
        tap: tap.to_string(),
        source,
    })?;
    let mut link = nl
        .as_mut()
        .and_then(|nl| nl.link_by_name(tap).ok().flatten());
    let mac =
        given.or_else(|| (!existed).then(|| state::stable_mac(MacFor::Tap, &cfg.node.name, tap)));
    if let (Some(m), Some(nl), Some(l)) = (mac, nl.as_mut(), link.as_mut()) {
        if l.mac != m.to_string() {
            match nl.set_mac(l.index, m.0) {
                Ok(()) => l.mac = m.to_string(),
                Err(e) => log::warn!("TAP {tap}: cannot set its MAC {m}: {e}"),
            }
        }
    }
    if let (Some(nl), Some(l)) = (nl.as_mut(), link.as_mut()) {
        if l.mtu != u32::from(mtu) {
            match nl.set_mtu(l.index, u32::from(mtu)) {
                Ok(()) => l.mtu = u32::from(mtu),
                Err(e) => log::warn!("TAP {tap}: cannot set its MTU to {mtu}: {e}"),
            }
        }
    }
    Ok((dev, link))
}

/// Turns on UDP-tunnel GSO on the offload TAP of uplink `name` when a `[[vxlan]]` runs over
/// it, so that VXLAN super-frames cross it whole; a kernel that refuses (before Linux 6.17)
/// leaves the per-segment path, logged.
pub(super) fn tunnel_offload(cfg: &Config, name: &str, offload: bool, dev: &mut TapPort) {
    if !offload || !cfg.vxlans.iter().any(|v| v.uplink == name) {
        return;
    }
    match dev.enable_tunnel_offload() {
        Ok(()) => log::info!("uplink {name}: UDP-tunnel GSO on (VXLAN super-frames cross its TAP whole)"),
        Err(e) => log::info!(
            "uplink {name}: the kernel refuses UDP-tunnel GSO ({e}): VXLAN frames cross its TAP one segment at a time"
        ),
    }
}

/// `<state_dir>/conntrack`, creating the state directory (mode 0700) if needed; a state
/// directory that fails [`crate::state::secure::check_dir`] is refused.
pub(super) fn conntrack_file(state_dir: &std::path::Path) -> Result<PathBuf, NodeError> {
    crate::state::secure::check_dir(state_dir, true)
        .map_err(|e| NodeError::refused("[node] state_dir", e))?;
    if let Some(fs) = fs_type(state_dir).filter(|t| t != "tmpfs" && t != "ramfs") {
        log::warn!(
            "[node] state_dir {} is on {fs}, not a tmpfs: the connection table mapped there is written back to disk by the kernel (put the state directory on a tmpfs such as /run)",
            state_dir.display()
        );
    }
    Ok(state_dir.join("conntrack"))
}

/// The file system type of the mount holding `dir` (from /proc/self/mountinfo), if known.
pub(super) fn fs_type(dir: &std::path::Path) -> Option<String> {
    let dir = std::fs::canonicalize(dir).ok()?;
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    // Each line: id parent major:minor root mount-point options ... - fstype source options.
    // The mount point with the longest prefix of `dir` holds it (the last such line wins:
    // later mounts hide earlier ones).
    let mut best: Option<(usize, String)> = None;
    for line in info.lines() {
        let mut parts = line.split(" - ");
        let (Some(left), Some(right)) = (parts.next(), parts.next()) else {
            continue;
        };
        let Some(mp) = left.split_whitespace().nth(4) else {
            continue;
        };
        let mp = mp.replace("\\040", " ");
        if dir.starts_with(&mp) && best.as_ref().is_none_or(|(n, _)| mp.len() >= *n) {
            best = Some((mp.len(), right.split_whitespace().next()?.to_string()));
        }
    }
    best.map(|(_, t)| t)
}

/// A node's datapath being built from its config: bridges, router interfaces and the
/// config's ports are added by [`Plan::new`] (more ports by [`Plan::add_port`]);
/// [`Plan::build`] opens the connection table, finishes the datapath and adds the routes;
/// [`Built::run`] starts the workers on the ports it is given (re-attached or opened by
/// [`Node::start`], or handed over by a running tapyard at `run --takeover`, which builds only
/// once the old process has stopped writing to the table).
pub struct Plan {
    b: tapyard::DatapathBuilder,
    /// The config's TAP ports: datapath port id, datapath port name, TAP name, bridge (none
    /// for an uplink).
    pub taps: Vec<(PortId, String, String, Option<String>)>,
    pub(super) cfg: Config,
    config_path: PathBuf,
    ifaces: Vec<(String, MacAddr, Option<config::Cidr>)>,
    iface_ids: Vec<(String, IfaceId)>,
    bridge_ids: Vec<(String, BridgeId)>,
}

impl std::fmt::Debug for Plan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plan")
            .field("taps", &self.taps)
            .finish_non_exhaustive()
    }
}

impl Plan {
    /// Adds the bridges, router interfaces and the config's ports. A router interface whose
    /// MAC the config does not set takes the one `macs` names for it (the running node's, at
    /// a takeover), else the one derived from the node's and its names.
    pub fn new(
        cfg: Config,
        config_path: PathBuf,
        macs: &[(String, MacAddr)],
    ) -> Result<Plan, NodeError> {
        let mut b = Datapath::builder();
        b.neigh_config(cfg.neigh.clone())
            .map_err(|e| NodeError::refused("[neigh]", e))?;
        let mut ifaces = Vec::new();
        // Router interface name -> id, for the masquerade rules.
        let mut iface_ids: Vec<(String, IfaceId)> = Vec::new();
        let mut iface_cfg = |name: &str,
                             addr: Option<config::Cidr>,
                             addr6: Option<config::Cidr6>,
                             ra: bool,
                             mac: Option<MacAddr>,
                             mtu: u16| {
            let given = macs.iter().find(|(n, _)| n == name).map(|(_, m)| *m);
            let mac = mac
                .or(given)
                .unwrap_or_else(|| state::stable_mac(MacFor::Iface, &cfg.node.name, name));
            ifaces.push((name.to_string(), mac, addr));
            let mut c = IfaceConfig::new(name, mac, std::net::Ipv6Addr::UNSPECIFIED, 0);
            c.addr = addr.map(|a| (a.addr, a.len));
            c.mtu = mtu;
            c.addr6 = addr6.map(|a| (a.addr, a.len));
            c.ra = ra.then(RaConfig::default);
            c
        };
        // (datapath port id, datapath port name, TAP name, bridge)
        let mut taps: Vec<(PortId, String, String, Option<String>)> = Vec::new();
        let mut bridge_ids: Vec<(String, BridgeId)> = Vec::new();
        for br in &cfg.bridges {
            let mut bc = BridgeConfig::new(br.name.clone());
            bc.fdb_max_entries = br.fdb_max_entries;
            bc.aging = br.fdb_aging;
            let id: BridgeId = b
                .add_bridge(bc)
                .map_err(|e| NodeError::refused(format!("bridge {:?}", br.name), e))?;
            bridge_ids.push((br.name.clone(), id));
            if br.address.is_some() || br.address6.is_some() {
                let (iid, _) = b
                    .add_router_iface(
                        iface_cfg(&br.name, br.address, br.address6, br.ra, br.mac, br.mtu),
                        Some(id),
                    )
                    .map_err(|e| NodeError::refused(format!("bridge {:?}", br.name), e))?;
                iface_ids.push((br.name.clone(), iid));
            }
            for p in &br.ports {
                let pid = b.add_port(p.clone(), Some(id)).map_err(|e| {
                    NodeError::refused(format!("bridge {:?}: port {p:?}", br.name), e)
                })?;
                taps.push((pid, p.clone(), p.clone(), Some(br.name.clone())));
            }
        }
        for u in &cfg.uplinks {
            let (iid, pid) = b
                .add_router_iface(
                    iface_cfg(&u.name, u.address, u.address6, false, u.mac, u.mtu),
                    None,
                )
                .map_err(|e| NodeError::refused(format!("uplink {:?}", u.name), e))?;
            iface_ids.push((u.name.clone(), iid));
            taps.push((pid, u.name.clone(), u.tap.clone(), None));
        }
        for h in &cfg.hosts {
            let gw = h.address.map(|_| config::Cidr {
                addr: h.gateway,
                len: 32,
            });
            let gw6 = h.address6.map(|_| config::Cidr6 {
                addr: h.gateway6,
                len: 128,
            });
            let (iid, pid) = b
                .add_router_iface(iface_cfg(&h.name, gw, gw6, false, h.mac, h.mtu), None)
                .map_err(|e| NodeError::refused(format!("host {:?}", h.name), e))?;
            let addrs: Vec<std::net::IpAddr> = h.sides().map(|(a, _)| a).collect();
            b.host_port(iid, &addrs)
                .map_err(|e| NodeError::refused(format!("host {:?}", h.name), e))?;
            iface_ids.push((h.name.clone(), iid));
            taps.push((pid, h.name.clone(), h.name.clone(), None));
        }
        for v in &cfg.vxlans {
            let mut vc = VxlanConfig::new(
                v.name.clone(),
                v.vni,
                v.port,
                v.uplink.clone(),
                v.address.addr(),
            );
            vc.prefix_len = v.address.prefix_len();
            if let Some(m) = v.mac {
                vc.mac = m;
            }
            vc.mtu = v.mtu;
            vc.src_ports = v.src_ports;
            // An IPv6 VXLAN interface has no IPv4 address (no gratuitous ARP at start); its
            // MAC is derived from its address (or given), so stable anyway.
            let a4 = match v.address {
                config::IpCidr::V4(a) => Some(a),
                config::IpCidr::V6(_) => None,
            };
            ifaces.push((v.name.clone(), vc.mac, a4));
            let iid = b
                .add_vxlan(vc)
                .map_err(|e| NodeError::refused(format!("vxlan {:?}", v.name), e))?;
            iface_ids.push((v.name.clone(), iid));
        }
        if iface_ids.is_empty() && (!cfg.services.is_empty() || cfg.masquerade.is_some()) {
            return Err(NodeError::Config(
                "Services and [masquerade] need a router interface (a bridge with an address or an uplink)"
                    .into(),
            ));
        }
        Ok(Plan {
            b,
            taps,
            cfg,
            config_path,
            ifaces,
            iface_ids,
            bridge_ids,
        })
    }

    /// The bridge called `name`, if the config has it.
    pub fn bridge(&self, name: &str) -> Option<BridgeId> {
        self.bridge_ids
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, id)| *id)
    }

    /// Adds a datapath port called `name` on bridge `bridge` (a port of `port add` or the
    /// CNI plugin that the last run or the running node has).
    pub fn add_port(&mut self, name: &str, bridge: BridgeId) -> Result<PortId, NodeError> {
        self.b
            .add_port(name.to_string(), Some(bridge))
            .map_err(|e| NodeError::refused(format!("port {name:?}"), e))
    }

    /// Creates (or attaches to) the config's TAP `i` of [`Plan::taps`] in tapyard's
    /// namespace, as a start without a record of it does: its registry entry.
    pub fn open_config_port(&self, i: usize) -> Result<PortEntry, NodeError> {
        let (id, name, tap, bridge) = self
            .taps
            .get(i)
            .ok_or_else(|| format!("no config port {i}"))?;
        let (mut dev, link) = open_config_tap(&self.cfg, name, tap, bridge.as_deref())?;
        if bridge.is_none() {
            tunnel_offload(&self.cfg, name, self.cfg.node.offload, &mut dev);
        }
        Ok(PortEntry {
            id: *id,
            name: name.clone(),
            tap: tap.clone(),
            ifname: tap.clone(),
            owner: None,
            kind: config_kind(&self.cfg, name, bridge.as_deref()),
            bridge: bridge.clone(),
            link,
            netns: None,
            netns_id: None,
            origin: Origin::Config,
            capture: Arc::default(),
            dev: Some(Arc::new(dev)),
            offload: self.cfg.node.offload,
            ips: Vec::new(),
        })
    }

    /// Whether the node routes, and so keeps a connection table.
    pub fn has_conntrack(&self) -> bool {
        !self.iface_ids.is_empty()
    }

    /// The IPv6 connection table's file (`<state_dir>/conntrack6`) as the running node
    /// handed it over at a takeover; call before [`Plan::build`].
    pub fn conntrack6_handed_over(&mut self, f: std::fs::File) {
        self.b.conntrack6_file_handed_over(f);
    }

    /// Opens the connection table (`<state_dir>/conntrack`; `handed_over`: that file as the
    /// running node handed it over), finishes the datapath and adds the routes.
    pub fn build(mut self, handed_over: Option<std::fs::File>) -> Result<Built, NodeError> {
        let cfg = &self.cfg;
        let handed_over_ct = handed_over.is_some();
        let has_v6 = cfg.connected().iter().any(|c| c.address6.is_some());
        let mut kept_connections = 0;
        let mut kept_connections6 = 0;
        // Conntrack and NAT whenever the node routes (as a Linux node with kube-proxy, where
        // conntrack sees every routed packet): Services and masquerade can then be added by
        // a reload without a restart.
        if !self.iface_ids.is_empty() {
            let ids = &self.iface_ids;
            let rules = to_nat_rules(cfg, |n| ids.iter().find(|(m, _)| m == n).map(|(_, i)| *i))?;
            // The connection table lives in <state_dir>/conntrack, so connections and their
            // NAT survive a restart or a crash (see Conntrack::open_file).
            let ct_file = conntrack_file(&cfg.node.state_dir_path())?;
            match handed_over {
                Some(f) => self
                    .b
                    .conntrack_file_handed_over(&ct_file, f, Clock::new().now()),
                None => self.b.conntrack_file(&ct_file, Clock::new().now()),
            }
            let opening = std::time::Instant::now();
            self.b
                .netfilter(NatConfig {
                    conntrack: cfg.conntrack,
                    // A node without IPv6 routes no IPv6: a minimal IPv6 table.
                    conntrack6: Some(cfg.conntrack6()),
                    max_affinity_entries: None,
                    rules,
                })
                .map_err(|e| NodeError::refused("[conntrack]", e))?;
            if let Some(r) = self.b.recovery::<std::net::Ipv4Addr>() {
                kept_connections = r.kept;
                let ms = opening.elapsed().as_secs_f64() * 1000.0;
                // Reserved whole at open (no SIGBUS when the tmpfs fills later), and on
                // 2 MiB pages where the kernel can (MADV_COLLAPSE).
                let pages = if r.huge_pages {
                    "; reserved, on huge pages"
                } else {
                    "; reserved, on 4 KiB pages"
                };
                match r.opened {
                    Opened::Refused(_) => {
                        log::warn!("conntrack: {}: {r}{pages} ({ms:.1} ms)", ct_file.display())
                    }
                    _ if r.mode_fixed.is_some() => {
                        log::warn!("conntrack: {}: {r}{pages} ({ms:.1} ms)", ct_file.display())
                    }
                    _ => log::info!("conntrack: {}: {r}{pages} ({ms:.1} ms)", ct_file.display()),
                }
            }
            // The IPv6 table beside it (<state_dir>/conntrack6), so IPv6 connections survive
            // a restart and a takeover too (a running node that does not hand it over still
            // holds it: the new one then starts an empty IPv6 table, logged).
            let ct6_file = tapyard::conntrack6_path(&ct_file);
            match self.b.recovery::<std::net::Ipv6Addr>() {
                Some(r) => {
                    kept_connections6 = r.kept;
                    match r.opened {
                        Opened::Refused(_) => {
                            log::warn!("conntrack6: {}: {r}", ct6_file.display())
                        }
                        _ => log::info!("conntrack6: {}: {r}", ct6_file.display()),
                    }
                }
                None if handed_over_ct && has_v6 => log::warn!(
                    "conntrack6: {} is the running node's: IPv6 connections start anew",
                    ct6_file.display()
                ),
                None => {}
            }
        }
        let dp = Arc::new(self.b.build());
        for r in &cfg.routes {
            add_route(&dp, cfg, r, false)?;
        }
        Ok(Built {
            dp,
            kept_connections,
            kept_connections6,
            taps: self.taps,
            cfg: self.cfg,
            config_path: self.config_path,
            ifaces: self.ifaces,
        })
    }
}

/// A node's datapath built ([`Plan::build`]), before any worker runs.
pub struct Built {
    /// The datapath.
    pub dp: Arc<Datapath>,
    /// Connections found in the connection table's file.
    kept_connections: usize,
    /// IPv6 connections found in `<state_dir>/conntrack6`.
    kept_connections6: usize,
    /// As [`Plan::taps`].
    pub taps: Vec<(PortId, String, String, Option<String>)>,
    pub(super) cfg: Config,
    config_path: PathBuf,
    ifaces: Vec<(String, MacAddr, Option<config::Cidr>)>,
}

impl std::fmt::Debug for Built {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Built")
            .field("taps", &self.taps)
            .finish_non_exhaustive()
    }
}

impl Built {
    /// Starts the workers on `ports` (registry entries whose datapath port the datapath has,
    /// each with its open device in `dev`), adds static neighbours and Services, makes the
    /// TAPs persistent and writes the port record.
    pub fn run(self, ports: Vec<PortEntry>) -> Result<Node, NodeError> {
        let Built {
            dp,
            kept_connections,
            kept_connections6,
            taps,
            cfg,
            config_path,
            ifaces,
        } = self;
        let sd = StateDir::new(cfg.node.state_dir_path(), &cfg.node.name);
        let registry = Registry::default();
        let mut drivers: Vec<(PortId, Arc<dyn Port>)> = Vec::new();
        for e in ports {
            let Some(dev) = e.dev.clone() else {
                return Err(NodeError::Config(format!("port {:?}: no device", e.name)));
            };
            drivers.push((
                e.id,
                Arc::new(Observed::new(SharedTap(dev), e.capture.clone())),
            ));
            registry.insert(e);
        }
        let any_offload = registry.list().iter().any(|e| e.offload);
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        // Ports may join a bridge at run time: a node with a bridge gets a worker per CPU.
        let wanted = if cfg.bridges.is_empty() {
            taps.len()
        } else {
            cpus
        };
        let most = if cfg.bridges.is_empty() {
            taps.len().max(1)
        } else {
            usize::MAX
        };
        let workers = cfg.node.workers.unwrap_or(wanted.min(cpus)).clamp(1, most);
        let rt = Runtime::start(
            dp.clone(),
            drivers,
            RuntimeConfig {
                workers,
                busy_poll: std::time::Duration::from_micros(u64::from(cfg.node.busy_poll_us)),
                ..Default::default()
            },
        )
        .map_err(|e| NodeError::refused("cannot start the worker threads", e))?;
        match rt.io_fallback() {
            Some(why) => log::warn!("{why}"),
            None => log::info!("TAP I/O: {:?}", rt.io()),
        }
        if cfg.node.offload && !any_offload {
            log::info!(
                "no TAP at start: ports added later are plain TAPs, without offloads (the workers' buffers are sized at start)"
            );
        }
        let hz = cfg.node.healthz_port;
        let local = rt
            .start_local_server(tapyard::runtime::local::LocalServerConfig {
                healthz_port: (hz != 0).then_some(hz),
            })
            .map_err(|e| NodeError::refused("cannot start the health check server", e))?;
        let clock = rt.clock();
        let now = clock.now();
        super::host::configure(&cfg)?;
        // The node's own <address>:<NodePort>: without its rules the rest still works.
        match super::host::sync_rules(&cfg) {
            Ok(lines) => lines.iter().for_each(|l| log::info!("{l}")),
            Err(e) if cfg.hosts.is_empty() => log::debug!("{e}"),
            Err(e) => log::warn!("{e}: the node's own <address>:<NodePort> stays local"),
        }
        for n in &cfg.neighbors {
            add_neighbor(&dp, n, now)?;
        }
        for v in &cfg.vxlans {
            for p in &v.peers {
                add_peer(&dp, &v.name, p, now)?;
            }
        }
        let node = Node {
            dp,
            config_path,
            current: Mutex::new(cfg.clone()),
            ports: registry,
            // The workers' buffers fit offload TAPs only if one was there at start.
            offload: cfg.node.offload && any_offload,
            ifaces,
            workers,
            state: sd,
            refused: Mutex::default(),
            clock,
            rt: Mutex::new(Some(rt)),
            local: Mutex::new(local),
        };
        // The pods' spoof guards, from the record (ports restored or taken over).
        for r in node.apply_guards(&cfg, |_, _| true) {
            match r {
                Ok(line) => log::debug!("{line}"),
                Err(e) => log::warn!("{e}"),
            }
        }
        match apply_services(&node, &cfg.services) {
            Ok(done) => {
                for d in done {
                    log::info!("{d}");
                }
            }
            Err(errors) => return Err(NodeError::Services(errors)),
        }
        if let (Some(nf), true) = (node.dp.control().netfilter(), kept_connections > 0) {
            // Connections kept from the previous process: their Service ids and affinity.
            let (retagged, affinity) = nf.services().relink(nf.conntrack(), node.now());
            log::info!(
                "conntrack: kept connections linked to the Services again ({retagged} renumbered, {affinity} client affinities restored)"
            );
        }
        if let (Some(nf), true) = (node.dp.control().netfilter(), kept_connections6 > 0) {
            let (retagged, affinity) = nf
                .services()
                .relink(nf.conntrack_of::<std::net::Ipv6Addr>(), node.now());
            log::info!(
                "conntrack6: kept IPv6 connections linked to the Services again ({retagged} renumbered, {affinity} client affinities restored)"
            );
        }
        // Everything is in place: from now on the TAPs outlive the process.
        for e in node.ports.list() {
            if let Some(dev) = &e.dev {
                if let Err(err) = dev.set_persist(true) {
                    log::warn!("port {}: cannot make its TAP persistent: {err}", e.name);
                }
            }
        }
        node.save_ports();
        node.announce();
        if let Some(nf) = node.dp.control().netfilter() {
            let ct = nf.conntrack();
            log::info!(
                "conntrack: at most {} connections ({} MiB reserved){}{}",
                ct.config().max_entries,
                ct.memory_bytes() >> 20,
                if ct.config().liberal { ", liberal" } else { "" },
                match ct.config().max_per_source {
                    0 => String::new(),
                    n => format!(", at most {n} per pod address"),
                }
            );
            let ct6 = nf.conntrack_of::<std::net::Ipv6Addr>();
            log::info!(
                "conntrack6: at most {} IPv6 connections ({} KiB reserved)",
                ct6.config().max_entries,
                ct6.memory_bytes() >> 10,
            );
        }
        if let (Some(m), Some(cc)) = (&cfg.masquerade, cfg.node.cluster_cidr) {
            log::info!(
                "masquerade: pod traffic from {cc} leaving through {} to outside it takes {}'s address",
                m.out,
                m.out
            );
        }
        if let Some(m) = &cfg.masquerade {
            if let Some(c6) = cfg.node.cluster_cidr6 {
                log::info!(
                    "masquerade: IPv6 pod traffic from {c6} leaving through {} to outside it takes {}'s IPv6 address",
                    m.out,
                    m.out
                );
            }
        }
        for s in &cfg.snats {
            log::info!(
                "snat: new connections from {}{} take the source {} ({})",
                s.src,
                s.out
                    .as_ref()
                    .map_or(String::new(), |o| format!(" leaving through {o}")),
                s.to,
                s.ports.map_or(
                    "ports of the original one's class".to_string(),
                    |(lo, hi)| { format!("ports {lo}-{hi}") }
                )
            );
        }
        let n = &cfg.node;
        if n.masquerade_all || n.random_fully || !n.node_port_addresses.is_empty() {
            log::info!(
                "nat: masquerade_all {}, random_fully {}, node_port_addresses {}",
                n.masquerade_all,
                n.random_fully,
                crate::config::diff::node_port_list(&n.node_port_addresses)
            );
        }
        Ok(node)
    }
}
