//! End-to-end on real TAP devices with busy polling: two namespaces ("pods") bridged by an
//! in-process [`Runtime`] whose workers spin for a window after each frame. Pings flow both
//! ways without loss, the workers go back to sleeping once the traffic stops, and the runtime
//! stops cleanly.
//!
//! Needs root and `ip`; without them the test prints why and passes (under `CI=true` a skip
//! fails). Names carry the process id; everything is removed by the guard, on failure too;
//! traffic only goes to 10.216.x.0/24 inside the test's namespaces.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{name_tag, open_tap, skip, skip_reason, Guard, TapKind};
use tapyard::runtime::{Runtime, RuntimeConfig};

#[test]
#[cfg_attr(
    not(tapyard_root),
    ignore = "needs root: TAP devices and network namespaces (runs as root, as in CI)"
)]
fn busy_polling_bridge_pings_then_goes_idle() {
    if let Some(why) = skip_reason(&[("ping", "-V")]) {
        skip(&why);
        return;
    }
    let (pid, tag) = name_tag();
    let subnet = 10 + pid % 240;
    let (ta, tb) = (format!("tbp{pid}a"), format!("tbp{pid}b"));
    let (dp, ia, ib) = common::two_port_bridge(&ta, &tb);
    let dp = Arc::new(dp);
    let mut guard = Guard::default();
    for (id, name) in [(ia, &ta), (ib, &tb)] {
        let p = open_tap(TapKind::Offload, name).expect("open TAP");
        guard.ports.push((id, Arc::new(p)));
    }
    let rt = Runtime::start(
        dp.clone(),
        guard.ports.clone(),
        RuntimeConfig {
            workers: 2,
            busy_poll: Duration::from_millis(50),
            ..Default::default()
        },
    )
    .expect("start runtime");
    guard.rt = Some(rt);
    let a = guard.ns(&format!("tbp-a-{pid}-{tag}"));
    let bns = guard.ns(&format!("tbp-b-{pid}-{tag}"));
    a.disable_ipv6();
    bns.disable_ipv6();
    let (aa, ab) = (format!("10.216.{subnet}.1"), format!("10.216.{subnet}.2"));
    a.take_link(&ta, Some(&format!("{aa}/24")));
    bns.take_link(&tb, Some(&format!("{ab}/24")));
    a.ping_ok(&ab);
    bns.ping_ok(&aa);
    // A hundred pings 10 ms apart: each inside the previous one's window, all answered.
    let out = common::run_output(&a.exec(&[
        "ping", "-n", "-q", "-c", "100", "-i", "0.01", "-W", "2", &ab,
    ]));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains(" 0% packet loss"),
        "pings lost:\n{text}"
    );
    let rt = guard.rt.as_ref().expect("runtime");
    let deadline = Instant::now() + Duration::from_secs(10);
    while rt.polling_workers() > 0 {
        assert!(
            Instant::now() < deadline,
            "workers still busy polling with no traffic"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    if let Some(rt) = guard.rt.take() {
        rt.stop();
    }
    let st = dp.control().stats();
    assert!(
        st.ports
            .iter()
            .all(|p| p.rx_packets >= 100 && p.tx_packets >= 100),
        "{st}"
    );
}
