//! TCP (RFC 9293) headers: the view [`TcpPacket`] and the segment tapyard builds itself, a
//! reset, as a value ([`TcpRepr`]).

use std::net::Ipv4Addr;

use crate::narrow::{len32, low8};
use crate::wire::checksum::{self, PseudoHeader};
use crate::wire::ipv4::PROTO_TCP;
use crate::wire::Error;

mod field {
    use std::ops::Range;
    pub const SRC_PORT: Range<usize> = 0..2;
    pub const DST_PORT: Range<usize> = 2..4;
    pub const SEQ: Range<usize> = 4..8;
    pub const ACK: Range<usize> = 8..12;
    pub const DATA_OFF: usize = 12;
    pub const FLAGS: usize = 13;
    pub const WINDOW: Range<usize> = 14..16;
    pub const CSUM: Range<usize> = 16..18;
    pub const URGENT: Range<usize> = 18..20;
    pub const OPTIONS: usize = 20;
}

/// Length of a TCP header without options.
pub const HEADER_LEN: usize = field::OPTIONS;
/// Offset of the checksum field, for a `csum_offset` (virtio) comparison.
pub const CHECKSUM_OFFSET: usize = field::CSUM.start;

/// The header length (data offset × 4) a TCP segment starting at `seg[0]` claims, if the
/// field is there; nothing else is checked. For sizing a TSO super-frame's segments, where
/// a lie only changes the size judged against the MTU.
#[inline]
pub fn claimed_header_len(seg: &[u8]) -> Option<usize> {
    seg.get(field::DATA_OFF).map(|d| usize::from(d >> 4) * 4)
}

/// TCP flag bits (the byte at offset 13).
pub mod flags {
    /// FIN.
    pub const FIN: u8 = 0x01;
    /// SYN.
    pub const SYN: u8 = 0x02;
    /// RST.
    pub const RST: u8 = 0x04;
    /// PSH.
    pub const PSH: u8 = 0x08;
    /// ACK.
    pub const ACK: u8 = 0x10;
    /// URG.
    pub const URG: u8 = 0x20;
    /// ECE.
    pub const ECE: u8 = 0x40;
    /// CWR.
    pub const CWR: u8 = 0x80;
}

/// A view of a TCP segment. [`TcpPacket::new_checked`] checks that the fixed header is there
/// and that the data offset is at least 5 and within the buffer; after it no accessor panics.
/// The segment runs to the end of the buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> TcpPacket<T> {
    /// Wraps a buffer without checking it: accessors panic if it is shorter than 20 bytes
    /// (and `payload` if the data offset lies).
    #[inline]
    pub const fn new_unchecked(buffer: T) -> Self {
        TcpPacket { buffer }
    }

    /// Wraps a buffer after the checks above: [`Error::Truncated`] when the header (with its
    /// options) is longer than the buffer, [`Error::Malformed`] for a data offset below 5.
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self, Error> {
        let b = buffer.as_ref();
        let Some(h) = b.first_chunk::<HEADER_LEN>() else {
            return Err(Error::Truncated);
        };
        let hl = usize::from(h[field::DATA_OFF] >> 4) * 4;
        if hl < HEADER_LEN {
            return Err(Error::Malformed);
        }
        if hl > b.len() {
            return Err(Error::Truncated);
        }
        Ok(TcpPacket { buffer })
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
            .expect("TCP header checked by new_checked")
    }

    #[inline(always)]
    fn be16(&self, r: std::ops::Range<usize>) -> u16 {
        let h = self.fixed();
        u16::from_be_bytes([h[r.start], h[r.start + 1]])
    }

    #[inline(always)]
    fn be32(&self, r: std::ops::Range<usize>) -> u32 {
        let h = self.fixed();
        let s = r.start;
        u32::from_be_bytes([h[s], h[s + 1], h[s + 2], h[s + 3]])
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

    /// Sequence number.
    #[inline]
    pub fn seq_number(&self) -> u32 {
        self.be32(field::SEQ)
    }

    /// Acknowledgment number.
    #[inline]
    pub fn ack_number(&self) -> u32 {
        self.be32(field::ACK)
    }

    /// Header length in bytes (data offset × 4).
    #[inline]
    pub fn header_len(&self) -> usize {
        usize::from(self.fixed()[field::DATA_OFF] >> 4) * 4
    }

    /// The flag byte (see [`flags`]).
    #[inline]
    pub fn flags(&self) -> u8 {
        self.fixed()[field::FLAGS]
    }

    /// Window.
    #[inline]
    pub fn window(&self) -> u16 {
        self.be16(field::WINDOW)
    }

    /// Checksum.
    #[inline]
    pub fn checksum(&self) -> u16 {
        self.be16(field::CSUM)
    }

    /// The bytes after the header (to the end of the buffer).
    #[inline]
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..]
    }

    /// True when the checksum verifies under the pseudo-header from `src` to `dst`.
    pub fn verify_checksum(&self, src: Ipv4Addr, dst: Ipv4Addr) -> bool {
        let b = self.buffer.as_ref();
        pseudo(src, dst, b.len()).verifies(b)
    }
}

