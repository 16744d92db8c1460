#![allow(
    clippy::cast_possible_truncation,
    reason = "test fixtures: small loop counters and random draws narrowed into addresses, ports and ids"
)]
use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;

use super::tcp::flags::*;
use super::*;
use crate::time::Instant;
use crate::wire::family::Family;
use crate::wire::tuple::{L4Kind, Tuple, TupleWords};

fn ip(a: u8, b: u8, c: u8, d: u8) -> Ipv4Addr {
    Ipv4Addr::new(a, b, c, d)
}

fn tcp_t(sport: u16, dport: u16) -> Tuple {
    Tuple {
        src: ip(10, 244, 1, 2),
        dst: ip(10, 96, 0, 10),
        sport,
        dport,
        proto: 6,
        zone: 0,
    }
}

fn udp_t(i: u32) -> Tuple {
    Tuple {
        src: Ipv4Addr::from(0x0af4_0000 | i),
        dst: ip(10, 96, 0, 10),
        sport: 1000 + (i % 50000) as u16,
        dport: 53,
        proto: 17,
        zone: 0,
    }
}

fn s(secs: u64) -> Instant {
    Instant::from_secs(secs)
}

fn tcp(f: u8) -> Pkt {
    Pkt {
        kind: L4Kind::Tcp,
        tcp_flags: f,
        len: 60,
    }
}

pub(super) const UDP: Pkt = Pkt {
    kind: L4Kind::Udp,
    tcp_flags: 0,
    len: 100,
};

fn table(max: usize) -> Conntrack {
    Conntrack::new(CtConfig {
        max_entries: max,
        ..CtConfig::default()
    })
    .unwrap()
}

/// Tracks `f` in `dir` on the entry for `orig` (looked up from the matching side).
fn pkt(ct: &Conntrack, orig: &Tuple, reply: &Tuple, dir: Dir, f: u8, now: Instant) -> Track {
    let t = if dir == Dir::Original { orig } else { reply };
    let h = ct.lookup(t, now).expect("entry");
    assert_eq!(h.dir, dir);
    ct.track(&h, &tcp(f), now)
}

#[test]
fn sizes_per_connection() {
    let (e, a, b) = super::table::entry_sizes();
    assert_eq!((e, a, b), (64, 32, 64));
    let ct = table(DEFAULT_MAX_ENTRIES);
    let per = ct.memory_bytes() / DEFAULT_MAX_ENTRIES;
    assert!(per <= 128, "{per} bytes per connection");
}

#[test]
fn config_errors_name_field_and_value() {
    let e = Conntrack::new(CtConfig {
        max_entries: 0,
        ..CtConfig::default()
    })
    .unwrap_err();
    assert_eq!((e.field, e.value.as_str()), ("max_entries", "0"));
    let mut cfg = CtConfig::default();
    cfg.timeouts.udp = Duration::ZERO;
    let e = Conntrack::new(cfg).unwrap_err();
    assert_eq!(e.field, "timeouts.udp");
    assert!(e.to_string().contains("timeouts.udp"));
}

#[test]
fn tcp_handshake_established_assured_and_close() {
    let ct = table(64);
    let o = tcp_t(40000, 80);
    let r = o.invert();
    let h = ct.insert(o, r, CtTag::default(), &tcp(SYN), s(0)).unwrap();
    assert_eq!(h.state, CtState::SynSent);
    assert!(!h.status.seen_reply());
    assert_eq!(
        pkt(&ct, &o, &r, Dir::Reply, SYN | ACK, s(1)),
        Track::Ok(CtState::SynRecv)
    );
    let h = ct.lookup(&o, s(1)).unwrap();
    assert!(h.status.seen_reply() && !h.status.assured());
    assert_eq!(
        pkt(&ct, &o, &r, Dir::Original, ACK, s(2)),
        Track::Ok(CtState::Established)
    );
    let h = ct.lookup(&o, s(2)).unwrap();
    assert!(h.status.assured());
    assert_eq!(h.state, CtState::Established);
    // 5 days of idleness, exactly.
    assert!(ct.lookup(&o, s(2 + 432_000 - 1)).is_some());
    assert!(ct.lookup(&o, s(2 + 432_000)).is_none());
    // Close: FIN from the client, ACK, FIN from the server, last ACK.
    let steps = [
        (Dir::Original, FIN | ACK, CtState::FinWait, 120),
        (Dir::Reply, ACK, CtState::CloseWait, 60),
        (Dir::Reply, FIN | ACK, CtState::LastAck, 30),
        (Dir::Original, ACK, CtState::TimeWait, 120),
    ];
    let mut now = 10;
    for (dir, f, want, timeout) in steps {
        now += 5;
        assert_eq!(pkt(&ct, &o, &r, dir, f, s(now)), Track::Ok(want));
        let v = ct.dump(s(now));
        assert_eq!(v[0].timeout_secs, timeout, "{want:?}");
        assert!(ct.lookup(&o, s(now + timeout - 1)).is_some());
        assert!(ct.lookup(&o, s(now + timeout)).is_none(), "{want:?}");
    }
    // SYN in TIME_WAIT re-opens: the old entry is gone, a new one can be inserted.
    assert_eq!(
        pkt(&ct, &o, &r, Dir::Original, SYN, s(now + 1)),
        Track::Reopen
    );
    assert!(ct.lookup(&o, s(now + 1)).is_none());
    let h2 = ct
        .insert(o, r, CtTag::default(), &tcp(SYN), s(now + 1))
        .unwrap();
    assert_eq!(h2.state, CtState::SynSent);
    let c = ct.counters();
    assert_eq!((c.new, c.removed, c.entries), (2, 1, 1));
}

#[test]
fn tcp_rst_closes_and_rst_before_reply_deletes() {
    let ct = table(64);
    let o = tcp_t(40001, 80);
    let r = o.invert();
    ct.insert(o, r, CtTag::default(), &tcp(SYN), s(0)).unwrap();
    pkt(&ct, &o, &r, Dir::Reply, SYN | ACK, s(0));
    pkt(&ct, &o, &r, Dir::Original, ACK, s(0));
    assert_eq!(
        pkt(&ct, &o, &r, Dir::Reply, RST | ACK, s(1)),
        Track::Ok(CtState::Close)
    );
    assert!(ct.lookup(&o, s(10)).is_some());
    assert!(ct.lookup(&o, s(11)).is_none(), "CLOSE lasts 10 s");
    // A SYN to a closed port answered by RST: the entry goes at once.
    let o2 = tcp_t(40002, 81);
    let r2 = o2.invert();
    ct.insert(o2, r2, CtTag::default(), &tcp(SYN), s(0))
        .unwrap();
    assert_eq!(
        pkt(&ct, &o2, &r2, Dir::Reply, RST | ACK, s(0)),
        Track::Closed
    );
    assert!(ct.lookup(&o2, s(0)).is_none());
}

