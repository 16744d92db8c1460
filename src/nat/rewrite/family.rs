//! What a NAT rewrite does differently per address family, as Linux's `nf_nat_ipv4_manip_pkt`
//! and `nf_nat_ipv6_manip_pkt` beside the one `l4proto_manip_pkt`: where the header's
//! addresses are and what their change costs (IPv4: the header checksum; IPv6: no header
//! checksum), how the caller describes the checked header, how a quoted header of an ICMP
//! error is read (IPv4 options; IPv6 extension headers), which ICMP types are echoes and
//! errors, and whether the ICMP checksum covers a pseudo-header (ICMPv6 only). Everything
//! else is written once in the [parent module](super).

use std::net::{Ipv4Addr, Ipv6Addr};

use super::RewriteError;
use crate::wire::checksum::Delta;
use crate::wire::family::Family;
use crate::wire::icmp;
use crate::wire::icmpv6;
use crate::wire::ipv4::Ipv4Packet;
use crate::wire::ipv6::{self, ExtHeaders, Ipv6Info, Ipv6Packet};

/// An address family the NAT rewrites ([`super::rewrite()`], [`super::rewrite_icmp_error`])
/// handle, on its address type: [`Ipv4Addr`] or [`Ipv6Addr`]. Sealed.
pub trait RewriteFamily: Family + steps::Steps {
    /// What the caller tells of the packet's header, checked beforehand: for IPv4 its header
    /// length (`usize`; the header is re-checked against it), for IPv6 the facts
    /// [`crate::wire::ipv6::check`] gave (`&Ipv6Info`).
    type Hdr<'a>: Copy;
}

impl RewriteFamily for Ipv4Addr {
    type Hdr<'a> = usize;
}

impl RewriteFamily for Ipv6Addr {
    type Hdr<'a> = &'a Ipv6Info;
}

/// The facts of an IP header (the packet's, or the one an ICMP error quotes) a rewrite needs.
#[derive(Clone, Copy)]
pub(super) struct L3 {
    /// The end of the datagram (a quoted header: of the quoted bytes).
    pub(super) end: usize,
    /// The offset of the upper-layer header.
    pub(super) l4: usize,
    /// The upper-layer protocol.
    pub(super) proto: u8,
    /// A fragment other than the first: no upper-layer header.
    pub(super) later: bool,
}

// `Steps` cannot be named outside this module, so its crate-private types are unreachable.
#[allow(private_interfaces)]
pub(super) mod steps {
    use super::{Delta, RewriteError, RewriteFamily, L3};

    /// The per-family steps, crate-private.
    pub trait Steps: Sized {
        /// Whether the family's ICMP checksum covers the pseudo-header (ICMPv6), so that an
        /// address change goes into it.
        const ICMP_PSEUDO: bool;
        /// Checks the packet's header at `l3` as `hdr` describes it.
        fn outer(l3: &[u8], hdr: <Self as RewriteFamily>::Hdr<'_>) -> Result<L3, RewriteError>
        where
            Self: RewriteFamily;
        /// Reads the header an ICMP error quotes (`quote` runs to the datagram's end);
        /// [`RewriteError::BadIcmpError`] if it is not one of the family.
        fn quoted(quote: &[u8]) -> Result<L3, RewriteError>;
        /// Rewrites the addresses of the header at `ip` (bounds checked by the caller) and,
        /// for IPv4, patches its checksum. Returns the addresses' change (for a
        /// pseudo-header) and records in `outer` every changed word of the header (for an
        /// enclosing ICMP checksum).
        fn set_addrs(ip: &mut [u8], src: Self, dst: Self, outer: &mut Delta) -> Delta;
        /// Whether an ICMP message of type `ty` is an echo request or reply.
        fn is_echo(ty: u8) -> bool;
        /// Whether an ICMP message of type `ty` is an error quoting a datagram.
        fn is_error(ty: u8) -> bool;
    }
}

#[allow(private_interfaces)] // unreachable outside the crate: see `steps`
impl steps::Steps for Ipv4Addr {
    const ICMP_PSEUDO: bool = false;

    #[inline]
    fn outer(l3: &[u8], hdr_len: usize) -> Result<L3, RewriteError> {
        let p = Ipv4Packet::new_checked(l3).map_err(|_| RewriteError::BadIpHeader)?;
        if p.header_len() != hdr_len {
            return Err(RewriteError::BadIpHeader);
        }
        Ok(L3 {
            end: p.total_len(),
            l4: hdr_len,
            proto: p.protocol(),
            later: p.frag_offset() != 0,
        })
    }

