#![allow(
    clippy::cast_possible_truncation,
    reason = "test fixtures: small counters and random draws narrowed into addresses, ports and bytes"
)]
use super::*;
use crate::conntrack::{tcp::flags, Conntrack, CtState, CtTag, Dir, InsertError, Pkt, Track};
use crate::wire::tuple::{L4Kind, Tuple};
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};
use std::time::Duration;

/// While a test forks a child (`kill_9_...`), the child holds a copy of every descriptor the
/// test process has open until it execs, and with them the `flock` of any table file open at
/// that moment: a test that closes its table and opens it again in that window would find it
/// [`CtFileError::InUse`]. Tests hold this for reading while they have a file; the forking
/// test takes it for writing around the fork.
static FORKING: parking_lot::RwLock<()> = parking_lot::RwLock::new(());

/// A file in the temporary directory, removed when dropped; no child is forked while it lives.
pub(crate) struct TempFile(
    pub(crate) PathBuf,
    #[allow(dead_code, reason = "held, not read")] parking_lot::RwLockReadGuard<'static, ()>,
);

impl TempFile {
    pub(crate) fn new(tag: &str) -> TempFile {
        TempFile(temp_path(tag), FORKING.read_recursive())
    }
}

/// A fresh path in /dev/shm when there is one (a tmpfs, as in production), else the
/// temporary directory.
fn temp_path(tag: &str) -> PathBuf {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = Path::new("/dev/shm");
    let dir = if dir.is_dir() {
        dir.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    dir.join(format!("tapyard-ct-{tag}-{}-{n}", std::process::id()))
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn cfg(max: usize) -> CtConfig {
    CtConfig {
        max_entries: max,
        ..CtConfig::default()
    }
}

const UDP: Pkt = Pkt {
    kind: L4Kind::Udp,
    tcp_flags: 0,
    len: 100,
};

fn syn() -> Pkt {
    Pkt {
        kind: L4Kind::Tcp,
        tcp_flags: flags::SYN,
        len: 60,
    }
}

/// Connection `k`: a client to a ClusterIP, DNAT'd to an endpoint (TCP when `k` is even).
fn conn(k: u32) -> (Tuple, Tuple) {
    let orig = Tuple {
        src: Ipv4Addr::from(0x0af4_0000 | (k & 0xffff)),
        dst: Ipv4Addr::new(10, 96, 0, 10),
        sport: 10_000 + (k >> 16) as u16,
        dport: 80,
        proto: if k % 2 == 0 { 6 } else { 17 },
        zone: 0,
    };
    let reply = Tuple {
        src: Ipv4Addr::new(10, 244, 9, (k % 200) as u8 + 1),
        sport: 8080,
        ..orig.invert()
    };
    (orig, reply)
}

fn first(k: u32) -> Pkt {
    if k % 2 == 0 {
        syn()
    } else {
        UDP
    }
}

fn now() -> Instant {
    crate::Clock::new().now()
}

/// Creates the file at `path`, mode 0600 whatever the umask (a group-writable file is refused).
fn create_0600(path: &Path) -> File {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .unwrap();
    chmod(path, 0o600);
    f
}

fn chmod(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn mode_of(path: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt;
    std::fs::symlink_metadata(path)
        .unwrap()
        .permissions()
        .mode()
        & 0o7777
}

fn write_word(path: &Path, word: usize, v: u64) {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(&v.to_le_bytes(), (word * 8) as u64).unwrap();
}

#[test]
fn connections_nat_and_counters_survive_a_reopen() {
    let f = TempFile::new("reopen");
    let t0 = now();
    let (ct, rec) = Conntrack::open_file(cfg(4096), &f.0, t0).unwrap();
    assert_eq!(rec.opened, Opened::Created);
    assert!(ct.is_file_backed());
    let tag = CtTag {
        mark: 7,
        service: 3,
        endpoint: 9,
        ..CtTag::default()
    };
    for k in 0..1000 {
        let (o, r) = conn(k);
        ct.insert(o, r, tag, &first(k), t0).unwrap();
    }
    // Connection 0 completes its handshake: ESTABLISHED, ASSURED.
    let (o, r) = conn(0);
    let h = ct.lookup(&r, t0).unwrap();
    let synack = Pkt {
        tcp_flags: flags::SYN | flags::ACK,
        ..syn()
    };
    let ack = Pkt {
        tcp_flags: flags::ACK,
        ..syn()
    };
    assert_eq!(ct.track(&h, &synack, t0), Track::Ok(CtState::SynRecv));
    let h = ct.lookup(&o, t0).unwrap();
    assert_eq!(ct.track(&h, &ack, t0), Track::Ok(CtState::Established));
    let before = ct.dump(t0);
    ct.check_invariants().unwrap();
    drop(ct);

    let (ct, rec) = Conntrack::open_file(cfg(4096), &f.0, t0).unwrap();
    assert_eq!(rec.opened, Opened::Reused);
    assert!(rec.clean, "dropped, so detached cleanly");
    assert_eq!(rec.previous_pid, std::process::id());
    assert_eq!(
        (rec.kept, rec.half_written, rec.invalid, rec.expired),
        (1000, 0, 0, 0)
    );
    ct.check_invariants().unwrap();
    assert_eq!(ct.len(), 1000);
    // The same connections, NAT bindings, tags, states and counters.
    assert_eq!(ct.dump(t0), before);
    let (o, r) = conn(0);
    let h = ct.lookup(&r, t0).unwrap();
    assert_eq!((h.dir, h.orig, h.reply), (Dir::Reply, o, r));
    assert!(h.status.assured() && h.status.dnat());
    assert_eq!((h.mark, h.service, h.endpoint), (7, 3, 9));
    assert_eq!(h.state, CtState::Established);
    // A new connection with a taken reply tuple clashes; new ones go in.
    let (o2, _) = conn(2000);
    assert!(matches!(
        ct.insert(o2, r, CtTag::default(), &syn(), t0),
        Err(InsertError::Clash { .. })
    ));
    for k in 1000..2000 {
        let (o, r) = conn(k);
        ct.insert(o, r, CtTag::default(), &first(k), t0).unwrap();
    }
    assert!(ct.tuple_in_use(&r, t0));
    ct.check_invariants().unwrap();
    assert_eq!(ct.len(), 2000);
}

#[test]
fn expired_entries_are_freed_at_open_and_timeouts_are_the_new_ones() {
    let f = TempFile::new("expire");
    let t0 = now();
    let (ct, _) = Conntrack::open_file(cfg(256), &f.0, t0).unwrap();
    for k in 0..20 {
        let (o, r) = conn(k);
        ct.insert(o, r, CtTag::default(), &first(k), t0).unwrap();
    }
    drop(ct);
    // 31 s later: the 10 UDP flows (30 s) have expired, the TCP SYN_SENT ones (120 s) not.
    let t1 = t0 + Duration::from_secs(31);
    let (ct, rec) = Conntrack::open_file(cfg(256), &f.0, t1).unwrap();
    assert_eq!((rec.kept, rec.expired), (10, 10));
    ct.check_invariants().unwrap();
    drop(ct);
    // Reopened with a shorter SYN_SENT timeout: it applies to the kept entries.
    let mut c = cfg(256);
    c.timeouts.tcp_syn_sent = Duration::from_secs(20);
    let (ct, rec) = Conntrack::open_file(c, &f.0, t1).unwrap();
    assert_eq!((rec.kept, rec.expired), (0, 10));
    assert!(ct.is_empty());
}

#[test]
fn a_second_process_cannot_take_a_table_in_use() {
    let f = TempFile::new("inuse");
    let (ct, _) = Conntrack::open_file(cfg(64), &f.0, now()).unwrap();
    let e = Conntrack::open_file(cfg(64), &f.0, now()).unwrap_err();
    assert_eq!(e, CtFileError::InUse { path: f.0.clone() });
    assert!(e.to_string().contains("in use by another process"), "{e}");
    drop(ct);
    assert!(Conntrack::open_file(cfg(64), &f.0, now()).is_ok());
}

#[test]
fn bad_config_and_missing_directory_are_errors_naming_them() {
    let f = TempFile::new("cfg");
    let e = Conntrack::open_file(cfg(0), &f.0, now()).unwrap_err();
    assert!(matches!(e, CtFileError::Config(ref c) if c.field == "max_entries"));
    let p = f.0.join("no/such/dir");
    let e = Conntrack::open_file(cfg(64), &p, now()).unwrap_err();
    assert!(matches!(e, CtFileError::Io { op: "open", .. }), "{e}");
    assert!(e.to_string().contains("no/such/dir"), "{e}");
}

/// A table with some connections, closed; returns the file.
fn filled(tag: &str, max: usize, n: u32) -> TempFile {
    let f = TempFile::new(tag);
    let (ct, _) = Conntrack::open_file(cfg(max), &f.0, now()).unwrap();
    for k in 0..n {
        let (o, r) = conn(k);
        ct.insert(o, r, CtTag::default(), &first(k), now()).unwrap();
    }
    f
}

/// Opens `f` as a table of `max` entries: it must be refused with `want`, and give an empty,
/// consistent, working table.
fn assert_refused(f: &TempFile, max: usize, want: impl Fn(&Refusal) -> bool) {
    let (ct, rec) = Conntrack::open_file(cfg(max), &f.0, now()).unwrap();
    match &rec.opened {
        Opened::Refused(r) => assert!(want(r), "refused for {r}"),
        o => panic!("not refused: {o:?}"),
    }
    assert!(rec.to_string().contains("refused"), "{rec}");
    assert!(ct.is_empty());
    ct.check_invariants().unwrap();
    for k in 0..max as u32 {
        let (o, r) = conn(k);
        ct.insert(o, r, CtTag::default(), &first(k), now()).unwrap();
    }
    ct.check_invariants().unwrap();
    drop(ct);
    // And the new file is good.
    let (_, rec) = Conntrack::open_file(cfg(max), &f.0, now()).unwrap();
    assert_eq!((rec.opened, rec.kept), (Opened::Reused, max));
}

#[test]
fn truncated_file_is_refused_with_its_length() {
    let f = filled("trunc", 512, 100);
    let full = std::fs::metadata(&f.0).unwrap().len();
    let file = std::fs::OpenOptions::new().write(true).open(&f.0).unwrap();
    file.set_len(full / 2).unwrap();
    drop(file);
    assert_refused(
        &f,
        512,
        |r| matches!(r, Refusal::Length { found, expected } if *found == full / 2 && *expected == full),
    );
    // Cut inside the header: still a length refusal.
    let file = std::fs::OpenOptions::new().write(true).open(&f.0).unwrap();
    file.set_len(100).unwrap();
    drop(file);
    assert_refused(&f, 512, |r| matches!(r, Refusal::Length { found: 100, .. }));
}

#[test]
fn wrong_version_is_refused_naming_both_versions() {
    let f = filled("version", 512, 100);
    write_word(&f.0, H_VERSION, 99);
    assert_refused(&f, 512, |r| {
        *r == Refusal::Version {
            found: 99,
            expected: FORMAT_VERSION,
        } && r.to_string() == "format version 99, this build reads 1"
    });
}

#[test]
fn random_bytes_are_refused() {
    let f = TempFile::new("random");
    let len = Layout::of::<2>(512).file_len;
    let mut x = 0x1234_5678_9abc_def0u64;
    let bytes: Vec<u8> = (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    create_0600(&f.0).write_all_at(&bytes, 0).unwrap();
    assert_refused(&f, 512, |r| matches!(r, Refusal::Magic { .. }));
}

#[test]
fn another_size_is_refused_naming_max_entries() {
    let f = filled("size", 512, 100);
    assert_refused(&f, 1024, |r| {
        *r == Refusal::Layout {
            field: "max_entries",
            found: 512,
            expected: 1024,
        }
    });
}

#[test]
fn damaged_header_and_another_boot_are_refused() {
    let f = filled("checksum", 512, 100);
    write_word(&f.0, H_SEED, 42);
    assert_refused(&f, 512, |r| *r == Refusal::Checksum);
    // Another boot id with a checksum that matches it: refused as another boot.
    let file = File::open(&f.0).unwrap();
    let len = file.metadata().unwrap().len();
    let mut h = read_header(&file, len).unwrap();
    h[H_BOOT] ^= 1;
    h[H_CHECKSUM] = checksum(&h[..H_CHECKSUM]);
    write_word(&f.0, H_BOOT, h[H_BOOT]);
    write_word(&f.0, H_CHECKSUM, h[H_CHECKSUM]);
    assert_refused(&f, 512, |r| *r == Refusal::OtherBoot);
}

#[test]
fn garbage_in_the_arrays_is_never_read_as_a_connection() {
    // A valid header over random arrays: every entry is freed, none kept.
    let f = filled("garbage", 4096, 0);
    let file = std::fs::OpenOptions::new().write(true).open(&f.0).unwrap();
    let lay = Layout::of::<2>(4096);
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let junk: Vec<u8> = (0..lay.file_len - lay.entries_off)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect();
    file.write_all_at(&junk, lay.entries_off as u64).unwrap();
    drop(file);
    let (ct, rec) = Conntrack::open_file(cfg(4096), &f.0, now()).unwrap();
    assert_eq!(rec.opened, Opened::Reused);
    assert_eq!(rec.kept, 0, "{rec}");
    assert!(rec.half_written + rec.invalid > 0, "{rec}");
    ct.check_invariants().unwrap();
    for k in 0..4096 {
        let (o, r) = conn(k);
        ct.insert(o, r, CtTag::default(), &first(k), now()).unwrap();
    }
    ct.check_invariants().unwrap();
}

// ---- kill -9 at random moments --------------------------------------------------------------

/// The child's table size: small, so that it is full most of the time (early drops, the full
/// path) and an open is quick.
const CHILD_MAX: usize = 2048;

/// Run as a child process (`CT_CHILD_FILE` set): opens the table and inserts, tracks and
/// removes connections from two threads until it is killed. Without the variable (a normal
/// test run) it does nothing.
#[test]
fn child_churns_until_killed() {
    let Some(path) = std::env::var_os("CT_CHILD_FILE") else {
        return;
    };
    let (ct, _) = Conntrack::open_file(cfg(CHILD_MAX), Path::new(&path), now()).unwrap();
    let ct = std::sync::Arc::new(ct);
    println!("ready");
    let threads: Vec<_> = (0..2u64)
        .map(|w| {
            let ct = ct.clone();
            std::thread::spawn(move || {
                let mut x = 0x2545_f491_4f6c_dd1d ^ (w + 1) ^ u64::from(std::process::id());
                loop {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let k = (x % 6000) as u32;
                    let (o, r) = conn(k);
                    let t = now();
                    match ct.insert(o, r, CtTag::default(), &first(k), t) {
                        Ok(h) if x & 0x30 == 0 => {
                            ct.remove(h.id);
                        }
                        Ok(h) => {
                            let back = Pkt {
                                tcp_flags: flags::SYN | flags::ACK,
                                ..first(k)
                            };
                            let mut h = h;
                            h.dir = Dir::Reply;
                            let _ = ct.track(&h, &back, t);
                        }
                        Err(InsertError::Clash { existing: Some(h) }) if x & 1 == 0 => {
                            ct.remove(h.id);
                        }
                        _ => {}
                    }
                }
            })
        })
        .collect();
    for t in threads {
        let _ = t.join();
    }
}

#[test]
fn kill_9_at_random_moments_never_leaves_an_inconsistent_table() {
    // Not a `TempFile`: this test forks, so it must not hold the guard for reading.
    let f = temp_path("kill");
    struct Remove<'a>(&'a Path);
    impl Drop for Remove<'_> {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(self.0);
        }
    }
    let _remove = Remove(&f);
    let exe = std::env::current_exe().unwrap();
    let mut x = 0x5151_7777_1234_9876u64 ^ u64::from(std::process::id());
    let rounds = 40;
    let (mut kept, mut half) = (0usize, 0usize);
    for round in 0..rounds {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let forking = FORKING.write();
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "conntrack::persist::tests::child_churns_until_killed",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("CT_CHILD_FILE", &f)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        drop(forking);
        // Most rounds wait for the child to be churning; some kill it while it opens and
        // rebuilds the table.
        if round % 5 != 0 {
            use std::io::BufRead;
            let out = child.stdout.take().unwrap();
            let mut lines = std::io::BufReader::new(out).lines();
            loop {
                match lines.next() {
                    Some(Ok(l)) if l.contains("ready") => break,
                    Some(_) => continue,
                    None => panic!("the child ended without getting ready"),
                }
            }
            std::thread::spawn(move || for _ in lines {});
        }
        std::thread::sleep(Duration::from_micros(x % 30_000));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();

        let (ct, rec) = Conntrack::open_file(cfg(CHILD_MAX), &f, now()).unwrap();
        assert!(
            matches!(rec.opened, Opened::Reused | Opened::Created),
            "round {round}: {rec}"
        );
        assert_eq!(rec.invalid + rec.duplicates, 0, "round {round}: {rec}");
        if let Err(e) = ct.check_invariants() {
            panic!("round {round}: {e} ({rec})");
        }
        kept += rec.kept;
        half += rec.half_written;
        // Every kept entry is found from both tuples, and is the connection its tuples say.
        for v in ct.dump(now()) {
            let k = u32::from(v.orig.src.octets()[2]) << 8 | u32::from(v.orig.src.octets()[3]);
            let k = k | u32::from(v.orig.sport - 10_000) << 16;
            assert_eq!((v.orig, v.reply), conn(k), "round {round}");
            assert_eq!(ct.lookup(&v.reply, now()).map(|h| h.id), Some(v.id));
            assert_eq!(ct.lookup(&v.orig, now()).map(|h| h.id), Some(v.id));
        }
        // New inserts work (into a full table too: early drop of unassured entries).
        let ids: Vec<_> = (7000..7100)
            .map(|k| {
                let (o, r) = conn(k);
                ct.insert(o, r, CtTag::default(), &first(k), now())
                    .unwrap()
                    .id
            })
            .collect();
        ct.check_invariants().unwrap();
        for id in ids {
            // (A later one of these may have early-dropped an earlier one.)
            ct.remove(id);
        }
        ct.check_invariants().unwrap();
        // Leave it as after a crash: the next child finds `clean` unset.
        drop(ct);
        write_word(&f, H_CLEAN, 0);
    }
    assert!(kept > 0, "the children inserted nothing");
    eprintln!("{rounds} kills: {kept} connections kept, {half} half-written entries freed");
}

/// `tapyard run --takeover`: the table's open file, handed to a successor while the first
/// table stops writing, is opened with its lock shared (a fresh open is still refused) and
/// keeps every connection; the successor's table goes on after the first is gone.
#[test]
fn a_handed_over_file_keeps_its_lock_and_its_connections() {
    let f = TempFile::new("handover");
    let t0 = now();
    let (ct, _) = Conntrack::open_file(cfg(4096), &f.0, t0).unwrap();
    for k in 0..100 {
        let (o, r) = conn(k);
        ct.insert(o, r, CtTag::default(), &first(k), t0).unwrap();
    }
    let before = ct.dump(t0);
    let fd = ct.backing_file().unwrap().try_clone_to_owned().unwrap();
    let (next, rec) = Conntrack::open_handed_over(cfg(4096), File::from(fd), &f.0, t0).unwrap();
    assert_eq!((rec.opened, rec.kept), (Opened::Reused, 100));
    assert_eq!(next.dump(t0), before);
    // A third opener still finds the file in use, before and after the first table goes.
    let e = Conntrack::open_file(cfg(4096), &f.0, t0).unwrap_err();
    assert_eq!(e, CtFileError::InUse { path: f.0.clone() });
    drop(ct);
    assert!(Conntrack::open_file(cfg(4096), &f.0, t0).is_err());
    let (o, _) = conn(100);
    assert!(next.lookup(&conn(5).0, t0).is_some());
    assert!(next.lookup(&o, t0).is_none());
    next.check_invariants().unwrap();
    assert!(Conntrack::new(cfg(64)).unwrap().backing_file().is_none());
}

/// A takeover that fails after the successor opened the handed-over file (its rebuild, its
/// inserts and removals): the first table's own view (free stack, length) no longer matches
/// the arrays, and going on with it would hand out entries the successor made live.
/// [`Conntrack::take_back`] makes it whole again, with every connection of both kept.
#[test]
fn a_table_taken_back_after_a_failed_handover_is_consistent() {
    let f = TempFile::new("takeback");
    let t0 = now();
    let (ct, _) = Conntrack::open_file(cfg(64), &f.0, t0).unwrap();
    let mut ids = Vec::new();
    for k in 0..20 {
        let (o, r) = conn(k);
        ids.push(ct.insert(o, r, CtTag::default(), &first(k), t0).unwrap().id);
    }
    // Freed in this order, the first table's free stack is 5, 3, 20, 21, ...; a rebuild
    // links the free entries lowest first.
    ct.remove(ids[3]);
    ct.remove(ids[5]);
    ct.check_invariants().unwrap();
    let fd = ct.backing_file().unwrap().try_clone_to_owned().unwrap();
    let (next, rec) = Conntrack::open_handed_over(cfg(64), File::from(fd), &f.0, t0).unwrap();
    assert_eq!(rec.kept, 18);
    // The successor forwards a little: new connections, one closed.
    for k in 100..110 {
        let (o, r) = conn(k);
        next.insert(o, r, CtTag::default(), &first(k), t0).unwrap();
    }
    let gone = next.lookup(&conn(0).0, t0).unwrap().id;
    next.remove(gone);
    // ...then gives up and drops its table.
    drop(next);
    // The first table's view is stale now.
    assert!(ct.check_invariants().is_err());
    let rec = ct.take_back(t0);
    assert_eq!(rec.kept, 27, "{rec}");
    assert_eq!(rec.invalid + rec.duplicates + rec.half_written, 0, "{rec}");
    ct.check_invariants().unwrap();
    assert!(ct.lookup(&conn(0).0, t0).is_none());
    for k in (1..20).filter(|k| *k != 3 && *k != 5).chain(100..110) {
        assert!(ct.lookup(&conn(k).0, t0).is_some(), "connection {k}");
    }
    // Inserts go on into the whole table: it fills up to its 64 entries, no entry twice.
    let mut n = ct.len();
    for k in 200..300 {
        let (o, r) = conn(k);
        if ct.insert(o, r, CtTag::default(), &first(k), t0).is_ok() {
            n += 1;
        }
        if n == 64 {
            break;
        }
    }
    ct.check_invariants().unwrap();
    assert_eq!(ct.len(), 64);
    // In use by this process again: a crash now is not mistaken for a clean stop.
    let h = read_header(&File::open(&f.0).unwrap(), 4096).unwrap();
    assert_eq!(h[H_CLEAN], 0);
    assert_eq!(h[H_PID], u64::from(std::process::id()));
}

/// A takeover by a successor configured for another table size: the giver still maps the
/// file (and takes it back if the takeover fails), so the successor keeps the file's size
/// and every connection instead of resizing the file under it; a restart applies the size.
#[test]
fn a_handed_over_table_of_another_size_keeps_its_size_and_connections() {
    let f = TempFile::new("handover-size");
    let t0 = now();
    let (ct, _) = Conntrack::open_file(cfg(1024), &f.0, t0).unwrap();
    for k in 0..50 {
        let (o, r) = conn(k);
        ct.insert(o, r, CtTag::default(), &first(k), t0).unwrap();
    }
    let before = ct.dump(t0);
    let len = std::fs::metadata(&f.0).unwrap().len();
    let fd = ct.backing_file().unwrap().try_clone_to_owned().unwrap();
    let (next, rec) = Conntrack::open_handed_over(cfg(64), File::from(fd), &f.0, t0).unwrap();
    assert_eq!((&rec.opened, rec.kept), (&Opened::Reused, 50), "{rec}");
    assert_eq!(rec.size_kept_over, Some(64));
    assert!(
        rec.to_string()
            .contains("max_entries 64 applies at the next restart"),
        "{rec}"
    );
    assert_eq!(next.config().max_entries, 1024);
    assert_eq!(next.dump(t0), before);
    assert_eq!(
        std::fs::metadata(&f.0).unwrap().len(),
        len,
        "the file was resized"
    );
    // The successor gives up: the giver takes back a whole table.
    drop(next);
    let rec = ct.take_back(t0);
    assert_eq!(rec.kept, 50, "{rec}");
    ct.check_invariants().unwrap();
    for k in 0..50 {
        assert!(ct.lookup(&conn(k).0, t0).is_some(), "connection {k}");
    }
    // A restart (a fresh open) applies the configured size.
    drop(ct);
    let (ct, rec) = Conntrack::open_file(cfg(64), &f.0, t0).unwrap();
    assert!(matches!(rec.opened, Opened::Refused(_)), "{rec}");
    assert_eq!(ct.config().max_entries, 64);
}

/// A handed-over file the successor cannot use (another build's format): the successor
/// starts a new file at the path, and the giver's file, which it still maps, is left whole
/// for it to take back.
#[test]
fn a_refused_handed_over_file_is_replaced_not_rewritten_under_the_giver() {
    let f = TempFile::new("handover-refused");
    let t0 = now();
    let (ct, _) = Conntrack::open_file(cfg(256), &f.0, t0).unwrap();
    for k in 0..30 {
        let (o, r) = conn(k);
        ct.insert(o, r, CtTag::default(), &first(k), t0).unwrap();
    }
    // As if the giver were another build: its header names another format version.
    write_word(&f.0, H_VERSION, 99);
    let fd = ct.backing_file().unwrap().try_clone_to_owned().unwrap();
    let (next, rec) = Conntrack::open_handed_over(cfg(256), File::from(fd), &f.0, t0).unwrap();
    assert!(
        matches!(
            rec.opened,
            Opened::Refused(Refusal::Version { found: 99, .. })
        ),
        "{rec}"
    );
    assert!(next.is_empty());
    let (o, r) = conn(500);
    next.insert(o, r, CtTag::default(), &first(500), t0)
        .unwrap();
    next.check_invariants().unwrap();
    // The giver's table is untouched: it takes it back whole.
    drop(next);
    let rec = ct.take_back(t0);
    assert_eq!(rec.kept, 30, "{rec}");
    ct.check_invariants().unwrap();
    assert!(ct.lookup(&conn(7).0, t0).is_some());
    // The path names the successor's file, whole, with its one connection.
    drop(ct);
    let (ct, rec) = Conntrack::open_file(cfg(256), &f.0, t0).unwrap();
    assert_eq!((&rec.opened, rec.kept), (&Opened::Reused, 1), "{rec}");
    assert!(ct.lookup(&conn(500).0, t0).is_some());
    let dir = f.0.parent().unwrap();
    let stray = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(Result::ok)
        .any(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("tapyard-ct-handover-refused")
                && e.file_name().to_string_lossy().contains(".new-")
        });
    assert!(!stray, "a temporary file was left behind");
}

