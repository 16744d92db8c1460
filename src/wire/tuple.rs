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
use std::net::Ipv4Addr;

use crate::wire::ipv4::{PROTO_ICMP, PROTO_TCP, PROTO_UDP};

/// One direction of a connection.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tuple {
    /// Source address.
    pub src: Ipv4Addr,
    /// Destination address.
    pub dst: Ipv4Addr,
    /// Source port (TCP/UDP), or the echo identifier (ICMP).
    pub sport: u16,
    /// Destination port (TCP/UDP), or the echo identifier (ICMP).
    pub dport: u16,
    /// IP protocol number.
    pub proto: u8,
    /// Conntrack zone (0 unless zones are configured).
    pub zone: u16,
}

impl Tuple {
    /// The same connection seen from the other end: addresses and ports swapped.
    #[inline]
    pub fn invert(&self) -> Tuple {
        Tuple {
            src: self.dst,
            dst: self.src,
            sport: self.dport,
            dport: self.sport,
            proto: self.proto,
            zone: self.zone,
        }
    }

    /// The tuple packed into two words, for hashing and lock-free storage: `[addrs, rest]`
    /// where `addrs = src << 32 | dst` and `rest = sport << 48 | dport << 32 | proto << 16 |
    /// zone`.
    #[inline]
    pub fn to_words(&self) -> [u64; 2] {
        [
            u64::from(u32::from(self.src)) << 32 | u64::from(u32::from(self.dst)),
            u64::from(self.sport) << 48
                | u64::from(self.dport) << 32
                | u64::from(self.proto) << 16
                | u64::from(self.zone),
        ]
    }

    /// The inverse of [`Tuple::to_words`].
    #[inline]
    pub fn from_words(w: [u64; 2]) -> Tuple {
        Tuple {
            src: Ipv4Addr::from((w[0] >> 32) as u32),
            dst: Ipv4Addr::from(w[0] as u32),
            sport: (w[1] >> 48) as u16,
            dport: (w[1] >> 32) as u16,
            proto: (w[1] >> 16) as u8,
            zone: w[1] as u16,
        }
    }

    /// Extracts the tuple of the IPv4 packet starting at `l3` (its header already checked by
    /// [`crate::wire::ipv4::check_header`], `hdr_len` its length, `total_len` the datagram length).
    /// Returns `None` when the L4 header the tuple needs is truncated, or for a non-first
    /// fragment of TCP/UDP/ICMP (it has no L4 header).
    pub fn from_ipv4(l3: &[u8], hdr_len: usize, total_len: usize) -> Option<(Tuple, L4Kind)> {
        let ip = l3.get(..total_len.min(l3.len()))?;
        if ip.len() < 20 || hdr_len < 20 || ip.len() < hdr_len {
            return None;
        }
        let src = Ipv4Addr::new(ip[12], ip[13], ip[14], ip[15]);
        let dst = Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]);
        let proto = ip[9];
        let frag_off = u16::from_be_bytes([ip[6], ip[7]]) & 0x1fff;
        let l4 = &ip[hdr_len..];
        let mut t = Tuple {
            src,
            dst,
            sport: 0,
            dport: 0,
            proto,
            zone: 0,
        };
        if !matches!(proto, PROTO_TCP | PROTO_UDP | PROTO_ICMP) {
            return Some((t, L4Kind::Other));
        }
        if frag_off != 0 {
            return None;
        }
        match proto {
            PROTO_TCP | PROTO_UDP => {
                let p = l4.get(..4)?;
                t.sport = u16::from_be_bytes([p[0], p[1]]);
                t.dport = u16::from_be_bytes([p[2], p[3]]);
                Some((
                    t,
                    if proto == PROTO_TCP {
                        L4Kind::Tcp
                    } else {
                        L4Kind::Udp
                    },
                ))
            }
            _ => {
                let h = l4.get(..8)?;
                match h[0] {
                    // Echo request / reply.
                    8 | 0 => {
                        let id = u16::from_be_bytes([h[4], h[5]]);
                        t.sport = id;
                        t.dport = id;
                        Some((t, L4Kind::IcmpEcho { request: h[0] == 8 }))
                    }
                    // Destination unreachable, source quench, redirect, time exceeded,
                    // parameter problem: they quote the packet that caused them.
                    3 | 4 | 5 | 11 | 12 => {
                        let inner = l4.get(8..)?;
                        if inner.len() < 20 || inner[0] >> 4 != 4 {
                            return None;
                        }
                        let ihl = usize::from(inner[0] & 0x0f) * 4;
                        if ihl < 20 {
                            return None;
                        }
                        // The quoted datagram is truncated by design: take what is there.
                        let quoted_len = inner.len();
                        let (q, kind) = Tuple::from_ipv4(inner, ihl, quoted_len)?;
                        if matches!(kind, L4Kind::IcmpError { .. }) {
                            // An error about an error is never sent (RFC 1122); drop it.
                            return None;
                        }
                        Some((
                            q,
                            L4Kind::IcmpError {
                                inner_l3: (hdr_len + 8) as u16,
                            },
                        ))
                    }
                    _ => Some((t, L4Kind::Other)),
                }
            }
        }
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

impl fmt::Debug for Tuple {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Tuple {
    /// `conntrack -L` style: `src=10.0.0.1 dst=10.0.0.2 sport=1234 dport=80` (ICMP: `id=`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "src={} dst={}", self.src, self.dst)?;
        match self.proto {
            PROTO_TCP | PROTO_UDP => write!(f, " sport={} dport={}", self.sport, self.dport)?,
            PROTO_ICMP => write!(f, " id={}", self.sport)?,
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
        let n = v.len() as u16;
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
