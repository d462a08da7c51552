//! The cross-process mechanism: exclusive time slices on the ledger's token,
//! drained and charged at handover (see docs/scheduling.md).
//!
//! One [`Gate`] per (process, GPU). Roles:
//! - launching threads: the fast path admits a launch when the token says
//!   "RUNNING, held by my container", this thread already announced itself
//!   for this slice, and the slice's launch allowance is not used up;
//!   otherwise the slow path waits (bounded futex waits), watching the
//!   holder's slice (budget, idleness) and deciding when the GPU is free;
//! - one helper thread per process: the slice timer of its container and the
//!   drainer of its own process's work (`cuCtxSynchronize` on every context
//!   it launched into), after which the last drainer decides the next holder.

use super::decide::{decide, update_estimate, Decision, Entry};
use super::policy::Knobs;
use super::sys::{futex_wait, futex_wake, now_ns};
use super::words::{container as cw, gpu as gw, Token, DECIDING, DRAINING, IDLE, RUNNING};
use crate::ledger::{ContainerSlot, Ledger, LedgerFile, MAX_CONTAINERS, MAX_PROCESSES, SLOT_LIVE};
use cgpu_ffi::CUresult;
use std::cell::Cell;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::*};

/// `CUcontext`.
pub type CUcontext = *mut c_void;

/// The real driver's functions the drainer needs (never our own hooks).
#[derive(Clone, Copy, Debug)]
pub struct DriverOps {
    pub ctx_get_current: unsafe extern "C" fn(*mut CUcontext) -> CUresult,
    pub ctx_set_current: unsafe extern "C" fn(CUcontext) -> CUresult,
    pub ctx_synchronize: unsafe extern "C" fn() -> CUresult,
}

/// A holder that made no launch for this long while others wait gives the
/// GPU up (its outstanding work still drains and is charged).
pub const IDLE_GRACE_NS: u64 = 2_000_000;
/// A drain that takes longer than this (a process frozen while holding)
/// is abandoned with a warning; the GPU changes hands anyway.
pub const DRAIN_LIMIT_NS: u64 = 10_000_000_000;
/// A decision older than this (its maker died or froze) is taken over.
pub const DECIDE_LIMIT_NS: u64 = 500_000_000;
/// Longest single sleep of any waiter: every wait re-checks the world.
const MAX_SLEEP_NS: u64 = 50_000_000;

thread_local! {
    /// (slice seq | gate epoch << 32) this thread announced itself for.
    pub(crate) static SEEN: Cell<u64> = const { Cell::new(u64::MAX) };
}

static EPOCHS: AtomicU32 = AtomicU32::new(1);

pub struct Gate {
    ledger: &'static Ledger,
    pub(crate) container: usize,
    pub(crate) process: usize,
    epoch: u32,
    /// High half of the token word when my container holds it RUNNING.
    running_hi: u32,
    drv: DriverOps,
    /// Threads of this process between admission and the real launch's return.
    in_launch: AtomicU64,
    /// Threads of this process waiting in the slow path.
    waiting: AtomicU32,
    /// Contexts this process launched into (drained at each handover).
    ctxs: [AtomicUsize; 8],
    pub(crate) stop: AtomicBool,
    warned_weight0: AtomicBool,
}

impl Gate {
    pub fn new(ledger: &'static Ledger, container: usize, process: usize, drv: DriverOps) -> Gate {
        assert!(container < MAX_CONTAINERS && process < MAX_PROCESSES);
        let hi = (Token::running(0, container) >> 32) as u32;
        Gate {
            ledger,
            container,
            process,
            epoch: EPOCHS.fetch_add(1, Relaxed),
            running_hi: hi,
            drv,
            in_launch: AtomicU64::new(0),
            waiting: AtomicU32::new(0),
            ctxs: Default::default(),
            stop: AtomicBool::new(false),
            warned_weight0: AtomicBool::new(false),
        }
    }

