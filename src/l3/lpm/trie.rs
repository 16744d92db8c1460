//! The compiled snapshot: a Poptrie (see the module docs in `mod.rs`).

use std::fmt;
use std::marker::PhantomData;

use super::{normalize, Address, LpmError, Route, NO_ROUTE};

/// Direct-pointing entry flag: the low 31 bits are a node index, not a leaf.
pub(crate) const NODE_FLAG: u32 = 1 << 31;
/// Internal "no route" leaf value.
pub(crate) const NONE: u32 = NODE_FLAG - 1;
/// Bits per trie node.
const STRIDE: u8 = 6;
/// `u32` words of a root node stored in `leaves` (a [`Node`]'s 24 bytes).
const ROOT_WORDS: usize = 6;
/// Smallest and largest direct-pointing width (see [`ideal_bits`]).
pub(crate) const MIN_DIRECT_BITS: u8 = 8;
pub(crate) const MAX_DIRECT_BITS: u8 = 18;
/// Bits indexing the IPv6 `top` array (see [`Lpm`]'s `top` field): `s` clamped to
/// `MIN_TOP_BITS..=MAX_TOP_BITS`, so the array is at most 16 KiB (it stays in the L1 cache)
/// and never much larger than `direct`.
const MIN_TOP_BITS: u8 = 8;
const MAX_TOP_BITS: u8 = 12;
/// Look-ups interleaved by [`Lpm::lookup_batch`] (at most 64: lanes are bits of a `u64`).
/// 32 measured better than 8, 16 and 64 on the full IPv4 table.
const LANES: usize = 32;

/// The direct-pointing width for a table of `routes` routes: `ceil(log2(routes))`, clamped
/// to `MIN_DIRECT_BITS..=MAX_DIRECT_BITS`. The `direct` array then has about one entry per
/// route, so its size follows the table's.
pub(crate) fn ideal_bits(routes: usize) -> u8 {
    let log = usize::BITS - routes.max(1).saturating_sub(1).leading_zeros();
    u8::try_from(log)
        .unwrap_or(u8::MAX)
        .clamp(MIN_DIRECT_BITS, MAX_DIRECT_BITS)
}

/// One trie node: 64 children, selected by the next 6 address bits.
#[derive(Clone, Copy, Default, Debug)]
#[repr(C)]
pub(crate) struct Node {
    /// Bit `v` set: child `v` is a node, at `base1 + rank(vector, v)`.
    vector: u64,
    /// Bit `v` set: child `v` is a leaf starting a new run, at `base0 + rank(leafvec, v)`.
    leafvec: u64,
    /// Index of this node's first leaf run in `leaves`.
    base0: u32,
    /// Index of this node's first child node in `nodes`.
    base1: u32,
}

/// Mask of bits `0..=v`.
#[inline(always)]
fn upto(v: usize) -> u64 {
    u64::MAX >> (63 - v)
}

/// Converts an internal leaf value to the public [`NO_ROUTE`] convention.
#[inline(always)]
fn public(v: u32) -> u32 {
    if v == NONE {
        NO_ROUTE
    } else {
        v
    }
}

use crate::narrow::{low32, low_usize};
use crate::sys::prefetch_ptr as prefetch;

/// An immutable longest-prefix-match table: a compiled snapshot of a route set.
///
/// Build one with [`Lpm::builder`] (or get the current one from a [`super::Fib`]). Look-ups
/// take `&self`, never lock and never allocate; the type is `Send + Sync`, so one instance
/// (usually behind an `Arc`) serves any number of threads.
///
/// Use [`super::Lpm<u32>`] (`u32` addresses) or [`super::Lpm<u128>`] (`u128` addresses).
#[derive(Clone)]
pub struct Lpm<A: Address> {
    /// Direct-pointing width `s`.
    bits: u8,
    /// IPv6 only: the width `t` of `top` (`s` clamped to 8..=12).
    top_bits: u8,
    /// IPv6 only: for each value of the top `t` address bits, the leaf value shared by all
    /// the `direct` slots under it, or `NODE_FLAG` if they differ or hold nodes. Most of the
    /// IPv6 space has no route (the Internet table lies in 2000::/3, and in 10 of its /12s
    /// only), so an address outside the table is answered from this array of at most 16 KiB,
    /// which stays in the L1 cache, without touching the 2^s-entry `direct` array. Empty for
    /// IPv4.
    top: Box<[u32]>,
    /// `2^s` entries: a leaf value, or `NODE_FLAG | i` for the root node stored in
    /// `leaves[i..i + ROOT_WORDS]`.
    direct: Vec<u32>,
    /// The non-root nodes.
    nodes: Vec<Node>,
    /// Leaf runs, and root nodes (each followed by its own leaf runs when compiled).
    leaves: Vec<u32>,
    /// Number of routes compiled in.
    routes: usize,
    /// Publication number, set by `Fib`.
    generation: u64,
    /// Unreachable nodes and leaves left behind by in-place patches.
    garbage_nodes: usize,
    garbage_leaves: usize,
    _addr: PhantomData<fn() -> A>,
}

