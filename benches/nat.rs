//! Conntrack and NAT through the whole datapath, each beside a baseline in the same run.
//!
//! * `datapath_dnat`: established TCP connections to a Service (ClusterIP DNAT'd to one of 4
//!   endpoints), 64-byte segments from 4 client ports on br0 through the router to the
//!   endpoints on br1, in-memory ports, one pump round per iteration (receive, bridge, conntrack
//!   lookup + state machine + DNAT rewrite, route, neighbour, far bridge, copy out). Every
//!   batch holds 32 different connections per port (128 in all), so the router's per-batch
//!   memo of the last route does not help; the worker's flow memo (1024 slots) does hold all
//!   128, as it would on a node with up to several hundred busy connections per worker (with
//!   many thousands, more packets take the full lookup). Beside it: the same packets routed
//!   by a datapath without NAT (to the endpoints directly). The `_one_flow` variants send 32
//!   segments of ONE established connection per client port per batch.
//! * `nat_parts`: an incremental rewrite, the source-port allocator when the original port is
//!   taken, a Service lookup and endpoint choice among 1000 Services (random, Maglev, random
//!   with ClientIP affinity), and replacing a 1000-endpoint Maglev Service.
//! * `new_connections`: SYNs to the Service through `Datapath::process` with the conntrack
//!   table holding 1 M connections: per packet, the table miss, the Service lookup, the random
//!   endpoint choice, the route of the endpoint, the insert and the rewrite. Beside it: the
//!   same SYNs through a datapath without NAT.
//!
//! * `datapath_frags`: 4000-byte UDP datagrams to a UDP Service (ClusterIP DNAT'd to one of
//!   4 endpoints), 10 connections per client port, each datagram in 3 fragments: put
//!   together in front of conntrack, DNAT'd whole, sent on as its 3 fragments. Beside it: the
//!   same payload bytes in unfragmented 1350-byte datagrams of the same connections, 3 per
//!   fragmented datagram. Throughput in payload bytes.
//!
//! The `_file` variants keep the connection table in a file in /dev/shm
//! (`DatapathBuilder::conntrack_file`), as `tapyard run` does, instead of anonymous memory.
//!
//! * `stale_udp`: kube-proxy's stale UDP cleanup on a Service update with 1000 endpoints over
//!   a 1 M-entry table, beside the flush before it (tagged flows only) and the update alone.
//!
//! `cargo bench --bench nat` (`cargo bench --bench nat -- stale_udp` for the last group)
#![allow(
    clippy::cast_possible_truncation,
    reason = "bench fixtures: small loop counters and random draws narrowed into addresses, ports and ids"
)]

use std::hint::black_box;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddrV4, SocketAddrV6};
use std::sync::Arc;
use std::time::{Duration, Instant as StdInstant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use tapyard::conntrack::{CtConfig, CtTag, Pkt};
use tapyard::l3::IfaceConfig;
use tapyard::nat::NatConfig;
use tapyard::nat::{
    alloc_source, rewrite, CsumMode, Endpoint, LbAlgo, PortRange, Rng, ServiceSpec, Services,
    DEFAULT_AFFINITY_TIMEOUT,
};
use tapyard::port::{mem_pair, MemPort, Port};
use tapyard::runtime::Pump;
use tapyard::wire::family::IpProto;
use tapyard::wire::ipv4::{Ipv4Packet, Ipv4Repr, PROTO_TCP};
use tapyard::wire::tcp::{TcpPacket, TcpRepr};
use tapyard::wire::tuple::{L4Kind, Tuple};
use tapyard::{Batch, BridgeConfig, Datapath, Instant, MacAddr, PacketBuf, PortId, BATCH_SIZE};

use tapyard_testkit::bench as common;
use tapyard_testkit::frame::{self, Segment, ToIp, SYN};

const PORTS: usize = 4;
const VIP: [u8; 4] = [10, 96, 0, 1];
const VIP6: &str = "fd00:96::1";

fn client_ip6(i: usize) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 10 + i as u16)
}
fn server_ip6(i: usize) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, 0, 0, 1, 0, 0, 0, 10 + i as u16)
}

