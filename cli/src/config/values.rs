//! The values written as strings: prefixes, addresses, names, MACs, port ranges. Each parser's
//! error says what is wrong with the value and what was expected.

use std::fmt;
use std::net::Ipv4Addr;

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
    type Err = String;
    fn from_str(s: &str) -> Result<Cidr, String> {
        let (a, l) = s
            .split_once('/')
            .ok_or("is not ADDRESS/LENGTH (expected like \"10.244.1.0/24\")")?;
        let addr: Ipv4Addr = a
            .parse()
            .map_err(|_| format!("has {a:?}, which is not an IPv4 address"))?;
        let len: u8 = l
            .parse()
            .ok()
            .filter(|l| *l <= 32)
            .ok_or_else(|| format!("has prefix length {l:?}, expected 0 to 32"))?;
        Ok(Cidr { addr, len })
    }
}

/// An interface name (Linux's rules).
pub fn parse_ifname(n: &str) -> Result<String, String> {
    if n.is_empty() {
        Err("is empty, expected an interface name".into())
    } else if n.len() > MAX_IFNAME {
        Err(format!(
            "is {} bytes long, longer than Linux allows for an interface name ({MAX_IFNAME}, IFNAMSIZ)",
            n.len()
        ))
    } else if n.contains('/')
        || n.contains(':')
        || n.chars().any(|c| c.is_whitespace() || c.is_control())
        || n == "."
        || n == ".."
    {
        Err("is not a valid interface name (no '/', ':' or spaces)".into())
    } else {
        Ok(n.to_string())
    }
}

/// An IPv4 address.
pub fn parse_ip(s: &str) -> Result<Ipv4Addr, String> {
    s.parse()
        .map_err(|_| "is not an IPv4 address (expected like \"10.244.1.2\")".to_string())
}

/// Not unspecified, multicast, broadcast or loopback.
pub fn is_host(ip: Ipv4Addr) -> bool {
    !(ip.is_unspecified() || ip.is_multicast() || ip.is_broadcast() || ip.is_loopback())
}

/// A prefix, `A.B.C.D/LEN`.
pub fn parse_prefix(s: &str) -> Result<Cidr, String> {
    s.parse::<Cidr>()
}

/// An interface address: a host address with its prefix length.
pub fn parse_iface_addr(s: &str) -> Result<Cidr, String> {
    let c: Cidr = s.parse()?;
    if !is_host(c.addr) {
        return Err("is not a unicast host address".into());
    }
    if c.len < 32 && c.len > 0 && c.addr == c.network() {
        return Err(format!(
            "is the network address of {}/{}; an interface needs a host address (like \"{}/{}\")",
            c.network(),
            c.len,
            Ipv4Addr::from(u32::from(c.network()) + 1),
            c.len
        ));
    }
    Ok(c)
}

/// A station MAC address.
pub fn parse_mac(s: &str) -> Result<MacAddr, String> {
    let m: MacAddr = s
        .parse()
        .map_err(|_| "is not a MAC address (expected like \"02:00:00:00:00:01\")".to_string())?;
    if !m.is_station() {
        return Err("is not a unicast, non-zero MAC address".into());
    }
    Ok(m)
}

/// `LOW-HIGH`.
pub fn parse_port_range(s: &str) -> Result<(u16, u16), String> {
    let bad = || "is not a port range (expected like \"30000-32767\")".to_string();
    let (a, b) = s.split_once('-').ok_or_else(bad)?;
    let a: u16 = a.trim().parse().map_err(|_| bad())?;
    let b: u16 = b.trim().parse().map_err(|_| bad())?;
    if a == 0 || a > b {
        return Err("is not a port range: expected LOW-HIGH with 1 <= LOW <= HIGH <= 65535".into());
    }
    Ok((a, b))
}
