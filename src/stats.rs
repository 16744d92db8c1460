//! Counters: per-port rx/tx and drops by reason, kept per worker and summed when read.
//!
//! Each worker owns a counter shard that only it writes (relaxed load + store, no read-modify-write
//! and no shared cache line with other workers); a [`StatsSnapshot`] sums all shards. Every frame
//! received is either handed to at least one output or counted under exactly one
//! [`DropReason`] — or, with a router, consumed locally (answered) or queued for ARP — so
//! [`StatsSnapshot::accounted`] equals the frames received.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Why a frame was not forwarded. The discriminant indexes the drop counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum DropReason {
    /// Shorter than an Ethernet header (or than a VLAN tag it announces).
    Truncated = 0,
    /// Source MAC is a group (multicast or broadcast) address.
    MulticastSource,
    /// Source MAC is `00:00:00:00:00:00`.
    ZeroSource,
    /// Received on a port that belongs to no bridge.
    NoBridge,
    /// The destination was learned on the port the frame came in on (Linux drops these too).
    SamePort,
    /// Destination is an IEEE 802.1D reserved group (`01:80:c2:00:00:01`..`0f`) that bridges
    /// do not forward.
    LinkLocal,
    /// The frame was flooded, but the bridge has no other port.
    NoOtherPort,
    /// The frame was larger than the port's receive buffer and was cut.
    Oversize,
    /// Received on a port id the datapath does not know, or on a router interface's virtual
    /// port (which has no driver).
    UnknownPort,
    /// Offload metadata (virtio-net header) that cannot be honoured: bad checksum offsets,
    /// an unsupported GSO type, or a super-frame that does not parse.
    BadOffload,
    /// The output port refused the frame (an I/O error, or the interface is down).
    TxError,
    /// The output port's queue was full.
    TxQueueFull,
    /// An IPv4 header that is malformed (version, IHL, lengths) — dropped as Linux's `ip_rcv`.
    BadIpHeader,
    /// An IPv4 header checksum that does not verify.
    BadIpChecksum,
    /// A malformed ARP packet, or one not for Ethernet/IPv4.
    BadArp,
    /// TTL would reach 0: not forwarded (an ICMP time exceeded is sent).
    TtlExpired,
    /// No route to the destination (an ICMP net unreachable is sent).
    NoRoute,
    /// A blackhole route matched: dropped silently.
    Blackhole,
    /// An unreachable route matched (an ICMP host unreachable is sent, as Linux does).
    Unreachable,
    /// Larger than the egress MTU with DF set (an ICMP fragmentation needed is sent), or
    /// impossible to fragment.
    FragNeeded,
    /// The next hop did not answer ARP (an ICMP host unreachable is sent).
    NeighFailed,
    /// The packet waited for ARP resolution and was pushed out of the full queue (oldest first).
    NeighQueueOverflow,
    /// The neighbour table was full and nothing could be collected.
    NeighTableFull,
    /// A frame on a routed port not addressed to the router's MAC (nor broadcast/multicast).
    NotForRouter,
    /// Addressed to one of the router's own addresses, but nothing there serves it (only ICMP
    /// echo is answered; others get an ICMP port/protocol unreachable where Linux would).
    LocalNoService,
    /// An IP or ARP frame sent to an L2 group address that the router does not route.
    L3Multicast,
    /// A protocol the router does not handle (e.g. IPv6 on a routed-only port).
    UnsupportedProtocol,
    /// Conntrack classed the packet INVALID (e.g. a first TCP packet without SYN, an
    /// impossible state transition, an ICMP error about no known connection).
    CtInvalid,
    /// A new connection found the conntrack table full with nothing it could evict.
    CtFull,
    /// A new connection to a Service that has no (eligible) endpoint: rejected with a TCP
    /// RST or ICMP port unreachable, as kube-proxy's REJECT rule.
    NoEndpoint,
    /// SNAT/MASQUERADE found no free source port (or ICMP identifier) in its range.
    NatExhausted,
    /// A packet of a NAT'd connection that cannot be translated (a non-first fragment, a
    /// truncated header).
    NatUntranslatable,
}

impl DropReason {
    /// Number of reasons.
    pub const COUNT: usize = 32;

