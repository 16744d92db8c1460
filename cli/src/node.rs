//! A running node: the datapath built from a [`Config`], its TAP devices and worker threads,
//! and the live changes of a reload.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tapyard::l3::{IfaceConfig, VxlanConfig, VxlanPeer};
use tapyard::l3::{IfaceId, NextHop, Route, RouteProto};
use tapyard::nat::ServiceError;
use tapyard::nat::{MasqueradeRule, NatConfig, NatRules, Prefix};
use tapyard::port::{Observed, Port, TapPort};
use tapyard::runtime::{Runtime, RuntimeConfig};
use tapyard::{BridgeConfig, BridgeId, Clock, Datapath, Instant, MacAddr, PortId};

use crate::capture::CaptureTap;
use crate::config::{
    self, proto_name, Config, NeighborCfg, PeerCfg, RouteCfg, RouteType, ServiceCfg,
};
use crate::diff::{self, Diff};
use crate::ports::{Kind, Origin, PortEntry, Registry};

/// A node's running dataplane.
pub struct Node {
    /// The datapath the workers drive.
    pub dp: Arc<Datapath>,
    /// The file the node was started from (re-read on reload).
    pub config_path: PathBuf,
    /// The configuration in force.
    pub current: Mutex<Config>,
    /// Every port: from the file, `port add` and the CNI plugin ([`crate::ports`]).
    pub ports: Registry,
    /// TAPs added at run time are opened with virtio-net offloads: `node.offload`, when the
    /// node started with a TAP (the workers' buffers are sized at start for the largest port;
    /// a node that starts with none has buffers for plain frames only).
    pub offload: bool,
    /// Interface name, MAC, address of each router interface (for the log).
    pub ifaces: Vec<(String, MacAddr, config::Cidr)>,
    /// Worker threads in use.
    pub workers: usize,
    clock: Clock,
    rt: Mutex<Option<Runtime>>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("config_path", &self.config_path)
            .finish_non_exhaustive()
    }
}

/// A random locally administered unicast MAC, different for every run and interface (two
/// nodes on one segment must not share a MAC), as `tap-router` does.
fn random_mac(state: &RandomState, i: usize) -> MacAddr {
    let mut h = state.build_hasher();
    h.write_usize(i);
    h.write_u32(std::process::id());
    let v = h.finish().to_be_bytes();
    MacAddr([0x02, v[0], v[1], v[2], v[3], v[4]])
}

/// The library route for a configured one; interfaces are resolved by name, a gateway
/// without `dev` goes out of the interface whose subnet holds it.
pub fn to_route(dp: &Datapath, cfg: &Config, r: &RouteCfg) -> Result<Route, String> {
    let iface = |name: &str| {
        dp.iface_by_name(name)
            .ok_or_else(|| format!("route to {}: no router interface named {name:?}", r.to))
    };
    let next_hop = match (r.kind, r.via, &r.dev) {
        (RouteType::Blackhole, _, _) => NextHop::Blackhole,
        (RouteType::Unreachable, _, _) => NextHop::Unreachable,
        (RouteType::Unicast, Some(gw), Some(dev)) => NextHop::Via(iface(dev)?, gw),
        (RouteType::Unicast, Some(gw), None) => {
            let dev = cfg.connected_iface(gw).ok_or_else(|| {
                format!(
                    "route to {}: gateway {gw} is not on a connected subnet",
                    r.to
                )
            })?;
            NextHop::Via(iface(&dev)?, gw)
        }
        (RouteType::Unicast, None, Some(dev)) => NextHop::Link(iface(dev)?),
        (RouteType::Unicast, None, None) => {
            return Err(format!("route to {}: no via, dev or type", r.to))
        }
    };
    Ok(Route {
        prefix: r.to.network(),
        len: r.to.len,
        next_hop,
        metric: r.metric,
        proto: RouteProto::Static,
        src: None,
    })
}