#[test]
fn tcp_first_packet_must_be_syn_unless_liberal() {
    let ct = table(64);
    let o = tcp_t(40003, 80);
    for f in [ACK, SYN | ACK, FIN | ACK, RST, 0] {
        assert_eq!(
            ct.insert(o, o.invert(), CtTag::default(), &tcp(f), s(0)),
            Err(InsertError::Invalid(InvalidReason::TcpNotSyn))
        );
    }
    assert_eq!(ct.counters().invalid, 5);
    assert!(ct.is_empty());
    let lib = Conntrack::new(CtConfig {
        max_entries: 64,
        liberal: true,
        ..CtConfig::default()
    })
    .unwrap();
    let h = lib
        .insert(o, o.invert(), CtTag::default(), &tcp(ACK | PSH), s(0))
        .unwrap();
    assert_eq!(h.state, CtState::Established);
    // Linux picks up only the ACK class; RST, FIN and SYN-ACK stay invalid.
    let o2 = tcp_t(40004, 80);
    for f in [RST | ACK, FIN | ACK, SYN | ACK] {
        assert!(lib
            .insert(o2, o2.invert(), CtTag::default(), &tcp(f), s(0))
            .is_err());
    }
    // A picked-up connection becomes ASSURED once the other side answers and traffic goes on.
    let r = o.invert();
    assert_eq!(
        pkt(&lib, &o, &r, Dir::Reply, ACK, s(1)),
        Track::Ok(CtState::Established)
    );
    assert!(!lib.lookup(&o, s(1)).unwrap().status.assured());
    pkt(&lib, &o, &r, Dir::Original, ACK, s(1));
    assert!(lib.lookup(&o, s(1)).unwrap().status.assured());
}

#[test]
fn tcp_invalid_transitions_are_counted_and_change_nothing() {
    let ct = table(64);
    let o = tcp_t(40005, 80);
    let r = o.invert();
    ct.insert(o, r, CtTag::default(), &tcp(SYN), s(0)).unwrap();
    // ACK from the client before any SYN-ACK: sSS -> sIV.
    assert_eq!(
        pkt(&ct, &o, &r, Dir::Original, ACK, s(1)),
        Track::Invalid(InvalidReason::TcpTransition)
    );
    // FIN from the server in SYN_SENT: invalid.
    assert_eq!(
        pkt(&ct, &o, &r, Dir::Reply, FIN, s(1)),
        Track::Invalid(InvalidReason::TcpTransition)
    );
    // ACK from the server in SYN_SENT: ignored (half-open).
    assert_eq!(pkt(&ct, &o, &r, Dir::Reply, ACK, s(1)), Track::Ignored);
    assert_eq!(ct.counters().invalid, 2);
    let v = ct.dump(s(1));
    assert_eq!(v[0].state, Some(CtState::SynSent));
    assert_eq!((v[0].orig_packets, v[0].reply_packets), (1, 0));
    assert_eq!(v[0].timeout_secs, 119, "invalid packets do not refresh");
    // A UDP packet on a TCP entry.
    let h = ct.lookup(&o, s(1)).unwrap();
    assert_eq!(
        ct.track(&h, &UDP, s(1)),
        Track::Invalid(InvalidReason::KindMismatch)
    );
}

/// Sequences of (dir, flags) with the states Linux's table gives after each packet.
#[test]
fn transitions_match_linux_table() {
    use CtState::{Close, Established, FinWait, LastAck, SynRecv, SynSent, SynSent2, TimeWait};
    use Dir::{Original as O, Reply as R};
    type Step = (Dir, u8, Option<CtState>);
    let cases: &[&[Step]] = &[
        // Simultaneous open.
        &[
            (R, SYN, Some(SynSent2)),
            (R, SYN | ACK, Some(SynRecv)),
            (O, ACK, Some(Established)),
        ],
        // Retransmitted SYN, then SYN-ACK, retransmitted SYN-ACK (ignored), ACK.
        &[
            (O, SYN, Some(SynSent)),
            (R, SYN | ACK, Some(SynRecv)),
            (R, SYN | ACK, None),
            (O, ACK, Some(Established)),
            (O, ACK | PSH, Some(Established)),
            (R, SYN | ACK, None),
        ],
        // Server closes first.
        &[
            (R, SYN | ACK, Some(SynRecv)),
            (O, ACK, Some(Established)),
            (R, FIN | ACK, Some(FinWait)),
            (O, FIN | ACK, Some(LastAck)),
            (R, ACK, Some(TimeWait)),
            (O, ACK, Some(TimeWait)),
        ],
        // Close from SYN_RECV and a FIN retransmission.
        &[
            (R, SYN | ACK, Some(SynRecv)),
            (O, FIN, Some(FinWait)),
            (O, FIN, Some(LastAck)),
            (O, FIN, Some(LastAck)),
            (R, ACK, Some(TimeWait)),
        ],
        // RST from the client mid-stream; packets after CLOSE stay CLOSE.
        &[
            (R, SYN | ACK, Some(SynRecv)),
            (O, ACK, Some(Established)),
            (O, RST, Some(Close)),
            (R, ACK, Some(Close)),
            (R, FIN, Some(Close)),
        ],
    ];
    for (n, case) in cases.iter().enumerate() {
        let ct = table(16);
        let o = tcp_t(41000 + n as u16, 80);
        let r = o.invert();
        ct.insert(o, r, CtTag::default(), &tcp(SYN), s(0)).unwrap();
        let mut state = SynSent;
        for (i, &(dir, f, want)) in case.iter().enumerate() {
            // The table itself, cell by cell.
            let cell = tcp::next(dir, f, state);
            let got = pkt(&ct, &o, &r, dir, f, s(1));
            match want {
                Some(w) => {
                    assert_eq!(cell, tcp::Next::To(w), "case {n} step {i}");
                    assert_eq!(got, Track::Ok(w), "case {n} step {i}");
                    state = w;
                }
                None => {
                    assert_eq!(cell, tcp::Next::Ignore, "case {n} step {i}");
                    assert_eq!(got, Track::Ignored, "case {n} step {i}");
                }
            }
            assert_eq!(ct.lookup(&o, s(1)).unwrap().state, state);
        }
    }
}

