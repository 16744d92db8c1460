//! The IPv6 routing table: the same design as the IPv4 [`crate::l3::RouteTable`] (every route
//! kept in a RIB with metrics, the best per prefix published into a lock-free
//! longest-prefix-match [`Fib6`], next hops interned), for `ip -6 route`.
//!
//! # Thread-safety contract
//!
//! * [`RouteTable6::lookup`] and [`RouteReader6::lookup`] are lock-free: one [`Fib6`] look-up
//!   and one read of an interned next hop (a `OnceLock` set before the id is published).
//! * Changes take the writer mutex; readers see each change entirely or not at all. Interned
//!   next hops never change and ids are never reused ([`MAX_NEXT_HOPS6`] of them).

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::net::Ipv6Addr;
use std::sync::OnceLock;

use parking_lot::Mutex;

use crate::base::IfaceId;
use crate::l3::lpm::Fib6;
use crate::l3::route::{replace_in_rib, RouteProto};
use crate::wire::ipv6::mask;

/// Distinct IPv6 next hops a table can hold.
pub const MAX_NEXT_HOPS6: usize = 1 << 12;

/// Where an IPv6 route sends matching packets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NextHop6 {
    /// On-link through an interface: the destination itself is the next hop.
    Link(IfaceId),
    /// Through a gateway reached on an interface; the gateway may be link-local
    /// (`via fe80::1 dev eth0`).
    Via(IfaceId, Ipv6Addr),
    /// Dropped silently (counted).
    Blackhole,
    /// Dropped with ICMPv6 destination unreachable: code 0 (no route) as Linux's
    /// `ip -6 route add unreachable`, or code 6 (reject route) with `reject`.
    Unreachable {
        /// Answer with code 6 (reject route) instead of 0.
        reject: bool,
    },
}

impl NextHop6 {
    /// The interface, for routes that send packets out of one.
    pub fn iface(self) -> Option<IfaceId> {
        match self {
            NextHop6::Link(i) | NextHop6::Via(i, _) => Some(i),
            _ => None,
        }
    }
}

/// One IPv6 route.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Route6 {
    /// The destination prefix (host bits zero).
    pub prefix: Ipv6Addr,
    /// Prefix length, 0..=128.
    pub len: u8,
    /// Where it sends packets.
    pub next_hop: NextHop6,
    /// Lower wins among routes to the same prefix.
    pub metric: u32,
    /// Its origin.
    pub proto: RouteProto,
}

/// An invalid IPv6 route: the message names the field and value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RouteError6 {
    /// Prefix length over 128.
    BadLength(u8),
    /// The prefix has bits set past its length.
    HostBitsSet(Ipv6Addr, u8),
    /// An identical route (prefix, length, metric) exists.
    Exists(Ipv6Addr, u8, u32),
    /// No route with that prefix, length and metric.
    NotFound(Ipv6Addr, u8),
    /// The next-hop array is full.
    TooManyNextHops,
    /// The route names an interface that does not exist (or the datapath has no router).
    NoInterface(u16),
    /// A gateway that is neither link-local nor on a connected subnet of the route's
    /// interface.
    GatewayNotOnLink(Ipv6Addr),
}

impl fmt::Display for RouteError6 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RouteError6::BadLength(l) => {
                write!(f, "prefix length {l} is invalid: expected 0 to 128")
            }
            RouteError6::HostBitsSet(p, l) => write!(
                f,
                "route {p}/{l} has host bits set: expected {}/{l}",
                mask(*p, *l)
            ),
            RouteError6::Exists(p, l, m) => write!(f, "route {p}/{l} metric {m} already exists"),
            RouteError6::NotFound(p, l) => write!(f, "no route {p}/{l}"),
            RouteError6::TooManyNextHops => write!(
                f,
                "too many distinct IPv6 next hops (at most {MAX_NEXT_HOPS6})"
            ),
            RouteError6::NoInterface(i) => write!(f, "interface id {i} does not exist"),
            RouteError6::GatewayNotOnLink(gw) => write!(
                f,
                "gateway {gw} is neither link-local nor on a connected subnet of the route's interface"
            ),
        }
    }
}

impl std::error::Error for RouteError6 {}

struct Writer {
    rib: BTreeMap<(u128, u8), Vec<Route6>>,
    interned: HashMap<NextHop6, u32>,
}

/// One FIB version and the next-hop array, for a batch of look-ups
/// ([`RouteTable6::reader`]).
pub struct RouteReader6<'a> {
    lpm: arc_swap::Guard<std::sync::Arc<crate::l3::lpm::Lpm6>>,
    next_hops: &'a [OnceLock<NextHop6>],
}

