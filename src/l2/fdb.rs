//! The forwarding database of one bridge: MAC address to port, learned from source addresses.
//!
//! # Design and thread-safety contract
//!
//! The table is a fixed array of 64-byte buckets of four slots, allocated once for the
//! configured limit (at most 50% load), so memory never grows after creation. Every MAC hashes
//! (with a per-table random seed, so an attacker cannot aim at one bucket) to two candidate
//! buckets. A slot is two atomics: `key = mac << 16 | port` (0 = empty) and `seen`, the last
//! time the station sent a frame (`u64::MAX` marks a static entry).
//!
//! * **Lookups** ([`Fdb::lookup`]) and **refreshes** of a known station on its known port
//!   ([`Fdb::learn`] in the common case) are lock-free: atomic loads, and a relaxed store of
//!   `seen` at most once per [`REFRESH_INTERVAL`] per station, so workers do not bounce cache lines.
//! * **Changes** (a new station, a station that moved, eviction, aging sweeps, static entries,
//!   flushes) take the table's writer mutex: one writer at a time, any number of readers.
//!   A writer stores `seen` before publishing `key` with release ordering, and readers load
//!   `key` with acquire ordering, so a reader that finds a key never sees an older `seen` than
//!   the writer's. A reader racing with a change sees either the old or the new entry; both are
//!   entries that were valid a moment ago. Slots are reused in place, so there is no memory to
//!   reclaim.
//!
//! # Limits and eviction rule
//!
//! At most `max_entries` entries exist (static ones included). A station that has not sent for
//! the aging time is treated as absent at once and its slot is reused; [`Fdb::sweep`] clears
//! such slots in bulk. To learn a new station when the table is at its limit, or when both
//! candidate buckets are full, the dynamic entry that has been silent longest among the eight
//! candidate slots is evicted (counted in [`FdbCounters::evicted`]): active stations refresh
//! their time and stay, a flood of one-off source addresses replaces itself. When the table is
//! at its limit and the candidates hold only empty slots, the longest-silent dynamic entry of
//! the next 16 buckets (round robin) is evicted instead, so a new station is still learned.
//! If nothing can be evicted (all those slots static), the station is not learned (counted in
//! [`FdbCounters::learn_failed`]) and frames to it are flooded.
//!
//! MACs are hashed with the crate's seeded two-choice hash (`crate::hash`: two folded
//! multiplies with per-table secrets; one alone is close to linear for addresses a few bits
//! apart, which gave some seeds badly correlated candidate buckets).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use crate::base::PortId;
use crate::hash::{self, SeededHash};
use crate::narrow::low16;
use crate::stats::counter_set;
use crate::time::Instant;
use crate::wire::mac::MacAddr;

/// A known station's time is refreshed at most this often (per station), to keep readers'
/// cache lines clean.
pub const REFRESH_INTERVAL: Duration = Duration::from_millis(250);
/// [`REFRESH_INTERVAL`] in microseconds, the unit of the stored times.
const REFRESH_INTERVAL_US: u64 =
    REFRESH_INTERVAL.as_secs() * 1_000_000 + REFRESH_INTERVAL.subsec_micros() as u64;

/// Default aging time, as Linux's `ageing_time` (300 s).
pub const DEFAULT_AGING: Duration = Duration::from_secs(300);

/// Default limit on entries per bridge.
pub const DEFAULT_MAX_ENTRIES: usize = 8192;

const STATIC: u64 = u64::MAX;
const SLOTS: usize = 4;

#[derive(Default)]
struct Slot {
    key: AtomicU64,
    seen: AtomicU64,
}

#[repr(align(64))]
#[derive(Default)]
struct Bucket {
    slots: [Slot; SLOTS],
}

/// What learning a source address did, for callers that count.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Learned {
    /// The station was known on this port (its time may have been refreshed).
    Known,
    /// A new entry was made.
    New,
    /// The station moved here from another port.
    Moved,
    /// The address belongs to a static entry on another port; nothing changed.
    StaticConflict,
    /// The table could not take the station (all candidate slots static).
    Failed,
}

