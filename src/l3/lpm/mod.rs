//! Longest-prefix-match routing tables (FIB) for IPv4 and IPv6.
//!
//! Two layers:
//!
//! * [`Lpm`] ([`Lpm<u32>`] for `u32` addresses, [`Lpm<u128>`] for `u128`) is an **immutable,
//!   compiled snapshot** of a route set, tuned for look-ups. It is `Send + Sync`; any number
//!   of threads may look up in it at once, without locks.
//! * [`Fib`] ([`Fib<u32>`], [`Fib<u128>`]) is the **concurrently updatable** table the router uses. It
//!   owns the authoritative route set (the RIB) and publishes a fresh [`Lpm`] snapshot after
//!   every change or batch of changes.
//!
//! Addresses are plain integers in host order, the first address bit being the most
//! significant one: `u32::from(Ipv4Addr)` and `u128::from(Ipv6Addr)` give them. A route maps a
//! prefix (`prefix`, `len`) to a next-hop id (`u32`, at most [`MAX_NEXT_HOP`]); the router keeps
//! the route details in a side table indexed by that id. Host bits below `len` are ignored
//! (masked off) everywhere.
//!
//! # Structure: a Poptrie with an adaptive direct-pointing level
//!
//! The snapshot is a *Poptrie* (Asai & Ohara, SIGCOMM 2015): a multibit trie with a stride of
//! 6 bits whose nodes are compressed with two 64-bit bitmaps and population counts.
//!
//! * The top `s` address bits index a flat array (`direct`, `2^s` × 4 bytes). An entry is
//!   either a leaf (the next hop, or "no route") or a pointer to the slot's root node.
//! * A node (24 bytes) covers the next 6 bits: `vector` marks which of its 64 children are
//!   nodes; those are stored contiguously from `base1`, so the child for slot `v` is
//!   `base1 + popcount(vector & bits 0..=v) - 1`. The other slots are leaves, stored as runs
//!   of equal next hops (`leafvec` marks where a run starts) contiguously from `base0`.
//! * Prefixes are "leaf-pushed": every leaf holds the next hop of the longest prefix covering
//!   it, so a look-up walks down until it reaches a leaf and never backtracks. A slot whose
//!   longer routes all have the slot's own next hop gets no child node at all.
//! * Root nodes (those a `direct` entry points to) are stored in the leaf array, immediately
//!   followed by their own leaf runs, and a look-up fetches the root's cache line and the
//!   next one together. A look-up of a /24 in a full IPv4 table (`s` = 18) thus costs two
//!   dependent cache misses: the `direct` entry, then the root node with its leaf.
//!
//! **IPv6.** The same structure serves `u128` keys, with two additions on the look-up path:
//!
//! * a `top` array indexed by the first `t` address bits (`t` = `s` clamped to 8..=12: at
//!   most 4096 entries, 16 KiB, in the L1 cache) holds the answer wherever all the `direct`
//!   slots under that entry hold one leaf (no route, or one short route). The Internet table
//!   lies in 10 of the 4096 /12s, so [`Lpm::lookup`] answers 99.8 % of uniformly random
//!   addresses (and 98 % of those in 2000::/3) from it, inline, without a function call; the
//!   walk is out of line, so that this fast path saves no registers. (With 8 bits, 2.3 % of
//!   random addresses walked, and single look-ups of random addresses ran at half the rate.) `top` is
//!   derived from `direct` and recomputed for the slots every rebuild or patch touches.
//!   [`Lpm::lookup_batch`] reads the `top` entries of its 32 lanes first, without a branch per
//!   lane; a group with no other lane is done, one with a few (at most 8) walks just those,
//!   one with more walks all its lanes as for IPv4 (`direct` answers the others again: that
//!   measured faster for addresses inside the table than skipping lanes);
//! * the walk reads the top 64 address bits into a `u64` and steps through them with one
//!   shift per level (the slot's bit and its rank come from one left shift of the bitmap);
//!   it falls back to the 128-bit extraction only below bit 64 (routes longer than /58).
//!
//! A look-up inside a /48 of the Internet table (`s` = 18) still walks the root and four
//! node levels (bits 18-48, six at a time) before its leaf: about 170 instructions
//! (callgrind, `LPM_CALLGRIND` mode of `benches/lpm.rs`); without the u64 walk, 194.
//!
//! The full IPv4 table (~900k prefixes) compiles to 6.6 MB (7.3 bytes per prefix), and
//! [`Lpm::lookup_batch`] interleaves 32 look-ups with prefetches so that their cache misses
//! overlap.
//!
//! **Scaling both ways.** `s` is chosen from the number of routes:
//! `s = clamp(ceil(log2(routes)), 8, 18)`. A 20-route Kubernetes node table gets a 1 KiB
//! `direct` array and a handful of nodes (3 KB in all, built in 10-20 µs). A full
//! Internet table gets `s` = 18 (a 1 MiB array). Memory is therefore proportional to the
//! route count at every size, unlike DIR-24-8's fixed 32-64 MiB. A [`Fib`] that grows or
//! shrinks by a factor of 4 or more recompiles itself with the matching `s`.
//!
//! # Update scheme and thread-safety contract
//!
//! [`Fib`] follows a read-copy-update scheme built on [`arc_swap::ArcSwap`]:
//!
//! * **Readers** ([`Fib::lookup`], [`Fib::lookup_batch`], [`Fib::with_snapshot`],
//!   [`Fib::snapshot`], and a per-thread [`FibReader`]) load the current `Arc<Lpm>` from the
//!   `ArcSwap`. That is lock-free, and in the common case free of writes to cache lines
//!   shared with other threads. A reader never waits for a writer, and a writer never waits
//!   for readers. A [`FibReader`] (one per worker thread) is the cheapest: it only checks,
//!   with one relaxed load, whether a newer version was published.
//! * **Writers** ([`Fib::insert`], [`Fib::remove`], [`Fib::update`], ...) are serialised by a
//!   mutex that readers never touch. A writer applies its changes to the RIB, then builds
//!   the next snapshot *off to the side*: it patches a private copy of the current snapshot,
//!   recompiling only the smallest subtries that contain the changed prefixes (appending
//!   them; the old ones become garbage), and then publishes the copy with one atomic pointer
//!   swap. The copy is usually the snapshot published before the current one, retired and
//!   reused in place once `Arc::get_mut` proves that no reader holds it any more, so a small
//!   update costs no full copy. When a third of the arrays is garbage, when the route count
//!   changed a lot, or when a batch touches much of the table, the writer recompiles the
//!   snapshot from scratch instead.
//! * **Atomicity.** A snapshot is never modified while a reader can reach it (a retired one
//!   is patched only when provably unshared). Every reader therefore sees exactly one
//!   published version, never a half-applied update: a single
//!   [`Fib::insert`]/[`Fib::remove`] is one version, and all changes made inside one
//!   [`Fib::update`] closure become visible together, as one version.
//! * **Ordering.** Versions are published in order; each has a [`Lpm::generation`] number
//!   one higher than the previous one. Once a writer method has returned, every look-up that
//!   starts afterwards (on any thread) sees that change or a later version.
//! * **Snapshots held for long.** [`Fib::snapshot`] returns an `Arc<Lpm>` that stays valid
//!   (and unchanged) for as long as it is held; holding one keeps its memory alive and makes
//!   the next update copy the table instead of reusing the retired version (a [`FibReader`]
//!   holds the version it last used in the same way). For the hot path, prefer a
//!   [`FibReader`], [`Fib::with_snapshot`], or one snapshot per batch of packets:
//!   `snapshot()` clones an `Arc`, which writes to a cache line shared by all threads.
//! * **Memory.** A `Fib` holds the RIB (a B-tree, about 14 bytes per IPv4 route), the
//!   current snapshot and, after updates, the retired one.
//!
//! # Costs
//!
//! Measured with `benches/lpm.rs` on the real tables, on a 2-core EPYC VM shared with other
//! jobs (look-up rates vary by up to 2x between runs; ranges are over several runs):
//!
//! * IPv4, 901,899 prefixes: compiles in 45-60 ms to 6.6 MB (7.3 bytes per prefix). A
//!   [`Fib`] (RIB B-tree plus snapshot) builds in 60-75 ms and holds 19 MB (21 B/prefix),
//!   33 MB once updates make it keep a spare version. Look-ups of random addresses:
//!   15-30 M/s one at a time, 40-80 M/s with [`Lpm::lookup_batch`].
//! * IPv6, 160,147 prefixes: 15-45 ms, 3.8 MB (23.6 B/prefix). Look-ups of random
//!   addresses: 550-850 M/s single or batched (3.3-5x the best crate compared, prefix-trie),
//!   of addresses inside the table's prefixes 21-32 M/s single (3-4x), 32-51 M/s batched
//!   (5-6x). Inside the table a look-up is bound by its chain of dependent cache misses
//!   (`direct`, root, up to four nodes, leaf: the 3.8 MB do not fit a 2 MB L2): a branch-free
//!   walk of a fixed depth (no mispredicted exit) measured 15-25 % slower than this one, and
//!   a layout with the leaves as 24-byte records among the nodes (ten instructions per level)
//!   grew the table to 9.5 MB and was slower too. Two more tries did not pay either:
//!   * a wider `direct` level for large IPv6 tables: `s` = 20 (7.0 MB, 43.5 B/prefix, built
//!     in 64 ms) and 22 (20 MB, 125 B/prefix) were no faster inside the table (24 and
//!     22.5 M/s against 27 M/s at 18: 20-26-32 saves a level for /32s and /44s, not for
//!     /48s); 24 saves one for /48s and measured 30 M/s once (4.5x), for 70 MB (436 B/prefix)
//!     and a 340 ms build, so `s` stays at most 18;
//!   * backing the three arrays with transparent huge pages (2 MiB-aligned, `MADV_HUGEPAGE`,
//!     then `MADV_COLLAPSE` once built; 5.2 MB instead of 3.8): IPv6 look-ups inside the
//!     table ran at the same rate (23-28 M/s against 22-29 M/s, alternating runs); only
//!     IPv4 batches gained (15-20 %), for 27 % more memory.
//!   * (session 8, the same `LPM_LOOP=inside/single` loop, runs interleaved on a loaded
//!     machine) prefetching each node's first leaf line as the walk reaches it: 22-28 M/s
//!     against 20-26 for the current walk, within the noise; hash tables from the top 30 and
//!     42 address bits straight to the trie's nodes at those levels (skipping `direct`, the
//!     root and up to three levels): 25-27 M/s against 25-27, no gain; and one hash table per
//!     band of lengths (29-32, 33-36, ..., 45-48, expanded, all probed at once, the longest
//!     hit wins: one dependent read instead of seven): 9-10 M/s in 3.5-5 MB, worse.
//!
//!   Why 60 M/s single look-ups inside the table is out of reach here: on this VM a dependent
//!   read costs 7 ns while the data fits 1 MB, 29 ns at 2 MB (the L2 size) and 52 ns at 4 MB
//!   (a pointer chase); a loop of independent look-ups with minimal code reaches 116 M/s with
//!   two dependent reads (1 MB, then 4 MB), 61 M/s with three (1, 2, 2 MB) and 56 M/s with four
//!   (4 MB in all). A look-up inside a /48 of this table makes seven, of which the last four
//!   land in 2.7 MB of nodes and leaves (160,147 distinct next hops: 640 KB of leaves at
//!   least), and drawing the addresses from a third of the routes (1.3 MB touched) already
//!   gives 43-50 M/s, from a twelfth 58 M/s. Reaching 60 M/s would take a first read that
//!   resolves 48 address bits in under 1 MB and one read of the leaf: none of the layouts
//!   above does.
//!
//!   Session 9 found the second limit, the walk's exit branch. `LPM_LENS=…` in
//!   `benches/lpm.rs` (single / batch, M/s, quiet machine) gives addresses inside the routes
//!   of the given lengths only:
//!
//!   | lengths | routes | single | batch |
//!   |---|---|---|---|
//!   | /48 | 75,488 | 49.6 | 56.4 |
//!   | /44 | 14,365 | 67.6 | 67.5 |
//!   | /40 | 13,418 | 81.7 | 75.2 |
//!   | /32 | 22,548 | 81.9 | 83.4 |
//!   | /32 and /48 | 98,036 | 38.7 | 50.3 |
//!   | /29, /32, /36, /40, /44, /48 | 136,186 | 34.2 | 46.0 |
//!
//!   A mix of depths runs slower than its slowest part. The loop's exit is mispredicted
//!   whenever consecutive look-ups stop at different depths, and each misprediction throws
//!   away the look-ups the CPU had started behind it, so single look-ups lose their overlap.
//!   Even the deepest class alone, /48 (seven dependent reads, the branch well predicted),
//!   stays under 60 M/s.
//!
//!   Two tries did not pay:
//!   * a branch-free walk of a fixed depth (to bit 48: each level computes both the child
//!     and the leaf candidate, and a finished walk steps through an empty sink node).
//!     254 instructions a look-up instead of 171, and 27-34 M/s against 34-48 M/s for the
//!     branching walk, alternating runs: the extra work costs more than the mispredictions;
//!   * calling the POPCNT walk straight from [`Lpm::lookup`] (one frame instead of two):
//!     154 instructions instead of 171, and the same 34-37 M/s.
//! * A single change to the full IPv4 table publishes in 10-20 µs when the previous version
//!   is free to patch in place, 1.4-2 ms when a reader still holds it (the writer copies the
//!   table); a batch of 10,000 changes in ~60 ms.
//! * A 21-route table: 3 KB, compiled in 10-20 µs.
//! * Redundant more-specifics (a longer prefix with the same next hop as the prefix
//!   covering it, common in routers with few next hops) cost no node at all.
//!
//! **Build flags.** The rank computations use `u64::count_ones`. [`Lpm::lookup_batch`]
//! detects POPCNT at run time, but single look-ups only use it when the crate is compiled
//! for a CPU that has it (`-C target-cpu=x86-64-v2` or later); that makes them up to twice as
//! fast.
//!
//! # Example
//!
//! ```
//! use std::net::Ipv4Addr;
//! use tapyard::l3::lpm::Fib;
//!
//! let fib = Fib::<u32>::new();
//! fib.insert(u32::from(Ipv4Addr::new(10, 0, 0, 0)), 8, 1).unwrap();
//! fib.insert(u32::from(Ipv4Addr::new(10, 1, 0, 0)), 16, 2).unwrap();
//! assert_eq!(fib.lookup(u32::from(Ipv4Addr::new(10, 1, 2, 3))), Some(2));
//! assert_eq!(fib.lookup(u32::from(Ipv4Addr::new(10, 2, 0, 1))), Some(1));
//! assert_eq!(fib.lookup(u32::from(Ipv4Addr::new(11, 0, 0, 1))), None);
//!
//! // Several changes published atomically, as one version.
//! fib.update(|batch| {
//!     batch.remove(u32::from(Ipv4Addr::new(10, 1, 0, 0)), 16)?;
//!     batch.insert(0, 0, 7)
//! })
//! .unwrap();
//! assert_eq!(fib.lookup(u32::from(Ipv4Addr::new(10, 1, 2, 3))), Some(1));
//! assert_eq!(fib.lookup(u32::from(Ipv4Addr::new(11, 0, 0, 1))), Some(7));
//! ```

