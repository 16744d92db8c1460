//! The state machine: [`NeighState`], its encoding in a slot's packed word, and the
//! transitions of Linux's `neigh_update` (ARP input) and `neigh_timer_handler` (timers).
//!
//! The packed word is the only place a state is a number: [`decode`] turns the word's three
//! state bits into an `Option<NeighState>` (`None`: the slot is empty, as Linux's `NUD_NONE`)
//! and [`encode`] packs one back. Everything after the atomic load matches on the enum,
//! exhaustively. Every function taking a `Writer` runs with the table's writer lock held.

use crate::base::IfaceId;
use std::fmt;

use super::{split_key, Learned, NeighAddr, NeighEvent, NeighTable, Released, Writer, NEVER};
use crate::wire::mac::MacAddr;

const MAC_MASK: u64 = (1 << 48) - 1;
const STATE_SHIFT: u32 = 48;
const STATE_MASK: u64 = 7 << STATE_SHIFT;
/// Where the word's 13 generation bits start.
pub(super) const GEN_SHIFT: u32 = 51;
/// The generation bits a word keeps of its slot's 16-bit occupant generation.
pub(super) const WORD_GEN_MASK: u64 = (1 << 13) - 1;

/// The state of a neighbour entry, as Linux's `NUD_*` states.
///
/// The discriminants are the codes stored in a slot's packed word (0 is an empty slot).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize),
    serde(rename_all = "lowercase")
)]
pub enum NeighState {
    /// Resolution in progress: broadcast requests, frames queued.
    Incomplete = 1,
    /// Confirmed by an ARP reply within the reachable time.
    Reachable = 2,
    /// Reachable time passed; still used to send.
    Stale = 3,
    /// Used while stale; waiting a moment for a confirmation before probing.
    Delay = 4,
    /// Unicast requests to the known MAC.
    Probe = 5,
    /// Resolution failed.
    Failed = 6,
    /// A static entry.
    Permanent = 7,
}

/// The state of each 3-bit code: index 0 is an empty slot.
const DECODE: [Option<NeighState>; 8] = [
    None,
    Some(NeighState::Incomplete),
    Some(NeighState::Reachable),
    Some(NeighState::Stale),
    Some(NeighState::Delay),
    Some(NeighState::Probe),
    Some(NeighState::Failed),
    Some(NeighState::Permanent),
];

impl NeighState {
    /// The name `ip neigh show` prints.
    pub fn name(self) -> &'static str {
        match self {
            NeighState::Incomplete => "INCOMPLETE",
            NeighState::Reachable => "REACHABLE",
            NeighState::Stale => "STALE",
            NeighState::Delay => "DELAY",
            NeighState::Probe => "PROBE",
            NeighState::Failed => "FAILED",
            NeighState::Permanent => "PERMANENT",
        }
    }

    /// True when the entry's MAC may be used to send (Linux's `NUD_VALID`).
    pub fn is_valid(self) -> bool {
        match self {
            NeighState::Reachable
            | NeighState::Stale
            | NeighState::Delay
            | NeighState::Probe
            | NeighState::Permanent => true,
            NeighState::Incomplete | NeighState::Failed => false,
        }
    }
}

impl fmt::Display for NeighState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The state in a packed slot word; `None` for an empty slot.
#[inline]
pub(super) fn decode(word: u64) -> Option<NeighState> {
    DECODE[((word & STATE_MASK) >> STATE_SHIFT) as usize]
}

/// A packed slot word: `gen13 << 51 | state << 48 | mac` (an empty slot's word is 0).
#[inline]
pub(super) fn encode(mac: u64, state: NeighState, gen: u16) -> u64 {
    (mac & MAC_MASK)
        | (u64::from(state as u8) << STATE_SHIFT)
        | ((u64::from(gen) & WORD_GEN_MASK) << GEN_SHIFT)
}

/// `word` with its state replaced by `state` (MAC and generation kept).
#[inline]
pub(super) fn with_state(word: u64, state: NeighState) -> u64 {
    (word & !STATE_MASK) | (u64::from(state as u8) << STATE_SHIFT)
}

/// The MAC bits of a packed word.
#[inline]
pub(super) fn mac_of(word: u64) -> u64 {
    word & MAC_MASK
}

/// What the table heard from a neighbour ([`NeighTable::update`]): its MAC (as a word), and
/// whether it came in a reply (which confirms reachability) or a gratuitous ARP (which
/// overrides the lock time).
#[derive(Clone, Copy, Debug)]
pub(super) struct Heard {
    pub(super) mac: u64,
    pub(super) reply: bool,
    pub(super) garp: bool,
}

