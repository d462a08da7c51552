//! The guest seat: one process at a time may run beside another
//! container's slice (its work fills the holder's gaps), if its work is
//! short and its container does not owe, or its container is light and
//! high-priority. Here: who may take the seat, the seat's time, and what a
//! guest is charged for its work (its device time, from events).

use super::*;

impl Gate {
    /// Host time the guest seat has been held up to `now`, ns (a running
    /// sum: only differences mean anything). A guest holds the seat from
    /// its first launch until its work is seen done, so while the holder
    /// has nothing queued the seat's time is, about, the GPU's time on a
    /// guest's work (a little more: the guest's wake-up after its work).
    pub(super) fn seat_time(&self, now: u64) -> u64 {
        let closed = self.g(gw::GUEST_SEAT_NS).load(Acquire);
        let open = if self.g(gw::GUEST_SEAT).load(Acquire) != 0 {
            now.saturating_sub(self.g(gw::GUEST_SEAT_AT).load(Acquire))
                .min(SLICE_NS)
        } else {
            0
        };
        closed.wrapping_add(open)
    }

    /// The seat's tenure that began at `at` ended at `now`.
    pub(super) fn close_seat(&self, at: u64, now: u64) {
        self.g(gw::GUEST_SEAT_NS)
            .fetch_add(now.saturating_sub(at).min(SLICE_NS), AcqRel);
    }

    /// A guest launch of this thread returned: mark its end on the clock.
    #[cold]
    #[inline(never)]
    pub(super) fn guest_launched(&self) {
        let (g, stream) = GUEST_END.with(|g| g.replace((0, 0)));
        if g == self as *const Gate as usize {
            self.clock.launched(stream);
        }
    }

    /// Run beside the holder of slice `t` (another container, running or
    /// draining) as its guest. The GPU's own time-slicing then serves the
    /// guest beside the holder, as it serves two processes without cgpu:
    /// the guest's work runs in the holder's host-side gaps (a synchronise,
    /// a little host work, the next launch) and in GPU time-slices beside
    /// the holder's, and a request waits about a GPU time-slice, not a slice
    /// and a drain. A process may be the guest when
    /// - a synchronise saw its queue empty within the last slice (it waits
    ///   for its work, which is then seen done and charged at once; a loop
    ///   that only queues work waits for its own slices);
    /// - its work is short: its launches at its measured time per launch
    ///   fit in a quarter slice;
    /// - and its container owes less than [`GUEST_DEBT_NS`] (its bucket less
    ///   what it was charged as a guest since the last decision): a guest
    ///   pays for its work from its own bucket, so one that runs beside the
    ///   holder more than its share soon owes, and waits for its slices;
    ///
    /// or when its container is high-priority and light (see
    /// [`Gate::light`]). It must also hold, or take, the GPU's one guest
    /// seat (free, left for over a slice, or held by a process that is
    /// gone), and have fewer than [`GUEST_MAX`] launches whose work is not
    /// seen done. It is charged its work's device time (see
    /// [`Gate::guest_done`]), which the holder is not charged. True =
    /// admitted (the caller launches and calls [`Gate::done`]).
    pub(super) fn guest(&self, t: Token, k: &Knobs, stream: usize) -> bool {
        let Some(h) = t.holder_slot() else {
            return false;
        };
        if !matches!(t.state, RUNNING | DRAINING)
            || k.native()
            || h == self.container
            || self.slot(self.container).weight.load(Relaxed) == 0
        {
            return false;
        }
        let now = now_ns();
        let key = launch_key(stream);
        if self.guest_launches.load(Acquire) > 0
            && self.guest_key.load(Acquire) == key
            && self.in_launch.load(SeqCst) == 0
        {
            // This thread queued its guest work on this stream: it may be
            // done without a synchronise (a loop that only queues work).
            // SAFETY: the real driver's cuStreamQuery on the stream this
            // thread is launching on now (valid, or the application's own
            // launch is invalid too); it only reads the stream's state.
            if unsafe { (self.drv.stream_query)(stream as *mut c_void) } == 0 {
                self.guest_done(now, false);
            }
        }
        if self.guest_launches.load(Acquire) >= GUEST_MAX {
            // It waits for its turn now: another may be the guest (its work
            // is charged at its time per launch when seen done).
            self.leave_seat();
            return false;
        }
        if !self.seated() {
            // It waits for its work: a synchronise saw its queue empty
            // within the last slice. (A loop that only queues work waits
            // for its slices: as a guest its work would be seen done only
            // when a query happens to find its queue empty, so its charges,
            // and with them its share, would follow the timing of those
            // queries rather than its use of the GPU.)
            let syncs = !Self::older_than(self.empty_at.load(Acquire), now, SLICE_NS);
            // Its work, as far as measured, is short: a guest's launches
            // fit in a quarter slice (long kernels wait for their turn).
            let short = self
                .c(cw::NS_PER_LAUNCH)
                .load(Relaxed)
                .saturating_mul(u64::from(GUEST_MAX))
                <= GUEST_SLICE_NS;
            let highprio = self.slot(self.container).highprio.load(Relaxed) != 0;
            let may =
                syncs && short && self.credit() > -GUEST_DEBT_NS || highprio && self.light(now, k);
            if !(may && self.take_seat(now)) {
                return false;
            }
        }
        self.in_launch.fetch_add(1, SeqCst);
        if self.token().load(SeqCst) != t.pack() {
            self.in_launch.fetch_sub(1, SeqCst);
            if self.guest_since.load(Acquire) == 0 {
                self.leave_seat();
            }
            return false;
        }
        if self
            .guest_since
            .compare_exchange(0, now, AcqRel, Acquire)
            .is_ok()
        {
            self.guest_key.store(key, Release);
            let mut ctx: CUcontext = std::ptr::null_mut();
            let mut dev: i32 = -1;
            // SAFETY: valid out-pointers; the real driver's functions.
            let found = unsafe {
                (self.drv.ctx_get_current)(&mut ctx) == 0
                    && (self.drv.ctx_get_device)(&mut dev) == 0
            };
            if found {
                self.clock.begin(stream, ctx, dev);
            } else {
                self.clock.spoil();
            }
        } else if self.guest_key.load(Acquire) != key {
            self.guest_key.store(MIXED, Release);
            self.clock.spoil();
        }
        self.guest_launches.fetch_add(1, AcqRel);
        GUEST_END.with(|g| g.set((self as *const Gate as usize, stream)));
        true
    }

