//! Worker threads that drive ports through a [`Datapath`].
//!
//! Each port is received from by exactly one worker (ports are dealt round-robin); any worker
//! transmits to any port. A worker loops: receive a batch from each of its ports, process it,
//! dispatch it to the output ports, recycle the buffers; when no port had anything it sleeps in
//! `poll(2)` on its ports' file descriptors and a stop eventfd (ports without a descriptor are
//! re-checked every millisecond). Worker 0 also runs the datapath's timers.
//!
//! [`Runtime::stop`] sets a flag and signals the eventfd; each worker finishes the batch in hand
//! (the datapath keeps no queues of its own, so no frame it accepted is lost) and the threads
//! are joined.
//!
//! For single-threaded, deterministic use (tests, the demo, an embedder's own loop), [`Pump`]
//! does one round of the same work when called.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::base::PortId;
use crate::buf::{Batch, BufPool};
use crate::datapath::{Datapath, Worker};
use crate::port::Port;
use crate::stats::DropReason;
use crate::sys::{self, EventFd};
use crate::time::{Clock, Instant};

/// Settings of a [`Runtime`].
#[derive(Clone, Debug)]
pub struct RuntimeConfig {
    /// Worker threads (at least 1; more than the number of ports is pointless).
    pub workers: usize,
    /// Buffers per worker pool.
    pub pool_buffers: usize,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            workers: 1,
            pool_buffers: 1024,
        }
    }
}

/// The ports of a datapath, indexed by [`PortId`].
pub type PortTable = Arc<Vec<Option<Arc<dyn Port>>>>;

fn port_table(dp: &Datapath, ports: &[(PortId, Arc<dyn Port>)]) -> io::Result<PortTable> {
    let mut t: Vec<Option<Arc<dyn Port>>> = vec![None; dp.port_count()];
    for (id, p) in ports {
        let slot = t.get_mut(usize::from(id.0)).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("port id {} is not in the datapath", id.0),
            )
        })?;
        *slot = Some(p.clone());
    }
    Ok(Arc::new(t))
}

/// One round of receive → process → dispatch over a set of ports, on the caller's thread.
pub struct Pump {
    dp: Arc<Datapath>,
    worker: Worker,
    ports: PortTable,
    rx: Vec<PortId>,
    batch: Batch,
}

impl std::fmt::Debug for Pump {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pump").field("rx", &self.rx).finish()
    }
}

impl Pump {
    /// A pump that receives from every port in `ports` and may transmit to any of them.
    pub fn new(dp: Arc<Datapath>, ports: &[(PortId, Arc<dyn Port>)]) -> io::Result<Pump> {
        let table = port_table(&dp, ports)?;
        let room = ports
            .iter()
            .map(|(_, p)| p.frame_room())
            .max()
            .unwrap_or(crate::buf::DEFAULT_FRAME_ROOM);
        let worker = dp.worker_with_pool(BufPool::new(room, 1024));
        Ok(Pump {
            rx: ports.iter().map(|(id, _)| *id).collect(),
            dp,
            worker,
            ports: table,
            batch: Batch::new(),
        })
    }

    fn with_rx(dp: Arc<Datapath>, table: PortTable, rx: Vec<PortId>, pool: BufPool) -> Pump {
        let worker = dp.worker_with_pool(pool);
        Pump {
            dp,
            worker,
            ports: table,
            rx,
            batch: Batch::new(),
        }
    }

    /// Receives at most one batch from each port, processes and transmits it. Returns the
    /// number of frames received. Errors from a port's receive are returned after the round.
    pub fn poll(&mut self, now: Instant) -> io::Result<usize> {
        let mut total = 0;
        let mut err = None;
        for i in 0..self.rx.len() {
            let id = self.rx[i];
            let Some(port) = self.ports.get(usize::from(id.0)).and_then(|p| p.as_ref()) else {
                continue;
            };
            match port.recv_batch(&mut self.worker.pool, &mut self.batch) {
                Ok(_) => {}
                Err(e) => err = Some(e),
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
        self.dp
            .dispatch_runs(&mut self.worker, &self.batch, |p, run, done| {
                match ports.get(usize::from(p.0)).and_then(|p| p.as_ref()) {
                    Some(port) => port.send_batch(run, done),
                    None => {
                        for i in 0..run.len() {
                            done(i, Err(DropReason::TxError));
                        }
                    }
                }
            });
        self.batch.recycle(&mut self.worker.pool);
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

/// Worker threads driving a set of ports until stopped.
pub struct Runtime {
    stop: Arc<AtomicBool>,
    wake: Arc<EventFd>,
    threads: Vec<JoinHandle<()>>,
    dp: Arc<Datapath>,
    clock: Clock,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("workers", &self.threads.len())
            .finish()
    }
}

impl Runtime {
    /// Starts `cfg.workers` threads driving `ports` (each a datapath port id and its driver).
    pub fn start(
        dp: Arc<Datapath>,
        ports: Vec<(PortId, Arc<dyn Port>)>,
        cfg: RuntimeConfig,
    ) -> io::Result<Runtime> {
        let table = port_table(&dp, &ports)?;
        let nworkers = cfg.workers.clamp(1, ports.len().max(1));
        let stop = Arc::new(AtomicBool::new(false));
        let wake = Arc::new(EventFd::new()?);
        let clock = Clock::new();
        let room = ports
            .iter()
            .map(|(_, p)| p.frame_room())
            .max()
            .unwrap_or(crate::buf::DEFAULT_FRAME_ROOM);
        let mut threads = Vec::with_capacity(nworkers);
        for wi in 0..nworkers {
            let rx: Vec<PortId> = ports
                .iter()
                .enumerate()
                .filter(|(i, _)| i % nworkers == wi)
                .map(|(_, (id, _))| *id)
                .collect();
            let mut pump = Pump::with_rx(
                dp.clone(),
                table.clone(),
                rx,
                BufPool::new(room, cfg.pool_buffers.max(crate::buf::BATCH_SIZE)),
            );
            let stop = stop.clone();
            let wake = wake.clone();
            let t = std::thread::Builder::new()
                .name(format!("tapyard-w{wi}"))
                .spawn(move || worker_loop(&mut pump, wi == 0, &stop, &wake, clock))?;
            threads.push(t);
        }
        Ok(Runtime {
            stop,
            wake,
            threads,
            dp,
            clock,
        })
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
        self.wake.signal();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn worker_loop(pump: &mut Pump, timers: bool, stop: &AtomicBool, wake: &EventFd, clock: Clock) {
    let mut fds: Vec<libc::pollfd> = vec![sys::pollfd(wake.fd())];
    let mut fdless = false;
    for &id in &pump.rx {
        match pump.ports[usize::from(id.0)]
            .as_ref()
            .and_then(|p| p.rx_fd())
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
    let poll_every = pump.dp.poll_interval();
    let mut next_timer = clock.now() + poll_every;
    while !stop.load(Ordering::Acquire) {
        let now = clock.now();
        // Receive errors (e.g. a TAP whose device was deleted) are not fatal to the other
        // ports; back off so a failing descriptor does not spin.
        let n = match pump.poll(now) {
            Ok(n) => n,
            Err(_) => {
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        if timers && now >= next_timer {
            pump.timers(now);
            next_timer = now + poll_every;
        }
        if n == 0 {
            let _ = sys::poll_readable(&mut fds, idle_wait);
        }
    }
}
