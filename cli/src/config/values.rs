//! The values written as strings: prefixes, addresses, names, MACs, port ranges. Each parser's
//! error says what is wrong with the value and what was expected.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use tapyard::l3::mask;
use tapyard::MacAddr;

/// Linux's `IFNAMSIZ` less the terminating NUL: the longest interface name.
pub const MAX_IFNAME: usize = 15;

/// An IPv4 address with a prefix length, as written `A.B.C.D/LEN`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Cidr {
    /// The address as written (for an interface, its own address).
    pub addr: Ipv4Addr,
    /// The prefix length, 0..=32.
    pub len: u8,
}

impl Cidr {
    /// The network (host bits cleared).
    pub fn network(&self) -> Ipv4Addr {
        mask(self.addr, self.len)
    }

    /// True when `ip` is inside the prefix.
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        mask(ip, self.len) == self.network()
    }

    /// True when the two prefixes share an address.
    pub fn overlaps(&self, o: &Cidr) -> bool {
        let len = self.len.min(o.len);
        mask(self.addr, len) == mask(o.addr, len)
    }

    /// True when `o` is entirely inside `self`.
    pub fn covers(&self, o: &Cidr) -> bool {
        o.len >= self.len && self.contains(o.addr)
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

impl std::str::FromStr for Cidr {
    type Err = BadValue;
    fn from_str(s: &str) -> Result<Cidr, BadValue> {
        let (a, l) = s.split_once('/').ok_or(BadValue::NotAPrefix {
            example: "\"10.244.1.0/24\"",
        })?;
        let addr: Ipv4Addr = a.parse().map_err(|_| BadValue::PrefixAddress {
            addr: a.to_string(),
            family: 4,
        })?;
        let len: u8 =
            l.parse()
                .ok()
                .filter(|l| *l <= 32)
                .ok_or_else(|| BadValue::PrefixLength {
                    len: l.to_string(),
                    max: 32,
                })?;
        Ok(Cidr { addr, len })
    }
}

/// An IPv6 address with a prefix length, as written `ADDR/LEN`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Cidr6 {
    /// The address as written (for an interface, its own address).
    pub addr: Ipv6Addr,
    /// The prefix length, 0..=128.
    pub len: u8,
}

/// `addr` with all but its first `len` bits cleared.
pub fn mask6(addr: Ipv6Addr, len: u8) -> Ipv6Addr {
    let a = u128::from(addr);
    Ipv6Addr::from(if len == 0 {
        0
    } else {
        a & (u128::MAX << (128 - u32::from(len.min(128))))
    })
}

impl Cidr6 {
    /// The network (host bits cleared).
    pub fn network(&self) -> Ipv6Addr {
        mask6(self.addr, self.len)
    }

    /// True when `ip` is inside the prefix.
    pub fn contains(&self, ip: Ipv6Addr) -> bool {
        mask6(ip, self.len) == self.network()
    }

    /// True when the two prefixes share an address.
    pub fn overlaps(&self, o: &Cidr6) -> bool {
        let len = self.len.min(o.len);
        mask6(self.addr, len) == mask6(o.addr, len)
    }

    /// True when `o` is entirely inside `self`.
    pub fn covers(&self, o: &Cidr6) -> bool {
        o.len >= self.len && self.contains(o.addr)
    }
}

impl fmt::Display for Cidr6 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.len)
    }
}

impl std::str::FromStr for Cidr6 {
    type Err = BadValue;
    fn from_str(s: &str) -> Result<Cidr6, BadValue> {
        let (a, l) = s.split_once('/').ok_or(BadValue::NotAPrefix {
            example: "\"fd00:10:244:1::/64\"",
        })?;
        let addr: Ipv6Addr = a.parse().map_err(|_| BadValue::PrefixAddress {
            addr: a.to_string(),
            family: 6,
        })?;
        let len: u8 =
            l.parse()
                .ok()
                .filter(|l| *l <= 128)
                .ok_or_else(|| BadValue::PrefixLength {
                    len: l.to_string(),
                    max: 128,
                })?;
        Ok(Cidr6 { addr, len })
    }
}

/// A prefix of either family (a route's destination).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IpCidr {
    /// IPv4.
    V4(Cidr),
    /// IPv6.
    V6(Cidr6),
}

impl IpCidr {
    /// The prefix length.
    pub fn prefix_len(&self) -> u8 {
        match self {
            IpCidr::V4(c) => c.len,
            IpCidr::V6(c) => c.len,
        }
    }

    /// The address as written.
    pub fn addr(&self) -> IpAddr {
        match self {
            IpCidr::V4(c) => c.addr.into(),
            IpCidr::V6(c) => c.addr.into(),
        }
    }

    /// The network (host bits cleared).
    pub fn network(&self) -> IpAddr {
        match self {
            IpCidr::V4(c) => c.network().into(),
            IpCidr::V6(c) => c.network().into(),
        }
    }

    /// True for an IPv6 prefix.
    pub fn is_v6(&self) -> bool {
        matches!(self, IpCidr::V6(_))
    }