impl<A: Address> Lpm<A> {
    /// A builder to which routes are added one by one before compiling them.
    pub fn builder() -> LpmBuilder<A> {
        LpmBuilder::new()
    }

    /// Compiles a snapshot from routes; a later route for the same prefix replaces an earlier
    /// one. Fails on the first invalid route.
    pub fn from_routes<I>(routes: I) -> Result<Self, LpmError>
    where
        I: IntoIterator<Item = Route<A>>,
    {
        let mut b = LpmBuilder::new();
        for r in routes {
            b.insert(r.prefix, r.len, r.next_hop)?;
        }
        Ok(b.build())
    }

    /// An empty table with a `2^bits` direct array.
    pub(crate) fn empty(bits: u8) -> Self {
        assert!((1..=24).contains(&bits));
        let top_bits = bits.clamp(MIN_TOP_BITS, MAX_TOP_BITS);
        Lpm {
            bits,
            top_bits,
            top: if A::WIDTH > 64 {
                vec![NONE; 1 << top_bits].into_boxed_slice()
            } else {
                Box::default()
            },
            direct: vec![NONE; 1 << bits],
            nodes: Vec::new(),
            leaves: Vec::new(),
            routes: 0,
            generation: 0,
            garbage_nodes: 0,
            garbage_leaves: 0,
            _addr: PhantomData,
        }
    }

    /// Compiles `routes`, which must be valid, sorted by `(prefix, len)` and free of
    /// duplicates, with a `2^bits` direct array.
    pub(crate) fn from_sorted(routes: &[Route<A>], bits: u8) -> Self {
        let mut t = Self::empty(bits);
        // About one node per 6 routes and 1.2 leaf runs per route on real tables.
        t.nodes.reserve(routes.len() / 5);
        t.leaves.reserve(routes.len() + routes.len() / 4);
        t.rebuild_range(0, (1 << bits) - 1, &[], routes);
        t.routes = routes.len();
        t.nodes.shrink_to_fit();
        t.leaves.shrink_to_fit();
        t
    }

    /// The longest-prefix match for `addr`: the next hop of the longest prefix containing it.
    ///
    /// For many addresses, [`Lpm::lookup_batch`] is two to four times faster.
    #[inline(always)]
    pub fn lookup(&self, addr: A) -> Option<u32> {
        if A::WIDTH <= 64 {
            return self.lookup_narrow(addr);
        }
        // An IPv6 address outside the table is answered from the small `top` array, inline;
        // the walk is a function call (out of line, so that this fast path needs no
        // registers saved).
        let t = self.top[low_usize(addr.hi64() >> (64 - self.top_bits))];
        let v = if t & NODE_FLAG == 0 {
            t
        } else {
            self.lookup_walk_wide(addr)
        };
        if v == NONE {
            None
        } else {
            Some(v)
        }
    }

    /// [`Lpm::lookup`] for IPv4 (inlined as the compiler sees fit).
    #[inline]
    fn lookup_narrow(&self, addr: A) -> Option<u32> {
        let v = self.lookup_dispatch(addr);
        if v == NONE {
            None
        } else {
            Some(v)
        }
    }

    /// Looks up every address of `addrs`, writing each next hop, or [`NO_ROUTE`] (`u32::MAX`)
    /// where no route matches, at the same index of `out`.
    ///
    /// Faster than repeated [`Lpm::lookup`] calls: it walks 32 addresses at a time in lock
    /// step and prefetches each level of the trie for all of them before reading it, so their
    /// cache misses overlap. On x86-64 it uses the POPCNT instruction when the CPU has it.
    ///
    /// # Panics
    ///
    /// If `addrs` and `out` differ in length.
    pub fn lookup_batch(&self, addrs: &[A], out: &mut [u32]) {
        assert_eq!(
            addrs.len(),
            out.len(),
            "lookup_batch: slices differ in length"
        );
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("popcnt") {
            // SAFETY: the CPU supports POPCNT, checked just above.
            unsafe { self.lookup_batch_popcnt(addrs, out) };
            return;
        }
        self.lookup_batch_inner(addrs, out);
    }

    /// [`Lpm::lookup_batch`] compiled with the POPCNT instruction (not in the x86-64
    /// baseline; without it `count_ones` is a dozen instructions).
    ///
    /// # Safety
    /// The CPU must support POPCNT (callers check `is_x86_feature_detected!("popcnt")`).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "popcnt")]
    unsafe fn lookup_batch_popcnt(&self, addrs: &[A], out: &mut [u32]) {
        self.lookup_batch_inner(addrs, out);
    }