    /// Does this process hold the guest seat?
    pub(super) fn seated(&self) -> bool {
        self.g(gw::GUEST_SEAT).load(Acquire) == self.process as u64 + 1
    }

    /// Take the guest seat if it is free, was left for over a slice, or is
    /// held by a process that is gone.
    pub(super) fn take_seat(&self, now: u64) -> bool {
        let seat = self.g(gw::GUEST_SEAT).load(Acquire);
        if seat != 0 {
            let at = self.g(gw::GUEST_SEAT_AT).load(Acquire);
            let gone = usize::try_from(seat - 1)
                .ok()
                .filter(|&p| p < MAX_PROCESSES)
                .is_none_or(|p| !self.ledger.is_alive(p));
            if !(gone || Self::older_than(at, now, SLICE_NS)) {
                return false;
            }
        }
        let at = self.g(gw::GUEST_SEAT_AT).load(Acquire);
        if self
            .g(gw::GUEST_SEAT)
            .compare_exchange(seat, self.process as u64 + 1, AcqRel, Acquire)
            .is_err()
        {
            return false;
        }
        if seat != 0 {
            // Taken from a process that left it for over a slice or is gone.
            self.close_seat(at, now);
        }
        self.g(gw::GUEST_SEAT_AT).store(now, Release);
        true
    }

    /// Give the guest seat up if this process holds it.
    pub(super) fn leave_seat(&self) {
        let me = self.process as u64 + 1;
        let at = self.g(gw::GUEST_SEAT_AT).load(Acquire);
        if self
            .g(gw::GUEST_SEAT)
            .compare_exchange(me, 0, AcqRel, Acquire)
            .is_ok()
        {
            self.close_seat(at, now_ns());
        }
    }

    /// My container's bucket, less what it was charged as a guest and owes
    /// since the last decision, ns (negative: debt).
    pub(super) fn credit(&self) -> i64 {
        let tokens = self.c(cw::TOKENS).load(Acquire) as i64;
        let pending = self
            .c(cw::GUEST_NS)
            .load(Acquire)
            .saturating_add(self.c(cw::OWED_NS).load(Acquire))
            .min(i64::MAX as u64) as i64;
        tokens.saturating_sub(pending)
    }

    /// My container is light: its last slice, if any, used at most
    /// [`GUEST_SLICE_NS`], and its recent use of the GPU is under
    /// [`GUEST_BELOW`] of its share. A light high-priority container is a
    /// guest whatever it owes (an online service beside batch work); a
    /// high-priority job that uses its share is not light, and its
    /// `prio_ratio` is kept by its slices.
    pub(super) fn light(&self, now: u64, k: &Knobs) -> bool {
        if self.c(cw::LAST_SLICE_NS).load(Acquire) > GUEST_SLICE_NS {
            return false;
        }
        let share = self.share(self.container, k);
        share > 0.0 && self.recent_rate(now, share) < GUEST_BELOW * share
    }

