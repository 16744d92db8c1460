//! End-to-end test of the IPv6 router on real TAP devices: two pod bridges, driven in-process
//! by a [`Runtime`], with a pod in a network namespace on each.
//!
//! ```text
//!  pod A fd00:216:1::2/64 ── TAP ── br-a (fd00:216:1::1/64, Router Advertisements on)
//!  pod B fd00:216:2::2/64 ── TAP ── br-b (fd00:216:2::1/64, no RAs)
//! ```
//!
//! Checked: pod A's kernel learns its default router from tapyard's Router Advertisements
//! (`ip -6 route` shows `default via fe80::… proto ra`), pod B uses a static default route via
//! its gateway's global address; `ping -6` both ways across the router; pod A's `ip -6 neigh`
//! holds the gateway's link-local address with the gateway's MAC (REACHABLE, STALE, DELAY or
//! PROBE); a TCP transfer A → B (content checked, the server sees A's address) when `python3`
//! is installed; tapyard's own `ip -6 neigh` dump holds both pods.
//!
//! Needs root (TAP devices and namespaces) and `ip`; without them the test prints why and
//! passes (under `CI=true` it fails instead). Names carry the process id; a guard removes
//! everything on success and failure alike. Traffic only goes to addresses inside the
//! namespaces created here.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{have, open_tap, run, run_output, skip, skip_reason, Guard, TapKind};
use tapyard::l3::{IfaceConfig, RaConfig};
use tapyard::runtime::{Runtime, RuntimeConfig};
use tapyard::{BridgeConfig, Datapath, MacAddr};

const POD_A: &str = "fd00:216:1::2";
const POD_B: &str = "fd00:216:2::2";
const GW_B: &str = "fd00:216:2::1";
const TCP_PORT: &str = "42216";
const TCP_BYTES: usize = 4 << 20;