impl<A: NeighAddr> NeighTable<A> {
    /// Stores the word of slot `idx` for its current occupant.
    pub(super) fn set_word(&self, w: &Writer, idx: usize, mac: u64, state: NeighState) {
        self.word_at(idx).store(
            encode(mac, state, w.meta[idx].gen),
            std::sync::atomic::Ordering::Release,
        );
    }

    /// `STALE → DELAY` by the writer.
    pub(super) fn to_delay(&self, w: &mut Writer, idx: usize, mac: u64, now: u64) {
        self.set_word(w, idx, mac, NeighState::Delay);
        w.meta[idx].updated = now;
        self.note_used(idx, now);
        self.arm(w, idx, now.saturating_add(self.t.delay), NeighState::Delay);
    }

    pub(super) fn to_stale(&self, w: &mut Writer, idx: usize, mac: u64, now: u64) {
        self.set_word(w, idx, mac, NeighState::Stale);
        w.meta[idx].updated = now;
        self.stale_timers(w, idx, now);
    }

    pub(super) fn to_reachable(&self, w: &mut Writer, idx: usize, mac: u64, now: u64) {
        self.set_word(w, idx, mac, NeighState::Reachable);
        let m = &mut w.meta[idx];
        m.updated = now;
        let due = m.confirmed.saturating_add(m.reach);
        self.arm(w, idx, due, NeighState::Reachable);
    }

    /// (Re)starts resolution: the entry in `idx` is `INCOMPLETE` from `now`, with its first
    /// request asked for at once. Returns whether the rate limit let that request go.
    pub(super) fn to_incomplete(&self, w: &mut Writer, idx: usize, now: u64) -> bool {
        let solicit = self.solicit(w, idx, now);
        self.arm(
            w,
            idx,
            now.saturating_add(self.t.retrans),
            NeighState::Incomplete,
        );
        solicit
    }

    /// `INCOMPLETE` or `PROBE` ran out of solicitations.
    fn fail(&self, w: &mut Writer, idx: usize, now: u64, ev: &mut Vec<NeighEvent>) {
        let (iface, ip) = split_key(self.slot_key(idx));
        self.set_word(w, idx, 0, NeighState::Failed);
        let m = &mut w.meta[idx];
        m.updated = now;
        m.probes = 0;
        w.c.failed += 1;
        if let Some(frames) = w.take_queue(idx) {
            w.c.queue_failed += frames.len() as u64;
            ev.extend(frames.into_iter().map(|frame| NeighEvent::Unreachable {
                iface: IfaceId(iface),
                ip,
                frame,
            }));
        }
        self.push_gc(w, idx, now);
        self.arm(
            w,
            idx,
            now.saturating_add(self.t.gc_interval),
            NeighState::Failed,
        );
    }

    /// Runs the due timer of slot `idx`, armed for the state its entry had then.
    pub(super) fn fire(&self, w: &mut Writer, idx: usize, now: u64, ev: &mut Vec<NeighEvent>) {
        let k = self.slot_key(idx);
        if k >> 48 == 0 {
            return;
        }
        let word = self.slot_word(idx);
        let Some(st) = decode(word) else {
            return;
        };
        if Some(st) != w.meta[idx].armed {
            // A reader moved a STALE entry to DELAY after its timer was armed.
            self.on_marked(w, idx);
            return;
        }
        let mac = mac_of(word);
        match st {
            NeighState::Incomplete | NeighState::Probe => {
                let max = if st == NeighState::Incomplete {
                    self.cfg.mcast_solicit
                } else {
                    self.cfg.ucast_solicit
                };
                if w.meta[idx].probes >= max {
                    self.fail(w, idx, now, ev);
                    return;
                }
                if self.solicit(w, idx, now) {
                    let (iface, ip) = split_key(k);
                    let unicast = (st == NeighState::Probe).then(|| MacAddr::from_u64(mac));
                    ev.push(NeighEvent::Solicit {
                        iface: IfaceId(iface),
                        ip,
                        unicast,
                    });
                }
                self.arm(w, idx, now.saturating_add(self.t.retrans), st);
            }
            NeighState::Reachable => {
                let m = w.meta[idx];
                let until = m.confirmed.saturating_add(m.reach);
                if now < until {
                    self.arm(w, idx, until, NeighState::Reachable);
                } else {
                    self.to_stale(w, idx, mac, now);
                }
            }
            NeighState::Delay => {
                let confirmed = w.meta[idx].confirmed;
                if confirmed != NEVER && now <= confirmed.saturating_add(self.t.delay) {
                    self.to_reachable(w, idx, mac, now);
                    return;
                }
                self.set_word(w, idx, mac, NeighState::Probe);
                let m = &mut w.meta[idx];
                m.updated = now;
                m.probes = 0;
                m.armed = Some(NeighState::Probe);
                // The first probe goes out at once, as Linux's neigh_timer_handler.
                self.fire(w, idx, now, ev);
            }
            NeighState::Stale => {
                let due = self.stale_since(w, idx).saturating_add(self.t.gc_stale);
                if now < due {
                    self.arm(w, idx, due, NeighState::Stale);
                } else {
                    self.periodic_gc(w, idx, now, self.t.gc_stale, st);
                }
            }
            NeighState::Failed => self.periodic_gc(w, idx, now, self.t.gc_interval, st),
            // Static entries have no timer.
            NeighState::Permanent => {}
        }
    }

