//! `tapyard run --takeover`: a new tapyard takes the TAP devices and the control socket from
//! the running one, which then exits 0, so that an upgrade loses no pod and almost no frame.
//!
//! Every `tapyard run` listens on `<state_dir>/takeover.sock` (mode 0600). A new process
//! started with `--takeover` connects there and the two speak a small versioned protocol:
//! one message is a little-endian `u32` length and that many bytes of JSON, and descriptors
//! travel with a message as `SCM_RIGHTS` ancillary data (at most [`FDS_PER_MSG`] per
//! message; more follow in `fds` messages). Each side waits for the other's answer before it
//! sends again, so messages never overlap.
//!
//! ```text
//!  new                                          old (forwarding)
//!  hello {version, node, pid}            ──►    refuses another version or node name;
//!                                               stops serving control requests, holds
//!                                               port changes and reloads
//!                                        ◄──    offer {version, node, pid, control_socket,
//!                                                      ifaces [{name, mac}], own_netns,
//!                                                      ports [port record]}
//!  adds its bridges, interfaces and ports
//!  from the config and the offer (keeping
//!  the interfaces' MACs)
//!  ready                                 ──►    pauses its workers at a batch boundary
//!                                        ◄──    handover {fds: [control, takeover,
//!                                                      conntrack, conntrack6,
//!                                                      port {name}...]}
//!                                                      + descriptors
//!  maps the connection table (the old
//!  process no longer writes to it), adopts
//!  the TAPs (none created, no namespace
//!  entered), starts forwarding
//!  ack                                   ──►    exits 0 after `bye` (TAPs and socket
//!                                        ◄──    bye       files left in place)
//!  serves the control socket
//! ```
//!
//! The ports are described as the port record `<state_dir>/ports.json` describes them
//! ([`crate::state::PortRecord`]: name, TAP, interface name, MAC, bridge, origin, owner,
//! namespace, ifindex, offloads), and the new process writes the same record. Any
//! failure before the `ack` (an error, an `abort {error}`, the connection closing, a side
//! waiting too long) leaves the old process in charge: it resumes its workers and its control
//! socket as if nothing happened, and the new one exits with status 2 and the reason. When
//! the descriptors were sent, the new process may have mapped the connection table and
//! forwarded into it before failing (it stops its workers before it says `abort`), so the
//! old one first takes the table back (rebuilds its own view of it from the entries) and
//! writes its port record again. The new process checks the time too: it does not start
//! forwarding once [`ADOPT_DEADLINE`] has passed since the handover, well before the old one
//! gives up at [`ACK_TIMEOUT`], so the two never forward at once (unless the new process
//! stalls for seconds between that check and its workers' start). Once it has sent `ack`,
//! the new process goes on when the connection closes without a `bye` or an `abort`: the old
//! process died holding nothing the new one needs.
//!
//! With nobody to take over from (no socket, or nobody answers it), `--takeover` fails with a
//! message that says so rather than starting afresh: the caller asked for an upgrade without a
//! gap, and a fresh start would create TAPs the running pods do not have.
//!
//! The new process takes the running node's router interface MACs for interfaces whose MAC
//! the config does not set, so the pods' neighbour caches stay right (they are derived from
//! the names anyway, unless an older version chose them). Ports of the config file that the
//! new config no longer has are not adopted: once the old process is gone their TAPs are
//! deleted, as a reload would; ports the new config adds are created as at a normal start.
//! The FDB and the neighbour table are relearned; frames the old process had queued for ARP
//! are lost.
//!
//! What the pause costs: the old workers stop from `ready` until `ack`, while the new process
//! maps the connection table (it must not before: the old one writes to it), finishes its
//! datapath and starts its workers. `cli/tests/e2e/takeover.rs` measured about 10 to 20 ms with the
//! default 262,144-entry table (about 1 ms with none), during which frames wait in the TAPs'
//! queues (`txqueuelen`, 500 frames by default) rather than being lost.

use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tapyard::port::TapPort;
use tapyard_cni::netlink::Link;

use crate::ports::PortEntry;
use crate::state::{NetnsRecord, PortRecord};

mod error;
mod new;
mod old;
#[cfg(test)]
mod tests;
mod wire;

