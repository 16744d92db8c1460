//! The router: interfaces with IPv4 and IPv6 addresses, the routing tables, forwarding as
//! Linux's `ip_forward` / `ip6_forward`, neighbour resolution (ARP, NDP), Router
//! Advertisements, and the ICMP messages a Linux router sends.
//!
//! * this file: the [`Router`] and its shared state (interfaces, tables, counters, the ICMP
//!   rate limit, a batch's memo), and the hooks the datapath plugs in;
//! * [`forward`]: the forwarding path, written once over the family ([`RouterFamily`]);
//! * [`ipv4`]: ARP, directed broadcasts, fragmentation; [`ipv6`]: NDP, RA, link-local scope.
//!
//! The router is part of the sans-IO datapath. A router interface either sits on a bridge
//! (like `cni0`: it gets a virtual port on the bridge, and frames the bridge sends to the
//! interface's MAC enter L3) or owns an external port of its own (an uplink like a node's
//! `eth0`). Frames the router makes (ARP, NDP, ICMP, released packets) go through a sink;
//! the datapath turns them into batch entries and sends them out of the interface's port.
//!
//! Where tapyard differs from Linux, on purpose: no ICMP redirects are sent (Linux sends them
//! when a packet leaves through the interface it came in on; pods would ignore them anyway);
//! packets to the router's own addresses are answered only for ICMP echo (UDP gets a port
//! unreachable, TCP a drop, counted) since the router has no sockets.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use parking_lot::Mutex;

use crate::base::{BridgeId, IfaceId, PortId};
use crate::buf::PacketBuf;
use crate::l3::defrag::Frags;
use crate::l3::neigh::{NeighEvent, NeighTable};
use crate::l3::route::{RouteAddr, RouteReader, RouteTable};
use crate::narrow::low64;
use crate::stats::{counter_set, DropReason, Shard, SharedCounter};
use crate::time::Instant;
use crate::wire::arp::{self, ArpRepr};
use crate::wire::ethernet::ethertype;
use crate::wire::ipv6::{self as wire_ipv6};
use crate::wire::mac::MacAddr;

mod forward;
mod ipv4;
mod ipv6;
mod reply;

pub(crate) use forward::{RouterFamily, Rx};

/// Settings of one router interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IfaceConfig {
    /// A unique name, like `cni0` or `eth0`.
    pub name: String,
    /// The interface's MAC address (the pods' gateway MAC).
    pub mac: MacAddr,
    /// The interface's IPv4 address and prefix length (the connected route `addr/len` is
    /// made from it); `None`: an IPv6-only interface, as on a single-stack IPv6 node. Such an
    /// interface answers no ARP and the router sends no IPv4 of its own from it (ICMP errors
    /// about packets it forwards take another interface's IPv4 address, as Linux's
    /// `inet_select_addr`). IPv4 arriving on it is forwarded when a route says where, as
    /// Linux with `rp_filter` 0 (the kernel's default); IPv4 addressed to one of the
    /// router's own addresses that arrives on it is dropped (`DropReason::NoIpv4Addr`), as
    /// Linux with `rp_filter` 1 or 2 (systemd's default) does (`__fib_validate_source`
    /// refuses any source on an interface without an IPv4 address; with `rp_filter` 0 Linux
    /// would deliver it: tapyard differs there on purpose, so an IPv6-only link never
    /// reaches the node's IPv4 services).
    pub addr: Option<(Ipv4Addr, u8)>,
    /// The largest IP packet sent out of it (default 1500).
    pub mtu: u16,
    /// Answer ARP for any address routed through another interface (Linux `proxy_arp`).
    pub proxy_arp: bool,
    /// The interface's global IPv6 address and prefix length (the connected route
    /// `prefix/len` is made from it); `None`: IPv6 on this interface has only its link-local
    /// address, `fe80::` + the EUI-64 of [`IfaceConfig::mac`].
    pub addr6: Option<(Ipv6Addr, u8)>,
    /// Router Advertisements sent on this interface (`None`: none, the default).
    pub ra: Option<RaConfig>,
}

