//! The connection table in a shared-memory file, so that connections outlive the process
//! ([`Conntrack::open_file`](CtTable::open_file)); the format and what is kept after a crash are described in the
//! [`conntrack`](super) module docs ("Keeping the table in a file").

use std::fmt;
use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use super::table::{bucket_count, validate, Acct, Bucket, Entry, Rebuilt};
use super::{CtConfig, CtConfigError, CtKey, CtTable};
use crate::hash::SeededHash;
use crate::sys::{self, BigSlice, FileMap, HUGE_PAGE};
use crate::time::Instant;

/// "TAPYCT" and two bytes of version family, as the file's first word (an IPv4 table's).
const MAGIC: u64 = u64::from_le_bytes(*b"TAPYCT\0\x01");
/// The first word of an IPv6 table's file ([`super::ConntrackOf<Ipv6Addr>`](super::ConntrackOf)): another magic, so that
/// either table refuses the other's file as [`Refusal::Magic`] (never reads its entries as
/// its own), and IPv4 files written before tables had families open unchanged.
const MAGIC6: u64 = u64::from_le_bytes(*b"TAPYCT\x06\x01");

/// The magic number of a table file of address family `family`.
fn magic(family: u8) -> u64 {
    if family == 6 {
        MAGIC6
    } else {
        MAGIC
    }
}
/// The file format's version; a file of another version is refused.
pub const FORMAT_VERSION: u64 = 1;
/// Bytes of header before the first array's boundary are read as one page.
const HEADER_BYTES: usize = 4096;

// Header words.
const H_MAGIC: usize = 0;
const H_VERSION: usize = 1;
const H_HEADER: usize = 2;
const H_ENTRY_SIZE: usize = 3;
const H_ACCT_SIZE: usize = 4;
const H_BUCKET_SIZE: usize = 5;
const H_ENTRIES: usize = 6;
const H_BUCKETS: usize = 7;
const H_ENTRIES_OFF: usize = 8;
const H_ACCT_OFF: usize = 9;
const H_INDEX_OFF: usize = 10;
const H_FILE_LEN: usize = 11;
const H_SEED: usize = 12; // three words
const H_BOOT: usize = 15; // two words
const H_CHECKSUM: usize = 17;
/// Outside the checksum: 1 once a process detached cleanly, 0 while one uses the file.
const H_CLEAN: usize = 18;
/// Outside the checksum: the pid of the process that opened it last (for the log).
const H_PID: usize = 19;
const H_WORDS: usize = 20;

/// The page of a small table's file.
const SMALL_PAGE: usize = 4096;

/// Where everything goes in a file for `n` entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Layout {
    entries: usize,
    buckets: usize,
    entries_off: usize,
    acct_off: usize,
    index_off: usize,
    file_len: usize,
}

impl Layout {
    /// Each array starts on a page: a 2 MiB one (so each can be a huge page) when the table
    /// takes 2 MiB or more, else a 4 KiB one (a small table, such as a node's IPv6 table
    /// without IPv6 traffic, would otherwise reserve 8 MiB for a few KiB of entries).
    fn of<const W: usize>(n: usize) -> Layout {
        let at = |page: usize| {
            let up = |x: usize| x.next_multiple_of(page);
            let buckets = bucket_count(n);
            let entries_off = page;
            let acct_off = up(entries_off + n * size_of::<Entry<W>>());
            let index_off = up(acct_off + n * size_of::<Acct>());
            let file_len = up(index_off + buckets * size_of::<Bucket>());
            Layout {
                entries: n,
                buckets,
                entries_off,
                acct_off,
                index_off,
                file_len,
            }
        };
        let small = at(SMALL_PAGE);
        if small.file_len < HUGE_PAGE {
            small
        } else {
            at(HUGE_PAGE)
        }
    }