fn client_ip(i: usize) -> [u8; 4] {
    [10, 0, 0, 10 + i as u8]
}
fn server_ip(i: usize) -> [u8; 4] {
    [10, 0, 1, 10 + i as u8]
}
fn client_mac(i: usize) -> MacAddr {
    MacAddr::local(0x100 + i as u32)
}
fn server_mac(i: usize) -> MacAddr {
    MacAddr::local(0x200 + i as u32)
}
const GW0: MacAddr = MacAddr([0x02, 0, 0, 0, 0xfe, 0]);
const GW1: MacAddr = MacAddr([0x02, 0, 0, 0, 0xfe, 1]);

/// A TCP segment of either family: sequence 1, acknowledging 1, no payload with SYN, ten
/// zero bytes without.
fn tcp(
    src_mac: MacAddr,
    dst_mac: MacAddr,
    src: impl ToIp,
    sport: u16,
    dst: impl ToIp,
    dport: u16,
    flags: u8,
) -> Vec<u8> {
    let seg = Segment {
        seq: 1,
        ack: 1,
        window: 64240,
        ttl: 64,
        payload: if flags & SYN != 0 { &[] } else { &[0; 10] },
    };
    frame::tcp_with(src_mac, dst_mac, (src, sport), (dst, dport), flags, &seg)
}

/// Two bridges with a router between them, clients on br0 and servers on br1, neighbours
/// resolved; with or without NAT and a Service at `VIP:80` over the 4 servers.
struct Rig {
    dp: Arc<Datapath>,
    ports: Vec<(PortId, Arc<dyn Port>)>,
    clients: Vec<MemPort>,
    servers: Vec<MemPort>,
    now: Instant,
}

/// A file for a file-backed table: in /dev/shm (a tmpfs, as /run on a node) when there is
/// one, or `TAPYARD_BENCH_SHM`. The datapath keeps its IPv6 table beside it
/// ([`tapyard::conntrack6_path`]); both are unlinked once the datapath has mapped them (see
/// `rig`), and again when dropped.
struct CtFile(std::path::PathBuf);

impl CtFile {
    /// Unlinks both tables' files (a mapping stays valid).
    fn unlink(&self) {
        let _ = std::fs::remove_file(&self.0);
        let _ = std::fs::remove_file(tapyard::conntrack6_path(&self.0));
    }
}

impl CtFile {
    fn new(tag: &str) -> CtFile {
        // TAPYARD_BENCH_SHM: another directory, e.g. a tmpfs mounted with huge=always.
        let dir = std::env::var_os("TAPYARD_BENCH_SHM")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| std::path::PathBuf::from("/dev/shm"));
        let dir = if dir.is_dir() {
            dir
        } else {
            std::env::temp_dir()
        };
        let f = CtFile(dir.join(format!("tapyard-bench-ct-{tag}-{}", std::process::id())));
        f.unlink();
        f
    }
}

impl CtFile {
    /// Prints how much of the tables' mappings is on huge pages (`ShmemPmdMapped` /
    /// `FilePmdMapped` in /proc/self/smaps), to stderr: the file-backed table is meant to be
    /// on them, as the anonymous one is.
    fn report_pages(&self) {
        let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else {
            return;
        };
        let name = self.0.to_string_lossy();
        let (mut size, mut pmd, mut ours) = (0u64, 0u64, false);
        for line in smaps.lines() {
            let mut words = line.split_whitespace();
            let Some(first) = words.next() else { continue };
            if !first.ends_with(':') {
                // The IPv6 table's file is this one's name and "6".
                ours = line.contains(&*name);
                continue;
            }
            let kb = words
                .next()
                .and_then(|w| w.parse::<u64>().ok())
                .unwrap_or(0);
            match (ours, first) {
                (true, "Size:") => size += kb,
                (true, "ShmemPmdMapped:" | "FilePmdMapped:") => pmd += kb,
                _ => {}
            }
        }
        eprintln!("conntrack files: {size} kB mapped, {pmd} kB of it on huge pages (PMDs)");
    }
}

impl Drop for CtFile {
    fn drop(&mut self) {
        self.unlink();
    }
}

/// The variants measured side by side: (NAT, connection table in a file, name suffix).
const VARIANTS: [(bool, bool, &str); 3] =
    [(true, false, ""), (true, true, "_file"), (false, false, "")];

