//! The lock-free table behind [`Conntrack`] (design and contract in the module docs).

use std::fmt;
use std::marker::PhantomData;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{fence, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;

use super::tcp::{self, flags, CtState, Next};
use super::{
    proto_name, CtConfig, CtConfigError, CtCounters, CtHit, CtId, CtKey, CtStatus, CtTag, CtView,
    Dir, InsertError, InvalidReason, Pkt, Track, FULL_SWEEP_BUDGET, MAX_ENTRIES_LIMIT, REFRESH,
    SOURCE_SLOTS,
};
use crate::hash::{self, SeededHash};
use crate::narrow::{low16, low32, low8};
use crate::sys::BigSlice;
use crate::time::Instant;
use crate::wire::family::Family;
use crate::wire::ipv4::{PROTO_ICMP, PROTO_TCP, PROTO_UDP};
use crate::wire::tuple::{L4Kind, Tuple};

// ---- control word -----------------------------------------------------------------------
// bits 0..16 status, 16..20 TCP state, 20..23 life stage, 32..64 generation.

const FREE: u64 = 0;
const BUSY: u64 = 1;
const PENDING: u64 = 2;
const LIVE: u64 = 3;
const DYING: u64 = 4;
const ABORTED: u64 = 5;

#[inline]
fn life(c: u64) -> u64 {
    (c >> 20) & 7
}
#[inline]
fn gen_of(c: u64) -> u32 {
    (c >> 32) as u32
}
#[inline]
fn state_of(c: u64) -> CtState {
    CtState::from_u8(((c >> 16) & 0xf) as u8)
}
#[inline]
fn status_of(c: u64) -> CtStatus {
    CtStatus(low16(c))
}
#[inline]
fn ctl(gen: u32, life: u64, state: CtState, status: CtStatus) -> u64 {
    (u64::from(gen) << 32) | (life << 20) | (u64::from(state as u8) << 16) | u64::from(status.0)
}
#[inline]
fn with_life(c: u64, l: u64) -> u64 {
    (c & !(7 << 20)) | (l << 20)
}

// ---- generation-tagged 48-bit words (counters, last refresh) -------------------------------

const LOW48: u64 = (1 << 48) - 1;

/// [`REFRESH`] in milliseconds, the unit of the stored times.
const REFRESH_MS: u64 = REFRESH.as_secs() * 1000 + REFRESH.subsec_millis() as u64;

/// A slot index as the 32-bit number ids and bucket words carry.
#[inline(always)]
#[allow(
    clippy::cast_possible_truncation,
    reason = "slot and bucket indices are below the table size, at most MAX_ENTRIES_LIMIT \
              (2^30, checked in `new`) with buckets no more numerous than slots"
)]
fn slot_id(idx: usize) -> u32 {
    idx as u32
}

#[inline]
fn tag16(gen: u32) -> u64 {
    u64::from(low16(u64::from(gen))) << 48
}

/// Adds `d` to a generation-tagged counter if it still belongs to generation `gen`.
#[inline]
fn tagged_add(w: &AtomicU64, gen: u32, d: u64) {
    let t = tag16(gen);
    let mut cur = w.load(Ordering::Relaxed);
    while cur & !LOW48 == t {
        let new = t | (cur.wrapping_add(d) & LOW48);
        match w.compare_exchange_weak(cur, new, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return,
            Err(a) => cur = a,
        }
    }
}

// ---- layout ------------------------------------------------------------------------------

crate::sys::atomic_words! {
    /// The line lookups read. `words` = orig `to_words()`, reply `to_words()` (`W` words
    /// each: 64 bytes an entry for IPv4's 2, 128 for IPv6's 5). Only atomics, in a fixed order
    /// (`repr(C)`): it may live in a shared file ([`Conntrack::open_file`]).
    #[repr(C, align(64))]
    pub(super) struct Entry<const W: usize> {
        ctl: AtomicU64,
        words: [[AtomicU64; W]; 2],
        /// Generation tag (16 bits) | last refresh in milliseconds (48 bits).
        last: AtomicU64,
        /// mark << 32 | service.
        tag: AtomicU64,
        /// endpoint << 32 | free-stack link (next free slot + 1, 0 = none) while FREE.
        aux: AtomicU64,
    }
}

impl<const W: usize> Default for Entry<W> {
    fn default() -> Self {
        Entry {
            ctl: AtomicU64::new(0),
            words: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))),
            last: AtomicU64::new(0),
            tag: AtomicU64::new(0),
            aux: AtomicU64::new(0),
        }
    }
}

impl<const W: usize> Entry<W> {
    /// The end of a seqlock-style snapshot begun with control word `c1`, once the tuple
    /// words `w` are read: the other fields, then the check that the generation did not
    /// change and the entry's life still passes `ok` (else `None`: the entry changed).
    #[inline(always)]
    fn finish_snap(&self, c1: u64, w: [[u64; W]; 2], ok: impl Fn(u64) -> bool) -> Option<Snap<W>> {
        let last = self.last.load(Ordering::Relaxed);
        let tag = self.tag.load(Ordering::Relaxed);
        let aux = self.aux.load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        let c2 = self.ctl.load(Ordering::Relaxed);
        if gen_of(c1) != gen_of(c2) || !ok(life(c2)) {
            return None;
        }
        Some(Snap {
            c: c2,
            w,
            last,
            tag,
            aux,
        })
    }

    /// Both tuples' words (relaxed loads: the caller validates them, seqlock-style).
    #[inline(always)]
    fn load_words(&self) -> [[u64; W]; 2] {
        [
            std::array::from_fn(|i| self.words[0][i].load(Ordering::Relaxed)),
            std::array::from_fn(|i| self.words[1][i].load(Ordering::Relaxed)),
        ]
    }
}

crate::sys::atomic_words! {
    /// Per-direction counters: orig packets, orig bytes, reply packets, reply bytes, each
    /// generation-tagged.
    #[repr(C, align(32))]
    #[derive(Default)]
    pub(super) struct Acct {
        w: [AtomicU64; 4],
    }
}

const WAYS: usize = 8;

crate::sys::atomic_words! {
    #[repr(C, align(64))]
    #[derive(Default)]
    pub(super) struct Bucket {
        slots: [AtomicU64; WAYS],
    }
}

impl Bucket {
    /// The slots (acquire loads) and a mask of those holding signature `sig` (bit i = slot
    /// i), computed without a branch per slot.
    #[inline(always)]
    fn matches(&self, sig: u64) -> (u32, [u64; WAYS]) {
        let mut v = [0u64; WAYS];
        let mut m = 0u32;
        for (i, (s, x)) in self.slots.iter().zip(v.iter_mut()).enumerate() {
            *x = s.load(Ordering::Acquire);
            m |= u32::from(*x >> 32 == sig) << i;
        }
        (m, v)
    }
}

// Counter shards.
const C_FOUND: usize = 0;
const C_NEW: usize = 1;
const C_INVALID: usize = 2;
const C_INSERT_FAILED: usize = 3;
const C_EARLY_DROP: usize = 4;
const C_CLASH: usize = 5;
const C_EXPIRED: usize = 6;
const C_REMOVED: usize = 7;
/// Shards a thread can own; one more, shared, serves threads beyond them.
const SHARDS: usize = 16;

#[repr(align(64))]
#[derive(Default)]
struct Shard {
    c: [AtomicU64; 8],
}

/// Which of the [`SHARDS`] owned shards are taken by a live thread (bit i = shard i).
static SHARD_OWNERS: AtomicU32 = AtomicU32::new(0);

/// A thread's counter shard: an owned one (`< SHARDS`), released when the thread exits, or the
/// shared one (`SHARDS`). Only the owner writes an owned shard, so it counts with a plain load
/// and store: no locked read-modify-write (on x86 a full barrier, which waits for the
/// lookup's cache misses before later loads may complete).
struct ShardClaim(usize);

impl ShardClaim {
    fn claim() -> ShardClaim {
        let mut cur = SHARD_OWNERS.load(Ordering::Relaxed);
        loop {
            let free = !cur & ((1 << SHARDS) - 1);
            if free == 0 {
                return ShardClaim(SHARDS);
            }
            let i = free.trailing_zeros();
            // Acquire: the previous owner's counts (released below) happen before ours.
            match SHARD_OWNERS.compare_exchange_weak(
                cur,
                cur | 1 << i,
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return ShardClaim(i as usize),
                Err(x) => cur = x,
            }
        }
    }
}

impl Drop for ShardClaim {
    fn drop(&mut self) {
        if self.0 < SHARDS {
            SHARD_OWNERS.fetch_and(!(1 << self.0), Ordering::Release);
        }
    }
}

thread_local! {
    static MY_SHARD: ShardClaim = ShardClaim::claim();
}

/// Where a tuple lives in a table: its packed words, signature and two candidate buckets,
/// computed once by [`Conntrack::locate`] and reused for prefetching and lookups.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CtLoc<const W: usize = 2> {
    w: [u64; W],
    sig: u32,
    b1: u32,
    b2: u32,
}

#[inline]
fn slot_value(sig: u32, idx: usize, dir: Dir) -> u64 {
    (u64::from(sig) << 32) | ((idx as u64) << 1) | dir as u64
}

