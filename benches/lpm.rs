//! Longest-prefix-match look-ups on the real Internet tables: tapyard's `Lpm` (single and
//! batched look-ups) against `ip_network_table-deps-treebitmap` and `prefix-trie`, each built
//! from the same prefixes (next hop = line index), for uniformly random addresses and for
//! addresses drawn from inside the table's prefixes. The setup prints each structure's
//! build time and memory (bytes per prefix, counted by a tracking allocator).
//!
//! The tables are read from `$TAPYARD_RIB_DIR`, else `../shared/data/rib` beside the crate;
//! without them the benchmarks are skipped. Short run:
//! `cargo bench --bench lpm -- --warm-up-time 1 --measurement-time 3`
//!
//! Before criterion's wall-clock groups, each set prints a `cpu-time` line: the same
//! look-ups timed by the thread's CPU clock (best of 5 passes over the set), which other jobs
//! on a shared machine disturb less than the wall clock (they still share the caches).
//!
//! `LPM_LOOP=set/kind` (`random|global|inside` / `single|batch`) runs only 20 passes of one
//! IPv6 loop, for profilers; `LPM_CALLGRIND=random|inside` a short one for callgrind.
//! `LPM_LENS=48` (or `32,48`, ...) prints only the IPv6 `cpu-time` rates for addresses inside
//! the routes of those lengths: how the walk's depth, and a mix of depths, set the rate.
#![allow(
    clippy::cast_possible_truncation,
    reason = "bench fixtures: small loop counters and random draws narrowed into addresses, ports and ids"
)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, SamplingMode, Throughput};
use ip_network_table_deps_treebitmap::IpLookupTable;
use prefix_trie::PrefixMap;
use tapyard::l3::lpm::{Fib, Lpm, Route};

/// Counts live heap bytes, to measure each structure's memory the same way.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

#[allow(
    unsafe_code,
    reason = "a global allocator implements the unsafe GlobalAlloc trait; it only forwards to System"
)]
// SAFETY: forwards to the system allocator, only counting.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size, Ordering::Relaxed);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Builds something, printing its build time and the heap bytes it keeps.
fn measure<T>(what: &str, prefixes: usize, build: impl FnOnce() -> T) -> T {
    let before = LIVE.load(Ordering::Relaxed);
    let t = Instant::now();
    let x = build();
    let took = t.elapsed();
    let bytes = LIVE.load(Ordering::Relaxed).saturating_sub(before);
    println!(
        "{what:<34} build {:>9.1} ms  heap {:>11} B  {:>6.1} B/prefix",
        took.as_secs_f64() * 1e3,
        bytes,
        bytes as f64 / prefixes as f64
    );
    x
}

fn rib_file(name: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("TAPYARD_RIB_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/data/rib"));
    let path = dir.join(name);
    if path.is_file() {
        Some(path)
    } else {
        println!(
            "SKIPPED: {} not found (set TAPYARD_RIB_DIR)",
            path.display()
        );
        None
    }
}

fn load<A>(name: &str, parse: impl Fn(&str) -> A) -> Option<Vec<Route<A>>> {
    let text = std::fs::read_to_string(rib_file(name)?).expect("readable RIB file");
    Some(
        text.lines()
            .enumerate()
            .map(|(i, line)| {
                let (addr, len) = line.split_once('/').expect("prefix/len");
                Route {
                    prefix: parse(addr),
                    len: len.parse().expect("length"),
                    next_hop: i as u32,
                }
            })
            .collect(),
    )
}

/// splitmix64.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn next_u128(&mut self) -> u128 {
        (u128::from(self.next_u64()) << 64) | u128::from(self.next_u64())
    }
}

/// The calling thread's CPU time.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    #[allow(unsafe_code, reason = "clock_gettime is a libc call")]
    // SAFETY: `ts` is a valid, writable timespec; the clock id is a constant Linux knows.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Look-ups per second of CPU time: best of 5 passes of `f` over `addrs` in `CHUNK`s.
