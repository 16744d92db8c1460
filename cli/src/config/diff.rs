//! What a reload changes: a pure comparison of the running configuration with the new one.
//!
//! Routes, static neighbours, Services, `[masquerade]`, `[[snat]]`, `node.cluster_cidr` (the NAT rules),
//! the `ports` of a bridge and the peers of a `[[vxlan]]` are applied live; everything else (the node's identity and threads,
//! bridges' other settings, uplinks, addresses, `[conntrack]` and `[neigh]` table limits) needs
//! a restart, and a reload that changes any of it is refused as a whole, naming each change.
//! Only the file's ports are compared: ports from `tapyard port add` and the CNI plugin are
//! not in the file, and a reload never touches them.

//!
//! Items are compared by value ([`Located::value`]), never by the lines they were read from.

use crate::config::{
    BridgeCfg, Config, EndpointCfg, Located, NeighborCfg, PeerCfg, RouteCfg, ServiceCfg, UplinkCfg,
    VxlanCfg,
};

/// The live changes of a reload.
#[derive(Clone, Debug, Default)]
pub struct Diff {
    /// Routes to remove (before the additions).
    pub routes_removed: Vec<RouteCfg>,
    /// Routes to add.
    pub routes_added: Vec<RouteCfg>,
    /// Static neighbours to remove.
    pub neighbors_removed: Vec<NeighborCfg>,
    /// Static neighbours to add.
    pub neighbors_added: Vec<NeighborCfg>,
    /// The new Service list, when any Service changed.
    pub services: Option<Vec<ServiceCfg>>,
    /// The NAT rules changed (`[masquerade]`, `[[snat]]` or `node.cluster_cidr`): set them
    /// anew.
    pub nat_rules: bool,
    /// Ports to remove, as (bridge, port), before the additions.
    pub ports_removed: Vec<(String, String)>,
    /// Ports to add, as (bridge, port).
    pub ports_added: Vec<(String, String)>,
    /// VXLAN peers to remove, as (interface, peer), before the additions.
    pub peers_removed: Vec<(String, PeerCfg)>,
    /// VXLAN peers to add, as (interface, peer).
    pub peers_added: Vec<(String, PeerCfg)>,
    /// Bridges whose `spoof_guard` changed, with the new value: their ports' guards are
    /// set or cleared.
    pub guards: Vec<(String, bool)>,
    /// The prefixes the host port's kernel side no longer routes through it
    /// ([`crate::config::HostCfg::kernel_routes`]: its `routes`, `node.service_cidr` or
    /// `node.cluster_cidr` changed).
    pub host_routes_removed: Vec<crate::config::IpCidr>,
    /// The prefixes it routes through it now.
    pub host_routes_added: Vec<crate::config::IpCidr>,
    /// Ports, as (bridge, port), whose `[[bridge.port]]` `ips` or `mac` changed (or that
    /// were added with one): their guards are set anew.
    pub port_guards: Vec<(String, String)>,
    /// One line per change, for the log and the `reload` reply.
    pub summary: Vec<String>,
    /// What each line of [`Diff::summary`] changes (`items[i]` for `summary[i]`).
    pub items: Vec<Item>,
}

/// One thing a reload changes live, by its key: the unit the library applies or refuses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Item {
    /// The route with this destination and metric.
    Route(crate::config::IpCidr, u32),
    /// The static neighbour with this interface and address.
    Neighbor(String, std::net::IpAddr),
    /// The Service with this name.
    Service(String),
    /// The NAT rules: `[masquerade]`, `[[snat]]`, `node.cluster_cidr`.
    NatRules,
    /// `node.node_port_range` (checked by `check`; nothing in the library).
    NodePortRange,
    /// The port of a bridge, as (bridge, port).
    Port(String, String),
    /// The peer of a VXLAN interface, as (interface, node IP).
    Peer(String, std::net::IpAddr),
    /// A bridge's `spoof_guard`.
    SpoofGuard(String),
    /// The host port's kernel routes: its `routes` and `node.service_cidr`.
    HostRoutes,
    /// The `ips` and `mac` of a `[[bridge.port]]`, as (bridge, port).
    PortGuard(String, String),
    /// `node.healthz_port`.
    HealthzPort,
}

