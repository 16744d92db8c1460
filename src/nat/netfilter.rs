//! Connection tracking and NAT in the packet's path: what netfilter and kube-proxy's iptables
//! rules do on a Kubernetes node, as hooks the router and the bridge call.
//!
//! # Where the hooks sit (the netfilter order)
//!
//! * **Routed packets** (frames addressed to a router interface) pass `Netfilter::prerouting`
//!   right after the IPv4 header check, before the local-address check and the route lookup,
//!   as `nf_conntrack_in` and the nat table's PREROUTING do. A packet of a known connection is
//!   tracked (TCP state machine, timeouts, counters) and translated at once, both halves: the
//!   destination (DNAT, or un-SNAT of a reply) and the source (SNAT/MASQUERADE, or un-DNAT of
//!   a reply). Linux does the source half at POSTROUTING; only the destination decides the
//!   route, so doing both before routing forwards identically. The first packet of a new
//!   connection goes through the Service table (KUBE-SERVICES / KUBE-NODEPORTS: DNAT to an
//!   endpoint), then the route lookup of the translated destination tells the egress interface,
//!   then the masquerade rules (KUBE-POSTROUTING for packets kube-proxy marks 0x4000, and the
//!   node's "pod traffic leaving the cluster" rule) pick the source; the entry is inserted with
//!   the reply tuple that results, and the packet rewritten.
//! * **Bridged IPv4 frames** (pod to pod on one bridge) pass `Netfilter::bridged` when NAT is
//!   configured, as `br_netfilter` (`bridge-nf-call-iptables = 1`) makes them pass conntrack on
//!   Linux: a reply from an endpoint to a client on the same bridge is translated back
//!   (un-DNAT) there. Unlike Linux, a bridged frame never *creates* an entry: only frames of
//!   connections the router already tracks are looked at, so plain pod-to-pod switching stays
//!   cheap.
//! * **ICMP errors** (destination unreachable, time exceeded, fragmentation needed) are RELATED
//!   to the connection whose packet they quote: found through the quoted tuple, they are
//!   translated with it, the quoted header and every checksum included
//!   (`nf_nat_icmp_reply_translation`). An ICMP error about no known connection is INVALID.
//! * **ICMP errors the router makes itself** (TTL exceeded, net/host unreachable,
//!   fragmentation needed, port unreachable, host unreachable when a next hop never answers
//!   ARP) are about packets this engine may already have translated: the router hands each
//!   one to the engine (`ErrorNat`) before routing it, and it is translated back through the
//!   quoted packet's connection the same way, as Linux does for the error `icmp_send` attached
//!   the connection to (`nf_ct_attach`). So an error about a masqueraded packet reaches the
//!   pod, not the node's own address, and one about a DNAT'd packet quotes the Service
//!   address the client used.
//!
//! # The fast path of an established connection
//!
//! A packet of a known connection costs: its tuple, a table lookup, the state machine
//! ([`Conntrack::track`], whose common case — an ACK-class segment of an ESTABLISHED, ASSURED
//! TCP connection — is a load and a compare, no CAS, then the rare refresh and the counters),
//! and a rewrite prepared from the two tuples (`nat::rewrite::prepare`: the new address and
//! port bytes and the folded checksum adjustments, so the rewrite itself is a few stores and
//! two ones-complement additions, bit-for-bit what [`nat::rewrite()`] writes).
//!
//! Each worker keeps a `FlowMemo` (as Open vSwitch's exact-match cache): 1024 direct-mapped
//! slots of recently found connections (entry id and prepared translation, keyed by the
//! packet tuple), lent to the router's batch context. A packet of a memoized TCP or UDP flow
//! skips the tuple extraction (the key is read straight from the header), the lookup and the
//! preparation; it is still tracked against the entry's *current* control word, so a FIN,
//! RST, invalid packet, removal or reuse of the entry is seen exactly as without the memo (a
//! removed entry is [`Track::Gone`] and the packet is looked up again). Only a packet that
//! refreshed the entry's timeout stamps a memo, and a memo is trusted for at most 100 ms after
//! (less than the shortest configured timeout minus the 1 s refresh granularity), so an entry
//! cannot expire unseen while memoized. A memo hit skips the lookup's `found` counter.
//!
//! # How each Kubernetes rule maps
//!
//! | kube-proxy (iptables mode) | tapyard |
//! |---|---|
//! | `KUBE-SERVICES`: ClusterIP:port → `KUBE-SVC-*` → random `KUBE-SEP-*` DNAT | [`crate::nat::Services::by_vip`] + `select` (random, client-IP affinity, or Maglev) |
//! | `KUBE-NODEPORTS`: node address:nodePort → the Service's endpoints | `by_node_port` when the destination is a router interface address |
//! | `KUBE-MARK-MASQ` for sources outside `--cluster-cidr` | masquerade when the client is outside `cluster_cidr` |
//! | `KUBE-EXT-*` for NodePort with `externalTrafficPolicy: Cluster` | masquerade; `Local` keeps the client address and uses local endpoints only (pods inside the cluster CIDR get every endpoint, unmasqueraded) |
//! | `KUBE-SERVICES`: `-d <loadbalancer IP or external IP> --dport <port> -j KUBE-EXT-*` | [`crate::nat::Services::by_external`] after `by_vip` misses, before node ports; then as a node port (`KUBE-EXT-*` above) |
//! | `KUBE-FW-*` (`loadBalancerSourceRanges`, per family) → `KUBE-PROXY-FIREWALL` DROP | LoadBalancer IPs only, while the Service has endpoints: [`DropReason::LbSourceRange`] for a source outside the family's ranges |
//! | `KUBE-SEP-*`: `-s <endpoint> -j KUBE-MARK-MASQ` (hairpin) | masquerade when the endpoint is the client itself |
//! | `KUBE-POSTROUTING`: `MASQUERADE` marked packets | source := egress interface address, port kept when free |
//! | no endpoints: `REJECT` | TCP RST / ICMP port unreachable at once (also when none is ready nor serving and terminating) |
//! | `CategorizeEndpoints`: ready endpoints, else serving and terminating ones, per policy | the cluster-wide and node-local sets of [`crate::nat::EndpointConditions`], precomputed per Service version |
//! | `internalTrafficPolicy: Local` (`KUBE-SVL-*`); no local endpoint: `DROP` | `ServiceSpec::internal_local`: ClusterIP traffic to the node-local set; none: dropped (`no_endpoint`), no reset |
//! | CNI `ipMasq`: pod traffic leaving the cluster CIDR masqueraded | [`MasqueradeRule`] |
//! | `--ctstate INVALID -j DROP` | [`DropReason::CtInvalid`], unless conntrack is liberal |
//! | `CleanStaleEntries`: UDP entries to a Service frontend whose reply is not from a serving endpoint deleted | [`Netfilter::upsert_service`] (per changed Service and family), [`Netfilter::flush_stale_udp`] (all) |
//! | `--masquerade-all` | [`NatRules::masquerade_all`]: ClusterIP connections masqueraded whatever their source |
//! | `--nodeport-addresses` | [`NatRules::node_port_addresses`] (and `..6`): node ports only on node addresses inside them |
//!
//! # IPv6
//!
//! Every hook is written once, generic over the family (`NatFamily`), so IPv6 follows the
//! same rules as `ip6tables`' conntrack and NAT tables, in the IPv6 connection table
//! ([`Netfilter::conntrack_of`]`::<Ipv6Addr>()`):
//!
//! * every IPv6 TCP, UDP and ICMPv6 echo packet through the router is tracked (INVALID ones
//!   dropped unless `liberal`); other ICMPv6 (NDP, MLD, RS/RA) passes untracked, as Linux's
//!   `icmpv6_new`;
//! * an entry that translates is applied with [`nat::rewrite()`] (pseudo-header checksums,
//!   full or virtio-partial); an ICMPv6 error (types below 128) quoting a tracked connection
//!   is RELATED and translated with [`nat::rewrite_icmp_error`], whether it crosses the router
//!   or the router makes it; bridged IPv6 frames of a NAT'd connection are translated too;
//! * a new connection to a Service's IPv6 ClusterIP, or to a node port on one of the node's
//!   IPv6 addresses (Services with an IPv6 ClusterIP only, as kube-proxy's ip6tables), is
//!   DNAT'd to an IPv6 endpoint or rejected (TCP RST / ICMPv6 port unreachable); masqueraded to
//!   the egress interface's global IPv6 address on the same marks as IPv4 (outside
//!   [`NatRules::cluster_cidr6`], NodePort with policy Cluster, hairpin) or by a
//!   [`MasqueradeRule<Ipv6Addr>`], else source-NAT'd by a [`SnatRule<Ipv6Addr>`], with a free
//!   source port from the IPv6 table.
//!
//! The IPv6 table is made with the engine ([`Netfilter::new`], with
//! [`NatConfig::conntrack6`] or else the IPv4 table's settings), beside the IPv4 one in a file
//! when that is kept in a file (`DatapathBuilder::conntrack_file`: `<path>6`). An engine made
//! on a caller's IPv4 table alone ([`Netfilter::with_conntrack`]) makes it on first use unless
//! one is installed with [`Netfilter::set_conntrack`].
//!
//! # Known differences
//!
//! Fragments reach this engine put together (see [`crate::l3::defrag`]; the pipeline
//! reassembles in front of it, as Linux's `nf_defrag_ipv4`/`ipv6`). TCP windows are not tracked (see [`crate::conntrack`]). Connections are tracked only when
//! the datapath was built with NAT ([`crate::datapath::DatapathBuilder::netfilter`]).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use arc_swap::ArcSwap;

