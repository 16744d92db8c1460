//! Worker threads that drive ports through a [`Datapath`].
//!
//! Each port is received from by exactly one worker (ports are dealt round-robin), each
//! receive queue of a multi-queue port ([`Port::rx_queues`]) by one worker (the queues dealt
//! to consecutive workers); any worker transmits to any port. A worker loops: receive a batch
//! from each of its ports, process it, dispatch it to the output ports, recycle the buffers;
//! when no port had anything it sleeps in `poll(2)` on its ports' file descriptors and a stop
//! eventfd (ports without a descriptor are re-checked every millisecond). Worker 0 also runs the datapath's timers.
//!
//! With [`RuntimeConfig::busy_poll`] a worker that received frames keeps reading its ports
//! (yielding the CPU between rounds) for that long after the last frame before it sleeps, as
//! Linux's busy polling and OVS's PMD threads do: a packet that arrives within the window is
//! read without waking a sleeping thread (the wake-up of a halted vCPU costs tens of
//! microseconds), and an idle runtime backs off to sleeping in `poll(2)`, costing no CPU.
//!
//! [`Runtime::stop`] sets a flag and signals the eventfd; each worker finishes the batch in hand
//! (the datapath keeps no queues of its own, so no frame it accepted is lost) and the threads
//! are joined.
//!
//! # Ports that come and go
//!
//! The drivers live in a port table indexed by [`PortId`] and published RCU-style (one
//! `ArcSwap` store of a new table and a version bump): each table slot is an
//! `Arc<dyn Port>` and the worker that receives from it. Between rounds, a worker compares
//! the version with its own (one atomic load), and on a change takes the new table, rebuilds
//! its receive list and `poll(2)` set, then acknowledges the version. Transmits use the same
//! table, so a worker sends only to ports of the table it acknowledged.
//!
//! * [`Runtime::add_port`] gives a new port to the least-loaded worker and wakes it through
//!   its own eventfd: it receives from the port within one round (microseconds when busy,
//!   at once when asleep).
//! * [`Runtime::remove_port`] publishes a table without the port, wakes every worker and
//!   waits until each has acknowledged it (or exited): then no worker receives from, sends
//!   to or polls the port's descriptor, and the only table that held it is gone. The driver
//!   is returned; its descriptor is closed when the last `Arc` goes (a TAP's fd is closed by
//!   its `Drop`), which can no longer be a worker's, so there is no use after close and no
//!   race with a new descriptor reusing the number. It then removes the port from the
//!   datapath ([`Control::remove_port`]), whose id quarantine keeps the id from a new port
//!   until no worker holds a frame for it.
//!
//! # Pausing: handing the ports to another runtime or process
//!
//! [`Runtime::pause`] stops every worker at a batch boundary: each finishes the round in hand
//! (every frame it received is processed and transmitted, so nothing is left queued in the
//! runtime), acknowledges, and then sleeps on its eventfd without receiving, sending or
//! running timers. When it returns no worker touches a port, and the drivers
//! ([`Runtime::ports`]) are still open: their descriptors can be handed to another process
//! (`tapyard run --takeover`), and frames arriving meanwhile wait in the devices' own queues.
//! [`Runtime::resume`] lets the same workers go on as if nothing happened. Ports can still be
//! added and removed while paused (the handshake is answered by parked workers).
//!
//! For single-threaded, deterministic use (tests, the demo, an embedder's own loop), [`Pump`]
//! does one round of the same work when called.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::base::PortId;
use crate::buf::{Batch, BufPool};
#[cfg(doc)]
use crate::datapath::Control;
use crate::datapath::{Datapath, Worker};
use crate::port::Port;
use crate::stats::DropReason;
use crate::sys::{self, EventFd};
use crate::time::{Clock, Instant};

pub mod local;
mod uring;
use uring::UringIo;

/// How workers read and write the ports that allow it (TAPs: [`Port::raw_rx`],
/// [`Port::raw_tx`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IoMode {
    /// io_uring where the kernel offers it (Linux 5.11 and later, not disabled by
    /// `kernel.io_uring_disabled` or a seccomp filter), the plain path otherwise
    /// ([`Runtime::io_fallback`] says why).
    #[default]
    Auto,
    /// One `read(2)`/`write(2)` per frame, waiting in `poll(2)`.
    Plain,
    /// Batches through io_uring: one system call reads up to a batch of frames from a port,
    /// one writes a run of frames to a port (see the module docs). [`Runtime::start`] fails
    /// where io_uring is unavailable.
    Uring,
}

