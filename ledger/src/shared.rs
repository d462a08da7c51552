//! The ledger's table of shared allocations: virtual memory one process of
//! a container exported (`cuMemExportToShareableHandle`) and another
//! process of the same container imported and holds.
//!
//! While the exporter lives, the container is charged once, by the
//! exporter (which keeps its charge until it exits). An importer of its
//! container records what it holds here: one entry per import, naming the
//! exporter's and its own process slots and the extent it has mapped so far
//! ([`SharedSlot::bytes`]). When the exporter goes (its slot is reaped, or
//! it leaves), every entry naming it passes its bytes on to the importer in
//! the same step (under the table lock, the importer's slot and the
//! container counted up before the exporter's bytes are taken off), so the
//! container never holds less than what its live processes keep alive. The
//! importer then bears that charge ("borne") until it releases the memory
//! or exits; an entry goes with its importer's slot.
//!
//! The entry's `bytes` word carries two flags with the extent, so that the
//! importer (no lock) and the reaper (table lock) agree in one atomic step
//! who pays: [`SHARED_BORNE`] (set by the reaper once the importer's slot
//! counts the bytes) and [`SHARED_RELEASED`] (set by the importer when it
//! lets go; the table lock's holder frees the entry).

use crate::sync::{AtomicI32, AtomicU32, AtomicU64, Ordering};

use super::{
    sat_sub, ContainerSlot, Ledger, LedgerError, Membership, ProcessSlot, LEAVE_LOCK_WAIT,
    MAX_PROCESSES, SLOT_FREE, SLOT_LIVE,
};

/// Entries in the table of shared allocations.
pub const MAX_SHARED: usize = 1024;
/// Flag in [`SharedSlot::bytes`]: the importer's slot now counts the bytes.
pub const SHARED_BORNE: u64 = 1 << 62;
/// Flag in [`SharedSlot::bytes`]: the importer let go; the entry is free
/// for the next claim under the table lock.
pub const SHARED_RELEASED: u64 = 1 << 63;
/// The extent part of [`SharedSlot::bytes`].
pub const SHARED_BYTES: u64 = SHARED_BORNE - 1;

/// One imported allocation of a container's own exporter.
#[repr(C)]
pub struct SharedSlot {
    /// `SLOT_FREE` or `SLOT_LIVE`; claimed and freed under the table lock.
    pub state: AtomicU32,
    /// Container slot of both processes.
    pub container: AtomicU32,
    /// Process slot of the exporter.
    pub exporter: AtomicU32,
    /// Process slot of the importer (the holder).
    pub holder: AtomicU32,
    /// Pids, for display only.
    pub exporter_pid: AtomicI32,
    pub holder_pid: AtomicI32,
    /// Extent the importer has mapped (low 62 bits) | [`SHARED_BORNE`] |
    /// [`SHARED_RELEASED`].
    pub bytes: AtomicU64,
}

/// Who pays for an import, as its importer finds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SharePayer {
    /// The exporter, alive (or not reaped yet): the extent is recorded.
    Exporter,
    /// The importer's slot counts these bytes since the exporter went.
    Importer(u64),
}

