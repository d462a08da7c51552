//! A guest's device time, from two CUDA events on its stream.
//!
//! A guest (a container that launches beside the holder of the GPU, see
//! `Gate::guest`) is charged what its work took on the device. The time
//! from its first launch until a host thread sees the work done is not
//! that: it adds whatever the host made that thread wait for a CPU, and
//! the delay until a query looked. So a guest that launches on one stream
//! from one thread records an event on that stream before its first launch
//! and another after each launch (the real driver's functions, never our
//! hooks); when its work is seen done, `cuEventElapsedTime` between the two
//! is its charge. A GPU processes a context's commands, an event's
//! timestamp included, only while it runs that context: the span runs from
//! when the guest's work could begin to the end of its last kernel,
//! including the GPU's time-slices given to the holder meanwhile.
//!
//! Nothing here blocks a launch: the two events are used by one thread at
//! a time (a try-lock; a thread that finds it taken charges as if there
//! were no events), are made once per context (at most [`MAX_PAIRS`] pairs
//! per process, for a process that hops between contexts), and are
//! forgotten when their context is destroyed (the driver frees them with
//! it). No event is recorded on a stream that is capturing (it would join
//! the graph being captured).

use super::gate::CUcontext;
use super::sys::now_ns;
use cgpu_ffi::CUresult;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering::*};

/// `CUevent` / `CUstream`.
type Handle = *mut c_void;

/// The real driver's functions for timing a guest (all or none).
#[derive(Clone, Copy, Debug)]
pub struct EventOps {
    pub create: unsafe extern "C" fn(*mut Handle, u32) -> CUresult,
    pub record: unsafe extern "C" fn(Handle, Handle) -> CUresult,
    pub elapsed: unsafe extern "C" fn(*mut f32, Handle, Handle) -> CUresult,
    pub is_capturing: unsafe extern "C" fn(Handle, *mut u32) -> CUresult,
}

/// Event pairs one process makes at most (one per context it was a guest in).
pub const MAX_PAIRS: u32 = 8;

/// `CU_EVENT_DEFAULT`: timing enabled.
const EVENT_DEFAULT: u32 = 0;
/// `CU_STREAM_CAPTURE_STATUS_NONE`.
const NOT_CAPTURING: u32 = 0;

/// One process's guest clock on one GPU.
pub struct GuestClock {
    ops: Option<EventOps>,
    /// Held by the thread that records or reads the events.
    busy: AtomicBool,
    /// The context the events belong to (0: none made), and its device.
    ctx: AtomicUsize,
    dev: AtomicI32,
    start: AtomicUsize,
    end: AtomicUsize,
    made: AtomicU32,
    /// The run being timed: 0 = not timed; otherwise 1 + the launches
    /// followed by an end record.
    marks: AtomicU32,
    /// Host time just after the start record, and from then until the
    /// first launch returned (see [`GuestClock::finish`]).
    begun_at: AtomicU64,
    lag: AtomicU64,
}

/// Holds [`GuestClock::busy`] for a scope (a try-lock: never waits).
struct Held<'a>(&'a AtomicBool);

impl<'a> Held<'a> {
    fn try_take(b: &'a AtomicBool) -> Option<Held<'a>> {
        b.compare_exchange(false, true, Acquire, Relaxed)
            .is_ok()
            .then_some(Held(b))
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        self.0.store(false, Release);
    }
}

impl GuestClock {
    pub fn new(ops: Option<EventOps>) -> GuestClock {
        GuestClock {
            ops,
            busy: AtomicBool::new(false),
            ctx: AtomicUsize::new(0),
            dev: AtomicI32::new(-1),
            start: AtomicUsize::new(0),
            end: AtomicUsize::new(0),
            made: AtomicU32::new(0),
            marks: AtomicU32::new(0),
            begun_at: AtomicU64::new(0),
            lag: AtomicU64::new(0),
        }
    }

    /// A guest run begins with a launch on `stream` in the calling thread's
    /// current context `ctx` (on device `dev`): record the start event
    /// there. The run is not timed when that fails.
    pub fn begin(&self, stream: usize, ctx: CUcontext, dev: i32) {
        self.marks.store(0, Release);
        let Some(ops) = self.ops else { return };
        if ctx.is_null() {
            return;
        }
        let Some(_held) = Held::try_take(&self.busy) else {
            return;
        };
        let s = stream as Handle;
        let mut status = NOT_CAPTURING;
        // SAFETY: the real driver's function on the stream the caller is
        // about to launch on (valid, or its launch fails the same way), with
        // a valid out-pointer.
        if unsafe { (ops.is_capturing)(s, &mut status) } != 0 || status != NOT_CAPTURING {
            return;
        }
        if self.ctx.load(Acquire) != ctx as usize && !self.make(ops, ctx, dev) {
            return;
        }
        // SAFETY: an event made by `make` in the current context (forgotten
        // before that context is destroyed), recorded by the real driver on
        // the stream the caller launches on.
        if unsafe { (ops.record)(self.start.load(Acquire) as Handle, s) } == 0 {
            self.begun_at.store(now_ns(), Release);
            self.lag.store(0, Release);
            self.marks.store(1, Release);
        }
    }