    /// Number of routes in the table.
    pub fn len(&self) -> usize {
        self.routes
    }

    /// Whether the table has no route.
    pub fn is_empty(&self) -> bool {
        self.routes == 0
    }

    /// Heap and inline bytes this snapshot occupies (allocated capacity, garbage included).
    pub fn memory_bytes(&self) -> usize {
        std::mem::size_of::<Self>()
            + (self.top.len() + self.direct.capacity()) * std::mem::size_of::<u32>()
            + self.nodes.capacity() * std::mem::size_of::<Node>()
            + self.leaves.capacity() * std::mem::size_of::<u32>()
    }

    /// The snapshot's publication number: 0 for a snapshot built directly; a [`super::Fib`]
    /// numbers the versions it publishes 1, 2, 3, ... (so a change of generation tells a
    /// flow cache that routes may have changed).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The direct-pointing width `s` (the first level has `2^s` entries).
    pub fn direct_bits(&self) -> u8 {
        self.bits
    }

    pub(crate) fn set_generation(&mut self, generation: u64) {
        self.generation = generation;
    }

    pub(crate) fn set_len(&mut self, routes: usize) {
        self.routes = routes;
    }

    /// Whether unreachable nodes or leaves make up a third of their arrays (then a `Fib`
    /// recompiles the table, compacting it).
    pub(crate) fn mostly_garbage(&self) -> bool {
        self.garbage_nodes * 3 > self.nodes.len().max(1024)
            || self.garbage_leaves * 3 > self.leaves.len().max(4096)
    }

    /// A copy to patch, with some room to append rebuilt subtries.
    pub(crate) fn clone_for_patch(&self) -> Self {
        fn copy<T: Copy>(v: &[T]) -> Vec<T> {
            let mut c = Vec::with_capacity(v.len() + v.len() / 16 + 64);
            c.extend_from_slice(v);
            c
        }
        Lpm {
            bits: self.bits,
            top_bits: self.top_bits,
            top: self.top.clone(),
            direct: self.direct.clone(),
            nodes: copy(&self.nodes),
            leaves: copy(&self.leaves),
            routes: self.routes,
            generation: self.generation,
            garbage_nodes: self.garbage_nodes,
            garbage_leaves: self.garbage_leaves,
            _addr: PhantomData,
        }
    }

    // ---------------------------------------------------------------- look-up

    /// [`Lpm::lookup_raw`] with the POPCNT instruction when the CPU has it (checked once and
    /// cached by std): the trie walk ranks children with popcounts, a dozen instructions each
    /// without it.
    #[inline]
    fn lookup_dispatch(&self, addr: A) -> u32 {
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("popcnt") {
            // SAFETY: the CPU supports POPCNT, checked just above.
            return unsafe { self.lookup_raw_popcnt(addr) };
        }
        self.lookup_raw(addr)
    }

    /// The IPv6 walk, out of line (see [`Lpm::lookup`]).
    #[inline(never)]
    fn lookup_walk_wide(&self, addr: A) -> u32 {
        self.lookup_dispatch(addr)
    }

    /// [`Lpm::lookup_raw`] compiled with POPCNT.
    ///
    /// # Safety
    /// The CPU must support POPCNT (callers check `is_x86_feature_detected!("popcnt")`).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "popcnt")]
    unsafe fn lookup_raw_popcnt(&self, addr: A) -> u32 {
        self.lookup_raw(addr)
    }

    /// The leaf value for `addr` (`NONE` if no route matches).
    #[inline(always)]
    fn lookup_raw(&self, addr: A) -> u32 {
        if A::WIDTH > 64 {
            return self.lookup_raw_wide(addr);
        }
        let e = self.direct[addr.extract(0, self.bits)];
        if e & NODE_FLAG == 0 {
            return e;
        }
        let root = (e & !NODE_FLAG) as usize;
        // The root node's leaf runs follow it: fetch the next cache line in parallel.
        prefetch(self.leaves.as_ptr().wrapping_add(root + 16));
        let mut node = self.root(root);
        let mut off = self.bits;
        loop {
            let v = addr.extract(off, STRIDE);
            let m = upto(v);
            if (node.vector >> v) & 1 != 0 {
                node =
                    self.nodes[node.base1 as usize + (node.vector & m).count_ones() as usize - 1];
                off += STRIDE;
            } else {
                return self.leaves
                    [node.base0 as usize + (node.leafvec & m).count_ones() as usize - 1];
            }
        }
    }

