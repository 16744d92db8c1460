//! Packet buffers, a per-worker buffer pool and batches.
//!
//! A [`PacketBuf`] owns a fixed-size byte array with *headroom* in front of the frame, so a
//! header (an 802.1Q tag, a virtio-net header, a tunnel header) can be pushed without copying the
//! frame. Besides the bytes it carries per-frame metadata: the ingress port and [`Offload`] state
//! (the virtio-net header fields: partial checksum and GSO segment size), so ports with and
//! without offloads can share one datapath without changing its users.
//!
//! Buffers come from a [`BufPool`] owned by one worker thread. The pool grows on demand up to a
//! limit and then recycles: once warm, receiving and forwarding frames allocates nothing.
//! A [`Batch`] holds up to [`BATCH_SIZE`] buffers and one [`Verdict`] per buffer; the
//! datapath processes whole batches.

use crate::base::{PortId, Verdict};

/// Bytes reserved in front of every received frame.
pub const HEADROOM: usize = 128;

/// The largest number of frames a [`Batch`] holds (as Open vSwitch's `NETDEV_MAX_BURST`).
pub const BATCH_SIZE: usize = 32;

/// Frame room (bytes after the headroom) of buffers made by [`BufPool::default`]:
/// a 1500-byte MTU Ethernet frame with two VLAN tags fits with room to spare.
pub const DEFAULT_FRAME_ROOM: usize = 2048 - HEADROOM;

/// Offload metadata carried with a frame: the fields of a virtio-net header
/// (see [`crate::offload`]). A TAP device opened with `IFF_VNET_HDR` hands frames whose L4
/// checksum is partial or that are TCP super-frames to be segmented at `gso_size`; ports
/// without offload support finish that work in software before transmitting. Frames from
/// ports without offloads carry [`Offload::NONE`].
pub type Offload = crate::wire::virtio::VirtioNetHdr;

/// One frame in a buffer with headroom, plus its metadata.
///
/// Invariant: `start + len <= data.len()`; every accessor keeps it, so none can panic.
pub struct PacketBuf {
    data: Box<[u8]>,
    start: usize,
    len: usize,
    /// The port the frame was received on.
    pub port: PortId,
    /// Pending offload work (see [`Offload`]).
    pub offload: Offload,
    /// Set by a port when the frame did not fit the buffer and was cut; the datapath drops it
    /// as [`crate::DropReason::Oversize`].
    pub oversize: bool,
}

impl std::fmt::Debug for PacketBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PacketBuf")
            .field("port", &self.port)
            .field("len", &self.len)
            .field("headroom", &self.start)
            .field("offload", &self.offload)
            .finish()
    }
}

impl PacketBuf {
    /// A buffer with [`HEADROOM`] bytes of headroom and `room` bytes for the frame.
    pub fn new(room: usize) -> PacketBuf {
        PacketBuf {
            data: vec![0u8; HEADROOM + room].into_boxed_slice(),
            start: HEADROOM,
            len: 0,
            port: PortId(0),
            offload: Offload::NONE,
            oversize: false,
        }
    }

    /// A buffer holding a copy of `frame` (for tests and for ports that hand over slices).
    pub fn from_frame(frame: &[u8]) -> PacketBuf {
        let mut b = PacketBuf::new(frame.len().max(64));
        b.room_mut()[..frame.len()].copy_from_slice(frame);
        b.set_len(frame.len());
        b
    }

    /// The frame's bytes.
    #[inline]
    pub fn frame(&self) -> &[u8] {
        &self.data[self.start..self.start + self.len]
    }

    /// The frame's bytes, writable.
    #[inline]
    pub fn frame_mut(&mut self) -> &mut [u8] {
        &mut self.data[self.start..self.start + self.len]
    }

    /// Frame length in bytes.
    #[inline]
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Bytes free in front of the frame.
    #[inline]
    pub fn headroom(&self) -> usize {
        self.start
    }

