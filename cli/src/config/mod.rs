//! The node's configuration file: its model, a parser that reports every error with its line,
//! and the checks `tapyard check` runs.
//!
//! * [`schema`]: the description of every section and key (type, range, default, help), which
//!   drives the parser and renders the key reference at the end of `examples/node.toml`;
//! * [`values`]: the values written as strings (prefixes, addresses, names);
//! * `parse`: one pass over toml's spanned document ([`toml::de::DeTable`]) instead of serde
//!   derives, so that *all* problems are reported (syntax errors, unknown keys, wrong types,
//!   bad values), not only the first one serde meets;
//! * `validate`: the cross-checks between sections;
//! * `summary`: `check`'s one line.
//!
//! Sections the library has a type for are parsed into it: `[neigh]` into
//! [`NeighConfig`], `[conntrack]` into [`CtConfig`]; each `[[service]]` is a [`ServiceDef`]
//! (one or two ClusterIPs, one per family) from which the library's Services are made. The
//! keys that take an address (`address`, `cluster_cidr`, `cluster_ip`) take a string or a list
//! of at most one per family; the IPv6 one is kept apart (`address6`, `cluster_cidr6`): a
//! router interface has an IPv4 address, an IPv6 one, or both. Each list item is [`Located`]: its value and the lines of its fields
//! ([`Lines`]), for the cross-checks and the errors of a reload. Comparing configurations (a
//! reload's difference) compares the values only, never the lines.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tapyard::conntrack::CtConfig;
use tapyard::l3::neigh::NeighConfig;
use tapyard::nat::{Endpoint, Endpoint6, LbAlgo, ServiceSpec};
use tapyard::wire::family::IpProto;
use tapyard::MacAddr;
use toml::de::DeTable;

mod parse;
pub mod schema;
mod summary;
mod validate;
pub mod values;

use parse::{LineMap, Parser};
pub use summary::summary;
pub use validate::validate;
pub use values::{Cidr, Cidr6, IpCidr};

/// Where the fields of one table were, by name (`ports.N` for the N-th item of a list).
#[derive(Clone, Debug, Default)]
pub struct Lines {
    table: usize,
    fields: Vec<(String, usize)>,
}

impl Lines {
    /// The line of `field`, or of its table when the field was not given.
    pub fn of(&self, field: &str) -> usize {
        self.fields
            .iter()
            .find(|(f, _)| f == field)
            .map_or(self.table, |(_, l)| *l)
    }

    /// True when `field` was given in the file.
    pub fn has(&self, field: &str) -> bool {
        self.fields.iter().any(|(f, _)| f == field)
    }
}

/// A value read from the file with the lines of its fields. It dereferences to the value;
/// it has no `PartialEq`: compare `.value`s, so that layout never counts as a change.
#[derive(Clone, Debug)]
pub struct Located<T> {
    /// What was read.
    pub value: T,
    /// Where each field was.
    pub lines: Lines,
}

impl<T> std::ops::Deref for Located<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.value
    }
}

/// `[node]`.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeCfg {
    /// The node's name (also names the default control socket).
    pub name: String,
    /// Every IPv4 pod address in the cluster; `None`: a single-stack IPv6 cluster.
    pub cluster_cidr: Option<Cidr>,
    /// Every IPv6 pod address in the cluster (a dual-stack cluster).
    pub cluster_cidr6: Option<Cidr6>,
    /// Worker threads; `None`: one per TAP, at most the CPU count.
    pub workers: Option<usize>,
    /// Busy polling: microseconds a worker keeps reading its ports after the last frame
    /// before it sleeps ([`tapyard::runtime::RuntimeConfig::busy_poll`]); 0: never spins.
    pub busy_poll_us: u32,
    /// The control socket; `None`: `/run/tapyard/<name>.sock`.
    pub socket: Option<PathBuf>,
    /// Where ports and connection state are kept across restarts; `None`:
    /// `/run/tapyard/<name>`.
    pub state_dir: Option<PathBuf>,
    /// Node ports Services may use (inclusive).
    pub node_port_range: (u16, u16),
    /// TAP devices with virtio-net headers and checksum/TSO offloads.
    pub offload: bool,
}

impl NodeCfg {
    /// The control socket's path.
    pub fn socket_path(&self) -> PathBuf {
        self.socket
            .clone()
            .unwrap_or_else(|| default_socket(&self.name))
    }

    /// The state directory's path.
    pub fn state_dir_path(&self) -> PathBuf {
        self.state_dir
            .clone()
            .unwrap_or_else(|| default_state_dir(&self.name))
    }
}

/// The default state directory of node `name`.
pub fn default_state_dir(name: &str) -> PathBuf {
    PathBuf::from(format!("/run/tapyard/{name}"))
}

/// The default control socket of node `name`.
pub fn default_socket(name: &str) -> PathBuf {
    PathBuf::from(format!("/run/tapyard/{name}.sock"))
}

