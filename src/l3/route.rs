//! The IPv4 routing table: routes like `ip route` holds them (connected, via a gateway, via an
//! interface, blackhole, unreachable; a metric so several routes to one prefix coexist), compiled
//! into a lock-free longest-prefix-match [`Fib4`].
//!
//! # Thread-safety contract
//!
//! * [`RouteTable::lookup`] is lock-free: one [`Fib4`] look-up (an atomic
//!   pointer load and a trie walk) and one atomic load from the next-hop array.
//! * Changes ([`RouteTable::add`], [`RouteTable::remove`], [`RouteTable::remove_iface`]) take the
//!   table's writer mutex, update the RIB (every route, best or not), and publish the best route
//!   per prefix into the FIB; readers see each change entirely or not at all.
//! * Next hops are interned: each distinct next hop gets an id whose contents never change, and
//!   ids are never reused, so a reader holding an id from an older FIB version still reads the
//!   next hop that route had. The array is bounded ([`MAX_NEXT_HOPS`]); distinct next hops are
//!   few (interfaces × gateways) in practice.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::l3::lpm::Fib4;
use crate::narrow::{low16, low32};

pub use crate::base::IfaceId;

/// Distinct next hops a table can hold.
pub const MAX_NEXT_HOPS: usize = 1 << 16;

/// Where a route sends matching packets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NextHop {
    /// On-link through an interface: the destination itself is the next hop (connected routes
    /// and `ip route add PREFIX dev IFACE`).
    Link(IfaceId),
    /// Through a gateway reached on an interface.
    Via(IfaceId, Ipv4Addr),
    /// Dropped silently (counted).
    Blackhole,
    /// Dropped with an ICMP host unreachable (as Linux's `unreachable` route type).
    Unreachable,
}

impl NextHop {
    fn pack(self) -> u64 {
        match self {
            NextHop::Link(i) => (1 << 56) | (u64::from(i.0) << 32),
            NextHop::Via(i, gw) => (2 << 56) | (u64::from(i.0) << 32) | u64::from(u32::from(gw)),
            NextHop::Blackhole => 3 << 56,
            NextHop::Unreachable => 4 << 56,
        }
    }
    fn unpack(v: u64) -> Option<NextHop> {
        let iface = IfaceId(low16(v >> 32));
        Some(match v >> 56 {
            1 => NextHop::Link(iface),
            2 => NextHop::Via(iface, Ipv4Addr::from(low32(v))),
            3 => NextHop::Blackhole,
            4 => NextHop::Unreachable,
            _ => return None,
        })
    }
    /// The interface, for routes that send packets out of one.
    pub fn iface(self) -> Option<IfaceId> {
        match self {
            NextHop::Link(i) | NextHop::Via(i, _) => Some(i),
            _ => None,
        }
    }
}

/// How a route came to be, as `ip route`'s `proto`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RouteProto {
    /// Made from an interface address (`proto kernel scope link`).
    Kernel,
    /// Added by configuration or the API (`proto static`).
    Static,
}

/// One route.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Route {
    /// The destination prefix (host bits zero).
    pub prefix: Ipv4Addr,
    /// Prefix length, 0..=32.
    pub len: u8,
    /// Where it sends packets.
    pub next_hop: NextHop,
    /// Lower wins among routes to the same prefix.
    pub metric: u32,
    /// Its origin.
    pub proto: RouteProto,
    /// For connected routes: the interface's own address (`src`).
    pub src: Option<Ipv4Addr>,
}

/// An invalid route given to [`RouteTable::add`]: the message names the field and value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RouteError {
    /// Prefix length over 32.
    BadLength(u8),
    /// The prefix has bits set past its length.
    HostBitsSet(Ipv4Addr, u8),
    /// An identical route (prefix, length, metric) exists.
    Exists(Ipv4Addr, u8, u32),
    /// No route with that prefix, length and metric.
    NotFound(Ipv4Addr, u8),
    /// The next-hop array is full.
    TooManyNextHops,
    /// The route names an interface that does not exist (or the datapath has no router).
    NoInterface(u16),
    /// A gateway that is not on a connected subnet of the route's interface.
    GatewayNotOnLink(Ipv4Addr),
}

