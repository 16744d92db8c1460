//! Ports added and removed while the node runs: the four library calls of its live topology
//! that the node makes, in one place, with their errors as the control socket's messages.
//!
//! Order of use (see [`crate::ports`]): [`add_port`] then [`attach`] to add; [`detach`] to
//! remove (the runtime removes the datapath port too), or [`remove_port`] for a port that
//! never got a driver.

use std::io;
use std::sync::Arc;

use tapyard::port::Port;
use tapyard::runtime::Runtime;
use tapyard::{BridgeId, Datapath, PortId};

use super::BoxError;

/// Adds a datapath port called `name` to `bridge` (`Control::add_port`).
pub fn add_port(dp: &Datapath, name: &str, bridge: BridgeId) -> Result<PortId, BoxError> {
    dp.control().add_port(name, bridge).map_err(BoxError::from)
}

/// Removes datapath port `id` that has no driver in the runtime (`Control::remove_port`).
pub fn remove_port(dp: &Datapath, id: PortId) -> Result<(), BoxError> {
    dp.control().remove_port(id).map_err(BoxError::from)
}

/// Hands the device of port `id` to the workers (`Runtime::add_port`).
pub fn attach(rt: &Runtime, id: PortId, port: Arc<dyn Port>) -> io::Result<()> {
    rt.add_port(id, port)
}

/// Takes the device of port `id` back from the workers and removes the datapath port
/// (`Runtime::remove_port` does both, returning once no worker uses the device); its fd
/// closes when the last `Arc` goes. `None` when the runtime has no driver for `id` (then
/// nothing changed).
pub fn detach(rt: &Runtime, id: PortId) -> Option<Arc<dyn Port>> {
    rt.remove_port(id)
}
