//! Tests of the packet rewrites: packets built with etherparse, every checksum verified by a
//! full recomputation after the rewrite.
#![allow(
    clippy::cast_possible_truncation,
    reason = "test fixtures: small loop counters and random draws narrowed into addresses, ports and ids"
)]

use super::*;
use crate::offload::{complete_checksum, VirtioNetHdr};
use crate::wire::checksum::checksum;
use crate::wire::checksum::{fold as csum_fold, sum as csum_add};
use crate::wire::ipv4::ICMP_ERROR_MAX;
use etherparse::{
    icmpv4::{DestUnreachableHeader, TimeExceededCode},
    IcmpEchoHeader, Icmpv4Header, Icmpv4Type, IpNumber, Ipv4Header, TcpHeader, UdpHeader,
};
use proptest::prelude::*;

const A: [u8; 4] = [10, 244, 1, 5];
const B: [u8; 4] = [10, 96, 0, 10];

fn ip_header(
    proto: IpNumber,
    src: [u8; 4],
    dst: [u8; 4],
    payload: usize,
    opts: &[u8],
) -> Ipv4Header {
    let mut h = Ipv4Header::new(payload as u16, 64, proto, src, dst).unwrap();
    h.options = opts.try_into().unwrap();
    h.set_payload_len(payload).unwrap();
    h.identification = 0x1234;
    h.dont_fragment = true;
    h.header_checksum = h.calc_header_checksum();
    h
}

fn tcp(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16, payload: &[u8], opts: &[u8]) -> Vec<u8> {
    let mut t = TcpHeader::new(sport, dport, 0x0102_0304, 65535);
    t.ack = true;
    t.acknowledgment_number = 77;
    let ip = ip_header(
        IpNumber::TCP,
        src,
        dst,
        t.header_len() + payload.len(),
        opts,
    );
    t.checksum = t.calc_checksum_ipv4(&ip, payload).unwrap();
    let mut v = ip.to_bytes().to_vec();
    v.extend_from_slice(&t.to_bytes());
    v.extend_from_slice(payload);
    v
}

fn udp(
    src: [u8; 4],
    dst: [u8; 4],
    sport: u16,
    dport: u16,
    payload: &[u8],
    opts: &[u8],
    zero: bool,
) -> Vec<u8> {
    let ip = ip_header(IpNumber::UDP, src, dst, 8 + payload.len(), opts);
    let mut u = UdpHeader::with_ipv4_checksum(sport, dport, &ip, payload).unwrap();
    if zero {
        u.checksum = 0;
    }
    let mut v = ip.to_bytes().to_vec();
    v.extend_from_slice(&u.to_bytes());
    v.extend_from_slice(payload);
    v
}

fn icmp(src: [u8; 4], dst: [u8; 4], ty: Icmpv4Type, payload: &[u8], opts: &[u8]) -> Vec<u8> {
    let h = Icmpv4Header::with_checksum(ty, payload);
    let ip = ip_header(
        IpNumber::ICMP,
        src,
        dst,
        h.header_len() + payload.len(),
        opts,
    );
    let mut v = ip.to_bytes().to_vec();
    v.extend_from_slice(&h.to_bytes());
    v.extend_from_slice(payload);
    v
}

fn echo(
    src: [u8; 4],
    dst: [u8; 4],
    id: u16,
    request: bool,
    payload: &[u8],
    opts: &[u8],
) -> Vec<u8> {
    let e = IcmpEchoHeader { id, seq: 9 };
    let ty = if request {
        Icmpv4Type::EchoRequest(e)
    } else {
        Icmpv4Type::EchoReply(e)
    };
    icmp(src, dst, ty, payload, opts)
}

fn hlen(p: &[u8]) -> usize {
    usize::from(p[0] & 0x0f) * 4
}

fn tuple_of(p: &[u8]) -> (Tuple, L4Kind) {
    Tuple::from_ipv4(p, hlen(p), p.len()).unwrap()
}

/// Sum of the pseudo-header and segment folds to 0xffff: the receiver accepts it.
fn l4_valid(src: &[u8], dst: &[u8], proto: u8, seg: &[u8]) -> bool {
    let mut ph = [0u8; 12];
    ph[..4].copy_from_slice(src);
    ph[4..8].copy_from_slice(dst);
    ph[9] = proto;
    ph[10..12].copy_from_slice(&(seg.len() as u16).to_be_bytes());
    csum_fold(csum_add(csum_add(0, &ph), seg)) == 0xffff
}

