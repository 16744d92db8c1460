//! End-to-end tests of conntrack NAT on real TAP devices: a Kubernetes-like node driven
//! in-process by a [`Runtime`], the kernel's own TCP/UDP stacks in network namespaces as pods,
//! a second node and an outside host, and the Services kube-proxy's iptables rules would make.
//!
//! ```text
//!  pod A 10.217.1.2/24 ── TAP ─┐
//!  pod B 10.217.1.3/24 ── TAP ─┤ cni0 (router iface 10.217.1.1/24)   tapyard node
//!                              └ router ── eth0 172.19.0.2/24 ── TAP ─┐
//!  "wire" namespace: Linux bridge br0 joining the uplink TAP and two veths ┘
//!    ├─ node2   172.19.0.3/24, pod address 10.217.2.2 on lo, 10.217.1.0/24 via 172.19.0.2
//!    └─ outside 172.19.0.9/24, 198.18.0.1 on lo, NO route to 10.217.0.0/16
//!  tapyard routes: 10.217.2.0/24 via 172.19.0.3, default via 172.19.0.9
//!  NAT: cluster CIDR 10.217.0.0/16; masquerade out eth0 from the cluster to outside it
//!  Services:
//!    web       10.97.0.10:80/tcp  -> 10.217.1.3:8080 (local), 10.217.2.2:8080; NodePort 30080
//!    web-local 10.97.0.12:80/tcp  -> same, NodePort 30081, externalTrafficPolicy Local
//!    self      10.97.0.11:80/tcp  -> 10.217.1.2:8080 (pod A itself: hairpin)
//!    dns       10.97.0.53:53/udp  -> 10.217.1.3:5353
//!    dead      10.97.0.54:53/udp  -> 10.217.1.3:5999 (nothing listens)
//!    dead-far  10.97.0.55:53/udp  -> 10.217.2.2:5999 (nothing listens, on node2)
//!    empty     10.97.0.99:80/tcp and :53/udp, no endpoints
//! ```
//!
//! Checked, one named step each (see `nat_node`): (0) the first packet to a neighbour the
//! router has not resolved yet (queued on ARP) arrives intact: a DNAT'd SYN, a plain routed
//! SYN and a masqueraded UDP datagram (known bug on offload TAPs, see
//! [`KNOWN_BUG_QUEUED_FRAME_LOSES_OFFLOAD`]); (1, 2) ClusterIP connections from pod
//! A spread over the local and the remote endpoint, which both see pod A's own address, plus
//! content-checked 4 MiB transfers both ways to each endpoint; (3) hairpin, the endpoint sees
//! the gateway address; (4) NodePort from outside: Cluster policy masquerades (pod B sees
//! 10.217.1.1, node2 sees 172.19.0.2), Local policy only uses pod B and keeps the client
//! address; (5) pod to outside is masqueraded to 172.19.0.2; (6) a UDP Service answers from
//! the ClusterIP on a connected socket; (7) Services without endpoints refuse at once (TCP
//! RST, ICMP port unreachable); (8) an endpoint's ICMP port unreachable is translated back to
//! the ClusterIP tuple (local endpoint: bridged path; remote: routed path); (9) the
//! `conntrack -L` dump (ASSURED entries with their translated reply tuples) and exact NAT
//! counters; (10) NodePort from a pod, on the uplink's and on cni0's address: Cluster policy
//! masquerades, Local policy keeps the pod's address (and, as kube-proxy, should use every
//! endpoint: known divergence, see [`KNOWN_BUG_POD_TO_LOCAL_NODE_PORT`]); (11) ClientIP session
//! affinity; (12) an endpoint removed while traffic flows; (13) no kernel counted a checksum
//! error; then the datapath's drop counters. Variants:
//! offload TAPs (virtio-net header, TSO: the production default) and plain TAPs.
//!
//! Needs root (TAP devices and namespaces), `ip`, `ping` and `python3`; without them the test
//! prints why and passes (with `CI=true` it fails instead). Names carry the process id; a
//! guard removes everything on success and failure alike. Traffic only goes to addresses
//! inside the namespaces created here.
//!
//! Run with `sudo -E cargo test --test e2e netns_nat:: -- --nocapture --test-threads=1`; set
//! `TAPYARD_E2E_VERBOSE=1` to see the servers' logs.

use crate::common;

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::sync::Arc;
use std::time::Instant;

use crate::common::{name_tag, open_tap, route, run_output, skip, skip_reason, Guard, Ns, TapKind};
use tapyard::l3::IfaceConfig;
use tapyard::l3::NextHop;
use tapyard::nat::{Endpoint, ServiceSpec};
use tapyard::nat::{MasqueradeRule, NatConfig, NatRules, NfCounters, Prefix};
use tapyard::runtime::{Runtime, RuntimeConfig};
use tapyard::wire::family::IpProto;
use tapyard::{BridgeConfig, Datapath, DropReason, MacAddr};

const GW: &str = "10.217.1.1";
const POD_A: &str = "10.217.1.2";
const POD_B: &str = "10.217.1.3";
const NODE: &str = "172.19.0.2";
const NODE2: &str = "172.19.0.3";
const NODE2_POD: &str = "10.217.2.2";
const OUTSIDE: &str = "172.19.0.9";
/// A server address outside the cluster, reached through tapyard's default route.
const OUTSIDE_SRV: &str = "198.18.0.1";

const WEB: &str = "10.97.0.10";
const SELF_SVC: &str = "10.97.0.11";
/// A Service whose only endpoint is pod B: the first connection to it is the first packet the
/// router sends to pod B (its neighbour entry is not resolved yet).
const ONLY_B: &str = "10.97.0.13";
/// Like `web`, with `sessionAffinity: ClientIP`.
const STICKY: &str = "10.97.0.14";
const WEB_LOCAL: &str = "10.97.0.12";
const DNS: &str = "10.97.0.53";
const DEAD: &str = "10.97.0.54";
const DEAD_FAR: &str = "10.97.0.55";
const EMPTY: &str = "10.97.0.99";

const NODE_PORT: u16 = 30080;
const NODE_PORT_LOCAL: u16 = 30081;
/// The endpoints' TCP port (every server listens on it).
const SRV_PORT: u16 = 8080;
/// Pod B's UDP server.
const DNS_PORT: u16 = 5353;
/// Nothing listens there.
const DEAD_PORT: u16 = 5999;

