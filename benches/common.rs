#![allow(
    clippy::cast_possible_truncation,
    reason = "bench fixtures: small loop counters and random draws narrowed into addresses, ports and ids"
)]
// Shared by the benches: a plain `Mutex<HashMap>` learning bridge (the baseline) and frame
// generators. Not a bench target itself.
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::Mutex;

use tapyard::wire::EthMeta;
use tapyard::{Instant, MacAddr, PortId};

/// The textbook learning bridge: one lock around a HashMap of MAC -> (port, last seen).
pub struct MutexBridge {
    pub table: Mutex<HashMap<MacAddr, (PortId, Instant)>>,
    pub ports: Vec<PortId>,
}

pub enum Out {
    One(PortId),
    Flood,
    Drop,
}

impl MutexBridge {
    pub fn new(ports: usize) -> MutexBridge {
        MutexBridge {
            table: Mutex::new(HashMap::new()),
            ports: (0..ports as u16).map(PortId).collect(),
        }
    }

    #[inline]
    pub fn decide(&self, frame: &[u8], in_port: PortId, now: Instant) -> Out {
        let Ok(m) = EthMeta::parse(frame) else {
            return Out::Drop;
        };
        if !m.src.is_station() {
            return Out::Drop;
        }
        let mut t = self.table.lock().unwrap();
        t.insert(m.src, (in_port, now));
        if m.dst.is_multicast() {
            return Out::Flood;
        }
        match t.get(&m.dst) {
            Some((p, seen)) if now - *seen < std::time::Duration::from_secs(300) => {
                if *p == in_port {
                    Out::Drop
                } else {
                    Out::One(*p)
                }
            }
            _ => Out::Flood,
        }
    }
}

pub fn frame(dst: MacAddr, src: MacAddr) -> Vec<u8> {
    let mut f = Vec::with_capacity(64);
    f.extend_from_slice(&dst.0);
    f.extend_from_slice(&src.0);
    f.extend_from_slice(&[0x08, 0x00]);
    f.resize(64, 0);
    f
}

/// A deterministic xorshift generator.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Station `i` lives on port `i % ports`.
pub fn mac_of(i: u32) -> MacAddr {
    MacAddr::local(i.wrapping_mul(0x9e37_79b9) | 1)
}
