//! A pod port's spoof guard: the MAC and addresses the port may send from, as the CNI plugin
//! gave them to the pod, checked on every frame the port sends before the bridge learns
//! from it (Antrea's SpoofGuard, Calico's workload-interface RPF; Linux's bridge has none).
//!
//! A frame passes when
//! - its source MAC is the port's;
//! - IPv4: its source is one of the port's IPv4 addresses, or 0.0.0.0 in a DHCP client's
//!   UDP 68 → 67 datagram;
//! - ARP: its sender MAC is the port's and its sender address one of the port's, or
//!   0.0.0.0 (an ARP probe, RFC 5227);
//! - IPv6: its source is one of the port's IPv6 addresses or a link-local address (fe80::/10:
//!   a pod's kernel picks its own, EUI-64 or stable-privacy, and it never leaves the link), or
//!   `::` in duplicate address detection (a neighbour solicitation for one of the port's own
//!   addresses or a link-local one) or an MLD report; a neighbour advertisement may only
//!   announce the port's own addresses (or a link-local one), and a neighbour discovery
//!   message's link-layer address option must be the port's MAC;
//! - any other EtherType: its source MAC is the port's;
//! - a pod is a host, not a router nor a DHCP server: router advertisements and redirects
//!   (RA guard, RFC 6105: a pod's RA from its link-local address would make its neighbours
//!   route IPv6 through it) and DHCP server messages (UDP from port 67 to 68, DHCPv6 from 547
//!   to 546: a rogue server could hand the bridge's DHCP clients a gateway) are dropped.
//!
//! A frame with one 802.1Q tag is checked by its inner EtherType. Everything else is dropped
//! under its [`SpoofDrop`] reason and counted by the caller per port.

use std::net::{Ipv4Addr, Ipv6Addr};

use crate::wire::mac::MacAddr;

/// The most addresses of each family a guard holds (a pod has one of each; a few spare for
/// secondary addresses).
pub const MAX_ADDRS: usize = 4;

/// Why a guarded port's frame was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
pub enum SpoofDrop {
    /// Its source MAC (or an ARP/NDP sender or link-layer address) is not the port's.
    Mac,
    /// Its IPv4 or IPv6 source address is not the port's.
    Ip,
    /// An ARP packet claims an address that is not the port's.
    Arp,
    /// A neighbour advertisement claims an address that is not the port's.
    Nd,
    /// A router advertisement or redirect (RA guard).
    Router,
    /// A DHCP or DHCPv6 server's message (DHCP guard).
    Dhcp,
}

impl SpoofDrop {
    /// The counter's name.
    pub fn name(self) -> &'static str {
        match self {
            SpoofDrop::Mac => "spoofed_mac",
            SpoofDrop::Ip => "spoofed_ip",
            SpoofDrop::Arp => "spoofed_arp",
            SpoofDrop::Nd => "spoofed_nd",
            SpoofDrop::Router => "ra_guard",
            SpoofDrop::Dhcp => "dhcp_guard",
        }
    }
}

impl From<SpoofDrop> for crate::stats::DropReason {
    fn from(d: SpoofDrop) -> Self {
        use crate::stats::DropReason;
        match d {
            SpoofDrop::Mac => DropReason::SpoofedMac,
            SpoofDrop::Ip => DropReason::SpoofedIp,
            SpoofDrop::Arp => DropReason::SpoofedArp,
            SpoofDrop::Nd => DropReason::SpoofedNd,
            SpoofDrop::Router => DropReason::RaGuard,
            SpoofDrop::Dhcp => DropReason::DhcpGuard,
        }
    }
}

/// A refused guard: too many addresses, or a MAC that is not unicast.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GuardError {
    /// More than [`MAX_ADDRS`] addresses of a family.
    TooMany(usize),
    /// A MAC that is zero, multicast or broadcast.
    NotUnicast(MacAddr),
}

impl std::fmt::Display for GuardError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GuardError::TooMany(n) => {
                write!(f, "at most {MAX_ADDRS} addresses of each family, got {n}")
            }
            GuardError::NotUnicast(m) => write!(f, "mac = {m}: not a unicast MAC"),
        }
    }
}

