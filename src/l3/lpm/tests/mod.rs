//! Tests of the LPM tables: unit tests here, property tests against a linear-scan model
//! (`proptests`), the real Internet tables (`real`) and concurrent readers (`concurrency`).
#![allow(
    clippy::cast_possible_truncation,
    reason = "test fixtures: small loop counters and random draws narrowed into addresses, ports and ids"
)]

mod concurrency;
mod proptests;
mod real;

use std::collections::BTreeMap;

use super::*;

/// The obviously correct model: a linear scan for the longest matching prefix.
#[derive(Clone, Debug, Default)]
pub(super) struct Model<A: Address> {
    pub routes: BTreeMap<(A, u8), u32>,
}

impl<A: Address> Model<A> {
    pub fn insert(&mut self, prefix: A, len: u8, nh: u32) {
        self.routes.insert((prefix.masked(len), len), nh);
    }

    pub fn remove(&mut self, prefix: A, len: u8) {
        self.routes.remove(&(prefix.masked(len), len));
    }

    pub fn lookup(&self, addr: A) -> Option<u32> {
        self.routes
            .iter()
            .filter(|(&(p, l), _)| addr.masked(l) == p)
            .max_by_key(|(&(_, l), _)| l)
            .map(|(_, &nh)| nh)
    }

    pub fn routes(&self) -> Vec<Route<A>> {
        self.routes
            .iter()
            .map(|(&(prefix, len), &next_hop)| Route {
                prefix,
                len,
                next_hop,
            })
            .collect()
    }
}

/// splitmix64: a small deterministic PRNG for tests.
pub(super) struct SplitMix(pub u64);

impl SplitMix {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    pub fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }

    pub fn next_u128(&mut self) -> u128 {
        (u128::from(self.next_u64()) << 64) | u128::from(self.next_u64())
    }

    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// What the tests need of an address word beyond [`Address`]: bit operations and random
/// draws, for both widths.
pub(super) trait TestAddr:
    Address
    + std::ops::BitOr<Output = Self>
    + std::ops::BitAnd<Output = Self>
    + std::ops::BitXor<Output = Self>
    + std::ops::Not<Output = Self>
{
    /// All ones.
    const MAX: Self;
    /// A random address.
    fn random(rng: &mut SplitMix) -> Self;
    /// `self >> k`, zero when `k` is the width or more.
    fn shr_or_zero(self, k: u32) -> Self;
    /// `self ± 1`, wrapping.
    fn step(self, up: bool) -> Self;
}

macro_rules! impl_test_addr {
    ($t:ty, $random:ident) => {
        impl TestAddr for $t {
            const MAX: $t = <$t>::MAX;
            fn random(rng: &mut SplitMix) -> $t {
                rng.$random()
            }
            fn shr_or_zero(self, k: u32) -> $t {
                self.checked_shr(k).unwrap_or(0)
            }
            fn step(self, up: bool) -> $t {
                if up {
                    self.wrapping_add(1)
                } else {
                    self.wrapping_sub(1)
                }
            }
        }
    };
}

impl_test_addr!(u32, next_u32);
impl_test_addr!(u128, next_u128);

/// Host-bit mask of a prefix length.
pub(super) fn host_mask<A: TestAddr>(len: u8) -> A {
    A::MAX.shr_or_zero(u32::from(len))
}

fn v4(a: u8, b: u8, c: u8, d: u8) -> u32 {
    u32::from_be_bytes([a, b, c, d])
}

fn check_batch<A: Address>(lpm: &Lpm<A>, addrs: &[A]) {
    let mut out = vec![0u32; addrs.len()];
    lpm.lookup_batch(addrs, &mut out);
    for (a, o) in addrs.iter().zip(&out) {
        assert_eq!(
            lpm.lookup(*a).unwrap_or(NO_ROUTE),
            *o,
            "batch vs single for {a:?}"
        );
    }
}

#[test]
fn tables_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Lpm<u32>>();
    check::<Lpm<u128>>();
    check::<Fib<u32>>();
    check::<Fib<u128>>();
    check::<FibReader<'static, u32>>();
}

