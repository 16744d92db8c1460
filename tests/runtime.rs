//! Without root: the threaded runtime moves frames between in-memory ports with two workers and
//! stops cleanly, every frame accounted for.
#![allow(
    clippy::cast_possible_truncation,
    reason = "test fixtures: small loop counters and random draws narrowed into addresses, ports and ids"
)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use tapyard::port::{mem_pair, MemPort, Port};
use tapyard::runtime::{Runtime, RuntimeConfig};
use tapyard::{BridgeConfig, Datapath, MacAddr, PortId};

fn frame(dst: MacAddr, src: MacAddr, seq: u32) -> Vec<u8> {
    let mut f = Vec::with_capacity(64);
    f.extend_from_slice(&dst.0);
    f.extend_from_slice(&src.0);
    f.extend_from_slice(&[0x88, 0xb5]); // local experimental EtherType
    f.extend_from_slice(&seq.to_be_bytes());
    f.resize(64, 0);
    f
}

#[test]
fn two_workers_forward_everything_then_stop() {
    const N: u32 = 20_000;
    let mut b = Datapath::builder();
    let br = b.add_bridge(BridgeConfig::new("br0")).unwrap();
    let mut hosts: Vec<MemPort> = Vec::new();
    let mut ports: Vec<(PortId, Arc<dyn Port>)> = Vec::new();
    for i in 0..4 {
        let id = b.add_port(format!("p{i}"), Some(br)).unwrap();
        let (a, h) = mem_pair(&format!("p{i}"), &format!("h{i}"), 4096);
        ports.push((id, Arc::new(a)));
        hosts.push(h);
    }
    let dp = Arc::new(b.build());
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
    let deadline = Instant::now() + Duration::from_secs(10);
    while dp.stats().flooded < 4 && Instant::now() < deadline {
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
    let s = dp.stats();
    assert_eq!(s.forwarded, 4 * u64::from(N), "{s}");
    assert_eq!(s.rx_drops(), 0, "{s}");
    for p in &s.ports {
        assert_eq!(p.rx_packets, u64::from(N) + 1);
        assert_eq!(p.tx_packets, u64::from(N) + 3);
    }
}
