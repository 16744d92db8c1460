//! `show WHAT`: the tables and counters, as text or as the rows of
//! [`tapyard_control::show`].

use std::borrow::Cow;
use std::collections::HashMap;
use std::io::{self, Write};

use serde::Serialize;
use tapyard::stats::CounterSet;
use tapyard_control::show::{
    ConntrackRow, Counters, EndpointRow, FdbCounters, FdbRow, NeighCounters, NeighRow,
    PortCounters, RouteRow, ServiceRow, Stats, TupleRow, VxlanPeerRow, VxlanRow,
};
use tapyard_control::RowStream;

use crate::node::Node;

/// The answer to `show WHAT`: text, or the rows.
#[derive(Debug)]
pub enum Shown {
    /// Without `json`.
    Text(String),
    /// With `json`.
    Data(ShowData),
}

/// The data of `show WHAT` with `json`, written as the rows are (a reader knows which it
/// asked for).
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum ShowData {
    /// `fdb`.
    Fdb(Vec<FdbRow>),
    /// `neigh`.
    Neigh(Vec<NeighRow>),
    /// `routes`.
    Routes(Vec<RouteRow>),
    /// `conntrack` (the control socket streams it instead: [`write_conntrack_reply`]).
    Conntrack(Vec<ConntrackRow<'static>>),
    /// `services`.
    Services(Vec<ServiceRow>),
    /// `stats`.
    Stats(Box<Stats>),
    /// `ports`.
    Ports(Vec<tapyard_control::show::PortRow>),
    /// `vxlan`.
    Vxlan(Vec<VxlanRow>),
}

/// The answer to `show WHAT`.
pub fn show(node: &Node, what: &str, as_json: bool) -> Result<Shown, String> {
    let dp = node.dp.control();
    let now = node.now();
    let mut text = String::new();
    let data = match what {
        "fdb" => {
            if !as_json {
                let _ = dp.fmt_fdb(now, &mut text);
                let _ = dp.fmt_vxlan_fdb(&mut text);
                return Ok(Shown::Text(text));
            }
            let mut rows = Vec::new();
            // Bridge ids are indices that the builder checked to fit 16 bits.
            let ids = (0..=u16::MAX).map(tapyard::BridgeId);
            for (id, b) in ids.zip(dp.bridges().iter()) {
                for e in dp.fdb_dump(id, now) {
                    rows.push(FdbRow {
                        age_secs: e.age.map(|a| a.as_secs_f64()),
                        dev: dp.port_name(e.port).unwrap_or_else(|| "?".into()),
                        dst: None,
                        mac: e.mac.to_string(),
                        master: Some(b.name().to_string()),
                        is_static: e.is_static(),
                    });
                }
            }
            // What the VXLAN peers imply, as `bridge fdb` shows Flannel's entries.
            for t in dp.tunnels() {
                for p in t.peers().iter() {
                    rows.push(FdbRow {
                        age_secs: None,
                        dev: t.config().name.clone(),
                        dst: Some(p.peer.node_ip.to_string()),
                        mac: p.peer.vtep_mac.to_string(),
                        master: None,
                        is_static: true,
                    });
                }
            }
            ShowData::Fdb(rows)
        }
        "vxlan" => return Ok(vxlan_show(dp, as_json)),
        "neigh" => {
            if !as_json {
                let _ = dp.fmt_neigh(now, &mut text);
                return Ok(Shown::Text(text));
            }
            macro_rules! row {
                ($e:expr) => {
                    NeighRow {
                        confirmed_ago_secs: $e.confirmed_ago.map(|d| d.as_secs_f64()),
                        dev: dp.iface_name($e.iface).unwrap_or("?").to_string(),
                        dst: $e.ip.to_string(),
                        lladdr: $e.mac.map(|m| m.to_string()),
                        queued: $e.queued as u64,
                        state: $e.state.name().to_string(),
                        updated_ago_secs: $e.updated_ago.as_secs_f64(),
                    }
                };
            }
            let mut rows = Vec::new();
            if let Some(r) = dp.router() {
                rows.extend(r.neigh::<std::net::Ipv4Addr>().dump(now).into_iter().map(|e| row!(e)));
                // The NDP table after the ARP table (as `ip neigh` lists both families).
                rows.extend(r.neigh::<std::net::Ipv6Addr>().dump(now).into_iter().map(|e| row!(e)));
            }
            ShowData::Neigh(rows)
        }
        "routes" => {
            if !as_json {
                let _ = dp.fmt_routes(&mut text);
                return Ok(Shown::Text(text));
            }
            // IPv6 routes after IPv4's (as `ip route; ip -6 route`).
            let mut rows = route_rows(dp, dp.routes::<std::net::Ipv4Addr>());
            rows.extend(route_rows(dp, dp.routes::<std::net::Ipv6Addr>()));
            ShowData::Routes(rows)
        }
        "stats" => return Ok(stats_show(dp, as_json)),
        "conntrack" | "services" => return nat_show(node, what, as_json, now),
        "ports" if as_json => ShowData::Ports(node.ports_rows()),
        "ports" => return Ok(Shown::Text(node.ports_text())),
        other => {
            return Err(format!(
                "cannot show {other:?}: expected fdb, neigh, routes, conntrack, services, stats, ports or vxlan"
            ))
        }
    };
    Ok(Shown::Data(data))
}

/// `show stats`: the datapath's, the router's, the NAT's, each bridge's FDB's and the ARP
/// table's counters.
fn stats_show(dp: tapyard::Control<'_>, as_json: bool) -> Shown {
    let s = dp.stats();
    let router: Option<Vec<(&str, u64)>> = dp.router().map(|r| {
        r.counters
            .snapshot()
            .counters()
            .map(|(k, _, v)| (k, v))
            .collect()
    });
    let nat = dp.netfilter().map(nat_counters);
    if !as_json {
        let mut text = s.to_string();
        if let Some(c) = &router {
            text.push_str("router:");
            for (k, v) in c {
                text.push_str(&format!(" {k} {v}"));
            }
            text.push('\n');
        }
        if let Some(n) = &nat {
            text.push_str("nat:");
            for (k, _, v) in n {
                text.push_str(&format!(" {k} {v}"));
            }
            text.push('\n');
        }
        for b in dp.bridges() {
            let f = b.fdb().counters();
            text.push_str(&format!("fdb {}: entries {}", b.name(), f.entries));
            for (k, _, v) in f.counters() {
                text.push_str(&format!("  {k} {v}"));
            }
            text.push('\n');
        }
        return Shown::Text(text);
    }
    let stats = Stats {
        drops: s
            .drops
            .iter()
            .map(|(r, n)| (r.name().to_string(), *n))
            .collect(),
        fdb: dp
            .bridges()
            .iter()
            .map(|b| {
                let f = b.fdb().counters();
                FdbCounters {
                    bridge: b.name().to_string(),
                    entries: f.entries as u64,
                    counters: named(f.counters()),
                }
            })
            .collect(),
        nat: nat.map(|c| c.into_iter().map(|(k, _, v)| (k, v)).collect()),
        neigh: dp.router().map(|r| {
            let c = r.neigh::<std::net::Ipv4Addr>().counters();
            NeighCounters {
                entries: c.entries as u64,
                queued_now: c.queued_now as u64,
                counters: named(c.counters()),
            }
        }),
        ports: s
            .ports
            .iter()
            .map(|p| PortCounters {
                name: p.name.clone(),
                counters: named(p.counters()),
            })
            .collect(),
        router: router.map(|c| c.into_iter().map(|(k, v)| (k.to_string(), v)).collect()),
        // The datapath's totals at the top level, each under its declared name.
        totals: named(s.counters()),
    };
    Shown::Data(ShowData::Stats(Box::new(stats)))
}

/// Counters as (name, help, value), by name.
fn named<'a>(c: impl Iterator<Item = (&'a str, &'a str, u64)>) -> Counters {
    c.map(|(k, _, v)| (k.to_string(), v)).collect()
}

