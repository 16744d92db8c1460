//! The seeded hash and two-choice bucket derivation of the crate's hand-rolled tables: the
//! bridge's FDB ([`crate::l2::fdb`]), the neighbour cache ([`crate::l3::neigh`]) and the
//! conntrack table ([`crate::conntrack`]).
//!
//! # Contract
//!
//! * Each table draws its own secrets once, at creation ([`SeededHash::random`], from the
//!   standard library's randomly keyed `RandomState`), so an outsider who picks the keys (MACs,
//!   addresses, ports) cannot aim them at one bucket, and two tables do not collide alike.
//! * [`SeededHash::hash`] mixes a 64-bit key with **two folded multiplies** (a 64×64→128-bit
//!   product whose halves are XORed, as wyhash's `mum`) by secret odd multipliers. One folded
//!   multiply is close to linear for keys a few bits apart: with sequential MACs some seeds
//!   gave badly correlated candidate buckets and the FDB failed to learn 16–29% of a one-off
//!   flood (commit 940b0cb). The second multiply makes every output bit depend on every key
//!   bit. Two `mul` instructions and two XORs: cheaper than a murmur or splitmix finaliser,
//!   which the per-frame FDB path cannot afford to grow by.
//! * [`first`] takes a bucket from the low bits of a hash, [`second`] from its high half, never
//!   equal to the first (the next bucket when they coincide), so a table computes the second
//!   only when the first misses.
//!
//! Everything here is a pure function of its arguments: `Send + Sync`, no state, no locks.

use crate::narrow::{low64, low_usize};
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;

/// A table's hash secrets: a key seed and two odd multipliers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SeededHash {
    seed: u64,
    m1: u64,
    m2: u64,
}

/// A folded 64×64→128-bit multiply (wyhash's `mum`): one `mul` instruction, and every bit of
/// `x` reaches both halves of the result.
#[inline(always)]
fn mum(x: u64, a: u64) -> u64 {
    let p = u128::from(x) * u128::from(a);
    low64(p) ^ low64(p >> 64)
}

impl SeededHash {
    /// Fresh random secrets, for one table (fixed ones under `TAPYARD_HASH_SEED`: see
    /// [`random_u64`]).
    pub(crate) fn random() -> SeededHash {
        if let Some(mut s) = fixed_seed() {
            return SeededHash {
                seed: splitmix(&mut s),
                m1: splitmix(&mut s) | 1,
                m2: splitmix(&mut s) | 1,
            };
        }
        let rs = RandomState::new();
        SeededHash {
            seed: rs.hash_one(0x7a9_u64),
            m1: rs.hash_one(0x51ed_u64) | 1,
            m2: rs.hash_one(0x2b0b_u64) | 1,
        }
    }

    /// The secrets as three words, to keep with a table that outlives the process (the
    /// conntrack file): its buckets are right only under the same secrets.
    pub(crate) fn to_words(self) -> [u64; 3] {
        [self.seed, self.m1, self.m2]
    }

    /// Secrets kept by [`SeededHash::to_words`] (the multipliers made odd again, so that any
    /// words give a usable hash).
    pub(crate) fn from_words(w: [u64; 3]) -> SeededHash {
        SeededHash {
            seed: w[0],
            m1: w[1] | 1,
            m2: w[2] | 1,
        }
    }

    /// The hash of a 64-bit key: two folded multiplies (see the module docs for why two).
    #[inline(always)]
    pub(crate) fn hash(&self, x: u64) -> u64 {
        mum(mum(x ^ self.seed, self.m1), self.m2)
    }

