//! The router's own TCP endpoint: the hand-off of TCP segments to a few ports of the router's
//! own addresses (kube-proxy's health checks: `healthCheckNodePort`s and `/healthz`) to a
//! real TCP stack outside the datapath.
//!
//! The router has no sockets: a TCP segment to one of its addresses is answered with a reset
//! (as Linux's `tcp_v4_send_reset` with no listener). For the ports registered here
//! ([`LocalStack::set_ports`]) the router instead copies the segment (its IP datagram, the
//! interface it came in on and its sender's MAC) into a bounded queue, [`LocalInbox`], and
//! counts it consumed; a thread at the edge ([`crate::runtime::local`]) takes it from there,
//! runs it through an embedded smoltcp stack and sends the stack's answers back the way the
//! segment came. The hand-off is on the router's cold path (segments to its own addresses);
//! a full queue, or no free buffer, drops the segment (`DropReason::LocalStackFull`): TCP
//! retransmits, and a SYN flood to a health port costs the workers a bounded copy each, never
//! a wait.
//!
//! Memory is bounded: at most [`MAX_SEGMENTS`] buffers of [`SEGMENT_ROOM`] bytes, allocated
//! on first use and recycled ([`LocalStack::recycle`]), never freed while the router lives.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use crossbeam_channel::{bounded, Receiver, Sender, TrySendError};

use crate::base::IfaceId;
use crate::wire::mac::MacAddr;

/// The most segments waiting for the local stack (and buffers ever allocated for them).
pub const MAX_SEGMENTS: usize = 256;

/// The largest IP datagram handed to the local stack (bigger ones are dropped: a health
/// check's request fits many times over).
pub const SEGMENT_ROOM: usize = 2048;

/// One TCP segment to a registered port of the router's own addresses, as the router took
/// it in: the IP datagram, the interface it came in on, and its sender's MAC (the way back).
#[derive(Debug)]
pub struct Segment {
    ip: Vec<u8>,
    /// The router interface it came in on.
    pub iface: IfaceId,
    /// The MAC it came from (the client's, or its last router's): where the answers go.
    pub peer_mac: MacAddr,
}

impl Segment {
    /// The IP datagram (IPv4 or IPv6, header checked by the router, TCP checksum verified or
    /// a partial one from a sender on this host).
    pub fn ip(&self) -> &[u8] {
        &self.ip
    }
}

/// The queue between the router's workers and the local stack, and the ports it serves.
/// One per router; shared with the NAT hook, which leaves these ports' connections untracked
/// (the stack's answers do not pass through conntrack, so a tracked connection would see only
/// one direction and refuse the handshake's ACK as INVALID).
#[derive(Debug)]
pub struct LocalInbox {
    /// The ports served, sorted (empty: none, every TCP segment to the router is reset).
    ports: ArcSwap<Vec<u16>>,
    full: (Sender<Segment>, Receiver<Segment>),
    free: (Sender<Vec<u8>>, Receiver<Vec<u8>>),
    /// Buffers allocated so far (at most `MAX_SEGMENTS`).
    made: AtomicUsize,
}

impl Default for LocalInbox {
    fn default() -> Self {
        LocalInbox {
            ports: ArcSwap::from_pointee(Vec::new()),
            full: bounded(MAX_SEGMENTS),
            free: bounded(MAX_SEGMENTS),
            made: AtomicUsize::new(0),
        }
    }
}

impl LocalInbox {
    /// Whether TCP port `port` of the router's addresses is served by the local stack. Out of
    /// line: asked only about segments to the router's own addresses.
    #[cold]
    #[inline(never)]
    pub(crate) fn serves(&self, port: u16) -> bool {
        let p = self.ports.load();
        !p.is_empty() && p.binary_search(&port).is_ok()
    }

    /// Copies the datagram `ip` (come in on `iface` from `peer_mac`) into the queue: `false`
    /// when it is full, no buffer is free, or the datagram is too big (dropped, counted by the
    /// caller).
    #[cold]
    #[inline(never)]
    pub(crate) fn hand_off(&self, ip: &[u8], iface: IfaceId, peer_mac: MacAddr) -> bool {
        if ip.len() > SEGMENT_ROOM || self.full.0.is_full() {
            return false;
        }
        let mut buf = match self.free.1.try_recv() {
            Ok(b) => b,
            Err(_) => {
                // A new buffer, while fewer than the most have been made.
                let made = self.made.fetch_add(1, Ordering::Relaxed);
                if made >= MAX_SEGMENTS {
                    self.made.fetch_sub(1, Ordering::Relaxed);
                    return false;
                }
                Vec::with_capacity(SEGMENT_ROOM)
            }
        };
        buf.clear();
        buf.extend_from_slice(ip);
        let seg = Segment {
            ip: buf,
            iface,
            peer_mac,
        };
        match self.full.0.try_send(seg) {
            Ok(()) => true,
            Err(TrySendError::Full(s) | TrySendError::Disconnected(s)) => {
                let _ = self.free.0.try_send(s.ip);
                false
            }
        }
    }
}

/// The consumer's side of a router's [`LocalInbox`]: what the thread running the local stack
/// holds (from [`crate::Control::local_stack`]).
#[derive(Clone, Debug)]
pub struct LocalStack {
    inbox: Arc<LocalInbox>,
}

impl LocalStack {
    pub(crate) fn new(inbox: Arc<LocalInbox>) -> LocalStack {
        LocalStack { inbox }
    }

    /// Serves the TCP `ports` of the router's own addresses from now on (replacing the
    /// previous set; empty: none). Segments to other ports are reset by the router.
    pub fn set_ports(&self, ports: &[u16]) {
        let mut v = ports.to_vec();
        v.sort_unstable();
        v.dedup();
        self.inbox.ports.store(Arc::new(v));
    }

    /// The ports served now, ascending.
    pub fn ports(&self) -> Vec<u16> {
        self.inbox.ports.load().to_vec()
    }

    /// The next segment, waiting at most `timeout` for one.
    pub fn recv_timeout(&self, timeout: Duration) -> Option<Segment> {
        self.inbox.full.1.recv_timeout(timeout).ok()
    }

    /// The next segment, if one waits.
    pub fn try_recv(&self) -> Option<Segment> {
        self.inbox.full.1.try_recv().ok()
    }

    /// Gives a segment's buffer back for the next hand-off.
    pub fn recycle(&self, seg: Segment) {
        let _ = self.inbox.free.0.try_send(seg.ip);
    }

    /// Whether `port` is served (as the router asks).
    pub fn serves(&self, port: u16) -> bool {
        self.inbox.serves(port)
    }
}
