//! The neighbour cache, ARP's (IPv4) and NDP's (IPv6, see `ndp.rs`): next-hop address to
//! MAC, with the state machine of Linux's neighbour subsystem (`net/core/neighbour.c`,
//! `net/ipv4/arp.c`).
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
//! `gc_thresh3` slots (at most 25% load), every key hashed with per-table random secrets to two
//! candidate buckets (the crate's seeded two-choice hash, shared with the FDB and conntrack; a
//! new entry goes into the emptier one). A slot is two atomics:
//!
//! * `key = gen << 48 | iface << 32 | ipv4` (gen 0: empty slot), and
//! * `word = gen13 << 51 | state << 48 | mac`: MAC and state in one `AtomicU64`, so a reader
//!   never sees a torn MAC or a MAC with another entry's state. The state's three bits are
//!   decoded into a [`NeighState`] (or "empty") right after the load and encoded right before
//!   the store; nothing else handles state codes.
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
//! # Layout
//!
//! * this file: the public API ([`NeighTable`]) and what it hands back;
//! * `config.rs`: [`NeighConfig`] and [`NeighError`];
//! * `state.rs`: [`NeighState`], its encoding in a slot's packed word (decoded once, at the
//!   atomic load) and the transitions (ARP input, timer expiry);
//! * `slots.rs`: the lock-free bucket storage, lookups, placement and garbage collection;
//! * `timers.rs`: the timer and forced-GC heaps, and readers' `STALE → DELAY` marks;
//! * `requests.rs`: the request rate limit and the per-neighbour queues of waiting frames.
//! * `ndp.rs`: the IPv6 table ([`NeighTable<Ipv6Addr>`](NeighTable)): addresses interned as
//!   32-bit slot addresses, and NDP input mapped onto the ARP rules.
//!
//! # Example
//!
//! ```
//! use std::net::Ipv4Addr;
//! use tapyard::IfaceId;
//! use tapyard::l3::neigh::{ArpHeard, ArpOp, Enqueue, NeighConfig, NeighEvent, NeighTable};
//! use tapyard::{Instant, MacAddr};
//!
//! let table = NeighTable::new(NeighConfig::default());
//! let (cni0, pod, gw) = (IfaceId(1), Ipv4Addr::new(10, 244, 1, 2), Ipv4Addr::new(10, 244, 1, 1));
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
//! let reply = ArpHeard {
//!     op: ArpOp::REPLY,
//!     sender_ip: pod,
//!     sender_mac: mac,
//!     target_ip: gw,
//!     target_is_local: true,
//! };
//! table.input(cni0, reply, now, &mut |r| out.push(r));
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
use std::collections::{BinaryHeap, HashMap};
use std::fmt;
use std::hash::Hash;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use crate::base::IfaceId;
use crate::hash::SeededHash;
use crate::stats::counter_set;
use crate::time::Instant;
use crate::wire::mac::MacAddr;

mod config;
mod ndp;
mod requests;
mod slots;
mod state;
#[cfg(test)]
mod tests;
mod timers;

pub use config::{NeighConfig, NeighError, MAX_ENTRIES};
pub use ndp::Advert;
pub use state::NeighState;

use requests::{Queue, TokenBucket};
use slots::{key_of, occupied, split_key, Bucket, Padded, SLOTS};
use state::{decode, mac_of};

/// "Never confirmed".
const NEVER: u64 = u64::MAX;

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

/// What [`NeighTable::input`] learns from in an ARP packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ArpHeard {
    /// The operation (a request or a reply; others are ignored).
    pub op: ArpOp,
    /// The sender's address.
    pub sender_ip: Ipv4Addr,
    /// The sender's MAC.
    pub sender_mac: MacAddr,
    /// The target address.
    pub target_ip: Ipv4Addr,
    /// The target address is one of ours.
    pub target_is_local: bool,
}

