//! Why a port could not be added, removed, re-attached or deleted.

use std::io;
use std::time::Duration;

use tapyard_cni::error::CniError;

use crate::config::values::BadValue;

/// What the library returns when it refuses a change.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a port operation failed; the message names the field, value, device or namespace.
#[derive(Debug, thiserror::Error)]
pub enum PortError {
    /// A system call (rtnetlink, the TAP device) failed doing `what`.
    #[error("{what}: {source}")]
    Io {
        /// What was being done, and to what.
        what: String,
        /// The system's error.
        #[source]
        source: io::Error,
    },
    /// A field of the request has a malformed value.
    #[error("{field} {value:?} {source}")]
    Value {
        /// The field (`name`, `mac`, `ifname`).
        field: &'static str,
        /// Its value.
        value: String,
        /// What is wrong with it.
        #[source]
        source: BadValue,
    },
    /// A field of the request names something taken, absent or not allowed.
    #[error("{field} {value:?} {why}")]
    Field {
        /// The field (`name`, `bridge`, `owner`, ...).
        field: String,
        /// Its value.
        value: String,
        /// Why it is refused.
        why: String,
    },
    /// The network namespace at `path` cannot be used (`netns "PATH" why`).
    #[error("netns {path:?} {}", source.msg)]
    Netns {
        /// The namespace's path.
        path: String,
        /// Why.
        #[source]
        source: CniError,
    },
    /// Something failed inside the network namespace at `path`.
    #[error("{} in netns {path}", source.msg)]
    InNetns {
        /// The namespace's path.
        path: String,
        /// What failed there.
        #[source]
        source: CniError,
    },
    /// Something failed in tapyard's own namespace.
    #[error("{0} in tapyard's namespace")]
    Here(#[source] Box<PortError>),
    /// A device or namespace is not where it should be.
    #[error("{0}")]
    Missing(String),
    /// The library refused the change.
    #[error("{what}: {source}")]
    Datapath {
        /// What was being done.
        what: String,
        /// The library's error.
        #[source]
        source: BoxError,
    },
    /// The port record could not be written, so the port is not added.
    #[error("{0}: the port is not added (it would not be found again after a restart)")]
    NotRecorded(#[source] Box<PortError>),
    /// The TAP of a removed port is still there.
    #[error("port {port:?} was removed but its TAP {tap:?} still exists after {after:?}")]
    NotGone {
        /// The port.
        port: String,
        /// Its TAP's name where it lives.
        tap: String,
        /// How long it was waited for.
        after: Duration,
    },
    /// A CNI request's MTU.
    #[error("mtu {0} is out of range: expected 68 to 65535")]
    Mtu(u32),
    /// A CNI request without an owner.
    #[error("owner \"\" is empty, expected <CNI_CONTAINERID>/<CNI_IFNAME>")]
    EmptyOwner,
}

impl PortError {
    /// `what: source`.
    pub fn io(what: impl Into<String>, source: io::Error) -> PortError {
        PortError::Io {
            what: what.into(),
            source,
        }
    }

    /// `field "value" why`.
    pub fn field(field: &str, value: &str, why: impl std::fmt::Display) -> PortError {
        PortError::Field {
            field: field.to_string(),
            value: value.to_string(),
            why: why.to_string(),
        }
    }
}
