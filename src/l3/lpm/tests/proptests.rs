//! Property tests: random route sets and updates against the linear-scan [`Model`].

use std::sync::Arc;

use proptest::prelude::*;

use super::*;

/// Prefixes cluster around a few `seeds` (sharing `k` top bits with one), so that they nest
/// and overlap; lengths (`lens`) favour the extremes (/0, full length) and the common range.
fn prefix<A: TestAddr + Arbitrary<Strategy: Clone>>(
    seeds: [A; 4],
    lens: impl Strategy<Value = u8> + Clone,
) -> impl Strategy<Value = (A, u8)> + Clone {
    let width = u32::from(A::WIDTH);
    (
        prop::sample::select(seeds.to_vec()),
        any::<A>(),
        0u32..=width,
        lens,
    )
        .prop_map(|(seed, flip, k, len)| {
            let p = seed ^ flip.shr_or_zero(k);
            (p & !host_mask::<A>(len), len)
        })
}

fn ipv4_prefix() -> impl Strategy<Value = (u32, u8)> + Clone {
    prefix(
        [0x0A00_0000u32, 0xC0A8_0100, 0xFFFF_FFFF, 0],
        prop_oneof![Just(0u8), Just(32u8), 0u8..=32, 16u8..=32],
    )
}

fn ipv6_prefix() -> impl Strategy<Value = (u128, u8)> + Clone {
    prefix(
        [0x2001_0db8u128 << 96, 0x2a00u128 << 112, u128::MAX, 0],
        prop_oneof![Just(0u8), Just(128u8), 0u8..=128, 20u8..=64, 100u8..=128],
    )
}

/// Next hops: often one of two (so that more-specifics are often redundant and collapse),
/// else one of many.
fn next_hop() -> impl Strategy<Value = u32> + Clone {
    prop_oneof![0u32..2, 0u32..1000]
}

/// One change to a FIB.
#[derive(Clone, Debug)]
enum Op<A> {
    Insert(A, u8, u32),
    /// Remove the `n % len`-th route present (or nothing if empty).
    RemoveExisting(usize),
    /// Remove a prefix that may well be absent.
    Remove(A, u8),
    /// Several changes published together.
    Batch(Vec<Op<A>>),
}

fn ops<A: Clone + std::fmt::Debug>(
    prefix: impl Strategy<Value = (A, u8)> + Clone,
) -> impl Strategy<Value = Vec<Op<A>>> {
    let single = prop_oneof![
        4 => (prefix.clone(), next_hop()).prop_map(|((p, l), nh)| Op::Insert(p, l, nh)),
        2 => any::<usize>().prop_map(Op::RemoveExisting),
        1 => prefix.prop_map(|(p, l)| Op::Remove(p, l)),
    ];
    let op = prop_oneof![
        4 => single.clone(),
        1 => prop::collection::vec(single, 0..12).prop_map(Op::Batch),
    ];
    prop::collection::vec(op, 1..40)
}

fn apply<A: Address>(op: &Op<A>, batch: &mut FibBatch<'_, A>, model: &mut Model<A>) {
    match *op {
        Op::Insert(p, l, nh) => {
            batch.insert(p, l, nh).unwrap();
            model.insert(p, l, nh);
        }
        Op::RemoveExisting(n) => {
            if !model.routes.is_empty() {
                let &(p, l) = model.routes.keys().nth(n % model.routes.len()).unwrap();
                assert!(batch.remove(p, l).unwrap().is_some());
                model.remove(p, l);
            }
        }
        Op::Remove(p, l) => {
            let had = model.routes.contains_key(&(p, l));
            assert_eq!(batch.remove(p, l).unwrap().is_some(), had);
            model.remove(p, l);
        }
        Op::Batch(ref ops) => {
            for op in ops {
                apply(op, batch, model);
            }
        }
    }
}

/// Addresses worth probing: each prefix's first and last address, their neighbours, one
/// address inside, plus `random`.
fn probes<A: TestAddr>(model: &Model<A>, rng: &mut SplitMix, random: usize) -> Vec<A> {
    let mut out: Vec<A> = (0..random).map(|_| A::random(rng)).collect();
    for &(p, l) in model.routes.keys() {
        let last = p | host_mask::<A>(l);
        out.extend([
            p,
            last,
            p.step(false),
            last.step(true),
            p | (A::random(rng) & host_mask::<A>(l)),
        ]);
    }
    out
}

