//! A worker's batched TAP I/O through io_uring ([`IoMode::Uring`](super::IoMode::Uring)).
//!
//! Per round and port, one `io_uring_enter` reads up to a batch of frames (one read per
//! buffer, submitted together; reads that find nothing complete at once with `EAGAIN`), and
//! per run of frames to one output port one call writes them all. The number of reads offered
//! to a port adapts to what it had last time (doubling while every read returned a frame, else
//! one more than the frames found), so a quiet port costs one call with a couple of reads and
//! a busy one 32 frames per call. Nothing stays in flight between calls (see
//! [`crate::sys::uring`]), so pausing, handing ports over and removing them work as on the
//! plain path. Ports without a raw descriptor ([`Port::raw_rx`]) and frames that need more
//! than one write ([`Port::raw_tx`]) take the plain path.

use std::io;

use crate::buf::{Batch, BufPool, PacketBuf, BATCH_SIZE};
use crate::port::Port;
use crate::stats::DropReason;
use crate::sys::uring::{Uring, HDR_MAX, MAX_OPS};

/// The reads first offered to a port.
const FIRST_WANT: u8 = 4;

/// A ring and the worker's scratch space for it.
pub(super) struct UringIo {
    ring: Uring,
    /// Buffers lent to one call's reads.
    stage: Vec<PacketBuf>,
    res: [i32; MAX_OPS],
    /// Per receive-list entry, the reads to offer next.
    want: Vec<u8>,
}

impl std::fmt::Debug for UringIo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringIo").finish_non_exhaustive()
    }
}

/// The ring failed (not a port's error): the worker goes on with the plain path.
#[derive(Debug)]
pub(super) struct RingFailed(pub(super) io::Error);

fn tx_reason(errno: i32) -> DropReason {
    crate::port::tx_drop_reason(errno)
}

impl UringIo {
    pub(super) fn new(ring: Uring) -> UringIo {
        UringIo {
            ring,
            stage: Vec::with_capacity(BATCH_SIZE),
            res: [0; MAX_OPS],
            want: Vec::new(),
        }
    }

    /// Forgets the adaptive read counts (the receive list changed).
    pub(super) fn reset(&mut self, entries: usize) {
        self.want.clear();
        self.want.resize(entries, FIRST_WANT);
    }

    /// Receives from `port`'s queue `q` (entry `entry` of the receive list) into `batch`, as
    /// [`Port::recv_queue`] does, with one system call; `None` if the port has no raw
    /// descriptor (the caller uses `recv_queue`).
    pub(super) fn recv(
        &mut self,
        port: &dyn Port,
        q: usize,
        entry: usize,
        pool: &mut BufPool,
        batch: &mut Batch,
    ) -> Option<Result<io::Result<usize>, RingFailed>> {
        let (fd, front) = port.raw_rx(q)?;
        if self.want.len() <= entry {
            self.want.resize(entry + 1, FIRST_WANT);
        }
        let want = usize::from(self.want[entry]).min(BATCH_SIZE - batch.len().min(BATCH_SIZE));
        self.stage.clear();
        while self.stage.len() < want {
            match pool.get() {
                Some(b) => self.stage.push(b),
                None => break,
            }
        }
        if self.stage.is_empty() {
            return Some(Ok(Ok(0)));
        }
        let asked = match self.ring.read_batch(
            fd,
            &mut self.stage,
            |b| b.room_with_front_mut(front),
            &mut self.res,
        ) {
            Ok(k) => k,
            Err(e) => {
                for b in self.stage.drain(..) {
                    pool.put(b);
                }
                return Some(Err(RingFailed(e)));
            }
        };
        let (mut got, mut err, mut unsupported) = (0, None, false);
        for (i, mut b) in self.stage.drain(..).enumerate() {
            let r = if i < asked {
                self.res[i]
            } else {
                -libc::EAGAIN
            };
            match usize::try_from(r) {
                Ok(len) if port.raw_rx_done(&mut b, len) => {
                    let _ = batch.push(b);
                    got += 1;
                }
                Ok(_) => pool.put(b),
                Err(_) => {
                    pool.put(b);
                    match -r {
                        libc::EAGAIN | libc::EINTR | libc::ECANCELED => {}
                        libc::EOPNOTSUPP | libc::EINVAL => unsupported = true,
                        e => {
                            err.get_or_insert(io::Error::from_raw_os_error(e));
                        }
                    }
                }
            }
        }
        if unsupported && got == 0 {
            return Some(Err(RingFailed(io::Error::new(
                io::ErrorKind::Unsupported,
                "the kernel refuses RWF_NOWAIT reads from io_uring on this device",
            ))));
        }
        let next = if got >= want {
            (want * 2).min(BATCH_SIZE)
        } else {
            (got + 1).max(2)
        };
        self.want[entry] = u8::try_from(next).unwrap_or(FIRST_WANT);
        Some(Ok(match err {
            Some(e) if got == 0 => Err(e),
            _ => Ok(got),
        }))
    }

    /// Transmits `run` to `port` in order, as [`Port::send_batch`] does, writing the frames
    /// that need one write each ([`Port::raw_tx`]) with one system call; the frames from the
    /// first that does not on go through [`Port::send`].
    pub(super) fn send(
        &mut self,
        port: &dyn Port,
        run: &[&PacketBuf],
        done: &mut dyn FnMut(usize, Result<(), DropReason>),
    ) -> Result<(), RingFailed> {
        let mut start = 0;
        let mut failed = None;
        while start < run.len() {
            let chunk = &run[start..run.len().min(start + MAX_OPS)];
            let mut plans = [(-1, 0usize); MAX_OPS];
            let mut k = 0;
            for b in chunk {
                match port.raw_tx(b, &mut self.ring.hdr_mut(k)[..HDR_MAX]) {
                    Some(p) => {
                        plans[k] = p;
                        k += 1;
                    }
                    None => break,
                }
            }
            if k == 0 || failed.is_some() {
                // The rest one by one, in order.
                for (i, b) in run.iter().enumerate().skip(start) {
                    done(i, port.send(b));
                }
                return failed.map_or(Ok(()), Err);
            }
            match self.ring.write_batch(
                k,
                |i| (plans[i].0, plans[i].1, chunk[i].frame()),
                &mut self.res,
            ) {
                Ok(w) => {
                    for i in 0..k {
                        let r = if i < w { self.res[i] } else { -libc::EAGAIN };
                        done(start + i, if r >= 0 { Ok(()) } else { Err(tx_reason(-r)) });
                    }
                    start += k;
                }
                Err(e) => failed = Some(RingFailed(e)),
            }
        }
        failed.map_or(Ok(()), Err)
    }
}
