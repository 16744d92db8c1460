//! End-to-end tests on real TAP devices: two network namespaces ("pods") bridged by an
//! in-process [`Runtime`], with ping both ways, a content-checked TCP transfer, and checks of
//! the FDB and the counters. Three variants: plain TAPs, offload TAPs (virtio-net header), and
//! an offload TAP sending to a plain one (software segmentation and checksums).
//!
//! Needs root (to create TAP devices and namespaces) and `ip` (iproute2); without them each test
//! prints why and passes. The TCP part also needs `python3` and is skipped, with a message,
//! without it. Everything a test creates carries the process id in its name and is removed by a
//! guard's `Drop`, on success and on assertion failure alike; traffic only ever goes to
//! addresses inside the namespaces it created (10.213.x.0/24).
//!
//! Run with `sudo -E cargo test --test e2e netns_bridge:: -- --nocapture` to see the figures.

use crate::common;

use std::sync::Arc;
use std::time::Instant;

use crate::common::{have, run, run_output, skip_reason, Guard, TapKind, CMD_TIMEOUT};
use tapyard::port::TapPort;
use tapyard::{BridgeConfig, Datapath, DropReason, MacAddr};

/// Bytes sent over TCP from pod A to pod B (at least 10 MB).
const TCP_BYTES: usize = 16 << 20;
/// Port of the TCP listener inside namespace B.
const TCP_PORT: u16 = 42213;

/// One side of the bridge: a namespace holding a TAP with an address.
struct Pod {
    ns: String,
    tap: String,
    addr: String,
}

impl Pod {
    fn exec<'a>(&'a self, args: &[&'a str]) -> Vec<&'a str> {
        let mut v = vec!["ip", "netns", "exec", self.ns.as_str()];
        v.extend_from_slice(args);
        v
    }

    /// Moves the TAP into the namespace, addresses it and brings it and `lo` up.
    fn attach(&self, prefix_len: u8) {
        run(&["ip", "link", "set", &self.tap, "netns", &self.ns]);
        let cidr = format!("{}/{prefix_len}", self.addr);
        run(&["ip", "-n", &self.ns, "addr", "add", &cidr, "dev", &self.tap]);
        run(&["ip", "-n", &self.ns, "link", "set", "lo", "up"]);
        run(&["ip", "-n", &self.ns, "link", "set", &self.tap, "up"]);
    }

    /// The MAC address of the pod's interface, as the kernel in the namespace uses it.
    fn mac(&self) -> MacAddr {
        let path = format!("/sys/class/net/{}/address", self.tap);
        let out = run(&self.exec(&["cat", &path]));
        out.trim()
            .parse()
            .unwrap_or_else(|e| panic!("bad MAC {out:?} for {}: {e}", self.tap))
    }

    fn ping(&self, to: &Pod) {
        let out = run_output(&self.exec(&["ping", "-c", "3", "-i", "0.2", "-W", "2", &to.addr]));
        assert!(
            out.status.success(),
            "ping {} ({}) -> {} ({}) failed ({}):\n{}{}",
            self.ns,
            self.addr,
            to.ns,
            to.addr,
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        let summary = lines[lines.len().saturating_sub(2)..].join("; ");
        println!("ping {} -> {}: {summary}", self.ns, to.ns);
    }
}

/// Receives everything from one connection, then prints `<bytes> <sha256>`.
const SERVER_PY: &str = r#"
import hashlib, socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2])))
s.listen(1)
s.settimeout(15)
print("ready", flush=True)
c, _ = s.accept()
c.settimeout(15)
h = hashlib.sha256()
n = 0
while True:
    d = c.recv(1 << 16)
    if not d:
        break
    h.update(d)
    n += len(d)
print(n, h.hexdigest(), flush=True)
c.close()
"#;

/// Sends `<n>` deterministic pseudo-random bytes (seeded), waits for the peer to close, then
/// prints `<bytes> <sha256> <seconds>`.
const CLIENT_PY: &str = r#"
import hashlib, random, socket, sys, time
addr, port, n, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
data = random.Random(seed).getrandbits(8 * n).to_bytes(n, "little")
digest = hashlib.sha256(data).hexdigest()
c = socket.create_connection((addr, port), timeout=15)
t = time.monotonic()
c.sendall(data)
c.shutdown(socket.SHUT_WR)
while c.recv(1 << 16):
    pass
print(n, digest, "%.3f" % (time.monotonic() - t), flush=True)
"#;

