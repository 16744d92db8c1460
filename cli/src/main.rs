//! `tapyard`: a Kubernetes node's dataplane on TAP devices, from one config file.
//!
//! ```text
//! tapyard check <config>                       validate, touching nothing (exit 1 if invalid)
//! tapyard run <config> [--socket PATH] [--metrics ADDR:PORT] [--takeover]
//!                                              run the node in the foreground until SIGINT/SIGTERM;
//!                                              SIGHUP reloads the config; --metrics serves
//!                                              Prometheus text at http://ADDR:PORT/metrics;
//!                                              --takeover takes the TAPs and the control socket
//!                                              from the running node, which exits 0 ([`takeover`])
//! tapyard status [--json]                      the running node's name, config, ports, interfaces
//! tapyard show fdb|neigh|routes|conntrack|services|stats [--json]
//! tapyard capture <port> -w <file.pcap> [-c N] write a port's frames (both directions) to pcap
//! tapyard port add <bridge> <name> [--mac MAC] a TAP on a bridge, left in tapyard's namespace
//! tapyard port del <name>                      remove a port added by `port add` or the CNI plugin
//! tapyard show ports [--json]                  every port: kind, bridge, MAC, namespace, counters
//! tapyard reload                               re-read the config of the running node
//! tapyard cleanup <config> [--socket PATH]     delete every TAP of a stopped node and its
//!                                              state directory
//! tapyard keys                                 every config key: default, range, help
//! ```
//!
//! Client commands (`status`, `show`, `capture`, `port`, `reload`) find the control socket with
//! `--socket PATH`, else `--config FILE` (its `node.socket`, default
//! `/run/tapyard/<node name>.sock`), else the only socket in `/run/tapyard`. `tapyard --help`
//! and `tapyard COMMAND --help` describe each option ([`args`]). Logs go to stderr through
//! env_logger; `RUST_LOG=debug|info|warn|error` (or per module, `tapyard=debug`) sets the level
//! (default info).

mod args;
mod capture;
mod config;
mod control;
mod diff;
mod failpoint;
mod live;
mod metrics;
mod node;
mod ports;
mod secure;
mod state;
mod takeover;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tapyard_control::{Command, PortInfo, Reply, Status};

/// A failed command: its message and exit status.
struct Fail(u8, String);

impl From<String> for Fail {
    fn from(s: String) -> Fail {
        Fail(1, s)
    }
}

/// Logs to stderr with env_logger, at the levels `RUST_LOG` names (default info).
fn init_logger() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .target(env_logger::Target::Stderr)
        .format_timestamp_millis()
        .init();
    if std::env::var_os("TAPYARD_HASH_SEED").is_some() {
        log::warn!(
            "TAPYARD_HASH_SEED is set: every table's hash secrets are fixed (a benchmark aid); \
             whoever knows the value can aim connections at one bucket: unset it in production"
        );
    }
}

fn cmd_check(path: &Path) -> Result<(), Fail> {
    let file = path.display().to_string();
    let ch = config::load(path);
    for d in &ch.diags {
        eprintln!("{}", d.render(&file));
    }
    match &ch.config {
        Some(c) => {
            println!("{file}: ok: {}", config::summary(c));
            Ok(())
        }
        None => {
            let n = ch.errors().count();
            Err(Fail(
                1,
                format!("{file}: {n} error{} found", if n == 1 { "" } else { "s" }),
            ))
        }
    }
}

/// Removes the control socket this process bound, whichever way `run` returns.
struct SocketFile(PathBuf);

