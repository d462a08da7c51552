//! The token's transitions: ending a slice (RUNNING → DRAINING), renewing
//! it in place for a holder alone on the GPU, voiding it under the native
//! policy, deciding the next holder (DECIDING → RUNNING or IDLE) and
//! charging the slice that ended; the waiting thread's step between
//! looks; and the per-container process sets (WANT, DRAIN) these read.

use super::*;

impl Gate {
    pub(super) fn set_bit(&self, set: usize, c: usize, on: bool) {
        let w = &self.slot(c).sched[set + self.process / 64];
        let b = 1u64 << (self.process % 64);
        if on {
            w.fetch_or(b, SeqCst);
        } else {
            w.fetch_and(!b, SeqCst);
        }
    }

    /// Clear the bits of processes in `set` of container `c` that are dead,
    /// no longer of `c`, or do not answer; true when the set is then empty.
    pub(super) fn prune(&self, set: usize, c: usize) -> bool {
        let f = self.file();
        let now = now_ns();
        let mut empty = true;
        for wi in 0..cw::SET_WORDS {
            let word = &f.containers[c].sched[set + wi];
            let mut bits = word.load(SeqCst);
            while bits != 0 {
                let b = bits.trailing_zeros() as usize;
                bits &= bits - 1;
                let p = wi * 64 + b;
                let ps = &f.processes[p];
                let ok = ps.state.load(Acquire) == SLOT_LIVE
                    && ps.container.load(Acquire) as usize == c
                    && self.answers(p, now)
                    && self.ledger.is_alive(p);
                if ok {
                    empty = false;
                } else {
                    word.fetch_and(!(1u64 << b), SeqCst);
                }
            }
        }
        empty
    }

    pub(super) fn set_empty(&self, set: usize, c: usize) -> bool {
        (0..cw::SET_WORDS).all(|i| self.slot(c).sched[set + i].load(SeqCst) == 0)
    }

    /// Does an eligible container other than `holder` wait to launch?
    pub(super) fn others_want(&self, holder: Option<usize>) -> bool {
        let f = self.file();
        f.containers.iter().enumerate().any(|(i, s)| {
            Some(i) != holder
                && s.state.load(Acquire) == SLOT_LIVE
                && s.weight.load(Relaxed) > 0
                && (0..cw::SET_WORDS).any(|j| s.sched[cw::WANT + j].load(Relaxed) != 0)
        })
    }

    /// RUNNING → DRAINING (only from exactly `t`).
    pub(super) fn end_slice(&self, t: Token) -> bool {
        if transition::end_slice(self.token(), t).is_some() {
            self.g(gw::STATE_SINCE).store(now_ns(), Release);
            if let Some(h) = t.holder_slot() {
                let n: u32 = (0..cw::SET_WORDS)
                    .map(|i| self.slot(h).sched[cw::DRAIN + i].load(SeqCst).count_ones())
                    .sum();
                self.g(gw::DRAIN_COUNT).store(n as u64, Release);
            }
            futex_wake(self.token());
            true
        } else {
            false
        }
    }

    /// The holder's slice ran out (its launch allowance or its time) while
    /// no other container waits: renew it in place, if its credit allows
    /// (always under a work-conserving policy). Charged exactly as a slice end charges it (slice
    /// start to now, less the time it had no work queued), every bucket
    /// refilled, a fresh slice started (start, budget, allowance, launches,
    /// slices counted); no drain (nobody waits for the GPU) and no thread
    /// of the holder held back: the token passes through a DECIDING state
    /// that names the holder (its threads launch meanwhile, see
    /// `admit_slow`) and comes back to exactly `t`, so the slice's DRAIN
    /// set, its threads' registrations and its draining state's sequence
    /// number stay valid. The work queued so far runs in the new slice and
    /// is charged there. False (nothing changed) when another container
    /// waits, a knob moved (the next decision applies it), or the token is
    /// no longer `t`; false too when its credit is spent (a policy that
    /// keeps idle containers' time): then the slice was ended (DRAINING)
    /// with its time so far charged.
    pub(super) fn renew(&self, t: Token) -> bool {
        let k = self.knobs();
        let f = self.file();
        let Some(h) = t.holder_slot() else {
            return false;
        };
        if t.state != RUNNING
            || k.native()
            || self.slot(h).weight.load(Relaxed) == 0
            || f.header.knob_generation.load(Relaxed) != self.g(gw::KNOB_GEN_SEEN).load(Relaxed)
            || self.others_want(Some(h))
        {
            return false;
        }
        let r = transition::renew(self.token(), t, self.process, || self.renew_slice(h));
        if r != Renewal::Gone {
            futex_wake(self.token());
        }
        r == Renewal::Renewed
    }

