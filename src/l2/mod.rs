//! Layer 2: the learning bridge's forwarding database.

pub mod fdb;

pub use fdb::{Fdb, FdbCounters, FdbEntry};