/// Settings of a [`Runtime`].
#[derive(Clone, Debug)]
pub struct RuntimeConfig {
    /// Worker threads (at least 1; more than the number of ports is pointless until ports are
    /// added with [`Runtime::add_port`]).
    pub workers: usize,
    /// Buffers per worker pool.
    pub pool_buffers: usize,
    /// Busy polling: after a round that received frames, a worker keeps re-reading its ports
    /// (spinning, yielding the CPU between rounds) for this long before it sleeps in
    /// `poll(2)`; every round that receives restarts the window. Zero (the default) never
    /// spins: an idle worker sleeps at once. A window longer than the gap between a pod's
    /// packets saves the wake-up of a sleeping worker (tens of microseconds on a VM) per
    /// packet, at the cost of one busy CPU per worker while traffic flows; an idle runtime
    /// still sleeps once the window has passed. At most [`MAX_BUSY_POLL`].
    pub busy_poll: Duration,
    /// How ports are read and written: io_uring batches where available (the default), or
    /// the plain path.
    pub io: IoMode,
}

/// The longest [`RuntimeConfig::busy_poll`] window: one second.
pub const MAX_BUSY_POLL: Duration = Duration::from_secs(1);

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            workers: 1,
            pool_buffers: 1024,
            busy_poll: Duration::ZERO,
            io: IoMode::Auto,
        }
    }
}

/// A port's driver in a published port table, and the worker that receives from it (from
/// its queue 0: queue `q` of a multi-queue port goes to worker `worker + q`, modulo the
/// number of workers).
#[derive(Clone)]
struct Slot {
    port: Arc<dyn Port>,
    worker: usize,
}

impl Slot {
    /// The worker that receives from queue `q`, of `workers`.
    fn queue_worker(&self, q: usize, workers: usize) -> usize {
        (self.worker + q) % workers.max(1)
    }
}

/// A runtime's or pump's drivers, indexed by [`PortId`] ([`Control::max_ports`] slots).
type Table = Vec<Option<Slot>>;

fn port_table(
    dp: &Datapath,
    ports: &[(PortId, Arc<dyn Port>)],
    workers: usize,
) -> io::Result<Table> {
    let mut t: Table = vec![None; dp.control().max_ports()];
    for (i, (id, p)) in ports.iter().enumerate() {
        let slot = t.get_mut(usize::from(id.0)).ok_or_else(|| no_port(*id))?;
        *slot = Some(Slot {
            port: p.clone(),
            worker: i % workers,
        });
    }
    Ok(t)
}

fn no_port(id: PortId) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("port id {} is not in the datapath", id.0),
    )
}

/// Checks that `port` may be attached under `id`: a live port of `dp` that frames are sent
/// to, with no driver yet, whose frames fit buffers of `room` bytes.
fn check_new_port(
    dp: &Datapath,
    t: &Table,
    id: PortId,
    port: &dyn Port,
    room: usize,
) -> io::Result<()> {
    if !dp.is_sendable(id) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "port id {} is not a live datapath port that takes a driver",
                id.0
            ),
        ));
    }
    match t.get(usize::from(id.0)) {
        None => return Err(no_port(id)),
        Some(Some(_)) => {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("port id {} already has a driver", id.0),
            ))
        }
        Some(None) => {}
    }
    if port.frame_room() > room {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "port id {} needs {}-byte buffers; the pools hold {room} (give a port this \
                 large at start)",
                id.0,
                port.frame_room()
            ),
        ));
    }
    Ok(())
}

