//! The bridge: flooding, learning, drops by reason, topology errors, station moves.

use super::*;
use crate::buf::Batch;
use crate::stats::DropReason;
use crate::time::Instant;
use crate::wire::mac::MacAddr;
use proptest::prelude::*;
use std::collections::HashMap;

fn frame(dst: MacAddr, src: MacAddr) -> Vec<u8> {
    let mut f = Vec::with_capacity(60);
    f.extend_from_slice(&dst.0);
    f.extend_from_slice(&src.0);
    f.extend_from_slice(&[0x08, 0x00]);
    f.resize(60, 0);
    f
}

fn run(dp: &Datapath, w: &mut Worker, now: Instant, port: PortId, f: &[u8]) -> Vec<PortId> {
    let mut batch = Batch::new();
    let mut b = PacketBuf::from_frame(f);
    b.port = port;
    batch.push(b).unwrap();
    dp.process(w, now, &mut batch);
    let mut out = Vec::new();
    dp.dispatch(w, &batch, |p, _| {
        out.push(p);
        Ok(())
    });
    out
}

fn two_bridges() -> (Datapath, [PortId; 5]) {
    let mut b = Datapath::builder();
    let b0 = b.add_bridge(BridgeConfig::new("br0")).unwrap();
    let b1 = b.add_bridge(BridgeConfig::new("br1")).unwrap();
    let p = [
        b.add_port("a0", Some(b0)).unwrap(),
        b.add_port("a1", Some(b0)).unwrap(),
        b.add_port("a2", Some(b0)).unwrap(),
        b.add_port("b0", Some(b1)).unwrap(),
        b.add_port("b1", Some(b1)).unwrap(),
    ];
    (b.build(), p)
}

#[test]
fn floods_unknown_then_forwards_learned_and_never_crosses_bridges() {
    let (dp, p) = two_bridges();
    let mut w = dp.worker();
    let (x, y) = (MacAddr::local(1), MacAddr::local(2));
    let t = Instant::ZERO;
    assert_eq!(run(&dp, &mut w, t, p[0], &frame(y, x)), vec![p[1], p[2]]);
    assert_eq!(run(&dp, &mut w, t, p[1], &frame(x, y)), vec![p[0]]);
    assert_eq!(run(&dp, &mut w, t, p[0], &frame(y, x)), vec![p[1]]);
    assert_eq!(
        run(&dp, &mut w, t, p[0], &frame(MacAddr::BROADCAST, x)),
        vec![p[1], p[2]]
    );
    // The other bridge knows nothing of x and y.
    assert_eq!(run(&dp, &mut w, t, p[3], &frame(x, y)), vec![p[4]]);
    assert_eq!(run(&dp, &mut w, t, p[4], &frame(y, x)), vec![p[3]]);
    let s = dp.control().stats();
    assert_eq!(s.port("a0").unwrap().rx_packets, 3);
    assert_eq!(s.port("a1").unwrap().tx_packets, 3);
    assert_eq!(s.forwarded + s.flooded + s.rx_drops(), 6);
}

