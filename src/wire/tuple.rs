//! The connection tuple: what conntrack keys a flow by and what NAT rewrites.
//!
//! A [`Tuple`] is one direction of a connection: source and destination address and port,
//! protocol and conntrack zone. ICMP echo request/reply are keyed by their identifier, stored
//! in *both* port fields, so [`Tuple::invert`] needs no protocol knowledge and a NAT that
//! changes the identifier changes both. Other protocols carry ports 0.
//!
//! [`Tuple::from_ipv4`] extracts the tuple of a packet from its IPv4 header on; for an ICMP
//! error it returns the tuple of the packet it quotes (see [`L4Kind`]). It never panics on any
//! input.

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

use crate::narrow::{len16, low16, low32, low8};
use crate::wire::family::Family;
use crate::wire::icmp::{self, Icmpv4Packet};
use crate::wire::icmpv6::{self, Icmpv6Packet};
use crate::wire::ipv4::{Ipv4Packet, PROTO_ICMP, PROTO_TCP, PROTO_UDP};
use crate::wire::ipv6::{self as ip6, ExtHeaders, Ipv6Info, Ipv6Packet};
use crate::wire::Error;

mod field {
    use std::ops::Range;
    pub const SRC_PORT: Range<usize> = 0..2;
    pub const DST_PORT: Range<usize> = 2..4;
    pub const END: usize = 4;
}

/// A view of the two ports every port-carrying transport header starts with (TCP, UDP, SCTP,
/// DCCP): what conntrack keys on and NAT rewrites, and all that an ICMP error may quote of a
/// segment. [`L4Ports::new_checked`] checks the 4 bytes are there; then no accessor panics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct L4Ports<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> L4Ports<T> {
    /// Wraps a buffer without checking it: accessors panic if it is shorter than 4 bytes.
    #[inline]
    pub const fn new_unchecked(buffer: T) -> Self {
        L4Ports { buffer }
    }

    /// Wraps a buffer of at least 4 bytes.
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Self, Error> {
        if buffer.as_ref().len() < field::END {
            return Err(Error::Truncated);
        }
        Ok(L4Ports { buffer })
    }

    #[inline(always)]
    fn bytes(&self) -> &[u8; field::END] {
        self.buffer
            .as_ref()
            .first_chunk()
            .expect("ports checked by new_checked")
    }

    /// Source port.
    #[inline]
    pub fn src_port(&self) -> u16 {
        let b = self.bytes();
        u16::from_be_bytes([b[field::SRC_PORT.start], b[field::SRC_PORT.start + 1]])
    }

    /// Destination port.
    #[inline]
    pub fn dst_port(&self) -> u16 {
        let b = self.bytes();
        u16::from_be_bytes([b[field::DST_PORT.start], b[field::DST_PORT.start + 1]])
    }

    /// Both ports as one word, `src << 16 | dst`.
    #[inline]
    pub fn ports_u32(&self) -> u32 {
        u32::from_be_bytes(*self.bytes())
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> L4Ports<T> {
    /// Sets the source port.
    #[inline]
    pub fn set_src_port(&mut self, v: u16) {
        self.buffer.as_mut()[field::SRC_PORT].copy_from_slice(&v.to_be_bytes());
    }

    /// Sets the destination port.
    #[inline]
    pub fn set_dst_port(&mut self, v: u16) {
        self.buffer.as_mut()[field::DST_PORT].copy_from_slice(&v.to_be_bytes());
    }
}

/// One direction of a connection, of either family (`A`: [`Ipv4Addr`], the default, or
/// [`Ipv6Addr`]). For IPv6, `proto` is the upper-layer protocol (after the extension headers)
/// and ICMPv6 echo request/reply (types 128/129) are keyed by their identifier in both port
/// fields.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct Tuple<A: Family = Ipv4Addr> {
    /// Source address.
    pub src: A,
    /// Destination address.
    pub dst: A,
    /// Source port (TCP/UDP), or the echo identifier (ICMP).
    pub sport: u16,
    /// Destination port (TCP/UDP), or the echo identifier (ICMP).
    pub dport: u16,
    /// IP protocol number.
    pub proto: u8,
    /// Conntrack zone (0 unless zones are configured).
    pub zone: u16,
}

