//! A running node: the datapath built from a [`Config`], its TAP devices and worker threads,
//! and the live changes of a reload.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tapyard::runtime::Runtime;
use tapyard::{Clock, Datapath, Instant, MacAddr, PortId};

use crate::capture::CaptureTap;
use crate::config::diff::Refusal;
use crate::config::{self, Config};
use crate::ports::{self, Kind, Origin, PortEntry, Registry};
use crate::state::{self, StateDir};

mod error;
mod guard;
mod host;
mod live_ports;
mod plan;
mod reload;
#[cfg(test)]
mod tests;
mod translate;

pub use error::{BoxError, NodeError};
pub use host::remove_rules as remove_host_rules;
use plan::{config_kind, open_config_tap, tunnel_offload};
pub use plan::{Built, Plan};
pub use translate::{apply_services, service_error, to_nat_rules, to_peer, to_route, to_route6};

/// A node's running dataplane.
pub struct Node {
    /// The datapath the workers drive.
    pub dp: Arc<Datapath>,
    /// The file the node was started from (re-read on reload).
    pub config_path: PathBuf,
    /// The configuration in force.
    pub current: Mutex<Config>,
    /// Every port: from the file, `port add` and the CNI plugin ([`crate::ports`]).
    pub ports: Registry,
    /// TAPs added at run time are opened with virtio-net offloads: `node.offload`, when the
    /// node started with a TAP (the workers' buffers are sized at start for the largest port;
    /// a node that starts with none has buffers for plain frames only).
    pub offload: bool,
    /// Interface name, MAC, address of each router interface (for the log).
    pub ifaces: Vec<(String, MacAddr, Option<config::Cidr>)>,
    /// Worker threads in use.
    pub workers: usize,
    /// Where the port record is kept (`[node] state_dir`), the node's name and namespace.
    pub state: StateDir,
    /// What the library refused at the last reload (retried by the next one).
    refused: Mutex<Vec<Refusal>>,
    clock: Clock,
    rt: Mutex<Option<Runtime>>,
    /// The router's local TCP stack: kube-proxy's health servers on the node's addresses.
    local: Mutex<Option<tapyard::runtime::local::LocalServer>>,
}

/// What a reload did ([`Node::reload`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reloaded {
    /// One line per change applied (none: the file changes nothing); a change refused at
    /// the previous reload and applied now says so.
    pub changes: Vec<String>,
    /// One line per change the library refused, with its reason: it does not run, the
    /// running configuration keeps what it had, and the next reload retries it.
    pub refused: Vec<String>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("config_path", &self.config_path)
            .finish_non_exhaustive()
    }
}

