//! The spoof guards of pod ports ([`tapyard::Control::set_port_guard`]): a port with known
//! addresses (the CNI plugin's IPAM, `port add --ip`) on a bridge whose `spoof_guard` is on
//! (the default) may send only from them and from its MAC. The guard follows the port: set
//! when it is added, again at a start or a takeover from the record, and on a reload that
//! turns a bridge's `spoof_guard` on or off. A port of the file declared as a
//! `[[bridge.port]]` takes its addresses (and MAC, if given) from the file instead, at every
//! start, takeover and reload.

use std::net::IpAddr;

use tapyard::l2::guard::PortGuard;
use tapyard::PortId;

use crate::config::values::parse_mac;
use crate::config::Config;
use crate::node::Node;
use crate::ports::{Origin, PortEntry, PortError};

/// The guard a port of `bridge` with MAC `mac` and addresses `ips` gets under `cfg`: none
/// without addresses or with the bridge's `spoof_guard` off.
pub(super) fn guard_in(
    cfg: &Config,
    bridge: &str,
    mac: &str,
    ips: &[IpAddr],
) -> Result<Option<PortGuard>, PortError> {
    let on = cfg
        .bridges
        .iter()
        .find(|b| b.name == bridge)
        .is_some_and(|b| b.spoof_guard);
    if ips.is_empty() || !on {
        return Ok(None);
    }
    let m = parse_mac(mac).map_err(|e| PortError::field("mac", mac, e))?;
    let list = || {
        ips.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",")
    };
    PortGuard::new(m, ips.iter().copied())
        .map(Some)
        .map_err(|e| PortError::field("ips", &list(), format!("refused: {e}")))
}

/// A port's guard under `cfg`: a port of the file with a `[[bridge.port]]` takes its
/// addresses and MAC from there (the file is their only source: a restart, a takeover
/// and a reload all read it), any other its recorded ones and its TAP's MAC.
pub(super) fn guard_of(cfg: &Config, e: &PortEntry) -> Result<Option<PortGuard>, PortError> {
    let bridge = e.bridge.as_deref().unwrap_or("");
    let tap_mac = e.link.as_ref().map_or("", |l| l.mac.as_str());
    let def = match e.origin {
        Origin::Config => cfg.port_def(bridge, &e.name),
        _ => None,
    };
    match def {
        Some(d) => {
            let mac = d.mac.map_or_else(|| tap_mac.to_string(), |m| m.to_string());
            guard_in(cfg, bridge, &mac, &d.ips)
        }
        None => guard_in(cfg, bridge, tap_mac, &e.ips),
    }
}

impl Node {
    /// [`guard_in`] the running configuration. Locks it only for a port with addresses (a
    /// reload, which holds it, adds the file's ports without, then sets their guards).
    pub(super) fn guard_for(
        &self,
        bridge: &str,
        mac: &str,
        ips: &[IpAddr],
    ) -> Result<Option<PortGuard>, PortError> {
        if ips.is_empty() {
            return Ok(None);
        }
        let cfg = self.current.lock().unwrap_or_else(|e| e.into_inner());
        guard_in(&cfg, bridge, mac, ips)
    }

    /// Gives datapath port `id` (called `name`) its guard, or none.
    pub(super) fn set_guard(
        &self,
        name: &str,
        id: PortId,
        guard: Option<&PortGuard>,
    ) -> Result<(), PortError> {
        self.dp
            .control()
            .set_port_guard(id, guard.copied())
            .map_err(|source| PortError::Datapath {
                what: format!("port {name:?}: cannot set its spoof guard"),
                source: Box::new(source),
            })
    }

    /// Sets the guard of every bridge port for which `which(bridge, port)` holds as `cfg`
    /// says; returns one line per port whose guard changed, or the refusals.
    pub(super) fn apply_guards(
        &self,
        cfg: &Config,
        which: impl Fn(&str, &str) -> bool,
    ) -> Vec<Result<String, String>> {
        let mut out = Vec::new();
        for e in self.ports.list() {
            let Some(b) = e.bridge.clone() else {
                continue;
            };
            if !which(&b, &e.name) {
                continue;
            }
            let e = match self.follow_mac(cfg, &b, e) {
                Ok((e, line)) => {
                    out.extend(line.map(Ok));
                    e
                }
                Err(err) => {
                    out.push(Err(err));
                    continue;
                }
            };
            match guard_of(cfg, &e) {
                Ok(None) if self.dp.control().port_guard(e.id).is_none() => {}
                Ok(g) => out.push(self.set_guard(&e.name, e.id, g.as_ref()).map_or_else(
                    |err| Err(err.to_string()),
                    |()| {
                        Ok(format!(
                            "port {}: spoof guard {}",
                            e.name,
                            if g.is_some() { "on" } else { "off" }
                        ))
                    },
                )),
                Err(err) => out.push(Err(format!("port {}: {err}", e.name))),
            }
        }
        out
    }

    /// A port of the file whose `[[bridge.port]]` `mac` differs from its TAP's: the TAP takes
    /// it (through its own descriptor, wherever it lives now) before the guard does, so the
    /// pod keeps sending from an allowed MAC. The record (and a line saying so) follow.
    fn follow_mac(
        &self,
        cfg: &Config,
        bridge: &str,
        e: PortEntry,
    ) -> Result<(PortEntry, Option<String>), String> {
        let want = match e.origin {
            Origin::Config => cfg.port_def(bridge, &e.name).and_then(|d| d.mac),
            _ => None,
        };
        let (Some(want), Some(dev), Some(link)) = (want, &e.dev, &e.link) else {
            return Ok((e, None));
        };
        let now = want.to_string();
        if link.mac.eq_ignore_ascii_case(&now) {
            return Ok((e, None));
        }
        dev.set_mac(want).map_err(|err| {
            format!(
                "port {}: mac {now}: cannot set it on its TAP: {err}",
                e.name
            )
        })?;
        let line = format!("port {}: mac {} -> {now}", e.name, link.mac);
        self.ports.update(e.id, |r| {
            if let Some(l) = r.link.as_mut() {
                l.mac = now.clone();
            }
        });
        self.save_ports();
        let mut e = e;
        if let Some(l) = e.link.as_mut() {
            l.mac = now;
        }
        Ok((e, Some(line)))
    }
}