impl Drop for SocketFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `--metrics ADDR` after a takeover: the old process frees the port as it exits.
fn listen_metrics_retrying(addr: &str) -> Result<tiny_http::Server, Fail> {
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    loop {
        match metrics::listen(addr) {
            Ok(l) => return Ok(l),
            Err(e) if std::time::Instant::now() >= deadline => {
                return Err(Fail(2, format!("--metrics {addr}: cannot listen: {e}")))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

fn cmd_run(
    path: PathBuf,
    socket: Option<PathBuf>,
    metrics_addr: Option<String>,
    takeover: bool,
) -> Result<(), Fail> {
    let file = path.display().to_string();
    let ch = config::load(&path);
    for d in &ch.diags {
        eprintln!("{}", d.render(&file));
    }
    let Some(cfg) = ch.config else {
        let n = ch.errors().count();
        return Err(Fail(
            2,
            format!(
                "{file}: {n} error{} found; not starting",
                if n == 1 { "" } else { "s" }
            ),
        ));
    };
    let socket = socket.unwrap_or_else(|| cfg.node.socket_path());
    let state_dir = cfg.node.state_dir_path();
    // Before anything is read from it or written to it (see secure.rs and SECURITY.md).
    secure::check_dir(&state_dir, true).map_err(|e| Fail(2, e.to_string()))?;
    if !takeover {
        control::claim_socket(&socket).map_err(|e| Fail(2, e))?;
    }
    let metrics = match &metrics_addr {
        Some(addr) if !takeover => Some(
            metrics::listen(addr)
                .map_err(|e| Fail(2, format!("--metrics {addr}: cannot listen: {e}")))?,
        ),
        _ => None,
    };
    // Signals are caught from here on: a SIGINT while the TAPs are being created stops the
    // node as soon as it runs, with the socket removed.
    let stop = Arc::new(AtomicBool::new(false));
    let hup = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone())
            .map_err(|e| Fail(2, format!("signal: {e}")))?;
    }
    signal_hook::flag::register(signal_hook::consts::SIGHUP, hup.clone())
        .map_err(|e| Fail(2, format!("signal: {e}")))?;
    let name = cfg.node.name.clone();
    let (node, listener, socket, takeover_listener, _files) = if takeover {
        let t0 = std::time::Instant::now();
        let a = takeover::take_over(cfg, path, &stop).map_err(|e| Fail(2, e))?;
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
            SocketFile(takeover::socket_path(&state_dir)),
        ];
        (a.node, a.control, a.control_socket, a.takeover, files)
    } else {
        let listener = control::bind(&socket).map_err(|e| Fail(2, e))?;
        let control_file = SocketFile(socket.clone());
        let tl = takeover::bind(&state_dir).map_err(|e| Fail(2, e))?;
        let files = [control_file, SocketFile(takeover::socket_path(&state_dir))];
        let node = Arc::new(node::Node::start(cfg, path).map_err(|e| Fail(2, e))?);
        (node, listener, socket, tl, files)
    };
    let metrics = match (metrics, &metrics_addr) {
        (None, Some(addr)) if takeover => Some(listen_metrics_retrying(addr)?),
        (m, _) => m,
    };
    let control = Arc::new(takeover::ControlServer::new(listener, node.clone()));
    control.start().map_err(|e| Fail(2, e))?;
    let ctl_stop = Arc::new(AtomicBool::new(false));
    // Set while a takeover holds the node: no reload or port record refresh meanwhile.
    let handing_over = Arc::new(AtomicBool::new(false));
    let takeover_thread = {
        let old = takeover::OldSide {
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
            .spawn(move || takeover::serve(old, ctl_stop))
            .map_err(|e| Fail(2, format!("cannot start the takeover thread: {e}")))?
    };
    let metrics = match metrics {
        Some(l) => {
            log::info!("metrics at http://{}/metrics", l.server_addr());
            let (node, ctl_stop) = (node.clone(), ctl_stop.clone());
            Some(
                std::thread::Builder::new()
                    .name("tapyard-metrics".into())
                    .spawn(move || metrics::serve(l, node, ctl_stop))
                    .map_err(|e| Fail(2, format!("cannot start the metrics thread: {e}")))?,
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
                .and_then(|i| node.dp.control().router()?.link_local6(i));
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
        std::thread::sleep(node::TICK);
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
                Ok(r) => control::log_reloaded(&r),
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
    // waits are sliced: see takeover::Wait), whatever its peer does.
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

/// `tapyard cleanup <config>`: what a stopped node left (its persistent TAPs, wherever they
/// live, and its state directory) is deleted; refused while a tapyard answers on the socket.
fn cmd_cleanup(path: &Path, socket: Option<PathBuf>) -> Result<(), Fail> {
    let file = path.display().to_string();
    let ch = config::load(path);
    let Some(cfg) = ch.config else {
        for d in &ch.diags {
            eprintln!("{}", d.render(&file));
        }
        return Err(Fail(2, format!("{file}: invalid; nothing deleted")));
    };
    let socket = socket.unwrap_or_else(|| cfg.node.socket_path());
    if let Ok(r) = control::client::request::<Status>(&socket, Command::Status {}) {
        let name = r.data.map_or_else(|| "?".to_string(), |d| d.node);
        return Err(Fail(
            1,
            format!(
                "a tapyard (node {name}) still answers on {}: stop it first (SIGTERM), then run cleanup again; nothing deleted",
                socket.display()
            ),
        ));
    }
    // A node started with `--socket` elsewhere does not answer there: every `tapyard run`
    // also listens on `<state_dir>/takeover.sock`, which is what its state belongs to.
    let takeover = takeover::socket_path(&cfg.node.state_dir_path());
    if std::os::unix::net::UnixStream::connect(&takeover).is_ok() {
        return Err(Fail(
            1,
            format!(
                "a tapyard still serves {} (the state directory's node): stop it first (SIGTERM), then run cleanup again; nothing deleted",
                takeover.display()
            ),
        ));
    }
    // A record in a directory that others could have written is not acted on.
    secure::check_dir(&cfg.node.state_dir_path(), false)
        .map_err(|e| Fail(1, format!("{e}; nothing deleted")))?;
    let sd = state::StateDir::new(cfg.node.state_dir_path(), &cfg.node.name);
    let mut failed = Vec::new();
    let recs = sd.load_ports();
    for r in &recs {
        let at = r
            .netns
            .as_ref()
            .map_or("tapyard's namespace".to_string(), |n| n.path.clone());
        match ports::delete_recorded(r, sd.own_ns) {
            Ok(true) => println!("port {}: TAP {} in {at} deleted", r.name, r.ifname),
            Ok(false) => println!("port {}: TAP {} in {at} is gone already", r.name, r.ifname),
            Err(e) => failed.push(format!("port {}: {e}", r.name)),
        }
    }
    // The config's TAPs the record does not list: by name, here (when the node ran here).
    let names = cfg
        .bridges
        .iter()
        .flat_map(|b| b.ports.iter().cloned())
        .chain(cfg.uplinks.iter().map(|u| u.tap.clone()));
    let elsewhere = state::load(&sd.dir, &cfg.node.name)
        .ok()
        .flatten()
        .and_then(|r| r.own_netns)
        .is_some_and(|o| Some(o.id()) != sd.own_ns);
    for tap in names {
        if elsewhere || recs.iter().any(|r| r.tap == tap) {
            continue;
        }
        match ports::delete_local_tap(&tap) {
            Ok(true) => println!("TAP {tap} deleted"),
            Ok(false) => {}
            Err(e) => failed.push(e),
        }
    }
    match std::fs::remove_dir_all(&sd.dir) {
        Ok(()) => println!("state directory {} removed", sd.dir.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => failed.push(format!("cannot remove {}: {e}", sd.dir.display())),
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(Fail(1, failed.join("\n")))
    }
}

fn client_socket(c: &args::Client) -> Result<PathBuf, Fail> {
    control::resolve_socket(c.socket.clone(), c.config.as_deref()).map_err(Fail::from)
}

fn fail_reply<T>(r: &Reply<T>) -> Fail {
    Fail(1, r.error_message())
}

fn cmd_show(what: args::Table, json: bool, client: &args::Client) -> Result<(), Fail> {
    let sock = client_socket(client)?;
    // `data` (a full conntrack table is ~100 MB of JSON) is printed as it is parsed.
    let mut out = std::io::BufWriter::with_capacity(1 << 20, std::io::stdout().lock());
    let what = what.name().to_string();
    let r = control::client::request_data(&sock, Command::Show { json, what }, &mut out)?;
    if !r.ok {
        return Err(fail_reply(&r));
    }
    if let Some(t) = &r.text {
        let _ = out.write_all(t.as_bytes());
    } else if r.data.is_none() {
        let _ = out.write_all(b"null\n");
    }
    out.flush()
        .map_err(|e| Fail(1, format!("cannot write the output: {e}")))?;
    Ok(())
}

fn cmd_status(json: bool, client: &args::Client) -> Result<(), Fail> {
    let sock = client_socket(client)?;
    let r = control::client::request::<Status>(&sock, Command::Status {})?;
    let d = match r {
        Reply {
            ok: true,
            data: Some(d),
            ..
        } => d,
        r => return Err(fail_reply(&r)),
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&d).unwrap_or_default());
        return Ok(());
    }
    println!(
        "node {}  config {}  workers {}  socket {}",
        d.node,
        d.config,
        d.workers,
        sock.display()
    );
    for i in &d.interfaces {
        let v6 = match (&i.address6, &i.link_local6) {
            (Some(a), Some(l)) => format!(" {a} link-local {l}"),
            _ => String::new(),
        };
        println!(
            "interface {} {}{v6} mac {}",
            i.name,
            i.address.as_deref().unwrap_or("?"),
            i.mac
        );
    }
    for p in &d.ports {
        println!("port {} (TAP {})", p.name, p.tap);
    }
    Ok(())
}

fn cmd_port(op: args::PortOp) -> Result<(), Fail> {
    match op {
        args::PortOp::Add {
            bridge,
            name,
            mac,
            client,
        } => {
            let sock = client_socket(&client)?;
            let cmd = Command::PortAdd {
                bridge: bridge.clone(),
                mac,
                name: name.clone(),
            };
            match control::client::request::<PortInfo>(&sock, cmd)? {
                Reply {
                    ok: true,
                    data: Some(p),
                    ..
                } => println!(
                    "port {name} added to bridge {bridge}: ifindex {} mac {}",
                    p.ifindex, p.mac
                ),
                r => return Err(fail_reply(&r)),
            }
        }
        args::PortOp::Del { name, client } => {
            let sock = client_socket(&client)?;
            let cmd = Command::PortDel { name: name.clone() };
            let r = control::client::request::<serde::de::IgnoredAny>(&sock, cmd)?;
            if !r.ok {
                return Err(fail_reply(&r));
            }
            println!("port {name} removed");
        }
    }
    Ok(())
}

fn cmd_reload(client: &args::Client) -> Result<(), Fail> {
    let sock = client_socket(client)?;
    let r = control::client::request::<serde::de::IgnoredAny>(&sock, Command::Reload {})?;
    let changes = r.changes.as_deref().unwrap_or_default();
    if r.ok && changes.is_empty() {
        println!("reloaded: nothing changed");
    }
    // A partly refused reload: what was applied on stdout, what was refused on stderr.
    for c in changes {
        println!("{c}");
    }
    if !r.ok {
        return Err(fail_reply(&r));
    }
    Ok(())
}

fn cmd_capture(
    port: &str,
    out: &Path,
    count: Option<u64>,
    client: &args::Client,
) -> Result<(), Fail> {
    use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter};
    use pcap_file::DataLink;
    let sock = client_socket(client)?;
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        let _ = signal_hook::flag::register(sig, stop.clone());
    }
    let count = count.unwrap_or(0);
    let cmd = Command::Capture {
        count,
        port: port.to_string(),
    };
    let (reply, mut r) = control::client::request_stream(&sock, cmd)?;
    if !reply.ok {
        return Err(fail_reply(&reply));
    }
    let file =
        std::fs::File::create(out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
    let header = PcapHeader {
        snaplen: 262_144,
        datalink: DataLink::ETHERNET,
        ..Default::default()
    };
    let mut w = PcapWriter::with_header(std::io::BufWriter::new(file), header)
        .map_err(|e| format!("{}: {e}", out.display()))?;
    let _ = r
        .get_ref()
        .set_read_timeout(Some(Duration::from_millis(200)));
    eprintln!(
        "capturing on {port} into {} (Ctrl-C to stop)",
        out.display()
    );
    let mut pending: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; 256 * 1024];
    let (mut frames, mut dropped) = (0u64, None);
    'read: while !stop.load(Ordering::Relaxed) {
        match r.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => pending.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) =>
            {
                continue
            }
            Err(e) => return Err(format!("{}: {e}", sock.display()).into()),
        }
        let mut used = 0;
        while let Some((kind, micros, data, n)) = capture::decode(&pending[used..]) {
            used += n;
            if kind == capture::KIND_END {
                dropped = Some(micros);
                break 'read;
            }
            let ts = Duration::from_micros(micros);
            w.write_packet(&PcapPacket::new(ts, capture::frame_len32(data.len()), data))
                .map_err(|e| format!("{}: {e}", out.display()))?;
            frames += 1;
            if count > 0 && frames >= count {
                break 'read;
            }
        }
        pending.drain(..used);
    }
    let mut inner = w.into_writer();
    std::io::Write::flush(&mut inner).map_err(|e| format!("{}: {e}", out.display()))?;
    eprintln!(
        "{frames} frame{} written to {}{}",
        if frames == 1 { "" } else { "s" },
        out.display(),
        match dropped {
            Some(d) if d > 0 => format!(" ({d} dropped: the capture queue was full)"),
            _ => String::new(),
        }
    );
    Ok(())
}