/// How a family's [`Tuple`] packs into `W` 64-bit words, for hashing and lock-free storage:
/// the addresses first (IPv4: one word, `src << 32 | dst`; IPv6: four, each address high
/// half first), then one word `sport << 48 | dport << 32 | proto << 16 | zone`.
pub trait TupleWords<const W: usize>: Family {
    /// The tuple packed into words.
    fn pack(t: &Tuple<Self>) -> [u64; W];
    /// The inverse of [`TupleWords::pack`].
    fn unpack(w: [u64; W]) -> Tuple<Self>;
}

/// The last word of a packed tuple (both families).
#[inline(always)]
fn rest_word<A: Family>(t: &Tuple<A>) -> u64 {
    u64::from(t.sport) << 48
        | u64::from(t.dport) << 32
        | u64::from(t.proto) << 16
        | u64::from(t.zone)
}

/// A tuple of `src` and `dst` with the rest from `w`, a word packed by [`rest_word`].
#[inline(always)]
fn with_rest<A: Family>(src: A, dst: A, w: u64) -> Tuple<A> {
    Tuple {
        src,
        dst,
        sport: (w >> 48) as u16,
        dport: low16(w >> 32),
        proto: low8(w >> 16),
        zone: low16(w),
    }
}

impl TupleWords<2> for Ipv4Addr {
    #[inline(always)]
    fn pack(t: &Tuple) -> [u64; 2] {
        [
            u64::from(u32::from(t.src)) << 32 | u64::from(u32::from(t.dst)),
            rest_word(t),
        ]
    }

    #[inline(always)]
    fn unpack(w: [u64; 2]) -> Tuple {
        with_rest(
            Ipv4Addr::from((w[0] >> 32) as u32),
            Ipv4Addr::from(low32(w[0])),
            w[1],
        )
    }
}

impl TupleWords<5> for Ipv6Addr {
    #[inline(always)]
    fn pack(t: &Tuple<Ipv6Addr>) -> [u64; 5] {
        let half = |a: &Ipv6Addr, i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&a.octets()[i * 8..i * 8 + 8]);
            u64::from_be_bytes(w)
        };
        [
            half(&t.src, 0),
            half(&t.src, 1),
            half(&t.dst, 0),
            half(&t.dst, 1),
            rest_word(t),
        ]
    }

    #[inline(always)]
    fn unpack(w: [u64; 5]) -> Tuple<Ipv6Addr> {
        with_rest(
            Ipv6Addr::from(u128::from(w[0]) << 64 | u128::from(w[1])),
            Ipv6Addr::from(u128::from(w[2]) << 64 | u128::from(w[3])),
            w[4],
        )
    }
}

impl<A: Family> Tuple<A> {
    /// The same connection seen from the other end: addresses and ports swapped.
    #[inline]
    pub fn invert(&self) -> Tuple<A> {
        Tuple {
            src: self.dst,
            dst: self.src,
            sport: self.dport,
            dport: self.sport,
            proto: self.proto,
            zone: self.zone,
        }
    }

    /// The tuple packed into words ([`TupleWords`]: 2 for IPv4, 5 for IPv6), for hashing and
    /// lock-free storage.
    #[inline]
    pub fn to_words<const W: usize>(&self) -> [u64; W]
    where
        A: TupleWords<W>,
    {
        A::pack(self)
    }

    /// The inverse of [`Tuple::to_words`].
    #[inline]
    pub fn from_words<const W: usize>(w: [u64; W]) -> Tuple<A>
    where
        A: TupleWords<W>,
    {
        A::unpack(w)
    }
}

impl Tuple {
    /// Extracts the tuple of the IPv4 packet starting at `l3` (its header already checked by
    /// [`crate::wire::ipv4::check_header`], `hdr_len` its length, `total_len` the datagram length).
    /// Returns `None` when the L4 header the tuple needs is truncated, or for a non-first
    /// fragment of TCP/UDP/ICMP (it has no L4 header).
    pub fn from_ipv4(l3: &[u8], hdr_len: usize, total_len: usize) -> Option<(Tuple, L4Kind)> {
        let ip = l3.get(..total_len.min(l3.len()))?;
        // The header as the caller checked it (the total length may be a quote's, cut short).
        let ip = Ipv4Packet::new_checked_header(ip)
            .ok()
            .filter(|p| p.header_len() == hdr_len)?;
        Tuple::from_view(&ip, hdr_len, false)
    }

