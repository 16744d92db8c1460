//! End-to-end tests of the router on real TAP devices: a node with two pod bridges and an
//! uplink, driven in-process by a [`Runtime`], with pods and a second node in network
//! namespaces.
//!
//! ```text
//!  pod A 10.215.1.2/24 ── TAP ── br-a (router iface br-a 10.215.1.1/24) ─┐
//!  pod B 10.215.2.2/24 ── TAP ── br-b (router iface br-b 10.215.2.1/24) ─┤ tapyard router
//!  node-b 10.215.100.3/24 ── TAP ── uplink iface up0 10.215.100.2/24 ────┘
//!  node-b: 10.215.3.1/24 on lo (its pod CIDR), route 10.215.1.0/24 via 10.215.100.2
//!  tapyard routes: 10.215.3.0/24 via 10.215.100.3, blackhole 10.215.9.0/24,
//!                  unreachable 10.215.8.0/24
//! ```
//!
//! Checked: (a) ping both ways between pods in different subnets, a content-checked TCP
//! transfer (the server sees pod A's own address), `traceroute -n` showing the gateway as hop
//! 1 and pod B as hop 2, and the neighbour table holding both pods with their MACs; (b) pod A
//! reaching node-b's pod CIDR through the uplink, ping and TCP, without NAT; (c) "Destination
//! Net Unreachable" from the gateway for an unrouted address, counted as `no_route`; (d) a
//! blackholed prefix: no reply, no ICMP, `blackhole` counts every ping. The offload variant
//! also checks host unreachable for a neighbour that does not answer ARP and for an
//! `unreachable` route. Variants: offload TAPs (virtio-net header, TSO) everywhere, and plain
//! TAPs everywhere (the pods' kernels segment and checksum).
//!
//! Needs root (TAP devices and namespaces) and `ip`; without them each test prints why and
//! passes. The TCP parts need `python3` and the traceroute part `traceroute`; each is skipped
//! with a message when missing. Names carry the process id; a guard removes everything on
//! success and failure alike. Traffic only goes to addresses inside the namespaces created
//! here (10.215.x.y), and to 10.216.0.1, which no route covers (the router answers it).
//!
//! Run with `sudo -E cargo test --test e2e netns_router:: -- --nocapture` to see the details.

use crate::common;

use std::sync::Arc;
use std::time::Instant;

use crate::common::{have, route, run, run_output, skip_reason, Guard, TapKind, CMD_TIMEOUT};
use tapyard::l3::IfaceConfig;
use tapyard::l3::NextHop;
use tapyard::{BridgeConfig, Datapath, DropReason, MacAddr};

/// Bytes sent over TCP from pod A to pod B (at least 10 MB).
const TCP_BYTES: usize = 16 << 20;
/// Bytes sent over TCP from pod A to node-b's pod CIDR.
const TCP_BYTES_NODE: usize = 4 << 20;
/// Port of the TCP listeners.
const TCP_PORT: u16 = 42215;

const GW_A: &str = "10.215.1.1";
const GW_B: &str = "10.215.2.1";
const POD_A: &str = "10.215.1.2";
const POD_B: &str = "10.215.2.2";
const UPLINK: &str = "10.215.100.2";
const NODE_B: &str = "10.215.100.3";
const NODE_B_POD: &str = "10.215.3.1";
/// No route covers it: the router answers with net unreachable; nothing is sent anywhere.
const UNROUTED: &str = "10.216.0.1";
const BLACKHOLED: &str = "10.215.9.1";
const UNREACHABLE_ROUTE: &str = "10.215.8.1";
/// On br-b's subnet, but nobody has it: ARP fails, host unreachable.
const ABSENT: &str = "10.215.2.99";

/// A namespace holding one TAP with an address.
struct Host {
    ns: String,
    tap: String,
    addr: &'static str,
}

