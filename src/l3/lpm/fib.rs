//! The concurrently updatable FIB: a RIB plus published [`Lpm`] snapshots (see `mod.rs`).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use arc_swap::cache::Cache;
use arc_swap::ArcSwap;

use super::trie::{ideal_bits, Lpm, RouteSource};
use super::{check_len, normalize, Address, LpmError, Route};

/// A longest-prefix-match table that many threads read while one thread at a time changes
/// it.
///
/// Look-ups ([`Fib::lookup`], [`Fib::lookup_batch`], [`Fib::with_snapshot`]) are lock-free
/// and never wait for an update. Changes ([`Fib::insert`], [`Fib::remove`], [`Fib::update`])
/// are serialised among themselves, applied to a private copy of the compiled table and
/// published atomically: a reader sees each change, or batch of changes, entirely or not at
/// all. See the [module documentation](super) for the full contract.
///
/// Share it between threads by reference or in an `Arc`. Use [`super::Fib<u32>`] (`u32`
/// addresses) or [`super::Fib<u128>`] (`u128` addresses).
pub struct Fib<A: Address> {
    current: ArcSwap<Lpm<A>>,
    writer: Mutex<Writer<A>>,
}

struct Writer<A: Address> {
    /// The authoritative route set, ordered by `(prefix, len)`.
    rib: BTreeMap<(A, u8), u32>,
    /// The snapshot published before the current one.
    spare: Option<Spare<A>>,
    /// Direct-pointing width forced by tests.
    fixed_bits: Option<u8>,
}

/// A snapshot no longer published, kept to be patched in place into the next version once
/// no reader holds it any more (saving a copy of the whole table).
struct Spare<A: Address> {
    lpm: Arc<Lpm<A>>,
    /// The prefixes whose routes changed in the version published after it.
    changed: Vec<(A, u8)>,
}

impl<A: Address> Fib<A> {
    /// An empty table.
    pub fn new() -> Self {
        Self::with_writer(BTreeMap::new(), None)
    }

    /// A table holding `routes`; a later route for the same prefix replaces an earlier one.
    ///
    /// # Errors
    ///
    /// The first invalid route (see [`Fib::insert`]).
    pub fn from_routes<I>(routes: I) -> Result<Self, LpmError>
    where
        I: IntoIterator<Item = Route<A>>,
    {
        // Bulk-built from sorted input (keeping the last of duplicates), the B-tree's nodes
        // are full: about half the memory of inserting one by one.
        let rib = routes
            .into_iter()
            .map(|r| {
                normalize(r.prefix, r.len, r.next_hop).map(|r| ((r.prefix, r.len), r.next_hop))
            })
            .collect::<Result<BTreeMap<_, _>, _>>()?;
        Ok(Self::with_writer(rib, None))
    }

    /// An empty table whose snapshots always use a `2^bits` direct array (tests only).
    #[cfg(test)]
    pub(crate) fn with_fixed_bits(bits: u8) -> Self {
        Self::with_writer(BTreeMap::new(), Some(bits))
    }

    fn with_writer(rib: BTreeMap<(A, u8), u32>, fixed_bits: Option<u8>) -> Self {
        let routes: Vec<Route<A>> = rib_routes(&rib);
        let bits = fixed_bits.unwrap_or_else(|| ideal_bits(routes.len()));
        Fib {
            current: ArcSwap::from_pointee(Lpm::from_sorted(&routes, bits)),
            writer: Mutex::new(Writer {
                rib,
                spare: None,
                fixed_bits,
            }),
        }
    }

    // ------------------------------------------------------------------ readers

    /// The longest-prefix match for `addr` in the current version. Lock-free, but each call
    /// pays for loading the current version (two atomic read-modify-writes on a per-thread
    /// slot, some 20-50 ns): for many look-ups use a [`FibReader`], [`Fib::lookup_batch`] or
    /// [`Fib::with_snapshot`].
    #[inline]
    pub fn lookup(&self, addr: A) -> Option<u32> {
        self.current.load().lookup(addr)
    }

    /// [`Lpm::lookup_batch`] on the current version: all of `addrs` are looked up in the same
    /// version. Lock-free.
    ///
    /// # Panics
    ///
    /// If `addrs` and `out` differ in length.
    pub fn lookup_batch(&self, addrs: &[A], out: &mut [u32]) {
        self.current.load().lookup_batch(addrs, out);
    }

