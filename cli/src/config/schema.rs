//! The description of the config file, one entry per key: its section, type, range, default
//! and help. The parser takes from it the keys a section allows, what a missing required key
//! is, integer ranges and defaults; [`reference()`] renders from it the key reference at the end
//! of `examples/node.toml` (a test keeps the two equal).

use tapyard::l3::neigh::{NeighConfig, MAX_ENTRIES as NEIGH_MAX};

/// A key's type (and range).
#[derive(Clone, Copy, Debug)]
pub enum Ty {
    /// A string; the example shown in the reference.
    Str(&'static str),
    /// An integer within `lo..=hi`.
    Int {
        /// Smallest allowed.
        lo: i64,
        /// Largest allowed.
        hi: i64,
    },
    /// Seconds, within `lo..=hi`.
    Secs {
        /// Smallest allowed.
        lo: i64,
        /// Largest allowed.
        hi: i64,
    },
    /// `true` or `false`.
    Bool,
    /// An array of strings; the example shown in the reference.
    Strings(&'static str),
    /// Addresses or prefixes: a string, or an array of at most one per family; the example
    /// shown in the reference.
    Addrs(&'static str),
    /// One of a few strings.
    Choice {
        /// What the value is, for the error message ("a route type").
        what: &'static str,
        /// The values as written in the reference.
        values: &'static [&'static str],
        /// Other spellings accepted (Kubernetes' own), with the value each stands for.
        aliases: &'static [(&'static str, &'static str)],
    },
}

/// What a key's absence means.
#[derive(Clone, Copy, Debug)]
pub enum Dflt {
    /// The key must be given; what it is, for the error message.
    Required(&'static str),
    /// No value; what that means.
    Unset(&'static str),
    /// This integer (or number of seconds).
    Int(i64),
    /// The library's default integer (or number of seconds).
    Lib(fn() -> i64),
    /// This boolean.
    Bool(bool),
    /// This string.
    Str(&'static str),
}

/// One key of a section.
#[derive(Clone, Copy, Debug)]
pub struct Key {
    /// Its name.
    pub name: &'static str,
    /// Its type.
    pub ty: Ty,
    /// Its default.
    pub default: Dflt,
    /// What it does, for the reference.
    pub help: &'static str,
}

impl Key {
    /// The integer default (ints and seconds); `None` when the key has none.
    pub fn int_default(&self) -> Option<i64> {
        match self.default {
            Dflt::Int(n) => Some(n),
            Dflt::Lib(f) => Some(f()),
            _ => None,
        }
    }
}

/// A table of the file.
#[derive(Debug)]
pub struct Section {
    /// Its name.
    pub name: &'static str,
    /// Written `[[name]]`: there may be several.
    pub array: bool,
    /// What it is, for the reference.
    pub help: &'static str,
    /// Its keys, in the order the reference lists them.
    pub keys: &'static [Key],
}

impl Section {
    /// The key named `name`. Panics if the description lacks it: the parser asks only for keys
    /// it describes (the tests read every section).
    pub fn key(&self, name: &str) -> &'static Key {
        self.keys
            .iter()
            .find(|k| k.name == name)
            .unwrap_or_else(|| panic!("[{}] has no key {name:?} in the schema", self.name))
    }

    /// The names of its keys.
    pub fn names(&self) -> Vec<&'static str> {
        self.keys.iter().map(|k| k.name).collect()
    }
}

const fn key(name: &'static str, ty: Ty, default: Dflt, help: &'static str) -> Key {
    Key {
        name,
        ty,
        default,
        help,
    }
}

const fn int(lo: i64, hi: i64) -> Ty {
    Ty::Int { lo, hi }
}

const fn secs(lo: i64, hi: i64) -> Ty {
    Ty::Secs { lo, hi }
}

const MTU: Key = key(
    "mtu",
    int(68, 65000),
    Dflt::Int(1500),
    "the router interface's and its TAPs' MTU (at least 1280 with an IPv6 address)",
);
const DAY: i64 = 86_400;

/// `[node]`.
pub const NODE: Section = Section {
    name: "node",
    array: false,
    help: "the node itself",
    keys: &[
        key(
            "name",
            Ty::Str("node-a"),
            Dflt::Required("the node's name, like \"node-a\""),
            "names the node and its default control socket",
        ),
        key(
            "cluster_cidr",
            Ty::Addrs("[\"10.244.0.0/16\", \"fd00:10:244::/56\"]"),
            Dflt::Required("every pod address in the cluster, like \"10.244.0.0/16\""),
            "every pod address in the cluster (IPv4, IPv6, or one of each for a dual-stack cluster)",
        ),
        key(
            "workers",
            int(0, 1024),
            Dflt::Unset("one per CPU (with no bridge: one per TAP, at most the CPUs)"),
            "worker threads",
        ),
        key(
            "busy_poll_us",
            int(0, 1_000_000),
            Dflt::Int(0),
            "busy polling: workers keep reading their ports this many µs after the last frame before sleeping (0: sleep at once)",
        ),
        key(
            "socket",
            Ty::Str("/run/tapyard/node-a.sock"),
            Dflt::Unset("/run/tapyard/<name>.sock"),
            "the control socket",
        ),
        key(
            "state_dir",
            Ty::Str("/run/tapyard/node-a"),
            Dflt::Unset("/run/tapyard/<name>"),
            "ports and connection state kept across restarts",
        ),
        key(
            "node_port_range",
            Ty::Str("30000-32767"),
            Dflt::Str("30000-32767"),
            "node ports Services may use",
        ),
        key(
            "offload",
            Ty::Bool,
            Dflt::Bool(true),
            "TAPs with virtio-net headers, checksum/TSO offloads",
        ),
        key(
            "service_cidr",
            Ty::Addrs("\"10.96.0.0/12\""),
            Dflt::Unset("none: no Service route through the [[host]] port"),
            "every ClusterIP (kube-apiserver's --service-cluster-ip-range): the node's kernel routes it through the [[host]] port",
        ),
        key(
            "masquerade_all",
            Ty::Bool,
            Dflt::Bool(false),
            "kube-proxy's --masquerade-all: every new connection to a ClusterIP is masqueraded (NodePorts keep their policy's rule)",
        ),
        key(
            "random_fully",
            Ty::Bool,
            Dflt::Bool(false),
            "kube-proxy's --iptables-random-fully: every masqueraded source port is chosen at random (else the original one when free)",
        ),
        key(
            "node_port_addresses",
            Ty::Strings("[\"172.18.0.0/16\", \"fd00:172:18::/64\"]"),
            Dflt::Unset("every node address"),
            "kube-proxy's --nodeport-addresses: NodePorts answer only on node addresses inside these prefixes (per family; none of a family: every address of it)",
        ),
        key(
            "healthz_port",
            int(0, 65535),
            Dflt::Int(10256),
            "kube-proxy's /healthz and /livez on the node's addresses (0: off)",
        ),
    ],
};

/// `[[bridge]]`.
pub const BRIDGE: Section = Section {
    name: "bridge",
    array: true,
    help: "a learning bridge of TAP ports",
    keys: &[
        key(
            "name",
            Ty::Str("cni0"),
            Dflt::Required("the bridge's interface name, like \"cni0\""),
            "the bridge's (and its router interface's) name",
        ),
        key(
            "address",
            Ty::Addrs("[\"10.244.1.1/24\", \"fd00:10:244:1::1/64\"]"),
            Dflt::Unset("a plain L2 bridge"),
            "the gateway address on it (IPv4, IPv6, or one of each for dual-stack pods)",
        ),
        key(
            "ports",
            Ty::Strings("[\"pod-a\", \"pod-b\"]"),
            Dflt::Unset("none: pods come from the CNI plugin or `tapyard port add`"),
            "TAP devices created as its ports (a reload adds and removes them); [[bridge.port]] declares one with its addresses",
        ),
        key(
            "mac",
            Ty::Str("02:00:0a:f4:01:01"),
            Dflt::Unset("derived from the node and interface names"),
            "the gateway's MAC (needs address)",
        ),
        MTU,
        key(
            "ra",
            Ty::Bool,
            Dflt::Bool(false),
            "send IPv6 Router Advertisements (radvd's defaults) so pods learn their default router (needs an IPv6 address)",
        ),
        key(
            "fdb_max_entries",
            int(1, 1 << 24),
            Dflt::Int(8192),
            "learned MACs per bridge",
        ),
        key(
            "fdb_aging",
            secs(1, 1_000_000),
            Dflt::Int(300),
            "seconds before an idle MAC is forgotten",
        ),
        key(
            "spoof_guard",
            Ty::Bool,
            Dflt::Bool(true),
            "pin each port with known addresses (the CNI plugin's, `tapyard port add --ip`, [[bridge.port]] ips) to them and to its MAC: other source MACs and addresses, ARP and NDP for other addresses are dropped (`spoofed_*`); a reload applies a change",
        ),
    ],
};

/// `[[bridge.port]]`: a port of the `[[bridge]]` before it, with what its spoof guard allows.
pub const BRIDGE_PORT: Section = Section {
    name: "bridge.port",
    array: true,
    help: "a TAP port of the [[bridge]] above (as in its ports) with its addresses",
    keys: &[
        key(
            "name",
            Ty::Str("pod-c"),
            Dflt::Required("the TAP's name, like \"pod-c\""),
            "the TAP device created as the port",
        ),
        key(
            "ips",
            Ty::Strings("[\"10.244.1.4\", \"fd00:10:244:1::4\"]"),
            Dflt::Unset("none: no spoof guard"),
            "the addresses it may send from (either family, at most 4 of each), with spoof_guard on; a reload applies a change live",
        ),
        key(
            "mac",
            Ty::Str("02:00:0a:f4:01:04"),
            Dflt::Unset("derived from the node and port names"),
            "its TAP's MAC when tapyard creates it, the one its guard pins",
        ),
    ],
};

/// `[[uplink]]`.
pub const UPLINK: Section = Section {
    name: "uplink",
    array: true,
    help: "a router interface owning a TAP device",
    keys: &[
        key(
            "name",
            Ty::Str("eth0"),
            Dflt::Required("the interface's name, like \"eth0\""),
            "the interface's name",
        ),
        key(
            "address",
            Ty::Addrs("[\"172.18.0.2/24\", \"fd00:172:18::2/64\"]"),
            Dflt::Required("the node's address on the link, like \"172.18.0.2/24\""),
            "the node's address on the link (IPv4, IPv6, or one of each for a dual-stack node)",
        ),
        key(
            "tap",
            Ty::Str("tap-eth0"),
            Dflt::Unset("the uplink's name"),
            "the TAP device's name",
        ),
        key(
            "mac",
            Ty::Str("02:00:ac:12:00:02"),
            Dflt::Unset("derived from the node and interface names"),
            "the interface's MAC",
        ),
        MTU,
    ],
};

/// `[[host]]`: the host port, as Antrea's `antrea-gw0`.
pub const HOST: Section = Section {
    name: "host",
    array: true,
    help: "the host port: a TAP in tapyard's namespace whose kernel side is the node's own IP stack (at most one)",
    keys: &[
        key(
            "name",
            Ty::Str("tapyard0"),
            Dflt::Required("the TAP's name, like \"tapyard0\""),
            "the TAP (and its router interface)",
        ),
        key(
            "address",
            Ty::Addrs("[\"172.18.0.2\", \"fd00:172:18::2\"]"),
            Dflt::Required("the node's address, like \"172.18.0.2\" (its InternalIP, typically the uplink's)"),
            "the node's address (IPv4, IPv6, or one of each for a dual-stack node): the kernel side holds it as a /32 (/128); packets to it that no NodePort or reply translates go to the kernel",
        ),
        key(
            "gateway",
            Ty::Addrs("[\"169.254.0.1\", \"fc00::a9fe:1\"]"),
            Dflt::Unset("\"169.254.0.1\" and \"fc00::a9fe:1\", for the families of address"),
            "tapyard's side (a /32 or /128 router interface address, one per family of address): the kernel's next hop, and the source of what is masqueraded to the node",
        ),
        key(
            "routes",
            Ty::Strings("[\"0.0.0.0/0\", \"::/0\"]"),
            Dflt::Unset("none: the cluster and Service CIDRs only"),
            "more prefixes the kernel routes through it (of the families of address)",
        ),
        key(
            "mac",
            Ty::Str("02:00:a9:fe:00:01"),
            Dflt::Unset("derived from the node and interface names"),
            "tapyard's side's MAC",
        ),
        key(
            "mtu",
            int(68, 65000),
            Dflt::Int(1500),
            "the MTU of both sides",
        ),
    ],
};

/// `[[route]]`.
pub const ROUTE: Section = Section {
    name: "route",
    array: true,
    help: "a static route",
    keys: &[
        key(
            "to",
            Ty::Str("10.244.2.0/24"),
            Dflt::Required("the destination, like \"10.244.2.0/24\", \"0.0.0.0/0\" or \"::/0\""),
            "the destination prefix (IPv4 or IPv6)",
        ),
        key(
            "via",
            Ty::Str("172.18.0.3"),
            Dflt::Unset("none"),
            "the gateway, of to's family (an IPv6 link-local one needs dev)",
        ),
        key(
            "dev",
            Ty::Str("eth0"),
            Dflt::Unset("the one whose subnet holds via"),
            "the interface",
        ),
        key(
            "type",
            Ty::Choice {
                what: "route type",
                values: &["unicast", "blackhole", "unreachable"],
                aliases: &[],
            },
            Dflt::Str("unicast"),
            "blackhole drops, unreachable sends ICMP; not with via/dev",
        ),
        key(
            "metric",
            int(0, u32::MAX as i64),
            Dflt::Int(0),
            "lower wins among routes to one prefix",
        ),
    ],
};

/// `[[neighbor]]`.
pub const NEIGHBOR: Section = Section {
    name: "neighbor",
    array: true,
    help: "a permanent ARP or NDP entry (ip neigh add ... nud permanent)",
    keys: &[
        key(
            "ip",
            Ty::Str("172.18.0.1"),
            Dflt::Required("the neighbour's IPv4 or IPv6 address"),
            "the neighbour's address",
        ),
        key(
            "mac",
            Ty::Str("02:00:ac:12:00:01"),
            Dflt::Required("its MAC address, like \"02:00:00:00:00:01\""),
            "its MAC",
        ),
        key(
            "dev",
            Ty::Str("eth0"),
            Dflt::Required("the interface it is on (a bridge or an uplink)"),
            "the interface it is on",
        ),
    ],
};

/// `[[service]]`.
pub const SERVICE: Section = Section {
    name: "service",
    array: true,
    help: "a Service, as kube-proxy's iptables mode",
    keys: &[
        key(
            "name",
            Ty::Str("web"),
            Dflt::Required("the Service's name"),
            "the Service's name (as Kubernetes)",
        ),
        key(
            "cluster_ip",
            Ty::Addrs("[\"10.96.0.10\", \"fd00:10:96::10\"]"),
            Dflt::Required("the Service's virtual address"),
            "its virtual address, or one per family (dual-stack)",
        ),
        key(
            "port",
            int(1, 65535),
            Dflt::Required("the Service's port"),
            "its port on cluster_ip",
        ),
        key(
            "protocol",
            Ty::Choice {
                what: "protocol",
                values: &["tcp", "udp"],
                aliases: &[("TCP", "tcp"), ("UDP", "udp")],
            },
            Dflt::Str("tcp"),
            "its protocol",
        ),
        key(
            "node_port",
            int(1, 65535),
            Dflt::Unset("none"),
            "its port on every node address of its ClusterIPs' families",
        ),
        key(
            "endpoints",
            Ty::Strings("[\"10.244.1.2:8080\", { addr = \"10.244.2.2:8080\", ready = false, serving = true, terminating = true }]"),
            Dflt::Unset("none: connections are refused"),
            "the backends, IP:PORT or [IPv6]:PORT (ready), or a table with addr and its EndpointSlice conditions ready, serving, terminating (default true, true, false) and local (default: inside a bridge's subnet), each of a family with a ClusterIP; new connections go to the ready ones, else to those serving and terminating, separately among the local ones for a local policy (kube-proxy's CategorizeEndpoints)",
        ),
        key(
            "session_affinity",
            Ty::Choice {
                what: "session affinity",
                values: &["none", "client-ip"],
                aliases: &[("None", "none"), ("ClientIP", "client-ip")],
            },
            Dflt::Str("none"),
            "client-ip keeps a client on its endpoint",
        ),
        key(
            "session_affinity_timeout",
            secs(1, DAY),
            Dflt::Int(10_800),
            "seconds, with session_affinity = \"client-ip\"",
        ),
        key(
            "external_traffic_policy",
            Ty::Choice {
                what: "traffic policy",
                values: &["cluster", "local"],
                aliases: &[("Cluster", "cluster"), ("Local", "local")],
            },
            Dflt::Str("cluster"),
            "local: node-port traffic to local endpoints only",
        ),
        key(
            "algorithm",
            Ty::Choice {
                what: "algorithm",
                values: &["random", "maglev"],
                aliases: &[],
            },
            Dflt::Str("random"),
            "maglev: consistent hashing",
        ),
        key(
            "load_balancer_ips",
            Ty::Strings("[\"198.51.100.10\", \"2001:db8:5::10\"]"),
            Dflt::Unset("none"),
            "LoadBalancer ingress IPs (VIP mode), each of a family with a ClusterIP: served on port with external_traffic_policy, as a node port; route them to this node",
        ),
        key(
            "external_ips",
            Ty::Strings("[\"198.51.100.20\"]"),
            Dflt::Unset("none"),
            "externalIPs, as load_balancer_ips but never filtered by source ranges",
        ),
        key(
            "load_balancer_source_ranges",
            Ty::Strings("[\"203.0.113.0/24\", \"2001:db8:1::/48\"]"),
            Dflt::Unset("everyone"),
            "who may reach the load_balancer_ips, per family (a family without a range is not filtered); others are dropped (lb_source_range)",
        ),
        key(
            "internal_traffic_policy",
            Ty::Choice {
                what: "traffic policy",
                values: &["cluster", "local"],
                aliases: &[("Cluster", "cluster"), ("Local", "local")],
            },
            Dflt::Str("cluster"),
            "local: ClusterIP traffic to this node's endpoints only (none here: dropped)",
        ),
        key(
            "health_check_node_port",
            int(1, 65535),
            Dflt::Unset("none"),
            "healthCheckNodePort (with external_traffic_policy = \"local\"): HTTP 200/503 on this TCP port of the node's addresses, as kube-proxy",
        ),
    ],
};

/// `[[vxlan]]`.
pub const VXLAN: Section = Section {
    name: "vxlan",
    array: true,
    help: "a VXLAN interface, as Flannel's flannel.1 (IPv4 underlay) or flannel-v6.1 (IPv6 underlay)",
    keys: &[
        key(
            "name",
            Ty::Str("flannel.1"),
            Dflt::Required("the interface's name, like \"flannel.1\""),
            "the interface's name",
        ),
        key(
            "vni",
            int(0, (1 << 24) - 1),
            Dflt::Int(1),
            "the VXLAN network identifier",
        ),
        key(
            "port",
            int(1, 65535),
            Dflt::Int(8472),
            "the UDP port (Flannel's 8472; IANA's 4789)",
        ),
        key(
            "uplink",
            Ty::Str("eth0"),
            Dflt::Required(
                "the [[uplink]] encapsulated packets leave and arrive on, like \"eth0\"",
            ),
            "the uplink whose address (of the underlay's family) is the outer source",
        ),
        key(
            "address",
            Ty::Str("10.244.1.0/32"),
            Dflt::Required(
                "the VTEP's address, like \"10.244.1.0/32\" or \"fd00:10:244:1::/128\" (the pod subnet's network address)",
            ),
            "the interface's address; an IPv6 one makes the underlay IPv6 (Flannel's flannel-v6.1)",
        ),
        key(
            "mac",
            Ty::Str("0a:58:0a:f4:01:00"),
            Dflt::Unset("0a:58 and the four bytes of address (bytes 4 to 7 of an IPv6 one)"),
            "the VTEP MAC",
        ),
        key(
            "mtu",
            int(68, 65000),
            Dflt::Unset("the uplink's MTU minus 50 (minus 70 over IPv6)"),
            "the interface's MTU",
        ),
        key(
            "src_port_range",
            Ty::Str("32768-60999"),
            Dflt::Str("32768-60999"),
            "UDP source ports, picked by a hash of the inner flow",
        ),
    ],
};

/// `[[vxlan.peer]]`: a remote node, under the `[[vxlan]]` before it.
pub const VXLAN_PEER: Section = Section {
    name: "vxlan.peer",
    array: true,
    help: "a remote node of the [[vxlan]] above",
    keys: &[
        key(
            "node_ip",
            Ty::Str("172.18.0.3"),
            Dflt::Required("the node's underlay address, like \"172.18.0.3\" (of the family of the [[vxlan]]'s address)"),
            "the outer destination",
        ),
        key(
            "vtep_mac",
            Ty::Str("0a:58:0a:f4:02:00"),
            Dflt::Required("the node's VTEP MAC, like \"0a:58:0a:f4:02:00\""),
            "the inner destination MAC",
        ),
        key(
            "pod_cidr",
            Ty::Str("10.244.2.0/24"),
            Dflt::Required("the node's pod subnet, like \"10.244.2.0/24\" (of the family of the [[vxlan]]'s address)"),
            "routed via its first address dev <vxlan> onlink",
        ),
    ],
};

/// `[masquerade]`.
pub const MASQUERADE: Section = Section {
    name: "masquerade",
    array: false,
    help: "pod traffic leaving the cluster CIDRs takes an address (both families)",
    keys: &[key(
        "out",
        Ty::Str("eth0"),
        Dflt::Required("the interface pod traffic leaves through, like \"eth0\""),
        "the interface whose address (of the packet's family) it takes",
    )],
};

/// `[[snat]]`.
pub const SNAT: Section = Section {
    name: "snat",
    array: true,
    help: "new connections from `src` take the fixed source `to` (iptables/ip6tables SNAT), after [masquerade]; first match wins",
    keys: &[
        key(
            "src",
            Ty::Str("10.244.1.0/24"),
            Dflt::Required("the sources, an IPv4 or IPv6 prefix like \"10.244.1.0/24\""),
            "the sources it applies to",
        ),
        key(
            "to",
            Ty::Str("172.18.0.50"),
            Dflt::Required("the new source address, of src's family"),
            "the new source address",
        ),
        key(
            "out",
            Ty::Str("eth0"),
            Dflt::Unset("any interface"),
            "only connections leaving through this interface",
        ),
        key(
            "ports",
            Ty::Str("1024-65535"),
            Dflt::Unset("the original port when free, else one of its class, as iptables' SNAT without a range (below 512: 1-511, 512-1023: 600-1023, else 1024-65535)"),
            "source ports to use (the original one when free and inside)",
        ),
    ],
};

/// `[neigh]`.
pub const NEIGH: Section = Section {
    name: "neigh",
    array: false,
    help: "ARP and NDP table limits, each table (Linux sysctl names and defaults)",
    keys: &[
        key(
            "gc_thresh1",
            int(0, NEIGH_MAX as i64),
            Dflt::Lib(|| NeighConfig::default().gc_thresh1 as i64),
            "below this many entries nothing is collected",
        ),
        key(
            "gc_thresh2",
            int(1, NEIGH_MAX as i64),
            Dflt::Lib(|| NeighConfig::default().gc_thresh2 as i64),
            "soft limit",
        ),
        key(
            "gc_thresh3",
            int(1, NEIGH_MAX as i64),
            Dflt::Lib(|| NeighConfig::default().gc_thresh3 as i64),
            "hard limit",
        ),
        key(
            "unres_qlen",
            int(0, 65_535),
            Dflt::Lib(|| NeighConfig::default().unres_qlen as i64),
            "packets queued per unresolved neighbour",
        ),
        key(
            "base_reachable_time",
            secs(1, DAY),
            Dflt::Lib(|| NeighConfig::default().base_reachable_time.as_secs() as i64),
            "seconds",
        ),
    ],
};

/// `[conntrack]`: Linux's defaults, with kube-proxy's established (24 h) and close-wait (1 h)
/// timeouts and limit.
pub const CONNTRACK: Section = Section {
    name: "conntrack",
    array: false,
    help: "the connection table; changing it needs a restart",
    keys: &[
        key(
            "max_entries",
            int(1, 1 << 26),
            Dflt::Int(262_144),
            "entries (nf_conntrack_max)",
        ),
        key(
            "max_entries6",
            int(1, 1 << 26),
            Dflt::Unset("max_entries on a node with an IPv6 address, 64 on one without"),
            "entries of the IPv6 table (its own file, <state_dir>/conntrack6)",
        ),
        key(
            "tcp_established_timeout",
            secs(1, 30 * DAY),
            Dflt::Int(DAY),
            "seconds",
        ),
        key(
            "tcp_close_wait_timeout",
            secs(1, 30 * DAY),
            Dflt::Int(3_600),
            "seconds",
        ),
        key(
            "tcp_time_wait_timeout",
            secs(1, 30 * DAY),
            Dflt::Int(120),
            "also FIN_WAIT; given here, also LAST_ACK and CLOSE",
        ),
        key(
            "tcp_syn_timeout",
            secs(1, 30 * DAY),
            Dflt::Int(120),
            "SYN_SENT; given here, also SYN_RECV (default 60)",
        ),
        key(
            "udp_timeout",
            secs(1, 30 * DAY),
            Dflt::Int(30),
            "seconds, UDP seen one way",
        ),
        key(
            "udp_stream_timeout",
            secs(1, 30 * DAY),
            Dflt::Int(120),
            "seconds, UDP seen both ways",
        ),
        key("icmp_timeout", secs(1, 30 * DAY), Dflt::Int(30), "seconds"),
        key(
            "liberal",
            Ty::Bool,
            Dflt::Bool(false),
            "pick up TCP mid-stream, let invalid packets through",
        ),
        key(
            "max_per_source",
            int(0, 1 << 26),
            Dflt::Int(0),
            "entries one source address in the cluster CIDR (a pod) may hold, per family; \
             its further new connections are refused (ct_limit); a TCP connection stops \
             counting as it closes (TIME_WAIT, CLOSE), as Linux's nf_conncount; 0: no limit, as Linux",
        ),
    ],
};

/// Every section, in the order of the reference.
pub const SECTIONS: &[&Section] = &[
    &NODE,
    &BRIDGE,
    &BRIDGE_PORT,
    &UPLINK,
    &HOST,
    &ROUTE,
    &NEIGHBOR,
    &SERVICE,
    &VXLAN,
    &VXLAN_PEER,
    &MASQUERADE,
    &SNAT,
    &NEIGH,
    &CONNTRACK,
];

/// The first line of the reference block in `examples/node.toml`.
pub const REFERENCE_START: &str =
    "# ---- Key reference: every key, its default or what it means when unset, its range.";

mod reference;
pub use reference::reference;

#[cfg(test)]
mod tests;
