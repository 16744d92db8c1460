//! VXLAN interfaces of the router, as Flannel's `flannel.1` is to Linux: an L3 interface with
//! its own address and VTEP MAC, a VNI, a UDP port, an uplink the encapsulated packets leave
//! and arrive on, and a set of peers.
//!
//! # Underlay families
//!
//! The interface's `addr` picks its family, as Flannel's two devices on a dual-stack node:
//! `flannel.1` (an IPv4 address such as `10.244.1.0/32`) runs over the uplink's IPv4
//! address, `flannel-v6.1` (an IPv6 address such as `fd00:10:244:1::/128`) over the uplink's
//! IPv6 address, with an MTU of the uplink's minus 70 ([`vxlan::overhead`]) and the outer
//! UDP checksum always computed and required on receive (Linux's `udp6zerocsumtx`/`rx` off).
//! Its peers' node addresses and pod subnets are of the same family. Both can run at once.
//!
//! A peer ([`VxlanPeer`]) stands for the three kernel objects Flannel programs per remote
//! node: a route `<pod_cidr> via <pod_cidr's first address> dev flannel.1 onlink`, a
//! permanent neighbour `<that address> lladdr <vtep_mac>` and an FDB entry `<vtep_mac> dst
//! <node_ip>`. The datapath adds the route and the neighbour with the peer
//! ([`crate::Control::add_vxlan_peer`]); the FDB part lives here.
//!
//! # Thread safety
//!
//! The peer set is published as the bridges' member lists are (RCU): an immutable
//! [`PeerSet`] replaced whole with one `ArcSwap` store, so a worker looks a peer up (by VTEP
//! MAC to encapsulate, by node address to decapsulate) with no lock and sees the set before
//! or after a change. Changes are serialised by a writer mutex. A peer's counters are shared
//! atomics that survive set versions (they live in the peer's `Arc`).
//!
//! # Example: Flannel's node A, with node B as a peer
//!
//! ```
//! use std::net::Ipv4Addr;
//! use tapyard::l3::vxlan::default_mac;
//! use tapyard::l3::{IfaceConfig, VxlanConfig, VxlanPeer};
//! use tapyard::{Datapath, Instant, MacAddr};
//!
//! let mut b = Datapath::builder();
//! let up_mac = MacAddr([2, 0, 0, 0, 0, 2]);
//! b.add_router_iface(IfaceConfig::new("eth0", up_mac, Ipv4Addr::new(172, 18, 0, 2), 24), None)?;
//! let cfg = VxlanConfig::new("flannel.1", 1, 8472, "eth0", Ipv4Addr::new(10, 244, 1, 0));
//! assert_eq!(cfg.mac.to_string(), "0a:58:0a:f4:01:00");
//! b.add_vxlan(cfg)?;
//! let dp = b.build();
//! let node_b = VxlanPeer {
//!     node_ip: Ipv4Addr::new(172, 18, 0, 3).into(),
//!     vtep_mac: default_mac(Ipv4Addr::new(10, 244, 2, 0)),
//!     pod_cidr: Ipv4Addr::new(10, 244, 2, 0).into(),
//!     pod_prefix_len: 24,
//! };
//! dp.control().add_vxlan_peer("flannel.1", node_b, Instant::from_secs(1))?;
//! let mut routes = String::new();
//! dp.control().fmt_routes(&mut routes)?;
//! assert!(routes.contains("10.244.2.0/24 via 10.244.2.0 dev flannel.1 onlink"));
//! assert_eq!(dp.control().tunnel_by_name("flannel.1").unwrap().mtu(), 1450);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::{ArcSwap, Guard};
use parking_lot::Mutex;

use crate::base::IfaceId;
use crate::hash::SeededHash;
use crate::l3::route::mask;
use crate::narrow::low16;
use crate::wire::mac::MacAddr;
use crate::wire::vxlan::{self, MAX_VNI};

/// Linux's default `ip_local_port_range`, the range vxlan's source ports are spread over.
pub const DEFAULT_SRC_PORTS: (u16, u16) = (32768, 60999);

