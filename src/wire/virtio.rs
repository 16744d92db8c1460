//! The legacy `struct virtio_net_hdr` (10 bytes, guest-native byte order, i.e. little-endian
//! on x86) that an `IFF_VNET_HDR` TAP puts before every frame: the view [`VirtioNetHeader`]
//! and the value [`VirtioNetHdr`] (the offload state a [`crate::buf::PacketBuf`] carries).
//! What to do with it (checksum completion, segmentation) is [`crate::offload`]'s.

use crate::wire::Error;

mod field {
    use std::ops::Range;
    pub const FLAGS: usize = 0;
    pub const GSO_TYPE: usize = 1;
    pub const HDR_LEN: Range<usize> = 2..4;
    pub const GSO_SIZE: Range<usize> = 4..6;
    pub const CSUM_START: Range<usize> = 6..8;
    pub const CSUM_OFFSET: Range<usize> = 8..10;
    pub const END: usize = 10;
}

/// Size in bytes of the legacy `struct virtio_net_hdr` that prefixes frames.
pub const VNET_HDR_LEN: usize = field::END;

/// `flags` bit: the L4 checksum is partial and must be completed
/// (sum from `csum_start` to the end, stored at `csum_start + csum_offset`).
pub const VIRTIO_NET_HDR_F_NEEDS_CSUM: u8 = 1;
/// `flags` bit: the checksum has already been validated (receive side hint).
pub const VIRTIO_NET_HDR_F_DATA_VALID: u8 = 2;

/// `gso_type`: not a GSO frame.
pub const VIRTIO_NET_HDR_GSO_NONE: u8 = 0;
/// `gso_type`: TCP over IPv4 segmentation offload (TSO4).
pub const VIRTIO_NET_HDR_GSO_TCPV4: u8 = 1;
/// `gso_type`: UDP fragmentation offload (UFO); not supported by segmentation.
pub const VIRTIO_NET_HDR_GSO_UDP: u8 = 3;
/// `gso_type`: TCP over IPv6 segmentation offload (TSO6).
pub const VIRTIO_NET_HDR_GSO_TCPV6: u8 = 4;
/// `gso_type`: UDP segmentation offload (USO); not supported by segmentation.
pub const VIRTIO_NET_HDR_GSO_UDP_L4: u8 = 5;
/// `gso_type` flag bit: the TCP flow uses ECN (CWR goes on the first segment only).
pub const VIRTIO_NET_HDR_GSO_ECN: u8 = 0x80;
/// GSO type bit: the frame is a VXLAN-in-IPv4 super-frame (outer Ethernet + IPv4 + UDP +
/// VXLAN in front of the inner frame the other GSO bits describe; `csum_start` and `hdr_len`
/// count from the outer frame's start). Linux 6.17's `VIRTIO_NET_HDR_GSO_UDP_TUNNEL_IPV4`:
/// a TAP with UDP-tunnel GSO ([`VNET_HDR_TUNNEL_LEN`]-byte header) takes and gives such
/// frames whole; any other port gets them segmented with the outer headers replicated.
pub const VIRTIO_NET_HDR_GSO_UDP_TUNNEL_IPV4: u8 = 0x20;
/// GSO type bit: the frame is a VXLAN-in-IPv6 super-frame (outer Ethernet + IPv6 without
/// extension headers + UDP + VXLAN in front of the inner TCP/IPv4 or TCP/IPv6 frame the
/// other GSO bits describe), as [`VIRTIO_NET_HDR_GSO_UDP_TUNNEL_IPV4`] is over IPv4. Linux
/// 6.17's `VIRTIO_NET_HDR_GSO_UDP_TUNNEL_IPV6`: exactly one of the two bits is set, and the
/// kernel then wants `NEEDS_CSUM` with `csum_start` at the inner TCP header, and the tunnel
/// header's `outer_th_offset` ≥ 14 + 40 and `inner_nh_offset` ≥ `outer_th_offset` + 8
/// (`virtio_net_hdr_tnl_to_skb`).
pub const VIRTIO_NET_HDR_GSO_UDP_TUNNEL_IPV6: u8 = 0x40;
/// `flags` bit of a UDP-tunnel super-frame: the outer UDP checksum is partial (the
/// pseudo-header sum over the whole super-frame) and each segment gets its own
/// (Linux's `SKB_GSO_UDP_TUNNEL_CSUM`).
pub const VIRTIO_NET_HDR_F_UDP_TUNNEL_CSUM: u8 = 8;

/// Size of `struct virtio_net_hdr_v1_hash_tunnel`, the header of a TAP with UDP-tunnel GSO
/// (`TUNSETVNETHDRSZ` 24): the legacy 10 bytes, `num_buffers` and the hash report (zero
/// here), then the outer transport and inner network header offsets, little-endian.
pub const VNET_HDR_TUNNEL_LEN: usize = 24;
/// Where `outer_th_offset` (then `inner_nh_offset`) sits in the tunnel header.
const TUNNEL_OFFSETS: usize = 20;

