//! Opening the container's network namespace, and running code inside it.
//!
//! [`open`] trusts nothing of `CNI_NETNS` but its name: it refuses, without blocking, whatever
//! is not a network namespace (a FIFO, a file, a directory, another kind of namespace).
//! `setns(2)` switches the namespace of the calling thread only, so [`run_in`] spawns a
//! dedicated thread, switches it, runs the closure there and lets the thread end: the plugin's
//! own thread never leaves the host namespace, and no thread goes back to a pool in the wrong
//! one. Sockets keep the namespace they were created in, so the closure opens its netlink
//! socket itself.

use crate::error::{CniError, INVALID_ENV, UNKNOWN_CONTAINER};
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// Opens the network namespace at `path` (a bind mount under `/var/run/netns`, or
/// `/proc/PID/ns/net`) and checks that it is one, before anything is allocated for it.
///
/// A path that does not exist is code 3 (the container is gone). Anything else that is not a
/// network namespace is code 4, with a message naming the path and what it is instead:
///
/// * not a regular file (a FIFO, a directory, a device, a socket): refused from `stat` alone,
///   without opening it, so neither a FIFO without a writer nor a device's open can block or
///   act;
/// * a file on another filesystem than nsfs (`NSFS_MAGIC`, from `fstatfs`), named with its
///   magic;
/// * a namespace of another type (`/proc/self/ns/mnt`), from `ioctl(NS_GET_NSTYPE)`; a kernel
///   without that ioctl (before 4.11, `ENOTTY`) has the nsfs check alone.
///
/// The open itself is `O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC` and the checks run on
/// the descriptor, so a path swapped after the `stat` still cannot block the caller, take a
/// terminal or pass as a namespace.
pub fn open(path: &Path) -> Result<File, CniError> {
    let refuse =
        |why: String| CniError::new(INVALID_ENV, format!("CNI_NETNS {} {why}", path.display()));
    let unopenable = |e: io::Error| {
        let code = if e.kind() == io::ErrorKind::NotFound {
            UNKNOWN_CONTAINER
        } else {
            INVALID_ENV
        };
        CniError::new(
            code,
            format!("CNI_NETNS {} cannot be opened", path.display()),
        )
        .with_details(e)
    };
    let kind = |meta: &std::fs::Metadata| {
        let t = meta.file_type();
        if t.is_fifo() {
            Some("a FIFO")
        } else if t.is_dir() {
            Some("a directory")
        } else if t.is_char_device() {
            Some("a character device")
        } else if t.is_block_device() {
            Some("a block device")
        } else if t.is_socket() {
            Some("a socket")
        } else {
            None
        }
    };
    let not_a_netns = |what: &str| refuse(format!("is {what}, not a network namespace"));
    // nsfs inodes are regular files: anything else is refused before it is opened.
    if let Some(what) = kind(&std::fs::metadata(path).map_err(unopenable)?) {
        return Err(not_a_netns(what));
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC)
        .open(path)
        .map_err(unopenable)?;
    if let Some(what) = kind(&file.metadata().map_err(unopenable)?) {
        return Err(not_a_netns(what));
    }
    let magic = fs_magic(&file)
        .map_err(|e| refuse("cannot be checked (fstatfs)".into()).with_details(e))?;
    if magic != NSFS_MAGIC {
        return Err(refuse(format!(
            "is on {} (magic {magic:#x}), not nsfs: it is not a namespace",
            fs_name(magic)
        )));
    }
    match ns_type(&file) {
        Ok(t) if t == libc::CLONE_NEWNET => Ok(file),
        Ok(t) => Err(not_a_netns(ns_name(t))),
        // Linux before 4.11 has no NS_GET_NSTYPE: nsfs is all that can be checked.
        Err(e) if e.raw_os_error() == Some(libc::ENOTTY) => Ok(file),
        Err(e) => Err(refuse("cannot be checked (NS_GET_NSTYPE)".into()).with_details(e)),
    }
}

/// nsfs's `f_type` (`NSFS_MAGIC` in `<linux/magic.h>`).
const NSFS_MAGIC: u32 = 0x6e73_6673;

/// The magic number of the filesystem holding `file` (`fstatfs`'s `f_type`).
#[allow(unsafe_code)]
fn fs_magic(file: &File) -> io::Result<u32> {
    let mut st = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: fstatfs writes one `struct statfs` to the pointer, which points to storage of
    // that type, and only reads the descriptor, which `file` keeps open for the call.
    let rc = unsafe { libc::fstatfs(file.as_raw_fd(), st.as_mut_ptr()) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fstatfs returned 0, so it filled the whole struct.
    let st = unsafe { st.assume_init() };
    // `f_type` is a signed or unsigned word depending on the target; magics are 32 bits.
    #[allow(clippy::unnecessary_cast)]
    Ok(st.f_type as u32)
}

/// The type of the namespace `file` refers to (`CLONE_NEW*`), from `ioctl(NS_GET_NSTYPE)`.
#[allow(unsafe_code)]
fn ns_type(file: &File) -> io::Result<libc::c_int> {
    // SAFETY: NS_GET_NSTYPE takes no argument and returns the type as the result; on a file
    // that is not a namespace it fails (ENOTTY) without touching memory. The descriptor is
    // kept open by `file` for the call.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), libc::NS_GET_NSTYPE) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

/// A name for a filesystem magic number in a message (`<linux/magic.h>`).
fn fs_name(magic: u32) -> &'static str {
    match magic {
        0x9fa0 => "proc",
        0x0102_1994 => "tmpfs",
        0xef53 => "ext2/3/4",
        0x5846_5342 => "xfs",
        0x9123_683e => "btrfs",
        0x794c_7630 => "overlayfs",
        0x6265_6572 => "sysfs",
        0x6367_7270 => "cgroup2",
        0x1cd1 => "devpts",
        0x2fc1_2fc1 => "zfs",
        0xf2f5_2010 => "f2fs",
        0x6969 => "nfs",
        0x0027_e0eb => "cgroup",
        0x6462_6720 => "debugfs",
        0x7472_6163 => "tracefs",
        0xcafe_4a11 => "bpf",
        0x0187 => "autofs",
        _ => "another filesystem",
    }
}

/// A name for a namespace type in a message.
fn ns_name(t: libc::c_int) -> &'static str {
    match t {
        libc::CLONE_NEWNS => "a mount namespace",
        libc::CLONE_NEWUTS => "a UTS namespace",
        libc::CLONE_NEWIPC => "an IPC namespace",
        libc::CLONE_NEWUSER => "a user namespace",
        libc::CLONE_NEWPID => "a PID namespace",
        libc::CLONE_NEWCGROUP => "a cgroup namespace",
        libc::CLONE_NEWTIME => "a time namespace",
        _ => "a namespace of an unknown type",
    }
}