impl Ledger {
    /// Under the table lock (waiting at most 100 ms): `m` imported memory
    /// exported by `exporter_pid` (as `m`'s PID namespace numbers it). If
    /// that is a live process of `m`'s container, an entry is claimed and
    /// its index returned; `Ok(None)` when it is not. `Full` when the table
    /// is; busy when the lock is.
    pub fn share_register(
        &self,
        m: &Membership,
        exporter_pid: i32,
    ) -> Result<Option<usize>, LedgerError> {
        let _g = self.lock_table_within(LEAVE_LOCK_WAIT)?;
        if m.has_left() || self.is_stale() {
            return Ok(None);
        }
        let f = self.file();
        let me = &f.processes[m.process];
        let ns = me.pidns.load(Ordering::Acquire);
        let Some(exporter) = self.processes_of(m.container).find_map(|(i, p)| {
            (i != m.process
                && p.pid.load(Ordering::Acquire) == exporter_pid
                && p.pidns.load(Ordering::Acquire) == ns
                && self.is_alive(i))
            .then_some(i)
        }) else {
            return Ok(None);
        };
        let Some(e) = f.shared.iter().position(|s| {
            s.state.load(Ordering::Acquire) == SLOT_FREE
                || s.bytes.load(Ordering::Acquire) & SHARED_RELEASED != 0
        }) else {
            return Err(LedgerError::Full {
                path: self.path.clone(),
                what: "shared-allocation",
            });
        };
        let s = &f.shared[e];
        s.container.store(m.container as u32, Ordering::Relaxed);
        s.exporter.store(exporter as u32, Ordering::Relaxed);
        s.holder.store(m.process as u32, Ordering::Relaxed);
        s.exporter_pid.store(exporter_pid, Ordering::Relaxed);
        s.holder_pid
            .store(me.pid.load(Ordering::Relaxed), Ordering::Relaxed);
        s.bytes.store(0, Ordering::Release);
        s.state.store(SLOT_LIVE, Ordering::Release);
        Ok(Some(e))
    }

    /// Entry `e` of `m`, if it is one (range and owner checked: the file
    /// is anyone's to scribble on).
    fn share_of(&self, m: &Membership, e: usize) -> Option<&SharedSlot> {
        let s = self.file().shared.get(e)?;
        (s.state.load(Ordering::Acquire) == SLOT_LIVE
            && s.holder.load(Ordering::Acquire) as usize == m.process)
            .then_some(s)
    }

    /// No lock: `m` maps its import `e` up to `extent`. While the exporter
    /// pays, the extent is recorded (passed on to `m` if the exporter
    /// goes); once `m` pays, what its slot counts. An entry that is not
    /// `m`'s any more (a damaged file) reads as `Importer(0)`: `m` charges
    /// itself from then on.
    pub fn share_grow(&self, m: &Membership, e: usize, extent: u64) -> SharePayer {
        let Some(s) = self.share_of(m, e) else {
            return SharePayer::Importer(0);
        };
        s.grow(extent)
    }

    /// No lock: `m` let go of its import `e`. If its slot bears the charge
    /// (the exporter went), the bytes are given back here. Returns them.
    pub fn share_release(&self, m: &Membership, e: usize) -> u64 {
        let Some(s) = self.share_of(m, e) else {
            return 0;
        };
        let f = self.file();
        s.release(m, &f.containers[m.container], &f.processes[m.process])
    }
}

impl SharedSlot {
    /// The importer maps this import up to `extent` (see [`Ledger::share_grow`]).
    pub fn grow(&self, extent: u64) -> SharePayer {
        let s = self;
        let extent = extent.min(SHARED_BYTES);
        let mut w = s.bytes.load(Ordering::Acquire);
        loop {
            if w & SHARED_RELEASED != 0 {
                return SharePayer::Importer(0);
            }
            if w & SHARED_BORNE != 0 {
                return SharePayer::Importer(w & SHARED_BYTES);
            }
            if extent <= w & SHARED_BYTES {
                return SharePayer::Exporter;
            }
            match s
                .bytes
                .compare_exchange_weak(w, extent, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return SharePayer::Exporter,
                Err(x) => w = x,
            }
        }
    }

    /// The importer `m` (of container slot `c`, process slot `p`) lets go
    /// of this import: if its slot bears the charge, the bytes are given
    /// back. Returns them.
    pub fn release(&self, m: &Membership, c: &ContainerSlot, p: &ProcessSlot) -> u64 {
        let old = self.bytes.fetch_or(SHARED_RELEASED, Ordering::AcqRel);
        if old & (SHARED_BORNE | SHARED_RELEASED) == SHARED_BORNE {
            let b = old & SHARED_BYTES;
            crate::books::release(m, c, p, b);
            return b;
        }
        0
    }

