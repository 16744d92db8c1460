//! Services and endpoint choice, with kube-proxy's semantics.
//!
//! A [`ServiceSpec`] is a virtual IP and port (and optionally a node port) in front of a list
//! of endpoints. [`Services`] holds them all and answers the datapath's two questions for a
//! new connection: *is this destination a service* ([`Services::by_vip`],
//! [`Services::by_node_port`]) and *which endpoint* ([`Services::select`]).
//!
//! # Threading
//!
//! The table is a read-copy-update snapshot in an [`arc_swap::ArcSwap`]: [`Services::upsert`]
//! and [`Services::remove`] (serialised by a writer mutex) build a new snapshot and swap it in.
//! Lookups never wait and never allocate; a [`ServiceRef`] is a reference-counted view of one
//! version of one service, so a reader always sees a whole service, never a half-updated one,
//! and keeps seeing that version for as long as it holds the reference.
//!
//! Session affinity (`ClientIP`) is a bounded, set-associative table: the (service, client)
//! key hashes (keyed SipHash, so clients cannot aim at one set) to a set of 8 entries behind
//! its own small mutex. [`Services::select`] takes that one lock, for a scan of 8 entries, and
//! only for services with affinity: that is the only lock on the new-connection path
//! (established flows are answered by conntrack and never call `select`). A full set evicts
//! its expired entry if it has one, else the one closest to expiry (the least recently used
//! when timeouts are equal). Nothing allocates after [`Services::new`].
//!
//! # Choice
//!
//! * [`LbAlgo::Random`] (kube-proxy's iptables mode, `-m statistic --mode random`): uniform
//!   over the eligible endpoints from the caller's random value (see [`super::Rng`]).
//! * [`LbAlgo::Maglev`]: Maglev consistent hashing of the caller's flow hash (see
//!   [`super::maglev`]); the table is built on upsert. Endpoints eligible under `local_only`
//!   get their own table.
//! * With affinity, the client's previous endpoint wins while its entry lives (the timeout
//!   runs from the client's last new connection, as iptables' `recent --rcheck --seconds`
//!   with `--set` on each connection); an entry whose endpoint is gone (or not eligible) is
//!   replaced.
//!
//! # Dual stack
//!
//! A service has an IPv4 ClusterIP ([`ServiceSpec::vip`]), an IPv6 one
//! ([`ServiceSpec::vip6`]), or both: two frontends, each with the endpoints of its own family
//! ([`ServiceSpec::endpoints`], [`ServiceSpec::endpoints6`]) and its own choice among them
//! (random, Maglev over that family's endpoints, affinity keyed by the client's address of
//! that family), as kube-proxy programs iptables and ip6tables from one Service.
//! [`ServiceSpec::new`] takes the ClusterIP of either family; a service without an IPv4
//! ClusterIP has `vip` `None`. A node port answers on the families the service has ClusterIPs
//! of. The lookups and the choice are written once, generic over the family's address type
//! ([`ServiceAddr`]: [`Ipv4Addr`] or [`Ipv6Addr`]): `by_vip(dst, ..)` and `select(.., client,
//! ..)` take the family from their address, `by_node_port::<Ipv6Addr>(..)` names it.
//!
//! # LoadBalancer IPs and external IPs
//!
//! [`ServiceSpec::load_balancer_ips`] and [`ServiceSpec::external_ips`] are more frontends on
//! the service's port, of either family (each needs a ClusterIP of its family), answered by
//! [`Services::by_external`] with their [`FrontendKind`]. They live in a map of their own per
//! family, apart from the ClusterIPs: [`Services::by_vip`] stays one probe of a map of
//! ClusterIPs only. The datapath gives them kube-proxy's `KUBE-EXT-*` treatment (as a node
//! port) and filters the LoadBalancer IPs by [`ServiceSpec::source_allowed`].
//!
//! Every service has a [`ServiceId`], stable across upserts of the same name and never reused
//! after removal, for conntrack to store with its flows (to flush them per service later).

use std::fmt::{self, Write as _};
use std::hash::{BuildHasher, Hash};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use hashbrown::HashMap;
use parking_lot::Mutex;

use super::maglev::{self, Backend, Maglev};
use super::netfilter::Prefix;
use crate::conntrack::CtTable;
use crate::narrow::{reduce, scale};
use crate::time::Instant;
use crate::wire::family::{Family, IpProto};
use crate::wire::ipv4::{PROTO_TCP, PROTO_UDP};
use crate::wire::tuple::{Tuple, TupleWords};

/// Kubernetes' default `sessionAffinityConfig.clientIP.timeoutSeconds`: 3 hours.
pub const DEFAULT_AFFINITY_TIMEOUT: Duration = Duration::from_secs(10_800);

/// The longest affinity timeout Kubernetes accepts: one day.
pub const MAX_AFFINITY_TIMEOUT: Duration = Duration::from_secs(86_400);

/// Entries per affinity set.
const WAYS: usize = 8;

/// How new connections are spread over endpoints.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum LbAlgo {
    /// Uniform random choice, as kube-proxy's iptables mode.
    #[default]
    Random,
    /// Maglev consistent hashing of the flow hash.
    Maglev,
}

/// One backend of a service: an IPv4 one (`Endpoint`, the default) or an IPv6 one
/// (`Endpoint<Ipv6Addr>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Endpoint<A: ServiceAddr = Ipv4Addr> {
    /// Address and port traffic is sent to.
    pub addr: A::SocketAddr,
    /// True if the endpoint runs on this node (for the `Local` traffic policies).
    pub local: bool,
    /// Its EndpointSlice conditions (ready, serving, terminating): which endpoints a new
    /// connection may go to (see [`EndpointConditions`]).
    pub conditions: EndpointConditions,
}

impl<A: ServiceAddr> Endpoint<A> {
    /// A ready endpoint at `addr` (an IPv6 one's flow info and scope id are ignored).
    pub fn new(addr: A::SocketAddr, local: bool) -> Endpoint<A> {
        let (ip, port) = A::split(addr);
        Endpoint {
            addr: A::socket(ip, port),
            local,
            conditions: EndpointConditions::READY,
        }
    }

    /// The endpoint with `conditions` instead of its own.
    ///
    /// ```
    /// use std::net::SocketAddrV4;
    /// use tapyard::nat::service::{Endpoint, EndpointConditions};
    ///
    /// let a: SocketAddrV4 = "10.244.1.5:8080".parse().unwrap();
    /// let e: Endpoint = Endpoint::new(a, true).with_conditions(EndpointConditions::TERMINATING);
    /// assert!(!e.conditions.ready && e.conditions.serving && e.conditions.terminating);
    /// ```
    pub fn with_conditions(self, conditions: EndpointConditions) -> Endpoint<A> {
        Endpoint { conditions, ..self }
    }
}

/// An endpoint's conditions, as an EndpointSlice gives them (`conditions.ready`,
/// `.serving`, `.terminating`; absent `ready` and `serving` mean true, absent `terminating`
/// false: [`EndpointConditions::READY`], the default).
///
/// A Service's new connections go, as kube-proxy's `CategorizeEndpoints` (KEP-1669), to its
/// ready endpoints; only when none is ready, to those both serving and terminating (a pod
/// shutting down that still answers); never to the others. The node-local set (the `Local`
/// traffic policies) is chosen the same way among the local endpoints alone, so it may fall
/// back to terminating local endpoints while ready ones exist elsewhere.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EndpointConditions {
    /// Ready for new connections (a ready pod; every pod with `publishNotReadyAddresses`).
    pub ready: bool,
    /// Answering, whether or not it is terminating (a ready pod's readiness, also while it
    /// terminates).
    pub serving: bool,
    /// Shutting down.
    pub terminating: bool,
}

impl EndpointConditions {
    /// Ready and serving, not terminating: the default.
    pub const READY: EndpointConditions = EndpointConditions {
        ready: true,
        serving: true,
        terminating: false,
    };
    /// Serving and terminating, not ready: a pod shutting down that still answers, used
    /// only when no endpoint of its set is ready.
    pub const TERMINATING: EndpointConditions = EndpointConditions {
        ready: false,
        serving: true,
        terminating: true,
    };

    /// Usable when no endpoint of its set is ready (serving and terminating).
    pub fn fallback(self) -> bool {
        self.serving && self.terminating
    }
}

impl Default for EndpointConditions {
    fn default() -> Self {
        EndpointConditions::READY
    }
}

impl fmt::Display for EndpointConditions {
    /// The conditions that hold, comma separated (`ready,serving`), or `-` for none.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = [
            (self.ready, "ready"),
            (self.serving, "serving"),
            (self.terminating, "terminating"),
        ];
        let mut first = true;
        for (_, n) in names.iter().filter(|c| c.0) {
            if !first {
                f.write_str(",")?;
            }
            f.write_str(n)?;
            first = false;
        }
        if first {
            f.write_str("-")?;
        }
        Ok(())
    }
}

/// An address family's address as the Service table needs it: [`Ipv4Addr`] or [`Ipv6Addr`]
/// (sealed). [`Services`]' lookups and choice, [`ServiceRef::endpoints`] and [`Endpoint`] are
/// generic over it.
///
/// ```
/// use std::net::{Ipv6Addr, SocketAddrV6};
/// use tapyard::nat::service::ServiceAddr;
///
/// let a = <Ipv6Addr as ServiceAddr>::socket(Ipv6Addr::LOCALHOST, 80);
/// assert_eq!(a, SocketAddrV6::new(Ipv6Addr::LOCALHOST, 80, 0, 0));
/// assert_eq!(Ipv6Addr::split(a), (Ipv6Addr::LOCALHOST, 80));
/// ```
pub trait ServiceAddr: Family + sealed::Sealed {
    /// The family's endpoint address: [`SocketAddrV4`] or [`SocketAddrV6`].
    type SocketAddr: Copy
        + Eq
        + Ord
        + Hash
        + fmt::Debug
        + fmt::Display
        + Into<SocketAddr>
        + Backend
        + Send
        + Sync
        + 'static;