use crate::base::IfaceId;
use crate::buf::PacketBuf;
use crate::conntrack::{
    Conntrack, ConntrackOf, CtConfig, CtConfigError, CtFamily, CtHit, CtId, CtStatus, CtTables,
    CtTag, Dir, InsertError, Pkt, Track,
};
use crate::l3::route::RouteAddr;
use crate::l3::router::{ErrorNat, Hook};
use crate::narrow::{len32, low32, low64};
use crate::nat::service::FrontendKind;
use crate::nat::{self, CsumMode, PortRange, Services};
use crate::stats::{counter_set, DropReason, SharedCounter};
use crate::time::Instant;
use crate::wire::family::Family;
use crate::wire::ipv4::{Ipv4Info, Ipv4Packet, PROTO_TCP, PROTO_UDP};
use crate::wire::tuple::{L4Kind, L4Ports, Tuple};

/// A prefix of either family, `addr/len` (`A`: [`Ipv4Addr`], the default, or [`Ipv6Addr`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Prefix<A = Ipv4Addr> {
    /// The network address (host bits are ignored).
    pub addr: A,
    /// The prefix length, 0 to 32 (IPv6: 128).
    pub len: u8,
}

impl<A: RouteAddr> Prefix<A> {
    /// `addr/len` (a longer `len` is the family's full length).
    pub fn new(addr: A, len: u8) -> Prefix<A> {
        Prefix {
            addr,
            len: len.min(A::BITS),
        }
    }

    /// Whether `a` is inside the prefix.
    #[inline]
    pub fn contains(&self, a: A) -> bool {
        self.len == 0 || a.mask(self.len) == self.addr.mask(self.len)
    }
}

impl Prefix<IpAddr> {
    /// Whether `a` is inside the prefix: false for an address of the other family (a length
    /// over the family's is its full length).
    pub fn contains_ip(&self, a: IpAddr) -> bool {
        match (self.addr, a) {
            (IpAddr::V4(p), IpAddr::V4(a)) => Prefix::new(p, self.len).contains(a),
            (IpAddr::V6(p), IpAddr::V6(a)) => Prefix::new(p, self.len).contains(a),
            _ => false,
        }
    }
}

impl<A: std::fmt::Display> std::fmt::Display for Prefix<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

/// Masquerade pod traffic that leaves through an interface (CNI `ipMasq`, or the node's
/// `iptables -t nat -A POSTROUTING -s <cluster> ! -d <cluster> -o eth0 -j MASQUERADE`; IPv6,
/// `A` = [`Ipv6Addr`]: `ip6tables`, the new source being `out`'s global IPv6 address): a new
/// connection whose egress interface is `out`, whose source is inside `src` and whose
/// destination is outside `except_dst` takes `out`'s address as its source.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MasqueradeRule<A = Ipv4Addr> {
    /// The egress interface.
    pub out: IfaceId,
    /// Sources it applies to (`None`: any).
    pub src: Option<Prefix<A>>,
    /// Destinations it does not apply to (`None`: none excepted).
    pub except_dst: Option<Prefix<A>>,
}

/// Source NAT to a fixed address (`iptables`/`ip6tables -t nat -A POSTROUTING -s <src> [-o
/// <out>] -j SNAT --to-source <to>[:<ports>]`): a new connection from `src` leaving through
/// `out` (or any interface) takes `to` as its source, with a port from `ports`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SnatRule<A = Ipv4Addr> {
    /// The egress interface (`None`: any).
    pub out: Option<IfaceId>,
    /// Sources it applies to.
    pub src: Prefix<A>,
    /// The new source address.
    pub to: A,
    /// Source ports to use; `None` as iptables' SNAT without a port range: the original port
    /// when free, else one of its class ([`PortRange::linux_default`]: privileged ports stay
    /// privileged).
    pub ports: Option<PortRange>,
}

/// One family's rules of a [`NatRules`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct FamilyRules<'a, A> {
    cluster_cidr: Option<Prefix<A>>,
    masquerade: &'a [MasqueradeRule<A>],
    snat: &'a [SnatRule<A>],
    node_port_addresses: &'a [Prefix<A>],
}

impl<A: RouteAddr> FamilyRules<'_, A> {
    /// Whether node ports answer on the node's address `a` (`--nodeport-addresses`: no
    /// prefix of the family given, every address).
    #[inline]
    fn node_port_on(&self, a: A) -> bool {
        self.node_port_addresses.is_empty()
            || self.node_port_addresses.iter().any(|p| p.contains(a))
    }
}

impl NatRules {
    /// The rules of family `A`.
    pub(crate) fn of<A: NatRulesOf>(&self) -> FamilyRules<'_, A> {
        A::rules(self)
    }
}

/// Where a family's rules are in [`NatRules`].
pub(crate) trait NatRulesOf: Sized {
    fn rules(r: &NatRules) -> FamilyRules<'_, Self>;
}

impl NatRulesOf for Ipv4Addr {
    fn rules(r: &NatRules) -> FamilyRules<'_, Ipv4Addr> {
        FamilyRules {
            cluster_cidr: r.cluster_cidr,
            masquerade: &r.masquerade,
            snat: &r.snat,
            node_port_addresses: &r.node_port_addresses,
        }
    }
}

impl NatRulesOf for Ipv6Addr {
    fn rules(r: &NatRules) -> FamilyRules<'_, Ipv6Addr> {
        FamilyRules {
            cluster_cidr: r.cluster_cidr6,
            masquerade: &r.masquerade6,
            snat: &r.snat6,
            node_port_addresses: &r.node_port_addresses6,
        }
    }
}