    /// Runs `f` on the current version without cloning its `Arc`: the cheapest way to do
    /// several look-ups in one consistent version. Lock-free. Keep `f` short: the version
    /// stays allocated while `f` runs.
    pub fn with_snapshot<R>(&self, f: impl FnOnce(&Lpm<A>) -> R) -> R {
        f(&self.current.load())
    }

    /// The current version, held until the guard is dropped: one atomic load for a whole
    /// batch of look-ups. Lock-free. Keep the guard short-lived (it delays the reuse of the
    /// version's memory, never a writer).
    pub fn load(&self) -> arc_swap::Guard<Arc<Lpm<A>>> {
        self.current.load()
    }

    /// A read handle for one thread, with the cheapest look-ups; see [`FibReader`].
    pub fn reader(&self) -> FibReader<'_, A> {
        FibReader {
            cache: Cache::new(&self.current),
        }
    }

    /// The current version, to keep. Lock-free, but clones an `Arc` (an atomic increment on a
    /// cache line that all threads share): in a per-packet path prefer a [`FibReader`],
    /// [`Fib::with_snapshot`], or one snapshot per batch of packets.
    pub fn snapshot(&self) -> Arc<Lpm<A>> {
        self.current.load_full()
    }

    /// Number of routes in the current version.
    pub fn len(&self) -> usize {
        self.current.load().len()
    }

    /// Whether the current version has no route.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The current version's generation: it grows by one with every published change.
    pub fn generation(&self) -> u64 {
        self.current.load().generation()
    }

    // ------------------------------------------------------------------ writer side

    /// Adds or replaces the route for `prefix/len` (host bits are ignored) and publishes the
    /// change. Returns the next hop it replaced.
    ///
    /// Blocks other writers (not readers) while the new version is built. To change many
    /// routes, use [`Fib::update`], which publishes once.
    ///
    /// # Errors
    ///
    /// If `len` exceeds the address width or `next_hop` exceeds [`super::MAX_NEXT_HOP`];
    /// nothing changes then.
    pub fn insert(&self, prefix: A, len: u8, next_hop: u32) -> Result<Option<u32>, LpmError> {
        self.update(|b| b.insert(prefix, len, next_hop))
    }

    /// Removes the route for exactly `prefix/len` (host bits are ignored) and publishes the
    /// change. Returns its next hop, or `None` if there was no such route.
    ///
    /// # Errors
    ///
    /// If `len` exceeds the address width.
    pub fn remove(&self, prefix: A, len: u8) -> Result<Option<u32>, LpmError> {
        self.update(|b| b.remove(prefix, len))
    }

    /// Applies the changes that `f` makes to a [`FibBatch`] and publishes them together as
    /// one version (if they changed anything).
    ///
    /// Transactional: if `f` returns `Err` (or panics), every change it made is undone and
    /// nothing is published. Other writers wait while `f` runs; readers do not.
    ///
    /// # Errors
    ///
    /// Whatever `f` returns.
    pub fn update<R, E>(
        &self,
        f: impl FnOnce(&mut FibBatch<'_, A>) -> Result<R, E>,
    ) -> Result<R, E> {
        let mut w = self.lock_writer();
        let mut batch = FibBatch {
            rib: &mut w.rib,
            undo: Vec::new(),
        };
        let result = f(&mut batch);
        let undo = std::mem::take(&mut batch.undo);
        if result.is_err() {
            batch.undo = undo;
            drop(batch); // rolls back
            return result;
        }
        drop(batch);
        // The prefixes whose route differs from before the batch (a route inserted and then
        // removed again changed nothing). The first undo entry of a prefix holds its
        // original value.
        let mut first = std::collections::HashMap::with_capacity(undo.len());
        for (key, old) in undo {
            first.entry(key).or_insert(old);
        }
        let changed: Vec<(A, u8)> = first
            .into_iter()
            .filter(|(key, old)| w.rib.get(key).copied() != *old)
            .map(|(key, _)| key)
            .collect();
        if !changed.is_empty() {
            self.publish(&mut w, &changed);
        }
        result
    }

    /// Replaces every route by `routes` and publishes the result as one version.
    ///
    /// # Errors
    ///
    /// The first invalid route; nothing changes then.
    pub fn replace_all<I>(&self, routes: I) -> Result<(), LpmError>
    where
        I: IntoIterator<Item = Route<A>>,
    {
        self.update(|b| {
            b.clear();
            for r in routes {
                b.insert(r.prefix, r.len, r.next_hop)?;
            }
            Ok(())
        })
    }

    /// The next hop of the route for exactly `prefix/len` (host bits are ignored), if any.
    /// Takes the writer lock.
    pub fn get(&self, prefix: A, len: u8) -> Option<u32> {
        let len = check_len::<A>(len).ok()?;
        self.lock_writer()
            .rib
            .get(&(prefix.masked(len), len))
            .copied()
    }

    /// A dump of all routes, sorted by `(prefix, len)`, taken under the writer lock. It is
    /// the latest published version: the copy is made before the iterator is returned, so
    /// iterating does not hold up writers.
    pub fn iter(&self) -> std::vec::IntoIter<Route<A>> {
        rib_routes(&self.lock_writer().rib).into_iter()
    }

    fn lock_writer(&self) -> MutexGuard<'_, Writer<A>> {
        // A writer that panicked has rolled its batch back (`FibBatch`'s drop), so the RIB
        // still matches the published version.
        self.writer.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Builds and publishes the version after `changed` prefixes changed in the RIB.
    fn publish(&self, w: &mut Writer<A>, changed: &[(A, u8)]) {
        let cur = self.current.load_full();
        let bits = cur.direct_bits();
        let want = w.fixed_bits.unwrap_or_else(|| ideal_bits(w.rib.len()));
        let slots = 1usize << bits;
        // Recompile from scratch when the table changed size a lot (for a better direct
        // width), when patches left too much garbage, or when much of it changed anyway.
        let short_slots: usize = changed
            .iter()
            .filter(|&&(_, len)| len <= bits)
            .map(|&(_, len)| 1usize << (bits - len))
            .sum();
        let full = want.abs_diff(bits) >= 2
            || (w.fixed_bits.is_some() && want != bits)
            || cur.mostly_garbage()
            || changed.len() > slots / 8
            || short_slots > slots / 8;
        let mut next = if full {
            w.spare = None;
            Arc::new(Lpm::from_sorted(&rib_routes(&w.rib), want))
        } else {
            // Reuse the previous version in place if no reader holds it any more: bring it
            // up to date with the changes the current version made, plus ours.
            let reusable = match w.spare.take() {
                Some(Spare {
                    mut lpm,
                    changed: mut all,
                }) if lpm.direct_bits() == bits => Arc::get_mut(&mut lpm).is_some().then(|| {
                    all.extend_from_slice(changed);
                    (lpm, all)
                }),
                _ => None,
            };
            match reusable {
                Some((mut old, all)) => {
                    Arc::get_mut(&mut old)
                        .expect("checked unique")
                        .patch(&w.rib, &all);
                    old
                }
                None => {
                    let mut lpm = cur.clone_for_patch();
                    lpm.patch(&w.rib, changed);
                    Arc::new(lpm)
                }
            }
        };
        let lpm = Arc::get_mut(&mut next).expect("unpublished snapshot is unique");
        lpm.set_len(w.rib.len());
        lpm.set_generation(cur.generation() + 1);
        drop(cur);
        let previous = self.current.swap(next);
        if !full {
            w.spare = Some(Spare {
                lpm: previous,
                changed: changed.to_vec(),
            });
        }
    }
}

