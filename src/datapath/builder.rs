//! Building a datapath: bridges, ports, router interfaces, the neighbour table's settings
//! and the NAT engine, checked as they are added.

use std::collections::BTreeSet;
use std::fmt;
use std::net::{IpAddr, Ipv6Addr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use parking_lot::Mutex;

use super::{word, Bridge, Datapath, PortInfo, PortKind, Topo};
use crate::base::{BridgeId, IfaceId, PortId};
use crate::conntrack::{Conntrack, ConntrackOf, CtConfigError, CtFileError, Recovery};
use crate::l2::fdb::{Fdb, DEFAULT_AGING, DEFAULT_MAX_ENTRIES};
use crate::l3::neigh::{NeighConfig, NeighError, NeighTable};
use crate::l3::route::{mask, NextHop, Route, RouteProto};
use crate::l3::router::{Iface, IfaceConfig, Router};
use crate::l3::vxlan::{self, Tunnel, VxlanConfig};
use crate::nat::netfilter::{NatConfig, Netfilter};
use crate::time::Instant;
use crate::wire::vxlan::{overhead, OVERHEAD};

/// Settings of one bridge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BridgeConfig {
    /// A unique name, like `cni0`.
    pub name: String,
    /// The FDB's limit on entries (default 8192).
    pub fdb_max_entries: usize,
    /// How long a silent station stays in the FDB (default 300 s, as Linux).
    pub aging: Duration,
}

impl BridgeConfig {
    /// A bridge called `name` with default limits.
    pub fn new(name: impl Into<String>) -> BridgeConfig {
        BridgeConfig {
            name: name.into(),
            fdb_max_entries: DEFAULT_MAX_ENTRIES,
            aging: DEFAULT_AGING,
        }
    }
}

/// An invalid topology given to [`DatapathBuilder`]; the message names the field and value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigError {
    /// Two ports or two bridges with one name.
    DuplicateName {
        /// `"port"` or `"bridge"`.
        kind: &'static str,
        /// The repeated name.
        name: String,
    },
    /// A name that is empty or longer than 15 bytes (Linux's IFNAMSIZ - 1).
    BadName {
        /// `"port"` or `"bridge"`.
        kind: &'static str,
        /// The name given.
        name: String,
    },
    /// A port attached to a bridge id that does not exist.
    NoSuchBridge(BridgeId),
    /// More than 65535 bridges or router interfaces.
    TooMany(&'static str),
    /// Every port id of the datapath's capacity is in use (or quarantined after a removal).
    CapacityFull {
        /// The port being added.
        name: String,
        /// The capacity ([`DatapathBuilder::max_ports`]).
        max_ports: usize,
    },
    /// A port id that names no live port.
    NoSuchPort(PortId),
    /// A port that cannot be removed at run time: a router interface's virtual port or
    /// uplink, which stays as long as its interface.
    NotRemovable {
        /// The port's name.
        name: String,
        /// What it is.
        what: &'static str,
    },
    /// A port whose driver a runtime or pump still holds: remove it through them
    /// ([`Runtime::remove_port`](crate::runtime::Runtime::remove_port)), which detach the
    /// driver before the id can go to another port.
    Attached {
        /// The port's name.
        name: String,
    },
    /// A spoof guard given to a port that is not an external port on a bridge
    /// ([`Control::set_port_guard`](crate::Control::set_port_guard)).
    NotGuardable {
        /// The port's name.
        name: String,
    },
    /// A numeric setting out of its range.
    OutOfRange {
        /// The setting.
        field: &'static str,
        /// The value given.
        value: String,
        /// What is accepted.
        expected: &'static str,
    },
    /// The neighbour table's settings were refused ([`DatapathBuilder::neigh_config`]).
    Neigh(NeighError),
    /// The conntrack settings of the NAT engine were refused ([`DatapathBuilder::netfilter`]).
    Conntrack(CtConfigError),
    /// The connection table's file ([`DatapathBuilder::conntrack_file`]) could not be opened,
    /// locked or mapped.
    ConntrackFile(CtFileError),
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::DuplicateName { kind, name } => {
                write!(
                    f,
                    "{kind} name {name:?} is used twice; names must be unique"
                )
            }
            ConfigError::BadName { kind, name } => write!(
                f,
                "{kind} name {name:?} is invalid: expected 1 to 15 bytes, no '/', no whitespace"
            ),
            ConfigError::NoSuchBridge(b) => write!(f, "bridge id {} does not exist", b.0),
            ConfigError::TooMany(what) => write!(f, "too many {what}: at most 65535"),
            ConfigError::CapacityFull { name, max_ports } => write!(
                f,
                "port {name:?} cannot be added: all {max_ports} port ids (max_ports) are in use \
                 or quarantined after a removal"
            ),
            ConfigError::NoSuchPort(p) => write!(f, "port id {} does not exist", p.0),
            ConfigError::Attached { name } => write!(
                f,
                "port {name:?} cannot be removed here: a runtime still drives it (remove it with \
                 Runtime::remove_port)"
            ),
            ConfigError::NotRemovable { name, what } => write!(
                f,
                "port {name:?} cannot be removed: it is {what}, which stays as long as its \
                 interface"
            ),
            ConfigError::NotGuardable { name } => write!(
                f,
                "port {name:?} cannot have a spoof guard: only an external port on a bridge can"
            ),
            ConfigError::OutOfRange {
                field,
                value,
                expected,
            } => write!(f, "{field} = {value} is out of range: expected {expected}"),
            ConfigError::Neigh(_) => f.write_str("invalid neighbour table settings"),
            ConfigError::Conntrack(_) => f.write_str("invalid conntrack settings"),
            ConfigError::ConntrackFile(_) => f.write_str("cannot use the conntrack file"),
        }
    }
}