    /// The socket address of `ip` and `port` (IPv6: flow info and scope id 0).
    fn socket(ip: Self, port: u16) -> Self::SocketAddr;
    /// The address and port of `addr`.
    fn split(addr: Self::SocketAddr) -> (Self, u16);
}

impl ServiceAddr for Ipv4Addr {
    type SocketAddr = SocketAddrV4;
    #[inline]
    fn socket(ip: Ipv4Addr, port: u16) -> SocketAddrV4 {
        SocketAddrV4::new(ip, port)
    }
    #[inline]
    fn split(addr: SocketAddrV4) -> (Ipv4Addr, u16) {
        (*addr.ip(), addr.port())
    }
}

impl ServiceAddr for Ipv6Addr {
    type SocketAddr = SocketAddrV6;
    #[inline]
    fn socket(ip: Ipv6Addr, port: u16) -> SocketAddrV6 {
        SocketAddrV6::new(ip, port, 0, 0)
    }
    #[inline]
    fn split(addr: SocketAddrV6) -> (Ipv6Addr, u16) {
        (*addr.ip(), addr.port())
    }
}

/// The table's storage per family, picked by the address type (as the router's `RouteAddr`
/// picks its table): crate-private, so [`ServiceAddr`] stays sealed.
// The selectors hand out the table's private types; `Sealed` cannot be named outside this
// module, so they stay unreachable.
#[allow(private_interfaces, private_bounds)]
mod sealed {
    use std::hash::Hash;
    use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV4, SocketAddrV6};
    use std::sync::Arc;

    use hashbrown::HashMap;

    use super::{
        AffKey, Affinity, Endpoint, ExtEntry, Frontend, ServiceAddr, ServiceSpec, Services,
        Snapshot, SvcState, VipKey,
    };

    pub trait Sealed: Sized {
        /// The address as a map key (`u32`, `u128`).
        type Key: Copy + Eq + Hash + std::fmt::Debug;
        /// A (service, client) affinity key.
        type AffKey: AffKey;
        /// The spec's field of the family's endpoints, as messages name it.
        const ENDPOINTS_FIELD: &'static str;

        fn key(self) -> Self::Key;
        fn aff_key(id: u32, client: Self) -> Self::AffKey;
        /// A ClusterIP a service may have (unicast).
        fn vip_ok(self) -> bool;
        /// An endpoint address a service may have.
        fn endpoint_ok(self) -> bool;

        /// The spec's ClusterIP of the family.
        fn vip(spec: &ServiceSpec) -> Option<Self>;
        /// The spec's endpoints of the family.
        fn endpoints(spec: &ServiceSpec) -> &[Endpoint<Self>]
        where
            Self: ServiceAddr;
        /// The services by ClusterIP of the family.
        fn vips(snap: &Snapshot) -> &HashMap<VipKey<Self::Key>, Arc<SvcState>>;
        fn vips_mut(snap: &mut Snapshot) -> &mut HashMap<VipKey<Self::Key>, Arc<SvcState>>;
        /// The service version's frontend of the family.
        fn frontend(s: &SvcState) -> &Frontend<<Self as ServiceAddr>::SocketAddr>
        where
            Self: ServiceAddr;
        /// The affinity table of the family's clients.
        fn affinity(s: &Services) -> &Affinity<Self::AffKey, <Self as ServiceAddr>::SocketAddr>
        where
            Self: ServiceAddr;
        /// The services by LoadBalancer IP and external IP of the family.
        fn exts(snap: &Snapshot) -> &HashMap<VipKey<Self::Key>, ExtEntry>;
        fn exts_mut(snap: &mut Snapshot) -> &mut HashMap<VipKey<Self::Key>, ExtEntry>;
    }

    impl Sealed for Ipv4Addr {
        type Key = u32;
        /// `service id << 32 | client`.
        type AffKey = u64;
        const ENDPOINTS_FIELD: &'static str = "endpoints";

        #[inline]
        fn key(self) -> u32 {
            u32::from(self)
        }
        #[inline]
        fn aff_key(id: u32, client: Ipv4Addr) -> u64 {
            u64::from(id) << 32 | u64::from(u32::from(client))
        }
        fn vip_ok(self) -> bool {
            !(self.is_unspecified() || self.is_broadcast() || self.is_multicast())
        }
        fn endpoint_ok(self) -> bool {
            !self.is_unspecified()
        }
        #[inline]
        fn vip(spec: &ServiceSpec) -> Option<Ipv4Addr> {
            spec.vip
        }
        #[inline]
        fn endpoints(spec: &ServiceSpec) -> &[Endpoint<Ipv4Addr>] {
            &spec.endpoints
        }
        #[inline]
        fn vips(snap: &Snapshot) -> &HashMap<VipKey<u32>, Arc<SvcState>> {
            &snap.by_vip_v4
        }
        fn vips_mut(snap: &mut Snapshot) -> &mut HashMap<VipKey<u32>, Arc<SvcState>> {
            &mut snap.by_vip_v4
        }
        #[inline]
        fn frontend(s: &SvcState) -> &Frontend<SocketAddrV4> {
            &s.v4
        }
        #[inline]
        fn affinity(s: &Services) -> &Affinity<u64, SocketAddrV4> {
            &s.affinity_v4
        }
        #[inline]
        fn exts(snap: &Snapshot) -> &HashMap<VipKey<u32>, ExtEntry> {
            &snap.by_ext_v4
        }
        fn exts_mut(snap: &mut Snapshot) -> &mut HashMap<VipKey<u32>, ExtEntry> {
            &mut snap.by_ext_v4
        }
    }

    impl Sealed for Ipv6Addr {
        type Key = u128;
        /// `(service id, client)`.
        type AffKey = (u32, u128);
        const ENDPOINTS_FIELD: &'static str = "endpoints6";

        #[inline]
        fn key(self) -> u128 {
            u128::from(self)
        }
        #[inline]
        fn aff_key(id: u32, client: Ipv6Addr) -> (u32, u128) {
            (id, u128::from(client))
        }
        /// Not unspecified, loopback, multicast or IPv4-mapped.
        fn vip_ok(self) -> bool {
            !(self.is_unspecified()
                || self.is_loopback()
                || self.is_multicast()
                || self.to_ipv4_mapped().is_some())
        }
        fn endpoint_ok(self) -> bool {
            self.vip_ok()
        }
        #[inline]
        fn vip(spec: &ServiceSpec) -> Option<Ipv6Addr> {
            spec.vip6
        }
        #[inline]
        fn endpoints(spec: &ServiceSpec) -> &[Endpoint<Ipv6Addr>] {
            &spec.endpoints6
        }
        #[inline]
        fn vips(snap: &Snapshot) -> &HashMap<VipKey<u128>, Arc<SvcState>> {
            &snap.by_vip_v6
        }
        fn vips_mut(snap: &mut Snapshot) -> &mut HashMap<VipKey<u128>, Arc<SvcState>> {
            &mut snap.by_vip_v6
        }
        #[inline]
        fn frontend(s: &SvcState) -> &Frontend<SocketAddrV6> {
            &s.v6
        }
        #[inline]
        fn affinity(s: &Services) -> &Affinity<(u32, u128), SocketAddrV6> {
            &s.affinity_v6
        }
        #[inline]
        fn exts(snap: &Snapshot) -> &HashMap<VipKey<u128>, ExtEntry> {
            &snap.by_ext_v6
        }
        fn exts_mut(snap: &mut Snapshot) -> &mut HashMap<VipKey<u128>, ExtEntry> {
            &mut snap.by_ext_v6
        }
    }
}

/// A service as configured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceSpec {
    /// Unique name (`namespace/name:port` in Kubernetes terms); upserts are keyed by it.
    pub name: String,
    /// The IPv4 cluster IP, if the service has one (at least one of `vip` and `vip6` is
    /// set).
    pub vip: Option<Ipv4Addr>,
    /// The IPv6 cluster IP, if the service has one.
    pub vip6: Option<Ipv6Addr>,
    /// The service port on the cluster IP (nonzero).
    pub port: u16,
    /// IP protocol: [`IpProto::TCP`] or [`IpProto::UDP`]. (SCTP services are not supported:
    /// the tuple and the rewrites carry no SCTP ports, and SCTP's CRC32c cannot be patched
    /// incrementally.)
    pub proto: IpProto,
    /// The node port, if the service is of type NodePort (nonzero, unique per protocol).
    pub node_port: Option<u16>,
    /// The IPv4 backends (distinct addresses, nonzero ports; only with an IPv4 `vip`). Empty:
    /// connections to the IPv4 frontend are rejected.
    pub endpoints: Vec<Endpoint>,
    /// The IPv6 backends (distinct addresses, nonzero ports; only with a `vip6`). Empty:
    /// connections to the IPv6 frontend are rejected.
    pub endpoints6: Vec<Endpoint<Ipv6Addr>>,
    /// `sessionAffinity: ClientIP` with its timeout (1 s ..= 1 day;
    /// [`DEFAULT_AFFINITY_TIMEOUT`] in Kubernetes), or `None`.
    pub affinity: Option<Duration>,
    /// How endpoints are chosen.
    pub algo: LbAlgo,
    /// `externalTrafficPolicy: Local`: the datapath passes `local_only` to
    /// [`Services::select`] for external traffic to the node port. Stored here for it.
    pub external_local: bool,
    /// LoadBalancer ingress IPs (`status.loadBalancer.ingress[].ip`, VIP mode), of either
    /// family: each is a frontend on [`ServiceSpec::port`] with kube-proxy's `KUBE-EXT-*`
    /// semantics (as a node port: policy Cluster masquerades every client; Local keeps the
    /// client's address and uses local endpoints, pods and the node going to every
    /// endpoint), filtered by [`ServiceSpec::load_balancer_source_ranges`]. Each needs a
    /// ClusterIP of its family, is unicast, listed once (here or in
    /// [`ServiceSpec::external_ips`]) and no other Service's frontend on the same port and
    /// protocol. Empty by default.
    pub load_balancer_ips: Vec<IpAddr>,
    /// `spec.externalIPs`, of either family: frontends on [`ServiceSpec::port`] as the
    /// LoadBalancer IPs (the same `KUBE-EXT-*` semantics), never filtered by source ranges.
    /// The same rules as [`ServiceSpec::load_balancer_ips`]. Empty by default.
    pub external_ips: Vec<IpAddr>,
    /// `spec.loadBalancerSourceRanges`, of either family: a new connection to a LoadBalancer
    /// IP of family F from a source outside every range of family F is dropped
    /// ([`crate::stats::DropReason::LbSourceRange`]), as kube-proxy's `KUBE-FW-*` chain.
    /// As kube-proxy, each family is filtered by its own ranges: a family without ranges (or
    /// with a `/0`) is not filtered; ClusterIPs, node ports and external IPs never are. A
    /// prefix's length is at most its family's (32, 128); host bits are ignored. Empty by
    /// default.
    pub load_balancer_source_ranges: Vec<Prefix<IpAddr>>,
    /// `internalTrafficPolicy: Local`: the datapath passes `local_only` to
    /// [`Services::select`] for traffic to the ClusterIP, so it goes only to endpoints on
    /// this node (none there but some elsewhere: dropped, as kube-proxy). Node-port traffic
    /// keeps `external_local`'s policy.
    pub internal_local: bool,
    /// `healthCheckNodePort` (with [`ServiceSpec::external_local`]): the TCP port of the
    /// node's addresses where the router's local stack answers load balancers' health checks
    /// for the Service, `200` with endpoints on this node and `503` without, as kube-proxy
    /// ([`Services::health_check`]). Nonzero; unique among the node's health ports but for
    /// the ports of one Kubernetes Service (`namespace/name:port` names sharing
    /// `namespace/name`), which share theirs; no TCP node port of any Service.
    pub health_check_node_port: Option<u16>,
}

