//! The control socket: a Unix socket (mode 0600) with a line-delimited JSON protocol.
//!
//! A client sends one request line and reads one reply line:
//!
//! ```text
//! {"cmd":"show","what":"fdb","json":false}   -> {"ok":true,"text":"02:.. dev pod-a master cni0 age 1.2s\n"}
//! {"cmd":"show","what":"routes","json":true} -> {"ok":true,"data":[{"dst":"10.244.2.0/24",...}]}
//! {"cmd":"reload"}                           -> {"ok":true,"changes":["route added: ..."]}
//!                                               (some refused by the library: {"ok":false,
//!                                               "changes":[applied...],"errors":[refused...]})
//! {"cmd":"capture","port":"pod-a","count":10} -> {"ok":true,...} then binary records (capture.rs)
//! {"cmd":"status"}                           -> {"ok":true,"data":{"node":"node-a",...}}
//! {"cmd":"show","what":"ports","json":true}  -> {"ok":true,"data":[{"name":"pod-a","kind":"pod",...}]}
//! {"cmd":"port_add","bridge":"cni0","name":"pod-c","mac":"02:00:00:00:00:0c"}
//!                                            -> {"ok":true,"data":{"name":"pod-c","ifindex":9,...}}
//! {"cmd":"port_del","name":"pod-c"}          -> {"ok":true,"data":{"removed":true}}
//! anything else                              -> {"ok":false,"error":"..."}
//! ```
//!
//! The CNI plugin's requests are those of `tapyard_cni::control` (a line with an `owner`),
//! parsed and answered with that crate's own types ([`CniRequest`], [`Reply`],
//! `PortInfo`, [`PortDeleted`]), so the two sides cannot drift:
//!
//! ```text
//! {"cmd":"port_add","bridge":"cni0","owner":"<id>/eth0","netns":"/var/run/netns/x","ifname":"eth0","mtu":1500}
//!    -> {"ok":true,"data":{"name":"eth0","ifindex":7,"mac":"02:..","bridge":"cni0","netns":"/var/run/netns/x"}}
//! {"cmd":"port_del","owner":"<id>/eth0"}   -> {"ok":true,"data":{"removed":true}}
//! {"cmd":"port_show","owner":"<id>/eth0"}  -> {"ok":true,"data":{...}} or {"ok":false,"error":"no such port"}
//! ```
//!
//! Each connection is served by its own thread, so a capture in progress does not hold up
//! other requests. The reply to `{"cmd":"show","what":"conntrack","json":true}` (a full table
//! is ~100 MB) is written row by row as the lock-free table is read, and `tapyard show` prints
//! it row by row as it parses it ([`request_data`]); the line is the same JSON as any reply.
//!
//! A request with a field its command does not have is refused, naming the field.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tapyard::stats::CounterSet;
pub use tapyard_cni::control::{PortDeleted, Reply, Request as CniRequest};

use crate::capture::{self, KIND_END};
use crate::node::Node;
use crate::ports::Origin;

/// The longest request line accepted.
pub const MAX_REQUEST: u64 = 64 * 1024;

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

/// A request on the control socket.
#[derive(Debug, Deserialize, PartialEq)]
#[serde(tag = "cmd", rename_all = "lowercase", deny_unknown_fields)]
pub enum Request {
    /// A table or the counters.
    Show {
        /// fdb, neigh, routes, conntrack, services or stats.
        what: String,
        /// Structured data instead of text.
        #[serde(default)]
        json: bool,
    },
    /// Re-read the configuration file. (Struct variants, even without fields: serde refuses
    /// unknown fields only for those, a unit variant of a tagged enum ignores them.)
    Reload {},
    /// Stream a port's frames.
    Capture {
        /// The port (TAP) name.
        port: String,
        /// Stop after this many frames (0: until the client goes away).
        #[serde(default)]
        count: u64,
    },
    /// The node's name, config file and interfaces.
    Status {},
    /// `tapyard port add`: a TAP on `bridge` that stays in tapyard's namespace.
    #[serde(rename = "port_add")]
    PortAdd {
        /// The bridge.
        bridge: String,
        /// The TAP's (and the datapath port's) name.
        name: String,
        /// The TAP's MAC (default: the kernel's random one).
        #[serde(default)]
        mac: Option<String>,
    },
    /// `tapyard port del`: remove a port added by `port add` or the CNI plugin.
    #[serde(rename = "port_del")]
    PortDel {
        /// The port's name (as `show ports` lists it).
        name: String,
    },
    /// A request of the CNI plugin (a line with an `owner`).
    #[serde(skip)]
    Cni(CniRequest),
}

/// Parses a request line; the error is the reply's message. A line with an `owner` is the
/// CNI plugin's, parsed with its own types. A request with a field its command does not
/// have is refused, the field named (whatever the command: a typo must not be ignored).
pub fn parse_request(line: &str) -> Result<Request, String> {
    let bad = |e: serde_json::Error| format!("bad request: {e}");
    let v: Value = serde_json::from_str(line.trim()).map_err(bad)?;
    let cni_cmd = matches!(
        v.get("cmd").and_then(Value::as_str),
        Some("port_add" | "port_del" | "port_show")
    );
    if cni_cmd && v.get("owner").is_some() {
        let r: CniRequest = serde_json::from_value(v.clone()).map_err(bad)?;
        refuse_unknown_fields(&v, &r)?;
        return Ok(Request::Cni(r));
    }
    serde_json::from_value(v).map_err(bad)
}

/// Refuses a CNI request line with a field that its command does not have. The plugin's types
/// live in its crate and accept unknown fields; every field of theirs is always written, so
/// the parsed request written back has exactly the fields the command knows.
fn refuse_unknown_fields(line: &Value, parsed: &CniRequest) -> Result<(), String> {
    let (Value::Object(given), Ok(Value::Object(known))) = (line, serde_json::to_value(parsed))
    else {
        return Ok(());
    };
    match given.keys().find(|k| !known.contains_key(k.as_str())) {
        None => Ok(()),
        Some(k) => {
            let expected: Vec<String> = known
                .keys()
                .filter(|f| f.as_str() != "cmd")
                .map(|f| format!("`{f}`"))
                .collect();
            Err(format!(
                "bad request: unknown field `{k}`, expected one of {}",
                expected.join(", ")
            ))
        }
    }
}

