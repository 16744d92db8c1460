//! Without root: smoltcp hosts exchange TCP data through the bridge, and the content arrives
//! intact; hosts on different bridges never hear each other.
#![allow(
    clippy::cast_possible_truncation,
    reason = "test fixtures: small loop counters and random draws narrowed into addresses, ports and ids"
)]

use std::sync::Arc;
use std::time::Duration;

use smoltcp::socket::tcp;
use smoltcp::wire::{IpAddress, IpCidr, Ipv4Address};
use tapyard::port::{mem_pair, Port, SmolHost};
use tapyard::runtime::Pump;
use tapyard::{BridgeConfig, Datapath, DropReason, Instant, MacAddr};

fn tcp_socket() -> tcp::Socket<'static> {
    tcp::Socket::new(
        tcp::SocketBuffer::new(vec![0; 65536]),
        tcp::SocketBuffer::new(vec![0; 65536]),
    )
}

struct Net {
    dp: Arc<Datapath>,
    pump: Pump,
    hosts: Vec<SmolHost>,
    now: Instant,
}

/// `layout[i]` is the bridge of host i; host i has 10.0.0.(i+1)/24 and MAC 02:00:00:00:00:0(i+1).
fn net(layout: &[&str]) -> Net {
    let mut b = Datapath::builder();
    let mut ports: Vec<(tapyard::PortId, Arc<dyn Port>)> = Vec::new();
    let mut hosts = Vec::new();
    for (i, br) in layout.iter().enumerate() {
        let bid = match b.add_bridge(BridgeConfig::new(*br)) {
            Ok(id) => id,
            Err(_) => tapyard::BridgeId(if *br == layout[0] { 0 } else { 1 }),
        };
        let name = format!("p{i}");
        let id = b.add_port(name.clone(), Some(bid)).unwrap();
        let (bridge_end, host_end) = mem_pair(&name, "host", 512);
        ports.push((id, Arc::new(bridge_end)));
        hosts.push(SmolHost::new(
            MacAddr::local(i as u32 + 1),
            IpCidr::new(IpAddress::v4(10, 0, 0, i as u8 + 1), 24),
            None,
            host_end,
            Instant::ZERO,
        ));
    }
    let dp = Arc::new(b.build());
    let pump = Pump::new(dp.clone(), &ports).unwrap();
    Net {
        dp,
        pump,
        hosts,
        now: Instant::ZERO,
    }
}

impl Net {
    fn step(&mut self) {
        self.now = self.now + Duration::from_millis(1);
        for h in self.hosts.iter_mut() {
            h.poll(self.now);
        }
        self.pump.drain(self.now, 16);
    }
}

/// Host `from` sends `data` over TCP to host `to`; returns what `to` received before the
/// sender closed (or the step budget ran out).
fn transfer(n: &mut Net, from: usize, to: usize, data: &[u8], max_steps: u32) -> Vec<u8> {
    let srv = n.hosts[to].sockets.add(tcp_socket());
    n.hosts[to]
        .sockets
        .get_mut::<tcp::Socket>(srv)
        .listen(5000)
        .unwrap();
    let cli = n.hosts[from].sockets.add(tcp_socket());
    {
        let h = &mut n.hosts[from];
        h.sockets
            .get_mut::<tcp::Socket>(cli)
            .connect(
                h.iface.context(),
                (Ipv4Address::new(10, 0, 0, to as u8 + 1), 5000),
                40000,
            )
            .unwrap();
    }
    let (mut off, mut got, mut closed) = (0, Vec::new(), false);
    for _ in 0..max_steps {
        n.step();
        let c = n.hosts[from].sockets.get_mut::<tcp::Socket>(cli);
        if c.can_send() && off < data.len() {
            off += c.send_slice(&data[off..]).unwrap();
        }
        if off == data.len() && !closed {
            c.close();
            closed = true;
        }
        let s = n.hosts[to].sockets.get_mut::<tcp::Socket>(srv);
        while s.can_recv() {
            s.recv(|d| {
                got.extend_from_slice(d);
                (d.len(), ())
            })
            .unwrap();
        }
        if got.len() == data.len() && !s.may_recv() {
            break;
        }
    }
    got
}

#[test]
fn tcp_data_crosses_the_bridge_intact() {
    let mut n = net(&["br0", "br0", "br0"]);
    // 4 MiB of a pattern that a reordering or a corrupted byte would show.
    let data: Vec<u8> = (0..4u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let got = transfer(&mut n, 0, 1, &data, 200_000);
    assert_eq!(got.len(), data.len());
    assert!(got == data, "content differs");

    // The bridge learned every talker on its own port, and the bystander (host 2) saw only
    // the initial ARP broadcast, no unicast.
    let fdb = n.dp.control().fdb_dump(tapyard::BridgeId(0), n.now);
    assert_eq!(fdb.len(), 2);
    assert_eq!(fdb[0].mac, MacAddr::local(1));
    assert_eq!(fdb[0].port, tapyard::PortId(0));
    assert_eq!(fdb[1].mac, MacAddr::local(2));
    assert_eq!(fdb[1].port, tapyard::PortId(1));
    let s = n.dp.control().stats();
    assert_eq!(s.port("p2").unwrap().tx_packets, 1, "{s}");
    assert_eq!(s.rx_drops(), 0, "{s}");
    assert!(s.port("p0").unwrap().rx_bytes > 4 << 20);
}

#[test]
fn hosts_on_different_bridges_cannot_talk() {
    let mut n = net(&["br0", "br1"]);
    let got = transfer(&mut n, 0, 1, b"hello", 3000);
    assert!(got.is_empty());
    // Host 0's ARP requests were flooded within br0, which has no other port.
    let s = n.dp.control().stats();
    assert!(s.drop_count(DropReason::NoOtherPort) >= 1, "{s}");
    assert_eq!(s.port("p1").unwrap().tx_packets, 0);
}
