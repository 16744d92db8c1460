//! The cross-checks of a Service's `load_balancer_ips`, `external_ips` and
//! `load_balancer_source_ranges`.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};

use super::super::{proto_name, Diag, ServiceCfg};

/// Frontends taken so far: (address, port, protocol) → (service, line).
pub(super) type Frontends = HashMap<(IpAddr, u16, u8), (String, usize)>;

fn family(ip: &IpAddr) -> &'static str {
    if ip.is_ipv6() {
        "IPv6"
    } else {
        "IPv4"
    }
}

/// Each LoadBalancer or external IP of a family the Service has a ClusterIP of, listed once
/// and not its ClusterIP, and no other Service's frontend on the same port and protocol
/// (`frontends`, which it joins); a warning for one inside a connected subnet (`link`: the
/// interface whose subnet holds an address), which tapyard answers no ARP or NDP for, and for
/// source ranges that filter nothing.
pub(super) fn check(
    s: &ServiceCfg,
    ctx: &str,
    frontends: &mut Frontends,
    link: &dyn Fn(IpAddr) -> Option<String>,
    err: &mut dyn FnMut(usize, String),
    warnings: &mut Vec<Diag>,
) {
    let mut own: Vec<IpAddr> = s.cluster_ips.clone();
    let lists = [
        ("load_balancer_ips", &s.load_balancer_ips),
        ("external_ips", &s.external_ips),
    ];
    for (key, ips) in lists {
        for (i, ip) in ips.iter().enumerate() {
            let line = s.lines.of(&format!("{key}.{i}"));
            let at = format!("{ctx}: {key}[{i}] = \"{ip}\"");
            if !s.cluster_ips.iter().any(|c| c.is_ipv6() == ip.is_ipv6()) {
                let fam = family(ip);
                err(line, format!("{at} is {fam} but the Service has no {fam} cluster_ip (a frontend needs a ClusterIP of its family, as in kube-proxy)"));
                continue;
            }
            if own.contains(ip) {
                err(
                    line,
                    format!("{at} is listed twice, or is the Service's cluster_ip"),
                );
                continue;
            }
            own.push(*ip);
            match frontends.get(&(*ip, s.port, s.proto)) {
                Some((first, l)) => err(
                    line,
                    format!(
                        "{at}: {}/{} is already service {first:?}'s (line {l})",
                        SocketAddr::new(*ip, s.port),
                        proto_name(s.proto)
                    ),
                ),
                None => {
                    frontends.insert((*ip, s.port, s.proto), (s.name.clone(), line));
                }
            }
            if let Some(n) = link(*ip) {
                warnings.push(Diag {
                    line,
                    warning: true,
                    msg: format!("{at} is inside {n}'s connected subnet: tapyard answers no ARP or NDP for it, so clients on that link must route it through this node"),
                });
            }
        }
    }
    let ranges = &s.load_balancer_source_ranges;
    if ranges.is_empty() {
        return;
    }
    let line = s.lines.of("load_balancer_source_ranges");
    if s.load_balancer_ips.is_empty() {
        warnings.push(Diag {
            line,
            warning: true,
            msg: format!("{ctx}: load_balancer_source_ranges has no effect without load_balancer_ips (node ports, external IPs and ClusterIPs are not filtered)"),
        });
        return;
    }
    for ip in &s.load_balancer_ips {
        if !ranges.iter().any(|r| r.addr().is_ipv6() == ip.is_ipv6()) {
            let fam = family(ip);
            warnings.push(Diag {
                line,
                warning: true,
                msg: format!("{ctx}: load_balancer_source_ranges has no {fam} range: load_balancer_ips {ip} is open to every {fam} client (each family is filtered by its own ranges, as in kube-proxy)"),
            });
        }
    }
}
