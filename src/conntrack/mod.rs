//! Connection tracking, as Linux's nf_conntrack: one entry per connection on a bounded,
//! lock-free flow table.
//!
//! An entry holds the connection's ORIGINAL tuple (as its first packet travelled) and its REPLY
//! tuple (what the other end's packets look like when they come back). Without NAT the reply
//! tuple is `orig.invert()`; a NAT is expressed by a reply tuple that differs from it: a DNAT
//! of `client -> ClusterIP:80` to `endpoint:8080` has the reply `endpoint:8080 -> client`. An
//! entry is found from either tuple, and [`CtHit::dir`] says which direction matched.
//!
//! ```
//! use std::net::Ipv4Addr;
//! use tapyard::conntrack::{tcp::flags, Conntrack, CtConfig, CtState, CtTag, Dir, Pkt, Track};
//! use tapyard::wire::family::IpProto;
//! use tapyard::wire::tuple::{L4Kind, Tuple};
//! use tapyard::Instant;
//!
//! let ct = Conntrack::new(CtConfig::default()).unwrap();
//! let orig = Tuple {
//!     src: Ipv4Addr::new(10, 244, 1, 2), dst: Ipv4Addr::new(10, 96, 0, 10),
//!     sport: 40000, dport: 80, proto: IpProto::TCP.number(), zone: 0,
//! };
//! // DNAT to an endpoint: the reply comes from 10.244.1.3:8080.
//! let reply = Tuple { src: Ipv4Addr::new(10, 244, 1, 3), sport: 8080, ..orig.invert() };
//! let syn = Pkt { kind: L4Kind::Tcp, tcp_flags: flags::SYN, len: 60 };
//! let now = Instant::from_secs(1);
//! assert!(ct.lookup(&orig, now).is_none());
//! let hit = ct.insert(orig, reply, CtTag::default(), &syn, now).unwrap();
//! assert_eq!(hit.state, CtState::SynSent);
//! // The endpoint's SYN-ACK is found from the reply side.
//! let back = ct.lookup(&reply, now).unwrap();
//! assert_eq!((back.id, back.dir), (hit.id, Dir::Reply));
//! let synack = Pkt { tcp_flags: flags::SYN | flags::ACK, ..syn };
//! assert_eq!(ct.track(&back, &synack, now), Track::Ok(CtState::SynRecv));
//! ```
//!
//! # What is tracked
//!
//! * **TCP**: Linux's state table (`tcp_conntracks`, SYN_SENT2 included) is ported as is, see
//!   [`tcp`]. An invalid transition is [`Track::Invalid`] (counted), an "ignore" cell is
//!   [`Track::Ignored`]. RST moves to CLOSE (10 s); a RST before any reply deletes the entry
//!   at once ([`Track::Closed`]), as Linux does. A SYN on a TIME_WAIT or CLOSE connection
//!   deletes it and returns [`Track::Reopen`]: the caller inserts the new connection (Linux
//!   re-creates it the same way; unlike Linux we do not first check that the close was seen).
//!   A new connection needs a pure SYN; with [`CtConfig::liberal`] (Linux's
//!   `nf_conntrack_tcp_loose`) a packet whose class is ACK (no SYN/FIN/RST) is picked up as
//!   ESTABLISHED, exactly the packets Linux picks up. ASSURED is set when the connection
//!   reaches ESTABLISHED from SYN_RECV or ESTABLISHED after a reply was seen (the handshake's
//!   last ACK). **Window and sequence tracking is not done** (as if `nf_conntrack_tcp_be_liberal`
//!   were set), nor the retransmission/unacknowledged-data timeouts.
//! * **UDP**: 30 s until a packet follows the first reply, then 120 s and ASSURED (Linux's
//!   `udp_packet`: the reply itself sets SEEN_REPLY and refreshes to 30 s).
//! * **ICMP echo**: keyed by identifier, created by a request only, 30 s. Requests must travel
//!   in the original direction and replies in the reply direction. An ICMP error for a tracked
//!   connection is [`Track::Related`] and changes nothing.
//! * **Other protocols**: 600 s.
//!
//! An entry's timeout is a function of its protocol, TCP state and status, counted from its
//! last refresh. A packet that changes the state or status refreshes it exactly; other packets
//! refresh it at most once per [`REFRESH`] (1 s), so an idle entry can expire up to 1 s before
//! the timeout after its last packet (the shortest timeout is 10 s). Invalid and ignored packets
//! neither refresh nor count.
//!
//! # Design
//!
//! * An **entry array** of `max_entries` entries, allocated once. An entry is a 64-byte line of
//!   atomics (control word, both tuples, last refresh, mark/service, endpoint) read by lookups,
//!   plus 32 bytes of per-direction packet/byte counters in a separate array, so that counting
//!   packets does not dirty the line that lookups read.
//! * An **index** of 64-byte buckets of eight `(signature, entry, direction)` words, holding
//!   both tuples of every entry. A tuple hashes (seeded with a per-table random key, so a remote
//!   peer cannot aim at a bucket) to two candidate buckets. It goes into the first while half
//!   of that is free, else into the emptier of the two; there are four index words per
//!   entry, so the index is at most half full, and a hit usually costs one bucket line and one
//!   entry line. [`Conntrack::locate`] hashes once; a batch is looked up in three passes,
//!   as DPDK's bulk lookup does: [`Conntrack::prefetch`] brings both buckets of every tuple in,
//!   [`Conntrack::prefetch_entry`] then reads the signatures there and brings their entries in,
//!   and [`Conntrack::lookup_loc`] finds both lines in cache.
//! * Free entries are on a lock-free stack (a Treiber stack with a tagged head).
//! * Memory: 64 + 32 bytes per entry plus 32 to 64 bytes of index per entry (the bucket count
//!   is rounded up to a power of two): 128 bytes per connection when `max_entries` is a power
//!   of two, as the default 262144 is (32 MiB); see [`Conntrack::memory_bytes`]. Each of the
//!   three arrays that takes 2 MiB or more is allocated on a 2 MiB boundary (its size rounded
//!   up to a multiple of 2 MiB) and advised `MADV_HUGEPAGE` before it is first written, so with
//!   transparent huge pages enabled (`always` or `madvise`) the kernel backs it with 2 MiB
//!   pages: the default table is 16 huge pages instead of 8192 small ones, so lookups at random
//!   in it need few TLB entries (without THP the allocation is an ordinary one).
//!
//! # Thread-safety contract and memory reclamation
//!
//! A [`Conntrack`] is shared by all workers through `&self`. **No operation takes a lock or
//! waits for another thread**: lookups, tracking, inserts, removes, sweeps and dumps are
//! made of atomic loads, stores and compare-and-swaps (CAS) only; a CAS that loses a race
//! retries a bounded or progress-guaranteed number of times.
//!
//! * **Generations.** An entry's control word holds a 32-bit generation, its life stage
//!   (FREE, BUSY, PENDING, LIVE, DYING, ABORTED), TCP state and status bits. Freeing an entry
//!   bumps its generation. A [`CtId`] is (entry, generation), and every mutation through a
//!   [`CtHit`] or [`CtId`] (state changes, removal) CASes the control word against the
//!   generation it expects, so it can never change a reused entry. The counters and the
//!   last-refresh word carry the generation's low 16 bits and are updated by CAS against them
//!   too, so a late packet of a removed connection is not counted on the entry's next user.
//! * **Seqlock reads.** A writer fills an entry while it is BUSY (after a release fence) and
//!   publishes it with a release store of PENDING. A reader loads the control word (acquire),
//!   the tuple words, an acquire fence, and the control word again: if the generation changed
//!   or the entry is not LIVE, it was reused under the reader and the reader treats it as a
//!   miss. Tuples are only written while an entry is BUSY, so a reader never returns a torn
//!   mix of two connections' tuples. Index words hold only a 32-bit signature, so a reader
//!   always compares the full tuple.
//! * **Reclamation.** No memory is freed while the table lives: entries and index buckets are
//!   preallocated and reused in place, so a reader holding a stale index word or [`CtHit`] reads
//!   valid (if outdated) atomics, never freed memory, and the generation check turns staleness
//!   into a miss or [`Track::Gone`]. No epoch or hazard scheme is needed.
//! * **Insert** (lock-free): pop a free entry, fill it, mark it PENDING, CAS both index words
//!   into empty slots (sequentially consistent), then scan both tuples' candidate buckets for
//!   another PENDING or LIVE entry with an equal tuple. A LIVE one wins (the insert backs out
//!   with [`InsertError::Clash`], returning the existing entry); between two PENDING inserts the
//!   lower entry index wins, and the winner CASes the loser to ABORTED, which makes the loser's
//!   final PENDING -> LIVE CAS fail. Because both publish before they scan (sequentially
//!   consistent), at least one of two racing inserts sees the other, so at most one becomes
//!   LIVE. Lookups ignore PENDING entries; [`Conntrack::tuple_in_use`] counts them as taken.
//! * **Removal** (by id, expiry, sweep, early drop, [`Conntrack::retain`]): CAS LIVE -> DYING
//!   (the winner owns the entry), clear its two index words, store FREE with the next
//!   generation (release), push it on the free stack.
//! * A refresh racing with an expiry of the same entry may lose: an entry idle for its whole
//!   timeout can be reaped just as a late packet refreshes it (the next packet then finds no
//!   entry, as it would a moment later in Linux).
//!
//! # Limits, expiry and early drop
//!
//! There are never more than `max_entries` live entries. Expired entries are misses at once;
//! [`Conntrack::sweep`] frees them incrementally, at most `budget` entries per call, resuming
//! where the previous call stopped. When no entry is free, an insert first reaps an expired
//! entry among the entries indexed in its tuples' candidate buckets, then sweeps
//! [`FULL_SWEEP_BUDGET`] entries, then **early-drops** an entry that is not ASSURED among those
//! candidates (preferring one that never saw a reply, then the least recently refreshed),
//! counted in [`CtCounters::early_drop`]. If none qualifies the insert fails with
//! [`InsertError::Full`], counted in [`CtCounters::insert_failed`]. An insert whose two
//! candidate buckets are both full (at most half-full index: practically never, and the seeded
//! hash keeps attackers from arranging it) also fails with `Full`.
//!
//! # Connections per source
//!
//! With [`CtConfig::max_per_source`] set, an insert whose [`CtTag`] carries
//! [`CtStatus::SOURCE_LIMITED`] is refused with [`InsertError::SourceLimit`] when its original
//! source address already holds that many live entries (so one pod cannot fill the table and
//! starve the others' new connections; Linux has one global limit only, OVS per-zone limits,
//! both off by default). The counts live beside the table, lock-free and bounded: a
//! count-min sketch of two rows of [`SOURCE_SLOTS`] atomic counters, each source counted in
//! one counter of each row (by a seeded hash of its address) and limited by the smaller of
//! its two; a source is refused early only if both its counters are shared with other busy
//! sources. A count is taken before the entry is made (given back if the insert fails) and
//! given back when a counted entry is removed however it goes (by id, expiry, sweep, early
//! drop, retain), or earlier, when a TCP connection closes (enters TIME_WAIT or CLOSE), as
//! Linux's nf_conncount stops counting closed connections (`already_closed`): a source at
//! its limit that closes a connection may open another at once, not a sweep later. The entry
//! carries the `SOURCE_LIMITED` bit while it is counted; the CAS that closes it clears the
//! bit, so its count is given back exactly once (its later removal finds no bit). A table
//! found in a file ([`Conntrack::open_file`]) counts its kept entries with the bit again when
//! it is rebuilt, and after a takeover the new process's counts are its table's.
//!
//! Counters are kept in per-thread shards (one cache line each) and summed when read. A thread
//! owns one of 16 shards while it lives and counts there with a plain load and store (no
//! locked instruction on the lookup path: on x86 that is a full barrier, waiting for the
//! lookup's cache misses); threads beyond 16 share a 17th shard and count there with atomic
//! adds.
//!
//! # Keeping the table in a file
//!
//! ## The file
//!
//! One page of header, then the three arrays of the table exactly as in memory (entries,
//! counters, index), each at a 2 MiB boundary of the file. The file is mapped `MAP_SHARED`:
//! every store the table makes is in the file at once, with no write-back step, so a process
//! killed at any instruction leaves the table as it was at that instruction. Put it on a tmpfs
//! (`/run`, `/dev/shm`): it then costs memory, not disk writes, and does not survive a reboot
//! (the boot id in the header refuses one that did).
//!
//! Every open allocates the whole file (`posix_fallocate`), so a full tmpfs is an error at the
//! open ([`CtFileError::NoSpace`]), never a `SIGBUS` at a later first touch of a page. The file
//! is mapped at a 2 MiB boundary, its pages made huge pages with `MADV_COLLAPSE` (which works
//! with `shmem_enabled` = `never`; not with `deny`, nor before Linux 6.1) and faulted in, so a
//! file-backed table costs what an anonymous one on transparent huge pages does
//! ([`Recovery::huge_pages`] says whether it is on them).
//!
//! The file holds every connection and its NAT, and a store into it is a store into the
//! running table, so it must be this process's own: a symbolic link is not followed, and a
//! file that is not a regular file, belongs to another user, can be written by its group or
//! others, or has more than one name is refused ([`CtFileError::Unsafe`]); one its group or
//! others can read is set to mode 0600 ([`Recovery::mode_fixed`]). Only the file itself is
//! checked: its directory is the caller's to keep safe.
//!
//! The header (little-endian words) holds a magic number, the format version, the sizes of the
//! three element types, the number of entries and buckets, the arrays' offsets, the file
//! length, the hash secrets (the index is only right under the same secrets, so they persist
//! with it), the boot id (stored times are `CLOCK_MONOTONIC`, which restarts at boot), a
//! checksum of all these, and, outside the checksum, a clean-detach flag and the pid of the
//! process that last opened it. A file whose header does not match what this build and this
//! configuration would write is **refused** and made again, empty, and [`Recovery`] says why
//! ([`Refusal`]): a wrong version or element size (another build), another `max_entries`,
//! another boot, a wrong length (truncated), a bad checksum or magic (random bytes).
//!
//! ## What is kept after a crash
//!
//! Nothing in the arrays is trusted but the entries themselves: on every open the index is
//! cleared and rebuilt, and so are the free stack and the length. An entry is kept only when
//! its control word says LIVE — the seqlock's stable state, reached only after the whole entry
//! was written — and it passes sanity checks (both tuples of one protocol, a TCP state only for
//! TCP and a valid one, known status bits and the NAT bits its tuples imply, a refresh time of
//! its own generation and not in the future), has not expired, and holds no tuple a kept entry
//! already holds. An entry being written (BUSY), published but not yet LIVE (PENDING),
//! aborted by a racing insert (ABORTED) or half removed (DYING) when the process died is
//! freed, counted in [`Recovery::half_written`]; so is every entry failing a check
//! ([`Recovery::invalid`]). Counters of an older generation are reset to zero.
//!
//! ## NAT and Services after a restart
//!
//! A NAT binding is the entry's reply tuple and a Service's endpoint choice is its reply
//! source, so kept entries translate as before. The source-port allocator has no state of its
//! own: it asks the table whether a reply tuple is taken ([`Conntrack::tuple_in_use`]), so
//! after the rebuild it sees every kept binding. The timeouts, `liberal` and the counters of
//! lookups are this process's; a table opened with other timeouts applies them to the kept
//! entries at once.
//!
//! ## Exclusion
//!
//! The file is locked (`flock`, exclusive) while a table uses it: a second process opening it
//! gets [`CtFileError::InUse`] instead of rebuilding a table under a running one. The lock
//! goes with the process, so a killed one does not keep it.