impl std::fmt::Display for Item {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Item::Route(to, metric) => write!(f, "route to {to} metric {metric}"),
            Item::Neighbor(dev, ip) => write!(f, "neighbor {ip} dev {dev}"),
            Item::Service(name) => write!(f, "service {name:?}"),
            Item::NatRules => f.write_str(
                "the NAT rules ([masquerade], [[snat]], node.cluster_cidr, node.masquerade_all, node.random_fully, node.node_port_addresses)",
            ),
            Item::NodePortRange => f.write_str("node.node_port_range"),
            Item::HealthzPort => f.write_str("node.healthz_port"),
            Item::Port(bridge, port) => write!(f, "port {port:?} of bridge {bridge:?}"),
            Item::Peer(vxlan, ip) => write!(f, "vxlan {vxlan:?}: peer {ip}"),
            Item::SpoofGuard(bridge) => write!(f, "bridge {bridge:?}: spoof_guard"),
            Item::HostRoutes => {
                f.write_str("the host port's kernel routes (routes, node.service_cidr)")
            }
            Item::PortGuard(bridge, port) => {
                write!(f, "port {port:?} of bridge {bridge:?}: ips and mac")
            }
        }
    }
}

/// A change of a reload the library refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// What was not changed.
    pub item: Item,
    /// Why, as the library (or the TAP, for a port) said.
    pub reason: String,
    /// The running configuration's value of `item` (if it had one) still runs: true when the
    /// refused step was a removal or a replacement that left the old one in place; false when
    /// the old one was removed and the new one refused (nothing of `item` runs).
    pub old_kept: bool,
}

impl Diff {
    /// True when the reload changes nothing.
    pub fn is_empty(&self) -> bool {
        self.summary.is_empty()
    }

    fn push(&mut self, item: Item, line: String) {
        self.summary.push(line);
        self.items.push(item);
    }

    /// True when the reload changes `item`.
    pub fn touches(&self, item: &Item) -> bool {
        self.items.contains(item)
    }
}

