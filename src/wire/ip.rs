//! The IP header view both families share: [`IpPacket`] reads and writes the fields IPv4 and
//! IPv6 have alike (version, TTL / hop limit, protocol / next header, addresses) once, at each
//! family's offsets; [`Ipv4Packet`](super::ipv4::Ipv4Packet) and
//! [`Ipv6Packet`](super::ipv6::Ipv6Packet) are its two instances, each with the accessors of
//! its own fields (IPv4's header length, identification, fragment field and checksum; IPv6's
//! payload length, traffic class and flow label) and its own checks in `new_checked`.

use std::marker::PhantomData;

use crate::wire::family::Family;

/// A view of an IP header of family `A` and the datagram it starts (see
/// [`Ipv4Packet`](super::ipv4::Ipv4Packet) and [`Ipv6Packet`](super::ipv6::Ipv6Packet) for
/// what their `new_checked` checks; after it no accessor panics).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpPacket<T: AsRef<[u8]>, A: Family> {
    pub(super) buffer: T,
    family: PhantomData<A>,
}

impl<T: AsRef<[u8]>, A: Family> IpPacket<T, A> {
    /// Wraps a buffer without checking it: accessors panic on a buffer shorter than the fixed
    /// header (20, 40 bytes), and the payload accessors on lengths that lie.
    #[inline]
    pub const fn new_unchecked(buffer: T) -> Self {
        IpPacket {
            buffer,
            family: PhantomData,
        }
    }

    /// The underlying buffer.
    #[inline]
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The version field (4, 6 for a checked view).
    #[inline]
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[0] >> 4
    }

    /// The time to live (IPv6: the hop limit).
    #[inline]
    pub fn ttl(&self) -> u8 {
        self.buffer.as_ref()[A::TTL_AT]
    }

    /// The protocol number (IPv6: the next header, an upper-layer protocol or the first
    /// extension header).
    #[inline]
    pub fn protocol(&self) -> u8 {
        self.buffer.as_ref()[A::PROTO_AT]
    }

    /// The source address.
    #[inline]
    pub fn src_addr(&self) -> A {
        A::read_addr(&self.buffer.as_ref()[A::SRC_AT..])
    }

    /// The destination address.
    #[inline]
    pub fn dst_addr(&self) -> A {
        A::read_addr(&self.buffer.as_ref()[A::DST_AT..])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>, A: Family> IpPacket<T, A> {
    /// Sets the TTL (IPv6: the hop limit); an IPv4 header checksum is the caller's.
    #[inline]
    pub fn set_ttl(&mut self, v: u8) {
        self.buffer.as_mut()[A::TTL_AT] = v;
    }

    /// Sets the protocol (IPv6: the next header).
    #[inline]
    pub fn set_protocol(&mut self, v: u8) {
        self.buffer.as_mut()[A::PROTO_AT] = v;
    }

    /// Sets the source address.
    #[inline]
    pub fn set_src_addr(&mut self, a: A) {
        a.write_addr(&mut self.buffer.as_mut()[A::SRC_AT..]);
    }

    /// Sets the destination address.
    #[inline]
    pub fn set_dst_addr(&mut self, a: A) {
        a.write_addr(&mut self.buffer.as_mut()[A::DST_AT..]);
    }
}