#[test]
fn fib_reader_follows_new_versions() {
    let fib = Fib::<u32>::new();
    let mut reader = fib.reader();
    assert_eq!(reader.lookup(v4(10, 0, 0, 1)), None);
    fib.insert(v4(10, 0, 0, 0), 8, 3).unwrap();
    assert_eq!(reader.lookup(v4(10, 0, 0, 1)), Some(3));
    let mut out = [0u32; 2];
    fib.insert(v4(10, 0, 0, 0), 24, 4).unwrap();
    reader.lookup_batch(&[v4(10, 0, 0, 1), v4(10, 0, 1, 1)], &mut out);
    assert_eq!(out, [4, 3]);
    assert_eq!(reader.snapshot().generation(), 2);
    assert!(format!("{reader:?}").contains("FibReader"));
}

#[test]
fn empty_table() {
    let lpm = Lpm::<u32>::builder().build();
    assert!(lpm.is_empty());
    assert_eq!(lpm.len(), 0);
    assert_eq!(lpm.lookup(0), None);
    assert_eq!(lpm.lookup(u32::MAX), None);
    let mut out = [7u32; 20];
    lpm.lookup_batch(&[1u32; 20], &mut out);
    assert_eq!(out, [NO_ROUTE; 20]);
    assert!(lpm.memory_bytes() < 2048, "{}", lpm.memory_bytes());
    let fib = Fib::<u128>::new();
    assert_eq!(fib.lookup(1), None);
    assert!(fib.is_empty());
    assert_eq!(Lpm::<u128>::default().lookup(5), None);
}

#[test]
fn basic_ipv4() {
    let mut b = Lpm::<u32>::builder();
    b.insert(0, 0, 1).unwrap();
    b.insert(v4(10, 0, 0, 0), 8, 2).unwrap();
    b.insert(v4(10, 1, 0, 0), 16, 3).unwrap();
    b.insert(v4(10, 1, 2, 0), 24, 4).unwrap();
    b.insert(v4(10, 1, 2, 3), 32, 5).unwrap();
    b.insert(v4(10, 1, 2, 128), 25, 6).unwrap();
    b.insert(v4(192, 168, 0, 0), 23, 7).unwrap();
    b.insert(v4(255, 255, 255, 255), 32, 8).unwrap();
    let lpm = b.build();
    assert_eq!(lpm.len(), 8);
    let cases = [
        (v4(1, 2, 3, 4), 1),
        (v4(10, 0, 0, 1), 2),
        (v4(10, 255, 255, 255), 2),
        (v4(10, 1, 0, 0), 3),
        (v4(10, 1, 2, 0), 4),
        (v4(10, 1, 2, 2), 4),
        (v4(10, 1, 2, 3), 5),
        (v4(10, 1, 2, 4), 4),
        (v4(10, 1, 2, 127), 4),
        (v4(10, 1, 2, 128), 6),
        (v4(10, 1, 2, 255), 6),
        (v4(10, 1, 3, 0), 3),
        (v4(192, 168, 1, 255), 7),
        (v4(192, 168, 2, 0), 1),
        (v4(255, 255, 255, 254), 1),
        (v4(255, 255, 255, 255), 8),
        (0, 1),
    ];
    for (addr, nh) in cases {
        assert_eq!(lpm.lookup(addr), Some(nh), "{addr:#x}");
    }
    let addrs: Vec<u32> = cases.iter().map(|c| c.0).collect();
    check_batch(&lpm, &addrs);
    // Every direct width gives the same answers.
    for bits in [1, 4, 8, 13, 18, 24] {
        let mut b = Lpm::<u32>::builder();
        b.insert(0, 0, 1).unwrap();
        b.insert(v4(10, 1, 2, 3), 32, 5).unwrap();
        b.insert(v4(10, 1, 2, 0), 24, 4).unwrap();
        let lpm = b.build_with_bits(bits);
        assert_eq!(lpm.lookup(v4(10, 1, 2, 3)), Some(5), "bits {bits}");
        assert_eq!(lpm.lookup(v4(10, 1, 2, 4)), Some(4), "bits {bits}");
        assert_eq!(lpm.lookup(v4(10, 1, 3, 4)), Some(1), "bits {bits}");
    }
}