fn check<A: Address>(lpm: &Lpm<A>, model: &Model<A>, probes: &[A]) -> Result<(), TestCaseError> {
    let mut out = vec![0u32; probes.len()];
    lpm.lookup_batch(probes, &mut out);
    for (&a, &o) in probes.iter().zip(&out) {
        let want = model.lookup(a);
        prop_assert_eq!(lpm.lookup(a), want, "lookup {:?} in {:?}", a, model.routes);
        prop_assert_eq!(o, want.unwrap_or(NO_ROUTE), "batch lookup {:?}", a);
    }
    prop_assert_eq!(lpm.len(), model.routes.len());
    Ok(())
}

fn run_ops<A: Address>(
    fib: &Fib<A>,
    ops: &[Op<A>],
    probes: impl Fn(&Model<A>, &mut SplitMix) -> Vec<A>,
    seed: u64,
) -> Result<(), TestCaseError> {
    let mut model = Model::default();
    let mut rng = SplitMix(seed);
    // A snapshot held across some updates (so the writer cannot reuse it and must copy),
    // with the model it must keep matching: published snapshots never change.
    let mut held: Option<(Arc<Lpm<A>>, Model<A>)> = None;
    for (i, op) in ops.iter().enumerate() {
        let before = fib.generation();
        let mut next = model.clone();
        fib.update(|b| {
            apply(op, b, &mut next);
            Ok::<_, LpmError>(())
        })
        .unwrap();
        let changed = next.routes != model.routes;
        model = next;
        prop_assert_eq!(fib.generation(), before + u64::from(changed));
        let snap = fib.snapshot();
        check(&snap, &model, &probes(&model, &mut rng))?;
        if let Some((old, old_model)) = &held {
            check(old, old_model, &probes(old_model, &mut rng))?;
        }
        if i % 3 == 0 {
            held = Some((snap, model.clone()));
        } else if i % 3 == 2 {
            held = None;
        }
    }
    prop_assert_eq!(fib.iter().collect::<Vec<_>>(), model.routes());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn built_v4_matches_model(
        routes in prop::collection::vec((ipv4_prefix(), next_hop()), 0..64),
        bits in prop::sample::select(vec![1u8, 5, 8, 12, 18]),
        seed in any::<u64>(),
    ) {
        let mut model = Model::default();
        let mut b = Lpm::<u32>::builder();
        for &((p, l), nh) in &routes {
            model.insert(p, l, nh);
            // Host bits must not matter.
            b.insert(p | (seed as u32 & host_mask::<u32>(l)), l, nh).unwrap();
        }
        let probes = probes(&model, &mut SplitMix(seed), 64);
        check(&b.clone().build(), &model, &probes)?;
        check(&b.build_with_bits(bits), &model, &probes)?;
    }

    #[test]
    fn built_v6_matches_model(
        routes in prop::collection::vec((ipv6_prefix(), next_hop()), 0..64),
        bits in prop::sample::select(vec![1u8, 7, 8, 16, 18]),
        seed in any::<u64>(),
    ) {
        let mut model = Model::default();
        let mut b = Lpm::<u128>::builder();
        for &((p, l), nh) in &routes {
            model.insert(p, l, nh);
            b.insert(p, l, nh).unwrap();
        }
        let probes = probes(&model, &mut SplitMix(seed), 64);
        check(&b.clone().build(), &model, &probes)?;
        check(&b.build_with_bits(bits), &model, &probes)?;
    }

    #[test]
    fn fib_v4_updates_match_model(
        ops in ops(ipv4_prefix()),
        bits in prop::sample::select(vec![0u8, 1, 6, 8, 18]),
        seed in any::<u64>(),
    ) {
        // bits 0: the adaptive default.
        let fib = if bits == 0 { Fib::<u32>::new() } else { Fib::<u32>::with_fixed_bits(bits) };
        run_ops(&fib, &ops, |m, r| probes(m, r, 16), seed)?;
    }

    #[test]
    fn fib_v6_updates_match_model(
        ops in ops(ipv6_prefix()),
        bits in prop::sample::select(vec![0u8, 1, 8, 18]),
        seed in any::<u64>(),
    ) {
        let fib = if bits == 0 { Fib::<u128>::new() } else { Fib::<u128>::with_fixed_bits(bits) };
        run_ops(&fib, &ops, |m, r| probes(m, r, 16), seed)?;
    }
}
