//! The node's configuration file: its model, a parser that reports every error with its line,
//! and the checks `tapyard check` runs.
//!
//! Parsing walks toml's spanned document ([`toml::de::DeTable`]) instead of deriving serde
//! structs, so that one pass reports *all* problems (syntax errors, unknown keys, wrong types,
//! bad values) and not only the first one serde meets. Each parsed item keeps the lines of
//! its fields ([`Lines`]) for the cross-checks that come after ([`validate`]).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tapyard::l3::route::mask;
use tapyard::MacAddr;
use toml::de::{DeTable, DeValue};
use toml::Spanned;

/// Linux's `IFNAMSIZ` less the terminating NUL: the longest interface name.
pub const MAX_IFNAME: usize = 15;

/// Where a field was found, by name; compares equal to any other (so that two configs that
/// differ only in layout compare equal).
#[derive(Clone, Debug, Default)]
pub struct Lines {
    table: usize,
    fields: Vec<(&'static str, usize)>,
}

impl Lines {
    /// The line of `field`, or of its table when the field was not given.
    pub fn of(&self, field: &str) -> usize {
        self.fields
            .iter()
            .find(|(f, _)| *f == field)
            .map_or(self.table, |(_, l)| *l)
    }
}

impl Lines {
    /// True when `field` was given in the file.
    pub fn has(&self, field: &str) -> bool {
        self.fields.iter().any(|(f, _)| *f == field)
    }
}

impl PartialEq for Lines {
    fn eq(&self, _: &Lines) -> bool {
        true
    }
}

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

/// `[node]`.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeCfg {
    /// The node's name (also names the default control socket).
    pub name: String,
    /// Every pod address in the cluster.
    pub cluster_cidr: Cidr,
    /// Worker threads; `None`: one per TAP, at most the CPU count.
    pub workers: Option<usize>,
    /// The control socket; `None`: `/run/tapyard/<name>.sock`.
    pub socket: Option<PathBuf>,
    /// Node ports Services may use (inclusive).
    pub node_port_range: (u16, u16),
    /// TAP devices with virtio-net headers and checksum/TSO offloads.
    pub offload: bool,
    /// Where each field was.
    pub lines: Lines,
}

impl NodeCfg {
    /// The control socket's path.
    pub fn socket_path(&self) -> PathBuf {
        self.socket
            .clone()
            .unwrap_or_else(|| default_socket(&self.name))
    }
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
    /// The gateway address on it; `None`: a plain L2 bridge.
    pub address: Option<Cidr>,
    /// The router interface's MAC; `None`: random per run.
    pub mac: Option<MacAddr>,
    /// The router interface's MTU.
    pub mtu: u16,
    /// TAP devices created as its ports.
    pub ports: Vec<String>,
    /// FDB entry limit.
    pub fdb_max_entries: usize,
    /// FDB aging time.
    pub fdb_aging: Duration,
    /// Where each field was (`ports.N` for the N-th port).
    pub lines: Lines,
}

/// `[[uplink]]`: a router interface owning a TAP device.
#[derive(Clone, Debug, PartialEq)]
pub struct UplinkCfg {
    /// The interface's name (and, unless `tap` says otherwise, its TAP's).
    pub name: String,
    /// The TAP device's name.
    pub tap: String,
    /// Its address.
    pub address: Cidr,
    /// Its MAC; `None`: random per run.
    pub mac: Option<MacAddr>,
    /// Its MTU.
    pub mtu: u16,
    /// Where each field was.
    pub lines: Lines,
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
    /// The destination prefix.
    pub to: Cidr,
    /// The gateway.
    pub via: Option<Ipv4Addr>,
    /// The interface (a bridge with an address, or an uplink).
    pub dev: Option<String>,
    /// The route type.
    pub kind: RouteType,
    /// Lower wins among routes to one prefix.
    pub metric: u32,
    /// Where each field was.
    pub lines: Lines,
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

/// `[[neighbor]]`: a permanent ARP entry.
#[derive(Clone, Debug, PartialEq)]
pub struct NeighborCfg {
    /// The neighbour's address.
    pub ip: Ipv4Addr,
    /// Its MAC.
    pub mac: MacAddr,
    /// The interface it is on.
    pub dev: String,
    /// Where each field was.
    pub lines: Lines,
}

/// A Service's transport protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Protocol {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
        })
    }
}

/// `session_affinity`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionAffinity {
    /// Each connection picks an endpoint.
    None,
    /// A client keeps its endpoint for `session_affinity_timeout`.
    ClientIp,
}

/// `external_traffic_policy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TrafficPolicy {
    /// Any endpoint; the client address is masqueraded.
    Cluster,
    /// Local endpoints only; the client address is kept.
    Local,
}

/// How an endpoint is picked for a new connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Algorithm {
    /// Uniformly at random (kube-proxy's iptables mode).
    Random,
    /// Maglev consistent hashing (stable under endpoint changes).
    Maglev,
}

/// `[[service]]`, complete, as the NAT will need it.
#[derive(Clone, Debug, PartialEq)]
pub struct ServiceCfg {
    /// The Service's name.
    pub name: String,
    /// Its virtual address.
    pub cluster_ip: Ipv4Addr,
    /// Its protocol.
    pub protocol: Protocol,
    /// Its port on `cluster_ip`.
    pub port: u16,
    /// Its port on every node address, if any.
    pub node_port: Option<u16>,
    /// The backends.
    pub endpoints: Vec<SocketAddrV4>,
    /// Session affinity.
    pub session_affinity: SessionAffinity,
    /// How long a client keeps its endpoint with `ClientIp` affinity.
    pub session_affinity_timeout: Duration,
    /// Which endpoints node-port traffic may reach.
    pub external_traffic_policy: TrafficPolicy,
    /// Endpoint selection.
    pub algorithm: Algorithm,
    /// Where each field was (`endpoints.N` for the N-th endpoint).
    pub lines: Lines,
}

/// `[masquerade]`.
#[derive(Clone, Debug, PartialEq)]
pub struct MasqueradeCfg {
    /// The interface whose address pod traffic leaving the cluster CIDR takes.
    pub out: String,
    /// Where each field was.
    pub lines: Lines,
}

/// `[conntrack]`: limits and timeouts of the connection table (see `node::to_ct_config` for
/// how each maps to the library's timeouts).
#[derive(Clone, Debug, PartialEq)]
pub struct ConntrackCfg {
    /// Entry limit (`nf_conntrack_max`).
    pub max_entries: usize,
    /// Established TCP connections.
    pub tcp_established_timeout: Duration,
    /// TCP in CLOSE_WAIT.
    pub tcp_close_wait_timeout: Duration,
    /// TCP in TIME_WAIT, FIN_WAIT and other closing states.
    pub tcp_time_wait_timeout: Duration,
    /// TCP being opened (SYN_SENT, SYN_RECV).
    pub tcp_syn_timeout: Duration,
    /// UDP seen one way.
    pub udp_timeout: Duration,
    /// UDP seen both ways.
    pub udp_stream_timeout: Duration,
    /// ICMP.
    pub icmp_timeout: Duration,
    /// Pick up TCP connections mid-stream (after a restart, or an idle expiry) and let
    /// packets conntrack finds invalid through instead of dropping them (the library's
    /// `CtConfig::liberal`: Linux's `nf_conntrack_tcp_loose` together with kube-proxy's
    /// `--conntrack-tcp-be-liberal`, which omits its `--ctstate INVALID -j DROP`).
    pub liberal: bool,
    /// Where each field was.
    pub lines: Lines,
}