#[test]
fn drops_are_counted_by_reason() {
    let (dp, p) = two_bridges();
    let mut w = dp.worker();
    let t = Instant::ZERO;
    let x = MacAddr::local(1);
    assert!(run(&dp, &mut w, t, p[0], &frame(x, MacAddr::BROADCAST)).is_empty());
    assert!(run(&dp, &mut w, t, p[0], &frame(x, MacAddr::ZERO)).is_empty());
    assert!(run(&dp, &mut w, t, p[0], &[1, 2, 3]).is_empty());
    assert!(run(&dp, &mut w, t, PortId(99), &frame(x, x)).is_empty());
    let lacp = MacAddr([0x01, 0x80, 0xc2, 0, 0, 0x02]);
    assert!(run(&dp, &mut w, t, p[1], &frame(lacp, MacAddr::local(5))).is_empty());
    let stp = MacAddr([0x01, 0x80, 0xc2, 0, 0, 0x00]);
    assert_eq!(
        run(&dp, &mut w, t, p[1], &frame(stp, MacAddr::local(5))).len(),
        2
    );
    // Destination learned on the ingress port: not sent back.
    run(&dp, &mut w, t, p[0], &frame(MacAddr::BROADCAST, x));
    assert!(run(&dp, &mut w, t, p[0], &frame(x, MacAddr::local(7))).is_empty());
    let s = dp.control().stats();
    for r in [
        DropReason::MulticastSource,
        DropReason::ZeroSource,
        DropReason::Truncated,
        DropReason::UnknownPort,
        DropReason::LinkLocal,
        DropReason::SamePort,
    ] {
        assert_eq!(s.drop_count(r), 1, "{r}");
    }
    // A failing port counts tx drops.
    let mut batch = Batch::new();
    let mut b = PacketBuf::from_frame(&frame(MacAddr::BROADCAST, x));
    b.port = p[0];
    batch.push(b).unwrap();
    dp.process(&mut w, t, &mut batch);
    dp.dispatch(&mut w, &batch, |_, _| Err(DropReason::TxError));
    let s = dp.control().stats();
    assert_eq!(s.drop_count(DropReason::TxError), 2);
    assert_eq!(s.port("a1").unwrap().tx_dropped, 1);
}

#[test]
fn builder_rejects_bad_topology_with_named_errors() {
    let mut b = Datapath::builder();
    let br = b.add_bridge(BridgeConfig::new("br0")).unwrap();
    let e = b.add_bridge(BridgeConfig::new("br0")).unwrap_err();
    assert_eq!(
        e.to_string(),
        "bridge name \"br0\" is used twice; names must be unique"
    );
    b.add_port("tap0", Some(br)).unwrap();
    assert!(b.add_port("tap0", Some(br)).is_err());
    assert!(b.add_port("a-very-long-interface-name", Some(br)).is_err());
    assert!(b.add_port("x", Some(BridgeId(7))).is_err());
    let mut c = BridgeConfig::new("br1");
    c.fdb_max_entries = 0;
    assert!(b
        .add_bridge(c)
        .unwrap_err()
        .to_string()
        .contains("fdb_max_entries = 0"));
}

#[test]
fn station_moves_are_relearned_at_once() {
    let (dp, p) = two_bridges();
    let mut w = dp.worker();
    let (x, y) = (MacAddr::local(1), MacAddr::local(2));
    let t = Instant::ZERO;
    run(&dp, &mut w, t, p[0], &frame(MacAddr::BROADCAST, x));
    run(&dp, &mut w, t, p[1], &frame(MacAddr::BROADCAST, y));
    assert_eq!(run(&dp, &mut w, t, p[1], &frame(x, y)), vec![p[0]]);
    run(&dp, &mut w, t, p[2], &frame(MacAddr::BROADCAST, x)); // x moved to a2
    assert_eq!(run(&dp, &mut w, t, p[1], &frame(x, y)), vec![p[2]]);
}

proptest! {
    /// The datapath's output ports match a plain-HashMap learning bridge for any sequence
    /// of frames on a 4-port bridge (table large enough, no aging in play).
    #[test]
    fn bridge_matches_hashmap_model(
        frames in proptest::collection::vec((0u16..4, 0u8..8, 0u8..8), 1..200)
    ) {
        let mut b = Datapath::builder();
        let br = b.add_bridge(BridgeConfig::new("br")).unwrap();
        let ports: Vec<_> = (0..4).map(|i| b.add_port(format!("p{i}"), Some(br)).unwrap()).collect();
        let dp = b.build();
        let mut w = dp.worker();
        let mut model: HashMap<MacAddr, PortId> = HashMap::new();
        let macs: Vec<MacAddr> = (0..7).map(|i| MacAddr::local(i + 1)).chain([MacAddr::BROADCAST]).collect();
        for (i, (inp, s, d)) in frames.into_iter().enumerate() {
            let (src, dst) = (macs[usize::from(s)], macs[usize::from(d)]);
            let inp = ports[usize::from(inp)];
            let got = run(&dp, &mut w, Instant::from_millis(i as u64), inp, &frame(dst, src));
            let want: Vec<PortId> = if src.is_multicast() {
                vec![]
            } else {
                model.insert(src, inp);
                match model.get(&dst) {
                    Some(&p) if !dst.is_multicast() => if p == inp { vec![] } else { vec![p] },
                    _ => ports.iter().copied().filter(|&p| p != inp).collect(),
                }
            };
            prop_assert_eq!(got, want);
        }
        let s = dp.control().stats();
        let rx: u64 = s.ports.iter().map(|p| p.rx_packets).sum();
        prop_assert_eq!(rx, s.forwarded + s.flooded + s.rx_drops());
    }
}