impl std::error::Error for ConfigError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ConfigError::Neigh(e) => Some(e),
            ConfigError::Conntrack(e) => Some(e),
            ConfigError::ConntrackFile(e) => Some(e),
            _ => None,
        }
    }
}

pub(super) fn check_name(kind: &'static str, name: &str) -> Result<(), ConfigError> {
    if name.is_empty()
        || name.len() > 15
        || name.contains('/')
        || name.chars().any(char::is_whitespace)
    {
        return Err(ConfigError::BadName {
            kind,
            name: name.to_string(),
        });
    }
    Ok(())
}

/// The default capacity of a datapath's ports ([`DatapathBuilder::max_ports`]).
pub const DEFAULT_MAX_PORTS: usize = 4096;

/// Builds a [`Datapath`]: add bridges, then ports attached to them.
pub struct DatapathBuilder {
    max_ports: usize,
    ports: Vec<PortInfo>,
    bridges: Vec<Bridge>,
    ifaces: Vec<Iface>,
    neigh: NeighConfig,
    nf: Option<Netfilter>,
    /// Where the connection table lives ([`DatapathBuilder::conntrack_file`]).
    ct_file: Option<(PathBuf, Instant)>,
    /// The open file to use for it, handed over by another process.
    ct_handed_over: Option<std::fs::File>,
    /// The open file of the IPv6 table, handed over by another process.
    ct6_handed_over: Option<std::fs::File>,
    recovery: Option<Recovery>,
    recovery6: Option<Recovery>,
    tunnels: Vec<Tunnel>,
    /// The host port ([`DatapathBuilder::host_port`]).
    host: Option<crate::l3::router::HostPort>,
}

/// Where the IPv6 connection table lives beside the IPv4 one at `path`
/// ([`DatapathBuilder::conntrack_file`]): the same name with `6` appended
/// (`/run/tapyard/conntrack` → `/run/tapyard/conntrack6`).
pub fn conntrack6_path(path: &std::path::Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push("6");
    PathBuf::from(p)
}

impl Default for DatapathBuilder {
    fn default() -> Self {
        DatapathBuilder {
            max_ports: DEFAULT_MAX_PORTS,
            ports: Vec::new(),
            bridges: Vec::new(),
            ifaces: Vec::new(),
            neigh: NeighConfig::default(),
            nf: None,
            ct_file: None,
            ct_handed_over: None,
            ct6_handed_over: None,
            recovery: None,
            recovery6: None,
            host: None,
            tunnels: Vec::new(),
        }
    }
}

impl fmt::Debug for DatapathBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DatapathBuilder")
            .field("ports", &self.ports.len())
            .field("bridges", &self.bridges)
            .finish()
    }
}

