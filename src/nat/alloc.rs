//! The SNAT / MASQUERADE source allocator, as Linux's `get_unique_tuple` and
//! `nf_nat_l4proto_unique_tuple`.
//!
//! # Contract
//!
//! [`alloc_source`] gets the connection's original tuple (as it looks after any DNAT:
//! `src` = client, `dst` = endpoint) and returns the translated tuple `{src: to_addr, sport:
//! chosen, dst, dport}` whose *reply* tuple ([`Tuple::invert`]) the caller's `in_use` says is
//! free. `in_use` is asked about reply tuples only (conntrack answers "is this reply tuple
//! taken"); it is called at most [`MAX_ATTEMPTS_TOTAL`] times, and nothing allocates.
//!
//! * The original source port is kept when it is in the range and free (Linux does the same
//!   unless `--random-fully`; see [`alloc_source_random_fully`]).
//! * Otherwise ports are tried from an offset derived from `hash` (the caller passes a random or
//!   keyed-hash value; Linux uses a random number), consecutively: up to 128 tries, then, as
//!   Linux, again from a new offset with half as many tries (64, 32, 16, 8). A range of at
//!   most 128 ports is searched exhaustively in one round.
//! * ICMP echo: the identifier (both port fields) is allocated the same way over 0..=65535
//!   (`range` is not used).
//! * Protocols without ports (anything but TCP, UDP, ICMP): the address only; `in_use` is
//!   asked once.
//! * `None` when every try is taken: the caller counts the failure and drops the packet.
//!
//! The allocator keeps no state of its own: its view of the ports in use is the connection
//! table, asked through `in_use`. So after a restart on a table kept in a file
//! ([`crate::conntrack::Conntrack::open_file`]) it sees every binding the table kept, and
//! nothing needs persisting or rebuilding for it.
//!
//! # Example
//!
//! ```
//! use std::net::Ipv4Addr;
//! use tapyard::nat::{alloc_source, PortRange, Tuple};
//! use tapyard::wire::family::IpProto;
//!
//! let orig = Tuple {
//!     src: Ipv4Addr::new(10, 244, 1, 5),
//!     dst: Ipv4Addr::new(93, 184, 216, 34),
//!     sport: 40000,
//!     dport: 443,
//!     proto: IpProto::TCP.number(),
//!     zone: 0,
//! };
//! let node = Ipv4Addr::new(192, 168, 0, 10);
//! // Port 40000 is already used towards that server by another pod's connection.
//! let taken = |reply: &Tuple| reply.dst == node && reply.dport == 40000;
//! let t = alloc_source(&orig, node, PortRange::MASQUERADE, 0x5eed, taken).unwrap();
//! assert_eq!((t.src, t.dst, t.dport), (node, orig.dst, 443));
//! assert_ne!(t.sport, 40000);
//! ```

use crate::conntrack::CtKey;
use crate::narrow::{low16, low32};
use crate::wire::ipv4::{PROTO_TCP, PROTO_UDP};
#[cfg(doc)]
use crate::wire::tuple::Tuple;

/// Tries in the first round (Linux's `NF_NAT_MAX_ATTEMPTS`).
pub const MAX_ATTEMPTS: u32 = 128;

/// The most `in_use` calls one allocation makes: the kept port, then rounds of
/// 128 + 64 + 32 + 16 + 8 tries.
pub const MAX_ATTEMPTS_TOTAL: u32 = 1 + 128 + 64 + 32 + 16 + 8;

/// An inclusive range of ports to allocate from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PortRange {
    /// Lowest port, inclusive.
    pub lo: u16,
    /// Highest port, inclusive. A range with `hi < lo` is empty.
    pub hi: u16,
}

impl PortRange {
    /// MASQUERADE's range for TCP and UDP when none is configured: the unprivileged ports.
    pub const MASQUERADE: PortRange = PortRange {
        lo: 1024,
        hi: 65535,
    };

    /// Every value, for ICMP identifiers.
    pub const ALL: PortRange = PortRange { lo: 0, hi: 65535 };