impl fmt::Display for RouteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RouteError::BadLength(l) => write!(f, "prefix length {l} is invalid: expected 0 to 32"),
            RouteError::HostBitsSet(p, l) => {
                write!(
                    f,
                    "route {p}/{l} has host bits set: expected {}/{l}",
                    mask(*p, *l)
                )
            }
            RouteError::Exists(p, l, m) => write!(f, "route {p}/{l} metric {m} already exists"),
            RouteError::NotFound(p, l) => write!(f, "no route {p}/{l}"),
            RouteError::TooManyNextHops => {
                write!(f, "too many distinct next hops (at most {MAX_NEXT_HOPS})")
            }
            RouteError::NoInterface(i) => write!(f, "interface id {i} does not exist"),
            RouteError::GatewayNotOnLink(gw) => write!(
                f,
                "gateway {gw} is not on a connected subnet of the route's interface"
            ),
        }
    }
}

impl std::error::Error for RouteError {}

/// `addr` with the bits past `len` cleared.
pub fn mask(addr: Ipv4Addr, len: u8) -> Ipv4Addr {
    let a = u32::from(addr);
    Ipv4Addr::from(if len == 0 {
        0
    } else {
        a & (u32::MAX << (32 - u32::from(len.min(32))))
    })
}

struct Writer {
    rib: BTreeMap<(u32, u8), Vec<Route>>,
    interned: HashMap<NextHop, u32>,
}

/// One FIB version and the next-hop array, for a batch of look-ups ([`RouteTable::reader`]).
pub struct RouteReader<'a> {
    lpm: arc_swap::Guard<std::sync::Arc<crate::l3::lpm::Lpm4>>,
    next_hops: &'a [AtomicU64],
}

impl fmt::Debug for RouteReader<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RouteReader")
            .field("prefixes", &self.lpm.len())
            .finish()
    }
}

impl RouteReader<'_> {
    /// The next hop for `dst` in this version.
    #[inline]
    pub fn lookup(&self, dst: Ipv4Addr) -> Option<NextHop> {
        let id = self.lpm.lookup(u32::from(dst))?;
        let v = self.next_hops.get(id as usize)?.load(Ordering::Acquire);
        NextHop::unpack(v)
    }
}

/// The routing table (see the module docs).
pub struct RouteTable {
    fib: Fib4,
    next_hops: Box<[AtomicU64]>,
    writer: Mutex<Writer>,
}

impl fmt::Debug for RouteTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RouteTable")
            .field("prefixes", &self.fib.len())
            .finish()
    }
}

impl Default for RouteTable {
    fn default() -> Self {
        RouteTable::new()
    }
}

impl RouteTable {
    /// An empty table.
    pub fn new() -> RouteTable {
        RouteTable {
            fib: Fib4::new(),
            next_hops: (0..MAX_NEXT_HOPS).map(|_| AtomicU64::new(0)).collect(),
            writer: Mutex::new(Writer {
                rib: BTreeMap::new(),
                interned: HashMap::new(),
            }),
        }
    }

    /// The next hop for `dst`, by longest prefix match. Lock-free.
    #[inline]
    pub fn lookup(&self, dst: Ipv4Addr) -> Option<NextHop> {
        let id = self.fib.lookup(u32::from(dst))?;
        let v = self.next_hops.get(id as usize)?.load(Ordering::Acquire);
        NextHop::unpack(v)
    }