/// Kilobytes of this process's mappings of `path`, and of them the kilobytes mapped with PMDs
/// (2 MiB pages: `ShmemPmdMapped` for tmpfs, `FilePmdMapped` otherwise), from
/// `/proc/self/smaps`.
fn mapped_kb(path: &Path) -> (u64, u64) {
    let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
    let name = path.to_str().unwrap();
    let (mut size, mut pmd, mut ours) = (0, 0, false);
    for line in smaps.lines() {
        let mut words = line.split_whitespace();
        let Some(first) = words.next() else { continue };
        if !first.ends_with(':') {
            // A mapping's first line: its range, ..., its file's name (with " (deleted)").
            ours = line.split_whitespace().nth(5) == Some(name);
            continue;
        }
        let kb = words
            .next()
            .and_then(|w| w.parse::<u64>().ok())
            .unwrap_or(0);
        match (ours, first) {
            (true, "Size:") => size += kb,
            (true, "ShmemPmdMapped:" | "FilePmdMapped:") => pmd += kb,
            _ => {}
        }
    }
    (size, pmd)
}

#[test]
fn the_table_is_mapped_on_huge_pages_where_the_kernel_can() {
    let f = TempFile::new("huge");
    let (ct, rec) = Conntrack::open_file(cfg(1 << 16), &f.0, now()).unwrap();
    let len = Layout::of::<2>(1 << 16).file_len as u64;
    let (size, pmd) = mapped_kb(&f.0);
    assert_eq!(size, len / 1024);
    if !rec.huge_pages {
        // Linux before 6.1, `shmem_enabled` = deny, a disk file system, or no free huge page.
        eprintln!(
            "no huge pages for {}: {size} kB mapped, {pmd} kB with PMDs",
            f.0.display()
        );
        return;
    }
    assert_eq!(pmd, size, "huge_pages, so all of it is mapped with PMDs");
    for k in 0..100 {
        let (o, r) = conn(k);
        ct.insert(o, r, CtTag::default(), &first(k), now()).unwrap();
    }
    // A successor mapping the same file (a takeover) finds its pages huge, and maps them so.
    let fd = ct.backing_file().unwrap().try_clone_to_owned().unwrap();
    let (next, rec) =
        Conntrack::open_handed_over(cfg(1 << 16), File::from(fd), &f.0, now()).unwrap();
    assert!(rec.huge_pages);
    assert_eq!(rec.kept, 100);
    assert_eq!(
        mapped_kb(&f.0),
        (2 * size, 2 * size),
        "both mappings on huge pages"
    );
    drop((next, ct));
    // And so does the next process after a restart.
    let (_ct, rec) = Conntrack::open_file(cfg(1 << 16), &f.0, now()).unwrap();
    assert_eq!(
        (rec.opened, rec.kept, rec.huge_pages),
        (Opened::Reused, 100, true)
    );
    assert_eq!(mapped_kb(&f.0), (size, size));
}

