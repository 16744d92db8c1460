//! Linux TAP devices.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, IntoRawFd, OwnedFd, RawFd};

use super::Port;
use crate::buf::{Batch, BufPool, PacketBuf, DEFAULT_FRAME_ROOM};
use crate::narrow::len16;
use crate::offload::{VirtioNetHdr, VIRTIO_NET_HDR_GSO_UDP_TUNNEL_IPV6, VNET_HDR_LEN};
use crate::stats::DropReason;
use crate::wire::virtio::{VIRTIO_NET_HDR_F_UDP_TUNNEL_CSUM, VNET_HDR_TUNNEL_LEN};
use crate::wire::{ethernet, vxlan};

/// Frame room for a TAP with offloads: a 64 KiB TCP super-frame plus link headers.
pub const OFFLOAD_FRAME_ROOM: usize = 65_536 + 64;

/// The most queues [`TapPort::open_multi_queue`] opens.
pub const MAX_QUEUES: usize = 16;

/// A hash of a frame's flow: IPv4 or IPv6 source and destination addresses, and the ports
/// of TCP or UDP (behind at most one VLAN tag); 0 for other frames. Never panics.
fn flow_hash(f: &[u8]) -> u32 {
    let be16 = |o: usize| {
        f.get(o..o + 2)
            .map_or(0, |b| u16::from_be_bytes([b[0], b[1]]))
    };
    let mut l3 = 14;
    let mut ty = be16(12);
    if ty == 0x8100 {
        ty = be16(16);
        l3 = 18;
    }
    let (addrs, proto, l4) = match ty {
        0x0800 => {
            let ihl = usize::from(f.get(l3).map_or(5, |b| b & 0x0f)) * 4;
            (l3 + 12..l3 + 20, f.get(l3 + 9).copied(), l3 + ihl)
        }
        0x86dd => (l3 + 8..l3 + 40, f.get(l3 + 6).copied(), l3 + 40),
        _ => return 0,
    };
    let mut h: u32 = 0x9e37_79b9;
    let mut mix = |b: &[u8]| {
        for c in b.chunks(4) {
            let mut w = [0u8; 4];
            w[..c.len()].copy_from_slice(c);
            h = (h ^ u32::from_ne_bytes(w))
                .wrapping_mul(0x0100_0193)
                .rotate_left(13);
        }
    };
    mix(f.get(addrs).unwrap_or(&[]));
    if matches!(proto, Some(6 | 17)) {
        mix(f.get(l4..l4 + 4).unwrap_or(&[]));
    }
    h ^ (h >> 16)
}