#[inline]
fn slot_entry(v: u64) -> (usize, Dir) {
    let low = low32(v);
    (
        (low >> 1) as usize,
        if low & 1 == 0 {
            Dir::Original
        } else {
            Dir::Reply
        },
    )
}

/// A consistent read of an entry (seqlock-validated).
#[derive(Clone, Copy)]
struct Snap<const W: usize> {
    c: u64,
    w: [[u64; W]; 2],
    last: u64,
    tag: u64,
    aux: u64,
}

/// The protocol of a tuple's words (the last word is `sport, dport, proto, zone`; see
/// [`CtKey`]).
#[inline(always)]
fn proto_of<const W: usize>(w: &[u64; W]) -> u8 {
    w.last().map_or(0, |r| low8(r >> 16))
}

impl<const W: usize> Snap<W> {
    #[inline]
    fn tuple_words(&self, dir: Dir) -> [u64; W] {
        match dir {
            Dir::Original => self.w[0],
            Dir::Reply => self.w[1],
        }
    }
    #[inline]
    fn proto(&self) -> u8 {
        proto_of(&self.w[0])
    }
    #[inline]
    fn last_ms(&self) -> u64 {
        self.last & LOW48
    }
}

enum Resolve<const W: usize> {
    Win,
    Lose(Option<(usize, Dir, Snap<W>)>),
}

/// The IPv4 connection table: entries of 64 bytes (see the [module docs](super)).
pub type Conntrack = CtTable<Tuple, 2>;

/// The connection table of family `A` ([`CtFamily`]): `ConntrackOf<Ipv4Addr>` is
/// [`Conntrack`]; `ConntrackOf<Ipv6Addr>` is the same design with [`Tuple<Ipv6Addr>`](Tuple)
/// keys of five words, so its entries take 128 bytes. A node runs one table per family, each
/// with its own limit.
pub type ConntrackOf<A> = <A as CtFamily>::Table;

/// An address family with a connection table, on its address type: [`Ipv4Addr`] or
/// [`Ipv6Addr`]. Sealed.
pub trait CtFamily: Family + sealed::Tables {
    /// The family's table: [`CtTable`] keyed by the family's [`Tuple`] packed in its words.
    type Table: fmt::Debug + Send + Sync + 'static;
}

impl CtFamily for Ipv4Addr {
    type Table = Conntrack;
}

impl CtFamily for Ipv6Addr {
    type Table = CtTable<Tuple<Ipv6Addr>, 5>;
}

/// A node's connection tables, one per family: the IPv4 one made with it, the IPv6 one
/// (unless installed before) on first use, with the IPv4 one's configuration.
#[derive(Debug)]
pub(crate) struct CtTables {
    v4: Conntrack,
    v6: OnceLock<ConntrackOf<Ipv6Addr>>,
}

impl CtTables {
    /// The tables around the IPv4 one.
    pub(crate) fn new(v4: Conntrack) -> CtTables {
        CtTables {
            v4,
            v6: OnceLock::new(),
        }
    }

    /// The table of family `A` (made now if it was not).
    #[inline(always)]
    pub(crate) fn get<A: CtFamily>(&self) -> &A::Table {
        A::get(self)
    }

    /// The table of family `A`, if it was made.
    #[inline(always)]
    pub(crate) fn if_made<A: CtFamily>(&self) -> Option<&A::Table> {
        A::if_made(self)
    }

    /// Installs the table of family `A`; returns it back if the family has one already.
    pub(crate) fn set<A: CtFamily>(&self, t: A::Table) -> Result<(), Box<A::Table>> {
        A::set(self, t).map_err(Box::new)
    }
}

// `Tables` cannot be named outside this module, so its crate-private types are unreachable.
#[allow(private_interfaces)]
mod sealed {
    use super::{CtFamily, CtTables};

    /// Where a family's table is in [`CtTables`].
    pub trait Tables: Sized {
        fn get(t: &CtTables) -> &Self::Table
        where
            Self: CtFamily;
        fn if_made(t: &CtTables) -> Option<&Self::Table>
        where
            Self: CtFamily;
        fn set(t: &CtTables, table: Self::Table) -> Result<(), Self::Table>
        where
            Self: CtFamily;
    }
}

#[allow(private_interfaces)] // unreachable outside the crate: see `sealed`
impl sealed::Tables for Ipv4Addr {
    #[inline(always)]
    fn get(t: &CtTables) -> &Conntrack {
        &t.v4
    }
    #[inline(always)]
    fn if_made(t: &CtTables) -> Option<&Conntrack> {
        Some(&t.v4)
    }
    fn set(_: &CtTables, table: Conntrack) -> Result<(), Conntrack> {
        Err(table)
    }
}

#[allow(private_interfaces)] // unreachable outside the crate: see `sealed`
impl sealed::Tables for Ipv6Addr {
    #[inline]
    fn get(t: &CtTables) -> &ConntrackOf<Ipv6Addr> {
        t.v6.get_or_init(|| {
            let mut cfg = *t.v4.config();
            cfg.max_entries = cfg.max_entries.max(1);
            // The IPv4 table's configuration was validated when it was made.
            CtTable::new(cfg).unwrap_or_else(|_| {
                CtTable::new(super::CtConfig::default())
                    .expect("the default configuration is valid")
            })
        })
    }
    #[inline(always)]
    fn if_made(t: &CtTables) -> Option<&ConntrackOf<Ipv6Addr>> {
        t.v6.get()
    }
    fn set(t: &CtTables, table: ConntrackOf<Ipv6Addr>) -> Result<(), ConntrackOf<Ipv6Addr>> {
        t.v6.set(table)
    }
}

/// A connection tracking table keyed by tuples of `W` words ([`CtKey`]): [`Conntrack`] for
/// IPv4, [`ConntrackOf<Ipv6Addr>`] for IPv6 (see the [module docs](super)).
pub struct CtTable<K, const W: usize> {
    entries: BigSlice<Entry<W>>,
    acct: BigSlice<Acct>,
    index: BigSlice<Bucket>,
    mask: usize,
    hash: SeededHash,
    /// Free stack head: tag << 32 | (slot + 1), 0 in the low half = empty.
    free_head: AtomicU64,
    len: AtomicUsize,
    cursor: AtomicUsize,
    shards: Box<[Shard]>,
    liberal: bool,
    /// Timeouts in microseconds: TCP by state, then udp, udp_stream, icmp, generic.
    tcp_to: [u64; 10],
    udp_to: u64,
    udp_stream_to: u64,
    icmp_to: u64,
    generic_to: u64,
    cfg: CtConfig,
    /// The per-source counts, two rows of [`SOURCE_SLOTS`] (see "Connections per source" in
    /// the module docs); empty without a limit.
    per_source: Box<[AtomicU32]>,
    /// The file the arrays live in ([`Conntrack::open_file`]); `None` for anonymous memory.
    file: Option<super::persist::CtFile>,
    key: PhantomData<fn() -> K>,
}

impl<K: CtKey<W>, const W: usize> std::fmt::Debug for CtTable<K, W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct(if K::FAMILY == 6 {
            "Conntrack6"
        } else {
            "Conntrack"
        })
        .field("max_entries", &self.entries.len())
        .field("buckets", &self.index.len())
        .field("counters", &self.counters())
        .finish()
    }
}

