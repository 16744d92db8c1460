//! The live topology: ports added to a bridge and removed through `&self` while workers
//! forward traffic, and the quarantine that keeps a removed port's id from a new port until
//! no worker can still hold it (see the module docs of [`crate::datapath`]).

use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;

use super::builder::check_name;
use super::{word, ConfigError, Control, Datapath, PortKind, Quarantined, Topo};
use crate::base::{BridgeId, PortId};
use crate::l2::guard::PortGuard;

impl Control<'_> {
    /// Adds a port called `name` to `bridge` while the datapath runs, and returns its id.
    /// Workers see it at their next batch; give it a driver with
    /// [`Runtime::add_port`](crate::runtime::Runtime::add_port). The id is the lowest free
    /// one (ids of removed ports are reused once their quarantine is over). Errors name the
    /// bad value: a name that is invalid or already used, an unknown bridge, or every id of
    /// [`Control::max_ports`] in use or quarantined.
    ///
    /// Control plane: takes the topology mutex, copies the bridge's member list once.
    ///
    /// # Example
    /// ```
    /// use tapyard::{Batch, BridgeConfig, Datapath, Instant, PacketBuf, Verdict};
    /// let mut b = Datapath::builder();
    /// let br = b.add_bridge(BridgeConfig::new("cni0")).unwrap();
    /// let p0 = b.add_port("veth0", Some(br)).unwrap();
    /// let dp = b.build();
    /// // A pod comes: its port joins the bridge while the datapath is shared.
    /// let p1 = dp.control().add_port("veth1", br).unwrap();
    /// assert_eq!(dp.control().port_by_name("veth1"), Some(p1));
    /// let mut w = dp.worker();
    /// let mut batch = Batch::new();
    /// let frame = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 2, 0, 0, 0, 0, 1, 0x08, 0x06, 0, 0];
    /// let mut buf = PacketBuf::from_frame(&frame);
    /// buf.port = p0;
    /// batch.push(buf).unwrap();
    /// dp.process(&mut w, Instant::ZERO, &mut batch);
    /// let mut sent = vec![];
    /// dp.dispatch(&mut w, &batch, |port, _| { sent.push(port); Ok(()) });
    /// assert_eq!(sent, vec![p1]);
    /// // The pod goes: its port and its FDB entries go with it.
    /// dp.control().remove_port(p1).unwrap();
    /// assert!(dp.control().port_name(p1).is_none());
    /// assert!(dp.control().add_port("veth0", br).unwrap_err().to_string().contains("used twice"));
    /// ```
    pub fn add_port(&self, name: &str, bridge: BridgeId) -> Result<PortId, ConfigError> {
        let dp = self.dp;
        check_name("port", name)?;
        let br = self
            .bridge(bridge)
            .ok_or(ConfigError::NoSuchBridge(bridge))?;
        let mut t = dp.topo.lock();
        dp.reclaim(&mut t);
        // At capacity with ids in quarantine: busy workers end it within a batch or two, so
        // wait for that (bounded, about 10 ms) rather than refuse a port that fits.
        let mut tries = 0;
        while t.free.is_empty()
            && t.names.len() >= dp.ports.len()
            && !t.quarantine.is_empty()
            && tries < 100
        {
            drop(t);
            std::thread::sleep(std::time::Duration::from_micros(100));
            t = dp.topo.lock();
            dp.reclaim(&mut t);
            tries += 1;
        }
        if t.names.iter().any(|n| n.as_deref() == Some(name)) {
            return Err(ConfigError::DuplicateName {
                kind: "port",
                name: name.to_string(),
            });
        }
        let id = match t.free.pop_first() {
            Some(id) => id,
            None if t.names.len() < dp.ports.len() => {
                t.names.push(None);
                // Below max_ports, itself at most 65535.
                crate::narrow::low16((t.names.len() - 1) as u64)
            }
            None => {
                return Err(ConfigError::CapacityFull {
                    name: name.to_string(),
                    max_ports: dp.ports.len(),
                })
            }
        };
        let i = usize::from(id);
        t.names[i] = Some(name.to_string());
        // A fresh id starts from zero (a reclaimed one is no longer written by any worker;
        // a never-used one only by frames stamped with a bogus port).
        for sh in dp.shards.lock().iter() {
            if let Some(c) = sh.ports.get(i) {
                c.reset();
            }
        }
        dp.ports[i].store(
            word::encode(PortKind::External, Some(bridge)),
            Ordering::Release,
        );
        let mut members = br.ports.load().to_vec();
        members.push(PortId(id));
        br.ports.store(Arc::new(members));
        br.members.fetch_add(1, Ordering::Release);
        Ok(PortId(id))
    }

    /// Removes a port added by the builder or by [`Control::add_port`], as Linux does when a
    /// veth goes away: it leaves its bridge's flood list and its FDB entries (static ones
    /// too) are removed; neighbour entries learned through it age as usual, and conntrack
    /// entries stay until their timeout. Frames received on it from now on are dropped as
    /// `unknown_port`; frames already forwarded to it are dropped at transmit as `port_gone`.
    /// Its id is quarantined until every worker has passed a quiescent point (twice; see the
    /// module docs), then reused. Detach its driver from a runtime with
    /// [`Runtime::remove_port`](crate::runtime::Runtime::remove_port), which calls this.
    ///
    /// Errors: [`ConfigError::NoSuchPort`] for an id with no live port,
    /// [`ConfigError::NotRemovable`] for a router interface's virtual port or uplink,
    /// [`ConfigError::Attached`] for a port whose driver a runtime or pump still holds (its
    /// id could otherwise go to a new port while the old driver still speaks for it).
    pub fn remove_port(&self, id: PortId) -> Result<(), ConfigError> {
        let dp = self.dp;
        let mut t = dp.topo.lock();
        if t.attached.get(usize::from(id.0)).is_some_and(|&n| n > 0) {
            let name = t.names.get(usize::from(id.0)).cloned().flatten();
            return Err(ConfigError::Attached {
                name: name.unwrap_or_else(|| format!("#{}", id.0)),
            });
        }
        dp.remove_locked(&mut t, id)
    }

    /// Gives bridged port `id` a spoof guard (`Some`), or takes it away (`None`): from the
    /// workers' next batch on, every frame the port sends must come from the guard's MAC and
    /// addresses ([`PortGuard::check`]); the others are dropped under their `spoofed_*`
    /// [`DropReason`](crate::stats::DropReason) and counted in the port's
    /// [`PortStats::spoofed`](crate::stats::PortStats::spoofed), before the bridge learns
    /// their source or the router sees them. Replacing a guard is one step: no frame sees
    /// the port unguarded in between. A port without a guard pays nothing for the feature.
    ///
    /// Errors: [`ConfigError::NoSuchPort`] for an id with no live port,
    /// [`ConfigError::NotGuardable`] for a port that is not an external port on a bridge (a
    /// router interface's port, a port on no bridge).
    ///
    /// Control plane: takes the topology mutex and copies the table of guards.
    ///
    /// # Example
    /// ```
    /// use tapyard::l2::guard::PortGuard;
    /// use tapyard::{Batch, BridgeConfig, Datapath, DropReason, Instant, MacAddr, PacketBuf, Verdict};
    /// let mut b = Datapath::builder();
    /// let br = b.add_bridge(BridgeConfig::new("cni0")).unwrap();
    /// let pod = b.add_port("veth0", Some(br)).unwrap();
    /// b.add_port("veth1", Some(br)).unwrap();
    /// let dp = b.build();
    /// let mac = MacAddr([2, 0, 0, 0, 0, 1]);
    /// let guard = PortGuard::new(mac, ["10.244.0.5".parse().unwrap()]).unwrap();
    /// dp.control().set_port_guard(pod, Some(guard)).unwrap();
    /// assert_eq!(dp.control().port_guard(pod), Some(guard));
    /// // A broadcast from another MAC than the pod's.
    /// let frame = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 2, 0, 0, 0, 0, 9, 0x88, 0xb5, 0, 0];
    /// let mut buf = PacketBuf::from_frame(&frame);
    /// buf.port = pod;
    /// let mut batch = Batch::new();
    /// batch.push(buf).unwrap();
    /// let mut w = dp.worker();
    /// dp.process(&mut w, Instant::ZERO, &mut batch);
    /// assert_eq!(batch.verdicts()[0], Verdict::Drop(DropReason::SpoofedMac));
    /// dp.dispatch(&mut w, &batch, |_, _| Ok(()));
    /// assert_eq!(dp.control().stats().port("veth0").unwrap().spoofed, 1);
    /// ```
    pub fn set_port_guard(&self, id: PortId, guard: Option<PortGuard>) -> Result<(), ConfigError> {
        let dp = self.dp;
        let t = dp.topo.lock();
        let i = usize::from(id.0);
        let live = t.names.get(i).is_some_and(Option::is_some);
        let slot = dp
            .ports
            .get(i)
            .filter(|_| live)
            .ok_or(ConfigError::NoSuchPort(id))?;
        let w = slot.load(Ordering::Relaxed);
        let bridge = match (word::kind(w), word::bridge(w)) {
            (word::K_EXTERNAL, Some(b)) => b,
            _ => {
                return Err(ConfigError::NotGuardable {
                    name: t.names[i].clone().unwrap_or_default(),
                })
            }
        };
        match guard {
            // The table first, then the word: a worker that sees the bit finds the guard.
            Some(g) => {
                dp.set_guard_slot(i, Some(g));
                slot.store(word::external(bridge, true), Ordering::Release);
            }
            // The word first, then the table (a worker between the two reads no guard and
            // lets the frame through, as it would a moment later).
            None => {
                slot.store(word::external(bridge, false), Ordering::Release);
                dp.set_guard_slot(i, None);
            }
        }
        Ok(())
    }

    /// The spoof guard of port `id`, if it has one ([`Control::set_port_guard`]).
    pub fn port_guard(&self, id: PortId) -> Option<PortGuard> {
        let w = self
            .dp
            .ports
            .get(usize::from(id.0))?
            .load(Ordering::Acquire);
        if !word::is_guarded(w) {
            return None;
        }
        *self.dp.guards.load().get(usize::from(id.0))?
    }

    /// Ends the quarantines that can end now and returns how many removed port ids are still
    /// quarantined (waiting for a worker that was online at the removal to finish its batch).
    /// [`Control::add_port`] does this itself before it picks an id.
    pub fn reclaim_ports(&self) -> usize {
        let dp = self.dp;
        let mut t = dp.topo.lock();
        dp.reclaim(&mut t);
        t.quarantine.len()
    }
}

