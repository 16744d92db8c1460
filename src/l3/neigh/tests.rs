//! The table's tests: the state machine against Linux's timings, limits and garbage
//! collection, concurrent readers, and random operations checked against the invariants.
#![allow(
    clippy::cast_possible_truncation,
    reason = "test fixtures: small loop counters and random draws narrowed into addresses, ports and ids"
)]

use super::state::{splitmix64, GEN_SHIFT, WORD_GEN_MASK};
use super::*;
use proptest::prelude::*;
use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

impl NeighTable {
    /// Checks the table's internal invariants.
    fn check_invariants(&self) {
        let w = self.writer.lock();
        let mut n = 0;
        let mut queued = 0;
        for idx in 0..self.slots() {
            let k = self.slot_key(idx);
            let word = self.slot_word(idx);
            if !occupied(k) {
                assert!(!w.queues.contains_key(&(idx as u32)), "queue on empty slot");
                continue;
            }
            n += 1;
            assert_eq!(k >> 48, u64::from(w.meta[idx].gen));
            assert_eq!(
                word >> GEN_SHIFT,
                (k >> 48) & WORD_GEN_MASK,
                "word generation"
            );
            let st = decode(word).expect("an occupied slot has a state");
            if let Some(q) = w.queues.get(&(idx as u32)) {
                assert_eq!(st, NeighState::Incomplete, "only INCOMPLETE entries queue");
                assert!(q.frames.len() <= self.cfg.unres_qlen);
                assert!(q.bytes <= self.cfg.unres_qlen_bytes);
                assert_eq!(q.bytes, q.frames.iter().map(Vec::len).sum::<usize>());
                queued += q.frames.len();
            }
            let armed = w.meta[idx].armed;
            match st {
                NeighState::Permanent => assert_eq!(armed, None),
                NeighState::Delay => assert!(matches!(
                    armed,
                    Some(NeighState::Delay | NeighState::Stale | NeighState::Probe)
                )),
                NeighState::Incomplete
                | NeighState::Reachable
                | NeighState::Stale
                | NeighState::Probe
                | NeighState::Failed => {
                    assert_eq!(armed, Some(st), "every dynamic entry has its timer")
                }
            }
        }
        assert_eq!(n, w.entries);
        assert!(w.entries <= self.cfg.gc_thresh3);
        assert_eq!(queued, w.queued_now);
        let c = &w.c;
        assert_eq!(
            c.queued,
            c.released + c.queue_overflow + c.queue_failed + c.queue_flushed + queued as u64
        );
    }
}

const CNI0: IfaceId = IfaceId(1);
const GW: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 1);

fn ip(n: u16) -> Ipv4Addr {
    Ipv4Addr::new(10, 244, (n >> 8) as u8, n as u8)
}
fn mac(n: u32) -> MacAddr {
    MacAddr::local(n)
}
fn ms(v: u64) -> Instant {
    Instant::from_millis(v)
}
fn s(v: u64) -> Instant {
    Instant::from_secs(v)
}
fn table() -> NeighTable {
    NeighTable::new(NeighConfig::default())
}
fn poll(t: &NeighTable, now: Instant) -> Vec<NeighEvent> {
    let mut v = Vec::new();
    t.poll(now, &mut |e| v.push(e));
    t.check_invariants();
    v
}
/// An ARP packet's fields, for the tests.
#[derive(Clone, Copy)]
struct Arp {
    op: ArpOp,
    sender_ip: Ipv4Addr,
    sender_mac: MacAddr,
    target_ip: Ipv4Addr,
}
fn heard(
    op: ArpOp,
    sender_ip: Ipv4Addr,
    sender_mac: MacAddr,
    target_ip: Ipv4Addr,
    local: bool,
) -> ArpHeard {
    ArpHeard {
        op,
        sender_ip,
        sender_mac,
        target_ip,
        target_is_local: local,
    }
}
fn show(t: &NeighTable, now: Instant, name: &str) -> String {
    let mut s = String::new();
    t.fmt_dump(now, &mut s, &|_| name.to_string()).unwrap();
    s
}
fn reply(from: Ipv4Addr, m: MacAddr) -> Arp {
    Arp {
        op: ArpOp::REPLY,
        sender_ip: from,
        sender_mac: m,
        target_ip: GW,
    }
}
fn request(from: Ipv4Addr, m: MacAddr, to: Ipv4Addr) -> Arp {
    Arp {
        op: ArpOp::REQUEST,
        sender_ip: from,
        sender_mac: m,
        target_ip: to,
    }
}
fn input(t: &NeighTable, arp: Arp, local: bool, now: Instant) -> (Learned, Vec<Released>) {
    let mut v = Vec::new();
    let heard = ArpHeard {
        op: arp.op,
        sender_ip: arp.sender_ip,
        sender_mac: arp.sender_mac,
        target_ip: arp.target_ip,
        target_is_local: local,
    };
    let l = t.input(CNI0, heard, now, &mut |r| v.push(r));
    t.check_invariants();
    (l, v)
}
fn state(t: &NeighTable, a: Ipv4Addr, now: Instant) -> Option<NeighState> {
    t.dump(now)
        .into_iter()
        .find(|e| e.iface == CNI0 && e.ip == a)
        .map(|e| e.state)
}
fn queued(e: Enqueue) -> (bool, Vec<Vec<u8>>) {
    match e {
        Enqueue::Queued { solicit, dropped } => (solicit, dropped),
        other => panic!("not queued: {other:?}"),
    }
}
fn bcast(a: Ipv4Addr) -> NeighEvent {
    NeighEvent::Solicit {
        iface: CNI0,
        ip: a,
        unicast: None,
    }
}
fn ucast(a: Ipv4Addr, m: MacAddr) -> NeighEvent {
    NeighEvent::Solicit {
        iface: CNI0,
        ip: a,
        unicast: Some(m),
    }
}

