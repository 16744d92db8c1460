//! The tapyard demo, no root needed: three smoltcp hosts on one in-process bridge.
//!
//! `cargo run --example demo`
//!
//! Host A opens a TCP connection to host B and sends 64 KiB, which B echoes back; host C sends
//! a UDP broadcast that A and B both receive. The bridge starts empty: ARP requests are
//! broadcasts, so it floods them, learns each host's port from its source address and then
//! forwards unicast frames to one port only. The demo prints the first frames it switched, the
//! learned table (like `bridge fdb show`) and the counters.

use std::sync::Arc;

use smoltcp::iface::SocketHandle;
use smoltcp::socket::{tcp, udp};
use smoltcp::wire::{IpAddress, IpCidr, IpEndpoint, Ipv4Address};
use tapyard::port::{mem_pair, Port, SmolHost};
use tapyard::runtime::Pump;
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

/// A port wrapper that prints the first frames it carries.
struct Traced<P> {
    inner: P,
    budget: std::sync::atomic::AtomicUsize,
}

impl<P: Port> Port for Traced<P> {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn recv_batch(
        &self,
        pool: &mut tapyard::BufPool,
        batch: &mut tapyard::Batch,
    ) -> std::io::Result<usize> {
        self.inner.recv_batch(pool, batch)
    }
    fn send(&self, buf: &tapyard::PacketBuf) -> Result<(), tapyard::DropReason> {
        use std::sync::atomic::Ordering::Relaxed;
        if self.budget.load(Relaxed) > 0 {
            self.budget.fetch_sub(1, Relaxed);
            println!("  -> {:<3} {}", self.name(), Summary::parse(buf.frame()));
        }
        self.inner.send(buf)
    }
}

fn main() {
    // The datapath: one bridge, three ports.
    let mut b = Datapath::builder();
    let br = b.add_bridge(BridgeConfig::new("br0")).expect("bridge");
    let names = ["a", "b", "c"];
    let ids: Vec<PortId> = names
        .iter()
        .map(|n| b.add_port(*n, Some(br)).expect("port"))
        .collect();
    let dp = Arc::new(b.build());

    // Three hosts, each on an in-memory pair whose other end is a bridge port.
    let mut now = Instant::ZERO;
    let mut hosts = Vec::new();
    let mut ports: Vec<(PortId, Arc<dyn Port>)> = Vec::new();
    for (i, (name, id)) in names.iter().zip(&ids).enumerate() {
        let (bridge_end, host_end) = mem_pair(name, &format!("{name}-host"), 256);
        let mac = MacAddr::local(i as u32 + 1);
        let ip = IpCidr::new(IpAddress::v4(10, 0, 0, i as u8 + 1), 24);
        hosts.push(SmolHost::new(mac, ip, None, host_end, now));
        let traced = Traced {
            inner: bridge_end,
            budget: std::sync::atomic::AtomicUsize::new(4),
        };
        ports.push((*id, Arc::new(traced)));
    }
    let mut pump = Pump::new(dp.clone(), &ports).expect("pump");
    println!("tapyard demo: bridge br0 with hosts a=10.0.0.1, b=10.0.0.2, c=10.0.0.3\n");
    println!("first frames out of each bridge port:");

    // B listens and echoes; A connects and sends PAYLOAD bytes.
    let server = hosts[1].sockets.add(tcp_socket());
    let client = hosts[0].sockets.add(tcp_socket());
    hosts[1]
        .sockets
        .get_mut::<tcp::Socket>(server)
        .listen(7)
        .expect("listen");
    {
        let h = &mut hosts[0];
        h.sockets
            .get_mut::<tcp::Socket>(client)
            .connect(h.iface.context(), (Ipv4Address::new(10, 0, 0, 2), 7), 49152)
            .expect("connect");
    }
    let sent: Vec<u8> = (0..PAYLOAD).map(|i| (i * 7 % 251) as u8).collect();
    let (mut off, mut echoed) = (0usize, Vec::with_capacity(PAYLOAD));
    let mut steps = 0u32;
    while echoed.len() < PAYLOAD && steps < 100_000 {
        steps += 1;
        now = now + std::time::Duration::from_millis(1);
        for h in hosts.iter_mut() {
            h.poll(now);
        }
        pump.drain(now, 8);
        let c = hosts[0].sockets.get_mut::<tcp::Socket>(client);
        if c.can_send() && off < sent.len() {
            off += c.send_slice(&sent[off..]).unwrap_or(0);
        }
        if c.can_recv() {
            let _ = c.recv(|d| {
                echoed.extend_from_slice(d);
                (d.len(), ())
            });
        }
        echo(&mut hosts[1], server);
    }
    assert_eq!(echoed, sent, "the echoed bytes differ from what was sent");
    println!(
        "\nTCP: a sent {PAYLOAD} bytes to b:7 and got them back intact ({} ms of simulated time)",
        steps
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

    println!("\nbridge fdb show:");
    let mut fdb = String::new();
    dp.fmt_fdb(now, &mut fdb).expect("format");
    print!("{fdb}");
    println!("\ncounters:");
    print!("{}", dp.stats());
}

fn echo(host: &mut SmolHost, server: SocketHandle) {
    let s = host.sockets.get_mut::<tcp::Socket>(server);
    let mut tmp = [0u8; 4096];
    while s.can_recv() && s.can_send() {
        let room = s.send_capacity() - s.send_queue();
        let n = s.recv_slice(&mut tmp[..room.min(4096)]).unwrap_or(0);
        if n == 0 {
            break;
        }
        let _ = s.send_slice(&tmp[..n]);
    }
}
