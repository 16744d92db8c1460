//! The lock-free storage: 64-byte buckets of four slots, each a key and a packed word, found
//! through the crate's seeded two-choice hash (`crate::hash`); the reader's consistent load,
//! the `STALE → DELAY` mark, and the writer's placement, publication, removal and garbage
//! collection of slots. See the module docs of [`super`] for the contract.
//!
//! Reader-side functions (`find_live`, `mark_used`) take no lock. Every function taking a
//! `Writer` runs with the table's writer lock held.

use std::cmp::Reverse;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU64, Ordering};

use super::state::{decode, encode, with_state, NeighState, GEN_SHIFT, WORD_GEN_MASK};
use super::{NeighAddr, NeighTable, Writer, NEVER};
use crate::base::IfaceId;
use crate::hash;
use crate::narrow::low32;

/// Slots per bucket.
pub(super) const SLOTS: usize = 4;
/// The key bits of a slot's key (`iface << 32 | ipv4`); the top 16 bits are the generation.
const KEY_MASK: u64 = (1 << 48) - 1;

/// Four slots in one cache line: keys `gen << 48 | iface << 32 | ipv4` (gen 0: empty), and
/// their packed words (see [`super::state::encode`]).
#[repr(align(64))]
#[derive(Default)]
pub(super) struct Bucket {
    keys: [AtomicU64; SLOTS],
    words: [AtomicU64; SLOTS],
}

/// A value alone on its cache line.
#[repr(align(64))]
#[derive(Default)]
pub(super) struct Padded<T>(pub(super) T);

/// The 48-bit key of a neighbour.
#[inline]
pub(super) fn key_of(iface: IfaceId, ip: Ipv4Addr) -> u64 {
    (u64::from(iface.0) << 32) | u64::from(u32::from(ip))
}

/// A slot index as the 32-bit number the frame queues and timer heaps key on.
#[inline(always)]
#[allow(
    clippy::cast_possible_truncation,
    reason = "slot indices are below the slot count, bounded by MAX_ENTRIES (2^20) times the \
              bucket size (checked by NeighConfig::validate)"
)]
pub(super) fn slot_key(idx: usize) -> u32 {
    idx as u32
}

/// The interface number and address of a slot key (its generation ignored).
#[inline]
pub(super) fn split_key(k: u64) -> (u16, Ipv4Addr) {
    (((k >> 32) & 0xffff) as u16, Ipv4Addr::from(low32(k)))
}

/// True for a slot key with an occupant.
#[inline]
pub(super) fn occupied(k: u64) -> bool {
    k >> 48 != 0
}

impl<A: NeighAddr> NeighTable<A> {
    #[inline]
    fn candidates(&self, key: u64) -> (usize, usize) {
        let h = self.hash.hash(key);
        (hash::first(h, self.mask), hash::second(h, self.mask))
    }

    #[inline]
    fn key_at(&self, idx: usize) -> &AtomicU64 {
        &self.buckets[idx / SLOTS].keys[idx % SLOTS]
    }

    #[inline]
    pub(super) fn word_at(&self, idx: usize) -> &AtomicU64 {
        &self.buckets[idx / SLOTS].words[idx % SLOTS]
    }

    /// Slots in the table (occupied or not).
    pub(super) fn slots(&self) -> usize {
        self.buckets.len() * SLOTS
    }

    /// Reader side: the slot and a word consistent with the key `want` (see the module docs).
    #[inline]
    pub(super) fn find_live(&self, want: u64) -> Option<(usize, u64)> {
        let (b1, b2) = self.candidates(want);
        for b in [b1, b2] {
            let bucket = self.buckets.get(b)?;
            for (i, key) in bucket.keys.iter().enumerate() {
                let k = key.load(Ordering::Acquire);
                if k & KEY_MASK != want || !occupied(k) {
                    continue;
                }
                let w = bucket.words[i].load(Ordering::Acquire);
                if w >> GEN_SHIFT != (k >> 48) & WORD_GEN_MASK || key.load(Ordering::Acquire) != k {
                    // The slot is being reused under us: the key is leaving.
                    return None;
                }
                return Some((b * SLOTS + i, w));
            }
        }
        None
    }