/// Sends [`TCP_BYTES`] from `a` to `b` over TCP and checks that the same bytes arrived.
fn tcp_transfer(guard: &mut Guard, a: &Pod, b: &Pod) {
    let port = TCP_PORT.to_string();
    let server_args = b.exec(&["python3", "-c", SERVER_PY, &b.addr, &port]);
    let rx = guard.spawn_reporting_server("the TCP server in namespace B", &server_args);

    let n = TCP_BYTES.to_string();
    let client = run(&a.exec(&["python3", "-c", CLIENT_PY, &b.addr, &port, &n, "213"]));
    let received = rx
        .recv_timeout(CMD_TIMEOUT)
        .expect("the TCP server in namespace B reported nothing");

    let sent: Vec<&str> = client.split_whitespace().collect();
    let got: Vec<&str> = received.split_whitespace().collect();
    assert_eq!(sent.len(), 3, "bad client output {client:?}");
    assert_eq!(got.len(), 2, "bad server output {received:?}");
    assert_eq!(sent[0], n, "client sent a different byte count");
    assert_eq!(
        got[0], sent[0],
        "byte count differs: sent {client:?}, got {received:?}"
    );
    assert_eq!(
        got[1], sent[1],
        "sha256 differs: sent {client:?}, got {received:?}"
    );
    let secs: f64 = sent[2].parse().unwrap_or(0.0);
    let mbit = if secs > 0.0 {
        TCP_BYTES as f64 * 8.0 / secs / 1e6
    } else {
        0.0
    };
    println!(
        "tcp {} -> {}: {} bytes in {secs:.3}s ({mbit:.0} Mbit/s), sha256 {} matches",
        a.ns, b.ns, got[0], got[1]
    );
}

#[test]
#[cfg_attr(
    not(tapyard_root),
    ignore = "needs root: TAP devices and network namespaces (runs as root, as in CI)"
)]
fn two_namespaces_bridged_by_plain_taps() {
    bridge_two_pods("tyb", TapKind::Plain, TapKind::Plain);
}

#[test]
#[cfg_attr(
    not(tapyard_root),
    ignore = "needs root: TAP devices and network namespaces (runs as root, as in CI)"
)]
fn two_namespaces_bridged_by_offload_taps() {
    bridge_two_pods("tyo", TapKind::Offload, TapKind::Offload);
}

/// TCP super-frames from an offload TAP leave through a plain TAP: the datapath must segment
/// and checksum them in software, and the content check catches any mistake.
#[test]
#[cfg_attr(
    not(tapyard_root),
    ignore = "needs root: TAP devices and network namespaces (runs as root, as in CI)"
)]
fn offload_tap_to_plain_tap() {
    bridge_two_pods("tym", TapKind::Offload, TapKind::Plain);
}