mod persist;
mod table;
pub mod tcp;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_ipv6;

use std::fmt;
use std::time::Duration;

use crate::stats::counter_set;
use crate::wire::family::Family;
use crate::wire::tuple::{L4Kind, Tuple, TupleWords};

pub use persist::{CtFileError, Opened, Recovery, Refusal, FORMAT_VERSION};
pub(crate) use table::CtTables;
pub use table::{Conntrack, ConntrackOf, CtFamily, CtLoc, CtTable};

/// A connection tuple a [`CtTable`] keys on, packed into `W` 64-bit words: [`Tuple`] (IPv4,
/// 2 words) and [`Tuple<Ipv6Addr>`](Tuple) (IPv6, 5 words).
///
/// Contract: `from_words(to_words(t)) == t`, and the **last** word is packed as
/// `sport << 48 | dport << 32 | proto << 16 | zone` (the table reads the protocol there).
pub trait CtKey<const W: usize>:
    Copy + Eq + Ord + std::hash::Hash + TupleFmt + fmt::Debug + Send + Sync + 'static
{
    /// The address family, 4 or 6 (names the table in logs, tells the files apart).
    const FAMILY: u8;
    /// This family's ICMP protocol number (1, or 58 for ICMPv6): echo is tracked by it.
    const ICMP: u8;
    /// The tuple packed into words.
    fn to_words(&self) -> [u64; W];
    /// The inverse of [`CtKey::to_words`].
    fn from_words(w: [u64; W]) -> Self;
    /// The IP protocol number.
    fn proto(&self) -> u8;
    /// The same connection seen from the other end.
    fn invert(&self) -> Self;
    /// Whether `reply` translates `orig`'s destination (its source differs from `orig`'s
    /// destination address or port).
    fn is_dnat(orig: &Self, reply: &Self) -> bool;
    /// Whether `reply` translates `orig`'s source.
    fn is_snat(orig: &Self, reply: &Self) -> bool;
    /// The family's address ([`Ipv4Addr`](std::net::Ipv4Addr), [`Ipv6Addr`](std::net::Ipv6Addr)).
    type Addr: Copy + Eq + fmt::Debug + fmt::Display + Send + Sync + 'static;
    /// The source port (ICMP echo: the identifier).
    fn sport(&self) -> u16;
    /// The tuple with source `addr` and source port `port` (ICMP echo: the identifier, in
    /// both port fields), the rest kept: a translated source.
    fn with_source(&self, addr: Self::Addr, port: u16) -> Self;
    /// The source address folded into one word (what the per-source counts hash).
    fn source_word(&self) -> u64;
}