#[test]
fn a_refused_setting_is_the_error_source() {
    use std::error::Error;
    let mut b = Datapath::builder();
    let cfg = crate::l3::neigh::NeighConfig {
        unres_qlen: 0,
        ..Default::default()
    };
    let e = b.neigh_config(cfg).unwrap_err();
    assert!(matches!(e, ConfigError::Neigh(_)), "{e:?}");
    let src = e.source().expect("the neighbour error is the source");
    assert!(src.to_string().contains("unres_qlen"), "{src}");
}

/// One bridge with two ports made by the builder, and a datapath capacity of `max`.
fn small(max: usize) -> (Datapath, BridgeId, [PortId; 2]) {
    let mut b = Datapath::builder();
    b.max_ports(max).unwrap();
    let br = b.add_bridge(BridgeConfig::new("br0")).unwrap();
    let p = [
        b.add_port("a0", Some(br)).unwrap(),
        b.add_port("a1", Some(br)).unwrap(),
    ];
    (b.build(), br, p)
}

#[test]
fn ports_are_added_and_removed_at_run_time() {
    let (dp, br, p) = small(8);
    let mut w = dp.worker();
    let t = Instant::ZERO;
    let (x, y, z) = (MacAddr::local(1), MacAddr::local(2), MacAddr::local(3));
    let q = dp.control().add_port("veth0", br).unwrap();
    assert_eq!(q, PortId(2));
    assert_eq!(dp.control().port_count(), 3);
    assert_eq!(dp.control().port_bridge(q), Some(br));
    assert_eq!(
        dp.control().bridge(br).unwrap().ports(),
        vec![p[0], p[1], q]
    );
    // The new port floods, learns and is learned like the others.
    assert_eq!(
        run(&dp, &mut w, t, q, &frame(MacAddr::BROADCAST, z)),
        vec![p[0], p[1]]
    );
    assert_eq!(run(&dp, &mut w, t, p[0], &frame(z, x)), vec![q]);
    dp.control().bridge(br).unwrap().fdb().add_static(y, q);
    assert_eq!(dp.control().stats().port("veth0").unwrap().rx_packets, 1);
    // Removed: it leaves the flood list, its FDB entries (static too) go, it receives nothing.
    dp.control().remove_port(q).unwrap();
    assert_eq!(dp.control().port_count(), 2);
    assert_eq!(dp.control().port_name(q), None);
    assert_eq!(dp.control().port_bridge(q), None);
    assert!(dp.control().fdb_dump(br, t).iter().all(|e| e.port != q));
    assert_eq!(run(&dp, &mut w, t, p[0], &frame(z, x)), vec![p[1]]);
    assert!(run(&dp, &mut w, t, q, &frame(x, z)).is_empty());
    assert_eq!(dp.control().stats().drop_count(DropReason::UnknownPort), 1);
    assert!(dp.control().stats().port("veth0").is_none());
    // No worker was online: the id is free at once, with fresh counters.
    assert_eq!(dp.control().reclaim_ports(), 0);
    let q2 = dp.control().add_port("veth1", br).unwrap();
    assert_eq!(q2, q);
    assert_eq!(dp.control().stats().port("veth1").unwrap().rx_packets, 0);
    // Builder ports can go too.
    dp.control().remove_port(p[0]).unwrap();
    assert_eq!(dp.control().bridge(br).unwrap().ports(), vec![p[1], q2]);
}

