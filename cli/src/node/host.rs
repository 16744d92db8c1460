//! The host port's kernel side (`[[host]]`): the TAP in tapyard's own namespace is the node's
//! way into tapyard, as Antrea's `antrea-gw0`. tapyard's side is a router interface with the
//! `gateway` address (a /32); the kernel's side holds the node's `address` as a /32 and routes
//! the cluster CIDR, the Service CIDR and the `routes` via `gateway`, which it reaches by a
//! link route `gateway/32 dev <tap>`. Setting them again is harmless: each start, restart and
//! takeover does it, so a persistent TAP that kept them (or lost them) ends up the same.
//!
//! The node's own `<address>:<NodePort>`: the kernel delivers a connection to its own address
//! to itself, so it would never reach tapyard (kube-proxy catches it in OUTPUT). As Cilium
//! does, policy routing sends it to tapyard: the `local` table's rule moves from priority 0 to
//! [`LOCAL_PREF`], and before it one rule per host address, NodePort and protocol
//! (`to <address> iif lo ipproto tcp dport <NodePort> lookup 29817`, priority
//! [`NODEPORT_PREF`]) sends the node's own packets to [`NODEPORT_TABLE`], whose default
//! route is tapyard's side of the host port. The kernel side accepts the replies, whose
//! source is its own address (`accept_local`). The rules carry protocol [`RTPROT_TAPYARD`]:
//! a restart or a takeover finds them and keeps them (no duplicates), a reload adds and
//! removes them as Services come and go, a node without a host port (and `tapyard cleanup`)
//! removes them and puts the `local` rule back at 0 if tapyard moved it.

use std::net::IpAddr;

use tapyard_cni::netlink::{Link, Netlink, Rule};
use tapyard_cni::types::Cidr as NlCidr;

use crate::config::{Config, HostCfg, IpCidr};

use super::NodeError;

/// The prefixes of family `v6` the kernel routes through host port `h`
/// ([`HostCfg::kernel_routes`]), as the kernel's routes.
pub(super) fn kernel_routes(cfg: &Config, h: &HostCfg, v6: bool) -> Vec<NlCidr> {
    h.kernel_routes(&cfg.node)
        .into_iter()
        .filter(|c| c.is_v6() == v6)
        .map(nl_cidr)
        .collect()
}

/// A prefix as the kernel's.
fn nl_cidr(c: IpCidr) -> NlCidr {
    NlCidr {
        addr: c.addr(),
        prefix_len: c.prefix_len(),
    }
}

/// A reload's change of the kernel side's routes (`routes`, the cluster and Service CIDRs):
/// `removed` deleted, `added` added, via tapyard's side of their family. One line per change.
pub(super) fn apply_routes(
    cfg: &Config,
    removed: &[IpCidr],
    added: &[IpCidr],
) -> Result<Vec<String>, NodeError> {
    let mut done = Vec::new();
    for h in &cfg.hosts {
        let (what, mut nl, link) = open_link(h)?;
        let refused =
            |step: &str, e: std::io::Error| NodeError::refused(format!("{what}: {step}"), e);
        let gw = |c: &IpCidr| {
            h.sides()
                .find(|(a, _)| a.is_ipv6() == c.is_v6())
                .map(|s| s.1)
        };
        for c in removed {
            nl.del_route(link.index, nl_cidr(*c), gw(c))
                .map_err(|e| refused(&format!("cannot delete route {c}"), e))?;
            done.push(format!(
                "{what}: the kernel no longer routes {c} through it"
            ));
        }
        for c in added {
            let Some(gw) = gw(c) else { continue };
            nl.add_route(link.index, nl_cidr(*c), Some(gw))
                .map_err(|e| refused(&format!("route {c} via {gw}"), e))?;
            done.push(format!("{what}: the kernel routes {c} via {gw}"));
        }
    }
    Ok(done)
}

/// Host port `h`'s name for messages (`host "NAME"`), an rtnetlink socket and its TAP.
fn open_link(h: &HostCfg) -> Result<(String, Netlink, Link), NodeError> {
    let what = format!("host {:?}", h.name);
    let refused = |step: &str, e: std::io::Error| NodeError::refused(format!("{what}: {step}"), e);
    let mut nl = Netlink::open().map_err(|e| refused("rtnetlink", e))?;
    let link = nl
        .link_by_name(&h.name)
        .map_err(|e| refused("cannot read its TAP", e))?
        .ok_or_else(|| {
            NodeError::Config(format!(
                "{what}: no TAP {:?} in tapyard's namespace",
                h.name
            ))
        })?;
    Ok((what, nl, link))
}

