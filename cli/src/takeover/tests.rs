#![allow(unused_imports)]
use super::wire::*;
use super::*;
use crate::config::Config;
use crate::node::{Node, Plan};
use crate::ports::{Origin, PortEntry};
use crate::state::{NetnsRecord, PortRecord};
use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};
use serde::{Deserialize, Serialize};
use std::io::Seek;
use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tapyard::port::TapPort;
use tapyard::MacAddr;
use tapyard_cni::netlink::Link;

fn record(name: &str) -> PortRecord {
    PortRecord {
        name: name.into(),
        tap: name.into(),
        ifname: "eth0".into(),
        mac: "02:00:00:00:00:01".into(),
        kind: crate::ports::Kind::Pod,
        bridge: Some("cni0".into()),
        origin: Origin::Cni,
        owner: Some("c1/eth0".into()),
        netns: Some(NetnsRecord {
            path: "/var/run/netns/x".into(),
            dev: 4,
            ino: 4026532301,
        }),
        ifindex: 7,
        offload: false,
        ips: Vec::new(),
    }
}

#[test]
fn messages_cross_a_socketpair_with_their_descriptors() {
    let (a, b) = UnixStream::pair().unwrap();
    let offer = Msg::Offer {
        version: VERSION,
        node: "n".into(),
        pid: 1,
        control_socket: "/run/tapyard/n.sock".into(),
        ifaces: vec![IfaceRecord {
            name: "cni0".into(),
            mac: "02:00:00:00:00:aa".into(),
        }],
        own_netns: None,
        ports: vec![record("ty00000001")],
    };
    let w = || Wait::new(Duration::from_secs(5), None);
    send(&a, &offer, &[], w()).unwrap();
    let (got, fds) = recv(&b, w()).unwrap();
    assert_eq!(got, offer);
    assert!(fds.is_empty());

    // Descriptors really pass: files written on one side are read through the other's.
    let n = FDS_PER_MSG * 2 + 3;
    let mut files = Vec::new();
    for i in 0..n {
        let mut f = tempfile(i);
        f.write_all(format!("file {i}").as_bytes()).unwrap();
        files.push(f);
    }
    let roles: Vec<FdRole> = (0..n)
        .map(|i| FdRole::Port {
            name: format!("p{i}"),
        })
        .collect();
    let borrowed: Vec<BorrowedFd<'_>> = files.iter().map(|f| f.as_fd()).collect();
    let t = {
        let roles = roles.clone();
        std::thread::scope(|sc| {
            sc.spawn(|| send_handover(&a, roles, &borrowed, w()).unwrap());
            let (m, fds) = recv(&b, w()).unwrap();
            let Msg::Handover { fds: r } = m else {
                panic!("{m:?}")
            };
            assert_eq!(fds.len(), FDS_PER_MSG);
            recv_handover_rest(&b, r, fds, w()).unwrap()
        })
    };
    assert_eq!(t.len(), n);
    for (i, (role, fd)) in t.into_iter().enumerate() {
        assert_eq!(role, roles[i]);
        let mut f = std::fs::File::from(fd);
        f.rewind().unwrap();
        let mut s = String::new();
        f.read_to_string(&mut s).unwrap();
        assert_eq!(s, format!("file {i}"));
    }
}

fn tempfile(i: usize) -> std::fs::File {
    let p = std::env::temp_dir().join(format!("tapyard-takeover-{}-{i}", std::process::id()));
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&p)
        .unwrap();
    let _ = std::fs::remove_file(&p);
    f
}

