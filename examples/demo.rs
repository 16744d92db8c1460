//! The tapyard demo, no root needed: three smoltcp hosts on one in-process bridge.
//!
//! `cargo run --example demo`
//!
//! Host A opens a TCP connection to host B and sends 64 KiB, which B echoes back; host C sends
//! a UDP broadcast that A and B both receive. The bridge starts empty: ARP requests are
//! broadcasts, so it floods them, learns each host's port from its source address and then
//! forwards unicast frames to one port only. Then A does the same with host D, on another
//! bridge and subnet, through tapyard's router: A ARPs for its gateway, the router answers,
//! routes the packets (TTL decremented), ARPs for D and queues the first packet until D answers.
//! Last, A reaches a Service: the ClusterIP 10.96.0.7:7 is DNAT'd by tapyard's conntrack to one
//! of its endpoints (b:7 or d:7), chosen at random per connection; replies come back from the
//! ClusterIP. The demo prints the first frames each port sent, the learned table (`bridge fdb
//! show`), the routes (`ip route`), the neighbours (`ip neigh`), the connections (`conntrack
//! -L`), the Services and the counters.
#![allow(
    clippy::cast_possible_truncation,
    reason = "example set-up: small loop counters and random draws narrowed into addresses, ports and ids"
)]

use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use smoltcp::iface::SocketHandle;
use smoltcp::socket::{tcp, udp};
use smoltcp::wire::{IpAddress, IpCidr, IpEndpoint, Ipv4Address};
use std::net::Ipv4Addr;

use tapyard::l3::IfaceConfig;
use tapyard::nat::{Endpoint, ServiceSpec};
use tapyard::nat::{NatConfig, NatRules, Prefix};
use tapyard::port::{mem_pair, Direction, Observed, Observer, Port, SmolHost};
use tapyard::runtime::Pump;
use tapyard::stats::CounterSet;
use tapyard::wire::family::IpProto;
use tapyard::wire::Summary;
use tapyard::{BridgeConfig, Datapath, Instant, MacAddr, PortId};

const PAYLOAD: usize = 64 * 1024;

fn tcp_socket() -> tcp::Socket<'static> {
    tcp::Socket::new(
        tcp::SocketBuffer::new(vec![0; 65536]),
        tcp::SocketBuffer::new(vec![0; 65536]),
    )
}

fn udp_socket() -> udp::Socket<'static> {
    udp::Socket::new(
        udp::PacketBuffer::new(vec![udp::PacketMetadata::EMPTY; 8], vec![0; 4096]),
        udp::PacketBuffer::new(vec![udp::PacketMetadata::EMPTY; 8], vec![0; 4096]),
    )
}

/// Prints the first frames a port sends: the observer of the library's [`Observed`] port
/// middleware, wrapped around each bridge port.
struct Tracer {
    port: String,
    budget: AtomicUsize,
}

impl Observer for Tracer {
    fn wants(&self) -> bool {
        self.budget.load(Relaxed) > 0
    }

    fn observe(&self, dir: Direction, frames: &[tapyard::PacketBuf]) {
        if dir != Direction::Tx {
            return;
        }
        for f in frames {
            if self
                .budget
                .fetch_update(Relaxed, Relaxed, |b| b.checked_sub(1))
                .is_ok()
            {
                println!("  -> {:<3} {}", self.port, Summary::parse(f.frame()));
            }
        }
    }
}

