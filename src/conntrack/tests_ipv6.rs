//! The IPv6 table ([`ConntrackOf<Ipv6Addr>`](ConntrackOf)): the same state machines and invariants as the IPv4 one,
//! with five-word keys, ICMPv6 echo, and its own file.
#![allow(
    clippy::cast_possible_truncation,
    reason = "test fixtures: small loop counters narrowed into ports and address bytes"
)]
use std::net::Ipv6Addr;

use proptest::prelude::*;

use super::tcp::flags::*;
use super::tests::{op, table_matches_model, UDP};
use super::*;
use crate::time::Instant;
use crate::wire::tuple::{L4Kind, Tuple, PROTO_ICMPV6};

fn addr(s: &str) -> Ipv6Addr {
    s.parse().unwrap()
}

fn v6_table(max: usize) -> ConntrackOf<Ipv6Addr> {
    ConntrackOf::<Ipv6Addr>::new(CtConfig {
        max_entries: max,
        ..CtConfig::default()
    })
    .unwrap()
}

fn tcp(f: u8) -> Pkt {
    Pkt {
        kind: L4Kind::Tcp,
        tcp_flags: f,
        len: 80,
    }
}

/// Client `k` to an IPv6 ClusterIP, and its reply DNAT'd to an endpoint when `nat`. The
/// addresses differ only in their low 64 bits, or only in their high ones, so a table that
/// dropped either half of a word would mix connections up.
fn conn(k: u16, nat: bool) -> (Tuple<Ipv6Addr>, Tuple<Ipv6Addr>) {
    let o = Tuple {
        src: Ipv6Addr::from(0xfd00_0010_0244_0001_u128 << 64 | u128::from(k)),
        dst: addr("fd00:10:96::10"),
        sport: 1000 + k,
        dport: 53,
        proto: 17,
        zone: 0,
    };
    let r = if nat {
        Tuple {
            src: Ipv6Addr::from((0xfd00_0010_0244_0002_u128 + u128::from(k)) << 64 | 2),
            sport: 5353,
            ..o.invert()
        }
    } else {
        o.invert()
    };
    (o, r)
}

#[test]
fn entries_take_128_bytes_and_the_ipv4_ones_stay_64() {
    assert_eq!(std::mem::size_of::<super::table::Entry<5>>(), 128);
    assert_eq!(std::mem::size_of::<super::table::Entry<2>>(), 64);
    let ct = v6_table(4096);
    let per = ct.memory_bytes() / 4096;
    assert!(per <= 192 + 64, "{per} bytes per IPv6 connection");
}

#[test]
fn tcp_dnat_handshake_found_from_both_sides_and_assured() {
    let ct = v6_table(64);
    let o = Tuple {
        src: addr("fd00:10:244:1::2"),
        dst: addr("fd00:10:96::10"),
        sport: 40000,
        dport: 80,
        proto: 6,
        zone: 0,
    };
    let r = Tuple {
        src: addr("fd00:10:244:2::2"),
        sport: 8080,
        ..o.invert()
    };
    let now = Instant::from_secs(1);
    let h = ct.insert(o, r, CtTag::default(), &tcp(SYN), now).unwrap();
    assert!(h.status.dnat() && !h.status.snat());
    assert_eq!(h.state, CtState::SynSent);
    let b = ct.lookup(&r, now).unwrap();
    assert_eq!((b.id, b.dir, b.orig, b.reply), (h.id, Dir::Reply, o, r));
    assert_eq!(
        ct.track(&b, &tcp(SYN | ACK), now),
        Track::Ok(CtState::SynRecv)
    );
    let f = ct.lookup(&o, now).unwrap();
    assert_eq!(
        ct.track(&f, &tcp(ACK), now),
        Track::Ok(CtState::Established)
    );
    let f = ct.lookup(&o, now).unwrap();
    assert!(f.status.assured());
    // Another client port, and the same port from a client differing only in the high
    // half of its address, are other connections.
    assert!(ct.lookup(&Tuple { sport: 40001, ..o }, now).is_none());
    assert!(ct
        .lookup(
            &Tuple {
                src: addr("fd01:10:244:1::2"),
                ..o
            },
            now
        )
        .is_none());
    ct.check_invariants().unwrap();
}

#[test]
fn icmpv6_echo_is_tracked_by_identifier_and_icmpv4_is_not_echo_here() {
    let ct = v6_table(64);
    let o = Tuple {
        src: addr("fd00:10:244:1::2"),
        dst: addr("2001:db8::1"),
        sport: 77,
        dport: 77,
        proto: PROTO_ICMPV6,
        zone: 0,
    };
    let now = Instant::from_secs(1);
    let req = Pkt {
        kind: L4Kind::IcmpEcho { request: true },
        tcp_flags: 0,
        len: 64,
    };
    let rep = Pkt {
        kind: L4Kind::IcmpEcho { request: false },
        ..req
    };
    // A reply cannot open one.
    assert_eq!(
        ct.insert(o, o.invert(), CtTag::default(), &rep, now),
        Err(InsertError::Invalid(InvalidReason::IcmpNotRequest))
    );
    let h = ct
        .insert(o, o.invert(), CtTag::default(), &req, now)
        .unwrap();
    let b = ct.lookup(&o.invert(), now).unwrap();
    assert_eq!(b.dir, Dir::Reply);
    assert_eq!(ct.track(&b, &rep, now), Track::Ok(CtState::None));
    assert_eq!(
        ct.track(&b, &req, now),
        Track::Invalid(InvalidReason::IcmpDirection)
    );
    // 30 s, as ICMP echo in IPv4.
    assert!(ct.lookup(&o, Instant::from_secs(30)).is_some());
    assert!(ct.lookup(&o, Instant::from_secs(32)).is_none());
    let _ = h;
    // Protocol 1 in an IPv6 packet is not ICMP: tracked as a generic protocol, 600 s.
    let g = Tuple {
        proto: 1,
        sport: 0,
        dport: 0,
        ..o
    };
    let other = Pkt {
        kind: L4Kind::Other,
        ..req
    };
    ct.insert(g, g.invert(), CtTag::default(), &other, now)
        .unwrap();
    assert!(ct.lookup(&g, Instant::from_secs(500)).is_some());
}