/// A frame that waited for resolution and may now be sent to `mac`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Released<A = Ipv4Addr> {
    /// The interface the neighbour is on.
    pub iface: IfaceId,
    /// The neighbour (next-hop) address.
    pub ip: A,
    /// Its MAC: the frame's destination.
    pub mac: MacAddr,
    /// The frame, as given to [`NeighTable::enqueue`].
    pub frame: Vec<u8>,
}

/// Work for the caller produced by [`NeighTable::poll`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NeighEvent<A = Ipv4Addr> {
    /// Send an ARP request (IPv6: a Neighbor Solicitation) for `ip` out of `iface`: broadcast
    /// (IPv6: to its solicited-node group) when `unicast` is `None` (resolution), else to that
    /// MAC (a reachability probe of a `PROBE` entry).
    Solicit {
        /// The interface.
        iface: IfaceId,
        /// The address asked for.
        ip: A,
        /// The destination MAC of a unicast probe.
        unicast: Option<MacAddr>,
    },
    /// Resolution of `ip` failed and `frame` was waiting for it: answer its source with ICMP
    /// host unreachable (ICMPv6 address unreachable) and drop it
    /// ([`crate::DropReason::NeighFailed`]).
    Unreachable {
        /// The interface.
        iface: IfaceId,
        /// The neighbour that did not answer.
        ip: A,
        /// The frame, as given to [`NeighTable::enqueue`].
        frame: Vec<u8>,
    },
}

/// One row of [`NeighTable::dump`], like a line of `ip -s neigh show`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct NeighEntry<A = Ipv4Addr> {
    /// The interface.
    pub iface: IfaceId,
    /// The neighbour's address.
    pub ip: A,
    /// Its MAC, for states that have a usable one.
    pub mac: Option<MacAddr>,
    /// The state.
    pub state: NeighState,
    /// Time since the last confirmation (ARP reply, solicited Neighbor Advertisement); `None`
    /// if never confirmed.
    pub confirmed_ago: Option<Duration>,
    /// Time since the entry's state or MAC last changed.
    pub updated_ago: Duration,
    /// Frames waiting for resolution.
    pub queued: usize,
}

impl<A: fmt::Display> NeighEntry<A> {
    /// An `ip neigh show` line (without newline), with interface names from `ifname`:
    /// `10.244.1.2 dev cni0 lladdr 02:00:00:00:00:02 REACHABLE`, `10.244.1.9 dev cni0  FAILED`.
    pub fn show<F, S>(&self, ifname: F) -> ShowNeigh<'_, F, A>
    where
        F: Fn(IfaceId) -> S,
        S: fmt::Display,
    {
        ShowNeigh {
            entry: self,
            ifname,
        }
    }
}

/// Displays a [`NeighEntry`] as `ip neigh show` does (see [`NeighEntry::show`]).
pub struct ShowNeigh<'a, F, A = Ipv4Addr> {
    entry: &'a NeighEntry<A>,
    ifname: F,
}

impl<F, A: fmt::Debug> fmt::Debug for ShowNeigh<'_, F, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShowNeigh")
            .field("entry", self.entry)
            .finish_non_exhaustive()
    }
}

impl<F, S, A: fmt::Display> fmt::Display for ShowNeigh<'_, F, A>
where
    F: Fn(IfaceId) -> S,
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

counter_set! {
    /// Counters of the table, read with [`NeighTable::counters`].
    ///
    /// Frames add up: `queued = released + queue_overflow + queue_failed + queue_flushed +
    /// queued_now`.
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct NeighCounters {
        extra {
            /// Entries in the table now (static ones included).
            pub entries: usize,
            /// Frames waiting for resolution now, over all neighbours.
            pub queued_now: usize,
        }
        /// Lookups that found no usable entry.
        lookups_missed,
        /// Entries created (static ones included).
        created,
        /// New entries refused because the table was full and nothing could be collected.
        refused,
        /// Entries removed by garbage collection.
        gc,
        /// Entries that went to `FAILED`.
        failed,
        /// ARP requests the table asked its caller to send.
        requests,
        /// ARP requests the table wanted to send but the rate limit refused.
        rate_limited,
        /// Frames queued to wait for resolution.
        queued,
        /// Queued frames released to be sent after resolution.
        released,
        /// Queued frames pushed out of a full queue (handed back by [`NeighTable::enqueue`]).
        queue_overflow,
        /// Queued frames handed out as [`NeighEvent::Unreachable`].
        queue_failed,
        /// Queued frames discarded with their entry by [`NeighTable::remove`] or
        /// [`NeighTable::flush_iface`].
        queue_flushed,
    }
}

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
    /// The state the live timer was armed for (`None`: no timer).
    armed: Option<NeighState>,
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
            armed: None,
            gc_seq: 0,
        }
    }
}

