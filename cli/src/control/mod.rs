//! The control socket: a Unix socket (mode 0600) with a line-delimited JSON protocol, one
//! request and one reply line per connection.
//!
//! The protocol (every request and reply, with an example line of each, and its versioning)
//! is the `tapyard-control` crate's: its PROTOCOL.md, and its types, which this server
//! parses and answers with ([`Request`], [`Reply`] and each reply's data), as the clients do
//! (`tapyard`'s commands in `crate::commands` through [`client`], and the CNI plugin), so the sides
//! cannot drift. Here: the socket ([`claim_socket`], [`bind`], [`serve`]) and each request's
//! answer; the tables of `show` are built in [`show`].
//!
//! Each connection is served by its own thread, so a capture in progress does not hold up
//! other requests. The reply to `{"cmd":"show","what":"conntrack","json":true}` (a full
//! table is ~100 MB) is written row by row as the lock-free table is read, and `tapyard show`
//! prints it row by row as it parses it ([`client::request_data`]); the line is the same JSON
//! as any reply.
//!
//! A request with a field its command does not have is refused, naming the field.

pub mod client;
pub mod server;
pub mod show;
#[cfg(test)]
mod tests;

use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tapyard_control::{
    CniRequest, Command, Hello, PortDeleted, Reply, Request, RequestLine, Status, StatusInterface,
    StatusPort, PROTOCOL_VERSION,
};

use crate::capture::{self, KIND_END};
use crate::node::Node;
use crate::ports::Origin;
pub use client::resolve_socket;
pub use show::nat_counters;

/// The longest request line accepted.
pub const MAX_REQUEST: u64 = tapyard_control::MAX_REQUEST;

/// How long a client has to send its whole request line (a slow or trickling client gets an
/// error then, whatever it sends meanwhile); and how long one write of a reply may wait for
/// a client that does not read.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(10);

/// Connections served at once; more are answered `busy` at once and closed (each one takes
/// a thread).
pub const MAX_CONNECTIONS: usize = 64;

/// Reads one request line (up to `\n`, at most [`MAX_REQUEST`] bytes) within
/// [`REQUEST_DEADLINE`] as a whole.
fn read_request(s: &UnixStream) -> io::Result<Vec<u8>> {
    let until = std::time::Instant::now() + REQUEST_DEADLINE;
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let left = until.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("no whole request within {REQUEST_DEADLINE:?}"),
            ));
        }
        s.set_read_timeout(Some(left))?;
        let room = usize::try_from(MAX_REQUEST).unwrap_or(usize::MAX) - raw.len();
        let take = room.min(buf.len());
        let n = match (&*s).read(&mut buf[..take]) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            Err(e) => return Err(e),
        };
        raw.extend_from_slice(&buf[..n]);
        if let Some(i) = raw.iter().position(|&b| b == b'\n') {
            raw.truncate(i + 1);
            return Ok(raw);
        }
        if n == 0 || raw.len() as u64 >= MAX_REQUEST {
            return Ok(raw);
        }
    }
}

/// Prepares `path` for a new server: refuses when a live server answers there, removes a
/// stale socket, creates the parent directory.
pub fn claim_socket(path: &Path) -> Result<(), String> {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::FileTypeExt;
        if !meta.file_type().is_socket() {
            return Err(format!(
                "control socket {}: a file that is not a socket is in the way",
                path.display()
            ));
        }
        match UnixStream::connect(path) {
            Ok(_) => {
                return Err(format!(
                    "another tapyard is already running with control socket {} (stop it, or give this one --socket PATH)",
                    path.display()
                ))
            }
            Err(_) => {
                log::info!("removing stale control socket {}", path.display());
                std::fs::remove_file(path)
                    .map_err(|e| format!("cannot remove stale socket {}: {e}", path.display()))?;
            }
        }
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    Ok(())
}

