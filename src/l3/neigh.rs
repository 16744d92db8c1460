//! The ARP neighbour cache (IPv4): next-hop address to MAC, with the state machine of Linux's
//! neighbour subsystem (`net/core/neighbour.c`, `net/ipv4/arp.c`).
//!
//! Sans-IO: time is always a parameter, nothing here reads a clock, sends a frame or starts a
//! thread. The caller builds and sends the ARP requests the table asks for, and transmits the
//! frames it hands back.
//!
//! # States (as Linux's `NUD_*`)
//!
//! * `INCOMPLETE`: resolution in progress. A broadcast request goes out at once, then every
//!   `retrans_time` (1 s); after `mcast_solicit` (3) requests without an answer the entry is
//!   `FAILED`. Frames for the neighbour wait in a per-neighbour queue meanwhile.
//! * `REACHABLE`: confirmed by an ARP reply within the entry's reachable time, drawn uniformly in
//!   [0.5, 1.5) × `base_reachable_time` (30 s) from a splitmix64 generator seeded per table
//!   ([`NeighConfig::seed`]), so a test run is reproducible. Then `STALE`.
//! * `STALE`: still used to send. The first use moves it to `DELAY`.
//! * `DELAY`: used while stale; waits `delay_first_probe_time` (5 s) for a confirmation. A router
//!   gets no upper-layer confirmations, so unless an ARP reply arrives meanwhile it goes to
//!   `PROBE`.
//! * `PROBE`: a unicast request to the known MAC at once and every `retrans_time`; after
//!   `ucast_solicit` (3) unanswered the entry is `FAILED`. A reply makes it `REACHABLE`.
//! * `FAILED`: not usable. Frames that were waiting are handed out as
//!   [`NeighEvent::Unreachable`] (the router answers each source with ICMP host unreachable).
//!   The next frame for the address restarts resolution, as Linux does.
//! * `PERMANENT`: a static entry ([`NeighTable::add_static`]); ARP never changes it, it never
//!   ages and is never collected.
//!
//! ARP input follows `arp_process` and `neigh_update`: a reply from the neighbour confirms it
//! (`REACHABLE`, with the MAC it carries); a request from a known neighbour refreshes its MAC
//! without confirming it (a `STALE`-level update, which leaves a valid entry with the same MAC
//! in its state); a request for one of our addresses creates the sender's entry as `STALE`; a
//! gratuitous ARP (sender = target address) updates an existing entry whatever `locktime` says,
//! and creates one when [`NeighConfig::accept_gratuitous`] is set. Within `locktime` (1 s) of its
//! last change, a non-gratuitous ARP cannot change an entry's MAC (the first of several answers
//! wins, as Linux). ARP probes (sender 0.0.0.0) teach nothing. The caller cannot tell us whether
//! a reply was broadcast (Linux treats broadcast replies as `STALE`-level); every reply that is
//! not gratuitous confirms.
//!
//! # Where this differs from Linux
//!
//! * `REACHABLE` expiry goes to `STALE` even when the entry was used recently (Linux goes to
//!   `DELAY` then), so that lookups of `REACHABLE` entries are pure loads with no
//!   "last used" store; the next use of the `STALE` entry starts `DELAY`, so the probe comes at
//!   most `delay_first_probe_time` after the first use past expiry, as in Linux.
//! * The reachable time is drawn per confirmation instead of once per table every 300 s.
//! * Table-wide rate limit of the requests we ask the caller to send (a token bucket,
//!   [`NeighConfig::request_rate`] per second, burst [`NeighConfig::request_burst`]). A request
//!   refused by the bucket is counted ([`NeighCounters::rate_limited`]) and the entry retries at
//!   its next timer; the refused attempt still uses up one of its solicitations, so an
//!   unresolved neighbour fails after `mcast_solicit × retrans_time` whatever the bucket did and
//!   no frame waits longer than that.
//! * Static entries count toward the limit (their slots come from the same fixed array).
//! * Forced garbage collection removes only `FAILED` entries and `STALE` entries unused for
//!   `gc_stale_time`, oldest first (Linux's `neigh_forced_gc` also takes any entry not updated
//!   for 5 s) — see "Limits and garbage collection".
//! * [`NeighTable::flush_iface`] keeps static entries (as `ip neigh flush dev X`).
//!
//! # Design and thread-safety contract
//!
//! [`NeighTable`] is `Send + Sync`. The layout follows [`crate::l2::fdb`]: a fixed array of 64-byte
//! buckets of four slots, allocated once at creation with room for four times
//! `gc_thresh3` slots (at most 25% load), every key hashed with a per-table random seed to two
//! candidate buckets (a new entry goes into the emptier one). A slot is two atomics:
//!
//! * `key = gen << 48 | iface << 32 | ipv4` (gen 0: empty slot), and
//! * `word = gen13 << 51 | state << 48 | mac`: MAC and state in one `AtomicU64`, so a reader
//!   never sees a torn MAC or a MAC with another entry's state.
//!
//! `gen` counts the occupants of the slot; the writer bumps it whenever it reuses a slot for a
//! new key, stores the word, then publishes the key with release ordering (and frees a slot by
//! clearing the key, then the word). A reader loads the key (acquire), the word, and the key
//! again, and accepts the word only when the two keys are equal and the word's 13 generation
//! bits match the key's: to fool it, a slot would have to be reused 65 536 times between two of
//! its loads. Slots are reused in place; there is no memory to reclaim.
//!
//! * [`NeighTable::lookup`] is lock-free and never blocks: loads only for `REACHABLE`, `DELAY`,
//!   `PROBE` and `PERMANENT` entries. For a `STALE` entry the reader tries one
//!   compare-and-swap of the word from `STALE` to `DELAY`; only the winner then stores the use
//!   time and sets the slot's bit in a "marked" bitmap (and a flag), and the next
//!   [`NeighTable::poll`] arms the `DELAY` timer (it scans the bitmap, one bit per slot, only
//!   when the flag is set). A reader that loses the CAS uses the MAC it
//!   read (valid a moment ago). [`NeighTable::poll_at`] reports the epoch (due now) while a mark
//!   is pending. A lookup that misses bumps one relaxed counter on its own cache line.
//! * Everything else takes the table's writer mutex (parking_lot): one writer at a time. The
//!   writer's plain stores may overwrite a reader's `STALE → DELAY` mark made a moment before;
//!   every such store supersedes it (a confirmation, a new MAC, removal), so at worst the next
//!   use marks the entry again.
//! * Frames waiting for resolution, timers and per-entry timestamps live in the writer state
//!   (a `HashMap` of queues keyed by slot index; allocation there is the slow path).
//! * Callbacks (`release`, `out`) run after the lock is released, so they may call back into
//!   the table.
//!
//! # Timers
//!
//! Every entry has at most one live timer in a binary heap of `(due, slot, timer generation)` in
//! the writer state; re-arming bumps the slot's timer generation, so older heap items are
//! skipped when popped, and the heap is compacted when stale items outnumber live ones. Work per
//! [`NeighTable::poll`] is proportional to the timers due, not to the table size. A heap (rather
//! than a timer wheel) because deadlines span microseconds to minutes, the population is at
//! most `gc_thresh3`, and `poll_at` needs the exact next deadline. Confirmations of a
//! `REACHABLE` entry do not touch the heap: its timer re-checks the last confirmation when it
//! fires and re-arms if needed (as Linux's `neigh_timer_handler`).
//!
//! # Limits and garbage collection
//!
//! At most `gc_thresh3` (1024) entries exist. *Periodic GC*: a `STALE` entry unused for
//! `gc_stale_time` (60 s) and a `FAILED` entry older than `base_reachable_time / 2` (Linux's
//! periodic GC interval) are removed by their own timers while the table holds at least
//! `gc_thresh1` (128) entries; below that they stay, as in Linux. *Forced GC*: every `FAILED`
//! entry (from its failure) and `STALE` entry (from its last use + `gc_stale_time`) is also
//! listed in a second small heap ordered by the time it becomes collectable. When a new entry
//! is needed and the table holds `gc_thresh2` (512) or more, collectable entries are removed,
//! oldest first, until it is below `gc_thresh2` (this does not depend on when the caller last
//! polled); if it is still at `gc_thresh3` — or, rarely, both candidate buckets are full of
//! entries that cannot be collected — the new entry is refused ([`NeighCounters::refused`],
//! [`Refusal::TableFull`]) and the caller drops the packet. `PERMANENT` and `INCOMPLETE`
//! entries are never collected, so no queued frame is ever lost to GC.
//!
//! # Example
//!
//! ```
//! use std::net::Ipv4Addr;
//! use tapyard::l3::neigh::{ArpOp, Enqueue, NeighConfig, NeighEvent, NeighTable};
//! use tapyard::{Instant, MacAddr};
//!
//! let table = NeighTable::new(NeighConfig::default());
//! let (cni0, pod, gw) = (1u16, Ipv4Addr::new(10, 244, 1, 2), Ipv4Addr::new(10, 244, 1, 1));
//! let now = Instant::from_secs(1);
//!
//! // A routed packet for the pod: no entry yet, so the frame waits and a request goes out.
//! assert_eq!(table.lookup(cni0, pod, now), None);
//! let Enqueue::Queued { solicit, .. } = table.enqueue(cni0, pod, b"frame", now) else {
//!     panic!("not queued");
//! };
//! assert!(solicit, "the caller sends a broadcast ARP request for the pod");
//!
//! // The pod answers: the waiting frame is released with its MAC.
//! let mac = MacAddr::local(2);
//! let mut out = Vec::new();
//! table.input(cni0, ArpOp::REPLY, pod, mac, gw, true, now, &mut |r| out.push(r));
//! assert_eq!((out[0].mac, &out[0].frame[..]), (mac, &b"frame"[..]));
//! assert_eq!(table.lookup(cni0, pod, now), Some(mac));
//!
//! // Timers: nothing is due until the entry's reachable time runs out.
//! let mut events = Vec::new();
//! table.poll(Instant::from_secs(2), &mut |e: NeighEvent| events.push(e));
//! assert!(events.is_empty());
//! let mut show = String::new();
//! table.fmt_dump(now, &mut show, &|_| "cni0".to_string()).unwrap();
//! assert_eq!(show, "10.244.1.2 dev cni0 lladdr 02:00:00:00:00:02 REACHABLE\n");
//! ```

use std::cmp::Reverse;
use std::collections::hash_map::RandomState;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::fmt;
use std::hash::BuildHasher;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use crate::time::Instant;
use crate::wire::mac::MacAddr;

/// Largest accepted `gc_thresh3` (slot indices and the marked bitmap stay small).
pub const MAX_ENTRIES: usize = 1 << 20;

const SLOTS: usize = 4;
const KEY_MASK: u64 = (1 << 48) - 1;
const MAC_MASK: u64 = (1 << 48) - 1;
const STATE_SHIFT: u32 = 48;
const STATE_MASK: u64 = 7 << STATE_SHIFT;
const GEN_SHIFT: u32 = 51;
const WORD_GEN_MASK: u64 = (1 << 13) - 1;
const NEVER: u64 = u64::MAX;

// State codes in the packed word (0: no entry).
const INCOMPLETE: u8 = 1;
const REACHABLE: u8 = 2;
const STALE: u8 = 3;
const DELAY: u8 = 4;
const PROBE: u8 = 5;
const FAILED: u8 = 6;
const PERMANENT: u8 = 7;

/// The state of a neighbour entry, as Linux's `NUD_*` states.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum NeighState {
    /// Resolution in progress: broadcast requests, frames queued.
    Incomplete = INCOMPLETE,
    /// Confirmed by an ARP reply within the reachable time.
    Reachable = REACHABLE,
    /// Reachable time passed; still used to send.
    Stale = STALE,
    /// Used while stale; waiting a moment for a confirmation before probing.
    Delay = DELAY,
    /// Unicast requests to the known MAC.
    Probe = PROBE,
    /// Resolution failed.
    Failed = FAILED,
    /// A static entry.
    Permanent = PERMANENT,
}

impl NeighState {
    fn from_code(c: u8) -> Option<NeighState> {
        Some(match c {
            INCOMPLETE => NeighState::Incomplete,
            REACHABLE => NeighState::Reachable,
            STALE => NeighState::Stale,
            DELAY => NeighState::Delay,
            PROBE => NeighState::Probe,
            FAILED => NeighState::Failed,
            PERMANENT => NeighState::Permanent,
            _ => return None,
        })
    }

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
        code_valid(self as u8)
    }
}

impl fmt::Display for NeighState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[inline]
fn code_valid(c: u8) -> bool {
    matches!(c, REACHABLE | STALE | DELAY | PROBE | PERMANENT)
}