    /// [`Lpm::lookup_raw`] for IPv6: walks the top 64 address bits with 64-bit shifts (most
    /// prefixes end in them), then the rest with the generic 128-bit extraction.
    #[inline(always)]
    fn lookup_raw_wide(&self, addr: A) -> u32 {
        let hi = addr.hi64();
        let e = self.direct[low_usize(hi >> (64 - self.bits))];
        if e & NODE_FLAG == 0 {
            return e;
        }
        let root = (e & !NODE_FLAG) as usize;
        prefetch(self.leaves.as_ptr().wrapping_add(root + 16));
        let mut node = self.root(root);
        let mut off = self.bits;
        // `key`'s top 6 bits are the next slot `v`. Shifting a bitmap left by `63 - v` keeps
        // its bits `0..=v` (bit `v` on top), so one shift gives both the test and the rank.
        let mut key = hi << off;
        while off <= 64 - STRIDE {
            let sh = !key >> (64 - STRIDE); // 63 - v
            let vec = node.vector << sh;
            if vec >> 63 != 0 {
                node = self.nodes[node.base1 as usize + vec.count_ones() as usize - 1];
                key <<= STRIDE;
                off += STRIDE;
            } else {
                return self.leaves
                    [node.base0 as usize + (node.leafvec << sh).count_ones() as usize - 1];
            }
        }
        loop {
            let v = addr.extract(off, STRIDE);
            let m = upto(v);
            if (node.vector >> v) & 1 != 0 {
                node =
                    self.nodes[node.base1 as usize + (node.vector & m).count_ones() as usize - 1];
                off += STRIDE;
            } else {
                return self.leaves
                    [node.base0 as usize + (node.leafvec & m).count_ones() as usize - 1];
            }
        }
    }

    /// Recomputes the `top` entries over direct slots `lo..=hi` (IPv6 only).
    fn refresh_top(&mut self, lo: usize, hi: usize) {
        if A::WIDTH <= 64 {
            return;
        }
        // A `top` entry covers 2^(s - t) slots, or part of one slot (tests use s < 8).
        let tb = self.top_bits;
        let (shift, (first_t, last_t)) = if self.bits >= tb {
            let shift = self.bits - tb;
            (shift, (lo >> shift, hi >> shift))
        } else {
            let up = tb - self.bits;
            (0, (lo << up, ((hi + 1) << up) - 1))
        };
        for t in first_t..=last_t {
            let slots = if self.bits >= tb {
                &self.direct[t << shift..(t + 1) << shift]
            } else {
                let slot = t >> (tb - self.bits);
                &self.direct[slot..=slot]
            };
            let first = slots[0];
            self.top[t] = if first & NODE_FLAG == 0 && slots.iter().all(|&e| e == first) {
                first
            } else {
                NODE_FLAG
            };
        }
    }

    /// The root node stored at word `i` of `leaves`.
    #[inline(always)]
    fn root(&self, i: usize) -> Node {
        let w: &[u32; ROOT_WORDS] = self.leaves[i..i + ROOT_WORDS]
            .try_into()
            .expect("root node words");
        Node {
            vector: u64::from(w[0]) | (u64::from(w[1]) << 32),
            leafvec: u64::from(w[2]) | (u64::from(w[3]) << 32),
            base0: w[4],
            base1: w[5],
        }
    }

    fn write_root(&mut self, i: usize, node: Node) {
        self.leaves[i..i + ROOT_WORDS].copy_from_slice(&[
            low32(node.vector),
            (node.vector >> 32) as u32,
            low32(node.leafvec),
            (node.leafvec >> 32) as u32,
            node.base0,
            node.base1,
        ]);
    }

    #[inline(always)]
    fn lookup_batch_inner(&self, addrs: &[A], out: &mut [u32]) {
        let mut a_chunks = addrs.chunks_exact(LANES);
        let mut o_chunks = out.chunks_exact_mut(LANES);
        for (a, o) in (&mut a_chunks).zip(&mut o_chunks) {
            self.lookup_group(a, o);
        }
        for (a, o) in a_chunks
            .remainder()
            .iter()
            .zip(o_chunks.into_remainder().iter_mut())
        {
            *o = public(self.lookup_raw(*a));
        }
    }