/// The NAT's counters as (name, help, value), for `show stats` and the metrics: the
/// connection table's (`connections` is a gauge; its events are prefixed `ct_`) and the
/// engine's, from its declaration.
pub fn nat_counters(nf: &tapyard::nat::Netfilter) -> Vec<(String, &'static str, u64)> {
    let t = nf.conntrack().counters();
    let mut out = vec![(
        "connections".to_string(),
        "Connections in the conntrack table.",
        t.entries as u64,
    )];
    out.extend(
        nf.counters()
            .counters()
            .map(|(k, h, v)| (k.to_string(), h, v)),
    );
    // The table's events, prefixed `ct_` (its `new` is the engine's again; `found` is a
    // per-packet figure, not an event).
    out.extend(
        t.counters()
            .filter(|(k, _, _)| !matches!(*k, "new" | "found"))
            .map(|(k, h, v)| (format!("ct_{k}"), h, v)),
    );
    out
}

/// `show vxlan`: each VXLAN interface and its peers with their packet counters.
fn vxlan_show(dp: tapyard::Control<'_>, as_json: bool) -> Shown {
    let mut rows = Vec::new();
    let mut text = String::new();
    for t in dp.tunnels() {
        let c = t.config();
        let uplink = dp.iface_name(t.uplink()).unwrap_or("?");
        let (lo, hi) = c.src_ports;
        text += &format!(
            "{}: vxlan id {} dstport {} local {} dev {uplink} srcport {lo} {hi} address {}/{} mac {} mtu {}\n",
            c.name, c.vni, c.port, t.local(), c.addr, c.prefix_len, c.mac, t.mtu()
        );
        let mut peers = Vec::new();
        for p in t.peers().iter() {
            let s = p.stats();
            let q = p.peer;
            text += &format!(
                "    peer {} vtep {} pod_cidr {}/{} rx {} packets {} bytes tx {} packets {} bytes\n",
                q.node_ip, q.vtep_mac, q.pod_cidr, q.pod_prefix_len, s.rx_packets, s.rx_bytes, s.tx_packets, s.tx_bytes
            );
            peers.push(VxlanPeerRow {
                node_ip: q.node_ip.to_string(),
                pod_cidr: format!("{}/{}", q.pod_cidr, q.pod_prefix_len),
                rx_bytes: s.rx_bytes,
                rx_packets: s.rx_packets,
                tx_bytes: s.tx_bytes,
                tx_packets: s.tx_packets,
                vtep_mac: q.vtep_mac.to_string(),
            });
        }
        rows.push(VxlanRow {
            address: format!("{}/{}", c.addr, c.prefix_len),
            local: t.local().to_string(),
            mac: c.mac.to_string(),
            mtu: t.mtu(),
            name: c.name.clone(),
            peers,
            port: c.port,
            src_ports: [lo, hi],
            uplink: uplink.to_string(),
            vni: c.vni,
        });
    }
    if as_json {
        Shown::Data(ShowData::Vxlan(rows))
    } else {
        Shown::Text(text)
    }
}

