//! The CNI result types: what IPAM plugins hand back and what this plugin prints.
//!
//! One set of types reads both result shapes this plugin supports: 0.4.0 (each IP carries a
//! `"version": "4"|"6"`) and 1.0.0 (it does not). [`CniResult::for_version`] shapes a result
//! for the version the network configuration asked for.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// An address with a prefix length, as CNI writes it: `"10.244.1.5/24"` (host bits kept).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Cidr {
    /// The address.
    pub addr: IpAddr,
    /// The prefix length: at most 32 for IPv4, 128 for IPv6.
    pub prefix_len: u8,
}

impl Cidr {
    /// The address with the host bits cleared (the network itself).
    pub fn network(&self) -> Cidr {
        let addr = match self.addr {
            IpAddr::V4(a) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix_len))
                    .unwrap_or(0);
                IpAddr::V4((u32::from(a) & mask).into())
            }
            IpAddr::V6(a) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix_len))
                    .unwrap_or(0);
                IpAddr::V6((u128::from(a) & mask).into())
            }
        };
        Cidr {
            addr,
            prefix_len: self.prefix_len,
        }
    }
}

impl FromStr for Cidr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (addr, len) = s
            .split_once('/')
            .ok_or_else(|| format!("{s:?} has no /prefix"))?;
        let addr: IpAddr = addr.parse().map_err(|_| format!("{s:?}: bad address"))?;
        let prefix_len: u8 = len
            .parse()
            .map_err(|_| format!("{s:?}: bad prefix length"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        if prefix_len > max {
            return Err(format!("{s:?}: prefix length over {max}"));
        }
        Ok(Cidr { addr, prefix_len })
    }
}

impl TryFrom<String> for Cidr {
    type Error = String;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

impl From<Cidr> for String {
    fn from(c: Cidr) -> String {
        c.to_string()
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix_len)
    }
}

/// An interface of the result (`interfaces[]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Interface {
    /// The interface name (`CNI_IFNAME` for the one this plugin creates).
    pub name: String,
    /// Its MAC address, `aa:bb:cc:dd:ee:ff`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub mac: String,
    /// The namespace it lives in (`CNI_NETNS`); absent for host interfaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
}

/// An IP configuration of the result (`ips[]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IpConfig {
    /// `"4"` or `"6"`: present in 0.4.0 results only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The address with its prefix length.
    pub address: Cidr,
    /// The gateway of its subnet, if IPAM named one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<IpAddr>,
    /// Index into `interfaces` of the interface holding it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<usize>,
}

/// A route of the result (`routes[]`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Route {
    /// The destination.
    pub dst: Cidr,
    /// The next hop; when absent the route goes via the default gateway of its family.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gw: Option<IpAddr>,
}

/// DNS settings (`dns`), passed through from IPAM or the network configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dns {
    /// Name servers, in priority order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nameservers: Vec<String>,
    /// The local domain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain: Option<String>,
    /// Search domains, in priority order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub search: Vec<String>,
    /// Resolver options.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

impl Dns {
    /// Whether nothing is set.
    pub fn is_empty(&self) -> bool {
        self.nameservers.is_empty()
            && self.domain.is_none()
            && self.search.is_empty()
            && self.options.is_empty()
    }
}

/// A CNI result (an IPAM plugin's has no `interfaces`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CniResult {
    /// The spec version the result is written in.
    #[serde(default)]
    pub cni_version: String,
    /// The interfaces created.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<Interface>,
    /// The addresses assigned.
    #[serde(default)]
    pub ips: Vec<IpConfig>,
    /// The routes installed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<Route>,
    /// DNS settings.
    #[serde(default)]
    pub dns: Dns,
}

impl CniResult {
    /// The result written for `cni_version`: IPs carry `"version"` in 0.4.0 and not in 1.0.0.
    pub fn for_version(mut self, cni_version: &str) -> Self {
        let old = cni_version.starts_with("0.");
        for ip in &mut self.ips {
            ip.version = old.then(|| if ip.address.addr.is_ipv4() { "4" } else { "6" }.into());
        }
        self.cni_version = cni_version.to_string();
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cidr_round_trip_and_errors() {
        let c: Cidr = "10.244.1.5/24".parse().unwrap();
        assert_eq!(c.to_string(), "10.244.1.5/24");
        assert_eq!(c.network().to_string(), "10.244.1.0/24");
        assert_eq!(
            "0.0.0.0/0".parse::<Cidr>().unwrap().network().to_string(),
            "0.0.0.0/0"
        );
        assert_eq!(
            "fd00::5/64".parse::<Cidr>().unwrap().network().to_string(),
            "fd00::/64"
        );
        for bad in ["10.0.0.1", "10.0.0.1/33", "x/8", "10.0.0.1/", "::/129", ""] {
            assert!(bad.parse::<Cidr>().is_err(), "{bad}");
        }
    }

    #[test]
    fn reads_both_versions_and_writes_each() {
        let v04 = r#"{"cniVersion":"0.4.0","ips":[{"version":"4","address":"10.1.0.2/24",
            "gateway":"10.1.0.1"}],"routes":[{"dst":"0.0.0.0/0"}],"dns":{}}"#;
        let r: CniResult = serde_json::from_str(v04).unwrap();
        let out = serde_json::to_value(r.clone().for_version("1.0.0")).unwrap();
        assert_eq!(
            out["ips"][0],
            serde_json::json!({"address":"10.1.0.2/24","gateway":"10.1.0.1"})
        );
        let out = serde_json::to_value(r.for_version("0.4.0")).unwrap();
        assert_eq!(out["ips"][0]["version"], "4");
        assert_eq!(out["dns"], serde_json::json!({}));
    }
}
