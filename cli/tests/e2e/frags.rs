//! Fragments through conntrack and NAT, end to end: `tapyard run` with a dual-stack bridge
//! (pods A and B) and an uplink to an outside host, masquerade, and a dual-stack UDP Service
//! whose endpoint is pod B. Datagrams of 3000 and 9000 bytes leave the pods' kernels in
//! fragments; tapyard puts them together in front of conntrack, translates them whole and
//! sends them on as fragments. Checked by content, both families, both ways:
//!
//! - pod A → outside (masqueraded to the uplink's address) and the echo back;
//! - pod A → the UDP ClusterIP (DNAT'd to pod B) and pod B's echo, switched on the bridge
//!   and translated back (br_netfilter);
//! - `ping -s 3000` from pod A to the gateway (both families): put together for the
//!   router's own address and answered in fragments;
//! - a flood of fragments that never complete (pod A, raw frames): refused once the
//!   reassembly tables are full (`frag_table_full`), tapyard's memory flat from one flood to
//!   the next, and, once the held fragments timed out (15 s), big datagrams pass again.
//!
//! ```text
//!  pod-a 10.223.1.2 fd00:223:0:1::2 ─ TAP ─┐
//!  pod-b 10.223.1.3 fd00:223:0:1::3 ─ TAP ─┴ bridge (gw .1) ─ tapyard (own ns) ─ uplink TAP
//!                                                    10.224.0.2 fd00:224::2 ─ outside ns
//!                                                    (10.224.0.1, fd00:224::1, echo server)
//! ```
//!
//! Needs root, `ip`, `python3` and `ping`; without them the test says why and passes, except with
//! `CI=true`. Traffic goes only to addresses inside the namespaces the test creates.

use std::time::Duration;

use crate::common::*;

const GW4: &str = "10.223.1.1";
const GW6: &str = "fd00:223:0:1::1";
const GW_MAC: &str = "02:00:0a:df:01:01";
const POD_A4: &str = "10.223.1.2";
const POD_A6: &str = "fd00:223:0:1::2";
const POD_B4: &str = "10.223.1.3";
const POD_B6: &str = "fd00:223:0:1::3";
const UPLINK4: &str = "10.224.0.2";
const UPLINK6: &str = "fd00:224::2";
const OUTSIDE4: &str = "10.224.0.1";
const OUTSIDE6: &str = "fd00:224::1";
const DNS4: &str = "10.96.7.53";
const DNS6: &str = "fd00:96::7:53";

/// A UDP echo server on both families: `port`.
const ECHO_PY: &str = r#"
import socket, sys
s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
s.bind(("::", int(sys.argv[1])))
while True:
    data, peer = s.recvfrom(65535)
    s.sendto(data, peer)
"#;

/// Sends a `size`-byte datagram to `addr` `port` and waits for its echo: prints `ok SIZE`
/// when the same bytes came back, else what came.
const CLIENT_PY: &str = r#"
import socket, sys
addr, port, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
data = bytes((i * 7 + size) % 256 for i in range(size))
s = socket.socket(fam, socket.SOCK_DGRAM)
s.settimeout(2)
for _ in range(4):
    s.sendto(data, (addr, port))
    try:
        back, peer = s.recvfrom(65535)
    except socket.timeout:
        continue
    print("ok %d %s" % (len(back), peer[0]) if back == data else "bad %d %s" % (len(back), peer[0]))
    sys.exit(0)
print("timeout")
"#;

/// Sends `count` first fragments of datagrams that never complete (MF set, 1400 bytes, a new
/// identification each) from interface `dev` to `dst` through the gateway, as raw frames.
const FLOOD_PY: &str = r#"
import socket, struct, sys
dev, gw, dst, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
mac = bytes.fromhex(open("/sys/class/net/%s/address" % dev).read().strip().replace(":", ""))
gwmac = bytes.fromhex(gw.replace(":", ""))
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind((dev, 0))
def csum(b):
    t = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    while t > 0xffff:
        t = (t & 0xffff) + (t >> 16)
    return (~t) & 0xffff
src6 = dst6 = None
if ":" in dst:
    src = [l.split()[0] for l in open("/proc/net/if_inet6") if l.split()[5] == dev and not l.startswith("fe80")][0]
    src6, dst6 = bytes.fromhex(src), socket.inet_pton(socket.AF_INET6, dst)
