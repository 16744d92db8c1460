//! The benches' helpers: a plain `Mutex<HashMap>` learning bridge (the baseline), frame and
//! station generators, and criterion runs that `benches/callgrind.sh` can make deterministic.
#![allow(
    clippy::cast_possible_truncation,
    reason = "bench fixtures: small loop counters and random draws narrowed into addresses, ports and ids"
)]

use std::collections::HashMap;
use std::sync::Mutex;

use tapyard::wire::EthMeta;
use tapyard::{Instant, MacAddr, PortId};

/// The textbook learning bridge: one lock around a HashMap of MAC -> (port, last seen).
#[derive(Debug)]
pub struct MutexBridge {
    /// MAC -> (port, last seen).
    pub table: Mutex<HashMap<MacAddr, (PortId, Instant)>>,
    /// Its ports.
    pub ports: Vec<PortId>,
}

/// Where [`MutexBridge::decide`] sends a frame.
#[derive(Debug)]
pub enum Out {
    /// To this port.
    One(PortId),
    /// To every port but the one it came in on.
    Flood,
    /// Nowhere.
    Drop,
}

impl MutexBridge {
    /// A bridge of `ports` ports, its table empty.
    pub fn new(ports: usize) -> MutexBridge {
        MutexBridge {
            table: Mutex::new(HashMap::new()),
            ports: (0..ports as u16).map(PortId).collect(),
        }
    }

    /// Learns the frame's source and decides where it goes.
    #[inline]
    pub fn decide(&self, frame: &[u8], in_port: PortId, now: Instant) -> Out {
        let Ok(m) = EthMeta::parse(frame) else {
            return Out::Drop;
        };
        if !m.src.is_station() {
            return Out::Drop;
        }
        let mut t = self.table.lock().unwrap();
        t.insert(m.src, (in_port, now));
        if m.dst.is_multicast() {
            return Out::Flood;
        }
        match t.get(&m.dst) {
            Some((p, seen)) if now - *seen < std::time::Duration::from_secs(300) => {
                if *p == in_port {
                    Out::Drop
                } else {
                    Out::One(*p)
                }
            }
            _ => Out::Flood,
        }
    }
}

/// A 64-byte IPv4-typed frame `src` -> `dst` (zero payload).
pub fn frame(dst: MacAddr, src: MacAddr) -> Vec<u8> {
    crate::frame::eth(dst, src, 0x0800, &[0; 50])
}

/// A deterministic xorshift generator.
#[derive(Debug)]
pub struct Rng(pub u64);

impl Rng {
    /// The next draw.
    #[allow(
        clippy::should_implement_trait,
        reason = "an endless generator: `Iterator::next`'s Option would only be unwrapped"
    )]
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Station `i` lives on port `i % ports`.
pub fn mac_of(i: u32) -> MacAddr {
    MacAddr::local(i.wrapping_mul(0x9e37_79b9) | 1)
}

/// The deterministic mode of `benches/callgrind.sh`: with `TAPYARD_BENCH_ITERS=N` set, a
/// bench registered through [`bench_batched`] is not handed to criterion (whose iteration
/// count follows the wall clock); the one whose id (`group/name`) equals
/// `TAPYARD_BENCH_ID` runs exactly N iterations inside [`measured`], the function callgrind
/// collects in. The others are skipped (their set-up, outside `measured`, still runs).
pub fn deterministic() -> Option<(u64, String)> {
    let n = std::env::var("TAPYARD_BENCH_ITERS").ok()?;
    let n = n
        .parse()
        .expect("TAPYARD_BENCH_ITERS: a number of iterations");
    Some((n, std::env::var("TAPYARD_BENCH_ID").unwrap_or_default()))
}

/// `g.bench_function(name, |b| b.iter_batched(setup, routine, PerIteration))`, or in the
/// deterministic mode ([`deterministic`]) exactly N rounds of `setup` then `routine` when
/// `group/name` is the selected id.
pub fn bench_batched<I, O>(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    group: &str,
    name: &str,
    mut setup: impl FnMut() -> I,
    mut routine: impl FnMut(I) -> O,
) {
    match deterministic() {
        Some((n, id)) => {
            if id == format!("{group}/{name}") {
                println!("{id}: {n} deterministic iterations");
                measured(n, &mut setup, &mut routine);
            }
        }
        None => {
            g.bench_function(name, |b| {
                b.iter_batched(&mut setup, &mut routine, criterion::BatchSize::PerIteration)
            });
        }
    }
}

/// `n` rounds of `setup` then `routine` (callgrind's `--toggle-collect` target).
#[inline(never)]
pub fn measured<I, O>(n: u64, setup: &mut impl FnMut() -> I, routine: &mut impl FnMut(I) -> O) {
    for _ in 0..n {
        let i = setup();
        std::hint::black_box(routine(i));
    }
}

/// `g.bench_function(id, |b| b.iter(routine))`, or in the deterministic mode
/// ([`deterministic`]) exactly N calls of `routine` when `group/id` is the selected id.
pub fn bench_iter<O>(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    group: &str,
    id: &str,
    mut routine: impl FnMut() -> O,
) {
    match deterministic() {
        Some((n, sel)) => {
            if sel == format!("{group}/{id}") {
                println!("{sel}: {n} deterministic iterations");
                measured(n, &mut || (), &mut |()| routine());
            }
        }
        None => {
            g.bench_function(id, |b| b.iter(&mut routine));
        }
    }
}
