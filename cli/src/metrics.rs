//! `tapyard run --metrics ADDR`: the node's counters in Prometheus' text format (version
//! 0.0.4), served over plain HTTP at `/metrics` (and `/`) by tiny_http; any other path or
//! method is 404.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tapyard::stats::{CounterSet, PortStats};
use tapyard::Datapath;

use crate::node::Node;

fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The exposition text for a datapath's counters.
pub fn render(dp: &Datapath) -> String {
    let s = dp.control().stats();
    let mut o = String::new();
    let family = |o: &mut String, name: &str, kind: &str, help: &str| {
        let _ = writeln!(
            o,
            "# HELP tapyard_{name} {help}\n# TYPE tapyard_{name} {kind}"
        );
    };
    // Every counter from its declaration in the library: name = field, help = doc.
    for (i, &(name, help)) in PortStats::NAMES.iter().enumerate() {
        family(
            &mut o,
            &format!("port_{name}_total"),
            "counter",
            help.trim(),
        );
        for p in &s.ports {
            let v = p.values().nth(i).unwrap_or(0);
            let _ = writeln!(
                o,
                "tapyard_port_{name}_total{{port=\"{}\"}} {v}",
                label(&p.name)
            );
        }
    }
    for (name, help, v) in s.counters() {
        family(&mut o, &format!("{name}_total"), "counter", help);
        let _ = writeln!(o, "tapyard_{name}_total {v}");
    }
    family(
        &mut o,
        "drops_total",
        "counter",
        "Frames dropped, by reason.",
    );
    for (r, n) in &s.drops {
        let _ = writeln!(o, "tapyard_drops_total{{reason=\"{}\"}} {n}", r.name());
    }
    family(&mut o, "fdb_entries", "gauge", "Entries in a bridge's FDB.");
    for b in dp.control().bridges() {
        let _ = writeln!(
            o,
            "tapyard_fdb_entries{{bridge=\"{}\"}} {}",
            label(b.name()),
            b.fdb().counters().entries
        );
    }
    if let Some(r) = dp.control().router() {
        let c = r.neigh::<std::net::Ipv4Addr>().counters();
        family(
            &mut o,
            "neigh_entries",
            "gauge",
            "Entries in the ARP table.",
        );
        let _ = writeln!(o, "tapyard_neigh_entries {}", c.entries);
        family(
            &mut o,
            "router_events_total",
            "counter",
            "Router events, by kind.",
        );
        for (k, _, v) in r.counters.snapshot().counters() {
            let _ = writeln!(o, "tapyard_router_events_total{{event=\"{k}\"}} {v}");
        }
    }
    if let Some(nf) = dp.control().netfilter() {
        for (k, help, v) in crate::control::nat_counters(nf) {
            let (name, kind) = match k.as_str() {
                "connections" => ("nat_connections".to_string(), "gauge"),
                "new" => ("nat_connections_total".to_string(), "counter"),
                k => match k.strip_prefix("ct_") {
                    Some(ct) => (format!("conntrack_{ct}_total"), "counter"),
                    None => (format!("nat_{k}_total"), "counter"),
                },
            };
            family(&mut o, &name, kind, help);
            let _ = writeln!(o, "tapyard_{name} {v}");
        }
        family(
            &mut o,
            "nat_services",
            "gauge",
            "Services in the NAT table.",
        );
        let _ = writeln!(o, "tapyard_nat_services {}", nf.services().len());
    }
    o
}

/// The exposition format's content type.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4";

/// Listens on `addr` (`ADDR:PORT`).
pub fn listen(addr: &str) -> Result<tiny_http::Server, crate::node::BoxError> {
    tiny_http::Server::http(addr)
}

/// Answers one request: the exposition for `GET /metrics` (or `/`), else 404.
fn answer(req: tiny_http::Request, dp: &Datapath) -> std::io::Result<()> {
    let path = req.url().split('?').next().unwrap_or_default();
    let (status, ctype, body) =
        if *req.method() == tiny_http::Method::Get && (path == "/metrics" || path == "/") {
            (200, CONTENT_TYPE, render(dp))
        } else {
            (404, "text/plain", "only GET /metrics\n".to_string())
        };
    let header = tiny_http::Header::from_bytes("Content-Type", ctype).expect("a valid header");
    req.respond(
        tiny_http::Response::from_string(body)
            .with_status_code(status)
            .with_header(header),
    )
}

