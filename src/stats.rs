//! Counters: per-port rx/tx and drops by reason, kept per worker and summed when read.
//!
//! Each worker owns a counter shard that only it writes (relaxed load + store, no read-modify-write
//! and no shared cache line with other workers); a [`StatsSnapshot`] sums all shards. Every frame
//! received is either handed to at least one output or counted under exactly one
//! [`DropReason`] — or, with a router, consumed locally (answered) or queued for ARP — so
//! [`StatsSnapshot::accounted`] equals the frames received.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Declares [`DropReason`] once: each variant with its doc and its short name; the enum,
/// [`DropReason::COUNT`], [`DropReason::ALL`] and [`DropReason::name`] come from it.
macro_rules! drop_reasons {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $( $(#[doc = $doc:literal])+ $v:ident = $short:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u8)]
        pub enum $name {
            $( $(#[doc = $doc])+ $v, )+
        }

        impl $name {
            /// Number of reasons.
            pub const COUNT: usize = [$($name::$v),+].len();

            /// Every reason, in discriminant order.
            pub const ALL: [$name; $name::COUNT] = [$($name::$v),+];

            /// A short snake_case name, for output and metrics.
            pub fn name(self) -> &'static str {
                match self {
                    $( $name::$v => $short, )+
                }
            }
        }

        /// Serialized as its [`name`](Self::name).
        #[cfg(feature = "serde")]
        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.name())
            }
        }
    };
}

