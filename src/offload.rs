//! Software completion of virtio-net offloads (checksum and TCP segmentation).
//!
//! A TAP device opened with `IFF_VNET_HDR` prefixes every frame with a legacy
//! `struct virtio_net_hdr` ([`VirtioNetHdr`]). After `TUNSETOFFLOAD` with
//! `TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6` the kernel may hand us frames whose
//! L4 checksum is only partially computed (`VIRTIO_NET_HDR_F_NEEDS_CSUM`) and
//! TCP "super-frames" of up to 64 KiB that must be cut into MSS-sized
//! segments. When such a frame leaves through a port that cannot take those
//! offloads, the work is finished here, in software, the way the kernel's
//! `skb_checksum_help` and `skb_gso_segment` would:
//!
//! * [`complete_checksum`] finishes a partial checksum in place;
//! * [`segment`] turns a frame (GSO or not) into wire-size, fully checksummed
//!   frames, handing each to a callback.
//!
//! All input is treated as untrusted: every length and offset is checked
//! against the frame, nothing panics, and failures are reported as
//! [`OffloadError`] values. Neither function allocates; [`segment`] builds its
//! output in a caller-provided scratch buffer.

use crate::narrow::{len16, len32, low16, low32};
use crate::wire::checksum::{self, PseudoHeader};
use crate::wire::ethernet::{ethertype, EthernetFrame};
use crate::wire::ipv4::{Ipv4Packet, PROTO_TCP};
use crate::wire::ipv6::{self, Ipv6Packet};
use crate::wire::tcp::{flags as tcp_flags, TcpPacket};
pub use crate::wire::virtio::{
    VirtioNetHdr, VIRTIO_NET_HDR_F_DATA_VALID, VIRTIO_NET_HDR_F_NEEDS_CSUM, VIRTIO_NET_HDR_GSO_ECN,
    VIRTIO_NET_HDR_GSO_NONE, VIRTIO_NET_HDR_GSO_TCPV4, VIRTIO_NET_HDR_GSO_TCPV6,
    VIRTIO_NET_HDR_GSO_UDP, VIRTIO_NET_HDR_GSO_UDP_L4, VIRTIO_NET_HDR_GSO_UDP_TUNNEL_IPV4,
    VIRTIO_NET_HDR_GSO_UDP_TUNNEL_IPV6, VNET_HDR_LEN,
};
use crate::wire::vxlan;
use crate::wire::Error as WireError;

/// Largest number of segments [`segment`] produces from one super-frame
/// (the kernel's `GSO_MAX_SEGS`).
///
/// IPv4 total length and IPv6 payload length are 16-bit, so a frame whose
/// lengths are consistent never needs more; the limit is a guard that keeps
/// the per-frame work bounded whatever the header says.
pub const MAX_GSO_SEGS: usize = 65_535;

/// Why a frame could not be completed or segmented.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OffloadError {
    /// The frame (or the IP packet, as bounded by its length field) ends
    /// before the end of a header it must contain: Ethernet, VLAN tag, IP
    /// header (with options) or TCP header (with options).
    Truncated,
    /// `NEEDS_CSUM` is set but the checksum field at `csum_start +
    /// csum_offset` (two bytes) does not lie inside the frame.
    BadCsumOffsets,
    /// `gso_type` is not one this module can segment (UFO, USO, unknown
    /// values, or the ECN bit without a type).
    UnsupportedGsoType,
    /// The EtherType (after at most two VLAN tags) is neither IPv4 nor IPv6.
    UnsupportedEtherType,
    /// `gso_type` names one IP version but the frame carries the other.
    GsoTypeMismatch,
    /// The IP header is malformed: wrong version nibble, or IPv4 IHL below 5.
    BadIpHeader,
    /// The IP length field (IPv4 total length, IPv6 payload length) is
    /// smaller than the IP header or claims more bytes than the frame holds.
    IpLengthMismatch,
    /// The IPv4 super-frame is a fragment (MF set or non-zero offset).
    Fragmented,
    /// The IPv6 header is followed by an extension header, which is not
    /// supported.
    UnsupportedIpv6Extension,
    /// The L4 protocol of a TCP GSO frame is not TCP.
    NotTcp,
    /// The TCP data offset is below 5 (20 bytes).
    BadTcpHeader,
    /// A GSO frame has `gso_size` 0.
    ZeroGsoSize,
    /// The scratch buffer cannot hold the largest output segment.
    ScratchTooSmall,
    /// Segmenting would produce more than [`MAX_GSO_SEGS`] segments.
    TooManySegments,
}

impl core::fmt::Display for OffloadError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let s = match self {
            OffloadError::Truncated => "frame truncated inside a header",
            OffloadError::BadCsumOffsets => "checksum start/offset outside the frame",
            OffloadError::UnsupportedGsoType => "unsupported GSO type",
            OffloadError::UnsupportedEtherType => "EtherType is neither IPv4 nor IPv6",
            OffloadError::GsoTypeMismatch => "GSO type does not match the IP version",
            OffloadError::BadIpHeader => "malformed IP header",
            OffloadError::IpLengthMismatch => "IP length field inconsistent with the frame",
            OffloadError::Fragmented => "IPv4 fragment cannot be segmented",
            OffloadError::UnsupportedIpv6Extension => "IPv6 extension headers not supported",
            OffloadError::NotTcp => "GSO frame is not TCP",
            OffloadError::BadTcpHeader => "TCP data offset below 5",
            OffloadError::ZeroGsoSize => "GSO frame with gso_size 0",
            OffloadError::ScratchTooSmall => "scratch buffer too small for a segment",
            OffloadError::TooManySegments => "too many segments",
        };
        f.write_str(s)
    }
}

impl std::error::Error for OffloadError {}

/// Where the headers of a TCP/IP frame are, as validated against the frame.
#[derive(Clone, Copy, Debug)]
struct TcpLayout {
    /// Offset of the IP header.
    l3_off: usize,
    /// IPv4 (true) or IPv6 (false).
    ipv4: bool,
    /// Offset of the TCP header (end of the IP header).
    l4_off: usize,
    /// Offset of the TCP payload (end of the TCP header with options).
    payload_off: usize,
    /// End of the IP packet according to its length field (≤ frame length).
    end: usize,
}

fn is_ipv6_extension(next: u8) -> bool {
    // Hop-by-hop, routing, fragment, ESP, AH, destination options,
    // mobility, HIP, shim6, experimental.
    matches!(
        next,
        0 | 43 | 44 | 50 | 51 | 60 | 135 | 139 | 140 | 253 | 254
    )
}

/// Parses Ethernet II, up to two VLAN tags, IPv4/IPv6 and the TCP header.
fn parse_tcp_frame(frame: &[u8]) -> Result<TcpLayout, OffloadError> {
    use OffloadError::*;

    let eth = EthernetFrame::new_checked(frame).map_err(|_| Truncated)?;
    let (ty, l3_off) = eth.l3().map_err(|_| Truncated)?;
    let l3 = frame.get(l3_off..).ok_or(Truncated)?;

    let (ipv4, ip_hdr_len, l3_len) = match ty {
        ethertype::IPV4 => {
            let ip = Ipv4Packet::new_checked(l3).map_err(|_| ipv4_error(l3))?;
            if ip.frag_field() & 0x3fff != 0 {
                return Err(Fragmented);
            }
            if ip.protocol() != PROTO_TCP {
                return Err(NotTcp);
            }
            (true, ip.header_len(), ip.total_len())
        }
        ethertype::IPV6 => {
            let ip = Ipv6Packet::new_checked(l3).map_err(|e| match e {
                // A header cut short, or a payload length past the frame.
                WireError::Truncated if l3.len() < ipv6::HEADER_LEN => Truncated,
                WireError::Truncated => IpLengthMismatch,
                WireError::Malformed => BadIpHeader,
            })?;
            match ip.protocol() {
                PROTO_TCP => {}
                n if is_ipv6_extension(n) => return Err(UnsupportedIpv6Extension),
                _ => return Err(NotTcp),
            }
            (false, ipv6::HEADER_LEN, ip.total_len())
        }
        _ => return Err(UnsupportedEtherType),
    };

    // L4, bounded by the IP length (trailing padding is not part of it).
    let tcp = l3.get(ip_hdr_len..l3_len).ok_or(Truncated)?;
    let tcp = TcpPacket::new_checked(tcp).map_err(|e| match e {
        WireError::Truncated => Truncated,
        WireError::Malformed => BadTcpHeader,
    })?;
    let l4_off = l3_off + ip_hdr_len;
    Ok(TcpLayout {
        l3_off,
        ipv4,
        l4_off,
        payload_off: l4_off + tcp.header_len(),
        end: l3_off + l3_len,
    })
}

/// The offload error for an IPv4 header the view refused, with the precedence the checks
/// have always had: truncation of the fixed header, then version/IHL, then lengths.
fn ipv4_error(l3: &[u8]) -> OffloadError {
    let Some(h) = l3.first_chunk::<20>() else {
        return OffloadError::Truncated;
    };
    let ihl = usize::from(h[0] & 0x0f) * 4;
    if h[0] >> 4 != 4 || ihl < 20 {
        OffloadError::BadIpHeader
    } else if ihl > l3.len() {
        OffloadError::Truncated
    } else {
        OffloadError::IpLengthMismatch
    }
}