impl Host {
    fn exec<'a>(&'a self, args: &[&'a str]) -> Vec<&'a str> {
        let mut v = vec!["ip", "netns", "exec", self.ns.as_str()];
        v.extend_from_slice(args);
        v
    }

    /// Moves the TAP into the namespace, addresses it (/24), brings it and `lo` up.
    fn attach(&self) {
        run(&["ip", "link", "set", &self.tap, "netns", &self.ns]);
        let cidr = format!("{}/24", self.addr);
        run(&["ip", "-n", &self.ns, "addr", "add", &cidr, "dev", &self.tap]);
        run(&["ip", "-n", &self.ns, "link", "set", "lo", "up"]);
        run(&["ip", "-n", &self.ns, "link", "set", &self.tap, "up"]);
    }

    fn route(&self, dst: &str, via: &str) {
        run(&["ip", "-n", &self.ns, "route", "add", dst, "via", via]);
    }

    /// The MAC of the host's interface.
    fn mac(&self) -> MacAddr {
        let path = format!("/sys/class/net/{}/address", self.tap);
        let out = run(&self.exec(&["cat", &path]));
        out.trim()
            .parse()
            .unwrap_or_else(|e| panic!("bad MAC {out:?} for {}: {e}", self.tap))
    }

    /// Pings `to` (optionally from source address `from`) and panics unless every reply came.
    fn ping_ok(&self, to: &str, from: Option<&str>) {
        let mut args = vec!["ping", "-n", "-c", "3", "-i", "0.2", "-W", "2"];
        if let Some(f) = from {
            args.extend(["-I", f]);
        }
        args.push(to);
        let out = run_output(&self.exec(&args));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains(" 0% packet loss"),
            "ping {} -> {to} failed ({}):\n{text}{}",
            self.ns,
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        println!(
            "ping {} -> {to}: {}",
            self.ns,
            lines[lines.len().saturating_sub(2)..].join("; ")
        );
    }

    /// Pings `to` `count` times expecting no echo reply; returns ping's output.
    fn ping_fail(&self, to: &str, count: u32, wait: &str) -> String {
        let c = count.to_string();
        let out = run_output(&self.exec(&["ping", "-n", "-c", &c, "-i", "0.2", "-W", wait, to]));
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            !out.status.success(),
            "ping {} -> {to} should have failed:\n{text}",
            self.ns
        );
        assert!(
            text.contains(&format!("{count} packets transmitted, 0 received")),
            "ping {} -> {to}: expected {count} sent and no reply:\n{text}",
            self.ns
        );
        println!(
            "ping {} -> {to} (expected to fail):\n{}",
            self.ns,
            text.trim_end()
        );
        text
    }
}

/// Receives everything from one connection, sends back `<bytes> <sha256> <peer address>` and
/// prints the same line.
const SERVER_PY: &str = r#"
import hashlib, socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(1)
s.settimeout(15)
print("ready", flush=True)
c, peer = s.accept()
c.settimeout(15)
h = hashlib.sha256()
n = 0
while True:
    d = c.recv(1 << 16)
    if not d:
        break
    h.update(d)
    n += len(d)
line = "%d %s %s" % (n, h.hexdigest(), peer[0])
c.sendall((line + "\n").encode())
c.close()
print(line, flush=True)
"#;

/// Sends `<n>` deterministic pseudo-random bytes, reads the server's report until it closes,
/// then prints `<bytes> <sha256> <seconds> <server's report>`.
const CLIENT_PY: &str = r#"
import hashlib, random, socket, sys, time
addr, port, n, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
data = random.Random(seed).getrandbits(8 * n).to_bytes(n, "little")
digest = hashlib.sha256(data).hexdigest()
c = socket.create_connection((addr, port), timeout=15)
t = time.monotonic()
c.sendall(data)
c.shutdown(socket.SHUT_WR)
reply = b""
while True:
    d = c.recv(1 << 16)
    if not d:
        break
    reply += d
print(n, digest, "%.3f" % (time.monotonic() - t), reply.decode().strip(), flush=True)
"#;