fn us(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// Index buckets for `n` entries: two tuples per entry, at most half of the index words used,
/// rounded up to a power of two.
pub(super) fn bucket_count(n: usize) -> usize {
    (n * 2 * 2).div_ceil(WAYS).next_power_of_two().max(2)
}

/// Checks a configuration as [`Conntrack::new`] does.
pub(super) fn validate(cfg: &CtConfig) -> Result<(), CtConfigError> {
    if cfg.max_entries == 0 || cfg.max_entries > MAX_ENTRIES_LIMIT {
        return Err(CtConfigError {
            field: "max_entries",
            value: cfg.max_entries.to_string(),
            expected: "between 1 and 2^30",
        });
    }
    for (name, d) in cfg.timeouts.fields() {
        if d.is_zero() {
            return Err(CtConfigError {
                field: match name {
                    "tcp_syn_sent" => "timeouts.tcp_syn_sent",
                    "tcp_syn_recv" => "timeouts.tcp_syn_recv",
                    "tcp_established" => "timeouts.tcp_established",
                    "tcp_fin_wait" => "timeouts.tcp_fin_wait",
                    "tcp_close_wait" => "timeouts.tcp_close_wait",
                    "tcp_last_ack" => "timeouts.tcp_last_ack",
                    "tcp_time_wait" => "timeouts.tcp_time_wait",
                    "tcp_close" => "timeouts.tcp_close",
                    "udp" => "timeouts.udp",
                    "udp_stream" => "timeouts.udp_stream",
                    "icmp" => "timeouts.icmp",
                    _ => "timeouts.generic",
                },
                value: format!("{d:?}"),
                expected: "a non-zero duration",
            });
        }
    }
    Ok(())
}

/// The hash of a tuple's words: [`SeededHash::hash_pair`] for IPv4's two (as before tables
/// were generic), [`SeededHash::hash_words`] for more (IPv6: the pairs multiplied in
/// parallel, not one after the other). The index is not kept across binaries (a table found
/// in a file is indexed again by [`CtTable::rebuild`]), so the hash may change between them.
#[inline(always)]
fn hash_words<const W: usize>(h: &SeededHash, w: &[u64; W]) -> u64 {
    if let Ok(p) = <[u64; 2]>::try_from(&w[..]) {
        return h.hash_pair(p);
    }
    h.hash_words(w)
}

/// Whether two tuples' words are equal: one OR of XORs, no branch per word and no `memcmp`
/// (which `==` on five words became).
#[inline(always)]
fn same_words<const W: usize>(a: &[u64; W], b: &[u64; W]) -> bool {
    a.iter().zip(b).fold(0, |d, (x, y)| d | (x ^ y)) == 0
}

impl<K: CtKey<W>, const W: usize> CtTable<K, W> {
    /// A table for at most `cfg.max_entries` connections, all memory allocated now.
    pub fn new(cfg: CtConfig) -> Result<CtTable<K, W>, CtConfigError> {
        validate(&cfg)?;
        let n = cfg.max_entries;
        // Free stack: 0 -> 1 -> ... -> n-1.
        let entries = BigSlice::from_fn(n, |i| Entry {
            aux: AtomicU64::new(if i + 1 < n { i as u64 + 2 } else { 0 }),
            ..Entry::default()
        });
        let mut ct = CtTable::assemble(
            cfg,
            entries,
            BigSlice::from_fn(n, |_| Acct::default()),
            BigSlice::from_fn(bucket_count(n), |_| Bucket::default()),
            SeededHash::random(),
            None,
        );
        ct.free_head = AtomicU64::new(1);
        Ok(ct)
    }

    /// A table on arrays made elsewhere (anonymous memory or a file), with an empty free stack
    /// and a length of zero: the caller sets them.
    pub(super) fn assemble(
        cfg: CtConfig,
        entries: BigSlice<Entry<W>>,
        acct: BigSlice<Acct>,
        index: BigSlice<Bucket>,
        hash: SeededHash,
        file: Option<super::persist::CtFile>,
    ) -> CtTable<K, W> {
        let t = &cfg.timeouts;
        let tcp_to = [
            us(t.tcp_close), // NONE: never stays there
            us(t.tcp_syn_sent),
            us(t.tcp_syn_recv),
            us(t.tcp_established),
            us(t.tcp_fin_wait),
            us(t.tcp_close_wait),
            us(t.tcp_last_ack),
            us(t.tcp_time_wait),
            us(t.tcp_close),
            us(t.tcp_syn_sent),
        ];
        let nbuckets = index.len();
        CtTable {
            acct,
            entries,
            index,
            mask: nbuckets - 1,
            hash,
            free_head: AtomicU64::new(0),
            len: AtomicUsize::new(0),
            cursor: AtomicUsize::new(0),
            shards: (0..=SHARDS).map(|_| Shard::default()).collect(),
            liberal: cfg.liberal,
            tcp_to,
            udp_to: us(t.udp),
            udp_stream_to: us(t.udp_stream),
            icmp_to: us(t.icmp),
            generic_to: us(t.generic),
            per_source: if cfg.max_per_source > 0 {
                (0..2 * SOURCE_SLOTS).map(|_| AtomicU32::new(0)).collect()
            } else {
                Box::default()
            },
            cfg,
            file,
            key: PhantomData,
        }
    }

    /// The configuration the table was made with.
    pub fn config(&self) -> &CtConfig {
        &self.cfg
    }

    /// Bytes of memory the table holds (fixed at creation; arrays backed by huge pages count
    /// their size rounded up to 2 MiB).
    pub fn memory_bytes(&self) -> usize {
        self.entries.alloc_bytes()
            + self.acct.alloc_bytes()
            + self.index.alloc_bytes()
            + self.shards.len() * std::mem::size_of::<Shard>()
    }

    // ---- counters ------------------------------------------------------------------------

    #[inline(always)]
    fn count(&self, which: usize, n: u64) {
        // While the thread is being torn down its claim may be gone: use the shared shard.
        let s = MY_SHARD.try_with(|s| s.0).unwrap_or(SHARDS);
        let Some(sh) = self.shards.get(s) else {
            return;
        };
        let c = &sh.c[which];
        if s < SHARDS {
            // Single writer (see ShardClaim).
            c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
        } else {
            c.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Counters summed over all threads, and the number of live entries.
    pub fn counters(&self) -> CtCounters {
        let mut s = [0u64; 8];
        for sh in self.shards.iter() {
            for (a, c) in s.iter_mut().zip(sh.c.iter()) {
                *a = a.wrapping_add(c.load(Ordering::Relaxed));
            }
        }
        CtCounters {
            entries: self.len(),
            found: s[C_FOUND],
            new: s[C_NEW],
            invalid: s[C_INVALID],
            insert_failed: s[C_INSERT_FAILED],
            early_drop: s[C_EARLY_DROP],
            clash: s[C_CLASH],
            expired: s[C_EXPIRED],
            removed: s[C_REMOVED],
        }
    }

    /// Live entries (inserted and not yet removed or swept; expired entries not yet swept
    /// are included).
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    /// True when no entry is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    // ---- per-source counts ---------------------------------------------------------------

    /// The two counters of `src` (a [`CtKey::source_word`]), one in each row.
    #[inline]
    fn source_counters(&self, src: u64) -> Option<(&AtomicU32, &AtomicU32)> {
        let h = self.hash.hash(src);
        let i = hash::first(h, SOURCE_SLOTS - 1);
        let j = SOURCE_SLOTS + hash::second(h, SOURCE_SLOTS - 1);
        Some((self.per_source.get(i)?, self.per_source.get(j)?))
    }

    /// Takes a count for `src` unless it holds [`CtConfig::max_per_source`] already (the
    /// smaller of its two counters): whether it did.
    #[inline(never)]
    fn take_source(&self, src: u64) -> bool {
        let Some((a, b)) = self.source_counters(src) else {
            return true;
        };
        let (x, y) = (
            a.fetch_add(1, Ordering::Relaxed),
            b.fetch_add(1, Ordering::Relaxed),
        );
        if x.min(y) >= self.cfg.max_per_source {
            self.give_source(src);
            return false;
        }
        true
    }

    /// Uncounts the LIVE entry `e` (control word `c`) being removed: the table's length, and
    /// its source's count if it holds one. Out of line: [`Self::kill`] is inlined into the
    /// tracking path, which stays the size it was before the per-source counts.
    #[inline(never)]
    fn uncount(&self, e: &Entry<W>, c: u64) {
        self.len.fetch_sub(1, Ordering::Relaxed);
        if status_of(c).has(CtStatus::SOURCE_LIMITED) {
            self.give_entry(e);
        }
    }

    /// Gives back the count that entry `e` holds against its source (its original
    /// direction's): at its removal, or when it closes while still in the table.
    #[inline(never)]
    fn give_entry(&self, e: &Entry<W>) {
        self.give_source(K::from_words(e.load_words()[0]).source_word());
    }

    /// Moves the counted entry `e` from control word `c` to the closed `nc` (TIME_WAIT,
    /// CLOSE) without its [`CtStatus::SOURCE_LIMITED`] bit and gives its count back: a closed
    /// connection no longer counts against its source, as Linux's nf_conncount
    /// (`already_closed`). The bit goes with the CAS that closes the connection, so the count
    /// is given back once, never again at removal. `Err`: the control word it found instead.
    #[cold]
    #[inline(never)]
    fn close_counted(&self, e: &Entry<W>, c: u64, nc: u64) -> Result<(), u64> {
        let nc = nc & !u64::from(CtStatus::SOURCE_LIMITED);
        e.ctl
            .compare_exchange(c, nc, Ordering::AcqRel, Ordering::Acquire)
            .map(|_| self.give_entry(e))
    }

    /// Gives a count of `src` back (never below zero).
    fn give_source(&self, src: u64) {
        if let Some((a, b)) = self.source_counters(src) {
            for c in [a, b] {
                let _ = c.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| v.checked_sub(1));
            }
        }
    }

    /// The live entries counted against `src`'s limit, as the counts tell (the smaller of its
    /// two counters; 0 without a limit). For tests and tools.
    pub fn source_count(&self, src: &K) -> u32 {
        self.source_counters(src.source_word()).map_or(0, |(a, b)| {
            a.load(Ordering::Relaxed).min(b.load(Ordering::Relaxed))
        })
    }

    // ---- hashing -------------------------------------------------------------------------

    #[inline]
    fn locate_words(&self, w: [u64; W]) -> CtLoc<W> {
        let h = hash_words(&self.hash, &w);
        // The signature is the high half of `h`; the buckets come from a second hash of it, so
        // entries sharing a bucket do not share signature bits.
        let b = self.hash.hash(h);
        CtLoc {
            w,
            sig: ((h >> 32) as u32) | 1,
            b1: slot_id(hash::first(b, self.mask)),
            b2: slot_id(hash::second(b, self.mask)),
        }
    }

    /// Hashes `t` once, for [`Conntrack::prefetch`] and [`Conntrack::lookup_loc`].
    #[inline]
    pub fn locate(&self, t: &K) -> CtLoc<W> {
        self.locate_words(t.to_words())
    }

    /// Hints the CPU to fetch both candidate buckets of a located tuple (before a batch's
    /// lookups).
    #[inline]
    pub fn prefetch(&self, l: &CtLoc<W>) {
        if let Some(b) = self.index.get(l.b1 as usize) {
            crate::sys::prefetch(b);
        }
        if let Some(b) = self.index.get(l.b2 as usize) {
            crate::sys::prefetch(b);
        }
    }

    /// The second stage of a batch (DPDK's `rte_hash` bulk lookup does the same): once the
    /// buckets [`Conntrack::prefetch`] asked for are in cache, reads the tuple's signature
    /// matches there and hints the CPU to fetch their entries, so that the
    /// [`Conntrack::lookup_loc`] that follows finds both of its lines in cache. Call it on a
    /// whole batch after prefetching the whole batch's buckets, then look the batch up.
    #[inline]
    pub fn prefetch_entry(&self, l: &CtLoc<W>) {
        let sig = u64::from(l.sig);
        for b in self.buckets(l) {
            let (mut m, v) = b.matches(sig);
            if m == 0 {
                continue;
            }
            while m != 0 {
                let (idx, _) = slot_entry(v[m.trailing_zeros() as usize % WAYS]);
                m &= m - 1;
                // Any address will do for a prefetch; no bounds check needed.
                crate::sys::prefetch_ptr(self.entries.as_ptr().wrapping_add(idx));
            }
            return;
        }
    }

    #[inline]
    fn buckets(&self, l: &CtLoc<W>) -> impl Iterator<Item = &Bucket> {
        [l.b1, l.b2]
            .into_iter()
            .filter_map(|b| self.index.get(b as usize))
    }

    // ---- reading -------------------------------------------------------------------------

    /// A seqlock-consistent snapshot of entry `idx` if its life stage passes `ok`.
    #[inline]
    fn snap(&self, idx: usize, ok: impl Fn(u64) -> bool) -> Option<Snap<W>> {
        let e = self.entries.get(idx)?;
        let c1 = e.ctl.load(Ordering::Acquire);
        if !ok(life(c1)) {
            return None;
        }
        e.finish_snap(c1, e.load_words(), ok)
    }

    /// [`CtTable::snap`] of entry `idx` when its tuple in direction `dir` is `want`: that
    /// tuple is read and compared first, so a signature collision reads one tuple, not the
    /// whole entry. The same consistency as `snap`: a tuple read while the entry changed
    /// either mismatches (a miss, as `snap` would have refused it) or is validated by the
    /// generation check after everything else is read.
    #[inline(always)]
    fn snap_of(
        &self,
        idx: usize,
        dir: Dir,
        want: &[u64; W],
        ok: impl Fn(u64) -> bool,
    ) -> Option<Snap<W>> {
        let e = self.entries.get(idx)?;
        let c1 = e.ctl.load(Ordering::Acquire);
        if !ok(life(c1)) {
            return None;
        }
        let (d, o) = match dir {
            Dir::Original => (0, 1),
            Dir::Reply => (1, 0),
        };
        let mine: [u64; W] = std::array::from_fn(|i| e.words[d][i].load(Ordering::Relaxed));
        if !same_words(&mine, want) {
            return None;
        }
        let mut w = [mine; 2];
        w[o] = std::array::from_fn(|i| e.words[o][i].load(Ordering::Relaxed));
        e.finish_snap(c1, w, ok)
    }

    #[inline]
    fn timeout_us(&self, proto: u8, c: u64) -> u64 {
        match pclass::<K, W>(proto) {
            PROTO_TCP => self.tcp_to[state_of(c) as usize],
            PROTO_UDP => {
                if status_of(c).assured() {
                    self.udp_stream_to
                } else {
                    self.udp_to
                }
            }
            PROTO_ICMP => self.icmp_to,
            _ => self.generic_to,
        }
    }

    /// When the entry expires, in microseconds.
    #[inline]
    fn deadline(&self, s: &Snap<W>) -> u64 {
        s.last_ms()
            .saturating_mul(1000)
            .saturating_add(self.timeout_us(s.proto(), s.c))
    }

    #[inline]
    fn expired(&self, s: &Snap<W>, now_us: u64) -> bool {
        now_us >= self.deadline(s)
    }

    #[inline(always)]
    fn hit_of(idx: usize, dir: Dir, s: &Snap<W>) -> CtHit<K> {
        CtHit {
            id: CtId {
                slot: slot_id(idx),
                gen: gen_of(s.c),
            },
            dir,
            orig: K::from_words(s.w[0]),
            reply: K::from_words(s.w[1]),
            status: status_of(s.c),
            mark: (s.tag >> 32) as u32,
            service: low32(s.tag),
            endpoint: (s.aux >> 32) as u32,
            state: state_of(s.c),
        }
    }

    /// Finds the entry holding tuple `l` whose life stage passes `ok` and that has not
    /// expired at `now_us`.
    #[inline(always)]
    fn find(
        &self,
        l: &CtLoc<W>,
        now_us: u64,
        ok: impl Fn(u64) -> bool + Copy,
    ) -> Option<(usize, Dir, Snap<W>)> {
        let sig = u64::from(l.sig);
        for b in self.buckets(l) {
            for s in &b.slots {
                let v = s.load(Ordering::Acquire);
                if v >> 32 != sig {
                    continue;
                }
                let (idx, dir) = slot_entry(v);
                let Some(sn) = self.snap_of(idx, dir, &l.w, ok) else {
                    continue;
                };
                if life(sn.c) != LIVE || !self.expired(&sn, now_us) {
                    return Some((idx, dir, sn));
                }
            }
        }
        None
    }

    /// The live entry with `t` as its original or reply tuple. Lock-free, no writes except a
    /// per-thread counter; an expired entry is a miss.
    #[inline]
    pub fn lookup(&self, t: &K, now: Instant) -> Option<CtHit<K>> {
        self.lookup_loc(&self.locate(t), now)
    }

    /// [`Conntrack::lookup`] for a tuple already located with [`Conntrack::locate`].
    // Always inlined: out of line (as the inliner chose once `prefetch_entry` existed) the plain
    // 100k lookup measured up to 2x slower.
    #[inline(always)]
    pub fn lookup_loc(&self, l: &CtLoc<W>, now: Instant) -> Option<CtHit<K>> {
        let (idx, dir, s) = self.find(l, now.micros(), |x| x == LIVE)?;
        self.count(C_FOUND, 1);
        Some(Self::hit_of(idx, dir, &s))
    }

    /// Whether `t` is the original or reply tuple of a live (or being inserted) entry: for a
    /// NAT port allocator choosing a free reply tuple.
    pub fn tuple_in_use(&self, t: &K, now: Instant) -> bool {
        self.find(&self.locate(t), now.micros(), |x| x == LIVE || x == PENDING)
            .is_some()
    }

    // ---- free stack ----------------------------------------------------------------------

    fn pop(&self) -> Option<usize> {
        let mut h = self.free_head.load(Ordering::Acquire);
        loop {
            let top = low32(h);
            if top == 0 {
                return None;
            }
            let idx = (top - 1) as usize;
            let next = low32(self.entries.get(idx)?.aux.load(Ordering::Relaxed));
            let new = ((h >> 32).wrapping_add(1) << 32) | u64::from(next);
            match self
                .free_head
                .compare_exchange_weak(h, new, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return Some(idx),
                Err(a) => h = a,
            }
        }
    }

    fn push(&self, idx: usize) {
        let Some(e) = self.entries.get(idx) else {
            return;
        };
        let mut h = self.free_head.load(Ordering::Relaxed);
        loop {
            e.aux.store(u64::from(low32(h)), Ordering::Relaxed);
            let new = ((h >> 32).wrapping_add(1) << 32) | (idx as u64 + 1);
            match self
                .free_head
                .compare_exchange_weak(h, new, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(a) => h = a,
            }
        }
    }

    // ---- index ---------------------------------------------------------------------------

    /// Puts index word `v` into an empty slot of the tuple's first bucket while at least half
    /// of its slots are free (so most lookups read one bucket), else of the emptier of its two
    /// buckets (two-choice balancing, so both are rarely full). False when both are full.
    fn publish(&self, l: &CtLoc<W>, v: u64) -> bool {
        let (Some(b1), Some(b2)) = (self.index.get(l.b1 as usize), self.index.get(l.b2 as usize))
        else {
            return false;
        };
        let empties = |b: &Bucket| {
            b.slots
                .iter()
                .filter(|s| s.load(Ordering::Relaxed) == 0)
                .count()
        };
        // Bounded: each failed CAS means another insert took a slot.
        for _ in 0..2 * WAYS {
            let e1 = empties(b1);
            let b = if e1 >= WAYS / 2 {
                b1
            } else {
                let e2 = empties(b2);
                if e1 == 0 && e2 == 0 {
                    return false;
                }
                if e1 >= e2 {
                    b1
                } else {
                    b2
                }
            };
            for s in &b.slots {
                if s.load(Ordering::Relaxed) == 0
                    && s.compare_exchange(0, v, Ordering::SeqCst, Ordering::Relaxed)
                        .is_ok()
                {
                    return true;
                }
            }
        }
        false
    }

    fn unpublish(&self, l: &CtLoc<W>, v: u64) {
        for b in self.buckets(l) {
            for s in &b.slots {
                if s.load(Ordering::Relaxed) == v {
                    let _ = s.compare_exchange(v, 0, Ordering::Release, Ordering::Relaxed);
                }
            }
        }
    }

    // ---- removal -------------------------------------------------------------------------

    /// Frees entry `idx` if its control word is still `expect` (LIVE or ABORTED-by-owner).
    /// Returns whether this call freed it.
    fn kill(&self, idx: usize, expect: u64) -> bool {
        let Some(e) = self.entries.get(idx) else {
            return false;
        };
        if e.ctl
            .compare_exchange(
                expect,
                with_life(expect, DYING),
                Ordering::AcqRel,
                Ordering::Relaxed,
            )
            .is_err()
        {
            return false;
        }
        // Uncount before the slot is freed: `len` then never counts more entries than hold a
        // slot, so it never reads above `max_entries` even while an insert reuses this slot.
        if life(expect) == LIVE {
            self.uncount(e, expect);
        }
        self.release(idx, gen_of(expect));
        true
    }

    /// Unlinks an entry this thread owns (DYING, or its own PENDING/ABORTED insert) from the
    /// index and frees it with the next generation.
    fn release(&self, idx: usize, gen: u32) {
        let Some(e) = self.entries.get(idx) else {
            return;
        };
        let [wo, wr] = e.load_words();
        let lo = self.locate_words(wo);
        let lr = self.locate_words(wr);
        self.unpublish(&lo, slot_value(lo.sig, idx, Dir::Original));
        self.unpublish(&lr, slot_value(lr.sig, idx, Dir::Reply));
        e.ctl.store(
            ctl(gen.wrapping_add(1), FREE, CtState::None, CtStatus(0)),
            Ordering::Release,
        );
        self.push(idx);
    }

    /// Removes the entry `id` (if it still exists). Returns whether it did.
    pub fn remove(&self, id: CtId) -> bool {
        let Some(e) = self.entries.get(id.slot as usize) else {
            return false;
        };
        loop {
            let c = e.ctl.load(Ordering::Acquire);
            if gen_of(c) != id.gen || life(c) != LIVE {
                return false;
            }
            if self.kill(id.slot as usize, c) {
                self.count(C_REMOVED, 1);
                return true;
            }
        }
    }

    // ---- insert --------------------------------------------------------------------------

    fn initial(&self, orig: &K, reply: &K, p: &Pkt) -> Result<CtState, InvalidReason> {
        if orig.proto() != reply.proto() {
            return Err(InvalidReason::ProtoMismatch);
        }
        match (pclass::<K, W>(orig.proto()), p.kind) {
            (PROTO_TCP, L4Kind::Tcp) => {
                match tcp::next(Dir::Original, p.tcp_flags, CtState::None) {
                    Next::To(CtState::SynSent) => Ok(CtState::SynSent),
                    Next::To(s) if self.liberal => Ok(s),
                    _ => Err(InvalidReason::TcpNotSyn),
                }
            }
            (PROTO_UDP, L4Kind::Udp) => Ok(CtState::None),
            (PROTO_ICMP, L4Kind::IcmpEcho { request: true }) => Ok(CtState::None),
            (PROTO_ICMP, _) => Err(InvalidReason::IcmpNotRequest),
            (PROTO_TCP | PROTO_UDP, _) => Err(InvalidReason::KindMismatch),
            (_, L4Kind::Other) => Ok(CtState::None),
            _ => Err(InvalidReason::KindMismatch),
        }
    }

    /// Inserts a new connection: `orig` as its first packet `first` travels, `reply` as the
    /// other end's packets will look (`orig.invert()` without NAT). The first packet is
    /// counted and run through the state machine. Lock-free; see the module docs for what
    /// happens when the table is full.
    ///
    /// Fails with [`InsertError::Invalid`] when `first` cannot open a connection (counted in
    /// [`CtCounters::invalid`]), [`InsertError::Clash`] when either tuple already belongs to an
    /// entry, [`InsertError::Full`], and [`InsertError::SourceLimit`] when `tag` asks for the
    /// source's limit ([`CtStatus::SOURCE_LIMITED`]) and it is reached.
    pub fn insert(
        &self,
        orig: K,
        reply: K,
        tag: CtTag,
        first: &Pkt,
        now: Instant,
    ) -> Result<CtHit<K>, InsertError<K>> {
        // The entry we are about to pop: fetch its lines while we hash.
        let top = low32(self.free_head.load(Ordering::Relaxed));
        if let Some(i) = (top as usize).checked_sub(1) {
            if let (Some(e), Some(a)) = (self.entries.get(i), self.acct.get(i)) {
                crate::sys::prefetch(e);
                crate::sys::prefetch(a);
            }
        }
        let state = match self.initial(&orig, &reply, first) {
            Ok(s) => s,
            Err(r) => {
                self.count(C_INVALID, 1);
                return Err(InsertError::Invalid(r));
            }
        };
        let limited = tag.status.has(CtStatus::SOURCE_LIMITED) && !self.per_source.is_empty();
        let mut status = tag.status.0 & CtStatus::NAT_MASK;
        if limited {
            if !self.take_source(orig.source_word()) {
                // Counted by the caller (`ct_limit` in the datapath's drop counters).
                return Err(InsertError::SourceLimit);
            }
            status |= CtStatus::SOURCE_LIMITED;
        }
        let r = self.insert_counted((orig, reply), tag, (state, status), first, now);
        if limited && r.is_err() {
            self.give_source(orig.source_word());
        }
        r
    }

    /// [`Conntrack::insert`] once the first packet is known valid (its connection's first
    /// `state`) and the source counted (`status` has the tag's bits). Out of line, so that
    /// [`Conntrack::insert`] stays the size it had before the per-source limit.
    #[inline(never)]
    fn insert_counted(
        &self,
        (orig, reply): (K, K),
        tag: CtTag,
        (state, mut status): (CtState, u16),
        first: &Pkt,
        now: Instant,
    ) -> Result<CtHit<K>, InsertError<K>> {
        if K::is_dnat(&orig, &reply) {
            status |= CtStatus::DST_NAT;
        }
        if K::is_snat(&orig, &reply) {
            status |= CtStatus::SRC_NAT;
        }
        let status = CtStatus(status);
        let lo = self.locate(&orig);
        let lr = self.locate(&reply);
        self.prefetch(&lo);
        self.prefetch(&lr);
        let now_us = now.micros();
        let idx = self.alloc(&lo, &lr, now_us)?;
        let Some(e) = self.entries.get(idx) else {
            return Err(InsertError::Full);
        };
        let Some(a) = self.acct.get(idx) else {
            return Err(InsertError::Full);
        };
        // Fill the entry while it is BUSY (seqlock "odd" state).
        let gen = gen_of(e.ctl.load(Ordering::Relaxed));
        e.ctl.store(
            ctl(gen, BUSY, CtState::None, CtStatus(0)),
            Ordering::Relaxed,
        );
        fence(Ordering::Release);
        let t = tag16(gen);
        for (slots, w) in e.words.iter().zip([lo.w, lr.w]) {
            for (slot, v) in slots.iter().zip(w) {
                slot.store(v, Ordering::Relaxed);
            }
        }
        e.last
            .store(t | ((now_us / 1000) & LOW48), Ordering::Relaxed);
        e.tag.store(
            (u64::from(tag.mark) << 32) | u64::from(tag.service),
            Ordering::Relaxed,
        );
        e.aux
            .store(u64::from(tag.endpoint) << 32, Ordering::Relaxed);
        a.w[0].store(t | 1, Ordering::Relaxed);
        a.w[1].store(t | (u64::from(first.len) & LOW48), Ordering::Relaxed);
        a.w[2].store(t, Ordering::Relaxed);
        a.w[3].store(t, Ordering::Relaxed);
        let pending = ctl(gen, PENDING, state, status);
        e.ctl.store(pending, Ordering::Release);

        let vo = slot_value(lo.sig, idx, Dir::Original);
        let vr = slot_value(lr.sig, idx, Dir::Reply);
        if !self.publish(&lo, vo) {
            self.release(idx, gen);
            self.count(C_INSERT_FAILED, 1);
            return Err(InsertError::Full);
        }
        if !self.publish(&lr, vr) {
            self.release(idx, gen);
            self.count(C_INSERT_FAILED, 1);
            return Err(InsertError::Full);
        }
        let lost = match self.resolve(idx, &lo, &lr, now_us) {
            Resolve::Win => {
                // Count the entry before it becomes LIVE, so that a remove racing right after
                // the CAS never takes `len` below zero.
                self.len.fetch_add(1, Ordering::Relaxed);
                match e.ctl.compare_exchange(
                    pending,
                    with_life(pending, LIVE),
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => None,
                    // Aborted by a racing insert of the same tuple with a lower slot.
                    Err(_) => {
                        self.len.fetch_sub(1, Ordering::Relaxed);
                        Some(self.find(&lo, now_us, |x| x == LIVE))
                    }
                }
            }
            Resolve::Lose(existing) => Some(existing),
        };
        if let Some(existing) = lost {
            self.release(idx, gen);
            self.count(C_CLASH, 1);
            let existing = existing.map(|(i, _, s)| {
                let dir = if s.tuple_words(Dir::Reply) == lo.w {
                    Dir::Reply
                } else {
                    Dir::Original
                };
                Self::hit_of(i, dir, &s)
            });
            return Err(InsertError::Clash { existing });
        }
        self.count(C_NEW, 1);
        Ok(CtHit {
            id: CtId {
                slot: slot_id(idx),
                gen,
            },
            dir: Dir::Original,
            orig,
            reply,
            status,
            mark: tag.mark,
            service: tag.service,
            endpoint: tag.endpoint,
            state,
        })
    }

    /// After publishing entry `idx` (PENDING), decides whether it may become LIVE: it loses
    /// to a LIVE entry with an equal tuple, or to a PENDING one in a lower slot; it aborts
    /// PENDING ones in higher slots and frees expired ones.
    fn resolve(&self, idx: usize, lo: &CtLoc<W>, lr: &CtLoc<W>, now_us: u64) -> Resolve<W> {
        for l in [lo, lr] {
            let sig = u64::from(l.sig);
            for b in self.buckets(l) {
                for s in &b.slots {
                    let v = s.load(Ordering::SeqCst);
                    if v >> 32 != sig {
                        continue;
                    }
                    let (oidx, odir) = slot_entry(v);
                    if oidx == idx {
                        continue;
                    }
                    // Retry when the other entry moves on under us (bounded: it can only go
                    // PENDING -> LIVE/ABORTED and LIVE -> DYING once per generation).
                    for _ in 0..4 {
                        let Some(sn) = self.snap(oidx, |x| x == LIVE || x == PENDING) else {
                            break;
                        };
                        if sn.tuple_words(odir) != l.w {
                            break;
                        }
                        if life(sn.c) == LIVE {
                            if self.expired(&sn, now_us) {
                                if self.kill(oidx, sn.c) {
                                    self.count(C_EXPIRED, 1);
                                }
                                continue;
                            }
                            return Resolve::Lose(Some((oidx, odir, sn)));
                        }
                        // PENDING.
                        if oidx < idx {
                            return Resolve::Lose(None);
                        }
                        let Some(oe) = self.entries.get(oidx) else {
                            break;
                        };
                        if oe
                            .ctl
                            .compare_exchange(
                                sn.c,
                                with_life(sn.c, ABORTED),
                                Ordering::AcqRel,
                                Ordering::Relaxed,
                            )
                            .is_ok()
                        {
                            break;
                        }
                    }
                }
            }
        }
        Resolve::Win
    }

    /// A free slot, making room when there is none (see the module docs).
    fn alloc(&self, lo: &CtLoc<W>, lr: &CtLoc<W>, now_us: u64) -> Result<usize, InsertError<K>> {
        for _ in 0..4 {
            if let Some(i) = self.pop() {
                return Ok(i);
            }
            if !self.make_room(lo, lr, now_us) {
                break;
            }
        }
        self.count(C_INSERT_FAILED, 1);
        Err(InsertError::Full)
    }

    /// Frees one entry: an expired candidate, else whatever a short sweep finds, else an
    /// unassured candidate (early drop). Returns false if nothing could be freed.
    fn make_room(&self, lo: &CtLoc<W>, lr: &CtLoc<W>, now_us: u64) -> bool {
        // (unreplied first, then oldest) victim among unassured candidates
        let mut victim: Option<(usize, u64, (bool, u64))> = None;
        for l in [lo, lr] {
            for b in self.buckets(l) {
                for s in &b.slots {
                    let v = s.load(Ordering::Acquire);
                    if v == 0 {
                        continue;
                    }
                    let (idx, _) = slot_entry(v);
                    let Some(sn) = self.snap(idx, |x| x == LIVE) else {
                        continue;
                    };
                    if self.expired(&sn, now_us) {
                        if self.kill(idx, sn.c) {
                            self.count(C_EXPIRED, 1);
                            return true;
                        }
                        continue;
                    }
                    let st = status_of(sn.c);
                    if st.assured() {
                        continue;
                    }
                    let rank = (st.seen_reply(), sn.last_ms());
                    if victim.is_none_or(|(_, _, r)| rank < r) {
                        victim = Some((idx, sn.c, rank));
                    }
                }
            }
        }
        if self.sweep_us(now_us, FULL_SWEEP_BUDGET) > 0 {
            return true;
        }
        if let Some((idx, c, _)) = victim {
            if self.kill(idx, c) {
                self.count(C_EARLY_DROP, 1);
                return true;
            }
            // It changed under us; let the caller retry.
            return true;
        }
        false
    }

    // ---- tracking ------------------------------------------------------------------------

    /// Runs a packet travelling in `hit.dir` through its connection's state machine: updates
    /// the state and status, refreshes the timeout, and counts the packet and its bytes in
    /// that direction. Lock-free. See [`Track`] for the outcomes; an entry removed since the
    /// lookup (or whose slot was reused) is [`Track::Gone`] and is never touched.
    #[inline]
    pub fn track(&self, hit: &CtHit<K>, pkt: &Pkt, now: Instant) -> Track {
        self.track_id(hit.id, hit.dir, hit.orig.proto(), pkt, now)
    }

    /// [`Conntrack::track`] from the parts of a hit it needs: the entry's id, the direction
    /// and the connection's protocol (for a caller that keeps only these, e.g. a memo).
    pub(crate) fn track_id(&self, id: CtId, dir: Dir, proto: u8, pkt: &Pkt, now: Instant) -> Track {
        let slot = id.slot as usize;
        let (Some(e), Some(a)) = (self.entries.get(slot), self.acct.get(slot)) else {
            return Track::Gone;
        };
        let now_ms = (now.micros() / 1000) & LOW48;
        let mut c = e.ctl.load(Ordering::Acquire);
        // The common case first: an ACK-class segment (no SYN, FIN or RST) of an ESTABLISHED,
        // ASSURED connection that has seen a reply changes neither state nor status (the
        // table's ES/ack cell is ES both ways), so it needs no CAS on the control word.
        const SEEN: u64 = (CtStatus::ASSURED | CtStatus::SEEN_REPLY) as u64;
        const EST: u64 = (LIVE << 20) | ((CtState::Established as u64) << 16);
        let proto = pclass::<K, W>(proto);
        if proto == PROTO_TCP
            && matches!(pkt.kind, L4Kind::Tcp)
            && pkt.tcp_flags & (flags::SYN | flags::FIN | flags::RST | flags::ACK) == flags::ACK
            && gen_of(c) == id.gen
            && c & ((7 << 20) | (0xf << 16) | SEEN) == EST | SEEN
        {
            self.refresh_count(e, a, id.gen, dir, pkt.len, now_ms, false);
            return Track::Ok(CtState::Established);
        }
        let changed;
        let new_state;
        loop {
            if gen_of(c) != id.gen || life(c) != LIVE {
                return Track::Gone;
            }
            let old = state_of(c);
            let st = status_of(c);
            let mut ns = st.0;
            let mut state = old;
            match (proto, pkt.kind) {
                (_, L4Kind::IcmpError { .. }) => return Track::Related,
                (PROTO_TCP, L4Kind::Tcp) => match tcp::next(dir, pkt.tcp_flags, old) {
                    Next::Invalid => {
                        self.count(C_INVALID, 1);
                        return Track::Invalid(InvalidReason::TcpTransition);
                    }
                    Next::Ignore => return Track::Ignored,
                    Next::To(s) => {
                        if (s == CtState::SynSent || s == CtState::SynSent2)
                            && matches!(old, CtState::TimeWait | CtState::Close)
                        {
                            if self.kill(slot, c) {
                                self.count(C_REMOVED, 1);
                                return Track::Reopen;
                            }
                            c = e.ctl.load(Ordering::Acquire);
                            continue;
                        }
                        if pkt.tcp_flags & flags::RST != 0 && !st.seen_reply() {
                            if self.kill(slot, c) {
                                self.count(C_REMOVED, 1);
                                return Track::Closed;
                            }
                            c = e.ctl.load(Ordering::Acquire);
                            continue;
                        }
                        if st.seen_reply()
                            && !st.assured()
                            && matches!(old, CtState::SynRecv | CtState::Established)
                            && s == CtState::Established
                        {
                            ns |= CtStatus::ASSURED;
                        }
                        state = s;
                    }
                },
                // Linux's udp_packet: traffic after the first reply makes a stream.
                (PROTO_UDP, L4Kind::Udp) => {
                    ns |= if st.seen_reply() {
                        CtStatus::ASSURED
                    } else {
                        0
                    }
                }
                (PROTO_ICMP, L4Kind::IcmpEcho { request }) if request != (dir == Dir::Original) => {
                    self.count(C_INVALID, 1);
                    return Track::Invalid(InvalidReason::IcmpDirection);
                }
                (PROTO_ICMP, L4Kind::IcmpEcho { .. }) => {}
                (PROTO_TCP | PROTO_UDP | PROTO_ICMP, _) | (_, L4Kind::Tcp | L4Kind::Udp) => {
                    self.count(C_INVALID, 1);
                    return Track::Invalid(InvalidReason::KindMismatch);
                }
                _ => {}
            }
            if dir == Dir::Reply {
                ns |= CtStatus::SEEN_REPLY;
            }
            let nc = ctl(gen_of(c), LIVE, state, CtStatus(ns));
            if nc == c {
                changed = false;
                new_state = state;
                break;
            }
            // Closing (TIME_WAIT, CLOSE; only a SYN leaves them, through the removal above)
            // while counted: out of line, only a changing control word pays for the check.
            if matches!(state, CtState::TimeWait | CtState::Close)
                && st.has(CtStatus::SOURCE_LIMITED)
            {
                match self.close_counted(e, c, nc) {
                    Ok(()) => {
                        changed = true;
                        new_state = state;
                        break;
                    }
                    Err(x) => {
                        c = x;
                        continue;
                    }
                }
            }
            match e
                .ctl
                .compare_exchange(c, nc, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    changed = true;
                    new_state = state;
                    break;
                }
                Err(x) => c = x,
            }
        }
        self.refresh_count(e, a, id.gen, dir, pkt.len, now_ms, changed);
        Track::Ok(new_state)
    }

    /// Refreshes the entry's timeout (exactly on a change, else at most once per
    /// [`REFRESH`]) and counts a packet of `len` bytes in `dir`, both only while the entry is
    /// still of generation `gen`.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn refresh_count(
        &self,
        e: &Entry<W>,
        a: &Acct,
        gen: u32,
        dir: Dir,
        len: u32,
        now_ms: u64,
        changed: bool,
    ) {
        let t = tag16(gen);
        let mut l = e.last.load(Ordering::Relaxed);
        let refresh_ms = REFRESH_MS;
        if changed || now_ms.saturating_sub(l & LOW48) >= refresh_ms {
            while l & !LOW48 == t && (l & LOW48) < now_ms {
                match e.last.compare_exchange_weak(
                    l,
                    t | now_ms,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => break,
                    Err(x) => l = x,
                }
            }
        }
        let d = dir as usize * 2;
        tagged_add(&a.w[d], gen, 1);
        tagged_add(&a.w[d + 1], gen, u64::from(len));
    }

    // ---- expiry and bulk operations --------------------------------------------------------

    /// Frees expired entries among the next `budget` slots (resuming where the previous call
    /// stopped, wrapping around). Returns how many it freed. Never scans more than `budget`
    /// slots; call it from a timer with a budget sized to cover the table within the shortest
    /// timeout you care about.
    pub fn sweep(&self, now: Instant, budget: usize) -> usize {
        self.sweep_us(now.micros(), budget)
    }

    fn sweep_us(&self, now_us: u64, budget: usize) -> usize {
        let n = self.entries.len();
        let budget = budget.min(n);
        if budget == 0 {
            return 0;
        }
        let start = self.cursor.fetch_add(budget, Ordering::Relaxed) % n;
        let mut freed = 0;
        for i in 0..budget {
            let idx = (start + i) % n;
            let Some(sn) = self.snap(idx, |x| x == LIVE) else {
                continue;
            };
            if self.expired(&sn, now_us) && self.kill(idx, sn.c) {
                freed += 1;
            }
        }
        if freed > 0 {
            self.count(C_EXPIRED, freed as u64);
        }
        freed
    }

    fn view_of(&self, idx: usize, s: &Snap<W>, now_us: u64) -> CtView<K> {
        let h = Self::hit_of(idx, Dir::Original, s);
        let g = tag16(gen_of(s.c));
        let ctr = |i: usize| {
            let v = self
                .acct
                .get(idx)
                .map_or(0, |a| a.w[i].load(Ordering::Relaxed));
            if v & !LOW48 == g {
                v & LOW48
            } else {
                0
            }
        };
        let proto = h.orig.proto();
        CtView {
            id: h.id,
            proto,
            protocol: proto_name(proto, K::FAMILY),
            state: (proto == PROTO_TCP).then_some(h.state),
            timeout_secs: self.deadline(s).saturating_sub(now_us) / 1_000_000,
            orig: h.orig,
            reply: h.reply,
            orig_packets: ctr(0),
            orig_bytes: ctr(1),
            reply_packets: ctr(2),
            reply_bytes: ctr(3),
            assured: h.status.assured(),
            unreplied: !h.status.seen_reply(),
            status: h.status,
            mark: h.mark,
            service: h.service,
            endpoint: h.endpoint,
        }
    }

    /// Removes every live entry for which `keep` returns false (e.g. UDP flows to a removed
    /// endpoint), and frees expired entries on the way. Returns how many `keep` removed.
    /// O(table size); lock-free like everything else.
    pub fn retain(&self, now: Instant, keep: impl FnMut(&CtView<K>) -> bool) -> usize {
        self.retain_as(now, |idx, sn, now_us| self.view_of(idx, sn, now_us), keep)
    }

    /// [`CtTable::retain`] for a caller that needs only the entries' tuples and tags (the
    /// [`CtHit`] of the original direction): no counters or timeout are read, so a scan of a
    /// large table touches the entries alone. Returns how many `keep` removed.
    pub(crate) fn retain_hits(&self, now: Instant, keep: impl FnMut(&CtHit<K>) -> bool) -> usize {
        self.retain_as(now, |idx, sn, _| Self::hit_of(idx, Dir::Original, sn), keep)
    }

    /// The scan of [`CtTable::retain`], `keep` given what `see` makes of each live entry.
    fn retain_as<T>(
        &self,
        now: Instant,
        see: impl Fn(usize, &Snap<W>, u64) -> T,
        mut keep: impl FnMut(&T) -> bool,
    ) -> usize {
        let now_us = now.micros();
        let mut removed = 0;
        let mut expired = 0;
        for idx in 0..self.entries.len() {
            let Some(sn) = self.snap(idx, |x| x == LIVE) else {
                continue;
            };
            if self.expired(&sn, now_us) {
                if self.kill(idx, sn.c) {
                    expired += 1;
                }
                continue;
            }
            if !keep(&see(idx, &sn, now_us)) && self.kill(idx, sn.c) {
                removed += 1;
            }
        }
        self.count(C_EXPIRED, expired);
        self.count(C_REMOVED, removed as u64);
        removed
    }

    /// Sets the service tag of every live entry to what `f` returns for it (given the entry
    /// and the time of its last refresh), for a process that found connections made by
    /// another ([`Conntrack::open_file`]) whose service numbers may not be its own. Returns
    /// how many tags changed. O(table size), lock-free; a tag is changed by a CAS on the
    /// entry's tag word while the entry stays of the same generation (an entry removed and
    /// reused meanwhile is left alone).
    pub fn retag_services(
        &self,
        now: Instant,
        mut f: impl FnMut(&CtView<K>, Instant) -> u32,
    ) -> usize {
        let now_us = now.micros();
        let mut changed = 0;
        for idx in 0..self.entries.len() {
            let Some(sn) = self.snap(idx, |x| x == LIVE) else {
                continue;
            };
            if self.expired(&sn, now_us) {
                continue;
            }
            let v = self.view_of(idx, &sn, now_us);
            let want = f(&v, Instant::from_millis(sn.last_ms()));
            if want == v.service {
                continue;
            }
            let Some(e) = self.entries.get(idx) else {
                continue;
            };
            let new = (sn.tag & !u64::from(u32::MAX)) | u64::from(want);
            if e.tag
                .compare_exchange(sn.tag, new, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
            {
                if gen_of(e.ctl.load(Ordering::Acquire)) == gen_of(sn.c) {
                    changed += 1;
                } else {
                    // Reused under us: give the new entry its own tag back.
                    let _ =
                        e.tag
                            .compare_exchange(new, sn.tag, Ordering::AcqRel, Ordering::Relaxed);
                }
            }
        }
        changed
    }

    /// Every live entry at `now`, sorted by protocol and original tuple.
    pub fn dump(&self, now: Instant) -> Vec<CtView<K>> {
        let now_us = now.micros();
        let mut v: Vec<CtView<K>> = (0..self.entries.len())
            .filter_map(|idx| {
                let sn = self.snap(idx, |x| x == LIVE)?;
                (!self.expired(&sn, now_us)).then(|| self.view_of(idx, &sn, now_us))
            })
            .collect();
        v.sort_by_key(|e| (e.proto, e.orig));
        v
    }

    /// [`Conntrack::dump`] as `conntrack -L` prints it, one line per entry.
    pub fn fmt_dump(&self, now: Instant) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        for e in self.dump(now) {
            let _ = writeln!(s, "{e}");
        }
        s
    }
}