/// `addr/32` or `addr/128`.
fn host_cidr(addr: IpAddr) -> NlCidr {
    NlCidr {
        addr,
        prefix_len: if addr.is_ipv6() { 128 } else { 32 },
    }
}

/// Sets up the kernel side of every `[[host]]` of `cfg` (its TAP opened already): MTU, up,
/// `rp_filter` loose and `accept_local`, and per family the node's address, the link route
/// to tapyard's side, the routes through it and the NodePort table's default route. A prefix
/// the kernel already routes another way is left so, with a warning.
pub(super) fn configure(cfg: &Config) -> Result<(), NodeError> {
    for h in &cfg.hosts {
        let (what, mut nl, link) = open_link(h)?;
        let refused =
            |step: &str, e: std::io::Error| NodeError::refused(format!("{what}: {step}"), e);
        if link.mtu != u32::from(h.mtu) {
            nl.set_mtu(link.index, u32::from(h.mtu))
                .map_err(|e| refused("MTU", e))?;
        }
        nl.set_up(link.index).map_err(|e| refused("up", e))?;
        // Loose reverse-path filtering: pods' and masqueraded sources come in on it, and with
        // `routes` the outside world's too. `accept_local`: the replies of the node's
        // connections to its own NodePorts come back with its own address as their source.
        // (IPv6 has neither check.)
        if h.address.is_some() {
            for (key, value) in [("rp_filter", "2"), ("accept_local", "1")] {
                let path = format!("/proc/sys/net/ipv4/conf/{}/{key}", h.name);
                if let Err(e) = std::fs::write(&path, value) {
                    log::warn!("{what}: cannot set {path} to {value}: {e}");
                }
            }
        }
        for (node, gw) in h.sides() {
            let (node, gw) = (host_cidr(node), host_cidr(gw));
            nl.add_address(link.index, node)
                .map_err(|e| refused(&format!("address {node}"), e))?;
            nl.add_route(link.index, gw, None)
                .map_err(|e| refused(&format!("route {gw} dev {}", h.name), e))?;
            // The NodePort rules' table: everything via tapyard's side, from the node's address.
            let default = NlCidr {
                prefix_len: 0,
                ..node
            }
            .network();
            let (gw, node) = (gw.addr, node.addr);
            nl.add_route_in(NODEPORT_TABLE, link.index, default, Some(gw), Some(node))
                .map_err(|e| {
                    refused(
                        &format!("route {default} via {gw} src {node} table {NODEPORT_TABLE}"),
                        e,
                    )
                })?;
            let wanted = kernel_routes(cfg, h, node.is_ipv6());
            for dst in &wanted {
                nl.add_route(link.index, *dst, Some(gw))
                    .map_err(|e| refused(&format!("route {dst} via {gw}"), e))?;
            }
            let have = nl
                .routes()
                .map_err(|e| refused("cannot list the routes", e))?;
            for dst in &wanted {
                if !have
                    .iter()
                    .any(|r| r.dst == *dst && r.oif == Some(link.index))
                {
                    log::warn!(
                        "{what}: the kernel already routes {dst} another way: not through {}",
                        h.name
                    );
                }
            }
            let list: Vec<String> = wanted.iter().map(ToString::to_string).collect();
            log::info!(
                "{what}: the kernel side holds {} and routes {} via {gw} (tapyard's side)",
                host_cidr(node),
                if list.is_empty() {
                    "nothing".into()
                } else {
                    list.join(", ")
                },
            );
        }
    }
    Ok(())
}

/// The table the node's own NodePort connections are looked up in (`ip route show table
/// 29817`, 0x7479): a default route per family via tapyard's side of the host port.
pub(super) const NODEPORT_TABLE: u32 = 0x7479;
/// The priority of the NodePort rules: before the `local` table's rule.
pub(super) const NODEPORT_PREF: u32 = 99;
/// The priority the `local` table's rule is moved to (from 0).
pub(super) const LOCAL_PREF: u32 = 100;
/// The `protocol` of the rules tapyard adds (`ip rule` shows `proto 116`): how a restart knows
/// them.
pub(super) const RTPROT_TAPYARD: u8 = 0x74;
/// The kernel's `local` table.
const RT_TABLE_LOCAL: u32 = 255;
/// The kernel's own rules' `protocol`.
const RTPROT_KERNEL: u8 = 2;

