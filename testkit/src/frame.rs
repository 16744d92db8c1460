//! Frames of either family for tests, benches and fuzz targets: Ethernet, TCP and UDP
//! (built with etherparse, so independently of tapyard's own writers), what a frame carries
//! ([`flow`], every checksum checked) and the Internet checksum.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use etherparse::{NetSlice, PacketBuilder, PacketBuilderStep, SlicedPacket, TransportSlice};
use tapyard::wire::family::IpProto;
use tapyard::MacAddr;

/// TCP flag bits, as [`tcp`] takes them.
pub const FIN: u8 = 0x01;
/// SYN.
pub const SYN: u8 = 0x02;
/// RST.
pub const RST: u8 = 0x04;
/// ACK.
pub const ACK: u8 = 0x10;
/// SYN and ACK.
pub const SYNACK: u8 = SYN | ACK;

/// An address a frame builder takes: `[u8; 4]`, `Ipv4Addr`, `Ipv6Addr`, `IpAddr`, or a
/// string (parsed).
pub trait ToIp {
    /// The address.
    fn to_ip(&self) -> IpAddr;
}

impl ToIp for [u8; 4] {
    fn to_ip(&self) -> IpAddr {
        IpAddr::from(*self)
    }
}

impl ToIp for Ipv4Addr {
    fn to_ip(&self) -> IpAddr {
        IpAddr::V4(*self)
    }
}

impl ToIp for Ipv6Addr {
    fn to_ip(&self) -> IpAddr {
        IpAddr::V6(*self)
    }
}

impl ToIp for IpAddr {
    fn to_ip(&self) -> IpAddr {
        *self
    }
}

impl<T: ToIp + ?Sized> ToIp for &T {
    fn to_ip(&self) -> IpAddr {
        (**self).to_ip()
    }
}

impl ToIp for String {
    fn to_ip(&self) -> IpAddr {
        self.as_str().to_ip()
    }
}

impl ToIp for str {
    fn to_ip(&self) -> IpAddr {
        self.parse()
            .unwrap_or_else(|e| panic!("{self:?}: not an address: {e}"))
    }
}

/// The IPv6 address `s`; panics if it is not one.
pub fn ip6(s: &str) -> Ipv6Addr {
    s.parse()
        .unwrap_or_else(|e| panic!("{s:?}: not an IPv6 address: {e}"))
}

/// An address a frame reader returns ([`flow`]): `[u8; 4]`, `Ipv4Addr`, `Ipv6Addr` or
/// `IpAddr`; a frame of the other family does not convert.
pub trait FromIp: Sized {
    /// `ip` as `Self`, if of its family.
    fn from_ip(ip: IpAddr) -> Option<Self>;
}

impl FromIp for [u8; 4] {
    fn from_ip(ip: IpAddr) -> Option<Self> {
        Ipv4Addr::from_ip(ip).map(|a| a.octets())
    }
}

impl FromIp for Ipv4Addr {
    fn from_ip(ip: IpAddr) -> Option<Self> {
        match ip {
            IpAddr::V4(a) => Some(a),
            IpAddr::V6(_) => None,
        }
    }
}

impl FromIp for Ipv6Addr {
    fn from_ip(ip: IpAddr) -> Option<Self> {
        match ip {
            IpAddr::V6(a) => Some(a),
            IpAddr::V4(_) => None,
        }
    }
}

impl FromIp for IpAddr {
    fn from_ip(ip: IpAddr) -> Option<Self> {
        Some(ip)
    }
}

/// An Ethernet frame `src` -> `dst` of `ethertype` carrying `payload`, padded to the
/// 60-byte minimum.
pub fn eth(dst: MacAddr, src: MacAddr, ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = Vec::with_capacity(64.max(14 + payload.len()));
    f.extend_from_slice(&dst.0);
    f.extend_from_slice(&src.0);
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(payload);
    if f.len() < 60 {
        f.resize(60, 0);
    }
    f
}

/// A 64-byte frame `src` -> `dst` of EtherType 0x88b5 (local experimental) carrying `seq`:
/// for tests that count frames and check their order.
pub fn seq_frame(dst: MacAddr, src: MacAddr, seq: u32) -> Vec<u8> {
    let mut payload = [0u8; 50];
    payload[..4].copy_from_slice(&seq.to_be_bytes());
    eth(dst, src, 0x88b5, &payload)
}