/// `f`'s length and contents.
fn contents(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap()
}

#[test]
fn a_symbolic_link_is_refused_and_its_target_untouched() {
    let f = TempFile::new("link");
    let victim = TempFile::new("victim");
    create_0600(&victim.0)
        .write_all_at(b"not a table", 0)
        .unwrap();
    std::os::unix::fs::symlink(&victim.0, &f.0).unwrap();
    let e = Conntrack::open_file(cfg(64), &f.0, now()).unwrap_err();
    assert!(
        matches!(&e, CtFileError::Unsafe { path, why } if *path == f.0 && why.contains("symbolic link")),
        "{e:?}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains(f.0.to_str().unwrap()) && msg.contains("symbolic link"),
        "{msg}"
    );
    assert_eq!(contents(&victim.0), b"not a table");
    assert_eq!(mode_of(&victim.0), 0o600);
    // A dangling one is not followed either (no file is created where it points).
    let f2 = TempFile::new("dangling");
    let nowhere = TempFile::new("nowhere");
    std::os::unix::fs::symlink(&nowhere.0, &f2.0).unwrap();
    let e = Conntrack::open_file(cfg(64), &f2.0, now()).unwrap_err();
    assert!(matches!(e, CtFileError::Unsafe { .. }), "{e:?}");
    assert!(!nowhere.0.exists());
}