impl ServiceSpec {
    /// A service with the ClusterIP `vip` (of either family: set the other family's with
    /// [`ServiceSpec::vip`] or [`ServiceSpec::vip6`] for a dual-stack service), no node port,
    /// no endpoints, no affinity, random choice.
    ///
    /// ```
    /// use std::net::{Ipv4Addr, Ipv6Addr};
    /// use tapyard::nat::ServiceSpec;
    /// use tapyard::wire::family::IpProto;
    ///
    /// let mut dns = ServiceSpec::new("dns", Ipv6Addr::new(0xfd00, 0x10, 0x96, 0, 0, 0, 0, 10), 53, IpProto::UDP);
    /// assert_eq!((dns.vip, dns.has_frontend::<Ipv6Addr>()), (None, true));
    /// dns.vip = Some(Ipv4Addr::new(10, 96, 0, 10));
    /// assert!(dns.has_frontend::<Ipv4Addr>());
    /// ```
    pub fn new(
        name: impl Into<String>,
        vip: impl Into<IpAddr>,
        port: u16,
        proto: IpProto,
    ) -> ServiceSpec {
        let (vip, vip6) = match vip.into() {
            IpAddr::V4(a) => (Some(a), None),
            IpAddr::V6(a) => (None, Some(a)),
        };
        ServiceSpec {
            name: name.into(),
            vip,
            vip6,
            port,
            proto,
            node_port: None,
            endpoints: Vec::new(),
            endpoints6: Vec::new(),
            affinity: None,
            algo: LbAlgo::Random,
            external_local: false,
            load_balancer_ips: Vec::new(),
            external_ips: Vec::new(),
            load_balancer_source_ranges: Vec::new(),
            internal_local: false,
            health_check_node_port: None,
        }
    }

    /// True if the service has a ClusterIP of family `A` (a frontend of that family):
    /// `has_frontend::<Ipv4Addr>()`, `has_frontend::<Ipv6Addr>()`.
    pub fn has_frontend<A: ServiceAddr>(&self) -> bool {
        A::vip(self).is_some()
    }

    /// The frontends besides the ClusterIPs (`load_balancer_ips`, then `external_ips`), each
    /// with its kind.
    pub fn external_frontends(&self) -> impl Iterator<Item = (IpAddr, FrontendKind)> + '_ {
        let lb = self.load_balancer_ips.iter();
        let ext = self.external_ips.iter();
        lb.map(|ip| (*ip, FrontendKind::LoadBalancer))
            .chain(ext.map(|ip| (*ip, FrontendKind::ExternalIp)))
    }

    /// Whether `loadBalancerSourceRanges` let `src` reach a LoadBalancer IP of `src`'s
    /// family: true when the Service has no range of that family or one of `/0` (kube-proxy
    /// then makes no `KUBE-FW-*` chain), else when a range of the family contains `src`.
    pub fn source_allowed(&self, src: IpAddr) -> bool {
        let mut ranges = self
            .load_balancer_source_ranges
            .iter()
            .filter(|r| r.addr.is_ipv6() == src.is_ipv6())
            .peekable();
        if ranges.peek().is_none() {
            return true;
        }
        ranges.any(|r| r.len == 0 || r.contains_ip(src))
    }

    /// The ClusterIP of family `A`, if the service has one (`vip` or `vip6`).
    pub fn vip_of<A: ServiceAddr>(&self) -> Option<A> {
        A::vip(self)
    }

    /// The endpoints of family `A` (`endpoints` or `endpoints6`).
    pub fn endpoints_of<A: ServiceAddr>(&self) -> &[Endpoint<A>] {
        A::endpoints(self)
    }
}

/// Which kind of frontend besides a ClusterIP a destination is (see
/// [`Services::by_external`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FrontendKind {
    /// A LoadBalancer ingress IP ([`ServiceSpec::load_balancer_ips`]): source ranges apply.
    LoadBalancer,
    /// An external IP ([`ServiceSpec::external_ips`]).
    ExternalIp,
}

impl FrontendKind {
    /// The spec's field holding frontends of this kind, as messages name it.
    pub fn field(self) -> &'static str {
        match self {
            FrontendKind::LoadBalancer => "load_balancer_ips",
            FrontendKind::ExternalIp => "external_ips",
        }
    }
}

/// A service's identifier: small, nonzero, stable across upserts of the same name, never
/// reused after removal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceId(u32);

impl ServiceId {
    /// The identifier with value `v`, `None` for 0.
    pub fn new(v: u32) -> Option<ServiceId> {
        (v != 0).then_some(ServiceId(v))
    }
    /// The value (nonzero; conntrack may use 0 for "no service").
    pub fn get(self) -> u32 {
        self.0
    }
}

impl From<ServiceId> for u32 {
    fn from(id: ServiceId) -> u32 {
        id.0
    }
}

impl fmt::Display for ServiceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Why a service was refused. Each message names the service, the field and the value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServiceError {
    /// The name is empty.
    EmptyName,
    /// A field that must be nonzero is zero (`port`, `node_port`).
    ZeroPort {
        /// The service.
        service: String,
        /// The field.
        field: &'static str,
    },
    /// The VIP is no unicast address: IPv4 0.0.0.0 (without an IPv6 VIP), broadcast or
    /// multicast; IPv6 unspecified, loopback, multicast or IPv4-mapped. Named `vip` or `vip6`
    /// in the message by its family.
    BadVip {
        /// The service.
        service: String,
        /// The value.
        vip: IpAddr,
    },
    /// The protocol is not TCP or UDP.
    UnsupportedProto {
        /// The service.
        service: String,
        /// The value.
        proto: u8,
    },
    /// Another service already has this VIP (of either family), port and protocol.
    DuplicateVip {
        /// The service.
        service: String,
        /// The value of `vip` or `vip6`.
        vip: IpAddr,
        /// The value of `port`.
        port: u16,
        /// The value of `proto`.
        proto: u8,
        /// The service that has it.
        other: String,
    },
    /// Another service already has this node port and protocol.
    DuplicateNodePort {
        /// The service.
        service: String,
        /// The value of `node_port`.
        node_port: u16,
        /// The value of `proto`.
        proto: u8,
        /// The service that has it.
        other: String,
    },
    /// An endpoint (of either family) is listed twice.
    DuplicateEndpoint {
        /// The service.
        service: String,
        /// The value.
        endpoint: SocketAddr,
    },
    /// An endpoint has port 0, or address 0.0.0.0 (IPv4) or no unicast address (IPv6).
    BadEndpoint {
        /// The service.
        service: String,
        /// The value.
        endpoint: SocketAddr,
    },
    /// The affinity timeout is outside 1 s ..= 1 day.
    BadAffinityTimeout {
        /// The service.
        service: String,
        /// The value.
        timeout: Duration,
    },
    /// More endpoints than [`maglev::MAX_BACKENDS`].
    TooManyEndpoints {
        /// The service.
        service: String,
        /// The number given.
        count: usize,
    },
    /// Every service identifier has been used (2^32 - 1 services created).
    IdsExhausted,
    /// Endpoints of a family the service has no ClusterIP of (`field` is `endpoints` for
    /// IPv4 ones without an IPv4 `vip`, `endpoints6` for IPv6 ones without a `vip6`).
    NoClusterIp {
        /// The service.
        service: String,
        /// The field holding the endpoints.
        field: &'static str,
    },
    /// A LoadBalancer IP or external IP (`field`: `load_balancer_ips`, `external_ips`) that
    /// is no unicast address (as [`ServiceError::BadVip`]), or of a family the service has no
    /// ClusterIP of (`no_family`).
    BadExternalIp {
        /// The service.
        service: String,
        /// The field holding it.
        field: &'static str,
        /// The value.
        ip: IpAddr,
        /// True when it is unicast but the service has no ClusterIP of its family.
        no_family: bool,
    },
    /// A LoadBalancer IP or external IP listed twice in the service (in either list), or equal
    /// to the service's own ClusterIP.
    DuplicateExternalIp {
        /// The service.
        service: String,
        /// The field holding the second one.
        field: &'static str,
        /// The value.
        ip: IpAddr,
    },
    /// A frontend (ClusterIP, LoadBalancer IP or external IP) whose address, port and protocol
    /// are another service's frontend (of any kind).
    FrontendInUse {
        /// The service.
        service: String,
        /// Its field holding the address (`vip`, `vip6`, `load_balancer_ips`, `external_ips`).
        field: &'static str,
        /// The address.
        ip: IpAddr,
        /// The port.
        port: u16,
        /// The protocol.
        proto: u8,
        /// The service that has it.
        other: String,
        /// That service's field holding it.
        other_field: &'static str,
    },
    /// A `load_balancer_source_ranges` prefix longer than its family's addresses.
    BadSourceRange {
        /// The service.
        service: String,
        /// The value.
        range: Prefix<IpAddr>,
    },
    /// The health check node port is another Kubernetes Service's health port, or a TCP node
    /// port.
    DuplicateHealthPort {
        /// The service.
        service: String,
        /// The value of `health_check_node_port`.
        port: u16,
        /// The service that has it.
        other: String,
    },
}