/// Router Advertisements on one interface (RFC 4861 6.2), with radvd's defaults: unsolicited
/// RAs at a random interval between `min_interval` and `max_interval` (the first three at
/// most 16 s apart, RFC 4861 6.2.4), Router Solicitations answered after a random delay of
/// at most 0.5 s. Each RA carries the source link-layer address, the MTU when it is not
/// 1500, and the prefix of [`IfaceConfig::addr6`] as on-link and autonomous (so pods can form
/// addresses with SLAAC and learn their default router).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RaConfig {
    /// MaxRtrAdvInterval (default 600 s).
    pub max_interval: Duration,
    /// MinRtrAdvInterval (default 198 s, 0.33 × the maximum).
    pub min_interval: Duration,
    /// AdvDefaultLifetime in seconds (default 1800; 0: not a default router).
    pub router_lifetime: u16,
    /// AdvCurHopLimit (default 64).
    pub hop_limit: u8,
    /// AdvValidLifetime of the prefix in seconds (default 86400).
    pub valid_lifetime: u32,
    /// AdvPreferredLifetime of the prefix in seconds (default 14400).
    pub preferred_lifetime: u32,
}

impl Default for RaConfig {
    fn default() -> Self {
        RaConfig {
            max_interval: Duration::from_secs(600),
            min_interval: Duration::from_secs(198),
            router_lifetime: 1800,
            hop_limit: 64,
            valid_lifetime: 86400,
            preferred_lifetime: 14400,
        }
    }
}

impl IfaceConfig {
    /// An interface with the address `addr/prefix_len`, MTU 1500 and no proxy ARP: an IPv4
    /// address (IPv6: only its link-local address), or an IPv6 address (`::`: none, only its
    /// link-local address) and no IPv4 address (an IPv6-only interface). Add the other
    /// family's with [`IfaceConfig::addr`] / [`IfaceConfig::addr6`].
    pub fn new(
        name: impl Into<String>,
        mac: MacAddr,
        addr: impl Into<IpAddr>,
        prefix_len: u8,
    ) -> Self {
        let (addr, addr6) = match addr.into() {
            IpAddr::V4(a) => (Some((a, prefix_len)), None),
            IpAddr::V6(a) => (None, (!a.is_unspecified()).then_some((a, prefix_len))),
        };
        IfaceConfig {
            name: name.into(),
            mac,
            addr,
            mtu: 1500,
            proxy_arp: false,
            addr6,
            ra: None,
        }
    }

    /// Its IPv4 address, if it has one.
    pub fn addr4(&self) -> Option<Ipv4Addr> {
        self.addr.map(|(a, _)| a)
    }
}

/// One interface as the router holds it.
#[derive(Debug)]
pub(crate) struct Iface {
    pub(crate) cfg: IfaceConfig,
    /// The virtual bridge port (for an interface on a bridge) or the external port it owns.
    pub(crate) port: PortId,
    /// The bridge it sits on, if any.
    pub(crate) bridge: Option<BridgeId>,
    /// Its link-local address (`fe80::` + EUI-64 of its MAC).
    pub(crate) ll6: Ipv6Addr,
    /// Its IPv6 addresses (link-local, then global or the link-local again) as native-endian
    /// words, so [`Iface::has_ipv6`] is two 128-bit compares (no byte swaps, no `Option`).
    addrs6: [u128; 2],
}

impl Iface {
    /// An interface on `port` (and `bridge`), its link-local address derived from its MAC.
    pub(crate) fn new(cfg: IfaceConfig, port: PortId, bridge: Option<BridgeId>) -> Iface {
        let ll6 = wire_ipv6::link_local_from_mac(cfg.mac);
        let word = |a: Ipv6Addr| u128::from_ne_bytes(a.octets());
        let addrs6 = [word(ll6), word(cfg.addr6.map_or(ll6, |(g, _)| g))];
        Iface {
            cfg,
            port,
            bridge,
            ll6,
            addrs6,
        }
    }

    /// True when `a` is one of its IPv6 addresses (global or link-local).
    #[inline]
    pub(crate) fn has_ipv6(&self, a: Ipv6Addr) -> bool {
        let k = u128::from_ne_bytes(a.octets());
        k == self.addrs6[0] || k == self.addrs6[1]
    }
}

/// What the router did with a frame addressed to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum L3 {
    /// Rewritten in place (TTL, MACs); send out of this interface.
    Forward(IfaceId),
    /// Answered or consumed by the router itself.
    Local,
    /// Waiting for ARP resolution of its next hop.
    Queued,
    /// Not forwarded.
    Drop(DropReason),
    /// A fragment, untouched (but for trimmed padding), received on this interface: the
    /// prerouting hook ([`Hook::Fragment`]) wants its datagram put together first, which the
    /// caller does and hands back to the router whole.
    Fragment(IfaceId),
}

