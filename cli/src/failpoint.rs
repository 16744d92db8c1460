//! Failure injection for the end-to-end tests: a process told to fail at a named point does
//! so, so that the tests can check what the other side of a takeover (or the next start)
//! makes of it.
//!
//! Compiled into debug builds only (`cfg(debug_assertions)`, which `cargo test` builds the
//! `tapyard` binary with): a release build never reads [`ENV`], so no environment can make a
//! deployed tapyard fail on purpose. The variable holds `point=action` pairs separated by
//! commas, e.g. `TAPYARD_TEST_FAILPOINT=takeover-new-after-fds=abort`; the points and their
//! actions are described where they are checked.

/// The variable naming the failure points to hit (debug builds only).
#[cfg_attr(
    not(debug_assertions),
    allow(dead_code, reason = "a release build never reads it")
)]
pub const ENV: &str = "TAPYARD_TEST_FAILPOINT";

/// The action [`ENV`] sets for failure point `point`; always `None` in a release build.
#[cfg(debug_assertions)]
pub fn action(point: &str) -> Option<String> {
    let v = std::env::var(ENV).ok()?;
    v.split(',').find_map(|kv| {
        let (k, a) = kv.split_once('=')?;
        (k.trim() == point).then(|| a.trim().to_string())
    })
}

/// The action [`ENV`] sets for failure point `point`; always `None` in a release build.
#[cfg(not(debug_assertions))]
pub fn action(_point: &str) -> Option<String> {
    None
}

/// Whether failure point `point` is set to `what`.
pub fn is(point: &str, what: &str) -> bool {
    action(point).as_deref() == Some(what)
}