fn main() {
    // The datapath: bridge br0 with hosts a, b, c; bridge br1 with host d; a router with an
    // interface on each bridge (the hosts' gateways) routes between the two subnets.
    let mut b = Datapath::builder();
    let br0 = b.add_bridge(BridgeConfig::new("br0")).expect("bridge");
    let br1 = b.add_bridge(BridgeConfig::new("br1")).expect("bridge");
    let names = ["a", "b", "c", "d"];
    let ids: Vec<PortId> = names
        .iter()
        .map(|n| {
            let br = if *n == "d" { br1 } else { br0 };
            b.add_port(*n, Some(br)).expect("port")
        })
        .collect();
    let gw0 = Ipv4Addr::new(10, 0, 0, 254);
    let gw1 = Ipv4Addr::new(10, 0, 1, 1);
    b.add_router_iface(
        IfaceConfig::new("gw0", MacAddr::local(0xfe00), gw0, 24),
        Some(br0),
    )
    .expect("router interface");
    b.add_router_iface(
        IfaceConfig::new("gw1", MacAddr::local(0xfe01), gw1, 24),
        Some(br1),
    )
    .expect("router interface");
    // Conntrack and NAT, with the hosts' subnets as the "cluster".
    b.netfilter(NatConfig {
        rules: NatRules {
            cluster_cidr: Some(Prefix::new(Ipv4Addr::new(10, 0, 0, 0), 16)),
            ..NatRules::default()
        },
        ..NatConfig::default()
    })
    .expect("netfilter");
    let dp = Arc::new(b.build());
    // A Service: ClusterIP 10.96.0.7:7/tcp over the echo servers on b and d.
    let vip = Ipv4Addr::new(10, 96, 0, 7);
    let mut svc = ServiceSpec::new("echo", vip, 7, IpProto::TCP);
    svc.endpoints = vec![
        Endpoint::new(
            std::net::SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 2), 7),
            true,
        ),
        Endpoint::new(
            std::net::SocketAddrV4::new(Ipv4Addr::new(10, 0, 1, 2), 7),
            true,
        ),
    ];
    dp.control()
        .netfilter()
        .expect("netfilter")
        .upsert_service(svc, Instant::ZERO)
        .expect("service");

    // Four hosts, each on an in-memory pair whose other end is a bridge port.
    let mut now = Instant::ZERO;
    let mut hosts = Vec::new();
    let mut ports: Vec<(PortId, Arc<dyn Port>)> = Vec::new();
    for (i, (name, id)) in names.iter().zip(&ids).enumerate() {
        let (bridge_end, host_end) = mem_pair(name, &format!("{name}-host"), 256);
        let mac = MacAddr::local(i as u32 + 1);
        let (ip, gw) = if *name == "d" {
            (IpCidr::new(IpAddress::v4(10, 0, 1, 2), 24), gw1)
        } else {
            (IpCidr::new(IpAddress::v4(10, 0, 0, i as u8 + 1), 24), gw0)
        };
        hosts.push(SmolHost::new(mac, ip, Some(gw), host_end, now));
        let tracer = Tracer {
            port: name.to_string(),
            budget: AtomicUsize::new(if *name == "d" { 6 } else { 4 }),
        };
        let traced = Observed::new(bridge_end, tracer);
        ports.push((*id, Arc::new(traced)));
    }
    let mut pump = Pump::new(dp.clone(), &ports).expect("pump");
    println!("tapyard demo: bridge br0 with hosts a=10.0.0.1, b=10.0.0.2, c=10.0.0.3 (gateway");
    println!("10.0.0.254), bridge br1 with host d=10.0.1.2 (gateway 10.0.1.1), a router between\n");
    println!("first frames out of each bridge port:");

    // Bridged: A sends PAYLOAD bytes to B's echo service; routed: the same to D.
    let (steps, _) = tcp_echo(
        &mut hosts,
        &mut pump,
        &mut now,
        0,
        &[1],
        Ipv4Address::new(10, 0, 0, 2),
    );
    println!(
        "\nTCP (bridged): a sent {PAYLOAD} bytes to b:7 and got them back intact ({steps} ms simulated)"
    );
    let (steps, _) = tcp_echo(
        &mut hosts,
        &mut pump,
        &mut now,
        0,
        &[3],
        Ipv4Address::new(10, 0, 1, 2),
    );
    println!(
        "TCP (routed):  a sent {PAYLOAD} bytes to d:7 through the router and got them back ({steps} ms)"
    );

    // C broadcasts a UDP datagram; A and B both receive it.
    let rx: Vec<SocketHandle> = hosts[..2]
        .iter_mut()
        .map(|h| {
            let mut s = udp_socket();
            s.bind(9999).expect("bind");
            h.sockets.add(s)
        })
        .collect();
    let tx = {
        let mut s = udp_socket();
        s.bind(9998).expect("bind");
        hosts[2].sockets.add(s)
    };
    hosts[2]
        .sockets
        .get_mut::<udp::Socket>(tx)
        .send_slice(
            b"hello, everyone",
            IpEndpoint::new(IpAddress::v4(10, 0, 0, 255), 9999),
        )
        .expect("udp send");
    for _ in 0..20 {
        now = now + std::time::Duration::from_millis(1);
        for h in hosts.iter_mut() {
            h.poll(now);
        }
        pump.drain(now, 8);
    }
    for (h, s) in hosts[..2].iter_mut().zip(&rx) {
        let mac = h.mac();
        let (data, meta) = h
            .sockets
            .get_mut::<udp::Socket>(*s)
            .recv()
            .expect("broadcast received");
        println!(
            "UDP broadcast: {} got {:?} from {}",
            mac,
            std::str::from_utf8(data).unwrap_or("?"),
            meta.endpoint
        );
    }

    // Through the Service: each connection goes to b or d; a sees only the ClusterIP.
    for _ in 0..4 {
        let (steps, by) = tcp_echo(&mut hosts, &mut pump, &mut now, 0, &[1, 3], vip);
        println!(
            "TCP (Service): a sent {PAYLOAD} bytes to {vip}:7, served by {} ({steps} ms)",
            names[by]
        );
    }

    println!("\nbridge fdb show:");
    let mut fdb = String::new();
    dp.control().fmt_fdb(now, &mut fdb).expect("format");
    print!("{fdb}");
    println!("\nip route show:");
    let mut routes = String::new();
    dp.control().fmt_routes(&mut routes).expect("format");
    print!("{routes}");
    println!("\nip neigh show:");
    let mut neigh = String::new();
    dp.control().fmt_neigh(now, &mut neigh).expect("format");
    print!("{neigh}");
    let nf = dp.control().netfilter().expect("netfilter");
    println!("\nconntrack -L:");
    print!("{}", nf.conntrack().fmt_dump(now));
    println!("\nservices:");
    print!("{}", nf.services().fmt_services());
    println!("\ncounters:");
    print!("{}", dp.control().stats());
    if let Some(r) = dp.control().router() {
        println!("router: {}", r.counters.snapshot().line());
        println!(
            "neighbours: {}",
            r.neigh::<std::net::Ipv4Addr>().counters().line()
        );
    }
    println!("nat: {}", nf.counters().line());
    println!("conntrack: {}", nf.conntrack().counters().line());
}

