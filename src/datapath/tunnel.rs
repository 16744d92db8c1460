//! Where VXLAN plugs into the pipeline: decapsulation of frames arriving on an uplink (before
//! the router sees them), encapsulation of packets the router forwards into a VXLAN
//! interface (after its routing decision, MTU check and TTL decrement). The control calls
//! that add and remove peers with the route and neighbour each implies are in `peers`
//! ([`Control::add_vxlan_peer`](super::Control::add_vxlan_peer)).
//!
//! ```text
//!  uplink port ──► classify (ROUTED, OURS) ──► decap? ── UDP to local:port ──► checks ──►
//!      inner frame, received on the VXLAN interface ──► Router::input ──► ... (cni0)
//!  pod ──► Router::input ──► route via <peer gw> dev flannel.1 ──► Forward(flannel.1) ──►
//!      encap: peer by inner dst MAC, outer route + ARP on the uplink ──► Output(uplink)
//! ```
//!
//! Super-frames: a TSO super-frame from a pod is encapsulated whole over either underlay
//! (GSO type + `VIRTIO_NET_HDR_GSO_UDP_TUNNEL_IPV4` or `_IPV6`, `csum_start` and `hdr_len`
//! moved past the outer headers, the outer UDP checksum left partial over the whole
//! super-frame, its outer lengths capped at 65535); an uplink TAP with UDP-tunnel GSO takes
//! it as it is and the kernel segments it, replicating the outer headers; any other port
//! (an offload TAP without UDP-tunnel GSO, a plain TAP, an in-memory port, a super-frame
//! whose outer length does not fit 16 bits) segments it in software (`offload::segment`:
//! outer lengths, over IPv4 the identification and header checksum, and each outer UDP
//! checksum rewritten per segment, never zero). So no segment goes through the batch's
//! extra frames ([`super::MAX_EXTRA`]), and none is lost there. The inner frame may be
//! TCP/IPv4 or TCP/IPv6 over either underlay (IPv6 pods ride `flannel.1` on a node without
//! an IPv6 underlay, Flannel's `flannel-v6.1` on one with), as Linux allows; a TCP/IPv6
//! one, and any over IPv6, has its virtio header checked first as the kernel's
//! `virtio_net_hdr_tnl_to_skb` will check it (a lie is `bad_offload`). A super-frame whose outer next hop is not resolved yet is segmented
//! into the neighbour's queue. A UDP-tunnel super-frame from an uplink TAP is decapsulated
//! whole into an inner TCP super-frame (its header checked: TCP inside, partial inner
//! checksum, a `csum_start` inside the inner frame; a lie is `bad_offload`), so that a
//! pod's offload TAP takes it whole too.
//!
//! Nothing here allocates per packet or takes a lock: the peer set is read through one
//! `ArcSwap` load. The outer packets are not seen by conntrack (they are not routed through
//! the hook), unlike Linux, where the host's conntrack also tracks the UDP flow.

use std::net::{Ipv4Addr, Ipv6Addr};

use super::Datapath;
use crate::base::{IfaceId, Verdict};
use crate::buf::{Offload, PacketBuf};
use crate::l3::route::{NextHop, RouteReader};
use crate::l3::router::{RouterFamily, Sink, L3};
use crate::l3::vxlan::Tunnel;
use crate::narrow::{len16, low16};
use crate::stats::DropReason;
use crate::time::Instant;
use crate::wire::ethernet::{ethertype, EthernetFrame, HEADER_LEN as ETH_LEN};
use crate::wire::family::IpProto;
use crate::wire::ipv4::{self, Ipv4Info, FRAG_OFFSET, MF};
use crate::wire::ipv6::{self, Ipv6Info};
use crate::wire::mac::MacAddr;
use crate::wire::udp::UdpPacket;
use crate::wire::virtio::{
    VIRTIO_NET_HDR_F_DATA_VALID, VIRTIO_NET_HDR_F_NEEDS_CSUM, VIRTIO_NET_HDR_GSO_ECN,
    VIRTIO_NET_HDR_GSO_TCPV4, VIRTIO_NET_HDR_GSO_TCPV6, VIRTIO_NET_HDR_GSO_UDP_TUNNEL_IPV4,
    VIRTIO_NET_HDR_GSO_UDP_TUNNEL_IPV6,
};
use crate::wire::vxlan::{self, DecapError, Outer, OuterInfo, OuterIp, OVERHEAD};