impl Default for ConntrackCfg {
    /// Linux's defaults, with kube-proxy's established (24 h) and close-wait (1 h) timeouts
    /// and limit.
    fn default() -> Self {
        ConntrackCfg {
            max_entries: 262_144,
            tcp_established_timeout: Duration::from_secs(86_400),
            tcp_close_wait_timeout: Duration::from_secs(3_600),
            tcp_time_wait_timeout: Duration::from_secs(120),
            tcp_syn_timeout: Duration::from_secs(120),
            udp_timeout: Duration::from_secs(30),
            udp_stream_timeout: Duration::from_secs(120),
            icmp_timeout: Duration::from_secs(30),
            liberal: false,
            lines: Lines::default(),
        }
    }
}

/// `[neigh]`: the ARP table's limits (Linux's sysctl names and defaults).
#[derive(Clone, Debug, PartialEq)]
pub struct NeighCfg {
    /// Below this many entries nothing is collected.
    pub gc_thresh1: usize,
    /// Soft limit.
    pub gc_thresh2: usize,
    /// Hard limit.
    pub gc_thresh3: usize,
    /// Frames queued per unresolved neighbour.
    pub unres_qlen: usize,
    /// Base reachable time.
    pub base_reachable_time: Duration,
    /// Where each field was.
    pub lines: Lines,
}

impl Default for NeighCfg {
    fn default() -> Self {
        let d = tapyard::l3::neigh::NeighConfig::default();
        NeighCfg {
            gc_thresh1: d.gc_thresh1,
            gc_thresh2: d.gc_thresh2,
            gc_thresh3: d.gc_thresh3,
            unres_qlen: d.unres_qlen,
            base_reachable_time: d.base_reachable_time,
            lines: Lines::default(),
        }
    }
}

impl NeighCfg {
    /// The library's neighbour configuration with these limits.
    pub fn to_library(&self) -> tapyard::l3::neigh::NeighConfig {
        tapyard::l3::neigh::NeighConfig {
            gc_thresh1: self.gc_thresh1,
            gc_thresh2: self.gc_thresh2,
            gc_thresh3: self.gc_thresh3,
            unres_qlen: self.unres_qlen,
            base_reachable_time: self.base_reachable_time,
            ..Default::default()
        }
    }
}

/// A whole configuration file.
#[derive(Clone, Debug, PartialEq)]
pub struct Config {
    /// `[node]`.
    pub node: NodeCfg,
    /// `[[bridge]]`s, in file order.
    pub bridges: Vec<BridgeCfg>,
    /// `[[uplink]]`s.
    pub uplinks: Vec<UplinkCfg>,
    /// `[[route]]`s.
    pub routes: Vec<RouteCfg>,
    /// `[[neighbor]]`s.
    pub neighbors: Vec<NeighborCfg>,
    /// `[[service]]`s.
    pub services: Vec<ServiceCfg>,
    /// `[masquerade]`.
    pub masquerade: Option<MasqueradeCfg>,
    /// `[conntrack]`.
    pub conntrack: ConntrackCfg,
    /// `[neigh]`.
    pub neigh: NeighCfg,
}

/// An interface with an address: a bridge's gateway or an uplink.
#[derive(Clone, Debug, PartialEq)]
pub struct Connected<'a> {
    /// Its name.
    pub name: &'a str,
    /// Its address and prefix.
    pub address: Cidr,
}

impl Config {
    /// Every interface with an address (bridges first, then uplinks: the router's order).
    pub fn connected(&self) -> Vec<Connected<'_>> {
        self.bridges
            .iter()
            .filter_map(|b| {
                b.address.map(|a| Connected {
                    name: &b.name,
                    address: a,
                })
            })
            .chain(self.uplinks.iter().map(|u| Connected {
                name: &u.name,
                address: u.address,
            }))
            .collect()
    }

    /// The interface whose subnet holds `ip`, if any (the first, as the router's connected
    /// routes).
    pub fn connected_iface(&self, ip: Ipv4Addr) -> Option<String> {
        self.connected()
            .into_iter()
            .filter(|c| c.address.contains(ip))
            .max_by_key(|c| c.address.len)
            .map(|c| c.name.to_string())
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
            broken: HashSet::new(),
        };
        let c = p.document(doc.get_ref());
        let broken = std::mem::take(&mut p.broken);
        validate(&c, &broken, &mut diags);
        if !diags.iter().any(|d| !d.warning) {
            config = Some(c);
        }
    }
    diags.sort();
    diags.dedup();
    Checked { config, diags }
}

/// Byte offsets to 1-based line numbers.
struct LineMap {
    starts: Vec<usize>,
}

impl LineMap {
    fn new(src: &str) -> LineMap {
        let mut starts = vec![0];
        starts.extend(src.match_indices('\n').map(|(i, _)| i + 1));
        LineMap { starts }
    }
    fn line(&self, offset: usize) -> usize {
        self.starts.partition_point(|&s| s <= offset)
    }
}

type Val<'i> = Spanned<DeValue<'i>>;

struct Parser<'a> {
    lines: &'a LineMap,
    diags: &'a mut Vec<Diag>,
    /// Names of items left out because a required field was missing or bad.
    broken: HashSet<String>,
}

/// A table being read: the keys it allows and the lines of what was read.
struct Sec<'t, 'i> {
    tbl: &'t DeTable<'i>,
    ctx: String,
    lines: Lines,
    ok: bool,
}