/// A view of a virtio-net header. [`VirtioNetHeader::new_checked`] checks the 10 bytes are
/// there; after it no accessor panics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VirtioNetHeader<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> VirtioNetHeader<T> {
    /// Wraps a buffer without checking it: accessors panic if it is shorter than 10 bytes.
    #[inline]
    pub const fn new_unchecked(buffer: T) -> Self {
        VirtioNetHeader { buffer }
    }

    /// Wraps a buffer of at least 10 bytes.
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self, Error> {
        if buffer.as_ref().len() < VNET_HDR_LEN {
            return Err(Error::Truncated);
        }
        Ok(VirtioNetHeader { buffer })
    }

    #[inline(always)]
    fn bytes(&self) -> &[u8; VNET_HDR_LEN] {
        self.buffer
            .as_ref()
            .first_chunk()
            .expect("virtio-net header checked by new_checked")
    }

    #[inline(always)]
    fn ne16(&self, r: std::ops::Range<usize>) -> u16 {
        let b = self.bytes();
        u16::from_ne_bytes([b[r.start], b[r.start + 1]])
    }

    /// `VIRTIO_NET_HDR_F_*` bits.
    #[inline]
    pub fn flags(&self) -> u8 {
        self.bytes()[field::FLAGS]
    }

    /// `VIRTIO_NET_HDR_GSO_*` type.
    #[inline]
    pub fn gso_type(&self) -> u8 {
        self.bytes()[field::GSO_TYPE]
    }

    /// Claimed length of all headers.
    #[inline]
    pub fn hdr_len(&self) -> u16 {
        self.ne16(field::HDR_LEN)
    }

    /// Payload bytes per segment.
    #[inline]
    pub fn gso_size(&self) -> u16 {
        self.ne16(field::GSO_SIZE)
    }

    /// Where checksumming starts.
    #[inline]
    pub fn csum_start(&self) -> u16 {
        self.ne16(field::CSUM_START)
    }

    /// Offset of the checksum field from `csum_start`.
    #[inline]
    pub fn csum_offset(&self) -> u16 {
        self.ne16(field::CSUM_OFFSET)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> VirtioNetHeader<T> {
    #[inline(always)]
    fn bytes_mut(&mut self) -> &mut [u8; VNET_HDR_LEN] {
        self.buffer
            .as_mut()
            .first_chunk_mut()
            .expect("virtio-net header checked by new_checked")
    }

    /// Sets the flags.
    #[inline]
    pub fn set_flags(&mut self, v: u8) {
        self.bytes_mut()[field::FLAGS] = v;
    }

    /// Sets the GSO type.
    #[inline]
    pub fn set_gso_type(&mut self, v: u8) {
        self.bytes_mut()[field::GSO_TYPE] = v;
    }

    /// Sets the header length hint.
    #[inline]
    pub fn set_hdr_len(&mut self, v: u16) {
        self.bytes_mut()[field::HDR_LEN].copy_from_slice(&v.to_ne_bytes());
    }

    /// Sets the segment size.
    #[inline]
    pub fn set_gso_size(&mut self, v: u16) {
        self.bytes_mut()[field::GSO_SIZE].copy_from_slice(&v.to_ne_bytes());
    }

    /// Sets the checksum start.
    #[inline]
    pub fn set_csum_start(&mut self, v: u16) {
        self.bytes_mut()[field::CSUM_START].copy_from_slice(&v.to_ne_bytes());
    }

    /// Sets the checksum offset.
    #[inline]
    pub fn set_csum_offset(&mut self, v: u16) {
        self.bytes_mut()[field::CSUM_OFFSET].copy_from_slice(&v.to_ne_bytes());
    }
}

/// The legacy `struct virtio_net_hdr` as a value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct VirtioNetHdr {
    /// `VIRTIO_NET_HDR_F_*` bits.
    pub flags: u8,
    /// One of the `VIRTIO_NET_HDR_GSO_*` types, possibly with
    /// [`VIRTIO_NET_HDR_GSO_ECN`] or-ed in.
    pub gso_type: u8,
    /// Claimed length of all headers (a hint only; never trusted here).
    pub hdr_len: u16,
    /// Payload bytes per segment (the MSS) for GSO frames.
    pub gso_size: u16,
    /// Offset from the start of the frame where checksumming starts.
    pub csum_start: u16,
    /// Offset from `csum_start` of the 16-bit checksum field.
    pub csum_offset: u16,
}

impl VirtioNetHdr {
    /// No offload work pending: the frame is complete as it is.
    pub const NONE: VirtioNetHdr = VirtioNetHdr {
        flags: 0,
        gso_type: 0,
        hdr_len: 0,
        gso_size: 0,
        csum_start: 0,
        csum_offset: 0,
    };

    /// True when the frame needs no further work before going on the wire (no partial
    /// checksum, not a super-frame).
    #[inline]
    pub fn is_none(&self) -> bool {
        !self.needs_csum() && self.gso_type == VIRTIO_NET_HDR_GSO_NONE
    }

