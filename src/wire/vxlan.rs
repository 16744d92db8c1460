//! VXLAN (RFC 7348): the 8-byte header ([`VxlanPacket`], [`VxlanRepr`]) and the outer
//! headers of an encapsulated frame over IPv4 ([`Outer`]: Ethernet + IPv4 + UDP + VXLAN,
//! [`OVERHEAD`] bytes written into a buffer's headroom) or over IPv6 ([`Outer<Ipv6Addr>`]:
//! Ethernet + IPv6 + UDP + VXLAN, [`overhead::<Ipv6Addr>()`](overhead) bytes). Decapsulation reads them with [`parse_udp`]
//! (which refuses a zero UDP checksum over IPv6, as Linux does).
//!
//! The outer UDP checksum is filled the way Linux's vxlan device does on 6.x: computed (not
//! zero). Three ways are offered, cheapest first: [`Outer::partial_csum`] leaves it for the
//! port to finish (virtio `NEEDS_CSUM` on the outer UDP header), [`fill_csum_lco`] derives
//! it from the inner L4 checksum's pseudo-header (Linux's local checksum offload: the inner
//! segment is checksummed, or will be by whoever completes its partial checksum, so its bytes
//! sum to the complement of its pseudo-header), and [`fill_csum`] sums every byte.
//!
//! ```
//! use tapyard::wire::vxlan::{VxlanPacket, VxlanRepr};
//! let b = [0x08, 0, 0, 0, 0, 0, 1, 0];
//! let p = VxlanPacket::new_checked(&b[..]).unwrap();
//! assert_eq!(VxlanRepr::parse(&p), Ok(VxlanRepr { vni: 1 }));
//! ```

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::narrow::len16;
use crate::wire::checksum::{self, PseudoHeader};
use crate::wire::ethernet::{self, ethertype, EthernetFrame};
use crate::wire::family::{self, Family, IpProto};
use crate::wire::ipv4::{self, Ipv4Packet, PROTO_UDP};
use crate::wire::ipv6::{self, Ipv6Packet};
use crate::wire::mac::MacAddr;
use crate::wire::udp::{self, UdpPacket};
use crate::wire::Error;

mod field {
    use std::ops::Range;
    pub const FLAGS: usize = 0;
    pub const RESERVED1: Range<usize> = 1..4;
    pub const VNI: Range<usize> = 4..7;
    pub const RESERVED2: usize = 7;
    pub const PAYLOAD: usize = 8;
}

/// Length of the VXLAN header.
pub const HEADER_LEN: usize = field::PAYLOAD;

/// The I flag: the VNI is valid (the only flag RFC 7348 defines).
pub const FLAG_I: u8 = 0x08;

/// The largest VNI (24 bits).
pub const MAX_VNI: u32 = (1 << 24) - 1;

/// IANA's VXLAN port.
pub const IANA_PORT: u16 = 4789;

/// Where the outer IPv4 header starts in an encapsulated frame.
pub const OUTER_L3: usize = ethernet::HEADER_LEN;
/// Where the outer UDP header starts.
pub const OUTER_L4: usize = OUTER_L3 + ipv4::HEADER_LEN;
/// Where the VXLAN header starts.
pub const OUTER_VXLAN: usize = OUTER_L4 + udp::HEADER_LEN;

/// Bytes in front of the inner frame over an underlay of family `A`: outer Ethernet (14), IPv4
/// (20) or IPv6 (40), UDP (8), VXLAN (8): 50 or 70. The VXLAN interface's MTU is its uplink's
/// minus this (over IPv6 as Linux's `VXLAN6_HEADROOM` and Flannel's).
pub const fn overhead<A: Family>() -> usize {
    OUTER_L3 + A::HEADER_LEN + udp::HEADER_LEN + HEADER_LEN
}

/// [`overhead`] over IPv4 (50).
pub const OVERHEAD: usize = overhead::<Ipv4Addr>();

/// Where the outer UDP header starts over an IPv6 underlay.
pub const OUTER6_L4: usize = OUTER_L3 + ipv6::HEADER_LEN;
/// Where the VXLAN header starts over an IPv6 underlay.
pub const OUTER6_VXLAN: usize = OUTER6_L4 + udp::HEADER_LEN;
/// [`overhead`] over IPv6 (70), the size of [`Outer<Ipv6Addr>`]'s headers.
const OVERHEAD_IPV6: usize = overhead::<Ipv6Addr>();

