//! A running node: the datapath built from a [`Config`], its TAP devices and worker threads,
//! and the live changes of a reload.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tapyard::port::{Port, TapPort};
use tapyard::route::{NextHop, Route, RouteProto};
use tapyard::router::IfaceConfig;
use tapyard::runtime::{Runtime, RuntimeConfig};
use tapyard::{BridgeConfig, BridgeId, Datapath, Instant, MacAddr, PortId};

use crate::capture::{CapturePort, CaptureTap};
use crate::config::{self, Config, NeighborCfg, RouteCfg, RouteType, ServiceCfg};
use crate::diff::{self, Diff};

/// A node's running dataplane.
pub struct Node {
    /// The datapath the workers drive.
    pub dp: Arc<Datapath>,
    /// The file the node was started from (re-read on reload).
    pub config_path: PathBuf,
    /// The configuration in force.
    pub current: Mutex<Config>,
    /// The capture state of each TAP, by datapath port name (and TAP name).
    pub captures: Vec<(String, String, Arc<CaptureTap>)>,
    /// Interface name, MAC, address of each router interface (for the log).
    pub ifaces: Vec<(String, MacAddr, config::Cidr)>,
    /// Worker threads in use.
    pub workers: usize,
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

fn remove_neighbor(dp: &Datapath, n: &NeighborCfg) -> Result<(), String> {
    let (Some(iface), Some(r)) = (dp.iface_by_name(&n.dev), dp.router()) else {
        return Err(format!(
            "neighbor {}: no router interface {:?}",
            n.ip, n.dev
        ));
    };
    r.neigh().remove(iface.0, n.ip);
    Ok(())
}

/// Applies the Services to the node's NAT.
///
/// **Not wired yet**: the library's conntrack/NAT API is being built. This is the one place
/// where Services (ClusterIP, NodePort, endpoints, affinity, traffic policy, algorithm) will
/// be turned into NAT rules, at start and on every reload that changes them; until then it
/// logs a warning and succeeds so the rest of the node runs.
pub fn apply_services(node: &Node, services: &[ServiceCfg]) -> Result<(), String> {
    let _ = &node.dp;
    if !services.is_empty() {
        log::warn!(
            "Services are not applied yet: NAT is not wired ({} configured: {})",
            services.len(),
            services
                .iter()
                .map(|s| format!("{} {}:{}/{}", s.name, s.cluster_ip, s.port, s.protocol))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(())
}

impl Node {
    /// Builds the datapath from `cfg`, creates the TAP devices, starts the workers, and adds
    /// routes, static neighbours and Services.
    pub fn start(cfg: Config, config_path: PathBuf) -> Result<Node, String> {
        let mut b = Datapath::builder();
        b.neigh_config(cfg.neigh.to_library())
            .map_err(|e| format!("[neigh]: {e}"))?;
        let rs = RandomState::new();
        let mut ifaces = Vec::new();
        let mut iface_cfg = |name: &str, addr: config::Cidr, mac: Option<MacAddr>, mtu: u16| {
            let mac = mac.unwrap_or_else(|| random_mac(&rs, ifaces.len()));
            ifaces.push((name.to_string(), mac, addr));
            let mut c = IfaceConfig::new(name, mac, addr.addr, addr.len);
            c.mtu = mtu;
            c
        };
        // (datapath port id, datapath port name, TAP name)
        let mut taps: Vec<(PortId, String, String)> = Vec::new();
        for br in &cfg.bridges {
            let mut bc = BridgeConfig::new(br.name.clone());
            bc.fdb_max_entries = br.fdb_max_entries;
            bc.aging = br.fdb_aging;
            let id: BridgeId = b
                .add_bridge(bc)
                .map_err(|e| format!("bridge {:?}: {e}", br.name))?;
            if let Some(a) = br.address {
                b.add_router_iface(iface_cfg(&br.name, a, br.mac, br.mtu), Some(id))
                    .map_err(|e| format!("bridge {:?}: {e}", br.name))?;
            }
            for p in &br.ports {
                let pid = b
                    .add_port(p.clone(), Some(id))
                    .map_err(|e| format!("bridge {:?}: port {p:?}: {e}", br.name))?;
                taps.push((pid, p.clone(), p.clone()));
            }
        }
        for u in &cfg.uplinks {
            let (_, pid) = b
                .add_router_iface(iface_cfg(&u.name, u.address, u.mac, u.mtu), None)
                .map_err(|e| format!("uplink {:?}: {e}", u.name))?;
            taps.push((pid, u.name.clone(), u.tap.clone()));
        }
        let dp = Arc::new(b.build());
        for r in &cfg.routes {
            let route = to_route(&dp, &cfg, r)?;
            dp.add_route(route)
                .map_err(|e| format!("route {}: {e}", r.describe()))?;
        }
        let mut ports: Vec<(PortId, Arc<dyn Port>)> = Vec::new();
        let mut captures = Vec::new();
        for (id, name, tap) in &taps {
            let p = if cfg.node.offload {
                TapPort::open_offload(tap)
            } else {
                TapPort::open(tap)
            }
            .map_err(|e| tap_error(tap, &e))?;
            let ct = Arc::new(CaptureTap::default());
            captures.push((name.clone(), tap.clone(), ct.clone()));
            ports.push((*id, Arc::new(CapturePort::new(Arc::new(p), ct))));
        }
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let workers = cfg
            .node
            .workers
            .unwrap_or(taps.len().min(cpus))
            .clamp(1, taps.len().max(1));
        let rt = Runtime::start(
            dp.clone(),
            ports,
            RuntimeConfig {
                workers,
                ..Default::default()
            },
        )
        .map_err(|e| format!("cannot start the worker threads: {e}"))?;
        let now = rt.now();
        for n in &cfg.neighbors {
            add_neighbor(&dp, n, now)?;
        }
        let services = cfg.services.clone();
        let node = Node {
            dp,
            config_path,
            current: Mutex::new(cfg),
            captures,
            ifaces,
            workers,
            rt: Mutex::new(Some(rt)),
        };
        apply_services(&node, &services)?;
        Ok(node)
    }

    /// The datapath's current time (the workers' clock).
    pub fn now(&self) -> Instant {
        self.rt
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map_or(Instant::ZERO, |r| r.now())
    }

    /// Stops the workers (after the batch each has in hand). Idempotent.
    pub fn stop(&self) {
        let rt = self.rt.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(rt) = rt {
            rt.stop();
        }
    }

    /// The capture state of the port called `name` (datapath port or TAP name).
    pub fn capture_tap(&self, name: &str) -> Option<&Arc<CaptureTap>> {
        self.captures
            .iter()
            .find(|(n, t, _)| n == name || t == name)
            .map(|(_, _, c)| c)
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
        if let Some(t) = self.dp.routes() {
            for r in &d.routes_removed {
                if let Err(e) = t.remove(r.to.network(), r.to.len, Some(r.metric)) {
                    errors.push(format!("route {}: {e}", r.describe()));
                }
            }
        }
        for r in &d.routes_added {
            if let Err(e) = to_route(&self.dp, new, r).and_then(|route| {
                self.dp
                    .add_route(route)
                    .map_err(|e| format!("route {}: {e}", r.describe()))
            }) {
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
        if let Some(s) = &d.services {
            if let Err(e) = apply_services(self, s) {
                errors.push(format!("services: {e}"));
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
