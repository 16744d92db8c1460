//! A running node: the datapath built from a [`Config`], its TAP devices and worker threads,
//! and the live changes of a reload.

use std::net::{IpAddr, Ipv6Addr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tapyard::conntrack::Opened;
use tapyard::l3::{IfaceConfig, RaConfig, VxlanConfig, VxlanPeer};
use tapyard::l3::{IfaceId, NextHop, Route, RouteProto};
use tapyard::nat::ServiceError;
use tapyard::nat::{
    MasqueradeRule, MasqueradeRule6, NatConfig, NatRules, PortRange, Prefix, Prefix6, SnatRule,
    SnatRule6,
};
use tapyard::port::{Observed, Port, TapPort};
use tapyard::runtime::{Runtime, RuntimeConfig};
use tapyard::{BridgeConfig, BridgeId, Clock, Datapath, Instant, MacAddr, PortId};
use tapyard_cni::netlink::{Link, Netlink};

use crate::capture::CaptureTap;
use crate::config::{
    self, proto_name, Config, IpCidr, NeighborCfg, PeerCfg, RouteCfg, RouteType, ServiceCfg,
};
use crate::diff::{self, Diff, Item, Refusal};
use crate::ports::{self, Kind, Origin, PortEntry, Registry, SharedTap};
use crate::state::{self, MacFor, StateDir};

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
    pub ifaces: Vec<(String, MacAddr, Option<config::Cidr>)>,
    /// Worker threads in use.
    pub workers: usize,
    /// Where the port record is kept (`[node] state_dir`), the node's name and namespace.
    pub state: StateDir,
    /// What the library refused at the last reload (retried by the next one).
    refused: Mutex<Vec<Refusal>>,
    clock: Clock,
    rt: Mutex<Option<Runtime>>,
}

/// What a reload did ([`Node::reload`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reloaded {
    /// One line per change applied (none: the file changes nothing); a change refused at
    /// the previous reload and applied now says so.
    pub changes: Vec<String>,
    /// One line per change the library refused, with its reason: it does not run, the
    /// running configuration keeps what it had, and the next reload retries it.
    pub refused: Vec<String>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("config_path", &self.config_path)
            .finish_non_exhaustive()
    }
}

/// The MTU of a config TAP: its uplink's, or its bridge's (`mtu` sets the router
/// interface's and the TAP devices'), 1500 for a bridge without an address.
fn tap_mtu(cfg: &Config, name: &str, bridge: Option<&str>) -> u16 {
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
            .map_or(1500, |u| u.mtu),
    }
}