/// `[[bridge]]`.
#[derive(Clone, Debug, PartialEq)]
pub struct BridgeCfg {
    /// The bridge's name (and its router interface's).
    pub name: String,
    /// The gateway's IPv4 address on it; `None` (and no `address6`): a plain L2 bridge.
    pub address: Option<Cidr>,
    /// The gateway's IPv6 address on it (with `address`: a dual-stack gateway; alone: an
    /// IPv6-only one).
    pub address6: Option<Cidr6>,
    /// Send Router Advertisements on it (radvd's defaults), so that pods learn their default
    /// IPv6 router.
    pub ra: bool,
    /// The router interface's MAC; `None`: derived from the node's and the bridge's names.
    pub mac: Option<MacAddr>,
    /// The router interface's MTU.
    pub mtu: u16,
    /// TAP devices created as its ports.
    pub ports: Vec<String>,
    /// FDB entry limit.
    pub fdb_max_entries: usize,
    /// FDB aging time.
    pub fdb_aging: Duration,
}

/// `[[uplink]]`: a router interface owning a TAP device.
#[derive(Clone, Debug, PartialEq)]
pub struct UplinkCfg {
    /// The interface's name (and, unless `tap` says otherwise, its TAP's).
    pub name: String,
    /// The TAP device's name.
    pub tap: String,
    /// Its IPv4 address; `None`: an IPv6-only uplink (then `address6` is set).
    pub address: Option<Cidr>,
    /// Its IPv6 address.
    pub address6: Option<Cidr6>,
    /// Its MAC; `None`: derived from the node's and the uplink's names.
    pub mac: Option<MacAddr>,
    /// Its MTU.
    pub mtu: u16,
}

/// What a route does with matching packets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RouteType {
    /// Forwarded (`via` a gateway and/or out of `dev`).
    Unicast,
    /// Dropped silently.
    Blackhole,
    /// Dropped with ICMP host unreachable.
    Unreachable,
}

/// `[[route]]`.
#[derive(Clone, Debug, PartialEq)]
pub struct RouteCfg {
    /// The destination prefix (either family).
    pub to: IpCidr,
    /// The gateway, of `to`'s family (an IPv6 one may be link-local, with `dev`).
    pub via: Option<IpAddr>,
    /// The interface (a bridge with an address, or an uplink).
    pub dev: Option<String>,
    /// The route type.
    pub kind: RouteType,
    /// Lower wins among routes to one prefix.
    pub metric: u32,
}

impl RouteCfg {
    /// How `ip route` would write it.
    pub fn describe(&self) -> String {
        let mut s = match self.kind {
            RouteType::Unicast => self.to.to_string(),
            RouteType::Blackhole => format!("blackhole {}", self.to),
            RouteType::Unreachable => format!("unreachable {}", self.to),
        };
        if let Some(v) = self.via {
            s += &format!(" via {v}");
        }
        if let Some(d) = &self.dev {
            s += &format!(" dev {d}");
        }
        if self.metric != 0 {
            s += &format!(" metric {}", self.metric);
        }
        s
    }
}

/// `[[neighbor]]`: a permanent ARP (IPv4) or NDP (IPv6) entry.
#[derive(Clone, Debug, PartialEq)]
pub struct NeighborCfg {
    /// The neighbour's address.
    pub ip: IpAddr,
    /// Its MAC.
    pub mac: MacAddr,
    /// The interface it is on.
    pub dev: String,
}

/// `[[service]]` as configured (an endpoint is local when it is inside one of this node's
/// bridge subnets), with the lines of its keys (`endpoints.N` for the N-th endpoint,
/// `cluster_ip.N` for the N-th ClusterIP of a list).
pub type ServiceCfg = Located<ServiceDef>;

/// An endpoint of a [`ServiceDef`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EndpointCfg {
    /// Its address and port.
    pub addr: SocketAddr,
    /// Inside one of this node's bridge subnets.
    pub local: bool,
}

/// A `[[service]]`: one frontend per ClusterIP (at most one per family, as a dual-stack
/// Kubernetes Service), each with the endpoints of its family.
#[derive(Clone, Debug, PartialEq)]
pub struct ServiceDef {
    /// The Service's name.
    pub name: String,
    /// Its ClusterIPs, as written (one or two, of different families).
    pub cluster_ips: Vec<IpAddr>,
    /// Its port on each ClusterIP.
    pub port: u16,
    /// 6 (TCP) or 17 (UDP).
    pub proto: u8,
    /// Its node port, on the node's addresses of its ClusterIPs' families.
    pub node_port: Option<u16>,
    /// The endpoints, of both families.
    pub endpoints: Vec<EndpointCfg>,
    /// Client-IP affinity and its timeout.
    pub affinity: Option<Duration>,
    /// How an endpoint is chosen.
    pub algo: LbAlgo,
    /// `externalTrafficPolicy: Local`.
    pub external_local: bool,
}

impl ServiceDef {
    /// Its IPv4 ClusterIP.
    pub fn vip4(&self) -> Option<Ipv4Addr> {
        self.cluster_ips.iter().find_map(|ip| match ip {
            IpAddr::V4(a) => Some(*a),
            IpAddr::V6(_) => None,
        })
    }

    /// Its IPv6 ClusterIP.
    pub fn vip6(&self) -> Option<Ipv6Addr> {
        self.cluster_ips.iter().find_map(|ip| match ip {
            IpAddr::V6(a) => Some(*a),
            IpAddr::V4(_) => None,
        })
    }

