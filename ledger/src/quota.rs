//! The quota: reserving and releasing bytes against a container's row.
//!
//! [`books`] holds the protocol's steps on one container slot and one
//! process slot, the same code whether the slots are in the mapped file
//! (the `Ledger` methods here, `leave` and the reaper) or built in memory
//! for the model tests (`tests/loom.rs`, under `--cfg loom`).

use super::*;

impl Ledger {
    /// Lock-free: reserve `bytes` against the container's quota in one atomic
    /// step (CAS), recording them on the process slot. Never lets the
    /// container's `used` pass its quota when enforcing.
    #[inline]
    pub fn try_reserve(&self, m: &Membership, bytes: u64) -> Result<(), QuotaExceeded> {
        let f = self.file();
        books::reserve(
            m,
            &f.containers[m.container],
            &f.processes[m.process],
            bytes,
        )
    }

    /// Lock-free: give back `bytes` previously reserved by `m`. Giving back
    /// more than the process holds logs a warning and clamps.
    #[inline]
    pub fn release(&self, m: &Membership, bytes: u64) {
        let f = self.file();
        let took = books::release(
            m,
            &f.containers[m.container],
            &f.processes[m.process],
            bytes,
        );
        if took.is_some_and(|t| t != bytes) {
            tracing::warn!(
                "release of {bytes} bytes but process slot {} held {}: clamped",
                m.process,
                took.unwrap_or(0)
            );
        }
    }

    /// Put this process's own counter back to `truth` (what it holds, as
    /// it knows: read here, at an instant when none of its reservations is
    /// in flight) if damage changed it, and have the container recounted
    /// from its processes' counters (see `resync`). While an entry of the
    /// table of shared allocations names this process, a counter above
    /// `truth` is left alone (it may carry what an exporter that died
    /// passed on and this process has not adopted yet; a count too high
    /// only refuses more). Returns whether anything was wrong. For the
    /// watcher: the books converge to what the processes hold after stray
    /// writes.
    pub fn repair_counts(&self, m: &Membership, truth: &AtomicU64) -> bool {
        let f = self.file();
        let p = &f.processes[m.process];
        let c = &f.containers[m.container];
        let me = m.process as u32;
        let sharing = || {
            f.shared.iter().any(|e| {
                e.state.load(Ordering::Acquire) != SLOT_FREE
                    && (e.holder.load(Ordering::Acquire) == me
                        || e.exporter.load(Ordering::Acquire) == me)
            })
        };
        let Some(seen) = books::repair_own(m, p, truth, sharing) else {
            return false;
        };
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
        let own_wrong = seen.is_some();
        if !own_wrong && !container_wrong {
            return false;
        }
        c.suspect.fetch_add(1, Ordering::SeqCst);
        if let Some(_g) = self.try_lock_table() {
            self.resync(m.container);
        }
        let (was, held) = seen.unwrap_or((0, 0));
        tracing::warn!(
            "ledger {}: container {}'s counts were damaged (this process's slot said {was}, it holds {held}); recounted from its processes",
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
        let f = self.file();
        books::register_held(
            m,
            &f.containers[m.container],
            &f.processes[m.process],
            bytes,
        );
    }
}

/// The quota's protocol on one container slot (`c`) and one process slot
/// (`p`) of it.
///
/// The books are right when the container's `used` is the sum of its
/// processes' `used`. Every step that moves bytes keeps them right at
/// every instant a process may die, in this sense: while a process slot's
/// `pending` is not zero, its container may count up to `pending` bytes
/// that the process slot does not show, never fewer than it shows (a
/// count too high only refuses more). A reaper that finds a dead slot
/// takes what it shows off the container ([`books::reap_process`]) and, when its
/// `pending` was not zero, marks the container `suspect`; a recount at an
/// instant when no step is in flight then makes the container exact
/// ([`books::recount`]). Every step bumps the container's `ops` before it
/// changes the container's `used`, so a recount can tell such an instant.
pub mod books {
    use super::*;
    use crate::sync::point;

