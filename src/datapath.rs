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
//! (see [`crate::fdb`]). The topology is fixed when the datapath is built.
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
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use crate::buf::{Batch, BufPool, PacketBuf, BATCH_SIZE};
use crate::fdb::{Fdb, FdbEntry, DEFAULT_AGING, DEFAULT_MAX_ENTRIES};
use crate::stats::{DropReason, Shard, StatsSnapshot};
use crate::time::Instant;
use crate::wire::EthMeta;

/// A port's index in its datapath.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct PortId(pub u16);

/// A bridge's index in its datapath.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct BridgeId(pub u16);

/// The table-free part of a frame's classification (pass 1 of [`Datapath::process`]).
#[derive(Clone, Copy)]
enum Pre {
    Drop(DropReason),
    Bridge {
        br: BridgeId,
        src: crate::fdb::Loc,
        dst: Option<crate::fdb::Loc>,
        link_local: bool,
    },
}

/// What the datapath decided for one frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Send on this port.
    Output(PortId),
    /// Send on every port of this bridge except the one it came in on.
    Flood(BridgeId),
    /// Do not send; counted under this reason.
    Drop(DropReason),
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

struct PortInfo {
    name: String,
    bridge: Option<BridgeId>,
}

/// One L2 bridge: its ports and its FDB.
pub struct Bridge {
    name: String,
    ports: Vec<PortId>,
    fdb: Fdb,
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
        let name = name.into();
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
        self.ports.push(PortInfo { name, bridge });
        Ok(id)
    }

    /// Finishes the datapath.
    pub fn build(self) -> Datapath {
        Datapath {
            names: self.ports.iter().map(|p| p.name.clone()).collect(),
            ports: self.ports,
            bridges: self.bridges,
            shards: Mutex::new(Vec::new()),
        }
    }
}

/// The shared, sans-IO packet processor (see the module docs).
pub struct Datapath {
    ports: Vec<PortInfo>,
    names: Vec<String>,
    bridges: Vec<Bridge>,
    shards: Mutex<Vec<Arc<Shard>>>,
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
        Worker { shard, pool }
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
    /// `port` field) at time `now`, filling `batch`'s verdicts. Learns source addresses.
    /// Processes at most [`BATCH_SIZE`] frames; allocates nothing; takes no lock unless a new
    /// station is learned.
    pub fn process(&self, w: &mut Worker, now: Instant, batch: &mut Batch) {
        batch.verdicts.clear();
        let n = batch.bufs.len().min(BATCH_SIZE);
        // Pass 1: count, parse, locate source and destination in the FDB and prefetch their
        // buckets, so pass 2's table accesses overlap their cache misses.
        let mut pre: [Pre; BATCH_SIZE] = [Pre::Drop(DropReason::Truncated); BATCH_SIZE];
        for (i, b) in batch.bufs[..n].iter().enumerate() {
            if let Some(c) = w.shard.ports.get(usize::from(b.port.0)) {
                c.rx_packets.add(1);
                c.rx_bytes.add(b.len() as u64);
            }
            pre[i] = self.classify(b);
            if let Pre::Bridge { br, src, dst, .. } = &pre[i] {
                let fdb = &self.bridges[usize::from(br.0)].fdb;
                fdb.prefetch_loc(src);
                if let Some(d) = dst {
                    fdb.prefetch_loc(d);
                }
            }
        }
        // Pass 2: learn and decide.
        for (b, p) in batch.bufs[..n].iter().zip(pre.iter()) {
            let v = self.decide(b.port, p, now);
            match v {
                Verdict::Drop(r) => w.shard.count_drop(r),
                Verdict::Output(_) => w.shard.forwarded.add(1),
                Verdict::Flood(_) => w.shard.flooded.add(1),
            }
            batch.verdicts.push(v);
        }
        // Frames past BATCH_SIZE (a caller that overfilled the batch) are dropped, counted.
        for _ in n..batch.bufs.len() {
            batch.verdicts.push(Verdict::Drop(DropReason::Oversize));
            w.shard.count_drop(DropReason::Oversize);
        }
    }