/// Settings of one VXLAN interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VxlanConfig {
    /// Interface name (`flannel.1`).
    pub name: String,
    /// VXLAN network identifier, 0..=2^24-1.
    pub vni: u32,
    /// UDP destination port (Flannel: 8472; IANA: 4789).
    pub port: u16,
    /// The router interface (without a bridge) encapsulated packets leave and arrive on; the
    /// outer source address is its address of the family of [`VxlanConfig::addr`].
    pub uplink: String,
    /// The interface's own address (Flannel: the pod subnet's network address, as a /32 or
    /// a /128); its family is the underlay's.
    pub addr: IpAddr,
    /// Its prefix length (32 or 128 for Flannel's).
    pub prefix_len: u8,
    /// The VTEP MAC.
    pub mac: MacAddr,
    /// The interface MTU; `None`: the uplink's minus [`vxlan::OVERHEAD`] (50) over IPv4,
    /// [`vxlan::overhead`] (70) over IPv6.
    pub mtu: Option<u16>,
    /// UDP source ports, inclusive: a hash of the inner flow picks one.
    pub src_ports: (u16, u16),
    /// Outer TTL (IPv4) or hop limit (IPv6).
    pub ttl: u8,
}

impl VxlanConfig {
    /// An interface with the address `addr` as a host prefix (/32 or /128), the default MAC
    /// ([`default_mac`]), the uplink's MTU minus the overhead (50 or 70), source ports
    /// 32768–60999 and TTL (hop limit) 64.
    pub fn new(
        name: impl Into<String>,
        vni: u32,
        port: u16,
        uplink: impl Into<String>,
        addr: impl Into<IpAddr>,
    ) -> VxlanConfig {
        let addr = addr.into();
        VxlanConfig {
            name: name.into(),
            vni,
            port,
            uplink: uplink.into(),
            addr,
            prefix_len: host_len(addr),
            mac: default_mac(addr),
            mtu: None,
            src_ports: DEFAULT_SRC_PORTS,
            ttl: 64,
        }
    }
}

/// The default VTEP MAC for an address: `0a:58:` followed by its four bytes; for an IPv6
/// address, by its bytes 4 to 7 (where a /64 pod subnet's number sits under a /32 to /64
/// cluster CIDR: `fd00:10:244:1::` gives `0a:58:02:44:00:01`). Linux gives a vxlan device a
/// random MAC and Flannel publishes it; tapyard derives one so that it is stable.
pub fn default_mac(addr: impl Into<IpAddr>) -> MacAddr {
    let o = match addr.into() {
        IpAddr::V4(a) => a.octets(),
        IpAddr::V6(a) => {
            let b = a.octets();
            [b[4], b[5], b[6], b[7]]
        }
    };
    MacAddr([0x0a, 0x58, o[0], o[1], o[2], o[3]])
}

/// The host prefix length of an address's family (32 or 128).
pub fn host_len(a: IpAddr) -> u8 {
    if a.is_ipv4() {
        32
    } else {
        128
    }
}

/// `a` with all but its first `len` bits cleared, in its family.
pub fn mask_ip(a: IpAddr, len: u8) -> IpAddr {
    match a {
        IpAddr::V4(a) => mask(a, len).into(),
        IpAddr::V6(a) => crate::wire::ipv6::mask(a, len).into(),
    }
}

/// A remote node reached through a VXLAN interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VxlanPeer {
    /// The node's underlay address (outer destination), of the interface's underlay family.
    pub node_ip: IpAddr,
    /// Its VTEP MAC (inner destination).
    pub vtep_mac: MacAddr,
    /// Its pod subnet, of the interface's address family.
    pub pod_cidr: IpAddr,
    /// The pod subnet's prefix length.
    pub pod_prefix_len: u8,
}

impl VxlanPeer {
    /// A peer from addresses of either family (`Ipv4Addr`, `Ipv6Addr` or `IpAddr`).
    pub fn new(
        node_ip: impl Into<IpAddr>,
        vtep_mac: MacAddr,
        pod_cidr: impl Into<IpAddr>,
        pod_prefix_len: u8,
    ) -> VxlanPeer {
        VxlanPeer {
            node_ip: node_ip.into(),
            vtep_mac,
            pod_cidr: pod_cidr.into(),
            pod_prefix_len,
        }
    }