/// Where the router's own frames go. `write` fills the buffer and returns the frame length.
pub(crate) trait Sink {
    /// Makes one frame to send out of interface `via`.
    fn emit(&mut self, via: IfaceId, write: &mut dyn FnMut(&mut [u8]) -> Option<usize>);
    /// Counts a frame dropped later than its own verdict (it had been queued).
    fn dropped(&mut self, reason: DropReason);
}

counter_set! {
    /// The router's event counters at one moment ([`RouterCounters::snapshot`]).
    #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
    pub struct RouterCountersSnapshot pub live RouterCounters(SharedCounter) {
        /// ARP requests answered.
        arp_replies,
        /// ARP requests sent to resolve next hops.
        arp_requests,
        /// ICMP echo requests answered.
        echo_replies,
        /// ICMP errors sent.
        icmp_errors,
        /// ICMP errors not sent because of the rate limit.
        icmp_rate_limited,
        /// Packets released from ARP queues and sent.
        released,
        /// Packets dropped after waiting for a next hop that never answered.
        neigh_failed,
        /// Neighbor Solicitations sent to resolve or probe IPv6 next hops.
        ndp_solicits,
        /// Neighbor Advertisements sent for the router's IPv6 addresses.
        ndp_adverts,
        /// Router Advertisements sent.
        ra_sent,
    }
}

/// A token bucket per ICMP destination (Linux's `icmp_ratelimit`: one per second, burst 6) and
/// a global one (`icmp_msgs_per_sec` 1000, `icmp_msgs_burst` 50). ICMP errors are a slow
/// path, so a small mutex-protected table is enough; it holds at most 1024 destinations and
/// forgets the least recently limited one when full.
#[derive(Debug)]
pub(crate) struct IcmpLimiter {
    inner: Mutex<LimiterState>,
}

#[derive(Debug)]
struct LimiterState {
    global: (f64, Instant),
    peers: hashbrown::HashMap<std::net::IpAddr, (f64, Instant)>,
}

const PEER_RATE: f64 = 1.0;
const PEER_BURST: f64 = 6.0;
const GLOBAL_RATE: f64 = 1000.0;
const GLOBAL_BURST: f64 = 50.0;
const MAX_PEERS: usize = 1024;

impl IcmpLimiter {
    fn new() -> Self {
        IcmpLimiter {
            inner: Mutex::new(LimiterState {
                global: (GLOBAL_BURST, Instant::ZERO),
                peers: hashbrown::HashMap::new(),
            }),
        }
    }

    pub(crate) fn allow(&self, dst: std::net::IpAddr, now: Instant) -> bool {
        fn refill(b: &mut (f64, Instant), now: Instant, rate: f64, burst: f64) {
            let dt = now.saturating_since(b.1).as_secs_f64();
            b.0 = (b.0 + dt * rate).min(burst);
            b.1 = now;
        }
        let mut s = self.inner.lock();
        refill(&mut s.global, now, GLOBAL_RATE, GLOBAL_BURST);
        if s.global.0 < 1.0 {
            return false;
        }
        if s.peers.len() >= MAX_PEERS && !s.peers.contains_key(&dst) {
            let oldest = s.peers.iter().min_by_key(|(_, v)| v.1).map(|(k, _)| *k);
            if let Some(k) = oldest {
                s.peers.remove(&k);
            }
        }
        let p = s.peers.entry(dst).or_insert((PEER_BURST, now));
        refill(p, now, PEER_RATE, PEER_BURST);
        if p.0 < 1.0 {
            return false;
        }
        p.0 -= 1.0;
        s.global.0 -= 1.0;
        true
    }
}

/// The router (see the module docs). Shared by all workers through the datapath.
#[derive(Debug)]
pub struct Router {
    pub(crate) ifaces: Vec<Iface>,
    pub(crate) routes: RouteTable,
    pub(crate) routes6: RouteTable<Ipv6Addr>,
    pub(crate) neigh: NeighTable,
    pub(crate) neigh6: NeighTable<Ipv6Addr>,
    pub(crate) icmp: IcmpLimiter,
    pub(crate) ra: Mutex<Vec<ipv6::RaState>>,
    /// A bit set ([`filter_bit`]) for each IPv6 address of an interface:
    /// [`Router::ipv6_iface`] rejects most forwarded destinations with one test.
    ipv6_filter: u64,
    /// The host port, if the node has one ([`Router::host_port`]).
    pub(crate) host: Option<HostPort>,
    /// Event counters.
    pub counters: RouterCounters,
    /// TCP ports of its own addresses served by the local stack, and the queue to it
    /// ([`crate::l3::local`]).
    pub(crate) local: std::sync::Arc<crate::l3::local::LocalInbox>,
}

