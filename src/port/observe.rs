//! A port wrapper that shows every frame it carries to an [`Observer`]: the middleware under
//! packet capture (`tapyard capture`), tracing and counting taps.
//!
//! [`Observed`] wraps any [`Port`] and calls [`Observer::observe`] with the frames the inner
//! port received (once per received batch) and with each frame it sent successfully, with the
//! [`Direction`]. A frame the inner port refused to send is not observed. The observer is asked
//! [`Observer::wants`] first, so an idle observer costs one call (typically one relaxed atomic
//! load) per received batch and per sent frame, and nothing is copied.
//!
//! Thread safety: as for any [`Port`], one worker receives while any worker may send, so the
//! observer is called from several threads at once and must be `Send + Sync`; frames of one
//! direction reach it in the order the port carried them only when one thread sends.
//!
//! ```
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use std::sync::Arc;
//! use tapyard::port::{mem_pair, Direction, Observed, Observer, Port};
//! use tapyard::{Batch, BufPool, PacketBuf};
//!
//! /// Counts frames each way.
//! #[derive(Default)]
//! struct Count([AtomicUsize; 2]);
//!
//! impl Observer for Count {
//!     fn observe(&self, dir: Direction, frames: &[PacketBuf]) {
//!         self.0[dir as usize].fetch_add(frames.len(), Ordering::Relaxed);
//!     }
//! }
//!
//! let (a, b) = mem_pair("a", "b", 16);
//! let count = Arc::new(Count::default());
//! let port = Observed::new(a, count.clone());
//! port.send(&PacketBuf::from_frame(&[0xff; 60])).unwrap();
//! b.send(&PacketBuf::from_frame(&[1; 64])).unwrap();
//! let (mut pool, mut batch) = (BufPool::default(), Batch::new());
//! assert_eq!(port.recv_batch(&mut pool, &mut batch).unwrap(), 1);
//! assert_eq!(count.0[Direction::Rx as usize].load(Ordering::Relaxed), 1);
//! assert_eq!(count.0[Direction::Tx as usize].load(Ordering::Relaxed), 1);
//! ```

use std::io;
use std::os::fd::RawFd;
use std::sync::Arc;

use super::Port;
use crate::buf::{Batch, BufPool, PacketBuf};
use crate::stats::DropReason;

/// Which way a frame crossed the port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Direction {
    /// Received from the port (into the datapath).
    Rx = 0,
    /// Sent out of the port (from the datapath).
    Tx = 1,
}

/// Sees the frames an [`Observed`] port carries. Called from the port's worker threads: keep
/// it short (copy what you need and hand it to another thread).
pub trait Observer: Send + Sync {
    /// True when the observer wants frames now; [`Observer::observe`] is called only then.
    /// Asked once per received batch and once per sent frame. Defaults to always.
    fn wants(&self) -> bool {
        true
    }

    /// Frames that went `dir`: a received batch (in order), or one sent frame.
    fn observe(&self, dir: Direction, frames: &[PacketBuf]);
}

impl<O: Observer + ?Sized> Observer for Arc<O> {
    fn wants(&self) -> bool {
        (**self).wants()
    }

    fn observe(&self, dir: Direction, frames: &[PacketBuf]) {
        (**self).observe(dir, frames)
    }
}

/// A [`Port`] that shows its frames to an [`Observer`]; everything else goes to the inner port
/// unchanged (name, file descriptor, frame room, batched sends).
#[derive(Debug)]
pub struct Observed<P, O> {
    inner: P,
    observer: O,
}

impl<P: Port, O: Observer> Observed<P, O> {
    /// Wraps `inner`, showing its frames to `observer`.
    pub fn new(inner: P, observer: O) -> Observed<P, O> {
        Observed { inner, observer }
    }

    /// The wrapped port.
    pub fn inner(&self) -> &P {
        &self.inner
    }

    /// The observer.
    pub fn observer(&self) -> &O {
        &self.observer
    }
}

