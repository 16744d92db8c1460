//! A datapath with a router fed arbitrary frames on arbitrary ports, time moving forward by
//! arbitrary steps: never panics; the FDB and neighbour tables stay within their bounds;
//! every frame received is forwarded, flooded, answered, queued or counted as a drop; every
//! IPv4 frame the router sends has a valid header checksum, and nothing is sent to the
//! router's virtual port or to a port that does not exist.
//!
//! Input: records `[port: u8][dt: u8][len_hi: u8][len_lo: u8][frame bytes]`. To reach deep
//! into L3, a record whose first frame byte is 0 mod 4 is rewritten into a valid IPv4 packet
//! towards the router (addresses and TTL drawn from the input bytes), 2 mod 4 into an IPv6
//! one (UDP, echo, or NDP: NS/NA/RS with the rest of the record as options, behind an
//! extension-header chain drawn from the input); odd ones are raw. Both neighbour tables
//! (ARP and NDP) stay within their bounds.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::Duration;
use tapyard::l3::IfaceConfig;
use tapyard::l3::{NextHop, Route, RouteProto};
use tapyard::{Batch, BridgeConfig, Datapath, Instant, MacAddr, PacketBuf, PortId, Verdict};
use tapyard_testkit::frame::checksum_ok;

const GW: MacAddr = MacAddr([2, 0xaa, 0, 0, 0, 1]);
const UP: MacAddr = MacAddr([2, 0xaa, 0, 0, 0, 2]);

fn ipv4_packet(r: &[u8], mac: [u8; 6]) -> Vec<u8> {
    let g = |i: usize| r.get(i).copied().unwrap_or(0);
    let dsts = [
        [10, 244, 1, g(5)],
        [10, 244, 2, g(5)],
        [10, 244, 9, g(5)],
        [10, 244, 8, g(5)],
        [172, 18, 0, g(5)],
        [192, 0, 2, g(5)],
        [10, 244, 1, 1],
    ];
    let dst = dsts[usize::from(g(4)) % dsts.len()];
    let src = [10, 244, g(6) % 2 + 1, g(7)];
    let ttl = g(8) % 4;
    let payload_len = usize::from(g(9)) * 8;
    let mut f = Vec::new();
    let b = etherparse::PacketBuilder::ethernet2(mac, if g(10) & 1 == 0 { GW.0 } else { UP.0 })
        .ipv4(src, dst, ttl);
    let _ = if g(11) & 1 == 0 {
        b.udp(1, 2).write(&mut f, &vec![0u8; payload_len])
    } else {
        b.icmpv4_echo_request(1, 1)
            .write(&mut f, &vec![0u8; payload_len])
    };
    f
}

