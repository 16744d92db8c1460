//! The rewrites of both families against packets built from scratch by etherparse (an
//! independent implementation of every checksum): translating a packet must give, byte for
//! byte, the packet etherparse builds with the new tuple. Each test is written once, generic
//! over the family, and run with one case per family.
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use etherparse::{
    icmpv4, icmpv6, Icmpv4Type, Icmpv6Type, IpHeaders, PacketBuilder, PacketBuilderStep,
};
use proptest::prelude::*;

use super::*;
use crate::wire::ipv6;
use crate::wire::tuple::{L4Kind, Tuple};

/// The ICMP errors a test sends, in either family's words.
#[derive(Clone, Copy)]
enum Err {
    /// IPv4 "fragmentation needed", IPv6 "packet too big" (MTU 1400).
    TooBig,
    /// Port unreachable.
    Port,
    /// TTL (hop limit) exceeded in transit.
    Ttl,
}

/// Per-family fixtures: etherparse's builders and the checked header the rewrite wants.
trait Fam: RewriteFamily {
    /// The address numbered `n` in a test network (`net` 0: pods, 1: Services, 2: node).
    fn addr(net: u8, n: u8) -> Self;
    fn from_bits(b: u128) -> Self;
    fn ip(src: Self, dst: Self) -> PacketBuilderStep<IpHeaders>;
    fn echo(t: &Tuple<Self>, request: bool, payload: &[u8]) -> Vec<u8>;
    fn error(src: Self, dst: Self, e: Err, quote: &[u8]) -> Vec<u8>;
    fn translate(p: &mut [u8], new: &Tuple<Self>, mode: CsumMode) -> Result<(), RewriteError>;
    fn translate_error(
        p: &mut [u8],
        inner_l3: usize,
        new: &Tuple<Self>,
        src: Self,
        dst: Self,
    ) -> Result<(), RewriteError>;
}

impl Fam for Ipv4Addr {
    fn addr(net: u8, n: u8) -> Ipv4Addr {
        [[10, 244, 1, n], [10, 96, 0, n], [172, 18, 0, n]][usize::from(net)].into()
    }
    fn from_bits(b: u128) -> Ipv4Addr {
        Ipv4Addr::from(crate::narrow::low32(crate::narrow::low64(b)))
    }
    fn ip(src: Ipv4Addr, dst: Ipv4Addr) -> PacketBuilderStep<IpHeaders> {
        PacketBuilder::ipv4(src.octets(), dst.octets(), 64)
    }
    fn echo(t: &Tuple<Ipv4Addr>, request: bool, payload: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        let b = Self::ip(t.src, t.dst);
        if request {
            b.icmpv4_echo_request(t.sport, 3).write(&mut v, payload)
        } else {
            b.icmpv4_echo_reply(t.sport, 3).write(&mut v, payload)
        }
        .unwrap();
        v
    }
    fn error(src: Ipv4Addr, dst: Ipv4Addr, e: Err, quote: &[u8]) -> Vec<u8> {
        use icmpv4::DestUnreachableHeader as U;
        let ty = match e {
            Err::TooBig => {
                Icmpv4Type::DestinationUnreachable(U::FragmentationNeeded { next_hop_mtu: 1400 })
            }
            Err::Port => Icmpv4Type::DestinationUnreachable(U::Port),
            Err::Ttl => Icmpv4Type::TimeExceeded(icmpv4::TimeExceededCode::TtlExceededInTransit),
        };
        let mut v = Vec::new();
        Self::ip(src, dst).icmpv4(ty).write(&mut v, quote).unwrap();
        v
    }
    fn translate(p: &mut [u8], new: &Tuple, mode: CsumMode) -> Result<(), RewriteError> {
        let h = usize::from(p[0] & 0x0f) * 4;
        let (_, kind) = Tuple::from_ipv4(p, h, p.len()).unwrap();
        rewrite(p, h, kind, new, mode)
    }
    fn translate_error(
        p: &mut [u8],
        inner_l3: usize,
        new: &Tuple,
        src: Ipv4Addr,
        dst: Ipv4Addr,
    ) -> Result<(), RewriteError> {
        let h = usize::from(p[0] & 0x0f) * 4;
        rewrite_icmp_error(p, h, inner_l3, new, src, dst, CsumMode::Full)
    }
}

