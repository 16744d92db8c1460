//! The node-level NAT keys a reload applies live (`[node] masquerade_all`, `random_fully`,
//! `node_port_addresses`): part of the NAT rules, set anew as a whole; established
//! connections keep their translation.

use super::{Diff, Item};
use crate::config::Config;

/// The changes of the node-level NAT keys.
pub(super) fn nat_changes(old: &Config, new: &Config, d: &mut Diff) {
    let (o, n) = (&old.node, &new.node);
    let mut change = |line: String| {
        d.push(Item::NatRules, line);
        d.nat_rules = true;
    };
    if o.masquerade_all != n.masquerade_all {
        change(format!(
            "node.masquerade_all {} -> {}",
            o.masquerade_all, n.masquerade_all
        ));
    }
    if o.random_fully != n.random_fully {
        change(format!(
            "node.random_fully {} -> {}",
            o.random_fully, n.random_fully
        ));
    }
    if o.node_port_addresses != n.node_port_addresses {
        change(format!(
            "node.node_port_addresses {} -> {}",
            list(&o.node_port_addresses),
            list(&n.node_port_addresses)
        ));
    }
}

/// `node_port_addresses` as `[a, b]`, or `all` when empty.
pub fn list(v: &[crate::config::IpCidr]) -> String {
    if v.is_empty() {
        return "all".into();
    }
    let v: Vec<String> = v.iter().map(ToString::to_string).collect();
    format!("[{}]", v.join(", "))
}

/// The running configuration keeps `old`'s node-level NAT keys (their change was refused).
pub(super) fn keep_old(run: &mut Config, old: &Config) {
    run.node.masquerade_all = old.node.masquerade_all;
    run.node.random_fully = old.node.random_fully;
    run.node
        .node_port_addresses
        .clone_from(&old.node.node_port_addresses);
}
