//! The spoof guard end to end: two pods added through the `tapyard-cni` plugin on a real
//! `tapyard run` (the node of [`super::cni_node`]) get their guards from IPAM's addresses.
//! The attacker pod (a) takes the victim's address as a secondary one and pings and ARPs from
//! it, (b) takes the victim's MAC, (c) sends forged ARP replies claiming the victim's address
//! to the gateway (python3, AF_PACKET): each is dropped and counted (`show stats`,
//! `show ports`), while the victim keeps working (ping and TCP to the gateway, node-b's pod and
//! the ClusterIP) and the gateway's neighbour entry and the FDB still point at the victim;
//! (d) a router advertisement from the attacker's link-local address (RA guard) is dropped,
//! and the victim's kernel takes no default route from it. A reload turns the bridge's
//! `spoof_guard` off and on again, live: off, the same advertisement reaches the victim,
//! whose kernel then routes IPv6 through the attacker.
//!
//! Needs root, `ip`, `ping`, `python3` and host-local (see `cni_node`).

use serde_json::Value;

use super::cni_node::{add_pod, skip, Node, GW, NODE_B_POD, WEB_VIP};
use crate::common::*;

/// Sends forged frames on `argv[2]` from MAC `argv[3]`, `argv[4]` times: `arp CLAIM GW_MAC
/// GW_IP` (ARP replies claiming address CLAIM, to the gateway) or `ra SRC` (router
/// advertisements from link-local address SRC to ff02::1, router lifetime 1800 s, with a
/// source link-layer address option).
const FORGE_PY: &str = r#"
import socket, struct, sys
kind, ifname, mac, count = sys.argv[1:5]
m = lambda s: bytes.fromhex(s.replace(":", ""))
if kind == "arp":
    claim, gw_mac, gw_ip = sys.argv[5:8]
    a = socket.inet_aton
    f = m(gw_mac) + m(mac) + b"\x08\x06" + b"\x00\x01\x08\x00\x06\x04\x00\x02"
    f += m(mac) + a(claim) + m(gw_mac) + a(gw_ip)
    f += b"\x00" * (60 - len(f))
else:
    sa = socket.inet_pton(socket.AF_INET6, sys.argv[5])
    da = socket.inet_pton(socket.AF_INET6, "ff02::1")
    body = struct.pack("!BBHBBHII", 134, 0, 0, 64, 0, 1800, 0, 0) + bytes([1, 1]) + m(mac)
    data = sa + da + struct.pack("!I", len(body)) + b"\x00\x00\x00\x3a" + body
    c = sum((data[i] << 8) + data[i + 1] for i in range(0, len(data), 2))
    while c >> 16:
        c = (c & 0xffff) + (c >> 16)
    body = body[:2] + struct.pack("!H", ~c & 0xffff) + body[4:]
    ip6 = struct.pack("!IHBB", 0x60000000, len(body), 58, 255) + sa + da
    f = m("33:33:00:00:00:01") + m(mac) + b"\x86\xdd" + ip6 + body
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind((ifname, 0))
for _ in range(int(count)):
    s.send(f)
print("sent", count)
"#;