/// Short connections per ClusterIP / NodePort check.
const SHORT_CONNS: usize = 20;
/// Bytes of each checked transfer through the ClusterIP.
const BIG: usize = 4 << 20;
/// A datapath bug found by step 0, fixed in commit eb60726 ("router: a frame queued for ARP
/// keeps no offload state, so finish its partial checksum / TSO segmentation before
/// queueing"): a frame the router queued while resolving the next hop lost its offload
/// metadata (the virtio-net header's NEEDS_CSUM), so a TCP/UDP packet from an offload TAP left
/// with a partial checksum and the receiver dropped it (TCP recovered with the SYN
/// retransmitted 1 s later; a first UDP datagram, such as a DNS query, was lost). While `true`,
/// the checks that catch it print `KNOWN BUG` instead of failing (unless `TAPYARD_E2E_STRICT`
/// is set); it is `false` now that the bug is fixed: set it back if it must be tolerated again.
const KNOWN_BUG_QUEUED_FRAME_LOSES_OFFLOAD: bool = false;
/// Known divergence from kube-proxy found by step 10: pod traffic to a NodePort whose policy
/// is Local. kube-proxy's KUBE-EXT chain sends sources inside the cluster CIDR to KUBE-SVC
/// ("pod traffic for <svc> external destinations"), so every endpoint is used and the pod's
/// address is kept; tapyard applies the Local policy to it (local endpoints only; the address
/// is kept). While `true`, step 10 prints `KNOWN BUG` for the endpoint spread instead of
/// failing (unless `TAPYARD_E2E_STRICT` is set); set it to `false` once fixed.
const KNOWN_BUG_POD_TO_LOCAL_NODE_PORT: bool = false;

/// A server: TCP on `argv[2]` (every connection in its own thread: reads to EOF, answers
/// `<ident> <peer address> <bytes> <sha256>\n` followed by the bytes received, and closes), and
/// if `argv[3]` is given, UDP there, bound to `argv[4]` (default any address), answering each
/// datagram with `<ident> <peer address> <datagram>`. Prints `ready` first.
const SERVER_PY: &str = r#"
import hashlib, socket, sys, threading
ident, tport = sys.argv[1], int(sys.argv[2])
uport = int(sys.argv[3]) if len(sys.argv) > 3 else 0
ubind = sys.argv[4] if len(sys.argv) > 4 else "0.0.0.0"
def handle(c, peer):
    n = 0
    try:
        c.settimeout(15)
        h = hashlib.sha256()
        got = []
        while True:
            d = c.recv(1 << 16)
            if not d:
                break
            h.update(d)
            got.append(d)
            n += len(d)
        c.sendall(("%s %s %d %s\n" % (ident, peer[0], n, h.hexdigest())).encode())
        for d in got:
            c.sendall(d)
    except OSError as e:
        print("tcp error from %s: %s" % (peer, e), flush=True)
    finally:
        c.close()
    print("tcp %s:%d %d bytes" % (peer[0], peer[1], n), flush=True)
def tcp(s):
    while True:
        c, peer = s.accept()
        threading.Thread(target=handle, args=(c, peer), daemon=True).start()
def udp(u):
    while True:
        d, peer = u.recvfrom(2048)
        u.sendto(("%s %s %s" % (ident, peer[0], d.decode())).encode(), peer)
        print("udp %s:%d" % peer, flush=True)
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", tport))
s.listen(128)
threads = [threading.Thread(target=tcp, args=(s,), daemon=True)]
if uport:
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.bind((ubind, uport))
    threads.append(threading.Thread(target=udp, args=(u,), daemon=True))
for t in threads:
    t.start()
print("ready", flush=True)
for t in threads:
    t.join()
"#;

/// `<addr> <port> <count> <bytes>`: `count` connections one after another, each sending
/// `bytes` deterministic bytes then reading the server's report and echo to EOF; one line
/// each: `<peer addr:port of the connected socket> <sha256 sent> <seconds> <report>
/// <sha256 of the echo>`.
const CLIENT_PY: &str = r#"
import hashlib, random, socket, sys, time
addr, port, count, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
data = random.Random(n).getrandbits(8 * n).to_bytes(n, "little")
digest = hashlib.sha256(data).hexdigest()
for i in range(count):
    t = time.monotonic()
    c = socket.create_connection((addr, port), timeout=10)
    peer = c.getpeername()
    c.sendall(data)
    c.shutdown(socket.SHUT_WR)
    got = []
    while True:
        d = c.recv(1 << 16)
        if not d:
            break
        got.append(d)
    c.close()
    report, _, echo = b"".join(got).partition(b"\n")
    echo_digest = hashlib.sha256(echo).hexdigest()
    print("%s:%d %s %.3f %s %s" % (peer[0], peer[1], digest, time.monotonic() - t, report.decode(), echo_digest), flush=True)
"#;

/// `tcp <addr> <port>` or `udp <addr> <port> <payload>`: one attempt, printing
/// `<outcome> <seconds> [detail]`; outcome is `connected`, `answer` (detail: the source
/// address and the datagram), `refused`, `timeout` or `error` (detail: errno name).
const PROBE_PY: &str = r#"
import errno, socket, sys, time
mode, addr, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
t = time.monotonic()
def done(outcome, detail=""):
    print("%s %.3f %s" % (outcome, time.monotonic() - t, detail), flush=True)
    sys.exit(0)
try:
    if mode == "tcp":
        c = socket.socket()
        c.settimeout(5)
        c.connect((addr, port))
        done("connected", "%s:%d" % c.getpeername())
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.settimeout(3)
    u.connect((addr, port))
    u.send(sys.argv[4].encode())
    d, src = u.recvfrom(2048)
    done("answer", "%s:%d %s" % (src[0], src[1], d.decode()))
except ConnectionRefusedError:
    done("refused")
except socket.timeout:
    done("timeout")
except OSError as e:
    done("error", errno.errorcode.get(e.errno, str(e.errno)))
"#;

/// One connection made by [`CLIENT_PY`], as the client and the server saw it.
#[derive(Debug)]
struct Conn {
    /// The address the client's connected socket talks to.
    peer: String,
    /// Who answered.
    server: String,
    /// The client address the server saw.
    seen: String,
    secs: f64,
}

/// Runs [`CLIENT_PY`] in `ns`: `count` connections to `addr:port` each sending `bytes`; checks
/// that every connection's bytes arrived intact, both ways, and returns what each saw.
fn tcp_conns(ns: &Ns, addr: &str, port: u16, count: usize, bytes: usize) -> Vec<Conn> {
    let out = run_output(&ns.exec(&[
        "python3",
        "-c",
        CLIENT_PY,
        addr,
        &port.to_string(),
        &count.to_string(),
        &bytes.to_string(),
    ]));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "TCP client {} -> {addr}:{port} failed ({}):\n{text}{}",
        ns.name,
        out.status,
        String::from_utf8_lossy(&out.stderr).trim_end()
    );
    let conns: Vec<Conn> = text
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f.len(), 8, "bad client line {l:?}");
            assert_eq!(f[5], bytes.to_string(), "byte count differs: {l}");
            assert_eq!(f[6], f[1], "sha256 differs (sent vs received): {l}");
            assert_eq!(f[7], f[1], "sha256 differs (sent vs echoed back): {l}");
            Conn {
                peer: f[0].to_string(),
                secs: f[2].parse().unwrap_or(0.0),
                server: f[3].to_string(),
                seen: f[4].to_string(),
            }
        })
        .collect();
    assert_eq!(conns.len(), count, "connections reported:\n{text}");
    report_slow(&conns);
    conns
}

