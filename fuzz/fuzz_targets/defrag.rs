//! IP reassembly (`tapyard::l3::defrag`) fed arbitrary fragments of both families: the input
//! is a sequence of (family, time step, zone, IP packet) records. It never panics; what it
//! holds stays within its limits at every step; every datagram it completes cuts back into
//! fragments that, pushed again into a fresh table, give the same datagram; and once every
//! list has timed out, nothing is held.
#![no_main]
use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use tapyard::l3::defrag::{Defrag, DefragConfig, FragFamily, Pushed};
use tapyard::Instant;

/// A small table, so that the limits are reached.
fn config<A: FragFamily>() -> DefragConfig {
    DefragConfig {
        max_frags: 32,
        max_bytes: 64 << 10,
        min_frag: 64,
        ..DefragConfig::default_for::<A>()
    }
}

/// Pushes one record's packet (behind a 14-byte link header) into `t`, then checks.
fn step<A: FragFamily>(t: &mut Defrag<A>, l3: &[u8], zone: u16, now: Instant) {
    let mut frame = vec![0u8; 14];
    frame.extend_from_slice(l3);
    let Ok(Some(f)) = A::parse(l3, zone) else {
        return;
    };
    let done = t.push(&frame, 14, &f, now) == Ok(Pushed::Complete);
    let cfg = *t.config();
    assert!(t.held() <= cfg.max_frags);
    assert!(t.held_bytes() <= cfg.max_bytes);
    if !done {
        return;
    }
    let d = t.datagram().expect("a completed datagram");
    let whole = d.frame().to_vec();
    let mut buf = vec![0u8; 70_000];
    let mut frags = Vec::new();
    let (sent, skipped) = d.refragment(&mut buf, &mut |f| frags.push(f.to_vec()));
    assert_eq!((sent, skipped), (d.fragments(), 0));
    let mut again = Defrag::<A>::new(DefragConfig {
        min_frag: 0,
        ..config::<A>()
    });
    let mut complete = false;
    for f in &frags {
        let frag = A::parse(&f[14..], zone)
            .expect("a fragment cut back parses")
            .expect("and is a fragment");
        complete = again.push(f, 14, &frag, now) == Ok(Pushed::Complete);
    }
    assert!(complete);
    assert!(again.datagram().expect("complete").frame() == &whole[..]);
}

fuzz_target!(|data: &[u8]| {
    let mut t4 = Defrag::<Ipv4Addr>::new(config::<Ipv4Addr>());
    let mut t6 = Defrag::<Ipv6Addr>::new(config::<Ipv6Addr>());
    let mut now = Instant::from_secs(1);
    let mut rest = data;
    // Each record: flags (bit 0: IPv6; bits 1-3: seconds to advance), zone, a length byte
    // (x 8), the packet.
    while let [flags, zone, len, tail @ ..] = rest {
        let n = (usize::from(*len) * 8).min(tail.len());
        let (l3, next) = tail.split_at(n);
        rest = next;
        now = now + Duration::from_secs(u64::from((flags >> 1) & 7));
        let zone = u16::from(*zone & 1);
        if flags & 1 == 0 {
            step(&mut t4, l3, zone, now);
        } else {
            step(&mut t6, l3, zone, now);
        }
    }
    let later = now + Duration::from_secs(60);
    t4.expire(later);
    t6.expire(later);
    assert_eq!((t4.held(), t4.held_bytes(), t4.lists()), (0, 0, 0));
    assert_eq!((t6.held(), t6.held_bytes(), t6.lists()), (0, 0, 0));
});
