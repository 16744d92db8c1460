//! The router's local TCP stack at the edge: kube-proxy's health servers on the node's own
//! addresses, answered by an embedded smoltcp stack.
//!
//! The router hands the TCP segments to the ports it serves ([`crate::l3::local`]) to a
//! bounded queue; [`LocalServer`]'s thread takes them, runs them through [`LocalTcp`] (a
//! smoltcp interface of medium IP that accepts any destination address, with a listening
//! socket per served port), answers each HTTP request ([`http`]) and sends the stack's
//! datagrams back the way the client's came: wrapped in Ethernet to the MAC the client's
//! segment came from, out of the router interface it came in on, through
//! [`Datapath::inject`] and the runtime's port drivers, as a frame the router makes. None of
//! it runs on a worker: the workers' only cost is the copy into the queue, for those ports'
//! segments only.
//!
//! Bounds: [`MAX_CONNS`] connections at once (a SYN beyond them finds no listener and is
//! reset by the stack), each closed after its answer and aborted [`CONN_DEADLINE`] after its
//! SYN, requests of at most [`REQUEST_MAX`] bytes of head (a longer one is answered `400`).
//!
//! Served ports: each Service's health check node port
//! ([`crate::nat::ServiceSpec::health_check_node_port`], read from the Services table every
//! [`PORTS_REFRESH`]; the answer itself reads the table per request, so it follows endpoint
//! changes at once) and the proxy's `/healthz` port ([`LocalServerConfig::healthz_port`]).

pub mod http;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

use hashbrown::HashMap;
use smoltcp::iface::{Config, Interface, SocketHandle, SocketSet};
use smoltcp::phy::{self, Checksum, Device, DeviceCapabilities, Medium};
use smoltcp::socket::tcp;
use smoltcp::wire::{HardwareAddress, IpAddress, IpCidr, IpEndpoint};

use super::{Runtime, Shared};
use crate::base::IfaceId;
use crate::buf::{Batch, BufPool};
use crate::datapath::Datapath;
use crate::l3::local::{LocalStack, Segment};
use crate::nat::service::{ServiceAddr, Services};
use crate::stats::DropReason;
use crate::time::Clock;
use crate::wire::ethernet::{ethertype, HEADER_LEN as ETH_LEN};
use crate::wire::mac::MacAddr;

/// The most connections the stack holds at once (listening sockets aside).
pub const MAX_CONNS: usize = 64;

/// A connection still open this long after its SYN is aborted.
pub const CONN_DEADLINE: Duration = Duration::from_secs(10);

/// The longest request head read; a longer one is answered `400 Bad Request`.
pub const REQUEST_MAX: usize = 4096;

/// How often the served ports are read again from the Services table.
pub const PORTS_REFRESH: Duration = Duration::from_millis(500);

/// The most clients whose way back (interface, MAC) is remembered.
const MAX_PEERS: usize = 1024;

/// Socket buffers (each way): a request head and an answer fit.
const SOCKET_BUF: usize = 4096;

/// Settings of the local stack.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LocalServerConfig {
    /// The port of the proxy's own `/healthz` and `/livez` (kube-proxy's
    /// `--healthz-bind-address`, default port 10256); `None`: not served.
    pub healthz_port: Option<u16>,
}

/// What a served port answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Healthz,
    Service,
}

/// One socket of the stack.
#[derive(Debug)]
struct Conn {
    handle: SocketHandle,
    port: u16,
    /// When it left the listening state (its SYN), if it has.
    since: Option<smoltcp::time::Instant>,
    /// The request head read so far.
    req: Vec<u8>,
    answered: bool,
}

/// A smoltcp `Device` of medium IP over two queues of datagrams.
#[derive(Debug, Default)]
struct Queues {
    rx: VecDeque<Vec<u8>>,
    tx: Vec<Vec<u8>>,
}

struct RxTok(Vec<u8>);
struct TxTok<'a>(&'a mut Vec<Vec<u8>>);

impl phy::RxToken for RxTok {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        f(&self.0)
    }
}

