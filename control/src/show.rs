//! The data of `show WHAT` with `json`: one row type per table, and [`Stats`].
//!
//! Each row's fields are in alphabetical order (as the rows were when they were built as
//! `serde_json::Value` maps), and `tapyard show WHAT --json` prints the data as it comes, so
//! its output is byte for byte what it was. A `null` field is written as `null`; the fields
//! that some rows of a table have and others not are marked so.
//!
//! These rows are the protocol's own types, not the library's dumps (`tapyard`'s `FdbEntry`,
//! `NeighEntry`, `Route`, `CtView`, `StatsSnapshot`, which are `Serialize` with its `serde`
//! feature), and this crate does not depend on the library: a row names ports, bridges and
//! interfaces where a dump carries ids, formats addresses and prefixes as `ip -j` does, and
//! keeps its shape from one protocol version to the next whatever the library's types
//! become; and the CNI plugin and other clients build this crate without the datapath. The
//! server (`cli/src/control/show.rs`) turns each dump into its rows in one place.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::net::IpAddr;

use serde::{Deserialize, Serialize, Serializer};

/// A row of `show fdb`: a bridge's learned or static entry, or one a VXLAN peer implies.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FdbRow {
    /// Seconds since the entry was last seen (`null`: static).
    pub age_secs: Option<f64>,
    /// The port (or the VXLAN interface).
    pub dev: String,
    /// A VXLAN entry's remote node (absent on a bridge's entry).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dst: Option<String>,
    /// The MAC address.
    pub mac: String,
    /// A bridge entry's bridge (absent on a VXLAN entry).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub master: Option<String>,
    /// Whether it is static.
    #[serde(rename = "static")]
    pub is_static: bool,
}

/// A row of `show neigh`: an ARP entry, or (after them) an NDP entry.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NeighRow {
    /// Seconds since it was last confirmed (`null`: never).
    pub confirmed_ago_secs: Option<f64>,
    /// The interface.
    pub dev: String,
    /// The neighbour's address.
    pub dst: String,
    /// Its MAC address (`null`: unresolved).
    pub lladdr: Option<String>,
    /// Packets waiting for the resolution.
    pub queued: u64,
    /// `reachable`, `stale`, `incomplete`, ...
    pub state: String,
    /// Seconds since it last changed.
    pub updated_ago_secs: f64,
}

/// A row of `show routes` (as `ip -j route` shows them; IPv6 routes after IPv4's).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteRow {
    /// The interface (`null`: a blackhole, unreachable or prohibit route).
    pub dev: Option<String>,
    /// The prefix, `a.b.c.d/len`.
    pub dst: String,
    /// The next hop (`null`: on link).
    pub gateway: Option<String>,
    /// The metric.
    pub metric: u32,
    /// The preferred source address (`null`: none).
    pub prefsrc: Option<String>,
    /// `kernel` or `static`.
    pub protocol: String,
    /// `unicast`, `blackhole`, `unreachable` or `prohibit`.
    #[serde(rename = "type")]
    pub kind: String,
}

/// A row of `show conntrack`: one connection (IPv6 connections after IPv4's). The server
/// writes these one by one ([`crate::RowStream`]) from borrowed strings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConntrackRow<'a> {
    /// Seen both ways long enough to be kept under pressure.
    pub assured: bool,
    /// Its destination is translated.
    pub dnat: bool,
    /// The connection mark.
    pub mark: u32,
    /// The original direction.
    pub orig: TupleRow,
    /// Bytes in the original direction.
    pub orig_bytes: u64,
    /// Packets in the original direction.
    pub orig_packets: u64,
    /// The IP protocol number.
    pub proto: u8,
    /// `tcp`, `udp`, `icmp`, ...
    pub protocol: Cow<'a, str>,
    /// The reply direction.
    pub reply: TupleRow,
    /// Bytes in the reply direction.
    pub reply_bytes: u64,
    /// Packets in the reply direction.
    pub reply_packets: u64,
    /// The Service it was load-balanced to (`null`: none).
    pub service: Option<Cow<'a, str>>,
    /// That Service's id (0: none).
    pub service_id: u32,
    /// Its source is translated.
    pub snat: bool,
    /// The TCP state (`null`: not TCP).
    pub state: Option<Cow<'a, str>>,
    /// Seconds before it expires.
    pub timeout_secs: u64,
    /// No reply seen yet.
    pub unreplied: bool,
    /// The conntrack zone.
    pub zone: u16,
}

