//! ARP for IPv4 over Ethernet (RFC 826): the view [`ArpPacket`] and the packet as a value
//! ([`ArpRepr`]).

use std::net::Ipv4Addr;

use crate::wire::ethernet::{ethertype, EthernetFrame, EthernetRepr, HEADER_LEN as ETH_LEN};
use crate::wire::mac::MacAddr;
use crate::wire::Error;

mod field {
    use std::ops::Range;
    /// Hardware type, protocol type, their lengths: the Ethernet/IPv4 prefix.
    pub const PREFIX: Range<usize> = 0..6;
    pub const OPER: Range<usize> = 6..8;
    pub const SHA: Range<usize> = 8..14;
    pub const SPA: Range<usize> = 14..18;
    pub const THA: Range<usize> = 18..24;
    pub const TPA: Range<usize> = 24..28;
    pub const END: usize = 28;
}

/// Length of an ARP packet for IPv4 over Ethernet.
pub const PACKET_LEN: usize = field::END;
/// Operation: request.
pub const REQUEST: u16 = 1;
/// Operation: reply.
pub const REPLY: u16 = 2;
/// Hardware type Ethernet (1), protocol IPv4, 6-byte and 4-byte addresses.
const ETH_IPV4: [u8; 6] = [0, 1, 0x08, 0x00, 6, 4];

/// A view of an ARP packet. [`ArpPacket::new_checked`] checks there are 28 bytes and that
/// they are Ethernet/IPv4 ARP; after it no accessor panics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> ArpPacket<T> {
    /// Wraps a buffer without checking it: accessors panic if it is shorter than 28 bytes.
    #[inline]
    pub const fn new_unchecked(buffer: T) -> Self {
        ArpPacket { buffer }
    }

    /// Wraps a buffer of at least 28 bytes ([`Error::Truncated`]) of Ethernet/IPv4 ARP
    /// ([`Error::Malformed`] otherwise).
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self, Error> {
        let Some(b) = buffer.as_ref().first_chunk::<PACKET_LEN>() else {
            return Err(Error::Truncated);
        };
        if b[field::PREFIX] != ETH_IPV4 {
            return Err(Error::Malformed);
        }
        Ok(ArpPacket { buffer })
    }

    #[inline(always)]
    fn bytes(&self) -> &[u8; PACKET_LEN] {
        self.buffer
            .as_ref()
            .first_chunk()
            .expect("ARP packet checked by new_checked")
    }

    /// The operation (1 request, 2 reply).
    #[inline]
    pub fn operation(&self) -> u16 {
        let b = self.bytes();
        u16::from_be_bytes([b[field::OPER.start], b[field::OPER.start + 1]])
    }

    /// Sender hardware address.
    #[inline]
    pub fn sha(&self) -> MacAddr {
        MacAddr::from_slice(&self.bytes()[field::SHA])
    }

    /// Sender protocol address.
    #[inline]
    pub fn spa(&self) -> Ipv4Addr {
        let b = self.bytes();
        let s = field::SPA.start;
        Ipv4Addr::new(b[s], b[s + 1], b[s + 2], b[s + 3])
    }

    /// Target hardware address.
    #[inline]
    pub fn tha(&self) -> MacAddr {
        MacAddr::from_slice(&self.bytes()[field::THA])
    }

    /// Target protocol address.
    #[inline]
    pub fn tpa(&self) -> Ipv4Addr {
        let b = self.bytes();
        let s = field::TPA.start;
        Ipv4Addr::new(b[s], b[s + 1], b[s + 2], b[s + 3])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> ArpPacket<T> {
    #[inline(always)]
    fn bytes_mut(&mut self) -> &mut [u8; PACKET_LEN] {
        self.buffer
            .as_mut()
            .first_chunk_mut()
            .expect("ARP packet checked by new_checked")
    }

    /// Writes the Ethernet/IPv4 prefix (hardware and protocol types and lengths).
    #[inline]
    pub fn set_eth_ipv4(&mut self) {
        self.bytes_mut()[field::PREFIX].copy_from_slice(&ETH_IPV4);
    }

    /// Sets the operation.
    #[inline]
    pub fn set_operation(&mut self, v: u16) {
        self.bytes_mut()[field::OPER].copy_from_slice(&v.to_be_bytes());
    }

    /// Sets the sender hardware address.
    #[inline]
    pub fn set_sha(&mut self, a: MacAddr) {
        self.bytes_mut()[field::SHA].copy_from_slice(&a.0);
    }

    /// Sets the sender protocol address.
    #[inline]
    pub fn set_spa(&mut self, a: Ipv4Addr) {
        self.bytes_mut()[field::SPA].copy_from_slice(&a.octets());
    }

    /// Sets the target hardware address.
    #[inline]
    pub fn set_tha(&mut self, a: MacAddr) {
        self.bytes_mut()[field::THA].copy_from_slice(&a.0);
    }

    /// Sets the target protocol address.
    #[inline]
    pub fn set_tpa(&mut self, a: Ipv4Addr) {
        self.bytes_mut()[field::TPA].copy_from_slice(&a.octets());
    }
}

/// An ARP packet for IPv4 over Ethernet, as a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArpRepr {
    /// [`REQUEST`] or [`REPLY`] (other values are kept as they are).
    pub operation: u16,
    /// Sender hardware address.
    pub sha: MacAddr,
    /// Sender protocol address.
    pub spa: Ipv4Addr,
    /// Target hardware address.
    pub tha: MacAddr,
    /// Target protocol address.
    pub tpa: Ipv4Addr,
}