/// A REACHABLE entry for `a` at `mac(7)`, resolved at time 0.
fn resolved(t: &NeighTable, a: Ipv4Addr) {
    let _ = t.enqueue(CNI0, a, b"x", s(0));
    input(t, reply(a, mac(7)), true, s(0));
    assert_eq!(state(t, a, s(0)), Some(NeighState::Reachable));
}

/// Polls every 100 ms from `from` to `to` (inclusive), collecting events with their time.
fn run(t: &NeighTable, from: u64, to: u64) -> Vec<(u64, NeighEvent)> {
    let mut v = Vec::new();
    let mut now = from;
    while now <= to {
        for e in poll(t, ms(now)) {
            v.push((now, e));
        }
        now += 100;
    }
    v
}

#[test]
fn table_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<NeighTable>();
}

#[test]
fn incomplete_sends_three_requests_then_fails_and_hands_out_frames() {
    let t = table();
    let a = ip(2);
    assert_eq!(t.lookup(CNI0, a, s(0)), None);
    assert_eq!(queued(t.enqueue(CNI0, a, b"one", s(0))), (true, vec![]));
    assert_eq!(queued(t.enqueue(CNI0, a, b"two", ms(300))), (false, vec![]));
    assert_eq!(state(&t, a, s(0)), Some(NeighState::Incomplete));
    assert_eq!(t.lookup(CNI0, a, ms(400)), None, "INCOMPLETE is not usable");
    assert_eq!(t.poll_at(), Some(s(1)));
    let ev = run(&t, 0, 3500);
    assert_eq!(
        ev,
        vec![
            (1000, bcast(a)),
            (2000, bcast(a)),
            (
                3000,
                NeighEvent::Unreachable {
                    iface: CNI0,
                    ip: a,
                    frame: b"one".to_vec()
                }
            ),
            (
                3000,
                NeighEvent::Unreachable {
                    iface: CNI0,
                    ip: a,
                    frame: b"two".to_vec()
                }
            ),
        ]
    );
    assert_eq!(state(&t, a, s(4)), Some(NeighState::Failed));
    assert_eq!(t.lookup(CNI0, a, s(4)), None);
    let c = t.counters();
    assert_eq!(
        (c.requests, c.failed, c.queue_failed, c.queued_now),
        (3, 1, 2, 0)
    );
    assert_eq!(c.lookups_missed, 3);
    assert_eq!(
        show(&t, s(4), "cni0"),
        "10.244.0.2 dev cni0  FAILED\n",
        "ip neigh show style"
    );
    // The next frame restarts resolution at once.
    assert_eq!(queued(t.enqueue(CNI0, a, b"three", s(5))), (true, vec![]));
    assert_eq!(state(&t, a, s(5)), Some(NeighState::Incomplete));
    assert_eq!(t.poll_at(), Some(s(6)));
}

#[test]
fn reply_releases_queued_frames_in_order() {
    let t = table();
    let a = ip(3);
    for (i, f) in [b"f0", b"f1", b"f2"].iter().enumerate() {
        let (req, _) = queued(t.enqueue(CNI0, a, *f, ms(i as u64 * 100)));
        assert_eq!(req, i == 0);
    }
    let (l, rel) = input(&t, reply(a, mac(3)), true, ms(500));
    assert_eq!(l, Learned::Updated);
    let frames: Vec<_> = rel.iter().map(|r| r.frame.clone()).collect();
    assert_eq!(frames, vec![b"f0".to_vec(), b"f1".to_vec(), b"f2".to_vec()]);
    assert!(rel
        .iter()
        .all(|r| r.mac == mac(3) && r.ip == a && r.iface == CNI0));
    assert_eq!(state(&t, a, s(1)), Some(NeighState::Reachable));
    assert_eq!(t.lookup(CNI0, a, s(1)), Some(mac(3)));
    // No more requests once resolved.
    assert!(run(&t, 600, 10_000).is_empty());
    let c = t.counters();
    assert_eq!((c.queued, c.released, c.queued_now), (3, 3, 0));
    assert_eq!(
        show(&t, s(1), "if1"),
        "10.244.0.3 dev if1 lladdr 02:00:00:00:00:03 REACHABLE\n"
    );
}

