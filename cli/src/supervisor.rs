//! `tapyard run`: the node in the foreground, its control, takeover and metrics servers, and
//! its main loop (signals, port record refresh, SIGHUP reloads), until SIGINT/SIGTERM.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::control::server::StartError;
use crate::node::{BoxError, NodeError};
use crate::state::secure::Refused;
use crate::takeover::TakeoverError;

/// Why `tapyard run` stopped before the node ran (exit status 2).
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The config file has errors (printed before).
    #[error("{file}: {errors} error{} found; not starting", if *errors == 1 { "" } else { "s" })]
    Invalid {
        /// The file.
        file: String,
        /// How many errors it has.
        errors: usize,
    },
    /// The state directory is not safe to use.
    #[error(transparent)]
    StateDir(#[from] Refused),
    /// The control socket cannot be claimed or bound.
    #[error("{0}")]
    Socket(String),
    /// `--metrics ADDR` cannot listen.
    #[error("--metrics {addr}: cannot listen: {source}")]
    Metrics {
        /// The address.
        addr: String,
        /// Why.
        #[source]
        source: BoxError,
    },
    /// A signal handler cannot be installed.
    #[error("signal: {0}")]
    Signal(#[source] std::io::Error),
    /// `--takeover` failed (the running node goes on).
    #[error(transparent)]
    Takeover(#[from] TakeoverError),
    /// The node cannot start.
    #[error(transparent)]
    Node(#[from] NodeError),
    /// The control server cannot start.
    #[error(transparent)]
    Control(#[from] StartError),
    /// A thread cannot be started.
    #[error("cannot start the {what} thread: {source}")]
    Thread {
        /// Which.
        what: &'static str,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// Removes the control socket this process bound, whichever way `run` returns.
struct SocketFile(PathBuf);

impl Drop for SocketFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `--metrics ADDR` after a takeover: the old process frees the port as it exits.
fn listen_metrics_retrying(addr: &str) -> Result<tiny_http::Server, RunError> {
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    loop {
        match crate::metrics::listen(addr) {
            Ok(l) => return Ok(l),
            Err(e) if std::time::Instant::now() >= deadline => {
                return Err(RunError::Metrics {
                    addr: addr.to_string(),
                    source: e,
                })
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// `tapyard run <config>`: runs the node until SIGINT/SIGTERM (see the module docs).
pub fn run(
    path: PathBuf,
    socket: Option<PathBuf>,
    metrics_addr: Option<String>,
    takeover: bool,
) -> Result<(), RunError> {
    let file = path.display().to_string();
    let ch = crate::config::load(&path);
    for d in &ch.diags {
        eprintln!("{}", d.render(&file));
    }
    let Some(cfg) = ch.config else {
        return Err(RunError::Invalid {
            file,
            errors: ch.errors().count(),
        });
    };
    let socket = socket.unwrap_or_else(|| cfg.node.socket_path());
    let state_dir = cfg.node.state_dir_path();
    // Before anything is read from it or written to it (see state/secure.rs and SECURITY.md).
    crate::state::secure::check_dir(&state_dir, true)?;
    if !takeover {
        crate::control::claim_socket(&socket).map_err(RunError::Socket)?;
    }
    let metrics = match &metrics_addr {
        Some(addr) if !takeover => {
            Some(
                crate::metrics::listen(addr).map_err(|source| RunError::Metrics {
                    addr: addr.to_string(),
                    source,
                })?,
            )
        }
        _ => None,
    };
    // Signals are caught from here on: a SIGINT while the TAPs are being created stops the
    // node as soon as it runs, with the socket removed.
    let stop = Arc::new(AtomicBool::new(false));
    let hup = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone()).map_err(RunError::Signal)?;
    }
    signal_hook::flag::register(signal_hook::consts::SIGHUP, hup.clone())
        .map_err(RunError::Signal)?;
    let name = cfg.node.name.clone();
    let (node, listener, socket, takeover_listener, _files) = if takeover {
        let t0 = std::time::Instant::now();
        let a = crate::takeover::take_over(cfg, path, &stop)?;
        if a.control_socket != socket {
            log::warn!(
                "the control socket stays where the old process bound it: {} (not {})",
                a.control_socket.display(),
                socket.display()
            );
        }
        log::info!(
            "took over from pid {} in {:.1} ms (it has exited)",
            a.old_pid,
            t0.elapsed().as_secs_f64() * 1000.0
        );
        // The socket files are this process's now: removed when it stops.
        let files = [
            SocketFile(a.control_socket.clone()),
            SocketFile(crate::takeover::socket_path(&state_dir)),
        ];
        (a.node, a.control, a.control_socket, a.takeover, files)
    } else {
        let listener = crate::control::bind(&socket).map_err(RunError::Socket)?;
        let control_file = SocketFile(socket.clone());
        let tl = crate::takeover::bind(&state_dir)?;
        let files = [
            control_file,
            SocketFile(crate::takeover::socket_path(&state_dir)),
        ];
        let node = Arc::new(crate::node::Node::start(cfg, path)?);
        (node, listener, socket, tl, files)
    };
    let metrics = match (metrics, &metrics_addr) {
        (None, Some(addr)) if takeover => Some(listen_metrics_retrying(addr)?),
        (m, _) => m,
    };
    let control = Arc::new(crate::control::server::ControlServer::new(
        listener,
        node.clone(),
    ));
    control.start()?;
    let ctl_stop = Arc::new(AtomicBool::new(false));
    // Set while a takeover holds the node: no reload or port record refresh meanwhile.
    let handing_over = Arc::new(AtomicBool::new(false));
    let takeover_thread = {
        let old = crate::takeover::OldSide {
            node: node.clone(),
            control: control.clone(),
            control_socket: socket.clone(),
            takeover: takeover_listener,
            name: name.clone(),
            busy: handing_over.clone(),
        };
        let ctl_stop = ctl_stop.clone();
        std::thread::Builder::new()
            .name("tapyard-takeover".into())
            .spawn(move || crate::takeover::serve(old, ctl_stop))
            .map_err(|source| RunError::Thread {
                what: "takeover",
                source,
            })?
    };
    let metrics = match metrics {
        Some(l) => {
            log::info!("metrics at http://{}/metrics", l.server_addr());
            let (node, ctl_stop) = (node.clone(), ctl_stop.clone());
            Some(
                std::thread::Builder::new()
                    .name("tapyard-metrics".into())
                    .spawn(move || crate::metrics::serve(l, node, ctl_stop))
                    .map_err(|source| RunError::Thread {
                        what: "metrics",
                        source,
                    })?,
            )
        }
        None => None,
    };
    {
        let cur = node.current.lock().unwrap_or_else(|e| e.into_inner());
        let v6 = |n: &str| {
            let ll = node
                .dp
                .control()
                .iface_by_name(n)
                .and_then(|i| node.dp.control().router()?.link_local(i));
            cur.connected()
                .into_iter()
                .find(|c| c.name == n)
                .and_then(|c| c.address6)
                .map_or(String::new(), |a| {
                    format!(
                        " {a}{}",
                        ll.map_or(String::new(), |l| format!(" link-local {l}"))
                    )
                })
        };
        for (n, mac, addr) in &node.ifaces {
            let addr = addr.map_or("(no IPv4)".to_string(), |a| a.to_string());
            log::info!("interface {n} {addr}{} mac {mac}", v6(n));
        }
    }
    let taps: Vec<String> = node.ports.list().into_iter().map(|e| e.tap).collect();
    log::info!(
        "node {name} running: {} TAP(s) ({}), {} worker(s), control socket {}; SIGINT/SIGTERM stops, SIGHUP reloads",
        taps.len(),
        taps.join(", "),
        node.workers,
        socket.display()
    );
    let mut ticks: u32 = 0;
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(crate::node::TICK);
        ticks = ticks.wrapping_add(1);
        if handing_over.load(Ordering::Acquire) {
            continue;
        }
        // Follow TAPs moved or renamed by hand, so a restart finds them: every tick (four
        // syscalls a TAP) on a node of up to 256 ports, every second on a bigger one.
        if node.ports.len() <= 256 || ticks % 10 == 0 {
            node.refresh_ports();
        }
        if hup.swap(false, Ordering::Relaxed) {
            log::info!("SIGHUP: reloading {file}");
            match node.reload() {
                Ok(r) => crate::control::log_reloaded(&r),
                Err(errors) => {
                    for e in errors {
                        log::error!("reload refused: {e}");
                    }
                }
            }
        }
    }
    log::info!("stopping; the TAPs stay in place for the next run");
    // A takeover in progress sees this within 100 ms, gives up and resumes the node (its
    // waits are sliced: see crate::takeover::Wait), whatever its peer does.
    ctl_stop.store(true, Ordering::Relaxed);
    let _ = takeover_thread.join();
    node.refresh_ports();
    control.stop();
    if let Some(m) = metrics {
        let _ = m.join();
    }
    node.stop();
    let s = node.dp.control().stats();
    log::info!(
        "stopped: forwarded {} flooded {} local {} dropped {}",
        s.forwarded,
        s.flooded,
        s.local,
        s.rx_drops()
    );
    Ok(())
}