/// [`CtKey`] for the tuple of either family: the two have the same fields, so one body
/// serves both, the words packed by the family ([`TupleWords`]).
impl<A: TupleWords<W>, const W: usize> CtKey<W> for Tuple<A> {
    const FAMILY: u8 = A::VERSION;
    const ICMP: u8 = A::ICMP.number();
    type Addr = A;
    #[inline(always)]
    fn to_words(&self) -> [u64; W] {
        A::pack(self)
    }
    #[inline(always)]
    fn from_words(w: [u64; W]) -> Self {
        A::unpack(w)
    }
    #[inline(always)]
    fn proto(&self) -> u8 {
        self.proto
    }
    #[inline(always)]
    fn invert(&self) -> Self {
        Tuple::invert(self)
    }
    #[inline(always)]
    fn is_dnat(orig: &Self, reply: &Self) -> bool {
        (reply.src, reply.sport) != (orig.dst, orig.dport)
    }
    #[inline(always)]
    fn is_snat(orig: &Self, reply: &Self) -> bool {
        (reply.dst, reply.dport) != (orig.src, orig.sport)
    }
    #[inline(always)]
    fn sport(&self) -> u16 {
        self.sport
    }
    #[inline]
    fn source_word(&self) -> u64 {
        match self.src.into() {
            std::net::IpAddr::V4(a) => u64::from(u32::from(a)),
            std::net::IpAddr::V6(a) => {
                let x = u128::from(a);
                crate::narrow::low64(x) ^ crate::narrow::low64(x >> 64).rotate_left(32)
            }
        }
    }
    #[inline(always)]
    fn with_source(&self, addr: A, port: u16) -> Self {
        let icmp = self.proto == Self::ICMP;
        Self {
            src: addr,
            sport: port,
            dport: if icmp { port } else { self.dport },
            ..*self
        }
    }
}