fn same_csum(a: u16, b: u16) -> bool {
    a == b || (a | b == 0xffff && (a == 0 || b == 0))
}

/// Checks every checksum of a whole (not quoted) IPv4 packet by recomputing it from scratch,
/// both independently and with etherparse.
fn verify(p: &[u8]) {
    let h = hlen(p);
    assert_eq!(checksum(&p[..h]), 0, "IPv4 header checksum");
    let (src, dst, proto) = (&p[12..16], &p[16..20], p[9]);
    let seg = &p[h..];
    match proto {
        6 => {
            assert!(l4_valid(src, dst, 6, seg), "TCP checksum");
            let (t, payload) = TcpHeader::from_slice(seg).unwrap();
            let c = t
                .calc_checksum_ipv4_raw(src.try_into().unwrap(), dst.try_into().unwrap(), payload)
                .unwrap();
            assert!(
                same_csum(c, t.checksum),
                "etherparse TCP {c:#x} {:#x}",
                t.checksum
            );
        }
        17 => {
            let (u, payload) = UdpHeader::from_slice(seg).unwrap();
            if u.checksum != 0 {
                assert!(l4_valid(src, dst, 17, seg), "UDP checksum");
                let c = u
                    .calc_checksum_ipv4_raw(
                        src.try_into().unwrap(),
                        dst.try_into().unwrap(),
                        payload,
                    )
                    .unwrap();
                assert_eq!(c, u.checksum, "etherparse UDP");
            }
        }
        1 => {
            assert_eq!(checksum(seg), 0, "ICMP checksum");
            let (ih, payload) = Icmpv4Header::from_slice(seg).unwrap();
            assert!(same_csum(ih.icmp_type.calc_checksum(payload), ih.checksum));
            if let Some(L4Kind::IcmpError { inner_l3 }) =
                Tuple::from_ipv4(p, h, p.len()).map(|x| x.1)
            {
                let q = &p[usize::from(inner_l3)..];
                let qh = hlen(q);
                assert_eq!(checksum(&q[..qh]), 0, "quoted IPv4 header checksum");
                let qlen = usize::from(u16::from_be_bytes([q[2], q[3]]));
                if qlen == q.len() {
                    // The whole datagram is quoted: its checksums can be checked too.
                    verify(q);
                }
            }
        }
        _ => {}
    }
}

fn new_tuple(old: &Tuple, src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16) -> Tuple {
    let icmp = old.proto == 1;
    Tuple {
        src: src.into(),
        dst: dst.into(),
        sport,
        dport: if icmp { sport } else { dport },
        ..*old
    }
}

/// Rewrites to `new` (Full), checks the result, rewrites back and checks the bytes.
fn round_trip(p: &[u8], new: Tuple) {
    let (old, kind) = tuple_of(p);
    let mut q = p.to_vec();
    rewrite(&mut q, hlen(p), kind, &new, CsumMode::Full).unwrap();
    assert_eq!(tuple_of(&q), (new, kind));
    verify(&q);
    rewrite(&mut q, hlen(p), kind, &old, CsumMode::Full).unwrap();
    assert_eq!(q, p, "rewriting back restores the packet");
}

#[test]
fn tcp_dnat_and_snat() {
    let p = tcp(A, B, 40000, 80, b"GET / HTTP/1.1\r\n\r\n", &[]);
    verify(&p);
    let (t, _) = tuple_of(&p);
    // DNAT to an endpoint, then SNAT (MASQUERADE) too.
    round_trip(&p, new_tuple(&t, A, [10, 244, 2, 7], 40000, 8080));
    round_trip(
        &p,
        new_tuple(&t, [192, 168, 0, 10], [10, 244, 2, 7], 1025, 8080),
    );
    // Odd payload length, IP options.
    let p = tcp(A, B, 1, 65535, b"odd", &[1, 1, 1, 0, 0x94, 4, 0, 0]);
    verify(&p);
    round_trip(
        &p,
        new_tuple(
            &tuple_of(&p).0,
            [1, 2, 3, 4],
            [255, 254, 253, 252],
            65535,
            0,
        ),
    );
}

#[test]
fn noop_rewrite_leaves_bytes() {
    let p = udp(A, B, 53, 5353, b"x", &[], false);
    let (t, k) = tuple_of(&p);
    let mut q = p.clone();
    rewrite(&mut q, 20, k, &t, CsumMode::Full).unwrap();
    assert_eq!(p, q);
}