/// The table's parameters, with Linux's defaults (`/proc/sys/net/ipv4/neigh/default/*`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NeighConfig {
    /// Base of the reachable time; each confirmation draws one in [0.5, 1.5) × this. 30 s.
    pub base_reachable_time: Duration,
    /// Time between requests for one neighbour. 1 s.
    pub retrans_time: Duration,
    /// How long a used `STALE` entry waits in `DELAY` before probing. 5 s.
    pub delay_first_probe_time: Duration,
    /// Broadcast requests before an `INCOMPLETE` entry fails (at least 1). 3.
    pub mcast_solicit: u32,
    /// Unicast requests before a `PROBE` entry fails. 3.
    pub ucast_solicit: u32,
    /// A `STALE` entry unused this long may be collected. 60 s.
    pub gc_stale_time: Duration,
    /// Within this time of an entry's last change, ARP (other than gratuitous) cannot change
    /// its MAC. 1 s.
    pub locktime: Duration,
    /// Frames queued per unresolved neighbour (Linux's `unres_qlen`). 101.
    pub unres_qlen: usize,
    /// Bytes queued per unresolved neighbour (Linux's `unres_qlen_bytes`). 212 992.
    pub unres_qlen_bytes: usize,
    /// Below this many entries nothing is garbage collected. 128.
    pub gc_thresh1: usize,
    /// Creating an entry at or above this many collects `FAILED` and idle `STALE` ones. 512.
    pub gc_thresh2: usize,
    /// Hard limit on entries (static ones included), at most [`MAX_ENTRIES`]. 1024.
    pub gc_thresh3: usize,
    /// Create entries from gratuitous ARP for addresses not in the table (Linux's
    /// `arp_accept` for gratuitous ARP). `true`.
    pub accept_gratuitous: bool,
    /// Requests per second the table asks its caller to send, over all neighbours. 100.
    pub request_rate: u32,
    /// Token-bucket depth of that limit. 50.
    pub request_burst: u32,
    /// Seed of the generator that draws reachable times.
    pub seed: u64,
}

impl Default for NeighConfig {
    fn default() -> Self {
        NeighConfig {
            base_reachable_time: Duration::from_secs(30),
            retrans_time: Duration::from_secs(1),
            delay_first_probe_time: Duration::from_secs(5),
            mcast_solicit: 3,
            ucast_solicit: 3,
            gc_stale_time: Duration::from_secs(60),
            locktime: Duration::from_secs(1),
            unres_qlen: 101,
            unres_qlen_bytes: 212_992,
            gc_thresh1: 128,
            gc_thresh2: 512,
            gc_thresh3: 1024,
            accept_gratuitous: true,
            request_rate: 100,
            request_burst: 50,
            seed: 0x6e65_6967_6862_6f72,
        }
    }
}

impl NeighConfig {
    /// Checks every field; the error names the first bad one and its value.
    pub fn validate(&self) -> Result<(), NeighError> {
        fn bad(field: &'static str, value: impl fmt::Debug, reason: &'static str) -> NeighError {
            NeighError::Config {
                field,
                value: format!("{value:?}"),
                reason,
            }
        }
        let positive = [
            ("base_reachable_time", self.base_reachable_time),
            ("retrans_time", self.retrans_time),
            ("gc_stale_time", self.gc_stale_time),
        ];
        for (field, d) in positive {
            if d.is_zero() {
                return Err(bad(field, d, "must be positive"));
            }
        }
        if self.mcast_solicit == 0 {
            return Err(bad("mcast_solicit", 0, "must be at least 1"));
        }
        if self.unres_qlen == 0 {
            return Err(bad("unres_qlen", 0, "must be at least 1"));
        }
        if self.unres_qlen_bytes == 0 {
            return Err(bad("unres_qlen_bytes", 0, "must be at least 1"));
        }
        if self.gc_thresh3 == 0 || self.gc_thresh3 > MAX_ENTRIES {
            return Err(bad(
                "gc_thresh3",
                self.gc_thresh3,
                "must be between 1 and MAX_ENTRIES",
            ));
        }
        if self.gc_thresh2 > self.gc_thresh3 {
            return Err(bad(
                "gc_thresh2",
                self.gc_thresh2,
                "must not exceed gc_thresh3",
            ));
        }
        if self.gc_thresh1 > self.gc_thresh2 {
            return Err(bad(
                "gc_thresh1",
                self.gc_thresh1,
                "must not exceed gc_thresh2",
            ));
        }
        if self.request_rate == 0 {
            return Err(bad("request_rate", 0, "must be at least 1"));
        }
        if self.request_burst == 0 {
            return Err(bad("request_burst", 0, "must be at least 1"));
        }
        Ok(())
    }
}

/// Errors of this module.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NeighError {
    /// A configuration field has a value the table cannot work with.
    Config {
        /// The field's name, as in [`NeighConfig`].
        field: &'static str,
        /// The value given.
        value: String,
        /// What it must be.
        reason: &'static str,
    },
    /// The table is at its limit and nothing could be collected.
    TableFull,
    /// Not a neighbour address (unspecified, broadcast or multicast).
    BadAddress(Ipv4Addr),
    /// Not a station MAC (zero or group address).
    BadMac(MacAddr),
}

impl fmt::Display for NeighError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NeighError::Config {
                field,
                value,
                reason,
            } => write!(f, "invalid neighbour config: {field} = {value}: {reason}"),
            NeighError::TableFull => {
                f.write_str("neighbour table full and nothing could be collected")
            }
            NeighError::BadAddress(ip) => write!(f, "{ip} is not a neighbour address"),
            NeighError::BadMac(m) => write!(f, "{m} is not a station MAC address"),
        }
    }
}

impl std::error::Error for NeighError {}

/// The operation code of an ARP packet: an open newtype, so any value converts; the table
/// learns from [`ArpOp::REQUEST`] and [`ArpOp::REPLY`] only (as Linux's `arp_process`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ArpOp(pub u16);

impl ArpOp {
    /// `who-has` (1).
    pub const REQUEST: ArpOp = ArpOp(1);
    /// `is-at` (2).
    pub const REPLY: ArpOp = ArpOp(2);
}

impl From<u16> for ArpOp {
    fn from(op: u16) -> ArpOp {
        ArpOp(op)
    }
}

impl From<etherparse::ArpOperation> for ArpOp {
    fn from(op: etherparse::ArpOperation) -> ArpOp {
        ArpOp(op.0)
    }
}

/// What [`NeighTable::enqueue`] did with a frame.
#[derive(Clone, Debug, PartialEq, Eq)]
#[must_use]
pub enum Enqueue {
    /// The neighbour has a usable entry (it became usable after the caller's lookup): send the
    /// frame to this MAC now. The frame was not queued.
    Resolved(MacAddr),
    /// The frame was queued until the neighbour answers.
    Queued {
        /// Send a broadcast ARP request for the address now: a resolution started (or
        /// restarted after `FAILED`) and the rate limit allowed it.
        solicit: bool,
        /// Older frames pushed out of the full queue, oldest first: count them as dropped
        /// ([`crate::DropReason::NeighQueueOverflow`]).
        dropped: Vec<Vec<u8>>,
    },
    /// The frame was not queued; the caller drops and counts it.
    Refused(Refusal),
}

/// Why a frame could not wait for resolution.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// The table is at its limit and nothing could be collected.
    TableFull,
    /// The frame alone is larger than `unres_qlen_bytes`.
    FrameTooBig,
    /// The next hop is not a neighbour address (unspecified, broadcast or multicast).
    BadAddress,
}

/// What [`NeighTable::input`] did with an ARP packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Learned {
    /// Nothing learned: an ARP probe, a sender MAC that is not a station address, an operation
    /// other than request or reply, an unknown sender that did not ask for us, or a gratuitous
    /// ARP for one of our own addresses.
    Ignored,
    /// A new entry was made for the sender.
    Created,
    /// The entry's state or MAC changed.
    Updated,
    /// A reply confirmed a `REACHABLE` entry with the same MAC.
    Confirmed,
    /// Nothing to change (a request from a known neighbour with the same MAC).
    Unchanged,
    /// A different MAC within `locktime` of the entry's last change: ignored.
    Locked,
    /// The entry is static; ARP does not change it.
    Permanent,
    /// The table is full: no entry made.
    TableFull,
}

/// A frame that waited for resolution and may now be sent to `mac`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Released {
    /// The interface the neighbour is on.
    pub iface: u16,
    /// The neighbour (next-hop) address.
    pub ip: Ipv4Addr,
    /// Its MAC: the frame's destination.
    pub mac: MacAddr,
    /// The frame, as given to [`NeighTable::enqueue`].
    pub frame: Vec<u8>,
}

/// Work for the caller produced by [`NeighTable::poll`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NeighEvent {
    /// Send an ARP request for `ip` out of `iface`: broadcast when `unicast` is `None`
    /// (resolution), else to that MAC (a reachability probe of a `PROBE` entry).
    Solicit {
        /// The interface.
        iface: u16,
        /// The address asked for.
        ip: Ipv4Addr,
        /// The destination MAC of a unicast probe.
        unicast: Option<MacAddr>,
    },
    /// Resolution of `ip` failed and `frame` was waiting for it: answer its source with ICMP
    /// host unreachable and drop it ([`crate::DropReason::NeighFailed`]).
    Unreachable {
        /// The interface.
        iface: u16,
        /// The neighbour that did not answer.
        ip: Ipv4Addr,
        /// The frame, as given to [`NeighTable::enqueue`].
        frame: Vec<u8>,
    },
}

/// One row of [`NeighTable::dump`], like a line of `ip -s neigh show`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NeighEntry {
    /// The interface.
    pub iface: u16,
    /// The neighbour's address.
    pub ip: Ipv4Addr,
    /// Its MAC, for states that have a usable one.
    pub mac: Option<MacAddr>,
    /// The state.
    pub state: NeighState,
    /// Time since the last confirmation (ARP reply); `None` if never confirmed.
    pub confirmed_ago: Option<Duration>,
    /// Time since the entry's state or MAC last changed.
    pub updated_ago: Duration,
    /// Frames waiting for resolution.
    pub queued: usize,
}

impl NeighEntry {
    /// An `ip neigh show` line (without newline), with interface names from `ifname`:
    /// `10.244.1.2 dev cni0 lladdr 02:00:00:00:00:02 REACHABLE`, `10.244.1.9 dev cni0  FAILED`.
    pub fn show<F, S>(&self, ifname: F) -> ShowNeigh<'_, F>
    where
        F: Fn(u16) -> S,
        S: fmt::Display,
    {
        ShowNeigh {
            entry: self,
            ifname,
        }
    }
}

/// Displays a [`NeighEntry`] as `ip neigh show` does (see [`NeighEntry::show`]).
pub struct ShowNeigh<'a, F> {
    entry: &'a NeighEntry,
    ifname: F,
}

impl<F> fmt::Debug for ShowNeigh<'_, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShowNeigh")
            .field("entry", self.entry)
            .finish_non_exhaustive()
    }
}

impl<F, S> fmt::Display for ShowNeigh<'_, F>
where
    F: Fn(u16) -> S,
    S: fmt::Display,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let e = self.entry;
        write!(f, "{} dev {} ", e.ip, (self.ifname)(e.iface))?;
        match e.mac {
            Some(m) => write!(f, "lladdr {m} ")?,
            None => f.write_str(" ")?,
        }
        write!(f, "{}", e.state)
    }
}

/// Counters of the table, read with [`NeighTable::counters`].
///
/// Frames add up: `queued = released + queue_overflow + queue_failed + queue_flushed +
/// queued_now`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NeighCounters {
    /// Entries in the table now (static ones included).
    pub entries: usize,
    /// Frames waiting for resolution now, over all neighbours.
    pub queued_now: usize,
    /// Lookups that found no usable entry.
    pub lookups_missed: u64,
    /// Entries created (static ones included).
    pub created: u64,
    /// New entries refused because the table was full and nothing could be collected.
    pub refused: u64,
    /// Entries removed by garbage collection.
    pub gc: u64,
    /// Entries that went to `FAILED`.
    pub failed: u64,
    /// ARP requests the table asked its caller to send.
    pub requests: u64,
    /// ARP requests the table wanted to send but the rate limit refused.
    pub rate_limited: u64,
    /// Frames queued to wait for resolution.
    pub queued: u64,
    /// Queued frames released to be sent after resolution.
    pub released: u64,
    /// Queued frames pushed out of a full queue (handed back by [`NeighTable::enqueue`]).
    pub queue_overflow: u64,
    /// Queued frames handed out as [`NeighEvent::Unreachable`].
    pub queue_failed: u64,
    /// Queued frames discarded with their entry by [`NeighTable::remove`] or
    /// [`NeighTable::flush_iface`].
    pub queue_flushed: u64,
}