/// One direction of a [`ConntrackRow`] (addresses of either family, as strings).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TupleRow {
    /// Destination port (ICMP: 0).
    pub dport: u16,
    /// Destination address.
    pub dst: IpAddr,
    /// Source port (ICMP: the identifier).
    pub sport: u16,
    /// Source address.
    pub src: IpAddr,
}

/// A row of `show services`: a Service's settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceRow {
    /// The affinity's timeout (`null`: no affinity).
    pub affinity_timeout_secs: Option<u64>,
    /// `random` or `maglev`.
    pub algorithm: String,
    /// The (first) ClusterIP.
    pub cluster_ip: String,
    /// Every ClusterIP (one per family).
    pub cluster_ips: Vec<String>,
    /// The endpoints.
    pub endpoints: Vec<EndpointRow>,
    /// The external IPs, of both families.
    #[serde(default)]
    pub external_ips: Vec<String>,
    /// `local` or `cluster`.
    pub external_traffic_policy: String,
    /// The health check node port (`null`: none).
    #[serde(default)]
    pub health_check_node_port: Option<u16>,
    /// The Service's id in the NAT (`null`: not installed).
    pub id: Option<u32>,
    /// `local` or `cluster` (absent from an older server: `cluster`).
    #[serde(default = "cluster")]
    pub internal_traffic_policy: String,
    /// The LoadBalancer ingress IPs (kubectl's EXTERNAL-IP), of both families.
    #[serde(default)]
    pub load_balancer_ips: Vec<String>,
    /// The prefixes allowed to reach the LoadBalancer IPs (empty: everyone).
    #[serde(default)]
    pub load_balancer_source_ranges: Vec<String>,
    /// The name.
    pub name: String,
    /// The NodePort (`null`: none).
    pub node_port: Option<u16>,
    /// The port.
    pub port: u16,
    /// `tcp` or `udp`.
    pub protocol: String,
    /// `client-ip` or `none`.
    pub session_affinity: String,
}

/// An endpoint of a [`ServiceRow`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointRow {
    /// `address:port`.
    pub address: String,
    /// Whether it is on this node.
    pub local: bool,
    /// EndpointSlice condition `ready` (absent from an older server: true).
    #[serde(default = "yes")]
    pub ready: bool,
    /// EndpointSlice condition `serving` (absent: true).
    #[serde(default = "yes")]
    pub serving: bool,
    /// EndpointSlice condition `terminating` (absent: false).
    #[serde(default)]
    pub terminating: bool,
    /// The endpoint sets new connections choose it from: `cluster` (policy Cluster) and/or
    /// `local` (a Local policy); empty: it takes none (absent from an older server: empty).
    #[serde(default)]
    pub used_by: Vec<String>,
}

fn yes() -> bool {
    true
}

fn cluster() -> String {
    "cluster".into()
}

/// A row of `show ports`: a port with its counters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortRow {
    /// The bridge (`null`: an uplink).
    pub bridge: Option<String>,
    /// The addresses its spoof guard allows, with its MAC (empty: no guard).
    #[serde(default)]
    pub guard: Vec<String>,
    /// Its ifindex where it lives (`null`: not found).
    pub ifindex: Option<u32>,
    /// Its interface name where it lives.
    pub ifname: String,
    /// `pod` or `uplink`.
    pub kind: String,
    /// Its MAC address (`null`: not found).
    pub mac: Option<String>,
    /// The port's name.
    pub name: String,
    /// The namespace it lives in (`null`: tapyard's).
    pub netns: Option<String>,
    /// `config`, `port add` or `cni`.
    pub origin: String,
    /// The CNI owner key (`null`: not a CNI port).
    pub owner: Option<String>,
    /// Bytes received.
    pub rx_bytes: u64,
    /// Packets received.
    pub rx_packets: u64,
    /// Frames its spoof guard dropped.
    #[serde(default)]
    pub spoofed: u64,
    /// Its TAP's name in tapyard's namespace.
    pub tap: String,
    /// Bytes sent.
    pub tx_bytes: u64,
    /// Packets sent.
    pub tx_packets: u64,
}