/// Serves `/metrics` until `stop` is set.
pub fn serve(server: tiny_http::Server, node: Arc<Node>, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Relaxed) {
        match server.recv_timeout(Duration::from_millis(100)) {
            Ok(Some(req)) => {
                if let Err(e) = answer(req, &node.dp) {
                    log::debug!("metrics connection: {e}");
                }
            }
            Ok(None) => {}
            Err(e) => {
                log::warn!("metrics: {e}");
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tapyard::BridgeConfig;

    #[test]
    fn nat_counters_are_exposed_with_a_router() {
        use tapyard::l3::IfaceConfig;
        use tapyard::nat::NatConfig;
        let mut b = Datapath::builder();
        b.add_router_iface(
            IfaceConfig::new(
                "eth0",
                tapyard::MacAddr([2, 0, 0, 0, 0, 1]),
                std::net::Ipv4Addr::new(172, 18, 0, 2),
                24,
            ),
            None,
        )
        .unwrap();
        b.netfilter(NatConfig::default()).unwrap();
        let dp = b.build();
        let t = render(&dp);
        for f in [
            "tapyard_nat_connections 0\n",
            "tapyard_nat_connections_total 0\n",
            "tapyard_nat_dnat_total 0\n",
            "tapyard_nat_snat_total 0\n",
            "tapyard_nat_rejected_total 0\n",
            "tapyard_conntrack_invalid_total 0\n",
            "tapyard_nat_services 0\n",
            "# TYPE tapyard_nat_connections gauge\n",
        ] {
            assert!(t.contains(f), "{f} missing:\n{t}");
        }
        for line in t.lines().filter(|l| l.starts_with("# TYPE")) {
            assert_eq!(t.matches(&format!("{line}\n")).count(), 1, "{line}");
        }
    }

    #[test]
    fn exposition_has_every_family_once_with_labels() {
        let mut b = Datapath::builder();
        let br = b.add_bridge(BridgeConfig::new("cni0")).unwrap();
        b.add_port("pod-a", Some(br)).unwrap();
        let dp = b.build();
        let t = render(&dp);
        assert!(
            t.contains("tapyard_port_rx_packets_total{port=\"pod-a\"} 0\n"),
            "{t}"
        );
        assert!(
            t.contains("tapyard_drops_total{reason=\"truncated\"} 0\n"),
            "{t}"
        );
        assert!(
            t.contains("tapyard_fdb_entries{bridge=\"cni0\"} 0\n"),
            "{t}"
        );
        assert_eq!(
            t.matches("# TYPE tapyard_forwarded_total counter").count(),
            1
        );
        for line in t.lines().filter(|l| !l.starts_with('#')) {
            let value = line.rsplit(' ').next().unwrap();
            assert!(value.parse::<u64>().is_ok(), "{line}");
        }
        assert_eq!(label("a\"b"), "a\\\"b");
    }

    #[test]
    fn serves_metrics_over_http_and_404_elsewhere() {
        use std::io::{Read, Write};
        let mut b = Datapath::builder();
        let br = b.add_bridge(BridgeConfig::new("cni0")).unwrap();
        b.add_port("pod-a", Some(br)).unwrap();
        let dp = b.build();
        let server = listen("127.0.0.1:0").unwrap();
        let addr = server.server_addr().to_ip().unwrap();
        let get = |req: &str| {
            let mut s = std::net::TcpStream::connect(addr).unwrap();
            s.write_all(req.as_bytes()).unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).unwrap();
            out
        };
        let answer = std::thread::spawn(move || {
            for _ in 0..2 {
                answer(server.recv().unwrap(), &dp).unwrap();
            }
        });
        let ok = get("GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.1 200 OK"), "{ok}");
        assert!(
            ok.contains("Content-Type: text/plain; version=0.0.4\r\n"),
            "{ok}"
        );
        assert!(
            ok.contains("tapyard_fdb_entries{bridge=\"cni0\"} 0\n"),
            "{ok}"
        );
        let nf = get("GET /other HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        assert!(nf.starts_with("HTTP/1.1 404"), "{nf}");
        answer.join().unwrap();
    }
}
