//! The bridge fed arbitrary frame sequences on arbitrary ports, with time moving forward by
//! arbitrary steps: never panics, the FDB never exceeds its bound, every frame received is
//! forwarded, flooded or counted as a drop, and nothing is ever sent back out of its own port
//! or across bridges; ports come and go (a capacity of 12 ids), and a removed port's FDB
//! entries go with it.
//!
//! Input: a sequence of records `[port: u8][dt: u8][len: u8][frame bytes: len]`. The frame's
//! MAC bytes are widened from a small alphabet so that learning and lookups collide often.
//! A `port` byte of 0xf0 or more is a topology change instead of a frame (and `len` bytes
//! follow none): even, add a port named after `len % 8` to bridge `dt & 1`; odd, remove port
//! `len % 13`.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::time::Duration;
use tapyard::{Batch, BridgeConfig, Datapath, Instant, PacketBuf, PortId, Verdict, Worker};

const FDB_MAX: usize = 8;

fuzz_target!(|data: &[u8]| {
    let mut b = Datapath::builder();
    let mut cfg = BridgeConfig::new("br0");
    cfg.fdb_max_entries = FDB_MAX;
    cfg.aging = Duration::from_secs(10);
    let b0 = b.add_bridge(cfg).unwrap();
    let b1 = b.add_bridge(BridgeConfig::new("br1")).unwrap();
    b.max_ports(12).unwrap();
    for i in 0..4 {
        b.add_port(format!("a{i}"), Some(b0)).unwrap();
    }
    b.add_port("b0", Some(b1)).unwrap();
    b.add_port("b1", Some(b1)).unwrap();
    b.add_port("lone", None).unwrap();
    let dp = b.build();
    let mut w = dp.worker();
    let mut now = Instant::ZERO;
    let mut batch = Batch::new();
    let mut rest = data;
    let mut received = 0u64;
    let mut removed_any = false;
    while rest.len() >= 3 {
        let (port, dt, len) = (rest[0], rest[1], usize::from(rest[2]));
        rest = &rest[3..];
        if port >= 0xf0 {
            if port & 1 == 0 {
                let br = if dt & 1 == 0 { b0 } else { b1 };
                if let Ok(p) = dp.control().add_port(&format!("n{}", len % 8), br) {
                    assert!(usize::from(p.0) < 12);
                    assert_eq!(dp.control().port_bridge(p), Some(br));
                }
            } else {
                let p = PortId((len % 13) as u16);
                if dp.control().remove_port(p).is_ok() {
                    removed_any = true;
                    assert_eq!(dp.control().port_bridge(p), None);
                    for br in dp.control().bridges() {
                        assert!(!br.ports().contains(&p));
                        assert!(br.fdb().dump(now).iter().all(|e| e.port != p));
                    }
                }
            }
            continue;
        }
        let len = len.min(rest.len());
        let mut frame = rest[..len].to_vec();
        rest = &rest[len..];
        // Small MAC alphabet: keep the low 3 bits of the last byte of each address, and the
        // group bit of the first byte.
        for a in [0usize, 6] {
            if frame.len() >= a + 6 {
                let g = frame[a] & 1;
                let last = frame[a + 5] & 7;
                frame[a..a + 6].copy_from_slice(&[2 | g, 0, 0, 0, 0, last]);
                if g == 1 && last == 7 {
                    frame[a..a + 6].copy_from_slice(&[0xff; 6]);
                }
            }
        }
        now = now + Duration::from_millis(u64::from(dt) * 100);
        let mut pb = PacketBuf::from_frame(&frame);
        pb.port = PortId(u16::from(port % 13)); // 7.. exist once added; 12 never
        if batch.push(pb).is_err() {
            break;
        }
        received += 1;
        if batch.is_full() || rest.len() < 3 {
            step(&dp, &mut w, &mut batch, now);
        }
    }
    // The input may end on a topology record with frames still in the batch.
    if !batch.is_empty() {
        step(&dp, &mut w, &mut batch, now);
    }
    let s = dp.control().stats();
    let rx: u64 = s.ports.iter().map(|p| p.rx_packets).sum();
    if !removed_any {
        // A removed port's counters leave the snapshot with it.
        assert_eq!(
            rx + s.drop_count(tapyard::DropReason::UnknownPort),
            received
        );
    }
    assert_eq!(received, s.forwarded + s.flooded + s.rx_drops());
    assert_eq!(s.drop_count(tapyard::DropReason::PortGone), 0);
});

/// Processes and dispatches `batch`, runs the timers, and checks the verdicts and the bounds.
fn step(dp: &Datapath, w: &mut Worker, batch: &mut Batch, now: Instant) {
    dp.process(w, now, batch);
    for (buf, v) in batch.bufs().iter().zip(batch.verdicts()) {
        match *v {
            Verdict::Output(p) => {
                assert_ne!(p, buf.port);
                assert_eq!(
                    dp.control().port_bridge(p),
                    dp.control().port_bridge(buf.port)
                );
            }
            Verdict::Flood(br) => assert_eq!(Some(br), dp.control().port_bridge(buf.port)),
            Verdict::Drop(_) | Verdict::Local | Verdict::Queued => {}
        }
    }
    dp.dispatch(w, batch, |p, buf| {
        assert_ne!(p, buf.port);
        Ok(())
    });
    batch.recycle(&mut w.pool);
    dp.poll(w, now, batch);
    batch.recycle(&mut w.pool);
    for br in dp.control().bridges() {
        assert!(br.fdb().counters().entries <= br.fdb().max_entries());
        assert!(br.fdb().dump(now).len() <= br.fdb().max_entries());
    }
}
