//! The library's tests that need no privileges, in one binary: the datapath driven frame by
//! frame (bridge, router, conntrack, NAT, VXLAN, IPv6), the runtime on in-memory ports,
//! smoltcp hosts over the bridge and the module layering. Each module was a test file of its
//! own; `cargo test --test datapath nat::generic::v6` runs some. Two tests (in `vxlan::super_frames`)
//! cross real TAP devices and are ignored unless built as root (see `common`).

#[path = "../common/mod.rs"]
mod common;

mod busy_poll;
mod conntrack_zones;
mod guard;
mod ipv6_only;
mod layers;
mod martian;
mod nat;
mod nat_errors;
mod nat_restart;
mod router;
mod router6;
mod runtime;
mod smol_bridge;
mod vxlan;
