//! The config's routes, neighbours, VXLAN peers, NAT rules and Services as the library's types.

use std::net::{IpAddr, Ipv6Addr};

use tapyard::l3::VxlanPeer;
use tapyard::l3::{IfaceId, NextHop, Route, RouteAddr, RouteProto};
use tapyard::nat::ServiceError;
use tapyard::nat::{MasqueradeRule, NatRules, PortRange, Prefix, SnatRule};
use tapyard::{Datapath, Instant};

use crate::config::{
    proto_name, Config, IpCidr, NeighborCfg, PeerCfg, RouteCfg, RouteType, ServiceCfg,
};

use super::Node;
use super::{BoxError, NodeError};

/// `Err`: a message about the config.
fn fail<T>(msg: String) -> Result<T, NodeError> {
    Err(NodeError::Config(msg))
}

/// The library route for a configured IPv4 one; interfaces are resolved by name, a gateway
/// without `dev` goes out of the interface whose subnet holds it.
pub fn to_route(dp: &Datapath, cfg: &Config, r: &RouteCfg) -> Result<Route, NodeError> {
    let IpCidr::V4(to) = r.to else {
        return fail(format!("route to {}: not an IPv4 route", r.to));
    };
    let via = match r.via {
        Some(IpAddr::V4(gw)) => Some(gw),
        Some(IpAddr::V6(gw)) => return fail(format!("route to {}: via {gw} is IPv6", r.to)),
        None => None,
    };
    route_of(dp, r, (to.network(), to.len), via, |gw| {
        cfg.connected_iface(gw)
    })
}

/// The library route for a configured IPv6 one; a gateway without `dev` goes out of the
/// interface whose IPv6 subnet holds it (a link-local one has its `dev`: `check` says so).
pub fn to_route6(dp: &Datapath, cfg: &Config, r: &RouteCfg) -> Result<Route<Ipv6Addr>, NodeError> {
    let IpCidr::V6(to) = r.to else {
        return fail(format!("route to {}: not an IPv6 route", r.to));
    };
    let via = match r.via {
        Some(IpAddr::V6(gw)) => Some(gw),
        Some(IpAddr::V4(gw)) => return fail(format!("route to {}: via {gw} is IPv4", r.to)),
        None => None,
    };
    route_of(dp, r, (to.network(), to.len), via, |gw| {
        cfg.connected_iface6(gw)
    })
}

/// The library route of family `A` for configured route `r` to `prefix`/`len` via `via`;
/// `connected` names the interface whose subnet holds a gateway given without `dev`.
fn route_of<A: RouteAddr>(
    dp: &Datapath,
    r: &RouteCfg,
    (prefix, len): (A, u8),
    via: Option<A>,
    connected: impl Fn(A) -> Option<String>,
) -> Result<Route<A>, NodeError> {
    let iface = |name: &str| {
        dp.control()
            .iface_by_name(name)
            .ok_or_else(|| format!("route to {}: no router interface named {name:?}", r.to))
    };
    let next_hop = match (r.kind, via, &r.dev) {
        (RouteType::Blackhole, _, _) => NextHop::Blackhole,
        (RouteType::Unreachable, _, _) => NextHop::Unreachable,
        (RouteType::Unicast, Some(gw), Some(dev)) => NextHop::Via(iface(dev)?, gw),
        (RouteType::Unicast, Some(gw), None) => {
            let dev = connected(gw).ok_or_else(|| {
                format!(
                    "route to {}: gateway {gw} is not on a connected {}subnet",
                    r.to,
                    A::NAME
                )
            })?;
            NextHop::Via(iface(&dev)?, gw)
        }
        (RouteType::Unicast, None, Some(dev)) => NextHop::Link(iface(dev)?),
        (RouteType::Unicast, None, None) => {
            return fail(format!("route to {}: no via, dev or type", r.to))
        }
    };
    Ok(Route {
        prefix,
        len,
        next_hop,
        metric: r.metric,
        proto: RouteProto::Static,
        src: None,
    })
}

/// Adds a configured route of either family (`replace`: in place of the one with its prefix
/// and metric).
pub(super) fn add_route(
    dp: &Datapath,
    cfg: &Config,
    r: &RouteCfg,
    replace: bool,
) -> Result<(), NodeError> {
    let refused = |e: BoxError| NodeError::refused(format!("route {}", r.describe()), e);
    match r.to {
        IpCidr::V4(_) => {
            let route = to_route(dp, cfg, r)?;
            if replace {
                dp.control().replace_route(route).map(|_| ())
            } else {
                dp.control().add_route(route)
            }
            .map_err(|e| refused(e.into()))
        }
        IpCidr::V6(_) => {
            let route = to_route6(dp, cfg, r)?;
            if replace {
                dp.control().replace_route(route).map(|_| ())
            } else {
                dp.control().add_route(route)
            }
            .map_err(|e| refused(e.into()))
        }
    }
}

