//! Layer 3: the router (interfaces, ARP, IPv4 forwarding, ICMP), its neighbour cache and its
//! routing table on a longest-prefix-match FIB.

// Calls into lookups compiled with POPCNT after a run-time CPU check (a `#[target_feature]`
// function is unsafe to call); each call has a SAFETY line. All other unsafe is in `sys`.
#[allow(unsafe_code)]
pub mod lpm;
pub mod neigh;
pub(crate) mod route;
pub(crate) mod router;

pub use crate::base::IfaceId;
pub use route::{
    mask, NextHop, Route, RouteError, RouteProto, RouteReader, RouteTable, MAX_NEXT_HOPS,
};
pub use router::{IfaceConfig, Router, RouterCounters, RouterCountersSnapshot};
