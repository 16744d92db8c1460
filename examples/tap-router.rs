//! `tap-router`: a user-space node with bridges and an IPv4 router on TAP devices, until
//! SIGINT or SIGTERM.
//!
//! ```text
//! cargo run --release --example tap-router -- [OPTIONS]
//!   --bridge NAME[=ADDR/LEN]     a bridge; with an address, also a router interface NAME on it
//!                                (the pods' gateway, like cni0). Repeatable.
//!   --port BRIDGE:TAP            a TAP device as a port of BRIDGE. Repeatable.
//!   --uplink NAME=ADDR/LEN:TAP   a router interface NAME without a bridge, owning the TAP device
//!                                (an uplink, like a node's eth0). Repeatable.
//!   --route DST=NEXTHOP[,metric=N]
//!                                DST is A.B.C.D/LEN or `default`; NEXTHOP is one of
//!                                  via:GW[@IFACE]   through gateway GW (the interface is the one
//!                                                   whose subnet holds GW, unless given)
//!                                  dev:IFACE        on-link through IFACE
//!                                  blackhole        dropped silently (counted as `blackhole`)
//!                                  unreachable      dropped with ICMP host unreachable
//!                                Repeatable.
//!   --mac IFACE=MAC              the MAC of router interface IFACE (default: a random locally
//!                                administered unicast MAC per interface and run)
//!   --mtu IFACE=N                the MTU of router interface IFACE (default 1500)
//!   --fdb-max N                  FDB entry limit per bridge (default 8192)
//!   --aging SECS                 FDB aging time in seconds (default 300)
//!   --workers N                  worker threads (default: one per TAP, at most the CPU count)
//!   --stats-every S              print counters to stderr every S seconds (default: only at exit)
//!   --no-offload                 plain TAPs: no virtio-net header, no checksum/TSO offload
//!   --io MODE                    auto (default: io_uring where the kernel offers it), plain or
//!                                uring (see tapyard::runtime::IoMode)
//!   --busy-poll-us N             busy polling (as tap-bridge's; default 0)
//!   --cluster-cidr CIDR          every pod address in the cluster (kube-proxy's --cluster-cidr):
//!                                Service traffic from outside it is masqueraded
//!   --service NAME=VIP:PORT/PROTO=EP:PORT[,EP:PORT...][;nodeport=N][;affinity][;maglev]
//!                                a Service (PROTO tcp or udp): VIP:PORT, and with nodeport=N
//!                                also any router interface address:N, DNAT'd to one of the
//!                                endpoints (all on this node; none: connections are rejected),
//!                                chosen at random, by client IP for 10800 s with `affinity`
//!                                (sessionAffinity: ClientIP), by Maglev hashing with `maglev`.
//!                                Repeatable.
//!   --masquerade IFACE[=SRC_CIDR]
//!                                masquerade new connections leaving through router interface
//!                                IFACE from SRC_CIDR (default: the cluster CIDR) to anywhere
//!                                but the cluster CIDR (CNI ipMasq). Repeatable.
//! ```
//!
//! Any of the last three turns on connection tracking and NAT (see `tapyard::nat::netfilter`):
//! kube-proxy's iptables rules (ClusterIP and NodePort DNAT, KUBE-MARK-MASQ, hairpin) for the
//! Services given.
//!
//! For example, a node with pods on cni0 and a route to another node's pod CIDR:
//!
//! ```text
//! tap-router --bridge cni0=10.244.1.1/24 --port cni0:tapA --port cni0:tapB \
//!     --uplink eth0=172.18.0.2/24:tapU --route 10.244.2.0/24=via:172.18.0.3 \
//!     --route 10.244.9.0/24=blackhole --route 10.244.8.0/24=unreachable
//! ```
//!
//! and with a Service of two pods, a NodePort, and pod traffic to the outside masqueraded:
//!
//! ```text
//! tap-router --bridge cni0=10.244.1.1/24 --port cni0:tapA --port cni0:tapB --port cni0:tapC \
//!     --uplink eth0=172.18.0.2/24:tapU --route default=via:172.18.0.1 \
//!     --cluster-cidr 10.244.0.0/16 --masquerade eth0 \
//!     --service 'web=10.96.0.10:80/tcp=10.244.1.3:8080,10.244.1.4:8080;nodeport=30080'
//! ```
//!
//! The TAP devices are created (or attached to when they exist); move them into namespaces with
//! `ip link set <TAP> netns <ns>` at any time, and give each pod a default route via its
//! bridge's address. In the datapath a router interface on a bridge is a virtual port of that
//! bridge named after the interface, and an uplink's port is named after the interface (not
//! the TAP), so counters show `eth0` for the TAP given to `--uplink eth0=...:tapU`.
//!
//! Exits 0 after a signal, printing per-port counters, drops by reason, the router's event
//! counters, the routes (as `ip route`), the neighbours (as `ip neigh`) and the FDB, and with
//! NAT the NAT and conntrack counters, the connections by state and the Services; exits 2
//! with a one-line error naming the argument for a bad argument, a route the router refuses or
//! a TAP that cannot be opened.
#![allow(
    clippy::cast_possible_truncation,
    reason = "example set-up: small loop counters and random draws narrowed into addresses, ports and ids"
)]

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::net::{Ipv4Addr, SocketAddrV4};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tapyard::l3::IfaceConfig;
use tapyard::l3::{mask, IfaceId, NextHop, Route, RouteProto};
use tapyard::nat::{Endpoint, LbAlgo, ServiceSpec};
use tapyard::nat::{MasqueradeRule, NatConfig, NatRules, Prefix};
use tapyard::port::{Port, TapPort};
use tapyard::runtime::{IoMode, Runtime, RuntimeConfig};
use tapyard::stats::CounterSet;
use tapyard::wire::family::IpProto;
use tapyard::{BridgeConfig, Datapath, MacAddr, PortId};

