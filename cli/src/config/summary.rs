//! `tapyard check`'s one-line summary of a valid configuration.

use super::Config;

/// A count of what a valid config holds, for `check`'s summary.
pub fn summary(c: &Config) -> String {
    let ports: usize = c.bridges.iter().map(|b| b.ports.len()).sum();
    let plural = |n: usize, w: &str| format!("{n} {w}{}", if n == 1 { "" } else { "s" });
    let parts = [
        plural(c.bridges.len(), "bridge"),
        plural(ports, "port"),
        plural(c.uplinks.len(), "uplink"),
        plural(c.routes.len(), "route"),
        plural(c.neighbors.len(), "static neighbour"),
        plural(c.services.len(), "service"),
    ];
    let mut s = format!("node {:?}: {}", c.node.name, parts.join(", "));
    if !c.vxlans.is_empty() {
        let peers: usize = c.vxlans.iter().map(|v| v.peers.len()).sum();
        s += &format!(
            ", {} ({})",
            plural(c.vxlans.len(), "vxlan interface"),
            plural(peers, "peer")
        );
    }
    if let Some(h) = c.hosts.first() {
        let addrs: Vec<String> = h.sides().map(|(a, _)| a.to_string()).collect();
        s += &format!(", host port {:?} ({})", h.name, addrs.join(", "));
    }
    s
}