    /// The work of [`Gate::renew`] while its DECIDING state names the
    /// holder `h`: charge, refill, and start a new slice, or end it when
    /// out of credit.
    fn renew_slice(&self, h: usize) -> Renew {
        let k = self.knobs();
        let f = self.file();
        let now = now_ns();
        self.g(gw::STATE_SINCE).store(now, Release);
        let cs = &f.containers[h].sched;
        let start = self.g(gw::SLICE_START).load(Acquire);
        let drained: u32 = (0..cw::SET_WORDS)
            .map(|i| cs[cw::DRAIN + i].load(SeqCst).count_ones())
            .sum();
        let was_empty = cs[cw::EMPTY_SINCE].load(Acquire) != 0;
        let (unused, gap_idle) = self.unused(cs, start, now, u64::from(drained));
        // Its queue was not drained: time per launch so far is at most
        // what a launch costs (its queue may have grown); still the
        // estimate moves, else a holder alone from its start would keep
        // the first allowance (8) and renew every 8 launches. The drained
        // slices that follow once others wait correct it.
        let (held, idle) = self.charge_slice(cs, start, now, unused, gap_idle);
        let mut es = self.entries();
        for (i, e) in es.iter_mut().enumerate() {
            // Only the buckets move: a container that arrived meanwhile is
            // seen by the next decision (at this slice's end).
            e.wants = i == h;
        }
        let last = self.g(gw::LAST_REFILL).load(Acquire);
        let last = if last == 0 { now } else { last };
        let last = last.saturating_add(idle).min(now);
        let d = decide(&k, now, last, Some((h, held)), &mut es);
        for (i, s) in f.containers.iter().enumerate() {
            s.sched[cw::TOKENS].store(es[i].tokens as u64, Release);
        }
        self.g(gw::LAST_REFILL).store(now, Release);
        if !matches!(d, Decision::Run { c, .. } if c == h) {
            // Out of credit (a policy that keeps idle containers' time):
            // the slice ends as usual, its time so far charged here, the
            // drain's by the decision that follows it.
            cs[cw::SLICE_LAUNCHES].store(0, SeqCst);
            cs[cw::EMPTY_SINCE].store(if was_empty { now } else { 0 }, SeqCst);
            if was_empty {
                self.open_gap(now);
            }
            self.g(gw::SLICE_START).store(now, Release);
            self.g(gw::DRAIN_COUNT).store(u64::from(drained), Release);
            return Renew::Ended;
        }
        let budget = Params::for_knobs(&k).slice_ns;
        cs[cw::SLICE_LAUNCHES].store(0, SeqCst);
        cs[cw::SLICES].fetch_add(1, Relaxed);
        self.g(gw::SLICES).fetch_add(1, Relaxed);
        self.g(gw::SLICE_BUDGET).store(budget, Release);
        self.g(gw::SLICE_ALLOW).store(
            allowance(budget, cs[cw::NS_PER_LAUNCH].load(Relaxed)),
            Release,
        );
        let start = now_ns();
        // A holder that had no work queued still has none.
        cs[cw::EMPTY_SINCE].store(if was_empty { start } else { 0 }, SeqCst);
        if was_empty {
            self.open_gap(start);
        }
        self.g(gw::SLICE_START).store(start, Release);
        Renew::Renewed
    }

    /// Policy 5: drop the token to IDLE without charging anyone.
    pub(super) fn void_slice(&self, t: Token) {
        if transition::void(self.token(), t) {
            self.g(gw::IDLE_UNTIL).store(0, Release);
            futex_wake(self.token());
        }
    }

