//! Why a takeover failed (either side).

use crate::node::{BoxError, NodeError};
use crate::ports::PortError;
use crate::state::secure::Refused;

/// Why a takeover failed; the old process goes on forwarding whatever the reason.
#[derive(Debug, thiserror::Error)]
pub enum TakeoverError {
    /// A step of the exchange failed (`hello`, `offer`, `ready`, the descriptors, `ack`...).
    #[error("{what}: {source}")]
    Failed {
        /// The step, or what was being done.
        what: String,
        /// Why (the socket's error, the library's...).
        #[source]
        source: BoxError,
    },
    /// The peer said or sent something the protocol does not allow here, or refused.
    #[error("{0}")]
    Protocol(String),
    /// The new node could not be built.
    #[error(transparent)]
    Node(#[from] NodeError),
    /// A port could not be taken over.
    #[error(transparent)]
    Port(#[from] PortError),
    /// The state directory is not safe to use.
    #[error(transparent)]
    StateDir(#[from] Refused),
    /// The new process gave up after the offer (it told the old one, which goes on).
    #[error("--takeover: {source} (pid {old_pid} goes on forwarding)")]
    Aborted {
        /// The old process.
        old_pid: u32,
        /// Why.
        #[source]
        source: Box<TakeoverError>,
    },
    /// The old side's view of a takeover that failed: the new process's pid and why.
    #[error("pid {pid}: {source}")]
    Peer {
        /// The new process.
        pid: u32,
        /// Why.
        #[source]
        source: Box<TakeoverError>,
    },
}

impl From<String> for TakeoverError {
    /// A message about the exchange.
    fn from(msg: String) -> TakeoverError {
        TakeoverError::Protocol(msg)
    }
}

impl From<&str> for TakeoverError {
    /// A message about the exchange.
    fn from(msg: &str) -> TakeoverError {
        TakeoverError::Protocol(msg.to_string())
    }
}

impl TakeoverError {
    /// `what: source`.
    pub fn failed(what: impl Into<String>, source: impl Into<BoxError>) -> TakeoverError {
        TakeoverError::Failed {
            what: what.into(),
            source: source.into(),
        }
    }
}

/// `Err`: a message about the exchange.
pub(crate) fn fail<T>(msg: String) -> Result<T, TakeoverError> {
    Err(TakeoverError::Protocol(msg))
}
