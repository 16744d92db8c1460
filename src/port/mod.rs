//! Ports: anything that carries Ethernet frames in and out of the datapath.
//!
//! * [`TapPort`]: a Linux TAP device (`/dev/net/tun`, no packet-info header).
//! * [`MemPort`]: one end of an in-memory pair ([`mem_pair`]), for embedding and tests.
//! * [`SmolHost`]: a smoltcp `Interface` plugged into the far end of an in-memory pair, a real
//!   TCP/IP host without root.
//!
//! A port is shared by the runtime's workers: exactly one worker receives from it, any worker
//! may transmit to it, so [`Port::send`] takes `&self` and must be thread-safe. Middleware
//! wraps any port: [`Observed`] shows every frame to an [`Observer`] (capture, tracing).
//!
//! Two in-memory pairs on a bridge, driven by a [`crate::runtime::Pump`] on the caller's
//! thread (a [`crate::runtime::Runtime`] does the same with worker threads):
//!
//! ```
//! use std::sync::Arc;
//! use tapyard::port::{mem_pair, Port};
//! use tapyard::runtime::Pump;
//! use tapyard::{BridgeConfig, Datapath, Instant};
//!
//! let mut b = Datapath::builder();
//! let br = b.add_bridge(BridgeConfig::new("br0"))?;
//! let (p0, p1) = (b.add_port("p0", Some(br))?, b.add_port("p1", Some(br))?);
//! let dp = Arc::new(b.build());
//! let (port0, host0) = mem_pair("p0", "host0", 64);
//! let (port1, host1) = mem_pair("p1", "host1", 64);
//! let ports: Vec<(tapyard::PortId, Arc<dyn Port>)> =
//!     vec![(p0, Arc::new(port0)), (p1, Arc::new(port1))];
//! let mut pump = Pump::new(dp.clone(), &ports)?;
//! // Host 0 broadcasts; the bridge floods it to host 1.
//! let frame = [[0xff; 6].as_slice(), &[2, 0, 0, 0, 0, 1], &[0x08, 0x06], &[0; 46]].concat();
//! host0.send_frame(&frame).unwrap();
//! pump.drain(Instant::ZERO, 4);
//! assert_eq!(host1.recv_frame().map(|b| b.frame().to_vec()), Some(frame));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::io;
use std::os::fd::RawFd;

use crate::buf::{Batch, BufPool, PacketBuf, DEFAULT_FRAME_ROOM};
use crate::stats::DropReason;

mod mem;
mod observe;
mod smol;
mod tap;

pub use mem::{mem_pair, MemPort};
pub use observe::{Direction, Observed, Observer};
pub use smol::SmolHost;
pub use tap::{TapPort, MAX_QUEUES};

/// The drop reason of a frame a TAP's `write` refused with `errno`: its queue full (`EAGAIN`,
/// `ENOBUFS`) is [`DropReason::TxQueueFull`]; its interface not up (`EIO`, the kernel's
/// `tun_get_user` refuses frames while the device is down) is [`DropReason::TxLinkDown`];
/// anything else is [`DropReason::TxError`].
pub fn tx_drop_reason(errno: i32) -> DropReason {
    match errno {
        libc::EAGAIN | libc::ENOBUFS => DropReason::TxQueueFull,
        libc::EIO => DropReason::TxLinkDown,
        _ => DropReason::TxError,
    }
}

/// Something that carries Ethernet frames.
pub trait Port: Send + Sync {
    /// The port's name (the interface name for a TAP).
    fn name(&self) -> &str;

    /// Receives frames without blocking into buffers taken from `pool`, appending them to
    /// `batch` until it is full, the pool is empty or nothing is waiting. Returns how many
    /// frames were added. A frame cut because it did not fit its buffer is still returned, with
    /// [`PacketBuf::oversize`] set.
    fn recv_batch(&self, pool: &mut BufPool, batch: &mut Batch) -> io::Result<usize>;

    /// Transmits one frame (copying it out; the caller keeps the buffer). Frames that carry
    /// [`crate::Offload`] work are completed in software by ports without offload support.
    fn send(&self, buf: &PacketBuf) -> Result<(), DropReason>;

    /// Transmits a run of frames, in order, calling `done(i, result)` for each (`i` indexes
    /// `bufs`). The default sends them one by one; ports that can do better (one lock, one
    /// system call) override it.
    fn send_batch(&self, bufs: &[&PacketBuf], done: &mut dyn FnMut(usize, Result<(), DropReason>)) {
        for (i, b) in bufs.iter().enumerate() {
            done(i, self.send(b));
        }
    }

    /// A file descriptor that polls readable when frames may be waiting, if the port has one.
    /// Ports without one are polled on a short timer by the runtime.
    fn rx_fd(&self) -> Option<RawFd> {
        None
    }

    /// How many receive queues the port has (a multi-queue TAP's, [`TapPort::open_multi_queue`]):
    /// a runtime gives each to a worker, so one port's traffic is spread over several
    /// workers. Frames of one queue are received in order by one worker. Default 1.
    fn rx_queues(&self) -> usize {
        1
    }

    /// [`Port::recv_batch`] from receive queue `q` (below [`Port::rx_queues`]). The default,
    /// for single-queue ports, is `recv_batch`.
    fn recv_queue(&self, q: usize, pool: &mut BufPool, batch: &mut Batch) -> io::Result<usize> {
        let _ = q;
        self.recv_batch(pool, batch)
    }

    /// [`Port::rx_fd`] of receive queue `q`. The default is `rx_fd`.
    fn rx_queue_fd(&self, q: usize) -> Option<RawFd> {
        let _ = q;
        self.rx_fd()
    }

    /// Bytes of frame room the port's received frames need (the runtime sizes its pools by it).
    fn frame_room(&self) -> usize {
        DEFAULT_FRAME_ROOM
    }

    /// For a runtime that batches system calls ([`crate::runtime::IoMode::Uring`]): the
    /// descriptor of receive queue `q`, each read of which returns one frame, and how many
    /// bytes precede the frame in a read (a virtio-net header). A read goes into
    /// [`PacketBuf::room_with_front_mut`]`(front)` and is finished by [`Port::raw_rx_done`].
    /// `None` (the default) makes the runtime call [`Port::recv_queue`].
    fn raw_rx(&self, q: usize) -> Option<(RawFd, usize)> {
        let _ = q;
        None
    }

    /// Finishes a frame read as [`Port::raw_rx`] says, `len` bytes including the front:
    /// sets its length and metadata. False if it is no frame (the buffer is recycled).
    fn raw_rx_done(&self, buf: &mut PacketBuf, len: usize) -> bool {
        let _ = (buf, len);
        false
    }

    /// For a runtime that batches system calls: how `buf` is transmitted with one write —
    /// the descriptor, and how many bytes of `hdr` (filled here) go in front of the frame.
    /// `None` (the default, and for frames that need more than one write, e.g. super-frames
    /// segmented in software) makes the runtime call [`Port::send_batch`] for the run.
    fn raw_tx(&self, buf: &PacketBuf, hdr: &mut [u8]) -> Option<(RawFd, usize)> {
        let _ = (buf, hdr);
        None
    }
}
