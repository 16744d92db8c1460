//! The IPv4 half of the router: what IPv4 does differently from IPv6 ([`RouterFamily`] for
//! [`Ipv4Addr`]): ARP (answering for the interfaces' addresses and, with `proxy_arp`, for
//! routed ones; resolving next hops), directed broadcasts, fragmentation as Linux's
//! `ip_fragment` (IPv4 options without the "copied" bit dropped after the first fragment),
//! and the IPv4 shapes of the ICMP errors, echo replies and TCP resets the router sends.
//! IPv4 options are forwarded untouched (no record-route or timestamp processing).

use std::net::Ipv4Addr;

use crate::base::IfaceId;
use crate::buf::PacketBuf;
use crate::l3::neigh::ArpHeard;
use crate::l3::route::{mask, RouteReader};
use crate::narrow::len16;
use crate::stats::DropReason;
use crate::time::Instant;
use crate::wire::arp::{self, ArpRepr};
use crate::wire::ethernet::{copy_readdressed, EthernetFrame, HEADER_LEN as ETH_LEN};
use crate::wire::family::IpProto;
use crate::wire::icmp::{self as icmpv4, codes as icmp, Icmpv4Packet};
use crate::wire::ipv4::{self, Ipv4Info, Ipv4Packet, DF, FRAG_OFFSET, HEADER_LEN, MF, PROTO_ICMP};
use crate::wire::mac::MacAddr;

use super::forward::{Egress, Facts, IcmpError, RouterFamily, Rx};
use super::reply::IcmpHead;
use super::{Iface, L3Batch, Memo, Router, Sink, L3};

impl RouterFamily for Ipv4Addr {
    type Info = Ipv4Info;
    const TOO_BIG: DropReason = DropReason::FragNeeded;

    #[inline(always)]
    fn check(l3: &[u8]) -> Result<Ipv4Info, DropReason> {
        ipv4::check_header(l3)
    }
    #[inline(always)]
    fn facts(i: &Ipv4Info) -> Facts<Ipv4Addr> {
        let proto = IpProto(i.proto);
        Facts {
            src: i.src,
            dst: i.dst,
            ttl: i.ttl,
            proto,
            total_len: i.total_len,
            l4_off: i.hdr_len,
        }
    }
    #[inline(always)]
    fn may_fragment(i: &Ipv4Info) -> bool {
        !i.dont_fragment()
    }
    #[inline(always)]
    fn is_fragment(i: &Ipv4Info) -> bool {
        i.is_fragment()
    }
    #[inline(always)]
    fn decrement_ttl(l3: &mut [u8]) {
        Ipv4Packet::new_unchecked(l3).decrement_ttl();
    }

    #[inline(always)]
    fn memo<'b>(batch: &'b mut L3Batch<'_>) -> &'b mut Memo<Ipv4Addr> {
        &mut batch.memo4
    }
    #[inline(always)]
    fn routes<'b, 'a>(batch: &'b mut L3Batch<'a>) -> &'b RouteReader<'a, Ipv4Addr> {
        &batch.routes
    }
    fn solicit(
        r: &Router,
        i: IfaceId,
        target: Ipv4Addr,
        unicast: Option<MacAddr>,
        sink: &mut dyn Sink,
    ) {
        r.send_arp_request(i, target, unicast, sink);
    }
    #[inline(always)]
    fn early(_: &Router, _: &PacketBuf, rx: Rx, _: &Ipv4Info, _: &mut dyn Sink) -> Option<L3> {
        // IPv4 multicast and broadcast are not routed.
        rx.group.then_some(L3::Drop(DropReason::L3Multicast))
    }
    #[inline]
    fn unroutable_dst(r: &Router, dst: Ipv4Addr) -> Option<DropReason> {
        (dst.is_broadcast() || dst.is_multicast() || r.is_directed_broadcast(dst))
            .then_some(DropReason::L3Multicast)
    }
    #[inline(always)]
    fn unroutable_src(_: &Ipv4Info) -> Option<DropReason> {
        None
    }
    fn refuse_local(iface: &Iface) -> Option<DropReason> {
        // IPv4 to the router on an interface that has no IPv4 address (see
        // `IfaceConfig::addr`).
        iface.cfg.addr.is_none().then_some(DropReason::NoIpv4Addr)
    }
    #[cold]
    #[inline(never)]
    fn fragment(
        r: &Router,
        b: &mut PacketBuf,
        l3: usize,
        info: &Ipv4Info,
        out: Egress<Ipv4Addr>,
        sink: &mut dyn Sink,
    ) -> L3 {
        r.fragment_out(b, l3, info, out, sink)
    }

