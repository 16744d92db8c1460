//! ICMP (RFC 792): the view [`IcmpPacket`] over the 8-byte header and its data, shared by
//! ICMPv4 ([`Icmpv4Packet`]) and ICMPv6 ([`Icmpv6Packet`], whose messages are in
//! [`super::icmpv6`]), and the ICMPv4 messages the router sends and answers as values
//! ([`Icmpv4Repr`]: echo request and reply ([`Echo`], shared with ICMPv6), errors quoting a
//! datagram).

use std::marker::PhantomData;
use std::net::{Ipv4Addr, Ipv6Addr};

use crate::wire::checksum;
use crate::wire::family::{pseudo_header, Family, IpProto};
use crate::wire::Error;

mod field {
    use std::ops::Range;
    pub const TYPE: usize = 0;
    pub const CODE: usize = 1;
    pub const CSUM: Range<usize> = 2..4;
    pub const IDENT: Range<usize> = 4..6;
    pub const SEQ: Range<usize> = 6..8;
    pub const REST: Range<usize> = 4..8;
    pub const DATA: usize = 8;
}

/// Length of the ICMP header (type, code, checksum and the 4-byte "rest of header").
pub const HEADER_LEN: usize = field::DATA;

/// ICMP types and codes tapyard reads and sends.
pub mod codes {
    /// Echo reply.
    pub const ECHO_REPLY: u8 = 0;
    /// Destination unreachable.
    pub const DEST_UNREACH: u8 = 3;
    /// Source quench (deprecated, still an error that quotes a datagram).
    pub const SOURCE_QUENCH: u8 = 4;
    /// Redirect.
    pub const REDIRECT: u8 = 5;
    /// Echo request.
    pub const ECHO_REQUEST: u8 = 8;
    /// Time exceeded.
    pub const TIME_EXCEEDED: u8 = 11;
    /// Parameter problem.
    pub const PARAM_PROBLEM: u8 = 12;
    /// Code: network unreachable.
    pub const NET_UNREACH: u8 = 0;
    /// Code: host unreachable.
    pub const HOST_UNREACH: u8 = 1;
    /// Code: port unreachable.
    pub const PORT_UNREACH: u8 = 3;
    /// Code: fragmentation needed and DF set.
    pub const FRAG_NEEDED: u8 = 4;
    /// Code: communication administratively prohibited.
    pub const ADMIN_PROHIBITED: u8 = 13;
    /// Code (time exceeded): TTL exceeded in transit.
    pub const TTL_EXCEEDED: u8 = 0;
}

/// True for the error types that quote the datagram that caused them (3, 4, 5, 11, 12).
#[inline]
pub const fn is_error(ty: u8) -> bool {
    matches!(ty, 3 | 4 | 5 | 11 | 12)
}

/// True for the echo types (request 8, reply 0), whose identifier conntrack keys on.
#[inline]
pub const fn is_echo(ty: u8) -> bool {
    matches!(ty, 0 | 8)
}

/// True for query messages (echo, timestamp, information, address mask), the only ICMP
/// messages an ICMP error may be sent about (RFC 1122 3.2.2).
#[inline]
pub const fn is_query(ty: u8) -> bool {
    matches!(ty, 0 | 8 | 13 | 14 | 15 | 16 | 17 | 18)
}

/// A view of an ICMP message of family `A` ([`Icmpv4Packet`], [`Icmpv6Packet`]): both have
/// the same 8-byte header (type, code, checksum, a second word) before their data; they
/// differ in their checksum (ICMPv6's covers the IPv6 pseudo-header, RFC 4443 2.3).
/// [`IcmpPacket::new_checked`] checks the header is there; after it no accessor panics. The
/// message runs to the end of the buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IcmpPacket<T: AsRef<[u8]>, A: Family> {
    buffer: T,
    family: PhantomData<A>,
}

