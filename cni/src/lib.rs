//! `tapyard-cni`: a CNI plugin (spec 1.0.0 and 0.4.0) that attaches containers to a running
//! tapyard.
//!
//! The runtime executes the binary with `CNI_*` variables in the environment and the network
//! configuration on stdin ([`args`], [`config`]). For ADD the plugin delegates address
//! allocation to the IPAM plugin ([`ipam`]), asks tapyard over its control socket for a TAP
//! port that appears in the container's namespace under `CNI_IFNAME` ([`control`]), then
//! enters that namespace ([`netns`]) and configures MTU, addresses, state and routes over
//! rtnetlink ([`netlink`]). It prints a CNI result ([`types`]) or a CNI error ([`error`]).
//! [`plugin`] holds the commands. tapyard's own library is not a dependency: the plugin only
//! talks to the running node.

#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod args;
pub mod config;
pub mod control;
pub mod error;
pub mod ipam;
pub mod netlink;
pub mod netns;
pub mod plugin;
pub mod types;
