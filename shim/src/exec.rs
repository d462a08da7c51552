//! Device time: one executor thread per (process, device) runs the process's
//! queued work in submission order (which respects every stream's order), and
//! the device is time-sliced between processes through the shared state.
//!
//! Kernels sleep, never spin. While it owns the device, the executor takes
//! the queued kernels' virtual durations up to the end of its timeslice
//! (`CGPU_SIM_TIMESLICE_US`, default 2000), sleeps once for the batch, then
//! completes them and charges exact device time. At the end of a timeslice it
//! hands the device to the next process (round robin over slots) that wants
//! it; a long kernel is preempted at the slice boundary and resumes in the
//! next slice, as contexts are time-sliced on a real GPU. Waiters wait on a
//! futex in the shared file with a timeout, and reclaim the device from an
//! owner that died (its OFD lock is gone).
//!
//! The device clock is CLOCK_MONOTONIC; a batch starting at `t` completes
//! its kernels at `t + d1`, `t + d1 + d2`, ... Event timestamps are those
//! completion times, so `cuEventElapsedTime` measures device wall time,
//! including slices given to other processes. An event recorded while
//! another process runs on the device waits for this process's turn.
//!
//! Host functions (`cuLaunchHostFunc`, stream callbacks, graph host nodes)
//! are queued in the same order and run on the executor thread, without the
//! device: a synchronisation waits for them, and the work queued after one
//! starts once it has returned.

use crate::state::{futex_wait, futex_wake, now_mono_ns, Shared};
use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::sync::Arc;

/// Timing of an event: the sequence number of its marker and its device time.
#[derive(Default)]
pub struct EventTimes {
    /// Sequence number of the last record; 0 = never recorded.
    pub seq: AtomicU64,
    /// Device time (CLOCK_MONOTONIC ns) at which the marker completed.
    pub ts: AtomicU64,
    /// An interprocess event's state, shared with the processes that
    /// opened its handle.
    pub ipc: Option<IpcEventState>,
}

/// The shared words of an interprocess event: records counted by
/// `recorded`, the last completed one in `done` (complete when `done >=
/// recorded`). Any process that has the event may record it.
#[repr(C)]
pub struct IpcEventWords {
    pub recorded: AtomicU64,
    pub done: AtomicU64,
}

/// A shared mapping of an interprocess event's words (and the descriptor
/// its handle names), unmapped when the event and its markers are gone.
pub struct IpcEventState {
    words: *const IpcEventWords,
    pub fd: i32,
}

// SAFETY: the words are atomics in a shared mapping that lives as long as
// this value; the descriptor is only read.
unsafe impl Send for IpcEventState {}
unsafe impl Sync for IpcEventState {}

/// Bytes mapped for an interprocess event (one page).
pub const IPC_EVENT_BYTES: usize = 4096;

impl IpcEventState {
    /// Maps the event words of memfd `fd` (at least `IPC_EVENT_BYTES`
    /// long); takes the descriptor.
    pub fn map(fd: i32) -> Option<IpcEventState> {
        // SAFETY: a shared mapping of a descriptor we own; checked below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                IPC_EVENT_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            // SAFETY: closing the descriptor we were given.
            unsafe { libc::close(fd) };
            return None;
        }
        Some(IpcEventState {
            words: p as *const IpcEventWords,
            fd,
        })
    }

    pub fn words(&self) -> &IpcEventWords {
        // SAFETY: mapped (page-aligned, zero-initialised by the memfd)
        // for as long as self lives.
        unsafe { &*self.words }
    }

    /// Whether every record made so far (by any process) has completed.
    pub fn complete(&self) -> bool {
        let w = self.words();
        w.done.load(Acquire) >= w.recorded.load(Acquire)
    }
}

impl Drop for IpcEventState {
    fn drop(&mut self) {
        // SAFETY: our own mapping and descriptor, used by nobody else now.
        unsafe {
            libc::munmap(self.words as *mut libc::c_void, IPC_EVENT_BYTES);
            libc::close(self.fd);
        }
    }
}

/// A marker of an interprocess event completed: its record (`gen`) is done.
fn ipc_done(ev: &Option<Arc<EventTimes>>, gen: u64) {
    if let Some(s) = ev.as_ref().and_then(|e| e.ipc.as_ref()) {
        s.words().done.fetch_max(gen, AcqRel);
    }
}

