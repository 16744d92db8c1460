//! IPv4, ICMPv4 and ARP on byte slices: header checks, the TTL decrement, ICMP errors and echo
//! replies, fragmentation, ARP packets. Used by the router; every function bounds-checks its
//! input and returns an error value instead of panicking.
//!
//! Field offsets are named once in the private `field` modules; slices passed in start at the
//! IPv4 header (`l3`) or at the Ethernet header (`frame`) as each function says.

use std::net::Ipv4Addr;

use crate::port::offload::{csum_add, csum_fold};
use crate::stats::DropReason;
use crate::wire::mac::MacAddr;

mod field {
    pub const VER_IHL: usize = 0;
    pub const LEN: usize = 2;
    pub const FRAG: usize = 6;
    pub const TTL: usize = 8;
    pub const PROTO: usize = 9;
    pub const CSUM: usize = 10;
    pub const SRC: usize = 12;
    pub const DST: usize = 16;
}

/// IP protocol number of ICMP.
pub const PROTO_ICMP: u8 = 1;
/// IP protocol number of TCP.
pub const PROTO_TCP: u8 = 6;
/// IP protocol number of UDP.
pub const PROTO_UDP: u8 = 17;
/// The "don't fragment" flag in the flags/fragment-offset field.
pub const DF: u16 = 0x4000;
/// The "more fragments" flag.
pub const MF: u16 = 0x2000;
/// The largest IP datagram an ICMP error may be (RFC 1812 4.3.2.3, as Linux).
pub const ICMP_ERROR_MAX: usize = 576;
/// Length of an ARP packet for IPv4 over Ethernet.
pub const ARP_LEN: usize = 28;

/// ICMP types and codes the router sends.
pub mod icmp {
    /// Echo reply.
    pub const ECHO_REPLY: u8 = 0;
    /// Destination unreachable.
    pub const DEST_UNREACH: u8 = 3;
    /// Echo request.
    pub const ECHO_REQUEST: u8 = 8;
    /// Time exceeded.
    pub const TIME_EXCEEDED: u8 = 11;
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

/// The Internet checksum of `data`, as the big-endian value to store.
pub fn checksum(data: &[u8]) -> u16 {
    u16::from_be_bytes((!csum_fold(csum_add(0, data))).to_ne_bytes())
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn put16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

/// The facts about a valid IPv4 header, from [`check_header`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ipv4Info {
    /// Header length in bytes (20..=60).
    pub hdr_len: usize,
    /// Total length from the header (≤ the bytes present).
    pub total_len: usize,
    /// Time to live.
    pub ttl: u8,
    /// Protocol number.
    pub proto: u8,
    /// Source address.
    pub src: Ipv4Addr,
    /// Destination address.
    pub dst: Ipv4Addr,
    /// The flags and fragment offset field.
    pub frag: u16,
}

impl Ipv4Info {
    /// True when DF is set.
    pub fn dont_fragment(&self) -> bool {
        self.frag & DF != 0
    }
    /// True for a fragment other than the first.
    pub fn is_later_fragment(&self) -> bool {
        self.frag & 0x1fff != 0
    }
}

/// Checks an IPv4 header as Linux's `ip_rcv` does: version 4, IHL ≥ 5, header and total
/// length within the bytes present, header checksum valid.
#[inline]
pub fn check_header(l3: &[u8]) -> Result<Ipv4Info, DropReason> {
    // The fixed 20 bytes as an array: every field read below is bounds-check free.
    let Some(h) = l3.first_chunk::<20>() else {
        return Err(DropReason::BadIpHeader);
    };
    let vi = h[field::VER_IHL];
    let hdr_len = usize::from(vi & 0x0f) * 4;
    if vi >> 4 != 4 || hdr_len < 20 || hdr_len > l3.len() {
        return Err(DropReason::BadIpHeader);
    }
    let total_len = usize::from(u16::from_be_bytes([h[2], h[3]]));
    if total_len < hdr_len || total_len > l3.len() {
        return Err(DropReason::BadIpHeader);
    }
    let w = |i: usize| u64::from(u32::from_ne_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]));
    let mut sum = w(0) + w(4) + w(8) + w(12) + w(16);
    if hdr_len > 20 {
        // Options.
        sum = csum_add(sum, l3.get(20..hdr_len).unwrap_or(&[]));
    }
    // Fold the 34-bit sum: two rounds always suffice.
    let s1 = (sum & 0xffff) + (sum >> 16);
    let s2 = (s1 & 0xffff) + (s1 >> 16);
    let s3 = (s2 & 0xffff) + (s2 >> 16);
    if s3 != 0xffff {
        return Err(DropReason::BadIpChecksum);
    }
    Ok(Ipv4Info {
        hdr_len,
        total_len,
        ttl: h[field::TTL],
        proto: h[field::PROTO],
        src: Ipv4Addr::from(u32::from_be_bytes([h[12], h[13], h[14], h[15]])),
        dst: Ipv4Addr::from(u32::from_be_bytes([h[16], h[17], h[18], h[19]])),
        frag: u16::from_be_bytes([h[6], h[7]]),
    })
}

