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

use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use serde::{Deserialize, Serialize};
use tapyard::port::TapPort;
use tapyard::MacAddr;
use tapyard_cni::netlink::Link;

use crate::config::Config;
use crate::node::{Node, Plan};
use crate::ports::{Origin, PortEntry};
use crate::state::{NetnsRecord, PortRecord};

/// The protocol's version: both sides must speak the same.
pub const VERSION: u32 = 1;

/// The socket's file name in the state directory.
pub const SOCKET_NAME: &str = "takeover.sock";

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

/// What a handed-over descriptor is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case", deny_unknown_fields)]
pub enum FdRole {
    /// The control socket's listening socket.
    Control,
    /// The takeover socket's listening socket.
    Takeover,
    /// The connection table's file (`<state_dir>/conntrack`), with its lock.
    Conntrack,
    /// The IPv6 connection table's file (`<state_dir>/conntrack6`), with its lock.
    Conntrack6,
    /// The TAP of the port record called `name`.
    Port {
        /// The record's name.
        name: String,
    },
}

/// A message of the protocol (see the module docs for the order).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "msg", rename_all = "snake_case", deny_unknown_fields)]
pub enum Msg {
    /// New → old: who asks.
    Hello {
        /// The protocol version it speaks.
        version: u32,
        /// Its config's node name.
        node: String,
        /// Its process id.
        pid: u32,
    },
    /// Old → new: what it runs (still forwarding).
    Offer {
        /// The protocol version it speaks.
        version: u32,
        /// Its node name.
        node: String,
        /// Its process id.
        pid: u32,
        /// The path its control socket is bound to.
        control_socket: PathBuf,
        /// Its router interfaces' MACs.
        ifaces: Vec<IfaceRecord>,
        /// Its namespace (its ports without `netns` live there).
        own_netns: Option<NetnsRecord>,
        /// Its ports, as its port record (`<state_dir>/ports.json`) lists them.
        ports: Vec<PortRecord>,
    },
    /// New → old: built, send the descriptors.
    Ready {},
    /// Old → new: paused; these descriptors, in this order (the first ones with this
    /// message, the rest in `fds` messages).
    Handover {
        /// What each descriptor is.
        fds: Vec<FdRole>,
    },
    /// Old → new: the next descriptors of a handover.
    Fds {
        /// How many come with this message.
        count: usize,
    },
    /// New → old: forwarding; exit.
    Ack {},
    /// Old → new: exiting.
    Bye {},
    /// Either way: giving up, and why.
    Abort {
        /// The reason.
        error: String,
    },
}

fn would_block(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// How long one exchange may take as a whole, and the flag (SIGINT/SIGTERM) that ends it
/// early. Every takeover read and write waits in slices of at most [`Wait::SLICE`], so a
/// peer that trickles bytes cannot stretch the exchange past `until`, and a signal is seen
/// within a slice whatever the peer does.
#[derive(Clone, Copy, Debug)]
pub struct Wait<'a> {
    /// When the exchange gives up (`TimedOut`).
    pub until: Instant,
    /// Set: give up now (`Interrupted`).
    pub stop: Option<&'a AtomicBool>,
}

impl<'a> Wait<'a> {
    /// The longest single wait, and so how late a signal is seen.
    pub const SLICE: Duration = Duration::from_millis(100);

    /// An exchange that may take `d` from now, ended early by `stop`.
    pub fn new(d: Duration, stop: Option<&'a AtomicBool>) -> Wait<'a> {
        Wait {
            until: Instant::now() + d,
            stop,
        }
    }

    /// The next slice to wait, or why not to wait any more.
    fn slice(&self) -> io::Result<Duration> {
        if self.stop.is_some_and(|s| s.load(Ordering::Relaxed)) {
            return Err(io::Error::new(
                io::ErrorKind::Interrupted,
                "stopping (signal)",
            ));
        }
        let left = self.until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "no answer in time"));
        }
        Ok(left.min(Self::SLICE))
    }
}