#[test]
fn reachable_goes_stale_after_the_randomized_reachable_time() {
    let t = table();
    let a = ip(4);
    resolved(&t, a);
    let ev = run(&t, 0, 14_900);
    assert!(ev.is_empty());
    assert_eq!(state(&t, a, ms(14_900)), Some(NeighState::Reachable));
    run(&t, 15_000, 45_000);
    assert_eq!(state(&t, a, s(45)), Some(NeighState::Stale));
    // STALE is still usable.
    assert_eq!(t.lookup(CNI0, a, s(46)), Some(mac(7)));

    // Reachable times are spread over [15 s, 45 s) and reproducible per seed.
    let draws = |seed| {
        let t = NeighTable::<Ipv4Addr>::new(NeighConfig {
            seed,
            ..NeighConfig::default()
        });
        let mut w = t.writer.lock();
        (0..1000).map(|_| t.draw_reach(&mut w)).collect::<Vec<_>>()
    };
    let d = draws(1);
    assert_eq!(d, draws(1));
    assert_ne!(d, draws(2));
    assert!(d.iter().all(|&r| (15_000_000..45_000_000).contains(&r)));
    assert!(d.iter().any(|&r| r < 20_000_000) && d.iter().any(|&r| r > 40_000_000));
}

#[test]
fn reply_confirmations_extend_reachable_without_new_timers() {
    let t = table();
    let a = ip(5);
    resolved(&t, a);
    for sec in (10..200).step_by(10) {
        assert_eq!(
            input(&t, reply(a, mac(7)), true, s(sec)).0,
            Learned::Confirmed
        );
        poll(&t, s(sec));
        assert_eq!(state(&t, a, s(sec)), Some(NeighState::Reachable));
    }
    assert!(t.writer.lock().timers.len() <= 2);
}

/// STALE at 50 s, used at `used` (in ms).
fn stale_then_used(t: &NeighTable, a: Ipv4Addr, used: u64) {
    resolved(t, a);
    run(t, 0, 50_000);
    assert_eq!(state(t, a, s(50)), Some(NeighState::Stale));
    assert_eq!(t.lookup(CNI0, a, ms(used)), Some(mac(7)));
    assert_eq!(
        state(t, a, ms(used)),
        Some(NeighState::Delay),
        "reader marked it"
    );
    assert_eq!(t.poll_at(), Some(Instant::ZERO), "mark pending");
    poll(t, ms(used));
    assert_eq!(t.poll_at(), Some(ms(used + 5000)));
}

#[test]
fn used_stale_goes_delay_then_probe_then_fails() {
    let t = table();
    let a = ip(6);
    stale_then_used(&t, a, 60_000);
    let ev = run(&t, 60_000, 70_000);
    assert_eq!(
        ev,
        vec![
            (65_000, ucast(a, mac(7))),
            (66_000, ucast(a, mac(7))),
            (67_000, ucast(a, mac(7))),
        ]
    );
    assert_eq!(state(&t, a, s(70)), Some(NeighState::Failed));
    assert_eq!(t.lookup(CNI0, a, s(70)), None);
    assert_eq!(t.counters().failed, 1);
}

#[test]
fn probe_answered_goes_back_to_reachable() {
    let t = table();
    let a = ip(7);
    stale_then_used(&t, a, 60_000);
    let ev = run(&t, 60_000, 65_500);
    assert_eq!(ev, vec![(65_000, ucast(a, mac(7)))]);
    assert_eq!(state(&t, a, ms(65_500)), Some(NeighState::Probe));
    assert_eq!(
        t.lookup(CNI0, a, ms(65_500)),
        Some(mac(7)),
        "PROBE is usable"
    );
    assert_eq!(
        input(&t, reply(a, mac(7)), true, ms(65_600)).0,
        Learned::Updated
    );
    assert_eq!(state(&t, a, ms(65_600)), Some(NeighState::Reachable));
    assert!(run(&t, 65_700, 75_000).is_empty(), "no more probes");
}

#[test]
fn delay_rescued_by_a_reply_sends_no_probe() {
    let t = table();
    let a = ip(8);
    stale_then_used(&t, a, 60_000);
    input(&t, reply(a, mac(7)), true, s(62));
    assert_eq!(state(&t, a, s(62)), Some(NeighState::Reachable));
    assert!(run(&t, 62_000, 70_000).is_empty());
}

#[test]
fn delay_is_not_rescued_by_a_request_from_the_neighbour() {
    // As Linux: a request refreshes, it does not confirm reachability.
    let t = table();
    let a = ip(9);
    stale_then_used(&t, a, 60_000);
    assert_eq!(
        input(&t, request(a, mac(7), GW), true, s(61)).0,
        Learned::Unchanged
    );
    assert_eq!(state(&t, a, s(61)), Some(NeighState::Delay));
    assert_eq!(run(&t, 61_000, 65_000), vec![(65_000, ucast(a, mac(7)))]);
}

#[test]
fn stale_used_through_enqueue_goes_delay_too() {
    let t = table();
    let a = ip(10);
    resolved(&t, a);
    run(&t, 0, 50_000);
    assert_eq!(t.enqueue(CNI0, a, b"y", s(51)), Enqueue::Resolved(mac(7)));
    assert_eq!(state(&t, a, s(51)), Some(NeighState::Delay));
    assert_eq!(t.poll_at(), Some(s(56)));
}