    /// The header words this build writes, checksum included.
    fn header<const W: usize>(&self, magic: u64, hash: [u64; 3], boot: [u8; 16]) -> [u64; H_WORDS] {
        let mut h = [0u64; H_WORDS];
        h[H_MAGIC] = magic;
        h[H_VERSION] = FORMAT_VERSION;
        h[H_HEADER] = HEADER_BYTES as u64;
        h[H_ENTRY_SIZE] = size_of::<Entry<W>>() as u64;
        h[H_ACCT_SIZE] = size_of::<Acct>() as u64;
        h[H_BUCKET_SIZE] = size_of::<Bucket>() as u64;
        h[H_ENTRIES] = self.entries as u64;
        h[H_BUCKETS] = self.buckets as u64;
        h[H_ENTRIES_OFF] = self.entries_off as u64;
        h[H_ACCT_OFF] = self.acct_off as u64;
        h[H_INDEX_OFF] = self.index_off as u64;
        h[H_FILE_LEN] = self.file_len as u64;
        h[H_SEED..H_SEED + 3].copy_from_slice(&hash);
        let mut b = [0u8; 8];
        b.copy_from_slice(&boot[..8]);
        h[H_BOOT] = u64::from_le_bytes(b);
        b.copy_from_slice(&boot[8..]);
        h[H_BOOT + 1] = u64::from_le_bytes(b);
        h[H_CHECKSUM] = checksum(&h[..H_CHECKSUM]);
        h
    }
}

/// A checksum of the header words (splitmix64 steps over each word).
fn checksum(words: &[u64]) -> u64 {
    let mut h = 0x243f_6a88_85a3_08d3u64;
    for &w in words {
        let mut z = (h ^ w).wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        h = z ^ (z >> 31);
    }
    h
}

/// Why a table file was refused (and made again, empty). Each names what it found and what
/// this build expected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The file is shorter or longer than its header says, or than a header.
    Length {
        /// Bytes found.
        found: u64,
        /// Bytes expected.
        expected: u64,
    },
    /// The first word is not the format's magic number: not a table file, or overwritten.
    Magic {
        /// The word found.
        found: u64,
    },
    /// Another format version (another tapyard build).
    Version {
        /// The file's version.
        found: u64,
        /// This build's.
        expected: u64,
    },
    /// The header's checksum does not match its words: damaged.
    Checksum,
    /// A layout field differs: another build's element sizes, or another `max_entries`.
    Layout {
        /// The header field, e.g. `max_entries` or `entry_size`.
        field: &'static str,
        /// The file's value.
        found: u64,
        /// The value this build and configuration need.
        expected: u64,
    },
    /// Written during another boot: its times (`CLOCK_MONOTONIC`) mean nothing now.
    OtherBoot,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Length { found, expected } => write!(
                f,
                "file length {found} bytes, expected {expected} (truncated or not a table file)"
            ),
            Refusal::Magic { found } => write!(f, "magic {found:#018x} is not a table file's"),
            Refusal::Version { found, expected } => {
                write!(f, "format version {found}, this build reads {expected}")
            }
            Refusal::Checksum => write!(f, "header checksum mismatch (damaged header)"),
            Refusal::Layout {
                field,
                found,
                expected,
            } => write!(f, "{field} = {found} in the file, {expected} wanted"),
            Refusal::OtherBoot => write!(f, "written during another boot"),
        }
    }
}

/// What [`Conntrack::open_file`](CtTable::open_file) did with the file it found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Opened {
    /// There was no file (or an empty one): a new, empty table.
    Created,
    /// The file was refused for this reason and replaced by a new, empty table.
    Refused(Refusal),
    /// The file's table was validated and is in use again.
    Reused,
}