#[repr(align(64))]
#[derive(Default)]
struct Bucket {
    keys: [AtomicU64; SLOTS],
    words: [AtomicU64; SLOTS],
}

#[repr(align(64))]
#[derive(Default)]
struct Padded<T>(T);

/// Writer-side state of one slot.
#[derive(Clone, Copy)]
struct Meta {
    /// Occupant generation (also in the slot's key; 0 never used for an occupant).
    gen: u16,
    /// Last confirmation, or `NEVER`.
    confirmed: u64,
    /// Last change of state or MAC.
    updated: u64,
    /// This entry's current reachable time (µs).
    reach: u64,
    /// Solicitations attempted in the current `INCOMPLETE` or `PROBE` phase.
    probes: u32,
    /// Generation of the live timer; heap items with another are stale.
    tgen: u32,
    /// The state the live timer was armed for (0: none).
    armed: u8,
    /// Sequence of the entry's live item in the GC heap; other items are stale.
    gc_seq: u32,
}

impl Default for Meta {
    fn default() -> Self {
        Meta {
            gen: 0,
            confirmed: NEVER,
            updated: 0,
            reach: 0,
            probes: 0,
            tgen: 0,
            armed: 0,
            gc_seq: 0,
        }
    }
}

#[derive(Default)]
struct Queue {
    frames: VecDeque<Vec<u8>>,
    bytes: usize,
}

/// Table-wide token bucket, in micro-tokens so refills need no division.
struct TokenBucket {
    tokens: u64,
    cap: u64,
    rate: u64,
    last: u64,
}

const TOKEN: u64 = 1_000_000;

impl TokenBucket {
    fn take(&mut self, now: u64) -> bool {
        if now > self.last {
            let add = (now - self.last).saturating_mul(self.rate);
            self.tokens = self.tokens.saturating_add(add).min(self.cap);
            self.last = now;
        }
        if self.tokens >= TOKEN {
            self.tokens -= TOKEN;
            true
        } else {
            false
        }
    }
}

struct Writer {
    entries: usize,
    meta: Vec<Meta>,
    queues: HashMap<u32, Queue>,
    queued_now: usize,
    timers: BinaryHeap<Reverse<(u64, u32, u32)>>,
    /// `FAILED` and `STALE` entries by the time they become collectable (failure; last use +
    /// `gc_stale_time`), as (time, slot, gc sequence): forced GC takes them oldest first.
    gc_heap: BinaryHeap<Reverse<(u64, u32, u32)>>,
    bucket: TokenBucket,
    rng: u64,
    c: NeighCounters,
}

/// Configured times in microseconds.
struct Times {
    base_reach: u64,
    retrans: u64,
    delay: u64,
    gc_stale: u64,
    gc_interval: u64,
    locktime: u64,
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

#[inline]
fn key_of(iface: u16, ip: Ipv4Addr) -> u64 {
    (u64::from(iface) << 32) | u64::from(u32::from(ip))
}

#[inline]
fn pack(mac: u64, state: u8, gen: u16) -> u64 {
    (mac & MAC_MASK)
        | (u64::from(state) << STATE_SHIFT)
        | ((u64::from(gen) & WORD_GEN_MASK) << GEN_SHIFT)
}

#[inline]
fn state_of(word: u64) -> u8 {
    ((word & STATE_MASK) >> STATE_SHIFT) as u8
}

#[inline]
fn fmix64(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

fn splitmix64(s: &mut u64) -> u64 {
    *s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *s;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn is_neighbour_addr(ip: Ipv4Addr) -> bool {
    !(ip.is_unspecified() || ip.is_broadcast() || ip.is_multicast())
}

/// The ARP neighbour cache of a router (see the module docs).
pub struct NeighTable {
    buckets: Box<[Bucket]>,
    /// Per slot: when a reader marked the entry `STALE → DELAY`.
    used: Box<[AtomicU64]>,
    /// Per slot: a reader marked the entry and the writer has not seen it yet.
    marks: Box<[AtomicU64]>,
    marked: Padded<AtomicBool>,
    misses: Padded<AtomicU64>,
    mask: usize,
    seed: u64,
    cfg: NeighConfig,
    t: Times,
    writer: Mutex<Writer>,
}

impl fmt::Debug for NeighTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NeighTable")
            .field("limit", &self.cfg.gc_thresh3)
            .field("slots", &(self.buckets.len() * SLOTS))
            .field("counters", &self.counters())
            .finish()
    }
}

impl NeighTable {
    /// A table with `cfg`. Memory is allocated once: four slots (16 bytes each, plus per-slot
    /// writer state) per entry of `gc_thresh3`.
    ///
    /// # Panics
    /// If `cfg` does not pass [`NeighConfig::validate`]; see [`NeighTable::try_new`].
    pub fn new(cfg: NeighConfig) -> NeighTable {
        match NeighTable::try_new(cfg) {
            Ok(t) => t,
            Err(e) => panic!("{e}"),
        }
    }

