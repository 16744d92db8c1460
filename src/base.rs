//! The names every layer shares: port, bridge and router-interface ids, and the verdict the
//! datapath gives a frame.
//!
//! This module depends on nothing but [`crate::stats::DropReason`], so that buffers, tables
//! and the pipeline can all name a port or a verdict without importing each other.

use crate::stats::DropReason;

/// A port's index in its datapath.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct PortId(pub u16);

/// A bridge's index in its datapath.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct BridgeId(pub u16);

/// An interface id of the router.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub struct IfaceId(pub u16);

/// What the datapath decided for one frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Send on this port.
    Output(PortId),
    /// Send on every port of this bridge except the one it came in on.
    Flood(BridgeId),
    /// Do not send; counted under this reason.
    Drop(DropReason),
    /// Consumed by the router: answered (ARP, ICMP echo) or turned into other frames.
    Local,
    /// Held by the router until its next hop resolves (ARP); sent later or dropped then.
    Queued,
}