/// Why a TAP could not be opened, with the likely cause when a device of another kind has
/// its name.
fn tap_error(tap: &str, e: &std::io::Error) -> String {
    let sys = std::path::Path::new("/sys/class/net").join(tap);
    if sys.exists() && !sys.join("tun_flags").exists() {
        return format!(
            "cannot open TAP {tap:?}: an interface {tap:?} that is not a TAP exists in this network namespace ({e}); rename the TAP (`tap = \"...\"` for an uplink) or run tapyard in a namespace of its own"
        );
    }
    format!("cannot open TAP {tap:?}: {e}")
}

fn add_neighbor(dp: &Datapath, n: &NeighborCfg, now: Instant) -> Result<(), String> {
    let iface = dp
        .iface_by_name(&n.dev)
        .ok_or_else(|| format!("neighbor {}: no router interface named {:?}", n.ip, n.dev))?;
    dp.add_static_neigh(iface, n.ip, n.mac, now)
        .map_err(|e| format!("neighbor {} dev {}: {e}", n.ip, n.dev))
}

/// The library's peer for a `[[vxlan.peer]]`.
pub fn to_peer(p: &PeerCfg) -> VxlanPeer {
    VxlanPeer {
        node_ip: p.node_ip,
        vtep_mac: p.vtep_mac,
        pod_cidr: p.pod_cidr.network(),
        pod_prefix_len: p.pod_cidr.len,
    }
}

fn add_peer(dp: &Datapath, vxlan: &str, p: &PeerCfg, now: Instant) -> Result<(), String> {
    dp.add_vxlan_peer(vxlan, to_peer(p), now)
        .map_err(|e| format!("vxlan {vxlan:?}: peer {}: {e}", p.node_ip))
}

fn remove_neighbor(dp: &Datapath, n: &NeighborCfg) -> Result<(), String> {
    let Some(iface) = dp.iface_by_name(&n.dev) else {
        return Err(format!(
            "neighbor {}: no router interface {:?}",
            n.ip, n.dev
        ));
    };
    if !dp.remove_static_neigh(iface, n.ip) {
        log::warn!(
            "neighbor {} dev {}: no permanent entry to remove",
            n.ip,
            n.dev
        );
    }
    Ok(())
}

/// The NAT rules besides Services: `node.cluster_cidr` (kube-proxy's `--cluster-cidr`:
/// Service traffic from outside it is masqueraded) and `[masquerade]` (pod traffic leaving
/// the cluster CIDR through `out` takes `out`'s address). `iface` resolves interface names.
pub fn to_nat_rules(
    cfg: &Config,
    iface: impl Fn(&str) -> Option<IfaceId>,
) -> Result<NatRules, String> {
    let cluster = Prefix::new(cfg.node.cluster_cidr.network(), cfg.node.cluster_cidr.len);
    let mut rules = NatRules {
        cluster_cidr: Some(cluster),
        ..NatRules::default()
    };
    if let Some(m) = &cfg.masquerade {
        let out = iface(&m.out)
            .ok_or_else(|| format!("[masquerade]: out = {:?}: no router interface", m.out))?;
        rules.masquerade.push(MasqueradeRule {
            out,
            src: Some(cluster),
            except_dst: Some(cluster),
        });
    }
    Ok(rules)
}

