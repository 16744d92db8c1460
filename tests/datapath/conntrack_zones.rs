//! Conntrack zones: one tuple in two zones is two connections, each found only from its own
//! zone, in both directions (as Linux's `nf_conntrack_zone`). The datapath tracks everything in
//! zone 0 (one routing domain); an embedder running several domains over one table gives each
//! its own zone in the tuples it looks up.

use std::net::Ipv4Addr;

use tapyard::conntrack::{tcp::flags, Conntrack, CtConfig, CtTag, Dir, Pkt};
use tapyard::wire::tuple::{L4Kind, Tuple};
use tapyard::Instant;

#[test]
fn one_tuple_in_two_zones_is_two_connections() {
    let ct = Conntrack::new(CtConfig::default()).unwrap();
    let now = Instant::from_secs(1);
    let t = |zone| Tuple {
        src: Ipv4Addr::new(10, 244, 1, 2),
        dst: Ipv4Addr::new(10, 96, 0, 10),
        sport: 40000,
        dport: 80,
        proto: 6,
        zone,
    };
    let syn = Pkt {
        kind: L4Kind::Tcp,
        tcp_flags: flags::SYN,
        len: 60,
    };
    // Zone 1 DNATs to one endpoint, zone 2 to another: same original tuple otherwise.
    let reply1 = Tuple {
        src: Ipv4Addr::new(10, 244, 1, 3),
        sport: 8080,
        ..t(1).invert()
    };
    let reply2 = Tuple {
        src: Ipv4Addr::new(10, 244, 2, 3),
        sport: 8080,
        ..t(2).invert()
    };
    let a = ct
        .insert(t(1), reply1, CtTag::default(), &syn, now)
        .unwrap();
    let b = ct
        .insert(t(2), reply2, CtTag::default(), &syn, now)
        .unwrap();
    assert_ne!(a.id, b.id);
    assert_eq!(ct.len(), 2);
    assert_eq!(ct.lookup(&t(1), now).unwrap().reply, reply1);
    assert_eq!(ct.lookup(&t(2), now).unwrap().reply, reply2);
    assert!(
        ct.lookup(&t(0), now).is_none(),
        "zone 0 has no such connection"
    );
    let back = ct.lookup(&reply2, now).unwrap();
    assert_eq!((back.id, back.dir), (b.id, Dir::Reply));
    // A reply tuple of zone 1 is not found in zone 2.
    let wrong = Tuple { zone: 2, ..reply1 };
    assert!(ct.lookup(&wrong, now).is_none());
    let dump = ct.fmt_dump(now);
    assert!(dump.contains("zone=1") && dump.contains("zone=2"), "{dump}");
}