/// Host `from` connects to `to_ip:7` (each host in `to` listens and echoes), sends PAYLOAD
/// bytes and checks they come back intact. Returns the simulated milliseconds it took and the
/// host that served the connection.
fn tcp_echo(
    hosts: &mut [SmolHost],
    pump: &mut Pump,
    now: &mut Instant,
    from: usize,
    to: &[usize],
    to_ip: Ipv4Address,
) -> (u32, usize) {
    let servers: Vec<(usize, SocketHandle)> = to
        .iter()
        .map(|&t| {
            let mut s = tcp_socket();
            s.listen(7).expect("listen");
            (t, hosts[t].sockets.add(s))
        })
        .collect();
    let client = hosts[from].sockets.add(tcp_socket());
    {
        let h = &mut hosts[from];
        static NEXT_PORT: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(49152);
        let port = NEXT_PORT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        h.sockets
            .get_mut::<tcp::Socket>(client)
            .connect(h.iface.context(), (to_ip, 7), port)
            .expect("connect");
    }
    let sent: Vec<u8> = (0..PAYLOAD).map(|i| (i * 7 % 251) as u8).collect();
    let (mut off, mut echoed) = (0usize, Vec::with_capacity(PAYLOAD));
    let mut served = vec![0usize; servers.len()];
    let mut steps = 0u32;
    while echoed.len() < PAYLOAD && steps < 100_000 {
        steps += 1;
        *now = *now + std::time::Duration::from_millis(1);
        for h in hosts.iter_mut() {
            h.poll(*now);
        }
        pump.drain(*now, 8);
        pump.timers(*now);
        let c = hosts[from].sockets.get_mut::<tcp::Socket>(client);
        if c.can_send() && off < sent.len() {
            off += c.send_slice(&sent[off..]).unwrap_or(0);
        }
        if c.can_recv() {
            let _ = c.recv(|d| {
                echoed.extend_from_slice(d);
                (d.len(), ())
            });
        }
        for (k, (t, s)) in servers.iter().enumerate() {
            served[k] += echo(&mut hosts[*t], *s);
        }
    }
    assert_eq!(echoed, sent, "the echoed bytes differ from what was sent");
    hosts[from].sockets.get_mut::<tcp::Socket>(client).abort();
    for (t, s) in &servers {
        hosts[*t].sockets.get_mut::<tcp::Socket>(*s).abort();
    }
    // Let the resets go out.
    for _ in 0..3 {
        *now = *now + std::time::Duration::from_millis(1);
        for h in hosts.iter_mut() {
            h.poll(*now);
        }
        pump.drain(*now, 8);
    }
    for (t, s) in &servers {
        hosts[*t].sockets.remove(*s);
    }
    hosts[from].sockets.remove(client);
    let by = served
        .iter()
        .enumerate()
        .max_by_key(|(_, n)| **n)
        .map_or(to[0], |(k, _)| servers[k].0);
    (steps, by)
}

/// Echoes what `server` received; returns the bytes echoed.
fn echo(host: &mut SmolHost, server: SocketHandle) -> usize {
    let s = host.sockets.get_mut::<tcp::Socket>(server);
    let mut tmp = [0u8; 4096];
    let mut total = 0;
    while s.can_recv() && s.can_send() {
        let room = s.send_capacity() - s.send_queue();
        let n = s.recv_slice(&mut tmp[..room.min(4096)]).unwrap_or(0);
        if n == 0 {
            break;
        }
        total += s.send_slice(&tmp[..n]).unwrap_or(0);
    }
    total
}