impl Datapath {
    /// The VXLAN interface that is router interface `i`, if any.
    #[inline(always)]
    pub(super) fn tunnel_of(&self, i: IfaceId) -> Option<&Tunnel> {
        if self.tunnels.is_empty() {
            return None;
        }
        self.find_tunnel(i)
    }

    /// [`Datapath::tunnel_of`]'s search, out of line (one compare inline when no tunnel).
    #[inline(never)]
    fn find_tunnel(&self, i: IfaceId) -> Option<&Tunnel> {
        self.tunnels.iter().find(|t| t.iface == i)
    }

    /// Decapsulates a frame received on uplink interface `up` when it is VXLAN for one of
    /// the uplink's tunnels: `None` when it is not (routed as usual), the tunnel interface it
    /// is now received on (the frame is the inner one), or the drop reason.
    #[inline(never)]
    pub(super) fn decap(
        &self,
        b: &mut PacketBuf,
        up: IfaceId,
    ) -> Option<Result<IfaceId, DropReason>> {
        if !self.tunnels.iter().any(|t| t.uplink == up) {
            return None;
        }
        let r = self.decap_vxlan(b, up);
        if r.is_none() && b.offload.is_tunnel_gso() {
            // A UDP-tunnel super-frame that is not ours: its layout is not known here.
            return Some(Err(DropReason::BadOffload));
        }
        r
    }

    /// [`Datapath::decap`] for a frame on an uplink with tunnels: IPv4 (Flannel's `flannel.1`)
    /// or IPv6 (`flannel-v6.1`).
    fn decap_vxlan(&self, b: &mut PacketBuf, up: IfaceId) -> Option<Result<IfaceId, DropReason>> {
        match EthernetFrame::new_checked(b.frame()).ok()?.ethertype() {
            ethertype::IPV4 => self.decap_family::<Ipv4Addr>(b, up),
            ethertype::IPV6 => self.decap_family::<Ipv6Addr>(b, up),
            _ => None,
        }
    }

    /// [`Datapath::decap_vxlan`] for an underlay of family `A`: UDP (over IPv6, right after
    /// the fixed header or an extension-header chain), not a fragment, to a tunnel's port and
    /// local address on this uplink; then a VXLAN frame from a known peer (the outer checksum
    /// as [`vxlan::parse_udp`] checks it).
    fn decap_family<A: Underlay>(
        &self,
        b: &mut PacketBuf,
        up: IfaceId,
    ) -> Option<Result<IfaceId, DropReason>> {
        let f = b.frame();
        let info = A::check(f.get(ETH_LEN..)?).ok()?;
        let ip = A::facts(&info);
        if ip.proto != IpProto::UDP || <A as Underlay>::is_fragment(&info) {
            return None;
        }
        let l4 = ETH_LEN + ip.l4_off;
        let dport = UdpPacket::new_checked(f.get(l4..)?).ok()?.dst_port();
        let t = self
            .tunnels
            .iter()
            .find(|t| t.uplink == up && t.cfg.port == dport && t.local == ip.dst.into())?;
        // VXLAN from here on: whatever is wrong is counted under its own reason.
        let set = t.peers();
        let Some(peer) = set.by_ip(ip.src) else {
            return Some(Err(DropReason::VxlanUnknownPeer));
        };
        let tunnel_gso = match rx_tunnel_gso(b.offload, A::GSO_UDP_TUNNEL) {
            Ok(g) => g,
            Err(reason) => return Some(Err(reason)),
        };
        let verify = !csum_trusted(b.offload);
        let outer = OuterIp {
            src: ip.src,
            dst: ip.dst,
            l4,
            end: ETH_LEN + ip.total_len,
        };
        let r = vxlan::parse_udp(f, outer, t.cfg.vni, verify);
        let end = outer.end;
        Some(finish_decap(
            b,
            t,
            peer,
            r,
            end,
            tunnel_gso,
            A::GSO_UDP_TUNNEL,
        ))
    }

