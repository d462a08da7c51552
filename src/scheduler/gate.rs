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
use super::decide::{allowance, decide, update_estimate, Decision, Entry, Params};
use super::guest_clock::{EventOps, GuestClock};
use super::policy::Knobs;
use super::sys::{futex_wait, futex_wake, now_ns};
use super::words::{
    container as cw, gpu as gw, weightless_bit, Token, DECIDING, DRAINING, IDLE, RUNNING,
};
use crate::ledger::{
    free_weight, ContainerSlot, Ledger, LedgerFile, MAX_CONTAINERS, MAX_PROCESSES, SLOT_LIVE,
};
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
    pub stream_query: unsafe extern "C" fn(*mut c_void) -> CUresult,
    /// Events to time a guest's work on the device (without them a guest is
    /// charged its wall time).
    pub events: Option<EventOps>,
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
/// Launches a guest may have queued before its work is seen done (a
/// synchronise that returns): beyond them it waits for its turn.
pub const GUEST_MAX: u32 = 2;
/// A quarter slice: a guest's [`GUEST_MAX`] launches must fit in it (at
/// its measured time per launch), and a high-priority container whose last
/// slice used more is not light (see [`Gate::light`]).
pub const GUEST_SLICE_NS: u64 = SLICE_NS / 4;
/// A high-priority container runs beside the holder, whatever it owes,
/// while its recent use of the GPU is below this fraction of its share.
pub const GUEST_BELOW: f64 = 0.75;
/// A container owing more than this (a bucket in debt) waits for its own
/// slice rather than run beside the holder as its guest.
pub const GUEST_DEBT_NS: i64 = SLICE_NS as i64;
/// Least time between two attempts of one process to take a free weight
/// for its weightless container.
const WEIGHT_TRY_NS: u64 = 10_000_000;
/// Longest single sleep of any waiter: every wait re-checks the world.
const MAX_SLEEP_NS: u64 = 50_000_000;

thread_local! {
    /// (slice seq | gate epoch << 32) this thread announced itself for.
    pub(crate) static SEEN: Cell<u64> = const { Cell::new(u64::MAX) };
    /// (gate, stream) of this thread's guest launch in flight (gate 0:
    /// none): its end is marked on the guest clock when it returns.
    static GUEST_END: Cell<(usize, usize)> = const { Cell::new((0, 0)) };
}

static EPOCHS: AtomicU32 = AtomicU32::new(1);

pub struct Gate {
    ledger: &'static Ledger,
    pub(crate) container: usize,
    pub(crate) process: usize,
    epoch: u32,
    /// The fork generation it was made in: a forked child never uses it.
    pub(crate) generation: u64,
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
    /// When this process last tried to take a free weight for its
    /// weightless container (see [`Gate::take_free_weight`]).
    weight_try: AtomicU64,
    /// The stream this process launched on since its work was last seen
    /// done ([`NO_STREAM`]: none; [`MIXED`]: several), so that a
    /// `cuStreamSynchronize` of that stream tells its queue is empty.
    last_stream: AtomicUsize,
    /// When this process's work as a guest (beside another container's
    /// slice) began, 0 = none queued; and how many launches it made.
    guest_since: AtomicU64,
    guest_launches: AtomicU32,
    /// When a synchronise last saw this process's queue empty (0: never).
    empty_at: AtomicU64,
    /// The stream (as [`launch_key`]) of its guest launches ([`MIXED`]:
    /// several).
    guest_key: AtomicUsize,
    /// The device time of its guest work (see [`GuestClock`]).
    clock: GuestClock,
}

/// A stream as launched on by the calling thread: the handle mixed with the
/// thread (the per-thread default stream has the same handle in every
/// thread), so that a stream's synchronise tells the queue is empty only
/// when one thread launched on that one stream.
#[inline]
fn launch_key(stream: usize) -> usize {
    let thread = SEEN.with(|c| c as *const Cell<u64> as usize);
    stream.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ thread
}

/// [`Gate::last_stream`]: no launch since the work was last seen done.
const NO_STREAM: usize = usize::MAX;
/// [`Gate::last_stream`]: launches on several streams.
const MIXED: usize = usize::MAX - 1;

/// What a synchronise call waited for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Synced {
    /// `cuCtxSynchronize`: every stream of the current context.
    Context,
    /// `cuStreamSynchronize` of this stream.
    Stream(usize),
}