    /// True when the two prefixes (of one family) share an address.
    pub fn overlaps(&self, o: &IpCidr) -> bool {
        match (self, o) {
            (IpCidr::V4(a), IpCidr::V4(b)) => a.overlaps(b),
            (IpCidr::V6(a), IpCidr::V6(b)) => a.overlaps(b),
            _ => false,
        }
    }

    /// True when `ip` is inside the prefix (never for the other family).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self, ip) {
            (IpCidr::V4(c), IpAddr::V4(a)) => c.contains(a),
            (IpCidr::V6(c), IpAddr::V6(a)) => c.contains(a),
            _ => false,
        }
    }
}

impl fmt::Display for IpCidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            IpCidr::V4(c) => c.fmt(f),
            IpCidr::V6(c) => c.fmt(f),
        }
    }
}

/// A prefix of either family, `A.B.C.D/LEN` or `X:Y::Z/LEN`.
pub fn parse_prefix_any(s: &str) -> Result<IpCidr, BadValue> {
    let (a, _) = s.split_once('/').ok_or(BadValue::NotAPrefix {
        example: "\"10.244.2.0/24\" or \"fd00:10:244:2::/64\"",
    })?;
    if a.contains(':') {
        s.parse::<Cidr6>().map(IpCidr::V6)
    } else {
        s.parse::<Cidr>().map(IpCidr::V4)
    }
}

/// An address of either family.
pub fn parse_ip_any(s: &str) -> Result<IpAddr, BadValue> {
    if !s.contains(':') {
        return parse_ip(s).map(IpAddr::V4);
    }
    s.parse::<Ipv6Addr>()
        .map(IpAddr::V6)
        .map_err(|_| BadValue::NotAnAddress {
            family: 6,
            example: "fd00:10:244:1::2",
        })
}

/// Not unspecified, multicast, loopback or link-local (`fe80::/10`): an address a node can
/// be configured with and route to.
pub fn is_host6(ip: Ipv6Addr) -> bool {
    !(ip.is_unspecified() || ip.is_multicast() || ip.is_loopback() || is_link_local6(ip))
}

/// In `fe80::/10`.
pub fn is_link_local6(ip: Ipv6Addr) -> bool {
    ip.segments()[0] & 0xffc0 == 0xfe80
}

/// An interface address of either family: a host address with its prefix length. An IPv6
/// one may not be link-local: the router derives its link-local address from its MAC, as
/// Linux does.
pub fn parse_iface_addr_any(s: &str) -> Result<IpCidr, BadValue> {
    match parse_prefix_any(s)? {
        IpCidr::V4(_) => parse_iface_addr(s).map(IpCidr::V4),
        IpCidr::V6(c) => {
            if is_link_local6(c.addr) {
                return Err(BadValue::LinkLocal);
            }
            if !is_host6(c.addr) {
                return Err(BadValue::NotAHost);
            }
            if c.len < 127 && c.len > 0 && c.addr == c.network() {
                return Err(BadValue::NetworkAddress {
                    what: "subnet-router anycast",
                    network: c.network().into(),
                    len: c.len,
                    first: Ipv6Addr::from(u128::from(c.network()) + 1).into(),
                });
            }
            Ok(IpCidr::V6(c))
        }
    }
}

/// An interface name (Linux's rules).
pub fn parse_ifname(n: &str) -> Result<String, BadValue> {
    if n.is_empty() {
        Err(BadValue::EmptyName)
    } else if n.len() > MAX_IFNAME {
        Err(BadValue::LongName { len: n.len() })
    } else if n.contains('/')
        || n.contains(':')
        || n.chars().any(|c| c.is_whitespace() || c.is_control())
        || n == "."
        || n == ".."
    {
        Err(BadValue::BadName)
    } else {
        Ok(n.to_string())
    }
}

/// An IPv4 address.
pub fn parse_ip(s: &str) -> Result<Ipv4Addr, BadValue> {
    s.parse().map_err(|_| BadValue::NotAnAddress {
        family: 4,
        example: "10.244.1.2",
    })
}

/// Not unspecified, multicast, broadcast or loopback.
pub fn is_host(ip: Ipv4Addr) -> bool {
    !(ip.is_unspecified() || ip.is_multicast() || ip.is_broadcast() || ip.is_loopback())
}

/// An interface address: a host address with its prefix length.
pub fn parse_iface_addr(s: &str) -> Result<Cidr, BadValue> {
    let c: Cidr = s.parse()?;
    if !is_host(c.addr) {
        return Err(BadValue::NotAHost);
    }
    if c.len < 32 && c.len > 0 && c.addr == c.network() {
        return Err(BadValue::NetworkAddress {
            what: "network",
            network: c.network().into(),
            len: c.len,
            first: Ipv4Addr::from(u32::from(c.network()) + 1).into(),
        });
    }
    Ok(c)
}