/// The addresses the kernel side of host port `h` holds.
fn host_addrs(h: &HostCfg) -> impl Iterator<Item = IpAddr> + '_ {
    h.sides().map(|(a, _)| a)
}

/// A rule that looks `table` up at `priority` for every packet of the family, marked
/// `protocol`.
fn table_rule(v6: bool, priority: u32, table: u32, protocol: u8) -> Rule {
    Rule {
        v6,
        priority,
        table,
        dst: None,
        iif: None,
        ip_proto: None,
        dport: None,
        protocol,
        other: false,
    }
}

/// The rules that send the node's own connections to its `<address>:<NodePort>` to the host
/// port: one per host address, Service with a node port of that address's family (it has a
/// ClusterIP of the family), and protocol; in the config's order, without repeats.
pub(super) fn nodeport_rules(cfg: &Config) -> Vec<Rule> {
    let mut out: Vec<Rule> = Vec::new();
    for addr in cfg.hosts.iter().flat_map(|h| host_addrs(h)) {
        for s in &cfg.services {
            let Some(port) = s.node_port else { continue };
            if !s
                .cluster_ips
                .iter()
                .any(|ip| ip.is_ipv6() == addr.is_ipv6())
            {
                continue;
            }
            let r = Rule {
                dst: Some(host_cidr(addr)),
                iif: Some("lo".into()),
                ip_proto: Some(s.proto),
                dport: Some(port),
                ..table_rule(
                    addr.is_ipv6(),
                    NODEPORT_PREF,
                    NODEPORT_TABLE,
                    RTPROT_TAPYARD,
                )
            };
            if !out.contains(&r) {
                out.push(r);
            }
        }
    }
    out
}

/// Brings the kernel's policy rules in line with `cfg` (its host port and Services' node
/// ports): tapyard's rules no longer wanted (or there twice) go, the missing ones are added;
/// the `local` table's rule of each family the host port holds an address of is moved to
/// [`LOCAL_PREF`] (if it is at 0), and put back at 0 when no host port holds one any more (if
/// tapyard moved it). One line per change.
pub(super) fn sync_rules(cfg: &Config) -> Result<Vec<String>, NodeError> {
    let families = [false, true].map(|v6| {
        cfg.hosts
            .iter()
            .flat_map(|h| host_addrs(h))
            .any(|a| a.is_ipv6() == v6)
    });
    sync(&nodeport_rules(cfg), families)
}

/// Removes every rule tapyard added and puts the `local` table's rule back at 0 where tapyard
/// moved it (`tapyard cleanup`). One line per change.
pub fn remove_rules() -> Result<Vec<String>, NodeError> {
    sync(&[], [false, false])
}