#[test]
fn queue_is_bounded_and_drops_the_oldest() {
    let t = table();
    let a = ip(11);
    let mut dropped = Vec::new();
    for i in 0..105u32 {
        let (_, d) = queued(t.enqueue(CNI0, a, &i.to_be_bytes(), s(0)));
        dropped.extend(d);
    }
    let want: Vec<Vec<u8>> = (0..4u32).map(|i| i.to_be_bytes().to_vec()).collect();
    assert_eq!(dropped, want, "oldest first");
    let c = t.counters();
    assert_eq!((c.queued_now, c.queue_overflow), (101, 4));
    let (_, rel) = input(&t, reply(a, mac(11)), true, s(0));
    assert_eq!(rel.len(), 101);
    assert_eq!(rel[0].frame, 4u32.to_be_bytes());
    assert_eq!(rel[100].frame, 104u32.to_be_bytes());

    // The byte bound.
    let t = NeighTable::new(NeighConfig {
        unres_qlen_bytes: 1000,
        ..NeighConfig::default()
    });
    for i in 0..3u8 {
        assert!(queued(t.enqueue(CNI0, a, &[i; 300], s(0))).1.is_empty());
    }
    let (_, d) = queued(t.enqueue(CNI0, a, &[9; 300], s(0)));
    assert_eq!(d, vec![vec![0u8; 300]]);
    let (_, d) = queued(t.enqueue(CNI0, a, &[8; 1000], s(0)));
    assert_eq!(d.len(), 3, "a big frame pushes out several");
    assert_eq!(
        t.enqueue(CNI0, a, &[0; 1001], s(0)),
        Enqueue::Refused(Refusal::FrameTooBig)
    );
    t.check_invariants();
}

#[test]
fn static_entries_are_immune_to_arp_and_time() {
    let t = table();
    let a = ip(12);
    assert!(t.add_static(CNI0, a, mac(12), s(0)).unwrap().is_empty());
    assert_eq!(t.lookup(CNI0, a, s(0)), Some(mac(12)));
    assert_eq!(
        input(&t, reply(a, mac(99)), true, s(5)).0,
        Learned::Permanent
    );
    assert_eq!(
        input(&t, request(a, mac(99), a), false, s(6)).0,
        Learned::Permanent,
        "gratuitous ARP too"
    );
    assert!(run(&t, 0, 1000).is_empty());
    poll(&t, s(100_000));
    assert_eq!(t.lookup(CNI0, a, s(100_000)), Some(mac(12)));
    assert_eq!(
        show(&t, s(1), "cni0"),
        "10.244.0.12 dev cni0 lladdr 02:00:00:00:00:0c PERMANENT\n"
    );
    assert_eq!(t.enqueue(CNI0, a, b"z", s(1)), Enqueue::Resolved(mac(12)));
    assert_eq!(t.poll_at(), None);
    assert_eq!(t.flush_iface(CNI0), 0, "flush keeps static entries");
    assert!(t.remove(CNI0, a));
    assert_eq!(t.lookup(CNI0, a, s(1)), None);
    assert!(!t.remove(CNI0, a));

    // A static entry for a neighbour being resolved releases its frames.
    let _ = t.enqueue(CNI0, a, b"w", s(2));
    let rel = t.add_static(CNI0, a, mac(13), s(2)).unwrap();
    assert_eq!(rel.len(), 1);
    assert_eq!((rel[0].mac, &rel[0].frame[..]), (mac(13), &b"w"[..]));
    assert!(
        run(&t, 2000, 10_000).is_empty(),
        "no requests for it any more"
    );
    t.check_invariants();

    assert_eq!(
        t.add_static(CNI0, Ipv4Addr::BROADCAST, mac(1), s(0)),
        Err(NeighError::BadAddress(Ipv4Addr::BROADCAST.into()))
    );
    assert_eq!(
        t.add_static(CNI0, a, MacAddr::BROADCAST, s(0)),
        Err(NeighError::BadMac(MacAddr::BROADCAST))
    );
}

#[test]
fn gratuitous_arp_updates_and_locktime_holds_other_changes() {
    let t = table();
    let a = ip(13);
    resolved(&t, a);
    // Within locktime, a reply with another MAC is ignored...
    assert_eq!(
        input(&t, reply(a, mac(8)), true, ms(500)).0,
        Learned::Locked
    );
    assert_eq!(t.lookup(CNI0, a, ms(500)), Some(mac(7)));
    // ...but a gratuitous ARP overrides at once, as STALE.
    let garp = request(a, mac(8), a);
    assert_eq!(input(&t, garp, false, ms(600)).0, Learned::Updated);
    assert_eq!(t.lookup(CNI0, a, ms(600)), Some(mac(8)));
    // After locktime a reply with a new MAC is taken and confirms.
    assert_eq!(input(&t, reply(a, mac(9)), true, s(2)).0, Learned::Updated);
    assert_eq!(state(&t, a, s(2)), Some(NeighState::Reachable));
    assert_eq!(t.lookup(CNI0, a, s(2)), Some(mac(9)));

    // Unknown sender: created from a gratuitous ARP (default), as STALE...
    let b = ip(14);
    let garp_reply = Arp {
        op: ArpOp::REPLY,
        ..request(b, mac(14), b)
    };
    assert_eq!(input(&t, garp_reply, false, s(3)).0, Learned::Created);
    assert_eq!(state(&t, b, s(3)), Some(NeighState::Stale));
    // ...but not with accept_gratuitous off, nor from an unsolicited reply.
    let t2 = NeighTable::new(NeighConfig {
        accept_gratuitous: false,
        ..NeighConfig::default()
    });
    assert_eq!(input(&t2, garp_reply, false, s(3)).0, Learned::Ignored);
    assert_eq!(
        input(&t, reply(ip(15), mac(15)), true, s(3)).0,
        Learned::Ignored
    );
    // ARP probes (sender 0.0.0.0), bad MACs and claims on our own address teach nothing.
    let probe = request(Ipv4Addr::UNSPECIFIED, mac(16), ip(16));
    assert_eq!(input(&t, probe, true, s(3)).0, Learned::Ignored);
    let bad = request(ip(17), MacAddr::BROADCAST, GW);
    assert_eq!(input(&t, bad, true, s(3)).0, Learned::Ignored);
    assert_eq!(
        input(&t, request(GW, mac(18), GW), true, s(3)).0,
        Learned::Ignored
    );
    assert_eq!(t.counters().entries, 2);
}