impl Datapath {
    /// Notes that a runtime or pump holds a driver for port `id`.
    pub(crate) fn attach(&self, id: PortId) {
        if let Some(n) = self.topo.lock().attached.get_mut(usize::from(id.0)) {
            *n += 1;
        }
    }

    /// Notes that a runtime or pump let go of its driver for port `id` and, with `remove`,
    /// removes the port (as [`Control::remove_port`]) in the same step.
    pub(crate) fn detach(&self, id: PortId, remove: bool) -> Result<(), ConfigError> {
        let mut t = self.topo.lock();
        if let Some(n) = t.attached.get_mut(usize::from(id.0)) {
            *n = n.saturating_sub(1);
        }
        if remove {
            self.remove_locked(&mut t, id)
        } else {
            Ok(())
        }
    }

    /// [`Control::remove_port`] under the topology lock, once the caller checked drivers.
    fn remove_locked(&self, t: &mut Topo, id: PortId) -> Result<(), ConfigError> {
        let w = self.removable_word(t, id)?;
        let i = usize::from(id.0);
        let slot = &self.ports[i];
        let bridge = word::bridge(w);
        slot.store(word::removed(bridge), Ordering::Relaxed);
        // Pairs with `Worker::online`'s fence: a worker that goes online after this sees
        // the port removed, and one that was online before is in the snapshot below.
        fence(Ordering::SeqCst);
        if let Some(b) = bridge {
            let br = &self.bridges[usize::from(b.0)];
            br.members.fetch_sub(1, Ordering::Release);
            let members: Vec<PortId> = br
                .ports
                .load()
                .iter()
                .copied()
                .filter(|&p| p != id)
                .collect();
            br.ports.store(Arc::new(members));
            br.fdb.remove_port(id);
        }
        t.names[i] = None;
        if word::is_guarded(w) {
            self.set_guard_slot(i, None);
        }
        let online = Self::online_workers(t);
        t.quarantine.push(Quarantined {
            id,
            bridge,
            online,
            flushed: false,
        });
        self.reclaim(t);
        Ok(())
    }

