//! Connection tracking: lookups of existing connections with 1 and 2 threads on a table of
//! 10 k and 100 k connections (tapyard's lock-free `Conntrack`, one at a time and in batches of 32
//! prefetched in two stages, buckets then entries), beside `parking_lot::Mutex<HashMap>` and `DashMap` holding the same tuples; and the
//! new-connection insert rate into a table pre-filled with 1 M connections, beside a
//! `HashMap` insert of the same two tuples per connection.
//!
//! Multi-threaded throughput is measured with `iter_custom`: each sample starts the threads
//! (scoped), each does `iters × 1024` lookups, and the sample's time is the wall time of the
//! slowest; the throughput counts all threads' lookups.
//!
//! `ct_lookup_v4_v6_{10,100}k` looks the same connections up in the IPv4 table and, with
//! IPv6 addresses (a /64 per node and the IPv4 pattern in the low bits), in the IPv6 table
//! (`ConntrackOf<Ipv6Addr>`, 128-byte entries, five-word keys), one thread, one at a time.
//!
//! `cargo bench --bench flow -- --warm-up-time 1 --measurement-time 3`
#![allow(
    clippy::cast_possible_truncation,
    reason = "bench fixtures: small loop counters and random draws narrowed into addresses, ports and ids"
)]

use std::collections::HashMap;
use std::hint::black_box;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant as StdInstant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use dashmap::DashMap;
use parking_lot::Mutex;
use std::net::Ipv6Addr;
use tapyard::conntrack::{tcp::flags, Conntrack, ConntrackOf, CtConfig, CtHit, CtTag, Pkt};
use tapyard::wire::tuple::{L4Kind, Tuple};
use tapyard::Instant;

use common::Rng;
use tapyard_testkit::bench as common;

const CONNS: u32 = 100_000;
const CHUNK: usize = 1024;

const SYN: Pkt = Pkt {
    kind: L4Kind::Tcp,
    tcp_flags: flags::SYN,
    len: 60,
};

/// Connection `i`: a pod's client port to a ClusterIP, DNAT'd to an endpoint.
fn conn(i: u32) -> (Tuple, Tuple) {
    let o = Tuple {
        src: Ipv4Addr::from(0x0af4_0000 | (i >> 14)),
        dst: Ipv4Addr::from(0x0a60_0000 | (i % 997)),
        sport: 10_000 + (i & 0x3fff) as u16,
        dport: 80,
        proto: 6,
        zone: 0,
    };
    let r = Tuple {
        src: Ipv4Addr::from(0x0af5_0000 | (i % 4093)),
        sport: 8080,
        ..o.invert()
    };
    (o, r)
}

#[derive(Clone, Copy)]
#[allow(dead_code)]
struct Val {
    orig: Tuple,
    reply: Tuple,
    id: u32,
}

/// Runs `f(thread, iters)` on `threads` threads at once and returns the wall time.
fn par(threads: usize, iters: u64, f: &(impl Fn(usize, u64) + Sync)) -> Duration {
    if threads == 1 {
        let t = StdInstant::now();
        f(0, iters);
        return t.elapsed();
    }
    let barrier = std::sync::Barrier::new(threads + 1);
    std::thread::scope(|s| {
        for th in 0..threads {
            let barrier = &barrier;
            s.spawn(move || {
                barrier.wait();
                f(th, iters);
            });
        }
        barrier.wait();
        let t = StdInstant::now();
        // The scope joins the threads before returning.
        t
    })
    .elapsed()
}

fn lookups(c: &mut Criterion) {
    // 10 k connections fit in cache (compute-bound); 100 k do not (memory-bound).
    lookups_n(c, 10_000);
    lookups_n(c, CONNS);
    lookups_v4_v6(c, 10_000);
    lookups_v4_v6(c, CONNS);
}

/// Connection `i` of [`conn`] with IPv6 addresses: `fd00:<v4 high half>::<v4>`.
fn conn6(i: u32) -> (Tuple<Ipv6Addr>, Tuple<Ipv6Addr>) {
    let (o, r) = conn(i);
    let a = |v: Ipv4Addr| {
        let x = u32::from(v);
        Ipv6Addr::from(0xfd00_u128 << 112 | u128::from(x >> 16) << 64 | u128::from(x))
    };
    let six = |t: Tuple| Tuple {
        src: a(t.src),
        dst: a(t.dst),
        sport: t.sport,
        dport: t.dport,
        proto: t.proto,
        zone: t.zone,
    };
    (six(o), six(r))
}