/// The error of `show conntrack|services` on a node without NAT.
pub fn no_nat(what: &str) -> String {
    format!(
        "{what}: this node has no NAT (it needs a router interface: a bridge with an address or an uplink)"
    )
}

/// Service ids to names, for the conntrack rows.
pub(super) fn service_names(nf: &tapyard::nat::Netfilter) -> HashMap<u32, String> {
    nf.services()
        .list()
        .into_iter()
        .filter_map(|s| Some((nf.services().get(&s.name)?.id().get(), s.name)))
        .collect()
}

/// A connection table's tuple, as a row's.
pub(super) trait RowTuple {
    fn row(&self) -> TupleRow;
    fn zone(&self) -> u16;
}

impl<A: tapyard::wire::family::Family> RowTuple for tapyard::wire::tuple::Tuple<A> {
    fn row(&self) -> TupleRow {
        TupleRow {
            dport: self.dport,
            dst: self.dst.into(),
            sport: self.sport,
            src: self.src.into(),
        }
    }
    fn zone(&self) -> u16 {
        self.zone
    }
}

/// One row of `show conntrack --json`, from the entry (borrowing the Service's name).
pub(super) fn ct_row<'a, K: RowTuple>(
    v: &tapyard::conntrack::CtView<K>,
    names: &'a HashMap<u32, String>,
) -> ConntrackRow<'a> {
    ConntrackRow {
        assured: v.assured,
        dnat: v.status.dnat(),
        mark: v.mark,
        orig: v.orig.row(),
        orig_bytes: v.orig_bytes,
        orig_packets: v.orig_packets,
        proto: v.proto,
        protocol: Cow::Borrowed(v.protocol),
        reply: v.reply.row(),
        reply_bytes: v.reply_bytes,
        reply_packets: v.reply_packets,
        service: names.get(&v.service).map(|s| Cow::Borrowed(s.as_str())),
        service_id: v.service,
        snat: v.status.snat(),
        state: v.state.map(|s| Cow::Borrowed(s.name())),
        timeout_secs: v.timeout_secs,
        unreplied: v.unreplied,
        zone: v.orig.zone(),
    }
}

