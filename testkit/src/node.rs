//! A datapath driven frame by frame in memory, no root needed: [`Node`] sends a frame in and
//! collects what goes out, and advances the clock; static routes; in-memory ports.

use std::sync::Arc;
use std::time::Duration;

use tapyard::l3::{NextHop, Route, RouteProto};
use tapyard::port::{mem_pair, MemPort, Port};
use tapyard::{
    Batch, BridgeConfig, Datapath, Instant, MacAddr, PacketBuf, PortId, Verdict, Worker,
};

/// What one frame or one clock tick made the datapath send: `(port, frame)`, expanded as
/// `dispatch` does.
pub type Out = Vec<(PortId, Vec<u8>)>;

/// A datapath, one worker and the clock of a test, with whatever else the test keeps about
/// its node (`ext`, reachable through `Deref`: `n.gw_mac` for a `Node<Macs>`).
#[derive(Debug)]
pub struct Node<X = ()> {
    /// The datapath under test.
    pub dp: Datapath,
    /// Its worker.
    pub w: Worker,
    /// The test's clock: frames are processed at this instant.
    pub now: Instant,
    /// What the test keeps beside it.
    pub ext: X,
}

impl Node {
    /// `dp` with a worker, at 1 s.
    pub fn new(dp: Datapath) -> Node {
        Node::with(dp, ())
    }
}

impl<X> Node<X> {
    /// `dp` with a worker and `ext`, at 1 s.
    pub fn with(dp: Datapath, ext: X) -> Node<X> {
        let w = dp.worker();
        Node {
            dp,
            w,
            now: Instant::from_secs(1),
            ext,
        }
    }

    /// Processes one frame received on `port` at [`Node::now`]: its verdict and every frame
    /// sent.
    pub fn send(&mut self, port: PortId, frame: &[u8]) -> (Verdict, Out) {
        send_one(&self.dp, &mut self.w, self.now, port, frame)
    }

    /// Advances the clock by `d` and runs the timers: every frame sent.
    pub fn tick(&mut self, d: Duration) -> Out {
        self.now = self.now + d;
        let mut batch = Batch::new();
        self.dp.poll(&mut self.w, self.now, &mut batch);
        let out = collect(&self.dp, &mut self.w, &batch);
        batch.recycle(&mut self.w.pool);
        out
    }

    /// Station `mac` announces itself on `port` ([`announce_frame`]), so that its bridge
    /// learns where it is.
    pub fn announce(&mut self, port: PortId, mac: MacAddr) {
        self.send(port, &announce_frame(mac));
    }
}

impl<X> std::ops::Deref for Node<X> {
    type Target = X;
    fn deref(&self) -> &X {
        &self.ext
    }
}

impl<X> std::ops::DerefMut for Node<X> {
    fn deref_mut(&mut self) -> &mut X {
        &mut self.ext
    }
}

/// [`Node::send`], as a function.
pub fn send<X>(n: &mut Node<X>, port: PortId, frame: &[u8]) -> (Verdict, Out) {
    n.send(port, frame)
}

/// [`Node::tick`], as a function.
pub fn tick<X>(n: &mut Node<X>, d: Duration) -> Out {
    n.tick(d)
}

/// Every frame `batch` sends, as `dispatch` expands them.
fn collect(dp: &Datapath, w: &mut Worker, batch: &Batch) -> Out {
    let mut out = Vec::new();
    dp.dispatch(w, batch, |p, b| {
        out.push((p, b.frame().to_vec()));
        Ok(())
    });
    out
}

/// Processes one frame received on `port` through `dp` at `now`: its verdict and every frame
/// sent.
pub fn send_one(
    dp: &Datapath,
    w: &mut Worker,
    now: Instant,
    port: PortId,
    frame: &[u8],
) -> (Verdict, Out) {
    let mut batch = Batch::new();
    let mut b = PacketBuf::from_frame(frame);
    b.port = port;
    batch.push(b).expect("an empty batch has room");
    dp.process(w, now, &mut batch);
    let v = batch.verdicts()[0];
    let out = collect(dp, w, &batch);
    batch.recycle(&mut w.pool);
    (v, out)
}

/// The one frame sent, on its port; panics unless exactly one was.
pub fn one(out: &[(PortId, Vec<u8>)]) -> (PortId, &[u8]) {
    assert_eq!(out.len(), 1, "{out:?}");
    (out[0].0, &out[0].1)
}

/// The frame a station sends so that a bridge learns its port: broadcast from `mac`,
/// EtherType 0x88b5 (local experimental), 60 bytes.
pub fn announce_frame(mac: MacAddr) -> Vec<u8> {
    crate::frame::eth(MacAddr::BROADCAST, mac, 0x88b5, &[])
}

/// A static route to `dst/len` (`dst` parsed: `"10.244.2.0"`, `"fd00::"`), metric 0.
pub fn route<A>(dst: &str, len: u8, next_hop: NextHop<A>) -> Route<A>
where
    A: std::str::FromStr,
    A::Err: std::fmt::Debug,
{
    Route {
        prefix: dst.parse().expect("a prefix"),
        len,
        next_hop,
        metric: 0,
        proto: RouteProto::Static,
        src: None,
    }
}

/// The ports of a test driven through a runtime: `(datapath port, its driver)`.
pub type Drivers = Vec<(PortId, Arc<dyn Port>)>;

/// A datapath with one bridge, `br0`, and `n` in-memory ports on it (`p0`, `p1`, ...; each
/// queue holds `queue` frames): the datapath, the drivers for a runtime, and the far ends
/// (`h0`, `h1`, ...) the test sends and receives on.
pub fn mem_bridge(n: usize, queue: usize) -> (Arc<Datapath>, Drivers, Vec<MemPort>) {
    let mut b = Datapath::builder();
    let br = b.add_bridge(BridgeConfig::new("br0")).expect("a bridge");
    let mut ports: Drivers = Vec::new();
    let mut hosts = Vec::new();
    for i in 0..n {
        let id = b.add_port(format!("p{i}"), Some(br)).expect("a port");
        let (a, h) = mem_pair(&format!("p{i}"), &format!("h{i}"), queue);
        ports.push((id, Arc::new(a)));
        hosts.push(h);
    }
    (Arc::new(b.build()), ports, hosts)
}