fn rig(nat: bool, ct_max: usize, file: Option<&CtFile>) -> Rig {
    let mut b = Datapath::builder();
    let br0 = b.add_bridge(BridgeConfig::new("br0")).unwrap();
    let br1 = b.add_bridge(BridgeConfig::new("br1")).unwrap();
    let (if0, _) = b
        .add_router_iface(
            {
                let mut c = IfaceConfig::new("gw0", GW0, Ipv4Addr::new(10, 0, 0, 254), 24);
                c.addr6 = Some(("fd00::fe".parse().unwrap(), 64));
                c
            },
            Some(br0),
        )
        .unwrap();
    let (if1, _) = b
        .add_router_iface(
            {
                let mut c = IfaceConfig::new("gw1", GW1, Ipv4Addr::new(10, 0, 1, 254), 24);
                c.addr6 = Some(("fd00:0:0:1::fe".parse().unwrap(), 64));
                c
            },
            Some(br1),
        )
        .unwrap();
    if let Some(f) = file {
        b.conntrack_file(&f.0, Instant::from_secs(1));
    }
    if nat {
        b.netfilter(NatConfig {
            conntrack: CtConfig {
                max_entries: ct_max,
                ..CtConfig::default()
            },
            ..NatConfig::default()
        })
        .unwrap();
    }
    let mut ports: Vec<(PortId, Arc<dyn Port>)> = Vec::new();
    let (mut clients, mut servers) = (Vec::new(), Vec::new());
    for i in 0..PORTS {
        let (a, h) = mem_pair(&format!("c{i}"), "h", 4 * BATCH_SIZE);
        ports.push((b.add_port(format!("c{i}"), Some(br0)).unwrap(), Arc::new(a)));
        clients.push(h);
        let (a, h) = mem_pair(&format!("s{i}"), "h", 64 * BATCH_SIZE);
        ports.push((b.add_port(format!("s{i}"), Some(br1)).unwrap(), Arc::new(a)));
        servers.push(h);
    }
    let dp = Arc::new(b.build());
    if let Some(f) = file {
        // Unlinked at once (the tables keep their mappings), so that no run leaves a file of
        // up to 400 MB behind in /dev/shm, which is memory.
        f.unlink();
        f.report_pages();
    }
    let now = Instant::from_secs(1);
    for i in 0..PORTS {
        dp.control()
            .add_static_neigh(
                if0,
                std::net::IpAddr::from(client_ip(i)),
                client_mac(i),
                now,
            )
            .unwrap();
        dp.control()
            .add_static_neigh(
                if1,
                std::net::IpAddr::from(server_ip(i)),
                server_mac(i),
                now,
            )
            .unwrap();
        dp.control()
            .add_static_neigh(if0, client_ip6(i), client_mac(i), now)
            .unwrap();
        dp.control()
            .add_static_neigh(if1, server_ip6(i), server_mac(i), now)
            .unwrap();
    }
    if let Some(nf) = dp.control().netfilter() {
        let mut s = ServiceSpec::new("web", Ipv4Addr::from(VIP), 80, IpProto::TCP);
        s.endpoints = (0..PORTS)
            .map(|i| Endpoint::new(SocketAddrV4::new(server_ip(i).into(), 8080), true))
            .collect();
        nf.upsert_service(s, now).unwrap();
    }
    Rig {
        dp,
        ports,
        clients,
        servers,
        now,
    }
}

impl Rig {
    fn drain(&self) {
        for h in self.clients.iter().chain(&self.servers) {
            while let Some(b) = h.recv_frame() {
                h.recycle(b);
            }
        }
    }
    /// Every station announces itself so both bridges know their ports.
    fn announce(&self, pump: &mut Pump) {
        for (i, h) in self.clients.iter().enumerate() {
            h.send_frame(&tcp(client_mac(i), MacAddr::BROADCAST, [0; 4], 0, [0; 4], 0, 0)[..60])
                .unwrap();
        }
        for (i, h) in self.servers.iter().enumerate() {
            h.send_frame(&tcp(server_mac(i), MacAddr::BROADCAST, [0; 4], 0, [0; 4], 0, 0)[..60])
                .unwrap();
        }
        pump.drain(self.now, 8);
        self.drain();
    }
}