/// Writes the reply to `show conntrack --json` to `out` as it goes: the reply line
/// `{"ok":true,"data":[ROW,...]}` with each row serialized from its entry into a buffered
/// writer ([`RowStream`]), so that a full table (262,144 connections, ~100 MB of JSON) is
/// never held as one value or string. The table's dump takes no lock (the workers go on
/// forwarding and tracking meanwhile); a slow client holds up only its own connection's
/// thread.
pub fn write_conntrack_reply(
    nf: &tapyard::nat::Netfilter,
    now: tapyard::Instant,
    v6: bool,
    out: impl Write,
) -> io::Result<()> {
    let names = service_names(nf);
    let rows = nf.conntrack().dump(now);
    let mut w = RowStream::begin(io::BufWriter::with_capacity(256 * 1024, out))?;
    for v in &rows {
        w.row(&ct_row(v, &names))?;
    }
    drop(rows);
    if v6 {
        for v in &nf.conntrack_of::<std::net::Ipv6Addr>().dump(now) {
            w.row(&ct_row(v, &names))?;
        }
    }
    w.finish()?.flush()
}

/// Whether the node has IPv6 (an interface with an IPv6 address): its IPv6 connection table
/// is listed (looking at it makes it, so a node without IPv6 does not).
pub fn has_v6(node: &Node) -> bool {
    let cur = node.current.lock().unwrap_or_else(|e| e.into_inner());
    cur.connected().iter().any(|c| c.address6.is_some())
}

