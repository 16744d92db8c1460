//! The table's parameters ([`NeighConfig`], with Linux's defaults) and the module's errors.

use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use crate::wire::mac::MacAddr;

/// Largest accepted `gc_thresh3` (slot indices and the marked bitmap stay small).
pub const MAX_ENTRIES: usize = 1 << 20;

/// The table's parameters, with Linux's defaults (`/proc/sys/net/ipv4/neigh/default/*`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NeighConfig {
    /// Base of the reachable time; each confirmation draws one in [0.5, 1.5) × this. 30 s.
    pub base_reachable_time: Duration,
    /// Time between requests for one neighbour. 1 s.
    pub retrans_time: Duration,
    /// How long a used `STALE` entry waits in `DELAY` before probing. 5 s.
    pub delay_first_probe_time: Duration,
    /// Broadcast requests before an `INCOMPLETE` entry fails (at least 1). 3.
    pub mcast_solicit: u32,
    /// Unicast requests before a `PROBE` entry fails. 3.
    pub ucast_solicit: u32,
    /// A `STALE` entry unused this long may be collected. 60 s.
    pub gc_stale_time: Duration,
    /// Within this time of an entry's last change, ARP (other than gratuitous) cannot change
    /// its MAC. 1 s.
    pub locktime: Duration,
    /// Frames queued per unresolved neighbour (Linux's `unres_qlen`). 101.
    pub unres_qlen: usize,
    /// Bytes queued per unresolved neighbour (Linux's `unres_qlen_bytes`). 212 992.
    pub unres_qlen_bytes: usize,
    /// Below this many entries nothing is garbage collected. 128.
    pub gc_thresh1: usize,
    /// Creating an entry at or above this many collects `FAILED` and idle `STALE` ones. 512.
    pub gc_thresh2: usize,
    /// Hard limit on entries (static ones included), at most [`MAX_ENTRIES`]. 1024.
    pub gc_thresh3: usize,
    /// Create entries from gratuitous ARP for addresses not in the table (Linux's
    /// `arp_accept` for gratuitous ARP). `true`.
    pub accept_gratuitous: bool,
    /// Requests per second the table asks its caller to send, over all neighbours. 100.
    pub request_rate: u32,
    /// Token-bucket depth of that limit. 50.
    pub request_burst: u32,
    /// Seed of the generator that draws reachable times.
    pub seed: u64,
}

impl Default for NeighConfig {
    fn default() -> Self {
        NeighConfig {
            base_reachable_time: Duration::from_secs(30),
            retrans_time: Duration::from_secs(1),
            delay_first_probe_time: Duration::from_secs(5),
            mcast_solicit: 3,
            ucast_solicit: 3,
            gc_stale_time: Duration::from_secs(60),
            locktime: Duration::from_secs(1),
            unres_qlen: 101,
            unres_qlen_bytes: 212_992,
            gc_thresh1: 128,
            gc_thresh2: 512,
            gc_thresh3: 1024,
            accept_gratuitous: true,
            request_rate: 100,
            request_burst: 50,
            seed: 0x6e65_6967_6862_6f72,
        }
    }
}

impl NeighConfig {
    /// Checks every field; the error names the first bad one and its value.
    pub fn validate(&self) -> Result<(), NeighError> {
        fn bad(field: &'static str, value: impl fmt::Debug, reason: &'static str) -> NeighError {
            NeighError::Config {
                field,
                value: format!("{value:?}"),
                reason,
            }
        }
        let positive = [
            ("base_reachable_time", self.base_reachable_time),
            ("retrans_time", self.retrans_time),
            ("gc_stale_time", self.gc_stale_time),
        ];
        for (field, d) in positive {
            if d.is_zero() {
                return Err(bad(field, d, "must be positive"));
            }
        }
        if self.mcast_solicit == 0 {
            return Err(bad("mcast_solicit", 0, "must be at least 1"));
        }
        if self.unres_qlen == 0 {
            return Err(bad("unres_qlen", 0, "must be at least 1"));
        }
        if self.unres_qlen_bytes == 0 {
            return Err(bad("unres_qlen_bytes", 0, "must be at least 1"));
        }
        if self.gc_thresh3 == 0 || self.gc_thresh3 > MAX_ENTRIES {
            return Err(bad(
                "gc_thresh3",
                self.gc_thresh3,
                "must be between 1 and MAX_ENTRIES",
            ));
        }
        if self.gc_thresh2 > self.gc_thresh3 {
            return Err(bad(
                "gc_thresh2",
                self.gc_thresh2,
                "must not exceed gc_thresh3",
            ));
        }
        if self.gc_thresh1 > self.gc_thresh2 {
            return Err(bad(
                "gc_thresh1",
                self.gc_thresh1,
                "must not exceed gc_thresh2",
            ));
        }
        if self.request_rate == 0 {
            return Err(bad("request_rate", 0, "must be at least 1"));
        }
        if self.request_burst == 0 {
            return Err(bad("request_burst", 0, "must be at least 1"));
        }
        Ok(())
    }
}

/// Errors of this module.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NeighError {
    /// A configuration field has a value the table cannot work with.
    Config {
        /// The field's name, as in [`NeighConfig`].
        field: &'static str,
        /// The value given.
        value: String,
        /// What it must be.
        reason: &'static str,
    },
    /// The table is at its limit and nothing could be collected.
    TableFull,
    /// Not a neighbour address (unspecified, broadcast or multicast; IPv6: unspecified,
    /// multicast or loopback).
    BadAddress(IpAddr),
    /// Not a station MAC (zero or group address).
    BadMac(MacAddr),
}

impl fmt::Display for NeighError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NeighError::Config {
                field,
                value,
                reason,
            } => write!(f, "invalid neighbour config: {field} = {value}: {reason}"),
            NeighError::TableFull => {
                f.write_str("neighbour table full and nothing could be collected")
            }
            NeighError::BadAddress(ip) => write!(f, "{ip} is not a neighbour address"),
            NeighError::BadMac(m) => write!(f, "{m} is not a station MAC address"),
        }
    }
}

impl std::error::Error for NeighError {}
