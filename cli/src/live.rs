//! Ports added and removed while the node runs: the four library calls the node needs, in one
//! place.
//!
//! The library's live topology (`Datapath::add_port`/`remove_port`, `Runtime::add_port`/
//! `remove_port`) is not in this tree yet: until it is, each call fails with
//! [`NOT_YET`], so `port add`, `port del`, the CNI requests and a reload that changes a
//! bridge's `ports` are refused with that message and change nothing.

use std::io;
use std::sync::Arc;

use tapyard::port::Port;
use tapyard::runtime::Runtime;
use tapyard::{BridgeId, Datapath, PortId};

/// The refusal while the library lacks live ports.
pub const NOT_YET: &str = "live ports need the library's live topology";

/// Adds a datapath port called `name` to `bridge` (`Datapath::add_port`).
pub fn add_port(dp: &Datapath, name: &str, bridge: BridgeId) -> Result<PortId, String> {
    let _ = (dp, name, bridge);
    Err(NOT_YET.into())
}

/// Removes datapath port `id` that has no driver in the runtime (`Datapath::remove_port`).
pub fn remove_port(dp: &Datapath, id: PortId) -> Result<(), String> {
    let _ = (dp, id);
    Err(NOT_YET.into())
}

/// Hands the device of port `id` to the workers (`Runtime::add_port`).
pub fn attach(rt: &Runtime, id: PortId, port: Arc<dyn Port>) -> io::Result<()> {
    let _ = (rt, id, port);
    Err(io::Error::other(NOT_YET))
}

/// Takes the device of port `id` back from the workers and removes the datapath port
/// (`Runtime::remove_port` does both); its fd closes when the last `Arc` goes. `None` when
/// the runtime has no driver for `id` (then nothing changed).
pub fn detach(rt: &Runtime, id: PortId) -> Option<Arc<dyn Port>> {
    let _ = (rt, id);
    None
}