/// A TAP device on `/dev/net/tun`, in TAP mode without the packet-info header.
///
/// The device exists while the port is open (it is created if missing, attached to if it
/// exists and is free), or for as long as it is persistent ([`TapPort::set_persist`]). Moving the interface into another network namespace
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
///
/// An offload TAP can also carry UDP-tunnel GSO ([`TapPort::enable_tunnel_offload`], Linux
/// 6.17 and later; meant for an uplink that carries VXLAN): the header grows to 24 bytes
/// and VXLAN super-frames (over an IPv4 or an IPv6 underlay: `VIRTIO_NET_HDR_GSO_UDP_TUNNEL_IPV4`
/// or `_IPV6`) cross the device whole both ways — tapyard writes one
/// encapsulated super-frame and the kernel segments it, replicating the outer headers and
/// computing each outer UDP checksum; the kernel hands over the tunnel super-frames it
/// would otherwise have segmented, and tapyard decapsulates them into an inner TCP
/// super-frame.
///
/// The descriptor can outlive the process: [`TapPort::handover_fd`] lends it (to pass it over
/// a Unix socket with `SCM_RIGHTS`), and [`TapPort::from_fd`] makes a port of a descriptor
/// received so, in another process, without re-creating the device. Both ends then share one
/// open file, so the device lives while either holds it; only one should read.
///
/// [`TapPort::open_multi_queue`] opens a device with several queues (`IFF_MULTI_QUEUE`), one
/// descriptor each: a runtime gives each queue to a worker ([`Port::rx_queues`]), so one pod's
/// traffic is spread over several workers. The kernel puts all frames of a flow on one queue
/// when the pod transmits, so they are received in order by one worker; frames sent to the pod
/// go through the queue their flow hashes to (IPv4/IPv6 addresses and TCP/UDP ports).
#[derive(Debug)]
pub struct TapPort {
    /// Queue 0 (the only one unless multi-queue).
    file: File,
    /// Queues 1.. of a multi-queue device.
    more: Vec<File>,
    name: String,
    vnet: bool,
    /// UDP-tunnel GSO on: the virtio-net header is [`VNET_HDR_TUNNEL_LEN`] bytes.
    tunnel: bool,
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
            more: Vec::new(),
            name,
            vnet: false,
            tunnel: false,
        })
    }

    /// Creates (or attaches to) the TAP device `name` with a virtio-net header per frame and
    /// checksum/TSO offloads (see the type docs).
    pub fn open_offload(name: &str) -> io::Result<TapPort> {
        Self::check_name(name)?;
        let (file, name) = crate::sys::open_tap_vnet(name)?;
        Ok(TapPort {
            file,
            more: Vec::new(),
            name,
            vnet: true,
            tunnel: false,
        })
    }

    /// Creates (or attaches to) the multi-queue TAP device `name` (`IFF_MULTI_QUEUE`) with
    /// `queues` queues, 1 to [`MAX_QUEUES`], each its own descriptor; with a virtio-net header
    /// and offloads when `offloads` (as [`TapPort::open_offload`]), plain frames otherwise.
    /// A multi-queue device cannot be attached to by a single-queue open, nor the reverse.
    /// Not for handing over ([`TapPort::handover_fd`] lends queue 0 only).
    pub fn open_multi_queue(name: &str, queues: usize, offloads: bool) -> io::Result<TapPort> {
        Self::check_name(name)?;
        if queues == 0 || queues > MAX_QUEUES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{queues} queues asked for TAP {name:?}: expected 1 to {MAX_QUEUES}"),
            ));
        }
        let (file, name) = crate::sys::open_tap_with(name, offloads, true)?;
        let mut more = Vec::with_capacity(queues - 1);
        for _ in 1..queues {
            more.push(crate::sys::open_tap_with(&name, offloads, true)?.0);
        }
        Ok(TapPort {
            file,
            more,
            name,
            vnet: offloads,
            tunnel: false,
        })
    }

    /// The descriptor of queue `q` (queue 0 when out of range).
    fn queue(&self, q: usize) -> &File {
        match q.checked_sub(1).and_then(|i| self.more.get(i)) {
            Some(f) => f,
            None => &self.file,
        }
    }

    /// The queue a frame is sent through: its flow's (see the type docs), 0 with one queue.
    fn tx_queue(&self, frame: &[u8]) -> &File {
        if self.more.is_empty() {
            return &self.file;
        }
        let n = self.more.len() + 1;
        self.queue(flow_hash(frame) as usize % n)
    }

    /// Turns on UDP-tunnel GSO on a port opened with [`TapPort::open_offload`] (see the type
    /// docs), before the port is used. Fails, leaving the port as it was, on a port without
    /// offloads or when the kernel refuses the flags (before Linux 6.17): the caller then
    /// keeps the per-segment path, which works everywhere.
    pub fn enable_tunnel_offload(&mut self) -> io::Result<()> {
        if !self.vnet {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("TAP {:?} has no virtio-net header", self.name),
            ));
        }
        if !self.more.is_empty() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "TAP {:?} is multi-queue: UDP-tunnel GSO is for single-queue uplinks",
                    self.name
                ),
            ));
        }
        if !self.tunnel {
            crate::sys::tun_set_tunnel_offload(self.file.as_raw_fd())?;
            self.tunnel = true;
        }
        Ok(())
    }

    /// True once [`TapPort::enable_tunnel_offload`] succeeded (or for a descriptor adopted
    /// with a 24-byte header).
    pub fn tunnel_offload(&self) -> bool {
        self.tunnel
    }

    /// Bytes of virtio-net header in front of each frame read or written.
    fn vnet_len(&self) -> usize {
        match (self.vnet, self.tunnel) {
            (false, _) => 0,
            (true, false) => VNET_HDR_LEN,
            (true, true) => VNET_HDR_TUNNEL_LEN,
        }
    }

    /// True for a port opened with [`TapPort::open_offload`].
    pub fn offloads(&self) -> bool {
        self.vnet
    }

    /// A port on an open TAP descriptor, e.g. one handed over by another process: no device
    /// is created or looked up by name (it may live in another namespace, under another
    /// name). `offloads` says how it was opened ([`TapPort::open_offload`] or not): it must
    /// match the device's virtio-net header flag, since the frames' framing depends on it.
    /// The name is the device's current one. Errors: the descriptor is not a TAP device
    /// (`TUNGETIFF` fails, or it is a TUN or has a packet-info header), or `offloads` does
    /// not match; the descriptor is closed then.
    pub fn from_fd(fd: OwnedFd, offloads: bool) -> io::Result<TapPort> {
        let (name, flags) = crate::sys::tun_get_iff(fd.as_raw_fd()).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "descriptor {} is not an attached TAP device: {e}",
                    fd.as_raw_fd()
                ),
            )
        })?;
        use crate::sys::{IFF_NO_PI, IFF_TAP, IFF_VNET_HDR};
        if flags & IFF_TAP == 0 || flags & IFF_NO_PI == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "device {name:?} is not a TAP without packet information (flags {flags:#06x})"
                ),
            ));
        }
        let vnet = flags & IFF_VNET_HDR != 0;
        if vnet != offloads {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "TAP {name:?} {} a virtio-net header but offloads = {offloads} was asked",
                    if vnet { "has" } else { "has no" }
                ),
            ));
        }
        let file = File::from(fd);
        crate::sys::set_nonblocking(file.as_raw_fd())?;
        let tunnel = vnet
            && match crate::sys::tun_vnet_hdr_len(file.as_raw_fd())? {
                VNET_HDR_LEN => false,
                VNET_HDR_TUNNEL_LEN => true,
                n => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!(
                            "TAP {name:?} has a {n}-byte virtio-net header (10 or 24 expected)"
                        ),
                    ))
                }
            };
        Ok(TapPort {
            file,
            more: Vec::new(),
            name,
            vnet,
            tunnel,
        })
    }

    /// The device's descriptor, lent to hand it to another process (see the type docs); this
    /// port keeps it open.
    pub fn handover_fd(&self) -> BorrowedFd<'_> {
        self.file.as_fd()
    }

    /// Makes the device persistent (`on`) or not (`TUNSETPERSIST`). A persistent TAP outlives
    /// this port and the process: closing the last file descriptor leaves it in place, with
    /// its name, MAC, addresses and routes, wherever it lives (carrier down while nobody
    /// serves it); opening it again by name, in its namespace, re-attaches to it. Clearing the
    /// flag makes the device go with the last file descriptor, as a TAP that was never
    /// persistent does.
    pub fn set_persist(&self, on: bool) -> io::Result<()> {
        crate::sys::tun_set_persist(self.file.as_raw_fd(), on)
    }

    /// Sets the device's MAC, wherever it lives now (its namespace and name may have changed
    /// since it was opened: the ioctl goes through the TAP's own descriptor).
    pub fn set_mac(&self, mac: crate::wire::mac::MacAddr) -> io::Result<()> {
        crate::sys::tun_set_hwaddr(self.file.as_raw_fd(), mac.0)
    }

    /// The device's name now: [`Port::name`] is the name it was opened by, but the device may
    /// have been renamed since (a pod renames its TAP `eth0` inside its namespace).
    pub fn current_name(&self) -> io::Result<String> {
        crate::sys::tun_get_iff(self.file.as_raw_fd()).map(|(name, _)| name)
    }

    /// A new file descriptor of the network namespace the device lives in now (it may have
    /// been moved since it was opened), e.g. to compare its inode with a namespace file's or
    /// to `setns` into it. Needs Linux 5.2 or later.
    pub fn netns(&self) -> io::Result<std::os::fd::OwnedFd> {
        crate::sys::tun_dev_netns(self.file.as_raw_fd())
    }
}