pub use tcp::CtState;

/// A non-state-changing packet refreshes its entry's timeout at most this often.
pub const REFRESH: Duration = Duration::from_secs(1);

/// Entries an insert sweeps when the table is full, before early-dropping.
pub const FULL_SWEEP_BUDGET: usize = 16;

/// Default limit on entries, as Linux's `nf_conntrack_max` on a large host.
pub const DEFAULT_MAX_ENTRIES: usize = 262_144;

/// The counters in each of the two rows of the per-source counts (see "Connections per
/// source" in the module docs): 128 KiB for both rows, allocated only with a limit.
pub const SOURCE_SLOTS: usize = 16_384;

/// Largest accepted `max_entries` (entry indices are 31 bits).
pub const MAX_ENTRIES_LIMIT: usize = 1 << 30;

/// Timeouts per protocol and TCP state; the defaults are Linux's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CtTimeouts {
    /// TCP SYN_SENT (and SYN_SENT2): 120 s.
    pub tcp_syn_sent: Duration,
    /// TCP SYN_RECV: 60 s.
    pub tcp_syn_recv: Duration,
    /// TCP ESTABLISHED: 5 days.
    pub tcp_established: Duration,
    /// TCP FIN_WAIT: 120 s.
    pub tcp_fin_wait: Duration,
    /// TCP CLOSE_WAIT: 60 s.
    pub tcp_close_wait: Duration,
    /// TCP LAST_ACK: 30 s.
    pub tcp_last_ack: Duration,
    /// TCP TIME_WAIT: 120 s.
    pub tcp_time_wait: Duration,
    /// TCP CLOSE: 10 s.
    pub tcp_close: Duration,
    /// UDP until assured: 30 s.
    pub udp: Duration,
    /// UDP once assured (seen both ways): 120 s.
    pub udp_stream: Duration,
    /// ICMP echo: 30 s.
    pub icmp: Duration,
    /// Any other protocol: 600 s.
    pub generic: Duration,
}

