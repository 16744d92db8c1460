//! `tapyard`: a Kubernetes node's dataplane on TAP devices, from one config file.
//!
//! ```text
//! tapyard check <config>                       validate, touching nothing (exit 1 if invalid)
//! tapyard run <config> [--socket PATH] [--metrics ADDR:PORT]
//!                                              run the node in the foreground until SIGINT/SIGTERM;
//!                                              SIGHUP reloads the config; --metrics serves
//!                                              Prometheus text at http://ADDR:PORT/metrics
//! tapyard status [--json]                      the running node's name, config, ports, interfaces
//! tapyard show fdb|neigh|routes|conntrack|services|stats [--json]
//! tapyard capture <port> -w <file.pcap> [-c N] write a port's frames (both directions) to pcap
//! tapyard reload                               re-read the config of the running node
//! ```
//!
//! Client commands (`show`, `capture`, `reload`) find the control socket with `--socket PATH`,
//! else `--config FILE` (its `node.socket`, default `/run/tapyard/<node name>.sock`), else the
//! only socket in `/run/tapyard`. Logs go to stderr; `RUST_LOG=debug|info|warn|error` sets
//! the level (default info).

#![deny(unsafe_code)]

mod capture;
mod config;
mod control;
mod diff;
mod metrics;
mod node;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

const USAGE: &str = "usage:
  tapyard check <config>
  tapyard run <config> [--socket PATH] [--metrics ADDR:PORT]
  tapyard status [--json] [--socket PATH | --config FILE]
  tapyard show fdb|neigh|routes|conntrack|services|stats [--json] [--socket PATH | --config FILE]
  tapyard capture <port> -w <file.pcap> [-c N] [--socket PATH | --config FILE]
  tapyard reload [--socket PATH | --config FILE]";

/// A failed command: its message and exit status.
struct Fail(u8, String);

impl From<String> for Fail {
    fn from(s: String) -> Fail {
        Fail(1, s)
    }
}

/// A stderr logger honouring `RUST_LOG` levels.
struct Logger {
    level: log::LevelFilter,
}

impl log::Log for Logger {
    fn enabled(&self, m: &log::Metadata<'_>) -> bool {
        m.level() <= self.level
    }
    fn log(&self, r: &log::Record<'_>) {
        if !self.enabled(r.metadata()) {
            return;
        }
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let s = t.as_secs() % 86_400;
        eprintln!(
            "{:02}:{:02}:{:02}.{:03} {:<5} tapyard: {}",
            s / 3600,
            s / 60 % 60,
            s % 60,
            t.subsec_millis(),
            r.level(),
            r.args()
        );
    }
    fn flush(&self) {}
}

fn init_logger() {
    let level = std::env::var("RUST_LOG")
        .ok()
        .and_then(|v| {
            // Accept `debug` as well as `tapyard=debug,other=warn` (the first level named).
            v.split(',')
                .filter_map(|p| p.rsplit('=').next())
                .find_map(|l| l.trim().parse::<log::LevelFilter>().ok())
        })
        .unwrap_or(log::LevelFilter::Info);
    if log::set_boxed_logger(Box::new(Logger { level })).is_ok() {
        log::set_max_level(level);
    }
}

/// The parsed command line.
#[derive(Debug, Default, PartialEq)]
struct Args {
    cmd: String,
    positional: Vec<String>,
    socket: Option<PathBuf>,
    config: Option<PathBuf>,
    json: bool,
    write: Option<PathBuf>,
    count: Option<u64>,
    metrics: Option<String>,
}

fn parse_args(argv: impl IntoIterator<Item = String>) -> Result<Args, Fail> {
    let mut it = argv.into_iter();
    let mut a = Args {
        cmd: it.next().ok_or_else(|| Fail(2, USAGE.into()))?,
        ..Default::default()
    };
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        let mut value = |name: &str| {
            inline
                .clone()
                .or_else(|| it.next())
                .ok_or_else(|| Fail(2, format!("{name} needs a value\n{USAGE}")))
        };
        match flag.as_str() {
            "--socket" | "-s" => a.socket = Some(value(&flag)?.into()),
            "--config" => a.config = Some(value(&flag)?.into()),
            "--metrics" => a.metrics = Some(value(&flag)?),
            "-w" | "--write" => a.write = Some(value(&flag)?.into()),
            "-c" | "--count" => {
                let v = value(&flag)?;
                a.count =
                    Some(v.parse().map_err(|_| {
                        Fail(2, format!("{flag}: {v:?} is not a number of frames"))
                    })?);
            }
            "--json" if inline.is_none() => a.json = true,
            "-h" | "--help" => return Err(Fail(0, USAGE.into())),
            f if f.starts_with('-') && f.len() > 1 => {
                return Err(Fail(2, format!("unknown option {arg:?}\n{USAGE}")))
            }
            _ => a.positional.push(arg),
        }
    }
    Ok(a)
}