#[test]
fn basic_ipv6() {
    let p = |s: &str| u128::from(s.parse::<std::net::Ipv6Addr>().unwrap());
    let mut b = Lpm::<u128>::builder();
    b.insert(p("2001:db8::"), 32, 1).unwrap();
    b.insert(p("2001:db8:1::"), 48, 2).unwrap();
    b.insert(p("2001:db8:1:2::"), 64, 3).unwrap();
    b.insert(p("2001:db8:1:2::1"), 128, 4).unwrap();
    b.insert(p("2001:db8:1:2::100"), 120, 5).unwrap();
    b.insert(p("::"), 0, 6).unwrap();
    let lpm = b.build();
    assert_eq!(lpm.lookup(p("2001:db8::5")), Some(1));
    assert_eq!(lpm.lookup(p("2001:db8:1::5")), Some(2));
    assert_eq!(lpm.lookup(p("2001:db8:1:2::5")), Some(3));
    assert_eq!(lpm.lookup(p("2001:db8:1:2::1")), Some(4));
    assert_eq!(lpm.lookup(p("2001:db8:1:2::1ff")), Some(5));
    assert_eq!(lpm.lookup(p("2001:db8:1:2::200")), Some(3));
    assert_eq!(lpm.lookup(p("2001:db9::")), Some(6));
    assert_eq!(lpm.lookup(u128::MAX), Some(6));
    let addrs: Vec<u128> = (0..37u128).map(|i| p("2001:db8:1:2::") + i * 7).collect();
    check_batch(&lpm, &addrs);
}

#[test]
fn invalid_routes_are_rejected() {
    assert_eq!(
        Lpm::<u32>::builder().insert(0, 33, 1).unwrap_err(),
        LpmError::InvalidLength { len: 33, max: 32 }
    );
    assert_eq!(
        Lpm::<u128>::builder().insert(0, 129, 1).unwrap_err(),
        LpmError::InvalidLength { len: 129, max: 128 }
    );
    assert_eq!(
        Lpm::<u32>::builder()
            .insert(0, 8, MAX_NEXT_HOP + 1)
            .unwrap_err(),
        LpmError::InvalidNextHop(MAX_NEXT_HOP + 1)
    );
    assert!(Lpm::<u32>::builder().insert(0, 8, MAX_NEXT_HOP).is_ok());
    let fib = Fib::<u32>::new();
    fib.insert(0, 0, MAX_NEXT_HOP).unwrap();
    assert_eq!(fib.lookup(5), Some(MAX_NEXT_HOP));
    assert!(fib.insert(0, 33, 1).is_err());
    assert!(fib.insert(0, 1, u32::MAX).is_err());
    assert!(fib.remove(0, 40).is_err());
    assert_eq!(fib.generation(), 1);
    assert_eq!(fib.len(), 1);
    assert!(LpmError::InvalidNextHop(u32::MAX)
        .to_string()
        .contains("next-hop"));
}

#[test]
fn host_bits_are_ignored_and_last_duplicate_wins() {
    let mut b = Lpm::<u32>::builder();
    b.insert(v4(10, 1, 2, 3), 8, 1).unwrap();
    b.insert(v4(10, 0, 0, 0), 8, 2).unwrap();
    b.insert(v4(10, 9, 9, 9), 8, 3).unwrap();
    let lpm = b.build();
    assert_eq!(lpm.len(), 1);
    assert_eq!(lpm.lookup(v4(10, 200, 0, 1)), Some(3));
    let fib = Fib::<u32>::from_routes([1, 2].map(|next_hop| Route {
        prefix: v4(10, 1, 2, 3),
        len: 8,
        next_hop,
    }))
    .unwrap();
    assert_eq!(fib.len(), 1);
    assert_eq!(fib.get(v4(10, 0, 0, 0), 8), Some(2));
    let fib = Fib::<u32>::new();
    assert_eq!(fib.insert(v4(10, 1, 2, 3), 8, 1).unwrap(), None);
    assert_eq!(fib.insert(v4(10, 0, 0, 0), 8, 2).unwrap(), Some(1));
    assert_eq!(fib.get(v4(10, 7, 7, 7), 8), Some(2));
    assert_eq!(fib.remove(v4(10, 5, 5, 5), 8).unwrap(), Some(2));
    assert_eq!(fib.remove(v4(10, 5, 5, 5), 8).unwrap(), None);
    assert!(fib.is_empty());
}