/// The rules besides Services, replaced as a whole by [`Netfilter::set_rules`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NatRules {
    /// Every pod address in the cluster (kube-proxy's `--cluster-cidr`): Service traffic from
    /// outside it is masqueraded. `None`: no source is "outside".
    pub cluster_cidr: Option<Prefix>,
    /// The cluster's IPv6 pod prefix, as `cluster_cidr` for IPv6 Service traffic.
    pub cluster_cidr6: Option<Prefix<Ipv6Addr>>,
    /// IPv6 masquerade rules, first match wins (checked after Service marks). The port
    /// settings below apply to both families.
    pub masquerade6: Vec<MasqueradeRule<Ipv6Addr>>,
    /// Masquerade rules, first match wins (checked after Service marks).
    pub masquerade: Vec<MasqueradeRule>,
    /// SNAT rules, first match wins (checked after masquerade rules).
    pub snat: Vec<SnatRule>,
    /// IPv6 SNAT rules, first match wins (checked after the IPv6 masquerade rules).
    pub snat6: Vec<SnatRule<Ipv6Addr>>,
    /// Ports MASQUERADE remaps a source port into when the original is taken (default
    /// as Linux: the source port is kept when free; otherwise 1024-65535, or 1-1023 for a
    /// privileged source port).
    pub masquerade_ports: Option<PortRange>,
    /// Choose every masqueraded source port at random (`--random-fully`, as kube-proxy
    /// uses) instead of keeping the original one when it is free.
    pub random_fully: bool,
    /// Masquerade every new connection to a ClusterIP, whatever its source (kube-proxy's
    /// `--masquerade-all`, its `KUBE-SVC-*` rule without `! -s <cluster-cidr>`). NodePort
    /// connections keep their policy's rule (Cluster: masqueraded anyway; Local: the
    /// client's address kept), as in kube-proxy. Both families.
    pub masquerade_all: bool,
    /// The node addresses node ports answer on (kube-proxy's `--nodeport-addresses`): a
    /// node address inside one of these prefixes; empty: every node address (kube-proxy's
    /// default in iptables mode).
    pub node_port_addresses: Vec<Prefix>,
    /// The same for IPv6 node addresses (empty: every one), as kube-proxy takes the
    /// prefixes of each family from one list.
    pub node_port_addresses6: Vec<Prefix<Ipv6Addr>>,
}

/// Settings of the NAT engine, given to [`crate::datapath::DatapathBuilder::netfilter`].
#[derive(Clone, Debug, Default)]
pub struct NatConfig {
    /// The connection table.
    pub conntrack: CtConfig,
    /// The IPv6 connection table (`None`: the same settings as `conntrack`).
    pub conntrack6: Option<CtConfig>,
    /// Limit of the Services' client-IP affinity table (default 65536).
    pub max_affinity_entries: Option<usize>,
    /// Initial rules.
    pub rules: NatRules,
}

counter_set! {
    /// Counters of the NAT engine (connection-level; per-packet drops are in the datapath's
    /// drop reasons).
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct NfCounters pub(crate) live Counters(SharedCounter) {
        /// New connections inserted.
        new,
        /// New connections DNAT'd to a Service endpoint (ClusterIP or NodePort).
        dnat,
        /// New connections whose source was translated (masquerade, hairpin, SNAT).
        snat,
        /// Of those, hairpin connections (the endpoint was the client).
        hairpin,
        /// Connections to a Service without endpoints, rejected.
        rejected,
        /// ICMP errors translated as RELATED to a connection.
        related,
        /// Packets let through untracked (non-first fragments, protocols without a tuple).
        untracked,
    }
}

/// A worker's cache of the connections `Netfilter::prerouting` found recently (as Open
/// vSwitch's exact-match cache): direct-mapped by packet tuple, so that the packets of a
/// flow seen moments ago skip the tuple extraction, the table lookup and the preparation of
/// the rewrite (see the module docs). Allocated on first use, once per worker.
#[derive(Clone, Debug, Default)]
pub(crate) struct FlowMemo {
    slots: Vec<Option<Memo>>,
}

/// Slots of a [`FlowMemo`] (a power of two).
const MEMO_SLOTS: usize = 1024;

/// The longest a memo is trusted after its connection was last seen live: well inside any
/// timeout (so an entry cannot expire unseen while memoized) and short enough that a memo
/// never outlives a quiet moment.
const MEMO_WINDOW_MAX_US: u64 = 100_000;

impl FlowMemo {
    #[inline]
    fn slot(key: &[u64; 2]) -> usize {
        let h = (key[0] ^ key[1].rotate_left(29)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        (h >> 32) as usize & (MEMO_SLOTS - 1)
    }

    /// The memo in slot `i`, if it is `key`'s.
    #[inline]
    fn get(&self, i: usize, key: &[u64; 2]) -> Option<Memo> {
        self.slots.get(i)?.filter(|m| m.key == *key)
    }

    fn put(&mut self, m: Memo) {
        if self.slots.is_empty() {
            self.slots = vec![None; MEMO_SLOTS];
        }
        if let Some(s) = self.slots.get_mut(Self::slot(&m.key)) {
            *s = Some(m);
        }
    }

    /// Empties slot `i`.
    #[inline]
    fn forget(&mut self, i: usize) {
        if let Some(s) = self.slots.get_mut(i) {
            *s = None;
        }
    }

    /// Restamps the memo in slot `i`.
    #[inline]
    fn touch(&mut self, i: usize, now_us: u64) {
        if let Some(Some(m)) = self.slots.get_mut(i) {
            m.seen_us = now_us;
        }
    }
}

/// A connection found: the packet tuple it was found for (as words), what tracking needs of
/// the hit (entry id, direction, protocol), the translation prepared for that tuple, and when
/// the connection was last seen live.
#[derive(Clone, Copy, Debug)]
struct Memo {
    key: [u64; 2],
    id: CtId,
    dir: Dir,
    proto: u8,
    xlat: Xlat,
    seen_us: u64,
}

/// What the bridged hook ([`Netfilter::bridged`]) decided about a switched frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Bridged {
    /// Switch it as the bridge decided (translated, if it was).
    Accept,
    /// Drop it, counted under the reason.
    Drop(DropReason),
    /// A fragment: to be put together first, its datagram then going through
    /// [`Netfilter::bridged_datagram`].
    Fragment,
}

/// A translation prepared for one packet tuple.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Xlat {
    /// The packet keeps its tuple.
    Keep,
    /// Rewrite it.
    Rewrite(nat::rewrite::Prepared),
    /// The rewrite is impossible (protocol change or kind mismatch).
    Refuse,
}

/// Prepares the translation of a packet carrying `from` (of kind `kind`) to `to`.
#[inline]
fn xlat(from: &Tuple, kind: L4Kind, to: &Tuple) -> Xlat {
    if to.src == from.src && to.dst == from.dst && to.sport == from.sport && to.dport == from.dport
    {
        return Xlat::Keep;
    }
    match nat::rewrite::prepare(from, kind, to) {
        Some(p) => Xlat::Rewrite(p),
        None => Xlat::Refuse,
    }
}

/// Applies a prepared translation to the packet it was prepared for (`ip` exactly the
/// datagram, its header checked).
#[inline]
fn apply_xlat(ip: &mut [u8], info: &mut Ipv4Info, x: &Xlat, mode: CsumMode) -> Hook {
    match x {
        Xlat::Keep => Hook::Accept,
        Xlat::Rewrite(p) => match nat::rewrite::apply_prepared(ip, info.hdr_len, p, mode) {
            Ok(()) => {
                info.src = p.new_src();
                info.dst = p.new_dst();
                Hook::Accept
            }
            Err(_) => Hook::Drop(DropReason::NatUntranslatable),
        },
        Xlat::Refuse => Hook::Drop(DropReason::NatUntranslatable),
    }
}

/// The conntrack key ([`Tuple::to_words`], zone 0) of an unfragmented TCP or UDP packet,
/// read straight from its header (`hdr_len` bytes, at least 20), and its kind; `None` for
/// anything [`Tuple::from_ipv4`] would not give both ports for.
#[inline]
fn tcp_udp_key(ip: &[u8], hdr_len: usize) -> Option<([u64; 2], L4Kind)> {
    // The fixed header as an array: every field read below is bounds-check free.
    let h = Ipv4Packet::new_unchecked(ip.first_chunk::<20>()?);
    let proto = h.protocol();
    let kind = match proto {
        PROTO_TCP => L4Kind::Tcp,
        PROTO_UDP => L4Kind::Udp,
        _ => return None,
    };
    if h.frag_offset() != 0 {
        return None;
    }
    let ports = L4Ports::new_checked(ip.get(hdr_len..)?).ok()?;
    let key = [
        h.addrs_u64(),
        u64::from(ports.ports_u32()) << 32 | u64::from(proto) << 16,
    ];
    Some((key, kind))
}

/// An ICMP error about no tracked connection, on the routed path.
const INVALID: Hook = Hook::Drop(DropReason::CtInvalid);

