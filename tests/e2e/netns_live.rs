//! A live topology on real TAP devices: pod A's TAP is bridged from the start, pod B's TAP is
//! opened, added to the bridge and given to the running [`Runtime`] afterwards, and a ping
//! then crosses between the two network namespaces. Removing B's port detaches the driver;
//! dropping it closes the TAP, which deletes the device, and A's pings stop being answered.
//!
//! Needs root (TAP devices, namespaces) and `ip`, `ping`; without them the test prints why
//! and passes. Everything it creates carries the process id in its name and is removed by the
//! guard's `Drop`; traffic stays inside its namespaces (10.214.x.0/24).

use crate::common;

use std::sync::Arc;

use crate::common::{run_output, skip, skip_reason, Guard};
use tapyard::port::{Port, TapPort};
use tapyard::runtime::{Runtime, RuntimeConfig};
use tapyard::{BridgeConfig, Datapath, DropReason};

#[test]
#[cfg_attr(
    not(tapyard_root),
    ignore = "needs root: TAP devices and network namespaces (runs as root, as in CI)"
)]
fn a_tap_added_at_run_time_carries_a_ping() {
    if let Some(why) = skip_reason(&[("ping", "-V")]) {
        skip(&why);
        return;
    }
    let pid = std::process::id();
    let tag = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() % 100_000);
    let subnet = 10 + pid % 240;
    let (tap_a, tap_b) = (format!("lv{pid}a"), format!("lv{pid}b"));
    let (addr_a, addr_b) = (format!("10.214.{subnet}.1"), format!("10.214.{subnet}.2"));

    let mut builder = Datapath::builder();
    let br = builder.add_bridge(BridgeConfig::new("br0")).unwrap();
    let id_a = builder.add_port(tap_a.clone(), Some(br)).unwrap();
    let dp = Arc::new(builder.build());
    let mut guard = Guard::default();
    let Some(a) = common::open_tap_or_skip(&tap_a) else {
        return;
    };
    guard.ports.push((id_a, a.clone()));
    let rt = Runtime::start(
        dp.clone(),
        vec![(id_a, a)],
        RuntimeConfig {
            workers: 2,
            ..Default::default()
        },
    )
    .expect("start runtime");
    guard.rt = Some(rt);
    let ns_a = guard.ns(&format!("lv-a-{pid}-{tag}"));
    let ns_b = guard.ns(&format!("lv-b-{pid}-{tag}"));
    ns_a.disable_ipv6();
    ns_b.disable_ipv6();
    ns_a.take_link(&tap_a, Some(&format!("{addr_a}/24")));

    // Pod B arrives while the runtime forwards.
    let id_b = dp.control().add_port(&tap_b, br).expect("add port b");
    let b: Arc<dyn Port> = Arc::new(TapPort::open(&tap_b).expect("open TAP b"));
    guard.ports.push((id_b, b.clone()));
    let rt = guard.rt.as_ref().unwrap();
    rt.add_port(id_b, b).expect("runtime add_port");
    ns_b.take_link(&tap_b, Some(&format!("{addr_b}/24")));
    ns_a.ping_ok(&addr_b);
    ns_b.ping_ok(&addr_a);
    let st = dp.control().stats();
    println!("live: after the pings\n{st}");
    assert!(st.port(&tap_b).unwrap().rx_packets >= 2, "{st}");
    assert!(st.port(&tap_b).unwrap().tx_packets >= 2, "{st}");

    // Pod B goes: the driver is detached, its FDB entries go, and the last Arc closes the TAP.
    let drv = rt.remove_port(id_b).expect("b's driver");
    guard.ports.retain(|(id, _)| *id != id_b);
    assert_eq!(Arc::strong_count(&drv), 1, "no worker holds the TAP");
    assert!(dp
        .control()
        .fdb_dump(br, rt.now())
        .iter()
        .all(|e| e.port != id_b));
    drop(drv);
    let gone = ns_b.ip_output(&["link", "show", "dev", &tap_b]);
    assert!(
        !gone.status.success(),
        "{tap_b} still exists after its fd was closed"
    );
    let out = run_output(&ns_a.exec(&["ping", "-n", "-c", "1", "-W", "1", &addr_b]));
    assert!(!out.status.success(), "a removed pod answered a ping");
    let st = dp.control().stats();
    assert!(st.port(&tap_b).is_none());
    assert_eq!(st.drop_count(DropReason::TxError), 0, "{st}");
    println!("live: after removal\n{st}");
}
