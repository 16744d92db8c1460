//! The protocol's messages and how they cross the socket (JSON with descriptors).

use std::io::{self, IoSlice, IoSliceMut, Write};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use serde::{Deserialize, Serialize};

use crate::state::{NetnsRecord, PortRecord};

use super::{IfaceRecord, FDS_PER_MSG, MAX_MSG};

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