fn lookups_v4_v6(c: &mut Criterion, conns: u32) {
    let now = Instant::from_secs(1);
    let cfg = CtConfig {
        max_entries: 262_144,
        ..CtConfig::default()
    };
    let ct = Conntrack::new(cfg).unwrap();
    let ct6 = ConntrackOf::<Ipv6Addr>::new(cfg).unwrap();
    for i in 0..conns {
        let (o, r) = conn(i);
        ct.insert(o, r, CtTag::default(), &SYN, now).unwrap();
        let (o, r) = conn6(i);
        ct6.insert(o, r, CtTag::default(), &SYN, now).unwrap();
    }
    let mut rng = Rng(0x51ed_2701);
    let picks: Vec<(u32, bool)> = (0..(1 << 18))
        .map(|_| ((rng.next() % u64::from(conns)) as u32, rng.next() & 1 == 0))
        .collect();
    let seq4: Vec<Tuple> = picks
        .iter()
        .map(|&(i, o)| if o { conn(i).0 } else { conn(i).1 })
        .collect();
    let seq6: Vec<Tuple<Ipv6Addr>> = picks
        .iter()
        .map(|&(i, o)| if o { conn6(i).0 } else { conn6(i).1 })
        .collect();
    let mask = (1usize << 18) - 1;
    let mut g = c.benchmark_group(format!("ct_lookup_v4_v6_{}k", conns / 1000));
    g.sample_size(10);
    g.throughput(Throughput::Elements(CHUNK as u64));
    g.bench_function("ipv4", |b| {
        b.iter_custom(|iters| {
            par(1, iters, &|th, iters| {
                walk(&seq4, mask, th, iters, |t| {
                    ct.lookup(t, now).map(|h| h.id.slot)
                })
            })
        })
    });
    g.bench_function("ipv6", |b| {
        b.iter_custom(|iters| {
            par(1, iters, &|_, iters| {
                let mut k = 0usize;
                let mut n = 0u32;
                for _ in 0..iters {
                    for _ in 0..CHUNK {
                        k = (k + 1) & mask;
                        if let Some(h) = ct6.lookup(&seq6[k], now) {
                            n = n.wrapping_add(h.id.slot);
                        }
                    }
                }
                black_box(n);
            })
        })
    });
    g.finish();
}

fn lookups_n(c: &mut Criterion, conns: u32) {
    let now = Instant::from_secs(1);
    let ct = Conntrack::new(CtConfig {
        max_entries: 262_144,
        ..CtConfig::default()
    })
    .unwrap();
    let mutex: Mutex<HashMap<Tuple, Val>> = Mutex::new(HashMap::new());
    let dash: DashMap<Tuple, Val> = DashMap::new();
    let mut keys = Vec::with_capacity(conns as usize);
    for i in 0..conns {
        let (o, r) = conn(i);
        ct.insert(o, r, CtTag::default(), &SYN, now).unwrap();
        let v = Val {
            orig: o,
            reply: r,
            id: i,
        };
        mutex.lock().insert(o, v);
        mutex.lock().insert(r, v);
        dash.insert(o, v);
        dash.insert(r, v);
        keys.push(o);
    }
    // Each thread walks its own random sequence of existing keys (both directions).
    let mut rng = Rng(0x9e37_79b9);
    let seqs: Vec<Vec<Tuple>> = (0..2)
        .map(|_| {
            (0..(1 << 18))
                .map(|_| {
                    let i = (rng.next() % u64::from(conns)) as u32;
                    let (o, r) = conn(i);
                    if rng.next() & 1 == 0 {
                        o
                    } else {
                        r
                    }
                })
                .collect()
        })
        .collect();
    let mask = (1usize << 18) - 1;

    let mut g = c.benchmark_group(format!("ct_lookup_{}k", conns / 1000));
    g.sample_size(10);
    for threads in [1usize, 2] {
        g.throughput(Throughput::Elements((threads * CHUNK) as u64));
        g.bench_function(BenchmarkId::new("tapyard", threads), |b| {
            b.iter_custom(|iters| {
                par(threads, iters, &|th, iters| {
                    walk(&seqs[th], mask, th, iters, |t| {
                        ct.lookup(t, now).map(|h| h.id.slot)
                    })
                })
            })
        });
        g.bench_function(BenchmarkId::new("tapyard_batch32", threads), |b| {
            b.iter_custom(|iters| {
                par(threads, iters, &|th, iters| {
                    let seq = &seqs[th];
                    let mut k = th * 7919;
                    let mut n = 0u32;
                    let mut locs = [ct.locate(&seq[0]); 32];
                    for _ in 0..iters {
                        for _ in 0..CHUNK / 32 {
                            for l in locs.iter_mut() {
                                k = (k + 1) & mask;
                                *l = ct.locate(&seq[k]);
                                ct.prefetch(l);
                            }
                            for l in &locs {
                                ct.prefetch_entry(l);
                            }
                            for l in &locs {
                                if let Some(h) = ct.lookup_loc(l, now) {
                                    n = n.wrapping_add(h.id.slot);
                                }
                            }
                        }
                    }
                    black_box(n);
                })
            })
        });
        g.bench_function(BenchmarkId::new("mutex_hashmap", threads), |b| {
            b.iter_custom(|iters| {
                par(threads, iters, &|th, iters| {
                    walk(&seqs[th], mask, th, iters, |t| {
                        mutex.lock().get(t).map(|v| v.id)
                    })
                })
            })
        });
        g.bench_function(BenchmarkId::new("dashmap", threads), |b| {
            b.iter_custom(|iters| {
                par(threads, iters, &|th, iters| {
                    walk(&seqs[th], mask, th, iters, |t| dash.get(t).map(|v| v.id))
                })
            })
        });
    }
    g.finish();
    black_box(&keys);
}