impl DatapathBuilder {
    /// Sets the most ports the datapath can hold at once, builder ports and router interface
    /// ports included (default [`DEFAULT_MAX_PORTS`]; 1 to 65535, and not below the ports
    /// already added). Fixed at build time, so that per-port arrays never reallocate while
    /// workers read them; each port of capacity costs 8 bytes, plus 48 bytes of counters per
    /// worker, plus a 24-byte driver slot in a [`Runtime`](crate::runtime::Runtime)'s port
    /// table, whether used or not.
    pub fn max_ports(&mut self, n: usize) -> Result<(), ConfigError> {
        if !(1..=usize::from(u16::MAX)).contains(&n) || n < self.ports.len() {
            return Err(ConfigError::OutOfRange {
                field: "max_ports",
                value: n.to_string(),
                expected: "1 to 65535, and at least the ports already added",
            });
        }
        self.max_ports = n;
        Ok(())
    }

    /// Adds a bridge.
    pub fn add_bridge(&mut self, cfg: BridgeConfig) -> Result<BridgeId, ConfigError> {
        check_name("bridge", &cfg.name)?;
        if self.bridges.iter().any(|b| b.name == cfg.name) {
            return Err(ConfigError::DuplicateName {
                kind: "bridge",
                name: cfg.name,
            });
        }
        if !(1..=1 << 24).contains(&cfg.fdb_max_entries) {
            return Err(ConfigError::OutOfRange {
                field: "fdb_max_entries",
                value: cfg.fdb_max_entries.to_string(),
                expected: "1 to 16777216",
            });
        }
        if cfg.aging < Duration::from_secs(1) || cfg.aging > Duration::from_secs(1_000_000) {
            return Err(ConfigError::OutOfRange {
                field: "aging",
                value: format!("{:?}", cfg.aging),
                expected: "1 s to 1000000 s",
            });
        }
        // `NO_BRIDGE` marks "no bridge" in a port's word.
        let id = u16::try_from(self.bridges.len())
            .ok()
            .filter(|&i| i != word::NO_BRIDGE)
            .ok_or(ConfigError::TooMany("bridges"))?;
        self.bridges.push(Bridge {
            name: cfg.name,
            ports: ArcSwap::from_pointee(Vec::new()),
            members: AtomicU32::new(0),
            fdb: Fdb::new(cfg.fdb_max_entries, cfg.aging),
            router: None,
            router_mac: 0,
        });
        Ok(BridgeId(id))
    }

    /// Adds a port, attached to `bridge` or to none (its frames are then dropped as
    /// [`DropReason::NoBridge`](crate::stats::DropReason::NoBridge)).
    pub fn add_port(
        &mut self,
        name: impl Into<String>,
        bridge: Option<BridgeId>,
    ) -> Result<PortId, ConfigError> {
        self.push_port(name.into(), bridge, PortKind::External)
    }

    fn push_port(
        &mut self,
        name: String,
        bridge: Option<BridgeId>,
        kind: PortKind,
    ) -> Result<PortId, ConfigError> {
        check_name("port", &name)?;
        if self.ports.iter().any(|p| p.name == name) {
            return Err(ConfigError::DuplicateName { kind: "port", name });
        }
        if self.ports.len() >= self.max_ports {
            return Err(ConfigError::CapacityFull {
                name,
                max_ports: self.max_ports,
            });
        }
        // Below max_ports, itself at most 65535.
        let id = PortId(crate::narrow::low16(self.ports.len() as u64));
        if let Some(b) = bridge {
            let br = self
                .bridges
                .get_mut(usize::from(b.0))
                .ok_or(ConfigError::NoSuchBridge(b))?;
            let mut members = br.ports.load().to_vec();
            members.push(id);
            *br.members.get_mut() += 1;
            br.ports.store(Arc::new(members));
        }
        self.ports.push(PortInfo { name, bridge, kind });
        Ok(id)
    }