#[test]
fn udp_with_and_without_checksum() {
    let p = udp(A, B, 5000, 53, b"query", &[], false);
    let t = tuple_of(&p).0;
    round_trip(&p, new_tuple(&t, A, [10, 244, 3, 3], 5000, 5353));
    let p = udp(A, B, 5000, 53, b"query", &[], true);
    let mut q = p.clone();
    let n = new_tuple(&t, [9, 9, 9, 9], [10, 244, 3, 3], 6000, 5353);
    rewrite(&mut q, 20, L4Kind::Udp, &n, CsumMode::Full).unwrap();
    assert_eq!(&q[26..28], &[0, 0], "no checksum stays none");
    verify(&q);
    round_trip(&p, n);
}

#[test]
fn udp_computed_zero_becomes_ffff() {
    // Search for a rewrite whose incremental result is 0 and check it is sent as 0xffff.
    let p = udp(A, B, 5000, 53, b"abcd", &[], false);
    let t = tuple_of(&p).0;
    let old = u16::from_be_bytes([p[26], p[27]]);
    // Changing the source port by d changes the checksum by -d (ones complement): pick the
    // port that makes it 0.
    let sport = (u32::from(t.sport) + u32::from(old)) % 0xffff;
    let n = Tuple {
        sport: sport as u16,
        ..t
    };
    let mut q = p.clone();
    rewrite(&mut q, 20, L4Kind::Udp, &n, CsumMode::Full).unwrap();
    assert_eq!(&q[26..28], &[0xff, 0xff]);
    verify(&q);
    rewrite(&mut q, 20, L4Kind::Udp, &t, CsumMode::Full).unwrap();
    assert_eq!(q, p);
}

#[test]
fn icmp_echo_id() {
    for request in [true, false] {
        let p = echo(A, B, 0x4242, request, b"ping payload!", &[]);
        verify(&p);
        let (t, k) = tuple_of(&p);
        assert_eq!(k, L4Kind::IcmpEcho { request });
        round_trip(&p, new_tuple(&t, [192, 168, 0, 10], B, 0x0001, 0));
    }
}

#[test]
fn other_protocol_addresses_only() {
    let mut p = ip_header(IpNumber::GRE, A, B, 4, &[]).to_bytes().to_vec();
    p.extend_from_slice(&[0, 0, 0x65, 0x58]);
    let (t, k) = tuple_of(&p);
    assert_eq!(k, L4Kind::Other);
    round_trip(&p, new_tuple(&t, [1, 1, 1, 1], [2, 2, 2, 2], 0, 0));
    // TCP with kind Other is refused.
    let p = tcp(A, B, 1, 2, b"", &[]);
    let mut q = p.clone();
    let t = tuple_of(&p).0;
    assert_eq!(
        rewrite(&mut q, 20, L4Kind::Other, &t, CsumMode::Full),
        Err(RewriteError::KindMismatch)
    );
    assert_eq!(
        rewrite(
            &mut q,
            20,
            L4Kind::Udp,
            &Tuple { proto: 17, ..t },
            CsumMode::Full
        ),
        Err(RewriteError::ProtoMismatch { packet: 6, new: 17 })
    );
    assert_eq!(q, p);
}

