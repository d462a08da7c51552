//! The per-process threads: the helper (its container's slice timer, the
//! watcher of an idle holder while this process's threads wait, and the
//! drainer of this process's work at each handover) and the beat thread
//! (a sign of life every few ms, so others can tell a stopped process from
//! one that drains).

use super::*;

impl Gate {
    /// The beat thread: a sign of life every [`BEAT_NS`] until stopped.
    pub(crate) fn beat_loop(&self) {
        let beat = &self.file().processes[self.process].sched_beat_ns;
        while !self.stop.load(Relaxed) {
            beat.store(now_ns(), Relaxed);
            std::thread::sleep(std::time::Duration::from_nanos(BEAT_NS));
        }
    }

    /// Write one beat now (before the process can appear in any set).
    pub(crate) fn beat(&self) {
        self.file().processes[self.process]
            .sched_beat_ns
            .store(now_ns(), Relaxed);
    }

    /// Helper thread: slice timer for my container, watcher of an idle
    /// holder while my threads wait, drainer for my process.
    pub(crate) fn helper_loop(&self) {
        let mut watch = Watch::default();
        while !self.stop.load(Relaxed) {
            let w = self.token().load(SeqCst);
            let t = Token::unpack(w);
            let now = now_ns();
            let mut sleep = MAX_SLEEP_NS;
            if self.knobs().native() {
                if matches!(t.state, RUNNING | DRAINING) {
                    self.void_slice(t);
                }
                // Nobody is charged for time under policy 5.
                self.undrained.store(0, SeqCst);
            } else if t.holder == Some(self.container) {
                if t.state == DRAINING {
                    let b = 1u64 << (self.process % 64);
                    let mine = self.c(cw::DRAIN + self.process / 64).load(SeqCst) & b != 0;
                    // Mine, or mine but dropped while I did not answer.
                    let late_mine = self.undrained.load(SeqCst) == 1 << 32 | t.seq as u64;
                    if mine || late_mine {
                        self.drain(t);
                        continue;
                    }
                    if self.prune(cw::DRAIN, self.container) {
                        self.try_decide(t);
                        continue;
                    }
                    sleep = 10_000_000;
                } else if t.state == RUNNING {
                    let end = self.slice_end(now);
                    let others = self.others_want(t.holder);
                    // An operator changed a knob: decide again now, not at
                    // the slice's end (knobs take effect within ~100 ms).
                    let knobs_moved = self.file().header.knob_generation.load(Relaxed)
                        != self.g(gw::KNOB_GEN_SEEN).load(Relaxed);
                    if knobs_moved || now >= end && others {
                        self.end_slice(t);
                        continue;
                    }
                    if now >= end {
                        // Alone past its time with launches in it: a fresh
                        // slice if its credit allows (charged now, not in
                        // one piece when someone arrives).
                        if self.c(cw::SLICE_LAUNCHES).load(Relaxed) > 0 && self.renew(t) {
                            continue;
                        }
                        if !self.knobs().work_conserving() {
                            self.end_slice(t);
                            continue;
                        }
                    }
                    if others {
                        // A thread of mine inside the real launch call (the
                        // driver's queue is full and it waits for room) is
                        // busy, not idle: say so where every watcher looks.
                        if self.in_launch.load(Acquire) > 0 {
                            self.c(cw::SYNC_AT).store(now, Release);
                        }
                        // Others wait: give the GPU up as soon as my
                        // container stops launching and waits for nothing.
                        if watch.idle(t, self.slot(self.container), now)
                            && !self.holder_busy(self.container)
                        {
                            self.end_slice(t);
                            continue;
                        }
                        sleep = end.saturating_sub(now).clamp(1, IDLE_GRACE_NS);
                    } else if now < end {
                        sleep = end - now;
                    }
                }
            } else if let (RUNNING, Some(h)) = (t.state, t.holder_slot()) {
                // Another container holds the GPU while my threads wait: if
                // it makes no launch for the idle grace and none of its
                // processes that answer waits for its GPU work (idle,
                // stopped, or its helper cannot run), end its slice.
                if self.waiting.load(Acquire) > 0
                    && self.slot(self.container).weight.load(Relaxed) > 0
                {
                    if watch.idle(t, self.slot(h), now) && !self.holder_busy(h) {
                        self.end_slice(t);
                        continue;
                    }
                    sleep = IDLE_GRACE_NS;
                }
            }
            // Work of a slice whose drain was given up on while this process
            // did not answer: wait for it now and charge it.
            let u = self.undrained.load(SeqCst);
            if u != 0 && !self.holds_slice_of(t, u) {
                self.late_drain(u);
            }
            futex_wait(self.token(), w as u32, sleep);
        }
    }
}