impl Fam for Ipv6Addr {
    fn addr(net: u8, n: u8) -> Ipv6Addr {
        let net = [0x244, 0x96, 0x172][usize::from(net)];
        Ipv6Addr::new(0xfd00, 0x10, net, 0, 0, 0, 0, n.into())
    }
    fn from_bits(b: u128) -> Ipv6Addr {
        Ipv6Addr::from(b)
    }
    fn ip(src: Ipv6Addr, dst: Ipv6Addr) -> PacketBuilderStep<IpHeaders> {
        PacketBuilder::ipv6(src.octets(), dst.octets(), 64)
    }
    fn echo(t: &Tuple<Ipv6Addr>, request: bool, payload: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        let b = Self::ip(t.src, t.dst);
        if request {
            b.icmpv6_echo_request(t.sport, 3).write(&mut v, payload)
        } else {
            b.icmpv6_echo_reply(t.sport, 3).write(&mut v, payload)
        }
        .unwrap();
        v
    }
    fn error(src: Ipv6Addr, dst: Ipv6Addr, e: Err, quote: &[u8]) -> Vec<u8> {
        let ty = match e {
            Err::TooBig => Icmpv6Type::PacketTooBig { mtu: 1400 },
            Err::Port => Icmpv6Type::DestinationUnreachable(icmpv6::DestUnreachableCode::Port),
            Err::Ttl => Icmpv6Type::TimeExceeded(icmpv6::TimeExceededCode::HopLimitExceeded),
        };
        let mut v = Vec::new();
        Self::ip(src, dst).icmpv6(ty).write(&mut v, quote).unwrap();
        v
    }
    fn translate(p: &mut [u8], new: &Tuple<Ipv6Addr>, mode: CsumMode) -> Result<(), RewriteError> {
        let info = ipv6::check(p).unwrap();
        let (_, kind) = Tuple::from_ipv6(p, &info).unwrap();
        rewrite(p, &info, kind, new, mode)
    }
    fn translate_error(
        p: &mut [u8],
        inner_l3: usize,
        new: &Tuple<Ipv6Addr>,
        src: Ipv6Addr,
        dst: Ipv6Addr,
    ) -> Result<(), RewriteError> {
        let info = ipv6::check(p).unwrap();
        rewrite_icmp_error(p, &info, inner_l3, new, src, dst, CsumMode::Full)
    }
}

fn tcp_of<A: Fam>(t: &Tuple<A>, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    A::ip(t.src, t.dst)
        .tcp(t.sport, t.dport, 0x0102_0304, 64240)
        .ack(0x0506_0708)
        .write(&mut v, payload)
        .unwrap();
    v
}

fn udp_of<A: Fam>(t: &Tuple<A>, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    A::ip(t.src, t.dst)
        .udp(t.sport, t.dport)
        .write(&mut v, payload)
        .unwrap();
    v
}

fn client<A: Fam>() -> Tuple<A> {
    Tuple {
        src: A::addr(0, 2),
        dst: A::addr(1, 10),
        sport: 40000,
        dport: 80,
        proto: 6,
        zone: 0,
    }
}

/// The client's tuple after DNAT to an endpoint.
fn dnat<A: Fam>(t: &Tuple<A>) -> Tuple<A> {
    Tuple {
        dst: A::addr(0, 7),
        dport: 8080,
        ..*t
    }
}

/// Equal, but for a checksum of 0 against its twin 0xffff (an incremental update may land on
/// either; every checksum field is at an even offset).
fn same_but_twins(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len()
        && a.chunks(2).zip(b.chunks(2)).all(|(x, y)| {
            x == y || (x.len() == 2 && x.iter().chain(y).all(|&c| c == 0 || c == 0xff))
        })
}

fn tcp_dnat_and_back<A: Fam>() {
    let t = client::<A>();
    let new = dnat(&t);
    let mut p = tcp_of(&t, b"GET / HTTP/1.1\r\n\r\n");
    let orig = p.clone();
    A::translate(&mut p, &new, CsumMode::Full).unwrap();
    assert!(same_but_twins(&p, &tcp_of(&new, b"GET / HTTP/1.1\r\n\r\n")));
    A::translate(&mut p, &t, CsumMode::Full).unwrap();
    assert_eq!(p, orig);
}

#[test]
fn tcp_dnat_and_back_matches_a_packet_built_from_scratch() {
    tcp_dnat_and_back::<Ipv4Addr>();
    tcp_dnat_and_back::<Ipv6Addr>();
}