/// What the NAT engine needs to know of routing, for addresses of family `A`: whether an
/// address is the node's own, and by which interface (with that interface's address of the
/// family) a destination leaves. The pipeline lends the router's view for one packet; the
/// engine knows nothing else of the router.
pub(crate) trait Routing<A> {
    /// Whether `addr` is one of the node's own interface addresses (IPv6: global or
    /// link-local).
    fn is_local(&self, addr: A) -> bool;
    /// The interface a packet to `dst` leaves by, and that interface's address of the family
    /// (IPv6: its global address; none when it has none); `None` when no route delivers it
    /// (none, blackhole, unreachable).
    fn egress(&self, dst: A) -> Option<(IfaceId, Option<A>)>;
}

/// A worker's own NAT state, lent to the hook for a batch: its random source (endpoint
/// choice) and its cache of recent connections (see `FlowMemo`).
#[derive(Debug)]
pub(crate) struct NatCtx {
    /// The worker's random source.
    pub(crate) rng: nat::Rng,
    /// The worker's exact-match cache of recent connections.
    pub(crate) memo: FlowMemo,
}

impl NatCtx {
    /// A worker's NAT state, its random source seeded with `seed`.
    pub(crate) fn new(seed: u64) -> NatCtx {
        NatCtx {
            rng: nat::Rng::new(seed),
            memo: FlowMemo::default(),
        }
    }
}

mod family;
#[cfg(test)]
mod ipv6_tests;
mod stale;

pub(crate) use family::NatFamily;

/// The conntrack + NAT engine of one datapath (see the module docs).
pub struct Netfilter {
    /// The connection tables, one per family (IPv6's made on first use unless installed).
    tables: CtTables,
    services: Services,
    rules: ArcSwap<NatRules>,
    counters: Counters,
    /// How long a `FlowMemo` entry is trusted after its connection was last seen live: below
    /// the shortest timeout less the refresh granularity, at most `MEMO_WINDOW_MAX_US`.
    memo_window_us: u64,
    /// The router's local stack: its TCP ports of the node's addresses are not tracked (see
    /// [`crate::l3::local`]); the builder shares the router's.
    pub(crate) local: std::sync::Arc<crate::l3::local::LocalInbox>,
}

impl std::fmt::Debug for Netfilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Netfilter")
            .field("connections", &self.conntrack().len())
            .field("services", &self.services.len())
            .finish()
    }
}

/// The translation a connection applies to a packet travelling in `dir`: the tuple the packet
/// must carry after NAT.
#[inline]
fn target<A: Family>(hit: &CtHit<Tuple<A>>) -> Tuple<A> {
    match hit.dir {
        Dir::Original => hit.reply.invert(),
        Dir::Reply => hit.orig.invert(),
    }
}

#[inline]
fn is_natted<A: Family>(hit: &CtHit<Tuple<A>>) -> bool {
    hit.orig.invert() != hit.reply
}

/// The TCP flags of the segment at `l4` (0 for other kinds or a short segment).
#[inline]
fn tcp_flags(l3: &[u8], l4: usize, kind: L4Kind) -> u8 {
    match kind {
        L4Kind::Tcp => l3.get(l4 + 13).copied().unwrap_or(0),
        _ => 0,
    }
}

/// The packet a hook works on: the datagram's bytes, its header facts (updated when it is
/// translated), its tuple (of an ICMP error: the quoted packet's) and kind, its checksum mode,
/// and the time.
struct Seen<'p, A: Family, I> {
    ip: &'p mut [u8],
    info: &'p mut I,
    t: Tuple<A>,
    kind: L4Kind,
    mode: CsumMode,
    now: Instant,
}

fn csum_mode(b: &PacketBuf) -> CsumMode {
    if b.offload.needs_csum() {
        CsumMode::Partial
    } else {
        CsumMode::Full
    }
}

impl Netfilter {
    /// A NAT engine with `cfg`, both connection tables made now (IPv6's with
    /// `cfg.conntrack6`, else `cfg.conntrack`); errors name the bad field and value.
    pub fn new(cfg: NatConfig) -> Result<Netfilter, CtConfigError> {
        let ct = Conntrack::new(cfg.conntrack)?;
        let ct6 = ConntrackOf::<Ipv6Addr>::new(cfg.conntrack6.unwrap_or(cfg.conntrack))?;
        Ok(Netfilter::with_conntracks(cfg, ct, ct6))
    }

    /// A NAT engine on both connection tables made by the caller (e.g. kept in files,
    /// [`Conntrack::open_file`], [`ConntrackOf<Ipv6Addr>::open_file`](crate::conntrack::CtTable::open_file)).
    pub fn with_conntracks(cfg: NatConfig, ct: Conntrack, ct6: ConntrackOf<Ipv6Addr>) -> Netfilter {
        let nf = Netfilter::with_conntrack(cfg, ct);
        // Freshly made: the cell is empty.
        let _ = nf.set_conntrack::<Ipv6Addr>(ct6);
        nf
    }

    /// A NAT engine with `cfg` on a connection table made by the caller (e.g. one kept in a
    /// file, [`Conntrack::open_file`]); `cfg.conntrack` is not used, the table's own
    /// configuration is. The IPv6 table is then made on first use (see
    /// [`Netfilter::conntrack_of`]) unless installed with [`Netfilter::set_conntrack`].
    pub fn with_conntrack(cfg: NatConfig, ct: Conntrack) -> Netfilter {
        // A memoized connection was seen live (and refreshed, to within REFRESH) at its
        // stamp, so it cannot expire before the shortest timeout less REFRESH has passed.
        let shortest = ct
            .config()
            .timeouts
            .fields()
            .iter()
            .map(|(_, d)| *d)
            .min()
            .unwrap_or_default();
        let margin = crate::conntrack::REFRESH + std::time::Duration::from_millis(1);
        let memo_window_us = u64::try_from(shortest.saturating_sub(margin).as_micros())
            .unwrap_or(u64::MAX)
            .min(MEMO_WINDOW_MAX_US);
        Netfilter {
            tables: CtTables::new(ct),
            services: Services::new(cfg.max_affinity_entries.unwrap_or(65_536)),
            rules: ArcSwap::from_pointee(cfg.rules),
            counters: Counters::default(),
            memo_window_us,
            local: Default::default(),
        }
    }

    /// The IPv4 connection table (lookups, dump like `conntrack -L`, flushes): the
    /// [`Netfilter::conntrack_of`] IPv4, as [`Conntrack`] is [`ConntrackOf<Ipv4Addr>`].
    #[inline(always)]
    pub fn conntrack(&self) -> &Conntrack {
        self.tables.get::<Ipv4Addr>()
    }

    /// The connection table of family `A` ([`Ipv4Addr`], [`Ipv6Addr`]): lookups, dumps like
    /// `conntrack -L [-f ipv6]`, flushes. The IPv6 table is made now (with the IPv4 table's
    /// configuration) if no IPv6 packet made it yet and none was installed.
    #[inline(always)]
    pub fn conntrack_of<A: CtFamily>(&self) -> &ConntrackOf<A> {
        self.tables.get::<A>()
    }

    /// Installs the table of family `A` (e.g. an IPv6 one kept in a file,
    /// [`CtTable::open_file`](crate::conntrack::CtTable::open_file)). Returns it back if the
    /// engine already has one (always for IPv4, whose table is the engine's from the start; for
    /// IPv6, made by [`Netfilter::conntrack_of`] or an IPv6 packet): install it before traffic
    /// flows.
    pub fn set_conntrack<A: CtFamily>(
        &self,
        ct: ConntrackOf<A>,
    ) -> Result<(), Box<ConntrackOf<A>>> {
        self.tables.set::<A>(ct)
    }

    /// The Services: add, change and remove them while traffic flows.
    pub fn services(&self) -> &Services {
        &self.services
    }

    /// The rules besides Services.
    pub fn rules(&self) -> arc_swap::Guard<std::sync::Arc<NatRules>> {
        self.rules.load()
    }

    /// Replaces the rules; new connections use them at once, established ones keep their
    /// translation.
    pub fn set_rules(&self, rules: NatRules) {
        self.rules.store(std::sync::Arc::new(rules));
    }

