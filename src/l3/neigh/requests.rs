//! What the table asks of its caller: ARP requests, rate-limited over the whole table by a
//! token bucket, and the frames waiting for resolution, in a bounded queue per neighbour
//! until they are released to be sent, handed out as unreachable, pushed out or discarded.
//!
//! Every function here runs with the table's writer lock held.

use crate::base::IfaceId;
use std::collections::VecDeque;

use super::slots::{slot_key, split_key};
use super::{NeighAddr, NeighTable, Released, Writer};
use crate::wire::mac::MacAddr;

/// Frames waiting for one neighbour.
#[derive(Default)]
pub(super) struct Queue {
    pub(super) frames: VecDeque<Vec<u8>>,
    pub(super) bytes: usize,
}

/// One token, in micro-tokens (refills need no division).
const TOKEN: u64 = 1_000_000;

/// Table-wide token bucket, in micro-tokens so refills need no division.
pub(super) struct TokenBucket {
    tokens: u64,
    cap: u64,
    rate: u64,
    last: u64,
}

impl TokenBucket {
    /// A full bucket of `burst` tokens refilled with `rate` tokens per second.
    pub(super) fn new(rate: u32, burst: u32) -> TokenBucket {
        TokenBucket {
            tokens: u64::from(burst) * TOKEN,
            cap: u64::from(burst) * TOKEN,
            rate: u64::from(rate),
            last: 0,
        }
    }

    /// Takes a token at `now` (µs) if there is one.
    fn take(&mut self, now: u64) -> bool {
        if now > self.last {
            let add = (now - self.last).saturating_mul(self.rate);
            self.tokens = self.tokens.saturating_add(add).min(self.cap);
            self.last = now;
        }
        if self.tokens >= TOKEN {
            self.tokens -= TOKEN;
            true
        } else {
            false
        }
    }
}

impl Writer {
    /// Removes the queue of the entry in `idx`, its frames no longer counted as waiting.
    pub(super) fn take_queue(&mut self, idx: usize) -> Option<VecDeque<Vec<u8>>> {
        let q = self.queues.remove(&slot_key(idx))?;
        self.queued_now -= q.frames.len();
        Some(q.frames)
    }

    /// Appends `frame` to the queue of the entry in `idx`, pushing out the oldest frames
    /// until it fits `qlen` frames and `qbytes` bytes; returns those, oldest first.
    pub(super) fn push_frame(
        &mut self,
        idx: usize,
        frame: &[u8],
        qlen: usize,
        qbytes: usize,
    ) -> Vec<Vec<u8>> {
        let q = self.queues.entry(slot_key(idx)).or_default();
        let mut dropped = Vec::new();
        while q.frames.len() >= qlen || q.bytes + frame.len() > qbytes {
            let Some(old) = q.frames.pop_front() else {
                break;
            };
            q.bytes -= old.len();
            dropped.push(old);
        }
        q.bytes += frame.len();
        q.frames.push_back(frame.to_vec());
        self.queued_now = self.queued_now + 1 - dropped.len();
        self.c.queued += 1;
        self.c.queue_overflow += dropped.len() as u64;
        dropped
    }
}

impl<A: NeighAddr> NeighTable<A> {
    /// Asks for one request (counts it as a solicitation either way); false if rate-limited.
    pub(super) fn solicit(&self, w: &mut Writer, idx: usize, now: u64) -> bool {
        w.meta[idx].probes += 1;
        if w.bucket.take(now) {
            w.c.requests += 1;
            true
        } else {
            w.c.rate_limited += 1;
            false
        }
    }

    /// Moves the frames waiting for the entry in `idx` to `out`, to be sent to `mac`, oldest
    /// first (counted as released). Returns how many.
    pub(super) fn release(
        &self,
        w: &mut Writer,
        idx: usize,
        mac: MacAddr,
        out: &mut Vec<Released>,
    ) -> usize {
        let Some(frames) = w.take_queue(idx) else {
            return 0;
        };
        let (iface, ip) = split_key(self.slot_key(idx));
        let n = frames.len();
        w.c.released += n as u64;
        out.extend(frames.into_iter().map(|frame| Released {
            iface: IfaceId(iface),
            ip,
            mac,
            frame,
        }));
        n
    }
}
