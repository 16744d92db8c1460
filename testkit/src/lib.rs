//! tapyard's test kit: what the integration tests, benches, fuzz targets and the tests of
//! `tapyard-cli` and `tapyard-cni` share, written once.
//!
//! - [`host`]: may this machine run a root test (root, tools, `/dev/net/tun`; a skip fails
//!   under `CI=true`), commands with a timeout, waiting, unique names, temporary directories.
//! - [`netns`]: network namespaces ([`Ns`], the self-deleting [`Netns`]) and the cleanup
//!   [`Guard`] that removes what a test made, in order, whether it passed or failed.
//! - [`node`]: a datapath driven frame by frame in memory ([`Node`]: send a frame, advance
//!   the clock) and in-memory ports.
//! - [`kube`]: the Kubernetes node of the NAT tests ([`kube::kube_node`]) and each family's
//!   addresses on it ([`kube::Plan`]), so that a NAT test is written once for both.
//! - [`frame`]: frame builders of either family (TCP, UDP, the announce frame), what a frame
//!   carries ([`frame::flow`]) and checksum checks.
//! - `bench` (feature `bench`): the benches' criterion helpers and baselines.
//!
//! Root tests: a test that needs root (TAP devices, network namespaces) carries
//! `#[cfg_attr(not(tapyard_root), ignore = "needs root: ...")]`. Each package's `build.rs`
//! (`build/tapyard_root.rs`) sets `cfg(tapyard_root)` when the build runs as root (effective
//! uid 0, unless `TAPYARD_TEST_AS_USER=1`), so a user's `cargo test` lists these tests as
//! `ignored`; as root (and in CI) they run, and [`host::missing`] with [`host::skip`] or
//! [`host::skip_or_fail`] still skips one that lacks a tool, saying why (under `CI=true` it
//! fails instead).

#[cfg(feature = "bench")]
pub mod bench;
pub mod frame;
pub mod host;
pub mod kube;
pub mod netns;
pub mod node;

pub use host::*;
pub use netns::{clean_up, spawn_in, Guard, Netns, Ns};
pub use node::{announce_frame, mem_bridge, one, route, send, send_one, tick, Drivers, Node, Out};