    /// Looks up `LANES` addresses level by level, prefetching each level for all lanes
    /// before reading it, so that their cache misses overlap. (A branch-free variant that
    /// keeps the active lanes in compacted lists measured slower.)
    #[inline(always)]
    fn lookup_group(&self, a: &[A], o: &mut [u32]) {
        let a: &[A; LANES] = a.try_into().expect("group of LANES addresses");
        let o: &mut [u32; LANES] = o.try_into().expect("group of LANES results");
        if A::WIDTH > 64 {
            // IPv6: most addresses outside the table are answered by `top` (without a
            // branch per lane). A group with a few other lanes walks just those; one with
            // many goes the whole way below (cheaper per lane than skipping lanes), where
            // `direct` gives the top-answered lanes the same answer again.
            let mut pending = 0u64;
            for i in 0..LANES {
                let t = self.top[low_usize(a[i].hi64() >> (64 - self.top_bits))];
                o[i] = t;
                pending |= u64::from(t >> 31) << i;
            }
            if pending.count_ones() as usize <= LANES / 4 {
                if pending != 0 {
                    self.walk_group_wide(a, o, pending);
                }
                for x in o.iter_mut() {
                    *x = public(*x);
                }
                return;
            }
        }
        let mut cur = [0usize; LANES];
        for i in 0..LANES {
            cur[i] = a[i].extract(0, self.bits);
            prefetch(self.direct.as_ptr().wrapping_add(cur[i]));
        }
        let mut pending = 0u64;
        for i in 0..LANES {
            let e = self.direct[cur[i]];
            if e & NODE_FLAG != 0 {
                // A root node and, in the next cache line, the start of its leaf runs.
                cur[i] = (e & !NODE_FLAG) as usize;
                prefetch(self.leaves.as_ptr().wrapping_add(cur[i]));
                prefetch(self.leaves.as_ptr().wrapping_add(cur[i] + 16));
                pending |= 1 << i;
            } else {
                o[i] = e;
            }
        }
        self.walk_lanes(a, o, &mut cur, pending);
        for x in o.iter_mut() {
            *x = public(*x);
        }
    }

    /// [`Lpm::lookup_group`] for the few lanes of `pending` (those `top` did not answer) of
    /// an IPv6 group: as for a whole group, but skipping the others.
    #[inline(always)]
    fn walk_group_wide(&self, a: &[A; LANES], o: &mut [u32; LANES], mut pending: u64) {
        let mut cur = [0usize; LANES];
        let mut p = pending;
        while p != 0 {
            let i = p.trailing_zeros() as usize;
            p &= p - 1;
            cur[i] = low_usize(a[i].hi64() >> (64 - self.bits));
            prefetch(self.direct.as_ptr().wrapping_add(cur[i]));
        }
        let mut p = pending;
        pending = 0;
        while p != 0 {
            let i = p.trailing_zeros() as usize;
            p &= p - 1;
            let e = self.direct[cur[i]];
            o[i] = e;
            // A root node and, in the next cache line, the start of its leaf runs.
            cur[i] = (e & !NODE_FLAG) as usize;
            prefetch(self.leaves.as_ptr().wrapping_add(cur[i]));
            prefetch(self.leaves.as_ptr().wrapping_add(cur[i] + 16));
            pending |= u64::from(e >> 31) << i;
        }
        self.walk_lanes(a, o, &mut cur, pending);
    }

    /// The trie walk shared by [`Lpm::lookup_group`] and [`Lpm::walk_group_wide`]: walks
    /// the lanes of `pending`, whose `cur` is the index of their root node in `leaves`
    /// (prefetched), level by level, prefetching each lane's next node or leaf for all lanes
    /// before reading any, and writes each lane's leaf value to `o`.
    #[inline(always)]
    fn walk_lanes(
        &self,
        a: &[A; LANES],
        o: &mut [u32; LANES],
        cur: &mut [usize; LANES],
        mut pending: u64,
    ) {
        let mut at_leaf = 0u64;
        let mut off = self.bits;
        let mut at_root = true;
        while pending != 0 {
            let mut next = 0u64;
            let mut p = pending;
            while p != 0 {
                let i = p.trailing_zeros() as usize;
                p &= p - 1;
                let node = if at_root {
                    self.root(cur[i])
                } else {
                    self.nodes[cur[i]]
                };
                let v = a[i].extract(off, STRIDE);
                let m = upto(v);
                if (node.vector >> v) & 1 != 0 {
                    cur[i] = node.base1 as usize + (node.vector & m).count_ones() as usize - 1;
                    prefetch(self.nodes.as_ptr().wrapping_add(cur[i]));
                    next |= 1 << i;
                } else {
                    cur[i] = node.base0 as usize + (node.leafvec & m).count_ones() as usize - 1;
                    prefetch(self.leaves.as_ptr().wrapping_add(cur[i]));
                    at_leaf |= 1 << i;
                }
            }
            pending = next;
            off += STRIDE;
            at_root = false;
        }
        while at_leaf != 0 {
            let i = at_leaf.trailing_zeros() as usize;
            at_leaf &= at_leaf - 1;
            o[i] = self.leaves[cur[i]];
        }
    }

    // ---------------------------------------------------------------- patching