#[test]
fn batch_lookup_matches_single_lookups() {
    let mut rng = SplitMix(1);
    let mut b = Lpm::<u32>::builder();
    for i in 0..3000 {
        let len = [8, 16, 20, 24, 24, 28, 32][rng.below(7)];
        b.insert(rng.next_u32() & 0x0FFF_FFFF, len, i).unwrap();
    }
    let lpm = b.build();
    for n in [0, 1, 15, 16, 17, 33, 1000] {
        let addrs: Vec<u32> = (0..n).map(|_| rng.next_u32() & 0x0FFF_FFFF).collect();
        check_batch(&lpm, &addrs);
    }
}

#[test]
#[should_panic(expected = "differ in length")]
fn batch_lookup_checks_lengths() {
    Lpm::<u32>::builder()
        .build()
        .lookup_batch(&[1, 2], &mut [0]);
}

#[test]
fn small_table_is_small_and_fast_to_build() {
    // A Kubernetes node: a default route, pod CIDRs per node, a few service routes.
    let mut b = Lpm::<u32>::builder();
    b.insert(0, 0, 0).unwrap();
    for i in 0..16u8 {
        b.insert(v4(10, 244, i, 0), 24, u32::from(i) + 1).unwrap();
    }
    b.insert(v4(10, 96, 0, 0), 12, 20).unwrap();
    b.insert(v4(169, 254, 169, 254), 32, 21).unwrap();
    b.insert(v4(172, 17, 0, 0), 16, 22).unwrap();
    let t = std::time::Instant::now();
    let lpm = b.build();
    let took = t.elapsed();
    assert_eq!(lpm.direct_bits(), 8);
    assert!(lpm.memory_bytes() < 4096, "{:?}", lpm);
    assert!(took.as_millis() < 50, "{took:?}");
    assert_eq!(lpm.lookup(v4(10, 244, 3, 9)), Some(4));
    assert_eq!(lpm.lookup(v4(10, 100, 3, 9)), Some(20));
    assert_eq!(lpm.lookup(v4(8, 8, 8, 8)), Some(0));
}

#[test]
fn redundant_more_specifics_cost_nothing() {
    // 10/8 and 4096 more-specifics with the same next hop, as in a router with few next
    // hops: no trie node is needed.
    let mut b = Lpm::<u32>::builder();
    b.insert(v4(10, 0, 0, 0), 8, 1).unwrap();
    for i in 0..4096u32 {
        b.insert(v4(10, 0, 0, 0) | (i << 8), 24, 1).unwrap();
    }
    let lpm = b.clone().build();
    assert_eq!(lpm.len(), 4097);
    assert_eq!(
        lpm.memory_bytes(),
        Lpm::<u32>::empty(lpm.direct_bits()).memory_bytes(),
        "{lpm:?}"
    );
    assert_eq!(lpm.lookup(v4(10, 0, 5, 1)), Some(1));
    assert_eq!(lpm.lookup(v4(11, 0, 5, 1)), None);
    // One differing more-specific brings back exactly the nodes it needs.
    let fib = Fib::<u32>::from_routes(b.routes().iter().copied()).unwrap();
    fib.insert(v4(10, 0, 7, 0), 24, 2).unwrap();
    assert_eq!(fib.lookup(v4(10, 0, 7, 9)), Some(2));
    assert_eq!(fib.lookup(v4(10, 0, 6, 9)), Some(1));
    fib.insert(v4(10, 0, 7, 0), 24, 1).unwrap();
    assert_eq!(fib.lookup(v4(10, 0, 7, 9)), Some(1));
}