/// Linux's default outer hop limit for a vxlan device over IPv6 (`ttl` unset: the route's
/// hop limit, `ip6_dst_hoplimit`, 64 with the default `net.ipv6.conf.all.hop_limit`).
pub const DEFAULT_HOP_LIMIT: u8 = 64;

/// A view of a VXLAN header. [`VxlanPacket::new_checked`] checks that the 8 bytes are there;
/// after it no accessor panics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VxlanPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> VxlanPacket<T> {
    /// Wraps a buffer without checking it: accessors panic if it is shorter than 8 bytes.
    #[inline]
    pub const fn new_unchecked(buffer: T) -> Self {
        VxlanPacket { buffer }
    }

    /// Wraps a buffer of at least 8 bytes.
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self, Error> {
        if buffer.as_ref().len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        Ok(VxlanPacket { buffer })
    }

    #[inline(always)]
    fn header(&self) -> &[u8; HEADER_LEN] {
        self.buffer
            .as_ref()
            .first_chunk()
            .expect("VXLAN header checked by new_checked")
    }

    /// The flags byte.
    #[inline]
    pub fn flags(&self) -> u8 {
        self.header()[field::FLAGS]
    }

    /// The VXLAN network identifier.
    #[inline]
    pub fn vni(&self) -> u32 {
        let h = self.header();
        u32::from_be_bytes([
            0,
            h[field::VNI.start],
            h[field::VNI.start + 1],
            h[field::VNI.start + 2],
        ])
    }

    /// True when the flags are exactly I and both reserved fields are zero, as Linux's vxlan
    /// requires when no extension (GBP, GPE, remote checksum offload) is enabled.
    #[inline]
    pub fn is_plain(&self) -> bool {
        let h = self.header();
        h[field::FLAGS] == FLAG_I && h[field::RESERVED1] == [0, 0, 0] && h[field::RESERVED2] == 0
    }

    /// The inner Ethernet frame.
    #[inline]
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> VxlanPacket<T> {
    #[inline(always)]
    fn header_mut(&mut self) -> &mut [u8; HEADER_LEN] {
        self.buffer
            .as_mut()
            .first_chunk_mut()
            .expect("VXLAN header checked by new_checked")
    }

    /// Sets the flags byte.
    #[inline]
    pub fn set_flags(&mut self, v: u8) {
        self.header_mut()[field::FLAGS] = v;
    }

    /// Sets the VNI (its low 24 bits) and clears both reserved fields.
    #[inline]
    pub fn set_vni(&mut self, vni: u32) {
        let v = vni.to_be_bytes();
        let h = self.header_mut();
        h[field::RESERVED1].fill(0);
        h[field::VNI].copy_from_slice(&v[1..]);
        h[field::RESERVED2] = 0;
    }
}

/// A VXLAN header as a value: only the VNI varies (flags I, reserved zero).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct VxlanRepr {
    /// The VXLAN network identifier (24 bits).
    pub vni: u32,
}

impl VxlanRepr {
    /// Reads a checked header: [`Error::Malformed`] unless the flags are exactly I and the
    /// reserved fields zero.
    pub fn parse<T: AsRef<[u8]>>(p: &VxlanPacket<T>) -> Result<VxlanRepr, Error> {
        if !p.is_plain() {
            return Err(Error::Malformed);
        }
        Ok(VxlanRepr { vni: p.vni() })
    }

    /// Length of the header.
    #[inline]
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header (the VNI's low 24 bits).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut VxlanPacket<T>) {
        p.set_flags(FLAG_I);
        p.set_vni(self.vni);
    }
}