/// Prints the connections that took long enough to have needed a retransmitted SYN (the
/// kernel's initial RTO is 1 s): a lost handshake packet.
fn report_slow(conns: &[Conn]) -> usize {
    let slow: Vec<_> = conns
        .iter()
        .enumerate()
        .filter(|(_, c)| c.secs >= 0.9)
        .collect();
    for (i, c) in &slow {
        println!("  warning: connection {i} took {:.3}s: {c:?}", c.secs);
    }
    slow.len()
}

/// Fails, or prints `KNOWN BUG` while `known` (and `TAPYARD_E2E_STRICT` is unset).
fn check_known(ok: bool, known: bool, what: &str) {
    if ok {
        return;
    }
    let strict = std::env::var_os("TAPYARD_E2E_STRICT").is_some();
    assert!(known && !strict, "{what}");
    println!("  KNOWN BUG (not failing the test): {what}");
}

/// The kernel's checksum error counters in `ns` (`/proc/net/snmp`): `(group, count)` for the
/// Ip, Icmp, Tcp and Udp groups' `InCsumErrors` (Ip: `InHdrErrors`).
fn csum_errors(ns: &Ns) -> Vec<(String, u64)> {
    let snmp = common::run(&ns.exec(&["cat", "/proc/net/snmp"]));
    let lines: Vec<&str> = snmp.lines().collect();
    let mut v = Vec::new();
    for pair in lines.chunks(2) {
        let [names, values] = pair else { continue };
        let group = names.split(':').next().unwrap_or("");
        let want = if group == "Ip" {
            "InHdrErrors"
        } else {
            "InCsumErrors"
        };
        let names: Vec<&str> = names.split_whitespace().collect();
        let values: Vec<&str> = values.split_whitespace().collect();
        if let Some(i) = names.iter().position(|n| *n == want) {
            let n = values.get(i).and_then(|x| x.parse().ok()).unwrap_or(0);
            v.push((format!("{group}{want}"), n));
        }
    }
    v
}

/// The nonzero counters of [`csum_errors`], as `name=count` words.
fn nonzero_csum_errors(ns: &Ns) -> String {
    csum_errors(ns)
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .map(|(g, n)| format!("{g}={n}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `(server, client address seen)` → number of connections.
fn tally(conns: &[Conn]) -> BTreeMap<(String, String), usize> {
    let mut m = BTreeMap::new();
    for c in conns {
        *m.entry((c.server.clone(), c.seen.clone())).or_insert(0) += 1;
    }
    m
}

/// Runs [`PROBE_PY`] in `ns`; returns `(outcome, seconds, detail)`.
fn probe(ns: &Ns, args: &[&str]) -> (String, f64, String) {
    let mut v = ns.exec(&["python3", "-c", PROBE_PY]);
    v.extend_from_slice(args);
    let out = run_output(&v);
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        out.status.success(),
        "probe {} {args:?} failed ({}): {text}{}",
        ns.name,
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let mut it = text.splitn(3, ' ');
    let outcome = it.next().unwrap_or("").to_string();
    let secs = it.next().and_then(|s| s.parse().ok()).unwrap_or(f64::NAN);
    let detail = it.next().unwrap_or("").trim().to_string();
    (outcome, secs, detail)
}

/// The one line of `dump` containing every part of `parts`, in order.
fn ct_line<'a>(dump: &'a str, parts: &[&str]) -> &'a str {
    dump.lines()
        .find(|l| {
            let mut rest = *l;
            parts.iter().all(|p| match rest.find(p) {
                Some(i) => {
                    rest = &rest[i + p.len()..];
                    true
                }
                None => false,
            })
        })
        .unwrap_or_else(|| panic!("no conntrack entry with {parts:?} in:\n{dump}"))
}

fn delta(after: &NfCounters, before: &NfCounters) -> NfCounters {
    NfCounters {
        new: after.new - before.new,
        dnat: after.dnat - before.dnat,
        snat: after.snat - before.snat,
        hairpin: after.hairpin - before.hairpin,
        rejected: after.rejected - before.rejected,
        related: after.related - before.related,
        untracked: after.untracked - before.untracked,
    }
}

fn ip4(s: &str) -> Ipv4Addr {
    s.parse().expect("address")
}

fn ep(addr: &str, port: u16, local: bool) -> Endpoint {
    Endpoint::new(SocketAddrV4::new(ip4(addr), port), local)
}

/// A step's name and start, printed when it begins and ends.
struct Step(&'static str, Instant);

fn step(name: &'static str) -> Step {
    println!("--- {name}");
    Step(name, Instant::now())
}

impl Drop for Step {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            println!(
                "--- {}: ok in {:.2}s",
                self.0,
                self.1.elapsed().as_secs_f64()
            );
        }
    }
}

#[test]
#[cfg_attr(
    not(tapyard_root),
    ignore = "needs root: TAP devices and network namespaces (runs as root, as in CI)"
)]
fn kubernetes_services_with_offload_taps() {
    nat_node("tyn", TapKind::Offload);
}

/// The same on plain TAPs: the pods' kernels segment and checksum everything.
#[test]
#[cfg_attr(
    not(tapyard_root),
    ignore = "needs root: TAP devices and network namespaces (runs as root, as in CI)"
)]
fn kubernetes_services_with_plain_taps() {
    nat_node("tyq", TapKind::Plain);
}

