//! IPv6 (RFC 8200): the fixed-header view [`Ipv6Packet`], the header as a value
//! [`Ipv6Repr`], the extension-header walker ([`ExtHeaders`]), the `ipv6_rcv` checks
//! ([`check`], giving an [`Ipv6Info`]), the frame writer of ICMPv6 messages ([`write_icmp`]),
//! and the address helpers of NDP (solicited-node groups, their `33:33` MACs, EUI-64
//! link-local addresses). What the router does with IPv6 packets (errors, echo replies,
//! resets) is the router's (`l3::router`).
//!
//! Field offsets are named once in the private `field` module; every function bounds-checks
//! its input and returns an error value instead of panicking.
//!
//! ```
//! use std::net::Ipv6Addr;
//! use tapyard::wire::ipv6::{self, Ipv6Packet, Ipv6Repr};
//!
//! let repr = Ipv6Repr {
//!     src_addr: "fd00::1".parse().unwrap(),
//!     dst_addr: "fd00::2".parse().unwrap(),
//!     next_header: ipv6::NH_UDP,
//!     payload_len: 8,
//!     hop_limit: 64,
//! };
//! let mut buf = [0u8; 48];
//! repr.emit(&mut Ipv6Packet::new_unchecked(&mut buf[..]));
//! let info = ipv6::check(&buf).unwrap();
//! assert_eq!((info.next_header, info.l4_off, info.hop_limit), (ipv6::NH_UDP, 40, 64));
//! assert_eq!(Ipv6Repr::parse(&Ipv6Packet::new_checked(&buf[..]).unwrap()), Ok(repr));
//! ```

use std::net::Ipv6Addr;

use crate::narrow::len16;
use crate::wire::checksum::{self, PseudoHeader};
use crate::wire::family::{emit_frame, IpHead, IpProto};
use crate::wire::icmpv6::{self, Icmpv6Packet, Icmpv6Repr};
use crate::wire::ip::IpPacket;
use crate::wire::mac::MacAddr;
use crate::wire::Error;

pub(super) mod field {
    use std::ops::Range;
    pub const PAYLOAD_LEN: Range<usize> = 4..6;
    pub const NEXT_HEADER: usize = 6;
    pub const HOP_LIMIT: usize = 7;
    pub const SRC_ADDR: Range<usize> = 8..24;
    pub const DST_ADDR: Range<usize> = 24..40;
    pub const PAYLOAD: usize = 40;
}

/// Length of the IPv6 fixed header.
pub const HEADER_LEN: usize = field::PAYLOAD;
/// Next header: hop-by-hop options (only right after the fixed header).
pub const NH_HOPOPTS: u8 = 0;
/// Next header: TCP.
pub const NH_TCP: u8 = 6;
/// Next header: UDP.
pub const NH_UDP: u8 = 17;
/// Next header: routing header.
pub const NH_ROUTING: u8 = 43;
/// Next header: fragment header.
pub const NH_FRAGMENT: u8 = 44;
/// Next header: ESP (ends the walk: what follows is encrypted).
pub const NH_ESP: u8 = 50;
/// Next header: authentication header (length in 4-byte units).
pub const NH_AH: u8 = 51;
/// Next header: ICMPv6.
pub const NH_ICMPV6: u8 = 58;
/// Next header: no next header.
pub const NH_NONE: u8 = 59;
/// Next header: destination options.
pub const NH_DSTOPTS: u8 = 60;
/// The most extension headers [`check`] walks; a longer chain is [`Error::Malformed`].
pub const MAX_EXT_HEADERS: usize = 8;
/// The most bytes of extension headers [`check`] walks; more is [`Error::Malformed`].
pub const MAX_EXT_BYTES: usize = 2048;
/// The minimum link MTU of IPv6 (RFC 8200 5), also the largest ICMPv6 error (RFC 4443 2.4).
pub const MIN_MTU: usize = 1280;
/// The all-nodes link-local group `ff02::1`.
pub const ALL_NODES: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);
/// The all-routers link-local group `ff02::2`.
pub const ALL_ROUTERS: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 2);

/// A view of an IPv6 packet. [`Ipv6Packet::new_checked`] checks that the fixed header is
/// there, that the version is 6 and that the payload length fits the buffer; after it no
/// accessor panics. The buffer may extend past the payload (Ethernet padding).
/// The fields IPv4 and IPv6 share (version, hop limit as `ttl`, next header as `protocol`,
/// addresses) are [`IpPacket`]'s.
pub type Ipv6Packet<T> = IpPacket<T, Ipv6Addr>;