    /// Every reason, in discriminant order.
    pub const ALL: [DropReason; DropReason::COUNT] = [
        DropReason::Truncated,
        DropReason::MulticastSource,
        DropReason::ZeroSource,
        DropReason::NoBridge,
        DropReason::SamePort,
        DropReason::LinkLocal,
        DropReason::NoOtherPort,
        DropReason::Oversize,
        DropReason::UnknownPort,
        DropReason::BadOffload,
        DropReason::TxError,
        DropReason::TxQueueFull,
        DropReason::BadIpHeader,
        DropReason::BadIpChecksum,
        DropReason::BadArp,
        DropReason::TtlExpired,
        DropReason::NoRoute,
        DropReason::Blackhole,
        DropReason::Unreachable,
        DropReason::FragNeeded,
        DropReason::NeighFailed,
        DropReason::NeighQueueOverflow,
        DropReason::NeighTableFull,
        DropReason::NotForRouter,
        DropReason::LocalNoService,
        DropReason::L3Multicast,
        DropReason::UnsupportedProtocol,
        DropReason::CtInvalid,
        DropReason::CtFull,
        DropReason::NoEndpoint,
        DropReason::NatExhausted,
        DropReason::NatUntranslatable,
    ];

    /// A short snake_case name, for output and metrics.
    pub fn name(self) -> &'static str {
        match self {
            DropReason::Truncated => "truncated",
            DropReason::MulticastSource => "multicast_source",
            DropReason::ZeroSource => "zero_source",
            DropReason::NoBridge => "no_bridge",
            DropReason::SamePort => "same_port",
            DropReason::LinkLocal => "link_local",
            DropReason::NoOtherPort => "no_other_port",
            DropReason::Oversize => "oversize",
            DropReason::UnknownPort => "unknown_port",
            DropReason::BadOffload => "bad_offload",
            DropReason::TxError => "tx_error",
            DropReason::TxQueueFull => "tx_queue_full",
            DropReason::BadIpHeader => "bad_ip_header",
            DropReason::BadIpChecksum => "bad_ip_checksum",
            DropReason::BadArp => "bad_arp",
            DropReason::TtlExpired => "ttl_expired",
            DropReason::NoRoute => "no_route",
            DropReason::Blackhole => "blackhole",
            DropReason::Unreachable => "unreachable",
            DropReason::FragNeeded => "frag_needed",
            DropReason::NeighFailed => "neigh_failed",
            DropReason::NeighQueueOverflow => "neigh_queue_overflow",
            DropReason::NeighTableFull => "neigh_table_full",
            DropReason::NotForRouter => "not_for_router",
            DropReason::LocalNoService => "local_no_service",
            DropReason::L3Multicast => "l3_multicast",
            DropReason::CtInvalid => "ct_invalid",
            DropReason::CtFull => "ct_full",
            DropReason::NoEndpoint => "no_endpoint",
            DropReason::NatExhausted => "nat_exhausted",
            DropReason::NatUntranslatable => "nat_untranslatable",
            DropReason::UnsupportedProtocol => "unsupported_protocol",
        }
    }

    /// True for reasons counted at transmit time (the frame had been forwarded by the datapath).
    pub fn is_tx(self) -> bool {
        matches!(self, DropReason::TxError | DropReason::TxQueueFull)
    }
}

impl fmt::Display for DropReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A counter written by one thread only, read by any.
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
}

/// Per-port counters in one shard.
#[derive(Default, Debug)]
pub(crate) struct PortCounters {
    pub(crate) rx_packets: Counter,
    pub(crate) rx_bytes: Counter,
    pub(crate) tx_packets: Counter,
    pub(crate) tx_bytes: Counter,
    pub(crate) tx_dropped: Counter,
}

/// One worker's counters.
#[derive(Debug)]
pub(crate) struct Shard {
    pub(crate) ports: Box<[PortCounters]>,
    pub(crate) drops: [Counter; DropReason::COUNT],
    pub(crate) forwarded: Counter,
    pub(crate) flooded: Counter,
    pub(crate) local: Counter,
    pub(crate) queued: Counter,
    pub(crate) generated: Counter,
    pub(crate) generated_lost: Counter,
    pub(crate) deferred_drops: Counter,
}

