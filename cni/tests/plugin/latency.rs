//! ADD and DEL latency over 200 cycles, printed as p50/p99: tapyard-cni against the fake
//! tapyard (which forks `ip` to make each TAP, so its own service time is printed too), and the
//! reference `bridge` plugin with the same host-local configuration. Ignored by default:
//! `cargo test -p tapyard-cni --release --test plugin latency:: -- --ignored --nocapture`.

use crate::common::*;
use serde_json::json;
use std::process::Command;
use std::time::{Duration, Instant};

const CYCLES: usize = 200;

fn percentiles(mut v: Vec<Duration>) -> String {
    v.sort();
    let at = |p: usize| v[(v.len() * p / 100).min(v.len() - 1)].as_secs_f64() * 1e3;
    format!("p50 {:7.2} ms  p99 {:7.2} ms", at(50), at(99))
}

fn timed(run: impl FnOnce() -> Outcome) -> Duration {
    let start = Instant::now();
    run().ok();
    start.elapsed()
}

#[test]
#[ignore = "a measurement: run with --ignored --nocapture"]
fn add_del_latency() {
    let Some(plugins) = privileged("add_del_latency") else {
        return;
    };

    let (ns, data) = (Netns::new("tycni"), TempDir::new("tapyard-cni-"));
    let tapyard = FakeTapyard::start(&data.0);
    let conf = config("1.0.0", tapyard.socket(), &data.0).to_string();
    let env = Env {
        container_id: unique("bench"),
        netns: ns.path(),
        ifname: "eth0".into(),
        path: plugins.display().to_string(),
    };
    let (mut add, mut del) = (Vec::new(), Vec::new());
    for _ in 0..CYCLES {
        add.push(timed(|| run_plugin(&env.vars("ADD"), &conf)));
        del.push(timed(|| run_plugin(&env.vars("DEL"), &conf)));
    }
    assert!(data.leases().is_empty());
    let served = tapyard.served.lock().unwrap().clone();
    let of = |cmd: &str| {
        served
            .iter()
            .filter(|(c, _)| c == cmd)
            .map(|(_, d)| *d)
            .collect()
    };
    println!("tapyard-cni, {CYCLES} cycles, fake tapyard:");
    println!("  ADD  {}", percentiles(add));
    println!("  DEL  {}", percentiles(del));
    println!(
        "  of which the fake served port_add {}",
        percentiles(of("port_add"))
    );
    println!(
        "  of which the fake served port_del {}",
        percentiles(of("port_del"))
    );

    let bridge = plugins.join("bridge");
    if !bridge.is_file() {
        println!(
            "reference bridge plugin not found in {}: skipped",
            plugins.display()
        );
        return;
    }
    let (ns, data) = (Netns::new("tycni"), TempDir::new("tapyard-cni-"));
    let br = unique("tybr");
    let mut conf = config("1.0.0", "", &data.0);
    conf = json!({ "cniVersion": "1.0.0", "name": "tybench", "type": "bridge", "bridge": br,
                   "mtu": 1500, "ipam": conf["ipam"] });
    let conf = conf.to_string();
    let env = Env {
        netns: ns.path(),
        ..env
    };
    let (mut add, mut del) = (Vec::new(), Vec::new());
    for _ in 0..CYCLES {
        add.push(timed(|| run_exe(&bridge, &env.vars("ADD"), &conf)));
        del.push(timed(|| run_exe(&bridge, &env.vars("DEL"), &conf)));
    }
    let _ = Command::new("ip").args(["link", "del", &br]).status();
    assert!(data.leases().is_empty());
    println!(
        "reference bridge plugin ({}), {CYCLES} cycles:",
        bridge.display()
    );
    println!("  ADD  {}", percentiles(add));
    println!("  DEL  {}", percentiles(del));
}