/// A station MAC address.
pub fn parse_mac(s: &str) -> Result<MacAddr, BadValue> {
    let m: MacAddr = s.parse().map_err(|_| BadValue::NotAMac)?;
    if !m.is_station() {
        return Err(BadValue::NotAStation);
    }
    Ok(m)
}

/// `LOW-HIGH`.
pub fn parse_port_range(s: &str) -> Result<(u16, u16), BadValue> {
    let bad = |_| BadValue::NotAPortRange;
    let (a, b) = s.split_once('-').ok_or(BadValue::NotAPortRange)?;
    let a: u16 = a.trim().parse().map_err(bad)?;
    let b: u16 = b.trim().parse().map_err(bad)?;
    if a == 0 || a > b {
        return Err(BadValue::PortRangeOrder);
    }
    Ok((a, b))
}

/// Why a value of the config file is refused: what follows the key and the value in its
/// diagnostic (`address = "10.244.1.0/24" is the network address of ...`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BadValue {
    /// No `/` between an address and a prefix length.
    #[error("is not ADDRESS/LENGTH (expected like {example})")]
    NotAPrefix {
        /// A well-formed value, quoted.
        example: &'static str,
    },
    /// The part before the `/` is not an address of the family.
    #[error("has {addr:?}, which is not an IPv{family} address")]
    PrefixAddress {
        /// The part before the `/`.
        addr: String,
        /// 4 or 6.
        family: u8,
    },
    /// The prefix length is not a number up to the family's bits.
    #[error("has prefix length {len:?}, expected 0 to {max}")]
    PrefixLength {
        /// The part after the `/`.
        len: String,
        /// 32 or 128.
        max: u8,
    },
    /// Not an address of the family.
    #[error("is not an IPv{family} address (expected like \"{example}\")")]
    NotAnAddress {
        /// 4 or 6.
        family: u8,
        /// A well-formed one.
        example: &'static str,
    },
    /// An IPv6 interface address in `fe80::/10`.
    #[error("is link-local: the interface's link-local address is derived from its MAC (give a global or unique local address)")]
    LinkLocal,
    /// Unspecified, multicast, broadcast, loopback (or IPv6 link-local).
    #[error("is not a unicast host address")]
    NotAHost,
    /// An interface address that is its subnet's own address.
    #[error("is the {what} address of {network}/{len}; an interface needs a host address (like \"{first}/{len}\")")]
    NetworkAddress {
        /// "network" (IPv4) or "subnet-router anycast" (IPv6).
        what: &'static str,
        /// The subnet.
        network: IpAddr,
        /// Its prefix length.
        len: u8,
        /// The subnet's first host address.
        first: IpAddr,
    },
    /// An empty interface name.
    #[error("is empty, expected an interface name")]
    EmptyName,
    /// An interface name longer than `IFNAMSIZ` allows.
    #[error("is {len} bytes long, longer than Linux allows for an interface name ({MAX_IFNAME}, IFNAMSIZ)")]
    LongName {
        /// Its length in bytes.
        len: usize,
    },
    /// An interface name with a `/`, a `:`, a space or a control character, or `.`/`..`.
    #[error("is not a valid interface name (no '/', ':' or spaces)")]
    BadName,
    /// Not a MAC address.
    #[error("is not a MAC address (expected like \"02:00:00:00:00:01\")")]
    NotAMac,
    /// A group or all-zero MAC.
    #[error("is not a unicast, non-zero MAC address")]
    NotAStation,
    /// Not `LOW-HIGH`.
    #[error("is not a port range (expected like \"30000-32767\")")]
    NotAPortRange,
    /// Not a node name.
    #[error("is not a node name (1 to 63 bytes, no '/' or spaces)")]
    NodeName,
    /// An empty path.
    #[error("is empty, expected a path")]
    EmptyPath,
    /// Not a Kubernetes Service name.
    #[error("is not a Service name (1 to 63 of a-z, 0-9 and '-', as Kubernetes)")]
    ServiceName,
    /// Unspecified, multicast, broadcast or loopback.
    #[error("is not a unicast address")]
    NotUnicast,
    /// Not `IP:PORT`.
    #[error("is not IP:PORT (like \"10.244.1.2:8080\" or \"[fd00:10:244:1::2]:8080\")")]
    NotAnEndpoint,
    /// An endpoint with port 0.
    #[error("has port 0")]
    PortZero,
    /// Not one of a choice's values.
    #[error("is not a {what}: expected {}", one_of(values))]
    NotAChoice {
        /// What the choice is (from the schema).
        what: &'static str,
        /// Its values.
        values: &'static [&'static str],
    },
    /// `LOW-HIGH` with LOW 0 or above HIGH.
    #[error("is not a port range: expected LOW-HIGH with 1 <= LOW <= HIGH <= 65535")]
    PortRangeOrder,
}

/// `"a", "b" or "c"`.
fn one_of(values: &[&str]) -> String {
    let quoted: Vec<String> = values.iter().map(|v| format!("{v:?}")).collect();
    match quoted.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        Some((last, _)) => last.clone(),
        None => String::new(),
    }
}
