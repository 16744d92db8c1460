//! IPv4: the header view [`Ipv4Packet`], the header as a value [`Ipv4Repr`], the `ip_rcv`
//! header check ([`check_header`], giving an [`Ipv4Info`]) and the TTL decrement. What the
//! router does with IPv4 packets (ICMP errors, echo replies, TCP resets, fragmentation) is the
//! router's (`l3::router`).
//!
//! Field offsets are named once in the private `field` module. Slices passed to the free
//! functions start at the IPv4 header (`l3`) or at the Ethernet header (`frame`) as each
//! function says; every one bounds-checks its input and returns an error value instead of
//! panicking.

use std::net::Ipv4Addr;

use crate::narrow::{len16, low8};
use crate::stats::DropReason;
use crate::wire::checksum;
use crate::wire::icmp as icmpv4;
use crate::wire::ip::IpPacket;
use crate::wire::Error;

pub(super) mod field {
    use std::ops::Range;
    pub const VER_IHL: usize = 0;
    pub const TOS: usize = 1;
    pub const LEN: Range<usize> = 2..4;
    pub const IDENT: Range<usize> = 4..6;
    pub const FRAG: Range<usize> = 6..8;
    pub const TTL: usize = 8;
    pub const PROTO: usize = 9;
    pub const CSUM: Range<usize> = 10..12;
    pub const SRC: Range<usize> = 12..16;
    pub const DST: Range<usize> = 16..20;
    pub const OPTIONS: usize = 20;
}

/// Length of an IPv4 header without options.
pub const HEADER_LEN: usize = field::OPTIONS;
/// IP protocol number of ICMP.
pub const PROTO_ICMP: u8 = 1;
/// IP protocol number of TCP.
pub const PROTO_TCP: u8 = 6;
/// IP protocol number of UDP.
pub const PROTO_UDP: u8 = 17;
/// The "don't fragment" flag in the flags/fragment-offset field.
pub const DF: u16 = 0x4000;
/// The "more fragments" flag.
pub const MF: u16 = 0x2000;
/// The fragment offset bits (in units of 8 bytes) of the flags/fragment-offset field.
pub const FRAG_OFFSET: u16 = 0x1fff;
/// The largest IP datagram an ICMP error may be (RFC 1812 4.3.2.3, as Linux).
pub const ICMP_ERROR_MAX: usize = 576;

/// A view of an IPv4 header and the datagram it starts.
///
/// [`Ipv4Packet::new_checked`] checks the version, that the header (IHL ≥ 5) and the total
/// length fit the buffer, and that the total length covers the header; after it no accessor
/// panics. The buffer may extend past the total length (Ethernet padding):
/// [`Ipv4Packet::payload`] stops at the total length.
/// The fields IPv4 and IPv6 share (version, TTL, protocol, addresses) are
/// [`IpPacket`]'s.
pub type Ipv4Packet<T> = IpPacket<T, Ipv4Addr>;