    /// Adds or changes a Service (by name), and flushes the UDP flows its change leaves
    /// stale, as kube-proxy's conntrack cleanup (`CleanStaleEntries`; see the `stale`
    /// module): in each family whose frontends or endpoints changed (or on creation), every
    /// UDP flow to one of its frontends (ClusterIP, LoadBalancer and external IPs:port,
    /// `*:node_port`) whose reply does not
    /// come from one of its endpoints (address and port), including flows that began before
    /// the Service existed, and the flows it DNAT'd through a frontend it no longer has. TCP
    /// connections are left to finish or time out. The scan is O(table size), per family
    /// that changed.
    pub fn upsert_service(
        &self,
        spec: nat::ServiceSpec,
        now: Instant,
    ) -> Result<nat::ServiceId, nat::ServiceError> {
        let old = self.services.get(&spec.name).map(|s| s.spec().clone());
        let id = self.services.upsert(spec.clone())?;
        self.clean_stale_udp::<Ipv4Addr, 2>(id.get(), old.as_ref(), Some(&spec), now);
        self.clean_stale_udp::<Ipv6Addr, 5>(id.get(), old.as_ref(), Some(&spec), now);
        Ok(id)
    }

    /// Removes a Service; its UDP flows (both families) are flushed, TCP connections finish
    /// on their own.
    pub fn remove_service(&self, name: &str, now: Instant) -> Option<nat::ServiceSpec> {
        let id = self.services.get(name).map(|s| s.id().get());
        let spec = self.services.remove(name)?;
        if let Some(id) = id {
            self.clean_stale_udp::<Ipv4Addr, 2>(id, Some(&spec), None, now);
            self.clean_stale_udp::<Ipv6Addr, 5>(id, Some(&spec), None, now);
        }
        Some(spec)
    }

    /// Counters.
    pub fn counters(&self) -> NfCounters {
        self.counters.snapshot()
    }

    /// Expires connections incrementally (at most `budget` slots per call of each table; the
    /// IPv6 table once it is made: its expired entries would otherwise stay until an insert
    /// needs their room, holding their sources' counts against `max_per_source`).
    pub(crate) fn sweep(&self, now: Instant, budget: usize) {
        self.conntrack().sweep(now, budget);
        if let Some(ct6) = self.tables.if_made::<Ipv6Addr>() {
            ct6.sweep(now, budget);
        }
    }

    /// Hints the CPU to fetch the conntrack buckets of an IPv4 packet's tuple (TCP or UDP,
    /// unfragmented; `ip` from the IPv4 header on), so that pass 2's lookup overlaps its cache
    /// misses with the batch's other packets. `last` holds the words of the last tuple
    /// prefetched; the same tuple again is skipped.
    #[inline]
    pub(crate) fn prefetch_ipv4(&self, ip: &[u8], last: &mut [u64; 2]) {
        let Some(&v) = ip.first() else {
            return;
        };
        let ihl = usize::from(v & 0x0f) * 4;
        if v >> 4 != 4 || ihl < 20 {
            return;
        }
        let Some((key, _)) = tcp_udp_key(ip, ihl) else {
            return;
        };
        if key == *last {
            return;
        }
        *last = key;
        let ct = self.conntrack();
        ct.prefetch(&ct.locate(&Tuple::from_words(key)));
    }

    /// The PREROUTING hook for a packet of family `A` the router received (see the module
    /// docs). `l3` is the IP header's offset in the frame and `info` its checked facts
    /// (IPv6: by [`crate::wire::ipv6::check`]), updated when the packet is translated. A
    /// fragment is answered [`Hook::Fragment`]: put together first, the datagram comes back.
    #[inline]
    pub(crate) fn prerouting<A: NatFamily<W>, const W: usize>(
        &self,
        routing: &impl Routing<A>,
        b: &mut PacketBuf,
        l3: usize,
        info: &mut A::Info,
        cx: &mut NatCtx,
        now: Instant,
    ) -> Hook {
        // Conntrack sees whole datagrams: a fragment is put together with the rest first.
        if A::is_fragment(info) {
            return Hook::Fragment;
        }
        let mode = csum_mode(b);
        let end = l3 + A::total_len(info);
        let Some(ip) = b.frame_mut().get_mut(l3..end) else {
            return Hook::Drop(DropReason::Truncated);
        };
        if let Some(h) = A::memo_hit(self, ip, info, &mut cx.memo, now, mode) {
            return h;
        }
        let Some((t, kind)) = A::tuple(ip, info) else {
            self.counters.untracked.add(1);
            return Hook::Accept;
        };
        if A::UNTRACKED_INFO_ICMP && t.proto == A::ICMP.number() && kind == L4Kind::Other {
            // NDP, MLD, router solicitations and advertisements and other informational
            // ICMPv6: link-local control traffic, not connections (Linux's `icmpv6_new`
            // refuses to create entries for them); never dropped as INVALID here.
            self.counters.untracked.add(1);
            return Hook::Accept;
        }
        let ct = self.conntrack_of::<A>();
        let pkt = Pkt {
            kind,
            tcp_flags: tcp_flags(ip, A::l4_off(info), kind),
            len: len32(A::total_len(info)),
        };
        let p = Seen {
            ip,
            info,
            t,
            kind,
            mode,
            now,
        };
        if let L4Kind::IcmpError { inner_l3 } = kind {
            return self.related(p, usize::from(inner_l3), INVALID);
        }
        if let Some(hit) = ct.lookup(&t, now) {
            let x = A::xlat(&t, kind, &target(&hit));
            // Only a packet that refreshed the entry's timeout (`Ok`) stamps a memo: that is
            // what bounds how soon the entry can expire.
            let keep = match ct.track(&hit, &pkt, now) {
                Track::Ok(_) => true,
                Track::Ignored | Track::Related | Track::Closed => false,
                Track::Invalid(_) if ct.config().liberal => false,
                Track::Invalid(_) => return Hook::Drop(DropReason::CtInvalid),
                // The old connection is gone: this packet opens a new one.
                Track::Reopen | Track::Gone => {
                    return self.new_connection(routing, p, &pkt, cx);
                }
            };
            A::remember(&mut cx.memo, &t, &hit, &x, keep, now);
            return A::apply_xlat(p.ip, p.info, &x, mode);
        }
        self.new_connection(routing, p, &pkt, cx)
    }

    /// Translates a packet of a known connection to `to` (a no-op when it already carries it).
    #[inline]
    fn apply<A: NatFamily<W>, const W: usize>(p: Seen<'_, A, A::Info>, to: &Tuple<A>) -> Hook {
        A::apply_xlat(p.ip, p.info, &A::xlat(&p.t, p.kind, to), p.mode)
    }

    /// An ICMP error quoting a packet with tuple `p.t`: RELATED to that packet's connection;
    /// `on_miss` when there is none.
    fn related<A: NatFamily<W>, const W: usize>(
        &self,
        p: Seen<'_, A, A::Info>,
        inner_l3: usize,
        on_miss: Hook,
    ) -> Hook {
        let Some(ct) = self.tables.if_made::<A>() else {
            return on_miss;
        };
        // The error travels against the quoted packet: look its inverse up.
        let Some(hit) = ct.lookup(&p.t.invert(), p.now) else {
            return on_miss;
        };
        self.counters.related.add(1);
        if !is_natted(&hit) {
            return Hook::Accept;
        }
        // The quoted packet travelled the other way; restore it as its sender sent it.
        let (this_dir, quoted_was) = match hit.dir {
            Dir::Reply => (hit.reply, hit.orig),
            Dir::Original => (hit.orig, hit.reply),
        };
        let t = target(&hit);
        // The outer destination is ours (translated); the outer source is changed only when
        // it is the connection's own peer (an intermediate router keeps its address).
        let src = A::src(p.info);
        let outer_src = if src == this_dir.src { t.src } else { src };
        let outer = (outer_src, t.dst);
        let hdr = A::hdr(p.info);
        match nat::rewrite_icmp_error(p.ip, hdr, inner_l3, &quoted_was, outer.0, outer.1, p.mode) {
            Ok(()) => {
                <A as NatFamily<W>>::set_addrs(p.info, outer.0, outer.1);
                Hook::Accept
            }
            Err(_) => Hook::Drop(DropReason::NatUntranslatable),
        }
    }