/// Declares a set of event counters once: each counter's name is its field and its doc is
/// its help text (`extra { .. }` fields, like a port's name, are carried along but are not
/// counters). Generates the snapshot struct (plain `u64` fields, documented), its
/// [`CounterSet`] listing (name, help, value, in declaration order, for `show stats`, metrics
/// and reports), and the struct of live counters of the given cell type
/// ([`Counter`] for a single writer, [`SharedCounter`] for many) with `snapshot` and `add_to`.
macro_rules! counter_set {
    // A snapshot struct only: the table fills it from counters kept its own way.
    (
        $(#[$meta:meta])*
        pub struct $snap:ident {
            $(extra { $( $(#[doc = $xdoc:literal])+ pub $xf:ident: $xt:ty, )* })?
            $( $(#[doc = $doc:literal])+ $f:ident, )+
        }
    ) => {
        $(#[$meta])*
        #[cfg_attr(feature = "serde", derive(serde::Serialize))]
        pub struct $snap {
            $($( $(#[doc = $xdoc])+ pub $xf: $xt, )*)?
            $( $(#[doc = $doc])+ pub $f: u64, )+
        }

        impl $crate::stats::CounterSet for $snap {
            const NAMES: &'static [(&'static str, &'static str)] =
                &[$( (stringify!($f), concat!($($doc),+)) ),+];

            fn values(&self) -> impl Iterator<Item = u64> {
                [$(self.$f),+].into_iter()
            }
        }
    };
    // The snapshot and its live counters.
    (
        $(#[$meta:meta])*
        pub struct $snap:ident $lvis:vis live $live:ident($cell:ty) {
            $(extra { $( $(#[doc = $xdoc:literal])+ pub $xf:ident: $xt:ty, )* })?
            $( $(#[doc = $doc:literal])+ $f:ident, )+
        }
    ) => {
        $crate::stats::counter_set! {
            $(#[$meta])*
            pub struct $snap {
                $(extra { $( $(#[doc = $xdoc])+ pub $xf: $xt, )* })?
                $( $(#[doc = $doc])+ $f, )+
            }
        }

        #[doc = concat!("The live counters of a [`", stringify!($snap), "`].")]
        #[derive(Debug, Default)]
        $lvis struct $live {
            $( $(#[doc = $doc])+ pub(crate) $f: $cell, )+
        }

        impl $live {
            /// The values now.
            #[allow(dead_code)]
            $lvis fn snapshot(&self) -> $snap {
                let mut s = $snap::default();
                self.add_to(&mut s);
                s
            }

            /// Sets every counter to 0 (only when no thread writes them).
            #[allow(dead_code)]
            $lvis fn reset(&self) {
                $( self.$f.reset(); )+
            }

            /// Adds the values now to `s` (summing shards).
            #[allow(dead_code)]
            $lvis fn add_to(&self, s: &mut $snap) {
                $( s.$f += self.$f.get(); )+
            }
        }
    };
}

pub(crate) use counter_set;

/// A set of counters declared with `counter_set!`: every counter's name and help, and the
/// values in the same order.
pub trait CounterSet {
    /// Every counter's name (its field) and help (its doc), in declaration order.
    const NAMES: &'static [(&'static str, &'static str)];

    /// The values, in the order of [`CounterSet::NAMES`].
    fn values(&self) -> impl Iterator<Item = u64>;

    /// Every counter as (name, help, value), in declaration order.
    fn counters(&self) -> impl Iterator<Item = (&'static str, &'static str, u64)> {
        Self::NAMES
            .iter()
            .zip(self.values())
            .map(|(&(name, help), v)| (name, help.trim(), v))
    }

    /// The counters on one line, `name value` two spaces apart (`learned 4  moved 0`).
    fn line(&self) -> String {
        let mut s = String::new();
        for (name, _, v) in self.counters() {
            if !s.is_empty() {
                s.push_str("  ");
            }
            s.push_str(name);
            s.push(' ');
            s.push_str(&v.to_string());
        }
        s
    }
}

drop_reasons! {
    /// Why a frame was not forwarded. The discriminant indexes the drop counters; each
    /// reason's short name (for output and metrics) stands beside it.
    pub enum DropReason {
        /// Shorter than an Ethernet header (or than a VLAN tag it announces).
        Truncated = "truncated",
        /// Source MAC is a group (multicast or broadcast) address.
        MulticastSource = "multicast_source",
        /// Source MAC is `00:00:00:00:00:00`.
        ZeroSource = "zero_source",
        /// Received on a port that belongs to no bridge.
        NoBridge = "no_bridge",
        /// The destination was learned on the port the frame came in on (Linux drops these too).
        SamePort = "same_port",
        /// Destination is an IEEE 802.1D reserved group (`01:80:c2:00:00:01`..`0f`) that bridges
        /// do not forward.
        LinkLocal = "link_local",
        /// The frame was flooded, but the bridge has no other port.
        NoOtherPort = "no_other_port",
        /// The frame was larger than the port's receive buffer and was cut.
        Oversize = "oversize",
        /// Received on a port id the datapath does not know, or on a router interface's virtual
        /// port (which has no driver).
        UnknownPort = "unknown_port",
        /// Offload metadata (virtio-net header) that cannot be honoured: bad checksum offsets,
        /// an unsupported GSO type, or a super-frame that does not parse.
        BadOffload = "bad_offload",
        /// The output port refused the frame with an I/O error (other than the two below).
        TxError = "tx_error",
        /// The output port's queue was full.
        TxQueueFull = "tx_queue_full",
        /// The output TAP's interface is not up (`EIO`: not yet, at start, until the pod's
        /// side sets it up; or set down since). Not an error: Linux does not send to a bridge
        /// port whose link is down either, and a normal start counts a few of these (frames
        /// flooded before the pods' links come up: router solicitations, MLD, ARP).
        TxLinkDown = "tx_link_down",
        /// The output port was removed ([`Control::remove_port`](crate::Control::remove_port))
        /// after the frame was forwarded or flooded to it, before it was sent; counted at
        /// transmit time.
        PortGone = "port_gone",
        /// An IPv4 header that is malformed (version, IHL, lengths) — dropped as Linux's `ip_rcv`.
        BadIpHeader = "bad_ip_header",
        /// An IPv4 header checksum that does not verify.
        BadIpChecksum = "bad_ip_checksum",
        /// An ARP packet to the router that is malformed or not for Ethernet/IPv4, or that it
        /// refuses: an operation other than request or reply, a sender MAC that is not the
        /// frame's source or not a station address, a sender claiming the router's address.
        BadArp = "bad_arp",
        /// TTL would reach 0: not forwarded (an ICMP time exceeded is sent).
        TtlExpired = "ttl_expired",
        /// No route to the destination (an ICMP net unreachable is sent).
        NoRoute = "no_route",
        /// A blackhole route matched: dropped silently.
        Blackhole = "blackhole",
        /// An unreachable route matched (an ICMP host unreachable is sent, as Linux does).
        Unreachable = "unreachable",
        /// Larger than the egress MTU with DF set (an ICMP fragmentation needed is sent), or
        /// impossible to fragment.
        FragNeeded = "frag_needed",
        /// The next hop did not answer ARP (an ICMP host unreachable is sent).
        NeighFailed = "neigh_failed",
        /// The packet waited for ARP resolution and was pushed out of the full queue (oldest first).
        NeighQueueOverflow = "neigh_queue_overflow",
        /// The neighbour table was full and nothing could be collected.
        NeighTableFull = "neigh_table_full",
        /// A frame on a routed port not addressed to the router's MAC (nor broadcast/multicast).
        NotForRouter = "not_for_router",
        /// Addressed to one of the router's own addresses, but nothing there serves it (only ICMP
        /// echo is answered; others get an ICMP port/protocol unreachable where Linux would).
        LocalNoService = "local_no_service",
        /// An IP or ARP frame sent to an L2 group address that the router does not route.
        L3Multicast = "l3_multicast",
        /// A protocol the router does not handle (e.g. IPv6 on a routed-only port).
        UnsupportedProtocol = "unsupported_protocol",
        /// Conntrack classed the packet INVALID (e.g. a first TCP packet without SYN, an
        /// impossible state transition, an ICMP error about no known connection).
        CtInvalid = "ct_invalid",
        /// A new connection found the conntrack table full with nothing it could evict.
        CtFull = "ct_full",
        /// A new connection to a Service that has no (eligible) endpoint: rejected with a TCP
        /// RST or ICMP port unreachable, as kube-proxy's REJECT rule.
        NoEndpoint = "no_endpoint",
        /// SNAT/MASQUERADE found no free source port (or ICMP identifier) in its range.
        NatExhausted = "nat_exhausted",
        /// A packet of a NAT'd connection that cannot be translated (a non-first fragment, a
        /// truncated header).
        NatUntranslatable = "nat_untranslatable",
        /// A UDP datagram to a VXLAN interface's port on its uplink address too short for
        /// VXLAN and an inner Ethernet header, or whose UDP length disagrees with the IP one.
        VxlanShort = "vxlan_short",
        /// A VXLAN header with flags other than I, or reserved bits set.
        VxlanBadFlags = "vxlan_bad_flags",
        /// A VXLAN header with another VNI than the interface's.
        VxlanBadVni = "vxlan_bad_vni",
        /// A VXLAN datagram whose outer UDP checksum is neither zero nor right.
        VxlanBadChecksum = "vxlan_bad_checksum",
        /// A VXLAN datagram over IPv6 with a zero outer UDP checksum (refused as Linux's
        /// vxlan does by default, `udp6zerocsumrx` off; RFC 8200 8.1).
        VxlanZeroChecksum = "vxlan_zero_checksum",
        /// A decapsulated frame not addressed to the VXLAN interface's MAC (the VTEP).
        VxlanUnknownMac = "vxlan_unknown_mac",
        /// A VXLAN datagram from an outer source that is not a configured peer (stricter than
        /// Linux, which accepts any source).
        VxlanUnknownPeer = "vxlan_unknown_peer",
        /// A frame routed into a VXLAN interface whose destination MAC is no peer's VTEP MAC
        /// (no FDB entry: Linux drops it too, with `nolearning` and no default destination).
        VxlanNoPeer = "vxlan_no_peer",
        /// An IPv6 packet that fails Linux's `ipv6_rcv` checks (version, payload length, a
        /// jumbogram, a multicast source, a `::1` destination) or whose extension-header chain
        /// is truncated, misordered, or longer than 8 headers or 2048 bytes.
        BadIpv6Header = "bad_ipv6_header",
        /// An ICMPv6 message to the router whose checksum does not verify.
        BadIcmpv6Checksum = "bad_icmpv6_checksum",
        /// An NDP message to the router that RFC 4861 says to discard: hop limit not 255,
        /// nonzero code, bad option lengths, a multicast target, a DAD probe with a link-layer
        /// option, a solicited advertisement to a multicast group.
        BadNdp = "bad_ndp",
        /// An IPv6 packet with a link-local source or destination that would have to be
        /// forwarded (link-local addresses never leave their link).
        Ipv6LinkLocal = "ipv6_link_local",
        /// An IPv6 packet larger than the egress MTU (routers never fragment IPv6; an ICMPv6
        /// packet too big is sent).
        PacketTooBig = "packet_too_big",
        /// An IPv4 packet to one of the router's addresses that arrived on an interface
        /// without an IPv4 address (an IPv6-only interface; see `l3::IfaceConfig::addr`).
        NoIpv4Addr = "no_ipv4_addr",
        /// A fragment whose IP or fragment header is cut short or lies about its lengths.
        FragMalformed = "frag_malformed",
        /// A fragment other than the last below the minimum size (1200 bytes of IPv4, 1280
        /// of IPv6) or whose data is not a multiple of 8 bytes.
        FragTooSmall = "frag_too_small",
        /// A fragment ending past 65,535 bytes of IP packet or past its datagram's end.
        FragOversize = "frag_oversize",
        /// A fragment overlapping another of its datagram (the whole datagram is discarded).
        FragOverlap = "frag_overlap",
        /// A fragment repeating one already held (dropped; its datagram is kept).
        FragDuplicate = "frag_duplicate",
        /// A fragment beyond the most one datagram may come in (the datagram is discarded).
        FragTooMany = "frag_too_many",
        /// A fragment refused because the worker's reassembly table holds its most fragments
        /// or bytes.
        FragTableFull = "frag_table_full",
        /// Fragments freed because their datagram was not complete in time (15 s).
        FragTimeout = "frag_timeout",
        /// A routed packet with a martian source (Linux's `martian_source`): loopback,
        /// unspecified, multicast, broadcast or reserved (IPv4 240/4), IPv4-mapped (IPv6), a
        /// directed broadcast of one of the router's subnets, or one of the router's own
        /// addresses.
        MartianSource = "martian_source",
        /// A new connection refused: its source (a pod) holds its limit of connection-table
        /// entries already (`conntrack::CtConfig::max_per_source`).
        CtLimit = "ct_limit",
        /// A guarded port's frame with another source MAC than the port's, or an ARP or NDP
        /// sender or link-layer address that is not its MAC (the port's spoof guard).
        SpoofedMac = "spoofed_mac",
        /// A guarded port's IPv4 or IPv6 packet from a source address that is not the port's
        /// (DHCP from 0.0.0.0, DAD and MLD from `::` and link-local sources excepted).
        SpoofedIp = "spoofed_ip",
        /// A guarded port's ARP packet claiming an address that is not the port's.
        SpoofedArp = "spoofed_arp",
        /// A guarded port's neighbour advertisement, or duplicate address detection probe,
        /// for an address that is not the port's.
        SpoofedNd = "spoofed_nd",
        /// A guarded port's router advertisement or ICMPv6 redirect (RA guard, RFC 6105: a
        /// pod is a host).
        RaGuard = "ra_guard",
        /// A guarded port's DHCP server message (UDP 67 → 68, DHCPv6 547 → 546).
        DhcpGuard = "dhcp_guard",
        /// A new connection to a Service's LoadBalancer IP from a source outside its
        /// `loadBalancerSourceRanges` of the family (kube-proxy's `KUBE-FW-*` /
        /// `KUBE-PROXY-FIREWALL` drop).
        LbSourceRange = "lb_source_range",
        /// A TCP segment to a port of the router's own addresses that the local stack serves
        /// (a health check), dropped because the stack's queue was full (`l3::local`).
        LocalStackFull = "local_stack_full",
    }
}

impl DropReason {
    /// True for the spoof guard's reasons (`spoofed_*`), also counted per port.
    #[inline]
    pub fn is_spoofed(self) -> bool {
        matches!(
            self,
            DropReason::SpoofedMac
                | DropReason::SpoofedIp
                | DropReason::SpoofedArp
                | DropReason::SpoofedNd
                | DropReason::RaGuard
                | DropReason::DhcpGuard
        )
    }

    /// True for reasons counted at transmit time (the frame had been forwarded by the datapath).
    pub fn is_tx(self) -> bool {
        matches!(
            self,
            DropReason::TxError
                | DropReason::TxQueueFull
                | DropReason::TxLinkDown
                | DropReason::PortGone
        )
    }
}

impl fmt::Display for DropReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A counter written by one thread only, read by any.
/// A counter with one writer (a worker's shard): a relaxed load + store, no locked
/// instruction.
#[derive(Default, Debug)]
pub(crate) struct Counter(AtomicU64);

impl Counter {
    #[inline]
    pub(crate) fn add(&self, n: u64) {
        // Single writer: a plain load + store is enough and avoids a locked instruction.
        self.0.store(self.0.load(Relaxed).wrapping_add(n), Relaxed);
    }
    #[inline]
    pub(crate) fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
    pub(crate) fn reset(&self) {
        self.0.store(0, Relaxed);
    }
}

/// A counter that several threads add to (a slow-path event: an ARP reply, a new
/// connection): one relaxed `fetch_add`.
#[derive(Default, Debug)]
pub(crate) struct SharedCounter(AtomicU64);

impl SharedCounter {
    #[inline]
    pub(crate) fn add(&self, n: u64) {
        self.0.fetch_add(n, Relaxed);
    }
    #[inline]
    pub(crate) fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
    #[allow(dead_code)]
    pub(crate) fn reset(&self) {
        self.0.store(0, Relaxed);
    }
}

/// Per-port counters in one shard.
/// One worker's counters.
#[derive(Debug)]
pub(crate) struct Shard {
    pub(crate) ports: Box<[PortCounters]>,
    pub(crate) drops: [Counter; DropReason::COUNT],
    pub(crate) totals: Totals,
}

impl Shard {
    pub(crate) fn new(ports: usize) -> Shard {
        Shard {
            ports: (0..ports).map(|_| PortCounters::default()).collect(),
            drops: std::array::from_fn(|_| Counter::default()),
            totals: Totals::default(),
        }
    }

    #[inline]
    pub(crate) fn count_drop(&self, r: DropReason) {
        self.drops[r as usize].add(1);
    }

    /// Counts `n` drops for reason `r`.
    pub(crate) fn count_drops(&self, r: DropReason, n: u64) {
        if n != 0 {
            self.drops[r as usize].add(n);
        }
    }
}

counter_set! {
    /// Counters of one port.
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct PortStats pub(crate) live PortCounters(Counter) {
        extra {
            /// The port's name.
            pub name: String,
        }
        /// Frames received.
        rx_packets,
        /// Bytes received (Ethernet header included, no FCS).
        rx_bytes,
        /// Frames transmitted.
        tx_packets,
        /// Bytes transmitted.
        tx_bytes,
        /// Frames the datapath sent to this port that the port refused.
        tx_dropped,
        /// Frames received that the port's spoof guard dropped (each also counted under its
        /// `spoofed_*` drop reason).
        spoofed,
    }
}

counter_set! {
    /// A point-in-time copy of a datapath's counters.
    #[derive(Clone, Debug, Default, PartialEq, Eq)]
    pub struct StatsSnapshot pub(crate) live Totals(Counter) {
        extra {
            /// One entry per live port, in port-id order (a removed port's counters leave with
            /// it, as a deleted Linux interface's do).
            pub ports: Vec<PortStats>,
            /// Frames dropped, per reason (every reason, zeros included).
            pub drops: Vec<(DropReason, u64)>,
        }
        /// Received frames the datapath sent to exactly one known port.
        forwarded,
        /// Received frames flooded to the other ports of their bridge.
        flooded,
        /// Received frames consumed by the router (answered or turned into other frames).
        local,
        /// Received frames the router queued while resolving their next hop.
        queued,
        /// Frames the router made (ARP, ICMP, fragments, released packets).
        generated,
        /// Datagrams put together from fragments before conntrack (their fragments are
        /// counted in `queued`, the fragments sent on in `generated`).
        reassembled,
        /// Frames the router could not make (no buffer, or too many in one batch).
        generated_lost,
        /// Drops counted after the frame's own verdict (`queued` frames that later failed to
        /// resolve or overflowed the queue); included in `drops`.
        deferred_drops,
    }
}

impl StatsSnapshot {
    /// Sums `shards` for the live ports `ports` (id, name), in id order.
    pub(crate) fn sum(
        ports: &[(usize, String)],
        shards: &[std::sync::Arc<Shard>],
    ) -> StatsSnapshot {
        let mut s = StatsSnapshot {
            ports: ports
                .iter()
                .map(|(_, n)| PortStats {
                    name: n.clone(),
                    ..Default::default()
                })
                .collect(),
            drops: DropReason::ALL.iter().map(|r| (*r, 0)).collect(),
            ..Default::default()
        };
        for sh in shards {
            for (p, (id, _)) in s.ports.iter_mut().zip(ports) {
                if let Some(c) = sh.ports.get(*id) {
                    c.add_to(p);
                }
            }
            for (d, c) in s.drops.iter_mut().zip(sh.drops.iter()) {
                d.1 += c.get();
            }
            sh.totals.add_to(&mut s);
        }
        s
    }

    /// The count for one drop reason.
    pub fn drop_count(&self, r: DropReason) -> u64 {
        self.drops.iter().find(|d| d.0 == r).map_or(0, |d| d.1)
    }

    /// Received frames accounted for: forwarded, flooded, local, queued or dropped before
    /// transmit. Equals the sum of `rx_packets` plus frames from unknown ports (while no
    /// port has been removed: a removed port's `rx_packets` leave the snapshot).
    pub fn accounted(&self) -> u64 {
        (self.forwarded + self.flooded + self.local + self.queued + self.rx_drops())
            .saturating_sub(self.deferred_drops)
    }

    /// Frames dropped before forwarding (transmit-time drops excluded).
    pub fn rx_drops(&self) -> u64 {
        self.drops
            .iter()
            .filter(|d| !d.0.is_tx())
            .map(|d| d.1)
            .sum()
    }

    /// The counters of the port called `name`.
    pub fn port(&self, name: &str) -> Option<&PortStats> {
        self.ports.iter().find(|p| p.name == name)
    }
}

impl fmt::Display for StatsSnapshot {
    /// A table of per-port counters followed by the non-zero drop reasons.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{:<16} {:>12} {:>14} {:>12} {:>14} {:>10}",
            "port", "rx_packets", "rx_bytes", "tx_packets", "tx_bytes", "tx_dropped"
        )?;
        for p in &self.ports {
            writeln!(
                f,
                "{:<16} {:>12} {:>14} {:>12} {:>14} {:>10}",
                p.name, p.rx_packets, p.rx_bytes, p.tx_packets, p.tx_bytes, p.tx_dropped
            )?;
        }
        // Every total from its declaration: forwarded and flooded always, the rest when not 0.
        let mut sep = "";
        for (name, _, v) in self.counters() {
            if v > 0 || matches!(name, "forwarded" | "flooded") {
                write!(f, "{sep}{name} {v}")?;
                sep = "  ";
            }
        }
        writeln!(f)?;
        let mut any = false;
        for (r, n) in &self.drops {
            if *n > 0 {
                if !any {
                    write!(f, "drops:")?;
                    any = true;
                }
                write!(f, " {r}={n}")?;
            }
        }
        if !any {
            write!(f, "drops: none")?;
        }
        writeln!(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_counter_set_lists_each_declared_counter_once_with_its_help() {
        let mut s = StatsSnapshot {
            forwarded: 3,
            deferred_drops: 1,
            ..Default::default()
        };
        s.flooded = 2;
        let all: Vec<_> = s.counters().collect();
        assert_eq!(all.len(), StatsSnapshot::NAMES.len());
        assert_eq!(
            all[..2],
            [
                (
                    "forwarded",
                    "Received frames the datapath sent to exactly one known port.",
                    3
                ),
                (
                    "flooded",
                    "Received frames flooded to the other ports of their bridge.",
                    2
                ),
            ]
        );
        assert!(all.iter().any(|c| c.0 == "deferred_drops" && c.2 == 1));
        assert_eq!(PortStats::NAMES.len(), 6, "the name is not a counter");
        assert!(s.line().starts_with("forwarded 3  flooded 2  local 0"));
        let names: std::collections::BTreeSet<_> =
            DropReason::ALL.iter().map(|r| r.name()).collect();
        assert_eq!(
            names.len(),
            DropReason::COUNT,
            "drop reason names are unique"
        );
    }

    #[test]
    fn reasons_are_indexed_in_order() {
        for (i, r) in DropReason::ALL.iter().enumerate() {
            assert_eq!(*r as usize, i);
        }
    }
}