fn type_name(v: &DeValue<'_>) -> &'static str {
    v.type_str()
}

fn show(v: &DeValue<'_>) -> String {
    match v {
        DeValue::String(s) => format!("{s:?}"),
        DeValue::Integer(i) => i.to_string(),
        DeValue::Float(f) => f.to_string(),
        DeValue::Boolean(b) => b.to_string(),
        other => format!("<{}>", type_name(other)),
    }
}

impl Parser<'_> {
    fn mark_broken(&mut self, t: &DeTable<'_>) {
        if let Some(n) = t.get("name").and_then(|v| v.get_ref().as_str()) {
            self.broken.insert(n.to_string());
        }
    }

    fn line(&self, span: Range<usize>) -> usize {
        self.lines.line(span.start)
    }

    fn err(&mut self, line: usize, msg: String) {
        self.diags.push(Diag {
            line,
            warning: false,
            msg,
        });
    }

    fn sec<'t, 'i>(
        &mut self,
        tbl: &'t DeTable<'i>,
        span: Range<usize>,
        ctx: String,
        allowed: &[&str],
    ) -> Sec<'t, 'i> {
        let mut ok = true;
        for k in tbl.keys() {
            if !allowed.contains(&k.get_ref().as_ref()) {
                ok = false;
                let line = self.line(k.span());
                self.err(
                    line,
                    format!(
                        "{ctx}: unknown field `{}` (expected one of: {})",
                        k.get_ref(),
                        allowed.join(", ")
                    ),
                );
            }
        }
        Sec {
            tbl,
            lines: Lines {
                table: self.line(span),
                fields: Vec::new(),
            },
            ctx,
            ok,
        }
    }

    fn raw<'t, 'i>(&self, s: &mut Sec<'t, 'i>, key: &'static str) -> Option<&'t Val<'i>> {
        let (k, v) = s.tbl.get_key_value(key)?;
        let line = self.line(k.span());
        s.lines.fields.push((key, line));
        Some(v)
    }

    fn missing(&mut self, s: &mut Sec<'_, '_>, key: &str, what: &str) {
        s.ok = false;
        let line = s.lines.table;
        let ctx = s.ctx.clone();
        self.err(line, format!("{ctx}: missing field `{key}` ({what})"));
    }

    fn bad(&mut self, s: &mut Sec<'_, '_>, key: &str, v: &Val<'_>, problem: &str) {
        s.ok = false;
        let line = self.line(v.span());
        let ctx = s.ctx.clone();
        self.err(
            line,
            format!("{ctx}: {key} = {} {problem}", show(v.get_ref())),
        );
    }

    fn str_of<'t>(&mut self, s: &mut Sec<'_, '_>, key: &str, v: &'t Val<'_>) -> Option<&'t str> {
        match v.get_ref() {
            DeValue::String(x) => Some(x.as_ref()),
            other => {
                let t = type_name(other);
                self.bad(s, key, v, &format!("is a {t}, expected a string"));
                None
            }
        }
    }

    /// A string field parsed by `f` (whose error says what is wrong with the value).
    fn opt_parse<T>(
        &mut self,
        s: &mut Sec<'_, '_>,
        key: &'static str,
        f: impl Fn(&str) -> Result<T, String>,
    ) -> Option<T> {
        let v = self.raw(s, key)?;
        let text = self.str_of(s, key, v)?;
        match f(text) {
            Ok(x) => Some(x),
            Err(e) => {
                self.bad(s, key, v, &e);
                None
            }
        }
    }

    fn req_parse<T>(
        &mut self,
        s: &mut Sec<'_, '_>,
        key: &'static str,
        what: &str,
        f: impl Fn(&str) -> Result<T, String>,
    ) -> Option<T> {
        if s.tbl.get(key).is_none() {
            self.missing(s, key, what);
            return None;
        }
        self.opt_parse(s, key, f)
    }

    /// An integer field within `lo..=hi`.
    fn opt_int(&mut self, s: &mut Sec<'_, '_>, key: &'static str, lo: i64, hi: i64) -> Option<i64> {
        let v = self.raw(s, key)?;
        match v.get_ref() {
            DeValue::Integer(i) => match i64::from_str_radix(i.as_str(), i.radix()) {
                Ok(n) if (lo..=hi).contains(&n) => Some(n),
                _ => {
                    self.bad(
                        s,
                        key,
                        v,
                        &format!("is out of range, expected {lo} to {hi}"),
                    );
                    None
                }
            },
            other => {
                let t = type_name(other);
                self.bad(s, key, v, &format!("is a {t}, expected an integer"));
                None
            }
        }
    }

    fn req_int(
        &mut self,
        s: &mut Sec<'_, '_>,
        key: &'static str,
        what: &str,
        lo: i64,
        hi: i64,
    ) -> Option<i64> {
        if s.tbl.get(key).is_none() {
            self.missing(s, key, what);
            return None;
        }
        self.opt_int(s, key, lo, hi)
    }

    fn opt_secs(
        &mut self,
        s: &mut Sec<'_, '_>,
        key: &'static str,
        lo: u64,
        hi: u64,
        default: Duration,
    ) -> Duration {
        self.opt_int(s, key, lo as i64, hi as i64)
            .map_or(default, |n| Duration::from_secs(n as u64))
    }

    fn opt_bool(&mut self, s: &mut Sec<'_, '_>, key: &'static str) -> Option<bool> {
        let v = self.raw(s, key)?;
        match v.get_ref() {
            DeValue::Boolean(b) => Some(*b),
            other => {
                let t = type_name(other);
                self.bad(s, key, v, &format!("is a {t}, expected true or false"));
                None
            }
        }
    }

    /// An array of strings, each parsed by `f`; each item's line is kept as `key.N`.
    fn opt_list<T>(
        &mut self,
        s: &mut Sec<'_, '_>,
        key: &'static str,
        item_keys: &'static [&'static str],
        f: impl Fn(&str) -> Result<T, String>,
    ) -> Option<Vec<T>> {
        let v = self.raw(s, key)?;
        let DeValue::Array(items) = v.get_ref() else {
            let t = type_name(v.get_ref());
            self.bad(
                s,
                key,
                v,
                &format!("is a {t}, expected an array of strings"),
            );
            return None;
        };
        let mut out = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let ik = item_keys.get(i).copied().unwrap_or(key);
            s.lines.fields.push((ik, self.line(item.span())));
            let Some(text) = self.str_of(s, key, item) else {
                continue;
            };
            match f(text) {
                Ok(x) => out.push(x),
                Err(e) => {
                    let line = self.line(item.span());
                    let ctx = s.ctx.clone();
                    s.ok = false;
                    self.err(line, format!("{ctx}: {key}[{i}] = {text:?} {e}"));
                }
            }
        }
        Some(out)
    }

    fn tables<'t, 'i>(
        &mut self,
        doc: &'t DeTable<'i>,
        key: &str,
    ) -> Vec<(&'t DeTable<'i>, Range<usize>)> {
        let Some((k, v)) = doc.get_key_value(key) else {
            return Vec::new();
        };
        match v.get_ref() {
            DeValue::Array(items) => {
                let mut out = Vec::new();
                for it in items.iter() {
                    match it.get_ref() {
                        DeValue::Table(t) => out.push((t, it.span())),
                        _ => {
                            let line = self.line(it.span());
                            self.err(
                                line,
                                format!("`{key}` must be written [[{key}]] (an array of tables)"),
                            );
                        }
                    }
                }
                out
            }
            DeValue::Table(_) => {
                let line = self.line(k.span());
                self.err(
                    line,
                    format!("`[{key}]` must be written [[{key}]] (there may be several)"),
                );
                Vec::new()
            }
            _ => {
                let line = self.line(k.span());
                self.err(line, format!("`{key}` must be written [[{key}]]"));
                Vec::new()
            }
        }
    }

    fn table<'t, 'i>(
        &mut self,
        doc: &'t DeTable<'i>,
        key: &str,
    ) -> Option<(&'t DeTable<'i>, Range<usize>)> {
        let (k, v) = doc.get_key_value(key)?;
        match v.get_ref() {
            DeValue::Table(t) => Some((t, v.span())),
            _ => {
                let line = self.line(k.span());
                self.err(line, format!("`{key}` must be a table written [{key}]"));
                None
            }
        }
    }

    /// The config as far as it could be read (items missing a required field are left out
    /// and their names, if any, go to `self.broken`); errors are in `self.diags`.
    fn document(&mut self, doc: &DeTable<'_>) -> Config {
        const TOP: &[&str] = &[
            "node",
            "bridge",
            "uplink",
            "route",
            "neighbor",
            "service",
            "masquerade",
            "conntrack",
            "neigh",
        ];
        self.sec(doc, 0..0, "top level".into(), TOP);
        let node = match self.table(doc, "node") {
            Some((t, span)) => self.node(t, span),
            None => {
                if !doc.contains_key("node") {
                    self.err(
                        1,
                        "missing table [node] (with at least name and cluster_cidr)".into(),
                    );
                }
                None
            }
        };
        let mut bridges = Vec::new();
        for (i, (t, span)) in self.tables(doc, "bridge").into_iter().enumerate() {
            match self.bridge(t, span, i) {
                Some(b) => bridges.push(b),
                None => self.mark_broken(t),
            }
        }
        let mut uplinks = Vec::new();
        for (i, (t, span)) in self.tables(doc, "uplink").into_iter().enumerate() {
            match self.uplink(t, span, i) {
                Some(b) => uplinks.push(b),
                None => self.mark_broken(t),
            }
        }
        let mut routes = Vec::new();
        for (i, (t, span)) in self.tables(doc, "route").into_iter().enumerate() {
            match self.route(t, span, i) {
                Some(b) => routes.push(b),
                None => self.mark_broken(t),
            }
        }
        let mut neighbors = Vec::new();
        for (i, (t, span)) in self.tables(doc, "neighbor").into_iter().enumerate() {
            match self.neighbor(t, span, i) {
                Some(b) => neighbors.push(b),
                None => self.mark_broken(t),
            }
        }
        let mut services = Vec::new();
        for (i, (t, span)) in self.tables(doc, "service").into_iter().enumerate() {
            match self.service(t, span, i) {
                Some(b) => services.push(b),
                None => self.mark_broken(t),
            }
        }
        let masquerade = self
            .table(doc, "masquerade")
            .and_then(|(t, span)| self.masquerade(t, span));
        let conntrack = match self.table(doc, "conntrack") {
            Some((t, span)) => self.conntrack(t, span),
            None => Some(ConntrackCfg::default()),
        };
        let neigh = match self.table(doc, "neigh") {
            Some((t, span)) => self.neigh(t, span),
            None => Some(NeighCfg::default()),
        };
        let node = node.unwrap_or_else(|| NodeCfg {
            name: String::new(),
            cluster_cidr: Cidr {
                addr: Ipv4Addr::UNSPECIFIED,
                len: 0,
            },
            workers: None,
            socket: None,
            node_port_range: (30000, 32767),
            offload: true,
            lines: Lines::default(),
        });
        let conntrack = conntrack.unwrap_or_default();
        let neigh = neigh.unwrap_or_default();
        Config {
            node,
            bridges,
            uplinks,
            routes,
            neighbors,
            services,
            masquerade,
            conntrack,
            neigh,
        }
    }

    fn node(&mut self, t: &DeTable<'_>, span: Range<usize>) -> Option<NodeCfg> {
        let mut s = self.sec(
            t,
            span,
            "[node]".into(),
            &[
                "name",
                "cluster_cidr",
                "workers",
                "socket",
                "node_port_range",
                "offload",
            ],
        );
        let name = self.req_parse(&mut s, "name", "the node's name, like \"node-a\"", |n| {
            if n.is_empty() || n.len() > 63 || n.contains('/') || n.chars().any(char::is_whitespace)
            {
                Err("is not a node name (1 to 63 bytes, no '/' or spaces)".into())
            } else {
                Ok(n.to_string())
            }
        });
        let cluster_cidr = self.req_parse(
            &mut s,
            "cluster_cidr",
            "every pod address in the cluster, like \"10.244.0.0/16\"",
            parse_prefix,
        );
        let workers = self.opt_int(&mut s, "workers", 0, 1024).map(|n| n as usize);
        if workers == Some(0) {
            let v = t.get("workers").cloned();
            if let Some(v) = v {
                self.bad(
                    &mut s,
                    "workers",
                    &v,
                    "is not allowed: at least 1 worker thread is needed",
                );
            }
        }
        let socket = self.opt_parse(&mut s, "socket", |p| {
            if p.is_empty() {
                Err("is empty, expected a path".into())
            } else {
                Ok(PathBuf::from(p))
            }
        });
        let node_port_range = self
            .opt_parse(&mut s, "node_port_range", parse_port_range)
            .unwrap_or((30000, 32767));
        let offload = self.opt_bool(&mut s, "offload").unwrap_or(true);
        let (name, cluster_cidr) = (name?, cluster_cidr?);
        Some(NodeCfg {
            name,
            cluster_cidr,
            workers,
            socket,
            node_port_range,
            offload,
            lines: s.lines,
        })
    }

    fn bridge(&mut self, t: &DeTable<'_>, span: Range<usize>, i: usize) -> Option<BridgeCfg> {
        let ctx = ctx_name("bridge", t, i);
        let mut s = self.sec(
            t,
            span,
            ctx,
            &[
                "name",
                "address",
                "mac",
                "mtu",
                "ports",
                "fdb_max_entries",
                "fdb_aging",
            ],
        );
        let name = self.req_parse(
            &mut s,
            "name",
            "the bridge's interface name, like \"cni0\"",
            parse_ifname,
        );
        let address = self.opt_parse(&mut s, "address", parse_iface_addr);
        let mac = self.opt_parse(&mut s, "mac", parse_mac);
        let mtu = self
            .opt_int(&mut s, "mtu", 68, 65000)
            .map_or(1500, |n| n as u16);
        let ports = self
            .opt_list(&mut s, "ports", PORT_KEYS, parse_ifname)
            .unwrap_or_default();
        let fdb_max_entries = self
            .opt_int(&mut s, "fdb_max_entries", 1, 1 << 24)
            .map_or(8192, |n| n as usize);
        let fdb_aging = self.opt_secs(&mut s, "fdb_aging", 1, 1_000_000, Duration::from_secs(300));
        if address.is_none() && (t.contains_key("mac") || t.contains_key("mtu")) {
            let line = s.lines.of("mac").min(s.lines.of("mtu"));
            let ctx = s.ctx.clone();
            self.err(
                line,
                format!(
                    "{ctx}: mac and mtu belong to the bridge's router interface: set `address` too"
                ),
            );
            s.ok = false;
        }
        let name = name.or_else(|| raw_name(t))?;
        Some(BridgeCfg {
            name,
            address,
            mac,
            mtu,
            ports,
            fdb_max_entries,
            fdb_aging,
            lines: s.lines,
        })
    }

    fn uplink(&mut self, t: &DeTable<'_>, span: Range<usize>, i: usize) -> Option<UplinkCfg> {
        let ctx = ctx_name("uplink", t, i);
        let mut s = self.sec(t, span, ctx, &["name", "tap", "address", "mac", "mtu"]);
        let name = self.req_parse(
            &mut s,
            "name",
            "the interface's name, like \"eth0\"",
            parse_ifname,
        );
        let tap = self.opt_parse(&mut s, "tap", parse_ifname);
        let address = self.req_parse(
            &mut s,
            "address",
            "the node's address on the link, like \"172.18.0.2/24\"",
            parse_iface_addr,
        );
        let mac = self.opt_parse(&mut s, "mac", parse_mac);
        let mtu = self
            .opt_int(&mut s, "mtu", 68, 65000)
            .map_or(1500, |n| n as u16);
        let (name, address) = (name.or_else(|| raw_name(t))?, address?);
        Some(UplinkCfg {
            tap: tap.unwrap_or_else(|| name.clone()),
            name,
            address,
            mac,
            mtu,
            lines: s.lines,
        })
    }

    fn route(&mut self, t: &DeTable<'_>, span: Range<usize>, i: usize) -> Option<RouteCfg> {
        let ctx = match t.get("to").and_then(|v| v.get_ref().as_str()) {
            Some(to) => format!("route to {to}"),
            None => format!("route #{}", i + 1),
        };
        let mut s = self.sec(t, span, ctx, &["to", "via", "dev", "type", "metric"]);
        let to = self.req_parse(
            &mut s,
            "to",
            "the destination, like \"10.244.2.0/24\" or \"0.0.0.0/0\"",
            parse_prefix,
        );
        let via = self.opt_parse(&mut s, "via", parse_ip);
        let dev = self.opt_parse(&mut s, "dev", parse_ifname);
        let kind = self.opt_parse(&mut s, "type", |k| match k {
            "blackhole" => Ok(RouteType::Blackhole),
            "unreachable" => Ok(RouteType::Unreachable),
            "unicast" => Ok(RouteType::Unicast),
            _ => Err(
                "is not a route type: expected \"blackhole\", \"unreachable\" or \"unicast\""
                    .into(),
            ),
        });
        let metric = self
            .opt_int(&mut s, "metric", 0, i64::from(u32::MAX))
            .map_or(0, |n| n as u32);
        let has_type = t.contains_key("type");
        let line = s.lines.table;
        let ctx = s.ctx.clone();
        let has_hop = t.contains_key("via") || t.contains_key("dev");
        match kind {
            Some(RouteType::Blackhole | RouteType::Unreachable) if has_hop => {
                let l = s.lines.of("type");
                self.err(l, format!("{ctx}: give either `via`/`dev` or `type = \"blackhole\"`/`\"unreachable\"`, not both"));
                s.ok = false;
            }
            None | Some(RouteType::Unicast) if !has_hop && (!has_type || kind.is_some()) => {
                self.err(line, format!("{ctx}: needs `via` (a gateway), `dev` (an interface) or `type = \"blackhole\"`/`\"unreachable\"`"));
                s.ok = false;
            }
            _ => {}
        }
        let to = to?;
        if to.addr != to.network() {
            let l = s.lines.of("to");
            self.err(
                l,
                format!(
                    "{ctx}: to = \"{to}\" has host bits set (expected \"{}/{}\")",
                    to.network(),
                    to.len
                ),
            );
            s.ok = false;
        }
        Some(RouteCfg {
            to,
            via,
            dev,
            kind: kind.unwrap_or(RouteType::Unicast),
            metric,
            lines: s.lines,
        })
    }

    fn neighbor(&mut self, t: &DeTable<'_>, span: Range<usize>, i: usize) -> Option<NeighborCfg> {
        let ctx = match t.get("ip").and_then(|v| v.get_ref().as_str()) {
            Some(ip) => format!("neighbor {ip}"),
            None => format!("neighbor #{}", i + 1),
        };
        let mut s = self.sec(t, span, ctx, &["ip", "mac", "dev"]);
        let ip = self.req_parse(&mut s, "ip", "the neighbour's IPv4 address", parse_ip);
        let mac = self.req_parse(
            &mut s,
            "mac",
            "its MAC address, like \"02:00:00:00:00:01\"",
            parse_mac,
        );
        let dev = self.req_parse(
            &mut s,
            "dev",
            "the interface it is on (a bridge or an uplink)",
            parse_ifname,
        );
        let (ip, mac, dev) = (ip?, mac?, dev?);
        Some(NeighborCfg {
            ip,
            mac,
            dev,
            lines: s.lines,
        })
    }

    fn service(&mut self, t: &DeTable<'_>, span: Range<usize>, i: usize) -> Option<ServiceCfg> {
        let ctx = ctx_name("service", t, i);
        let mut s = self.sec(
            t,
            span,
            ctx,
            &[
                "name",
                "cluster_ip",
                "protocol",
                "port",
                "node_port",
                "endpoints",
                "session_affinity",
                "session_affinity_timeout",
                "external_traffic_policy",
                "algorithm",
            ],
        );
        let name = self.req_parse(&mut s, "name", "the Service's name", |n| {
            let ok = !n.is_empty()
                && n.len() <= 63
                && n.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                && !n.starts_with('-')
                && !n.ends_with('-');
            if ok {
                Ok(n.to_string())
            } else {
                Err("is not a Service name (1 to 63 of a-z, 0-9 and '-', as Kubernetes)".into())
            }
        });
        let cluster_ip = self.req_parse(
            &mut s,
            "cluster_ip",
            "the Service's virtual address",
            parse_ip,
        );
        let protocol = self.opt_parse(&mut s, "protocol", |p| match p {
            "tcp" | "TCP" => Ok(Protocol::Tcp),
            "udp" | "UDP" => Ok(Protocol::Udp),
            _ => Err("is not a protocol: expected \"tcp\" or \"udp\"".into()),
        });
        let protocol_given = t.contains_key("protocol");
        let port = self
            .req_int(&mut s, "port", "the Service's port", 1, 65535)
            .map(|n| n as u16);
        let node_port = self
            .opt_int(&mut s, "node_port", 1, 65535)
            .map(|n| n as u16);
        let endpoints = self
            .opt_list(&mut s, "endpoints", ENDPOINT_KEYS, |e| {
                e.parse::<SocketAddrV4>()
                    .map_err(|_| "is not IP:PORT (like \"10.244.1.2:8080\")".to_string())
                    .and_then(|a| {
                        if a.port() == 0 {
                            Err("has port 0".into())
                        } else if !is_host(*a.ip()) {
                            Err("is not a unicast host address".into())
                        } else {
                            Ok(a)
                        }
                    })
            })
            .unwrap_or_default();
        let session_affinity = self
            .opt_parse(&mut s, "session_affinity", |a| match a {
                "none" | "None" => Ok(SessionAffinity::None),
                "client-ip" | "ClientIP" => Ok(SessionAffinity::ClientIp),
                _ => Err("is not a session affinity: expected \"none\" or \"client-ip\"".into()),
            })
            .unwrap_or(SessionAffinity::None);
        let session_affinity_timeout = self.opt_secs(
            &mut s,
            "session_affinity_timeout",
            1,
            86_400,
            Duration::from_secs(10_800),
        );
        let external_traffic_policy = self
            .opt_parse(&mut s, "external_traffic_policy", |a| match a {
                "cluster" | "Cluster" => Ok(TrafficPolicy::Cluster),
                "local" | "Local" => Ok(TrafficPolicy::Local),
                _ => Err("is not a traffic policy: expected \"cluster\" or \"local\"".into()),
            })
            .unwrap_or(TrafficPolicy::Cluster);
        let algorithm = self
            .opt_parse(&mut s, "algorithm", |a| match a {
                "random" => Ok(Algorithm::Random),
                "maglev" => Ok(Algorithm::Maglev),
                _ => Err("is not an algorithm: expected \"random\" or \"maglev\"".into()),
            })
            .unwrap_or(Algorithm::Random);
        let _ = protocol_given;
        let name = name.or_else(|| raw_name(t))?;
        let (cluster_ip, port) = (cluster_ip?, port?);
        Some(ServiceCfg {
            name,
            cluster_ip,
            protocol: protocol.unwrap_or(Protocol::Tcp),
            port,
            node_port,
            endpoints,
            session_affinity,
            session_affinity_timeout,
            external_traffic_policy,
            algorithm,
            lines: s.lines,
        })
    }

    fn masquerade(&mut self, t: &DeTable<'_>, span: Range<usize>) -> Option<MasqueradeCfg> {
        let mut s = self.sec(t, span, "[masquerade]".into(), &["out"]);
        let out = self.req_parse(
            &mut s,
            "out",
            "the interface pod traffic leaves through, like \"eth0\"",
            parse_ifname,
        );
        let out = out?;
        Some(MasqueradeCfg {
            out,
            lines: s.lines,
        })
    }

    fn conntrack(&mut self, t: &DeTable<'_>, span: Range<usize>) -> Option<ConntrackCfg> {
        let mut s = self.sec(
            t,
            span,
            "[conntrack]".into(),
            &[
                "max_entries",
                "tcp_established_timeout",
                "tcp_close_wait_timeout",
                "tcp_time_wait_timeout",
                "tcp_syn_timeout",
                "udp_timeout",
                "udp_stream_timeout",
                "icmp_timeout",
                "liberal",
            ],
        );
        let d = ConntrackCfg::default();
        const DAY30: u64 = 30 * 86_400;
        let c = ConntrackCfg {
            max_entries: self
                .opt_int(&mut s, "max_entries", 1, 1 << 26)
                .map_or(d.max_entries, |n| n as usize),
            tcp_established_timeout: self.opt_secs(
                &mut s,
                "tcp_established_timeout",
                1,
                DAY30,
                d.tcp_established_timeout,
            ),
            tcp_close_wait_timeout: self.opt_secs(
                &mut s,
                "tcp_close_wait_timeout",
                1,
                DAY30,
                d.tcp_close_wait_timeout,
            ),
            tcp_time_wait_timeout: self.opt_secs(
                &mut s,
                "tcp_time_wait_timeout",
                1,
                DAY30,
                d.tcp_time_wait_timeout,
            ),
            tcp_syn_timeout: self.opt_secs(&mut s, "tcp_syn_timeout", 1, DAY30, d.tcp_syn_timeout),
            udp_timeout: self.opt_secs(&mut s, "udp_timeout", 1, DAY30, d.udp_timeout),
            udp_stream_timeout: self.opt_secs(
                &mut s,
                "udp_stream_timeout",
                1,
                DAY30,
                d.udp_stream_timeout,
            ),
            icmp_timeout: self.opt_secs(&mut s, "icmp_timeout", 1, DAY30, d.icmp_timeout),
            liberal: self.opt_bool(&mut s, "liberal").unwrap_or(d.liberal),
            lines: Lines::default(),
        };
        Some(ConntrackCfg {
            lines: s.lines,
            ..c
        })
    }

    fn neigh(&mut self, t: &DeTable<'_>, span: Range<usize>) -> Option<NeighCfg> {
        let mut s = self.sec(
            t,
            span,
            "[neigh]".into(),
            &[
                "gc_thresh1",
                "gc_thresh2",
                "gc_thresh3",
                "unres_qlen",
                "base_reachable_time",
            ],
        );
        let d = NeighCfg::default();
        let limit = tapyard::l3::neigh::MAX_ENTRIES as i64;
        let c = NeighCfg {
            gc_thresh1: self
                .opt_int(&mut s, "gc_thresh1", 0, limit)
                .map_or(d.gc_thresh1, |n| n as usize),
            gc_thresh2: self
                .opt_int(&mut s, "gc_thresh2", 1, limit)
                .map_or(d.gc_thresh2, |n| n as usize),
            gc_thresh3: self
                .opt_int(&mut s, "gc_thresh3", 1, limit)
                .map_or(d.gc_thresh3, |n| n as usize),
            unres_qlen: self
                .opt_int(&mut s, "unres_qlen", 0, 65_535)
                .map_or(d.unres_qlen, |n| n as usize),
            base_reachable_time: self.opt_secs(
                &mut s,
                "base_reachable_time",
                1,
                86_400,
                d.base_reachable_time,
            ),
            lines: Lines::default(),
        };
        if s.ok {
            if let Err(e) = c.to_library().validate() {
                let line = s.lines.table;
                self.err(line, format!("[neigh]: {e}"));
                s.ok = false;
            }
        }
        Some(NeighCfg {
            lines: s.lines,
            ..c
        })
    }
}