#[test]
fn requests_to_us_create_stale_entries() {
    let t = table();
    let a = ip(20);
    assert_eq!(
        input(&t, request(a, mac(20), GW), true, s(1)).0,
        Learned::Created
    );
    assert_eq!(state(&t, a, s(1)), Some(NeighState::Stale));
    // A request for someone else from an unknown sender teaches nothing.
    assert_eq!(
        input(&t, request(ip(21), mac(21), ip(22)), false, s(1)).0,
        Learned::Ignored
    );
    // A request from a REACHABLE neighbour with the same MAC leaves it REACHABLE.
    let b = ip(23);
    resolved(&t, b);
    assert_eq!(
        input(&t, request(b, mac(7), GW), true, s(1)).0,
        Learned::Unchanged
    );
    assert_eq!(state(&t, b, s(1)), Some(NeighState::Reachable));
    // A request from a neighbour being resolved releases its frames (and uses the entry).
    let c = ip(24);
    let _ = t.enqueue(CNI0, c, b"q", s(1));
    let (l, rel) = input(&t, request(c, mac(24), ip(99)), false, s(1));
    assert_eq!((l, rel.len()), (Learned::Updated, 1));
    assert_eq!(state(&t, c, s(1)), Some(NeighState::Delay));
    // An unused STALE entry is collected after gc_stale_time once above gc_thresh1 only.
    run(&t, 1000, 70_000);
    assert_eq!(
        state(&t, a, s(70)),
        Some(NeighState::Stale),
        "below gc_thresh1"
    );
}

#[test]
fn the_limit_holds_under_a_flood_and_gc_collects_failed_first() {
    let cfg = NeighConfig {
        request_rate: 1_000_000,
        request_burst: 1_000_000,
        ..NeighConfig::default()
    };
    let t = NeighTable::new(cfg);
    for i in 0..4u16 {
        t.add_static(CNI0, ip(60_000 + i), mac(1), s(0)).unwrap();
    }
    let mut refused = 0;
    for i in 0..3000u16 {
        match t.enqueue(CNI0, ip(i + 1), b"p", ms(u64::from(i) / 2)) {
            Enqueue::Refused(Refusal::TableFull) => refused += 1,
            Enqueue::Queued { .. } => {}
            other => panic!("{other:?}"),
        }
        assert!(t.counters().entries <= 1024);
    }
    t.check_invariants();
    assert_eq!(refused, 3000 - 1020);
    assert_eq!(t.counters().refused, refused);
    // The INCOMPLETE entries fail; their frames come out as unreachable.
    let ev = run(&t, 100, 4000);
    let unreachable = ev
        .iter()
        .filter(|(_, e)| matches!(e, NeighEvent::Unreachable { .. }))
        .count();
    assert_eq!(unreachable, 1020);
    assert_eq!(t.counters().entries, 1024);
    // A new neighbour: forced GC takes FAILED entries down below gc_thresh2.
    let _ = queued(t.enqueue(CNI0, ip(5000), b"p", ms(4001)));
    let c = t.counters();
    assert_eq!(c.entries, 512);
    assert_eq!(c.gc, 513);
    // Another flood keeps within the limit, and static entries were never collected.
    for i in 0..3000u16 {
        let _ = t.enqueue(CNI0, ip(10_000 + i), b"p", ms(5000));
        assert!(t.counters().entries <= 1024);
    }
    for i in 0..4u16 {
        assert_eq!(t.lookup(CNI0, ip(60_000 + i), s(5)), Some(mac(1)));
    }
    // FAILED entries are also removed by their own timers, down to gc_thresh1.
    run(&t, 5000, 30_000);
    let c = t.counters();
    assert!((4..128).contains(&c.entries), "{c:?}");
    for i in 0..4u16 {
        assert_eq!(t.lookup(CNI0, ip(60_000 + i), s(30)), Some(mac(1)));
    }
}

#[test]
fn forced_gc_takes_idle_stale_entries_but_not_active_ones() {
    let cfg = NeighConfig {
        gc_thresh1: 8,
        gc_thresh2: 8,
        gc_thresh3: 10,
        ..NeighConfig::default()
    };
    let t = NeighTable::new(cfg);
    // Ten STALE entries learned from requests to us.
    for i in 0..10u16 {
        input(&t, request(ip(i + 1), mac(u32::from(i)), GW), true, s(0));
    }
    assert_eq!(
        t.enqueue(CNI0, ip(100), b"p", s(10)),
        Enqueue::Refused(Refusal::TableFull),
        "STALE but not idle for gc_stale_time"
    );
    // Entry 1 is used (DELAY, then PROBE...): not collectable.
    assert!(t.lookup(CNI0, ip(1), s(59)).is_some());
    poll(&t, s(59));
    let _ = queued(t.enqueue(CNI0, ip(100), b"p", s(61)));
    let c = t.counters();
    assert_eq!(c.entries, 8);
    assert_eq!(c.gc, 3);
    assert!(state(&t, ip(1), s(61)).is_some(), "the used entry stays");
    t.check_invariants();
}