/// Everything only the writer touches (behind the table's mutex).
struct Writer {
    entries: usize,
    meta: Vec<Meta>,
    queues: HashMap<u32, Queue>,
    queued_now: usize,
    timers: timers::Heap,
    /// `FAILED` and `STALE` entries by the time they become collectable (failure; last use +
    /// `gc_stale_time`), as (time, slot, gc sequence): forced GC takes them oldest first.
    gc_heap: timers::Heap,
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

/// An address family the neighbour table resolves: [`Ipv4Addr`] (ARP), [`Ipv6Addr`](std::net::Ipv6Addr)
/// (NDP). Sealed.
pub trait NeighAddr: Copy + Ord + fmt::Display + Into<IpAddr> + sealed::Sealed {
    /// The address of a released frame or failed resolution whose neighbour is gone.
    #[doc(hidden)]
    const GONE: Self;
    /// How the table finds the 32-bit slot address of a neighbour address (IPv4: the
    /// address itself; IPv6: an interned id, see `ndp.rs`).
    #[doc(hidden)]
    type Ids: Send + Sync;
    /// The ids of a table of `cfg`.
    #[doc(hidden)]
    fn ids(cfg: &NeighConfig) -> Self::Ids;
    /// True for an address that can be a neighbour (IPv4: not unspecified, broadcast or
    /// multicast; IPv6: not unspecified, multicast or loopback).
    #[doc(hidden)]
    fn is_neighbour(self) -> bool;
    /// The slot address of `ip`, if it has one.
    #[doc(hidden)]
    fn slot_addr(t: &NeighTable<Self>, ip: Self) -> Option<Ipv4Addr>;
    /// The slot address of `ip`, made if new; `None`: no room.
    #[doc(hidden)]
    fn intern(t: &NeighTable<Self>, ip: Self, now: Instant) -> Option<Ipv4Addr>;
    /// The address of a slot address.
    #[doc(hidden)]
    fn addr(t: &NeighTable<Self>, slot: Ipv4Addr) -> Option<Self>;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for std::net::Ipv4Addr {}
    impl Sealed for std::net::Ipv6Addr {}
}

impl NeighAddr for Ipv4Addr {
    const GONE: Ipv4Addr = Ipv4Addr::UNSPECIFIED;
    type Ids = ();
    fn ids(_: &NeighConfig) {}
    #[inline]
    fn is_neighbour(self) -> bool {
        !(self.is_unspecified() || self.is_broadcast() || self.is_multicast())
    }
    #[inline(always)]
    fn slot_addr(_: &NeighTable<Self>, ip: Ipv4Addr) -> Option<Ipv4Addr> {
        Some(ip)
    }
    #[inline(always)]
    fn intern(_: &NeighTable<Self>, ip: Ipv4Addr, _: Instant) -> Option<Ipv4Addr> {
        Some(ip)
    }
    #[inline(always)]
    fn addr(_: &NeighTable<Self>, slot: Ipv4Addr) -> Option<Ipv4Addr> {
        Some(slot)
    }
}

fn is_neighbour_addr(ip: Ipv4Addr) -> bool {
    ip.is_neighbour()
}

/// The neighbour cache of a router, for the family `A` (see the module docs): ARP's for
/// [`Ipv4Addr`], NDP's for [`Ipv6Addr`](std::net::Ipv6Addr) (see `ndp.rs`: the same table,
/// keyed by an id per IPv6 address).
pub struct NeighTable<A: NeighAddr = Ipv4Addr> {
    buckets: Box<[Bucket]>,
    /// Per slot: when a reader marked the entry `STALE → DELAY`.
    used: Box<[AtomicU64]>,
    /// Per slot: a reader marked the entry and the writer has not seen it yet.
    marks: Box<[AtomicU64]>,
    marked: Padded<AtomicBool>,
    misses: Padded<AtomicU64>,
    mask: usize,
    hash: SeededHash,
    cfg: NeighConfig,
    t: Times,
    writer: Mutex<Writer>,
    ids: A::Ids,
}

impl<A: NeighAddr> fmt::Debug for NeighTable<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NeighTable")
            .field("limit", &self.cfg.gc_thresh3)
            .field("slots", &self.slots())
            .field("counters", &self.counters())
            .finish()
    }
}