    type SourceKey = u64;
    const NO_SOURCE: u64 = u64::MAX;
    #[inline(always)]
    fn source_key(src: Ipv4Addr) -> u64 {
        u64::from(u32::from_ne_bytes(src.octets()))
    }
    fn martian_src(r: &Router, src: Ipv4Addr, dst: Ipv4Addr) -> bool {
        martian_src(src, dst) || r.is_directed_broadcast(src)
    }

    fn may_send_icmp_error(l3: &[u8], info: &Ipv4Info, l2_group_dst: bool) -> bool {
        ipv4::may_send_icmp_error(l3, info, l2_group_dst)
    }
    fn icmp_head(err: IcmpError) -> IcmpHead {
        let (ty, code, rest) = match err {
            IcmpError::TtlExceeded => (icmp::TIME_EXCEEDED, icmp::TTL_EXCEEDED, 0),
            IcmpError::NoRoute => (icmp::DEST_UNREACH, icmp::NET_UNREACH, 0),
            IcmpError::Unreachable | IcmpError::NeighFailed => {
                (icmp::DEST_UNREACH, icmp::HOST_UNREACH, 0)
            }
            IcmpError::PortUnreachable => (icmp::DEST_UNREACH, icmp::PORT_UNREACH, 0),
            IcmpError::Prohibited => (icmp::DEST_UNREACH, icmp::ADMIN_PROHIBITED, 0),
            IcmpError::TooBig { mtu } => (icmp::DEST_UNREACH, icmp::FRAG_NEEDED, u32::from(mtu)),
        };
        IcmpHead { ty, code, rest }
    }
    fn icmp_route(r: &Router, dst: Ipv4Addr, _: Option<IfaceId>) -> Option<(IfaceId, Ipv4Addr)> {
        r.routes.lookup(dst)?.hop(dst)
    }
    fn src_for(r: &Router, i: IfaceId, _: Ipv4Addr) -> Option<Ipv4Addr> {
        r.src4(r.iface(i)?)
    }
    fn set_icmp_src(ip: &mut [u8], src: Ipv4Addr, _: Ipv4Addr) {
        // The ICMP checksum covers no pseudo-header: only the IP header's changes.
        let mut p = Ipv4Packet::new_unchecked(ip);
        p.set_src_addr(src);
        p.fill_checksum();
    }
    fn echo_reply(frame: &mut [u8], l3: usize, info: &Ipv4Info, our_mac: MacAddr) -> Option<usize> {
        echo_reply_in_place(frame, l3, info, our_mac).then_some(l3 + info.total_len)
    }
    fn tcp_segment<'a>(orig_l3: &'a [u8], info: &Ipv4Info) -> Option<&'a [u8]> {
        // Re-checked: the header must be the one `info` describes.
        let ip = Ipv4Packet::new_checked(orig_l3).ok()?;
        if ip.header_len() != info.hdr_len || info.is_later_fragment() {
            return None;
        }
        orig_l3.get(info.hdr_len..ip.total_len())
    }
}

/// True when `src` is an IPv4 martian source by its range, as Linux's `ip_route_input_slow`:
/// `0.0.0.0/8` (but `0.0.0.0` itself to the limited broadcast, a DHCP client's, which is
/// not forwarded anyway), loopback `127.0.0.0/8` (Linux's `route_localnet` off), multicast
/// `224.0.0.0/4`, the limited broadcast, and the reserved `240.0.0.0/4` (class E: dropped as
/// nothing in a cluster uses it).
fn martian_src(src: Ipv4Addr, dst: Ipv4Addr) -> bool {
    let first = src.octets()[0];
    if first == 0 {
        return !(src.is_unspecified() && dst.is_broadcast());
    }
    first == 127 || first >= 224
}

