//! The timers: one live timer per entry in a binary heap of `(due, slot, timer generation)`,
//! the forced-GC listing in a second heap, and the hand-over of readers' `STALE → DELAY`
//! marks to the writer. See "Timers" in the module docs of [`super`].
//!
//! Every function here runs with the table's writer lock held.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::Ordering;

use super::slots::{occupied, slot_key};
use super::state::NeighState;
use super::{NeighAddr, NeighEvent, NeighTable, Writer};

/// Heap items `(time, slot, generation)`, earliest first.
pub(super) type Heap = BinaryHeap<Reverse<(u64, u32, u32)>>;

/// Drops the items `live` rejects when the heap holds more than twice the entries (plus
/// slack), so stale items never outnumber live ones for long.
fn compact(heap: &mut Heap, entries: usize, live: impl Fn(usize, u32) -> bool) {
    if heap.len() > 2 * entries + 64 {
        heap.retain(|Reverse((_, i, g))| live(*i as usize, *g));
    }
}

impl<A: NeighAddr> NeighTable<A> {
    /// Arms the timer of the entry in `idx` for `due`, for its state `state` (replacing any
    /// earlier one).
    pub(super) fn arm(&self, w: &mut Writer, idx: usize, due: u64, state: NeighState) {
        let m = &mut w.meta[idx];
        m.tgen = m.tgen.wrapping_add(1);
        m.armed = Some(state);
        w.timers.push(Reverse((due, slot_key(idx), m.tgen)));
        let meta = &w.meta;
        compact(&mut w.timers, w.entries, |i, g| {
            meta.get(i).is_some_and(|m| m.tgen == g)
        });
    }

    /// Cancels the timer of the entry in `idx`.
    pub(super) fn disarm(&self, w: &mut Writer, idx: usize) {
        let m = &mut w.meta[idx];
        m.tgen = m.tgen.wrapping_add(1);
        m.armed = None;
    }

    /// Lists the entry in `idx` for forced GC from `at` on (replacing its previous listing).
    pub(super) fn push_gc(&self, w: &mut Writer, idx: usize, at: u64) {
        let m = &mut w.meta[idx];
        m.gc_seq = m.gc_seq.wrapping_add(1);
        w.gc_heap.push(Reverse((at, slot_key(idx), m.gc_seq)));
        let meta = &w.meta;
        compact(&mut w.gc_heap, w.entries, |i, q| {
            meta[i].gc_seq == q && occupied(self.slot_key(i))
        });
    }

    /// The periodic-GC timer and the forced-GC listing of an entry that became `STALE` at `now`.
    pub(super) fn stale_timers(&self, w: &mut Writer, idx: usize, now: u64) {
        let due = now.saturating_add(self.t.gc_stale);
        self.arm(w, idx, due, NeighState::Stale);
        self.push_gc(w, idx, due);
    }

    /// Arms the `DELAY` timer of an entry a reader marked.
    pub(super) fn on_marked(&self, w: &mut Writer, idx: usize) {
        if self.slot_state(idx) != Some(NeighState::Delay)
            || w.meta[idx].armed == Some(NeighState::Delay)
        {
            return;
        }
        let used = self.last_used(idx);
        w.meta[idx].updated = used;
        self.arm(w, idx, used.saturating_add(self.t.delay), NeighState::Delay);
    }

    /// Registers the entries readers marked since the last call (scans the bitmap only when
    /// the flag says there is something).
    fn take_marks(&self, w: &mut Writer) {
        if !self.marked.0.swap(false, Ordering::Acquire) {
            return;
        }
        for (wi, m) in self.marks.iter().enumerate() {
            if m.load(Ordering::Relaxed) == 0 {
                continue;
            }
            let mut bits = m.swap(0, Ordering::Acquire);
            while bits != 0 {
                let b = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                self.on_marked(w, wi * 64 + b);
            }
        }
    }

    /// Takes the readers' marks, then fires every live timer due at `now`.
    pub(super) fn run_due(&self, w: &mut Writer, now: u64, ev: &mut Vec<NeighEvent>) {
        self.take_marks(w);
        while let Some(&Reverse((due, idx, tgen))) = w.timers.peek() {
            if due > now {
                break;
            }
            w.timers.pop();
            let idx = idx as usize;
            if w.meta.get(idx).is_some_and(|m| m.tgen == tgen) {
                self.fire(w, idx, now, ev);
            }
        }
    }

    /// The earliest live timer, popping stale items on the way.
    pub(super) fn next_due(&self, w: &mut Writer) -> Option<u64> {
        while let Some(&Reverse((due, idx, tgen))) = w.timers.peek() {
            if w.meta.get(idx as usize).is_some_and(|m| m.tgen == tgen) {
                return Some(due);
            }
            w.timers.pop();
        }
        None
    }
}