/// The outer headers of one encapsulated frame, over an IPv4 underlay (`A` = [`Ipv4Addr`],
/// the default; [`OVERHEAD`] bytes) or an IPv6 one ([`Ipv6Addr`]; [`overhead`] bytes:
/// `ident` unused, `tos` the traffic class, `ttl` the hop limit, flow label 0 as Linux's
/// vxlan defaults).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outer<A = Ipv4Addr> {
    /// Outer source MAC (the uplink's).
    pub src_mac: MacAddr,
    /// Outer destination MAC (the next hop's on the underlay).
    pub dst_mac: MacAddr,
    /// Outer source address (the uplink's address, Linux's `local`).
    pub src_ip: A,
    /// Outer destination address (the peer's node address).
    pub dst_ip: A,
    /// IPv4 identification (unused over IPv6).
    pub ident: u16,
    /// Outer TTL (IPv6: hop limit).
    pub ttl: u8,
    /// Outer TOS (IPv6: traffic class).
    pub tos: u8,
    /// UDP source port (a hash of the inner flow).
    pub src_port: u16,
    /// UDP destination port (the VXLAN port).
    pub dst_port: u16,
    /// The VNI.
    pub vni: u32,
}

impl Outer {
    /// Writes the outer headers for an inner frame of `inner_len` bytes into `hdr` (the
    /// frame's first [`OVERHEAD`] bytes), the IPv4 header checksum included and the UDP
    /// checksum zero (fill it with one of the module's three ways). Lengths above 65535 (a
    /// super-frame to be segmented) are written capped; segmentation rewrites them.
    pub fn emit(&self, hdr: &mut [u8; OVERHEAD], inner_len: usize) {
        let (eth, rest) = hdr.split_at_mut(OUTER_L3);
        let mut e = EthernetFrame::new_unchecked(eth);
        e.set_dst_addr(self.dst_mac);
        e.set_src_addr(self.src_mac);
        e.set_ethertype(ethertype::IPV4);
        let (ip, rest) = rest.split_at_mut(ipv4::HEADER_LEN);
        let mut p = Ipv4Packet::new_unchecked(ip);
        p.set_header_len(ipv4::HEADER_LEN);
        p.set_tos(self.tos);
        p.set_total_len(len16((OVERHEAD - OUTER_L3 + inner_len).min(65_535)));
        p.set_ident(self.ident);
        p.set_frag_field(0);
        p.set_ttl(self.ttl);
        p.set_protocol(PROTO_UDP);
        p.set_src_addr(self.src_ip);
        p.set_dst_addr(self.dst_ip);
        p.fill_checksum();
        let (u, vx) = rest.split_at_mut(udp::HEADER_LEN);
        let mut u = UdpPacket::new_unchecked(u);
        u.set_src_port(self.src_port);
        u.set_dst_port(self.dst_port);
        u.set_len(len16((OVERHEAD - OUTER_L4 + inner_len).min(65_535)));
        u.set_checksum(0);
        VxlanRepr { vni: self.vni }.emit(&mut VxlanPacket::new_unchecked(vx));
    }

    /// Leaves the outer UDP checksum partial (the pseudo-header sum, as `CHECKSUM_PARTIAL`)
    /// in `frame` (an encapsulated frame); returns `(csum_start, csum_offset)` for the
    /// virtio-net header, so that the port (or the kernel behind an offload TAP) finishes it.
    /// Either family (the outer EtherType tells).
    pub fn partial_csum(frame: &mut [u8]) -> Option<(u16, u16)> {
        let (l4, ph) = outer_pseudo(frame)?;
        // `partial` is in memory order: the bytes are stored as they are.
        let c = ph.partial();
        frame.get_mut(l4 + 6..l4 + 8)?.copy_from_slice(&c);
        Some((len16(l4), 6))
    }
}

