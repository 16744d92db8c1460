//! The cross-checks of the host port (`[[host]]`) and `node.service_cidr`.

use std::collections::HashMap;
use std::net::IpAddr;

use super::super::{Cidr, Cidr6, Config, Diag, HostCfg, IpCidr};

/// Whether `ip` is an address the host port's kernel side holds (a Service endpoint there
/// is a socket of the node itself).
pub(super) fn holds(c: &Config, ip: IpAddr) -> bool {
    c.hosts.iter().any(|h| h.sides().any(|(a, _)| a == ip))
}

/// The prefixes of both families of an interface with `v4` and `v6` (either may be absent).
fn both(v4: Option<Cidr>, v6: Option<Cidr6>) -> impl Iterator<Item = IpCidr> {
    v4.map(IpCidr::V4).into_iter().chain(v6.map(IpCidr::V6))
}

/// At most one `[[host]]`; its name free; per family, its address and gateway outside the
/// pods' and the Services' addresses and the links' subnets; its routes of the families it
/// has an address of; ClusterIPs inside `service_cidr`. `names` are the interface names
/// taken (bridges, their ports, uplinks).
pub(super) fn check(
    c: &Config,
    names: &HashMap<String, (usize, String)>,
    err: &mut dyn FnMut(usize, String),
    warnings: &mut Vec<Diag>,
) {
    for extra in c.hosts.iter().skip(1) {
        err(
            extra.lines.of("name"),
            format!(
                "host {:?}: a node has at most one [[host]] (the first is {:?}, line {})",
                extra.name,
                c.hosts[0].name,
                c.hosts[0].lines.of("name")
            ),
        );
    }
    let uplink_taps = c.uplinks.iter().map(|u| (&u.tap, &u.name));
    let vxlans = c.vxlans.iter().map(|v| (&v.name, &v.name));
    for h in &c.hosts {
        let ctx = format!("host {:?}", h.name);
        if let Some((l, first)) = names.get(&h.name) {
            err(
                h.lines.of("name"),
                format!(
                    "{ctx}: name {:?} is already used by {first} (line {l}); names must be unique",
                    h.name
                ),
            );
        } else if let Some((_, owner)) = uplink_taps
            .clone()
            .chain(vxlans.clone())
            .find(|(n, _)| **n == h.name)
        {
            err(
                h.lines.of("name"),
                format!(
                    "{ctx}: name {:?} is already used by {owner:?}; names must be unique",
                    h.name
                ),
            );
        }
        let inside = |ip: IpAddr| -> Option<String> {
            let cluster = both(c.node.cluster_cidr, c.node.cluster_cidr6);
            if let Some(cc) = cluster.into_iter().find(|cc| cc.contains(ip)) {
                return Some(format!("inside node.cluster_cidr {cc} (pod addresses)"));
            }
            let services = both(c.node.service_cidr, c.node.service_cidr6);
            if let Some(sc) = services.into_iter().find(|sc| sc.contains(ip)) {
                return Some(format!("inside node.service_cidr {sc} (ClusterIPs)"));
            }
            c.bridges
                .iter()
                .find(|b| both(b.address, b.address6).any(|a| a.contains(ip)))
                .map(|b| format!("inside bridge {:?}'s subnet", b.name))
        };
        for (addr, gw) in h.sides() {
            let like = if gw.is_ipv6() {
                IpAddr::from(HostCfg::GATEWAY6)
            } else {
                HostCfg::GATEWAY.into()
            };
            if let Some(why) = inside(addr) {
                err(
                    h.lines.of("address"),
                    format!("{ctx}: address = \"{addr}\" is {why}; the host port's address is the node's own (its InternalIP)"),
                );
            }
            let gw_taken = c
                .connected()
                .iter()
                .find(|i| both(i.address, i.address6).any(|a| a.contains(gw)))
                .map(|i| format!("inside {}'s subnet", i.name));
            if gw == addr {
                err(
                    h.lines.of("gateway"),
                    format!("{ctx}: gateway = \"{gw}\" is its address too; tapyard's side needs an address of its own (like \"{like}\")"),
                );
            } else if let Some(why) = inside(gw).or(gw_taken) {
                err(
                    h.lines.of("gateway"),
                    format!("{ctx}: gateway = \"{gw}\" is {why}; tapyard's side of the host port needs an address no link uses (like \"{like}\")"),
                );
            }
        }
        for (i, r) in h.routes.iter().enumerate() {
            let line = h.lines.of(&format!("routes.{i}"));
            let fam = if r.is_v6() { "IPv6" } else { "IPv4" };
            if !h.sides().any(|(a, _)| a.is_ipv6() == r.is_v6()) {
                err(
                    line,
                    format!(
                        "{ctx}: routes[{i}] = \"{r}\" is {fam} but address has no {fam} address"
                    ),
                );
            } else if r.addr() != r.network() {
                err(
                    line,
                    format!(
                        "{ctx}: routes[{i}] = \"{r}\" has host bits set (expected \"{}/{}\")",
                        r.network(),
                        r.prefix_len()
                    ),
                );
            }
        }
    }
    // A ClusterIP outside service_cidr is not routed to tapyard by the node's kernel.
    if c.hosts.is_empty() {
        return;
    }
    for s in &c.services {
        for (i, vip) in s.cluster_ips.iter().enumerate() {
            let outside = match vip {
                IpAddr::V4(v) => c.node.service_cidr.is_some_and(|sc| !sc.contains(*v)),
                IpAddr::V6(v) => c.node.service_cidr6.is_some_and(|sc| !sc.contains(*v)),
            };
            if outside {
                let key = format!("cluster_ip.{i}");
                let line = if s.lines.has(&key) {
                    s.lines.of(&key)
                } else {
                    s.lines.of("cluster_ip")
                };
                warnings.push(Diag {
                    line,
                    warning: true,
                    msg: format!("service {:?}: cluster_ip = \"{vip}\" is outside node.service_cidr: the node's own processes do not reach it through the host port", s.name),
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::check_str;

    const NODE: &str = r#"[node]
name = "node-a"
cluster_cidr = "10.244.0.0/16"
service_cidr = "10.96.0.0/12"

[[bridge]]
name = "cni0"
address = "10.244.1.1/24"

[[uplink]]
name = "eth0"
address = "172.18.0.2/24"

[[service]]
name = "api"
cluster_ip = "10.96.0.1"
port = 443
endpoints = ["172.18.0.2:6443"]
"#;

    const HOST: &str = r#"
[[host]]
name = "tapyard0"
address = "172.18.0.2"
routes = ["0.0.0.0/0"]
"#;

    fn diags(src: &str) -> Vec<String> {
        check_str(src).diags.iter().map(|d| d.render("f")).collect()
    }

    #[test]
    fn a_service_endpoint_on_the_node_needs_the_host_port() {
        let without = diags(NODE);
        assert_eq!(without.len(), 1, "{without:?}");
        assert!(
            without[0].starts_with("f:18: ")
                && without[0].contains("endpoint 172.18.0.2:6443 is this node's own address")
                && without[0].contains("[[host]]"),
            "{without:?}"
        );
        let ch = check_str(&format!("{NODE}{HOST}"));
        assert_eq!(ch.diags, Vec::new());
        let c = ch.config.unwrap();
        let h = &c.hosts[0];
        assert_eq!(
            (
                h.name.as_str(),
                h.address.unwrap().to_string(),
                h.gateway.to_string(),
                h.mtu
            ),
            ("tapyard0", "172.18.0.2".into(), "169.254.0.1".into(), 1500)
        );
        assert_eq!(c.node.service_cidr.unwrap().to_string(), "10.96.0.0/12");
        // The endpoint is on this node (externalTrafficPolicy Local keeps it).
        assert!(c.services[0].endpoints[0].local);
    }

    #[test]
    fn bad_host_ports_are_refused_naming_line_field_and_value() {
        let src = format!(
            "{NODE}{HOST}\n[[host]]\nname = \"cni0\"\naddress = \"10.244.1.9\"\ngateway = \"172.18.0.7\"\nroutes = [\"fd00::/8\", \"10.1.2.3/8\"]\n"
        );
        let d = diags(&src);
        let want = [
            "f:26: host \"cni0\": a node has at most one [[host]] (the first is \"tapyard0\", line 21)",
            "f:26: host \"cni0\": name \"cni0\" is already used by bridge \"cni0\"",
            "f:27: host \"cni0\": address = \"10.244.1.9\" is inside node.cluster_cidr",
            "f:28: host \"cni0\": gateway = \"172.18.0.7\" is inside eth0's subnet",
            "f:29: host \"cni0\": routes[0] = \"fd00::/8\" is IPv6",
            "f:29: host \"cni0\": routes[1] = \"10.1.2.3/8\" has host bits set",
        ];
        for w in want {
            assert!(d.iter().any(|x| x.starts_with(w)), "no {w:?} in {d:#?}");
        }
        let d = diags(&format!("{NODE}{HOST}gateway = \"172.18.0.2\"\n"));
        assert!(
            d.iter().any(|x| x.starts_with(
                "f:24: host \"tapyard0\": gateway = \"172.18.0.2\" is its address too"
            )),
            "{d:#?}"
        );
        let d = diags(
            &format!("{NODE}{HOST}address = \"fe80::2\"\n")
                .replace("address = \"172.18.0.2\"\n", ""),
        );
        assert!(
            d.iter()
                .any(|x| x.starts_with("f:23: host \"tapyard0\": address = \"fe80::2\"")),
            "{d:#?}"
        );
    }

    /// A dual-stack node: `[node]` with both families, a bridge with both.
    const NODE6: &str = r#"[node]
name = "node-a"
cluster_cidr = ["10.244.0.0/16", "fd00:10:244::/48"]
service_cidr = ["10.96.0.0/12", "fd00:10:96::/108"]

[[bridge]]
name = "cni0"
address = ["10.244.1.1/24", "fd00:10:244:1::1/64"]

[[uplink]]
name = "eth0"
address = ["172.18.0.2/24", "fd00:172:18::2/64"]

[[service]]
name = "api"
cluster_ip = ["10.96.0.1", "fd00:10:96::1"]
port = 443
endpoints = ["172.18.0.2:6443", "[fd00:172:18::2]:6443"]
"#;

    #[test]
    fn an_ipv6_or_dual_stack_host_port() {
        let src = format!(
            "{NODE6}\n[[host]]\nname = \"tapyard0\"\naddress = [\"172.18.0.2\", \"fd00:172:18::2\"]\nroutes = [\"0.0.0.0/0\", \"::/0\"]\n"
        );
        let ch = check_str(&src);
        assert_eq!(ch.diags, Vec::new());
        let c = ch.config.unwrap();
        let h = &c.hosts[0];
        let sides: Vec<String> = h.sides().map(|(a, g)| format!("{a} {g}")).collect();
        assert_eq!(
            sides,
            ["172.18.0.2 169.254.0.1", "fd00:172:18::2 fc00::a9fe:1"]
        );
        // Both endpoints are the node's own sockets.
        assert!(c.services[0].endpoints.iter().all(|e| e.local));
        // IPv6 only, with a gateway of its own.
        let src6 = src
            .replace(
                "[\"172.18.0.2\", \"fd00:172:18::2\"]",
                "\"fd00:172:18::2\"\ngateway = \"fd00:a9fe::1\"",
            )
            .replace("[\"0.0.0.0/0\", \"::/0\"]", "[\"::/0\"]")
            .replace("\"172.18.0.2:6443\", ", "");
        let ch = check_str(&src6);
        assert_eq!(ch.diags, Vec::new());
        let h = &ch.config.as_ref().unwrap().hosts[0];
        let sides: Vec<String> = h.sides().map(|(a, g)| format!("{a} {g}")).collect();
        assert_eq!(sides, ["fd00:172:18::2 fd00:a9fe::1"]);
    }

    #[test]
    fn bad_ipv6_host_ports_are_refused_naming_line_field_and_value() {
        let src = format!(
            "{NODE6}\n[[host]]\nname = \"tapyard0\"\naddress = [\"172.18.0.2\", \"fd00:10:244:1::9\"]\ngateway = [\"169.254.0.1\", \"fd00:172:18::7\"]\nroutes = [\"::/0\", \"fd00::1/8\"]\n"
        );
        let d = diags(&src);
        let want = [
            "f:22: host \"tapyard0\": address = \"fd00:10:244:1::9\" is inside node.cluster_cidr fd00:10:244::/48",
            "f:23: host \"tapyard0\": gateway = \"fd00:172:18::7\" is inside eth0's subnet",
            "f:24: host \"tapyard0\": routes[1] = \"fd00::1/8\" has host bits set (expected \"fd00::/8\")",
        ];
        for w in want {
            assert!(d.iter().any(|x| x.starts_with(w)), "no {w:?} in {d:#?}");
        }
        // A family of gateway or routes without an address of that family.
        let src = format!(
            "{NODE6}\n[[host]]\nname = \"tapyard0\"\naddress = \"172.18.0.2\"\ngateway = [\"169.254.0.1\", \"fc00::1\"]\nroutes = [\"::/0\"]\n"
        );
        let d = diags(&src);
        let want = [
            "f:23: host \"tapyard0\": gateway = \"fc00::1\" is IPv6 but address has no IPv6 address",
            "f:24: host \"tapyard0\": routes[0] = \"::/0\" is IPv6 but address has no IPv6 address",
        ];
        for w in want {
            assert!(d.iter().any(|x| x.starts_with(w)), "no {w:?} in {d:#?}");
        }
    }

    #[test]
    fn a_cluster_ip_outside_the_service_cidr_is_a_warning() {
        let src = format!("{NODE}{HOST}").replace("10.96.0.1\"", "10.200.0.1\"");
        let ch = check_str(&src);
        assert!(ch.config.is_some());
        let d: Vec<String> = ch.diags.iter().map(|d| d.render("f")).collect();
        assert_eq!(d.len(), 1, "{d:?}");
        assert!(d[0].contains("outside node.service_cidr"), "{d:?}");
    }

    #[test]
    fn adding_or_removing_the_host_port_needs_a_restart() {
        let without = check_str(&NODE.replace("172.18.0.2:6443", "10.244.1.5:6443"))
            .config
            .unwrap();
        let with = check_str(&format!("{NODE}{HOST}")).config.unwrap();
        let e = crate::config::diff::diff(&without, &with).unwrap_err();
        assert!(
            e.iter()
                .any(|l| l.starts_with("host \"tapyard0\" added: this needs a restart")),
            "{e:?}"
        );
        let e = crate::config::diff::diff(&with, &without).unwrap_err();
        assert!(
            e.iter().any(|l| l.starts_with("host \"tapyard0\" removed")),
            "{e:?}"
        );
        assert!(crate::config::diff::diff(&with, &with).unwrap().is_empty());
    }

    #[test]
    fn its_routes_and_the_service_cidr_change_live_its_address_needs_a_restart() {
        use crate::config::diff::{diff, Item};
        let with = check_str(&format!("{NODE}{HOST}")).config.unwrap();
        // routes: 0.0.0.0/0 -> 192.0.2.0/24 and 198.51.100.0/24.
        let more = format!("{NODE}{HOST}").replace(
            "routes = [\"0.0.0.0/0\"]",
            "routes = [\"192.0.2.0/24\", \"198.51.100.0/24\"]",
        );
        let more = check_str(&more).config.unwrap();
        let d = diff(&with, &more).unwrap();
        assert_eq!(d.items, [Item::HostRoutes]);
        assert_eq!(
            d.summary,
            ["host \"tapyard0\": routes [0.0.0.0/0] -> [192.0.2.0/24, 198.51.100.0/24]"]
        );
        let show =
            |v: &[crate::config::IpCidr]| v.iter().map(ToString::to_string).collect::<Vec<_>>();
        assert_eq!(show(&d.host_routes_removed), ["0.0.0.0/0"]);
        assert_eq!(
            show(&d.host_routes_added),
            ["192.0.2.0/24", "198.51.100.0/24"]
        );
        // node.service_cidr: its route replaced.
        let svc = format!("{NODE}{HOST}").replace("10.96.0.0/12", "10.96.0.0/16");
        let d = diff(&with, &check_str(&svc).config.unwrap()).unwrap();
        assert_eq!(d.items, [Item::HostRoutes]);
        assert_eq!(
            (show(&d.host_routes_removed), show(&d.host_routes_added)),
            (
                vec!["10.96.0.0/12".to_string()],
                vec!["10.96.0.0/16".to_string()]
            )
        );
        // A refused change: the running configuration keeps the old routes (retried).
        let refused = [crate::config::diff::Refusal {
            item: Item::HostRoutes,
            reason: "no".into(),
            old_kept: true,
        }];
        let run = crate::config::diff::running(&with, &more, &refused);
        assert_eq!(run.hosts[0].routes, with.hosts[0].routes);
        // Its MTU (the router interface's): a restart.
        let mtu = check_str(&format!("{NODE}{HOST}mtu = 1400\n"))
            .config
            .unwrap();
        let e = diff(&with, &mtu).unwrap_err();
        assert!(
            e.iter()
                .any(|l| l.starts_with("host \"tapyard0\" changed: this needs a restart")),
            "{e:?}"
        );
    }
}