#[test]
fn udp_30s_then_120s_after_reply_and_exact_boundaries() {
    let ct = table(64);
    let o = udp_t(1);
    let r = o.invert();
    ct.insert(o, r, CtTag::default(), &UDP, s(100)).unwrap();
    assert!(ct
        .lookup(&o, Instant::from_micros(130_000_000 - 1))
        .is_some());
    assert!(ct.lookup(&o, s(130)).is_none(), "30 s unreplied");
    assert!(!ct.tuple_in_use(&r, s(130)));
    // Again, now with a reply.
    ct.insert(o, r, CtTag::default(), &UDP, s(200)).unwrap();
    let h = ct.lookup(&r, s(201)).unwrap();
    assert_eq!(h.dir, Dir::Reply);
    assert_eq!(ct.track(&h, &UDP, s(201)), Track::Ok(CtState::None));
    let h = ct.lookup(&o, s(201)).unwrap();
    assert!(h.status.seen_reply() && !h.status.assured());
    assert!(ct.lookup(&o, s(230)).is_some());
    assert!(
        ct.lookup(&o, s(231)).is_none(),
        "replied, not yet assured: 30 s"
    );
    // Once more: request, reply, request -> assured, 120 s.
    ct.insert(o, r, CtTag::default(), &UDP, s(300)).unwrap();
    let h = ct.lookup(&r, s(300)).unwrap();
    ct.track(&h, &UDP, s(300));
    let h = ct.lookup(&o, s(301)).unwrap();
    ct.track(&h, &UDP, s(301));
    let h = ct.lookup(&o, s(301)).unwrap();
    assert!(h.status.assured());
    assert!(ct.lookup(&o, s(420)).is_some());
    assert!(ct.lookup(&o, s(421)).is_none());
    // Sweep frees what lookups already ignore.
    assert_eq!(ct.len(), 1);
    assert_eq!(ct.sweep(s(421), 1000), 1);
    assert_eq!(ct.len(), 0);
    assert_eq!(ct.counters().expired, 3);
}

#[test]
fn refresh_is_lazy_but_state_changes_are_exact() {
    let ct = table(16);
    let o = udp_t(7);
    ct.insert(o, o.invert(), CtTag::default(), &UDP, s(0))
        .unwrap();
    let h = ct.lookup(&o, s(0)).unwrap();
    // 0.5 s later: not refreshed (within REFRESH).
    ct.track(&h, &UDP, Instant::from_millis(500));
    assert!(ct.lookup(&o, Instant::from_millis(29_999)).is_some());
    assert!(ct.lookup(&o, s(30)).is_none());
    // But a packet a full second later refreshes.
    let ct = table(16);
    ct.insert(o, o.invert(), CtTag::default(), &UDP, s(0))
        .unwrap();
    let h = ct.lookup(&o, s(0)).unwrap();
    ct.track(&h, &UDP, s(1));
    assert!(ct.lookup(&o, s(30)).is_some());
    assert!(ct.lookup(&o, s(31)).is_none());
}

#[test]
fn icmp_echo_request_creates_reply_matches() {
    let ct = table(16);
    let o = Tuple {
        src: ip(10, 244, 1, 2),
        dst: ip(8, 8, 8, 8),
        sport: 0x1234,
        dport: 0x1234,
        proto: 1,
        zone: 0,
    };
    let req = Pkt {
        kind: L4Kind::IcmpEcho { request: true },
        tcp_flags: 0,
        len: 84,
    };
    let rep = Pkt {
        kind: L4Kind::IcmpEcho { request: false },
        ..req
    };
    assert_eq!(
        ct.insert(o, o.invert(), CtTag::default(), &rep, s(0)),
        Err(InsertError::Invalid(InvalidReason::IcmpNotRequest))
    );
    let other = Pkt {
        kind: L4Kind::Other,
        ..req
    };
    assert!(ct
        .insert(o, o.invert(), CtTag::default(), &other, s(0))
        .is_err());
    ct.insert(o, o.invert(), CtTag::default(), &req, s(0))
        .unwrap();
    let h = ct.lookup(&o.invert(), s(1)).unwrap();
    assert_eq!(h.dir, Dir::Reply);
    assert_eq!(
        ct.track(&h, &req, s(1)),
        Track::Invalid(InvalidReason::IcmpDirection)
    );
    assert_eq!(ct.track(&h, &rep, s(1)), Track::Ok(CtState::None));
    let err = Pkt {
        kind: L4Kind::IcmpError { inner_l3: 28 },
        ..req
    };
    assert_eq!(ct.track(&h, &err, s(1)), Track::Related);
    assert!(ct.lookup(&o, s(30)).is_some());
    assert!(ct.lookup(&o, s(31)).is_none(), "30 s after the reply");
    let line = {
        ct.insert(o, o.invert(), CtTag::default(), &req, s(100))
            .unwrap();
        ct.fmt_dump(s(100))
    };
    assert_eq!(
        line,
        "icmp     1 30 src=10.244.1.2 dst=8.8.8.8 type=8 code=0 id=4660 packets=1 bytes=84 \
         [UNREPLIED] src=8.8.8.8 dst=10.244.1.2 type=0 code=0 id=4660 packets=0 bytes=0 \
         mark=0 use=1\n"
    );
}

#[test]
fn generic_protocol_600s() {
    let ct = table(16);
    let o = Tuple {
        src: ip(10, 0, 0, 1),
        dst: ip(10, 0, 0, 2),
        sport: 0,
        dport: 0,
        proto: 47,
        zone: 0,
    };
    let p = Pkt {
        kind: L4Kind::Other,
        tcp_flags: 0,
        len: 100,
    };
    ct.insert(o, o.invert(), CtTag::default(), &p, s(0))
        .unwrap();
    assert!(ct.lookup(&o, s(599)).is_some());
    assert!(ct.lookup(&o, s(600)).is_none());
    assert!(ct
        .insert(o, o.invert(), CtTag::default(), &tcp(SYN), s(0))
        .is_err());
}

