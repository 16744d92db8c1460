//! The routing table of either family: routes like `ip route` and `ip -6 route` hold them
//! (connected, via a gateway, via an interface, blackhole, unreachable, prohibit; a metric so
//! several routes to one prefix coexist), compiled into a lock-free longest-prefix-match
//! [`Fib`](crate::l3::lpm::Fib). One table type for both families, [`RouteTable<A>`] with `A`
//! = [`Ipv4Addr`] (the default) or [`Ipv6Addr`]: what differs is the address ([`RouteAddr`]:
//! its LPM key, width, mask) and how `ip` prints a route.
//!
//! # Thread-safety contract
//!
//! * [`RouteTable::lookup`] and [`RouteReader::lookup`] are lock-free: one FIB look-up (an
//!   atomic pointer load and a trie walk) and one read of an interned next hop (a `OnceLock`
//!   set before its id is published).
//! * Changes ([`RouteTable::add`], [`RouteTable::replace`], [`RouteTable::remove`],
//!   [`RouteTable::remove_iface`]) take the table's writer mutex, update the RIB (every route,
//!   best or not), and publish the best route per prefix into the FIB; readers see each change
//!   entirely or not at all.
//! * Next hops are interned: each distinct next hop gets an id whose contents never change, and
//!   ids are never reused, so a reader holding an id from an older FIB version still reads the
//!   next hop that route had. The array is bounded ([`RouteAddr::MAX_NEXT_HOPS`]); distinct
//!   next hops are few (interfaces × gateways) in practice.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::hash::Hash;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::OnceLock;

use parking_lot::Mutex;

use crate::l3::lpm::{self, Fib};

pub use crate::base::IfaceId;

/// Distinct IPv4 next hops a table can hold.
pub const MAX_NEXT_HOPS: usize = <Ipv4Addr as RouteAddr>::MAX_NEXT_HOPS;

/// An address family's address as the routing table needs it: [`Ipv4Addr`] or [`Ipv6Addr`].
pub trait RouteAddr:
    crate::l3::neigh::NeighAddr + Hash + fmt::Debug + Send + Sync + sealed::Sealed + 'static
{
    /// The address as the LPM's key (`u32`, `u128`).
    type Key: lpm::Address;
    /// Its width in bits (32, 128).
    const BITS: u8;
    /// Distinct next hops a table of this family can hold.
    const MAX_NEXT_HOPS: usize;
    /// The family as `ip` names it in messages: "" or "IPv6 ".
    const NAME: &'static str;
    /// The LPM key of the address.
    fn key(self) -> Self::Key;
    /// The address with the bits past `len` cleared.
    fn mask(self, len: u8) -> Self;
    /// A gateway on-link whatever the connected routes say (IPv6 link-local).
    fn always_on_link(self) -> bool;
    /// A multicast address (never a gateway).
    fn is_multicast(self) -> bool;
    /// The router's table of this family.
    #[doc(hidden)]
    fn table(router: &crate::l3::Router) -> &RouteTable<Self>;
    /// The router's neighbour table of this family.
    #[doc(hidden)]
    fn neigh(router: &crate::l3::Router) -> &crate::l3::neigh::NeighTable<Self>;
    /// The router's interface that owns `a`.
    #[doc(hidden)]
    fn local_iface(router: &crate::l3::Router, a: Self) -> Option<IfaceId>;
    /// The interface's address of this family (IPv6: its global one) and prefix length.
    #[doc(hidden)]
    fn iface_cidr(cfg: &crate::l3::IfaceConfig) -> Option<(Self, u8)>;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for std::net::Ipv4Addr {}
    impl Sealed for std::net::Ipv6Addr {}
}

impl RouteAddr for Ipv4Addr {
    type Key = u32;
    const BITS: u8 = 32;
    const MAX_NEXT_HOPS: usize = 1 << 16;
    const NAME: &'static str = "";
    #[inline]
    fn key(self) -> u32 {
        u32::from(self)
    }
    fn mask(self, len: u8) -> Ipv4Addr {
        mask(self, len)
    }
    fn always_on_link(self) -> bool {
        false
    }
    fn is_multicast(self) -> bool {
        Ipv4Addr::is_multicast(&self)
    }
    fn table(router: &crate::l3::Router) -> &RouteTable<Ipv4Addr> {
        &router.routes
    }
    fn neigh(router: &crate::l3::Router) -> &crate::l3::neigh::NeighTable<Ipv4Addr> {
        &router.neigh
    }
    #[inline]
    fn local_iface(router: &crate::l3::Router, a: Ipv4Addr) -> Option<IfaceId> {
        router.find_iface(|i| i.cfg.addr.is_some_and(|(x, _)| x == a))
    }
    fn iface_cidr(cfg: &crate::l3::IfaceConfig) -> Option<(Ipv4Addr, u8)> {
        cfg.addr
    }
}

