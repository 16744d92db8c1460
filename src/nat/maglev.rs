//! Maglev consistent hashing (Eisenbud et al., "Maglev: A Fast and Reliable Software Network
//! Load Balancer", NSDI 2016, section 3.4).
//!
//! Each backend gets a preference list over the `M` table slots, a permutation
//! `(offset + j * skip) mod M` with `offset = h1(name) mod M` and `skip = h2(name) mod (M - 1) + 1`
//! (`M` prime, so every `skip` generates the whole table). Backends take turns claiming their
//! next preferred free slot until the table is full. Every backend then owns `M / N` slots give
//! or take one, and removing a backend mostly reassigns only its own slots.
//!
//! Table size: one of the primes in [`TABLE_SIZES`]. A new table takes the smallest that is at
//! least 100 times the number of backends (the paper's advice: slot shares then differ by at
//! most 1 %), capped at 65537 (shares within a few percent up to ~650 backends, coarser
//! beyond). Changing the size would move almost every key, so [`table_size_for_update`] keeps
//! the previous size as long as it still gives each backend 20 slots or more (shares within
//! 5 %), and only ever grows it. Names are hashed with a fixed function, so every node (and
//! every restart) builds the same table for the same endpoints and size.

use std::net::SocketAddrV4;

use super::alloc::mix64;

/// Prime table sizes, smallest first.
pub const TABLE_SIZES: [u32; 5] = [251, 1021, 4093, 16381, 65537];

/// The most backends a table can hold.
pub const MAX_BACKENDS: usize = 65537;

/// A built Maglev lookup table: slot → backend index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Maglev {
    table: Box<[u32]>,
}

/// The table size for `n` backends.
pub fn table_size(n: usize) -> u32 {
    TABLE_SIZES
        .iter()
        .copied()
        .find(|&m| m as usize >= n.saturating_mul(100))
        .unwrap_or(TABLE_SIZES[TABLE_SIZES.len() - 1])
}

/// The table size for a service that had a table of `prev` slots and now has `n` backends:
/// `prev` while it holds at least 20 slots per backend, otherwise [`table_size`]`(n)` (never
/// smaller than `prev`).
pub fn table_size_for_update(prev: Option<u32>, n: usize) -> u32 {
    match prev {
        Some(p) if TABLE_SIZES.contains(&p) && p as usize >= n.saturating_mul(20) => p,
        Some(p) => table_size(n).max(if TABLE_SIZES.contains(&p) { p } else { 0 }),
        None => table_size(n),
    }
}

fn name_hash(addr: &SocketAddrV4, seed: u64) -> u64 {
    let v = u64::from(u32::from(*addr.ip())) << 16 | u64::from(addr.port());
    mix64(mix64(v ^ seed) ^ 0x5851_f42d_4c95_7f2d)
}

impl Maglev {
    /// Builds the table for `backends` (in the order given: lookups return indices into it),
    /// of [`table_size`] slots. Returns `None` for an empty list or more than
    /// [`MAX_BACKENDS`].
    pub fn new(backends: &[SocketAddrV4]) -> Option<Maglev> {
        Maglev::with_size(backends, table_size(backends.len()))
    }

    /// As [`Maglev::new`] with `m` slots, which must be one of [`TABLE_SIZES`] and at least
    /// the number of backends (`None` otherwise).
    pub fn with_size(backends: &[SocketAddrV4], m: u32) -> Option<Maglev> {
        let n = backends.len();
        if n == 0 || n > MAX_BACKENDS || !TABLE_SIZES.contains(&m) || (m as usize) < n {
            return None;
        }
        let m64 = u64::from(m);
        let mut offset = Vec::with_capacity(n);
        let mut skip = Vec::with_capacity(n);
        for b in backends {
            offset.push((name_hash(b, 0xcafe) % m64) as u32);
            skip.push((name_hash(b, 0xbeef) % (m64 - 1) + 1) as u32);
        }
        let mut next = vec![0u32; n];
        let mut table = vec![u32::MAX; m as usize].into_boxed_slice();
        let mut filled = 0u32;
        'outer: loop {
            for i in 0..n {
                // Find backend i's next preferred free slot (one always exists while
                // `filled < m`, and its permutation visits every slot).
                loop {
                    let c = ((u64::from(offset[i]) + u64::from(next[i]) * u64::from(skip[i])) % m64)
                        as usize;
                    next[i] += 1;
                    if table[c] == u32::MAX {
                        table[c] = i as u32;
                        filled += 1;
                        break;
                    }
                }
                if filled == m {
                    break 'outer;
                }
            }
        }
        Some(Maglev { table })
    }

    /// The backend index for a key (a flow hash). Never panics.
    #[inline]
    pub fn lookup(&self, key: u64) -> usize {
        let len = self.table.len() as u64;
        if len == 0 {
            return 0;
        }
        self.table
            .get((mix64(key) % len) as usize)
            .map_or(0, |&i| i as usize)
    }

    /// The number of slots.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Always false: a table has at least one slot.
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn eps(range: std::ops::Range<u8>) -> Vec<SocketAddrV4> {
        range
            .map(|i| SocketAddrV4::new(Ipv4Addr::new(10, 1, 0, i), 8080))
            .collect()
    }

    #[test]
    fn balanced_slots() {
        for n in [1usize, 2, 3, 10, 40, 100] {
            let b = eps(1..(n as u8 + 1));
            let t = Maglev::new(&b).unwrap();
            let mut c = vec![0u32; n];
            for s in t.table.iter() {
                c[*s as usize] += 1;
            }
            let (lo, hi) = (*c.iter().min().unwrap(), *c.iter().max().unwrap());
            let ideal = t.len() as f64 / n as f64;
            assert!(
                f64::from(hi - lo) <= (ideal * 0.03).max(1.0) + 1.0,
                "n={n}: {lo}..{hi}"
            );
        }
        assert_eq!(table_size(1), 251);
        assert_eq!(table_size(10), 1021);
        assert_eq!(table_size(1000), 65537);
        assert!(Maglev::new(&[]).is_none());
    }

    #[test]
    fn size_hysteresis() {
        assert_eq!(table_size_for_update(None, 2), 251);
        assert_eq!(table_size_for_update(Some(251), 3), 251);
        assert_eq!(table_size_for_update(Some(251), 12), 251);
        assert_eq!(table_size_for_update(Some(251), 13), 4093);
        assert_eq!(table_size_for_update(Some(4093), 1), 4093);
        assert!(Maglev::with_size(&eps(1..5), 1000).is_none());
    }

    #[test]
    fn deterministic() {
        let b = eps(1..20);
        assert_eq!(Maglev::new(&b), Maglev::new(&b));
    }
}