/// The configuration that runs after a reload from `old` to `new` in which the library
/// refused `refused`: `new`, with each refused item as it was in `old` when the old one
/// still runs ([`Refusal::old_kept`]) and absent otherwise. A reload records it as the
/// running configuration, so the next reload of the same file finds the refused changes
/// again and retries them.
pub fn running(old: &Config, new: &Config, refused: &[Refusal]) -> Config {
    let mut run = new.clone();
    for (i, r) in refused.iter().enumerate() {
        if refused[..i].iter().any(|x| x.item == r.item) {
            continue;
        }
        // A removal refused beside an addition refused: the old one still runs.
        let keep = refused.iter().any(|x| x.item == r.item && x.old_kept);
        match &r.item {
            Item::Route(to, metric) => {
                let key = (*to, *metric);
                run.routes.retain(|x| route_key(x) != key);
                if keep {
                    run.routes
                        .extend(old.routes.iter().filter(|x| route_key(x) == key).cloned());
                }
            }
            Item::Neighbor(dev, ip) => {
                let is = |n: &Located<NeighborCfg>| &n.dev == dev && n.ip == *ip;
                run.neighbors.retain(|n| !is(n));
                if keep {
                    run.neighbors
                        .extend(old.neighbors.iter().filter(|n| is(n)).cloned());
                }
            }
            Item::Service(name) => {
                let pos = run.services.iter().position(|s| &s.name == name);
                let was = old.services.iter().find(|s| &s.name == name).cloned();
                match (pos, was) {
                    (Some(i), Some(o)) if keep => run.services[i] = o,
                    (Some(i), _) => {
                        run.services.remove(i);
                    }
                    (None, Some(o)) if keep => run.services.push(o),
                    (None, _) => {}
                }
            }
            Item::NatRules => {
                run.masquerade.clone_from(&old.masquerade);
                run.snats.clone_from(&old.snats);
                run.node.cluster_cidr = old.node.cluster_cidr;
                run.node.cluster_cidr6 = old.node.cluster_cidr6;
                node::keep_old(&mut run, old);
            }
            Item::NodePortRange => run.node.node_port_range = old.node.node_port_range,
            Item::HealthzPort => run.node.healthz_port = old.node.healthz_port,
            Item::HostRoutes => {
                for h in &mut run.hosts {
                    if let Some(o) = old.hosts.iter().find(|o| o.name == h.name) {
                        h.value.routes.clone_from(&o.routes);
                    }
                }
                run.node.service_cidr = old.node.service_cidr;
                run.node.service_cidr6 = old.node.service_cidr6;
            }
            Item::Port(bridge, port) => {
                let had = old
                    .bridges
                    .iter()
                    .any(|b| &b.name == bridge && b.ports.contains(port));
                let def = old.port_def(bridge, port).cloned();
                if let Some(b) = run.bridges.iter_mut().find(|b| &b.name == bridge) {
                    b.value.ports.retain(|p| p != port);
                    b.value.port_defs.retain(|p| &p.name != port);
                    if keep && had {
                        b.value.ports.push(port.clone());
                        b.value.port_defs.extend(def);
                    }
                }
            }
            Item::SpoofGuard(bridge) => {
                let was = old.bridges.iter().find(|b| &b.name == bridge);
                if let (Some(b), Some(o), true) = (
                    run.bridges.iter_mut().find(|b| &b.name == bridge),
                    was,
                    keep,
                ) {
                    b.value.spoof_guard = o.spoof_guard;
                }
            }
            Item::PortGuard(bridge, port) => {
                let was = old.port_def(bridge, port).cloned();
                if let Some(b) = run.bridges.iter_mut().find(|b| &b.name == bridge) {
                    b.value.port_defs.retain(|p| &p.name != port);
                    b.value.port_defs.extend(was.filter(|_| keep));
                }
            }
            Item::Peer(vxlan, ip) => {
                let was: Vec<_> = old
                    .vxlans
                    .iter()
                    .filter(|v| &v.name == vxlan)
                    .flat_map(|v| v.peers.iter().filter(|p| p.node_ip == *ip).cloned())
                    .collect();
                if let Some(v) = run.vxlans.iter_mut().find(|v| &v.name == vxlan) {
                    v.value.peers.retain(|p| p.node_ip != *ip);
                    if keep {
                        v.value.peers.extend(was);
                    }
                }
            }
        }
    }
    run
}

fn route_key(r: &RouteCfg) -> (crate::config::IpCidr, u32) {
    (r.to, r.metric)
}

fn changed_fields<T, F>(
    what: &str,
    old: &[Located<T>],
    new: &[Located<T>],
    name: F,
    out: &mut Vec<String>,
) where
    T: PartialEq,
    F: Fn(&T) -> &str,
{
    for o in old {
        match new.iter().find(|n| name(n) == name(o)) {
            None => out.push(format!("{what} {:?} was removed", name(o))),
            Some(n) if n.value != o.value => out.push(format!("{what} {:?} changed", name(o))),
            Some(_) => {}
        }
    }
    for n in new {
        if !old.iter().any(|o| name(o) == name(n)) {
            out.push(format!("{what} {:?} was added", name(n)));
        }
    }
}

/// The bridges with their `ports`, `[[bridge.port]]`s and `spoof_guard` left out: those are compared by
/// [`port_changes`] and applied live.
fn without_ports(bridges: &[Located<BridgeCfg>]) -> Vec<Located<BridgeCfg>> {
    bridges
        .iter()
        .map(|b| {
            let mut b = b.clone();
            b.value.ports.clear();
            b.value.port_defs.clear();
            b.value.spoof_guard = true;
            b
        })
        .collect()
}

