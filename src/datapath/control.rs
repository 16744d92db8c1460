//! The control plane's view of a datapath, [`Control`]: lookups by name, ports added and
//! removed, routes and neighbours changed while traffic flows, table dumps and counters.
//! Nothing here is on the per-packet path.

use std::fmt;
use std::sync::atomic::Ordering;

use super::{word, Bridge, Datapath};
use crate::base::{BridgeId, IfaceId, PortId};
use crate::l2::fdb::FdbEntry;

use std::net::IpAddr;

use crate::l3::route::{NextHop, Route, RouteAddr, RouteError, RouteTable};
use crate::l3::router::Router;
use crate::nat::netfilter::Netfilter;
use crate::stats::StatsSnapshot;
use crate::time::Instant;

/// The control plane's view of a [`Datapath`], from [`Datapath::control`]: the topology
/// (ports added and removed live, bridges, router interfaces and VXLAN interfaces by id or
/// name), the routing and neighbour tables of both families, table dumps and counters.
///
/// The per-packet API ([`Datapath::process`], [`Datapath::dispatch`], [`Datapath::poll`])
/// stays on [`Datapath`]; everything here may be called from any thread while workers
/// forward traffic. It takes the control plane's locks (the topology mutex, a table's
/// writer lock), never one a worker waits for on a lookup. A `Control` is a shared
/// reference, `Copy`: make one per call (`dp.control().add_route(r)`) or keep one for a
/// sequence of calls.
///
/// # Example
/// ```
/// use std::net::Ipv4Addr;
/// use tapyard::{BridgeConfig, Datapath, Instant};
/// let mut b = Datapath::builder();
/// let br = b.add_bridge(BridgeConfig::new("cni0")).unwrap();
/// b.add_port("veth0", Some(br)).unwrap();
/// let dp = b.build();
/// let ctl = dp.control();
/// // A pod comes: its port joins the bridge while workers forward traffic.
/// let p1 = ctl.add_port("veth1", br).unwrap();
/// assert_eq!(ctl.port_by_name("veth1"), Some(p1));
/// assert_eq!(ctl.bridge_by_name("cni0"), Some(br));
/// assert_eq!(ctl.port_count(), 2);
/// // Dumps and counters.
/// assert!(ctl.fdb_dump(br, Instant::ZERO).is_empty());
/// assert_eq!(ctl.stats().forwarded, 0);
/// // No router interface here, so no routing table.
/// assert!(ctl.routes::<Ipv4Addr>().is_none());
/// ctl.remove_port(p1).unwrap();
/// assert_eq!(ctl.port_name(p1), None);
/// ```
#[derive(Clone, Copy)]
pub struct Control<'a> {
    pub(super) dp: &'a Datapath,
}

impl fmt::Debug for Control<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Control").field(self.dp).finish()
    }
}

impl Datapath {
    /// The control plane's view: ports, bridges, routes, neighbours, VXLAN peers, table
    /// dumps and counters (see [`Control`]).
    pub fn control(&self) -> Control<'_> {
        Control { dp: self }
    }
}

impl<'a> Control<'a> {
    /// Number of live ports (router interfaces' ports included).
    pub fn port_count(&self) -> usize {
        self.dp.topo.lock().names.iter().flatten().count()
    }

    /// The most ports the datapath can hold at once ([`DatapathBuilder::max_ports`](super::DatapathBuilder::max_ports)); every
    /// port id is below it.
    pub fn max_ports(&self) -> usize {
        self.dp.ports.len()
    }

    /// The live ports' ids, in id order.
    pub fn port_ids(&self) -> Vec<PortId> {
        let t = self.dp.topo.lock();
        (0..t.names.len())
            .filter(|&i| t.names[i].is_some())
            .filter_map(|i| u16::try_from(i).ok().map(PortId))
            .collect()
    }

    /// The name of a live port.
    pub fn port_name(&self, p: PortId) -> Option<String> {
        self.dp.topo.lock().names.get(usize::from(p.0))?.clone()
    }

    /// The live port called `name`.
    pub fn port_by_name(&self, name: &str) -> Option<PortId> {
        self.dp
            .topo
            .lock()
            .names
            .iter()
            .position(|n| n.as_deref() == Some(name))
            .and_then(|i| u16::try_from(i).ok())
            .map(PortId)
    }

    /// The bridge a live port belongs to.
    pub fn port_bridge(&self, p: PortId) -> Option<BridgeId> {
        let w = self.dp.ports.get(usize::from(p.0))?.load(Ordering::Acquire);
        if word::is_gone(w) {
            return None;
        }
        word::bridge(w)
    }