    /// Adds a router interface. On a bridge (`on = Some(bridge)`, like `cni0`), it gets a
    /// virtual port on that bridge named after it, and its MAC a static FDB entry there;
    /// otherwise it owns a new external port named after it (an uplink, like `eth0`) that the
    /// caller attaches a driver to. The connected route `addr/prefix_len` is added. Returns
    /// the interface id and its port.
    pub fn add_router_iface(
        &mut self,
        cfg: IfaceConfig,
        on: Option<BridgeId>,
    ) -> Result<(IfaceId, PortId), ConfigError> {
        if !cfg.mac.is_station() {
            return Err(ConfigError::OutOfRange {
                field: "mac",
                value: cfg.mac.to_string(),
                expected: "a unicast, non-zero MAC address",
            });
        }
        match cfg.addr {
            Some((a, len)) if len > 32 || a.is_unspecified() || a.is_multicast() => {
                return Err(ConfigError::OutOfRange {
                    field: "address",
                    value: format!("{a}/{len}"),
                    expected: "a unicast IPv4 address with a prefix length of 0 to 32",
                });
            }
            None if cfg.addr6.is_none() => {
                return Err(ConfigError::OutOfRange {
                    field: "address",
                    value: "none".into(),
                    expected: "an IPv4 or an IPv6 address (or both)",
                });
            }
            _ => {}
        }
        if !(68..=65_000).contains(&cfg.mtu) {
            return Err(ConfigError::OutOfRange {
                field: "mtu",
                value: cfg.mtu.to_string(),
                expected: "68 to 65000",
            });
        }
        if let Some((a6, len)) = cfg.addr6 {
            if len > 128
                || a6.is_unspecified()
                || a6.is_multicast()
                || a6.is_loopback()
                || crate::wire::ipv6::is_link_local(&a6)
            {
                return Err(ConfigError::OutOfRange {
                    field: "address",
                    value: format!("{a6}/{len}"),
                    expected:
                        "a global or unique-local IPv6 address with a prefix length of 0 to 128",
                });
            }
            if cfg.mtu < 1280 {
                return Err(ConfigError::OutOfRange {
                    field: "mtu",
                    value: cfg.mtu.to_string(),
                    expected: "at least 1280 on an interface with an IPv6 address",
                });
            }
            if self
                .ifaces
                .iter()
                .any(|i| i.cfg.addr6.is_some_and(|(o, _)| o == a6))
            {
                return Err(ConfigError::OutOfRange {
                    field: "address",
                    value: a6.to_string(),
                    expected: "an IPv6 address not used by another interface",
                });
            }
        }
        if let Some((other, a)) = cfg.addr4().and_then(|a| {
            let o = self.ifaces.iter().find(|i| i.cfg.addr4() == Some(a))?;
            Some((o, a))
        }) {
            return Err(ConfigError::OutOfRange {
                field: "address",
                value: a.to_string(),
                expected: if other.cfg.name == cfg.name {
                    "an address used once"
                } else {
                    "an address not used by another interface"
                },
            });
        }
        // 65535 is kept free: the pipeline's "no interface".
        let id = IfaceId(
            u16::try_from(self.ifaces.len())
                .ok()
                .filter(|&i| i < u16::MAX)
                .ok_or(ConfigError::TooMany("interfaces"))?,
        );
        if let Some(b) = on {
            let br = self
                .bridges
                .get(usize::from(b.0))
                .ok_or(ConfigError::NoSuchBridge(b))?;
            if br.router.is_some() {
                return Err(ConfigError::OutOfRange {
                    field: "bridge",
                    value: br.name.clone(),
                    expected: "a bridge without a router interface (one per bridge)",
                });
            }
        }
        let kind = match on {
            Some(_) => PortKind::RouterVirtual(id),
            None => PortKind::Routed(id),
        };
        let port = self.push_port(cfg.name.clone(), on, kind)?;
        if let Some(b) = on {
            let br = &mut self.bridges[usize::from(b.0)];
            br.router = Some((id, port));
            br.router_mac = crate::l2::fdb::word(cfg.mac);
            br.fdb.add_static(cfg.mac, port);
        }
        self.ifaces.push(Iface::new(cfg, port, on));
        Ok((id, port))
    }