#[test]
fn bad_messages_are_errors_not_crashes() {
    let (a, b) = UnixStream::pair().unwrap();
    let w = || Wait::new(Duration::from_millis(300), None);
    // Unknown message, unknown field, not JSON, too long, cut short, nothing at all.
    for body in [
        &br#"{"msg":"frobnicate"}"#[..],
        br#"{"msg":"ready","x":1}"#,
        b"\xff\xfe",
    ] {
        (&a).write_all(&u32::try_from(body.len()).unwrap().to_le_bytes())
            .unwrap();
        (&a).write_all(body).unwrap();
        let e = recv(&b, w()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
        assert!(e.to_string().contains("bad takeover message"), "{e}");
    }
    (&a).write_all(&u32::MAX.to_le_bytes()).unwrap();
    let e = recv(&b, w()).unwrap_err();
    assert!(e.to_string().contains("over the limit"), "{e}");
    assert_eq!(recv(&b, w()).unwrap_err().kind(), io::ErrorKind::TimedOut);
    (&a).write_all(&10u32.to_le_bytes()).unwrap();
    (&a).write_all(b"{\"ms").unwrap();
    drop(a);
    let e = recv(&b, w()).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{e}");
}

#[test]
fn a_trickling_or_stopped_exchange_ends_at_its_deadline() {
    let (a, b) = UnixStream::pair().unwrap();
    // A length, then one byte every 50 ms for 2 s: each read gets something, so only
    // the overall deadline ends the wait.
    let t = std::thread::spawn(move || {
        let _ = (&a).write_all(&100u32.to_le_bytes());
        for _ in 0..40 {
            if (&a).write_all(b" ").is_err() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    let t0 = Instant::now();
    let e = recv(&b, Wait::new(Duration::from_millis(300), None)).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::TimedOut, "{e}");
    assert!(
        t0.elapsed() < Duration::from_millis(1500),
        "{:?}",
        t0.elapsed()
    );
    // A signal ends a long wait at once.
    let stop = AtomicBool::new(true);
    let e = recv(&b, Wait::new(Duration::from_secs(60), Some(&stop))).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::Interrupted, "{e}");
    drop(b);
    t.join().unwrap();
}

#[test]
fn offered_ports_become_the_same_registry_entries() {
    let root = std::fs::read_to_string("/proc/self/status").is_ok_and(|t| {
        t.lines()
            .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(2) == Some("0"))
    });
    if !root || !Path::new("/dev/net/tun").exists() {
        eprintln!("skipping: needs root and /dev/net/tun to open a TAP");
        return;
    }
    let name = format!("tyrt{}", std::process::id() % 100_000);
    let tap = || TapPort::open(&name).unwrap();
    let r = record(&name);
    let e = entry_of(&r, tapyard::PortId(3), tap(), None, None);
    assert_eq!(e.record(), r);
    assert_eq!(e.info().ifindex, 7);
    drop(e);
    // A port the old process had in its own namespace, another than this one's.
    let own = NetnsRecord {
        path: "/proc/1/ns/net".into(),
        dev: 1,
        ino: 2,
    };
    let mut here = record(&name);
    here.netns = None;
    let e = entry_of(&here, tapyard::PortId(3), tap(), Some(&own), Some((1, 3)));
    assert_eq!(e.record().netns, Some(own.clone()));
    drop(e);
    let e = entry_of(&here, tapyard::PortId(3), tap(), Some(&own), Some((1, 2)));
    assert_eq!(e.record().netns, None);
}

#[test]
fn no_one_to_take_over_from_is_a_clear_error() {
    let dir = std::env::temp_dir().join(format!("tapyard-takeover-none-{}", std::process::id()));
    let src = format!(
        "[node]\nname = \"t\"\ncluster_cidr = \"10.244.0.0/16\"\nstate_dir = \"{}\"\n\n[[bridge]]\nname = \"cni0\"\n",
        dir.display()
    );
    let c = crate::config::check_str(&src);
    let cfg = c.config.unwrap_or_else(|| panic!("{:?}", c.diags));
    let e = take_over(cfg, "x.toml".into(), &AtomicBool::new(false))
        .unwrap_err()
        .to_string();
    assert!(e.contains("nobody to take over from"), "{e}");
    assert!(e.contains("takeover.sock"), "{e}");
}