    fn quoted(quote: &[u8]) -> Result<L3, RewriteError> {
        let p = Ipv4Packet::new_checked_header(quote).map_err(|_| RewriteError::BadIcmpError)?;
        Ok(L3 {
            end: quote.len(),
            l4: p.header_len(),
            proto: p.protocol(),
            later: p.frag_offset() != 0,
        })
    }

    #[inline]
    fn set_addrs(ip: &mut [u8], src: Ipv4Addr, dst: Ipv4Addr, outer: &mut Delta) -> Delta {
        let mut p = Ipv4Packet::new_unchecked(ip);
        let (os, od) = (u32::from(p.src_addr()), u32::from(p.dst_addr()));
        let (ns, nd) = (u32::from(src), u32::from(dst));
        let mut d = Delta::default();
        d.word32(os, ns);
        d.word32(od, nd);
        if os == ns && od == nd {
            return d;
        }
        p.set_src_addr(src);
        p.set_dst_addr(dst);
        outer.add(d);
        let hc = p.checksum();
        let c = d.apply_full(hc);
        outer.word(hc, c);
        p.set_checksum(c);
        d
    }

    #[inline]
    fn is_echo(ty: u8) -> bool {
        icmp::is_echo(ty)
    }

    #[inline]
    fn is_error(ty: u8) -> bool {
        icmp::is_error(ty)
    }
}

#[allow(private_interfaces)] // unreachable outside the crate: see `steps`
impl steps::Steps for Ipv6Addr {
    const ICMP_PSEUDO: bool = true;

    /// The upper-layer header is at `info.l4_off`, after the extension headers
    /// [`crate::wire::ipv6::check`] walked; they are left as they are (a routing header's
    /// addresses are not translated, as in Linux).
    #[inline]
    fn outer(l3: &[u8], info: &Ipv6Info) -> Result<L3, RewriteError> {
        let p = Ipv6Packet::new_checked(l3).map_err(|_| RewriteError::BadIpHeader)?;
        let end = p.total_len();
        if info.l4_off < ipv6::HEADER_LEN || info.l4_off > end {
            return Err(RewriteError::BadIpHeader);
        }
        Ok(L3 {
            end,
            l4: info.l4_off,
            proto: info.next_header,
            later: info.is_later_fragment(),
        })
    }

    /// The quote's extension headers are walked within the quoted bytes.
    fn quoted(quote: &[u8]) -> Result<L3, RewriteError> {
        if quote.len() < ipv6::HEADER_LEN || Ipv6Packet::new_unchecked(quote).version() != 6 {
            return Err(RewriteError::BadIcmpError);
        }
        let mut w = ExtHeaders::new(quote);
        let mut later = false;
        for h in &mut w {
            let h = h.map_err(|_| RewriteError::BadIcmpError)?;
            if h.kind == ipv6::NH_FRAGMENT {
                // Fragment offset (bytes 2..4 of the 8 the walker checked).
                let b = quote
                    .get(h.offset + 2..h.offset + 4)
                    .ok_or(RewriteError::BadIcmpError)?;
                later = u16::from_be_bytes([b[0], b[1]]) >> 3 != 0;
            }
        }
        let (proto, l4) = w.position();
        Ok(L3 {
            end: quote.len(),
            l4,
            proto,
            later,
        })
    }

    /// No header checksum: the change is only recorded.
    #[inline]
    fn set_addrs(ip: &mut [u8], src: Ipv6Addr, dst: Ipv6Addr, outer: &mut Delta) -> Delta {
        let mut p = Ipv6Packet::new_unchecked(ip);
        let (os, od) = (p.src_addr().octets(), p.dst_addr().octets());
        let (ns, nd) = (src.octets(), dst.octets());
        let mut d = Delta::default();
        for (o, n) in [(os, ns), (od, nd)] {
            for i in (0..16).step_by(2) {
                d.word(
                    u16::from_be_bytes([o[i], o[i + 1]]),
                    u16::from_be_bytes([n[i], n[i + 1]]),
                );
            }
        }
        if os != ns {
            p.set_src_addr(src);
        }
        if od != nd {
            p.set_dst_addr(dst);
        }
        outer.add(d);
        d
    }

    #[inline]
    fn is_echo(ty: u8) -> bool {
        matches!(ty, icmpv6::codes::ECHO_REQUEST | icmpv6::codes::ECHO_REPLY)
    }

    #[inline]
    fn is_error(ty: u8) -> bool {
        icmpv6::is_error(ty)
    }
}
