//! Helpers of the library's test binaries (`datapath`, `e2e`) over the shared test kit
//! (`tapyard-testkit`: skips, commands, namespaces, the cleanup [`Guard`], in-memory nodes):
//! TAP ports, the drop check and reading frames from a TAP.
//!
//! Root tests: a test that needs root (TAP devices, network namespaces) carries
//! `#[cfg_attr(not(tapyard_root), ignore = "needs root: ...")]`. The package's `build.rs` sets
//! `cfg(tapyard_root)` when the build runs as root (effective uid 0, unless
//! `TAPYARD_TEST_AS_USER=1`), so a user's `cargo test` lists these tests as `ignored` instead
//! of reporting `ok` for a test that did not run; as root (and in CI) they run. Running, they
//! still check for the tools they need: a missing one skips the test saying why, or fails it
//! under `CI=true`.
#![allow(dead_code, unused_imports)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use tapyard::port::{Port, TapPort};
use tapyard::PortId;

pub use tapyard_testkit::{
    have, name_tag, run, run_output, send_one, skip, Guard, Ns, CMD_TIMEOUT,
};

/// Why this machine cannot run the root tests, if it cannot; `tools` are extra commands
/// (with an argument that makes them print their version) the test needs.
pub fn skip_reason(tools: &[(&str, &str)]) -> Option<String> {
    tapyard_testkit::missing(tools)
}

/// An IPv4 static route to `dst/len` ([`tapyard_testkit::route`]).
pub fn route(dst: &str, len: u8, next_hop: tapyard::l3::NextHop) -> tapyard::l3::Route {
    tapyard_testkit::route(dst, len, next_hop)
}

/// How a test opens its TAP ports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TapKind {
    /// No virtio-net header: the kernel segments and checksums.
    Plain,
    /// Virtio-net header, checksum and TSO offloads (the production default).
    Offload,
}

/// Opens TAP `name` as `kind`.
pub fn open_tap(kind: TapKind, name: &str) -> std::io::Result<TapPort> {
    match kind {
        TapKind::Plain => TapPort::open(name),
        TapKind::Offload => TapPort::open_offload(name),
    }
}

/// Opens each `(port id, TAP name, kind)` into `guard.ports` and starts a runtime with
/// two workers on them, kept in `guard.rt` (stopped on drop). `false`, having said why the
/// test skips, when this process may not create TAP devices; any other error panics.
pub fn attach_taps(
    guard: &mut Guard,
    dp: &Arc<tapyard::Datapath>,
    taps: &[(PortId, &str, TapKind)],
) -> bool {
    for &(id, tap, kind) in taps {
        match open_tap(kind, tap) {
            Ok(p) => guard.ports.push((id, Arc::new(p))),
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                skip(&format!(
                    "skipping: cannot create TAP {tap} ({e}): no CAP_NET_ADMIN"
                ));
                return false;
            }
            Err(e) => panic!("cannot open TAP {tap}: {e}"),
        }
    }
    let rt = tapyard::runtime::Runtime::start(
        dp.clone(),
        guard.ports.clone(),
        tapyard::runtime::RuntimeConfig {
            workers: 2,
            ..Default::default()
        },
    )
    .expect("start runtime");
    guard.rt = Some(rt);
    true
}

/// A datapath with one bridge, `br0`, holding ports `a` and `b`: the datapath and the ports'
/// ids.
pub fn two_port_bridge(a: &str, b: &str) -> (tapyard::Datapath, PortId, PortId) {
    let mut builder = tapyard::Datapath::builder();
    let br = builder
        .add_bridge(tapyard::BridgeConfig::new("br0"))
        .unwrap();
    let ia = builder.add_port(a.to_owned(), Some(br)).unwrap();
    let ib = builder.add_port(b.to_owned(), Some(br)).unwrap();
    (builder.build(), ia, ib)
}

/// Opens (plain) TAP `name`; `None`, having said why the test skips, when this process may
/// not create TAP devices. Any other error panics.
pub fn open_tap_or_skip(name: &str) -> Option<Arc<dyn Port>> {
    match TapPort::open(name) {
        Ok(p) => Some(Arc::new(p)),
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            skip(&format!("skipping: cannot create TAP {name} ({e})"));
            None
        }
        Err(e) => panic!("cannot open TAP {name}: {e}"),
    }
}

/// Frames flooded towards a TAP before its interface is up are refused (`EIO`, counted as
/// `tx_link_down`): IPv6 router solicitations, MLD reports and the like. Allow a few of them.
pub const MAX_EARLY_LINK_DOWN: u64 = 50;

/// Panics, printing the counters, if any of `reasons` counted a drop, if a transmit failed
/// with an error, or if more frames met a link not up than the few expected before the links
/// came up.
pub fn assert_no_drops(st: &tapyard::StatsSnapshot, reasons: &[tapyard::DropReason]) {
    for &r in reasons {
        assert_eq!(st.drop_count(r), 0, "unexpected {r} drops:\n{st}");
    }
    let tx_err = st.drop_count(tapyard::DropReason::TxError);
    assert_eq!(tx_err, 0, "transmit errors:\n{st}");
    let down = st.drop_count(tapyard::DropReason::TxLinkDown);
    assert!(
        down <= MAX_EARLY_LINK_DOWN,
        "{down} frames to links not up (more than the few expected before the links came up):\n{st}"
    );
}

/// Reads frames from `tap` for up to two seconds, until `done` says it has them all.
pub fn read_until(
    tap: &TapPort,
    pool: &mut tapyard::BufPool,
    done: &mut dyn FnMut(&tapyard::PacketBuf) -> bool,
) -> bool {
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        let mut batch = tapyard::Batch::new();
        match tap.recv_batch(pool, &mut batch) {
            Ok(0) | Err(_) => std::thread::sleep(Duration::from_millis(5)),
            Ok(_) => {
                let hit = batch.bufs().iter().any(&mut *done);
                batch.recycle(pool);
                if hit {
                    return true;
                }
            }
        }
    }
    false
}

/// A copy of `b` (frame and offload header) in a buffer of its own, with room for any
/// super-frame.
pub fn copy_buf(b: &tapyard::PacketBuf) -> tapyard::PacketBuf {
    let mut c = tapyard::PacketBuf::new(70_000);
    c.room_mut()[..b.len()].copy_from_slice(b.frame());
    c.set_len(b.len());
    c.offload = b.offload;
    c
}
