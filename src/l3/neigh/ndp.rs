//! The IPv6 neighbour cache (NDP): [`NeighTable<Ipv6Addr>`], the same table, state machine,
//! limits, timers and queues as ARP's, configured by the same [`NeighConfig`], keyed by a
//! 24-bit id per IPv6 address.
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
//! creates or updates a `STALE` entry ([`NeighTable::input_solicit`]); a solicited NA
//! confirms (`REACHABLE`), an unsolicited one updates an existing entry to `STALE` and
//! never creates one; an NA without the override flag does not change a known MAC
//! ([`NeighTable::input_advert`]).

use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use arc_swap::ArcSwap;
use hashbrown::HashMap;
use parking_lot::Mutex;

use super::{ArpHeard, ArpOp, Learned, NeighAddr, NeighConfig, NeighTable, Released};
use crate::base::IfaceId;
use crate::time::Instant;
use crate::wire::mac::MacAddr;

/// The first stand-in address: ids are carried as `1.0.0.0 + id`, never an address the
/// table refuses (unspecified, broadcast, multicast).
const ID_BASE: u32 = 0x0100_0000;
/// Ids available (24 bits).
const MAX_IDS: usize = 1 << 24;

/// What [`NeighTable::input_advert`] learns from in a Neighbor Advertisement.
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

/// The ids of the IPv6 addresses in a table (see the module docs).
pub struct Interner {
    ids: ArcSwap<HashMap<Ipv6Addr, u32>>,
    writer: Mutex<Ids>,
    cap: usize,
}

impl std::fmt::Debug for Interner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Interner")
            .field("ids", &self.ids.load().len())
            .field("cap", &self.cap)
            .finish()
    }
}

fn stand_in(id: u32) -> Ipv4Addr {
    Ipv4Addr::from(ID_BASE + id)
}

fn id_of(a: Ipv4Addr) -> u32 {
    u32::from(a).wrapping_sub(ID_BASE)
}

impl Interner {
    /// The id of `ip`, interned if new; `None` when the id space is full even after
    /// reclaiming ids not in the table `t`.
    #[cold]
    fn intern(&self, t: &NeighTable<Ipv6Addr>, ip: Ipv6Addr, now: Instant) -> Option<u32> {
        let mut w = self.writer.lock();
        if let Some(id) = self.ids.load().get(&ip).copied() {
            return Some(id);
        }
        let mut map = HashMap::clone(&self.ids.load());
        if map.len() >= self.cap {
            // Reclaim the ids the table no longer holds.
            let live: hashbrown::HashSet<u32> =
                t.dump_slots(now).into_iter().map(|e| id_of(e.ip)).collect();
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
}

impl NeighAddr for Ipv6Addr {
    const GONE: Ipv6Addr = Ipv6Addr::UNSPECIFIED;
    type Ids = Interner;

    fn ids(cfg: &NeighConfig) -> Interner {
        Interner {
            ids: ArcSwap::from_pointee(HashMap::new()),
            writer: Mutex::new(Ids::default()),
            cap: (cfg.gc_thresh3 * 4).min(MAX_IDS),
        }
    }

    #[inline]
    fn is_neighbour(self) -> bool {
        !(self.is_unspecified() || self.is_multicast() || self.is_loopback())
    }

    #[inline]
    fn slot_addr(t: &NeighTable<Ipv6Addr>, ip: Ipv6Addr) -> Option<Ipv4Addr> {
        t.ids.ids.load().get(&ip).copied().map(stand_in)
    }

    fn intern(t: &NeighTable<Ipv6Addr>, ip: Ipv6Addr, now: Instant) -> Option<Ipv4Addr> {
        Self::slot_addr(t, ip).or_else(|| t.ids.intern(t, ip, now).map(stand_in))
    }

    fn addr(t: &NeighTable<Ipv6Addr>, slot: Ipv4Addr) -> Option<Ipv6Addr> {
        t.ids.writer.lock().rev.get(&id_of(slot)).copied()
    }
}

impl NeighTable<Ipv6Addr> {
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
        release: &mut dyn FnMut(Released<Ipv6Addr>),
    ) -> Learned {
        if !ip.is_neighbour() || !mac.is_station() {
            return Learned::Ignored;
        }
        let slot = match Ipv6Addr::slot_addr(self, ip) {
            Some(slot) => slot,
            None if for_us => match Ipv6Addr::intern(self, ip, now) {
                Some(slot) => slot,
                None => return Learned::TableFull,
            },
            None => return Learned::Ignored,
        };
        // A request for one of ours from this sender: ARP's rule is the same.
        let target = if for_us { Ipv4Addr::BROADCAST } else { slot };
        let heard = ArpHeard {
            op: ArpOp::REQUEST,
            sender_ip: slot,
            sender_mac: mac,
            target_ip: target,
            target_is_local: for_us,
        };
        self.input_slot(iface, heard, now, &mut |r| release(self.released(r)))
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
        release: &mut dyn FnMut(Released<Ipv6Addr>),
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
        if !ip.is_neighbour() || !mac.is_station() {
            return Learned::Ignored;
        }
        let Some(slot) = Ipv6Addr::slot_addr(self, ip) else {
            return Learned::Ignored;
        };
        match self.peek(iface, ip) {
            None => return Learned::Ignored,
            // NEIGH_UPDATE_F_WEAK_OVERRIDE: a REACHABLE entry goes STALE with its MAC kept;
            // another valid state ignores the advertisement.
            Some((st, old)) if !override_ && old != mac && st.is_valid() => {
                return if self.weaken(iface, slot, now) {
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
            (ArpOp::REQUEST, slot)
        };
        let heard = ArpHeard {
            op,
            sender_ip: slot,
            sender_mac: mac,
            target_ip: target,
            target_is_local: false,
        };
        self.input_slot(iface, heard, now, &mut |r| release(self.released(r)))
    }
}
