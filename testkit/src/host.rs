//! The machine a test runs on: may it run a root test, commands with a timeout, waiting,
//! unique names and temporary directories.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How long one external command may take.
pub const CMD_TIMEOUT: Duration = Duration::from_secs(20);

/// The effective uid, from `/proc/self/status` (no `unsafe` needed).
pub fn euid() -> Option<u32> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// Whether this process runs as root.
pub fn is_root() -> bool {
    euid() == Some(0)
}

/// Whether `cmd arg` runs (the command is installed).
pub fn have(cmd: &str, arg: &str) -> bool {
    Command::new(cmd)
        .arg(arg)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

/// True when running under CI (`CI=true`), where a test that cannot run fails.
pub fn in_ci() -> bool {
    std::env::var("CI").as_deref() == Ok("true")
}

/// A tool a root test needs: its command, an argument that makes it print its version, and
/// (optionally) what it is or which package has it.
pub trait Tool {
    /// `(command, version argument, what it is)`.
    fn parts(&self) -> (&str, &str, &str);
}

impl Tool for (&str, &str) {
    fn parts(&self) -> (&str, &str, &str) {
        (self.0, self.1, "")
    }
}

impl Tool for (&str, &str, &str) {
    fn parts(&self) -> (&str, &str, &str) {
        (self.0, self.1, self.2)
    }
}

/// Why this machine cannot run a root test, if it cannot: not root, `ip` (iproute2) or one of
/// `tools` missing, no `/dev/net/tun`.
pub fn missing<T: Tool>(tools: &[T]) -> Option<String> {
    if !is_root() {
        return Some("needs root to create TAP devices and network namespaces".into());
    }
    for (cmd, arg, what) in
        std::iter::once(("ip", "-V", "iproute2")).chain(tools.iter().map(T::parts))
    {
        if !have(cmd, arg) {
            let what = if what.is_empty() {
                String::new()
            } else {
                format!(" ({what})")
            };
            return Some(format!("`{cmd}`{what} is not installed"));
        }
    }
    if !Path::new("/dev/net/tun").exists() {
        return Some("/dev/net/tun does not exist".into());
    }
    None
}

/// [`missing`], and a kernel without IPv6 too.
pub fn missing6<T: Tool>(tools: &[T]) -> Option<String> {
    missing(tools).or_else(|| {
        (!Path::new("/proc/sys/net/ipv6").exists()).then(|| "the kernel has no IPv6".into())
    })
}

/// Says why the running test skips, or panics under `CI=true` (CI runs as root with every
/// tool installed: a skip there is a failure).
pub fn skip(why: &str) {
    assert!(!in_ci(), "CI=true but the test cannot run: {why}");
    eprintln!("skipping: {}", why.trim_start_matches("skipping: "));
}

/// True when test `test` should skip, having said why (`why` is what it lacks, `None` when it
/// can run); under `CI=true` a test that cannot run fails instead.
pub fn skip_or_fail(test: &str, why: Option<String>) -> bool {
    match why {
        None => false,
        Some(why) => {
            assert!(
                !in_ci(),
                "CI=true and the root test {test} cannot run: {why}"
            );
            eprintln!("skipping {test}: {why}");
            true
        }
    }
}

/// The directory holding the CNI reference plugins (host-local, bridge): `TAPYARD_CNI_PLUGINS`,
/// else Debian's `/usr/lib/cni`, else `/opt/cni/bin`.
pub fn plugin_dir() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("TAPYARD_CNI_PLUGINS")
        .map(PathBuf::from)
        .into_iter()
        .collect();
    dirs.extend(["/usr/lib/cni", "/opt/cni/bin"].map(PathBuf::from));
    dirs.into_iter().find(|d| d.join("host-local").is_file())
}