    /// A table with `cfg`, or the first configuration error.
    pub fn try_new(cfg: NeighConfig) -> Result<NeighTable, NeighError> {
        cfg.validate()?;
        let nbuckets = cfg.gc_thresh3.next_power_of_two().max(2);
        let nslots = nbuckets * SLOTS;
        let t = Times {
            base_reach: micros(cfg.base_reachable_time),
            retrans: micros(cfg.retrans_time),
            delay: micros(cfg.delay_first_probe_time),
            gc_stale: micros(cfg.gc_stale_time),
            gc_interval: (micros(cfg.base_reachable_time) / 2).max(1),
            locktime: micros(cfg.locktime),
        };
        let writer = Writer {
            entries: 0,
            meta: vec![Meta::default(); nslots],
            queues: HashMap::new(),
            queued_now: 0,
            timers: BinaryHeap::new(),
            gc_heap: BinaryHeap::new(),
            bucket: TokenBucket {
                tokens: u64::from(cfg.request_burst) * TOKEN,
                cap: u64::from(cfg.request_burst) * TOKEN,
                rate: u64::from(cfg.request_rate),
                last: 0,
            },
            rng: cfg.seed,
            c: NeighCounters::default(),
        };
        Ok(NeighTable {
            buckets: (0..nbuckets).map(|_| Bucket::default()).collect(),
            used: (0..nslots).map(|_| AtomicU64::new(0)).collect(),
            marks: (0..nslots.div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
            marked: Padded::default(),
            misses: Padded::default(),
            mask: nbuckets - 1,
            seed: RandomState::new().hash_one(0x6e65_6967_u64),
            cfg,
            t,
            writer: Mutex::new(writer),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &NeighConfig {
        &self.cfg
    }

    #[inline]
    fn candidates(&self, key: u64) -> (usize, usize) {
        let h = fmix64(key ^ self.seed);
        let b1 = (h as usize) & self.mask;
        let mut b2 = ((h >> 32) as usize) & self.mask;
        if b2 == b1 {
            b2 = (b1 + 1) & self.mask;
        }
        (b1, b2)
    }

    #[inline]
    fn key_at(&self, idx: usize) -> &AtomicU64 {
        &self.buckets[idx / SLOTS].keys[idx % SLOTS]
    }

    #[inline]
    fn word_at(&self, idx: usize) -> &AtomicU64 {
        &self.buckets[idx / SLOTS].words[idx % SLOTS]
    }

    /// Reader side: the slot and a word consistent with the key `want` (see the module docs).
    #[inline]
    fn find_live(&self, want: u64) -> Option<(usize, u64)> {
        let (b1, b2) = self.candidates(want);
        for b in [b1, b2] {
            let bucket = self.buckets.get(b)?;
            for (i, key) in bucket.keys.iter().enumerate() {
                let k = key.load(Ordering::Acquire);
                if k & KEY_MASK != want || k >> 48 == 0 {
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

    /// The MAC to send to `ip` on `iface`, if its entry is usable (`REACHABLE`, `STALE`,
    /// `DELAY`, `PROBE`, `PERMANENT`). Lock-free; a `STALE` entry is marked for `DELAY` with at
    /// most one compare-and-swap. On `None` the caller calls [`NeighTable::enqueue`].
    #[inline]
    pub fn lookup(&self, iface: u16, ip: Ipv4Addr, now: Instant) -> Option<MacAddr> {
        if let Some((idx, w)) = self.find_live(key_of(iface, ip)) {
            match state_of(w) {
                REACHABLE | DELAY | PROBE | PERMANENT => return Some(MacAddr::from_u64(w)),
                STALE => {
                    self.mark_used(idx, w, now.micros());
                    return Some(MacAddr::from_u64(w));
                }
                _ => {}
            }
        }
        self.misses.0.fetch_add(1, Ordering::Relaxed);
        None
    }

    #[cold]
    fn mark_used(&self, idx: usize, w: u64, now: u64) {
        let Some(bucket) = self.buckets.get(idx / SLOTS) else {
            return;
        };
        let delay = (w & !STATE_MASK) | (u64::from(DELAY) << STATE_SHIFT);
        let won = bucket.words[idx % SLOTS]
            .compare_exchange(w, delay, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok();
        if won {
            if let Some(u) = self.used.get(idx) {
                u.store(now, Ordering::Relaxed);
            }
            if let Some(m) = self.marks.get(idx / 64) {
                m.fetch_or(1 << (idx % 64), Ordering::Release);
            }
            self.marked.0.store(true, Ordering::Release);
        }
    }

    /// Writer side (lock held): the slot holding `want`.
    fn find_w(&self, want: u64) -> Option<usize> {
        let (b1, b2) = self.candidates(want);
        for b in [b1, b2] {
            for (i, key) in self.buckets[b].keys.iter().enumerate() {
                let k = key.load(Ordering::Relaxed);
                if k >> 48 != 0 && k & KEY_MASK == want {
                    return Some(b * SLOTS + i);
                }
            }
        }
        None
    }

    fn slot_key(&self, idx: usize) -> u64 {
        self.key_at(idx).load(Ordering::Relaxed)
    }

    fn slot_word(&self, idx: usize) -> u64 {
        self.word_at(idx).load(Ordering::Acquire)
    }

    fn set_word(&self, w: &Writer, idx: usize, mac: u64, state: u8) {
        self.word_at(idx)
            .store(pack(mac, state, w.meta[idx].gen), Ordering::Release);
    }

    fn draw_reach(&self, w: &mut Writer) -> u64 {
        let base = self.t.base_reach.max(1);
        base / 2 + splitmix64(&mut w.rng) % base
    }

    fn arm(&self, w: &mut Writer, idx: usize, due: u64, state: u8) {
        let m = &mut w.meta[idx];
        m.tgen = m.tgen.wrapping_add(1);
        m.armed = state;
        w.timers.push(Reverse((due, idx as u32, m.tgen)));
        if w.timers.len() > 2 * w.entries + 64 {
            let meta = &w.meta;
            w.timers
                .retain(|Reverse((_, i, g))| meta.get(*i as usize).is_some_and(|m| m.tgen == *g));
        }
    }

    fn disarm(&self, w: &mut Writer, idx: usize) {
        let m = &mut w.meta[idx];
        m.tgen = m.tgen.wrapping_add(1);
        m.armed = 0;
    }

    /// Asks for one request (counts it as a solicitation either way); false if rate-limited.
    fn solicit(&self, w: &mut Writer, idx: usize, now: u64) -> bool {
        w.meta[idx].probes += 1;
        if w.bucket.take(now) {
            w.c.requests += 1;
            true
        } else {
            w.c.rate_limited += 1;
            false
        }
    }

    /// Lists the entry in `idx` for forced GC from `at` on (replacing its previous listing).
    fn push_gc(&self, w: &mut Writer, idx: usize, at: u64) {
        let m = &mut w.meta[idx];
        m.gc_seq = m.gc_seq.wrapping_add(1);
        w.gc_heap.push(Reverse((at, idx as u32, m.gc_seq)));
        if w.gc_heap.len() > 2 * w.entries + 64 {
            let meta = &w.meta;
            w.gc_heap.retain(|Reverse((_, i, q))| {
                let i = *i as usize;
                meta[i].gc_seq == *q && self.slot_key(i) >> 48 != 0
            });
        }
    }

    /// When the `STALE` entry in `idx` stops being used, for GC purposes.
    fn stale_since(&self, w: &Writer, idx: usize) -> u64 {
        w.meta[idx]
            .updated
            .max(self.used[idx].load(Ordering::Relaxed))
    }

    /// True if the entry in `idx` may be collected at `now`: `FAILED`, or `STALE` and unused for
    /// `gc_stale_time`.
    fn collectable_now(&self, w: &Writer, idx: usize, now: u64) -> bool {
        if self.slot_key(idx) >> 48 == 0 {
            return false;
        }
        match state_of(self.slot_word(idx)) {
            FAILED => true,
            STALE => now >= self.stale_since(w, idx).saturating_add(self.t.gc_stale),
            _ => false,
        }
    }

    /// Empties a slot (lock held). Returns how many queued frames went with it.
    fn free(&self, w: &mut Writer, idx: usize) -> usize {
        self.key_at(idx).store(0, Ordering::Release);
        self.word_at(idx).store(0, Ordering::Release);
        self.disarm(w, idx);
        let m = &mut w.meta[idx];
        m.gc_seq = m.gc_seq.wrapping_add(1);
        m.probes = 0;
        w.entries -= 1;
        match w.queues.remove(&(idx as u32)) {
            Some(q) => {
                w.queued_now -= q.frames.len();
                q.frames.len()
            }
            None => 0,
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
            if w.meta[idx].gc_seq != seq || self.slot_key(idx) >> 48 == 0 {
                continue;
            }
            match state_of(self.slot_word(idx)) {
                FAILED => {}
                STALE => {
                    let due = self.stale_since(w, idx).saturating_add(self.t.gc_stale);
                    if now < due {
                        self.push_gc(w, idx, due);
                        continue;
                    }
                }
                // Used or resolving again: listed anew when it is STALE or FAILED again.
                _ => continue,
            }
            self.free(w, idx);
            w.c.gc += 1;
        }
    }

    /// A free slot for `want` (lock held): an empty one in the emptier candidate bucket, else a
    /// collectable entry among the candidates.
    fn place(&self, w: &mut Writer, want: u64, now: u64) -> Option<usize> {
        let (b1, b2) = self.candidates(want);
        let scan = |b: usize| {
            let mut used = 0;
            let mut empty = None;
            for (i, k) in self.buckets[b].keys.iter().enumerate() {
                if k.load(Ordering::Relaxed) >> 48 != 0 {
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
                if self.collectable_now(w, idx, now) {
                    self.free(w, idx);
                    w.c.gc += 1;
                    return Some(idx);
                }
            }
        }
        None
    }

    /// Reserves a slot for a new entry (lock held), collecting garbage as needed; `None` (and
    /// counted as refused) when the table is full.
    fn alloc(&self, w: &mut Writer, want: u64, now: u64) -> Option<usize> {
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

    /// Publishes a new occupant of a slot reserved by `alloc` (lock held).
    fn publish(&self, w: &mut Writer, idx: usize, want: u64, mac: u64, state: u8, now: u64) {
        let m = &mut w.meta[idx];
        m.gen = m.gen.wrapping_add(1).max(1);
        m.confirmed = NEVER;
        m.updated = now;
        m.probes = 0;
        m.gc_seq = m.gc_seq.wrapping_add(1);
        let gen = m.gen;
        self.used[idx].store(now, Ordering::Relaxed);
        self.word_at(idx)
            .store(pack(mac, state, gen), Ordering::Release);
        self.key_at(idx)
            .store(want | (u64::from(gen) << 48), Ordering::Release);
    }

    /// `STALE → DELAY` by the writer (lock held).
    fn to_delay(&self, w: &mut Writer, idx: usize, mac: u64, now: u64) {
        self.set_word(w, idx, mac, DELAY);
        w.meta[idx].updated = now;
        self.used[idx].store(now, Ordering::Relaxed);
        self.arm(w, idx, now.saturating_add(self.t.delay), DELAY);
    }

    fn to_stale(&self, w: &mut Writer, idx: usize, mac: u64, now: u64) {
        self.set_word(w, idx, mac, STALE);
        w.meta[idx].updated = now;
        self.stale_timers(w, idx, now);
    }

    /// The periodic-GC timer and the forced-GC listing of an entry that became `STALE` at `now`.
    fn stale_timers(&self, w: &mut Writer, idx: usize, now: u64) {
        let due = now.saturating_add(self.t.gc_stale);
        self.arm(w, idx, due, STALE);
        self.push_gc(w, idx, due);
    }

    fn to_reachable(&self, w: &mut Writer, idx: usize, mac: u64, now: u64) {
        self.set_word(w, idx, mac, REACHABLE);
        let m = &mut w.meta[idx];
        m.updated = now;
        let due = m.confirmed.saturating_add(m.reach);
        self.arm(w, idx, due, REACHABLE);
    }

    /// `INCOMPLETE` or `PROBE` ran out of solicitations (lock held).
    fn fail(&self, w: &mut Writer, idx: usize, now: u64, ev: &mut Vec<NeighEvent>) {
        let (iface, ip) = split_key(self.slot_key(idx));
        self.set_word(w, idx, 0, FAILED);
        let m = &mut w.meta[idx];
        m.updated = now;
        m.probes = 0;
        w.c.failed += 1;
        if let Some(q) = w.queues.remove(&(idx as u32)) {
            w.queued_now -= q.frames.len();
            w.c.queue_failed += q.frames.len() as u64;
            ev.extend(q.frames.into_iter().map(|frame| NeighEvent::Unreachable {
                iface,
                ip,
                frame,
            }));
        }
        self.push_gc(w, idx, now);
        self.arm(w, idx, now.saturating_add(self.t.gc_interval), FAILED);
    }

    /// Arms the `DELAY` timer of an entry a reader marked (lock held).
    fn on_marked(&self, w: &mut Writer, idx: usize) {
        if self.slot_key(idx) >> 48 == 0
            || state_of(self.slot_word(idx)) != DELAY
            || w.meta[idx].armed == DELAY
        {
            return;
        }
        let used = self.used[idx].load(Ordering::Relaxed);
        w.meta[idx].updated = used;
        self.arm(w, idx, used.saturating_add(self.t.delay), DELAY);
    }

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

    /// Runs the due timer of slot `idx` (lock held).
    fn fire(&self, w: &mut Writer, idx: usize, now: u64, ev: &mut Vec<NeighEvent>) {
        let k = self.slot_key(idx);
        if k >> 48 == 0 {
            return;
        }
        let word = self.slot_word(idx);
        let st = state_of(word);
        if st != w.meta[idx].armed {
            // A reader moved a STALE entry to DELAY after its timer was armed.
            self.on_marked(w, idx);
            return;
        }
        let mac = word & MAC_MASK;
        match st {
            INCOMPLETE | PROBE => {
                let max = if st == INCOMPLETE {
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
                    let unicast = (st == PROBE).then(|| MacAddr::from_u64(mac));
                    ev.push(NeighEvent::Solicit { iface, ip, unicast });
                }
                self.arm(w, idx, now.saturating_add(self.t.retrans), st);
            }
            REACHABLE => {
                let m = w.meta[idx];
                let until = m.confirmed.saturating_add(m.reach);
                if now < until {
                    self.arm(w, idx, until, REACHABLE);
                } else {
                    self.to_stale(w, idx, mac, now);
                }
            }
            DELAY => {
                let confirmed = w.meta[idx].confirmed;
                if confirmed != NEVER && now <= confirmed.saturating_add(self.t.delay) {
                    self.to_reachable(w, idx, mac, now);
                    return;
                }
                self.set_word(w, idx, mac, PROBE);
                let m = &mut w.meta[idx];
                m.updated = now;
                m.probes = 0;
                m.armed = PROBE;
                // The first probe goes out at once, as Linux's neigh_timer_handler.
                self.fire(w, idx, now, ev);
            }
            STALE => {
                let due = self.stale_since(w, idx).saturating_add(self.t.gc_stale);
                if now < due {
                    self.arm(w, idx, due, STALE);
                } else if w.entries >= self.cfg.gc_thresh1 {
                    self.free(w, idx);
                    w.c.gc += 1;
                } else {
                    // Below gc_thresh1 nothing is collected; look again later.
                    self.arm(w, idx, now.saturating_add(self.t.gc_stale), STALE);
                }
            }
            FAILED => {
                if w.entries >= self.cfg.gc_thresh1 {
                    self.free(w, idx);
                    w.c.gc += 1;
                } else {
                    self.arm(w, idx, now.saturating_add(self.t.gc_interval), FAILED);
                }
            }
            _ => {}
        }
    }

    /// Queues a copy of `frame` for `ip` on `iface`, whose lookup missed. Creates an
    /// `INCOMPLETE` entry if there is none (collecting garbage or refusing when the table is
    /// full) and restarts resolution of a `FAILED` one. The per-neighbour queue holds at most
    /// `unres_qlen` frames and `unres_qlen_bytes` bytes; older frames are pushed out first and
    /// handed back. If the entry became usable since the lookup, nothing is queued and the MAC
    /// is returned.
    pub fn enqueue(&self, iface: u16, ip: Ipv4Addr, frame: &[u8], now: Instant) -> Enqueue {
        if !is_neighbour_addr(ip) {
            return Enqueue::Refused(Refusal::BadAddress);
        }
        if frame.len() > self.cfg.unres_qlen_bytes {
            return Enqueue::Refused(Refusal::FrameTooBig);
        }
        let now = now.micros();
        let want = key_of(iface, ip);
        let mut guard = self.writer.lock();
        let w = &mut *guard;
        let mut solicit = false;
        let idx = match self.find_w(want) {
            Some(idx) => {
                let word = self.slot_word(idx);
                let mac = word & MAC_MASK;
                match state_of(word) {
                    REACHABLE | DELAY | PROBE | PERMANENT => {
                        return Enqueue::Resolved(MacAddr::from_u64(mac))
                    }
                    STALE => {
                        self.to_delay(w, idx, mac, now);
                        return Enqueue::Resolved(MacAddr::from_u64(mac));
                    }
                    INCOMPLETE => idx,
                    _ => {
                        // FAILED: start over, as Linux's __neigh_event_send.
                        self.set_word(w, idx, 0, INCOMPLETE);
                        let m = &mut w.meta[idx];
                        m.updated = now;
                        m.probes = 0;
                        solicit = self.solicit(w, idx, now);
                        self.arm(w, idx, now.saturating_add(self.t.retrans), INCOMPLETE);
                        idx
                    }
                }
            }
            None => {
                let Some(idx) = self.alloc(w, want, now) else {
                    return Enqueue::Refused(Refusal::TableFull);
                };
                self.publish(w, idx, want, 0, INCOMPLETE, now);
                solicit = self.solicit(w, idx, now);
                self.arm(w, idx, now.saturating_add(self.t.retrans), INCOMPLETE);
                idx
            }
        };
        let (qlen, qbytes) = (self.cfg.unres_qlen, self.cfg.unres_qlen_bytes);
        let q = w.queues.entry(idx as u32).or_default();
        let mut dropped = Vec::new();
        while q.frames.len() >= qlen || q.bytes + frame.len() > qbytes {
            let Some(old) = q.frames.pop_front() else {
                break;
            };
            q.bytes -= old.len();
            dropped.push(old);
        }
        q.bytes += frame.len();
        q.frames.push_back(frame.to_vec());
        w.queued_now = w.queued_now + 1 - dropped.len();
        w.c.queued += 1;
        w.c.queue_overflow += dropped.len() as u64;
        Enqueue::Queued { solicit, dropped }
    }

    /// Learns from an ARP packet received on `iface` (see the module docs for the rules):
    /// operation `op` (a `u16`, an [`ArpOp`] or etherparse's `ArpOperation`), sender and
    /// target addresses; `target_is_local` says the target address is one of ours. Frames that
    /// were waiting for the sender are passed to `release`, oldest first, after the table's lock
    /// is released.
    #[allow(clippy::too_many_arguments)]
    pub fn input(
        &self,
        iface: u16,
        op: impl Into<ArpOp>,
        sender_ip: Ipv4Addr,
        sender_mac: MacAddr,
        target_ip: Ipv4Addr,
        target_is_local: bool,
        now: Instant,
        release: &mut dyn FnMut(Released),
    ) -> Learned {
        let op = op.into();
        if (op != ArpOp::REQUEST && op != ArpOp::REPLY)
            || !is_neighbour_addr(sender_ip)
            || !sender_mac.is_station()
        {
            return Learned::Ignored;
        }
        let garp = sender_ip == target_ip;
        if garp && target_is_local {
            // Someone claims one of our addresses: not a neighbour to learn.
            return Learned::Ignored;
        }
        let now = now.micros();
        let want = key_of(iface, sender_ip);
        let mac = sender_mac.to_u64();
        let mut out = Vec::new();
        let learned = {
            let mut guard = self.writer.lock();
            let w = &mut *guard;
            match self.find_w(want) {
                None => {
                    let create = (op == ArpOp::REQUEST && target_is_local)
                        || (garp && self.cfg.accept_gratuitous);
                    if !create {
                        Learned::Ignored
                    } else if let Some(idx) = self.alloc(w, want, now) {
                        self.publish(w, idx, want, mac, STALE, now);
                        self.stale_timers(w, idx, now);
                        Learned::Created
                    } else {
                        Learned::TableFull
                    }
                }
                Some(idx) => self.update(w, idx, op, garp, mac, now, &mut out),
            }
        };
        for r in out {
            release(r);
        }
        learned
    }

    /// Linux's `neigh_update` for an ARP from the neighbour in `idx` (lock held).
    #[allow(clippy::too_many_arguments)]
    fn update(
        &self,
        w: &mut Writer,
        idx: usize,
        op: ArpOp,
        garp: bool,
        mac: u64,
        now: u64,
        out: &mut Vec<Released>,
    ) -> Learned {
        let word = self.slot_word(idx);
        let old = state_of(word);
        if old == PERMANENT {
            return Learned::Permanent;
        }
        let old_mac = word & MAC_MASK;
        let old_valid = code_valid(old);
        let mac_changed = !old_valid || old_mac != mac;
        let overrides = garp || now > w.meta[idx].updated.saturating_add(self.t.locktime);
        if old_valid && mac_changed && !overrides {
            return Learned::Locked;
        }
        // Broadcast replies and requests do not confirm reachability (arp_process).
        let confirms = op == ArpOp::REPLY && !garp;
        let mut new = if confirms { REACHABLE } else { STALE };
        if confirms {
            let reach = self.draw_reach(w);
            let m = &mut w.meta[idx];
            m.confirmed = now;
            m.reach = reach;
        } else if mac_changed {
            w.meta[idx].confirmed = NEVER;
        }
        if old_valid && !mac_changed && new == STALE {
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
        } else if new == REACHABLE {
            self.to_reachable(w, idx, mac, now);
        } else {
            self.to_stale(w, idx, mac, now);
        }
        if !old_valid {
            if let Some(q) = w.queues.remove(&(idx as u32)) {
                let (iface, ip) = split_key(self.slot_key(idx));
                let n = q.frames.len();
                w.queued_now -= n;
                w.c.released += n as u64;
                let m = MacAddr::from_u64(mac);
                out.extend(q.frames.into_iter().map(|frame| Released {
                    iface,
                    ip,
                    mac: m,
                    frame,
                }));
                if new == STALE && n > 0 {
                    // Sending the released frames uses the STALE entry.
                    self.to_delay(w, idx, mac, now);
                }
            }
        }
        Learned::Updated
    }

    /// Does all work due at `now`: registers `DELAY` timers of entries readers marked, sends
    /// (through `out`) the requests due for `INCOMPLETE` and `PROBE` entries, moves
    /// `REACHABLE → STALE` and `DELAY → PROBE`, fails entries out of solicitations (their
    /// frames come out as [`NeighEvent::Unreachable`]) and collects garbage. Work is
    /// proportional to the timers due. `out` runs after the lock is released.
    pub fn poll(&self, now: Instant, out: &mut dyn FnMut(NeighEvent)) {
        let now = now.micros();
        let mut ev = Vec::new();
        {
            let mut guard = self.writer.lock();
            let w = &mut *guard;
            self.take_marks(w);
            while let Some(&Reverse((due, idx, tgen))) = w.timers.peek() {
                if due > now {
                    break;
                }
                w.timers.pop();
                let idx = idx as usize;
                if w.meta.get(idx).is_some_and(|m| m.tgen == tgen) {
                    self.fire(w, idx, now, &mut ev);
                }
            }
        }
        for e in ev {
            out(e);
        }
    }

    /// When [`NeighTable::poll`] next has work: the earliest timer, or the epoch (already due)
    /// while a reader's `STALE → DELAY` mark waits to be registered. `None`: nothing scheduled.
    pub fn poll_at(&self) -> Option<Instant> {
        if self.marked.0.load(Ordering::Acquire) {
            return Some(Instant::ZERO);
        }
        let mut guard = self.writer.lock();
        let w = &mut *guard;
        while let Some(&Reverse((due, idx, tgen))) = w.timers.peek() {
            if w.meta.get(idx as usize).is_some_and(|m| m.tgen == tgen) {
                return Some(Instant::from_micros(due));
            }
            w.timers.pop();
        }
        None
    }

    /// Adds or replaces a static (`PERMANENT`) entry: `ip` on `iface` is at `mac` until
    /// [`NeighTable::remove`]. Frames waiting for that neighbour are returned to be sent.
    pub fn add_static(
        &self,
        iface: u16,
        ip: Ipv4Addr,
        mac: MacAddr,
        now: Instant,
    ) -> Result<Vec<Released>, NeighError> {
        if !is_neighbour_addr(ip) {
            return Err(NeighError::BadAddress(ip));
        }
        if !mac.is_station() {
            return Err(NeighError::BadMac(mac));
        }
        let now = now.micros();
        let want = key_of(iface, ip);
        let m = mac.to_u64();
        let mut guard = self.writer.lock();
        let w = &mut *guard;
        let Some(idx) = self.find_w(want) else {
            let idx = self.alloc(w, want, now).ok_or(NeighError::TableFull)?;
            self.publish(w, idx, want, m, PERMANENT, now);
            return Ok(Vec::new());
        };
        self.set_word(w, idx, m, PERMANENT);
        self.disarm(w, idx);
        let meta = &mut w.meta[idx];
        meta.updated = now;
        meta.confirmed = NEVER;
        meta.probes = 0;
        let mut out = Vec::new();
        if let Some(q) = w.queues.remove(&(idx as u32)) {
            w.queued_now -= q.frames.len();
            w.c.released += q.frames.len() as u64;
            out.extend(q.frames.into_iter().map(|frame| Released {
                iface,
                ip,
                mac,
                frame,
            }));
        }
        Ok(out)
    }

    /// Removes the entry for `ip` on `iface`, static or not; frames waiting for it are
    /// discarded (counted in [`NeighCounters::queue_flushed`]). Returns whether there was one.
    pub fn remove(&self, iface: u16, ip: Ipv4Addr) -> bool {
        let mut guard = self.writer.lock();
        let w = &mut *guard;
        match self.find_w(key_of(iface, ip)) {
            Some(idx) => {
                let n = self.free(w, idx);
                w.c.queue_flushed += n as u64;
                true
            }
            None => false,
        }
    }

    /// Removes every non-static entry on `iface` (as `ip neigh flush dev`), discarding queued
    /// frames (counted). Returns how many entries went. O(table size).
    pub fn flush_iface(&self, iface: u16) -> usize {
        let mut guard = self.writer.lock();
        let w = &mut *guard;
        let mut n = 0;
        for idx in 0..self.buckets.len() * SLOTS {
            let k = self.slot_key(idx);
            if k >> 48 == 0 || split_key(k).0 != iface {
                continue;
            }
            if state_of(self.slot_word(idx)) == PERMANENT {
                continue;
            }
            let frames = self.free(w, idx);
            w.c.queue_flushed += frames as u64;
            n += 1;
        }
        n
    }

    /// Every entry, sorted by interface then address. O(table size).
    pub fn dump(&self, now: Instant) -> Vec<NeighEntry> {
        let now = now.micros();
        let w = self.writer.lock();
        let mut v = Vec::with_capacity(w.entries);
        for idx in 0..self.buckets.len() * SLOTS {
            let k = self.slot_key(idx);
            if k >> 48 == 0 {
                continue;
            }
            let word = self.slot_word(idx);
            let Some(state) = NeighState::from_code(state_of(word)) else {
                continue;
            };
            let m = &w.meta[idx];
            let (iface, ip) = split_key(k);
            let updated = if state == NeighState::Delay && m.armed != DELAY {
                // Marked by a reader, not yet seen by the writer.
                self.used[idx].load(Ordering::Relaxed)
            } else {
                m.updated
            };
            v.push(NeighEntry {
                iface,
                ip,
                mac: state.is_valid().then(|| MacAddr::from_u64(word)),
                state,
                confirmed_ago: (m.confirmed != NEVER)
                    .then(|| Duration::from_micros(now.saturating_sub(m.confirmed))),
                updated_ago: Duration::from_micros(now.saturating_sub(updated)),
                queued: w.queues.get(&(idx as u32)).map_or(0, |q| q.frames.len()),
            });
        }
        v.sort_by_key(|e| (e.iface, e.ip));
        v
    }

    /// Writes the table as `ip neigh show` does, one line per entry, with interface names
    /// from `ifname`.
    pub fn fmt_dump(
        &self,
        now: Instant,
        out: &mut impl fmt::Write,
        ifname: &dyn Fn(u16) -> String,
    ) -> fmt::Result {
        for e in self.dump(now) {
            writeln!(out, "{}", e.show(ifname))?;
        }
        Ok(())
    }

    /// The counters and the current number of entries and queued frames.
    pub fn counters(&self) -> NeighCounters {
        let w = self.writer.lock();
        NeighCounters {
            entries: w.entries,
            queued_now: w.queued_now,
            lookups_missed: self.misses.0.load(Ordering::Relaxed),
            ..w.c
        }
    }

    /// Bytes the table holds besides queued frames (fixed at creation, the timer and GC heaps
    /// aside).
    pub fn memory_bytes(&self) -> usize {
        let slots = self.buckets.len() * SLOTS;
        self.buckets.len() * std::mem::size_of::<Bucket>()
            + slots * (8 + std::mem::size_of::<Meta>())
            + self.marks.len() * 8
    }

    /// Checks the table's internal invariants (tests only).
    #[cfg(test)]
    fn check_invariants(&self) {
        let w = self.writer.lock();
        let mut n = 0;
        let mut queued = 0;
        for idx in 0..self.buckets.len() * SLOTS {
            let k = self.slot_key(idx);
            let word = self.slot_word(idx);
            if k >> 48 == 0 {
                assert!(!w.queues.contains_key(&(idx as u32)), "queue on empty slot");
                continue;
            }
            n += 1;
            assert_eq!(k >> 48, u64::from(w.meta[idx].gen));
            assert_eq!(
                word >> GEN_SHIFT,
                (k >> 48) & WORD_GEN_MASK,
                "word generation"
            );
            let st = state_of(word);
            assert!(NeighState::from_code(st).is_some());
            if let Some(q) = w.queues.get(&(idx as u32)) {
                assert_eq!(st, INCOMPLETE, "only INCOMPLETE entries queue");
                assert!(q.frames.len() <= self.cfg.unres_qlen);
                assert!(q.bytes <= self.cfg.unres_qlen_bytes);
                assert_eq!(q.bytes, q.frames.iter().map(Vec::len).sum::<usize>());
                queued += q.frames.len();
            }
            let armed = w.meta[idx].armed;
            match st {
                PERMANENT => assert_eq!(armed, 0),
                DELAY => assert!(armed == DELAY || armed == STALE || armed == PROBE),
                _ => assert_eq!(armed, st, "every dynamic entry has its timer"),
            }
        }
        assert_eq!(n, w.entries);
        assert!(w.entries <= self.cfg.gc_thresh3);
        assert_eq!(queued, w.queued_now);
        let c = &w.c;
        assert_eq!(
            c.queued,
            c.released + c.queue_overflow + c.queue_failed + c.queue_flushed + queued as u64
        );
    }
}

#[inline]
fn split_key(k: u64) -> (u16, Ipv4Addr) {
    (((k >> 32) & 0xffff) as u16, Ipv4Addr::from(k as u32))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::{BTreeMap, HashSet};
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    const CNI0: u16 = 1;
    const GW: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 1);

    fn ip(n: u16) -> Ipv4Addr {
        Ipv4Addr::new(10, 244, (n >> 8) as u8, n as u8)
    }
    fn mac(n: u32) -> MacAddr {
        MacAddr::local(n)
    }
    fn ms(v: u64) -> Instant {
        Instant::from_millis(v)
    }
    fn s(v: u64) -> Instant {
        Instant::from_secs(v)
    }
    fn table() -> NeighTable {
        NeighTable::new(NeighConfig::default())
    }
    fn poll(t: &NeighTable, now: Instant) -> Vec<NeighEvent> {
        let mut v = Vec::new();
        t.poll(now, &mut |e| v.push(e));
        t.check_invariants();
        v
    }
    /// An ARP packet's fields, for the tests.
    #[derive(Clone, Copy)]
    struct Arp {
        op: ArpOp,
        sender_ip: Ipv4Addr,
        sender_mac: MacAddr,
        target_ip: Ipv4Addr,
    }
    fn show(t: &NeighTable, now: Instant, name: &str) -> String {
        let mut s = String::new();
        t.fmt_dump(now, &mut s, &|_| name.to_string()).unwrap();
        s
    }
    fn reply(from: Ipv4Addr, m: MacAddr) -> Arp {
        Arp {
            op: ArpOp::REPLY,
            sender_ip: from,
            sender_mac: m,
            target_ip: GW,
        }
    }
    fn request(from: Ipv4Addr, m: MacAddr, to: Ipv4Addr) -> Arp {
        Arp {
            op: ArpOp::REQUEST,
            sender_ip: from,
            sender_mac: m,
            target_ip: to,
        }
    }
    fn input(t: &NeighTable, arp: Arp, local: bool, now: Instant) -> (Learned, Vec<Released>) {
        let mut v = Vec::new();
        let (op, sip, smac, tip) = (arp.op, arp.sender_ip, arp.sender_mac, arp.target_ip);
        let l = t.input(CNI0, op, sip, smac, tip, local, now, &mut |r| v.push(r));
        t.check_invariants();
        (l, v)
    }
    fn state(t: &NeighTable, a: Ipv4Addr, now: Instant) -> Option<NeighState> {
        t.dump(now)
            .into_iter()
            .find(|e| e.iface == CNI0 && e.ip == a)
            .map(|e| e.state)
    }
    fn queued(e: Enqueue) -> (bool, Vec<Vec<u8>>) {
        match e {
            Enqueue::Queued { solicit, dropped } => (solicit, dropped),
            other => panic!("not queued: {other:?}"),
        }
    }
    fn bcast(a: Ipv4Addr) -> NeighEvent {
        NeighEvent::Solicit {
            iface: CNI0,
            ip: a,
            unicast: None,
        }
    }
    fn ucast(a: Ipv4Addr, m: MacAddr) -> NeighEvent {
        NeighEvent::Solicit {
            iface: CNI0,
            ip: a,
            unicast: Some(m),
        }
    }

    /// A REACHABLE entry for `a` at `mac(7)`, resolved at time 0.
    fn resolved(t: &NeighTable, a: Ipv4Addr) {
        let _ = t.enqueue(CNI0, a, b"x", s(0));
        input(t, reply(a, mac(7)), true, s(0));
        assert_eq!(state(t, a, s(0)), Some(NeighState::Reachable));
    }

    /// Polls every 100 ms from `from` to `to` (inclusive), collecting events with their time.
    fn run(t: &NeighTable, from: u64, to: u64) -> Vec<(u64, NeighEvent)> {
        let mut v = Vec::new();
        let mut now = from;
        while now <= to {
            for e in poll(t, ms(now)) {
                v.push((now, e));
            }
            now += 100;
        }
        v
    }

    #[test]
    fn table_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<NeighTable>();
    }

    #[test]
    fn incomplete_sends_three_requests_then_fails_and_hands_out_frames() {
        let t = table();
        let a = ip(2);
        assert_eq!(t.lookup(CNI0, a, s(0)), None);
        assert_eq!(queued(t.enqueue(CNI0, a, b"one", s(0))), (true, vec![]));
        assert_eq!(queued(t.enqueue(CNI0, a, b"two", ms(300))), (false, vec![]));
        assert_eq!(state(&t, a, s(0)), Some(NeighState::Incomplete));
        assert_eq!(t.lookup(CNI0, a, ms(400)), None, "INCOMPLETE is not usable");
        assert_eq!(t.poll_at(), Some(s(1)));
        let ev = run(&t, 0, 3500);
        assert_eq!(
            ev,
            vec![
                (1000, bcast(a)),
                (2000, bcast(a)),
                (
                    3000,
                    NeighEvent::Unreachable {
                        iface: CNI0,
                        ip: a,
                        frame: b"one".to_vec()
                    }
                ),
                (
                    3000,
                    NeighEvent::Unreachable {
                        iface: CNI0,
                        ip: a,
                        frame: b"two".to_vec()
                    }
                ),
            ]
        );
        assert_eq!(state(&t, a, s(4)), Some(NeighState::Failed));
        assert_eq!(t.lookup(CNI0, a, s(4)), None);
        let c = t.counters();
        assert_eq!(
            (c.requests, c.failed, c.queue_failed, c.queued_now),
            (3, 1, 2, 0)
        );
        assert_eq!(c.lookups_missed, 3);
        assert_eq!(
            show(&t, s(4), "cni0"),
            "10.244.0.2 dev cni0  FAILED\n",
            "ip neigh show style"
        );
        // The next frame restarts resolution at once.
        assert_eq!(queued(t.enqueue(CNI0, a, b"three", s(5))), (true, vec![]));
        assert_eq!(state(&t, a, s(5)), Some(NeighState::Incomplete));
        assert_eq!(t.poll_at(), Some(s(6)));
    }

    #[test]
    fn reply_releases_queued_frames_in_order() {
        let t = table();
        let a = ip(3);
        for (i, f) in [b"f0", b"f1", b"f2"].iter().enumerate() {
            let (req, _) = queued(t.enqueue(CNI0, a, *f, ms(i as u64 * 100)));
            assert_eq!(req, i == 0);
        }
        let (l, rel) = input(&t, reply(a, mac(3)), true, ms(500));
        assert_eq!(l, Learned::Updated);
        let frames: Vec<_> = rel.iter().map(|r| r.frame.clone()).collect();
        assert_eq!(frames, vec![b"f0".to_vec(), b"f1".to_vec(), b"f2".to_vec()]);
        assert!(rel
            .iter()
            .all(|r| r.mac == mac(3) && r.ip == a && r.iface == CNI0));
        assert_eq!(state(&t, a, s(1)), Some(NeighState::Reachable));
        assert_eq!(t.lookup(CNI0, a, s(1)), Some(mac(3)));
        // No more requests once resolved.
        assert!(run(&t, 600, 10_000).is_empty());
        let c = t.counters();
        assert_eq!((c.queued, c.released, c.queued_now), (3, 3, 0));
        assert_eq!(
            show(&t, s(1), "if1"),
            "10.244.0.3 dev if1 lladdr 02:00:00:00:00:03 REACHABLE\n"
        );
    }

    #[test]
    fn reachable_goes_stale_after_the_randomized_reachable_time() {
        let t = table();
        let a = ip(4);
        resolved(&t, a);
        let ev = run(&t, 0, 14_900);
        assert!(ev.is_empty());
        assert_eq!(state(&t, a, ms(14_900)), Some(NeighState::Reachable));
        run(&t, 15_000, 45_000);
        assert_eq!(state(&t, a, s(45)), Some(NeighState::Stale));
        // STALE is still usable.
        assert_eq!(t.lookup(CNI0, a, s(46)), Some(mac(7)));

        // Reachable times are spread over [15 s, 45 s) and reproducible per seed.
        let draws = |seed| {
            let t = NeighTable::new(NeighConfig {
                seed,
                ..NeighConfig::default()
            });
            let mut w = t.writer.lock();
            (0..1000).map(|_| t.draw_reach(&mut w)).collect::<Vec<_>>()
        };
        let d = draws(1);
        assert_eq!(d, draws(1));
        assert_ne!(d, draws(2));
        assert!(d.iter().all(|&r| (15_000_000..45_000_000).contains(&r)));
        assert!(d.iter().any(|&r| r < 20_000_000) && d.iter().any(|&r| r > 40_000_000));
    }

    #[test]
    fn reply_confirmations_extend_reachable_without_new_timers() {
        let t = table();
        let a = ip(5);
        resolved(&t, a);
        for sec in (10..200).step_by(10) {
            assert_eq!(
                input(&t, reply(a, mac(7)), true, s(sec)).0,
                Learned::Confirmed
            );
            poll(&t, s(sec));
            assert_eq!(state(&t, a, s(sec)), Some(NeighState::Reachable));
        }
        assert!(t.writer.lock().timers.len() <= 2);
    }

    /// STALE at 50 s, used at `used` (in ms).
    fn stale_then_used(t: &NeighTable, a: Ipv4Addr, used: u64) {
        resolved(t, a);
        run(t, 0, 50_000);
        assert_eq!(state(t, a, s(50)), Some(NeighState::Stale));
        assert_eq!(t.lookup(CNI0, a, ms(used)), Some(mac(7)));
        assert_eq!(
            state(t, a, ms(used)),
            Some(NeighState::Delay),
            "reader marked it"
        );
        assert_eq!(t.poll_at(), Some(Instant::ZERO), "mark pending");
        poll(t, ms(used));
        assert_eq!(t.poll_at(), Some(ms(used + 5000)));
    }

    #[test]
    fn used_stale_goes_delay_then_probe_then_fails() {
        let t = table();
        let a = ip(6);
        stale_then_used(&t, a, 60_000);
        let ev = run(&t, 60_000, 70_000);
        assert_eq!(
            ev,
            vec![
                (65_000, ucast(a, mac(7))),
                (66_000, ucast(a, mac(7))),
                (67_000, ucast(a, mac(7))),
            ]
        );
        assert_eq!(state(&t, a, s(70)), Some(NeighState::Failed));
        assert_eq!(t.lookup(CNI0, a, s(70)), None);
        assert_eq!(t.counters().failed, 1);
    }

    #[test]
    fn probe_answered_goes_back_to_reachable() {
        let t = table();
        let a = ip(7);
        stale_then_used(&t, a, 60_000);
        let ev = run(&t, 60_000, 65_500);
        assert_eq!(ev, vec![(65_000, ucast(a, mac(7)))]);
        assert_eq!(state(&t, a, ms(65_500)), Some(NeighState::Probe));
        assert_eq!(
            t.lookup(CNI0, a, ms(65_500)),
            Some(mac(7)),
            "PROBE is usable"
        );
        assert_eq!(
            input(&t, reply(a, mac(7)), true, ms(65_600)).0,
            Learned::Updated
        );
        assert_eq!(state(&t, a, ms(65_600)), Some(NeighState::Reachable));
        assert!(run(&t, 65_700, 75_000).is_empty(), "no more probes");
    }

    #[test]
    fn delay_rescued_by_a_reply_sends_no_probe() {
        let t = table();
        let a = ip(8);
        stale_then_used(&t, a, 60_000);
        input(&t, reply(a, mac(7)), true, s(62));
        assert_eq!(state(&t, a, s(62)), Some(NeighState::Reachable));
        assert!(run(&t, 62_000, 70_000).is_empty());
    }

    #[test]
    fn delay_is_not_rescued_by_a_request_from_the_neighbour() {
        // As Linux: a request refreshes, it does not confirm reachability.
        let t = table();
        let a = ip(9);
        stale_then_used(&t, a, 60_000);
        assert_eq!(
            input(&t, request(a, mac(7), GW), true, s(61)).0,
            Learned::Unchanged
        );
        assert_eq!(state(&t, a, s(61)), Some(NeighState::Delay));
        assert_eq!(run(&t, 61_000, 65_000), vec![(65_000, ucast(a, mac(7)))]);
    }

    #[test]
    fn stale_used_through_enqueue_goes_delay_too() {
        let t = table();
        let a = ip(10);
        resolved(&t, a);
        run(&t, 0, 50_000);
        assert_eq!(t.enqueue(CNI0, a, b"y", s(51)), Enqueue::Resolved(mac(7)));
        assert_eq!(state(&t, a, s(51)), Some(NeighState::Delay));
        assert_eq!(t.poll_at(), Some(s(56)));
    }

    #[test]
    fn queue_is_bounded_and_drops_the_oldest() {
        let t = table();
        let a = ip(11);
        let mut dropped = Vec::new();
        for i in 0..105u32 {
            let (_, d) = queued(t.enqueue(CNI0, a, &i.to_be_bytes(), s(0)));
            dropped.extend(d);
        }
        let want: Vec<Vec<u8>> = (0..4u32).map(|i| i.to_be_bytes().to_vec()).collect();
        assert_eq!(dropped, want, "oldest first");
        let c = t.counters();
        assert_eq!((c.queued_now, c.queue_overflow), (101, 4));
        let (_, rel) = input(&t, reply(a, mac(11)), true, s(0));
        assert_eq!(rel.len(), 101);
        assert_eq!(rel[0].frame, 4u32.to_be_bytes());
        assert_eq!(rel[100].frame, 104u32.to_be_bytes());

        // The byte bound.
        let t = NeighTable::new(NeighConfig {
            unres_qlen_bytes: 1000,
            ..NeighConfig::default()
        });
        for i in 0..3u8 {
            assert!(queued(t.enqueue(CNI0, a, &[i; 300], s(0))).1.is_empty());
        }
        let (_, d) = queued(t.enqueue(CNI0, a, &[9; 300], s(0)));
        assert_eq!(d, vec![vec![0u8; 300]]);
        let (_, d) = queued(t.enqueue(CNI0, a, &[8; 1000], s(0)));
        assert_eq!(d.len(), 3, "a big frame pushes out several");
        assert_eq!(
            t.enqueue(CNI0, a, &[0; 1001], s(0)),
            Enqueue::Refused(Refusal::FrameTooBig)
        );
        t.check_invariants();
    }

    #[test]
    fn static_entries_are_immune_to_arp_and_time() {
        let t = table();
        let a = ip(12);
        assert!(t.add_static(CNI0, a, mac(12), s(0)).unwrap().is_empty());
        assert_eq!(t.lookup(CNI0, a, s(0)), Some(mac(12)));
        assert_eq!(
            input(&t, reply(a, mac(99)), true, s(5)).0,
            Learned::Permanent
        );
        assert_eq!(
            input(&t, request(a, mac(99), a), false, s(6)).0,
            Learned::Permanent,
            "gratuitous ARP too"
        );
        assert!(run(&t, 0, 1000).is_empty());
        poll(&t, s(100_000));
        assert_eq!(t.lookup(CNI0, a, s(100_000)), Some(mac(12)));
        assert_eq!(
            show(&t, s(1), "cni0"),
            "10.244.0.12 dev cni0 lladdr 02:00:00:00:00:0c PERMANENT\n"
        );
        assert_eq!(t.enqueue(CNI0, a, b"z", s(1)), Enqueue::Resolved(mac(12)));
        assert_eq!(t.poll_at(), None);
        assert_eq!(t.flush_iface(CNI0), 0, "flush keeps static entries");
        assert!(t.remove(CNI0, a));
        assert_eq!(t.lookup(CNI0, a, s(1)), None);
        assert!(!t.remove(CNI0, a));

        // A static entry for a neighbour being resolved releases its frames.
        let _ = t.enqueue(CNI0, a, b"w", s(2));
        let rel = t.add_static(CNI0, a, mac(13), s(2)).unwrap();
        assert_eq!(rel.len(), 1);
        assert_eq!((rel[0].mac, &rel[0].frame[..]), (mac(13), &b"w"[..]));
        assert!(
            run(&t, 2000, 10_000).is_empty(),
            "no requests for it any more"
        );
        t.check_invariants();

        assert_eq!(
            t.add_static(CNI0, Ipv4Addr::BROADCAST, mac(1), s(0)),
            Err(NeighError::BadAddress(Ipv4Addr::BROADCAST))
        );
        assert_eq!(
            t.add_static(CNI0, a, MacAddr::BROADCAST, s(0)),
            Err(NeighError::BadMac(MacAddr::BROADCAST))
        );
    }

    #[test]
    fn gratuitous_arp_updates_and_locktime_holds_other_changes() {
        let t = table();
        let a = ip(13);
        resolved(&t, a);
        // Within locktime, a reply with another MAC is ignored...
        assert_eq!(
            input(&t, reply(a, mac(8)), true, ms(500)).0,
            Learned::Locked
        );
        assert_eq!(t.lookup(CNI0, a, ms(500)), Some(mac(7)));
        // ...but a gratuitous ARP overrides at once, as STALE.
        let garp = request(a, mac(8), a);
        assert_eq!(input(&t, garp, false, ms(600)).0, Learned::Updated);
        assert_eq!(t.lookup(CNI0, a, ms(600)), Some(mac(8)));
        // After locktime a reply with a new MAC is taken and confirms.
        assert_eq!(input(&t, reply(a, mac(9)), true, s(2)).0, Learned::Updated);
        assert_eq!(state(&t, a, s(2)), Some(NeighState::Reachable));
        assert_eq!(t.lookup(CNI0, a, s(2)), Some(mac(9)));

        // Unknown sender: created from a gratuitous ARP (default), as STALE...
        let b = ip(14);
        let garp_reply = Arp {
            op: ArpOp::REPLY,
            ..request(b, mac(14), b)
        };
        assert_eq!(input(&t, garp_reply, false, s(3)).0, Learned::Created);
        assert_eq!(state(&t, b, s(3)), Some(NeighState::Stale));
        // ...but not with accept_gratuitous off, nor from an unsolicited reply.
        let t2 = NeighTable::new(NeighConfig {
            accept_gratuitous: false,
            ..NeighConfig::default()
        });
        assert_eq!(input(&t2, garp_reply, false, s(3)).0, Learned::Ignored);
        assert_eq!(
            input(&t, reply(ip(15), mac(15)), true, s(3)).0,
            Learned::Ignored
        );
        // ARP probes (sender 0.0.0.0), bad MACs and claims on our own address teach nothing.
        let probe = request(Ipv4Addr::UNSPECIFIED, mac(16), ip(16));
        assert_eq!(input(&t, probe, true, s(3)).0, Learned::Ignored);
        let bad = request(ip(17), MacAddr::BROADCAST, GW);
        assert_eq!(input(&t, bad, true, s(3)).0, Learned::Ignored);
        assert_eq!(
            input(&t, request(GW, mac(18), GW), true, s(3)).0,
            Learned::Ignored
        );
        assert_eq!(t.counters().entries, 2);
    }

    #[test]
    fn requests_to_us_create_stale_entries() {
        let t = table();
        let a = ip(20);
        assert_eq!(
            input(&t, request(a, mac(20), GW), true, s(1)).0,
            Learned::Created
        );
        assert_eq!(state(&t, a, s(1)), Some(NeighState::Stale));
        // A request for someone else from an unknown sender teaches nothing.
        assert_eq!(
            input(&t, request(ip(21), mac(21), ip(22)), false, s(1)).0,
            Learned::Ignored
        );
        // A request from a REACHABLE neighbour with the same MAC leaves it REACHABLE.
        let b = ip(23);
        resolved(&t, b);
        assert_eq!(
            input(&t, request(b, mac(7), GW), true, s(1)).0,
            Learned::Unchanged
        );
        assert_eq!(state(&t, b, s(1)), Some(NeighState::Reachable));
        // A request from a neighbour being resolved releases its frames (and uses the entry).
        let c = ip(24);
        let _ = t.enqueue(CNI0, c, b"q", s(1));
        let (l, rel) = input(&t, request(c, mac(24), ip(99)), false, s(1));
        assert_eq!((l, rel.len()), (Learned::Updated, 1));
        assert_eq!(state(&t, c, s(1)), Some(NeighState::Delay));
        // An unused STALE entry is collected after gc_stale_time once above gc_thresh1 only.
        run(&t, 1000, 70_000);
        assert_eq!(
            state(&t, a, s(70)),
            Some(NeighState::Stale),
            "below gc_thresh1"
        );
    }

    #[test]
    fn the_limit_holds_under_a_flood_and_gc_collects_failed_first() {
        let cfg = NeighConfig {
            request_rate: 1_000_000,
            request_burst: 1_000_000,
            ..NeighConfig::default()
        };
        let t = NeighTable::new(cfg);
        for i in 0..4u16 {
            t.add_static(CNI0, ip(60_000 + i), mac(1), s(0)).unwrap();
        }
        let mut refused = 0;
        for i in 0..3000u16 {
            match t.enqueue(CNI0, ip(i + 1), b"p", ms(u64::from(i) / 2)) {
                Enqueue::Refused(Refusal::TableFull) => refused += 1,
                Enqueue::Queued { .. } => {}
                other => panic!("{other:?}"),
            }
            assert!(t.counters().entries <= 1024);
        }
        t.check_invariants();
        assert_eq!(refused, 3000 - 1020);
        assert_eq!(t.counters().refused, refused);
        // The INCOMPLETE entries fail; their frames come out as unreachable.
        let ev = run(&t, 100, 4000);
        let unreachable = ev
            .iter()
            .filter(|(_, e)| matches!(e, NeighEvent::Unreachable { .. }))
            .count();
        assert_eq!(unreachable, 1020);
        assert_eq!(t.counters().entries, 1024);
        // A new neighbour: forced GC takes FAILED entries down below gc_thresh2.
        let _ = queued(t.enqueue(CNI0, ip(5000), b"p", ms(4001)));
        let c = t.counters();
        assert_eq!(c.entries, 512);
        assert_eq!(c.gc, 513);
        // Another flood keeps within the limit, and static entries were never collected.
        for i in 0..3000u16 {
            let _ = t.enqueue(CNI0, ip(10_000 + i), b"p", ms(5000));
            assert!(t.counters().entries <= 1024);
        }
        for i in 0..4u16 {
            assert_eq!(t.lookup(CNI0, ip(60_000 + i), s(5)), Some(mac(1)));
        }
        // FAILED entries are also removed by their own timers, down to gc_thresh1.
        run(&t, 5000, 30_000);
        let c = t.counters();
        assert!((4..128).contains(&c.entries), "{c:?}");
        for i in 0..4u16 {
            assert_eq!(t.lookup(CNI0, ip(60_000 + i), s(30)), Some(mac(1)));
        }
    }

    #[test]
    fn forced_gc_takes_idle_stale_entries_but_not_active_ones() {
        let cfg = NeighConfig {
            gc_thresh1: 8,
            gc_thresh2: 8,
            gc_thresh3: 10,
            ..NeighConfig::default()
        };
        let t = NeighTable::new(cfg);
        // Ten STALE entries learned from requests to us.
        for i in 0..10u16 {
            input(&t, request(ip(i + 1), mac(u32::from(i)), GW), true, s(0));
        }
        assert_eq!(
            t.enqueue(CNI0, ip(100), b"p", s(10)),
            Enqueue::Refused(Refusal::TableFull),
            "STALE but not idle for gc_stale_time"
        );
        // Entry 1 is used (DELAY, then PROBE...): not collectable.
        assert!(t.lookup(CNI0, ip(1), s(59)).is_some());
        poll(&t, s(59));
        let _ = queued(t.enqueue(CNI0, ip(100), b"p", s(61)));
        let c = t.counters();
        assert_eq!(c.entries, 8);
        assert_eq!(c.gc, 3);
        assert!(state(&t, ip(1), s(61)).is_some(), "the used entry stays");
        t.check_invariants();
    }

    #[test]
    fn requests_are_rate_limited_across_the_table() {
        let cfg = NeighConfig {
            request_rate: 10,
            request_burst: 5,
            ..NeighConfig::default()
        };
        let t = NeighTable::new(cfg);
        let sent = (0..20u16)
            .filter(|&i| queued(t.enqueue(CNI0, ip(i + 1), b"p", s(0))).0)
            .count();
        assert_eq!(sent, 5);
        assert_eq!(t.counters().rate_limited, 15);
        // One second later the bucket is full again (5 tokens): 5 of the 20 retries go out.
        let ev = poll(&t, s(1));
        assert_eq!(ev.len(), 5);
        let c = t.counters();
        assert_eq!((c.requests, c.rate_limited), (10, 30));
        // 100 ms buys one token.
        assert!(queued(t.enqueue(CNI0, ip(500), b"p", ms(1100))).0);
        assert!(!queued(t.enqueue(CNI0, ip(501), b"p", ms(1100))).0);
        // Every unresolved neighbour still fails on time, its frame handed out.
        let ev = run(&t, 1200, 4100);
        let unreachable = ev
            .iter()
            .filter(|(_, e)| matches!(e, NeighEvent::Unreachable { .. }))
            .count();
        assert_eq!(unreachable, 22);
    }

    #[test]
    fn flush_and_remove_discard_queued_frames_counted() {
        let t = table();
        let _ = t.enqueue(CNI0, ip(1), b"a", s(0));
        let _ = t.enqueue(CNI0, ip(1), b"b", s(0));
        let _ = t.enqueue(2, ip(1), b"c", s(0));
        let _ = t.enqueue(CNI0, ip(2), b"d", s(0));
        t.add_static(CNI0, ip(3), mac(3), s(0)).unwrap();
        assert_eq!(t.flush_iface(CNI0), 2);
        let c = t.counters();
        assert_eq!((c.entries, c.queue_flushed, c.queued_now), (2, 3, 1));
        assert!(t.remove(2, ip(1)));
        assert_eq!(t.counters().queue_flushed, 4);
        assert!(
            run(&t, 0, 5000).is_empty(),
            "timers of removed entries are dead"
        );
        t.check_invariants();
    }

    #[test]
    fn config_validation_names_the_field() {
        let bad = |f: fn(&mut NeighConfig)| {
            let mut c = NeighConfig::default();
            f(&mut c);
            match c.validate() {
                Err(NeighError::Config { field, .. }) => field,
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(bad(|c| c.retrans_time = Duration::ZERO), "retrans_time");
        assert_eq!(bad(|c| c.gc_thresh3 = 100), "gc_thresh2");
        assert_eq!(bad(|c| c.gc_thresh1 = 600), "gc_thresh1");
        assert_eq!(bad(|c| c.mcast_solicit = 0), "mcast_solicit");
        assert_eq!(bad(|c| c.gc_thresh3 = MAX_ENTRIES + 1), "gc_thresh3");
        let c = NeighConfig {
            retrans_time: Duration::ZERO,
            ..NeighConfig::default()
        };
        assert_eq!(
            c.validate().unwrap_err().to_string(),
            "invalid neighbour config: retrans_time = 0ns: must be positive"
        );
        assert!(NeighTable::try_new(c).is_err());
        assert!(NeighConfig::default().validate().is_ok());
    }

    #[test]
    fn bad_next_hops_are_refused() {
        let t = table();
        for a in [
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::BROADCAST,
            Ipv4Addr::new(224, 0, 0, 1),
        ] {
            assert_eq!(
                t.enqueue(CNI0, a, b"p", s(0)),
                Enqueue::Refused(Refusal::BadAddress)
            );
        }
        assert_eq!(t.counters().entries, 0);
    }

    /// MAC of `ip` on `iface`, version `v`: readers can check a MAC belongs to its key.
    fn keyed_mac(iface: u16, a: Ipv4Addr, v: u8) -> MacAddr {
        let o = a.octets();
        MacAddr([
            0x02,
            ((iface as u8) << 4) | (v & 0xf),
            o[0],
            o[1],
            o[2],
            o[3],
        ])
    }

    #[test]
    fn concurrent_readers_never_see_a_torn_or_foreign_mac() {
        let cfg = NeighConfig {
            gc_thresh1: 16,
            gc_thresh2: 32,
            gc_thresh3: 48,
            base_reachable_time: Duration::from_secs(4),
            gc_stale_time: Duration::from_secs(2),
            locktime: Duration::ZERO,
            request_rate: 1_000_000,
            request_burst: 1_000_000,
            ..NeighConfig::default()
        };
        let t = Arc::new(NeighTable::new(cfg));
        let clock = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let readers: Vec<_> = (0..3)
            .map(|r: u64| {
                let (t, clock, stop) = (t.clone(), clock.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut hits = 0u64;
                    let mut i: u64 = r;
                    while !stop.load(Ordering::Relaxed) {
                        i = i.wrapping_add(7);
                        let iface = (i % 2) as u16;
                        let a = ip((i % 80) as u16 + 1);
                        let now = Instant::from_micros(clock.load(Ordering::Relaxed));
                        if let Some(m) = t.lookup(iface, a, now) {
                            let o = a.octets();
                            assert_eq!(m.0[0], 0x02);
                            assert_eq!(u16::from(m.0[1] >> 4), iface, "MAC of another iface");
                            assert_eq!(m.0[2..], o[..], "MAC of another address");
                            hits += 1;
                        }
                    }
                    hits
                })
            })
            .collect();
        let mut rng = 1u64;
        for step in 0..150_000u64 {
            let now_us = step * 10_000;
            clock.store(now_us, Ordering::Relaxed);
            let now = Instant::from_micros(now_us);
            let x = splitmix64(&mut rng);
            let iface = (x % 2) as u16;
            let a = ip(((x >> 8) % 80) as u16 + 1);
            let v = (x >> 16) as u8;
            match (x >> 24) % 16 {
                0..=2 => {
                    let _ = t.enqueue(iface, a, b"frame", now);
                }
                3 | 4 => {
                    let m = keyed_mac(iface, a, v);
                    t.input(iface, ArpOp::REPLY, a, m, GW, true, now, &mut |_| {});
                }
                7 | 8 => {
                    let m = keyed_mac(iface, a, v);
                    t.input(iface, ArpOp::REQUEST, a, m, a, false, now, &mut |_| {});
                }
                9 => {
                    t.remove(iface, a);
                }
                10 if (x >> 40) % 16 == 0 => {
                    let _ = t.add_static(iface, a, keyed_mac(iface, a, v), now);
                }
                _ => t.poll(now, &mut |_| {}),
            }
            if step % 10_000 == 0 {
                t.flush_iface(iface);
            }
        }
        stop.store(true, Ordering::Relaxed);
        let hits: u64 = readers.into_iter().map(|r| r.join().unwrap()).sum();
        t.check_invariants();
        let c = t.counters();
        assert!(c.entries <= 48);
        // The churn went through every kind of change while the readers ran.
        assert!(
            hits > 0 && c.released > 0 && c.failed > 0 && c.gc > 0 && c.refused > 0,
            "{c:?}"
        );
    }

    #[derive(Debug, Clone)]
    enum Op {
        Enqueue(u8, u8, u8),
        Lookup(u8, u8),
        Reply(u8, u8, u8),
        Request(u8, u8, u8, bool),
        Garp(u8, u8, u8),
        Tick(u16),
        Poll,
        Static(u8, u8, u8),
        Remove(u8, u8),
        Flush(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        let k = || (0u8..2, 0u8..24);
        prop_oneof![
            6 => (k(), 1u8..200).prop_map(|((i, a), l)| Op::Enqueue(i, a, l)),
            4 => k().prop_map(|(i, a)| Op::Lookup(i, a)),
            3 => (k(), 0u8..4).prop_map(|((i, a), v)| Op::Reply(i, a, v)),
            2 => (k(), 0u8..4, any::<bool>()).prop_map(|((i, a), v, l)| Op::Request(i, a, v, l)),
            1 => (k(), 0u8..4).prop_map(|((i, a), v)| Op::Garp(i, a, v)),
            4 => (0u16..8000).prop_map(Op::Tick),
            3 => Just(Op::Poll),
            1 => (k(), 0u8..4).prop_map(|((i, a), v)| Op::Static(i, a, v)),
            1 => k().prop_map(|(i, a)| Op::Remove(i, a)),
            1 => (0u8..2).prop_map(Op::Flush),
        ]
    }

    /// A frame that carries its own id (4 bytes) and destination (iface, address index).
    fn frame(id: u32, iface: u8, a: u8, len: u8) -> Vec<u8> {
        let mut f = id.to_be_bytes().to_vec();
        f.extend([iface, a]);
        f.resize(f.len().max(usize::from(len)), 0xee);
        f
    }
    fn frame_id(f: &[u8]) -> u32 {
        u32::from_be_bytes([f[0], f[1], f[2], f[3]])
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        /// Random operations keep the bounds, never panic, and every queued frame is released,
        /// handed out as unreachable, or dropped and reported, in order per neighbour.
        #[test]
        fn random_operations_keep_invariants_and_account_for_every_frame(
            ops in proptest::collection::vec(op(), 1..250)
        ) {
            let cfg = NeighConfig {
                gc_thresh1: 4,
                gc_thresh2: 8,
                gc_thresh3: 12,
                unres_qlen: 3,
                unres_qlen_bytes: 400,
                request_rate: 5,
                request_burst: 3,
                ..NeighConfig::default()
            };
            let t = NeighTable::new(cfg);
            let addr = |a: u8| Ipv4Addr::new(10, 0, 0, a + 1);
            let kmac = |i: u8, a: u8, v: u8| keyed_mac(u16::from(i), addr(a), v);
            let mut now = 0u64;
            let mut next_id = 0u32;
            // Queued frames not yet accounted for: id -> (iface, addr).
            let mut pending: BTreeMap<u32, (u8, u8)> = BTreeMap::new();
            let mut done: HashSet<u32> = HashSet::new();
            let mut last_released: HashMap<(u16, Ipv4Addr), u32> = HashMap::new();
            let mut account = |id: u32, pending: &mut BTreeMap<u32, (u8, u8)>| {
                prop_assert!(pending.remove(&id).is_some(), "frame {} accounted twice", id);
                prop_assert!(done.insert(id));
                Ok(())
            };
            for o in ops {
                let ti = Instant::from_millis(now);
                let mut released = Vec::new();
                match o {
                    Op::Enqueue(i, a, len) => {
                        let f = frame(next_id, i, a, len);
                        match t.enqueue(u16::from(i), addr(a), &f, ti) {
                            Enqueue::Queued { dropped, .. } => {
                                pending.insert(next_id, (i, a));
                                for d in dropped {
                                    prop_assert_eq!((d[4], d[5]), (i, a));
                                    account(frame_id(&d), &mut pending)?;
                                }
                            }
                            Enqueue::Resolved(m) => prop_assert_eq!(&m.0[2..], &addr(a).octets()[..]),
                            Enqueue::Refused(r) => prop_assert_eq!(r, Refusal::TableFull),
                        }
                        next_id += 1;
                    }
                    Op::Lookup(i, a) => {
                        if let Some(m) = t.lookup(u16::from(i), addr(a), ti) {
                            prop_assert_eq!(&m.0[2..], &addr(a).octets()[..]);
                            prop_assert_eq!(m.0[1] >> 4, i);
                        }
                    }
                    Op::Reply(i, a, v) | Op::Request(i, a, v, _) | Op::Garp(i, a, v) => {
                        let (op, target, local) = match o {
                            Op::Reply(..) => (ArpOp::REPLY, GW, true),
                            Op::Request(.., l) => (ArpOp::REQUEST, GW, l),
                            _ => (ArpOp::REQUEST, addr(a), false),
                        };
                        let m = kmac(i, a, v);
                        t.input(u16::from(i), op, addr(a), m, target, local, ti, &mut |r| released.push(r));
                    }
                    Op::Tick(d) => now += u64::from(d),
                    Op::Poll => {
                        let mut ev = Vec::new();
                        t.poll(ti, &mut |e| ev.push(e));
                        for e in ev {
                            if let NeighEvent::Unreachable { iface, ip, frame } = e {
                                prop_assert_eq!((u16::from(frame[4]), addr(frame[5])), (iface, ip));
                                account(frame_id(&frame), &mut pending)?;
                            }
                        }
                    }
                    Op::Static(i, a, v) => {
                        if let Ok(r) = t.add_static(u16::from(i), addr(a), kmac(i, a, v), ti) {
                            released = r;
                        }
                    }
                    Op::Remove(i, a) => {
                        let before = t.counters().queue_flushed;
                        t.remove(u16::from(i), addr(a));
                        let gone = t.counters().queue_flushed - before;
                        let ids: Vec<u32> = pending.iter().filter(|(_, &k)| k == (i, a)).map(|(&id, _)| id).collect();
                        prop_assert_eq!(gone, ids.len() as u64);
                        for id in ids { account(id, &mut pending)?; }
                    }
                    Op::Flush(i) => {
                        let before = t.counters().queue_flushed;
                        t.flush_iface(u16::from(i));
                        let gone = t.counters().queue_flushed - before;
                        let ids: Vec<u32> = pending.iter().filter(|(_, k)| k.0 == i).map(|(&id, _)| id).collect();
                        // Static entries of the iface have no queue, so every frame of the iface went.
                        prop_assert_eq!(gone, ids.len() as u64);
                        for id in ids { account(id, &mut pending)?; }
                    }
                }
                for r in released {
                    let id = frame_id(&r.frame);
                    prop_assert_eq!((u16::from(r.frame[4]), addr(r.frame[5])), (r.iface, r.ip));
                    prop_assert_eq!(&r.mac.0[2..], &r.ip.octets()[..]);
                    if let Some(&prev) = last_released.get(&(r.iface, r.ip)) {
                        prop_assert!(prev < id, "released in order");
                    }
                    last_released.insert((r.iface, r.ip), id);
                    account(id, &mut pending)?;
                }
                t.check_invariants();
                let c = t.counters();
                prop_assert!(c.entries <= 12);
                prop_assert_eq!(c.queued_now, pending.len());
                prop_assert!(c.queued_now <= 12 * 3);
            }
            // Run time forward: every waiting frame comes out as unreachable.
            let mut ev = Vec::new();
            for k in 1..=10 {
                t.poll(Instant::from_millis(now + k * 1000), &mut |e| ev.push(e));
            }
            for e in ev {
                if let NeighEvent::Unreachable { frame, .. } = e {
                    account(frame_id(&frame), &mut pending)?;
                }
            }
            prop_assert!(pending.is_empty(), "frames never accounted for: {:?}", pending);
            t.check_invariants();
        }
    }
}
