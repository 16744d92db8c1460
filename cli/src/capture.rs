//! Packet capture on a running node: every TAP is wrapped in the library's
//! [`Observed`](tapyard::port::Observed) middleware with a [`CaptureTap`] as its observer,
//! which, while a capture is active on it, copies the frames the port receives and sends into a
//! bounded channel. The check is one relaxed atomic load per received batch and
//! per sent frame; a full channel drops the copy (counted), never the frame.
//!
//! On the control socket, a capture streams binary records after its JSON reply line:
//! `kind: u8` (0 received, 1 sent, 2 end), `micros since the Unix epoch: u64 LE`,
//! `len: u32 LE`, then `len` bytes of frame. The end record carries the copies dropped in its
//! time field. The `capture` command writes them to a pcap file.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use crossbeam_channel::{Receiver, Sender};
use tapyard::port::{Direction, Observer};
use tapyard::PacketBuf;

/// Copies queued per capture before new ones are dropped.
pub const CAPTURE_QUEUE: usize = 4096;

/// A record's kind: a frame the port received.
pub const KIND_RX: u8 = 0;
/// A record's kind: a frame sent out of the port.
pub const KIND_TX: u8 = 1;
/// A record's kind: the end of the capture.
pub const KIND_END: u8 = 2;
/// Bytes of a record header.
pub const RECORD_HEADER: usize = 13;

/// One captured frame.
#[derive(Debug)]
pub struct Captured {
    /// [`KIND_RX`] or [`KIND_TX`].
    pub kind: u8,
    /// Microseconds since the Unix epoch.
    pub micros: u64,
    /// The frame.
    pub data: Vec<u8>,
}

impl Captured {
    /// The wire record.
    pub fn encode(&self, out: &mut Vec<u8>) {
        encode(out, self.kind, self.micros, &self.data);
    }
}

/// A frame's length as the 32-bit field of a record (and of a pcap packet header).
#[allow(
    clippy::cast_possible_truncation,
    reason = "frames come from ports, whose buffers are at most 64 KiB: far below 4 GiB"
)]
pub fn frame_len32(len: usize) -> u32 {
    len as u32
}

/// Appends one record.
pub fn encode(out: &mut Vec<u8>, kind: u8, micros: u64, data: &[u8]) {
    out.push(kind);
    out.extend_from_slice(&micros.to_le_bytes());
    out.extend_from_slice(&frame_len32(data.len()).to_le_bytes());
    out.extend_from_slice(data);
}

/// Splits the first complete record off `buf`: (kind, micros, frame).
pub fn decode(buf: &[u8]) -> Option<(u8, u64, &[u8], usize)> {
    if buf.len() < RECORD_HEADER {
        return None;
    }
    let kind = buf[0];
    let micros = u64::from_le_bytes(buf[1..9].try_into().ok()?);
    let len = u32::from_le_bytes(buf[9..13].try_into().ok()?) as usize;
    let end = RECORD_HEADER.checked_add(len)?;
    (buf.len() >= end).then(|| (kind, micros, &buf[RECORD_HEADER..end], end))
}

/// The capture state of one port.
#[derive(Debug, Default)]
pub struct CaptureTap {
    active: AtomicBool,
    tx: Mutex<Option<Sender<Captured>>>,
    dropped: AtomicU64,
}

impl CaptureTap {
    /// Starts a capture; `None` if one is running on this port already.
    pub fn start(&self) -> Option<Receiver<Captured>> {
        let mut tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        if tx.is_some() {
            return None;
        }
        let (s, r) = crossbeam_channel::bounded(CAPTURE_QUEUE);
        *tx = Some(s);
        self.dropped.store(0, Ordering::Relaxed);
        self.active.store(true, Ordering::Release);
        Some(r)
    }

    /// Stops the capture; returns the copies dropped because the queue was full.
    pub fn stop(&self) -> u64 {
        self.active.store(false, Ordering::Release);
        *self.tx.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.dropped.load(Ordering::Relaxed)
    }

    fn copy<'a>(&self, kind: u8, frames: impl Iterator<Item = &'a [u8]>) {
        let guard = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        let Some(tx) = guard.as_ref() else { return };
        let micros = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            // Saturates in some 580,000 years.
            .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX));
        for f in frames {
            let c = Captured {
                kind,
                micros,
                data: f.to_vec(),
            };
            if tx.try_send(c).is_err() {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

impl Observer for CaptureTap {
    fn wants(&self) -> bool {
        self.active.load(Ordering::Relaxed)
    }

    fn observe(&self, dir: Direction, frames: &[PacketBuf]) {
        let kind = match dir {
            Direction::Rx => KIND_RX,
            Direction::Tx => KIND_TX,
        };
        self.copy(kind, frames.iter().map(PacketBuf::frame));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use tapyard::port::{mem_pair, Observed, Port};
    use tapyard::{Batch, BufPool};

    #[test]
    fn copies_only_while_active_and_records_round_trip() {
        let (a, b) = mem_pair("a", "b", 16);
        let tap = Arc::new(CaptureTap::default());
        let port = Observed::new(a, tap.clone());
        let frame = [0xffu8; 60];
        port.send(&PacketBuf::from_frame(&frame)).unwrap();
        let rx = tap.start().unwrap();
        assert!(tap.start().is_none(), "one capture per port");
        port.send(&PacketBuf::from_frame(&frame)).unwrap();
        b.send(&PacketBuf::from_frame(&[1u8; 64])).unwrap();
        let mut pool = BufPool::default();
        let mut batch = Batch::new();
        assert_eq!(port.recv_batch(&mut pool, &mut batch).unwrap(), 1);
        let got: Vec<Captured> = rx.try_iter().collect();
        assert_eq!(got.len(), 2);
        assert_eq!((got[0].kind, got[0].data.len()), (KIND_TX, 60));
        assert_eq!((got[1].kind, got[1].data.len()), (KIND_RX, 64));
        assert_eq!(tap.stop(), 0);
        port.send(&PacketBuf::from_frame(&frame)).unwrap();
        assert!(rx.try_recv().is_err());
        let mut wire = Vec::new();
        got[1].encode(&mut wire);
        encode(&mut wire, KIND_END, 3, &[]);
        let (k, _, f, used) = decode(&wire).unwrap();
        assert_eq!((k, f.len()), (KIND_RX, 64));
        let (k, m, f, _) = decode(&wire[used..]).unwrap();
        assert_eq!((k, m, f.len()), (KIND_END, 3, 0));
        assert!(decode(&wire[..5]).is_none());
    }
}
