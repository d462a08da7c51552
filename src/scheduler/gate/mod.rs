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
//!
//! The rooms of this module (one `impl Gate` each):
//! - `mod.rs` (here): the gate's state, its constants, and the reads every
//!   room shares (ledger words, the slice's end, who answers, the knobs);
//! - [`admit`]: admission of a launch: the fast path, the slow path's wait,
//!   entering my container's slice, and a weightless container taking a
//!   free weight;
//! - [`guest`]: running beside another container's slice: the one guest
//!   seat, who may be a guest, and what a guest is charged;
//! - [`idle`]: the holder's idle gaps (its queue seen empty by a
//!   synchronise), telling a busy holder from an idle one, and what of its
//!   slice it did not use;
//! - [`token`]: the token's transitions (end, renew, void a slice; decide
//!   the next holder), charging a slice, and the process sets (WANT, DRAIN)
//!   they read;
//! - [`helper`]: the per-process helper thread (slice timer, idle watcher,
//!   drainer) and the beat thread;
//! - [`drain`]: this process's contexts and their drain at each handover.

use super::contexts::Contexts;
use super::decide::SLICE_NS;
use super::decide::{allowance, decide, update_estimate, Decision, Entry, Params};
use super::guest_clock::{EventOps, GuestClock};
use super::policy::Knobs;
use super::sys::{futex_wait, futex_wake, now_ns};
use super::words::transition::{self, Renew, Renewal};
use super::words::{
    container as cw, gpu as gw, weightless_bit, Token, DECIDING, DRAINING, IDLE, RUNNING,
};
use crate::ledger::{
    free_weight, ContainerSlot, Ledger, LedgerFile, MAX_CONTAINERS, MAX_PROCESSES, SLOT_LIVE,
};
use cgpu_ffi::CUresult;
use std::cell::Cell;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering::*};

mod admit;
mod drain;
mod guest;
mod helper;
mod idle;
mod token;

use idle::{not_used, Watch};

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
    /// Contexts this process launched into (drained at each handover).
    ctxs: Contexts,
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
            ctxs: Contexts::new(drv),
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

    fn knobs(&self) -> Knobs {
        let h = &self.file().header;
        Knobs::sanitized(
            h.policy.load(Acquire),
            h.max_inst.load(Acquire),
            h.prio_ratio.load(Acquire),
        )
    }
}

/// A container slot's id, for messages.
fn id_of(s: &ContainerSlot) -> String {
    s.id_str()
}