counter_set! {
    /// Counters of table changes, read with [`Fdb::counters`].
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct FdbCounters {
        extra {
            /// Entries in the table now (static ones included; aged entries not yet swept included).
            pub entries: usize,
        }
        /// New stations learned.
        learned,
        /// Stations re-learned on another port.
        moved,
        /// Live entries evicted to make room.
        evicted,
        /// Entries removed because they aged out.
        aged,
        /// Stations that could not be learned.
        learn_failed,
    }
}

/// Where a MAC lives in a table: its key and two candidate buckets, computed once per frame by
/// [`Fdb::locate`] and reused for prefetching, learning and lookup.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Loc {
    mac: u64,
    /// The seeded hash: its low bits pick the first bucket, its high half the second.
    h: u64,
}

/// One row of [`Fdb::dump`], like a line of `bridge fdb show`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct FdbEntry {
    /// The station's address.
    pub mac: MacAddr,
    /// The port it is reached through.
    pub port: PortId,
    /// `None` for a static entry; otherwise the time since the station was last seen.
    pub age: Option<Duration>,
}

impl FdbEntry {
    /// True for an entry that learning cannot change and aging never removes.
    pub fn is_static(&self) -> bool {
        self.age.is_none()
    }
}

struct WriterState {
    entries: usize,
    counters: FdbCounters,
    /// Where the next search for a victim outside a new station's candidates starts.
    cursor: usize,
}

/// Buckets searched for a victim when the table is at its limit and a new station's eight
/// candidate slots hold nothing to evict (they are empty).
const VICTIM_SCAN: usize = 16;

/// A bounded, lock-free-for-lookups MAC learning table (see the module docs).
pub struct Fdb {
    buckets: Box<[Bucket]>,
    mask: usize,
    hash: SeededHash,
    max_entries: usize,
    aging_us: u64,
    writer: Mutex<WriterState>,
}

impl std::fmt::Debug for Fdb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fdb")
            .field("max_entries", &self.max_entries)
            .field("buckets", &self.buckets.len())
            .field("counters", &self.counters())
            .finish()
    }
}

/// A MAC as the table's 48-bit word: its six bytes little-endian, as one 8-byte load from a
/// frame gives them (see [`Fdb::locate_word`]).
#[inline]
pub(crate) fn word(mac: MacAddr) -> u64 {
    let b = mac.0;
    u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], 0, 0])
}

#[inline]
fn unword(w: u64) -> MacAddr {
    let b = w.to_le_bytes();
    MacAddr([b[0], b[1], b[2], b[3], b[4], b[5]])
}

/// A known station's time, stored at most once per [`REFRESH_INTERVAL`] (never for a static
/// entry), so workers do not bounce the line.
#[inline]
fn refresh(s: &Slot, seen: u64, now_us: u64) {
    if seen != STATIC && now_us.saturating_sub(seen) >= REFRESH_INTERVAL_US {
        s.seen.store(now_us, Ordering::Relaxed);
    }
}

#[inline]
fn key_of(mac: u64, port: PortId) -> u64 {
    (mac << 16) | u64::from(port.0)
}

impl Fdb {
    /// A table for at most `max_entries` stations (at least 1) that forgets a station after
    /// `aging` of silence.
    pub fn new(max_entries: usize, aging: Duration) -> Fdb {
        let max_entries = max_entries.max(1);
        let nbuckets = (max_entries * 2).div_ceil(SLOTS).next_power_of_two().max(2);
        let buckets = (0..nbuckets).map(|_| Bucket::default()).collect();
        Fdb {
            buckets,
            mask: nbuckets - 1,
            hash: SeededHash::random(),
            max_entries,
            aging_us: u64::try_from(aging.as_micros()).unwrap_or(u64::MAX).max(1),
            writer: Mutex::new(WriterState {
                entries: 0,
                counters: FdbCounters::default(),
                cursor: 0,
            }),
        }
    }

