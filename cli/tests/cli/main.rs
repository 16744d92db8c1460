//! The `tapyard` command without privileges, in one binary: `tapyard check` on broken
//! configs and the command line itself. `cargo test -p tapyard-cli --test cli check::` runs
//! one module.

#[path = "../common/mod.rs"]
mod common;

mod check;
mod usage;