/// What [`Conntrack::open_file`](CtTable::open_file) found and kept. Its `Display` is a one-line summary for a
/// log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Recovery {
    /// What was done with the file.
    pub opened: Opened,
    /// Whether the previous process detached cleanly (dropped its table) rather than dying.
    pub clean: bool,
    /// The pid of the process that used the file before (0 if unknown).
    pub previous_pid: u32,
    /// Connections kept, in use again.
    pub kept: usize,
    /// Entries freed because the dead process was writing, inserting or removing them.
    pub half_written: usize,
    /// LIVE entries freed because they failed a sanity check (or could not be indexed).
    pub invalid: usize,
    /// Entries freed because they had expired while no process ran.
    pub expired: usize,
    /// Entries freed because a kept entry already held one of their tuples.
    pub duplicates: usize,
    /// At a takeover ([`Conntrack::open_handed_over`](CtTable::open_handed_over)) of a table
    /// whose size differs from the configuration's: `Some(configured max_entries)`, and the
    /// table keeps the file's size (its connections with it); a restart applies the new size.
    pub size_kept_over: Option<usize>,
    /// The file's permission bits when they gave more than reading and writing to its owner
    /// (e.g. `0o644`: its group and others could read the connections and their NAT): they
    /// were set to `0o600`. A file others could write is refused instead
    /// ([`CtFileError::Unsafe`]).
    pub mode_fixed: Option<u32>,
    /// Whether the table is on transparent huge pages (its file's pages made 2 MiB pages with
    /// `MADV_COLLAPSE` and mapped with them), as an anonymous table is. False where the kernel
    /// could not (before Linux 6.1, `shmem_enabled` set to `deny`, a file on a disk file
    /// system, no free huge page): the table works the same, with more TLB misses.
    pub huge_pages: bool,
}

impl fmt::Display for Recovery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.opened {
            Opened::Created => write!(f, "new connection table")?,
            Opened::Refused(r) => write!(f, "connection table file refused ({r}): new table")?,
            Opened::Reused => write!(
                f,
                "connection table reused after {} (pid {}): {} connections kept; freed {} \
                 half-written, {} invalid, {} expired, {} duplicate",
                if self.clean {
                    "a clean stop"
                } else {
                    "a crash"
                },
                self.previous_pid,
                self.kept,
                self.half_written,
                self.invalid,
                self.expired,
                self.duplicates
            )?,
        }
        if let Some(asked) = self.size_kept_over {
            write!(
                f,
                "; kept the handed-over table's size (max_entries {asked} applies at the next restart)"
            )?;
        }
        if let Some(mode) = self.mode_fixed {
            write!(f, "; file mode was {mode:04o}, set to 0600")?;
        }
        Ok(())
    }
}

/// Why [`Conntrack::open_file`](CtTable::open_file) could not give a table at all (a file it could read but did
/// not trust is not an error: it is replaced, see [`Recovery`]). Two I/O errors are equal when
/// their operation, file and kind of error are.
#[derive(Clone, Debug)]
pub enum CtFileError {
    /// The configuration is refused, as by [`Conntrack::new`](CtTable::new).
    Config(CtConfigError),
    /// Another process has the file open as its table.
    InUse {
        /// The file.
        path: PathBuf,
    },
    /// The file is not one this process can trust with its connections: a symbolic link, not
    /// a regular file, owned by another user, writable by its group or others, or with more
    /// than one name (hard link). Nothing was written to it; it is left as it is.
    Unsafe {
        /// The file.
        path: PathBuf,
        /// What is wrong with it, e.g. `owned by uid 1000, not by this process's uid 0`.
        why: String,
    },
    /// The file system has no room for the whole table, which is reserved when the file is
    /// opened (a table on unreserved pages of a full tmpfs would be killed by `SIGBUS` at its
    /// next new connection).
    NoSpace {
        /// The file.
        path: PathBuf,
        /// Bytes the table still needed (the file's size less what it already had).
        needed: u64,
        /// Bytes free on the file system.
        free: u64,
    },
    /// Opening, sizing, locking or mapping the file failed.
    Io {
        /// What was being done, e.g. `open` or `mmap`.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The system's error.
        err: std::sync::Arc<io::Error>,
    },
}

impl PartialEq for CtFileError {
    fn eq(&self, other: &CtFileError) -> bool {
        match (self, other) {
            (CtFileError::Config(a), CtFileError::Config(b)) => a == b,
            (CtFileError::InUse { path: a }, CtFileError::InUse { path: b }) => a == b,
            (
                CtFileError::Unsafe { path, why },
                CtFileError::Unsafe {
                    path: path2,
                    why: why2,
                },
            ) => path == path2 && why == why2,
            (
                CtFileError::NoSpace { path, needed, free },
                CtFileError::NoSpace {
                    path: path2,
                    needed: needed2,
                    free: free2,
                },
            ) => path == path2 && needed == needed2 && free == free2,
            (
                CtFileError::Io { op, path, err },
                CtFileError::Io {
                    op: op2,
                    path: path2,
                    err: err2,
                },
            ) => op == op2 && path == path2 && err.kind() == err2.kind(),
            _ => false,
        }
    }
}