    /// Adds a VXLAN interface (see [`crate::l3::vxlan`]): a router interface with the config's
    /// address, MAC and MTU (default: the uplink's minus 50) and no bridge, whose packets are
    /// encapsulated towards its peers and leave through `cfg.uplink`, a router interface without a
    /// bridge added before it. Peers are added once the datapath is built
    /// ([`Control::add_vxlan_peer`](crate::Control::add_vxlan_peer)). Errors name the field and
    /// value.
    pub fn add_vxlan(&mut self, cfg: VxlanConfig) -> Result<IfaceId, ConfigError> {
        vxlan::check_config(&cfg).map_err(|(field, value, expected)| ConfigError::OutOfRange {
            field,
            value,
            expected,
        })?;
        let Some((up_id, up)) = (0..=u16::MAX)
            .map(IfaceId)
            .zip(&self.ifaces)
            .find(|(_, i)| i.cfg.name == cfg.uplink)
        else {
            return Err(ConfigError::OutOfRange {
                field: "uplink",
                value: cfg.uplink.clone(),
                expected: "the name of a router interface without a bridge, added before",
            });
        };
        if up.bridge.is_some() || self.tunnels.iter().any(|t| t.iface == up_id) {
            return Err(ConfigError::OutOfRange {
                field: "uplink",
                value: cfg.uplink.clone(),
                expected: "an uplink (a router interface on no bridge, not a VXLAN interface)",
            });
        }
        if self.tunnels.iter().any(|t| {
            t.uplink == up_id
                && t.cfg.port == cfg.port
                && t.cfg.addr.is_ipv4() == cfg.addr.is_ipv4()
        }) {
            return Err(ConfigError::OutOfRange {
                field: "port",
                value: cfg.port.to_string(),
                expected: "a port no other VXLAN interface of this family on this uplink uses",
            });
        }
        // The underlay's family is the interface address's (Flannel's flannel-v6.1).
        let v6 = cfg.addr.is_ipv6();
        let (overhead, min, expected) = if v6 {
            (
                overhead::<std::net::Ipv6Addr>(),
                1280,
                "1280 to the uplink's MTU minus 70",
            )
        } else {
            (OVERHEAD, 68, "68 to the uplink's MTU minus 50")
        };
        let max = up.cfg.mtu.saturating_sub(crate::narrow::len16(overhead));
        let mtu = cfg.mtu.unwrap_or(max);
        if mtu > max || mtu < min {
            return Err(ConfigError::OutOfRange {
                field: "mtu",
                value: mtu.to_string(),
                expected,
            });
        }
        let (local, mut icfg) = match cfg.addr {
            std::net::IpAddr::V4(a) => {
                let Some(local) = up.cfg.addr4() else {
                    return Err(ConfigError::OutOfRange {
                        field: "uplink",
                        value: cfg.uplink.clone(),
                        expected: "an uplink with an IPv4 address (the interface's address is IPv4: VXLAN over IPv4)",
                    });
                };
                (
                    local.into(),
                    IfaceConfig::new(cfg.name.clone(), cfg.mac, a, cfg.prefix_len),
                )
            }
            std::net::IpAddr::V6(a) => {
                let Some((local, _)) = up.cfg.addr6 else {
                    return Err(ConfigError::OutOfRange {
                        field: "uplink",
                        value: cfg.uplink.clone(),
                        expected: "an uplink with an IPv6 address (the interface's address is IPv6: VXLAN over IPv6)",
                    });
                };
                (
                    local.into(),
                    IfaceConfig::new(cfg.name.clone(), cfg.mac, a, cfg.prefix_len),
                )
            }
        };
        icfg.mtu = mtu;
        let (id, _) = self.add_router_iface(icfg, None)?;
        self.tunnels.push(Tunnel::new(cfg, id, up_id, local, mtu));
        Ok(id)
    }

    /// Sets the neighbour (ARP) table's configuration (defaults as Linux).
    pub fn neigh_config(&mut self, cfg: NeighConfig) -> Result<(), ConfigError> {
        cfg.validate().map_err(ConfigError::Neigh)?;
        self.neigh = cfg;
        Ok(())
    }