impl<T: AsRef<[u8]>> Ipv4Packet<T> {
    /// Wraps a buffer after the checks above: [`Error::Truncated`] when the buffer is shorter
    /// than the header or the total length, [`Error::Malformed`] for a version other than 4,
    /// an IHL below 5 or a total length below the header length.
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self, Error> {
        let p = Ipv4Packet::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Wraps the header of a datagram that may be cut short, as the one an ICMP error quotes
    /// (etherparse's "lax" parse): version 4, IHL ≥ 5 and the header within the buffer, the
    /// total length not checked. No accessor panics on such a view either: the payload stops
    /// where the buffer does.
    #[inline]
    pub fn new_checked_header(buffer: T) -> Result<Self, Error> {
        let b = buffer.as_ref();
        let Some(h) = b.first_chunk::<HEADER_LEN>() else {
            return Err(Error::Truncated);
        };
        let vi = h[field::VER_IHL];
        let hl = usize::from(vi & 0x0f) * 4;
        if vi >> 4 != 4 || hl < HEADER_LEN {
            return Err(Error::Malformed);
        }
        if hl > b.len() {
            return Err(Error::Truncated);
        }
        Ok(Ipv4Packet::new_unchecked(buffer))
    }

    /// The checks of [`Ipv4Packet::new_checked`].
    #[inline]
    pub fn check_len(&self) -> Result<(), Error> {
        let b = self.buffer.as_ref();
        let Some(h) = b.first_chunk::<HEADER_LEN>() else {
            return Err(Error::Truncated);
        };
        let vi = h[field::VER_IHL];
        let hl = usize::from(vi & 0x0f) * 4;
        if vi >> 4 != 4 || hl < HEADER_LEN {
            return Err(Error::Malformed);
        }
        let total = usize::from(u16::from_be_bytes([h[2], h[3]]));
        if hl > b.len() || total > b.len() {
            return Err(Error::Truncated);
        }
        if total < hl {
            return Err(Error::Malformed);
        }
        Ok(())
    }

    #[inline(always)]
    fn fixed(&self) -> &[u8; HEADER_LEN] {
        self.buffer
            .as_ref()
            .first_chunk()
            .expect("IPv4 header checked by new_checked")
    }

    #[inline(always)]
    fn be16(&self, r: std::ops::Range<usize>) -> u16 {
        let h = self.fixed();
        u16::from_be_bytes([h[r.start], h[r.start + 1]])
    }

    /// Header length in bytes (IHL × 4).
    #[inline]
    pub fn header_len(&self) -> usize {
        usize::from(self.fixed()[field::VER_IHL] & 0x0f) * 4
    }

    /// The type-of-service (DSCP and ECN) byte.
    #[inline]
    pub fn tos(&self) -> u8 {
        self.fixed()[field::TOS]
    }

    /// Total length of the datagram.
    #[inline]
    pub fn total_len(&self) -> usize {
        usize::from(self.be16(field::LEN))
    }

    /// Identification.
    #[inline]
    pub fn ident(&self) -> u16 {
        self.be16(field::IDENT)
    }

    /// The flags and fragment-offset field as it is (see [`DF`], [`MF`], [`FRAG_OFFSET`]).
    #[inline]
    pub fn frag_field(&self) -> u16 {
        self.be16(field::FRAG)
    }

    /// True when DF is set.
    #[inline]
    pub fn dont_frag(&self) -> bool {
        self.frag_field() & DF != 0
    }

    /// The fragment offset in 8-byte units (nonzero: not the first fragment).
    #[inline]
    pub fn frag_offset(&self) -> u16 {
        self.frag_field() & FRAG_OFFSET
    }

    /// Header checksum.
    #[inline]
    pub fn checksum(&self) -> u16 {
        self.be16(field::CSUM)
    }

    /// Source and destination as they are on the wire (for a pseudo-header).
    #[inline]
    pub(crate) fn addr_bytes(&self) -> ([u8; 4], [u8; 4]) {
        let h = self.fixed();
        ([h[12], h[13], h[14], h[15]], [h[16], h[17], h[18], h[19]])
    }

    /// Source and destination as one word (`src << 32 | dst`), as conntrack keys them.
    #[inline]
    pub(crate) fn addrs_u64(&self) -> u64 {
        let h = self.fixed();
        u64::from(u32::from_be_bytes([h[12], h[13], h[14], h[15]])) << 32
            | u64::from(u32::from_be_bytes([h[16], h[17], h[18], h[19]]))
    }

    /// True when the header checksum verifies (options included).
    #[inline]
    pub fn verify_checksum(&self) -> bool {
        let hl = self.header_len();
        let mut acc = checksum::sum20(self.fixed());
        if hl > HEADER_LEN {
            acc = checksum::sum(acc, &self.buffer.as_ref()[HEADER_LEN..hl]);
        }
        checksum::verifies(acc)
    }

    /// The bytes after the header, up to the total length (or the end of the buffer, for a
    /// view from [`Ipv4Packet::new_checked_header`]).
    #[inline]
    pub fn payload(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        let end = self.total_len().min(b.len());
        &b[self.header_len().min(end)..end]
    }

    /// Every byte after the header to the end of the buffer, whatever the total length says
    /// (a quoted datagram's, whose length field is the original's).
    #[inline]
    pub fn after_header(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..]
    }