impl Outer<Ipv6Addr> {
    /// Writes the outer headers for an inner frame of `inner_len` bytes (at most 65535 - 16)
    /// into `hdr` (the frame's first [`overhead::<Ipv6Addr>()`](overhead) bytes), the UDP checksum zero: fill it
    /// with [`Outer::partial_csum`], [`fill_csum_lco`] or [`fill_csum`], which read the
    /// family from the frame. IPv6 forbids a zero UDP checksum (RFC 8200 8.1; Linux's
    /// `udp6zerocsumtx` is off by default).
    pub fn emit(&self, hdr: &mut [u8; OVERHEAD_IPV6], inner_len: usize) {
        let (eth, rest) = hdr.split_at_mut(OUTER_L3);
        let mut e = EthernetFrame::new_unchecked(eth);
        e.set_dst_addr(self.dst_mac);
        e.set_src_addr(self.src_mac);
        e.set_ethertype(ethertype::IPV6);
        let (ip, rest) = rest.split_at_mut(ipv6::HEADER_LEN);
        let mut p = Ipv6Packet::new_unchecked(ip);
        p.set_version_tc_flow(self.tos, 0);
        p.set_payload_len(len16((OVERHEAD_IPV6 - OUTER6_L4 + inner_len).min(65_535)));
        p.set_protocol(ipv6::NH_UDP);
        p.set_ttl(self.ttl);
        p.set_src_addr(self.src_ip);
        p.set_dst_addr(self.dst_ip);
        let (u, vx) = rest.split_at_mut(udp::HEADER_LEN);
        let mut u = UdpPacket::new_unchecked(u);
        u.set_src_port(self.src_port);
        u.set_dst_port(self.dst_port);
        u.set_len(len16((OVERHEAD_IPV6 - OUTER6_L4 + inner_len).min(65_535)));
        u.set_checksum(0);
        VxlanRepr { vni: self.vni }.emit(&mut VxlanPacket::new_unchecked(vx));
    }
}

/// The outer UDP header's offset and its pseudo-header in an encapsulated frame, over IPv4
/// or IPv6 (told apart by the outer EtherType).
fn outer_pseudo(frame: &[u8]) -> Option<(usize, PseudoHeader)> {
    let e = EthernetFrame::new_checked(frame).ok()?;
    if e.ethertype() == ethertype::IPV6 {
        let ip = Ipv6Packet::new_checked(frame.get(OUTER_L3..)?).ok()?;
        let udp_len = frame.len().checked_sub(OUTER6_L4)?;
        let ph = PseudoHeader::Ipv6 {
            src: ip.src_addr().octets(),
            dst: ip.dst_addr().octets(),
            next_header: ipv6::NH_UDP,
            len: u32::try_from(udp_len).ok()?,
        };
        return Some((OUTER6_L4, ph));
    }
    let ip = Ipv4Packet::new_checked_header(frame.get(OUTER_L3..)?).ok()?;
    let udp_len = frame.len().checked_sub(OUTER_L4)?;
    Some((
        OUTER_L4,
        PseudoHeader::ipv4(ip.src_addr(), ip.dst_addr(), PROTO_UDP, udp_len),
    ))
}

/// Fills the outer UDP checksum of an encapsulated frame (either family) by summing every
/// byte.
pub fn fill_csum(frame: &mut [u8]) -> Option<()> {
    let (l4, ph) = outer_pseudo(frame)?;
    let dgram = frame.get_mut(l4..)?;
    let mut u = UdpPacket::new_checked(&mut *dgram).ok()?;
    u.set_checksum(0);
    let c = checksum::finish_l4(checksum::sum(ph.sum(), dgram));
    frame.get_mut(l4 + 6..l4 + 8)?.copy_from_slice(&c);
    Some(())
}

/// Fills the outer UDP checksum of an encapsulated frame from its headers only (Linux's
/// `lco_csum`), given where the inner L4 checksum's coverage starts (`inner_l4`, from the
/// frame's start) and the value its checksum field will hold once complete is implied by
/// `partial`: the folded pseudo-header sum the field holds under `NEEDS_CSUM` (in memory
/// order, as read from the frame). The result is right once the inner checksum is complete.
pub fn fill_csum_lco(frame: &mut [u8], inner_l4: usize, partial: [u8; 2]) -> Option<()> {
    let (l4, ph) = outer_pseudo(frame)?;
    frame.get_mut(l4 + 6..l4 + 8)?.fill(0);
    let hdrs = frame.get(l4..inner_l4)?;
    // The inner L4 bytes, once checksummed, sum to the complement of its pseudo-header.
    let inner = u64::from(!u16::from_ne_bytes(partial));
    let acc = checksum::sum(ph.sum(), hdrs) + inner;
    let c = checksum::finish_l4(acc);
    frame.get_mut(l4 + 6..l4 + 8)?.copy_from_slice(&c);
    Some(())
}