    /// The configured limit.
    pub fn max_entries(&self) -> usize {
        self.max_entries
    }

    /// The configured aging time.
    pub fn aging(&self) -> Duration {
        Duration::from_micros(self.aging_us)
    }

    #[inline]
    fn candidates(&self, mac: u64) -> (usize, usize) {
        let l = self.locate_u64(mac);
        (self.b1(&l), self.b2(&l))
    }

    #[inline]
    fn locate_u64(&self, mac: u64) -> Loc {
        Loc {
            mac,
            h: self.hash.hash(mac),
        }
    }

    /// The first candidate bucket of a located MAC.
    #[inline]
    fn b1(&self, l: &Loc) -> usize {
        hash::first(l.h, self.mask)
    }

    /// The second candidate bucket (never the first), needed only when the first misses.
    #[inline]
    fn b2(&self, l: &Loc) -> usize {
        hash::second(l.h, self.mask)
    }

    /// Hashes `mac` once, for [`Fdb::prefetch_loc`], [`Fdb::lookup_loc`] and [`Fdb::learn_loc`].
    #[inline]
    pub fn locate(&self, mac: MacAddr) -> Loc {
        self.locate_u64(word(mac))
    }

    /// [`Fdb::locate`] for a MAC already read as a word (six bytes little-endian, the top
    /// two bytes zero), as the datapath reads it from a frame header.
    #[inline]
    pub(crate) fn locate_word(&self, w: u64) -> Loc {
        self.locate_u64(w)
    }

    #[inline]
    fn live(&self, seen: u64, now: u64) -> bool {
        seen == STATIC || now.saturating_sub(seen) < self.aging_us
    }

    #[inline]
    fn find(&self, mac: u64) -> Option<(&Slot, u64)> {
        self.find_loc(&self.locate_u64(mac))
    }

    #[inline]
    fn find_loc(&self, l: &Loc) -> Option<(&Slot, u64)> {
        // An empty slot's key is 0, and no entry has the all-zero MAC.
        if l.mac == 0 {
            return None;
        }
        // `mask` bounds both indices; `get` keeps this free of panics all the same.
        self.find_in(self.b1(l), l.mac)
            .or_else(|| self.find_in(self.b2(l), l.mac))
    }

    #[inline]
    fn find_in(&self, b: usize, mac: u64) -> Option<(&Slot, u64)> {
        for s in &self.buckets.get(b)?.slots {
            let k = s.key.load(Ordering::Acquire);
            if k >> 16 == mac {
                return Some((s, k));
            }
        }
        None
    }

    /// Hints the CPU to fetch the first candidate bucket of a located MAC.
    #[inline]
    pub fn prefetch_loc(&self, l: &Loc) {
        if let Some(b) = self.buckets.get(self.b1(l)) {
            crate::sys::prefetch(b);
        }
    }

    /// Hints the CPU to fetch the first candidate bucket of `mac` (used before a batch's lookups).
    #[inline]
    pub fn prefetch(&self, mac: MacAddr) {
        let (b1, _) = self.candidates(word(mac));
        crate::sys::prefetch(&self.buckets[b1]);
    }

    /// The port that `mac` was last seen on, if it was seen within the aging time (or is static).
    #[inline]
    pub fn lookup(&self, mac: MacAddr, now: Instant) -> Option<PortId> {
        self.lookup_loc(&self.locate(mac), now)
    }

    /// [`Fdb::lookup`] for a MAC already located with [`Fdb::locate`] (by this table).
    #[inline]
    pub fn lookup_loc(&self, l: &Loc, now: Instant) -> Option<PortId> {
        let (s, k) = self.find_loc(l)?;
        let seen = s.seen.load(Ordering::Relaxed);
        if self.live(seen, now.micros()) {
            Some(PortId(low16(k)))
        } else {
            None
        }
    }