/// Two pods on TAPs of the given kinds (A sends the TCP data to B); `prefix` (3 bytes) keeps
/// the names of concurrently running tests apart.
fn bridge_two_pods(prefix: &str, kind_a: TapKind, kind_b: TapKind) {
    if let Some(why) = skip_reason(&[]) {
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
    // A short time tag keeps names unique even if a pid is reused after a killed run.
    let tag = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() % 100_000);
    let subnet = 10 + pid % 240;
    let a = Pod {
        ns: format!("{prefix}-a-{pid}-{tag}"),
        tap: format!("{prefix}{pid}a"), // at most 3 + 7 + 1 = 11 bytes
        addr: format!("10.213.{subnet}.1"),
    };
    let b = Pod {
        ns: format!("{prefix}-b-{pid}-{tag}"),
        tap: format!("{prefix}{pid}b"),
        addr: format!("10.213.{subnet}.2"),
    };

    let mut builder = Datapath::builder();
    let br = builder
        .add_bridge(BridgeConfig::new("br0"))
        .expect("add bridge");
    let id_a = builder.add_port(a.tap.clone(), Some(br)).expect("port a");
    let id_b = builder.add_port(b.tap.clone(), Some(br)).expect("port b");
    let dp = Arc::new(builder.build());

    let mut guard = Guard::default();
    println!("{prefix}: pod A on a {kind_a:?} TAP, pod B on a {kind_b:?} TAP");
    let taps = [(id_a, &a.tap[..], kind_a), (id_b, &b.tap[..], kind_b)];
    if !common::attach_taps(&mut guard, &dp, &taps) {
        return;
    }

    guard.ns(&a.ns);
    guard.ns(&b.ns);
    a.attach(24);
    b.attach(24);

    a.ping(&b);
    b.ping(&a);

    let python = have("python3", "-V");
    if python {
        tcp_transfer(&mut guard, &a, &b);
    } else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true but python3 is not installed"
        );
        eprintln!("python3 not found: skipping the TCP transfer part of the test");
    }

    // FDB: each pod's MAC learned on its own port, nothing else.
    let (mac_a, mac_b) = (a.mac(), b.mac());
    let rt = guard.rt.as_ref().expect("runtime");
    let fdb = dp.control().fdb_dump(br, rt.now());
    let mut text = String::new();
    let _ = dp.control().fmt_fdb(rt.now(), &mut text);
    println!("{prefix}: fdb:\n{text}");
    for (mac, id, pod) in [(mac_a, id_a, &a), (mac_b, id_b, &b)] {
        let e = fdb
            .iter()
            .find(|e| e.mac == mac)
            .unwrap_or_else(|| panic!("{mac} ({}) is not in the FDB:\n{text}", pod.tap));
        assert_eq!(e.port, id, "{mac} learned on the wrong port:\n{text}");
        assert!(!e.is_static(), "{mac} should be a learned entry");
    }
    for e in &fdb {
        assert!(
            e.mac == mac_a || e.mac == mac_b,
            "unexpected station {} in the FDB:\n{text}",
            e.mac
        );
    }

    // Counters, read after the workers stopped so that they are final.
    if let Some(rt) = guard.rt.take() {
        rt.stop();
    }
    let st = dp.control().stats();
    println!("{prefix}: counters:\n{st}");
    let pa = st.port(&a.tap).expect("stats for port a");
    let pb = st.port(&b.tap).expect("stats for port b");
    for p in [pa, pb] {
        assert!(
            p.rx_packets > 0 && p.rx_bytes > 0,
            "no rx on {}: {p:?}",
            p.name
        );
        assert!(
            p.tx_packets > 0 && p.tx_bytes > 0,
            "no tx on {}: {p:?}",
            p.name
        );
    }
    if python {
        let n = TCP_BYTES as u64;
        assert!(
            pa.rx_bytes > n,
            "A sent {n} bytes but its port received {pa:?}"
        );
        assert!(
            pb.tx_bytes > n,
            "A sent {n} bytes but B's port transmitted {pb:?}"
        );
        if kind_a == TapKind::Offload {
            // The pod's kernel only hands over super-frames if the offloads took effect.
            let mean = pa.rx_bytes / pa.rx_packets.max(1);
            assert!(
                mean > 1514,
                "offload TAP {} received no TCP super-frames (mean frame {mean} bytes)",
                pa.name
            );
        }
    }
    let rx_total: u64 = st.ports.iter().map(|p| p.rx_packets).sum();
    assert_eq!(
        rx_total,
        st.forwarded + st.flooded + st.rx_drops(),
        "every received frame must be forwarded, flooded or dropped exactly once:\n{st}"
    );
    assert_eq!(st.rx_drops(), 0, "unexpected receive-side drops:\n{st}");
    assert_eq!(
        st.drop_count(DropReason::TxQueueFull),
        0,
        "TAP transmit queue overflowed:\n{st}"
    );
    common::assert_no_drops(&st, &[]);
    let tx_err = st.drop_count(DropReason::TxError) + st.drop_count(DropReason::TxLinkDown);
    let tx_dropped: u64 = st.ports.iter().map(|p| p.tx_dropped).sum();
    assert_eq!(
        tx_dropped, tx_err,
        "per-port tx_dropped must match tx drops:\n{st}"
    );

    drop(guard);
    println!("{prefix}: done in {:.1}s", started.elapsed().as_secs_f64());
}

#[test]
fn tap_open_rejects_invalid_names() {
    // Runs without root: the name is checked before the device is opened.
    for name in ["", "twenty-chars-long-xx", "a/b"] {
        let err = TapPort::open(name).expect_err(&format!("TAP name {name:?} should be refused"));
        assert_eq!(
            err.kind(),
            std::io::ErrorKind::InvalidInput,
            "{name:?}: {err}"
        );
        let msg = err.to_string();
        assert!(
            msg.contains("TAP name") && msg.contains(&format!("{name:?}")),
            "unclear error for {name:?}: {msg}"
        );
    }
}