    /// The next hop the peer's route goes through: its pod subnet's first (network) address,
    /// which is the remote VTEP's own address under Flannel's convention.
    pub fn gateway(&self) -> IpAddr {
        mask_ip(self.pod_cidr, self.pod_prefix_len)
    }
}

/// One peer with its packet counters.
#[derive(Debug)]
pub struct PeerEntry {
    /// The peer.
    pub peer: VxlanPeer,
    rx_packets: AtomicU64,
    rx_bytes: AtomicU64,
    tx_packets: AtomicU64,
    tx_bytes: AtomicU64,
}

/// A peer's counters at one moment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeerStats {
    /// Packets decapsulated from the peer.
    pub rx_packets: u64,
    /// Their bytes (inner frames).
    pub rx_bytes: u64,
    /// Packets encapsulated to the peer (a super-frame counts once).
    pub tx_packets: u64,
    /// Their bytes (inner frames).
    pub tx_bytes: u64,
}

impl PeerEntry {
    fn new(peer: VxlanPeer) -> PeerEntry {
        PeerEntry {
            peer,
            rx_packets: AtomicU64::new(0),
            rx_bytes: AtomicU64::new(0),
            tx_packets: AtomicU64::new(0),
            tx_bytes: AtomicU64::new(0),
        }
    }

    /// Counts a packet received from the peer.
    #[inline]
    pub(crate) fn count_rx(&self, bytes: usize) {
        self.rx_packets.fetch_add(1, Ordering::Relaxed);
        self.rx_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }

    /// Counts a packet sent to the peer; returns the number sent before it (the outer IPv4
    /// identification is taken from it, as Linux takes one from a per-destination counter).
    #[inline]
    pub(crate) fn count_tx(&self, bytes: usize) -> u64 {
        self.tx_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        self.tx_packets.fetch_add(1, Ordering::Relaxed)
    }

    /// The counters now.
    pub fn stats(&self) -> PeerStats {
        PeerStats {
            rx_packets: self.rx_packets.load(Ordering::Relaxed),
            rx_bytes: self.rx_bytes.load(Ordering::Relaxed),
            tx_packets: self.tx_packets.load(Ordering::Relaxed),
            tx_bytes: self.tx_bytes.load(Ordering::Relaxed),
        }
    }
}

/// One version of a tunnel's peers, immutable once published.
#[derive(Debug, Default)]
pub struct PeerSet {
    list: Vec<Arc<PeerEntry>>,
    by_mac: hashbrown::HashMap<MacAddr, usize>,
    by_ip: hashbrown::HashMap<IpAddr, usize>,
}

impl PeerSet {
    fn from_list(list: Vec<Arc<PeerEntry>>) -> PeerSet {
        let by_mac = list
            .iter()
            .enumerate()
            .map(|(i, p)| (p.peer.vtep_mac, i))
            .collect();
        let by_ip = list
            .iter()
            .enumerate()
            .map(|(i, p)| (p.peer.node_ip, i))
            .collect();
        PeerSet {
            list,
            by_mac,
            by_ip,
        }
    }

    /// The peer whose VTEP has this MAC (the FDB entry).
    #[inline]
    pub fn by_mac(&self, mac: MacAddr) -> Option<&Arc<PeerEntry>> {
        self.by_mac.get(&mac).and_then(|&i| self.list.get(i))
    }

    /// The peer whose node has this address.
    #[inline]
    pub fn by_ip(&self, ip: impl Into<IpAddr>) -> Option<&Arc<PeerEntry>> {
        self.by_ip.get(&ip.into()).and_then(|&i| self.list.get(i))
    }

    /// Every peer, in the order they were added.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<PeerEntry>> {
        self.list.iter()
    }

    /// Number of peers.
    pub fn len(&self) -> usize {
        self.list.len()
    }

    /// True when there is no peer.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }
}

