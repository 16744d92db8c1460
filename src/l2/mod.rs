//! Layer 2: the learning bridge's forwarding database.
//!
//! One [`Fdb`] per bridge maps MAC addresses to ports: learned from source addresses, aged
//! out after a silence, bounded with an eviction rule, read without locks by every worker.
//! The datapath owns one per bridge ([`crate::Bridge::fdb`]); it can also be used on its own.
//!
//! ```
//! use std::time::Duration;
//! use tapyard::l2::Fdb;
//! use tapyard::{Instant, MacAddr, PortId};
//!
//! let fdb = Fdb::new(8192, Duration::from_secs(300));
//! let pod_a = MacAddr([2, 0, 0, 0, 1, 2]);
//! fdb.learn(pod_a, PortId(1), Instant::from_secs(1));
//! assert_eq!(fdb.lookup(pod_a, Instant::from_secs(2)), Some(PortId(1)));
//! // Silent for longer than the aging time: forgotten.
//! assert_eq!(fdb.lookup(pod_a, Instant::from_secs(302)), None);
//! ```

pub mod fdb;
pub mod guard;

pub use fdb::{Fdb, FdbCounters, FdbEntry};