#[test]
fn live_changes_are_refused_with_named_errors() {
    let (dp, br, p) = small(3);
    assert_eq!(
        dp.control().add_port("a0", br).unwrap_err().to_string(),
        "port name \"a0\" is used twice; names must be unique"
    );
    assert!(matches!(
        dp.control().add_port("no/slash", br),
        Err(ConfigError::BadName { .. })
    ));
    assert_eq!(
        dp.control().add_port("x", BridgeId(9)).unwrap_err(),
        ConfigError::NoSuchBridge(BridgeId(9))
    );
    let q = dp.control().add_port("x", br).unwrap();
    let e = dp.control().add_port("y", br).unwrap_err();
    assert_eq!(
        e,
        ConfigError::CapacityFull {
            name: "y".into(),
            max_ports: 3
        }
    );
    assert!(e.to_string().contains("all 3 port ids"), "{e}");
    dp.control().remove_port(q).unwrap();
    assert_eq!(dp.control().remove_port(q), Err(ConfigError::NoSuchPort(q)));
    assert_eq!(
        dp.control().remove_port(PortId(40)),
        Err(ConfigError::NoSuchPort(PortId(40)))
    );
    assert!(dp.control().remove_port(p[1]).is_ok());
    // The builder's capacity is checked too.
    let mut b = Datapath::builder();
    assert!(b.max_ports(0).is_err());
    assert!(b.max_ports(65536).is_err());
    b.max_ports(1).unwrap();
    b.add_port("one", None).unwrap();
    assert!(matches!(
        b.add_port("two", None),
        Err(ConfigError::CapacityFull { max_ports: 1, .. })
    ));
}

#[test]
fn router_ports_stay() {
    use crate::l3::router::IfaceConfig;
    let mut b = Datapath::builder();
    let br = b.add_bridge(BridgeConfig::new("br0")).unwrap();
    let (_, gw) = b
        .add_router_iface(
            IfaceConfig::new(
                "cni0",
                MacAddr::local(100),
                std::net::Ipv4Addr::from([10, 0, 0, 1]),
                24,
            ),
            Some(br),
        )
        .unwrap();
    let (_, up) = b
        .add_router_iface(
            IfaceConfig::new(
                "eth0",
                MacAddr::local(101),
                std::net::Ipv4Addr::from([192, 168, 0, 1]),
                24,
            ),
            None,
        )
        .unwrap();
    let dp = b.build();
    let e = dp.control().remove_port(gw).unwrap_err();
    assert!(
        e.to_string()
            .contains("\"cni0\" cannot be removed: it is a router interface's port"),
        "{e}"
    );
    assert!(matches!(
        dp.control().remove_port(up),
        Err(ConfigError::NotRemovable { .. })
    ));
    assert_eq!(dp.control().port_count(), 2);
}

