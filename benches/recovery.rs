//! How long a restarted process takes to get its connection table back: `Conntrack::open_file`
//! of a full 262,144-entry table (every entry live: validate each, rebuild the index, the free
//! stack and the length), beside building a fresh table in anonymous memory
//! (`Conntrack::new`) and a fresh file (`open_file` with no file) in the same run.
//!
//! `cargo bench --bench recovery`
#![allow(
    clippy::cast_possible_truncation,
    reason = "bench fixtures: loop counters narrowed into addresses and ports"
)]

use std::hint::black_box;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use tapyard::conntrack::{tcp::flags, Conntrack, CtConfig, CtTag, Opened, Pkt};
use tapyard::wire::tuple::{L4Kind, Tuple};
use tapyard::Clock;

const ENTRIES: usize = 262_144;

/// A file in /dev/shm (a tmpfs) when there is one, or `TAPYARD_BENCH_SHM`; removed when
/// dropped.
struct TempFile(PathBuf);

impl TempFile {
    fn new(tag: &str) -> TempFile {
        // TAPYARD_BENCH_SHM: another directory, e.g. a tmpfs mounted with huge=always.
        let dir = std::env::var_os("TAPYARD_BENCH_SHM")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| std::path::PathBuf::from("/dev/shm"));
        let dir = if dir.is_dir() {
            dir
        } else {
            std::env::temp_dir()
        };
        let p = dir.join(format!(
            "tapyard-bench-recovery-{tag}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&p);
        TempFile(p)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn cfg() -> CtConfig {
    CtConfig {
        max_entries: ENTRIES,
        ..CtConfig::default()
    }
}

fn recovery(c: &mut Criterion) {
    let mut g = c.benchmark_group("conntrack_recovery");
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(5));
    // A full table: 262,144 TCP connections, DNAT'd.
    let full = TempFile::new("full");
    let now = Clock::new().now();
    {
        let (ct, _) = Conntrack::open_file(cfg(), &full.0, now).unwrap();
        let syn = Pkt {
            kind: L4Kind::Tcp,
            tcp_flags: flags::SYN,
            len: 60,
        };
        for k in 0..ENTRIES as u32 {
            let orig = Tuple {
                src: Ipv4Addr::from(0x0af4_0000 | (k & 0xffff)),
                dst: Ipv4Addr::new(10, 96, 0, 10),
                sport: 10_000 + (k >> 16) as u16,
                dport: 80,
                proto: 6,
                zone: 0,
            };
            let reply = Tuple {
                src: Ipv4Addr::new(10, 244, 2, (k % 200) as u8 + 1),
                sport: 8080,
                ..orig.invert()
            };
            ct.insert(orig, reply, CtTag::default(), &syn, now).unwrap();
        }
        assert_eq!(ct.len(), ENTRIES);
    }
    g.bench_function("open_file_full_262144", |b| {
        b.iter(|| {
            let (ct, rec) = Conntrack::open_file(cfg(), &full.0, Clock::new().now()).unwrap();
            assert_eq!((rec.opened, rec.kept), (Opened::Reused, ENTRIES));
            black_box(ct.len())
        })
    });
    g.bench_function("new_anonymous_262144", |b| {
        b.iter(|| black_box(Conntrack::new(cfg()).unwrap().len()))
    });
    let fresh = TempFile::new("fresh");
    g.bench_function("open_file_fresh_262144", |b| {
        b.iter(|| {
            let _ = std::fs::remove_file(&fresh.0);
            let (ct, rec) = Conntrack::open_file(cfg(), &fresh.0, Clock::new().now()).unwrap();
            assert_eq!(rec.opened, Opened::Created);
            black_box(ct.len())
        })
    });
    g.finish();
}

criterion_group!(benches, recovery);
criterion_main!(benches);