fn pseudo(src: Ipv4Addr, dst: Ipv4Addr, len: usize) -> PseudoHeader {
    PseudoHeader::ipv4(src, dst, PROTO_TCP, len)
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> TcpPacket<T> {
    #[inline(always)]
    fn fixed_mut(&mut self) -> &mut [u8; HEADER_LEN] {
        self.buffer
            .as_mut()
            .first_chunk_mut()
            .expect("TCP header checked by new_checked")
    }

    /// Sets the source port.
    #[inline]
    pub fn set_src_port(&mut self, v: u16) {
        self.fixed_mut()[field::SRC_PORT].copy_from_slice(&v.to_be_bytes());
    }

    /// Sets the destination port.
    #[inline]
    pub fn set_dst_port(&mut self, v: u16) {
        self.fixed_mut()[field::DST_PORT].copy_from_slice(&v.to_be_bytes());
    }

    /// Sets the sequence number.
    #[inline]
    pub fn set_seq_number(&mut self, v: u32) {
        self.fixed_mut()[field::SEQ].copy_from_slice(&v.to_be_bytes());
    }

    /// Sets the acknowledgment number.
    #[inline]
    pub fn set_ack_number(&mut self, v: u32) {
        self.fixed_mut()[field::ACK].copy_from_slice(&v.to_be_bytes());
    }

    /// Sets the header length in bytes (a multiple of 4, 20..=60); the reserved bits are
    /// cleared.
    #[inline]
    pub fn set_header_len(&mut self, len: usize) {
        self.fixed_mut()[field::DATA_OFF] = low8((len / 4) as u64) << 4;
    }

    /// Sets the flag byte.
    #[inline]
    pub fn set_flags(&mut self, v: u8) {
        self.fixed_mut()[field::FLAGS] = v;
    }

    /// Sets the window.
    #[inline]
    pub fn set_window(&mut self, v: u16) {
        self.fixed_mut()[field::WINDOW].copy_from_slice(&v.to_be_bytes());
    }

    /// Sets the urgent pointer.
    #[inline]
    pub fn set_urgent(&mut self, v: u16) {
        self.fixed_mut()[field::URGENT].copy_from_slice(&v.to_be_bytes());
    }

    /// Sets the checksum field.
    #[inline]
    pub fn set_checksum(&mut self, v: u16) {
        self.fixed_mut()[field::CSUM].copy_from_slice(&v.to_be_bytes());
    }

    /// The bytes after the header, mutable.
    #[inline]
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let hl = self.header_len();
        &mut self.buffer.as_mut()[hl..]
    }

    /// Computes the checksum over the pseudo-header `ph` (its length the segment's) and the
    /// whole buffer. As Linux's segmentation, a result of 0 is stored as is (for TCP, 0 and
    /// 0xffff are the same).
    #[inline]
    pub(crate) fn fill_checksum_with(&mut self, ph: &PseudoHeader) {
        self.set_checksum(0);
        let acc = checksum::sum(ph.sum(), self.buffer.as_ref());
        let c = checksum::finish(acc);
        self.fixed_mut()[field::CSUM].copy_from_slice(&c);
    }

    /// Computes the checksum for a segment from `src` to `dst`.
    pub fn fill_checksum(&mut self, src: Ipv4Addr, dst: Ipv4Addr) {
        let ph = pseudo(src, dst, self.buffer.as_ref().len());
        self.fill_checksum_with(&ph);
    }
}

/// A TCP header without options, and its payload, as a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcpRepr<'a> {
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
    /// Sequence number.
    pub seq_number: u32,
    /// Acknowledgment number.
    pub ack_number: u32,
    /// Flag byte (see [`flags`]).
    pub flags: u8,
    /// Window.
    pub window: u16,
    /// Payload.
    pub payload: &'a [u8],
}

impl<'a> TcpRepr<'a> {
    /// Reads a checked segment from `src` to `dst`: [`Error::Malformed`] for a bad checksum or
    /// a header with options (this value has no room for them).
    pub fn parse<T: AsRef<[u8]> + ?Sized>(
        p: &TcpPacket<&'a T>,
        src: Ipv4Addr,
        dst: Ipv4Addr,
    ) -> Result<Self, Error> {
        if !p.verify_checksum(src, dst) || p.header_len() != HEADER_LEN {
            return Err(Error::Malformed);
        }
        let buf: &'a T = p.buffer;
        Ok(TcpRepr {
            src_port: p.src_port(),
            dst_port: p.dst_port(),
            seq_number: p.seq_number(),
            ack_number: p.ack_number(),
            flags: p.flags(),
            window: p.window(),
            payload: &buf.as_ref()[HEADER_LEN..],
        })
    }

