//! What reassembly needs to know of each family: where a fragment's facts are, how the
//! first fragment's header becomes the whole datagram's, and what a rewrite of the whole
//! changes in each fragment's header. Everything else in `defrag` is written once.

use std::net::{Ipv4Addr, Ipv6Addr};

use super::{FragDrop, FragKey, Fragment};
use crate::wire::checksum;
use crate::wire::family::{Family, IpProto};

mod sealed {
    pub trait Sealed {}
    impl Sealed for std::net::Ipv4Addr {}
    impl Sealed for std::net::Ipv6Addr {}
}

/// The per-family steps of IP reassembly, implemented on [`Ipv4Addr`] and [`Ipv6Addr`].
pub trait FragFamily: Family + std::hash::Hash + sealed::Sealed {
    /// Bytes of fragment header a fragment carries that the whole datagram does not (IPv6's
    /// fragment extension header; none over IPv4).
    const FRAG_HEADER_LEN: usize;

    /// The fragment facts of IP packet `l3` (its bytes from the IP header on), `Ok(None)`
    /// when it is not a fragment (an IPv6 atomic fragment, offset 0 without M, is not one:
    /// RFC 6946 has it processed alone). `zone` goes into the key.
    fn parse(l3: &[u8], zone: u16) -> Result<Option<Fragment<Self>>, FragDrop>;

    /// Turns the first fragment's IP header `ip` (up to its data) into the whole
    /// datagram's, whose payload is `payload` bytes; returns the header's new length.
    /// `next_at` is [`Fragment::next_at`] of the first fragment.
    fn unfragment(ip: &mut [u8], next_at: usize, payload: usize) -> usize;

    /// Gives a fragment's IP header `frag` (up to its data) what a rewrite of the whole
    /// datagram (IP header `whole`) changed: the addresses, the TTL / hop limit (a router
    /// decrements it), and IPv4's header checksum.
    fn refresh_header(frag: &mut [u8], whole: &[u8]);
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

/// IPv4's MF bit and offset mask in the flags/fragment-offset word.
const MF: u16 = 0x2000;
const OFFSET: u16 = 0x1fff;

impl FragFamily for Ipv4Addr {
    const FRAG_HEADER_LEN: usize = 0;

    fn parse(l3: &[u8], zone: u16) -> Result<Option<Fragment<Ipv4Addr>>, FragDrop> {
        let (Some(&vihl), Some(total), Some(frag)) = (l3.first(), be16(l3, 2), be16(l3, 6)) else {
            return Err(FragDrop::Malformed);
        };
        if frag & (MF | OFFSET) == 0 {
            return Ok(None);
        }
        let hdr_len = usize::from(vihl & 0x0f) * 4;
        let total = usize::from(total);
        if vihl >> 4 != 4 || hdr_len < 20 || total < hdr_len || total > l3.len() {
            return Err(FragDrop::Malformed);
        }
        let addr = |at: usize| Ipv4Addr::new(l3[at], l3[at + 1], l3[at + 2], l3[at + 3]);
        Ok(Some(Fragment {
            key: FragKey {
                src: addr(12),
                dst: addr(16),
                proto: IpProto(l3[9]),
                id: u32::from(be16(l3, 4).unwrap_or(0)),
                zone,
            },
            offset: usize::from(frag & OFFSET) * 8,
            more: frag & MF != 0,
            hdr_len,
            data_len: total - hdr_len,
            next_at: 0,
        }))
    }

    fn unfragment(ip: &mut [u8], _next_at: usize, payload: usize) -> usize {
        let hdr_len = ip.len();
        let total = u16::try_from(hdr_len + payload).unwrap_or(u16::MAX);
        ip[2..4].copy_from_slice(&total.to_be_bytes());
        // DF stays as the first fragment had it; MF and the offset go.
        ip[6] &= 0x40;
        ip[7] = 0;
        set_checksum(ip);
        hdr_len
    }

    fn refresh_header(frag: &mut [u8], whole: &[u8]) {
        frag[8] = whole[8];
        frag[12..20].copy_from_slice(&whole[12..20]);
        set_checksum(frag);
    }
}

/// Recomputes an IPv4 header's checksum over all of `ip`.
pub(super) fn set_checksum(ip: &mut [u8]) {
    ip[10..12].fill(0);
    let sum = checksum::finish(checksum::sum(0, ip));
    ip[10..12].copy_from_slice(&sum);
}

/// IPv6 extension headers that may stand in front of a fragment header.
const HOP_BY_HOP: u8 = 0;
const ROUTING: u8 = 43;
const FRAGMENT: u8 = 44;
const DEST_OPTS: u8 = 60;

impl FragFamily for Ipv6Addr {
    const FRAG_HEADER_LEN: usize = 8;

    fn parse(l3: &[u8], zone: u16) -> Result<Option<Fragment<Ipv6Addr>>, FragDrop> {
        let Some(payload) = be16(l3, 4) else {
            return Err(FragDrop::Malformed);
        };
        let total = 40 + usize::from(payload);
        if l3[0] >> 4 != 6 || total > l3.len() {
            return Err(FragDrop::Malformed);
        }
        let (mut nh, mut at, mut next_at) = (l3[6], 40, 6);
        while matches!(nh, HOP_BY_HOP | ROUTING | DEST_OPTS) {
            let (Some(&next), Some(&len)) = (l3.get(at), l3.get(at + 1)) else {
                return Err(FragDrop::Malformed);
            };
            next_at = at;
            nh = next;
            at += (usize::from(len) + 1) * 8;
            if at > total {
                return Err(FragDrop::Malformed);
            }
        }
        if nh != FRAGMENT {
            return Ok(None);
        }
        let (Some(&next), Some(field), Some(id)) = (
            l3.get(at),
            be16(l3, at + 2),
            l3.get(at + 4..at + 8).filter(|_| at + 8 <= total),
        ) else {
            return Err(FragDrop::Malformed);
        };
        let (offset, more) = (usize::from(field >> 3) * 8, field & 1 != 0);
        if offset == 0 && !more {
            return Ok(None);
        }
        let addr = |at: usize| {
            let mut o = [0u8; 16];
            o.copy_from_slice(&l3[at..at + 16]);
            Ipv6Addr::from(o)
        };
        Ok(Some(Fragment {
            key: FragKey {
                src: addr(8),
                dst: addr(24),
                proto: IpProto(next),
                id: u32::from_be_bytes([id[0], id[1], id[2], id[3]]),
                zone,
            },
            offset,
            more,
            hdr_len: at + 8,
            data_len: total - (at + 8),
            next_at,
        }))
    }

    fn unfragment(ip: &mut [u8], next_at: usize, payload: usize) -> usize {
        let frag_at = ip.len() - 8;
        ip[next_at] = ip[frag_at];
        let len = u16::try_from(frag_at - 40 + payload).unwrap_or(u16::MAX);
        ip[4..6].copy_from_slice(&len.to_be_bytes());
        frag_at
    }

    fn refresh_header(frag: &mut [u8], whole: &[u8]) {
        frag[7] = whole[7];
        frag[8..40].copy_from_slice(&whole[8..40]);
    }
}