impl std::error::Error for GuardError {}

/// The MAC and addresses one port may send from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortGuard {
    mac: MacAddr,
    v4: [Ipv4Addr; MAX_ADDRS],
    n4: u8,
    v6: [Ipv6Addr; MAX_ADDRS],
    n6: u8,
}

impl PortGuard {
    /// A guard for a port with MAC `mac` and addresses `addrs` (either family).
    pub fn new(
        mac: MacAddr,
        addrs: impl IntoIterator<Item = std::net::IpAddr>,
    ) -> Result<PortGuard, GuardError> {
        if mac.0 == [0; 6] || mac.0[0] & 1 != 0 {
            return Err(GuardError::NotUnicast(mac));
        }
        let mut g = PortGuard {
            mac,
            v4: [Ipv4Addr::UNSPECIFIED; MAX_ADDRS],
            n4: 0,
            v6: [Ipv6Addr::UNSPECIFIED; MAX_ADDRS],
            n6: 0,
        };
        for a in addrs {
            match a {
                std::net::IpAddr::V4(a) => {
                    let n = usize::from(g.n4);
                    *g.v4.get_mut(n).ok_or(GuardError::TooMany(n + 1))? = a;
                    g.n4 += 1;
                }
                std::net::IpAddr::V6(a) => {
                    let n = usize::from(g.n6);
                    *g.v6.get_mut(n).ok_or(GuardError::TooMany(n + 1))? = a;
                    g.n6 += 1;
                }
            }
        }
        Ok(g)
    }

    /// The port's MAC.
    pub fn mac(&self) -> MacAddr {
        self.mac
    }

    /// The port's IPv4 addresses.
    pub fn ipv4(&self) -> &[Ipv4Addr] {
        &self.v4[..usize::from(self.n4)]
    }

    /// The port's IPv6 addresses.
    pub fn ipv6(&self) -> &[Ipv6Addr] {
        &self.v6[..usize::from(self.n6)]
    }

    fn owns_ipv4(&self, a: [u8; 4]) -> bool {
        self.ipv4().contains(&Ipv4Addr::from(a))
    }

    fn owns_ipv6(&self, a: [u8; 16]) -> bool {
        let a = Ipv6Addr::from(a);
        a.is_unicast_link_local() || self.ipv6().contains(&a)
    }

    /// Checks one frame the port sent (see the module docs); a frame too short to read is
    /// let through for the datapath to drop under its own reason.
    pub fn check(&self, frame: &[u8]) -> Result<(), SpoofDrop> {
        if frame.get(6..12).is_some_and(|m| m != self.mac.0) {
            return Err(SpoofDrop::Mac);
        }
        let (mut ethertype, mut at) = (be16(frame, 12), 14);
        if ethertype == Some(0x8100) {
            (ethertype, at) = (be16(frame, 16), 18);
        }
        let l3 = frame.get(at..).unwrap_or(&[]);
        match ethertype {
            Some(0x0800) => self.check_ipv4(l3),
            Some(0x0806) => self.check_arp(l3),
            Some(0x86dd) => self.check_ipv6(l3),
            _ => Ok(()),
        }
    }

    fn check_ipv4(&self, ip: &[u8]) -> Result<(), SpoofDrop> {
        let Some(src) = array::<4>(ip, 12) else {
            return Ok(());
        };
        let l4 = usize::from(ip[0] & 0x0f) * 4;
        let udp = ip.get(9) == Some(&17);
        if self.owns_ipv4(src) {
            return dhcp_guard(udp, ip, l4, 67, 68);
        }
        // A DHCP client before it has an address: 0.0.0.0, UDP 68 → 67.
        let dhcp = src == [0; 4] && udp && be16(ip, l4) == Some(68) && be16(ip, l4 + 2) == Some(67);
        if dhcp {
            Ok(())
        } else {
            Err(SpoofDrop::Ip)
        }
    }