impl<T: AsRef<[u8]>> Ipv6Packet<T> {
    /// Wraps a buffer holding a whole IPv6 packet: [`Error::Truncated`] when the fixed header
    /// or the payload it declares does not fit, [`Error::Malformed`] for another version.
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self, Error> {
        let p = Ipv6Packet::new_unchecked(buffer);
        let b = p.buffer.as_ref();
        if b.len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        if p.version() != 6 {
            return Err(Error::Malformed);
        }
        if HEADER_LEN + usize::from(p.payload_len()) > b.len() {
            return Err(Error::Truncated);
        }
        Ok(p)
    }

    #[inline(always)]
    fn fixed(&self) -> &[u8; HEADER_LEN] {
        self.buffer
            .as_ref()
            .first_chunk()
            .expect("IPv6 fixed header checked by new_checked")
    }

    /// The payload length field: bytes after the fixed header, extension headers included.
    #[inline]
    pub fn payload_len(&self) -> u16 {
        let h = self.fixed();
        u16::from_be_bytes([h[field::PAYLOAD_LEN.start], h[field::PAYLOAD_LEN.start + 1]])
    }

    /// The packet's length as its header declares it (fixed header + payload).
    #[inline]
    pub fn total_len(&self) -> usize {
        HEADER_LEN + usize::from(self.payload_len())
    }

    /// The traffic class.
    #[inline]
    pub fn traffic_class(&self) -> u8 {
        let h = self.fixed();
        (h[0] << 4) | (h[1] >> 4)
    }

    /// The flow label (20 bits).
    #[inline]
    pub fn flow_label(&self) -> u32 {
        let h = self.fixed();
        u32::from_be_bytes([0, h[1] & 0x0f, h[2], h[3]])
    }

    /// The bytes after the fixed header up to the payload length (or the buffer's end).
    #[inline]
    pub fn payload(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        let end = self.total_len().min(b.len());
        &b[HEADER_LEN.min(end)..end]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv6Packet<T> {
    #[inline(always)]
    fn fixed_mut(&mut self) -> &mut [u8; HEADER_LEN] {
        self.buffer
            .as_mut()
            .first_chunk_mut()
            .expect("IPv6 fixed header checked by new_checked")
    }

    /// Sets the payload length field.
    #[inline]
    pub fn set_payload_len(&mut self, len: u16) {
        self.fixed_mut()[field::PAYLOAD_LEN].copy_from_slice(&len.to_be_bytes());
    }

    /// Sets version 6, the traffic class and the flow label (20 bits).
    #[inline]
    pub fn set_version_tc_flow(&mut self, tc: u8, flow: u32) {
        let w = (6u32 << 28) | (u32::from(tc) << 20) | (flow & 0xf_ffff);
        self.fixed_mut()[..4].copy_from_slice(&w.to_be_bytes());
    }

    /// The bytes after the fixed header up to the payload length (or the buffer's end),
    /// mutable.
    #[inline]
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let end = self.total_len();
        let b = self.buffer.as_mut();
        let end = end.min(b.len());
        &mut b[HEADER_LEN.min(end)..end]
    }
}

/// The fixed IPv6 header as a value: what the router builds for the packets it sends
/// (traffic class and flow label 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ipv6Repr {
    /// Source address.
    pub src_addr: Ipv6Addr,
    /// Destination address.
    pub dst_addr: Ipv6Addr,
    /// Next header (the upper-layer protocol when there are no extension headers).
    pub next_header: u8,
    /// Bytes after the fixed header.
    pub payload_len: usize,
    /// Hop limit.
    pub hop_limit: u8,
}

impl Ipv6Repr {
    /// Reads a checked packet's fixed header (traffic class and flow label are not kept).
    pub fn parse<T: AsRef<[u8]>>(p: &Ipv6Packet<T>) -> Result<Ipv6Repr, Error> {
        Ok(Ipv6Repr {
            src_addr: p.src_addr(),
            dst_addr: p.dst_addr(),
            next_header: p.protocol(),
            payload_len: usize::from(p.payload_len()),
            hop_limit: p.ttl(),
        })
    }