impl Eq for CtFileError {}

impl fmt::Display for CtFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CtFileError::Config(e) => write!(f, "{e}"),
            CtFileError::InUse { path } => write!(
                f,
                "conntrack file {}: in use by another process",
                path.display()
            ),
            CtFileError::Unsafe { path, why } => write!(
                f,
                "conntrack file {}: not used, {why} (remove it, and a new table is made)",
                path.display()
            ),
            CtFileError::NoSpace { path, needed, free } => write!(
                f,
                "conntrack file {}: no room for the table: {needed} bytes needed, {free} bytes \
                 free on its file system (lower max_entries or make room)",
                path.display()
            ),
            CtFileError::Io { op, path, err } => {
                write!(f, "conntrack file {}: {op}: {err}", path.display())
            }
        }
    }
}

impl std::error::Error for CtFileError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CtFileError::Config(e) => Some(e),
            CtFileError::Io { err, .. } => Some(&**err),
            CtFileError::InUse { .. }
            | CtFileError::Unsafe { .. }
            | CtFileError::NoSpace { .. } => None,
        }
    }
}

/// The open, locked file behind a file-backed table; marks the file cleanly detached when the
/// table is dropped.
#[derive(Debug)]
pub(super) struct CtFile {
    file: File,
    /// [`Recovery::huge_pages`] at the open.
    huge: bool,
}

impl Drop for CtFile {
    fn drop(&mut self) {
        let _ = self
            .file
            .write_all_at(&1u64.to_le_bytes(), (H_CLEAN * 8) as u64);
    }
}

fn read_header(file: &File, len: u64) -> io::Result<[u64; H_WORDS]> {
    let mut b = [0u8; H_WORDS * 8];
    if len < b.len() as u64 {
        return Ok([0; H_WORDS]);
    }
    file.read_exact_at(&mut b, 0)?;
    let mut h = [0u64; H_WORDS];
    for (w, c) in h.iter_mut().zip(b.chunks_exact(8)) {
        let mut x = [0u8; 8];
        x.copy_from_slice(c);
        *w = u64::from_le_bytes(x);
    }
    Ok(h)
}

/// Refuses a file this process cannot trust with its connections ([`CtFileError::Unsafe`]):
/// not a regular file, owned by another user than the effective one, writable by its group or
/// others, or with more than one name (another of them may be in a directory someone else
/// controls). Otherwise gives its permission bits when they are more than reading and writing
/// for its owner (to be set to 0600), `None` when they are not. Checks the open file
/// (`fstat`), not the path, so nothing can swap the file between the check and its use.
fn vet(file: &File, path: &Path) -> Result<Option<u32>, CtFileError> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let md = file.metadata().map_err(|err| CtFileError::Io {
        op: "stat",
        path: path.to_path_buf(),
        err: std::sync::Arc::new(err),
    })?;
    let refuse = |why: String| {
        Err(CtFileError::Unsafe {
            path: path.to_path_buf(),
            why,
        })
    };
    let t = md.file_type();
    if !t.is_file() {
        let kind = if t.is_dir() {
            "a directory"
        } else if t.is_fifo() {
            "a FIFO"
        } else if t.is_socket() {
            "a socket"
        } else if t.is_char_device() || t.is_block_device() {
            "a device"
        } else {
            "not a regular file"
        };
        return refuse(format!("not a regular file ({kind})"));
    }
    let me = sys::euid();
    if md.uid() != me {
        return refuse(format!(
            "owned by uid {}, not by this process's uid {me}",
            md.uid()
        ));
    }
    let mode = md.mode() & 0o7777;
    if mode & 0o022 != 0 {
        let who = match mode & 0o022 {
            0o020 => "its group",
            0o002 => "others",
            _ => "its group and others",
        };
        return refuse(format!("writable by {who} (mode {mode:04o})"));
    }
    if md.nlink() > 1 {
        return refuse(format!(
            "{} hard links (another name of the file may be in someone else's directory)",
            md.nlink()
        ));
    }
    Ok((mode & !0o600 != 0).then_some(mode))
}