/// What a runtime's workers share: the published table and the handshake that changes it.
struct Shared {
    table: ArcSwap<Table>,
    /// Bumped after every table change.
    version: AtomicU64,
    /// Per worker, the version whose table and poll set it uses (`u64::MAX`: exited).
    acks: Box<[AtomicU64]>,
    /// Per worker, the eventfd that wakes it (stop, or a table change).
    wakes: Box<[EventFd]>,
    /// Serialises table changes.
    ctl: Mutex<()>,
    /// Every pool's buffer room.
    room: usize,
    /// Set by [`Runtime::pause`]: workers park at the next round boundary.
    paused: AtomicBool,
    /// Per worker, whether it is inside its busy-poll window (spinning) now.
    spinning: Box<[AtomicBool]>,
    /// Workers using io_uring now (one that fails goes on with the plain path).
    uring_workers: std::sync::atomic::AtomicUsize,
    /// Why the plain path is used: io_uring unavailable at start, or a worker's ring failed.
    io_fallback: Mutex<Option<String>>,
}

impl Shared {
    /// Publishes `t` and returns its version.
    fn publish(&self, t: Table) -> u64 {
        self.table.store(Arc::new(t));
        self.version.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// Bumps the version without changing the table (makes every worker look at its flags
    /// and acknowledge) and returns it.
    fn bump(&self) -> u64 {
        self.version.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// Waits until every worker uses version `v` or a later one, or has exited.
    fn wait_acks(&self, v: u64) {
        for (ack, wake) in self.acks.iter().zip(self.wakes.iter()) {
            let mut spins = 0u32;
            while ack.load(Ordering::Acquire) < v {
                if spins % 64 == 0 {
                    wake.signal();
                }
                spins = spins.wrapping_add(1);
                std::thread::sleep(Duration::from_micros(20));
            }
        }
    }
}

/// A runtime worker's link to the shared table.
struct Link {
    shared: Arc<Shared>,
    index: usize,
    version: u64,
}

/// One round of receive → process → dispatch over a set of ports, on the caller's thread.
pub struct Pump {
    dp: Arc<Datapath>,
    worker: Worker,
    ports: Arc<Table>,
    /// The (port, receive queue) pairs this pump receives from.
    rx: Vec<(PortId, usize)>,
    batch: Batch,
    room: usize,
    link: Option<Link>,
    /// Batched I/O through io_uring, if used.
    uring: Option<UringIo>,
}

impl Drop for Pump {
    fn drop(&mut self) {
        // A runtime's worker pump does not own its drivers; a pump of its own does.
        if self.link.is_none() {
            for (i, s) in self.ports.iter().enumerate() {
                if let (Some(_), Ok(id)) = (s, u16::try_from(i)) {
                    let _ = self.dp.detach(PortId(id), false);
                }
            }
        }
    }
}

impl std::fmt::Debug for Pump {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pump").field("rx", &self.rx).finish()
    }
}

impl Pump {
    /// A pump that receives from every port in `ports` and may transmit to any of them.
    pub fn new(dp: Arc<Datapath>, ports: &[(PortId, Arc<dyn Port>)]) -> io::Result<Pump> {
        let table = port_table(&dp, ports, 1)?;
        let room = ports
            .iter()
            .map(|(_, p)| p.frame_room())
            .max()
            .unwrap_or(crate::buf::DEFAULT_FRAME_ROOM)
            .max(crate::buf::DEFAULT_FRAME_ROOM);
        let worker = dp.worker_with_pool(BufPool::new(room, 1024));
        for (id, _) in ports {
            dp.attach(*id);
        }
        Ok(Pump {
            rx: ports
                .iter()
                .flat_map(|(id, p)| (0..p.rx_queues()).map(|q| (*id, q)))
                .collect(),
            dp,
            worker,
            ports: Arc::new(table),
            batch: Batch::new(),
            room,
            link: None,
            uring: None,
        })
    }

    fn linked(dp: Arc<Datapath>, shared: Arc<Shared>, index: usize, pool: BufPool) -> Pump {
        let worker = dp.worker_with_pool(pool);
        let mut p = Pump {
            dp,
            worker,
            ports: Arc::new(Vec::new()),
            rx: Vec::new(),
            batch: Batch::new(),
            room: shared.room,
            link: Some(Link {
                shared,
                index,
                version: u64::MAX,
            }),
            uring: None,
        };
        p.refresh();
        p
    }

