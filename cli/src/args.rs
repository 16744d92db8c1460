//! The command line, declared with clap's derive: each subcommand with its own `--help`, and
//! `--version`. A bad argument is one line on stderr and exit status 2.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// `tapyard`: a Kubernetes node's dataplane on TAP devices, from one config file.
#[derive(Debug, Parser)]
#[command(
    name = "tapyard",
    version,
    arg_required_else_help = true,
    after_help = "Client commands (status, show, capture, port, reload) find the control socket with \
--socket PATH, else --config FILE (its node.socket, default /run/tapyard/<node name>.sock), else \
the only socket in /run/tapyard. Logs go to stderr; RUST_LOG=debug|info|warn|error sets the \
level (default info)."
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub cmd: Cmd,
}

/// A subcommand.
#[derive(Debug, Subcommand)]
pub enum Cmd {
    /// Validate a config file, touching nothing (exit 1 if it is invalid).
    Check {
        /// The config file.
        config: PathBuf,
    },
    /// Run the node in the foreground until SIGINT/SIGTERM; SIGHUP reloads the config.
    Run {
        /// The config file (checked first: an invalid one exits 2).
        config: PathBuf,
        /// The control socket (default: the config's node.socket).
        #[arg(long, short = 's', value_name = "PATH")]
        socket: Option<PathBuf>,
        /// Serve Prometheus text at http://ADDR:PORT/metrics.
        #[arg(long, value_name = "ADDR:PORT")]
        metrics: Option<String>,
        /// Take the TAPs and the control socket over from the tapyard running this node
        /// (found by its state_dir's takeover.sock), which then exits 0: an upgrade without
        /// a gap. Fails if none runs.
        #[arg(long)]
        takeover: bool,
    },
    /// The running node's name, config, interfaces and ports.
    Status {
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Where the running node is.
        #[command(flatten)]
        client: Client,
    },
    /// A table of the running node.
    Show {
        /// The table.
        what: Table,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Where the running node is.
        #[command(flatten)]
        client: Client,
    },
    /// Write a port's frames (both directions) to a pcap file, until Ctrl-C or N frames.
    Capture {
        /// The port (a bridge port or an uplink, by name).
        port: String,
        /// The pcap file to write.
        #[arg(long = "write", short = 'w', value_name = "FILE")]
        write: PathBuf,
        /// Stop after N frames (0: until Ctrl-C).
        #[arg(long, short = 'c', value_name = "N")]
        count: Option<u64>,
        /// Where the running node is.
        #[command(flatten)]
        client: Client,
    },
    /// Add or remove a port of the running node (a TAP on a bridge).
    Port {
        /// What to do.
        #[command(subcommand)]
        op: PortOp,
    },
    /// Re-read the config of the running node and apply what changed.
    Reload {
        /// Where the running node is.
        #[command(flatten)]
        client: Client,
    },
    /// Delete what a stopped node left: every TAP it made (from its record in the state
    /// directory, wherever each lives now, and the config's), and the state directory itself
    /// (the port record, the connection table). Refused while a tapyard answers on the
    /// control socket.
    Cleanup {
        /// The node's config file.
        config: PathBuf,
        /// The control socket to check (default: the config's node.socket).
        #[arg(long, short = 's', value_name = "PATH")]
        socket: Option<PathBuf>,
    },
    /// Print every config key with its default or meaning when unset, and its range (the
    /// reference at the end of examples/node.toml).
    Keys,
    /// Print the version.
    #[command(hide = true)]
    Version,
}

/// `tapyard port ...`.
// The doc comments are clap's help text: `[[bridge]]` is the config's section, not a link.
#[allow(rustdoc::broken_intra_doc_links)]
#[derive(Debug, Subcommand)]
pub enum PortOp {
    /// Create a TAP called NAME on BRIDGE; it stays in tapyard's network namespace (move it
    /// with `ip link set NAME netns X`). A reload does not touch it.
    Add {
        /// The bridge (a [[bridge]] of the config).
        bridge: String,
        /// The TAP's name (at most 15 bytes), which no interface of tapyard's namespace has.
        name: String,
        /// The TAP's MAC address (default: derived from the node's and the port's names).
        #[arg(long, value_name = "MAC")]
        mac: Option<String>,
        /// An address the port may send from (repeat it, or separate with commas; at most 4
        /// per family): with the bridge's spoof_guard on (the default), the port is pinned
        /// to these addresses and its MAC.
        #[arg(long, value_name = "IP", value_delimiter = ',')]
        ip: Vec<std::net::IpAddr>,
        /// Where the running node is.
        #[command(flatten)]
        client: Client,
    },
    /// Remove a port added by `port add` or the CNI plugin (NAME as `show ports` lists it);
    /// its TAP is deleted, in whichever namespace it is.
    Del {
        /// The port.
        name: String,
        /// Where the running node is.
        #[command(flatten)]
        client: Client,
    },
}