    /// `quoted`: the datagram an ICMP error quotes, whose L4 bytes run to the end of the quote.
    fn from_view(ip: &Ipv4Packet<&[u8]>, hdr_len: usize, quoted: bool) -> Option<(Tuple, L4Kind)> {
        let proto = ip.protocol();
        let mut t = Tuple {
            src: ip.src_addr(),
            dst: ip.dst_addr(),
            sport: 0,
            dport: 0,
            proto,
            zone: 0,
        };
        if !matches!(proto, PROTO_TCP | PROTO_UDP | PROTO_ICMP) {
            return Some((t, L4Kind::Other));
        }
        if ip.frag_offset() != 0 {
            return None;
        }
        let l4 = if quoted {
            ip.after_header()
        } else {
            ip.payload()
        };
        match proto {
            PROTO_TCP | PROTO_UDP => {
                let p = L4Ports::new_checked(l4).ok()?;
                t.sport = p.src_port();
                t.dport = p.dst_port();
                let kind = if proto == PROTO_TCP {
                    L4Kind::Tcp
                } else {
                    L4Kind::Udp
                };
                Some((t, kind))
            }
            _ => {
                let h = Icmpv4Packet::new_checked(l4).ok()?;
                let ty = h.msg_type();
                if icmp::is_echo(ty) {
                    let id = h.echo_ident();
                    t.sport = id;
                    t.dport = id;
                    Some((
                        t,
                        L4Kind::IcmpEcho {
                            request: ty == icmp::codes::ECHO_REQUEST,
                        },
                    ))
                } else if icmp::is_error(ty) {
                    // Destination unreachable, source quench, redirect, time exceeded,
                    // parameter problem: they quote the packet that caused them, truncated
                    // by design: take what is there.
                    let inner = Ipv4Packet::new_checked_header(h.data()).ok()?;
                    let (q, kind) = Tuple::from_view(&inner, inner.header_len(), true)?;
                    if matches!(kind, L4Kind::IcmpError { .. }) {
                        // An error about an error is never sent (RFC 1122); drop it.
                        return None;
                    }
                    Some((
                        q,
                        L4Kind::IcmpError {
                            inner_l3: len16(hdr_len + icmp::HEADER_LEN),
                        },
                    ))
                } else {
                    Some((t, L4Kind::Other))
                }
            }
        }
    }
}

/// ICMPv6's protocol (next header) number.
pub const PROTO_ICMPV6: u8 = 58;

impl Tuple<Ipv6Addr> {
    /// Extracts the tuple of the IPv6 packet `l3` (from its fixed header to the end of its
    /// payload or further), checked by [`crate::wire::ipv6::check`] into `info`: the
    /// upper-layer header is at `info.l4_off`, after the extension headers. As
    /// [`Tuple::from_ipv4`]: for an ICMPv6 error (types 1–4) the tuple of the packet it quotes
    /// (its own extension headers walked, within the quote's bytes) with
    /// [`L4Kind::IcmpError`], for an echo request/reply (128/129) the identifier in both port
    /// fields. `None` when the L4 header the tuple needs is truncated, for a fragment other
    /// than the first of TCP/UDP/ICMPv6 (no L4 header: Linux reassembles first, we do not
    /// track it), and for an error quoting an error. Never panics.
    pub fn from_ipv6(l3: &[u8], info: &Ipv6Info) -> Option<(Tuple<Ipv6Addr>, L4Kind)> {
        let end = info.total_len().min(l3.len());
        let l4 = l3.get(info.l4_off..end)?;
        let t = Tuple {
            src: info.src,
            dst: info.dst,
            sport: 0,
            dport: 0,
            proto: info.next_header,
            zone: 0,
        };
        if matches!(t.proto, PROTO_TCP | PROTO_UDP | PROTO_ICMPV6) && info.is_later_fragment() {
            return None;
        }
        Self::from_l4(t, l4, info.l4_off, false)
    }

