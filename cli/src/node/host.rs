//! The host port's kernel side (`[[host]]`): the TAP in tapyard's own namespace is the node's
//! way into tapyard, as Antrea's `antrea-gw0`. tapyard's side is a router interface with the
//! `gateway` address (a /32); the kernel's side holds the node's `address` as a /32 and routes
//! the cluster CIDR, the Service CIDR and the `routes` via `gateway`, which it reaches by a
//! link route `gateway/32 dev <tap>`. Setting them again is harmless: each start, restart and
//! takeover does it, so a persistent TAP that kept them (or lost them) ends up the same.

use std::net::IpAddr;

use tapyard_cni::netlink::Netlink;
use tapyard_cni::types::Cidr as NlCidr;

use crate::config::{Config, HostCfg, IpCidr};

use super::NodeError;

/// The prefixes the kernel routes through host port `h`: the IPv4 cluster CIDR, the IPv4
/// Service CIDR and `h.routes`, as the kernel's routes (host bits cleared).
pub(super) fn kernel_routes(cfg: &Config, h: &HostCfg) -> Vec<NlCidr> {
    let v4 = |c: crate::config::Cidr| NlCidr {
        addr: IpAddr::V4(c.network()),
        prefix_len: c.len,
    };
    cfg.node
        .cluster_cidr
        .into_iter()
        .chain(cfg.node.service_cidr)
        .map(v4)
        .chain(h.routes.iter().filter_map(|r| match r {
            IpCidr::V4(c) => Some(v4(*c)),
            IpCidr::V6(_) => None,
        }))
        .collect()
}

/// Sets up the kernel side of every `[[host]]` of `cfg` (its TAP opened already): MTU, up,
/// the node's address, `rp_filter` loose, the link route to tapyard's side and the routes
/// through it. A prefix the kernel already routes another way is left so, with a warning.
pub(super) fn configure(cfg: &Config) -> Result<(), NodeError> {
    for h in &cfg.hosts {
        let what = format!("host {:?}", h.name);
        let refused =
            |step: &str, e: std::io::Error| NodeError::refused(format!("{what}: {step}"), e);
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
        if link.mtu != u32::from(h.mtu) {
            nl.set_mtu(link.index, u32::from(h.mtu))
                .map_err(|e| refused("MTU", e))?;
        }
        nl.set_up(link.index).map_err(|e| refused("up", e))?;
        // Loose reverse-path filtering: pods' and masqueraded sources come in on it, and with
        // `routes` the outside world's too.
        let rpf = format!("/proc/sys/net/ipv4/conf/{}/rp_filter", h.name);
        if let Err(e) = std::fs::write(&rpf, "2") {
            log::warn!("{what}: cannot set {rpf} to 2 (loose): {e}");
        }
        let node = NlCidr {
            addr: IpAddr::V4(h.address),
            prefix_len: 32,
        };
        nl.add_address(link.index, node)
            .map_err(|e| refused(&format!("address {}/32", h.address), e))?;
        let gw = NlCidr {
            addr: IpAddr::V4(h.gateway),
            prefix_len: 32,
        };
        nl.add_route(link.index, gw, None)
            .map_err(|e| refused(&format!("route {}/32 dev {}", h.gateway, h.name), e))?;
        let wanted = kernel_routes(cfg, h);
        for dst in &wanted {
            nl.add_route(link.index, *dst, Some(IpAddr::V4(h.gateway)))
                .map_err(|e| refused(&format!("route {dst} via {}", h.gateway), e))?;
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
            "{what}: the kernel side holds {}/32 and routes {} via {} (tapyard's side)",
            h.address,
            if list.is_empty() {
                "nothing".into()
            } else {
                list.join(", ")
            },
            h.gateway
        );
    }
    Ok(())
}