#[test]
fn a_file_others_can_write_is_refused_untouched() {
    let f = filled("writable", 64, 10);
    let before = contents(&f.0);
    for (mode, who) in [
        (0o666, "its group and others"),
        (0o620, "its group"),
        (0o602, "others"),
    ] {
        chmod(&f.0, mode);
        let e = Conntrack::open_file(cfg(64), &f.0, now()).unwrap_err();
        let want = format!("writable by {who} (mode {mode:04o})");
        assert_eq!(
            e,
            CtFileError::Unsafe {
                path: f.0.clone(),
                why: want.clone()
            }
        );
        let msg = e.to_string();
        assert!(
            msg.contains(f.0.to_str().unwrap()) && msg.contains(&want),
            "{msg}"
        );
        assert_eq!(mode_of(&f.0), mode, "left as it was");
        // Handed over, it is checked as well.
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&f.0)
            .unwrap();
        let e = Conntrack::open_handed_over(cfg(64), file, &f.0, now()).unwrap_err();
        assert!(matches!(e, CtFileError::Unsafe { .. }), "{e:?}");
    }
    assert_eq!(contents(&f.0), before, "never written");
}

#[test]
fn a_file_others_can_read_is_set_to_0600_and_used() {
    let f = filled("readable", 64, 10);
    chmod(&f.0, 0o644);
    let (ct, rec) = Conntrack::open_file(cfg(64), &f.0, now()).unwrap();
    assert_eq!(
        (rec.opened.clone(), rec.kept, rec.mode_fixed),
        (Opened::Reused, 10, Some(0o644))
    );
    assert!(
        rec.to_string().contains("file mode was 0644, set to 0600"),
        "{rec}"
    );
    assert_eq!(mode_of(&f.0), 0o600);
    drop(ct);
    let (ct, rec) = Conntrack::open_file(cfg(64), &f.0, now()).unwrap();
    assert_eq!((rec.kept, rec.mode_fixed), (10, None));
    // Handed over too (the giver's file: only its mode changes).
    chmod(&f.0, 0o640);
    let fd = ct.backing_file().unwrap().try_clone_to_owned().unwrap();
    let (_next, rec) = Conntrack::open_handed_over(cfg(64), File::from(fd), &f.0, now()).unwrap();
    assert_eq!((rec.kept, rec.mode_fixed), (10, Some(0o640)));
    assert_eq!(mode_of(&f.0), 0o600);
    // A new file is made 0600 whatever the umask.
    let g = TempFile::new("new-mode");
    let (_ct, rec) = Conntrack::open_file(cfg(64), &g.0, now()).unwrap();
    assert_eq!((rec.opened, rec.mode_fixed), (Opened::Created, None));
    assert_eq!(mode_of(&g.0), 0o600);
}

