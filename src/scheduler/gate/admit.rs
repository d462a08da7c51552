//! Admission of a launch: the fast path (a few atomics when my container
//! holds the GPU and the slice's allowance is not used up), the slow path
//! that waits (bounded futex waits) until my container holds the GPU or may
//! run beside the holder, entering my container's slice, and, for a
//! container that arrived with no compute weight free, taking one once it
//! frees up. Everything a launching thread does before and after the real
//! launch lives here.

use super::*;

impl Gate {
    /// Fast path: true = admitted (the caller must call [`Gate::done`]).
    /// False at once for a gate made before a fork (this is the child's copy:
    /// no ledger word touched), besides an unscheduled launch.
    /// `stream` is the launch's stream (for the holder's idle accounting).
    #[inline]
    pub fn admit(&self, stream: usize) -> bool {
        self.in_launch.fetch_add(1, SeqCst);
        let w = self.token().load(SeqCst);
        if (w >> 32) as u32 == self.running_hi
            && SEEN.with(|s| s.get()) == (w as u32 as u64 | (self.epoch as u64) << 32)
            && self.generation == crate::process::fork::current()
            && self.c(cw::SLICE_LAUNCHES).fetch_add(1, Relaxed)
                < self.g(gw::SLICE_ALLOW).load(Relaxed)
        {
            self.note_launch(stream);
            return true;
        }
        self.in_launch.fetch_sub(1, SeqCst);
        if self.generation != crate::process::fork::current() {
            // Made before a fork (the caller finds this process's gate).
            return false;
        }
        let admitted = self.admit_slow(stream);
        if admitted {
            self.note_launch(stream);
        }
        admitted
    }

    /// An admitted launch on `stream`: two loads when nothing changed (the
    /// same stream as before, work already queued).
    #[inline]
    pub(super) fn note_launch(&self, stream: usize) {
        let key = launch_key(stream);
        let last = self.last_stream.load(Relaxed);
        if last != key && last != MIXED {
            self.last_stream
                .store(if last == NO_STREAM { key } else { MIXED }, Relaxed);
        }
        if self.c(cw::EMPTY_SINCE).load(Relaxed) != 0 {
            self.close_gap();
        }
    }

    /// After the real launch returned.
    #[inline]
    pub fn done(&self) {
        if GUEST_END.with(|g| g.get().0) != 0 {
            self.guest_launched();
        }
        self.in_launch.fetch_sub(1, Release);
    }

    /// Slow path: announce, or wait. Returns whether a launch was admitted
    /// under the token (false only when the policy is native).
    #[cold]
    #[inline(never)]
    pub(super) fn admit_slow(&self, stream: usize) -> bool {
        let mut waited_since: Option<u64> = None;
        // A process that drives several GPUs and waits for its turn on this
        // one is not idle on the others it holds (see `mark_busy`).
        let mut others_marked: Option<crate::scheduler::GateMask> = None;
        let mut watch = Watch::default();
        let admitted = loop {
            let k = self.knobs();
            let w = self.token().load(SeqCst);
            let t = Token::unpack(w);
            // A ledger truncated, wiped or replaced under us (the process
            // moved to another one, see `Ledger::is_usable`) holds no
            // schedule any more: no control rather than waiting on words
            // nobody else sees.
            if k.native() || self.stop.load(Relaxed) || !self.ledger.is_usable() {
                if k.native() && matches!(t.state, RUNNING | DRAINING) {
                    // No control: the slice in force is void (never charge a
                    // holder for time spent under policy 5).
                    self.void_slice(t);
                }
                break false;
            }
            if t.state == RUNNING && t.holder == Some(self.container) {
                match self.try_enter(t) {
                    Enter::Admitted => break true,
                    Enter::Retry => continue,
                    Enter::Wait => {}
                }
            } else if t.state == DECIDING && t.holder == Some(self.container) {
                // My container's slice is being renewed in place (see
                // `renew`): the GPU stays with it; launch without waiting.
                let key = t.seq.wrapping_sub(1) as u64 | (self.epoch as u64) << 32;
                if SEEN.with(|s| s.get()) != key {
                    self.register_ctx();
                    self.set_bit(cw::DRAIN, self.container, true);
                }
                self.in_launch.fetch_add(1, SeqCst);
                if self.token().load(SeqCst) == w {
                    break true;
                }
                self.in_launch.fetch_sub(1, SeqCst);
                continue;
            } else if t.holder != Some(self.container) && self.guest(t, &k, stream) {
                break true;
            }
            let now = now_ns();
            if waited_since.is_none() {
                waited_since = Some(now);
                if crate::scheduler::MULTI.load(Acquire) {
                    others_marked = Some(crate::scheduler::mark_busy(self, true));
                }
                self.want(true);
                // Tell the holder's helpers someone waits (idle hand-over).
                futex_wake(self.token());
            } else {
                // Re-assert (a racing last-waiter-leaves may have cleared it).
                self.set_bit(cw::WANT, self.container, true);
            }
            if self.slot(self.container).weight.load(Relaxed) == 0 {
                if !self.warned_weight0.swap(true, Relaxed) {
                    tracing::warn!(
                        "cgpu: container {} has compute weight 0 (it arrived when free_weight was 0, or an operator set it): its kernel launches wait until an operator gives it weight (`cgpuctl set weight`), or, if it arrived when none was free, until one frees up (it then takes weight 1 by itself)",
                        id_of(self.slot(self.container))
                    );
                }
                // On this waiting path only (never a launch that goes
                // through): take weight 1 as soon as one is free.
                if self.take_free_weight() {
                    tracing::warn!(
                        "cgpu: container {}: weight freed up, it took compute weight 1; its launches go on",
                        id_of(self.slot(self.container))
                    );
                    continue;
                }
            } else if self.arrived_weightless() {
                // It has a weight now: a weight 0 from here on is an
                // operator's, never taken back by itself.
                let (word, bit) = weightless_bit(self.container);
                self.g(word).fetch_and(!bit, AcqRel);
            }
            let timeout = self.step(t, now, &mut watch);
            if timeout > 0 {
                futex_wait(self.token(), w as u32, timeout);
            }
        };
        if let Some(m) = others_marked {
            crate::scheduler::unmark_busy(m);
        }
        if let Some(s) = waited_since {
            self.want(false);
            self.c(cw::THROTTLED_NS)
                .fetch_add(now_ns().saturating_sub(s), Relaxed);
        }
        admitted
    }