#[test]
fn dnat_reply_found_from_reply_side() {
    let ct = table(64);
    // client 10.244.1.2:40000 -> ClusterIP 10.96.0.10:80, DNAT to 10.244.1.3:8080.
    let o = tcp_t(40000, 80);
    let r = Tuple {
        src: ip(10, 244, 1, 3),
        dst: o.src,
        sport: 8080,
        dport: 40000,
        proto: 6,
        zone: 0,
    };
    let tag = CtTag {
        service: 7,
        endpoint: 3,
        mark: 0x10,
        ..CtTag::default()
    };
    let h = ct.insert(o, r, tag, &tcp(SYN), s(0)).unwrap();
    assert!(h.status.dnat() && !h.status.snat());
    assert!(ct.lookup(&o.invert(), s(0)).is_none(), "not the inverse");
    let b = ct.lookup(&r, s(0)).unwrap();
    assert_eq!(b.dir, Dir::Reply);
    assert_eq!((b.orig, b.reply, b.id), (o, r, h.id));
    assert_eq!((b.service, b.endpoint, b.mark), (7, 3, 0x10));
    assert!(ct.tuple_in_use(&r, s(0)));
    assert!(ct.tuple_in_use(&o, s(0)));
    // A second client to the same endpoint port would clash on the reply tuple.
    let o2 = tcp_t(40000, 81);
    match ct.insert(o2, r, tag, &tcp(SYN), s(0)) {
        Err(InsertError::Clash { existing: Some(e) }) => assert_eq!(e.id, h.id),
        x => panic!("{x:?}"),
    }
    // Inserting the same connection again returns the live one.
    match ct.insert(o, r, tag, &tcp(SYN), s(0)) {
        Err(InsertError::Clash { existing: Some(e) }) => {
            assert_eq!((e.id, e.dir), (h.id, Dir::Original))
        }
        x => panic!("{x:?}"),
    }
    assert_eq!(ct.counters().clash, 2);
    // Remove by id; a stale id does nothing.
    assert!(ct.remove(h.id));
    assert!(!ct.remove(h.id));
    assert!(ct.lookup(&r, s(0)).is_none());
    let h2 = ct.insert(o, r, tag, &tcp(SYN), s(0)).unwrap();
    assert_ne!(h2.id, h.id);
    assert_eq!(ct.track(&h, &tcp(SYN), s(0)), Track::Gone);
}

#[test]
fn bounded_early_drop_then_full() {
    let max = 1024;
    let ct = table(max);
    let mut failed = 0;
    for i in 0..(2 * max as u32) {
        let o = udp_t(i);
        match ct.insert(o, o.invert(), CtTag::default(), &UDP, s(0)) {
            Ok(_) => {}
            Err(InsertError::Full) => failed += 1,
            Err(e) => panic!("{e:?}"),
        }
        assert!(ct.len() <= max);
    }
    let c = ct.counters();
    assert_eq!(c.entries, max);
    assert_eq!(c.early_drop + failed, max as u64, "{c:?}");
    assert!(c.early_drop >= max as u64 * 9 / 10, "{c:?}");
    assert_eq!(ct.dump(s(0)).len(), max);

    // All entries assured: nothing may be dropped.
    let ct = table(max);
    for i in 0..max as u32 {
        let o = udp_t(i);
        let h = ct
            .insert(o, o.invert(), CtTag::default(), &UDP, s(0))
            .unwrap();
        let back = ct.lookup(&o.invert(), s(0)).unwrap();
        ct.track(&back, &UDP, s(0));
        ct.track(&h, &UDP, s(0));
    }
    assert!(ct.dump(s(0)).iter().all(|v| v.assured));
    for i in 0..100u32 {
        let o = udp_t(100_000 + i);
        assert_eq!(
            ct.insert(o, o.invert(), CtTag::default(), &UDP, s(1)),
            Err(InsertError::Full)
        );
    }
    let c = ct.counters();
    assert_eq!((c.insert_failed, c.early_drop, c.entries), (100, 0, max));
    // Once they expire (120 s), their slots are reusable at once, without a sweep.
    let o = udp_t(200_000);
    assert!(ct
        .insert(o, o.invert(), CtTag::default(), &UDP, s(121))
        .is_ok());
    assert!(ct.len() <= max);
}

#[test]
fn retain_flushes_by_endpoint() {
    let ct = table(64);
    for i in 0..10u32 {
        let o = udp_t(i);
        let tag = CtTag {
            endpoint: i % 2,
            ..CtTag::default()
        };
        ct.insert(o, o.invert(), tag, &UDP, s(0)).unwrap();
    }
    assert_eq!(ct.retain(s(1), |v| v.endpoint != 1), 5);
    assert_eq!(ct.len(), 5);
    assert!(ct.dump(s(1)).iter().all(|v| v.endpoint == 0));
    assert_eq!(ct.counters().removed, 5);
}

#[test]
fn sweep_is_incremental() {
    let ct = table(256);
    for i in 0..200u32 {
        let o = udp_t(i);
        ct.insert(o, o.invert(), CtTag::default(), &UDP, s(0))
            .unwrap();
    }
    let mut freed = 0;
    let mut calls = 0;
    while freed < 200 {
        let n = ct.sweep(s(31), 16);
        assert!(n <= 16);
        freed += n;
        calls += 1;
    }
    assert_eq!(calls, 200_usize.div_ceil(16), "resumes where it stopped");
    assert!(ct.is_empty());
}