// ---------------------------------------------------------------------------
// Public operations.
// ---------------------------------------------------------------------------

/// Offset of the checksum field if `hdr`'s checksum offsets fit in a frame of
/// `len` bytes.
fn csum_field(len: usize, hdr: &VirtioNetHdr) -> Result<usize, OffloadError> {
    let field = usize::from(hdr.csum_start) + usize::from(hdr.csum_offset);
    if field + 2 > len {
        return Err(OffloadError::BadCsumOffsets);
    }
    Ok(field)
}

/// Completes a partial checksum in place, as the kernel's
/// `skb_checksum_help` does.
///
/// If [`VIRTIO_NET_HDR_F_NEEDS_CSUM`] is set, the ones-complement sum of
/// `frame[csum_start..]` (which includes the pseudo-header sum the sender
/// left in the checksum field) is folded, complemented and stored in
/// network order at `csum_start + csum_offset`; a result of 0 is stored as
/// 0xffff. The frame is not parsed, so this works for TCP and UDP alike and
/// the sum runs to the end of `frame`: the caller passes the frame without
/// trailing padding. A no-op `Ok(())` if the flag is not set.
///
/// # Errors
/// [`OffloadError::BadCsumOffsets`] if the two-byte checksum field does not
/// lie inside `frame`; the frame is left untouched.
pub fn complete_checksum(frame: &mut [u8], hdr: &VirtioNetHdr) -> Result<(), OffloadError> {
    if !hdr.needs_csum() {
        return Ok(());
    }
    let field = csum_field(frame.len(), hdr)?;
    let start = usize::from(hdr.csum_start);
    let region = frame.get(start..).ok_or(OffloadError::BadCsumOffsets)?;
    let value = checksum::finish_l4(checksum::sum(0, region));
    frame
        .get_mut(field..field + 2)
        .ok_or(OffloadError::BadCsumOffsets)?
        .copy_from_slice(&value);
    Ok(())
}

/// Splits a GSO super-frame into wire-size frames, each fully checksummed,
/// and calls `emit` with each one in order (as the kernel's
/// `skb_gso_segment` followed by checksum completion would).
///
/// Supported GSO types are [`VIRTIO_NET_HDR_GSO_TCPV4`] and
/// [`VIRTIO_NET_HDR_GSO_TCPV6`] (optionally with
/// [`VIRTIO_NET_HDR_GSO_ECN`]); frames are Ethernet II with up to two VLAN
/// tags (0x8100, 0x88a8, 0x9100), IPv4 (options allowed) or IPv6 (no
/// extension headers), then TCP. Header lengths come from the frame itself
/// (IHL, TCP data offset), never from `hdr_len`, and `csum_start` /
/// `csum_offset` are not needed since every checksum is computed in full.
/// The IP length field bounds the packet: trailing bytes beyond it are
/// dropped.
///
/// Every segment carries a copy of all headers (IPv4 and TCP options
/// included) and at most `gso_size` payload bytes; the payloads concatenate
/// to the original. Per segment:
/// * IPv4: total length, identification (the super-frame's, plus the
///   segment index, wrapping) and header checksum are rewritten;
/// * IPv6: payload length is rewritten;
/// * TCP: the sequence number is advanced by the payload of earlier
///   segments; FIN and PSH are kept only on the last segment, CWR only on
///   the first; the checksum is computed over pseudo-header, header and
///   payload (as the kernel's `tcp_gso_segment`, a result of 0 is sent as
///   is: for TCP, 0 and 0xffff are equivalent).
///
/// A UDP-tunnel (VXLAN) super-frame, [`VIRTIO_NET_HDR_GSO_UDP_TUNNEL_IPV4`]
/// or [`VIRTIO_NET_HDR_GSO_UDP_TUNNEL_IPV6`] on top of the inner TCP type
/// (one of the two, never both), is the inner TCP/IPv4 or TCP/IPv6
/// super-frame behind the fixed outer headers tapyard's encapsulation
/// writes (Ethernet, IPv4 without options or IPv6 without extension
/// headers, UDP, VXLAN; checked, [`OffloadError::GsoTypeMismatch`]
/// otherwise), as Linux's `skb_udp_tunnel_segment`: every segment also
/// carries a copy of the outer headers, with the outer lengths rewritten
/// (IPv4: total length, identification = the super-frame's plus the segment
/// index, header checksum; IPv6: payload length) and the outer UDP length and
/// checksum computed (never zero: over IPv6 a zero UDP checksum is
/// forbidden); the outer lengths of the super-frame itself are not read.
///
/// If the payload is not larger than `gso_size`, exactly one segment is
/// produced (still with lengths and checksums recomputed).
///
/// Non-GSO frames ([`VIRTIO_NET_HDR_GSO_NONE`]) are emitted once and
/// unparsed: directly from `frame` if no checksum is pending, otherwise
/// copied to `scratch` and completed by [`complete_checksum`].
///
/// `scratch` must hold the largest output segment: the headers plus
/// `min(gso_size, payload length)` bytes for GSO frames, the whole frame for
/// non-GSO frames needing a checksum. Nothing is emitted when an error is
/// returned.
///
/// Returns the number of segments emitted.
///
/// # Errors
/// See [`OffloadError`]; every check is made before the first segment is
/// emitted.
pub fn segment(
    frame: &[u8],
    hdr: &VirtioNetHdr,
    scratch: &mut [u8],
    emit: &mut dyn FnMut(&[u8]),
) -> Result<usize, OffloadError> {
    let tunnel_bits = VIRTIO_NET_HDR_GSO_UDP_TUNNEL_IPV4 | VIRTIO_NET_HDR_GSO_UDP_TUNNEL_IPV6;
    let outer = match hdr.gso_type & tunnel_bits {
        0 => OuterKind::None,
        VIRTIO_NET_HDR_GSO_UDP_TUNNEL_IPV4 => OuterKind::V4,
        VIRTIO_NET_HDR_GSO_UDP_TUNNEL_IPV6 => OuterKind::V6,
        _ => return Err(OffloadError::UnsupportedGsoType),
    };
    let want_ipv4 = match hdr.gso_type & !(VIRTIO_NET_HDR_GSO_ECN | tunnel_bits) {
        VIRTIO_NET_HDR_GSO_NONE if hdr.gso_type == VIRTIO_NET_HDR_GSO_NONE => {
            return emit_whole(frame, hdr, scratch, emit);
        }
        VIRTIO_NET_HDR_GSO_TCPV4 => true,
        VIRTIO_NET_HDR_GSO_TCPV6 => false,
        _ => return Err(OffloadError::UnsupportedGsoType),
    };
    if hdr.gso_size == 0 {
        return Err(OffloadError::ZeroGsoSize);
    }
    let overhead = match outer {
        OuterKind::None => 0,
        OuterKind::V4 => vxlan::OVERHEAD,
        OuterKind::V6 => vxlan::overhead::<std::net::Ipv6Addr>(),
    };
    let layout = if overhead != 0 {
        // The inner frame after the outer headers; offsets stay the outer frame's.
        if !vxlan::is_outer(frame, outer == OuterKind::V6) {
            return Err(if frame.len() < overhead {
                OffloadError::Truncated
            } else {
                OffloadError::GsoTypeMismatch
            });
        }
        let inner = frame.get(overhead..).ok_or(OffloadError::Truncated)?;
        let l = parse_tcp_frame(inner)?;
        TcpLayout {
            l3_off: l.l3_off + overhead,
            l4_off: l.l4_off + overhead,
            payload_off: l.payload_off + overhead,
            end: l.end + overhead,
            ..l
        }
    } else {
        parse_tcp_frame(frame)?
    };
    if layout.ipv4 != want_ipv4 {
        return Err(OffloadError::GsoTypeMismatch);
    }
    segment_tcp(
        frame,
        &layout,
        usize::from(hdr.gso_size),
        scratch,
        emit,
        outer,
    )
}

/// The outer headers of a UDP-tunnel (VXLAN) super-frame, which every segment gets a copy of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum OuterKind {
    /// A plain TCP super-frame.
    None,
    /// VXLAN over IPv4 ([`VIRTIO_NET_HDR_GSO_UDP_TUNNEL_IPV4`], [`vxlan::OVERHEAD`] bytes).
    V4,
    /// VXLAN over IPv6 ([`VIRTIO_NET_HDR_GSO_UDP_TUNNEL_IPV6`], [`vxlan::overhead::<std::net::Ipv6Addr>()`] bytes).
    V6,
}

/// Non-GSO path of [`segment`].
fn emit_whole(
    frame: &[u8],
    hdr: &VirtioNetHdr,
    scratch: &mut [u8],
    emit: &mut dyn FnMut(&[u8]),
) -> Result<usize, OffloadError> {
    if !hdr.needs_csum() {
        emit(frame);
        return Ok(1);
    }
    csum_field(frame.len(), hdr)?;
    let out = scratch
        .get_mut(..frame.len())
        .ok_or(OffloadError::ScratchTooSmall)?;
    out.copy_from_slice(frame);
    complete_checksum(out, hdr)?;
    emit(out);
    Ok(1)
}