impl std::os::fd::AsFd for TapPort {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.file)
    }
}

fn tx_reason(e: &io::Error) -> DropReason {
    super::tx_drop_reason(e.raw_os_error().unwrap_or(0))
}

impl Port for TapPort {
    fn name(&self) -> &str {
        &self.name
    }

    fn recv_batch(&self, pool: &mut BufPool, batch: &mut Batch) -> io::Result<usize> {
        self.recv_from(&self.file, pool, batch)
    }

    fn rx_queues(&self) -> usize {
        self.more.len() + 1
    }

    fn recv_queue(&self, q: usize, pool: &mut BufPool, batch: &mut Batch) -> io::Result<usize> {
        self.recv_from(self.queue(q), pool, batch)
    }

    fn rx_queue_fd(&self, q: usize) -> Option<RawFd> {
        Some(self.queue(q).as_raw_fd())
    }

    fn send(&self, buf: &PacketBuf) -> Result<(), DropReason> {
        let file = self.tx_queue(buf.frame());
        let tunnel_gso = buf.offload.is_tunnel_gso();
        if self.tunnel {
            // A VXLAN super-frame (encapsulated by tapyard: a 20-byte outer IPv4 header or a
            // 40-byte IPv6 one without extension headers, outer UDP checksum left partial)
            // whose outer length fits goes whole; the kernel segments it. Anything else goes
            // with the offsets zero.
            let mut hdr = [0u8; VNET_HDR_TUNNEL_LEN];
            // Where the outer UDP and the inner frame start, and the longest frame whose
            // outer IPv4 total length or IPv6 payload length (16-bit) is true.
            let (outer_th, overhead, max_len) =
                if buf.offload.gso_type & VIRTIO_NET_HDR_GSO_UDP_TUNNEL_IPV6 != 0 {
                    (
                        vxlan::OUTER6_L4,
                        vxlan::overhead::<std::net::Ipv6Addr>(),
                        vxlan::OUTER6_L4 + 65_535,
                    )
                } else {
                    (
                        vxlan::OUTER_L4,
                        vxlan::OVERHEAD,
                        ethernet::HEADER_LEN + 65_535,
                    )
                };
            if tunnel_gso && buf.len() <= max_len {
                let mut h = buf.offload;
                h.flags |= VIRTIO_NET_HDR_F_UDP_TUNNEL_CSUM;
                let inner_nh = overhead + ethernet::HEADER_LEN;
                h.emit_tunnel(&mut hdr, len16(outer_th), len16(inner_nh));
            } else if !tunnel_gso {
                buf.offload.emit_tunnel(&mut hdr, 0, 0);
            } else {
                return crate::offload::send_completed(buf, &mut |f| {
                    crate::sys::writev2(self.file.as_raw_fd(), &hdr, f)
                        .map(|_| ())
                        .map_err(|e| tx_reason(&e))
                });
            }
            return crate::sys::writev2(self.file.as_raw_fd(), &hdr, buf.frame())
                .map(|_| ())
                .map_err(|e| tx_reason(&e));
        }
        if self.vnet && tunnel_gso {
            // A VXLAN super-frame and no UDP-tunnel GSO: it is segmented here and each
            // segment goes with an empty virtio-net header.
            let none = [0u8; VNET_HDR_LEN];
            return crate::offload::send_completed(buf, &mut |f| {
                crate::sys::writev2(file.as_raw_fd(), &none, f)
                    .map(|_| ())
                    .map_err(|e| tx_reason(&e))
            });
        }
        if self.vnet {
            let mut hdr = [0u8; VNET_HDR_LEN];
            buf.offload.emit(&mut hdr);
            return crate::sys::writev2(file.as_raw_fd(), &hdr, buf.frame())
                .map(|_| ())
                .map_err(|e| tx_reason(&e));
        }
        if !buf.offload.is_none() {
            return crate::offload::send_completed(buf, &mut |f| {
                (&*file).write(f).map(|_| ()).map_err(|e| tx_reason(&e))
            });
        }
        (&*file)
            .write(buf.frame())
            .map(|_| ())
            .map_err(|e| tx_reason(&e))
    }