impl fmt::Debug for RouteReader6<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RouteReader6")
            .field("prefixes", &self.lpm.len())
            .finish()
    }
}

impl RouteReader6<'_> {
    /// The next hop for `dst` in this version.
    #[inline]
    pub fn lookup(&self, dst: Ipv6Addr) -> Option<NextHop6> {
        let id = self.lpm.lookup(u128::from(dst))?;
        self.next_hops.get(id as usize)?.get().copied()
    }
}

/// The IPv6 routing table (see the module docs).
pub struct RouteTable6 {
    fib: Fib6,
    next_hops: Box<[OnceLock<NextHop6>]>,
    writer: Mutex<Writer>,
}

impl fmt::Debug for RouteTable6 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RouteTable6")
            .field("prefixes", &self.fib.len())
            .finish()
    }
}

impl Default for RouteTable6 {
    fn default() -> Self {
        RouteTable6::new()
    }
}

fn rib_key(r: &Route6) -> Result<(u128, u8), RouteError6> {
    if r.len > 128 {
        return Err(RouteError6::BadLength(r.len));
    }
    if mask(r.prefix, r.len) != r.prefix {
        return Err(RouteError6::HostBitsSet(r.prefix, r.len));
    }
    Ok((u128::from(r.prefix), r.len))
}

impl RouteTable6 {
    /// An empty table.
    pub fn new() -> RouteTable6 {
        RouteTable6 {
            fib: Fib6::new(),
            next_hops: (0..MAX_NEXT_HOPS6).map(|_| OnceLock::new()).collect(),
            writer: Mutex::new(Writer {
                rib: BTreeMap::new(),
                interned: HashMap::new(),
            }),
        }
    }

    /// The next hop for `dst`, by longest prefix match. Lock-free.
    #[inline]
    pub fn lookup(&self, dst: Ipv6Addr) -> Option<NextHop6> {
        let id = self.fib.lookup(u128::from(dst))?;
        self.next_hops.get(id as usize)?.get().copied()
    }

