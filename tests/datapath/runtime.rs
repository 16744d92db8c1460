//! Without root: the threaded runtime moves frames between in-memory ports with two workers and
//! stops cleanly, every frame accounted for; ports added and removed while it runs.
#![allow(
    clippy::cast_possible_truncation,
    reason = "test fixtures: small loop counters and random draws narrowed into addresses, ports and ids"
)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use tapyard::port::{mem_pair, MemPort, Port};
use tapyard::runtime::{Runtime, RuntimeConfig};
use tapyard::{BridgeConfig, Datapath, MacAddr, PortId};
use tapyard_testkit::frame::seq_frame as frame;
use tapyard_testkit::{eventually, mem_bridge};

#[test]
fn two_workers_forward_everything_then_stop() {
    const N: u32 = 20_000;
    let (dp, ports, hosts) = mem_bridge(4, 4096);
    let rt = Runtime::start(
        dp.clone(),
        ports,
        RuntimeConfig {
            workers: 2,
            ..Default::default()
        },
    )
    .unwrap();
    let mac = |i: usize| MacAddr::local(i as u32 + 1);
    // Every host announces itself so the bridge learns it.
    for (i, h) in hosts.iter().enumerate() {
        h.send_frame(&frame(MacAddr::BROADCAST, mac(i), 0)).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while dp.control().stats().flooded < 4 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    for h in &hosts {
        while let Some(b) = h.recv_frame() {
            h.recycle(b);
        }
    }
    // Host i sends N frames to host (i + 1) % 4; receivers check order and count.
    let mut next = [0u32; 4];
    let mut sent = [0u32; 4];
    while next.iter().any(|&n| n < N) {
        assert!(Instant::now() < deadline, "stalled: received {next:?}");
        for i in 0..4 {
            while sent[i] < N && sent[i] < next[(i + 1) % 4] + 1000 {
                let f = frame(mac((i + 1) % 4), mac(i), sent[i]);
                if hosts[i].send_frame(&f).is_err() {
                    break;
                }
                sent[i] += 1;
            }
        }
        for (j, h) in hosts.iter().enumerate() {
            while let Some(b) = h.recv_frame() {
                let f = b.frame();
                assert_eq!(
                    &f[6..12],
                    &mac((j + 3) % 4).0,
                    "only the neighbour sends to {j}"
                );
                let seq = u32::from_be_bytes([f[14], f[15], f[16], f[17]]);
                assert_eq!(seq, next[j], "frames of one flow stay in order");
                next[j] += 1;
                h.recycle(b);
            }
        }
        std::thread::yield_now();
    }
    let t = Instant::now();
    rt.stop();
    assert!(t.elapsed() < Duration::from_secs(2), "stop is prompt");
    let s = dp.control().stats();
    assert_eq!(s.forwarded, 4 * u64::from(N), "{s}");
    assert_eq!(s.rx_drops(), 0, "{s}");
    for p in &s.ports {
        assert_eq!(p.rx_packets, u64::from(N) + 1);
        assert_eq!(p.tx_packets, u64::from(N) + 3);
    }
}

/// Sends `frame` from `h` until the queue takes it (the datapath drains it).
fn send_all(h: &MemPort, f: &[u8], deadline: Instant) {
    while h.send_frame(f).is_err() {
        assert!(Instant::now() < deadline, "stalled sending");
        std::thread::yield_now();
    }
}

/// Two workers forward frames between two stable ports (both ways, one in eight flooded)
/// while a third thread adds and removes ports 1000 times, at most three alive at once, each
/// of them sending a broadcast. On the stable pair no frame is lost, duplicated, reordered or
/// misdirected; no frame reaches a removed port after `remove_port` returned; a removed
/// port's FDB entries are gone and its driver is the last reference; at the end the topology,
/// the FDB and the ids are back where they started.
#[test]
fn ports_come_and_go_while_a_stable_pair_forwards() {
    const N: u32 = 20_000;
    const CHURN: usize = 1000;
    let mut b = Datapath::builder();
    let br = b.add_bridge(BridgeConfig::new("br0")).unwrap();
    let s = [
        b.add_port("s0", Some(br)).unwrap(),
        b.add_port("s1", Some(br)).unwrap(),
    ];
    let (a0, h0) = mem_pair("s0", "h0", 4096);
    let (a1, h1) = mem_pair("s1", "h1", 4096);
    let dp = Arc::new(b.build());
    let rt = Arc::new(
        Runtime::start(
            dp.clone(),
            vec![(s[0], Arc::new(a0) as Arc<dyn Port>), (s[1], Arc::new(a1))],
            RuntimeConfig {
                workers: 2,
                ..Default::default()
            },
        )
        .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let hosts = [h0, h1];
    let mac = |i: usize| MacAddr::local(i as u32 + 1);
    for (i, h) in hosts.iter().enumerate() {
        send_all(h, &frame(MacAddr::BROADCAST, mac(i), u32::MAX), deadline);
    }
    while dp.control().stats().flooded < 2 {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(1));
    }
    for h in &hosts {
        while let Some(b) = h.recv_frame() {
            h.recycle(b);
        }
    }
    let churn = {
        let (dp, rt) = (dp.clone(), rt.clone());
        std::thread::spawn(move || {
            let mut live: std::collections::VecDeque<(PortId, MemPort)> = Default::default();
            let mut gone: Vec<MemPort> = Vec::new();
            let mut max_id = 0u16;
            for i in 0..CHURN {
                let id = dp.control().add_port(&format!("c{}", i % 8), br).unwrap();
                max_id = max_id.max(id.0);
                let (a, h) = mem_pair(&format!("c{i}"), "hc", 256);
                rt.add_port(id, Arc::new(a)).unwrap();
                let _ = h.send_frame(&frame(
                    MacAddr::BROADCAST,
                    MacAddr::local(1000 + i as u32),
                    0,
                ));
                live.push_back((id, h));
                if live.len() > 3 || i + 1 == CHURN {
                    while let Some((id, h)) = live.pop_front() {
                        let drv = rt.remove_port(id).expect("a driver");
                        assert_eq!(Arc::strong_count(&drv), 1, "no worker holds port {}", id.0);
                        assert!(dp
                            .control()
                            .fdb_dump(br, rt.now())
                            .iter()
                            .all(|e| e.port != id));
                        assert_eq!(dp.control().port_name(id), None);
                        drop(drv);
                        while let Some(b) = h.recv_frame() {
                            h.recycle(b);
                        }
                        gone.push(h);
                        if i + 1 != CHURN {
                            break;
                        }
                    }
                }
            }
            (gone, max_id)
        })
    };
    // The stable pair: host i sends N frames to host 1 - i (every eighth broadcast).
    let mut next = [0u32; 2];
    let mut sent = [0u32; 2];
    let mut foreign = [0u64; 2];
    while next.iter().any(|&n| n < N) {
        assert!(Instant::now() < deadline, "stalled: received {next:?}");
        for i in 0..2 {
            while sent[i] < N && sent[i] < next[1 - i] + 1000 {
                let dst = if sent[i] % 8 == 7 {
                    MacAddr::BROADCAST
                } else {
                    mac(1 - i)
                };
                if hosts[i].send_frame(&frame(dst, mac(i), sent[i])).is_err() {
                    break;
                }
                sent[i] += 1;
            }
        }
        for (j, h) in hosts.iter().enumerate() {
            while let Some(b) = h.recv_frame() {
                let f = b.frame();
                assert_ne!(&f[6..12], &mac(j).0, "nothing comes back to {j}");
                if f[6..12] == mac(1 - j).0 {
                    let seq = u32::from_be_bytes([f[14], f[15], f[16], f[17]]);
                    assert_eq!(seq, next[j], "no loss, no reordering on the stable pair");
                    next[j] += 1;
                } else {
                    foreign[j] += 1; // a churn port's broadcast
                }
                h.recycle(b);
            }
        }
        std::thread::yield_now();
    }
    let (gone, max_id) = churn.join().unwrap();
    // Whatever the stable pair still floods goes to nobody else now.
    std::thread::sleep(Duration::from_millis(20));
    for h in &gone {
        assert_eq!(h.pending(), 0, "a frame reached a removed port");
    }
    let rt = Arc::try_unwrap(rt).unwrap();
    let now = rt.now();
    rt.stop();
    let st = dp.control().stats();
    assert_eq!(st.port("s0").unwrap().rx_packets, u64::from(N) + 1, "{st}");
    assert_eq!(st.port("s1").unwrap().rx_packets, u64::from(N) + 1, "{st}");
    assert_eq!(st.port("s0").unwrap().tx_dropped, 0, "{st}");
    assert_eq!(st.port("s1").unwrap().tx_dropped, 0, "{st}");
    assert_eq!(dp.control().port_count(), 2);
    assert_eq!(dp.control().port_ids(), s.to_vec());
    assert_eq!(dp.control().bridge(br).unwrap().ports(), s.to_vec());
    assert_eq!(
        dp.control().reclaim_ports(),
        0,
        "every quarantine ends once the workers are gone"
    );
    let fdb = dp.control().fdb_dump(br, now);
    assert!(fdb.iter().all(|e| s.contains(&e.port)), "{fdb:?}");
    assert!(
        usize::from(max_id) < 2 + 3 + 16,
        "ids are reused: the highest of {CHURN} adds was {max_id}"
    );
    println!(
        "churn: {CHURN} adds/removes, highest id {max_id}, foreign broadcasts seen {foreign:?}, \
         port_gone {}",
        st.drop_count(tapyard::DropReason::PortGone)
    );
}

/// A port added after the runtime started is received from within milliseconds (bounded at
/// a generous 2 s here; the time is printed), and nothing is received from it after removal.
#[test]
fn a_port_added_at_run_time_is_received_from_promptly() {
    let mut b = Datapath::builder();
    let br = b.add_bridge(BridgeConfig::new("br0")).unwrap();
    let s0 = b.add_port("s0", Some(br)).unwrap();
    let (a0, h0) = mem_pair("s0", "h0", 64);
    let dp = Arc::new(b.build());
    let rt = Runtime::start(
        dp.clone(),
        vec![(s0, Arc::new(a0) as Arc<dyn Port>)],
        RuntimeConfig {
            workers: 2,
            ..Default::default()
        },
    )
    .unwrap();
    // Let the workers go to sleep first.
    std::thread::sleep(Duration::from_millis(20));
    let q = dp.control().add_port("late", br).unwrap();
    let (a, h) = mem_pair("late", "hl", 64);
    let t = Instant::now();
    rt.add_port(q, Arc::new(a)).unwrap();
    assert_eq!(
        rt.add_port(q, Arc::new(mem_pair("x", "y", 1).0))
            .unwrap_err()
            .kind(),
        std::io::ErrorKind::AlreadyExists
    );
    h.send_frame(&frame(MacAddr::BROADCAST, MacAddr::local(9), 1))
        .unwrap();
    let got = loop {
        if let Some(b) = h0.recv_frame() {
            break b;
        }
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "the new port is never received from"
        );
        std::thread::sleep(Duration::from_micros(100));
    };
    println!(
        "first frame from a port added at run time after {:?}",
        t.elapsed()
    );
    assert_eq!(&got.frame()[6..12], &MacAddr::local(9).0);
    let drv = rt.remove_port(q).unwrap();
    assert_eq!(Arc::strong_count(&drv), 1);
    assert!(rt.remove_port(q).is_none());
    h.send_frame(&frame(MacAddr::BROADCAST, MacAddr::local(9), 2))
        .unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert!(h0.recv_frame().is_none(), "received from a removed port");
    assert_eq!(h.pending(), 0);
    assert_eq!(dp.control().stats().port("s0").unwrap().tx_packets, 1);
    // An id the datapath does not have as a port is refused.
    assert!(rt.add_port(q, Arc::new(mem_pair("z", "w", 1).0)).is_err());
    rt.stop();
}