/// A view of an ICMPv4 message (see [`IcmpPacket`]).
pub type Icmpv4Packet<T> = IcmpPacket<T, Ipv4Addr>;

/// A view of an ICMPv6 message (see [`IcmpPacket`]).
pub type Icmpv6Packet<T> = IcmpPacket<T, Ipv6Addr>;

impl<T: AsRef<[u8]>, A: Family> IcmpPacket<T, A> {
    /// Wraps a buffer without checking it: accessors panic if it is shorter than 8 bytes.
    #[inline]
    pub const fn new_unchecked(buffer: T) -> Self {
        IcmpPacket {
            buffer,
            family: PhantomData,
        }
    }

    /// Wraps a buffer of at least 8 bytes.
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self, Error> {
        if buffer.as_ref().len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        Ok(Self::new_unchecked(buffer))
    }

    /// The underlying buffer.
    #[inline]
    pub fn into_inner(self) -> T {
        self.buffer
    }

    #[inline(always)]
    fn header(&self) -> &[u8; HEADER_LEN] {
        self.buffer
            .as_ref()
            .first_chunk()
            .expect("ICMP header checked by new_checked")
    }

    /// Message type.
    #[inline]
    pub fn msg_type(&self) -> u8 {
        self.header()[field::TYPE]
    }

    /// Code.
    #[inline]
    pub fn code(&self) -> u8 {
        self.header()[field::CODE]
    }

    /// Checksum.
    #[inline]
    pub fn checksum(&self) -> u16 {
        let h = self.header();
        u16::from_be_bytes([h[field::CSUM.start], h[field::CSUM.start + 1]])
    }

    /// Echo identifier (echo messages).
    #[inline]
    pub fn echo_ident(&self) -> u16 {
        let h = self.header();
        u16::from_be_bytes([h[field::IDENT.start], h[field::IDENT.start + 1]])
    }

    /// Echo sequence number (echo messages).
    #[inline]
    pub fn echo_seq_no(&self) -> u16 {
        let h = self.header();
        u16::from_be_bytes([h[field::SEQ.start], h[field::SEQ.start + 1]])
    }

    /// The second 32-bit word of the header (the next-hop MTU of "fragmentation needed", the
    /// MTU of "packet too big", the gateway of a redirect, the flags of a neighbor
    /// advertisement, ...).
    #[inline]
    pub fn rest(&self) -> u32 {
        let h = self.header();
        u32::from_be_bytes([h[4], h[5], h[6], h[7]])
    }

    /// The data after the header (the quoted datagram of an error).
    #[inline]
    pub fn data(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }

