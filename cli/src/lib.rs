//! `tapyard`: a Kubernetes node's dataplane on TAP devices, from one config file.
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
