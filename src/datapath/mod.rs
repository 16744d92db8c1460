//! The sans-IO datapath: frames in, verdicts out.
//!
//! A [`Datapath`] holds the topology (ports, bridges) and the shared tables (one [`Fdb`] per
//! bridge). It performs no I/O and reads no clock: the caller receives frames on a port into a
//! [`Batch`], calls [`Datapath::process`] with the current [`Instant`], then
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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

pub use crate::base::{BridgeId, PortId, Verdict};
use crate::buf::{Batch, BufPool, PacketBuf, BATCH_SIZE};
use crate::l2::fdb::{Fdb, FdbEntry, Loc, DEFAULT_AGING, DEFAULT_MAX_ENTRIES};
use crate::l3::neigh::{NeighConfig, NeighTable};
use crate::l3::route::{mask, IfaceId, NextHop, Route, RouteProto, RouteTable};
use crate::l3::router::{Iface, IfaceConfig, L3Batch, Router, Sink, L3};
use crate::stats::{DropReason, Shard, StatsSnapshot};
use crate::time::Instant;
use crate::wire::{is_vlan_type, EthMeta};

/// The most frames the router may make while processing one batch (ARP replies, ICMP, packets
/// released from ARP queues); more are dropped and counted.
pub const MAX_EXTRA: usize = 256;

/// Conntrack slots examined for expiry per [`Datapath::poll`] call (every 100 ms with a
/// router): 40960 slots a second, so a table of 262144 is swept in under 7 s, while expired
/// entries are treated as absent at once anyway.
const CT_SWEEP_BUDGET: usize = 4096;

/// Pass 1 prefetches the conntrack buckets of routed IPv4 packets once the table holds this
/// many connections (about where its index outgrows a core's L2 cache).
const CT_PREFETCH_MIN: usize = 16_384;

/// Pass 1's conntrack prefetcher: the key of the last tuple it prefetched, so a run of
/// one flow's packets is prefetched once.
struct CtPrefetch<'a> {
    nf: &'a crate::nat::netfilter::Netfilter,
    last: [u64; 2],
}

impl CtPrefetch<'_> {
    /// Prefetches the conntrack buckets of the untagged IPv4 packet in `f`, if any.
    #[inline]
    fn frame(&mut self, f: &[u8]) {
        if let (Some(&[0x08, 0x00]), Some(ip)) = (f.get(12..14), f.get(14..)) {
            self.nf.prefetch_ipv4(ip, &mut self.last);
        }
    }
}

/// The longest run [`Datapath::dispatch_runs`] hands over at once.
const RUN_MAX: usize = 64;

/// The low 48 bits: a MAC address read as a little-endian word.
const MAC48: u64 = (1 << 48) - 1;

/// The table-free part of a frame's classification (pass 1 of [`Datapath::process`]), packed
/// small so that storing and reading it back is cheap; the FDB locations of a bridged frame's
/// addresses live in arrays beside it, and the L3 offset and EtherType are read again (with
/// [`L3Hint::of`]) only by the frames that need them.
#[derive(Clone, Copy)]
struct Pre {
    kind: u8,
    /// `GROUP_DST`, `LINK_LOCAL`, `OURS`; for `DROP`, the drop reason's discriminant.
    flags: u8,
    /// The bridge (`BRIDGE`) or the router interface (`ROUTED`).
    id: u16,
}

/// `Pre::kind`: dropped in pass 1, under `reason`.
const DROP: u8 = 0;
/// `Pre::kind`: a frame on a router interface's own (uplink) port.
const ROUTED: u8 = 1;
/// `Pre::kind`: a frame on a bridge port.
const BRIDGE: u8 = 2;

/// The destination is a group (multicast or broadcast) address.
const GROUP_DST: u8 = 1;
/// The destination is in the 802.1D reserved range a bridge does not forward.
const LINK_LOCAL: u8 = 2;
/// (Routed) the destination is the router interface's own MAC.
const OURS: u8 = 4;

impl Pre {
    #[inline]
    fn drop(reason: DropReason) -> Pre {
        Pre {
            kind: DROP,
            flags: reason as u8,
            id: 0,
        }
    }

    /// The drop reason of a `DROP`.
    #[inline]
    fn reason(&self) -> DropReason {
        DropReason::ALL
            .get(usize::from(self.flags))
            .copied()
            .unwrap_or(DropReason::Truncated)
    }
}

/// What the router needs from the L2 parse: where L3 starts and what it is.
#[derive(Clone, Copy)]
struct L3Hint {
    l3: u16,
    ether_type: u16,
    tagged: bool,
}

impl L3Hint {
    /// Reads a frame's L3 offset and EtherType again (pass 1 has checked that it parses; a
    /// frame that does not reads as tagged, which every user drops).
    #[inline]
    fn of(b: &PacketBuf) -> L3Hint {
        match EthMeta::parse(b.frame()) {
            Ok(m) => L3Hint {
                l3: m.l3,
                ether_type: m.ether_type.0,
                tagged: m.vlan.is_some(),
            },
            Err(_) => L3Hint {
                l3: 0,
                ether_type: 0,
                tagged: true,
            },
        }
    }
}

/// Settings of one bridge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BridgeConfig {
    /// A unique name, like `cni0`.
    pub name: String,
    /// The FDB's limit on entries (default 8192).
    pub fdb_max_entries: usize,
    /// How long a silent station stays in the FDB (default 300 s, as Linux).
    pub aging: Duration,
}

impl BridgeConfig {
    /// A bridge called `name` with default limits.
    pub fn new(name: impl Into<String>) -> BridgeConfig {
        BridgeConfig {
            name: name.into(),
            fdb_max_entries: DEFAULT_MAX_ENTRIES,
            aging: DEFAULT_AGING,
        }
    }
}

/// An invalid topology given to [`DatapathBuilder`]; the message names the field and value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigError {
    /// Two ports or two bridges with one name.
    DuplicateName {
        /// `"port"` or `"bridge"`.
        kind: &'static str,
        /// The repeated name.
        name: String,
    },
    /// A name that is empty or longer than 15 bytes (Linux's IFNAMSIZ - 1).
    BadName {
        /// `"port"` or `"bridge"`.
        kind: &'static str,
        /// The name given.
        name: String,
    },
    /// A port attached to a bridge id that does not exist.
    NoSuchBridge(BridgeId),
    /// More than 65535 ports or bridges.
    TooMany(&'static str),
    /// A numeric setting out of its range.
    OutOfRange {
        /// The setting.
        field: &'static str,
        /// The value given.
        value: String,
        /// What is accepted.
        expected: &'static str,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::DuplicateName { kind, name } => {
                write!(
                    f,
                    "{kind} name {name:?} is used twice; names must be unique"
                )
            }
            ConfigError::BadName { kind, name } => write!(
                f,
                "{kind} name {name:?} is invalid: expected 1 to 15 bytes, no '/', no whitespace"
            ),
            ConfigError::NoSuchBridge(b) => write!(f, "bridge id {} does not exist", b.0),
            ConfigError::TooMany(what) => write!(f, "too many {what}: at most 65535"),
            ConfigError::OutOfRange {
                field,
                value,
                expected,
            } => write!(f, "{field} = {value} is out of range: expected {expected}"),
        }
    }
}