#[test]
fn requests_are_rate_limited_across_the_table() {
    let cfg = NeighConfig {
        request_rate: 10,
        request_burst: 5,
        ..NeighConfig::default()
    };
    let t = NeighTable::new(cfg);
    let sent = (0..20u16)
        .filter(|&i| queued(t.enqueue(CNI0, ip(i + 1), b"p", s(0))).0)
        .count();
    assert_eq!(sent, 5);
    assert_eq!(t.counters().rate_limited, 15);
    // One second later the bucket is full again (5 tokens): 5 of the 20 retries go out.
    let ev = poll(&t, s(1));
    assert_eq!(ev.len(), 5);
    let c = t.counters();
    assert_eq!((c.requests, c.rate_limited), (10, 30));
    // 100 ms buys one token.
    assert!(queued(t.enqueue(CNI0, ip(500), b"p", ms(1100))).0);
    assert!(!queued(t.enqueue(CNI0, ip(501), b"p", ms(1100))).0);
    // Every unresolved neighbour still fails on time, its frame handed out.
    let ev = run(&t, 1200, 4100);
    let unreachable = ev
        .iter()
        .filter(|(_, e)| matches!(e, NeighEvent::Unreachable { .. }))
        .count();
    assert_eq!(unreachable, 22);
}

#[test]
fn flush_and_remove_discard_queued_frames_counted() {
    let t = table();
    let _ = t.enqueue(CNI0, ip(1), b"a", s(0));
    let _ = t.enqueue(CNI0, ip(1), b"b", s(0));
    let _ = t.enqueue(IfaceId(2), ip(1), b"c", s(0));
    let _ = t.enqueue(CNI0, ip(2), b"d", s(0));
    t.add_static(CNI0, ip(3), mac(3), s(0)).unwrap();
    assert_eq!(t.flush_iface(CNI0), 2);
    let c = t.counters();
    assert_eq!((c.entries, c.queue_flushed, c.queued_now), (2, 3, 1));
    assert!(t.remove(IfaceId(2), ip(1)));
    assert_eq!(t.counters().queue_flushed, 4);
    assert!(
        run(&t, 0, 5000).is_empty(),
        "timers of removed entries are dead"
    );
    t.check_invariants();
}