/// The ports added to and removed from the bridges both files have.
fn port_changes(old: &[Located<BridgeCfg>], new: &[Located<BridgeCfg>], d: &mut Diff) {
    for o in old {
        let Some(n) = new.iter().find(|n| n.name == o.name) else {
            continue;
        };
        if o.spoof_guard != n.spoof_guard {
            d.push(
                Item::SpoofGuard(n.name.clone()),
                format!(
                    "bridge {:?}: spoof_guard {} -> {}",
                    n.name, o.spoof_guard, n.spoof_guard
                ),
            );
            d.guards.push((n.name.clone(), n.spoof_guard));
        }
        for p in o.ports.iter().filter(|p| !n.ports.contains(p)) {
            d.push(
                Item::Port(o.name.clone(), p.clone()),
                format!("port {p:?} removed from bridge {:?}", o.name),
            );
            d.ports_removed.push((o.name.clone(), p.clone()));
        }
        for p in n.ports.iter().filter(|p| !o.ports.contains(p)) {
            d.push(
                Item::Port(n.name.clone(), p.clone()),
                format!("port {p:?} added to bridge {:?}", n.name),
            );
            d.ports_added.push((n.name.clone(), p.clone()));
        }
        for p in &n.ports {
            let (was, now) = (o.port_def(p), n.port_def(p));
            let added = !o.ports.contains(p);
            if was == now || (added && now.is_none_or(|d| d.ips.is_empty() && d.mac.is_none())) {
                continue;
            }
            let show = |d: Option<&crate::config::PortCfg>| {
                let ips: Vec<String> = d.map_or(Vec::new(), |d| {
                    d.ips.iter().map(ToString::to_string).collect()
                });
                let mac = d
                    .and_then(|d| d.mac)
                    .map_or("none".into(), |m| m.to_string());
                format!("ips [{}] mac {mac}", ips.join(", "))
            };
            d.push(
                Item::PortGuard(n.name.clone(), p.clone()),
                format!(
                    "port {p:?} of bridge {:?}: {} -> {}",
                    n.name,
                    show(was),
                    show(now)
                ),
            );
            d.port_guards.push((n.name.clone(), p.clone()));
        }
    }
}

fn bridge_changes(old: &[Located<BridgeCfg>], new: &[Located<BridgeCfg>], out: &mut Vec<String>) {
    let (old, new) = (&without_ports(old)[..], &without_ports(new)[..]);
    let mut v = Vec::new();
    changed_fields("bridge", old, new, |b| &b.name, &mut v);
    with_details(
        v,
        old,
        new,
        |b| &b.name,
        out,
        |o, n| {
            let mut f = addr_fields((&o.address, &n.address), (&o.address6, &n.address6));
            if o.ra != n.ra {
                f.push(format!("ra {} -> {}", o.ra, n.ra));
            }
            if o.mac != n.mac {
                f.push("mac".into());
            }
            f.extend(mtu_field(o.mtu, n.mtu));
            if o.fdb_max_entries != n.fdb_max_entries || o.fdb_aging != n.fdb_aging {
                f.push("fdb settings".into());
            }
            f
        },
    );
}

fn uplink_changes(old: &[Located<UplinkCfg>], new: &[Located<UplinkCfg>], out: &mut Vec<String>) {
    let mut v = Vec::new();
    changed_fields("uplink", old, new, |u| &u.name, &mut v);
    with_details(
        v,
        old,
        new,
        |u| &u.name,
        out,
        |o, n| {
            let mut f = addr_fields((&o.address, &n.address), (&o.address6, &n.address6));
            f.extend(mtu_field(o.mtu, n.mtu));
            f
        },
    );
}