    fn rx_fd(&self) -> Option<RawFd> {
        Some(self.file.as_raw_fd())
    }

    fn raw_rx(&self, q: usize) -> Option<(RawFd, usize)> {
        Some((self.queue(q).as_raw_fd(), self.vnet_len()))
    }

    fn raw_rx_done(&self, buf: &mut PacketBuf, len: usize) -> bool {
        self.finish_read(buf, len)
    }

    fn raw_tx(&self, buf: &PacketBuf, hdr: &mut [u8]) -> Option<(RawFd, usize)> {
        // What `send` does with one plain write; the rest (tunnel uplinks, super-frames
        // segmented in software) goes through `send`.
        if self.tunnel {
            return None;
        }
        let fd = self.tx_queue(buf.frame()).as_raw_fd();
        if self.vnet {
            if buf.offload.is_tunnel_gso() {
                return None;
            }
            let h: &mut [u8; VNET_HDR_LEN] = hdr.get_mut(..VNET_HDR_LEN)?.try_into().ok()?;
            buf.offload.emit(h);
            return Some((fd, VNET_HDR_LEN));
        }
        buf.offload.is_none().then_some((fd, 0))
    }

    fn frame_room(&self) -> usize {
        if self.vnet {
            OFFLOAD_FRAME_ROOM
        } else {
            DEFAULT_FRAME_ROOM
        }
    }
}