/// The host port: a router interface (without a bridge) whose other side is the host's own
/// IP stack (the kernel of tapyard's namespace), and the host's addresses behind it, at most
/// one per family. A host address may also be one of the router's own addresses (the node's
/// InternalIP, held by the uplink as well): packets to it that the PREROUTING hook leaves
/// addressed to it are forwarded to the host (routed by the host route `addr/32` or
/// `addr/128` through the interface) instead of being answered by the router, as Linux
/// delivers what kube-proxy's rules do not translate to its own sockets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct HostPort {
    /// The interface.
    pub(crate) iface: IfaceId,
    /// The host's addresses behind it.
    pub(crate) addrs: [Option<IpAddr>; 2],
}

/// The bit of `a` in [`Router`]'s filter of its IPv6 addresses: 6 bits of a multiplicative
/// hash of both halves (addresses alike in their low bits, `fd00::1` and `fd00:96::1`, fall
/// apart).
#[inline(always)]
fn filter_bit(a: Ipv6Addr) -> u64 {
    let x = u128::from_ne_bytes(a.octets());
    let f = low64(x) ^ low64(x >> 64);
    1 << (f.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 58)
}

/// An empty IPv6 table, for batches of a router built without one (tests).
static EMPTY_IPV6: std::sync::LazyLock<RouteTable<Ipv6Addr>> =
    std::sync::LazyLock::new(RouteTable::<Ipv6Addr>::new);

/// Destinations a batch's memo remembers: a batch's packets usually go to a few next hops
/// (a Service's endpoints, a handful of pods), and four cover those with one route and one
/// neighbour lookup each (benches/nat.rs, four endpoints: 15 % fewer instructions per frame
/// than a memo of one).
const MEMO_WAYS: usize = 4;

/// The older decisions of a batch's memo (the most recent one is the memo itself, checked
/// inline): a hit here is swapped with the memo, and a new decision pushes the memo's into
/// the oldest slot.
#[derive(Clone, Copy)]
pub(crate) struct Older<K, V> {
    slots: [Option<(K, V)>; MEMO_WAYS - 1],
    /// The slot the next push replaces.
    next: u8,
}

impl<K: Copy + PartialEq, V: Copy> Older<K, V> {
    const EMPTY: Self = Older {
        slots: [None; MEMO_WAYS - 1],
        next: 0,
    };

    /// The decision remembered for `k`, which becomes `last` (whose decision takes its slot).
    #[cold]
    #[inline(never)]
    pub(crate) fn take(&mut self, k: K, last: &mut Option<(K, V)>) -> Option<(K, V)> {
        let i = self
            .slots
            .iter()
            .position(|e| e.is_some_and(|(key, _)| key == k))?;
        std::mem::swap(&mut self.slots[i], last);
        *last
    }

    /// Keeps `old`, the decision a new one replaces as the memo.
    #[inline]
    pub(crate) fn push(&mut self, old: Option<(K, V)>) {
        if old.is_some() {
            let i = usize::from(self.next) % (MEMO_WAYS - 1);
            self.slots[i] = old;
            self.next = u8::try_from((i + 1) % (MEMO_WAYS - 1)).unwrap_or(0);
        }
    }
}

/// One batch's view of the routing state: a routing-table version, plus a memo of the last
/// few forwarding decisions so that the packets of a batch to one destination (a flow, or a
/// Service endpoint) do the route and neighbour lookups once. The memo lives for one batch
/// only, as long as the table version it was made from, so it is never staler than that
/// version.
pub(crate) struct L3Batch<'a> {
    /// The batch's IPv4 routing-table version (read at its start: most batches route IPv4).
    pub(crate) routes: RouteReader<'a>,
    /// The IPv6 table, read (one version per batch) at the batch's first IPv6 packet.
    ipv6_table: Option<&'a RouteTable<Ipv6Addr>>,
    ipv6_routes: Option<RouteReader<'a, Ipv6Addr>>,
    /// The IPv4 memo.
    pub(crate) memo4: Memo<Ipv4Addr>,
    /// The IPv6 memo.
    pub(crate) memo6: Memo<Ipv6Addr>,
    /// The worker's reassembly, for fragments to the router's own addresses, with the
    /// worker's counters: given when nothing puts fragments together in front of the router
    /// (a datapath without NAT), as Linux reassembles local input without conntrack.
    pub(crate) frags: Option<(&'a mut Frags, &'a Shard)>,
}