/// Applies the Services to the node's NAT: every Service of `services` is added or changed
/// (by name; a changed endpoint list takes effect for new connections, established TCP
/// connections keep their endpoint, UDP flows to removed endpoints are flushed as kube-proxy
/// does), and every Service the NAT has that `services` lacks is removed. Each refusal names
/// the Service and the field; the others are still applied.
pub fn apply_services(node: &Node, services: &[ServiceCfg]) -> Result<Vec<String>, Vec<String>> {
    let Some(nf) = node.dp.netfilter() else {
        if services.is_empty() {
            return Ok(Vec::new());
        }
        return Err(vec![
            "Services need a router interface (a bridge with an address or an uplink)".into(),
        ]);
    };
    let now = node.now();
    let mut errors = Vec::new();
    let mut done = Vec::new();
    for old in nf.services().list() {
        if !services.iter().any(|s| s.name == old.name) {
            nf.remove_service(&old.name, now);
            done.push(format!("service {:?} removed", old.name));
        }
    }
    // A Service may take a frontend (address:port, node port) another one gives up in the
    // same reload: what is refused in the first round is retried once the others are in.
    let mut pending: Vec<&ServiceCfg> = services.iter().collect();
    for round in 0..2 {
        let mut refused = Vec::new();
        for s in pending {
            let spec = s.value.clone();
            if nf
                .services()
                .get(&s.name)
                .is_some_and(|r| *r.spec() == spec)
            {
                continue;
            }
            match nf.upsert_service(spec, now) {
                Ok(id) => done.push(format!(
                    "service {:?} applied (id {id}): {}:{}/{}{} -> {} endpoint(s)",
                    s.name,
                    s.vip,
                    s.port,
                    proto_name(s.proto),
                    s.node_port
                        .map_or(String::new(), |p| format!(" node port {p}")),
                    s.endpoints.len()
                )),
                Err(_) if round == 0 => refused.push(s),
                Err(e) => errors.push(service_error(&node.config_path, s, &e)),
            }
        }
        pending = refused;
        if pending.is_empty() {
            break;
        }
    }
    if errors.is_empty() {
        Ok(done)
    } else {
        Err(errors)
    }
}

/// A Service the library refused: `FILE:LINE: <the library's message, which names the Service,
/// the field and the value> (config key KEY)`, the line being the key's in the file.
pub fn service_error(file: &std::path::Path, s: &ServiceCfg, e: &ServiceError) -> String {
    use ServiceError as E;
    let key = match e {
        E::ZeroPort { field, .. } if *field == "node_port" => "node_port".to_string(),
        E::ZeroPort { .. } => "port".into(),
        E::BadVip { .. } | E::DuplicateVip { .. } => "cluster_ip".into(),
        E::UnsupportedProto { .. } => "protocol".into(),
        E::DuplicateNodePort { .. } => "node_port".into(),
        E::DuplicateEndpoint { endpoint, .. } | E::BadEndpoint { endpoint, .. } => s
            .endpoints
            .iter()
            .rposition(|x| x.addr == *endpoint)
            .map_or("endpoints".into(), |i| format!("endpoints.{i}")),
        E::BadAffinityTimeout { .. } => "session_affinity_timeout".into(),
        _ => "name".into(),
    };
    let line = s.lines.of(&key);
    let key = key.split('.').next().unwrap_or_default().to_string();
    format!("{}:{line}: {e} (config key {key})", file.display())
}