impl ArpRepr {
    /// Reads a checked packet.
    #[inline]
    pub fn parse<T: AsRef<[u8]>>(p: &ArpPacket<T>) -> Result<ArpRepr, Error> {
        Ok(ArpRepr {
            operation: p.operation(),
            sha: p.sha(),
            spa: p.spa(),
            tha: p.tha(),
            tpa: p.tpa(),
        })
    }

    /// Checks and reads the packet at the start of `l3`; `None` if it is not Ethernet/IPv4 ARP.
    #[inline]
    pub fn parse_bytes(l3: &[u8]) -> Option<ArpRepr> {
        ArpRepr::parse(&ArpPacket::new_checked(l3).ok()?).ok()
    }

    /// The packet length (28).
    #[inline]
    pub const fn buffer_len(&self) -> usize {
        PACKET_LEN
    }

    /// Writes the packet.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, p: &mut ArpPacket<T>) {
        p.set_eth_ipv4();
        p.set_operation(self.operation);
        p.set_sha(self.sha);
        p.set_spa(self.spa);
        p.set_tha(self.tha);
        p.set_tpa(self.tpa);
    }

    /// Writes an Ethernet frame carrying this packet from `src` to `dst` into `out`; returns its
    /// length (42), or `None` if `out` is too small.
    pub fn write_frame(&self, src: MacAddr, dst: MacAddr, out: &mut [u8]) -> Option<usize> {
        let f = out.get_mut(..ETH_LEN + PACKET_LEN)?;
        let mut eth = EthernetFrame::new_unchecked(f);
        EthernetRepr {
            src_addr: src,
            dst_addr: dst,
            ethertype: ethertype::ARP,
        }
        .emit(&mut eth);
        self.emit(&mut ArpPacket::new_unchecked(eth.payload_mut()));
        Some(ETH_LEN + PACKET_LEN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn request_bytes() {
        let b = [
            0, 1, 8, 0, 6, 4, 0, 1, 2, 0, 0, 0, 0, 1, 10, 0, 0, 1, 0, 0, 0, 0, 0, 0, 10, 0, 0, 2,
        ];
        let r = ArpRepr::parse(&ArpPacket::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!(r.operation, REQUEST);
        assert_eq!(r.sha, MacAddr([2, 0, 0, 0, 0, 1]));
        assert_eq!(
            (r.spa, r.tpa),
            (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2))
        );
        let mut ipv6 = b;
        ipv6[2] = 0x86;
        assert_eq!(ArpPacket::new_checked(&ipv6[..]), Err(Error::Malformed));
    }

    proptest! {
        #[test]
        fn round_trip(op in any::<u16>(), sha in any::<[u8; 6]>(), spa in any::<u32>(), tha in any::<[u8; 6]>(), tpa in any::<u32>()) {
            let r = ArpRepr { operation: op, sha: MacAddr(sha), spa: spa.into(), tha: MacAddr(tha), tpa: tpa.into() };
            let mut out = [0u8; 64];
            let n = r.write_frame(MacAddr(sha), MacAddr::BROADCAST, &mut out).unwrap();
            prop_assert_eq!(ArpRepr::parse_bytes(&out[ETH_LEN..n]), Some(r));
            for k in 0..PACKET_LEN {
                prop_assert!(ArpPacket::new_checked(&out[ETH_LEN..ETH_LEN + k]).is_err());
            }
            prop_assert!(r.write_frame(MacAddr(sha), MacAddr(tha), &mut out[..41]).is_none());
        }
    }
}