fn cpu_rate<A: Copy>(addrs: &[A], mut f: impl FnMut(&[A]) -> u32) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = thread_cpu();
        for chunk in addrs.chunks(CHUNK) {
            black_box(f(black_box(chunk)));
        }
        best = best.min((thread_cpu() - t).as_secs_f64());
    }
    addrs.len() as f64 / best / 1e6
}

/// A named look-up loop over a chunk of addresses.
type Contender<'a, A> = (&'a str, &'a mut dyn FnMut(&[A]) -> u32);

/// Prints one `cpu-time` line: M look-ups per CPU second for each contender.
fn print_cpu_rates<A: Copy>(set: &str, addrs: &[A], contenders: &mut [Contender<'_, A>]) {
    let mut line = format!("cpu-time {set:<12}");
    let mut rates = Vec::new();
    for (name, f) in contenders.iter_mut() {
        let r = cpu_rate(addrs, f);
        line += &format!(" {name}={r:.1}");
        rates.push((*name, r));
    }
    let best_crate = rates
        .iter()
        .filter(|(n, _)| !n.starts_with("tapyard"))
        .map(|r| r.1)
        .fold(0.0, f64::max);
    for (name, r) in &rates {
        if name.starts_with("tapyard") {
            line += &format!(" {name}/best={:.2}", r / best_crate);
        }
    }
    println!("{line}  (M/s)");
}

/// Addresses per set (cycled through, `CHUNK` per iteration).
const ADDRS: usize = 1 << 20;
const CHUNK: usize = 1 << 16;

/// Runs `f` on successive `CHUNK`-address slices of `addrs`.
fn bench_chunks<A: Copy>(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    addrs: &[A],
    mut f: impl FnMut(&[A]) -> u32,
) {
    let mut at = 0;
    g.bench_function(name, |b| {
        b.iter(|| {
            let chunk = &addrs[at..at + CHUNK];
            at = (at + CHUNK) % addrs.len();
            black_box(f(black_box(chunk)))
        })
    });
}

fn sum_batch<A: tapyard::l3::lpm::Address>(lpm: &Lpm<A>, chunk: &[A], out: &mut [u32]) -> u32 {
    lpm.lookup_batch(chunk, out);
    out.iter().fold(0u32, |s, &x| s.wrapping_add(x))
}

#[inline(never)]
fn cg_single(lpm: &Lpm<u128>, ch: &[u128]) -> u32 {
    ch.iter()
        .fold(0u32, |s, &a| s.wrapping_add(lpm.lookup(a).unwrap_or(0)))
}

#[inline(never)]
fn cg_batch(lpm: &Lpm<u128>, ch: &[u128], out: &mut [u32]) -> u32 {
    sum_batch(lpm, ch, out)
}

fn ipv4(c: &mut Criterion) {
    if ["LPM_CALLGRIND", "LPM_LOOP", "LPM_LENS"]
        .iter()
        .any(|v| std::env::var_os(v).is_some())
    {
        return;
    }
    let Some(routes) = load("bart-tier1-v4.txt", |s| {
        u32::from(s.parse::<Ipv4Addr>().expect("IPv4"))
    }) else {
        return;
    };
    let n = routes.len();
    println!("\nIPv4: {n} prefixes");
    let mut rng = Rng(1);
    let random: Vec<u32> = (0..ADDRS).map(|_| rng.next_u64() as u32).collect();
    let inside: Vec<u32> = (0..ADDRS)
        .map(|_| {
            let r = routes[(rng.next_u64() % n as u64) as usize];
            let host = u32::MAX.checked_shr(u32::from(r.len)).unwrap_or(0);
            r.prefix | (rng.next_u64() as u32 & host)
        })
        .collect();

    let lpm = measure("tapyard Lpm<u32> (builder)", n, || {
        let mut b = Lpm::builder();
        for r in &routes {
            b.insert(r.prefix, r.len, r.next_hop).unwrap();
        }
        b.build()
    });
    println!(
        "  Lpm::<u32>::memory_bytes {} ({:.1} B/prefix); {lpm:?}",
        lpm.memory_bytes(),
        lpm.memory_bytes() as f64 / n as f64
    );
    let before = LIVE.load(Ordering::Relaxed);
    let fib = measure("tapyard Fib<u32> (RIB + snapshot)", n, || {
        Fib::from_routes(routes.iter().copied()).unwrap()
    });
    updates(&fib, &routes, before);
    let tbm = measure("treebitmap IpLookupTable", n, || {
        let mut t = IpLookupTable::new();
        for r in &routes {
            t.insert(Ipv4Addr::from(r.prefix), u32::from(r.len), r.next_hop);
        }
        t
    });
    println!(
        "  treebitmap mem_usage (nodes, results) {:?}",
        tbm.mem_usage()
    );
    let ptrie = measure("prefix-trie PrefixMap", n, || {
        let mut t = PrefixMap::<(u32, u8), u32>::new();
        for r in &routes {
            t.insert((r.prefix, r.len), r.next_hop);
        }
        t
    });
    println!("  prefix-trie mem_size {}", ptrie.mem_size());
    small_tables(&routes);

    // All three agree.
    for &a in random.iter().chain(&inside).step_by(97) {
        let mine = lpm.lookup(a);
        assert_eq!(mine, tbm.longest_match(Ipv4Addr::from(a)).map(|x| *x.2));
        assert_eq!(mine, ptrie.get_lpm(&(a, 32)).map(|x| *x.1));
    }

    for (set, addrs) in [("random", &random), ("inside", &inside)] {
        let mut out = vec![0u32; CHUNK];
        print_cpu_rates(
            &format!("ipv4/{set}"),
            addrs,
            &mut [
                ("tapyard_single", &mut |ch: &[u32]| {
                    ch.iter()
                        .fold(0u32, |s, &a| s.wrapping_add(lpm.lookup(a).unwrap_or(0)))
                }),
                ("tapyard_batch", &mut |ch: &[u32]| {
                    sum_batch(&lpm, ch, &mut out)
                }),
                ("treebitmap", &mut |ch: &[u32]| {
                    ch.iter().fold(0u32, |s, &a| {
                        s.wrapping_add(tbm.longest_match(Ipv4Addr::from(a)).map_or(0, |x| *x.2))
                    })
                }),
                ("prefix_trie", &mut |ch: &[u32]| {
                    ch.iter().fold(0u32, |s, &a| {
                        s.wrapping_add(ptrie.get_lpm(&(a, 32)).map_or(0, |x| *x.1))
                    })
                }),
            ],
        );
    }
    for (set, addrs) in [("random", &random), ("inside", &inside)] {
        let mut g = c.benchmark_group(format!("ipv4/{set}"));
        g.throughput(Throughput::Elements(CHUNK as u64));
        g.sampling_mode(SamplingMode::Flat);
        g.sample_size(20);
        bench_chunks(&mut g, "tapyard_single", addrs, |ch| {
            ch.iter()
                .fold(0u32, |s, &a| s.wrapping_add(lpm.lookup(a).unwrap_or(0)))
        });
        let mut out = vec![0u32; CHUNK];
        bench_chunks(&mut g, "tapyard_batch", addrs, |ch| {
            sum_batch(&lpm, ch, &mut out)
        });
        // The same through the concurrent wrapper: an `ArcSwap` load per call, or a
        // per-thread reader handle.
        bench_chunks(&mut g, "tapyard_fib_single", addrs, |ch| {
            ch.iter()
                .fold(0u32, |s, &a| s.wrapping_add(fib.lookup(a).unwrap_or(0)))
        });
        let mut reader = fib.reader();
        bench_chunks(&mut g, "tapyard_reader_single", addrs, |ch| {
            ch.iter()
                .fold(0u32, |s, &a| s.wrapping_add(reader.lookup(a).unwrap_or(0)))
        });
        drop(reader);
        bench_chunks(&mut g, "tapyard_fib_batch", addrs, |ch| {
            fib.lookup_batch(ch, &mut out);
            out.iter().fold(0u32, |s, &x| s.wrapping_add(x))
        });
        bench_chunks(&mut g, "treebitmap", addrs, |ch| {
            ch.iter().fold(0u32, |s, &a| {
                s.wrapping_add(tbm.longest_match(Ipv4Addr::from(a)).map_or(0, |x| *x.2))
            })
        });
        bench_chunks(&mut g, "prefix_trie", addrs, |ch| {
            ch.iter().fold(0u32, |s, &a| {
                s.wrapping_add(ptrie.get_lpm(&(a, 32)).map_or(0, |x| *x.1))
            })
        });
        g.finish();
    }
}

/// Update costs on a full FIB: single changes (remove or re-insert a random route) with
/// no reader holding the previous version (patched in place) and while one holds it (the
/// writer must copy the table), and one batch of 10,000 changes. `before`: live heap bytes
/// before the FIB was built.
fn updates<A: tapyard::l3::lpm::Address>(fib: &Fib<A>, routes: &[Route<A>], before: usize) {
    let mut rng = Rng(3);
    let mut pick = || routes[(rng.next_u64() % routes.len() as u64) as usize];
    let mut change = |fib: &Fib<A>| {
        let r = pick();
        if fib.remove(r.prefix, r.len).unwrap().is_none() {
            fib.insert(r.prefix, r.len, r.next_hop).unwrap();
        }
    };
    const SINGLE: u32 = 2000;
    let t = Instant::now();
    for _ in 0..SINGLE {
        change(fib);
    }
    let free = t.elapsed() / SINGLE;
    // Hold the last two versions, so that the writer cannot reuse the previous one.
    let mut held = (fib.snapshot(), fib.snapshot());
    let t = Instant::now();
    for _ in 0..SINGLE / 10 {
        change(fib);
        held = (fib.snapshot(), held.0);
    }
    let copied = t.elapsed() / (SINGLE / 10);
    drop(held);
    let t = Instant::now();
    fib.update(|b| {
        for _ in 0..10_000 {
            let r = pick();
            if b.remove(r.prefix, r.len)?.is_none() {
                b.insert(r.prefix, r.len, r.next_hop)?;
            }
        }
        Ok::<_, tapyard::l3::lpm::LpmError>(())
    })
    .unwrap();
    let batch = t.elapsed();
    // Back to the full table.
    fib.update(|b| {
        for r in routes {
            b.insert(r.prefix, r.len, r.next_hop)?;
        }
        Ok::<_, tapyard::l3::lpm::LpmError>(())
    })
    .unwrap();
    assert_eq!(fib.len(), routes.len());
    println!(
        "  Fib updates: single {free:?} each (previous version free), {copied:?} each (previous \
         version held by a reader: copy); batch of 10000 in {batch:?}; heap after updates {} B \
         ({:.1} B/prefix: RIB + current + spare version)",
        LIVE.load(Ordering::Relaxed) - before,
        (LIVE.load(Ordering::Relaxed) - before) as f64 / routes.len() as f64
    );
}

/// A Kubernetes-node-sized table (20 routes): build time and memory of each.
fn small_tables(routes: &[Route<u32>]) {
    let small: Vec<Route<u32>> = routes.iter().step_by(routes.len() / 20).copied().collect();
    let n = small.len();
    println!("Small table: {n} prefixes");
    let t = Instant::now();
    let mut reps = 0u32;
    while t.elapsed() < Duration::from_millis(100) {
        black_box(Lpm::from_routes(small.iter().copied()).unwrap());
        reps += 1;
    }
    println!(
        "  tapyard Lpm<u32> build {:.2} us (mean of {reps})",
        t.elapsed().as_secs_f64() * 1e6 / f64::from(reps)
    );
    let lpm = measure("  tapyard Lpm<u32>", n, || {
        Lpm::from_routes(small.iter().copied()).unwrap()
    });
    println!("    memory_bytes {}", lpm.memory_bytes());
    measure("  tapyard Fib<u32>", n, || {
        Fib::from_routes(small.iter().copied()).unwrap()
    });
    measure("  treebitmap", n, || {
        let mut t = IpLookupTable::new();
        for r in &small {
            t.insert(Ipv4Addr::from(r.prefix), u32::from(r.len), r.next_hop);
        }
        t
    });
    measure("  prefix-trie", n, || {
        let mut t = PrefixMap::<(u32, u8), u32>::new();
        for r in &small {
            t.insert((r.prefix, r.len), r.next_hop);
        }
        t
    });
}

fn ipv6(c: &mut Criterion) {
    let Some(routes) = load("bart-tier1-v6.txt", |s| {
        u128::from(s.parse::<Ipv6Addr>().expect("IPv6"))
    }) else {
        return;
    };
    let n = routes.len();
    println!("\nIPv6: {n} prefixes");
    let mut rng = Rng(2);
    let random: Vec<u128> = (0..ADDRS).map(|_| rng.next_u128()).collect();
    // Uniform over the whole space almost never matches: also uniform over 2000::/3.
    let global: Vec<u128> = (0..ADDRS)
        .map(|_| (rng.next_u128() >> 3) | (1 << 125))
        .collect();
    let inside: Vec<u128> = (0..ADDRS)
        .map(|_| {
            let r = routes[(rng.next_u64() % n as u64) as usize];
            let host = u128::MAX.checked_shr(u32::from(r.len)).unwrap_or(0);
            r.prefix | (rng.next_u128() & host)
        })
        .collect();

    let lpm = measure("tapyard Lpm<u128> (builder)", n, || {
        let mut b = Lpm::builder();
        for r in &routes {
            b.insert(r.prefix, r.len, r.next_hop).unwrap();
        }
        b.build()
    });
    if let Ok(lens) = std::env::var("LPM_LENS") {
        // Addresses inside the routes of the given lengths only.
        let want: Vec<u8> = lens
            .split(',')
            .map(|x| {
                x.trim()
                    .parse()
                    .expect("LPM_LENS: prefix lengths, comma-separated")
            })
            .collect();
        let sel: Vec<_> = routes
            .iter()
            .filter(|r| want.contains(&r.len))
            .copied()
            .collect();
        assert!(!sel.is_empty(), "LPM_LENS: no route of length {lens}");
        let mut rng = Rng(7);
        let set: Vec<u128> = (0..ADDRS)
            .map(|_| {
                let r = sel[(rng.next_u64() % sel.len() as u64) as usize];
                let host = u128::MAX.checked_shr(u32::from(r.len)).unwrap_or(0);
                r.prefix | (rng.next_u128() & host)
            })
            .collect();
        let mut out = vec![0u32; CHUNK];
        let s = cpu_rate(&set, |ch| cg_single(&lpm, ch));
        let b = cpu_rate(&set, |ch| cg_batch(&lpm, ch, &mut out));
        println!(
            "cpu-time ipv6/inside /{lens} ({} routes): tapyard_single={s:.1} tapyard_batch={b:.1}  (M/s)",
            sel.len()
        );
        return;
    }
    if let Ok(what) = std::env::var("LPM_LOOP") {
        // `LPM_LOOP=set/kind` (e.g. `inside/single`, `random/batch`): 20 passes of one loop
        // over one set, for `perf stat`/`perf record`.
        let (set, kind) = what.split_once('/').expect("LPM_LOOP=set/kind");
        let addrs = match set {
            "random" => &random,
            "global" => &global,
            _ => &inside,
        };
        let mut out = vec![0u32; CHUNK];
        let mut sum = 0u32;
        for _ in 0..20 {
            for ch in addrs.chunks(CHUNK) {
                sum = sum.wrapping_add(if kind == "batch" {
                    cg_batch(&lpm, ch, &mut out)
                } else {
                    cg_single(&lpm, ch)
                });
            }
        }
        println!("{what}: {sum}");
        return;
    }
    if std::env::var_os("LPM_CALLGRIND").is_some() {
        // A short deterministic run for `valgrind --tool=callgrind
        // --toggle-collect='lpm::cg_*'`: instructions per look-up of each kind.
        let only = std::env::var("LPM_CALLGRIND").unwrap_or_default();
        for (set, addrs) in [("random", &random), ("inside", &inside)] {
            if !only.is_empty() && only != set {
                continue;
            }
            let ch = &addrs[..CHUNK];
            let mut out = vec![0u32; CHUNK];
            println!(
                "{set}: {} {}",
                cg_single(&lpm, ch),
                cg_batch(&lpm, ch, &mut out)
            );
        }
        return;
    }
    println!(
        "  Lpm::<u128>::memory_bytes {} ({:.1} B/prefix); {lpm:?}",
        lpm.memory_bytes(),
        lpm.memory_bytes() as f64 / n as f64
    );
    let before = LIVE.load(Ordering::Relaxed);
    let fib = measure("tapyard Fib<u128> (RIB + snapshot)", n, || {
        Fib::from_routes(routes.iter().copied()).unwrap()
    });
    updates(&fib, &routes, before);
    drop(fib);
    let tbm = measure("treebitmap IpLookupTable", n, || {
        let mut t = IpLookupTable::new();
        for r in &routes {
            t.insert(Ipv6Addr::from(r.prefix), u32::from(r.len), r.next_hop);
        }
        t
    });
    println!(
        "  treebitmap mem_usage (nodes, results) {:?}",
        tbm.mem_usage()
    );
    let ptrie = measure("prefix-trie PrefixMap", n, || {
        let mut t = PrefixMap::<(u128, u8), u32>::new();
        for r in &routes {
            t.insert((r.prefix, r.len), r.next_hop);
        }
        t
    });
    println!("  prefix-trie mem_size {}", ptrie.mem_size());

    for &a in random.iter().chain(&global).chain(&inside).step_by(97) {
        let mine = lpm.lookup(a);
        assert_eq!(mine, tbm.longest_match(Ipv6Addr::from(a)).map(|x| *x.2));
        assert_eq!(mine, ptrie.get_lpm(&(a, 128)).map(|x| *x.1));
    }

    for (set, addrs) in [
        ("random", &random),
        ("global", &global),
        ("inside", &inside),
    ] {
        let mut out = vec![0u32; CHUNK];
        print_cpu_rates(
            &format!("ipv6/{set}"),
            addrs,
            &mut [
                ("tapyard_single", &mut |ch: &[u128]| {
                    ch.iter()
                        .fold(0u32, |s, &a| s.wrapping_add(lpm.lookup(a).unwrap_or(0)))
                }),
                ("tapyard_batch", &mut |ch: &[u128]| {
                    sum_batch(&lpm, ch, &mut out)
                }),
                ("treebitmap", &mut |ch: &[u128]| {
                    ch.iter().fold(0u32, |s, &a| {
                        s.wrapping_add(tbm.longest_match(Ipv6Addr::from(a)).map_or(0, |x| *x.2))
                    })
                }),
                ("prefix_trie", &mut |ch: &[u128]| {
                    ch.iter().fold(0u32, |s, &a| {
                        s.wrapping_add(ptrie.get_lpm(&(a, 128)).map_or(0, |x| *x.1))
                    })
                }),
            ],
        );
    }
    for (set, addrs) in [
        ("random", &random),
        ("global", &global),
        ("inside", &inside),
    ] {
        let mut g = c.benchmark_group(format!("ipv6/{set}"));
        g.throughput(Throughput::Elements(CHUNK as u64));
        g.sampling_mode(SamplingMode::Flat);
        g.sample_size(20);
        bench_chunks(&mut g, "tapyard_single", addrs, |ch| {
            ch.iter()
                .fold(0u32, |s, &a| s.wrapping_add(lpm.lookup(a).unwrap_or(0)))
        });
        let mut out = vec![0u32; CHUNK];
        bench_chunks(&mut g, "tapyard_batch", addrs, |ch| {
            sum_batch(&lpm, ch, &mut out)
        });
        bench_chunks(&mut g, "treebitmap", addrs, |ch| {
            ch.iter().fold(0u32, |s, &a| {
                s.wrapping_add(tbm.longest_match(Ipv6Addr::from(a)).map_or(0, |x| *x.2))
            })
        });
        bench_chunks(&mut g, "prefix_trie", addrs, |ch| {
            ch.iter().fold(0u32, |s, &a| {
                s.wrapping_add(ptrie.get_lpm(&(a, 128)).map_or(0, |x| *x.1))
            })
        });
        g.finish();
    }
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
}

criterion_group! {
    name = benches;
    config = config();
    targets = ipv4, ipv6
}
criterion_main!(benches);