mod fib;
mod trie;

#[cfg(test)]
mod tests;

use std::fmt;
use std::hash::Hash;

pub use fib::{Fib, FibBatch, FibReader};
pub use trie::{Lpm, LpmBuilder};

/// The largest next-hop id a route may carry (`2^31 - 2`).
///
/// Next-hop ids are stored in 31 bits so that a direct-pointing entry can hold either a
/// next hop or a node index in one `u32`.
pub const MAX_NEXT_HOP: u32 = trie::NONE - 1;

/// The value [`Lpm::lookup_batch`] writes for an address that no route covers.
pub const NO_ROUTE: u32 = u32::MAX;

/// An address family usable as a key: implemented for `u32` (IPv4) and `u128` (IPv6) only.
///
/// This trait is sealed; its methods are internal.
pub trait Address: sealed::Key {}

impl Address for u32 {}
impl Address for u128 {}

mod sealed {
    use super::*;

    /// Bit manipulation the trie needs. Bits are numbered from the most significant one.
    pub trait Key: Copy + Ord + Hash + fmt::Debug + Default + Send + Sync + 'static {
        /// Address width in bits.
        const WIDTH: u8;
        /// Bits `offset .. offset + len` as an index; bits past the address width read as
        /// zero. Requires `offset < WIDTH` and `1 <= len <= 24`.
        fn extract(self, offset: u8, len: u8) -> usize;
        /// `self` with every bit from `len` on cleared. Requires `len <= WIDTH`.
        fn masked(self, len: u8) -> Self;
        /// The last address of the prefix `self/len` (`self` with the bits from `len` on set).
        fn last(self, len: u8) -> Self;
        /// The top 64 bits (for `u32`, the address followed by 32 zero bits): the IPv6
        /// look-up walks them with 64-bit shifts while the prefixes it meets end in them.
        fn hi64(self) -> u64;
        /// The first address whose top `bits` bits equal `slot`. Requires `1 <= bits <= 24`.
        fn slot_first(slot: usize, bits: u8) -> Self;
        /// The last address whose top `bits` bits equal `slot`. Requires `1 <= bits <= 24`.
        fn slot_last(slot: usize, bits: u8) -> Self;
    }

    macro_rules! impl_key {
        ($t:ty) => {
            impl Key for $t {
                const WIDTH: u8 = <$t>::BITS.to_le_bytes()[0];

                #[inline(always)]
                fn extract(self, offset: u8, len: u8) -> usize {
                    debug_assert!(offset < Self::WIDTH && (1..=24).contains(&len));
                    ((self << offset) >> (Self::WIDTH - len)) as usize
                }

                #[inline(always)]
                #[allow(
                    clippy::cast_possible_truncation,
                    reason = "the top 64 bits, shifted down first"
                )]
                fn hi64(self) -> u64 {
                    if Self::WIDTH > 64 {
                        (self >> Self::WIDTH.saturating_sub(64)) as u64
                    } else {
                        (self as u64) << 64u8.saturating_sub(Self::WIDTH)
                    }
                }

                #[inline]
                fn masked(self, len: u8) -> Self {
                    debug_assert!(len <= Self::WIDTH);
                    if len == 0 {
                        0
                    } else {
                        self & (<$t>::MAX << (Self::WIDTH - len))
                    }
                }

                #[inline]
                fn last(self, len: u8) -> Self {
                    self | <$t>::MAX.checked_shr(u32::from(len)).unwrap_or(0)
                }

                #[inline]
                #[allow(
                    clippy::cast_possible_truncation,
                    reason = "slot < 2^bits <= 2^24 (the caller's contract, debug-asserted): it fits any key type"
                )]
                fn slot_first(slot: usize, bits: u8) -> Self {
                    debug_assert!((1..=24).contains(&bits) && slot < (1 << bits));
                    (slot as $t) << (Self::WIDTH - bits)
                }

                #[inline]
                fn slot_last(slot: usize, bits: u8) -> Self {
                    Self::slot_first(slot, bits) | (<$t>::MAX >> bits)
                }
            }
        };
    }

    impl_key!(u32);
    impl_key!(u128);
}

