//! The sans-IO datapath: frames in, verdicts out.
//!
//! A [`Datapath`] holds the topology (ports, bridges) and the shared tables (one [`Fdb`] per
//! bridge); [`Datapath::control`] is the control plane's view of them ([`Control`]). It performs no
//! I/O and reads no clock: the caller receives frames on a port into a
//! [`Batch`](crate::buf::Batch), calls [`Datapath::process`] with the current
//! [`Instant`](crate::time::Instant), then [`Datapath::dispatch`] hands each frame to a transmit
//! closure once per output port.
//!
//! # Threading
//!
//! `Datapath` is `Send + Sync`; any number of worker threads process batches at once through
//! `&self`. Each thread owns a [`Worker`]: its buffer pool and its own counter shard, so the
//! fast path takes no lock and shares no written cache line except table entries that change.
//! FDB lookups are lock-free; learning a *new* station takes the bridge table's writer lock
//! (see [`crate::l2::fdb`]).
//!
//! # A live topology
//!
//! Ports are added to a bridge and removed while workers forward traffic on the others
//! ([`Control::add_port`], [`Control::remove_port`]), up to the capacity fixed at build time
//! ([`DatapathBuilder::max_ports`]): per-port arrays are allocated once for it and never move.
//! Readers keep the lock-free contract:
//!
//! * each port's bridge and kind is one atomic word, read with one relaxed load in pass 1 (a
//!   removed port reads as unknown: its frames are dropped as
//!   [`DropReason::UnknownPort`](crate::stats::DropReason::UnknownPort));
//! * each bridge's member list (for flooding) is an immutable list published with one
//!   `ArcSwap` store (RCU): a flood sees the list before or after a change, never half of it;
//! * names, free ids and the quarantine are control-plane state under a mutex.
//!
//! A removed id is *quarantined*: it is not given to a new port until every [`Worker`] has
//! passed a quiescent point after the removal (QSBR). A worker is *online* from the start of
//! [`Datapath::process`] or [`Datapath::poll`] until the end of its next
//! [`Datapath::dispatch`]/[`Datapath::dispatch_runs`] (or [`Datapath::quiesce`]), and offline
//! otherwise, so a verdict naming a port id can never reach a new owner of that id. A frame
//! classified for a port that is removed before it is transmitted is dropped at dispatch and
//! counted as [`DropReason::PortGone`](crate::stats::DropReason::PortGone). When the quarantine
//! ends, the FDB entries a racing learner may have made for the old port are flushed again and
//! the id's counters are zeroed.
//!
//! Memory per port of capacity: an 8-byte word, 48 bytes of counters per worker, and (with a
//! [`Runtime`](crate::runtime::Runtime)) a 24-byte driver slot in each published port table:
//! the default 4096 ports cost 32 KiB + 192 KiB per worker + 96 KiB.
//!
//! # Layout
//!
//! * `builder`: [`DatapathBuilder`], [`BridgeConfig`], [`ConfigError`]: the topology.
//! * `pipeline`: [`Datapath::process`] and [`Datapath::poll`]: pass 1 (classify), pass 2
//!   (bridge; frames for the router marked), pass 3 (router with its PREROUTING hook,
//!   egress), the per-batch context.
//! * `dispatch`: [`Datapath::dispatch`] and [`Datapath::dispatch_runs`]: verdicts to ports.
//! * `control`: [`Control`] ([`Datapath::control`]), the control plane's view: lookups by
//!   name, routes and neighbours, table dumps, counters. `Datapath` itself keeps the
//!   per-packet API (workers, `process`, `dispatch`, `poll`); everything else is there.
//! * `topology`: [`Control::add_port`], [`Control::remove_port`] and the quarantine of
//!   removed ids.
//! * `tunnel`: VXLAN on the fast path; `peers`: [`Control::add_vxlan_peer`] and
//!   [`Control::remove_vxlan_peer`].
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

use std::collections::BTreeSet;
use std::fmt;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use parking_lot::Mutex;

use crate::base::IfaceId;
use crate::base::{BridgeId, PortId};
use crate::buf::{BufPool, PacketBuf};
use crate::l2::fdb::Fdb;
use crate::l2::guard::PortGuard;
use crate::l3::defrag::Frags;
use crate::l3::router::Router;
use crate::l3::vxlan::Tunnel;
use crate::nat::netfilter::{NatCtx, Netfilter};
use crate::stats::Shard;

mod builder;
mod control;
mod dispatch;
mod local;
mod peers;
mod pipeline;
#[cfg(test)]
mod tests;
mod topology;
mod tunnel;

pub use builder::{conntrack6_path, BridgeConfig, ConfigError, DatapathBuilder, DEFAULT_MAX_PORTS};
pub use control::Control;

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