/// One thread's share of a lookup bench: `iters` chunks of `CHUNK` lookups walking `seq` from a
/// per-thread offset; `lookup` returns an id to fold in (so the work is not optimised away).
#[inline(always)]
fn walk(seq: &[Tuple], mask: usize, th: usize, iters: u64, lookup: impl Fn(&Tuple) -> Option<u32>) {
    let mut k = th * 7919;
    let mut n = 0u32;
    for _ in 0..iters {
        for _ in 0..CHUNK {
            k = (k + 1) & mask;
            if let Some(id) = lookup(&seq[k]) {
                n = n.wrapping_add(id);
            }
        }
    }
    black_box(n);
}

fn inserts(c: &mut Criterion) {
    const PREFILL: u32 = 1_000_000;
    const ROOM: u64 = 500_000;
    let now = Instant::from_secs(1);
    let ct = Conntrack::new(CtConfig {
        max_entries: 2_000_000,
        ..CtConfig::default()
    })
    .unwrap();
    for i in 0..PREFILL {
        let (o, r) = conn(i);
        ct.insert(o, r, CtTag::default(), &SYN, now).unwrap();
    }
    let mut base: HashMap<Tuple, Val> = HashMap::with_capacity(2 * 2_000_000);
    for i in 0..PREFILL {
        let (o, r) = conn(i);
        let v = Val {
            orig: o,
            reply: r,
            id: i,
        };
        base.insert(o, v);
        base.insert(r, v);
    }
    let mut g = c.benchmark_group("ct_insert_prefilled_1m");
    g.sample_size(10);
    g.throughput(Throughput::Elements(1));
    let mut next = PREFILL;
    let mut ids: Vec<CtHit> = Vec::with_capacity(ROOM as usize);
    g.bench_function("tapyard", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut left = iters;
            while left > 0 {
                let n = left.min(ROOM);
                left -= n;
                ids.clear();
                let t = StdInstant::now();
                for _ in 0..n {
                    let (o, r) = conn(next);
                    next = next.wrapping_add(1).max(PREFILL);
                    if let Ok(h) = ct.insert(o, r, CtTag::default(), &SYN, now) {
                        ids.push(h);
                    }
                }
                total += t.elapsed();
                for h in &ids {
                    ct.remove(h.id);
                }
            }
            total
        })
    });
    let mut next = PREFILL;
    let mut added: Vec<(Tuple, Tuple)> = Vec::with_capacity(ROOM as usize);
    g.bench_function("hashmap_two_keys", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut left = iters;
            while left > 0 {
                let n = left.min(ROOM);
                left -= n;
                added.clear();
                let t = StdInstant::now();
                for _ in 0..n {
                    let (o, r) = conn(next);
                    next = next.wrapping_add(1).max(PREFILL);
                    let v = Val {
                        orig: o,
                        reply: r,
                        id: next,
                    };
                    base.insert(o, v);
                    base.insert(r, v);
                    added.push((o, r));
                }
                total += t.elapsed();
                for (o, r) in &added {
                    base.remove(o);
                    base.remove(r);
                }
            }
            total
        })
    });
    g.finish();
    println!(
        "conntrack memory: {} bytes for {} entries ({} bytes per connection)",
        ct.memory_bytes(),
        ct.config().max_entries,
        ct.memory_bytes() / ct.config().max_entries
    );
}

criterion_group!(benches, lookups, inserts);
criterion_main!(benches);