fn one_positional(a: &Args, what: &str) -> Result<String, Fail> {
    match a.positional.as_slice() {
        [p] => Ok(p.clone()),
        [] => Err(Fail(
            2,
            format!("tapyard {}: missing {what}\n{USAGE}", a.cmd),
        )),
        _ => Err(Fail(
            2,
            format!(
                "tapyard {}: expected one {what}, got {:?}\n{USAGE}",
                a.cmd, a.positional
            ),
        )),
    }
}

fn cmd_check(a: &Args) -> Result<(), Fail> {
    let file = one_positional(a, "config file")?;
    let ch = config::load(Path::new(&file));
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

fn cmd_run(a: &Args) -> Result<(), Fail> {
    let file = one_positional(a, "config file")?;
    let path = PathBuf::from(&file);
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
    let socket = a.socket.clone().unwrap_or_else(|| cfg.node.socket_path());
    control::claim_socket(&socket).map_err(|e| Fail(2, e))?;
    let metrics = match &a.metrics {
        Some(addr) => {
            let l = std::net::TcpListener::bind(addr.as_str())
                .map_err(|e| Fail(2, format!("--metrics {addr}: cannot listen: {e}")))?;
            l.set_nonblocking(true)
                .map_err(|e| Fail(2, format!("--metrics {addr}: {e}")))?;
            Some(l)
        }
        None => None,
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
    let listener = control::bind(&socket).map_err(|e| Fail(2, e))?;
    let _socket_file = SocketFile(socket.clone());
    let name = cfg.node.name.clone();
    let node = Arc::new(node::Node::start(cfg, path).map_err(|e| Fail(2, e))?);
    let ctl_stop = Arc::new(AtomicBool::new(false));
    let ctl = {
        let (node, ctl_stop) = (node.clone(), ctl_stop.clone());
        std::thread::Builder::new()
            .name("tapyard-control".into())
            .spawn(move || control::serve(listener, node, ctl_stop))
            .map_err(|e| Fail(2, format!("cannot start the control thread: {e}")))?
    };
    let metrics = match metrics {
        Some(l) => {
            log::info!(
                "metrics at http://{}/metrics",
                l.local_addr()
                    .map_or_else(|_| "?".into(), |a| a.to_string())
            );
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
    for (n, mac, addr) in &node.ifaces {
        log::info!("interface {n} {addr} mac {mac}");
    }
    let taps: Vec<&str> = node.captures.iter().map(|(_, t, _)| t.as_str()).collect();
    log::info!(
        "node {name} running: {} TAP(s) ({}), {} worker(s), control socket {}; SIGINT/SIGTERM stops, SIGHUP reloads",
        taps.len(),
        taps.join(", "),
        node.workers,
        socket.display()
    );
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(node::TICK);
        if hup.swap(false, Ordering::Relaxed) {
            log::info!("SIGHUP: reloading {file}");
            match node.reload() {
                Ok(changes) => control::log_changes(&changes),
                Err(errors) => {
                    for e in errors {
                        log::error!("reload refused: {e}");
                    }
                }
            }
        }
    }
    log::info!("stopping");
    ctl_stop.store(true, Ordering::Relaxed);
    let _ = ctl.join();
    if let Some(m) = metrics {
        let _ = m.join();
    }
    node.stop();
    let s = node.dp.stats();
    log::info!(
        "stopped: forwarded {} flooded {} local {} dropped {}",
        s.forwarded,
        s.flooded,
        s.local,
        s.rx_drops()
    );
    Ok(())
}

fn client_socket(a: &Args) -> Result<PathBuf, Fail> {
    control::resolve_socket(a.socket.clone(), a.config.as_deref()).map_err(Fail::from)
}

fn fail_reply(v: &Value) -> Fail {
    let mut msg = v
        .get("error")
        .and_then(Value::as_str)
        .unwrap_or("request failed")
        .to_string();
    if let Some(errs) = v.get("errors").and_then(Value::as_array) {
        for e in errs {
            msg.push_str(&format!("\n  {}", e.as_str().unwrap_or_default()));
        }
    }
    Fail(1, msg)
}

fn cmd_show(a: &Args) -> Result<(), Fail> {
    let what = one_positional(
        a,
        "table (fdb, neigh, routes, conntrack, services or stats)",
    )?;
    let sock = client_socket(a)?;
    let (v, _) = control::request(&sock, &json!({"cmd": "show", "what": what, "json": a.json}))?;
    if v.get("ok") != Some(&Value::Bool(true)) {
        return Err(fail_reply(&v));
    }
    if let Some(t) = v.get("text").and_then(Value::as_str) {
        print!("{t}");
    } else {
        let data = v.get("data").cloned().unwrap_or(Value::Null);
        println!(
            "{}",
            serde_json::to_string_pretty(&data).unwrap_or_default()
        );
    }
    Ok(())
}

fn cmd_status(a: &Args) -> Result<(), Fail> {
    let sock = client_socket(a)?;
    let (v, _) = control::request(&sock, &json!({"cmd": "status"}))?;
    if v.get("ok") != Some(&Value::Bool(true)) {
        return Err(fail_reply(&v));
    }
    let d = v.get("data").cloned().unwrap_or(Value::Null);
    if a.json {
        println!("{}", serde_json::to_string_pretty(&d).unwrap_or_default());
        return Ok(());
    }
    let s = |v: &Value| v.as_str().unwrap_or("?").to_string();
    println!(
        "node {}  config {}  workers {}  socket {}",
        s(&d["node"]),
        s(&d["config"]),
        d["workers"],
        sock.display()
    );
    for i in d["interfaces"].as_array().into_iter().flatten() {
        println!(
            "interface {} {} mac {}",
            s(&i["name"]),
            s(&i["address"]),
            s(&i["mac"])
        );
    }
    for p in d["ports"].as_array().into_iter().flatten() {
        println!("port {} (TAP {})", s(&p["name"]), s(&p["tap"]));
    }
    Ok(())
}

fn cmd_reload(a: &Args) -> Result<(), Fail> {
    if !a.positional.is_empty() {
        return Err(Fail(
            2,
            format!("tapyard reload takes no arguments\n{USAGE}"),
        ));
    }
    let sock = client_socket(a)?;
    let (v, _) = control::request(&sock, &json!({"cmd": "reload"}))?;
    if v.get("ok") != Some(&Value::Bool(true)) {
        return Err(fail_reply(&v));
    }
    let changes = v
        .get("changes")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if changes.is_empty() {
        println!("reloaded: nothing changed");
    }
    for c in changes {
        println!("{}", c.as_str().unwrap_or_default());
    }
    Ok(())
}

fn cmd_capture(a: &Args) -> Result<(), Fail> {
    use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter};
    use pcap_file::DataLink;
    let port = one_positional(a, "port")?;
    let out = a
        .write
        .clone()
        .ok_or_else(|| Fail(2, format!("tapyard capture: -w FILE is required\n{USAGE}")))?;
    let sock = client_socket(a)?;
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        let _ = signal_hook::flag::register(sig, stop.clone());
    }
    let count = a.count.unwrap_or(0);
    let (v, mut r) = control::request(
        &sock,
        &json!({"cmd": "capture", "port": port, "count": count}),
    )?;
    if v.get("ok") != Some(&Value::Bool(true)) {
        return Err(fail_reply(&v));
    }
    let file =
        std::fs::File::create(&out).map_err(|e| format!("cannot create {}: {e}", out.display()))?;
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
            w.write_packet(&PcapPacket::new(ts, data.len() as u32, data))
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
    init_logger();
    let r = parse_args(std::env::args().skip(1)).and_then(|a| match a.cmd.as_str() {
        "check" => cmd_check(&a),
        "run" => cmd_run(&a),
        "show" => cmd_show(&a),
        "reload" => cmd_reload(&a),
        "status" => cmd_status(&a),
        "capture" => cmd_capture(&a),
        "help" | "-h" | "--help" => Err(Fail(0, USAGE.into())),
        "--version" | "version" => {
            println!("tapyard {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
        other => Err(Fail(2, format!("unknown command {other:?}\n{USAGE}"))),
    });
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(Fail(0, msg)) => {
            println!("{msg}");
            ExitCode::SUCCESS
        }
        Err(Fail(code, msg)) => {
            eprintln!("tapyard: {msg}");
            ExitCode::from(code)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Result<Args, Fail> {
        parse_args(s.split_whitespace().map(String::from))
    }

    #[test]
    fn command_lines() {
        let a = args("capture pod-a -w /tmp/x.pcap -c 5 --socket=/tmp/s")
            .ok()
            .unwrap();
        assert_eq!(a.cmd, "capture");
        assert_eq!(a.positional, ["pod-a"]);
        assert_eq!(a.count, Some(5));
        assert_eq!(a.socket.as_deref(), Some(Path::new("/tmp/s")));
        assert_eq!(a.write.as_deref(), Some(Path::new("/tmp/x.pcap")));
        assert!(args("show fdb --json").ok().unwrap().json);
        assert!(matches!(args("show --bogus"), Err(Fail(2, _))));
        assert!(matches!(args("capture p -c x"), Err(Fail(2, _))));
        assert!(matches!(args("run --socket"), Err(Fail(2, _))));
    }
}