    /// Records that `mac` sent a frame on `port` at `now`. The caller has checked that `mac` is
    /// a station address (not group, not zero).
    #[inline]
    pub fn learn(&self, mac: MacAddr, port: PortId, now: Instant) -> Learned {
        self.learn_loc(&self.locate(mac), port, now)
    }

    /// [`Fdb::learn`] for a MAC already located with [`Fdb::locate`] (by this table).
    #[inline]
    pub fn learn_loc(&self, l: &Loc, port: PortId, now: Instant) -> Learned {
        let m = l.mac;
        let now_us = now.micros();
        // The common case first: the station is known on this port, in its first bucket.
        let key = key_of(m, port);
        if let (Some(bucket), true) = (self.buckets.get(self.b1(l)), m != 0) {
            for s in &bucket.slots {
                if s.key.load(Ordering::Acquire) == key {
                    refresh(s, s.seen.load(Ordering::Relaxed), now_us);
                    return Learned::Known;
                }
            }
        }
        self.learn_other(l, port, now_us)
    }

    /// [`Fdb::learn_loc`] past its common case: the station is in its second bucket, on
    /// another port, static, or new.
    #[inline(never)]
    fn learn_other(&self, l: &Loc, port: PortId, now_us: u64) -> Learned {
        let m = l.mac;
        if let Some((s, k)) = self.find_loc(l) {
            let seen = s.seen.load(Ordering::Relaxed);
            if k == key_of(m, port) {
                refresh(s, seen, now_us);
                return Learned::Known;
            }
            if seen == STATIC {
                return Learned::StaticConflict;
            }
        }
        self.learn_slow(m, port, now_us)
    }

    #[cold]
    fn learn_slow(&self, m: u64, port: PortId, now: u64) -> Learned {
        let mut w = self.writer.lock();
        let key = key_of(m, port);
        // Re-check under the lock: another writer may have changed things.
        if let Some((s, k)) = self.find(m) {
            let seen = s.seen.load(Ordering::Relaxed);
            if seen == STATIC {
                return if k == key {
                    Learned::Known
                } else {
                    Learned::StaticConflict
                };
            }
            let was_live = self.live(seen, now);
            s.seen.store(now, Ordering::Relaxed);
            s.key.store(key, Ordering::Release);
            if k == key {
                return Learned::Known;
            }
            if was_live {
                w.counters.moved += 1;
                return Learned::Moved;
            }
            w.counters.learned += 1;
            return Learned::New;
        }
        match self.place(&mut w, m, now) {
            Some(s) => {
                s.seen.store(now, Ordering::Relaxed);
                s.key.store(key, Ordering::Release);
                w.counters.learned += 1;
                Learned::New
            }
            None => {
                w.counters.learn_failed += 1;
                Learned::Failed
            }
        }
    }