/// Each of `lines` (from [`changed_fields`]) into `out`, followed, for an item that changed,
/// by what `fields` says changed in it: `line (address a -> b, mtu 1500 -> 9000)`.
fn with_details<T: PartialEq>(
    lines: Vec<String>,
    old: &[Located<T>],
    new: &[Located<T>],
    name: impl Fn(&T) -> &str,
    out: &mut Vec<String>,
    fields: impl Fn(&T, &T) -> Vec<String>,
) {
    for line in lines {
        let detail = old.iter().find_map(|o| {
            let n = new.iter().find(|n| name(n) == name(o))?;
            if o.value == n.value || !line.contains(&format!("{:?} changed", name(o))) {
                return None;
            }
            Some(fields(o, n).join(", "))
        });
        match detail {
            Some(d) if !d.is_empty() => out.push(format!("{line} ({d})")),
            _ => out.push(line),
        }
    }
}

/// What changed of an interface's IPv4 and IPv6 addresses, in that order.
fn addr_fields<A, B>(
    (o4, n4): (&Option<A>, &Option<A>),
    (o6, n6): (&Option<B>, &Option<B>),
) -> Vec<String>
where
    A: PartialEq + std::fmt::Display,
    B: PartialEq + std::fmt::Display,
{
    let mut f = Vec::new();
    if o4 != n4 {
        f.push(format!("address {} -> {}", opt(o4), opt(n4)));
    }
    if o6 != n6 {
        f.push(format!("IPv6 address {} -> {}", opt(o6), opt(n6)));
    }
    f
}

/// An interface's MTU change, if any.
fn mtu_field(old: u16, new: u16) -> Option<String> {
    (old != new).then(|| format!("mtu {old} -> {new}"))
}

/// The VXLAN interfaces' settings without their peers (a change needs a restart).
fn vxlan_changes(old: &[Located<VxlanCfg>], new: &[Located<VxlanCfg>], out: &mut Vec<String>) {
    for o in old {
        match new.iter().find(|n| n.name == o.name) {
            None => out.push(format!("vxlan {:?} was removed", o.name)),
            Some(n) => {
                let (a, b) = (&o.value, &n.value);
                let mut f = Vec::new();
                if a.vni != b.vni {
                    f.push(format!("vni {} -> {}", a.vni, b.vni));
                }
                if a.port != b.port {
                    f.push(format!("port {} -> {}", a.port, b.port));
                }
                if a.uplink != b.uplink {
                    f.push(format!("uplink {:?} -> {:?}", a.uplink, b.uplink));
                }
                if a.address != b.address {
                    f.push(format!("address {} -> {}", a.address, b.address));
                }
                if a.mac != b.mac {
                    f.push("mac".into());
                }
                if a.mtu != b.mtu {
                    f.push(format!("mtu {} -> {}", opt(&a.mtu), opt(&b.mtu)));
                }
                if a.src_ports != b.src_ports {
                    f.push("src_port_range".into());
                }
                if !f.is_empty() {
                    out.push(format!("vxlan {:?} changed ({})", o.name, f.join(", ")));
                }
            }
        }
    }
    for n in new {
        if !old.iter().any(|o| o.name == n.name) {
            out.push(format!("vxlan {:?} was added", n.name));
        }
    }
}

/// The peers removed from and added to the VXLAN interfaces both files have (a peer whose
/// MAC or pod CIDR changed is removed, then added).
fn peer_changes(old: &[Located<VxlanCfg>], new: &[Located<VxlanCfg>], d: &mut Diff) {
    for o in old {
        let Some(n) = new.iter().find(|n| n.name == o.name) else {
            continue;
        };
        for p in o
            .peers
            .iter()
            .filter(|p| !n.peers.iter().any(|q| q.value == p.value))
        {
            d.push(
                Item::Peer(o.name.clone(), p.node_ip),
                format!(
                    "vxlan {:?}: peer {} ({}, {}) removed",
                    o.name, p.node_ip, p.vtep_mac, p.pod_cidr
                ),
            );
            d.peers_removed.push((o.name.clone(), p.value));
        }
        for p in n
            .peers
            .iter()
            .filter(|p| !o.peers.iter().any(|q| q.value == p.value))
        {
            d.push(
                Item::Peer(n.name.clone(), p.node_ip),
                format!(
                    "vxlan {:?}: peer {} ({}, {}) added",
                    n.name, p.node_ip, p.vtep_mac, p.pod_cidr
                ),
            );
            d.peers_added.push((n.name.clone(), p.value));
        }
    }
}

