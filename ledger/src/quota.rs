//! The quota: reserving and releasing bytes against a container's row.

use super::*;

impl Ledger {
    /// Lock-free: reserve `bytes` against the container's quota in one atomic
    /// step (CAS), recording them on the process slot. Never lets the
    /// container's `used` pass its quota when enforcing.
    #[inline]
    pub fn try_reserve(&self, m: &Membership, bytes: u64) -> Result<(), QuotaExceeded> {
        if bytes == 0 {
            return Ok(());
        }
        let Some(_in) = m.enter() else {
            // Left (the process is exiting): nothing may be charged any more.
            return Err(QuotaExceeded {
                quota: 0,
                used: 0,
                requested: bytes,
            });
        };
        let f = self.file();
        let c = &f.containers[m.container];
        let p = &f.processes[m.process];
        // Crash consistency: while `pending` is non-zero the container may
        // count up to `pending` bytes that the process slot does not show
        // (yet). `ops` is bumped before `used` changes (see `resync`).
        p.pending.fetch_add(bytes, Ordering::AcqRel);
        c.ops.fetch_add(1, Ordering::AcqRel);
        let mut cur = c.used.load(Ordering::Acquire);
        loop {
            let quota = c.quota.load(Ordering::Acquire);
            let enforce = quota != 0 && c.enforce_off.load(Ordering::Relaxed) == 0;
            let new = match cur.checked_add(bytes) {
                Some(n) if !enforce || n <= quota => n,
                _ => {
                    p.pending.fetch_sub(bytes, Ordering::AcqRel);
                    c.oom_count.fetch_add(1, Ordering::Relaxed);
                    return Err(QuotaExceeded {
                        quota,
                        used: cur,
                        requested: bytes,
                    });
                }
            };
            match c
                .used
                .compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    if new > c.peak.load(Ordering::Relaxed) {
                        c.peak.fetch_max(new, Ordering::Relaxed);
                    }
                    p.used.fetch_add(bytes, Ordering::AcqRel);
                    p.pending.fetch_sub(bytes, Ordering::AcqRel);
                    return Ok(());
                }
                Err(x) => cur = x,
            }
        }
    }

    /// Lock-free: give back `bytes` previously reserved by `m`. Giving back
    /// more than the process holds logs a warning and clamps.
    #[inline]
    pub fn release(&self, m: &Membership, bytes: u64) {
        if bytes == 0 {
            return;
        }
        let Some(_in) = m.enter() else {
            return; // left: `leave` gave everything back already
        };
        let f = self.file();
        let p = &f.processes[m.process];
        let c = &f.containers[m.container];
        // Process first, container second, `pending` around both: a crash in
        // between leaves the container over-counted (safe), never
        // under-counted, and flagged for an exact recount.
        p.pending.fetch_add(bytes, Ordering::AcqRel);
        c.ops.fetch_add(1, Ordering::AcqRel);
        let took = sat_sub(&p.used, bytes);
        sat_sub(&c.used, took);
        p.pending.fetch_sub(bytes, Ordering::AcqRel);
        if took != bytes {
            tracing::warn!(
                "release of {bytes} bytes but process slot {} held {took}: clamped",
                m.process
            );
        }
    }

    /// Put this process's own counter back to `truth` (what it holds, as
    /// it knows) if damage changed it, and have the container recounted
    /// from its processes' counters (see `resync`). Only while no
    /// reservation of this process is in flight. While an entry of the
    /// table of shared allocations names this process, a counter above
    /// `truth` is left alone (it may carry what an exporter that died
    /// passed on and this process has not adopted yet; a count too high
    /// only refuses more). Returns whether anything was wrong. For the
    /// watcher: the books converge to what the processes hold after stray
    /// writes.
    pub fn repair_counts(&self, m: &Membership, truth: u64) -> bool {
        let Some(_in) = m.enter() else { return false };
        if m.inflight.load(Ordering::SeqCst) != 1 {
            return false; // another thread is reserving: look next time
        }
        let f = self.file();
        let p = &f.processes[m.process];
        let c = &f.containers[m.container];
        if p.pending.load(Ordering::SeqCst) != 0 {
            return false;
        }
        let seen = p.used.load(Ordering::SeqCst);
        let me = m.process as u32;
        let sharing = f.shared.iter().any(|e| {
            e.state.load(Ordering::Acquire) != SLOT_FREE
                && (e.holder.load(Ordering::Acquire) == me
                    || e.exporter.load(Ordering::Acquire) == me)
        });
        let own_wrong = seen < truth || (seen > truth && !sharing);
        if own_wrong
            && p.used
                .compare_exchange(seen, truth, Ordering::SeqCst, Ordering::SeqCst)
                .is_err()
        {
            return false;
        }
        // The container's count must equal the sum of its processes'; a
        // recount is cheap under the table lock and exact (`resync`).
        let sum: u64 = self
            .processes_of(m.container)
            .map(|(_, p)| p.used.load(Ordering::SeqCst))
            .fold(0u64, |a, b| a.saturating_add(b));
        let busy = self
            .processes_of(m.container)
            .any(|(_, p)| p.pending.load(Ordering::SeqCst) != 0);
        let container_wrong = !busy && c.used.load(Ordering::SeqCst) != sum;
        if !own_wrong && !container_wrong {
            return false;
        }
        drop(_in);
        c.suspect.fetch_add(1, Ordering::SeqCst);
        if let Some(_g) = self.try_lock_table() {
            self.resync(m.container);
        }
        tracing::warn!(
            "ledger {}: container {}'s counts were damaged (this process's slot said {seen}, it holds {truth}); recounted from its processes",
            self.path.display(),
            c.id_str()
        );
        true
    }

    /// Charge `bytes` that this process already holds on the device to
    /// `m`, whatever the quota (re-registering after a move to a rebuilt
    /// ledger: they exist, so they count; the container then refuses until
    /// it is back under its quota).
    pub fn register_held(&self, m: &Membership, bytes: u64) {
        if bytes == 0 {
            return;
        }
        let Some(_in) = m.enter() else { return };
        let f = self.file();
        let p = &f.processes[m.process];
        let c = &f.containers[m.container];
        p.pending.fetch_add(bytes, Ordering::AcqRel);
        c.ops.fetch_add(1, Ordering::AcqRel);
        let new = c
            .used
            .fetch_add(bytes, Ordering::AcqRel)
            .saturating_add(bytes);
        c.peak.fetch_max(new, Ordering::Relaxed);
        p.used.fetch_add(bytes, Ordering::AcqRel);
        p.pending.fetch_sub(bytes, Ordering::AcqRel);
    }
}