    /// The frontends as `ip:port` and `[ip]:port`, comma separated (for messages).
    pub fn describe_frontends(&self) -> String {
        self.cluster_ips
            .iter()
            .map(|ip| SocketAddr::new(*ip, self.port).to_string())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The library's Service: a frontend per ClusterIP (`vip` for the IPv4 one, `vip6` for
    /// the IPv6 one), each with the endpoints of its family.
    pub fn spec(&self) -> ServiceSpec {
        let mut spec = ServiceSpec::new(
            self.name.clone(),
            Ipv4Addr::UNSPECIFIED,
            self.port,
            IpProto::from(self.proto),
        );
        spec.vip = self.vip4();
        spec.vip6 = self.vip6();
        spec.node_port = self.node_port;
        for e in &self.endpoints {
            match e.addr {
                SocketAddr::V4(a) => spec.endpoints.push(Endpoint::new(a, e.local)),
                SocketAddr::V6(a) => spec.endpoints6.push(Endpoint6::new(
                    SocketAddrV6::new(*a.ip(), a.port(), 0, 0),
                    e.local,
                )),
            }
        }
        spec.affinity = self.affinity;
        spec.algo = self.algo;
        spec.external_local = self.external_local;
        spec
    }
}

/// A Service's protocol as written in the file.
pub fn proto_name(proto: u8) -> &'static str {
    match proto {
        6 => "tcp",
        17 => "udp",
        _ => "?",
    }
}

/// `[masquerade]`.
#[derive(Clone, Debug, PartialEq)]
pub struct MasqueradeCfg {
    /// The interface whose address pod traffic leaving the cluster CIDR takes.
    pub out: String,
}

/// `[[snat]]`: source NAT to a fixed address (`iptables`/`ip6tables -t nat -A POSTROUTING
/// -s <src> [-o <out>] -j SNAT --to-source <to>:<ports>`), checked after `[masquerade]`.
#[derive(Clone, Debug, PartialEq)]
pub struct SnatCfg {
    /// The sources it applies to (either family).
    pub src: IpCidr,
    /// The new source address, of `src`'s family.
    pub to: IpAddr,
    /// The egress interface (`None`: any).
    pub out: Option<String>,
    /// The source ports to use (`None`: the original port's class, as iptables' SNAT
    /// without a range).
    pub ports: Option<(u16, u16)>,
}

/// `[[vxlan]]`: a VXLAN interface and its peers.
#[derive(Clone, Debug)]
pub struct VxlanCfg {
    /// The interface's name.
    pub name: String,
    /// The VNI.
    pub vni: u32,
    /// The UDP port.
    pub port: u16,
    /// The uplink it sends from and receives on.
    pub uplink: String,
    /// The VTEP's address; its family is the underlay's.
    pub address: IpCidr,
    /// The VTEP MAC; `None`: 0a:58 and the address's bytes.
    pub mac: Option<MacAddr>,
    /// The MTU; `None`: the uplink's minus 50.
    pub mtu: Option<u16>,
    /// UDP source ports.
    pub src_ports: (u16, u16),
    /// `[[vxlan.peer]]`s, in file order.
    pub peers: Vec<Located<PeerCfg>>,
}

/// `[[vxlan.peer]]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PeerCfg {
    /// The node's underlay address, of the interface's underlay family (its `address`'s).
    pub node_ip: IpAddr,
    /// Its VTEP MAC.
    pub vtep_mac: MacAddr,
    /// Its pod subnet, of the interface address's family.
    pub pod_cidr: IpCidr,
}

/// A whole configuration file.
#[derive(Clone, Debug)]
pub struct Config {
    /// `[node]`.
    pub node: NodeCfg,
    /// `[[bridge]]`s, in file order.
    pub bridges: Vec<Located<BridgeCfg>>,
    /// `[[uplink]]`s.
    pub uplinks: Vec<Located<UplinkCfg>>,
    /// `[[route]]`s.
    pub routes: Vec<Located<RouteCfg>>,
    /// `[[neighbor]]`s.
    pub neighbors: Vec<Located<NeighborCfg>>,
    /// `[[service]]`s.
    pub services: Vec<ServiceCfg>,
    /// `[[vxlan]]`s.
    pub vxlans: Vec<Located<VxlanCfg>>,
    /// `[masquerade]`.
    pub masquerade: Option<Located<MasqueradeCfg>>,
    /// `[[snat]]`s, first match wins.
    pub snats: Vec<Located<SnatCfg>>,
    /// `[conntrack]`, as the library's table configuration.
    pub conntrack: CtConfig,
    /// `[conntrack] max_entries6`, if given (see [`Config::conntrack6`]).
    pub max_entries6: Option<usize>,
    /// `[neigh]`, as the library's neighbour table configuration.
    pub neigh: NeighConfig,
}

/// An interface with an address: a bridge's gateway or an uplink.
#[derive(Clone, Debug, PartialEq)]
pub struct Connected<'a> {
    /// Its name.
    pub name: &'a str,
    /// Its IPv4 address and prefix; `None`: an IPv6-only interface.
    pub address: Option<Cidr>,
    /// Its IPv6 address and prefix (at least one of the two is set).
    pub address6: Option<Cidr6>,
}

/// Entries of the IPv6 connection table of a node without an IPv6 address (unless
/// `[conntrack] max_entries6` says otherwise): such a node routes no IPv6, so its IPv6 table
/// only ever holds the few ICMPv6 echoes to the router's link-local addresses.
pub const MIN_CONNTRACK6: usize = 64;

