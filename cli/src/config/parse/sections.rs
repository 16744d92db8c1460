//! Each section of the file read into its config type.

use std::net::IpAddr;
use std::ops::Range;
use std::path::PathBuf;

use tapyard::conntrack::{CtConfig, CtTimeouts};
use tapyard::l2::guard::MAX_ADDRS;
use tapyard::l3::neigh::NeighConfig;
use tapyard::nat::LbAlgo;
use toml::de::DeTable;

use super::super::schema::{self};
use super::super::values::{
    is_host, is_host6, is_link_local6, parse_iface_addr_any, parse_ifname, parse_ip_any, parse_mac,
    parse_port_range, parse_prefix_any, IpCidr,
};
use super::super::{
    BridgeCfg, Cidr, Cidr6, EndpointCfg, HostCfg, Located, MasqueradeCfg, NeighborCfg, NodeCfg,
    PeerCfg, PortCfg, RouteCfg, RouteType, ServiceCfg, ServiceDef, SnatCfg, UplinkCfg, VxlanCfg,
};

use super::{default_str, raw_name, Parser, Sec};
use crate::config::values::BadValue;

/// A host address of either family, not IPv6 link-local (the host port's `address` and
/// `gateway`).
fn parse_host_ip(s: &str) -> Result<IpAddr, BadValue> {
    match super::super::values::parse_ip_any(s)? {
        IpAddr::V4(ip) if !is_host(ip) => Err(BadValue::NotUnicast),
        IpAddr::V6(ip) if is_link_local6(ip) => Err(BadValue::LinkLocal),
        IpAddr::V6(ip) if !is_host6(ip) => Err(BadValue::NotAHost),
        ip => Ok(ip),
    }
}