/// `--bridge NAME[=ADDR/LEN]`.
struct BridgeArg {
    name: String,
    gateway: Option<(Ipv4Addr, u8)>,
}

/// `--uplink NAME=ADDR/LEN:TAP`.
struct UplinkArg {
    name: String,
    addr: (Ipv4Addr, u8),
    tap: String,
}

/// Where a `--route` sends packets, before interface names are resolved.
enum Hop {
    Via(Ipv4Addr, Option<String>),
    Dev(String),
    Blackhole,
    Unreachable,
}

/// `--route DST=NEXTHOP[,metric=N]`, with the argument kept for error messages.
struct RouteArg {
    text: String,
    prefix: Ipv4Addr,
    len: u8,
    hop: Hop,
    metric: u32,
}

/// `--service NAME=VIP:PORT/PROTO=EP:PORT[,EP:PORT...][;nodeport=N][;affinity][;maglev]`,
/// with the argument kept for error messages.
struct ServiceArg {
    text: String,
    spec: ServiceSpec,
}

/// `--masquerade IFACE[=SRC_CIDR]`.
struct MasqArg {
    iface: String,
    src: Option<(Ipv4Addr, u8)>,
}

struct Args {
    bridges: Vec<BridgeArg>,
    ports: Vec<(String, String)>,
    uplinks: Vec<UplinkArg>,
    routes: Vec<RouteArg>,
    macs: Vec<(String, MacAddr)>,
    mtus: Vec<(String, u16)>,
    fdb_max: usize,
    aging: u64,
    workers: Option<usize>,
    stats_every: Option<u64>,
    offload: bool,
    io: IoMode,
    busy_poll_us: u64,
    cluster_cidr: Option<(Ipv4Addr, u8)>,
    services: Vec<ServiceArg>,
    masquerade: Vec<MasqArg>,
}

fn usage() -> &'static str {
    "usage: tap-router --bridge NAME[=ADDR/LEN]... --port BRIDGE:TAP... \
     [--uplink NAME=ADDR/LEN:TAP]... [--route DST=via:GW[@IFACE]|dev:IFACE|blackhole|unreachable[,metric=N]]... \
     [--mac IFACE=MAC]... [--mtu IFACE=N]... [--fdb-max N] [--aging SECS] [--workers N] \
     [--stats-every SECS] [--no-offload] [--io auto|plain|uring] [--busy-poll-us N] [--cluster-cidr CIDR] \
     [--service NAME=VIP:PORT/tcp|udp=EP:PORT[,EP:PORT...][;nodeport=N][;affinity][;maglev]]... \
     [--masquerade IFACE[=SRC_CIDR]]..."
}

fn value(flag: &str, v: Option<String>) -> Result<String, String> {
    v.ok_or_else(|| format!("{flag} needs a value"))
}