impl Node {
    /// Builds the datapath from `cfg`, creates the TAP devices, starts the workers, and adds
    /// routes, static neighbours and Services.
    pub fn start(cfg: Config, config_path: PathBuf) -> Result<Node, String> {
        let mut b = Datapath::builder();
        b.neigh_config(cfg.neigh.clone())
            .map_err(|e| format!("[neigh]: {}", error_chain(&e)))?;
        let rs = RandomState::new();
        let mut ifaces = Vec::new();
        // Router interface name -> id, for the masquerade rules.
        let mut iface_ids: Vec<(String, IfaceId)> = Vec::new();
        let mut iface_cfg = |name: &str, addr: config::Cidr, mac: Option<MacAddr>, mtu: u16| {
            let mac = mac.unwrap_or_else(|| random_mac(&rs, ifaces.len()));
            ifaces.push((name.to_string(), mac, addr));
            let mut c = IfaceConfig::new(name, mac, addr.addr, addr.len);
            c.mtu = mtu;
            c
        };
        // (datapath port id, datapath port name, TAP name, bridge)
        let mut taps: Vec<(PortId, String, String, Option<String>)> = Vec::new();
        for br in &cfg.bridges {
            let mut bc = BridgeConfig::new(br.name.clone());
            bc.fdb_max_entries = br.fdb_max_entries;
            bc.aging = br.fdb_aging;
            let id: BridgeId = b
                .add_bridge(bc)
                .map_err(|e| format!("bridge {:?}: {e}", br.name))?;
            if let Some(a) = br.address {
                let (iid, _) = b
                    .add_router_iface(iface_cfg(&br.name, a, br.mac, br.mtu), Some(id))
                    .map_err(|e| format!("bridge {:?}: {e}", br.name))?;
                iface_ids.push((br.name.clone(), iid));
            }
            for p in &br.ports {
                let pid = b
                    .add_port(p.clone(), Some(id))
                    .map_err(|e| format!("bridge {:?}: port {p:?}: {e}", br.name))?;
                taps.push((pid, p.clone(), p.clone(), Some(br.name.clone())));
            }
        }
        for u in &cfg.uplinks {
            let (iid, pid) = b
                .add_router_iface(iface_cfg(&u.name, u.address, u.mac, u.mtu), None)
                .map_err(|e| format!("uplink {:?}: {e}", u.name))?;
            iface_ids.push((u.name.clone(), iid));
            taps.push((pid, u.name.clone(), u.tap.clone(), None));
        }
        for v in &cfg.vxlans {
            let mut vc = VxlanConfig::new(
                v.name.clone(),
                v.vni,
                v.port,
                v.uplink.clone(),
                v.address.addr,
            );
            vc.prefix_len = v.address.len;
            if let Some(m) = v.mac {
                vc.mac = m;
            }
            vc.mtu = v.mtu;
            vc.src_ports = v.src_ports;
            ifaces.push((v.name.clone(), vc.mac, v.address));
            let iid = b
                .add_vxlan(vc)
                .map_err(|e| format!("vxlan {:?}: {e}", v.name))?;
            iface_ids.push((v.name.clone(), iid));
        }
        // Conntrack and NAT whenever the node routes (as a Linux node with kube-proxy, where
        // conntrack sees every routed packet): Services and masquerade can then be added by
        // a reload without a restart.
        if !iface_ids.is_empty() {
            let rules = to_nat_rules(&cfg, |n| {
                iface_ids.iter().find(|(m, _)| m == n).map(|(_, i)| *i)
            })?;
            b.netfilter(NatConfig {
                conntrack: cfg.conntrack,
                max_affinity_entries: None,
                rules,
            })
            .map_err(|e| format!("[conntrack]: {}", error_chain(&e)))?;
        } else if !cfg.services.is_empty() || cfg.masquerade.is_some() {
            return Err(
                "Services and [masquerade] need a router interface (a bridge with an address or an uplink)"
                    .into(),
            );
        }
        let dp = Arc::new(b.build());
        for r in &cfg.routes {
            let route = to_route(&dp, &cfg, r)?;
            dp.add_route(route)
                .map_err(|e| format!("route {}: {e}", r.describe()))?;
        }
        let mut ports: Vec<(PortId, Arc<dyn Port>)> = Vec::new();
        let registry = Registry::default();
        for (id, name, tap, bridge) in &taps {
            let p = if cfg.node.offload {
                TapPort::open_offload(tap)
            } else {
                TapPort::open(tap)
            }
            .map_err(|e| tap_error(tap, &e))?;
            let ct = Arc::new(CaptureTap::default());
            registry.insert(PortEntry {
                id: *id,
                name: name.clone(),
                tap: tap.clone(),
                ifname: tap.clone(),
                owner: None,
                kind: if bridge.is_some() {
                    Kind::Pod
                } else {
                    Kind::Uplink
                },
                bridge: bridge.clone(),
                link: None,
                netns: None,
                origin: Origin::Config,
                capture: ct.clone(),
            });
            ports.push((*id, Arc::new(Observed::new(p, ct))));
        }
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
            ports,
            RuntimeConfig {
                workers,
                ..Default::default()
            },
        )
        .map_err(|e| format!("cannot start the worker threads: {e}"))?;
        if cfg.node.offload && taps.is_empty() {
            log::info!(
                "no TAP at start: ports added later are plain TAPs, without offloads (the workers' buffers are sized at start)"
            );
        }
        let clock = rt.clock();
        let now = clock.now();
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
            offload: cfg.node.offload && !taps.is_empty(),
            ifaces,
            workers,
            clock,
            rt: Mutex::new(Some(rt)),
        };
        match apply_services(&node, &cfg.services) {
            Ok(done) => {
                for d in done {
                    log::info!("{d}");
                }
            }
            Err(errors) => return Err(errors.join("; ")),
        }
        if let Some(nf) = node.dp.netfilter() {
            let ct = nf.conntrack();
            log::info!(
                "conntrack: at most {} connections ({} MiB reserved){}",
                ct.config().max_entries,
                ct.memory_bytes() >> 20,
                if ct.config().liberal { ", liberal" } else { "" }
            );
        }
        if let Some(m) = &cfg.masquerade {
            log::info!(
                "masquerade: pod traffic from {} leaving through {} to outside it takes {}'s address",
                cfg.node.cluster_cidr,
                m.out,
                m.out
            );
        }
        Ok(node)
    }

    /// The datapath's current time (the workers' clock).
    pub fn now(&self) -> Instant {
        self.clock.now()
    }

    /// Stops the workers (after the batch each has in hand). Idempotent.
    pub fn stop(&self) {
        let rt = self.rt.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(rt) = rt {
            rt.stop();
        }
    }

    /// The capture state of the port called `name` (datapath port or TAP name).
    pub fn capture_tap(&self, name: &str) -> Option<Arc<CaptureTap>> {
        self.ports.by_name(name).map(|e| e.capture)
    }

    /// Runs `f` with the runtime; `None` once the node is stopping.
    pub fn with_runtime<T>(&self, f: impl FnOnce(&Runtime) -> T) -> Option<T> {
        self.rt
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(f)
    }

    /// Re-reads the configuration file and applies what changed. Returns the changes made,
    /// or the reasons the file was refused (its errors, or changes that need a restart); a
    /// refused reload changes nothing.
    pub fn reload(&self) -> Result<Vec<String>, Vec<String>> {
        let file = self.config_path.display().to_string();
        let checked = config::load(&self.config_path);
        let Some(new) = checked.config else {
            return Err(checked.errors().map(|d| d.render(&file)).collect());
        };
        let mut cur = self.current.lock().unwrap_or_else(|e| e.into_inner());
        let d = diff::diff(&cur, &new)?;
        if d.is_empty() {
            return Ok(Vec::new());
        }
        let errors = self.apply(&d, &new);
        *cur = new;
        if errors.is_empty() {
            Ok(d.summary)
        } else {
            Err(errors)
        }
    }

    /// Applies a diff: removals first, then additions; returns what the library refused.
    fn apply(&self, d: &Diff, new: &Config) -> Vec<String> {
        let mut errors = Vec::new();
        for (bridge, name) in &d.ports_removed {
            let _change = self.ports.changing();
            match self.ports.by_name(name) {
                Some(e) if e.origin == Origin::Config => {
                    if let Err(e) = self.port_remove(&e) {
                        errors.push(e);
                    }
                }
                _ => {
                    log::warn!("port {name:?} of bridge {bridge:?}: not running, nothing to remove")
                }
            }
        }
        for (bridge, name) in &d.ports_added {
            if let Err(e) = self.port_add_local(bridge, name, None, Origin::Config) {
                errors.push(format!("bridge {bridge:?}: port {name:?}: {e}"));
            }
        }
        let same_key = |a: &RouteCfg, b: &RouteCfg| a.to == b.to && a.metric == b.metric;
        for r in &d.routes_removed {
            // A changed route is replaced in one update below: no window without it.
            if d.routes_added.iter().any(|n| same_key(n, r)) {
                continue;
            }
            if let Err(e) = self
                .dp
                .remove_route(r.to.network(), r.to.len, Some(r.metric))
            {
                errors.push(format!("route {}: {e}", r.describe()));
            }
        }
        for r in &d.routes_added {
            let replace = d.routes_removed.iter().any(|o| same_key(o, r));
            if let Err(e) = to_route(&self.dp, new, r).and_then(|route| {
                if replace {
                    self.dp.replace_route(route).map(|_| ())
                } else {
                    self.dp.add_route(route)
                }
                .map_err(|e| format!("route {}: {e}", r.describe()))
            }) {
                errors.push(e);
            }
        }
        // A removed peer stops at once: nothing is sent to it or accepted from it from the
        // workers' next batch on.
        for (v, p) in &d.peers_removed {
            if let Err(e) = self.dp.remove_vxlan_peer(v, p.node_ip) {
                errors.push(format!("vxlan {v:?}: peer {}: {e}", p.node_ip));
            }
        }
        for (v, p) in &d.peers_added {
            if let Err(e) = add_peer(&self.dp, v, p, self.now()) {
                errors.push(e);
            }
        }
        for n in &d.neighbors_removed {
            if let Err(e) = remove_neighbor(&self.dp, n) {
                errors.push(e);
            }
        }
        let now = self.now();
        for n in &d.neighbors_added {
            if let Err(e) = add_neighbor(&self.dp, n, now) {
                errors.push(e);
            }
        }
        if d.nat_rules {
            if let Some(nf) = self.dp.netfilter() {
                match to_nat_rules(new, |n| self.dp.iface_by_name(n)) {
                    Ok(rules) => nf.set_rules(rules),
                    Err(e) => errors.push(e),
                }
            }
        }
        if let Some(s) = &d.services {
            match apply_services(self, s) {
                Ok(done) => {
                    for line in done {
                        log::debug!("{line}");
                    }
                }
                Err(e) => errors.extend(e),
            }
        }
        errors
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.stop();
    }
}