    /// A consistent view for a batch of look-ups: the FIB version is loaded once.
    #[inline]
    pub fn reader(&self) -> RouteReader<'_> {
        RouteReader {
            lpm: self.fib.load(),
            next_hops: &self.next_hops,
        }
    }

    fn intern(&self, w: &mut Writer, nh: NextHop) -> Result<u32, RouteError> {
        if let Some(&id) = w.interned.get(&nh) {
            return Ok(id);
        }
        let n = w.interned.len();
        let id = match u32::try_from(n) {
            Ok(id) if n < MAX_NEXT_HOPS => id,
            _ => return Err(RouteError::TooManyNextHops),
        };
        self.next_hops[n].store(nh.pack(), Ordering::Release);
        w.interned.insert(nh, id);
        Ok(id)
    }

    fn publish(&self, w: &mut Writer, key: (u32, u8)) -> Result<(), RouteError> {
        let best = w.rib.get(&key).and_then(|v| v.first().copied());
        match best {
            Some(r) => {
                let id = self.intern(w, r.next_hop)?;
                self.fib
                    .insert(key.0, key.1, id)
                    .map_err(|_| RouteError::BadLength(key.1))?;
            }
            None => {
                w.rib.remove(&key);
                let _ = self.fib.remove(key.0, key.1);
            }
        }
        Ok(())
    }

    /// Adds a route. Routes to one prefix are kept ordered by metric; the lowest is used.
    pub fn add(&self, r: Route) -> Result<(), RouteError> {
        let key = rib_key(&r)?;
        let mut w = self.writer.lock();
        let v = w.rib.entry(key).or_default();
        if v.iter().any(|x| x.metric == r.metric) {
            return Err(RouteError::Exists(r.prefix, r.len, r.metric));
        }
        let at = v.partition_point(|x| x.metric <= r.metric);
        v.insert(at, r);
        self.publish(&mut w, key)
    }

    /// Adds `r`, or replaces the route with the same prefix, length and metric in one update
    /// (`ip route replace`): readers see the old route or the new one, never neither. Returns
    /// the route replaced, if any.
    pub fn replace(&self, r: Route) -> Result<Option<Route>, RouteError> {
        let key = rib_key(&r)?;
        let mut w = self.writer.lock();
        replace_in_rib(
            &mut w,
            |w| &mut w.rib,
            |x| x.metric,
            key,
            r,
            |w, key| self.publish(w, key),
        )
    }

    /// Removes the route to `prefix/len` with `metric` (any metric if `None`: the best one).
    pub fn remove(
        &self,
        prefix: Ipv4Addr,
        len: u8,
        metric: Option<u32>,
    ) -> Result<Route, RouteError> {
        let mut w = self.writer.lock();
        let key = (u32::from(prefix), len);
        let v = w
            .rib
            .get_mut(&key)
            .ok_or(RouteError::NotFound(prefix, len))?;
        let at = match metric {
            Some(m) => v.iter().position(|x| x.metric == m),
            None => (!v.is_empty()).then_some(0),
        }
        .ok_or(RouteError::NotFound(prefix, len))?;
        let r = v.remove(at);
        self.publish(&mut w, key)?;
        Ok(r)
    }

    /// Removes every route through `iface` (when the interface goes away).
    pub fn remove_iface(&self, iface: IfaceId) -> usize {
        let mut w = self.writer.lock();
        let keys: Vec<(u32, u8)> = w.rib.keys().copied().collect();
        let mut n = 0;
        for k in keys {
            if let Some(v) = w.rib.get_mut(&k) {
                let before = v.len();
                v.retain(|r| r.next_hop.iface() != Some(iface));
                n += before - v.len();
            }
            let _ = self.publish(&mut w, k);
        }
        n
    }

    /// Every route, best first within a prefix, prefixes in address order.
    pub fn routes(&self) -> Vec<Route> {
        self.writer.lock().rib.values().flatten().copied().collect()
    }

    /// Number of prefixes in the FIB.
    pub fn len(&self) -> usize {
        self.fib.len()
    }

    /// True when no route exists.
    pub fn is_empty(&self) -> bool {
        self.fib.is_empty()
    }

    /// Writes the table like `ip route show`, naming interfaces with `name`.
    pub fn fmt_routes(
        &self,
        out: &mut impl fmt::Write,
        name: &dyn Fn(IfaceId) -> String,
    ) -> fmt::Result {
        let all = self.routes();
        // A gateway that none of its interface's connected routes holds is `onlink` (as
        // Flannel's VXLAN routes: `via <peer's network address> dev flannel.1 onlink`); a
        // table without connected routes says nothing about it.
        let on_link = |i: IfaceId, gw: Ipv4Addr| {
            let mut connected = all
                .iter()
                .filter(|c| c.proto == RouteProto::Kernel && c.next_hop == NextHop::Link(i))
                .peekable();
            connected.peek().is_none() || connected.any(|c| mask(gw, c.len) == c.prefix)
        };
        for r in all.iter().copied() {
            let dst = if r.len == 0 {
                "default".to_string()
            } else if r.len == 32 {
                r.prefix.to_string()
            } else {
                format!("{}/{}", r.prefix, r.len)
            };
            match r.next_hop {
                NextHop::Blackhole => write!(out, "blackhole {dst}")?,
                NextHop::Unreachable => write!(out, "unreachable {dst}")?,
                NextHop::Via(i, gw) => {
                    write!(out, "{dst} via {gw} dev {}", name(i))?;
                    if !on_link(i, gw) {
                        write!(out, " onlink")?;
                    }
                }
                NextHop::Link(i) => write!(out, "{dst} dev {}", name(i))?,
            }
            match r.proto {
                RouteProto::Kernel => write!(out, " proto kernel scope link")?,
                RouteProto::Static => {}
            }
            if let Some(src) = r.src {
                write!(out, " src {src}")?;
            }
            if r.metric != 0 {
                write!(out, " metric {}", r.metric)?;
            }
            writeln!(out)?;
        }
        Ok(())
    }
}

