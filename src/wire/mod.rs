//! The packet-view layer: headers read and written in place, and parsed into values.
//!
//! One file per header. Everything that knows a field's offset or folds a checksum lives here;
//! the layers above (the bridge, the router, conntrack and NAT) call these views.

pub mod ipv4;
pub mod mac;
mod summary;
pub mod tuple;

pub(crate) use summary::is_vlan_type;
pub use summary::{EthMeta, Summary, ETH_HDR_LEN, L4};
