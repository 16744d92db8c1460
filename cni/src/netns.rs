//! Running code inside the container's network namespace.
//!
//! `setns(2)` switches the namespace of the calling thread only, so [`run_in`] spawns a
//! dedicated thread, switches it, runs the closure there and lets the thread end: the plugin's
//! own thread never leaves the host namespace, and no thread goes back to a pool in the wrong
//! one. Sockets keep the namespace they were created in, so the closure opens its netlink
//! socket itself.

use crate::error::{CniError, INVALID_ENV, UNKNOWN_CONTAINER};
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

/// Opens the namespace at `path`: code 3 if it does not exist, code 4 if it cannot be opened.
pub fn open(path: &Path) -> Result<File, CniError> {
    File::open(path).map_err(|e| {
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
    })
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
