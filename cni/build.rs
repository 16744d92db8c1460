//! The library's build script (../build.rs): sets `cfg(tapyard_root)` when built as root, so
//! the root tests run there and are `ignored` for anyone else.

include!("../build/tapyard_root.rs");
