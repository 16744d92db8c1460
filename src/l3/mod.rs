//! Layer 3: the router (interfaces, ARP, IPv4 forwarding, ICMP), its neighbour cache and its
//! routing table on a longest-prefix-match FIB.
//!
//! * [`Router`] (reached through [`crate::Control::router`]) and its interfaces
//!   ([`IfaceConfig`], added with [`crate::DatapathBuilder::add_router_iface`]);
//! * [`RouteTable`]: routes as `ip route` holds them (connected, via, dev, blackhole,
//!   unreachable, with metrics), published lock-free to readers;
//! * [`neigh`]: the ARP cache with Linux's state machine; [`lpm`]: the FIB underneath;
//! * [`vxlan`]: VXLAN interfaces (Flannel's `flannel.1`) and their peers.
//!
//! ```
//! use std::net::Ipv4Addr;
//! use tapyard::l3::{IfaceId, NextHop, Route, RouteProto, RouteTable};
//!
//! let routes = RouteTable::new();
//! let eth0 = IfaceId(1);
//! let route = |prefix: [u8; 4], len, next_hop| Route {
//!     prefix: prefix.into(),
//!     len,
//!     next_hop,
//!     metric: 0,
//!     proto: RouteProto::Static,
//!     src: None,
//! };
//! routes.add(route([0, 0, 0, 0], 0, NextHop::Via(eth0, Ipv4Addr::new(172, 18, 0, 1))))?;
//! routes.add(route([10, 244, 2, 0], 24, NextHop::Via(eth0, Ipv4Addr::new(172, 18, 0, 3))))?;
//! routes.add(route([10, 244, 9, 0], 24, NextHop::Blackhole))?;
//! // The longest prefix wins.
//! assert_eq!(
//!     routes.lookup(Ipv4Addr::new(10, 244, 2, 7)),
//!     Some(NextHop::Via(eth0, Ipv4Addr::new(172, 18, 0, 3)))
//! );
//! assert_eq!(routes.lookup(Ipv4Addr::new(10, 244, 9, 1)), Some(NextHop::Blackhole));
//! # Ok::<(), tapyard::l3::RouteError>(())
//! ```

pub mod defrag;
pub mod local;
// Calls into lookups compiled with POPCNT after a run-time CPU check (a `#[target_feature]`
// function is unsafe to call); each call has a SAFETY line. All other unsafe is in `sys`.
#[allow(unsafe_code)]
pub mod lpm;
pub mod neigh;
pub(crate) mod route;
pub(crate) mod router;
pub mod vxlan;

pub use crate::base::IfaceId;
pub use route::{
    mask, NextHop, Route, RouteAddr, RouteError, RouteProto, RouteReader, RouteTable, MAX_NEXT_HOPS,
};
pub use router::{IfaceConfig, RaConfig, Router, RouterCounters, RouterCountersSnapshot};
pub use vxlan::{PeerError, PeerStats, Tunnel, VxlanConfig, VxlanPeer};