else:
    src4 = socket.inet_aton(sys.argv[5])
    dst4 = socket.inet_aton(dst)
data = bytes(1352)
for i in range(count):
    if src6:
        frag = struct.pack("!BBHI", 17, 0, 1, 0x10000 + i)
        ip = struct.pack("!IHBB", 0x60000000, 8 + len(data), 44, 64) + src6 + dst6 + frag
        eth = gwmac + mac + b"\x86\xdd"
    else:
        h = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(data) + 28, i & 0xffff, 0x2000, 64, 17, 0, src4, dst4)
        ip = h[:10] + struct.pack("!H", csum(h)) + h[12:]
        eth = gwmac + mac + b"\x08\x00"
    s.send(eth + ip + data + (bytes(28) if not src6 else b""))
print("sent", count)
"#;

struct Names {
    id: u32,
    bridge: String,
    tap_a: String,
    tap_b: String,
    uplink: String,
    ns_node: String,
    ns_a: String,
    ns_b: String,
    ns_out: String,
    dir: std::path::PathBuf,
    socket: std::path::PathBuf,
    config: std::path::PathBuf,
    log: std::path::PathBuf,
}

impl Names {
    fn new() -> Names {
        let id = std::process::id() % 100_000;
        let dir = std::env::temp_dir().join(format!("tapyard-frags-{id}"));
        Names {
            id,
            bridge: format!("tfc{id}"),
            tap_a: format!("tfa{id}"),
            tap_b: format!("tfb{id}"),
            uplink: format!("tfu{id}"),
            ns_node: format!("tf-node-{id}"),
            ns_a: format!("tf-a-{id}"),
            ns_b: format!("tf-b-{id}"),
            ns_out: format!("tf-out-{id}"),
            socket: dir.join("ctl.sock"),
            config: dir.join("node.toml"),
            log: dir.join("run.log"),
            dir,
        }
    }

    fn config(&self) -> String {
        format!(
            r#"{node}
[[bridge]]
name = "{br}"
address = ["{GW4}/24", "{GW6}/64"]
mac = "{GW_MAC}"
ports = ["{a}", "{b}"]

[[uplink]]
name = "{up}"
address = ["{UPLINK4}/24", "{UPLINK6}/64"]

[masquerade]
out = "{up}"

[[service]]
name = "dns"
cluster_ip = ["{DNS4}", "{DNS6}"]
protocol = "udp"
port = 53
endpoints = ["{POD_B4}:5353", "[{POD_B6}]:5353"]
"#,
            node = node_toml(
                &format!("frags-{}", self.id),
                r#"["10.223.0.0/16", "fd00:223::/56"]"#,
                &self.socket,
                Some(&self.dir.join("state")),
            ),
            br = self.bridge,
            a = self.tap_a,
            b = self.tap_b,
            up = self.uplink,
        )
    }
}

/// `size` bytes to `addr` `port` from `ns` and back, whole: the address the answer came from.
fn echo(ns: &str, addr: &str, port: u16, size: usize) -> String {
    let (_, out) = in_ns(
        ns,
        &[
            "python3",
            "-c",
            CLIENT_PY,
            addr,
            &port.to_string(),
            &size.to_string(),
        ],
    );
    let words: Vec<&str> = out.split_whitespace().collect();
    assert!(
        words.first() == Some(&"ok") && words.get(1) == Some(&size.to_string().as_str()),
        "{size} bytes to {addr}:{port} from {ns}: {out}"
    );
    words.get(2).unwrap_or(&"").to_string()
}

