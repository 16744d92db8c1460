//! The running (old) side of a takeover: it offers the node and hands over its descriptors.

use std::io::{self};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::node::Node;
use crate::ports::PortEntry;
use crate::state::PortRecord;

use super::{
    fail, name, recv, send, send_handover, FdRole, IfaceRecord, Msg, TakeoverError, Wait,
    ABORT_SEND, ACK_TIMEOUT, FAILPOINTS, HELLO_TIMEOUT, READY_TIMEOUT, VERSION,
};
use crate::control::server::ControlServer;

/// What the running (old) process hands over.
pub struct OldSide {
    /// The running node.
    pub node: Arc<Node>,
    /// Its control socket's server.
    pub control: Arc<ControlServer>,
    /// Where the control socket is bound.
    pub control_socket: PathBuf,
    /// The takeover socket (handed over too, so the new process serves the next takeover).
    pub takeover: UnixListener,
    /// The node's name.
    pub name: String,
    /// Set while a takeover is in progress (the main loop then leaves the node alone).
    pub busy: Arc<AtomicBool>,
}

impl std::fmt::Debug for OldSide {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OldSide")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// Serves the takeover socket until `stop` is set; a successful takeover ends the process
/// with exit status 0 (the socket files and TAPs stay for the new process). One takeover at
/// a time: another one connecting meanwhile waits in the backlog.
pub fn serve(old: OldSide, stop: Arc<AtomicBool>) {
    let _ = old.takeover.set_nonblocking(true);
    while !stop.load(Ordering::Relaxed) {
        match old.takeover.accept() {
            Ok((s, _)) => {
                if let Err(e) = handle_old(&old, s, &stop) {
                    log::warn!("takeover failed, forwarding goes on here: {e}");
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => {
                log::warn!("takeover socket accept: {e}");
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
}

/// The old side of one takeover. Returns the reason it failed (everything resumed), `Ok`
/// for a connection closed before `hello` (a probe); on success the process exits.
///
/// Nothing is held while the new process prepares (from `hello` to `ready`, up to
/// [`READY_TIMEOUT`]): the node forwards, serves control requests and takes port changes
/// and reloads as usual, so a peer that stalls there blocks no one. At `ready` the node is
/// held still (control requests wait in the socket's backlog, changes wait) and its ports
/// are compared with the offer: if one was added, removed or moved meanwhile, the takeover
/// is refused (run it again). From then on the exchange is bounded by [`ACK_TIMEOUT`], and
/// `stop` (SIGINT/SIGTERM) ends any wait within [`Wait::SLICE`].
fn handle_old(old: &OldSide, s: UnixStream, stop: &AtomicBool) -> Result<(), TakeoverError> {
    s.set_nonblocking(false)
        .map_err(|e| TakeoverError::failed("takeover socket", e))?;
    let (hello, _) = match recv(&s, Wait::new(HELLO_TIMEOUT, Some(stop))) {
        // Closed before a word: a probe (`tapyard cleanup` checking that a node runs).
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
            log::debug!("takeover socket: a connection closed before hello (a probe)");
            return Ok(());
        }
        r => r.map_err(|e| TakeoverError::failed("hello", e))?,
    };
    let Msg::Hello { version, node, pid } = hello else {
        return fail(format!("expected hello, got {}", name(&hello)));
    };
    let refuse = |error: String| {
        let abort = Msg::Abort {
            error: error.clone(),
        };
        let _ = send(&s, &abort, &[], Wait::new(ABORT_SEND, None));
        fail(format!("refused pid {pid}: {error}"))
    };
    if version != VERSION {
        return refuse(format!(
            "protocol version {version} is not supported: this tapyard (pid {}) speaks version {VERSION}",
            std::process::id()
        ));
    }
    if node != old.name {
        return refuse(format!(
            "node name {node:?} is not this node's ({:?})",
            old.name
        ));
    }
    log::info!(
        "takeover: pid {pid} asks for this node; forwarding, control requests and changes go on until it is ready"
    );
    // The main loop defers SIGHUP reloads and port refreshes until this ends.
    old.busy.store(true, Ordering::Release);
    let e = match offer(old, &s, stop) {
        Err(e) => e,
        Ok(offered) => {
            // Held still from here on, until it fails (or for good).
            let cur = old.node.current.lock().unwrap_or_else(|e| e.into_inner());
            let changes = old.node.ports.changing();
            old.control.stop();
            let mut handed = false;
            let e = match hand_over(old, &s, pid, &offered, stop, &mut handed) {
                Ok(never) => match never {},
                Err(e) => e,
            };
            // Only a failure returns: everything goes on.
            if handed {
                take_back(&old.node);
            }
            if old.node.with_runtime(|rt| rt.resume()).is_none() {
                log::error!("takeover: the runtime is gone, cannot resume");
            }
            drop(changes);
            drop(cur);
            e
        }
    };
    old.busy.store(false, Ordering::Release);
    if let Err(e) = old.control.start() {
        log::error!("takeover: cannot serve the control socket again: {e}");
    }
    let _ = send(
        &s,
        &Msg::Abort {
            error: e.to_string(),
        },
        &[],
        Wait::new(ABORT_SEND, None),
    );
    Err(TakeoverError::Peer {
        pid,
        source: Box::new(e),
    })
}

/// After a takeover that failed once the descriptors were sent (the workers still paused,
/// the new process gone or its node stopped): the new process may have opened the
/// connection table (rebuilt it, forwarded into it, renumbered its Services) and written
/// its port record, so the table is taken back ([`tapyard::conntrack::Conntrack::take_back`]),
/// its connections linked to this node's Services again, and this node's record written.
fn take_back(node: &Node) {
    if let Some(nf) = node.dp.control().netfilter() {
        let now = node.now();
        let t = Instant::now();
        let r = nf.conntrack().take_back(now);
        let (retagged, affinity) = nf.services().relink(nf.conntrack(), now);
        let r6 = nf.conntrack_of::<std::net::Ipv6Addr>().take_back(now);
        let (retagged6, _) = nf
            .services()
            .relink(nf.conntrack_of::<std::net::Ipv6Addr>(), now);
        log::info!(
            "takeover: IPv6 connection table taken back: {} connections ({retagged6} relinked to the Services)",
            r6.kept
        );
        log::info!(
            "takeover: connection table taken back in {:.1} ms: {} connections ({} freed as half-written, {} invalid, {} expired; {retagged} relinked to the Services, {affinity} client affinities)",
            t.elapsed().as_secs_f64() * 1000.0,
            r.kept,
            r.half_written,
            r.invalid,
            r.expired
        );
    }
    node.save_ports();
}

/// The node's ports as the record describes them, with their TAPs.
fn snapshot(node: &Node) -> Result<(Vec<PortEntry>, Vec<PortRecord>), TakeoverError> {
    let entries = node.ports.list();
    if let Some(e) = entries.iter().find(|e| e.dev.is_none()) {
        return fail(format!("port {:?} has no TAP device", e.name));
    }
    let records = entries.iter().map(PortEntry::record).collect();
    Ok((entries, records))
}

/// Offers the node as it is now and waits for `ready` (the new process prepares meanwhile,
/// while this one goes on as usual). Returns the ports offered.
fn offer(
    old: &OldSide,
    s: &UnixStream,
    stop: &AtomicBool,
) -> Result<Vec<PortRecord>, TakeoverError> {
    let node = &old.node;
    let (_, records) = snapshot(node)?;
    let ifaces = node
        .ifaces
        .iter()
        .map(|(n, m, _)| IfaceRecord {
            name: n.clone(),
            mac: m.to_string(),
        })
        .collect();
    let offer = Msg::Offer {
        version: VERSION,
        node: old.name.clone(),
        pid: std::process::id(),
        control_socket: old.control_socket.clone(),
        ifaces,
        own_netns: node.state.own_netns(),
        ports: records.clone(),
    };
    send(s, &offer, &[], Wait::new(ACK_TIMEOUT, Some(stop)))
        .map_err(|e| TakeoverError::failed("offer", e))?;
    match recv(s, Wait::new(READY_TIMEOUT, Some(stop)))
        .map_err(|e| TakeoverError::failed("waiting for ready", e))?
    {
        (Msg::Ready {}, _) => Ok(records),
        (m, _) => fail(format!("expected ready, got {}", name(&m))),
    }
}

/// With the node held still: checks that its ports are still the ones offered, hands the
/// descriptors over and, on `ack`, exits the process. Returns only on failure; `handed` is
/// set once the descriptors were sent (the new process may have used them).
fn hand_over(
    old: &OldSide,
    s: &UnixStream,
    pid: u32,
    offered: &[PortRecord],
    stop: &AtomicBool,
    handed: &mut bool,
) -> Result<std::convert::Infallible, TakeoverError> {
    let node = &old.node;
    let (entries, records) = snapshot(node)?;
    if records != offered {
        return fail(format!(
            "the node's ports changed while pid {pid} prepared (a port was added, removed or moved): nothing was handed over; run --takeover again"
        ));
    }
    let taps: Vec<_> = entries.iter().filter_map(|e| e.dev.clone()).collect();
    let paused_at = Instant::now();
    node.with_runtime(|rt| rt.pause())
        .ok_or("the node is stopping")?;
    let mut roles = vec![FdRole::Control, FdRole::Takeover];
    let mut fds: Vec<BorrowedFd<'_>> = vec![old.control.listener().as_fd(), old.takeover.as_fd()];
    // The connection table: the workers no longer write to it; the new process maps it.
    if let Some(f) = node
        .dp
        .control()
        .netfilter()
        .and_then(|nf| nf.conntrack().backing_file())
    {
        roles.push(FdRole::Conntrack);
        fds.push(f);
    }
    if let Some(f) = node
        .dp
        .control()
        .netfilter()
        .and_then(|nf| nf.conntrack_of::<std::net::Ipv6Addr>().backing_file())
    {
        roles.push(FdRole::Conntrack6);
        fds.push(f);
    }
    for (e, tap) in entries.iter().zip(&taps) {
        roles.push(FdRole::Port {
            name: e.name.clone(),
        });
        fds.push(tap.handover_fd());
    }
    // From the first descriptor sent, the new process may use them.
    *handed = true;
    let wait = Wait::new(ACK_TIMEOUT, Some(stop));
    send_handover(s, roles, &fds, wait).map_err(|e| TakeoverError::failed("handover", e))?;
    if crate::failpoint::is(FAILPOINTS[2], "exit") {
        // As if killed: no destructor, no message.
        std::process::exit(137);
    }
    match recv(s, wait).map_err(|e| TakeoverError::failed("waiting for ack", e))? {
        (Msg::Ack {}, _) => {}
        (m, _) => return fail(format!("expected ack, got {}", name(&m))),
    }
    let gap = paused_at.elapsed();
    let _ = send(s, &Msg::Bye {}, &[], Wait::new(ABORT_SEND, None));
    let st = node.dp.control().stats();
    log::info!(
        "handed over to pid {pid}: {} port(s); workers paused {:.1} ms before the ack; exiting (forwarded {} flooded {} local {} dropped {})",
        entries.len(),
        gap.as_secs_f64() * 1000.0,
        st.forwarded,
        st.flooded,
        st.local,
        st.rx_drops()
    );
    // The TAPs and both socket files now belong to the new process: exit without the
    // destructors that would remove the files (the descriptors close with the process).
    std::process::exit(0);
}