/// Fills the outer UDP checksum of an encapsulated frame whose inner IPv4 or IPv6 packet
/// (the version nibble tells) carries a *complete* TCP checksum at `inner_l4` (a segment just
/// made by TCP segmentation; over IPv6, TCP right after the fixed header), from the headers
/// only (see [`fill_csum_lco`]).
pub fn fill_csum_over_tcp(frame: &mut [u8], inner_l3: usize, inner_l4: usize) -> Option<()> {
    let l3 = frame.get(inner_l3..)?;
    let ip_hdr_len = inner_l4.checked_sub(inner_l3)?;
    let pseudo = if l3.first()? >> 4 == 6 {
        let ip = Ipv6Packet::new_checked(l3).ok()?;
        PseudoHeader::Ipv6 {
            src: ip.src_addr().octets(),
            dst: ip.dst_addr().octets(),
            next_header: ipv4::PROTO_TCP,
            len: (ipv6::HEADER_LEN + usize::from(ip.payload_len()))
                .checked_sub(ip_hdr_len)
                .and_then(|l| u32::try_from(l).ok())?,
        }
    } else {
        let ip = Ipv4Packet::new_checked_header(l3).ok()?;
        let tcp_len = ip.total_len().checked_sub(ip_hdr_len)?;
        PseudoHeader::ipv4(ip.src_addr(), ip.dst_addr(), ipv4::PROTO_TCP, tcp_len)
    };
    fill_csum_lco(frame, inner_l4, pseudo.partial())
}

/// Rewrites the lengths, identification and IPv4 checksum of the outer headers of an
/// encapsulated frame of `frame.len()` bytes (one segment of a super-frame), with `ident`.
pub fn fix_outer_lengths(frame: &mut [u8], ident: u16) -> Option<()> {
    let n = frame.len();
    let mut ip = Ipv4Packet::new_checked_header(frame.get_mut(OUTER_L3..)?).ok()?;
    ip.set_total_len(len16(n - OUTER_L3));
    ip.set_ident(ident);
    ip.fill_checksum();
    UdpPacket::new_checked(frame.get_mut(OUTER_L4..)?)
        .ok()?
        .set_len(len16(n - OUTER_L4));
    Some(())
}

/// Rewrites the outer IPv6 payload length and UDP length of a frame encapsulated over IPv6
/// ([`Outer<Ipv6Addr>`]) of `frame.len()` bytes (one segment of a super-frame); IPv6 has no header
/// checksum and no identification to renumber.
pub fn fix_outer6_lengths(frame: &mut [u8]) -> Option<()> {
    let len = u16::try_from(frame.len().checked_sub(OUTER6_L4)?).ok()?;
    let ip = frame.get_mut(OUTER_L3..OUTER6_L4)?;
    Ipv6Packet::new_unchecked(ip).set_payload_len(len);
    UdpPacket::new_checked(frame.get_mut(OUTER6_L4..)?)
        .ok()?
        .set_len(len);
    Some(())
}

/// Whether `frame` starts with the fixed outer headers of a frame encapsulated over IPv4
/// (`v6` false: [`Outer`], a 20-byte IPv4 header without fragmentation, UDP) or over IPv6
/// (`v6`: [`Outer<Ipv6Addr>`], UDP right after the fixed header), so that the inner frame is at
/// [`OVERHEAD`] or [`overhead::<Ipv6Addr>()`](overhead). Lengths are not checked (a super-frame's are capped).
pub fn is_outer(frame: &[u8], v6: bool) -> bool {
    let Ok(e) = EthernetFrame::new_checked(frame) else {
        return false;
    };
    let l3 = e.payload();
    if v6 {
        let Some(ip) = l3.get(..ipv6::HEADER_LEN) else {
            return false;
        };
        let ip = Ipv6Packet::new_unchecked(ip);
        e.ethertype() == ethertype::IPV6 && ip.version() == 6 && ip.protocol() == ipv6::NH_UDP
    } else {
        let Ok(ip) = Ipv4Packet::new_checked_header(l3) else {
            return false;
        };
        e.ethertype() == ethertype::IPV4
            && ip.header_len() == ipv4::HEADER_LEN
            && ip.protocol() == PROTO_UDP
            && ip.frag_field() & (ipv4::MF | ipv4::FRAG_OFFSET) == 0
    }
}

/// What the outer headers of a frame say, for decapsulation: where the UDP datagram and the
/// inner frame are, and whether it is VXLAN on `port` at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OuterInfo {
    /// Outer source address.
    pub src: IpAddr,
    /// UDP source port.
    pub src_port: u16,
    /// Offset of the UDP header in the frame.
    pub l4: usize,
    /// Offset of the inner Ethernet frame.
    pub inner: usize,
}

