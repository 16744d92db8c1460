//! A reload: the new file's differences applied to the running node.

use tapyard_cni::netlink::Netlink;

use crate::config::diff::{self, Diff, Item, Refusal};
use crate::config::{self, Config, RouteCfg};
use crate::ports::Origin;

use super::plan::tap_mtu;
use super::translate::{
    add_neighbor, add_peer, add_route, apply_services_named, remove_neighbor, remove_route,
};
use super::{to_nat_rules, Node, Reloaded};

impl Node {
    /// Re-reads the configuration file and applies what changed. Returns the changes made
    /// and those the library refused ([`Reloaded`]), or the reasons the whole file was
    /// refused (its errors, or changes that need a restart; then nothing changes).
    ///
    /// The configuration recorded as running ([`Node::current`]) is what runs: the file,
    /// with each refused change left as it was before ([`diff::running`]). So a reload of
    /// the same file retries what was refused, and says so.
    pub fn reload(&self) -> Result<Reloaded, Vec<String>> {
        let file = self.config_path.display().to_string();
        let checked = config::load(&self.config_path);
        let Some(new) = checked.config else {
            return Err(checked.errors().map(|d| d.render(&file)).collect());
        };
        let mut cur = self.current.lock().unwrap_or_else(|e| e.into_inner());
        let mut last = self.refused.lock().unwrap_or_else(|e| e.into_inner());
        let d = diff::diff(&cur, &new)?;
        if d.is_empty() {
            // What was refused last time is no longer in the file.
            last.clear();
            return Ok(Reloaded::default());
        }
        let refusals = self.apply(&d, &new);
        let mut out = Reloaded::default();
        for (line, item) in d.summary.iter().zip(&d.items) {
            let before = last.iter().find(|r| &r.item == item);
            let now: Vec<&str> = refusals
                .iter()
                .filter(|r| &r.item == item)
                .map(|r| r.reason.as_str())
                .collect();
            match (now.is_empty(), before) {
                (true, None) => out.changes.push(line.clone()),
                (true, Some(_)) => out
                    .changes
                    .push(format!("{line} (retried: refused at the last reload)")),
                (false, b) => out.refused.push(format!(
                    "{line}: refused{}: {}",
                    if b.is_some() { " again" } else { "" },
                    now.join("; ")
                )),
            }
        }
        for r in &refusals {
            if !d.touches(&r.item) {
                out.refused
                    .push(format!("{}: refused: {}", r.item, r.reason));
            }
        }
        *cur = diff::running(&cur, &new, &refusals);
        *last = refusals;
        // The node's own NodePorts: its policy rules follow the Services that run.
        if d.services.is_some() {
            match super::host::sync_rules(&cur) {
                Ok(lines) => {
                    for line in lines {
                        log::info!("{line}");
                    }
                }
                Err(e) => out.refused.push(e.to_string()),
            }
        }
        Ok(out)
    }