#[test]
fn fragments() {
    // First fragment: rewritten as a whole packet; the checksum stays right for the
    // reassembled datagram.
    let whole = udp(A, B, 5000, 53, &[7u8; 64], &[], false);
    let n = new_tuple(
        &tuple_of(&whole).0,
        [9, 9, 9, 9],
        [10, 244, 3, 3],
        6000,
        5353,
    );
    let mut rewritten = whole.clone();
    rewrite(&mut rewritten, 20, L4Kind::Udp, &n, CsumMode::Full).unwrap();
    // Split: first fragment has 8 + 32 bytes of UDP, the second the rest.
    let mk = |data: &[u8], off: u16, mf: bool, from: &[u8]| {
        let mut h = Ipv4Header::from_slice(from).unwrap().0;
        h.set_payload_len(data.len()).unwrap();
        h.fragment_offset = etherparse::IpFragOffset::try_new(off / 8).unwrap();
        h.more_fragments = mf;
        h.dont_fragment = false;
        h.header_checksum = h.calc_header_checksum();
        let mut v = h.to_bytes().to_vec();
        v.extend_from_slice(data);
        v
    };
    let mut f1 = mk(&whole[20..60], 0, true, &whole);
    let mut f2 = mk(&whole[60..], 40, false, &whole);
    let (_, k) = tuple_of(&f1);
    rewrite(&mut f1, 20, k, &n, CsumMode::Full).unwrap();
    assert!(Tuple::from_ipv4(&f2, 20, f2.len()).is_none());
    assert_eq!(
        rewrite(&mut f2.clone(), 20, L4Kind::Udp, &n, CsumMode::Full),
        Err(RewriteError::LaterFragment)
    );
    rewrite_addrs(&mut f2, n.src, n.dst).unwrap();
    assert_eq!(checksum(&f1[..20]), 0);
    assert_eq!(checksum(&f2[..20]), 0);
    // Reassembled: identical to the whole packet rewritten.
    assert_eq!(&f1[20..], &rewritten[20..60]);
    assert_eq!(&f2[20..], &rewritten[60..]);
    assert_eq!(&f2[12..20], &rewritten[12..20]);
}

/// Sets the L4 checksum field to the pseudo-header sum as an offload TAP would, and returns
/// the virtio header that completes it.
fn make_partial(p: &mut [u8]) -> VirtioNetHdr {
    let h = hlen(p);
    let off = if p[9] == 6 { 16 } else { 6 };
    let mut ph = [0u8; 12];
    ph[..8].copy_from_slice(&p[12..20]);
    ph[9] = p[9];
    ph[10..12].copy_from_slice(&((p.len() - h) as u16).to_be_bytes());
    let sum = !checksum(&ph); // folded, not complemented
    p[h + off..h + off + 2].copy_from_slice(&sum.to_be_bytes());
    VirtioNetHdr {
        flags: crate::offload::VIRTIO_NET_HDR_F_NEEDS_CSUM,
        csum_start: h as u16,
        csum_offset: off as u16,
        ..VirtioNetHdr::NONE
    }
}

#[test]
fn partial_mode_tcp_udp() {
    for p in [
        tcp(A, B, 40000, 80, b"hello world", &[1, 1, 1, 1]),
        udp(A, B, 40000, 53, b"hello", &[], false),
    ] {
        let (t, k) = tuple_of(&p);
        let n = new_tuple(&t, [192, 168, 0, 10], [10, 244, 2, 7], 1234, 8080);
        let mut q = p.clone();
        let vh = make_partial(&mut q);
        let before = q.clone();
        rewrite(&mut q, hlen(&p), k, &n, CsumMode::Partial).unwrap();
        // The field only moved with the addresses: equal to a partial sum made from scratch.
        let mut fresh = q.clone();
        make_partial(&mut fresh);
        let off = hlen(&p) + if p[9] == 6 { 16 } else { 6 };
        assert!(same_csum(
            u16::from_be_bytes([q[off], q[off + 1]]),
            u16::from_be_bytes([fresh[off], fresh[off + 1]])
        ));
        complete_checksum(&mut q, &vh).unwrap();
        verify(&q);
        assert_eq!(tuple_of(&q).0, n);
        // And back.
        let mut r = q.clone();
        make_partial(&mut r);
        rewrite(&mut r, hlen(&p), k, &t, CsumMode::Partial).unwrap();
        assert!(same_csum(
            u16::from_be_bytes([r[off], r[off + 1]]),
            u16::from_be_bytes([before[off], before[off + 1]])
        ));
        let mut b = before.clone();
        b[off..off + 2].copy_from_slice(&r[off..off + 2]);
        assert_eq!(r, b);
    }
}

#[test]
fn partial_mode_echo_leaves_checksum() {
    let p = echo(A, B, 7, true, b"x", &[]);
    let (t, k) = tuple_of(&p);
    let mut q = p.clone();
    rewrite(&mut q, 20, k, &new_tuple(&t, A, B, 8, 8), CsumMode::Partial).unwrap();
    assert_eq!(&q[22..24], &p[22..24]);
    assert_eq!(&q[24..26], &[0, 8]);
}

fn dest_unreach() -> Icmpv4Type {
    Icmpv4Type::DestinationUnreachable(DestUnreachableHeader::Port)
}