fn established(c: &mut Criterion) {
    let mut g = c.benchmark_group("datapath_dnat");
    g.throughput(Throughput::Elements((PORTS * BATCH_SIZE) as u64));
    for (nat, in_file, suffix) in VARIANTS {
        let file = in_file.then(|| CtFile::new("established"));
        let r = rig(nat, 65_536, file.as_ref());
        let mut pump = Pump::new(r.dp.clone(), &r.ports).unwrap();
        r.announce(&mut pump);
        // 32 connections per client: SYN, SYN-ACK from the chosen endpoint, ACK.
        let sport = |k: usize| 10_000 + k as u16;
        let mut data: Vec<Vec<Vec<u8>>> = vec![Vec::new(); PORTS];
        for (i, h) in r.clients.iter().enumerate() {
            for k in 0..BATCH_SIZE {
                let dst = if nat { VIP } else { server_ip((i + k) % PORTS) };
                let dport = if nat { 80 } else { 8080 };
                h.send_frame(&tcp(
                    client_mac(i),
                    GW0,
                    client_ip(i),
                    sport(k),
                    dst,
                    dport,
                    2,
                ))
                .unwrap();
                data[i].push(tcp(
                    client_mac(i),
                    GW0,
                    client_ip(i),
                    sport(k),
                    dst,
                    dport,
                    0x10,
                ));
            }
        }
        pump.drain(r.now, 8);
        // Each server answers the SYNs it got.
        for (j, s) in r.servers.iter().enumerate() {
            let mut answers = Vec::new();
            while let Some(b) = s.recv_frame() {
                let ip = Ipv4Packet::new_checked(&b.frame()[14..]).unwrap();
                let sp = TcpPacket::new_checked(ip.payload()).unwrap().src_port();
                let src = ip.src_addr().octets();
                answers.push(tcp(server_mac(j), GW1, server_ip(j), 8080, src, sp, 0x12));
                s.recycle(b);
            }
            for a in answers {
                s.send_frame(&a).unwrap();
            }
        }
        pump.drain(r.now, 8);
        r.drain();
        let inject = || {
            for (h, fs) in r.clients.iter().zip(&data) {
                for f in fs {
                    h.send_frame(f).unwrap();
                }
            }
        };
        inject();
        pump.drain(r.now, 8);
        let before = r.dp.control().stats().forwarded;
        r.drain();
        // One established connection per client port: 32 segments of it per batch.
        let one_flow: Vec<Vec<Vec<u8>>> = data
            .iter()
            .map(|fs| vec![fs[0].clone(); BATCH_SIZE])
            .collect();
        for (variant, frames) in [("", &data), ("_one_flow", &one_flow)] {
            let inject = || {
                for (h, fs) in r.clients.iter().zip(frames) {
                    for f in fs {
                        h.send_frame(f).unwrap();
                    }
                }
            };
            let name = if nat {
                format!("tapyard_dnat_established{variant}{suffix}")
            } else {
                format!("tapyard_routed_no_nat{variant}")
            };
            common::bench_batched(
                &mut g,
                "datapath_dnat",
                &name,
                || {
                    r.drain();
                    inject();
                },
                |()| black_box(pump.poll(r.now).unwrap()),
            );
        }
        let s = r.dp.control().stats();
        assert!(s.forwarded >= before, "{s}");
        assert_eq!(s.rx_drops(), 0, "{s}");
        if let Some(nf) = r.dp.control().netfilter() {
            let est = nf
                .conntrack()
                .dump(r.now)
                .iter()
                .filter(|v| v.assured)
                .count();
            assert_eq!(est, PORTS * BATCH_SIZE, "every connection established");
        }
    }
    g.finish();
}