#[test]
fn ideal_bits_follow_the_route_count() {
    use super::trie::ideal_bits;
    assert_eq!(ideal_bits(0), 8);
    assert_eq!(ideal_bits(20), 8);
    assert_eq!(ideal_bits(257), 9);
    assert_eq!(ideal_bits(1000), 10);
    assert_eq!(ideal_bits(65_536), 16);
    assert_eq!(ideal_bits(160_000), 18);
    assert_eq!(ideal_bits(900_000), 18);
}

#[test]
fn fib_batches_publish_once_and_roll_back_on_error() {
    let fib = Fib::<u32>::new();
    assert_eq!(fib.generation(), 0);
    fib.update(|b| {
        for i in 0..10u32 {
            b.insert(i << 24, 8, i)?;
        }
        Ok::<_, LpmError>(())
    })
    .unwrap();
    assert_eq!(fib.generation(), 1);
    assert_eq!(fib.len(), 10);
    // A no-op change publishes nothing.
    fib.insert(3 << 24, 8, 3).unwrap();
    fib.remove(200 << 24, 8).unwrap();
    assert_eq!(fib.generation(), 1);
    // An error undoes the whole batch.
    let r = fib.update(|b| {
        b.insert(0, 0, 99)?;
        b.remove(1 << 24, 8)?;
        b.clear();
        assert!(b.is_empty());
        b.insert(0, 8, 100)?;
        b.insert(0, 99, 1)
    });
    assert!(r.is_err());
    assert_eq!(fib.generation(), 1);
    assert_eq!(fib.get(1 << 24, 8), Some(1));
    assert_eq!(fib.get(0, 0), None);
    assert_eq!(fib.get(0, 8), Some(0));
    assert_eq!(fib.iter().count(), 10);
    // A panic too; the table stays usable.
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _: Result<(), LpmError> = fib.update(|b| {
            b.insert(0, 0, 99)?;
            panic!("writer bug");
        });
    }));
    assert!(caught.is_err());
    assert_eq!(fib.get(0, 0), None);
    fib.insert(0, 0, 42).unwrap();
    assert_eq!(fib.lookup(200 << 24), Some(42));
    assert_eq!(fib.generation(), 2);
    let dump: Vec<Route<u32>> = fib.iter().collect();
    assert_eq!(dump.len(), 11);
    assert!(dump
        .windows(2)
        .all(|w| (w[0].prefix, w[0].len) < (w[1].prefix, w[1].len)));
    assert_eq!(
        dump[0],
        Route {
            prefix: 0,
            len: 0,
            next_hop: 42
        }
    );
    assert!(format!("{fib:?}").contains("routes: 11"));
}

#[test]
fn fib_adapts_direct_width_and_compacts() {
    let mut rng = SplitMix(7);
    let fib = Fib::<u32>::new();
    let mut model = Model::default();
    // Grow to 20k routes, 500 per batch.
    let mut all = Vec::new();
    for batch in 0..40 {
        fib.update(|b| {
            for i in 0..500 {
                let len = 16 + rng.below(17) as u8;
                let p = rng.next_u32() & !host_mask::<u32>(len);
                let nh = batch * 500 + i;
                b.insert(p, len, nh)?;
                model.insert(p, len, nh);
                all.push((p, len));
            }
            Ok::<_, LpmError>(())
        })
        .unwrap();
    }
    assert!(fib.snapshot().direct_bits() >= 14, "{:?}", fib.snapshot());
    // Churn: many single updates, exercising the in-place patch of the spare version and
    // the garbage compaction.
    let fresh = Lpm::from_routes(model.routes()).unwrap().memory_bytes();
    for i in 0..3000u32 {
        let (p, len) = all[rng.below(all.len())];
        if i % 2 == 0 {
            fib.remove(p, len).unwrap();
            model.remove(p, len);
        } else {
            fib.insert(p, len, i).unwrap();
            model.insert(p, len, i);
        }
        assert!(
            fib.snapshot().memory_bytes() < 4 * fresh,
            "{:?}",
            fib.snapshot()
        );
    }
    let snap = fib.snapshot();
    for _ in 0..20_000 {
        let (p, len) = all[rng.below(all.len())];
        let a = p | (rng.next_u32() & host_mask::<u32>(len));
        assert_eq!(snap.lookup(a), model.lookup(a));
    }
    // Shrink: the direct width follows.
    fib.update(|b| {
        for &(p, len) in &all[..19_950] {
            b.remove(p, len)?;
        }
        Ok::<_, LpmError>(())
    })
    .unwrap();
    assert!(fib.snapshot().direct_bits() <= 9, "{:?}", fib.snapshot());
    assert_eq!(fib.len(), fib.iter().count());
}

