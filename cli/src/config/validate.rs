//! The cross-checks between sections, on a parsed configuration: unique names, subnets that do
//! not overlap, routes and neighbours on connected interfaces, Services' frontends and
//! endpoints.

use std::collections::{HashMap, HashSet};
use std::net::IpAddr;

use super::values::{is_host, is_host6, is_link_local6};

mod host;
mod lb;
use super::{proto_name, Cidr, Cidr6, Config, Diag, IpCidr, RouteType};

/// The cross-checks between sections, on a parsed configuration.
/// `broken` holds names of items that could not be read (references to them are not
/// reported again).
pub fn validate(c: &Config, broken: &HashSet<String>, diags: &mut Vec<Diag>) {
    let mut err = |line: usize, msg: String| {
        diags.push(Diag {
            line,
            warning: false,
            msg,
        })
    };
    let mut warnings = Vec::new();
    // Interface names: bridges, their ports and uplinks share one namespace (datapath ports).
    let mut names: HashMap<String, (usize, String)> = HashMap::new();
    let mut taps: HashMap<String, (usize, String)> = HashMap::new();
    fn claim(
        map: &mut HashMap<String, (usize, String)>,
        n: &str,
        line: usize,
        what: String,
        err: &mut dyn FnMut(usize, String),
    ) {
        match map.get(n) {
            Some((l, first)) => err(
                line,
                format!("{what}: name {n:?} is already used by {first} (line {l}); names must be unique"),
            ),
            None => {
                map.insert(n.to_string(), (line, what));
            }
        }
    }
    for b in &c.bridges {
        claim(
            &mut names,
            &b.name,
            b.lines.of("name"),
            format!("bridge {:?}", b.name),
            &mut err,
        );
    }
    for (bi, b) in c.bridges.iter().enumerate() {
        for (i, p) in b.ports.iter().enumerate() {
            let line = b.lines.of(&format!("ports.{i}"));
            if let Some(first) = c.bridges[..=bi].iter().find_map(|o| {
                let upto = if std::ptr::eq(o, b) { i } else { o.ports.len() };
                o.ports[..upto].contains(p).then(|| o.name.clone())
            }) {
                err(line, format!("bridge {:?}: port {p:?} is listed twice (already a port of bridge {first:?}); a TAP can be on one bridge once", b.name));
                continue;
            }
            claim(
                &mut names,
                p,
                line,
                format!("port {p:?} of bridge {:?}", b.name),
                &mut err,
            );
            claim(&mut taps, p, line, format!("port {p:?}"), &mut err);
        }
    }
    // A [[bridge.port]]'s addresses: not its gateway's, not another port's.
    let mut owners: HashMap<IpAddr, (String, usize)> = HashMap::new();
    for b in &c.bridges {
        for d in &b.port_defs {
            let i = b.ports.iter().position(|p| *p == d.name).unwrap_or(0);
            let line = b.lines.of(&format!("ports.{i}.ips"));
            let ctx = format!("bridge {:?} port {:?}", b.name, d.name);
            for ip in &d.ips {
                let gw = b.address.map(|a| IpAddr::V4(a.addr)) == Some(*ip)
                    || b.address6.map(|a| IpAddr::V6(a.addr)) == Some(*ip);
                if gw {
                    err(
                        line,
                        format!("{ctx}: ips has \"{ip}\", the bridge's own address (its gateway)"),
                    );
                } else if let Some((o, l)) = owners.get(ip) {
                    err(line, format!("{ctx}: ips has \"{ip}\", already port {o:?}'s (line {l}); a port's addresses are its own"));
                } else {
                    owners.insert(*ip, (d.name.clone(), line));
                }
            }
        }
    }
    for u in &c.uplinks {
        claim(
            &mut names,
            &u.name,
            u.lines.of("name"),
            format!("uplink {:?}", u.name),
            &mut err,
        );
        if u.tap != u.name {
            if let Some((l, first)) = names.get(u.tap.as_str()) {
                err(
                    u.lines.of("tap"),
                    format!(
                        "uplink {:?}: tap {:?} is already used by {first} (line {l})",
                        u.name, u.tap
                    ),
                );
            }
        }
        claim(
            &mut taps,
            &u.tap,
            u.lines.of("tap"),
            format!("uplink {:?}", u.name),
            &mut err,
        );
    }
    host::check(c, &names, &mut err, &mut warnings);
    // A bridge without `ports` is fine: its pods come through the CNI plugin or `port add`.
    if c.bridges.is_empty() && c.uplinks.is_empty() {
        err(
            1,
            "nothing to run: add a [[bridge]] (its ports may come later, from the CNI plugin) or an [[uplink]]".into(),
        );
    }
    // Subnets of interfaces must not overlap.
    let conn: Vec<(&str, Cidr, usize)> = c
        .bridges
        .iter()
        .filter_map(|b| {
            b.address
                .map(|a| (b.name.as_str(), a, b.lines.of("address")))
        })
        .chain(c.uplinks.iter().filter_map(|u| {
            u.address
                .map(|a| (u.name.as_str(), a, u.lines.of("address")))
        }))
        .collect();
    for (i, (n, a, line)) in conn.iter().enumerate() {
        for (m, b, l2) in &conn[..i] {
            if a.overlaps(b) {
                let kind = if c.bridges.iter().any(|x| x.name == *n) {
                    "bridge"
                } else {
                    "uplink"
                };
                err(*line, format!("{kind} {n:?}: address = \"{a}\" overlaps {m}'s subnet {}/{} (line {l2}); interface subnets must not overlap", b.network(), b.len));
            }
        }
        if c.bridges.iter().any(|b| b.name == *n) {
            match c.node.cluster_cidr {
                Some(cc) if !cc.covers(a) => warnings.push(Diag {
                    line: *line,
                    warning: true,
                    msg: format!(
                        "bridge {n:?}: address = \"{a}\" is outside node.cluster_cidr {cc} (pods on it are not cluster pods)"
                    ),
                }),
                Some(_) => {}
                None => err(*line, format!("bridge {n:?}: address = \"{a}\" is IPv4, and node.cluster_cidr has no IPv4 prefix (an IPv6-only cluster): give cluster_cidr an IPv4 prefix too")),
            }
        }
    }
    // IPv6: the same for the interfaces' IPv6 subnets, and IPv6's minimum MTU.
    let conn6: Vec<(&str, Cidr6, usize)> = c
        .bridges
        .iter()
        .filter_map(|b| {
            b.address6
                .map(|a| (b.name.as_str(), a, b.lines.of("address")))
        })
        .chain(c.uplinks.iter().filter_map(|u| {
            u.address6
                .map(|a| (u.name.as_str(), a, u.lines.of("address")))
        }))
        .collect();
    let kind_of = |n: &str| {
        if c.bridges.iter().any(|x| x.name == n) {
            "bridge"
        } else {
            "uplink"
        }
    };
    for (i, (n, a, line)) in conn6.iter().enumerate() {
        for (m, b, l2) in &conn6[..i] {
            if a.overlaps(b) {
                err(*line, format!("{} {n:?}: address = \"{a}\" overlaps {m}'s subnet {}/{} (line {l2}); interface subnets must not overlap", kind_of(n), b.network(), b.len));
            }
        }
        if kind_of(n) == "bridge" && !c.node.cluster_cidr6.is_some_and(|cc| cc.covers(a)) {
            warnings.push(Diag {
                line: *line,
                warning: true,
                msg: match c.node.cluster_cidr6 {
                    Some(cc) => format!("bridge {n:?}: address = \"{a}\" is outside node.cluster_cidr {cc} (pods on it are not cluster pods)"),
                    None => format!("bridge {n:?}: address = \"{a}\" is IPv6 but node.cluster_cidr has no IPv6 prefix (its pods are not cluster pods: no masquerade for them)"),
                },
            });
        }
    }
    for b in c.bridges.iter().filter(|b| b.address6.is_some()) {
        if b.mtu < 1280 {
            err(b.lines.of("mtu"), format!("bridge {:?}: mtu = {} is below 1280, IPv6's minimum MTU, on an interface with an IPv6 address", b.name, b.mtu));
        }
    }
    for b in c.bridges.iter().filter(|b| b.ra && b.address6.is_none()) {
        err(b.lines.of("ra"), format!("bridge {:?}: ra = true needs an IPv6 address on the bridge (address = [\"<IPv4>/<len>\", \"<IPv6>/64\"]): Router Advertisements announce it", b.name));
    }
    for u in c
        .uplinks
        .iter()
        .filter(|u| u.address6.is_some() && u.mtu < 1280)
    {
        err(u.lines.of("mtu"), format!("uplink {:?}: mtu = {} is below 1280, IPv6's minimum MTU, on an interface with an IPv6 address", u.name, u.mtu));
    }
    let iface_of = |name: &str| conn.iter().find(|(n, _, _)| *n == name);
    let iface6_of = |name: &str| conn6.iter().find(|(n, _, _)| *n == name);
    let known =
        |name: &str| iface_of(name).is_some() || iface6_of(name).is_some() || broken.contains(name);
    let describe_iface = |name: &str| -> String {
        if c.bridges.iter().any(|b| b.name == name) {
            format!("bridge {name:?} has no address")
        } else {
            format!("no bridge or uplink is named {name:?}")
        }
    };
    // Routes.
    let mut seen_routes: HashMap<(IpCidr, u32), usize> = HashMap::new();
    for r in &c.routes {
        let ctx = format!("route to {}", r.to);
        if let Some(first) = seen_routes.insert((r.to, r.metric), r.lines.of("to")) {
            err(r.lines.of("to"), format!("{ctx}: a route to {} with metric {} is already given (line {first}); give it another metric", r.to, r.metric));
        }
        if let Some(d) = &r.dev {
            if !known(d) {
                err(
                    r.lines.of("dev"),
                    format!(
                        "{ctx}: dev = {d:?}: {} (expected a bridge with an address or an uplink)",
                        describe_iface(d)
                    ),
                );
            } else if r.to.is_v6() && iface6_of(d).is_none() && !broken.contains(d) {
                err(
                    r.lines.of("dev"),
                    format!("{ctx}: dev = {d:?} has no IPv6 address (an IPv6 route goes out of an interface with one)"),
                );
            } else if !r.to.is_v6() && iface_of(d).is_none() && !broken.contains(d) {
                err(
                    r.lines.of("dev"),
                    format!("{ctx}: dev = {d:?} has no IPv4 address (an IPv4 route goes out of an interface with one)"),
                );
            }
        }
        match r.via {
            Some(IpAddr::V4(gw)) if !r.to.is_v6() => {
                let on = match &r.dev {
                    Some(d) => iface_of(d).is_none_or(|(_, a, _)| a.contains(gw)),
                    None => conn.iter().any(|(_, a, _)| a.contains(gw)),
                };
                if !on {
                    let subnets: Vec<String> = conn
                        .iter()
                        .map(|(n, a, _)| format!("{n} {}/{}", a.network(), a.len))
                        .collect();
                    err(
                        r.lines.of("via"),
                        format!(
                            "{ctx}: via = \"{gw}\" is not on a connected subnet{} (connected: {})",
                            r.dev
                                .as_ref()
                                .map(|d| format!(" of {d}"))
                                .unwrap_or_default(),
                            if subnets.is_empty() {
                                "none: no bridge or uplink has an IPv4 address".into()
                            } else {
                                subnets.join(", ")
                            }
                        ),
                    );
                } else if conn.iter().any(|(_, a, _)| a.addr == gw) {
                    err(
                        r.lines.of("via"),
                        format!("{ctx}: via = \"{gw}\" is this node's own address"),
                    );
                }
            }
            Some(IpAddr::V6(gw)) if r.to.is_v6() => {
                if is_link_local6(gw) {
                    // As `ip -6 route add ... via fe80::1`: a link-local gateway needs its link.
                    if r.dev.is_none() {
                        err(r.lines.of("via"), format!("{ctx}: via = \"{gw}\" is link-local: give `dev` (the interface it is on), as `ip -6 route ... via {gw} dev eth0`"));
                    }
                } else if gw.is_multicast() || gw.is_unspecified() || gw.is_loopback() {
                    err(
                        r.lines.of("via"),
                        format!("{ctx}: via = \"{gw}\" is not a unicast address"),
                    );
                } else {
                    let on = match &r.dev {
                        Some(d) => iface6_of(d).is_none_or(|(_, a, _)| a.contains(gw)),
                        None => conn6.iter().any(|(_, a, _)| a.contains(gw)),
                    };
                    if !on {
                        let subnets: Vec<String> = conn6
                            .iter()
                            .map(|(n, a, _)| format!("{n} {}/{}", a.network(), a.len))
                            .collect();
                        err(
                            r.lines.of("via"),
                            format!(
                                "{ctx}: via = \"{gw}\" is not on a connected IPv6 subnet{} (connected: {})",
                                r.dev
                                    .as_ref()
                                    .map(|d| format!(" of {d}"))
                                    .unwrap_or_default(),
                                if subnets.is_empty() {
                                    "none".into()
                                } else {
                                    subnets.join(", ")
                                }
                            ),
                        );
                    } else if conn6.iter().any(|(_, a, _)| a.addr == gw) {
                        err(
                            r.lines.of("via"),
                            format!("{ctx}: via = \"{gw}\" is this node's own address"),
                        );
                    }
                }
            }
            // The other family: the parser reported it.
            _ => {}
        }
    }
    // Static neighbours.
    let mut seen_neigh: HashMap<(&str, IpAddr), usize> = HashMap::new();
    for n in &c.neighbors {
        let ctx = format!("neighbor {}", n.ip);
        let any = iface_of(&n.dev).is_some() || iface6_of(&n.dev).is_some();
        match (iface_of(&n.dev), n.ip) {
            (None, _) if broken.contains(&n.dev) => {}
            (None, _) if !any => err(
                n.lines.of("dev"),
                format!(
                    "{ctx}: dev = {:?}: {} (expected a bridge with an address or an uplink)",
                    n.dev,
                    describe_iface(&n.dev)
                ),
            ),
            (None, IpAddr::V4(_)) => err(
                n.lines.of("dev"),
                format!(
                    "{ctx}: dev = {:?} has no IPv4 address (an ARP entry needs one)",
                    n.dev
                ),
            ),
            (Some((_, a, _)), IpAddr::V4(ip)) => {
                if !a.contains(ip) {
                    err(
                        n.lines.of("ip"),
                        format!(
                            "{ctx}: ip = \"{ip}\" is not in {}'s subnet {}/{}",
                            n.dev,
                            a.network(),
                            a.len
                        ),
                    );
                } else if a.addr == ip {
                    err(
                        n.lines.of("ip"),
                        format!("{ctx}: ip = \"{ip}\" is {}'s own address", n.dev),
                    );
                }
            }
            (_, IpAddr::V6(ip)) => match iface6_of(&n.dev) {
                None => err(
                    n.lines.of("dev"),
                    format!(
                        "{ctx}: dev = {:?} has no IPv6 address (an NDP entry needs one)",
                        n.dev
                    ),
                ),
                Some(_) if is_link_local6(ip) => {}
                Some((_, a, _)) if !a.contains(ip) => err(
                    n.lines.of("ip"),
                    format!(
                        "{ctx}: ip = \"{ip}\" is not in {}'s IPv6 subnet {}/{} (nor link-local)",
                        n.dev,
                        a.network(),
                        a.len
                    ),
                ),
                Some((_, a, _)) if a.addr == ip => err(
                    n.lines.of("ip"),
                    format!("{ctx}: ip = \"{ip}\" is {}'s own address", n.dev),
                ),
                Some(_) => {}
            },
        }
        if let Some(first) = seen_neigh.insert((n.dev.as_str(), n.ip), n.lines.of("ip")) {
            err(
                n.lines.of("ip"),
                format!("{ctx}: given twice on {} (first on line {first})", n.dev),
            );
        }
    }
    // VXLAN interfaces and their peers. The underlay's family is the interface address's
    // (Flannel's flannel.1 over IPv4, flannel-v6.1 over IPv6); its peers' node_ip and
    // pod_cidr are of that family.
    let conn_any: Vec<(&str, IpCidr, usize)> = conn
        .iter()
        .map(|(n, a, l)| (*n, IpCidr::V4(*a), *l))
        .chain(conn6.iter().map(|(n, a, l)| (*n, IpCidr::V6(*a), *l)))
        .collect();
    let fam = |v6: bool| if v6 { "IPv6" } else { "IPv4" };
    let mut pod_cidrs: Vec<(IpCidr, usize)> = Vec::new();
    let mut node_ips: HashMap<IpAddr, usize> = HashMap::new();
    let mut vteps: HashMap<tapyard::MacAddr, usize> = HashMap::new();
    for v in &c.vxlans {
        let ctx = format!("vxlan {:?}", v.name);
        let v6 = v.address.is_v6();
        claim(
            &mut names,
            &v.name,
            v.lines.of("name"),
            ctx.clone(),
            &mut err,
        );
        let up = c.uplinks.iter().find(|u| u.name == v.uplink);
        let overhead = if v6 { 70 } else { 50 };
        match up {
            None if broken.contains(&v.uplink) => {}
            None => err(
                v.lines.of("uplink"),
                format!("{ctx}: uplink = {:?}: no [[uplink]] is named so (encapsulated packets leave and arrive on an uplink)", v.uplink),
            ),
            Some(u) => {
                if !v6 && u.address.is_none() {
                    err(
                        v.lines.of("uplink"),
                        format!("{ctx}: uplink = {:?} has no IPv4 address, but address = \"{}\" is IPv4: the underlay is IPv4 (as Flannel's flannel.1), sent from the uplink's IPv4 address (add one to its address, or give this [[vxlan]] an IPv6 address)", v.uplink, v.address),
                    );
                }
                if v6 && u.address6.is_none() {
                    err(v.lines.of("uplink"), format!("{ctx}: uplink = {:?} has no IPv6 address, but address = \"{}\" is IPv6: the underlay is IPv6 (as Flannel's flannel-v6.1), sent from the uplink's IPv6 address (add one to its address, or give this [[vxlan]] an IPv4 address)", v.uplink, v.address));
                }
                if let Some(m) = v.mtu.filter(|&m| usize::from(m) + overhead > usize::from(u.mtu)) {
                    err(v.lines.of("mtu"), format!("{ctx}: mtu = {m} is above uplink {:?}'s MTU {} minus {overhead} (the VXLAN overhead over {})", u.name, u.mtu, fam(v6)));
                }
            }
        }
        if let Some(m) = v.mtu.filter(|&m| v6 && m < 1280) {
            err(
                v.lines.of("mtu"),
                format!("{ctx}: mtu = {m} is below IPv6's minimum of 1280"),
            );
        }
        // Flannel's VTEP address is the pod subnet's network address as a /32 (/128): inside
        // the bridge's subnet but not one of its hosts, so not an overlap.
        for (n, a, l) in &conn_any {
            if a.is_v6() != v6 {
                continue;
            }
            let clash = if v.address.prefix_len() == if v6 { 128 } else { 32 } {
                a.addr() == v.address.addr()
            } else {
                a.overlaps(&v.address)
            };
            if clash {
                err(
                    v.lines.of("address"),
                    format!(
                        "{ctx}: address = \"{}\" overlaps {n}'s address {a} (line {l})",
                        v.address
                    ),
                );
            }
        }
        let own_mac = v
            .mac
            .unwrap_or_else(|| tapyard::l3::vxlan::default_mac(v.address.addr()));
        for p in &v.peers {
            let pctx = format!("{ctx} peer {}", p.node_ip);
            if p.node_ip.is_ipv6() != v6 {
                err(p.lines.of("node_ip"), format!("{pctx}: node_ip = \"{}\" is {}, but this [[vxlan]]'s address = \"{}\" makes its underlay {} (a peer over {} belongs on a [[vxlan]] with an {} address, as Flannel's {})", p.node_ip, fam(!v6), v.address, fam(v6), fam(!v6), fam(!v6), if v6 { "flannel.1" } else { "flannel-v6.1" }));
            }
            let host = match p.node_ip {
                IpAddr::V4(a) => is_host(a),
                IpAddr::V6(a) => is_host6(a),
            };
            if conn_any.iter().any(|(_, a, _)| a.addr() == p.node_ip) || !host {
                err(p.lines.of("node_ip"), format!("{pctx}: node_ip = \"{}\" is this node's own uplink address or not a unicast address", p.node_ip));
            }
            if let Some(first) = node_ips.insert(p.node_ip, p.lines.of("node_ip")) {
                err(
                    p.lines.of("node_ip"),
                    format!(
                        "{pctx}: node_ip = \"{}\" is already a peer (line {first})",
                        p.node_ip
                    ),
                );
            }
            if p.vtep_mac == own_mac {
                err(
                    p.lines.of("vtep_mac"),
                    format!(
                        "{pctx}: vtep_mac = \"{}\" is this VTEP's own MAC",
                        p.vtep_mac
                    ),
                );
            }
            if let Some(first) = vteps.insert(p.vtep_mac, p.lines.of("vtep_mac")) {
                err(
                    p.lines.of("vtep_mac"),
                    format!(
                        "{pctx}: vtep_mac = \"{}\" is already a peer's (line {first})",
                        p.vtep_mac
                    ),
                );
            }
            let pc = p.pod_cidr;
            if pc.is_v6() != v6 {
                err(p.lines.of("pod_cidr"), format!("{pctx}: pod_cidr = \"{pc}\" is {}, but this [[vxlan]]'s address = \"{}\" is {} (its peers' pod subnets are of its family)", fam(!v6), v.address, fam(v6)));
                continue;
            }
            if pc.addr() != pc.network() {
                err(
                    p.lines.of("pod_cidr"),
                    format!(
                        "{pctx}: pod_cidr = \"{pc}\" is not a network address (expected \"{}/{}\")",
                        pc.network(),
                        pc.prefix_len()
                    ),
                );
            }
            if let Some((o, l)) = pod_cidrs.iter().find(|(o, _)| o.overlaps(&pc)) {
                err(
                    p.lines.of("pod_cidr"),
                    format!("{pctx}: pod_cidr = \"{pc}\" overlaps another peer's {o} (line {l})"),
                );
            }
            if let Some((n, a, _)) = conn_any.iter().find(|(_, a, _)| a.overlaps(&pc)) {
                err(
                    p.lines.of("pod_cidr"),
                    format!(
                        "{pctx}: pod_cidr = \"{pc}\" overlaps this node's {n} subnet {}/{}",
                        a.network(),
                        a.prefix_len()
                    ),
                );
            } else if pc.contains(v.address.addr()) {
                err(
                    p.lines.of("pod_cidr"),
                    format!(
                        "{pctx}: pod_cidr = \"{pc}\" holds this VTEP's own address {}",
                        v.address.addr()
                    ),
                );
            }
            pod_cidrs.push((pc, p.lines.of("pod_cidr")));
        }
    }
    // Services.
    let routed = |ip: IpAddr| -> bool {
        let connected = match ip {
            IpAddr::V4(a) => conn.iter().any(|(_, c, _)| c.contains(a)),
            IpAddr::V6(a) => conn6.iter().any(|(_, c, _)| c.contains(a)),
        } || pod_cidrs.iter().any(|(p, _)| p.contains(ip));
        connected
            || c.routes
                .iter()
                .any(|r| r.kind == RouteType::Unicast && r.to.contains(ip))
    };
    let own = |ip: IpAddr| match ip {
        IpAddr::V4(ip) => conn.iter().any(|(_, a, _)| a.addr == ip),
        IpAddr::V6(ip) => conn6.iter().any(|(_, a, _)| a.addr == ip),
    };
    let in_cluster = |ip: IpAddr| match ip {
        IpAddr::V4(ip) => c.node.cluster_cidr.is_some_and(|cc| cc.contains(ip)),
        IpAddr::V6(ip) => c.node.cluster_cidr6.is_some_and(|cc| cc.contains(ip)),
    };
    let mut svc_names: HashMap<&str, usize> = HashMap::new();
    let mut frontends: HashMap<(IpAddr, u16, u8), (String, usize)> = HashMap::new();
    let mut node_ports: HashMap<(u16, u8), (String, usize)> = HashMap::new();
    let (lo, hi) = c.node.node_port_range;
    for s in &c.services {
        let ctx = format!("service {:?}", s.name);
        if let Some(first) = svc_names.insert(&s.name, s.lines.of("name")) {
            err(
                s.lines.of("name"),
                format!(
                    "{ctx}: name {:?} is already used by the service on line {first}",
                    s.name
                ),
            );
        }
        for (i, vip) in s.cluster_ips.iter().enumerate() {
            let line = if s.lines.has(&format!("cluster_ip.{i}")) {
                s.lines.of(&format!("cluster_ip.{i}"))
            } else {
                s.lines.of("cluster_ip")
            };
            let link = match vip {
                IpAddr::V4(v) => conn.iter().find(|(_, a, _)| a.contains(*v)).map(|x| x.0),
                IpAddr::V6(v) => conn6.iter().find(|(_, a, _)| a.contains(*v)).map(|x| x.0),
            };
            let family_missing = match vip {
                IpAddr::V4(_) => conn.is_empty(),
                IpAddr::V6(_) => conn6.is_empty(),
            };
            if family_missing {
                // As kube-proxy on a single-stack node: a Service of the other family has no
                // clients here and no way to its endpoints.
                let (fam, other) = match vip {
                    IpAddr::V4(_) => ("IPv4", "IPv6"),
                    IpAddr::V6(_) => ("IPv6", "IPv4"),
                };
                err(line, format!("{ctx}: cluster_ip = \"{vip}\" is {fam}, and no bridge or uplink has an {fam} address (an {other}-only node): it could never be reached"));
            } else if let Some(n) = link {
                err(line, format!("{ctx}: cluster_ip = \"{vip}\" is inside {n}'s connected subnet; a Service address must not belong to a link"));
            } else if in_cluster(*vip) {
                let cc = match vip {
                    IpAddr::V4(_) => c
                        .node
                        .cluster_cidr
                        .map(|c| c.to_string())
                        .unwrap_or_default(),
                    IpAddr::V6(_) => c
                        .node
                        .cluster_cidr6
                        .map(|c| c.to_string())
                        .unwrap_or_default(),
                };
                err(
                    line,
                    format!(
                        "{ctx}: cluster_ip = \"{vip}\" is inside node.cluster_cidr {cc} (pod addresses)"
                    ),
                );
            }
            if let Some((first, l)) = frontends.insert(
                (*vip, s.port, s.proto),
                (s.name.clone(), s.lines.of("port")),
            ) {
                err(
                    s.lines.of("port"),
                    format!(
                        "{ctx}: {}/{} is already service {first:?}'s (line {l})",
                        std::net::SocketAddr::new(*vip, s.port),
                        proto_name(s.proto)
                    ),
                );
            }
        }
        let link = |ip: IpAddr| {
            match ip {
                IpAddr::V4(v) => conn.iter().find(|(_, a, _)| a.contains(v)).map(|x| x.0),
                IpAddr::V6(v) => conn6.iter().find(|(_, a, _)| a.contains(v)).map(|x| x.0),
            }
            .map(str::to_string)
        };
        lb::check(s, &ctx, &mut frontends, &link, &mut err, &mut warnings);
        if let Some(np) = s.node_port {
            if !(lo..=hi).contains(&np) {
                err(s.lines.of("node_port"), format!("{ctx}: node_port = {np} is outside {lo}-{hi} (set node.node_port_range to allow it)"));
            }
            if let Some((first, l)) =
                node_ports.insert((np, s.proto), (s.name.clone(), s.lines.of("node_port")))
            {
                err(
                    s.lines.of("node_port"),
                    format!(
                        "{ctx}: node_port = {np}/{} is already service {first:?}'s (line {l})",
                        proto_name(s.proto)
                    ),
                );
            }
        }
        if let Some(hc) = s.health_check_node_port {
            health_port(c, s, hc, &ctx, &mut err);
        }
        let mut seen = HashSet::new();
        for (i, e) in s.endpoints.iter().map(|e| &e.addr).enumerate() {
            let line = s.lines.of(&format!("endpoints.{i}"));
            if !seen.insert(*e) {
                err(line, format!("{ctx}: endpoint {e} is listed twice"));
            }
            if host::holds(c, e.ip()) {
                // The host port's address: the kernel's own sockets behind it.
            } else if !routed(e.ip()) && !c.vxlans.is_empty() && in_cluster(e.ip()) {
                // A node that left (its peer removed) while the Service still lists its pods.
                warnings.push(Diag {
                    line,
                    warning: true,
                    msg: format!("{ctx}: endpoint {e} is in no peer's pod_cidr (a removed node?): connections sent to it will get no route"),
                });
            } else if !routed(e.ip()) {
                err(line, format!("{ctx}: endpoint {e} is outside every connected subnet and route (no way to reach it)"));
            } else if own(e.ip()) {
                err(
                    line,
                    format!(
                        "{ctx}: endpoint {e} is this node's own address (the node's sockets are reached through a [[host]] port: add one holding {})",
                        e.ip()
                    ),
                );
            }
        }
        if s.affinity.is_none() && s.lines.has("session_affinity_timeout") {
            warnings.push(Diag {
                line: s.lines.of("session_affinity_timeout"),
                warning: true,
                msg: format!("{ctx}: session_affinity_timeout has no effect without session_affinity = \"client-ip\""),
            });
        }
        if s.external_local
            && s.node_port.is_some()
            && !s.endpoints.is_empty()
            && !s.endpoints.iter().any(|e| e.local)
        {
            warnings.push(Diag {
                line: s.lines.of("external_traffic_policy"),
                warning: true,
                msg: format!("{ctx}: external_traffic_policy = \"local\" but no endpoint is on this node's bridges: node-port traffic to this node will be dropped"),
            });
        }
        if s.endpoints.is_empty() {
            warnings.push(Diag {
                line: s.lines.of("name"),
                warning: true,
                msg: format!("{ctx}: no endpoints: connections to it will be refused"),
            });
        }
        // Usable: ready, or serving and terminating (kube-proxy's CategorizeEndpoints).
        let usable =
            |e: &&crate::config::EndpointCfg| e.conditions.ready || e.conditions.fallback();
        if !s.endpoints.is_empty() && !s.endpoints.iter().any(|e| usable(&e)) {
            warnings.push(Diag {
                line: s.lines.of("endpoints"),
                warning: true,
                msg: format!("{ctx}: no endpoint is ready, nor serving and terminating: connections to it will be refused"),
            });
        }
        if s.internal_local
            && s.endpoints.iter().any(|e| usable(&e))
            && !s.endpoints.iter().filter(usable).any(|e| e.local)
        {
            warnings.push(Diag {
                line: s.lines.of("internal_traffic_policy"),
                warning: true,
                msg: format!("{ctx}: internal_traffic_policy = \"local\" but no usable endpoint is on this node: ClusterIP traffic on this node will be dropped"),
            });
        }
    }
    // Masquerade.
    if let Some(m) = &c.masquerade {
        if !known(&m.out) {
            err(
                m.lines.of("out"),
                format!(
                    "[masquerade]: out = {:?}: {} (expected an uplink or a bridge with an address)",
                    m.out,
                    describe_iface(&m.out)
                ),
            );
        }
    }
    // SNAT.
    for r in &c.snats {
        if let Some(out) = r.out.as_deref().filter(|o| !known(o)) {
            err(
                r.lines.of("out"),
                format!(
                    "snat from {}: out = {out:?}: {} (expected an uplink or a bridge with an address)",
                    r.src,
                    describe_iface(out)
                ),
            );
        }
    }
    diags.extend(warnings);
}

