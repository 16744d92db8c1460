//! # tapyard
//!
//! A user-space virtual switch and router on TAP devices, as a library: what a Linux
//! Kubernetes node does with kernel parts — a bridge (`cni0`) with ports, ARP, a routing
//! table, conntrack and kube-proxy's NAT — done in user space, with Linux's semantics, so
//! that VM and container runtimes, network emulators, test harnesses and user-space CNIs can
//! embed a node's dataplane.
//!
//! ## The layers
//!
//! From the wire inwards; each layer uses only the ones above it in this list (a test,
//! `tests/datapath/layers.rs`, keeps it so):
//!
//! * [`wire`]: the packet-view layer: checked views over header bytes and plain values
//!   (`Repr`s) for Ethernet/VLAN, ARP, IPv4, ICMP, TCP, UDP, VXLAN, the virtio-net header,
//!   the checksums and the conntrack tuple.
//! * [`PacketBuf`], [`Batch`], [`BufPool`]: frames in buffers with headroom, in batches of
//!   [`BATCH_SIZE`], from a per-worker pool.
//! * [`port`]: anything that carries Ethernet frames: a TAP device ([`port::TapPort`]), an
//!   in-memory pair ([`port::mem_pair`]), a smoltcp host ([`port::SmolHost`]), and middleware
//!   that wraps any of them ([`port::Observed`] for capture and tracing).
//! * [`l2`]: the learning bridge's forwarding database ([`l2::fdb::Fdb`]).
//! * [`l3`]: the router: interfaces, ARP and its neighbour cache ([`l3::neigh`]), the routing
//!   table on a longest-prefix-match FIB ([`l3::lpm`]), IPv4 forwarding and ICMP, and VXLAN
//!   interfaces with their peers ([`l3::vxlan`], as Flannel's `flannel.1`).
//! * [`conntrack`] and [`nat`]: the lock-free connection table, and the NAT engine that
//!   plugs into the router's PREROUTING hook: Services (ClusterIP, NodePort), masquerade, SNAT.
//! * [`Datapath`]: the sans-IO core that ties them together. Frames in, verdicts out, time
//!   passed in; shared by every worker thread through `&self`, each with its own [`Worker`].
//! * [`runtime`]: worker threads that receive from ports, run the datapath and transmit.
//!
//! Counters are declared once per table ([`stats::CounterSet`]) and every frame not
//! forwarded is counted under one [`DropReason`]. `ARCHITECTURE.md` follows a frame through
//! the layers and states the threading model.
//!
//! ## Example: a pod reaches a Service
//!
//! A bridge with two pods and their gateway, NAT with one Service, and a TCP SYN from pod A
//! to the Service's ClusterIP: it comes out DNAT'd to the endpoint on pod B.
//!
//! ```
//! use std::net::{Ipv4Addr, SocketAddrV4};
//! use tapyard::l3::IfaceConfig;
//! use tapyard::nat::{NatConfig, Prefix};
//! use tapyard::nat::{Endpoint, ServiceSpec};
//! use tapyard::wire::family::IpProto;
//! use tapyard::{Batch, BridgeConfig, Datapath, Instant, MacAddr, PacketBuf, Verdict};
//!
//! let gw_mac = MacAddr([2, 0, 0, 0, 0, 1]);
//! let (pod_a, pod_b) = (MacAddr([2, 0, 0, 0, 1, 2]), MacAddr([2, 0, 0, 0, 1, 3]));
//!
//! // A node: bridge cni0 with two pods and the pods' gateway 10.244.1.1/24, with NAT.
//! let mut b = Datapath::builder();
//! let cni0 = b.add_bridge(BridgeConfig::new("cni0"))?;
//! let port_a = b.add_port("pod-a", Some(cni0))?;
//! let port_b = b.add_port("pod-b", Some(cni0))?;
//! let (gw, _) = b.add_router_iface(
//!     IfaceConfig::new("cni0", gw_mac, Ipv4Addr::new(10, 244, 1, 1), 24),
//!     Some(cni0),
//! )?;
//! b.netfilter(NatConfig::default())?;
//! let dp = b.build();
//! let now = Instant::from_secs(1);
//!
//! // A Service: ClusterIP 10.96.0.10:80/tcp, one endpoint on pod B (10.244.1.3:8080).
//! let mut web = ServiceSpec::new("web", Ipv4Addr::new(10, 96, 0, 10), 80, IpProto::TCP);
//! web.endpoints = vec![Endpoint::new(SocketAddrV4::new(Ipv4Addr::new(10, 244, 1, 3), 8080), true)];
//! dp.control().netfilter().unwrap().upsert_service(web, now)?;
//! dp.control().add_static_neigh(gw, Ipv4Addr::new(10, 244, 1, 3), pod_b, now)?;
//!
//! // Pod A opens a connection to the ClusterIP, through its gateway's MAC.
//! let mut syn = Vec::new();
//! etherparse::PacketBuilder::ethernet2(pod_a.0, gw_mac.0)
//!     .ipv4([10, 244, 1, 2], [10, 96, 0, 10], 64)
//!     .tcp(40000, 80, 1, 65535)
//!     .syn()
//!     .write(&mut syn, &[])?;
//! let mut w = dp.worker();
//! let mut batch = Batch::new();
//! let mut buf = PacketBuf::from_frame(&syn);
//! buf.port = port_a;
//! batch.push(buf).unwrap();
//! dp.process(&mut w, now, &mut batch);
//!
//! // It was DNAT'd to the endpoint and routed back onto cni0, towards pod B.
//! let out = &batch.bufs()[0];
//! let ip = etherparse::Ipv4HeaderSlice::from_slice(&out.frame()[14..])?;
//! assert_eq!(ip.destination_addr(), Ipv4Addr::new(10, 244, 1, 3));
//! assert_eq!(&out.frame()[..6], &pod_b.0);
//! assert!(matches!(batch.verdicts()[0], Verdict::Flood(_) | Verdict::Output(_)));
//! let mut sent = Vec::new();
//! dp.dispatch(&mut w, &batch, |port, _| { sent.push(port); Ok(()) });
//! assert!(sent.contains(&port_b));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! To run the same datapath on TAP devices, hand its ports to a [`runtime::Runtime`]; for a
//! deterministic single-threaded loop (tests, simulations), drive them with a
//! [`runtime::Pump`] and your own clock.

mod base;
mod buf;
pub mod conntrack;
mod datapath;
mod hash;
pub mod l2;
pub mod l3;
mod narrow;
pub mod nat;
pub mod offload;
pub mod port;
pub mod runtime;
pub mod stats;
mod sys;
mod time;
pub mod wire;

pub use base::{BridgeId, IfaceId, PortId, Verdict};
pub use buf::{Batch, BufPool, Offload, PacketBuf, BATCH_SIZE, DEFAULT_FRAME_ROOM, HEADROOM};
pub use datapath::{
    conntrack6_path, Bridge, BridgeConfig, ConfigError, Control, Datapath, DatapathBuilder, Worker,
    DEFAULT_MAX_PORTS, MAX_EXTRA,
};
pub use stats::{DropReason, StatsSnapshot};
pub use time::{Clock, Instant};
pub use wire::mac::MacAddr;
