//! Frames per second through the whole datapath with in-memory ports: 4 stations on a 4-port
//! bridge, each port holding a batch of 32 64-byte frames for the next station. Timed: one
//! pump round, which receives each port's batch, processes it and transmits every frame into
//! its destination port's queue (a copy). Not timed: the host ends queueing the frames and
//! draining the results. Beside it, the same round with a `Mutex<HashMap>` bridge in place of
//! the datapath.
//!
//! `datapath_vxlan`: the same 64-byte packets from 4 pods on node A to 4 pods on node C over
//! VXLAN (A encapsulates, the frames cross to C's uplink, C decapsulates and routes them).
//!
//! `cargo bench --bench datapath`
#![allow(
    clippy::cast_possible_truncation,
    reason = "bench fixtures: small loop counters and random draws narrowed into addresses, ports and ids"
)]

use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use tapyard::port::{mem_pair, MemPort, Port};
use tapyard::runtime::Pump;
use tapyard::{Batch, BridgeConfig, BufPool, Datapath, Instant, PortId, BATCH_SIZE};

use common::{frame, mac_of, MutexBridge, Out};
use tapyard_testkit::bench as common;

const PORTS: usize = 4;

struct Rig {
    hosts: Vec<MemPort>,
    bridge_ends: Vec<Arc<MemPort>>,
    frames: Vec<Vec<u8>>,
}

fn rig() -> Rig {
    let mut hosts = Vec::new();
    let mut bridge_ends = Vec::new();
    for p in 0..PORTS {
        let (a, h) = mem_pair(&format!("p{p}"), &format!("h{p}"), 4 * BATCH_SIZE);
        bridge_ends.push(Arc::new(a));
        hosts.push(h);
    }
    // Host p sends to host (p + 1) % PORTS.
    let frames = (0..PORTS)
        .map(|p| frame(mac_of(((p + 1) % PORTS) as u32), mac_of(p as u32)))
        .collect();
    Rig {
        hosts,
        bridge_ends,
        frames,
    }
}

impl Rig {
    fn inject(&self) {
        for (h, f) in self.hosts.iter().zip(&self.frames) {
            for _ in 0..BATCH_SIZE {
                h.send_frame(f).unwrap();
            }
        }
    }
    fn drain(&self) -> usize {
        let mut n = 0;
        for h in &self.hosts {
            while let Some(b) = h.recv_frame() {
                n += 1;
                h.recycle(b);
            }
        }
        n
    }
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("datapath_mem_ports");
    g.throughput(Throughput::Elements((PORTS * BATCH_SIZE) as u64));

