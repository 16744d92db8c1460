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
    let s = dp.stats();
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
    let s = dp.stats();
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
    let s = dp.stats();
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
        let s = dp.stats();
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