/// How long the main loop sleeps between checks of the signal flags.
pub const TICK: Duration = Duration::from_millis(100);

/// An error and its sources, outermost first, joined by ": ".
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::check_str;
    use tapyard::conntrack::CtTimeouts;
    use tapyard::nat::LbAlgo;

    const EXAMPLE: &str = include_str!("../../examples/node.toml");

    fn cfg(src: &str) -> Config {
        let c = check_str(src);
        c.config.unwrap_or_else(|| panic!("{:?}", c.diags))
    }

    #[test]
    fn services_map_to_the_library() {
        let c = cfg(&EXAMPLE
            .replacen("session_affinity = \"none\"", "session_affinity = \"client-ip\"\nsession_affinity_timeout = 600\nalgorithm = \"maglev\"", 1)
            .replace("external_traffic_policy = \"cluster\"", "external_traffic_policy = \"local\""));
        let web = c.services[0].value.clone();
        assert_eq!(web.name, "web");
        assert_eq!(web.vip.to_string(), "10.96.0.10");
        assert_eq!((web.port, web.proto, web.node_port), (80, 6, Some(30080)));
        let eps: Vec<(String, bool)> = web
            .endpoints
            .iter()
            .map(|e| (e.addr.to_string(), e.local))
            .collect();
        assert_eq!(
            eps,
            [
                ("10.244.1.2:8080".to_string(), true),
                ("10.244.2.2:8080".to_string(), false)
            ]
        );
        assert_eq!(web.affinity, Some(Duration::from_secs(600)));
        assert_eq!(web.algo, LbAlgo::Maglev);
        assert!(web.external_local);
        let dns = c.services[1].value.clone();
        assert_eq!((dns.port, dns.proto, dns.node_port), (53, 17, None));
        assert_eq!(dns.affinity, None);
        assert_eq!(dns.algo, LbAlgo::Random);
        assert!(!dns.external_local);
        assert!(dns.endpoints[0].local);
    }

    #[test]
    fn a_refused_service_names_the_file_line_and_key() {
        let c = cfg(EXAMPLE);
        let web = &c.services[0];
        let line = |key: &str| {
            EXAMPLE
                .lines()
                .position(|l| l.starts_with(&format!("{key} =")))
                .unwrap()
                + 1
        };
        let e = ServiceError::DuplicateNodePort {
            service: "web".into(),
            node_port: 30080,
            proto: 6,
            other: "other".into(),
        };
        let msg = service_error(std::path::Path::new("node.toml"), web, &e);
        assert_eq!(
            msg,
            format!(
                "node.toml:{}: service \"web\": node_port 30080/TCP already used by service \"other\" (config key node_port)",
                line("node_port")
            )
        );
        let e = ServiceError::DuplicateVip {
            service: "web".into(),
            vip: web.vip,
            port: 80,
            proto: 6,
            other: "x".into(),
        };
        let msg = service_error(std::path::Path::new("node.toml"), web, &e);
        let cluster_ip_line = EXAMPLE
            .lines()
            .position(|l| l.starts_with("cluster_ip = \"10.96.0.10\""))
            .unwrap()
            + 1;
        assert!(
            msg.starts_with(&format!(
                "node.toml:{cluster_ip_line}: service \"web\": vip:port"
            )),
            "{msg}"
        );
        assert!(msg.ends_with("(config key cluster_ip)"), "{msg}");
    }

    #[test]
    fn conntrack_settings_map_to_the_library() {
        let d = cfg(EXAMPLE).conntrack;
        let linux = CtTimeouts::default();
        assert_eq!(d.max_entries, 262_144);
        assert!(!d.liberal);
        // kube-proxy's --conntrack-tcp-timeout-established and -close-wait.
        assert_eq!(d.timeouts.tcp_established, Duration::from_secs(86_400));
        assert_eq!(d.timeouts.tcp_close_wait, Duration::from_secs(3_600));
        // Absent: Linux's defaults for the states a key stands for.
        assert_eq!(d.timeouts.tcp_syn_recv, linux.tcp_syn_recv);
        assert_eq!(d.timeouts.tcp_last_ack, linux.tcp_last_ack);
        assert_eq!(d.timeouts.tcp_close, linux.tcp_close);
        assert_eq!(
            CtTimeouts {
                tcp_established: linux.tcp_established,
                tcp_close_wait: linux.tcp_close_wait,
                ..d.timeouts
            },
            linux
        );
        let c = cfg(&format!(
            "{EXAMPLE}\n[conntrack]\nmax_entries = 1000\ntcp_syn_timeout = 20\ntcp_time_wait_timeout = 5\nudp_timeout = 7\nudp_stream_timeout = 8\nicmp_timeout = 9\ntcp_close_wait_timeout = 11\nliberal = true\n"
        ));
        let t = c.conntrack;
        assert_eq!(t.max_entries, 1000);
        assert!(t.liberal);
        let s = Duration::from_secs;
        assert_eq!(
            (t.timeouts.tcp_syn_sent, t.timeouts.tcp_syn_recv),
            (s(20), s(20))
        );
        assert_eq!(
            [
                t.timeouts.tcp_time_wait,
                t.timeouts.tcp_fin_wait,
                t.timeouts.tcp_last_ack,
                t.timeouts.tcp_close
            ],
            [s(5); 4]
        );
        assert_eq!(
            (
                t.timeouts.udp,
                t.timeouts.udp_stream,
                t.timeouts.icmp,
                t.timeouts.tcp_close_wait
            ),
            (s(7), s(8), s(9), s(11))
        );
        tapyard::nat::Netfilter::new(NatConfig {
            conntrack: t,
            ..Default::default()
        })
        .unwrap();
    }

    #[test]
    fn nat_rules_from_cluster_cidr_and_masquerade() {
        let c = cfg(EXAMPLE);
        let ids = |n: &str| match n {
            "cni0" => Some(IfaceId(0)),
            "eth0" => Some(IfaceId(1)),
            _ => None,
        };
        let r = to_nat_rules(&c, ids).unwrap();
        let cluster = Prefix::new(std::net::Ipv4Addr::new(10, 244, 0, 0), 16);
        assert_eq!(r.cluster_cidr, Some(cluster));
        assert_eq!(
            r.masquerade,
            [MasqueradeRule {
                out: IfaceId(1),
                src: Some(cluster),
                except_dst: Some(cluster)
            }]
        );
        assert!(r.snat.is_empty() && !r.random_fully);
        assert!(to_nat_rules(&c, |_| None)
            .unwrap_err()
            .contains("[masquerade]: out = \"eth0\""));
        let mut none = c.clone();
        none.masquerade = None;
        assert!(to_nat_rules(&none, ids).unwrap().masquerade.is_empty());
    }
}