/// A port a runtime drives cannot be removed behind its back (its id would go to a new port
/// while the old driver still speaks for it); removed through the runtime, its id is free
/// again when `remove_port` returns, even at capacity and with traffic flowing.
#[test]
fn a_driven_port_is_removed_through_its_runtime_and_its_id_is_free_at_once() {
    let mut b = Datapath::builder();
    b.max_ports(3).unwrap();
    let br = b.add_bridge(BridgeConfig::new("br0")).unwrap();
    let s0 = b.add_port("s0", Some(br)).unwrap();
    let s1 = b.add_port("s1", Some(br)).unwrap();
    let dp = Arc::new(b.build());
    let (a0, h0) = mem_pair("s0", "h0", 256);
    let (a1, h1) = mem_pair("s1", "h1", 256);
    let ports: Vec<(PortId, Arc<dyn Port>)> = vec![(s0, Arc::new(a0)), (s1, Arc::new(a1))];
    let cfg = RuntimeConfig {
        workers: 2,
        ..RuntimeConfig::default()
    };
    let rt = Runtime::start(dp.clone(), ports, cfg).unwrap();
    let (m0, m1) = (MacAddr::local(0x100), MacAddr::local(0x101));
    let x = dp.control().add_port("x", br).unwrap();
    let (ax, hx) = mem_pair("x", "hx", 64);
    rt.add_port(x, Arc::new(ax)).unwrap();
    let err = dp.control().remove_port(x).unwrap_err();
    assert!(
        matches!(err, tapyard::ConfigError::Attached { .. }),
        "a driven port refuses a removal behind its runtime's back: {err:?}"
    );
    for round in 0..50u32 {
        // Traffic keeps both workers busy while the port at capacity comes and goes.
        let _ = h0.send_frame(&frame(m1, m0, round));
        let _ = h1.send_frame(&frame(m0, m1, round));
        let id = dp
            .control()
            .port_by_name(&format!("p{}", round.wrapping_sub(1)))
            .unwrap_or(x);
        assert!(rt.remove_port(id).is_some(), "round {round}");
        let p = dp
            .control()
            .add_port(&format!("p{round}"), br)
            .unwrap_or_else(|e| panic!("round {round}: the freed id is not reusable: {e}"));
        assert_eq!(p, x, "the only id below capacity is reused");
        let (ap, _hp) = mem_pair("p", "hp", 64);
        rt.add_port(p, Arc::new(ap)).unwrap();
    }
    // The old driver of `x` speaks no more for anyone.
    let ghost = MacAddr::local(0x777);
    let _ = hx.send_frame(&frame(MacAddr::BROADCAST, ghost, 0));
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        !dp.control()
            .fdb_dump(br, rt.now())
            .iter()
            .any(|e| e.mac == ghost),
        "a frame from a removed port's driver was learned"
    );
    rt.stop();
    // Stopped, the runtime drives nothing: the datapath removes the port itself.
    dp.control().remove_port(x).unwrap();
}

