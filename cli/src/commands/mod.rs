//! The commands that do not run a node: `check`, `cleanup`, and the clients of a running
//! node (`status`, `show`, `capture`, `port`, `reload`), each ending in a [`Fail`] or not.

use std::path::{Path, PathBuf};

use tapyard_control::{Command, Status};

mod client;

pub use client::{capture, port, reload, show, status};

/// A failed command: its exit status and message.
#[derive(Debug)]
pub struct Fail(pub u8, pub String);

impl From<String> for Fail {
    fn from(s: String) -> Fail {
        Fail(1, s)
    }
}

/// Logs to stderr with env_logger, at the levels `RUST_LOG` names (default info).
pub fn init_logger() {
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

/// `tapyard check <config>`: validates the file, touching nothing.
pub fn check(path: &Path) -> Result<(), Fail> {
    let file = path.display().to_string();
    let ch = crate::config::load(path);
    for d in &ch.diags {
        eprintln!("{}", d.render(&file));
    }
    match &ch.config {
        Some(c) => {
            println!("{file}: ok: {}", crate::config::summary(c));
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

/// The host port's policy rules removed (and the `local` rule put back at 0) in the namespace
/// the node of `sd` ran in (here when the record does not say; nothing when that namespace is
/// gone, with its rules).
fn remove_host_rules(sd: &crate::state::StateDir) -> Result<Vec<String>, crate::node::NodeError> {
    let own = crate::state::load(&sd.dir, &sd.node)
        .ok()
        .flatten()
        .and_then(|r| r.own_netns)
        .filter(|o| Some(o.id()) != sd.own_ns);
    let Some(own) = own else {
        return crate::node::remove_host_rules();
    };
    let Some((f, path)) = crate::state::open_ns(&own) else {
        return Ok(Vec::new());
    };
    tapyard_cni::netns::run_in(&f, &path, || {
        crate::node::remove_host_rules().map_err(|e| {
            tapyard_cni::error::CniError::new(tapyard_cni::error::NETNS_CONFIG, e.to_string())
        })
    })
    .map_err(|e| crate::node::NodeError::refused(path.display().to_string(), e))
}

/// `tapyard cleanup <config>`: what a stopped node left (its persistent TAPs, wherever they
/// live, and its state directory) is deleted; refused while a tapyard answers on the socket.
pub fn cleanup(path: &Path, socket: Option<PathBuf>) -> Result<(), Fail> {
    let file = path.display().to_string();
    let ch = crate::config::load(path);
    let Some(cfg) = ch.config else {
        for d in &ch.diags {
            eprintln!("{}", d.render(&file));
        }
        return Err(Fail(2, format!("{file}: invalid; nothing deleted")));
    };
    let socket = socket.unwrap_or_else(|| cfg.node.socket_path());
    if let Ok(r) = crate::control::client::request::<Status>(&socket, Command::Status {}) {
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
    let takeover = crate::takeover::socket_path(&cfg.node.state_dir_path());
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
    crate::state::secure::check_dir(&cfg.node.state_dir_path(), false)
        .map_err(|e| Fail(1, format!("{e}; nothing deleted")))?;
    let sd = crate::state::StateDir::new(cfg.node.state_dir_path(), &cfg.node.name);
    let mut failed = Vec::new();
    let recs = sd.load_ports();
    for r in &recs {
        let at = r
            .netns
            .as_ref()
            .map_or("tapyard's namespace".to_string(), |n| n.path.clone());
        match crate::ports::delete_recorded(r, sd.own_ns) {
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
    let elsewhere = crate::state::load(&sd.dir, &cfg.node.name)
        .ok()
        .flatten()
        .and_then(|r| r.own_netns)
        .is_some_and(|o| Some(o.id()) != sd.own_ns);
    // The host port's policy rules (the node's own NodePorts), where the node ran.
    if !cfg.hosts.is_empty() {
        match remove_host_rules(&sd) {
            Ok(lines) => lines.iter().for_each(|l| println!("{l}")),
            Err(e) => failed.push(e.to_string()),
        }
    }
    for tap in names {
        if elsewhere || recs.iter().any(|r| r.tap == tap) {
            continue;
        }
        match crate::ports::delete_local_tap(&tap) {
            Ok(true) => println!("TAP {tap} deleted"),
            Ok(false) => {}
            Err(e) => failed.push(e.to_string()),
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