/// Removes a configured route of either family.
pub(super) fn remove_route(dp: &Datapath, r: &RouteCfg) -> Result<(), NodeError> {
    match r.to {
        IpCidr::V4(to) => dp
            .control()
            .remove_route(to.network(), to.len, Some(r.metric))
            .map(|_| ())
            .map_err(|e| NodeError::refused(format!("route {}", r.describe()), e)),
        IpCidr::V6(to) => dp
            .control()
            .remove_route(to.network(), to.len, Some(r.metric))
            .map(|_| ())
            .map_err(|e| NodeError::refused(format!("route {}", r.describe()), e)),
    }
}

pub(super) fn add_neighbor(dp: &Datapath, n: &NeighborCfg, now: Instant) -> Result<(), NodeError> {
    let iface = dp
        .control()
        .iface_by_name(&n.dev)
        .ok_or_else(|| format!("neighbor {}: no router interface named {:?}", n.ip, n.dev))?;
    match n.ip {
        IpAddr::V4(ip) => dp.control().add_static_neigh(iface, ip, n.mac, now),
        IpAddr::V6(ip) => dp.control().add_static_neigh(iface, ip, n.mac, now),
    }
    .map_err(|e| NodeError::refused(format!("neighbor {} dev {}", n.ip, n.dev), e))
}

/// The library's peer for a `[[vxlan.peer]]`.
pub fn to_peer(p: &PeerCfg) -> VxlanPeer {
    VxlanPeer::new(
        p.node_ip,
        p.vtep_mac,
        p.pod_cidr.network(),
        p.pod_cidr.prefix_len(),
    )
}

pub(super) fn add_peer(
    dp: &Datapath,
    vxlan: &str,
    p: &PeerCfg,
    now: Instant,
) -> Result<(), NodeError> {
    dp.control()
        .add_vxlan_peer(vxlan, to_peer(p), now)
        .map_err(|e| NodeError::refused(format!("vxlan {vxlan:?}: peer {}", p.node_ip), e))
}

pub(super) fn remove_neighbor(dp: &Datapath, n: &NeighborCfg) -> Result<(), NodeError> {
    let Some(iface) = dp.control().iface_by_name(&n.dev) else {
        return fail(format!(
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
) -> Result<NatRules, NodeError> {
    let cluster = cfg
        .node
        .cluster_cidr
        .map(|c| Prefix::new(c.network(), c.len));
    let cluster6 = cfg
        .node
        .cluster_cidr6
        .map(|c| Prefix::new(c.network(), c.len));
    let mut rules = NatRules {
        cluster_cidr: cluster,
        cluster_cidr6: cluster6,
        masquerade_all: cfg.node.masquerade_all,
        random_fully: cfg.node.random_fully,
        ..NatRules::default()
    };
    for c in &cfg.node.node_port_addresses {
        match c {
            IpCidr::V4(c) => rules
                .node_port_addresses
                .push(Prefix::new(c.network(), c.len)),
            IpCidr::V6(c) => rules
                .node_port_addresses6
                .push(Prefix::new(c.network(), c.len)),
        }
    }
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
            rules.masquerade6.push(MasqueradeRule {
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
            (IpCidr::V6(src), std::net::IpAddr::V6(to)) => rules.snat6.push(SnatRule {
                out,
                src: Prefix::new(src.network(), src.len),
                to,
                ports,
            }),
            // `check` refuses a family mix-up.
            _ => {
                return fail(format!(
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
pub(super) fn apply_services_named(
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
        E::ZeroPort { field, .. } if *field == "health_check_node_port" => {
            "health_check_node_port".into()
        }
        E::ZeroPort { .. } => "port".into(),
        E::BadVip { vip, .. } | E::DuplicateVip { vip, .. } => cluster_ip_key(s, vip.is_ipv6()),
        E::UnsupportedProto { .. } => "protocol".into(),
        E::DuplicateNodePort { .. } => "node_port".into(),
        E::DuplicateHealthPort { .. } => "health_check_node_port".into(),
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
pub(super) fn cluster_ip_key(s: &ServiceCfg, v6: bool) -> String {
    s.cluster_ips
        .iter()
        .position(|ip| ip.is_ipv6() == v6)
        .map(|i| format!("cluster_ip.{i}"))
        .filter(|k| s.lines.has(k))
        .unwrap_or_else(|| "cluster_ip".into())
}

/// The key of a Service's last endpoint that `is` picks (`endpoints.N`), else `endpoints`.
pub(super) fn endpoint_key(s: &ServiceCfg, is: impl Fn(std::net::SocketAddr) -> bool) -> String {
    s.endpoints
        .iter()
        .rposition(|x| is(x.addr))
        .map_or("endpoints".into(), |i| format!("endpoints.{i}"))
}
