//! What the router writes itself about a packet, the same for both families: the ICMP error
//! (as Linux's `icmp_send` / `icmp6_send`: type, code and second word from the family's
//! [`RouterFamily::icmp_head`], the quote cut to the family's largest error) and the TCP reset
//! refusing a segment (as Linux's `nf_send_reset` / `nf_send_reset6`).

use crate::narrow::low32;
use crate::wire::family::{emit_frame, pseudo_header, IpHead, IpProto};
use crate::wire::icmp::{self, IcmpPacket};
use crate::wire::mac::MacAddr;
use crate::wire::tcp::{TcpPacket, TcpRepr};

use super::forward::RouterFamily;

/// The first word of an ICMP error: type, code, and the 32-bit field after the checksum (the
/// next-hop MTU of "fragmentation needed", the MTU of "packet too big").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct IcmpHead {
    /// The ICMP type.
    pub(crate) ty: u8,
    /// The code.
    pub(crate) code: u8,
    /// The second word.
    pub(crate) rest: u32,
}

/// Writes an Ethernet + IP + ICMP error `head` about the packet `orig_l3` into `out`, quoting
/// as much of the original datagram as fits in the family's largest error
/// ([`Family::ICMP_ERROR_MAX`](crate::wire::family::Family::ICMP_ERROR_MAX): 576 bytes,
/// 1280 bytes), TTL / hop limit 64 (IPv4: type of service "internetwork control", as
/// Linux). Returns the frame length, or `None` when `out` is too small.
pub(crate) fn write_icmp_error<A: RouterFamily>(
    out: &mut [u8],
    macs: (MacAddr, MacAddr),
    (src, dst): (A, A),
    head: IcmpHead,
    orig_l3: &[u8],
) -> Option<usize> {
    let quote = orig_l3
        .len()
        .min(A::ICMP_ERROR_MAX - A::HEADER_LEN - icmp::HEADER_LEN);
    let ip = IpHead {
        src,
        dst,
        proto: A::ICMP,
        payload_len: icmp::HEADER_LEN + quote,
        ttl: 64,
        tos: 0xc0,
        dont_frag: false,
    };
    emit_frame(out, macs, &ip, |p| {
        let mut m = IcmpPacket::<_, A>::new_unchecked(p);
        m.set_msg_type(head.ty);
        m.set_code(head.code);
        m.set_rest(head.rest);
        m.data_mut().copy_from_slice(&orig_l3[..quote]);
        m.fill_checksum_between(src, dst);
    })
}

/// Writes the TCP reset that refuses the segment in the datagram `orig_l3` (its header
/// checked, facts in `info`), as Linux's `nf_send_reset` / `nf_send_reset6` for `REJECT
/// --reject-with tcp-reset` (see [`TcpRepr::reset_for`]): back to the sender, TTL / hop limit
/// 64 (IPv4: DF). Returns the frame length, or `None` when `out` is too small, the datagram
/// has no TCP header ([`RouterFamily::tcp_segment`]), or the segment is itself a reset.
pub(crate) fn write_tcp_rst<A: RouterFamily>(
    out: &mut [u8],
    macs: (MacAddr, MacAddr),
    orig_l3: &[u8],
    info: &A::Info,
) -> Option<usize> {
    let seg = TcpPacket::new_checked(A::tcp_segment(orig_l3, info)?).ok()?;
    let rst = TcpRepr::reset_for(&seg)?;
    let f = A::facts(info);
    let (src, dst) = (f.dst, f.src);
    let len = rst.buffer_len();
    let ip = IpHead {
        src,
        dst,
        proto: IpProto::TCP,
        payload_len: len,
        ttl: 64,
        tos: 0,
        dont_frag: true,
    };
    emit_frame(out, macs, &ip, |p| {
        let mut t = TcpPacket::new_unchecked(p);
        // The checksum over the family's pseudo-header, below.
        let none = std::net::Ipv4Addr::UNSPECIFIED;
        rst.emit(&mut t, none, none);
        t.fill_checksum_with(&pseudo_header(src, dst, IpProto::TCP, low32(len as u64)));
    })
}