    /// Reads a header from the first [`VNET_HDR_LEN`] bytes of `bytes`
    /// (native byte order). Returns `None` if `bytes` is shorter than that.
    pub fn parse(bytes: &[u8]) -> Option<VirtioNetHdr> {
        let v = VirtioNetHeader::new_checked(bytes).ok()?;
        Some(VirtioNetHdr {
            flags: v.flags(),
            gso_type: v.gso_type(),
            hdr_len: v.hdr_len(),
            gso_size: v.gso_size(),
            csum_start: v.csum_start(),
            csum_offset: v.csum_offset(),
        })
    }

    /// The header length (10).
    #[inline]
    pub const fn buffer_len(&self) -> usize {
        VNET_HDR_LEN
    }

    /// Writes the header into `out` in native byte order (the inverse of
    /// [`VirtioNetHdr::parse`]).
    pub fn emit(&self, out: &mut [u8; VNET_HDR_LEN]) {
        let mut v = VirtioNetHeader::new_unchecked(&mut out[..]);
        v.set_flags(self.flags);
        v.set_gso_type(self.gso_type);
        v.set_hdr_len(self.hdr_len);
        v.set_gso_size(self.gso_size);
        v.set_csum_start(self.csum_start);
        v.set_csum_offset(self.csum_offset);
    }

    /// Writes the header as `struct virtio_net_hdr_v1_hash_tunnel` (a TAP with UDP-tunnel
    /// GSO): the legacy fields, zeros, then `outer_th` and `inner_nh` (where the outer UDP
    /// and the inner IP headers start) little-endian.
    pub fn emit_tunnel(&self, out: &mut [u8; VNET_HDR_TUNNEL_LEN], outer_th: u16, inner_nh: u16) {
        let (legacy, rest) = out.split_at_mut(VNET_HDR_LEN);
        if let Ok(legacy) = <&mut [u8; VNET_HDR_LEN]>::try_from(legacy) {
            self.emit(legacy);
        }
        rest.fill(0);
        let offs = TUNNEL_OFFSETS - VNET_HDR_LEN;
        rest[offs..offs + 2].copy_from_slice(&outer_th.to_le_bytes());
        rest[offs + 2..offs + 4].copy_from_slice(&inner_nh.to_le_bytes());
    }

    /// The `(outer_th_offset, inner_nh_offset)` of a tunnel header (see
    /// [`VirtioNetHdr::emit_tunnel`]); `None` if `bytes` is shorter than
    /// [`VNET_HDR_TUNNEL_LEN`].
    pub fn parse_tunnel_offsets(bytes: &[u8]) -> Option<(u16, u16)> {
        let b = bytes.get(TUNNEL_OFFSETS..VNET_HDR_TUNNEL_LEN)?;
        Some((
            u16::from_le_bytes([b[0], b[1]]),
            u16::from_le_bytes([b[2], b[3]]),
        ))
    }

    /// True for a UDP-tunnel super-frame ([`VIRTIO_NET_HDR_GSO_UDP_TUNNEL_IPV4`] or `_IPV6`).
    pub fn is_tunnel_gso(&self) -> bool {
        self.gso_type & (VIRTIO_NET_HDR_GSO_UDP_TUNNEL_IPV4 | VIRTIO_NET_HDR_GSO_UDP_TUNNEL_IPV6)
            != 0
    }

    /// True if [`VIRTIO_NET_HDR_F_NEEDS_CSUM`] is set.
    pub fn needs_csum(&self) -> bool {
        self.flags & VIRTIO_NET_HDR_F_NEEDS_CSUM != 0
    }

    /// True if the frame is a GSO super-frame (a GSO type other than
    /// [`VIRTIO_NET_HDR_GSO_NONE`], ignoring the ECN bit).
    pub fn is_gso(&self) -> bool {
        self.gso_type & !VIRTIO_NET_HDR_GSO_ECN != VIRTIO_NET_HDR_GSO_NONE
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trip(flags in any::<u8>(), gso_type in any::<u8>(), w in any::<[u16; 4]>()) {
            let h = VirtioNetHdr {
                flags, gso_type, hdr_len: w[0], gso_size: w[1], csum_start: w[2], csum_offset: w[3],
            };
            let mut b = [0u8; VNET_HDR_LEN];
            h.emit(&mut b);
            prop_assert_eq!(VirtioNetHdr::parse(&b), Some(h));
            for n in 0..VNET_HDR_LEN {
                prop_assert_eq!(VirtioNetHdr::parse(&b[..n]), None);
            }
            let mut t = [0xffu8; VNET_HDR_TUNNEL_LEN];
            h.emit_tunnel(&mut t, w[0], w[3]);
            prop_assert_eq!(VirtioNetHdr::parse(&t), Some(h));
            prop_assert_eq!(VirtioNetHdr::parse_tunnel_offsets(&t), Some((w[0], w[3])));
            prop_assert_eq!(&t[VNET_HDR_LEN..TUNNEL_OFFSETS], &[0u8; 10][..]);
            prop_assert_eq!(VirtioNetHdr::parse_tunnel_offsets(&t[..VNET_HDR_TUNNEL_LEN - 1]), None);
        }
    }
}
