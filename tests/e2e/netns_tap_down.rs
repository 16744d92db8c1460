//! Frames to a TAP whose interface is not up yet (a pod not started: the normal state of a
//! node's ports at start) are counted as `tx_link_down`, not as transmit errors: the kernel
//! refuses them with `EIO`, as Linux's bridge sends nothing to a port whose link is down.
//! Once the link is up the same port carries traffic and nothing more is refused.
//!
//! Needs root (TAP devices, namespaces) and `ip`, `ping`; without them the test prints why
//! and passes (under `CI=true` it fails). Everything it creates carries the process id in its
//! name and is removed by the guard's `Drop`; traffic stays inside its namespaces
//! (10.215.x.0/24).

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{run_output, skip, skip_reason, Guard};
use tapyard::port::Port;
use tapyard::runtime::{Runtime, RuntimeConfig};
use tapyard::DropReason;

#[test]
#[cfg_attr(
    not(tapyard_root),
    ignore = "needs root: TAP devices and network namespaces (runs as root, as in CI)"
)]
fn frames_to_a_tap_not_up_yet_are_link_down_not_errors() {
    if let Some(why) = skip_reason(&[("ping", "-V")]) {
        skip(&why);
        return;
    }
    let (pid, tag) = common::name_tag();
    let subnet = 10 + pid % 240;
    let (tap_a, tap_b) = (format!("ld{pid}a"), format!("ld{pid}b"));
    let (addr_a, addr_b) = (format!("10.215.{subnet}.1"), format!("10.215.{subnet}.2"));

    let (dp, id_a, id_b) = common::two_port_bridge(&tap_a, &tap_b);
    let dp = Arc::new(dp);
    let mut guard = Guard::default();
    let mut ports: Vec<(tapyard::PortId, Arc<dyn Port>)> = Vec::new();
    for (id, name) in [(id_a, &tap_a), (id_b, &tap_b)] {
        let Some(p) = common::open_tap_or_skip(name) else {
            return;
        };
        guard.ports.push((id, p.clone()));
        ports.push((id, p));
    }
    guard.rt = Some(
        Runtime::start(
            dp.clone(),
            ports,
            RuntimeConfig {
                workers: 1,
                ..Default::default()
            },
        )
        .expect("start runtime"),
    );
    let ns_a = guard.ns(&format!("ld-a-{pid}-{tag}"));
    let ns_b = guard.ns(&format!("ld-b-{pid}-{tag}"));
    ns_a.disable_ipv6();
    ns_b.disable_ipv6();
    ns_a.take_link(&tap_a, Some(&format!("{addr_a}/24")));
    // Pod B's TAP is in its namespace with its address, but not up yet.
    run_output(&["ip", "link", "set", &tap_b, "netns", &ns_b.name]);
    ns_b.ip(&["addr", "add", &format!("{addr_b}/24"), "dev", &tap_b]);

    // A's ARP requests for B are flooded to B's TAP, which refuses them.
    let out = run_output(&ns_a.exec(&["ping", "-n", "-c", "2", "-i", "0.2", "-W", "1", &addr_b]));
    assert!(!out.status.success(), "B answered while its link was down");
    let deadline = Instant::now() + Duration::from_secs(5);
    let st = loop {
        let st = dp.control().stats();
        if st.drop_count(DropReason::TxLinkDown) > 0 || Instant::now() > deadline {
            break st;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(st.drop_count(DropReason::TxLinkDown) > 0, "{st}");
    assert_eq!(
        st.drop_count(DropReason::TxError),
        0,
        "no transmit error: {st}"
    );
    let b = st.port(&tap_b).unwrap();
    assert_eq!(b.tx_dropped, st.drop_count(DropReason::TxLinkDown), "{st}");
    let early = st.drop_count(DropReason::TxLinkDown);

    // Once B's link is up, the same port carries the ping and nothing more is refused.
    ns_b.ip(&["link", "set", &tap_b, "up"]);
    ns_a.ping_ok(&addr_b);
    let st = dp.control().stats();
    assert_eq!(st.drop_count(DropReason::TxLinkDown), early, "{st}");
    assert_eq!(st.drop_count(DropReason::TxError), 0, "{st}");
    println!("{st}");
}
