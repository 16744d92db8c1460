// Shared by the build scripts of the library, cli/ and cni/ (each `include!`s it).

fn main() {
    println!("cargo::rustc-check-cfg=cfg(tapyard_root)");
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-env-changed=TAPYARD_TEST_AS_USER");
    // Switching between a user and root (`sudo`) in one target directory re-runs this.
    println!("cargo::rerun-if-env-changed=USER");
    println!("cargo::rerun-if-env-changed=SUDO_UID");
    let as_user = std::env::var_os("TAPYARD_TEST_AS_USER").is_some_and(|v| v != "0");
    if !as_user && euid() == Some(0) {
        println!("cargo::rustc-cfg=tapyard_root");
    }
}

/// The effective uid, from `/proc/self/status`'s `Uid:` line (real, effective, saved, fs).
fn euid() -> Option<u32> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}