    /// A new TCP or UDP connection to one of the node's own addresses that no Service claims:
    /// `true` to let it through untracked (TCP to a port of the router's local stack, see
    /// [`crate::l3::local`]: the stack's answers do not pass through conntrack, which would
    /// refuse the handshake's ACK of a connection it saw one way only). Every other one is
    /// tracked without source NAT, as Linux delivers it on its INPUT path, where
    /// POSTROUTING's masquerade does not run (a masqueraded SYN to a closed port was answered
    /// with a reset addressed to the node itself: the client never heard of it).
    #[cold]
    #[inline(never)]
    fn to_us<A: Family>(&self, t: &Tuple<A>) -> bool {
        if t.proto == PROTO_TCP && self.local.serves(t.dport) {
            self.counters.untracked.add(1);
            return true;
        }
        false
    }

    /// The first packet of a connection: Services (DNAT), routing, masquerade/SNAT, insert.
    fn new_connection<A: NatFamily<W>, const W: usize>(
        &self,
        routing: &impl Routing<A>,
        p: Seen<'_, A, A::Info>,
        pkt: &Pkt,
        cx: &mut NatCtx,
    ) -> Hook {
        let (t, now) = (p.t, p.now);
        let ct = self.conntrack_of::<A>();
        let all_rules = self.rules.load();
        let rules = all_rules.of::<A>();
        let outside = |a| rules.cluster_cidr.is_some_and(|c| !c.contains(a));
        let hash = A::flow_hash(&t);
        let mut tag = CtTag::default();
        let mut masq = false;
        let mut after = t;
        let mut hairpin = false;
        // Delivered to the node itself (Linux's INPUT path): no source NAT.
        let mut local_in = false;
        if matches!(p.kind, L4Kind::Tcp | L4Kind::Udp) {
            // `node_port`: the KUBE-EXT-* path, for a node port and as well for a
            // LoadBalancer IP or an external IP (asked after the ClusterIPs and before the
            // node ports, in KUBE-SERVICES' order).
            let (svc, node_port) = match A::by_vip(&self.services, t.dst, t.dport, t.proto) {
                Some(s) => (Some(s), false),
                None => match A::by_external(&self.services, t.dst, t.dport, t.proto) {
                    Some((s, kind)) => {
                        // KUBE-FW-*: a source outside the ranges is dropped (only while the
                        // Service has endpoints: without, it is rejected as any).
                        if kind == FrontendKind::LoadBalancer
                            && A::has_endpoints(&s)
                            && !s.spec().source_allowed(t.src.into())
                        {
                            return Hook::Drop(DropReason::LbSourceRange);
                        }
                        (Some(s), true)
                    }
                    None if routing.is_local(t.dst) => {
                        let svc = A::by_node_port(&self.services, t.dport, t.proto);
                        (svc.filter(|_| rules.node_port_on(t.dst)), true)
                    }
                    None => (None, false),
                },
            };
            if node_port && svc.is_none() {
                // To one of the node's own addresses, no Service: see `to_us`.
                if self.to_us(&t) {
                    return Hook::Accept;
                }
                local_in = true;
            }
            if let Some(svc) = svc {
                // KUBE-EXT-*: traffic from inside the cluster CIDR to a node port goes to every
                // endpoint, unmasqueraded, whatever the policy ("pod traffic for external
                // destinations"); only external clients get the Local policy.
                let from_pod = rules.cluster_cidr.is_some_and(|c| c.contains(t.src));
                // ... nor the node's own connections (from one of its addresses, through the
                // host port): "masquerade LOCAL traffic", "route LOCAL traffic for external
                // destinations".
                let local_policy = node_port && svc.spec().external_local && !from_pod;
                let from_node = local_policy && routing.is_local(t.src);
                let local_only = local_policy && !from_node;
                // internalTrafficPolicy Local (KUBE-SVL-*): ClusterIP traffic, from anywhere,
                // to this node's endpoints only.
                let local_only = local_only || (!node_port && svc.spec().internal_local);
                let flow = (hash, cx.rng.next_u64());
                let Some(ep) = A::select(&self.services, &svc, t.src, flow, local_only, now) else {
                    self.counters.rejected.add(1);
                    // No usable endpoint: REJECT (none anywhere, or none ready nor serving
                    // and terminating) or DROP (a Local policy without local endpoints while
                    // there are some elsewhere), as kube-proxy's "has no endpoints" and "has
                    // no local endpoints" filter rules.
                    return if local_only && A::has_endpoints(&svc) {
                        Hook::Drop(DropReason::NoEndpoint)
                    } else {
                        Hook::Reject {
                            tcp: t.proto == PROTO_TCP,
                        }
                    };
                };
                (after.dst, after.dport) = ep;
                tag.service = svc.id().get();
                tag.endpoint = endpoint_tag(ep.0);
                // KUBE-MARK-MASQ: from outside the cluster, NodePort with policy Cluster,
                // and hairpin (the endpoint is the client).
                hairpin = after.dst == t.src;
                masq = if node_port {
                    // KUBE-EXT-*: policy Cluster masquerades every client (pods too); Local
                    // keeps the client's address, but for the node's own.
                    !svc.spec().external_local || from_node
                } else {
                    // KUBE-SVC-*: `! -s <cluster-cidr> -d <cluster-ip>` (`--masquerade-all`:
                    // any source).
                    outside(t.src) || all_rules.masquerade_all
                } || hairpin;
            }
        }
        // Route the translated destination to learn the egress interface.
        let mut snat: Option<(A, Option<PortRange>)> = None;
        if let Some((out, addr)) = routing.egress(after.dst).filter(|_| !local_in) {
            let rule = || {
                rules.masquerade.iter().any(|r| {
                    r.out == out
                        && r.src.is_none_or(|p| p.contains(t.src))
                        && r.except_dst.is_none_or(|p| !p.contains(after.dst))
                })
            };
            if masq || rule() {
                // MASQUERADE out of an interface without an address of the family: Linux
                // drops the packet (no source address to take); so do we.
                match addr {
                    Some(a) => snat = Some((a, all_rules.masquerade_ports)),
                    None => return Hook::Drop(DropReason::NatExhausted),
                }
            } else if let Some(r) = rules
                .snat
                .iter()
                .find(|r| r.out.is_none_or(|o| o == out) && r.src.contains(t.src))
            {
                snat = Some((r.to, r.ports));
            }
        }
        let fin = match snat {
            None => after,
            Some((addr, ports)) => {
                let range = ports.unwrap_or_else(|| PortRange::linux_default(after.sport));
                let in_use = |c: &Tuple<A>| ct.tuple_in_use(c, now);
                let chosen = if all_rules.random_fully {
                    nat::alloc_source_random_fully(&after, addr, range, hash, in_use)
                } else {
                    nat::alloc_source(&after, addr, range, hash, in_use)
                };
                match chosen {
                    Some(c) => c,
                    None => return Hook::Drop(DropReason::NatExhausted),
                }
            }
        };
        // A pod is known by its address: sources in the cluster CIDR (every source without
        // one) count against the per-source limit, if the table has one. Clients outside it
        // (a NodePort's, often a load balancer's few addresses standing for many) do not.
        if !outside(t.src) {
            tag.status.0 |= CtStatus::SOURCE_LIMITED;
        }
        let hit = match ct.insert(t, fin.invert(), tag, pkt, now) {
            Ok(h) => h,
            Err(InsertError::Clash {
                existing: Some(h), ..
            }) => {
                // Another worker inserted this connection first: follow its choice.
                let _ = ct.track(&h, pkt, now);
                return Self::apply(p, &target(&h));
            }
            Err(InsertError::Clash { existing: None }) => {
                return Hook::Drop(DropReason::NatExhausted)
            }
            Err(InsertError::Full) => return Hook::Drop(DropReason::CtFull),
            Err(InsertError::SourceLimit) => return Hook::Drop(DropReason::CtLimit),
            Err(InsertError::Invalid(_)) if ct.config().liberal => return Hook::Accept,
            Err(InsertError::Invalid(_)) => return Hook::Drop(DropReason::CtInvalid),
        };
        let c = &self.counters;
        c.new.add(1);
        if after != t {
            c.dnat.add(1);
        }
        if fin.src != t.src || fin.sport != t.sport {
            c.snat.add(1);
        }
        if hairpin {
            c.hairpin.add(1);
        }
        Self::apply(p, &target(&hit))
    }

