//! The `tapyard` command end to end, in one binary: `tapyard run` nodes in network namespaces
//! with pods, the CNI plugin and podman, dual-stack and IPv6-only nodes, VXLAN overlays with
//! Linux (Flannel) nodes, restarts and takeovers. They need root and are ignored unless built
//! as root (see `common`); as root a missing tool skips a test, or fails it under `CI=true`.
//! `cargo test -p tapyard-cli --test e2e restart::` runs one module.

#[path = "../common/mod.rs"]
mod common;

mod cni_node;
mod ct_limit;
mod dual_stack;
mod endpoints;
mod frags;
mod health;
mod host_port;
mod ipv6_only;
mod lb;
mod netns_node;
mod podman;
mod restart;
mod restart_ct;
mod spoof_guard;
mod stale_udp;
mod takeover;
mod vxlan;
mod vxlan6;