impl phy::TxToken for TxTok<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let mut v = vec![0; len];
        let r = f(&mut v);
        self.0.push(v);
        r
    }
}

impl Device for Queues {
    type RxToken<'a> = RxTok;
    type TxToken<'a> = TxTok<'a>;

    fn receive(&mut self, _t: smoltcp::time::Instant) -> Option<(RxTok, TxTok<'_>)> {
        let p = self.rx.pop_front()?;
        Some((RxTok(p), TxTok(&mut self.tx)))
    }

    fn transmit(&mut self, _t: smoltcp::time::Instant) -> Option<TxTok<'_>> {
        Some(TxTok(&mut self.tx))
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut c = DeviceCapabilities::default();
        c.medium = Medium::Ip;
        // IPv6's minimum MTU: the answers are small, and no link of the node is smaller.
        c.max_transmission_unit = 1280;
        c.max_burst_size = Some(16);
        // The router checked the IP header and the TCP checksum (or trusted a partial one
        // from this host) before the hand-off.
        c.checksum.ipv4 = Checksum::Tx;
        c.checksum.tcp = Checksum::Tx;
        c
    }
}

/// The local TCP stack, sans I/O: segments in ([`LocalTcp::input`]), frames out
/// ([`LocalTcp::poll`]), the HTTP answers made by the caller's closure.
pub struct LocalTcp {
    iface: Interface,
    sockets: SocketSet<'static>,
    dev: Queues,
    conns: Vec<Conn>,
    ports: Vec<(u16, Role)>,
    /// The way back to each client: interface, MAC, last seen.
    peers: HashMap<IpAddr, (IfaceId, MacAddr, smoltcp::time::Instant)>,
}

impl std::fmt::Debug for LocalTcp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalTcp")
            .field("ports", &self.ports)
            .field("conns", &self.conns.len())
            .finish()
    }
}

impl Default for LocalTcp {
    fn default() -> Self {
        LocalTcp::new()
    }
}

impl LocalTcp {
    /// A stack serving no port yet.
    pub fn new() -> LocalTcp {
        let mut dev = Queues::default();
        let mut iface = Interface::new(
            Config::new(HardwareAddress::Ip),
            &mut dev,
            smoltcp::time::Instant::ZERO,
        );
        // Every destination is ours (the router handed over only segments to its own
        // addresses): "any IP", and the whole of each family on link, so replies need no
        // route.
        iface.set_any_ip(true);
        iface.update_ip_addrs(|a| {
            let _ = a.push(IpCidr::new(IpAddress::Ipv4(Ipv4Addr::UNSPECIFIED), 0));
            let _ = a.push(IpCidr::new(IpAddress::Ipv6(Ipv6Addr::UNSPECIFIED), 0));
        });
        LocalTcp {
            iface,
            sockets: SocketSet::new(Vec::new()),
            dev,
            conns: Vec::new(),
            ports: Vec::new(),
            peers: HashMap::new(),
        }
    }

    /// Serves `services` (health check node ports) and `healthz` from now on; sockets of
    /// ports no longer served are closed.
    fn set_ports(&mut self, services: &[u16], healthz: Option<u16>) {
        let mut ports: Vec<(u16, Role)> = services.iter().map(|&p| (p, Role::Service)).collect();
        if let Some(h) = healthz {
            ports.retain(|&(p, _)| p != h);
            ports.push((h, Role::Healthz));
        }
        ports.sort_unstable_by_key(|p| p.0);
        if ports == self.ports {
            return;
        }
        self.ports = ports;
        let served = |p: u16| self.ports.iter().any(|&(q, _)| q == p);
        let gone: Vec<SocketHandle> = self
            .conns
            .iter()
            .filter(|c| !served(c.port))
            .map(|c| c.handle)
            .collect();
        for h in gone {
            self.sockets.get_mut::<tcp::Socket>(h).abort();
        }
    }

    /// The ports served, ascending.
    pub fn ports(&self) -> Vec<u16> {
        self.ports.iter().map(|p| p.0).collect()
    }

