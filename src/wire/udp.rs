//! UDP (RFC 768) headers: the view [`UdpPacket`] and the datagram as a value ([`UdpRepr`]).

use std::net::Ipv4Addr;

use crate::narrow::len16;
use crate::wire::checksum::{self, PseudoHeader};
use crate::wire::ipv4::PROTO_UDP;
use crate::wire::Error;

mod field {
    use std::ops::Range;
    pub const SRC_PORT: Range<usize> = 0..2;
    pub const DST_PORT: Range<usize> = 2..4;
    pub const LEN: Range<usize> = 4..6;
    pub const CSUM: Range<usize> = 6..8;
    pub const PAYLOAD: usize = 8;
}

/// Length of the UDP header.
pub const HEADER_LEN: usize = field::PAYLOAD;

/// A view of a UDP datagram. [`UdpPacket::new_checked`] checks that the 8-byte header is
/// there; after it no accessor panics. The length field is reported, not trusted: the
/// payload runs to the end of the buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UdpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> UdpPacket<T> {
    /// Wraps a buffer without checking it: accessors panic if it is shorter than 8 bytes.
    #[inline]
    pub const fn new_unchecked(buffer: T) -> Self {
        UdpPacket { buffer }
    }

    /// Wraps a buffer of at least 8 bytes.
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self, Error> {
        if buffer.as_ref().len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        Ok(UdpPacket { buffer })
    }

    /// The underlying buffer.
    #[inline]
    pub fn into_inner(self) -> T {
        self.buffer
    }

    #[inline(always)]
    fn be16(&self, r: std::ops::Range<usize>) -> u16 {
        let h: &[u8; HEADER_LEN] = self
            .buffer
            .as_ref()
            .first_chunk()
            .expect("UDP header checked by new_checked");
        u16::from_be_bytes([h[r.start], h[r.start + 1]])
    }

    /// Source port.
    #[inline]
    pub fn src_port(&self) -> u16 {
        self.be16(field::SRC_PORT)
    }

    /// Destination port.
    #[inline]
    pub fn dst_port(&self) -> u16 {
        self.be16(field::DST_PORT)
    }

    /// The length field.
    #[inline]
    pub fn len(&self) -> u16 {
        self.be16(field::LEN)
    }

    /// True when the length field says the datagram is only the header.
    #[inline]
    pub fn is_empty(&self) -> bool {
        usize::from(self.len()) <= HEADER_LEN
    }

    /// Checksum (0: none).
    #[inline]
    pub fn checksum(&self) -> u16 {
        self.be16(field::CSUM)
    }

    /// The bytes after the header.
    #[inline]
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }

    /// True when the checksum is absent (0) or verifies from `src` to `dst`.
    pub fn verify_checksum(&self, src: Ipv4Addr, dst: Ipv4Addr) -> bool {
        if self.checksum() == 0 {
            return true;
        }
        let b = self.buffer.as_ref();
        pseudo(src, dst, b.len()).verifies(b)
    }
}

fn pseudo(src: Ipv4Addr, dst: Ipv4Addr, len: usize) -> PseudoHeader {
    PseudoHeader::ipv4(src, dst, PROTO_UDP, len)
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> UdpPacket<T> {
    #[inline(always)]
    fn set_be16(&mut self, r: std::ops::Range<usize>, v: u16) {
        let h: &mut [u8; HEADER_LEN] = self
            .buffer
            .as_mut()
            .first_chunk_mut()
            .expect("UDP header checked by new_checked");
        h[r].copy_from_slice(&v.to_be_bytes());
    }

    /// Sets the source port.
    #[inline]
    pub fn set_src_port(&mut self, v: u16) {
        self.set_be16(field::SRC_PORT, v);
    }

    /// Sets the destination port.
    #[inline]
    pub fn set_dst_port(&mut self, v: u16) {
        self.set_be16(field::DST_PORT, v);
    }

    /// Sets the length field.
    #[inline]
    pub fn set_len(&mut self, v: u16) {
        self.set_be16(field::LEN, v);
    }

    /// Sets the checksum field.
    #[inline]
    pub fn set_checksum(&mut self, v: u16) {
        self.set_be16(field::CSUM, v);
    }

    /// The bytes after the header, mutable.
    #[inline]
    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[HEADER_LEN..]
    }

    /// Computes the checksum from `src` to `dst` over the whole buffer (0 sent as 0xffff).
    pub fn fill_checksum(&mut self, src: Ipv4Addr, dst: Ipv4Addr) {
        self.set_checksum(0);
        let b = self.buffer.as_ref();
        let c = checksum::finish_l4(checksum::sum(pseudo(src, dst, b.len()).sum(), b));
        self.set_checksum(u16::from_be_bytes(c));
    }
}

/// A UDP datagram as a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UdpRepr<'a> {
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
    /// Payload.
    pub payload: &'a [u8],
}

impl<'a> UdpRepr<'a> {
    /// Reads a checked datagram from `src` to `dst`: [`Error::Malformed`] when the length
    /// field is not the buffer's length or the checksum fails.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(
        p: &UdpPacket<&'a T>,
        src: Ipv4Addr,
        dst: Ipv4Addr,
    ) -> Result<Self, Error> {
        let buf: &'a T = p.buffer;
        let b = buf.as_ref();
        if usize::from(p.len()) != b.len() || !p.verify_checksum(src, dst) {
            return Err(Error::Malformed);
        }
        Ok(UdpRepr {
            src_port: p.src_port(),
            dst_port: p.dst_port(),
            payload: &b[HEADER_LEN..],
        })
    }

    /// Length of the datagram.
    #[inline]
    pub fn buffer_len(&self) -> usize {
        HEADER_LEN + self.payload.len()
    }

    /// Writes the datagram and its checksum into a packet of [`UdpRepr::buffer_len`] bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        p: &mut UdpPacket<T>,
        src: Ipv4Addr,
        dst: Ipv4Addr,
    ) {
        p.set_src_port(self.src_port);
        p.set_dst_port(self.dst_port);
        p.set_len(len16(self.buffer_len()));
        p.payload_mut()[..self.payload.len()].copy_from_slice(self.payload);
        p.fill_checksum(src, dst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const A: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 5);
    const B: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);

    #[test]
    fn dns_query_bytes() {
        let b = [0x13, 0x88, 0, 53, 0, 9, 0, 0, b'x'];
        let p = UdpPacket::new_checked(&b[..]).unwrap();
        assert_eq!((p.src_port(), p.dst_port(), p.len()), (5000, 53, 9));
        assert!(p.verify_checksum(A, B), "no checksum");
        assert_eq!(p.payload(), b"x");
        assert_eq!(UdpPacket::new_checked(&b[..7]), Err(Error::Truncated));
    }

    proptest! {
        #[test]
        fn round_trip(ports in any::<(u16, u16)>(), payload in proptest::collection::vec(any::<u8>(), 0..40)) {
            let r = UdpRepr { src_port: ports.0, dst_port: ports.1, payload: &payload };
            let mut b = vec![0u8; r.buffer_len()];
            r.emit(&mut UdpPacket::new_unchecked(&mut b[..]), A, B);
            prop_assert!(UdpPacket::new_checked(&b[..]).unwrap().checksum() != 0);
            prop_assert_eq!(UdpRepr::parse(&UdpPacket::new_checked(&b[..]).unwrap(), A, B), Ok(r));
            for n in 0..b.len() {
                if let Ok(p) = UdpPacket::new_checked(&b[..n]) {
                    prop_assert!(UdpRepr::parse(&p, A, B).is_err());
                }
            }
        }
    }
}
