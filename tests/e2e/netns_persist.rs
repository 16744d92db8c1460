//! Persistent TAPs ([`TapPort::set_persist`]): a persistent TAP outlives its file descriptor
//! with its MAC, address and ifindex, is found again by name, follows its moves
//! ([`TapPort::current_name`], [`TapPort::netns`]), and goes once the flag is cleared.
//!
//! Needs root and `ip`; without them it says why and passes, except with `CI=true`, where it
//! fails. The TAP is created in the test's namespace (as `TapPort::open` does), moved at once
//! into a namespace of the test's own, and deleted by a guard on failure.

use std::os::unix::fs::MetadataExt;
use std::time::{Duration, Instant};

use crate::common::*;
use tapyard::port::{Port, TapPort};

/// Deletes the TAP (wherever the test left it) and, through [`Guard`], the namespace.
struct TapGone(String);

impl Drop for TapGone {
    fn drop(&mut self) {
        if let Ok(t) = TapPort::open(&self.0) {
            let _ = t.set_persist(false);
        }
    }
}

/// `ip -o link show` of `dev` (in `ns` if given), or `None` if there is none.
fn link(ns: Option<&str>, dev: &str) -> Option<String> {
    let mut v = vec!["ip"];
    if let Some(ns) = ns {
        v.extend(["-n", ns]);
    }
    v.extend(["-o", "link", "show", dev]);
    let out = run_output(&v);
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The ifindex at the start of an `ip -o link` line.
fn ifindex(line: &str) -> u32 {
    line.split(':').next().unwrap().trim().parse().unwrap()
}

/// Waits until `dev` is gone (the kernel deletes a TAP once its last fd is closed).
fn wait_gone(ns: Option<&str>, dev: &str) {
    let deadline = Instant::now() + Duration::from_secs(2);
    while link(ns, dev).is_some() {
        assert!(Instant::now() < deadline, "{dev} still exists");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
#[cfg_attr(
    not(tapyard_root),
    ignore = "needs root: TAP devices and network namespaces (runs as root, as in CI)"
)]
fn persistent_tap_outlives_its_fd_and_follows_its_moves() {
    if let Some(why) = skip_reason(&[]) {
        skip(&why);
        return;
    }
    let id = std::process::id() % 100_000;
    let name = format!("typs{id}");
    let mut guard = Guard::default();
    let _gone = TapGone(name.clone());

    // Not persistent: the device goes with the fd.
    let t = TapPort::open(&name).unwrap();
    assert!(link(None, &name).is_some());
    drop(t);
    wait_gone(None, &name);

    // Persistent: it stays, and opening it by name attaches to the same device.
    let t = TapPort::open_offload(&name).unwrap();
    t.set_persist(true).unwrap();
    let index = ifindex(&link(None, &name).unwrap());
    drop(t);
    std::thread::sleep(Duration::from_millis(50));
    let l = link(None, &name).expect("a persistent TAP outlives its fd");
    assert!(l.contains("NO-CARRIER") || !l.contains("LOWER_UP"), "{l}");
    let t = TapPort::open_offload(&name).unwrap();
    assert_eq!(ifindex(&link(None, &name).unwrap()), index);

    // Moved into a namespace and renamed there: the fd says where it is now.
    let ns = guard.ns(&format!("ty-ps-{id}"));
    run(&["ip", "link", "set", &name, "netns", &ns.name]);
    run(&["ip", "-n", &ns.name, "link", "set", &name, "name", "eth0"]);
    run(&[
        "ip",
        "-n",
        &ns.name,
        "addr",
        "add",
        "10.229.0.2/24",
        "dev",
        "eth0",
    ]);
    assert_eq!(t.current_name().unwrap(), "eth0");
    assert_eq!(t.name(), name, "Port::name stays the name it was opened by");
    let there = std::fs::metadata(format!("/var/run/netns/{}", ns.name)).unwrap();
    let ns_fd = std::fs::File::from(t.netns().unwrap());
    let m = ns_fd.metadata().unwrap();
    assert_eq!((m.dev(), m.ino()), (there.dev(), there.ino()));
    let here = std::fs::metadata("/proc/self/ns/net").unwrap();
    assert_ne!(m.ino(), here.ino());

    // Closed: still there, with its address.
    drop(t);
    std::thread::sleep(Duration::from_millis(50));
    let addr = run(&["ip", "-n", &ns.name, "-o", "addr", "show", "dev", "eth0"]);
    assert!(addr.contains("10.229.0.2/24"), "{addr}");

    // Back home under its first name, found again, then deleted for real.
    let me = std::process::id().to_string();
    run(&[
        "ip", "-n", &ns.name, "link", "set", "eth0", "netns", &me, "name", &name,
    ]);
    let t = TapPort::open_offload(&name).unwrap();
    assert_eq!(t.current_name().unwrap(), name);
    t.set_persist(false).unwrap();
    drop(t);
    wait_gone(None, &name);
}