    /// Takes a segment the router handed over.
    pub fn input(&mut self, seg: &Segment, now: smoltcp::time::Instant) {
        let Some(src) = src_addr(seg.ip()) else {
            return;
        };
        if self.peers.len() >= MAX_PEERS && !self.peers.contains_key(&src) {
            let oldest = self.peers.iter().min_by_key(|(_, v)| v.2).map(|(k, _)| *k);
            if let Some(k) = oldest {
                self.peers.remove(&k);
            }
        }
        self.peers.insert(src, (seg.iface, seg.peer_mac, now));
        self.dev.rx.push_back(seg.ip().to_vec());
    }

    /// When [`LocalTcp::poll`] should run next at the latest.
    pub fn poll_delay(&mut self, now: smoltcp::time::Instant) -> Option<Duration> {
        self.iface
            .poll_delay(now, &self.sockets)
            .map(|d| Duration::from_micros(d.total_micros()))
    }

    /// Runs the stack at `now`: takes the segments given, answers complete requests with
    /// `answer(local address, path)` (`None` for no HTTP request), keeps one listening
    /// socket per served port, and hands each frame to send to `out(interface, frame)`.
    pub fn poll(
        &mut self,
        now: smoltcp::time::Instant,
        answer: &mut dyn FnMut(SocketAddr, Option<&str>) -> Vec<u8>,
        out: &mut dyn FnMut(IfaceId, &[u8]),
        mac_of: &dyn Fn(IfaceId) -> Option<MacAddr>,
    ) {
        self.listen();
        self.iface.poll(now, &mut self.dev, &mut self.sockets);
        self.serve(now, answer);
        self.listen();
        self.iface.poll(now, &mut self.dev, &mut self.sockets);
        self.serve(now, answer);
        for ip in self.dev.tx.drain(..) {
            let Some(dst) = dst_addr(&ip) else { continue };
            let Some(&(via, peer, _)) = self.peers.get(&dst) else {
                continue;
            };
            let Some(mac) = mac_of(via) else { continue };
            let et = if ip.first().is_some_and(|v| v >> 4 == 6) {
                ethertype::IPV6
            } else {
                ethertype::IPV4
            };
            let mut f = Vec::with_capacity(ETH_LEN + ip.len());
            f.extend_from_slice(&peer.0);
            f.extend_from_slice(&mac.0);
            f.extend_from_slice(&et.to_be_bytes());
            f.extend_from_slice(&ip);
            out(via, &f);
        }
    }

    /// Reads requests, answers and closes; drops closed sockets and those past their
    /// deadline.
    fn serve(
        &mut self,
        now: smoltcp::time::Instant,
        answer: &mut dyn FnMut(SocketAddr, Option<&str>) -> Vec<u8>,
    ) {
        let deadline = smoltcp::time::Duration::from_micros(
            u64::try_from(CONN_DEADLINE.as_micros()).unwrap_or(u64::MAX),
        );
        let sockets = &mut self.sockets;
        self.conns.retain_mut(|c| {
            let s = sockets.get_mut::<tcp::Socket>(c.handle);
            if s.state() != tcp::State::Listen && c.since.is_none() {
                c.since = Some(now);
            }
            if matches!(s.state(), tcp::State::Closed | tcp::State::TimeWait)
                || c.since.is_some_and(|t| now >= t + deadline)
            {
                s.abort();
                sockets.remove(c.handle);
                return false;
            }
            if c.answered || !s.may_recv() {
                return true;
            }
            let mut buf = [0u8; 1024];
            while let Ok(n) = s.recv_slice(&mut buf) {
                if n == 0 {
                    break;
                }
                let take = n.min(REQUEST_MAX.saturating_sub(c.req.len()));
                c.req.extend_from_slice(&buf[..take]);
            }
            let done = c.req.windows(4).any(|w| w == b"\r\n\r\n")
                || c.req.windows(2).any(|w| w == b"\n\n");
            if !done && c.req.len() < REQUEST_MAX {
                return true;
            }
            let path = if done {
                http::request_path(&c.req)
            } else {
                None
            };
            let local = s
                .local_endpoint()
                .map(|e: IpEndpoint| SocketAddr::new(e.addr.into(), e.port));
            if let Some(local) = local {
                let a = answer(local, path);
                let _ = s.send_slice(&a);
            }
            s.close();
            c.answered = true;
            c.req = Vec::new();
            true
        });
    }