/// Why a peer cannot be added (each names the field and value).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PeerError {
    /// The node address is this node's own uplink address, or not a unicast address.
    BadNodeIp(IpAddr),
    /// An address of the other family than the interface's: the node address against the
    /// underlay's, or the pod subnet against the interface address's.
    WrongFamily(&'static str, IpAddr),
    /// The VTEP MAC is not a unicast, non-zero address, or is this interface's.
    BadVtepMac(MacAddr),
    /// Another peer has this node address.
    DuplicateNodeIp(IpAddr),
    /// Another peer has this VTEP MAC.
    DuplicateVtepMac(MacAddr),
    /// The pod subnet overlaps another peer's.
    Overlap {
        /// The new pod subnet.
        pod_cidr: (IpAddr, u8),
        /// The peer's it overlaps.
        other: (IpAddr, u8),
    },
    /// The pod subnet's prefix length is above 32 (128) or its address is not the network's.
    BadPodCidr(IpAddr, u8),
    /// No peer with that node address.
    NotFound(IpAddr),
    /// No VXLAN interface of that name.
    NoSuchTunnel(String),
    /// The route or neighbour the peer implies could not be added.
    Table(String),
}

impl std::fmt::Display for PeerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PeerError::BadNodeIp(a) => write!(
                f,
                "node_ip = {a} is invalid: expected a unicast address other than this node's uplink"
            ),
            PeerError::BadVtepMac(m) => write!(
                f,
                "vtep_mac = {m} is invalid: expected a unicast, non-zero MAC other than this VTEP's"
            ),
            PeerError::WrongFamily(field, a) => write!(
                f,
                "{field} = {a} is of the other IP family than this VXLAN interface's ({})",
                if *field == "node_ip" { "its underlay: the uplink address it sends from" } else { "its address" }
            ),
            PeerError::DuplicateNodeIp(a) => write!(f, "node_ip = {a} is used by another peer"),
            PeerError::DuplicateVtepMac(m) => write!(f, "vtep_mac = {m} is used by another peer"),
            PeerError::Overlap { pod_cidr, other } => write!(
                f,
                "pod_cidr = {}/{} overlaps another peer's {}/{}",
                pod_cidr.0, pod_cidr.1, other.0, other.1
            ),
            PeerError::BadPodCidr(a, l) => write!(
                f,
                "pod_cidr = {a}/{l} is invalid: expected a network address and a prefix length within its family's"
            ),
            PeerError::NotFound(a) => write!(f, "no peer has node_ip = {a}"),
            PeerError::NoSuchTunnel(n) => write!(f, "no VXLAN interface is called {n:?}"),
            PeerError::Table(e) => write!(f, "the peer's route or neighbour: {e}"),
        }
    }
}

impl std::error::Error for PeerError {}

/// A VXLAN interface as the datapath holds it (see the module docs).
#[derive(Debug)]
pub struct Tunnel {
    pub(crate) cfg: VxlanConfig,
    /// The router interface that is the tunnel.
    pub(crate) iface: IfaceId,
    /// The uplink interface.
    pub(crate) uplink: IfaceId,
    /// The uplink's address of the underlay's family: the outer source.
    pub(crate) local: IpAddr,
    /// The MTU in effect.
    pub(crate) mtu: u16,
    peers: ArcSwap<PeerSet>,
    writer: Mutex<()>,
    hash: SeededHash,
}

impl Tunnel {
    pub(crate) fn new(
        cfg: VxlanConfig,
        iface: IfaceId,
        uplink: IfaceId,
        local: IpAddr,
        mtu: u16,
    ) -> Tunnel {
        Tunnel {
            cfg,
            iface,
            uplink,
            local,
            mtu,
            peers: ArcSwap::from_pointee(PeerSet::default()),
            writer: Mutex::new(()),
            hash: SeededHash::random(),
        }
    }

    /// The interface's settings.
    pub fn config(&self) -> &VxlanConfig {
        &self.cfg
    }

    /// The router interface that is the tunnel.
    pub fn iface(&self) -> IfaceId {
        self.iface
    }

    /// The uplink interface.
    pub fn uplink(&self) -> IfaceId {
        self.uplink
    }

    /// The outer source address (the uplink's, of the underlay's family).
    pub fn local(&self) -> IpAddr {
        self.local
    }

    /// The MTU in effect.
    pub fn mtu(&self) -> u16 {
        self.mtu
    }

    /// The current peer set (lock-free; a reader keeps the version it loaded).
    #[inline]
    pub fn peers(&self) -> Guard<Arc<PeerSet>> {
        self.peers.load()
    }