    /// Takes a runtime's newer table, if any; returns whether it did.
    #[inline]
    fn refresh(&mut self) -> bool {
        let Some(link) = &mut self.link else {
            return false;
        };
        let v = link.shared.version.load(Ordering::Acquire);
        if v == link.version {
            return false;
        }
        self.ports = link.shared.table.load_full();
        link.version = v;
        let me = link.index;
        let workers = link.shared.wakes.len();
        self.rx.clear();
        for (i, s) in self.ports.iter().enumerate() {
            let (Some(s), Ok(id)) = (s, u16::try_from(i)) else {
                continue;
            };
            for q in 0..s.port.rx_queues() {
                if s.queue_worker(q, workers) == me {
                    self.rx.push((PortId(id), q));
                }
            }
        }
        if let Some(u) = &mut self.uring {
            u.reset(self.rx.len());
        }
        true
    }

    /// Starts receiving from `port`, the driver of datapath port `id` (made with
    /// [`Control::add_port`]); frames are also sent to it from the next round. Errors: `id`
    /// is not a live port that takes a driver, it has a driver already, or its frames do not
    /// fit this pump's buffers.
    pub fn add_port(&mut self, id: PortId, port: Arc<dyn Port>) -> io::Result<()> {
        check_new_port(&self.dp, &self.ports, id, port.as_ref(), self.room)?;
        self.rx.extend((0..port.rx_queues()).map(|q| (id, q)));
        Arc::make_mut(&mut self.ports)[usize::from(id.0)] = Some(Slot { port, worker: 0 });
        self.dp.attach(id);
        Ok(())
    }

    /// Stops receiving from and sending to port `id`, removes it from the datapath
    /// ([`Control::remove_port`]) and returns its driver. `None` (and nothing changed) for a
    /// port the datapath keeps (a router interface's) or one without a driver here.
    pub fn remove_port(&mut self, id: PortId) -> Option<Arc<dyn Port>> {
        if matches!(
            self.dp.check_removable(id),
            Err(crate::ConfigError::NotRemovable { .. })
        ) {
            return None;
        }
        let slot = Arc::make_mut(&mut self.ports)
            .get_mut(usize::from(id.0))?
            .take()?;
        self.rx.retain(|&(p, _)| p != id);
        if let Some(u) = &mut self.uring {
            u.reset(self.rx.len());
        }
        let _ = self.dp.detach(id, true);
        Some(slot.port)
    }

    /// Receives at most one batch from each port, processes and transmits it. Returns the
    /// number of frames received. Errors from a port's receive are returned after the round.
    pub fn poll(&mut self, now: Instant) -> io::Result<usize> {
        let mut total = 0;
        let mut err = None;
        for i in 0..self.rx.len() {
            let (id, q) = self.rx[i];
            let Some(slot) = self.ports.get(usize::from(id.0)).and_then(|p| p.as_ref()) else {
                continue;
            };
            let got = match &mut self.uring {
                Some(u) => u.recv(
                    slot.port.as_ref(),
                    q,
                    i,
                    &mut self.worker.pool,
                    &mut self.batch,
                ),
                None => None,
            };
            let got = match got {
                Some(Ok(r)) => r,
                Some(Err(f)) => {
                    drop_uring(&mut self.uring, &self.link, &f);
                    slot.port
                        .recv_queue(q, &mut self.worker.pool, &mut self.batch)
                }
                None => slot
                    .port
                    .recv_queue(q, &mut self.worker.pool, &mut self.batch),
            };
            if let Err(e) = got {
                err = Some(e);
            }
            if self.batch.is_empty() {
                continue;
            }
            for b in &mut self.batch.bufs {
                b.port = id;
            }
            total += self.batch.len();
            self.dp.process(&mut self.worker, now, &mut self.batch);
            self.transmit();
        }
        match err {
            Some(e) if total == 0 => Err(e),
            _ => Ok(total),
        }
    }

    /// Runs the datapath's timers at `now` and transmits the frames they make (ARP
    /// retransmissions, ICMP errors for packets whose next hop failed).
    pub fn timers(&mut self, now: Instant) {
        self.dp.poll(&mut self.worker, now, &mut self.batch);
        self.transmit();
    }