#[test]
fn a_removed_id_is_quarantined_while_a_worker_holds_a_verdict_for_it() {
    let (dp, br, p) = small(8);
    let mut w = dp.worker();
    let mut other = dp.worker();
    let t = Instant::ZERO;
    let (x, z) = (MacAddr::local(1), MacAddr::local(3));
    let q = dp.control().add_port("veth0", br).unwrap();
    run(&dp, &mut w, t, q, &frame(MacAddr::BROADCAST, z));
    // A frame for q is classified...
    let mut batch = Batch::new();
    let mut b = PacketBuf::from_frame(&frame(z, x));
    b.port = p[0];
    batch.push(b).unwrap();
    dp.process(&mut w, t, &mut batch);
    assert_eq!(batch.verdicts()[0], crate::base::Verdict::Output(q));
    // ...then q is removed and a new port comes: it must not get q's id yet.
    dp.control().remove_port(q).unwrap();
    assert_eq!(dp.control().reclaim_ports(), 1);
    let r = dp.control().add_port("veth1", br).unwrap();
    assert_ne!(r, q);
    // The frame is dropped and counted, not sent to anyone.
    let mut sent = Vec::new();
    dp.dispatch(&mut w, &batch, |port, _| {
        sent.push(port);
        Ok(())
    });
    assert!(sent.is_empty());
    let s = dp.control().stats();
    assert_eq!(s.drop_count(DropReason::PortGone), 1);
    // Two frames received (one on q, whose counters left the snapshot with it), both
    // accounted for.
    assert_eq!(s.accounted(), 2);
    assert_eq!(s.forwarded + s.flooded, 2);
    // The worker has passed a quiescent point; a worker that never ran holds nothing.
    assert_eq!(dp.control().reclaim_ports(), 0);
    assert_eq!(dp.control().add_port("veth2", br).unwrap(), q);
    // A worker that processed but never dispatched keeps the quarantine until it quiesces
    // (or is dropped).
    dp.process(&mut other, t, &mut Batch::new());
    dp.control().remove_port(r).unwrap();
    assert_eq!(dp.control().reclaim_ports(), 1);
    dp.quiesce(&mut other);
    assert_eq!(dp.control().reclaim_ports(), 0);
    dp.process(&mut other, t, &mut Batch::new());
    let r2 = dp.control().add_port("veth3", br).unwrap();
    dp.control().remove_port(r2).unwrap();
    assert_eq!(dp.control().reclaim_ports(), 1);
    drop(other);
    assert_eq!(dp.control().reclaim_ports(), 0);
}

#[test]
fn ids_are_reused_and_the_capacity_is_never_exceeded() {
    let (dp, br, _) = small(6);
    let mut w = dp.worker();
    let mut seen = std::collections::BTreeSet::new();
    for i in 0..1000u32 {
        let q = dp.control().add_port(&format!("v{}", i % 7), br).unwrap();
        seen.insert(q);
        run(
            &dp,
            &mut w,
            Instant::ZERO,
            q,
            &frame(MacAddr::BROADCAST, MacAddr::local(i + 1)),
        );
        dp.control().remove_port(q).unwrap();
    }
    assert_eq!(seen.len(), 1, "one id, reused: {seen:?}");
    assert_eq!(dp.control().port_count(), 2);
    assert_eq!(dp.control().bridge(br).unwrap().fdb().counters().entries, 0);
}

/// The dumps' JSON with the `serde` feature: ids as numbers, MACs and drop reasons as text.
#[cfg(feature = "serde")]
#[test]
fn dumps_serialize() {
    use crate::l3::route::{NextHop, Route, RouteProto};
    use std::net::Ipv4Addr;
    let (dp, p) = two_bridges();
    let mut w = dp.worker();
    let (a, b) = (MacAddr([2, 0, 0, 0, 0, 1]), MacAddr([2, 0, 0, 0, 0, 2]));
    run(&dp, &mut w, Instant::ZERO, p[0], &frame(b, a));
    let fdb = dp.control().fdb_dump(BridgeId(0), Instant::from_secs(2));
    assert_eq!(
        serde_json::to_string(&fdb).unwrap(),
        r#"[{"mac":"02:00:00:00:00:01","port":0,"age":{"secs":2,"nanos":0}}]"#
    );
    let s = serde_json::to_value(dp.control().stats()).unwrap();
    assert_eq!(s["flooded"], 1);
    assert_eq!(s["ports"][0]["name"], "a0");
    assert_eq!(s["ports"][0]["rx_packets"], 1);
    assert_eq!(s["drops"][0][0], "truncated");
    let r = Route {
        prefix: Ipv4Addr::new(10, 244, 1, 0),
        len: 24,
        next_hop: NextHop::Via(IfaceId(1), Ipv4Addr::new(10, 244, 1, 0)),
        metric: 0,
        proto: RouteProto::Static,
        src: None,
    };
    assert_eq!(
        serde_json::to_string(&r).unwrap(),
        r#"{"prefix":"10.244.1.0","len":24,"next_hop":{"via":[1,"10.244.1.0"]},"metric":0,"proto":"static","src":null}"#
    );
}