/// Checks a header against the one this build would write (`want`, whose hash words are
/// ignored). The checks go from what says "not a table file" to what says "another table".
/// A new, empty, locked file that takes `path`'s name (created beside it, then renamed over
/// it, so that `path` always names a whole file); whoever has the old one open keeps it.
fn replace_file(path: &Path) -> io::Result<File> {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".new-{}", std::process::id()));
    let tmp = path.with_file_name(name);
    let _ = std::fs::remove_file(&tmp);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(&tmp)?;
    if !sys::try_lock_exclusive(&file)? {
        let _ = std::fs::remove_file(&tmp);
        return Err(io::Error::from(io::ErrorKind::WouldBlock));
    }
    if let Err(e) = std::fs::rename(&tmp, path) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    Ok(file)
}

fn check(h: &[u64; H_WORDS], want: &[u64; H_WORDS], len: u64) -> Result<(), Refusal> {
    if h[H_MAGIC] != want[H_MAGIC] {
        if len < HEADER_BYTES as u64 {
            return Err(Refusal::Length {
                found: len,
                expected: want[H_FILE_LEN],
            });
        }
        return Err(Refusal::Magic { found: h[H_MAGIC] });
    }
    if h[H_VERSION] != FORMAT_VERSION {
        return Err(Refusal::Version {
            found: h[H_VERSION],
            expected: FORMAT_VERSION,
        });
    }
    if checksum(&h[..H_CHECKSUM]) != h[H_CHECKSUM] {
        return Err(Refusal::Checksum);
    }
    let fields: [(usize, &'static str); 10] = [
        (H_HEADER, "header_bytes"),
        (H_ENTRY_SIZE, "entry_size"),
        (H_ACCT_SIZE, "counter_size"),
        (H_BUCKET_SIZE, "bucket_size"),
        (H_ENTRIES, "max_entries"),
        (H_BUCKETS, "buckets"),
        (H_ENTRIES_OFF, "entries_offset"),
        (H_ACCT_OFF, "counters_offset"),
        (H_INDEX_OFF, "index_offset"),
        (H_FILE_LEN, "file_length"),
    ];
    for (i, field) in fields {
        if h[i] != want[i] {
            return Err(Refusal::Layout {
                field,
                found: h[i],
                expected: want[i],
            });
        }
    }
    if len != want[H_FILE_LEN] {
        return Err(Refusal::Length {
            found: len,
            expected: want[H_FILE_LEN],
        });
    }
    if h[H_BOOT..H_BOOT + 2] != want[H_BOOT..H_BOOT + 2] {
        return Err(Refusal::OtherBoot);
    }
    Ok(())
}

impl<K: CtKey<W>, const W: usize> CtTable<K, W> {
    /// A table for at most `cfg.max_entries` connections that lives in the file at `path`
    /// (created with mode 0600 if missing; its directory must exist), so that its connections
    /// outlive the process: a later `open_file` of the same file — after a restart, or a
    /// `kill -9` at any moment — finds them again. `now` must come from the clock the table
    /// will be used with, and that clock must be the same in every process: [`crate::Clock`]
    /// (`CLOCK_MONOTONIC`). See the [module docs](super) ("Keeping the table in a file") for
    /// the format, what is validated and what is kept.
    ///
    /// The file must be this process's own: a symbolic link is not followed, and a file that
    /// is not a regular file, belongs to another user, can be written by its group or others,
    /// or has more than one name is refused ([`CtFileError::Unsafe`]); a file its group or
    /// others could read is set to mode 0600 ([`Recovery::mode_fixed`]). The whole file is
    /// allocated on its file system before it is used (a full tmpfs is
    /// [`CtFileError::NoSpace`] here, never a `SIGBUS` later), mapped 2 MiB-aligned on
    /// transparent huge pages where the kernel can ([`Recovery::huge_pages`]), and faulted in.
    ///
    /// A file that cannot be trusted as a whole (another version, size or boot, a damaged
    /// header, a wrong length) is replaced by an empty table: that is not an error, and
    /// [`Recovery::opened`] says why. Lookups and inserts cost the same as on [`Conntrack::new`](CtTable::new)'s
    /// anonymous memory (the arrays are the same, only mapped from a file).
    ///
    /// # Errors
    /// A refused configuration, a file another process uses as its table, a file that is not
    /// safe to use ([`CtFileError::Unsafe`]), no room for the table on its file system
    /// ([`CtFileError::NoSpace`]), or an I/O error (open, size, lock, map), each naming the
    /// file.
    ///
    /// ```
    /// use tapyard::conntrack::{Conntrack, CtConfig, Opened};
    /// use tapyard::Clock;
    ///
    /// let path = std::env::temp_dir().join(format!("ct-doc-{}", std::process::id()));
    /// let cfg = CtConfig { max_entries: 1024, ..CtConfig::default() };
    /// let (ct, rec) = Conntrack::open_file(cfg, &path, Clock::new().now())?;
    /// assert_eq!(rec.opened, Opened::Created);
    /// drop(ct);
    /// let (_ct, rec) = Conntrack::open_file(cfg, &path, Clock::new().now())?;
    /// assert_eq!((rec.opened, rec.clean, rec.kept), (Opened::Reused, true, 0));
    /// # std::fs::remove_file(&path)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn open_file(
        cfg: CtConfig,
        path: &Path,
        now: Instant,
    ) -> Result<(CtTable<K, W>, Recovery), CtFileError> {
        validate(&cfg).map_err(CtFileError::Config)?;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
            .open(path)
            .map_err(|err| {
                let link = err.raw_os_error() == Some(libc::ELOOP)
                    && std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
                if link {
                    CtFileError::Unsafe {
                        path: path.to_path_buf(),
                        why: "a symbolic link (not followed)".to_string(),
                    }
                } else {
                    CtFileError::Io {
                        op: "open",
                        path: path.to_path_buf(),
                        err: std::sync::Arc::new(err),
                    }
                }
            })?;
        Self::open_inner(cfg, file, path, now, false)
    }

    /// [`Conntrack::open_file`](CtTable::open_file) on a file already open: one that the process using it as
    /// its table handed over ([`Conntrack::backing_file`](CtTable::backing_file), passed with `SCM_RIGHTS` at
    /// `tapyard run --takeover`). The lock belongs to the open file, so the two share it and
    /// no third process can take the file meanwhile; the giving process must have stopped
    /// writing to the table (its workers paused) and must not write again. `path` names the
    /// file in errors and the log.
    ///
    /// # Errors
    /// As [`Conntrack::open_file`](CtTable::open_file), the handed file checked as a file
    /// found at `path` would be; [`CtFileError::InUse`] if another open file holds the lock
    /// (the file was not handed over but opened again).
    ///
    /// The giving process still maps the file, and takes it back if the takeover fails, so a
    /// handed-over file is never resized or rewritten under it: a table of another size is
    /// kept at the file's size ([`Recovery::size_kept_over`]; a restart applies the
    /// configured one), and a file refused for another reason (another build's format) is
    /// replaced by a new file at `path`, the giver's one left as it was.
    pub fn open_handed_over(
        cfg: CtConfig,
        file: File,
        path: &Path,
        now: Instant,
    ) -> Result<(CtTable<K, W>, Recovery), CtFileError> {
        Self::open_inner(cfg, file, path, now, true)
    }

    /// [`Conntrack::open_file`](CtTable::open_file) (`handed` false) or
    /// [`Conntrack::open_handed_over`](CtTable::open_handed_over) (`handed` true) on the open `file`.
    fn open_inner(
        mut cfg: CtConfig,
        mut file: File,
        path: &Path,
        now: Instant,
        handed: bool,
    ) -> Result<(CtTable<K, W>, Recovery), CtFileError> {
        validate(&cfg).map_err(CtFileError::Config)?;
        let io_err = |op: &'static str| {
            move |err: io::Error| CtFileError::Io {
                op,
                path: path.to_path_buf(),
                err: std::sync::Arc::new(err),
            }
        };
        // Reserves the file's first `len` bytes: no room is `NoSpace`, naming what is missing.
        let reserve = |file: &File, len: u64| {
            use std::os::unix::fs::MetadataExt;
            let had = file
                .metadata()
                .map_or(0, |m| m.blocks().saturating_mul(512));
            sys::reserve(file, len).map_err(|err| match err.raw_os_error() {
                Some(libc::ENOSPC | libc::EDQUOT) => CtFileError::NoSpace {
                    path: path.to_path_buf(),
                    needed: len.saturating_sub(had),
                    free: sys::free_bytes(file).unwrap_or(0),
                },
                _ => io_err("reserve (fallocate)")(err),
            })
        };
        let mode = vet(&file, path)?;
        if !sys::try_lock_exclusive(&file).map_err(io_err("flock"))? {
            return Err(CtFileError::InUse {
                path: path.to_path_buf(),
            });
        }
        if mode.is_some() {
            use std::os::unix::fs::PermissionsExt;
            file.set_permissions(std::fs::Permissions::from_mode(0o600))
                .map_err(io_err("chmod"))?;
        }
        let mut layout = Layout::of::<W>(cfg.max_entries);
        let boot = sys::boot_id().unwrap_or([0; 16]);
        let len = file.metadata().map_err(io_err("stat"))?.len();
        let mut want = layout.header::<W>(magic(K::FAMILY), [0; 3], boot);
        let found = read_header(&file, len).map_err(io_err("read header"))?;
        let mut size_kept_over = None;
        if handed {
            // Another size only: keep the file's, if it is one this build could have made.
            if let Err(Refusal::Layout {
                field: "max_entries",
                found: n,
                ..
            }) = check(&found, &want, len)
            {
                let theirs = CtConfig {
                    max_entries: usize::try_from(n).unwrap_or(usize::MAX),
                    ..cfg
                };
                if validate(&theirs).is_ok() {
                    let l = Layout::of::<W>(theirs.max_entries);
                    let w = l.header::<W>(magic(K::FAMILY), [0; 3], boot);
                    if check(&found, &w, len).is_ok() {
                        size_kept_over = Some(cfg.max_entries);
                        (cfg, layout, want) = (theirs, l, w);
                    }
                }
            }
        }
        let mut rec = Recovery {
            opened: Opened::Created,
            clean: false,
            previous_pid: 0,
            kept: 0,
            half_written: 0,
            invalid: 0,
            expired: 0,
            duplicates: 0,
            size_kept_over,
            mode_fixed: mode,
            huge_pages: false,
        };
        let hash = if len == 0 {
            None
        } else {
            match check(&found, &want, len) {
                Ok(()) => {
                    rec.opened = Opened::Reused;
                    rec.clean = found[H_CLEAN] == 1;
                    rec.previous_pid = u32::try_from(found[H_PID]).unwrap_or(0);
                    Some(SeededHash::from_words([
                        found[H_SEED],
                        found[H_SEED + 1],
                        found[H_SEED + 2],
                    ]))
                }
                Err(r) => {
                    rec.opened = Opened::Refused(r);
                    None
                }
            }
        };
        let hash = match hash {
            Some(h) => {
                // An older file may be sparse: allocate its holes now (its data kept).
                reserve(&file, len)?;
                h
            }
            None => {
                if handed && len > 0 {
                    // The giver maps this file and may take it back: start over in a new
                    // file at `path` instead, leaving the giver's as it is.
                    file = replace_file(path).map_err(io_err("replace"))?;
                    vet(&file, path)?;
                }
                // Start over: zeroes everywhere (every entry FREE), then the header. A process
                // killed in between leaves a file with no magic, refused next time. Every
                // byte is allocated, so no store into the mapping can find the file system
                // full.
                file.set_len(0).map_err(io_err("truncate"))?;
                reserve(&file, layout.file_len as u64)?;
                file.set_len(layout.file_len as u64)
                    .map_err(io_err("resize"))?;
                SeededHash::random()
            }
        };
        want = layout.header::<W>(magic(K::FAMILY), hash.to_words(), boot);
        want[H_CLEAN] = 0;
        want[H_PID] = u64::from(std::process::id());
        let mut bytes = Vec::with_capacity(H_WORDS * 8);
        for w in want {
            bytes.extend_from_slice(&w.to_le_bytes());
        }
        file.write_all_at(&bytes, 0)
            .map_err(io_err("write header"))?;
        let map = FileMap::map(&file, layout.file_len).map_err(io_err("mmap"))?;
        rec.huge_pages = map.huge();
        let n = cfg.max_entries;
        let entries = BigSlice::<Entry<W>>::in_map(&map, layout.entries_off, n)
            .map_err(io_err("map entries"))?;
        let acct =
            BigSlice::<Acct>::in_map(&map, layout.acct_off, n).map_err(io_err("map counters"))?;
        let index = BigSlice::<Bucket>::in_map(&map, layout.index_off, layout.buckets)
            .map_err(io_err("map index"))?;
        debug_assert!(map.len() >= layout.file_len);
        drop(map);
        let huge = rec.huge_pages;
        let ct = CtTable::assemble(cfg, entries, acct, index, hash, Some(CtFile { file, huge }));
        let Rebuilt {
            kept,
            half_written,
            invalid,
            expired,
            duplicates,
        } = ct.rebuild(now);
        rec.kept = kept;
        rec.half_written = half_written;
        rec.invalid = invalid;
        rec.expired = expired;
        rec.duplicates = duplicates;
        Ok((ct, rec))
    }
}