    /// Encapsulates a packet the router forwarded into tunnel `t` (its inner MACs are this
    /// VTEP's and the peer's) and sends it towards the peer's node on the underlay: the outer
    /// route and neighbour are looked up as for any packet. `routes` is the batch's table
    /// version (the current one when `None`); without a `sink`, a packet whose outer next hop
    /// is not resolved is dropped (`neigh_failed`) instead of queued. Out of line, so that
    /// the routed path without tunnels keeps its shape.
    #[cold]
    #[inline(never)]
    pub(super) fn encap(
        &self,
        t: &Tunnel,
        b: &mut PacketBuf,
        routes: Option<&RouteReader<'_>>,
        now: Instant,
        sink: Option<&mut dyn Sink>,
    ) -> Verdict {
        if t.local().is_ipv6() {
            self.encap_over::<Ipv6Addr>(t, b, None, now, sink)
        } else {
            self.encap_over::<Ipv4Addr>(t, b, routes, now, sink)
        }
    }

    /// [`Datapath::encap`] over an underlay of family `A`: the outer header from the uplink's
    /// address of the family (IPv4: identification from the peer's counter; IPv6: flow label
    /// 0), the outer UDP checksum always computed (left partial for the port, or from the
    /// inner partial one), the outer next hop from the family's routes and neighbours. A
    /// super-frame is checked first and leaves whole, segmented by the port (see the module
    /// docs).
    #[inline(always)]
    fn encap_over<A: Underlay>(
        &self,
        t: &Tunnel,
        b: &mut PacketBuf,
        routes: Option<&RouteReader<'_, A>>,
        now: Instant,
        sink: Option<&mut dyn Sink>,
    ) -> Verdict {
        let off = b.offload;
        let gso = off.is_gso();
        if gso {
            // Checked first, of either family: the port hands it whole to the kernel or
            // to `offload::segment`, which must not be given a lie.
            if let Err(reason) = check_super_frame(b) {
                return Verdict::Drop(reason);
            }
        }
        let Some(r) = &self.router else {
            return Verdict::Drop(DropReason::NoRoute);
        };
        let Some(dst) = b.frame().get(..6).map(MacAddr::from_slice) else {
            return Verdict::Drop(DropReason::Truncated);
        };
        let set = t.peers();
        let Some(peer) = set.by_mac(dst) else {
            return Verdict::Drop(DropReason::VxlanNoPeer);
        };
        let (Some(node), Some(local)) = (A::from_ip(peer.peer.node_ip), A::from_ip(t.local)) else {
            return Verdict::Drop(DropReason::VxlanNoPeer);
        };
        let nh = match routes {
            Some(rr) => rr.lookup(node),
            None => r.routes::<A>().lookup(node),
        };
        let (out_if, gw) = match nh {
            Some(NextHop::Link(i)) => (i, node),
            Some(NextHop::Via(i, gw)) => (i, gw),
            _ => return Verdict::Drop(DropReason::NoRoute),
        };
        let Some(egress) = r.iface(out_if).filter(|_| self.tunnel_of(out_if).is_none()) else {
            return Verdict::Drop(DropReason::NoRoute);
        };
        let inner_len = b.len();
        let overhead = vxlan::overhead::<A>();
        // A super-frame too long for one outer packet is written with its outer lengths
        // capped and leaves as segments (a port segments it, see `TapPort`'s send).
        if !gso && inner_len + overhead > ETH_LEN + A::MAX_IP_LEN {
            return Verdict::Drop(DropReason::Oversize);
        }
        let outer = Outer::<A> {
            src_mac: egress.cfg.mac,
            dst_mac: r
                .neigh::<A>()
                .lookup(out_if, gw, now)
                .unwrap_or(MacAddr::ZERO),
            src_ip: local,
            dst_ip: node,
            ident: low16(peer.count_tx(inner_len)),
            ttl: t.cfg.ttl,
            tos: 0,
            src_port: t.src_port(b.frame()),
            dst_port: t.cfg.port,
            vni: t.cfg.vni,
        };
        let resolved = outer.dst_mac != MacAddr::ZERO;
        if A::push_outer(&outer, b, inner_len).is_none() {
            return Verdict::Drop(DropReason::Oversize);
        }
        if gso {
            // Segmented (and the outer headers replicated) by the port that sends it: the
            // kernel behind a UDP-tunnel GSO TAP, `offload::segment` for any other port.
            let shift = len16(overhead);
            b.offload.gso_type |= A::GSO_UDP_TUNNEL;
            b.offload.csum_start = off.csum_start.saturating_add(shift);
            b.offload.hdr_len = off.hdr_len.saturating_add(shift);
            // The outer UDP checksum partial over the whole super-frame, as a UDP-tunnel GSO
            // TAP wants it (software segmentation computes each segment's from scratch).
            if Outer::partial_csum(b.frame_mut()).is_none() {
                return Verdict::Drop(DropReason::Truncated);
            }
        } else if let Err(reason) = Self::outer_csum(b, off, overhead) {
            return Verdict::Drop(reason);
        }
        self.encap_out(b, resolved, out_if, now, sink, &mut |f, sink| {
            r.resolve_later(out_if, gw, f, now, sink)
        })
    }