impl TapPort {
    /// Finishes a read of `len` bytes (virtio-net header included) into `b`; false if it is
    /// shorter than the header.
    #[inline]
    fn finish_read(&self, b: &mut PacketBuf, len: usize) -> bool {
        let front = self.vnet_len();
        if len < front {
            return false;
        }
        if self.vnet {
            // The tunnel header's offsets are not kept: decapsulation finds the headers itself.
            let room = b.room_with_front_mut(front);
            b.offload = VirtioNetHdr::parse(room).unwrap_or_default();
        }
        // A read that fills the buffer may have been cut by the kernel.
        b.oversize = len - front >= b.room();
        b.set_len(len - front);
        true
    }

    /// Receives a batch from one queue's descriptor (see [`Port::recv_batch`]).
    fn recv_from(&self, file: &File, pool: &mut BufPool, batch: &mut Batch) -> io::Result<usize> {
        let front = self.vnet_len();
        let mut n = 0;
        while !batch.is_full() {
            let Some(mut b) = pool.get() else { break };
            match (&*file).read(b.room_with_front_mut(front)) {
                Ok(len) if self.finish_read(&mut b, len) => {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> bool {
        std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|u| u == "0"))
                .unwrap_or(false)
        }) && std::path::Path::new("/dev/net/tun").exists()
    }

    #[test]
    fn from_fd_refuses_what_is_not_a_tap() {
        let f = File::open("/dev/null").unwrap();
        let e = TapPort::from_fd(OwnedFd::from(f), false).unwrap_err();
        assert!(
            e.to_string().contains("is not an attached TAP device"),
            "{e}"
        );
    }

    #[test]
    fn from_fd_adopts_an_open_tap_and_checks_its_framing() {
        if !root() {
            eprintln!("skipping: needs root and /dev/net/tun to create a TAP device");
            return;
        }
        let name = format!("tyfd{}", std::process::id() % 100_000);
        for offloads in [false, true] {
            let p = if offloads {
                TapPort::open_offload(&name)
            } else {
                TapPort::open(&name)
            }
            .unwrap();
            let dup = || p.handover_fd().try_clone_to_owned().unwrap();
            let e = TapPort::from_fd(dup(), !offloads).unwrap_err();
            assert!(e.to_string().contains("virtio-net header"), "{e}");
            let q = TapPort::from_fd(dup(), offloads).unwrap();
            assert_eq!((q.name(), q.offloads()), (name.as_str(), offloads));
            assert_eq!(q.frame_room(), p.frame_room());
            // The same device: with the first port gone, the second keeps it alive.
            drop(p);
            assert!(std::path::Path::new("/sys/class/net").join(&name).exists());
            drop(q);
        }
    }
}