/// A reply line in the CNI protocol's shape.
fn cni_reply<T: Serialize>(r: Result<T, String>) -> Value {
    serde_json::to_value(Reply::from_result(r))
        .unwrap_or_else(|e| json!({"ok": false, "error": e.to_string()}))
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
                    let _ = reply(&mut s, &json!({"ok": false, "error": e}));
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

fn reply(s: &mut UnixStream, v: &Value) -> io::Result<()> {
    let mut line = v.to_string();
    line.push('\n');
    s.write_all(line.as_bytes())
}

fn handle(mut s: UnixStream, node: &Node, stop: &AtomicBool) -> io::Result<()> {
    s.set_nonblocking(false)?;
    s.set_write_timeout(Some(REQUEST_DEADLINE))?;
    let raw = read_request(&s)?;
    let req = match parse_request(&String::from_utf8_lossy(&raw)) {
        Ok(r) => r,
        Err(e) => return reply(&mut s, &json!({"ok": false, "error": e})),
    };
    match req {
        // The one table that grows to hundreds of thousands of rows: written as it is read.
        Request::Show { what, json: true } if what == "conntrack" => {
            let Some(nf) = node.dp.netfilter() else {
                let e = no_nat(&what);
                return reply(&mut s, &json!({"ok": false, "error": e}));
            };
            write_conntrack_reply(nf, node.now(), has_v6(node), &mut s)
        }
        Request::Show { what, json } => {
            let v = match show(node, &what, json) {
                Ok(Value::String(text)) => json!({"ok": true, "text": text}),
                Ok(data) => json!({"ok": true, "data": data}),
                Err(e) => json!({"ok": false, "error": e}),
            };
            reply(&mut s, &v)
        }
        Request::Reload {} => {
            let v = match node.reload() {
                Ok(r) if r.refused.is_empty() => {
                    log_changes(&r.changes);
                    json!({"ok": true, "changes": r.changes})
                }
                Ok(r) => {
                    log_reloaded(&r);
                    json!({"ok": false, "error": partly_refused(&r), "changes": r.changes, "errors": r.refused})
                }
                Err(errors) => {
                    for e in &errors {
                        log::error!("reload refused: {e}");
                    }
                    json!({"ok": false, "error": "reload refused; the running configuration is unchanged", "errors": errors})
                }
            };
            reply(&mut s, &v)
        }
        Request::Status {} => {
            let cur = node.current.lock().unwrap_or_else(|e| e.into_inner());
            let v = json!({"ok": true, "data": {
                "node": cur.node.name,
                "config": node.config_path.display().to_string(),
                "workers": node.workers,
                "ports": node.ports.list().iter().map(|e| json!({"name": e.name, "tap": e.tap})).collect::<Vec<_>>(),
                "interfaces": node.ifaces.iter().map(|(n, m, a)| {
                    let v6 = cur.connected().into_iter().find(|c| c.name == n).and_then(|c| c.address6);
                    let ll = node.dp.iface_by_name(n).and_then(|i| node.dp.router()?.link_local6(i));
                    json!({"name": n, "mac": m.to_string(), "address": a.map(|a| a.to_string()), "address6": v6.map(|a| a.to_string()), "link_local6": ll.map(|a| a.to_string())})
                }).collect::<Vec<_>>(),
            }});
            drop(cur);
            reply(&mut s, &v)
        }
        Request::Capture { port, count } => stream_capture(s, node, &port, count, stop),
        Request::PortAdd { bridge, name, mac } => {
            let r = node
                .port_add_local(&bridge, &name, mac.as_deref(), Origin::Command)
                .map(|e| e.info());
            reply(&mut s, &cni_reply(r))
        }
        Request::PortDel { name } => {
            let r = node
                .port_del_name(&name)
                .map(|()| PortDeleted { removed: true });
            reply(&mut s, &cni_reply(r))
        }
        Request::Cni(req) => {
            let v = match req {
                CniRequest::PortAdd {
                    bridge,
                    owner,
                    netns,
                    ifname,
                    mtu,
                } => cni_reply(node.port_add_cni(&bridge, &owner, &netns, &ifname, mtu)),
                CniRequest::PortDel { owner } => cni_reply(
                    node.port_del_owner(&owner)
                        .map(|removed| PortDeleted { removed }),
                ),
                CniRequest::PortShow { owner } => cni_reply(
                    node.ports
                        .by_owner(&owner)
                        .map(|e| e.info())
                        .ok_or_else(|| "no such port".to_string()),
                ),
            };
            if v.get("ok") != Some(&Value::Bool(true)) {
                log::warn!("CNI request refused: {}", v["error"]);
            }
            reply(&mut s, &v)
        }
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
        return reply(&mut s, &json!({"ok": false, "error": e}));
    };
    let Some(rx) = tap.start() else {
        return reply(
            &mut s,
            &json!({"ok": false, "error": format!("a capture is already running on {port:?}")}),
        );
    };
    log::info!("capture on {port} started");
    let result = (|| {
        reply(
            &mut s,
            &json!({"ok": true, "port": port, "linktype": "ethernet"}),
        )?;
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

/// The answer to `show WHAT`: text (a JSON string) or structured data.
pub fn show(node: &Node, what: &str, as_json: bool) -> Result<Value, String> {
    let dp = &node.dp;
    let now = node.now();
    let mut text = String::new();
    match what {
        "fdb" => {
            if !as_json {
                let _ = dp.fmt_fdb(now, &mut text);
                let _ = dp.fmt_vxlan_fdb(&mut text);
                return Ok(Value::String(text));
            }
            let mut rows = Vec::new();
            // Bridge ids are indices that the builder checked to fit 16 bits.
            let ids = (0..=u16::MAX).map(tapyard::BridgeId);
            for (id, b) in ids.zip(dp.bridges().iter()) {
                for e in dp.fdb_dump(id, now) {
                    rows.push(json!({
                        "mac": e.mac.to_string(),
                        "dev": dp.port_name(e.port).unwrap_or_else(|| "?".into()),
                        "master": b.name(),
                        "static": e.is_static(),
                        "age_secs": e.age.map(|a| a.as_secs_f64()),
                    }));
                }
            }
            // What the VXLAN peers imply, as `bridge fdb` shows Flannel's entries.
            for t in dp.tunnels() {
                for p in t.peers().iter() {
                    rows.push(json!({
                        "mac": p.peer.vtep_mac.to_string(),
                        "dev": t.config().name,
                        "dst": p.peer.node_ip.to_string(),
                        "static": true,
                        "age_secs": null,
                    }));
                }
            }
            Ok(Value::Array(rows))
        }
        "vxlan" => Ok(vxlan_show(dp, as_json)),
        "neigh" => {
            if !as_json {
                let _ = dp.fmt_neigh(now, &mut text);
                return Ok(Value::String(text));
            }
            let rows = dp.router().map_or_else(Vec::new, |r| {
                r.neigh()
                    .dump(now)
                    .into_iter()
                    .map(|e| {
                        json!({
                            "dst": e.ip.to_string(),
                            "dev": dp.iface_name(e.iface).unwrap_or("?"),
                            "lladdr": e.mac.map(|m| m.to_string()),
                            "state": e.state.name(),
                            "confirmed_ago_secs": e.confirmed_ago.map(|d| d.as_secs_f64()),
                            "updated_ago_secs": e.updated_ago.as_secs_f64(),
                            "queued": e.queued,
                        })
                    })
                    .collect::<Vec<_>>()
            });
            // The NDP table after the ARP table (as `ip neigh` lists both families).
            let rows6 = dp.router().map_or_else(Vec::new, |r| {
                r.neigh6()
                    .dump(now)
                    .into_iter()
                    .map(|e| {
                        json!({
                            "dst": e.ip.to_string(),
                            "dev": dp.iface_name(e.iface).unwrap_or("?"),
                            "lladdr": e.mac.map(|m| m.to_string()),
                            "state": e.state.name(),
                            "confirmed_ago_secs": e.confirmed_ago.map(|d| d.as_secs_f64()),
                            "updated_ago_secs": e.updated_ago.as_secs_f64(),
                            "queued": e.queued,
                        })
                    })
                    .collect::<Vec<_>>()
            });
            Ok(Value::Array(rows.into_iter().chain(rows6).collect()))
        }
        "routes" => {
            if !as_json {
                let _ = dp.fmt_routes(&mut text);
                return Ok(Value::String(text));
            }
            // IPv6 routes after IPv4's (as `ip route; ip -6 route`).
            let mut rows = route_rows(dp, dp.routes::<std::net::Ipv4Addr>());
            rows.extend(route_rows(dp, dp.routes::<std::net::Ipv6Addr>()));
            Ok(Value::Array(rows))
        }
        "stats" => {
            let s = dp.stats();
            let counters: Option<Vec<(&str, u64)>> = dp.router().map(|r| {
                r.counters
                    .snapshot()
                    .counters()
                    .map(|(k, _, v)| (k, v))
                    .collect()
            });
            let nat = dp.netfilter().map(nat_counters);
            if !as_json {
                text = s.to_string();
                if let Some(c) = counters {
                    text.push_str("router:");
                    for (k, v) in c {
                        text.push_str(&format!(" {k} {v}"));
                    }
                    text.push('\n');
                }
                if let Some(n) = &nat {
                    text.push_str("nat:");
                    for (k, _, v) in n {
                        text.push_str(&format!(" {k} {v}"));
                    }
                    text.push('\n');
                }
                for b in dp.bridges() {
                    let f = b.fdb().counters();
                    text.push_str(&format!("fdb {}: entries {}", b.name(), f.entries));
                    for (k, _, v) in f.counters() {
                        text.push_str(&format!("  {k} {v}"));
                    }
                    text.push('\n');
                }
                return Ok(Value::String(text));
            }
            let drops: serde_json::Map<String, Value> = s
                .drops
                .iter()
                .map(|(r, n)| (r.name().to_string(), json!(n)))
                .collect();
            let fdb: Vec<Value> = dp
                .bridges()
                .iter()
                .map(|b| {
                    let f = b.fdb().counters();
                    let mut m = serde_json::Map::new();
                    m.insert("bridge".into(), json!(b.name()));
                    m.insert("entries".into(), json!(f.entries));
                    m.extend(f.counters().map(|(k, _, v)| (k.to_string(), json!(v))));
                    Value::Object(m)
                })
                .collect();
            let neigh = dp.router().map(|r| {
                let c = r.neigh().counters();
                let mut m = serde_json::Map::new();
                m.insert("entries".into(), json!(c.entries));
                m.insert("queued_now".into(), json!(c.queued_now));
                m.extend(c.counters().map(|(k, _, v)| (k.to_string(), json!(v))));
                Value::Object(m)
            });
            let mut out = serde_json::Map::new();
            let ports: Vec<Value> = s
                .ports
                .iter()
                .map(|p| {
                    let mut m = serde_json::Map::new();
                    m.insert("name".into(), json!(p.name));
                    m.extend(p.counters().map(|(k, _, v)| (k.to_string(), json!(v))));
                    Value::Object(m)
                })
                .collect();
            out.insert("ports".into(), json!(ports));
            // The datapath's totals at the top level, each under its declared name.
            out.extend(s.counters().map(|(k, _, v)| (k.to_string(), json!(v))));
            out.insert("drops".into(), json!(drops));
            let named = |c: &[(&str, u64)]| {
                c.iter()
                    .map(|(k, v)| ((*k).to_string(), json!(v)))
                    .collect::<serde_json::Map<_, _>>()
            };
            out.insert("router".into(), json!(counters.as_deref().map(named)));
            out.insert("fdb".into(), json!(fdb));
            out.insert("neigh".into(), json!(neigh));
            let nat = nat.map(|c| {
                c.into_iter()
                    .map(|(k, _, v)| (k, json!(v)))
                    .collect::<serde_json::Map<_, _>>()
            });
            out.insert("nat".into(), json!(nat));
            Ok(Value::Object(out))
        }
        "conntrack" | "services" => nat_show(node, what, as_json, now),
        "ports" if as_json => Ok(Value::Array(node.ports_json())),
        "ports" => Ok(Value::String(node.ports_text())),
        other => Err(format!(
            "cannot show {other:?}: expected fdb, neigh, routes, conntrack, services, stats, ports or vxlan"
        )),
    }
}

/// The NAT's counters as (name, help, value), for `show stats` and the metrics: the
/// connection table's (`connections` is a gauge; its events are prefixed `ct_`) and the
/// engine's, from its declaration.
pub fn nat_counters(nf: &tapyard::nat::Netfilter) -> Vec<(String, &'static str, u64)> {
    let t = nf.conntrack().counters();
    let mut out = vec![(
        "connections".to_string(),
        "Connections in the conntrack table.",
        t.entries as u64,
    )];
    out.extend(
        nf.counters()
            .counters()
            .map(|(k, h, v)| (k.to_string(), h, v)),
    );
    // The table's events, prefixed `ct_` (its `new` is the engine's again; `found` is a
    // per-packet figure, not an event).
    out.extend(
        t.counters()
            .filter(|(k, _, _)| !matches!(*k, "new" | "found"))
            .map(|(k, h, v)| (format!("ct_{k}"), h, v)),
    );
    out
}

/// `show vxlan`: each VXLAN interface and its peers with their packet counters.
fn vxlan_show(dp: &tapyard::Datapath, as_json: bool) -> Value {
    let mut rows = Vec::new();
    let mut text = String::new();
    for t in dp.tunnels() {
        let c = t.config();
        let uplink = dp.iface_name(t.uplink()).unwrap_or("?");
        let (lo, hi) = c.src_ports;
        text += &format!(
            "{}: vxlan id {} dstport {} local {} dev {uplink} srcport {lo} {hi} address {}/{} mac {} mtu {}\n",
            c.name, c.vni, c.port, t.local(), c.addr, c.prefix_len, c.mac, t.mtu()
        );
        let mut peers = Vec::new();
        for p in t.peers().iter() {
            let s = p.stats();
            let q = p.peer;
            text += &format!(
                "    peer {} vtep {} pod_cidr {}/{} rx {} packets {} bytes tx {} packets {} bytes\n",
                q.node_ip, q.vtep_mac, q.pod_cidr, q.pod_prefix_len, s.rx_packets, s.rx_bytes, s.tx_packets, s.tx_bytes
            );
            peers.push(json!({
                "node_ip": q.node_ip.to_string(),
                "vtep_mac": q.vtep_mac.to_string(),
                "pod_cidr": format!("{}/{}", q.pod_cidr, q.pod_prefix_len),
                "rx_packets": s.rx_packets,
                "rx_bytes": s.rx_bytes,
                "tx_packets": s.tx_packets,
                "tx_bytes": s.tx_bytes,
            }));
        }
        rows.push(json!({
            "name": c.name,
            "vni": c.vni,
            "port": c.port,
            "uplink": uplink,
            "local": t.local().to_string(),
            "address": format!("{}/{}", c.addr, c.prefix_len),
            "mac": c.mac.to_string(),
            "mtu": t.mtu(),
            "src_ports": [lo, hi],
            "peers": peers,
        }));
    }
    if as_json {
        Value::Array(rows)
    } else {
        Value::String(text)
    }
}

fn no_nat(what: &str) -> String {
    format!(
        "{what}: this node has no NAT (it needs a router interface: a bridge with an address or an uplink)"
    )
}

/// Service ids to names, for the conntrack rows.
fn service_names(nf: &tapyard::nat::Netfilter) -> std::collections::HashMap<u32, String> {
    nf.services()
        .list()
        .into_iter()
        .filter_map(|s| Some((nf.services().get(&s.name)?.id().get(), s.name)))
        .collect()
}

/// A tuple in a `show conntrack --json` row (addresses of either family, written as
/// strings as before).
#[derive(Serialize)]
struct TupleRow {
    dport: u16,
    dst: std::net::IpAddr,
    sport: u16,
    src: std::net::IpAddr,
}

/// A connection table's tuple, as a row's.
trait RowTuple {
    fn row(&self) -> TupleRow;
    fn zone(&self) -> u16;
}

impl RowTuple for tapyard::wire::tuple::Tuple {
    fn row(&self) -> TupleRow {
        TupleRow {
            dport: self.dport,
            dst: self.dst.into(),
            sport: self.sport,
            src: self.src.into(),
        }
    }
    fn zone(&self) -> u16 {
        self.zone
    }
}

impl RowTuple for tapyard::wire::tuple::Tuple6 {
    fn row(&self) -> TupleRow {
        TupleRow {
            dport: self.dport,
            dst: self.dst.into(),
            sport: self.sport,
            src: self.src.into(),
        }
    }
    fn zone(&self) -> u16 {
        self.zone
    }
}

/// One row of `show conntrack --json`, serialized straight from the entry (no intermediate
/// `Value`). The fields are in alphabetical order, as the rows were when they were built as
/// `serde_json::Value` maps, so the output is byte for byte what it was.
#[derive(Serialize)]
struct CtRow<'a> {
    assured: bool,
    dnat: bool,
    mark: u32,
    orig: TupleRow,
    orig_bytes: u64,
    orig_packets: u64,
    proto: u8,
    protocol: &'static str,
    reply: TupleRow,
    reply_bytes: u64,
    reply_packets: u64,
    service: Option<&'a str>,
    service_id: u32,
    snat: bool,
    state: Option<&'static str>,
    timeout_secs: u64,
    unreplied: bool,
    zone: u16,
}

impl<'a> CtRow<'a> {
    fn of<K: RowTuple>(
        v: &tapyard::conntrack::CtView<K>,
        names: &'a std::collections::HashMap<u32, String>,
    ) -> Self {
        CtRow {
            assured: v.assured,
            dnat: v.status.dnat(),
            mark: v.mark,
            orig: v.orig.row(),
            orig_bytes: v.orig_bytes,
            orig_packets: v.orig_packets,
            proto: v.proto,
            protocol: v.protocol,
            reply: v.reply.row(),
            reply_bytes: v.reply_bytes,
            reply_packets: v.reply_packets,
            service: names.get(&v.service).map(String::as_str),
            service_id: v.service,
            snat: v.status.snat(),
            state: v.state.map(|s| s.name()),
            timeout_secs: v.timeout_secs,
            unreplied: v.unreplied,
            zone: v.orig.zone(),
        }
    }
}

/// Writes the reply to `show conntrack --json` to `out` as it goes: the reply line
/// `{"ok":true,"data":[ROW,...]}` with each row serialized from its entry into a buffered
/// writer, so that a full table (262,144 connections, ~100 MB of JSON) is never held as one
/// `Value` or string. The table's dump takes no lock (the workers go on forwarding and
/// tracking meanwhile); a slow client holds up only its own connection's thread.
pub fn write_conntrack_reply(
    nf: &tapyard::nat::Netfilter,
    now: tapyard::Instant,
    v6: bool,
    out: impl Write,
) -> io::Result<()> {
    let names = service_names(nf);
    let rows = nf.conntrack().dump(now);
    let mut w = io::BufWriter::with_capacity(256 * 1024, out);
    w.write_all(br#"{"ok":true,"data":["#)?;
    for (i, v) in rows.iter().enumerate() {
        if i > 0 {
            w.write_all(b",")?;
        }
        serde_json::to_writer(&mut w, &CtRow::of(v, &names))?;
    }
    let first = rows.is_empty();
    drop(rows);
    if v6 {
        for (i, v) in nf.conntrack6().dump(now).iter().enumerate() {
            if i > 0 || !first {
                w.write_all(b",")?;
            }
            serde_json::to_writer(&mut w, &CtRow::of(v, &names))?;
        }
    }
    w.write_all(b"]}\n")?;
    w.flush()
}

/// Whether the node has IPv6 (an interface with an IPv6 address): its IPv6 connection table
/// is listed (looking at it makes it, so a node without IPv6 does not).
fn has_v6(node: &Node) -> bool {
    let cur = node.current.lock().unwrap_or_else(|e| e.into_inner());
    cur.connected().iter().any(|c| c.address6.is_some())
}

/// `show conntrack` (the library's `conntrack -L` text, or the entries' fields) and `show
/// services` (an `ipvsadm -Ln`-like listing, or each Service's settings).
fn nat_show(
    node: &Node,
    what: &str,
    as_json: bool,
    now: tapyard::Instant,
) -> Result<Value, String> {
    let Some(nf) = node.dp.netfilter() else {
        return Err(no_nat(what));
    };
    if what == "conntrack" {
        let v6 = has_v6(node);
        if !as_json {
            // `conntrack -L`, then `conntrack -L -f ipv6`.
            let mut text = nf.conntrack().fmt_dump(now);
            if v6 {
                text.push_str(&nf.conntrack6().fmt_dump(now));
            }
            return Ok(Value::String(text));
        }
        // The control socket streams this one (`write_conntrack_reply`); the same rows as
        // one value, for callers that want it so.
        let names = service_names(nf);
        let rows = nf.conntrack().dump(now);
        let mut rows: Vec<Value> = rows
            .iter()
            .map(|v| serde_json::to_value(CtRow::of(v, &names)))
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string())?;
        if v6 {
            for v in nf.conntrack6().dump(now) {
                rows.push(serde_json::to_value(CtRow::of(&v, &names)).map_err(|e| e.to_string())?);
            }
        }
        return Ok(Value::Array(rows));
    }
    if !as_json {
        return Ok(Value::String(nf.services().fmt_services()));
    }
    use tapyard::nat::LbAlgo;
    // Every ClusterIP of each Service (one per family), as the file gives them.
    let cluster_ips: std::collections::HashMap<String, Vec<String>> = {
        let cur = node.current.lock().unwrap_or_else(|e| e.into_inner());
        cur.services
            .iter()
            .map(|s| {
                let ips = s.cluster_ips.iter().map(|ip| ip.to_string()).collect();
                (s.name.clone(), ips)
            })
            .collect()
    };
    let rows = nf
        .services()
        .list()
        .into_iter()
        .map(|s| {
            let id = nf.services().get(&s.name).map(|r| r.id().get());
            let ips = cluster_ips
                .get(&s.name)
                .cloned()
                .unwrap_or_else(|| vec![s.vip.to_string()]);
            json!({
                "name": s.name,
                "id": id,
                "cluster_ip": s.vip.to_string(),
                "cluster_ips": ips,
                "protocol": match s.proto { 6 => "tcp", 17 => "udp", _ => "?" },
                "port": s.port,
                "node_port": s.node_port,
                "endpoints": s.endpoints.iter().map(|e| json!({"address": e.addr.to_string(), "local": e.local})).collect::<Vec<_>>(),
                "session_affinity": if s.affinity.is_some() { "client-ip" } else { "none" },
                "affinity_timeout_secs": s.affinity.map(|d| d.as_secs()),
                "algorithm": match s.algo { LbAlgo::Random => "random", LbAlgo::Maglev => "maglev" },
                "external_traffic_policy": if s.external_local { "local" } else { "cluster" },
            })
        })
        .collect();
    Ok(Value::Array(rows))
}

/// Finds the control socket for a client command: `--socket`, else the one named by
/// `--config`, else the only socket in `/run/tapyard`.
pub fn resolve_socket(socket: Option<PathBuf>, config: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(s) = socket {
        return Ok(s);
    }
    if let Some(c) = config {
        let ch = crate::config::load(c);
        return match ch.config {
            Some(cfg) => Ok(cfg.node.socket_path()),
            None => Err(format!(
                "{} is not a valid config (run `tapyard check {}`)",
                c.display(),
                c.display()
            )),
        };
    }
    let dir = Path::new("/run/tapyard");
    let socks: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "sock"))
                .collect()
        })
        .unwrap_or_default();
    match socks.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err("no control socket found in /run/tapyard: is `tapyard run` running? (or give --socket PATH or --config FILE)".into()),
        many => Err(format!(
            "several control sockets in /run/tapyard ({}): pick one with --socket PATH",
            many.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
        )),
    }
}