fn proto_name(p: u8) -> &'static str {
    match p {
        PROTO_TCP => "TCP",
        PROTO_UDP => "UDP",
        _ => "?",
    }
}

impl fmt::Display for ServiceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use ServiceError::*;
        match self {
            EmptyName => f.write_str("service name: empty"),
            ZeroPort { service, field } => write!(f, "service {service:?}: {field} 0 not allowed"),
            BadVip { service, vip } => {
                let field = if vip.is_ipv6() { "vip6" } else { "vip" };
                write!(f, "service {service:?}: {field} {vip} is not a unicast address")
            }
            DuplicateVip {
                service,
                vip,
                port,
                proto,
                other,
            } => {
                let field = if vip.is_ipv6() { "vip6" } else { "vip" };
                write!(
                    f,
                    "service {service:?}: {field}:port {}/{} already used by service {other:?}",
                    SocketAddr::new(*vip, *port),
                    proto_name(*proto)
                )
            }
            UnsupportedProto { service, proto } => write!(
                f,
                "service {service:?}: proto {proto} not supported (TCP 6, UDP 17)"
            ),
            DuplicateNodePort {
                service,
                node_port,
                proto,
                other,
            } => write!(
                f,
                "service {service:?}: node_port {node_port}/{} already used by service {other:?}",
                proto_name(*proto)
            ),
            DuplicateEndpoint { service, endpoint } => {
                write!(f, "service {service:?}: endpoint {endpoint} listed twice")
            }
            BadEndpoint { service, endpoint } if endpoint.is_ipv6() => write!(
                f,
                "service {service:?}: endpoint {endpoint} needs a unicast address and a nonzero port"
            ),
            BadEndpoint { service, endpoint } => write!(
                f,
                "service {service:?}: endpoint {endpoint} needs a nonzero address and port"
            ),
            BadAffinityTimeout { service, timeout } => write!(
                f,
                "service {service:?}: affinity timeout {}s outside 1..=86400 s",
                timeout.as_secs_f64()
            ),
            TooManyEndpoints { service, count } => write!(
                f,
                "service {service:?}: {count} endpoints, at most {} allowed",
                maglev::MAX_BACKENDS
            ),
            IdsExhausted => f.write_str("service ids exhausted"),
            DuplicateHealthPort {
                service,
                port,
                other,
            } => write!(
                f,
                "service {service:?}: health_check_node_port {port} already used by service {other:?}"
            ),
            NoClusterIp { service, field } => write!(
                f,
                "service {service:?}: {field} given without a ClusterIP of their family ({})",
                if *field == "endpoints6" { "vip6" } else { "vip" }
            ),
            BadExternalIp {
                service,
                field,
                ip,
                no_family: true,
            } => write!(
                f,
                "service {service:?}: {field} {ip} given without a ClusterIP of its family ({})",
                if ip.is_ipv6() { "vip6" } else { "vip" }
            ),
            BadExternalIp {
                service, field, ip, ..
            } => write!(f, "service {service:?}: {field} {ip} is not a unicast address"),
            DuplicateExternalIp { service, field, ip } => write!(
                f,
                "service {service:?}: {field} {ip} listed twice (or is its ClusterIP)"
            ),
            FrontendInUse {
                service,
                field,
                ip,
                port,
                proto,
                other,
                other_field,
            } => write!(
                f,
                "service {service:?}: {field} {}/{} is already service {other:?}'s ({other_field})",
                SocketAddr::new(*ip, *port),
                proto_name(*proto)
            ),
            BadSourceRange { service, range } => write!(
                f,
                "service {service:?}: load_balancer_source_ranges {range} has a prefix length over {}",
                if range.addr.is_ipv6() { 128 } else { 32 }
            ),
        }
    }
}

impl std::error::Error for ServiceError {}

/// An endpoint address of either family (what a frontend is generic over).
trait EpAddr: Copy + Ord + Backend + fmt::Debug {}
impl<S: Copy + Ord + Backend + fmt::Debug> EpAddr for S {}

/// One family's frontend of one version of a service, with everything `select` needs
/// precomputed: the endpoints a new connection may go to under each policy, as kube-proxy's
/// `CategorizeEndpoints` picks them (see [`EndpointConditions`]).
#[derive(Debug)]
struct Frontend<A> {
    /// The cluster-wide set (policy `Cluster`): the ready endpoints, else the serving
    /// terminating ones. Empty: the service has no usable endpoint (REJECT).
    cluster: Eligible<A>,
    /// The node-local set (policy `Local`), chosen the same way among the local endpoints;
    /// `None` when it is the cluster set itself (every usable endpoint local, and of the same
    /// kind), which then serves both.
    local: Option<Eligible<A>>,
}

/// The endpoints one policy may choose from.
#[derive(Debug)]
struct Eligible<A> {
    /// In spec order (random choice).
    eps: Box<[A]>,
    /// Sorted, for membership tests; Maglev's indices are into it.
    sorted: Box<[A]>,
    /// Maglev over `sorted` (algo Maglev, nonempty), built in address order so the table does
    /// not depend on the order endpoints are listed in.
    maglev: Option<Maglev>,
}

/// One version of one service.
#[derive(Debug)]
struct SvcState {
    id: ServiceId,
    spec: ServiceSpec,
    v4: Frontend<SocketAddrV4>,
    v6: Frontend<SocketAddrV6>,
}

/// `CategorizeEndpoints` for one policy over `eps` (address, conditions), in order: the ready
/// ones, or when there is none, the serving terminating ones.
fn usable<A: Copy>(eps: impl Iterator<Item = (A, EndpointConditions)> + Clone) -> Vec<A> {
    let ready: Vec<A> = eps.clone().filter(|e| e.1.ready).map(|e| e.0).collect();
    if !ready.is_empty() {
        return ready;
    }
    eps.filter(|e| e.1.fallback()).map(|e| e.0).collect()
}

impl<A: EpAddr> Eligible<A> {
    /// The set of `eps` (spec order); `prev_size`: the previous version's Maglev table size.
    fn new(eps: Vec<A>, algo: LbAlgo, prev_size: Option<u32>) -> Self {
        let mut sorted = eps.clone();
        sorted.sort_unstable();
        let maglev = (algo == LbAlgo::Maglev && !sorted.is_empty()).then(|| {
            let m = maglev::table_size_for_update(prev_size, sorted.len());
            Maglev::with_size(&sorted, m)
        });
        Eligible {
            eps: eps.into_boxed_slice(),
            sorted: sorted.into_boxed_slice(),
            maglev: maglev.flatten(),
        }
    }

    /// Its table's size, for the next version to reuse (a table has at most 65537 slots; one
    /// that did not fit would just not be reused).
    fn maglev_size(&self) -> Option<u32> {
        self.maglev
            .as_ref()
            .and_then(|m| u32::try_from(m.len()).ok())
    }

    #[inline]
    fn contains(&self, ep: A) -> bool {
        self.sorted.binary_search(&ep).is_ok()
    }

    #[inline]
    fn pick(&self, algo: LbAlgo, flow_hash: u64, rand: u64) -> Option<A> {
        let n = self.eps.len();
        if n == 0 {
            return None;
        }
        if let (LbAlgo::Maglev, Some(m)) = (algo, &self.maglev) {
            return self.sorted.get(m.lookup(flow_hash)).copied();
        }
        // Lemire's multiply-shift: uniform within 2^-64 bias, no division.
        self.eps.get(scale(rand, n)).copied()
    }
}

impl<A: EpAddr> Frontend<A> {
    /// The set a connection chooses from: the local one with `local_only`.
    #[inline]
    fn set(&self, local_only: bool) -> &Eligible<A> {
        match (local_only, &self.local) {
            (true, Some(l)) => l,
            _ => &self.cluster,
        }
    }

    fn eligible(&self, ep: A, local_only: bool) -> bool {
        self.set(local_only).contains(ep)
    }

    #[inline]
    fn pick(&self, algo: LbAlgo, flow_hash: u64, rand: u64, local_only: bool) -> Option<A> {
        self.set(local_only).pick(algo, flow_hash, rand)
    }

    /// The frontend over `list` (address, local, conditions); `Err(addr)` for an address
    /// listed twice.
    fn build(
        list: &[(A, bool, EndpointConditions)],
        algo: LbAlgo,
        prev: Option<&Frontend<A>>,
    ) -> Result<Self, A> {
        let mut all: Vec<A> = list.iter().map(|e| e.0).collect();
        all.sort_unstable();
        if let Some(w) = all.windows(2).find(|w| w[0] == w[1]) {
            return Err(w[0]);
        }
        let every = list.iter().map(|e| (e.0, e.2));
        let cluster = usable(every);
        let local = usable(list.iter().filter(|e| e.1).map(|e| (e.0, e.2)));
        let prev_cluster = prev.and_then(|p| p.cluster.maglev_size());
        let local = (local != cluster).then(|| {
            let prev_local = prev.and_then(|p| p.local.as_ref()?.maglev_size());
            Eligible::new(local, algo, prev_local)
        });
        Ok(Frontend {
            cluster: Eligible::new(cluster, algo, prev_cluster),
            local,
        })
    }
}

