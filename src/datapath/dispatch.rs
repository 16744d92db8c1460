//! Verdicts to ports: floods expanded, runs of frames for one port handed over at once,
//! offloaded frames finished for ports without offloads, refusals counted.

use std::sync::atomic::Ordering;

use super::{word, Datapath, Worker};
use crate::base::{PortId, Verdict};
use crate::buf::{Batch, PacketBuf};
use crate::stats::DropReason;

/// The longest run [`Datapath::dispatch_runs`] hands over at once.
const RUN_MAX: usize = 64;

impl Datapath {
    /// As [`Datapath::dispatch`], but hands the transmit closure runs of consecutive frames
    /// for one port (`tx(port, frames, done)`, calling `done(i, result)` for each frame), so a
    /// port can send a run with one lock or one system call. Order per port is kept.
    ///
    /// A frame for a port removed since `process` decided its fate is not handed to `tx`: it
    /// is counted as [`DropReason::PortGone`]. When this returns, the worker is offline: it
    /// holds no port id from before (see the module docs on the live topology).
    pub fn dispatch_runs<F>(&self, w: &mut Worker, batch: &Batch, tx: F)
    where
        F: FnMut(PortId, &[&PacketBuf], &mut dyn FnMut(usize, Result<(), DropReason>)),
    {
        self.dispatch_online(w, batch, tx);
        w.offline();
    }

    /// Ends a worker's online period without dispatching (for a caller that processed a batch
    /// and dropped it): the worker holds no port id from before, so quarantined ids can be
    /// reused. [`Datapath::dispatch`] does this itself.
    pub fn quiesce(&self, w: &mut Worker) {
        w.offline();
    }

    #[inline(always)]
    fn dispatch_online<F>(&self, w: &Worker, batch: &Batch, mut tx: F)
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
            // Removed since `process` (its id is quarantined until this worker is offline, so
            // it cannot belong to another port yet).
            if !self
                .ports
                .get(usize::from(p.0))
                .is_some_and(|w| word::sendable(w.load(Ordering::Relaxed)))
            {
                for _ in run {
                    shard.count_drop(DropReason::PortGone);
                }
                return;
            }
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
                    if let Some(br) = self.bridges.get(usize::from(bid.0)) {
                        for &p in br.ports.load().iter() {
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
        self.ports
            .get(usize::from(p.0))
            .is_some_and(|w| word::kind(w.load(Ordering::Relaxed)) == word::K_VIRTUAL)
    }
}
