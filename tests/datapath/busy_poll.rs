//! Without root: a runtime with busy polling forwards every frame between in-memory ports,
//! spins only while traffic flows and goes back to sleeping when it stops; an over-long
//! window is refused.

use std::time::{Duration, Instant};

use tapyard::runtime::{Runtime, RuntimeConfig, MAX_BUSY_POLL};
use tapyard::MacAddr;
use tapyard_testkit::frame::seq_frame as frame;
use tapyard_testkit::{eventually, mem_bridge};

#[test]
fn a_polling_runtime_forwards_in_order_and_goes_idle() {
    const N: u32 = 5000;
    let (dp, ports, hosts) = mem_bridge(2, 4096);
    let rt = Runtime::start(
        dp.clone(),
        ports,
        RuntimeConfig {
            workers: 2,
            busy_poll: Duration::from_millis(200),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(rt.polling_workers(), 0, "no traffic yet, nobody spins");
    let (m0, m1) = (MacAddr::local(1), MacAddr::local(2));
    hosts[1]
        .send_frame(&frame(MacAddr::BROADCAST, m1, 0))
        .unwrap();
    assert!(eventually(Duration::from_secs(10), || hosts[0]
        .recv_frame()
        .is_some()));
    let mut sent = 0;
    let mut got = 0u32;
    let mut spun = false;
    let deadline = Instant::now() + Duration::from_secs(20);
    while got < N {
        assert!(Instant::now() < deadline, "stalled at {got} of {N}");
        while sent < N && sent < got + 500 && hosts[0].send_frame(&frame(m1, m0, sent)).is_ok() {
            sent += 1;
        }
        while let Some(b) = hosts[1].recv_frame() {
            let f = b.frame();
            assert_eq!(&f[14..18], &got.to_be_bytes(), "out of order");
            got += 1;
            hosts[1].recycle(b);
        }
        spun |= rt.polling_workers() > 0;
        std::thread::yield_now();
    }
    assert!(
        spun,
        "no worker was ever in its busy-poll window while frames flowed"
    );
    // No more frames: the window passes and every worker sleeps again.
    assert!(
        eventually(Duration::from_secs(10), || rt.polling_workers() == 0),
        "workers still spinning with no traffic"
    );
    rt.stop();
    let st = dp.control().stats();
    assert!(st.drops.iter().all(|&(_, n)| n == 0), "{st}");
}

#[test]
fn a_too_long_window_is_refused() {
    let (dp, ports, _hosts) = mem_bridge(2, 4096);
    let e = Runtime::start(
        dp,
        ports,
        RuntimeConfig {
            busy_poll: MAX_BUSY_POLL + Duration::from_micros(1),
            ..Default::default()
        },
    )
    .unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
    assert!(e.to_string().contains("busy poll window"), "{e}");
}