/// Why a UDP datagram to the VXLAN port is not a frame to decapsulate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecapError {
    /// Shorter than UDP + VXLAN + an Ethernet header, or a UDP length that lies.
    Short,
    /// Flags other than I, or reserved bits set.
    BadFlags,
    /// A VNI other than the interface's.
    BadVni,
    /// The outer UDP checksum does not verify.
    BadChecksum,
    /// A zero outer UDP checksum over IPv6 (refused as Linux's vxlan does by default,
    /// `udp6zerocsumrx` off; RFC 8200 8.1).
    ZeroChecksum,
}

/// Where the outer UDP datagram of family `A` is in a frame, from its checked IP header: its
/// addresses, the offset of its UDP header and its end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OuterIp<A> {
    /// The outer source address.
    pub src: A,
    /// The outer destination address.
    pub dst: A,
    /// The offset of the UDP header in the frame.
    pub l4: usize,
    /// The offset of the datagram's end (IP total length) in the frame.
    pub end: usize,
}

/// Reads the UDP and VXLAN headers of the outer datagram `ip` of `frame` (its IP header
/// already checked; over IPv6, UDP its upper layer and not a fragment): checks the UDP
/// length, the checksum when `verify`, the flags and the VNI. A zero checksum means none
/// over IPv4 (accepted, as Linux does) and is [`DecapError::ZeroChecksum`] over IPv6 whether
/// or not `verify` (Linux's default, `udp6zerocsumrx` off; RFC 8200 8.1). The inner frame is
/// at [`OuterInfo::inner`] and runs to the datagram's end.
pub fn parse_udp<A: Family>(
    frame: &[u8],
    ip: OuterIp<A>,
    vni: u32,
    verify: bool,
) -> Result<OuterInfo, DecapError> {
    let dgram = frame.get(ip.l4..ip.end).ok_or(DecapError::Short)?;
    let u = vxlan_dgram(dgram, vni)?;
    if u.checksum() == 0 {
        if A::VERSION == <Ipv6Addr as Family>::VERSION {
            return Err(DecapError::ZeroChecksum);
        }
    } else if verify {
        let len = u32::try_from(dgram.len()).map_err(|_| DecapError::Short)?;
        if !family::pseudo_header(ip.src, ip.dst, IpProto::UDP, len).verifies(dgram) {
            return Err(DecapError::BadChecksum);
        }
    }
    Ok(OuterInfo {
        src: ip.src.into(),
        src_port: u.src_port(),
        l4: ip.l4,
        inner: ip.l4 + udp::HEADER_LEN + HEADER_LEN,
    })
}

/// The UDP datagram `dgram` as VXLAN: its length, flags and VNI checked.
fn vxlan_dgram(dgram: &[u8], vni: u32) -> Result<UdpPacket<&[u8]>, DecapError> {
    let u = UdpPacket::new_checked(dgram).map_err(|_| DecapError::Short)?;
    if usize::from(u.len()) != dgram.len()
        || dgram.len() < udp::HEADER_LEN + HEADER_LEN + ethernet::HEADER_LEN
    {
        return Err(DecapError::Short);
    }
    let vx = VxlanPacket::new_checked(u.payload()).map_err(|_| DecapError::Short)?;
    if !vx.is_plain() {
        return Err(DecapError::BadFlags);
    }
    if vx.vni() != vni {
        return Err(DecapError::BadVni);
    }
    Ok(u)
}

/// Reads what a flow hash needs from an inner Ethernet frame: for untagged IPv4, the two
/// addresses and, for TCP/UDP (first fragments), the two ports; otherwise the MACs.
pub fn flow_words(inner: &[u8]) -> [u64; 2] {
    let Ok(e) = EthernetFrame::new_checked(inner) else {
        return [0, 0];
    };
    let (d, s) = e.addr_words();
    if e.ethertype() == ethertype::IPV6 {
        return flow_words_ipv6(e.payload()).unwrap_or([d, s]);
    }
    if e.ethertype() != ethertype::IPV4 {
        return [d, s];
    }
    let Ok(ip) = Ipv4Packet::new_checked_header(e.payload()) else {
        return [d, s];
    };
    let addrs = ip.addrs_u64();
    let proto = u64::from(ip.protocol());
    let ports = match ip.protocol() {
        ipv4::PROTO_TCP | ipv4::PROTO_UDP if ip.frag_offset() == 0 => e
            .payload()
            .get(ip.header_len()..ip.header_len() + 4)
            .map_or(0, |p| {
                u64::from(u32::from_be_bytes([p[0], p[1], p[2], p[3]]))
            }),
        _ => 0,
    };
    [addrs, ports << 8 | proto]
}