    fn check_arp(&self, arp: &[u8]) -> Result<(), SpoofDrop> {
        // Ethernet/IPv4 ARP: sender MAC at 8, sender address at 14.
        let (Some(sha), Some(spa)) = (arp.get(8..14), array::<4>(arp, 14)) else {
            return Ok(());
        };
        if sha != self.mac.0 {
            return Err(SpoofDrop::Mac);
        }
        if self.owns_ipv4(spa) || spa == [0; 4] {
            Ok(())
        } else {
            Err(SpoofDrop::Arp)
        }
    }

    fn check_ipv6(&self, ip: &[u8]) -> Result<(), SpoofDrop> {
        let Some(src) = array::<16>(ip, 8) else {
            return Ok(());
        };
        // ICMPv6 right after the fixed header (NDP never has extension headers), or after
        // one hop-by-hop header (MLD's router alert).
        let msg = match ip.get(6) {
            Some(&58) => ip.get(40..),
            Some(&0) if ip.get(40) == Some(&58) => {
                let len = usize::from(ip.get(41).copied().unwrap_or(0));
                ip.get(40 + (len + 1) * 8..)
            }
            _ => None,
        };
        let msg = msg.unwrap_or(&[]);
        let icmp_type = msg.first().copied();
        let unspecified = src == [0; 16];
        let allowed = self.owns_ipv6(src)
            || (unspecified && matches!(icmp_type, Some(NS | MLD_REPORT | MLD2_REPORT)));
        if !allowed {
            return Err(SpoofDrop::Ip);
        }
        match icmp_type {
            Some(RA | REDIRECT) => Err(SpoofDrop::Router),
            Some(RS | NS | NA) => self.check_nd(icmp_type, msg, unspecified),
            // UDP right after the fixed header (a DHCPv6 server's reply has no extension
            // headers).
            _ => dhcp_guard(ip.get(6) == Some(&17), ip, 40, 547, 546),
        }
    }

    /// A neighbour discovery message: an advertisement's target must be the port's, and so
    /// must a duplicate address detection probe's (a solicitation from `::`: another
    /// port's tentative address probed from here would make its owner give it up, RFC 4862
    /// 5.4.3); any link-layer address option must be its MAC.
    fn check_nd(&self, t: Option<u8>, msg: &[u8], unspecified: bool) -> Result<(), SpoofDrop> {
        // RS: 8 bytes before options; NS and NA: 8 + the 16-byte target.
        let opts_at = if t == Some(RS) { 8 } else { 24 };
        if t == Some(NA) || (t == Some(NS) && unspecified) {
            if let Some(target) = array::<16>(msg, 8) {
                if !self.owns_ipv6(target) {
                    return Err(SpoofDrop::Nd);
                }
            }
        }
        let mut at = opts_at;
        // Options: type, length in 8-byte units; source (1) or target (2) link-layer address.
        while let (Some(&kind), Some(&len)) = (msg.get(at), msg.get(at + 1)) {
            if len == 0 {
                break;
            }
            if matches!(kind, 1 | 2) && msg.get(at + 2..at + 8).is_some_and(|m| m != self.mac.0) {
                return Err(SpoofDrop::Mac);
            }
            at += usize::from(len) * 8;
        }
        Ok(())
    }
}

const RS: u8 = 133;
const RA: u8 = 134;
const NS: u8 = 135;
const NA: u8 = 136;
const REDIRECT: u8 = 137;
const MLD_REPORT: u8 = 131;
const MLD2_REPORT: u8 = 143;

/// A UDP datagram (`udp`) at `l4` of `ip` from a DHCP server's port `server` to a client's
/// `client` is refused.
fn dhcp_guard(udp: bool, ip: &[u8], l4: usize, server: u16, client: u16) -> Result<(), SpoofDrop> {
    if udp && be16(ip, l4) == Some(server) && be16(ip, l4 + 2) == Some(client) {
        Err(SpoofDrop::Dhcp)
    } else {
        Ok(())
    }
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

fn array<const N: usize>(b: &[u8], at: usize) -> Option<[u8; N]> {
    b.get(at..at + N)?.try_into().ok()
}

#[cfg(test)]
mod tests;