    /// Turns on connection tracking and NAT (Services, masquerade, SNAT) on routed packets,
    /// and reverse NAT on bridged IPv4 (see [`crate::nat::netfilter`]). Needs a router interface.
    /// Errors name the bad conntrack setting.
    pub fn netfilter(&mut self, cfg: NatConfig) -> Result<(), ConfigError> {
        let nf = match &self.ct_file {
            None => Netfilter::new(cfg).map_err(ConfigError::Conntrack)?,
            Some((path, now)) => {
                let handed_over = self.ct_handed_over.is_some();
                let opened = match self.ct_handed_over.take() {
                    Some(file) => Conntrack::open_handed_over(cfg.conntrack, file, path, *now),
                    None => Conntrack::open_file(cfg.conntrack, path, *now),
                };
                let (ct, rec) = opened.map_err(|e| match e {
                    CtFileError::Config(c) => ConfigError::Conntrack(c),
                    e => ConfigError::ConntrackFile(e),
                })?;
                self.recovery = Some(rec);
                let path6 = conntrack6_path(path);
                let cfg6 = cfg.conntrack6.unwrap_or(cfg.conntrack);
                let opened6 = match (self.ct6_handed_over.take(), handed_over) {
                    (Some(file), _) => Some(ConntrackOf::<Ipv6Addr>::open_handed_over(
                        cfg6, file, &path6, *now,
                    )),
                    // The IPv4 file was handed over but not the IPv6 one: the giving process
                    // still holds its lock, so the IPv6 table starts empty in memory (its
                    // connections are lost) rather than failing the takeover.
                    (None, true) => None,
                    (None, false) => Some(ConntrackOf::<Ipv6Addr>::open_file(cfg6, &path6, *now)),
                };
                let ct6 = match opened6 {
                    Some(o) => {
                        let (ct6, rec6) = o.map_err(|e| match e {
                            CtFileError::Config(c) => ConfigError::Conntrack(c),
                            e => ConfigError::ConntrackFile(e),
                        })?;
                        self.recovery6 = Some(rec6);
                        ct6
                    }
                    None => ConntrackOf::<Ipv6Addr>::new(cfg6).map_err(ConfigError::Conntrack)?,
                };
                Netfilter::with_conntracks(cfg, ct, ct6)
            }
        };
        self.nf = Some(nf);
        Ok(())
    }

    /// Keeps the NAT engine's connection table in the file at `path` (on a tmpfs: `/run`,
    /// `/dev/shm`) instead of anonymous memory, so that connections, their NAT bindings and
    /// Service endpoints outlive the process: a datapath built again on the same file (after
    /// a restart or a crash) keeps translating them (see [`Conntrack::open_file`]). `now` is
    /// the current time of the clock the datapath will run with, which must be
    /// [`crate::Clock`] (`CLOCK_MONOTONIC`, the same in every process). Call it before
    /// [`DatapathBuilder::netfilter`], which opens the file; [`DatapathBuilder::recovery`]
    /// then says what was found in it.
    pub fn conntrack_file(&mut self, path: impl Into<PathBuf>, now: Instant) {
        self.ct_file = Some((path.into(), now));
    }

    /// [`DatapathBuilder::conntrack_file`] with the file already open, handed over by the
    /// process that used it as its table, which has stopped writing to it
    /// ([`Conntrack::open_handed_over`]); `path` names it in errors.
    pub fn conntrack_file_handed_over(
        &mut self,
        path: impl Into<PathBuf>,
        file: std::fs::File,
        now: Instant,
    ) {
        self.ct_file = Some((path.into(), now));
        self.ct_handed_over = Some(file);
    }

    /// What [`DatapathBuilder::netfilter`] found in the connection table's file of family `A`
    /// ([`Ipv4Addr`](std::net::Ipv4Addr); [`Ipv6Addr`](std::net::Ipv6Addr): the IPv6 table's
    /// file, see [`conntrack6_path`]), once it has opened it (`None` without
    /// [`DatapathBuilder::conntrack_file`]).
    pub fn recovery<A: crate::wire::family::Family>(&self) -> Option<&Recovery> {
        if A::VERSION == 6 {
            self.recovery6.as_ref()
        } else {
            self.recovery.as_ref()
        }
    }

    /// The IPv6 table's open file, handed over with the IPv4 one's
    /// ([`DatapathBuilder::conntrack_file_handed_over`]); call both before
    /// [`DatapathBuilder::netfilter`].
    pub fn conntrack6_file_handed_over(&mut self, file: std::fs::File) {
        self.ct6_handed_over = Some(file);
    }