    /// The hook for a frame of family `A` switched between two ports of one bridge
    /// (`br_netfilter`): a packet of a NAT'd connection the router tracks is tracked and
    /// translated; anything else passes untouched. `l3` is the IP header's offset. A
    /// fragment is answered [`Bridged::Fragment`]: its datagram, once put together, goes
    /// through [`Netfilter::bridged_datagram`].
    pub(crate) fn bridged<A: NatFamily<W>, const W: usize>(
        &self,
        b: &mut PacketBuf,
        l3: usize,
        now: Instant,
    ) -> Bridged {
        // No table of the family yet, or an empty one: nothing to do (and none is made).
        let Some(ct) = self.tables.if_made::<A>().filter(|c| !c.is_empty()) else {
            return Bridged::Accept;
        };
        let Some(info) = A::check(b.frame().get(l3..).unwrap_or(&[])) else {
            return Bridged::Accept;
        };
        if A::is_fragment(&info) {
            return Bridged::Fragment;
        }
        match self.bridged_packet::<A, W>(ct, b, l3, info, now) {
            Ok(()) => Bridged::Accept,
            Err(r) => Bridged::Drop(r),
        }
    }

    /// [`Netfilter::bridged`] for a datagram put together from its fragments: `Ok` to
    /// switch it (translated, if it was), else why it is dropped.
    pub(crate) fn bridged_datagram<A: NatFamily<W>, const W: usize>(
        &self,
        b: &mut PacketBuf,
        l3: usize,
        now: Instant,
    ) -> Result<(), DropReason> {
        let Some(ct) = self.tables.if_made::<A>().filter(|c| !c.is_empty()) else {
            return Ok(());
        };
        let Some(info) = A::check(b.frame().get(l3..).unwrap_or(&[])) else {
            return Ok(());
        };
        self.bridged_packet::<A, W>(ct, b, l3, info, now)
    }

    /// [`Netfilter::bridged`] for a packet that is no fragment (header facts `info`, table
    /// `ct`): `Ok` to switch it, else why it is dropped.
    fn bridged_packet<A: NatFamily<W>, const W: usize>(
        &self,
        ct: &A::Table,
        b: &mut PacketBuf,
        l3: usize,
        info: A::Info,
        now: Instant,
    ) -> Result<(), DropReason> {
        match self.bridged_hook::<A, W>(ct, b, l3, info, now) {
            Hook::Accept => Ok(()),
            Hook::Drop(r) => Err(r),
            Hook::Reject { .. } => Err(DropReason::NoEndpoint),
            // Translating a packet that is no fragment never asks for its datagram.
            Hook::Fragment => Err(DropReason::FragMalformed),
        }
    }

    /// [`Netfilter::bridged_packet`] as the router's hooks answer.
    fn bridged_hook<A: NatFamily<W>, const W: usize>(
        &self,
        ct: &A::Table,
        b: &mut PacketBuf,
        l3: usize,
        mut info: A::Info,
        now: Instant,
    ) -> Hook {
        let mode = csum_mode(b);
        let end = l3 + A::total_len(&info);
        let Some(ip) = b.frame_mut().get_mut(l3..end) else {
            return Hook::Accept;
        };
        let Some((t, kind)) = A::tuple(ip, &info) else {
            return Hook::Accept;
        };
        let tcp_flags = tcp_flags(ip, A::l4_off(&info), kind);
        let len = len32(A::total_len(&info));
        let p = Seen {
            ip,
            info: &mut info,
            t,
            kind,
            mode,
            now,
        };
        if let L4Kind::IcmpError { inner_l3 } = kind {
            // An error about a connection the router does not track is switched untouched.
            return self.related(p, usize::from(inner_l3), Hook::Accept);
        }
        let Some(hit) = ct.lookup(&t, now) else {
            return Hook::Accept;
        };
        let pkt = Pkt {
            kind,
            tcp_flags,
            len,
        };
        match ct.track(&hit, &pkt, now) {
            Track::Invalid(_) if !ct.config().liberal => Hook::Drop(DropReason::CtInvalid),
            _ if !is_natted(&hit) => Hook::Accept,
            _ => Self::apply(p, &target(&hit)),
        }
    }

    /// An ICMP error of family `A` the router makes (see the [`ErrorNat`] impl): `false` when
    /// it cannot be translated and must not be sent.
    fn translate_own_error<A: NatFamily<W>, const W: usize>(
        &self,
        ip: &mut [u8],
        info: &mut A::Info,
        now: Instant,
    ) -> bool {
        let Some((t, kind @ L4Kind::IcmpError { inner_l3 })) = A::tuple(ip, info) else {
            return true;
        };
        let p = Seen {
            ip,
            info,
            t,
            kind,
            mode: CsumMode::Full,
            now,
        };
        matches!(
            self.related(p, usize::from(inner_l3), Hook::Accept),
            Hook::Accept
        )
    }
}

/// The 32-bit endpoint tag of a connection: the endpoint address's last 32 bits (all of an
/// IPv4 address).
#[inline]
fn endpoint_tag<A: Family>(a: A) -> u32 {
    match a.into() {
        IpAddr::V4(a) => u32::from(a),
        IpAddr::V6(a) => low32(low64(u128::from(a))),
    }
}

/// ICMP errors the router makes about packets this engine translated: RELATED to the quoted
/// packet's connection and translated back through it, as Linux's NAT does for an error that
/// `icmp_send` attached the connection to (`nf_nat_icmp_reply_translation`): the destination
/// becomes the original sender, the quoted packet what that sender sent (every checksum
/// updated). The router's own source address is kept (as `related` keeps an
/// intermediate router's). An error about no tracked connection goes out unchanged.
impl ErrorNat<Ipv4Addr> for Netfilter {
    fn translate_error(&self, ip: &mut [u8], info: &mut Ipv4Info, now: Instant) -> bool {
        self.translate_own_error::<Ipv4Addr, 2>(ip, info, now)
    }
}

/// As for IPv4 (above).
impl ErrorNat<Ipv6Addr> for Netfilter {
    fn translate_error(
        &self,
        ip: &mut [u8],
        info: &mut crate::wire::ipv6::Ipv6Info,
        now: Instant,
    ) -> bool {
        self.translate_own_error::<Ipv6Addr, 5>(ip, info, now)
    }
}

#[cfg(test)]
mod tests {
    //! The per-batch memo changes no outcome: the same frames give the same verdicts, bytes
    //! and connection states whether they come in one batch or one per batch.

    use std::net::{Ipv4Addr, SocketAddrV4};

    use super::NatConfig;
    use crate::conntrack::tcp::flags::{ACK, FIN, RST, SYN};
    use crate::l3::router::IfaceConfig;
    use crate::nat::{Endpoint, ServiceSpec};
    use crate::wire::family::IpProto;
    use crate::{
        Batch, BridgeConfig, Datapath, Instant, MacAddr, PacketBuf, PortId, Verdict, Worker,
    };

    const GW0: MacAddr = MacAddr([2, 0, 0, 0, 0xfe, 0]);
    const GW1: MacAddr = MacAddr([2, 0, 0, 0, 0xfe, 1]);
    const CM: MacAddr = MacAddr([2, 0, 0, 0, 1, 1]);
    const SM: MacAddr = MacAddr([2, 0, 0, 0, 2, 1]);
    const C: [u8; 4] = [10, 0, 0, 10];
    const S: [u8; 4] = [10, 0, 1, 10];
    const VIP: [u8; 4] = [10, 96, 0, 1];
    const PC: PortId = PortId(0);
    const PS: PortId = PortId(1);