fn parse_num<T: std::str::FromStr>(flag: &str, v: Option<String>) -> Result<T, String> {
    let v = value(flag, v)?;
    v.parse()
        .map_err(|_| format!("{flag}: {v:?} is not a valid number"))
}

/// `A.B.C.D/LEN`.
fn parse_cidr(flag: &str, whole: &str, s: &str) -> Result<(Ipv4Addr, u8), String> {
    let (a, l) = s
        .split_once('/')
        .ok_or_else(|| format!("{flag} {whole:?}: {s:?} is not ADDRESS/LENGTH"))?;
    let addr: Ipv4Addr = a
        .parse()
        .map_err(|_| format!("{flag} {whole:?}: {a:?} is not an IPv4 address"))?;
    let len: u8 = l
        .parse()
        .ok()
        .filter(|l| *l <= 32)
        .ok_or_else(|| format!("{flag} {whole:?}: prefix length {l:?} is not 0 to 32"))?;
    Ok((addr, len))
}

fn parse_bridge(s: &str) -> Result<BridgeArg, String> {
    let (name, gateway) = match s.split_once('=') {
        Some((n, a)) => (n, Some(parse_cidr("--bridge", s, a)?)),
        None => (s, None),
    };
    if name.is_empty() {
        return Err(format!("--bridge {s:?}: empty bridge name"));
    }
    Ok(BridgeArg {
        name: name.to_string(),
        gateway,
    })
}

fn parse_port(s: &str) -> Result<(String, String), String> {
    match s.split_once(':') {
        Some((b, t)) if !b.is_empty() && !t.is_empty() => Ok((b.to_string(), t.to_string())),
        _ => Err(format!("--port {s:?}: expected BRIDGE:TAP")),
    }
}

fn parse_uplink(s: &str) -> Result<UplinkArg, String> {
    let bad = || format!("--uplink {s:?}: expected NAME=ADDR/LEN:TAP");
    let (name, rest) = s.split_once('=').ok_or_else(bad)?;
    let (cidr, tap) = rest.split_once(':').ok_or_else(bad)?;
    if name.is_empty() || tap.is_empty() {
        return Err(bad());
    }
    Ok(UplinkArg {
        name: name.to_string(),
        addr: parse_cidr("--uplink", s, cidr)?,
        tap: tap.to_string(),
    })
}

fn parse_route(s: &str) -> Result<RouteArg, String> {
    let (dst, rest) = s
        .split_once('=')
        .ok_or_else(|| format!("--route {s:?}: expected DST=NEXTHOP"))?;
    let (prefix, len) = if dst == "default" {
        (Ipv4Addr::UNSPECIFIED, 0)
    } else {
        parse_cidr("--route", s, dst)?
    };
    let mut parts = rest.split(',');
    let hop = parts.next().unwrap_or("");
    let hop = if let Some(gw) = hop.strip_prefix("via:") {
        let (gw, dev) = match gw.split_once('@') {
            Some((g, d)) => (g, Some(d.to_string())),
            None => (gw, None),
        };
        let gw: Ipv4Addr = gw
            .parse()
            .map_err(|_| format!("--route {s:?}: gateway {gw:?} is not an IPv4 address"))?;
        Hop::Via(gw, dev)
    } else if let Some(dev) = hop.strip_prefix("dev:") {
        Hop::Dev(dev.to_string())
    } else if hop == "blackhole" {
        Hop::Blackhole
    } else if hop == "unreachable" {
        Hop::Unreachable
    } else {
        return Err(format!(
            "--route {s:?}: next hop {hop:?} is not via:GW[@IFACE], dev:IFACE, blackhole or unreachable"
        ));
    };
    let mut metric = 0;
    for p in parts {
        metric = p
            .strip_prefix("metric=")
            .and_then(|m| m.parse().ok())
            .ok_or_else(|| format!("--route {s:?}: {p:?} is not metric=N"))?;
    }
    Ok(RouteArg {
        text: s.to_string(),
        prefix,
        len,
        hop,
        metric,
    })
}

fn parse_mac(s: &str) -> Result<(String, MacAddr), String> {
    let (n, m) = s
        .split_once('=')
        .ok_or_else(|| format!("--mac {s:?}: expected IFACE=MAC"))?;
    let mac: MacAddr = m
        .parse()
        .map_err(|_| format!("--mac {s:?}: {m:?} is not a MAC address"))?;
    Ok((n.to_string(), mac))
}

