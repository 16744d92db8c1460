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

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tapyard::conntrack::CtConfig;
use tapyard::l3::neigh::NeighConfig;
use tapyard::nat::{Endpoint, EndpointConditions, LbAlgo, Prefix, ServiceSpec};
use tapyard::wire::family::IpProto;
use tapyard::MacAddr;
use toml::de::DeTable;

pub mod diff;
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
    /// Every IPv4 ClusterIP (routed through the [`HostCfg`] port by the node's kernel).
    pub service_cidr: Option<Cidr>,
    /// Every IPv6 ClusterIP.
    pub service_cidr6: Option<Cidr6>,
    /// kube-proxy's `--masquerade-all`: every new connection to a ClusterIP is masqueraded.
    pub masquerade_all: bool,
    /// kube-proxy's `--iptables-random-fully`: masqueraded source ports chosen at random.
    pub random_fully: bool,
    /// kube-proxy's `--nodeport-addresses`: NodePorts answer only on node addresses inside
    /// these prefixes (each family on its own; none of a family: every address of it).
    pub node_port_addresses: Vec<IpCidr>,
    /// kube-proxy's `/healthz` port on the node's addresses (0: off).
    pub healthz_port: u16,
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
    /// TAP devices created as its ports: those of `ports`, then those of its
    /// `[[bridge.port]]`s.
    pub ports: Vec<String>,
    /// Its `[[bridge.port]]`s: ports (also in `ports`) with their addresses and MAC.
    pub port_defs: Vec<PortCfg>,
    /// FDB entry limit.
    pub fdb_max_entries: usize,
    /// FDB aging time.
    pub fdb_aging: Duration,
    /// Pin ports with known addresses (the CNI plugin's, `port add --ip`) to them and to
    /// their MAC (`spoof_guard`, default on); applied live by a reload.
    pub spoof_guard: bool,
}

impl BridgeCfg {
    /// The `[[bridge.port]]` of port `name`, if it has one.
    pub fn port_def(&self, name: &str) -> Option<&PortCfg> {
        self.port_defs.iter().find(|p| p.name == name)
    }
}

/// `[[bridge.port]]`: a port of a bridge with what its spoof guard allows.
#[derive(Clone, Debug, PartialEq)]
pub struct PortCfg {
    /// The TAP's (and the datapath port's) name.
    pub name: String,
    /// The addresses it may send from (either family); none: no guard.
    pub ips: Vec<IpAddr>,
    /// Its TAP's MAC when tapyard creates it, and the one its guard pins; `None`: the TAP's.
    pub mac: Option<MacAddr>,
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

/// `[[host]]`: the host port, a TAP in tapyard's namespace whose kernel side is the node's own
/// IP stack (as Antrea's `antrea-gw0`).
#[derive(Clone, Debug, PartialEq)]
pub struct HostCfg {
    /// The TAP's (and its router interface's) name.
    pub name: String,
    /// The node's IPv4 address, held by the kernel side as a /32; `None`: an IPv6-only host
    /// port (then `address6` is set).
    pub address: Option<Ipv4Addr>,
    /// The node's IPv6 address, held by the kernel side as a /128.
    pub address6: Option<Ipv6Addr>,
    /// tapyard's side's IPv4 address (a /32): the kernel's next hop (used with `address`).
    pub gateway: Ipv4Addr,
    /// tapyard's side's IPv6 address (a /128; used with `address6`).
    pub gateway6: Ipv6Addr,
    /// More prefixes the kernel routes through it.
    pub routes: Vec<IpCidr>,
    /// tapyard's side's MAC; `None`: derived from the node's and the port's names.
    pub mac: Option<MacAddr>,
    /// The MTU of both sides.
    pub mtu: u16,
}

impl HostCfg {
    /// tapyard's side's IPv4 address when none is given.
    pub const GATEWAY: Ipv4Addr = Ipv4Addr::new(169, 254, 0, 1);
    /// tapyard's side's IPv6 address when none is given (`fc00::a9fe:1`).
    pub const GATEWAY6: Ipv6Addr = Ipv6Addr::new(0xfc00, 0, 0, 0, 0, 0, 0xa9fe, 1);