fn new_connections(c: &mut Criterion) {
    let mut g = c.benchmark_group("new_connections");
    g.throughput(Throughput::Elements(BATCH_SIZE as u64));
    g.sample_size(20);
    g.measurement_time(Duration::from_secs(4));
    for (nat, in_file, suffix) in VARIANTS {
        let file = in_file.then(|| CtFile::new("new"));
        let r = rig(nat, 2 << 20, file.as_ref());
        let mut pump = Pump::new(r.dp.clone(), &r.ports).unwrap();
        r.announce(&mut pump);
        if let Some(nf) = r.dp.control().netfilter() {
            // Fill the table with 1 M connections (UDP between other addresses).
            let ct = nf.conntrack();
            for k in 0..1u32 << 20 {
                let t = Tuple {
                    src: Ipv4Addr::from(0x0a05_0000 | k >> 8),
                    dst: Ipv4Addr::new(10, 6, 0, 1),
                    sport: 1000 + (k & 0xff) as u16,
                    dport: 53,
                    proto: 17,
                    zone: 0,
                };
                let p = Pkt {
                    kind: L4Kind::Udp,
                    tcp_flags: 0,
                    len: 64,
                };
                ct.insert(t, t.invert(), CtTag::default(), &p, r.now)
                    .unwrap();
            }
            assert_eq!(ct.len(), 1 << 20);
        }
        let mut w = r.dp.worker();
        let mut next: u32 = 0;
        let c0 = r.ports[0].0;
        let mut make = || {
            let mut b = Batch::new();
            for _ in 0..BATCH_SIZE {
                next = next.wrapping_add(1);
                // Unique (source address, port) pairs from 10.0.0.0/24's client on port c0.
                let src = [10, 0, 0, 10];
                let sport = 1024 + (next % 60_000) as u16;
                let src = if next / 60_000 == 0 {
                    src
                } else {
                    [10, 0, 0, 10 + (next / 60_000 % 200) as u8]
                };
                let (dst, dport) = if nat {
                    (VIP, 80)
                } else {
                    (server_ip(next as usize % PORTS), 8080)
                };
                let mut pb =
                    PacketBuf::from_frame(&tcp(client_mac(0), GW0, src, sport, dst, dport, 2));
                pb.port = c0;
                b.push(pb).unwrap();
            }
            b
        };
        let name = if nat {
            format!("tapyard_service_1M_table{suffix}")
        } else {
            "tapyard_routed_no_nat".to_string()
        };
        let nf = r.dp.control().netfilter();
        let mut ran = false;
        g.bench_function(name, |bch| {
            ran = true;
            bch.iter_custom(|iters| {
                let mut t = Duration::ZERO;
                for _ in 0..iters {
                    let mut b = make();
                    let s = StdInstant::now();
                    r.dp.process(&mut w, r.now, &mut b);
                    t += s.elapsed();
                    black_box(b.verdicts());
                    b.recycle(&mut w.pool);
                }
                // Keep the table at about 1 M: drop what the bench made (untimed).
                if let Some(nf) = nf {
                    if nf.conntrack().len() > (1 << 20) + (1 << 18) {
                        nf.conntrack().retain(r.now, |v| v.service == 0);
                    }
                }
                t
            })
        });
        if let (Some(nf), true) = (nf, ran) {
            let c = nf.counters();
            assert!(c.dnat > 0, "{c:?}");
        }
    }
    g.finish();
}