impl Config {
    /// The IPv6 connection table's configuration: `[conntrack]`'s, with `max_entries6` entries
    /// when given, else `max_entries` on a node with an IPv6 address and [`MIN_CONNTRACK6`]
    /// on one without.
    pub fn conntrack6(&self) -> CtConfig {
        let has_v6 = self.connected().iter().any(|c| c.address6.is_some());
        let max_entries = match self.max_entries6 {
            Some(n) => n,
            None if has_v6 => self.conntrack.max_entries,
            None => MIN_CONNTRACK6,
        };
        CtConfig {
            max_entries,
            ..self.conntrack
        }
    }

    /// Every interface with an address (bridges first, then uplinks: the router's order).
    pub fn connected(&self) -> Vec<Connected<'_>> {
        self.bridges
            .iter()
            .filter(|b| b.address.is_some() || b.address6.is_some())
            .map(|b| Connected {
                name: &b.name,
                address: b.address,
                address6: b.address6,
            })
            .chain(self.uplinks.iter().map(|u| Connected {
                name: &u.name,
                address: u.address,
                address6: u.address6,
            }))
            .collect()
    }

    /// The interface whose IPv6 subnet holds `ip`, if any (the longest prefix).
    pub fn connected_iface6(&self, ip: Ipv6Addr) -> Option<String> {
        self.connected()
            .into_iter()
            .filter_map(|c| c.address6.filter(|a| a.contains(ip)).map(|a| (c.name, a)))
            .max_by_key(|(_, a)| a.len)
            .map(|(n, _)| n.to_string())
    }

    /// The interface whose subnet holds `ip`, if any (the first, as the router's connected
    /// routes).
    pub fn connected_iface(&self, ip: Ipv4Addr) -> Option<String> {
        self.connected()
            .into_iter()
            .filter_map(|c| c.address.filter(|a| a.contains(ip)).map(|a| (c.name, a)))
            .max_by_key(|(_, a)| a.len)
            .map(|(n, _)| n.to_string())
    }
}

/// One problem found in a file.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Diag {
    /// 1-based line (0: the file as a whole).
    pub line: usize,
    /// A warning does not make the file invalid.
    pub warning: bool,
    /// What is wrong and what was expected.
    pub msg: String,
}

impl Diag {
    /// `file:line: message` (`file:line: warning: message` for a warning).
    pub fn render(&self, file: &str) -> String {
        let w = if self.warning { "warning: " } else { "" };
        if self.line == 0 {
            format!("{file}: {w}{}", self.msg)
        } else {
            format!("{file}:{}: {w}{}", self.line, self.msg)
        }
    }
}

/// The result of checking a file: the config if it has no errors, and every diagnostic.
#[derive(Debug)]
pub struct Checked {
    /// The configuration, when there were no errors.
    pub config: Option<Config>,
    /// Errors and warnings, by line.
    pub diags: Vec<Diag>,
}

impl Checked {
    /// The errors (not warnings).
    pub fn errors(&self) -> impl Iterator<Item = &Diag> {
        self.diags.iter().filter(|d| !d.warning)
    }
}

/// Reads and checks a file. An unreadable file is one error on line 0.
pub fn load(path: &Path) -> Checked {
    match std::fs::read_to_string(path) {
        Ok(s) => check_str(&s),
        Err(e) => Checked {
            config: None,
            diags: vec![Diag {
                line: 0,
                warning: false,
                msg: format!("cannot read the file: {e}"),
            }],
        },
    }
}