    /// Applies a diff: removals first, then additions; returns what the library refused.
    fn apply(&self, d: &Diff, new: &Config) -> Vec<Refusal> {
        let mut errors = Vec::new();
        let refuse = |item: Item, reason: String, old_kept: bool| Refusal {
            item,
            reason,
            old_kept,
        };
        for (bridge, name) in &d.ports_removed {
            let _change = self.ports.changing();
            match self.ports.by_name(name) {
                Some(e) if e.origin == Origin::Config => {
                    if let Err(e) = self.port_remove(e) {
                        errors.push(refuse(
                            Item::Port(bridge.clone(), name.clone()),
                            e.to_string(),
                            true,
                        ));
                    }
                }
                _ => {
                    log::warn!("port {name:?} of bridge {bridge:?}: not running, nothing to remove")
                }
            }
        }
        for (bridge, name) in &d.ports_added {
            // Its guard, if it has a [[bridge.port]], is set with the others' below.
            let mac = new
                .port_def(bridge, name)
                .and_then(|d| d.mac)
                .map(|m| m.to_string());
            match self.port_add_local(bridge, name, mac.as_deref(), Vec::new(), Origin::Config) {
                Ok(e) => {
                    // The bridge's MTU, as the ports it started with.
                    let mtu = u32::from(tap_mtu(new, name, Some(bridge)));
                    if let (Some(l), Ok(mut nl)) = (&e.link, Netlink::open()) {
                        if l.mtu != mtu {
                            if let Err(err) = nl.set_mtu(l.index, mtu) {
                                log::warn!("TAP {}: cannot set its MTU to {mtu}: {err}", e.tap);
                            }
                        }
                    }
                }
                Err(e) => errors.push(refuse(
                    Item::Port(bridge.clone(), name.clone()),
                    format!("bridge {bridge:?}: port {name:?}: {e}"),
                    false,
                )),
            }
        }
        let same_key = |a: &RouteCfg, b: &RouteCfg| a.to == b.to && a.metric == b.metric;
        for r in &d.routes_removed {
            // A changed route is replaced in one update below: no window without it.
            if d.routes_added.iter().any(|n| same_key(n, r)) {
                continue;
            }
            if let Err(e) = remove_route(&self.dp, r) {
                errors.push(refuse(Item::Route(r.to, r.metric), e.to_string(), true));
            }
        }
        for r in &d.routes_added {
            let replace = d.routes_removed.iter().any(|o| same_key(o, r));
            // A refused replacement leaves the old route in place.
            if let Err(e) = add_route(&self.dp, new, r, replace) {
                errors.push(refuse(Item::Route(r.to, r.metric), e.to_string(), true));
            }
        }
        // A removed peer stops at once: nothing is sent to it or accepted from it from the
        // workers' next batch on.
        for (v, p) in &d.peers_removed {
            if let Err(e) = self.dp.control().remove_vxlan_peer(v, p.node_ip) {
                let e = format!("vxlan {v:?}: peer {}: {e}", p.node_ip);
                errors.push(refuse(
                    Item::Peer(v.clone(), p.node_ip),
                    e.to_string(),
                    true,
                ));
            }
        }
        for (v, p) in &d.peers_added {
            if let Err(e) = add_peer(&self.dp, v, p, self.now()) {
                errors.push(refuse(
                    Item::Peer(v.clone(), p.node_ip),
                    e.to_string(),
                    false,
                ));
            }
        }
        for n in &d.neighbors_removed {
            if let Err(e) = remove_neighbor(&self.dp, n) {
                errors.push(refuse(
                    Item::Neighbor(n.dev.clone(), n.ip),
                    e.to_string(),
                    true,
                ));
            }
        }
        let now = self.now();
        for n in &d.neighbors_added {
            if let Err(e) = add_neighbor(&self.dp, n, now) {
                errors.push(refuse(
                    Item::Neighbor(n.dev.clone(), n.ip),
                    e.to_string(),
                    false,
                ));
            }
        }
        if d.nat_rules {
            if let Some(nf) = self.dp.control().netfilter() {
                match to_nat_rules(new, |n| self.dp.control().iface_by_name(n)) {
                    Ok(rules) => {
                        nf.set_rules(rules);
                        // Flows the new rules leave stale (to a node port on an address that
                        // starts answering it), as kube-proxy's next sync cleans them.
                        let n = nf.flush_stale_udp(self.now());
                        if n > 0 {
                            log::info!("reload: {n} stale UDP flow(s) to Services flushed");
                        }
                    }
                    Err(e) => errors.push(refuse(Item::NatRules, e.to_string(), true)),
                }
            }
        }
        // The host port's kernel side: the prefixes it routes through the port.
        if !d.host_routes_removed.is_empty() || !d.host_routes_added.is_empty() {
            match super::host::apply_routes(new, &d.host_routes_removed, &d.host_routes_added) {
                Ok(lines) => lines.iter().for_each(|l| log::info!("{l}")),
                Err(e) => errors.push(refuse(Item::HostRoutes, e.to_string(), true)),
            }
        }
        // A bridge's spoof_guard (its ports' guards set or cleared) and a [[bridge.port]]'s
        // ips or mac (that port's guard set anew): one step each, traffic untouched.
        let bridges = d
            .guards
            .iter()
            .map(|(b, _)| (Item::SpoofGuard(b.clone()), b, None));
        let ports = d.port_guards.iter().map(|(b, p)| {
            let item = Item::PortGuard(b.clone(), p.clone());
            (item, b, Some(p))
        });
        for (item, bridge, port) in bridges.chain(ports) {
            let which = |b: &str, p: &str| b == bridge && port.is_none_or(|w| w == p);
            for r in self.apply_guards(new, which) {
                match r {
                    Ok(line) => log::info!("{line}"),
                    Err(e) => errors.push(refuse(item.clone(), e, true)),
                }
            }
        }
        if let Some(s) = &d.services {
            match apply_services_named(self, s) {
                Ok(done) => {
                    for line in done {
                        log::debug!("{line}");
                    }
                }
                Err(e) => errors.extend(
                    e.into_iter()
                        .map(|(name, e)| refuse(Item::Service(name), e, true)),
                ),
            }
        }
        if d.touches(&Item::HealthzPort) {
            self.set_healthz_port(new.node.healthz_port);
        }
        errors
    }
}
