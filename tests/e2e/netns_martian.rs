//! End-to-end test of martian sources on real TAP devices, both families: a pod sends crafted
//! UDP packets (python3, an `AF_PACKET` raw socket) with every martian source to a host on
//! the uplink, where a raw capture (before the far kernel's own martian checks) shows that
//! none arrives, while the same packets from the pod's own address do; the `martian_source`
//! counter moved by the number of martian packets sent.
//!
//! ```text
//!  pod 10.218.1.2/24 fd00:218:1::2/64 ── TAP ── br-a (router iface 10.218.1.1/24, fd00:218:1::1/64)
//!  far 10.218.100.3/24 fd00:218:100::3/64 ── TAP ── uplink up0 (10.218.100.2/24, fd00:218:100::2/64)
//! ```
//!
//! Needs root (TAP devices and namespaces), `ip`, `ping` and `python3`; without them the test
//! says why and passes (under `CI=true` it fails instead). Traffic only goes to addresses
//! inside the namespaces made here.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use crate::common::{attach_taps, skip, skip_reason, Guard, TapKind, CMD_TIMEOUT};
use tapyard::l3::IfaceConfig;
use tapyard::{BridgeConfig, Datapath, DropReason, MacAddr};

const POD: &str = "10.218.1.2";
const POD6: &str = "fd00:218:1::2";
const FAR: &str = "10.218.100.3";
const FAR6: &str = "fd00:218:100::3";

/// Sends, on `argv[1]` to MAC `argv[2]`, one UDP datagram to port 9999 per remaining argument
/// `src>dst` (either family), carrying `tymark:<src>`: Ethernet, IP and UDP written here with
/// their checksums.
const SEND_PY: &str = r#"
import socket, struct, sys
dev, gw = sys.argv[1], bytes.fromhex(sys.argv[2].replace(":", ""))
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind((dev, 0))
me = s.getsockname()[4]
def csum(b):
    if len(b) % 2:
        b += b"\0"
    t = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    while t >> 16:
        t = (t & 0xffff) + (t >> 16)
    return (~t) & 0xffff
for arg in sys.argv[3:]:
    src, dst = arg.split(">")
    data = ("tymark:" + src).encode()
    if ":" in src:
        sa, da = socket.inet_pton(socket.AF_INET6, src), socket.inet_pton(socket.AF_INET6, dst)
        udp = struct.pack("!HHHH", 5555, 9999, 8 + len(data), 0) + data
        c = csum(sa + da + struct.pack("!IxxxB", len(udp), 17) + udp) or 0xffff
        udp = udp[:6] + struct.pack("!H", c) + udp[8:]
        ip = struct.pack("!IHBB", 6 << 28, len(udp), 17, 64) + sa + da + udp
        eth = gw + me + b"\x86\xdd"
    else:
        sa, da = socket.inet_aton(src), socket.inet_aton(dst)
        udp = struct.pack("!HHHH", 5555, 9999, 8 + len(data), 0) + data
        h = struct.pack("!BBHHHBBH", 0x45, 0, 20 + len(udp), 0, 0, 64, 17, 0) + sa + da
        h = h[:10] + struct.pack("!H", csum(h)) + h[12:]
        ip = h + udp
        eth = gw + me + b"\x08\x00"
    s.send(eth + ip)
print("sent", len(sys.argv) - 3)
"#;

/// Captures on `argv[1]` for `argv[2]` seconds (after printing `ready`) and prints the
/// `tymark:` of every frame received carrying one.
const CAPTURE_PY: &str = r#"
import socket, sys, time
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))
s.bind((sys.argv[1], 0))
s.settimeout(0.2)
end = time.time() + float(sys.argv[2])
print("ready", flush=True)
while time.time() < end:
    try:
        f, a = s.recvfrom(65535)
    except socket.timeout:
        continue
    if a[2] == socket.PACKET_OUTGOING:
        continue  # the far host's own port unreachable, quoting the datagram
    i = f.find(b"tymark:")
    if i >= 0:
        print(f[i:].decode(errors="replace"), flush=True)
print("done", flush=True)
"#;

