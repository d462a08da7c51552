//! The cross-process mechanism: exclusive time slices on the ledger's token,
//! drained and charged at handover (see docs/scheduling.md).
//!
//! One [`Gate`] per (process, GPU). Roles:
//! - launching threads: the fast path admits a launch when the token says
//!   "RUNNING, held by my container", this thread already announced itself
//!   for this slice, and the slice's launch allowance is not used up;
//!   otherwise the slow path waits (bounded futex waits), watching the
//!   holder's slice (budget, idleness) and deciding when the GPU is free;
//! - one helper thread per process: the slice timer of its container, the
//!   watcher of an idle holder while its own threads wait, and the drainer
//!   of its own process's work (`cuCtxSynchronize` on every context it
//!   launched into), after which the last drainer decides the next holder;
//! - one beat thread per process: writes the time into the process's ledger
//!   slot every few ms, so that others can tell a process that stopped
//!   answering (SIGSTOP, `docker pause`, a debugger) from one that drains.
//!
//! Every word read from the ledger is shared memory that any process can
//! write: indices are range-checked where they are used ([`Token::holder_slot`];
//! process bit positions are below `MAX_PROCESSES` by construction), times and budgets are
//! clamped, so a corrupt word costs at most a wrong decision, never a panic.

use super::decide::SLICE_NS;
use super::decide::{decide, update_estimate, Decision, Entry};
use super::policy::Knobs;
use super::sys::{futex_wait, futex_wake, now_ns};
use super::words::{container as cw, gpu as gw, Token, DECIDING, DRAINING, IDLE, RUNNING};
use crate::ledger::{ContainerSlot, Ledger, LedgerFile, MAX_CONTAINERS, MAX_PROCESSES, SLOT_LIVE};
use cgpu_ffi::CUresult;
use std::cell::Cell;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering::*};

/// `CUcontext`.
pub type CUcontext = *mut c_void;

/// The real driver's functions the drainer needs (never our own hooks).
#[derive(Clone, Copy, Debug)]
pub struct DriverOps {
    pub ctx_get_current: unsafe extern "C" fn(*mut CUcontext) -> CUresult,
    pub ctx_set_current: unsafe extern "C" fn(CUcontext) -> CUresult,
    pub ctx_synchronize: unsafe extern "C" fn() -> CUresult,
    pub ctx_get_device: unsafe extern "C" fn(*mut i32) -> CUresult,
}