/// Decrements the TTL of a checked header and patches the checksum incrementally (RFC 1624),
/// as Linux's `ip_decrease_ttl`. The caller has made sure TTL > 1.
pub fn decrement_ttl(l3: &mut [u8]) {
    if l3.len() < 20 {
        return;
    }
    l3[field::TTL] = l3[field::TTL].wrapping_sub(1);
    // TTL is the high byte of the 16-bit word at offset 8: the sum drops by 0x0100, so the
    // checksum (its complement) rises by 0x0100 with end-around carry.
    let c = u32::from(be16(l3, field::CSUM)) + 0x0100;
    put16(l3, field::CSUM, ((c & 0xffff) + (c >> 16)) as u16);
}

/// Recomputes the header checksum of `l3[..hdr_len]`.
pub fn fix_header_checksum(l3: &mut [u8], hdr_len: usize) {
    if l3.len() < hdr_len || hdr_len < 20 {
        return;
    }
    put16(l3, field::CSUM, 0);
    let c = checksum(&l3[..hdr_len]);
    put16(l3, field::CSUM, c);
}

/// True when an ICMP error may be sent about this packet (RFC 1122 3.2.2 and Linux's
/// `icmp_send`): not about an ICMP error, not about a non-first fragment, not to or from a
/// broadcast, multicast, zero or loopback address, not about a frame sent to an L2 group.
pub fn may_send_icmp_error(l3: &[u8], info: &Ipv4Info, l2_group_dst: bool) -> bool {
    if l2_group_dst || info.is_later_fragment() {
        return false;
    }
    let bad =
        |a: Ipv4Addr| a.is_unspecified() || a.is_broadcast() || a.is_multicast() || a.is_loopback();
    if bad(info.src) || info.dst.is_multicast() || info.dst.is_broadcast() {
        return false;
    }
    if info.proto == PROTO_ICMP {
        // Only queries (echo, timestamp, ...) may be answered with an error.
        let Some(&ty) = l3.get(info.hdr_len) else {
            return false;
        };
        return matches!(ty, 0 | 8 | 13 | 14 | 15 | 16 | 17 | 18);
    }
    true
}