    /// Brings the snapshot up to date with `rib` after the routes `changed` changed there
    /// (added, removed or given another next hop), rebuilding as little as possible:
    ///
    /// * a change of length `<= s` changes the defaults of a range of direct slots: those
    ///   slots are recompiled whole;
    /// * a longer change recompiles only the deepest node whose range contains the changed
    ///   prefix and that stays a node (its children and leaves are rebuilt and appended; the
    ///   node itself is rewritten in place, so its parent is untouched). A slot with many
    ///   changes is recompiled whole instead.
    ///
    /// Both are idempotent, so patching an older snapshot with the union of the changes made
    /// since it was current is correct too.
    pub(crate) fn patch(&mut self, rib: &impl RouteSource<A>, changed: &[(A, u8)]) {
        let bits = self.bits;
        let mut ranges = Vec::new();
        let mut long = Vec::new();
        for &(prefix, len) in changed {
            let first = prefix.extract(0, bits);
            if len <= bits {
                ranges.push((first, first + (1usize << (bits - len)) - 1));
            } else {
                long.push((first, prefix, len));
            }
        }
        long.sort_unstable();
        for group in long.chunk_by(|a, b| a.0 == b.0) {
            if group.len() > 16 {
                ranges.push((group[0].0, group[0].0));
            }
        }
        let ranges = merge_ranges(ranges);
        for &(lo, hi) in &ranges {
            self.patch_range(rib, lo, hi);
        }
        for (slot, prefix, len) in long {
            let i = ranges.partition_point(|r| r.1 < slot);
            if ranges.get(i).is_none_or(|r| r.0 > slot) {
                self.patch_prefix(rib, prefix, len);
            }
        }
    }

    /// Recompiles direct slots `lo..=hi` from `rib`.
    fn patch_range(&mut self, rib: &impl RouteSource<A>, lo: usize, hi: usize) {
        let bits = self.bits;
        let first = A::slot_first(lo, bits);
        let covering: Vec<Route<A>> = (0..=bits)
            .filter_map(|len| {
                let prefix = first.masked(len);
                if prefix == first {
                    return None; // inside the range: among `routes`
                }
                rib.get(prefix, len).map(|next_hop| Route {
                    prefix,
                    len,
                    next_hop,
                })
            })
            .collect();
        let routes = rib.routes_in(first, A::slot_last(hi, bits), 0);
        self.rebuild_range(lo, hi, &covering, &routes);
    }

    /// Recompiles the deepest node containing `prefix/len` (longer than `s`) that remains a
    /// node, or the whole direct slot if that is the root node or there is none.
    fn patch_prefix(&mut self, rib: &impl RouteSource<A>, prefix: A, len: u8) {
        let bits = self.bits;
        let slot = prefix.extract(0, bits);
        let e = self.direct[slot];
        let slot_first = A::slot_first(slot, bits);
        if e & NODE_FLAG == 0 || !rib.any_in(slot_first, slot_first.last(bits), bits + 1) {
            return self.patch_range(rib, slot, slot);
        }
        let mut node = self.root((e & !NODE_FLAG) as usize);
        let mut idx = None; // index in `nodes` of `node`, None for the root
        let mut off = bits;
        while len > off + STRIDE {
            let v = prefix.extract(off, STRIDE);
            if (node.vector >> v) & 1 == 0 {
                break;
            }
            let child_first = prefix.masked(off + STRIDE);
            let child_last = child_first.last(off + STRIDE);
            if !rib.any_in(child_first, child_last, off + STRIDE + 1) {
                break; // the child becomes a leaf: its parent changes
            }
            let child = node.base1 as usize + (node.vector & upto(v)).count_ones() as usize - 1;
            node = self.nodes[child];
            idx = Some(child);
            off += STRIDE;
        }
        let Some(idx) = idx else {
            // A new root, so that its leaf runs follow it again.
            return self.patch_range(rib, slot, slot);
        };
        let first = prefix.masked(off);
        let routes = rib.routes_in(first, first.last(off), off + 1);
        let default = (0..=off)
            .rev()
            .find_map(|l| rib.get(first.masked(l), l))
            .unwrap_or(NONE);
        self.add_garbage(node);
        self.nodes[idx] = self.build_node(off, &routes, default);
    }

    // ---------------------------------------------------------------- building