impl Parser<'_> {
    pub(super) fn node(&mut self, t: &DeTable<'_>, span: Range<usize>) -> Option<NodeCfg> {
        let mut s = self.sec(t, span, "[node]".into(), &schema::NODE);
        let name = self.text(&mut s, "name", |n| {
            if n.is_empty() || n.len() > 63 || n.contains('/') || n.chars().any(char::is_whitespace)
            {
                Err(BadValue::NodeName)
            } else {
                Ok(n.to_string())
            }
        });
        let cidrs = self.addrs(&mut s, "cluster_cidr", parse_prefix_any, IpCidr::is_v6);
        let cluster_cidr6 = cidrs.and_then(|(_, v6)| match v6 {
            Some(IpCidr::V6(c)) => Some(c),
            _ => None,
        });
        // Some: given, with at least one family (an IPv6-only cluster has no IPv4 prefix).
        let cluster_cidr = cidrs.map(|(v4, _)| match v4 {
            Some(IpCidr::V4(c)) => Some(c),
            _ => None,
        });
        let workers = self.given_int_as(&mut s, "workers");
        if workers == Some(0) {
            if let Some(v) = t.get("workers") {
                self.bad(
                    &mut s,
                    "workers",
                    v,
                    "is not allowed: at least 1 worker thread is needed",
                );
            }
        }
        let busy_poll_us = self.int_as(&mut s, "busy_poll_us");
        let socket = self.text(&mut s, "socket", |p| {
            if p.is_empty() {
                Err(BadValue::EmptyPath)
            } else {
                Ok(PathBuf::from(p))
            }
        });
        let state_dir = self.text(&mut s, "state_dir", |p| {
            if p.is_empty() {
                Err(BadValue::EmptyPath)
            } else {
                Ok(PathBuf::from(p))
            }
        });
        let node_port_range = match self.text(&mut s, "node_port_range", parse_port_range) {
            Some(r) => r,
            None => default_str(&s, "node_port_range", parse_port_range),
        };
        let offload = self.boolean(&mut s, "offload");
        let services = self.addrs(&mut s, "service_cidr", parse_prefix_any, IpCidr::is_v6);
        let service_cidr = services.and_then(|(v4, _)| match v4 {
            Some(IpCidr::V4(c)) => Some(c),
            _ => None,
        });
        let service_cidr6 = services.and_then(|(_, v6)| match v6 {
            Some(IpCidr::V6(c)) => Some(c),
            _ => None,
        });
        let masquerade_all = self.boolean(&mut s, "masquerade_all");
        let random_fully = self.boolean(&mut s, "random_fully");
        let node_port_addresses = self.list(&mut s, "node_port_addresses", parse_prefix_any);
        let healthz_port = self.int_as(&mut s, "healthz_port");
        Some(NodeCfg {
            name: name?,
            cluster_cidr: cluster_cidr?,
            cluster_cidr6,
            workers,
            busy_poll_us,
            socket,
            state_dir,
            node_port_range,
            offload,
            service_cidr,
            service_cidr6,
            masquerade_all,
            random_fully,
            node_port_addresses,
            healthz_port,
        })
    }

    pub(super) fn bridge(
        &mut self,
        mut s: Sec<'_, '_>,
        t: &DeTable<'_>,
    ) -> Option<Located<BridgeCfg>> {
        let port_tables = self.sub_tables(&mut s, t, "port");
        let name = self.text(&mut s, "name", parse_ifname);
        let addrs = self.iface_addrs(&mut s);
        let (address, address6) = (addrs.and_then(|a| a.0), addrs.and_then(|a| a.1));
        let mac = self.text(&mut s, "mac", parse_mac);
        let mtu = self.int_as::<u16>(&mut s, "mtu");
        let ra = self.boolean(&mut s, "ra");
        let mut ports = self.list(&mut s, "ports", parse_ifname);
        let fdb_max_entries = self.int_as::<usize>(&mut s, "fdb_max_entries");
        let fdb_aging = self.secs(&mut s, "fdb_aging");
        let spoof_guard = self.boolean(&mut s, "spoof_guard");
        let mut port_defs = Vec::new();
        for (i, (pt, span)) in port_tables.into_iter().enumerate() {
            let Some(p) = self.bridge_port(&s.ctx, i, pt, span) else {
                continue;
            };
            // Listed after `ports`: names checked as theirs, at the line of its `name`.
            let n = ports.len();
            s.lines
                .fields
                .push((format!("ports.{n}"), p.lines.of("name")));
            s.lines
                .fields
                .push((format!("ports.{n}.ips"), p.lines.of("ips")));
            ports.push(p.name.clone());
            port_defs.push(p.value);
        }
        if address.is_none()
            && address6.is_none()
            && (t.contains_key("mac") || t.contains_key("mtu"))
        {
            let line = s.lines.of("mac").min(s.lines.of("mtu"));
            let ctx = s.ctx.clone();
            self.err(
                line,
                format!(
                    "{ctx}: mac and mtu belong to the bridge's router interface: set `address` too"
                ),
            );
        }
        let value = BridgeCfg {
            name: name.or_else(|| raw_name(t))?,
            address,
            address6,
            ra,
            mac,
            mtu,
            ports,
            port_defs,
            fdb_max_entries,
            fdb_aging,
            spoof_guard,
        };
        Some(Located {
            value,
            lines: s.lines,
        })
    }

    /// The `i`-th `[[bridge.port]]` of the bridge read as `ctx`.
    fn bridge_port(
        &mut self,
        ctx: &str,
        i: usize,
        t: &DeTable<'_>,
        span: Range<usize>,
    ) -> Option<Located<PortCfg>> {
        let ctx = match raw_name(t) {
            Some(n) => format!("{ctx} port {n:?}"),
            None => format!("{ctx} port #{}", i + 1),
        };
        let mut s = self.sec(t, span, ctx, &schema::BRIDGE_PORT);
        let name = self.text(&mut s, "name", parse_ifname);
        let ips = self.list(&mut s, "ips", |a| {
            let ip = parse_ip_any(a)?;
            let host = match ip {
                IpAddr::V4(a) => is_host(a),
                IpAddr::V6(a) => is_host6(a),
            };
            host.then_some(ip).ok_or(BadValue::NotAHost)
        });
        for (fam, v6) in [("IPv4", false), ("IPv6", true)] {
            let n = ips.iter().filter(|a| a.is_ipv6() == v6).count();
            if n > MAX_ADDRS {
                let (line, ctx) = (s.lines.of("ips"), s.ctx.clone());
                self.err(
                    line,
                    format!(
                        "{ctx}: ips has {n} {fam} addresses, at most {MAX_ADDRS} of each family"
                    ),
                );
            }
        }
        for (j, a) in ips.iter().enumerate() {
            if ips[..j].contains(a) {
                let (line, ctx) = (s.lines.of(&format!("ips.{j}")), s.ctx.clone());
                self.err(line, format!("{ctx}: ips[{j}] = \"{a}\" is listed twice"));
            }
        }
        let mac = self.text(&mut s, "mac", parse_mac);
        let value = PortCfg {
            name: name?,
            ips,
            mac,
        };
        Some(Located {
            value,
            lines: s.lines,
        })
    }

    pub(super) fn uplink(
        &mut self,
        mut s: Sec<'_, '_>,
        t: &DeTable<'_>,
    ) -> Option<Located<UplinkCfg>> {
        let name = self.text(&mut s, "name", parse_ifname);
        let addrs = self.iface_addrs(&mut s);
        let tap = self.text(&mut s, "tap", parse_ifname);
        let mac = self.text(&mut s, "mac", parse_mac);
        let mtu = self.int_as::<u16>(&mut s, "mtu");
        let name = name.or_else(|| raw_name(t))?;
        let value = UplinkCfg {
            tap: tap.unwrap_or_else(|| name.clone()),
            name,
            address: addrs?.0,
            address6: addrs?.1,
            mac,
            mtu,
        };
        Some(Located {
            value,
            lines: s.lines,
        })
    }

    pub(super) fn host(&mut self, mut s: Sec<'_, '_>, t: &DeTable<'_>) -> Option<Located<HostCfg>> {
        let name = self.text(&mut s, "name", parse_ifname);
        let address = self.addrs(&mut s, "address", parse_host_ip, IpAddr::is_ipv6);
        let gateway = self.addrs(&mut s, "gateway", parse_host_ip, IpAddr::is_ipv6);
        let (g4, g6) = gateway.unwrap_or_default();
        // A gateway for a family the port holds no address of.
        let (a4, a6) = address.unwrap_or_default();
        for (g, a, fam) in [(g4, a4, "IPv4"), (g6, a6, "IPv6")] {
            if let (Some(g), None, true) = (g, a, address.is_some()) {
                let line = s.lines.of("gateway");
                let ctx = s.ctx.clone();
                self.err(
                    line,
                    format!("{ctx}: gateway = \"{g}\" is {fam} but address has no {fam} address"),
                );
            }
        }
        let routes = self.list(&mut s, "routes", parse_prefix_any);
        let mac = self.text(&mut s, "mac", parse_mac);
        let mtu = self.int_as::<u16>(&mut s, "mtu");
        let value = HostCfg {
            name: name.or_else(|| raw_name(t))?,
            address: address?.0.and_then(|a| match a {
                IpAddr::V4(a) => Some(a),
                IpAddr::V6(_) => None,
            }),
            address6: a6.and_then(|a| match a {
                IpAddr::V6(a) => Some(a),
                IpAddr::V4(_) => None,
            }),
            gateway: match g4 {
                Some(IpAddr::V4(g)) => g,
                _ => HostCfg::GATEWAY,
            },
            gateway6: match g6 {
                Some(IpAddr::V6(g)) => g,
                _ => HostCfg::GATEWAY6,
            },
            routes,
            mac,
            mtu,
        };
        Some(Located {
            value,
            lines: s.lines,
        })
    }

    pub(super) fn route(
        &mut self,
        mut s: Sec<'_, '_>,
        t: &DeTable<'_>,
    ) -> Option<Located<RouteCfg>> {
        let to = self.text(&mut s, "to", parse_prefix_any);
        let via = self.text(&mut s, "via", parse_ip_any);
        let dev = self.text(&mut s, "dev", parse_ifname);
        let before = self.diags.len();
        let kind = match self.choice(&mut s, "type") {
            "blackhole" => RouteType::Blackhole,
            "unreachable" => RouteType::Unreachable,
            _ => RouteType::Unicast,
        };
        let kind_ok = self.diags.len() == before;
        let metric = self.int_as::<u32>(&mut s, "metric");
        let has_type = t.contains_key("type");
        let ctx = s.ctx.clone();
        let has_hop = t.contains_key("via") || t.contains_key("dev");
        match kind {
            RouteType::Blackhole | RouteType::Unreachable if has_hop => {
                let l = s.lines.of("type");
                self.err(l, format!("{ctx}: give either `via`/`dev` or `type = \"blackhole\"`/`\"unreachable\"`, not both"));
            }
            RouteType::Unicast if !has_hop && (!has_type || kind_ok) => {
                let l = s.lines.table;
                self.err(l, format!("{ctx}: needs `via` (a gateway), `dev` (an interface) or `type = \"blackhole\"`/`\"unreachable\"`"));
            }
            _ => {}
        }
        let to = to?;
        if to.addr() != to.network() {
            let l = s.lines.of("to");
            self.err(
                l,
                format!(
                    "{ctx}: to = \"{to}\" has host bits set (expected \"{}/{}\")",
                    to.network(),
                    to.prefix_len()
                ),
            );
        }
        if let Some(gw) = via.filter(|gw| gw.is_ipv6() != to.is_v6()) {
            let l = s.lines.of("via");
            let fam = |v6: bool| if v6 { "IPv6" } else { "IPv4" };
            self.err(
                l,
                format!(
                    "{ctx}: via = \"{gw}\" is an {} address but to = \"{to}\" is {} (a route's gateway is of its destination's family)",
                    fam(gw.is_ipv6()),
                    fam(to.is_v6())
                ),
            );
        }
        let value = RouteCfg {
            to,
            via,
            dev,
            kind,
            metric,
        };
        Some(Located {
            value,
            lines: s.lines,
        })
    }

    pub(super) fn vxlan(
        &mut self,
        mut s: Sec<'_, '_>,
        t: &DeTable<'_>,
    ) -> Option<Located<VxlanCfg>> {
        let peer_tables = self.sub_tables(&mut s, t, "peer");
        let name = self.text(&mut s, "name", parse_ifname);
        let vni = self.int_as::<u32>(&mut s, "vni");
        let port = self.int_as::<u16>(&mut s, "port");
        let uplink = self.text(&mut s, "uplink", parse_ifname);
        let address = self.text(&mut s, "address", parse_iface_addr_any);
        let mac = self.text(&mut s, "mac", parse_mac);
        let mtu = self.given_int_as::<u16>(&mut s, "mtu");
        let src_ports = self
            .text(&mut s, "src_port_range", parse_port_range)
            .unwrap_or_else(|| default_str(&s, "src_port_range", parse_port_range));
        let name = name.or_else(|| raw_name(t))?;
        let mut peers = Vec::new();
        for (i, (pt, span)) in peer_tables.into_iter().enumerate() {
            let ctx = match pt.get("node_ip").and_then(|v| v.get_ref().as_str()) {
                Some(ip) => format!("vxlan {name:?} peer {ip}"),
                None => format!("vxlan {name:?} peer #{}", i + 1),
            };
            let mut ps = self.sec(pt, span, ctx, &schema::VXLAN_PEER);
            let node_ip = self.text(&mut ps, "node_ip", parse_ip_any);
            let vtep_mac = self.text(&mut ps, "vtep_mac", parse_mac);
            let pod_cidr = self.text(&mut ps, "pod_cidr", parse_prefix_any);
            if let (Some(node_ip), Some(vtep_mac), Some(pod_cidr)) = (node_ip, vtep_mac, pod_cidr) {
                peers.push(Located {
                    value: PeerCfg {
                        node_ip,
                        vtep_mac,
                        pod_cidr,
                    },
                    lines: ps.lines,
                });
            }
        }
        let value = VxlanCfg {
            name,
            vni,
            port,
            uplink: uplink?,
            address: address?,
            mac,
            mtu,
            src_ports,
            peers,
        };
        Some(Located {
            value,
            lines: s.lines,
        })
    }

    pub(super) fn neighbor(
        &mut self,
        mut s: Sec<'_, '_>,
        _: &DeTable<'_>,
    ) -> Option<Located<NeighborCfg>> {
        let ip = self.text(&mut s, "ip", parse_ip_any);
        let mac = self.text(&mut s, "mac", parse_mac);
        let dev = self.text(&mut s, "dev", parse_ifname);
        let value = NeighborCfg {
            ip: ip?,
            mac: mac?,
            dev: dev?,
        };
        Some(Located {
            value,
            lines: s.lines,
        })
    }

    /// A Service; an endpoint inside one of `local` or `local6` (the bridges' subnets) is
    /// local.
    pub(super) fn service(
        &mut self,
        mut s: Sec<'_, '_>,
        t: &DeTable<'_>,
        local: &[Cidr],
        local6: &[Cidr6],
    ) -> Option<ServiceCfg> {
        let name = self.text(&mut s, "name", |n| {
            let ok = !n.is_empty()
                && n.len() <= 63
                && n.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !n.starts_with('-')
                && !n.ends_with('-');
            if ok {
                Ok(n.to_string())
            } else {
                Err(BadValue::ServiceName)
            }
        });
        // A Service's address: a ClusterIP, a LoadBalancer IP, an external IP.
        let service_ip = |t: &str| {
            let ip = parse_ip_any(t)?;
            let ok = match ip {
                IpAddr::V4(a) => is_host(a),
                IpAddr::V6(a) => is_host6(a),
            };
            if ok {
                Ok(ip)
            } else {
                Err(BadValue::NotUnicast)
            }
        };
        let cluster_ips = self.addrs(&mut s, "cluster_ip", service_ip, IpAddr::is_ipv6);
        let proto = match self.choice(&mut s, "protocol") {
            "udp" => 17,
            _ => 6,
        };
        let port = self.given_int_as(&mut s, "port");
        let node_port = self.given_int_as(&mut s, "node_port");
        let endpoints = self.endpoints(&mut s);
        let client_ip = self.choice(&mut s, "session_affinity") == "client-ip";
        let affinity_timeout = self.secs(&mut s, "session_affinity_timeout");
        let external_local = self.choice(&mut s, "external_traffic_policy") == "local";
        let internal_local = self.choice(&mut s, "internal_traffic_policy") == "local";
        let health_check_node_port = self.given_int_as(&mut s, "health_check_node_port");
        let algo = match self.choice(&mut s, "algorithm") {
            "maglev" => LbAlgo::Maglev,
            _ => LbAlgo::Random,
        };
        // A list with a bad item is left empty: the cross-checks name items by their index.
        let whole = |s: &Sec<'_, '_>, key: &str, n: usize| {
            let items = s.lines.fields.iter();
            items
                .filter(|(f, _)| f.strip_prefix(key).is_some_and(|r| r.starts_with('.')))
                .count()
                == n
        };
        let mut load_balancer_ips = self.list(&mut s, "load_balancer_ips", service_ip);
        if !whole(&s, "load_balancer_ips", load_balancer_ips.len()) {
            load_balancer_ips.clear();
        }
        let mut external_ips = self.list(&mut s, "external_ips", service_ip);
        if !whole(&s, "external_ips", external_ips.len()) {
            external_ips.clear();
        }
        let load_balancer_source_ranges =
            self.list(&mut s, "load_balancer_source_ranges", parse_prefix_any);
        let name = name.or_else(|| raw_name(t))?;
        let (v4, v6) = cluster_ips?;
        let cluster_ips: Vec<IpAddr> = v4.into_iter().chain(v6).collect();
        // Each family's endpoints go to that family's frontend: one without is refused.
        let ctx = s.ctx.clone();
        let mut ep_lines = Vec::new();
        for (i, (e, ..)) in endpoints.iter().enumerate() {
            let has = if e.is_ipv6() {
                v6.is_some()
            } else {
                v4.is_some()
            };
            if !has {
                let fam = if e.is_ipv6() { "IPv6" } else { "IPv4" };
                let l = s.lines.of(&format!("endpoints.{i}"));
                ep_lines.push((l, format!("{ctx}: endpoint {e} is {fam} but the Service has no {fam} cluster_ip (cluster_ip = [\"{}\"]; give one of each family for a dual-stack Service)", cluster_ips.iter().map(|ip| ip.to_string()).collect::<Vec<_>>().join("\", \""))));
            }
        }
        for (l, m) in ep_lines {
            self.err(l, m);
        }
        let is_local = |ip: IpAddr| match ip {
            IpAddr::V4(a) => local.iter().any(|c| c.contains(a)),
            IpAddr::V6(a) => local6.iter().any(|c| c.contains(a)),
        };
        let value = ServiceDef {
            name,
            cluster_ips,
            port: port?,
            proto,
            node_port,
            endpoints: endpoints
                .into_iter()
                .map(|(addr, local, conditions)| EndpointCfg {
                    addr,
                    local: local.unwrap_or_else(|| is_local(addr.ip())),
                    conditions,
                })
                .collect(),
            affinity: client_ip.then_some(affinity_timeout),
            algo,
            external_local,
            load_balancer_ips,
            external_ips,
            load_balancer_source_ranges,
            internal_local,
            health_check_node_port,
        };
        Some(Located {
            value,
            lines: s.lines,
        })
    }

    pub(super) fn masquerade(&mut self, mut s: Sec<'_, '_>) -> Option<Located<MasqueradeCfg>> {
        let out = self.text(&mut s, "out", parse_ifname)?;
        Some(Located {
            value: MasqueradeCfg { out },
            lines: s.lines,
        })
    }

    pub(super) fn snat(&mut self, mut s: Sec<'_, '_>, _: &DeTable<'_>) -> Option<Located<SnatCfg>> {
        let src = self.text(&mut s, "src", parse_prefix_any);
        let to = self.text(&mut s, "to", parse_ip_any);
        let out = self.text(&mut s, "out", parse_ifname);
        let ports = self.text(&mut s, "ports", parse_port_range);
        let (src, to) = (src?, to?);
        if to.is_ipv6() != src.is_v6() {
            let l = s.lines.of("to");
            let fam = |v6: bool| if v6 { "IPv6" } else { "IPv4" };
            self.err(
                l,
                format!(
                    "{}: to = \"{to}\" is an {} address but src = \"{src}\" is {} (a connection keeps its family: SNAT to an address of the source's family)",
                    s.ctx,
                    fam(to.is_ipv6()),
                    fam(src.is_v6())
                ),
            );
            return None;
        }
        Some(Located {
            value: SnatCfg {
                src,
                to,
                out,
                ports,
            },
            lines: s.lines,
        })
    }

    /// `[conntrack]` as the library's configuration. A timeout that stands for several of the
    /// library's (closing states, opening states) sets them all when it is given in the file,
    /// else only the one whose Linux default it has, so that an absent section means Linux's
    /// defaults (with kube-proxy's established and close-wait timeouts and limit).
    pub(super) fn conntrack(&mut self, mut s: Sec<'_, '_>) -> (CtConfig, Option<usize>) {
        let mut t = CtTimeouts {
            tcp_established: self.secs(&mut s, "tcp_established_timeout"),
            tcp_close_wait: self.secs(&mut s, "tcp_close_wait_timeout"),
            tcp_time_wait: self.secs(&mut s, "tcp_time_wait_timeout"),
            tcp_syn_sent: self.secs(&mut s, "tcp_syn_timeout"),
            udp: self.secs(&mut s, "udp_timeout"),
            udp_stream: self.secs(&mut s, "udp_stream_timeout"),
            icmp: self.secs(&mut s, "icmp_timeout"),
            ..CtTimeouts::default()
        };
        t.tcp_fin_wait = t.tcp_time_wait;
        if s.lines.has("tcp_syn_timeout") {
            t.tcp_syn_recv = t.tcp_syn_sent;
        }
        if s.lines.has("tcp_time_wait_timeout") {
            t.tcp_last_ack = t.tcp_time_wait;
            t.tcp_close = t.tcp_time_wait;
        }
        let max_entries6 = self.given_int_as::<usize>(&mut s, "max_entries6");
        let ct = CtConfig {
            max_entries: self.int_as::<usize>(&mut s, "max_entries"),
            liberal: self.boolean(&mut s, "liberal"),
            timeouts: t,
            max_per_source: self.int_as::<u32>(&mut s, "max_per_source"),
        };
        (ct, max_entries6)
    }

    /// `[neigh]` as the library's configuration, checked by the library.
    pub(super) fn neigh(&mut self, mut s: Sec<'_, '_>) -> NeighConfig {
        let c = NeighConfig {
            gc_thresh1: self.int_as::<usize>(&mut s, "gc_thresh1"),
            gc_thresh2: self.int_as::<usize>(&mut s, "gc_thresh2"),
            gc_thresh3: self.int_as::<usize>(&mut s, "gc_thresh3"),
            unres_qlen: self.int_as::<usize>(&mut s, "unres_qlen"),
            base_reachable_time: self.secs(&mut s, "base_reachable_time"),
            ..NeighConfig::default()
        };
        if s.ok {
            if let Err(e) = c.validate() {
                self.err(s.lines.table, format!("[neigh]: {e}"));
            }
        }
        c
    }
}