/// What [`Conntrack::rebuild`] found in the entries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Rebuilt {
    pub(super) kept: usize,
    pub(super) half_written: usize,
    pub(super) invalid: usize,
    pub(super) expired: usize,
    pub(super) duplicates: usize,
}

impl<K: CtKey<W>, const W: usize> CtTable<K, W> {
    /// Whether the arrays live in a file.
    pub fn is_file_backed(&self) -> bool {
        self.file.is_some()
    }

    /// The file behind the arrays, if any.
    pub(super) fn ct_file(&self) -> Option<&super::persist::CtFile> {
        self.file.as_ref()
    }

    /// Makes a table found in a file usable, trusting nothing but fully written LIVE entries
    /// that pass the sanity checks below: every other entry is freed (with the next
    /// generation), the index is cleared and filled again from the kept entries, and the free
    /// stack and length are rebuilt. Single-threaded: nothing else may use the table yet.
    pub(super) fn rebuild(&self, now: Instant) -> Rebuilt {
        let now_us = now.micros();
        let now_ms = now_us / 1000;
        let mut r = Rebuilt::default();
        for b in self.index.iter() {
            for s in &b.slots {
                s.store(0, Ordering::Relaxed);
            }
        }
        let mut keep = vec![false; self.entries.len()];
        for (idx, (e, a)) in self.entries.iter().zip(self.acct.iter()).enumerate() {
            let c = e.ctl.load(Ordering::Relaxed);
            match life(c) {
                FREE => continue,
                LIVE => {}
                _ => {
                    r.half_written += 1;
                    self.free_slot(e, c);
                    continue;
                }
            }
            let sn = Snap {
                c,
                w: e.load_words(),
                last: e.last.load(Ordering::Relaxed),
                tag: e.tag.load(Ordering::Relaxed),
                aux: e.aux.load(Ordering::Relaxed),
            };
            if !sane::<K, W>(&sn, now_ms) {
                r.invalid += 1;
                self.free_slot(e, c);
                continue;
            }
            if self.expired(&sn, now_us) {
                r.expired += 1;
                self.free_slot(e, c);
                continue;
            }
            let lo = self.locate_words(sn.tuple_words(Dir::Original));
            let lr = self.locate_words(sn.tuple_words(Dir::Reply));
            // A tuple already held by a kept entry (no insert leaves two LIVE entries with an
            // equal tuple, but a damaged file might): the first one stays.
            if self.find(&lo, now_us, |x| x == LIVE).is_some()
                || self.find(&lr, now_us, |x| x == LIVE).is_some()
            {
                r.duplicates += 1;
                self.free_slot(e, c);
                continue;
            }
            let vo = slot_value(lo.sig, idx, Dir::Original);
            let vr = slot_value(lr.sig, idx, Dir::Reply);
            if !self.publish(&lo, vo) {
                r.invalid += 1;
                self.free_slot(e, c);
                continue;
            }
            if !self.publish(&lr, vr) {
                self.unpublish(&lo, vo);
                r.invalid += 1;
                self.free_slot(e, c);
                continue;
            }
            // Counters of another generation (a slot reused while they were being added) read
            // as zero: make them this generation's.
            let t = tag16(gen_of(c));
            for w in &a.w {
                let v = w.load(Ordering::Relaxed);
                if v & !LOW48 != t {
                    w.store(t, Ordering::Relaxed);
                }
            }
            // The free-stack link is meaningless in a live entry.
            e.aux
                .store(sn.aux & !u64::from(u32::MAX), Ordering::Relaxed);
            if let Some(k) = keep.get_mut(idx) {
                *k = true;
            }
            // Counted again against its source (the counts are not in the file).
            if status_of(c).has(CtStatus::SOURCE_LIMITED) {
                if let Some((a, b)) =
                    self.source_counters(K::from_words(sn.tuple_words(Dir::Original)).source_word())
                {
                    a.fetch_add(1, Ordering::Relaxed);
                    b.fetch_add(1, Ordering::Relaxed);
                }
            }
            r.kept += 1;
        }
        // The free stack, lowest slot on top.
        let mut head = 0u64;
        for (idx, e) in self.entries.iter().enumerate().rev() {
            if keep.get(idx).copied().unwrap_or(false) {
                continue;
            }
            let aux = e.aux.load(Ordering::Relaxed);
            e.aux
                .store((aux & !u64::from(u32::MAX)) | head, Ordering::Relaxed);
            head = idx as u64 + 1;
        }
        self.free_head.store(head, Ordering::Release);
        self.len.store(r.kept, Ordering::Release);
        self.cursor.store(0, Ordering::Relaxed);
        r
    }