#[test]
#[cfg_attr(
    not(tapyard_root),
    ignore = "needs root: TAP devices and network namespaces (runs as root, as in CI)"
)]
fn ipv6_pods_ping_and_tcp_across_the_router_with_ra_and_ndp() {
    if let Some(why) = skip_reason(&[("ping", "-V")]) {
        skip(&why);
        return;
    }
    let (pid, tag) = common::name_tag();
    let ns_a = format!("ty6-a-{pid}-{tag}");
    let ns_b = format!("ty6-b-{pid}-{tag}");
    let (tap_a, tap_b) = (format!("ty6{pid}a"), format!("ty6{pid}b"));

    let gw_a_mac = MacAddr::local(0x0216_0101);
    let mut b = Datapath::builder();
    let br_a = b.add_bridge(BridgeConfig::new("br-a")).unwrap();
    let br_b = b.add_bridge(BridgeConfig::new("br-b")).unwrap();
    let id_a = b.add_port(tap_a.clone(), Some(br_a)).unwrap();
    let id_b = b.add_port(tap_b.clone(), Some(br_b)).unwrap();
    let mut ca = IfaceConfig::new(
        "br-a",
        gw_a_mac,
        "10.216.1.1".parse::<std::net::Ipv4Addr>().unwrap(),
        24,
    );
    ca.addr6 = Some(("fd00:216:1::1".parse().unwrap(), 64));
    ca.ra = Some(RaConfig::default());
    let (if_a, _) = b.add_router_iface(ca, Some(br_a)).unwrap();
    let mut cb = IfaceConfig::new(
        "br-b",
        MacAddr::local(0x0216_0201),
        "10.216.2.1".parse::<std::net::Ipv4Addr>().unwrap(),
        24,
    );
    cb.addr6 = Some((GW_B.parse().unwrap(), 64));
    b.add_router_iface(cb, Some(br_b)).unwrap();
    let dp = Arc::new(b.build());
    let gw_a_ll = dp.control().router().unwrap().link_local(if_a).unwrap();

    let mut guard = Guard::default();
    for (tap, id) in [(&tap_a, id_a), (&tap_b, id_b)] {
        match open_tap(TapKind::Offload, tap) {
            Ok(p) => guard.ports.push((id, Arc::new(p))),
            Err(e) => {
                skip(&format!("skipping: cannot create TAP {tap}: {e}"));
                return;
            }
        }
    }
    let rt = Runtime::start(dp.clone(), guard.ports.clone(), RuntimeConfig::default())
        .expect("start runtime");
    guard.rt = Some(rt);
    let a = guard.ns(&ns_a);
    let b = guard.ns(&ns_b);
    // Pod A takes Router Advertisements (accept_ra=2 works whatever forwarding says).
    a.sysctl("net.ipv6.conf.default.accept_ra", "2");
    a.take_link(&tap_a, None);
    a.sysctl(&format!("net.ipv6.conf.{tap_a}.accept_ra"), "2");
    a.ip(&[
        "-6",
        "addr",
        "add",
        &format!("{POD_A}/64"),
        "dev",
        &tap_a,
        "nodad",
    ]);
    b.take_link(&tap_b, None);
    b.ip(&[
        "-6",
        "addr",
        "add",
        &format!("{POD_B}/64"),
        "dev",
        &tap_b,
        "nodad",
    ]);
    b.ip(&["-6", "route", "add", "default", "via", GW_B]);
    // Pod A's link-local address must finish DAD before its kernel solicits routers.
    let t0 = Instant::now();
    let want = format!("default via {gw_a_ll}");
    let routes = loop {
        let r = a.ip(&["-6", "route", "show"]);
        if r.contains(&want) || t0.elapsed() > Duration::from_secs(20) {
            break r;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    println!("pod A routes:\n{routes}");
    assert!(
        routes
            .lines()
            .any(|l| l.starts_with(&want) && l.contains("proto ra")),
        "pod A did not learn its default router from tapyard's RA ({want}):\n{routes}"
    );

    a.ping_ok_v6(POD_B);
    b.ping_ok_v6(POD_A);
    // The gateway as pod A's kernel sees it.
    let neigh = a.ip(&["-6", "neigh", "show", "dev", &tap_a]);
    println!("pod A neighbours:\n{neigh}");
    let gw_line = neigh
        .lines()
        .find(|l| l.starts_with(&gw_a_ll.to_string()))
        .unwrap_or_else(|| panic!("no entry for {gw_a_ll} in pod A:\n{neigh}"));
    assert!(gw_line.contains(&format!("lladdr {gw_a_mac}")), "{gw_line}");
    assert!(
        ["REACHABLE", "STALE", "DELAY", "PROBE"]
            .iter()
            .any(|s| gw_line.contains(s)),
        "{gw_line}"
    );
    assert!(
        gw_line.contains("router"),
        "the gateway answers NS as a router: {gw_line}"
    );

    if have("python3", "-V") {
        let server = format!(
            "import socket,sys\ns=socket.socket(socket.AF_INET6)\ns.bind(('::',{TCP_PORT}))\ns.listen(1)\nprint('ready',flush=True)\nc,a=s.accept()\nn=0\nwhile True:\n d=c.recv(65536)\n if not d: break\n n+=len(d)\nprint(a[0],n,flush=True)\nc.sendall(str(n).encode())\nc.close()"
        );
        guard.spawn_server("tcp6 server", &b.exec(&["python3", "-c", &server]));
        let client = format!(
            "import socket\nc=socket.create_connection(('{POD_B}',{TCP_PORT}),timeout=10)\nc.sendall(b'x'*{TCP_BYTES})\nc.shutdown(socket.SHUT_WR)\nprint(c.recv(64).decode())"
        );
        let out = run(&a.exec(&["python3", "-c", &client]));
        assert_eq!(
            out.trim(),
            TCP_BYTES.to_string(),
            "bytes the server counted"
        );
    } else {
        eprintln!("python3 not installed: TCP part skipped");
    }

    let rt = guard.rt.as_ref().expect("runtime");
    let mut dump = String::new();
    dp.control().fmt_neigh(rt.now(), &mut dump).unwrap();
    println!("tapyard neighbours:\n{dump}");
    assert!(dump.contains(&format!("{POD_B} dev br-b lladdr")), "{dump}");
    let st = dp.control().stats();
    println!("{st}");
}

trait PingV6 {
    fn ping_ok_v6(&self, to: &str);
}

impl PingV6 for common::Ns {
    fn ping_ok_v6(&self, to: &str) {
        let out =
            run_output(&self.exec(&["ping", "-6", "-n", "-c", "3", "-i", "0.2", "-W", "2", to]));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains(" 0% packet loss"),
            "ping -6 {} -> {to} failed ({}):\n{text}{}",
            self.name,
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        println!("ping -6 {} -> {to}: ok", self.name);
    }
}