/// An ICMP error from `router` to `to` quoting `quoted` (the first `quote` bytes of it).
fn icmp_error(
    router: [u8; 4],
    to: [u8; 4],
    ty: Icmpv4Type,
    quoted: &[u8],
    quote: usize,
    opts: &[u8],
) -> Vec<u8> {
    icmp(router, to, ty, &quoted[..quote.min(quoted.len())], opts)
}

/// The NAT'd-connection scenario: the client A talked to VIP B:80, DNAT'd to endpoint E:8080
/// and SNAT'd to node N. The endpoint's reply (E:8080 → N:1025) hits an error at router R,
/// which reports to N, quoting the reply as it saw it. Translating back: the quote becomes the
/// reply as the client expects it (B:80 → A:40000), the outer goes R → A.
fn error_scenario(inner: Vec<u8>, quote: usize, ty: Icmpv4Type, opts: &[u8]) {
    let r = [172, 16, 0, 1];
    let n = [192, 168, 0, 10];
    let p = icmp_error(r, n, ty, &inner, quote, opts);
    verify(&p);
    let (qt, k) = tuple_of(&p);
    let L4Kind::IcmpError { inner_l3 } = k else {
        panic!("{k:?}")
    };
    let new_inner = Tuple {
        src: B.into(),
        dst: A.into(),
        sport: if qt.proto == 1 { 0x77 } else { 80 },
        dport: if qt.proto == 1 { 0x77 } else { 40000 },
        ..qt
    };
    let mut q = p.clone();
    rewrite_icmp_error(
        &mut q,
        hlen(&p),
        inner_l3.into(),
        &new_inner,
        r.into(),
        A.into(),
        CsumMode::Full,
    )
    .unwrap();
    verify(&q);
    assert_eq!(tuple_of(&q), (new_inner, k));
    assert_eq!(&q[12..20], &[r, A].concat()[..]);
    let il4 = usize::from(inner_l3) + 20;
    if qt.proto == 6 && q.len() - il4 < 20 {
        // 8-byte TCP quote: the checksum is not quoted, nothing past byte 8 touched.
        assert_eq!(q.len(), il4 + 8);
    }
    // And back: bytes restored.
    rewrite_icmp_error(
        &mut q,
        hlen(&p),
        inner_l3.into(),
        &qt,
        r.into(),
        n.into(),
        CsumMode::Full,
    )
    .unwrap();
    assert_eq!(q, p);
}

#[test]
fn icmp_errors_quoting_tcp_udp_echo() {
    let e = [10, 244, 2, 7];
    let n = [192, 168, 0, 10];
    let t = tcp(e, n, 8080, 1025, b"response body", &[]);
    let u = udp(e, n, 8080, 1025, b"dns answer", &[], false);
    let u0 = udp(e, n, 8080, 1025, b"dns answer", &[], true);
    let x = echo(e, n, 0x99, false, b"pong", &[]);
    let frag = Icmpv4Type::DestinationUnreachable(DestUnreachableHeader::FragmentationNeeded {
        next_hop_mtu: 1400,
    });
    let ttl = Icmpv4Type::TimeExceeded(TimeExceededCode::TtlExceededInTransit);
    for inner in [&t, &u, &u0, &x] {
        for ty in [dest_unreach(), frag.clone(), ttl.clone()] {
            error_scenario(inner.clone(), inner.len(), ty.clone(), &[]); // full quote
            error_scenario(inner.clone(), 28, ty.clone(), &[]); // 8 bytes of L4
            error_scenario(inner.clone(), 28, ty, &[1, 1, 1, 1]); // outer options
        }
    }
    // Quoted packet with IP options, TCP quote of 20 bytes (checksum quoted, payload not).
    let t = tcp(e, n, 8080, 1025, &[3u8; 100], &[1, 1, 1, 0]);
    error_scenario(t.clone(), 24 + 20, dest_unreach(), &[]);
    error_scenario(t, ICMP_ERROR_MAX, dest_unreach(), &[]);
}

#[test]
fn icmp_error_partial_leaves_outer_checksum() {
    let inner = tcp([10, 244, 2, 7], [192, 168, 0, 10], 8080, 1025, b"x", &[]);
    let p = icmp_error(
        [172, 16, 0, 1],
        [192, 168, 0, 10],
        dest_unreach(),
        &inner,
        inner.len(),
        &[],
    );
    let (qt, _) = tuple_of(&p);
    let ni = Tuple {
        src: B.into(),
        dst: A.into(),
        sport: 80,
        dport: 40000,
        ..qt
    };
    let mut q = p.clone();
    rewrite_icmp_error(
        &mut q,
        20,
        28,
        &ni,
        [172, 16, 0, 1].into(),
        A.into(),
        CsumMode::Partial,
    )
    .unwrap();
    assert_eq!(&q[22..24], &p[22..24]);
    // The device would compute it over the message: do that and check everything.
    q[22..24].copy_from_slice(&[0, 0]);
    let c = checksum(&q[20..]);
    q[22..24].copy_from_slice(&c.to_be_bytes());
    verify(&q);
}