impl std::error::Error for ConfigError {}

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

fn check_name(kind: &'static str, name: &str) -> Result<(), ConfigError> {
    if name.is_empty()
        || name.len() > 15
        || name.contains('/')
        || name.chars().any(char::is_whitespace)
    {
        return Err(ConfigError::BadName {
            kind,
            name: name.to_string(),
        });
    }
    Ok(())
}

/// Builds a [`Datapath`]: add bridges, then ports attached to them.
#[derive(Default)]
pub struct DatapathBuilder {
    ports: Vec<PortInfo>,
    bridges: Vec<Bridge>,
    ifaces: Vec<Iface>,
    neigh: NeighConfig,
    nf: Option<crate::nat::netfilter::Netfilter>,
}

impl fmt::Debug for DatapathBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DatapathBuilder")
            .field("ports", &self.ports.len())
            .field("bridges", &self.bridges)
            .finish()
    }
}

impl DatapathBuilder {
    /// Adds a bridge.
    pub fn add_bridge(&mut self, cfg: BridgeConfig) -> Result<BridgeId, ConfigError> {
        check_name("bridge", &cfg.name)?;
        if self.bridges.iter().any(|b| b.name == cfg.name) {
            return Err(ConfigError::DuplicateName {
                kind: "bridge",
                name: cfg.name,
            });
        }
        if !(1..=1 << 24).contains(&cfg.fdb_max_entries) {
            return Err(ConfigError::OutOfRange {
                field: "fdb_max_entries",
                value: cfg.fdb_max_entries.to_string(),
                expected: "1 to 16777216",
            });
        }
        if cfg.aging < Duration::from_secs(1) || cfg.aging > Duration::from_secs(1_000_000) {
            return Err(ConfigError::OutOfRange {
                field: "aging",
                value: format!("{:?}", cfg.aging),
                expected: "1 s to 1000000 s",
            });
        }
        let id = u16::try_from(self.bridges.len()).map_err(|_| ConfigError::TooMany("bridges"))?;
        self.bridges.push(Bridge {
            name: cfg.name,
            ports: Vec::new(),
            fdb: Fdb::new(cfg.fdb_max_entries, cfg.aging),
            router: None,
            router_mac: 0,
        });
        Ok(BridgeId(id))
    }

    /// Adds a port, attached to `bridge` or to none (its frames are then dropped as
    /// [`DropReason::NoBridge`]).
    pub fn add_port(
        &mut self,
        name: impl Into<String>,
        bridge: Option<BridgeId>,
    ) -> Result<PortId, ConfigError> {
        self.push_port(name.into(), bridge, PortKind::External)
    }

    fn push_port(
        &mut self,
        name: String,
        bridge: Option<BridgeId>,
        kind: PortKind,
    ) -> Result<PortId, ConfigError> {
        check_name("port", &name)?;
        if self.ports.iter().any(|p| p.name == name) {
            return Err(ConfigError::DuplicateName { kind: "port", name });
        }
        let id =
            PortId(u16::try_from(self.ports.len()).map_err(|_| ConfigError::TooMany("ports"))?);
        if let Some(b) = bridge {
            self.bridges
                .get_mut(usize::from(b.0))
                .ok_or(ConfigError::NoSuchBridge(b))?
                .ports
                .push(id);
        }
        self.ports.push(PortInfo { name, bridge, kind });
        Ok(id)
    }

    /// Adds a router interface. On a bridge (`on = Some(bridge)`, like `cni0`), it gets a
    /// virtual port on that bridge named after it, and its MAC a static FDB entry there;
    /// otherwise it owns a new external port named after it (an uplink, like `eth0`) that the
    /// caller attaches a driver to. The connected route `addr/prefix_len` is added. Returns
    /// the interface id and its port.
    pub fn add_router_iface(
        &mut self,
        cfg: IfaceConfig,
        on: Option<BridgeId>,
    ) -> Result<(IfaceId, PortId), ConfigError> {
        if !cfg.mac.is_station() {
            return Err(ConfigError::OutOfRange {
                field: "mac",
                value: cfg.mac.to_string(),
                expected: "a unicast, non-zero MAC address",
            });
        }
        if cfg.prefix_len > 32 || cfg.addr.is_unspecified() || cfg.addr.is_multicast() {
            return Err(ConfigError::OutOfRange {
                field: "address",
                value: format!("{}/{}", cfg.addr, cfg.prefix_len),
                expected: "a unicast IPv4 address with a prefix length of 0 to 32",
            });
        }
        if !(68..=65_000).contains(&cfg.mtu) {
            return Err(ConfigError::OutOfRange {
                field: "mtu",
                value: cfg.mtu.to_string(),
                expected: "68 to 65000",
            });
        }
        if let Some(other) = self.ifaces.iter().find(|i| i.cfg.addr == cfg.addr) {
            return Err(ConfigError::OutOfRange {
                field: "address",
                value: cfg.addr.to_string(),
                expected: if other.cfg.name == cfg.name {
                    "an address used once"
                } else {
                    "an address not used by another interface"
                },
            });
        }
        let id = IfaceId(
            u16::try_from(self.ifaces.len()).map_err(|_| ConfigError::TooMany("interfaces"))?,
        );
        if let Some(b) = on {
            let br = self
                .bridges
                .get(usize::from(b.0))
                .ok_or(ConfigError::NoSuchBridge(b))?;
            if br.router.is_some() {
                return Err(ConfigError::OutOfRange {
                    field: "bridge",
                    value: br.name.clone(),
                    expected: "a bridge without a router interface (one per bridge)",
                });
            }
        }
        let kind = match on {
            Some(_) => PortKind::RouterVirtual(id),
            None => PortKind::Routed(id),
        };
        let port = self.push_port(cfg.name.clone(), on, kind)?;
        if let Some(b) = on {
            let br = &mut self.bridges[usize::from(b.0)];
            br.router = Some((id, port));
            br.router_mac = crate::l2::fdb::word(cfg.mac);
            br.fdb.add_static(cfg.mac, port);
        }
        self.ifaces.push(Iface {
            cfg,
            port,
            bridge: on,
        });
        Ok((id, port))
    }