    /// One look at the world by a waiting thread; returns how long to sleep.
    pub(super) fn step(&self, t: Token, now: u64, watch: &mut Watch) -> u64 {
        match t.state {
            RUNNING => {
                if t.holder_slot().is_none() {
                    // A corrupt token: nobody's slice; decide afresh.
                    self.try_decide(t);
                    return 0;
                }
                let end = self.slice_end(now);
                if self.slot(self.container).weight.load(Relaxed) == 0 {
                    // No compute for us: never cut others' slices short.
                    return MAX_SLEEP_NS;
                }
                if now >= end {
                    self.end_slice(t);
                    return 0;
                }
                // An idle or stopped holder is handed over by the helper
                // threads (its own, and those of waiting processes); a dead
                // one at its slice's end.
                (end - now).min(MAX_SLEEP_NS)
            }
            DRAINING => {
                let Some(h) = t.holder_slot() else {
                    self.try_decide(t);
                    return 0;
                };
                if self.prune(cw::DRAIN, h) {
                    self.try_decide(t);
                    return 0;
                }
                let since = self.g(gw::STATE_SINCE).load(Acquire);
                if Self::older_than(since, now, DRAIN_LIMIT_NS) {
                    tracing::warn!(
                        "cgpu: container {} did not finish draining in {} s: handing the GPU over anyway",
                        id_of(self.slot(h)),
                        DRAIN_LIMIT_NS / 1_000_000_000
                    );
                    for i in 0..cw::SET_WORDS {
                        self.slot(h).sched[cw::DRAIN + i].store(0, SeqCst);
                    }
                    self.try_decide(t);
                    return 0;
                }
                10_000_000
            }
            DECIDING => {
                let since = self.g(gw::STATE_SINCE).load(Acquire);
                let dead = t.aux.is_some_and(|p| !self.ledger.is_alive(p));
                if dead || Self::older_than(since, now, DECIDE_LIMIT_NS) {
                    self.try_decide(t);
                    return 0;
                }
                1_000_000
            }
            _ /* IDLE */ => {
                let until = self.g(gw::IDLE_UNTIL).load(Acquire);
                let knobs_moved =
                    self.file().header.knob_generation.load(Relaxed) != self.g(gw::KNOB_GEN_SEEN).load(Relaxed);
                // Decide on arrival (my want may be news), when someone's
                // credit comes back, or when an operator changed a knob;
                // never again for nothing (waiters would chase each other).
                if !watch.arrived || now >= until || knobs_moved {
                    watch.arrived = true;
                    self.try_decide(t);
                    return 0;
                }
                (until - now).min(MAX_SLEEP_NS)
            }
        }
    }

    /// Charges the holder's slice that began at `start`, up to `now`, to its
    /// container (`cs`) and the GPU: GPU time, last slice, launches and the
    /// estimate per launch. Not charged to it: what its guests were charged
    /// and the GPU's idle time in its gaps, `gap_idle` (see [`not_used`]).
    /// Returns (time charged, time charged to nobody).
    pub(super) fn charge_slice(
        &self,
        cs: &[AtomicU64],
        start: u64,
        now: u64,
        unused: u64,
        gap_idle: u64,
    ) -> (u64, u64) {
        let wall = now.saturating_sub(start);
        let guests = self.g(gw::GUEST_IN_SLICE).swap(0, AcqRel).min(wall);
        let free = not_used(unused, guests, gap_idle).min(wall);
        let held = wall - free;
        let allow = self.g(gw::SLICE_ALLOW).load(Acquire);
        let launches = cs[cw::SLICE_LAUNCHES].load(Acquire).min(allow);
        cs[cw::GPU_NS].fetch_add(held, Relaxed);
        cs[cw::LAST_SLICE_NS].store(held.max(1), Relaxed);
        cs[cw::LAUNCHES].fetch_add(launches, Relaxed);
        // The time per launch: with guests in the slice, its time with work
        // queued (an overestimate: the guests' work in it too) rather than
        // the time charged (what guests were charged is an upper bound of
        // what they used, so that would be a lower bound, and a guest's
        // work not seen done is charged at its own estimate: estimates
        // lowered that way would feed on each other). Too high only makes
        // the queue bound shorter and such guests pay more.
        let sample = if guests == 0 {
            held
        } else {
            wall.saturating_sub(unused)
        };
        let est = update_estimate(cs[cw::NS_PER_LAUNCH].load(Relaxed), sample, launches);
        cs[cw::NS_PER_LAUNCH].store(est, Relaxed);
        self.g(gw::BUSY_NS).fetch_add(held, Relaxed);
        (held, free.saturating_sub(guests))
    }

    /// Every container slot as a decision sees it (work owed and guest work
    /// taken out of the words and charged to its GPU time).
    pub(super) fn entries(&self) -> [Entry; MAX_CONTAINERS] {
        let f = self.file();
        let mut es = [Entry::default(); MAX_CONTAINERS];
        for (i, s) in f.containers.iter().enumerate() {
            let live = s.state.load(Acquire) == SLOT_LIVE && s.nprocs.load(Acquire) > 0;
            // Work seen to have run after its drain was given up on.
            let owed = s.sched[cw::OWED_NS].swap(0, AcqRel).min(1_000_000_000);
            // Work it ran as a guest beside the slices (already counted in
            // its GPU time).
            let guest = s.sched[cw::GUEST_NS].swap(0, AcqRel).min(1_000_000_000);
            if owed > 0 {
                s.sched[cw::GPU_NS].fetch_add(owed, Relaxed);
                self.g(gw::BUSY_NS).fetch_add(owed, Relaxed);
            }
            es[i] = Entry {
                live,
                weight: s.weight.load(Acquire),
                highprio: s.highprio.load(Acquire) != 0,
                wants: live && !self.prune(cw::WANT, i),
                guest: live && guest > 0,
                tokens: (s.sched[cw::TOKENS].load(Acquire) as i64)
                    .saturating_sub(owed as i64)
                    .saturating_sub(guest as i64),
                ns_per_launch: s.sched[cw::NS_PER_LAUNCH].load(Relaxed),
            };
        }
        es
    }

