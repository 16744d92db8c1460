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
//! least 400 times the number of backends, capped at 65537. The paper's advice is 100 times
//! (slot shares then differ by at most 1 %); the larger table also cuts the keys that move
//! between *remaining* backends when one is removed (measured with 10 backends: 4.2 % of
//! keys at 251 slots, 2.1 % at 1021, 1.1 % at 4093, 0.45 % at 16381, 0.24 % at 65537), for
//! 2 bytes per slot (8 KiB for up to 10 backends). Changing the size would move almost every
//! key, so [`table_size_for_update`] keeps the previous size as long as it still gives each
//! backend 100 slots or more, and only ever grows it. Beyond 655 backends shares are coarser
//! than 1 % (65537 slots is the largest table). Names are hashed with a fixed function, so every node (and
//! every restart) builds the same table for the same endpoints and size.

use std::net::{SocketAddrV4, SocketAddrV6};

use super::alloc::mix64;
use crate::narrow::{low32, reduce};

/// Prime table sizes, smallest first.
pub const TABLE_SIZES: [u32; 4] = [1021, 4093, 16381, 65537];

/// The most backends a table can hold (indices are 16-bit).
pub const MAX_BACKENDS: usize = 65535;

/// A built Maglev lookup table: slot → backend index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Maglev {
    table: Box<[u16]>,
}

/// The table size for `n` backends.
pub fn table_size(n: usize) -> u32 {
    TABLE_SIZES
        .iter()
        .copied()
        .find(|&m| m as usize >= n.saturating_mul(400))
        .unwrap_or(TABLE_SIZES[TABLE_SIZES.len() - 1])
}

/// The table size for a service that had a table of `prev` slots and now has `n` backends:
/// `prev` while it holds at least 100 slots per backend, otherwise [`table_size`]`(n)` (never
/// smaller than `prev`).
pub fn table_size_for_update(prev: Option<u32>, n: usize) -> u32 {
    match prev {
        Some(p) if TABLE_SIZES.contains(&p) && p as usize >= n.saturating_mul(100) => p,
        Some(p) => table_size(n).max(if TABLE_SIZES.contains(&p) { p } else { 0 }),
        None => table_size(n),
    }
}

fn is_prime(m: u32) -> bool {
    m >= 2 && (2..).take_while(|d| d * d <= m).all(|d| m % d != 0)
}

/// A backend's address as Maglev hashes it (an IPv4 or IPv6 endpoint).
pub trait Backend {
    /// A fixed 64-bit name of the backend (the same on every node and every run).
    fn name(&self) -> u64;
}

impl Backend for SocketAddrV4 {
    fn name(&self) -> u64 {
        u64::from(u32::from(*self.ip())) << 16 | u64::from(self.port())
    }
}

impl Backend for SocketAddrV6 {
    fn name(&self) -> u64 {
        let o = self.ip().octets();
        let (h, l) = o.split_at(8);
        // Both halves mixed, so endpoints differing only in their interface id differ.
        let hi = u64::from_be_bytes(h.try_into().unwrap_or_default());
        let lo = u64::from_be_bytes(l.try_into().unwrap_or_default());
        mix64(hi ^ 0x9e37_79b9_7f4a_7c15) ^ mix64(lo) ^ u64::from(self.port()) << 1
    }
}

fn name_hash<B: Backend>(addr: &B, seed: u64) -> u64 {
    mix64(mix64(addr.name() ^ seed) ^ 0x5851_f42d_4c95_7f2d)
}

impl Maglev {
    /// Builds the table for `backends` (in the order given: lookups return indices into it),
    /// of [`table_size`] slots. Returns `None` for an empty list or more than
    /// [`MAX_BACKENDS`].
    pub fn new<B: Backend>(backends: &[B]) -> Option<Maglev> {
        Maglev::with_size(backends, table_size(backends.len()))
    }

