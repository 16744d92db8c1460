//! Ethernet II frames and 802.1Q / 802.1ad (QinQ) tags.
//!
//! [`EthernetFrame`] is a view over the 14-byte header and what follows; [`VlanTag`] over one
//! 4-byte tag (TCI, then the next EtherType). [`EthernetFrame::l3`] walks at most two tags, as
//! the bridge and the offload code accept. [`EthernetRepr`] is the header as a value.

use crate::wire::mac::MacAddr;
use crate::wire::Error;

/// EtherType values tapyard reads (IEEE registry numbers).
pub mod ethertype {
    /// IPv4.
    pub const IPV4: u16 = 0x0800;
    /// ARP.
    pub const ARP: u16 = 0x0806;
    /// IPv6.
    pub const IPV6: u16 = 0x86dd;
    /// 802.1Q customer VLAN tag.
    pub const VLAN: u16 = 0x8100;
    /// 802.1ad service VLAN tag (QinQ outer tag).
    pub const QINQ: u16 = 0x88a8;
    /// The pre-standard QinQ outer tag.
    pub const QINQ_LEGACY: u16 = 0x9100;

    /// Whether an EtherType introduces a VLAN tag (802.1Q, 802.1ad, or 0x9100).
    #[inline]
    pub const fn is_vlan(t: u16) -> bool {
        matches!(t, VLAN | QINQ | QINQ_LEGACY)
    }
}

mod field {
    use std::ops::Range;
    pub const DST: Range<usize> = 0..6;
    pub const SRC: Range<usize> = 6..12;
    pub const ETHERTYPE: usize = 12;
    pub const HEADER_LEN: usize = 14;
    // Within a VLAN tag.
    pub const TCI: usize = 0;
    pub const TAG_ETHERTYPE: usize = 2;
    pub const TAG_LEN: usize = 4;
}

/// Length of an Ethernet II header.
pub const HEADER_LEN: usize = field::HEADER_LEN;
/// Length of one VLAN tag.
pub const VLAN_TAG_LEN: usize = field::TAG_LEN;

/// A view of an Ethernet II frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EthernetFrame<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> EthernetFrame<T> {
    /// Wraps a buffer without checking it: accessors panic if it is shorter than 14 bytes.
    #[inline]
    pub const fn new_unchecked(buffer: T) -> Self {
        EthernetFrame { buffer }
    }

    /// Wraps a buffer of at least 14 bytes.
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self, Error> {
        if buffer.as_ref().len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        Ok(EthernetFrame { buffer })
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
            .expect("Ethernet header checked by new_checked")
    }

    /// Destination MAC address.
    #[inline]
    pub fn dst_addr(&self) -> MacAddr {
        let h = self.header();
        MacAddr([h[0], h[1], h[2], h[3], h[4], h[5]])
    }

    /// Source MAC address.
    #[inline]
    pub fn src_addr(&self) -> MacAddr {
        let h = self.header();
        MacAddr([h[6], h[7], h[8], h[9], h[10], h[11]])
    }

    /// The EtherType field right after the addresses (a VLAN type if tagged).
    #[inline]
    pub fn ethertype(&self) -> u16 {
        let h = self.header();
        u16::from_be_bytes([h[field::ETHERTYPE], h[field::ETHERTYPE + 1]])
    }

    /// Both addresses as 48-bit words (`(dst, src)`, bytes in little-endian order, the FDB's
    /// key form), one 8-byte load each. The group bit is bit 0 of the destination word.
    #[inline]
    pub fn addr_words(&self) -> (u64, u64) {
        const MAC48: u64 = (1 << 48) - 1;
        let h = self.header();
        let (Some(d), Some(s)) = (h.first_chunk::<8>(), h.last_chunk::<8>()) else {
            unreachable!("a 14-byte header holds two 8-byte words")
        };
        (
            u64::from_le_bytes(*d) & MAC48,
            u64::from_le_bytes(*s) & MAC48,
        )
    }

    /// Everything after the 14-byte header.
    #[inline]
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }

    /// Walks up to two VLAN tags: the inner EtherType and the offset of the L3 header
    /// (14, 18 or 22). [`Error::Truncated`] if a tag is cut short.
    #[inline]
    pub fn l3(&self) -> Result<(u16, usize), Error> {
        let mut ty = self.ethertype();
        let mut at = HEADER_LEN;
        for _ in 0..2 {
            if !ethertype::is_vlan(ty) {
                break;
            }
            let tag = VlanTag::new_checked(self.buffer.as_ref().get(at..).unwrap_or(&[]))?;
            ty = tag.ethertype();
            at += VLAN_TAG_LEN;
        }
        Ok((ty, at))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> EthernetFrame<T> {
    #[inline(always)]
    fn header_mut(&mut self) -> &mut [u8; HEADER_LEN] {
        self.buffer
            .as_mut()
            .first_chunk_mut()
            .expect("Ethernet header checked by new_checked")
    }

    /// Sets the destination MAC address.
    #[inline]
    pub fn set_dst_addr(&mut self, a: MacAddr) {
        self.header_mut()[field::DST].copy_from_slice(&a.0);
    }

    /// Sets the source MAC address.
    #[inline]
    pub fn set_src_addr(&mut self, a: MacAddr) {
        self.header_mut()[field::SRC].copy_from_slice(&a.0);
    }

    /// Sets the EtherType after the addresses.
    #[inline]
    pub fn set_ethertype(&mut self, t: u16) {
        self.header_mut()[field::ETHERTYPE..field::ETHERTYPE + 2].copy_from_slice(&t.to_be_bytes());
    }

    /// Everything after the 14-byte header, mutable.
    #[inline]
    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[HEADER_LEN..]
    }
}