    /// Take the DECIDING state from exactly `t` (DRAINING, IDLE or a stale
    /// DECIDING), charge the holder, choose the next one.
    pub(crate) fn try_decide(&self, t: Token) -> Option<Token> {
        let (next, published) =
            transition::decide(self.token(), t, self.process, |mine| self.choose(t, mine))?;
        if published {
            futex_wake(self.token());
        }
        Some(next)
    }

    /// The work of [`Gate::try_decide`] while this process owns the
    /// DECIDING state `mine` taken from `t`: charge the slice that ended,
    /// refill the buckets, choose the next holder and start its slice.
    fn choose(&self, t: Token, mine: Token) -> Token {
        let now = now_ns();
        self.g(gw::STATE_SINCE).store(now, Release);
        let f = self.file();
        let mut charge = None;
        let mut idle = 0;
        if t.state == DRAINING {
            if let Some(h) = t.holder_slot() {
                // Exclusive time: slice start to drained, less the time a
                // holder of one process had no work queued (between a
                // synchronise that returned and its next launch, or from
                // the grant to its first launch).
                let start = self.g(gw::SLICE_START).load(Acquire);
                let cs = &f.containers[h].sched;
                let (unused, gap_idle) =
                    self.unused(cs, start, now, self.g(gw::DRAIN_COUNT).load(Acquire));
                let held;
                (held, idle) = self.charge_slice(cs, start, now, unused, gap_idle);
                charge = Some((h, held));
            }
        }
        let mut es = self.entries();
        if let Some((h, _)) = charge {
            // A holder busy with its own results (inside a synchronise, or
            // one that just returned) launches again in a moment: it may
            // keep the GPU if its credit says so (else a job that is never
            // waiting in the launch hook when its slice ends could never
            // take two slices in a row, and its credit beyond the cap
            // would be lost).
            es[h].wants |= es[h].live && self.holder_active(h, now);
        }
        let k = self.knobs();
        let last = self.g(gw::LAST_REFILL).load(Acquire);
        let last = if last == 0 { now } else { last };
        // Time the holder held the GPU and left unused is charged to nobody
        // and earns nobody credit: buckets refill for the time used (else
        // every bucket grows by the idle time, and the cap clips the large
        // shares first).
        let last = last.saturating_add(idle).min(now);
        let d = decide(&k, now, last, charge, &mut es);
        for (i, s) in f.containers.iter().enumerate() {
            s.sched[cw::TOKENS].store(es[i].tokens as u64, Release);
        }
        self.g(gw::LAST_REFILL).store(now, Release);
        self.g(gw::KNOB_GEN_SEEN)
            .store(f.header.knob_generation.load(Relaxed), Relaxed);
        match d {
            Decision::Run {
                c,
                budget_ns,
                allow,
            } => {
                let cs = &f.containers[c].sched;
                cs[cw::SLICE_LAUNCHES].store(0, SeqCst);
                cs[cw::IDLE_NS].store(0, SeqCst);
                self.g(gw::GAP_IDLE_NS).store(0, Release);
                for i in 0..cw::SET_WORDS {
                    cs[cw::DRAIN + i].store(0, SeqCst);
                }
                cs[cw::SLICES].fetch_add(1, Relaxed);
                self.g(gw::SLICES).fetch_add(1, Relaxed);
                // Guests charged since the last slice's charge (none under
                // a voided slice) are not this one's.
                self.g(gw::GUEST_IN_SLICE).store(0, Release);
                self.g(gw::SLICE_BUDGET).store(budget_ns, Release);
                self.g(gw::SLICE_ALLOW).store(allow, Release);
                // Its work was drained at its last hand-over and it could
                // launch none since: the GPU is idle for it until its first
                // launch (a thread waking up), not charged to it.
                let start = now_ns();
                cs[cw::EMPTY_SINCE].store(start, SeqCst);
                self.open_gap(start);
                self.g(gw::SLICE_START).store(start, Release);
                mine.next(RUNNING, Some(c), None)
            }
            Decision::Idle { until } => {
                self.g(gw::IDLE_UNTIL).store(until, Release);
                mine.next(IDLE, None, None)
            }
        }
    }
}
