//! The few raw syscalls the port drivers and the runtime need, and the huge-page-backed array
//! the big tables use ([`BigSlice`]), each wrapped safely.
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

    /// Consumes pending signals, so the fd stops being readable until the next one.
    pub(crate) fn drain(&self) {
        let mut v: u64 = 0;
        // SAFETY: reads at most 8 bytes into a live local u64 from our own non-blocking
        // eventfd; a failure (nothing pending: EAGAIN) leaves `v` untouched.
        unsafe {
            libc::read(self.0.as_raw_fd(), (&mut v as *mut u64).cast(), 8);
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

/// Arrays of at least this many bytes are allocated on 2 MiB boundaries, rounded up to a
/// multiple of it, and advised for transparent huge pages (see [`BigSlice`]).
pub(crate) const HUGE_PAGE: usize = 2 << 20;

/// A fixed-length, heap-allocated array, like `Box<[T]>`, for big lookup tables that are read at
/// random: when it takes at least [`HUGE_PAGE`] bytes it is allocated 2 MiB-aligned (its size
/// rounded up to a multiple of 2 MiB) and advised `MADV_HUGEPAGE` before its first touch, so that
/// with transparent huge pages in `madvise` (or `always`) mode the kernel backs it with 2 MiB
/// pages and a random lookup costs no TLB miss, or a short page walk. Without THP (or on
/// another OS) it is an ordinary allocation; the advice is only a hint and its failure is
/// ignored. Smaller arrays are plain allocations (a huge page would cost 2 MiB of memory).
///
/// A `BigSlice` of an [`AnyBits`] type can also be a window on a shared file mapping
/// ([`BigSlice::in_map`]), for tables that outlive the process.
pub(crate) struct BigSlice<T> {
    ptr: std::ptr::NonNull<T>,
    len: usize,
    /// The layout it was allocated with; `None` for a zero-sized allocation (dangling `ptr`).
    layout: Option<std::alloc::Layout>,
    /// The file mapping the elements live in, if any (then `layout` is `None` and nothing is
    /// dropped or freed here: the mapping is unmapped when its last user goes).
    map: Option<std::sync::Arc<FileMap>>,
    _owns: std::marker::PhantomData<T>,
}

// SAFETY: a BigSlice owns its elements exactly as a Box<[T]> does (unique pointer, no shared
// state), so it may be sent when T may be sent.
unsafe impl<T: Send> Send for BigSlice<T> {}
// SAFETY: `&BigSlice<T>` only hands out `&[T]`, so sharing it is sharing `&T`.
unsafe impl<T: Sync> Sync for BigSlice<T> {}

impl<T> BigSlice<T> {
    /// `len` elements, element `i` being `f(i)`. Aborts on allocation failure, panics when the
    /// size overflows, like `Vec`. A panic in `f` leaks the allocation (never unsound).
    pub(crate) fn from_fn(len: usize, mut f: impl FnMut(usize) -> T) -> BigSlice<T> {
        use std::alloc::{alloc, handle_alloc_error, Layout};
        let bytes = std::mem::size_of::<T>()
            .checked_mul(len)
            .expect("BigSlice: size overflow");
        let (ptr, layout) = if bytes == 0 {
            // Nothing to allocate: a dangling, well-aligned pointer, as Vec uses.
            (std::ptr::NonNull::dangling(), None)
        } else {
            let huge = bytes >= HUGE_PAGE;
            let layout = if huge {
                let size = bytes
                    .checked_next_multiple_of(HUGE_PAGE)
                    .expect("BigSlice: size overflow");
                Layout::from_size_align(size, HUGE_PAGE.max(std::mem::align_of::<T>()))
            } else {
                Layout::array::<T>(len)
            }
            .expect("BigSlice: size overflow");
            // SAFETY: `layout` has a non-zero size (bytes > 0 and size >= bytes).
            let raw = unsafe { alloc(layout) };
            let Some(ptr) = std::ptr::NonNull::new(raw.cast::<T>()) else {
                handle_alloc_error(layout);
            };
            if huge {
                advise_huge(raw, layout.size());
            }
            (ptr, Some(layout))
        };
        for i in 0..len {
            let v = f(i);
            // SAFETY: `i < len`, so the element lies inside the allocation (of at least
            // `len * size_of::<T>()` bytes, aligned for T), or T is zero-sized and any aligned
            // pointer will do; it is uninitialised, and `write` does not drop the old value.
            unsafe { ptr.as_ptr().add(i).write(v) };
        }
        BigSlice {
            ptr,
            len,
            layout,
            map: None,
            _owns: std::marker::PhantomData,
        }
    }
}

impl<T> BigSlice<T> {
    /// Bytes allocated (the elements' size, rounded up to 2 MiB when advised huge).
    pub(crate) fn alloc_bytes(&self) -> usize {
        match &self.map {
            Some(_) => self.len * std::mem::size_of::<T>(),
            None => self.layout.map_or(0, |l| l.size()),
        }
    }
}

/// Advises the kernel to back `len` bytes at `p` (2 MiB-aligned, allocated, not yet touched)
/// with transparent huge pages. Only a hint: errors (no THP, another OS) are ignored.
fn advise_huge(p: *mut u8, len: usize) {
    #[cfg(target_os = "linux")]
    // SAFETY: madvise(MADV_HUGEPAGE) only changes how the kernel backs the range, never its
    // contents or validity; the range is part of an allocation we own.
    unsafe {
        libc::madvise(p.cast(), len, libc::MADV_HUGEPAGE);
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (p, len);
}

impl<T> std::ops::Deref for BigSlice<T> {
    type Target = [T];
    #[inline(always)]
    fn deref(&self) -> &[T] {
        // SAFETY: `ptr` points at `len` initialised elements (or is dangling and aligned with
        // a zero-sized total), owned by self and alive for as long as the borrow of self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T> std::ops::DerefMut for BigSlice<T> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as in `deref`, and `&mut self` makes the borrow unique.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<T> Drop for BigSlice<T> {
    fn drop(&mut self) {
        if self.map.is_some() {
            // Elements in a file mapping are `AnyBits` (no drop glue) and belong to the file;
            // the mapping goes with its last `Arc`.
            return;
        }
        // SAFETY: the `len` elements are initialised and dropped exactly once, here; the memory
        // is then freed with the layout it was allocated with (if it was allocated at all).
        unsafe {
            std::ptr::drop_in_place(std::ptr::slice_from_raw_parts_mut(
                self.ptr.as_ptr(),
                self.len,
            ));
            if let Some(layout) = self.layout {
                std::alloc::dealloc(self.ptr.as_ptr().cast(), layout);
            }
        }
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for BigSlice<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

// ---- shared file mappings: tables that outlive the process ---------------------------------

/// Types for which every bit pattern is a valid value and that own nothing (no drop glue, no
/// pointers or references): atomics of plain integers, and arrays and structs of them. A file
/// mapping may hold anything — what a killed process half wrote, random bytes — so only such
/// types may be read from one ([`BigSlice::in_map`]).
///
/// # Safety
/// Implement it only for such types. Outside this module only [`atomic_words!`] implements
/// it, for structs whose every field is `AnyBits` (checked when the struct is compiled).
pub(crate) unsafe trait AnyBits: Sync {}

// SAFETY: an AtomicU64 is 8 bytes of integer behind an UnsafeCell: any bits are a valid value
// and it owns nothing.
unsafe impl AnyBits for std::sync::atomic::AtomicU64 {}
// SAFETY: as AtomicU64, with 4 bytes.
unsafe impl AnyBits for std::sync::atomic::AtomicU32 {}
// SAFETY: an array of `AnyBits` elements has no bytes of its own besides theirs.
unsafe impl<T: AnyBits, const N: usize> AnyBits for [T; N] {}

/// Declares a struct made only of [`AnyBits`] fields (atomics and arrays of them) and
/// implements `AnyBits` for it, so that it can live in a shared file mapping. A field of any
/// other type does not compile.
macro_rules! atomic_words {
    ($(#[$m:meta])* $vis:vis struct $name:ident {
        $($(#[$fm:meta])* $fvis:vis $f:ident : $t:ty),* $(,)?
    }) => {
        $(#[$m])*
        $vis struct $name { $($(#[$fm])* $fvis $f: $t),* }
        const _: () = {
            const fn any_bits<T: $crate::sys::AnyBits>() {}
            $(any_bits::<$t>();)*
        };
        // SAFETY: every field is `AnyBits` (the constant above does not compile otherwise), so
        // any bits are a valid value of each field; padding bytes have no validity
        // requirement; a struct of fields that own nothing owns nothing.
        #[allow(unsafe_code)]
        unsafe impl $crate::sys::AnyBits for $name {}
    };
    // A struct generic over one `const` length (e.g. `[AtomicU64; W]` fields): `AnyBits` is
    // implemented for every length at which all fields are `AnyBits`.
    ($(#[$m:meta])* $vis:vis struct $name:ident<const $w:ident: usize> {
        $($(#[$fm:meta])* $fvis:vis $f:ident : $t:ty),* $(,)?
    }) => {
        $(#[$m])*
        $vis struct $name<const $w: usize> { $($(#[$fm])* $fvis $f: $t),* }
        // SAFETY: as above; the where-clause makes the impl exist only where every field is
        // `AnyBits`.
        #[allow(unsafe_code)]
        unsafe impl<const $w: usize> $crate::sys::AnyBits for $name<$w>
        where
            $($t: $crate::sys::AnyBits),*
        {}
    };
}
pub(crate) use atomic_words;

/// A whole file mapped shared and read-write (`MAP_SHARED`): stores are the file's contents at
/// once, for other processes mapping it and for this program after a restart. Unmapped when
/// the last [`BigSlice`] on it goes.
#[derive(Debug)]
pub(crate) struct FileMap {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
    /// Whether the file's pages were made huge pages and mapped with them (see [`FileMap::map`]).
    huge: bool,
}

// SAFETY: the mapping is plain shared memory; it is only reached as `AnyBits` elements through
// `BigSlice` (atomics), which are Sync, so it may be used and unmapped from any thread.
unsafe impl Send for FileMap {}
// SAFETY: as above: `&FileMap` gives access to nothing but its length.
unsafe impl Sync for FileMap {}

impl FileMap {
    /// Maps the first `len` bytes of `file` (open for reading and writing, at least `len`
    /// bytes long, and reserved: see [`reserve`]), and faults the whole mapping in, so that
    /// no later access takes a page fault.
    ///
    /// When it takes 2 MiB or more, the mapping starts on a 2 MiB boundary and its pages are
    /// made transparent huge pages: advised `MADV_HUGEPAGE`, then `MADV_COLLAPSE` (Linux 6.1+),
    /// which turns a tmpfs file's pages into 2 MiB folios and maps them with PMDs even when
    /// `shmem_enabled` is `never` and the mount has no `huge=` (only `deny` stops it). A
    /// random lookup in a big table then costs no TLB miss, or a short page walk, as in an
    /// anonymous [`BigSlice`]. Pages already huge (a takeover's successor mapping the same
    /// file, a restart) are only mapped. Where that is not possible (an older kernel, a file
    /// system without huge pages, no free huge page) the mapping stays on small pages:
    /// [`FileMap::huge`] says which.
    pub(crate) fn map(file: &std::fs::File, len: usize) -> io::Result<std::sync::Arc<FileMap>> {
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty mapping"));
        }
        let big = len >= HUGE_PAGE;
        // Where to map: a 2 MiB boundary inside a reservation 2 MiB longer than the file (an
        // anonymous, inaccessible range), so that the file's offset 0 and every 2 MiB after it
        // fall on PMD boundaries.
        let at = if big {
            Some(reserve_aligned(len)?)
        } else {
            None
        };
        // SAFETY: maps the fd we hold open either where the kernel chooses, or with MAP_FIXED
        // over `at..at + len`, which lies inside our own PROT_NONE reservation (nothing else
        // can be there: the range was mapped by us and nothing refers to it). The result is
        // checked against MAP_FAILED.
        let p = unsafe {
            libc::mmap(
                at.unwrap_or(std::ptr::null_mut()).cast(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | if at.is_some() { libc::MAP_FIXED } else { 0 },
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            let e = io::Error::last_os_error();
            if let Some(at) = at {
                // SAFETY: unmaps our own reservation, which nothing refers to.
                unsafe { libc::munmap(at.cast(), len) };
            }
            return Err(e);
        }
        let Some(ptr) = std::ptr::NonNull::new(p.cast::<u8>()) else {
            return Err(io::Error::other("mmap returned null"));
        };
        let mut huge = false;
        if big {
            advise_huge(ptr.as_ptr(), len);
            huge = collapse(ptr.as_ptr(), len);
        }
        populate_write(ptr.as_ptr(), len);
        Ok(std::sync::Arc::new(FileMap { ptr, len, huge }))
    }

    /// Bytes mapped.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether the whole mapping is on transparent huge pages (`MADV_COLLAPSE` succeeded).
    pub(crate) fn huge(&self) -> bool {
        self.huge
    }
}

/// Reserves `len + 2 MiB` bytes of address space (anonymous, `PROT_NONE`, no memory
/// committed) and gives back its first 2 MiB boundary, with the slack before it and after
/// `len` bytes from it unmapped again: `len` bytes of address space, 2 MiB-aligned, for
/// `MAP_FIXED`.
fn reserve_aligned(len: usize) -> io::Result<*mut u8> {
    let total = len
        .checked_add(HUGE_PAGE)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "mapping too large"))?;
    // SAFETY: a new anonymous mapping where the kernel chooses; no existing memory is
    // touched. Checked against MAP_FAILED.
    let base = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            total,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if base == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    let base = base.cast::<u8>();
    let lead = (base as usize).next_multiple_of(HUGE_PAGE) - base as usize;
    // SAFETY: `lead < HUGE_PAGE`, so `base + lead` and `base + lead + len` lie inside (or at
    // the end of) the reservation; the two munmaps remove its head and tail, both ours and
    // unused.
    unsafe {
        let at = base.add(lead);
        if lead > 0 {
            libc::munmap(base.cast(), lead);
        }
        let tail = total - lead - len;
        if tail > 0 {
            libc::munmap(at.add(len).cast(), tail);
        }
        Ok(at)
    }
}

/// `MADV_COLLAPSE` on `len` bytes at `p` (2 MiB-aligned, a multiple of 2 MiB, a file mapping
/// of ours): true when every 2 MiB of it is now a huge page mapped with a PMD. One retry of
/// a transient failure (`EAGAIN`).
fn collapse(p: *mut u8, len: usize) -> bool {
    for _ in 0..2 {
        // SAFETY: madvise(MADV_COLLAPSE) changes how the kernel backs the range (it copies
        // the pages into huge ones), never its contents; the range is our mapping.
        if unsafe { libc::madvise(p.cast(), len, libc::MADV_COLLAPSE) } == 0 {
            return true;
        }
        if io::Error::last_os_error().raw_os_error() != Some(libc::EAGAIN) {
            return false;
        }
    }
    false
}

/// Faults in `len` bytes at `p` for writing (`MADV_POPULATE_WRITE`, Linux 5.14+), so the
/// fast path takes no page fault on its first touches. Only an optimisation: errors (an older
/// kernel) are ignored.
fn populate_write(p: *mut u8, len: usize) {
    // SAFETY: madvise(MADV_POPULATE_WRITE) faults the pages in as a write would, without
    // changing their contents; the range is our read-write mapping.
    unsafe {
        libc::madvise(p.cast(), len, libc::MADV_POPULATE_WRITE);
    }
}

/// Allocates the first `len` bytes of `file` on its file system (`posix_fallocate`: blocks
/// reserved, contents kept, the file extended to `len` bytes if shorter), so that a store into
/// a shared mapping of it can never find the file system full (which is a `SIGBUS`). The error
/// is the system's: `ENOSPC` when there is not room enough.
pub(crate) fn reserve(file: &std::fs::File, len: u64) -> io::Result<()> {
    let len = libc::off_t::try_from(len)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "file too large"))?;
    // SAFETY: posix_fallocate on an fd we hold open, integer arguments only.
    match unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len) } {
        0 => Ok(()),
        e => Err(io::Error::from_raw_os_error(e)),
    }
}

/// Bytes free for an unprivileged user on `file`'s file system (`fstatvfs`).
pub(crate) fn free_bytes(file: &std::fs::File) -> io::Result<u64> {
    // SAFETY: an all-zero statvfs is a valid value of this plain C struct.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: fstatvfs on an fd we hold open, writing into `st`, which we own.
    if unsafe { libc::fstatvfs(file.as_raw_fd(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    #[allow(
        clippy::useless_conversion,
        reason = "the fields' types differ by target"
    )]
    Ok(u64::from(st.f_bavail).saturating_mul(u64::from(st.f_frsize)))
}

/// The effective user id of this process.
pub(crate) fn euid() -> u32 {
    // SAFETY: geteuid has no arguments and cannot fail.
    unsafe { libc::geteuid() }
}

impl Drop for FileMap {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the range `map` mapped; no BigSlice on it is left (each holds
        // an Arc of this mapping), so nothing refers to it any more.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

impl<T: AnyBits> BigSlice<T> {
    /// `len` elements of `map` from byte `offset`, as they are in the file (any bits are a
    /// valid `T`). Errors when the range is not inside the mapping or `offset` is not aligned
    /// for `T`.
    pub(crate) fn in_map(
        map: &std::sync::Arc<FileMap>,
        offset: usize,
        len: usize,
    ) -> io::Result<BigSlice<T>> {
        let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidInput, what.to_string());
        let bytes = std::mem::size_of::<T>()
            .checked_mul(len)
            .ok_or_else(|| bad("size overflow"))?;
        let end = offset
            .checked_add(bytes)
            .ok_or_else(|| bad("size overflow"))?;
        // The mapping starts on a page boundary, so an offset aligned for T gives an aligned
        // pointer (no T here is aligned to more than a page).
        if end > map.len
            || offset % std::mem::align_of::<T>() != 0
            || std::mem::align_of::<T>() > 4096
        {
            return Err(bad("range outside the mapping or misaligned"));
        }
        // SAFETY: `offset <= end <= map.len`, so the pointer stays inside the mapping.
        let p = unsafe { map.ptr.as_ptr().add(offset) };
        let Some(ptr) = std::ptr::NonNull::new(p.cast::<T>()) else {
            return Err(bad("null"));
        };
        Ok(BigSlice {
            ptr,
            len,
            layout: None,
            map: Some(map.clone()),
            _owns: std::marker::PhantomData,
        })
    }
}

/// Takes an exclusive `flock` on `file` without waiting: false when another open file
/// description (another process) holds one. Released when the file is closed.
pub(crate) fn try_lock_exclusive(file: &std::fs::File) -> io::Result<bool> {
    // SAFETY: flock on an fd we hold open, integer arguments only.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(true);
    }
    let e = io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        return Ok(false);
    }
    Err(e)
}

/// Microseconds of `CLOCK_MONOTONIC`: the time since boot (suspend excluded), the same in every
/// process of this boot, so times stored in a shared table stay comparable after a restart.
pub(crate) fn monotonic_us() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec through the pointer, a live local.
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
    }
    let s = u64::try_from(ts.tv_sec).unwrap_or(0);
    let ns = u64::try_from(ts.tv_nsec).unwrap_or(0);
    s.saturating_mul(1_000_000).saturating_add(ns / 1000)
}

/// This boot's identity (`/proc/sys/kernel/random/boot_id`, a UUID), as 16 bytes; `None` when
/// it cannot be read (not Linux, no /proc).
pub(crate) fn boot_id() -> Option<[u8; 16]> {
    let s = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let hex: Vec<u8> = s.bytes().filter(u8::is_ascii_hexdigit).collect();
    if hex.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (o, pair) in out.iter_mut().zip(hex.chunks(2)) {
        let txt = std::str::from_utf8(pair).ok()?;
        *o = u8::from_str_radix(txt, 16).ok()?;
    }
    Some(out)
}

const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const TUNSETOFFLOAD: libc::c_ulong = 0x4004_54d0;
const TUNSETVNETHDRSZ: libc::c_ulong = 0x4004_54d8;
pub(crate) const IFF_TAP: libc::c_short = 0x0002;
pub(crate) const IFF_NO_PI: libc::c_short = 0x1000;
pub(crate) const IFF_VNET_HDR: libc::c_short = 0x4000;
const TUN_F_CSUM: libc::c_uint = 0x01;
const TUN_F_TSO4: libc::c_uint = 0x02;
const TUN_F_TSO6: libc::c_uint = 0x04;
const TUN_F_TSO_ECN: libc::c_uint = 0x08;

/// Opens `/dev/net/tun` as TAP device `name` with a virtio-net header on every frame and the
/// checksum and TSO offloads enabled (what tun-tap cannot do). Returns the fd and the name.
pub(crate) fn open_tap_vnet(name: &str) -> io::Result<(std::fs::File, String)> {
    open_tap_with(name, true, false)
}

/// `IFF_MULTI_QUEUE`: each open of the device is one of its queues.
pub(crate) const IFF_MULTI_QUEUE: libc::c_short = 0x0100;

/// Opens `/dev/net/tun` as TAP device `name` (non-blocking, close-on-exec): with a virtio-net
/// header and the checksum/TSO offloads when `vnet`, as one queue of a multi-queue device
/// (`IFF_MULTI_QUEUE`; open it again for each further queue) when `multi_queue`.
pub(crate) fn open_tap_with(
    name: &str,
    vnet: bool,
    multi_queue: bool,
) -> io::Result<(std::fs::File, String)> {
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
    let mut flags = IFF_TAP | IFF_NO_PI;
    if vnet {
        flags |= IFF_VNET_HDR;
    }
    if multi_queue {
        flags |= IFF_MULTI_QUEUE;
    }
    ifr[16..18].copy_from_slice(&flags.to_ne_bytes());
    let fd = f.as_raw_fd();
    // SAFETY: TUNSETIFF reads and writes a struct ifreq (40 bytes); `ifr` is 40 live bytes.
    if unsafe { libc::ioctl(fd, TUNSETIFF, ifr.as_mut_ptr()) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let end = ifr[..16].iter().position(|&b| b == 0).unwrap_or(16);
    let name = String::from_utf8_lossy(&ifr[..end]).into_owned();
    if !vnet {
        return Ok((f, name));
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
    Ok((f, name))
}

const TUNGETVNETHDRSZ: libc::c_ulong = 0x8004_54d7;
const TUN_F_UDP_TUNNEL_GSO: libc::c_uint = 0x80;
const TUN_F_UDP_TUNNEL_GSO_CSUM: libc::c_uint = 0x100;

/// Switches an `open_tap_vnet` TAP to UDP-tunnel GSO (Linux 6.17 and later): a 24-byte
/// virtio-net header (`struct virtio_net_hdr_v1_hash_tunnel`) and `TUN_F_UDP_TUNNEL_GSO`
/// with `_CSUM` on top of the checksum and TSO offloads, so that VXLAN super-frames cross
/// the device whole both ways. When the kernel refuses the flags the device is left as it
/// was (10-byte header, TSO) and the error is returned. Call it before reading or writing.
pub(crate) fn tun_set_tunnel_offload(fd: RawFd) -> io::Result<()> {
    let set_len = |len: libc::c_int| {
        // SAFETY: TUNSETVNETHDRSZ reads one int through the pointer, which points at a live
        // local.
        if unsafe { libc::ioctl(fd, TUNSETVNETHDRSZ, &len as *const libc::c_int) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    };
    set_len(24)?;
    let offloads = TUN_F_CSUM
        | TUN_F_TSO4
        | TUN_F_TSO6
        | TUN_F_TSO_ECN
        | TUN_F_UDP_TUNNEL_GSO
        | TUN_F_UDP_TUNNEL_GSO_CSUM;
    // SAFETY: TUNSETOFFLOAD takes the flags as the integer argument itself; no memory is passed.
    if unsafe { libc::ioctl(fd, TUNSETOFFLOAD, offloads as libc::c_ulong) } < 0 {
        let e = io::Error::last_os_error();
        set_len(10)?;
        return Err(e);
    }
    Ok(())
}

/// The virtio-net header length of a TAP (`TUNGETVNETHDRSZ`).
pub(crate) fn tun_vnet_hdr_len(fd: RawFd) -> io::Result<usize> {
    let mut len: libc::c_int = 0;
    // SAFETY: TUNGETVNETHDRSZ writes one int through the pointer, which points at a live local.
    if unsafe { libc::ioctl(fd, TUNGETVNETHDRSZ, &mut len as *mut libc::c_int) } < 0 {
        return Err(io::Error::last_os_error());
    }
    usize::try_from(len).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))
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

// ---- Persistent TAPs: devices that outlive the process, found again where they live ----

const TUNSETPERSIST: libc::c_ulong = 0x4004_54cb;
const TUNGETIFF: libc::c_ulong = 0x8004_54d2;
const TUNGETDEVNETNS: libc::c_ulong = 0x54e3;

/// Sets or clears the persist flag of the TAP device attached to `fd` (`TUNSETPERSIST`): a
/// persistent device outlives the last file descriptor attached to it.
pub(crate) fn tun_set_persist(fd: RawFd, on: bool) -> io::Result<()> {
    // SAFETY: TUNSETPERSIST takes the flag as the integer argument itself; no memory is passed.
    if unsafe { libc::ioctl(fd, TUNSETPERSIST, libc::c_ulong::from(on)) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The current name of the device attached to `fd` (`TUNGETIFF`), in whichever namespace it
/// lives now, and its flags.
pub(crate) fn tun_get_iff(fd: RawFd) -> io::Result<(String, libc::c_short)> {
    // struct ifreq: 16 bytes of name, then a union whose first member is `short ifr_flags`.
    let mut ifr = [0u8; 40];
    // SAFETY: TUNGETIFF writes a struct ifreq (40 bytes) through the pointer; `ifr` is 40
    // live, writable bytes.
    if unsafe { libc::ioctl(fd, TUNGETIFF, ifr.as_mut_ptr()) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let end = ifr[..16].iter().position(|&b| b == 0).unwrap_or(16);
    let flags = libc::c_short::from_ne_bytes([ifr[16], ifr[17]]);
    Ok((String::from_utf8_lossy(&ifr[..end]).into_owned(), flags))
}

/// Sets the MAC of the device attached to `fd` (`SIOCSIFHWADDR` on the TAP's own descriptor,
/// which tun answers whichever namespace the device lives in now).
pub(crate) fn tun_set_hwaddr(fd: RawFd, mac: [u8; 6]) -> io::Result<()> {
    // struct ifreq: 16 bytes of name (unused here: tun acts on its own device), then a
    // struct sockaddr: `sa_family` (ARPHRD_ETHER) and the address in `sa_data`.
    let mut ifr = [0u8; 40];
    ifr[16..18].copy_from_slice(&libc::ARPHRD_ETHER.to_ne_bytes());
    ifr[18..24].copy_from_slice(&mac);
    // SAFETY: SIOCSIFHWADDR reads a struct ifreq (40 bytes) through the pointer; `ifr` is 40
    // live bytes.
    if unsafe { libc::ioctl(fd, libc::SIOCSIFHWADDR, ifr.as_mut_ptr()) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A new file descriptor of the network namespace the device attached to `fd` lives in now
/// (`TUNGETDEVNETNS`, Linux 5.2 and later).
pub(crate) fn tun_dev_netns(fd: RawFd) -> io::Result<OwnedFd> {
    // SAFETY: TUNGETDEVNETNS takes no argument and returns a new fd or -1.
    let ns = unsafe { libc::ioctl(fd, TUNGETDEVNETNS) };
    if ns < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `ns` is a fresh descriptor the kernel just opened for us; nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(ns) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn big_slice_small_huge_and_empty() {
        for len in [0usize, 1, 3, 1000, (HUGE_PAGE / 8) + 5, 3 * HUGE_PAGE / 8] {
            let mut s = BigSlice::from_fn(len, |i| i as u64);
            assert_eq!(s.len(), len);
            assert!(s.iter().enumerate().all(|(i, &v)| v == i as u64));
            if len * 8 >= HUGE_PAGE {
                assert_eq!(s.as_ptr() as usize % HUGE_PAGE, 0);
                assert_eq!(s.alloc_bytes(), (len * 8).next_multiple_of(HUGE_PAGE));
            } else {
                assert_eq!(s.alloc_bytes(), len * 8);
            }
            if let Some(x) = s.last_mut() {
                *x = 7;
            }
        }
        // Over-aligned elements and zero-sized ones.
        #[repr(align(64))]
        struct Line([u64; 8]);
        let s = BigSlice::from_fn(HUGE_PAGE / 64 + 1, |i| Line([i as u64; 8]));
        assert_eq!(s[HUGE_PAGE / 64].0[7], (HUGE_PAGE / 64) as u64);
        assert_eq!(s.as_ptr() as usize % HUGE_PAGE, 0);
        let z = BigSlice::from_fn(5, |_| ());
        assert_eq!(z.len(), 5);
    }

    #[test]
    fn big_slice_drops_each_element_once() {
        static DROPS: AtomicUsize = AtomicUsize::new(0);
        struct D;
        impl Drop for D {
            fn drop(&mut self) {
                DROPS.fetch_add(1, Ordering::Relaxed);
            }
        }
        drop(BigSlice::from_fn(10, |_| D));
        drop(BigSlice::from_fn(HUGE_PAGE, |_| D)); // zero-sized elements
        assert_eq!(DROPS.load(Ordering::Relaxed), 10 + HUGE_PAGE);
    }
}

/// Batched reads and writes through an io_uring ring (the `io-uring` crate): one
/// `io_uring_enter` system call carries a whole batch of reads or writes on non-blocking
/// descriptors (TAP devices).
///
/// Every operation is submitted with `RWF_NOWAIT` and completes inside the call that submits
/// it: a read that finds nothing completes with `EAGAIN` instead of being parked in the kernel,
/// so no operation is ever left in flight between calls (nothing keeps reading a descriptor
/// after a call returns, which is what pausing, handing a TAP over and closing a removed
/// port need). Should the kernel still defer one, the call waits for it, at most
/// [`Uring::WAIT`], then cancels it and waits for the cancellation.
pub(crate) mod uring {
    use std::io;
    use std::os::fd::RawFd;
    use std::time::Duration;

    use io_uring::{opcode, types, IoUring};

    /// The most operations one call submits.
    pub(crate) const MAX_OPS: usize = RING_ENTRIES as usize;
    /// Submission queue entries of a ring.
    const RING_ENTRIES: u32 = 64;
    /// The longest header a write puts in front of its frame.
    pub(crate) const HDR_MAX: usize = 24;
    /// The user data of cancel requests (operations use their index).
    const CANCEL: u64 = u64::MAX;

    /// A ring and the memory its operations point to (iovecs and write headers), which lives
    /// as long as the ring so that nothing it points to moves while the kernel uses it.
    pub(crate) struct Uring {
        ring: IoUring,
        iov: Box<[[libc::iovec; 2]; MAX_OPS]>,
        hdrs: Box<[[u8; HDR_MAX]; MAX_OPS]>,
    }

    // SAFETY: the iovecs only point into memory borrowed for the duration of one call (or
    // into `hdrs`, owned by the value), and no operation outlives a call, so moving the ring
    // to another thread between calls moves nothing the kernel still uses.
    unsafe impl Send for Uring {}

    impl std::fmt::Debug for Uring {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.debug_struct("Uring").finish_non_exhaustive()
        }
    }

    impl Uring {
        /// How long a call waits for an operation the kernel deferred before cancelling it.
        pub(crate) const WAIT: Duration = Duration::from_millis(10);

        /// A ring for [`MAX_OPS`] operations per call. Fails where io_uring is missing
        /// (before Linux 5.1, `CONFIG_IO_URING` off), disabled (`kernel.io_uring_disabled`) or
        /// refused (seccomp filters of container runtimes), or lacks the read/write
        /// operations (before Linux 5.6).
        pub(crate) fn new() -> io::Result<Uring> {
            let ring = IoUring::builder()
                .setup_coop_taskrun()
                .build(RING_ENTRIES)
                .or_else(|_| IoUring::new(RING_ENTRIES))?;
            if !ring.params().is_feature_ext_arg() {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    "io_uring without IORING_FEATURE_EXT_ARG (before Linux 5.11)",
                ));
            }
            let mut probe = io_uring::Probe::new();
            ring.submitter().register_probe(&mut probe)?;
            for code in [
                opcode::Read::CODE,
                opcode::Writev::CODE,
                opcode::AsyncCancel::CODE,
            ] {
                if !probe.is_supported(code) {
                    return Err(io::Error::new(
                        io::ErrorKind::Unsupported,
                        format!("io_uring lacks operation {code}"),
                    ));
                }
            }
            Ok(Uring {
                ring,
                iov: Box::new(
                    [[libc::iovec {
                        iov_base: std::ptr::null_mut(),
                        iov_len: 0,
                    }; 2]; MAX_OPS],
                ),
                hdrs: Box::new([[0; HDR_MAX]; MAX_OPS]),
            })
        }

        /// The header buffer of write `i` (below [`MAX_OPS`]; `i` modulo it otherwise), to be
        /// filled before [`Uring::write_batch`].
        pub(crate) fn hdr_mut(&mut self, i: usize) -> &mut [u8; HDR_MAX] {
            &mut self.hdrs[i % MAX_OPS]
        }

        /// Reads from `fd` into each of `bufs` (at most [`MAX_OPS`]; the rest are left alone)
        /// into the region `region` gives, in one system call, and stores each result in
        /// `out` (bytes read, or minus the errno: `-EAGAIN` when nothing was waiting).
        /// Returns how many reads were made. An error means the ring itself failed; nothing
        /// was read then.
        pub(crate) fn read_batch<B>(
            &mut self,
            fd: RawFd,
            bufs: &mut [B],
            region: impl Fn(&mut B) -> &mut [u8],
            out: &mut [i32],
        ) -> io::Result<usize> {
            let n = bufs.len().min(out.len()).min(MAX_OPS);
            {
                let mut sq = self.ring.submission();
                for (i, b) in bufs.iter_mut().take(n).enumerate() {
                    let r = region(b);
                    let len = u32::try_from(r.len()).unwrap_or(u32::MAX);
                    let e = opcode::Read::new(types::Fd(fd), r.as_mut_ptr(), len)
                        .offset(u64::MAX)
                        .rw_flags(libc::RWF_NOWAIT)
                        .build()
                        .user_data(i as u64);
                    // SAFETY: the buffer is borrowed mutably (through `bufs`) until this
                    // function returns, and `complete` waits for (or cancels) every operation
                    // before it returns, so the kernel writes only into live, unaliased
                    // memory. The queue holds MAX_OPS entries and is empty here.
                    if unsafe { sq.push(&e) }.is_err() {
                        return Err(io::Error::other("io_uring submission queue full"));
                    }
                }
            }
            self.complete(n, out)?;
            Ok(n)
        }

        /// Writes `n` frames (at most [`MAX_OPS`]) in one system call: frame `i` is the
        /// first `hdr_len` bytes of [`Uring::hdr_mut`]`(i)` followed by the bytes `frame(i)`
        /// gives, written to the descriptor it gives. Each result goes to `out` (bytes
        /// written or minus the errno). Returns how many writes were made.
        pub(crate) fn write_batch<'a>(
            &mut self,
            n: usize,
            mut frame: impl FnMut(usize) -> (RawFd, usize, &'a [u8]),
            out: &mut [i32],
        ) -> io::Result<usize> {
            let n = n.min(out.len()).min(MAX_OPS);
            {
                let mut sq = self.ring.submission();
                for i in 0..n {
                    let (fd, hdr_len, f) = frame(i);
                    let hdr_len = hdr_len.min(HDR_MAX);
                    self.iov[i] = [
                        libc::iovec {
                            iov_base: self.hdrs[i].as_mut_ptr().cast(),
                            iov_len: hdr_len,
                        },
                        libc::iovec {
                            iov_base: f.as_ptr().cast_mut().cast(),
                            iov_len: f.len(),
                        },
                    ];
                    let (iov, cnt) = if hdr_len == 0 {
                        (self.iov[i][1..].as_ptr(), 1)
                    } else {
                        (self.iov[i].as_ptr(), 2)
                    };
                    let e = opcode::Writev::new(types::Fd(fd), iov, cnt)
                        .offset(u64::MAX)
                        .rw_flags(libc::RWF_NOWAIT)
                        .build()
                        .user_data(i as u64);
                    // SAFETY: the iovecs live in `self.iov` and point into `self.hdrs` and
                    // into frames borrowed for 'a, which outlives this call; `complete` waits
                    // for (or cancels) every operation before returning, and the kernel only
                    // reads this memory.
                    if unsafe { sq.push(&e) }.is_err() {
                        return Err(io::Error::other("io_uring submission queue full"));
                    }
                }
            }
            self.complete(n, out)?;
            Ok(n)
        }

        /// Submits what is queued and collects `n` completions into `out` by their index.
        /// An operation not completed within [`Uring::WAIT`] is cancelled (its result is
        /// `-ECANCELED`); the call returns only once nothing is in flight. An error means the
        /// ring failed to take the queued operations: the ring must be dropped then (its
        /// queued entries are never submitted).
        fn complete(&mut self, n: usize, out: &mut [i32]) -> io::Result<()> {
            let ts = types::Timespec::from(Self::WAIT);
            let mut got = 0;
            // Completions still owed by cancel requests.
            let mut extra = 0usize;
            let mut cancelled = false;
            while got < n || extra > 0 {
                let args = types::SubmitArgs::new().timespec(&ts);
                let want = (n - got + extra).max(1);
                match self.ring.submitter().submit_with_args(want, &args) {
                    Ok(_) => {}
                    Err(e)
                        if matches!(
                            e.raw_os_error(),
                            Some(libc::ETIME | libc::EINTR | libc::EAGAIN | libc::EBUSY)
                        ) => {}
                    Err(e) => return Err(e),
                }
                let before = (got, extra);
                for c in self.ring.completion() {
                    match usize::try_from(c.user_data())
                        .ok()
                        .and_then(|i| out.get_mut(i))
                    {
                        Some(o) if c.user_data() != CANCEL => {
                            *o = c.result();
                            got += 1;
                        }
                        _ => extra = extra.saturating_sub(1),
                    }
                }
                if got < n && (got, extra) == before && !cancelled {
                    // Waited WAIT for nothing: cancel whatever is still in flight.
                    let e = opcode::AsyncCancel2::new(types::CancelBuilder::any())
                        .build()
                        .user_data(CANCEL);
                    // SAFETY: a cancel request points to no memory.
                    if unsafe { self.ring.submission().push(&e) }.is_ok() {
                        extra += 1;
                        cancelled = true;
                    }
                }
            }
            Ok(())
        }
    }
}