#[test]
#[cfg_attr(
    not(tapyard_root),
    ignore = "needs root: TAP devices and network namespaces (runs as root, as in CI)"
)]
fn martian_sources_from_a_pod_never_reach_the_uplink() {
    if let Some(why) = skip_reason(&[("ping", "-V"), ("python3", "--version")]) {
        skip(&why);
        return;
    }
    let (pid, tag) = common::name_tag();
    let (ns_pod, ns_far) = (format!("tym-p-{pid}-{tag}"), format!("tym-f-{pid}-{tag}"));
    let (tap_pod, tap_up) = (format!("tym{pid}p"), format!("tym{pid}u"));

    let gw_mac = MacAddr::local(0x0218_0101);
    let mut b = Datapath::builder();
    let br = b.add_bridge(BridgeConfig::new("br-a")).unwrap();
    let pod_port = b.add_port(tap_pod.clone(), Some(br)).unwrap();
    let mut ca = IfaceConfig::new(
        "br-a",
        gw_mac,
        "10.218.1.1".parse::<std::net::Ipv4Addr>().unwrap(),
        24,
    );
    ca.addr6 = Some(("fd00:218:1::1".parse().unwrap(), 64));
    b.add_router_iface(ca, Some(br)).unwrap();
    let mut cu = IfaceConfig::new(
        "up0",
        MacAddr::local(0x0218_0201),
        "10.218.100.2".parse::<std::net::Ipv4Addr>().unwrap(),
        24,
    );
    cu.addr6 = Some(("fd00:218:100::2".parse().unwrap(), 64));
    let (_, up_port) = b.add_router_iface(cu, None).unwrap();
    let dp = Arc::new(b.build());

    let mut guard = Guard::default();
    let taps = [
        (pod_port, tap_pod.as_str(), TapKind::Offload),
        (up_port, tap_up.as_str(), TapKind::Offload),
    ];
    if !attach_taps(&mut guard, &dp, &taps) {
        return;
    }
    let pod = guard.ns(&ns_pod);
    let far = guard.ns(&ns_far);
    pod.attach(
        None,
        &tap_pod,
        &[&format!("{POD}/24"), &format!("{POD6}/64")],
        &["10.218.1.1", "fd00:218:1::1"],
    );
    far.attach(
        None,
        &tap_up,
        &[&format!("{FAR}/24"), &format!("{FAR6}/64")],
        &["10.218.100.2", "fd00:218:100::2"],
    );
    // Both ways resolved (ARP, NDP) and routed.
    pod.ping_ok(FAR);
    pod.ping_ok(FAR6);

    let martians4 = [
        "127.0.0.1",
        "0.0.0.0",
        "0.1.2.3",
        "255.255.255.255",
        "224.0.0.5",
        "240.0.0.1",
        // br-a's and up0's directed broadcasts.
        "10.218.1.255",
        "10.218.100.255",
        // The pod's gateway, and the node's uplink address (outside the pods' subnet).
        "10.218.1.1",
        "10.218.100.2",
    ];
    let martians6 = [
        "::",
        "::1",
        "::ffff:10.218.1.2",
        "fd00:218:1::1",
        "fd00:218:100::2",
    ];
    let mut args: Vec<String> = Vec::new();
    args.push(format!("{POD}>{FAR}"));
    args.push(format!("{POD6}>{FAR6}"));
    args.extend(martians4.iter().map(|m| format!("{m}>{FAR}")));
    args.extend(martians6.iter().map(|m| format!("{m}>{FAR6}")));
    // IPv6 multicast sources: refused by the header check (`bad_ipv6_header`), as Linux's
    // `ip6_rcv_core` does; they must not arrive either.
    let multicast6 = ["ff02::1", "ff05::5"];
    args.extend(multicast6.iter().map(|m| format!("{m}>{FAR6}")));
    args.push(format!("{POD}>{FAR}"));
    args.push(format!("{POD6}>{FAR6}"));

    let before = dp.control().stats().drop_count(DropReason::MartianSource);
    let bad6_before = dp.control().stats().drop_count(DropReason::BadIpv6Header);
    let capture = far.exec(&["python3", "-c", CAPTURE_PY, &tap_up, "4"]);
    let rx = guard.spawn_reporting_server("the capture on the far host", &capture);
    let gw = gw_mac.to_string();
    let mut send: Vec<&str> = vec![&tap_pod, &gw];
    send.extend(args.iter().map(String::as_str));
    let sent = pod.python(SEND_PY, &send);
    println!("{}", sent.trim());
    let mut seen = Vec::new();
    loop {
        match rx.recv_timeout(CMD_TIMEOUT) {
            Ok(l) if l == "done" => break,
            Ok(l) => seen.push(l),
            Err(_) => panic!("the capture did not finish; seen {seen:?}"),
        }
    }
    println!("arrived on the uplink: {seen:?}");
    let want: Vec<String> = [POD, POD6, POD, POD6]
        .iter()
        .map(|s| format!("tymark:{s}"))
        .collect();
    let mut got = seen.clone();
    got.sort();
    let mut want_sorted = want.clone();
    want_sorted.sort();
    assert_eq!(
        got, want_sorted,
        "only the pod's own sources may reach the uplink"
    );
    // Every martian counted (the counters are read as the workers publish them).
    let n = (martians4.len() + martians6.len()) as u64;
    let t0 = std::time::Instant::now();
    let mut after;
    loop {
        after = dp.control().stats().drop_count(DropReason::MartianSource);
        if after - before >= n || t0.elapsed() > Duration::from_secs(5) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(after - before, n, "martian_source counted");
    let bad6 = dp.control().stats().drop_count(DropReason::BadIpv6Header) - bad6_before;
    assert_eq!(bad6, multicast6.len() as u64, "bad_ipv6_header counted");
}