/// A reference to one version of one service, from [`Services::by_vip`] or
/// [`Services::by_node_port`]. Cheap to clone; keeps its version alive while held.
#[derive(Clone, Debug)]
pub struct ServiceRef(Arc<SvcState>);

impl ServiceRef {
    /// The service's identifier.
    pub fn id(&self) -> ServiceId {
        self.0.id
    }
    /// The service as configured.
    pub fn spec(&self) -> &ServiceSpec {
        &self.0.spec
    }
    /// The service's name.
    pub fn name(&self) -> &str {
        &self.0.spec.name
    }
    /// The endpoints of family `A`: `endpoints::<Ipv4Addr>()` ([`ServiceSpec::endpoints`]),
    /// `endpoints::<Ipv6Addr>()` ([`ServiceSpec::endpoints6`]).
    pub fn endpoints<A: ServiceAddr>(&self) -> &[Endpoint<A>] {
        A::endpoints(&self.0.spec)
    }
    /// True if `ep` (of either family) is one of the endpoints of its family a new
    /// connection may go to: in the cluster-wide set, or with `local_only` the node-local one
    /// (see [`EndpointConditions`]).
    pub fn has_endpoint(&self, ep: impl Into<SocketAddr>, local_only: bool) -> bool {
        match ep.into() {
            SocketAddr::V4(ep) => self.has_endpoint_of::<Ipv4Addr>(ep, local_only),
            SocketAddr::V6(ep) => self.has_endpoint_of::<Ipv6Addr>(ep, local_only),
        }
    }
    fn has_endpoint_of<A: ServiceAddr>(&self, ep: A::SocketAddr, local_only: bool) -> bool {
        let (ip, port) = A::split(ep);
        A::frontend(&self.0).eligible(A::socket(ip, port), local_only)
    }
    /// The endpoints of family `A` a new connection may go to, in spec order: the
    /// cluster-wide set (the ready ones, else the serving terminating ones), or with
    /// `local_only` the node-local set, chosen the same way among the local endpoints
    /// (kube-proxy's `CategorizeEndpoints`).
    pub fn eligible<A: ServiceAddr>(&self, local_only: bool) -> &[A::SocketAddr] {
        &A::frontend(&self.0).set(local_only).eps
    }
    /// True if the service has an endpoint of family `A` any new connection may go to (ready,
    /// or serving and terminating), on this node or not: kube-proxy's `hasEndpoints`. Without
    /// one, connections are rejected; with one but none local, a `Local` policy drops them.
    #[inline]
    pub fn has_usable_endpoints<A: ServiceAddr>(&self) -> bool {
        !A::frontend(&self.0).cluster.eps.is_empty()
    }
}

/// A ClusterIP (its map key: `u32`, `u128`), port and protocol.
type VipKey<K> = (K, u16, u8);

/// A service under one of its LoadBalancer or external IPs, with the kind of that frontend.
type ExtEntry = (Arc<SvcState>, FrontendKind);

#[derive(Default, Debug, Clone)]
struct Snapshot {
    by_name: HashMap<String, Arc<SvcState>>,
    by_vip_v4: HashMap<VipKey<u32>, Arc<SvcState>>,
    by_vip_v6: HashMap<VipKey<u128>, Arc<SvcState>>,
    by_node_port: HashMap<(u16, u8), Arc<SvcState>>,
    /// LoadBalancer and external IPs, apart from the ClusterIPs so that a ClusterIP's lookup
    /// stays one probe of a map of ClusterIPs only (an empty map answers without hashing).
    by_ext_v4: HashMap<VipKey<u32>, ExtEntry>,
    by_ext_v6: HashMap<VipKey<u128>, ExtEntry>,
}

/// Counters and size of the affinity table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AffinityStats {
    /// Connections sent to the client's remembered endpoint.
    pub hits: u64,
    /// Connections from clients without an entry (a new entry was made).
    pub misses: u64,
    /// Entries found expired and replaced.
    pub expired: u64,
    /// Entries whose endpoint was gone (or not eligible) and were replaced.
    pub stale: u64,
    /// Live entries evicted to make room.
    pub evictions: u64,
    /// Entries in use (live or expired, not yet reused).
    pub entries: u64,
    /// The table's capacity (at most `max_affinity_entries`).
    pub capacity: u64,
}

/// An affinity key: `K::default()` marks an empty slot (service ids are nonzero, so no real
/// key is the default).
trait AffKey: Copy + Default + Eq + std::hash::Hash {}
impl AffKey for u64 {}
impl AffKey for (u32, u128) {}

#[derive(Clone, Copy, Default, Debug)]
struct Slot<K, E> {
    /// IPv4: `service id << 32 | client`; IPv6: `(service id, client)`. Default = empty.
    key: K,
    ep: Option<E>,
    expires: Instant,
}

#[derive(Debug)]
struct Set<K, E> {
    slots: [Slot<K, E>; WAYS],
    stats: AffinityStats,
}

impl<K: AffKey, E: Copy> Default for Set<K, E> {
    fn default() -> Self {
        Set {
            slots: [Slot {
                key: K::default(),
                ep: None,
                expires: Instant::default(),
            }; WAYS],
            stats: AffinityStats::default(),
        }
    }
}

#[derive(Debug)]
struct Affinity<K, E> {
    sets: Box<[Mutex<Set<K, E>>]>,
    ways: usize,
    hasher: std::collections::hash_map::RandomState,
}

impl<K: AffKey, E: Copy> Affinity<K, E> {
    fn new(max: usize) -> Self {
        let ways = max.min(WAYS);
        let n = max.checked_div(ways).unwrap_or(0);
        Affinity {
            sets: (0..n).map(|_| Mutex::new(Set::default())).collect(),
            ways,
            hasher: Default::default(),
        }
    }

    /// The remembered endpoint of `key` if live and `valid`, refreshed; otherwise `choose()`,
    /// remembered. Without capacity, just `choose()`.
    fn get_or_insert(
        &self,
        key: K,
        now: Instant,
        timeout: Duration,
        valid: impl Fn(E) -> bool,
        choose: impl FnOnce() -> Option<E>,
    ) -> Option<E> {
        if self.sets.is_empty() {
            return choose();
        }
        let h = self.hasher.hash_one(key);
        let Some(set) = self.sets.get(reduce(h, self.sets.len())) else {
            return choose();
        };
        let mut set = set.lock();
        let ways = self.ways.min(WAYS);
        let set = &mut *set;
        let slots = &mut set.slots[..ways];
        let expires = now + timeout;
        let empty = K::default();
        if let Some(s) = slots.iter_mut().find(|s| s.key == key) {
            if let Some(ep) = s.ep.filter(|&ep| now < s.expires && valid(ep)) {
                set.stats.hits += 1;
                s.expires = expires;
                return Some(ep);
            }
            if now < s.expires {
                set.stats.stale += 1;
            } else {
                set.stats.expired += 1;
            }
            let ep = choose()?;
            *s = Slot {
                key,
                ep: Some(ep),
                expires,
            };
            return Some(ep);
        }
        set.stats.misses += 1;
        let ep = choose()?;
        // Victim: an empty slot, else an expired one, else the one closest to expiry.
        let victim = slots
            .iter_mut()
            .min_by_key(|s| (s.key != empty, s.expires > now, s.expires));
        if let Some(v) = victim {
            if v.key != empty {
                if v.expires > now {
                    set.stats.evictions += 1;
                } else {
                    set.stats.expired += 1;
                }
            }
            *v = Slot {
                key,
                ep: Some(ep),
                expires,
            };
        }
        Some(ep)
    }

    /// Remembers `ep` for `key` until `expires` (a restart's rebuild from kept connections),
    /// unless the set already has a later entry for the key. Evicts as `get_or_insert` does;
    /// counts nothing.
    fn restore(&self, key: K, ep: E, expires: Instant, now: Instant) {
        if self.sets.is_empty() || expires <= now {
            return;
        }
        let h = self.hasher.hash_one(key);
        let Some(set) = self.sets.get(reduce(h, self.sets.len())) else {
            return;
        };
        let mut set = set.lock();
        let ways = self.ways.min(WAYS);
        let slots = &mut set.slots[..ways];
        let slot = Slot {
            key,
            ep: Some(ep),
            expires,
        };
        let empty = K::default();
        if let Some(s) = slots.iter_mut().find(|s| s.key == key) {
            if s.expires < expires {
                *s = slot;
            }
            return;
        }
        if let Some(v) = slots
            .iter_mut()
            .min_by_key(|s| (s.key != empty, s.expires > now, s.expires))
        {
            if v.key == empty || v.expires < expires {
                *v = slot;
            }
        }
    }

    fn stats(&self) -> AffinityStats {
        let mut t = AffinityStats {
            capacity: (self.sets.len() * self.ways) as u64,
            ..Default::default()
        };
        for s in self.sets.iter() {
            let s = s.lock();
            t.hits += s.stats.hits;
            t.misses += s.stats.misses;
            t.expired += s.stats.expired;
            t.stale += s.stats.stale;
            t.evictions += s.stats.evictions;
            t.entries += s.slots.iter().filter(|x| x.key != K::default()).count() as u64;
        }
        t
    }
}

#[derive(Debug)]
struct Writer {
    next_id: u32,
}

/// All services of a node: lookups by VIP and node port, endpoint selection, session
/// affinity. `Send + Sync`; see the [module docs](self) for the threading rules.
pub struct Services {
    snap: ArcSwap<Snapshot>,
    writer: Mutex<Writer>,
    affinity_v4: Affinity<u64, SocketAddrV4>,
    affinity_v6: Affinity<(u32, u128), SocketAddrV6>,
}