    /// My container has weight 0 and a thread of this process waits to
    /// launch: if the container arrived when no weight was free (the
    /// process that claimed it knows it, see [`Ledger::take_free_weight`];
    /// every other process reads it in the GPU's `WEIGHTLESS` set) and
    /// a weight is free now, give it weight 1. A dead container's weight is
    /// reclaimed first. At most one attempt every 10 ms per process; never
    /// for a weight 0 an operator set. True when it took a weight.
    pub(super) fn take_free_weight(&self) -> bool {
        if self.ledger.take_free_weight(self.container) {
            return true;
        }
        if !self.arrived_weightless() {
            return false;
        }
        let now = now_ns();
        let last = self.weight_try.load(Relaxed);
        if now < last.saturating_add(WEIGHT_TRY_NS)
            || self
                .weight_try
                .compare_exchange(last, now, AcqRel, Relaxed)
                .is_err()
        {
            return false;
        }
        if free_weight(self.file()) == 0 {
            // The container that held the weight may have died.
            self.ledger
                .maybe_reap(std::time::Duration::from_nanos(WEIGHT_TRY_NS));
            if free_weight(self.file()) == 0 {
                return false;
            }
        }
        self.slot(self.container).weight.load(Acquire) == 0
            && self.ledger.set_weight(self.container, 1).is_ok()
    }

    /// Did my container arrive with weight 0 because none was free (and
    /// has it had no weight since)?
    pub(super) fn arrived_weightless(&self) -> bool {
        let (word, bit) = weightless_bit(self.container);
        self.g(word).load(Acquire) & bit != 0
    }

    /// My container holds the token: announce this thread (and process)
    /// for the slice, then take one launch of the allowance.
    fn try_enter(&self, t: Token) -> Enter {
        let key = t.seq as u64 | (self.epoch as u64) << 32;
        if SEEN.with(|s| s.get()) != key {
            self.register_ctx();
            self.set_bit(cw::DRAIN, self.container, true);
        }
        self.in_launch.fetch_add(1, SeqCst);
        if self.token().load(SeqCst) != t.pack() {
            self.in_launch.fetch_sub(1, SeqCst);
            return Enter::Retry;
        }
        if SEEN.with(|s| s.get()) != key {
            if self.guest_since.load(Acquire) != 0 {
                // Guest work not seen done before its own slice: charge it
                // now (its launches at its measured ns per launch; not yet
                // measured: the time since, at most a slice).
                self.guest_done(now_ns(), false);
            }
            // The DRAINING state that follows this RUNNING one has seq + 1.
            self.undrained
                .store(1 << 32 | t.seq.wrapping_add(1) as u64, SeqCst);
        }
        SEEN.with(|s| s.set(key));
        if self.c(cw::SLICE_LAUNCHES).fetch_add(1, Relaxed) < self.g(gw::SLICE_ALLOW).load(Relaxed)
        {
            return Enter::Admitted;
        }
        // Allowance used up: the queue is long enough; end the slice so the
        // drain measures what it cost. Alone on the GPU: nobody waits for
        // that drain; take a fresh slice and launch now.
        self.in_launch.fetch_sub(1, SeqCst);
        if self.renew(t) {
            return Enter::Retry;
        }
        self.end_slice(t);
        Enter::Wait
    }

    pub(super) fn want(&self, on: bool) {
        if on {
            self.waiting.fetch_add(1, AcqRel);
            self.set_bit(cw::WANT, self.container, true);
        } else if self.waiting.fetch_sub(1, AcqRel) == 1 {
            self.set_bit(cw::WANT, self.container, false);
            if self.waiting.load(Acquire) > 0 {
                self.set_bit(cw::WANT, self.container, true);
            }
        }
    }
}

enum Enter {
    Admitted,
    Retry,
    Wait,
}