#[test]
fn a_file_with_two_names_is_refused() {
    let f = filled("nlink", 64, 10);
    let other = TempFile::new("nlink-other");
    std::fs::hard_link(&f.0, &other.0).unwrap();
    let before = contents(&f.0);
    let e = Conntrack::open_file(cfg(64), &f.0, now()).unwrap_err();
    assert!(
        matches!(&e, CtFileError::Unsafe { why, .. } if why.starts_with("2 hard links")),
        "{e:?}"
    );
    assert_eq!(contents(&f.0), before);
    std::fs::remove_file(&other.0).unwrap();
    assert_eq!(
        Conntrack::open_file(cfg(64), &f.0, now()).unwrap().1.kept,
        10
    );
}

#[test]
fn a_fifo_is_refused() {
    // Made by a child process: no table may be open meanwhile (see FORKING).
    let path = temp_path("fifo");
    let made = {
        let _fork = FORKING.write();
        Command::new("mkfifo")
            .arg(&path)
            .status()
            .is_ok_and(|s| s.success())
    };
    let p = TempFile(path, FORKING.read_recursive());
    if !made {
        eprintln!("skipping: mkfifo failed");
        return;
    }
    // Opening a FIFO for reading and writing does not block on Linux.
    let e = Conntrack::open_file(cfg(64), &p.0, now()).unwrap_err();
    assert!(
        matches!(&e, CtFileError::Unsafe { why, .. } if why == "not a regular file (a FIFO)"),
        "{e:?}"
    );
}

