//! Layer 2: the learning bridge's forwarding database.

pub mod fdb;