    /// Keeps one listening socket per served port (none beyond [`MAX_CONNS`] connections).
    fn listen(&mut self) {
        let active = self.conns.iter().filter(|c| c.since.is_some()).count();
        for &(port, _) in &self.ports {
            let listening = self.conns.iter().any(|c| {
                c.port == port && self.sockets.get::<tcp::Socket>(c.handle).is_listening()
            });
            if listening || active >= MAX_CONNS {
                continue;
            }
            let mut s = tcp::Socket::new(
                tcp::SocketBuffer::new(vec![0; SOCKET_BUF]),
                tcp::SocketBuffer::new(vec![0; SOCKET_BUF]),
            );
            if s.listen(port).is_err() {
                continue;
            }
            let handle = self.sockets.add(s);
            self.conns.push(Conn {
                handle,
                port,
                since: None,
                req: Vec::new(),
                answered: false,
            });
        }
    }
}

/// The source address of an IP datagram.
fn src_addr(ip: &[u8]) -> Option<IpAddr> {
    addr_at(ip, 12, 8)
}

/// The destination address of an IP datagram.
fn dst_addr(ip: &[u8]) -> Option<IpAddr> {
    addr_at(ip, 16, 24)
}

fn addr_at(ip: &[u8], v4: usize, v6: usize) -> Option<IpAddr> {
    match ip.first()? >> 4 {
        4 => {
            let b: [u8; 4] = ip.get(v4..v4 + 4)?.try_into().ok()?;
            Some(IpAddr::V4(b.into()))
        }
        6 => {
            let b: [u8; 16] = ip.get(v6..v6 + 16)?.try_into().ok()?;
            Some(IpAddr::V6(b.into()))
        }
        _ => None,
    }
}

/// The answer of served port `port` of `local`'s family to a request for `path` (`None`:
/// no HTTP request): the proxy's health, or a Service's health check from `services`.
pub fn answer(
    services: Option<&Services>,
    healthz_port: Option<u16>,
    local: SocketAddr,
    path: Option<&str>,
    since_start: Duration,
) -> Vec<u8> {
    let date = SystemTime::now();
    let Some(path) = path else {
        return http::bad_request(date);
    };
    if healthz_port == Some(local.port()) {
        return http::proxy_answer(path, date, since_start);
    }
    fn check<A: ServiceAddr>(s: Option<&Services>, port: u16) -> Option<(String, usize)> {
        s?.health_check::<A>(port)
    }
    let hc = match local.ip() {
        IpAddr::V4(_) => check::<Ipv4Addr>(services, local.port()),
        IpAddr::V6(_) => check::<Ipv6Addr>(services, local.port()),
    };
    let (name, n) = hc.unwrap_or_default();
    http::service_answer(&http::ServiceHealth::of(&name, n), date)
}

/// The local stack's thread ([`Runtime::start_local_server`]): stopped and joined on drop.
#[derive(Debug)]
pub struct LocalServer {
    stop: Arc<AtomicBool>,
    stack: LocalStack,
    /// The healthz port (0: none), read by the thread every round.
    healthz: Arc<AtomicU32>,
    thread: Option<JoinHandle<()>>,
}

impl LocalServer {
    /// The ports served now (refreshed every [`PORTS_REFRESH`]).
    pub fn ports(&self) -> Vec<u16> {
        self.stack.ports()
    }

    /// Serves the proxy's `/healthz` on `port` from the next refresh on (`None`: no more).
    pub fn set_healthz_port(&self, port: Option<u16>) {
        self.healthz
            .store(port.map_or(0, u32::from), Ordering::Release);
    }
}

