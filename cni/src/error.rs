//! The CNI error object and the codes this plugin answers with.
//!
//! Every failure leaves the plugin as a [`CniError`], printed on stdout as
//! `{"cniVersion", "code", "msg", "details"}` with a non-zero exit status. Codes 1–99 are the
//! spec's well-known ones; 100 and up are this plugin's own (listed in `cni/README.md`).

use serde::{Deserialize, Serialize};
use std::fmt;

/// Incompatible CNI version (spec code 1).
pub const INCOMPATIBLE_VERSION: u32 = 1;
/// Container unknown or does not exist (spec code 3): the netns is gone, so there is nothing to
/// clean up.
pub const UNKNOWN_CONTAINER: u32 = 3;
/// Invalid necessary environment variables (spec code 4).
pub const INVALID_ENV: u32 = 4;
/// I/O failure (spec code 5): stdin could not be read.
pub const IO_FAILURE: u32 = 5;
/// Failed to decode content (spec code 6): stdin is not a JSON object.
pub const DECODE: u32 = 6;
/// Invalid network configuration (spec code 7): a field is missing or out of range.
pub const INVALID_CONFIG: u32 = 7;
/// Try again later (spec code 11): tapyard's control socket does not answer.
pub const TRY_AGAIN_LATER: u32 = 11;
/// The IPAM plugin could not be found or run, or printed something that is not a CNI result
/// or error.
pub const IPAM_FAILURE: u32 = 100;
/// tapyard answered the request with an error, or with a reply this plugin cannot read.
pub const TAPYARD_REFUSED: u32 = 101;
/// Configuring the interface inside the container's namespace failed.
pub const NETNS_CONFIG: u32 = 102;
/// CHECK found the container's network not as `prevResult` describes it.
pub const CHECK_FAILED: u32 = 103;

/// A CNI error: what the plugin prints instead of a result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CniError {
    /// The error code: a well-known spec code below 100, this plugin's own from 100 up.
    pub code: u32,
    /// A short message naming what went wrong.
    pub msg: String,
    /// Longer detail (the underlying OS or parse error), possibly empty.
    #[serde(default)]
    pub details: String,
}

impl CniError {
    /// An error with a code and a message, no details.
    pub fn new(code: u32, msg: impl Into<String>) -> Self {
        CniError {
            code,
            msg: msg.into(),
            details: String::new(),
        }
    }

    /// The same error with `details` set.
    pub fn with_details(mut self, details: impl fmt::Display) -> Self {
        self.details = details.to_string();
        self
    }

    /// The JSON object the spec asks for, tagged with `cni_version`.
    pub fn to_json(&self, cni_version: &str) -> serde_json::Value {
        serde_json::json!({
            "cniVersion": cni_version,
            "code": self.code,
            "msg": self.msg,
            "details": self.details,
        })
    }
}

impl fmt::Display for CniError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "code {}: {}", self.code, self.msg)?;
        if !self.details.is_empty() {
            write!(f, " ({})", self.details)?;
        }
        Ok(())
    }
}

impl std::error::Error for CniError {}
