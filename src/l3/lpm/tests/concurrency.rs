//! Readers looking up while a writer publishes versions: every reader must only ever see
//! results of exactly one published version, and versions must not go backwards.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Barrier;
use std::thread;

use super::*;

/// Prefixes inside 10.0.0.0/8 that every version rewrites; next hop = version * 100 + index.
const PROBED: usize = 40;
const VERSIONS: u32 = 300;

fn probed_prefixes() -> Vec<(u32, u8)> {
    let mut rng = SplitMix(42);
    let mut out = vec![(0x0A00_0000, 8)];
    while out.len() <= PROBED {
        let len = 9 + rng.below(24) as u8;
        let p = (0x0A00_0000 | (rng.next_u32() & 0x00FF_FFFF)) & !host_mask::<u32>(len);
        if !out.contains(&(p, len)) {
            out.push((p, len));
        }
    }
    out
}

/// The routes of version `k` inside 10.0.0.0/8: all probed prefixes, except that every
/// third version drops the odd ones (look-ups then fall back to shorter prefixes).
fn version_routes(k: u32, prefixes: &[(u32, u8)]) -> Vec<(u32, u8, Option<u32>)> {
    prefixes
        .iter()
        .enumerate()
        .map(|(i, &(p, l))| {
            let present = i == 0 || k % 3 != 0 || i % 2 == 0;
            (p, l, present.then_some(k * 100 + i as u32))
        })
        .collect()
}

#[test]
fn readers_see_only_whole_published_versions() {
    let prefixes = probed_prefixes();
    let mut rng = SplitMix(9);
    let mut probes: Vec<u32> = vec![0x0A00_0000, 0x0AFF_FFFF];
    for &(p, l) in &prefixes {
        probes.push(p);
        probes.push(p | (rng.next_u32() & host_mask::<u32>(l)));
    }
    // expected[k][j]: the answer for probe j in version k.
    let expected: Vec<Vec<u32>> = (0..=VERSIONS)
        .map(|k| {
            let mut model = Model::default();
            for (p, l, nh) in version_routes(k, &prefixes) {
                if let Some(nh) = nh {
                    model.insert(p, l, nh);
                }
            }
            probes
                .iter()
                .map(|&a| model.lookup(a).unwrap_or(NO_ROUTE))
                .collect()
        })
        .collect();

    // Background routes outside 10.0.0.0/8, so that patches touch other slots too.
    let mut background = Vec::new();
    while background.len() < 20_000 {
        let len = 12 + rng.below(21) as u8;
        let p = rng.next_u32() & !host_mask::<u32>(len);
        if p >> 24 != 10 && len > 8 {
            background.push((p, len));
        }
    }
    let fib =
        Fib::<u32>::from_routes(
            background
                .iter()
                .enumerate()
                .map(|(i, &(prefix, len))| Route {
                    prefix,
                    len,
                    next_hop: 1_000_000 + i as u32,
                }),
        )
        .unwrap();
    let write_version = |k: u32, rng: &mut SplitMix| {
        fib.update(|b| {
            for (p, l, nh) in version_routes(k, &prefixes) {
                match nh {
                    Some(nh) => b.insert(p, l, nh)?,
                    None => b.remove(p, l)?,
                };
            }
            // Churn elsewhere: a few background routes, and now and then a /1, which
            // dirties half of the direct slots and forces a full rebuild.
            for _ in 0..rng.below(8) {
                let (p, l) = background[rng.below(background.len())];
                if rng.next_u32() & 1 == 0 {
                    b.remove(p, l)?;
                } else {
                    b.insert(p, l, 2_000_000 + k)?;
                }
            }
            if k % 50 == 25 {
                b.insert(0x8000_0000, 1, 3_000_000 + k)?;
            } else if k % 50 == 0 {
                b.remove(0x8000_0000, 1)?;
            }
            Ok::<_, LpmError>(())
        })
        .unwrap();
    };
    write_version(1, &mut rng);

    let done = AtomicBool::new(false);
    let start = Barrier::new(5);
    thread::scope(|s| {
        let readers: Vec<_> = (0..4)
            .map(|mode| {
                let (fib, probes, expected, done, start) =
                    (&fib, &probes, &expected, &done, &start);
                s.spawn(move || {
                    let mut last = 0u32;
                    let mut seen = std::collections::BTreeSet::new();
                    let mut out = vec![0u32; probes.len()];
                    let mut rounds = 0u64;
                    let mut reader = fib.reader();
                    start.wait();
                    loop {
                        // Read `done` first: the round after it was set sees the last version.
                        let finished = done.load(Ordering::Acquire);
                        match mode {
                            // One snapshot, batched look-ups: one version for all probes.
                            0 => fib.with_snapshot(|snap| snap.lookup_batch(probes, &mut out)),
                            // An `Arc` snapshot, single look-ups.
                            1 => {
                                let snap = fib.snapshot();
                                for (o, &a) in out.iter_mut().zip(probes) {
                                    *o = snap.lookup(a).unwrap_or(NO_ROUTE);
                                }
                            }
                            // Independent look-ups on the FIB or through a reader handle:
                            // each in some version, and versions never go backwards.
                            _ => {
                                for (j, &a) in probes.iter().enumerate() {
                                    let r = if mode == 2 {
                                        fib.lookup(a).unwrap()
                                    } else {
                                        reader.lookup(a).unwrap()
                                    };
                                    let k = r / 100;
                                    assert!(k >= last, "version went back from {last} to {k}");
                                    assert_eq!(r, expected[k as usize][j], "probe {j} in v{k}");
                                    last = k;
                                    seen.insert(k);
                                }
                            }
                        }
                        if mode < 2 {
                            let k = out[0] / 100;
                            assert!(k >= last, "version went back from {last} to {k}");
                            assert_eq!(out, expected[k as usize], "mixed versions (v{k})");
                            last = k;
                            seen.insert(k);
                        }
                        rounds += 1;
                        if finished {
                            break;
                        }
                    }
                    assert_eq!(last, VERSIONS, "reader {mode} missed the last version");
                    println!(
                        "reader {mode}: {rounds} rounds, saw {} versions",
                        seen.len()
                    );
                })
            })
            .collect();
        start.wait();
        let mut rng = SplitMix(10);
        for k in 2..=VERSIONS {
            write_version(k, &mut rng);
        }
        done.store(true, Ordering::Release);
        for r in readers {
            r.join().unwrap();
        }
    });
    assert_eq!(fib.generation(), u64::from(VERSIONS));
}
