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
//! use tapyard::wire::family::IpProto;
//! use tapyard::Instant;
//!
//! let services = Services::new(1024);
//! let mut spec = ServiceSpec::new("default/web:http", Ipv4Addr::new(10, 96, 0, 10), 80, IpProto::TCP);
//! spec.endpoints.push(Endpoint::new(SocketAddrV4::new(Ipv4Addr::new(10, 244, 1, 5), 8080), true));
//! let id = services.upsert(spec).unwrap();
//!
//! let mut rng = Rng::new(1); // one per worker
//! let svc = services.by_vip(Ipv4Addr::new(10, 96, 0, 10), 80, IpProto::TCP.number()).unwrap();
//! assert_eq!(svc.id(), id);
//! let ep = services.select(&svc, Ipv4Addr::new(10, 244, 2, 9), 0, rng.next_u64(), false, Instant::ZERO);
//! assert_eq!(ep, Some(SocketAddrV4::new(Ipv4Addr::new(10, 244, 1, 5), 8080)));
//! ```

pub mod alloc;
pub mod maglev;
pub mod netfilter;
pub mod rewrite;
pub mod service;

pub use alloc::{
    alloc_source, alloc_source_random_fully, PortRange, MAX_ATTEMPTS, MAX_ATTEMPTS_TOTAL,
};
pub use netfilter::{MasqueradeRule, NatConfig, NatRules, Netfilter, NfCounters, Prefix, SnatRule};
pub use rewrite::{
    rewrite, rewrite_addrs, rewrite_icmp_error, CsumMode, RewriteError, RewriteFamily,
};
pub use service::{
    AffinityStats, Endpoint, EndpointConditions, FrontendKind, LbAlgo, ServiceAddr, ServiceError,
    ServiceId, ServiceRef, ServiceSpec, Services, DEFAULT_AFFINITY_TIMEOUT, MAX_AFFINITY_TIMEOUT,
};

#[doc(no_inline)]
pub use crate::wire::tuple::{L4Kind, Tuple};

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
        crate::narrow::low64(t >> 64) ^ crate::narrow::low64(t)
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
            c[usize::try_from(r.below(10)).unwrap()] += 1;
        }
        for x in c {
            assert!((9_500..=10_500).contains(&x), "{c:?}");
        }
        assert_ne!(Rng::new(1).next_u64(), Rng::new(2).next_u64());
        assert_eq!(r.below(0), 0);
    }
}
