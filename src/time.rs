//! Time as a value: the core never reads a clock, callers pass [`Instant`]s in.

use std::fmt;
use std::ops::{Add, Sub};
use std::time::Duration;

/// A point in time, in microseconds since an arbitrary epoch chosen by the caller.
///
/// The datapath only compares and subtracts instants, so tests use a fake clock that starts at
/// zero, and the runtime uses [`Clock`] (`CLOCK_MONOTONIC`: the time since boot).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Instant(u64);

impl Instant {
    /// The epoch.
    pub const ZERO: Instant = Instant(0);

    /// An instant `us` microseconds after the epoch.
    pub const fn from_micros(us: u64) -> Instant {
        Instant(us)
    }

    /// An instant `ms` milliseconds after the epoch.
    pub const fn from_millis(ms: u64) -> Instant {
        Instant(ms.saturating_mul(1000))
    }

    /// An instant `s` seconds after the epoch.
    pub const fn from_secs(s: u64) -> Instant {
        Instant(s.saturating_mul(1_000_000))
    }

    /// Microseconds since the epoch.
    pub const fn micros(self) -> u64 {
        self.0
    }

    /// Milliseconds since the epoch.
    pub const fn millis(self) -> u64 {
        self.0 / 1000
    }

    /// The time from `earlier` to `self`, zero if `earlier` is later.
    pub fn saturating_since(self, earlier: Instant) -> Duration {
        Duration::from_micros(self.0.saturating_sub(earlier.0))
    }
}

impl Add<Duration> for Instant {
    type Output = Instant;
    fn add(self, d: Duration) -> Instant {
        Instant(
            self.0
                .saturating_add(u64::try_from(d.as_micros()).unwrap_or(u64::MAX)),
        )
    }
}

impl Sub<Instant> for Instant {
    type Output = Duration;
    fn sub(self, earlier: Instant) -> Duration {
        self.saturating_since(earlier)
    }
}

impl fmt::Debug for Instant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:06}s", self.0 / 1_000_000, self.0 % 1_000_000)
    }
}

impl From<Instant> for smoltcp::time::Instant {
    fn from(i: Instant) -> Self {
        smoltcp::time::Instant::from_micros(i64::try_from(i.0).unwrap_or(i64::MAX))
    }
}

/// The system's monotonic clock (`CLOCK_MONOTONIC`, microseconds since boot) as [`Instant`]s.
///
/// Every `Clock` of every process on the host reads the same time, so times that a table keeps
/// in shared memory (the conntrack file, [`crate::conntrack::Conntrack::open_file`]) mean the
/// same after a restart; tests that need a fake clock pass their own `Instant`s instead.
#[derive(Clone, Copy, Debug, Default)]
pub struct Clock {
    _private: (),
}

impl Clock {
    /// The monotonic clock.
    pub fn new() -> Clock {
        Clock { _private: () }
    }

    /// The current time.
    pub fn now(&self) -> Instant {
        Instant(crate::sys::monotonic_us())
    }
}