impl Default for CtTimeouts {
    fn default() -> Self {
        let s = Duration::from_secs;
        CtTimeouts {
            tcp_syn_sent: s(120),
            tcp_syn_recv: s(60),
            tcp_established: s(432_000),
            tcp_fin_wait: s(120),
            tcp_close_wait: s(60),
            tcp_last_ack: s(30),
            tcp_time_wait: s(120),
            tcp_close: s(10),
            udp: s(30),
            udp_stream: s(120),
            icmp: s(30),
            generic: s(600),
        }
    }
}

impl CtTimeouts {
    /// Every timeout with its field name, for validation and display.
    pub fn fields(&self) -> [(&'static str, Duration); 12] {
        [
            ("tcp_syn_sent", self.tcp_syn_sent),
            ("tcp_syn_recv", self.tcp_syn_recv),
            ("tcp_established", self.tcp_established),
            ("tcp_fin_wait", self.tcp_fin_wait),
            ("tcp_close_wait", self.tcp_close_wait),
            ("tcp_last_ack", self.tcp_last_ack),
            ("tcp_time_wait", self.tcp_time_wait),
            ("tcp_close", self.tcp_close),
            ("udp", self.udp),
            ("udp_stream", self.udp_stream),
            ("icmp", self.icmp),
            ("generic", self.generic),
        ]
    }
}

/// Configuration of a [`Conntrack`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CtConfig {
    /// Most live entries (`nf_conntrack_max`); memory for them is allocated at creation.
    pub max_entries: usize,
    /// Pick up TCP connections mid-stream (`nf_conntrack_tcp_loose`).
    pub liberal: bool,
    /// Timeouts.
    pub timeouts: CtTimeouts,
    /// Most live entries per original source address among inserts that ask for it
    /// ([`CtStatus::SOURCE_LIMITED`]); 0 (the default): no limit, as Linux and OVS. A closed
    /// TCP connection (TIME_WAIT, CLOSE) stops counting as it closes, as Linux's
    /// nf_conncount. See "Connections per source" in the [module docs](self).
    pub max_per_source: u32,
}