    /// Chooses a slot for a new entry (writer lock held): an empty slot while below the limit,
    /// else an aged one, else the longest-silent dynamic entry, evicted (static entries never are).
    fn place(&self, w: &mut WriterState, m: u64, now: u64) -> Option<&Slot> {
        let (b1, b2) = self.candidates(m);
        let mut empty: Option<&Slot> = None;
        let mut aged: Option<&Slot> = None;
        let mut oldest: Option<(&Slot, u64)> = None;
        for b in [b1, b2] {
            for s in &self.buckets[b].slots {
                let k = s.key.load(Ordering::Relaxed);
                if k == 0 {
                    empty = empty.or(Some(s));
                    continue;
                }
                let seen = s.seen.load(Ordering::Relaxed);
                if seen == STATIC {
                    continue;
                }
                if !self.live(seen, now) {
                    aged = aged.or(Some(s));
                } else if oldest.is_none_or(|(_, t)| seen < t) {
                    oldest = Some((s, seen));
                }
            }
        }
        if let Some(s) = aged {
            w.counters.aged += 1;
            return Some(s);
        }
        if w.entries < self.max_entries {
            if let Some(s) = empty {
                w.entries += 1;
                w.counters.entries = w.entries;
                return Some(s);
            }
        }
        if let Some((s, _)) = oldest {
            w.counters.evicted += 1;
            return Some(s);
        }
        // At the limit with empty candidates only: free the longest-silent dynamic entry of
        // the next few buckets (round robin), so a new station still takes a slot.
        let empty = empty?;
        let mut victim: Option<(&Slot, u64)> = None;
        for k in 0..VICTIM_SCAN {
            let b = (w.cursor + k) & self.mask;
            for s in &self.buckets[b].slots {
                let seen = s.seen.load(Ordering::Relaxed);
                if s.key.load(Ordering::Relaxed) != 0
                    && seen != STATIC
                    && victim.is_none_or(|(_, t)| seen < t)
                {
                    victim = Some((s, seen));
                }
            }
        }
        w.cursor = (w.cursor + VICTIM_SCAN) & self.mask;
        let (v, seen) = victim?;
        v.key.store(0, Ordering::Release);
        if self.live(seen, now) {
            w.counters.evicted += 1;
        } else {
            w.counters.aged += 1;
        }
        Some(empty)
    }

    /// Adds or replaces a static entry: `mac` is reached through `port`, whatever learning sees,
    /// until [`Fdb::remove`]. Fails with `false` when the table has no room for it (all eight
    /// candidate slots hold static entries).
    pub fn add_static(&self, mac: MacAddr, port: PortId) -> bool {
        let m = word(mac);
        if m == 0 {
            return false;
        }
        let mut w = self.writer.lock();
        let key = key_of(m, port);
        if let Some((s, _)) = self.find(m) {
            s.seen.store(STATIC, Ordering::Relaxed);
            s.key.store(key, Ordering::Release);
            return true;
        }
        match self.place(&mut w, m, 0) {
            Some(s) => {
                s.seen.store(STATIC, Ordering::Relaxed);
                s.key.store(key, Ordering::Release);
                true
            }
            None => false,
        }
    }

    /// Removes the entry for `mac`, static or learned. Returns whether there was one.
    pub fn remove(&self, mac: MacAddr) -> bool {
        let mut w = self.writer.lock();
        if let Some((s, _)) = self.find(word(mac)) {
            s.key.store(0, Ordering::Release);
            w.entries -= 1;
            w.counters.entries = w.entries;
            true
        } else {
            false
        }
    }

    /// Removes every learned (not static) entry that points at `port`, as Linux does when a
    /// port goes down or leaves the bridge. Returns how many were removed.
    pub fn flush_port(&self, port: PortId) -> usize {
        self.clear_where(|k, seen| low16(k) == port.0 && seen != STATIC)
    }

    /// Removes every entry that points at `port`, static ones included, as Linux does when a
    /// port leaves the bridge or its device goes away. Returns how many were removed.
    pub fn remove_port(&self, port: PortId) -> usize {
        self.clear_where(|k, _| crate::narrow::low16(k) == port.0)
    }

    /// Clears entries that have aged out at `now`. Lookups already ignore them; this frees
    /// their slots. Returns how many were cleared. O(table size), run from a timer.
    pub fn sweep(&self, now: Instant) -> usize {
        let now = now.micros();
        let n = self.clear_where(|_, seen| !self.live(seen, now));
        self.writer.lock().counters.aged += n as u64;
        n
    }

    fn clear_where(&self, pred: impl Fn(u64, u64) -> bool) -> usize {
        let mut w = self.writer.lock();
        let mut n = 0;
        for b in self.buckets.iter() {
            for s in &b.slots {
                let k = s.key.load(Ordering::Relaxed);
                if k != 0 && pred(k, s.seen.load(Ordering::Relaxed)) {
                    s.key.store(0, Ordering::Release);
                    n += 1;
                }
            }
        }
        w.entries -= n;
        w.counters.entries = w.entries;
        n
    }