    fn node() -> (Datapath, Worker, Instant) {
        let mut b = Datapath::builder();
        let br0 = b.add_bridge(BridgeConfig::new("br0")).unwrap();
        let br1 = b.add_bridge(BridgeConfig::new("br1")).unwrap();
        assert_eq!(b.add_port("c", Some(br0)).unwrap(), PC);
        assert_eq!(b.add_port("s", Some(br1)).unwrap(), PS);
        let (if0, _) = b
            .add_router_iface(
                IfaceConfig::new("gw0", GW0, Ipv4Addr::new(10, 0, 0, 254), 24),
                Some(br0),
            )
            .unwrap();
        let (if1, _) = b
            .add_router_iface(
                IfaceConfig::new("gw1", GW1, Ipv4Addr::new(10, 0, 1, 254), 24),
                Some(br1),
            )
            .unwrap();
        b.netfilter(NatConfig::default()).unwrap();
        let dp = b.build();
        let now = Instant::from_secs(1);
        dp.control()
            .add_static_neigh(if0, std::net::IpAddr::from(C), CM, now)
            .unwrap();
        dp.control()
            .add_static_neigh(if1, std::net::IpAddr::from(S), SM, now)
            .unwrap();
        let mut s = ServiceSpec::new("web", Ipv4Addr::from(VIP), 80, IpProto::TCP);
        s.endpoints = vec![Endpoint::new(SocketAddrV4::new(S.into(), 8080), true)];
        dp.control()
            .netfilter()
            .unwrap()
            .upsert_service(s, now)
            .unwrap();
        let mut w = dp.worker();
        for (p, mac) in [(PC, CM), (PS, SM)] {
            let mut f = vec![0xff; 6];
            f.extend_from_slice(&mac.0);
            f.extend_from_slice(&[0x88, 0xb5]);
            f.resize(60, 0);
            run(&dp, &mut w, now, &[(p, f)]);
        }
        (dp, w, now)
    }

    /// A segment of connection `sport` from the client (`up`) or back from the endpoint.
    fn seg(sport: u16, up: bool, fl: u8) -> (PortId, Vec<u8>) {
        let (sm, dm, src, sp, dst, dp) = if up {
            (CM, GW0, C, sport, VIP, 80)
        } else {
            (SM, GW1, S, 8080, C, sport)
        };
        let mut b = etherparse::PacketBuilder::ethernet2(sm.0, dm.0)
            .ipv4(src, dst, 64)
            .tcp(sp, dp, 1000, 64240);
        if fl & SYN != 0 {
            b = b.syn();
        }
        if fl & ACK != 0 {
            b = b.ack(5000);
        }
        if fl & FIN != 0 {
            b = b.fin();
        }
        if fl & RST != 0 {
            b = b.rst();
        }
        let mut f = Vec::new();
        b.write(&mut f, b"data").unwrap();
        (if up { PC } else { PS }, f)
    }

    type Out = (Vec<Verdict>, Vec<(PortId, Vec<u8>)>);

    fn run(dp: &Datapath, w: &mut Worker, now: Instant, frames: &[(PortId, Vec<u8>)]) -> Out {
        let mut batch = Batch::new();
        for (p, f) in frames {
            let mut b = PacketBuf::from_frame(f);
            b.port = *p;
            batch.push(b).unwrap();
        }
        dp.process(w, now, &mut batch);
        let v = batch.verdicts().to_vec();
        let mut out = Vec::new();
        dp.dispatch(w, &batch, |p, b| {
            out.push((p, b.frame().to_vec()));
            Ok(())
        });
        batch.recycle(&mut w.pool);
        (v, out)
    }

    #[test]
    fn prefetch_takes_any_bytes_and_skips_a_repeated_tuple() {
        let (dp, _, _) = node();
        let nf = dp.control().netfilter().unwrap();
        let (_, seg) = seg(40_000, true, 0x10);
        let ip = &seg[14..];
        let mut last = [0u64; 2];
        for cut in 0..24 {
            nf.prefetch_ipv4(&ip[..cut], &mut last);
        }
        assert_eq!(last, [0; 2], "nothing short of the ports is prefetched");
        nf.prefetch_ipv4(ip, &mut last);
        assert_eq!(
            crate::narrow::low32(last[0]),
            u32::from_be_bytes(VIP),
            "the tuple's words are kept"
        );
        let mut odd = ip.to_vec();
        odd[0] = 0x4f; // a 60-byte header claimed, longer than the packet's ports
        let before = last;
        nf.prefetch_ipv4(&odd[..30], &mut last);
        assert_eq!(last, before);
    }

    #[test]
    fn the_memo_spans_batches_for_a_moment_only() {
        let (dp, mut w, now) = node();
        let found = |dp: &Datapath| {
            dp.control()
                .netfilter()
                .unwrap()
                .conntrack()
                .counters()
                .found
        };
        run(&dp, &mut w, now, &[seg(1000, true, SYN)]);
        run(&dp, &mut w, now, &[seg(1000, false, SYN | ACK)]);
        run(&dp, &mut w, now, &[seg(1000, true, ACK)]);
        let f0 = found(&dp);
        // Moments later, in another batch: the worker's memo answers, no lookup.
        let soon = now + std::time::Duration::from_millis(50);
        let (v, out) = run(&dp, &mut w, soon, &[seg(1000, true, ACK)]);
        assert!(matches!(v[..], [Verdict::Output(_)]), "{v:?}");
        assert_eq!(out.len(), 1);
        assert_eq!(found(&dp), f0, "a memo hit");
        // Past the memo's window the table is asked again (and the memo renewed).
        let later = soon + std::time::Duration::from_millis(150);
        run(&dp, &mut w, later, &[seg(1000, true, ACK)]);
        assert_eq!(found(&dp), f0 + 1, "looked up again");
        run(&dp, &mut w, later, &[seg(1000, true, ACK)]);
        assert_eq!(found(&dp), f0 + 1);
    }

    #[test]
    fn one_batch_equals_one_packet_per_batch() {
        let script: Vec<Vec<(PortId, Vec<u8>)>> = vec![
            vec![
                seg(1000, true, SYN),
                seg(2000, true, SYN),
                seg(3000, true, SYN),
            ],
            vec![
                seg(1000, false, SYN | ACK),
                seg(2000, false, SYN | ACK),
                seg(1000, true, ACK),
                seg(1000, true, ACK),
                seg(1000, false, ACK),
            ],
            vec![
                seg(1000, true, ACK),
                seg(1000, true, ACK),
                seg(1000, true, ACK),
                seg(1000, true, FIN | ACK),
                seg(1000, true, ACK),
                seg(1000, true, SYN | ACK),
                seg(1000, false, FIN | ACK),
                seg(1000, false, FIN | ACK),
                seg(1000, true, ACK),
                seg(1000, true, ACK),
                seg(1000, true, SYN),
                seg(1000, true, ACK),
                seg(2000, true, ACK),
                seg(2000, true, ACK),
                seg(2000, true, RST),
                seg(2000, true, ACK),
                seg(2000, true, ACK),
                seg(3000, true, RST),
                seg(3000, true, ACK),
                seg(3000, true, SYN),
                seg(3000, true, SYN),
                seg(3000, true, 0),
            ],
        ];
        let (dp1, mut w1, now) = node();
        let (dp2, mut w2, _) = node();
        for step in &script {
            let a = run(&dp1, &mut w1, now, step);
            let mut b: Out = (Vec::new(), Vec::new());
            for f in step {
                let (v, o) = run(&dp2, &mut w2, now, std::slice::from_ref(f));
                b.0.extend(v);
                b.1.extend(o);
            }
            assert_eq!(a, b);
            let dump = |dp: &Datapath| {
                let mut d: Vec<_> = dp
                    .control()
                    .netfilter()
                    .unwrap()
                    .conntrack()
                    .dump(now)
                    .into_iter()
                    .map(|mut v| {
                        v.id.slot = 0;
                        v.id.gen = 0;
                        v
                    })
                    .collect();
                d.sort_by_key(|v| v.orig.sport);
                d
            };
            assert_eq!(dump(&dp1), dump(&dp2));
        }
        let c = |dp: &Datapath| {
            let mut c = dp.control().netfilter().unwrap().conntrack().counters();
            c.found = 0;
            c
        };
        assert_eq!(c(&dp1), c(&dp2));
    }
}