    let r = rig();
    let mut b = Datapath::builder();
    let br = b.add_bridge(BridgeConfig::new("br0")).unwrap();
    let ports: Vec<(PortId, Arc<dyn Port>)> = r
        .bridge_ends
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let id = b.add_port(format!("p{i}"), Some(br)).unwrap();
            (id, e.clone() as Arc<dyn Port>)
        })
        .collect();
    let dp = Arc::new(b.build());
    let mut pump = Pump::new(dp.clone(), &ports).unwrap();
    // Warm up: learn every station.
    r.inject();
    pump.drain(Instant::ZERO, 8);
    r.drain();
    g.bench_function("tapyard", |bch| {
        bch.iter_batched(
            || {
                r.drain();
                r.inject();
            },
            |()| black_box(pump.poll(Instant::ZERO).unwrap()),
            BatchSize::PerIteration,
        )
    });
    let s = dp.control().stats();
    assert_eq!(s.rx_drops(), 0, "{s}");

    let r = rig();
    let base = MutexBridge::new(PORTS);
    let mut pool = BufPool::default();
    let mut batch = Batch::new();
    g.bench_function("mutex_hashmap", |bch| {
        bch.iter_batched(
            || {
                r.drain();
                r.inject();
            },
            |()| {
                for (i, port) in r.bridge_ends.iter().enumerate() {
                    port.recv_batch(&mut pool, &mut batch).unwrap();
                    for buf in batch.bufs() {
                        match base.decide(buf.frame(), PortId(i as u16), Instant::ZERO) {
                            Out::One(p) => {
                                let _ = r.bridge_ends[usize::from(p.0)].send(buf);
                            }
                            Out::Flood => {
                                for (j, o) in r.bridge_ends.iter().enumerate() {
                                    if j != i {
                                        let _ = o.send(buf);
                                    }
                                }
                            }
                            Out::Drop => {}
                        }
                    }
                    batch.recycle(&mut pool);
                }
            },
            BatchSize::PerIteration,
        )
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches, routed_benches, vxlan_benches);

/// IPv4 (`tapyard`) and IPv6 (`tapyard_ipv6`) forwarding through the whole datapath: 64-byte UDP packets from 4 hosts on bridge
/// br0 (10.0.0.0/24) to 4 hosts on bridge br1 (10.0.1.0/24), routed by the router interfaces
/// of both bridges with neighbours resolved; in-memory ports; one pump round per iteration
/// (bridge lookup, router: header check, LPM, neighbour, TTL and MAC rewrite, bridge lookup on
/// the far side, copy into the output queue). Beside it, the bridge-only round above.
fn routed(c: &mut Criterion) {
    use std::net::Ipv4Addr;
    use tapyard::l3::IfaceConfig;
    use tapyard::MacAddr;

    let mut g = c.benchmark_group("datapath_routed");
    g.throughput(Throughput::Elements((PORTS * BATCH_SIZE) as u64));
    let mut b = Datapath::builder();
    let br0 = b.add_bridge(BridgeConfig::new("br0")).unwrap();
    let br1 = b.add_bridge(BridgeConfig::new("br1")).unwrap();
    let gw0 = MacAddr::local(0xfe00);
    let gw1 = MacAddr::local(0xfe01);
    let v6 = |i: u16, h: u16| std::net::Ipv6Addr::new(0xfd00, 0, i, 0, 0, 0, 0, h);
    let mut c0 = IfaceConfig::new("gw0", gw0, Ipv4Addr::new(10, 0, 0, 254), 24);
    c0.addr6 = Some((v6(0, 0xfe), 64));
    let mut c1 = IfaceConfig::new("gw1", gw1, Ipv4Addr::new(10, 0, 1, 254), 24);
    c1.addr6 = Some((v6(1, 0xfe), 64));
    let (if0, _) = b.add_router_iface(c0, Some(br0)).unwrap();
    let (if1, _) = b.add_router_iface(c1, Some(br1)).unwrap();
    let mut hosts = Vec::new();
    let mut ports: Vec<(PortId, Arc<dyn Port>)> = Vec::new();
    let mut sinks = Vec::new();
    for i in 0..PORTS {
        // Senders on br0, receivers on br1.
        let (a, h) = mem_pair(&format!("s{i}"), "h", 4 * BATCH_SIZE);
        let id = b.add_port(format!("s{i}"), Some(br0)).unwrap();
        ports.push((id, Arc::new(a)));
        hosts.push(h);
        let (a, h) = mem_pair(&format!("r{i}"), "h", 4 * BATCH_SIZE);
        let id = b.add_port(format!("r{i}"), Some(br1)).unwrap();
        ports.push((id, Arc::new(a)));
        sinks.push(h);
    }
    let dp = Arc::new(b.build());
    let now = Instant::from_secs(1);
    let src_mac = |i: usize| MacAddr::local(0x100 + i as u32);
    let dst_mac = |i: usize| MacAddr::local(0x200 + i as u32);
    for i in 0..PORTS {
        let ip = Ipv4Addr::new(10, 0, 1, 10 + i as u8);
        dp.control()
            .add_static_neigh(if1, ip, dst_mac(i), now)
            .unwrap();
        let ip = Ipv4Addr::new(10, 0, 0, 10 + i as u8);
        dp.control()
            .add_static_neigh(if0, ip, src_mac(i), now)
            .unwrap();
        dp.control()
            .add_static_neigh(if1, v6(1, 10 + i as u16), dst_mac(i), now)
            .unwrap();
        dp.control()
            .add_static_neigh(if0, v6(0, 10 + i as u16), src_mac(i), now)
            .unwrap();
    }
    // The same packets over IPv6 (UDP, 18 bytes of payload).
    let frames6: Vec<Vec<u8>> = (0..PORTS)
        .map(|i| {
            let mut f = Vec::new();
            etherparse::PacketBuilder::ethernet2(src_mac(i).0, gw0.0)
                .ipv6(
                    v6(0, 10 + i as u16).octets(),
                    v6(1, 10 + i as u16).octets(),
                    64,
                )
                .udp(1000, 2000)
                .write(&mut f, &[0u8; 18])
                .unwrap();
            f
        })
        .collect();
    let frames: Vec<Vec<u8>> = (0..PORTS)
        .map(|i| {
            let mut f = Vec::new();
            etherparse::PacketBuilder::ethernet2(src_mac(i).0, gw0.0)
                .ipv4([10, 0, 0, 10 + i as u8], [10, 0, 1, 10 + i as u8], 64)
                .udp(1000, 2000)
                .write(&mut f, &[0u8; 18])
                .unwrap();
            f
        })
        .collect();
    let mut pump = Pump::new(dp.clone(), &ports).unwrap();
    // Receivers announce themselves so br1 learns their ports.
    for (i, s) in sinks.iter().enumerate() {
        let mut f = vec![0xff; 6];
        f.extend_from_slice(&dst_mac(i).0);
        f.extend_from_slice(&[0x88, 0xb5]);
        f.resize(60, 0);
        s.send_frame(&f).unwrap();
    }
    let inject_frames = |frames: &[Vec<u8>]| {
        for (h, f) in hosts.iter().zip(frames) {
            for _ in 0..BATCH_SIZE {
                h.send_frame(f).unwrap();
            }
        }
    };
    let inject = || inject_frames(&frames);
    let inject6 = || inject_frames(&frames6);
    let drain = || {
        for s in &sinks {
            while let Some(b) = s.recv_frame() {
                s.recycle(b);
            }
        }
        for h in &hosts {
            while let Some(b) = h.recv_frame() {
                h.recycle(b);
            }
        }
    };
    inject();
    pump.drain(now, 8);
    drain();
    common::bench_batched(
        &mut g,
        "datapath_routed",
        "tapyard",
        || {
            drain();
            inject();
        },
        |()| black_box(pump.poll(now).unwrap()),
    );
    // IPv6, same run (header check and extension-header walk, LPM on the IPv6 FIB, NDP
    // neighbour, hop limit and MAC rewrite).
    inject6();
    pump.drain(now, 8);
    drain();
    common::bench_batched(
        &mut g,
        "datapath_routed",
        "tapyard_ipv6",
        || {
            drain();
            inject6();
        },
        |()| black_box(pump.poll(now).unwrap()),
    );
    let s = dp.control().stats();
    assert_eq!(s.rx_drops(), 0, "{s}");
    assert!(s.forwarded >= (PORTS * BATCH_SIZE) as u64, "{s}");
    g.finish();
}

criterion_group!(routed_benches, routed);

/// Encapsulation and decapsulation: 4 pods on node A send 64-byte UDP packets to 4 pods on
/// node C through `flannel.1` (routed, encapsulated, out of A's uplink); the frames are moved
/// to C's uplink (one copy each, the wire) and C decapsulates and routes them to its pods.
/// One iteration: A's pump round (128 packets) and C's rounds until its uplink is empty.
fn vxlan(c: &mut Criterion) {
    use std::net::Ipv4Addr;
    use tapyard::l3::{IfaceConfig, VxlanConfig, VxlanPeer};
    use tapyard::MacAddr;

    struct Node {
        dp: Arc<Datapath>,
        pump: std::cell::RefCell<Pump>,
        pods: Vec<MemPort>,
        wire: MemPort,
        gw: MacAddr,
    }
    let node = |n: u8| {
        let other = 4 - n;
        let mut b = Datapath::builder();
        let br = b.add_bridge(BridgeConfig::new("cni0")).unwrap();
        let gw = MacAddr::local(0xfe00 + u32::from(n));
        let (cni0, _) = b
            .add_router_iface(
                IfaceConfig::new("cni0", gw, Ipv4Addr::new(10, 244, n, 1), 24),
                Some(br),
            )
            .unwrap();
        let up_mac = MacAddr::local(0xfd00 + u32::from(n));
        let (eth0, up) = b
            .add_router_iface(
                IfaceConfig::new("eth0", up_mac, Ipv4Addr::new(172, 18, 0, n), 24),
                None,
            )
            .unwrap();
        b.add_vxlan(VxlanConfig::new(
            "flannel.1",
            1,
            8472,
            "eth0",
            Ipv4Addr::new(10, 244, n, 0),
        ))
        .unwrap();
        let mut ports: Vec<(PortId, Arc<dyn Port>)> = Vec::new();
        let mut pods = Vec::new();
        for i in 0..PORTS {
            let (a, h) = mem_pair(&format!("pod{i}"), "h", 4 * BATCH_SIZE);
            ports.push((
                b.add_port(format!("pod{i}"), Some(br)).unwrap(),
                Arc::new(a),
            ));
            pods.push(h);
        }
        let (a, wire) = mem_pair("eth0", "wire", 8 * BATCH_SIZE);
        ports.push((up, Arc::new(a)));
        let dp = Arc::new(b.build());
        let now = Instant::from_secs(1);
        let peer = VxlanPeer {
            node_ip: Ipv4Addr::new(172, 18, 0, other).into(),
            vtep_mac: tapyard::l3::vxlan::default_mac(Ipv4Addr::new(10, 244, other, 0)),
            pod_cidr: Ipv4Addr::new(10, 244, other, 0).into(),
            pod_prefix_len: 24,
        };
        dp.control().add_vxlan_peer("flannel.1", peer, now).unwrap();
        dp.control()
            .add_static_neigh(
                eth0,
                Ipv4Addr::new(172, 18, 0, other),
                MacAddr::local(0xfd00 + u32::from(other)),
                now,
            )
            .unwrap();
        for i in 0..PORTS {
            let ip = Ipv4Addr::new(10, 244, n, 10 + i as u8);
            dp.control()
                .add_static_neigh(
                    cni0,
                    ip,
                    MacAddr::local(0x100 * u32::from(n) + i as u32),
                    now,
                )
                .unwrap();
        }
        let pump = std::cell::RefCell::new(Pump::new(dp.clone(), &ports).unwrap());
        Node {
            dp,
            pump,
            pods,
            wire,
            gw,
        }
    };
    let (a, z) = (node(1), node(3));
    let now = Instant::from_secs(1);
    let frames: Vec<Vec<u8>> = (0..PORTS)
        .map(|i| {
            let mut f = Vec::new();
            etherparse::PacketBuilder::ethernet2(MacAddr::local(0x100 + i as u32).0, a.gw.0)
                .ipv4([10, 244, 1, 10 + i as u8], [10, 244, 3, 10 + i as u8], 64)
                .udp(1000 + i as u16, 2000)
                .write(&mut f, &[0u8; 18])
                .unwrap();
            f
        })
        .collect();
    // C's pods announce themselves so its bridge learns their ports.
    for (i, p) in z.pods.iter().enumerate() {
        let mut f = vec![0xff; 6];
        f.extend_from_slice(&MacAddr::local(0x300 + i as u32).0);
        f.extend_from_slice(&[0x88, 0xb5]);
        f.resize(60, 0);
        p.send_frame(&f).unwrap();
    }
    z.pump.borrow_mut().drain(now, 4);
    let inject = |a: &Node| {
        for (h, f) in a.pods.iter().zip(&frames) {
            for _ in 0..BATCH_SIZE {
                h.send_frame(f).unwrap();
            }
        }
    };
    let drain = |n: &Node| {
        for p in &n.pods {
            while let Some(b) = p.recv_frame() {
                p.recycle(b);
            }
        }
    };
    let round = |a: &Node, z: &Node| {
        let mut n = a.pump.borrow_mut().poll(now).unwrap();
        while let Some(f) = a.wire.recv_frame() {
            z.wire.send_frame(f.frame()).unwrap();
            a.wire.recycle(f);
        }
        for _ in 0..8 {
            n += z.pump.borrow_mut().poll(now).unwrap();
        }
        n
    };
    let mut g = c.benchmark_group("datapath_vxlan");
    g.throughput(Throughput::Elements((PORTS * BATCH_SIZE) as u64));
    inject(&a);
    round(&a, &z);
    drain(&z);
    g.bench_function("tapyard_encap_decap", |bch| {
        bch.iter_batched(
            || {
                drain(&z);
                inject(&a);
            },
            |()| black_box(round(&a, &z)),
            BatchSize::PerIteration,
        )
    });
    for (name, n) in [("A", &a), ("C", &z)] {
        let s = n.dp.control().stats();
        assert_eq!(s.rx_drops(), 0, "node {name}: {s}");
    }
    assert!(z.dp.control().stats().forwarded >= (PORTS * BATCH_SIZE) as u64);
    g.finish();
}

criterion_group!(vxlan_benches, vxlan);