impl Node {
    /// Builds the datapath from `cfg`, re-attaches the ports the last run recorded (where
    /// they live now) or creates the config's TAPs, starts the workers, and adds routes,
    /// static neighbours and Services.
    pub fn start(cfg: Config, config_path: PathBuf) -> Result<Node, NodeError> {
        let mut plan = Plan::new(cfg, config_path, &[])?;
        let sd = StateDir::new(plan.cfg.node.state_dir_path(), &plan.cfg.node.name);
        // The ports of the last run, to re-attach to (config ports below, by name; the others
        // here, before the datapath is built).
        let (mut cfg_recs, other_recs): (Vec<_>, Vec<_>) = sd
            .load_ports()
            .into_iter()
            .partition(|r| r.origin == Origin::Config);
        // Ports of `port add` and the CNI plugin, re-attached where they live now.
        let mut restored: Vec<(PortId, state::PortRecord, ports::Found)> = Vec::new();
        for r in other_recs {
            let who = format!(
                "port {}{}",
                r.name,
                r.owner
                    .as_deref()
                    .map_or(String::new(), |o| format!(" (owner {o})"))
            );
            let bid = r.bridge.as_deref().and_then(|n| plan.bridge(n));
            let Some(bid) = bid else {
                log::warn!(
                    "{who}: its bridge {:?} is no longer in the config: deleting its TAP",
                    r.bridge.as_deref().unwrap_or("-")
                );
                if let Err(e) = ports::delete_recorded(&r, sd.own_ns) {
                    log::warn!("{who}: {e}");
                }
                continue;
            };
            match ports::reattach(&r, sd.own_ns) {
                Ok(f) => match plan.add_port(&r.name, bid) {
                    Ok(pid) => restored.push((pid, r, f)),
                    Err(e) => {
                        log::warn!("{who}: cannot add it back ({e}): deleting its TAP");
                        let _ = f.tap.set_persist(false);
                    }
                },
                Err(why) => log::info!("{who}: dropped from the record: {why}"),
            }
        }
        let built = plan.build(None)?;
        let cfg = &built.cfg;
        let mut ports: Vec<PortEntry> = Vec::new();
        let mut reattached = 0;
        for (id, name, tap, bridge) in &built.taps {
            let kind = config_kind(cfg, name, bridge.as_deref());
            // Where the last run left it (moved and renamed, maybe), else in tapyard's
            // namespace by name (attached to if it exists, created if not).
            let rec = cfg_recs
                .iter()
                .position(|r| r.name == *name && r.kind == kind)
                .map(|i| cfg_recs.swap_remove(i));
            let found = rec.and_then(|r| match ports::reattach(&r, sd.own_ns) {
                Ok(f) => Some((f, r.offload)),
                Err(why) => {
                    log::info!("port {name}: not re-attached ({why}); opening TAP {tap} in tapyard's namespace");
                    None
                }
            });
            let (mut dev, ifname, link, netns, offload) = match found {
                Some((f, offload)) => {
                    reattached += 1;
                    (f.tap, f.ifname, Some(f.link), f.netns, offload)
                }
                None => {
                    let (dev, link) = open_config_tap(cfg, name, tap, bridge.as_deref())?;
                    (dev, tap.clone(), link, None, cfg.node.offload)
                }
            };
            if kind == Kind::Uplink {
                tunnel_offload(cfg, name, offload, &mut dev);
            }
            let (netns, netns_id) = netns.map_or((None, None), |(p, id)| (Some(p), Some(id)));
            ports.push(PortEntry {
                id: *id,
                name: name.clone(),
                tap: tap.clone(),
                ifname,
                owner: None,
                kind,
                bridge: bridge.clone(),
                link,
                netns,
                netns_id,
                origin: Origin::Config,
                capture: Arc::default(),
                dev: Some(Arc::new(dev)),
                offload,
                ips: Vec::new(),
            });
        }
        for r in cfg_recs {
            log::info!(
                "port {} left the config while tapyard was not running: deleting its TAP",
                r.name
            );
            if let Err(e) = ports::delete_recorded(&r, sd.own_ns) {
                log::warn!("port {}: {e}", r.name);
            }
        }
        for (id, r, f) in restored {
            let (netns, netns_id) = f.netns.map_or((None, None), |(p, id)| (Some(p), Some(id)));
            ports.push(PortEntry {
                id,
                name: r.name,
                tap: r.tap,
                ifname: f.ifname,
                owner: r.owner,
                kind: r.kind,
                bridge: r.bridge,
                link: Some(f.link),
                netns,
                netns_id,
                origin: r.origin,
                capture: Arc::default(),
                dev: Some(Arc::new(f.tap)),
                offload: r.offload,
                ips: r.ips,
            });
            reattached += 1;
        }
        let node = built.run(ports)?;
        log::info!(
            "ports recorded in {} ({reattached} re-attached from the last run)",
            node.state.dir.join(state::PORTS_FILE).display()
        );
        Ok(node)
    }

    /// The datapath's current time (the workers' clock).
    pub fn now(&self) -> Instant {
        self.clock.now()
    }

    /// Stops the workers (after the batch each has in hand). Idempotent.
    pub fn stop(&self) {
        drop(self.local.lock().unwrap_or_else(|e| e.into_inner()).take());
        let rt = self.rt.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(rt) = rt {
            rt.stop();
        }
    }

    /// The capture state of the port called `name` (datapath port or TAP name).
    pub fn capture_tap(&self, name: &str) -> Option<Arc<CaptureTap>> {
        self.ports.by_name(name).map(|e| e.capture)
    }

    /// Serves kube-proxy's `/healthz` on `port` of the node's addresses (0: no more).
    pub fn set_healthz_port(&self, port: u16) {
        if let Some(l) = self
            .local
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            l.set_healthz_port((port != 0).then_some(port));
        }
    }

    /// Runs `f` with the runtime; `None` once the node is stopping.
    pub fn with_runtime<T>(&self, f: impl FnOnce(&Runtime) -> T) -> Option<T> {
        self.rt
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(f)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.stop();
    }
}

/// How long the main loop sleeps between checks of the signal flags.
pub const TICK: Duration = Duration::from_millis(100);

/// An error and its sources, outermost first, joined by ": ".
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