impl<P: Port, O: Observer> Port for Observed<P, O> {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn recv_batch(&self, pool: &mut BufPool, batch: &mut Batch) -> io::Result<usize> {
        let before = batch.len();
        let n = self.inner.recv_batch(pool, batch)?;
        if n > 0 && self.observer.wants() {
            self.observer
                .observe(Direction::Rx, &batch.bufs()[before..]);
        }
        Ok(n)
    }

    fn send(&self, buf: &PacketBuf) -> Result<(), DropReason> {
        let r = self.inner.send(buf);
        if r.is_ok() && self.observer.wants() {
            self.observer
                .observe(Direction::Tx, std::slice::from_ref(buf));
        }
        r
    }

    fn send_batch(&self, bufs: &[&PacketBuf], done: &mut dyn FnMut(usize, Result<(), DropReason>)) {
        self.inner.send_batch(bufs, &mut |i, r| {
            if r.is_ok() && self.observer.wants() {
                self.observer
                    .observe(Direction::Tx, std::slice::from_ref(bufs[i]));
            }
            done(i, r)
        })
    }

    fn rx_queues(&self) -> usize {
        self.inner.rx_queues()
    }

    fn recv_queue(&self, q: usize, pool: &mut BufPool, batch: &mut Batch) -> io::Result<usize> {
        let before = batch.len();
        let n = self.inner.recv_queue(q, pool, batch)?;
        if n > 0 && self.observer.wants() {
            self.observer
                .observe(Direction::Rx, &batch.bufs()[before..]);
        }
        Ok(n)
    }

    fn rx_queue_fd(&self, q: usize) -> Option<RawFd> {
        self.inner.rx_queue_fd(q)
    }

    fn rx_fd(&self) -> Option<RawFd> {
        self.inner.rx_fd()
    }

    fn frame_room(&self) -> usize {
        self.inner.frame_room()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::port::mem_pair;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Mutex;

    /// Records (direction, length) while switched on.
    #[derive(Default)]
    struct Log {
        on: AtomicBool,
        seen: Mutex<Vec<(Direction, usize)>>,
    }

    impl Observer for Log {
        fn wants(&self) -> bool {
            self.on.load(Ordering::Relaxed)
        }
        fn observe(&self, dir: Direction, frames: &[PacketBuf]) {
            let mut s = self.seen.lock().unwrap();
            s.extend(frames.iter().map(|f| (dir, f.frame().len())));
        }
    }

    #[test]
    fn sees_both_directions_only_while_wanted_and_passes_frames_through() {
        let (a, b) = mem_pair("a", "b", 16);
        let log = Arc::new(Log::default());
        let port = Observed::new(a, log.clone());
        assert_eq!(port.name(), "a");
        port.send(&PacketBuf::from_frame(&[0xff; 60])).unwrap();
        log.on.store(true, Ordering::Relaxed);
        port.send(&PacketBuf::from_frame(&[0xff; 61])).unwrap();
        let (x, y) = (
            PacketBuf::from_frame(&[2; 62]),
            PacketBuf::from_frame(&[3; 63]),
        );
        let mut results = Vec::new();
        port.send_batch(&[&x, &y], &mut |i, r| results.push((i, r.is_ok())));
        assert_eq!(results, [(0, true), (1, true)]);
        b.send(&PacketBuf::from_frame(&[1; 64])).unwrap();
        b.send(&PacketBuf::from_frame(&[1; 65])).unwrap();
        let (mut pool, mut batch) = (BufPool::default(), Batch::new());
        assert_eq!(port.recv_batch(&mut pool, &mut batch).unwrap(), 2);
        log.on.store(false, Ordering::Relaxed);
        port.send(&PacketBuf::from_frame(&[0xff; 66])).unwrap();
        use Direction::{Rx, Tx};
        assert_eq!(
            *log.seen.lock().unwrap(),
            [(Tx, 61), (Tx, 62), (Tx, 63), (Rx, 64), (Rx, 65)]
        );
        // The peer got every frame sent, observed or not.
        let mut got = Batch::new();
        assert_eq!(b.recv_batch(&mut pool, &mut got).unwrap(), 5);
    }
}
