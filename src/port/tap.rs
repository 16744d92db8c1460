//! Linux TAP devices.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, IntoRawFd, RawFd};

use super::Port;
use crate::buf::{Batch, BufPool, PacketBuf, DEFAULT_FRAME_ROOM};
use crate::offload::{VirtioNetHdr, VIRTIO_NET_HDR_GSO_UDP_TUNNEL_IPV4, VNET_HDR_LEN};
use crate::stats::DropReason;

/// Frame room for a TAP with offloads: a 64 KiB TCP super-frame plus link headers.
pub const OFFLOAD_FRAME_ROOM: usize = 65_536 + 64;

/// A TAP device on `/dev/net/tun`, in TAP mode without the packet-info header.
///
/// The device exists while the port is open (it is created if missing, attached to if it
/// exists and is free). Moving the interface into another network namespace
/// (`ip link set tap0 netns pod-a`) keeps this file descriptor working: that is how pods are
/// attached. The fd is non-blocking; the runtime waits on [`Port::rx_fd`].
///
/// Two modes:
/// * [`TapPort::open`]: plain frames (opened with tun-tap). The kernel side computes checksums
///   and segments TCP itself, as for a NIC without offloads.
/// * [`TapPort::open_offload`]: every frame carries a virtio-net header, and the device
///   advertises checksum offload and TSO to the kernel, so a pod's TCP stack hands over 64 KiB
///   super-frames with partial checksums, as to a virtio NIC. They pass between offload TAPs
///   untouched and are segmented and checksummed in software ([`crate::offload`]) only when
///   they leave through a port without offloads.
#[derive(Debug)]
pub struct TapPort {
    file: File,
    name: String,
    vnet: bool,
}

impl TapPort {
    fn check_name(name: &str) -> io::Result<()> {
        if name.is_empty() || name.len() > 15 || name.contains('/') {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("TAP name {name:?} is invalid: expected 1 to 15 bytes, no '/'"),
            ));
        }
        Ok(())
    }

    /// Creates (or attaches to) the TAP device `name` for plain frames. Fails without
    /// `CAP_NET_ADMIN`, or when the name is invalid or taken by a device of another kind.
    pub fn open(name: &str) -> io::Result<TapPort> {
        Self::check_name(name)?;
        let iface = tun_tap::Iface::without_packet_info(name, tun_tap::Mode::Tap)?;
        let name = iface.name().to_string();
        let file = crate::sys::file_from_owned_fd(iface.into_raw_fd());
        crate::sys::set_nonblocking(file.as_raw_fd())?;
        Ok(TapPort {
            file,
            name,
            vnet: false,
        })
    }

    /// Creates (or attaches to) the TAP device `name` with a virtio-net header per frame and
    /// checksum/TSO offloads (see the type docs).
    pub fn open_offload(name: &str) -> io::Result<TapPort> {
        Self::check_name(name)?;
        let (file, name) = crate::sys::open_tap_vnet(name)?;
        Ok(TapPort {
            file,
            name,
            vnet: true,
        })
    }

    /// True for a port opened with [`TapPort::open_offload`].
    pub fn offloads(&self) -> bool {
        self.vnet
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
        &self.name
    }

    fn recv_batch(&self, pool: &mut BufPool, batch: &mut Batch) -> io::Result<usize> {
        let front = if self.vnet { VNET_HDR_LEN } else { 0 };
        let mut n = 0;
        while !batch.is_full() {
            let Some(mut b) = pool.get() else { break };
            match (&self.file).read(b.room_with_front_mut(front)) {
                Ok(len) if len >= front => {
                    if self.vnet {
                        let room = b.room_with_front_mut(front);
                        b.offload = VirtioNetHdr::parse(room).unwrap_or_default();
                    }
                    // A read that fills the buffer may have been cut by the kernel.
                    b.oversize = len - front >= b.room();
                    b.set_len(len - front);
                    let _ = batch.push(b);
                    n += 1;
                }
                Ok(_) => pool.put(b),
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
        if self.vnet && buf.offload.gso_type & VIRTIO_NET_HDR_GSO_UDP_TUNNEL_IPV4 != 0 {
            // A VXLAN super-frame: the kernel is not asked for UDP-tunnel GSO, so it is
            // segmented here and each segment goes with an empty virtio-net header.
            let none = [0u8; VNET_HDR_LEN];
            return crate::offload::send_completed(buf, &mut |f| {
                crate::sys::writev2(self.file.as_raw_fd(), &none, f)
                    .map(|_| ())
                    .map_err(|e| tx_reason(&e))
            });
        }
        if self.vnet {
            let mut hdr = [0u8; VNET_HDR_LEN];
            buf.offload.emit(&mut hdr);
            return crate::sys::writev2(self.file.as_raw_fd(), &hdr, buf.frame())
                .map(|_| ())
                .map_err(|e| tx_reason(&e));
        }
        if !buf.offload.is_none() {
            return crate::offload::send_completed(buf, &mut |f| {
                (&self.file).write(f).map(|_| ()).map_err(|e| tx_reason(&e))
            });
        }
        (&self.file)
            .write(buf.frame())
            .map(|_| ())
            .map_err(|e| tx_reason(&e))
    }

    fn rx_fd(&self) -> Option<RawFd> {
        Some(self.file.as_raw_fd())
    }

    fn frame_room(&self) -> usize {
        if self.vnet {
            OFFLOAD_FRAME_ROOM
        } else {
            DEFAULT_FRAME_ROOM
        }
    }
}