    /// The range Linux uses for source port `sport` when no range is configured: privileged
    /// ports stay privileged (below 512 → 1..=511, 512..=1023 → 600..=1023), others get
    /// 1024..=65535.
    pub fn linux_default(sport: u16) -> PortRange {
        match sport {
            0..=511 => PortRange { lo: 1, hi: 511 },
            512..=1023 => PortRange { lo: 600, hi: 1023 },
            _ => PortRange::MASQUERADE,
        }
    }

    /// True if `port` is in the range.
    #[inline]
    pub fn contains(&self, port: u16) -> bool {
        self.lo <= port && port <= self.hi
    }

    /// Number of ports in the range (0 when empty).
    #[inline]
    pub fn len(&self) -> u32 {
        if self.hi < self.lo {
            0
        } else {
            u32::from(self.hi - self.lo) + 1
        }
    }

    /// True if the range has no port.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.hi < self.lo
    }
}

impl Default for PortRange {
    /// [`PortRange::MASQUERADE`].
    fn default() -> Self {
        PortRange::MASQUERADE
    }
}

/// The splitmix64 finaliser: spreads any input over all 64 bits.
#[inline]
pub(crate) fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Chooses a translated source for `orig` (see the [module docs](self)), for either family
/// ([`Tuple`], [`Tuple<Ipv6Addr>`](crate::nat::Tuple)): returns `{src: to_addr, sport: chosen,
/// ..orig}` (ICMP and ICMPv6 echo: the identifier in both port fields) such that
/// `in_use(&result.invert())` is false, or `None` when the tries are exhausted.
pub fn alloc_source<T: CtKey<W>, const W: usize>(
    orig: &T,
    to_addr: T::Addr,
    range: PortRange,
    hash: u64,
    in_use: impl FnMut(&T) -> bool,
) -> Option<T> {
    choose(orig, to_addr, range, hash, true, in_use)
}

/// As [`alloc_source`] but never keeps the original port unless the search picks it, as
/// iptables' `MASQUERADE --random-fully` (which kube-proxy uses when available): the source
/// port then leaks nothing and does not collide across nodes in a predictable way.
pub fn alloc_source_random_fully<T: CtKey<W>, const W: usize>(
    orig: &T,
    to_addr: T::Addr,
    range: PortRange,
    hash: u64,
    in_use: impl FnMut(&T) -> bool,
) -> Option<T> {
    choose(orig, to_addr, range, hash, false, in_use)
}

/// The choice for both families: TCP and UDP search `range`, ICMP echo every identifier;
/// other protocols keep their ports and only need the tuple with the new address to be free.
fn choose<T: CtKey<W>, const W: usize>(
    orig: &T,
    to_addr: T::Addr,
    range: PortRange,
    hash: u64,
    keep: bool,
    mut in_use: impl FnMut(&T) -> bool,
) -> Option<T> {
    let sport = orig.sport();
    let with = |p: u16| orig.with_source(to_addr, p);
    let range = match orig.proto() {
        PROTO_TCP | PROTO_UDP => range,
        p if p == T::ICMP => PortRange::ALL,
        _ => {
            let base = with(sport);
            return (!in_use(&base.invert())).then_some(base);
        }
    };
    search(sport, range, hash, keep, |p| !in_use(&with(p).invert())).map(with)
}