    #[inline]
    fn file(&self) -> &'static LedgerFile {
        self.ledger.file()
    }
    #[inline]
    fn g(&self, i: usize) -> &'static AtomicU64 {
        &self.file().header.sched[i]
    }
    #[inline]
    fn slot(&self, c: usize) -> &'static ContainerSlot {
        &self.file().containers[c]
    }
    #[inline]
    fn c(&self, i: usize) -> &'static AtomicU64 {
        &self.slot(self.container).sched[i]
    }
    #[inline]
    fn token(&self) -> &'static AtomicU64 {
        self.g(gw::TOKEN)
    }

    fn knobs(&self) -> Knobs {
        let h = &self.file().header;
        Knobs::sanitized(
            h.policy.load(Acquire),
            h.max_inst.load(Acquire),
            h.prio_ratio.load(Acquire),
        )
    }

    /// Fast path: true = admitted (the caller must call [`Gate::done`]).
    #[inline]
    pub fn admit(&self) -> bool {
        self.in_launch.fetch_add(1, SeqCst);
        let w = self.token().load(SeqCst);
        if (w >> 32) as u32 == self.running_hi
            && SEEN.with(|s| s.get()) == (w as u32 as u64 | (self.epoch as u64) << 32)
            && self.c(cw::SLICE_LAUNCHES).fetch_add(1, Relaxed)
                < self.g(gw::SLICE_ALLOW).load(Relaxed)
        {
            return true;
        }
        self.in_launch.fetch_sub(1, SeqCst);
        self.admit_slow()
    }

    /// After the real launch returned.
    #[inline]
    pub fn done(&self) {
        self.in_launch.fetch_sub(1, Release);
    }

    /// Slow path: announce, or wait. Returns whether a launch was admitted
    /// under the token (false only when the policy is native).
    #[cold]
    #[inline(never)]
    fn admit_slow(&self) -> bool {
        let mut waited_since: Option<u64> = None;
        let mut watch = Watch::default();
        let admitted = loop {
            let k = self.knobs();
            let w = self.token().load(SeqCst);
            let t = Token::unpack(w);
            if k.native() || self.stop.load(Relaxed) {
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
            }
            let now = now_ns();
            if waited_since.is_none() {
                waited_since = Some(now);
                self.want(true);
                // Tell the holder's helpers someone waits (idle hand-over).
                futex_wake(self.token());
            } else {
                // Re-assert (a racing last-waiter-leaves may have cleared it).
                self.set_bit(cw::WANT, self.container, true);
            }
            if self.slot(self.container).weight.load(Relaxed) == 0
                && !self.warned_weight0.swap(true, Relaxed)
            {
                tracing::warn!(
                    "cgpu: container {} has compute weight 0 (it arrived when free_weight was 0, or an operator set it): its kernel launches wait until an operator gives it weight (`cgpuctl set weight`)",
                    id_of(self.slot(self.container))
                );
            }
            let timeout = self.step(t, now, &mut watch);
            if timeout > 0 {
                futex_wait(self.token(), w as u32, timeout);
            }
        };
        if let Some(s) = waited_since {
            self.want(false);
            self.c(cw::THROTTLED_NS)
                .fetch_add(now_ns().saturating_sub(s), Relaxed);
        }
        admitted
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
        SEEN.with(|s| s.set(key));
        if self.c(cw::SLICE_LAUNCHES).fetch_add(1, Relaxed) < self.g(gw::SLICE_ALLOW).load(Relaxed)
        {
            return Enter::Admitted;
        }
        // Allowance used up: the queue is long enough; end the slice so the
        // drain measures what it cost.
        self.in_launch.fetch_sub(1, SeqCst);
        self.end_slice(t);
        Enter::Wait
    }

    fn register_ctx(&self) {
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the real driver's function, not a hook.
        let r = unsafe { (self.drv.ctx_get_current)(&mut ctx) };
        if r != 0 || ctx.is_null() {
            return;
        }
        let v = ctx as usize;
        if self.ctxs.iter().any(|c| c.load(Acquire) == v) {
            return;
        }
        for c in &self.ctxs {
            if c.compare_exchange(0, v, AcqRel, Acquire).is_ok() {
                return;
            }
            if c.load(Acquire) == v {
                return;
            }
        }
        tracing::warn!("cgpu: more than {} contexts in one process: the extra ones are not drained at handover", self.ctxs.len());
    }

    fn want(&self, on: bool) {
        if on {
            self.waiting.fetch_add(1, AcqRel);
            self.set_bit(cw::WANT, self.container, true);
            self.c(cw::LAST_WAIT_NS).store(now_ns(), Relaxed);
        } else if self.waiting.fetch_sub(1, AcqRel) == 1 {
            self.set_bit(cw::WANT, self.container, false);
            if self.waiting.load(Acquire) > 0 {
                self.set_bit(cw::WANT, self.container, true);
            }
        }
    }

    fn set_bit(&self, set: usize, c: usize, on: bool) {
        let w = &self.slot(c).sched[set + self.process / 64];
        let b = 1u64 << (self.process % 64);
        if on {
            w.fetch_or(b, SeqCst);
        } else {
            w.fetch_and(!b, SeqCst);
        }
    }

    /// Clear the bits of processes in `set` of container `c` that are dead or
    /// no longer of `c`; true when the set is then empty.
    fn prune(&self, set: usize, c: usize) -> bool {
        let f = self.file();
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

    fn set_empty(&self, set: usize, c: usize) -> bool {
        (0..cw::SET_WORDS).all(|i| self.slot(c).sched[set + i].load(SeqCst) == 0)
    }

    /// Does an eligible container other than `holder` wait to launch?
    fn others_want(&self, holder: Option<usize>) -> bool {
        let f = self.file();
        f.containers.iter().enumerate().any(|(i, s)| {
            Some(i) != holder
                && s.state.load(Acquire) == SLOT_LIVE
                && s.weight.load(Relaxed) > 0
                && (0..cw::SET_WORDS).any(|j| s.sched[cw::WANT + j].load(Relaxed) != 0)
        })
    }

    /// RUNNING → DRAINING (only from exactly `t`).
    fn end_slice(&self, t: Token) -> bool {
        let next = t.next(DRAINING, t.holder, None);
        if self
            .token()
            .compare_exchange(t.pack(), next.pack(), SeqCst, SeqCst)
            .is_ok()
        {
            self.g(gw::STATE_SINCE).store(now_ns(), Release);
            futex_wake(self.token());
            true
        } else {
            false
        }
    }

    /// Policy 5: drop the token to IDLE without charging anyone.
    fn void_slice(&self, t: Token) {
        let next = t.next(IDLE, None, None);
        if self
            .token()
            .compare_exchange(t.pack(), next.pack(), SeqCst, SeqCst)
            .is_ok()
        {
            self.g(gw::IDLE_UNTIL).store(0, Release);
            futex_wake(self.token());
        }
    }

    /// One look at the world by a waiting thread; returns how long to sleep.
    fn step(&self, t: Token, now: u64, watch: &mut Watch) -> u64 {
        match t.state {
            RUNNING => {
                let h = t.holder.unwrap_or(0);
                let end = self.g(gw::SLICE_START).load(Acquire).saturating_add(self.g(gw::SLICE_BUDGET).load(Acquire));
                if self.slot(self.container).weight.load(Relaxed) == 0 {
                    // No compute for us: never cut others' slices short.
                    return MAX_SLEEP_NS;
                }
                if now >= end {
                    self.end_slice(t);
                    return 0;
                }
                // An idle holder is handed over by its own helper thread; a
                // dead one (no helper) at its slice's end.
                let _ = h;
                (end - now).min(MAX_SLEEP_NS)
            }
            DRAINING => {
                let h = t.holder.unwrap_or(0);
                if self.prune(cw::DRAIN, h) {
                    self.try_decide(t);
                    return 0;
                }
                let since = self.g(gw::STATE_SINCE).load(Acquire);
                if now.saturating_sub(since) > DRAIN_LIMIT_NS && since != 0 {
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
                if dead || now.saturating_sub(since) > DECIDE_LIMIT_NS {
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

    /// Take the DECIDING state from exactly `t` (DRAINING, IDLE or a stale
    /// DECIDING), charge the holder, choose the next one.
    pub(crate) fn try_decide(&self, t: Token) -> Option<Token> {
        let mine = t.next(DECIDING, None, Some(self.process));
        if self
            .token()
            .compare_exchange(t.pack(), mine.pack(), SeqCst, SeqCst)
            .is_err()
        {
            return None;
        }
        let now = now_ns();
        self.g(gw::STATE_SINCE).store(now, Release);
        let f = self.file();
        let mut charge = None;
        if t.state == DRAINING {
            if let Some(h) = t.holder {
                let held = now.saturating_sub(self.g(gw::SLICE_START).load(Acquire));
                let cs = &f.containers[h].sched;
                let allow = self.g(gw::SLICE_ALLOW).load(Acquire);
                let launches = cs[cw::SLICE_LAUNCHES].load(Acquire).min(allow);
                cs[cw::GPU_NS].fetch_add(held, Relaxed);
                cs[cw::LAUNCHES].fetch_add(launches, Relaxed);
                let est = update_estimate(cs[cw::NS_PER_LAUNCH].load(Relaxed), held, launches);
                cs[cw::NS_PER_LAUNCH].store(est, Relaxed);
                self.g(gw::BUSY_NS).fetch_add(held, Relaxed);
                charge = Some((h, held));
            }
        }
        let mut es = [Entry::default(); MAX_CONTAINERS];
        for (i, s) in f.containers.iter().enumerate() {
            let live = s.state.load(Acquire) == SLOT_LIVE && s.nprocs.load(Acquire) > 0;
            es[i] = Entry {
                live,
                weight: s.weight.load(Acquire),
                highprio: s.highprio.load(Acquire) != 0,
                wants: live && !self.prune(cw::WANT, i),
                tokens: s.sched[cw::TOKENS].load(Acquire) as i64,
                ns_per_launch: s.sched[cw::NS_PER_LAUNCH].load(Relaxed),
            };
        }
        let k = self.knobs();
        let last = self.g(gw::LAST_REFILL).load(Acquire);
        let last = if last == 0 { now } else { last };
        let d = decide(&k, now, last, charge, &mut es);
        for (i, s) in f.containers.iter().enumerate() {
            s.sched[cw::TOKENS].store(es[i].tokens as u64, Release);
        }
        self.g(gw::LAST_REFILL).store(now, Release);
        self.g(gw::KNOB_GEN_SEEN)
            .store(f.header.knob_generation.load(Relaxed), Relaxed);
        let next = match d {
            Decision::Run {
                c,
                budget_ns,
                allow,
            } => {
                let cs = &f.containers[c].sched;
                cs[cw::SLICE_LAUNCHES].store(0, SeqCst);
                for i in 0..cw::SET_WORDS {
                    cs[cw::DRAIN + i].store(0, SeqCst);
                }
                cs[cw::SLICES].fetch_add(1, Relaxed);
                self.g(gw::SLICES).fetch_add(1, Relaxed);
                self.g(gw::SLICE_BUDGET).store(budget_ns, Release);
                self.g(gw::SLICE_ALLOW).store(allow, Release);
                self.g(gw::SLICE_START).store(now_ns(), Release);
                mine.next(RUNNING, Some(c), None)
            }
            Decision::Idle { until } => {
                self.g(gw::IDLE_UNTIL).store(until, Release);
                mine.next(IDLE, None, None)
            }
        };
        // Only we may move the token out of our DECIDING state (unless we
        // were declared dead, in which case a successor owns it: do nothing).
        if self
            .token()
            .compare_exchange(mine.pack(), next.pack(), SeqCst, SeqCst)
            .is_ok()
        {
            futex_wake(self.token());
        }
        Some(next)
    }

    /// Helper thread: slice timer for my container, drainer for my process.
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
            } else if t.holder == Some(self.container) {
                if t.state == DRAINING {
                    let b = 1u64 << (self.process % 64);
                    if self.c(cw::DRAIN + self.process / 64).load(SeqCst) & b != 0 {
                        self.drain(t);
                        continue;
                    }
                    if self.prune(cw::DRAIN, self.container) {
                        self.try_decide(t);
                        continue;
                    }
                    sleep = 10_000_000;
                } else if t.state == RUNNING {
                    let end = self
                        .g(gw::SLICE_START)
                        .load(Acquire)
                        .saturating_add(self.g(gw::SLICE_BUDGET).load(Acquire));
                    let others = self.others_want(t.holder);
                    // An operator changed a knob: decide again now, not at
                    // the slice's end (knobs take effect within ~100 ms).
                    let knobs_moved = self.file().header.knob_generation.load(Relaxed)
                        != self.g(gw::KNOB_GEN_SEEN).load(Relaxed);
                    if knobs_moved || now >= end && (others || !self.knobs().work_conserving()) {
                        self.end_slice(t);
                        continue;
                    }
                    if others {
                        // Others wait: give the GPU up as soon as my
                        // container stops launching (idle, or dead).
                        let cnt = self.c(cw::SLICE_LAUNCHES).load(Relaxed);
                        if watch.seq != Some(t.seq) || watch.count != cnt {
                            watch = Watch {
                                seq: Some(t.seq),
                                count: cnt,
                                since: now,
                                ..watch
                            };
                        } else if now.saturating_sub(watch.since) >= IDLE_GRACE_NS {
                            self.end_slice(t);
                            continue;
                        }
                        sleep = end.saturating_sub(now).clamp(1, IDLE_GRACE_NS);
                    } else if now < end {
                        sleep = end - now;
                    }
                }
            }
            futex_wait(self.token(), w as u32, sleep);
        }
    }

    /// Wait until this process's outstanding work in slice `t` is done, then
    /// leave the drain set; the last one out decides.
    fn drain(&self, t: Token) {
        let deadline = now_ns() + 500_000_000;
        while self.in_launch.load(SeqCst) > 0 && now_ns() < deadline {
            std::thread::sleep(std::time::Duration::from_micros(20));
        }
        // A stream capture open in this process: synchronising would
        // invalidate it; the process counts as drained (see capture.rs).
        let guard = super::capture::CAPTURES.sync_guard();
        if guard.is_none() {
            tracing::debug!(
                "cgpu: stream capture open: contexts not synchronised at this handover"
            );
        }
        for c in self.ctxs.iter().filter(|_| guard.is_some()) {
            let v = c.load(Acquire);
            if v == 0 {
                continue;
            }
            // SAFETY: real driver functions; `v` is a context this process
            // launched into. A destroyed one makes the calls fail, and is forgotten.
            let r = unsafe {
                match (self.drv.ctx_set_current)(v as CUcontext) {
                    0 => (self.drv.ctx_synchronize)(),
                    e => e,
                }
            };
            if r != 0 && !super::capture::is_capture_error(r) {
                tracing::debug!("cgpu: drain of context {v:#x} returned {r}: forgotten");
                let _ = c.compare_exchange(v, 0, AcqRel, Acquire);
            } else if r != 0 {
                tracing::debug!("cgpu: drain of context {v:#x} returned {r} (stream capture)");
            }
        }
        drop(guard);
        self.set_bit(cw::DRAIN, self.container, false);
        if self.set_empty(cw::DRAIN, self.container) {
            self.try_decide(t);
        }
    }
}

enum Enter {
    Admitted,
    Retry,
    Wait,
}

/// What one waiting thread remembers between looks.
#[derive(Default, Clone, Copy)]
struct Watch {
    seq: Option<u32>,
    count: u64,
    since: u64,
    /// This wait already decided once from IDLE.
    arrived: bool,
}

/// A container slot's id, for messages.
fn id_of(s: &ContainerSlot) -> String {
    s.id_str()
}