    /// The UDP source port for an inner frame: a hash of its flow mapped into the source
    /// port range, as Linux's `udp_flow_src_port`.
    #[inline]
    pub(crate) fn src_port(&self, inner: &[u8]) -> u16 {
        let h = self.hash.hash_pair(vxlan::flow_words(inner)) >> 32;
        let (lo, hi) = self.cfg.src_ports;
        let span = u64::from(hi.saturating_sub(lo)) + 1;
        lo.saturating_add(low16((h * span) >> 32))
    }

    /// Checks a peer against the interface and the other peers.
    pub(crate) fn check_peer(&self, p: &VxlanPeer) -> Result<(), PeerError> {
        if p.node_ip.is_ipv4() != self.local.is_ipv4() {
            return Err(PeerError::WrongFamily("node_ip", p.node_ip));
        }
        if p.pod_cidr.is_ipv4() != self.cfg.addr.is_ipv4() {
            return Err(PeerError::WrongFamily("pod_cidr", p.pod_cidr));
        }
        let bad = match p.node_ip {
            IpAddr::V4(a) => a.is_broadcast(),
            IpAddr::V6(a) => crate::wire::ipv6::is_link_local(&a),
        };
        if p.node_ip == self.local
            || p.node_ip.is_unspecified()
            || p.node_ip.is_multicast()
            || p.node_ip.is_loopback()
            || bad
        {
            return Err(PeerError::BadNodeIp(p.node_ip));
        }
        if !p.vtep_mac.is_station() || p.vtep_mac == self.cfg.mac {
            return Err(PeerError::BadVtepMac(p.vtep_mac));
        }
        if p.pod_prefix_len > host_len(p.pod_cidr)
            || mask_ip(p.pod_cidr, p.pod_prefix_len) != p.pod_cidr
        {
            return Err(PeerError::BadPodCidr(p.pod_cidr, p.pod_prefix_len));
        }
        let set = self.peers.load();
        for o in set.iter().map(|e| &e.peer) {
            if o.node_ip == p.node_ip {
                return Err(PeerError::DuplicateNodeIp(p.node_ip));
            }
            if o.vtep_mac == p.vtep_mac {
                return Err(PeerError::DuplicateVtepMac(p.vtep_mac));
            }
            let l = o.pod_prefix_len.min(p.pod_prefix_len);
            if mask_ip(o.pod_cidr, l) == mask_ip(p.pod_cidr, l) {
                return Err(PeerError::Overlap {
                    pod_cidr: (p.pod_cidr, p.pod_prefix_len),
                    other: (o.pod_cidr, o.pod_prefix_len),
                });
            }
        }
        Ok(())
    }

    /// Publishes the set with `p` added (checked by the caller under [`Tunnel::lock`]).
    pub(crate) fn publish_add(&self, p: VxlanPeer) {
        let mut list = self.peers.load().list.clone();
        list.push(Arc::new(PeerEntry::new(p)));
        self.peers.store(Arc::new(PeerSet::from_list(list)));
    }

    /// Publishes the set without the peer at `node_ip`; returns it.
    pub(crate) fn publish_remove(&self, node_ip: IpAddr) -> Option<VxlanPeer> {
        let cur = self.peers.load();
        let i = cur.list.iter().position(|e| e.peer.node_ip == node_ip)?;
        let mut list = cur.list.clone();
        let gone = list.remove(i);
        self.peers.store(Arc::new(PeerSet::from_list(list)));
        Some(gone.peer)
    }

    /// The writer lock: held across a peer change and the route and neighbour that go with it.
    pub(crate) fn lock(&self) -> parking_lot::MutexGuard<'_, ()> {
        self.writer.lock()
    }
}