/// Builds the node of the module docs with TAPs of `kind`; `prefix` (3 bytes) keeps the names
/// of concurrently running tests apart.
fn nat_node(prefix: &str, kind: TapKind) {
    if let Some(why) = skip_reason(&[("ping", "-V"), ("python3", "-V")]) {
        skip(&why);
        return;
    }
    let started = Instant::now();
    let (pid, tag) = name_tag();
    let tap_a = format!("{prefix}{pid}a"); // at most 3 + 7 + 1 = 11 bytes
    let tap_b = format!("{prefix}{pid}b");
    let tap_up = format!("{prefix}{pid}u");
    let ns_name = |what: &str| format!("{prefix}-{what}-{pid}-{tag}");

    // The node: cni0 with its gateway, the uplink, NAT.
    let mut builder = Datapath::builder();
    let cni0 = builder.add_bridge(BridgeConfig::new("cni0")).unwrap();
    let id_a = builder.add_port(tap_a.clone(), Some(cni0)).unwrap();
    let id_b = builder.add_port(tap_b.clone(), Some(cni0)).unwrap();
    builder
        .add_router_iface(
            IfaceConfig::new("cni0", MacAddr::local(0x0217_0101), ip4(GW), 24),
            Some(cni0),
        )
        .unwrap();
    let (eth0, id_up) = builder
        .add_router_iface(
            IfaceConfig::new("eth0", MacAddr::local(0x0217_1302), ip4(NODE), 24),
            None,
        )
        .unwrap();
    let cluster = Prefix::new(Ipv4Addr::new(10, 217, 0, 0), 16);
    builder
        .netfilter(NatConfig {
            rules: NatRules {
                cluster_cidr: Some(cluster),
                masquerade: vec![MasqueradeRule {
                    out: eth0,
                    src: Some(cluster),
                    except_dst: Some(cluster),
                }],
                ..NatRules::default()
            },
            ..NatConfig::default()
        })
        .unwrap();
    let dp = Arc::new(builder.build());
    dp.control()
        .add_route(route("10.217.2.0", 24, NextHop::Via(eth0, ip4(NODE2))))
        .unwrap();
    dp.control()
        .add_route(route("0.0.0.0", 0, NextHop::Via(eth0, ip4(OUTSIDE))))
        .unwrap();
    let mut routes = String::new();
    dp.control().fmt_routes(&mut routes).unwrap();
    println!("{prefix}: {kind:?} TAPs; routes:\n{routes}");

    let mut guard = Guard::default();
    let taps = [
        (id_a, &tap_a[..], kind),
        (id_b, &tap_b[..], kind),
        (id_up, &tap_up[..], kind),
    ];
    if !common::attach_taps(&mut guard, &dp, &taps) {
        return;
    }
    let now = guard.rt.as_ref().expect("started").now();

    // The Services, as kube-proxy would program them.
    let nf = dp.control().netfilter().expect("netfilter");
    let web_eps = vec![ep(POD_B, SRV_PORT, true), ep(NODE2_POD, SRV_PORT, false)];
    let mut web = ServiceSpec::new("web", ip4(WEB), 80, IpProto::TCP);
    web.node_port = Some(NODE_PORT);
    web.endpoints = web_eps.clone();
    let mut local = ServiceSpec::new("web-local", ip4(WEB_LOCAL), 80, IpProto::TCP);
    local.node_port = Some(NODE_PORT_LOCAL);
    local.external_local = true;
    local.endpoints = web_eps.clone();
    let mut me = ServiceSpec::new("self", ip4(SELF_SVC), 80, IpProto::TCP);
    me.endpoints = vec![ep(POD_A, SRV_PORT, true)];
    let mut only_b = ServiceSpec::new("only-b", ip4(ONLY_B), 80, IpProto::TCP);
    only_b.endpoints = vec![ep(POD_B, SRV_PORT, true)];
    let mut sticky = ServiceSpec::new("sticky", ip4(STICKY), 80, IpProto::TCP);
    sticky.endpoints = web_eps.clone();
    sticky.affinity = Some(std::time::Duration::from_secs(10_800));
    let mut dns = ServiceSpec::new("dns", ip4(DNS), 53, IpProto::UDP);
    dns.endpoints = vec![ep(POD_B, DNS_PORT, true)];
    let mut dead = ServiceSpec::new("dead", ip4(DEAD), 53, IpProto::UDP);
    dead.endpoints = vec![ep(POD_B, DEAD_PORT, true)];
    let mut dead_far = ServiceSpec::new("dead-far", ip4(DEAD_FAR), 53, IpProto::UDP);
    dead_far.endpoints = vec![ep(NODE2_POD, DEAD_PORT, false)];
    for s in [
        web,
        local,
        me,
        only_b,
        sticky,
        dns,
        dead,
        dead_far,
        ServiceSpec::new("empty", ip4(EMPTY), 80, IpProto::TCP),
        ServiceSpec::new("empty-udp", ip4(EMPTY), 53, IpProto::UDP),
    ] {
        nf.upsert_service(s, now).expect("upsert service");
    }
    println!("{prefix}: services:\n{}", nf.services().fmt_services());

    // The namespaces.
    let setup = step("setup: namespaces, wire bridge, servers");
    let pa = guard.ns(&ns_name("poda"));
    let pb = guard.ns(&ns_name("podb"));
    let node2 = guard.ns(&ns_name("node2"));
    let out = guard.ns(&ns_name("out"));
    let wire = guard.ns(&ns_name("wire"));
    for ns in [&pa, &pb, &node2, &out, &wire] {
        ns.disable_ipv6();
    }
    pa.take_link(&tap_a, Some(&format!("{POD_A}/24")));
    pa.route("default", GW);
    pb.take_link(&tap_b, Some(&format!("{POD_B}/24")));
    pb.route("default", GW);
    wire.take_link(&tap_up, None);
    wire.ip(&["link", "add", "br0", "type", "bridge", "forward_delay", "0"]);
    wire.ip(&["link", "set", &tap_up, "master", "br0"]);
    wire.ip(&["link", "set", "br0", "up"]);
    for (peer, veth, addr) in [(&node2, "vnode2", NODE2), (&out, "vout", OUTSIDE)] {
        wire.ip(&[
            "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", &peer.name,
        ]);
        wire.ip(&["link", "set", veth, "master", "br0"]);
        wire.ip(&["link", "set", veth, "up"]);
        peer.ip(&["addr", "add", &format!("{addr}/24"), "dev", "eth0"]);
        peer.ip(&["link", "set", "eth0", "up"]);
    }
    node2.ip(&["addr", "add", &format!("{NODE2_POD}/32"), "dev", "lo"]);
    node2.route("10.217.1.0/24", NODE);
    out.ip(&["addr", "add", &format!("{OUTSIDE_SRV}/32"), "dev", "lo"]);
    // The outside host must not know the cluster: masquerade is really needed.
    let r = out.ip_output(&["route", "get", POD_A]);
    assert!(
        !r.status.success(),
        "the outside namespace must have no route to {POD_A}: {}",
        String::from_utf8_lossy(&r.stdout)
    );

    let srv = |ns: &Ns, ident: &'static str, udp: Option<(u16, &str)>| {
        let mut v: Vec<String> = ["ip", "netns", "exec", &ns.name, "python3", "-c", SERVER_PY]
            .iter()
            .map(|s| s.to_string())
            .collect();
        v.push(ident.into());
        v.push(SRV_PORT.to_string());
        if let Some((port, bind)) = udp {
            v.push(port.to_string());
            v.push(bind.to_string());
        }
        v
    };
    for (ns, ident, udp) in [
        (&pa, "podA", None),
        (&pb, "podB", Some((DNS_PORT, "0.0.0.0"))),
        (&node2, "node2", None),
        // Bound to the server address: a reply from 0.0.0.0 would take the source address of
        // the route back (172.19.0.9), which no connection expects.
        (&out, "outside", Some((DNS_PORT, OUTSIDE_SRV))),
    ] {
        let args = srv(ns, ident, udp);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        guard.spawn_server(ident, &args);
    }
    drop(setup);

    {
        let _s = step("0. first packet to an unresolved neighbour (queued on ARP)");
        // Nothing has been routed to pod B or node2 yet: the router queues the SYN while it
        // resolves the next hop, then sends it. Linux keeps the queued skb's offload state, so
        // the connection opens at once. Through NAT (DNAT to pod B, switched out of cni0) and
        // without it (pod A to node2's pod address, routed out of the uplink).
        let only_b_port = format!("{ONLY_B}:80");
        let node2_port = format!("{NODE2_POD}:{SRV_PORT}");
        for (dst, server, what) in [
            (only_b_port.as_str(), &pb, "ClusterIP -> pod B"),
            (node2_port.as_str(), &node2, "pod A -> node2, no NAT"),
        ] {
            let (addr, port) = dst.split_once(':').expect("addr:port");
            let (outcome, secs, detail) = probe(&pa, &["tcp", addr, port]);
            println!("  tcp {dst} ({what}): {outcome} in {secs:.3}s {detail}");
            assert_eq!(outcome, "connected", "{detail}");
            assert_eq!(detail, dst);
            let errs = nonzero_csum_errors(server);
            if !errs.is_empty() {
                println!("  {}'s kernel counted checksum errors: {errs}", server.name);
            }
            // A lost SYN shows as a connect of 1 s or more (the kernel's initial RTO).
            check_known(
                secs < 0.9 && errs.is_empty(),
                kind == TapKind::Offload && KNOWN_BUG_QUEUED_FRAME_LOSES_OFFLOAD,
                &format!(
                    "{what}: the first SYN was lost (connected in {secs:.3}s; receiver's kernel: \
                     {errs:?}): the frame queued for ARP left without its NEEDS_CSUM offload \
                     flag, with a partial checksum"
                ),
            );
        }
        // UDP, masqueraded, through the unresolved default gateway 172.19.0.9: with the bug,
        // the datagram is lost (in a cluster: a pod's first DNS query times out).
        let (outcome, secs, detail) = probe(&pa, &["udp", OUTSIDE_SRV, "5353", "first"]);
        println!("  udp {OUTSIDE_SRV}:5353 (masqueraded): {outcome} in {secs:.3}s {detail}");
        let errs = nonzero_csum_errors(&out);
        if !errs.is_empty() {
            println!("  {}'s kernel counted checksum errors: {errs}", out.name);
        }
        let want = format!("{OUTSIDE_SRV}:5353 outside {NODE} first");
        if outcome != "answer" {
            let rt = guard.rt.as_ref().expect("runtime");
            let dump = nf.conntrack().fmt_dump(rt.now());
            for l in dump.lines().filter(|l| l.contains(OUTSIDE_SRV)) {
                println!("  conntrack: {l}");
            }
            println!("  datapath counters:\n{}", dp.control().stats());
        }
        check_known(
            outcome == "answer" && detail == want && errs.is_empty(),
            kind == TapKind::Offload && KNOWN_BUG_QUEUED_FRAME_LOSES_OFFLOAD,
            &format!(
                "pod A -> outside, UDP: the first datagram was lost ({outcome} after {secs:.3}s \
                 {detail}; receiver's kernel: {errs:?}): queued for ARP, it left with a \
                 partial checksum"
            ),
        );
        // Once the neighbour is resolved, the same query is answered, from the server's
        // address, and the server saw the node's (masqueraded).
        let (outcome, secs, detail) = probe(&pa, &["udp", OUTSIDE_SRV, "5353", "second"]);
        println!("  udp {OUTSIDE_SRV}:5353 again: {outcome} in {secs:.3}s {detail}");
        assert_eq!(
            (outcome.as_str(), detail.as_str()),
            (
                "answer",
                format!("{OUTSIDE_SRV}:5353 outside {NODE} second").as_str()
            )
        );
    }

    // Every checksum error counter from here on must stay as it is.
    let namespaces = [&pa, &pb, &node2, &out];
    let csum_before: Vec<_> = namespaces.iter().map(|ns| csum_errors(ns)).collect();

    let setup = step("setup: warm up neighbours");
    // Resolve the neighbours (and check plain routing) before timing anything.
    pa.ping_ok(GW);
    pa.ping_ok(POD_B);
    pa.ping_ok(NODE2_POD);
    out.ping_ok(NODE);
    drop(setup);

    let c0 = nf.counters();
    let big: u64;
    {
        let _s = step("1+2. pod A -> ClusterIP web: spread over pod B and node2, no masquerade");
        let conns = tcp_conns(&pa, WEB, 80, SHORT_CONNS, 64);
        let t = tally(&conns);
        println!("  {SHORT_CONNS} connections to {WEB}:80: {t:?}");
        let want_peer = format!("{WEB}:80");
        for c in &conns {
            assert_eq!(
                c.peer, want_peer,
                "the client talks to the ClusterIP: {c:?}"
            );
            assert_eq!(c.seen, POD_A, "endpoints see pod A's own address: {c:?}");
            assert!(c.server == "podB" || c.server == "node2", "{c:?}");
        }
        let on_b = conns.iter().filter(|c| c.server == "podB").count();
        assert!(
            on_b > 0 && on_b < SHORT_CONNS,
            "both endpoints must get connections (pod B got {on_b} of {SHORT_CONNS})"
        );
        // Checked transfers both ways until each endpoint had one: the local endpoint's
        // replies are switched on cni0 (bridged reverse NAT), node2's come back routed.
        let mut big_to = BTreeMap::new();
        for _ in 0..16 {
            let c = tcp_conns(&pa, WEB, 80, 1, BIG).remove(0);
            assert_eq!(
                (c.peer.as_str(), c.seen.as_str()),
                (want_peer.as_str(), POD_A)
            );
            println!(
                "  {BIG} bytes each way via {WEB}:80 to {} in {:.3}s ({:.0} Mbit/s), sha256s match",
                c.server,
                c.secs,
                2.0 * BIG as f64 * 8.0 / c.secs.max(1e-6) / 1e6
            );
            *big_to.entry(c.server).or_insert(0u64) += 1;
            if big_to.len() == 2 {
                break;
            }
        }
        big = big_to.values().sum();
        assert_eq!(big_to.len(), 2, "16 transfers all went to {big_to:?}");
        // Direct pod-to-pod across nodes keeps the address too (masquerade's except_dst).
        let direct = tcp_conns(&pa, NODE2_POD, SRV_PORT, 1, 64);
        assert_eq!(direct[0].seen, POD_A, "{direct:?}");
    }
    let c1 = nf.counters();
    let d = delta(&c1, &c0);
    println!("  counters: {d:?}");
    assert_eq!(d.dnat, SHORT_CONNS as u64 + big, "one DNAT per connection");
    assert_eq!(d.snat, 0, "nothing masqueraded inside the cluster");

    {
        let _s = step("3. hairpin: pod A -> 10.97.0.11 reaches itself, sees the gateway");
        let conns = tcp_conns(&pa, SELF_SVC, 80, 3, 64);
        for c in &conns {
            assert_eq!(c.peer, format!("{SELF_SVC}:80"), "{c:?}");
            assert_eq!((c.server.as_str(), c.seen.as_str()), ("podA", GW), "{c:?}");
        }
    }
    let c2 = nf.counters();
    let d = delta(&c2, &c1);
    println!("  counters: {d:?}");
    assert_eq!((d.dnat, d.snat, d.hairpin), (3, 3, 3), "{d:?}");

    {
        let _s = step("4. NodePort from outside: Cluster masquerades, Local keeps the client");
        let conns = tcp_conns(&out, NODE, NODE_PORT, SHORT_CONNS, 64);
        let t = tally(&conns);
        println!("  {SHORT_CONNS} connections to {NODE}:{NODE_PORT}: {t:?}");
        for c in &conns {
            assert_eq!(c.peer, format!("{NODE}:{NODE_PORT}"), "{c:?}");
            match c.server.as_str() {
                "podB" => assert_eq!(c.seen, GW, "pod B sees cni0's address: {c:?}"),
                "node2" => assert_eq!(c.seen, NODE, "node2 sees eth0's address: {c:?}"),
                _ => panic!("unexpected server: {c:?}"),
            }
        }
        assert_eq!(t.len(), 2, "both endpoints must answer: {t:?}");
        let conns = tcp_conns(&out, NODE, NODE_PORT_LOCAL, 10, 64);
        let t = tally(&conns);
        println!("  10 connections to {NODE}:{NODE_PORT_LOCAL} (Local): {t:?}");
        for c in &conns {
            assert_eq!(c.peer, format!("{NODE}:{NODE_PORT_LOCAL}"), "{c:?}");
            assert_eq!(
                (c.server.as_str(), c.seen.as_str()),
                ("podB", OUTSIDE),
                "Local: only pod B, which sees the client's address: {c:?}"
            );
        }
    }
    let c3 = nf.counters();
    let d = delta(&c3, &c2);
    println!("  counters: {d:?}");
    assert_eq!(d.dnat, SHORT_CONNS as u64 + 10, "{d:?}");
    assert_eq!(
        d.snat, SHORT_CONNS as u64,
        "only the Cluster NodePort: {d:?}"
    );

    {
        let _s = step("5. pod A -> outside server: masqueraded to eth0's address");
        let conns = tcp_conns(&pa, OUTSIDE_SRV, SRV_PORT, 3, 64);
        for c in &conns {
            assert_eq!(c.peer, format!("{OUTSIDE_SRV}:{SRV_PORT}"), "{c:?}");
            assert_eq!(
                (c.server.as_str(), c.seen.as_str()),
                ("outside", NODE),
                "{c:?}"
            );
        }
    }
    let c4 = nf.counters();
    let d = delta(&c4, &c3);
    println!("  counters: {d:?}");
    assert_eq!((d.dnat, d.snat), (0, 3), "{d:?}");

    {
        let _s = step("6. UDP Service: a connected socket gets the answer from the ClusterIP");
        for i in 0..3 {
            let q = format!("query-{i}");
            let (outcome, secs, detail) = probe(&pa, &["udp", DNS, "53", &q]);
            println!("  {DNS}:53 {q}: {outcome} in {secs:.3}s: {detail}");
            assert_eq!(outcome, "answer", "{detail}");
            assert_eq!(detail, format!("{DNS}:53 podB {POD_A} {q}"));
        }
    }
    let c5 = nf.counters();
    let d = delta(&c5, &c4);
    assert_eq!(d.dnat, 3, "one UDP flow per socket: {d:?}");

    {
        let _s = step("7. no endpoints: TCP refused at once, UDP gets port unreachable");
        let (outcome, secs, detail) = probe(&pa, &["tcp", EMPTY, "80"]);
        println!("  tcp {EMPTY}:80: {outcome} in {secs:.3}s {detail}");
        assert_eq!(outcome, "refused", "{detail}");
        assert!(secs < 0.5, "the RST must come at once, took {secs:.3}s");
        let (outcome, secs, detail) = probe(&pa, &["udp", EMPTY, "53", "nobody"]);
        println!("  udp {EMPTY}:53: {outcome} in {secs:.3}s {detail}");
        assert_eq!(outcome, "refused", "{detail}");
        assert!(
            secs < 0.5,
            "the ICMP error must come at once, took {secs:.3}s"
        );
    }
    let c6 = nf.counters();
    let d = delta(&c6, &c5);
    println!("  counters: {d:?}");
    assert_eq!((d.rejected, d.new, d.dnat), (2, 0, 0), "{d:?}");

    {
        let _s = step("8. an endpoint's ICMP port unreachable comes back about the ClusterIP");
        for (svc, where_) in [(DEAD, "pod B, bridged"), (DEAD_FAR, "node2, routed")] {
            let before = nf.counters().related;
            let (outcome, secs, detail) = probe(&pa, &["udp", svc, "53", "anyone"]);
            println!("  udp {svc}:53 ({where_}): {outcome} in {secs:.3}s {detail}");
            assert_eq!(
                outcome, "refused",
                "the endpoint's port unreachable must reach the connected socket ({where_}): \
                 {detail}"
            );
            let related = nf.counters().related - before;
            assert!(related >= 1, "a RELATED ICMP error must be counted");
        }
    }

    {
        let _s = step("9. conntrack dump, NAT and drop counters");
        let rt = guard.rt.as_ref().expect("runtime");
        let dump = nf.conntrack().fmt_dump(rt.now());
        println!("  {} entries", dump.lines().count());
        if std::env::var_os("TAPYARD_E2E_VERBOSE").is_some() {
            println!("{dump}");
        }
        let assured = |parts: &[&str]| {
            let l = ct_line(&dump, parts);
            assert!(l.contains("[ASSURED]"), "not ASSURED: {l}");
            println!("  {l}");
        };
        // ClusterIP to each endpoint: the reply tuple is the endpoint's.
        for e in [POD_B, NODE2_POD] {
            assured(&[
                &format!("src={POD_A} dst={WEB} "),
                "dport=80 ",
                &format!("src={e} dst={POD_A} sport={SRV_PORT} "),
            ]);
        }
        // Hairpin: the reply goes to the gateway.
        assured(&[
            &format!("src={POD_A} dst={SELF_SVC} "),
            &format!("src={POD_A} dst={GW} sport={SRV_PORT} "),
        ]);
        // NodePort, Cluster: DNAT and masquerade; Local: DNAT only.
        assured(&[
            &format!("src={OUTSIDE} dst={NODE} "),
            &format!("dport={NODE_PORT} "),
            &format!("src={POD_B} dst={GW} sport={SRV_PORT} "),
        ]);
        assured(&[
            &format!("src={OUTSIDE} dst={NODE} "),
            &format!("dport={NODE_PORT} "),
            &format!("src={NODE2_POD} dst={NODE} sport={SRV_PORT} "),
        ]);
        assured(&[
            &format!("src={OUTSIDE} dst={NODE} "),
            &format!("dport={NODE_PORT_LOCAL} "),
            &format!("src={POD_B} dst={OUTSIDE} sport={SRV_PORT} "),
        ]);
        // Masquerade to the outside.
        assured(&[
            &format!("src={POD_A} dst={OUTSIDE_SRV} "),
            &format!("src={OUTSIDE_SRV} dst={NODE} sport={SRV_PORT} "),
        ]);
        // The UDP Service: replied, reply tuple from pod B's server.
        let l = ct_line(
            &dump,
            &[
                "udp ",
                &format!("src={POD_A} dst={DNS} "),
                "dport=53 ",
                &format!("src={POD_B} dst={POD_A} sport={DNS_PORT} "),
            ],
        );
        assert!(!l.contains("[UNREPLIED]"), "{l}");
        println!("  {l}");
        // Nothing for the Service without endpoints (rejected before insertion).
        assert!(
            !dump.contains(&format!("dst={EMPTY} ")),
            "a rejected connection must not be tracked:\n{dump}"
        );

        let c = nf.counters();
        println!("  NAT counters: {c:?}");
        let d = delta(&c, &c0);
        // Steps 1 to 8: ClusterIP, hairpin, NodePorts, UDP, the two dead endpoints.
        let conns = SHORT_CONNS as u64;
        assert_eq!(d.dnat, conns + big + 3 + conns + 10 + 3 + 2, "{d:?}");
        // Hairpin, NodePort Cluster, pod to outside.
        assert_eq!(d.snat, 3 + conns + 3, "{d:?}");
        assert_eq!((d.hairpin, d.rejected), (3, 2), "{d:?}");
        assert_eq!(d.related, 2, "one per dead endpoint: {d:?}");
    }

    {
        let _s = step("10. NodePort from a pod (node addresses are local: KUBE-NODEPORTS)");
        for node_addr in [NODE, GW] {
            // Cluster policy: KUBE-EXT marks every connection for masquerade.
            let conns = tcp_conns(&pa, node_addr, NODE_PORT, SHORT_CONNS, 64);
            let t = tally(&conns);
            println!("  {SHORT_CONNS} connections to {node_addr}:{NODE_PORT}: {t:?}");
            for c in &conns {
                assert_eq!(c.peer, format!("{node_addr}:{NODE_PORT}"), "{c:?}");
                match c.server.as_str() {
                    "podB" => assert_eq!(c.seen, GW, "masqueraded to cni0's address: {c:?}"),
                    "node2" => assert_eq!(c.seen, NODE, "masqueraded to eth0's address: {c:?}"),
                    _ => panic!("unexpected server: {c:?}"),
                }
            }
            assert_eq!(t.len(), 2, "both endpoints must answer: {t:?}");
        }
        // Local policy, from a pod: kube-proxy sends pod traffic (`-s <cluster-cidr>`) in
        // KUBE-EXT/KUBE-XLB straight to KUBE-SVC: every endpoint, no masquerade.
        let conns = tcp_conns(&pa, NODE, NODE_PORT_LOCAL, SHORT_CONNS, 64);
        let t = tally(&conns);
        println!("  {SHORT_CONNS} connections to {NODE}:{NODE_PORT_LOCAL} (Local): {t:?}");
        for c in &conns {
            assert_eq!(c.peer, format!("{NODE}:{NODE_PORT_LOCAL}"), "{c:?}");
            assert_eq!(c.seen, POD_A, "pod traffic is not masqueraded: {c:?}");
        }
        check_known(
            t.len() == 2,
            KNOWN_BUG_POD_TO_LOCAL_NODE_PORT,
            &format!(
                "pod -> NodePort with externalTrafficPolicy Local: kube-proxy sends pod traffic \
                 to every endpoint (KUBE-EXT `-s <cluster-cidr> -j KUBE-SVC`), but only the \
                 local one answered: {t:?}"
            ),
        );
    }

    {
        let _s = step("11. session affinity (ClientIP): every connection to the same endpoint");
        let conns = tcp_conns(&pa, STICKY, 80, 10, 64);
        let t = tally(&conns);
        println!("  10 connections to {STICKY}:80: {t:?}");
        assert_eq!(t.len(), 1, "affinity must keep one endpoint: {t:?}");
        assert!(conns
            .iter()
            .all(|c| c.peer == format!("{STICKY}:80") && c.seen == POD_A));
    }

    {
        let _s = step("12. endpoint removed: new connections only go to the one left");
        let rt = guard.rt.as_ref().expect("runtime");
        let mut web = nf.services().get("web").expect("web").spec().clone();
        web.endpoints.retain(|e| *e.addr.ip() != ip4(POD_B));
        nf.upsert_service(web, rt.now()).expect("upsert web");
        let conns = tcp_conns(&pa, WEB, 80, 10, 64);
        let t = tally(&conns);
        println!("  10 connections to {WEB}:80 with node2 only: {t:?}");
        assert!(
            conns.iter().all(|c| c.server == "node2" && c.seen == POD_A),
            "{t:?}"
        );
    }

    {
        let _s = step("13. no checksum errors in any namespace's kernel");
        for (ns, before) in namespaces.iter().zip(&csum_before) {
            let after = csum_errors(ns);
            assert_eq!(
                &after, before,
                "{}: the kernel counted checksum errors (after step 0 / now)",
                ns.name
            );
        }
    }

    // Counters, final once the workers stopped.
    if let Some(rt) = guard.rt.take() {
        rt.stop();
    }
    let st = dp.control().stats();
    println!("{prefix}: datapath counters:\n{st}");
    let rx_total: u64 = st.ports.iter().map(|p| p.rx_packets).sum();
    assert_eq!(
        rx_total,
        st.accounted(),
        "every received frame must be forwarded, flooded, local, queued or dropped once:\n{st}"
    );
    assert_eq!(
        st.drop_count(DropReason::NoEndpoint),
        2,
        "the two rejected probes:\n{st}"
    );
    common::assert_no_drops(
        &st,
        &[
            DropReason::BadIpHeader,
            DropReason::BadIpChecksum,
            DropReason::BadOffload,
            DropReason::FragNeeded,
            DropReason::NoRoute,
            DropReason::NeighFailed,
            DropReason::NeighQueueOverflow,
            DropReason::NeighTableFull,
            DropReason::TxQueueFull,
            DropReason::Oversize,
            DropReason::CtFull,
            DropReason::NatExhausted,
            DropReason::NatUntranslatable,
            // IPv6 is off in every namespace: nothing but IPv4 and ARP reaches the router.
            DropReason::UnsupportedProtocol,
            // Every packet of these connections is valid for a Linux-like tracker.
            DropReason::CtInvalid,
        ],
    );
    assert_eq!(st.generated_lost, 0, "router frames lost:\n{st}");

    drop(guard);
    println!("{prefix}: done in {:.1}s", started.elapsed().as_secs_f64());
}

