//! Reassembly checked against what a sender's fragmentation and a receiver's reassembly
//! must give, written once and run for both families: any order, duplicates, overlaps,
//! lies, limits, timeouts, floods, and a rewrite of the whole carried into every fragment.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use etherparse::PacketBuilder;
use proptest::prelude::*;

use super::*;
use crate::time::Instant;

/// A test's view of a family: how to build a datagram and cut it into fragments.
trait TestFamily: FragFamily {
    fn addr(n: u8) -> Self;
    /// A UDP datagram from `src` to `dst`, `len` bytes of payload (byte k = k % 251), as an
    /// Ethernet frame.
    fn datagram(src: Self, dst: Self, len: usize) -> Vec<u8>;
    /// Bytes of IP header of [`TestFamily::datagram`]'s frames.
    const IP: usize;
    /// Fragment `(offset, len)` of the datagram `whole` (an Ethernet frame), identification
    /// `id`, `more` fragments after it.
    fn fragment(whole: &[u8], offset: usize, len: usize, more: bool, id: u32) -> Vec<u8>;
    /// The datagram `whole` as its fragments of identification `id` reassemble to (over
    /// IPv4 the identification is in every header).
    fn with_id(whole: &[u8], id: u32) -> Vec<u8>;
}

fn payload(len: usize) -> Vec<u8> {
    (0..len).map(|k| u8::try_from(k % 251).unwrap()).collect()
}

impl TestFamily for Ipv4Addr {
    const IP: usize = 20;
    fn addr(n: u8) -> Ipv4Addr {
        Ipv4Addr::new(10, 244, 1, n)
    }
    fn datagram(src: Ipv4Addr, dst: Ipv4Addr, len: usize) -> Vec<u8> {
        let mut f = Vec::new();
        PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
            .ipv4(src.octets(), dst.octets(), 64)
            .udp(40000, 53)
            .write(&mut f, &payload(len))
            .unwrap();
        // No DF: a datagram that is fragmented had none.
        f[14 + 6] &= !0x40;
        family::set_checksum(&mut f[14..34]);
        f
    }
    fn fragment(whole: &[u8], offset: usize, len: usize, more: bool, id: u32) -> Vec<u8> {
        let data = &whole[14 + 20..];
        let mut f = whole[..14 + 20].to_vec();
        f.extend_from_slice(&data[offset..offset + len]);
        let ip = &mut f[14..34];
        ip[2..4].copy_from_slice(&u16::try_from(20 + len).unwrap().to_be_bytes());
        ip[4..6].copy_from_slice(&u16::try_from(id).unwrap().to_be_bytes());
        let field = u16::try_from(offset / 8).unwrap() | if more { 0x2000 } else { 0 };
        ip[6..8].copy_from_slice(&field.to_be_bytes());
        family::set_checksum(ip);
        f
    }
    fn with_id(whole: &[u8], id: u32) -> Vec<u8> {
        let mut f = whole.to_vec();
        f[18..20].copy_from_slice(&u16::try_from(id).unwrap().to_be_bytes());
        family::set_checksum(&mut f[14..34]);
        f
    }
}

impl TestFamily for Ipv6Addr {
    const IP: usize = 40;
    fn addr(n: u8) -> Ipv6Addr {
        Ipv6Addr::new(0xfd00, 0x10, 0x244, 1, 0, 0, 0, u16::from(n))
    }
    fn datagram(src: Ipv6Addr, dst: Ipv6Addr, len: usize) -> Vec<u8> {
        let mut f = Vec::new();
        PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
            .ipv6(src.octets(), dst.octets(), 64)
            .udp(40000, 53)
            .write(&mut f, &payload(len))
            .unwrap();
        f
    }
    fn fragment(whole: &[u8], offset: usize, len: usize, more: bool, id: u32) -> Vec<u8> {
        let data = &whole[14 + 40..];
        let mut f = whole[..14 + 40].to_vec();
        let nh = f[14 + 6];
        f[14 + 6] = 44;
        f[14 + 4..14 + 6].copy_from_slice(&u16::try_from(8 + len).unwrap().to_be_bytes());
        let field = u16::try_from(offset).unwrap() | u16::from(more);
        f.extend_from_slice(&[nh, 0]);
        f.extend_from_slice(&field.to_be_bytes());
        f.extend_from_slice(&id.to_be_bytes());
        f.extend_from_slice(&data[offset..offset + len]);
        f
    }
    fn with_id(whole: &[u8], _id: u32) -> Vec<u8> {
        whole.to_vec()
    }
}