/// A changed Service's line with its endpoint changes: `(endpoints +A -B)`.
fn service_detail(old: &[ServiceCfg], new: &[ServiceCfg], line: String) -> String {
    let Some((o, n)) = old.iter().find_map(|o| {
        let n = new.iter().find(|n| n.name == o.name)?;
        (o.value != n.value && line == format!("service {:?} changed", o.name)).then_some((o, n))
    }) else {
        return line;
    };
    let was = |e: &EndpointCfg| o.endpoints.iter().find(|x| x.addr == e.addr).copied();
    let mut f: Vec<String> = n
        .endpoints
        .iter()
        .filter_map(|e| match was(e) {
            None => Some(format!("+{}", e.addr)),
            // Conditions (or the local flag) changed: applied live, as kube-proxy's next sync.
            Some(x) if x != *e => Some(format!("~{} {}", e.addr, describe(e))),
            Some(_) => None,
        })
        .chain(
            o.endpoints
                .iter()
                .filter(|e| !n.endpoints.iter().any(|x| x.addr == e.addr))
                .map(|e| format!("-{}", e.addr)),
        )
        .collect();
    if !f.is_empty() {
        f.insert(0, "endpoints".into());
    }
    let mut other = n.value.clone();
    other.endpoints.clone_from(&o.endpoints);
    if other != o.value {
        f.push(
            if f.is_empty() {
                "settings"
            } else {
                "and settings"
            }
            .into(),
        );
    }
    format!("{line} ({})", f.join(" "))
}

/// An endpoint's conditions and local flag, as a reload's summary shows a change of them.
fn describe(e: &EndpointCfg) -> String {
    let local = if e.local { "local" } else { "remote" };
    format!("{},{local}", e.conditions)
}

fn opt<T: std::fmt::Display>(v: &Option<T>) -> String {
    v.as_ref().map_or("none".into(), |x| x.to_string())
}