    /// The header length (40).
    #[inline]
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the fixed header (the payload is the caller's).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Ipv6Packet<T>) {
        p.set_version_tc_flow(0, 0);
        p.set_payload_len(len16(self.payload_len));
        p.set_protocol(self.next_header);
        p.set_ttl(self.hop_limit);
        p.set_src_addr(self.src_addr);
        p.set_dst_addr(self.dst_addr);
    }
}

/// The fragment header of a fragmented packet (RFC 8200 4.5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ipv6Frag {
    /// Fragment offset in 8-byte units (0: the first fragment).
    pub offset: u16,
    /// The M flag: more fragments follow.
    pub more: bool,
    /// Identification.
    pub id: u32,
}

/// The facts about a valid IPv6 packet, from [`check`].
///
/// For a fragment other than the first (`frag` with a nonzero offset), the bytes at `l4_off`
/// are the middle of the original payload, **not** an upper-layer header: `next_header`
/// names the protocol of the whole datagram, but no ports or ICMPv6 type can be read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ipv6Info {
    /// Source address.
    pub src: Ipv6Addr,
    /// Destination address.
    pub dst: Ipv6Addr,
    /// Hop limit.
    pub hop_limit: u8,
    /// Bytes after the fixed header, from the header (extension headers included).
    pub payload_len: u16,
    /// The upper-layer protocol after the extension-header chain.
    pub next_header: u8,
    /// Offset of the upper-layer header from the start of the IPv6 header.
    pub l4_off: usize,
    /// The fragment header, when there is one.
    pub frag: Option<Ipv6Frag>,
    /// A hop-by-hop options header is present.
    pub has_hbh: bool,
}

impl Ipv6Info {
    /// The packet's length from its header (fixed header + payload).
    #[inline]
    pub fn total_len(&self) -> usize {
        HEADER_LEN + usize::from(self.payload_len)
    }

    /// True for a fragment other than the first (no upper-layer header in it).
    #[inline]
    pub fn is_later_fragment(&self) -> bool {
        self.frag.is_some_and(|f| f.offset != 0)
    }

    /// True for any fragment of a bigger datagram (an atomic fragment, offset 0 without M,
    /// is not one: RFC 6946).
    #[inline]
    pub fn is_fragment(&self) -> bool {
        self.frag.is_some_and(|f| f.offset != 0 || f.more)
    }
}

/// One extension header found by [`ExtHeaders`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExtHeader {
    /// Its type (the next-header value that named it).
    pub kind: u8,
    /// Its offset from the start of the IPv6 header.
    pub offset: usize,
    /// Its length in bytes.
    pub len: usize,
    /// The next header it names.
    pub next_header: u8,
}

/// True for the next-header values [`ExtHeaders`] walks through.
#[inline]
pub const fn is_ext_header(nh: u8) -> bool {
    matches!(
        nh,
        NH_HOPOPTS | NH_ROUTING | NH_FRAGMENT | NH_DSTOPTS | NH_AH
    )
}

/// Walks the extension-header chain of a packet (`l3` from the IPv6 header to the end of its
/// payload): yields each header, stops at the first upper-layer protocol (or ESP / no next
/// header), after a fragment header with a nonzero offset (what follows is not a header), or
/// with an error: [`Error::Truncated`] for a header past the end, [`Error::Malformed`] for a
/// hop-by-hop header not first, more than [`MAX_EXT_HEADERS`] headers or
/// [`MAX_EXT_BYTES`] bytes of them. Bounded work whatever the bytes.
#[derive(Clone, Debug)]
pub struct ExtHeaders<'a> {
    l3: &'a [u8],
    next: u8,
    off: usize,
    count: usize,
    done: bool,
}