fn main() -> ExitCode {
    let cli = match args::parse(std::env::args_os()) {
        Ok(cli) => cli,
        Err(args::Stop::Print(text)) => {
            print!("{text}");
            return ExitCode::SUCCESS;
        }
        Err(args::Stop::Usage(text)) => {
            eprint!("{text}");
            return ExitCode::from(2);
        }
        Err(args::Stop::Bad(line)) => {
            eprintln!("tapyard: {line}");
            return ExitCode::from(2);
        }
    };
    init_logger();
    use args::Cmd;
    let r = match cli.cmd {
        Cmd::Check { config } => cmd_check(&config),
        Cmd::Run {
            config,
            socket,
            metrics,
            takeover,
        } => cmd_run(config, socket, metrics, takeover),
        Cmd::Show { what, json, client } => cmd_show(what, json, &client),
        Cmd::Status { json, client } => cmd_status(json, &client),
        Cmd::Reload { client } => cmd_reload(&client),
        Cmd::Cleanup { config, socket } => cmd_cleanup(&config, socket),
        Cmd::Port { op } => cmd_port(op),
        Cmd::Capture {
            port,
            write,
            count,
            client,
        } => cmd_capture(&port, &write, count, &client),
        Cmd::Keys => {
            print!("{}", config::schema::reference());
            Ok(())
        }
        Cmd::Version => {
            println!("tapyard {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(Fail(code, msg)) => {
            eprintln!("tapyard: {msg}");
            ExitCode::from(code)
        }
    }
}