/// Compares the running configuration with a new, valid one: the live changes, or every
/// change that needs a restart.
pub fn diff(old: &Config, new: &Config) -> Result<Diff, Vec<String>> {
    let mut restart = Vec::new();
    let (on, nn) = (&old.node, &new.node);
    if on.name != nn.name {
        restart.push(format!(
            "node.name changed ({:?} -> {:?})",
            on.name, nn.name
        ));
    }
    if on.workers != nn.workers {
        restart.push("node.workers changed".into());
    }
    if on.busy_poll_us != nn.busy_poll_us {
        restart.push("node.busy_poll_us changed".into());
    }
    if on.socket != nn.socket {
        restart.push("node.socket changed".into());
    }
    if on.offload != nn.offload {
        restart.push("node.offload changed".into());
    }
    bridge_changes(&old.bridges, &new.bridges, &mut restart);
    uplink_changes(&old.uplinks, &new.uplinks, &mut restart);
    vxlan_changes(&old.vxlans, &new.vxlans, &mut restart);
    if old.conntrack != new.conntrack || old.max_entries6 != new.max_entries6 {
        restart.push("[conntrack] changed".into());
    }
    if old.neigh != new.neigh {
        restart.push("[neigh] changed".into());
    }
    host_changes(old, new, &mut restart);
    if !restart.is_empty() {
        return Err(restart
            .into_iter()
            .map(|c| format!("{c}: this needs a restart of tapyard"))
            .collect());
    }
    let mut d = Diff::default();
    host_route_changes(old, new, &mut d);
    port_changes(&old.bridges, &new.bridges, &mut d);
    peer_changes(&old.vxlans, &new.vxlans, &mut d);
    for o in &old.routes {
        match new.routes.iter().find(|n| route_key(n) == route_key(o)) {
            Some(n) if n.value == o.value => {}
            Some(n) => {
                d.push(
                    Item::Route(o.to, o.metric),
                    format!("route {} -> {}", o.describe(), n.describe()),
                );
                d.routes_removed.push(o.value.clone());
                d.routes_added.push(n.value.clone());
            }
            None => {
                d.push(
                    Item::Route(o.to, o.metric),
                    format!("route removed: {}", o.describe()),
                );
                d.routes_removed.push(o.value.clone());
            }
        }
    }
    for n in &new.routes {
        if !old.routes.iter().any(|o| route_key(o) == route_key(n)) {
            d.push(
                Item::Route(n.to, n.metric),
                format!("route added: {}", n.describe()),
            );
            d.routes_added.push(n.value.clone());
        }
    }
    let nkey = |n: &NeighborCfg| (n.dev.clone(), n.ip);
    for o in &old.neighbors {
        match new.neighbors.iter().find(|n| nkey(n) == nkey(o)) {
            Some(n) if n.value == o.value => {}
            found => {
                d.push(
                    Item::Neighbor(o.dev.clone(), o.ip),
                    format!(
                        "neighbor {} dev {} removed{}",
                        o.ip,
                        o.dev,
                        if found.is_some() {
                            " (MAC changed)"
                        } else {
                            ""
                        }
                    ),
                );
                d.neighbors_removed.push(o.value.clone());
                if let Some(n) = found {
                    d.neighbors_added.push(n.value.clone());
                }
            }
        }
    }
    for n in &new.neighbors {
        if !old.neighbors.iter().any(|o| nkey(o) == nkey(n)) {
            d.push(
                Item::Neighbor(n.dev.clone(), n.ip),
                format!("neighbor {} lladdr {} dev {} added", n.ip, n.mac, n.dev),
            );
            d.neighbors_added.push(n.value.clone());
        }
    }
    let values = |s: &[ServiceCfg]| s.iter().map(|s| s.value.clone()).collect::<Vec<_>>();
    if values(&old.services) != values(&new.services) {
        let mut v = Vec::new();
        changed_fields("service", &old.services, &new.services, |s| &s.name, &mut v);
        for line in v {
            // Each line names its Service: `service "NAME" ...`.
            let name = old
                .services
                .iter()
                .chain(&new.services)
                .map(|s| &s.name)
                .find(|n| line.starts_with(&format!("service {n:?} ")))
                .cloned()
                .unwrap_or_default();
            d.push(
                Item::Service(name),
                service_detail(&old.services, &new.services, line),
            );
        }
        d.services = Some(new.services.clone());
    }
    if old.node.cluster_cidr != new.node.cluster_cidr {
        d.push(
            Item::NatRules,
            format!(
                "node.cluster_cidr {} -> {}",
                opt(&old.node.cluster_cidr),
                opt(&new.node.cluster_cidr)
            ),
        );
        d.nat_rules = true;
    }
    if old.node.cluster_cidr6 != new.node.cluster_cidr6 {
        d.push(
            Item::NatRules,
            format!(
                "node.cluster_cidr (IPv6) {} -> {}",
                opt(&old.node.cluster_cidr6),
                opt(&new.node.cluster_cidr6)
            ),
        );
        d.nat_rules = true;
    }
    let masq = |c: &Config| c.masquerade.as_ref().map(|m| m.value.clone());
    if masq(old) != masq(new) {
        let out = |m: &Option<Located<crate::config::MasqueradeCfg>>| {
            m.as_ref()
                .map_or("none".to_string(), |m| format!("out {}", m.out))
        };
        d.push(
            Item::NatRules,
            format!(
                "masquerade {} -> {}",
                out(&old.masquerade),
                out(&new.masquerade)
            ),
        );
        d.nat_rules = true;
    }
    let snats = |c: &Config| c.snats.iter().map(|s| s.value.clone()).collect::<Vec<_>>();
    if snats(old) != snats(new) {
        let list = |c: &Config| {
            let v: Vec<String> = c
                .snats
                .iter()
                .map(|s| {
                    let out = s
                        .out
                        .as_ref()
                        .map_or(String::new(), |o| format!(" out {o}"));
                    let ports = s
                        .ports
                        .map_or(String::new(), |(lo, hi)| format!(":{lo}-{hi}"));
                    format!("{} to {}{ports}{out}", s.src, s.to)
                })
                .collect();
            if v.is_empty() {
                "none".to_string()
            } else {
                v.join(", ")
            }
        };
        d.push(
            Item::NatRules,
            format!("snat {} -> {}", list(old), list(new)),
        );
        d.nat_rules = true;
    }
    node::nat_changes(old, new, &mut d);
    if old.node.node_port_range != new.node.node_port_range {
        d.push(
            Item::NodePortRange,
            format!(
                "node.node_port_range {}-{} -> {}-{}",
                old.node.node_port_range.0,
                old.node.node_port_range.1,
                new.node.node_port_range.0,
                new.node.node_port_range.1
            ),
        );
    }
    if old.node.healthz_port != new.node.healthz_port {
        d.push(
            Item::HealthzPort,
            format!(
                "node.healthz_port {} -> {}",
                old.node.healthz_port, new.node.healthz_port
            ),
        );
    }
    Ok(d)
}