impl RouteAddr for Ipv6Addr {
    type Key = u128;
    const BITS: u8 = 128;
    const MAX_NEXT_HOPS: usize = 1 << 12;
    const NAME: &'static str = "IPv6 ";
    #[inline]
    fn key(self) -> u128 {
        u128::from(self)
    }
    fn mask(self, len: u8) -> Ipv6Addr {
        crate::wire::ipv6::mask(self, len)
    }
    fn always_on_link(self) -> bool {
        crate::wire::ipv6::is_link_local(&self)
    }
    fn is_multicast(self) -> bool {
        Ipv6Addr::is_multicast(&self)
    }
    fn table(router: &crate::l3::Router) -> &RouteTable<Ipv6Addr> {
        &router.routes6
    }
    fn neigh(router: &crate::l3::Router) -> &crate::l3::neigh::NeighTable<Ipv6Addr> {
        &router.neigh6
    }
    #[inline]
    fn local_iface(router: &crate::l3::Router, a: Ipv6Addr) -> Option<IfaceId> {
        router.ipv6_iface(a)
    }
    fn iface_cidr(cfg: &crate::l3::IfaceConfig) -> Option<(Ipv6Addr, u8)> {
        cfg.addr6
    }
}

/// Where a route sends matching packets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize),
    serde(rename_all = "lowercase")
)]
pub enum NextHop<A = Ipv4Addr> {
    /// On-link through an interface: the destination itself is the next hop (connected routes
    /// and `ip route add PREFIX dev IFACE`).
    Link(IfaceId),
    /// Through a gateway reached on an interface (for IPv6 it may be link-local: `via fe80::1
    /// dev eth0`).
    Via(IfaceId, A),
    /// Dropped silently (counted).
    Blackhole,
    /// Dropped with a destination unreachable: ICMP host unreachable, ICMPv6 no route (code
    /// 0), as Linux's `unreachable` route type.
    Unreachable,
    /// Dropped with a destination unreachable that says the route rejects it: ICMP
    /// communication administratively prohibited (code 13) as Linux's `prohibit` route type,
    /// ICMPv6 reject route (code 6).
    Prohibit,
}

impl<A> NextHop<A> {
    /// The interface, for routes that send packets out of one.
    pub fn iface(&self) -> Option<IfaceId> {
        match self {
            NextHop::Link(i) | NextHop::Via(i, _) => Some(*i),
            _ => None,
        }
    }
}

impl<A: Copy> NextHop<A> {
    /// Where a packet to `dst` goes by this route: the interface and the next hop (`dst`
    /// itself on-link, else the gateway); `None` for routes that deliver nothing.
    #[inline]
    pub(crate) fn hop(self, dst: A) -> Option<(IfaceId, A)> {
        match self {
            NextHop::Link(i) => Some((i, dst)),
            NextHop::Via(i, gw) => Some((i, gw)),
            _ => None,
        }
    }
}

/// How a route came to be, as `ip route`'s `proto`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize),
    serde(rename_all = "lowercase")
)]
pub enum RouteProto {
    /// Made from an interface address (`proto kernel scope link`).
    Kernel,
    /// Added by configuration or the API (`proto static`).
    Static,
}

/// One route.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Route<A = Ipv4Addr> {
    /// The destination prefix (host bits zero).
    pub prefix: A,
    /// Prefix length, 0 to the address width.
    pub len: u8,
    /// Where it sends packets.
    pub next_hop: NextHop<A>,
    /// Lower wins among routes to the same prefix.
    pub metric: u32,
    /// Its origin.
    pub proto: RouteProto,
    /// For connected routes: the interface's own address (`src`).
    pub src: Option<A>,
}

