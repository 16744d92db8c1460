//! A Linux node with a kernel vxlan device set up exactly as Flannel's VXLAN backend does,
//! for the overlay end-to-end tests, and a bulk transfer checked end to end.
//!
//! Flannel (backend/vxlan) on a node: `ip link add flannel.1 type vxlan id 1 dstport 8472
//! local <node ip> dev <uplink> nolearning`, the pod subnet's network address as a /32 on it,
//! and per remote node a route `<pod cidr> via <its network address> dev flannel.1 onlink`, a
//! permanent neighbour `<that address> lladdr <remote vtep mac>` and `bridge fdb append
//! <remote vtep mac> dev flannel.1 dst <remote node ip>`.

#![allow(dead_code)]

use std::process::{Command, Stdio};

use super::{addr_add, run};

/// A remote node as Flannel programs it.
pub struct Remote<'a> {
    /// The node's underlay address.
    pub node_ip: &'a str,
    /// Its VTEP MAC.
    pub vtep_mac: &'a str,
    /// Its pod subnet, `A.B.C.0/24`.
    pub pod_cidr: &'a str,
}

impl Remote<'_> {
    /// The pod subnet's network address (the remote VTEP's address).
    pub fn gateway(&self) -> &str {
        self.pod_cidr.split('/').next().unwrap_or(self.pod_cidr)
    }
}

/// Makes `flannel.1` in namespace `ns` (uplink `dev` with address `local`), with address
/// `vtep` (`A.B.C.0`, as a /32) and MAC `mac`, and the entries for each remote node.
pub fn linux_flannel(
    ns: &str,
    dev: &str,
    local: &str,
    vtep: &str,
    mac: &str,
    remotes: &[Remote<'_>],
) {
    run(&[
        "ip",
        "-n",
        ns,
        "link",
        "add",
        "flannel.1",
        "address",
        mac,
        "type",
        "vxlan",
        "id",
        "1",
        "dstport",
        "8472",
        "local",
        local,
        "dev",
        dev,
        "nolearning",
    ]);
    addr_add(ns, &format!("{vtep}/32"), "flannel.1");
    run(&["ip", "-n", ns, "link", "set", "flannel.1", "up"]);
    for r in remotes {
        add_remote(ns, r);
    }
}

/// Flannel's three entries for one remote node.
pub fn add_remote(ns: &str, r: &Remote<'_>) {
    let gw = r.gateway();
    run(&[
        "ip",
        "-n",
        ns,
        "route",
        "add",
        r.pod_cidr,
        "via",
        gw,
        "dev",
        "flannel.1",
        "onlink",
    ]);
    run(&[
        "ip",
        "-n",
        ns,
        "neigh",
        "add",
        gw,
        "lladdr",
        r.vtep_mac,
        "dev",
        "flannel.1",
        "nud",
        "permanent",
    ]);
    run(&[
        "ip",
        "netns",
        "exec",
        ns,
        "bridge",
        "fdb",
        "append",
        r.vtep_mac,
        "dev",
        "flannel.1",
        "dst",
        r.node_ip,
    ]);
}

/// Receives one TCP connection on `port`, prints `<bytes> <sha256>`.
pub const RECV_PY: &str = r#"
import hashlib, socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1])))
s.listen(1)
c, _ = s.accept()
h, n = hashlib.sha256(), 0
while True:
    d = c.recv(1 << 16)
    if not d:
        break
    h.update(d)
    n += len(d)
print(n, h.hexdigest(), flush=True)
"#;

/// Sends `argv[3]` MiB of random bytes to `argv[1]:argv[2]`, prints `<bytes> <sha256>`.
pub const SEND_PY: &str = r#"
import hashlib, os, socket, sys, time
deadline = time.monotonic() + 5
while True:
    try:
        c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=20)
        break
    except OSError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.1)
h, n = hashlib.sha256(), 0
for _ in range(int(sys.argv[3]) * 16):
    d = os.urandom(1 << 16)
    c.sendall(d)
    h.update(d)
    n += len(d)
c.shutdown(socket.SHUT_WR)
c.recv(1)
c.close()
print(n, h.hexdigest(), flush=True)
"#;

/// Sends `mib` MiB from namespace `from` to `to_addr:port` in namespace `to`; asserts both
/// ends saw the same bytes (count and SHA-256). Returns the receiver's line.
pub fn transfer_checked(from: &str, to: &str, to_addr: &str, port: u16, mib: usize) -> String {
    let p = port.to_string();
    let recv = Command::new("ip")
        .args(["netns", "exec", to, "python3", "-c", RECV_PY, &p])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the receiver");
    super::wait_listening(to, port);
    let sent = Command::new("ip")
        .args([
            "netns",
            "exec",
            from,
            "python3",
            "-c",
            SEND_PY,
            to_addr,
            &p,
            &mib.to_string(),
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the sender");
    let sent = super::wait_output(sent, std::time::Duration::from_secs(120), "sender");
    let got = super::wait_output(recv, std::time::Duration::from_secs(10), "receiver");
    let (sent, got) = (
        String::from_utf8_lossy(&sent.stdout).trim().to_string(),
        String::from_utf8_lossy(&got.stdout).trim().to_string(),
    );
    assert!(
        !sent.is_empty(),
        "the sender {from} -> {to_addr} printed nothing"
    );
    assert_eq!(sent, got, "{from} -> {to_addr}:{port}: sent vs received");
    assert!(sent.starts_with(&(mib << 20).to_string()), "{sent}");
    println!("{mib} MiB {from} -> {to_addr}: {got}");
    got
}
