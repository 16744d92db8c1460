//! End-to-end on multi-queue TAP devices (`IFF_MULTI_QUEUE`): two namespaces ("pods") on
//! two-queue TAPs bridged by an in-process [`Runtime`] with two workers, so each pod's queues
//! are received by both workers. Eight UDP flows from pod A to pod B, each numbered: every
//! datagram arrives and each flow's arrive in order; then pings both ways and a clean stop.
//!
//! Needs root, `ip` and `python3`; without them the test prints why and passes (under
//! `CI=true` a skip fails). Names carry the process id; everything is removed by the guard,
//! on failure too; traffic only goes to 10.217.x.0/24 inside the test's namespaces.

use crate::common;

use std::sync::Arc;

use crate::common::{name_tag, skip, skip_reason, Guard};
use tapyard::port::{Port, TapPort};
use tapyard::runtime::{Runtime, RuntimeConfig};

/// Receives `flows * count` datagrams (or stops after 10 s of silence) and prints
/// `<received> <out of order>`.
const RECV_PY: &str = r#"
import socket, struct, sys
addr, flows, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
s.bind((addr, 42217))
s.settimeout(10)
print("ready", flush=True)
last, got, bad = {}, 0, 0
try:
    while got < flows * count:
        d = s.recv(2048)
        f, n = struct.unpack("!II", d[:8])
        if n <= last.get(f, -1):
            bad += 1
        last[f] = n
        got += 1
except socket.timeout:
    pass
print(got, bad, flush=True)
"#;

/// Sends `count` datagrams on each of `flows` sockets (its own source port each), round robin,
/// pausing after every 16 rounds (128 datagrams, fewer than a TAP's 500-frame queue holds) so
/// no queue overflows when the workers are slow to be scheduled.
const SEND_PY: &str = r#"
import socket, struct, sys, time
addr, flows, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
socks = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(flows)]
for n in range(count):
    for f, s in enumerate(socks):
        s.sendto(struct.pack("!II", f, n) + bytes(56), (addr, 42217))
    if n % 16 == 15:
        time.sleep(0.002)
"#;

#[test]
#[cfg_attr(
    not(tapyard_root),
    ignore = "needs root: TAP devices and network namespaces (runs as root, as in CI)"
)]
fn multi_queue_taps_keep_each_flow_in_order() {
    if let Some(why) = skip_reason(&[("python3", "-V"), ("ping", "-V")]) {
        skip(&why);
        return;
    }
    const FLOWS: usize = 8;
    const COUNT: usize = 2000;
    let (pid, tag) = name_tag();
    let subnet = 10 + pid % 240;
    let (ta, tb) = (format!("tmq{pid}a"), format!("tmq{pid}b"));
    let (dp, ia, ib) = common::two_port_bridge(&ta, &tb);
    let dp = Arc::new(dp);
    let mut guard = Guard::default();
    for (id, name) in [(ia, &ta), (ib, &tb)] {
        let p = TapPort::open_multi_queue(name, 2, true).expect("open multi-queue TAP");
        assert_eq!(p.rx_queues(), 2);
        guard.ports.push((id, Arc::new(p)));
    }
    let rt = Runtime::start(
        dp.clone(),
        guard.ports.clone(),
        RuntimeConfig {
            workers: 2,
            ..Default::default()
        },
    )
    .expect("start runtime");
    guard.rt = Some(rt);
    let a = guard.ns(&format!("tmq-a-{pid}-{tag}"));
    let bns = guard.ns(&format!("tmq-b-{pid}-{tag}"));
    a.disable_ipv6();
    bns.disable_ipv6();
    let (aa, ab) = (format!("10.217.{subnet}.1"), format!("10.217.{subnet}.2"));
    a.take_link(&ta, Some(&format!("{aa}/24")));
    bns.take_link(&tb, Some(&format!("{ab}/24")));
    // The device really has two queues, as the pod's kernel sees it.
    let q = common::run(&a.exec(&["ls", &format!("/sys/class/net/{ta}/queues")]));
    assert!(q.contains("tx-1") && q.contains("rx-1"), "queues: {q}");
    a.ping_ok(&ab);
    bns.ping_ok(&aa);

    let (flows, count) = (FLOWS.to_string(), COUNT.to_string());
    let mut recv = std::process::Command::new("ip")
        .args(bns.exec(&["python3", "-c", RECV_PY, &ab, &flows, &count])[1..].iter())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start the receiver");
    let mut out = std::io::BufReader::new(recv.stdout.take().expect("stdout"));
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line).expect("receiver output");
    assert_eq!(line.trim(), "ready");
    guard.children.push(recv);
    a.python(SEND_PY, &[&ab, &flows, &count]);
    line.clear();
    std::io::BufRead::read_line(&mut out, &mut line).expect("receiver result");
    let v: Vec<usize> = line
        .split_whitespace()
        .map(|x| x.parse().expect("number"))
        .collect();
    assert_eq!(
        v,
        [FLOWS * COUNT, 0],
        "received / out of order:\n{}",
        dp.control().stats()
    );
    if let Some(rt) = guard.rt.take() {
        rt.stop();
    }
}