impl fmt::Debug for Services {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Services")
            .field("services", &self.snap.load().by_name.len())
            .field("affinity", &self.affinity_stats())
            .finish()
    }
}

fn validate(spec: &ServiceSpec) -> Result<(), ServiceError> {
    let service = || spec.name.clone();
    if spec.name.is_empty() {
        return Err(ServiceError::EmptyName);
    }
    if spec.port == 0 {
        return Err(ServiceError::ZeroPort {
            service: service(),
            field: "port",
        });
    }
    if spec.node_port == Some(0) {
        return Err(ServiceError::ZeroPort {
            service: service(),
            field: "node_port",
        });
    }
    if spec.health_check_node_port == Some(0) {
        return Err(ServiceError::ZeroPort {
            service: service(),
            field: "health_check_node_port",
        });
    }
    if spec.vip.is_none() && spec.vip6.is_none() {
        return Err(ServiceError::BadVip {
            service: service(),
            vip: Ipv4Addr::UNSPECIFIED.into(),
        });
    }
    validate_frontend::<Ipv4Addr>(spec)?;
    validate_frontend::<Ipv6Addr>(spec)?;
    if !matches!(spec.proto, IpProto::TCP | IpProto::UDP) {
        return Err(ServiceError::UnsupportedProto {
            service: service(),
            proto: spec.proto.number(),
        });
    }
    if let Some(t) = spec.affinity {
        if t < Duration::from_secs(1) || t > MAX_AFFINITY_TIMEOUT {
            return Err(ServiceError::BadAffinityTimeout {
                service: service(),
                timeout: t,
            });
        }
    }
    validate_endpoints::<Ipv4Addr>(spec)?;
    validate_endpoints::<Ipv6Addr>(spec)?;
    validate_external(spec)
}

/// Whether `ip`, of family `A`, is unicast and `spec` has a ClusterIP of that family
/// (`None`: `ip` is of the other family).
fn unicast_of<A: ServiceAddr>(spec: &ServiceSpec, ip: IpAddr) -> Option<(bool, bool)> {
    A::from_ip(ip).map(|a| (a.vip_ok(), spec.has_frontend::<A>()))
}

/// LoadBalancer and external IPs: unicast, of a family with a ClusterIP, each listed once
/// and none the service's own ClusterIP; source ranges no longer than their family.
fn validate_external(spec: &ServiceSpec) -> Result<(), ServiceError> {
    let service = || spec.name.clone();
    let mut seen: Vec<IpAddr> = Vec::new();
    seen.extend(spec.vip.map(IpAddr::from));
    seen.extend(spec.vip6.map(IpAddr::from));
    for (ip, kind) in spec.external_frontends() {
        let (ok, family) = unicast_of::<Ipv4Addr>(spec, ip)
            .or_else(|| unicast_of::<Ipv6Addr>(spec, ip))
            .unwrap_or_default();
        if !ok || !family {
            return Err(ServiceError::BadExternalIp {
                service: service(),
                field: kind.field(),
                ip,
                no_family: ok,
            });
        }
        if seen.contains(&ip) {
            return Err(ServiceError::DuplicateExternalIp {
                service: service(),
                field: kind.field(),
                ip,
            });
        }
        seen.push(ip);
    }
    let bits = |r: &Prefix<IpAddr>| if r.addr.is_ipv6() { 128 } else { 32 };
    match spec
        .load_balancer_source_ranges
        .iter()
        .find(|r| r.len > bits(r))
    {
        Some(r) => Err(ServiceError::BadSourceRange {
            service: service(),
            range: *r,
        }),
        None => Ok(()),
    }
}

/// The family's ClusterIP is unicast, and there are endpoints of the family only with one.
fn validate_frontend<A: ServiceAddr>(spec: &ServiceSpec) -> Result<(), ServiceError> {
    if let Some(vip) = A::vip(spec).filter(|v| !v.vip_ok()) {
        return Err(ServiceError::BadVip {
            service: spec.name.clone(),
            vip: vip.into(),
        });
    }
    if !spec.has_frontend::<A>() && !A::endpoints(spec).is_empty() {
        return Err(ServiceError::NoClusterIp {
            service: spec.name.clone(),
            field: A::ENDPOINTS_FIELD,
        });
    }
    Ok(())
}

/// The family's endpoints are few enough, with nonzero ports and usable addresses.
fn validate_endpoints<A: ServiceAddr>(spec: &ServiceSpec) -> Result<(), ServiceError> {
    let eps = A::endpoints(spec);
    if eps.len() > maglev::MAX_BACKENDS {
        return Err(ServiceError::TooManyEndpoints {
            service: spec.name.clone(),
            count: eps.len(),
        });
    }
    match eps.iter().find(|e| {
        let (ip, port) = A::split(e.addr);
        port == 0 || !ip.endpoint_ok()
    }) {
        Some(e) => Err(ServiceError::BadEndpoint {
            service: spec.name.clone(),
            endpoint: e.addr.into(),
        }),
        None => Ok(()),
    }
}

fn build(
    id: ServiceId,
    spec: ServiceSpec,
    prev: Option<&SvcState>,
) -> Result<SvcState, ServiceError> {
    let v4 = build_frontend::<Ipv4Addr>(&spec, prev)?;
    let v6 = build_frontend::<Ipv6Addr>(&spec, prev)?;
    Ok(SvcState { id, spec, v4, v6 })
}

/// The family's frontend of `spec` (`prev`: the service's previous version).
fn build_frontend<A: ServiceAddr>(
    spec: &ServiceSpec,
    prev: Option<&SvcState>,
) -> Result<Frontend<A::SocketAddr>, ServiceError> {
    let list: Vec<(A::SocketAddr, bool, EndpointConditions)> = A::endpoints(spec)
        .iter()
        .map(|e| (e.addr, e.local, e.conditions))
        .collect();
    Frontend::build(&list, spec.algo, prev.map(A::frontend)).map_err(|endpoint| {
        ServiceError::DuplicateEndpoint {
            service: spec.name.clone(),
            endpoint: endpoint.into(),
        }
    })
}

impl Services {
    /// An empty table whose affinity tables hold at most `max_affinity_entries` entries each
    /// (one for IPv4 clients, one for IPv6 clients, so one family's clients cannot evict the
    /// other's; rounded down to a multiple of 8 above 8; 0 disables affinity: every
    /// connection is then balanced as without it).
    pub fn new(max_affinity_entries: usize) -> Services {
        Services {
            snap: ArcSwap::from_pointee(Snapshot::default()),
            writer: Mutex::new(Writer { next_id: 1 }),
            affinity_v4: Affinity::new(max_affinity_entries),
            affinity_v6: Affinity::new(max_affinity_entries),
        }
    }

    /// Adds the service, or replaces the one with the same name (keeping its [`ServiceId`]).
    /// Readers see the old version or the new one, never a mix.
    ///
    /// # Errors
    /// See [`ServiceError`]: invalid fields, or a VIP/port/protocol or node port/protocol that
    /// another service has. Nothing changes on error.
    pub fn upsert(&self, spec: ServiceSpec) -> Result<ServiceId, ServiceError> {
        validate(&spec)?;
        let mut w = self.writer.lock();
        let cur = self.snap.load_full();
        let proto = spec.proto.number();
        vip_free::<Ipv4Addr>(&cur, &spec)?;
        vip_free::<Ipv6Addr>(&cur, &spec)?;
        ext_free(&cur, &spec)?;
        if let Some(np) = spec.node_port {
            if let Some(o) = cur
                .by_node_port
                .get(&(np, proto))
                .filter(|o| o.spec.name != spec.name)
            {
                return Err(ServiceError::DuplicateNodePort {
                    service: spec.name.clone(),
                    node_port: np,
                    proto,
                    other: o.spec.name.clone(),
                });
            }
        }
        health_port_free(&cur, &spec)?;
        let prev = cur.by_name.get(&spec.name).cloned();
        let (id, fresh) = match &prev {
            Some(p) => (p.id, false),
            None => (
                ServiceId::new(w.next_id).ok_or(ServiceError::IdsExhausted)?,
                true,
            ),
        };
        let state = Arc::new(build(id, spec, prev.as_deref())?);
        let mut next = Snapshot::clone(&cur);
        if let Some(p) = &prev {
            unlink(&mut next, p);
        }
        let s = &state.spec;
        let proto = s.proto.number();
        link::<Ipv4Addr>(&mut next, &state);
        link::<Ipv6Addr>(&mut next, &state);
        link_ext::<Ipv4Addr>(&mut next, &state);
        link_ext::<Ipv6Addr>(&mut next, &state);
        if let Some(np) = s.node_port {
            next.by_node_port.insert((np, proto), state.clone());
        }
        next.by_name.insert(s.name.clone(), state.clone());
        self.snap.store(Arc::new(next));
        if fresh {
            w.next_id = w.next_id.wrapping_add(1);
        }
        Ok(id)
    }

    /// Removes the service called `name` and returns its spec. Its [`ServiceId`] is not reused.
    pub fn remove(&self, name: &str) -> Option<ServiceSpec> {
        let _w = self.writer.lock();
        let cur = self.snap.load_full();
        let prev = cur.by_name.get(name)?.clone();
        let mut next = Snapshot::clone(&cur);
        unlink(&mut next, &prev);
        next.by_name.remove(name);
        self.snap.store(Arc::new(next));
        Some(prev.spec.clone())
    }

    /// The service whose ClusterIP of `dst`'s family is `dst:dport`, for protocol `proto`.
    /// Lock-free; does not allocate.
    #[inline]
    pub fn by_vip<A: ServiceAddr>(&self, dst: A, dport: u16, proto: u8) -> Option<ServiceRef> {
        let snap = self.snap.load();
        A::vips(&snap)
            .get(&(dst.key(), dport, proto))
            .map(|s| ServiceRef(s.clone()))
    }