/// A row of `show vxlan`: a VXLAN interface and its peers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VxlanRow {
    /// Its address and prefix length.
    pub address: String,
    /// The local VTEP address.
    pub local: String,
    /// Its MAC address.
    pub mac: String,
    /// Its MTU.
    pub mtu: u16,
    /// Its name.
    pub name: String,
    /// The peers.
    pub peers: Vec<VxlanPeerRow>,
    /// The UDP destination port.
    pub port: u16,
    /// The UDP source port range.
    pub src_ports: [u16; 2],
    /// The uplink interface.
    pub uplink: String,
    /// The VNI.
    pub vni: u32,
}

/// A peer of a [`VxlanRow`] with its counters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VxlanPeerRow {
    /// The peer node's address.
    pub node_ip: String,
    /// Its pods' prefix.
    pub pod_cidr: String,
    /// Bytes received from it.
    pub rx_bytes: u64,
    /// Packets received from it.
    pub rx_packets: u64,
    /// Bytes sent to it.
    pub tx_bytes: u64,
    /// Packets sent to it.
    pub tx_packets: u64,
    /// Its VTEP's MAC address.
    pub vtep_mac: String,
}

/// Counters by name.
pub type Counters = BTreeMap<String, u64>;

/// The data of `show stats`: the datapath's totals at the top level (each under its
/// declared name), beside the other fields; every object's keys in alphabetical order.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Stats {
    /// Drops by reason.
    pub drops: Counters,
    /// Each bridge's forwarding database.
    pub fdb: Vec<FdbCounters>,
    /// The NAT's (`null`: no NAT).
    pub nat: Option<Counters>,
    /// The ARP table's (`null`: no router).
    pub neigh: Option<NeighCounters>,
    /// Each port's.
    pub ports: Vec<PortCounters>,
    /// The router's (`null`: no router).
    pub router: Option<Counters>,
    /// The datapath's totals.
    #[serde(flatten)]
    pub totals: Counters,
}

/// A port's counters in [`Stats`].
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct PortCounters {
    /// The port.
    pub name: String,
    /// Its counters.
    #[serde(flatten)]
    pub counters: Counters,
}

/// A bridge's forwarding database's counters in [`Stats`].
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct FdbCounters {
    /// The bridge.
    pub bridge: String,
    /// Its entries.
    pub entries: u64,
    /// Its counters.
    #[serde(flatten)]
    pub counters: Counters,
}

/// The ARP table's counters in [`Stats`].
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct NeighCounters {
    /// Its entries.
    pub entries: u64,
    /// Packets waiting for a resolution now.
    pub queued_now: u64,
    /// Its counters.
    #[serde(flatten)]
    pub counters: Counters,
}

/// A field of an object whose named fields and counters are written in one alphabetical
/// order.
#[derive(Serialize)]
#[serde(untagged)]
enum Field<'a> {
    U64(u64),
    Str(&'a str),
    Counters(Option<&'a Counters>),
    Ports(&'a [PortCounters]),
    Fdb(&'a [FdbCounters]),
    Neigh(Option<&'a NeighCounters>),
}

/// Writes `named` and `counters` as one map, keys in alphabetical order.
fn sorted<'a, S: Serializer>(
    s: S,
    mut named: Vec<(&'a str, Field<'a>)>,
    counters: &'a Counters,
) -> Result<S::Ok, S::Error> {
    named.extend(counters.iter().map(|(k, v)| (k.as_str(), Field::U64(*v))));
    named.sort_by(|a, b| a.0.cmp(b.0));
    s.collect_map(named)
}

impl Serialize for Stats {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let named = vec![
            ("drops", Field::Counters(Some(&self.drops))),
            ("fdb", Field::Fdb(&self.fdb)),
            ("nat", Field::Counters(self.nat.as_ref())),
            ("neigh", Field::Neigh(self.neigh.as_ref())),
            ("ports", Field::Ports(&self.ports)),
            ("router", Field::Counters(self.router.as_ref())),
        ];
        sorted(s, named, &self.totals)
    }
}

impl Serialize for PortCounters {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        sorted(s, vec![("name", Field::Str(&self.name))], &self.counters)
    }
}

impl Serialize for FdbCounters {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let named = vec![
            ("bridge", Field::Str(&self.bridge)),
            ("entries", Field::U64(self.entries)),
        ];
        sorted(s, named, &self.counters)
    }
}

impl Serialize for NeighCounters {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let named = vec![
            ("entries", Field::U64(self.entries)),
            ("queued_now", Field::U64(self.queued_now)),
        ];
        sorted(s, named, &self.counters)
    }
}