    /// Sets the neighbour (ARP) table's configuration (defaults as Linux).
    pub fn neigh_config(&mut self, cfg: NeighConfig) -> Result<(), ConfigError> {
        cfg.validate().map_err(|e| ConfigError::OutOfRange {
            field: "neigh",
            value: e.to_string(),
            expected: "valid neighbour settings",
        })?;
        self.neigh = cfg;
        Ok(())
    }

    /// Turns on connection tracking and NAT (Services, masquerade, SNAT) on routed packets,
    /// and reverse NAT on bridged IPv4 (see [`crate::nat::netfilter`]). Needs a router interface.
    /// Errors name the bad conntrack setting.
    pub fn netfilter(&mut self, cfg: crate::nat::netfilter::NatConfig) -> Result<(), ConfigError> {
        let nf =
            crate::nat::netfilter::Netfilter::new(cfg).map_err(|e| ConfigError::OutOfRange {
                field: e.field,
                value: e.value,
                expected: e.expected,
            })?;
        self.nf = Some(nf);
        Ok(())
    }

    /// Finishes the datapath.
    pub fn build(self) -> Datapath {
        let nf = self.nf;
        let router = (!self.ifaces.is_empty()).then(|| {
            let mut r = Router::new(self.ifaces, NeighTable::new(self.neigh));
            r.nf = nf;
            for (i, iface) in r.ifaces.iter().enumerate() {
                let c = &iface.cfg;
                // Two interfaces in one subnet: the first one's connected route wins, as the
                // second `add` fails with `Exists` (Linux keeps both; the first is used).
                let _ = r.routes.add(Route {
                    prefix: mask(c.addr, c.prefix_len),
                    len: c.prefix_len,
                    next_hop: NextHop::Link(IfaceId(i as u16)),
                    metric: 0,
                    proto: RouteProto::Kernel,
                    src: Some(c.addr),
                });
            }
            r
        });
        Datapath {
            names: self.ports.iter().map(|p| p.name.clone()).collect(),
            ports: self.ports,
            bridges: self.bridges,
            router,
            shards: Mutex::new(Vec::new()),
            last_sweep: AtomicU64::new(0),
        }
    }
}

/// The shared, sans-IO packet processor (see the module docs).
pub struct Datapath {
    ports: Vec<PortInfo>,
    names: Vec<String>,
    bridges: Vec<Bridge>,
    router: Option<Router>,
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

/// The router's output during one call: frames written into pool buffers.
struct PoolSink<'a> {
    pool: &'a mut BufPool,
    out: &'a mut Vec<(PacketBuf, IfaceId)>,
    shard: &'a Shard,
    overflow: u64,
}

impl Sink for PoolSink<'_> {
    fn emit(&mut self, via: IfaceId, write: &mut dyn FnMut(&mut [u8]) -> Option<usize>) {
        if self.out.len() >= MAX_EXTRA {
            self.overflow += 1;
            return;
        }
        let Some(mut b) = self.pool.get() else {
            self.overflow += 1;
            return;
        };
        match write(b.room_mut()) {
            Some(n) => {
                b.set_len(n);
                self.out.push((b, via));
            }
            None => {
                self.overflow += 1;
                self.pool.put(b);
            }
        }
    }

    fn dropped(&mut self, reason: DropReason) {
        self.shard.count_drop(reason);
        self.shard.deferred_drops.add(1);
    }
}