/// A forwarding decision: (egress interface, next hop address, next hop MAC).
pub(crate) type Decision<A> = (IfaceId, A, MacAddr);

/// One family's memo of a batch: the most recent decision (destination, decision), checked
/// inline, and the older ones; and the last source address found not to be martian (see
/// [`Router::martian_source`]), so that a batch's packets from one source (one pod's) pay
/// one compare.
pub(crate) struct Memo<A: RouterFamily> {
    pub(crate) last: Option<(A, Decision<A>)>,
    pub(crate) older: Older<A, Decision<A>>,
    /// The last source that passed the martian check; at first
    /// [`RouterFamily::NO_SOURCE`], which no source has.
    pub(crate) source_ok: A::SourceKey,
}

impl<A: RouterFamily> Memo<A> {
    const EMPTY: Self = Memo {
        last: None,
        older: Older::EMPTY,
        source_ok: A::NO_SOURCE,
    };
}

impl<'a> L3Batch<'a> {
    pub(crate) fn new(routes: RouteReader<'a>) -> L3Batch<'a> {
        L3Batch {
            routes,
            ipv6_table: None,
            ipv6_routes: None,
            memo4: Memo::EMPTY,
            memo6: Memo::EMPTY,
            frags: None,
        }
    }

    /// With the worker's reassembly for the router's own addresses (see [`L3Batch::frags`]).
    pub(crate) fn with_frags(mut self, frags: Option<&'a mut Frags>, shard: &'a Shard) -> Self {
        self.frags = frags.map(|f| (f, shard));
        self
    }

    /// With the IPv6 table, read (one version per batch) at the batch's first IPv6 packet.
    pub(crate) fn with_ipv6(mut self, t: &'a RouteTable<Ipv6Addr>) -> L3Batch<'a> {
        self.ipv6_table = Some(t);
        self
    }

    /// The batch's routing-table version of family `A`.
    #[inline]
    pub(crate) fn routes<A: RouterFamily>(&mut self) -> &RouteReader<'a, A> {
        A::routes(self)
    }

    /// The batch's IPv6 routing-table version: read once per batch, out of line, so that the
    /// per-packet check stays inlined (callgrind: `get_or_insert_with` left out of line cost
    /// 17 instructions per IPv6 NAT frame).
    #[inline(always)]
    pub(crate) fn ipv6_routes(&mut self) -> &RouteReader<'a, Ipv6Addr> {
        match self.ipv6_routes {
            Some(ref r) => r,
            None => self.read_ipv6_routes(),
        }
    }

    /// Reads the batch's IPv6 routing-table version (see [`L3Batch::ipv6_routes`]).
    #[cold]
    #[inline(never)]
    fn read_ipv6_routes(&mut self) -> &RouteReader<'a, Ipv6Addr> {
        let r = self
            .ipv6_table
            .map_or_else(|| EMPTY_IPV6.reader(), |t| t.reader());
        self.ipv6_routes.insert(r)
    }
}

/// NAT for the ICMP errors the router makes itself, as netfilter's LOCAL_OUT and POSTROUTING
/// hooks see them: Linux attaches the offending packet's connection to the error it builds
/// (`nf_ct_attach` in `icmp_send`), so NAT translates the error back as any RELATED packet.
/// The offending packet was translated before the router judged it (at PREROUTING), so
/// without this an error about a masqueraded packet would be addressed to the node itself,
/// and one about a DNAT'd packet would quote the endpoint instead of the Service address.
///
/// Generic over the family `A`: the router holds a `&dyn ErrorNat<A>` for the family of the
/// packet it answers.
pub(crate) trait ErrorNat<A: RouterFamily> {
    /// Translates the ICMP error datagram `ip` (header checked, facts in `info`) through the
    /// connection of the packet it quotes, when that connection is NAT'd: the destination
    /// becomes the original sender and the quoted header what that sender sent. `false`:
    /// the error cannot be translated and must not be sent.
    fn translate_error(&self, ip: &mut [u8], info: &mut A::Info, now: Instant) -> bool;
}

