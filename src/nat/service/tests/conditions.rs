//! Endpoint conditions: kube-proxy's `CategorizeEndpoints` for both policies, as a table
//! run over both families and both algorithms.

use super::*;

/// Ready (`R`), serving and terminating (`T`), neither (`N`: ready false, serving false),
/// serving but neither ready nor terminating (`S`), ready but not serving (`P`:
/// publishNotReadyAddresses), terminating and not serving (`X`).
const R: EndpointConditions = EndpointConditions::READY;
const T: EndpointConditions = EndpointConditions::TERMINATING;
const N: EndpointConditions = EndpointConditions {
    ready: false,
    serving: false,
    terminating: false,
};
const S: EndpointConditions = EndpointConditions {
    ready: false,
    serving: true,
    terminating: false,
};
const P: EndpointConditions = EndpointConditions {
    ready: true,
    serving: false,
    terminating: false,
};
const X: EndpointConditions = EndpointConditions {
    ready: false,
    serving: false,
    terminating: true,
};

/// A row: the endpoints (local, conditions), then the indices of the cluster set and of the
/// local set.
type Row = (
    &'static [(bool, EndpointConditions)],
    &'static [u8],
    &'static [u8],
);

const TABLE: &[Row] = &[
    // All ready: every endpoint; the local ones.
    (&[(true, R), (false, R)], &[0, 1], &[0]),
    // All ready and local: one set serves both.
    (&[(true, R), (true, R)], &[0, 1], &[0, 1]),
    // Some ready: only those; the local set falls back on its own to a terminating local
    // endpoint while a remote one is ready.
    (&[(false, R), (true, T), (true, N)], &[0], &[1]),
    // A ready local endpoint wins over a terminating local one.
    (&[(true, R), (true, T), (false, R)], &[0, 2], &[0]),
    // None ready: the serving terminating ones, cluster-wide and locally.
    (&[(false, T), (true, T), (false, N)], &[0, 1], &[1]),
    // None ready, none local usable: the local set is empty (DROP under a Local policy).
    (&[(false, T), (true, N), (true, S)], &[0], &[]),
    // Only remote endpoints: the local set is empty.
    (&[(false, R)], &[0], &[]),
    // None usable: not ready and not (serving and terminating): both sets empty (REJECT).
    (&[(true, N), (false, S), (true, X)], &[], &[]),
    // Ready but not serving (publishNotReadyAddresses): used, as kube-proxy's IsReady.
    (&[(false, P), (true, T)], &[0], &[1]),
    // No endpoints at all.
    (&[], &[], &[]),
];

both_families!(
    categorize_endpoints_table,
    affinity_leaves_an_endpoint_that_stops_being_ready
);

fn categorize_endpoints_table<A: Fx>() {
    let s = Services::new(64);
    for algo in [LbAlgo::Random, LbAlgo::Maglev] {
        for (row, &(eps, cluster, local)) in TABLE.iter().enumerate() {
            let mut a = A::spec("web", 0);
            a.algo = algo;
            *A::eps_mut(&mut a) = eps
                .iter()
                .zip(1u8..)
                .map(|(&(l, c), i)| A::ep(i, 80, l).with_conditions(c))
                .collect();
            s.upsert(a.clone()).unwrap();
            let r = s.by_vip(A::VIP, 80, PROTO_TCP).unwrap();
            let addr = |i: &u8| A::eps_mut(&mut a.clone())[usize::from(*i)].addr;
            for (local_only, want) in [(false, cluster), (true, local)] {
                let want: Vec<A::SocketAddr> = want.iter().map(addr).collect();
                let ctx = format!("row {row} {algo:?} local_only {local_only}");
                assert_eq!(r.eligible::<A>(local_only), &want[..], "{ctx}");
                let mut rng = Rng::new(row as u64 + 1);
                let seen: HashSet<A::SocketAddr> = (0..300u64)
                    .filter_map(|i| {
                        let h = i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
                        s.select(&r, A::CLIENT, h, rng.next_u64(), local_only, Instant::ZERO)
                    })
                    .collect();
                assert_eq!(seen, want.iter().copied().collect(), "{ctx}");
                for e in A::eps_mut(&mut a.clone()).iter() {
                    let ok = want.contains(&e.addr);
                    assert_eq!(r.has_endpoint(e.addr, local_only), ok, "{ctx} {e:?}");
                }
            }
            assert_eq!(
                r.has_usable_endpoints::<A>(),
                !cluster.is_empty(),
                "row {row}"
            );
        }
    }
    // The listing shows each endpoint's conditions and the sets it is in.
    let txt = s.fmt_services();
    assert!(txt.contains("Conditions"), "{txt}");
}

fn affinity_leaves_an_endpoint_that_stops_being_ready<A: Fx>() {
    let s = Services::new(1024);
    let mut a = A::spec("web", 3);
    a.affinity = Some(Duration::from_secs(100));
    s.upsert(a.clone()).unwrap();
    let r = s.by_vip(A::VIP, 80, PROTO_TCP).unwrap();
    let mut rng = Rng::new(3);
    let t0 = Instant::from_secs(10);
    let first = s
        .select(&r, A::CLIENT, 0, rng.next_u64(), false, t0)
        .unwrap();
    // Its endpoint terminates while others are ready: the client moves on.
    for e in A::eps_mut(&mut a).iter_mut().filter(|e| e.addr == first) {
        e.conditions = EndpointConditions::TERMINATING;
    }
    s.upsert(a.clone()).unwrap();
    let r = s.by_vip(A::VIP, 80, PROTO_TCP).unwrap();
    let next = s
        .select(&r, A::CLIENT, 0, rng.next_u64(), false, t0)
        .unwrap();
    assert_ne!(next, first);
    // Every endpoint terminating: the fallback set is all three; the client stays put.
    for e in A::eps_mut(&mut a).iter_mut() {
        e.conditions = EndpointConditions::TERMINATING;
    }
    s.upsert(a).unwrap();
    let r = s.by_vip(A::VIP, 80, PROTO_TCP).unwrap();
    assert_eq!(r.eligible::<A>(false).len(), 3);
    for _ in 0..10 {
        let again = s.select(&r, A::CLIENT, 0, rng.next_u64(), false, t0);
        assert_eq!(again, Some(next));
    }
}

#[test]
fn conditions_display_and_default() {
    assert_eq!(EndpointConditions::default(), R);
    assert_eq!(R.to_string(), "ready,serving");
    assert_eq!(T.to_string(), "serving,terminating");
    assert_eq!(N.to_string(), "-");
    assert!(T.fallback() && !S.fallback() && !X.fallback());
    let e = ep(1, 80, true);
    assert_eq!(e.conditions, R);
    assert_eq!(e.with_conditions(T).conditions, T);
}