    /// `t` with its ports read from the upper-layer bytes `l4` at offset `l4_off` of the
    /// packet; `quoted`: inside an ICMPv6 error (no error about an error).
    fn from_l4(
        mut t: Tuple<Ipv6Addr>,
        l4: &[u8],
        l4_off: usize,
        quoted: bool,
    ) -> Option<(Tuple<Ipv6Addr>, L4Kind)> {
        match t.proto {
            PROTO_TCP | PROTO_UDP => {
                let p = L4Ports::new_checked(l4).ok()?;
                t.sport = p.src_port();
                t.dport = p.dst_port();
                let kind = if t.proto == PROTO_TCP {
                    L4Kind::Tcp
                } else {
                    L4Kind::Udp
                };
                Some((t, kind))
            }
            PROTO_ICMPV6 => {
                let h = Icmpv6Packet::new_checked(l4).ok()?;
                let ty = h.msg_type();
                if ty == icmpv6::codes::ECHO_REQUEST || ty == icmpv6::codes::ECHO_REPLY {
                    let id = h.echo_ident();
                    t.sport = id;
                    t.dport = id;
                    Some((
                        t,
                        L4Kind::IcmpEcho {
                            request: ty == icmpv6::codes::ECHO_REQUEST,
                        },
                    ))
                } else if icmpv6::is_error(ty) {
                    if quoted {
                        // An error about an error is never sent (RFC 4443 2.4 e.1).
                        return None;
                    }
                    let (q, kind) = Self::from_quote(h.data())?;
                    if matches!(kind, L4Kind::IcmpError { .. }) {
                        return None;
                    }
                    Some((
                        q,
                        L4Kind::IcmpError {
                            inner_l3: len16(l4_off + icmpv6::HEADER_LEN),
                        },
                    ))
                } else {
                    Some((t, L4Kind::Other))
                }
            }
            _ => Some((t, L4Kind::Other)),
        }
    }

    /// The tuple of the packet an ICMPv6 error quotes: its fixed header, then its extension
    /// headers as far as the quote goes (truncated by design: RFC 4443 quotes as much as fits
    /// in 1280 bytes), then its ports.
    fn from_quote(q: &[u8]) -> Option<(Tuple<Ipv6Addr>, L4Kind)> {
        // The quote's payload length may run past its end: check the fixed header only.
        if q.len() < ip6::HEADER_LEN {
            return None;
        }
        let p = Ipv6Packet::new_unchecked(q);
        if p.version() != 6 {
            return None;
        }
        let t = Tuple {
            src: p.src_addr(),
            dst: p.dst_addr(),
            sport: 0,
            dport: 0,
            proto: p.protocol(),
            zone: 0,
        };
        let mut w = ExtHeaders::new(q);
        let mut later_fragment = false;
        for h in &mut w {
            let h = h.ok()?;
            if h.kind == ip6::NH_FRAGMENT {
                // The fragment header's offset field (bytes 2..4, the low 3 bits flags); the
                // walker bounds-checked its 8 bytes.
                let b = q.get(h.offset + 2..h.offset + 4)?;
                later_fragment = u16::from_be_bytes([b[0], b[1]]) >> 3 != 0;
            }
        }
        let (nh, off) = w.position();
        let t = Tuple { proto: nh, ..t };
        if later_fragment && matches!(nh, PROTO_TCP | PROTO_UDP | PROTO_ICMPV6) {
            return None;
        }
        Self::from_l4(t, q.get(off..)?, off, true)
    }
}

/// What kind of L4 packet a tuple came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum L4Kind {
    /// TCP: ports in the tuple.
    Tcp,
    /// UDP: ports in the tuple.
    Udp,
    /// ICMP echo request (`request`) or reply: the identifier in both port fields.
    IcmpEcho {
        /// True for a request, false for a reply.
        request: bool,
    },
    /// An ICMP error. The tuple is the *quoted* packet's (as it was sent, so it matches its
    /// connection's tuple in the direction it travelled); `inner_l3` is the offset of the
    /// quoted IPv4 header from the outer IPv4 header.
    IcmpError {
        /// Offset of the quoted header from the start of the outer IPv4 header.
        inner_l3: u16,
    },
    /// Any other protocol or ICMP type: addresses and protocol only.
    Other,
}