    /// Everything from the frame's start to the end of the buffer: where a port receives into.
    /// Follow with [`PacketBuf::set_len`].
    #[inline]
    pub fn room_mut(&mut self) -> &mut [u8] {
        &mut self.data[self.start..]
    }

    /// The whole buffer from the frame's start, including `extra` bytes of headroom in front
    /// (for receiving a virtio-net header in front of the frame). `extra` is capped at the headroom.
    #[inline]
    pub fn room_with_front_mut(&mut self, extra: usize) -> &mut [u8] {
        let extra = extra.min(self.start);
        &mut self.data[self.start - extra..]
    }

    /// Bytes that fit after the frame's start.
    #[inline]
    pub fn room(&self) -> usize {
        self.data.len() - self.start
    }

    /// Sets the frame length, capped at [`PacketBuf::room`].
    #[inline]
    pub fn set_len(&mut self, len: usize) {
        self.len = len.min(self.room());
    }

    /// Grows the frame by `n` bytes at the front, into the headroom, and returns the new front
    /// bytes; `None` if the headroom is too small.
    #[inline]
    pub fn push_front(&mut self, n: usize) -> Option<&mut [u8]> {
        if n > self.start {
            return None;
        }
        self.start -= n;
        self.len += n;
        Some(&mut self.data[self.start..self.start + n])
    }

    /// Removes `n` bytes from the front of the frame (capped at its length).
    #[inline]
    pub fn pull_front(&mut self, n: usize) {
        let n = n.min(self.len);
        self.start += n;
        self.len -= n;
    }

    /// The frame and `n` bytes of headroom before it, read-only; `None` if the headroom is smaller.
    #[inline]
    pub fn with_front(&self, n: usize) -> Option<&[u8]> {
        if n > self.start {
            return None;
        }
        Some(&self.data[self.start - n..self.start + self.len])
    }

    /// The `n` bytes of headroom just before the frame, writable; `None` if the headroom is smaller.
    #[inline]
    pub fn front_mut(&mut self, n: usize) -> Option<&mut [u8]> {
        if n > self.start {
            return None;
        }
        Some(&mut self.data[self.start - n..self.start])
    }

    /// A buffer made of `data` (its whole length is room), holding the frame of `len` bytes
    /// at `start` (both capped to fit): for a frame put together in place elsewhere
    /// (reassembly), handed over without a copy.
    pub(crate) fn from_storage(data: Box<[u8]>, start: usize, len: usize) -> PacketBuf {
        let start = start.min(data.len());
        let len = len.min(data.len() - start);
        PacketBuf {
            data,
            start,
            len,
            port: PortId(0),
            offload: Offload::NONE,
            oversize: false,
        }
    }

    /// The buffer's bytes, for [`PacketBuf::from_storage`]'s giver to recycle.
    pub(crate) fn into_storage(self) -> Box<[u8]> {
        self.data
    }

    /// Empties the buffer for reuse: full headroom, no frame, no offload state.
    #[inline]
    pub fn reset(&mut self) {
        self.start = HEADROOM.min(self.data.len());
        self.len = 0;
        self.offload = Offload::NONE;
        self.oversize = false;
    }
}

/// A pool of equally sized buffers owned by one worker.
///
/// It allocates a new buffer only while fewer than `limit` exist; afterwards [`BufPool::get`]
/// returns `None` until buffers come back through [`BufPool::put`]. Memory is bounded by
/// `limit * (HEADROOM + room)`.
#[derive(Debug)]
pub struct BufPool {
    free: Vec<PacketBuf>,
    room: usize,
    created: usize,
    limit: usize,
}

impl BufPool {
    /// A pool of at most `limit` buffers of `room` frame bytes each.
    pub fn new(room: usize, limit: usize) -> BufPool {
        BufPool {
            free: Vec::with_capacity(limit),
            room,
            created: 0,
            limit,
        }
    }

    /// Takes a reset buffer, allocating one only while the pool is below its limit.
    #[inline]
    pub fn get(&mut self) -> Option<PacketBuf> {
        if let Some(b) = self.free.pop() {
            return Some(b);
        }
        if self.created < self.limit {
            self.created += 1;
            return Some(PacketBuf::new(self.room));
        }
        None
    }