fn parse_mtu(s: &str) -> Result<(String, u16), String> {
    let (n, m) = s
        .split_once('=')
        .ok_or_else(|| format!("--mtu {s:?}: expected IFACE=N"))?;
    let mtu = m
        .parse()
        .map_err(|_| format!("--mtu {s:?}: {m:?} is not a valid MTU"))?;
    Ok((n.to_string(), mtu))
}

/// A CIDR whose host bits must be clear.
fn parse_net(flag: &str, whole: &str, s: &str) -> Result<(Ipv4Addr, u8), String> {
    let (addr, len) = parse_cidr(flag, whole, s)?;
    if mask(addr, len) != addr {
        return Err(format!(
            "{flag} {whole:?}: {addr}/{len} has host bits set (expected {}/{len})",
            mask(addr, len)
        ));
    }
    Ok((addr, len))
}

/// `ADDR:PORT` with a nonzero port.
fn parse_sockaddr(whole: &str, what: &str, s: &str) -> Result<SocketAddrV4, String> {
    s.parse::<SocketAddrV4>()
        .ok()
        .filter(|a| a.port() != 0)
        .ok_or_else(|| {
            format!("--service {whole:?}: {what} {s:?} is not ADDRESS:PORT with a nonzero port")
        })
}

fn parse_service(s: &str) -> Result<ServiceArg, String> {
    let bad = || format!("--service {s:?}: expected NAME=VIP:PORT/PROTO=EP:PORT[,EP:PORT...]");
    let mut opts = s.split(';');
    let (name, rest) = opts.next().unwrap_or("").split_once('=').ok_or_else(bad)?;
    let (front, eps) = rest.split_once('=').ok_or_else(bad)?;
    if name.is_empty() {
        return Err(format!("--service {s:?}: empty Service name"));
    }
    let (vip, proto) = front
        .split_once('/')
        .ok_or_else(|| format!("--service {s:?}: {front:?} is not VIP:PORT/PROTO"))?;
    let vip = parse_sockaddr(s, "VIP", vip)?;
    let proto = match proto {
        "tcp" | "TCP" => IpProto::TCP,
        "udp" | "UDP" => IpProto::UDP,
        _ => {
            return Err(format!(
                "--service {s:?}: protocol {proto:?} is not tcp or udp"
            ))
        }
    };
    let mut spec = ServiceSpec::new(name, *vip.ip(), vip.port(), proto);
    for ep in eps.split(',').filter(|e| !e.is_empty()) {
        spec.endpoints
            .push(Endpoint::new(parse_sockaddr(s, "endpoint", ep)?, true));
    }
    for o in opts {
        if let Some(n) = o.strip_prefix("nodeport=") {
            spec.node_port =
                Some(n.parse().ok().filter(|n| *n != 0).ok_or_else(|| {
                    format!("--service {s:?}: node port {n:?} is not 1 to 65535")
                })?);
        } else if o == "affinity" {
            spec.affinity = Some(Duration::from_secs(10_800));
        } else if o == "maglev" {
            spec.algo = LbAlgo::Maglev;
        } else {
            return Err(format!(
                "--service {s:?}: option {o:?} is not nodeport=N, affinity or maglev"
            ));
        }
    }
    Ok(ServiceArg {
        text: s.to_string(),
        spec,
    })
}