    /// The whole message.
    #[inline]
    pub(crate) fn as_bytes(&self) -> &[u8] {
        self.buffer.as_ref()
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized, A: Family> IcmpPacket<&'a T, A> {
    /// The data after the header, for as long as the buffer is borrowed.
    #[inline]
    pub(crate) fn borrowed_data(&self) -> &'a [u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }
}

impl<T: AsRef<[u8]>> Icmpv4Packet<T> {
    /// True when the checksum over the whole message verifies.
    #[inline]
    pub fn verify_checksum(&self) -> bool {
        checksum::verifies(checksum::sum(0, self.buffer.as_ref()))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>, A: Family> IcmpPacket<T, A> {
    #[inline(always)]
    fn header_mut(&mut self) -> &mut [u8; HEADER_LEN] {
        self.buffer
            .as_mut()
            .first_chunk_mut()
            .expect("ICMP header checked by new_checked")
    }

    /// Sets the message type.
    #[inline]
    pub fn set_msg_type(&mut self, v: u8) {
        self.header_mut()[field::TYPE] = v;
    }

    /// Sets the code.
    #[inline]
    pub fn set_code(&mut self, v: u8) {
        self.header_mut()[field::CODE] = v;
    }

    /// Sets the checksum field.
    #[inline]
    pub fn set_checksum(&mut self, v: u16) {
        self.header_mut()[field::CSUM].copy_from_slice(&v.to_be_bytes());
    }

    /// Sets the echo identifier.
    #[inline]
    pub fn set_echo_ident(&mut self, v: u16) {
        self.header_mut()[field::IDENT].copy_from_slice(&v.to_be_bytes());
    }

    /// Sets the echo sequence number.
    #[inline]
    pub fn set_echo_seq_no(&mut self, v: u16) {
        self.header_mut()[field::SEQ].copy_from_slice(&v.to_be_bytes());
    }

    /// Sets the second header word.
    #[inline]
    pub fn set_rest(&mut self, v: u32) {
        self.header_mut()[field::REST].copy_from_slice(&v.to_be_bytes());
    }

    /// The data after the header, mutable.
    #[inline]
    pub fn data_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[HEADER_LEN..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Icmpv4Packet<T> {
    /// Recomputes the checksum over the whole message.
    #[inline]
    pub fn fill_checksum(&mut self) {
        self.set_checksum(0);
        let c = checksum::checksum(self.buffer.as_ref());
        self.set_checksum(c);
    }
}

/// The fields of an echo request or reply, the same in ICMP and ICMPv6: what
/// [`Icmpv4Repr::EchoRequest`] and [`Icmpv6Repr::EchoRequest`](super::icmpv6::Icmpv6Repr)
/// (and their replies) carry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Echo<'a> {
    /// Identifier.
    pub ident: u16,
    /// Sequence number.
    pub seq_no: u16,
    /// Payload.
    pub data: &'a [u8],
}

impl<'a, T: AsRef<[u8]> + ?Sized, A: Family> IcmpPacket<&'a T, A> {
    /// The echo fields of an echo message (its type not checked).
    #[inline]
    pub(crate) fn echo(&self) -> Echo<'a> {
        Echo {
            ident: self.echo_ident(),
            seq_no: self.echo_seq_no(),
            data: self.borrowed_data(),
        }
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>, A: Family> IcmpPacket<T, A> {
    /// Writes an echo message of type `ty` (code 0) with `e`'s fields; the checksum is the
    /// caller's.
    #[inline]
    pub(crate) fn set_echo(&mut self, ty: u8, e: &Echo<'_>) {
        self.set_msg_type(ty);
        self.set_code(0);
        self.set_echo_ident(e.ident);
        self.set_echo_seq_no(e.seq_no);
        self.data_mut()[..e.data.len()].copy_from_slice(e.data);
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>, A: Family> IcmpPacket<T, A> {
    /// Recomputes the checksum of the whole message, sent from `src` to `dst` (ICMPv6's covers
    /// the pseudo-header, ICMPv4's does not).
    #[inline]
    pub(crate) fn fill_checksum_between(&mut self, src: A, dst: A) {
        self.set_checksum(0);
        let len = self.as_bytes().len();
        let acc = if A::ICMP == IpProto::ICMPV6 {
            pseudo_header(src, dst, A::ICMP, u32::try_from(len).unwrap_or(u32::MAX)).sum()
        } else {
            0
        };
        let c = checksum::finish(checksum::sum(acc, self.as_bytes()));
        self.set_checksum(u16::from_be_bytes(c));
    }
}

/// The ICMPv4 messages tapyard parses and builds, as values borrowing their data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Icmpv4Repr<'a> {
    /// Echo request.
    EchoRequest(Echo<'a>),
    /// Echo reply.
    EchoReply(Echo<'a>),
    /// An error quoting (the start of) the datagram that caused it.
    Error {
        /// Type: one for which [`is_error`] holds.
        msg_type: u8,
        /// Code.
        code: u8,
        /// The second header word (next-hop MTU, gateway, pointer).
        rest: u32,
        /// The quoted datagram.
        data: &'a [u8],
    },
}

impl<'a> Icmpv4Repr<'a> {
    /// Reads a checked message: [`Error::Malformed`] for a bad checksum, a nonzero echo code,
    /// or a type that is neither echo nor error.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(p: &Icmpv4Packet<&'a T>) -> Result<Self, Error> {
        if !p.verify_checksum() {
            return Err(Error::Malformed);
        }
        let data = p.borrowed_data();
        match (p.msg_type(), p.code()) {
            (codes::ECHO_REQUEST, 0) => Ok(Icmpv4Repr::EchoRequest(p.echo())),
            (codes::ECHO_REPLY, 0) => Ok(Icmpv4Repr::EchoReply(p.echo())),
            (ty, code) if is_error(ty) => Ok(Icmpv4Repr::Error {
                msg_type: ty,
                code,
                rest: p.rest(),
                data,
            }),
            _ => Err(Error::Malformed),
        }
    }

    /// Length of the message.
    #[inline]
    pub fn buffer_len(&self) -> usize {
        match self {
            Icmpv4Repr::EchoRequest(Echo { data, .. })
            | Icmpv4Repr::EchoReply(Echo { data, .. })
            | Icmpv4Repr::Error { data, .. } => HEADER_LEN + data.len(),
        }
    }

    /// Writes the message and its checksum into a packet of [`Icmpv4Repr::buffer_len`] bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut Icmpv4Packet<T>) {
        match *self {
            Icmpv4Repr::EchoRequest(e) => p.set_echo(codes::ECHO_REQUEST, &e),
            Icmpv4Repr::EchoReply(e) => p.set_echo(codes::ECHO_REPLY, &e),
            Icmpv4Repr::Error {
                msg_type,
                code,
                rest,
                data,
            } => {
                p.set_msg_type(msg_type);
                p.set_code(code);
                p.set_rest(rest);
                p.data_mut()[..data.len()].copy_from_slice(data);
            }
        }
        p.fill_checksum();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn echo_request_bytes() {
        // Type 8, code 0, checksum, id 0x1234, seq 1, "hi".
        let b = [8, 0, 0x7d, 0x61, 0x12, 0x34, 0, 1, b'h', b'i'];
        let p = Icmpv4Packet::new_checked(&b[..]).unwrap();
        assert!(p.verify_checksum());
        assert_eq!(
            Icmpv4Repr::parse(&p),
            Ok(Icmpv4Repr::EchoRequest(Echo {
                ident: 0x1234,
                seq_no: 1,
                data: b"hi"
            }))
        );
        assert_eq!(Icmpv4Packet::new_checked(&b[..7]), Err(Error::Truncated));
    }

    fn repr() -> impl Strategy<Value = (u8, u8, u16, u16, u32, Vec<u8>)> {
        (
            0u8..3,
            any::<u8>(),
            any::<u16>(),
            any::<u16>(),
            any::<u32>(),
            proptest::collection::vec(any::<u8>(), 0..64),
        )
    }

    proptest! {
        #[test]
        fn round_trip((kind, code, ident, seq_no, rest, data) in repr()) {
            let r = match kind {
                0 => Icmpv4Repr::EchoRequest(Echo { ident, seq_no, data: &data }),
                1 => Icmpv4Repr::EchoReply(Echo { ident, seq_no, data: &data }),
                _ => Icmpv4Repr::Error { msg_type: codes::TIME_EXCEEDED, code, rest, data: &data },
            };
            let mut b = vec![0u8; r.buffer_len()];
            r.emit(&mut Icmpv4Packet::new_unchecked(&mut b[..]));
            prop_assert_eq!(Icmpv4Repr::parse(&Icmpv4Packet::new_checked(&b[..]).unwrap()), Ok(r));
            for n in 0..HEADER_LEN {
                prop_assert!(Icmpv4Packet::new_checked(&b[..n]).is_err());
            }
            for n in HEADER_LEN..b.len() {
                // A cut message parses or fails its checksum; never panics.
                let _ = Icmpv4Repr::parse(&Icmpv4Packet::new_checked(&b[..n]).unwrap());
            }
        }
    }
}