    /// The hash of a key of several words (an IPv6 conntrack tuple: 5), wyhash's way: each
    /// pair of words is folded by one multiply of the two, each XORed with a secret of its
    /// position (so swapped pairs hash apart), the products are summed and the sum hashed
    /// with [`SeededHash::hash`]. The pairs' multiplies are independent and overlap: for 5
    /// words 3 + 2 multiplies, 2 + 2 deep, where hashing pair after pair was 6 × 2 deep.
    #[inline(always)]
    pub(crate) fn hash_words(&self, w: &[u64]) -> u64 {
        let (mut acc, mut r) = (0u64, 0u32);
        for c in w.chunks(2) {
            let x = c.first().copied().unwrap_or(0) ^ self.m1.rotate_left(r);
            let y = c.get(1).copied().unwrap_or(0) ^ self.m2.rotate_left(r + 11);
            acc = acc.wrapping_add(mum(x, y));
            r += 23;
        }
        self.hash(acc)
    }

    /// The hash of a 128-bit key given as two words: the second word's hash folded into the
    /// first word and hashed again.
    #[inline(always)]
    pub(crate) fn hash_pair(&self, w: [u64; 2]) -> u64 {
        self.hash(w[0] ^ self.hash(w[1]))
    }
}

/// The next number of the splitmix64 sequence at `*s`.
fn splitmix(s: &mut u64) -> u64 {
    *s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *s;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// With the environment variable `TAPYARD_HASH_SEED` set to a number (read once), the state
/// the next fixed secrets are drawn from: the n-th table (or seed) made in the process gets
/// the same secrets in every run, so a benchmark's instruction count does not depend on where
/// its keys happened to land (benches/callgrind.sh). Not for production: whoever knows the
/// value can aim keys at one bucket.
fn fixed_seed() -> Option<u64> {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;
    static SEED: OnceLock<Option<u64>> = OnceLock::new();
    static DRAWN: AtomicU64 = AtomicU64::new(0);
    let base = (*SEED.get_or_init(|| std::env::var("TAPYARD_HASH_SEED").ok()?.parse().ok()))?;
    let n = DRAWN.fetch_add(1, Ordering::Relaxed);
    let mut s = base ^ n.wrapping_mul(0xd6e8_feb8_6659_fd93);
    Some(splitmix(&mut s))
}

/// A random 64-bit seed (a fixed one of the sequence under `TAPYARD_HASH_SEED`, as
/// [`SeededHash::random`]).
pub(crate) fn random_u64() -> u64 {
    match fixed_seed() {
        Some(s) => s,
        None => RandomState::new().hash_one(0x5eed_u64),
    }
}

/// The first candidate bucket of hash `h` in a table of `mask + 1` buckets (a power of two).
#[inline(always)]
pub(crate) fn first(h: u64, mask: usize) -> usize {
    low_usize(h) & mask
}

/// The second candidate bucket of hash `h`: from its high half, and the bucket after the
/// first when the two coincide (so it differs from [`first`] whenever the table has two
/// buckets or more).
#[inline(always)]
pub(crate) fn second(h: u64, mask: usize) -> usize {
    let b1 = first(h, mask);
    let b2 = ((h >> 32) as usize) & mask;
    if b2 == b1 {
        (b1 + 1) & mask
    } else {
        b2
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_two_candidates_differ_and_stay_in_the_table() {
        let h = SeededHash::random();
        for mask in [1usize, 3, 255, (1 << 20) - 1] {
            for k in 0..10_000u64 {
                let x = h.hash(k);
                let (b1, b2) = (first(x, mask), second(x, mask));
                assert!(b1 <= mask && b2 <= mask);
                assert_ne!(b1, b2);
            }
        }
    }

    #[test]
    fn sequential_keys_spread_over_the_buckets() {
        // 4096 sequential keys into 1024 buckets: about 4 per bucket, none crowded.
        for _ in 0..8 {
            let h = SeededHash::random();
            let mut n = vec![0u32; 1024];
            for k in 0..4096u64 {
                n[first(h.hash(0x0200_0000_0000 + k), 1023)] += 1;
            }
            assert!(n.iter().all(|&c| c < 20), "max {:?}", n.iter().max());
        }
    }
}