impl Router {
    /// Processes an ARP packet: `Ok` when it was taken in (learned from, answered, or an
    /// ordinary request or reply the router had no use for); `Err(BadArp)` when it is refused
    /// (malformed or not Ethernet/IPv4, an operation other than request or reply, a sender
    /// MAC that is not the frame's source or not a station address, a sender claiming the
    /// interface's own address), so that a frame not forwarded is counted under its reason.
    pub(super) fn arp_input(
        &self,
        frame: &[u8],
        l3: usize,
        in_if: IfaceId,
        now: Instant,
        sink: &mut dyn Sink,
    ) -> Result<(), DropReason> {
        let Some(iface) = self.iface(in_if) else {
            return Err(DropReason::NotForRouter);
        };
        let (Ok(eth), Some(a)) = (
            EthernetFrame::new_checked(frame),
            ArpRepr::parse_bytes(frame.get(l3..).unwrap_or(&[])),
        ) else {
            return Err(DropReason::BadArp);
        };
        // Linux's arp_process takes requests and replies only.
        if a.operation != arp::REQUEST && a.operation != arp::REPLY {
            return Err(DropReason::BadArp);
        }
        // Never learn from a frame whose Ethernet source disagrees with its ARP sender, nor
        // from ARP probes (sender 0.0.0.0) or from our own addresses.
        let l2_src = eth.src_addr();
        let own = iface.cfg.addr4();
        if a.sha != l2_src || !a.sha.is_station() || Some(a.spa) == own {
            return Err(DropReason::BadArp);
        }
        // An interface without an IPv4 address answers no ARP (not even proxy ARP).
        let for_us = Some(a.tpa) == own;
        if !a.spa.is_unspecified() {
            let heard = ArpHeard {
                op: a.operation.into(),
                sender_ip: a.spa,
                sender_mac: a.sha,
                target_ip: a.tpa,
                target_is_local: for_us,
            };
            let _ = self.neigh.input(in_if, heard, now, &mut |rel| {
                self.counters.released.add(1);
                let mac = rel.mac;
                let Some(src) = self.iface(rel.iface).map(|i| i.cfg.mac) else {
                    return;
                };
                sink.emit(rel.iface, &mut |out| {
                    copy_readdressed(out, &rel.frame, src, mac)
                });
            });
        }
        if a.operation != arp::REQUEST {
            return Ok(());
        }
        let answer = for_us
            || (iface.cfg.proxy_arp
                && own.is_some()
                && a.tpa != a.spa
                && matches!(self.routes.lookup(a.tpa), Some(nh) if nh.iface().is_some_and(|e| e != in_if)));
        if !answer {
            return Ok(());
        }
        self.counters.arp_replies.add(1);
        let reply = ArpRepr {
            operation: arp::REPLY,
            sha: iface.cfg.mac,
            spa: a.tpa,
            tha: a.sha,
            tpa: a.spa,
        };
        let src = iface.cfg.mac;
        sink.emit(in_if, &mut |out| reply.write_frame(src, a.sha, out));
        Ok(())
    }

    fn is_directed_broadcast(&self, dst: Ipv4Addr) -> bool {
        self.ifaces.iter().any(|i| {
            i.cfg.addr.is_some_and(|(a, len)| {
                len < 31
                    && mask(dst, len) == mask(a, len)
                    && u32::from(dst) | (u32::MAX << (32 - u32::from(len))) == u32::MAX
            })
        })
    }

    pub(super) fn send_arp_request(
        &self,
        out_if: IfaceId,
        target: Ipv4Addr,
        unicast: Option<MacAddr>,
        sink: &mut dyn Sink,
    ) {
        let Some(i) = self.iface(out_if) else { return };
        // Out of an IPv6-only interface (a `dev` route): another interface's address, as
        // Linux's `arp_solicit`; on a node without any IPv4 address, no request.
        let Some(spa) = self.src4(i) else { return };
        self.counters.arp_requests.add(1);
        let req = ArpRepr {
            operation: arp::REQUEST,
            sha: i.cfg.mac,
            spa,
            tha: MacAddr::ZERO,
            tpa: target,
        };
        let src = i.cfg.mac;
        sink.emit(out_if, &mut |out| {
            req.write_frame(src, unicast.unwrap_or(MacAddr::BROADCAST), out)
        });
    }

