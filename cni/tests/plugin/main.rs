//! The `tapyard-cni` plugin's tests, in one binary: the plugin driven as a runtime drives it
//! (`cni`) and its ADD/DEL latency (`latency`, a measurement, ignored by default). The tests
//! that create namespaces and TAPs are ignored unless built as root (see `common`).

#[path = "../common/mod.rs"]
mod common;

mod cni;
mod latency;