/// Sends `bytes` over TCP from `from` to a listener at `addr` in `server`, checks that the
/// same bytes arrived, that the reply came back, and that the server saw `expect_peer`.
fn tcp_exchange(
    guard: &mut Guard,
    dp: &Datapath,
    from: &Host,
    server: &Host,
    addr: &str,
    bytes: usize,
    expect_peer: &str,
) {
    let port = TCP_PORT.to_string();
    let server_args = server.exec(&["python3", "-c", SERVER_PY, addr, &port]);
    let label = format!("the TCP server in {}", server.ns);
    let rx = guard.spawn_reporting_server(&label, &server_args);

    let n = bytes.to_string();
    let out = run_output(&from.exec(&["python3", "-c", CLIENT_PY, addr, &port, &n, "215"]));
    assert!(
        out.status.success(),
        "TCP client {} -> {addr} ({bytes} bytes) failed ({}):\n{}\ndatapath counters:\n{}",
        from.ns,
        out.status,
        String::from_utf8_lossy(&out.stderr).trim_end(),
        dp.control().stats()
    );
    let client = String::from_utf8_lossy(&out.stdout).into_owned();
    let received = rx
        .recv_timeout(CMD_TIMEOUT)
        .unwrap_or_else(|_| panic!("the TCP server in {} reported nothing", server.ns));
    let sent: Vec<&str> = client.split_whitespace().collect();
    let got: Vec<&str> = received.split_whitespace().collect();
    assert_eq!(sent.len(), 6, "bad client output {client:?}");
    assert_eq!(got.len(), 3, "bad server output {received:?}");
    assert_eq!(sent[0], n, "client sent a different byte count");
    assert_eq!(
        got[0], sent[0],
        "byte count differs: sent {client:?}, got {received:?}"
    );
    assert_eq!(
        got[1], sent[1],
        "sha256 differs: sent {client:?}, got {received:?}"
    );
    assert_eq!(
        &sent[3..],
        &got[..],
        "the server's reply did not come back intact to the client"
    );
    assert_eq!(
        got[2], expect_peer,
        "the server saw peer {} instead of {expect_peer} (address rewritten?)",
        got[2]
    );
    let secs: f64 = sent[2].parse().unwrap_or(0.0);
    let mbit = if secs > 0.0 {
        bytes as f64 * 8.0 / secs / 1e6
    } else {
        0.0
    };
    println!(
        "tcp {} -> {addr}: {} bytes in {secs:.3}s ({mbit:.0} Mbit/s), sha256 matches, server saw peer {}",
        from.ns, got[0], got[2]
    );
}

/// `traceroute -n` from `from` to `to`: each hop's first address, in order.
fn traceroute(from: &Host, to: &str) -> Vec<String> {
    let out = run(&from.exec(&["traceroute", "-n", "-q", "1", "-w", "3", "-m", "6", to]));
    println!("traceroute {} -> {to}:\n{}", from.ns, out.trim_end());
    out.lines()
        .skip(1)
        .map(|l| l.split_whitespace().nth(1).unwrap_or("?").to_string())
        .collect()
}

#[test]
#[cfg_attr(
    not(tapyard_root),
    ignore = "needs root: TAP devices and network namespaces (runs as root, as in CI)"
)]
fn routed_node_with_offload_taps() {
    routed_node("tyr", TapKind::Offload, true);
}

/// The same topology on plain TAPs: pod-to-pod and cross-node parts, no error cases.
#[test]
#[cfg_attr(
    not(tapyard_root),
    ignore = "needs root: TAP devices and network namespaces (runs as root, as in CI)"
)]
fn routed_node_with_plain_taps() {
    routed_node("typ", TapKind::Plain, false);
}