#[test]
fn fmt_dump_tcp_and_udp() {
    let ct = table(64);
    let o = tcp_t(40000, 80);
    let r = Tuple {
        src: ip(10, 244, 1, 3),
        dst: o.src,
        sport: 8080,
        dport: 40000,
        proto: 6,
        zone: 0,
    };
    let now = Instant::from_millis(1_000);
    ct.insert(o, r, CtTag::default(), &tcp(SYN), now).unwrap();
    let b = ct.lookup(&r, now).unwrap();
    ct.track(
        &b,
        &Pkt {
            len: 60,
            ..tcp(SYN | ACK)
        },
        now,
    );
    let f = ct.lookup(&o, now).unwrap();
    for _ in 0..4 {
        ct.track(&f, &tcp(ACK), now);
    }
    for _ in 0..3 {
        ct.track(
            &b,
            &Pkt {
                len: 146,
                ..tcp(ACK)
            },
            now,
        );
    }
    let u = udp_t(5);
    ct.insert(u, u.invert(), CtTag::default(), &UDP, now)
        .unwrap();
    let later = Instant::from_millis(1_500);
    assert_eq!(
        ct.fmt_dump(later),
        "tcp      6 431999 ESTABLISHED src=10.244.1.2 dst=10.96.0.10 sport=40000 dport=80 \
         packets=5 bytes=300 src=10.244.1.3 dst=10.244.1.2 sport=8080 dport=40000 packets=4 \
         bytes=498 [ASSURED] mark=0 use=1\n\
         udp      17 29 src=10.244.0.5 dst=10.96.0.10 sport=1005 dport=53 packets=1 bytes=100 \
         [UNREPLIED] src=10.96.0.10 dst=10.244.0.5 sport=53 dport=1005 packets=0 bytes=0 \
         mark=0 use=1\n"
    );
    let v = ct.dump(later);
    assert_eq!(v[0].protocol, "tcp");
    assert_eq!(v[0].state.map(CtState::name), Some("ESTABLISHED"));
    assert_eq!((v[1].state, v[1].unreplied), (None, true));
}

#[test]
fn stale_hits_never_touch_reused_slots() {
    let ct = table(1);
    let a = udp_t(1);
    let ha = ct
        .insert(a, a.invert(), CtTag::default(), &UDP, s(0))
        .unwrap();
    assert!(ct.remove(ha.id));
    let b = udp_t(2);
    let hb = ct
        .insert(b, b.invert(), CtTag::default(), &UDP, s(0))
        .unwrap();
    assert_eq!(ha.id.slot, hb.id.slot);
    assert_eq!(ct.track(&ha, &UDP, s(0)), Track::Gone);
    assert!(!ct.remove(ha.id));
    let v = ct.dump(s(0));
    assert_eq!((v.len(), v[0].orig_packets), (1, 1));
}

// ---- model-based property test -----------------------------------------------------------

#[derive(Debug, Clone)]
pub(super) enum Op {
    /// Insert connection k (UDP), reply NAT'd when the flag is set.
    Insert(u8, bool),
    Lookup(u8, bool),
    /// A packet on connection k, in the reply direction when the flag is set.
    Packet(u8, bool),
    Remove(u8),
    Advance(u8),
    Sweep(u8),
}

pub(super) fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..24, any::<bool>()).prop_map(|(k, n)| Op::Insert(k, n)),
        4 => (0u8..24, any::<bool>()).prop_map(|(k, d)| Op::Lookup(k, d)),
        3 => (0u8..24, any::<bool>()).prop_map(|(k, d)| Op::Packet(k, d)),
        1 => (0u8..24).prop_map(Op::Remove),
        2 => (0u8..40).prop_map(Op::Advance),
        1 => (1u8..64).prop_map(Op::Sweep),
    ]
}

fn conn(k: u8, nat: bool) -> (Tuple, Tuple) {
    let o = udp_t(u32::from(k));
    let r = if nat {
        Tuple {
            src: ip(10, 1, 0, k),
            sport: 9000,
            ..o.invert()
        }
    } else {
        o.invert()
    };
    (o, r)
}

/// The model of one connection: its tuples, when it was last seen, its status.
#[derive(Debug, Clone, Copy)]
struct M<A: Family> {
    orig: Tuple<A>,
    reply: Tuple<A>,
    last: u64,
    seen_reply: bool,
    assured: bool,
    id: CtId,
}

impl<A: Family> M<A> {
    fn live(&self, now: u64) -> bool {
        now < self.last + if self.assured { 120 } else { 30 }
    }
}

/// Runs `ops` on a 64-entry table of the family and on a HashMap model (from each tuple to its
/// connection and direction), connection k's tuples given by `conn`: lookups, tracking,
/// removal, expiry and the table's invariants must agree with the model's.
pub(super) fn table_matches_model<A: TupleWords<W>, const W: usize>(
    ops: Vec<Op>,
    conn: impl Fn(u8, bool) -> (Tuple<A>, Tuple<A>),
) -> Result<(), TestCaseError> {
    let ct = CtTable::<Tuple<A>, W>::new(CtConfig {
        max_entries: 64,
        ..CtConfig::default()
    })
    .unwrap();
    let mut model: HashMap<Tuple<A>, (M<A>, Dir)> = HashMap::new();
    let mut now = 0u64;
    for o in ops {
        let t = Instant::from_secs(now);
        model.retain(|_, (m, _)| m.live(now));
        match o {
            Op::Insert(k, nat) => {
                let (orig, reply) = conn(k, nat);
                let clash = model.get(&orig).or_else(|| model.get(&reply)).map(|x| x.0);
                match (clash, ct.insert(orig, reply, CtTag::default(), &UDP, t)) {
                    (Some(m), Err(InsertError::Clash { existing: Some(e) })) => {
                        prop_assert_eq!(e.id, m.id);
                    }
                    (None, Ok(h)) => {
                        let m = M {
                            orig,
                            reply,
                            last: now,
                            seen_reply: false,
                            assured: false,
                            id: h.id,
                        };
                        model.insert(orig, (m, Dir::Original));
                        model.insert(reply, (m, Dir::Reply));
                    }
                    (c, g) => prop_assert!(false, "model {:?} got {:?}", c, g),
                }
            }
            Op::Lookup(k, rdir) => {
                for nat in [false, true] {
                    let (orig, reply) = conn(k, nat);
                    let q = if rdir { reply } else { orig };
                    let want = model.get(&q).map(|(m, d)| (m.id, *d));
                    prop_assert_eq!(ct.lookup(&q, t).map(|h| (h.id, h.dir)), want);
                    prop_assert_eq!(ct.tuple_in_use(&q, t), want.is_some());
                }
            }
            Op::Packet(k, rdir) => {
                let (orig, _) = conn(k, false);
                if let Some((mut m, _)) = model.get(&orig).copied() {
                    let q = if rdir { m.reply } else { m.orig };
                    let h = ct.lookup(&q, t).unwrap();
                    prop_assert_eq!(ct.track(&h, &UDP, t), Track::Ok(CtState::None));
                    if m.seen_reply {
                        m.assured = true;
                    }
                    if rdir {
                        m.seen_reply = true;
                    }
                    m.last = now;
                    model.insert(m.orig, (m, Dir::Original));
                    model.insert(m.reply, (m, Dir::Reply));
                    let h = ct.lookup(&q, t).unwrap();
                    prop_assert_eq!(h.status.seen_reply(), m.seen_reply);
                    prop_assert_eq!(h.status.assured(), m.assured);
                }
            }
            Op::Remove(k) => {
                let (orig, _) = conn(k, false);
                if let Some((m, _)) = model.get(&orig).copied() {
                    prop_assert!(ct.remove(m.id));
                    model.remove(&m.orig);
                    model.remove(&m.reply);
                }
            }
            Op::Advance(d) => now += u64::from(d),
            Op::Sweep(b) => {
                ct.sweep(t, usize::from(b));
            }
        }
        prop_assert!(ct.len() <= 64);
        let live = model
            .values()
            .filter(|(m, d)| *d == Dir::Original && m.live(now))
            .count();
        prop_assert_eq!(ct.dump(Instant::from_secs(now)).len(), live);
    }
    ct.check_invariants().map_err(TestCaseError::fail)
}

