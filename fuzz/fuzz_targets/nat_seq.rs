//! A Kubernetes-like node with conntrack, Services (ClusterIP, NodePort, hairpin, no
//! endpoints) and masquerade, fed arbitrary frame sequences on its pod ports and its uplink,
//! time moving forward by arbitrary steps: never panics; the conntrack table stays within its
//! limit; every frame is accounted for; every IPv4 packet that leaves has valid IP and L4
//! checksums when it entered with valid ones; and translations are reversible: a forwarded
//! packet carries exactly the translation its connection records, and the reply to what left
//! maps back to the same connection.
//!
//! Input: records `[port: u8][dt: u8][len_hi: u8][len_lo: u8][bytes]`. A record whose first
//! byte is even becomes a well-formed TCP, UDP, ICMP echo or ICMP error packet between
//! addresses and ports drawn from a small set (pods, Service addresses, the node, outside), so
//! connections really form (when its second bit is also set: an IPv6 one, TCP, UDP, ICMPv6
//! echo or an ICMPv6 error, between IPv6 pods, IPv6 and dual-stack Service addresses, the
//! node and outside, checked the same way: L4 checksums after NAT, the IPv6 table's limit);
//! odd ones are sent raw.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::net::{Ipv4Addr, SocketAddrV4, SocketAddrV6};
use std::time::Duration;
use tapyard::conntrack::{CtConfig, Dir};
use tapyard::nat::{Endpoint, ServiceSpec};
use tapyard::wire::family::IpProto;
use tapyard::wire::tuple::{L4Kind, Tuple};
use tapyard::{Batch, PacketBuf, PortId, Verdict};
use tapyard_testkit::frame::ip6 as a6;
use tapyard_testkit::frame::l4_checksums_ok;
use tapyard_testkit::kube::{kube_node, KubeOptions, GW_MAC as GW, UP_MAC as UP};
const MAX_CT: usize = 64;

const ADDRS: [[u8; 4]; 8] = [
    [10, 244, 1, 2],
    [10, 244, 1, 3],
    [10, 244, 2, 2],
    [10, 96, 0, 10],
    [10, 96, 0, 11],
    [10, 96, 0, 99],
    [172, 18, 0, 2],
    [192, 0, 2, 9],
];
const ADDRS6: [&str; 8] = [
    "fd00:10:244:1::2",
    "fd00:10:244:1::3",
    "fd00:10:244:2::2",
    "fd00:10:96::10",
    "fd00:10:96::11",
    "fd00:10:96::99",
    "fd00:172:18::2",
    "2001:db8::9",
];

fn packet6(r: &[u8], src_mac: [u8; 6], dst_mac: [u8; 6]) -> Vec<u8> {
    let g = |i: usize| r.get(i).copied().unwrap_or(0);
    let src = a6(ADDRS6[usize::from(g(1)) % ADDRS6.len()]).octets();
    let dst = a6(ADDRS6[usize::from(g(2)) % ADDRS6.len()]).octets();
    let sport = PORTS[usize::from(g(3)) % PORTS.len()];
    let dport = PORTS[usize::from(g(4)) % PORTS.len()];
    let payload = vec![g(6); usize::from(g(7) % 32)];
    let mut f = Vec::new();
    let b = etherparse::PacketBuilder::ethernet2(src_mac, dst_mac).ipv6(src, dst, 64);
    let _ = match g(5) % 4 {
        0 => {
            let mut t = b.tcp(sport, dport, u32::from(g(8)), 1000);
            let fl = g(9);
            if fl & 1 != 0 {
                t = t.syn();
            }
            if fl & 2 != 0 {
                t = t.ack(7);
            }
            if fl & 4 != 0 {
                t = t.fin();
            }
            if fl & 8 != 0 {
                t = t.rst();
            }
            t.write(&mut f, &payload)
        }
        1 => b.udp(sport, dport).write(&mut f, &payload),
        2 => b.icmpv6_echo_request(sport, 1).write(&mut f, &payload),
        _ => {
            // An ICMPv6 error quoting a UDP packet between drawn addresses.
            let mut q = Vec::new();
            let _ = etherparse::PacketBuilder::ipv6(dst, src, 64)
                .udp(dport, sport)
                .write(&mut q, &payload);
            let ty = match g(8) % 3 {
                0 => etherparse::Icmpv6Type::PacketTooBig { mtu: 1280 },
                1 => etherparse::Icmpv6Type::DestinationUnreachable(
                    etherparse::icmpv6::DestUnreachableCode::Port,
                ),
                _ => etherparse::Icmpv6Type::TimeExceeded(
                    etherparse::icmpv6::TimeExceededCode::HopLimitExceeded,
                ),
            };
            b.icmpv6(ty).write(&mut f, &q)
        }
    };
    f
}

const PORTS: [u16; 6] = [80, 8080, 30080, 53, 40000, 40001];