/// A holder that made no launch for this long while others wait gives the
/// GPU up (its outstanding work still drains and is charged).
pub const IDLE_GRACE_NS: u64 = 2_000_000;
/// A process whose beat is older than this does not answer (stopped,
/// frozen): its bits leave the DRAIN and WANT sets, so it loses its turn.
pub const NO_ANSWER_NS: u64 = 100_000_000;
/// How often the beat thread writes the time.
pub const BEAT_NS: u64 = 10_000_000;
/// A drain by a process that still answers but takes longer than this (a
/// driver call that hangs) is given up with a warning; the GPU changes
/// hands anyway. A legitimate drain waits for about half a slice of queued
/// work plus the longest kernel.
pub const DRAIN_LIMIT_NS: u64 = 2_000_000_000;
/// Longest slice budget believed from the ledger (policy 4 uses 4 slices).
const MAX_BUDGET_NS: u64 = 8 * SLICE_NS;
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
    /// Contexts this process launched into (drained at each handover), and
    /// their devices.
    ctxs: [AtomicUsize; 8],
    ctx_devs: [AtomicI32; 8],
    /// The context the drain is synchronising now (0: none): a context
    /// being destroyed waits until the drain is done with it.
    using_ctx: AtomicUsize,
    /// A slice this process launched in and has not drained yet:
    /// `1 << 32 | seq of its DRAINING state` (0: none).
    undrained: AtomicU64,
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
            ctx_devs: Default::default(),
            using_ctx: AtomicUsize::new(0),
            undrained: AtomicU64::new(0),
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

    /// End of the current slice (start and budget range-checked: a budget
    /// above the longest any policy uses, or a start in the future, mean
    /// the slice is over).
    fn slice_end(&self, now: u64) -> u64 {
        let start = self.g(gw::SLICE_START).load(Acquire);
        let budget = self.g(gw::SLICE_BUDGET).load(Acquire);
        if budget > MAX_BUDGET_NS || start > now.saturating_add(1_000_000_000) {
            return now;
        }
        start.saturating_add(budget)
    }

    /// Has `since` (a time from the ledger) been more than `limit` ago? A
    /// time far in the future (corrupt) counts as long ago.
    fn older_than(since: u64, now: u64, limit: u64) -> bool {
        since > now.saturating_add(1_000_000_000) || now.saturating_sub(since) > limit
    }

    /// Does process slot `p` answer (its beat is recent, or it has none yet)?
    fn answers(&self, p: usize, now: u64) -> bool {
        if p == self.process {
            return true;
        }
        let beat = self.file().processes[p].sched_beat_ns.load(Relaxed);
        beat == 0 || !Self::older_than(beat, now, NO_ANSWER_NS)
    }

    /// The beat thread: a sign of life every [`BEAT_NS`] until stopped.
    pub(crate) fn beat_loop(&self) {
        let beat = &self.file().processes[self.process].sched_beat_ns;
        while !self.stop.load(Relaxed) {
            beat.store(now_ns(), Relaxed);
            std::thread::sleep(std::time::Duration::from_nanos(BEAT_NS));
        }
    }

    /// A thread of this process enters (`true`) or leaves a synchronise call.
    #[inline]
    pub(crate) fn in_sync(&self, enter: bool) {
        let w = &self.file().processes[self.process].sched_in_sync;
        if enter {
            w.fetch_add(1, AcqRel);
        } else {
            // Saturating: a call that began before this gate existed.
            let _ = w.fetch_update(AcqRel, Acquire, |n| n.checked_sub(1));
        }
    }

    /// Does a process of container `h` that launched in this slice (DRAIN
    /// set) and still answers wait inside a synchronise call? Then its GPU
    /// work is still running: the holder is busy, not idle.
    fn holder_busy(&self, h: usize) -> bool {
        let f = self.file();
        let now = now_ns();
        (0..cw::SET_WORDS).any(|wi| {
            let mut bits = f.containers[h].sched[cw::DRAIN + wi].load(Acquire);
            while bits != 0 {
                let p = wi * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                if f.processes[p].sched_in_sync.load(Acquire) > 0 && self.answers(p, now) {
                    return true;
                }
            }
            false
        })
    }

    /// Write one beat now (before the process can appear in any set).
    pub(crate) fn beat(&self) {
        self.file().processes[self.process]
            .sched_beat_ns
            .store(now_ns(), Relaxed);
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
        // A process that drives several GPUs and waits for its turn on this
        // one is not idle on the others it holds (see `mark_busy`).
        let mut others_marked: Option<super::GateMask> = None;
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
            }
            let now = now_ns();
            if waited_since.is_none() {
                waited_since = Some(now);
                if super::MULTI.load(Acquire) {
                    others_marked = Some(super::mark_busy(self, true));
                }
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
        if let Some(m) = others_marked {
            super::unmark_busy(m);
        }
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
        if SEEN.with(|s| s.get()) != key {
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
        let mut dev: i32 = -1;
        // SAFETY: a valid out-pointer; the real driver's function.
        if unsafe { (self.drv.ctx_get_device)(&mut dev) } != 0 {
            dev = -1;
        }
        for (c, d) in self.ctxs.iter().zip(&self.ctx_devs) {
            if c.compare_exchange(0, v, AcqRel, Acquire).is_ok() {
                d.store(dev, Release);
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

    /// Clear the bits of processes in `set` of container `c` that are dead,
    /// no longer of `c`, or do not answer; true when the set is then empty.
    fn prune(&self, set: usize, c: usize) -> bool {
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
            if let Some(h) = t.holder_slot() {
                // Exclusive time: slice start to drained. (An idle holder's
                // last grace is charged too: its queued work may have run
                // through it, and nothing here can tell.)
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
            // Work seen to have run after its drain was given up on.
            let owed = s.sched[cw::OWED_NS].swap(0, AcqRel).min(1_000_000_000);
            if owed > 0 {
                s.sched[cw::GPU_NS].fetch_add(owed, Relaxed);
                self.g(gw::BUSY_NS).fetch_add(owed, Relaxed);
            }
            es[i] = Entry {
                live,
                weight: s.weight.load(Acquire),
                highprio: s.highprio.load(Acquire) != 0,
                wants: live && !self.prune(cw::WANT, i),
                tokens: (s.sched[cw::TOKENS].load(Acquire) as i64).saturating_sub(owed as i64),
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
                    if knobs_moved || now >= end && (others || !self.knobs().work_conserving()) {
                        self.end_slice(t);
                        continue;
                    }
                    if others {
                        // Others wait: give the GPU up as soon as my
                        // container stops launching and waits for nothing.
                        if watch.idle(t, self.c(cw::SLICE_LAUNCHES), now)
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
                    if watch.idle(t, &self.slot(h).sched[cw::SLICE_LAUNCHES], now)
                        && !self.holder_busy(h)
                    {
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

    /// Is `t` the RUNNING or DRAINING state of the slice `undrained` names?
    fn holds_slice_of(&self, t: Token, undrained: u64) -> bool {
        let draining_seq = undrained as u32;
        t.holder == Some(self.container)
            && (t.state == DRAINING && t.seq == draining_seq
                || t.state == RUNNING && t.seq.wrapping_add(1) == draining_seq)
    }

    /// Synchronise every context this process launched into (not while it
    /// has a stream capture open). Real driver functions only.
    fn sync_contexts(&self) {
        // A stream capture open in this process: synchronising would
        // invalidate it; the process counts as drained (see capture.rs).
        let guard = super::capture::CAPTURES.sync_guard();
        if guard.is_none() {
            tracing::debug!(
                "cgpu: stream capture open: contexts not synchronised at this handover"
            );
            return;
        }
        let mut synced = false;
        for c in &self.ctxs {
            let v = c.load(Acquire);
            if v == 0 {
                continue;
            }
            // Announce the use before re-checking the entry: a context being
            // destroyed is removed first, then waits while it is in use
            // (`forget_ctx`); one of the two sees the other (SeqCst).
            self.using_ctx.store(v, SeqCst);
            if c.load(SeqCst) != v {
                self.using_ctx.store(0, SeqCst);
                continue;
            }
            synced = true;
            // SAFETY: real driver functions; `v` is a context this process
            // launched into and that was not destroyed: destruction goes
            // through `forget_ctx`, which waits while `using_ctx` names it.
            let r = unsafe {
                match (self.drv.ctx_set_current)(v as CUcontext) {
                    0 => (self.drv.ctx_synchronize)(),
                    e => e,
                }
            };
            self.using_ctx.store(0, SeqCst);
            if r != 0 && !super::capture::is_capture_error(r) {
                tracing::debug!("cgpu: drain of context {v:#x} returned {r}: forgotten");
                let _ = c.compare_exchange(v, 0, AcqRel, Acquire);
            } else if r != 0 {
                tracing::debug!("cgpu: drain of context {v:#x} returned {r} (stream capture)");
            }
        }
        if synced {
            // Keep no destroyed context current on this thread.
            // SAFETY: the real driver function; a null context is valid.
            unsafe { (self.drv.ctx_set_current)(std::ptr::null_mut()) };
        }
        drop(guard);
    }

    /// Wait until this process's outstanding work in slice `t` is done, then
    /// leave the drain set; the last one out decides. If the GPU changed
    /// hands meanwhile (this process stopped answering and was left out),
    /// the work it was seen to finish is charged late.
    fn drain(&self, t: Token) {
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
            let held = now_ns().saturating_sub(self.g(gw::SLICE_START).load(Acquire));
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
    fn late_drain(&self, undrained: u64) {
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
    fn charge_late(&self, took: u64) {
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
        for c in &self.ctxs {
            let _ = c.compare_exchange(v, 0, SeqCst, SeqCst);
        }
        while self.using_ctx.load(SeqCst) == v {
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
    }

    /// Remove every context of device `dev` (its primary context is being
    /// released or reset). A live one is registered again at its next slice.
    pub(crate) fn forget_device(&self, dev: i32) {
        for (c, d) in self.ctxs.iter().zip(&self.ctx_devs) {
            let v = c.load(SeqCst);
            if v != 0 && d.load(Acquire) == dev {
                self.forget_ctx(v);
            }
        }
    }
}

enum Enter {
    Admitted,
    Retry,
    Wait,
}

/// What one waiting thread (or a helper) remembers between looks.
#[derive(Default, Clone, Copy)]
struct Watch {
    seq: Option<u32>,
    count: u64,
    since: u64,
    /// This wait already decided once from IDLE.
    arrived: bool,
}

impl Watch {
    /// The holder of RUNNING slice `t` has made no launch (its counter
    /// `launches` unchanged) for the idle grace.
    fn idle(&mut self, t: Token, launches: &AtomicU64, now: u64) -> bool {
        let cnt = launches.load(Relaxed);
        if self.seq != Some(t.seq) || self.count != cnt {
            *self = Watch {
                seq: Some(t.seq),
                count: cnt,
                since: now,
                ..*self
            };
            false
        } else {
            now.saturating_sub(self.since) >= IDLE_GRACE_NS
        }
    }
}

/// A container slot's id, for messages.
fn id_of(s: &ContainerSlot) -> String {
    s.id_str()
}