/// A port's word (`Datapath::ports`). The common case, an external port on bridge `b`, is
/// `b + 1` (1 to 65535), so pass 1 recognises it and has its bridge with one compare; every
/// other port is bits 0..16 the bridge (`NO_BRIDGE`: none), 16..32 the router interface,
/// 32..40 the kind (`K_*`), bit 40 `GUARDED` (an external bridged port with a spoof guard,
/// which therefore leaves the one-compare case: unguarded ports pay nothing for guards).
/// 0 is a free id.
mod word {
    use super::PortKind;
    use crate::base::{BridgeId, IfaceId};
    use crate::narrow::{low16, low8};

    pub(super) const NO_BRIDGE: u16 = u16::MAX;
    /// A free id (never used, or reclaimed after its quarantine).
    pub(super) const K_FREE: u8 = 0;
    pub(super) const K_EXTERNAL: u8 = 1;
    pub(super) const K_ROUTED: u8 = 2;
    pub(super) const K_VIRTUAL: u8 = 3;
    /// A removed port whose id is in quarantine.
    pub(super) const K_REMOVED: u8 = 4;
    /// An external bridged port whose frames go through its spoof guard
    /// (`Datapath::guards`).
    pub(super) const GUARDED: u64 = 1 << 40;

    fn long(k: u8, iface: u16, bridge: Option<BridgeId>) -> u64 {
        u64::from(bridge.map_or(NO_BRIDGE, |b| b.0)) | u64::from(iface) << 16 | u64::from(k) << 32
    }

    pub(super) fn encode(kind: PortKind, bridge: Option<BridgeId>) -> u64 {
        match (kind, bridge) {
            (PortKind::External, Some(b)) => u64::from(b.0) + 1,
            (PortKind::External, None) => long(K_EXTERNAL, 0, None),
            (PortKind::Routed(i), b) => long(K_ROUTED, i.0, b),
            (PortKind::RouterVirtual(i), b) => long(K_VIRTUAL, i.0, b),
        }
    }

    /// The word of an external port on `bridge`, with its spoof guard on or off.
    pub(super) fn external(bridge: BridgeId, guarded: bool) -> u64 {
        if guarded {
            long(K_EXTERNAL, 0, Some(bridge)) | GUARDED
        } else {
            encode(PortKind::External, Some(bridge))
        }
    }

    /// Whether the port's frames go through its spoof guard.
    #[inline(always)]
    pub(super) fn is_guarded(w: u64) -> bool {
        w & GUARDED != 0
    }

    /// The word of a removed port that was on `bridge`.
    pub(super) fn removed(bridge: Option<BridgeId>) -> u64 {
        long(K_REMOVED, 0, bridge)
    }

    /// The bridge of an external bridged port; `None` for any other word.
    #[inline(always)]
    pub(super) fn bridged(w: u64) -> Option<BridgeId> {
        // 1..=65535 (bridge ids stop below NO_BRIDGE, so b + 1 fits).
        (w.wrapping_sub(1) < u64::from(NO_BRIDGE)).then_some(BridgeId(low16(w.wrapping_sub(1))))
    }

    /// A free id, or a removed port's: no port is there.
    #[inline(always)]
    pub(super) fn is_gone(w: u64) -> bool {
        matches!(kind(w), K_FREE | K_REMOVED)
    }

    #[inline(always)]
    pub(super) fn kind(w: u64) -> u8 {
        if bridged(w).is_some() {
            K_EXTERNAL
        } else {
            low8(w >> 32)
        }
    }

    #[inline(always)]
    pub(super) fn bridge(w: u64) -> Option<BridgeId> {
        if let Some(b) = bridged(w) {
            return Some(b);
        }
        let b = low16(w);
        (b != NO_BRIDGE).then_some(BridgeId(b))
    }

    #[inline(always)]
    pub(super) fn iface(w: u64) -> IfaceId {
        IfaceId(low16(w >> 16))
    }

    /// A port that exists and is not a router interface's virtual port: one frames are sent
    /// to.
    #[inline(always)]
    pub(super) fn sendable(w: u64) -> bool {
        matches!(kind(w), K_EXTERNAL | K_ROUTED)
    }
}

/// A worker's quiescent-state counter: odd while the worker is online (between `process` or
/// `poll` and the end of the next `dispatch`), even while it is offline. On its own cache line
/// so that workers never share one.
#[repr(align(64))]
#[derive(Debug, Default)]
pub(crate) struct Epoch(AtomicU64);

/// A removed port id waiting for every worker that was online at its removal to pass a
/// quiescent point.
struct Quarantined {
    id: PortId,
    bridge: Option<BridgeId>,
    /// The workers online when the current phase began, with their counter then.
    online: Vec<(Arc<Epoch>, u64)>,
    /// Phase 2: the port's FDB entries were flushed after every learner that could still
    /// see it live had passed a quiescent point.
    flushed: bool,
}