/// The link-local address of `eth0` in `ns`.
fn link_local(ns: &Ns) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let (_, out) = ns.cmd(&[
            "ip", "-6", "-o", "addr", "show", "dev", "eth0", "scope", "link",
        ]);
        let ll = out
            .split_whitespace()
            .skip_while(|w| *w != "inet6")
            .nth(1)
            .and_then(|a| a.split('/').next())
            .map(str::to_string);
        // Tentative (DAD not done yet) addresses cannot send.
        if let Some(ll) = ll.filter(|_| !out.contains("tentative")) {
            return ll;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no link-local address on eth0: {out}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// The victim's IPv6 default routes through `via`.
fn default_via(ns: &Ns, via: &str) -> bool {
    let (_, out) = ns.cmd(&["ip", "-6", "route", "show", "default"]);
    out.contains(&format!("via {via} "))
}

/// The drop counters of `show stats --json`.
fn drops(n: &Node) -> Value {
    let out = n.tapyard_ok(&["show", "stats", "--json"]);
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    v["drops"].clone()
}

fn count(v: &Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or(0)
}

/// The gateway's neighbour entry for `ip`: its MAC.
fn gw_neigh(n: &Node, ip: &str) -> Option<String> {
    n.json("neigh")
        .into_iter()
        .find(|e| e["dst"] == ip)
        .and_then(|e| e["lladdr"].as_str().map(str::to_string))
}

#[test]
#[cfg_attr(
    not(tapyard_root),
    ignore = "needs root: TAP devices and network namespaces (runs as root, as in CI)"
)]
fn a_pod_cannot_take_another_pods_address_mac_or_arp_entry() {
    if skip("a_pod_cannot_take_another_pods_address_mac_or_arp_entry") {
        return;
    }
    let mut n = Node::start("sg", &[]);
    let nb = n.ns_b.clone();
    spawn_in(
        &mut n.g.children,
        &nb,
        &["python3", "-c", SERVER_PY, "node-b", "8080", "0"],
    );
    let gw_mac = n.gateway_mac();
    let victim = add_pod(&mut n, 0);
    let attacker = add_pod(&mut n, 1);
    let (v_ip, a_ip) = (victim.ip(), attacker.ip());
    let mac_of = |p: &super::cni_node::Pod| {
        p.result["interfaces"][0]["mac"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let (v_mac, a_mac) = (mac_of(&victim), mac_of(&attacker));
    // The CNI path: each pod's port is guarded with IPAM's address.
    for (p, ip) in [(&victim, &v_ip), (&attacker, &a_ip)] {
        let port = n.port(&p.owner()).expect("the pod's port");
        assert_eq!(port["guard"], serde_json::json!([ip]), "{port}");
    }
    ping_ok(&victim.ns, GW);
    ping_ok(&attacker.ns, GW);
    ping_ok(&attacker.ns, &v_ip);
    assert_eq!(gw_neigh(&n, &v_ip).as_deref(), Some(v_mac.as_str()));
    let before = drops(&n);
    assert_eq!(count(&before, "spoofed_ip"), 0, "{before}");

    // (a) The victim's address as a secondary one: pings from it go nowhere.
    let att = ns_named(&attacker.ns);
    att.cmd(&["ip", "addr", "add", &format!("{v_ip}/32"), "dev", "eth0"]);
    let (ok, out) = att.cmd(&[
        "ping", "-n", "-c", "3", "-i", "0.2", "-W", "1", "-I", &v_ip, GW,
    ]);
    assert!(!ok, "a ping from the victim's address was answered: {out}");
    let (ok, out) = att.cmd(&[
        "ping", "-n", "-c", "2", "-i", "0.2", "-W", "1", "-I", &v_ip, NODE_B_POD,
    ]);
    assert!(!ok, "{out}");
    if which("arping") {
        let _ = att.cmd(&[
            "arping", "-c", "2", "-w", "2", "-I", "eth0", "-s", &v_ip, GW,
        ]);
    }
    att.cmd(&["ip", "addr", "del", &format!("{v_ip}/32"), "dev", "eth0"]);
    let after_a = drops(&n);
    assert!(count(&after_a, "spoofed_ip") >= 3, "{after_a}");

    // (b) The victim's MAC.
    att.cmd(&["ip", "link", "set", "eth0", "address", &v_mac]);
    let (ok, out) = att.cmd(&["ping", "-n", "-c", "2", "-i", "0.2", "-W", "1", GW]);
    assert!(!ok, "a ping from the victim's MAC was answered: {out}");
    att.cmd(&["ip", "link", "set", "eth0", "address", &a_mac]);
    let after_b = drops(&n);
    assert!(count(&after_b, "spoofed_mac") >= 2, "{after_b}");

    // (c) Forged ARP replies to the gateway claiming the victim's address.
    att.python(FORGE_PY, &["arp", "eth0", &a_mac, "5", &v_ip, &gw_mac, GW]);
    let after_c = drops(&n);
    assert!(
        count(&after_c, "spoofed_arp") >= count(&after_b, "spoofed_arp") + 5,
        "{after_c}"
    );

    // (d) A router advertisement from the attacker's own link-local address (RA guard): the
    // victim's kernel, which accepts RAs, takes no default route from it.
    let vic = ns_named(&victim.ns);
    vic.cmd(&["sysctl", "-qw", "net.ipv6.conf.eth0.accept_ra=2"]);
    let a_ll = link_local(&att);
    att.python(FORGE_PY, &["ra", "eth0", &a_mac, "3", &a_ll]);
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert!(
        !default_via(&vic, &a_ll),
        "the victim routes through the attacker"
    );
    let after_d = drops(&n);
    assert_eq!(count(&after_d, "ra_guard"), 3, "{after_d}");

    // Counted on the attacker's port, not on the victim's.
    let a_port = n.port(&attacker.owner()).unwrap();
    let v_port = n.port(&victim.owner()).unwrap();
    assert!(a_port["spoofed"].as_u64().unwrap() >= 13, "{a_port}");
    assert_eq!(v_port["spoofed"], 0, "{v_port}");
    println!("show ports:\n{}", n.tapyard_ok(&["show", "ports"]));

    // The victim keeps working; the gateway and the bridge still know it as itself.
    assert_eq!(gw_neigh(&n, &v_ip).as_deref(), Some(v_mac.as_str()));
    ping_ok(&victim.ns, GW);
    ping_ok(&victim.ns, NODE_B_POD);
    let got = exchange(&victim.ns, "tcp", WEB_VIP, 80, 1);
    assert_eq!(got[0], ("node-b".to_string(), v_ip.clone()));
    let fdb = n.json("fdb");
    let v_name = v_port["name"].as_str().unwrap();
    assert!(
        fdb.iter()
            .any(|e| e["mac"] == v_mac.as_str() && e["dev"] == v_name),
        "{fdb:?}"
    );
    assert_eq!(gw_neigh(&n, &v_ip).as_deref(), Some(v_mac.as_str()));
    // The attacker's own traffic still passes.
    ping_ok(&attacker.ns, GW);

    // A reload turns the guard off and on again, live.
    let text = std::fs::read_to_string(&n.config).unwrap();
    let off = text.replacen(
        "name = \"cni0\"\n",
        "name = \"cni0\"\nspoof_guard = false\n",
        1,
    );
    std::fs::write(&n.config, &off).unwrap();
    let out = n.tapyard_ok(&["reload"]);
    assert!(out.contains("spoof_guard true -> false"), "{out}");
    assert_eq!(
        n.port(&attacker.owner()).unwrap()["guard"],
        serde_json::json!([])
    );
    // Unguarded, the same advertisement takes the victim's IPv6 default route.
    att.python(FORGE_PY, &["ra", "eth0", &a_mac, "3", &a_ll]);
    assert!(
        eventually(std::time::Duration::from_secs(3), || default_via(
            &vic, &a_ll
        )),
        "the unguarded RA did not reach the victim's kernel"
    );
    std::fs::write(&n.config, &text).unwrap();
    let out = n.tapyard_ok(&["reload"]);
    assert!(out.contains("spoof_guard false -> true"), "{out}");
    assert_eq!(
        n.port(&attacker.owner()).unwrap()["guard"],
        serde_json::json!([a_ip])
    );
    ping_ok(&victim.ns, GW);
}

/// A port of the config file declared with its addresses (`[[bridge.port]]`, added by a
/// reload) is guarded as a CNI plugin's: its own address works, pings from another one are
/// dropped and counted on it; a reload that allows that address too applies it live.
#[test]
#[cfg_attr(
    not(tapyard_root),
    ignore = "needs root: TAP devices and network namespaces (runs as root, as in CI)"
)]
fn a_config_port_with_ips_is_guarded() {
    if skip("a_config_port_with_ips_is_guarded") {
        return;
    }
    let mut n = Node::start("sgc", &[]);
    let port = format!("cp{}", n.tag);
    let (own, other) = ("10.244.1.200", "10.244.1.201");
    let text = std::fs::read_to_string(&n.config).unwrap();
    let with = |ips: &str| {
        let p = format!("[[bridge.port]]\nname = \"{port}\"\nips = [{ips}]\n\n[[uplink]]");
        text.replacen("[[uplink]]", &p, 1)
    };
    std::fs::write(&n.config, with(&format!("\"{own}\""))).unwrap();
    let out = n.tapyard_ok(&["reload"]);
    assert!(out.contains(&format!("port \"{port}\" added")), "{out}");
    let p = n.port(&port).expect("the config port");
    assert_eq!(p["origin"], "config", "{p}");
    assert_eq!(p["guard"], serde_json::json!([own]), "{p}");
    let pod = n.g.ns(&format!("tyq-{}", n.tag));
    pod.attach(Some(&n.ns_node), &port, &[&format!("{own}/24")], &[GW]);
    pod.ping_ok(GW);
    ping_ok(&pod.name, NODE_B_POD);

    let before = count(&drops(&n), "spoofed_ip");
    pod.ip(&["addr", "add", &format!("{other}/32"), "dev", &port]);
    let ping_from_other = || {
        pod.cmd(&[
            "ping", "-n", "-c", "3", "-i", "0.2", "-W", "1", "-I", other, GW,
        ])
    };
    let (ok, out) = ping_from_other();
    assert!(
        !ok,
        "a ping from an address the port may not use was answered: {out}"
    );
    let after = drops(&n);
    assert!(count(&after, "spoofed_ip") >= before + 3, "{after}");
    let p = n.port(&port).unwrap();
    assert!(p["spoofed"].as_u64().unwrap() >= 3, "{p}");
    pod.ping_ok(GW);

    // The file allows the second address too: live, no restart.
    std::fs::write(&n.config, with(&format!("\"{own}\", \"{other}\""))).unwrap();
    let out = n.tapyard_ok(&["reload"]);
    assert!(
        out.contains(&format!("port \"{port}\" of bridge \"cni0\": ips [{own}]")),
        "{out}"
    );
    let p = n.port(&port).unwrap();
    assert_eq!(p["guard"], serde_json::json!([own, other]), "{p}");
    let (ok, out) = ping_from_other();
    assert!(ok, "{out}");

    // A new `mac` for the port: the reload gives it to the TAP (in the pod's namespace now)
    // before the guard takes it, so the pod keeps working (once its neighbours learn the
    // new MAC: the pod's next ARP request tells the gateway).
    let mac = "02:00:00:00:99:01";
    let with_mac = with(&format!("\"{own}\", \"{other}\"")).replacen(
        &format!("name = \"{port}\"\n"),
        &format!("name = \"{port}\"\nmac = \"{mac}\"\n"),
        1,
    );
    std::fs::write(&n.config, with_mac).unwrap();
    let out = n.tapyard_ok(&["reload"]);
    assert!(out.contains(mac), "{out}");
    let (_, link) = pod.cmd(&["ip", "link", "show"]);
    assert!(link.contains(mac), "the TAP's MAC is not {mac}:\n{link}");
    pod.ip(&["neigh", "flush", "dev", &port]);
    pod.ping_ok(GW);
    let p = n.port(&port).unwrap();
    assert_eq!(p["mac"], mac, "{p}");
}

/// Whether `tool` is on the PATH.
fn which(tool: &str) -> bool {
    std::process::Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success())
}