proptest! {
    #[test]
    fn matches_model(ops in proptest::collection::vec(op(), 1..200)) {
        table_matches_model(ops, conn)?;
    }
}

// ---- concurrency -------------------------------------------------------------------------

/// Connection k's tuples: a NAT'd reply whose fields all depend on k, so a torn read would
/// mix two connections' values.
fn pair(k: u32) -> (Tuple, Tuple) {
    let o = Tuple {
        src: Ipv4Addr::from(0x0a00_0000 | k),
        dst: Ipv4Addr::from(0x0b00_0000 | k),
        sport: k as u16,
        dport: (k >> 3) as u16 | 1,
        proto: 17,
        zone: 0,
    };
    let r = Tuple {
        src: Ipv4Addr::from(0x0c00_0000 | k),
        dst: Ipv4Addr::from(0x0d00_0000 | k),
        sport: (k as u16).wrapping_mul(7),
        dport: (k as u16).wrapping_mul(13),
        proto: 17,
        zone: 0,
    };
    (o, r)
}

#[test]
fn concurrent_readers_never_see_torn_entries() {
    const KEYS: u32 = 512;
    let ct = Arc::new(table(64));
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..2u32)
        .map(|w| {
            let ct = ct.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut hits = 0u64;
                let mut k = w;
                while !stop.load(Ordering::Relaxed) {
                    k = (k.wrapping_mul(1_103_515_245).wrapping_add(12345)) % KEYS;
                    let (o, r) = pair(k);
                    for (q, dir) in [(o, Dir::Original), (r, Dir::Reply)] {
                        if let Some(h) = ct.lookup(&q, s(0)) {
                            assert_eq!((h.orig, h.reply, h.dir), (o, r, dir), "torn read");
                            assert_eq!(h.service, k);
                            hits += 1;
                            let _ = ct.track(&h, &UDP, s(0));
                        }
                    }
                }
                hits
            })
        })
        .collect();
    // Writer: inserts, removes, and lets entries expire and sweeps, reusing the 64 slots
    // over and over with different connections.
    let mut live: Vec<CtId> = Vec::new();
    let mut now = 0u64;
    for round in 0..200_000u32 {
        let k = round.wrapping_mul(2_654_435_761) % KEYS;
        let (o, r) = pair(k);
        let tag = CtTag {
            service: k,
            ..CtTag::default()
        };
        match ct.insert(o, r, tag, &UDP, s(now)) {
            Ok(h) => live.push(h.id),
            Err(InsertError::Clash { .. } | InsertError::Full) => {}
            Err(e) => panic!("{e:?}"),
        }
        if live.len() > 40 {
            let id = live.swap_remove((round as usize * 7) % live.len());
            ct.remove(id);
        }
        if round % 1000 == 0 {
            now += 31;
            ct.sweep(s(now), 64);
            live.clear();
        }
        assert!(ct.len() <= 64);
    }
    stop.store(true, Ordering::Relaxed);
    let hits: u64 = readers.into_iter().map(|t| t.join().unwrap()).sum();
    assert!(hits > 0);
}

#[test]
fn concurrent_inserts_of_the_same_connections_keep_one_entry_each() {
    const KEYS: u32 = 2000;
    let ct = Arc::new(table(4096));
    let threads: Vec<_> = (0..3)
        .map(|_| {
            let ct = ct.clone();
            std::thread::spawn(move || {
                let mut won = 0u32;
                for k in 0..KEYS {
                    let (o, r) = pair(k);
                    match ct.insert(o, r, CtTag::default(), &UDP, s(0)) {
                        Ok(_) => won += 1,
                        Err(InsertError::Clash { .. }) => {}
                        Err(e) => panic!("{e:?}"),
                    }
                }
                won
            })
        })
        .collect();
    let won: u32 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    let d = ct.dump(s(0));
    let mut origs: Vec<_> = d.iter().map(|v| v.orig).collect();
    origs.sort();
    origs.dedup();
    assert_eq!(origs.len(), d.len(), "no duplicate entries");
    // Every key ends up present exactly once (a both-lose race is possible but rare).
    assert_eq!(won as usize, d.len());
    assert!(d.len() as u32 >= KEYS - 5, "{}", d.len());
    assert_eq!(ct.len(), d.len());
}

#[test]
fn hashmap_model_sanity() {
    // A HashMap of tuples to ids stays consistent with lookups after many inserts/removes.
    let ct = table(1024);
    let mut m: HashMap<Tuple, CtId> = HashMap::new();
    for i in 0..5000u32 {
        let (o, r) = pair(i % 700);
        if let Some(id) = m.remove(&o) {
            assert!(ct.remove(id));
            m.remove(&r);
        } else if let Ok(h) = ct.insert(o, r, CtTag::default(), &UDP, s(0)) {
            m.insert(o, h.id);
            m.insert(r, h.id);
        }
    }
    for (t, id) in &m {
        assert_eq!(ct.lookup(t, s(0)).map(|h| h.id), Some(*id));
    }
    assert_eq!(ct.len() * 2, m.len());
}