/// Copies `frame` into `out` with new addresses (the router's MAC rewrite of a frame it
/// forwards from a copy); the length, or `None` when `out` is too small or `frame` is not an
/// Ethernet frame.
pub fn copy_readdressed(out: &mut [u8], frame: &[u8], src: MacAddr, dst: MacAddr) -> Option<usize> {
    let d = out.get_mut(..frame.len())?;
    d.copy_from_slice(frame);
    let mut e = EthernetFrame::new_checked(d).ok()?;
    e.set_dst_addr(dst);
    e.set_src_addr(src);
    Some(frame.len())
}

/// A view of one 802.1Q / 802.1ad tag (the 4 bytes after a VLAN EtherType).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VlanTag<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> VlanTag<T> {
    /// Wraps a buffer without checking it: accessors panic if it is shorter than 4 bytes.
    #[inline]
    pub const fn new_unchecked(buffer: T) -> Self {
        VlanTag { buffer }
    }

    /// Wraps a buffer of at least 4 bytes.
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self, Error> {
        if buffer.as_ref().len() < VLAN_TAG_LEN {
            return Err(Error::Truncated);
        }
        Ok(VlanTag { buffer })
    }

    #[inline(always)]
    fn tag(&self) -> &[u8; VLAN_TAG_LEN] {
        self.buffer
            .as_ref()
            .first_chunk()
            .expect("tag checked by new_checked")
    }

    /// The tag control information (PCP, DEI, VLAN id).
    #[inline]
    pub fn tci(&self) -> u16 {
        let t = self.tag();
        u16::from_be_bytes([t[field::TCI], t[field::TCI + 1]])
    }

    /// The 12-bit VLAN id.
    #[inline]
    pub fn vid(&self) -> u16 {
        self.tci() & 0x0fff
    }

    /// The EtherType that follows the tag.
    #[inline]
    pub fn ethertype(&self) -> u16 {
        let t = self.tag();
        u16::from_be_bytes([t[field::TAG_ETHERTYPE], t[field::TAG_ETHERTYPE + 1]])
    }
}

/// An Ethernet II header as a value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EthernetRepr {
    /// Source MAC.
    pub src_addr: MacAddr,
    /// Destination MAC.
    pub dst_addr: MacAddr,
    /// EtherType.
    pub ethertype: u16,
}

impl EthernetRepr {
    /// Reads the header of a checked frame.
    #[inline]
    pub fn parse<T: AsRef<[u8]>>(frame: &EthernetFrame<T>) -> Result<EthernetRepr, Error> {
        Ok(EthernetRepr {
            src_addr: frame.src_addr(),
            dst_addr: frame.dst_addr(),
            ethertype: frame.ethertype(),
        })
    }

    /// The header length (14).
    #[inline]
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header.
    #[inline]
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, frame: &mut EthernetFrame<T>) {
        frame.set_dst_addr(self.dst_addr);
        frame.set_src_addr(self.src_addr);
        frame.set_ethertype(self.ethertype);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn bytes_read_and_qinq_walked() {
        let f = [
            2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1, 0x88, 0xa8, 0x00, 0x64, 0x81, 0x00, 0x20, 0xc8,
            0x08, 0x00, 0x45,
        ];
        let e = EthernetFrame::new_checked(&f[..]).unwrap();
        assert_eq!(e.dst_addr(), MacAddr([2, 0, 0, 0, 0, 2]));
        assert_eq!(e.src_addr(), MacAddr([2, 0, 0, 0, 0, 1]));
        assert_eq!(e.ethertype(), ethertype::QINQ);
        assert_eq!(e.l3(), Ok((ethertype::IPV4, 22)));
        assert_eq!(VlanTag::new_checked(&f[14..]).unwrap().vid(), 100);
        assert_eq!(VlanTag::new_checked(&f[18..]).unwrap().vid(), 200);
        // A tag cut short.
        let e = EthernetFrame::new_checked(&f[..20]).unwrap();
        assert_eq!(e.l3(), Err(Error::Truncated));
        assert_eq!(EthernetFrame::new_checked(&f[..13]), Err(Error::Truncated));
    }

    proptest! {
        #[test]
        fn round_trip(src in any::<[u8; 6]>(), dst in any::<[u8; 6]>(), ty in any::<u16>()) {
            let r = EthernetRepr { src_addr: MacAddr(src), dst_addr: MacAddr(dst), ethertype: ty };
            let mut b = [0u8; HEADER_LEN];
            r.emit(&mut EthernetFrame::new_unchecked(&mut b[..]));
            let f = EthernetFrame::new_checked(&b[..]).unwrap();
            prop_assert_eq!(EthernetRepr::parse(&f).unwrap(), r);
            for n in 0..HEADER_LEN {
                prop_assert!(EthernetFrame::new_checked(&b[..n]).is_err());
            }
        }
    }
}
