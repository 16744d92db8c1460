//! `tap-bridge`: bridges TAP devices in user space until SIGINT or SIGTERM.
//!
//! ```text
//! cargo run --release --example tap-bridge -- [OPTIONS] <TAP>...
//!   --fdb-max N       FDB entry limit (default 8192)
//!   --aging SECS      FDB aging time in seconds (default 300)
//!   --workers N       worker threads (default: one per TAP, at most the CPU count)
//!   --stats-every S   print counters every S seconds (default: only at exit)
//!   --no-offload      plain TAPs: no virtio-net header, no checksum/TSO offload
//!   --busy-poll-us N  busy polling: workers keep reading their TAPs for N µs after the last
//!                     frame before sleeping (default 0: sleep at once; at most 1000000)
//!   --queues N        multi-queue TAPs (IFF_MULTI_QUEUE) with N queues each, spread over the
//!                     workers (default 1: single-queue TAPs; at most 16)
//!   --io MODE         auto (default: io_uring where the kernel offers it), plain (one
//!                     read/write per frame) or uring (batched; fails without io_uring)
//! ```
//! Creates the TAP devices (or attaches to existing ones); move them into namespaces with
//! `ip link set <TAP> netns <ns>` at any time. Exits 0 after a signal, printing per-port
//! counters, drops by reason and the FDB; exits 2 with a one-line error for a bad argument or a
//! TAP that cannot be opened.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tapyard::port::{Port, TapPort};
use tapyard::runtime::{IoMode, Runtime, RuntimeConfig};
use tapyard::{BridgeConfig, Datapath, PortId};

struct Args {
    taps: Vec<String>,
    fdb_max: usize,
    aging: u64,
    workers: Option<usize>,
    stats_every: Option<u64>,
    offload: bool,
    busy_poll_us: u64,
    queues: usize,
    io: IoMode,
}

fn usage() -> &'static str {
    "usage: tap-bridge [--fdb-max N] [--aging SECS] [--workers N] [--stats-every SECS] [--no-offload] [--busy-poll-us N] [--queues N] [--io auto|plain|uring] <TAP>..."
}

fn parse_num<T: std::str::FromStr>(flag: &str, v: Option<String>) -> Result<T, String> {
    let v = v.ok_or_else(|| format!("{flag} needs a value"))?;
    v.parse()
        .map_err(|_| format!("{flag}: {v:?} is not a valid number"))
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        taps: Vec::new(),
        fdb_max: 8192,
        aging: 300,
        workers: None,
        stats_every: None,
        offload: true,
        busy_poll_us: 0,
        queues: 1,
        io: IoMode::Auto,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--fdb-max" => a.fdb_max = parse_num("--fdb-max", it.next())?,
            "--aging" => a.aging = parse_num("--aging", it.next())?,
            "--workers" => a.workers = Some(parse_num("--workers", it.next())?),
            "--stats-every" => a.stats_every = Some(parse_num("--stats-every", it.next())?),
            "--no-offload" => a.offload = false,
            "--queues" => a.queues = parse_num("--queues", it.next())?,
            "--busy-poll-us" => a.busy_poll_us = parse_num("--busy-poll-us", it.next())?,
            "--io" => {
                a.io = match it.next().as_deref() {
                    Some("auto") => IoMode::Auto,
                    Some("plain") => IoMode::Plain,
                    Some("uring") => IoMode::Uring,
                    v => return Err(format!("--io: auto, plain or uring, not {v:?}")),
                }
            }
            "-h" | "--help" => {
                println!("{}", usage());
                std::process::exit(0);
            }
            s if s.starts_with('-') => return Err(format!("unknown option {s:?}; {}", usage())),
            s => a.taps.push(s.to_string()),
        }
    }
    if a.taps.is_empty() {
        return Err(format!("no TAP device named; {}", usage()));
    }
    let most = tapyard::runtime::MAX_BUSY_POLL.as_micros();
    if u128::from(a.busy_poll_us) > most {
        return Err(format!("--busy-poll-us: at most {most}"));
    }
    if a.queues == 0 || a.queues > tapyard::port::MAX_QUEUES {
        return Err(format!(
            "--queues: 1 to {}, not {}",
            tapyard::port::MAX_QUEUES,
            a.queues
        ));
    }
    if a.workers == Some(0) {
        return Err("--workers: must be at least 1".into());
    }
    Ok(a)
}

fn run(a: Args) -> Result<(), String> {
    let mut b = Datapath::builder();
    let mut cfg = BridgeConfig::new("br0");
    cfg.fdb_max_entries = a.fdb_max;
    cfg.aging = Duration::from_secs(a.aging);
    let br = b.add_bridge(cfg).map_err(|e| e.to_string())?;
    let mut ids: Vec<PortId> = Vec::new();
    for t in &a.taps {
        ids.push(b.add_port(t.clone(), Some(br)).map_err(|e| e.to_string())?);
    }
    let dp = Arc::new(b.build());
    let mut ports: Vec<(PortId, Arc<dyn Port>)> = Vec::new();
    for (t, id) in a.taps.iter().zip(&ids) {
        let p = if a.queues > 1 {
            TapPort::open_multi_queue(t, a.queues, a.offload)
        } else if a.offload {
            TapPort::open_offload(t)
        } else {
            TapPort::open(t)
        };
        let p = p.map_err(|e| format!("cannot open TAP {t:?}: {e}"))?;
        ports.push((*id, Arc::new(p)));
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let workers = a.workers.unwrap_or((a.taps.len() * a.queues).min(cpus));
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone()).map_err(|e| format!("signal: {e}"))?;
    }
    let rt = Runtime::start(
        dp.clone(),
        ports,
        RuntimeConfig {
            workers,
            busy_poll: Duration::from_micros(a.busy_poll_us),
            io: a.io,
            ..Default::default()
        },
    )
    .map_err(|e| format!("cannot start workers: {e}"))?;
    if let Some(why) = rt.io_fallback() {
        eprintln!("tap-bridge: {why}");
    }
    eprintln!(
        "tap-bridge: bridging {} with {workers} worker(s), busy polling {} µs, I/O {:?}; SIGINT or SIGTERM to stop",
        a.taps.join(", "),
        a.busy_poll_us,
        rt.io()
    );
    let mut ticks = 0u64;
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(100));
        ticks += 1;
        if let Some(s) = a.stats_every {
            if s > 0 && ticks % (s * 10) == 0 {
                eprint!("{}", dp.control().stats());
            }
        }
    }
    let now = rt.now();
    rt.stop();
    print!("{}", dp.control().stats());
    let mut fdb = String::new();
    let _ = dp.control().fmt_fdb(now, &mut fdb);
    print!("fdb:\n{fdb}");
    Ok(())
}

fn main() -> ExitCode {
    let r = parse_args().and_then(run);
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tap-bridge: {e}");
            ExitCode::from(2)
        }
    }
}
