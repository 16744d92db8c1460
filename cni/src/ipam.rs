//! Delegation to the IPAM plugin, as the spec describes it.
//!
//! The plugin named by `ipam.type` is looked up in `CNI_PATH` (first match wins) and executed
//! with this process's environment (so the same `CNI_*` variables) and the same bytes on stdin;
//! only `CNI_COMMAND` is overridden, to release a lease with DEL when an ADD is rolled back.
//! Its stderr goes to ours. A non-zero exit with a CNI error object on stdout is passed through
//! as that error; anything unreadable is code 100.

use crate::args::Command;
use crate::error::{CniError, IPAM_FAILURE};
use crate::types::CniResult;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;

/// The first `dir/name` in `path` that is a file.
pub fn find_in_path(name: &str, path: &[PathBuf]) -> Result<PathBuf, CniError> {
    path.iter()
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            let dirs: Vec<_> = path.iter().map(|d| d.display().to_string()).collect();
            CniError::new(
                IPAM_FAILURE,
                format!("IPAM plugin {name:?} not found in CNI_PATH"),
            )
            .with_details(format!("searched: {}", dirs.join(":")))
        })
}

/// Runs the IPAM plugin `exe` for `command` with `stdin`. For ADD the result is returned; for
/// DEL and CHECK an empty result.
pub fn exec(exe: &Path, command: Command, stdin: &[u8]) -> Result<CniResult, CniError> {
    let fail = |msg: String| CniError::new(IPAM_FAILURE, msg);
    let mut child = std::process::Command::new(exe)
        .env("CNI_COMMAND", command.as_str())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| fail(format!("cannot run IPAM plugin {}", exe.display())).with_details(e))?;
    // Feed stdin from another thread so a plugin that writes before it reads cannot deadlock.
    let output = std::thread::scope(|s| {
        let mut pipe = child.stdin.take();
        s.spawn(move || {
            if let Some(p) = pipe.as_mut() {
                // A plugin that exits without reading gives EPIPE: its exit status tells.
                let _ = p.write_all(stdin);
            }
        });
        child.wait_with_output()
    })
    .map_err(|e| fail(format!("IPAM plugin {} failed to run", exe.display())).with_details(e))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return Err(match serde_json::from_str::<CniError>(&stdout) {
            Ok(e) => e,
            Err(_) => fail(format!(
                "IPAM plugin {} failed ({})",
                exe.display(),
                output.status
            ))
            .with_details(stdout.trim()),
        });
    }
    if command != Command::Add {
        return Ok(CniResult::default());
    }
    serde_json::from_str(&stdout).map_err(|e| {
        fail(format!(
            "IPAM plugin {} printed an unreadable result",
            exe.display()
        ))
        .with_details(format!("{e}: {}", stdout.trim()))
    })
}