/// Checks a VXLAN interface's settings that do not depend on other interfaces.
pub(crate) fn check_config(cfg: &VxlanConfig) -> Result<(), (&'static str, String, &'static str)> {
    if cfg.vni > MAX_VNI {
        return Err(("vni", cfg.vni.to_string(), "0 to 16777215 (24 bits)"));
    }
    if cfg.port == 0 {
        return Err(("port", "0".into(), "1 to 65535"));
    }
    if cfg.src_ports.0 == 0 || cfg.src_ports.0 > cfg.src_ports.1 {
        return Err((
            "src_ports",
            format!("{}-{}", cfg.src_ports.0, cfg.src_ports.1),
            "a range LOW-HIGH with 1 <= LOW <= HIGH",
        ));
    }
    if cfg.ttl == 0 {
        return Err(("ttl", "0".into(), "1 to 255"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn tunnel() -> Tunnel {
        let cfg = VxlanConfig::new("flannel.1", 1, 8472, "eth0", Ipv4Addr::new(10, 244, 1, 0));
        Tunnel::new(
            cfg,
            IfaceId(2),
            IfaceId(1),
            Ipv4Addr::new(172, 18, 0, 2).into(),
            1450,
        )
    }

    fn peer(n: u8) -> VxlanPeer {
        VxlanPeer::new(
            Ipv4Addr::new(172, 18, 0, n),
            default_mac(Ipv4Addr::new(10, 244, n, 0)),
            Ipv4Addr::new(10, 244, n, 0),
            24,
        )
    }

    #[test]
    fn default_mac_is_flannels() {
        assert_eq!(
            default_mac(Ipv4Addr::new(10, 244, 1, 0)).to_string(),
            "0a:58:0a:f4:01:00"
        );
    }

    #[test]
    fn peers_are_checked_and_published() {
        let t = tunnel();
        t.check_peer(&peer(3)).unwrap();
        t.publish_add(peer(3));
        assert_eq!(t.peers().by_ip(peer(3).node_ip).unwrap().peer, peer(3));
        assert_eq!(t.peers().by_mac(peer(3).vtep_mac).unwrap().peer, peer(3));
        assert_eq!(
            t.check_peer(&peer(3)),
            Err(PeerError::DuplicateNodeIp(peer(3).node_ip))
        );
        let mut own = peer(4);
        own.node_ip = t.local;
        assert_eq!(t.check_peer(&own), Err(PeerError::BadNodeIp(t.local)));
        let mut wide = peer(4);
        wide.pod_cidr = Ipv4Addr::new(10, 244, 0, 0).into();
        wide.pod_prefix_len = 16;
        assert!(matches!(
            t.check_peer(&wide),
            Err(PeerError::Overlap { .. })
        ));
        let mut host = peer(4);
        host.pod_cidr = Ipv4Addr::new(10, 244, 4, 1).into();
        assert!(matches!(
            t.check_peer(&host),
            Err(PeerError::BadPodCidr(..))
        ));
        let old = t.peers();
        assert_eq!(t.publish_remove(peer(3).node_ip), Some(peer(3)));
        assert!(t.peers().is_empty());
        // A reader keeps the version it loaded.
        assert_eq!(old.len(), 1);
        assert_eq!(peer(3).gateway(), IpAddr::from([10, 244, 3, 0]));
        let v6 = VxlanPeer::new(
            "fd00:172:18::3".parse::<std::net::Ipv6Addr>().unwrap(),
            MacAddr([0x0a, 0x58, 2, 0x44, 0, 3]),
            "fd00:10:244:3::".parse::<std::net::Ipv6Addr>().unwrap(),
            64,
        );
        assert_eq!(
            t.check_peer(&v6),
            Err(PeerError::WrongFamily("node_ip", v6.node_ip))
        );
        assert_eq!(
            default_mac("fd00:10:244:1::".parse::<IpAddr>().unwrap()).to_string(),
            "0a:58:02:44:00:01"
        );
    }

    #[test]
    fn source_ports_stay_in_range_and_follow_the_flow() {
        let mut t = tunnel();
        t.cfg.src_ports = (32768, 60999);
        let mut seen = std::collections::BTreeSet::new();
        for i in 0..200u8 {
            let mut f = Vec::new();
            etherparse::PacketBuilder::ethernet2([2; 6], [4; 6])
                .ipv4([10, 244, 1, 2], [10, 244, 2, i], 64)
                .udp(1000 + u16::from(i), 53)
                .write(&mut f, &[])
                .unwrap();
            let p = t.src_port(&f);
            assert!((32768..=60999).contains(&p));
            assert_eq!(p, t.src_port(&f), "one flow, one port");
            seen.insert(p);
        }
        assert!(seen.len() > 150, "flows spread: {}", seen.len());
        assert!(check_config(&VxlanConfig {
            vni: 1 << 24,
            ..t.cfg.clone()
        })
        .is_err());
    }
}