impl<A: NeighAddr> NeighTable<A> {
    /// A table with `cfg`. Memory is allocated once: four slots (16 bytes each, plus per-slot
    /// writer state) per entry of `gc_thresh3`.
    ///
    /// # Panics
    /// If `cfg` does not pass [`NeighConfig::validate`]; see [`NeighTable::try_new`].
    pub fn new(cfg: NeighConfig) -> NeighTable<A> {
        match NeighTable::try_new(cfg) {
            Ok(t) => t,
            Err(e) => panic!("{e}"),
        }
    }

    /// A table with `cfg`, or the first configuration error.
    pub fn try_new(cfg: NeighConfig) -> Result<NeighTable<A>, NeighError> {
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
            bucket: TokenBucket::new(cfg.request_rate, cfg.request_burst),
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
            hash: SeededHash::random(),
            ids: A::ids(&cfg),
            cfg,
            t,
            writer: Mutex::new(writer),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &NeighConfig {
        &self.cfg
    }

    /// The MAC to send to `ip` on `iface`, if its entry is usable (`REACHABLE`, `STALE`,
    /// `DELAY`, `PROBE`, `PERMANENT`). Lock-free; a `STALE` entry is marked for `DELAY` with at
    /// most one compare-and-swap. On `None` the caller calls [`NeighTable::enqueue`].
    #[inline]
    pub fn lookup(&self, iface: IfaceId, ip: A, now: Instant) -> Option<MacAddr> {
        if let Some((idx, w)) =
            A::slot_addr(self, ip).and_then(|slot| self.find_live(key_of(iface, slot)))
        {
            match decode(w) {
                Some(
                    NeighState::Reachable
                    | NeighState::Delay
                    | NeighState::Probe
                    | NeighState::Permanent,
                ) => return Some(MacAddr::from_u64(w)),
                Some(NeighState::Stale) => {
                    self.mark_used(idx, w, now.micros());
                    return Some(MacAddr::from_u64(w));
                }
                Some(NeighState::Incomplete | NeighState::Failed) | None => {}
            }
        }
        self.misses.0.fetch_add(1, Ordering::Relaxed);
        None
    }

    /// The state and MAC of the entry for `ip` on `iface`, without marking it used.
    pub fn peek(&self, iface: IfaceId, ip: A) -> Option<(NeighState, MacAddr)> {
        let slot = A::slot_addr(self, ip)?;
        let (_, w) = self.find_live(key_of(iface, slot))?;
        Some((decode(w)?, MacAddr::from_u64(w)))
    }

    /// Queues a copy of `frame` for `ip` on `iface`, whose lookup missed. Creates an
    /// `INCOMPLETE` entry if there is none (collecting garbage or refusing when the table is
    /// full) and restarts resolution of a `FAILED` one. The per-neighbour queue holds at most
    /// `unres_qlen` frames and `unres_qlen_bytes` bytes; older frames are pushed out first and
    /// handed back. If the entry became usable since the lookup, nothing is queued and the MAC
    /// is returned.
    pub fn enqueue(&self, iface: IfaceId, ip: A, frame: &[u8], now: Instant) -> Enqueue {
        if !ip.is_neighbour() {
            return Enqueue::Refused(Refusal::BadAddress);
        }
        if frame.len() > self.cfg.unres_qlen_bytes {
            return Enqueue::Refused(Refusal::FrameTooBig);
        }
        let Some(ip) = A::intern(self, ip, now) else {
            return Enqueue::Refused(Refusal::TableFull);
        };
        let now = now.micros();
        let want = key_of(iface, ip);
        let mut guard = self.writer.lock();
        let w = &mut *guard;
        let mut solicit = false;
        let idx = match self.find_w(want) {
            Some(idx) => {
                let word = self.slot_word(idx);
                match decode(word) {
                    Some(
                        NeighState::Reachable
                        | NeighState::Delay
                        | NeighState::Probe
                        | NeighState::Permanent,
                    ) => return Enqueue::Resolved(MacAddr::from_u64(word)),
                    Some(NeighState::Stale) => {
                        self.to_delay(w, idx, mac_of(word), now);
                        return Enqueue::Resolved(MacAddr::from_u64(word));
                    }
                    Some(NeighState::Incomplete) => idx,
                    // FAILED (an occupied slot always has a state): start over, as Linux's
                    // __neigh_event_send.
                    Some(NeighState::Failed) | None => {
                        self.set_word(w, idx, 0, NeighState::Incomplete);
                        let m = &mut w.meta[idx];
                        m.updated = now;
                        m.probes = 0;
                        solicit = self.to_incomplete(w, idx, now);
                        idx
                    }
                }
            }
            None => {
                let Some(idx) = self.alloc(w, want, now) else {
                    return Enqueue::Refused(Refusal::TableFull);
                };
                self.publish(w, idx, want, 0, NeighState::Incomplete, now);
                solicit = self.to_incomplete(w, idx, now);
                idx
            }
        };
        let dropped = w.push_frame(idx, frame, self.cfg.unres_qlen, self.cfg.unres_qlen_bytes);
        Enqueue::Queued { solicit, dropped }
    }

    /// [`NeighTable::input`] with slot addresses (NDP's input maps onto it, see `ndp.rs`).
    fn input_slot(
        &self,
        iface: IfaceId,
        arp: ArpHeard,
        now: Instant,
        release: &mut dyn FnMut(Released),
    ) -> Learned {
        let ArpHeard {
            op,
            sender_ip,
            sender_mac,
            target_ip,
            target_is_local,
        } = arp;
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
                        self.publish(w, idx, want, mac, NeighState::Stale, now);
                        self.stale_timers(w, idx, now);
                        Learned::Created
                    } else {
                        Learned::TableFull
                    }
                }
                Some(idx) => {
                    let heard = state::Heard {
                        mac,
                        reply: op == ArpOp::REPLY,
                        garp,
                    };
                    self.update(w, idx, heard, now, &mut out)
                }
            }
        };
        for r in out {
            release(r);
        }
        learned
    }

    /// Linux's `neigh_update` with `NEIGH_UPDATE_F_WEAK_OVERRIDE` and without
    /// `NEIGH_UPDATE_F_OVERRIDE`, for a different MAC than the entry's (an NDP advertisement
    /// without the override flag): a `REACHABLE` entry becomes `STALE`, keeping its MAC (so the
    /// next use probes it); any other state is left as it is. `true` when it changed.
    fn weaken(&self, iface: IfaceId, ip: Ipv4Addr, now: Instant) -> bool {
        let now = now.micros();
        let mut guard = self.writer.lock();
        let w = &mut *guard;
        let Some(idx) = self.find_w(key_of(iface, ip)) else {
            return false;
        };
        let word = self.slot_word(idx);
        if decode(word) != Some(NeighState::Reachable) {
            return false;
        }
        self.to_stale(w, idx, mac_of(word), now);
        true
    }

    /// Does all work due at `now`: registers `DELAY` timers of entries readers marked, sends
    /// (through `out`) the requests due for `INCOMPLETE` and `PROBE` entries, moves
    /// `REACHABLE → STALE` and `DELAY → PROBE`, fails entries out of solicitations (their
    /// frames come out as [`NeighEvent::Unreachable`]) and collects garbage. Work is
    /// proportional to the timers due. `out` runs after the lock is released.
    pub fn poll(&self, now: Instant, out: &mut dyn FnMut(NeighEvent<A>)) {
        let mut ev = Vec::new();
        self.run_due(&mut self.writer.lock(), now.micros(), &mut ev);
        for e in ev {
            match e {
                NeighEvent::Solicit { iface, ip, unicast } => {
                    if let Some(ip) = A::addr(self, ip) {
                        out(NeighEvent::Solicit { iface, ip, unicast });
                    }
                }
                NeighEvent::Unreachable { iface, ip, frame } => {
                    let ip = A::addr(self, ip).unwrap_or(A::GONE);
                    out(NeighEvent::Unreachable { iface, ip, frame });
                }
            }
        }
    }

    /// A released frame with its neighbour's address.
    fn released(&self, r: Released) -> Released<A> {
        Released {
            iface: r.iface,
            ip: A::addr(self, r.ip).unwrap_or(A::GONE),
            mac: r.mac,
            frame: r.frame,
        }
    }

    /// When [`NeighTable::poll`] next has work: the earliest timer, or the epoch (already due)
    /// while a reader's `STALE → DELAY` mark waits to be registered. `None`: nothing scheduled.
    pub fn poll_at(&self) -> Option<Instant> {
        if self.marked.0.load(Ordering::Acquire) {
            return Some(Instant::ZERO);
        }
        self.next_due(&mut self.writer.lock())
            .map(Instant::from_micros)
    }

    /// Adds or replaces a static (`PERMANENT`) entry: `ip` on `iface` is at `mac` until
    /// [`NeighTable::remove`]. Frames waiting for that neighbour are returned to be sent.
    pub fn add_static(
        &self,
        iface: IfaceId,
        ip: A,
        mac: MacAddr,
        now: Instant,
    ) -> Result<Vec<Released<A>>, NeighError> {
        if !ip.is_neighbour() {
            return Err(NeighError::BadAddress(ip.into()));
        }
        if !mac.is_station() {
            return Err(NeighError::BadMac(mac));
        }
        let ip = A::intern(self, ip, now).ok_or(NeighError::TableFull)?;
        let now = now.micros();
        let want = key_of(iface, ip);
        let m = mac.to_u64();
        let mut guard = self.writer.lock();
        let w = &mut *guard;
        let Some(idx) = self.find_w(want) else {
            let idx = self.alloc(w, want, now).ok_or(NeighError::TableFull)?;
            self.publish(w, idx, want, m, NeighState::Permanent, now);
            return Ok(Vec::new());
        };
        self.set_word(w, idx, m, NeighState::Permanent);
        self.disarm(w, idx);
        let meta = &mut w.meta[idx];
        meta.updated = now;
        meta.confirmed = NEVER;
        meta.probes = 0;
        let mut out = Vec::new();
        self.release(w, idx, mac, &mut out);
        drop(guard);
        Ok(out.into_iter().map(|r| self.released(r)).collect())
    }

    /// Removes the entry for `ip` on `iface`, static or not; frames waiting for it are
    /// discarded (counted in [`NeighCounters::queue_flushed`]). Returns whether there was one.
    pub fn remove(&self, iface: IfaceId, ip: A) -> bool {
        let Some(ip) = A::slot_addr(self, ip) else {
            return false;
        };
        let mut guard = self.writer.lock();
        let w = &mut *guard;
        match self.find_w(key_of(iface, ip)) {
            Some(idx) => {
                self.flush(w, idx);
                true
            }
            None => false,
        }
    }

    /// Removes every non-static entry on `iface` (as `ip neigh flush dev`), discarding queued
    /// frames (counted). Returns how many entries went. O(table size).
    pub fn flush_iface(&self, iface: IfaceId) -> usize {
        let mut guard = self.writer.lock();
        let w = &mut *guard;
        let mut n = 0;
        for idx in 0..self.slots() {
            let k = self.slot_key(idx);
            if !occupied(k) || split_key(k).0 != iface.0 {
                continue;
            }
            match decode(self.slot_word(idx)) {
                Some(NeighState::Permanent) => {}
                Some(
                    NeighState::Incomplete
                    | NeighState::Reachable
                    | NeighState::Stale
                    | NeighState::Delay
                    | NeighState::Probe
                    | NeighState::Failed,
                )
                | None => {
                    self.flush(w, idx);
                    n += 1;
                }
            }
        }
        n
    }

    /// Removes the entry in `idx` on request, its queued frames counted as flushed.
    fn flush(&self, w: &mut Writer, idx: usize) {
        let frames = self.free(w, idx);
        w.c.queue_flushed += frames as u64;
    }

    /// Every entry, sorted by interface then address. O(table size).
    pub fn dump(&self, now: Instant) -> Vec<NeighEntry<A>> {
        let mut v: Vec<NeighEntry<A>> = self
            .dump_slots(now)
            .into_iter()
            .filter_map(|e| {
                Some(NeighEntry {
                    iface: e.iface,
                    ip: A::addr(self, e.ip)?,
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

    /// Every entry by its slot address.
    fn dump_slots(&self, now: Instant) -> Vec<NeighEntry> {
        let now = now.micros();
        let w = self.writer.lock();
        let mut v = Vec::with_capacity(w.entries);
        for idx in 0..self.slots() {
            let k = self.slot_key(idx);
            let word = self.slot_word(idx);
            let Some(state) = self.slot_state(idx) else {
                continue;
            };
            let m = &w.meta[idx];
            let (iface, ip) = split_key(k);
            let updated = if state == NeighState::Delay && m.armed != Some(NeighState::Delay) {
                // Marked by a reader, not yet seen by the writer.
                self.last_used(idx)
            } else {
                m.updated
            };
            v.push(NeighEntry {
                iface: IfaceId(iface),
                ip,
                mac: state.is_valid().then(|| MacAddr::from_u64(word)),
                state,
                confirmed_ago: (m.confirmed != NEVER)
                    .then(|| Duration::from_micros(now.saturating_sub(m.confirmed))),
                updated_ago: Duration::from_micros(now.saturating_sub(updated)),
                queued: w
                    .queues
                    .get(&slots::slot_key(idx))
                    .map_or(0, |q| q.frames.len()),
            });
        }
        v.sort_by_key(|e| (e.iface, e.ip));
        v
    }

    /// Writes the table as `ip neigh show` (`ip -6 neigh show`) does, one line per entry, with interface names
    /// from `ifname`.
    pub fn fmt_dump(
        &self,
        now: Instant,
        out: &mut impl fmt::Write,
        ifname: &dyn Fn(IfaceId) -> String,
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
        self.buckets.len() * std::mem::size_of::<Bucket>()
            + self.slots() * (8 + std::mem::size_of::<Meta>())
            + self.marks.len() * 8
    }
}

impl NeighTable<Ipv4Addr> {
    /// Learns from an ARP packet received on `iface` (see the module docs for the rules):
    /// its operation, sender and target addresses, and whether the target address is one of
    /// ours ([`ArpHeard`]). Frames that were waiting for the sender are passed to `release`,
    /// oldest first, after the table's lock is released.
    pub fn input(
        &self,
        iface: IfaceId,
        arp: ArpHeard,
        now: Instant,
        release: &mut dyn FnMut(Released),
    ) -> Learned {
        self.input_slot(iface, arp, now, release)
    }
}