fn ipv6_packet(r: &[u8], mac: [u8; 6]) -> Vec<u8> {
    use tapyard::wire::icmpv6::{Echo, Icmpv6Packet, Icmpv6Repr, NaFlags};
    use tapyard::wire::ipv6;
    let g = |i: usize| r.get(i).copied().unwrap_or(0);
    let v6 = |a: u16, b: u16, h: u16| Ipv6Addr::new(0xfd00, 0, a, b, 0, 0, 0, h);
    let dsts = [
        v6(10, 1, u16::from(g(5))),
        v6(10, 2, u16::from(g(5))),
        v6(10, 9, 1),
        v6(10, 1, 1),
        Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, u16::from(g(5))),
        ipv6::solicited_node(v6(10, 1, u16::from(g(5)) % 4)),
        ipv6::ALL_ROUTERS,
    ];
    let dst = dsts[usize::from(g(4)) % dsts.len()];
    let src = if g(6) & 7 == 0 {
        Ipv6Addr::UNSPECIFIED
    } else {
        v6(10, 1, u16::from(g(7)))
    };
    let hop = if g(8) & 1 == 0 { 255 } else { g(8) % 4 };
    let dst_mac = if dst.is_multicast() {
        ipv6::multicast_mac(dst).0
    } else if g(10) & 1 == 0 {
        GW.0
    } else {
        UP.0
    };
    let body = r.get(12..).unwrap_or(&[]);
    let target = v6(10, 1, u16::from(g(9)) % 4);
    let mut l4 = vec![0u8; 8 + body.len() + 24];
    let (nh, l4len) = match g(11) % 5 {
        0 => {
            l4[..8].copy_from_slice(&[0, 1, 0, 53, 0, 8, 0, 0]);
            (ipv6::NH_UDP, 8)
        }
        1 => {
            let m = Icmpv6Repr::EchoRequest(Echo {
                ident: 1,
                seq_no: 2,
                data: body,
            });
            m.emit(
                &mut Icmpv6Packet::new_unchecked(&mut l4[..m.buffer_len()]),
                src,
                dst,
            );
            (ipv6::NH_ICMPV6, m.buffer_len())
        }
        k => {
            // NDP with raw options: type, fixed part, then the record's bytes.
            let m = match k {
                2 => Icmpv6Repr::NeighborSolicit {
                    target,
                    source_lladdr: None,
                },
                3 => Icmpv6Repr::NeighborAdvert {
                    flags: NaFlags {
                        router: false,
                        solicited: g(3) & 1 == 1,
                        override_: g(3) & 2 == 2,
                    },
                    target,
                    target_lladdr: None,
                },
                _ => Icmpv6Repr::RouterSolicit {
                    source_lladdr: None,
                },
            };
            let n = m.buffer_len();
            m.emit(&mut Icmpv6Packet::new_unchecked(&mut l4[..n]), src, dst);
            let opts = &body[..body.len() / 8 * 8];
            l4[n..n + opts.len()].copy_from_slice(opts);
            let total = n + opts.len();
            Icmpv6Packet::new_unchecked(&mut l4[..total]).fill_checksum(src, dst);
            (ipv6::NH_ICMPV6, total)
        }
    };
    // An extension-header chain: g(2) destination-options headers (up to 10).
    let nhdr = usize::from(g(2) % 11);
    let mut ext = Vec::new();
    for i in 0..nhdr {
        let next = if i + 1 == nhdr { nh } else { ipv6::NH_DSTOPTS };
        ext.extend_from_slice(&[next, 0, 1, 4, 0, 0, 0, 0]);
    }
    let first = if nhdr > 0 { ipv6::NH_DSTOPTS } else { nh };
    let plen = ext.len() + l4len;
    let mut f = vec![0u8; 14 + 40 + plen];
    f[..6].copy_from_slice(&dst_mac);
    f[6..12].copy_from_slice(&mac);
    f[12..14].copy_from_slice(&[0x86, 0xdd]);
    let repr = ipv6::Ipv6Repr {
        src_addr: src,
        dst_addr: dst,
        next_header: first,
        payload_len: plen,
        hop_limit: hop,
    };
    repr.emit(&mut ipv6::Ipv6Packet::new_unchecked(&mut f[14..]));
    f[54..54 + ext.len()].copy_from_slice(&ext);
    f[54 + ext.len()..].copy_from_slice(&l4[..l4len]);
    f
}