/// Writes an Ethernet + IPv4 + ICMP error about the packet `orig_l3` into `out`, quoting as much
/// of the original datagram as fits in 576 bytes (as Linux). `rest` is the ICMP header's second
/// word (the next-hop MTU for "fragmentation needed"). Returns the frame length, or `None` when
/// `out` is too small.
#[allow(clippy::too_many_arguments)]
pub fn write_icmp_error(
    out: &mut [u8],
    src_mac: MacAddr,
    dst_mac: MacAddr,
    src_ip: Ipv4Addr,
    dst_ip: Ipv4Addr,
    ty: u8,
    code: u8,
    rest: u32,
    orig_l3: &[u8],
) -> Option<usize> {
    let quote = orig_l3.len().min(ICMP_ERROR_MAX - 20 - 8);
    let ip_len = 20 + 8 + quote;
    let len = 14 + ip_len;
    let f = out.get_mut(..len)?;
    f[0..6].copy_from_slice(&dst_mac.0);
    f[6..12].copy_from_slice(&src_mac.0);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    let ip = &mut f[14..];
    // Version 4, IHL 5, TOS as Linux (internetwork control), TTL 64, protocol ICMP.
    ip[..20].copy_from_slice(&[
        0x45, 0xc0, 0, 0, 0, 0, 0, 0, 64, PROTO_ICMP, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ]);
    put16(ip, field::LEN, ip_len as u16);
    ip[field::SRC..field::SRC + 4].copy_from_slice(&src_ip.octets());
    ip[field::DST..field::DST + 4].copy_from_slice(&dst_ip.octets());
    fix_header_checksum(ip, 20);
    let icmp = &mut ip[20..];
    icmp[0] = ty;
    icmp[1] = code;
    icmp[2..4].copy_from_slice(&[0, 0]);
    icmp[4..8].copy_from_slice(&rest.to_be_bytes());
    icmp[8..8 + quote].copy_from_slice(&orig_l3[..quote]);
    let c = checksum(&icmp[..8 + quote]);
    put16(icmp, 2, c);
    Some(len)
}

/// Writes the TCP reset that refuses the segment at `orig_l3` (a checked IPv4 header of
/// `hdr_len` bytes with a TCP header after it), as Linux's `nf_send_reset` for `REJECT
/// --reject-with tcp-reset`: from the segment's destination address and port back to its
/// source; `seq = SEG.ACK` when the segment had ACK, else `seq = 0` with `RST|ACK` and
/// `ack = SEG.SEQ + SEG.LEN` (SYN and FIN count one). Returns the frame length, or `None`
/// when `out` is too small, the TCP header is truncated, or the segment is itself a reset.
pub fn write_tcp_rst(
    out: &mut [u8],
    src_mac: MacAddr,
    dst_mac: MacAddr,
    orig_l3: &[u8],
    hdr_len: usize,
) -> Option<usize> {
    let tcp = orig_l3.get(hdr_len..)?;
    let th = tcp.get(..20)?;
    let flags = th[13];
    if flags & 0x04 != 0 {
        return None;
    }
    let doff = usize::from(th[12] >> 4) * 4;
    let total = usize::from(be16(orig_l3, field::LEN)).min(orig_l3.len());
    let payload = u32::try_from(total.saturating_sub(hdr_len + doff)).unwrap_or(0);
    let seg_seq = u32::from_be_bytes([th[4], th[5], th[6], th[7]]);
    let seg_ack = u32::from_be_bytes([th[8], th[9], th[10], th[11]]);
    let (seq, ack, out_flags) = if flags & 0x10 != 0 {
        (seg_ack, 0, 0x04)
    } else {
        let len = payload + u32::from(flags & 0x02 != 0) + u32::from(flags & 0x01 != 0);
        (0, seg_seq.wrapping_add(len), 0x14)
    };
    let f = out.get_mut(..14 + 40)?;
    f[0..6].copy_from_slice(&dst_mac.0);
    f[6..12].copy_from_slice(&src_mac.0);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    let ip = &mut f[14..];
    ip[..20].copy_from_slice(&[
        0x45, 0, 0, 40, 0, 0, 0x40, 0, 64, PROTO_TCP, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ]);
    ip[field::SRC..field::SRC + 4].copy_from_slice(&orig_l3[field::DST..field::DST + 4]);
    ip[field::DST..field::DST + 4].copy_from_slice(&orig_l3[field::SRC..field::SRC + 4]);
    fix_header_checksum(ip, 20);
    let (src, dst) = (
        [ip[12], ip[13], ip[14], ip[15]],
        [ip[16], ip[17], ip[18], ip[19]],
    );
    let t = &mut ip[20..40];
    t[0..2].copy_from_slice(&th[2..4]);
    t[2..4].copy_from_slice(&th[0..2]);
    t[4..8].copy_from_slice(&seq.to_be_bytes());
    t[8..12].copy_from_slice(&ack.to_be_bytes());
    t[12] = 5 << 4;
    t[13] = out_flags;
    t[14..20].fill(0);
    // Pseudo-header: addresses, protocol, TCP length.
    let mut acc = csum_add(0, &src);
    acc = csum_add(acc, &dst);
    acc = csum_add(acc, &[0, PROTO_TCP, 0, 20]);
    acc = csum_add(acc, t);
    let c = !csum_fold(acc);
    t[16..18].copy_from_slice(&c.to_ne_bytes());
    Some(54)
}