    /// Reader side: marks the `STALE` entry in `idx`, read as `w`, for `DELAY` (one CAS; only
    /// the winner records the use for the writer).
    #[cold]
    pub(super) fn mark_used(&self, idx: usize, w: u64, now: u64) {
        let Some(bucket) = self.buckets.get(idx / SLOTS) else {
            return;
        };
        let won = bucket.words[idx % SLOTS]
            .compare_exchange(
                w,
                with_state(w, NeighState::Delay),
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_ok();
        if won {
            self.note_used(idx, now);
            if let Some(m) = self.marks.get(idx / 64) {
                m.fetch_or(1 << (idx % 64), Ordering::Release);
            }
            self.marked.0.store(true, Ordering::Release);
        }
    }

    /// Records a use of the entry in `idx` at `now`.
    #[inline]
    pub(super) fn note_used(&self, idx: usize, now: u64) {
        if let Some(u) = self.used.get(idx) {
            u.store(now, Ordering::Relaxed);
        }
    }

    /// The last use recorded for the entry in `idx`.
    pub(super) fn last_used(&self, idx: usize) -> u64 {
        self.used[idx].load(Ordering::Relaxed)
    }

    /// Writer side: the slot holding `want`.
    pub(super) fn find_w(&self, want: u64) -> Option<usize> {
        let (b1, b2) = self.candidates(want);
        for b in [b1, b2] {
            for (i, key) in self.buckets[b].keys.iter().enumerate() {
                let k = key.load(Ordering::Relaxed);
                if occupied(k) && k & KEY_MASK == want {
                    return Some(b * SLOTS + i);
                }
            }
        }
        None
    }

    /// Writer side: the key of slot `idx` (0: empty).
    pub(super) fn slot_key(&self, idx: usize) -> u64 {
        self.key_at(idx).load(Ordering::Relaxed)
    }

    /// Writer side: the packed word of slot `idx`.
    pub(super) fn slot_word(&self, idx: usize) -> u64 {
        self.word_at(idx).load(Ordering::Acquire)
    }

    /// The state of the entry in slot `idx`; `None` for an empty slot.
    pub(super) fn slot_state(&self, idx: usize) -> Option<NeighState> {
        if occupied(self.slot_key(idx)) {
            decode(self.slot_word(idx))
        } else {
            None
        }
    }

    /// Empties a slot. Returns how many queued frames went with it.
    pub(super) fn free(&self, w: &mut Writer, idx: usize) -> usize {
        self.key_at(idx).store(0, Ordering::Release);
        self.word_at(idx).store(0, Ordering::Release);
        self.disarm(w, idx);
        let m = &mut w.meta[idx];
        m.gc_seq = m.gc_seq.wrapping_add(1);
        m.probes = 0;
        w.entries -= 1;
        w.take_queue(idx).map_or(0, |frames| frames.len())
    }

    /// Garbage-collects the entry in `idx` (counted).
    pub(super) fn collect(&self, w: &mut Writer, idx: usize) {
        self.free(w, idx);
        w.c.gc += 1;
    }

    /// When the `STALE` entry in `idx` stops being used, for GC purposes.
    pub(super) fn stale_since(&self, w: &Writer, idx: usize) -> u64 {
        w.meta[idx].updated.max(self.last_used(idx))
    }

    /// When the entry in `idx` becomes collectable: a `FAILED` entry at once (0), a `STALE`
    /// one `gc_stale_time` after its last use; `None` for the others.
    pub(super) fn collectable_at(&self, w: &Writer, idx: usize) -> Option<u64> {
        match self.slot_state(idx) {
            Some(NeighState::Failed) => Some(0),
            Some(NeighState::Stale) => {
                Some(self.stale_since(w, idx).saturating_add(self.t.gc_stale))
            }
            Some(
                NeighState::Incomplete
                | NeighState::Reachable
                | NeighState::Delay
                | NeighState::Probe
                | NeighState::Permanent,
            )
            | None => None,
        }
    }

    /// Collects `FAILED` and idle `STALE` entries, oldest first, until the table is below
    /// `gc_thresh2` or nothing more is collectable at `now`. Each heap item is looked at once
    /// (or re-listed once, for a `STALE` entry whose idle time moved), so the work is amortized
    /// over the state changes that listed them.
    fn forced_gc(&self, w: &mut Writer, now: u64) {
        while w.entries >= self.cfg.gc_thresh2 {
            let Some(&Reverse((at, i, seq))) = w.gc_heap.peek() else {
                break;
            };
            if at > now {
                break;
            }
            w.gc_heap.pop();
            let idx = i as usize;
            if w.meta[idx].gc_seq != seq {
                continue;
            }
            match self.collectable_at(w, idx) {
                Some(at) if at <= now => {}
                // Still used lately: listed again for when it is idle long enough.
                Some(at) => {
                    self.push_gc(w, idx, at);
                    continue;
                }
                // Used or resolving again: listed anew when it is STALE or FAILED again.
                None => continue,
            }
            self.collect(w, idx);
        }
    }

    /// A free slot for `want`: an empty one in the emptier candidate bucket, else a
    /// collectable entry among the candidates.
    fn place(&self, w: &mut Writer, want: u64, now: u64) -> Option<usize> {
        let (b1, b2) = self.candidates(want);
        let scan = |b: usize| {
            let mut used = 0;
            let mut empty = None;
            for (i, k) in self.buckets[b].keys.iter().enumerate() {
                if occupied(k.load(Ordering::Relaxed)) {
                    used += 1;
                } else if empty.is_none() {
                    empty = Some(b * SLOTS + i);
                }
            }
            (used, empty)
        };
        let (n1, e1) = scan(b1);
        let (n2, e2) = scan(b2);
        let pick = if n2 < n1 { e2.or(e1) } else { e1.or(e2) };
        if pick.is_some() {
            return pick;
        }
        for b in [b1, b2] {
            for i in 0..SLOTS {
                let idx = b * SLOTS + i;
                if self.collectable_at(w, idx).is_some_and(|at| at <= now) {
                    self.collect(w, idx);
                    return Some(idx);
                }
            }
        }
        None
    }

    /// Reserves a slot for a new entry, collecting garbage as needed; `None` (and counted as
    /// refused) when the table is full.
    pub(super) fn alloc(&self, w: &mut Writer, want: u64, now: u64) -> Option<usize> {
        if w.entries >= self.cfg.gc_thresh2 {
            self.forced_gc(w, now);
        }
        let idx = if w.entries < self.cfg.gc_thresh3 {
            self.place(w, want, now)
        } else {
            None
        };
        match idx {
            Some(idx) => {
                w.entries += 1;
                w.c.created += 1;
                Some(idx)
            }
            None => {
                w.c.refused += 1;
                None
            }
        }
    }

    /// Publishes a new occupant of a slot reserved by `alloc`: the word first, then the key
    /// with a new generation (release), so a reader that sees the key sees its word.
    pub(super) fn publish(
        &self,
        w: &mut Writer,
        idx: usize,
        want: u64,
        mac: u64,
        state: NeighState,
        now: u64,
    ) {
        let m = &mut w.meta[idx];
        m.gen = m.gen.wrapping_add(1).max(1);
        m.confirmed = NEVER;
        m.updated = now;
        m.probes = 0;
        m.gc_seq = m.gc_seq.wrapping_add(1);
        let gen = m.gen;
        self.note_used(idx, now);
        self.word_at(idx)
            .store(encode(mac, state, gen), Ordering::Release);
        self.key_at(idx)
            .store(want | (u64::from(gen) << 48), Ordering::Release);
    }
}
