//! The IPv6 neighbour cache (NDP): the same table, state machine, limits, timers and queues
//! as ARP's ([`NeighTable`], configured by the same [`NeighConfig`]), keyed by a 24-bit id
//! per IPv6 address.
//!
//! The slot keys of [`NeighTable`] hold an interface and a 32-bit address; an IPv6 address
//! does not fit, so each neighbour address is interned: an RCU map (`arc_swap`) gives its id
//! lock-free, and the id stands in for the address inside the table. Lookups stay lock-free
//! (one map read, then the table's look-up); interning a new address (a new neighbour,
//! slow path) takes the id mutex and publishes a copy of the map. The map holds at most four
//! ids per table entry (`4 × gc_thresh3`); when it is full, ids no longer in the table are
//! reclaimed, so it stays bounded as the table does.
//!
//! NDP maps onto the ARP rules of the table as Linux's `ndisc_recv_ns` / `ndisc_recv_na`
//! do onto `neigh_update`: an NS (or RS) with a source link-layer option from a neighbour
//! creates or updates a `STALE` entry ([`NeighTable6::input_solicit`]); a solicited NA
//! confirms (`REACHABLE`), an unsolicited one updates an existing entry to `STALE` and
//! never creates one; an NA without the override flag does not change a known MAC
//! ([`NeighTable6::input_advert`]).

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use hashbrown::HashMap;
use parking_lot::Mutex;

use super::slots::key_of;
use super::state::decode;
use super::{
    ArpHeard, ArpOp, Enqueue, Learned, NeighConfig, NeighError, NeighState, NeighTable, Refusal,
};
use crate::base::IfaceId;
use crate::time::Instant;
use crate::wire::mac::MacAddr;

/// The first stand-in address: ids are carried as `1.0.0.0 + id`, never an address the
/// table refuses (unspecified, broadcast, multicast).
const ID_BASE: u32 = 0x0100_0000;
/// Ids available (24 bits).
const MAX_IDS: usize = 1 << 24;

/// A frame released for an IPv6 neighbour.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Released6 {
    /// The interface.
    pub iface: IfaceId,
    /// The neighbour.
    pub ip: Ipv6Addr,
    /// Its MAC: the frame's destination.
    pub mac: MacAddr,
    /// The frame.
    pub frame: Vec<u8>,
}

/// Work for the caller produced by [`NeighTable6::poll`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NeighEvent6 {
    /// Send a Neighbor Solicitation for `ip` out of `iface`: to its solicited-node group when
    /// `unicast` is `None`, else to that MAC (a reachability probe).
    Solicit {
        /// The interface.
        iface: IfaceId,
        /// The address asked for.
        ip: Ipv6Addr,
        /// The destination MAC of a unicast probe.
        unicast: Option<MacAddr>,
    },
    /// Resolution of `ip` failed and `frame` was waiting for it (ICMPv6 address unreachable).
    Unreachable {
        /// The interface.
        iface: IfaceId,
        /// The neighbour that did not answer.
        ip: Ipv6Addr,
        /// The frame.
        frame: Vec<u8>,
    },
}

/// One row of [`NeighTable6::dump`], like a line of `ip -6 neigh show`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct NeighEntry6 {
    /// The interface.
    pub iface: IfaceId,
    /// The neighbour's address.
    pub ip: Ipv6Addr,
    /// Its MAC, for states that have a usable one.
    pub mac: Option<MacAddr>,
    /// The state.
    pub state: NeighState,
    /// Time since the last confirmation; `None` if never confirmed.
    pub confirmed_ago: Option<Duration>,
    /// Time since the entry's state or MAC last changed.
    pub updated_ago: Duration,
    /// Frames waiting for resolution.
    pub queued: usize,
}

/// What [`NeighTable6::input_advert`] learns from in a Neighbor Advertisement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Advert {
    /// The target address (the neighbour's).
    pub ip: Ipv6Addr,
    /// The Target Link-Layer Address option, if present.
    pub mac: Option<MacAddr>,
    /// The solicited flag.
    pub solicited: bool,
    /// The override flag.
    pub override_: bool,
}