/// Cuts `whole` into fragments of `size` bytes of data (the last takes the rest).
fn cut<A: TestFamily>(whole: &[u8], size: usize, id: u32) -> Vec<Vec<u8>> {
    let len = whole.len() - 14 - A::IP;
    let mut out = Vec::new();
    let mut at = 0;
    while at < len {
        let n = size.min(len - at);
        out.push(A::fragment(whole, at, n, at + n < len, id));
        at += n;
    }
    out
}

fn table<A: TestFamily>() -> Defrag<A> {
    Defrag::new(DefragConfig::default_for::<A>())
}

fn push<A: TestFamily>(t: &mut Defrag<A>, f: &[u8], now: Instant) -> Result<Pushed, FragDrop> {
    let frag = A::parse(&f[14..], 0)?.expect("a fragment");
    t.push(f, 14, &frag, now)
}

/// The frames [`Datagram::refragment`] gives.
fn refragment<A: TestFamily>(t: &mut Defrag<A>) -> Vec<Vec<u8>> {
    let d = t.datagram().expect("complete");
    let mut buf = vec![0u8; 70_000];
    let mut out = Vec::new();
    let (sent, skipped) = d.refragment(&mut buf, &mut |f| out.push(f.to_vec()));
    assert_eq!((sent, skipped), (d.fragments(), 0));
    out
}

const T0: Instant = Instant::from_secs(100);

