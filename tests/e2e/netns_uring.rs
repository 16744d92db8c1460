//! End-to-end on real TAP devices with both I/O modes of the runtime: two namespaces
//! ("pods") bridged by an in-process [`Runtime`] reading and writing the TAPs through
//! io_uring ([`IoMode::Uring`]) and through plain `read`/`write` ([`IoMode::Plain`]), with
//! plain and offload TAPs. Pings flow both ways without loss, bursts of frames (that fill
//! whole batches) and a TCP transfer cross, the ring is still in use at the end (no worker
//! fell back), and the runtime stops cleanly; a paused runtime reads nothing.
//!
//! Needs root and `ip`; without them the test prints why and passes (under `CI=true` a skip
//! fails). Names carry the process id; everything is removed by the guard, on failure too;
//! traffic only goes to 10.217.x.0/24 inside the test's namespaces.

use crate::common;

use std::sync::Arc;

use crate::common::{name_tag, open_tap, skip, skip_reason, Guard, TapKind};
use tapyard::runtime::{IoMode, Runtime, RuntimeConfig};
use tapyard::Datapath;

fn bridge_in(io: IoMode, kind: TapKind, n: u32) {
    let (pid, tag) = name_tag();
    let subnet = (10 + pid % 50) * 4 + n; // at most 239 + n: an octet
    let (ta, tb) = (format!("tur{pid}a{n}"), format!("tur{pid}b{n}"));
    let (dp, ia, ib) = common::two_port_bridge(&ta, &tb);
    let dp = Arc::new(dp);
    let mut guard = Guard::default();
    for (id, name) in [(ia, &ta), (ib, &tb)] {
        let p = open_tap(kind, name).expect("open TAP");
        guard.ports.push((id, Arc::new(p)));
    }
    let rt = Runtime::start(
        dp.clone(),
        guard.ports.clone(),
        RuntimeConfig {
            workers: 2,
            io,
            ..Default::default()
        },
    )
    .expect("start runtime");
    assert_eq!(rt.io(), io, "{:?}", rt.io_fallback());
    guard.rt = Some(rt);
    let a = guard.ns(&format!("tur-a{n}-{pid}-{tag}"));
    let bns = guard.ns(&format!("tur-b{n}-{pid}-{tag}"));
    a.disable_ipv6();
    bns.disable_ipv6();
    let (aa, ab) = (format!("10.217.{subnet}.1"), format!("10.217.{subnet}.2"));
    a.take_link(&ta, Some(&format!("{aa}/24")));
    bns.take_link(&tb, Some(&format!("{ab}/24")));
    a.ping_ok(&ab);
    bns.ping_ok(&aa);
    // Bursts: 64 echo requests in flight at once, so the runtime reads and writes whole
    // batches; every one answered.
    let out = common::run_output(&a.exec(&[
        "ping", "-n", "-q", "-c", "640", "-l", "64", "-i", "0.01", "-W", "2", &ab,
    ]));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains(" 0% packet loss"),
        "{io:?} {kind:?}: pings lost:\n{text}"
    );
    // Large frames (fragmented pings of 8000 bytes: 6 frames each) cross too.
    let out = common::run_output(&a.exec(&[
        "ping", "-n", "-q", "-c", "50", "-s", "8000", "-i", "0.01", "-W", "2", &ab,
    ]));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains(" 0% packet loss"),
        "{io:?} {kind:?}: large pings lost:\n{text}"
    );
    let rt = guard.rt.as_ref().expect("runtime");
    let want = if io == IoMode::Uring { 2 } else { 0 };
    assert_eq!(
        rt.uring_workers(),
        want,
        "{io:?} {kind:?}: a worker left io_uring: {:?}",
        rt.io_fallback()
    );
    // Paused, nothing is read: a ping goes unanswered; resumed, pings flow again.
    rt.pause();
    let rx0: u64 = dp
        .control()
        .stats()
        .ports
        .iter()
        .map(|p| p.rx_packets)
        .sum();
    let out = common::run_output(&a.exec(&["ping", "-n", "-q", "-c", "2", "-W", "1", &ab]));
    assert!(
        !out.status.success(),
        "{io:?} {kind:?}: answered while paused"
    );
    let rx1: u64 = dp
        .control()
        .stats()
        .ports
        .iter()
        .map(|p| p.rx_packets)
        .sum();
    assert_eq!(rx0, rx1, "{io:?} {kind:?}: frames read while paused");
    rt.resume();
    a.ping_ok(&ab);
    if let Some(rt) = guard.rt.take() {
        rt.stop();
    }
    let st = dp.control().stats();
    assert!(
        st.ports
            .iter()
            .all(|p| p.rx_packets >= 900 && p.tx_packets >= 900),
        "{io:?} {kind:?}: {st}"
    );
}

#[test]
#[cfg_attr(
    not(tapyard_root),
    ignore = "needs root: TAP devices and network namespaces (runs as root, as in CI)"
)]
fn uring_and_plain_io_bridge_pods() {
    if let Some(why) = skip_reason(&[("ping", "-V")]) {
        skip(&why);
        return;
    }
    if let Err(e) = probe_uring() {
        // A kernel without io_uring (or with it disabled): `Uring` is refused, `Auto` falls
        // back to the plain path and says why, and the plain path is tested alone.
        eprintln!("io_uring unavailable here ({e}): testing the plain path and the fallback");
        let rt = Runtime::start(
            Arc::new(Datapath::builder().build()),
            Vec::new(),
            RuntimeConfig::default(),
        )
        .expect("Auto starts without io_uring");
        assert_eq!(rt.io(), IoMode::Plain);
        assert!(rt.io_fallback().is_some());
        rt.stop();
        bridge_in(IoMode::Plain, TapKind::Offload, 0);
        return;
    }
    let mut n = 0;
    for io in [IoMode::Uring, IoMode::Plain] {
        for kind in [TapKind::Plain, TapKind::Offload] {
            bridge_in(io, kind, n);
            n += 1;
        }
    }
}

/// Whether a runtime can start with io_uring here.
fn probe_uring() -> Result<(), String> {
    let dp = Arc::new(Datapath::builder().build());
    Runtime::start(
        dp,
        Vec::new(),
        RuntimeConfig {
            io: IoMode::Uring,
            ..Default::default()
        },
    )
    .map(|rt| rt.stop())
    .map_err(|e| e.to_string())
}
