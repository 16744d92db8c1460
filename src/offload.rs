//! Software completion of offload work for ports that cannot take it (placeholder until the
//! virtio-net module lands).

use crate::buf::PacketBuf;
use crate::stats::DropReason;

/// Completes a frame's offload work in software and hands each resulting wire frame to `tx`.
pub(crate) fn send_completed(
    _buf: &PacketBuf,
    _tx: &mut dyn FnMut(&[u8]) -> Result<(), DropReason>,
) -> Result<(), DropReason> {
    Err(DropReason::BadOffload)
}