    /// A consistent view for a batch of look-ups: the FIB version is loaded once.
    #[inline]
    pub fn reader(&self) -> RouteReader6<'_> {
        RouteReader6 {
            lpm: self.fib.load(),
            next_hops: &self.next_hops,
        }
    }

    fn intern(&self, w: &mut Writer, nh: NextHop6) -> Result<u32, RouteError6> {
        if let Some(&id) = w.interned.get(&nh) {
            return Ok(id);
        }
        let n = w.interned.len();
        let id = match u32::try_from(n) {
            Ok(id) if n < MAX_NEXT_HOPS6 => id,
            _ => return Err(RouteError6::TooManyNextHops),
        };
        let _ = self.next_hops[n].set(nh);
        w.interned.insert(nh, id);
        Ok(id)
    }

    fn publish(&self, w: &mut Writer, key: (u128, u8)) -> Result<(), RouteError6> {
        match w.rib.get(&key).and_then(|v| v.first().copied()) {
            Some(r) => {
                let id = self.intern(w, r.next_hop)?;
                self.fib
                    .insert(key.0, key.1, id)
                    .map_err(|_| RouteError6::BadLength(key.1))?;
            }
            None => {
                w.rib.remove(&key);
                let _ = self.fib.remove(key.0, key.1);
            }
        }
        Ok(())
    }

    /// Adds a route. Routes to one prefix are kept ordered by metric; the lowest is used.
    pub fn add(&self, r: Route6) -> Result<(), RouteError6> {
        let key = rib_key(&r)?;
        let mut w = self.writer.lock();
        let v = w.rib.entry(key).or_default();
        if v.iter().any(|x| x.metric == r.metric) {
            return Err(RouteError6::Exists(r.prefix, r.len, r.metric));
        }
        let at = v.partition_point(|x| x.metric <= r.metric);
        v.insert(at, r);
        let res = self.publish(&mut w, key);
        if res.is_err() {
            if let Some(v) = w.rib.get_mut(&key) {
                v.retain(|x| x.metric != r.metric);
            }
            let _ = self.publish(&mut w, key);
        }
        res
    }

    /// Adds `r`, or replaces the route with the same prefix, length and metric in one update
    /// (`ip -6 route replace`): readers see the old route or the new one, never neither (the
    /// prefix's FIB entry is overwritten in place and published at once). Returns the route
    /// replaced, if any; a refused replacement (too many next hops) changes nothing.
    pub fn replace(&self, r: Route6) -> Result<Option<Route6>, RouteError6> {
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
        prefix: Ipv6Addr,
        len: u8,
        metric: Option<u32>,
    ) -> Result<Route6, RouteError6> {
        let mut w = self.writer.lock();
        let key = (u128::from(prefix), len);
        let v = w
            .rib
            .get_mut(&key)
            .ok_or(RouteError6::NotFound(prefix, len))?;
        let at = match metric {
            Some(m) => v.iter().position(|x| x.metric == m),
            None => (!v.is_empty()).then_some(0),
        }
        .ok_or(RouteError6::NotFound(prefix, len))?;
        let r = v.remove(at);
        self.publish(&mut w, key)?;
        Ok(r)
    }

    /// Removes every route through `iface`; returns how many.
    pub fn remove_iface(&self, iface: IfaceId) -> usize {
        let mut w = self.writer.lock();
        let keys: Vec<(u128, u8)> = w.rib.keys().copied().collect();
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

    /// Every route, best first per prefix, prefixes in address order.
    pub fn routes(&self) -> Vec<Route6> {
        self.writer.lock().rib.values().flatten().copied().collect()
    }

    /// Number of prefixes in the FIB.
    pub fn len(&self) -> usize {
        self.fib.len()
    }

    /// True when there are no routes.
    pub fn is_empty(&self) -> bool {
        self.fib.is_empty()
    }

    /// Writes the routes as `ip -6 route` prints them (`name` names interfaces).
    pub fn fmt_routes(
        &self,
        out: &mut impl fmt::Write,
        name: &dyn Fn(IfaceId) -> String,
    ) -> fmt::Result {
        let all = self.routes();
        // `onlink` (as Flannel's VXLAN routes): a global gateway inside no connected subnet
        // of its interface.
        let on_link = |i: IfaceId, gw: Ipv6Addr| {
            crate::wire::ipv6::is_link_local(&gw)
                || all.iter().any(|c| {
                    c.proto == RouteProto::Kernel
                        && c.next_hop == NextHop6::Link(i)
                        && mask(gw, c.len) == c.prefix
                })
        };
        for r in all.iter().copied() {
            let dst = if r.len == 0 {
                "default".to_string()
            } else {
                format!("{}/{}", r.prefix, r.len)
            };
            match r.next_hop {
                NextHop6::Blackhole => write!(out, "blackhole {dst} dev lo")?,
                NextHop6::Unreachable { reject: false } => write!(out, "unreachable {dst} dev lo")?,
                NextHop6::Unreachable { reject: true } => write!(out, "prohibit {dst} dev lo")?,
                NextHop6::Via(i, gw) => write!(out, "{dst} via {gw} dev {}", name(i))?,
                NextHop6::Link(i) => write!(out, "{dst} dev {}", name(i))?,
            }
            match r.proto {
                RouteProto::Kernel => write!(out, " proto kernel")?,
                RouteProto::Static => write!(out, " proto static")?,
            }
            write!(out, " metric {}", r.metric)?;
            match r.next_hop {
                NextHop6::Via(i, gw) if !on_link(i, gw) => writeln!(out, " onlink")?,
                _ => writeln!(out)?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn r(p: &str, len: u8, nh: NextHop6, metric: u32) -> Route6 {
        Route6 {
            prefix: p.parse().unwrap(),
            len,
            next_hop: nh,
            metric,
            proto: RouteProto::Static,
        }
    }

    #[test]
    fn longest_prefix_metrics_and_errors() {
        let t = RouteTable6::new();
        let (e0, e1) = (IfaceId(0), IfaceId(1));
        let gw: Ipv6Addr = "fe80::1".parse().unwrap();
        t.add(r("::", 0, NextHop6::Via(e1, gw), 0)).unwrap();
        t.add(r("fd00:10:244:1::", 64, NextHop6::Link(e0), 0))
            .unwrap();
        t.add(r("fd00:10:244:1::", 64, NextHop6::Blackhole, 10))
            .unwrap();
        t.add(r(
            "fd00:dead::",
            32,
            NextHop6::Unreachable { reject: true },
            0,
        ))
        .unwrap();
        let l = |a: &str| t.lookup(a.parse().unwrap());
        assert_eq!(l("fd00:10:244:1::5"), Some(NextHop6::Link(e0)));
        assert_eq!(l("2001:db8::1"), Some(NextHop6::Via(e1, gw)));
        assert_eq!(
            l("fd00:dead::1"),
            Some(NextHop6::Unreachable { reject: true })
        );
        t.remove("fd00:10:244:1::".parse().unwrap(), 64, Some(0))
            .unwrap();
        assert_eq!(l("fd00:10:244:1::5"), Some(NextHop6::Blackhole));
        assert_eq!(
            t.add(r("fd00::1", 64, NextHop6::Blackhole, 0)),
            Err(RouteError6::HostBitsSet("fd00::1".parse().unwrap(), 64))
        );
        assert!(matches!(
            t.add(r("::", 0, NextHop6::Blackhole, 0)),
            Err(RouteError6::Exists(..))
        ));
        assert_eq!(t.remove_iface(e1), 1);
        assert_eq!(l("2001:db8::1"), None);
        let mut s = String::new();
        t.add(r("::", 0, NextHop6::Via(e1, gw), 0)).unwrap();
        t.fmt_routes(&mut s, &|i| format!("eth{}", i.0)).unwrap();
        assert!(
            s.contains("default via fe80::1 dev eth1 proto static metric 0"),
            "{s}"
        );
    }

    #[test]
    fn replace_swaps_one_metric_in_place_and_readers_never_see_a_gap() {
        let t = std::sync::Arc::new(RouteTable6::new());
        let (e0, e1) = (IfaceId(0), IfaceId(1));
        let gw = |i: u16| Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, i);
        // A new prefix: added.
        assert_eq!(t.replace(r("::", 0, NextHop6::Via(e0, gw(1)), 0)), Ok(None));
        t.add(r("::", 0, NextHop6::Blackhole, 100)).unwrap();
        // The same prefix and metric: replaced, the old one returned, the other metric kept.
        assert_eq!(
            t.replace(r("::", 0, NextHop6::Via(e1, gw(2)), 0)),
            Ok(Some(r("::", 0, NextHop6::Via(e0, gw(1)), 0)))
        );
        let dst: Ipv6Addr = "2001:db8::1".parse().unwrap();
        assert_eq!(t.lookup(dst), Some(NextHop6::Via(e1, gw(2))));
        assert_eq!(t.routes().len(), 2);
        assert_eq!(
            t.replace(r("fd00::1", 64, NextHop6::Blackhole, 0)),
            Err(RouteError6::HostBitsSet("fd00::1".parse().unwrap(), 64))
        );
        // Readers looking up while the default route's gateway flips never find no route
        // (as `ip -6 route replace`; a remove + add would leave a moment without one).
        t.remove("::".parse().unwrap(), 0, Some(100)).unwrap();
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let seen = std::sync::Arc::new(AtomicU64::new(0));
        let reader = {
            let (t, stop, seen) = (t.clone(), stop.clone(), seen.clone());
            std::thread::spawn(move || {
                while !stop.load(Relaxed) {
                    let n = seen.load(Relaxed);
                    assert!(t.reader().lookup(dst).is_some(), "a gap after {n} lookups");
                    seen.store(n + 1, Relaxed);
                }
            })
        };
        // The reader must be looking up while the writer replaces (on a busy machine it
        // may not have been scheduled yet): wait for it, then replace until it has done
        // some lookups meanwhile (within a bound).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while seen.load(Relaxed) == 0 && std::time::Instant::now() < deadline {
            std::thread::yield_now();
        }
        let start = seen.load(Relaxed);
        let mut i = 0u16;
        while i < 2000 || (seen.load(Relaxed) < start + 100 && std::time::Instant::now() < deadline)
        {
            let nh = NextHop6::Via(if i % 2 == 0 { e0 } else { e1 }, gw(i % 8 + 1));
            t.replace(r("::", 0, nh, 0)).unwrap();
            i = i.wrapping_add(1);
        }
        stop.store(true, Relaxed);
        reader.join().unwrap();
        assert!(
            seen.load(Relaxed) > start,
            "the reader never ran during the replaces"
        );
        assert_eq!(t.routes().len(), 1);
    }

    proptest! {
        #[test]
        fn matches_a_linear_scan(routes in proptest::collection::vec((any::<u128>(), 0u8..=128, 0u16..4), 0..40), probes in proptest::collection::vec(any::<u128>(), 0..40)) {
            let t = RouteTable6::new();
            let mut model: Vec<(u128, u8, NextHop6)> = Vec::new();
            for (p, len, i) in routes {
                let p = u128::from(mask(Ipv6Addr::from(p), len));
                let nh = NextHop6::Link(IfaceId(i));
                if t.add(Route6 { prefix: p.into(), len, next_hop: nh, metric: 0, proto: RouteProto::Static }).is_ok() {
                    model.push((p, len, nh));
                }
            }
            for a in probes.into_iter().chain(model.iter().map(|m| m.0)) {
                let want = model
                    .iter()
                    .filter(|(p, len, _)| u128::from(mask(a.into(), *len)) == *p)
                    .max_by_key(|m| m.1)
                    .map(|m| m.2);
                prop_assert_eq!(t.lookup(a.into()), want);
            }
        }
    }
}