/// Turns an ICMP echo request frame addressed to us into the echo reply, in place: addresses
/// swapped (IP and MAC, with `our_mac` as the source), type 0, TTL 64, checksums updated.
/// `l3` is the frame's L3 offset. Returns `false` (frame untouched) if it is not a well-formed
/// echo request.
pub fn echo_reply_in_place(frame: &mut [u8], l3: usize, info: &Ipv4Info, our_mac: MacAddr) -> bool {
    let icmp_at = l3 + info.hdr_len;
    let end = l3 + info.total_len;
    if info.proto != PROTO_ICMP || end > frame.len() || end < icmp_at + 8 {
        return false;
    }
    if frame[icmp_at] != icmp::ECHO_REQUEST || frame[icmp_at + 1] != 0 {
        return false;
    }
    if checksum(&frame[icmp_at..end]) != 0 {
        return false;
    }
    let peer = MacAddr::from_slice(&frame[6..12]);
    frame[0..6].copy_from_slice(&peer.0);
    frame[6..12].copy_from_slice(&our_mac.0);
    let ip = &mut frame[l3..];
    let (s, d) = (info.src.octets(), info.dst.octets());
    ip[field::SRC..field::SRC + 4].copy_from_slice(&d);
    ip[field::DST..field::DST + 4].copy_from_slice(&s);
    ip[field::TTL] = 64;
    fix_header_checksum(ip, info.hdr_len);
    let icmp = &mut frame[icmp_at..end];
    icmp[0] = icmp::ECHO_REPLY;
    put16(icmp, 2, 0);
    let c = checksum(icmp);
    put16(icmp, 2, c);
    true
}

/// Splits the IPv4 datagram in `frame` (Ethernet header, then IPv4 at `l3`) into fragments
/// whose IP length is at most `mtu`, writing each complete frame into `scratch` and handing it
/// to `emit`, as Linux's `ip_fragment`: payload cut at multiples of 8 bytes, MF and offsets set,
/// options without the "copied" bit replaced by NOPs after the first fragment, checksums
/// recomputed. Returns the number of fragments, or an error when the packet cannot be split
/// (`mtu` smaller than header + 8 bytes, or `scratch` too small).
pub fn fragment(
    frame: &[u8],
    l3: usize,
    info: &Ipv4Info,
    mtu: usize,
    scratch: &mut [u8],
    emit: &mut dyn FnMut(&[u8]),
) -> Result<usize, DropReason> {
    let hl = info.hdr_len;
    let end = l3 + info.total_len;
    if end > frame.len() || mtu < hl + 8 {
        return Err(DropReason::FragNeeded);
    }
    let per = (mtu - hl) & !7;
    let payload = &frame[l3 + hl..end];
    let base_off = usize::from(info.frag & 0x1fff) * 8;
    let orig_mf = info.frag & MF;
    let mut hdr = [0u8; 60];
    hdr[..hl].copy_from_slice(&frame[l3..l3 + hl]);
    let mut n = 0;
    let mut at = 0;
    while at < payload.len() || (at == 0 && payload.is_empty()) {
        let chunk = per.min(payload.len() - at);
        let last = at + chunk >= payload.len();
        let flen = l3 + hl + chunk;
        let out = scratch.get_mut(..flen).ok_or(DropReason::FragNeeded)?;
        out[..l3].copy_from_slice(&frame[..l3]);
        out[l3..l3 + hl].copy_from_slice(&hdr[..hl]);
        let ip = &mut out[l3..];
        put16(ip, field::LEN, (hl + chunk) as u16);
        let off = (base_off + at) / 8;
        let mf = if last { orig_mf } else { MF };
        put16(
            ip,
            field::FRAG,
            (info.frag & DF) | mf | (off as u16 & 0x1fff),
        );
        fix_header_checksum(ip, hl);
        ip[hl..hl + chunk].copy_from_slice(&payload[at..at + chunk]);
        emit(&out[..flen]);
        n += 1;
        if n == 1 {
            strip_uncopied_options(&mut hdr[..hl]);
        }
        at += chunk;
        if payload.is_empty() {
            break;
        }
    }
    Ok(n)
}