/// Sends `msg` with `fds` attached (one `sendmsg`, the rest of a long message after it),
/// within `wait`.
pub fn send(
    sock: &UnixStream,
    msg: &Msg,
    fds: &[BorrowedFd<'_>],
    wait: Wait<'_>,
) -> io::Result<()> {
    let body = serde_json::to_vec(msg).map_err(io::Error::other)?;
    let len = u32::try_from(body.len())
        .ok()
        .filter(|&l| l as usize <= MAX_MSG)
        .ok_or_else(|| io::Error::other(format!("message of {} bytes is too long", body.len())))?;
    let mut bytes = len.to_le_bytes().to_vec();
    bytes.extend_from_slice(&body);
    let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let cmsg = [ControlMessage::ScmRights(&raw)];
    let cmsgs: &[ControlMessage] = if raw.is_empty() { &[] } else { &cmsg };
    // The descriptors go with the first byte sent: retry until that one is out.
    let mut sent = loop {
        sock.set_write_timeout(Some(wait.slice()?))?;
        match sendmsg::<()>(
            sock.as_raw_fd(),
            &[IoSlice::new(&bytes)],
            cmsgs,
            MsgFlags::MSG_NOSIGNAL,
            None,
        ) {
            Ok(n) => break n,
            Err(nix::errno::Errno::EINTR | nix::errno::Errno::EAGAIN) => continue,
            Err(e) => return Err(e.into()),
        }
    };
    while sent < bytes.len() {
        sock.set_write_timeout(Some(wait.slice()?))?;
        match (&*sock).write(&bytes[sent..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => sent += n,
            Err(e) if would_block(&e) || e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Reads exactly `buf.len()` bytes within `wait`, keeping every descriptor that comes with
/// them.
#[allow(unsafe_code)] // OwnedFd::from_raw_fd on received descriptors, with a SAFETY line
fn recv_exact(
    sock: &UnixStream,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
    wait: Wait<'_>,
) -> io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        sock.set_read_timeout(Some(wait.slice()?))?;
        let mut space = nix::cmsg_space!([RawFd; FDS_PER_MSG]);
        let mut iov = [IoSliceMut::new(&mut buf[got..])];
        let r = recvmsg::<()>(
            sock.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        );
        let msg = match r {
            Ok(m) => m,
            Err(nix::errno::Errno::EINTR | nix::errno::Errno::EAGAIN) => continue,
            Err(e) => return Err(e.into()),
        };
        let n = msg.bytes;
        let cmsgs = msg
            .cmsgs()
            .map_err(|_| io::Error::other("descriptors were cut short (MSG_CTRUNC)"))?;
        for c in cmsgs {
            if let ControlMessageOwned::ScmRights(raw) = c {
                for fd in raw {
                    // SAFETY: the kernel has just installed `fd` in this process's table for
                    // this message; nothing else knows of it, so this is its only owner.
                    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
                    fds.push(owned);
                }
            }
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the other process closed the connection",
            ));
        }
        got += n;
    }
    Ok(())
}

/// Receives one message and the descriptors that came with it, within `wait`. Running out
/// of time is `TimedOut`, `wait.stop` set is `Interrupted`; a message that is not valid JSON
/// of [`Msg`] is `InvalidData` naming what is wrong.
pub fn recv(sock: &UnixStream, wait: Wait<'_>) -> io::Result<(Msg, Vec<OwnedFd>)> {
    let mut fds = Vec::new();
    let mut len = [0u8; 4];
    recv_exact(sock, &mut len, &mut fds, wait)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_MSG {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("message length {len} is over the limit of {MAX_MSG} bytes"),
        ));
    }
    let mut body = vec![0u8; len];
    recv_exact(sock, &mut body, &mut fds, wait)?;
    let msg = serde_json::from_slice(&body).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("bad takeover message: {e}"),
        )
    })?;
    Ok((msg, fds))
}

