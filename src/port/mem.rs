//! In-memory port pairs: what one end sends, the other receives.

use std::collections::VecDeque;
use std::io;
use std::sync::Arc;

use parking_lot::Mutex;

use super::Port;
use crate::buf::{Batch, BufPool, PacketBuf, DEFAULT_FRAME_ROOM};
use crate::stats::DropReason;

struct Queue {
    frames: VecDeque<PacketBuf>,
    free: Vec<PacketBuf>,
}

/// One direction of a pair: a bounded queue of frames plus recycled buffers.
struct Pipe {
    q: Mutex<Queue>,
    capacity: usize,
    room: usize,
}

impl Pipe {
    fn new(capacity: usize, room: usize) -> Pipe {
        Pipe {
            q: Mutex::new(Queue {
                frames: VecDeque::with_capacity(capacity),
                free: Vec::with_capacity(capacity),
            }),
            capacity,
            room,
        }
    }

    fn push(&self, frame: &[u8]) -> Result<(), DropReason> {
        if frame.len() > self.room {
            return Err(DropReason::Oversize);
        }
        let mut q = self.q.lock();
        self.push_locked(&mut q, frame)
    }

    #[inline]
    fn push_locked(&self, q: &mut Queue, frame: &[u8]) -> Result<(), DropReason> {
        if frame.len() > self.room {
            return Err(DropReason::Oversize);
        }
        if q.frames.len() >= self.capacity {
            return Err(DropReason::TxQueueFull);
        }
        let mut b = q.free.pop().unwrap_or_else(|| PacketBuf::new(self.room));
        b.room_mut()[..frame.len()].copy_from_slice(frame);
        b.set_len(frame.len());
        q.frames.push_back(b);
        Ok(())
    }
}

/// One end of an in-memory pair made by [`mem_pair`].
///
/// Each direction is a bounded queue (frames beyond it are refused with
/// [`DropReason::TxQueueFull`]) whose buffers are recycled, so a warm pair allocates nothing.
pub struct MemPort {
    name: String,
    rx: Arc<Pipe>,
    tx: Arc<Pipe>,
}

impl std::fmt::Debug for MemPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemPort")
            .field("name", &self.name)
            .field("rx_waiting", &self.rx.q.lock().frames.len())
            .finish()
    }
}

/// Two connected in-memory ports called `a` and `b`, each direction holding at most
/// `capacity` frames of up to [`DEFAULT_FRAME_ROOM`] bytes.
pub fn mem_pair(a: &str, b: &str, capacity: usize) -> (MemPort, MemPort) {
    let ab = Arc::new(Pipe::new(capacity.max(1), DEFAULT_FRAME_ROOM));
    let ba = Arc::new(Pipe::new(capacity.max(1), DEFAULT_FRAME_ROOM));
    (
        MemPort {
            name: a.to_string(),
            rx: ba.clone(),
            tx: ab.clone(),
        },
        MemPort {
            name: b.to_string(),
            rx: ab,
            tx: ba,
        },
    )
}

impl MemPort {
    /// Sends a frame to the other end.
    pub fn send_frame(&self, frame: &[u8]) -> Result<(), DropReason> {
        self.tx.push(frame)
    }

    /// Takes the oldest frame sent by the other end, if any. Give the buffer back with
    /// [`MemPort::recycle`] to avoid allocations.
    pub fn recv_frame(&self) -> Option<PacketBuf> {
        self.rx.q.lock().frames.pop_front()
    }

    /// Returns a buffer obtained from [`MemPort::recv_frame`] for reuse.
    pub fn recycle(&self, mut b: PacketBuf) {
        let mut q = self.rx.q.lock();
        if q.free.len() < self.rx.capacity && b.room() + b.headroom() >= self.rx.room {
            b.reset();
            q.free.push(b);
        }
    }

    /// Frames waiting to be received at this end.
    pub fn pending(&self) -> usize {
        self.rx.q.lock().frames.len()
    }
}

impl Port for MemPort {
    fn name(&self) -> &str {
        &self.name
    }

    fn recv_batch(&self, pool: &mut BufPool, batch: &mut Batch) -> io::Result<usize> {
        let mut q = self.rx.q.lock();
        let mut n = 0;
        while !batch.is_full() {
            let Some(b) = q.frames.front() else { break };
            let Some(mut mine) = pool.get() else { break };
            if mine.room() == b.room() {
                // Same size: swap buffers instead of copying.
                let theirs = q.frames.pop_front().expect("front exists");
                q.free.push(mine);
                let _ = batch.push(theirs);
            } else {
                let len = b.len().min(mine.room());
                mine.room_mut()[..len].copy_from_slice(&b.frame()[..len]);
                mine.set_len(len);
                mine.oversize = len < b.len();
                let mut theirs = q.frames.pop_front().expect("front exists");
                theirs.reset();
                q.free.push(theirs);
                let _ = batch.push(mine);
            }
            n += 1;
        }
        Ok(n)
    }

    fn send(&self, buf: &PacketBuf) -> Result<(), DropReason> {
        if !buf.offload.is_none() {
            return crate::offload::send_completed(buf, &mut |f| self.tx.push(f));
        }
        self.tx.push(buf.frame())
    }

    fn send_batch(&self, bufs: &[&PacketBuf], done: &mut dyn FnMut(usize, Result<(), DropReason>)) {
        // One lock for the run; frames with offload work take the general path.
        let mut q = self.tx.q.lock();
        for (i, b) in bufs.iter().enumerate() {
            let r = if b.offload.is_none() {
                self.tx.push_locked(&mut q, b.frame())
            } else {
                crate::offload::send_completed(b, &mut |f| self.tx.push_locked(&mut q, f))
            };
            done(i, r);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pair_carries_frames_both_ways_and_bounds_its_queue() {
        let (a, b) = mem_pair("a", "b", 2);
        a.send_frame(&[1; 60]).unwrap();
        a.send_frame(&[2; 60]).unwrap();
        assert_eq!(a.send_frame(&[3; 60]), Err(DropReason::TxQueueFull));
        let mut pool = BufPool::default();
        let mut batch = Batch::new();
        assert_eq!(b.recv_batch(&mut pool, &mut batch).unwrap(), 2);
        assert_eq!(batch.bufs()[0].frame(), &[1; 60]);
        assert_eq!(batch.bufs()[1].frame(), &[2; 60]);
        b.send_frame(&[4; 64]).unwrap();
        let f = a.recv_frame().unwrap();
        assert_eq!(f.frame(), &[4; 64]);
        a.recycle(f);
        assert_eq!(a.pending(), 0);
    }
}