    /// The prefixes the kernel routes through it, host bits cleared: `node`'s cluster and
    /// Service CIDRs and `routes`, of the families it has an address of.
    pub fn kernel_routes(&self, node: &NodeCfg) -> Vec<IpCidr> {
        let v4 = [node.cluster_cidr, node.service_cidr].map(|c| c.map(IpCidr::V4));
        let v6 = [node.cluster_cidr6, node.service_cidr6].map(|c| c.map(IpCidr::V6));
        v4.into_iter()
            .chain(v6)
            .flatten()
            .chain(self.routes.iter().copied())
            .filter(|c| self.sides().any(|(a, _)| a.is_ipv6() == c.is_v6()))
            .map(|c| match c {
                IpCidr::V4(p) => IpCidr::V4(Cidr {
                    addr: p.network(),
                    len: p.len,
                }),
                IpCidr::V6(p) => IpCidr::V6(Cidr6 {
                    addr: p.network(),
                    len: p.len,
                }),
            })
            .collect()
    }

    /// Per family it has an address of (IPv4 first): the node's address (the kernel side's)
    /// and tapyard's side's.
    pub fn sides(&self) -> impl Iterator<Item = (IpAddr, IpAddr)> {
        let v4 = self.address.map(|a| (a.into(), self.gateway.into()));
        let v6 = self.address6.map(|a| (a.into(), self.gateway6.into()));
        v4.into_iter().chain(v6)
    }
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
    /// On this node: as given (`local = true` in its table), else inside one of this node's
    /// bridge subnets.
    pub local: bool,
    /// Its EndpointSlice conditions (a plain `IP:PORT` string: ready).
    pub conditions: EndpointConditions,
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
    /// `load_balancer_ips`: LoadBalancer ingress IPs, of families with a ClusterIP.
    pub load_balancer_ips: Vec<IpAddr>,
    /// `external_ips`, of families with a ClusterIP.
    pub external_ips: Vec<IpAddr>,
    /// `load_balancer_source_ranges`: who may reach the LoadBalancer IPs (per family).
    pub load_balancer_source_ranges: Vec<IpCidr>,
    /// `internalTrafficPolicy: Local`.
    pub internal_local: bool,
    /// `healthCheckNodePort`.
    pub health_check_node_port: Option<u16>,
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
                SocketAddr::V4(a) => spec
                    .endpoints
                    .push(Endpoint::new(a, e.local).with_conditions(e.conditions)),
                SocketAddr::V6(a) => spec
                    .endpoints6
                    .push(Endpoint::new(a, e.local).with_conditions(e.conditions)),
            }
        }
        spec.affinity = self.affinity;
        spec.algo = self.algo;
        spec.external_local = self.external_local;
        spec.load_balancer_ips = self.load_balancer_ips.clone();
        spec.external_ips = self.external_ips.clone();
        spec.load_balancer_source_ranges = self
            .load_balancer_source_ranges
            .iter()
            .map(|c| Prefix {
                addr: c.addr(),
                len: c.prefix_len(),
            })
            .collect();
        spec.internal_local = self.internal_local;
        spec.health_check_node_port = self.health_check_node_port;
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
    /// `[[host]]` (at most one: `check` says so).
    pub hosts: Vec<Located<HostCfg>>,
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

    /// The `[[bridge.port]]` of port `port` of bridge `bridge`, if it has one.
    pub fn port_def(&self, bridge: &str, port: &str) -> Option<&PortCfg> {
        self.bridges
            .iter()
            .find(|b| b.name == bridge)?
            .port_def(port)
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
pub(crate) mod tests;