/// The control plane's view of the topology, under `Datapath::topo`.
struct Topo {
    /// Live ports' names, by id (`None`: free or quarantined); as long as the highest id used.
    names: Vec<Option<String>>,
    /// Ids below `names.len()` free for reuse, lowest first.
    free: BTreeSet<u16>,
    quarantine: Vec<Quarantined>,
    /// Every worker's quiescent-state counter (pruned when the worker is gone).
    epochs: Vec<Arc<Epoch>>,
    /// Per port id, how many runtimes or pumps hold a driver for it: such a port is removed
    /// through them (they detach the driver first), never behind their back.
    attached: Vec<u32>,
}

/// One L2 bridge: its ports and its FDB.
pub struct Bridge {
    name: String,
    /// The members, in the order they were added; replaced whole (RCU) on a change.
    ports: ArcSwap<Vec<PortId>>,
    /// `ports.len()`, for the flood decision without loading the list.
    members: AtomicU32,
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
            .field("ports", &self.ports.load())
            .field("fdb", &self.fdb)
            .finish()
    }
}

impl Bridge {
    /// The bridge's name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// Its ports now, in the order they were added (router interface's virtual port
    /// included).
    pub fn ports(&self) -> Vec<PortId> {
        self.ports.load().to_vec()
    }
    /// Its forwarding database.
    pub fn fdb(&self) -> &Fdb {
        &self.fdb
    }
}

/// The shared, sans-IO packet processor (see the module docs).
pub struct Datapath {
    /// Every port id's word (see `word`), `max_ports` of them, read lock-free per frame.
    ports: Box<[AtomicU64]>,
    /// The spoof guards of guarded ports, by port id (as long as the highest guarded id),
    /// read lock-free by pass 2 for a frame of a port whose word has `word::GUARDED`;
    /// replaced whole under the topology mutex ([`Control::set_port_guard`]).
    guards: ArcSwap<Vec<Option<PortGuard>>>,
    /// Names, free ids, the quarantine and the workers' epochs: control plane only.
    topo: Mutex<Topo>,
    bridges: Vec<Bridge>,
    router: Option<Router>,
    /// Conntrack and NAT, run by the pipeline as the router's PREROUTING hook.
    nf: Option<Netfilter>,
    /// VXLAN interfaces (fixed at build time; their peers change live).
    tunnels: Vec<Tunnel>,
    shards: Mutex<Vec<Arc<Shard>>>,
    last_sweep: AtomicU64,
}

impl fmt::Debug for Datapath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Datapath")
            .field("ports", &self.topo.lock().names)
            .field("bridges", &self.bridges)
            .finish()
    }
}

/// One worker thread's context: its buffer pool and its counters.
pub struct Worker {
    shard: Arc<Shard>,
    /// Its quiescent-state counter, read by the control plane to end quarantines.
    epoch: Arc<Epoch>,
    /// Buffers for receiving frames and for frames the datapath makes.
    pub pool: BufPool,
    /// Frames the router made while processing a batch, with their egress interface.
    extra: Vec<(PacketBuf, IfaceId)>,
    /// The worker's NAT state: its random source (endpoint choice) and its cache of recently
    /// seen connections.
    nat: NatCtx,
    /// The worker's reassembly tables (fragments in front of conntrack; see
    /// [`crate::l3::defrag`]).
    frags: Frags,
}

impl Worker {
    /// Marks the worker online (before it reads a port word or the FDB for a batch). The
    /// fence orders the store before the worker's loads, against the remover's fence between
    /// its store of the port word and its loads of the epochs (a Dekker pair): either the
    /// remover sees this worker online, or this worker sees the port removed.
    #[inline(always)]
    fn online(&self) {
        let e = self.epoch.0.load(Ordering::Relaxed);
        if e & 1 == 0 {
            self.epoch.0.store(e + 1, Ordering::Relaxed);
            fence(Ordering::SeqCst);
        }
    }

    /// Marks the worker offline: it holds no port id from before this point.
    #[inline(always)]
    fn offline(&self) {
        let e = self.epoch.0.load(Ordering::Relaxed);
        if e & 1 == 1 {
            self.epoch.0.store(e + 1, Ordering::Release);
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.offline();
    }
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
    /// and summed by [`Control::stats`].
    pub fn worker(&self) -> Worker {
        self.worker_with_pool(BufPool::default())
    }

    /// A new worker context using `pool`.
    pub fn worker_with_pool(&self, pool: BufPool) -> Worker {
        let shard = Arc::new(Shard::new(self.ports.len()));
        self.shards.lock().push(shard.clone());
        let epoch = Arc::new(Epoch::default());
        self.topo.lock().epochs.push(epoch.clone());
        Worker {
            shard,
            epoch,
            pool,
            extra: Vec::with_capacity(MAX_EXTRA),
            nat: NatCtx::new(crate::hash::random_u64()),
            frags: Frags::default(),
        }
    }
}
