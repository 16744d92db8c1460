//! The sans-IO datapath: frames in, verdicts out.
//!
//! A [`Datapath`] holds the topology (ports, bridges) and the shared tables (one [`Fdb`] per
//! bridge). It performs no I/O and reads no clock: the caller receives frames on a port into a
//! [`Batch`](crate::buf::Batch), calls [`Datapath::process`] with the current [`Instant`](crate::time::Instant), then
//! [`Datapath::dispatch`] hands each frame to a transmit closure once per output port.
//!
//! # Threading
//!
//! `Datapath` is `Send + Sync`; any number of worker threads process batches at once through
//! `&self`. Each thread owns a [`Worker`]: its buffer pool and its own counter shard, so the
//! fast path takes no lock and shares no written cache line except table entries that change.
//! FDB lookups are lock-free; learning a *new* station takes the bridge table's writer lock
//! (see [`crate::l2::fdb`]). The topology is fixed when the datapath is built.
//!
//! # Layout
//!
//! * `builder`: [`DatapathBuilder`], [`BridgeConfig`], [`ConfigError`]: the topology.
//! * `pipeline`: [`Datapath::process`] and [`Datapath::poll`]: pass 1 (classify), pass 2
//!   (bridge, router with its PREROUTING hook, egress), the per-batch context.
//! * `dispatch`: [`Datapath::dispatch`] and [`Datapath::dispatch_runs`]: verdicts to ports.
//! * `control`: lookups by name, routes and neighbours, table dumps, counters.
//!
//! # Example
//! ```
//! use tapyard::{BridgeConfig, Datapath, Instant, PacketBuf, Batch, Verdict};
//! let mut b = Datapath::builder();
//! let br = b.add_bridge(BridgeConfig::new("br0")).unwrap();
//! let p0 = b.add_port("p0", Some(br)).unwrap();
//! let p1 = b.add_port("p1", Some(br)).unwrap();
//! let dp = b.build();
//! let mut w = dp.worker();
//! let mut batch = Batch::new();
//! let frame = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 2, 0, 0, 0, 0, 1, 0x08, 0x06, 0, 0];
//! let mut buf = PacketBuf::from_frame(&frame);
//! buf.port = p0;
//! batch.push(buf).unwrap();
//! dp.process(&mut w, Instant::ZERO, &mut batch);
//! assert_eq!(batch.verdicts()[0], Verdict::Flood(br));
//! let mut sent = vec![];
//! dp.dispatch(&mut w, &batch, |port, _buf| { sent.push(port); Ok(()) });
//! assert_eq!(sent, vec![p1]);
//! ```

use std::fmt;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::base::IfaceId;
use crate::base::{BridgeId, PortId};
use crate::buf::{BufPool, PacketBuf};
use crate::l2::fdb::Fdb;
use crate::l3::router::Router;
use crate::nat::netfilter::{NatCtx, Netfilter};
use crate::stats::Shard;

mod builder;
mod control;
mod dispatch;
mod pipeline;
#[cfg(test)]
mod tests;

pub use builder::{BridgeConfig, ConfigError, DatapathBuilder};

/// The most frames the router may make while processing one batch (ARP replies, ICMP, packets
/// released from ARP queues); more are dropped and counted.
pub const MAX_EXTRA: usize = 256;

/// What a port is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PortKind {
    /// A port with a driver, bridged or not.
    External,
    /// An external port owned by a router interface (an uplink): its frames enter L3.
    Routed(IfaceId),
    /// A router interface's port on a bridge: no driver; frames sent to it enter L3.
    RouterVirtual(IfaceId),
}

struct PortInfo {
    name: String,
    bridge: Option<BridgeId>,
    kind: PortKind,
}

/// One L2 bridge: its ports and its FDB.
pub struct Bridge {
    name: String,
    ports: Vec<PortId>,
    fdb: Fdb,
    router: Option<(IfaceId, PortId)>,
    /// The router interface's MAC on this bridge as an FDB word (0: no router here), so pass 1
    /// can tell a frame for the router without a table lookup.
    router_mac: u64,
}

impl fmt::Debug for Bridge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Bridge")
            .field("name", &self.name)
            .field("ports", &self.ports)
            .field("fdb", &self.fdb)
            .finish()
    }
}

impl Bridge {
    /// The bridge's name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Its ports, in the order they were added.
    pub fn ports(&self) -> &[PortId] {
        &self.ports
    }
    /// Its forwarding database.
    pub fn fdb(&self) -> &Fdb {
        &self.fdb
    }
}

/// The shared, sans-IO packet processor (see the module docs).
pub struct Datapath {
    ports: Vec<PortInfo>,
    names: Vec<String>,
    bridges: Vec<Bridge>,
    router: Option<Router>,
    /// Conntrack and NAT, run by the pipeline as the router's PREROUTING hook.
    nf: Option<Netfilter>,
    shards: Mutex<Vec<Arc<Shard>>>,
    last_sweep: AtomicU64,
}

impl fmt::Debug for Datapath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Datapath")
            .field("ports", &self.names)
            .field("bridges", &self.bridges)
            .finish()
    }
}

/// One worker thread's context: its buffer pool and its counters.
pub struct Worker {
    shard: Arc<Shard>,
    /// Buffers for receiving frames and for frames the datapath makes.
    pub pool: BufPool,
    /// Frames the router made while processing a batch, with their egress interface.
    extra: Vec<(PacketBuf, IfaceId)>,
    /// The worker's NAT state: its random source (endpoint choice) and its cache of recently
    /// seen connections.
    nat: NatCtx,
}

impl fmt::Debug for Worker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Worker").field("pool", &self.pool).finish()
    }
}

impl Datapath {
    /// Starts building a datapath.
    pub fn builder() -> DatapathBuilder {
        DatapathBuilder::default()
    }

    /// A new worker context with a default pool. Counters of every worker ever made are kept
    /// and summed by [`Datapath::stats`].
    pub fn worker(&self) -> Worker {
        self.worker_with_pool(BufPool::default())
    }

    /// A new worker context using `pool`.
    pub fn worker_with_pool(&self, pool: BufPool) -> Worker {
        let shard = Arc::new(Shard::new(self.ports.len()));
        self.shards.lock().push(shard.clone());
        let seed = std::collections::hash_map::RandomState::new();
        Worker {
            shard,
            pool,
            extra: Vec::with_capacity(MAX_EXTRA),
            nat: NatCtx::new(std::hash::BuildHasher::hash_one(&seed, 0x5eed_u64)),
        }
    }
}
