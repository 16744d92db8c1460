//! The new side of a takeover: it adopts the running node's descriptors and starts forwarding.

use std::io::{self, Read};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tapyard::port::TapPort;
use tapyard::MacAddr;

use crate::config::Config;
use crate::node::{Node, Plan};
use crate::ports::Origin;
use crate::state::{NetnsRecord, PortRecord};

use super::{
    entry_of, fail, name, recv, recv_handover_rest, send, socket_path, FdRole, IfaceRecord, Msg,
    TakeoverError, Wait, ABORT_SEND, ACK_TIMEOUT, ADOPT_DEADLINE, FAILPOINTS, HELLO_TIMEOUT,
    READY_TIMEOUT, VERSION,
};

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
pub fn take_over(
    cfg: Config,
    config_path: PathBuf,
    stop: &AtomicBool,
) -> Result<Adopted, TakeoverError> {
    let dir = cfg.node.state_dir_path();
    let path = socket_path(&dir);
    let s = UnixStream::connect(&path).map_err(|e| {
        TakeoverError::Protocol(format!(
            "--takeover: nobody to take over from: no tapyard answers on {} ({e}); start without --takeover",
            path.display()
        ))
    })?;
    let hello = Msg::Hello {
        version: VERSION,
        node: cfg.node.name.clone(),
        pid: std::process::id(),
    };
    send(&s, &hello, &[], Wait::new(HELLO_TIMEOUT, Some(stop)))
        .map_err(|e| TakeoverError::failed("--takeover: hello", e))?;
    let (ifaces, records, old_pid, control_socket, own_netns) =
        match recv(&s, Wait::new(READY_TIMEOUT, Some(stop))).map_err(|e| {
            TakeoverError::failed("--takeover: waiting for the running node's offer", e)
        })? {
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
                    return fail(format!(
                        "--takeover: the running node offered version {version} of node {node:?}"
                    ));
                }
                (ifaces, ports, pid, control_socket, own_netns)
            }
            (Msg::Abort { error }, _) => {
                return fail(format!(
                    "--takeover: refused by the running node: {error} (it goes on forwarding)"
                ))
            }
            (m, _) => return fail(format!("--takeover: expected an offer, got {}", name(&m))),
        };
    log::info!(
        "taking over from pid {old_pid}: {} port(s), control socket {}",
        records.len(),
        control_socket.display()
    );
    let abort = |error: TakeoverError| {
        let abort = Msg::Abort {
            error: error.to_string(),
        };
        let _ = send(&s, &abort, &[], Wait::new(ABORT_SEND, None));
        TakeoverError::Aborted {
            old_pid,
            source: Box::new(error),
        }
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
                return Err(abort(TakeoverError::Protocol(format!(
                    "failing on purpose ({}=abort)",
                    FAILPOINTS[1]
                ))));
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
                    return Err(abort(TakeoverError::failed("ack", e)));
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
                        return fail(format!(
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
) -> Result<Taken, TakeoverError> {
    let mut macs = Vec::new();
    for i in ifaces {
        let mac: MacAddr = crate::config::values::parse_mac(&i.mac).map_err(|e| {
            TakeoverError::failed(format!("interface {:?}: mac {:?}", i.name, i.mac), e)
        })?;
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
    send(s, &Msg::Ready {}, &[], wait).map_err(|e| TakeoverError::failed("ready", e))?;
    let (roles, fds) =
        match recv(s, wait).map_err(|e| TakeoverError::failed("waiting for the descriptors", e))? {
            (Msg::Handover { fds: roles }, fds) => (roles, fds),
            (m, _) => return fail(format!("expected the descriptors, got {}", name(&m))),
        };
    let got = Instant::now();
    let pairs = recv_handover_rest(s, roles, fds, wait)
        .map_err(|e| TakeoverError::failed("descriptors", e))?;
    // For the tests of the old process's recovery: fail (or die) holding the descriptors.
    match crate::failpoint::action(FAILPOINTS[0]).as_deref() {
        Some("abort") => return fail(format!("failing on purpose ({}=abort)", FAILPOINTS[0])),
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
                        .map_err(|e| TakeoverError::failed(format!("port {name:?}"), e))?;
                    gone.push((name, tap));
                    continue;
                };
                let tap = TapPort::from_fd(fd, r.offload)
                    .map_err(|e| TakeoverError::failed(format!("port {name:?}"), e))?;
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
        return fail(format!(
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