/// Waits for `child` (its output collected), killing it and panicking after `timeout`. Its
/// stdout and stderr, when piped, are read by two threads while it runs, so that a child
/// writing more than a pipe holds (64 KiB) is not blocked on a full pipe until the timeout.
pub fn wait_output(mut child: Child, timeout: Duration, what: &str) -> Output {
    use std::io::Read;
    fn drain(r: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut buf);
            }
            buf
        })
    }
    let out = drain(child.stdout.take());
    let err = drain(child.stderr.take());
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(st)) => break Some(st),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    // The readers end when every holder of the pipes' write ends has exited (the child's own
    // children may keep them open: they are not waited for past a short grace).
    let collect = |h: std::thread::JoinHandle<Vec<u8>>| {
        let grace = Instant::now() + Duration::from_secs(2);
        while !h.is_finished() && Instant::now() < grace {
            std::thread::sleep(Duration::from_millis(5));
        }
        if h.is_finished() {
            h.join().unwrap_or_default()
        } else {
            Vec::new()
        }
    };
    let (stdout, stderr) = (collect(out), collect(err));
    match status {
        Some(status) => Output {
            status,
            stdout,
            stderr,
        },
        None => panic!(
            "`{what}` did not finish within {timeout:?}: stdout {:?}, stderr {:?}",
            String::from_utf8_lossy(&stdout),
            String::from_utf8_lossy(&stderr)
        ),
    }
}

/// Runs `args` to completion (at most [`CMD_TIMEOUT`]); its output whatever the status.
pub fn run_output(args: &[&str]) -> Output {
    let child = Command::new(args[0])
        .args(&args[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run `{}`: {e}", args.join(" ")));
    wait_output(child, CMD_TIMEOUT, &args.join(" "))
}

/// Runs `args` and panics with its output unless it succeeds; returns its stdout.
pub fn run(args: &[&str]) -> String {
    let out = run_output(args);
    assert!(
        out.status.success(),
        "`{}` failed ({}):\nstdout: {}\nstderr: {}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Polls `f` every 100 ms until it returns `Ok`, at most `limit`; the last state is in the
/// failure message.
pub fn wait_for<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        match f() {
            Ok(v) => return v,
            Err(last) if Instant::now() >= deadline => {
                panic!("{what}: not within {limit:?}; last: {last}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// Waits (at most `limit`, checking every 5 ms) until `f` holds; false if it never did.
pub fn eventually(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    f()
}

/// A name unique to this process and call: `<prefix><pid % 10^5>n<k>`.
pub fn unique(prefix: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!(
        "{prefix}{}n{}",
        std::process::id() % 100_000,
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A tag that keeps names of tests run concurrently or one after another apart: the pid and
/// the time in seconds modulo 10^5.
pub fn name_tag() -> (u32, u64) {
    let pid = std::process::id();
    let tag = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() % 100_000);
    (pid, tag)
}

/// A private directory under the temporary directory, removed (with everything in it) on
/// drop.
#[derive(Debug)]
pub struct TempDir(pub PathBuf);

impl TempDir {
    /// A new empty directory named `<prefix><unique suffix>`.
    pub fn new(prefix: &str) -> TempDir {
        let dir = std::env::temp_dir().join(unique(prefix));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        TempDir(dir)
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.0
    }

    /// The addresses host-local holds leases for in this directory (its `dataDir`): see
    /// [`leases`].
    pub fn leases(&self) -> Vec<String> {
        leases(&self.0)
    }

    /// Every file below, as paths relative to the directory.
    pub fn files(&self) -> Vec<PathBuf> {
        fn walk(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
            for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                let path = entry.path();
                if path.is_dir() {
                    walk(root, &path, out);
                } else {
                    out.push(path.strip_prefix(root).unwrap_or(&path).to_path_buf());
                }
            }
        }
        let mut out = Vec::new();
        walk(&self.0, &self.0, &mut out);
        out
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The addresses CNI's `host-local` holds leases for in its `dataDir` `dir`: the files
/// anywhere below whose name is an IP address.
pub fn leases(dir: &Path) -> Vec<String> {
    fn walk(dir: &Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out);
            } else if let Some(name) = path.file_name().and_then(|n| n.to_str()) {
                if name.parse::<std::net::IpAddr>().is_ok() {
                    out.push(name.to_string());
                }
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, &mut out);
    out
}