    fn transmit(&mut self) {
        let ports = &self.ports;
        let dp = &self.dp;
        let uring = &mut self.uring;
        let mut ring_failed = None;
        dp.dispatch_runs(&mut self.worker, &self.batch, |p, run, done| {
            match ports.get(usize::from(p.0)).and_then(|p| p.as_ref()) {
                Some(slot) => match uring {
                    Some(u) if ring_failed.is_none() => {
                        if let Err(f) = u.send(slot.port.as_ref(), run, done) {
                            ring_failed = Some(f);
                        }
                    }
                    _ => slot.port.send_batch(run, done),
                },
                None => {
                    // A driver detached while the datapath still has the port (a removal
                    // in progress), or a port never given a driver.
                    let r = if dp.is_sendable(p) {
                        DropReason::TxError
                    } else {
                        DropReason::PortGone
                    };
                    for i in 0..run.len() {
                        done(i, Err(r));
                    }
                }
            }
        });
        self.batch.recycle(&mut self.worker.pool);
        if let Some(f) = ring_failed {
            drop_uring(&mut self.uring, &self.link, &f);
        }
    }

    /// Polls until a round receives nothing (at most `max_rounds` rounds); returns frames moved.
    pub fn drain(&mut self, now: Instant, max_rounds: usize) -> usize {
        let mut total = 0;
        for _ in 0..max_rounds {
            match self.poll(now) {
                Ok(0) | Err(_) => break,
                Ok(n) => total += n,
            }
        }
        total
    }

    /// The datapath this pump drives.
    pub fn datapath(&self) -> &Arc<Datapath> {
        &self.dp
    }
}

/// Goes on with the plain path after a pump's ring failed (each worker keeps its failure to
/// itself; [`Runtime::uring_workers`] counts the rest).
fn drop_uring(u: &mut Option<UringIo>, link: &Option<Link>, why: &uring::RingFailed) {
    if u.take().is_some() {
        if let Some(l) = link {
            l.shared.uring_workers.fetch_sub(1, Ordering::Relaxed);
            *l.shared.io_fallback.lock() = Some(format!(
                "worker {}: io_uring failed ({}), one system call per frame from now on",
                l.index, why.0
            ));
        }
    }
}

/// Worker threads driving a set of ports until stopped.
pub struct Runtime {
    stop: Arc<AtomicBool>,
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
    dp: Arc<Datapath>,
    clock: Clock,
    /// The I/O mode the workers started with ([`IoMode::Plain`] or [`IoMode::Uring`]).
    io: IoMode,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("workers", &self.threads.len())
            .finish()
    }
}

/// Marks a worker exited (its acknowledgement can no longer be waited for), even if it
/// panicked.
struct ExitAck<'a>(&'a AtomicU64);

impl Drop for ExitAck<'_> {
    fn drop(&mut self) {
        self.0.store(u64::MAX, Ordering::Release);
    }
}