#[test]
fn a_file_of_another_user_is_refused() {
    if sys::euid() != 0 {
        eprintln!("skipping: needs root to give a file to another user");
        return;
    }
    let f = filled("owner", 64, 10);
    std::os::unix::fs::chown(&f.0, Some(65534), None).unwrap();
    let e = Conntrack::open_file(cfg(64), &f.0, now()).unwrap_err();
    assert_eq!(
        e,
        CtFileError::Unsafe {
            path: f.0.clone(),
            why: "owned by uid 65534, not by this process's uid 0".to_string()
        }
    );
    assert!(e.to_string().contains("owned by uid 65534"), "{e}");
}

/// A tmpfs of `size` mounted on a new directory (root only), unmounted and removed when
/// dropped. `mount` and `umount` are child processes: made and dropped with no table open in
/// this test (see FORKING).
struct Tmpfs(PathBuf);

impl Tmpfs {
    /// `None` (and why, printed) when the mount fails (not root).
    fn mount(size: &str) -> Option<Tmpfs> {
        let dir = std::env::temp_dir().join(format!("tapyard-ct-tmpfs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let _fork = FORKING.write();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o"])
            .arg(format!("size={size},mode=0700"))
            .arg("tapyard-test")
            .arg(&dir)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            eprintln!(
                "skipping: cannot mount a tmpfs on {} (needs root)",
                dir.display()
            );
            let _ = std::fs::remove_dir(&dir);
            return None;
        }
        Some(Tmpfs(dir))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _fork = FORKING.write();
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// Fills `path`'s file system with a file until it is full.
fn fill(path: &Path) {
    let f = create_0600(path);
    let mb = vec![0x55u8; 1 << 20];
    let mut off = 0u64;
    while f.write_all_at(&mb, off).is_ok() {
        off += mb.len() as u64;
    }
    for _ in 0..256 {
        if f.write_all_at(&mb[..4096], off).is_err() {
            break;
        }
        off += 4096;
    }
}

#[test]
fn a_full_tmpfs_is_an_error_at_open_not_a_sigbus_later() {
    let Some(fs) = Tmpfs::mount("16m") else {
        return;
    };
    let _no_fork = FORKING.read_recursive();
    // A small table's arrays start on 4 KiB pages, a big one's on 2 MiB pages (so a file
    // with a few connections in it is mostly holes until it is reserved).
    assert_eq!(Layout::of::<2>(1024).file_len, 132 << 10);
    let small = Layout::of::<2>(1 << 16).file_len as u64; // 10 MiB
    let big = Layout::of::<2>(1 << 17).file_len as u64; // 18 MiB: more than the tmpfs
    assert_eq!((small, big), (10 << 20, 18 << 20));
    // A table that fits, reserved whole: filling the file system after it cannot make its
    // first touches of any page fail (a SIGBUS before: the file was sparse).
    let a = fs.0.join("a");
    let (ct, rec) = Conntrack::open_file(cfg(1 << 16), &a, now()).unwrap();
    assert_eq!(rec.opened, Opened::Created);
    {
        use std::os::unix::fs::MetadataExt;
        assert!(
            std::fs::metadata(&a).unwrap().blocks() * 512 >= small,
            "allocated"
        );
    }
    fill(&fs.0.join("filler"));
    for k in 0..1024 {
        let (o, r) = conn(k);
        ct.insert(o, r, CtTag::default(), &first(k), now()).unwrap();
    }
    ct.check_invariants().unwrap();
    drop(ct);
    std::fs::remove_file(fs.0.join("filler")).unwrap();

    // A table bigger than the room left: an error naming the file and both sizes, and no file
    // of that size left behind.
    let b = fs.0.join("b");
    let e = Conntrack::open_file(cfg(1 << 17), &b, now()).unwrap_err();
    let CtFileError::NoSpace { path, needed, free } = &e else {
        panic!("{e:?}");
    };
    assert_eq!((path, *needed), (&b, big));
    assert!(*free < big && *free >= (5 << 20), "{free}");
    let msg = e.to_string();
    assert!(
        msg.contains(b.to_str().unwrap())
            && msg.contains(&format!("{big} bytes needed, {free} bytes free")),
        "{msg}"
    );
    assert_eq!(std::fs::metadata(&b).unwrap().len(), 0);
    std::fs::remove_file(&b).unwrap();

    // An existing sparse table (as files were before they were reserved): reusing it reserves
    // it first, refused when there is no room, and reused intact once there is.
    let data = contents(&a);
    std::fs::remove_file(&a).unwrap();
    let c = fs.0.join("c");
    let file = create_0600(&c);
    for (i, page) in data.chunks(4096).enumerate() {
        if page.iter().any(|&x| x != 0) {
            file.write_all_at(page, (i * 4096) as u64).unwrap();
        }
    }
    file.set_len(small).unwrap();
    drop(file);
    fill(&fs.0.join("filler"));
    let e = Conntrack::open_file(cfg(1 << 16), &c, now()).unwrap_err();
    assert!(
        matches!(e, CtFileError::NoSpace { ref path, .. } if *path == c),
        "{e:?}"
    );
    assert_eq!(contents(&c), data, "left as it was");
    std::fs::remove_file(fs.0.join("filler")).unwrap();
    let (ct, rec) = Conntrack::open_file(cfg(1 << 16), &c, now()).unwrap();
    assert_eq!((&rec.opened, rec.kept), (&Opened::Reused, 1024), "{rec}");
    {
        use std::os::unix::fs::MetadataExt;
        assert!(
            std::fs::metadata(&c).unwrap().blocks() * 512 >= small,
            "allocated"
        );
    }
    drop(ct);
}

/// The per-source counts are not in the file: a reopened table counts its kept entries
/// again, so a source at its limit is still at it, and entries expired at the reopen are not
/// counted.
#[test]
fn per_source_counts_are_rebuilt_at_open() {
    let f = TempFile::new("persrc");
    let t0 = now();
    let c = CtConfig {
        max_per_source: 4,
        ..cfg(256)
    };
    let tag = CtTag {
        status: crate::conntrack::CtStatus(crate::conntrack::CtStatus::SOURCE_LIMITED),
        ..CtTag::default()
    };
    let (ct, _) = Conntrack::open_file(c, &f.0, t0).unwrap();
    let mk = |i: u16, proto: u8| {
        let o = Tuple {
            src: Ipv4Addr::new(10, 244, 1, 2),
            dst: Ipv4Addr::new(10, 96, 0, 10),
            sport: 30_000 + i,
            dport: 80,
            proto,
            zone: 0,
        };
        (o, o.invert())
    };
    // Two TCP (SYN_SENT: 120 s) and two UDP (30 s) connections: the limit.
    for (i, proto) in [(0, 6), (1, 6), (2, 17), (3, 17)] {
        let (o, r) = mk(i, proto);
        let p = if proto == 6 { syn() } else { UDP };
        ct.insert(o, r, tag, &p, t0).unwrap();
    }
    let (o, r) = mk(9, 17);
    assert_eq!(
        ct.insert(o, r, tag, &UDP, t0).unwrap_err(),
        InsertError::SourceLimit
    );
    drop(ct);
    let (ct, _) = Conntrack::open_file(c, &f.0, t0).unwrap();
    assert_eq!(ct.source_count(&o), 4);
    assert_eq!(
        ct.insert(o, r, tag, &UDP, t0).unwrap_err(),
        InsertError::SourceLimit
    );
    drop(ct);
    // 31 s later the UDP flows are gone at the open: two connections fit again.
    let t1 = t0 + Duration::from_secs(31);
    let (ct, rec) = Conntrack::open_file(c, &f.0, t1).unwrap();
    assert_eq!((rec.kept, rec.expired), (2, 2));
    assert_eq!(ct.source_count(&o), 2);
    for i in 10..12 {
        let (o, r) = mk(i, 17);
        ct.insert(o, r, tag, &UDP, t1).unwrap();
    }
    assert_eq!(
        ct.insert(o, r, tag, &UDP, t1).unwrap_err(),
        InsertError::SourceLimit
    );
    ct.check_invariants().unwrap();
}