const PORT_KEYS: &[&str] = &[
    "ports.0", "ports.1", "ports.2", "ports.3", "ports.4", "ports.5", "ports.6", "ports.7",
    "ports.8", "ports.9", "ports.10", "ports.11", "ports.12", "ports.13", "ports.14", "ports.15",
];
const ENDPOINT_KEYS: &[&str] = &[
    "endpoints.0",
    "endpoints.1",
    "endpoints.2",
    "endpoints.3",
    "endpoints.4",
    "endpoints.5",
    "endpoints.6",
    "endpoints.7",
    "endpoints.8",
    "endpoints.9",
    "endpoints.10",
    "endpoints.11",
    "endpoints.12",
    "endpoints.13",
    "endpoints.14",
    "endpoints.15",
];

/// The `name` of a table as written, even when it is not a valid name (so that the item is
/// still cross-checked; the name's own error is reported).
fn raw_name(t: &DeTable<'_>) -> Option<String> {
    t.get("name")
        .and_then(|v| v.get_ref().as_str())
        .filter(|n| !n.is_empty())
        .map(str::to_string)
}

/// `kind "name"`, or `kind #N` when the name is missing.
fn ctx_name(kind: &str, t: &DeTable<'_>, i: usize) -> String {
    match t.get("name").and_then(|v| v.get_ref().as_str()) {
        Some(n) => format!("{kind} {n:?}"),
        None => format!("{kind} #{}", i + 1),
    }
}

