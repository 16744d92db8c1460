//! The real Internet tables (`bart-tier1-v4.txt`, `bart-tier1-v6.txt`) against a
//! per-length hash model. Skipped, with a message, when the files are absent.
//!
//! The files are read from `$TAPYARD_RIB_DIR`, else from `../shared/data/rib` beside the
//! crate. Next hop = line index.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Instant;

use super::*;

fn rib_file(name: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("TAPYARD_RIB_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/data/rib"));
    let path = dir.join(name);
    if path.is_file() {
        Some(path)
    } else {
        println!(
            "SKIPPED: {} not found (set TAPYARD_RIB_DIR)",
            path.display()
        );
        None
    }
}

fn load<A>(name: &str, parse: impl Fn(&str) -> A) -> Option<Vec<Route<A>>> {
    let text = std::fs::read_to_string(rib_file(name)?).expect("readable RIB file");
    Some(
        text.lines()
            .enumerate()
            .map(|(i, line)| {
                let (addr, len) = line.split_once('/').expect("prefix/len");
                Route {
                    prefix: parse(addr),
                    len: len.parse().expect("length"),
                    next_hop: i as u32,
                }
            })
            .collect(),
    )
}

/// Longest-prefix match by probing one hash map per prefix length, longest first.
struct LenModel<A: Address> {
    maps: Vec<(u8, HashMap<A, u32>)>,
}

impl<A: Address> LenModel<A> {
    fn new(routes: &[Route<A>]) -> Self {
        let mut by_len: BTreeMap<u8, HashMap<A, u32>> = BTreeMap::new();
        for r in routes {
            by_len
                .entry(r.len)
                .or_default()
                .insert(r.prefix, r.next_hop);
        }
        LenModel {
            maps: by_len.into_iter().rev().collect(),
        }
    }

    fn lookup(&self, addr: A) -> Option<u32> {
        self.maps
            .iter()
            .find_map(|(len, map)| map.get(&addr.masked(*len)).copied())
    }
}

fn compare<A: Address>(what: &str, lpm: &Lpm<A>, model: &LenModel<A>, addrs: &[A]) {
    let mut out = vec![0u32; addrs.len()];
    lpm.lookup_batch(addrs, &mut out);
    let mut hits = 0usize;
    for (&a, &o) in addrs.iter().zip(&out) {
        let want = model.lookup(a);
        hits += usize::from(want.is_some());
        assert_eq!(lpm.lookup(a), want, "{what}: lookup {a:#x?}");
        assert_eq!(o, want.unwrap_or(NO_ROUTE), "{what}: batch lookup {a:#x?}");
    }
    println!("{what}: {} addresses agree ({hits} routed)", addrs.len());
}