/// etherparse's builder for an IP packet `src` -> `dst` (IPv4 or IPv6, as the addresses are;
/// `ttl` is the hop limit for IPv6) in an Ethernet frame `src_mac` -> `dst_mac`: add the
/// transport and write.
pub fn ip(
    src_mac: MacAddr,
    dst_mac: MacAddr,
    src: impl ToIp,
    dst: impl ToIp,
    ttl: u8,
) -> PacketBuilderStep<etherparse::IpHeaders> {
    let b = PacketBuilder::ethernet2(src_mac.0, dst_mac.0);
    match (src.to_ip(), dst.to_ip()) {
        (IpAddr::V4(s), IpAddr::V4(d)) => b.ipv4(s.octets(), d.octets(), ttl),
        (IpAddr::V6(s), IpAddr::V6(d)) => b.ipv6(s.octets(), d.octets(), ttl),
        (s, d) => panic!("{s} -> {d}: addresses of two families"),
    }
}

/// What a TCP segment carries besides its addresses, ports and flags.
#[derive(Clone, Copy, Debug)]
pub struct Segment<'a> {
    /// Sequence number.
    pub seq: u32,
    /// Acknowledgment number (sent with [`ACK`]).
    pub ack: u32,
    /// Window.
    pub window: u16,
    /// TTL (IPv4) or hop limit (IPv6).
    pub ttl: u8,
    /// Payload.
    pub payload: &'a [u8],
}

impl Segment<'_> {
    /// What [`tcp`] sends: sequence 1000, acknowledging 5000, window 64240, TTL 64, `hello`.
    pub const HELLO: Segment<'static> = Segment {
        seq: 1000,
        ack: 5000,
        window: 64240,
        ttl: 64,
        payload: b"hello",
    };
}

/// A TCP segment `src:sport` -> `dst:dport` (either family) with `flags` ([`SYN`], [`ACK`],
/// [`FIN`], [`RST`]), as [`Segment::HELLO`].
#[allow(clippy::too_many_arguments)]
pub fn tcp(
    src_mac: MacAddr,
    dst_mac: MacAddr,
    src: impl ToIp,
    sport: u16,
    dst: impl ToIp,
    dport: u16,
    flags: u8,
) -> Vec<u8> {
    tcp_with(
        src_mac,
        dst_mac,
        (src, sport),
        (dst, dport),
        flags,
        &Segment::HELLO,
    )
}

/// A TCP segment `src` -> `dst` (address and port, either family) with `flags` and `seg`.
pub fn tcp_with(
    src_mac: MacAddr,
    dst_mac: MacAddr,
    src: (impl ToIp, u16),
    dst: (impl ToIp, u16),
    flags: u8,
    seg: &Segment<'_>,
) -> Vec<u8> {
    let mut b = ip(src_mac, dst_mac, src.0, dst.0, seg.ttl).tcp(src.1, dst.1, seg.seq, seg.window);
    if flags & SYN != 0 {
        b = b.syn();
    }
    if flags & ACK != 0 {
        b = b.ack(seg.ack);
    }
    if flags & FIN != 0 {
        b = b.fin();
    }
    if flags & RST != 0 {
        b = b.rst();
    }
    let mut f = Vec::new();
    b.write(&mut f, seg.payload).expect("a TCP frame");
    f
}

/// A UDP datagram `src:sport` -> `dst:dport` (either family, TTL 64) carrying `query`.
pub fn udp(
    src_mac: MacAddr,
    dst_mac: MacAddr,
    src: impl ToIp,
    sport: u16,
    dst: impl ToIp,
    dport: u16,
) -> Vec<u8> {
    udp_with(src_mac, dst_mac, (src, sport), (dst, dport), 64, b"query")
}

/// A UDP datagram `src` -> `dst` (address and port, either family) with TTL (hop limit)
/// `ttl` carrying `payload`.
pub fn udp_with(
    src_mac: MacAddr,
    dst_mac: MacAddr,
    src: (impl ToIp, u16),
    dst: (impl ToIp, u16),
    ttl: u8,
    payload: &[u8],
) -> Vec<u8> {
    let mut f = Vec::new();
    ip(src_mac, dst_mac, src.0, dst.0, ttl)
        .udp(src.1, dst.1)
        .write(&mut f, payload)
        .expect("a UDP frame");
    f
}