impl<K: CtKey<W>, const W: usize> CtTable<K, W> {
    /// Takes the table back after a handover that did not complete: this process handed its
    /// file to a successor ([`Conntrack::backing_file`](CtTable::backing_file), [`Conntrack::open_handed_over`](CtTable::open_handed_over)),
    /// which opened it (rebuilding it, maybe inserting and removing connections) and then
    /// gave up. The entries in the file are right, but what this process derived from them
    /// (the free stack's head, the length, the sweep cursor) no longer is: going on without
    /// this could hand out an entry the successor made live, or lose free entries. So the
    /// table is rebuilt from its entries as [`Conntrack::open_file`](CtTable::open_file) does (what it kept and
    /// freed is returned), and the file is marked in use by this process again (the
    /// successor's table, when dropped, marked it cleanly detached).
    ///
    /// Nothing may use the table meanwhile: this process's workers are paused, and the
    /// successor has stopped writing to it (it has exited, or dropped its table). O(table
    /// size), like an open.
    pub fn take_back(&self, now: Instant) -> Recovery {
        let mut huge_pages = false;
        if let Some(f) = self.ct_file() {
            huge_pages = f.huge;
            let mut words = [0u8; 16];
            words[8..].copy_from_slice(&u64::from(std::process::id()).to_le_bytes());
            // H_CLEAN then H_PID: in use, by this process.
            let _ = f.file.write_all_at(&words, (H_CLEAN * 8) as u64);
        }
        let Rebuilt {
            kept,
            half_written,
            invalid,
            expired,
            duplicates,
        } = self.rebuild(now);
        Recovery {
            opened: Opened::Reused,
            clean: false,
            previous_pid: 0,
            kept,
            half_written,
            invalid,
            expired,
            duplicates,
            size_kept_over: None,
            mode_fixed: None,
            huge_pages,
        }
    }
}

impl<K: CtKey<W>, const W: usize> CtTable<K, W> {
    /// The open file of a table made by [`Conntrack::open_file`](CtTable::open_file) (`None` for anonymous
    /// memory), to hand it to another process that goes on with the table
    /// ([`Conntrack::open_handed_over`](CtTable::open_handed_over)).
    pub fn backing_file(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        self.ct_file().map(|f| f.file.as_fd())
    }
}

#[cfg(test)]
pub(super) mod tests;