    /// The reaper, under the table lock, as the exporter goes: pass the
    /// extent the importer mapped on to the importer's slot `hp` and its
    /// container `cs`: counted there first, flagged borne second, so an
    /// importer that sees the flag finds the bytes in its slot; undone if
    /// the importer let go (or grew) meanwhile, then tried again. Returns
    /// the bytes passed on (`None`: released, or passed on before).
    pub fn pass_on(&self, hp: &ProcessSlot, cs: &ContainerSlot) -> Option<u64> {
        let mut w = self.bytes.load(Ordering::Acquire);
        loop {
            if w & (SHARED_BORNE | SHARED_RELEASED) != 0 {
                return None;
            }
            let b = w & SHARED_BYTES;
            hp.used.fetch_add(b, Ordering::AcqRel);
            crate::sync::point();
            let new = cs.used.fetch_add(b, Ordering::AcqRel).saturating_add(b);
            cs.peak.fetch_max(new, Ordering::Relaxed);
            crate::sync::point();
            match self.bytes.compare_exchange(
                w,
                w | SHARED_BORNE,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(b),
                Err(x) => {
                    sat_sub(&hp.used, b);
                    sat_sub(&cs.used, b);
                    w = x;
                }
            }
        }
    }
}

impl Ledger {
    /// Does process slot `i` export memory an importer of its container
    /// holds and does not pay for yet? (Then its bytes are passed on by a
    /// reap, under the table lock, not given back by `leave`.)
    pub(super) fn exports_shared(&self, i: usize) -> bool {
        self.file().shared.iter().any(|s| {
            s.state.load(Ordering::Acquire) == SLOT_LIVE
                && s.exporter.load(Ordering::Acquire) as usize == i
                && s.bytes.load(Ordering::Acquire) & (SHARED_BORNE | SHARED_RELEASED) == 0
        })
    }

    /// Under the table lock, before process slot `i` (dead or leaving) is
    /// freed: if it was `live` (a valid live slot), imports of what it
    /// exported pass their bytes on to their importers (importer and
    /// container counted up first); entries it held, and released ones,
    /// are freed.
    pub(super) fn share_pass_on(&self, i: usize, live: bool) {
        let f = self.file();
        for s in f.shared.iter() {
            if s.state.load(Ordering::Acquire) != SLOT_LIVE {
                continue;
            }
            let holder = s.holder.load(Ordering::Acquire) as usize;
            if holder == i || s.bytes.load(Ordering::Acquire) & SHARED_RELEASED != 0 {
                // Its bytes, if borne, are in the holder's slot, which is
                // given back with it.
                s.state.store(SLOT_FREE, Ordering::Release);
                continue;
            }
            if !live || s.exporter.load(Ordering::Acquire) as usize != i {
                continue;
            }
            let c = s.container.load(Ordering::Acquire) as usize;
            let Some(cs) = f.containers.get(c) else {
                s.state.store(SLOT_FREE, Ordering::Release);
                continue;
            };
            let valid = holder < MAX_PROCESSES
                && f.processes[holder].state.load(Ordering::Acquire) == SLOT_LIVE
                && f.processes[holder].container.load(Ordering::Acquire) as usize == c
                && f.processes[i].container.load(Ordering::Acquire) as usize == c;
            if !valid {
                tracing::warn!("shared allocation entry names slots of other containers: freed");
                s.state.store(SLOT_FREE, Ordering::Release);
                continue;
            }
            if let Some(b) = s.pass_on(&f.processes[holder], cs) {
                tracing::debug!(
                    "process slot {i} exported {b} bytes process slot {holder} holds: passed on to it"
                );
            }
        }
    }

    /// Live entries (tools, tests): (exporter pid, holder pid, bytes, borne).
    pub fn shared_allocations(&self) -> Vec<(i32, i32, u64, bool)> {
        self.file()
            .shared
            .iter()
            .filter(|s| {
                s.state.load(Ordering::Acquire) == SLOT_LIVE
                    && s.bytes.load(Ordering::Acquire) & SHARED_RELEASED == 0
            })
            .map(|s| {
                let w = s.bytes.load(Ordering::Acquire);
                (
                    s.exporter_pid.load(Ordering::Relaxed),
                    s.holder_pid.load(Ordering::Relaxed),
                    w & SHARED_BYTES,
                    w & SHARED_BORNE != 0,
                )
            })
            .collect()
    }
}