fn udp_and_echo<A: Fam>() {
    let t = Tuple {
        proto: 17,
        dport: 53,
        ..client::<A>()
    };
    let new = Tuple {
        src: A::addr(2, 2),
        sport: 61000,
        ..t
    };
    let mut p = udp_of(&t, b"query");
    A::translate(&mut p, &new, CsumMode::Full).unwrap();
    assert!(same_but_twins(&p, &udp_of(&new, b"query")));
    // ICMP echo: the identifier changes; an ICMPv6 checksum has a pseudo-header (unlike
    // ICMPv4's) and gets the address change too.
    let e = Tuple {
        proto: A::ICMP.number(),
        sport: 7,
        dport: 7,
        ..client::<A>()
    };
    let ne = Tuple {
        src: A::addr(2, 2),
        sport: 1024,
        dport: 1024,
        ..e
    };
    for request in [true, false] {
        let mut p = A::echo(&e, request, b"ping");
        A::translate(&mut p, &ne, CsumMode::Full).unwrap();
        assert!(same_but_twins(&p, &A::echo(&ne, request, b"ping")));
    }
}

#[test]
fn udp_and_echo_translate_with_their_pseudo_header() {
    udp_and_echo::<Ipv4Addr>();
    udp_and_echo::<Ipv6Addr>();
}

/// The uncomplemented pseudo-header sum a `NEEDS_CSUM` field holds, computed from scratch
/// (the same sum in both families: addresses, protocol, length).
fn pseudo_partial<A: Fam>(src: A, dst: A, proto: u8, len: usize) -> u16 {
    let octets = |a: A| match a.into() {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    };
    let mut s: u64 = 0;
    for c in octets(src).chunks(2).chain(octets(dst).chunks(2)) {
        s += u64::from(u16::from_be_bytes([c[0], c[1]]));
    }
    s += (len as u64 >> 16) + (len as u64 & 0xffff) + u64::from(proto);
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    u16::try_from(s).unwrap()
}

fn partial_tcp<A: Fam>() {
    let t = client::<A>();
    let new = dnat(&t);
    let mut p = tcp_of(&t, b"xyz");
    let l4 = A::HEADER_LEN;
    let l4len = p.len() - l4;
    let field = l4 + 16;
    p[field..field + 2].copy_from_slice(&pseudo_partial(t.src, t.dst, 6, l4len).to_be_bytes());
    A::translate(&mut p, &new, CsumMode::Partial).unwrap();
    assert_eq!(
        u16::from_be_bytes([p[field], p[field + 1]]),
        pseudo_partial(new.src, new.dst, 6, l4len)
    );
    assert_eq!(&p[l4..l4 + 4], &[0x9c, 0x40, 0x1f, 0x90]);
}

#[test]
fn partial_checksums_get_the_address_change_only() {
    partial_tcp::<Ipv4Addr>();
    partial_tcp::<Ipv6Addr>();
}

fn too_big_about_dnat<A: Fam>() {
    // The client's segment after DNAT (client -> endpoint:8080) met a link with a smaller
    // MTU; the router there tells the client. The client must see its own packet quoted:
    // client -> ClusterIP:80.
    let t = client::<A>();
    let dnat = dnat(&t);
    let router = A::addr(2, 1);
    let inner_l3 = A::HEADER_LEN + 8;
    let mut p = A::error(router, t.src, Err::TooBig, &tcp_of(&dnat, &[0xaa; 100]));
    A::translate_error(&mut p, inner_l3, &t, router, t.src).unwrap();
    let want = A::error(router, t.src, Err::TooBig, &tcp_of(&t, &[0xaa; 100]));
    assert!(same_but_twins(&p, &want));
    // An error whose outer addresses change too (a masqueraded client: the error comes to
    // the node's address and goes on to the pod).
    let node = A::addr(2, 2);
    let masq = Tuple {
        src: node,
        sport: 61000,
        proto: 17,
        ..dnat
    };
    let mut p = A::error(router, node, Err::Port, &udp_of(&masq, b"dns"));
    let inner = Tuple { proto: 17, ..dnat };
    A::translate_error(&mut p, inner_l3, &inner, router, t.src).unwrap();
    let want = A::error(router, t.src, Err::Port, &udp_of(&inner, b"dns"));
    assert!(same_but_twins(&p, &want));
}

#[test]
fn packet_too_big_about_a_dnat_connection_is_translated_inner_header_and_all() {
    too_big_about_dnat::<Ipv4Addr>();
    too_big_about_dnat::<Ipv6Addr>();
}