/// A port whose receive always fails (a TAP whose device vanished) does not stop the
/// worker's timers: the FDB still ages.
#[test]
fn a_failing_port_does_not_stop_the_timers() {
    struct Broken;
    impl Port for Broken {
        fn name(&self) -> &str {
            "broken"
        }
        fn recv_batch(
            &self,
            _: &mut tapyard::BufPool,
            _: &mut tapyard::Batch,
        ) -> std::io::Result<usize> {
            Err(std::io::Error::other("device gone"))
        }
        fn send(&self, _: &tapyard::PacketBuf) -> Result<(), tapyard::DropReason> {
            Err(tapyard::DropReason::TxError)
        }
    }
    let mut b = Datapath::builder();
    let mut cfg = BridgeConfig::new("br0");
    cfg.aging = Duration::from_secs(1);
    let br = b.add_bridge(cfg).unwrap();
    let s0 = b.add_port("s0", Some(br)).unwrap();
    let bad = b.add_port("bad", Some(br)).unwrap();
    let dp = Arc::new(b.build());
    let (a0, h0) = mem_pair("s0", "h0", 64);
    let ports: Vec<(PortId, Arc<dyn Port>)> = vec![(s0, Arc::new(a0)), (bad, Arc::new(Broken))];
    let rt = Runtime::start(dp.clone(), ports, RuntimeConfig::default()).unwrap();
    h0.send_frame(&frame(MacAddr::BROADCAST, MacAddr::local(5), 0))
        .unwrap();
    let aged = eventually(Duration::from_secs(5), || {
        dp.control()
            .bridge(br)
            .is_some_and(|b| b.fdb().counters().aged > 0)
    });
    rt.stop();
    assert!(
        aged,
        "the FDB aging sweep never ran: a failing port starved the timers"
    );
}