    /// The reset that refuses `seg`, as Linux's `nf_send_reset` (`REJECT --reject-with
    /// tcp-reset`): ports swapped; `seq = SEG.ACK` when the segment had ACK, else `seq = 0`
    /// with `RST|ACK` and `ack = SEG.SEQ + SEG.LEN` (SYN and FIN count one). `None` when the
    /// segment is itself a reset (never answered).
    pub fn reset_for<T: AsRef<[u8]>>(seg: &TcpPacket<T>) -> Option<TcpRepr<'static>> {
        let f = seg.flags();
        if f & flags::RST != 0 {
            return None;
        }
        let (seq_number, ack_number, out) = if f & flags::ACK != 0 {
            (seg.ack_number(), 0, flags::RST)
        } else {
            let len = len32(seg.payload().len())
                + u32::from(f & flags::SYN != 0)
                + u32::from(f & flags::FIN != 0);
            (
                0,
                seg.seq_number().wrapping_add(len),
                flags::RST | flags::ACK,
            )
        };
        Some(TcpRepr {
            src_port: seg.dst_port(),
            dst_port: seg.src_port(),
            seq_number,
            ack_number,
            flags: out,
            window: 0,
            payload: &[],
        })
    }

    /// Length of the segment (20 + payload).
    #[inline]
    pub fn buffer_len(&self) -> usize {
        HEADER_LEN + self.payload.len()
    }

    /// Writes the segment and its checksum (from `src` to `dst`) into a packet of
    /// [`TcpRepr::buffer_len`] bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        p: &mut TcpPacket<T>,
        src: Ipv4Addr,
        dst: Ipv4Addr,
    ) {
        p.set_src_port(self.src_port);
        p.set_dst_port(self.dst_port);
        p.set_seq_number(self.seq_number);
        p.set_ack_number(self.ack_number);
        p.set_header_len(HEADER_LEN);
        p.set_flags(self.flags);
        p.set_window(self.window);
        p.set_urgent(0);
        p.payload_mut()[..self.payload.len()].copy_from_slice(self.payload);
        p.fill_checksum(src, dst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const A: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
    const B: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

    #[test]
    fn syn_bytes() {
        // 40000 -> 80, seq 1000, SYN, window 64240, no options.
        let mut b = [
            0x9c, 0x40, 0, 80, 0, 0, 0x03, 0xe8, 0, 0, 0, 0, 0x50, 0x02, 0xfa, 0xf0, 0, 0, 0, 0,
        ];
        let mut p = TcpPacket::new_checked(&mut b[..]).unwrap();
        p.fill_checksum(A, B);
        let p = TcpPacket::new_checked(&b[..]).unwrap();
        assert_eq!(
            (p.src_port(), p.dst_port(), p.seq_number()),
            (40000, 80, 1000)
        );
        assert_eq!(p.flags(), flags::SYN);
        assert!(p.verify_checksum(A, B));
        let rst = TcpRepr::reset_for(&p).unwrap();
        assert_eq!((rst.seq_number, rst.ack_number), (0, 1001));
        assert_eq!(rst.flags, flags::RST | flags::ACK);
        b[12] = 0x40;
        assert_eq!(TcpPacket::new_checked(&b[..]), Err(Error::Malformed));
        b[12] = 0x60;
        assert_eq!(TcpPacket::new_checked(&b[..]), Err(Error::Truncated));
    }

    proptest! {
        #[test]
        fn round_trip(
            ports in any::<(u16, u16)>(),
            seq in any::<(u32, u32)>(),
            fl in any::<u8>(),
            window in any::<u16>(),
            payload in proptest::collection::vec(any::<u8>(), 0..40),
        ) {
            let r = TcpRepr {
                src_port: ports.0, dst_port: ports.1, seq_number: seq.0, ack_number: seq.1,
                flags: fl, window, payload: &payload,
            };
            let mut b = vec![0u8; r.buffer_len()];
            r.emit(&mut TcpPacket::new_unchecked(&mut b[..]), A, B);
            let p = TcpPacket::new_checked(&b[..]).unwrap();
            prop_assert_eq!(TcpRepr::parse(&p, A, B), Ok(r));
            for n in 0..HEADER_LEN {
                prop_assert!(TcpPacket::new_checked(&b[..n]).is_err());
            }
        }
    }
}