    /// Fragments the datagram in `b` (TTL decremented) for `out.mtu` and sends the fragments
    /// (or queues them on their next hop); the original is consumed.
    fn fragment_out(
        &self,
        b: &mut PacketBuf,
        l3: usize,
        info: &Ipv4Info,
        out: Egress<Ipv4Addr>,
        sink: &mut dyn Sink,
    ) -> L3 {
        // Fragments are built from the datagram's bytes: finish a partial checksum first.
        if b.offload.needs_csum() {
            let hdr = b.offload;
            if crate::offload::complete_checksum(b.frame_mut(), &hdr).is_err() {
                return L3::Drop(DropReason::BadOffload);
            }
            b.offload = crate::Offload::default();
        }
        let info = Ipv4Info {
            ttl: info.ttl - 1,
            ..*info
        };
        let mac = self.neigh.lookup(out.iface, out.nh, out.now);
        let mut scratch = [0u8; 9216 + 64];
        let r = fragment(
            b.frame(),
            l3,
            &info,
            out.mtu,
            &mut scratch,
            &mut |f| match mac {
                Some(m) => sink.emit(out.iface, &mut |o| copy_readdressed(o, f, out.mac, m)),
                None => {
                    let _ = self.resolve_later(out.iface, out.nh, f, out.now, sink);
                }
            },
        );
        match r {
            Ok(_) => L3::Local,
            Err(reason) => L3::Drop(reason),
        }
    }
}

/// Turns an ICMP echo request frame addressed to us into the echo reply, in place: addresses
/// swapped (IP and MAC, with `our_mac` as the source), type 0, TTL 64, checksums updated.
/// `l3` is the frame's L3 offset. Returns `false` (frame untouched) if it is not a well-formed
/// echo request.
pub(crate) fn echo_reply_in_place(
    frame: &mut [u8],
    l3: usize,
    info: &Ipv4Info,
    our_mac: MacAddr,
) -> bool {
    if info.proto != PROTO_ICMP || l3 < ETH_LEN {
        return false;
    }
    let Some(ipb) = frame.get(l3..) else {
        return false;
    };
    let Ok(ip) = Ipv4Packet::new_checked(ipb) else {
        return false;
    };
    let Ok(req) = Icmpv4Packet::new_checked(ip.payload()) else {
        return false;
    };
    if req.msg_type() != icmpv4::codes::ECHO_REQUEST || req.code() != 0 || !req.verify_checksum() {
        return false;
    }
    let (src, dst) = (ip.src_addr(), ip.dst_addr());
    let mut eth = EthernetFrame::new_unchecked(&mut *frame);
    let peer = eth.src_addr();
    eth.set_dst_addr(peer);
    eth.set_src_addr(our_mac);
    let mut ip = Ipv4Packet::new_unchecked(&mut frame[l3..]);
    ip.set_src_addr(dst);
    ip.set_dst_addr(src);
    ip.set_ttl(64);
    ip.fill_checksum();
    let mut icmp = Icmpv4Packet::new_unchecked(ip.payload_mut());
    icmp.set_msg_type(icmpv4::codes::ECHO_REPLY);
    icmp.fill_checksum();
    true
}