#[test]
fn config_validation_names_the_field() {
    let bad = |f: fn(&mut NeighConfig)| {
        let mut c = NeighConfig::default();
        f(&mut c);
        match c.validate() {
            Err(NeighError::Config { field, .. }) => field,
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(bad(|c| c.retrans_time = Duration::ZERO), "retrans_time");
    assert_eq!(bad(|c| c.gc_thresh3 = 100), "gc_thresh2");
    assert_eq!(bad(|c| c.gc_thresh1 = 600), "gc_thresh1");
    assert_eq!(bad(|c| c.mcast_solicit = 0), "mcast_solicit");
    assert_eq!(bad(|c| c.gc_thresh3 = MAX_ENTRIES + 1), "gc_thresh3");
    let c = NeighConfig {
        retrans_time: Duration::ZERO,
        ..NeighConfig::default()
    };
    assert_eq!(
        c.validate().unwrap_err().to_string(),
        "invalid neighbour config: retrans_time = 0ns: must be positive"
    );
    assert!(NeighTable::<Ipv4Addr>::try_new(c).is_err());
    assert!(NeighConfig::default().validate().is_ok());
}

#[test]
fn bad_next_hops_are_refused() {
    let t = table();
    for a in [
        Ipv4Addr::UNSPECIFIED,
        Ipv4Addr::BROADCAST,
        Ipv4Addr::new(224, 0, 0, 1),
    ] {
        assert_eq!(
            t.enqueue(CNI0, a, b"p", s(0)),
            Enqueue::Refused(Refusal::BadAddress)
        );
    }
    assert_eq!(t.counters().entries, 0);
}

/// MAC of `ip` on `iface`, version `v`: readers can check a MAC belongs to its key.
fn keyed_mac(iface: IfaceId, a: Ipv4Addr, v: u8) -> MacAddr {
    let o = a.octets();
    MacAddr([
        0x02,
        ((iface.0 as u8) << 4) | (v & 0xf),
        o[0],
        o[1],
        o[2],
        o[3],
    ])
}

#[test]
fn concurrent_readers_never_see_a_torn_or_foreign_mac() {
    let cfg = NeighConfig {
        gc_thresh1: 16,
        gc_thresh2: 32,
        gc_thresh3: 48,
        base_reachable_time: Duration::from_secs(4),
        gc_stale_time: Duration::from_secs(2),
        locktime: Duration::ZERO,
        request_rate: 1_000_000,
        request_burst: 1_000_000,
        ..NeighConfig::default()
    };
    let t = Arc::new(NeighTable::new(cfg));
    let clock = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..3)
        .map(|r: u64| {
            let (t, clock, stop) = (t.clone(), clock.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut hits = 0u64;
                let mut i: u64 = r;
                while !stop.load(Ordering::Relaxed) {
                    i = i.wrapping_add(7);
                    let iface = IfaceId((i % 2) as u16);
                    let a = ip((i % 80) as u16 + 1);
                    let now = Instant::from_micros(clock.load(Ordering::Relaxed));
                    if let Some(m) = t.lookup(iface, a, now) {
                        let o = a.octets();
                        assert_eq!(m.0[0], 0x02);
                        assert_eq!(
                            IfaceId(u16::from(m.0[1] >> 4)),
                            iface,
                            "MAC of another iface"
                        );
                        assert_eq!(m.0[2..], o[..], "MAC of another address");
                        hits += 1;
                    }
                }
                hits
            })
        })
        .collect();
    let mut rng = 1u64;
    for step in 0..150_000u64 {
        let now_us = step * 10_000;
        clock.store(now_us, Ordering::Relaxed);
        let now = Instant::from_micros(now_us);
        let x = splitmix64(&mut rng);
        let iface = IfaceId((x % 2) as u16);
        let a = ip(((x >> 8) % 80) as u16 + 1);
        let v = (x >> 16) as u8;
        match (x >> 24) % 16 {
            0..=2 => {
                let _ = t.enqueue(iface, a, b"frame", now);
            }
            3 | 4 => {
                let m = keyed_mac(iface, a, v);
                t.input(iface, heard(ArpOp::REPLY, a, m, GW, true), now, &mut |_| {});
            }
            7 | 8 => {
                let m = keyed_mac(iface, a, v);
                t.input(
                    iface,
                    heard(ArpOp::REQUEST, a, m, a, false),
                    now,
                    &mut |_| {},
                );
            }
            9 => {
                t.remove(iface, a);
            }
            10 if (x >> 40) % 16 == 0 => {
                let _ = t.add_static(iface, a, keyed_mac(iface, a, v), now);
            }
            _ => t.poll(now, &mut |_| {}),
        }
        if step % 10_000 == 0 {
            t.flush_iface(iface);
        }
    }
    stop.store(true, Ordering::Relaxed);
    let hits: u64 = readers.into_iter().map(|r| r.join().unwrap()).sum();
    t.check_invariants();
    let c = t.counters();
    assert!(c.entries <= 48);
    // The churn went through every kind of change while the readers ran.
    assert!(
        hits > 0 && c.released > 0 && c.failed > 0 && c.gc > 0 && c.refused > 0,
        "{c:?}"
    );
}

#[derive(Debug, Clone)]
enum Op {
    Enqueue(u8, u8, u8),
    Lookup(u8, u8),
    Reply(u8, u8, u8),
    Request(u8, u8, u8, bool),
    Garp(u8, u8, u8),
    Tick(u16),
    Poll,
    Static(u8, u8, u8),
    Remove(u8, u8),
    Flush(u8),
}

fn op() -> impl Strategy<Value = Op> {
    let k = || (0u8..2, 0u8..24);
    prop_oneof![
        6 => (k(), 1u8..200).prop_map(|((i, a), l)| Op::Enqueue(i, a, l)),
        4 => k().prop_map(|(i, a)| Op::Lookup(i, a)),
        3 => (k(), 0u8..4).prop_map(|((i, a), v)| Op::Reply(i, a, v)),
        2 => (k(), 0u8..4, any::<bool>()).prop_map(|((i, a), v, l)| Op::Request(i, a, v, l)),
        1 => (k(), 0u8..4).prop_map(|((i, a), v)| Op::Garp(i, a, v)),
        4 => (0u16..8000).prop_map(Op::Tick),
        3 => Just(Op::Poll),
        1 => (k(), 0u8..4).prop_map(|((i, a), v)| Op::Static(i, a, v)),
        1 => k().prop_map(|(i, a)| Op::Remove(i, a)),
        1 => (0u8..2).prop_map(Op::Flush),
    ]
}