impl<A: Address> RouteSource<A> for BTreeMap<(A, u8), u32> {
    fn get(&self, prefix: A, len: u8) -> Option<u32> {
        BTreeMap::get(self, &(prefix, len)).copied()
    }

    fn routes_in(&self, first: A, last: A, min_len: u8) -> Vec<Route<A>> {
        self.range((first, min_len)..=(last, A::WIDTH))
            .map(|(&(prefix, len), &next_hop)| Route {
                prefix,
                len,
                next_hop,
            })
            .collect()
    }

    fn any_in(&self, first: A, last: A, min_len: u8) -> bool {
        self.range((first, min_len)..=(last, A::WIDTH))
            .next()
            .is_some()
    }
}

fn rib_routes<A: Address>(rib: &BTreeMap<(A, u8), u32>) -> Vec<Route<A>> {
    rib.iter()
        .map(|(&(prefix, len), &next_hop)| Route {
            prefix,
            len,
            next_hop,
        })
        .collect()
}

impl<A: Address> Default for Fib<A> {
    /// An empty table.
    fn default() -> Self {
        Self::new()
    }
}

impl<A: Address> fmt::Debug for Fib<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fib")
            .field("current", &**self.current.load())
            .finish_non_exhaustive()
    }
}

/// A set of changes to a [`Fib`], published together; see [`Fib::update`].
///
/// Changes are visible to [`FibBatch::get`] at once, and to readers of the `Fib` only when
/// the batch is published.
pub struct FibBatch<'a, A: Address> {
    rib: &'a mut BTreeMap<(A, u8), u32>,
    /// Each effective change with the value it replaced, oldest first.
    undo: Vec<((A, u8), Option<u32>)>,
}

