//! The control socket's server thread, which a takeover stops and restarts.

use std::os::unix::net::UnixListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::node::Node;

/// The control socket's server thread, which a takeover stops and (if it fails) starts
/// again on the same listening socket.
pub struct ControlServer {
    listener: UnixListener,
    node: Arc<Node>,
    running: Mutex<Option<(Arc<AtomicBool>, JoinHandle<()>)>>,
}

impl std::fmt::Debug for ControlServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlServer").finish_non_exhaustive()
    }
}

impl ControlServer {
    /// A server (not started) of `listener` for `node`.
    pub fn new(listener: UnixListener, node: Arc<Node>) -> ControlServer {
        ControlServer {
            listener,
            node,
            running: Mutex::new(None),
        }
    }

    /// Starts serving (no-op if it serves).
    pub fn start(&self) -> Result<(), StartError> {
        let mut r = self.running.lock().unwrap_or_else(|e| e.into_inner());
        if r.is_some() {
            return Ok(());
        }
        let l = self.listener.try_clone().map_err(|source| StartError {
            what: "control socket",
            source,
        })?;
        let stop = Arc::new(AtomicBool::new(false));
        let (node, s) = (self.node.clone(), stop.clone());
        let t = std::thread::Builder::new()
            .name("tapyard-control".into())
            .spawn(move || crate::control::serve(l, node, s))
            .map_err(|source| StartError {
                what: "cannot start the control thread",
                source,
            })?;
        *r = Some((stop, t));
        Ok(())
    }

    /// Stops accepting requests (within 100 ms; a request being served finishes); clients
    /// that connect meanwhile wait in the socket's backlog.
    pub fn stop(&self) {
        let r = self
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some((stop, t)) = r {
            stop.store(true, Ordering::Relaxed);
            let _ = t.join();
        }
    }

    /// The listening socket.
    pub fn listener(&self) -> &UnixListener {
        &self.listener
    }
}

/// Why the control server could not start.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {source}")]
pub struct StartError {
    /// What failed.
    pub what: &'static str,
    /// The system's error.
    #[source]
    pub source: std::io::Error,
}