impl<'a> ExtHeaders<'a> {
    /// A walker over `l3` (fixed header included; its length is where the payload ends).
    pub fn new(l3: &'a [u8]) -> ExtHeaders<'a> {
        let next = l3.get(field::NEXT_HEADER).copied().unwrap_or(NH_NONE);
        ExtHeaders {
            l3,
            next,
            off: HEADER_LEN,
            count: 0,
            done: l3.len() < HEADER_LEN,
        }
    }

    /// The next header after the headers walked so far, and its offset.
    pub fn position(&self) -> (u8, usize) {
        (self.next, self.off)
    }
}

impl Iterator for ExtHeaders<'_> {
    type Item = Result<ExtHeader, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done || !is_ext_header(self.next) {
            return None;
        }
        let fail = |s: &mut Self, e| {
            s.done = true;
            Some(Err(e))
        };
        if self.next == NH_HOPOPTS && self.off != HEADER_LEN {
            return fail(self, Error::Malformed);
        }
        if self.count >= MAX_EXT_HEADERS {
            return fail(self, Error::Malformed);
        }
        let Some(h) = self.l3.get(self.off..).and_then(|b| b.first_chunk::<8>()) else {
            return fail(self, Error::Truncated);
        };
        let len = match self.next {
            NH_FRAGMENT => 8,
            NH_AH => (usize::from(h[1]) + 2) * 4,
            _ => (usize::from(h[1]) + 1) * 8,
        };
        if self.off + len - HEADER_LEN > MAX_EXT_BYTES {
            return fail(self, Error::Malformed);
        }
        if self.off + len > self.l3.len() {
            return fail(self, Error::Truncated);
        }
        let e = ExtHeader {
            kind: self.next,
            offset: self.off,
            len,
            next_header: h[0],
        };
        self.count += 1;
        self.next = h[0];
        self.off += len;
        if e.kind == NH_FRAGMENT && u16::from_be_bytes([h[2], h[3]]) >> 3 != 0 {
            // A later fragment: the rest is payload, not headers.
            self.done = true;
        }
        Some(Ok(e))
    }
}

/// Checks an IPv6 packet as Linux's `ipv6_rcv` does, and walks its extension headers:
/// version 6, the fixed header and the payload length within the bytes present (a payload
/// length of 0 with a hop-by-hop header, a jumbogram, is refused), a source that is not
/// multicast, a destination that is not `::1`, and an extension-header chain within the
/// bounds of [`ExtHeaders`]. `l3` starts at the IPv6 header; bytes past the payload length
/// (Ethernet padding) are ignored.
pub fn check(l3: &[u8]) -> Result<Ipv6Info, Error> {
    let p = Ipv6Packet::new_checked(l3)?;
    let (src, dst) = (p.src_addr(), p.dst_addr());
    if src.is_multicast() || dst.is_loopback() {
        return Err(Error::Malformed);
    }
    let payload_len = p.payload_len();
    let first = p.protocol();
    if payload_len == 0 && first == NH_HOPOPTS {
        return Err(Error::Malformed);
    }
    let pkt = &l3[..p.total_len()];
    let mut info = Ipv6Info {
        src,
        dst,
        hop_limit: p.ttl(),
        payload_len,
        next_header: first,
        l4_off: HEADER_LEN,
        frag: None,
        has_hbh: false,
    };
    if !is_ext_header(first) {
        return Ok(info);
    }
    let mut w = ExtHeaders::new(pkt);
    for h in &mut w {
        let h = h?;
        match h.kind {
            NH_HOPOPTS => info.has_hbh = true,
            NH_FRAGMENT => {
                let b = &pkt[h.offset..h.offset + 8];
                let fo = u16::from_be_bytes([b[2], b[3]]);
                info.frag = Some(Ipv6Frag {
                    offset: fo >> 3,
                    more: fo & 1 != 0,
                    id: u32::from_be_bytes([b[4], b[5], b[6], b[7]]),
                });
            }
            _ => {}
        }
    }
    (info.next_header, info.l4_off) = w.position();
    Ok(info)
}

/// True for `fe80::/10`, the link-local unicast scope (never forwarded).
#[inline]
pub const fn is_link_local(a: &Ipv6Addr) -> bool {
    a.segments()[0] & 0xffc0 == 0xfe80
}

/// The solicited-node multicast group of `a` (`ff02::1:ffXX:XXXX`, RFC 4291 2.7.1).
pub fn solicited_node(a: Ipv6Addr) -> Ipv6Addr {
    let o = a.octets();
    Ipv6Addr::from([
        0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, o[13], o[14], o[15],
    ])
}

/// The Ethernet group address an IPv6 multicast group maps to (`33:33` and its low 32 bits,
/// RFC 2464 7).
pub fn multicast_mac(group: Ipv6Addr) -> MacAddr {
    let o = group.octets();
    MacAddr([0x33, 0x33, o[12], o[13], o[14], o[15]])
}