    /// Every live entry at `now`, sorted by port then MAC.
    pub fn dump(&self, now: Instant) -> Vec<FdbEntry> {
        let now_us = now.micros();
        let mut v = Vec::new();
        for b in self.buckets.iter() {
            for s in &b.slots {
                let k = s.key.load(Ordering::Acquire);
                if k == 0 {
                    continue;
                }
                let seen = s.seen.load(Ordering::Relaxed);
                if !self.live(seen, now_us) {
                    continue;
                }
                v.push(FdbEntry {
                    mac: unword(k >> 16),
                    port: PortId(low16(k)),
                    age: (seen != STATIC)
                        .then(|| Duration::from_micros(now_us.saturating_sub(seen))),
                });
            }
        }
        v.sort_by_key(|e| (e.port, e.mac));
        v
    }

    /// Change counters and the current number of entries.
    pub fn counters(&self) -> FdbCounters {
        self.writer.lock().counters
    }

    /// Bytes of memory the table holds (fixed at creation).
    pub fn memory_bytes(&self) -> usize {
        self.buckets.len() * std::mem::size_of::<Bucket>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    fn mac(i: u32) -> MacAddr {
        MacAddr::local(i)
    }
    fn t(s: u64) -> Instant {
        Instant::from_secs(s)
    }

    #[test]
    fn learns_moves_and_ages() {
        let f = Fdb::new(16, Duration::from_secs(300));
        assert_eq!(f.lookup(mac(1), t(0)), None);
        assert_eq!(f.learn(mac(1), PortId(3), t(0)), Learned::New);
        assert_eq!(f.lookup(mac(1), t(1)), Some(PortId(3)));
        assert_eq!(f.learn(mac(1), PortId(3), t(1)), Learned::Known);
        assert_eq!(f.learn(mac(1), PortId(4), t(2)), Learned::Moved);
        assert_eq!(f.lookup(mac(1), t(2)), Some(PortId(4)));
        assert_eq!(f.lookup(mac(1), t(301)), Some(PortId(4)));
        assert_eq!(
            f.lookup(mac(1), t(302)),
            None,
            "aged out after 300 s of silence"
        );
        assert_eq!(f.sweep(t(302)), 1);
        assert_eq!(f.counters().entries, 0);
    }

    #[test]
    fn static_entries_win_over_learning_and_never_age() {
        let f = Fdb::new(16, Duration::from_secs(10));
        assert!(f.add_static(mac(9), PortId(1)));
        assert_eq!(f.learn(mac(9), PortId(2), t(1)), Learned::StaticConflict);
        assert_eq!(f.lookup(mac(9), t(1_000_000)), Some(PortId(1)));
        assert_eq!(f.sweep(t(1_000_000)), 0);
        let d = f.dump(t(5));
        assert_eq!(d.len(), 1);
        assert!(d[0].is_static());
        assert!(f.remove(mac(9)));
        assert_eq!(f.lookup(mac(9), t(5)), None);
    }

    #[test]
    fn never_grows_past_its_bound_and_prefers_active_stations() {
        let f = Fdb::new(100, Duration::from_secs(300));
        // One active station, then a flood of one-off sources.
        f.learn(mac(0), PortId(0), t(0));
        for i in 1..10_000u32 {
            let now = Instant::from_millis(u64::from(i));
            f.learn(mac(i), PortId(1), now);
            // The active station keeps talking.
            f.learn(mac(0), PortId(0), now);
            assert!(f.counters().entries <= 100);
        }
        let c = f.counters();
        assert_eq!(c.entries, 100);
        // Every new station was learned, by evicting a silent one.
        assert_eq!(c.learn_failed, 0, "{c:?}");
        assert!(c.evicted + c.aged >= 9_899, "{c:?}");
        assert_eq!(f.lookup(mac(0), Instant::from_secs(10)), Some(PortId(0)));
        assert!(f.dump(Instant::from_secs(10)).len() <= 100);
    }

    #[test]
    fn flush_port_keeps_static_entries() {
        let f = Fdb::new(16, DEFAULT_AGING);
        f.learn(mac(1), PortId(1), t(0));
        f.learn(mac(2), PortId(1), t(0));
        f.learn(mac(3), PortId(2), t(0));
        f.add_static(mac(4), PortId(1));
        assert_eq!(f.flush_port(PortId(1)), 2);
        assert_eq!(f.lookup(mac(4), t(0)), Some(PortId(1)));
        assert_eq!(f.lookup(mac(3), t(0)), Some(PortId(2)));
        assert_eq!(f.counters().entries, 2);
        // A port that goes away takes its static entries too.
        assert_eq!(f.remove_port(PortId(1)), 1);
        assert_eq!(f.lookup(mac(4), t(0)), None);
        assert_eq!(f.counters().entries, 1);
    }

    #[test]
    fn concurrent_readers_and_learners() {
        let f = std::sync::Arc::new(Fdb::new(1024, DEFAULT_AGING));
        let threads: Vec<_> = (0..4u16)
            .map(|w| {
                let f = f.clone();
                std::thread::spawn(move || {
                    for round in 0..200u64 {
                        for i in 0..512u32 {
                            let m = mac(i);
                            f.learn(m, PortId(w), Instant::from_millis(round));
                            if let Some(p) = f.lookup(m, Instant::from_millis(round)) {
                                assert!(p.0 < 4);
                            }
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let d = f.dump(Instant::from_millis(200));
        assert_eq!(d.len(), 512);
        let mut macs: Vec<_> = d.iter().map(|e| e.mac).collect();
        macs.dedup();
        assert_eq!(macs.len(), 512, "no duplicate entries");
        assert_eq!(f.counters().entries, 512);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Learn(u8, u8),
        Lookup(u8),
        Tick(u16),
        Static(u8, u8),
        Remove(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u8..40, 0u8..4).prop_map(|(m, p)| Op::Learn(m, p)),
            4 => (0u8..40).prop_map(Op::Lookup),
            1 => (0u16..200).prop_map(Op::Tick),
            1 => (0u8..40, 0u8..4).prop_map(|(m, p)| Op::Static(m, p)),
            1 => (0u8..40).prop_map(Op::Remove),
        ]
    }

    proptest! {
        /// With room for every station, the table behaves exactly like a HashMap model with
        /// aging and static entries.
        #[test]
        fn matches_hashmap_model(ops in proptest::collection::vec(op(), 1..300)) {
            let aging = Duration::from_secs(60);
            let f = Fdb::new(64, aging);
            // model: mac -> (port, last seen secs or None for static)
            let mut model: HashMap<u8, (u16, Option<u64>)> = HashMap::new();
            let mut now = 0u64;
            for o in ops {
                let ti = Instant::from_secs(now);
                match o {
                    Op::Learn(m, p) => {
                        f.learn(mac(u32::from(m)), PortId(u16::from(p)), ti);
                        match model.get(&m) {
                            Some((_, None)) => {}
                            _ => { model.insert(m, (u16::from(p), Some(now))); }
                        }
                    }
                    Op::Lookup(m) => {
                        let want = model.get(&m).and_then(|(p, seen)| match seen {
                            None => Some(PortId(*p)),
                            Some(s) if now - s < 60 => Some(PortId(*p)),
                            _ => None,
                        });
                        prop_assert_eq!(f.lookup(mac(u32::from(m)), ti), want);
                    }
                    Op::Tick(s) => now += u64::from(s),
                    Op::Static(m, p) => {
                        prop_assert!(f.add_static(mac(u32::from(m)), PortId(u16::from(p))));
                        model.insert(m, (u16::from(p), None));
                    }
                    Op::Remove(m) => {
                        f.remove(mac(u32::from(m)));
                        model.remove(&m);
                    }
                }
                prop_assert!(f.counters().entries <= 64);
            }
        }
    }
}
