//! The bridge's forwarding decision (learn the source, look up the destination) on a warm
//! table of 1 k and 100 k stations, tapyard's lock-free FDB through `Datapath::process` in
//! batches of 32, beside a plain `Mutex<HashMap>` bridge deciding the same frames.
//!
//! `cargo bench --bench bridge`
#![allow(
    clippy::cast_possible_truncation,
    reason = "bench fixtures: small loop counters and random draws narrowed into addresses, ports and ids"
)]

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use tapyard::{Batch, BridgeConfig, Datapath, Instant, PacketBuf, PortId, BATCH_SIZE};

use common::{frame, mac_of, MutexBridge, Out, Rng};
use tapyard_testkit::bench as common;

const PORTS: u16 = 8;

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("forwarding_decision");
    for &stations in &[1_000u32, 100_000] {
        let mut b = Datapath::builder();
        let mut cfg = BridgeConfig::new("br0");
        // The default limit for 1k stations; room for all of them at 100k.
        cfg.fdb_max_entries = if stations > 8192 { 131_072 } else { 8192 };
        let br = b.add_bridge(cfg).unwrap();
        for p in 0..PORTS {
            b.add_port(format!("p{p}"), Some(br)).unwrap();
        }
        let dp = b.build();
        let mut w = dp.worker();
        let base = MutexBridge::new(usize::from(PORTS));
        let now = Instant::from_secs(1);
        // Warm both tables with every station on its port.
        for i in 0..stations {
            let f = frame(tapyard::MacAddr::BROADCAST, mac_of(i));
            let port = PortId((i % u32::from(PORTS)) as u16);
            dp.control()
                .bridge(br)
                .unwrap()
                .fdb()
                .learn(mac_of(i), port, now);
            base.decide(&f, port, now);
        }
        // 64 batches of random (src, dst) pairs, each frame on its source's port.
        let mut rng = Rng(0x1234_5678);
        let batches: Vec<Vec<(Vec<u8>, PortId)>> = (0..64)
            .map(|_| {
                (0..BATCH_SIZE)
                    .map(|_| {
                        let s = (rng.next() % u64::from(stations)) as u32;
                        let d = (rng.next() % u64::from(stations)) as u32;
                        (
                            frame(mac_of(d), mac_of(s)),
                            PortId((s % u32::from(PORTS)) as u16),
                        )
                    })
                    .collect()
            })
            .collect();
        let mut bufs: Vec<Batch> = batches
            .iter()
            .map(|fs| {
                let mut b = Batch::new();
                for (f, p) in fs {
                    let mut pb = PacketBuf::from_frame(f);
                    pb.port = *p;
                    b.push(pb).unwrap();
                }
                b
            })
            .collect();
        g.throughput(Throughput::Elements(BATCH_SIZE as u64));
        let mut k = 0usize;
        let id = format!("tapyard_fdb/{stations}");
        common::bench_iter(&mut g, "forwarding_decision", &id, || {
            k = (k + 1) & 63;
            dp.process(&mut w, now, &mut bufs[k]);
            black_box(bufs[k].verdicts());
        });
        let mut k = 0usize;
        g.bench_function(BenchmarkId::new("mutex_hashmap", stations), |bch| {
            bch.iter(|| {
                k = (k + 1) & 63;
                let mut n = 0u32;
                for (f, p) in &batches[k] {
                    if let Out::One(_) = base.decide(black_box(f), *p, now) {
                        n += 1;
                    }
                }
                black_box(n)
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