/// What a frame carries: `(src, sport, dst, dport)` of its TCP segment or UDP datagram, of
/// the family `A` is; panics unless it is one, of that family, with every checksum right.
pub fn flow<A: FromIp>(f: &[u8]) -> (A, u16, A, u16) {
    let p = SlicedPacket::from_ethernet(f).unwrap_or_else(|e| panic!("{e}: {f:?}"));
    let (src, dst, pseudo) = match &p.net {
        Some(NetSlice::Ipv4(ip)) => {
            let h = ip.header().to_header();
            assert_eq!(h.header_checksum, h.calc_header_checksum(), "IPv4 checksum");
            let pseudo = sum(&h.source, 0) + sum(&h.destination, 0);
            (IpAddr::from(h.source), IpAddr::from(h.destination), pseudo)
        }
        Some(NetSlice::Ipv6(ip)) => {
            let h = ip.header().to_header();
            let pseudo = sum(&h.source, 0) + sum(&h.destination, 0);
            (IpAddr::from(h.source), IpAddr::from(h.destination), pseudo)
        }
        other => panic!("not IP: {other:?}"),
    };
    let (sport, dport, l4, proto) = match &p.transport {
        Some(TransportSlice::Tcp(t)) => (
            t.source_port(),
            t.destination_port(),
            t.slice(),
            IpProto::TCP,
        ),
        Some(TransportSlice::Udp(u)) => (
            u.source_port(),
            u.destination_port(),
            u.slice(),
            IpProto::UDP,
        ),
        other => panic!("not TCP/UDP: {other:?}"),
    };
    let len = u32::try_from(l4.len()).expect("a segment's length");
    let total = pseudo + u32::from(proto.number()) + len;
    assert_eq!(fold(sum(l4, total)), 0xffff, "{proto} checksum");
    let want =
        |a: IpAddr| A::from_ip(a).unwrap_or_else(|| panic!("{a}: not of the family asked for"));
    (want(src), sport, want(dst), dport)
}

/// `init` plus the 16-bit big-endian words of `b` (an odd last byte padded with zero),
/// unfolded.
pub fn sum(b: &[u8], init: u32) -> u32 {
    let mut s = init;
    for c in b.chunks(2) {
        s += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
    }
    s
}

/// `s` folded to 16 bits (ones' complement).
pub fn fold(mut s: u32) -> u16 {
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    u16::try_from(s).expect("folded")
}

/// Whether `b` (a header with its checksum in place) sums to 0xffff.
pub fn checksum_ok(b: &[u8]) -> bool {
    fold(sum(b, 0)) == 0xffff
}

/// Whether every checksum of the whole, unfragmented IP packet `ip` (either family, no IPv6
/// extension headers) is right: the IPv4 header's, and TCP's, UDP's (zero is none, over
/// IPv4), ICMP's or ICMPv6's; a packet too short to tell passes.
pub fn l4_checksums_ok(ip: &[u8]) -> bool {
    let Some(&v) = ip.first() else { return true };
    let (l4, proto, pseudo) = match v >> 4 {
        4 if ip.len() >= 20 => {
            let hl = usize::from(v & 15) * 4;
            let total = usize::from(u16::from_be_bytes([ip[2], ip[3]])).min(ip.len());
            if hl < 20 || hl > total || !checksum_ok(&ip[..hl]) {
                return false;
            }
            (&ip[hl..total], ip[9], sum(&ip[12..20], 0))
        }
        6 if ip.len() >= 40 => {
            let plen = usize::from(u16::from_be_bytes([ip[4], ip[5]]));
            let Some(l4) = ip.get(40..40 + plen) else {
                return true;
            };
            (l4, ip[6], sum(&ip[8..40], 0))
        }
        _ => return true,
    };
    let len = u32::try_from(l4.len()).expect("a packet's length");
    let with_pseudo = || fold(sum(l4, pseudo + u32::from(proto) + len)) == 0xffff;
    match IpProto(proto) {
        IpProto::TCP | IpProto::ICMPV6 => with_pseudo(),
        IpProto::UDP => l4.len() < 8 || (v >> 4 == 4 && l4[6] == 0 && l4[7] == 0) || with_pseudo(),
        IpProto::ICMP => checksum_ok(l4),
        _ => true,
    }
}