/// The IPv6 fast paths: the `top` array (kept up to date by patches), the walk of the top 64
/// bits and the hand-over to the 128-bit walk, against the model: a few /8s with routes,
/// routes longer than /64 under short ones, host routes, a default route added and removed
/// (which changes every `top` entry), single and batch look-ups, both a wide direct array
/// and one narrower than `top`.
#[test]
fn ipv6_top_array_and_long_routes_follow_updates() {
    // 8 <= s < 12 gives a `top` as wide as `direct`; s < 8 a wider one; s >= 12 a 12-bit
    // one over several slots.
    for bits in [4, 8, 10, 12, 14, 18] {
        let fib = Fib::<u128>::with_fixed_bits(bits);
        let mut model = Model::<u128>::default();
        let mut rng = SplitMix(bits.into());
        let mut nh = 0u32;
        let mut step =
            |fib: &Fib<u128>, model: &mut Model<u128>, prefix: u128, len: u8, add: bool| {
                if add {
                    nh += 1;
                    fib.insert(prefix, len, nh).unwrap();
                    model.insert(prefix, len, nh);
                } else {
                    fib.remove(prefix, len).unwrap();
                    model.remove(prefix, len);
                }
            };
        let bases = [
            0x2001_0db8u128 << 96,
            0x2a00_1450u128 << 96,
            0xfd00u128 << 112,
        ];
        for round in 0..40 {
            let base = bases[rng.below(bases.len())];
            // Around /48 (the deepest level of most of the Internet table) and around /64,
            // where the 64-bit walk hands over to the 128-bit one.
            let lens = [
                12, 16, 29, 32, 40, 44, 47, 48, 49, 54, 56, 58, 63, 64, 65, 96, 127, 128,
            ];
            let len = lens[rng.below(lens.len())];
            let prefix = base | (rng.next_u128() & host_mask::<u128>(20));
            step(&fib, &mut model, prefix, len, rng.below(4) != 0);
            if round % 10 == 5 {
                step(&fib, &mut model, 0, 0, round % 20 == 5);
            }
            let mut probes: Vec<u128> = (0..64).map(|_| rng.next_u128()).collect();
            for r in model.routes() {
                probes.push(r.prefix);
                probes.push(r.prefix | host_mask::<u128>(r.len));
                probes.push(r.prefix | (rng.next_u128() & host_mask::<u128>(r.len)));
            }
            let lpm = fib.snapshot();
            for &a in &probes {
                assert_eq!(lpm.lookup(a), model.lookup(a), "{a:x} bits {bits}");
            }
            check_batch(&lpm, &probes);
        }
    }
}