#[test]
fn filling_to_max_never_overflows_the_index() {
    // Two-choice placement keeps both candidate buckets of a tuple from being full, even with
    // every entry live (the index is then exactly half full).
    for round in 0..3u32 {
        let max = 65_536;
        let ct = table(max);
        for i in 0..max as u32 {
            let (o, r) = pair(i ^ (round << 20));
            assert!(
                ct.insert(o, r, CtTag::default(), &UDP, s(0)).is_ok(),
                "insert {i} of round {round}"
            );
        }
        assert_eq!(ct.len(), max);
        assert_eq!(ct.counters().insert_failed, 0);
    }
}

#[test]
fn conntrack_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Conntrack>();
}

#[test]
fn concurrent_insert_remove_keeps_len_exact_and_bounded() {
    const MAX: usize = 256;
    let ct = Arc::new(table(MAX));
    let stop = Arc::new(AtomicBool::new(false));
    let monitor = {
        let ct = ct.clone();
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                assert!(ct.len() <= MAX, "len {}", ct.len());
            }
        })
    };
    let workers: Vec<_> = (0..2u32)
        .map(|w| {
            let ct = ct.clone();
            std::thread::spawn(move || {
                for round in 0..50_000u32 {
                    let k = (round.wrapping_mul(2_654_435_761) >> 8) % 1024;
                    let (o, r) = pair(k);
                    match ct.insert(o, r, CtTag::default(), &UDP, s(0)) {
                        Ok(h) if (round + w) % 3 == 0 => {
                            ct.remove(h.id);
                        }
                        Err(InsertError::Clash { existing: Some(h) }) => {
                            ct.remove(h.id);
                        }
                        _ => {}
                    }
                }
            })
        })
        .collect();
    for t in workers {
        t.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    monitor.join().unwrap();
    let d = ct.dump(s(0));
    assert_eq!(ct.len(), d.len());
    let mut origs: Vec<_> = d.iter().map(|v| v.orig).collect();
    origs.sort();
    origs.dedup();
    assert_eq!(origs.len(), d.len(), "no duplicate entries");
    for v in &d {
        assert_eq!(ct.lookup(&v.reply, s(0)).map(|h| h.id), Some(v.id));
    }
}

