//! The library's end-to-end tests, in one binary: real TAP devices (plain, offload,
//! multi-queue, persistent) carrying traffic between network namespaces, driven in-process.
//! They need root and are ignored unless built as root (see `common`); as root a missing tool
//! skips a test, or fails it under `CI=true`. `cargo test --test e2e netns_nat::` runs one
//! module.

#[path = "../common/mod.rs"]
mod common;

mod netns_bridge;
mod netns_busy_poll;
mod netns_live;
mod netns_martian;
mod netns_multi_queue;
mod netns_nat;
mod netns_persist;
mod netns_router;
mod netns_router6;
mod netns_tap_down;
mod netns_uring;