/// The RIB key of a route (its prefix as a number and its length), once its length and
/// prefix are checked: no host bits set, at most 32 bits.
fn rib_key(r: &Route) -> Result<(u32, u8), RouteError> {
    if r.len > 32 {
        return Err(RouteError::BadLength(r.len));
    }
    if mask(r.prefix, r.len) != r.prefix {
        return Err(RouteError::HostBitsSet(r.prefix, r.len));
    }
    Ok((u32::from(r.prefix), r.len))
}

/// `replace` for both families' tables (`ip route replace`): puts `r` into its prefix's
/// routes (kept ordered by `metric`) in place of the one with its metric, publishes the
/// prefix, and returns the route replaced. When publishing fails, it puts the old route back
/// and publishes again, so a refused replacement changes nothing.
pub(crate) fn replace_in_rib<W, K: Ord + Copy, R: Copy, E>(
    w: &mut W,
    rib: fn(&mut W) -> &mut BTreeMap<K, Vec<R>>,
    metric: fn(&R) -> u32,
    key: K,
    r: R,
    mut publish: impl FnMut(&mut W, K) -> Result<(), E>,
) -> Result<Option<R>, E> {
    let m = metric(&r);
    let v = rib(w).entry(key).or_default();
    let old = v.iter().position(|x| metric(x) == m).map(|at| v.remove(at));
    let at = v.partition_point(|x| metric(x) <= m);
    v.insert(at, r);
    match publish(w, key) {
        Ok(()) => Ok(old),
        Err(e) => {
            if let Some(v) = rib(w).get_mut(&key) {
                v.retain(|x| metric(x) != m);
                if let Some(o) = old {
                    let at = v.partition_point(|x| metric(x) <= metric(&o));
                    v.insert(at, o);
                }
            }
            let _ = publish(w, key);
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn r(p: [u8; 4], len: u8, nh: NextHop, metric: u32) -> Route {
        Route {
            prefix: Ipv4Addr::from(p),
            len,
            next_hop: nh,
            metric,
            proto: RouteProto::Static,
            src: None,
        }
    }

    #[test]
    fn longest_prefix_and_metrics() {
        let t = RouteTable::new();
        let e0 = IfaceId(0);
        let e1 = IfaceId(1);
        t.add(r(
            [0, 0, 0, 0],
            0,
            NextHop::Via(e1, Ipv4Addr::new(172, 18, 0, 1)),
            0,
        ))
        .unwrap();
        t.add(r([10, 244, 1, 0], 24, NextHop::Link(e0), 0)).unwrap();
        t.add(r(
            [10, 244, 2, 0],
            24,
            NextHop::Via(e1, Ipv4Addr::new(172, 18, 0, 3)),
            0,
        ))
        .unwrap();
        t.add(r([10, 244, 9, 0], 24, NextHop::Blackhole, 0))
            .unwrap();
        t.add(r([10, 244, 9, 0], 24, NextHop::Unreachable, 10))
            .unwrap();
        assert_eq!(
            t.lookup(Ipv4Addr::new(10, 244, 1, 7)),
            Some(NextHop::Link(e0))
        );
        assert_eq!(
            t.lookup(Ipv4Addr::new(8, 8, 8, 8)),
            Some(NextHop::Via(e1, Ipv4Addr::new(172, 18, 0, 1)))
        );
        assert_eq!(
            t.lookup(Ipv4Addr::new(10, 244, 9, 1)),
            Some(NextHop::Blackhole)
        );
        t.remove(Ipv4Addr::new(10, 244, 9, 0), 24, Some(0)).unwrap();
        assert_eq!(
            t.lookup(Ipv4Addr::new(10, 244, 9, 1)),
            Some(NextHop::Unreachable)
        );
        assert!(t
            .add(r([10, 244, 9, 0], 24, NextHop::Blackhole, 10))
            .is_err());
        assert_eq!(
            t.add(r([10, 244, 9, 1], 24, NextHop::Blackhole, 0))
                .unwrap_err()
                .to_string(),
            "route 10.244.9.1/24 has host bits set: expected 10.244.9.0/24"
        );
        let mut s = String::new();
        t.fmt_routes(&mut s, &|i| format!("eth{}", i.0)).unwrap();
        assert_eq!(
            s,
            "default via 172.18.0.1 dev eth1\n10.244.1.0/24 dev eth0\n10.244.2.0/24 via 172.18.0.3 dev eth1\nunreachable 10.244.9.0/24 metric 10\n"
        );
        assert_eq!(t.remove_iface(e1), 2);
        assert_eq!(t.lookup(Ipv4Addr::new(8, 8, 8, 8)), None);
    }

    proptest! {
        /// Lookups match a linear scan over the best route of each prefix.
        #[test]
        fn matches_linear_scan(
            routes in proptest::collection::vec((any::<u32>(), 0u8..=32, 0u16..4, 0u32..3), 0..60),
            probes in proptest::collection::vec(any::<u32>(), 50),
        ) {
            let t = RouteTable::new();
            let mut model: Vec<Route> = Vec::new();
            for (a, len, iface, metric) in routes {
                let rt = r(mask(Ipv4Addr::from(a), len).octets(), len, NextHop::Link(IfaceId(iface)), metric);
                if t.add(rt).is_ok() {
                    model.push(rt);
                }
            }
            for p in probes.iter().copied().chain(model.iter().map(|r| u32::from(r.prefix) | 1)) {
                let ip = Ipv4Addr::from(p);
                let want = model
                    .iter()
                    .filter(|r| mask(ip, r.len) == r.prefix)
                    .min_by_key(|r| (std::cmp::Reverse(r.len), r.metric))
                    .map(|r| r.next_hop);
                prop_assert_eq!(t.lookup(ip), want);
            }
        }
    }
}