/// Sends a handover: `roles` with their descriptors, in chunks of [`FDS_PER_MSG`].
pub fn send_handover(
    sock: &UnixStream,
    roles: Vec<FdRole>,
    fds: &[BorrowedFd<'_>],
    wait: Wait<'_>,
) -> io::Result<()> {
    let mut chunks = fds.chunks(FDS_PER_MSG);
    let first = chunks.next().unwrap_or(&[]);
    send(sock, &Msg::Handover { fds: roles }, first, wait)?;
    for c in chunks {
        send(sock, &Msg::Fds { count: c.len() }, c, wait)?;
    }
    Ok(())
}

/// Receives the rest of a handover whose `handover` message announced `roles` and brought
/// `fds`: the descriptors paired with their roles.
pub fn recv_handover_rest(
    sock: &UnixStream,
    roles: Vec<FdRole>,
    mut fds: Vec<OwnedFd>,
    wait: Wait<'_>,
) -> io::Result<Vec<(FdRole, OwnedFd)>> {
    while fds.len() < roles.len() {
        match recv(sock, wait)? {
            (Msg::Fds { count }, more) if count == more.len() => fds.extend(more),
            (Msg::Fds { count }, more) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "fds message announced {count} descriptors and brought {}",
                        more.len()
                    ),
                ))
            }
            (other, _) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("expected more descriptors, got {}", name(&other)),
                ))
            }
        }
    }
    if fds.len() != roles.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} descriptors for {} roles", fds.len(), roles.len()),
        ));
    }
    Ok(roles.into_iter().zip(fds).collect())
}

/// A message's name, for errors.
pub fn name(m: &Msg) -> String {
    match m {
        Msg::Abort { error } => format!("abort ({error})"),
        m => serde_json::to_value(m)
            .ok()
            .and_then(|v| v.get("msg").and_then(|s| s.as_str()).map(str::to_string))
            .unwrap_or_default(),
    }
}

/// The takeover socket of a node with state directory `dir`.
pub fn socket_path(dir: &Path) -> PathBuf {
    dir.join(SOCKET_NAME)
}