/// The link-local address `fe80::/64` with the modified EUI-64 interface identifier of
/// `mac` (RFC 4291 appendix A: `ff:fe` in the middle, the universal/local bit flipped), as
/// Linux gives an interface.
pub fn link_local_from_mac(mac: MacAddr) -> Ipv6Addr {
    let m = mac.0;
    Ipv6Addr::from([
        0xfe,
        0x80,
        0,
        0,
        0,
        0,
        0,
        0,
        m[0] ^ 0x02,
        m[1],
        m[2],
        0xff,
        0xfe,
        m[3],
        m[4],
        m[5],
    ])
}

/// `addr` with the bits past `len` (0..=128) cleared.
pub fn mask(addr: Ipv6Addr, len: u8) -> Ipv6Addr {
    let a = u128::from(addr);
    Ipv6Addr::from(if len == 0 {
        0
    } else {
        a & (u128::MAX << (128 - u32::from(len.min(128))))
    })
}

/// The pseudo-header of an upper-layer message of `len` bytes.
#[inline]
pub(crate) fn pseudo(src: Ipv6Addr, dst: Ipv6Addr, next_header: u8, len: usize) -> PseudoHeader {
    PseudoHeader::Ipv6 {
        src: src.octets(),
        dst: dst.octets(),
        next_header,
        len: u32::try_from(len).unwrap_or(u32::MAX),
    }
}

/// True when an ICMPv6 error may be sent about this packet (RFC 4443 2.4 (e) and Linux's
/// `icmp6_send`): not about an ICMPv6 error or a redirect, not from the unspecified, a
/// multicast or loopback source, not about a packet sent to a multicast group or an L2 group
/// (`l2_group_dst`), not about a later fragment. (RFC 4443 lets packet too big and parameter
/// problem through to multicast; tapyard, which routes no multicast, never sends them.)
pub fn may_send_icmp_error(l3: &[u8], info: &Ipv6Info, l2_group_dst: bool) -> bool {
    if l2_group_dst || info.is_later_fragment() {
        return false;
    }
    if info.src.is_unspecified()
        || info.src.is_multicast()
        || info.src.is_loopback()
        || info.dst.is_multicast()
    {
        return false;
    }
    if info.next_header == NH_ICMPV6 {
        let Some(&ty) = l3.get(info.l4_off) else {
            return false;
        };
        return !icmpv6::is_error(ty) && ty != icmpv6::codes::REDIRECT;
    }
    true
}

/// Writes an Ethernet + IPv6 + ICMPv6 message (`repr`, checksummed) from `src_ip` to
/// `dst_ip` with `hop_limit`. Returns the frame length, or `None` when `out` is too small.
pub fn write_icmp(
    out: &mut [u8],
    src_mac: MacAddr,
    dst_mac: MacAddr,
    src_ip: Ipv6Addr,
    dst_ip: Ipv6Addr,
    hop_limit: u8,
    repr: &Icmpv6Repr<'_>,
) -> Option<usize> {
    let ip = IpHead {
        src: src_ip,
        dst: dst_ip,
        proto: IpProto::ICMPV6,
        payload_len: repr.buffer_len(),
        ttl: hop_limit,
        tos: 0,
        dont_frag: false,
    };
    emit_frame(out, (src_mac, dst_mac), &ip, |p| {
        repr.emit(&mut Icmpv6Packet::new_unchecked(p), src_ip, dst_ip)
    })
}

/// Decrements the hop limit of the IPv6 header at the start of `l3` (no header checksum in
/// IPv6). Does nothing on a buffer shorter than the fixed header.
#[inline]
pub fn decrement_hop_limit(l3: &mut [u8]) {
    if let Some(h) = l3.get_mut(field::HOP_LIMIT) {
        *h = h.wrapping_sub(1);
    }
}

/// Sums a pseudo-header plus `data` and tells whether it verifies (for ICMPv6 and the other
/// upper layers over IPv6).
#[inline]
pub(crate) fn l4_verifies(src: Ipv6Addr, dst: Ipv6Addr, nh: u8, data: &[u8]) -> bool {
    pseudo(src, dst, nh, data.len()).verifies(data)
}