/// A pod pings an address outside the cluster whose only route goes through a default gateway
/// that never answers ARP, with its traffic masqueraded out of the uplink. The echo request is
/// masqueraded before it waits for ARP, so the host unreachable tapyard makes when resolution
/// fails is about a packet from the node's own address; translated back through the
/// connection (as Linux translates an error `icmp_send` attached the connection to), it
/// reaches the pod within ~3 s, and `ping` reports it from the address Linux reports it from
/// in the same setup (the uplink's: the packet had left with it). A TTL-1 ping through the
/// same NAT gets time exceeded from the pod's gateway, as on Linux. Plain TAPs, one worker.
#[test]
#[cfg_attr(
    not(tapyard_root),
    ignore = "needs root: TAP devices and network namespaces (runs as root, as in CI)"
)]
fn a_pod_behind_masquerade_is_told_its_dead_gateway_is_unreachable() {
    if let Some(why) = skip_reason(&[("ping", "-V")]) {
        skip(&why);
        return;
    }
    let (pid, tag) = name_tag();
    let (tap_a, tap_up) = (format!("tyd{pid}a"), format!("tyd{pid}u"));
    let ns_name = |what: &str| format!("tyd-{what}-{pid}-{tag}");
    let far = "198.18.0.77";
    let mut builder = Datapath::builder();
    let cni0 = builder.add_bridge(BridgeConfig::new("cni0")).unwrap();
    let id_a = builder.add_port(tap_a.clone(), Some(cni0)).unwrap();
    builder
        .add_router_iface(
            IfaceConfig::new("cni0", MacAddr::local(0x0217_0101), ip4(GW), 24),
            Some(cni0),
        )
        .unwrap();
    let (eth0, id_up) = builder
        .add_router_iface(
            IfaceConfig::new("eth0", MacAddr::local(0x0217_1302), ip4(NODE), 24),
            None,
        )
        .unwrap();
    let cluster = Prefix::new(Ipv4Addr::new(10, 217, 0, 0), 16);
    builder
        .netfilter(NatConfig {
            rules: NatRules {
                cluster_cidr: Some(cluster),
                masquerade: vec![MasqueradeRule {
                    out: eth0,
                    src: Some(cluster),
                    except_dst: Some(cluster),
                }],
                ..NatRules::default()
            },
            ..NatConfig::default()
        })
        .unwrap();
    let dp = Arc::new(builder.build());
    // Nobody on the uplink's wire has this address.
    let dead_gw = "172.19.0.1";
    dp.control()
        .add_route(route("0.0.0.0", 0, NextHop::Via(eth0, ip4(dead_gw))))
        .unwrap();
    let mut guard = Guard::default();
    for (tap, id) in [(&tap_a, id_a), (&tap_up, id_up)] {
        match open_tap(TapKind::Plain, tap) {
            Ok(p) => guard.ports.push((id, Arc::new(p))),
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                skip(&format!(
                    "skipping: cannot create TAP {tap} ({e}): no CAP_NET_ADMIN"
                ));
                return;
            }
            Err(e) => panic!("cannot open TAP {tap}: {e}"),
        }
    }
    let rt = Runtime::start(
        dp.clone(),
        guard.ports.clone(),
        RuntimeConfig {
            workers: 1,
            ..Default::default()
        },
    )
    .expect("start runtime");
    guard.rt = Some(rt);
    let pa = guard.ns(&ns_name("poda"));
    let wire = guard.ns(&ns_name("wire"));
    for ns in [&pa, &wire] {
        ns.disable_ipv6();
    }
    pa.take_link(&tap_a, Some(&format!("{POD_A}/24")));
    pa.route("default", GW);
    wire.take_link(&tap_up, None);
    pa.ping_ok(GW);

    let t = Instant::now();
    let out = run_output(&pa.exec(&["ping", "-n", "-c1", "-W5", far]));
    let secs = t.elapsed().as_secs_f64();
    let text = String::from_utf8_lossy(&out.stdout);
    println!("ping {far} through the dead gateway ({secs:.1}s):\n{text}");
    assert!(
        text.contains(&format!(
            "From {NODE} icmp_seq=1 Destination Host Unreachable"
        )),
        "no host unreachable from {NODE}:\n{text}"
    );
    assert!(secs < 5.0, "the error took {secs:.1}s (Linux: ~3 s)");
    let now = guard.rt.as_ref().expect("runtime").now();
    let ct = dp.control().netfilter().unwrap().conntrack().fmt_dump(now);
    let echo = ct_line(
        &ct,
        &[&format!("src={POD_A} dst={far} "), &format!("dst={NODE} ")],
    );
    assert!(echo.starts_with("icmp"), "the echo was masqueraded:\n{ct}");

    let out = run_output(&pa.exec(&["ping", "-n", "-c1", "-t1", "-W2", far]));
    let text = String::from_utf8_lossy(&out.stdout);
    println!("ping -t1 {far}:\n{text}");
    assert!(
        text.contains(&format!("From {GW} icmp_seq=1 Time to live exceeded")),
        "no time exceeded from {GW}:\n{text}"
    );
    let st = dp.control().stats();
    assert!(st.drop_count(DropReason::NeighFailed) >= 1, "{st}");
    assert_eq!(st.drop_count(DropReason::TtlExpired), 1, "{st}");
    drop(guard);
}