    /// Marks an untrusted entry FREE with the next generation (rebuild only).
    fn free_slot(&self, e: &Entry<W>, c: u64) {
        e.ctl.store(
            ctl(gen_of(c).wrapping_add(1), FREE, CtState::None, CtStatus(0)),
            Ordering::Relaxed,
        );
    }

    /// Checks the table's invariants and says which one fails: every LIVE entry is indexed
    /// exactly once under each of its tuples (in one of the tuple's candidate buckets, with its
    /// signature), no tuple belongs to two LIVE entries, every index word points at a LIVE
    /// entry that holds that tuple, the free stack holds every other entry exactly once and
    /// nothing else, and [`Conntrack::len`] is the number of LIVE entries. For tests and
    /// tools, on a quiescent table (no insert or removal in flight); O(table size), allocates.
    pub fn check_invariants(&self) -> Result<(), String> {
        use std::collections::HashMap;
        let n = self.entries.len();
        let mut live = vec![false; n];
        let mut tuples: HashMap<[u64; W], usize> = HashMap::new();
        for (idx, e) in self.entries.iter().enumerate() {
            let c = e.ctl.load(Ordering::Acquire);
            match life(c) {
                FREE => continue,
                LIVE => {}
                l => return Err(format!("entry {idx}: life stage {l} in a quiescent table")),
            }
            live[idx] = true;
            let [wo, wr] = e.load_words();
            for (dir, tw) in [(Dir::Original, wo), (Dir::Reply, wr)] {
                if let Some(other) = tuples.insert(tw, idx) {
                    return Err(format!(
                        "tuple {} held by entries {other} and {idx}",
                        K::from_words(tw)
                    ));
                }
                let l = self.locate_words(tw);
                let v = slot_value(l.sig, idx, dir);
                let found: usize = self
                    .buckets(&l)
                    .map(|b| {
                        b.slots
                            .iter()
                            .filter(|s| s.load(Ordering::Relaxed) == v)
                            .count()
                    })
                    .sum();
                if found != 1 {
                    return Err(format!(
                        "entry {idx} ({dir:?} {}) indexed {found} times",
                        K::from_words(tw)
                    ));
                }
            }
        }
        let nlive = live.iter().filter(|&&x| x).count();
        let mut words = 0usize;
        for b in self.index.iter() {
            for s in &b.slots {
                let v = s.load(Ordering::Relaxed);
                if v == 0 {
                    continue;
                }
                words += 1;
                let (idx, _) = slot_entry(v);
                if !live.get(idx).copied().unwrap_or(false) {
                    return Err(format!("index word {v:#x} points at entry {idx}, not live"));
                }
            }
        }
        if words != 2 * nlive {
            return Err(format!("{words} index words for {nlive} live entries"));
        }
        let mut on_stack = vec![false; n];
        let mut top = low32(self.free_head.load(Ordering::Acquire));
        let mut free = 0usize;
        while top != 0 {
            let idx = (top - 1) as usize;
            let Some(e) = self.entries.get(idx) else {
                return Err(format!("free stack link {top} outside the table"));
            };
            if on_stack[idx] {
                return Err(format!("entry {idx} twice on the free stack"));
            }
            if live[idx] {
                return Err(format!("live entry {idx} on the free stack"));
            }
            on_stack[idx] = true;
            free += 1;
            top = low32(e.aux.load(Ordering::Relaxed));
        }
        if free + nlive != n {
            return Err(format!(
                "{free} free + {nlive} live entries, table of {n}: some entries are lost"
            ));
        }
        if self.len() != nlive {
            return Err(format!("len {} but {nlive} live entries", self.len()));
        }
        Ok(())
    }
}