#[test]
fn fmt_dump_prints_like_conntrack_l_f_ipv6() {
    let ct = v6_table(64);
    let now = Instant::from_millis(1_000);
    let e = Tuple {
        src: addr("fd00::1"),
        dst: addr("fd00::2"),
        sport: 9,
        dport: 9,
        proto: PROTO_ICMPV6,
        zone: 0,
    };
    let req = Pkt {
        kind: L4Kind::IcmpEcho { request: true },
        tcp_flags: 0,
        len: 64,
    };
    ct.insert(e, e.invert(), CtTag::default(), &req, now)
        .unwrap();
    let (u, r) = conn(1, true);
    ct.insert(u, r, CtTag::default(), &UDP, now).unwrap();
    assert_eq!(
        ct.fmt_dump(Instant::from_millis(1_500)),
        "udp      17 29 src=fd00:10:244:1::1 dst=fd00:10:96::10 sport=1001 dport=53 packets=1 \
         bytes=100 [UNREPLIED] src=fd00:10:244:3::2 dst=fd00:10:244:1::1 sport=5353 \
         dport=1001 packets=0 bytes=0 mark=0 use=1\n\
         icmpv6   58 29 src=fd00::1 dst=fd00::2 type=128 code=0 id=9 packets=1 bytes=64 \
         [UNREPLIED] src=fd00::2 dst=fd00::1 type=129 code=0 id=9 packets=0 bytes=0 mark=0 \
         use=1\n"
    );
    assert_eq!(ct.dump(now)[1].protocol, "icmpv6");
}

proptest! {
    #[test]
    fn ipv6_table_matches_a_hashmap_model(ops in proptest::collection::vec(op(), 1..200)) {
        table_matches_model(ops, |k, nat| conn(u16::from(k), nat))?;
    }
}

#[test]
fn full_ipv6_table_early_drops_and_stays_bounded() {
    let ct = v6_table(32);
    let now = Instant::from_secs(1);
    for k in 0..200u16 {
        let (o, r) = conn(k, k % 2 == 0);
        let _ = ct.insert(o, r, CtTag::default(), &UDP, now);
        assert!(ct.len() <= 32);
    }
    assert_eq!(ct.len(), 32);
    assert!(ct.counters().early_drop > 0);
    ct.check_invariants().unwrap();
}

// ---- the file ------------------------------------------------------------------------------

use super::persist::tests::TempFile;

fn now() -> Instant {
    crate::time::Clock::new().now()
}

#[test]
fn ipv6_entries_survive_a_reopen_of_their_file() {
    let f = TempFile::new("reopen");
    let c = CtConfig {
        max_entries: 1024,
        ..CtConfig::default()
    };
    let t0 = now();
    let (ct, rec) = ConntrackOf::<Ipv6Addr>::open_file(c, &f.0, t0).unwrap();
    assert_eq!(rec.opened, Opened::Created);
    let tag = CtTag {
        service: 4,
        endpoint: 2,
        ..CtTag::default()
    };
    for k in 0..300 {
        let (o, r) = conn(k, k % 3 == 0);
        ct.insert(o, r, tag, &UDP, t0).unwrap();
    }
    let before = ct.dump(t0);
    drop(ct);
    let (ct, rec) = ConntrackOf::<Ipv6Addr>::open_file(c, &f.0, t0).unwrap();
    assert_eq!(
        (rec.opened, rec.kept, rec.invalid),
        (Opened::Reused, 300, 0)
    );
    ct.check_invariants().unwrap();
    assert_eq!(ct.dump(t0), before);
    let (o, r) = conn(3, true);
    let h = ct.lookup(&r, t0).unwrap();
    assert_eq!(
        (h.orig, h.dir, h.service, h.endpoint),
        (o, Dir::Reply, 4, 2)
    );
}

#[test]
fn each_family_refuses_the_others_file_by_its_magic() {
    let c = CtConfig {
        max_entries: 256,
        ..CtConfig::default()
    };
    let f4 = TempFile::new("v4");
    let (ct, _) = Conntrack::open_file(c, &f4.0, now()).unwrap();
    drop(ct);
    let (ct6, rec) = ConntrackOf::<Ipv6Addr>::open_file(c, &f4.0, now()).unwrap();
    assert!(
        matches!(rec.opened, Opened::Refused(Refusal::Magic { .. })),
        "{:?}",
        rec.opened
    );
    assert!(ct6.is_empty());
    drop(ct6);
    // Now the file is an IPv6 one: the IPv4 table refuses it in turn.
    let (ct, rec) = Conntrack::open_file(c, &f4.0, now()).unwrap();
    assert!(matches!(rec.opened, Opened::Refused(Refusal::Magic { .. })));
    assert!(ct.is_empty());
}