/// Builds the table, checks it, removes 10% of the routes (half in small batches through
/// the incremental path, half in one batch), checks again, then times single inserts.
fn exercise<A: Address>(
    family: &str,
    routes: &[Route<A>],
    random: impl Fn(&mut SplitMix) -> A,
    host_mask: impl Fn(u8) -> A,
    or: impl Fn(A, A) -> A,
    and: impl Fn(A, A) -> A,
) {
    const N: usize = 1_000_000;
    let mut rng = SplitMix(0x5EED);
    let inside = |rng: &mut SplitMix, routes: &[Route<A>]| -> A {
        let r = routes[rng.below(routes.len())];
        or(r.prefix, and(random(rng), host_mask(r.len)))
    };
    let random_addrs: Vec<A> = (0..N).map(|_| random(&mut rng)).collect();
    let inside_addrs: Vec<A> = (0..N).map(|_| inside(&mut rng, routes)).collect();

    let t = Instant::now();
    let mut b = Lpm::builder();
    for r in routes {
        b.insert(r.prefix, r.len, r.next_hop).unwrap();
    }
    let lpm = b.build();
    println!(
        "{family}: built {} routes in {:?}, {} bytes ({:.1} per route), {lpm:?}",
        lpm.len(),
        t.elapsed(),
        lpm.memory_bytes(),
        lpm.memory_bytes() as f64 / lpm.len() as f64
    );
    assert_eq!(lpm.len(), routes.len());
    let mut model = LenModel::new(routes);
    compare(
        &format!("{family} built, random"),
        &lpm,
        &model,
        &random_addrs,
    );
    compare(
        &format!("{family} built, inside"),
        &lpm,
        &model,
        &inside_addrs,
    );
    drop(lpm);

    let t = Instant::now();
    let fib = Fib::from_routes(routes.iter().copied()).unwrap();
    println!("{family}: Fib::from_routes in {:?}", t.elapsed());

    // Remove a random 10%: half in batches of 500, half in one batch.
    let mut order: Vec<usize> = (0..routes.len()).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, rng.below(i + 1));
    }
    let removed = &order[..routes.len() / 10];
    let (small, big) = removed.split_at(removed.len() / 2);
    let t = Instant::now();
    for chunk in small.chunks(500) {
        fib.update(|b| {
            for &i in chunk {
                assert!(b.remove(routes[i].prefix, routes[i].len)?.is_some());
            }
            Ok::<_, LpmError>(())
        })
        .unwrap();
    }
    println!(
        "{family}: removed {} routes in {} batches of 500 in {:?}",
        small.len(),
        small.len().div_ceil(500),
        t.elapsed()
    );
    let t = Instant::now();
    fib.update(|b| {
        for &i in big {
            b.remove(routes[i].prefix, routes[i].len)?;
        }
        Ok::<_, LpmError>(())
    })
    .unwrap();
    println!(
        "{family}: removed {} routes in one batch in {:?}",
        big.len(),
        t.elapsed()
    );
    for &i in removed {
        let r = routes[i];
        model
            .maps
            .iter_mut()
            .find(|(len, _)| *len == r.len)
            .unwrap()
            .1
            .remove(&r.prefix);
    }
    let snap = fib.snapshot();
    assert_eq!(snap.len(), routes.len() - removed.len());
    println!("{family}: after removals {snap:?}");
    compare(
        &format!("{family} 10% removed, random"),
        &snap,
        &model,
        &random_addrs,
    );
    compare(
        &format!("{family} 10% removed, inside"),
        &snap,
        &model,
        &inside_addrs,
    );
    drop(snap);

    // Single-route updates: put back 2000 of the removed routes one by one.
    let t = Instant::now();
    for &i in &removed[..2000] {
        let r = routes[i];
        fib.insert(r.prefix, r.len, r.next_hop).unwrap();
        model
            .maps
            .iter_mut()
            .find(|(len, _)| *len == r.len)
            .unwrap()
            .1
            .insert(r.prefix, r.next_hop);
    }
    println!(
        "{family}: 2000 single inserts in {:?} ({:?} each)",
        t.elapsed(),
        t.elapsed() / 2000
    );
    let snap = fib.snapshot();
    println!("{family}: after re-inserts {snap:?}");
    compare(
        &format!("{family} re-inserted, inside"),
        &snap,
        &model,
        &inside_addrs[..N / 4],
    );
}

#[test]
fn real_ipv4_table() {
    let Some(routes) = load("bart-tier1-v4.txt", |s| {
        u32::from(s.parse::<std::net::Ipv4Addr>().expect("IPv4 address"))
    }) else {
        return;
    };
    assert_eq!(routes.len(), 901_899);
    exercise(
        "IPv4",
        &routes,
        SplitMix::next_u32,
        host_mask::<u32>,
        |a, b| a | b,
        |a, b| a & b,
    );
}

#[test]
fn real_ipv6_table() {
    let Some(routes) = load("bart-tier1-v6.txt", |s| {
        u128::from(s.parse::<std::net::Ipv6Addr>().expect("IPv6 address"))
    }) else {
        return;
    };
    assert_eq!(routes.len(), 160_147);
    // Uniform over the whole space almost never hits a route; draw half from 2000::/3.
    exercise(
        "IPv6",
        &routes,
        |rng| {
            let a = rng.next_u128();
            if a & 1 == 0 {
                a
            } else {
                (a >> 3) | (1 << 125)
            }
        },
        host_mask::<u128>,
        |a, b| a | b,
        |a, b| a & b,
    );
}