fn parse_ifname(n: &str) -> Result<String, String> {
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

fn parse_ip(s: &str) -> Result<Ipv4Addr, String> {
    s.parse()
        .map_err(|_| "is not an IPv4 address (expected like \"10.244.1.2\")".to_string())
}

fn is_host(ip: Ipv4Addr) -> bool {
    !(ip.is_unspecified() || ip.is_multicast() || ip.is_broadcast() || ip.is_loopback())
}

fn parse_prefix(s: &str) -> Result<Cidr, String> {
    s.parse::<Cidr>()
}

fn parse_iface_addr(s: &str) -> Result<Cidr, String> {
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

fn parse_mac(s: &str) -> Result<MacAddr, String> {
    let m: MacAddr = s
        .parse()
        .map_err(|_| "is not a MAC address (expected like \"02:00:00:00:00:01\")".to_string())?;
    if !m.is_station() {
        return Err("is not a unicast, non-zero MAC address".into());
    }
    Ok(m)
}

fn parse_port_range(s: &str) -> Result<(u16, u16), String> {
    let bad = || "is not a port range (expected like \"30000-32767\")".to_string();
    let (a, b) = s.split_once('-').ok_or_else(bad)?;
    let a: u16 = a.trim().parse().map_err(|_| bad())?;
    let b: u16 = b.trim().parse().map_err(|_| bad())?;
    if a == 0 || a > b {
        return Err("is not a port range: expected LOW-HIGH with 1 <= LOW <= HIGH <= 65535".into());
    }
    Ok((a, b))
}

/// The cross-checks between sections, on a parsed configuration.
/// `broken` holds names of items that could not be read (references to them are not
/// reported again).
pub fn validate(c: &Config, broken: &HashSet<String>, diags: &mut Vec<Diag>) {
    let mut err = |line: usize, msg: String| {
        diags.push(Diag {
            line,
            warning: false,
            msg,
        })
    };
    let mut warnings = Vec::new();
    // Interface names: bridges, their ports and uplinks share one namespace (datapath ports).
    let mut names: HashMap<String, (usize, String)> = HashMap::new();
    let mut taps: HashMap<String, (usize, String)> = HashMap::new();
    fn claim(
        map: &mut HashMap<String, (usize, String)>,
        n: &str,
        line: usize,
        what: String,
        err: &mut dyn FnMut(usize, String),
    ) {
        match map.get(n) {
            Some((l, first)) => err(
                line,
                format!("{what}: name {n:?} is already used by {first} (line {l}); names must be unique"),
            ),
            None => {
                map.insert(n.to_string(), (line, what));
            }
        }
    }
    for b in &c.bridges {
        claim(
            &mut names,
            &b.name,
            b.lines.of("name"),
            format!("bridge {:?}", b.name),
            &mut err,
        );
    }
    for (bi, b) in c.bridges.iter().enumerate() {
        for (i, p) in b.ports.iter().enumerate() {
            let key = PORT_KEYS.get(i).copied().unwrap_or("ports");
            let line = b.lines.of(key);
            if let Some(first) = c.bridges[..=bi].iter().find_map(|o| {
                let upto = if std::ptr::eq(o, b) { i } else { o.ports.len() };
                o.ports[..upto].contains(p).then(|| o.name.clone())
            }) {
                err(line, format!("bridge {:?}: port {p:?} is listed twice (already a port of bridge {first:?}); a TAP can be on one bridge once", b.name));
                continue;
            }
            claim(
                &mut names,
                p,
                line,
                format!("port {p:?} of bridge {:?}", b.name),
                &mut err,
            );
            claim(&mut taps, p, line, format!("port {p:?}"), &mut err);
        }
    }
    for u in &c.uplinks {
        claim(
            &mut names,
            &u.name,
            u.lines.of("name"),
            format!("uplink {:?}", u.name),
            &mut err,
        );
        if u.tap != u.name {
            if let Some((l, first)) = names.get(u.tap.as_str()) {
                err(
                    u.lines.of("tap"),
                    format!(
                        "uplink {:?}: tap {:?} is already used by {first} (line {l})",
                        u.name, u.tap
                    ),
                );
            }
        }
        claim(
            &mut taps,
            &u.tap,
            u.lines.of("tap"),
            format!("uplink {:?}", u.name),
            &mut err,
        );
    }
    if c.bridges.iter().all(|b| b.ports.is_empty()) && c.uplinks.is_empty() {
        err(
            1,
            "no TAP device to create: list `ports` in a [[bridge]] or add an [[uplink]]".into(),
        );
    }
    // Subnets of interfaces must not overlap.
    let conn: Vec<(&str, Cidr, usize)> = c
        .bridges
        .iter()
        .filter_map(|b| {
            b.address
                .map(|a| (b.name.as_str(), a, b.lines.of("address")))
        })
        .chain(
            c.uplinks
                .iter()
                .map(|u| (u.name.as_str(), u.address, u.lines.of("address"))),
        )
        .collect();
    for (i, (n, a, line)) in conn.iter().enumerate() {
        for (m, b, l2) in &conn[..i] {
            if a.overlaps(b) {
                let kind = if c.bridges.iter().any(|x| x.name == *n) {
                    "bridge"
                } else {
                    "uplink"
                };
                err(*line, format!("{kind} {n:?}: address = \"{a}\" overlaps {m}'s subnet {}/{} (line {l2}); interface subnets must not overlap", b.network(), b.len));
            }
        }
        if !c.node.cluster_cidr.covers(a) && c.bridges.iter().any(|b| b.name == *n) {
            warnings.push(Diag {
                line: *line,
                warning: true,
                msg: format!(
                    "bridge {n:?}: address = \"{a}\" is outside node.cluster_cidr {} (pods on it are not cluster pods)",
                    c.node.cluster_cidr
                ),
            });
        }
    }
    let iface_of = |name: &str| conn.iter().find(|(n, _, _)| *n == name);
    let known = |name: &str| iface_of(name).is_some() || broken.contains(name);
    let describe_iface = |name: &str| -> String {
        if c.bridges.iter().any(|b| b.name == name) {
            format!("bridge {name:?} has no address")
        } else {
            format!("no bridge or uplink is named {name:?}")
        }
    };
    // Routes.
    let mut seen_routes: HashMap<(Cidr, u32), usize> = HashMap::new();
    for r in &c.routes {
        let ctx = format!("route to {}", r.to);
        if let Some(first) = seen_routes.insert((r.to, r.metric), r.lines.of("to")) {
            err(r.lines.of("to"), format!("{ctx}: a route to {} with metric {} is already given (line {first}); give it another metric", r.to, r.metric));
        }
        if let Some(d) = &r.dev {
            if !known(d) {
                err(
                    r.lines.of("dev"),
                    format!(
                        "{ctx}: dev = {d:?}: {} (expected a bridge with an address or an uplink)",
                        describe_iface(d)
                    ),
                );
            }
        }
        if let Some(gw) = r.via {
            let on = match &r.dev {
                Some(d) => iface_of(d).is_none_or(|(_, a, _)| a.contains(gw)),
                None => conn.iter().any(|(_, a, _)| a.contains(gw)),
            };
            if !on {
                let subnets: Vec<String> = conn
                    .iter()
                    .map(|(n, a, _)| format!("{n} {}/{}", a.network(), a.len))
                    .collect();
                err(
                    r.lines.of("via"),
                    format!(
                        "{ctx}: via = \"{gw}\" is not on a connected subnet{} (connected: {})",
                        r.dev
                            .as_ref()
                            .map(|d| format!(" of {d}"))
                            .unwrap_or_default(),
                        if subnets.is_empty() {
                            "none".into()
                        } else {
                            subnets.join(", ")
                        }
                    ),
                );
            } else if conn.iter().any(|(_, a, _)| a.addr == gw) {
                err(
                    r.lines.of("via"),
                    format!("{ctx}: via = \"{gw}\" is this node's own address"),
                );
            }
        }
    }
    // Static neighbours.
    let mut seen_neigh: HashMap<(&str, Ipv4Addr), usize> = HashMap::new();
    for n in &c.neighbors {
        let ctx = format!("neighbor {}", n.ip);
        match iface_of(&n.dev) {
            None if broken.contains(&n.dev) => {}
            None => err(
                n.lines.of("dev"),
                format!(
                    "{ctx}: dev = {:?}: {} (expected a bridge with an address or an uplink)",
                    n.dev,
                    describe_iface(&n.dev)
                ),
            ),
            Some((_, a, _)) => {
                if !a.contains(n.ip) {
                    err(
                        n.lines.of("ip"),
                        format!(
                            "{ctx}: ip = \"{}\" is not in {}'s subnet {}/{}",
                            n.ip,
                            n.dev,
                            a.network(),
                            a.len
                        ),
                    );
                } else if a.addr == n.ip {
                    err(
                        n.lines.of("ip"),
                        format!("{ctx}: ip = \"{}\" is {}'s own address", n.ip, n.dev),
                    );
                }
            }
        }
        if let Some(first) = seen_neigh.insert((n.dev.as_str(), n.ip), n.lines.of("ip")) {
            err(
                n.lines.of("ip"),
                format!("{ctx}: given twice on {} (first on line {first})", n.dev),
            );
        }
    }
    // Services.
    let routed = |ip: Ipv4Addr| -> bool {
        conn.iter().any(|(_, a, _)| a.contains(ip))
            || c.routes
                .iter()
                .any(|r| r.kind == RouteType::Unicast && r.to.contains(ip))
    };
    let mut svc_names: HashMap<&str, usize> = HashMap::new();
    let mut frontends: HashMap<(Ipv4Addr, u16, Protocol), (String, usize)> = HashMap::new();
    let mut node_ports: HashMap<(u16, Protocol), (String, usize)> = HashMap::new();
    let (lo, hi) = c.node.node_port_range;
    for s in &c.services {
        let ctx = format!("service {:?}", s.name);
        if let Some(first) = svc_names.insert(&s.name, s.lines.of("name")) {
            err(
                s.lines.of("name"),
                format!(
                    "{ctx}: name {:?} is already used by the service on line {first}",
                    s.name
                ),
            );
        }
        if let Some((n, _, _)) = conn.iter().find(|(_, a, _)| a.contains(s.cluster_ip)) {
            err(s.lines.of("cluster_ip"), format!("{ctx}: cluster_ip = \"{}\" is inside {n}'s connected subnet; a Service address must not belong to a link", s.cluster_ip));
        } else if !is_host(s.cluster_ip) {
            err(
                s.lines.of("cluster_ip"),
                format!(
                    "{ctx}: cluster_ip = \"{}\" is not a unicast address",
                    s.cluster_ip
                ),
            );
        } else if c.node.cluster_cidr.contains(s.cluster_ip) {
            err(
                s.lines.of("cluster_ip"),
                format!(
                    "{ctx}: cluster_ip = \"{}\" is inside node.cluster_cidr {} (pod addresses)",
                    s.cluster_ip, c.node.cluster_cidr
                ),
            );
        }
        if let Some((first, l)) = frontends.insert(
            (s.cluster_ip, s.port, s.protocol),
            (s.name.clone(), s.lines.of("port")),
        ) {
            err(
                s.lines.of("port"),
                format!(
                    "{ctx}: {}:{}/{} is already service {first:?}'s (line {l})",
                    s.cluster_ip, s.port, s.protocol
                ),
            );
        }
        if let Some(np) = s.node_port {
            if !(lo..=hi).contains(&np) {
                err(s.lines.of("node_port"), format!("{ctx}: node_port = {np} is outside {lo}-{hi} (set node.node_port_range to allow it)"));
            }
            if let Some((first, l)) =
                node_ports.insert((np, s.protocol), (s.name.clone(), s.lines.of("node_port")))
            {
                err(
                    s.lines.of("node_port"),
                    format!(
                        "{ctx}: node_port = {np}/{} is already service {first:?}'s (line {l})",
                        s.protocol
                    ),
                );
            }
        }
        let mut seen = HashSet::new();
        for (i, e) in s.endpoints.iter().enumerate() {
            let line = s
                .lines
                .of(ENDPOINT_KEYS.get(i).copied().unwrap_or("endpoints"));
            if !seen.insert(*e) {
                err(line, format!("{ctx}: endpoint {e} is listed twice"));
            }
            if !routed(*e.ip()) {
                err(line, format!("{ctx}: endpoint {e} is outside every connected subnet and route (no way to reach it)"));
            } else if conn.iter().any(|(_, a, _)| a.addr == *e.ip()) {
                err(
                    line,
                    format!(
                        "{ctx}: endpoint {e} is this node's own address (the node has no sockets)"
                    ),
                );
            }
        }
        if s.session_affinity == SessionAffinity::None && s.lines.has("session_affinity_timeout") {
            warnings.push(Diag {
                line: s.lines.of("session_affinity_timeout"),
                warning: true,
                msg: format!("{ctx}: session_affinity_timeout has no effect without session_affinity = \"client-ip\""),
            });
        }
        let local = |ip: Ipv4Addr| {
            c.bridges
                .iter()
                .any(|b| b.address.is_some_and(|a| a.contains(ip)))
        };
        if s.external_traffic_policy == TrafficPolicy::Local
            && s.node_port.is_some()
            && !s.endpoints.is_empty()
            && !s.endpoints.iter().any(|e| local(*e.ip()))
        {
            warnings.push(Diag {
                line: s.lines.of("external_traffic_policy"),
                warning: true,
                msg: format!("{ctx}: external_traffic_policy = \"local\" but no endpoint is on this node's bridges: node-port traffic to this node will be dropped"),
            });
        }
        if s.endpoints.is_empty() {
            warnings.push(Diag {
                line: s.lines.of("name"),
                warning: true,
                msg: format!("{ctx}: no endpoints: connections to it will be refused"),
            });
        }
    }
    // Masquerade.
    if let Some(m) = &c.masquerade {
        if !known(&m.out) {
            err(
                m.lines.of("out"),
                format!(
                    "[masquerade]: out = {:?}: {} (expected an uplink or a bridge with an address)",
                    m.out,
                    describe_iface(&m.out)
                ),
            );
        }
    }
    diags.extend(warnings);
}

/// A count of what a valid config holds, for `check`'s summary.
pub fn summary(c: &Config) -> String {
    let ports: usize = c.bridges.iter().map(|b| b.ports.len()).sum();
    let mut parts: BTreeMap<usize, String> = BTreeMap::new();
    let plural = |n: usize, w: &str| format!("{n} {w}{}", if n == 1 { "" } else { "s" });
    parts.insert(0, plural(c.bridges.len(), "bridge"));
    parts.insert(1, plural(ports, "port"));
    parts.insert(2, plural(c.uplinks.len(), "uplink"));
    parts.insert(3, plural(c.routes.len(), "route"));
    parts.insert(4, plural(c.neighbors.len(), "static neighbour"));
    parts.insert(5, plural(c.services.len(), "service"));
    format!(
        "node {:?}: {}",
        c.node.name,
        parts.into_values().collect::<Vec<_>>().join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = include_str!("../../examples/node.toml");

    fn errors(src: &str) -> Vec<String> {
        check_str(src)
            .diags
            .iter()
            .filter(|d| !d.warning)
            .map(|d| d.render("f"))
            .collect()
    }

    #[test]
    fn example_parses_into_the_model() {
        let ch = check_str(EXAMPLE);
        assert_eq!(ch.errors().count(), 0, "{:?}", ch.diags);
        let c = ch.config.unwrap();
        assert_eq!(c.node.name, "node-a");
        assert_eq!(c.node.cluster_cidr.to_string(), "10.244.0.0/16");
        assert_eq!(c.node.node_port_range, (30000, 32767));
        assert_eq!(
            c.node.socket_path(),
            PathBuf::from("/run/tapyard/node-a.sock")
        );
        assert_eq!(c.bridges[0].ports, ["pod-a", "pod-b"]);
        assert_eq!(c.bridges[0].address.unwrap().to_string(), "10.244.1.1/24");
        assert_eq!(c.uplinks[0].tap, "eth0");
        assert_eq!(c.routes.len(), 2);
        assert_eq!(c.routes[1].to.len, 0);
        let web = &c.services[0];
        assert_eq!(web.protocol, Protocol::Tcp);
        assert_eq!(web.node_port, Some(30080));
        assert_eq!(web.endpoints.len(), 2);
        assert_eq!(c.services[1].protocol, Protocol::Udp);
        assert_eq!(c.services[1].session_affinity, SessionAffinity::None);
        assert_eq!(c.masquerade.as_ref().unwrap().out, "eth0");
        assert_eq!(
            c.connected_iface("172.18.0.3".parse().unwrap()).as_deref(),
            Some("eth0")
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