impl Default for CtConfig {
    fn default() -> Self {
        CtConfig {
            max_entries: DEFAULT_MAX_ENTRIES,
            liberal: false,
            timeouts: CtTimeouts::default(),
            max_per_source: 0,
        }
    }
}

/// A configuration value that [`Conntrack::new`] refuses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CtConfigError {
    /// The field, e.g. `max_entries` or `timeouts.udp`.
    pub field: &'static str,
    /// The refused value, as text.
    pub value: String,
    /// What the field must be.
    pub expected: &'static str,
}

impl fmt::Display for CtConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "conntrack config: {} = {} (must be {})",
            self.field, self.value, self.expected
        )
    }
}

impl std::error::Error for CtConfigError {}

/// Which way a packet travels relative to its connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Dir {
    /// As the connection's first packet (matches the ORIGINAL tuple).
    Original = 0,
    /// Back from the other end (matches the REPLY tuple).
    Reply = 1,
}

/// An entry's identity: its slot and the slot's generation. A stale id (the entry was removed
/// and the slot reused) never matches the new entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct CtId {
    /// Entry slot.
    pub slot: u32,
    /// Generation of the slot when the id was taken.
    pub gen: u32,
}

/// Status bits of an entry (Linux's `IPS_*` bit numbers).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct CtStatus(pub u16);

impl CtStatus {
    /// A packet was seen in the reply direction.
    pub const SEEN_REPLY: u16 = 1 << 1;
    /// The connection is assured: not early-dropped when the table is full.
    pub const ASSURED: u16 = 1 << 2;
    /// The source is translated (reply destination differs from the original source).
    pub const SRC_NAT: u16 = 1 << 4;
    /// The destination is translated (reply source differs from the original destination).
    pub const DST_NAT: u16 = 1 << 5;
    /// The bits a [`CtTag`] may set.
    pub const NAT_MASK: u16 = CtStatus::SRC_NAT | CtStatus::DST_NAT;
    /// Counted against its original source's limit ([`CtConfig::max_per_source`]): set
    /// through a [`CtTag`] by the inserter, kept only while the table has a limit and until
    /// a TCP connection closes (its count is given back then). tapyard's
    /// own bit (Linux's unused `IPS_UNTRACKED` number).
    pub const SOURCE_LIMITED: u16 = 1 << 12;

    /// Whether all of `bits` are set.
    pub fn has(self, bits: u16) -> bool {
        self.0 & bits == bits
    }
    /// A reply was seen.
    pub fn seen_reply(self) -> bool {
        self.has(CtStatus::SEEN_REPLY)
    }
    /// The entry is assured.
    pub fn assured(self) -> bool {
        self.has(CtStatus::ASSURED)
    }
    /// Source NAT.
    pub fn snat(self) -> bool {
        self.has(CtStatus::SRC_NAT)
    }
    /// Destination NAT.
    pub fn dnat(self) -> bool {
        self.has(CtStatus::DST_NAT)
    }
}

impl fmt::Debug for CtStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = [
            (CtStatus::SEEN_REPLY, "SEEN_REPLY"),
            (CtStatus::ASSURED, "ASSURED"),
            (CtStatus::SRC_NAT, "SRC_NAT"),
            (CtStatus::DST_NAT, "DST_NAT"),
            (CtStatus::SOURCE_LIMITED, "SOURCE_LIMITED"),
        ];
        let mut first = true;
        write!(f, "CtStatus(")?;
        for (b, n) in names {
            if self.0 & b != 0 {
                if !first {
                    write!(f, "|")?;
                }
                write!(f, "{n}")?;
                first = false;
            }
        }
        write!(f, ")")
    }
}