/// An invalid route given to [`RouteTable::add`]: the message names the field and value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RouteError<A = Ipv4Addr> {
    /// Prefix length over the address width.
    BadLength(u8),
    /// The prefix has bits set past its length.
    HostBitsSet(A, u8),
    /// An identical route (prefix, length, metric) exists.
    Exists(A, u8, u32),
    /// No route with that prefix, length and metric.
    NotFound(A, u8),
    /// The next-hop array is full.
    TooManyNextHops,
    /// The route names an interface that does not exist (or the datapath has no router).
    NoInterface(u16),
    /// A gateway that is not on a connected subnet of the route's interface (nor, for IPv6,
    /// link-local).
    GatewayNotOnLink(A),
}

impl<A: RouteAddr> fmt::Display for RouteError<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RouteError::BadLength(l) => {
                write!(f, "prefix length {l} is invalid: expected 0 to {}", A::BITS)
            }
            RouteError::HostBitsSet(p, l) => write!(
                f,
                "route {p}/{l} has host bits set: expected {}/{l}",
                p.mask(*l)
            ),
            RouteError::Exists(p, l, m) => write!(f, "route {p}/{l} metric {m} already exists"),
            RouteError::NotFound(p, l) => write!(f, "no route {p}/{l}"),
            RouteError::TooManyNextHops => write!(
                f,
                "too many distinct {}next hops (at most {})",
                A::NAME,
                A::MAX_NEXT_HOPS
            ),
            RouteError::NoInterface(i) => write!(f, "interface id {i} does not exist"),
            RouteError::GatewayNotOnLink(gw) if A::BITS == 128 => write!(
                f,
                "gateway {gw} is neither link-local nor on a connected subnet of the route's interface"
            ),
            RouteError::GatewayNotOnLink(gw) => write!(
                f,
                "gateway {gw} is not on a connected subnet of the route's interface"
            ),
        }
    }
}

impl<A: RouteAddr> std::error::Error for RouteError<A> {}

/// `addr` with the bits past `len` cleared.
pub fn mask(addr: Ipv4Addr, len: u8) -> Ipv4Addr {
    let a = u32::from(addr);
    Ipv4Addr::from(if len == 0 {
        0
    } else {
        a & (u32::MAX << (32 - u32::from(len.min(32))))
    })
}

struct Writer<A: RouteAddr> {
    rib: BTreeMap<(A::Key, u8), Vec<Route<A>>>,
    interned: HashMap<NextHop<A>, u32>,
}

/// One FIB version and the next-hop array, for a batch of look-ups ([`RouteTable::reader`]).
pub struct RouteReader<'a, A: RouteAddr = Ipv4Addr> {
    lpm: arc_swap::Guard<std::sync::Arc<lpm::Lpm<A::Key>>>,
    next_hops: &'a [OnceLock<NextHop<A>>],
}

impl<A: RouteAddr> fmt::Debug for RouteReader<'_, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RouteReader")
            .field("prefixes", &self.lpm.len())
            .finish()
    }
}

impl<A: RouteAddr> RouteReader<'_, A> {
    /// The next hop for `dst` in this version.
    #[inline]
    pub fn lookup(&self, dst: A) -> Option<NextHop<A>> {
        let id = self.lpm.lookup(dst.key())?;
        self.next_hops.get(id as usize)?.get().copied()
    }
}

/// The routing table of family `A` (see the module docs).
pub struct RouteTable<A: RouteAddr = Ipv4Addr> {
    fib: Fib<A::Key>,
    next_hops: Box<[OnceLock<NextHop<A>>]>,
    writer: Mutex<Writer<A>>,
}

impl<A: RouteAddr> fmt::Debug for RouteTable<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RouteTable")
            .field("prefixes", &self.fib.len())
            .finish()
    }
}

impl<A: RouteAddr> Default for RouteTable<A> {
    fn default() -> Self {
        RouteTable::new()
    }
}

impl<A: RouteAddr> RouteTable<A> {
    /// An empty table.
    pub fn new() -> RouteTable<A> {
        RouteTable {
            fib: Fib::new(),
            next_hops: (0..A::MAX_NEXT_HOPS).map(|_| OnceLock::new()).collect(),
            writer: Mutex::new(Writer {
                rib: BTreeMap::new(),
                interned: HashMap::new(),
            }),
        }
    }