    /// Returns a buffer to the pool. A buffer of another size is dropped instead of kept.
    #[inline]
    pub fn put(&mut self, mut b: PacketBuf) {
        if b.data.len() == HEADROOM + self.room && self.free.len() < self.limit {
            b.reset();
            self.free.push(b);
        } else {
            self.created = self.created.saturating_sub(1);
        }
    }

    /// Frame bytes per buffer.
    pub fn room(&self) -> usize {
        self.room
    }

    /// Buffers allocated so far (in the pool or lent out).
    pub fn allocated(&self) -> usize {
        self.created
    }

    /// Buffers sitting in the pool now.
    pub fn available(&self) -> usize {
        self.free.len()
    }
}

impl Default for BufPool {
    /// 1024 buffers of [`DEFAULT_FRAME_ROOM`] bytes.
    fn default() -> Self {
        BufPool::new(DEFAULT_FRAME_ROOM, 1024)
    }
}

/// Up to [`BATCH_SIZE`] frames received on one port, with one verdict per frame.
#[derive(Debug, Default)]
pub struct Batch {
    pub(crate) bufs: Vec<PacketBuf>,
    pub(crate) verdicts: Vec<Verdict>,
}

impl Batch {
    /// An empty batch with room for [`BATCH_SIZE`] frames.
    pub fn new() -> Batch {
        Batch {
            bufs: Vec::with_capacity(BATCH_SIZE),
            verdicts: Vec::with_capacity(BATCH_SIZE),
        }
    }

    /// Number of frames held.
    pub fn len(&self) -> usize {
        self.bufs.len()
    }

    /// True when no frame is held.
    pub fn is_empty(&self) -> bool {
        self.bufs.is_empty()
    }

    /// True when [`BATCH_SIZE`] frames are held.
    pub fn is_full(&self) -> bool {
        self.bufs.len() >= BATCH_SIZE
    }

    /// Adds a frame; gives it back if the batch is full.
    pub fn push(&mut self, b: PacketBuf) -> Result<(), PacketBuf> {
        if self.is_full() {
            return Err(b);
        }
        self.bufs.push(b);
        Ok(())
    }

    /// The frames held.
    pub fn bufs(&self) -> &[PacketBuf] {
        &self.bufs
    }

    /// The verdict the datapath gave each frame (empty before processing).
    pub fn verdicts(&self) -> &[Verdict] {
        &self.verdicts
    }

    /// Moves every buffer back into `pool` and clears the verdicts.
    pub fn recycle(&mut self, pool: &mut BufPool) {
        for b in self.bufs.drain(..) {
            pool.put(b);
        }
        self.verdicts.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headroom_push_and_pull() {
        let mut b = PacketBuf::from_frame(&[1, 2, 3, 4]);
        assert_eq!(b.frame(), &[1, 2, 3, 4]);
        b.push_front(2).unwrap().copy_from_slice(&[9, 9]);
        assert_eq!(b.frame(), &[9, 9, 1, 2, 3, 4]);
        b.pull_front(3);
        assert_eq!(b.frame(), &[2, 3, 4]);
        b.pull_front(100);
        assert_eq!(b.len(), 0);
        assert!(b.push_front(HEADROOM + 100).is_none());
        b.set_len(usize::MAX);
        assert_eq!(b.len(), b.room());
    }

    #[test]
    fn pool_is_bounded_and_recycles() {
        let mut p = BufPool::new(256, 2);
        let a = p.get().unwrap();
        let b = p.get().unwrap();
        assert!(p.get().is_none());
        p.put(a);
        assert_eq!(p.available(), 1);
        let c = p.get().unwrap();
        assert_eq!(c.len(), 0);
        assert_eq!(c.headroom(), HEADROOM);
        p.put(b);
        p.put(c);
        assert_eq!(p.allocated(), 2);
    }
}