impl Runtime {
    /// Starts `cfg.workers` threads driving `ports` (each a datapath port id and its driver).
    /// More ports can be given later with [`Runtime::add_port`]; buffers are sized for the
    /// largest of `ports` (at least [`DEFAULT_FRAME_ROOM`](crate::buf::DEFAULT_FRAME_ROOM)).
    pub fn start(
        dp: Arc<Datapath>,
        ports: Vec<(PortId, Arc<dyn Port>)>,
        cfg: RuntimeConfig,
    ) -> io::Result<Runtime> {
        let nworkers = cfg.workers.max(1);
        if cfg.busy_poll > MAX_BUSY_POLL {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "busy poll window {} µs is longer than the {} µs allowed",
                    cfg.busy_poll.as_micros(),
                    MAX_BUSY_POLL.as_micros()
                ),
            ));
        }
        let table = port_table(&dp, &ports, nworkers)?;
        for (id, _) in &ports {
            dp.attach(*id);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let clock = Clock::new();
        let room = ports
            .iter()
            .map(|(_, p)| p.frame_room())
            .max()
            .unwrap_or(crate::buf::DEFAULT_FRAME_ROOM)
            .max(crate::buf::DEFAULT_FRAME_ROOM);
        let shared = Arc::new(Shared {
            table: ArcSwap::from_pointee(table),
            version: AtomicU64::new(1),
            acks: (0..nworkers).map(|_| AtomicU64::new(0)).collect(),
            wakes: (0..nworkers)
                .map(|_| EventFd::new())
                .collect::<io::Result<_>>()?,
            ctl: Mutex::new(()),
            room,
            paused: AtomicBool::new(false),
            spinning: (0..nworkers).map(|_| AtomicBool::new(false)).collect(),
            uring_workers: std::sync::atomic::AtomicUsize::new(0),
            io_fallback: Mutex::new(None),
        });
        // io_uring is tried once here, for every worker: where the kernel lacks or refuses
        // it, `Auto` goes on with the plain path and says why.
        let mut rings = Vec::with_capacity(nworkers);
        let mut io_fallback = None;
        if cfg.io != IoMode::Plain {
            for _ in 0..nworkers {
                match sys::uring::Uring::new() {
                    Ok(r) => rings.push(r),
                    Err(e) if cfg.io == IoMode::Uring => {
                        return Err(io::Error::new(
                            e.kind(),
                            format!("io_uring is not available: {e}"),
                        ))
                    }
                    Err(e) => {
                        io_fallback = Some(format!(
                            "io_uring is not available ({e}): one system call per frame"
                        ));
                        rings.clear();
                        break;
                    }
                }
            }
        }
        let io = if rings.is_empty() {
            IoMode::Plain
        } else {
            IoMode::Uring
        };
        shared.uring_workers.store(rings.len(), Ordering::Relaxed);
        shared.io_fallback.lock().clone_from(&io_fallback);
        let mut rings = rings.into_iter();
        let mut rt = Runtime {
            stop,
            shared,
            threads: Vec::with_capacity(nworkers),
            dp,
            clock,
            io,
        };
        for wi in 0..nworkers {
            let mut pump = Pump::linked(
                rt.dp.clone(),
                rt.shared.clone(),
                wi,
                BufPool::new(room, cfg.pool_buffers.max(crate::buf::BATCH_SIZE)),
            );
            if let Some(r) = rings.next() {
                let mut u = UringIo::new(r);
                u.reset(pump.rx.len());
                pump.uring = Some(u);
            }
            let stop = rt.stop.clone();
            let busy = cfg.busy_poll;
            let t = std::thread::Builder::new()
                .name(format!("tapyard-w{wi}"))
                .spawn(move || worker_loop(&mut pump, wi, &stop, clock, busy))?;
            rt.threads.push(t);
        }
        Ok(rt)
    }

    /// Attaches `port` as the driver of datapath port `id` (made with
    /// [`Control::add_port`]) while the workers run: the least-loaded worker is woken and
    /// receives from it from its next round (within milliseconds), and every worker sends to
    /// it from its next round. Errors: `id` is not a live datapath port that takes a driver,
    /// it has a driver already, or its frames do not fit the runtime's buffers (an offload
    /// TAP in a runtime started with plain ports only).
    pub fn add_port(&self, id: PortId, port: Arc<dyn Port>) -> io::Result<()> {
        let sh = &self.shared;
        let _ctl = sh.ctl.lock();
        let old = sh.table.load_full();
        check_new_port(&self.dp, &old, id, port.as_ref(), sh.room)?;
        let workers = sh.wakes.len();
        let mut load = vec![0usize; workers];
        for s in old.iter().flatten() {
            for q in 0..s.port.rx_queues() {
                load[s.queue_worker(q, workers)] += 1;
            }
        }
        let worker = (0..load.len()).min_by_key(|&w| load[w]).unwrap_or(0);
        let mut t: Table = old.as_ref().clone();
        t[usize::from(id.0)] = Some(Slot { port, worker });
        drop(old);
        self.dp.attach(id);
        sh.publish(t);
        sh.wakes[worker].signal();
        Ok(())
    }

    /// Detaches the driver of port `id` and removes the port from the datapath
    /// ([`Control::remove_port`]). Returns once no worker receives from it, sends to it or
    /// polls its descriptor (every worker has taken a table without it; a sleeping worker is
    /// woken for that, so this takes microseconds to a round's length); after that no frame
    /// is delivered to it. The returned driver is then the last reference the runtime had:
    /// dropping it closes a TAP's descriptor. `None` (and nothing changed) for a port the
    /// datapath keeps (a router interface's virtual port or uplink) or one without a driver
    /// here.
    pub fn remove_port(&self, id: PortId) -> Option<Arc<dyn Port>> {
        if matches!(
            self.dp.check_removable(id),
            Err(crate::ConfigError::NotRemovable { .. })
        ) {
            return None;
        }
        let sh = &self.shared;
        let _ctl = sh.ctl.lock();
        let old = sh.table.load_full();
        let slot = old.get(usize::from(id.0))?.clone()?;
        let mut t: Table = old.as_ref().clone();
        t[usize::from(id.0)] = None;
        drop(old);
        let v = sh.publish(t);
        sh.wait_acks(v);
        // Detached first, so the id cannot go to a new port while a worker still receives
        // from this driver.
        let _ = self.dp.detach(id, true);
        // Walk every worker past two quiescent points (the quarantine's two phases), so the
        // id is free again when this returns rather than at some later add.
        for _ in 0..2 {
            let t: Table = sh.table.load_full().as_ref().clone();
            let v = sh.publish(t);
            sh.wait_acks(v);
            self.dp.control().reclaim_ports();
        }
        Some(slot.port)
    }

    /// Stops every worker at a batch boundary (see the module docs) and returns once none
    /// receives from, sends to or polls a port, or runs the timers: the batch each had in hand
    /// is processed and transmitted first. The drivers stay open and attached; frames that
    /// arrive meanwhile wait in the ports' own queues (a TAP's is the device's). Takes
    /// microseconds to a round's length. Idempotent.
    pub fn pause(&self) {
        let sh = &self.shared;
        let _ctl = sh.ctl.lock();
        sh.paused.store(true, Ordering::Release);
        let v = sh.bump();
        sh.wait_acks(v);
    }

    /// Lets paused workers go on (each is woken at once). Does nothing if not paused.
    pub fn resume(&self) {
        let sh = &self.shared;
        let _ctl = sh.ctl.lock();
        if sh.paused.swap(false, Ordering::AcqRel) {
            for w in sh.wakes.iter() {
                w.signal();
            }
        }
    }

    /// How many workers are inside their busy-poll window now (spinning on their ports
    /// rather than sleeping); always 0 without [`RuntimeConfig::busy_poll`], and back to 0
    /// once no frame has arrived for that long.
    pub fn polling_workers(&self) -> usize {
        self.shared
            .spinning
            .iter()
            .filter(|s| s.load(Ordering::Relaxed))
            .count()
    }

    /// The I/O mode the workers started with: [`IoMode::Uring`] or [`IoMode::Plain`] (what
    /// [`IoMode::Auto`] chose; [`Runtime::io_fallback`] says why it chose the plain path).
    pub fn io(&self) -> IoMode {
        self.io
    }

    /// Why the plain path is used although io_uring was asked for: [`IoMode::Auto`] found it
    /// missing, disabled or refused at start, or a worker's ring failed later (that worker
    /// goes on with the plain path); to be logged once. `None` otherwise.
    pub fn io_fallback(&self) -> Option<String> {
        self.shared.io_fallback.lock().clone()
    }

    /// How many workers use io_uring now: all of them with [`IoMode::Uring`], until a ring
    /// fails (the worker then goes on with the plain path).
    pub fn uring_workers(&self) -> usize {
        self.shared.uring_workers.load(Ordering::Relaxed)
    }

    /// Whether the workers are paused.
    pub fn is_paused(&self) -> bool {
        self.shared.paused.load(Ordering::Acquire)
    }

    /// Every port with a driver, by id (ascending), with its driver: a paused runtime's are
    /// the open devices to hand over.
    pub fn ports(&self) -> Vec<(PortId, Arc<dyn Port>)> {
        self.shared
            .table
            .load()
            .iter()
            .enumerate()
            .filter_map(|(i, s)| Some((PortId(u16::try_from(i).ok()?), s.as_ref()?.port.clone())))
            .collect()
    }

    /// The datapath being driven.
    pub fn datapath(&self) -> &Arc<Datapath> {
        &self.dp
    }

    /// A copy of the runtime's clock, for threads that need the datapath's time (dumps,
    /// control requests) without holding the runtime.
    pub fn clock(&self) -> Clock {
        self.clock
    }

    /// The runtime's clock (the time base of its datapath's timestamps).
    pub fn now(&self) -> Instant {
        self.clock.now()
    }

    /// Stops the workers after the batch each has in hand and joins them.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::Release);
        for w in self.shared.wakes.iter() {
            w.signal();
        }
        let joined = !self.threads.is_empty();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        // The workers are gone: the ports they drove may be removed from the datapath now.
        if joined {
            for (i, s) in self.shared.table.load().iter().enumerate() {
                if let (Some(_), Ok(id)) = (s, u16::try_from(i)) {
                    let _ = self.dp.detach(PortId(id), false);
                }
            }
        }
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The worker's `poll(2)` set: its eventfd, then its ports' descriptors; and how long to
/// sleep when idle (1 ms if a port has no descriptor to wait on).
fn poll_set(pump: &Pump, wake: &EventFd) -> (Vec<libc::pollfd>, Duration) {
    let mut fds: Vec<libc::pollfd> = vec![sys::pollfd(wake.fd())];
    let mut fdless = false;
    for &(id, q) in &pump.rx {
        match pump.ports[usize::from(id.0)]
            .as_ref()
            .and_then(|s| s.port.rx_queue_fd(q))
        {
            Some(fd) => fds.push(sys::pollfd(fd)),
            None => fdless = true,
        }
    }
    let idle_wait = if fdless {
        Duration::from_millis(1)
    } else {
        Duration::from_millis(500)
    };
    (fds, idle_wait)
}