/// Creates (or attaches to) config TAP `tap` in tapyard's namespace; a TAP it creates gets
/// the MAC derived from the node's and its names, and every one the MTU `mtu`. Returns it
/// with its link, when readable.
fn open_config_tap(
    tap: &str,
    offload: bool,
    node: &str,
    mtu: u16,
) -> Result<(TapPort, Option<Link>), String> {
    let mut nl = Netlink::open().ok();
    let existed = nl
        .as_mut()
        .and_then(|nl| nl.link_by_name(tap).ok().flatten())
        .is_some();
    let dev = ports::open_tap_mode(tap, offload).map_err(|e| tap_error(tap, &e))?;
    let mut link = nl
        .as_mut()
        .and_then(|nl| nl.link_by_name(tap).ok().flatten());
    if let (false, Some(nl), Some(l)) = (existed, nl.as_mut(), link.as_mut()) {
        let m = state::stable_mac(MacFor::Tap, node, tap);
        match nl.set_mac(l.index, m.0) {
            Ok(()) => l.mac = m.to_string(),
            Err(e) => log::warn!("TAP {tap}: cannot set its MAC {m}: {e}"),
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
fn tunnel_offload(cfg: &Config, name: &str, offload: bool, dev: &mut TapPort) {
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

/// The library route for a configured IPv4 one; interfaces are resolved by name, a gateway
/// without `dev` goes out of the interface whose subnet holds it.
pub fn to_route(dp: &Datapath, cfg: &Config, r: &RouteCfg) -> Result<Route, String> {
    let IpCidr::V4(to) = r.to else {
        return Err(format!("route to {}: not an IPv4 route", r.to));
    };
    let iface = |name: &str| {
        dp.control()
            .iface_by_name(name)
            .ok_or_else(|| format!("route to {}: no router interface named {name:?}", r.to))
    };
    let via = match r.via {
        Some(IpAddr::V4(gw)) => Some(gw),
        Some(IpAddr::V6(gw)) => return Err(format!("route to {}: via {gw} is IPv6", r.to)),
        None => None,
    };
    let next_hop = match (r.kind, via, &r.dev) {
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
        prefix: to.network(),
        len: to.len,
        next_hop,
        metric: r.metric,
        proto: RouteProto::Static,
        src: None,
    })
}

/// The library route for a configured IPv6 one; a gateway without `dev` goes out of the
/// interface whose IPv6 subnet holds it (a link-local one has its `dev`: `check` says so).
pub fn to_route6(dp: &Datapath, cfg: &Config, r: &RouteCfg) -> Result<Route<Ipv6Addr>, String> {
    let IpCidr::V6(to) = r.to else {
        return Err(format!("route to {}: not an IPv6 route", r.to));
    };
    let iface = |name: &str| {
        dp.control()
            .iface_by_name(name)
            .ok_or_else(|| format!("route to {}: no router interface named {name:?}", r.to))
    };
    let via = match r.via {
        Some(IpAddr::V6(gw)) => Some(gw),
        Some(IpAddr::V4(gw)) => return Err(format!("route to {}: via {gw} is IPv4", r.to)),
        None => None,
    };
    let next_hop = match (r.kind, via, &r.dev) {
        (RouteType::Blackhole, _, _) => NextHop::Blackhole,
        (RouteType::Unreachable, _, _) => NextHop::Unreachable,
        (RouteType::Unicast, Some(gw), Some(dev)) => NextHop::Via(iface(dev)?, gw),
        (RouteType::Unicast, Some(gw), None) => {
            let dev = cfg.connected_iface6(gw).ok_or_else(|| {
                format!(
                    "route to {}: gateway {gw} is not on a connected IPv6 subnet",
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
        prefix: to.network(),
        len: to.len,
        next_hop,
        metric: r.metric,
        proto: RouteProto::Static,
        src: None,
    })
}

/// Adds a configured route of either family (`replace`: in place of the one with its prefix
/// and metric).
fn add_route(dp: &Datapath, cfg: &Config, r: &RouteCfg, replace: bool) -> Result<(), String> {
    let fail = |e: &dyn std::fmt::Display| format!("route {}: {e}", r.describe());
    match r.to {
        IpCidr::V4(_) => {
            let route = to_route(dp, cfg, r)?;
            if replace {
                dp.control().replace_route(route).map(|_| ())
            } else {
                dp.control().add_route(route)
            }
            .map_err(|e| fail(&e))
        }
        IpCidr::V6(_) => {
            let route = to_route6(dp, cfg, r)?;
            if replace {
                dp.control().replace_route(route).map(|_| ())
            } else {
                dp.control().add_route(route)
            }
            .map_err(|e| fail(&e))
        }
    }
}

/// Removes a configured route of either family.
fn remove_route(dp: &Datapath, r: &RouteCfg) -> Result<(), String> {
    match r.to {
        IpCidr::V4(to) => dp
            .control()
            .remove_route(to.network(), to.len, Some(r.metric))
            .map(|_| ())
            .map_err(|e| format!("route {}: {e}", r.describe())),
        IpCidr::V6(to) => dp
            .control()
            .remove_route(to.network(), to.len, Some(r.metric))
            .map(|_| ())
            .map_err(|e| format!("route {}: {e}", r.describe())),
    }
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
        .control()
        .iface_by_name(&n.dev)
        .ok_or_else(|| format!("neighbor {}: no router interface named {:?}", n.ip, n.dev))?;
    match n.ip {
        IpAddr::V4(ip) => dp.control().add_static_neigh(iface, ip, n.mac, now),
        IpAddr::V6(ip) => dp.control().add_static_neigh(iface, ip, n.mac, now),
    }
    .map_err(|e| format!("neighbor {} dev {}: {e}", n.ip, n.dev))
}

/// The library's peer for a `[[vxlan.peer]]`.
pub fn to_peer(p: &PeerCfg) -> VxlanPeer {
    VxlanPeer::new(
        p.node_ip,
        p.vtep_mac,
        p.pod_cidr.network(),
        p.pod_cidr.len(),
    )
}

fn add_peer(dp: &Datapath, vxlan: &str, p: &PeerCfg, now: Instant) -> Result<(), String> {
    dp.control()
        .add_vxlan_peer(vxlan, to_peer(p), now)
        .map_err(|e| format!("vxlan {vxlan:?}: peer {}: {e}", p.node_ip))
}

fn remove_neighbor(dp: &Datapath, n: &NeighborCfg) -> Result<(), String> {
    let Some(iface) = dp.control().iface_by_name(&n.dev) else {
        return Err(format!(
            "neighbor {}: no router interface {:?}",
            n.ip, n.dev
        ));
    };
    let removed = match n.ip {
        IpAddr::V4(ip) => dp.control().remove_static_neigh(iface, ip),
        IpAddr::V6(ip) => dp.control().remove_static_neigh(iface, ip),
    };
    if !removed {
        log::warn!(
            "neighbor {} dev {}: no permanent entry to remove",
            n.ip,
            n.dev
        );
    }
    Ok(())
}

/// The NAT rules besides Services, for both families: `node.cluster_cidr` (kube-proxy's
/// `--cluster-cidr`, one prefix per family: Service traffic from outside it is masqueraded)
/// and `[masquerade]` (pod traffic leaving the cluster CIDR of its family through `out`
/// takes `out`'s address of that family, as `iptables` and `ip6tables` MASQUERADE rules) and
/// the `[[snat]]`s (each of its `src`'s family, in file order). `iface` resolves interface
/// names.
pub fn to_nat_rules(
    cfg: &Config,
    iface: impl Fn(&str) -> Option<IfaceId>,
) -> Result<NatRules, String> {
    let cluster = cfg
        .node
        .cluster_cidr
        .map(|c| Prefix::new(c.network(), c.len));
    let cluster6 = cfg
        .node
        .cluster_cidr6
        .map(|c| Prefix6::new(c.network(), c.len));
    let mut rules = NatRules {
        cluster_cidr: cluster,
        cluster_cidr6: cluster6,
        ..NatRules::default()
    };
    if let Some(m) = &cfg.masquerade {
        let out = iface(&m.out)
            .ok_or_else(|| format!("[masquerade]: out = {:?}: no router interface", m.out))?;
        // Each family's pod traffic from its cluster CIDR (an IPv6-only cluster has no IPv4
        // one, and so no IPv4 rule).
        if let Some(c) = cluster {
            rules.masquerade.push(MasqueradeRule {
                out,
                src: Some(c),
                except_dst: Some(c),
            });
        }
        // IPv6 pod traffic is masqueraded only from the IPv6 cluster CIDR (without one the
        // IPv6 pods are not cluster pods: `check` warns), to `out`'s global IPv6 address.
        if let Some(c6) = cluster6 {
            rules.masquerade6.push(MasqueradeRule6 {
                out,
                src: Some(c6),
                except_dst: Some(c6),
            });
        }
    }
    for s in &cfg.snats {
        let out =
            match &s.out {
                Some(o) => Some(iface(o).ok_or_else(|| {
                    format!("snat from {}: out = {o:?}: no router interface", s.src)
                })?),
                None => None,
            };
        let ports = s.ports.map(|(lo, hi)| PortRange { lo, hi });
        match (s.src, s.to) {
            (IpCidr::V4(src), std::net::IpAddr::V4(to)) => rules.snat.push(SnatRule {
                out,
                src: Prefix::new(src.network(), src.len),
                to,
                ports,
            }),
            (IpCidr::V6(src), std::net::IpAddr::V6(to)) => rules.snat6.push(SnatRule6 {
                out,
                src: Prefix6::new(src.network(), src.len),
                to,
                ports,
            }),
            // `check` refuses a family mix-up.
            _ => {
                return Err(format!(
                    "snat from {}: to = {} is of the other family",
                    s.src, s.to
                ))
            }
        }
    }
    Ok(rules)
}

/// Applies the Services to the node's NAT: every Service of `services` is added or changed
/// (by name; a changed endpoint list takes effect for new connections, established TCP
/// connections keep their endpoint, UDP flows to removed endpoints are flushed as kube-proxy
/// does), and every Service the NAT has that `services` lacks is removed. Each refusal names
/// the Service and the field; the others are still applied.
pub fn apply_services(node: &Node, services: &[ServiceCfg]) -> Result<Vec<String>, Vec<String>> {
    apply_services_named(node, services)
        .map_err(|refused| refused.into_iter().map(|(_, e)| e).collect())
}

/// As [`apply_services`], each refusal with the name of its Service (a refused Service keeps
/// what it had: the library changes nothing of a Service it refuses).
fn apply_services_named(
    node: &Node,
    services: &[ServiceCfg],
) -> Result<Vec<String>, Vec<(String, String)>> {
    let Some(nf) = node.dp.control().netfilter() else {
        if services.is_empty() {
            return Ok(Vec::new());
        }
        let e = "Services need a router interface (a bridge with an address or an uplink)";
        return Err(services
            .iter()
            .map(|s| (s.name.clone(), e.to_string()))
            .collect());
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
            let spec = s.spec();
            if nf
                .services()
                .get(&s.name)
                .is_some_and(|r| *r.spec() == spec)
            {
                continue;
            }
            match nf.upsert_service(spec, now) {
                Ok(id) => done.push(format!(
                    "service {:?} applied (id {id}): {}/{}{} -> {} endpoint(s)",
                    s.name,
                    s.describe_frontends(),
                    proto_name(s.proto),
                    s.node_port
                        .map_or(String::new(), |p| format!(" node port {p}")),
                    s.endpoints.len()
                )),
                Err(_) if round == 0 => refused.push(s),
                Err(e) => errors.push((s.name.clone(), service_error(&node.config_path, s, &e))),
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
        E::BadVip { vip, .. } | E::DuplicateVip { vip, .. } => cluster_ip_key(s, vip.is_ipv6()),
        E::UnsupportedProto { .. } => "protocol".into(),
        E::DuplicateNodePort { .. } => "node_port".into(),
        E::DuplicateEndpoint { endpoint, .. } | E::BadEndpoint { endpoint, .. } => {
            endpoint_key(s, |a| {
                a.ip() == endpoint.ip() && a.port() == endpoint.port()
            })
        }
        E::TooManyEndpoints { .. } => "endpoints".into(),
        E::NoClusterIp { field, .. } => {
            let v6 = *field == "endpoints6";
            endpoint_key(s, |a| a.is_ipv6() == v6)
        }
        E::BadAffinityTimeout { .. } => "session_affinity_timeout".into(),
        _ => "name".into(),
    };
    let line = s.lines.of(&key);
    let key = key.split('.').next().unwrap_or_default().to_string();
    format!("{}:{line}: {e} (config key {key})", file.display())
}

/// The key of a Service's ClusterIP of a family (`cluster_ip.N` when the file gives a list).
fn cluster_ip_key(s: &ServiceCfg, v6: bool) -> String {
    s.cluster_ips
        .iter()
        .position(|ip| ip.is_ipv6() == v6)
        .map(|i| format!("cluster_ip.{i}"))
        .filter(|k| s.lines.has(k))
        .unwrap_or_else(|| "cluster_ip".into())
}

/// The key of a Service's last endpoint that `is` picks (`endpoints.N`), else `endpoints`.
fn endpoint_key(s: &ServiceCfg, is: impl Fn(std::net::SocketAddr) -> bool) -> String {
    s.endpoints
        .iter()
        .rposition(|x| is(x.addr))
        .map_or("endpoints".into(), |i| format!("endpoints.{i}"))
}

/// `<state_dir>/conntrack`, creating the state directory (mode 0700) if needed; a state
/// directory that fails [`crate::secure::check_dir`] is refused.
fn conntrack_file(state_dir: &std::path::Path) -> Result<PathBuf, String> {
    crate::secure::check_dir(state_dir, true).map_err(|e| format!("[node] state_dir: {e}"))?;
    if let Some(fs) = fs_type(state_dir).filter(|t| t != "tmpfs" && t != "ramfs") {
        log::warn!(
            "[node] state_dir {} is on {fs}, not a tmpfs: the connection table mapped there is written back to disk by the kernel (put the state directory on a tmpfs such as /run)",
            state_dir.display()
        );
    }
    Ok(state_dir.join("conntrack"))
}

/// The file system type of the mount holding `dir` (from /proc/self/mountinfo), if known.
fn fs_type(dir: &std::path::Path) -> Option<String> {
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
    cfg: Config,
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
    ) -> Result<Plan, String> {
        let mut b = Datapath::builder();
        b.neigh_config(cfg.neigh.clone())
            .map_err(|e| format!("[neigh]: {}", error_chain(&e)))?;
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
            let mut c = IfaceConfig::new6(name, mac, std::net::Ipv6Addr::UNSPECIFIED, 0);
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
                .map_err(|e| format!("bridge {:?}: {e}", br.name))?;
            bridge_ids.push((br.name.clone(), id));
            if br.address.is_some() || br.address6.is_some() {
                let (iid, _) = b
                    .add_router_iface(
                        iface_cfg(&br.name, br.address, br.address6, br.ra, br.mac, br.mtu),
                        Some(id),
                    )
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
                .add_router_iface(
                    iface_cfg(&u.name, u.address, u.address6, false, u.mac, u.mtu),
                    None,
                )
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
                v.address.addr(),
            );
            vc.prefix_len = v.address.len();
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
                .map_err(|e| format!("vxlan {:?}: {e}", v.name))?;
            iface_ids.push((v.name.clone(), iid));
        }
        if iface_ids.is_empty() && (!cfg.services.is_empty() || cfg.masquerade.is_some()) {
            return Err(
                "Services and [masquerade] need a router interface (a bridge with an address or an uplink)"
                    .into(),
            );
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
    pub fn add_port(&mut self, name: &str, bridge: BridgeId) -> Result<PortId, String> {
        self.b
            .add_port(name.to_string(), Some(bridge))
            .map_err(|e| format!("port {name:?}: {e}"))
    }

    /// Creates (or attaches to) the config's TAP `i` of [`Plan::taps`] in tapyard's
    /// namespace, as a start without a record of it does: its registry entry.
    pub fn open_config_port(&self, i: usize) -> Result<PortEntry, String> {
        let (id, name, tap, bridge) = self
            .taps
            .get(i)
            .ok_or_else(|| format!("no config port {i}"))?;
        let mtu = tap_mtu(&self.cfg, name, bridge.as_deref());
        let (mut dev, link) =
            open_config_tap(tap, self.cfg.node.offload, &self.cfg.node.name, mtu)?;
        if bridge.is_none() {
            tunnel_offload(&self.cfg, name, self.cfg.node.offload, &mut dev);
        }
        Ok(PortEntry {
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
            link,
            netns: None,
            netns_id: None,
            origin: Origin::Config,
            capture: Arc::default(),
            dev: Some(Arc::new(dev)),
            offload: self.cfg.node.offload,
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
    pub fn build(mut self, handed_over: Option<std::fs::File>) -> Result<Built, String> {
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
                .map_err(|e| format!("[conntrack]: {}", error_chain(&e)))?;
            if let Some(r) = self.b.recovery() {
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
            match self.b.recovery6() {
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
    cfg: Config,
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
    pub fn run(self, ports: Vec<PortEntry>) -> Result<Node, String> {
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
                return Err(format!("port {:?}: no device", e.name));
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
        .map_err(|e| format!("cannot start the worker threads: {e}"))?;
        match rt.io_fallback() {
            Some(why) => log::warn!("{why}"),
            None => log::info!("TAP I/O: {:?}", rt.io()),
        }
        if cfg.node.offload && !any_offload {
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
            // The workers' buffers fit offload TAPs only if one was there at start.
            offload: cfg.node.offload && any_offload,
            ifaces,
            workers,
            state: sd,
            refused: Mutex::default(),
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
        if let (Some(nf), true) = (node.dp.control().netfilter(), kept_connections > 0) {
            // Connections kept from the previous process: their Service ids and affinity.
            let (retagged, affinity) = nf.services().relink(nf.conntrack(), node.now());
            log::info!(
                "conntrack: kept connections linked to the Services again ({retagged} renumbered, {affinity} client affinities restored)"
            );
        }
        if let (Some(nf), true) = (node.dp.control().netfilter(), kept_connections6 > 0) {
            let (retagged, affinity) = nf.services().relink6(nf.conntrack6(), node.now());
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
                "conntrack: at most {} connections ({} MiB reserved){}",
                ct.config().max_entries,
                ct.memory_bytes() >> 20,
                if ct.config().liberal { ", liberal" } else { "" }
            );
            let ct6 = nf.conntrack6();
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
        Ok(node)
    }
}

impl Node {
    /// Builds the datapath from `cfg`, re-attaches the ports the last run recorded (where
    /// they live now) or creates the config's TAPs, starts the workers, and adds routes,
    /// static neighbours and Services.
    pub fn start(cfg: Config, config_path: PathBuf) -> Result<Node, String> {
        let mut plan = Plan::new(cfg, config_path, &[])?;
        let sd = StateDir::new(plan.cfg.node.state_dir_path(), &plan.cfg.node.name);
        // The ports of the last run, to re-attach to (config ports below, by name; the others
        // here, before the datapath is built).
        let (mut cfg_recs, other_recs): (Vec<_>, Vec<_>) = sd
            .load_ports()
            .into_iter()
            .partition(|r| r.origin == Origin::Config);
        // Ports of `port add` and the CNI plugin, re-attached where they live now.
        let mut restored: Vec<(PortId, state::PortRecord, ports::Found)> = Vec::new();
        for r in other_recs {
            let who = format!(
                "port {}{}",
                r.name,
                r.owner
                    .as_deref()
                    .map_or(String::new(), |o| format!(" (owner {o})"))
            );
            let bid = r.bridge.as_deref().and_then(|n| plan.bridge(n));
            let Some(bid) = bid else {
                log::warn!(
                    "{who}: its bridge {:?} is no longer in the config: deleting its TAP",
                    r.bridge.as_deref().unwrap_or("-")
                );
                if let Err(e) = ports::delete_recorded(&r, sd.own_ns) {
                    log::warn!("{who}: {e}");
                }
                continue;
            };
            match ports::reattach(&r, sd.own_ns) {
                Ok(f) => match plan.add_port(&r.name, bid) {
                    Ok(pid) => restored.push((pid, r, f)),
                    Err(e) => {
                        log::warn!("{who}: cannot add it back ({e}): deleting its TAP");
                        let _ = f.tap.set_persist(false);
                    }
                },
                Err(why) => log::info!("{who}: dropped from the record: {why}"),
            }
        }
        let built = plan.build(None)?;
        let cfg = &built.cfg;
        let mut ports: Vec<PortEntry> = Vec::new();
        let mut reattached = 0;
        for (id, name, tap, bridge) in &built.taps {
            let kind = if bridge.is_some() {
                Kind::Pod
            } else {
                Kind::Uplink
            };
            // Where the last run left it (moved and renamed, maybe), else in tapyard's
            // namespace by name (attached to if it exists, created if not).
            let rec = cfg_recs
                .iter()
                .position(|r| r.name == *name && r.kind == kind)
                .map(|i| cfg_recs.swap_remove(i));
            let found = rec.and_then(|r| match ports::reattach(&r, sd.own_ns) {
                Ok(f) => Some((f, r.offload)),
                Err(why) => {
                    log::info!("port {name}: not re-attached ({why}); opening TAP {tap} in tapyard's namespace");
                    None
                }
            });
            let (mut dev, ifname, link, netns, offload) = match found {
                Some((f, offload)) => {
                    reattached += 1;
                    (f.tap, f.ifname, Some(f.link), f.netns, offload)
                }
                None => {
                    let mtu = tap_mtu(cfg, name, bridge.as_deref());
                    let (dev, link) = open_config_tap(tap, cfg.node.offload, &cfg.node.name, mtu)?;
                    (dev, tap.clone(), link, None, cfg.node.offload)
                }
            };
            if kind == Kind::Uplink {
                tunnel_offload(cfg, name, offload, &mut dev);
            }
            let (netns, netns_id) = netns.map_or((None, None), |(p, id)| (Some(p), Some(id)));
            ports.push(PortEntry {
                id: *id,
                name: name.clone(),
                tap: tap.clone(),
                ifname,
                owner: None,
                kind,
                bridge: bridge.clone(),
                link,
                netns,
                netns_id,
                origin: Origin::Config,
                capture: Arc::default(),
                dev: Some(Arc::new(dev)),
                offload,
            });
        }
        for r in cfg_recs {
            log::info!(
                "port {} left the config while tapyard was not running: deleting its TAP",
                r.name
            );
            if let Err(e) = ports::delete_recorded(&r, sd.own_ns) {
                log::warn!("port {}: {e}", r.name);
            }
        }
        for (id, r, f) in restored {
            let (netns, netns_id) = f.netns.map_or((None, None), |(p, id)| (Some(p), Some(id)));
            ports.push(PortEntry {
                id,
                name: r.name,
                tap: r.tap,
                ifname: f.ifname,
                owner: r.owner,
                kind: r.kind,
                bridge: r.bridge,
                link: Some(f.link),
                netns,
                netns_id,
                origin: r.origin,
                capture: Arc::default(),
                dev: Some(Arc::new(f.tap)),
                offload: r.offload,
            });
            reattached += 1;
        }
        let node = built.run(ports)?;
        log::info!(
            "ports recorded in {} ({reattached} re-attached from the last run)",
            node.state.dir.join(state::PORTS_FILE).display()
        );
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

    /// Re-reads the configuration file and applies what changed. Returns the changes made
    /// and those the library refused ([`Reloaded`]), or the reasons the whole file was
    /// refused (its errors, or changes that need a restart; then nothing changes).
    ///
    /// The configuration recorded as running ([`Node::current`]) is what runs: the file,
    /// with each refused change left as it was before ([`diff::running`]). So a reload of
    /// the same file retries what was refused, and says so.
    pub fn reload(&self) -> Result<Reloaded, Vec<String>> {
        let file = self.config_path.display().to_string();
        let checked = config::load(&self.config_path);
        let Some(new) = checked.config else {
            return Err(checked.errors().map(|d| d.render(&file)).collect());
        };
        let mut cur = self.current.lock().unwrap_or_else(|e| e.into_inner());
        let mut last = self.refused.lock().unwrap_or_else(|e| e.into_inner());
        let d = diff::diff(&cur, &new)?;
        if d.is_empty() {
            // What was refused last time is no longer in the file.
            last.clear();
            return Ok(Reloaded::default());
        }
        let refusals = self.apply(&d, &new);
        let mut out = Reloaded::default();
        for (line, item) in d.summary.iter().zip(&d.items) {
            let before = last.iter().find(|r| &r.item == item);
            let now: Vec<&str> = refusals
                .iter()
                .filter(|r| &r.item == item)
                .map(|r| r.reason.as_str())
                .collect();
            match (now.is_empty(), before) {
                (true, None) => out.changes.push(line.clone()),
                (true, Some(_)) => out
                    .changes
                    .push(format!("{line} (retried: refused at the last reload)")),
                (false, b) => out.refused.push(format!(
                    "{line}: refused{}: {}",
                    if b.is_some() { " again" } else { "" },
                    now.join("; ")
                )),
            }
        }
        for r in &refusals {
            if !d.touches(&r.item) {
                out.refused
                    .push(format!("{}: refused: {}", r.item, r.reason));
            }
        }
        *cur = diff::running(&cur, &new, &refusals);
        *last = refusals;
        Ok(out)
    }

    /// Applies a diff: removals first, then additions; returns what the library refused.
    fn apply(&self, d: &Diff, new: &Config) -> Vec<Refusal> {
        let mut errors = Vec::new();
        let refuse = |item: Item, reason: String, old_kept: bool| Refusal {
            item,
            reason,
            old_kept,
        };
        for (bridge, name) in &d.ports_removed {
            let _change = self.ports.changing();
            match self.ports.by_name(name) {
                Some(e) if e.origin == Origin::Config => {
                    if let Err(e) = self.port_remove(e) {
                        errors.push(refuse(Item::Port(bridge.clone(), name.clone()), e, true));
                    }
                }
                _ => {
                    log::warn!("port {name:?} of bridge {bridge:?}: not running, nothing to remove")
                }
            }
        }
        for (bridge, name) in &d.ports_added {
            match self.port_add_local(bridge, name, None, Origin::Config) {
                Ok(e) => {
                    // The bridge's MTU, as the ports it started with.
                    let mtu = u32::from(tap_mtu(new, name, Some(bridge)));
                    if let (Some(l), Ok(mut nl)) = (&e.link, Netlink::open()) {
                        if l.mtu != mtu {
                            if let Err(err) = nl.set_mtu(l.index, mtu) {
                                log::warn!("TAP {}: cannot set its MTU to {mtu}: {err}", e.tap);
                            }
                        }
                    }
                }
                Err(e) => errors.push(refuse(
                    Item::Port(bridge.clone(), name.clone()),
                    format!("bridge {bridge:?}: port {name:?}: {e}"),
                    false,
                )),
            }
        }
        let same_key = |a: &RouteCfg, b: &RouteCfg| a.to == b.to && a.metric == b.metric;
        for r in &d.routes_removed {
            // A changed route is replaced in one update below: no window without it.
            if d.routes_added.iter().any(|n| same_key(n, r)) {
                continue;
            }
            if let Err(e) = remove_route(&self.dp, r) {
                errors.push(refuse(Item::Route(r.to, r.metric), e, true));
            }
        }
        for r in &d.routes_added {
            let replace = d.routes_removed.iter().any(|o| same_key(o, r));
            // A refused replacement leaves the old route in place.
            if let Err(e) = add_route(&self.dp, new, r, replace) {
                errors.push(refuse(Item::Route(r.to, r.metric), e, true));
            }
        }
        // A removed peer stops at once: nothing is sent to it or accepted from it from the
        // workers' next batch on.
        for (v, p) in &d.peers_removed {
            if let Err(e) = self.dp.control().remove_vxlan_peer(v, p.node_ip) {
                let e = format!("vxlan {v:?}: peer {}: {e}", p.node_ip);
                errors.push(refuse(Item::Peer(v.clone(), p.node_ip), e, true));
            }
        }
        for (v, p) in &d.peers_added {
            if let Err(e) = add_peer(&self.dp, v, p, self.now()) {
                errors.push(refuse(Item::Peer(v.clone(), p.node_ip), e, false));
            }
        }
        for n in &d.neighbors_removed {
            if let Err(e) = remove_neighbor(&self.dp, n) {
                errors.push(refuse(Item::Neighbor(n.dev.clone(), n.ip), e, true));
            }
        }
        let now = self.now();
        for n in &d.neighbors_added {
            if let Err(e) = add_neighbor(&self.dp, n, now) {
                errors.push(refuse(Item::Neighbor(n.dev.clone(), n.ip), e, false));
            }
        }
        if d.nat_rules {
            if let Some(nf) = self.dp.control().netfilter() {
                match to_nat_rules(new, |n| self.dp.control().iface_by_name(n)) {
                    Ok(rules) => nf.set_rules(rules),
                    Err(e) => errors.push(refuse(Item::NatRules, e, true)),
                }
            }
        }
        if let Some(s) = &d.services {
            match apply_services_named(self, s) {
                Ok(done) => {
                    for line in done {
                        log::debug!("{line}");
                    }
                }
                Err(e) => errors.extend(
                    e.into_iter()
                        .map(|(name, e)| refuse(Item::Service(name), e, true)),
                ),
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
        let web = c.services[0].spec();
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
        let dns = c.services[1].spec();
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
            vip: web.vip4().unwrap().into(),
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

    /// An IPv6 frontend or endpoint the library refuses is reported at the line of the
    /// ClusterIP or the endpoint of that family.
    #[test]
    fn a_refused_ipv6_service_names_the_line_of_its_family() {
        let text = include_str!("../../examples/node-dual-stack.toml").replace(
            "cluster_ip = [\"10.96.0.10\", \"fd00:10:96::a\"]",
            "cluster_ip = [\n  \"10.96.0.10\",\n  \"fd00:10:96::a\",\n]",
        ).replace(
            "endpoints = [\"10.244.1.2:8080\", \"10.244.2.2:8080\", \"[fd00:10:244:1::2]:8080\", \"[fd00:10:244:2::2]:8080\"]",
            "endpoints = [\n  \"10.244.1.2:8080\",\n  \"[fd00:10:244:1::2]:8080\",\n  \"10.244.2.2:8080\",\n  \"[fd00:10:244:2::2]:8080\",\n]",
        );
        let c = cfg(&text);
        let web = c.services.iter().find(|s| s.name == "web").unwrap();
        let line = |pat: &str| text.lines().position(|l| l.contains(pat)).unwrap() + 1;
        let file = std::path::Path::new("node.toml");
        let vip6: std::net::Ipv6Addr = "fd00:10:96::a".parse().unwrap();
        let e = ServiceError::DuplicateVip {
            service: "web".into(),
            vip: vip6.into(),
            port: 80,
            proto: 6,
            other: "web6".into(),
        };
        let msg = service_error(file, web, &e);
        assert!(
            msg.starts_with(&format!(
                "node.toml:{}: service \"web\": vip6:port [fd00:10:96::a]:80/TCP",
                line("\"fd00:10:96::a\",")
            )),
            "{msg}"
        );
        assert!(msg.ends_with("(config key cluster_ip)"), "{msg}");
        let e = ServiceError::BadVip {
            service: "web".into(),
            vip: std::net::Ipv4Addr::new(10, 96, 0, 10).into(),
        };
        assert!(service_error(file, web, &e)
            .starts_with(&format!("node.toml:{}:", line("\"10.96.0.10\","))));
        let e = ServiceError::DuplicateEndpoint {
            service: "web".into(),
            endpoint: "[fd00:10:244:2::2]:8080".parse().unwrap(),
        };
        let msg = service_error(file, web, &e);
        assert!(
            msg.starts_with(&format!(
                "node.toml:{}:",
                line("\"[fd00:10:244:2::2]:8080\",")
            )),
            "{msg}"
        );
        assert!(msg.ends_with("(config key endpoints)"), "{msg}");
        let e = ServiceError::NoClusterIp {
            service: "web".into(),
            field: "endpoints6",
        };
        assert!(service_error(file, web, &e).starts_with(&format!(
            "node.toml:{}:",
            line("\"[fd00:10:244:2::2]:8080\",")
        )));
    }

    /// The dual-stack example builds: the interfaces' IPv6 addresses (and RA on cni0), the
    /// IPv6 routes beside the IPv4 ones, as `ip -6 route` prints them.
    #[test]
    fn dual_stack_config_builds_the_ipv6_router() {
        let dir = std::env::temp_dir().join(format!("tapyard-plan6-{}", std::process::id()));
        let text = include_str!("../../examples/node-dual-stack.toml").replace(
            "name = \"node-a\"\n",
            &format!("name = \"node-a\"\nstate_dir = \"{}\"\n", dir.display()),
        );
        let mut c = cfg(&text);
        c.routes.push(
            cfg(&format!(
                "{text}\n[[route]]\nto = \"fd00:99::/64\"\nvia = \"fe80::1\"\ndev = \"eth0\"\n"
            ))
            .routes
            .pop()
            .unwrap(),
        );
        let built = Plan::new(c, PathBuf::from("x.toml"), &[])
            .unwrap()
            .build(None)
            .unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let dp = &built.dp;
        let r = dp.control().router().unwrap();
        let cni0 = dp.control().iface_by_name("cni0").unwrap();
        let eth0 = dp.control().iface_by_name("eth0").unwrap();
        assert_eq!(
            r.iface_addr::<Ipv6Addr>(cni0),
            Some(("fd00:10:244:1::1".parse().unwrap(), 64))
        );
        assert_eq!(
            r.iface_addr::<Ipv6Addr>(eth0),
            Some(("fd00:172:18::2".parse().unwrap(), 64))
        );
        assert!(r
            .link_local6(cni0)
            .unwrap()
            .to_string()
            .starts_with("fe80::"));
        let mut text = String::new();
        dp.control().fmt_routes(&mut text).unwrap();
        for want in [
            "10.244.2.0/24 via 172.18.0.3 dev eth0",
            "fd00:10:244:2::/64 via fd00:172:18::3 dev eth0",
            "fd00:99::/64 via fe80::1 dev eth0",
            "default via fd00:172:18::1 dev eth0",
            "fd00:10:244:1::/64 dev cni0",
        ] {
            assert!(text.contains(want), "no {want:?} in\n{text}");
        }
    }

    /// The IPv6-only example builds: its interfaces have no IPv4 address and no IPv4
    /// connected route; the NAT rules have no IPv4 masquerade.
    #[test]
    fn ipv6_only_config_builds_a_router_without_ipv4() {
        let dir = std::env::temp_dir().join(format!("tapyard-plan6only-{}", std::process::id()));
        let text = include_str!("../../examples/node-ipv6-only.toml").replace(
            "name = \"node-a\"\n",
            &format!("name = \"node-a\"\nstate_dir = \"{}\"\n", dir.display()),
        );
        let c = cfg(&text);
        let rules = to_nat_rules(&c, |n| (n == "eth0").then_some(IfaceId(1))).unwrap();
        assert!(rules.masquerade.is_empty() && rules.cluster_cidr.is_none());
        assert_eq!(rules.masquerade6.len(), 1);
        let built = Plan::new(c, PathBuf::from("x.toml"), &[])
            .unwrap()
            .build(None)
            .unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let dp = &built.dp;
        let r = dp.control().router().unwrap();
        for name in ["cni0", "eth0"] {
            let i = dp.control().iface_by_name(name).unwrap();
            assert_eq!(r.iface_addr::<std::net::Ipv4Addr>(i), None);
            assert!(r.iface_addr::<Ipv6Addr>(i).is_some());
        }
        let mut text = String::new();
        dp.control().fmt_routes(&mut text).unwrap();
        assert!(text.contains("fd00:10:244:1::/64 dev cni0"), "{text}");
        assert!(
            text.contains("default via fd00:172:18::1 dev eth0"),
            "{text}"
        );
        assert!(
            !text.contains('.'),
            "an IPv4 route on an IPv6-only node:\n{text}"
        );
    }

    #[test]
    fn the_state_dir_file_system_is_found() {
        assert_eq!(
            fs_type(std::path::Path::new("/proc/self")).as_deref(),
            Some("proc")
        );
        if std::path::Path::new("/dev/shm").is_dir() {
            assert_eq!(
                fs_type(std::path::Path::new("/dev/shm")).as_deref(),
                Some("tmpfs")
            );
        }
        assert_eq!(fs_type(std::path::Path::new("/no/such/dir")), None);
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
        // An IPv4-only file: no IPv6 rules.
        assert_eq!(r.cluster_cidr6, None);
        assert!(r.masquerade6.is_empty());
        assert!(to_nat_rules(&c, |_| None)
            .unwrap_err()
            .contains("[masquerade]: out = \"eth0\""));
        let mut none = c.clone();
        none.masquerade = None;
        assert!(to_nat_rules(&none, ids).unwrap().masquerade.is_empty());
    }

    /// The IPv6 table follows `max_entries` on a node with an IPv6 address, is minimal on one
    /// without, and `max_entries6` sets it on both; changing it needs a restart.
    #[test]
    fn ipv6_conntrack_size_follows_the_node_s_families() {
        let dual = include_str!("../../examples/node-dual-stack.toml");
        let v4 = cfg(EXAMPLE);
        assert_eq!(v4.conntrack6().max_entries, crate::config::MIN_CONNTRACK6);
        assert_eq!(v4.conntrack.max_entries, 262_144);
        let c = cfg(dual);
        assert_eq!(c.conntrack6().max_entries, 262_144);
        let c = cfg(&format!("{dual}\n[conntrack]\nmax_entries = 5000\n"));
        assert_eq!(c.conntrack6().max_entries, 5000);
        assert_eq!(c.conntrack6().timeouts, c.conntrack.timeouts);
        let own = cfg(&format!(
            "{dual}\n[conntrack]\nmax_entries = 5000\nmax_entries6 = 700\n"
        ));
        assert_eq!(
            (own.conntrack.max_entries, own.conntrack6().max_entries),
            (5000, 700)
        );
        let v4own = cfg(&format!("{EXAMPLE}\n[conntrack]\nmax_entries6 = 300\n"));
        assert_eq!(v4own.conntrack6().max_entries, 300);
        let e = crate::diff::diff(&c, &own).unwrap_err();
        assert_eq!(e, ["[conntrack] changed: this needs a restart of tapyard"]);
        // The tables are made with them.
        let nf = tapyard::nat::Netfilter::new(NatConfig {
            conntrack: v4.conntrack,
            conntrack6: Some(v4.conntrack6()),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(nf.conntrack6().config().max_entries, 64);
        assert!(nf.conntrack6().memory_bytes() < 64 << 10);
        assert!(nf.conntrack6().fmt_dump(Instant::ZERO).is_empty());
    }

    /// `[[snat]]`s go to the rules of their family, in file order, with their ports and
    /// interface (`ip6tables -t nat -A POSTROUTING -s fd00:10:244:1::/64 -j SNAT
    /// --to-source [fd00:172:18::50]:1024-65535` for the second).
    #[test]
    fn snat_rules_of_both_families() {
        let src = format!(
            "{}\n[[snat]]\nsrc = \"10.244.1.0/24\"\nto = \"172.18.0.50\"\nout = \"eth0\"\nports = \"5000-5999\"\n\n[[snat]]\nsrc = \"fd00:10:244:1::/64\"\nto = \"fd00:172:18::50\"\n",
            include_str!("../../examples/node-dual-stack.toml")
        );
        let c = cfg(&src);
        let ids = |n: &str| (n == "eth0").then_some(IfaceId(1));
        let r = to_nat_rules(&c, ids).unwrap();
        assert_eq!(
            r.snat,
            [SnatRule {
                out: Some(IfaceId(1)),
                src: Prefix::new(std::net::Ipv4Addr::new(10, 244, 1, 0), 24),
                to: std::net::Ipv4Addr::new(172, 18, 0, 50),
                ports: Some(PortRange { lo: 5000, hi: 5999 }),
            }]
        );
        assert_eq!(
            r.snat6,
            [SnatRule6 {
                out: None,
                src: Prefix6::new("fd00:10:244:1::".parse().unwrap(), 64),
                to: "fd00:172:18::50".parse().unwrap(),
                // No range given: iptables' default, the original port's class.
                ports: None,
            }]
        );
        // A reload that changes them sets the rules anew.
        let d = crate::diff::diff(
            &cfg(include_str!("../../examples/node-dual-stack.toml")),
            &c,
        )
        .unwrap();
        assert!(d.nat_rules, "{:?}", d.summary);
        assert!(
            d.summary.iter().any(|l| l.starts_with("snat none -> 10.244.1.0/24 to 172.18.0.50:5000-5999 out eth0, fd00:10:244:1::/64 to fd00:172:18::50")),
            "{:?}",
            d.summary
        );
    }

    /// A dual-stack file: the IPv6 cluster CIDR and `[masquerade]` for IPv6 too
    /// (`ip6tables -t nat -A POSTROUTING -s fd00:10:244::/56 ! -d fd00:10:244::/56 -o eth0
    /// -j MASQUERADE`); without `[masquerade]` none of either family.
    #[test]
    fn nat_rules_for_both_families() {
        let c = cfg(include_str!("../../examples/node-dual-stack.toml"));
        let ids = |n: &str| match n {
            "cni0" => Some(IfaceId(0)),
            "eth0" => Some(IfaceId(1)),
            _ => None,
        };
        let r = to_nat_rules(&c, ids).unwrap();
        let c6 = Prefix6::new("fd00:10:244::".parse().unwrap(), 56);
        assert_eq!(r.cluster_cidr6, Some(c6));
        assert_eq!(
            r.masquerade6,
            [MasqueradeRule6 {
                out: IfaceId(1),
                src: Some(c6),
                except_dst: Some(c6)
            }]
        );
        assert_eq!(r.masquerade.len(), 1);
        let mut none = c.clone();
        none.masquerade = None;
        let r = to_nat_rules(&none, ids).unwrap();
        assert!(r.masquerade.is_empty() && r.masquerade6.is_empty());
        assert_eq!(r.cluster_cidr6, Some(c6));
    }
}