#[test]
fn counters_stay_exact_with_more_threads_than_owned_shards() {
    // 40 threads at once: 16 at most own a shard (plain load + store), the others share one
    // (atomic adds); threads exiting hand their shard to later ones. No count may be lost.
    let ct = Arc::new(table(64));
    let (o, r) = pair(1);
    ct.insert(o, r, CtTag::default(), &UDP, s(0)).unwrap();
    let before = ct.counters().found;
    let start = Arc::new(std::sync::Barrier::new(40));
    let threads: Vec<_> = (0..40u64)
        .map(|i| {
            let (ct, start) = (ct.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                for _ in 0..1000 + i {
                    assert!(ct.lookup(&o, s(0)).is_some());
                }
                // A second wave on fresh threads reuses the shards released above.
                std::thread::spawn(move || {
                    for _ in 0..100 {
                        assert!(ct.lookup(&r, s(0)).is_some());
                    }
                })
                .join()
                .unwrap();
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let n: u64 = (0..40).map(|i| 1000 + i + 100).sum();
    assert_eq!(ct.counters().found - before, n);
}

#[test]
fn prefetch_entry_then_lookup_loc_matches_lookup() {
    let ct = table(1024);
    for i in 0..500 {
        let (o, r) = pair(i);
        ct.insert(o, r, CtTag::default(), &UDP, s(0)).unwrap();
    }
    for i in 0..600 {
        let (o, r) = pair(i);
        for t in [o, r] {
            let l = ct.locate(&t);
            ct.prefetch(&l);
            ct.prefetch_entry(&l);
            assert_eq!(ct.lookup_loc(&l, s(0)), ct.lookup(&t, s(0)));
            assert_eq!(ct.lookup(&t, s(0)).is_some(), i < 500);
        }
    }
}

/// A tag asking for the source's limit.
fn limited() -> CtTag {
    CtTag {
        status: CtStatus(CtStatus::SOURCE_LIMITED),
        ..CtTag::default()
    }
}

/// UDP flow `i` from `src`.
fn flow_from(src: Ipv4Addr, i: u16) -> Tuple {
    Tuple {
        src,
        sport: 20_000 + i,
        ..udp_t(0)
    }
}

/// With `max_per_source`, a source's inserts past its limit are refused (the others' are
/// not), inserts that do not ask for the limit are never refused, and the counts come back
/// however an entry goes: removed, expired and swept, early-dropped, retained away.
#[test]
fn the_per_source_limit_refuses_one_source_and_frees_with_its_entries() {
    let ct = Conntrack::new(CtConfig {
        max_entries: 64,
        max_per_source: 5,
        ..CtConfig::default()
    })
    .unwrap();
    let (a, b) = (ip(10, 244, 1, 2), ip(10, 244, 1, 3));
    let mut ids = Vec::new();
    for i in 0..5 {
        let t = flow_from(a, i);
        ids.push(ct.insert(t, t.invert(), limited(), &UDP, s(1)).unwrap().id);
    }
    let sixth = flow_from(a, 5);
    assert_eq!(
        ct.insert(sixth, sixth.invert(), limited(), &UDP, s(1))
            .unwrap_err(),
        InsertError::SourceLimit
    );
    assert_eq!(ct.source_count(&sixth), 5);
    // Another source is not affected; an insert without the tag bit is not limited.
    for i in 0..5 {
        let t = flow_from(b, i);
        ct.insert(t, t.invert(), limited(), &UDP, s(1)).unwrap();
    }
    let free = flow_from(a, 100);
    ct.insert(free, free.invert(), CtTag::default(), &UDP, s(1))
        .unwrap();
    // An invalid insert takes no count, a refused one neither.
    let syn_less = Tuple {
        proto: 6,
        ..flow_from(b, 50)
    };
    assert!(matches!(
        ct.insert(syn_less, syn_less.invert(), limited(), &tcp(ACK), s(1)),
        Err(InsertError::Invalid(_))
    ));
    let again = flow_from(b, 0);
    assert!(matches!(
        ct.insert(again, again.invert(), limited(), &UDP, s(1)),
        Err(InsertError::SourceLimit)
    ));
    assert_eq!(ct.source_count(&again), 5);
    // Removed by id: one more fits.
    assert!(ct.remove(ids[0]));
    assert_eq!(ct.source_count(&sixth), 4);
    ct.insert(sixth, sixth.invert(), limited(), &UDP, s(1))
        .unwrap();
    // Retained away.
    assert_eq!(ct.retain(s(1), |v| v.orig != sixth), 1);
    assert_eq!(ct.source_count(&sixth), 4);
    // Expired and swept (UDP: 30 s): every count comes back.
    ct.sweep(s(40), 1000);
    assert!(ct.is_empty());
    assert_eq!((ct.source_count(&sixth), ct.source_count(&again)), (0, 0));
    for i in 0..5 {
        let t = flow_from(a, 200 + i);
        ct.insert(t, t.invert(), limited(), &UDP, s(40)).unwrap();
    }
    ct.check_invariants().unwrap();
}

/// Without `max_per_source` (the default) the tag bit is ignored: nothing is limited and
/// entries do not carry the bit.
#[test]
fn without_a_limit_the_tag_bit_is_ignored() {
    let ct = table(64);
    for i in 0..40 {
        let t = flow_from(ip(10, 244, 1, 2), i);
        let h = ct.insert(t, t.invert(), limited(), &UDP, s(1)).unwrap();
        assert!(!h.status.has(CtStatus::SOURCE_LIMITED));
    }
    assert_eq!(ct.source_count(&flow_from(ip(10, 244, 1, 2), 0)), 0);
}

/// Early drop of an unassured entry to make room gives its source's count back.
#[test]
fn an_early_dropped_entry_gives_its_count_back() {
    let ct = Conntrack::new(CtConfig {
        max_entries: 4,
        max_per_source: 3,
        ..CtConfig::default()
    })
    .unwrap();
    let a = ip(10, 244, 1, 2);
    for i in 0..3 {
        let t = flow_from(a, i);
        ct.insert(t, t.invert(), limited(), &UDP, s(1)).unwrap();
    }
    // Fill the table from elsewhere; each further insert early-drops one of them.
    let mut n = 0;
    for i in 0..20 {
        let t = flow_from(ip(10, 244, 2, i as u8), i);
        if ct
            .insert(t, t.invert(), CtTag::default(), &UDP, s(2))
            .is_ok()
        {
            n += 1;
        }
    }
    assert!(n > 0);
    let left = ct.dump(s(2)).iter().filter(|v| v.orig.src == a).count() as u32;
    assert_eq!(ct.source_count(&flow_from(a, 0)), left);
    ct.check_invariants().unwrap();
}

/// A TCP connection gives its source's count back when it closes (TIME_WAIT after both FINs,
/// CLOSE after a RST), as Linux's nf_conncount stops counting it: a source at its limit may
/// open another at once, without waiting for the sweep; the count is given back once (the
/// closed entry's later expiry, or its reopening by a SYN, gives nothing back again).
#[test]
fn a_closed_tcp_connection_gives_its_count_back_when_it_closes() {
    let ct = Conntrack::new(CtConfig {
        max_entries: 64,
        max_per_source: 2,
        ..CtConfig::default()
    })
    .unwrap();
    let conn = |port: u16| (tcp_t(port, 80), tcp_t(port, 80).invert());
    let open = |port: u16, now: Instant| {
        let (o, r) = conn(port);
        ct.insert(o, r, limited(), &tcp(SYN), now)?;
        pkt(&ct, &o, &r, Dir::Reply, SYN | ACK, now);
        let est = pkt(&ct, &o, &r, Dir::Original, ACK, now);
        assert_eq!(est, Track::Ok(CtState::Established));
        Ok::<_, InsertError>(())
    };
    let (a, b) = (conn(40000), conn(40001));
    open(40000, s(1)).unwrap();
    open(40001, s(1)).unwrap();
    assert_eq!(ct.source_count(&a.0), 2);
    assert_eq!(open(40002, s(1)), Err(InsertError::SourceLimit));
    // Both FINs: LAST_ACK still counts (as Linux), the last ACK closes it.
    for (dir, f) in [(Dir::Original, FIN | ACK), (Dir::Reply, FIN | ACK)] {
        pkt(&ct, &a.0, &a.1, dir, f, s(2));
    }
    assert_eq!(ct.source_count(&a.0), 2);
    assert_eq!(
        pkt(&ct, &a.0, &a.1, Dir::Original, ACK, s(2)),
        Track::Ok(CtState::TimeWait)
    );
    let h = ct.lookup(&a.0, s(2)).unwrap();
    assert!(!h.status.has(CtStatus::SOURCE_LIMITED), "{:?}", h.status);
    assert_eq!(ct.source_count(&a.0), 1);
    // At once, long before the TIME_WAIT entry expires (120 s).
    open(40002, s(2)).unwrap();
    assert_eq!(open(40003, s(2)), Err(InsertError::SourceLimit));
    // A RST of an established connection: CLOSE, given back the same way.
    assert_eq!(
        pkt(&ct, &b.0, &b.1, Dir::Reply, RST, s(3)),
        Track::Ok(CtState::Close)
    );
    assert_eq!(ct.source_count(&a.0), 1);
    // Packets of the closed connections change nothing more.
    pkt(&ct, &a.0, &a.1, Dir::Original, ACK, s(3));
    pkt(&ct, &b.0, &b.1, Dir::Original, RST, s(3));
    assert_eq!(ct.source_count(&a.0), 1);
    open(40003, s(3)).unwrap();
    assert_eq!(ct.source_count(&a.0), 2);
    // A SYN reopening the TIME_WAIT entry removes it without giving anything back again.
    let h = ct.lookup(&a.0, s(4)).unwrap();
    assert_eq!(ct.track(&h, &tcp(SYN), s(4)), Track::Reopen);
    assert_eq!(ct.source_count(&a.0), 2);
    assert_eq!(ct.len(), 3);
    // The CLOSE entry (10 s) is swept; the live ones still count.
    ct.sweep(s(30), 1000);
    assert_eq!(ct.len(), 2);
    assert_eq!(ct.source_count(&a.0), 2);
    ct.check_invariants().unwrap();
}