fn worker_loop(pump: &mut Pump, index: usize, stop: &AtomicBool, clock: Clock, busy: Duration) {
    let Some(shared) = pump.link.as_ref().map(|l| l.shared.clone()) else {
        return;
    };
    let wake = &shared.wakes[index];
    let ack = &shared.acks[index];
    let _exit = ExitAck(ack);
    let timers = index == 0;
    let (mut fds, mut idle_wait) = poll_set(pump, wake);
    ack.store(
        pump.link.as_ref().map_or(0, |l| l.version),
        Ordering::Release,
    );
    let poll_every = pump.dp.poll_interval();
    let mut next_timer = clock.now() + poll_every;
    let spinning = &shared.spinning[index];
    // The end of the busy-poll window: the last round that received, plus `busy`.
    let mut spin_until: Option<std::time::Instant> = None;
    while !stop.load(Ordering::Acquire) {
        // A table change: new receive list and poll set first, then the acknowledgement
        // (the old table, and with it any removed driver, is dropped by `refresh`). The pause
        // flag is read after the version and before the acknowledgement, so a worker that
        // acknowledges `Runtime::pause`'s version has seen the flag and parks.
        let changed = pump.refresh();
        if changed {
            (fds, idle_wait) = poll_set(pump, wake);
        }
        let paused = shared.paused.load(Ordering::Acquire);
        if changed {
            ack.store(
                pump.link.as_ref().map_or(0, |l| l.version),
                Ordering::Release,
            );
        }
        if paused {
            if spin_until.take().is_some() {
                spinning.store(false, Ordering::Relaxed);
            }
            // Parked: only the eventfd (resume, stop, a table change) wakes it.
            let mut one = [sys::pollfd(wake.fd())];
            if let Ok(ready) = sys::poll_readable(&mut one, Duration::from_millis(500)) {
                if ready > 0 {
                    wake.drain();
                }
            }
            continue;
        }
        let now = clock.now();
        // Receive errors (e.g. a TAP whose device was deleted) are not fatal to the other
        // ports: the timers still run, and a failing descriptor backs off instead of spinning.
        let (n, failed) = match pump.poll(now) {
            Ok(n) => (n, false),
            Err(_) => (0, true),
        };
        if timers && now >= next_timer {
            pump.timers(now);
            next_timer = now + poll_every;
        }
        if failed {
            std::thread::sleep(Duration::from_millis(10));
        } else if n > 0 {
            if !busy.is_zero() {
                spin_until = std::time::Instant::now().checked_add(busy);
                spinning.store(true, Ordering::Relaxed);
            }
        } else if spin_until.is_some_and(|t| std::time::Instant::now() < t) {
            // Busy polling: read the ports again next round instead of sleeping; let a pod's
            // process have this CPU meanwhile if it wants it.
            std::thread::yield_now();
        } else {
            if spin_until.take().is_some() {
                spinning.store(false, Ordering::Relaxed);
            }
            if let Ok(ready) = sys::poll_readable(&mut fds, idle_wait) {
                if ready > 0 && fds[0].revents != 0 {
                    wake.drain();
                }
            }
        }
    }
}