/// Runs `f` on a new thread that has entered the network namespace `ns` (from [`open`]).
/// A file that is not a network namespace is code 4.
pub fn run_in<T: Send>(
    ns: &File,
    path: &Path,
    f: impl FnOnce() -> Result<T, CniError> + Send,
) -> Result<T, CniError> {
    std::thread::scope(|s| {
        s.spawn(|| {
            enter(ns).map_err(|e| {
                CniError::new(
                    INVALID_ENV,
                    format!("CNI_NETNS {} is not a network namespace", path.display()),
                )
                .with_details(e)
            })?;
            f()
        })
        .join()
        .unwrap_or_else(|_| {
            Err(CniError::new(
                crate::error::NETNS_CONFIG,
                "the namespace thread panicked",
            ))
        })
    })
}

/// Moves the calling thread into the network namespace `ns`.
#[allow(unsafe_code)]
fn enter(ns: &File) -> io::Result<()> {
    // SAFETY: setns only reads the descriptor, which `ns` keeps open for the call; it changes
    // the namespace of this thread alone, which `run_in` created for that purpose.
    let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// A private directory under the temp dir, removed on drop.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(name: &str) -> Scratch {
            let dir = std::env::temp_dir()
                .join(format!("tapyard-cni-netns-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            Scratch(dir)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[allow(unsafe_code)]
    fn mkfifo(path: &Path) {
        use std::os::unix::ffi::OsStrExt;
        let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
        // SAFETY: `c` is a NUL-terminated path that lives for the call.
        let rc = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
        assert_eq!(rc, 0, "mkfifo: {}", io::Error::last_os_error());
    }

    /// `open(path)`'s refusal: its code, and its message, which names the path.
    fn refusal(path: &Path) -> (u32, String) {
        let e = open(path).expect_err("not a network namespace");
        assert!(e.msg.contains(&path.display().to_string()), "{e}");
        (e.code, e.msg)
    }

    #[test]
    fn what_is_not_a_network_namespace_is_refused_with_code_4_and_why() {
        let dir = Scratch::new("refused");
        let fifo = dir.0.join("fifo");
        mkfifo(&fifo);
        let file = dir.0.join("file");
        std::fs::write(&file, b"not a namespace").unwrap();

        // A FIFO without a writer: refused at once, not waited on.
        let (code, msg) = refusal(&fifo);
        assert_eq!(code, INVALID_ENV);
        assert!(msg.ends_with("is a FIFO, not a network namespace"), "{msg}");
        let (code, msg) = refusal(&file);
        assert_eq!(code, INVALID_ENV);
        assert!(
            msg.contains("(magic 0x") && msg.contains("not nsfs"),
            "{msg}"
        );
        let (code, msg) = refusal(&dir.0);
        assert_eq!(code, INVALID_ENV);
        assert!(
            msg.ends_with("is a directory, not a network namespace"),
            "{msg}"
        );
        let (code, msg) = refusal(Path::new("/dev/null"));
        assert_eq!(code, INVALID_ENV);
        assert!(
            msg.ends_with("is a character device, not a network namespace"),
            "{msg}"
        );
        // A symlink is followed: what it points to is checked.
        let link = dir.0.join("link");
        std::os::unix::fs::symlink(&fifo, &link).unwrap();
        assert!(refusal(&link)
            .1
            .ends_with("is a FIFO, not a network namespace"));
    }

    #[test]
    fn a_missing_path_is_an_unknown_container() {
        let dir = Scratch::new("missing");
        let (code, msg) = refusal(&dir.0.join("gone"));
        assert_eq!(code, UNKNOWN_CONTAINER, "{msg}");
    }

    #[test]
    fn own_namespaces_network_opens_and_mount_is_refused() {
        // Any process may open its own namespaces: /proc's magic link opens to nsfs.
        let ns = open(Path::new("/proc/self/ns/net")).expect("the own network namespace");
        assert_eq!(fs_magic(&ns).unwrap(), NSFS_MAGIC);
        let (code, msg) = refusal(Path::new("/proc/self/ns/mnt"));
        assert_eq!(code, INVALID_ENV);
        assert!(
            msg.ends_with("is a mount namespace, not a network namespace"),
            "{msg}"
        );
        // proc's own files are not nsfs.
        let (code, msg) = refusal(Path::new("/proc/self/status"));
        assert_eq!(code, INVALID_ENV);
        assert!(msg.contains("is on proc (magic 0x9fa0), not nsfs"), "{msg}");
    }
}
