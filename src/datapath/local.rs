//! The router's local stack at the datapath's edge: the consumer's handle on its queue
//! ([`Control::local_stack`]) and the way its answers leave ([`Datapath::inject`]), as frames
//! the router makes, outside any worker's batch.

use super::{Control, Datapath, Worker};
use crate::base::{IfaceId, Verdict};
use crate::buf::Batch;
use crate::l3::local::LocalStack;
use crate::stats::DropReason;
use crate::time::Instant;

impl Control<'_> {
    /// The router's local stack queue (`None` without a router): the TCP segments to the
    /// ports it serves ([`LocalStack::set_ports`]) of the router's own addresses, for a
    /// thread that answers them ([`crate::runtime::local`]).
    pub fn local_stack(&self) -> Option<LocalStack> {
        let r = self.dp.router.as_ref()?;
        Some(LocalStack::new(r.local.clone()))
    }
}

impl Datapath {
    /// Appends `frame` (a whole Ethernet frame, addressed already) to `batch` as a frame the
    /// router sends out of interface `via`, with its egress verdict (onto the interface's
    /// bridge, or out of its own port), for [`Datapath::dispatch`] with the same worker
    /// `w`. For frames made outside the datapath's batches (the local stack's answers): the
    /// worker is online from here until that dispatch, as after [`Datapath::process`]. A
    /// frame that does not fit the worker's buffers, or with no buffer free, is dropped and
    /// counted (`generated_lost`).
    pub fn inject(
        &self,
        w: &mut Worker,
        via: IfaceId,
        frame: &[u8],
        batch: &mut Batch,
        now: Instant,
    ) -> Verdict {
        w.online();
        let Some(mut b) = w.pool.get() else {
            w.shard.totals.generated_lost.add(1);
            return Verdict::Drop(DropReason::Oversize);
        };
        let Some(room) = b.room_mut().get_mut(..frame.len()) else {
            w.pool.put(b);
            w.shard.totals.generated_lost.add(1);
            return Verdict::Drop(DropReason::Oversize);
        };
        room.copy_from_slice(frame);
        b.set_len(frame.len());
        let v = self.egress(via, &mut b, now);
        w.shard.totals.generated.add(1);
        batch.bufs.push(b);
        batch.verdicts.push(v);
        v
    }
}