    /// The header, options included.
    #[inline]
    pub fn header(&self) -> &[u8] {
        &self.buffer.as_ref()[..self.header_len()]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv4Packet<T> {
    #[inline(always)]
    fn fixed_mut(&mut self) -> &mut [u8; HEADER_LEN] {
        self.buffer
            .as_mut()
            .first_chunk_mut()
            .expect("IPv4 header checked by new_checked")
    }

    #[inline(always)]
    fn set_be16(&mut self, r: std::ops::Range<usize>, v: u16) {
        self.fixed_mut()[r].copy_from_slice(&v.to_be_bytes());
    }

    /// Sets version 4 and the header length in bytes (a multiple of 4, 20..=60).
    #[inline]
    pub fn set_header_len(&mut self, len: usize) {
        self.fixed_mut()[field::VER_IHL] = 0x40 | low8((len / 4) as u64) & 0x0f;
    }

    /// Sets the type-of-service byte.
    #[inline]
    pub fn set_tos(&mut self, v: u8) {
        self.fixed_mut()[field::TOS] = v;
    }

    /// Sets the total length.
    #[inline]
    pub fn set_total_len(&mut self, len: u16) {
        self.set_be16(field::LEN, len);
    }

    /// Sets the identification.
    #[inline]
    pub fn set_ident(&mut self, v: u16) {
        self.set_be16(field::IDENT, v);
    }

    /// Sets the flags and fragment-offset field.
    #[inline]
    pub fn set_frag_field(&mut self, v: u16) {
        self.set_be16(field::FRAG, v);
    }

    /// Sets the header checksum field.
    #[inline]
    pub fn set_checksum(&mut self, v: u16) {
        self.set_be16(field::CSUM, v);
    }

    /// Recomputes the header checksum (options included).
    #[inline]
    pub fn fill_checksum(&mut self) {
        self.set_checksum(0);
        let hl = self.header_len();
        let c = checksum::checksum(&self.buffer.as_ref()[..hl]);
        self.set_checksum(c);
    }

    /// Decrements the TTL and patches the checksum incrementally (RFC 1624), as Linux's
    /// `ip_decrease_ttl`: TTL is the high byte of the word at offset 8, so the sum drops by
    /// 0x0100 and the checksum (its complement) rises by 0x0100 with end-around carry.
    #[inline(always)]
    pub fn decrement_ttl(&mut self) {
        let ttl = self.ttl();
        self.set_ttl(ttl.wrapping_sub(1));
        let c = checksum::add16(self.checksum(), 0x0100);
        self.set_checksum(c);
    }

    /// The bytes after the header, up to the total length (see [`Ipv4Packet::payload`]),
    /// mutable.
    #[inline]
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let (hl, total) = (self.header_len(), self.total_len());
        let b = self.buffer.as_mut();
        let end = total.min(b.len());
        &mut b[hl.min(end)..end]
    }

    /// The header (options included), mutable.
    #[inline]
    pub fn header_mut(&mut self) -> &mut [u8] {
        let hl = self.header_len();
        &mut self.buffer.as_mut()[..hl]
    }
}

/// An IPv4 header without options, as a value: what the router builds for the packets it
/// sends. Identification 0, no fragmentation but the DF flag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ipv4Repr {
    /// Source address.
    pub src_addr: Ipv4Addr,
    /// Destination address.
    pub dst_addr: Ipv4Addr,
    /// Protocol number.
    pub protocol: u8,
    /// Length of the payload.
    pub payload_len: usize,
    /// Time to live.
    pub ttl: u8,
    /// Type of service.
    pub tos: u8,
    /// The DF flag.
    pub dont_frag: bool,
}

impl Ipv4Repr {
    /// Reads a checked packet: [`Error::Malformed`] when the header checksum does not verify
    /// or the header is not one this value can hold (options, a fragment, an identification).
    pub fn parse<T: AsRef<[u8]>>(p: &Ipv4Packet<T>) -> Result<Ipv4Repr, Error> {
        if !p.verify_checksum()
            || p.header_len() != HEADER_LEN
            || p.frag_field() & !DF != 0
            || p.ident() != 0
        {
            return Err(Error::Malformed);
        }
        Ok(Ipv4Repr {
            src_addr: p.src_addr(),
            dst_addr: p.dst_addr(),
            protocol: p.protocol(),
            payload_len: p.total_len() - HEADER_LEN,
            ttl: p.ttl(),
            tos: p.tos(),
            dont_frag: p.dont_frag(),
        })
    }