/// Splits the IPv4 datagram in `frame` (Ethernet header, then IPv4 at `l3`) into fragments
/// whose IP length is at most `mtu`, writing each complete frame into `scratch` and handing it
/// to `emit`, as Linux's `ip_fragment`: payload cut at multiples of 8 bytes, MF and offsets set,
/// options without the "copied" bit replaced by NOPs after the first fragment, checksums
/// recomputed. Returns the number of fragments, or an error when the packet cannot be split
/// (`mtu` smaller than header + 8 bytes, or `scratch` too small).
pub(crate) fn fragment(
    frame: &[u8],
    l3: usize,
    info: &Ipv4Info,
    mtu: usize,
    scratch: &mut [u8],
    emit: &mut dyn FnMut(&[u8]),
) -> Result<usize, DropReason> {
    let ip = frame
        .get(l3..)
        .and_then(|b| Ipv4Packet::new_checked(b).ok())
        .filter(|p| p.header_len() == info.hdr_len && p.total_len() == info.total_len)
        .ok_or(DropReason::FragNeeded)?;
    let hl = info.hdr_len;
    if mtu < hl + 8 {
        return Err(DropReason::FragNeeded);
    }
    let per = (mtu - hl) & !7;
    let payload = ip.payload();
    let base_off = usize::from(info.frag & FRAG_OFFSET) * 8;
    let orig_mf = info.frag & MF;
    let mut hdr = [0u8; 60];
    hdr[..hl].copy_from_slice(ip.header());
    let mut n = 0;
    let mut at = 0;
    loop {
        let chunk = per.min(payload.len() - at);
        let last = at + chunk >= payload.len();
        let flen = l3 + hl + chunk;
        let out = scratch.get_mut(..flen).ok_or(DropReason::FragNeeded)?;
        out[..l3].copy_from_slice(&frame[..l3]);
        out[l3..l3 + hl].copy_from_slice(&hdr[..hl]);
        let mut p = Ipv4Packet::new_unchecked(&mut out[l3..]);
        p.set_total_len(len16(hl + chunk));
        let off = (base_off + at) / 8;
        let mf = if last { orig_mf } else { MF };
        p.set_frag_field((info.frag & DF) | mf | (len16(off) & FRAG_OFFSET));
        p.fill_checksum();
        p.payload_mut().copy_from_slice(&payload[at..at + chunk]);
        emit(&out[..flen]);
        n += 1;
        if n == 1 {
            strip_uncopied_options(&mut hdr[HEADER_LEN..hl]);
        }
        at += chunk;
        if last {
            break;
        }
    }
    Ok(n)
}

/// Replaces IPv4 options whose "copied" bit is clear with NOPs (Linux `ip_options_fragment`).
/// `opts` is the options area (after the 20 fixed bytes).
fn strip_uncopied_options(opts: &mut [u8]) {
    const END: u8 = 0;
    const NOP: u8 = 1;
    const COPIED: u8 = 0x80;
    let mut i = 0;
    while i < opts.len() {
        match opts[i] {
            END => break,
            NOP => i += 1,
            ty => {
                let Some(&l) = opts.get(i + 1) else { break };
                let l = usize::from(l);
                if l < 2 || i + l > opts.len() {
                    break;
                }
                if ty & COPIED == 0 {
                    opts[i..i + l].fill(NOP);
                }
                i += l;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::reply::{write_icmp_error, write_tcp_rst};
    use super::*;
    use crate::wire::checksum::checksum;
    use crate::wire::ipv4::check_header;
    use crate::wire::ipv4::tests::udp_frame;
    use etherparse::{Icmpv4Type, NetSlice, PacketBuilder, SlicedPacket, TransportSlice};

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
        let info = check_header(&f[14..]).unwrap();
        let n = write_tcp_rst::<Ipv4Addr>(&mut out, (gw, pod), &f[14..], &info).unwrap();
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
        let rst = check_header(&out[14..n]).unwrap();
        assert!(write_tcp_rst::<Ipv4Addr>(&mut [0u8; 128], (pod, gw), &out[14..n], &rst).is_none());
    }

    #[test]
    fn icmp_error_quotes_the_original_and_parses() {
        let f = udp_frame(1000, true, 1);
        let info = check_header(&f[14..]).unwrap();
        assert!(ipv4::may_send_icmp_error(&f[14..], &info, false));
        let mut out = [0u8; 700];
        let error = IcmpHead {
            ty: icmp::DEST_UNREACH,
            code: icmp::FRAG_NEEDED,
            rest: 1400,
        };
        let macs = (MacAddr::local(9), MacAddr::local(1));
        let ips = (Ipv4Addr::new(10, 0, 0, 254), info.src);
        let n = write_icmp_error(&mut out, macs, ips, error, &f[14..]).unwrap();
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
}