fn parse_masquerade(s: &str) -> Result<MasqArg, String> {
    let (iface, src) = match s.split_once('=') {
        Some((i, c)) => (i, Some(parse_net("--masquerade", s, c)?)),
        None => (s, None),
    };
    if iface.is_empty() {
        return Err(format!("--masquerade {s:?}: empty interface name"));
    }
    Ok(MasqArg {
        iface: iface.to_string(),
        src,
    })
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        bridges: Vec::new(),
        ports: Vec::new(),
        uplinks: Vec::new(),
        routes: Vec::new(),
        macs: Vec::new(),
        mtus: Vec::new(),
        fdb_max: 8192,
        aging: 300,
        workers: None,
        stats_every: None,
        offload: true,
        io: IoMode::Auto,
        busy_poll_us: 0,
        cluster_cidr: None,
        services: Vec::new(),
        masquerade: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        // `--flag=value` is accepted as well as `--flag value`.
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        let mut next = || inline.clone().or_else(|| it.next());
        match flag.as_str() {
            "--bridge" => a.bridges.push(parse_bridge(&value(&flag, next())?)?),
            "--port" => a.ports.push(parse_port(&value(&flag, next())?)?),
            "--uplink" => a.uplinks.push(parse_uplink(&value(&flag, next())?)?),
            "--route" => a.routes.push(parse_route(&value(&flag, next())?)?),
            "--mac" => a.macs.push(parse_mac(&value(&flag, next())?)?),
            "--mtu" => a.mtus.push(parse_mtu(&value(&flag, next())?)?),
            "--fdb-max" => a.fdb_max = parse_num(&flag, next())?,
            "--aging" => a.aging = parse_num(&flag, next())?,
            "--workers" => a.workers = Some(parse_num(&flag, next())?),
            "--stats-every" => a.stats_every = Some(parse_num(&flag, next())?),
            "--no-offload" if inline.is_none() => a.offload = false,
            "--io" => {
                a.io = match value(&flag, next())?.as_str() {
                    "auto" => IoMode::Auto,
                    "plain" => IoMode::Plain,
                    "uring" => IoMode::Uring,
                    v => return Err(format!("--io: auto, plain or uring, not {v:?}")),
                }
            }
            "--busy-poll-us" => {
                a.busy_poll_us = parse_num(&flag, next())?;
                let most = tapyard::runtime::MAX_BUSY_POLL.as_micros();
                if u128::from(a.busy_poll_us) > most {
                    return Err(format!("--busy-poll-us: at most {most}"));
                }
            }
            "--cluster-cidr" => {
                let v = value(&flag, next())?;
                a.cluster_cidr = Some(parse_net(&flag, &v, &v)?);
            }
            "--service" => a.services.push(parse_service(&value(&flag, next())?)?),
            "--masquerade" => a.masquerade.push(parse_masquerade(&value(&flag, next())?)?),
            "-h" | "--help" => {
                println!("{}", usage());
                std::process::exit(0);
            }
            _ => return Err(format!("unknown argument {arg:?}; {}", usage())),
        }
    }
    if a.ports.is_empty() && a.uplinks.is_empty() {
        return Err(format!(
            "no TAP device named (--port or --uplink); {}",
            usage()
        ));
    }
    if a.workers == Some(0) {
        return Err("--workers: must be at least 1".into());
    }
    let mut taps: Vec<&str> = a.ports.iter().map(|(_, t)| t.as_str()).collect();
    taps.extend(a.uplinks.iter().map(|u| u.tap.as_str()));
    for (i, t) in taps.iter().enumerate() {
        if taps[..i].contains(t) {
            return Err(format!("TAP {t:?} is named twice"));
        }
    }
    Ok(a)
}

/// A random locally administered unicast MAC, different for every run and interface (two
/// tap-routers on one uplink segment must not share a MAC).
fn random_mac(state: &RandomState, i: usize) -> MacAddr {
    let mut h = state.build_hasher();
    h.write_usize(i);
    h.write_u32(std::process::id());
    let v = h.finish().to_be_bytes();
    MacAddr([0x02, v[0], v[1], v[2], v[3], v[4]])
}