/// Resident memory of process `pid`, KiB.
fn rss_kib(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// A drop counter of `show stats --json`.
fn drops(n: &Names, reason: &str) -> u64 {
    let out = tapyard_ok_at(&n.socket, &["show", "stats", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v["drops"][reason].as_u64().unwrap_or(0)
}

#[test]
#[cfg_attr(
    not(tapyard_root),
    ignore = "needs root: TAP devices and network namespaces (runs as root, as in CI)"
)]
fn fragments_through_masquerade_and_a_udp_cluster_ip() {
    if skip_or_fail(
        "frags",
        missing6(&[
            ("ip", "-V", "iproute2"),
            ("python3", "-V", "python3"),
            ("ping", "-V", "iputils-ping"),
        ]),
    ) {
        return;
    }
    let n = Names::new();
    let _ = std::fs::remove_dir_all(&n.dir);
    std::fs::create_dir_all(&n.dir).unwrap();
    std::fs::write(&n.config, n.config()).unwrap();
    let mut g = Guard::new(&n.dir, &n.log);
    g.ns(&n.ns_node);
    g.start_node(Some(&n.ns_node), &n.config, &[], &n.socket);
    for ns in [&n.ns_a, &n.ns_b, &n.ns_out] {
        g.ns(ns);
    }
    let pods = [
        (&n.ns_a, &n.tap_a, POD_A4, POD_A6),
        (&n.ns_b, &n.tap_b, POD_B4, POD_B6),
    ];
    for (ns, tap, v4, v6) in pods {
        let cidrs = [format!("{v4}/24"), format!("{v6}/64")];
        ns_named(ns).attach(Some(&n.ns_node), tap, &[&cidrs[0], &cidrs[1]], &[GW4, GW6]);
    }
    let out = [format!("{OUTSIDE4}/24"), format!("{OUTSIDE6}/64")];
    ns_named(&n.ns_out).attach(Some(&n.ns_node), &n.uplink, &[&out[0], &out[1]], &[]);
    spawn_in(
        &mut g.children,
        &n.ns_out,
        &["python3", "-c", ECHO_PY, "7777"],
    );
    spawn_in(
        &mut g.children,
        &n.ns_b,
        &["python3", "-c", ECHO_PY, "5353"],
    );
    std::thread::sleep(Duration::from_millis(500));
    let a = n.ns_a.as_str();

    for size in [3000, 9000] {
        // Masqueraded: the outside host sees the node's uplink address (its echo server
        // answers that address), and the answer reaches the pod whole.
        assert_eq!(echo(a, OUTSIDE4, 7777, size), OUTSIDE4);
        assert_eq!(echo(a, OUTSIDE6, 7777, size), OUTSIDE6);
        // The ClusterIP: DNAT'd to pod B, whose answer is switched back and comes from
        // the Service address.
        assert_eq!(echo(a, DNS4, 53, size), DNS4);
        assert_eq!(echo(a, DNS6, 53, size), DNS6);
    }
    // `ping -s 3000` to the gateway: the echo request is put together for the router's own
    // address and answered, as big, in fragments.
    for ping in [["-4", GW4], ["-6", GW6]] {
        let args = ["ping", ping[0], "-c", "2", "-W", "3", "-s", "3000", ping[1]];
        let (ok, out) = in_ns(a, &args);
        assert!(ok && out.contains("2 received"), "{args:?}: {out}");
    }
    let st = tapyard_ok_at(&n.socket, &["show", "stats", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&st).unwrap();
    assert!(v["reassembled"].as_u64().unwrap_or(0) >= 20, "{st}");

    // A flood of fragments that never complete: refused once the tables are full, memory
    // flat from one flood to the next.
    let pid = g.node.as_ref().expect("the node").id();
    let flood = |dst: &str| {
        let (ok, out) = in_ns(
            a,
            &[
                "python3", "-c", FLOOD_PY, &n.tap_a, GW_MAC, dst, "6000", POD_A4,
            ],
        );
        assert!(ok && out.contains("sent 6000"), "{out}");
    };
    flood(OUTSIDE4);
    flood(OUTSIDE6);
    let after_one = rss_kib(pid);
    assert!(drops(&n, "frag_table_full") > 0, "the tables filled up");
    // Held fragments leave at their timeout (15 s) ...
    wait_for(
        "the held fragments to time out",
        Duration::from_secs(40),
        || {
            let t = drops(&n, "frag_timeout");
            (t >= 1000).then_some(()).ok_or(format!("frag_timeout {t}"))
        },
    );
    flood(OUTSIDE4);
    flood(OUTSIDE6);
    let after_two = rss_kib(pid);
    assert!(
        after_two <= after_one + 2048,
        "memory grew from one flood to the next: {after_one} KiB -> {after_two} KiB"
    );
    eprintln!(
        "tapyard VmRSS after the first flood {after_one} KiB, after the second {after_two} KiB"
    );
    // ... and once the second flood's have too, big datagrams pass again.
    std::thread::sleep(Duration::from_secs(16));
    assert_eq!(echo(a, OUTSIDE4, 7777, 3000), OUTSIDE4);
    assert_eq!(echo(a, DNS6, 53, 3000), DNS6);
}