    /// Recompiles direct slots `lo..=hi` (and the subtries under them).
    ///
    /// * `covering`: the routes with `len <= bits` that contain slot `lo` but start before it,
    ///   shortest first.
    /// * `routes`: every route whose prefix lies in slots `lo..=hi`, sorted by
    ///   `(prefix, len)`, without duplicates.
    ///
    /// Subtries replaced are counted as garbage; new ones are appended.
    fn rebuild_range(&mut self, lo: usize, hi: usize, covering: &[Route<A>], routes: &[Route<A>]) {
        let bits = self.bits;
        // The longest route of length <= bits covering each slot: paint containers before
        // the routes nested in them ((prefix, len) order guarantees that).
        let mut defaults = vec![NONE; hi - lo + 1];
        for r in covering.iter().chain(routes.iter()) {
            if r.len > bits {
                continue;
            }
            let first = r.prefix.extract(0, bits);
            let last = first + (1usize << (bits - r.len)) - 1;
            let (a, b) = (first.max(lo), last.min(hi));
            if a <= b {
                defaults[a - lo..=b - lo].fill(r.next_hop);
            }
        }
        // Routes longer than `bits` get a subtrie under their slot (unless they all have the
        // slot's next hop); they are contiguous per slot, after the slot's short routes.
        let mut next_slot = lo;
        let mut i = 0;
        while i < routes.len() {
            if routes[i].len <= bits {
                i += 1;
                continue;
            }
            let slot = routes[i].prefix.extract(0, bits);
            let start = i;
            while i < routes.len() && routes[i].prefix.extract(0, bits) == slot {
                i += 1;
            }
            let group = &routes[start..i];
            if group.iter().all(|r| r.next_hop == defaults[slot - lo]) {
                continue; // redundant more-specifics: the slot stays a leaf
            }
            for s in next_slot..slot {
                self.set_direct(s, defaults[s - lo]);
            }
            // The root node goes into `leaves`, right before its leaf runs.
            reserve_more(&mut self.leaves, ROOT_WORDS + 64);
            let root = self.leaves.len();
            self.leaves.extend_from_slice(&[0; ROOT_WORDS]);
            let node = self.build_node(bits, group, defaults[slot - lo]);
            self.write_root(root, node);
            self.set_direct(slot, NODE_FLAG | index_u32(root));
            next_slot = slot + 1;
        }
        for s in next_slot..=hi {
            self.set_direct(s, defaults[s - lo]);
        }
        self.refresh_top(lo, hi);
    }

    /// Sets a direct entry, counting the subtrie it replaces as garbage.
    fn set_direct(&mut self, slot: usize, entry: u32) {
        let old = self.direct[slot];
        if old & NODE_FLAG != 0 {
            self.add_garbage(self.root((old & !NODE_FLAG) as usize));
            self.garbage_leaves += ROOT_WORDS;
        }
        self.direct[slot] = entry;
    }

    /// Counts the leaf runs and the descendants of `node` as garbage.
    fn add_garbage(&mut self, node: Node) {
        let mut stack = vec![node];
        while let Some(node) = stack.pop() {
            self.garbage_leaves += node.leafvec.count_ones() as usize;
            let children = node.vector.count_ones() as usize;
            self.garbage_nodes += children;
            let base = node.base1 as usize;
            stack.extend_from_slice(&self.nodes[base..base + children]);
        }
    }

    /// Builds the node for the bits `off..off + 6`: appends its leaf runs to `leaves`, then
    /// its children (a contiguous block) and their descendants to `nodes`. `routes` are the
    /// routes under it (all longer than `off`), sorted; `default` is the next hop of the
    /// longest route of length `<= off` covering it.
    fn build_node(&mut self, off: u8, routes: &[Route<A>], default: u32) -> Node {
        let end = off + STRIDE;
        let mut slots = [default; 64];
        for r in routes.iter().filter(|r| r.len <= end) {
            let j = r.prefix.extract(off, STRIDE);
            slots[j..j + (1usize << (end - r.len))].fill(r.next_hop);
        }
        // A slot needs a child node only if a longer route in it has another next hop than
        // the slot's (else every address in it resolves to that next hop anyway).
        let mut vector = 0u64;
        for r in routes.iter().filter(|r| r.len > end) {
            let j = r.prefix.extract(off, STRIDE);
            if r.next_hop != slots[j] {
                vector |= 1 << j;
            }
        }
        // Leaf runs: consecutive leaf slots (skipping child-node slots) with one next hop.
        reserve_more(&mut self.leaves, 64);
        let base0 = index_u32(self.leaves.len());
        let mut leafvec = 0u64;
        let mut prev = None;
        for (j, &value) in slots.iter().enumerate() {
            if (vector >> j) & 1 == 0 && prev != Some(value) {
                leafvec |= 1 << j;
                self.leaves.push(value);
                prev = Some(value);
            }
        }
        let base1 = self.nodes.len();
        reserve_more(&mut self.nodes, vector.count_ones() as usize);
        self.nodes
            .resize(base1 + vector.count_ones() as usize, Node::default());
        let mut child = base1;
        let mut i = 0;
        while i < routes.len() {
            if routes[i].len <= end {
                i += 1;
                continue;
            }
            let j = routes[i].prefix.extract(off, STRIDE);
            let start = i;
            while i < routes.len() && routes[i].prefix.extract(off, STRIDE) == j {
                i += 1;
            }
            if (vector >> j) & 1 != 0 {
                self.nodes[child] = self.build_node(end, &routes[start..i], slots[j]);
                child += 1;
            }
        }
        Node {
            vector,
            leafvec,
            base0,
            base1: index_u32(base1),
        }
    }
}