/// The protocol class the state machines and timeouts match on: the family's ICMP
/// ([`CtKey::ICMP`]) as [`PROTO_ICMP`], another family's ICMP number as an unknown protocol
/// (255, reserved), anything else as itself. For IPv4 it is the identity.
#[inline(always)]
fn pclass<K: CtKey<W>, const W: usize>(p: u8) -> u8 {
    if p == K::ICMP {
        PROTO_ICMP
    } else if p == PROTO_ICMP {
        255
    } else {
        p
    }
}

/// Whether a LIVE entry read from a file looks like one an insert wrote: both tuples of one
/// protocol, a TCP state only for TCP, known status bits only (and the NAT bits the tuples
/// imply), no stray control bits, its refresh time of its generation and not in the future.
fn sane<K: CtKey<W>, const W: usize>(s: &Snap<W>, now_ms: u64) -> bool {
    let proto = s.proto();
    let reply_proto = proto_of(&s.w[1]);
    let c = s.c;
    let state_bits = (c >> 16) & 0xf;
    let known =
        CtStatus::SEEN_REPLY | CtStatus::ASSURED | CtStatus::NAT_MASK | CtStatus::SOURCE_LIMITED;
    let orig = K::from_words(s.tuple_words(Dir::Original));
    let reply = K::from_words(s.tuple_words(Dir::Reply));
    let st = status_of(c);
    let dnat = K::is_dnat(&orig, &reply);
    let snat = K::is_snat(&orig, &reply);
    proto == reply_proto
        && (c >> 23) & 0x1ff == 0
        && st.0 & !known == 0
        && (!dnat || st.dnat())
        && (!snat || st.snat())
        && if proto == PROTO_TCP {
            (state_bits as usize) < CtState::ALL.len() && state_bits != 0
        } else {
            state_bits == 0
        }
        && s.last & !LOW48 == tag16(gen_of(c))
        && s.last_ms() <= now_ms.saturating_add(1000)
}

#[cfg(test)]
pub(crate) fn entry_sizes() -> (usize, usize, usize) {
    (
        std::mem::size_of::<Entry<2>>(),
        std::mem::size_of::<Acct>(),
        std::mem::size_of::<Bucket>(),
    )
}
