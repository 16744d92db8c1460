//! Sets `cfg(tapyard_root)` when the build runs as root, so that the tests that need root
//! (TAP devices, network namespaces) are `ignored` for anyone else instead of passing without
//! running. `TAPYARD_TEST_AS_USER=1` builds as a user would even as root. Nothing else reads
//! the cfg: the code built is the same either way. `cli/` and `cni/` use the same script.

include!("build/tapyard_root.rs");