mod node;
pub use node::list as node_port_list;
#[cfg(test)]
mod tests;

/// The host port's changes that need a restart: added, removed, or changed other than in
/// its `routes` (its router interface is part of the datapath's topology, and the router
/// knows its addresses; `tapyard run --takeover` restarts without losing a connection or a
/// port).
fn host_changes(old: &Config, new: &Config, restart: &mut Vec<String>) {
    let names = |c: &Config| c.hosts.iter().map(|h| h.name.clone()).collect::<Vec<_>>();
    for h in &new.hosts {
        match old.hosts.iter().find(|o| o.name == h.name) {
            None => restart.push(format!("host {:?} added", h.name)),
            Some(o) if o.routes != h.routes => {
                let same = crate::config::HostCfg {
                    routes: h.routes.clone(),
                    ..o.value.clone()
                };
                if same != h.value {
                    restart.push(format!("host {:?} changed", h.name));
                }
            }
            Some(o) if o.value != h.value => restart.push(format!("host {:?} changed", h.name)),
            Some(_) => {}
        }
    }
    for o in old.hosts.iter().filter(|o| !names(new).contains(&o.name)) {
        restart.push(format!("host {:?} removed", o.name));
    }
}

/// The host port's kernel routes a reload changes live: its `routes`, `node.service_cidr`,
/// and (beside the NAT rules) `node.cluster_cidr`.
fn host_route_changes(old: &Config, new: &Config, d: &mut Diff) {
    let list = |r: &[crate::config::IpCidr]| {
        let v: Vec<String> = r.iter().map(ToString::to_string).collect();
        format!("[{}]", v.join(", "))
    };
    for h in &new.hosts {
        let Some(o) = old.hosts.iter().find(|o| o.name == h.name) else {
            continue;
        };
        if o.routes != h.routes {
            let line = format!(
                "host {:?}: routes {} -> {}",
                h.name,
                list(&o.routes),
                list(&h.routes)
            );
            d.push(Item::HostRoutes, line);
        }
        let (before, after) = (o.kernel_routes(&old.node), h.kernel_routes(&new.node));
        d.host_routes_removed
            .extend(before.iter().filter(|r| !after.contains(r)));
        d.host_routes_added
            .extend(after.iter().filter(|r| !before.contains(r)));
    }
    let (on, nn) = (&old.node, &new.node);
    if (on.service_cidr, on.service_cidr6) != (nn.service_cidr, nn.service_cidr6)
        && !new.hosts.is_empty()
    {
        let line = format!(
            "node.service_cidr {} {} -> {} {} (routed through the host port)",
            opt(&on.service_cidr),
            opt(&on.service_cidr6),
            opt(&nn.service_cidr),
            opt(&nn.service_cidr6)
        );
        d.push(Item::HostRoutes, line);
    }
}