    /// The outer UDP checksum of a frame just encapsulated (`overhead` bytes in front of the
    /// inner frame, whose offload state was `off`): from the inner partial one (LCO), the
    /// inner one staying partial; or left partial for the port (or the kernel behind an
    /// offload TAP) to complete.
    fn outer_csum(b: &mut PacketBuf, off: Offload, overhead: usize) -> Result<(), DropReason> {
        if off.needs_csum() {
            let start = usize::from(off.csum_start) + overhead;
            let field = start + usize::from(off.csum_offset);
            let frame = b.frame_mut();
            let partial = match frame.get(field..field + 2) {
                Some(p) => [p[0], p[1]],
                None => return Err(DropReason::BadOffload),
            };
            if vxlan::fill_csum_lco(frame, start, partial).is_none() {
                return Err(DropReason::BadOffload);
            }
            b.offload.csum_start = off.csum_start.saturating_add(len16(overhead));
        } else {
            let Some((start, offset)) = Outer::partial_csum(b.frame_mut()) else {
                return Err(DropReason::Truncated);
            };
            b.offload = Offload {
                flags: VIRTIO_NET_HDR_F_NEEDS_CSUM,
                csum_start: start,
                csum_offset: offset,
                ..Offload::NONE
            };
        }
        Ok(())
    }

    /// An encapsulated frame out of uplink `out_if` when its next hop is `resolved`, else
    /// queued on the neighbour by `resolve` (the family's `resolve_later`), its offload work
    /// finished first: the neighbour queue holds plain frames.
    fn encap_out(
        &self,
        b: &mut PacketBuf,
        resolved: bool,
        out_if: IfaceId,
        now: Instant,
        sink: Option<&mut dyn Sink>,
        resolve: &mut dyn FnMut(&[u8], &mut dyn Sink) -> L3,
    ) -> Verdict {
        if resolved {
            return self.egress(out_if, b, now);
        }
        let Some(sink) = sink else {
            return Verdict::Drop(DropReason::NeighFailed);
        };
        let mut last = L3::Queued;
        let res = crate::offload::send_completed(b, &mut |f| {
            last = resolve(f, &mut *sink);
            Ok(())
        });
        match (res, last) {
            (Err(reason), _) | (Ok(()), L3::Drop(reason)) => Verdict::Drop(reason),
            (Ok(()), L3::Queued) => Verdict::Queued,
            (Ok(()), _) => Verdict::Local,
        }
    }
}