    /// The next hop for `dst`, by longest prefix match. Lock-free.
    #[inline]
    pub fn lookup(&self, dst: A) -> Option<NextHop<A>> {
        let id = self.fib.lookup(dst.key())?;
        self.next_hops.get(id as usize)?.get().copied()
    }

    /// A consistent view for a batch of look-ups: the FIB version is loaded once.
    #[inline]
    pub fn reader(&self) -> RouteReader<'_, A> {
        RouteReader {
            lpm: self.fib.load(),
            next_hops: &self.next_hops,
        }
    }

    fn intern(&self, w: &mut Writer<A>, nh: NextHop<A>) -> Result<u32, RouteError<A>> {
        if let Some(&id) = w.interned.get(&nh) {
            return Ok(id);
        }
        let n = w.interned.len();
        let id = match u32::try_from(n) {
            Ok(id) if n < A::MAX_NEXT_HOPS => id,
            _ => return Err(RouteError::TooManyNextHops),
        };
        let _ = self.next_hops[n].set(nh);
        w.interned.insert(nh, id);
        Ok(id)
    }

    fn publish(&self, w: &mut Writer<A>, key: (A::Key, u8)) -> Result<(), RouteError<A>> {
        match w.rib.get(&key).and_then(|v| v.first().copied()) {
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

    /// Adds a route. Routes to one prefix are kept ordered by metric; the lowest is used. A
    /// refused route (too many next hops) changes nothing.
    pub fn add(&self, r: Route<A>) -> Result<(), RouteError<A>> {
        let key = rib_key(&r)?;
        let mut w = self.writer.lock();
        let v = w.rib.entry(key).or_default();
        if v.iter().any(|x| x.metric == r.metric) {
            return Err(RouteError::Exists(r.prefix, r.len, r.metric));
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
    /// (`ip route replace`): readers see the old route or the new one, never neither (the
    /// prefix's FIB entry is overwritten in place and published at once). Returns the route
    /// replaced, if any; a refused replacement (too many next hops) changes nothing.
    pub fn replace(&self, r: Route<A>) -> Result<Option<Route<A>>, RouteError<A>> {
        let key = rib_key(&r)?;
        let mut w = self.writer.lock();
        let m = r.metric;
        let v = w.rib.entry(key).or_default();
        let old = v.iter().position(|x| x.metric == m).map(|at| v.remove(at));
        let at = v.partition_point(|x| x.metric <= m);
        v.insert(at, r);
        match self.publish(&mut w, key) {
            Ok(()) => Ok(old),
            Err(e) => {
                // Put the old route back, so a refused replacement changes nothing.
                if let Some(v) = w.rib.get_mut(&key) {
                    v.retain(|x| x.metric != m);
                    if let Some(o) = old {
                        let at = v.partition_point(|x| x.metric <= o.metric);
                        v.insert(at, o);
                    }
                }
                let _ = self.publish(&mut w, key);
                Err(e)
            }
        }
    }

    /// Removes the route to `prefix/len` with `metric` (any metric if `None`: the best one).
    pub fn remove(
        &self,
        prefix: A,
        len: u8,
        metric: Option<u32>,
    ) -> Result<Route<A>, RouteError<A>> {
        let mut w = self.writer.lock();
        let key = (prefix.key(), len);
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

    /// Removes every route through `iface` (when the interface goes away); returns how many.
    pub fn remove_iface(&self, iface: IfaceId) -> usize {
        let mut w = self.writer.lock();
        let keys: Vec<(A::Key, u8)> = w.rib.keys().copied().collect();
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
    pub fn routes(&self) -> Vec<Route<A>> {
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

    /// Writes the table as `ip route show` (IPv4) or `ip -6 route show` (IPv6) prints it,
    /// naming interfaces with `name`.
    pub fn fmt_routes(
        &self,
        out: &mut impl fmt::Write,
        name: &dyn Fn(IfaceId) -> String,
    ) -> fmt::Result {
        let v6 = A::BITS == 128;
        let all = self.routes();
        // A gateway that none of its interface's connected routes holds is `onlink` (as
        // Flannel's VXLAN routes: `via <peer's network address> dev flannel.1 onlink`); an
        // IPv4 table without connected routes says nothing about it, an IPv6 link-local
        // gateway is always on-link.
        let on_link = |i: IfaceId, gw: A| {
            let mut connected = all
                .iter()
                .filter(|c| c.proto == RouteProto::Kernel && c.next_hop == NextHop::Link(i))
                .peekable();
            gw.always_on_link()
                || (!v6 && connected.peek().is_none())
                || connected.any(|c| gw.mask(c.len) == c.prefix)
        };
        // `ip -6 route` names the loopback device for routes that drop.
        let lo = if v6 { " dev lo" } else { "" };
        for r in all.iter().copied() {
            let dst = if r.len == 0 {
                "default".to_string()
            } else if r.len == A::BITS && !v6 {
                r.prefix.to_string()
            } else {
                format!("{}/{}", r.prefix, r.len)
            };
            match r.next_hop {
                NextHop::Blackhole => write!(out, "blackhole {dst}{lo}")?,
                NextHop::Unreachable => write!(out, "unreachable {dst}{lo}")?,
                NextHop::Prohibit => write!(out, "prohibit {dst}{lo}")?,
                NextHop::Via(i, gw) => {
                    write!(out, "{dst} via {gw} dev {}", name(i))?;
                    if !v6 && !on_link(i, gw) {
                        write!(out, " onlink")?;
                    }
                }
                NextHop::Link(i) => write!(out, "{dst} dev {}", name(i))?,
            }
            match (r.proto, v6) {
                (RouteProto::Kernel, false) => write!(out, " proto kernel scope link")?,
                (RouteProto::Kernel, true) => write!(out, " proto kernel")?,
                (RouteProto::Static, false) => {}
                (RouteProto::Static, true) => write!(out, " proto static")?,
            }
            if let Some(src) = r.src {
                write!(out, " src {src}")?;
            }
            if r.metric != 0 || v6 {
                write!(out, " metric {}", r.metric)?;
            }
            match r.next_hop {
                NextHop::Via(i, gw) if v6 && !on_link(i, gw) => writeln!(out, " onlink")?,
                _ => writeln!(out)?,
            }
        }
        Ok(())
    }
}

/// The RIB key of a route (its prefix as a number and its length), once its length and
/// prefix are checked: no host bits set, at most the address width.
fn rib_key<A: RouteAddr>(r: &Route<A>) -> Result<(A::Key, u8), RouteError<A>> {
    if r.len > A::BITS {
        return Err(RouteError::BadLength(r.len));
    }
    if r.prefix.mask(r.len) != r.prefix {
        return Err(RouteError::HostBitsSet(r.prefix, r.len));
    }
    Ok((r.prefix.key(), r.len))
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

    fn ipv6_route(p: &str, len: u8, nh: NextHop<Ipv6Addr>, metric: u32) -> Route<Ipv6Addr> {
        Route {
            prefix: p.parse().unwrap(),
            len,
            next_hop: nh,
            metric,
            proto: RouteProto::Static,
            src: None,
        }
    }

    #[test]
    fn ipv6_longest_prefix_metrics_and_errors() {
        let t = RouteTable::<Ipv6Addr>::new();
        let (e0, e1) = (IfaceId(0), IfaceId(1));
        let gw: Ipv6Addr = "fe80::1".parse().unwrap();
        t.add(ipv6_route("::", 0, NextHop::Via(e1, gw), 0)).unwrap();
        t.add(ipv6_route("fd00:10:244:1::", 64, NextHop::Link(e0), 0))
            .unwrap();
        t.add(ipv6_route("fd00:10:244:1::", 64, NextHop::Blackhole, 10))
            .unwrap();
        t.add(ipv6_route("fd00:dead::", 32, NextHop::Prohibit, 0))
            .unwrap();
        let l = |a: &str| t.lookup(a.parse().unwrap());
        assert_eq!(l("fd00:10:244:1::5"), Some(NextHop::Link(e0)));
        assert_eq!(l("2001:db8::1"), Some(NextHop::Via(e1, gw)));
        assert_eq!(l("fd00:dead::1"), Some(NextHop::Prohibit));
        t.remove("fd00:10:244:1::".parse().unwrap(), 64, Some(0))
            .unwrap();
        assert_eq!(l("fd00:10:244:1::5"), Some(NextHop::Blackhole));
        assert_eq!(
            t.add(ipv6_route("fd00::1", 64, NextHop::Blackhole, 0)),
            Err(RouteError::HostBitsSet("fd00::1".parse().unwrap(), 64))
        );
        assert!(matches!(
            t.add(ipv6_route("::", 0, NextHop::Blackhole, 0)),
            Err(RouteError::Exists(..))
        ));
        assert_eq!(t.remove_iface(e1), 1);
        assert_eq!(l("2001:db8::1"), None);
        let mut s = String::new();
        t.add(ipv6_route("::", 0, NextHop::Via(e1, gw), 0)).unwrap();
        t.fmt_routes(&mut s, &|i| format!("eth{}", i.0)).unwrap();
        assert!(
            s.contains("default via fe80::1 dev eth1 proto static metric 0"),
            "{s}"
        );
    }

    #[test]
    fn ipv6_replace_swaps_one_metric_in_place_and_readers_never_see_a_gap() {
        let t = std::sync::Arc::new(RouteTable::<Ipv6Addr>::new());
        let (e0, e1) = (IfaceId(0), IfaceId(1));
        let gw = |i: u16| Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, i);
        // A new prefix: added.
        assert_eq!(
            t.replace(ipv6_route("::", 0, NextHop::Via(e0, gw(1)), 0)),
            Ok(None)
        );
        t.add(ipv6_route("::", 0, NextHop::Blackhole, 100)).unwrap();
        // The same prefix and metric: replaced, the old one returned, the other metric kept.
        assert_eq!(
            t.replace(ipv6_route("::", 0, NextHop::Via(e1, gw(2)), 0)),
            Ok(Some(ipv6_route("::", 0, NextHop::Via(e0, gw(1)), 0)))
        );
        let dst: Ipv6Addr = "2001:db8::1".parse().unwrap();
        assert_eq!(t.lookup(dst), Some(NextHop::Via(e1, gw(2))));
        assert_eq!(t.routes().len(), 2);
        assert_eq!(
            t.replace(ipv6_route("fd00::1", 64, NextHop::Blackhole, 0)),
            Err(RouteError::HostBitsSet("fd00::1".parse().unwrap(), 64))
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
            let nh = NextHop::Via(if i % 2 == 0 { e0 } else { e1 }, gw(i % 8 + 1));
            t.replace(ipv6_route("::", 0, nh, 0)).unwrap();
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

    /// Lookups match a linear scan over the best route (longest prefix, then lowest metric)
    /// of each prefix: `routes` as (address, length, interface, metric), host bits cleared.
    fn matches_linear_scan<A: RouteAddr>(
        routes: Vec<(A, u8, u16, u32)>,
        probes: Vec<A>,
    ) -> Result<(), TestCaseError> {
        let t = RouteTable::<A>::new();
        let mut model: Vec<Route<A>> = Vec::new();
        for (a, len, iface, metric) in routes {
            let rt = Route {
                prefix: a.mask(len),
                len,
                next_hop: NextHop::Link(IfaceId(iface)),
                metric,
                proto: RouteProto::Static,
                src: None,
            };
            if t.add(rt).is_ok() {
                model.push(rt);
            }
        }
        for ip in probes.into_iter().chain(model.iter().map(|r| r.prefix)) {
            let want = model
                .iter()
                .filter(|r| ip.mask(r.len) == r.prefix)
                .min_by_key(|r| (std::cmp::Reverse(r.len), r.metric))
                .map(|r| r.next_hop);
            prop_assert_eq!(t.lookup(ip), want);
        }
        Ok(())
    }

    proptest! {
        #[test]
        fn ipv4_matches_linear_scan(
            routes in proptest::collection::vec((any::<u32>().prop_map(Ipv4Addr::from), 0u8..=32, 0u16..4, 0u32..3), 0..60),
            probes in proptest::collection::vec(any::<u32>().prop_map(Ipv4Addr::from), 50),
        ) {
            matches_linear_scan(routes, probes)?;
        }

        #[test]
        fn ipv6_matches_linear_scan(
            routes in proptest::collection::vec((any::<u128>().prop_map(Ipv6Addr::from), 0u8..=128, 0u16..4, 0u32..3), 0..40),
            probes in proptest::collection::vec(any::<u128>().prop_map(Ipv6Addr::from), 0..40),
        ) {
            matches_linear_scan(routes, probes)?;
        }
    }
}