#[derive(Default)]
struct Ids {
    rev: HashMap<u32, Ipv6Addr>,
    next: u32,
    free: Vec<u32>,
}

/// The IPv6 neighbour cache (see the module docs).
pub struct NeighTable6 {
    table: NeighTable,
    ids: ArcSwap<HashMap<Ipv6Addr, u32>>,
    writer: Mutex<Ids>,
    cap: usize,
}

impl fmt::Debug for NeighTable6 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NeighTable6")
            .field("table", &self.table)
            .finish()
    }
}

fn stand_in(id: u32) -> Ipv4Addr {
    Ipv4Addr::from(ID_BASE + id)
}

fn id_of(a: Ipv4Addr) -> u32 {
    u32::from(a).wrapping_sub(ID_BASE)
}

/// True for an address that can be a neighbour (not unspecified, multicast or loopback).
fn is_neighbour_addr(ip: Ipv6Addr) -> bool {
    !(ip.is_unspecified() || ip.is_multicast() || ip.is_loopback())
}

impl NeighTable6 {
    /// A table with `cfg` (see [`NeighTable::new`]).
    ///
    /// # Panics
    /// If `cfg` does not pass [`NeighConfig::validate`].
    pub fn new(cfg: NeighConfig) -> NeighTable6 {
        let cap = (cfg.gc_thresh3 * 4).min(MAX_IDS);
        NeighTable6 {
            table: NeighTable::new(cfg),
            ids: ArcSwap::from_pointee(HashMap::new()),
            writer: Mutex::new(Ids::default()),
            cap,
        }
    }

    /// The table underneath (counters, configuration).
    pub fn inner(&self) -> &NeighTable {
        &self.table
    }

    #[inline]
    fn id(&self, ip: Ipv6Addr) -> Option<u32> {
        self.ids.load().get(&ip).copied()
    }

    /// The id of `ip`, interned if new; `None` when the id space is full even after
    /// reclaiming ids not in the table.
    #[cold]
    fn intern(&self, ip: Ipv6Addr, now: Instant) -> Option<u32> {
        let mut w = self.writer.lock();
        if let Some(id) = self.id(ip) {
            return Some(id);
        }
        let mut map = HashMap::clone(&self.ids.load());
        if map.len() >= self.cap {
            // Reclaim the ids the table no longer holds.
            let live: hashbrown::HashSet<u32> = self
                .table
                .dump(now)
                .into_iter()
                .map(|e| id_of(e.ip))
                .collect();
            let Ids { rev, free, .. } = &mut *w;
            map.retain(|_, id| {
                let keep = live.contains(id);
                if !keep {
                    rev.remove(id);
                    free.push(*id);
                }
                keep
            });
        }
        let id = match w.free.pop() {
            Some(id) => id,
            None if (w.next as usize) < self.cap => {
                w.next += 1;
                w.next - 1
            }
            None => return None,
        };
        map.insert(ip, id);
        w.rev.insert(id, ip);
        self.ids.store(Arc::new(map));
        Some(id)
    }

    fn addr(&self, id: u32) -> Option<Ipv6Addr> {
        self.writer.lock().rev.get(&id).copied()
    }

    /// The MAC to send to `ip` on `iface`, if its entry is usable. Lock-free (see
    /// [`NeighTable::lookup`]).
    #[inline]
    pub fn lookup(&self, iface: IfaceId, ip: Ipv6Addr, now: Instant) -> Option<MacAddr> {
        let id = self.id(ip)?;
        self.table.lookup(iface, stand_in(id), now)
    }

    /// The state and MAC of the entry for `ip`, without marking it used.
    pub fn peek(&self, iface: IfaceId, ip: Ipv6Addr) -> Option<(NeighState, MacAddr)> {
        let id = self.id(ip)?;
        let (_, w) = self.table.find_live(key_of(iface, stand_in(id)))?;
        Some((decode(w)?, MacAddr::from_u64(w)))
    }