#[test]
fn icmp_error_refusals() {
    let inner = udp(A, B, 1, 2, b"", &[], false);
    let p = icmp_error([1, 1, 1, 1], A, dest_unreach(), &inner, inner.len(), &[]);
    let (qt, _) = tuple_of(&p);
    let mut q = p.clone();
    let r = |q: &mut Vec<u8>, inner_l3: usize, t: &Tuple| {
        rewrite_icmp_error(q, 20, inner_l3, t, A.into(), B.into(), CsumMode::Full)
    };
    assert_eq!(r(&mut q, 30, &qt), Err(RewriteError::BadIcmpError));
    assert_eq!(
        r(&mut q, 28, &Tuple { proto: 6, ..qt }),
        Err(RewriteError::ProtoMismatch { packet: 17, new: 6 })
    );
    let e = echo(A, B, 1, true, b"", &[]);
    let mut e2 = e.clone();
    assert_eq!(r(&mut e2, 28, &qt), Err(RewriteError::BadIcmpError));
    assert_eq!(
        rewrite(
            &mut q,
            20,
            L4Kind::IcmpError { inner_l3: 28 },
            &qt,
            CsumMode::Full
        ),
        Err(RewriteError::ProtoMismatch { packet: 1, new: 17 })
    );
    assert_eq!(q, p);
    assert_eq!(e2, e);
}

/// Every prefix of every packet (with lengths made consistent so deeper checks are reached),
/// every kind: no panic, and an error leaves the bytes alone.
#[test]
fn truncated_never_panics() {
    let inner = tcp(A, B, 1, 2, b"abc", &[]);
    let packets = [
        tcp(A, B, 1, 2, b"abc", &[1, 1, 1, 1]),
        udp(A, B, 1, 2, b"abc", &[], false),
        echo(A, B, 1, true, b"abc", &[]),
        icmp_error(A, B, dest_unreach(), &inner, inner.len(), &[]),
    ];
    let kinds = [
        L4Kind::Tcp,
        L4Kind::Udp,
        L4Kind::IcmpEcho { request: true },
        L4Kind::IcmpError { inner_l3: 28 },
        L4Kind::Other,
    ];
    for p in &packets {
        for n in 0..=p.len() {
            for fix_len in [false, true] {
                let mut q = p[..n].to_vec();
                if fix_len && n >= 20 {
                    q[2..4].copy_from_slice(&(n as u16).to_be_bytes());
                    if let Ok(mut ip) = crate::wire::ipv4::Ipv4Packet::new_checked(&mut q[..]) {
                        ip.fill_checksum();
                    }
                }
                for hdr_len in [0, 20, 24, 60] {
                    for k in kinds {
                        for proto in [1, 6, 17, 47] {
                            let t = Tuple {
                                proto,
                                ..tuple_of(p).0
                            };
                            let orig = q.clone();
                            for mode in [CsumMode::Full, CsumMode::Partial] {
                                if rewrite(&mut q, hdr_len, k, &t, mode).is_err() {
                                    assert_eq!(q, orig);
                                }
                                let mut q2 = orig.clone();
                                if rewrite_icmp_error(
                                    &mut q2,
                                    hdr_len,
                                    hdr_len + 8,
                                    &t,
                                    A.into(),
                                    B.into(),
                                    mode,
                                )
                                .is_err()
                                {
                                    assert_eq!(q2, orig);
                                }
                            }
                            let mut q3 = orig.clone();
                            if rewrite_addrs(&mut q3, A.into(), B.into()).is_err() {
                                assert_eq!(q3, orig);
                            }
                            q = orig;
                        }
                    }
                }
            }
        }
    }
}

#[derive(Clone, Debug)]
enum Kind {
    Tcp,
    Udp { zero: bool },
    Echo { request: bool },
}