/// The parts of a new connection's cost on their own: an incremental rewrite, the source-port
/// allocator when the original port is taken, a Service lookup and endpoint choice among 1000
/// Services, and replacing a 1000-endpoint Maglev Service.
fn parts(c: &mut Criterion) {
    let mut g = c.benchmark_group("nat_parts");
    // A 60-byte TCP packet: 20 IP + 20 TCP + 20 payload, checksums valid.
    let mut p = vec![0u8; 60];
    let (src, dst) = (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 96, 0, 10));
    let seg = TcpRepr {
        src_port: 40000,
        dst_port: 80,
        seq_number: 0,
        ack_number: 0,
        flags: 0,
        window: 0,
        payload: &[0; 20],
    };
    let ip = Ipv4Repr {
        src_addr: src,
        dst_addr: dst,
        protocol: PROTO_TCP,
        payload_len: seg.buffer_len(),
        ttl: 0,
        tos: 0,
        dont_frag: false,
    };
    let mut v = Ipv4Packet::new_unchecked(&mut p[..]);
    ip.emit(&mut v);
    seg.emit(&mut TcpPacket::new_unchecked(v.payload_mut()), src, dst);
    let (t0, kind) = Tuple::from_ipv4(&p, 20, 60).unwrap();
    let mut i = 0u32;
    g.bench_function("rewrite_tcp_full_checksums", |b| {
        b.iter(|| {
            i = i.wrapping_add(1);
            let mut t1 = t0;
            t1.dst = Ipv4Addr::from(0x0af4_0000 | (i & 0xff));
            t1.dport = i as u16;
            black_box(rewrite(black_box(&mut p), 20, kind, &t1, CsumMode::Full)).ok()
        })
    });
    g.bench_function("alloc_source_original_port_taken", |b| {
        b.iter(|| {
            i = i.wrapping_add(1);
            alloc_source(
                &t0,
                Ipv4Addr::new(192, 168, 0, 1),
                PortRange::MASQUERADE,
                u64::from(i),
                |r| r.dport == t0.sport,
            )
        })
    });
    let s = Services::new(1 << 16);
    let spec = |k: u32, n: u32, algo: LbAlgo| {
        let mut spec = ServiceSpec::new(
            format!("svc{k}"),
            Ipv4Addr::from(0x0a60_0000 + k),
            80,
            IpProto::TCP,
        );
        spec.endpoints = (0..n)
            .map(|e| {
                Endpoint::new(
                    SocketAddrV4::new(Ipv4Addr::from(0x0af4_0000 + e), 8080),
                    false,
                )
            })
            .collect();
        spec.algo = algo;
        spec
    };
    for k in 0..1000u32 {
        let algo = if k % 2 == 0 {
            LbAlgo::Maglev
        } else {
            LbAlgo::Random
        };
        let mut sp = spec(k, 10, algo);
        sp.affinity = (k % 4 == 1).then_some(DEFAULT_AFFINITY_TIMEOUT);
        s.upsert(sp).unwrap();
    }
    let mut rng = Rng::new(9);
    // Services k % 4 == 3: Random; k % 4 == 1: Random + affinity; even k: Maglev.
    for (name, step, offset) in [
        ("select_random", 4, 3),
        ("select_maglev", 2, 0),
        ("select_random_affinity_65536_clients", 4, 1),
    ] {
        g.bench_function(name, |b| {
            b.iter(|| {
                i = i.wrapping_add(1);
                let k = (i % (1000 / step)) * step + offset;
                let svc = s.by_vip(Ipv4Addr::from(0x0a60_0000 + k), 80, 6).unwrap();
                let r = rng.next_u64();
                let client = Ipv4Addr::from(r as u32 & 0xffff);
                black_box(s.select(&svc, client, r, r, false, Instant::ZERO));
            })
        });
    }
    g.sample_size(10);
    g.bench_function("upsert_maglev_1000_endpoints", |b| {
        b.iter(|| s.upsert(spec(5000, 1000, LbAlgo::Maglev)).unwrap())
    });
    g.finish();
}

/// Established DNAT'd IPv6 TCP beside the IPv4 figure: the same rig with IPv6 addresses on
/// both router interfaces and an IPv6 ClusterIP over the same four servers, 32 connections per
/// client, the same segment mix.
fn established6(c: &mut Criterion) {
    let mut g = c.benchmark_group("datapath_dnat");
    g.throughput(Throughput::Elements((PORTS * BATCH_SIZE) as u64));
    let r = rig(true, 65_536, None);
    let nf = r.dp.control().netfilter().unwrap();
    let mut s = ServiceSpec::new(
        "web6",
        VIP6.parse::<std::net::Ipv6Addr>().unwrap(),
        80,
        IpProto::TCP,
    );
    s.endpoints6 = (0..PORTS)
        .map(|i| Endpoint::new(SocketAddrV6::new(server_ip6(i), 8080, 0, 0), true))
        .collect();
    nf.upsert_service(s, r.now).unwrap();
    let mut pump = Pump::new(r.dp.clone(), &r.ports).unwrap();
    r.announce(&mut pump);
    let vip6: Ipv6Addr = VIP6.parse().unwrap();
    let sport = |k: usize| 10_000 + k as u16;
    let mut data: Vec<Vec<Vec<u8>>> = vec![Vec::new(); PORTS];
    for (i, h) in r.clients.iter().enumerate() {
        for k in 0..BATCH_SIZE {
            let f = |fl| tcp(client_mac(i), GW0, client_ip6(i), sport(k), vip6, 80, fl);
            h.send_frame(&f(2)).unwrap();
            data[i].push(f(0x10));
        }
    }
    pump.drain(r.now, 8);
    for (j, s) in r.servers.iter().enumerate() {
        let mut answers = Vec::new();
        while let Some(b) = s.recv_frame() {
            let f = b.frame();
            if f.len() >= 74 && f[12..14] == [0x86, 0xdd] {
                let src = Ipv6Addr::from(<[u8; 16]>::try_from(&f[22..38]).unwrap());
                let sp = u16::from_be_bytes([f[54], f[55]]);
                answers.push(tcp(server_mac(j), GW1, server_ip6(j), 8080, src, sp, 0x12));
            }
            s.recycle(b);
        }
        for a in answers {
            s.send_frame(&a).unwrap();
        }
    }
    pump.drain(r.now, 8);
    r.drain();
    let inject = || {
        for (h, fs) in r.clients.iter().zip(&data) {
            for f in fs {
                h.send_frame(f).unwrap();
            }
        }
    };
    inject();
    pump.drain(r.now, 8);
    r.drain();
    let est = nf
        .conntrack_of::<Ipv6Addr>()
        .dump(r.now)
        .iter()
        .filter(|v| v.assured)
        .count();
    assert_eq!(est, PORTS * BATCH_SIZE, "every IPv6 connection established");
    common::bench_batched(
        &mut g,
        "datapath_dnat",
        "tapyard_dnat_established_v6",
        || {
            r.drain();
            inject();
        },
        |()| black_box(pump.poll(r.now).unwrap()),
    );
    let st = r.dp.control().stats();
    assert_eq!(st.rx_drops(), 0, "{st}");
    g.finish();
}