fn packet(r: &[u8], src_mac: [u8; 6], dst_mac: [u8; 6]) -> Vec<u8> {
    let g = |i: usize| r.get(i).copied().unwrap_or(0);
    let src = ADDRS[usize::from(g(1)) % ADDRS.len()];
    let dst = ADDRS[usize::from(g(2)) % ADDRS.len()];
    let sport = PORTS[usize::from(g(3)) % PORTS.len()];
    let dport = PORTS[usize::from(g(4)) % PORTS.len()];
    let payload = vec![g(6); usize::from(g(7) % 32)];
    let mut f = Vec::new();
    let b = etherparse::PacketBuilder::ethernet2(src_mac, dst_mac).ipv4(src, dst, 64);
    let _ = match g(5) % 5 {
        0 => {
            let mut t = b.tcp(sport, dport, u32::from(g(8)), 1000);
            let fl = g(9);
            if fl & 1 != 0 {
                t = t.syn();
            }
            if fl & 2 != 0 {
                t = t.ack(7);
            }
            if fl & 4 != 0 {
                t = t.fin();
            }
            if fl & 8 != 0 {
                t = t.rst();
            }
            t.write(&mut f, &payload)
        }
        1 => b.udp(sport, dport).write(&mut f, &payload),
        2 => b.icmpv4_echo_request(sport, 1).write(&mut f, &payload),
        3 => b.icmpv4_echo_reply(sport, 1).write(&mut f, &payload),
        _ => {
            // An ICMP error quoting a UDP or TCP packet between drawn addresses.
            let mut q = Vec::new();
            let qb = etherparse::PacketBuilder::ipv4(
                ADDRS[usize::from(g(10)) % ADDRS.len()],
                ADDRS[usize::from(g(11)) % ADDRS.len()],
                64,
            );
            let _ = if g(12) & 1 == 0 {
                qb.udp(dport, sport).write(&mut q, &payload)
            } else {
                qb.tcp(dport, sport, 1, 1000).write(&mut q, &payload)
            };
            q.truncate(20 + 8 + usize::from(g(13) % 24));
            b.icmpv4(etherparse::Icmpv4Type::DestinationUnreachable(
                etherparse::icmpv4::DestUnreachableHeader::Port,
            ))
            .write(&mut f, &q)
        }
    };
    f
}