/// Binds the socket with mode 0600 (no window where it is open to others).
#[allow(unsafe_code)] // umask(2), with a SAFETY line
pub fn bind(path: &Path) -> Result<UnixListener, String> {
    // SAFETY: umask only changes this process's file-creation mask; restored right after.
    let old = unsafe { libc::umask(0o177) };
    let l = UnixListener::bind(path);
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    let l = l.map_err(|e| format!("cannot listen on {}: {e}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| format!("cannot set the mode of {}: {e}", path.display()))?;
    l.set_nonblocking(true)
        .map_err(|e| format!("control socket: {e}"))?;
    Ok(l)
}

/// Serves the socket until `stop` is set.
pub fn serve(listener: UnixListener, node: Arc<Node>, stop: Arc<AtomicBool>) {
    // Connections being served (each on its own thread).
    let live = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((mut s, _)) => {
                if live.load(Ordering::Relaxed) >= MAX_CONNECTIONS {
                    log::warn!(
                        "control socket: {MAX_CONNECTIONS} connections are being served already: one refused"
                    );
                    let _ = s.set_nonblocking(false);
                    let _ = s.set_write_timeout(Some(Duration::from_millis(100)));
                    let e = format!("busy: {MAX_CONNECTIONS} requests are being served; retry");
                    let _ = reply(&mut s, &Reply::<()>::error(e));
                    continue;
                }
                live.fetch_add(1, Ordering::Relaxed);
                let node = node.clone();
                let stop = stop.clone();
                let mine = live.clone();
                let spawned = std::thread::Builder::new()
                    .name("tapyard-conn".into())
                    .spawn(move || {
                        if let Err(e) = handle(s, &node, &stop) {
                            log::debug!("control connection: {e}");
                        }
                        mine.fetch_sub(1, Ordering::Relaxed);
                    });
                if spawned.is_err() {
                    live.fetch_sub(1, Ordering::Relaxed);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                // Wake as soon as a client connects (a CNI ADD waits on this), or after
                // 100 ms to look at `stop`.
                wait_readable(&listener, 100);
            }
            Err(e) => {
                log::warn!("control socket accept: {e}");
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
}

/// Writes a reply line.
fn reply<T: Serialize>(s: &mut impl Write, r: &Reply<T>) -> io::Result<()> {
    s.write_all(r.line().as_bytes())
}

fn handle(mut s: UnixStream, node: &Node, stop: &AtomicBool) -> io::Result<()> {
    s.set_nonblocking(false)?;
    s.set_write_timeout(Some(REQUEST_DEADLINE))?;
    let raw = read_request(&s)?;
    let req = match RequestLine::parse(&String::from_utf8_lossy(&raw)) {
        // Every version up to ours is answered alike (there is only one yet).
        Ok(RequestLine { request, .. }) => request,
        Err(e) => return reply(&mut s, &Reply::<()>::error(e)),
    };
    let cmd = match req {
        Request::Command(c) => c,
        Request::Cni(r) => return cni(&mut s, node, r),
    };
    match cmd {
        // The one table that grows to hundreds of thousands of rows: written as it is read.
        Command::Show { what, json: true } if what == "conntrack" => {
            let Some(nf) = node.dp.control().netfilter() else {
                return reply(&mut s, &Reply::<()>::error(show::no_nat(&what)));
            };
            show::write_conntrack_reply(nf, node.now(), show::has_v6(node), &mut s)
        }
        Command::Show { what, json } => {
            let r = match show::show(node, &what, json) {
                Ok(show::Shown::Text(text)) => Reply::text(text),
                Ok(show::Shown::Data(data)) => Reply::data(data),
                Err(e) => Reply::error(e),
            };
            reply(&mut s, &r)
        }
        Command::Reload {} => reply(&mut s, &reload(node)),
        Command::Status {} => reply(&mut s, &Reply::data(status(node))),
        Command::Hello {} => reply(
            &mut s,
            &Reply::data(Hello {
                protocol: PROTOCOL_VERSION,
                software: format!("tapyard {}", env!("CARGO_PKG_VERSION")),
            }),
        ),
        Command::Capture { port, count } => stream_capture(s, node, &port, count, stop),
        Command::PortAdd {
            bridge,
            name,
            mac,
            ips,
        } => {
            let r = node
                .port_add_local(&bridge, &name, mac.as_deref(), ips, Origin::Command)
                .map(|e| e.info());
            reply(&mut s, &Reply::from_result(r.map_err(|e| e.to_string())))
        }
        Command::PortDel { name } => {
            let r = node
                .port_del_name(&name)
                .map(|()| PortDeleted { removed: true });
            reply(&mut s, &Reply::from_result(r.map_err(|e| e.to_string())))
        }
    }
}

/// Answers a request of the CNI plugin (a refusal is logged).
fn cni(s: &mut UnixStream, node: &Node, req: CniRequest) -> io::Result<()> {
    let refused =
        |e: &dyn std::fmt::Display| log::warn!("CNI request refused: {:?}", e.to_string());
    match req {
        CniRequest::PortAdd {
            bridge,
            owner,
            netns,
            ifname,
            mtu,
            ips,
        } => {
            let r = node.port_add_cni(&bridge, &owner, &netns, &ifname, mtu, &ips);
            if let Err(e) = &r {
                refused(e);
            }
            reply(s, &Reply::from_result(r.map_err(|e| e.to_string())))
        }
        CniRequest::PortDel { owner } => {
            let r = node
                .port_del_owner(&owner)
                .map(|removed| PortDeleted { removed });
            if let Err(e) = &r {
                refused(e);
            }
            reply(s, &Reply::from_result(r.map_err(|e| e.to_string())))
        }
        CniRequest::PortShow { owner } => {
            let r = node
                .ports
                .by_owner(&owner)
                .map(|e| e.info())
                .ok_or_else(|| "no such port".to_string());
            if let Err(e) = &r {
                refused(e);
            }
            reply(s, &Reply::from_result(r))
        }
    }
}

/// `reload`: `changes`, and `errors` when some or all were refused.
fn reload(node: &Node) -> Reply<()> {
    match node.reload() {
        Ok(r) if r.refused.is_empty() => {
            log_changes(&r.changes);
            Reply {
                ok: true,
                changes: Some(r.changes),
                ..Reply::default()
            }
        }
        Ok(r) => {
            log_reloaded(&r);
            Reply {
                error: Some(partly_refused(&r)),
                changes: Some(r.changes),
                errors: Some(r.refused),
                ..Reply::default()
            }
        }
        Err(errors) => {
            for e in &errors {
                log::error!("reload refused: {e}");
            }
            Reply {
                error: Some("reload refused; the running configuration is unchanged".into()),
                errors: Some(errors),
                ..Reply::default()
            }
        }
    }
}

/// `status`: the node's name, config file, ports and interfaces.
fn status(node: &Node) -> Status {
    let cur = node.current.lock().unwrap_or_else(|e| e.into_inner());
    let interfaces = node
        .ifaces
        .iter()
        .map(|(n, m, a)| {
            let v6 = cur
                .connected()
                .into_iter()
                .find(|c| c.name == n)
                .and_then(|c| c.address6);
            let ll = node
                .dp
                .control()
                .iface_by_name(n)
                .and_then(|i| node.dp.control().router()?.link_local(i));
            StatusInterface {
                address: a.map(|a| a.to_string()),
                address6: v6.map(|a| a.to_string()),
                link_local6: ll.map(|a| a.to_string()),
                mac: m.to_string(),
                name: n.clone(),
            }
        })
        .collect();
    let n = &cur.node;
    let nat = tapyard_control::StatusNat {
        masquerade_all: n.masquerade_all,
        node_port_addresses: n
            .node_port_addresses
            .iter()
            .map(|c| c.to_string())
            .collect(),
        random_fully: n.random_fully,
    };
    Status {
        config: node.config_path.display().to_string(),
        interfaces,
        nat,
        node: cur.node.name.clone(),
        ports: node
            .ports
            .list()
            .into_iter()
            .map(|e| StatusPort {
                name: e.name,
                tap: e.tap,
            })
            .collect(),
        workers: node.workers as u64,
    }
}

/// The `reload` reply's error when the library refused some changes.
pub fn partly_refused(r: &crate::node::Reloaded) -> String {
    format!(
        "reload partly refused: {} change(s) not applied (the others are; the next reload retries these)",
        r.refused.len()
    )
}

/// Logs what a reload did: the changes made, and each refused one as an error.
pub fn log_reloaded(r: &crate::node::Reloaded) {
    if !r.changes.is_empty() || r.refused.is_empty() {
        log_changes(&r.changes);
    }
    for e in &r.refused {
        log::error!("reload: {e}");
    }
}

/// Logs the changes a reload made.
pub fn log_changes(changes: &[String]) {
    if changes.is_empty() {
        log::info!("reload: nothing changed");
    }
    for c in changes {
        log::info!("reload: {c}");
    }
}

#[allow(unsafe_code)] // poll(2) on one descriptor, with a SAFETY line
fn wait_readable(fd: &impl AsRawFd, timeout_ms: i32) {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    unsafe { libc::poll(&mut p, 1, timeout_ms) };
}

#[allow(unsafe_code)] // poll(2) on one descriptor, with a SAFETY line
fn client_gone(s: &UnixStream) -> bool {
    let mut p = libc::pollfd {
        fd: s.as_raw_fd(),
        events: libc::POLLIN | libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one valid pollfd, zero timeout.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    // The client sends nothing after its request: readable means closed.
    n > 0 && p.revents != 0
}

fn stream_capture(
    mut s: UnixStream,
    node: &Node,
    port: &str,
    count: u64,
    stop: &AtomicBool,
) -> io::Result<()> {
    let Some(tap) = node.capture_tap(port) else {
        let names: Vec<String> = node.ports.list().into_iter().map(|e| e.name).collect();
        let e = format!(
            "no port named {port:?} (ports: {}; a bridge's gateway has no TAP to capture)",
            names.join(", ")
        );
        return reply(&mut s, &Reply::<()>::error(e));
    };
    let Some(rx) = tap.start() else {
        let e = format!("a capture is already running on {port:?}");
        return reply(&mut s, &Reply::<()>::error(e));
    };
    log::info!("capture on {port} started");
    let result = (|| {
        let header = Reply::<()> {
            ok: true,
            port: Some(port.to_string()),
            linktype: Some("ethernet".into()),
            ..Reply::default()
        };
        reply(&mut s, &header)?;
        let mut n = 0u64;
        let mut buf = Vec::with_capacity(64 * 1024);
        while !stop.load(Ordering::Relaxed) && (count == 0 || n < count) {
            match rx.recv_timeout(Duration::from_millis(200)) {
                Ok(c) => {
                    buf.clear();
                    c.encode(&mut buf);
                    n += 1;
                    // Batch what is already queued.
                    while count == 0 || n < count {
                        match rx.try_recv() {
                            Ok(c) => {
                                c.encode(&mut buf);
                                n += 1;
                            }
                            Err(_) => break,
                        }
                    }
                    s.write_all(&buf)?;
                }
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                    if client_gone(&s) {
                        return Ok(n);
                    }
                }
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => break,
            }
        }
        Ok::<u64, io::Error>(n)
    })();
    let dropped = tap.stop();
    let mut end = Vec::new();
    capture::encode(&mut end, KIND_END, dropped, &[]);
    let _ = s.write_all(&end);
    match &result {
        Ok(n) => log::info!("capture on {port} ended: {n} frames, {dropped} dropped"),
        Err(e) => log::info!("capture on {port} ended: {e}"),
    }
    result.map(|_| ())
}