/// What a hook decided about a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Hook {
    /// Go on (the packet may have been translated; the header facts were updated).
    Accept,
    /// Drop, counted under the reason.
    Drop(DropReason),
    /// Refuse the connection: answer with a TCP RST (`tcp`) or ICMP port unreachable, and drop.
    Reject {
        /// Answer with a TCP reset rather than an ICMP error.
        tcp: bool,
    },
    /// A fragment, which the hook needs put together with the rest of its datagram first
    /// (conntrack sees whole datagrams, as behind Linux's `nf_defrag_ipv4`/`ipv6`).
    Fragment,
}

/// The hook the router calls between its header checks and its routing decision, as the IP
/// stack calls netfilter's PREROUTING: conntrack and NAT plug in here without the router
/// knowing them. One per family `A` ([`Ipv4Addr`], [`Ipv6Addr`]).
pub(crate) trait Prerouting<A: RouterFamily> {
    /// Looks at (and may translate) the packet at offset `l3` of `b` (`info` checked, updated
    /// when translated). The batch's routes of the family are read from `batch` only when
    /// the hook needs them: without a hook, nothing is loaded.
    fn prerouting(
        &mut self,
        router: &Router,
        batch: &mut L3Batch<'_>,
        b: &mut PacketBuf,
        l3: usize,
        info: &mut A::Info,
        now: Instant,
    ) -> Hook;

    /// The NAT that ICMP errors about packets this hook translated must go through.
    fn error_nat(&self) -> Option<&dyn ErrorNat<A>>;

    /// Cuts `whole`, a datagram the hook put together from fragments (and translated), back
    /// into the fragments it came in, handing each frame to `out`: how many.
    fn refragment(&mut self, whole: &[u8], out: &mut dyn FnMut(&[u8])) -> usize;

    /// The largest fragment the datagram the hook last put together came in (bytes of IP
    /// packet: Linux's `frag_max_size`).
    fn max_frag_size(&self) -> usize;
}

/// An optional hook: none accepts every packet.
impl<A: RouterFamily, H: Prerouting<A>> Prerouting<A> for Option<H> {
    #[inline(always)]
    fn prerouting(
        &mut self,
        router: &Router,
        batch: &mut L3Batch<'_>,
        b: &mut PacketBuf,
        l3: usize,
        info: &mut A::Info,
        now: Instant,
    ) -> Hook {
        match self {
            Some(h) => h.prerouting(router, batch, b, l3, info, now),
            None => Hook::Accept,
        }
    }

    fn error_nat(&self) -> Option<&dyn ErrorNat<A>> {
        self.as_ref().and_then(|h| h.error_nat())
    }

    fn refragment(&mut self, whole: &[u8], out: &mut dyn FnMut(&[u8])) -> usize {
        self.as_mut().map_or(0, |h| h.refragment(whole, out))
    }

    fn max_frag_size(&self) -> usize {
        self.as_ref().map_or(0, |h| h.max_frag_size())
    }
}

impl Router {
    pub(crate) fn new(ifaces: Vec<Iface>, neigh: NeighTable) -> Router {
        let neigh6 = NeighTable::new(neigh.config().clone());
        let ra = Mutex::new(vec![Default::default(); ifaces.len()]);
        let ipv6_filter = ifaces
            .iter()
            .flat_map(|i| [Some(i.ll6), i.cfg.addr6.map(|(a, _)| a)])
            .flatten()
            .fold(0, |f, a| f | filter_bit(a));
        Router {
            ipv6_filter,
            host: None,
            neigh6,
            ra,
            ifaces,
            routes: RouteTable::new(),
            routes6: RouteTable::<Ipv6Addr>::new(),
            neigh,
            icmp: IcmpLimiter::new(),
            counters: RouterCounters::default(),
            local: Default::default(),
        }
    }

    /// The neighbour table of family `A` ([`Ipv4Addr`]: ARP, [`Ipv6Addr`]: NDP).
    pub fn neigh<A: RouteAddr>(&self) -> &NeighTable<A> {
        A::neigh(self)
    }

    /// The routing table of family `A` ([`Ipv4Addr`], [`Ipv6Addr`]).
    pub fn routes<A: RouteAddr>(&self) -> &RouteTable<A> {
        A::table(self)
    }

    /// The interface that owns `addr` (IPv6: as its global or link-local address), if it is
    /// one of the router's addresses.
    #[inline]
    pub fn local_iface<A: RouteAddr>(&self, addr: A) -> Option<IfaceId> {
        A::local_iface(self, addr)
    }