/// What a synchronise call saw when it began (see [`Gate::sync_began`]).
#[derive(Clone, Copy, Debug)]
pub struct SyncStart {
    token: u64,
    launches: u64,
    guests: u32,
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
            generation: crate::process::fork::generation(),
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
            weight_try: AtomicU64::new(0),
            last_stream: AtomicUsize::new(NO_STREAM),
            guest_since: AtomicU64::new(0),
            guest_launches: AtomicU32::new(0),
            empty_at: AtomicU64::new(0),
            guest_key: AtomicUsize::new(NO_STREAM),
            clock: GuestClock::new(drv.events),
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
            self.c(cw::SYNC_AT).store(now_ns(), Release);
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

    /// Is container `h` busy with its GPU work: a process of it that
    /// answers is inside a synchronise call, or one returned within the
    /// idle grace?
    fn holder_active(&self, h: usize, now: u64) -> bool {
        let f = self.file();
        let at = f.containers[h].sched[cw::SYNC_AT].load(Acquire);
        if at <= now && now - at < IDLE_GRACE_NS {
            return true;
        }
        f.processes.iter().enumerate().any(|(p, ps)| {
            ps.state.load(Acquire) == SLOT_LIVE
                && ps.container.load(Acquire) as usize == h
                && ps.sched_in_sync.load(Acquire) > 0
                && self.answers(p, now)
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
    fn note_launch(&self, stream: usize) {
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

    /// The holder launches again after its work was seen done: the GPU was
    /// idle for it since then; count that time as not used.
    #[cold]
    #[inline(never)]
    fn close_gap(&self) {
        let since = self.c(cw::EMPTY_SINCE).swap(0, AcqRel);
        let now = now_ns();
        if since != 0 && since >= self.g(gw::SLICE_START).load(Acquire) && now > since {
            self.c(cw::IDLE_NS).fetch_add(now - since, AcqRel);
            self.g(gw::GAP_IDLE_NS)
                .fetch_add(self.gap_idle(since, now), AcqRel);
        }
    }

    /// Of the holder's gap from `since` to `now`, the time no guest held
    /// the seat: the GPU had no work then.
    fn gap_idle(&self, since: u64, now: u64) -> u64 {
        let gap = now.saturating_sub(since);
        let seated = self
            .seat_time(now)
            .wrapping_sub(self.g(gw::GAP_SEAT0).load(Acquire));
        gap - seated.min(gap)
    }

    /// A gap of the holder begins at `at`.
    fn open_gap(&self, at: u64) {
        self.g(gw::GAP_SEAT0).store(self.seat_time(at), Release);
    }

    /// Host time the guest seat has been held up to `now`, ns (a running
    /// sum: only differences mean anything). A guest holds the seat from
    /// its first launch until its work is seen done, so while the holder
    /// has nothing queued the seat's time is, about, the GPU's time on a
    /// guest's work (a little more: the guest's wake-up after its work).
    fn seat_time(&self, now: u64) -> u64 {
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
    fn close_seat(&self, at: u64, now: u64) {
        self.g(gw::GUEST_SEAT_NS)
            .fetch_add(now.saturating_sub(at).min(SLICE_NS), AcqRel);
    }

    /// A synchronise call of a thread of this process begins.
    pub fn sync_began(&self) -> SyncStart {
        SyncStart {
            token: self.token().load(SeqCst),
            launches: self.c(cw::SLICE_LAUNCHES).load(SeqCst),
            guests: self.guest_launches.load(SeqCst),
        }
    }

    /// A synchronise call that began at `b` returned `rc` after waiting for
    /// `what`. When it succeeded, this process's queue is then empty (a
    /// context, or the only stream it launched on), no launch of its
    /// container was admitted meanwhile and no other process of it launched
    /// in this slice, the GPU is idle for the holder from now until its
    /// next launch: that time is not charged to it.
    pub fn sync_returned(&self, b: SyncStart, rc: CUresult, what: Synced) {
        if rc != 0 {
            return;
        }
        let empty = match what {
            Synced::Context => true,
            Synced::Stream(s) => self.last_stream.load(Relaxed) == launch_key(s),
        };
        if !empty {
            return;
        }
        self.empty_at.store(now_ns(), Release);
        self.last_stream.store(NO_STREAM, Relaxed);
        if self.guest_since.load(Acquire) != 0
            && self.in_launch.load(SeqCst) == 0
            && self.guest_launches.load(SeqCst) == b.guests
        {
            // Its work as a guest is done: charge it.
            self.guest_done(now_ns(), true);
        }
        let t = Token::unpack(b.token);
        let alone = (0..cw::SET_WORDS).all(|wi| {
            let bits = self.c(cw::DRAIN + wi).load(Acquire);
            if wi == self.process / 64 {
                bits & !(1u64 << (self.process % 64)) == 0
            } else {
                bits == 0
            }
        });
        if t.state == RUNNING
            && t.holder == Some(self.container)
            && alone
            && self.in_launch.load(SeqCst) == 0
            && self.c(cw::SLICE_LAUNCHES).load(SeqCst) == b.launches
            && self.token().load(SeqCst) == b.token
        {
            let now = now_ns();
            let empty = self
                .c(cw::EMPTY_SINCE)
                .compare_exchange(0, now, AcqRel, Acquire)
                .is_ok();
            if empty {
                self.open_gap(now);
            }
            if empty
                && self.g(gw::GUEST_SEAT).load(Acquire) == 0
                && self.others_want(Some(self.container))
            {
                // The holder's queue is empty and nobody runs beside it: a
                // waiting container may fill the gap as its guest (see
                // `guest`).
                futex_wake(self.token());
            }
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

    /// A guest launch of this thread returned: mark its end on the clock.
    #[cold]
    #[inline(never)]
    fn guest_launched(&self) {
        let (g, stream) = GUEST_END.with(|g| g.replace((0, 0)));
        if g == self as *const Gate as usize {
            self.clock.launched(stream);
        }
    }

    /// Slow path: announce, or wait. Returns whether a launch was admitted
    /// under the token (false only when the policy is native).
    #[cold]
    #[inline(never)]
    fn admit_slow(&self, stream: usize) -> bool {
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
            super::unmark_busy(m);
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
    fn take_free_weight(&self) -> bool {
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
    fn arrived_weightless(&self) -> bool {
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
    fn guest(&self, t: Token, k: &Knobs, stream: usize) -> bool {
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
    fn seated(&self) -> bool {
        self.g(gw::GUEST_SEAT).load(Acquire) == self.process as u64 + 1
    }

    /// Take the guest seat if it is free, was left for over a slice, or is
    /// held by a process that is gone.
    fn take_seat(&self, now: u64) -> bool {
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
    fn leave_seat(&self) {
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
    fn credit(&self) -> i64 {
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
    fn light(&self, now: u64, k: &Knobs) -> bool {
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
    fn guest_done(&self, now: u64, seen_done: bool) {
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
    fn share(&self, c: usize, k: &Knobs) -> f64 {
        let mut ms = [super::policy::Member::default(); MAX_CONTAINERS];
        for (m, s) in ms.iter_mut().zip(self.file().containers.iter()) {
            let live = s.state.load(Acquire) == SLOT_LIVE && s.nprocs.load(Acquire) > 0;
            *m = super::policy::Member {
                live,
                weight: s.weight.load(Acquire),
                highprio: s.highprio.load(Acquire) != 0,
                active: live,
            };
        }
        let mut rate = [0.0f64; MAX_CONTAINERS];
        super::policy::shares(k, &ms, &mut rate);
        rate[c]
    }

    /// My container's recent use of the GPU (charged ns per ns, averaged
    /// over about a second, updated every 100 ms; `share` stands in for a
    /// corrupt word).
    fn recent_rate(&self, now: u64, share: f64) -> f64 {
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
    fn renew(&self, t: Token) -> bool {
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
        let mine = t.next(DECIDING, Some(h), Some(self.process));
        if self
            .token()
            .compare_exchange(t.pack(), mine.pack(), SeqCst, SeqCst)
            .is_err()
        {
            return false;
        }
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
            let draining = Token {
                state: DRAINING,
                aux: None,
                ..mine
            };
            if self
                .token()
                .compare_exchange(mine.pack(), draining.pack(), SeqCst, SeqCst)
                .is_ok()
            {
                futex_wake(self.token());
            }
            return false;
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
        // Only we move the token out of our state (unless we were declared
        // dead and a successor took it).
        if self
            .token()
            .compare_exchange(mine.pack(), t.pack(), SeqCst, SeqCst)
            .is_ok()
        {
            futex_wake(self.token());
        }
        true
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

    /// Charges the holder's slice that began at `start`, up to `now`, to its
    /// container (`cs`) and the GPU: GPU time, last slice, launches and the
    /// estimate per launch. Not charged to it: what its guests were charged
    /// and the GPU's idle time in its gaps, `gap_idle` (see [`not_used`]).
    /// Returns (time charged, time charged to nobody).
    fn charge_slice(
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

    /// Time of the slice that began at `start` during which its holder (one
    /// process: `drained` processes launched in it) had no work queued,
    /// up to `now`, and the part of it no guest held the seat (the GPU's
    /// idle time); taken out of the words (0 for several processes: one's
    /// idle time may be another's busy time).
    fn unused(&self, cs: &[AtomicU64], start: u64, now: u64, drained: u64) -> (u64, u64) {
        self.gaps(cs, start, now, drained, true)
    }

    /// As [`Gate::unused`]; the words are taken out of the ledger when
    /// `take`, else only read (a process's part of the slice, charged
    /// before the decision that takes them).
    fn gaps(&self, cs: &[AtomicU64], start: u64, now: u64, drained: u64, take: bool) -> (u64, u64) {
        let read = |w: &AtomicU64| {
            if take {
                w.swap(0, AcqRel)
            } else {
                w.load(Acquire)
            }
        };
        let since = read(&cs[cw::EMPTY_SINCE]);
        let mut idle = read(&cs[cw::IDLE_NS]);
        let mut gap_idle = read(self.g(gw::GAP_IDLE_NS));
        if drained > 1 {
            return (0, 0);
        }
        if since != 0 && since >= start && now > since {
            idle = idle.saturating_add(now - since);
            gap_idle = gap_idle.saturating_add(self.gap_idle(since, now));
        }
        let idle = idle.min(now.saturating_sub(start));
        (idle, gap_idle.min(idle))
    }

    /// Every container slot as a decision sees it (work owed and guest work
    /// taken out of the words and charged to its GPU time).
    fn entries(&self) -> [Entry; MAX_CONTAINERS] {
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
        let next = match d {
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

    /// Is `t` the RUNNING or DRAINING state of the slice `undrained` names
    /// (or its renewal in place, which has the draining state's number)?
    fn holds_slice_of(&self, t: Token, undrained: u64) -> bool {
        let draining_seq = undrained as u32;
        t.holder == Some(self.container)
            && ((t.state == DRAINING || t.state == DECIDING) && t.seq == draining_seq
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
        self.clock.forget(v, None);
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
        self.clock.forget(0, Some(dev));
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
    /// The holder `h` of RUNNING slice `t` has made no launch and had no
    /// synchronise call return (its counters unchanged) for the idle grace.
    /// (Counting from its last launch alone, a training loop that waits
    /// 2 ms for its kernels and then spends 0.3 ms on the host looked idle
    /// in every host gap, and lost its slice after two kernels.)
    fn idle(&mut self, t: Token, h: &ContainerSlot, now: u64) -> bool {
        let cnt = h.sched[cw::SLICE_LAUNCHES]
            .load(Relaxed)
            .wrapping_add(h.sched[cw::SYNC_AT].load(Acquire));
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

/// What the holder of a slice did not use, ns: what its guests were
/// charged (their work ran beside or between its own) and the GPU's idle
/// time in its gaps (`gap_idle`: it had nothing queued and no guest held
/// the seat), of `unused`, the whole of its gaps. That is the sum of the
/// two, kept at least the larger of `unused` and `guests` (the seat's
/// tenure overstates a guest's part of a gap: its wake-up after its work
/// is in it) and at most their sum (guest work wholly outside the gaps).
/// Before the seat's time was measured, the holder was charged as if the
/// larger were all it left: it paid for the smaller of the GPU's idle time
/// in its gaps and the guest work beside its own, 1.13x its device time in
/// a 1:2 mix of jobs that synchronise often.
fn not_used(unused: u64, guests: u64, gap_idle: u64) -> u64 {
    guests
        .saturating_add(gap_idle.min(unused))
        .clamp(unused.max(guests), unused.saturating_add(guests))
}

#[cfg(test)]
mod tests {
    use super::not_used;

    const MS: u64 = 1_000_000;

    #[test]
    fn a_holder_leaves_its_guests_time_and_the_idle_part_of_its_gaps() {
        // Guests filled its 0.3 ms of gaps and ran 1.7 ms beside its work.
        assert_eq!(not_used(3 * MS / 10, 2 * MS, 0), 2 * MS);
        // The same guests, but its gaps stayed idle: both come off.
        assert_eq!(not_used(3 * MS / 10, 2 * MS, 3 * MS / 10), 23 * MS / 10);
        // No guests: its gaps, idle.
        assert_eq!(not_used(MS, 0, MS), MS);
    }

    #[test]
    fn what_a_holder_leaves_stays_between_the_larger_and_the_sum() {
        // The seat's time overstated the guest's part of the gaps.
        assert_eq!(not_used(MS, MS / 5, 0), MS);
        // Idle time measured beyond the gaps counts the gaps only.
        assert_eq!(not_used(MS, MS / 5, 5 * MS), MS + MS / 5);
        // Corrupt words never overflow.
        assert_eq!(not_used(u64::MAX, u64::MAX, u64::MAX), u64::MAX);
    }
}
