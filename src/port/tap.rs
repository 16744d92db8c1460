//! Linux TAP devices.

use std::io;
use std::os::fd::{AsRawFd, RawFd};

use super::Port;
use crate::buf::{Batch, BufPool, PacketBuf};
use crate::stats::DropReason;

/// A TAP device opened on `/dev/net/tun` in TAP mode without the packet-info header.
///
/// The device exists while the port is open (it is created if missing, attached to if it
/// exists and is free). Moving the interface into another network namespace
/// (`ip link set tap0 netns pod-a`) keeps this file descriptor working: that is how pods are
/// attached. The fd is non-blocking; the runtime waits on [`Port::rx_fd`].
#[derive(Debug)]
pub struct TapPort {
    iface: tun_tap::Iface,
}

impl TapPort {
    /// Creates (or attaches to) the TAP device `name`. Fails without `CAP_NET_ADMIN`, or when
    /// the name is invalid or taken by a non-TAP device.
    pub fn open(name: &str) -> io::Result<TapPort> {
        if name.is_empty() || name.len() > 15 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("TAP name {name:?} must be 1 to 15 bytes"),
            ));
        }
        let iface = tun_tap::Iface::without_packet_info(name, tun_tap::Mode::Tap)?;
        crate::sys::set_nonblocking(iface.as_raw_fd())?;
        Ok(TapPort { iface })
    }
}

fn tx_reason(e: &io::Error) -> DropReason {
    match e.raw_os_error() {
        Some(libc::EAGAIN) | Some(libc::ENOBUFS) => DropReason::TxQueueFull,
        _ => DropReason::TxError,
    }
}

impl Port for TapPort {
    fn name(&self) -> &str {
        self.iface.name()
    }

    fn recv_batch(&self, pool: &mut BufPool, batch: &mut Batch) -> io::Result<usize> {
        let mut n = 0;
        while !batch.is_full() {
            let Some(mut b) = pool.get() else { break };
            match self.iface.recv(b.room_mut()) {
                Ok(len) => {
                    // A read that fills the buffer may have been cut by the kernel.
                    b.oversize = len >= b.room();
                    b.set_len(len);
                    let _ = batch.push(b);
                    n += 1;
                }
                Err(e) => {
                    pool.put(b);
                    match e.kind() {
                        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => break,
                        _ => return if n > 0 { Ok(n) } else { Err(e) },
                    }
                }
            }
        }
        Ok(n)
    }

    fn send(&self, buf: &PacketBuf) -> Result<(), DropReason> {
        if !buf.offload.is_none() {
            return crate::offload::send_completed(buf, &mut |f| {
                self.iface.send(f).map(|_| ()).map_err(|e| tx_reason(&e))
            });
        }
        self.iface
            .send(buf.frame())
            .map(|_| ())
            .map_err(|e| tx_reason(&e))
    }

    fn rx_fd(&self) -> Option<RawFd> {
        Some(self.iface.as_raw_fd())
    }
}