    /// As [`Maglev::new`] with `m` slots, which must be a prime up to 65537 (as
    /// [`TABLE_SIZES`]) and at least the number of backends (`None` otherwise).
    pub fn with_size<B: Backend>(backends: &[B], m: u32) -> Option<Maglev> {
        let n = backends.len();
        if n == 0 || n > MAX_BACKENDS || !is_prime(m) || m > 65537 || (m as usize) < n {
            return None;
        }
        let m64 = u64::from(m);
        let mut offset = Vec::with_capacity(n);
        let mut skip = Vec::with_capacity(n);
        for b in backends {
            offset.push(low32(name_hash(b, 0xcafe) % m64));
            skip.push(low32(name_hash(b, 0xbeef) % (m64 - 1) + 1));
        }
        let mut next = vec![0u32; n];
        let mut table = vec![u16::MAX; m as usize].into_boxed_slice();
        let mut filled = 0u32;
        'outer: loop {
            // `n <= MAX_BACKENDS` (checked above), so the ids fit below the empty mark.
            for (i, id) in (0..n).zip(0u16..) {
                // Find backend i's next preferred free slot (one always exists while
                // `filled < m`, and its permutation visits every slot).
                loop {
                    let c = reduce(
                        u64::from(offset[i]) + u64::from(next[i]) * u64::from(skip[i]),
                        table.len(),
                    );
                    next[i] += 1;
                    if table[c] == u16::MAX {
                        table[c] = id;
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
            .get(reduce(mix64(key), self.table.len()))
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
            let b = eps(1..(u8::try_from(n).unwrap() + 1));
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
        assert_eq!(table_size(1), 1021);
        assert_eq!(table_size(10), 4093);
        assert_eq!(table_size(1000), 65537);
        assert!(Maglev::new::<SocketAddrV4>(&[]).is_none());
    }

    #[test]
    fn size_hysteresis() {
        assert_eq!(table_size_for_update(None, 2), 1021);
        assert_eq!(table_size_for_update(Some(1021), 3), 1021);
        assert_eq!(table_size_for_update(Some(1021), 10), 1021);
        assert_eq!(table_size_for_update(Some(1021), 11), 16381);
        assert_eq!(table_size_for_update(Some(4093), 1), 4093);
        assert!(Maglev::with_size(&eps(1..5), 1000).is_none());
        assert!(Maglev::with_size(&eps(1..5), 3).is_none());
        assert!(Maglev::with_size(&eps(1..5), 251).is_some());
        assert!(TABLE_SIZES.iter().all(|&m| is_prime(m)));
    }

    #[test]
    fn deterministic() {
        let b = eps(1..20);
        assert_eq!(Maglev::new(&b), Maglev::new(&b));
    }

    /// The share of keys that move between *remaining* backends when one of 10 is removed,
    /// averaged over which one, for each table size: the figures quoted in the module docs.
    #[test]
    fn removing_a_backend_moves_few_keys_of_the_others() {
        let b: Vec<SocketAddrV4> = (1..=10u8)
            .map(|i| SocketAddrV4::new(Ipv4Addr::new(10, 1, 0, i), 8080))
            .collect();
        let mut last = f64::MAX;
        for (m, documented) in [
            (251, 4.2),
            (1021, 2.1),
            (4093, 1.1),
            (16381, 0.45),
            (65537, 0.24),
        ] {
            let mut tot = 0.0;
            for r in 0..10 {
                let t1 = Maglev::with_size(&b, m).unwrap();
                let mut b2 = b.clone();
                b2.remove(r);
                let t2 = Maglev::with_size(&b2, m).unwrap();
                let moved_others = t1
                    .table
                    .iter()
                    .zip(t2.table.iter())
                    .filter(|(x, y)| {
                        let x = **x as usize;
                        let y = **y as usize;
                        x != r && b[x] != b2[y]
                    })
                    .count();
                tot += moved_others as f64 / m as f64;
            }
            let pct = tot / 10.0 * 100.0;
            eprintln!("m={m}: {pct:.2} % of the other backends' keys moved");
            assert!(
                (pct - documented).abs() <= documented * 0.15,
                "m={m}: {pct:.2} %, documented {documented} %"
            );
            assert!(pct < last, "a larger table moves fewer keys");
            last = pct;
        }
    }
}