    /// A bridge by id.
    pub fn bridge(&self, b: BridgeId) -> Option<&'a Bridge> {
        self.dp.bridges.get(usize::from(b.0))
    }

    /// The bridge called `name`.
    pub fn bridge_by_name(&self, name: &str) -> Option<BridgeId> {
        self.dp
            .bridges
            .iter()
            .position(|b| b.name == name)
            .and_then(|i| u16::try_from(i).ok())
            .map(BridgeId)
    }

    /// All bridges, in id order.
    pub fn bridges(&self) -> &'a [Bridge] {
        &self.dp.bridges
    }

    /// The router, if the datapath has router interfaces.
    pub fn router(&self) -> Option<&'a Router> {
        self.dp.router.as_ref()
    }

    /// Conntrack and NAT, if the datapath was built with [`DatapathBuilder::netfilter`](super::DatapathBuilder::netfilter).
    pub fn netfilter(&self) -> Option<&'a Netfilter> {
        self.dp.nf.as_ref()
    }

    /// The routing table of family `A` ([`Ipv4Addr`](std::net::Ipv4Addr), [`Ipv6Addr`](std::net::Ipv6Addr)), if
    /// the datapath has a router.
    pub fn routes<A: RouteAddr>(&self) -> Option<&'a RouteTable<A>> {
        self.dp.router.as_ref().map(|r| r.routes::<A>())
    }

    /// The router interface called `name`.
    pub fn iface_by_name(&self, name: &str) -> Option<IfaceId> {
        let r = self.dp.router.as_ref()?;
        r.ifaces
            .iter()
            .position(|i| i.cfg.name == name)
            .and_then(|i| u16::try_from(i).ok())
            .map(IfaceId)
    }

    /// The name of a router interface.
    pub fn iface_name(&self, i: IfaceId) -> Option<&'a str> {
        self.dp
            .router
            .as_ref()?
            .iface(i)
            .map(|i| i.cfg.name.as_str())
    }

    /// Adds a route of either family (`ip route add`, `ip -6 route add`), checking it
    /// against the interfaces: the interface must exist, and a gateway must be on a
    /// connected subnet of it (as Linux's "Nexthop has invalid gateway") or, for IPv6,
    /// link-local; never multicast.
    pub fn add_route<A: RouteAddr>(&self, r: Route<A>) -> Result<(), RouteError<A>> {
        let Some(router) = &self.dp.router else {
            return Err(RouteError::NoInterface(0));
        };
        check_route(router, &r)?;
        router.routes::<A>().add(r)
    }

    /// Removes the route to `prefix/len` with `metric` (the best one if `None`), as `ip route
    /// del`.
    pub fn remove_route<A: RouteAddr>(
        &self,
        prefix: A,
        len: u8,
        metric: Option<u32>,
    ) -> Result<Route<A>, RouteError<A>> {
        let Some(router) = &self.dp.router else {
            return Err(RouteError::NotFound(prefix, len));
        };
        router.routes::<A>().remove(prefix, len, metric)
    }

    /// Adds a route or replaces the one with the same prefix, length and metric in one
    /// update (`ip route replace`), checked as [`Control::add_route`]. Returns the route
    /// replaced.
    pub fn replace_route<A: RouteAddr>(
        &self,
        r: Route<A>,
    ) -> Result<Option<Route<A>>, RouteError<A>> {
        let Some(router) = &self.dp.router else {
            return Err(RouteError::NoInterface(0));
        };
        check_route(router, &r)?;
        router.routes::<A>().replace(r)
    }

    /// Removes a permanent neighbour entry of either family (`ip neigh del IP dev IFACE`, `ip
    /// -6 neigh del ...`); `false` when there was no permanent entry for `ip` on `iface`
    /// (dynamic entries are left alone).
    pub fn remove_static_neigh(&self, iface: IfaceId, ip: impl Into<IpAddr>) -> bool {
        fn remove<A: RouteAddr>(r: &Router, iface: IfaceId, ip: A) -> bool {
            let t = r.neigh::<A>();
            let permanent = t
                .peek(iface, ip)
                .is_some_and(|(st, _)| st == crate::l3::neigh::NeighState::Permanent);
            permanent && t.remove(iface, ip)
        }
        let Some(r) = &self.dp.router else {
            return false;
        };
        match ip.into() {
            IpAddr::V4(ip) => remove(r, iface, ip),
            IpAddr::V6(ip) => remove(r, iface, ip),
        }
    }

    /// Adds a permanent neighbour entry of either family (`ip neigh add IP lladdr MAC dev
    /// IFACE nud permanent`, and `ip -6 neigh ...` for an IPv6 address). Packets that were
    /// waiting for `ip` stay queued until the next batch; they are released the next time the
    /// neighbour is used. Errors name the bad value.
    pub fn add_static_neigh(
        &self,
        iface: IfaceId,
        ip: impl Into<IpAddr>,
        mac: crate::wire::mac::MacAddr,
        now: Instant,
    ) -> Result<(), crate::l3::neigh::NeighError> {
        fn add<A: RouteAddr>(
            r: &Router,
            iface: IfaceId,
            ip: A,
            mac: crate::wire::mac::MacAddr,
            now: Instant,
        ) -> Result<(), crate::l3::neigh::NeighError> {
            r.neigh::<A>().add_static(iface, ip, mac, now).map(|_| ())
        }
        let ip = ip.into();
        let Some(r) = &self.dp.router else {
            return Err(crate::l3::neigh::NeighError::BadAddress(ip));
        };
        match ip {
            IpAddr::V4(ip) => add(r, iface, ip, mac, now),
            IpAddr::V6(ip) => add(r, iface, ip, mac, now),
        }
    }

    /// Writes the routing table like `ip route show`.
    pub fn fmt_routes(&self, out: &mut impl fmt::Write) -> fmt::Result {
        let Some(r) = &self.dp.router else {
            return Ok(());
        };
        let name = |i| self.iface_name(i).unwrap_or("?").to_string();
        r.routes.fmt_routes(out, &name)?;
        r.routes6.fmt_routes(out, &name)
    }

    /// Writes the neighbour table like `ip neigh show`.
    pub fn fmt_neigh(&self, now: Instant, out: &mut impl fmt::Write) -> fmt::Result {
        let Some(r) = &self.dp.router else {
            return Ok(());
        };
        let name = |i| self.iface_name(i).unwrap_or("?").to_string();
        r.neigh.fmt_dump(now, out, &name)?;
        r.neigh6.fmt_dump(now, out, &name)
    }

    /// The FDB of `bridge` at `now`, like `bridge fdb show br <bridge>`.
    pub fn fdb_dump(&self, bridge: BridgeId, now: Instant) -> Vec<FdbEntry> {
        self.bridge(bridge)
            .map_or_else(Vec::new, |b| b.fdb.dump(now))
    }

    /// Writes every bridge's FDB in the style of `bridge fdb show`.
    pub fn fmt_fdb(&self, now: Instant, out: &mut impl fmt::Write) -> fmt::Result {
        for b in &self.dp.bridges {
            for e in b.fdb.dump(now) {
                let port = self.port_name(e.port);
                let port = port.as_deref().unwrap_or("?");
                match e.age {
                    None => writeln!(out, "{} dev {} master {} static", e.mac, port, b.name)?,
                    Some(a) => writeln!(
                        out,
                        "{} dev {} master {} age {:.1}s",
                        e.mac,
                        port,
                        b.name,
                        a.as_secs_f64()
                    )?,
                }
            }
        }
        Ok(())
    }

    /// A snapshot of every counter, summed over workers.
    pub fn stats(&self) -> StatsSnapshot {
        let ports: Vec<(usize, String)> = {
            let t = self.dp.topo.lock();
            t.names
                .iter()
                .enumerate()
                .filter_map(|(i, n)| Some((i, n.clone()?)))
                .collect()
        };
        let shards = self.dp.shards.lock().clone();
        StatsSnapshot::sum(&ports, &shards)
    }
}

/// [`Control::add_route`]'s checks: the interface exists; a gateway is on-link (inside a
/// connected route of its interface, or IPv6 link-local) and not multicast.
fn check_route<A: RouteAddr>(router: &Router, r: &Route<A>) -> Result<(), RouteError<A>> {
    if let Some(i) = r.next_hop.iface() {
        if router.iface(i).is_none() {
            return Err(RouteError::NoInterface(i.0));
        }
    }
    if let NextHop::Via(i, gw) = r.next_hop {
        let on_link = gw.always_on_link()
            || matches!(router.routes::<A>().lookup(gw), Some(NextHop::Link(j)) if j == i);
        if !on_link || gw.is_multicast() {
            return Err(RouteError::GatewayNotOnLink(gw));
        }
    }
    Ok(())
}