fn arb_kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        Just(Kind::Tcp),
        any::<bool>().prop_map(|zero| Kind::Udp { zero }),
        any::<bool>().prop_map(|request| Kind::Echo { request }),
    ]
}

fn build(
    k: &Kind,
    src: [u8; 4],
    dst: [u8; 4],
    sport: u16,
    dport: u16,
    payload: &[u8],
    opts: &[u8],
) -> Vec<u8> {
    match k {
        Kind::Tcp => tcp(src, dst, sport, dport, payload, opts),
        Kind::Udp { zero } => udp(src, dst, sport, dport, payload, opts, *zero),
        Kind::Echo { request } => echo(src, dst, sport, *request, payload, opts),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn prop_rewrite_valid_and_reversible(
        k in arb_kind(),
        src in any::<[u8; 4]>(), dst in any::<[u8; 4]>(),
        sport in any::<u16>(), dport in any::<u16>(),
        payload in proptest::collection::vec(any::<u8>(), 0..80),
        opt_words in 0usize..=10,
        nsrc in any::<[u8; 4]>(), ndst in any::<[u8; 4]>(),
        nsport in any::<u16>(), ndport in any::<u16>(),
        partial in any::<bool>(),
    ) {
        let opts = vec![1u8; opt_words * 4];
        let p = build(&k, src, dst, sport, dport, &payload, &opts);
        let (t, kind) = tuple_of(&p);
        let n = new_tuple(&t, nsrc, ndst, nsport, ndport);
        round_trip(&p, n);
        if partial && !matches!(k, Kind::Echo { .. }) {
            let mut q = p.clone();
            let vh = make_partial(&mut q);
            rewrite(&mut q, hlen(&p), kind, &n, CsumMode::Partial).unwrap();
            complete_checksum(&mut q, &vh).unwrap();
            verify(&q);
            prop_assert_eq!(tuple_of(&q).0, n);
        }
    }

    #[test]
    fn prop_icmp_error_valid_and_reversible(
        k in arb_kind(),
        src in any::<[u8; 4]>(), dst in any::<[u8; 4]>(),
        sport in any::<u16>(), dport in any::<u16>(),
        payload in proptest::collection::vec(any::<u8>(), 0..40),
        inner_opts in 0usize..=3, outer_opts in 0usize..=3,
        short_quote in any::<bool>(),
        nsrc in any::<[u8; 4]>(), ndst in any::<[u8; 4]>(),
        nsport in any::<u16>(), ndport in any::<u16>(),
        osrc in any::<[u8; 4]>(), odst in any::<[u8; 4]>(),
    ) {
        let inner = build(&k, src, dst, sport, dport, &payload, &vec![1u8; inner_opts * 4]);
        let quote = if short_quote { hlen(&inner) + 8 } else { inner.len() };
        let p = icmp_error([1, 2, 3, 4], [5, 6, 7, 8], dest_unreach(), &inner, quote, &vec![1u8; outer_opts * 4]);
        let (qt, kind) = tuple_of(&p);
        let L4Kind::IcmpError { inner_l3 } = kind else { panic!() };
        let n = new_tuple(&qt, nsrc, ndst, nsport, ndport);
        let mut q = p.clone();
        rewrite_icmp_error(&mut q, hlen(&p), inner_l3.into(), &n, osrc.into(), odst.into(), CsumMode::Full).unwrap();
        verify(&q);
        prop_assert_eq!(tuple_of(&q), (n, kind));
        rewrite_icmp_error(&mut q, hlen(&p), inner_l3.into(), &qt, [1, 2, 3, 4].into(), [5, 6, 7, 8].into(), CsumMode::Full).unwrap();
        prop_assert_eq!(q, p);
    }

    #[test]
    fn prop_garbage_never_panics(
        mut bytes in proptest::collection::vec(any::<u8>(), 0..120),
        hdr_len in 0usize..70, inner_l3 in 0usize..90,
        proto in prop_oneof![Just(1u8), Just(6u8), Just(17u8), any::<u8>()],
        kind in 0usize..5,
        fix in any::<bool>(),
    ) {
        if fix && bytes.len() >= 20 {
            bytes[0] = 0x40 | (bytes[0] & 0x0f).max(5);
            let n = bytes.len() as u16;
            bytes[2..4].copy_from_slice(&n.to_be_bytes());
            bytes[6] &= 0xe0;
            bytes[7] = 0;
            bytes[9] = proto;
        }
        let k = [L4Kind::Tcp, L4Kind::Udp, L4Kind::IcmpEcho { request: true }, L4Kind::Other, L4Kind::IcmpError { inner_l3: 28 }][kind];
        let t: Tuple = Tuple { src: A.into(), dst: B.into(), sport: 1, dport: 2, proto, zone: 0 };
        let orig = bytes.clone();
        if rewrite(&mut bytes, hdr_len, k, &t, CsumMode::Full).is_err() {
            prop_assert_eq!(&bytes, &orig);
        }
        let mut b2 = orig.clone();
        if rewrite_icmp_error(&mut b2, hdr_len, inner_l3, &t, A.into(), B.into(), CsumMode::Full).is_err() {
            prop_assert_eq!(&b2, &orig);
        }
        let _ = rewrite_addrs(&mut b2, A.into(), B.into());
    }
}

/// An address or port drawn mostly from values that stress the ones-complement edge cases.
fn edgy16() -> impl Strategy<Value = u16> {
    prop_oneof![
        Just(0u16),
        Just(0xffff),
        Just(1),
        Just(0xfffe),
        any::<u16>()
    ]
}

fn edgy_addr() -> impl Strategy<Value = [u8; 4]> {
    (edgy16(), edgy16()).prop_map(|(a, b)| {
        let [x, y] = a.to_be_bytes();
        let [z, w] = b.to_be_bytes();
        [x, y, z, w]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    /// The prepared fast path writes exactly the bytes `rewrite` writes, in both modes, for
    /// any stored checksums (valid or not).
    #[test]
    fn prop_prepared_matches_rewrite(
        k in arb_kind(),
        src in edgy_addr(), dst in edgy_addr(),
        sport in edgy16(), dport in edgy16(),
        payload in proptest::collection::vec(any::<u8>(), 0..30),
        opt_words in 0usize..=2,
        nsrc in edgy_addr(), ndst in edgy_addr(),
        nsport in edgy16(), ndport in edgy16(),
        keep in 0u8..8,
        ip_csum in edgy16(), l4_csum in prop::option::of(edgy16()),
        partial in any::<bool>(),
    ) {
        let opts = vec![1u8; opt_words * 4];
        let mut p = build(&k, src, dst, sport, dport, &payload, &opts);
        let h = hlen(&p);
        p[10..12].copy_from_slice(&ip_csum.to_be_bytes());
        if let Some(c) = l4_csum {
            let at = h + match k { Kind::Tcp => 16, Kind::Udp { .. } => 6, Kind::Echo { .. } => 2 };
            p[at..at + 2].copy_from_slice(&c.to_be_bytes());
        }
        let (t, kind) = tuple_of(&p);
        let mut n = new_tuple(&t, nsrc, ndst, nsport, ndport);
        // Keep some fields, as a DNAT or SNAT does.
        if keep & 1 != 0 { n.src = t.src; n.sport = t.sport; }
        if keep & 2 != 0 { n.dst = t.dst; n.dport = t.dport; }
        let mode = if partial { CsumMode::Partial } else { CsumMode::Full };
        let mut a = p.clone();
        let ra = rewrite(&mut a, h, kind, &n, mode);
        let prep = prepare(&t, kind, &n).unwrap();
        let mut b = p.clone();
        let rb = apply_prepared(&mut b, h, &prep, mode);
        prop_assert_eq!(ra.is_ok(), rb.is_ok());
        prop_assert_eq!(a, b);
    }
}

#[test]
fn prepared_refusals() {
    let p = tcp(A, B, 1, 2, b"", &[]);
    let (t, kind) = tuple_of(&p);
    let other = Tuple { proto: 17, ..t };
    assert!(prepare(&t, kind, &other).is_none());
    assert!(prepare(&t, L4Kind::Udp, &t).is_none());
    assert!(prepare(&t, L4Kind::IcmpError { inner_l3: 28 }, &t).is_none());
    // A TCP header shorter than 20 bytes is refused and left alone.
    let mut short = p[..30].to_vec();
    short[2..4].copy_from_slice(&30u16.to_be_bytes());
    let n = Tuple { dport: 9, ..t };
    let prep = prepare(&t, kind, &n).unwrap();
    let orig = short.clone();
    assert_eq!(
        apply_prepared(&mut short, 20, &prep, CsumMode::Full),
        Err(RewriteError::Truncated)
    );
    assert_eq!(short, orig);
}