impl<A: Address> FibBatch<'_, A> {
    /// Adds or replaces the route for `prefix/len` (host bits are ignored); returns the next
    /// hop it replaced.
    ///
    /// # Errors
    ///
    /// If `len` exceeds the address width or `next_hop` exceeds [`super::MAX_NEXT_HOP`].
    pub fn insert(&mut self, prefix: A, len: u8, next_hop: u32) -> Result<Option<u32>, LpmError> {
        let r = normalize(prefix, len, next_hop)?;
        let key = (r.prefix, r.len);
        let old = self.rib.insert(key, r.next_hop);
        if old != Some(r.next_hop) {
            self.undo.push((key, old));
        }
        Ok(old)
    }

    /// Removes the route for exactly `prefix/len` (host bits are ignored); returns its next
    /// hop, or `None` if there was none.
    ///
    /// # Errors
    ///
    /// If `len` exceeds the address width.
    pub fn remove(&mut self, prefix: A, len: u8) -> Result<Option<u32>, LpmError> {
        let len = check_len::<A>(len)?;
        let key = (prefix.masked(len), len);
        let old = self.rib.remove(&key);
        if old.is_some() {
            self.undo.push((key, old));
        }
        Ok(old)
    }

    /// Removes every route.
    pub fn clear(&mut self) {
        let rib = std::mem::take(self.rib);
        self.undo
            .extend(rib.into_iter().map(|(key, nh)| (key, Some(nh))));
    }

    /// The next hop of the route for exactly `prefix/len`, with this batch's changes.
    pub fn get(&self, prefix: A, len: u8) -> Option<u32> {
        let len = check_len::<A>(len).ok()?;
        self.rib.get(&(prefix.masked(len), len)).copied()
    }

    /// Number of routes, with this batch's changes.
    pub fn len(&self) -> usize {
        self.rib.len()
    }

    /// Whether there is no route, with this batch's changes.
    pub fn is_empty(&self) -> bool {
        self.rib.is_empty()
    }
}

impl<A: Address> fmt::Debug for FibBatch<'_, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FibBatch")
            .field("routes", &self.rib.len())
            .field("changes", &self.undo.len())
            .finish()
    }
}

impl<A: Address> Drop for FibBatch<'_, A> {
    /// Undoes the changes not taken over by [`Fib::update`] (on error or panic).
    fn drop(&mut self) {
        while let Some((key, old)) = self.undo.pop() {
            match old {
                Some(nh) => self.rib.insert(key, nh),
                None => self.rib.remove(&key),
            };
        }
    }
}

/// A read handle on a [`Fib`] for one worker thread (its methods take `&mut self`): look-ups
/// through it cost one relaxed atomic load (to see whether a newer version was published)
/// on top of the look-up in the snapshot itself. Create one per thread with [`Fib::reader`].
///
/// Each call uses the latest published version. Between calls the handle keeps the
/// version it last used alive: an idle reader pins one old version in memory (and, while it
/// does, the writer copies the table instead of patching the previous version in place).
pub struct FibReader<'a, A: Address> {
    cache: Cache<&'a ArcSwap<Lpm<A>>, Arc<Lpm<A>>>,
}

impl<A: Address> FibReader<'_, A> {
    /// The longest-prefix match for `addr` in the latest version.
    #[inline]
    pub fn lookup(&mut self, addr: A) -> Option<u32> {
        self.cache.load().lookup(addr)
    }

    /// [`Lpm::lookup_batch`] in the latest version.
    ///
    /// # Panics
    ///
    /// If `addrs` and `out` differ in length.
    pub fn lookup_batch(&mut self, addrs: &[A], out: &mut [u32]) {
        self.cache.load().lookup_batch(addrs, out);
    }

    /// The latest version, for several look-ups in one consistent version.
    #[inline]
    pub fn snapshot(&mut self) -> &Arc<Lpm<A>> {
        self.cache.load()
    }
}

impl<A: Address> fmt::Debug for FibReader<'_, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FibReader").finish_non_exhaustive()
    }
}
