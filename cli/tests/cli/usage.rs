//! The command line: `--help` for the command and each subcommand, `--version`, and bad
//! arguments as one line with exit status 2. Runs the built binary.

use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_tapyard");

fn tapyard(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn help_lists_every_command() {
    let o = tapyard(&["--help"]);
    assert!(o.status.success());
    let out = stdout(&o);
    for cmd in ["check", "run", "status", "show", "capture", "reload"] {
        assert!(out.contains(&format!("  {cmd}")), "{cmd} missing:\n{out}");
    }
    assert!(out.contains("--version"), "{out}");
}

#[test]
fn run_help_names_its_options() {
    let o = tapyard(&["run", "--help"]);
    assert!(o.status.success());
    let out = stdout(&o);
    assert!(out.contains("Usage: tapyard run"), "{out}");
    assert!(out.contains("--socket <PATH>"), "{out}");
    assert!(out.contains("--metrics <ADDR:PORT>"), "{out}");
}

#[test]
fn show_help_names_its_tables() {
    let o = tapyard(&["show", "--help"]);
    assert!(o.status.success());
    let out = stdout(&o);
    for t in [
        "fdb",
        "neigh",
        "routes",
        "conntrack",
        "services",
        "stats",
        "--json",
    ] {
        assert!(out.contains(t), "{t} missing:\n{out}");
    }
    assert!(out.contains("--config <FILE>"), "{out}");
}

#[test]
fn version_prints_the_crate_version() {
    let o = tapyard(&["--version"]);
    assert!(o.status.success());
    assert_eq!(
        stdout(&o).trim(),
        format!("tapyard {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn bad_arguments_are_one_line_and_exit_2() {
    for args in [
        &["frobnicate"][..],
        &["check"],
        &["show", "nothing"],
        &["capture", "pod-a"],
        &["capture", "pod-a", "-w", "x.pcap", "-c", "many"],
        &["run", "x.toml", "--bogus"],
    ] {
        let o = tapyard(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.starts_with("tapyard: "), "{args:?}: {err}");
    }
    let o = tapyard(&[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("Usage: tapyard"));
}

#[test]
fn keys_prints_the_reference_that_ends_the_example() {
    let o = tapyard(&["keys"]);
    assert!(o.status.success());
    let keys = stdout(&o);
    let example = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/node.toml"
    ))
    .unwrap();
    assert!(example.ends_with(&keys), "{keys}");
    assert!(keys.contains("# [conntrack]"), "{keys}");
}