pub enum Op {
    Kernel {
        remaining_ns: u64,
        seq: u64,
        submit: u64,
    },
    Marker {
        ev: Option<Arc<EventTimes>>,
        seq: u64,
        submit: u64,
        /// The record of an interprocess event this marker completes (0: none).
        gen: u64,
    },
    /// A host function (`cuLaunchHostFunc`, `cuStreamAddCallback`, a graph's
    /// host node): runs on the executor thread once everything queued
    /// before it completed; what is queued after it waits for its return.
    Host { f: HostFn, seq: u64 },
}

/// A host function queued on the executor.
pub type HostFn = Box<dyn FnOnce() + Send>;

thread_local! {
    /// This thread is an executor running a host function.
    static IN_HOST_FN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether the calling thread is running a host function: it must not make
/// CUDA calls, and a synchronisation from it would wait for itself (the
/// driver answers `CUDA_ERROR_NOT_PERMITTED`).
pub fn in_host_fn() -> bool {
    IN_HOST_FN.with(|c| c.get())
}

impl Op {
    fn seq(&self) -> u64 {
        match self {
            Op::Kernel { seq, .. } | Op::Marker { seq, .. } | Op::Host { seq, .. } => *seq,
        }
    }
}

struct Queue {
    ops: VecDeque<Op>,
    next_seq: u64,
    /// The executor is between taking a batch and completing it.
    busy: bool,
    started: bool,
}

/// Maximum queued operations before a launch blocks (the real push buffer
/// is bounded too).
const QUEUE_MAX: usize = 4096;

pub struct Executor {
    q: Mutex<Queue>,
    work_cv: Condvar,
    done_cv: Condvar,
    space_cv: Condvar,
    done_seq: AtomicU64,
    last_end: AtomicU64,
    pub dev: usize,
    slot: usize,
    shared: &'static Shared,
    timeslice_ns: u64,
}

impl Executor {
    pub fn new(
        shared: &'static Shared,
        slot: usize,
        dev: usize,
        timeslice_ns: u64,
    ) -> Arc<Executor> {
        Arc::new(Executor {
            q: Mutex::new(Queue {
                ops: VecDeque::new(),
                next_seq: 1,
                busy: false,
                started: false,
            }),
            work_cv: Condvar::new(),
            done_cv: Condvar::new(),
            space_cv: Condvar::new(),
            done_seq: AtomicU64::new(0),
            last_end: AtomicU64::new(0),
            dev,
            slot,
            shared,
            timeslice_ns,
        })
    }

    pub fn done_seq(&self) -> u64 {
        self.done_seq.load(Acquire)
    }

    /// Last sequence number handed out (everything submitted so far).
    pub fn submitted_seq(&self) -> u64 {
        self.q.lock().next_seq - 1
    }

    fn ensure_thread(self: &Arc<Self>, q: &mut Queue) {
        if !q.started {
            q.started = true;
            let me = Arc::clone(self);
            let r = std::thread::Builder::new()
                .name(format!("cgpu-sim-dev{}", self.dev))
                .spawn(move || me.run());
            if r.is_err() {
                q.started = false;
            }
        }
    }

    /// Queues a kernel of `ns` device time; returns its sequence number.
    pub fn launch(self: &Arc<Self>, ns: u64) -> u64 {
        let mut q = self.q.lock();
        while q.ops.len() >= QUEUE_MAX {
            self.space_cv.wait(&mut q);
        }
        let seq = q.next_seq;
        q.next_seq += 1;
        q.ops.push_back(Op::Kernel {
            remaining_ns: ns,
            seq,
            submit: now_mono_ns(),
        });
        self.ensure_thread(&mut q);
        // (A marker queued before it may not have woken the executor.)
        let wake = !q.busy;
        drop(q);
        if wake {
            self.wake();
        }
        seq
    }

    /// Queues host function `f` in submission order; returns its sequence
    /// number (reached once `f` has returned). It runs on the executor
    /// thread without the device: kernels of other processes run meanwhile,
    /// and this process's later work waits for it, as a stream waits for
    /// its host function on a GPU.
    pub fn host(self: &Arc<Self>, f: HostFn) -> u64 {
        let mut q = self.q.lock();
        while q.ops.len() >= QUEUE_MAX {
            self.space_cv.wait(&mut q);
        }
        let seq = q.next_seq;
        q.next_seq += 1;
        q.ops.push_back(Op::Host { f, seq });
        self.ensure_thread(&mut q);
        let wake = !q.busy;
        drop(q);
        if wake {
            self.wake();
        }
        seq
    }

    /// Wakes the executor for the work just queued, after the queue's lock
    /// is released. Notified under the lock, the executor was queued on
    /// that lock and could be handed it before it ran: on a host whose CPUs
    /// are busy, the thread queueing its next command (an event record after
    /// a launch) then waited for the executor's turn on a CPU, 0.6 to 1.6 ms
    /// per request with two CPU-bound loops on 2 cores, where the driver's
    /// calls take microseconds. The executor looks for work under the lock
    /// before it waits, so the notification is never lost.
    fn wake(&self) {
        self.work_cv.notify_one();
    }

    /// Queues a marker (event record / stream point); returns its sequence.
    /// With nothing queued and no other process running on the device,
    /// completes it at once at the current device time (while another
    /// runs, it waits for this process's turn: see `run`).
    pub fn marker(self: &Arc<Self>, ev: Option<Arc<EventTimes>>) -> u64 {
        let mut q = self.q.lock();
        let seq = q.next_seq;
        q.next_seq += 1;
        let mut gen = 0;
        if let Some(e) = &ev {
            e.ts.store(0, Release);
            e.seq.store(seq, Release);
            if let Some(s) = &e.ipc {
                gen = s.words().recorded.fetch_add(1, AcqRel) + 1;
            }
        }
        let now = now_mono_ns();
        let owner = self.shared.dev(self.dev).owner.load(Acquire);
        let other = owner != 0 && owner != self.slot as u32 + 1;
        if q.ops.is_empty() && !q.busy && !other {
            let ts = now.max(self.last_end.load(Acquire));
            if let Some(e) = &ev {
                e.ts.store(ts, Release);
            }
            self.done_seq.store(seq, Release);
            ipc_done(&ev, gen);
            return seq;
        }
        q.ops.push_back(Op::Marker {
            ev,
            seq,
            submit: now,
            gen,
        });
        self.ensure_thread(&mut q);
        // Behind another process's turn, a marker does not wake the
        // executor: it could only stamp the marker when the turn comes, and
        // woken before the launch that follows it (an event recorded before
        // a kernel), it could run the marker alone in the turn and give the
        // device back, so the kernel waited for another turn and the events
        // around it measured the other's time-slice too (5 of 40 such pairs
        // measured 2 ms for a 0.2 ms kernel in a CI rehearsal). The next
        // launch, a wait, or a query of the marker wakes the executor (or
        // its poll, every 10 ms); the timestamp is device time, the same
        // whenever the executor runs it.
        let wake = !q.busy && !other;
        drop(q);
        if wake {
            self.wake();
        }
        seq
    }

    /// Has everything up to `seq` completed? When not, wakes the executor
    /// for work it was not woken for (see `marker`).
    pub fn reached(&self, seq: u64) -> bool {
        if self.done_seq() >= seq {
            return true;
        }
        let q = self.q.lock();
        let wake = !q.busy && !q.ops.is_empty();
        drop(q);
        if wake {
            self.wake();
        }
        false
    }

    /// Blocks until everything up to `seq` completed (at once from a host
    /// function: its executor cannot wait for itself).
    pub fn wait(&self, seq: u64) {
        if self.done_seq() >= seq || in_host_fn() {
            return;
        }
        let mut q = self.q.lock();
        if !q.busy && !q.ops.is_empty() {
            // (Work a marker did not wake the executor for: see `marker`.)
            drop(q);
            self.wake();
            q = self.q.lock();
        }
        while self.done_seq() < seq {
            self.done_cv.wait(&mut q);
        }
    }

    fn run(self: Arc<Self>) {
        let dev = self.shared.dev(self.dev);
        let want = &self.shared.slot(self.slot).want[self.dev];
        let mut owned = false;
        let mut slice_used = 0u64;
        let mut done: Vec<Op> = Vec::new();
        loop {
            let mut q = self.q.lock();
            // Leading markers complete without the device while no other
            // process runs on it. While another does, they wait for this
            // process's turn, as on a GPU, which processes a context's
            // commands (an event's timestamp included) only while it runs
            // that context: an event recorded on an empty stream then marks
            // when the process's work could begin, not when it was queued.
            // Leading host functions run here, without the device (handed
            // on first, so other processes run meanwhile).
            let me = self.slot as u32 + 1;
            loop {
                match q.ops.front() {
                    Some(Op::Marker { .. }) => {
                        let owner = dev.owner.load(Acquire);
                        if !owned && owner != 0 && owner != me {
                            break;
                        }
                        if let Some(Op::Marker {
                            ev,
                            seq,
                            submit,
                            gen,
                        }) = q.ops.pop_front()
                        {
                            let ts = submit.max(self.last_end.load(Acquire));
                            if let Some(e) = &ev {
                                e.ts.store(ts, Release);
                            }
                            self.done_seq.store(seq, Release);
                            ipc_done(&ev, gen);
                        }
                    }
                    Some(Op::Host { .. }) => {
                        let Some(Op::Host { f, seq }) = q.ops.pop_front() else {
                            break;
                        };
                        q.busy = true;
                        drop(q);
                        self.space_cv.notify_all();
                        if owned {
                            owned = false;
                            self.release_device();
                        }
                        want.store(0, Release);
                        IN_HOST_FN.with(|c| c.set(true));
                        f();
                        IN_HOST_FN.with(|c| c.set(false));
                        // Work after it starts no earlier than its return.
                        self.last_end.fetch_max(now_mono_ns(), AcqRel);
                        q = self.q.lock();
                        self.done_seq.store(seq, Release);
                        self.done_cv.notify_all();
                    }
                    _ => break,
                }
            }
            if q.ops.is_empty() {
                q.busy = false;
                self.done_cv.notify_all();
                self.space_cv.notify_all();
                if owned {
                    owned = false;
                    self.release_device();
                }
                want.store(0, Release);
                while q.ops.is_empty() {
                    // `want` stays set across a slice-end release, so a peer
                    // may hand us the device after our queue ran dry (or
                    // just as we cleared `want`): never sit on it while idle,
                    // or the peer waits forever on a live owner.
                    if dev.owner.load(Acquire) == self.slot as u32 + 1 {
                        self.release_device();
                    }
                    self.work_cv
                        .wait_for(&mut q, std::time::Duration::from_millis(10));
                }
            }
            q.busy = true;
            if !owned {
                drop(q);
                want.store(1, Release);
                self.acquire_device();
                owned = true;
                slice_used = 0;
                q = self.q.lock();
            }
            // Take a batch up to the end of the slice. The device timeline is
            // virtual: an op starts when it was submitted or when the device
            // finished the previous one, whichever is later (so back-to-back
            // kernels have no gaps and wake-up latency is not device time);
            // it never runs ahead of the wall clock (we sleep until it).
            let mut cursor = self
                .last_end
                .load(Acquire)
                .max(dev.last_end_ns.load(Acquire));
            let budget = self.timeslice_ns.saturating_sub(slice_used).max(1);
            let mut used = 0u64;
            let mut charged = 0u64;
            let mut kernels = 0u64;
            while let Some(op) = q.ops.front_mut() {
                match op {
                    Op::Marker { ev, submit, .. } => {
                        cursor = cursor.max(*submit);
                        if let Some(e) = ev {
                            e.ts.store(cursor, Release);
                        }
                    }
                    // Runs at the top of the loop, after this batch.
                    Op::Host { .. } => break,
                    Op::Kernel {
                        remaining_ns,
                        submit,
                        ..
                    } => {
                        if used >= budget {
                            break;
                        }
                        cursor = cursor.max(*submit);
                        let run = (*remaining_ns).min(budget - used);
                        *remaining_ns -= run;
                        used += run;
                        cursor += run;
                        charged += run;
                        if *remaining_ns > 0 {
                            break; // preempted at the slice boundary
                        }
                        kernels += 1;
                    }
                }
                if let Some(op) = q.ops.pop_front() {
                    done.push(op);
                }
            }
            let space = q.ops.len() < QUEUE_MAX;
            drop(q);
            if space {
                self.space_cv.notify_all();
            }
            sleep_until(cursor);
            self.last_end.store(cursor, Release);
            dev.last_end_ns.fetch_max(cursor, AcqRel);
            // Charge and complete.
            let rec = self.shared.slot(self.slot);
            rec.time_ns[self.dev].fetch_add(charged, Relaxed);
            rec.kernels[self.dev].fetch_add(kernels, Relaxed);
            dev.busy_ns.fetch_add(charged, Relaxed);
            dev.kernels.fetch_add(kernels, Relaxed);
            if let Some(last) = done.last() {
                let s = last.seq();
                let _q = self.q.lock();
                self.done_seq.store(s, Release);
                self.done_cv.notify_all();
            }
            for op in &done {
                if let Op::Marker { ev, gen, .. } = op {
                    ipc_done(ev, *gen);
                }
            }
            done.clear();
            slice_used += used;
            if dev.owner.load(Acquire) != self.slot as u32 + 1 {
                // Taken from us while we were frozen: queue up again.
                owned = false;
                continue;
            }
            if slice_used >= self.timeslice_ns {
                slice_used = 0;
                if self.others_want() {
                    self.complete_queued_markers(cursor);
                    self.release_device();
                    owned = false;
                }
            }
        }
    }

    /// At the end of a turn: the markers queued behind the turn's last
    /// kernel before it completed (at `end`) are processed in this turn, as
    /// a GPU processes the commands already in a context's queue, not after
    /// the other processes' turns (an event recorded after the last kernel of
    /// a time slice would otherwise measure the next slices too).
    fn complete_queued_markers(&self, end: u64) {
        let mut q = self.q.lock();
        let mut last = None;
        while let Some(Op::Marker { submit, .. }) = q.ops.front() {
            if *submit > end {
                break;
            }
            if let Some(Op::Marker { ev, seq, gen, .. }) = q.ops.pop_front() {
                if let Some(e) = &ev {
                    e.ts.store(end, Release);
                }
                ipc_done(&ev, gen);
                last = Some(seq);
            }
        }
        if let Some(seq) = last {
            self.done_seq.store(seq, Release);
            self.done_cv.notify_all();
        }
    }

    fn others_want(&self) -> bool {
        let me = self.slot;
        (0..self.shared.nslots())
            .any(|s| s != me && self.shared.slot(s).want[self.dev].load(Acquire) != 0)
    }

    fn acquire_device(&self) {
        let dev = self.shared.dev(self.dev);
        let me = self.slot as u32 + 1;
        // An owner that neither hands over nor finishes for this long is
        // frozen (SIGSTOP, a debugger, starved of CPU): a GPU would still
        // time-slice it out, so the device is taken from it.
        let steal_after = (20 * self.timeslice_ns).max(250_000_000);
        let mut stalled: Option<(u32, u32, u64)> = None;
        loop {
            let seq = dev.seq.load(Acquire);
            let o = dev.owner.load(Acquire);
            if o == me {
                return;
            }
            if o == 0 {
                if dev.owner.compare_exchange(0, me, AcqRel, Acquire).is_ok() {
                    return;
                }
                continue;
            }
            futex_wait(&dev.seq, seq, 10_000_000);
            if dev.seq.load(Acquire) == seq && dev.owner.load(Acquire) == o {
                // No handoff for 10 ms: is the owner still alive?
                if !self.shared.slot_lock_held(o as usize - 1) {
                    self.shared.reap(Some(self.slot));
                    if dev.owner.compare_exchange(o, 0, AcqRel, Acquire).is_ok() {
                        dev.seq.fetch_add(1, AcqRel);
                        futex_wake(&dev.seq);
                    }
                    stalled = None;
                    continue;
                }
                let now = now_mono_ns();
                match stalled {
                    Some((so, ss, since)) if so == o && ss == seq => {
                        if now.saturating_sub(since) >= steal_after
                            && dev.owner.compare_exchange(o, me, AcqRel, Acquire).is_ok()
                        {
                            // It asks again when it runs again; until then
                            // nobody hands the device back to it.
                            self.shared.slot(o as usize - 1).want[self.dev].store(0, Release);
                            dev.seq.fetch_add(1, AcqRel);
                            futex_wake(&dev.seq);
                            return;
                        }
                    }
                    _ => stalled = Some((o, seq, now)),
                }
            } else {
                stalled = None;
            }
        }
    }

    /// Hands the device to the next process (round robin) that wants it and
    /// is alive, or frees it.
    fn release_device(&self) {
        let dev = self.shared.dev(self.dev);
        let me = self.slot;
        let n = self.shared.nslots().max(me + 1);
        let mut next = 0u32;
        for i in 1..n {
            let s = (me + i) % n;
            if self.shared.slot(s).want[self.dev].load(Acquire) != 0 {
                if self.shared.slot_lock_held(s) {
                    next = s as u32 + 1;
                    break;
                }
                self.shared.reap(Some(me));
            }
        }
        // Only if we still own it (it may have been taken from us while we
        // were frozen).
        if dev
            .owner
            .compare_exchange(me as u32 + 1, next, AcqRel, Acquire)
            .is_ok()
        {
            dev.seq.fetch_add(1, AcqRel);
            futex_wake(&dev.seq);
        }
    }
}

/// Sleeps until CLOCK_MONOTONIC reaches `t` (absolute, so a batch costs one
/// syscall whatever its length).
pub fn sleep_until(t: u64) {
    let ts = libc::timespec {
        tv_sec: (t / 1_000_000_000) as _,
        tv_nsec: (t % 1_000_000_000) as _,
    };
    loop {
        // SAFETY: ts is a valid timespec; no remaining-time out pointer with TIMER_ABSTIME.
        let r = unsafe {
            libc::clock_nanosleep(
                libc::CLOCK_MONOTONIC,
                libc::TIMER_ABSTIME,
                &ts,
                std::ptr::null_mut(),
            )
        };
        if r != libc::EINTR {
            return;
        }
    }
}