/// Replaces IPv4 options whose "copied" bit is clear with NOPs (Linux `ip_options_fragment`).
fn strip_uncopied_options(hdr: &mut [u8]) {
    let mut i = 20;
    while i < hdr.len() {
        match hdr[i] {
            0 => break,
            1 => i += 1,
            ty => {
                let Some(&l) = hdr.get(i + 1) else { break };
                let l = usize::from(l);
                if l < 2 || i + l > hdr.len() {
                    break;
                }
                if ty & 0x80 == 0 {
                    hdr[i..i + l].fill(1);
                }
                i += l;
            }
        }
    }
}

/// An ARP packet for IPv4 over Ethernet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arp {
    /// 1 = request, 2 = reply.
    pub op: u16,
    /// Sender hardware address.
    pub sha: MacAddr,
    /// Sender protocol address.
    pub spa: Ipv4Addr,
    /// Target hardware address.
    pub tha: MacAddr,
    /// Target protocol address.
    pub tpa: Ipv4Addr,
}

impl Arp {
    /// ARP request.
    pub const REQUEST: u16 = 1;
    /// ARP reply.
    pub const REPLY: u16 = 2;

    /// Parses an ARP packet (`l3` starts at the ARP header); only Ethernet/IPv4 is accepted.
    pub fn parse(l3: &[u8]) -> Result<Arp, DropReason> {
        let a = l3.get(..ARP_LEN).ok_or(DropReason::BadArp)?;
        if a[0..6] != [0, 1, 0x08, 0x00, 6, 4] {
            return Err(DropReason::BadArp);
        }
        let ip = |o: usize| Ipv4Addr::new(a[o], a[o + 1], a[o + 2], a[o + 3]);
        Ok(Arp {
            op: be16(a, 6),
            sha: MacAddr::from_slice(&a[8..14]),
            spa: ip(14),
            tha: MacAddr::from_slice(&a[18..24]),
            tpa: ip(24),
        })
    }