    /// Everything about a frame that needs no table access.
    #[inline]
    fn classify(&self, b: &PacketBuf) -> Pre {
        let Some(port) = self.ports.get(usize::from(b.port.0)) else {
            return Pre::Drop(DropReason::UnknownPort);
        };
        if b.oversize {
            return Pre::Drop(DropReason::Oversize);
        }
        let m = match EthMeta::parse(b.frame()) {
            Ok(m) => m,
            Err(r) => return Pre::Drop(r),
        };
        let Some(br) = port.bridge else {
            return Pre::Drop(DropReason::NoBridge);
        };
        if m.src.is_multicast() {
            return Pre::Drop(DropReason::MulticastSource);
        }
        if m.src.is_zero() {
            return Pre::Drop(DropReason::ZeroSource);
        }
        // 01:80:c2:00:00:00 (STP BPDUs) is flooded by a bridge without STP, as Linux does; the
        // rest of the 802.1D reserved range stays on the link.
        let link_local = m.dst.is_link_local() && m.dst.0[5] != 0;
        let fdb = &self.bridges[usize::from(br.0)].fdb;
        Pre::Bridge {
            br,
            src: fdb.locate(m.src),
            dst: (!m.dst.is_multicast()).then(|| fdb.locate(m.dst)),
            link_local,
        }
    }

    #[inline]
    fn decide(&self, in_port: PortId, pre: &Pre, now: Instant) -> Verdict {
        let (bid, src, dst, link_local) = match pre {
            Pre::Drop(r) => return Verdict::Drop(*r),
            Pre::Bridge {
                br,
                src,
                dst,
                link_local,
            } => (*br, src, dst, *link_local),
        };
        let br = &self.bridges[usize::from(bid.0)];
        br.fdb.learn_loc(src, in_port, now);
        if link_local {
            return Verdict::Drop(DropReason::LinkLocal);
        }
        let flood = if br.ports.len() > 1 {
            Verdict::Flood(bid)
        } else {
            Verdict::Drop(DropReason::NoOtherPort)
        };
        let Some(dst) = dst else {
            return flood;
        };
        match br.fdb.lookup_loc(dst, now) {
            Some(p) if p == in_port => Verdict::Drop(DropReason::SamePort),
            Some(p) => Verdict::Output(p),
            None => flood,
        }
    }

    /// Calls `tx(port, frame)` for every output of every frame in `batch`, in order (a flooded
    /// frame once per other port of its bridge). `tx` returns `Err(reason)` when the port did
    /// not take the frame; that is counted as the port's `tx_dropped` and under `reason`.
    pub fn dispatch<F>(&self, w: &mut Worker, batch: &Batch, mut tx: F)
    where
        F: FnMut(PortId, &PacketBuf) -> Result<(), DropReason>,
    {
        let shard = &w.shard;
        let mut send = |p: PortId, b: &PacketBuf| {
            let Some(c) = shard.ports.get(usize::from(p.0)) else {
                return;
            };
            match tx(p, b) {
                Ok(()) => {
                    c.tx_packets.add(1);
                    c.tx_bytes.add(b.len() as u64);
                }
                Err(r) => {
                    c.tx_dropped.add(1);
                    shard.count_drop(r);
                }
            }
        };
        for (b, v) in batch.bufs.iter().zip(batch.verdicts.iter()) {
            match *v {
                Verdict::Output(p) => send(p, b),
                Verdict::Flood(bid) => {
                    if let Some(br) = self.bridge(bid) {
                        for &p in br.ports.iter().filter(|&&p| p != b.port) {
                            send(p, b);
                        }
                    }
                }
                Verdict::Drop(_) => {}
            }
        }
    }

    /// Runs timers due at `now`: clears aged FDB entries. Call about once a second
    /// (see [`Datapath::poll_interval`]); lookups never wait for it.
    pub fn poll(&self, now: Instant) {
        for b in &self.bridges {
            b.fdb.sweep(now);
        }
    }

    /// How often [`Datapath::poll`] should run.
    pub fn poll_interval(&self) -> Duration {
        Duration::from_secs(1)
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
    use crate::mac::MacAddr;
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