/// Builds the node (see the module docs) with TAPs of `kind`; `prefix` (3 bytes) keeps the
/// names of concurrently running tests apart; `errors` runs the ICMP error cases as well.
fn routed_node(prefix: &str, kind: TapKind, errors: bool) {
    if let Some(why) = skip_reason(&[("ping", "-V")]) {
        // CI runs as root with the tools installed by .ci/run: a skip there is a failure.
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true but {why}"
        );
        eprintln!("{why}");
        return;
    }
    let started = Instant::now();
    let pid = std::process::id();
    let tag = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() % 100_000);
    let a = Host {
        ns: format!("{prefix}-a-{pid}-{tag}"),
        tap: format!("{prefix}{pid}a"), // at most 3 + 7 + 1 = 11 bytes
        addr: POD_A,
    };
    let b = Host {
        ns: format!("{prefix}-b-{pid}-{tag}"),
        tap: format!("{prefix}{pid}b"),
        addr: POD_B,
    };
    let nb = Host {
        ns: format!("{prefix}-nodeb-{pid}-{tag}"),
        tap: format!("{prefix}{pid}u"),
        addr: NODE_B,
    };

    // The node: two pod bridges with their gateways, an uplink, routes.
    let ip = |s: &str| s.parse().expect("address");
    let mut builder = Datapath::builder();
    let br_a = builder.add_bridge(BridgeConfig::new("br-a")).unwrap();
    let br_b = builder.add_bridge(BridgeConfig::new("br-b")).unwrap();
    let id_a = builder.add_port(a.tap.clone(), Some(br_a)).unwrap();
    let id_b = builder.add_port(b.tap.clone(), Some(br_b)).unwrap();
    let gw_mac_a = MacAddr::local(0x0215_0101);
    builder
        .add_router_iface(IfaceConfig::new("br-a", gw_mac_a, ip(GW_A), 24), Some(br_a))
        .unwrap();
    builder
        .add_router_iface(
            IfaceConfig::new("br-b", MacAddr::local(0x0215_0201), ip(GW_B), 24),
            Some(br_b),
        )
        .unwrap();
    let (up_if, id_up) = builder
        .add_router_iface(
            IfaceConfig::new("up0", MacAddr::local(0x0215_6402), ip(UPLINK), 24),
            None,
        )
        .unwrap();
    let dp = Arc::new(builder.build());
    dp.control()
        .add_route(route("10.215.3.0", 24, NextHop::Via(up_if, ip(NODE_B))))
        .unwrap();
    dp.control()
        .add_route(route("10.215.9.0", 24, NextHop::Blackhole))
        .unwrap();
    dp.control()
        .add_route(route("10.215.8.0", 24, NextHop::Unreachable))
        .unwrap();
    let mut routes = String::new();
    dp.control().fmt_routes(&mut routes).unwrap();
    println!("{prefix}: routes:\n{routes}");

    let mut guard = Guard::default();
    println!("{prefix}: {kind:?} TAPs");
    let taps = [
        (id_a, &a.tap[..], kind),
        (id_b, &b.tap[..], kind),
        (id_up, &nb.tap[..], kind),
    ];
    if !common::attach_taps(&mut guard, &dp, &taps) {
        return;
    }

    for h in [&a, &b, &nb] {
        guard.ns(&h.ns);
        h.attach();
    }
    a.route("default", GW_A);
    b.route("default", GW_B);
    nb.route("10.215.1.0/24", UPLINK);
    // node-b's pod CIDR: the whole /24 is local on lo.
    run(&[
        "ip",
        "-n",
        &nb.ns,
        "addr",
        "add",
        &format!("{NODE_B_POD}/24"),
        "dev",
        "lo",
    ]);

    let python = have("python3", "-V");
    if !python {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true but python3 is not installed"
        );
        eprintln!("python3 not found: skipping the TCP parts of the test");
    }

    // (a) Pods in different subnets (the TCP transfer comes last, below).
    a.ping_ok(GW_A, None);
    a.ping_ok(POD_B, None);
    b.ping_ok(POD_A, None);
    if have("traceroute", "--version") {
        let hops = traceroute(&a, POD_B);
        assert_eq!(
            hops,
            vec![GW_A.to_string(), POD_B.to_string()],
            "traceroute should show the gateway, then pod B"
        );
    } else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true but traceroute is not installed"
        );
        eprintln!("traceroute not found: skipping the traceroute check");
    }

    // (b) Across the uplink to the other node's pod CIDR (TCP below).
    a.ping_ok(NODE_B_POD, None);
    nb.ping_ok(POD_A, Some(NODE_B_POD));

    if errors {
        // (c) No route: net unreachable from the gateway.
        let before = dp.control().stats().drop_count(DropReason::NoRoute);
        let out = a.ping_fail(UNROUTED, 3, "1");
        assert!(
            out.contains(&format!(
                "From {GW_A} icmp_seq=1 Destination Net Unreachable"
            )),
            "expected net unreachable from {GW_A}:\n{out}"
        );
        let no_route = dp.control().stats().drop_count(DropReason::NoRoute) - before;
        assert_eq!(no_route, 3, "no_route should count each of the 3 pings");

        // (d) Blackhole: nothing comes back, every ping counted.
        let before = dp.control().stats().drop_count(DropReason::Blackhole);
        let out = a.ping_fail(BLACKHOLED, 4, "1");
        assert!(
            !out.contains("From ") && !out.contains("errors"),
            "a blackhole must not answer:\n{out}"
        );
        let bh = dp.control().stats().drop_count(DropReason::Blackhole) - before;
        assert_eq!(bh, 4, "blackhole should count each of the 4 pings");

        // An `unreachable` route: host unreachable, as Linux's route type.
        let out = a.ping_fail(UNREACHABLE_ROUTE, 2, "1");
        assert!(
            out.contains(&format!(
                "From {GW_A} icmp_seq=1 Destination Host Unreachable"
            )),
            "expected host unreachable from {GW_A}:\n{out}"
        );

        // A next hop that never answers ARP: host unreachable after the solicitations.
        let before = dp.control().stats().drop_count(DropReason::NeighFailed);
        let out = a.ping_fail(ABSENT, 1, "6");
        assert!(
            out.contains(&format!(
                "From {GW_A} icmp_seq=1 Destination Host Unreachable"
            )),
            "expected host unreachable from {GW_A} after ARP failed:\n{out}"
        );
        let failed = dp.control().stats().drop_count(DropReason::NeighFailed) - before;
        assert_eq!(failed, 1, "neigh_failed should count the one ping");
    }

    // TCP last: the ICMP cases above do not depend on it.
    if python {
        // (a) A content-checked transfer between the pods; B sees A's own address.
        tcp_exchange(&mut guard, &dp, &a, &b, POD_B, TCP_BYTES, POD_A);
        // (b) An exchange with a listener in node-b's pod CIDR, across the uplink, no NAT.
        tcp_exchange(&mut guard, &dp, &a, &nb, NODE_B_POD, TCP_BYTES_NODE, POD_A);
    }

    // The neighbour table: both pods and node-b, with their MACs and a usable state.
    let rt = guard.rt.as_ref().expect("runtime");
    let mut neigh = String::new();
    dp.control().fmt_neigh(rt.now(), &mut neigh).unwrap();
    println!("{prefix}: neighbours:\n{neigh}");
    for (host, dev) in [(&a, "br-a"), (&b, "br-b"), (&nb, "up0")] {
        let mac = host.mac();
        let want = format!("{} dev {dev} lladdr {mac} ", host.addr);
        let line = neigh
            .lines()
            .find(|l| l.starts_with(&want))
            .unwrap_or_else(|| panic!("no `{want}...` line in the neighbour table:\n{neigh}"));
        let state = line.rsplit(' ').next().unwrap_or("");
        assert!(
            ["REACHABLE", "STALE", "DELAY", "PROBE"].contains(&state),
            "unexpected state for {}: {line}",
            host.addr
        );
    }
    if errors {
        assert!(
            neigh.contains(&format!("{ABSENT} dev br-b  FAILED")),
            "{ABSENT} should be FAILED:\n{neigh}"
        );
    }
    let mut fdb = String::new();
    dp.control().fmt_fdb(rt.now(), &mut fdb).unwrap();
    println!("{prefix}: fdb:\n{fdb}");
    assert!(
        fdb.contains(&format!("{gw_mac_a} dev br-a master br-a static")),
        "the gateway's MAC should be a static entry:\n{fdb}"
    );

    // Counters, final once the workers stopped.
    if let Some(rt) = guard.rt.take() {
        rt.stop();
    }
    let st = dp.control().stats();
    println!("{prefix}: counters:\n{st}");
    if let Some(r) = dp.control().router() {
        println!("{prefix}: router counters: {:?}", r.counters);
    }
    let rx_total: u64 = st.ports.iter().map(|p| p.rx_packets).sum();
    assert_eq!(
        rx_total,
        st.accounted(),
        "every received frame must be forwarded, flooded, local, queued or dropped once:\n{st}"
    );
    common::assert_no_drops(
        &st,
        &[
            DropReason::BadIpHeader,
            DropReason::BadIpChecksum,
            DropReason::BadOffload,
            DropReason::FragNeeded,
            DropReason::NeighQueueOverflow,
            DropReason::NeighTableFull,
            DropReason::TxQueueFull,
            DropReason::Oversize,
        ],
    );
    assert_eq!(st.generated_lost, 0, "router frames lost:\n{st}");
    if python {
        let pa = st.port(&a.tap).expect("port a");
        let pb = st.port(&b.tap).expect("port b");
        let n = TCP_BYTES as u64;
        assert!(pa.rx_bytes > n, "A sent {n} bytes; its port: {pa:?}");
        assert!(pb.tx_bytes > n, "A sent {n} bytes; B's port: {pb:?}");
        if kind == TapKind::Offload {
            let mean = pa.rx_bytes / pa.rx_packets.max(1);
            println!("{prefix}: mean frame from pod A: {mean} bytes");
        }
    }

    drop(guard);
    println!("{prefix}: done in {:.1}s", started.elapsed().as_secs_f64());
}