    /// The service one of whose LoadBalancer IPs or external IPs of `dst`'s family is
    /// `dst`, on its port `dport` and protocol `proto`, with the kind of that frontend.
    /// Lock-free; does not allocate. (Asked after [`Services::by_vip`] misses, as kube-proxy's
    /// `KUBE-SERVICES` lists ClusterIPs, then external IPs and LoadBalancer IPs, then node
    /// ports.)
    #[inline]
    pub fn by_external<A: ServiceAddr>(
        &self,
        dst: A,
        dport: u16,
        proto: u8,
    ) -> Option<(ServiceRef, FrontendKind)> {
        let snap = self.snap.load();
        A::exts(&snap)
            .get(&(dst.key(), dport, proto))
            .map(|(s, k)| (ServiceRef(s.clone()), *k))
    }

    /// The service with node port `dport` for protocol `proto`, for traffic of family `A` to
    /// one of the node's addresses of that family (the caller has checked that): only
    /// services with a ClusterIP of the family (kube-proxy programs a node port in iptables
    /// or ip6tables only for Services of that family). Lock-free; does not allocate.
    ///
    /// `by_node_port::<Ipv4Addr>(..)`, `by_node_port::<Ipv6Addr>(..)`.
    #[inline]
    pub fn by_node_port<A: ServiceAddr>(&self, dport: u16, proto: u8) -> Option<ServiceRef> {
        let snap = self.snap.load();
        snap.by_node_port
            .get(&(dport, proto))
            .filter(|s| s.spec.has_frontend::<A>())
            .map(|s| ServiceRef(s.clone()))
    }

    /// The endpoint of `client`'s family for a new connection from `client` to `svc`, or
    /// `None` when the service has no eligible endpoint of that family (the caller rejects
    /// the connection, as kube-proxy's REJECT rule). `local_only` restricts the choice to
    /// endpoints on this node (`externalTrafficPolicy: Local` for external traffic).
    /// `flow_hash` keys Maglev, `rand` (from a per-worker [`super::Rng`]) drives random
    /// choice; `now` times affinity, which is keyed by the service and `client`.
    ///
    /// Does not allocate. For services with affinity it takes one short per-set lock (see
    /// the [module docs](self)); otherwise it takes none.
    pub fn select<A: ServiceAddr>(
        &self,
        svc: &ServiceRef,
        client: A,
        flow_hash: u64,
        rand: u64,
        local_only: bool,
        now: Instant,
    ) -> Option<A::SocketAddr> {
        let s = &*svc.0;
        let (f, algo) = (A::frontend(s), s.spec.algo);
        match s.spec.affinity {
            None => f.pick(algo, flow_hash, rand, local_only),
            Some(timeout) => A::affinity(self).get_or_insert(
                A::aff_key(s.id.0, client),
                now,
                timeout,
                |ep| f.eligible(ep, local_only),
                || f.pick(algo, flow_hash, rand, local_only),
            ),
        }
    }

    /// Links connections that a previous process left in `ct` ([`Conntrack`] or
    /// [`ConntrackOf<Ipv6Addr>`], kept in a file across a restart, [`Conntrack::open_file`]) to this
    /// table's Services of the table's family, once the Services are added again: each live
    /// entry of a Service gets the [`ServiceId`] of the Service now at its original
    /// destination (ClusterIP and port, else node port of a Service with a ClusterIP of the
    /// family), or 0 when there is none (ids are given in the order Services are added, so a
    /// previous process may have numbered them differently); and for each Service with
    /// session affinity, each client's endpoint is remembered again from its connections,
    /// until the entry's last packet plus the affinity timeout (a restart makes the affinity
    /// last from the client's last packet instead of its last new connection; clients with no
    /// connection left lose theirs).
    ///
    /// The affinity table is rebuilt rather than kept in the file because every choice that
    /// matters is held by a connection, and because it is a table of small mutexes, which a
    /// killed process could leave locked. Returns (tags changed, affinity entries restored).
    /// O(table size); call it once per family's table, after adding the Services.
    ///
    /// [`Conntrack`]: crate::conntrack::Conntrack
    /// [`ConntrackOf<Ipv6Addr>`]: crate::conntrack::ConntrackOf
    /// [`Conntrack::open_file`]: crate::conntrack::CtTable::open_file
    pub fn relink<A: ServiceAddr + TupleWords<W>, const W: usize>(
        &self,
        ct: &CtTable<Tuple<A>, W>,
        now: Instant,
    ) -> (usize, usize) {
        let mut restored = 0;
        let changed = ct.retag_services(now, |v, last| {
            if v.service == 0 {
                return 0;
            }
            let t = &v.orig;
            let Some(svc) = self
                .by_vip(t.dst, t.dport, t.proto)
                .or_else(|| self.by_external(t.dst, t.dport, t.proto).map(|e| e.0))
                .or_else(|| self.by_node_port::<A>(t.dport, t.proto))
            else {
                return 0;
            };
            let s = &*svc.0;
            if let Some(timeout) = s.spec.affinity {
                let ep = A::socket(v.reply.src, v.reply.sport);
                let f = A::frontend(s);
                if f.eligible(ep, false) || f.eligible(ep, true) {
                    let key = A::aff_key(s.id.0, t.src);
                    A::affinity(self).restore(key, ep, last + timeout, now);
                    restored += 1;
                }
            }
            s.id.0
        });
        (changed, restored)
    }

    /// The affinity tables' counters (IPv4 and IPv6 clients together).
    pub fn affinity_stats(&self) -> AffinityStats {
        let (a, b) = (self.affinity_v4.stats(), self.affinity_v6.stats());
        AffinityStats {
            hits: a.hits + b.hits,
            misses: a.misses + b.misses,
            expired: a.expired + b.expired,
            stale: a.stale + b.stale,
            evictions: a.evictions + b.evictions,
            entries: a.entries + b.entries,
            capacity: a.capacity + b.capacity,
        }
    }