/// Whether a frame received on an uplink is a UDP-tunnel super-frame (from a TAP with
/// UDP-tunnel GSO), checked for the outer family's tunnel bit `tunnel_flag`: TCP inside
/// (over IPv4 or IPv6: IPv6 pods ride either underlay), the inner TCP checksum partial and a
/// nonzero `gso_size`; any other GSO header is a lie, `bad_offload`.
fn rx_tunnel_gso(off: Offload, tunnel_flag: u8) -> Result<bool, DropReason> {
    if !off.is_gso() {
        return Ok(false);
    }
    let inner = off.gso_type & !VIRTIO_NET_HDR_GSO_ECN & !tunnel_flag;
    if matches!(inner, VIRTIO_NET_HDR_GSO_TCPV4 | VIRTIO_NET_HDR_GSO_TCPV6)
        && off.gso_type & tunnel_flag != 0
        && off.needs_csum()
        && off.gso_size != 0
    {
        Ok(true)
    } else {
        Err(DropReason::BadOffload)
    }
}

/// Whether a received frame's outer UDP checksum is trusted unchecked: partial (from a
/// sender on this host) or checked by the device, as Linux trusts CHECKSUM_PARTIAL /
/// CHECKSUM_UNNECESSARY.
fn csum_trusted(off: Offload) -> bool {
    off.needs_csum() || off.flags & VIRTIO_NET_HDR_F_DATA_VALID != 0
}

/// Checks a TCP super-frame (from a pod's offload TAP) about to be encapsulated whole (over
/// either underlay), as Linux's `virtio_net_hdr_tnl_to_skb` and TCP segmentation will take the tunnel
/// super-frame behind a UDP-tunnel GSO TAP: TCP/IPv4 (not a fragment) or TCP/IPv6 (TCP
/// after the fixed header or an extension-header chain, not a fragment) of the family the
/// GSO type names (ECN allowed, no other GSO type), the TCP checksum partial
/// (`csum_offset` 16, `csum_start` at the TCP header, which lies within the frame), a
/// nonzero `gso_size` and a `hdr_len` within the frame. A lie is `bad_offload`, so that no
/// port is handed a super-frame the kernel or `offload::segment` would refuse or misread.
fn check_super_frame(b: &PacketBuf) -> Result<(), DropReason> {
    let off = b.offload;
    let e = EthernetFrame::new_checked(b.frame()).map_err(|_| DropReason::BadOffload)?;
    let l4 = match (off.gso_type & !VIRTIO_NET_HDR_GSO_ECN, e.ethertype()) {
        (VIRTIO_NET_HDR_GSO_TCPV4, ethertype::IPV4) => ipv4::check_header(e.payload())
            .ok()
            .filter(|i| i.proto == ipv4::PROTO_TCP && i.frag & (MF | FRAG_OFFSET) == 0)
            .map(|i| i.hdr_len),
        (VIRTIO_NET_HDR_GSO_TCPV6, ethertype::IPV6) => ipv6::check(e.payload())
            .ok()
            .filter(|i| i.next_header == ipv6::NH_TCP && i.frag.is_none())
            .map(|i| i.l4_off),
        _ => None,
    };
    let start = usize::from(off.csum_start);
    if l4.map(|l4| ETH_LEN + l4) != Some(start)
        || !off.needs_csum()
        || off.csum_offset != 16
        || off.gso_size == 0
        || start + 20 > b.len()
        || usize::from(off.hdr_len) > b.len()
    {
        return Err(DropReason::BadOffload);
    }
    Ok(())
}

