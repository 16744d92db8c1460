//! NAT primitives: packet rewrites, the source-port allocator, Service tables.
//!
//! These are the pieces kube-proxy's iptables rules are made of, without the rule engine: the
//! datapath (with conntrack) decides *when* to translate; this module says *to what* and does
//! the bytes.
//!
//! * [`rewrite()`]: translate a packet in place to a new [`Tuple`] — addresses, ports or ICMP
//!   identifier, ICMP errors and their quoted packet — with incremental checksum updates, full
//!   or virtio-partial. No allocation, no panic, errors as values, packet untouched on error.
//! * [`alloc`]: choose a free source port for SNAT / MASQUERADE, as Linux's
//!   `nf_nat_l4proto_unique_tuple` (bounded attempts, conntrack answers "in use").
//! * [`service`]: Services (cluster IP, node port, endpoints), lock-free lookups, endpoint
//!   choice (random, Maglev, ClientIP affinity, `externalTrafficPolicy: Local`).
//! * [`maglev`]: the Maglev consistent-hashing table.
//! * [`Rng`]: a tiny per-worker PRNG for the random choices (no shared RNG, no lock).
//!
//! Time is always passed in ([`crate::Instant`]); nothing here reads a clock.
//!
//! # Putting it together (for the datapath)
//!
//! A packet that misses conntrack, with tuple `t` from [`Tuple::from_ipv4`]:
//!
//! 1. DNAT: [`Services::by_vip`]`(t.dst, t.dport, t.proto)` (or [`Services::by_node_port`]
//!    when `t.dst` is a node address), then [`Services::select`]; `None` → reject (kube-proxy
//!    answers ICMP port unreachable / TCP RST). The translated tuple is
//!    `Tuple { dst: ep.ip, dport: ep.port, ..t }`; store the [`ServiceId`] with the flow.
//! 2. SNAT / MASQUERADE (hairpin, or leaving the node): [`alloc_source`] on the DNAT'd tuple,
//!    with `in_use` asking conntrack whether a reply tuple is taken.
//! 3. Conntrack records original = `t`, reply = `translated.invert()`; every packet of the
//!    flow is then translated with [`rewrite()`] to the tuple conntrack gives for its
//!    direction (later fragments: [`rewrite_addrs`]).
//! 4. An ICMP error whose quoted tuple matches a NAT'd flow: [`rewrite_icmp_error`] with
//!    `new_inner` = the quoted packet's tuple before translation (the conntrack tuple of the
//!    direction it travelled) and the outer addresses translated as a packet of the opposite
//!    direction.
//!
//! ```
//! use std::net::{Ipv4Addr, SocketAddrV4};
//! use tapyard::nat::{Endpoint, Rng, ServiceSpec, Services};
//! use tapyard::Instant;
//!
//! let services = Services::new(1024);
//! let mut spec = ServiceSpec::new("default/web:http", Ipv4Addr::new(10, 96, 0, 10), 80, 6);
//! spec.endpoints.push(Endpoint::new(SocketAddrV4::new(Ipv4Addr::new(10, 244, 1, 5), 8080), true));
//! let id = services.upsert(spec).unwrap();
//!
//! let mut rng = Rng::new(1); // one per worker
//! let svc = services.by_vip(Ipv4Addr::new(10, 96, 0, 10), 80, 6).unwrap();
//! assert_eq!(svc.id(), id);
//! let ep = services.select(&svc, Ipv4Addr::new(10, 244, 2, 9), 0, rng.next_u64(), false, Instant::ZERO);
//! assert_eq!(ep, Some(SocketAddrV4::new(Ipv4Addr::new(10, 244, 1, 5), 8080)));
//! ```

pub mod alloc;
pub mod maglev;
pub mod rewrite;
pub mod service;

pub use alloc::{alloc_source, alloc_source_random_fully, PortRange};
pub use rewrite::{rewrite, rewrite_addrs, rewrite_icmp_error, CsumMode, RewriteError};
pub use service::{
    AffinityStats, Endpoint, LbAlgo, ServiceError, ServiceId, ServiceRef, ServiceSpec, Services,
    DEFAULT_AFFINITY_TIMEOUT,
};

#[doc(no_inline)]
pub use crate::tuple::{L4Kind, Tuple};

/// A small, fast, non-cryptographic PRNG (wyrand), one per worker thread: random endpoint
/// choice without a shared generator or lock. Seed each worker differently (e.g. from its
/// index mixed with a boot-time value).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed` (any value, zero included).
    pub fn new(seed: u64) -> Rng {
        Rng(alloc::mix64(seed))
    }

    /// The next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0xa076_1d64_78bd_642f);
        let t = u128::from(self.0) * u128::from(self.0 ^ 0xe703_7ed1_a0b4_28db);
        ((t >> 64) as u64) ^ (t as u64)
    }

    /// A value uniform in `0..n` (0 when `n` is 0), by multiply-shift.
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rng_spreads() {
        let mut r = Rng::new(0);
        let mut c = [0u32; 10];
        for _ in 0..100_000 {
            c[r.below(10) as usize] += 1;
        }
        for x in c {
            assert!((9_500..=10_500).contains(&x), "{c:?}");
        }
        assert_ne!(Rng::new(1).next_u64(), Rng::new(2).next_u64());
        assert_eq!(r.below(0), 0);
    }
}