    /// The health check node ports of every Service ([`ServiceSpec::health_check_node_port`]),
    /// ascending, each once.
    pub fn health_ports(&self) -> Vec<u16> {
        let snap = self.snap.load();
        let mut v: Vec<u16> = snap
            .by_name
            .values()
            .filter_map(|s| s.spec.health_check_node_port)
            .collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// The health check on node port `port` for a request to an address of family `A`: the
    /// name of a Service it belongs to and its number of endpoints on this node of that
    /// family, as kube-proxy's `LocalReadyEndpoints` counts them (distinct addresses over
    /// all the Kubernetes Service's ports, each family's proxier its own family's); `None`
    /// when no Service has that health port. No lock; O(Services).
    pub fn health_check<A: ServiceAddr>(&self, port: u16) -> Option<(String, usize)> {
        let snap = self.snap.load();
        let mut name = None;
        let mut ips: Vec<A> = Vec::new();
        for s in snap.by_name.values() {
            if s.spec.health_check_node_port != Some(port) {
                continue;
            }
            if name.as_ref().is_none_or(|n: &String| s.spec.name < *n) {
                name = Some(s.spec.name.clone());
            }
            ips.extend(
                A::endpoints(&s.spec)
                    .iter()
                    .filter(|e| e.local)
                    .map(|e| A::split(e.addr).0),
            );
        }
        ips.sort_unstable();
        ips.dedup();
        name.map(|n| (n, ips.len()))
    }

    /// The number of services.
    pub fn len(&self) -> usize {
        self.snap.load().by_name.len()
    }

    /// True if there is no service.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The service called `name`.
    pub fn get(&self, name: &str) -> Option<ServiceRef> {
        self.snap
            .load()
            .by_name
            .get(name)
            .map(|s| ServiceRef(s.clone()))
    }

    /// Every service's spec, sorted by name.
    pub fn list(&self) -> Vec<ServiceSpec> {
        let snap = self.snap.load();
        let mut v: Vec<ServiceSpec> = snap.by_name.values().map(|s| s.spec.clone()).collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    /// An `ipvsadm -Ln`-like listing, services sorted by name:
    ///
    /// ```text
    /// Prot LocalAddress:Port Scheduler Flags
    ///   -> RemoteAddress:Port           Local Conditions                Used
    /// TCP  10.96.0.10:53 rr persistent 10800 [id 1 kube-dns] nodeport 30053 internal-local
    ///   -> 10.244.1.5:53                yes   ready,serving             cluster,local
    ///   -> 10.244.2.5:53                no    serving,terminating       -
    /// TCP  10.96.0.20:80 rr [id 2 web] loadbalancer 192.0.2.10 external 198.51.100.7 ranges 203.0.113.0/24 external-local
    ///   -> 10.244.1.6:8080              yes   ready,serving             cluster,local
    /// ```
    ///
    /// A family's LoadBalancer IPs, external IPs and source ranges (those of the family; the
    /// ranges only with LoadBalancer IPs) follow its ClusterIP.
    ///
    /// The scheduler is `rr` for random (as kube-proxy's IPVS default) and `mh` for Maglev
    /// (IPVS's Maglev hashing scheduler). `Used` tells which of the endpoint sets (see
    /// [`EndpointConditions`]) new connections choose it from: `cluster` (policy Cluster),
    /// `local` (a Local policy), or `-` for neither.
    pub fn fmt_services(&self) -> String {
        let snap = self.snap.load();
        let mut v: Vec<&Arc<SvcState>> = snap.by_name.values().collect();
        v.sort_by(|a, b| a.spec.name.cmp(&b.spec.name));
        let mut out = String::from(
            "Prot LocalAddress:Port Scheduler Flags\n  -> RemoteAddress:Port           Local Conditions                Used\n",
        );
        for s in v {
            let sp = &s.spec;
            // One block per frontend, as ipvsadm lists an IPv4 and an IPv6 virtual service.
            let blocks = [
                (listed::<Ipv4Addr>(s), ext_listed::<Ipv4Addr>(sp)),
                (listed::<Ipv6Addr>(s), ext_listed::<Ipv6Addr>(sp)),
            ];
            for ((front, eps), ext) in blocks {
                let Some(front) = front else { continue };
                let _ = write!(
                    out,
                    "{:<4} {} {}",
                    proto_name(sp.proto.number()),
                    front,
                    match sp.algo {
                        LbAlgo::Random => "rr",
                        LbAlgo::Maglev => "mh",
                    }
                );
                if let Some(t) = sp.affinity {
                    let _ = write!(out, " persistent {}", t.as_secs());
                }
                let _ = write!(out, " [id {} {}]", s.id, sp.name);
                if let Some(np) = sp.node_port {
                    let _ = write!(out, " nodeport {np}");
                    if sp.external_local && ext.is_empty() {
                        out.push_str(" external-local");
                    }
                }
                if !ext.is_empty() {
                    out.push_str(&ext);
                    if sp.external_local {
                        out.push_str(" external-local");
                    }
                }
                if sp.internal_local {
                    out.push_str(" internal-local");
                }
                if let Some(hc) = sp.health_check_node_port {
                    let _ = write!(out, " healthcheck {hc}");
                }
                out.push('\n');
                for (addr, local, cond, used) in eps {
                    let local = if local { "yes" } else { "no" };
                    let cond = cond.to_string();
                    let _ = writeln!(out, "  -> {addr:<28} {local:<5} {cond:<25} {used}");
                }
            }
        }
        out
    }
}

/// An endpoint as listed: address text, local flag, conditions and the sets it is in.
type Listed = (String, bool, EndpointConditions, &'static str);

/// The family's frontend of `s` as listed (`None` without a ClusterIP of the family), and
/// its endpoints.
fn listed<A: ServiceAddr>(s: &SvcState) -> (Option<String>, Vec<Listed>) {
    let sp = &s.spec;
    let f = A::frontend(s);
    let front = A::vip(sp).map(|a| A::socket(a, sp.port).to_string());
    let eps = A::endpoints(sp).iter().map(|e| {
        let used = match (f.eligible(e.addr, false), f.eligible(e.addr, true)) {
            (true, true) => "cluster,local",
            (true, false) => "cluster",
            (false, true) => "local",
            (false, false) => "-",
        };
        (e.addr.to_string(), e.local, e.conditions, used)
    });
    (front, eps.collect())
}

/// The family's LoadBalancer IPs, external IPs and source ranges as listed (` loadbalancer
/// A,B external C ranges P,Q`; empty without any).
fn ext_listed<A: ServiceAddr>(sp: &ServiceSpec) -> String {
    let of = |ips: &[IpAddr]| {
        let v: Vec<String> = ips
            .iter()
            .filter(|ip| A::from_ip(**ip).is_some())
            .map(|ip| ip.to_string())
            .collect();
        v.join(",")
    };
    let mut out = String::new();
    for (name, v) in [
        ("loadbalancer", of(&sp.load_balancer_ips)),
        ("external", of(&sp.external_ips)),
    ] {
        if !v.is_empty() {
            let _ = write!(out, " {name} {v}");
        }
    }
    let ranges: Vec<String> = sp
        .load_balancer_source_ranges
        .iter()
        .filter(|r| A::from_ip(r.addr).is_some())
        .map(|r| r.to_string())
        .collect();
    if !ranges.is_empty() && out.contains("loadbalancer") {
        let _ = write!(out, " ranges {}", ranges.join(","));
    }
    out
}

/// The Kubernetes Service a tapyard Service name (`namespace/name:port`) belongs to: the
/// name without its `:port`.
fn kube_service(name: &str) -> &str {
    name.rsplit_once(':').map_or(name, |(s, _)| s)
}

/// `Err` if `spec`'s health check node port is another Kubernetes Service's, or a TCP node
/// port (of any Service), or `spec`'s TCP node port is a health port of another's.
fn health_port_free(cur: &Snapshot, spec: &ServiceSpec) -> Result<(), ServiceError> {
    let mine = kube_service(&spec.name);
    let taken = |port: u16, health: bool| {
        cur.by_name.values().find(|o| {
            o.spec.name != spec.name
                && ((o.spec.health_check_node_port == Some(port)
                    && (!health || kube_service(&o.spec.name) != mine))
                    || (health && o.spec.proto == IpProto::TCP && o.spec.node_port == Some(port)))
        })
    };
    let clash = spec
        .health_check_node_port
        .filter(|&p| spec.proto == IpProto::TCP && spec.node_port == Some(p))
        .map(|p| (p, spec.name.clone()))
        .or_else(|| {
            let h = spec.health_check_node_port?;
            taken(h, true).map(|o| (h, o.spec.name.clone()))
        })
        .or_else(|| {
            let np = spec.node_port.filter(|_| spec.proto == IpProto::TCP)?;
            taken(np, false).map(|o| (np, o.spec.name.clone()))
        });
    match clash {
        Some((port, other)) => Err(ServiceError::DuplicateHealthPort {
            service: spec.name.clone(),
            port,
            other,
        }),
        None => Ok(()),
    }
}

/// `Err` if another service than `spec`'s has its ClusterIP of the family, port and protocol.
fn vip_free<A: ServiceAddr>(cur: &Snapshot, spec: &ServiceSpec) -> Result<(), ServiceError> {
    let Some(vip) = A::vip(spec) else {
        return Ok(());
    };
    let proto = spec.proto.number();
    match A::vips(cur).get(&(vip.key(), spec.port, proto)) {
        Some(o) if o.spec.name != spec.name => Err(ServiceError::DuplicateVip {
            service: spec.name.clone(),
            vip: vip.into(),
            port: spec.port,
            proto,
            other: o.spec.name.clone(),
        }),
        _ => Ok(()),
    }
}

/// The family's map key of `ip` (`None` for the other family).
fn key_of<A: ServiceAddr>(ip: IpAddr) -> Option<A::Key> {
    A::from_ip(ip).map(A::key)
}

/// The service other than `spec`'s (and its field) that has `ip` of family `A` as a frontend
/// on `spec`'s port and protocol.
fn owner<A: ServiceAddr>(
    cur: &Snapshot,
    spec: &ServiceSpec,
    ip: IpAddr,
) -> Option<(String, &'static str)> {
    let k = (key_of::<A>(ip)?, spec.port, spec.proto.number());
    let vip_field = if ip.is_ipv6() { "vip6" } else { "vip" };
    let vip = A::vips(cur).get(&k).map(|o| (o, vip_field));
    let ext = A::exts(cur).get(&k).map(|(o, kind)| (o, kind.field()));
    vip.or(ext)
        .filter(|(o, _)| o.spec.name != spec.name)
        .map(|(o, f)| (o.spec.name.clone(), f))
}

/// `Err` if another service has a frontend (of any kind) at one of `spec`'s LoadBalancer or
/// external IPs, or one of its LoadBalancer or external IPs at `spec`'s ClusterIPs, on the
/// same port and protocol.
fn ext_free(cur: &Snapshot, spec: &ServiceSpec) -> Result<(), ServiceError> {
    let vips = spec.vip.map(|a| (IpAddr::from(a), "vip")).into_iter();
    let vips = vips.chain(spec.vip6.map(|a| (IpAddr::from(a), "vip6")));
    let exts = spec.external_frontends().map(|(ip, k)| (ip, k.field()));
    for (ip, field) in vips.chain(exts) {
        let found = owner::<Ipv4Addr>(cur, spec, ip).or_else(|| owner::<Ipv6Addr>(cur, spec, ip));
        if let Some((other, other_field)) = found {
            return Err(ServiceError::FrontendInUse {
                service: spec.name.clone(),
                field,
                ip,
                port: spec.port,
                proto: spec.proto.number(),
                other,
                other_field,
            });
        }
    }
    Ok(())
}

/// Enters `state` under each of its LoadBalancer and external IPs of the family.
fn link_ext<A: ServiceAddr>(next: &mut Snapshot, state: &Arc<SvcState>) {
    let s = &state.spec;
    for (ip, kind) in s.external_frontends() {
        if let Some(k) = key_of::<A>(ip) {
            let e = (state.clone(), kind);
            A::exts_mut(next).insert((k, s.port, s.proto.number()), e);
        }
    }
}

/// Takes `s` out from under its LoadBalancer and external IPs of the family.
fn unlink_ext<A: ServiceAddr>(next: &mut Snapshot, s: &ServiceSpec) {
    for (ip, _) in s.external_frontends() {
        if let Some(k) = key_of::<A>(ip) {
            A::exts_mut(next).remove(&(k, s.port, s.proto.number()));
        }
    }
}

/// Enters `state` under its ClusterIP of the family, if it has one.
fn link<A: ServiceAddr>(next: &mut Snapshot, state: &Arc<SvcState>) {
    let s = &state.spec;
    if let Some(vip) = A::vip(s) {
        let k = (vip.key(), s.port, s.proto.number());
        A::vips_mut(next).insert(k, state.clone());
    }
}

/// Takes `p` out from under its ClusterIP of the family, if it has one.
fn unlink_vip<A: ServiceAddr>(next: &mut Snapshot, p: &SvcState) {
    let s = &p.spec;
    if let Some(vip) = A::vip(s) {
        A::vips_mut(next).remove(&(vip.key(), s.port, s.proto.number()));
    }
}

fn unlink(next: &mut Snapshot, p: &SvcState) {
    unlink_vip::<Ipv4Addr>(next, p);
    unlink_vip::<Ipv6Addr>(next, p);
    let s = &p.spec;
    unlink_ext::<Ipv4Addr>(next, s);
    unlink_ext::<Ipv6Addr>(next, s);
    let s = &p.spec;
    if let Some(np) = s.node_port {
        next.by_node_port.remove(&(np, s.proto.number()));
    }
}

#[cfg(test)]
mod tests;