    /// Replaces the guard table with one where port `i` has `guard` (under the topology
    /// mutex), trimmed to the highest guarded id.
    fn set_guard_slot(&self, i: usize, guard: Option<PortGuard>) {
        let mut table = self.guards.load().to_vec();
        if table.len() <= i {
            table.resize(i + 1, None);
        }
        table[i] = guard;
        while table.last().is_some_and(Option::is_none) {
            table.pop();
        }
        self.guards.store(Arc::new(table));
    }

    /// Whether `id` is a live port [`Control::remove_port`] would remove; its error if not.
    pub(crate) fn check_removable(&self, id: PortId) -> Result<(), ConfigError> {
        let t = self.topo.lock();
        self.removable_word(&t, id).map(|_| ())
    }

    /// Whether `id` is a live port frames are sent to (not a virtual port, not removed).
    pub(crate) fn is_sendable(&self, id: PortId) -> bool {
        self.ports
            .get(usize::from(id.0))
            .is_some_and(|w| word::sendable(w.load(Ordering::Acquire)))
    }

    /// The word of port `id` if it is live and removable.
    fn removable_word(&self, t: &Topo, id: PortId) -> Result<u64, ConfigError> {
        let i = usize::from(id.0);
        let slot = self.ports.get(i).ok_or(ConfigError::NoSuchPort(id))?;
        let w = slot.load(Ordering::Relaxed);
        let name = || t.names.get(i).cloned().flatten().unwrap_or_default();
        match word::kind(w) {
            word::K_EXTERNAL => Ok(w),
            word::K_ROUTED => Err(ConfigError::NotRemovable {
                name: name(),
                what: "a router interface's uplink",
            }),
            word::K_VIRTUAL => Err(ConfigError::NotRemovable {
                name: name(),
                what: "a router interface's port on its bridge",
            }),
            _ => Err(ConfigError::NoSuchPort(id)),
        }
    }