fn run(a: Args) -> Result<(), String> {
    let mut b = Datapath::builder();
    let rs = RandomState::new();
    // Every router interface, in id order: (name, MAC, address, prefix length).
    let mut ifaces: Vec<(String, MacAddr, Ipv4Addr, u8)> = Vec::new();
    let mut iface_cfg = |name: &str, (addr, len): (Ipv4Addr, u8)| -> IfaceConfig {
        let mac = a
            .macs
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map_or_else(|| random_mac(&rs, ifaces.len()), |(_, m)| *m);
        ifaces.push((name.to_string(), mac, addr, len));
        let mut cfg = IfaceConfig::new(name, mac, addr, len);
        if let Some((_, mtu)) = a.mtus.iter().rev().find(|(n, _)| n == name) {
            cfg.mtu = *mtu;
        }
        cfg
    };
    for br in &a.bridges {
        let mut cfg = BridgeConfig::new(br.name.clone());
        cfg.fdb_max_entries = a.fdb_max;
        cfg.aging = Duration::from_secs(a.aging);
        let id = b
            .add_bridge(cfg)
            .map_err(|e| format!("--bridge {:?}: {e}", br.name))?;
        if let Some(gw) = br.gateway {
            b.add_router_iface(iface_cfg(&br.name, gw), Some(id))
                .map_err(|e| format!("--bridge {:?}: {e}", br.name))?;
        }
    }
    // (port id, TAP name) of every TAP to open.
    let mut taps: Vec<(PortId, String)> = Vec::new();
    for (br, tap) in &a.ports {
        let bid = a
            .bridges
            .iter()
            .position(|x| &x.name == br)
            .map(|i| tapyard::BridgeId(i as u16))
            .ok_or_else(|| format!("--port {br}:{tap}: no --bridge named {br:?}"))?;
        let id = b
            .add_port(tap.clone(), Some(bid))
            .map_err(|e| format!("--port {br}:{tap}: {e}"))?;
        taps.push((id, tap.clone()));
    }
    for u in &a.uplinks {
        let (_, id) = b
            .add_router_iface(iface_cfg(&u.name, u.addr), None)
            .map_err(|e| format!("--uplink {:?}: {e}", u.name))?;
        taps.push((id, u.tap.clone()));
    }
    let names: Vec<&String> = a.macs.iter().map(|m| &m.0).collect();
    for (flag, n) in names
        .into_iter()
        .map(|n| ("--mac", n))
        .chain(a.mtus.iter().map(|m| ("--mtu", &m.0)))
    {
        if !ifaces.iter().any(|i| &i.0 == n) {
            return Err(format!("{flag} {n}: no router interface named {n:?}"));
        }
    }
    let nat = a.cluster_cidr.is_some() || !a.services.is_empty() || !a.masquerade.is_empty();
    if nat {
        if ifaces.is_empty() {
            return Err(
                "--cluster-cidr, --service and --masquerade need a router interface \
                 (--bridge NAME=ADDR/LEN or --uplink)"
                    .into(),
            );
        }
        let cluster = a.cluster_cidr.map(|(addr, len)| Prefix::new(addr, len));
        let mut masquerade = Vec::new();
        for m in &a.masquerade {
            let out = ifaces
                .iter()
                .position(|i| i.0 == m.iface)
                .map(|i| IfaceId(i as u16))
                .ok_or_else(|| {
                    format!(
                        "--masquerade {}: no router interface named {:?}",
                        m.iface, m.iface
                    )
                })?;
            let src = m.src.map(|(addr, len)| Prefix::new(addr, len)).or(cluster);
            if src.is_none() {
                return Err(format!(
                    "--masquerade {}: no source CIDR (give {}=SRC_CIDR or --cluster-cidr)",
                    m.iface, m.iface
                ));
            }
            masquerade.push(MasqueradeRule {
                out,
                src,
                except_dst: cluster,
            });
        }
        b.netfilter(NatConfig {
            rules: NatRules {
                cluster_cidr: cluster,
                masquerade,
                ..Default::default()
            },
            ..Default::default()
        })
        .map_err(|e| format!("NAT: {e}"))?;
    }
    let dp = Arc::new(b.build());
    if let Some(nf) = dp.control().netfilter() {
        // The runtime's clock starts at zero when it starts, below; no connection exists yet.
        for s in &a.services {
            nf.upsert_service(s.spec.clone(), tapyard::Instant::ZERO)
                .map_err(|e| format!("--service {:?}: {e}", s.text))?;
        }
    }
    for r in &a.routes {
        let iface = |name: &str| {
            dp.control()
                .iface_by_name(name)
                .ok_or_else(|| format!("--route {:?}: no router interface named {name:?}", r.text))
        };
        let next_hop = match &r.hop {
            Hop::Via(gw, Some(dev)) => NextHop::Via(iface(dev)?, *gw),
            Hop::Via(gw, None) => match dp.control().routes().and_then(|t| t.lookup(*gw)) {
                Some(NextHop::Link(i)) => NextHop::Via(i, *gw),
                _ => {
                    return Err(format!(
                        "--route {:?}: gateway {gw} is not on a connected subnet",
                        r.text
                    ))
                }
            },
            Hop::Dev(dev) => NextHop::Link(iface(dev)?),
            Hop::Blackhole => NextHop::Blackhole,
            Hop::Unreachable => NextHop::Unreachable,
        };
        if mask(r.prefix, r.len) != r.prefix {
            return Err(format!(
                "--route {:?}: {}/{} has host bits set (expected {}/{})",
                r.text,
                r.prefix,
                r.len,
                mask(r.prefix, r.len),
                r.len
            ));
        }
        dp.control()
            .add_route(Route {
                prefix: r.prefix,
                len: r.len,
                next_hop,
                metric: r.metric,
                proto: RouteProto::Static,
                src: None,
            })
            .map_err(|e| format!("--route {:?}: {e}", r.text))?;
    }
    let mut ports: Vec<(PortId, Arc<dyn Port>)> = Vec::new();
    for (id, t) in &taps {
        let p = if a.offload {
            TapPort::open_offload(t)
        } else {
            TapPort::open(t)
        };
        let p = p.map_err(|e| format!("cannot open TAP {t:?}: {e}"))?;
        ports.push((*id, Arc::new(p)));
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let workers = a.workers.unwrap_or(taps.len().min(cpus));
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone()).map_err(|e| format!("signal: {e}"))?;
    }
    let rt = Runtime::start(
        dp.clone(),
        ports,
        RuntimeConfig {
            workers,
            io: a.io,
            busy_poll: std::time::Duration::from_micros(a.busy_poll_us),
            ..Default::default()
        },
    )
    .map_err(|e| format!("cannot start workers: {e}"))?;
    if let Some(why) = rt.io_fallback() {
        eprintln!("tap-router: {why}");
    }
    for (name, mac, addr, len) in &ifaces {
        eprintln!("tap-router: interface {name} {addr}/{len} mac {mac}");
    }
    let mut routes = String::new();
    let _ = dp.control().fmt_routes(&mut routes);
    eprint!("tap-router: routes:\n{routes}");
    if let Some(nf) = dp.control().netfilter() {
        eprint!("tap-router: services:\n{}", nf.services().fmt_services());
    }
    eprintln!(
        "tap-router: {} TAP(s) ({}) with {workers} worker(s), I/O {:?}; SIGINT or SIGTERM to stop",
        taps.len(),
        taps.iter()
            .map(|(_, t)| t.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        rt.io()
    );
    let mut ticks = 0u64;
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(100));
        ticks += 1;
        if let Some(s) = a.stats_every {
            if s > 0 && ticks % (s * 10) == 0 {
                eprint!("{}", dp.control().stats());
            }
        }
    }
    let now = rt.now();
    rt.stop();
    print!("{}", dp.control().stats());
    if let Some(r) = dp.control().router() {
        println!("router: {}", r.counters.snapshot().line());
    }
    let mut s = String::new();
    let _ = dp.control().fmt_routes(&mut s);
    print!("routes:\n{s}");
    s.clear();
    let _ = dp.control().fmt_neigh(now, &mut s);
    print!("neighbours:\n{s}");
    s.clear();
    let _ = dp.control().fmt_fdb(now, &mut s);
    print!("fdb:\n{s}");
    if let Some(nf) = dp.control().netfilter() {
        print_nat(nf, now);
    }
    Ok(())
}

