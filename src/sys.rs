//! The few raw syscalls the port drivers and the runtime need, each wrapped safely.
//! This is the crate's only module with `unsafe` code.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// Puts `fd` in non-blocking mode.
pub(crate) fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a caller-provided fd with integer arguments; no memory is passed.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// An eventfd used to wake threads blocked in [`poll_readable`].
#[derive(Debug)]
pub(crate) struct EventFd(OwnedFd);

impl EventFd {
    pub(crate) fn new() -> io::Result<EventFd> {
        // SAFETY: eventfd takes integer arguments and returns a new fd or -1.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh, valid descriptor that nothing else owns.
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Makes the fd readable (wakes every poller).
    pub(crate) fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live local u64 to our own eventfd.
        unsafe {
            libc::write(self.0.as_raw_fd(), (&one as *const u64).cast(), 8);
        }
    }

    pub(crate) fn fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// Waits until one of `fds` is readable or `timeout` passes. Returns how many are ready
/// (0 on timeout or when interrupted by a signal).
pub(crate) fn poll_readable(fds: &mut [libc::pollfd], timeout: Duration) -> io::Result<usize> {
    let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: `fds` is a valid, exclusively borrowed array of pollfd of the length given.
    let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(0);
        }
        return Err(e);
    }
    Ok(r as usize)
}

/// A pollfd asking for readability of `fd`.
pub(crate) fn pollfd(fd: RawFd) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

/// Hints the CPU to bring the cache line at `p` into cache. `p` may be any address, even one
/// past a table's end (as the LPM's look-ahead computes): a prefetch never faults.
#[inline(always)]
pub(crate) fn prefetch_ptr<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is only a hint; it never faults and never dereferences, whatever the
    // address, and it changes no memory or program state.
    unsafe {
        std::arch::x86_64::_mm_prefetch(p.cast::<i8>(), std::arch::x86_64::_MM_HINT_T0);
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Hints the CPU to bring `*r` into cache; no effect on memory or program state.
#[inline(always)]
pub(crate) fn prefetch<T>(r: &T) {
    prefetch_ptr(r as *const T);
}

const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const TUNSETOFFLOAD: libc::c_ulong = 0x4004_54d0;
const TUNSETVNETHDRSZ: libc::c_ulong = 0x4004_54d8;
const IFF_TAP: libc::c_short = 0x0002;
const IFF_NO_PI: libc::c_short = 0x1000;
const IFF_VNET_HDR: libc::c_short = 0x4000;
const TUN_F_CSUM: libc::c_uint = 0x01;
const TUN_F_TSO4: libc::c_uint = 0x02;
const TUN_F_TSO6: libc::c_uint = 0x04;
const TUN_F_TSO_ECN: libc::c_uint = 0x08;

/// Opens `/dev/net/tun` as TAP device `name` with a virtio-net header on every frame and the
/// checksum and TSO offloads enabled (what tun-tap cannot do). Returns the fd and the name.
pub(crate) fn open_tap_vnet(name: &str) -> io::Result<(std::fs::File, String)> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open("/dev/net/tun")?;
    // struct ifreq: 16 bytes of name, then a union whose first member is `short ifr_flags`.
    let mut ifr = [0u8; 40];
    let n = name.len().min(15);
    ifr[..n].copy_from_slice(&name.as_bytes()[..n]);
    let flags = IFF_TAP | IFF_NO_PI | IFF_VNET_HDR;
    ifr[16..18].copy_from_slice(&flags.to_ne_bytes());
    let fd = f.as_raw_fd();
    // SAFETY: TUNSETIFF reads and writes a struct ifreq (40 bytes); `ifr` is 40 live bytes.
    if unsafe { libc::ioctl(fd, TUNSETIFF, ifr.as_mut_ptr()) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let hdr_len: libc::c_int = 10;
    // SAFETY: TUNSETVNETHDRSZ reads one int through the pointer, which points at a live local.
    if unsafe { libc::ioctl(fd, TUNSETVNETHDRSZ, &hdr_len as *const libc::c_int) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let offloads = TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6 | TUN_F_TSO_ECN;
    // SAFETY: TUNSETOFFLOAD takes the flags as the integer argument itself; no memory is passed.
    if unsafe { libc::ioctl(fd, TUNSETOFFLOAD, offloads as libc::c_ulong) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let end = ifr[..16].iter().position(|&b| b == 0).unwrap_or(16);
    Ok((f, String::from_utf8_lossy(&ifr[..end]).into_owned()))
}

/// Writes `a` then `b` as one datagram (`writev`), e.g. a virtio-net header and a frame.
pub(crate) fn writev2(fd: RawFd, a: &[u8], b: &[u8]) -> io::Result<usize> {
    let iov = [
        libc::iovec {
            iov_base: a.as_ptr() as *mut libc::c_void,
            iov_len: a.len(),
        },
        libc::iovec {
            iov_base: b.as_ptr() as *mut libc::c_void,
            iov_len: b.len(),
        },
    ];
    // SAFETY: both iovecs describe live, readable slices for the duration of the call; writev
    // only reads them.
    let r = unsafe { libc::writev(fd, iov.as_ptr(), 2) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r as usize)
}

/// Takes ownership of a file descriptor handed over by `IntoRawFd::into_raw_fd`.
pub(crate) fn file_from_owned_fd(fd: RawFd) -> std::fs::File {
    use std::os::fd::FromRawFd;
    // SAFETY: callers pass an fd from `into_raw_fd`, so it is open and owned by no one else.
    unsafe { std::fs::File::from_raw_fd(fd) }
}