fuzz_target!(|data: &[u8]| {
    let mut b = Datapath::builder();
    let mut bc = BridgeConfig::new("cni0");
    bc.fdb_max_entries = 16;
    let br = b.add_bridge(bc).unwrap();
    for i in 0..3 {
        b.add_port(format!("pod{i}"), Some(br)).unwrap();
    }
    let mut c0 = IfaceConfig::new("cni0", GW, Ipv4Addr::new(10, 244, 1, 1), 24);
    c0.addr6 = Some((Ipv6Addr::new(0xfd00, 0, 10, 1, 0, 0, 0, 1), 64));
    c0.ra = Some(tapyard::l3::RaConfig::default());
    b.add_router_iface(c0, Some(br)).unwrap();
    let mut up = IfaceConfig::new("eth0", UP, Ipv4Addr::new(172, 18, 0, 2), 24);
    up.mtu = 576;
    let (eth0, _) = b.add_router_iface(up, None).unwrap();
    let mut nc = tapyard::l3::neigh::NeighConfig::default();
    nc.gc_thresh1 = 2;
    nc.gc_thresh2 = 4;
    nc.gc_thresh3 = 8;
    b.neigh_config(nc).unwrap();
    let dp = b.build();
    let route = |p: [u8; 4], nh| Route {
        prefix: Ipv4Addr::from(p),
        len: 24,
        next_hop: nh,
        metric: 0,
        proto: RouteProto::Static,
        src: None,
    };
    dp.control()
        .add_route(route(
            [10, 244, 2, 0],
            NextHop::Via(eth0, Ipv4Addr::new(172, 18, 0, 3)),
        ))
        .unwrap();
    dp.control()
        .add_route(route([10, 244, 9, 0], NextHop::Blackhole))
        .unwrap();
    dp.control()
        .add_route(route([10, 244, 8, 0], NextHop::Unreachable))
        .unwrap();
    let route6 = |p: u16, nh| tapyard::l3::Route {
        prefix: Ipv6Addr::new(0xfd00, 0, 10, p, 0, 0, 0, 0),
        len: 64,
        next_hop: nh,
        metric: 0,
        proto: RouteProto::Static,
        src: None,
    };
    dp.control()
        .add_route(route6(9, tapyard::l3::NextHop::Blackhole))
        .unwrap();
    dp.control()
        .add_route(route6(
            2,
            tapyard::l3::NextHop::Link(tapyard::l3::IfaceId(0)),
        ))
        .unwrap();
    let mut w = dp.worker();
    let mut now = Instant::from_secs(1);
    let mut batch = Batch::new();
    let mut rest = data;
    let mut received = 0u64;
    let check = |batch: &Batch| {
        for (buf, v) in batch.bufs().iter().zip(batch.verdicts()) {
            if let Verdict::Output(p) = v {
                // Never the router's virtual port, never a port that does not exist. (A routed
                // packet may leave through the port it came in on, as in Linux.)
                assert!(p.0 < 5 && p.0 != 3, "output to {p:?}");
            }
            if matches!(v, Verdict::Output(_) | Verdict::Flood(_)) {
                let f = buf.frame();
                if f.len() >= 34 && f[12..14] == [8, 0] && buf.port.0 >= 3 {
                    // Made or routed by the router: a valid header.
                    let hl = usize::from(f[14] & 15) * 4;
                    assert!(
                        checksum_ok(&f[14..14 + hl]),
                        "bad checksum out of the router"
                    );
                }
                if f.len() >= 54 && f[12..14] == [0x86, 0xdd] && buf.port.0 >= 3 {
                    // ICMPv6 the router made or routed: a valid checksum.
                    use tapyard::wire::{icmpv6::Icmpv6Packet, ipv6};
                    let i = ipv6::check(&f[14..]).expect("a valid IPv6 packet out of the router");
                    if i.next_header == ipv6::NH_ICMPV6 && !i.is_later_fragment() {
                        let m = Icmpv6Packet::new_checked(&f[14 + i.l4_off..14 + i.total_len()]);
                        assert!(
                            m.is_ok_and(|m| m.verify_checksum(i.src, i.dst)),
                            "bad ICMPv6 checksum"
                        );
                    }
                }
            }
        }
    };
    while rest.len() >= 4 {
        let (port, dt) = (rest[0], rest[1]);
        let len = usize::from(u16::from_be_bytes([rest[2], rest[3]]) % 2048);
        rest = &rest[4..];
        let len = len.min(rest.len());
        let raw = &rest[..len];
        rest = &rest[len..];
        let port = PortId(u16::from(port % 6)); // 3 is the router's virtual port, 5 unknown
        let mac = [2, 0, 0, 0, 1, raw.get(1).copied().unwrap_or(0) % 8];
        let frame = if raw.first().is_some_and(|b| b & 3 == 0) {
            ipv4_packet(raw, mac)
        } else if raw.first().is_some_and(|b| b & 3 == 2) {
            ipv6_packet(raw, mac)
        } else {
            raw.to_vec()
        };
        now = now + Duration::from_millis(u64::from(dt) * 50);
        let mut pb = PacketBuf::from_frame(&frame);
        pb.port = port;
        let _ = batch.push(pb);
        received += 1;
        if batch.is_full() || rest.len() < 4 {
            dp.process(&mut w, now, &mut batch);
            check(&batch);
            dp.dispatch(&mut w, &batch, |p, _| {
                assert!(p.0 < 5 && p.0 != 3, "sent to {p:?}");
                Ok(())
            });
            batch.recycle(&mut w.pool);
            dp.poll(&mut w, now, &mut batch);
            check(&batch);
            dp.dispatch(&mut w, &batch, |_, _| Ok(()));
            batch.recycle(&mut w.pool);
            let br = &dp.control().bridges()[0];
            assert!(br.fdb().counters().entries <= br.fdb().max_entries());
            let nc = dp
                .control()
                .router()
                .unwrap()
                .neigh::<std::net::Ipv4Addr>()
                .counters();
            assert!(nc.entries <= 8, "{nc:?}");
            let nc6 = dp
                .control()
                .router()
                .unwrap()
                .neigh::<std::net::Ipv6Addr>()
                .counters();
            assert!(nc6.entries <= 8, "{nc6:?}");
        }
    }
    // Let every queued packet resolve or fail.
    for _ in 0..60 {
        now = now + Duration::from_millis(100);
        dp.poll(&mut w, now, &mut batch);
        check(&batch);
        batch.recycle(&mut w.pool);
    }
    let s = dp.control().stats();
    assert_eq!(s.accounted(), received, "{s}");
});
