//! # tapyard
//!
//! A user-space virtual switch and router on TAP devices, as a library: an L2 learning bridge
//! today, then ARP, longest-prefix-match routing and conntrack NAT, with the semantics of a
//! Linux Kubernetes node (cni0 bridge, routes, kube-proxy's NAT).
//!
//! The layers, from the wire inwards:
//!
//! * [`port`]: anything that carries Ethernet frames: a real TAP device ([`port::TapPort`]),
//!   an in-memory pair ([`port::mem_pair`]), or a smoltcp host ([`port::SmolHost`]).
//! * [`runtime`]: worker threads that receive batches from ports, run the datapath and transmit.
//! * [`Datapath`]: the sans-IO core. Frames in, verdicts out, time passed in; shared by all
//!   workers through `&self`, with per-worker [`Worker`] contexts.
//! * Tables: [`l2::fdb::Fdb`] (per bridge, lock-free lookups).
//!
//! See `ARCHITECTURE.md` for a frame's path and the threading model.
#![deny(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations)]

pub mod base;
pub mod buf;
pub mod conntrack;
pub mod datapath;
mod hash;
pub mod l2;
pub mod l3;
pub mod nat;
pub mod port;
pub mod runtime;
pub mod stats;
mod sys;
pub mod time;
pub mod wire;

pub use buf::{Batch, BufPool, Offload, PacketBuf, BATCH_SIZE};
pub use datapath::{BridgeConfig, BridgeId, ConfigError, Datapath, PortId, Verdict, Worker};
pub use stats::{DropReason, StatsSnapshot};
pub use time::{Clock, Instant};
pub use wire::mac::MacAddr;