/// Rough per-operation costs, printed with
/// `cargo test --lib nat::figures -- --ignored --nocapture` (optimised test profile).
#[cfg(test)]
mod figures {
    use super::*;
    use crate::ipv4::PROTO_TCP;
    use std::hint::black_box;
    use std::net::{Ipv4Addr, SocketAddrV4};
    use std::time::Instant as Clock;

    fn per_op(name: &str, n: u32, mut f: impl FnMut(u32)) {
        let t = Clock::now();
        for i in 0..n {
            f(i);
        }
        eprintln!(
            "{name}: {:.1} ns/op",
            t.elapsed().as_nanos() as f64 / f64::from(n)
        );
    }

    // Prints timings, asserts nothing about them (timing assertions do not belong in tests);
    // run by hand: `cargo test --lib nat::figures -- --ignored --nocapture`.
    #[test]
    #[ignore = "prints per-operation timings; run by hand with --ignored --nocapture"]
    fn figures() {
        // A 60-byte TCP packet: 20 IP + 20 TCP + 20 payload, checksums valid.
        let mut p = vec![0u8; 60];
        p[0] = 0x45;
        p[2..4].copy_from_slice(&60u16.to_be_bytes());
        p[9] = PROTO_TCP;
        p[12..20].copy_from_slice(&[10, 0, 0, 1, 10, 96, 0, 10]);
        p[20..24].copy_from_slice(&[0x9c, 0x40, 0, 80]);
        p[32] = 0x50;
        crate::ipv4::fix_header_checksum(&mut p, 20);
        let (t0, kind) = Tuple::from_ipv4(&p, 20, 60).unwrap();
        let mut t1 = t0;
        per_op(
            "rewrite TCP (addresses + ports, full checksums)",
            10_000_000,
            |i| {
                t1.dst = Ipv4Addr::from(0x0af4_0000 | (i & 0xff));
                t1.dport = i as u16;
                black_box(rewrite(black_box(&mut p), 20, kind, &t1, CsumMode::Full)).ok();
            },
        );
        let mut taken = 0u64;
        per_op("alloc_source, original port taken", 1_000_000, |i| {
            let r = alloc_source(
                &t0,
                Ipv4Addr::new(192, 168, 0, 1),
                PortRange::MASQUERADE,
                u64::from(i),
                |r| r.dport == t0.sport,
            );
            taken += u64::from(r.is_some());
        });
        black_box(taken);
        let s = Services::new(1 << 16);
        for k in 0..1000u32 {
            let mut spec = ServiceSpec::new(
                format!("svc{k}"),
                Ipv4Addr::from(0x0a60_0000 + k),
                80,
                PROTO_TCP,
            );
            spec.endpoints = (1..=10u8)
                .map(|e| {
                    Endpoint::new(
                        SocketAddrV4::new(Ipv4Addr::new(10, 244, e, (k % 250) as u8 + 1), 8080),
                        false,
                    )
                })
                .collect();
            spec.algo = if k % 2 == 0 {
                LbAlgo::Maglev
            } else {
                LbAlgo::Random
            };
            spec.affinity = (k % 4 == 1).then_some(DEFAULT_AFFINITY_TIMEOUT);
            s.upsert(spec).unwrap();
        }
        let mut rng = Rng::new(9);
        // Services k % 4 == 3: Random; k % 4 == 1: Random + affinity; even k: Maglev.
        for (name, step, offset) in [
            ("Random", 4, 3),
            ("Maglev", 2, 0),
            ("Random + ClientIP affinity, 65536 clients", 4, 1),
        ] {
            per_op(
                &format!("by_vip + select, 250-500 services ({name})"),
                1_000_000,
                |i| {
                    let k = (i % (1000 / step)) * step + offset;
                    let svc = s
                        .by_vip(Ipv4Addr::from(0x0a60_0000 + k), 80, PROTO_TCP)
                        .unwrap();
                    let r = rng.next_u64();
                    let client = Ipv4Addr::from(r as u32 & 0xffff);
                    black_box(s.select(&svc, client, r, r, false, crate::Instant::ZERO));
                },
            );
        }
        let t = Clock::now();
        let mut spec = ServiceSpec::new("big", Ipv4Addr::new(10, 97, 0, 1), 80, PROTO_TCP);
        spec.algo = LbAlgo::Maglev;
        spec.endpoints = (0..1000u32)
            .map(|e| {
                Endpoint::new(
                    SocketAddrV4::new(Ipv4Addr::from(0x0af5_0000 + e), 8080),
                    false,
                )
            })
            .collect();
        s.upsert(spec).unwrap();
        eprintln!(
            "upsert of a 1000-endpoint Maglev service (65537 slots) among 1000: {:?}",
            t.elapsed()
        );
    }
}