    /// Makes router interface `iface` (one without a bridge, added before) the host port: its
    /// other side is the host's own IP stack, which holds `addrs` (at most one per family;
    /// typically the node's InternalIP, which may also be an uplink's address). At
    /// [`DatapathBuilder::build`] each address gets the host route `addr/32` (`addr/128`)
    /// through `iface`, and a packet to it that the PREROUTING hook (NAT) leaves addressed to
    /// it is forwarded there instead of being answered by the router
    /// ([`Router::is_host_addr`]). Errors name the field and value.
    pub fn host_port(&mut self, iface: IfaceId, addrs: &[IpAddr]) -> Result<(), ConfigError> {
        let Some(i) = self.ifaces.get(usize::from(iface.0)) else {
            return Err(ConfigError::OutOfRange {
                field: "iface",
                value: iface.0.to_string(),
                expected: "a router interface added before",
            });
        };
        if i.bridge.is_some() || self.tunnels.iter().any(|t| t.iface == iface) {
            return Err(ConfigError::OutOfRange {
                field: "iface",
                value: i.cfg.name.clone(),
                expected:
                    "a router interface with a port of its own (not on a bridge, not a tunnel)",
            });
        }
        let mut slots: [Option<IpAddr>; 2] = [None, None];
        for a in addrs {
            let slot = usize::from(a.is_ipv6());
            let bad = slots[slot].is_some()
                || a.is_unspecified()
                || a.is_multicast()
                || a.is_loopback()
                || matches!(a, IpAddr::V6(v6) if crate::wire::ipv6::is_link_local(v6));
            if bad {
                return Err(ConfigError::OutOfRange {
                    field: "address",
                    value: a.to_string(),
                    expected: "one unicast address per family, not link-local",
                });
            }
            slots[slot] = Some(*a);
        }
        self.host = Some(crate::l3::router::HostPort {
            iface,
            addrs: slots,
        });
        Ok(())
    }

    /// Finishes the datapath.
    pub fn build(self) -> Datapath {
        let host = self.host;
        let router = (!self.ifaces.is_empty()).then(|| {
            let mut r = Router::new(self.ifaces, NeighTable::new(self.neigh));
            if let Some(h) = host {
                add_host_routes(&r, &h);
                r.host = Some(h);
            }
            // Interface ids were checked to fit 16 bits as they were added.
            for (id, iface) in (0..=u16::MAX).map(IfaceId).zip(&r.ifaces) {
                let c = &iface.cfg;
                // Two interfaces in one subnet: the first one's connected route wins, as the
                // second `add` fails with `Exists` (Linux keeps both; the first is used).
                if let Some((a, len)) = c.addr {
                    let _ = r.routes.add(Route {
                        prefix: mask(a, len),
                        len,
                        next_hop: NextHop::Link(id),
                        metric: 0,
                        proto: RouteProto::Kernel,
                        src: Some(a),
                    });
                }
                if let Some((a6, len)) = c.addr6 {
                    let _ = r.routes6.add(Route {
                        prefix: crate::wire::ipv6::mask(a6, len),
                        len,
                        next_hop: NextHop::Link(id),
                        metric: 256,
                        proto: RouteProto::Kernel,
                        src: None,
                    });
                }
            }
            r
        });
        let words = (0..self.max_ports)
            .map(|i| {
                AtomicU64::new(
                    self.ports
                        .get(i)
                        .map_or(0, |p| word::encode(p.kind, p.bridge)),
                )
            })
            .collect();
        Datapath {
            ports: words,
            guards: ArcSwap::from_pointee(Vec::new()),
            topo: Mutex::new(Topo {
                names: self.ports.into_iter().map(|p| Some(p.name)).collect(),
                free: BTreeSet::new(),
                quarantine: Vec::new(),
                epochs: Vec::new(),
                attached: vec![0; self.max_ports],
            }),
            bridges: self.bridges,
            // NAT hooks into the router: without router interfaces there is nothing to hook.
            // It shares the router's local stack (whose ports it leaves untracked).
            nf: match &router {
                Some(r) => self.nf.map(|mut nf| {
                    nf.local = r.local.clone();
                    nf
                }),
                None => None,
            },
            tunnels: self.tunnels,
            router,
            shards: Mutex::new(Vec::new()),
            last_sweep: AtomicU64::new(0),
        }
    }
}

/// The host routes of the host port `h`: `addr/32` (`addr/128`) through its interface, as
/// connected routes (`proto kernel scope link`).
fn add_host_routes(r: &Router, h: &crate::l3::router::HostPort) {
    for a in h.addrs.iter().flatten() {
        // A route already there (the same prefix given twice) keeps the first one.
        match *a {
            IpAddr::V4(a) => drop(r.routes.add(Route {
                prefix: a,
                len: 32,
                next_hop: NextHop::Link(h.iface),
                metric: 0,
                proto: RouteProto::Kernel,
                src: r.iface(h.iface).and_then(|i| i.cfg.addr4()),
            })),
            IpAddr::V6(a) => drop(r.routes6.add(Route {
                prefix: a,
                len: 128,
                next_hop: NextHop::Link(h.iface),
                metric: 256,
                proto: RouteProto::Kernel,
                src: None,
            })),
        }
    }
}
