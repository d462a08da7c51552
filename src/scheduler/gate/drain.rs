//! This process's drain when the GPU changes hands: its contexts (recorded
//! at its first launch in each slice, [`Contexts`]) synchronised, bounded,
//! the time charged to the slice; a drain given up on is charged later
//! when its work is seen done; a destroyed context is forgotten.

use super::*;

impl Gate {
    pub(super) fn register_ctx(&self) {
        self.ctxs.register();
    }

    /// Is `t` the RUNNING or DRAINING state of the slice `undrained` names
    /// (or its renewal in place, which has the draining state's number)?
    pub(super) fn holds_slice_of(&self, t: Token, undrained: u64) -> bool {
        let draining_seq = undrained as u32;
        t.holder == Some(self.container)
            && ((t.state == DRAINING || t.state == DECIDING) && t.seq == draining_seq
                || t.state == RUNNING && t.seq.wrapping_add(1) == draining_seq)
    }

    /// Synchronise every context this process launched into (see
    /// [`Contexts::sync`]).
    pub(super) fn sync_contexts(&self) {
        self.ctxs.sync();
    }

    /// Wait until this process's outstanding work in slice `t` is done, then
    /// leave the drain set; the last one out decides. If the GPU changed
    /// hands meanwhile (this process stopped answering and was left out),
    /// the work it was seen to finish is charged late.
    pub(super) fn drain(&self, t: Token) {
        let t0 = now_ns();
        let deadline = t0 + 500_000_000;
        while self.in_launch.load(SeqCst) > 0 && now_ns() < deadline {
            std::thread::sleep(std::time::Duration::from_micros(20));
        }
        self.sync_contexts();
        let took = now_ns().saturating_sub(t0);
        let _ = self
            .undrained
            .compare_exchange(1 << 32 | t.seq as u64, 0, SeqCst, SeqCst);
        if self.token().load(SeqCst) == t.pack() {
            // This process's part of the slice, for the tools' per-process
            // GPU time: the slice split equally among the processes that
            // launched in it.
            let n = self
                .g(gw::DRAIN_COUNT)
                .load(Acquire)
                .clamp(1, MAX_PROCESSES as u64);
            let now = now_ns();
            let start = self.g(gw::SLICE_START).load(Acquire);
            let mut held = now.saturating_sub(start);
            // As its container is charged (the words are left for the
            // decision): less its guests' time and, alone in the slice, the
            // idle part of its gaps (see `not_used`).
            let guests = self.g(gw::GUEST_IN_SLICE).load(Acquire);
            let cs = &self.slot(self.container).sched;
            let (unused, gap_idle) = self.gaps(cs, start, now, n, false);
            held = held.saturating_sub(not_used(unused, guests, gap_idle));
            self.file().processes[self.process]
                .gpu_time_ns
                .fetch_add(held.min(MAX_BUDGET_NS + DRAIN_LIMIT_NS) / n, Relaxed);
            self.set_bit(cw::DRAIN, self.container, false);
            if self.set_empty(cw::DRAIN, self.container) {
                self.try_decide(t);
            }
        } else {
            self.charge_late(took);
        }
    }

    /// A slice's drain that was given up on: synchronise now and charge what
    /// was seen to run.
    pub(super) fn late_drain(&self, undrained: u64) {
        let t0 = now_ns();
        self.sync_contexts();
        let took = now_ns().saturating_sub(t0);
        if self
            .undrained
            .compare_exchange(undrained, 0, SeqCst, SeqCst)
            .is_ok()
        {
            self.charge_late(took);
        }
    }

    /// Charge my container, at the next decision, for queued work seen to
    /// have run after the GPU changed hands: the time the drain waited,
    /// at most a slice (the queue bound keeps about half a slice queued; a
    /// process stopped inside its drain waited for longer than its work).
    pub(super) fn charge_late(&self, took: u64) {
        let ns = took.min(SLICE_NS);
        if ns > 0 {
            self.c(cw::OWED_NS).fetch_add(ns, AcqRel);
            self.file().processes[self.process]
                .gpu_time_ns
                .fetch_add(ns, Relaxed);
        }
        tracing::debug!("cgpu: late drain: {ns} ns charged");
    }

    /// Remove context `v` from the drain (it is being destroyed); returns
    /// once no drain uses it.
    pub(crate) fn forget_ctx(&self, v: usize) {
        if v == 0 {
            return;
        }
        self.clock.forget(v, None);
        self.ctxs.forget(v);
    }

    /// Remove every context of device `dev` (its primary context is being
    /// released or reset). A live one is registered again at its next slice.
    pub(crate) fn forget_device(&self, dev: i32) {
        self.clock.forget(0, Some(dev));
        self.ctxs.forget_device(dev);
    }
}