    /// Make the pair of events in the current context `ctx`.
    fn make(&self, ops: EventOps, ctx: CUcontext, dev: i32) -> bool {
        if self.made.load(Relaxed) >= MAX_PAIRS {
            return false;
        }
        self.made.fetch_add(1, Relaxed);
        let (mut a, mut b): (Handle, Handle) = (std::ptr::null_mut(), std::ptr::null_mut());
        // SAFETY: valid out-pointers; the real driver's function, which
        // makes the event in the calling thread's current context.
        let ok = unsafe {
            (ops.create)(&mut a, EVENT_DEFAULT) == 0 && (ops.create)(&mut b, EVENT_DEFAULT) == 0
        };
        if !ok || a.is_null() || b.is_null() {
            return false;
        }
        self.start.store(a as usize, Release);
        self.end.store(b as usize, Release);
        self.dev.store(dev, Release);
        self.ctx.store(ctx as usize, Release);
        true
    }

    /// A guest launch on `stream` returned: record the end event after it.
    pub fn launched(&self, stream: usize) {
        let m = self.marks.load(Acquire);
        if m == 0 {
            return;
        }
        let Some(ops) = self.ops else { return };
        let Some(_held) = Held::try_take(&self.busy) else {
            self.marks.store(0, Release);
            return;
        };
        if m == 1 {
            let lag = now_ns().saturating_sub(self.begun_at.load(Acquire));
            self.lag.store(lag, Release);
        }
        let ev = self.end.load(Acquire);
        // SAFETY: an event of the context the run began in (see `begin`),
        // recorded on the stream the caller just launched on.
        let ok = ev != 0 && unsafe { (ops.record)(ev as Handle, stream as Handle) } == 0;
        let _ = self
            .marks
            .compare_exchange(m, if ok { m + 1 } else { 0 }, AcqRel, Relaxed);
    }

    /// The run is not timed (its launches went to several streams).
    pub fn spoil(&self) {
        self.marks.store(0, Release);
    }

    /// The device time of the run that made `launches` launches, if every
    /// one was timed and its work is done (else `None`); ends the run. The
    /// span between the events, less the host time from the start record
    /// until the first launch returned: none of the guest's work was
    /// queued before that, and a thread the host preempted in between
    /// (its CPUs saturated) would otherwise pay for whatever the GPU did
    /// meanwhile (its stream held only the start event; the GPU went on
    /// with the holder's work).
    pub fn finish(&self, launches: u32) -> Option<u64> {
        let m = self.marks.swap(0, AcqRel);
        if launches == 0 || m != launches.saturating_add(1) {
            return None;
        }
        let ops = self.ops?;
        let _held = Held::try_take(&self.busy)?;
        let (a, b) = (self.start.load(Acquire), self.end.load(Acquire));
        if a == 0 || b == 0 {
            return None;
        }
        let mut ms = 0f32;
        // SAFETY: two events of a live context (see `forget`) and a valid
        // out-pointer; the real driver reads their timestamps (an event not
        // yet reached answers CUDA_ERROR_NOT_READY).
        if unsafe { (ops.elapsed)(&mut ms, a as Handle, b as Handle) } != 0 {
            return None;
        }
        let lag = self.lag.load(Acquire);
        (ms.is_finite() && ms >= 0.0).then(|| ((f64::from(ms) * 1e6) as u64).saturating_sub(lag))
    }

    /// Context `ctx` (or, with `dev`, every context of that device) is
    /// about to be destroyed: its events go with it. Waits for a thread
    /// that is recording or reading them (a few driver calls).
    pub fn forget(&self, ctx: usize, dev: Option<i32>) {
        let mine = self.ctx.load(Acquire);
        if mine == 0 || !(mine == ctx || dev.is_some_and(|d| d == self.dev.load(Acquire))) {
            return;
        }
        loop {
            if let Some(_held) = Held::try_take(&self.busy) {
                self.ctx.store(0, Release);
                self.start.store(0, Release);
                self.end.store(0, Release);
                self.marks.store(0, Release);
                return;
            }
            std::thread::sleep(std::time::Duration::from_micros(20));
        }
    }
}