impl Drop for LocalServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.stack.set_ports(&[]);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Runtime {
    /// Starts the thread that answers TCP on the router's own addresses for the ports of the
    /// local stack (see the [module docs](self)): each Service's health check node port and
    /// `cfg.healthz_port`. `None` without a router. Changing the served ports: the Services'
    /// (read every [`PORTS_REFRESH`]) and [`LocalServer::set_healthz_port`]'s.
    pub fn start_local_server(&self, cfg: LocalServerConfig) -> io::Result<Option<LocalServer>> {
        let Some(stack) = self.dp.control().local_stack() else {
            return Ok(None);
        };
        let stop = Arc::new(AtomicBool::new(false));
        let healthz = Arc::new(AtomicU32::new(cfg.healthz_port.map_or(0, u32::from)));
        let (dp, shared, clock) = (self.dp.clone(), self.shared.clone(), self.clock);
        let (st, stk, hz) = (stop.clone(), stack.clone(), healthz.clone());
        let thread = std::thread::Builder::new()
            .name("tapyard-local".into())
            .spawn(move || run(&dp, &shared, clock, &stk, &hz, &st))?;
        Ok(Some(LocalServer {
            stop,
            stack,
            healthz,
            thread: Some(thread),
        }))
    }
}

/// The thread's loop: segments in, the stack run, its frames out through the runtime's
/// ports.
fn run(
    dp: &Arc<Datapath>,
    shared: &Shared,
    clock: Clock,
    stack: &LocalStack,
    healthz: &AtomicU32,
    stop: &AtomicBool,
) {
    let mut w = dp.worker_with_pool(BufPool::new(shared.room, 64));
    let mut batch = Batch::new();
    let mut tcp = LocalTcp::new();
    let started = std::time::Instant::now();
    let mut refresh = started;
    let smol_now = || {
        smoltcp::time::Instant::from_micros(
            i64::try_from(started.elapsed().as_micros()).unwrap_or(i64::MAX),
        )
    };
    let mac_of = |i: IfaceId| {
        dp.control()
            .router()
            .and_then(|r| r.iface(i))
            .map(|f| f.cfg.mac)
    };
    let services = dp.control().netfilter().map(|nf| nf.services());
    let mut frames: Vec<(IfaceId, Vec<u8>)> = Vec::new();
    while !stop.load(Ordering::Acquire) {
        let healthz_port = u16::try_from(healthz.load(Ordering::Acquire))
            .ok()
            .filter(|&p| p != 0);
        if std::time::Instant::now() >= refresh {
            let hc = services.map(|s| s.health_ports()).unwrap_or_default();
            tcp.set_ports(&hc, healthz_port);
            stack.set_ports(&tcp.ports());
            refresh = std::time::Instant::now() + PORTS_REFRESH;
        }
        let wait = tcp
            .poll_delay(smol_now())
            .unwrap_or(PORTS_REFRESH)
            .min(Duration::from_millis(100));
        if let Some(seg) = stack.recv_timeout(wait) {
            tcp.input(&seg, smol_now());
            stack.recycle(seg);
            for _ in 0..64 {
                let Some(seg) = stack.try_recv() else { break };
                tcp.input(&seg, smol_now());
                stack.recycle(seg);
            }
        }
        let up = started.elapsed();
        let mut answer =
            |local: SocketAddr, path: Option<&str>| answer(services, healthz_port, local, path, up);
        tcp.poll(
            smol_now(),
            &mut answer,
            &mut |via, f| frames.push((via, f.to_vec())),
            &mac_of,
        );
        // Paused (the ports being handed to another process): the answers are dropped,
        // TCP retransmits to whoever has the ports next.
        if frames.is_empty() || shared.paused.load(Ordering::Acquire) {
            frames.clear();
            continue;
        }
        let now = clock.now();
        for (via, f) in frames.drain(..) {
            dp.inject(&mut w, via, &f, &mut batch, now);
        }
        let table = shared.table.load();
        dp.dispatch(&mut w, &batch, |p, b| {
            match table.get(usize::from(p.0)).and_then(|s| s.as_ref()) {
                Some(slot) => slot.port.send(b),
                None => Err(DropReason::PortGone),
            }
        });
        batch.recycle(&mut w.pool);
    }
}