use error::fail;
pub use error::TakeoverError;
pub use new::{take_over, Adopted};
pub use old::{serve, OldSide};
pub use wire::{name, recv, recv_handover_rest, send, send_handover, FdRole, Msg, Wait};

/// The protocol's version: both sides must speak the same.
pub const VERSION: u32 = 1;

/// The socket's file name in the state directory.
pub const SOCKET_NAME: &str = crate::state::TAKEOVER_SOCKET;

/// The largest message accepted (a few thousand port records fit many times over).
pub const MAX_MSG: usize = 16 << 20;

/// Descriptors per message (the kernel takes at most 253).
pub const FDS_PER_MSG: usize = 200;

/// How long the old process waits for `hello` on a new connection.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the old process waits for `ready` (the new one builds its datapath meanwhile,
/// while the old one still forwards).
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// How long the old process stays paused waiting for `ack` before it resumes.
pub const ACK_TIMEOUT: Duration = Duration::from_secs(10);

/// The new process starts forwarding only within this time after it got the descriptors.
pub const ADOPT_DEADLINE: Duration = Duration::from_secs(5);

/// How long the old process takes to send a refusal or an abort to a peer that may not read.
pub(crate) const ABORT_SEND: Duration = Duration::from_secs(1);

/// Failure points of a takeover, for the tests ([`crate::failpoint`], debug builds only):
/// `takeover-new-after-fds=abort|exit` (the new process sends `abort`, or exits 3 at once,
/// right after it received the descriptors, while the old one is paused);
/// `takeover-new-after-start=abort` (the new process aborts once it has mapped the
/// connection table and forwarded, before the `ack`); `takeover-old-after-handover=exit`
/// (the old process exits 137 at once, as if killed, after it sent the descriptors).
pub const FAILPOINTS: [&str; 3] = [
    "takeover-new-after-fds",
    "takeover-new-after-start",
    "takeover-old-after-handover",
];

/// The registry entry of a port the running node offered, for datapath port `id`, with its
/// handed-over device (a fresh capture state). A port recorded in the old process's own
/// namespace (`own`), when that is not this process's, is placed there.
pub fn entry_of(
    r: &PortRecord,
    id: tapyard::PortId,
    tap: TapPort,
    own: Option<&NetnsRecord>,
    here: Option<crate::state::NsId>,
) -> PortEntry {
    let netns = r
        .netns
        .clone()
        .or_else(|| own.filter(|o| Some(o.id()) != here).cloned());
    PortEntry {
        id,
        name: r.name.clone(),
        tap: r.tap.clone(),
        ifname: r.ifname.clone(),
        owner: r.owner.clone(),
        kind: r.kind,
        bridge: r.bridge.clone(),
        link: (r.ifindex != 0).then(|| Link {
            index: r.ifindex,
            mac: r.mac.clone(),
            mtu: 0,
            up: true,
        }),
        netns: netns.as_ref().map(|n| n.path.clone()),
        netns_id: netns.as_ref().map(NetnsRecord::id),
        origin: r.origin,
        capture: Arc::default(),
        dev: Some(Arc::new(tap)),
        offload: r.offload,
        ips: r.ips.clone(),
    }
}

/// A router interface's MAC, so that the new process keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IfaceRecord {
    /// The interface's name.
    pub name: String,
    /// Its MAC.
    pub mac: String,
}

/// The takeover socket of a node with state directory `dir`.
pub fn socket_path(dir: &Path) -> PathBuf {
    dir.join(SOCKET_NAME)
}

/// Binds the takeover socket (mode 0600) in `dir`, creating it; a stale socket file is
/// removed, a live one (another tapyard with this state directory) refused.
pub fn bind(dir: &Path) -> Result<UnixListener, TakeoverError> {
    let path = socket_path(dir);
    crate::state::secure::check_dir(dir, true)?;
    if std::fs::symlink_metadata(&path).is_ok() {
        if UnixStream::connect(&path).is_ok() {
            return fail(format!(
                "another tapyard serves the takeover socket {} (same state_dir): stop it, or use `run --takeover` to replace it",
                path.display()
            ));
        }
        std::fs::remove_file(&path)
            .map_err(|e| format!("cannot remove stale socket {}: {e}", path.display()))?;
    }
    crate::control::bind(&path)
        .map_err(|e| TakeoverError::Protocol(format!("takeover socket: {e}")))
}