/// [`sync_rules`]: `wanted` are the NodePort rules, `moved[v6]` whether the family's `local`
/// rule is to be at [`LOCAL_PREF`].
fn sync(wanted: &[Rule], moved: [bool; 2]) -> Result<Vec<String>, NodeError> {
    let refused =
        |step: String, e: std::io::Error| NodeError::refused(format!("host port: {step}"), e);
    let mut nl = Netlink::open().map_err(|e| refused("rtnetlink".into(), e))?;
    let have = nl
        .rules()
        .map_err(|e| refused("cannot list the policy rules".into(), e))?;
    let mut done = Vec::new();
    let ip = |v6: bool| if v6 { "ip -6 rule" } else { "ip rule" };
    // tapyard's NodePort rules: the wanted ones are kept (once), the others removed.
    let mut kept: Vec<&Rule> = Vec::new();
    for r in have
        .iter()
        .filter(|r| r.protocol == RTPROT_TAPYARD && r.table == NODEPORT_TABLE)
    {
        if wanted.contains(r) && !kept.contains(&r) {
            kept.push(r);
            continue;
        }
        nl.del_rule(r)
            .map_err(|e| refused(format!("cannot delete {} {}", ip(r.v6), r.describe()), e))?;
        done.push(format!("{} {} removed", ip(r.v6), r.describe()));
    }
    // The `local` table's rule, per family: moved before the NodePort rules are added (so
    // they come first), put back after they are gone.
    for v6 in [false, true] {
        let local = |r: &&Rule| {
            r.v6 == v6
                && r.table == RT_TABLE_LOCAL
                && *r == &table_rule(v6, r.priority, r.table, r.protocol)
        };
        let at0 = have.iter().filter(local).find(|r| r.priority == 0);
        let ours = table_rule(v6, LOCAL_PREF, RT_TABLE_LOCAL, RTPROT_TAPYARD);
        let ours_there = have.contains(&ours);
        if moved[usize::from(v6)] {
            if let Some(at0) = at0 {
                nl.add_rule(&ours).map_err(|e| {
                    refused(format!("cannot add {} {}", ip(v6), ours.describe()), e)
                })?;
                nl.del_rule(at0).map_err(|e| {
                    refused(format!("cannot delete {} {}", ip(v6), at0.describe()), e)
                })?;
                done.push(format!(
                    "{}: the local table's rule moved from pref 0 to {LOCAL_PREF}",
                    ip(v6)
                ));
            } else if !ours_there {
                let first = have.iter().filter(local).map(|r| r.priority).min();
                if first.is_some_and(|p| p <= NODEPORT_PREF) {
                    log::warn!(
                        "{}: the local table is looked up at pref {} (not 0, not tapyard's {LOCAL_PREF}): before the NodePort rules at {NODEPORT_PREF}, so the node's own <address>:<NodePort> stays local",
                        ip(v6),
                        first.unwrap_or_default()
                    );
                }
            }
        } else if ours_there {
            if at0.is_none() {
                let back = table_rule(v6, 0, RT_TABLE_LOCAL, RTPROT_KERNEL);
                nl.add_rule(&back).map_err(|e| {
                    refused(format!("cannot add {} {}", ip(v6), back.describe()), e)
                })?;
            }
            nl.del_rule(&ours)
                .map_err(|e| refused(format!("cannot delete {} {}", ip(v6), ours.describe()), e))?;
            done.push(format!(
                "{}: the local table's rule back at pref 0 (from {LOCAL_PREF})",
                ip(v6)
            ));
        }
    }
    for r in wanted.iter().filter(|r| !kept.contains(r)) {
        nl.add_rule(r)
            .map_err(|e| refused(format!("cannot add {} {}", ip(r.v6), r.describe()), e))?;
        done.push(format!("{} {} added", ip(r.v6), r.describe()));
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_rule_per_host_address_node_port_and_protocol() {
        let src = r#"[node]
name = "n"
cluster_cidr = "10.244.0.0/16"
service_cidr = "10.96.0.0/12"

[[uplink]]
name = "eth0"
address = "172.18.0.2/24"

[[host]]
name = "tapyard0"
address = "172.18.0.2"

[[service]]
name = "a"
cluster_ip = "10.96.0.10"
port = 80
node_port = 30080
endpoints = ["172.18.0.9:80"]

[[service]]
name = "a-udp"
cluster_ip = "10.96.0.10"
port = 80
protocol = "udp"
node_port = 30080
endpoints = ["172.18.0.9:80"]

[[service]]
name = "no-node-port"
cluster_ip = "10.96.0.11"
port = 80
endpoints = ["172.18.0.9:80"]
"#;
        let ch = crate::config::check_str(src);
        assert!(ch.diags.is_empty(), "{:?}", ch.diags);
        let cfg = ch.config.unwrap();
        let got: Vec<String> = nodeport_rules(&cfg)
            .iter()
            .map(|r| {
                assert_eq!((r.v6, r.protocol, r.other), (false, RTPROT_TAPYARD, false));
                r.describe()
            })
            .collect();
        assert_eq!(
            got,
            [
                "pref 99 to 172.18.0.2/32 iif lo ipproto 6 dport 30080 lookup 29817",
                "pref 99 to 172.18.0.2/32 iif lo ipproto 17 dport 30080 lookup 29817",
            ]
        );
        let mut none = cfg.clone();
        none.hosts.clear();
        assert!(nodeport_rules(&none).is_empty());
    }
}