fuzz_target!(|data: &[u8]| {
    // The test kit's dual-stack Kubernetes node (pods 10.244.1.2/.3 and fd00:10:244:1::2/::3
    // on ports 0 and 1, eth0 on port 3), with small tables.
    let node = kube_node(KubeOptions {
        conntrack: Some(CtConfig {
            max_entries: MAX_CT,
            ..CtConfig::default()
        }),
        fdb_max_entries: Some(16),
        max_affinity_entries: Some(16),
        ..KubeOptions::default()
    });
    let mut now = node.now;
    let dp = node.dp;
    let nf = dp.control().netfilter().unwrap();
    let ep6 = |ip: &str, port| Endpoint::new(SocketAddrV6::new(a6(ip), port, 0, 0), true);
    let mut web6 = ServiceSpec::new("web6", a6("fd00:10:96::10"), 80, IpProto::TCP);
    web6.vip = Some(Ipv4Addr::new(10, 96, 0, 12));
    web6.node_port = Some(30081);
    web6.endpoints6 = vec![ep6("fd00:10:244:1::3", 8080), ep6("fd00:10:244:2::2", 8080)];
    nf.upsert_service(web6, now).unwrap();
    let mut dns6 = ServiceSpec::new("dns6", a6("fd00:10:96::10"), 53, IpProto::UDP);
    dns6.endpoints6 = vec![ep6("fd00:10:244:1::3", 53)];
    nf.upsert_service(dns6, now).unwrap();
    let mut me6 = ServiceSpec::new("self6", a6("fd00:10:96::11"), 80, IpProto::TCP);
    me6.endpoints6 = vec![ep6("fd00:10:244:1::2", 8080)];
    nf.upsert_service(me6, now).unwrap();
    nf.upsert_service(
        ServiceSpec::new("empty6", a6("fd00:10:96::99"), 80, IpProto::TCP),
        now,
    )
    .unwrap();
    let ep = |ip: [u8; 4], port| Endpoint::new(SocketAddrV4::new(ip.into(), port), true);
    let mut web = ServiceSpec::new("web", Ipv4Addr::from([10, 96, 0, 10]), 80, IpProto::TCP);
    web.node_port = Some(30080);
    web.endpoints = vec![ep([10, 244, 1, 3], 8080), ep([10, 244, 2, 2], 8080)];
    nf.upsert_service(web, now).unwrap();
    let mut udp = ServiceSpec::new("dns", Ipv4Addr::from([10, 96, 0, 10]), 53, IpProto::UDP);
    udp.endpoints = vec![ep([10, 244, 1, 3], 53)];
    nf.upsert_service(udp, now).unwrap();
    let mut me = ServiceSpec::new("self", Ipv4Addr::from([10, 96, 0, 11]), 80, IpProto::TCP);
    me.endpoints = vec![ep([10, 244, 1, 2], 8080)];
    nf.upsert_service(me, now).unwrap();
    nf.upsert_service(
        ServiceSpec::new("empty", Ipv4Addr::from([10, 96, 0, 99]), 80, IpProto::TCP),
        now,
    )
    .unwrap();
    let mut w = dp.worker_with_pool(tapyard::BufPool::new(2048, 128));
    let mut batch = Batch::new();
    let mut rest = data;
    let mut received = 0u64;
    // The pods announced themselves while the node was made.
    let announced = dp.control().stats().accounted();
    // Per batch entry: the tuple and kind of a generated (valid) packet, before processing.
    let mut gen: Vec<Option<(Tuple, L4Kind)>> = Vec::new();
    // Per batch entry: whether it is a generated (valid) IPv6 packet.
    let mut batch_src: Vec<bool> = Vec::new();
    while rest.len() >= 4 {
        let (port, dt) = (rest[0], rest[1]);
        let len = usize::from(u16::from_be_bytes([rest[2], rest[3]]) % 1024);
        rest = &rest[4..];
        let len = len.min(rest.len());
        let raw = &rest[..len];
        rest = &rest[len..];
        let port = PortId(u16::from(port % 4)); // 0, 1 pods; 2 cni0's virtual port; 3 eth0
        let src_mac = [2, 0, 0, 0, 1, 2 + raw.get(1).copied().unwrap_or(0) % 4];
        let dst_mac = if port.0 == 3 {
            UP.0
        } else if raw.get(14).is_some_and(|b| b & 1 == 1) {
            [2, 0, 0, 0, 1, 2 + raw.get(15).copied().unwrap_or(0) % 2]
        } else {
            GW.0
        };
        let (frame, info) = if raw.first().is_some_and(|b| b & 3 == 2) {
            (packet6(raw, src_mac, dst_mac), None)
        } else if raw.first().is_some_and(|b| b & 1 == 0) {
            let f = packet(raw, src_mac, dst_mac);
            let t = (f.len() > 34)
                .then(|| Tuple::from_ipv4(&f[14..], usize::from(f[14] & 15) * 4, f.len() - 14))
                .flatten();
            (f, t)
        } else {
            (raw.to_vec(), None)
        };
        now = now + Duration::from_millis(u64::from(dt) * 250);
        let mut pb = PacketBuf::from_frame(&frame);
        pb.port = port;
        let is6 = raw.first().is_some_and(|b| b & 3 == 2);
        if batch.push(pb).is_ok() {
            gen.push(info);
            batch_src.push(is6);
        }
        received += 1;
        if batch.is_full() || rest.len() < 4 {
            dp.process(&mut w, now, &mut batch);
            let ct = nf.conntrack();
            for (i, (buf, v)) in batch.bufs().iter().zip(batch.verdicts()).enumerate() {
                let f = buf.frame();
                let fwd = matches!(v, Verdict::Output(_) | Verdict::Flood(_));
                if fwd
                    && f.len() >= 34
                    && f[12..14] == [8, 0]
                    && gen.get(i).is_some_and(|g| g.is_some())
                {
                    assert!(l4_checksums_ok(&f[14..]), "bad checksum after NAT: {f:?}");
                }
                let generated6 = batch_src.get(i).is_some_and(|g| *g);
                if fwd && generated6 && f.len() >= 54 && f[12..14] == [0x86, 0xdd] {
                    assert!(
                        l4_checksums_ok(&f[14..]),
                        "bad IPv6 checksum after NAT: {f:?}"
                    );
                }
                // Reversibility: what left carries the translation its connection records,
                // and the reply to it belongs to the same connection.
                if let (true, Some(Some((t_in, kind)))) = (fwd, gen.get(i)) {
                    if matches!(kind, L4Kind::Tcp | L4Kind::Udp) && f.len() >= 34 {
                        let hl = usize::from(f[14] & 15) * 4;
                        if let Some((t_out, _)) = Tuple::from_ipv4(&f[14..], hl, f.len() - 14) {
                            if let Some(hit) = ct.lookup(t_in, now) {
                                let want = match hit.dir {
                                    Dir::Original => hit.reply.invert(),
                                    Dir::Reply => hit.orig.invert(),
                                };
                                assert_eq!(t_out, want, "translation differs from conntrack");
                                let back = ct.lookup(&t_out.invert(), now).expect("reply unknown");
                                assert_eq!(back.id, hit.id, "reply maps to another connection");
                            }
                        }
                    }
                }
            }
            dp.dispatch(&mut w, &batch, |p, _| {
                assert!(p.0 < 4 && p.0 != 2, "sent to {p:?}");
                Ok(())
            });
            batch.recycle(&mut w.pool);
            gen.clear();
            batch_src.clear();
            dp.poll(&mut w, now, &mut batch);
            dp.dispatch(&mut w, &batch, |_, _| Ok(()));
            batch.recycle(&mut w.pool);
            assert!(ct.len() <= MAX_CT, "conntrack over its limit: {}", ct.len());
            let ct6 = nf.conntrack_of::<std::net::Ipv6Addr>().len();
            assert!(ct6 <= MAX_CT, "IPv6 conntrack over its limit: {ct6}");
        }
    }
    let s = dp.control().stats();
    assert_eq!(s.accounted() - announced, received, "{s}");
});