/// One route: a prefix and the next-hop id it maps to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Route<A> {
    /// The prefix's address; bits past `len` are zero in routes this module returns.
    pub prefix: A,
    /// Prefix length in bits, `0..=32` for IPv4, `0..=128` for IPv6.
    pub len: u8,
    /// The next-hop id, at most [`MAX_NEXT_HOP`].
    pub next_hop: u32,
}

/// Why a route was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LpmError {
    /// The prefix length exceeds the address width.
    InvalidLength {
        /// The length given.
        len: u8,
        /// The address width (32 or 128).
        max: u8,
    },
    /// The next-hop id exceeds [`MAX_NEXT_HOP`].
    InvalidNextHop(u32),
}

impl fmt::Display for LpmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LpmError::InvalidLength { len, max } => {
                write!(f, "prefix length {len} exceeds the address width {max}")
            }
            LpmError::InvalidNextHop(nh) => {
                write!(f, "next-hop id {nh} exceeds the maximum {MAX_NEXT_HOP}")
            }
        }
    }
}

impl std::error::Error for LpmError {}

/// Checks a route's length and next hop and masks off its host bits.
fn normalize<A: Address>(prefix: A, len: u8, next_hop: u32) -> Result<Route<A>, LpmError> {
    let len = check_len::<A>(len)?;
    if next_hop > MAX_NEXT_HOP {
        return Err(LpmError::InvalidNextHop(next_hop));
    }
    Ok(Route {
        prefix: prefix.masked(len),
        len,
        next_hop,
    })
}

fn check_len<A: Address>(len: u8) -> Result<u8, LpmError> {
    if len > A::WIDTH {
        Err(LpmError::InvalidLength { len, max: A::WIDTH })
    } else {
        Ok(len)
    }
}