/// [`flow_words`] for an inner IPv6 packet: its two addresses folded and, when TCP or UDP
/// follows the fixed header, the two ports (Linux hashes the flow label in too; it is 0 from
/// pods that do not set one).
fn flow_words_ipv6(l3: &[u8]) -> Option<[u64; 2]> {
    let ip = Ipv6Packet::new_checked(l3).ok()?;
    let word = |a: [u8; 16]| {
        let (hi, lo) = a.split_at(8);
        let w = |b: &[u8]| u64::from_ne_bytes(b.try_into().unwrap_or([0; 8]));
        w(hi) ^ w(lo).rotate_left(32)
    };
    let addrs = word(ip.src_addr().octets()) ^ word(ip.dst_addr().octets()).rotate_left(17);
    let nh = ip.protocol();
    let ports = match nh {
        ipv6::NH_TCP | ipv6::NH_UDP => ip.payload().get(..4).map_or(0, |p| {
            u64::from(u32::from_be_bytes([p[0], p[1], p[2], p[3]]))
        }),
        _ => 0,
    };
    Some([addrs, ports << 8 | u64::from(nh)])
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const A: Ipv4Addr = Ipv4Addr::new(172, 18, 0, 2);
    const B: Ipv4Addr = Ipv4Addr::new(172, 18, 0, 3);

    fn info_of(f: &[u8]) -> OuterIp<Ipv4Addr> {
        let i = ipv4::check_header(&f[OUTER_L3..]).unwrap();
        OuterIp {
            src: i.src,
            dst: i.dst,
            l4: OUTER_L3 + i.hdr_len,
            end: OUTER_L3 + i.total_len,
        }
    }

    fn outer() -> Outer {
        Outer {
            src_mac: MacAddr([2, 0, 0, 0, 0, 2]),
            dst_mac: MacAddr([2, 0, 0, 0, 0, 3]),
            src_ip: A,
            dst_ip: B,
            ident: 7,
            ttl: 64,
            tos: 0,
            src_port: 40000,
            dst_port: 8472,
            vni: 1,
        }
    }

    /// An encapsulated ICMP echo from pod 10.244.1.2 to 10.244.2.2, outer checksum empty.
    fn encapsulated() -> Vec<u8> {
        let mut inner = Vec::new();
        etherparse::PacketBuilder::ethernet2(
            [0x0a, 0x58, 10, 244, 1, 0],
            [0x0a, 0x58, 10, 244, 2, 0],
        )
        .ipv4([10, 244, 1, 2], [10, 244, 2, 2], 63)
        .icmpv4_echo_request(1, 1)
        .write(&mut inner, b"hello vxlan")
        .unwrap();
        let mut f = vec![0u8; OVERHEAD];
        outer().emit(f.as_mut_slice().try_into().unwrap(), inner.len());
        f.extend_from_slice(&inner);
        f
    }

    #[test]
    fn rfc7348_header_bytes() {
        let b = [0x08, 0, 0, 0, 0x12, 0x34, 0x56, 0];
        let p = VxlanPacket::new_checked(&b[..]).unwrap();
        assert_eq!(
            (p.flags(), p.vni(), p.is_plain()),
            (FLAG_I, 0x12_3456, true)
        );
        assert_eq!(VxlanPacket::new_checked(&b[..7]), Err(Error::Truncated));
        for (i, v) in [(0, 0x0c), (0, 0), (1, 1), (3, 0x80), (7, 1)] {
            let mut c = b;
            c[i] = v;
            let p = VxlanPacket::new_checked(&c[..]).unwrap();
            assert_eq!(
                VxlanRepr::parse(&p),
                Err(Error::Malformed),
                "byte {i} = {v:#x}"
            );
        }
        let mut out = [0xffu8; 8];
        VxlanRepr { vni: 0x12_3456 }.emit(&mut VxlanPacket::new_unchecked(&mut out[..]));
        assert_eq!(out, b);
    }

    #[test]
    fn outer_headers_parse_with_etherparse_and_every_checksum_way_agrees() {
        let mut full = encapsulated();
        fill_csum(&mut full).unwrap();
        {
            let s = etherparse::SlicedPacket::from_ethernet(&full).unwrap();
            let Some(etherparse::NetSlice::Ipv4(ip)) = s.net else {
                panic!("not IPv4")
            };
            assert_eq!(ip.header().destination_addr(), B);
            assert_eq!(usize::from(ip.header().total_len()), full.len() - 14);
            let Some(etherparse::TransportSlice::Udp(u)) = s.transport else {
                panic!("not UDP")
            };
            assert_eq!((u.source_port(), u.destination_port()), (40000, 8472));
            assert_ne!(u.checksum(), 0);
        }
        assert!(UdpPacket::new_checked(&full[OUTER_L4..])
            .unwrap()
            .verify_checksum(A, B));
        // ICMP sums to zero: the LCO way with the "pseudo-header" of ICMP (none) = 0 agrees.
        let mut lco = encapsulated();
        let inner_l4 = OVERHEAD + 14 + 20;
        fill_csum_lco(&mut lco, inner_l4, [0, 0]).unwrap();
        assert!(UdpPacket::new_checked(&lco[OUTER_L4..])
            .unwrap()
            .verify_checksum(A, B));
        let info = parse_udp(&full, info_of(&full), 1, true).unwrap();
        assert_eq!(info.inner, OVERHEAD);
        assert_eq!(info.src_port, 40000);
        assert_eq!(
            parse_udp(&full, info_of(&full), 2, true),
            Err(DecapError::BadVni)
        );
        let last = full.len() - 1;
        full[last] ^= 1;
        assert_eq!(
            parse_udp(&full, info_of(&full), 1, true),
            Err(DecapError::BadChecksum)
        );
        full[OUTER_L4 + 6..OUTER_L4 + 8].fill(0);
        assert!(parse_udp(&full, info_of(&full), 1, true).is_ok());
    }

    #[test]
    fn lco_over_tcp_matches_the_full_sum() {
        let mut inner = Vec::new();
        etherparse::PacketBuilder::ethernet2([2; 6], [4; 6])
            .ipv4([10, 244, 1, 2], [10, 244, 2, 2], 63)
            .tcp(40000, 80, 1, 1000)
            .write(&mut inner, &[7u8; 333])
            .unwrap();
        let mut f = vec![0u8; OVERHEAD];
        outer().emit(f.as_mut_slice().try_into().unwrap(), inner.len());
        f.extend_from_slice(&inner);
        let mut g = f.clone();
        fill_csum(&mut f).unwrap();
        fill_csum_over_tcp(&mut g, OVERHEAD + 14, OVERHEAD + 34).unwrap();
        assert_eq!(f, g);
        // The partial way: the field holds the pseudo-header's folded sum.
        let mut p = g.clone();
        assert_eq!(Outer::partial_csum(&mut p), Some((34, 6)));
        let pseudo = PseudoHeader::ipv4(A, B, PROTO_UDP, p.len() - OUTER_L4);
        assert_eq!(p[OUTER_L4 + 6..OUTER_L4 + 8], pseudo.partial());
    }

    proptest! {
        #[test]
        fn round_trip_and_truncation(vni in 0..=MAX_VNI, cut in 0usize..80) {
            let mut b = [0u8; 8];
            let r = VxlanRepr { vni };
            r.emit(&mut VxlanPacket::new_unchecked(&mut b[..]));
            prop_assert_eq!(VxlanRepr::parse(&VxlanPacket::new_checked(&b[..]).unwrap()), Ok(r));
            let f = encapsulated();
            let n = cut.min(f.len());
            // Any cut of the datagram is refused, never a panic.
            let mut ip = info_of(&f);
            ip.end = n.max(OUTER_L3);
            let r = parse_udp(&f[..n], ip, 1, false);
            if n < f.len() {
                prop_assert!(r.is_err());
            }
        }
    }
}