    /// Queues a copy of `frame` for `ip` (see [`NeighTable::enqueue`]).
    pub fn enqueue(&self, iface: IfaceId, ip: Ipv6Addr, frame: &[u8], now: Instant) -> Enqueue {
        if !is_neighbour_addr(ip) {
            return Enqueue::Refused(Refusal::BadAddress);
        }
        let Some(id) = self.id(ip).or_else(|| self.intern(ip, now)) else {
            return Enqueue::Refused(Refusal::TableFull);
        };
        self.table.enqueue(iface, stand_in(id), frame, now)
    }

    fn released(&self, r: super::Released) -> Released6 {
        Released6 {
            iface: r.iface,
            ip: self.addr(id_of(r.ip)).unwrap_or(Ipv6Addr::UNSPECIFIED),
            mac: r.mac,
            frame: r.frame,
        }
    }

    /// Learns from a Neighbor (or Router) Solicitation from `ip` with source link-layer
    /// address `mac` received on `iface` (`for_us`: the target is one of our addresses):
    /// creates a `STALE` entry or updates one as Linux's `ndisc_recv_ns`.
    pub fn input_solicit(
        &self,
        iface: IfaceId,
        ip: Ipv6Addr,
        mac: MacAddr,
        for_us: bool,
        now: Instant,
        release: &mut dyn FnMut(Released6),
    ) -> Learned {
        if !is_neighbour_addr(ip) || !mac.is_station() {
            return Learned::Ignored;
        }
        let id = match self.id(ip) {
            Some(id) => id,
            None if for_us => match self.intern(ip, now) {
                Some(id) => id,
                None => return Learned::TableFull,
            },
            None => return Learned::Ignored,
        };
        // A request for one of ours from this sender: ARP's rule is the same.
        let target = if for_us {
            Ipv4Addr::BROADCAST
        } else {
            stand_in(id)
        };
        let heard = ArpHeard {
            op: ArpOp::REQUEST,
            sender_ip: stand_in(id),
            sender_mac: mac,
            target_ip: target,
            target_is_local: for_us,
        };
        self.table
            .input(iface, heard, now, &mut |r| release(self.released(r)))
    }

    /// Learns from a Neighbor Advertisement for `advert.ip` with target link-layer address
    /// `advert.mac`, as
    /// Linux's `ndisc_recv_na`: never creates an entry; `solicited` confirms it (`REACHABLE`),
    /// an unsolicited one sets it `STALE` when the MAC changes; without `override_`, a
    /// different MAC than the entry's makes a `REACHABLE` entry `STALE` with its MAC kept (Linux's
    /// `NEIGH_UPDATE_F_WEAK_OVERRIDE`) and is ignored in any other state.
    ///
    /// `mac` is `None` for an advertisement without a Target Link-Layer Address option, which
    /// is what Linux answers a unicast probe with (RFC 4861 7.2.4, 7.2.5): it stands for the
    /// entry's own MAC, so a solicited one confirms a valid entry (`PROBE` → `REACHABLE`); it
    /// is ignored for an `INCOMPLETE` or `FAILED` entry, and an unsolicited one changes nothing.
    pub fn input_advert(
        &self,
        iface: IfaceId,
        advert: Advert,
        now: Instant,
        release: &mut dyn FnMut(Released6),
    ) -> Learned {
        let Advert {
            ip,
            mac,
            solicited,
            override_,
        } = advert;
        let mac = match mac {
            Some(m) => m,
            None => match self.peek(iface, ip) {
                Some((st, m)) if solicited && st.is_valid() => m,
                _ => return Learned::Ignored,
            },
        };
        if !is_neighbour_addr(ip) || !mac.is_station() {
            return Learned::Ignored;
        }
        let Some(id) = self.id(ip) else {
            return Learned::Ignored;
        };
        match self.peek(iface, ip) {
            None => return Learned::Ignored,
            // NEIGH_UPDATE_F_WEAK_OVERRIDE: a REACHABLE entry goes STALE with its MAC kept;
            // another valid state ignores the advertisement.
            Some((st, old)) if !override_ && old != mac && st.is_valid() => {
                return if self.table.weaken(iface, stand_in(id), now) {
                    Learned::Updated
                } else {
                    Learned::Locked
                };
            }
            Some(_) => {}
        }
        let (op, target) = if solicited {
            (ArpOp::REPLY, Ipv4Addr::BROADCAST)
        } else {
            (ArpOp::REQUEST, stand_in(id))
        };
        let heard = ArpHeard {
            op,
            sender_ip: stand_in(id),
            sender_mac: mac,
            target_ip: target,
            target_is_local: false,
        };
        self.table
            .input(iface, heard, now, &mut |r| release(self.released(r)))
    }