/// TCP segmentation proper, on a validated layout.
fn segment_tcp(
    frame: &[u8],
    l: &TcpLayout,
    mss: usize,
    scratch: &mut [u8],
    emit: &mut dyn FnMut(&[u8]),
    outer: OuterKind,
) -> Result<usize, OffloadError> {
    use OffloadError::*;

    let hdrs_len = l.payload_off;
    let headers = frame.get(..hdrs_len).ok_or(Truncated)?;
    let payload = frame.get(hdrs_len..l.end).ok_or(Truncated)?;
    let nsegs = payload.len().div_ceil(mss).max(1);
    if nsegs > MAX_GSO_SEGS {
        return Err(TooManySegments);
    }
    if scratch.len() < hdrs_len + payload.len().min(mss) {
        return Err(ScratchTooSmall);
    }

    let tcp_hdr_len = l.payload_off - l.l4_off;
    let seg0 = TcpPacket::new_unchecked(&frame[l.l4_off..l.payload_off]);
    let (seq0, flags0) = (seg0.seq_number(), seg0.flags());
    let ip0 = &frame[l.l3_off..l.l4_off];
    let (id0, addrs) = if l.ipv4 {
        let ip = Ipv4Packet::new_unchecked(ip0);
        let (src, dst) = ip.addr_bytes();
        (ip.ident(), (src, dst))
    } else {
        (0, ([0; 4], [0; 4]))
    };

    // The outer headers of a VXLAN super-frame: each segment gets its own identification.
    let outer_id0 = if outer == OuterKind::V4 {
        Ipv4Packet::new_checked_header(frame.get(vxlan::OUTER_L3..).ok_or(Truncated)?)
            .map_err(|_| Truncated)?
            .ident()
    } else {
        0
    };

    // The headers are copied once; every field that differs between
    // segments is rewritten below.
    scratch[..hdrs_len].copy_from_slice(headers);

    for (i, offset) in (0..nsegs).map(|i| (i, i * mss)) {
        let n = mss.min(payload.len() - offset);
        let chunk = &payload[offset..offset + n];
        let tcp_len = tcp_hdr_len + n;

        // IP header. Lengths are below the original 16-bit length field.
        let (before, seg) = scratch[..hdrs_len + n].split_at_mut(l.l4_off);
        let ip = &mut before[l.l3_off..];
        let pseudo = if l.ipv4 {
            let mut ip = Ipv4Packet::new_unchecked(ip);
            ip.set_total_len(len16(ip.header_len() + tcp_len));
            ip.set_ident(id0.wrapping_add(low16(i as u64)));
            ip.fill_checksum();
            PseudoHeader::Ipv4 {
                src: addrs.0,
                dst: addrs.1,
                proto: PROTO_TCP,
                len: len16(tcp_len),
            }
        } else {
            let mut ip = Ipv6Packet::new_unchecked(ip);
            ip.set_payload_len(len16(tcp_len));
            PseudoHeader::Ipv6 {
                src: ip.src_addr().octets(),
                dst: ip.dst_addr().octets(),
                next_header: PROTO_TCP,
                len: len32(tcp_len),
            }
        };

        // TCP header, payload and checksum.
        let mut tcp = TcpPacket::new_unchecked(seg);
        tcp.set_seq_number(seq0.wrapping_add(low32(offset as u64)));
        let mut flags = flags0;
        if i + 1 != nsegs {
            flags &= !(tcp_flags::FIN | tcp_flags::PSH);
        }
        if i != 0 {
            flags &= !tcp_flags::CWR;
        }
        tcp.set_flags(flags);
        tcp.payload_mut().copy_from_slice(chunk);
        tcp.fill_checksum_with(&pseudo);
        // Outer lengths (over IPv4 also the identification and the header checksum) and
        // the outer UDP checksum, from the headers: the inner TCP checksum was just made
        // complete. Over IPv6 it is never zero (`finish_l4` sends 0 as 0xffff).
        let f = &mut scratch[..hdrs_len + n];
        match outer {
            OuterKind::None => Some(()),
            OuterKind::V4 => vxlan::fix_outer_lengths(f, outer_id0.wrapping_add(low16(i as u64)))
                .and_then(|()| vxlan::fill_csum_over_tcp(f, l.l3_off, l.l4_off)),
            OuterKind::V6 => vxlan::fix_outer6_lengths(f)
                .and_then(|()| vxlan::fill_csum_over_tcp(f, l.l3_off, l.l4_off)),
        }
        .ok_or(Truncated)?;

        emit(&scratch[..hdrs_len + n]);
    }
    Ok(nsegs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use etherparse::{
        IpHeaders, IpNumber, Ipv4Header, Ipv6Header, LinkExtSlice, NetSlice, PacketBuilder,
        PacketBuilderStep, SlicedPacket, TcpHeader, TcpOptionElement, TransportSlice, VlanId,
    };
    use proptest::prelude::*;

    // -- independent reference arithmetic (plain big-endian words) ---------

    fn ref_sum(data: &[u8]) -> u32 {
        let mut s: u32 = 0;
        let mut i = 0;
        while i < data.len() {
            let hi = u32::from(data[i]) << 8;
            let lo = data.get(i + 1).map_or(0, |&b| u32::from(b));
            s += hi | lo;
            s = (s & 0xffff) + (s >> 16);
            i += 2;
        }
        s
    }

    fn ref_fold(mut s: u32) -> u16 {
        while s >> 16 != 0 {
            s = (s & 0xffff) + (s >> 16);
        }
        u16::try_from(s).unwrap()
    }

    /// Big-endian pseudo-header sum (not complemented) for TCP/UDP.
    fn ref_pseudo(src: &[u8], dst: &[u8], proto: u8, len: usize) -> u16 {
        let mut p = Vec::new();
        p.extend_from_slice(src);
        p.extend_from_slice(dst);
        p.extend_from_slice(&[0, proto]);
        p.extend_from_slice(&u16::try_from(len).unwrap().to_be_bytes());
        ref_fold(ref_sum(&p))
    }

    /// Deterministic pseudo-random bytes.
    fn fill(seed: u64, len: usize) -> Vec<u8> {
        let mut x = seed | 1;
        (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                crate::narrow::low8(x >> 24)
            })
            .collect()
    }

    // -- super-frame construction ------------------------------------------

    const MAC_A: [u8; 6] = [0x02, 0, 0, 0, 0, 1];
    const MAC_B: [u8; 6] = [0x02, 0, 0, 0, 0, 2];
    /// The inner packets' (source, destination) addresses of each family.
    const IPV4: ([u8; 4], [u8; 4]) = ([10, 1, 2, 3], [192, 168, 200, 17]);
    const IPV6: ([u8; 16], [u8; 16]) = (
        [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xab, 0xcd],
        [0xfd, 0, 0, 1, 0, 0, 0, 0, 0xfe, 0xdc, 0, 0, 0, 0, 0, 0x01],
    );
    /// Four NOPs, then Router Alert.
    const IP_OPTS: [u8; 8] = [1, 1, 1, 1, 0x94, 0x04, 0, 0];

    #[derive(Clone, Copy, Debug, Default)]
    struct Spec {
        v6: bool,
        vlans: u8,
        ip_opts: bool,
        tcp_opts: bool,
        fin: bool,
        psh: bool,
        cwr: bool,
        ece: bool,
        seq: u32,
        ip_id: u16,
    }

    impl Spec {
        fn l3_off(&self) -> usize {
            14 + 4 * usize::from(self.vlans)
        }
        fn l4_off(&self) -> usize {
            self.l3_off()
                + if self.v6 {
                    40
                } else if self.ip_opts {
                    28
                } else {
                    20
                }
        }
        fn gso_type(&self) -> u8 {
            let t = if self.v6 {
                VIRTIO_NET_HDR_GSO_TCPV6
            } else {
                VIRTIO_NET_HDR_GSO_TCPV4
            };
            if self.cwr || self.ece {
                t | VIRTIO_NET_HDR_GSO_ECN
            } else {
                t
            }
        }
    }

    fn tcp_builder(
        spec: &Spec,
        ip_id: u16,
        seq: u32,
        fin: bool,
        psh: bool,
        cwr: bool,
    ) -> PacketBuilderStep<TcpHeader> {
        let ip = if spec.v6 {
            IpHeaders::Ipv6(
                Ipv6Header {
                    next_header: IpNumber::TCP,
                    hop_limit: 64,
                    source: IPV6.0,
                    destination: IPV6.1,
                    ..Default::default()
                },
                Default::default(),
            )
        } else {
            let mut h = Ipv4Header::new(0, 64, IpNumber::TCP, IPV4.0, IPV4.1).unwrap();
            h.identification = ip_id;
            h.dont_fragment = true;
            if spec.ip_opts {
                h.options = IP_OPTS[..].try_into().unwrap();
            }
            IpHeaders::Ipv4(h, Default::default())
        };
        let eth = PacketBuilder::ethernet2(MAC_A, MAC_B);
        let step = match spec.vlans {
            0 => eth.ip(ip),
            1 => eth.single_vlan(VlanId::try_new(100).unwrap()).ip(ip),
            _ => eth
                .double_vlan(VlanId::try_new(100).unwrap(), VlanId::try_new(200).unwrap())
                .ip(ip),
        };
        let mut t = step.tcp(40000, 443, seq, 1024).ack(0x1111_2222);
        if spec.ece {
            t = t.ece();
        }
        if fin {
            t = t.fin();
        }
        if psh {
            t = t.psh();
        }
        if cwr {
            t = t.cwr();
        }
        if spec.tcp_opts {
            t = t
                .options(&[
                    TcpOptionElement::MaximumSegmentSize(1460),
                    TcpOptionElement::Noop,
                    TcpOptionElement::WindowScale(7),
                    TcpOptionElement::Timestamp(0xdead_beef, 0x0102_0304),
                ])
                .unwrap();
        }
        t
    }

    /// A super-frame as the kernel hands it over: TCP checksum field holding
    /// the pseudo-header sum, NEEDS_CSUM, and the given gso_size.
    fn super_frame(spec: &Spec, payload: &[u8], gso_size: u16) -> (Vec<u8>, VirtioNetHdr) {
        let mut frame = Vec::new();
        tcp_builder(spec, spec.ip_id, spec.seq, spec.fin, spec.psh, spec.cwr)
            .write(&mut frame, payload)
            .unwrap();
        let l4 = spec.l4_off();
        let tcp_len = frame.len() - l4;
        let partial = if spec.v6 {
            ref_pseudo(&IPV6.0, &IPV6.1, 6, tcp_len)
        } else {
            ref_pseudo(&IPV4.0, &IPV4.1, 6, tcp_len)
        };
        frame[l4 + 16..l4 + 18].copy_from_slice(&partial.to_be_bytes());
        let tcp_hdr_len = usize::from(frame[l4 + 12] >> 4) * 4;
        let hdr = VirtioNetHdr {
            flags: VIRTIO_NET_HDR_F_NEEDS_CSUM,
            gso_type: spec.gso_type(),
            hdr_len: u16::try_from(l4 + tcp_hdr_len).unwrap(),
            gso_size,
            csum_start: u16::try_from(l4).unwrap(),
            csum_offset: 16,
        };
        (frame, hdr)
    }

    /// The segments the kernel would produce, built independently.
    fn expected_segments(spec: &Spec, payload: &[u8], gso: usize) -> Vec<Vec<u8>> {
        let chunks: Vec<&[u8]> = if payload.is_empty() {
            vec![&[][..]]
        } else {
            payload.chunks(gso).collect()
        };
        let n = chunks.len();
        chunks
            .iter()
            .enumerate()
            .map(|(i, chunk)| {
                let (first, last) = (i == 0, i + 1 == n);
                let b = tcp_builder(
                    spec,
                    spec.ip_id.wrapping_add(low16(i as u64)),
                    spec.seq.wrapping_add(low32((i * gso) as u64)),
                    spec.fin && last,
                    spec.psh && last,
                    spec.cwr && first,
                );
                let mut v = Vec::new();
                b.write(&mut v, chunk).unwrap();
                v
            })
            .collect()
    }

    fn run_segment(
        frame: &[u8],
        hdr: &VirtioNetHdr,
        scratch_len: usize,
    ) -> Result<Vec<Vec<u8>>, OffloadError> {
        let mut scratch = vec![0u8; scratch_len];
        let mut out = Vec::new();
        let n = segment(frame, hdr, &mut scratch, &mut |s| out.push(s.to_vec()))?;
        assert_eq!(n, out.len());
        Ok(out)
    }

    fn vlan_ids(p: &SlicedPacket<'_>) -> Vec<u16> {
        p.link_exts
            .iter()
            .filter_map(|e| match e {
                LinkExtSlice::Vlan(v) => Some(v.vlan_identifier().value()),
                _ => None,
            })
            .collect()
    }

    /// Checks the segmentation invariants with etherparse (and the reference
    /// sum) against the original super-frame.
    fn verify_segments(orig: &[u8], segs: &[Vec<u8>], gso: usize) {
        let o = SlicedPacket::from_ethernet(orig).expect("original parses");
        let Some(TransportSlice::Tcp(ot)) = &o.transport else {
            panic!("original not TCP")
        };
        let opayload = ot.payload();
        let hdrs_len = opayload.as_ptr() as usize - orig.as_ptr() as usize;
        let oid = match &o.net {
            Some(NetSlice::Ipv4(s)) => Some(s.header().identification()),
            _ => None,
        };
        let expect_n = opayload.len().div_ceil(gso).max(1);
        assert_eq!(segs.len(), expect_n, "segment count");

        let mut joined = Vec::new();
        for (i, seg) in segs.iter().enumerate() {
            let (first, last) = (i == 0, i + 1 == segs.len());
            let p = SlicedPacket::from_ethernet(seg).expect("segment parses");
            assert_eq!(vlan_ids(&p), vlan_ids(&o));
            let Some(TransportSlice::Tcp(t)) = &p.transport else {
                panic!("segment not TCP")
            };
            let tcp_bytes = t.slice();
            let pseudo = match &p.net {
                Some(NetSlice::Ipv4(s)) => {
                    let h = s.header();
                    assert_eq!(h.header_checksum(), h.to_header().calc_header_checksum());
                    assert_eq!(ref_fold(ref_sum(h.slice())), 0xffff, "IPv4 header sum");
                    assert_eq!(
                        Some(h.identification()),
                        oid.map(|id| id.wrapping_add(low16(i as u64)))
                    );
                    let Some(NetSlice::Ipv4(os)) = &o.net else {
                        panic!("IP version changed")
                    };
                    assert_eq!(h.options(), os.header().options());
                    assert_eq!(h.dont_fragment(), os.header().dont_fragment());
                    assert_eq!(
                        t.checksum(),
                        t.calc_checksum_ipv4(h.source(), h.destination()).unwrap()
                    );
                    ref_pseudo(&h.source(), &h.destination(), 6, tcp_bytes.len())
                }
                Some(NetSlice::Ipv6(s)) => {
                    let h = s.header();
                    assert_eq!(usize::from(h.payload_length()), tcp_bytes.len());
                    assert_eq!(
                        t.checksum(),
                        t.calc_checksum_ipv6(h.source(), h.destination()).unwrap()
                    );
                    ref_pseudo(&h.source(), &h.destination(), 6, tcp_bytes.len())
                }
                _ => panic!("segment not IP"),
            };
            // Independent verification: pseudo + segment sums to 0xffff.
            assert_eq!(
                ref_fold(ref_sum(tcp_bytes) + u32::from(pseudo)),
                0xffff,
                "TCP sum"
            );
            // Every byte of the segment is accounted for by headers + payload.
            assert_eq!(seg.len(), hdrs_len + t.payload().len());
            assert!(t.payload().len() <= gso);
            if !last {
                assert_eq!(t.payload().len(), gso);
            }
            assert_eq!(
                t.sequence_number(),
                ot.sequence_number()
                    .wrapping_add(low32(joined.len() as u64))
            );
            assert_eq!(t.fin(), ot.fin() && last, "FIN");
            assert_eq!(t.psh(), ot.psh() && last, "PSH");
            assert_eq!(t.cwr(), ot.cwr() && first, "CWR");
            assert_eq!(
                (t.ece(), t.syn(), t.ack(), t.rst(), t.urg()),
                (ot.ece(), ot.syn(), ot.ack(), ot.rst(), ot.urg())
            );
            assert_eq!(t.acknowledgment_number(), ot.acknowledgment_number());
            assert_eq!(t.options(), ot.options());
            assert_eq!(seg[..hdrs_len.min(14)], orig[..hdrs_len.min(14)]);
            joined.extend_from_slice(t.payload());
        }
        assert_eq!(joined, opayload, "payloads concatenate to the original");
    }

    /// Segments a super-frame built from `spec` and checks it every way.
    fn check_spec(spec: &Spec, payload: &[u8], gso: u16) -> Vec<Vec<u8>> {
        let (frame, hdr) = super_frame(spec, payload, gso);
        let hdrs = usize::from(hdr.hdr_len);
        let segs = run_segment(&frame, &hdr, hdrs + usize::from(gso)).unwrap();
        for s in &segs {
            assert!(s.len() <= hdrs + usize::from(gso));
        }
        verify_segments(&frame, &segs, usize::from(gso));
        assert_eq!(segs, expected_segments(spec, payload, usize::from(gso)));
        segs
    }

    // -- header ------------------------------------------------------------

    #[test]
    fn header_round_trip() {
        let h = VirtioNetHdr {
            flags: VIRTIO_NET_HDR_F_NEEDS_CSUM,
            gso_type: VIRTIO_NET_HDR_GSO_TCPV4 | VIRTIO_NET_HDR_GSO_ECN,
            hdr_len: 0x0042,
            gso_size: 1448,
            csum_start: 34,
            csum_offset: 16,
        };
        let mut b = [0u8; VNET_HDR_LEN];
        h.emit(&mut b);
        assert_eq!(VirtioNetHdr::parse(&b), Some(h));
        assert!(h.needs_csum() && h.is_gso());
        #[cfg(target_endian = "little")]
        assert_eq!(
            b,
            [0x01, 0x81, 0x42, 0x00, 0xa8, 0x05, 0x22, 0x00, 0x10, 0x00]
        );

        // Longer input: only the first 10 bytes are read.
        let mut long = b.to_vec();
        long.extend_from_slice(&[0xee; 4]);
        assert_eq!(VirtioNetHdr::parse(&long), Some(h));
        assert_eq!(VirtioNetHdr::parse(&b[..9]), None);
        assert_eq!(VirtioNetHdr::parse(&[]), None);

        #[cfg(target_endian = "little")]
        {
            let p = VirtioNetHdr::parse(&[2, 4, 0x36, 0, 0xa0, 0x05, 0x36, 0, 0x10, 0]).unwrap();
            assert_eq!(
                p,
                VirtioNetHdr {
                    flags: VIRTIO_NET_HDR_F_DATA_VALID,
                    gso_type: VIRTIO_NET_HDR_GSO_TCPV6,
                    hdr_len: 54,
                    gso_size: 1440,
                    csum_start: 54,
                    csum_offset: 16,
                }
            );
            assert!(!p.needs_csum() && p.is_gso());
        }
        let ecn_only = VirtioNetHdr {
            gso_type: VIRTIO_NET_HDR_GSO_ECN,
            ..Default::default()
        };
        assert!(!ecn_only.is_gso());
        assert!(!VirtioNetHdr::default().is_gso());
        assert!(!VirtioNetHdr::default().needs_csum());
    }

    // -- checksum completion -------------------------------------------------

    /// Ethernet + IPv4 + TCP (PSH|ACK) + "hello, tapyard!" (odd length), the
    /// TCP checksum field holding the pseudo-header sum 0x142c.
    const KNOWN_FRAME: [u8; 69] = [
        0x02, 0x00, 0x00, 0x00, 0x00, 0x02, 0x02, 0x00, 0x00, 0x00, 0x00, 0x01, 0x08, 0x00, 0x45,
        0x00, 0x00, 0x37, 0x12, 0x34, 0x40, 0x00, 0x40, 0x06, 0x14, 0x8b, 0x0a, 0x00, 0x00, 0x01,
        0x0a, 0x00, 0x00, 0x02, 0x9c, 0x40, 0x00, 0x50, 0x01, 0x02, 0x03, 0x04, 0x0a, 0x0b, 0x0c,
        0x0d, 0x50, 0x18, 0xff, 0xff, 0x14, 0x2c, 0x00, 0x00, 0x68, 0x65, 0x6c, 0x6c, 0x6f, 0x2c,
        0x20, 0x74, 0x61, 0x70, 0x79, 0x61, 0x72, 0x64, 0x21,
    ];

    #[test]
    fn known_frame_checksum_completed() {
        let hdr = VirtioNetHdr {
            flags: VIRTIO_NET_HDR_F_NEEDS_CSUM,
            csum_start: 34,
            csum_offset: 16,
            ..Default::default()
        };
        let mut f = KNOWN_FRAME;
        complete_checksum(&mut f, &hdr).unwrap();
        assert_eq!(&f[50..52], &[0x12, 0x64]); // computed offline
        let (ip, rest) = Ipv4Header::from_slice(&f[14..]).unwrap();
        let (tcp, payload) = TcpHeader::from_slice(rest).unwrap();
        assert_eq!(payload, b"hello, tapyard!");
        assert_eq!(tcp.checksum, tcp.calc_checksum_ipv4(&ip, payload).unwrap());
        // Nothing else changed.
        assert_eq!(f[..50], KNOWN_FRAME[..50]);
        assert_eq!(f[52..], KNOWN_FRAME[52..]);

        // Without NEEDS_CSUM: untouched.
        let mut g = KNOWN_FRAME;
        complete_checksum(&mut g, &VirtioNetHdr::default()).unwrap();
        assert_eq!(g, KNOWN_FRAME);

        // Through `segment` (non-GSO): one frame, completed, in scratch.
        let mut scratch = [0u8; 128];
        let mut out = Vec::new();
        let n = segment(&KNOWN_FRAME, &hdr, &mut scratch, &mut |s| {
            out.push(s.to_vec())
        });
        assert_eq!(n, Ok(1));
        assert_eq!(out, vec![f.to_vec()]);
        let n = segment(
            &KNOWN_FRAME,
            &hdr,
            &mut scratch[..68],
            &mut |_| unreachable!(),
        );
        assert_eq!(n, Err(OffloadError::ScratchTooSmall));
    }

    fn udp_frame(v6: bool, payload: &[u8]) -> (Vec<u8>, VirtioNetHdr) {
        let b = PacketBuilder::ethernet2(MAC_A, MAC_B);
        let b = if v6 {
            b.ipv6(IPV6.0, IPV6.1, 64)
        } else {
            b.ipv4(IPV4.0, IPV4.1, 64)
        };
        let mut f = Vec::new();
        b.udp(5353, 53).write(&mut f, payload).unwrap();
        let l4 = if v6 { 54 } else { 34 };
        let partial = if v6 {
            ref_pseudo(&IPV6.0, &IPV6.1, 17, f.len() - l4)
        } else {
            ref_pseudo(&IPV4.0, &IPV4.1, 17, f.len() - l4)
        };
        f[l4 + 6..l4 + 8].copy_from_slice(&partial.to_be_bytes());
        let hdr = VirtioNetHdr {
            flags: VIRTIO_NET_HDR_F_NEEDS_CSUM,
            csum_start: u16::try_from(l4).unwrap(),
            csum_offset: 6,
            ..Default::default()
        };
        (f, hdr)
    }

    #[test]
    fn udp_checksum_completed_and_zero_is_mangled() {
        for v6 in [false, true] {
            let (mut f, hdr) = udp_frame(v6, b"some dns query\x01");
            let expect = {
                let p = SlicedPacket::from_ethernet(&f).unwrap();
                let Some(TransportSlice::Udp(u)) = p.transport else {
                    panic!()
                };
                let h = u.to_header();
                if v6 {
                    h.calc_checksum_ipv6_raw(IPV6.0, IPV6.1, u.payload())
                        .unwrap()
                } else {
                    h.calc_checksum_ipv4_raw(IPV4.0, IPV4.1, u.payload())
                        .unwrap()
                }
            };
            complete_checksum(&mut f, &hdr).unwrap();
            let l4 = usize::from(hdr.csum_start);
            assert_eq!(u16::from_be_bytes([f[l4 + 6], f[l4 + 7]]), expect);

            // Choose the last payload word so that the checksum is exactly 0:
            // it must go out as 0xffff.
            let (mut f, hdr) = udp_frame(v6, &[7, 7, 7, 7, 0, 0]);
            let mut probe = f.clone();
            complete_checksum(&mut probe, &hdr).unwrap();
            let c = [probe[l4 + 6], probe[l4 + 7]];
            let len = f.len();
            f[len - 2..].copy_from_slice(&c);
            complete_checksum(&mut f, &hdr).unwrap();
            assert_eq!(&f[l4 + 6..l4 + 8], &[0xff, 0xff]);
            // Still verifies: pseudo-header + segment sums to 0xffff.
            let (src, dst): (&[u8], &[u8]) = if v6 {
                (&IPV6.0, &IPV6.1)
            } else {
                (&IPV4.0, &IPV4.1)
            };
            let pseudo = ref_pseudo(src, dst, 17, f.len() - l4);
            assert_eq!(ref_fold(ref_sum(&f[l4..]) + u32::from(pseudo)), 0xffff);
        }
    }

    #[test]
    fn checksum_offsets_are_checked() {
        let mut f = KNOWN_FRAME;
        for (start, off) in [
            (68, 0),
            (67, 1),
            (0, 68),
            (69, 0),
            (u16::MAX, u16::MAX),
            (34, 35),
        ] {
            let hdr = VirtioNetHdr {
                flags: VIRTIO_NET_HDR_F_NEEDS_CSUM,
                csum_start: start,
                csum_offset: off,
                ..Default::default()
            };
            assert_eq!(
                complete_checksum(&mut f, &hdr),
                Err(OffloadError::BadCsumOffsets)
            );
            assert_eq!(f, KNOWN_FRAME);
            let r = segment(&f, &hdr, &mut [0u8; 100], &mut |_| unreachable!());
            assert_eq!(r, Err(OffloadError::BadCsumOffsets));
        }
        // Field is the last two bytes: accepted.
        let hdr = VirtioNetHdr {
            flags: VIRTIO_NET_HDR_F_NEEDS_CSUM,
            csum_start: 59,
            csum_offset: 8,
            ..Default::default()
        };
        let old = u16::from_be_bytes([f[67], f[68]]);
        assert_eq!(complete_checksum(&mut f, &hdr), Ok(()));
        assert_eq!(ref_fold(ref_sum(&f[59..]) + u32::from(old)), 0xffff);
        // Empty frame.
        assert_eq!(
            complete_checksum(&mut [], &hdr),
            Err(OffloadError::BadCsumOffsets)
        );
    }

    // -- segmentation: fixed cases ------------------------------------------

    #[test]
    fn segments_ipv4_ipv6_vlan_options_flags() {
        let payload = fill(7, 10_000);
        for v6 in [false, true] {
            for vlans in 0..=2 {
                for (ip_opts, tcp_opts) in [(false, false), (true, true), (false, true)] {
                    let spec = Spec {
                        v6,
                        vlans,
                        ip_opts: ip_opts && !v6,
                        tcp_opts,
                        fin: true,
                        psh: true,
                        seq: 0x1000,
                        ip_id: 0x4242,
                        ..Default::default()
                    };
                    let segs = check_spec(&spec, &payload, 1448);
                    assert_eq!(segs.len(), 7);
                }
            }
        }
    }

    #[test]
    fn cwr_first_only_and_ecn_gso_type() {
        let spec = Spec {
            cwr: true,
            ece: true,
            fin: true,
            ..Default::default()
        };
        let segs = check_spec(&spec, &fill(1, 3000), 1000);
        assert_eq!(segs.len(), 3);
        let spec6 = Spec { v6: true, ..spec };
        check_spec(&spec6, &fill(2, 2999), 1000);
    }

    #[test]
    fn id_and_sequence_wrap() {
        let spec = Spec {
            seq: 0xffff_fc00,
            ip_id: 0xfffe,
            ..Default::default()
        };
        let segs = check_spec(&spec, &fill(3, 4000), 1000);
        let ids: Vec<u16> = segs
            .iter()
            .map(|s| u16::from_be_bytes([s[18], s[19]]))
            .collect();
        assert_eq!(ids, [0xfffe, 0xffff, 0, 1]);
        let seqs: Vec<u32> = segs
            .iter()
            .map(|s| u32::from_be_bytes([s[38], s[39], s[40], s[41]]))
            .collect();
        assert_eq!(seqs, [0xffff_fc00, 0xffff_ffe8, 0x3d0, 0x7b8]);
    }

    #[test]
    fn small_payload_is_one_segment() {
        for (len, gso) in [(0, 1448), (1, 1), (1448, 1448), (100, 1448)] {
            for v6 in [false, true] {
                let spec = Spec {
                    v6,
                    fin: true,
                    psh: true,
                    cwr: true,
                    ..Default::default()
                };
                let segs = check_spec(&spec, &fill(4, len), gso);
                assert_eq!(segs.len(), 1);
            }
        }
        // One more byte than gso_size: two segments, the second of 1 byte.
        let segs = check_spec(&Spec::default(), &fill(5, 1449), 1448);
        assert_eq!(segs.len(), 2);
    }

    #[test]
    fn maximal_super_frames() {
        // 64 KiB super-frames cut to 1-byte and 9000-byte segments.
        for v6 in [false, true] {
            let spec = Spec {
                v6,
                ip_opts: !v6,
                tcp_opts: true,
                psh: true,
                ..Default::default()
            };
            let payload = fill(6, 65_000);
            assert_eq!(check_spec(&spec, &payload, 9000).len(), 8);
            let (frame, hdr) = super_frame(&spec, &payload, 1);
            let segs = run_segment(&frame, &hdr, 200).unwrap();
            assert_eq!(segs.len(), 65_000);
            verify_segments(&frame, &segs, 1);
        }
    }

    #[test]
    fn trailing_padding_is_trimmed() {
        for v6 in [false, true] {
            let spec = Spec {
                v6,
                ..Default::default()
            };
            let payload = fill(8, 2500);
            let (frame, hdr) = super_frame(&spec, &payload, 1000);
            let mut padded = frame.clone();
            padded.extend_from_slice(&[0xa5; 13]);
            let a = run_segment(&frame, &hdr, 2000).unwrap();
            let b = run_segment(&padded, &hdr, 2000).unwrap();
            assert_eq!(a, b);
            verify_segments(&padded, &b, 1000);
        }
    }

    #[test]
    fn hdr_len_and_csum_fields_are_not_trusted_for_gso() {
        let spec = Spec {
            tcp_opts: true,
            ..Default::default()
        };
        let payload = fill(9, 3000);
        let (frame, mut hdr) = super_frame(&spec, &payload, 1000);
        let good = run_segment(&frame, &hdr, 2000).unwrap();
        for (hdr_len, start, off) in [(0, 0, 0), (u16::MAX, u16::MAX, u16::MAX), (20, 3, 1)] {
            hdr.hdr_len = hdr_len;
            hdr.csum_start = start;
            hdr.csum_offset = off;
            assert_eq!(run_segment(&frame, &hdr, 2000).unwrap(), good);
        }
        // Without NEEDS_CSUM (and a garbage checksum field) the result is the same.
        hdr.flags = 0;
        let mut g = frame.clone();
        let l4 = spec.l4_off();
        g[l4 + 16] ^= 0x5a;
        assert_eq!(run_segment(&g, &hdr, 2000).unwrap(), good);
    }

    #[test]
    fn non_gso_without_csum_passes_through() {
        let (frame, mut hdr) = super_frame(&Spec::default(), &fill(10, 3000), 1000);
        hdr.flags = 0;
        hdr.gso_type = VIRTIO_NET_HDR_GSO_NONE;
        let mut out = Vec::new();
        let n = segment(&frame, &hdr, &mut [], &mut |s| out.push(s.to_vec()));
        assert_eq!(n, Ok(1));
        assert_eq!(out, vec![frame.clone()]);
        // Junk too: non-GSO frames are not parsed.
        let n = segment(&[1, 2, 3], &hdr, &mut [], &mut |s| assert_eq!(s, [1, 2, 3]));
        assert_eq!(n, Ok(1));
    }

    // -- segmentation: every error -------------------------------------------

    #[test]
    fn errors_are_reported() {
        use OffloadError::*;
        let spec = Spec::default();
        let (frame, hdr) = super_frame(&spec, &fill(11, 3000), 1000);
        let seg = |f: &[u8], h: &VirtioNetHdr, scratch: usize| {
            let mut s = vec![0u8; scratch];
            segment(f, h, &mut s, &mut |_| panic!("emitted before an error"))
        };
        let ok = |f: &[u8], h: &VirtioNetHdr, scratch: usize| {
            run_segment(f, h, scratch).map(|v| v.len())
        };
        let with = |f: fn(&mut Vec<u8>)| {
            let mut g = frame.clone();
            f(&mut g);
            g
        };

        for t in [
            VIRTIO_NET_HDR_GSO_UDP,
            VIRTIO_NET_HDR_GSO_UDP_L4,
            VIRTIO_NET_HDR_GSO_ECN,
            2,
            0x7f,
            0xff,
        ] {
            let h = VirtioNetHdr { gso_type: t, ..hdr };
            assert_eq!(
                seg(&frame, &h, 2000),
                Err(UnsupportedGsoType),
                "type {t:#x}"
            );
        }
        let h = VirtioNetHdr { gso_size: 0, ..hdr };
        assert_eq!(seg(&frame, &h, 2000), Err(ZeroGsoSize));
        let h = VirtioNetHdr {
            gso_type: VIRTIO_NET_HDR_GSO_TCPV6,
            ..hdr
        };
        assert_eq!(seg(&frame, &h, 2000), Err(GsoTypeMismatch));
        assert_eq!(seg(&frame, &hdr, 1053), Err(ScratchTooSmall));
        assert_eq!(ok(&frame, &hdr, 1054), Ok(3));
        assert_eq!(seg(&frame[..13], &hdr, 2000), Err(Truncated));
        assert_eq!(seg(&frame[..30], &hdr, 2000), Err(Truncated));
        assert_eq!(seg(&frame[..40], &hdr, 2000), Err(IpLengthMismatch));
        assert_eq!(
            seg(&frame[..frame.len() - 1], &hdr, 2000),
            Err(IpLengthMismatch)
        );

        let arp = with(|g| g[12..14].copy_from_slice(&[0x08, 0x06]));
        assert_eq!(seg(&arp, &hdr, 2000), Err(UnsupportedEtherType));
        // Three stacked tags.
        let mut triple = frame[..12].to_vec();
        for _ in 0..3 {
            triple.extend_from_slice(&[0x81, 0x00, 0x00, 0x05]);
        }
        triple.extend_from_slice(&frame[12..]);
        assert_eq!(seg(&triple, &hdr, 2000), Err(UnsupportedEtherType));

        let v5 = with(|g| g[14] = 0x55);
        assert_eq!(seg(&v5, &hdr, 2000), Err(BadIpHeader));
        let ihl4 = with(|g| g[14] = 0x44);
        assert_eq!(seg(&ihl4, &hdr, 2000), Err(BadIpHeader));
        let big = with(|g| g[16..18].copy_from_slice(&[0xff, 0xff]));
        assert_eq!(seg(&big, &hdr, 2000), Err(IpLengthMismatch));
        let small = with(|g| g[16..18].copy_from_slice(&[0, 19]));
        assert_eq!(seg(&small, &hdr, 2000), Err(IpLengthMismatch));
        let tiny = with(|g| g[16..18].copy_from_slice(&[0, 30]));
        assert_eq!(seg(&tiny, &hdr, 2000), Err(Truncated));
        let mf = with(|g| g[20] |= 0x20);
        assert_eq!(seg(&mf, &hdr, 2000), Err(Fragmented));
        let off = with(|g| g[21] = 1);
        assert_eq!(seg(&off, &hdr, 2000), Err(Fragmented));
        let udp = with(|g| g[23] = 17);
        assert_eq!(seg(&udp, &hdr, 2000), Err(NotTcp));
        let doff = with(|g| g[46] = 0x40);
        assert_eq!(seg(&doff, &hdr, 2000), Err(BadTcpHeader));
        let doff_big = with(|g| {
            g[46] = 0xf0;
            let total = 20u16 + 30;
            g[16..18].copy_from_slice(&total.to_be_bytes());
        });
        assert_eq!(seg(&doff_big, &hdr, 2000), Err(Truncated));

        // IPv6.
        let spec6 = Spec {
            v6: true,
            ..Default::default()
        };
        let (f6, h6) = super_frame(&spec6, &fill(12, 3000), 1000);
        let with6 = |f: fn(&mut Vec<u8>)| {
            let mut g = f6.clone();
            f(&mut g);
            g
        };
        assert_eq!(
            seg(&f6, &VirtioNetHdr { gso_type: 1, ..h6 }, 2000),
            Err(GsoTypeMismatch)
        );
        for ext in [0u8, 43, 44, 60] {
            let mut g = f6.clone();
            g[20] = ext;
            assert_eq!(seg(&g, &h6, 2000), Err(UnsupportedIpv6Extension));
        }
        let udp6 = with6(|g| g[20] = 17);
        assert_eq!(seg(&udp6, &h6, 2000), Err(NotTcp));
        let v4in6 = with6(|g| g[14] = 0x40);
        assert_eq!(seg(&v4in6, &h6, 2000), Err(BadIpHeader));
        let jumbo = with6(|g| g[18..20].copy_from_slice(&[0, 0]));
        assert_eq!(seg(&jumbo, &h6, 2000), Err(Truncated));
        let long6 = with6(|g| g[18..20].copy_from_slice(&[0xff, 0xff]));
        assert_eq!(seg(&long6, &h6, 2000), Err(IpLengthMismatch));
        assert_eq!(seg(&f6[..50], &h6, 2000), Err(Truncated));

        // Each error has a message.
        assert!(!Truncated.to_string().is_empty());
        assert_ne!(TooManySegments.to_string(), ScratchTooSmall.to_string());
    }

    // -- VXLAN over IPv6 (UDP-tunnel GSO) --------------------------------------

    /// The outer (underlay) IPv6 source and destination.
    const OUTER_IPV6: ([u8; 16], [u8; 16]) = (
        [0xfd, 0, 1, 0x72, 0, 0x18, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2],
        [0xfd, 0, 1, 0x72, 0, 0x18, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3],
    );

    /// `spec`'s super-frame encapsulated whole over IPv6, as tapyard's encapsulation hands it
    /// to a port: outer Ethernet + IPv6 + UDP (source port `sport`) + VXLAN VNI 1, the GSO
    /// type with the IPv6 tunnel bit, `csum_start`/`hdr_len` counted from the outer frame.
    fn tunnel_ipv6_frame(
        spec: &Spec,
        payload: &[u8],
        gso: u16,
        sport: u16,
    ) -> (Vec<u8>, VirtioNetHdr) {
        let (inner, h) = super_frame(spec, payload, gso);
        let mut dgram = vec![0x08, 0, 0, 0, 0, 0, 1, 0];
        dgram.extend_from_slice(&inner);
        let mut f = Vec::new();
        PacketBuilder::ethernet2(MAC_B, MAC_A)
            .ipv6(OUTER_IPV6.0, OUTER_IPV6.1, 64)
            .udp(sport, 8472)
            .write(&mut f, &dgram)
            .unwrap();
        let shift = u16::try_from(vxlan::overhead::<std::net::Ipv6Addr>()).unwrap();
        let hdr = VirtioNetHdr {
            gso_type: h.gso_type | VIRTIO_NET_HDR_GSO_UDP_TUNNEL_IPV6,
            hdr_len: h.hdr_len + shift,
            csum_start: h.csum_start + shift,
            ..h
        };
        (f, hdr)
    }

    /// Segments a VXLAN-over-IPv6 super-frame and checks every segment: the inner frame
    /// exactly the kernel's TSO segment, the outer headers copied with the IPv6 payload
    /// length, UDP length and a nonzero, right UDP checksum of the segment. Returns the
    /// segments.
    fn check_tunnel_ipv6(spec: &Spec, payload: &[u8], gso: u16, sport: u16) -> Vec<Vec<u8>> {
        let (frame, hdr) = tunnel_ipv6_frame(spec, payload, gso, sport);
        check_tunnel_ipv6_segments(&frame, &hdr, spec, payload)
    }

    /// [`check_tunnel_ipv6`] on a frame built by the caller.
    fn check_tunnel_ipv6_segments(
        frame: &[u8],
        hdr: &VirtioNetHdr,
        spec: &Spec,
        payload: &[u8],
    ) -> Vec<Vec<u8>> {
        let gso = hdr.gso_size;
        let segs = run_segment(frame, hdr, usize::from(hdr.hdr_len) + usize::from(gso)).unwrap();
        let want = expected_segments(spec, payload, usize::from(gso));
        assert_eq!(segs.len(), want.len());
        for (s, w) in segs.iter().zip(&want) {
            assert!(s[70..] == w[..], "inner segment");
            assert_eq!(
                s[..18],
                frame[..18],
                "outer Ethernet, IPv6 version/class/flow"
            );
            assert_eq!(
                s[20..58],
                frame[20..58],
                "next header, hop limit, addresses, ports"
            );
            assert_eq!(s[62..70], frame[62..70], "VXLAN header");
            let p = SlicedPacket::from_ethernet(s).unwrap();
            let (Some(NetSlice::Ipv6(ip)), Some(TransportSlice::Udp(u))) = (p.net, p.transport)
            else {
                panic!("not UDP/IPv6")
            };
            let ip = ip.header().to_header();
            assert_eq!(usize::from(ip.payload_length), s.len() - 54);
            assert_eq!(usize::from(u.length()), s.len() - 54);
            assert_ne!(u.checksum(), 0, "IPv6 forbids a zero UDP checksum");
            assert_eq!(
                u.to_header().calc_checksum_ipv6(&ip, u.payload()).unwrap(),
                u.checksum(),
                "outer UDP checksum"
            );
        }
        segs
    }

    #[test]
    fn tunnel6_super_frames_get_outer_ipv6_headers_per_segment() {
        for v6 in [false, true] {
            for tcp_opts in [false, true] {
                let spec = Spec {
                    v6,
                    tcp_opts,
                    psh: true,
                    fin: true,
                    seq: 0xffff_f000,
                    ip_id: 0xfffe,
                    ..Default::default()
                };
                let payload = fill(u64::from(tcp_opts) + 7, 13_700);
                let segs = check_tunnel_ipv6(&spec, &payload, 1370, 40_001);
                assert_eq!(segs.len(), 10);
                // One segment when the payload fits; an empty payload still gives one.
                assert_eq!(
                    check_tunnel_ipv6(&spec, &payload[..100], 1370, 40_001).len(),
                    1
                );
                assert_eq!(check_tunnel_ipv6(&spec, &[], 1370, 40_001).len(), 1);
            }
        }
        // The largest inner super-frame: its outer lengths would not fit 16 bits, so they are
        // written capped by the encapsulation and not read; every segment's are right.
        let spec = Spec::default();
        let payload = fill(3, 65_535 - 40);
        let (inner, _) = super_frame(&spec, &payload, 1448);
        let (small, hdr) = tunnel_ipv6_frame(&spec, &[], 1448, 1);
        let mut frame = small[..vxlan::overhead::<std::net::Ipv6Addr>()].to_vec();
        frame.extend_from_slice(&inner);
        assert!(frame.len() > 54 + 65_535);
        frame[18..20].copy_from_slice(&[0xff, 0xff]);
        frame[58..60].copy_from_slice(&[0xff, 0xff]);
        let segs = check_tunnel_ipv6_segments(&frame, &hdr, &spec, &payload);
        assert_eq!(segs.len(), payload.len().div_ceil(1448));
    }

    #[test]
    fn tunnel6_outer_udp_checksum_is_never_zero() {
        // Over every source port, one makes the segment's checksum fold to zero: it is
        // sent as 0xffff (RFC 8200 8.1), as etherparse computes it.
        let spec = Spec::default();
        let mut seen_ffff = false;
        for sport in 0..=u16::MAX {
            let (frame, hdr) = tunnel_ipv6_frame(&spec, &[0x5a; 40], 1370, sport);
            let segs = run_segment(&frame, &hdr, 300).unwrap();
            let c = u16::from_be_bytes([segs[0][60], segs[0][61]]);
            assert_ne!(c, 0);
            seen_ffff |= c == 0xffff;
        }
        assert!(seen_ffff);
    }

    #[test]
    fn tunnel_super_frames_that_lie_are_refused() {
        use OffloadError::*;
        let spec = Spec::default();
        let (f, h) = tunnel_ipv6_frame(&spec, &fill(5, 5000), 1000, 9);
        let seg = |f: &[u8], h: &VirtioNetHdr| run_segment(f, h, 70_000).map(|s| s.len());
        assert_eq!(seg(&f, &h), Ok(5));
        // Both tunnel bits, or one with no inner type.
        let both = h.gso_type | VIRTIO_NET_HDR_GSO_UDP_TUNNEL_IPV4;
        assert_eq!(
            seg(
                &f,
                &VirtioNetHdr {
                    gso_type: both,
                    ..h
                }
            ),
            Err(UnsupportedGsoType)
        );
        let bare = VIRTIO_NET_HDR_GSO_UDP_TUNNEL_IPV6;
        assert_eq!(
            seg(
                &f,
                &VirtioNetHdr {
                    gso_type: bare,
                    ..h
                }
            ),
            Err(UnsupportedGsoType)
        );
        // The IPv4 tunnel bit on an IPv6 outer header, the inner family not the GSO type's.
        let v4 = VIRTIO_NET_HDR_GSO_TCPV4 | VIRTIO_NET_HDR_GSO_UDP_TUNNEL_IPV4;
        assert_eq!(
            seg(&f, &VirtioNetHdr { gso_type: v4, ..h }),
            Err(GsoTypeMismatch)
        );
        let v6in = VIRTIO_NET_HDR_GSO_TCPV6 | VIRTIO_NET_HDR_GSO_UDP_TUNNEL_IPV6;
        assert_eq!(
            seg(
                &f,
                &VirtioNetHdr {
                    gso_type: v6in,
                    ..h
                }
            ),
            Err(GsoTypeMismatch)
        );
        // An outer extension header (the inner frame would not be where it is assumed), an
        // outer version that lies, an outer EtherType of the other family.
        for (at, v) in [(20usize, 0u8), (20, 60), (14, 0x40), (12, 0x08)] {
            let mut g = f.clone();
            g[at] = v;
            if at == 12 {
                g[13] = 0;
            }
            assert_eq!(seg(&g, &h), Err(GsoTypeMismatch), "byte {at} = {v}");
        }
        // Cut inside the outer headers, inside the inner ones, and a zero gso_size.
        assert_eq!(seg(&f[..60], &h), Err(Truncated));
        assert_eq!(seg(&f[..100], &h), Err(Truncated));
        assert_eq!(
            seg(&f, &VirtioNetHdr { gso_size: 0, ..h }),
            Err(ZeroGsoSize)
        );
    }

    // -- property tests -------------------------------------------------------

    fn spec_strategy() -> impl Strategy<Value = Spec> {
        (
            any::<bool>(),
            0u8..=2,
            any::<bool>(),
            any::<bool>(),
            any::<(bool, bool, bool, bool)>(),
            any::<u32>(),
            any::<u16>(),
        )
            .prop_map(
                |(v6, vlans, ip_opts, tcp_opts, (fin, psh, cwr, ece), seq, ip_id)| Spec {
                    v6,
                    vlans,
                    ip_opts: ip_opts && !v6,
                    tcp_opts,
                    fin,
                    psh,
                    cwr,
                    ece,
                    seq,
                    ip_id,
                },
            )
    }

    fn hdr_strategy() -> impl Strategy<Value = VirtioNetHdr> {
        let small = || prop_oneof![any::<u16>(), 0u16..200];
        (
            any::<u8>(),
            prop_oneof![
                Just(0u8),
                Just(1),
                Just(4),
                Just(0x81),
                Just(0x84),
                any::<u8>()
            ],
            small(),
            small(),
            small(),
            small(),
        )
            .prop_map(
                |(flags, gso_type, hdr_len, gso_size, csum_start, csum_offset)| VirtioNetHdr {
                    flags,
                    gso_type,
                    hdr_len,
                    gso_size,
                    csum_start,
                    csum_offset,
                },
            )
    }

    /// Whatever `segment` returns for untrusted input must be self-consistent.
    fn segment_anything(frame: &[u8], hdr: &VirtioNetHdr, scratch_len: usize) {
        let mut scratch = vec![0u8; scratch_len];
        let mut count = 0usize;
        let r = segment(frame, hdr, &mut scratch, &mut |s| {
            count += 1;
            assert!(s.len() <= scratch_len.max(frame.len()));
        });
        match r {
            Ok(n) => assert_eq!(n, count),
            Err(_) => assert_eq!(count, 0),
        }
        let mut copy = frame.to_vec();
        let _ = complete_checksum(&mut copy, hdr);
        assert_eq!(copy.len(), frame.len());
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        #[test]
        fn prop_segmentation_invariants(
            spec in spec_strategy(),
            len in prop_oneof![0usize..=3000, 0usize..=65_000],
            gso in prop_oneof![1u16..=64, 1u16..=9000],
            seed in any::<u64>(),
        ) {
            let payload = fill(seed, len);
            let (frame, hdr) = super_frame(&spec, &payload, gso);
            let hdrs = usize::from(hdr.hdr_len);
            let segs = run_segment(&frame, &hdr, hdrs + usize::from(gso)).unwrap();
            for s in &segs {
                prop_assert!(s.len() <= hdrs + usize::from(gso));
            }
            verify_segments(&frame, &segs, usize::from(gso));
            if segs.len() <= 2000 {
                prop_assert_eq!(segs, expected_segments(&spec, &payload, usize::from(gso)));
            }
        }

        #[test]
        fn prop_arbitrary_input_never_panics(
            bytes in prop::collection::vec(any::<u8>(), 0..300),
            hdr in hdr_strategy(),
            scratch_len in 0usize..400,
            l2 in prop_oneof![Just(None), Just(Some(0x0800u16)), Just(Some(0x86dd)), Just(Some(0x8100))],
        ) {
            let mut bytes = bytes;
            if let (Some(et), true) = (l2, bytes.len() >= 15) {
                bytes[12..14].copy_from_slice(&et.to_be_bytes());
                bytes[14] = if et == 0x86dd { 0x60 } else { 0x45 };
            }
            segment_anything(&bytes, &hdr, scratch_len);
        }

        #[test]
        fn prop_mutated_super_frames_never_panic(
            spec in spec_strategy(),
            len in 0usize..2000,
            gso in 1u16..1500,
            mutations in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
            cut in any::<prop::sample::Index>(),
            hdr_mut in hdr_strategy(),
            which in 0u8..4,
            scratch_len in 0usize..3200,
        ) {
            let (mut frame, mut hdr) = super_frame(&spec, &fill(len as u64, len), gso);
            for (i, v) in &mutations {
                let at = i.index(frame.len());
                frame[at] = *v;
            }
            frame.truncate(cut.index(frame.len() + 1));
            match which {
                0 => {}
                1 => hdr.gso_size = hdr_mut.gso_size,
                2 => { hdr.csum_start = hdr_mut.csum_start; hdr.csum_offset = hdr_mut.csum_offset; hdr.gso_type = 0; }
                _ => hdr = hdr_mut,
            }
            segment_anything(&frame, &hdr, scratch_len);
        }

        #[test]
        fn prop_tunnel6_segmentation_and_mutations(
            spec in spec_strategy(),
            len in 0usize..6000,
            gso in 1u16..1500,
            sport in any::<u16>(),
            mutations in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
            cut in any::<prop::sample::Index>(),
            hdr_mut in hdr_strategy(),
            which in 0u8..4,
        ) {
            let payload = fill(len as u64 + 5, len);
            check_tunnel_ipv6(&spec, &payload, gso, sport);
            let (mut frame, mut hdr) = tunnel_ipv6_frame(&spec, &payload, gso, sport);
            for (i, v) in &mutations {
                let at = i.index(frame.len());
                frame[at] = *v;
            }
            frame.truncate(cut.index(frame.len() + 1));
            match which {
                0 => {}
                1 => hdr.gso_size = hdr_mut.gso_size,
                2 => hdr.gso_type = hdr_mut.gso_type | VIRTIO_NET_HDR_GSO_UDP_TUNNEL_IPV6,
                _ => hdr = hdr_mut,
            }
            segment_anything(&frame, &hdr, 70_000);
        }

        #[test]
        fn prop_every_truncation_is_handled(
            spec in spec_strategy(),
            len in 0usize..1500,
            gso in 1u16..1500,
        ) {
            let payload = fill(len as u64 + 99, len);
            let (frame, hdr) = super_frame(&spec, &payload, gso);
            let scratch_len = usize::from(hdr.hdr_len) + usize::from(gso);
            let csum_hdr = VirtioNetHdr { gso_type: 0, gso_size: 0, ..hdr };
            let field_end = usize::from(hdr.csum_start) + 18;
            for cut in 0..=frame.len() {
                let f = &frame[..cut];
                match run_segment(f, &hdr, scratch_len) {
                    Ok(segs) => {
                        prop_assert_eq!(cut, frame.len());
                        verify_segments(f, &segs, usize::from(gso));
                    }
                    Err(e) => prop_assert!(cut < frame.len(), "{:?}", e),
                }
                let mut g = f.to_vec();
                let r = complete_checksum(&mut g, &csum_hdr);
                prop_assert_eq!(r.is_ok(), cut >= field_end);
                let r = run_segment(f, &csum_hdr, frame.len());
                prop_assert_eq!(r.is_ok(), cut >= field_end);
            }
        }
    }
}

/// Bytes of scratch space [`send_completed`] needs: the largest super-frame plus headroom.
const SCRATCH_LEN: usize = 65_536 + 256;

std::thread_local! {
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Finishes a frame's offload work in software (checksum completion, TCP segmentation) and
/// hands each resulting wire frame to `tx`; for ports that cannot take offloads. Uses a
/// per-thread scratch buffer allocated once. Returns the first error `tx` gave, or
/// [`crate::DropReason::BadOffload`] when the offload metadata cannot be honoured.
pub(crate) fn send_completed(
    buf: &crate::PacketBuf,
    tx: &mut dyn FnMut(&[u8]) -> Result<(), crate::DropReason>,
) -> Result<(), crate::DropReason> {
    SCRATCH.with(|s| {
        let mut s = s.borrow_mut();
        if s.len() < SCRATCH_LEN {
            s.resize(SCRATCH_LEN, 0);
        }
        let mut result = Ok(());
        let r = segment(buf.frame(), &buf.offload, &mut s, &mut |f| {
            if result.is_ok() {
                result = tx(f);
            }
        });
        match r {
            Ok(_) => result,
            Err(_) => Err(crate::DropReason::BadOffload),
        }
    })
}
