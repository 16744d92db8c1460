//! Property tests: random route sets and updates against the linear-scan [`Model`].

use std::sync::Arc;

use proptest::prelude::*;

use super::*;

/// Prefixes cluster around a few seeds (sharing `k` top bits with one), so that they nest
/// and overlap; lengths favour the extremes (/0, full length) and the common range.
fn prefix4() -> impl Strategy<Value = (u32, u8)> + Clone {
    let seeds = [0x0A00_0000u32, 0xC0A8_0100, 0xFFFF_FFFF, 0];
    (
        prop::sample::select(seeds.to_vec()),
        any::<u32>(),
        0u32..=32,
        prop_oneof![Just(0u8), Just(32u8), 0u8..=32, 16u8..=32],
    )
        .prop_map(|(seed, flip, k, len)| {
            let p = seed ^ flip.checked_shr(k).unwrap_or(0);
            (p & !host_mask4(len), len)
        })
}

fn prefix6() -> impl Strategy<Value = (u128, u8)> + Clone {
    let seeds = [0x2001_0db8u128 << 96, 0x2a00u128 << 112, u128::MAX, 0];
    (
        prop::sample::select(seeds.to_vec()),
        any::<u128>(),
        0u32..=128,
        prop_oneof![Just(0u8), Just(128u8), 0u8..=128, 20u8..=64, 100u8..=128],
    )
        .prop_map(|(seed, flip, k, len)| {
            let p = seed ^ flip.checked_shr(k).unwrap_or(0);
            (p & !host_mask6(len), len)
        })
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
fn probes4(model: &Model<u32>, rng: &mut SplitMix, random: usize) -> Vec<u32> {
    let mut out: Vec<u32> = (0..random).map(|_| rng.next_u32()).collect();
    for &(p, l) in model.routes.keys() {
        let last = p | host_mask4(l);
        out.extend([
            p,
            last,
            p.wrapping_sub(1),
            last.wrapping_add(1),
            p | (rng.next_u32() & host_mask4(l)),
        ]);
    }
    out
}

fn probes6(model: &Model<u128>, rng: &mut SplitMix, random: usize) -> Vec<u128> {
    let mut out: Vec<u128> = (0..random).map(|_| rng.next_u128()).collect();
    for &(p, l) in model.routes.keys() {
        let last = p | host_mask6(l);
        out.extend([
            p,
            last,
            p.wrapping_sub(1),
            last.wrapping_add(1),
            p | (rng.next_u128() & host_mask6(l)),
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
        routes in prop::collection::vec((prefix4(), next_hop()), 0..64),
        bits in prop::sample::select(vec![1u8, 5, 8, 12, 18]),
        seed in any::<u64>(),
    ) {
        let mut model = Model::default();
        let mut b = Lpm4::builder();
        for &((p, l), nh) in &routes {
            model.insert(p, l, nh);
            // Host bits must not matter.
            b.insert(p | (seed as u32 & host_mask4(l)), l, nh).unwrap();
        }
        let probes = probes4(&model, &mut SplitMix(seed), 64);
        check(&b.clone().build(), &model, &probes)?;
        check(&b.build_with_bits(bits), &model, &probes)?;
    }

    #[test]
    fn built_v6_matches_model(
        routes in prop::collection::vec((prefix6(), next_hop()), 0..64),
        bits in prop::sample::select(vec![1u8, 7, 8, 16, 18]),
        seed in any::<u64>(),
    ) {
        let mut model = Model::default();
        let mut b = Lpm6::builder();
        for &((p, l), nh) in &routes {
            model.insert(p, l, nh);
            b.insert(p, l, nh).unwrap();
        }
        let probes = probes6(&model, &mut SplitMix(seed), 64);
        check(&b.clone().build(), &model, &probes)?;
        check(&b.build_with_bits(bits), &model, &probes)?;
    }

    #[test]
    fn fib_v4_updates_match_model(
        ops in ops(prefix4()),
        bits in prop::sample::select(vec![0u8, 1, 6, 8, 18]),
        seed in any::<u64>(),
    ) {
        // bits 0: the adaptive default.
        let fib = if bits == 0 { Fib4::new() } else { Fib4::with_fixed_bits(bits) };
        run_ops(&fib, &ops, |m, r| probes4(m, r, 16), seed)?;
    }

    #[test]
    fn fib_v6_updates_match_model(
        ops in ops(prefix6()),
        bits in prop::sample::select(vec![0u8, 1, 8, 18]),
        seed in any::<u64>(),
    ) {
        let fib = if bits == 0 { Fib6::new() } else { Fib6::with_fixed_bits(bits) };
        run_ops(&fib, &ops, |m, r| probes6(m, r, 16), seed)?;
    }
}