/// The end of decapsulation for either family: the parse result `r` mapped to its drop
/// reason, the inner destination MAC checked, the peer counted, the offload metadata moved
/// to the inner frame (`tunnel_flag`: the outer family's UDP-tunnel GSO bit), and the frame
/// cut to the inner one (which ends at `end`).
fn finish_decap(
    b: &mut PacketBuf,
    t: &Tunnel,
    peer: &crate::l3::vxlan::PeerEntry,
    r: Result<OuterInfo, DecapError>,
    end: usize,
    tunnel_gso: bool,
    tunnel_flag: u8,
) -> Result<IfaceId, DropReason> {
    let o = r.map_err(|e| match e {
        DecapError::Short => DropReason::VxlanShort,
        DecapError::BadFlags => DropReason::VxlanBadFlags,
        DecapError::BadVni => DropReason::VxlanBadVni,
        DecapError::BadChecksum => DropReason::VxlanBadChecksum,
        DecapError::ZeroChecksum => DropReason::VxlanZeroChecksum,
    })?;
    let inner_dst = b.frame().get(o.inner..o.inner + 6).map(MacAddr::from_slice);
    if inner_dst != Some(t.cfg.mac) {
        return Err(DropReason::VxlanUnknownMac);
    }
    peer.count_rx(end - o.inner);
    if tunnel_gso {
        // The inner TCP super-frame: its checksum field (at `csum_start` + 16, past the
        // inner Ethernet and at least a minimal IPv4 header) stays partial.
        let off = b.offload;
        let start = usize::from(off.csum_start).checked_sub(o.inner);
        let Some(start) = start.filter(|&s| {
            s >= ETH_LEN + ipv4::HEADER_LEN && off.csum_offset == 16 && o.inner + s + 20 <= end
        }) else {
            return Err(DropReason::BadOffload);
        };
        b.offload = Offload {
            flags: VIRTIO_NET_HDR_F_NEEDS_CSUM,
            gso_type: off.gso_type & !tunnel_flag,
            hdr_len: len16(usize::from(off.hdr_len).saturating_sub(o.inner)),
            gso_size: off.gso_size,
            csum_start: len16(start),
            csum_offset: off.csum_offset,
        };
    } else if b.offload.needs_csum() {
        match usize::from(b.offload.csum_start).checked_sub(o.inner) {
            // The inner L4 checksum is the partial one: keep it, from the inner frame.
            Some(s) => b.offload.csum_start = len16(s),
            // The outer UDP checksum was the partial one: the inner is complete.
            None => b.offload = Offload::NONE,
        }
    }
    b.set_len(end);
    b.pull_front(o.inner);
    Ok(t.iface)
}

/// An underlay family of VXLAN: its UDP-tunnel GSO type, and what a fragment is.
trait Underlay: RouterFamily {
    /// The virtio-net GSO type bit of a UDP-tunnel super-frame over this family.
    const GSO_UDP_TUNNEL: u8;
    /// The largest outer IP packet (IPv6: the fixed header beside a 65535-byte payload).
    const MAX_IP_LEN: usize;
    /// Writes `outer`'s headers in front of the inner frame (`inner_len` bytes) of `b`;
    /// `None`: no headroom.
    fn push_outer(outer: &Outer<Self>, b: &mut PacketBuf, inner_len: usize) -> Option<()>;
    /// True for a fragment (first or later).
    fn is_fragment(info: &Self::Info) -> bool;
}

impl Underlay for Ipv4Addr {
    const GSO_UDP_TUNNEL: u8 = VIRTIO_NET_HDR_GSO_UDP_TUNNEL_IPV4;
    const MAX_IP_LEN: usize = 65_535;
    fn push_outer(outer: &Outer<Self>, b: &mut PacketBuf, inner_len: usize) -> Option<()> {
        outer.emit(b.push_front(OVERHEAD)?.try_into().ok()?, inner_len);
        Some(())
    }
    fn is_fragment(info: &Ipv4Info) -> bool {
        info.frag & (MF | FRAG_OFFSET) != 0
    }
}

impl Underlay for Ipv6Addr {
    const GSO_UDP_TUNNEL: u8 = VIRTIO_NET_HDR_GSO_UDP_TUNNEL_IPV6;
    const MAX_IP_LEN: usize = 65_535 + ipv6::HEADER_LEN;
    fn push_outer(outer: &Outer<Self>, b: &mut PacketBuf, inner_len: usize) -> Option<()> {
        let hdr = b.push_front(vxlan::overhead::<Ipv6Addr>())?;
        outer.emit(hdr.try_into().ok()?, inner_len);
        Some(())
    }
    fn is_fragment(info: &Ipv6Info) -> bool {
        info.frag.is_some()
    }
}