fn short_quote<A: Fam>() {
    let t = client::<A>();
    let dnat = dnat(&t);
    let inner_l3 = A::HEADER_LEN + 8;
    // Only 8 bytes of TCP quoted: ports translated, the (unquoted) checksum not touched.
    let quote = tcp_of(&dnat, b"");
    let router = A::addr(2, 9);
    let mut p = A::error(router, t.src, Err::Ttl, &quote[..A::HEADER_LEN + 8]);
    A::translate_error(&mut p, inner_l3, &t, router, t.src).unwrap();
    let want = tcp_of(&t, b"");
    let n = A::HEADER_LEN + 4;
    assert!(same_but_twins(&p[inner_l3..inner_l3 + n], &want[..n]));
    // Every refusal leaves the bytes alone.
    let before = p.clone();
    let udp = Tuple { proto: 17, ..t };
    assert!(matches!(
        A::translate_error(&mut p, inner_l3, &udp, t.dst, t.src),
        Err(RewriteError::ProtoMismatch { .. })
    ));
    assert_eq!(
        A::translate_error(&mut p, A::HEADER_LEN, &t, t.dst, t.src),
        Err(RewriteError::BadIcmpError)
    );
    assert_eq!(p, before);
}

#[test]
fn a_short_quote_keeps_the_ports_right_and_checks_refuse_before_writing() {
    short_quote::<Ipv4Addr>();
    short_quote::<Ipv6Addr>();
}

/// Any TCP or UDP translation of family `A` between the address bits given matches a fresh
/// packet and round-trips.
fn any_translation<A: Fam>(
    (s, d, ns, nd): (u128, u128, u128, u128),
    (sp, dp, nsp, ndp): (u16, u16, u16, u16),
    udp: bool,
    payload: &[u8],
) -> Result<(), TestCaseError> {
    let t = Tuple {
        src: A::from_bits(s),
        dst: A::from_bits(d),
        sport: sp,
        dport: dp,
        proto: if udp { 17 } else { 6 },
        zone: 0,
    };
    let new = Tuple {
        src: A::from_bits(ns),
        dst: A::from_bits(nd),
        sport: nsp,
        dport: ndp,
        ..t
    };
    let build = |x: &Tuple<A>| {
        if udp {
            udp_of(x, payload)
        } else {
            tcp_of(x, payload)
        }
    };
    let mut p = build(&t);
    let orig = p.clone();
    A::translate(&mut p, &new, CsumMode::Full).unwrap();
    // A computed UDP 0 is sent as 0xffff; an incremental update may land on either twin.
    prop_assert!(same_but_twins(&p, &build(&new)));
    A::translate(&mut p, &t, CsumMode::Full).unwrap();
    prop_assert_eq!(p, orig);
    Ok(())
}

proptest! {
    #[test]
    fn any_tcp_or_udp_translation_matches_a_fresh_packet_and_round_trips(
        s in any::<u128>(), d in any::<u128>(), ns in any::<u128>(), nd in any::<u128>(),
        sp in any::<u16>(), dp in any::<u16>(), nsp in any::<u16>(), ndp in any::<u16>(),
        udp in any::<bool>(), payload in proptest::collection::vec(any::<u8>(), 0..64),
    ) {
        let (a, p) = ((s, d, ns, nd), (sp, dp, nsp, ndp));
        any_translation::<Ipv4Addr>(a, p, udp, &payload)?;
        // IPv6: addresses a checked header refuses (multicast source, loopback
        // destination) are left out.
        let ok = |x: u128, y: u128| ipv6::check(&udp_of(&Tuple {
            src: Ipv6Addr::from(x), dst: Ipv6Addr::from(y), sport: 1, dport: 1, proto: 17, zone: 0,
        }, b"")).is_ok();
        if ok(s, d) && ok(ns, nd) {
            any_translation::<Ipv6Addr>(a, p, udp, &payload)?;
        }
    }

    #[test]
    fn ipv6_rewrites_never_panic_on_garbage(
        bytes in proptest::collection::vec(any::<u8>(), 40..200),
        inner_l3 in 0usize..200,
    ) {
        let mut p = bytes;
        p[0] = 0x60;
        let n = u16::try_from(p.len() - 40).unwrap();
        p[4..6].copy_from_slice(&n.to_be_bytes());
        if let Ok(info) = ipv6::check(&p) {
            let t = client::<Ipv6Addr>();
            for kind in [L4Kind::Tcp, L4Kind::Udp, L4Kind::IcmpEcho { request: true }, L4Kind::Other] {
                let new = Tuple { proto: info.next_header, ..t };
                let _ = rewrite(&mut p, &info, kind, &new, CsumMode::Full);
                let _ = rewrite(&mut p, &info, kind, &new, CsumMode::Partial);
            }
            let new = Tuple { proto: 6, ..t };
            let _ = rewrite_icmp_error(&mut p, &info, inner_l3, &new, t.src, t.dst, CsumMode::Full);
            let _ = Tuple::from_ipv6(&p, &info);
        }
    }
}