/// What the NAT layer attaches to a new entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct CtTag {
    /// Status bits to set; only [`CtStatus::NAT_MASK`] bits are taken (they are also derived
    /// from the tuples: SRC_NAT/DST_NAT are set whenever the reply tuple says so), and
    /// [`CtStatus::SOURCE_LIMITED`] (counted against the source's limit, if the table has
    /// one).
    pub status: CtStatus,
    /// Connection mark (`ct mark`).
    pub mark: u32,
    /// Opaque service tag (0 = none), e.g. the kube-proxy service the entry was made for.
    pub service: u32,
    /// Opaque endpoint tag (0 = none), e.g. to flush a removed endpoint's flows.
    pub endpoint: u32,
}

/// What [`Conntrack::track`] and [`Conntrack::insert`] need to know about a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pkt {
    /// The L4 kind, as [`Tuple::from_ipv4`] returned it.
    pub kind: L4Kind,
    /// The TCP flags byte (ignored for other protocols); see [`tcp::flags`].
    pub tcp_flags: u8,
    /// Wire length (IP datagram), for the byte counters.
    pub len: u32,
}

/// A found (or inserted) entry, as it was when read; `K` is the table's tuple type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CtHit<K = Tuple> {
    /// Identity, for [`Conntrack::track`] and [`Conntrack::remove`].
    pub id: CtId,
    /// Which of the entry's tuples matched.
    pub dir: Dir,
    /// The original tuple.
    pub orig: K,
    /// The reply tuple.
    pub reply: K,
    /// Status bits.
    pub status: CtStatus,
    /// Connection mark.
    pub mark: u32,
    /// Service tag (0 = none).
    pub service: u32,
    /// Endpoint tag (0 = none).
    pub endpoint: u32,
    /// TCP state ([`CtState::None`] for other protocols).
    pub state: CtState,
}

/// Why a packet is invalid for conntrack.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InvalidReason {
    /// The original and reply tuples are of different protocols.
    ProtoMismatch,
    /// The packet's L4 kind does not fit the entry's protocol.
    KindMismatch,
    /// A new TCP connection whose first packet is not a pure SYN (or, liberal, not an ACK).
    TcpNotSyn,
    /// A TCP packet that is invalid in the connection's state (`sIV` in Linux's table).
    TcpTransition,
    /// A new ICMP "connection" that is not an echo request.
    IcmpNotRequest,
    /// An echo request in the reply direction or a reply in the original direction.
    IcmpDirection,
}

/// Why [`Conntrack::insert`] did not insert.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InsertError<K = Tuple> {
    /// One of the tuples belongs to another entry (e.g. another thread inserted the same
    /// connection first). `existing` is that entry when it was already live, with `dir` saying
    /// which of its tuples equals the new ORIGINAL tuple (or `Original` if only the reply
    /// clashed): track the packet on it.
    Clash {
        /// The entry that won, if live.
        existing: Option<CtHit<K>>,
    },
    /// No room: no free entry, nothing expired or early-droppable among the candidates.
    Full,
    /// The first packet cannot create a connection.
    Invalid(InvalidReason),
    /// The original source holds [`CtConfig::max_per_source`] live entries already.
    SourceLimit,
}

impl<K> fmt::Display for InsertError<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InsertError::Clash { .. } => write!(f, "conntrack: tuple already tracked"),
            InsertError::Full => write!(f, "conntrack: table full"),
            InsertError::Invalid(r) => write!(f, "conntrack: invalid first packet ({r:?})"),
            InsertError::SourceLimit => write!(f, "conntrack: the source's limit is reached"),
        }
    }
}

impl<K: fmt::Debug> std::error::Error for InsertError<K> {}

/// What [`Conntrack::track`] made of a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Track {
    /// Accepted and counted; the connection is now in this state.
    Ok(CtState),
    /// Accepted without changing the entry (Linux's `sIG`: may be a resync); not counted.
    Ignored,
    /// An ICMP error about the connection (RELATED): accepted, the entry is unchanged.
    Related,
    /// Invalid for the connection (counted in [`CtCounters::invalid`]); the entry is unchanged.
    Invalid(InvalidReason),
    /// A SYN for a closed (TIME_WAIT/CLOSE) connection: the old entry was deleted; insert the
    /// new connection from this packet.
    Reopen,
    /// A RST before any reply: the entry was deleted (Linux kills it at once); accept the RST.
    Closed,
    /// The entry no longer exists (removed or expired, its slot maybe reused): look up again.
    Gone,
}

counter_set! {
    /// Counters, summed over all threads by [`Conntrack::counters`].
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct CtCounters {
        extra {
            /// Live entries now.
            pub entries: usize,
        }
        /// Lookups that found a live entry.
        found,
        /// Entries inserted.
        new,
        /// Invalid packets (refused first packets and invalid transitions).
        invalid,
        /// Inserts refused for lack of room.
        insert_failed,
        /// Unassured entries evicted to make room.
        early_drop,
        /// Inserts that lost to an entry with the same tuple.
        clash,
        /// Expired entries freed (by sweeps, or by inserts needing room).
        expired,
        /// Entries removed by [`Conntrack::remove`], [`Conntrack::retain`], a RST before any
        /// reply, or a reopening SYN.
        removed,
    }
}