/// Where patches read the current routes from (the `Fib`'s RIB).
pub(crate) trait RouteSource<A: Address> {
    /// The next hop of the route for exactly `prefix/len`.
    fn get(&self, prefix: A, len: u8) -> Option<u32>;
    /// The routes whose prefix lies in `first..=last`, except those at `first` shorter than
    /// `min_len`, sorted by `(prefix, len)`.
    fn routes_in(&self, first: A, last: A, min_len: u8) -> Vec<Route<A>>;
    /// Whether [`RouteSource::routes_in`] would return any route.
    fn any_in(&self, first: A, last: A, min_len: u8) -> bool;
}

/// Sorts slot ranges `(lo, hi)` and merges those that overlap or touch.
fn merge_ranges(mut ranges: Vec<(usize, usize)>) -> Vec<(usize, usize)> {
    ranges.sort_unstable();
    let mut out: Vec<(usize, usize)> = Vec::with_capacity(ranges.len());
    for (lo, hi) in ranges {
        match out.last_mut() {
            Some(last) if lo <= last.1 + 1 => last.1 = last.1.max(hi),
            _ => out.push((lo, hi)),
        }
    }
    out
}

/// Makes room for `extra` more elements, growing by an eighth rather than doubling: patched
/// snapshots grow little at a time, and doubling would waste up to half their memory.
fn reserve_more<T>(v: &mut Vec<T>, extra: usize) {
    if v.capacity() - v.len() < extra {
        v.reserve_exact(extra.max(v.len() / 8 + 64));
    }
}

fn index_u32(i: usize) -> u32 {
    match u32::try_from(i) {
        Ok(x) if x < NODE_FLAG => x,
        _ => panic!("LPM table too large"),
    }
}

impl<A: Address> Default for Lpm<A> {
    /// An empty table.
    fn default() -> Self {
        Self::empty(MIN_DIRECT_BITS)
    }
}

impl<A: Address> fmt::Debug for Lpm<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lpm")
            .field("routes", &self.routes)
            .field("generation", &self.generation)
            .field("direct_bits", &self.bits)
            .field("nodes", &self.nodes.len())
            .field("leaves", &self.leaves.len())
            .field("garbage_nodes", &self.garbage_nodes)
            .field("garbage_leaves", &self.garbage_leaves)
            .field("memory_bytes", &self.memory_bytes())
            .finish()
    }
}

/// Collects routes for an [`Lpm`]; see [`Lpm::builder`].
#[derive(Clone, Debug, Default)]
pub struct LpmBuilder<A: Address> {
    routes: Vec<Route<A>>,
}

impl<A: Address> LpmBuilder<A> {
    /// An empty builder.
    pub fn new() -> Self {
        LpmBuilder { routes: Vec::new() }
    }

    /// An empty builder with room for `n` routes.
    pub fn with_capacity(n: usize) -> Self {
        LpmBuilder {
            routes: Vec::with_capacity(n),
        }
    }

    /// Adds a route for `prefix/len` (host bits are ignored). A later route for the same
    /// prefix replaces an earlier one.
    ///
    /// # Errors
    ///
    /// If `len` exceeds the address width or `next_hop` exceeds [`super::MAX_NEXT_HOP`].
    pub fn insert(&mut self, prefix: A, len: u8, next_hop: u32) -> Result<&mut Self, LpmError> {
        self.routes.push(normalize(prefix, len, next_hop)?);
        Ok(self)
    }

    /// The routes added so far, in order (host bits masked off).
    pub fn routes(&self) -> &[Route<A>] {
        &self.routes
    }

    /// Number of routes added so far (duplicates included).
    pub fn len(&self) -> usize {
        self.routes.len()
    }

    /// Whether no route was added.
    pub fn is_empty(&self) -> bool {
        self.routes.is_empty()
    }

    /// Compiles the routes, choosing the direct-pointing width from their number.
    pub fn build(self) -> Lpm<A> {
        let routes = sort_dedup(self.routes);
        let bits = ideal_bits(routes.len());
        Lpm::from_sorted(&routes, bits)
    }

    /// Like [`LpmBuilder::build`] with a given direct-pointing width (tests).
    #[cfg(test)]
    pub(crate) fn build_with_bits(self, bits: u8) -> Lpm<A> {
        Lpm::from_sorted(&sort_dedup(self.routes), bits)
    }
}

/// Sorts by `(prefix, len)`; of duplicates, keeps the one added last.
fn sort_dedup<A: Address>(mut routes: Vec<Route<A>>) -> Vec<Route<A>> {
    // Stable, so duplicates stay in insertion order.
    routes.sort_by_key(|r| (r.prefix, r.len));
    // `dedup_by` keeps the first of equal neighbours: copy the later route into it.
    routes.dedup_by(|later, kept| {
        let same = later.prefix == kept.prefix && later.len == kept.len;
        if same {
            *kept = *later;
        }
        same
    });
    routes
}