/// An IPv6 FIB that grows across the direct-width thresholds and shrinks back (rebuilds and
/// in-place patches) while a reader thread looks up, single and batched, addresses whose
/// answer never changes (routes outside the churned space: a default route, a /16, a /32, a
/// /48 under it, a /64 and a /128 host route), and the whole table matches the model after
/// every version.
#[test]
fn ipv6_fib_grows_and_shrinks_while_readers_run() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    let fib = Arc::new(Fib::<u128>::new());
    let mut model = Model::<u128>::default();
    let fixed: [(u128, u8, u32); 6] = [
        (0, 0, 1),
        (0xfd00u128 << 112, 16, 2),
        (0x2001_0db8u128 << 96, 32, 3),
        ((0x2001_0db8u128 << 96) | (7 << 80), 48, 4),
        ((0x2001_0db8u128 << 96) | (7 << 80) | (5 << 64), 64, 5),
        ((0x2001_0db8u128 << 96) | (7 << 80) | (5 << 64) | 9, 128, 6),
    ];
    for &(p, len, nh) in &fixed {
        fib.insert(p, len, nh).unwrap();
        model.insert(p, len, nh);
    }
    // (address, answer) pairs that no churned route changes.
    let probes: Vec<(u128, u32)> = vec![
        (0x3fff_u128 << 112, 1),
        ((0xfd00u128 << 112) | 77, 2),
        ((0x2001_0db8u128 << 96) | (8 << 80), 3),
        ((0x2001_0db8u128 << 96) | (7 << 80) | (6 << 64), 4),
        ((0x2001_0db8u128 << 96) | (7 << 80) | (5 << 64) | 10, 5),
        ((0x2001_0db8u128 << 96) | (7 << 80) | (5 << 64) | 9, 6),
    ];
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (fib, stop, probes) = (Arc::clone(&fib), Arc::clone(&stop), probes.clone());
        std::thread::spawn(move || {
            let addrs: Vec<u128> = probes.iter().map(|p| p.0).cycle().take(40).collect();
            let mut out = vec![0u32; addrs.len()];
            let mut reader = fib.reader();
            let mut rounds = 0u64;
            while !stop.load(Ordering::Relaxed) || rounds == 0 {
                for &(a, nh) in &probes {
                    assert_eq!(reader.lookup(a), Some(nh), "{a:x}");
                }
                reader.lookup_batch(&addrs, &mut out);
                for (a, o) in addrs.iter().zip(&out) {
                    let want = probes.iter().find(|p| p.0 == *a).map(|p| p.1);
                    assert_eq!(Some(*o), want, "{a:x}");
                }
                rounds += 1;
            }
            rounds
        })
    };
    // Churned routes: under 2a00::/12, /20 to /128.
    let mut rng = SplitMix(11);
    let mut added = Vec::new();
    let check = |fib: &Fib<u128>, model: &Model<u128>, rng: &mut SplitMix| {
        let lpm = fib.snapshot();
        let mut addrs: Vec<u128> = probes.iter().map(|p| p.0).collect();
        for r in model.routes().iter().step_by(23) {
            addrs.push(r.prefix | (rng.next_u128() & host_mask::<u128>(r.len)));
        }
        for _ in 0..64 {
            addrs.push((0x2a0u128 << 116) | (rng.next_u128() >> 12));
        }
        for &a in &addrs {
            assert_eq!(lpm.lookup(a), model.lookup(a), "{a:x} {lpm:?}");
        }
        check_batch(&lpm, &addrs);
    };
    let mut widths = Vec::new();
    for batch in 0..12u32 {
        fib.update(|b| {
            for i in 0..400 {
                let len = 20 + rng.below(109) as u8;
                let p = ((0x2a0u128 << 116) | (rng.next_u128() >> 12)) & !host_mask::<u128>(len);
                b.insert(p, len, 100 + batch * 400 + i)?;
                model.insert(p, len, 100 + batch * 400 + i);
                added.push((p, len));
            }
            Ok::<_, LpmError>(())
        })
        .unwrap();
        widths.push(fib.snapshot().direct_bits());
        check(&fib, &model, &mut rng);
    }
    // Single changes (patches), then shrink back in batches.
    for i in 0..300u32 {
        let (p, len) = added[rng.below(added.len())];
        if i % 3 == 0 {
            fib.insert(p, len, 90_000 + i).unwrap();
            model.insert(p, len, 90_000 + i);
        } else {
            fib.remove(p, len).unwrap();
            model.remove(p, len);
        }
        if i % 50 == 0 {
            check(&fib, &model, &mut rng);
        }
    }
    for chunk in added.chunks(500) {
        fib.update(|b| {
            for &(p, len) in chunk {
                b.remove(p, len)?;
            }
            Ok::<_, LpmError>(())
        })
        .unwrap();
        for &(p, len) in chunk {
            model.remove(p, len);
        }
        widths.push(fib.snapshot().direct_bits());
        check(&fib, &model, &mut rng);
    }
    stop.store(true, Ordering::Relaxed);
    assert!(reader.join().unwrap() > 0);
    assert_eq!(fib.len(), fixed.len());
    assert!(widths.iter().max() > widths.last(), "{widths:?}");
    assert!(*widths.iter().max().unwrap() >= 12, "{widths:?}");
}