/// How a client command finds the running node's control socket.
#[derive(Clone, Debug, Default, Args)]
pub struct Client {
    /// The control socket.
    #[arg(long, short = 's', value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// The node's config file (its node.socket).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

/// A table `show` prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Table {
    /// Learned MACs, as `bridge fdb show`.
    Fdb,
    /// The ARP table, as `ip neigh`.
    Neigh,
    /// The routes, as `ip route`.
    Routes,
    /// The connections, as `conntrack -L`.
    Conntrack,
    /// The Services, as `ipvsadm -Ln`.
    Services,
    /// The counters.
    Stats,
    /// The ports: name, kind, bridge, MAC, ifindex, namespace, origin, counters.
    Ports,
    /// The VXLAN interfaces and their peers, with per-peer packet counters.
    Vxlan,
}

impl Table {
    /// Its name on the control socket.
    pub fn name(self) -> &'static str {
        match self {
            Table::Fdb => "fdb",
            Table::Neigh => "neigh",
            Table::Routes => "routes",
            Table::Conntrack => "conntrack",
            Table::Services => "services",
            Table::Stats => "stats",
            Table::Ports => "ports",
            Table::Vxlan => "vxlan",
        }
    }
}

/// What parsing the command line ended in when it did not give a command.
#[derive(Debug, PartialEq, Eq)]
pub enum Stop {
    /// Help or the version was asked for: print this on stdout, exit 0.
    Print(String),
    /// No subcommand: print the help on stderr, exit 2.
    Usage(String),
    /// A bad argument: one line for stderr, exit 2.
    Bad(String),
}

/// Parses `argv` (the program name first).
pub fn parse<I, T>(argv: I) -> Result<Cli, Stop>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    use clap::error::ErrorKind as K;
    Cli::try_parse_from(argv).map_err(|e| match e.kind() {
        K::DisplayHelp | K::DisplayVersion => Stop::Print(e.render().to_string()),
        K::DisplayHelpOnMissingArgumentOrSubcommand => Stop::Usage(e.render().to_string()),
        _ => {
            // clap's first paragraph (the error and, for missing arguments, their names),
            // on one line.
            let text = e.render().to_string();
            let first: Vec<&str> = text
                .lines()
                .take_while(|l| !l.trim().is_empty())
                .map(str::trim)
                .collect();
            let first = first.join(" ");
            let first = first.strip_prefix("error: ").unwrap_or(&first);
            Stop::Bad(format!("{first} (see `tapyard --help`)"))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> Result<Cli, Stop> {
        parse(std::iter::once("tapyard").chain(s.split_whitespace()))
    }

    #[test]
    fn command_lines() {
        let Cmd::Capture {
            port,
            write,
            count,
            client,
        } = args("capture pod-a -w /tmp/x.pcap -c 5 --socket=/tmp/s")
            .unwrap()
            .cmd
        else {
            panic!("not capture")
        };
        assert_eq!(port, "pod-a");
        assert_eq!(count, Some(5));
        assert_eq!(client.socket, Some(PathBuf::from("/tmp/s")));
        assert_eq!(write, PathBuf::from("/tmp/x.pcap"));
        assert!(matches!(
            args("show fdb --json").unwrap().cmd,
            Cmd::Show {
                what: Table::Fdb,
                json: true,
                ..
            }
        ));
        for bad in [
            "show --bogus",
            "capture p -c x",
            "run --socket",
            "show nothing",
            "frobnicate",
            "check",
        ] {
            match args(bad) {
                Err(Stop::Bad(line)) => assert!(!line.contains('\n'), "{bad}: {line}"),
                other => panic!("{bad}: {other:?}"),
            }
        }
        assert!(matches!(args(""), Err(Stop::Usage(_))));
        assert!(matches!(args("--version"), Err(Stop::Print(v)) if v.contains("tapyard 0.")));
        assert!(matches!(args("show --help"), Err(Stop::Print(h)) if h.contains("conntrack")));
        assert!(matches!(
            args("port add cni0 pod-c --mac 02:00:00:00:00:0c").unwrap().cmd,
            Cmd::Port { op: PortOp::Add { bridge, name, mac: Some(_), .. } } if bridge == "cni0" && name == "pod-c"
        ));
        assert!(matches!(
            args("port add cni0 pod-c --ip 10.244.1.9,fd00::9 --ip 10.244.1.10").unwrap().cmd,
            Cmd::Port { op: PortOp::Add { ip, .. } } if ip.len() == 3
        ));
        assert!(matches!(
            args("port add cni0 pod-c --ip 10.244.1.x"),
            Err(Stop::Bad(_))
        ));
        assert!(matches!(
            args("port del pod-c -s /tmp/s").unwrap().cmd,
            Cmd::Port { op: PortOp::Del { name, .. } } if name == "pod-c"
        ));
        assert!(matches!(
            args("show ports --json").unwrap().cmd,
            Cmd::Show {
                what: Table::Ports,
                json: true,
                ..
            }
        ));
        assert!(matches!(args("port add --help"), Err(Stop::Print(h)) if h.contains("--mac")));
        assert!(matches!(args("port add cni0"), Err(Stop::Bad(_))));
        assert!(matches!(
            args("cleanup /etc/tapyard/node.toml").unwrap().cmd,
            Cmd::Cleanup { config, socket: None } if config == std::path::Path::new("/etc/tapyard/node.toml")
        ));
        assert!(matches!(args("cleanup"), Err(Stop::Bad(_))));
    }
}
