//! The state directory is trusted: what is in it is re-attached, mapped shared and deleted at
//! `cleanup`. So before anything is read from it or written to it, it is checked the way
//! sshd's `StrictModes` checks a home directory:
//!
//! - every directory above it (after resolving symbolic links there: `/var/run` is one) is
//!   owned by root or by this process's user and is not writable by group or others, unless
//!   it has the sticky bit (`/tmp`: others cannot remove or rename what is ours there);
//! - the directory itself is not a symbolic link, is a directory, is owned by this process's
//!   user and is not writable by group or others; created with mode 0700 when missing, and
//!   set to 0700 (with a log line) when it is readable by others;
//! - each file tapyard keeps there (`ports.json`, its temporary and set-aside copies,
//!   `conntrack`, `conntrack6`, `takeover.sock`) is, when present, not a symbolic link, owned
//!   by this process's user, has one link and is not writable by group or others; one readable
//!   by others is set to 0600 with a log line.
//!
//! Anything else is refused with an error naming the path and why: a local user who can
//! create the directory, or who owns a parent, could otherwise plant links to root's files
//! (overwritten at the next save) or a table file they can read and rewrite. Once the
//! directory passes, nobody but its owner can add, remove or rename entries in it; the files
//! are still opened with `O_NOFOLLOW` (and created with `O_EXCL`), as a second line.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The files tapyard keeps in the state directory.
pub const FILES: [&str; 6] = [
    crate::state::PORTS_FILE,
    "ports.json.tmp",
    "ports.json.bad",
    "conntrack",
    "conntrack6",
    crate::state::TAKEOVER_SOCKET,
];

/// Why the state directory (or a file in it) is not used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The path that failed the check.
    pub path: PathBuf,
    /// Why, e.g. "is a symbolic link".
    pub why: String,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "state directory: {} {}; refusing to use it (see SECURITY.md)",
            self.path.display(),
            self.why
        )
    }
}

impl std::error::Error for Refused {}

/// This process's effective user.
#[allow(unsafe_code)] // geteuid(2), with a SAFETY line
pub fn euid() -> u32 {
    // SAFETY: geteuid takes no argument, cannot fail and touches no memory of ours.
    unsafe { libc::geteuid() }
}

fn refused(path: &Path, why: impl Into<String>) -> Refused {
    Refused {
        path: path.to_path_buf(),
        why: why.into(),
    }
}

fn owner(uid: u32) -> String {
    if uid == 0 {
        "root".into()
    } else {
        format!("uid {uid}")
    }
}

/// Checks the directories above `dir` (see the module docs).
fn check_parents(dir: &Path) -> Result<(), Refused> {
    let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) else {
        return Ok(());
    };
    // Parents that do not exist yet are created with the directory (0700, ours): the check
    // starts at the deepest one that exists.
    let existing = parent
        .ancestors()
        .find(|p| p.as_os_str().is_empty() || std::fs::symlink_metadata(p).is_ok())
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let real = std::fs::canonicalize(existing)
        .map_err(|e| refused(existing, format!("cannot be resolved: {e}")))?;
    let me = euid();
    for p in real.ancestors() {
        let m = std::fs::metadata(p).map_err(|e| refused(p, format!("cannot be read: {e}")))?;
        let mode = m.mode();
        if m.uid() != 0 && m.uid() != me {
            return Err(refused(
                p,
                format!(
                    "(a parent) is owned by {}, not by root or {}",
                    owner(m.uid()),
                    owner(me)
                ),
            ));
        }
        if mode & 0o022 != 0 && mode & 0o1000 == 0 {
            return Err(refused(
                p,
                format!("(a parent) has mode {:04o}: writable by group or others without the sticky bit", mode & 0o7777),
            ));
        }
    }
    Ok(())
}

/// Checks one entry of the directory (`what`: "directory" or "file"), fixing a mode that lets
/// others read it to `fixed_mode`. Returns a log line for a fix.
fn check_entry(
    path: &Path,
    m: &std::fs::Metadata,
    fixed_mode: u32,
) -> Result<Option<String>, Refused> {
    let me = euid();
    if m.file_type().is_symlink() {
        return Err(refused(path, "is a symbolic link"));
    }
    if m.uid() != me {
        return Err(refused(
            path,
            format!("is owned by {}, not by {}", owner(m.uid()), owner(me)),
        ));
    }
    let mode = m.mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(refused(
            path,
            format!("has mode {mode:04o}: writable by group or others"),
        ));
    }
    if !m.is_dir() && m.nlink() != 1 {
        return Err(refused(
            path,
            format!("has {} hard links (a link to another file?)", m.nlink()),
        ));
    }
    if mode & 0o077 != 0 {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(fixed_mode)).map_err(
            |e| {
                refused(
                    path,
                    format!("has mode {mode:04o} and cannot be fixed: {e}"),
                )
            },
        )?;
        return Ok(Some(format!(
            "state directory: {} had mode {mode:04o}, readable by others: set to {fixed_mode:04o}",
            path.display()
        )));
    }
    Ok(None)
}