    /// This process's guest work is done (`seen_done`: a synchronise saw it
    /// finish), or its own slice began: charge its container for it, and
    /// leave the guest seat. The guest is charged its work's device time,
    /// from two events on its stream (see [`GuestClock`]): from when the
    /// GPU could begin its work to the end of its last kernel. Untimed work
    /// (launches on several streams or from several threads, a stream
    /// being captured, a driver without events) and work not yet done when
    /// its own slice began are charged the time from its first guest launch
    /// until it was seen done (at most a slice), or, when not seen done by
    /// a synchronise while it held the seat, its launches at its time per
    /// launch measured in its own slices when that is less.
    /// The charge is taken from the holder's slice (see
    /// [`Gate::charge_slice`]) when another container holds the GPU.
    pub(super) fn guest_done(&self, now: u64, seen_done: bool) {
        let since = self.guest_since.swap(0, AcqRel);
        let launches = self.guest_launches.swap(0, AcqRel);
        let n = u64::from(launches);
        let device = self.clock.finish(launches);
        let seated = self.seated();
        self.leave_seat();
        if since == 0 || since > now {
            return;
        }
        let wall = (now - since).min(SLICE_NS);
        let per_launch = self.c(cw::NS_PER_LAUNCH).load(Relaxed);
        let ns = if let Some(d) = device {
            d.min(SLICE_NS)
        } else if seated && seen_done || per_launch == 0 {
            wall
        } else {
            wall.min(per_launch.saturating_mul(n.max(1)))
        };
        self.c(cw::GPU_NS).fetch_add(ns, Relaxed);
        self.c(cw::GUEST_NS).fetch_add(ns, AcqRel);
        self.g(gw::BUSY_NS).fetch_add(ns, Relaxed);
        let t = Token::unpack(self.token().load(Acquire));
        if matches!(t.state, RUNNING | DRAINING)
            && t.holder_slot().is_some_and(|h| h != self.container)
        {
            self.g(gw::GUEST_IN_SLICE).fetch_add(ns, AcqRel);
        }
        self.file().processes[self.process]
            .gpu_time_ns
            .fetch_add(ns, Relaxed);
    }

    /// Container `c`'s share with every live container counted as busy
    /// (what the tools show as its limit), 0..=1.
    pub(super) fn share(&self, c: usize, k: &Knobs) -> f64 {
        let mut ms = [crate::scheduler::policy::Member::default(); MAX_CONTAINERS];
        for (m, s) in ms.iter_mut().zip(self.file().containers.iter()) {
            let live = s.state.load(Acquire) == SLOT_LIVE && s.nprocs.load(Acquire) > 0;
            *m = crate::scheduler::policy::Member {
                live,
                weight: s.weight.load(Acquire),
                highprio: s.highprio.load(Acquire) != 0,
                active: live,
            };
        }
        let mut rate = [0.0f64; MAX_CONTAINERS];
        crate::scheduler::policy::shares(k, &ms, &mut rate);
        rate[c]
    }

    /// My container's recent use of the GPU (charged ns per ns, averaged
    /// over about a second, updated every 100 ms; `share` stands in for a
    /// corrupt word).
    pub(super) fn recent_rate(&self, now: u64, share: f64) -> f64 {
        let cs = &self.slot(self.container).sched;
        let at = cs[cw::RATE_AT].load(Acquire);
        let used = cs[cw::GPU_NS].load(Acquire);
        if at == 0 || at > now {
            // Not measured yet (or a corrupt time): start now, from nothing
            // (a newcomer has used nothing; a busy one is held to
            // `GUEST_MAX` launches and soon measured).
            if cs[cw::RATE_AT]
                .compare_exchange(at, now, AcqRel, Acquire)
                .is_ok()
            {
                cs[cw::RATE_NS].store(used, Release);
                cs[cw::RATE].store(0f64.to_bits(), Release);
            }
            return 0.0;
        }
        let mut rate = f64::from_bits(cs[cw::RATE].load(Acquire));
        if !(rate.is_finite() && rate >= 0.0) {
            rate = share;
        }
        let dt = now - at;
        if dt >= 100_000_000
            && cs[cw::RATE_AT]
                .compare_exchange(at, now, AcqRel, Acquire)
                .is_ok()
        {
            let base = cs[cw::RATE_NS].swap(used, AcqRel);
            let inst = used.saturating_sub(base) as f64 / dt as f64;
            let a = (dt as f64 / 1e9).min(1.0);
            rate = rate * (1.0 - a) + inst.min(1.0) * a;
            cs[cw::RATE].store(rate.to_bits(), Release);
        }
        rate
    }
}