/// `show conntrack` (the library's `conntrack -L` text, or the entries' fields) and `show
/// services` (an `ipvsadm -Ln`-like listing, or each Service's settings).
fn nat_show(
    node: &Node,
    what: &str,
    as_json: bool,
    now: tapyard::Instant,
) -> Result<Shown, String> {
    let Some(nf) = node.dp.control().netfilter() else {
        return Err(no_nat(what));
    };
    if what == "conntrack" {
        let v6 = has_v6(node);
        if !as_json {
            // `conntrack -L`, then `conntrack -L -f ipv6`.
            let mut text = nf.conntrack().fmt_dump(now);
            if v6 {
                text.push_str(&nf.conntrack_of::<std::net::Ipv6Addr>().fmt_dump(now));
            }
            return Ok(Shown::Text(text));
        }
        // The control socket streams this one (`write_conntrack_reply`); the same rows as
        // one value, for callers that want it so.
        let names = service_names(nf);
        let owned = |r: ConntrackRow<'_>| ConntrackRow {
            service: r.service.map(|s| Cow::Owned(s.into_owned())),
            protocol: Cow::Owned(r.protocol.into_owned()),
            state: r.state.map(|s| Cow::Owned(s.into_owned())),
            ..r
        };
        let mut rows: Vec<ConntrackRow<'static>> = nf
            .conntrack()
            .dump(now)
            .iter()
            .map(|v| owned(ct_row(v, &names)))
            .collect();
        if v6 {
            let dump = nf.conntrack_of::<std::net::Ipv6Addr>().dump(now);
            rows.extend(dump.iter().map(|v| owned(ct_row(v, &names))));
        }
        return Ok(Shown::Data(ShowData::Conntrack(rows)));
    }
    if !as_json {
        return Ok(Shown::Text(nf.services().fmt_services()));
    }
    use tapyard::nat::LbAlgo;
    // Every ClusterIP of each Service (one per family), as the file gives them.
    let cluster_ips: HashMap<String, Vec<String>> = {
        let cur = node.current.lock().unwrap_or_else(|e| e.into_inner());
        cur.services
            .iter()
            .map(|s| {
                let ips = s.cluster_ips.iter().map(|ip| ip.to_string()).collect();
                (s.name.clone(), ips)
            })
            .collect()
    };
    let rows = nf
        .services()
        .list()
        .into_iter()
        .map(|s| {
            let r = nf.services().get(&s.name);
            let id = r.as_ref().map(|r| r.id().get());
            // The first ClusterIP: the IPv4 one, else the IPv6 one.
            let cluster_ip = match (s.vip, s.vip6) {
                (Some(a), _) => a.to_string(),
                (None, Some(a)) => a.to_string(),
                (None, None) => String::new(),
            };
            let ips = cluster_ips
                .get(&s.name)
                .cloned()
                .unwrap_or_else(|| vec![cluster_ip.clone()]);
            // Both families' endpoints, with their conditions and the sets they are in.
            let row = |addr: std::net::SocketAddr, local, c: tapyard::nat::EndpointConditions| {
                let used_by = [(false, "cluster"), (true, "local")]
                    .into_iter()
                    .filter(|&(l, _)| r.as_ref().is_some_and(|r| r.has_endpoint(addr, l)))
                    .map(|(_, n)| n.to_string())
                    .collect();
                EndpointRow {
                    address: addr.to_string(),
                    local,
                    ready: c.ready,
                    serving: c.serving,
                    terminating: c.terminating,
                    used_by,
                }
            };
            let endpoints = s
                .endpoints
                .iter()
                .map(|e| row(e.addr.into(), e.local, e.conditions))
                .chain(
                    s.endpoints6
                        .iter()
                        .map(|e| row(e.addr.into(), e.local, e.conditions)),
                )
                .collect();
            let algorithm = match s.algo {
                LbAlgo::Random => "random",
                LbAlgo::Maglev => "maglev",
            };
            ServiceRow {
                affinity_timeout_secs: s.affinity.map(|d| d.as_secs()),
                algorithm: algorithm.into(),
                cluster_ip,
                cluster_ips: ips,
                endpoints,
                external_traffic_policy: if s.external_local { "local" } else { "cluster" }.into(),
                id,
                internal_traffic_policy: if s.internal_local { "local" } else { "cluster" }.into(),
                name: s.name,
                health_check_node_port: s.health_check_node_port,
                node_port: s.node_port,
                port: s.port,
                protocol: s.proto.name().unwrap_or("?").into(),
                session_affinity: if s.affinity.is_some() {
                    "client-ip"
                } else {
                    "none"
                }
                .into(),
                load_balancer_ips: strings(&s.load_balancer_ips),
                external_ips: strings(&s.external_ips),
                load_balancer_source_ranges: strings(&s.load_balancer_source_ranges),
            }
        })
        .collect();
    Ok(Shown::Data(ShowData::Services(rows)))
}

/// Each item as text.
fn strings<T: ToString>(v: &[T]) -> Vec<String> {
    v.iter().map(ToString::to_string).collect()
}

/// `show routes --json`'s rows of one family's table (as `ip -j route` shows them).
fn route_rows<A: tapyard::l3::RouteAddr>(
    dp: tapyard::Control<'_>,
    t: Option<&tapyard::l3::RouteTable<A>>,
) -> Vec<RouteRow> {
    use tapyard::l3::{NextHop, RouteProto};
    let Some(t) = t else { return Vec::new() };
    t.routes()
        .into_iter()
        .map(|r| {
            let (kind, gw, dev) = match r.next_hop {
                NextHop::Link(i) => ("unicast", None, dp.iface_name(i)),
                NextHop::Via(i, g) => ("unicast", Some(g.to_string()), dp.iface_name(i)),
                NextHop::Blackhole => ("blackhole", None, None),
                NextHop::Unreachable => ("unreachable", None, None),
                NextHop::Prohibit => ("prohibit", None, None),
            };
            RouteRow {
                dev: dev.map(str::to_string),
                dst: format!("{}/{}", r.prefix, r.len),
                gateway: gw,
                metric: r.metric,
                prefsrc: r.src.map(|s| s.to_string()),
                protocol: match r.proto {
                    RouteProto::Kernel => "kernel",
                    RouteProto::Static => "static",
                }
                .into(),
                kind: kind.into(),
            }
        })
        .collect()
}