macro_rules! both {
    ($($name:ident),* $(,)?) => {
        mod v4 { $(#[test] fn $name() { super::$name::<std::net::Ipv4Addr>() })* }
        mod v6 { $(#[test] fn $name() { super::$name::<std::net::Ipv6Addr>() })* }
    };
}

both!(
    fragments_in_any_order_give_the_datagram_and_cut_back_to_themselves,
    not_a_fragment_is_none,
    an_exact_duplicate_is_dropped_and_the_list_kept,
    an_overlap_discards_the_whole_datagram,
    small_or_unaligned_fragments_other_than_the_last_are_refused,
    lengths_past_the_datagram_are_refused,
    zones_and_identifications_never_mix,
    the_table_is_bounded_in_fragments_and_bytes,
    lists_time_out_and_free_their_memory,
    a_rewrite_of_the_whole_reaches_every_fragment,
    a_flood_of_random_fragments_leaves_memory_flat,
    a_worker_gets_the_datagram_in_the_buffer_it_was_put_together_in,
);

/// A worker's [`Frags::take`] hands the datagram on in the buffer its fragments' data was
/// copied into, and that buffer (given back by [`Frags::restore`]) puts the next datagram
/// together: no copy of the whole, no allocation once warm.
fn a_worker_gets_the_datagram_in_the_buffer_it_was_put_together_in<A: TestFamily + FragsOf>() {
    let mut w = Frags::default();
    let mut at = Vec::new();
    for id in 1..=3 {
        let whole = A::datagram(A::addr(2), A::addr(3), 4000);
        let frags = cut::<A>(&whole, 1448, id);
        for (i, f) in frags.iter().enumerate() {
            let mut b = crate::buf::PacketBuf::from_frame(f);
            b.port = crate::base::PortId(7);
            let taken = w.take::<A>(&mut b, 14, T0).unwrap();
            if i + 1 < frags.len() {
                assert_eq!(taken, Taken::Held { expired: 0 });
                continue;
            }
            assert_eq!(taken, Taken::Whole { expired: 0 });
            assert!(b.frame() == A::with_id(&whole, id));
            assert_eq!(b.port, crate::base::PortId(7));
            assert!(b.headroom() >= crate::buf::HEADROOM);
            at.push(b.frame().as_ptr());
            let mut back = Vec::new();
            assert_eq!(
                w.refragment::<A>(b.frame(), &mut |f| back.push(f.to_vec())),
                3
            );
            assert_eq!(back, frags);
            w.restore(&mut b);
            assert!(b.frame() == &f[..], "the fragment's own buffer is back");
        }
    }
    assert!(at.windows(2).all(|p| p[0] == p[1]), "one buffer, reused");
    assert_eq!(w.held(), 0);
}

fn fragments_in_any_order_give_the_datagram_and_cut_back_to_themselves<A: TestFamily>() {
    let whole = A::datagram(A::addr(2), A::addr(3), 3000);
    let frags = cut::<A>(&whole, 1448, 7);
    assert_eq!(frags.len(), 3);
    let orders: [[usize; 3]; 4] = [[0, 1, 2], [2, 1, 0], [1, 2, 0], [2, 0, 1]];
    let mut t = table::<A>();
    for order in orders {
        for (i, &k) in order.iter().enumerate() {
            let got = push(&mut t, &frags[k], T0).unwrap();
            assert_eq!(got == Pushed::Complete, i == 2, "{order:?}");
        }
        let d = t.datagram().unwrap();
        assert!(
            d.frame() == A::with_id(&whole, 7),
            "{order:?}: the datagram as sent"
        );
        assert_eq!(d.fragments(), 3);
        assert_eq!(d.max_frag_size(), A::IP + A::FRAG_HEADER_LEN + 1448);
        assert_eq!(d.key().id, 7);
        assert!(
            refragment(&mut t) == frags,
            "cut back at the same boundaries"
        );
    }
    assert_eq!((t.held(), t.lists()), (0, 0));
    let st = t.stats();
    assert_eq!((st.fragments, st.reassembled), (12, 4));
    // The next push forgets the datagram.
    let _ = push(&mut t, &frags[0], T0);
    assert!(t.datagram().is_none());
}

fn not_a_fragment_is_none<A: TestFamily>() {
    let whole = A::datagram(A::addr(2), A::addr(3), 100);
    assert_eq!(A::parse(&whole[14..], 0), Ok(None));
    // Cut short or lying about its length: refused before anything is read past it.
    let frags = cut::<A>(&A::datagram(A::addr(2), A::addr(3), 3000), 1448, 1);
    let f = &frags[1];
    for cut in [0, 1, 5, 13, A::IP - 1, f.len() - 15] {
        assert_eq!(
            A::parse(&f[14..14 + cut], 0),
            Err(FragDrop::Malformed),
            "{cut}"
        );
    }
}

fn an_exact_duplicate_is_dropped_and_the_list_kept<A: TestFamily>() {
    let whole = A::datagram(A::addr(2), A::addr(3), 3000);
    let frags = cut::<A>(&whole, 1448, 9);
    let mut t = table::<A>();
    push(&mut t, &frags[0], T0).unwrap();
    assert_eq!(push(&mut t, &frags[0], T0), Err(FragDrop::Duplicate));
    push(&mut t, &frags[2], T0).unwrap();
    assert_eq!(push(&mut t, &frags[2], T0), Err(FragDrop::Duplicate));
    assert_eq!(push(&mut t, &frags[1], T0), Ok(Pushed::Complete));
    assert!(t.datagram().unwrap().frame() == A::with_id(&whole, 9));
    assert_eq!(t.stats().drop_count(FragDrop::Duplicate), 2);
}

fn an_overlap_discards_the_whole_datagram<A: TestFamily>() {
    let whole = A::datagram(A::addr(2), A::addr(3), 3000);
    let frags = cut::<A>(&whole, 1448, 9);
    let mut t = table::<A>();
    push(&mut t, &frags[0], T0).unwrap();
    // Data 1440..2888 overlaps the first fragment's 0..1448.
    let overlapping = A::fragment(&whole, 1440, 1448, true, 9);
    assert_eq!(push(&mut t, &overlapping, T0), Err(FragDrop::Overlap));
    assert_eq!((t.held(), t.lists(), t.held_bytes()), (0, 0, 0));
    // What came before is gone: the rest alone never completes.
    push(&mut t, &frags[1], T0).unwrap();
    assert_eq!(push(&mut t, &frags[2], T0), Ok(Pushed::Held));
    // Overlapping inside (a fragment within another) too.
    let inner = A::fragment(&whole, 1448 + 8, 8, false, 9);
    assert_eq!(push(&mut t, &inner, T0), Err(FragDrop::Oversize));
    assert_eq!(t.lists(), 0);
    assert_eq!(t.stats().drop_count(FragDrop::Overlap), 1);
}

fn small_or_unaligned_fragments_other_than_the_last_are_refused<A: TestFamily>() {
    let whole = A::datagram(A::addr(2), A::addr(3), 3000);
    let min = DefragConfig::default_for::<A>().min_frag;
    // The smallest non-last fragment allowed, and 8 bytes less.
    let data = (min - A::IP - A::FRAG_HEADER_LEN).next_multiple_of(8);
    let mut t = table::<A>();
    assert_eq!(
        push(&mut t, &A::fragment(&whole, 0, data, true, 1), T0),
        Ok(Pushed::Held)
    );
    assert_eq!(
        push(&mut t, &A::fragment(&whole, 0, data - 8, true, 2), T0),
        Err(FragDrop::TooSmall)
    );
    assert_eq!(
        push(&mut t, &A::fragment(&whole, 0, data + 4, true, 3), T0),
        Err(FragDrop::TooSmall)
    );
    // A last fragment may be small.
    assert_eq!(
        push(&mut t, &A::fragment(&whole, 1480, 8, false, 4), T0),
        Ok(Pushed::Held)
    );
    assert_eq!(t.stats().drop_count(FragDrop::TooSmall), 2);
    assert_eq!(t.lists(), 2);
}

fn lengths_past_the_datagram_are_refused<A: TestFamily>() {
    let whole = A::datagram(A::addr(2), A::addr(3), 3000);
    let mut t = table::<A>();
    // Ends past 65,535 bytes of IP packet.
    let mut far = A::fragment(&whole, 0, 1448, false, 1);
    let at = if A::IP == 20 { 14 + 6 } else { 14 + 40 + 2 };
    let field = if A::IP == 20 {
        (65_000u16 / 8).to_be_bytes()
    } else {
        65_000u16.to_be_bytes()
    };
    far[at..at + 2].copy_from_slice(&field);
    assert_eq!(
        A::parse(&far[14..], 0).map(|f| f.map(|f| f.offset)),
        Ok(Some(65_000 & !7))
    );
    if A::IP == 20 {
        family::set_checksum(&mut far[14..34]);
    }
    assert_eq!(push(&mut t, &far, T0), Err(FragDrop::Oversize));
    // Past the end the last fragment gave, or a second "last" elsewhere.
    let frags = cut::<A>(&whole, 1448, 2);
    push(&mut t, &frags[2], T0).unwrap();
    let past = A::fragment(
        &A::datagram(A::addr(2), A::addr(3), 9000),
        2896,
        1448,
        true,
        2,
    );
    assert_eq!(push(&mut t, &past, T0), Err(FragDrop::Oversize));
    assert_eq!(t.lists(), 0, "the datagram is discarded");
    push(&mut t, &frags[2], T0).unwrap();
    let early_end = A::fragment(&whole, 1448, 8, false, 2);
    assert_eq!(push(&mut t, &early_end, T0), Err(FragDrop::Oversize));
    assert_eq!(t.lists(), 0);
}

fn zones_and_identifications_never_mix<A: TestFamily>() {
    let whole = A::datagram(A::addr(2), A::addr(3), 3000);
    let a = cut::<A>(&whole, 1448, 5);
    let b = cut::<A>(&whole, 1448, 6);
    let mut t = table::<A>();
    let in_zone = |t: &mut Defrag<A>, f: &[u8], zone| {
        let frag = A::parse(&f[14..], zone).unwrap().unwrap();
        t.push(f, 14, &frag, T0)
    };
    in_zone(&mut t, &a[0], 1).unwrap();
    in_zone(&mut t, &a[1], 2).unwrap();
    in_zone(&mut t, &b[2], 1).unwrap();
    assert_eq!(t.lists(), 3);
    in_zone(&mut t, &a[1], 1).unwrap();
    assert_eq!(in_zone(&mut t, &a[2], 1), Ok(Pushed::Complete));
    assert_eq!(t.datagram().unwrap().key().zone, 1);
}

fn the_table_is_bounded_in_fragments_and_bytes<A: TestFamily>() {
    let whole = A::datagram(A::addr(2), A::addr(3), 3000);
    let cfg = DefragConfig {
        max_frags: 10,
        ..DefragConfig::default_for::<A>()
    };
    let mut t = Defrag::<A>::new(cfg);
    for id in 0..10 {
        push(&mut t, &cut::<A>(&whole, 1448, id)[0], T0).unwrap();
    }
    assert_eq!(t.held(), 10);
    assert_eq!(
        push(&mut t, &cut::<A>(&whole, 1448, 10)[0], T0),
        Err(FragDrop::TableFull)
    );
    assert_eq!(t.lists(), 10, "no list made for a refused fragment");
    // Nor may a list already held grow past the bound (OVS counts every fragment).
    assert_eq!(
        push(&mut t, &cut::<A>(&whole, 1448, 0)[1], T0),
        Err(FragDrop::TableFull)
    );
    // Bytes: each list's buffer counts.
    let cfg = DefragConfig {
        max_bytes: 3 * 1448,
        ..DefragConfig::default_for::<A>()
    };
    let mut t = Defrag::<A>::new(cfg);
    let mut refused = 0;
    for id in 0..10 {
        if push(&mut t, &cut::<A>(&whole, 1448, id)[0], T0) == Err(FragDrop::TableFull) {
            refused += 1;
        }
        assert!(t.held_bytes() <= cfg.max_bytes);
    }
    assert!(refused >= 7, "{refused}");
    assert_eq!(t.held(), t.lists());
}

fn lists_time_out_and_free_their_memory<A: TestFamily>() {
    let whole = A::datagram(A::addr(2), A::addr(3), 3000);
    let frags = cut::<A>(&whole, 1448, 1);
    let mut t = table::<A>();
    push(&mut t, &frags[0], T0).unwrap();
    push(
        &mut t,
        &cut::<A>(&whole, 1448, 2)[0],
        T0 + Duration::from_secs(10),
    )
    .unwrap();
    assert_eq!(t.expire(T0 + Duration::from_secs(14)), 0);
    assert_eq!(t.expire(T0 + Duration::from_secs(15)), 1);
    assert_eq!(t.lists(), 1);
    // The late fragments of the first datagram start a new list, which never completes.
    assert_eq!(
        push(&mut t, &frags[1], T0 + Duration::from_secs(16)),
        Ok(Pushed::Held)
    );
    assert_eq!(
        push(&mut t, &frags[2], T0 + Duration::from_secs(16)),
        Ok(Pushed::Held)
    );
    t.expire(T0 + Duration::from_secs(60));
    assert_eq!((t.lists(), t.held(), t.held_bytes()), (0, 0, 0));
    assert_eq!(t.stats().timeouts, 3);
}

/// What NAT does to a datagram (here a source address, a port and the UDP checksum, by
/// hand) reaches each fragment: addresses in all, the UDP header in the first; every IPv4
/// header checksum right; reassembled again, the fragments give the rewritten datagram.
fn a_rewrite_of_the_whole_reaches_every_fragment<A: TestFamily>() {
    let whole = A::datagram(A::addr(2), A::addr(3), 4000);
    let frags = cut::<A>(&whole, 1448, 3);
    let mut t = table::<A>();
    for f in &frags {
        let _ = push(&mut t, f, T0).unwrap();
    }
    let new = A::datagram(A::addr(99), A::addr(3), 4000);
    let mut new = new;
    // Another source port (and the checksum that goes with it, via etherparse).
    let l4 = 14 + A::IP;
    new[l4..l4 + 2].copy_from_slice(&1234u16.to_be_bytes());
    let rebuilt = {
        let s = etherparse::SlicedPacket::from_ethernet(&new).unwrap();
        let Some(etherparse::TransportSlice::Udp(u)) = s.transport else {
            panic!()
        };
        let sum = match s.net {
            Some(etherparse::NetSlice::Ipv4(ip)) => u
                .to_header()
                .calc_checksum_ipv4(&ip.header().to_header(), u.payload()),
            Some(etherparse::NetSlice::Ipv6(ip)) => u
                .to_header()
                .calc_checksum_ipv6(&ip.header().to_header(), u.payload()),
            _ => panic!(),
        };
        let mut n = new.clone();
        n[l4 + 6..l4 + 8].copy_from_slice(&sum.unwrap().to_be_bytes());
        n
    };
    let rebuilt = A::with_id(&rebuilt, 3);
    t.datagram().unwrap().frame_mut().copy_from_slice(&rebuilt);
    let out = refragment(&mut t);
    assert_eq!(out.len(), 3);
    for (f, old) in out.iter().zip(&frags) {
        assert_eq!(f.len(), old.len(), "the sizes the sender chose");
        let p = etherparse::SlicedPacket::from_ethernet(f);
        // etherparse checks what it can of each fragment's header.
        let _ = p;
        match A::IP {
            20 => {
                let h = etherparse::Ipv4HeaderSlice::from_slice(&f[14..]).unwrap();
                assert_eq!(h.source(), [10, 244, 1, 99]);
                let hh = h.to_header();
                assert_eq!(hh.calc_header_checksum(), hh.header_checksum);
            }
            _ => {
                let h = etherparse::Ipv6HeaderSlice::from_slice(&f[14..]).unwrap();
                assert_eq!(
                    h.source_addr(),
                    Ipv6Addr::new(0xfd00, 0x10, 0x244, 1, 0, 0, 0, 99)
                );
            }
        }
    }
    let mut t2 = table::<A>();
    for f in out.iter().rev() {
        let _ = push(&mut t2, f, T0).unwrap();
    }
    assert!(t2.datagram().unwrap().frame() == &rebuilt[..]);
}

/// Random fragments (random offsets, lengths, flags, identifications, zones, times) never
/// panic, and what is held stays within the limits.
fn a_flood_of_random_fragments_leaves_memory_flat<A: TestFamily>() {
    let whole = A::datagram(A::addr(2), A::addr(3), 9000);
    let cfg = DefragConfig {
        max_frags: 200,
        max_bytes: 1 << 20,
        ..DefragConfig::default_for::<A>()
    };
    let mut t = Defrag::<A>::new(cfg);
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut now = T0;
    for i in 0..50_000u32 {
        let off = (rnd() % 8000) as usize & !7;
        let len = 8 + (rnd() % 1000) as usize;
        let len = len.min(9000 - off);
        let f = A::fragment(&whole, off, len, rnd() % 3 != 0, (rnd() % 64) as u32);
        let zone = (rnd() % 2) as u16;
        if let Ok(Some(frag)) = A::parse(&f[14..], zone) {
            let _ = t.push(&f, 14, &frag, now);
        }
        assert!(t.held() <= cfg.max_frags);
        assert!(t.held_bytes() <= cfg.max_bytes, "{} at {i}", t.held_bytes());
        if i % 1000 == 0 {
            now = now + Duration::from_secs(1);
        }
    }
    t.expire(now + Duration::from_secs(60));
    assert_eq!((t.held(), t.held_bytes(), t.lists()), (0, 0, 0));
}

proptest! {
    /// Any cut of a datagram into aligned fragments, pushed in any order with duplicates,
    /// gives back the datagram (IPv4 and IPv6).
    #[test]
    fn any_cut_in_any_order_reassembles(
        len in 1500usize..20_000,
        size in 160usize..=200,
        seed in any::<u64>(),
        dups in 0usize..4,
    ) {
        check_cut::<Ipv4Addr>(len, size * 8, seed, dups);
        check_cut::<Ipv6Addr>(len, size * 8, seed, dups);
    }
}

fn check_cut<A: TestFamily>(len: usize, size: usize, seed: u64, dups: usize) {
    let whole = A::datagram(A::addr(2), A::addr(3), len);
    let mut frags = cut::<A>(&whole, size, 1);
    let n = frags.len();
    if n == 1 {
        // One piece is no fragment (offset 0, no more).
        assert_eq!(A::parse(&frags[0][14..], 0), Ok(None));
        return;
    }
    for i in 0..dups {
        let k = usize::try_from(seed % 1024).unwrap() + i * 7;
        let k = k % n;
        frags.push(frags[k].clone());
    }
    // Fisher-Yates with a seeded xorshift.
    let mut x = seed | 1;
    for i in (1..frags.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let j = x % (u64::try_from(i).unwrap() + 1);
        frags.swap(i, usize::try_from(j).unwrap());
    }
    let mut t = table::<A>();
    let mut complete = 0;
    for f in &frags {
        match push(&mut t, f, T0) {
            Ok(Pushed::Complete) => {
                complete += 1;
                assert!(t.datagram().unwrap().frame() == A::with_id(&whole, 1));
            }
            Ok(Pushed::Held) | Err(FragDrop::Duplicate) => {}
            Err(e) => panic!("{e:?}"),
        }
    }
    // Duplicates that come after completion start a new list (as in Linux, which forgets a
    // datagram once it is put together), which completes again only if they make it whole.
    assert!(complete >= 1);
}