/// Cuts the unfragmented IP datagram in Ethernet frame `f` (untagged, no IPv6 extension
/// headers) into fragments of at most `size` bytes of IP packet, as a host would send them
/// (identification `id`; IPv6 gets a fragment header). Written here byte by byte, apart from
/// tapyard's own code, to test it against.
pub fn fragments(f: &[u8], size: usize, id: u32) -> Vec<Vec<u8>> {
    let (eth, ip) = f.split_at(14);
    let v6 = ip[0] >> 4 == 6;
    let (hl, extra) = if v6 {
        (40, 8)
    } else {
        (usize::from(ip[0] & 15) * 4, 0)
    };
    let payload = &ip[hl..];
    let per = (size - hl - extra) & !7;
    let mut out = Vec::new();
    let mut at = 0;
    while at < payload.len() {
        let n = per.min(payload.len() - at);
        let more = at + n < payload.len();
        let mut p = eth.to_vec();
        let mut h = ip[..hl].to_vec();
        if v6 {
            h[4..6].copy_from_slice(&u16::try_from(8 + n).unwrap().to_be_bytes());
            let next = h[6];
            h[6] = 44;
            h.extend_from_slice(&[next, 0]);
            let off = u16::try_from(at).unwrap() | u16::from(more);
            h.extend_from_slice(&off.to_be_bytes());
            h.extend_from_slice(&id.to_be_bytes());
        } else {
            h[2..4].copy_from_slice(&u16::try_from(hl + n).unwrap().to_be_bytes());
            h[4..6].copy_from_slice(&u16::try_from(id & 0xffff).unwrap().to_be_bytes());
            let off = u16::try_from(at / 8).unwrap() | if more { 0x2000 } else { 0 };
            h[6..8].copy_from_slice(&off.to_be_bytes());
            h[10..12].fill(0);
            let c = !fold(sum(&h, 0));
            h[10..12].copy_from_slice(&c.to_be_bytes());
        }
        p.extend_from_slice(&h);
        p.extend_from_slice(&payload[at..at + n]);
        out.push(p);
        at += n;
    }
    out
}

/// Puts the fragments `frags` (Ethernet frames, any order, as [`fragments`] makes them or a
/// router sends them) back together as one Ethernet frame, checking that they are fragments
/// of one datagram that fit without holes or overlaps; `None` when they do not.
pub fn reassemble(frags: &[Vec<u8>]) -> Option<Vec<u8>> {
    let mut parts = Vec::new();
    let mut first = None;
    let mut key = None;
    for f in frags {
        let ip = f.get(14..)?;
        let v6 = ip.first()? >> 4 == 6;
        let (k, off, more, data, hdr) = if v6 {
            if *ip.get(6)? != 44 {
                return None;
            }
            let plen = usize::from(u16::from_be_bytes([ip[4], ip[5]]));
            let fh = ip.get(40..48)?;
            let w = u16::from_be_bytes([fh[2], fh[3]]);
            let k = (ip[8..40].to_vec(), fh[4..8].to_vec(), fh[0]);
            let mut hdr = ip[..40].to_vec();
            hdr[6] = fh[0];
            (
                k,
                usize::from(w & !7),
                w & 1 != 0,
                ip.get(48..40 + plen)?,
                hdr,
            )
        } else {
            let hl = usize::from(ip[0] & 15) * 4;
            let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
            let w = u16::from_be_bytes([ip[6], ip[7]]);
            if !checksum_ok(ip.get(..hl)?) {
                return None;
            }
            let k = (ip[12..20].to_vec(), ip[4..6].to_vec(), ip[9]);
            let hdr = ip[..hl].to_vec();
            (
                k,
                usize::from(w & 0x1fff) * 8,
                w & 0x2000 != 0,
                ip.get(hl..total)?,
                hdr,
            )
        };
        if *key.get_or_insert_with(|| k.clone()) != k {
            return None;
        }
        if off == 0 {
            first = Some((f[..14].to_vec(), hdr));
        }
        parts.push((off, more, data.to_vec()));
    }
    parts.sort_by_key(|p| p.0);
    let mut payload = Vec::new();
    for (i, (off, more, data)) in parts.iter().enumerate() {
        if *off != payload.len() || (*more != (i + 1 < parts.len())) {
            return None;
        }
        payload.extend_from_slice(data);
    }
    let (eth, mut hdr) = first?;
    if hdr[0] >> 4 == 6 {
        hdr[4..6].copy_from_slice(&u16::try_from(payload.len()).ok()?.to_be_bytes());
    } else {
        let total = u16::try_from(hdr.len() + payload.len()).ok()?;
        hdr[2..4].copy_from_slice(&total.to_be_bytes());
        hdr[6] &= 0x40;
        hdr[7] = 0;
        hdr[10..12].fill(0);
        let c = !fold(sum(&hdr, 0));
        hdr[10..12].copy_from_slice(&c.to_be_bytes());
    }
    let mut f = eth;
    f.extend_from_slice(&hdr);
    f.extend_from_slice(&payload);
    Some(f)
}