/// `Runtime::pause` stops every worker at a batch boundary: frames sent while paused wait in
/// the port's queue (nothing is received or forwarded), the drivers are listed and still
/// open, a port can still be removed, and `resume` forwards what waited, in order.
#[test]
fn a_paused_runtime_forwards_nothing_until_resumed() {
    let (dp, ports, hosts) = mem_bridge(3, 256);
    let ids: Vec<PortId> = ports.iter().map(|(id, _)| *id).collect();
    let rt = Runtime::start(
        dp.clone(),
        ports,
        RuntimeConfig {
            workers: 2,
            ..Default::default()
        },
    )
    .unwrap();
    let (m0, m1) = (MacAddr::local(1), MacAddr::local(2));
    hosts[0].send_frame(&frame(m1, m0, 0)).unwrap();
    assert!(eventually(Duration::from_secs(5), || hosts[1]
        .recv_frame()
        .is_some()));
    rt.pause();
    assert!(rt.is_paused());
    rt.pause(); // idempotent
    let listed: Vec<PortId> = rt.ports().iter().map(|(id, _)| *id).collect();
    assert_eq!(listed, ids);
    let before = dp.control().stats().ports[0].rx_packets;
    for seq in 1..=100 {
        hosts[0].send_frame(&frame(m1, m0, seq)).unwrap();
    }
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        hosts[1].recv_frame().is_none(),
        "a paused runtime forwarded"
    );
    assert_eq!(
        dp.control().stats().ports[0].rx_packets,
        before,
        "a paused runtime received"
    );
    // Table changes are still acknowledged by parked workers.
    let removed = rt.remove_port(ids[2]).expect("removed while paused");
    assert_eq!(Arc::strong_count(&removed), 1);
    rt.resume();
    assert!(!rt.is_paused());
    let mut next = 1;
    let deadline = Instant::now() + Duration::from_secs(5);
    while next <= 100 {
        assert!(
            Instant::now() < deadline,
            "resumed runtime stalled at {next}"
        );
        match hosts[1].recv_frame() {
            Some(b) => {
                let f = b.frame();
                assert_eq!(u32::from_be_bytes([f[14], f[15], f[16], f[17]]), next);
                next += 1;
                hosts[1].recycle(b);
            }
            None => std::thread::sleep(Duration::from_millis(1)),
        }
    }
    rt.stop();
}