/// Binds the takeover socket (mode 0600) in `dir`, creating it; a stale socket file is
/// removed, a live one (another tapyard with this state directory) refused.
pub fn bind(dir: &Path) -> Result<UnixListener, String> {
    let path = socket_path(dir);
    crate::secure::check_dir(dir, true).map_err(|e| e.to_string())?;
    if std::fs::symlink_metadata(&path).is_ok() {
        if UnixStream::connect(&path).is_ok() {
            return Err(format!(
                "another tapyard serves the takeover socket {} (same state_dir): stop it, or use `run --takeover` to replace it",
                path.display()
            ));
        }
        std::fs::remove_file(&path)
            .map_err(|e| format!("cannot remove stale socket {}: {e}", path.display()))?;
    }
    crate::control::bind(&path).map_err(|e| format!("takeover socket: {e}"))
}

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
    pub fn start(&self) -> Result<(), String> {
        let mut r = self.running.lock().unwrap_or_else(|e| e.into_inner());
        if r.is_some() {
            return Ok(());
        }
        let l = self
            .listener
            .try_clone()
            .map_err(|e| format!("control socket: {e}"))?;
        let stop = Arc::new(AtomicBool::new(false));
        let (node, s) = (self.node.clone(), stop.clone());
        let t = std::thread::Builder::new()
            .name("tapyard-control".into())
            .spawn(move || crate::control::serve(l, node, s))
            .map_err(|e| format!("cannot start the control thread: {e}"))?;
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

/// How long the old process takes to send a refusal or an abort to a peer that may not read.
const ABORT_SEND: Duration = Duration::from_secs(1);

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
fn handle_old(old: &OldSide, s: UnixStream, stop: &AtomicBool) -> Result<(), String> {
    s.set_nonblocking(false).map_err(|e| e.to_string())?;
    let (hello, _) = match recv(&s, Wait::new(HELLO_TIMEOUT, Some(stop))) {
        // Closed before a word: a probe (`tapyard cleanup` checking that a node runs).
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
            log::debug!("takeover socket: a connection closed before hello (a probe)");
            return Ok(());
        }
        r => r.map_err(|e| format!("hello: {e}"))?,
    };
    let Msg::Hello { version, node, pid } = hello else {
        return Err(format!("expected hello, got {}", name(&hello)));
    };
    let refuse = |error: String| {
        let abort = Msg::Abort {
            error: error.clone(),
        };
        let _ = send(&s, &abort, &[], Wait::new(ABORT_SEND, None));
        Err(format!("refused pid {pid}: {error}"))
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
        &Msg::Abort { error: e.clone() },
        &[],
        Wait::new(ABORT_SEND, None),
    );
    Err(format!("pid {pid}: {e}"))
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
        let r6 = nf.conntrack6().take_back(now);
        let (retagged6, _) = nf.services().relink6(nf.conntrack6(), now);
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
fn snapshot(node: &Node) -> Result<(Vec<PortEntry>, Vec<PortRecord>), String> {
    let entries = node.ports.list();
    if let Some(e) = entries.iter().find(|e| e.dev.is_none()) {
        return Err(format!("port {:?} has no TAP device", e.name));
    }
    let records = entries.iter().map(PortEntry::record).collect();
    Ok((entries, records))
}

/// Offers the node as it is now and waits for `ready` (the new process prepares meanwhile,
/// while this one goes on as usual). Returns the ports offered.
fn offer(old: &OldSide, s: &UnixStream, stop: &AtomicBool) -> Result<Vec<PortRecord>, String> {
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
    send(s, &offer, &[], Wait::new(ACK_TIMEOUT, Some(stop))).map_err(|e| format!("offer: {e}"))?;
    match recv(s, Wait::new(READY_TIMEOUT, Some(stop)))
        .map_err(|e| format!("waiting for ready: {e}"))?
    {
        (Msg::Ready {}, _) => Ok(records),
        (m, _) => Err(format!("expected ready, got {}", name(&m))),
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
) -> Result<std::convert::Infallible, String> {
    let node = &old.node;
    let (entries, records) = snapshot(node)?;
    if records != offered {
        return Err(format!(
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
        .and_then(|nf| nf.conntrack6().backing_file())
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
    send_handover(s, roles, &fds, wait).map_err(|e| format!("handover: {e}"))?;
    if crate::failpoint::is(FAILPOINTS[2], "exit") {
        // As if killed: no destructor, no message.
        std::process::exit(137);
    }
    match recv(s, wait).map_err(|e| format!("waiting for ack: {e}"))? {
        (Msg::Ack {}, _) => {}
        (m, _) => return Err(format!("expected ack, got {}", name(&m))),
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

/// What the new process got from the old one.
pub struct Adopted {
    /// The running node (forwarding).
    pub node: Arc<Node>,
    /// The control socket's listening socket.
    pub control: UnixListener,
    /// Where it is bound.
    pub control_socket: PathBuf,
    /// The takeover socket's listening socket.
    pub takeover: UnixListener,
    /// The old process's id.
    pub old_pid: u32,
}

impl std::fmt::Debug for Adopted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Adopted")
            .field("control_socket", &self.control_socket)
            .field("old_pid", &self.old_pid)
            .finish_non_exhaustive()
    }
}

/// Takes over from the tapyard that serves `<state_dir>/takeover.sock` for `cfg`'s node
/// (see the module docs). On an error the old process goes on, and the message says why.
/// Every wait is bounded (see [`Wait`]) and `stop` (SIGINT/SIGTERM) ends it.
pub fn take_over(cfg: Config, config_path: PathBuf, stop: &AtomicBool) -> Result<Adopted, String> {
    let dir = cfg.node.state_dir_path();
    let path = socket_path(&dir);
    let s = UnixStream::connect(&path).map_err(|e| {
        format!(
            "--takeover: nobody to take over from: no tapyard answers on {} ({e}); start without --takeover",
            path.display()
        )
    })?;
    let hello = Msg::Hello {
        version: VERSION,
        node: cfg.node.name.clone(),
        pid: std::process::id(),
    };
    send(&s, &hello, &[], Wait::new(HELLO_TIMEOUT, Some(stop)))
        .map_err(|e| format!("--takeover: hello: {e}"))?;
    let (ifaces, records, old_pid, control_socket, own_netns) =
        match recv(&s, Wait::new(READY_TIMEOUT, Some(stop)))
            .map_err(|e| format!("--takeover: waiting for the running node's offer: {e}"))?
        {
            (
                Msg::Offer {
                    version,
                    node,
                    pid,
                    control_socket,
                    ifaces,
                    own_netns,
                    ports,
                },
                _,
            ) => {
                if version != VERSION || node != cfg.node.name {
                    return Err(format!(
                        "--takeover: the running node offered version {version} of node {node:?}"
                    ));
                }
                (ifaces, ports, pid, control_socket, own_netns)
            }
            (Msg::Abort { error }, _) => {
                return Err(format!(
                    "--takeover: refused by the running node: {error} (it goes on forwarding)"
                ))
            }
            (m, _) => return Err(format!("--takeover: expected an offer, got {}", name(&m))),
        };
    log::info!(
        "taking over from pid {old_pid}: {} port(s), control socket {}",
        records.len(),
        control_socket.display()
    );
    let abort = |error: String| {
        let abort = Msg::Abort {
            error: error.clone(),
        };
        let _ = send(&s, &abort, &[], Wait::new(ABORT_SEND, None));
        format!("--takeover: {error} (pid {old_pid} goes on forwarding)")
    };
    match adopt(
        &s,
        cfg,
        config_path,
        &ifaces,
        &records,
        own_netns.as_ref(),
        stop,
    ) {
        Ok((node, control, takeover, gone)) => {
            if crate::failpoint::is(FAILPOINTS[1], "abort") {
                give_up(node, &records);
                return Err(abort(format!(
                    "failing on purpose ({}=abort)",
                    FAILPOINTS[1]
                )));
            }
            let wait = Wait::new(Duration::from_secs(5), None);
            // The old process closes the connection only after an `abort` (read first), or
            // by exiting: a connection closed without one means it died after handing over,
            // and this process, holding everything, goes on.
            let died = |e: &io::Error| {
                matches!(
                    e.kind(),
                    io::ErrorKind::UnexpectedEof
                        | io::ErrorKind::BrokenPipe
                        | io::ErrorKind::ConnectionReset
                )
            };
            let confirmed = match send(&s, &Msg::Ack {}, &[], wait) {
                Err(e) if died(&e) => Err(e),
                Err(e) => {
                    give_up(node, &records);
                    return Err(abort(format!("ack: {e}")));
                }
                Ok(()) => match recv(&s, wait) {
                    Ok((Msg::Bye {}, _)) => Ok(()),
                    Err(e) if died(&e) => Err(e),
                    other => {
                        // The old process gave up meanwhile and forwards again: stop at once.
                        give_up(node, &records);
                        let why = match other {
                            Ok((m, _)) => name(&m),
                            Err(e) => e.to_string(),
                        };
                        return Err(format!(
                            "--takeover: pid {old_pid} did not confirm the handover ({why}); stopped"
                        ));
                    }
                },
            };
            if let Err(e) = confirmed {
                log::warn!(
                    "--takeover: pid {old_pid} closed the connection without confirming ({e}): it died after handing over; this process goes on with the node"
                );
            }
            // Its exit closes the connection: then its metrics port, if any, is free, and
            // the TAPs of ports gone from the config go with their last descriptor.
            for (name, tap) in gone {
                match tap.set_persist(false) {
                    Ok(()) => {
                        log::info!("port {name} is no longer in the config: its TAP is deleted")
                    }
                    Err(e) => log::warn!("port {name}: cannot delete its TAP: {e}"),
                }
            }
            let mut b = [0u8; 1];
            let _ = (&s).read(&mut b);
            Ok(Adopted {
                node,
                control,
                control_socket,
                takeover,
                old_pid,
            })
        }
        Err(e) => Err(abort(e)),
    }
}

/// Stops a node this process started but must not keep (the old process goes on): the
/// TAPs it created for ports the old process did not offer lose their persist flag (they go
/// with this process), and the node is dropped before the old process is told, so that its
/// workers no longer write to the connection table.
fn give_up(node: Arc<Node>, offered: &[PortRecord]) {
    node.stop();
    for e in node.ports.list() {
        if offered.iter().any(|r| r.name == e.name) {
            continue;
        }
        if let Some(dev) = &e.dev {
            let _ = dev.set_persist(false);
        }
    }
    drop(node);
}

/// What [`adopt`] ends with: the running node, the control and takeover sockets, and the
/// TAPs of ports gone from the config (deleted once the old process is gone).
type Taken = (
    Arc<Node>,
    UnixListener,
    UnixListener,
    Vec<(String, TapPort)>,
);

/// The new side's work between the offer and the ack: build, `ready`, receive the
/// descriptors, adopt them, start forwarding.
fn adopt(
    s: &UnixStream,
    cfg: Config,
    config_path: PathBuf,
    ifaces: &[IfaceRecord],
    records: &[PortRecord],
    own_netns: Option<&NetnsRecord>,
    stop: &AtomicBool,
) -> Result<Taken, String> {
    let mut macs = Vec::new();
    for i in ifaces {
        let mac: MacAddr = crate::config::values::parse_mac(&i.mac)
            .map_err(|e| format!("interface {:?}: mac {:?}: {e}", i.name, i.mac))?;
        macs.push((i.name.clone(), mac));
    }
    let here = crate::state::own_ns().ok();
    let mut plan = Plan::new(cfg, config_path, &macs)?;
    // Datapath ports: the config's have theirs; the others get one on their bridge.
    let mut ids = Vec::with_capacity(records.len());
    for r in records {
        let id = if r.origin == Origin::Config {
            let found = plan.taps.iter().find(|t| t.1 == r.name).map(|t| t.0);
            if found.is_none() {
                log::info!(
                    "port {:?} is no longer in the config: not taken over (its TAP goes with the old process)",
                    r.name
                );
            }
            found
        } else {
            let bridge = r.bridge.as_deref().unwrap_or_default();
            let bid = plan.bridge(bridge).ok_or_else(|| {
                format!(
                    "port {:?} is on bridge {bridge:?}, which the config does not have",
                    r.name
                )
            })?;
            Some(plan.add_port(&r.name, bid)?)
        };
        ids.push(id);
    }
    // Config ports the running node does not have are created as at a normal start.
    let mut fresh = Vec::new();
    for (i, t) in plan.taps.iter().enumerate() {
        if !records
            .iter()
            .any(|r| r.origin == Origin::Config && r.name == t.1)
        {
            log::info!("port {:?} is new in the config: creating its TAP", t.1);
            fresh.push(plan.open_config_port(i)?);
        }
    }
    let wait = Wait::new(ACK_TIMEOUT, Some(stop));
    send(s, &Msg::Ready {}, &[], wait).map_err(|e| format!("ready: {e}"))?;
    let (roles, fds) =
        match recv(s, wait).map_err(|e| format!("waiting for the descriptors: {e}"))? {
            (Msg::Handover { fds: roles }, fds) => (roles, fds),
            (m, _) => return Err(format!("expected the descriptors, got {}", name(&m))),
        };
    let got = Instant::now();
    let pairs = recv_handover_rest(s, roles, fds, wait).map_err(|e| format!("descriptors: {e}"))?;
    // For the tests of the old process's recovery: fail (or die) holding the descriptors.
    match crate::failpoint::action(FAILPOINTS[0]).as_deref() {
        Some("abort") => return Err(format!("failing on purpose ({}=abort)", FAILPOINTS[0])),
        Some("exit") => std::process::exit(3),
        _ => {}
    }
    let (mut control, mut takeover, mut conntrack, mut conntrack6) = (None, None, None, None);
    let mut taps = Vec::with_capacity(records.len());
    let mut gone = Vec::new();
    for (role, fd) in pairs {
        match role {
            FdRole::Control => control = Some(UnixListener::from(fd)),
            FdRole::Takeover => takeover = Some(UnixListener::from(fd)),
            FdRole::Conntrack => conntrack = Some(std::fs::File::from(fd)),
            FdRole::Conntrack6 => conntrack6 = Some(std::fs::File::from(fd)),
            FdRole::Port { name } => {
                let i = records.iter().position(|r| r.name == name).ok_or_else(|| {
                    format!("a descriptor for port {name:?}, which was not offered")
                })?;
                let r = &records[i];
                let Some(id) = ids[i] else {
                    // Gone from the config: deleted once the takeover is done.
                    let tap = TapPort::from_fd(fd, r.offload)
                        .map_err(|e| format!("port {name:?}: {e}"))?;
                    gone.push((name, tap));
                    continue;
                };
                let tap =
                    TapPort::from_fd(fd, r.offload).map_err(|e| format!("port {name:?}: {e}"))?;
                taps.push(entry_of(r, id, tap, own_netns, here));
            }
        }
    }
    if taps.len() != ids.iter().flatten().count() {
        return Err("some offered ports came without a descriptor".into());
    }
    let control = control.ok_or("no control socket among the descriptors")?;
    let takeover = takeover.ok_or("no takeover socket among the descriptors")?;
    // The old process has stopped writing to its connection table: map it (with its lock).
    let conntrack = conntrack.filter(|_| plan.has_conntrack());
    let t_build = Instant::now();
    if let Some(f) = conntrack6 {
        plan.conntrack6_handed_over(f);
    }
    let built = plan.build(conntrack)?;
    let build_ms = t_build.elapsed().as_secs_f64() * 1000.0;
    let mut ports = taps;
    ports.extend(fresh);
    if got.elapsed() > ADOPT_DEADLINE {
        return Err(format!(
            "adopting took over {ADOPT_DEADLINE:?}: not starting (the old process may have resumed)"
        ));
    }
    let node = Arc::new(built.run(ports)?);
    log::info!(
        "ports recorded in {} ({} taken over)",
        node.state.dir.join(crate::state::PORTS_FILE).display(),
        ids.iter().flatten().count()
    );
    log::info!(
        "took over: forwarding {:.1} ms after the descriptors arrived (of which {build_ms:.1} ms to map the connection table and build the datapath)",
        got.elapsed().as_secs_f64() * 1000.0
    );
    Ok((node, control, takeover, gone))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Seek;

    fn record(name: &str) -> PortRecord {
        PortRecord {
            name: name.into(),
            tap: name.into(),
            ifname: "eth0".into(),
            mac: "02:00:00:00:00:01".into(),
            kind: crate::ports::Kind::Pod,
            bridge: Some("cni0".into()),
            origin: Origin::Cni,
            owner: Some("c1/eth0".into()),
            netns: Some(NetnsRecord {
                path: "/var/run/netns/x".into(),
                dev: 4,
                ino: 4026532301,
            }),
            ifindex: 7,
            offload: false,
        }
    }

    #[test]
    fn messages_cross_a_socketpair_with_their_descriptors() {
        let (a, b) = UnixStream::pair().unwrap();
        let offer = Msg::Offer {
            version: VERSION,
            node: "n".into(),
            pid: 1,
            control_socket: "/run/tapyard/n.sock".into(),
            ifaces: vec![IfaceRecord {
                name: "cni0".into(),
                mac: "02:00:00:00:00:aa".into(),
            }],
            own_netns: None,
            ports: vec![record("ty00000001")],
        };
        let w = || Wait::new(Duration::from_secs(5), None);
        send(&a, &offer, &[], w()).unwrap();
        let (got, fds) = recv(&b, w()).unwrap();
        assert_eq!(got, offer);
        assert!(fds.is_empty());

        // Descriptors really pass: files written on one side are read through the other's.
        let n = FDS_PER_MSG * 2 + 3;
        let mut files = Vec::new();
        for i in 0..n {
            let mut f = tempfile(i);
            f.write_all(format!("file {i}").as_bytes()).unwrap();
            files.push(f);
        }
        let roles: Vec<FdRole> = (0..n)
            .map(|i| FdRole::Port {
                name: format!("p{i}"),
            })
            .collect();
        let borrowed: Vec<BorrowedFd<'_>> = files.iter().map(|f| f.as_fd()).collect();
        let t = {
            let roles = roles.clone();
            std::thread::scope(|sc| {
                sc.spawn(|| send_handover(&a, roles, &borrowed, w()).unwrap());
                let (m, fds) = recv(&b, w()).unwrap();
                let Msg::Handover { fds: r } = m else {
                    panic!("{m:?}")
                };
                assert_eq!(fds.len(), FDS_PER_MSG);
                recv_handover_rest(&b, r, fds, w()).unwrap()
            })
        };
        assert_eq!(t.len(), n);
        for (i, (role, fd)) in t.into_iter().enumerate() {
            assert_eq!(role, roles[i]);
            let mut f = std::fs::File::from(fd);
            f.rewind().unwrap();
            let mut s = String::new();
            f.read_to_string(&mut s).unwrap();
            assert_eq!(s, format!("file {i}"));
        }
    }

    fn tempfile(i: usize) -> std::fs::File {
        let p = std::env::temp_dir().join(format!("tapyard-takeover-{}-{i}", std::process::id()));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&p)
            .unwrap();
        let _ = std::fs::remove_file(&p);
        f
    }

    #[test]
    fn bad_messages_are_errors_not_crashes() {
        let (a, b) = UnixStream::pair().unwrap();
        let w = || Wait::new(Duration::from_millis(300), None);
        // Unknown message, unknown field, not JSON, too long, cut short, nothing at all.
        for body in [
            &br#"{"msg":"frobnicate"}"#[..],
            br#"{"msg":"ready","x":1}"#,
            b"\xff\xfe",
        ] {
            (&a).write_all(&u32::try_from(body.len()).unwrap().to_le_bytes())
                .unwrap();
            (&a).write_all(body).unwrap();
            let e = recv(&b, w()).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
            assert!(e.to_string().contains("bad takeover message"), "{e}");
        }
        (&a).write_all(&u32::MAX.to_le_bytes()).unwrap();
        let e = recv(&b, w()).unwrap_err();
        assert!(e.to_string().contains("over the limit"), "{e}");
        assert_eq!(recv(&b, w()).unwrap_err().kind(), io::ErrorKind::TimedOut);
        (&a).write_all(&10u32.to_le_bytes()).unwrap();
        (&a).write_all(b"{\"ms").unwrap();
        drop(a);
        let e = recv(&b, w()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{e}");
    }

    #[test]
    fn a_trickling_or_stopped_exchange_ends_at_its_deadline() {
        let (a, b) = UnixStream::pair().unwrap();
        // A length, then one byte every 50 ms for 2 s: each read gets something, so only
        // the overall deadline ends the wait.
        let t = std::thread::spawn(move || {
            let _ = (&a).write_all(&100u32.to_le_bytes());
            for _ in 0..40 {
                if (&a).write_all(b" ").is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let t0 = Instant::now();
        let e = recv(&b, Wait::new(Duration::from_millis(300), None)).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
        assert!(
            t0.elapsed() < Duration::from_millis(1500),
            "{:?}",
            t0.elapsed()
        );
        // A signal ends a long wait at once.
        let stop = AtomicBool::new(true);
        let e = recv(&b, Wait::new(Duration::from_secs(60), Some(&stop))).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::Interrupted, "{e}");
        drop(b);
        t.join().unwrap();
    }

    #[test]
    fn offered_ports_become_the_same_registry_entries() {
        let root = std::fs::read_to_string("/proc/self/status").is_ok_and(|t| {
            t.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"))
        });
        if !root || !Path::new("/dev/net/tun").exists() {
            eprintln!("skipping: needs root and /dev/net/tun to open a TAP");
            return;
        }
        let name = format!("tyrt{}", std::process::id() % 100_000);
        let tap = || TapPort::open(&name).unwrap();
        let r = record(&name);
        let e = entry_of(&r, tapyard::PortId(3), tap(), None, None);
        assert_eq!(e.record(), r);
        assert_eq!(e.info().ifindex, 7);
        drop(e);
        // A port the old process had in its own namespace, another than this one's.
        let own = NetnsRecord {
            path: "/proc/1/ns/net".into(),
            dev: 1,
            ino: 2,
        };
        let mut here = record(&name);
        here.netns = None;
        let e = entry_of(&here, tapyard::PortId(3), tap(), Some(&own), Some((1, 3)));
        assert_eq!(e.record().netns, Some(own.clone()));
        drop(e);
        let e = entry_of(&here, tapyard::PortId(3), tap(), Some(&own), Some((1, 2)));
        assert_eq!(e.record().netns, None);
    }

    #[test]
    fn no_one_to_take_over_from_is_a_clear_error() {
        let dir =
            std::env::temp_dir().join(format!("tapyard-takeover-none-{}", std::process::id()));
        let src = format!(
            "[node]\nname = \"t\"\ncluster_cidr = \"10.244.0.0/16\"\nstate_dir = \"{}\"\n\n[[bridge]]\nname = \"cni0\"\n",
            dir.display()
        );
        let c = crate::config::check_str(&src);
        let cfg = c.config.unwrap_or_else(|| panic!("{:?}", c.diags));
        let e = take_over(cfg, "x.toml".into(), &AtomicBool::new(false)).unwrap_err();
        assert!(e.contains("nobody to take over from"), "{e}");
        assert!(e.contains("takeover.sock"), "{e}");
    }
}
