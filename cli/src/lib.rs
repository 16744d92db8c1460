//! `tapyard`: a Kubernetes node's dataplane on TAP devices, from one config file. This crate
//! is the daemon as a library; `src/main.rs` parses the command line ([`args`]) and calls it.
//!
//! ```text
//! tapyard check <config>                       validate, touching nothing (exit 1 if invalid)
//! tapyard run <config> [--socket PATH] [--metrics ADDR:PORT] [--takeover]
//!                                              run the node in the foreground until SIGINT/SIGTERM;
//!                                              SIGHUP reloads the config; --metrics serves
//!                                              Prometheus text at http://ADDR:PORT/metrics;
//!                                              --takeover takes the TAPs and the control socket
//!                                              from the running node, which exits 0 ([`takeover`])
//! tapyard status [--json]                      the running node's name, config, ports, interfaces
//! tapyard show fdb|neigh|routes|conntrack|services|stats [--json]
//! tapyard capture <port> -w <file.pcap> [-c N] write a port's frames (both directions) to pcap
//! tapyard port add <bridge> <name> [--mac MAC] a TAP on a bridge, left in tapyard's namespace
//! tapyard port del <name>                      remove a port added by `port add` or the CNI plugin
//! tapyard show ports [--json]                  every port: kind, bridge, MAC, namespace, counters
//! tapyard reload                               re-read the config of the running node
//! tapyard cleanup <config> [--socket PATH]     delete every TAP of a stopped node and its
//!                                              state directory
//! tapyard keys                                 every config key: default, range, help
//! ```
//!
//! Client commands (`status`, `show`, `capture`, `port`, `reload`) find the control socket with
//! `--socket PATH`, else `--config FILE` (its `node.socket`, default
//! `/run/tapyard/<node name>.sock`), else the only socket in `/run/tapyard`. `tapyard --help`
//! and `tapyard COMMAND --help` describe each option ([`args`]). Logs go to stderr through
//! env_logger; `RUST_LOG=debug|info|warn|error` (or per module, `tapyard=debug`) sets the level
//! (default info).
//!
//! The modules, lowest layer first (each uses only those above it in this list;
//! `tests/datapath/layers.rs` checks it):
//!
//! - [`args`], [`failpoint`], [`capture`]: the command line; test failure points; the
//!   capture queue of a port and its record format.
//! - [`config`]: the config file read, checked and summarised (`config::schema`, `parse`,
//!   `validate`, `values`), and the difference of two configs a reload applies (`config::diff`).
//! - [`state`]: what outlives the process: the port record, namespaces, derived MACs, and the
//!   state directory's safety checks (`state::secure`).
//! - [`ports`]: the port registry and its entries; TAP devices re-attached or deleted where
//!   they live (`ports::tap`); the datapath and runtime calls of a live port (`ports::live`).
//! - [`node`]: a running node: the datapath built from the config (`node::plan`), the config
//!   in the library's types (`node::translate`), ports added and removed while it runs
//!   (`node::live_ports`), reloads (`node::reload`).
//! - [`control`]: the control socket: its server (`control::server`), requests, `show`
//!   tables, and the client side (`control::client`).
//! - [`metrics`], [`takeover`]: Prometheus text over HTTP; `run --takeover` (the protocol in
//!   `takeover::wire`, the running side in `takeover::old`, the new one in `takeover::new`).
//! - [`supervisor`]: `tapyard run`: the node, its servers and its main loop.
//! - [`commands`]: every other command (`check`, `cleanup`, and the control socket's clients).
//!
//! Errors are enums whose `source()` is the underlying error (the library's, the system's)
//! and whose message names the field, value, device or path: [`config::values::BadValue`],
//! [`ports::PortError`], [`node::NodeError`], [`takeover::TakeoverError`],
//! [`supervisor::RunError`].

#![warn(missing_docs)]

pub mod args;
pub mod capture;
pub mod commands;
pub mod config;
pub mod control;
pub mod failpoint;
pub mod metrics;
pub mod node;
pub mod ports;
pub mod state;
pub mod supervisor;
pub mod takeover;