/// The NAT engine's counters, the connection table's counters, the live connections by
/// protocol and TCP state, and the Services.
fn print_nat(nf: &tapyard::nat::Netfilter, now: tapyard::Instant) {
    println!("nat: {}", nf.counters().line());
    let c = nf.conntrack().counters();
    println!("conntrack: entries {}  {}", c.entries, c.line());
    let mut by_state: Vec<(String, usize)> = Vec::new();
    let dump = nf.conntrack().dump(now);
    for e in &dump {
        let k = match e.state {
            Some(st) => format!("{} {}", e.protocol, st.name()),
            None => e.protocol.to_string(),
        };
        match by_state.iter_mut().find(|(n, _)| *n == k) {
            Some((_, c)) => *c += 1,
            None => by_state.push((k, 1)),
        }
    }
    by_state.sort();
    let states: Vec<String> = by_state.iter().map(|(k, c)| format!("{k} {c}")).collect();
    if states.is_empty() {
        println!("connections: 0");
    } else {
        println!("connections: {} ({})", dump.len(), states.join(", "));
    }
    print!("services:\n{}", nf.services().fmt_services());
}

fn main() -> ExitCode {
    let r = parse_args().and_then(run);
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tap-router: {e}");
            ExitCode::from(2)
        }
    }
}