/// The checksum field value for `data` (its checksum field zero) over IPv6.
#[inline]
pub(crate) fn l4_checksum(src: Ipv6Addr, dst: Ipv6Addr, nh: u8, data: &[u8]) -> u16 {
    let acc = checksum::sum(pseudo(src, dst, nh, data.len()).sum(), data);
    u16::from_be_bytes(checksum::finish(acc))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn packet(payload: usize) -> Vec<u8> {
        let mut p = vec![0u8; HEADER_LEN + payload];
        p[0] = 0x60;
        p[4..6].copy_from_slice(&u16::try_from(payload).unwrap().to_be_bytes());
        p[6] = 6;
        p[7] = 64;
        p[8..24].copy_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        p[24..40].copy_from_slice(&[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]);
        p
    }

    #[test]
    fn reads_the_fixed_header_and_sets_the_payload_length() {
        let mut b = packet(20);
        let p = Ipv6Packet::new_checked(&b[..]).unwrap();
        assert_eq!((p.version(), p.payload_len(), p.total_len()), (6, 20, 60));
        assert_eq!((p.protocol(), p.ttl()), (6, 64));
        assert_eq!(p.src_addr().octets()[15], 1);
        assert_eq!(p.dst_addr().octets()[15], 2);
        Ipv6Packet::new_unchecked(&mut b[..]).set_payload_len(8);
        assert_eq!(Ipv6Packet::new_checked(&b[..]).unwrap().payload_len(), 8);
    }

    #[test]
    fn refuses_short_buffers_lying_lengths_and_other_versions() {
        let b = packet(20);
        assert_eq!(Ipv6Packet::new_checked(&b[..39]), Err(Error::Truncated));
        assert_eq!(Ipv6Packet::new_checked(&b[..59]), Err(Error::Truncated));
        let mut v4 = b.clone();
        v4[0] = 0x45;
        assert_eq!(Ipv6Packet::new_checked(&v4[..]), Err(Error::Malformed));
    }

    fn with_ext(chain: &[(u8, Vec<u8>)], upper: u8, payload: usize) -> Vec<u8> {
        // chain: (kind, body after next-header byte) pairs.
        let mut ext = Vec::new();
        for (i, (_, body)) in chain.iter().enumerate() {
            let next = chain.get(i + 1).map_or(upper, |c| c.0);
            ext.push(next);
            ext.extend_from_slice(body);
        }
        let mut p = packet(ext.len() + payload);
        p[6] = chain.first().map_or(upper, |c| c.0);
        p[40..40 + ext.len()].copy_from_slice(&ext);
        p
    }

    fn opts(n8: usize) -> Vec<u8> {
        // Hdr ext len, then Pad1 options to n8 * 8 bytes in all.
        let mut b = vec![0u8; n8 * 8 - 1];
        b[0] = u8::try_from(n8 - 1).unwrap();
        b
    }

    #[test]
    fn walks_extension_headers_to_the_upper_layer() {
        let p = with_ext(
            &[
                (NH_HOPOPTS, opts(1)),
                (NH_DSTOPTS, opts(2)),
                (NH_ROUTING, opts(1)),
            ],
            NH_UDP,
            8,
        );
        let i = check(&p).unwrap();
        assert_eq!(
            (i.next_header, i.l4_off, i.has_hbh, i.frag),
            (NH_UDP, 40 + 32, true, None)
        );
        // A first fragment has its upper-layer header; a later one does not.
        let frag = |off: u16, m: bool| {
            let fo = (off << 3) | u16::from(m);
            let mut b = vec![0, 0, 0, 0, 0, 0, 7];
            b[1..3].copy_from_slice(&fo.to_be_bytes());
            b
        };
        let p = with_ext(&[(NH_FRAGMENT, frag(0, true))], NH_TCP, 20);
        let i = check(&p).unwrap();
        assert_eq!(
            i.frag,
            Some(Ipv6Frag {
                offset: 0,
                more: true,
                id: 7
            })
        );
        assert_eq!(
            (i.next_header, i.l4_off, i.is_later_fragment()),
            (NH_TCP, 48, false)
        );
        let mut p = with_ext(&[(NH_FRAGMENT, frag(100, false))], NH_DSTOPTS, 20);
        // Bytes after a later fragment's header are payload, even if they look like headers.
        p[48] = 99;
        let i = check(&p).unwrap();
        assert!(i.is_later_fragment());
        assert_eq!((i.next_header, i.l4_off), (NH_DSTOPTS, 48));
        // Jumbograms, ESP and no-next-header.
        let mut j = with_ext(&[(NH_HOPOPTS, opts(1))], NH_UDP, 0);
        j[4..6].fill(0);
        assert_eq!(check(&j), Err(Error::Malformed));
        let e = with_ext(&[(NH_DSTOPTS, opts(1))], NH_ESP, 16);
        assert_eq!(check(&e).unwrap().next_header, NH_ESP);
    }

    #[test]
    fn refuses_long_or_lying_chains() {
        let nine: Vec<_> = (0..9).map(|_| (NH_DSTOPTS, opts(1))).collect();
        assert_eq!(check(&with_ext(&nine, NH_UDP, 8)), Err(Error::Malformed));
        let eight: Vec<_> = (0..8).map(|_| (NH_DSTOPTS, opts(1))).collect();
        assert!(check(&with_ext(&eight, NH_UDP, 8)).is_ok());
        // Too many bytes: 256 * 8 > 2048 with the next header.
        let big = with_ext(
            &[(NH_DSTOPTS, opts(200)), (NH_DSTOPTS, opts(57))],
            NH_UDP,
            0,
        );
        assert_eq!(check(&big), Err(Error::Malformed));
        // Hop-by-hop not first.
        let hbh = with_ext(&[(NH_DSTOPTS, opts(1)), (NH_HOPOPTS, opts(1))], NH_UDP, 8);
        assert_eq!(check(&hbh), Err(Error::Malformed));
        // A header running past the payload length.
        let mut cut = with_ext(&[(NH_DSTOPTS, opts(2))], NH_UDP, 0);
        cut[4..6].copy_from_slice(&8u16.to_be_bytes());
        assert_eq!(check(&cut[..48]), Err(Error::Truncated));
        // Multicast source, loopback destination.
        let mut m = packet(8);
        m[8] = 0xff;
        assert_eq!(check(&m), Err(Error::Malformed));
    }

    #[test]
    fn ndp_address_helpers() {
        let a: Ipv6Addr = "fd00:10:244:1::1234:5678".parse().unwrap();
        assert_eq!(
            solicited_node(a),
            "ff02::1:ff34:5678".parse::<Ipv6Addr>().unwrap()
        );
        assert_eq!(
            multicast_mac(solicited_node(a)),
            MacAddr([0x33, 0x33, 0xff, 0x34, 0x56, 0x78])
        );
        let ll = link_local_from_mac(MacAddr([0x52, 0x54, 0x00, 0x12, 0x34, 0x56]));
        assert_eq!(ll, "fe80::5054:ff:fe12:3456".parse::<Ipv6Addr>().unwrap());
        assert!(is_link_local(&ll) && !is_link_local(&a));
        assert_eq!(mask(a, 64), "fd00:10:244:1::".parse::<Ipv6Addr>().unwrap());
        assert_eq!(mask(a, 0), Ipv6Addr::UNSPECIFIED);
    }

    proptest! {
        #[test]
        fn repr_round_trip(src in any::<u128>(), dst in any::<u128>(), nh in any::<u8>(), len in 0usize..64, hl in any::<u8>()) {
            let r = Ipv6Repr { src_addr: src.into(), dst_addr: dst.into(), next_header: nh, payload_len: len, hop_limit: hl };
            let mut b = vec![0u8; HEADER_LEN + len];
            r.emit(&mut Ipv6Packet::new_unchecked(&mut b[..]));
            prop_assert_eq!(Ipv6Repr::parse(&Ipv6Packet::new_checked(&b[..]).unwrap()), Ok(r));
            for n in 0..b.len() {
                prop_assert!(Ipv6Packet::new_checked(&b[..n]).is_err());
                prop_assert!(check(&b[..n]).is_err());
            }
        }

        #[test]
        fn ext_chain_garbage_is_bounded(tail in proptest::collection::vec(any::<u8>(), 0..3000), nh in any::<u8>()) {
            let mut b = packet(tail.len().min(0xffff));
            b[6] = nh;
            b[40..].copy_from_slice(&tail);
            if let Ok(i) = check(&b) {
                prop_assert!(i.l4_off <= i.total_len());
                prop_assert!(i.l4_off - HEADER_LEN <= MAX_EXT_BYTES + 8);
            }
        }
    }

    proptest! {
        #[test]
        fn no_checked_view_panics(bytes in proptest::collection::vec(any::<u8>(), 0..80)) {
            if let Ok(p) = Ipv6Packet::new_checked(&bytes[..]) {
                prop_assert!(p.total_len() <= bytes.len());
                let _ = (p.protocol(), p.ttl(), p.src_addr(), p.dst_addr());
            }
        }
    }
}