/// `datapath_frags` (see the module docs).
fn fragmented(c: &mut Criterion) {
    const FLOWS: usize = 10;
    const BIG: usize = 4000;
    const SMALL: usize = 1350;
    let mut g = c.benchmark_group("datapath_frags");
    g.throughput(Throughput::Bytes((PORTS * FLOWS * BIG) as u64));
    let r = rig(true, 65_536, None);
    let nf = r.dp.control().netfilter().unwrap();
    let mut s = ServiceSpec::new("dns", Ipv4Addr::from(VIP), 53, IpProto::UDP);
    s.endpoints = (0..PORTS)
        .map(|i| Endpoint::new(SocketAddrV4::new(server_ip(i).into(), 5353), true))
        .collect();
    nf.upsert_service(s, r.now).unwrap();
    let mut pump = Pump::new(r.dp.clone(), &r.ports).unwrap();
    r.announce(&mut pump);
    let datagram = |i: usize, k: usize, len: usize| {
        let src = (Ipv4Addr::from(client_ip(i)), 20_000 + k as u16);
        let payload = vec![k as u8; len];
        frame::udp_with(
            client_mac(i),
            GW0,
            src,
            (Ipv4Addr::from(VIP), 53),
            64,
            &payload,
        )
    };
    let frags: Vec<Vec<Vec<u8>>> = (0..PORTS)
        .map(|i| {
            (0..FLOWS)
                .flat_map(|k| frame::fragments(&datagram(i, k, BIG), 1500, k as u32))
                .collect()
        })
        .collect();
    let whole: Vec<Vec<Vec<u8>>> = (0..PORTS)
        .map(|i| {
            (0..FLOWS)
                .flat_map(|k| (0..BIG / SMALL + 1).map(move |_| (k, SMALL)))
                .map(|(k, len)| datagram(i, k, len))
                .collect()
        })
        .collect();
    for (name, frames) in [("unfragmented_1350", &whole), ("fragmented_4000", &frags)] {
        let inject = || {
            for (h, fs) in r.clients.iter().zip(frames) {
                for f in fs {
                    h.send_frame(f).unwrap();
                }
            }
        };
        // The connections exist before the timing starts.
        inject();
        pump.drain(r.now, 8);
        r.drain();
        let name = format!("tapyard_udp_dnat_{name}");
        common::bench_batched(
            &mut g,
            "datapath_frags",
            &name,
            || {
                r.drain();
                inject();
            },
            |()| black_box(pump.poll(r.now).unwrap()),
        );
    }
    let s = r.dp.control().stats();
    assert_eq!(s.rx_drops(), 0, "{s}");
    assert!(s.reassembled > 0, "{s}");
    g.finish();
}