/// One worker thread's context: its buffer pool and its counters.
pub struct Worker {
    shard: Arc<Shard>,
    /// Buffers for receiving frames and for frames the datapath makes.
    pub pool: BufPool,
    /// Frames the router made while processing a batch, with their egress interface.
    extra: Vec<(PacketBuf, IfaceId)>,
    /// Random source for endpoint choice.
    rng: crate::nat::Rng,
    /// The NAT hook's cache of recently seen connections (see `netfilter::FlowMemo`).
    flows: crate::nat::netfilter::FlowMemo,
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
            rng: crate::nat::Rng::new(std::hash::BuildHasher::hash_one(&seed, 0x5eed_u64)),
            flows: crate::nat::netfilter::FlowMemo::default(),
        }
    }

    /// Number of ports.
    pub fn port_count(&self) -> usize {
        self.ports.len()
    }

    /// The name of a port.
    pub fn port_name(&self, p: PortId) -> Option<&str> {
        self.ports.get(usize::from(p.0)).map(|p| p.name.as_str())
    }

    /// The port called `name`.
    pub fn port_by_name(&self, name: &str) -> Option<PortId> {
        self.ports
            .iter()
            .position(|p| p.name == name)
            .map(|i| PortId(i as u16))
    }

    /// The bridge a port belongs to.
    pub fn port_bridge(&self, p: PortId) -> Option<BridgeId> {
        self.ports.get(usize::from(p.0)).and_then(|p| p.bridge)
    }

    /// A bridge by id.
    pub fn bridge(&self, b: BridgeId) -> Option<&Bridge> {
        self.bridges.get(usize::from(b.0))
    }

    /// The bridge called `name`.
    pub fn bridge_by_name(&self, name: &str) -> Option<BridgeId> {
        self.bridges
            .iter()
            .position(|b| b.name == name)
            .map(|i| BridgeId(i as u16))
    }

    /// All bridges, in id order.
    pub fn bridges(&self) -> &[Bridge] {
        &self.bridges
    }

    /// Decides the fate of every frame in `batch` (received on the port in each buffer's
    /// `port` field) at time `now`, filling `batch`'s verdicts. Learns source addresses; frames
    /// for a router interface are routed (rewritten in place). Frames the router makes (ARP
    /// replies, ICMP, released packets) are appended to the batch with their own verdicts.
    /// Processes at most [`BATCH_SIZE`] received frames; allocates nothing once warm; takes no
    /// lock unless a table changes.
    pub fn process(&self, w: &mut Worker, now: Instant, batch: &mut Batch) {
        batch.verdicts.clear();
        let n = batch.bufs.len().min(BATCH_SIZE);
        // Pass 1: count, parse, locate source and destination in the FDB and prefetch their
        // buckets, so pass 2's table accesses overlap their cache misses.
        let mut pre: [Pre; BATCH_SIZE] = [Pre::drop(DropReason::Truncated); BATCH_SIZE];
        let mut src_loc = [Loc::default(); BATCH_SIZE];
        let mut dst_loc = [Loc::default(); BATCH_SIZE];
        // rx counters are summed per run of frames from one port and stored once per run.
        let (mut run_port, mut run_pkts, mut run_bytes) = (PortId(u16::MAX), 0u64, 0u64);
        let flush = |shard: &Shard, p: PortId, pkts: u64, bytes: u64| {
            if let Some(c) = shard.ports.get(usize::from(p.0)) {
                c.rx_packets.add(pkts);
                c.rx_bytes.add(bytes);
            }
        };
        for b in &batch.bufs[..n] {
            if b.port != run_port {
                flush(&w.shard, run_port, run_pkts, run_bytes);
                (run_port, run_pkts, run_bytes) = (b.port, 0, 0);
            }
            run_pkts += 1;
            run_bytes += b.len() as u64;
        }
        flush(&w.shard, run_port, run_pkts, run_bytes);
        let mut pf = self.ct_prefetch();
        let slots = pre
            .iter_mut()
            .zip(src_loc.iter_mut().zip(dst_loc.iter_mut()));
        for (b, (p, (s, d))) in batch.bufs[..n].iter().zip(slots) {
            *p = self.classify(b, s, d, &mut pf);
        }
        // Pass 2: learn, decide, route.
        let Worker {
            shard,
            pool,
            extra,
            rng,
            flows,
        } = w;
        let mut sink = PoolSink {
            pool,
            out: extra,
            shard,
            overflow: 0,
        };
        let mut l3 = self
            .router
            .as_ref()
            .map(|r| L3Batch::new(r.routes.reader(), rng.clone(), std::mem::take(flows)));
        let nf = self.router.as_ref().and_then(|r| r.nf.as_ref());
        let mut out = [Verdict::Local; BATCH_SIZE];
        let mut tally = [0u64; 4];
        let slots = pre.iter().zip(src_loc.iter().zip(dst_loc.iter()));
        for ((b, (p, (s, d))), o) in batch.bufs[..n].iter_mut().zip(slots).zip(out.iter_mut()) {
            let v = if p.kind == BRIDGE {
                self.bridged(b, *p, s, d, now, nf, &mut l3, &mut sink)
            } else {
                self.decide(b, p, now, &mut l3, &mut sink)
            };
            *o = v;
            match v {
                Verdict::Drop(r) => shard.count_drop(r),
                Verdict::Output(_) => tally[0] += 1,
                Verdict::Flood(_) => tally[1] += 1,
                Verdict::Local => tally[2] += 1,
                Verdict::Queued => tally[3] += 1,
            }
        }
        batch.verdicts.extend_from_slice(&out[..n]);
        shard.forwarded.add(tally[0]);
        shard.flooded.add(tally[1]);
        shard.local.add(tally[2]);
        shard.queued.add(tally[3]);
        // Frames past BATCH_SIZE (a caller that overfilled the batch) are dropped, counted.
        for _ in n..batch.bufs.len() {
            batch.verdicts.push(Verdict::Drop(DropReason::Oversize));
            shard.count_drop(DropReason::Oversize);
        }
        if let Some(l3) = l3 {
            *rng = l3.rng;
            *flows = l3.nf_memo;
        }
        let overflow = sink.overflow;
        self.append_extra(shard, extra, overflow, batch, now);
    }

    /// Gives each frame the router made its egress verdict and appends it to `batch`.
    fn append_extra(
        &self,
        shard: &Shard,
        extra: &mut Vec<(PacketBuf, IfaceId)>,
        overflow: u64,
        batch: &mut Batch,
        now: Instant,
    ) {
        shard.generated_lost.add(overflow);
        for (mut b, via) in extra.drain(..) {
            let v = self.egress(via, &mut b, now);
            shard.generated.add(1);
            batch.bufs.push(b);
            batch.verdicts.push(v);
        }
    }

    /// Pass 1's conntrack prefetcher for this batch, when the table is big enough for its
    /// buckets to miss the cache (a small table stays cached: hashing twice would only cost).
    #[inline]
    fn ct_prefetch(&self) -> Option<CtPrefetch<'_>> {
        let nf = self.router.as_ref()?.nf.as_ref()?;
        (nf.conntrack().len() >= CT_PREFETCH_MIN).then_some(CtPrefetch { nf, last: [0; 2] })
    }

    /// Everything about a frame that needs no table access; for a bridged frame, also where
    /// its addresses live in the FDB (`src`, `dst`), with their buckets prefetched so pass 2's
    /// table accesses overlap their cache misses.
    #[inline]
    fn classify(
        &self,
        b: &PacketBuf,
        src: &mut Loc,
        dst: &mut Loc,
        pf: &mut Option<CtPrefetch<'_>>,
    ) -> Pre {
        let Some(port) = self.ports.get(usize::from(b.port.0)) else {
            return Pre::drop(DropReason::UnknownPort);
        };
        if b.oversize {
            return Pre::drop(DropReason::Oversize);
        }
        let f = b.frame();
        let Some(h) = f.first_chunk::<14>() else {
            return Pre::drop(DropReason::Truncated);
        };
        // Both addresses as 48-bit words with one 8-byte load each (the FDB's key form): the
        // group bit is bit 0 of the first byte, so bit 0 of the word.
        let (Some(d8), Some(s8)) = (h.first_chunk::<8>(), h.last_chunk::<8>()) else {
            return Pre::drop(DropReason::Truncated);
        };
        let dst_w = u64::from_le_bytes(*d8) & MAC48;
        let src_w = u64::from_le_bytes(*s8);
        let src_w = src_w & MAC48;
        if src_w & 1 != 0 {
            return Pre::drop(DropReason::MulticastSource);
        }
        if src_w == 0 {
            return Pre::drop(DropReason::ZeroSource);
        }
        let mut p = Pre {
            kind: BRIDGE,
            flags: 0,
            id: 0,
        };
        // A tagged frame must carry its whole tags.
        if is_vlan_type(u16::from_be_bytes([h[12], h[13]])) {
            if let Err(r) = EthMeta::parse(f) {
                return Pre::drop(r);
            }
        }
        if dst_w & 1 != 0 {
            p.flags |= GROUP_DST;
        }
        match port.kind {
            PortKind::External => {}
            PortKind::Routed(iface) => {
                let ours = self
                    .router
                    .as_ref()
                    .and_then(|r| r.iface(iface))
                    .is_some_and(|i| crate::l2::fdb::word(i.cfg.mac) == dst_w);
                p.kind = ROUTED;
                p.id = iface.0;
                if ours {
                    p.flags |= OURS;
                    if let Some(pf) = pf {
                        pf.frame(f);
                    }
                }
                return p;
            }
            // A router interface's virtual port has no driver: nothing is received on it.
            PortKind::RouterVirtual(_) => return Pre::drop(DropReason::UnknownPort),
        }
        let Some(br) = port.bridge else {
            return Pre::drop(DropReason::NoBridge);
        };
        p.id = br.0;
        let bridge = &self.bridges[usize::from(br.0)];
        let fdb = &bridge.fdb;
        *src = fdb.locate_word(src_w);
        fdb.prefetch_loc(src);
        if p.flags & GROUP_DST != 0 {
            // 01:80:c2:00:00:00 (STP BPDUs) is flooded by a bridge without STP, as Linux
            // does; the rest of the 802.1D reserved range stays on the link.
            let d = crate::wire::mac::MacAddr([h[0], h[1], h[2], h[3], h[4], h[5]]);
            if d.is_link_local() && d.0[5] != 0 {
                p.flags |= LINK_LOCAL;
            }
        } else {
            *dst = fdb.locate_word(dst_w);
            fdb.prefetch_loc(dst);
            if let (Some(pf), true) = (pf, dst_w == bridge.router_mac) {
                pf.frame(f);
            }
        }
        p
    }

    /// The verdict for a frame that is not bridged: routed (on a router's own port) or
    /// dropped in pass 1.
    #[inline]
    fn decide(
        &self,
        b: &mut PacketBuf,
        pre: &Pre,
        now: Instant,
        l3: &mut Option<L3Batch<'_>>,
        sink: &mut PoolSink,
    ) -> Verdict {
        let p = *pre;
        if p.kind != ROUTED {
            return Verdict::Drop(p.reason());
        }
        if p.flags & (OURS | GROUP_DST) == 0 {
            return Verdict::Drop(DropReason::NotForRouter);
        }
        self.route(b, &L3Hint::of(b), IfaceId(p.id), now, l3.as_mut(), sink)
    }

    /// The verdict for a frame received on a port of bridge `pre.id`: learn its source, then
    /// forward to the learned port, flood, or hand it to the bridge's router interface.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    fn bridged(
        &self,
        b: &mut PacketBuf,
        p: Pre,
        src: &Loc,
        dst: &Loc,
        now: Instant,
        nf: Option<&crate::nat::netfilter::Netfilter>,
        l3: &mut Option<L3Batch<'_>>,
        sink: &mut PoolSink,
    ) -> Verdict {
        let Some(br) = self.bridges.get(usize::from(p.id)) else {
            return Verdict::Drop(DropReason::NoBridge);
        };
        let in_port = b.port;
        br.fdb.learn_loc(src, in_port, now);
        if p.flags != 0 {
            return self.bridged_group(br, b, p, now, sink);
        }
        let v = match br.fdb.lookup_loc(dst, now) {
            Some(o) if o == in_port => return Verdict::Drop(DropReason::SamePort),
            Some(o) => match br.router {
                Some((iface, rp)) if rp == o => {
                    return self.route(b, &L3Hint::of(b), iface, now, l3.as_mut(), sink)
                }
                _ => Verdict::Output(o),
            },
            None => Self::flood(br, BridgeId(p.id)),
        };
        // br_netfilter: switched IPv4 of a NAT'd connection is translated here.
        if let Some(nf) = nf {
            let meta = L3Hint::of(b);
            if meta.ether_type == 0x0800 && !meta.tagged {
                match nf.bridged(b, usize::from(meta.l3), now) {
                    crate::nat::netfilter::Hook::Accept => {}
                    crate::nat::netfilter::Hook::Drop(r) => return Verdict::Drop(r),
                    crate::nat::netfilter::Hook::Reject { .. } => {
                        return Verdict::Drop(DropReason::NoEndpoint)
                    }
                }
            }
        }
        v
    }

    /// A bridge floods to its other ports; with none, the frame has nowhere to go.
    #[inline]
    fn flood(br: &Bridge, bid: BridgeId) -> Verdict {
        if br.ports.len() > 1 {
            Verdict::Flood(bid)
        } else {
            Verdict::Drop(DropReason::NoOtherPort)
        }
    }

    /// [`Datapath::bridged`] for a group destination (source already learned): reserved
    /// link-local groups stay on the link; the rest is flooded, and the bridge's router
    /// interface sees it too (ARP requests, broadcasts).
    #[inline(never)]
    fn bridged_group(
        &self,
        br: &Bridge,
        b: &mut PacketBuf,
        p: Pre,
        now: Instant,
        sink: &mut PoolSink,
    ) -> Verdict {
        if p.flags & LINK_LOCAL != 0 {
            return Verdict::Drop(DropReason::LinkLocal);
        }
        if let (Some((iface, _)), Some(r)) = (br.router, &self.router) {
            let meta = L3Hint::of(b);
            r.observe(
                b.frame(),
                usize::from(meta.l3),
                meta.ether_type,
                iface,
                now,
                sink,
            );
        }
        Self::flood(br, BridgeId(p.id))
    }

    /// Hands a frame addressed to router interface `iface` to the router.
    #[inline]
    fn route(
        &self,
        b: &mut PacketBuf,
        meta: &L3Hint,
        iface: IfaceId,
        now: Instant,
        l3: Option<&mut L3Batch<'_>>,
        sink: &mut PoolSink,
    ) -> Verdict {
        let (Some(r), Some(ctx)) = (&self.router, l3) else {
            return Verdict::Drop(DropReason::NotForRouter);
        };
        if meta.tagged {
            return Verdict::Drop(DropReason::UnsupportedProtocol);
        }
        match r.input(
            b,
            usize::from(meta.l3),
            meta.ether_type,
            iface,
            ctx,
            now,
            sink,
        ) {
            L3::Forward(out) => self.egress_memo(out, b, now, &mut ctx.egress),
            L3::Local => Verdict::Local,
            L3::Queued => Verdict::Queued,
            L3::Drop(reason) => Verdict::Drop(reason),
        }
    }

    /// [`Datapath::egress`] remembering its last output-port decision for one batch: a run
    /// of frames to one next hop does the far bridge's FDB lookup once.
    #[inline]
    fn egress_memo(
        &self,
        via: IfaceId,
        b: &mut PacketBuf,
        now: Instant,
        memo: &mut Option<(IfaceId, crate::wire::mac::MacAddr, PortId)>,
    ) -> Verdict {
        let dst = match b.frame().get(..6) {
            Some(d) => crate::wire::mac::MacAddr::from_slice(d),
            None => return Verdict::Drop(DropReason::Truncated),
        };
        if let Some((i, m, p)) = *memo {
            if i == via && m == dst {
                if let Some(iface) = self.router.as_ref().and_then(|r| r.iface(via)) {
                    b.port = iface.port;
                    return Verdict::Output(p);
                }
            }
        }
        let v = self.egress(via, b, now);
        if let Verdict::Output(p) = v {
            *memo = Some((via, dst, p));
        }
        v
    }

    /// The verdict for a frame the router sends out of interface `via` (its MACs are set):
    /// onto the interface's bridge, as if received on its virtual port, or out of its own port.
    fn egress(&self, via: IfaceId, b: &mut PacketBuf, now: Instant) -> Verdict {
        let Some(iface) = self.router.as_ref().and_then(|r| r.iface(via)) else {
            return Verdict::Drop(DropReason::NoRoute);
        };
        b.port = iface.port;
        let Some(bid) = iface.bridge else {
            return Verdict::Output(iface.port);
        };
        let br = &self.bridges[usize::from(bid.0)];
        let dst = match b.frame().get(..6) {
            Some(d) => crate::wire::mac::MacAddr::from_slice(d),
            None => return Verdict::Drop(DropReason::Truncated),
        };
        if dst.is_multicast() {
            return Verdict::Flood(bid);
        }
        // The router does not learn: its MAC is a static entry on its virtual port.
        match br.fdb.lookup(dst, now) {
            Some(p) if p == iface.port => Verdict::Drop(DropReason::SamePort),
            Some(p) => Verdict::Output(p),
            None => Verdict::Flood(bid),
        }
    }

    /// As [`Datapath::dispatch`], but hands the transmit closure runs of consecutive frames
    /// for one port (`tx(port, frames, done)`, calling `done(i, result)` for each frame), so a
    /// port can send a run with one lock or one system call. Order per port is kept.
    pub fn dispatch_runs<F>(&self, w: &mut Worker, batch: &Batch, mut tx: F)
    where
        F: FnMut(PortId, &[&PacketBuf], &mut dyn FnMut(usize, Result<(), DropReason>)),
    {
        let shard = &w.shard;
        let Some(first) = batch.bufs.first() else {
            return;
        };
        let mut run: [&PacketBuf; RUN_MAX] = [first; RUN_MAX];
        let mut n = 0usize;
        let mut run_port = PortId(u16::MAX);
        let mut flush = |p: PortId, run: &[&PacketBuf]| {
            if run.is_empty() {
                return;
            }
            let Some(c) = shard.ports.get(usize::from(p.0)) else {
                return;
            };
            let (mut pk, mut by) = (0u64, 0u64);
            tx(p, run, &mut |i, r| match r {
                Ok(()) => {
                    pk += 1;
                    by += run.get(i).map_or(0, |b| b.len() as u64);
                }
                Err(reason) => {
                    c.tx_dropped.add(1);
                    shard.count_drop(reason);
                }
            });
            c.tx_packets.add(pk);
            c.tx_bytes.add(by);
        };
        for (b, v) in batch.bufs.iter().zip(batch.verdicts.iter()) {
            match *v {
                Verdict::Output(p) => {
                    if p != run_port || n == RUN_MAX {
                        flush(run_port, &run[..n]);
                        run_port = p;
                        n = 0;
                    }
                    run[n] = b;
                    n += 1;
                }
                Verdict::Flood(bid) => {
                    flush(run_port, &run[..n]);
                    n = 0;
                    run_port = PortId(u16::MAX);
                    if let Some(br) = self.bridge(bid) {
                        for &p in br.ports.iter() {
                            if p != b.port && !self.is_virtual(p) {
                                flush(p, &[b]);
                            }
                        }
                    }
                }
                Verdict::Drop(_) | Verdict::Local | Verdict::Queued => {}
            }
        }
        flush(run_port, &run[..n]);
    }

    /// Calls `tx(port, frame)` for every output of every frame in `batch`, in order (a flooded
    /// frame once per other external port of its bridge). `tx` returns `Err(reason)` when the
    /// port did not take the frame; that is counted as the port's `tx_dropped` and under
    /// `reason`.
    pub fn dispatch<F>(&self, w: &mut Worker, batch: &Batch, mut tx: F)
    where
        F: FnMut(PortId, &PacketBuf) -> Result<(), DropReason>,
    {
        self.dispatch_runs(w, batch, |p, run, done| {
            for (i, b) in run.iter().enumerate() {
                done(i, tx(p, b));
            }
        });
    }

    #[inline]
    fn is_virtual(&self, p: PortId) -> bool {
        matches!(
            self.ports.get(usize::from(p.0)).map(|p| p.kind),
            Some(PortKind::RouterVirtual(_))
        )
    }

    /// Runs timers due at `now`: the router's ARP retransmissions and failures (the frames they
    /// make are appended to `out` with their verdicts, for [`Datapath::dispatch`]) and, about
    /// once a second, the FDB aging sweep. Call it every [`Datapath::poll_interval`]; lookups
    /// never wait for it.
    pub fn poll(&self, w: &mut Worker, now: Instant, out: &mut Batch) {
        let last = self.last_sweep.load(Ordering::Relaxed);
        if now.micros().saturating_sub(last) >= 1_000_000
            && self
                .last_sweep
                .compare_exchange(last, now.micros(), Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            for b in &self.bridges {
                b.fdb.sweep(now);
            }
        }
        let Some(r) = &self.router else { return };
        if let Some(nf) = &r.nf {
            nf.sweep(now, CT_SWEEP_BUDGET);
        }
        let Worker {
            shard, pool, extra, ..
        } = w;
        let mut sink = PoolSink {
            pool,
            out: extra,
            shard,
            overflow: 0,
        };
        r.poll(now, &mut sink);
        let overflow = sink.overflow;
        self.append_extra(shard, extra, overflow, out, now);
    }

    /// How often [`Datapath::poll`] should run.
    pub fn poll_interval(&self) -> Duration {
        if self.router.is_some() {
            Duration::from_millis(100)
        } else {
            Duration::from_secs(1)
        }
    }

    /// The router, if the datapath has router interfaces.
    pub fn router(&self) -> Option<&Router> {
        self.router.as_ref()
    }

    /// Conntrack and NAT, if the datapath was built with [`DatapathBuilder::netfilter`].
    pub fn netfilter(&self) -> Option<&crate::nat::netfilter::Netfilter> {
        self.router.as_ref().and_then(|r| r.nf.as_ref())
    }

    /// The routing table, if the datapath has a router.
    pub fn routes(&self) -> Option<&RouteTable> {
        self.router.as_ref().map(|r| &r.routes)
    }

    /// The router interface called `name`.
    pub fn iface_by_name(&self, name: &str) -> Option<IfaceId> {
        let r = self.router.as_ref()?;
        r.ifaces
            .iter()
            .position(|i| i.cfg.name == name)
            .map(|i| IfaceId(i as u16))
    }

    /// The name of a router interface.
    pub fn iface_name(&self, i: IfaceId) -> Option<&str> {
        self.router.as_ref()?.iface(i).map(|i| i.cfg.name.as_str())
    }

    /// Adds a route, checking it against the interfaces: the interface must exist, and a
    /// gateway must be on a connected subnet (as Linux's "Nexthop has invalid gateway").
    pub fn add_route(&self, r: Route) -> Result<(), crate::l3::route::RouteError> {
        let Some(router) = &self.router else {
            return Err(crate::l3::route::RouteError::NoInterface(0));
        };
        self.check_route(router, &r)?;
        router.routes.add(r)
    }

    /// Removes the route to `prefix/len` with `metric` (the best one if `None`), as `ip route
    /// del`.
    pub fn remove_route(
        &self,
        prefix: std::net::Ipv4Addr,
        len: u8,
        metric: Option<u32>,
    ) -> Result<Route, crate::l3::route::RouteError> {
        let Some(router) = &self.router else {
            return Err(crate::l3::route::RouteError::NotFound(prefix, len));
        };
        router.routes.remove(prefix, len, metric)
    }

    /// Adds a route or replaces the one with the same prefix, length and metric in one
    /// update (`ip route replace`), checked as [`Datapath::add_route`]. Returns the route
    /// replaced.
    pub fn replace_route(&self, r: Route) -> Result<Option<Route>, crate::l3::route::RouteError> {
        let Some(router) = &self.router else {
            return Err(crate::l3::route::RouteError::NoInterface(0));
        };
        self.check_route(router, &r)?;
        router.routes.replace(r)
    }

    fn check_route(&self, router: &Router, r: &Route) -> Result<(), crate::l3::route::RouteError> {
        if let Some(i) = r.next_hop.iface() {
            if router.iface(i).is_none() {
                return Err(crate::l3::route::RouteError::NoInterface(i.0));
            }
        }
        if let NextHop::Via(i, gw) = r.next_hop {
            let on_link = matches!(router.routes.lookup(gw), Some(NextHop::Link(j)) if j == i);
            if !on_link {
                return Err(crate::l3::route::RouteError::GatewayNotOnLink(gw));
            }
        }
        Ok(())
    }

    /// Removes a permanent neighbour entry (`ip neigh del IP dev IFACE`); `false` when there
    /// was no permanent entry for `ip` on `iface` (dynamic entries are left alone).
    pub fn remove_static_neigh(&self, iface: IfaceId, ip: std::net::Ipv4Addr) -> bool {
        let Some(r) = &self.router else { return false };
        let permanent = r.neigh.dump(Instant::ZERO).iter().any(|e| {
            e.iface == iface.0 && e.ip == ip && e.state == crate::l3::neigh::NeighState::Permanent
        });
        permanent && r.neigh.remove(iface, ip)
    }

    /// Adds a permanent neighbour entry (`ip neigh add IP lladdr MAC dev IFACE nud permanent`).
    /// Packets that were waiting for `ip` stay queued until the next batch; they are released
    /// the next time the neighbour is used. Errors name the bad value.
    pub fn add_static_neigh(
        &self,
        iface: IfaceId,
        ip: std::net::Ipv4Addr,
        mac: crate::wire::mac::MacAddr,
        now: Instant,
    ) -> Result<(), crate::l3::neigh::NeighError> {
        let Some(r) = &self.router else {
            return Err(crate::l3::neigh::NeighError::BadAddress(ip));
        };
        r.neigh.add_static(iface, ip, mac, now).map(|_| ())
    }

    /// Writes the routing table like `ip route show`.
    pub fn fmt_routes(&self, out: &mut impl fmt::Write) -> fmt::Result {
        let Some(r) = &self.router else { return Ok(()) };
        r.routes
            .fmt_routes(out, &|i| self.iface_name(i).unwrap_or("?").to_string())
    }

    /// Writes the neighbour table like `ip neigh show`.
    pub fn fmt_neigh(&self, now: Instant, out: &mut impl fmt::Write) -> fmt::Result {
        let Some(r) = &self.router else { return Ok(()) };
        r.neigh.fmt_dump(now, out, &|i| {
            self.iface_name(IfaceId(i)).unwrap_or("?").to_string()
        })
    }

    /// The FDB of `bridge` at `now`, like `bridge fdb show br <bridge>`.
    pub fn fdb_dump(&self, bridge: BridgeId, now: Instant) -> Vec<FdbEntry> {
        self.bridge(bridge)
            .map_or_else(Vec::new, |b| b.fdb.dump(now))
    }

    /// Writes every bridge's FDB in the style of `bridge fdb show`.
    pub fn fmt_fdb(&self, now: Instant, out: &mut impl fmt::Write) -> fmt::Result {
        for b in &self.bridges {
            for e in b.fdb.dump(now) {
                let port = self.port_name(e.port).unwrap_or("?");
                match e.age {
                    None => writeln!(out, "{} dev {} master {} static", e.mac, port, b.name)?,
                    Some(a) => writeln!(
                        out,
                        "{} dev {} master {} age {:.1}s",
                        e.mac,
                        port,
                        b.name,
                        a.as_secs_f64()
                    )?,
                }
            }
        }
        Ok(())
    }

    /// A snapshot of every counter, summed over workers.
    pub fn stats(&self) -> StatsSnapshot {
        let shards = self.shards.lock().clone();
        StatsSnapshot::sum(&self.names, &shards)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::mac::MacAddr;
    use proptest::prelude::*;
    use std::collections::HashMap;

    fn frame(dst: MacAddr, src: MacAddr) -> Vec<u8> {
        let mut f = Vec::with_capacity(60);
        f.extend_from_slice(&dst.0);
        f.extend_from_slice(&src.0);
        f.extend_from_slice(&[0x08, 0x00]);
        f.resize(60, 0);
        f
    }

    fn run(dp: &Datapath, w: &mut Worker, now: Instant, port: PortId, f: &[u8]) -> Vec<PortId> {
        let mut batch = Batch::new();
        let mut b = PacketBuf::from_frame(f);
        b.port = port;
        batch.push(b).unwrap();
        dp.process(w, now, &mut batch);
        let mut out = Vec::new();
        dp.dispatch(w, &batch, |p, _| {
            out.push(p);
            Ok(())
        });
        out
    }

    fn two_bridges() -> (Datapath, [PortId; 5]) {
        let mut b = Datapath::builder();
        let b0 = b.add_bridge(BridgeConfig::new("br0")).unwrap();
        let b1 = b.add_bridge(BridgeConfig::new("br1")).unwrap();
        let p = [
            b.add_port("a0", Some(b0)).unwrap(),
            b.add_port("a1", Some(b0)).unwrap(),
            b.add_port("a2", Some(b0)).unwrap(),
            b.add_port("b0", Some(b1)).unwrap(),
            b.add_port("b1", Some(b1)).unwrap(),
        ];
        (b.build(), p)
    }

    #[test]
    fn floods_unknown_then_forwards_learned_and_never_crosses_bridges() {
        let (dp, p) = two_bridges();
        let mut w = dp.worker();
        let (x, y) = (MacAddr::local(1), MacAddr::local(2));
        let t = Instant::ZERO;
        assert_eq!(run(&dp, &mut w, t, p[0], &frame(y, x)), vec![p[1], p[2]]);
        assert_eq!(run(&dp, &mut w, t, p[1], &frame(x, y)), vec![p[0]]);
        assert_eq!(run(&dp, &mut w, t, p[0], &frame(y, x)), vec![p[1]]);
        assert_eq!(
            run(&dp, &mut w, t, p[0], &frame(MacAddr::BROADCAST, x)),
            vec![p[1], p[2]]
        );
        // The other bridge knows nothing of x and y.
        assert_eq!(run(&dp, &mut w, t, p[3], &frame(x, y)), vec![p[4]]);
        assert_eq!(run(&dp, &mut w, t, p[4], &frame(y, x)), vec![p[3]]);
        let s = dp.stats();
        assert_eq!(s.port("a0").unwrap().rx_packets, 3);
        assert_eq!(s.port("a1").unwrap().tx_packets, 3);
        assert_eq!(s.forwarded + s.flooded + s.rx_drops(), 6);
    }

    #[test]
    fn every_drop_reason_survives_pass_one() {
        for r in DropReason::ALL {
            assert_eq!(Pre::drop(r).reason(), r);
        }
    }

    #[test]
    fn drops_are_counted_by_reason() {
        let (dp, p) = two_bridges();
        let mut w = dp.worker();
        let t = Instant::ZERO;
        let x = MacAddr::local(1);
        assert!(run(&dp, &mut w, t, p[0], &frame(x, MacAddr::BROADCAST)).is_empty());
        assert!(run(&dp, &mut w, t, p[0], &frame(x, MacAddr::ZERO)).is_empty());
        assert!(run(&dp, &mut w, t, p[0], &[1, 2, 3]).is_empty());
        assert!(run(&dp, &mut w, t, PortId(99), &frame(x, x)).is_empty());
        let lacp = MacAddr([0x01, 0x80, 0xc2, 0, 0, 0x02]);
        assert!(run(&dp, &mut w, t, p[1], &frame(lacp, MacAddr::local(5))).is_empty());
        let stp = MacAddr([0x01, 0x80, 0xc2, 0, 0, 0x00]);
        assert_eq!(
            run(&dp, &mut w, t, p[1], &frame(stp, MacAddr::local(5))).len(),
            2
        );
        // Destination learned on the ingress port: not sent back.
        run(&dp, &mut w, t, p[0], &frame(MacAddr::BROADCAST, x));
        assert!(run(&dp, &mut w, t, p[0], &frame(x, MacAddr::local(7))).is_empty());
        let s = dp.stats();
        for r in [
            DropReason::MulticastSource,
            DropReason::ZeroSource,
            DropReason::Truncated,
            DropReason::UnknownPort,
            DropReason::LinkLocal,
            DropReason::SamePort,
        ] {
            assert_eq!(s.drop_count(r), 1, "{r}");
        }
        // A failing port counts tx drops.
        let mut batch = Batch::new();
        let mut b = PacketBuf::from_frame(&frame(MacAddr::BROADCAST, x));
        b.port = p[0];
        batch.push(b).unwrap();
        dp.process(&mut w, t, &mut batch);
        dp.dispatch(&mut w, &batch, |_, _| Err(DropReason::TxError));
        let s = dp.stats();
        assert_eq!(s.drop_count(DropReason::TxError), 2);
        assert_eq!(s.port("a1").unwrap().tx_dropped, 1);
    }

    #[test]
    fn builder_rejects_bad_topology_with_named_errors() {
        let mut b = Datapath::builder();
        let br = b.add_bridge(BridgeConfig::new("br0")).unwrap();
        let e = b.add_bridge(BridgeConfig::new("br0")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "bridge name \"br0\" is used twice; names must be unique"
        );
        b.add_port("tap0", Some(br)).unwrap();
        assert!(b.add_port("tap0", Some(br)).is_err());
        assert!(b.add_port("a-very-long-interface-name", Some(br)).is_err());
        assert!(b.add_port("x", Some(BridgeId(7))).is_err());
        let mut c = BridgeConfig::new("br1");
        c.fdb_max_entries = 0;
        assert!(b
            .add_bridge(c)
            .unwrap_err()
            .to_string()
            .contains("fdb_max_entries = 0"));
    }

    #[test]
    fn station_moves_are_relearned_at_once() {
        let (dp, p) = two_bridges();
        let mut w = dp.worker();
        let (x, y) = (MacAddr::local(1), MacAddr::local(2));
        let t = Instant::ZERO;
        run(&dp, &mut w, t, p[0], &frame(MacAddr::BROADCAST, x));
        run(&dp, &mut w, t, p[1], &frame(MacAddr::BROADCAST, y));
        assert_eq!(run(&dp, &mut w, t, p[1], &frame(x, y)), vec![p[0]]);
        run(&dp, &mut w, t, p[2], &frame(MacAddr::BROADCAST, x)); // x moved to a2
        assert_eq!(run(&dp, &mut w, t, p[1], &frame(x, y)), vec![p[2]]);
    }

    proptest! {
        /// The datapath's output ports match a plain-HashMap learning bridge for any sequence
        /// of frames on a 4-port bridge (table large enough, no aging in play).
        #[test]
        fn bridge_matches_hashmap_model(
            frames in proptest::collection::vec((0u16..4, 0u8..8, 0u8..8), 1..200)
        ) {
            let mut b = Datapath::builder();
            let br = b.add_bridge(BridgeConfig::new("br")).unwrap();
            let ports: Vec<_> = (0..4).map(|i| b.add_port(format!("p{i}"), Some(br)).unwrap()).collect();
            let dp = b.build();
            let mut w = dp.worker();
            let mut model: HashMap<MacAddr, PortId> = HashMap::new();
            let macs: Vec<MacAddr> = (0..7).map(|i| MacAddr::local(i + 1)).chain([MacAddr::BROADCAST]).collect();
            for (i, (inp, s, d)) in frames.into_iter().enumerate() {
                let (src, dst) = (macs[usize::from(s)], macs[usize::from(d)]);
                let inp = ports[usize::from(inp)];
                let got = run(&dp, &mut w, Instant::from_millis(i as u64), inp, &frame(dst, src));
                let want: Vec<PortId> = if src.is_multicast() {
                    vec![]
                } else {
                    model.insert(src, inp);
                    match model.get(&dst) {
                        Some(&p) if !dst.is_multicast() => if p == inp { vec![] } else { vec![p] },
                        _ => ports.iter().copied().filter(|&p| p != inp).collect(),
                    }
                };
                prop_assert_eq!(got, want);
            }
            let s = dp.stats();
            let rx: u64 = s.ports.iter().map(|p| p.rx_packets).sum();
            prop_assert_eq!(rx, s.forwarded + s.flooded + s.rx_drops());
        }
    }
}