/// A frame that carries its own id (4 bytes) and destination (iface, address index).
fn frame(id: u32, iface: u8, a: u8, len: u8) -> Vec<u8> {
    let mut f = id.to_be_bytes().to_vec();
    f.extend([iface, a]);
    f.resize(f.len().max(usize::from(len)), 0xee);
    f
}
fn frame_id(f: &[u8]) -> u32 {
    u32::from_be_bytes([f[0], f[1], f[2], f[3]])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    /// Random operations keep the bounds, never panic, and every queued frame is released,
    /// handed out as unreachable, or dropped and reported, in order per neighbour.
    #[test]
    fn random_operations_keep_invariants_and_account_for_every_frame(
        ops in proptest::collection::vec(op(), 1..250)
    ) {
        let cfg = NeighConfig {
            gc_thresh1: 4,
            gc_thresh2: 8,
            gc_thresh3: 12,
            unres_qlen: 3,
            unres_qlen_bytes: 400,
            request_rate: 5,
            request_burst: 3,
            ..NeighConfig::default()
        };
        let t = NeighTable::new(cfg);
        let addr = |a: u8| Ipv4Addr::new(10, 0, 0, a + 1);
        let kmac = |i: u8, a: u8, v: u8| keyed_mac(IfaceId(u16::from(i)), addr(a), v);
        let mut now = 0u64;
        let mut next_id = 0u32;
        // Queued frames not yet accounted for: id -> (iface, addr).
        let mut pending: BTreeMap<u32, (u8, u8)> = BTreeMap::new();
        let mut done: HashSet<u32> = HashSet::new();
        let mut last_released: HashMap<(u16, Ipv4Addr), u32> = HashMap::new();
        let mut account = |id: u32, pending: &mut BTreeMap<u32, (u8, u8)>| {
            prop_assert!(pending.remove(&id).is_some(), "frame {} accounted twice", id);
            prop_assert!(done.insert(id));
            Ok(())
        };
        for o in ops {
            let ti = Instant::from_millis(now);
            let mut released = Vec::new();
            match o {
                Op::Enqueue(i, a, len) => {
                    let f = frame(next_id, i, a, len);
                    match t.enqueue(IfaceId(u16::from(i)), addr(a), &f, ti) {
                        Enqueue::Queued { dropped, .. } => {
                            pending.insert(next_id, (i, a));
                            for d in dropped {
                                prop_assert_eq!((d[4], d[5]), (i, a));
                                account(frame_id(&d), &mut pending)?;
                            }
                        }
                        Enqueue::Resolved(m) => prop_assert_eq!(&m.0[2..], &addr(a).octets()[..]),
                        Enqueue::Refused(r) => prop_assert_eq!(r, Refusal::TableFull),
                    }
                    next_id += 1;
                }
                Op::Lookup(i, a) => {
                    if let Some(m) = t.lookup(IfaceId(u16::from(i)), addr(a), ti) {
                        prop_assert_eq!(&m.0[2..], &addr(a).octets()[..]);
                        prop_assert_eq!(m.0[1] >> 4, i);
                    }
                }
                Op::Reply(i, a, v) | Op::Request(i, a, v, _) | Op::Garp(i, a, v) => {
                    let (op, target, local) = match o {
                        Op::Reply(..) => (ArpOp::REPLY, GW, true),
                        Op::Request(.., l) => (ArpOp::REQUEST, GW, l),
                        _ => (ArpOp::REQUEST, addr(a), false),
                    };
                    let m = kmac(i, a, v);
                    t.input(IfaceId(u16::from(i)), heard(op, addr(a), m, target, local), ti, &mut |r| released.push(r));
                }
                Op::Tick(d) => now += u64::from(d),
                Op::Poll => {
                    let mut ev = Vec::new();
                    t.poll(ti, &mut |e| ev.push(e));
                    for e in ev {
                        if let NeighEvent::Unreachable { iface, ip, frame } = e {
                            prop_assert_eq!((IfaceId(u16::from(frame[4])), addr(frame[5])), (iface, ip));
                            account(frame_id(&frame), &mut pending)?;
                        }
                    }
                }
                Op::Static(i, a, v) => {
                    if let Ok(r) = t.add_static(IfaceId(u16::from(i)), addr(a), kmac(i, a, v), ti) {
                        released = r;
                    }
                }
                Op::Remove(i, a) => {
                    let before = t.counters().queue_flushed;
                    t.remove(IfaceId(u16::from(i)), addr(a));
                    let gone = t.counters().queue_flushed - before;
                    let ids: Vec<u32> = pending.iter().filter(|(_, &k)| k == (i, a)).map(|(&id, _)| id).collect();
                    prop_assert_eq!(gone, ids.len() as u64);
                    for id in ids { account(id, &mut pending)?; }
                }
                Op::Flush(i) => {
                    let before = t.counters().queue_flushed;
                    t.flush_iface(IfaceId(u16::from(i)));
                    let gone = t.counters().queue_flushed - before;
                    let ids: Vec<u32> = pending.iter().filter(|(_, k)| k.0 == i).map(|(&id, _)| id).collect();
                    // Static entries of the iface have no queue, so every frame of the iface went.
                    prop_assert_eq!(gone, ids.len() as u64);
                    for id in ids { account(id, &mut pending)?; }
                }
            }
            for r in released {
                let id = frame_id(&r.frame);
                prop_assert_eq!((IfaceId(u16::from(r.frame[4])), addr(r.frame[5])), (r.iface, r.ip));
                prop_assert_eq!(&r.mac.0[2..], &r.ip.octets()[..]);
                if let Some(&prev) = last_released.get(&(r.iface.0, r.ip)) {
                    prop_assert!(prev < id, "released in order");
                }
                last_released.insert((r.iface.0, r.ip), id);
                account(id, &mut pending)?;
            }
            t.check_invariants();
            let c = t.counters();
            prop_assert!(c.entries <= 12);
            prop_assert_eq!(c.queued_now, pending.len());
            prop_assert!(c.queued_now <= 12 * 3);
        }
        // Run time forward: every waiting frame comes out as unreachable.
        let mut ev = Vec::new();
        for k in 1..=10 {
            t.poll(Instant::from_millis(now + k * 1000), &mut |e| ev.push(e));
        }
        for e in ev {
            if let NeighEvent::Unreachable { frame, .. } = e {
                account(frame_id(&frame), &mut pending)?;
            }
        }
        prop_assert!(pending.is_empty(), "frames never accounted for: {:?}", pending);
        t.check_invariants();
    }
}