    /// The host port's interface and the host's addresses behind it (at most one per family),
    /// if the datapath has one
    /// ([`DatapathBuilder::host_port`](crate::DatapathBuilder::host_port)). Packets that come
    /// in on that interface from one of those addresses are the host's own: the router's own
    /// address as a source is legitimate there.
    pub fn host_port(&self) -> Option<(IfaceId, impl Iterator<Item = IpAddr> + '_)> {
        self.host
            .as_ref()
            .map(|h| (h.iface, h.addrs.iter().flatten().copied()))
    }

    /// Whether `addr` is one of the host's addresses behind the host port: a packet to it
    /// that the PREROUTING hook left addressed to it goes to the host, even when it is also
    /// one of the router's own addresses. Out of line: asked only about the router's own
    /// addresses.
    #[cold]
    #[inline(never)]
    pub fn is_host_addr(&self, addr: IpAddr) -> bool {
        self.host
            .as_ref()
            .is_some_and(|h| h.addrs.contains(&Some(addr)))
    }

    /// The address of family `A` and prefix length of interface `i` (IPv6: its global one), if
    /// it has one.
    pub fn iface_addr<A: RouteAddr>(&self, i: IfaceId) -> Option<(A, u8)> {
        self.iface(i).and_then(|i| A::iface_cidr(&i.cfg))
    }

    /// The id of the first interface for which `f` holds.
    #[inline]
    pub(crate) fn find_iface(&self, f: impl Fn(&Iface) -> bool) -> Option<IfaceId> {
        self.ifaces
            .iter()
            .position(f)
            .and_then(|i| u16::try_from(i).ok())
            .map(IfaceId)
    }

    /// The interface whose IPv6 address (global or link-local) is `addr`: most forwarded
    /// destinations are told apart by the filter with one test.
    #[inline]
    pub(crate) fn ipv6_iface(&self, addr: Ipv6Addr) -> Option<IfaceId> {
        if self.ipv6_filter & filter_bit(addr) == 0 {
            return None;
        }
        self.find_iface(|i| i.has_ipv6(addr))
    }

    /// The link-local IPv6 address of interface `i` (`fe80::` + the EUI-64 of its MAC).
    pub fn link_local(&self, i: IfaceId) -> Option<Ipv6Addr> {
        self.iface(i).map(|i| i.ll6)
    }

    /// The interface with this id.
    pub(crate) fn iface(&self, i: IfaceId) -> Option<&Iface> {
        self.ifaces.get(usize::from(i.0))
    }

    /// The IPv4 source of what the router sends out of `i`: its address, else (an IPv6-only
    /// interface) the first interface's that has one, as Linux's `inet_select_addr`.
    pub(crate) fn src4(&self, i: &Iface) -> Option<Ipv4Addr> {
        i.cfg
            .addr4()
            .or_else(|| self.ifaces.iter().find_map(|o| o.cfg.addr4()))
    }

    /// Announces interface `i` on its link, so that its neighbours (pods, a next node) learn
    /// or correct its MAC at once: a gratuitous ARP request (sender and target its IPv4
    /// address, to the broadcast MAC, padded to 60 bytes) when it has an IPv4 address, then,
    /// when it has a global IPv6 address, an unsolicited Neighbor Advertisement (RFC 4861
    /// 7.2.6: to `ff02::1`, hop limit 255, router and override flags set, solicited clear,
    /// with the target link-layer address option) for that address and one for its
    /// link-local address. Each frame is handed to `emit` (nothing for an unknown `i`); they
    /// are written on the stack, nothing allocates. The caller sends them out of the
    /// interface's ports when it comes up (the `tapyard` command does at start and at a
    /// takeover).
    ///
    /// Where tapyard differs from Linux, on purpose: Linux sends these only with
    /// `arp_notify` = 1 (gratuitous ARP when the device comes up) and `ndisc_notify` = 1
    /// (unsolicited NAs when an address is added); both default to 0. A node whose router
    /// restarts or is taken over wants its pods to take its (stable) MAC at once, not when
    /// their stale entries time out, so tapyard announces both families. One of each is
    /// sent, as Linux (RFC 4861 allows up to three NAs).
    pub fn announce(&self, i: IfaceId, mut emit: impl FnMut(&[u8])) {
        let Some(iface) = self.iface(i) else { return };
        if let Some((addr, _)) = iface.cfg.addr {
            let garp = ArpRepr {
                operation: arp::REQUEST,
                sha: iface.cfg.mac,
                spa: addr,
                tha: MacAddr::ZERO,
                tpa: addr,
            };
            let mut frame = [0u8; 60];
            if garp
                .write_frame(iface.cfg.mac, MacAddr::BROADCAST, &mut frame)
                .is_some()
            {
                emit(&frame);
            }
        }
        let mut out = [0u8; 128];
        self.announce_ndp(i, &mut out, &mut emit);
    }