/// The port search shared by both families: `sport` if `keep` and it is free, else a
/// hash-chosen start in `range` and a bounded linear probe (halving rounds).
fn search(
    sport: u16,
    range: PortRange,
    hash: u64,
    keep: bool,
    mut free: impl FnMut(u16) -> bool,
) -> Option<u16> {
    if keep && range.contains(sport) && free(sport) {
        return Some(sport);
    }
    let size = range.len();
    if size == 0 {
        return None;
    }
    let mut attempts = size.min(MAX_ATTEMPTS);
    let mut round = 0u64;
    loop {
        let mut off =
            low32(mix64(hash ^ round.wrapping_mul(0x2545_f491_4f6c_dd1d)) % u64::from(size));
        for _ in 0..attempts {
            // `off < size ≤ 65536` and `lo + off ≤ hi`: no overflow.
            let p = low16(u64::from(u32::from(range.lo) + off));
            if free(p) {
                return Some(p);
            }
            off += 1;
            if off == size {
                off = 0;
            }
        }
        if attempts >= size || attempts < 16 {
            return None;
        }
        attempts /= 2;
        round += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::ipv4::PROTO_ICMP;
    use crate::wire::tuple::{Tuple, PROTO_ICMPV6};
    use std::collections::HashSet;
    use std::net::{Ipv4Addr, Ipv6Addr};

    fn orig(proto: u8, sport: u16) -> Tuple {
        Tuple {
            src: Ipv4Addr::new(10, 244, 1, 5),
            dst: Ipv4Addr::new(10, 244, 2, 7),
            sport,
            dport: if proto == PROTO_ICMP { sport } else { 8080 },
            proto,
            zone: 0,
        }
    }

    const NODE: Ipv4Addr = Ipv4Addr::new(192, 168, 0, 10);

    #[test]
    fn keeps_port_when_free() {
        let o = orig(PROTO_TCP, 40000);
        let t = alloc_source(&o, NODE, PortRange::MASQUERADE, 7, |_| false).unwrap();
        assert_eq!(t.src, NODE);
        assert_eq!((t.sport, t.dst, t.dport, t.proto), (40000, o.dst, 8080, 6));
        // Random-fully does not keep it (with overwhelming likelihood for this hash).
        let r = alloc_source_random_fully(&o, NODE, PortRange::MASQUERADE, 7, |_| false).unwrap();
        assert!(PortRange::MASQUERADE.contains(r.sport));
    }

    #[test]
    fn out_of_range_port_is_moved_into_range() {
        let o = orig(PROTO_UDP, 53);
        let t = alloc_source(&o, NODE, PortRange::MASQUERADE, 1, |_| false).unwrap();
        assert!(t.sport >= 1024);
        let t = alloc_source(&o, NODE, PortRange::linux_default(53), 1, |_| false).unwrap();
        assert_eq!(t.sport, 53);
        let t = alloc_source(&o, NODE, PortRange::linux_default(53), 1, |r| r.dport == 53).unwrap();
        assert!((1..=511).contains(&t.sport) && t.sport != 53);
    }

    #[test]
    fn never_returns_a_tuple_in_use() {
        // Half the ports taken, pseudo-randomly.
        let taken = |r: &Tuple| {
            assert_eq!(r.dst, NODE, "asks about the reply tuple");
            mix64(u64::from(r.dport)) & 1 == 0
        };
        for h in 0..2000u64 {
            let o = orig(PROTO_TCP, low16(h) | 1024);
            let t = alloc_source(&o, NODE, PortRange::MASQUERADE, h, taken).unwrap();
            assert!(!taken(&t.invert()));
            assert!(PortRange::MASQUERADE.contains(t.sport));
            assert_eq!((t.dst, t.dport), (o.dst, o.dport));
        }
    }

    #[test]
    fn tiny_range_exhausts() {
        let o = orig(PROTO_TCP, 5000);
        let range = PortRange { lo: 2000, hi: 2003 };
        let mut used = HashSet::new();
        for h in 0..4 {
            let t = alloc_source(&o, NODE, range, h, |r| used.contains(&r.dport)).unwrap();
            assert!(range.contains(t.sport));
            assert!(used.insert(t.sport));
        }
        let mut calls = 0;
        let none = alloc_source(&o, NODE, range, 99, |r| {
            calls += 1;
            used.contains(&r.dport)
        });
        assert_eq!(none, None);
        assert_eq!(calls, 4, "a small range is searched once, exhaustively");
        // Empty range.
        assert_eq!(
            alloc_source(&o, NODE, PortRange { lo: 5, hi: 4 }, 0, |_| false),
            None
        );
    }

    #[test]
    fn big_range_bounded_attempts() {
        let o = orig(PROTO_UDP, 5000);
        let mut calls = 0;
        let r = alloc_source(&o, NODE, PortRange::MASQUERADE, 3, |_| {
            calls += 1;
            true
        });
        assert_eq!(r, None);
        assert_eq!(calls, MAX_ATTEMPTS_TOTAL);
    }

    #[test]
    fn icmp_id_in_both_fields_over_full_range() {
        let o = orig(PROTO_ICMP, 77);
        let t = alloc_source(&o, NODE, PortRange { lo: 1, hi: 1 }, 5, |_| false).unwrap();
        assert_eq!((t.sport, t.dport), (77, 77));
        let t = alloc_source(&o, NODE, PortRange::MASQUERADE, 5, |r| r.sport == 77).unwrap();
        assert_eq!(t.sport, t.dport);
        assert_ne!(t.sport, 77);
    }

    /// The same choices for an IPv6 connection (one allocator for both families): the port
    /// kept when free, moved when taken, the ICMPv6 echo identifier in both fields.
    #[test]
    fn ipv6_tuples_get_the_same_choices() {
        let node6: Ipv6Addr = "fd00:172:18::2".parse().unwrap();
        let o6 = |proto: u8, sport: u16| Tuple {
            src: "fd00:10:244:1::5".parse().unwrap(),
            dst: "2001:db8::7".parse().unwrap(),
            sport,
            dport: if proto == PROTO_ICMPV6 { sport } else { 8080 },
            proto,
            zone: 0,
        };
        for (proto, sport) in [(PROTO_TCP, 40000), (PROTO_UDP, 53), (PROTO_ICMPV6, 77)] {
            let (o, o4) = (
                o6(proto, sport),
                orig(
                    if proto == PROTO_ICMPV6 {
                        PROTO_ICMP
                    } else {
                        proto
                    },
                    sport,
                ),
            );
            let r = PortRange::MASQUERADE;
            let t = alloc_source(&o, node6, r, 9, |_| false).unwrap();
            let t4 = alloc_source(&o4, NODE, r, 9, |_| false).unwrap();
            assert_eq!(
                (t.src, t.sport, t.dport),
                (node6, t4.sport, t4.dport),
                "{proto}"
            );
            // Taken: both families move to the same port for the same hash.
            let t = alloc_source(&o, node6, r, 9, |x| x.dport == sport).unwrap();
            let t4 = alloc_source(&o4, NODE, r, 9, |x| x.dport == sport).unwrap();
            assert_eq!((t.sport, t.dport), (t4.sport, t4.dport), "{proto}");
            assert_ne!(t.sport, sport);
            if proto == PROTO_ICMPV6 {
                assert_eq!(t.sport, t.dport);
            }
        }
    }

    #[test]
    fn portless_protocol_asks_once() {
        let mut o = orig(47, 0);
        o.dport = 0;
        let mut calls = 0;
        let t = alloc_source(&o, NODE, PortRange::MASQUERADE, 0, |_| {
            calls += 1;
            false
        });
        assert_eq!(t.map(|t| (t.src, t.sport, t.dport)), Some((NODE, 0, 0)));
        assert_eq!(calls, 1);
        assert_eq!(
            alloc_source(&o, NODE, PortRange::MASQUERADE, 0, |_| true),
            None
        );
    }

    #[test]
    fn distribution_spread() {
        // Same source port always taken: where do 10000 allocations land?
        let o = orig(PROTO_TCP, 33333);
        let mut buckets = [0u32; 16];
        let mut seen = HashSet::new();
        for h in 0..10_000u64 {
            let t = alloc_source(&o, NODE, PortRange::MASQUERADE, mix64(h), |r| {
                r.dport == 33333
            })
            .unwrap();
            seen.insert(t.sport);
            buckets[usize::from((t.sport - 1024) / 4032).min(15)] += 1;
        }
        // 10000 draws over 64512 ports: ~9300 distinct expected.
        assert!(seen.len() > 9000, "{}", seen.len());
        for b in buckets {
            assert!((500..=760).contains(&b), "{buckets:?}");
        }
    }
}
