//! IPv6 (RFC 8200) fixed headers: the view [`Ipv6Packet`].
//!
//! Only the 40-byte fixed header for now — what TCP segmentation of offloaded IPv6
//! super-frames needs (payload length, next header, the addresses of the pseudo-header).
//! Extension headers, `Ipv6Repr` and forwarding come with IPv6 routing; `wire/mod.rs` says
//! where they go.

use crate::wire::Error;

mod field {
    use std::ops::Range;
    pub const VER_TC_FLOW: usize = 0;
    pub const PAYLOAD_LEN: Range<usize> = 4..6;
    pub const NEXT_HEADER: usize = 6;
    pub const HOP_LIMIT: usize = 7;
    pub const SRC_ADDR: Range<usize> = 8..24;
    pub const DST_ADDR: Range<usize> = 24..40;
    pub const PAYLOAD: usize = 40;
}

/// Length of the IPv6 fixed header.
pub const HEADER_LEN: usize = field::PAYLOAD;

/// A view of an IPv6 packet. [`Ipv6Packet::new_checked`] checks that the fixed header is
/// there, that the version is 6 and that the payload length fits the buffer; after it no
/// accessor panics. The buffer may extend past the payload (Ethernet padding).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ipv6Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Ipv6Packet<T> {
    /// Wraps a buffer without checking it: accessors panic if it is shorter than 40 bytes.
    #[inline]
    pub const fn new_unchecked(buffer: T) -> Self {
        Ipv6Packet { buffer }
    }

    /// Wraps a buffer holding a whole IPv6 packet: [`Error::Truncated`] when the fixed header
    /// or the payload it declares does not fit, [`Error::Malformed`] for another version.
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self, Error> {
        let p = Ipv6Packet { buffer };
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

    /// The underlying buffer.
    #[inline]
    pub fn into_inner(self) -> T {
        self.buffer
    }

    #[inline(always)]
    fn fixed(&self) -> &[u8; HEADER_LEN] {
        self.buffer
            .as_ref()
            .first_chunk()
            .expect("IPv6 fixed header checked by new_checked")
    }

    /// The version field (6 for a checked view).
    #[inline]
    pub fn version(&self) -> u8 {
        self.fixed()[field::VER_TC_FLOW] >> 4
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

    /// The next header (an upper-layer protocol or the first extension header).
    #[inline]
    pub fn next_header(&self) -> u8 {
        self.fixed()[field::NEXT_HEADER]
    }

    /// The hop limit.
    #[inline]
    pub fn hop_limit(&self) -> u8 {
        self.fixed()[field::HOP_LIMIT]
    }

    /// The source address's bytes.
    #[inline]
    pub fn src_addr(&self) -> [u8; 16] {
        let mut a = [0; 16];
        a.copy_from_slice(&self.fixed()[field::SRC_ADDR]);
        a
    }

    /// The destination address's bytes.
    #[inline]
    pub fn dst_addr(&self) -> [u8; 16] {
        let mut a = [0; 16];
        a.copy_from_slice(&self.fixed()[field::DST_ADDR]);
        a
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv6Packet<T> {
    /// Sets the payload length field.
    #[inline]
    pub fn set_payload_len(&mut self, len: u16) {
        let h: &mut [u8; HEADER_LEN] = self
            .buffer
            .as_mut()
            .first_chunk_mut()
            .expect("IPv6 fixed header checked by new_checked");
        h[field::PAYLOAD_LEN].copy_from_slice(&len.to_be_bytes());
    }
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
        assert_eq!((p.next_header(), p.hop_limit()), (6, 64));
        assert_eq!(p.src_addr()[15], 1);
        assert_eq!(p.dst_addr()[15], 2);
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

    proptest! {
        #[test]
        fn no_checked_view_panics(bytes in proptest::collection::vec(any::<u8>(), 0..80)) {
            if let Ok(p) = Ipv6Packet::new_checked(&bytes[..]) {
                prop_assert!(p.total_len() <= bytes.len());
                let _ = (p.next_header(), p.hop_limit(), p.src_addr(), p.dst_addr());
            }
        }
    }
}