    /// Writes an Ethernet frame carrying this packet from `src` to `dst` into `out`; returns its
    /// length (42), or `None` if `out` is too small.
    pub fn write_frame(&self, src: MacAddr, dst: MacAddr, out: &mut [u8]) -> Option<usize> {
        let f = out.get_mut(..14 + ARP_LEN)?;
        f[0..6].copy_from_slice(&dst.0);
        f[6..12].copy_from_slice(&src.0);
        f[12..14].copy_from_slice(&[0x08, 0x06]);
        let a = &mut f[14..];
        a[0..6].copy_from_slice(&[0, 1, 0x08, 0x00, 6, 4]);
        put16(a, 6, self.op);
        a[8..14].copy_from_slice(&self.sha.0);
        a[14..18].copy_from_slice(&self.spa.octets());
        a[18..24].copy_from_slice(&self.tha.0);
        a[24..28].copy_from_slice(&self.tpa.octets());
        Some(14 + ARP_LEN)
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn tcp_rst_refuses_a_syn_like_linux() {
        let mut f = Vec::new();
        etherparse::PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
            .ipv4([10, 244, 1, 2], [10, 96, 0, 10], 64)
            .tcp(40000, 80, 1000, 64240)
            .syn()
            .write(&mut f, &[])
            .unwrap();
        let mut out = [0u8; 128];
        let gw = MacAddr([2, 0, 0, 0, 0, 2]);
        let pod = MacAddr([2, 0, 0, 0, 0, 1]);
        let n = write_tcp_rst(&mut out, gw, pod, &f[14..], 20).unwrap();
        let p = etherparse::SlicedPacket::from_ethernet(&out[..n]).unwrap();
        let Some(etherparse::NetSlice::Ipv4(ip)) = &p.net else {
            panic!("not IPv4")
        };
        let Some(etherparse::TransportSlice::Tcp(t)) = &p.transport else {
            panic!("not TCP")
        };
        assert_eq!(ip.header().source(), [10, 96, 0, 10]);
        assert_eq!(ip.header().destination(), [10, 244, 1, 2]);
        assert_eq!((t.source_port(), t.destination_port()), (80, 40000));
        assert!(t.rst() && t.ack() && !t.syn());
        assert_eq!((t.sequence_number(), t.acknowledgment_number()), (0, 1001));
        let want = t
            .to_header()
            .calc_checksum_ipv4(&ip.header().to_header(), &[])
            .unwrap();
        assert_eq!(t.checksum(), want);
        assert_eq!(checksum(&out[14..34]), 0);
        // A reset is never answered with a reset.
        assert!(write_tcp_rst(&mut [0u8; 128], pod, gw, &out[14..n], 20).is_none());
    }

    use super::*;
    use etherparse::{Icmpv4Type, NetSlice, PacketBuilder, SlicedPacket, TransportSlice};

    fn udp_frame(payload: usize, df: bool, ttl: u8) -> Vec<u8> {
        let mut f = Vec::new();
        let mut ip = etherparse::Ipv4Header::new(
            (8 + payload) as u16,
            ttl,
            etherparse::IpNumber::UDP,
            [10, 0, 0, 1],
            [10, 0, 1, 2],
        )
        .unwrap();
        ip.dont_fragment = df;
        ip.identification = 0x1234;
        PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
            .ip(etherparse::IpHeaders::Ipv4(ip, Default::default()))
            .udp(1000, 2000)
            .write(&mut f, &vec![0xab; payload])
            .unwrap();
        f
    }

    #[test]
    fn header_checks_and_ttl_decrement_keep_a_valid_checksum() {
        let mut f = udp_frame(100, false, 64);
        let info = check_header(&f[14..]).unwrap();
        assert_eq!(info.ttl, 64);
        for _ in 0..63 {
            decrement_ttl(&mut f[14..]);
            check_header(&f[14..]).unwrap();
        }
        assert_eq!(check_header(&f[14..]).unwrap().ttl, 1);
        f[14 + 10] ^= 1;
        assert_eq!(check_header(&f[14..]), Err(DropReason::BadIpChecksum));
        assert_eq!(check_header(&f[14..30]), Err(DropReason::BadIpHeader));
        for n in 0..f.len() {
            let _ = check_header(&f[14.min(n)..n]);
        }
    }

    #[test]
    fn icmp_error_quotes_the_original_and_parses() {
        let f = udp_frame(1000, true, 1);
        let info = check_header(&f[14..]).unwrap();
        assert!(may_send_icmp_error(&f[14..], &info, false));
        let mut out = [0u8; 700];
        let n = write_icmp_error(
            &mut out,
            MacAddr::local(9),
            MacAddr::local(1),
            Ipv4Addr::new(10, 0, 0, 254),
            info.src,
            icmp::DEST_UNREACH,
            icmp::FRAG_NEEDED,
            1400,
            &f[14..],
        )
        .unwrap();
        assert_eq!(n, 14 + 576);
        let p = SlicedPacket::from_ethernet(&out[..n]).unwrap();
        let Some(NetSlice::Ipv4(ip)) = p.net else {
            panic!()
        };
        assert_eq!(ip.header().source_addr(), Ipv4Addr::new(10, 0, 0, 254));
        assert_eq!(check_header(&out[14..n]).unwrap().total_len, 576);
        let Some(TransportSlice::Icmpv4(i)) = p.transport else {
            panic!()
        };
        assert_eq!(checksum(&out[34..n]), 0);
        match i.icmp_type() {
            Icmpv4Type::DestinationUnreachable(d) => {
                assert_eq!(
                    d,
                    etherparse::icmpv4::DestUnreachableHeader::FragmentationNeeded {
                        next_hop_mtu: 1400
                    }
                )
            }
            t => panic!("{t:?}"),
        }
        assert_eq!(&out[42..62], &f[14..34], "original header quoted");
    }

    #[test]
    fn no_icmp_error_about_icmp_errors_or_later_fragments() {
        let mut f = Vec::new();
        PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 2])
            .ipv4([10, 0, 0, 1], [10, 0, 1, 2], 1)
            .icmpv4(Icmpv4Type::TimeExceeded(
                etherparse::icmpv4::TimeExceededCode::TtlExceededInTransit,
            ))
            .write(&mut f, &[0; 28])
            .unwrap();
        let info = check_header(&f[14..]).unwrap();
        assert!(!may_send_icmp_error(&f[14..], &info, false));
        let g = udp_frame(10, false, 5);
        let mut info = check_header(&g[14..]).unwrap();
        assert!(!may_send_icmp_error(&g[14..], &info, true));
        info.frag = 3;
        assert!(!may_send_icmp_error(&g[14..], &info, false));
    }

    #[test]
    fn echo_reply_swaps_and_checksums() {
        let mut f = Vec::new();
        PacketBuilder::ethernet2([2, 0, 0, 0, 0, 1], [2, 0, 0, 0, 0, 9])
            .ipv4([10, 0, 0, 1], [10, 0, 0, 254], 64)
            .icmpv4_echo_request(7, 3)
            .write(&mut f, b"ping payload")
            .unwrap();
        let info = check_header(&f[14..]).unwrap();
        assert!(echo_reply_in_place(&mut f, 14, &info, MacAddr::local(9)));
        let p = SlicedPacket::from_ethernet(&f).unwrap();
        let Some(NetSlice::Ipv4(ip)) = p.net else {
            panic!()
        };
        assert_eq!(ip.header().destination_addr(), Ipv4Addr::new(10, 0, 0, 1));
        assert_eq!(&f[0..6], &[2, 0, 0, 0, 0, 1]);
        check_header(&f[14..]).unwrap();
        let Some(TransportSlice::Icmpv4(i)) = p.transport else {
            panic!()
        };
        assert!(matches!(i.icmp_type(), Icmpv4Type::EchoReply(h) if h.id == 7 && h.seq == 3));
        assert_eq!(checksum(&f[34..]), 0);
    }

    #[test]
    fn fragments_reassemble_to_the_original() {
        let f = udp_frame(3000, false, 64);
        let info = check_header(&f[14..]).unwrap();
        let mut scratch = [0u8; 2000];
        let mut frags: Vec<Vec<u8>> = Vec::new();
        let n = fragment(&f, 14, &info, 1500, &mut scratch, &mut |fr| {
            frags.push(fr.to_vec())
        })
        .unwrap();
        assert_eq!(n, 3);
        let mut payload = Vec::new();
        for (i, fr) in frags.iter().enumerate() {
            let fi = check_header(&fr[14..]).unwrap();
            assert!(fi.total_len <= 1500);
            assert_eq!(usize::from(fi.frag & 0x1fff) * 8, payload.len());
            assert_eq!(fi.frag & MF != 0, i < 2);
            payload.extend_from_slice(&fr[14 + fi.hdr_len..14 + fi.total_len]);
        }
        assert_eq!(payload, f[34..]);
        assert_eq!(
            fragment(&f, 14, &info, 20, &mut scratch, &mut |_| {}),
            Err(DropReason::FragNeeded)
        );
    }

    #[test]
    fn arp_round_trip() {
        let a = Arp {
            op: Arp::REQUEST,
            sha: MacAddr::local(1),
            spa: Ipv4Addr::new(10, 0, 0, 1),
            tha: MacAddr::ZERO,
            tpa: Ipv4Addr::new(10, 0, 0, 2),
        };
        let mut out = [0u8; 64];
        let n = a
            .write_frame(MacAddr::local(1), MacAddr::BROADCAST, &mut out)
            .unwrap();
        assert_eq!(Arp::parse(&out[14..n]).unwrap(), a);
        assert!(Arp::parse(&out[14..n - 1]).is_err());
        let s = crate::wire::Summary::parse(&out[..n]);
        assert_eq!(s.arp.unwrap().0, 1);
    }
}