    /// The header length (20).
    #[inline]
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header and its checksum (the payload is the caller's).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Ipv4Packet<T>) {
        p.set_header_len(HEADER_LEN);
        p.set_tos(self.tos);
        p.set_total_len(len16(HEADER_LEN + self.payload_len));
        p.set_ident(0);
        p.set_frag_field(if self.dont_frag { DF } else { 0 });
        p.set_ttl(self.ttl);
        p.set_protocol(self.protocol);
        p.set_src_addr(self.src_addr);
        p.set_dst_addr(self.dst_addr);
        p.fill_checksum();
    }
}

/// The facts about a valid IPv4 header, from [`check_header`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ipv4Info {
    /// Header length in bytes (20..=60).
    pub hdr_len: usize,
    /// Total length from the header (≤ the bytes present).
    pub total_len: usize,
    /// Time to live.
    pub ttl: u8,
    /// Protocol number.
    pub proto: u8,
    /// Source address.
    pub src: Ipv4Addr,
    /// Destination address.
    pub dst: Ipv4Addr,
    /// The flags and fragment offset field.
    pub frag: u16,
}

impl Ipv4Info {
    /// True when DF is set.
    pub fn dont_fragment(&self) -> bool {
        self.frag & DF != 0
    }
    /// True for a fragment other than the first.
    pub fn is_later_fragment(&self) -> bool {
        self.frag & FRAG_OFFSET != 0
    }
    /// True for any fragment of a bigger datagram (MF or an offset).
    #[inline]
    pub fn is_fragment(&self) -> bool {
        self.frag & (MF | FRAG_OFFSET) != 0
    }
}

/// Checks an IPv4 header as Linux's `ip_rcv` does: version 4, IHL ≥ 5, header and total
/// length within the bytes present, header checksum valid.
#[inline]
pub fn check_header(l3: &[u8]) -> Result<Ipv4Info, DropReason> {
    let p = Ipv4Packet::new_checked(l3).map_err(|_| DropReason::BadIpHeader)?;
    let hdr_len = p.header_len();
    // The fixed 20 bytes summed as five words; options, rare, through the general sum.
    let mut acc = checksum::sum20(p.fixed());
    if hdr_len > HEADER_LEN {
        acc = checksum::sum(acc, l3.get(HEADER_LEN..hdr_len).unwrap_or(&[]));
    }
    if !checksum::verifies(acc) {
        return Err(DropReason::BadIpChecksum);
    }
    Ok(Ipv4Info {
        hdr_len,
        total_len: p.total_len(),
        ttl: p.ttl(),
        proto: p.protocol(),
        src: p.src_addr(),
        dst: p.dst_addr(),
        frag: p.frag_field(),
    })
}

/// True when an ICMP error may be sent about this packet (RFC 1122 3.2.2 and Linux's
/// `icmp_send`): not about an ICMP error, not about a non-first fragment, not to or from a
/// broadcast, multicast, zero or loopback address, not about a frame sent to an L2 group.
pub fn may_send_icmp_error(l3: &[u8], info: &Ipv4Info, l2_group_dst: bool) -> bool {
    if l2_group_dst || info.is_later_fragment() {
        return false;
    }
    let bad =
        |a: Ipv4Addr| a.is_unspecified() || a.is_broadcast() || a.is_multicast() || a.is_loopback();
    if bad(info.src) || info.dst.is_multicast() || info.dst.is_broadcast() {
        return false;
    }
    if info.proto == PROTO_ICMP {
        // Only queries (echo, timestamp, ...) may be answered with an error.
        let Some(&ty) = l3.get(info.hdr_len) else {
            return false;
        };
        return icmpv4::is_query(ty);
    }
    true
}

#[cfg(test)]
pub(crate) mod tests {
    use proptest::prelude::*;

    #[test]
    fn header_bytes() {
        // 10.0.0.1 -> 10.0.1.2, UDP, TTL 64, DF, header checksum 0x25cf, one byte of padding.
        let b = [
            0x45, 0, 0, 28, 0, 0, 0x40, 0, 64, 17, 0x25, 0xcf, 10, 0, 0, 1, 10, 0, 1, 2, 0, 0, 0,
            0, 0, 0, 0, 0, 0xee,
        ];
        let p = Ipv4Packet::new_checked(&b[..]).unwrap();
        assert_eq!((p.header_len(), p.total_len(), p.ttl()), (20, 28, 64));
        assert_eq!(p.protocol(), PROTO_UDP);
        assert!(p.dont_frag() && p.frag_offset() == 0);
        assert_eq!(p.src_addr(), Ipv4Addr::new(10, 0, 0, 1));
        assert_eq!(
            p.payload().len(),
            8,
            "padding after the total length is not payload"
        );
        assert!(p.verify_checksum());
        let mut bad = b;
        bad[0] = 0x46;
        assert_eq!(Ipv4Packet::new_checked(&bad[..]).unwrap().header_len(), 24);
        bad[0] = 0x44;
        assert_eq!(Ipv4Packet::new_checked(&bad[..]), Err(Error::Malformed));
        bad[0] = 0x65;
        assert_eq!(Ipv4Packet::new_checked(&bad[..]), Err(Error::Malformed));
        assert_eq!(Ipv4Packet::new_checked(&b[..27]), Err(Error::Truncated));
    }

