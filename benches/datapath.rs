//! Frames per second through the whole datapath with in-memory ports: 4 stations on a 4-port
//! bridge, each port holding a batch of 32 64-byte frames for the next station. Timed: one
//! pump round, which receives each port's batch, processes it and transmits every frame into
//! its destination port's queue (a copy). Not timed: the host ends queueing the frames and
//! draining the results. Beside it, the same round with a `Mutex<HashMap>` bridge in place of
//! the datapath.
//!
//! `cargo bench --bench datapath`

use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use tapyard::port::{mem_pair, MemPort, Port};
use tapyard::runtime::Pump;
use tapyard::{Batch, BridgeConfig, BufPool, Datapath, Instant, PortId, BATCH_SIZE};

#[path = "common.rs"]
mod common;
use common::{frame, mac_of, MutexBridge, Out};

const PORTS: usize = 4;

struct Rig {
    hosts: Vec<MemPort>,
    bridge_ends: Vec<Arc<MemPort>>,
    frames: Vec<Vec<u8>>,
}

fn rig() -> Rig {
    let mut hosts = Vec::new();
    let mut bridge_ends = Vec::new();
    for p in 0..PORTS {
        let (a, h) = mem_pair(&format!("p{p}"), &format!("h{p}"), 4 * BATCH_SIZE);
        bridge_ends.push(Arc::new(a));
        hosts.push(h);
    }
    // Host p sends to host (p + 1) % PORTS.
    let frames = (0..PORTS)
        .map(|p| frame(mac_of(((p + 1) % PORTS) as u32), mac_of(p as u32)))
        .collect();
    Rig {
        hosts,
        bridge_ends,
        frames,
    }
}

impl Rig {
    fn inject(&self) {
        for (h, f) in self.hosts.iter().zip(&self.frames) {
            for _ in 0..BATCH_SIZE {
                h.send_frame(f).unwrap();
            }
        }
    }
    fn drain(&self) -> usize {
        let mut n = 0;
        for h in &self.hosts {
            while let Some(b) = h.recv_frame() {
                n += 1;
                h.recycle(b);
            }
        }
        n
    }
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("datapath_mem_ports");
    g.throughput(Throughput::Elements((PORTS * BATCH_SIZE) as u64));

    let r = rig();
    let mut b = Datapath::builder();
    let br = b.add_bridge(BridgeConfig::new("br0")).unwrap();
    let ports: Vec<(PortId, Arc<dyn Port>)> = r
        .bridge_ends
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let id = b.add_port(format!("p{i}"), Some(br)).unwrap();
            (id, e.clone() as Arc<dyn Port>)
        })
        .collect();
    let dp = Arc::new(b.build());
    let mut pump = Pump::new(dp.clone(), &ports).unwrap();
    // Warm up: learn every station.
    r.inject();
    pump.drain(Instant::ZERO, 8);
    r.drain();
    g.bench_function("tapyard", |bch| {
        bch.iter_batched(
            || {
                r.drain();
                r.inject();
            },
            |()| black_box(pump.poll(Instant::ZERO).unwrap()),
            BatchSize::PerIteration,
        )
    });
    let s = dp.stats();
    assert_eq!(s.rx_drops(), 0, "{s}");

    let r = rig();
    let base = MutexBridge::new(PORTS);
    let mut pool = BufPool::default();
    let mut batch = Batch::new();
    g.bench_function("mutex_hashmap", |bch| {
        bch.iter_batched(
            || {
                r.drain();
                r.inject();
            },
            |()| {
                for (i, port) in r.bridge_ends.iter().enumerate() {
                    port.recv_batch(&mut pool, &mut batch).unwrap();
                    for buf in batch.bufs() {
                        match base.decide(buf.frame(), PortId(i as u16), Instant::ZERO) {
                            Out::One(p) => {
                                let _ = r.bridge_ends[usize::from(p.0)].send(buf);
                            }
                            Out::Flood => {
                                for (j, o) in r.bridge_ends.iter().enumerate() {
                                    if j != i {
                                        let _ = o.send(buf);
                                    }
                                }
                            }
                            Out::Drop => {}
                        }
                    }
                    batch.recycle(&mut pool);
                }
            },
            BatchSize::PerIteration,
        )
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