/// A Service's `health_check_node_port` `hc`: with `external_traffic_policy = "local"`, in
/// the node port range, neither `node.healthz_port` nor a TCP node port, and no other
/// Kubernetes Service's (the ports of one, `namespace/name:port` names sharing
/// `namespace/name`, share it).
fn health_port(
    c: &Config,
    s: &super::Located<super::ServiceDef>,
    hc: u16,
    ctx: &str,
    err: &mut impl FnMut(usize, String),
) {
    let line = s.lines.of("health_check_node_port");
    let (lo, hi) = c.node.node_port_range;
    let kube = |n: &str| n.rsplit_once(':').map_or(n, |(k, _)| k).to_string();
    if !s.external_local {
        err(line, format!("{ctx}: health_check_node_port = {hc} needs external_traffic_policy = \"local\" (kube-proxy serves health checks only for those)"));
    } else if !(lo..=hi).contains(&hc) {
        err(line, format!("{ctx}: health_check_node_port = {hc} is outside {lo}-{hi} (set node.node_port_range to allow it)"));
    } else if hc == c.node.healthz_port {
        err(
            line,
            format!("{ctx}: health_check_node_port = {hc} is node.healthz_port"),
        );
    } else if let Some(o) = c.services.iter().find(|o| {
        o.name != s.name
            && ((o.proto == 6 && o.node_port == Some(hc))
                || (o.health_check_node_port == Some(hc) && kube(&o.name) != kube(&s.name)))
    }) {
        err(
            line,
            format!(
                "{ctx}: health_check_node_port = {hc} is already service {:?}'s (line {})",
                o.name,
                o.lines.of("name")
            ),
        );
    } else if s.proto == 6 && s.node_port == Some(hc) {
        err(
            line,
            format!("{ctx}: health_check_node_port = {hc} is its own node_port"),
        );
    }
}