/// kube-proxy's stale UDP cleanup (`CleanStaleEntries`): a UDP Service with 1000 endpoints
/// changes one endpoint, over a table of 1 M UDP flows (1/16 of them the Service's, DNAT'd
/// to its endpoints; the rest other flows). `upsert_1000_endpoints_cleanup_1M_table` is
/// `Netfilter::upsert_service` (the Service table's update, then the scan of the table for
/// flows to its frontends not from a serving endpoint); beside it, the same update with the
/// flush before issue 23 (flows tagged with the Service and DNAT'd to a removed endpoint
/// only, one scan too), and the Service table's update alone.
fn stale_udp(c: &mut Criterion) {
    let mut g = c.benchmark_group("stale_udp");
    g.sample_size(10);
    g.measurement_time(Duration::from_secs(10));
    let nf = tapyard::nat::Netfilter::new(NatConfig {
        conntrack: CtConfig {
            max_entries: 2 << 20,
            ..CtConfig::default()
        },
        ..NatConfig::default()
    })
    .unwrap();
    let now = Instant::from_secs(1);
    let vip = Ipv4Addr::new(10, 96, 0, 53);
    let ep = |e: u32| SocketAddrV4::new(Ipv4Addr::from(0x0af4_0000 + e), 5353);
    // Endpoints `shift .. shift + 1000`.
    let dns = |shift: u32| {
        let mut s = ServiceSpec::new("dns", vip, 53, IpProto::UDP);
        s.endpoints = (shift..shift + 1000)
            .map(|e| Endpoint::new(ep(e), false))
            .collect();
        s
    };
    let id = nf.upsert_service(dns(0), now).unwrap().get();
    let ct = nf.conntrack();
    let p = Pkt {
        kind: L4Kind::Udp,
        tcp_flags: 0,
        len: 64,
    };
    for k in 0..1u32 << 20 {
        let src = Ipv4Addr::from(0x0a05_0000 | k >> 8);
        let sport = 1000 + (k & 0xff) as u16;
        let (dst, tag, reply) = if k % 16 == 0 {
            // The Service's: DNAT'd to endpoint 1 + k % 999 (never endpoint 0).
            let e = ep(1 + k % 999);
            let t = Tuple {
                src: *e.ip(),
                dst: src,
                sport: e.port(),
                dport: sport,
                proto: 17,
                zone: 0,
            };
            let tag = CtTag {
                service: id,
                ..CtTag::default()
            };
            (vip, tag, Some(t))
        } else {
            (Ipv4Addr::new(10, 6, 0, 1), CtTag::default(), None)
        };
        let t = Tuple {
            src,
            dst,
            sport,
            dport: 53,
            proto: 17,
            zone: 0,
        };
        ct.insert(t, reply.unwrap_or(t.invert()), tag, &p, now)
            .unwrap();
    }
    assert_eq!(ct.len(), 1 << 20);
    let mut k = 0;
    g.bench_function("upsert_1000_endpoints_cleanup_1M_table", |b| {
        b.iter(|| {
            k ^= 1;
            nf.upsert_service(dns(k), now).unwrap()
        })
    });
    g.bench_function("upsert_1000_endpoints_tagged_flush_1M_table", |b| {
        b.iter(|| {
            k ^= 1;
            let (old, new) = (dns(k ^ 1), dns(k));
            nf.services().upsert(new.clone()).unwrap();
            let gone: Vec<_> = old
                .endpoints
                .iter()
                .filter(|e| !new.endpoints.iter().any(|n| n.addr == e.addr))
                .map(|e| (*e.addr.ip(), e.addr.port()))
                .collect();
            ct.retain(now, |v| {
                v.service != id
                    || v.orig.proto != 17
                    || !gone.contains(&(v.reply.src, v.reply.sport))
            })
        })
    });
    g.bench_function("upsert_1000_endpoints_table_only", |b| {
        b.iter(|| {
            k ^= 1;
            nf.services().upsert(dns(k)).unwrap()
        })
    });
    assert!(ct.len() > 1 << 19, "the other flows stay");
    g.finish();
}

criterion_group!(
    benches,
    established,
    established6,
    new_connections,
    parts,
    fragmented,
    stale_udp
);
criterion_main!(benches);