/// A snapshot of an entry for display and JSON (`conntrack -L`; `conntrack -L -f ipv6` for
/// `CtView<Tuple<Ipv6Addr>>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct CtView<K = Tuple> {
    /// Identity.
    pub id: CtId,
    /// IP protocol number.
    pub proto: u8,
    /// Protocol name as `conntrack -L` prints it (`tcp`, `udp`, `icmp`, `icmpv6`, `unknown`).
    pub protocol: &'static str,
    /// TCP state (None for other protocols).
    pub state: Option<CtState>,
    /// Seconds until the entry expires if nothing refreshes it.
    pub timeout_secs: u64,
    /// Original tuple.
    pub orig: K,
    /// Reply tuple.
    pub reply: K,
    /// Packets in the original direction.
    pub orig_packets: u64,
    /// Bytes in the original direction.
    pub orig_bytes: u64,
    /// Packets in the reply direction.
    pub reply_packets: u64,
    /// Bytes in the reply direction.
    pub reply_bytes: u64,
    /// ASSURED.
    pub assured: bool,
    /// No reply seen yet.
    pub unreplied: bool,
    /// All status bits.
    pub status: CtStatus,
    /// Connection mark.
    pub mark: u32,
    /// Service tag.
    pub service: u32,
    /// Endpoint tag.
    pub endpoint: u32,
}

impl<K: TupleFmt> fmt::Display for CtView<K> {
    /// One `conntrack -L` line (without newline).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:<8} {} {} ",
            self.protocol, self.proto, self.timeout_secs
        )?;
        if let Some(s) = self.state {
            write!(f, "{} ", s.name())?;
        }
        fmt_tuple(f, &self.orig, Dir::Original)?;
        write!(
            f,
            " packets={} bytes={} ",
            self.orig_packets, self.orig_bytes
        )?;
        if self.unreplied {
            write!(f, "[UNREPLIED] ")?;
        }
        fmt_tuple(f, &self.reply, Dir::Reply)?;
        write!(
            f,
            " packets={} bytes={} ",
            self.reply_packets, self.reply_bytes
        )?;
        if self.assured {
            write!(f, "[ASSURED] ")?;
        }
        write!(f, "mark={} use=1", self.mark)
    }
}

/// A tuple as `conntrack -L` prints it (see [`CtView`]'s `Display`).
pub trait TupleFmt: fmt::Display {
    /// Writes the tuple of direction `dir`: ICMP echo with `type= code= id=` (types 8/0, or
    /// 128/129 for ICMPv6), other protocols as the tuple's `Display`.
    fn fmt_ct(&self, f: &mut fmt::Formatter<'_>, dir: Dir) -> fmt::Result;
}

impl<A: Family> TupleFmt for Tuple<A> {
    fn fmt_ct(&self, f: &mut fmt::Formatter<'_>, dir: Dir) -> fmt::Result {
        if self.proto == A::ICMP.number() {
            // Echo request and reply: 8 and 0, or 128 and 129 for ICMPv6.
            let ty = match (A::VERSION, dir) {
                (4, Dir::Original) => 8,
                (4, Dir::Reply) => 0,
                (_, Dir::Original) => 128,
                (_, Dir::Reply) => 129,
            };
            fmt_echo(f, &self.src, &self.dst, ty, self.sport, self.zone)
        } else {
            fmt::Display::fmt(self, f)
        }
    }
}

fn fmt_echo(
    f: &mut fmt::Formatter<'_>,
    src: &dyn fmt::Display,
    dst: &dyn fmt::Display,
    ty: u8,
    id: u16,
    zone: u16,
) -> fmt::Result {
    write!(f, "src={src} dst={dst} type={ty} code=0 id={id}")?;
    if zone != 0 {
        write!(f, " zone={zone}")?;
    }
    Ok(())
}

fn fmt_tuple<K: TupleFmt>(f: &mut fmt::Formatter<'_>, t: &K, dir: Dir) -> fmt::Result {
    t.fmt_ct(f, dir)
}

/// The protocol name `conntrack -L` prints (`family` 4 or 6: protocol 58 is `icmpv6` in an
/// IPv6 table).
pub(crate) fn proto_name(p: u8, family: u8) -> &'static str {
    match (p, family) {
        (6, _) => "tcp",
        (17, _) => "udp",
        (1, 4) => "icmp",
        (58, 6) => "icmpv6",
        _ => "unknown",
    }
}