/// Connects, sends one request and returns the stream positioned after the reply line, with
/// the reply.
pub fn request(path: &Path, req: &Value) -> Result<(Value, BufReader<UnixStream>), String> {
    let s = UnixStream::connect(path).map_err(|e| {
        format!(
            "cannot connect to {}: {e} (is `tapyard run` running?)",
            path.display()
        )
    })?;
    let mut w = s.try_clone().map_err(|e| e.to_string())?;
    let mut line = req.to_string();
    line.push('\n');
    w.write_all(line.as_bytes())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let mut r = BufReader::new(s);
    let mut resp = String::new();
    r.read_line(&mut resp)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let v: Value = serde_json::from_str(&resp)
        .map_err(|e| format!("{}: bad reply {resp:?}: {e}", path.display()))?;
    Ok((v, r))
}

/// As [`request`], for a reply whose `data` may be large (`show conntrack --json` of a full
/// table is ~100 MB): the reply line is parsed field by field and `data` is written to
/// `data_out` row by row as it is parsed, pretty-printed exactly as
/// `serde_json::to_string_pretty` prints it (then a newline), never held as one `Value`.
/// Returns the reply's other fields (`ok`, `text`, `error`, ...), with `"data": true` when
/// there was data.
pub fn request_data(path: &Path, req: &Value, data_out: &mut dyn Write) -> Result<Value, String> {
    let s = UnixStream::connect(path).map_err(|e| {
        format!(
            "cannot connect to {}: {e} (is `tapyard run` running?)",
            path.display()
        )
    })?;
    let mut line = req.to_string();
    line.push('\n');
    (&s).write_all(line.as_bytes())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    read_data_reply(&mut BufReader::with_capacity(1 << 20, &s), data_out)
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// Reads one reply line from `r` as [`request_data`] does.
fn read_data_reply(r: &mut impl BufRead, data_out: &mut dyn Write) -> Result<Value, String> {
    let mut raw = Vec::new();
    r.read_until(b'\n', &mut raw).map_err(|e| e.to_string())?;
    let bad = |e: serde_json::Error| format!("bad reply: {e}");
    let mut de = serde_json::Deserializer::from_slice(&raw);
    let rest =
        serde::Deserializer::deserialize_map(&mut de, ReplyFields { data_out }).map_err(bad)?;
    de.end().map_err(bad)?;
    Ok(rest)
}

/// Reads a reply object: `data` goes to the writer as it is parsed, the rest is kept.
struct ReplyFields<'w> {
    data_out: &'w mut dyn Write,
}