impl<A: Family> fmt::Debug for Tuple<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl<A: Family> fmt::Display for Tuple<A> {
    /// `conntrack -L` style: `src=10.0.0.1 dst=10.0.0.2 sport=1234 dport=80` (ICMP and
    /// ICMPv6: `id=`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "src={} dst={}", self.src, self.dst)?;
        match self.proto {
            PROTO_TCP | PROTO_UDP => write!(f, " sport={} dport={}", self.sport, self.dport)?,
            p if p == A::ICMP.number() => write!(f, " id={}", self.sport)?,
            _ => {}
        }
        if self.zone != 0 {
            write!(f, " zone={}", self.zone)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(proto: u8, l4: &[u8]) -> Vec<u8> {
        let mut v = vec![
            0x45, 0, 0, 0, 0, 0, 0, 0, 64, proto, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
        ];
        v.extend_from_slice(l4);
        let n = u16::try_from(v.len()).unwrap();
        v[2..4].copy_from_slice(&n.to_be_bytes());
        v
    }

    #[test]
    fn tcp_ports_and_invert() {
        let p = ip(6, &[0x30, 0x39, 0, 80, 0, 0, 0, 0]);
        let (t, k) = Tuple::from_ipv4(&p, 20, p.len()).unwrap();
        assert_eq!(k, L4Kind::Tcp);
        assert_eq!((t.sport, t.dport), (12345, 80));
        assert_eq!(t.invert().invert(), t);
        assert_eq!(Tuple::from_words(t.to_words()), t);
        assert_eq!(
            t.to_string(),
            "src=10.0.0.1 dst=10.0.0.2 sport=12345 dport=80"
        );
    }

    #[test]
    fn ipv6_words_round_trip_and_print() {
        let t: Tuple<Ipv6Addr> = Tuple {
            src: "fd00:10:244:1::2".parse().unwrap(),
            dst: "fd00:10:96::10".parse().unwrap(),
            sport: 40000,
            dport: 80,
            proto: PROTO_TCP,
            zone: 3,
        };
        assert_eq!(Tuple::from_words(t.to_words()), t);
        assert_eq!(t.invert().invert(), t);
        assert_eq!(
            t.to_words()[4],
            Tuple {
                src: Ipv4Addr::UNSPECIFIED,
                dst: Ipv4Addr::UNSPECIFIED,
                sport: 40000,
                dport: 80,
                proto: 6,
                zone: 3
            }
            .to_words()[1]
        );
        assert_eq!(
            t.to_string(),
            "src=fd00:10:244:1::2 dst=fd00:10:96::10 sport=40000 dport=80 zone=3"
        );
    }

    #[test]
    fn echo_id_in_both_ports() {
        let p = ip(1, &[8, 0, 0, 0, 0x12, 0x34, 0, 1]);
        let (t, k) = Tuple::from_ipv4(&p, 20, p.len()).unwrap();
        assert_eq!(k, L4Kind::IcmpEcho { request: true });
        assert_eq!((t.sport, t.dport), (0x1234, 0x1234));
        assert_eq!(t.invert().sport, 0x1234);
    }

    #[test]
    fn icmp_error_quotes_inner_tuple() {
        let inner = ip(17, &[0, 53, 0x30, 0x39, 0, 8, 0, 0]);
        let mut l4 = vec![3, 3, 0, 0, 0, 0, 0, 0];
        l4.extend_from_slice(&inner);
        let p = ip(1, &l4);
        let (t, k) = Tuple::from_ipv4(&p, 20, p.len()).unwrap();
        assert_eq!(k, L4Kind::IcmpError { inner_l3: 28 });
        assert_eq!((t.proto, t.sport, t.dport), (17, 53, 12345));
    }

    /// An IPv6 packet: fixed header, `ext` extension-header bytes (first next header
    /// `first`), then `l4`.
    fn ipv6_packet(first: u8, ext: &[u8], l4: &[u8]) -> Vec<u8> {
        let mut v = vec![0x60, 0, 0, 0, 0, 0, first, 64];
        v.extend_from_slice(&"fd00::1".parse::<Ipv6Addr>().unwrap().octets());
        v.extend_from_slice(&"fd00::2".parse::<Ipv6Addr>().unwrap().octets());
        v.extend_from_slice(ext);
        v.extend_from_slice(l4);
        let n = u16::try_from(v.len() - 40).unwrap();
        v[4..6].copy_from_slice(&n.to_be_bytes());
        v
    }

    fn tuple_of_ipv6(p: &[u8]) -> Option<(Tuple<Ipv6Addr>, L4Kind)> {
        let info = ip6::check(p).ok()?;
        Tuple::from_ipv6(p, &info)
    }

    #[test]
    fn ipv6_tcp_after_extension_headers() {
        // Hop-by-hop (8 bytes) -> destination options (16 bytes) -> TCP.
        let mut ext = vec![60, 0, 1, 4, 0, 0, 0, 0];
        ext.extend_from_slice(&[6, 1, 1, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        let p = ipv6_packet(0, &ext, &[0x9c, 0x40, 0, 80, 0, 0, 0, 0]);
        let (t, k) = tuple_of_ipv6(&p).unwrap();
        assert_eq!(k, L4Kind::Tcp);
        assert_eq!((t.proto, t.sport, t.dport), (6, 40000, 80));
        assert_eq!(t.src, "fd00::1".parse::<Ipv6Addr>().unwrap());
    }

    #[test]
    fn ipv6_echo_ids_and_later_fragments() {
        let p = ipv6_packet(58, &[], &[128, 0, 0, 0, 0x12, 0x34, 0, 1]);
        let (t, k) = tuple_of_ipv6(&p).unwrap();
        assert_eq!(k, L4Kind::IcmpEcho { request: true });
        assert_eq!((t.proto, t.sport, t.dport), (58, 0x1234, 0x1234));
        let p = ipv6_packet(58, &[], &[129, 0, 0, 0, 0x12, 0x34, 0, 1]);
        assert_eq!(
            tuple_of_ipv6(&p).unwrap().1,
            L4Kind::IcmpEcho { request: false }
        );
        // A first fragment has ports; a later one has none to read.
        let first = ipv6_packet(44, &[17, 0, 0, 1, 0, 0, 0, 9], &[0, 53, 0, 54, 0, 8, 0, 0]);
        assert_eq!(tuple_of_ipv6(&first).unwrap().0.dport, 54);
        let later = ipv6_packet(
            44,
            &[17, 0, 0, 0x10, 0, 0, 0, 9],
            &[0, 53, 0, 54, 0, 8, 0, 0],
        );
        assert!(tuple_of_ipv6(&later).is_none());
        // Other protocols: addresses and protocol only.
        let p = ipv6_packet(47, &[], &[0; 8]);
        assert_eq!(tuple_of_ipv6(&p).unwrap().1, L4Kind::Other);
    }

    #[test]
    fn icmpv6_error_quotes_inner_tuple_through_its_extension_headers() {
        // The quoted packet: a UDP datagram with a destination-options header, truncated
        // after its ports (its payload length says more).
        let mut inner = ipv6_packet(
            60,
            &[17, 0, 1, 4, 0, 0, 0, 0],
            &[0, 53, 0x30, 0x39, 0, 100, 0, 0],
        );
        inner[4..6].copy_from_slice(&500u16.to_be_bytes());
        inner.truncate(40 + 8 + 4);
        let mut l4 = vec![1, 4, 0, 0, 0, 0, 0, 0];
        l4.extend_from_slice(&inner);
        let p = ipv6_packet(58, &[], &l4);
        let (t, k) = tuple_of_ipv6(&p).unwrap();
        assert_eq!(k, L4Kind::IcmpError { inner_l3: 48 });
        assert_eq!((t.proto, t.sport, t.dport), (17, 53, 12345));
        // Packet too big (type 2) quoting an echo request.
        let inner = ipv6_packet(58, &[], &[128, 0, 0, 0, 0, 7, 0, 1]);
        let mut l4 = vec![2, 0, 0, 0, 0, 0, 5, 0];
        l4.extend_from_slice(&inner);
        let (t, k) = tuple_of_ipv6(&ipv6_packet(58, &[], &l4)).unwrap();
        assert_eq!(
            (k, t.proto, t.sport),
            (L4Kind::IcmpError { inner_l3: 48 }, 58, 7)
        );
        // An error quoting an error is dropped.
        let inner = ipv6_packet(58, &[], &[1, 0, 0, 0, 0, 0, 0, 0]);
        let mut l4 = vec![3, 0, 0, 0, 0, 0, 0, 0];
        l4.extend_from_slice(&inner);
        assert!(tuple_of_ipv6(&ipv6_packet(58, &[], &l4)).is_none());
    }

    proptest::proptest! {
        #[test]
        fn from_ipv6_never_panics(
            nh in proptest::prelude::any::<u8>(),
            rest in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..160),
            cut in 0usize..200,
        ) {
            let mut p = ipv6_packet(nh, &[], &rest);
            let _ = tuple_of_ipv6(&p);
            // An ICMPv6 error quoting these bytes, as sent or cut anywhere.
            let mut l4 = vec![1, 0, 0, 0, 0, 0, 0, 0];
            l4.extend_from_slice(&p);
            let e = ipv6_packet(58, &[], &l4);
            let _ = tuple_of_ipv6(&e);
            p.truncate(cut.min(p.len()));
            let _ = tuple_of_ipv6(&p);
            let info = ip6::check(&e).unwrap();
            let _ = Tuple::from_ipv6(&e[..cut.min(e.len())], &info);
        }
    }

    #[test]
    fn truncated_is_none_never_panics() {
        let p = ip(6, &[0x30]);
        assert!(Tuple::from_ipv4(&p, 20, p.len()).is_none());
        for n in 0..40 {
            let p = ip(1, &vec![3u8; n]);
            let _ = Tuple::from_ipv4(&p, 20, p.len());
            let _ = Tuple::from_ipv4(&p, 60, 1000);
        }
    }
}