    /// Handles a frame sent to the router (its destination MAC is the interface's or a group
    /// address): ARP and IPv4. IPv6 goes to [`Router::ip_input`] directly (the datapath tells
    /// the families apart at its call sites, so that the IPv4 path's inlined code has no IPv6
    /// call site in it).
    #[inline(always)]
    pub(crate) fn input(
        &self,
        b: &mut PacketBuf,
        ether_type: u16,
        rx: Rx,
        ctx: &mut L3Batch<'_>,
        hook: &mut impl Prerouting<Ipv4Addr>,
        sink: &mut dyn Sink,
    ) -> L3 {
        match ether_type {
            ethertype::ARP => match self.arp_input(b.frame(), rx.l3, rx.in_if, rx.now, sink) {
                Ok(()) => L3::Local,
                Err(reason) => L3::Drop(reason),
            },
            ethertype::IPV4 => self.ip_input::<Ipv4Addr, false>(b, rx, ctx, hook, sink),
            _ => L3::Drop(DropReason::UnsupportedProtocol),
        }
    }

    /// Looks at a frame flooded on the bridge of `in_if` (the router gets a copy, as Linux's
    /// bridge device does): ARP requests and announcements are processed; nothing is forwarded.
    pub(crate) fn observe(
        &self,
        frame: &[u8],
        l3: usize,
        ether_type: u16,
        in_if: IfaceId,
        now: Instant,
        sink: &mut dyn Sink,
    ) {
        if ether_type == ethertype::ARP {
            // The frame is flooded whatever the router makes of it: nothing to count here.
            let _ = self.arp_input(frame, l3, in_if, now, sink);
        } else if ether_type == ethertype::IPV6 {
            self.observe_ndp(frame, l3, in_if, now, sink);
        }
    }

    /// Runs the neighbour timers due at `now`: ARP retransmissions, and ICMP host unreachable
    /// for packets whose next hop failed to resolve (translated back through `nat`: the
    /// packets waited after their translation).
    pub(crate) fn poll<N: ErrorNat<Ipv4Addr> + ErrorNat<Ipv6Addr>>(
        &self,
        now: Instant,
        nat: Option<&N>,
        sink: &mut dyn Sink,
    ) {
        self.poll_neigh::<Ipv6Addr>(now, nat.map(|n| n as _), sink);
        self.poll_ra(now, sink);
        self.poll_neigh::<Ipv4Addr>(now, nat.map(|n| n as _), sink);
    }

    /// Runs the neighbour timers of family `A` due at `now`: solicitations (ARP requests,
    /// Neighbor Solicitations) and probes, and the ICMP errors about packets whose next hop
    /// failed.
    fn poll_neigh<A: RouterFamily>(
        &self,
        now: Instant,
        nat: Option<&dyn ErrorNat<A>>,
        sink: &mut dyn Sink,
    ) {
        self.neigh::<A>().poll(now, &mut |ev| match ev {
            NeighEvent::Solicit { iface, ip, unicast } => {
                A::solicit(self, iface, ip, unicast, sink)
            }
            NeighEvent::Unreachable { frame, .. } => self.neigh_failed::<A>(&frame, nat, now, sink),
        });
    }
}

#[cfg(test)]
mod memo_tests {
    use super::*;

    #[test]
    fn older_decisions_are_found_swapped_in_and_the_oldest_is_replaced() {
        let mut last: Option<(u32, u32)> = None;
        let mut older = Older::<u32, u32>::EMPTY;
        // Five destinations, each decided once: the memo keeps the last four.
        for k in 1..=5 {
            let old = last.replace((k, k * 10));
            older.push(old);
        }
        assert_eq!(last, Some((5, 50)));
        assert_eq!(older.take(1, &mut last), None, "the oldest was replaced");
        for k in 2..=4 {
            assert_eq!(older.take(k, &mut last), Some((k, k * 10)));
            assert_eq!(last, Some((k, k * 10)), "a hit becomes the most recent");
        }
        // 5 went into the slot 4 left: still found.
        assert_eq!(older.take(5, &mut last), Some((5, 50)));
        assert_eq!(older.take(9, &mut last), None);
        assert_eq!(last, Some((5, 50)), "a miss changes nothing");
    }
}