    proptest! {
        #[test]
        fn repr_round_trip(
            src in any::<u32>(), dst in any::<u32>(), protocol in any::<u8>(),
            payload_len in 0usize..64, ttl in any::<u8>(), tos in any::<u8>(), dont_frag in any::<bool>(),
        ) {
            let r = Ipv4Repr {
                src_addr: src.into(), dst_addr: dst.into(), protocol, payload_len, ttl, tos, dont_frag,
            };
            let mut b = vec![0u8; r.buffer_len() + payload_len];
            r.emit(&mut Ipv4Packet::new_unchecked(&mut b[..]));
            prop_assert_eq!(Ipv4Repr::parse(&Ipv4Packet::new_checked(&b[..]).unwrap()), Ok(r));
            prop_assert!(check_header(&b).is_ok());
            for n in 0..b.len() {
                prop_assert!(Ipv4Packet::new_checked(&b[..n]).is_err());
                prop_assert!(check_header(&b[..n]).is_err());
            }
        }
    }

    use super::*;
    use etherparse::{Icmpv4Type, PacketBuilder};

    /// An Ethernet frame with a UDP datagram of `payload` bytes from 10.0.0.1 to 10.0.1.2
    /// (identification 0x1234), `df` and `ttl` as given.
    pub(crate) fn udp_frame(payload: usize, df: bool, ttl: u8) -> Vec<u8> {
        let mut f = Vec::new();
        let mut ip = etherparse::Ipv4Header::new(
            len16(8 + payload),
            ttl,
            etherparse::IpNumber::UDP,
            [10, 0, 0, 1],
            [10, 0, 1, 2],
        )
        .unwrap();
        ip.dont_fragment = df;
        ip.identification = 0x1234;
        PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
            .ip(etherparse::IpHeaders::Ipv4(ip, Default::default()))
            .udp(1000, 2000)
            .write(&mut f, &vec![0xab; payload])
            .unwrap();
        f
    }

    #[test]
    fn header_checks_and_ttl_decrement_keep_a_valid_checksum() {
        let mut f = udp_frame(100, false, 64);
        let info = check_header(&f[14..]).unwrap();
        assert_eq!(info.ttl, 64);
        for _ in 0..63 {
            Ipv4Packet::new_checked(&mut f[14..])
                .unwrap()
                .decrement_ttl();
            check_header(&f[14..]).unwrap();
        }
        assert_eq!(check_header(&f[14..]).unwrap().ttl, 1);
        f[14 + 10] ^= 1;
        assert_eq!(check_header(&f[14..]), Err(DropReason::BadIpChecksum));
        assert_eq!(check_header(&f[14..30]), Err(DropReason::BadIpHeader));
        for n in 0..f.len() {
            let _ = check_header(&f[14.min(n)..n]);
        }
    }

    #[test]
    fn no_icmp_error_about_icmp_errors_or_later_fragments() {
        let mut f = Vec::new();
        PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
            .ipv4([10, 0, 0, 1], [10, 0, 1, 2], 1)
            .icmpv4(Icmpv4Type::TimeExceeded(
                etherparse::icmpv4::TimeExceededCode::TtlExceededInTransit,
            ))
            .write(&mut f, &[0; 28])
            .unwrap();
        let info = check_header(&f[14..]).unwrap();
        assert!(!may_send_icmp_error(&f[14..], &info, false));
        let g = udp_frame(10, false, 5);
        let mut info = check_header(&g[14..]).unwrap();
        assert!(!may_send_icmp_error(&g[14..], &info, true));
        info.frag = 3;
        assert!(!may_send_icmp_error(&g[14..], &info, false));
    }
}