/// Parses and checks a configuration text.
pub fn check_str(src: &str) -> Checked {
    let lines = LineMap::new(src);
    let mut diags = Vec::new();
    let (doc, errors) = DeTable::parse_recoverable(src);
    for e in &errors {
        let line = e.span().map_or(0, |s| lines.line(s.start));
        diags.push(Diag {
            line,
            warning: false,
            msg: format!("TOML syntax: {}", e.message().trim()),
        });
    }
    let mut config = None;
    if errors.is_empty() {
        let mut p = Parser {
            lines: &lines,
            diags: &mut diags,
        };
        let (c, broken) = p.document(doc.get_ref());
        validate(&c, &broken, &mut diags);
        if !diags.iter().any(|d| !d.warning) {
            config = Some(c);
        }
    }
    diags.sort();
    diags.dedup();
    Checked { config, diags }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    const EXAMPLE: &str = include_str!("../../../examples/node.toml");

    fn errors(src: &str) -> Vec<String> {
        check_str(src)
            .diags
            .iter()
            .filter(|d| !d.warning)
            .map(|d| d.render("f"))
            .collect()
    }

    /// The `[[vxlan]]` of the issue, as Flannel sets a node up.
    pub(crate) const VXLAN: &str = r#"[node]
name = "node-a"
cluster_cidr = "10.244.0.0/16"

[[bridge]]
name = "cni0"
address = "10.244.1.1/24"

[[uplink]]
name = "eth0"
address = "172.18.0.2/24"

[[vxlan]]
name = "flannel.1"
vni = 1
port = 8472
uplink = "eth0"
address = "10.244.1.0/32"
mac = "0a:58:0a:f4:01:00"

[[vxlan.peer]]
node_ip = "172.18.0.3"
vtep_mac = "0a:58:0a:f4:02:00"
pod_cidr = "10.244.2.0/24"

[[service]]
name = "web"
cluster_ip = "10.96.0.10"
port = 80
endpoints = ["10.244.2.5:8080"]
"#;

    #[test]
    fn vxlan_as_flannel_sets_it_up_is_valid() {
        let ch = check_str(VXLAN);
        assert_eq!(ch.diags, Vec::new());
        let c = ch.config.unwrap();
        let v = &c.vxlans[0];
        assert_eq!(
            (v.vni, v.port, v.uplink.as_str(), v.mtu),
            (1, 8472, "eth0", None)
        );
        assert_eq!(v.address.to_string(), "10.244.1.0/32");
        assert_eq!(v.src_ports, (32768, 60999));
        assert_eq!(v.peers[0].pod_cidr.to_string(), "10.244.2.0/24");
        assert_eq!(v.peers[0].lines.of("vtep_mac"), 23);
        // Defaults: port 8472, MAC from the address.
        let c = check_str(
            &VXLAN
                .replace("port = 8472\n", "")
                .replace("mac = \"0a:58:0a:f4:01:00\"\n", ""),
        );
        assert!(c.config.is_some(), "{:?}", c.diags);
    }

    #[test]
    fn vxlan_errors_name_the_field_and_value() {
        let bad = VXLAN
            .replace("vni = 1", "vni = 16777216")
            .replace("uplink = \"eth0\"", "uplink = \"eth9\"")
            .replace("node_ip = \"172.18.0.3\"", "node_ip = \"172.18.0.2\"")
            + "\n[[vxlan.peer]]\nnode_ip = \"172.18.0.4\"\nvtep_mac = \"0a:58:0a:f4:02:00\"\npod_cidr = \"10.244.2.128/25\"\n";
        let e = errors(&bad).join("\n");
        for want in [
            "f:15: vxlan \"flannel.1\": vni = 16777216 is out of range",
            "f:17: vxlan \"flannel.1\": uplink = \"eth9\": no [[uplink]]",
            "f:22: vxlan \"flannel.1\" peer 172.18.0.2: node_ip = \"172.18.0.2\" is this node's own uplink address",
            "peer 172.18.0.4: vtep_mac = \"0a:58:0a:f4:02:00\" is already a peer's (line 23)",
            "peer 172.18.0.4: pod_cidr = \"10.244.2.128/25\" overlaps another peer's 10.244.2.0/24 (line 24)",
        ] {
            assert!(e.contains(want), "{want}\nnot in\n{e}");
        }
        let e = errors(&VXLAN.replace("mac = \"0a:58:0a:f4:01:00\"", "mtu = 1451")).join("\n");
        assert!(
            e.contains("mtu = 1451 is above uplink \"eth0\"'s MTU 1500 minus 50"),
            "{e}"
        );
        let e = errors(&VXLAN.replace(
            "pod_cidr = \"10.244.2.0/24\"",
            "pod_cidr = \"10.244.1.0/24\"",
        ))
        .join("\n");
        assert!(e.contains("overlaps this node's cni0 subnet"), "{e}");
        let e = errors(&VXLAN.replace("[[vxlan.peer]]", "[[vxlan.peer]]\nfoo = 1")).join("\n");
        assert!(e.contains("unknown field `foo`"), "{e}");
        // A Service endpoint behind a removed peer is a warning, not an error.
        let gone = VXLAN.replace("[[vxlan.peer]]\nnode_ip = \"172.18.0.3\"\nvtep_mac = \"0a:58:0a:f4:02:00\"\npod_cidr = \"10.244.2.0/24\"\n", "");
        let ch = check_str(&gone);
        assert!(ch.config.is_some(), "{:?}", ch.diags);
        assert!(ch.diags.iter().any(|d| d.warning
            && d.msg
                .contains("endpoint 10.244.2.5:8080 is in no peer's pod_cidr")));
    }

    /// Flannel's dual-stack node: flannel.1 over IPv4 and flannel-v6.1 over IPv6.
    pub(crate) const VXLAN6: &str = r#"[node]
name = "node-a"
cluster_cidr = ["10.244.0.0/16", "fd00:10:244::/56"]

[[bridge]]
name = "cni0"
address = ["10.244.1.1/24", "fd00:10:244:1::1/64"]

[[uplink]]
name = "eth0"
address = ["172.18.0.2/24", "fd00:172:18::2/64"]

[[vxlan]]
name = "flannel.1"
uplink = "eth0"
address = "10.244.1.0/32"

[[vxlan.peer]]
node_ip = "172.18.0.3"
vtep_mac = "0a:58:0a:f4:02:00"
pod_cidr = "10.244.2.0/24"

[[vxlan]]
name = "flannel-v6.1"
uplink = "eth0"
address = "fd00:10:244:1::/128"

[[vxlan.peer]]
node_ip = "fd00:172:18::3"
vtep_mac = "0a:58:02:44:00:02"
pod_cidr = "fd00:10:244:2::/64"
"#;

    #[test]
    fn vxlan_over_ipv6_as_flannel_dual_stack_is_valid_and_family_checked() {
        let ch = check_str(VXLAN6);
        assert_eq!(ch.diags, Vec::new());
        let c = ch.config.unwrap();
        let v = &c.vxlans[1];
        assert!(v.address.is_v6());
        assert_eq!(v.peers[0].node_ip.to_string(), "fd00:172:18::3");
        assert_eq!(v.peers[0].pod_cidr.to_string(), "fd00:10:244:2::/64");
        // An IPv6 peer on the IPv4-underlay interface and the reverse; a pod subnet of the
        // other family.
        let mixed = VXLAN6
            .replacen(
                "node_ip = \"172.18.0.3\"",
                "node_ip = \"fd00:172:18::4\"",
                1,
            )
            .replacen(
                "node_ip = \"fd00:172:18::3\"",
                "node_ip = \"172.18.0.4\"",
                1,
            )
            .replacen(
                "pod_cidr = \"fd00:10:244:2::/64\"",
                "pod_cidr = \"10.244.3.0/24\"",
                1,
            );
        let e = errors(&mixed).join("\n");
        for want in [
            "f:19: vxlan \"flannel.1\" peer fd00:172:18::4: node_ip = \"fd00:172:18::4\" is IPv6, but this [[vxlan]]'s address = \"10.244.1.0/32\" makes its underlay IPv4",
            "f:29: vxlan \"flannel-v6.1\" peer 172.18.0.4: node_ip = \"172.18.0.4\" is IPv4, but this [[vxlan]]'s address = \"fd00:10:244:1::/128\" makes its underlay IPv6",
            "f:31: vxlan \"flannel-v6.1\" peer 172.18.0.4: pod_cidr = \"10.244.3.0/24\" is IPv4, but this [[vxlan]]'s address = \"fd00:10:244:1::/128\" is IPv6",
        ] {
            assert!(e.contains(want), "{want}\nnot in\n{e}");
        }
        // An uplink without an IPv6 address cannot carry an IPv6 underlay.
        let v4_uplink = VXLAN6.replace(
            "address = [\"172.18.0.2/24\", \"fd00:172:18::2/64\"]",
            "address = \"172.18.0.2/24\"",
        );
        let e = errors(&v4_uplink).join("\n");
        assert!(
            e.contains("f:25: vxlan \"flannel-v6.1\": uplink = \"eth0\" has no IPv6 address"),
            "{e}"
        );
        let e = errors(&VXLAN6.replace(
            "address = \"fd00:10:244:1::/128\"",
            "address = \"fd00:10:244:1::/128\"\nmtu = 1431",
        ))
        .join("\n");
        assert!(
            e.contains("mtu = 1431 is above uplink \"eth0\"'s MTU 1500 minus 70"),
            "{e}"
        );
        // Overlapping IPv6 pod subnets and a node_ip that is this node's own.
        let e = errors(
            &(VXLAN6.replace("node_ip = \"fd00:172:18::3\"", "node_ip = \"fd00:172:18::2\"")
                + "\n[[vxlan.peer]]\nnode_ip = \"fd00:172:18::5\"\nvtep_mac = \"0a:58:02:44:00:05\"\npod_cidr = \"fd00:10:244:2::/63\"\n"),
        )
        .join("\n");
        assert!(
            e.contains("node_ip = \"fd00:172:18::2\" is this node's own uplink address"),
            "{e}"
        );
        assert!(
            e.contains(
                "pod_cidr = \"fd00:10:244:2::/63\" overlaps another peer's fd00:10:244:2::/64"
            ),
            "{e}"
        );
    }

    #[test]
    fn example_parses_into_the_model() {
        let ch = check_str(EXAMPLE);
        assert_eq!(ch.errors().count(), 0, "{:?}", ch.diags);
        let c = ch.config.unwrap();
        assert_eq!(c.node.name, "node-a");
        assert_eq!(c.node.cluster_cidr.unwrap().to_string(), "10.244.0.0/16");
        assert_eq!(c.node.node_port_range, (30000, 32767));
        assert_eq!(
            c.node.socket_path(),
            PathBuf::from("/run/tapyard/node-a.sock")
        );
        assert_eq!(c.bridges[0].ports, ["pod-a", "pod-b"]);
        assert_eq!(c.bridges[0].address.unwrap().to_string(), "10.244.1.1/24");
        assert_eq!(c.uplinks[0].tap, "eth0");
        assert_eq!(c.routes.len(), 2);
        assert_eq!(c.routes[1].to.len(), 0);
        let web = &c.services[0];
        assert_eq!(web.proto, 6);
        assert_eq!(web.node_port, Some(30080));
        assert_eq!(web.vip4(), Some(Ipv4Addr::new(10, 96, 0, 10)));
        assert_eq!(web.endpoints.len(), 2);
        assert_eq!(c.services[1].proto, 17);
        assert_eq!(c.services[1].affinity, None);
        assert!(web.endpoints[0].local && !web.endpoints[1].local);
        assert_eq!(c.masquerade.as_ref().unwrap().out, "eth0");
        assert_eq!(
            c.connected_iface("172.18.0.3".parse().unwrap()).as_deref(),
            Some("eth0")
        );
    }

    const DUAL: &str = include_str!("../../../examples/node-dual-stack.toml");
    const V6ONLY: &str = include_str!("../../../examples/node-ipv6-only.toml");

    /// A single-stack IPv6 node: interfaces and cluster without IPv4; what could never work
    /// there (an IPv4 gateway, an IPv4 Service, an IPv4 route or neighbour out of an
    /// IPv6-only interface) is refused at its line.
    #[test]
    fn ipv6_only_example_parses_and_ipv4_items_are_refused_at_their_line() {
        let ch = check_str(V6ONLY);
        assert_eq!(ch.diags, Vec::new());
        let c = ch.config.unwrap();
        assert_eq!(c.node.cluster_cidr, None);
        assert_eq!(
            c.node.cluster_cidr6.unwrap().to_string(),
            "fd00:10:244::/56"
        );
        assert_eq!(c.bridges[0].address, None);
        assert_eq!(
            c.bridges[0].address6.unwrap().to_string(),
            "fd00:10:244:1::1/64"
        );
        assert_eq!(c.uplinks[0].address, None);
        let conn = c.connected();
        assert_eq!(conn.len(), 2);
        assert!(conn
            .iter()
            .all(|i| i.address.is_none() && i.address6.is_some()));
        assert_eq!(c.connected_iface("172.18.0.3".parse().unwrap()), None);
        let bad = format!(
            "{V6ONLY}
[[route]]
to = \"10.244.2.0/24\"
via = \"172.18.0.3\"

[[route]]
to = \"10.244.3.0/24\"
dev = \"eth0\"

[[neighbor]]
ip = \"172.18.0.9\"
mac = \"02:00:00:00:00:09\"
dev = \"eth0\"

[[neighbor]]
ip = \"fd00:172:18::9\"
mac = \"02:00:00:00:00:09\"
dev = \"eth0\"

[[service]]
name = \"web4\"
cluster_ip = \"10.96.0.10\"
port = 80
"
        );
        let line = |pat: &str| bad.lines().position(|l| l == pat).unwrap() + 1;
        let ch = check_str(&bad);
        let errs: Vec<(usize, String)> = ch.errors().map(|d| (d.line, d.msg.clone())).collect();
        let has = |l: usize, s: &str| errs.iter().any(|(x, m)| *x == l && m.contains(s));
        assert!(
            has(
                line("via = \"172.18.0.3\""),
                "no bridge or uplink has an IPv4 address"
            ),
            "{errs:?}"
        );
        assert!(
            has(line("dev = \"eth0\""), "has no IPv4 address (an IPv4 route"),
            "{errs:?}"
        );
        assert!(
            has(
                line("ip = \"172.18.0.9\"") + 2,
                "has no IPv4 address (an ARP entry"
            ),
            "{errs:?}"
        );
        assert!(
            has(
                line("cluster_ip = \"10.96.0.10\""),
                "is IPv4, and no bridge or uplink has an IPv4 address"
            ),
            "{errs:?}"
        );
        // The IPv6 neighbour on the same interface is fine.
        assert!(
            !errs.iter().any(|(_, m)| m.contains("fd00:172:18::9")),
            "{errs:?}"
        );
        // VXLAN over an IPv6-only uplink.
        let vx = format!("{V6ONLY}\n[[vxlan]]\nname = \"flannel.1\"\nvni = 1\nuplink = \"eth0\"\naddress = \"10.244.1.0/32\"\n");
        let l = vx.lines().position(|l| l == "uplink = \"eth0\"").unwrap() + 1;
        assert!(
            check_str(&vx).errors().any(|d| d.line == l
                && d.msg
                    .contains("has no IPv4 address, but address = \"10.244.1.0/32\" is IPv4")),
            "{:?}",
            check_str(&vx).diags
        );
        // VXLAN over IPv6 (Flannel's flannel-v6.1) on the same IPv6-only uplink is fine.
        let vx6 = format!("{V6ONLY}\n[[vxlan]]\nname = \"flannel-v6.1\"\nvni = 1\nuplink = \"eth0\"\naddress = \"fd00:10:244:1::/128\"\n");
        let first = vx6
            .lines()
            .position(|l| l == "name = \"flannel-v6.1\"")
            .unwrap()
            + 1;
        assert!(
            !check_str(&vx6).errors().any(|d| d.line >= first),
            "{:?}",
            check_str(&vx6).diags
        );
        // An IPv4 bridge in an IPv6-only cluster.
        let ch = check_str(&V6ONLY.replace(
            "address = \"fd00:10:244:1::1/64\"",
            "address = [\"10.244.1.1/24\", \"fd00:10:244:1::1/64\"]",
        ));
        assert!(
            ch.errors()
                .any(|d| d.msg.contains("node.cluster_cidr has no IPv4 prefix")),
            "{:?}",
            ch.diags
        );
    }

    #[test]
    fn dual_stack_example_parses_into_the_model() {
        let ch = check_str(DUAL);
        assert_eq!(ch.diags, Vec::new());
        let c = ch.config.unwrap();
        assert_eq!(c.node.cluster_cidr.unwrap().to_string(), "10.244.0.0/16");
        assert_eq!(
            c.node.cluster_cidr6.unwrap().to_string(),
            "fd00:10:244::/56"
        );
        let b = &c.bridges[0];
        assert_eq!(b.address.unwrap().to_string(), "10.244.1.1/24");
        assert_eq!(b.address6.unwrap().to_string(), "fd00:10:244:1::1/64");
        assert!(b.ra);
        assert_eq!(
            c.uplinks[0].address6.unwrap().to_string(),
            "fd00:172:18::2/64"
        );
        let routes: Vec<String> = c.routes.iter().map(|r| r.describe()).collect();
        assert_eq!(
            routes,
            [
                "10.244.2.0/24 via 172.18.0.3",
                "fd00:10:244:2::/64 via fd00:172:18::3",
                "0.0.0.0/0 via 172.18.0.1",
                "::/0 via fd00:172:18::1"
            ]
        );
        let web6 = &c.services[0];
        assert_eq!(web6.vip4(), None);
        assert_eq!(web6.vip6(), Some("fd00:10:96::10".parse().unwrap()));
        let spec6 = web6.spec();
        assert!(!spec6.has_v4());
        assert_eq!(spec6.vip6, web6.vip6());
        assert!(spec6.endpoints.is_empty());
        assert_eq!(spec6.endpoints6.len(), 2);
        assert_eq!((spec6.port, spec6.node_port), (80, Some(30086)));
        let eps: Vec<(String, bool)> = web6
            .endpoints
            .iter()
            .map(|e| (e.addr.to_string(), e.local))
            .collect();
        assert_eq!(
            eps,
            [
                ("[fd00:10:244:1::2]:8080".to_string(), true),
                ("[fd00:10:244:2::2]:8080".to_string(), false)
            ]
        );
        let web = &c.services[1];
        assert_eq!(web.describe_frontends(), "10.96.0.10:80,[fd00:10:96::a]:80");
        // Each frontend takes the endpoints of its family.
        let spec = web.spec();
        assert_eq!(spec.vip, Some(Ipv4Addr::new(10, 96, 0, 10)));
        assert_eq!(spec.vip6, Some("fd00:10:96::a".parse().unwrap()));
        assert_eq!(spec.endpoints.len(), 2);
        assert_eq!(
            spec.endpoints6.len(),
            web.endpoints.iter().filter(|e| e.addr.is_ipv6()).count()
        );
        assert_eq!(web.lines.of("cluster_ip.1"), web.lines.of("cluster_ip"));
        // A single string is the same as a list of one.
        let one = check_str(&DUAL.replace(
            "cluster_cidr = [\"10.244.0.0/16\", \"fd00:10:244::/56\"]",
            "cluster_cidr = \"10.244.0.0/16\"",
        ));
        assert!(one.config.as_ref().unwrap().node.cluster_cidr6.is_none());
        // Without IPv6 on the bridge the pods are outside the cluster: a warning.
        assert!(one.diags.iter().all(|d| d.warning), "{:?}", one.diags);
        // Link-local gateways with their interface, static NDP entries.
        let ll = check_str(&format!(
            "{DUAL}\n[[route]]\nto = \"fd00:99::/64\"\nvia = \"fe80::1\"\ndev = \"eth0\"\n\n[[neighbor]]\nip = \"fe80::1\"\nmac = \"02:00:00:00:00:01\"\ndev = \"eth0\"\n\n[[neighbor]]\nip = \"fd00:172:18::3\"\nmac = \"02:00:00:00:00:03\"\ndev = \"eth0\"\n"
        ));
        assert_eq!(ll.errors().count(), 0, "{:?}", ll.diags);
        assert_eq!(
            ll.config.unwrap().neighbors[1].ip.to_string(),
            "fd00:172:18::3"
        );
    }

    #[test]
    fn every_error_is_reported_with_its_line() {
        let src = "[node]\nname = \"n\"\ncluster_cidr = \"10.244.0.0/16\"\nbogus = 1\n\n[[bridge]]\nname = \"cni0\"\naddress = \"10.244.1.300/24\"\nports = [\"a\"]\ncolor = \"red\"\n";
        let e = errors(src);
        assert_eq!(e.len(), 3, "{e:?}");
        assert!(
            e[0].starts_with("f:4: [node]: unknown field `bogus`"),
            "{e:?}"
        );
        assert!(
            e[1].starts_with(
                "f:8: bridge \"cni0\": address = \"10.244.1.300/24\" has \"10.244.1.300\""
            ),
            "{e:?}"
        );
        assert!(
            e[2].starts_with("f:10: bridge \"cni0\": unknown field `color`"),
            "{e:?}"
        );
    }

    #[test]
    fn syntax_errors_have_lines() {
        let e = errors("[node]\nname = \"n\"\ncluster_cidr = = 3\n");
        assert!(e[0].starts_with("f:3: TOML syntax"), "{e:?}");
    }

    #[test]
    fn no_panic_on_truncated_or_mangled_files() {
        for (i, _) in EXAMPLE.char_indices() {
            let _ = check_str(&EXAMPLE[..i]);
        }
        let lines: Vec<&str> = EXAMPLE.lines().collect();
        for junk in [
            "= =",
            "[[",
            "x = [1, \"a\"]",
            "ports = 3",
            "port = -1",
            "port = 99999999999999999999",
            "[node.x]",
            "\u{0}",
        ] {
            for i in 0..lines.len() {
                let mut l = lines.clone();
                l[i] = junk;
                let ch = check_str(&l.join("\n"));
                assert!(ch.config.is_none() || ch.errors().count() == 0);
            }
        }
    }

    #[test]
    fn cidr_relations() {
        let a: Cidr = "10.244.0.0/16".parse().unwrap();
        let b: Cidr = "10.244.1.1/24".parse().unwrap();
        assert!(a.covers(&b) && !b.covers(&a) && a.overlaps(&b) && b.overlaps(&a));
        assert!(!b.overlaps(&"10.244.2.1/24".parse().unwrap()));
        assert!("10.0.0.0/33".parse::<Cidr>().is_err());
        assert_eq!(LineMap::new("a\nb\nc").line(2), 2);
    }
}