impl Shard {
    pub(crate) fn new(ports: usize) -> Shard {
        Shard {
            ports: (0..ports).map(|_| PortCounters::default()).collect(),
            drops: Default::default(),
            forwarded: Counter::default(),
            flooded: Counter::default(),
            local: Counter::default(),
            queued: Counter::default(),
            generated: Counter::default(),
            generated_lost: Counter::default(),
            deferred_drops: Counter::default(),
        }
    }

    #[inline]
    pub(crate) fn count_drop(&self, r: DropReason) {
        self.drops[r as usize].add(1);
    }
}

/// Counters of one port.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PortStats {
    /// The port's name.
    pub name: String,
    /// Frames received.
    pub rx_packets: u64,
    /// Bytes received (Ethernet header included, no FCS).
    pub rx_bytes: u64,
    /// Frames transmitted.
    pub tx_packets: u64,
    /// Bytes transmitted.
    pub tx_bytes: u64,
    /// Frames the datapath sent to this port that the port refused.
    pub tx_dropped: u64,
}

/// A point-in-time copy of a datapath's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// One entry per port, in port-id order.
    pub ports: Vec<PortStats>,
    /// Frames dropped, per reason (every reason, zeros included).
    pub drops: Vec<(DropReason, u64)>,
    /// Received frames the datapath sent to exactly one known port.
    pub forwarded: u64,
    /// Received frames flooded to the other ports of their bridge.
    pub flooded: u64,
    /// Received frames consumed by the router (answered or turned into other frames).
    pub local: u64,
    /// Received frames the router queued while resolving their next hop.
    pub queued: u64,
    /// Frames the router made (ARP, ICMP, fragments, released packets).
    pub generated: u64,
    /// Frames the router could not make (no buffer, or too many in one batch).
    pub generated_lost: u64,
    /// Drops counted after the frame's own verdict (`queued` frames that later failed to
    /// resolve or overflowed the queue); included in `drops`.
    pub deferred_drops: u64,
}

impl StatsSnapshot {
    pub(crate) fn sum(names: &[String], shards: &[std::sync::Arc<Shard>]) -> StatsSnapshot {
        let mut s = StatsSnapshot {
            ports: names
                .iter()
                .map(|n| PortStats {
                    name: n.clone(),
                    ..Default::default()
                })
                .collect(),
            drops: DropReason::ALL.iter().map(|r| (*r, 0)).collect(),
            forwarded: 0,
            flooded: 0,
            local: 0,
            queued: 0,
            generated: 0,
            generated_lost: 0,
            deferred_drops: 0,
        };
        for sh in shards {
            for (p, c) in s.ports.iter_mut().zip(sh.ports.iter()) {
                p.rx_packets += c.rx_packets.get();
                p.rx_bytes += c.rx_bytes.get();
                p.tx_packets += c.tx_packets.get();
                p.tx_bytes += c.tx_bytes.get();
                p.tx_dropped += c.tx_dropped.get();
            }
            for (d, c) in s.drops.iter_mut().zip(sh.drops.iter()) {
                d.1 += c.get();
            }
            s.forwarded += sh.forwarded.get();
            s.flooded += sh.flooded.get();
            s.local += sh.local.get();
            s.queued += sh.queued.get();
            s.generated += sh.generated.get();
            s.generated_lost += sh.generated_lost.get();
            s.deferred_drops += sh.deferred_drops.get();
        }
        s
    }

    /// The count for one drop reason.
    pub fn drop_count(&self, r: DropReason) -> u64 {
        self.drops.iter().find(|d| d.0 == r).map_or(0, |d| d.1)
    }

    /// Received frames accounted for: forwarded, flooded, local, queued or dropped before
    /// transmit. Equals the sum of `rx_packets` plus frames from unknown ports.
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
        write!(f, "forwarded {}  flooded {}", self.forwarded, self.flooded)?;
        if self.local + self.queued + self.generated + self.generated_lost > 0 {
            write!(
                f,
                "  local {}  queued {}  generated {}",
                self.local, self.queued, self.generated
            )?;
            if self.generated_lost > 0 {
                write!(f, "  generated_lost {}", self.generated_lost)?;
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
    fn reasons_are_indexed_in_order() {
        for (i, r) in DropReason::ALL.iter().enumerate() {
            assert_eq!(*r as usize, i);
        }
    }
}