    /// Runs the timers due at `now` (see [`NeighTable::poll`]).
    pub fn poll(&self, now: Instant, out: &mut dyn FnMut(NeighEvent6)) {
        let mut ev = Vec::new();
        self.table.poll(now, &mut |e| ev.push(e));
        for e in ev {
            match e {
                super::NeighEvent::Solicit { iface, ip, unicast } => {
                    if let Some(ip) = self.addr(id_of(ip)) {
                        out(NeighEvent6::Solicit { iface, ip, unicast });
                    }
                }
                super::NeighEvent::Unreachable { iface, ip, frame } => {
                    let ip = self.addr(id_of(ip)).unwrap_or(Ipv6Addr::UNSPECIFIED);
                    out(NeighEvent6::Unreachable { iface, ip, frame });
                }
            }
        }
    }

    /// When [`NeighTable6::poll`] next has work.
    pub fn poll_at(&self) -> Option<Instant> {
        self.table.poll_at()
    }

    /// Adds or replaces a static (`PERMANENT`) entry; frames waiting for it are returned.
    pub fn add_static(
        &self,
        iface: IfaceId,
        ip: Ipv6Addr,
        mac: MacAddr,
        now: Instant,
    ) -> Result<Vec<Released6>, NeighError> {
        if !is_neighbour_addr(ip) {
            return Err(NeighError::BadAddress6(ip));
        }
        let id = self.intern(ip, now).ok_or(NeighError::TableFull)?;
        let r = self.table.add_static(iface, stand_in(id), mac, now)?;
        Ok(r.into_iter().map(|r| self.released(r)).collect())
    }

    /// Removes the entry for `ip` on `iface`; whether there was one.
    pub fn remove(&self, iface: IfaceId, ip: Ipv6Addr) -> bool {
        self.id(ip)
            .is_some_and(|id| self.table.remove(iface, stand_in(id)))
    }

    /// Every entry, sorted by interface then address. O(table size).
    pub fn dump(&self, now: Instant) -> Vec<NeighEntry6> {
        let rows = self.table.dump(now);
        let w = self.writer.lock();
        let mut v: Vec<NeighEntry6> = rows
            .into_iter()
            .filter_map(|e| {
                Some(NeighEntry6 {
                    iface: e.iface,
                    ip: *w.rev.get(&id_of(e.ip))?,
                    mac: e.mac,
                    state: e.state,
                    confirmed_ago: e.confirmed_ago,
                    updated_ago: e.updated_ago,
                    queued: e.queued,
                })
            })
            .collect();
        v.sort_by_key(|e| (e.iface, e.ip));
        v
    }

    /// Writes the table as `ip -6 neigh show` does.
    pub fn fmt_dump(
        &self,
        now: Instant,
        out: &mut impl fmt::Write,
        ifname: &dyn Fn(IfaceId) -> String,
    ) -> fmt::Result {
        for e in self.dump(now) {
            write!(out, "{} dev {}", e.ip, ifname(e.iface))?;
            if let Some(m) = e.mac {
                write!(out, " lladdr {m}")?;
            }
            writeln!(out, " {}", e.state.name())?;
        }
        Ok(())
    }
}