    /// Reserve `bytes` for `m` (see [`Ledger::try_reserve`]).
    #[inline]
    pub fn reserve(
        m: &Membership,
        c: &ContainerSlot,
        p: &ProcessSlot,
        bytes: u64,
    ) -> Result<(), QuotaExceeded> {
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
        p.pending.fetch_add(bytes, Ordering::AcqRel);
        point();
        c.ops.fetch_add(1, Ordering::AcqRel);
        point();
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
                    point();
                    if new > c.peak.load(Ordering::Relaxed) {
                        c.peak.fetch_max(new, Ordering::Relaxed);
                    }
                    p.used.fetch_add(bytes, Ordering::AcqRel);
                    point();
                    p.pending.fetch_sub(bytes, Ordering::AcqRel);
                    return Ok(());
                }
                Err(x) => cur = x,
            }
        }
    }

    /// Give back `bytes` `m` reserved; returns what its slot held of them
    /// (less when it held less: clamped), `None` once left (then `leave`
    /// gave everything back already).
    #[inline]
    pub fn release(m: &Membership, c: &ContainerSlot, p: &ProcessSlot, bytes: u64) -> Option<u64> {
        if bytes == 0 {
            return Some(0);
        }
        let _in = m.enter()?;
        Some(move_off(c, p, bytes))
    }

    /// Take `bytes` off the process slot, then what it held of them off the
    /// container, `pending` around both: a death in between leaves the
    /// container over-counted (safe), never under-counted, and flagged
    /// for an exact recount. Returns what was taken.
    fn move_off(c: &ContainerSlot, p: &ProcessSlot, bytes: u64) -> u64 {
        p.pending.fetch_add(bytes, Ordering::AcqRel);
        point();
        c.ops.fetch_add(1, Ordering::AcqRel);
        point();
        let took = sat_sub(&p.used, bytes);
        point();
        sat_sub(&c.used, took);
        point();
        p.pending.fetch_sub(bytes, Ordering::AcqRel);
        took
    }

    /// `leave`'s give-back (no reservation of the process in flight any
    /// more): everything the process slot holds, off it and its container,
    /// under the same `pending` marker as a release (a concurrent recount
    /// then cannot subtract it a second time).
    pub fn give_back_all(c: &ContainerSlot, p: &ProcessSlot) -> u64 {
        let held = p.used.load(Ordering::Acquire);
        move_off(c, p, held)
    }

    /// Charge `bytes` the process already holds, whatever the quota (see
    /// [`Ledger::register_held`]).
    pub fn register_held(m: &Membership, c: &ContainerSlot, p: &ProcessSlot, bytes: u64) {
        if bytes == 0 {
            return;
        }
        let Some(_in) = m.enter() else { return };
        p.pending.fetch_add(bytes, Ordering::AcqRel);
        point();
        c.ops.fetch_add(1, Ordering::AcqRel);
        point();
        let new = c
            .used
            .fetch_add(bytes, Ordering::AcqRel)
            .saturating_add(bytes);
        point();
        c.peak.fetch_max(new, Ordering::Relaxed);
        p.used.fetch_add(bytes, Ordering::AcqRel);
        point();
        p.pending.fetch_sub(bytes, Ordering::AcqRel);
    }

    /// The reaper, under the table lock, on the slot of a process that is
    /// gone (or leaving with nothing in flight): what it shows comes off its
    /// container; bytes it had in flight (`pending`) may or may not be in
    /// the container's count, so they are added to the container's
    /// `suspect` for a [`recount`]. The move itself is made under the
    /// slot's own `pending` marker, as a release's is: a reaper that dies
    /// half-way leaves the slot marked, and the next reaper has the
    /// container recounted. Returns (bytes taken off, bytes in flight).
    pub fn reap_process(c: &ContainerSlot, p: &ProcessSlot) -> (u64, u64) {
        let held = p.used.load(Ordering::Acquire);
        p.pending.fetch_add(held, Ordering::AcqRel);
        point();
        let held = sat_sub(&p.used, held);
        point();
        let took = sat_sub(&c.used, held);
        point();
        let pending = p.pending.swap(0, Ordering::AcqRel).saturating_sub(held);
        if pending != 0 {
            c.suspect.fetch_add(pending, Ordering::AcqRel);
        }
        (took, pending)
    }

    /// Under the table lock (dead slots already freed): make the container's
    /// `used` exactly the sum of its live processes' (`procs()` lists them),
    /// removing what processes that died mid-step left behind. Needs an
    /// instant when none of them has a step in flight: read `ops`, `used`,
    /// every live slot (all `pending` zero), `used` and `ops` again; if
    /// nothing moved, `used − Σ` is exactly the leftover, and subtracting
    /// it (rather than storing Σ) stays right whatever completes
    /// meanwhile. Gives up after `tries` looks (`None`: the next reap
    /// retries); else clears `suspect` and returns (bytes given back,
    /// the `suspect` that was cleared).
    pub fn recount<'a, I>(
        c: &ContainerSlot,
        procs: impl Fn() -> I,
        tries: u32,
    ) -> Option<(u64, u64)>
    where
        I: Iterator<Item = &'a ProcessSlot>,
    {
        let sc = Ordering::SeqCst;
        for attempt in 0..tries {
            if attempt > 0 {
                crate::sync::yield_now();
            }
            let o0 = c.ops.load(sc);
            let c1 = c.used.load(sc);
            let mut sum = 0u64;
            let mut busy = false;
            for p in procs() {
                if p.pending.load(sc) != 0 {
                    busy = true;
                    break;
                }
                sum = sum.saturating_add(p.used.load(sc));
            }
            if busy || c.used.load(sc) != c1 || c.ops.load(sc) != o0 {
                continue;
            }
            if c1 >= sum {
                sat_sub(&c.used, c1 - sum);
            } else {
                // Under-counted (cannot happen by this protocol): count up, the safe way.
                tracing::warn!(
                    "container {}: used {c1} < sum of its processes {sum}",
                    c.id_str()
                );
                c.used.fetch_add(sum - c1, sc);
            }
            let suspect = c.suspect.swap(0, sc);
            c.recounts.fetch_add(1, Ordering::Relaxed);
            return Some((c1.saturating_sub(sum), suspect));
        }
        None
    }

    /// The watcher's look at `m`'s own counter: if it is not `truth` (what
    /// the process knows it holds; read only at an instant when no other
    /// reserve or release of `m` is in flight, so the two agree unless
    /// damage struck), put it back. A counter above `truth` is left alone
    /// while `sharing()` (it may carry bytes an exporter that died passed
    /// on). `None`: not looked (left, or a step in flight); `Some(None)`:
    /// right; `Some(Some((was, truth)))`: it was `was`, now `truth`.
    pub fn repair_own(
        m: &Membership,
        p: &ProcessSlot,
        truth: &AtomicU64,
        sharing: impl Fn() -> bool,
    ) -> Option<Option<(u64, u64)>> {
        let _in = m.enter()?;
        // Every reserve or release of `m` (and the caller's own update of
        // `truth`, made inside its own entry) is counted in `entered`:
        // when no other is in flight now and none entered by the second
        // look, `truth` and the slot were both still between the same two
        // steps while read.
        let e0 = m.entered.load(Ordering::SeqCst);
        if m.inflight.load(Ordering::SeqCst) != 1 {
            return None; // another thread is reserving: look next time
        }
        let truth = truth.load(Ordering::SeqCst);
        if p.pending.load(Ordering::SeqCst) != 0 {
            return None;
        }
        let seen = p.used.load(Ordering::SeqCst);
        if m.entered.load(Ordering::SeqCst) != e0 {
            return None;
        }
        let wrong = seen < truth || (seen > truth && !sharing());
        if !wrong {
            return Some(None);
        }
        point();
        p.used
            .compare_exchange(seen, truth, Ordering::SeqCst, Ordering::SeqCst)
            .ok()
            .map(|_| Some((seen, truth)))
    }
}
