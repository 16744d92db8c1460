//! Why a node could not start, or a part of its config could not be applied.

use super::error_chain;

/// What the library (or the system) returns when it refuses something.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a node could not start, or a part of its config (a route, a neighbour, a peer, the
/// NAT rules, a Service) could not be applied; the message names the section, the item and
/// the field.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The library or the system refused `what` (a bridge, a port, a route, the connection
    /// table, the worker threads...).
    #[error("{what}: {}", error_chain(source.as_ref()))]
    Refused {
        /// What was being done, and to what (`bridge "br0"`, `route 10.0.0.0/8 via ...`).
        what: String,
        /// The library's or the system's error.
        #[source]
        source: BoxError,
    },
    /// A TAP of the config could not be opened.
    #[error("cannot open TAP {tap:?}: {}", tap_problem(tap, source))]
    Tap {
        /// The TAP's name.
        tap: String,
        /// The system's error.
        #[source]
        source: std::io::Error,
    },
    /// The config asks for something this node's datapath does not have (an interface, an
    /// address family...).
    #[error("{0}")]
    Config(String),
    /// Some of the Services were refused (one line each).
    #[error("{}", .0.join("; "))]
    Services(Vec<String>),
}

impl From<String> for NodeError {
    /// A message about the config.
    fn from(msg: String) -> NodeError {
        NodeError::Config(msg)
    }
}

impl NodeError {
    /// `what: source`.
    pub fn refused(what: impl Into<String>, source: impl Into<BoxError>) -> NodeError {
        NodeError::Refused {
            what: what.into(),
            source: source.into(),
        }
    }
}

/// The system's error, with the likely cause when a device of another kind has the TAP's
/// name.
fn tap_problem(tap: &str, e: &std::io::Error) -> String {
    let sys = std::path::Path::new("/sys/class/net").join(tap);
    if sys.exists() && !sys.join("tun_flags").exists() {
        return format!(
            "an interface {tap:?} that is not a TAP exists in this network namespace ({e}); rename the TAP (`tap = \"...\"` for an uplink) or run tapyard in a namespace of its own"
        );
    }
    e.to_string()
}