    /// The workers online now, with their counters.
    fn online_workers(t: &mut Topo) -> Vec<(Arc<super::Epoch>, u64)> {
        // A worker that was dropped holds no reference any more.
        t.epochs.retain(|e| Arc::strong_count(e) > 1);
        t.epochs
            .iter()
            .filter_map(|e| {
                let v = e.0.load(Ordering::Acquire);
                (v & 1 == 1).then(|| (e.clone(), v))
            })
            .collect()
    }

    /// Moves quarantined ids on. Phase 1 waits for the workers online at the removal: once
    /// they are past a quiescent point, nobody can still learn the port in the FDB (learning
    /// follows a pass-1 read of the live word in the same online period), so its entries are
    /// flushed for good. Phase 2 waits for the workers online at that flush, which may have
    /// looked up an entry made by a racing learner; after it, no verdict anywhere names the
    /// id and it is free.
    fn reclaim(&self, t: &mut Topo) {
        let passed = |q: &Quarantined| {
            q.online
                .iter()
                .all(|(e, v)| e.0.load(Ordering::Acquire) != *v)
        };
        let mut i = 0;
        while i < t.quarantine.len() {
            if !passed(&t.quarantine[i]) {
                i += 1;
                continue;
            }
            if !t.quarantine[i].flushed {
                let q = &t.quarantine[i];
                if let Some(b) = q.bridge {
                    self.bridges[usize::from(b.0)].fdb.remove_port(q.id);
                }
                fence(Ordering::SeqCst);
                let online = Self::online_workers(t);
                let q = &mut t.quarantine[i];
                q.online = online;
                q.flushed = true;
                continue;
            }
            let q = t.quarantine.swap_remove(i);
            self.ports[usize::from(q.id.0)].store(0, Ordering::Release);
            t.free.insert(q.id.0);
        }
    }
}