impl<'de> serde::de::Visitor<'de> for ReplyFields<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a reply object")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut rest = serde_json::Map::new();
        while let Some(k) = map.next_key::<String>()? {
            if k == "data" {
                map.next_value_seed(PrettyData {
                    out: &mut *self.data_out,
                })?;
                rest.insert(k, Value::Bool(true));
            } else {
                let v: Value = map.next_value()?;
                rest.insert(k, v);
            }
        }
        Ok(Value::Object(rest))
    }
}

/// A reply's `data`, pretty-printed to `out` as it is parsed (transcoded token by token,
/// never built as a `Value`), then a newline.
struct PrettyData<'w> {
    out: &'w mut dyn Write,
}

impl<'de> serde::de::DeserializeSeed<'de> for PrettyData<'_> {
    type Value = ();

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        use serde::de::Error;
        let mut ser = serde_json::Serializer::pretty(&mut *self.out);
        serde_transcode::transcode(d, &mut ser).map_err(D::Error::custom)?;
        self.out.write_all(b"\n").map_err(D::Error::custom)
    }
}

/// `show routes --json`'s rows of one family's table (as `ip -j route` shows them).
fn route_rows<A: tapyard::l3::RouteAddr>(
    dp: &tapyard::Datapath,
    t: Option<&tapyard::l3::RouteTable<A>>,
) -> Vec<Value> {
    use tapyard::l3::{NextHop, RouteProto};
    let Some(t) = t else { return Vec::new() };
    t.routes()
        .into_iter()
        .map(|r| {
            let (kind, gw, dev) = match r.next_hop {
                NextHop::Link(i) => ("unicast", None, dp.iface_name(i)),
                NextHop::Via(i, g) => ("unicast", Some(g.to_string()), dp.iface_name(i)),
                NextHop::Blackhole => ("blackhole", None, None),
                NextHop::Unreachable => ("unreachable", None, None),
                NextHop::Prohibit => ("prohibit", None, None),
            };
            json!({
                "dst": format!("{}/{}", r.prefix, r.len),
                "type": kind,
                "gateway": gw,
                "dev": dev,
                "metric": r.metric,
                "protocol": match r.proto { RouteProto::Kernel => "kernel", RouteProto::Static => "static" },
                "prefsrc": r.src.map(|s| s.to_string()),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse_and_bad_ones_are_errors() {
        assert_eq!(
            parse_request(r#"{"cmd":"show","what":"fdb"}"#).unwrap(),
            Request::Show {
                what: "fdb".into(),
                json: false
            }
        );
        assert_eq!(
            parse_request(r#"{"cmd":"reload"}"#).unwrap(),
            Request::Reload {}
        );
        assert_eq!(
            parse_request(r#"{"cmd":"status"}"#).unwrap(),
            Request::Status {}
        );
        assert_eq!(
            parse_request(r#"{"cmd":"capture","port":"pod-a","count":3}"#).unwrap(),
            Request::Capture {
                port: "pod-a".into(),
                count: 3
            }
        );
        assert_eq!(
            parse_request(
                r#"{"cmd":"port_add","bridge":"cni0","name":"pod-c","mac":"02:00:00:00:00:0c"}"#
            )
            .unwrap(),
            Request::PortAdd {
                bridge: "cni0".into(),
                name: "pod-c".into(),
                mac: Some("02:00:00:00:00:0c".into())
            }
        );
        assert_eq!(
            parse_request(r#"{"cmd":"port_del","name":"pod-c"}"#).unwrap(),
            Request::PortDel {
                name: "pod-c".into()
            }
        );
        // The plugin's lines, as its crate writes them.
        let add = CniRequest::PortAdd {
            bridge: "cni0".into(),
            owner: "c1/eth0".into(),
            netns: "/var/run/netns/x".into(),
            ifname: "eth0".into(),
            mtu: 1500,
        };
        let del = CniRequest::PortDel {
            owner: "c1/eth0".into(),
        };
        let show = CniRequest::PortShow {
            owner: "c1/eth0".into(),
        };
        for r in [add, del, show] {
            let line = serde_json::to_string(&r).unwrap();
            assert_eq!(parse_request(&line).unwrap(), Request::Cni(r));
        }
        for (bad, field) in [
            (
                r#"{"cmd":"port_add","bridge":"cni0","owner":"c/eth0"}"#,
                "netns",
            ),
            (r#"{"cmd":"port_add","bridge":"cni0"}"#, "name"),
            (
                r#"{"cmd":"port_add","bridge":"cni0","owner":"o","netns":"/n","ifname":"eth0","mtu":-1}"#,
                "-1",
            ),
            (r#"{"cmd":"port_del"}"#, "name"),
            (
                r#"{"cmd":"port_add","name":"x","bridge":"b","color":1}"#,
                "color",
            ),
        ] {
            let e = parse_request(bad).unwrap_err();
            assert!(
                e.starts_with("bad request") && e.contains(field),
                "{bad}: {e}"
            );
        }
        for bad in [
            "",
            "{",
            "[]",
            r#"{"cmd":"rm"}"#,
            r#"{"cmd":"show"}"#,
            "\u{0}",
        ] {
            assert!(
                parse_request(bad).unwrap_err().starts_with("bad request"),
                "{bad:?}"
            );
        }
    }

    /// Every command, the CNI plugin's included, refuses a request with a field it does not
    /// have, and the error names the field (`{"cmd":"reload","x":1}` used to reload).
    #[test]
    fn every_command_refuses_an_unknown_field() {
        let good = [
            r#"{"cmd":"show","what":"fdb","json":true}"#,
            r#"{"cmd":"reload"}"#,
            r#"{"cmd":"status"}"#,
            r#"{"cmd":"capture","port":"pod-a","count":3}"#,
            r#"{"cmd":"port_add","bridge":"cni0","name":"pod-c","mac":"02:00:00:00:00:0c"}"#,
            r#"{"cmd":"port_del","name":"pod-c"}"#,
            r#"{"cmd":"port_add","bridge":"cni0","owner":"c/eth0","netns":"/n","ifname":"eth0","mtu":1500}"#,
            r#"{"cmd":"port_del","owner":"c/eth0"}"#,
            r#"{"cmd":"port_show","owner":"c/eth0"}"#,
        ];
        for line in good {
            parse_request(line).unwrap_or_else(|e| panic!("{line}: {e}"));
            for extra in ["x", "jsn", "owner_", "Name"] {
                let with = format!("{},\"{extra}\":1}}", line.trim_end_matches('}'));
                let e = parse_request(&with).expect_err(&with);
                assert!(
                    e.starts_with("bad request") && e.contains(&format!("`{extra}`")),
                    "{with}: {e}"
                );
            }
        }
        // A CNI field on the command's own form is unknown there too.
        let e = parse_request(r#"{"cmd":"port_add","bridge":"cni0","name":"p","netns":"/n"}"#)
            .unwrap_err();
        assert!(e.contains("`netns`"), "{e}");
    }

    const GW_MAC: tapyard::MacAddr = tapyard::MacAddr([2, 0, 0, 0, 0, 1]);

    /// A datapath with NAT whose conntrack holds `n` connections, inserted through the
    /// library: UDP from pods (connection `i` from 10.244.0.0 + i/64, port 1024 + i%64) to a
    /// DNS Service's endpoint (DNAT'd, tagged with the Service), every 8th a TCP SYN with no
    /// NAT. Port 0 (`pod`) and port 1 (`endpoint`) are on the pods' bridge.
    fn conntrack_filled(n: u32) -> (tapyard::Datapath, tapyard::Instant) {
        use std::net::{Ipv4Addr, SocketAddrV4};
        use tapyard::conntrack::{tcp::flags, CtTag, Pkt};
        use tapyard::wire::tuple::{L4Kind, Tuple};
        let mut b = tapyard::Datapath::builder();
        let br = b.add_bridge(tapyard::BridgeConfig::new("cni0")).unwrap();
        b.add_port("pod", Some(br)).unwrap();
        b.add_port("endpoint", Some(br)).unwrap();
        let (gw, _) = b
            .add_router_iface(
                tapyard::l3::IfaceConfig::new("cni0", GW_MAC, Ipv4Addr::new(10, 244, 0, 1), 16),
                Some(br),
            )
            .unwrap();
        b.netfilter(tapyard::nat::NatConfig::default()).unwrap();
        let dp = b.build();
        let now = tapyard::Instant::from_secs(5);
        let nf = dp.netfilter().unwrap();
        let mut dns = tapyard::nat::ServiceSpec::new("dns", Ipv4Addr::new(10, 96, 0, 53), 53, 17);
        let ep = SocketAddrV4::new(Ipv4Addr::new(10, 244, 9, 9), 5353);
        let ep_mac = tapyard::MacAddr([2, 0, 0, 0, 9, 9]);
        dp.add_static_neigh(gw, *ep.ip(), ep_mac, now).unwrap();
        dns.endpoints = vec![tapyard::nat::Endpoint::new(ep, true)];
        let id = nf.upsert_service(dns, now).unwrap().get();
        for i in 0..n {
            let src = Ipv4Addr::from(0x0af4_0000 | (i >> 6));
            let sport = u16::try_from(1024 + (i & 63)).unwrap();
            let (orig, reply, tag, pkt) = if i % 8 == 7 {
                let orig = Tuple {
                    src,
                    dst: Ipv4Addr::new(192, 0, 2, 1),
                    sport,
                    dport: 443,
                    proto: 6,
                    zone: 0,
                };
                let syn = Pkt {
                    kind: L4Kind::Tcp,
                    tcp_flags: flags::SYN,
                    len: 60,
                };
                (orig, orig.invert(), CtTag::default(), syn)
            } else {
                let orig = Tuple {
                    src,
                    dst: Ipv4Addr::new(10, 96, 0, 53),
                    sport,
                    dport: 53,
                    proto: 17,
                    zone: 0,
                };
                let reply = Tuple {
                    src: *ep.ip(),
                    sport: ep.port(),
                    ..orig.invert()
                };
                let tag = CtTag {
                    service: id,
                    endpoint: u32::from(*ep.ip()),
                    ..CtTag::default()
                };
                let udp = Pkt {
                    kind: L4Kind::Udp,
                    tcp_flags: 0,
                    len: 80,
                };
                (orig, reply, tag, udp)
            };
            nf.conntrack().insert(orig, reply, tag, &pkt, now).unwrap();
        }
        assert_eq!(nf.conntrack().len(), usize::try_from(n).unwrap());
        (dp, now)
    }

    /// The rows as `show conntrack --json` built them before it was streamed: one
    /// `serde_json::Value` (the format the streamed reply must keep).
    fn conntrack_rows_as_values(nf: &tapyard::nat::Netfilter, now: tapyard::Instant) -> Value {
        let tuple = |t: &tapyard::wire::tuple::Tuple| json!({"src": t.src.to_string(), "dst": t.dst.to_string(), "sport": t.sport, "dport": t.dport});
        let names = service_names(nf);
        let rows = nf
            .conntrack()
            .dump(now)
            .into_iter()
            .map(|v| {
                json!({
                    "protocol": v.protocol,
                    "proto": v.proto,
                    "state": v.state.map(|s| s.name()),
                    "timeout_secs": v.timeout_secs,
                    "orig": tuple(&v.orig),
                    "reply": tuple(&v.reply),
                    "orig_packets": v.orig_packets,
                    "orig_bytes": v.orig_bytes,
                    "reply_packets": v.reply_packets,
                    "reply_bytes": v.reply_bytes,
                    "assured": v.assured,
                    "unreplied": v.unreplied,
                    "snat": v.status.snat(),
                    "dnat": v.status.dnat(),
                    "mark": v.mark,
                    "service": names.get(&v.service),
                    "service_id": v.service,
                    "zone": v.orig.zone,
                })
            })
            .collect();
        Value::Array(rows)
    }

    /// The streamed reply carries the rows the `Value`-built one did, and the client prints
    /// them byte for byte as before (`to_string_pretty` of the data, then a newline); an
    /// empty table and a table-less reply print as before too.
    #[test]
    fn streamed_conntrack_rows_keep_their_format() {
        let (dp, now) = conntrack_filled(100);
        let nf = dp.netfilter().unwrap();
        let want = conntrack_rows_as_values(nf, now);
        assert_eq!(want.as_array().unwrap().len(), 100);
        let mut line = Vec::new();
        write_conntrack_reply(nf, now, false, &mut line).unwrap();
        assert_eq!(line.last(), Some(&b'\n'), "one line");
        let v: Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(v, json!({"ok": true, "data": want}));
        let mut printed = Vec::new();
        let rest = read_data_reply(&mut &line[..], &mut printed).unwrap();
        assert_eq!(rest, json!({"ok": true, "data": true}));
        let old = format!("{}\n", serde_json::to_string_pretty(&want).unwrap());
        assert_eq!(String::from_utf8(printed).unwrap(), old);
        // As one value (nat_show), the same rows.
        let names = service_names(nf);
        let dump = nf.conntrack().dump(now);
        let rows: Vec<CtRow<'_>> = dump.iter().map(|e| CtRow::of(e, &names)).collect();
        assert_eq!(serde_json::to_value(rows).unwrap(), want);
        // Replies that are not streamed read as before.
        for (reply, text) in [
            (json!({"ok": true, "data": []}), "[]\n"),
            (
                json!({"ok": true, "data": {"b": 1, "a": [1, 2]}}),
                "{\n  \"a\": [\n    1,\n    2\n  ],\n  \"b\": 1\n}\n",
            ),
            (json!({"ok": true, "text": "x\n"}), ""),
            (json!({"ok": false, "error": "no"}), ""),
        ] {
            let mut printed = Vec::new();
            let line = format!("{reply}\n");
            let rest = read_data_reply(&mut line.as_bytes(), &mut printed).unwrap();
            assert_eq!(String::from_utf8(printed).unwrap(), text, "{reply}");
            assert_eq!(rest.get("ok"), reply.get("ok"));
            assert_eq!(rest.get("text"), reply.get("text"));
            assert_eq!(rest.get("error"), reply.get("error"));
        }
        let mut sink = Vec::new();
        assert!(read_data_reply(&mut &b"{\"ok\":tru"[..], &mut sink).is_err());
    }

    /// `show conntrack --json` of a table filled to 131,072 and 262,144 connections (the
    /// default `max_entries`), as the control socket serves it and the client prints it, the
    /// two ends on a socket pair; and how the same table fared the way it was answered before
    /// (rows built as one `serde_json::Value`, written as one string; the client parsing the
    /// line into a `Value` and pretty-printing it). Meanwhile a worker thread keeps running
    /// the datapath: the longest it waited between two batches is printed. Figures, not
    /// pass/fail (a shared machine's timings): run with
    /// `cargo test -p tapyard-cli --release --bin tapyard conntrack_dump_timing -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn conntrack_dump_timing() {
        use std::sync::atomic::AtomicU64;
        use std::time::Instant as Clock;
        for n in [131_072, 262_144] {
            let (dp, now) = conntrack_filled(n);
            let dp = Arc::new(dp);
            let nf = dp.netfilter().unwrap();
            // Before: the whole reply as one value and one string, then the client's parse.
            let t = Clock::now();
            let line = json!({"ok": true, "data": conntrack_rows_as_values(nf, now)}).to_string();
            let server_old = t.elapsed();
            let v: Value = serde_json::from_str(&line).unwrap();
            let mut out = io::sink();
            writeln!(out, "{}", serde_json::to_string_pretty(&v["data"]).unwrap()).unwrap();
            let old = t.elapsed();
            drop((v, line));
            // The text form (not streamed): one string in a JSON reply, parsed whole.
            let t = Clock::now();
            let line = json!({"ok": true, "text": nf.conntrack().fmt_dump(now)}).to_string();
            let v: Value = serde_json::from_str(&line).unwrap();
            write!(out, "{}", v["text"].as_str().unwrap_or_default()).unwrap();
            let text = t.elapsed();
            drop((v, line));
            // Now: streamed over a socket pair, alone...
            let t = Clock::now();
            let (a, b) = UnixStream::pair().unwrap();
            let server = {
                let dp = dp.clone();
                std::thread::spawn(move || {
                    write_conntrack_reply(dp.netfilter().unwrap(), now, false, &a).unwrap();
                })
            };
            let mut printed = io::BufWriter::with_capacity(1 << 20, io::sink());
            read_data_reply(&mut BufReader::with_capacity(1 << 20, &b), &mut printed).unwrap();
            server.join().unwrap();
            let alone = t.elapsed();
            // ... and with a worker forwarding meanwhile.
            let stop = Arc::new(AtomicBool::new(false));
            let gap = Arc::new(AtomicU64::new(0));
            // Connection 128's packets (10.244.0.2:1024 -> the DNS ClusterIP), 32 a batch,
            // DNAT'd and forwarded to the endpoint's port while the table is dumped.
            let frame = udp_frame([10, 244, 0, 2], 1024, [10, 96, 0, 53], 53);
            let worker = {
                let (dp, stop, gap) = (dp.clone(), stop.clone(), gap.clone());
                std::thread::spawn(move || {
                    let mut w = dp.worker();
                    let mut last = Clock::now();
                    let mut forwarded = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let mut batch = tapyard::Batch::new();
                        for _ in 0..tapyard::BATCH_SIZE {
                            let mut b = tapyard::PacketBuf::from_frame(&frame);
                            b.port = tapyard::PortId(0);
                            batch.push(b).unwrap();
                        }
                        dp.process(&mut w, now, &mut batch);
                        let sent = batch.verdicts().iter().filter(|v| {
                            matches!(v, tapyard::Verdict::Output(_) | tapyard::Verdict::Flood(_))
                        });
                        forwarded += sent.count() as u64;
                        dp.dispatch(&mut w, &batch, |_, _| Ok(()));
                        batch.recycle(&mut w.pool);
                        let us = u64::try_from(last.elapsed().as_micros()).unwrap_or(u64::MAX);
                        gap.fetch_max(us, Ordering::Relaxed);
                        last = Clock::now();
                    }
                    forwarded
                })
            };
            let (a, b) = UnixStream::pair().unwrap();
            let t = Clock::now();
            let server = {
                let dp = dp.clone();
                std::thread::spawn(move || {
                    let cpu = thread_cpu();
                    write_conntrack_reply(dp.netfilter().unwrap(), now, false, &a).unwrap();
                    thread_cpu() - cpu
                })
            };
            let cpu = thread_cpu();
            let mut printed = io::BufWriter::with_capacity(1 << 20, io::sink());
            let rest =
                read_data_reply(&mut BufReader::with_capacity(1 << 20, &b), &mut printed).unwrap();
            let client_cpu = thread_cpu() - cpu;
            let server_cpu = server.join().unwrap();
            let new = t.elapsed();
            stop.store(true, Ordering::Relaxed);
            let forwarded = worker.join().unwrap();
            assert!(forwarded > 0, "the worker forwarded nothing");
            assert_eq!(rest["ok"], true);
            let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
            println!(
                "{n} connections: before {:.0} ms (server {:.0} ms); streamed {:.0} ms alone, \
                 {:.0} ms beside a busy worker \
                 (CPU: server {:.0} ms, client {:.0} ms); a worker DNAT'd and forwarded \
                 {forwarded} frames meanwhile, longest gap between batches {:.1} ms; load \
                 average {}; text form (not streamed) {:.0} ms",
                old.as_secs_f64() * 1e3,
                server_old.as_secs_f64() * 1e3,
                alone.as_secs_f64() * 1e3,
                new.as_secs_f64() * 1e3,
                server_cpu as f64 / 1e6,
                client_cpu as f64 / 1e6,
                gap.load(Ordering::Relaxed) as f64 / 1e3,
                load.split_whitespace().next().unwrap_or("?"),
                text.as_secs_f64() * 1e3,
            );
        }
    }

    /// An Ethernet + IPv4 + UDP frame from a pod to the gateway's MAC (UDP checksum 0).
    fn udp_frame(src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16) -> Vec<u8> {
        let mut f = vec![2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 7, 7, 0x08, 0x00];
        let ip = [&[0x45, 0, 0, 32, 0, 1, 0, 0, 64, 17, 0, 0][..], &src, &dst].concat();
        let mut sum: u32 = ip
            .chunks(2)
            .map(|c| u32::from(u16::from_be_bytes([c[0], c[1]])))
            .sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        f.extend_from_slice(&ip);
        f[24..26].copy_from_slice(&(!u16::try_from(sum).unwrap()).to_be_bytes());
        f.extend_from_slice(&sport.to_be_bytes());
        f.extend_from_slice(&dport.to_be_bytes());
        f.extend_from_slice(&[0, 12, 0, 0, b'p', b'i', b'n', b'g']);
        f
    }

    /// Nanoseconds this thread has run on a CPU (`/proc/thread-self/schedstat`).
    fn thread_cpu() -> u64 {
        std::fs::read_to_string("/proc/thread-self/schedstat")
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    }

    #[test]
    fn a_live_socket_is_refused_and_a_stale_one_removed() {
        let dir = std::env::temp_dir().join(format!("tapyard-ctl-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join("x.sock");
        let _ = std::fs::remove_file(&path);
        claim_socket(&path).unwrap();
        let l = bind(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert!(claim_socket(&path).unwrap_err().contains("already running"));
        drop(l);
        claim_socket(&path).unwrap();
        assert!(!path.exists());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