    /// Periodic GC of the `STALE` or `FAILED` entry in `idx`, due at `now`: collected while the
    /// table holds `gc_thresh1` entries or more; below that nothing is collected, and the
    /// entry is looked at again `again` later.
    fn periodic_gc(&self, w: &mut Writer, idx: usize, now: u64, again: u64, st: NeighState) {
        if w.entries >= self.cfg.gc_thresh1 {
            self.collect(w, idx);
        } else {
            self.arm(w, idx, now.saturating_add(again), st);
        }
    }

    /// Linux's `neigh_update` for an ARP from the neighbour in `idx`.
    pub(super) fn update(
        &self,
        w: &mut Writer,
        idx: usize,
        heard: Heard,
        now: u64,
        out: &mut Vec<Released>,
    ) -> Learned {
        let Heard { mac, reply, garp } = heard;
        let word = self.slot_word(idx);
        let Some(old) = decode(word) else {
            return Learned::Ignored;
        };
        if old == NeighState::Permanent {
            return Learned::Permanent;
        }
        let old_mac = mac_of(word);
        let old_valid = old.is_valid();
        let mac_changed = !old_valid || old_mac != mac;
        let overrides = garp || now > w.meta[idx].updated.saturating_add(self.t.locktime);
        if old_valid && mac_changed && !overrides {
            return Learned::Locked;
        }
        // Broadcast replies and requests do not confirm reachability (arp_process).
        let confirms = reply && !garp;
        let mut new = if confirms {
            NeighState::Reachable
        } else {
            NeighState::Stale
        };
        if confirms {
            let reach = self.draw_reach(w);
            let m = &mut w.meta[idx];
            m.confirmed = now;
            m.reach = reach;
        } else if mac_changed {
            w.meta[idx].confirmed = NEVER;
        }
        if old_valid && !mac_changed && new == NeighState::Stale {
            new = old;
        }
        if new == old && !mac_changed {
            return if confirms {
                Learned::Confirmed
            } else {
                Learned::Unchanged
            };
        }
        if new == old {
            // Same state, new MAC: the timer stays.
            self.set_word(w, idx, mac, new);
            w.meta[idx].updated = now;
        } else if new == NeighState::Reachable {
            self.to_reachable(w, idx, mac, now);
        } else {
            self.to_stale(w, idx, mac, now);
        }
        if !old_valid {
            let n = self.release(w, idx, MacAddr::from_u64(mac), out);
            if new == NeighState::Stale && n > 0 {
                // Sending the released frames uses the STALE entry.
                self.to_delay(w, idx, mac, now);
            }
        }
        Learned::Updated
    }

    /// Draws an entry's reachable time, uniformly in [0.5, 1.5) × `base_reachable_time`.
    pub(super) fn draw_reach(&self, w: &mut Writer) -> u64 {
        let base = self.t.base_reach.max(1);
        base / 2 + splitmix64(&mut w.rng) % base
    }
}

/// The splitmix64 generator: the next number of the sequence seeded with `*s`.
pub(super) fn splitmix64(s: &mut u64) -> u64 {
    *s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *s;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_state_survives_the_packed_word() {
        let all = [
            NeighState::Incomplete,
            NeighState::Reachable,
            NeighState::Stale,
            NeighState::Delay,
            NeighState::Probe,
            NeighState::Failed,
            NeighState::Permanent,
        ];
        assert_eq!(decode(0), None, "an empty slot");
        for s in all {
            let w = encode(0x0211_2233_4455, s, 0xffff);
            assert_eq!(decode(w), Some(s));
            assert_eq!(mac_of(w), 0x0211_2233_4455);
            assert_eq!(w >> GEN_SHIFT, WORD_GEN_MASK);
            for t in all {
                assert_eq!(decode(with_state(w, t)), Some(t));
                assert_eq!(
                    with_state(w, t) & !(7 << STATE_SHIFT),
                    w & !(7 << STATE_SHIFT)
                );
            }
        }
    }
}