/// Checks the state directory `dir` and the files tapyard keeps in it (see the module docs),
/// creating it (mode 0700) when `create` and it is missing. `Ok(false)`: it does not exist
/// (and `create` was false). Modes that let others read are fixed, each with a log line.
pub fn check_dir(dir: &Path, create: bool) -> Result<bool, Refused> {
    check_parents(dir)?;
    let m = match std::fs::symlink_metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && create => {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(|e| refused(dir, format!("cannot be created: {e}")))?;
            std::fs::symlink_metadata(dir)
                .map_err(|e| refused(dir, format!("cannot be read: {e}")))?
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(refused(dir, format!("cannot be read: {e}"))),
    };
    if !m.file_type().is_symlink() && !m.is_dir() {
        return Err(refused(dir, "is not a directory"));
    }
    if let Some(fix) = check_entry(dir, &m, 0o700)? {
        log::warn!("{fix}");
    }
    for name in FILES {
        let p = dir.join(name);
        match std::fs::symlink_metadata(&p) {
            Ok(m) => {
                if let Some(fix) = check_entry(&p, &m, 0o600)? {
                    log::warn!("{fix}");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(refused(&p, format!("cannot be read: {e}"))),
        }
    }
    Ok(true)
}

/// Checks an open file of the state directory (what `O_NOFOLLOW` opened): a regular file of
/// this process's user, one link, not writable by others.
pub fn check_open(path: &Path, f: &std::fs::File) -> Result<(), Refused> {
    let m = f
        .metadata()
        .map_err(|e| refused(path, format!("cannot be read: {e}")))?;
    if !m.is_file() {
        return Err(refused(path, "is not a regular file"));
    }
    check_entry(path, &m, 0o600).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("tapyard-secure-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn a_new_directory_is_0700_and_loose_modes_are_fixed() {
        // Missing parents are made too.
        let top = tmp("deep");
        assert_eq!(check_dir(&top.join("a/b"), true), Ok(true));
        let _ = std::fs::remove_dir_all(&top);
        let d = tmp("new");
        assert_eq!(check_dir(&d, false), Ok(false));
        assert_eq!(check_dir(&d, true), Ok(true));
        let mode = |p: &Path| std::fs::metadata(p).unwrap().mode() & 0o7777;
        assert_eq!(mode(&d), 0o700);
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        let f = d.join("ports.json");
        std::fs::write(&f, "{}").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert_eq!(check_dir(&d, true), Ok(true));
        assert_eq!((mode(&d), mode(&f)), (0o700, 0o600));
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn links_and_writable_modes_are_refused_naming_the_path() {
        let d = tmp("bad");
        check_dir(&d, true).unwrap();
        let victim = d.join("victim");
        std::fs::write(&victim, "keep").unwrap();
        let link = d.join("ports.json.tmp");
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        let e = check_dir(&d, true).unwrap_err();
        assert_eq!(e.path, link);
        assert!(e.to_string().contains("is a symbolic link"), "{e}");
        std::fs::remove_file(&link).unwrap();

        let ct = d.join("conntrack");
        std::fs::write(&ct, "").unwrap();
        std::fs::set_permissions(&ct, std::fs::Permissions::from_mode(0o666)).unwrap();
        let e = check_dir(&d, true).unwrap_err();
        assert!(e.to_string().contains("mode 0666"), "{e}");
        assert!(e.to_string().contains("conntrack"), "{e}");
        std::fs::remove_file(&ct).unwrap();

        std::fs::hard_link(&victim, d.join("conntrack6")).unwrap();
        let e = check_dir(&d, true).unwrap_err();
        assert!(e.to_string().contains("hard links"), "{e}");
        std::fs::remove_file(d.join("conntrack6")).unwrap();

        // The directory itself as a link to another.
        let other = tmp("other");
        std::os::unix::fs::symlink(&d, &other).unwrap();
        let e = check_dir(&other, true).unwrap_err();
        assert!(e.to_string().contains("is a symbolic link"), "{e}");
        std::fs::remove_file(&other).unwrap();

        // A group-writable parent without the sticky bit.
        let sub = d.join("sub");
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o770)).unwrap();
        let e = check_dir(&sub, true).unwrap_err();
        assert!(e.to_string().contains("(a parent) has mode 0770"), "{e}");
        assert!(!sub.exists());
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
        let _ = std::fs::remove_dir_all(&d);
    }
}
