//! Compute scheduling: policies 0–5, weights, high priority.
//!
//! - the launch hooks call [`admit_launch`] before every kernel launch
//!   (`cuLaunchKernel`, `cuLaunchKernelEx`, cooperative, `cuGraphLaunch`,
//!   `_ptsz` variants) and [`launched`] after the real launch returned;
//! - the process joins the scheduler of its GPU with [`attach`] once it is
//!   in the GPU's ledger;
//! - the tools read [`container_stats`] and [`limit_percent`].
//!
//! Design and limits: `docs/scheduling.md`. In short: one container at a
//! time holds the GPU for a slice (a token in the ledger); its launches pass
//! with a few atomics; others wait in the hook. At the slice's end the
//! holder's processes drain their work, the time held is charged to the
//! container's bucket, and the token goes to the waiting container with the
//! most credit, buckets being refilled at each container's share.

pub mod capture;
mod contexts;
mod gate;
mod guest_clock;
mod secure;
mod sys;

pub use cgpu_ledger::words::{
    container_stats, knobs, limit_percent, waiting, ContainerSchedStats, Waiting,
};
pub use cgpu_ledger::{decide, policy, words};
pub use decide::{allowance, Params, SLICE_NS};
pub use gate::{CUcontext, DriverOps, Gate, Synced};
pub use guest_clock::EventOps;
#[doc(hidden)]
pub use secure::{gate_for_bench as secure_gate_for_bench, SecureGate};

use crate::ledger::{Ledger, Membership};
use crate::process::fork;
use cgpu_ffi::CUresult;
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicU8, Ordering::*};

/// Opaque `CUstream` as the launch hooks see it.
pub type Stream = *mut std::ffi::c_void;

/// The gate of this process when it sees one GPU (null: not scheduling, or
/// several GPUs: see `MULTI`).
///
/// After a `fork` these words are the parent's: every gate records the fork
/// generation it was made in (`process::fork`) and one of another
/// generation is never used (it has no helper thread in the child and names
/// the parent's process slot); `ATTACH` is per generation too, and the first
/// thread of a child to see it starts over (see `attach_lazily`).
static GATE: AtomicPtr<Gate> = AtomicPtr::new(std::ptr::null_mut());
/// The process sees several GPUs: each launch finds the gate of its
/// context's device (`GATES`, cached per thread by context).
static MULTI: AtomicBool = AtomicBool::new(false);
/// Secure mode: the node agent schedules; launches go through the secure
/// gates (`secure.rs`) instead.
static SECURE_MODE: AtomicBool = AtomicBool::new(false);
/// Devices (CUDA ordinals of the real driver) with a gate of their own:
/// every device whose memory cgpu accounts (`memory::MAX_GPUS`), so that
/// no device is quota-limited yet unscheduled.
const MAX_DEVS: usize = crate::memory::MAX_GPUS;
static GATES: [AtomicPtr<Gate>; MAX_DEVS] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; MAX_DEVS];
static DEV_ATTACH: [AtomicU8; MAX_DEVS] = [const { AtomicU8::new(UNDECIDED) }; MAX_DEVS];

/// Lazy attachment: not tried yet / being tried / attached or given up.
/// `DEV_ATTACH` holds the state; `ATTACH` holds `generation << 2 | state`,
/// and a word of an earlier fork generation counts as not tried.
const UNDECIDED: u8 = 0;
const ATTACHING: u8 = 1;
const DECIDED: u8 = 2;
static ATTACH: AtomicU64 = AtomicU64::new(UNDECIDED as u64);

/// `ATTACH`'s word for `state` in fork generation `generation`.
fn attach_word(generation: u64, state: u8) -> u64 {
    generation << 2 | u64::from(state)
}

/// The gate `p` points to if it was made in this process's fork generation.
#[inline(always)]
fn current(p: *const Gate) -> Option<&'static Gate> {
    // SAFETY: a gate, once published, is never freed (leaked on attach); one
    // published before a fork is the child's copy of that leaked memory,
    // readable too (only its generation is read before it is trusted).
    unsafe { p.as_ref() }.filter(|g| g.generation == fork::current())
}

thread_local! {
    /// The gate of this thread's launches in flight and how many were
    /// admitted (more than one for `cuLaunchCooperativeKernelMultiDevice`,
    /// admitted per stream).
    static ADMITTED: Cell<(*const Gate, u32)> = const { Cell::new((std::ptr::null(), 0)) };
    /// Several GPUs: (context, its gate) of this thread's last launch.
    static CTX_GATE: Cell<(usize, *const Gate)> = const { Cell::new((0, std::ptr::null())) };
}

/// Called by every launch hook before calling the real driver. Returns
/// immediately when the container holds the GPU and is within its slice
/// (a few atomics, no lock, no allocation); otherwise blocks the calling
/// thread until it may launch.
#[inline]
pub fn admit_launch(stream: Stream) {
    let mut g = GATE.load(Acquire) as *const Gate;
    if g.is_null() {
        if SECURE_MODE.load(Relaxed) {
            return secure::admit_launch();
        }
        g = gate_slow();
        if g.is_null() {
            if SECURE_MODE.load(Relaxed) {
                secure::admit_launch();
            }
            return;
        }
    }
    // SAFETY: a gate, once published, is never freed (leaked on attach); one
    // published before a fork is the child's copy of that memory, and its
    // `admit` admits nothing in another generation (it checks before it
    // touches a ledger word).
    let gate = unsafe { &*g };
    if !gate.admit(stream as usize) {
        if gate.generation == fork::current() {
            return;
        }
        // A forked child's first launch: its own gate, attached afresh.
        let Some(fresh) = current(gate_slow()) else {
            return;
        };
        if !fresh.admit(stream as usize) {
            return;
        }
        g = fresh;
    }
    ADMITTED.with(|a| admitted(a, g));
}

/// A gate's end of an admitted launch (both modes' gates).
pub(crate) trait Admits {
    fn done(&self);
}

impl Admits for Gate {
    #[inline]
    fn done(&self) {
        Gate::done(self)
    }
}

/// The calling thread's launch was admitted by gate `g`: counted in `a`,
/// the thread's (gate, admissions in flight).
#[inline]
fn admitted<G: Admits>(a: &Cell<(*const G, u32)>, g: *const G) {
    let (old, n) = a.get();
    if n > 0 && old != g {
        // A second device in one multi-device launch: the first one's
        // admissions end here (documented approximation).
        // SAFETY: gates are leaked when made and never freed.
        (0..n).for_each(|_| unsafe { &*old }.done());
        a.set((g, 1));
    } else {
        a.set((g, n + 1));
    }
}

/// The calling thread's launch returned: one admission of `a` ends.
#[inline]
fn launch_ended<G: Admits>(a: &Cell<(*const G, u32)>) {
    let (g, n) = a.get();
    if n > 0 {
        a.set((g, n - 1));
        // SAFETY: gates are leaked when made and never freed.
        unsafe { &*g }.done();
    }
}

/// Called by every launch hook after the real driver returned `_result`.
#[inline]
pub fn launched(_stream: Stream, _result: CUresult) {
    if SECURE_MODE.load(Relaxed) {
        return secure::launched();
    }
    ADMITTED.with(launch_ended);
}

/// No single gate of this fork generation: attach (first launch, also in
/// a forked child), or find the device's gate.
#[cold]
#[inline(never)]
fn gate_slow() -> *const Gate {
    let generation = fork::generation();
    let seen = ATTACH.load(Acquire);
    if seen == attach_word(generation, DECIDED) {
        if MULTI.load(Acquire) {
            return gate_of_current_context();
        }
        return std::ptr::null();
    }
    if seen == attach_word(generation, ATTACHING) {
        return std::ptr::null();
    }
    attach_lazily(seen, generation)
}

/// The real driver's functions the scheduler needs.
fn driver_ops() -> Option<DriverOps> {
    use crate::process::real;
    Some(DriverOps {
        ctx_get_current: real::cuCtxGetCurrent.get()?,
        ctx_set_current: real::cuCtxSetCurrent.get()?,
        ctx_synchronize: real::cuCtxSynchronize.get()?,
        ctx_get_device: real::cuCtxGetDevice.get()?,
        stream_query: real::cuStreamQuery.get()?,
        events: event_ops(),
    })
}

/// The real driver's event functions, to time guests on the device (a
/// driver without `cuEventElapsedTime_v2` has the older name).
fn event_ops() -> Option<EventOps> {
    use crate::process::real;
    Some(EventOps {
        create: real::cuEventCreate.get()?,
        record: real::cuEventRecord.get()?,
        elapsed: real::cuEventElapsedTime_v2
            .get()
            .or_else(|| real::cuEventElapsedTime.get())?,
        is_capturing: real::cuStreamIsCapturing.get()?,
    })
}

/// First launch of the process (or of a forked child): attach to the GPU of
/// the current context if the process is in its ledger (memory isolation on,
/// as with cGPU: no `ALIYUN_COM_GPU_MEM_CONTAINER`, no cGPU). A process that
/// sees several GPUs switches to per-device gates. `seen` is the `ATTACH`
/// word the caller saw: not tried in this generation, or any word of an
/// earlier one (a forked child: the parent's gates are dropped first).
#[cold]
#[inline(never)]
fn attach_lazily(seen: u64, generation: u64) -> *const Gate {
    // One thread attaches; others launch unscheduled meanwhile (no lock, so
    // a fork in the middle cannot leave the child stuck: the child's word
    // is of an earlier generation, which its first launch takes over).
    if ATTACH
        .compare_exchange(seen, attach_word(generation, ATTACHING), AcqRel, Acquire)
        .is_err()
    {
        return current(GATE.load(Acquire)).map_or(std::ptr::null(), |g| g as *const Gate);
    }
    if seen >> 2 != generation {
        // A forked child: the parent's gates are not ours. Dropped before
        // this generation's `ATTACH` says DECIDED, and no device attaches
        // before that (see `gate_of_current_context`).
        GATE.store(std::ptr::null_mut(), Release);
        MULTI.store(false, Release);
        for (g, a) in GATES.iter().zip(DEV_ATTACH.iter()) {
            g.store(std::ptr::null_mut(), Release);
            a.store(UNDECIDED, Release);
        }
    }
    if crate::memory::secure::on() {
        // The node agent schedules (see `secure.rs`).
        SECURE_MODE.store(true, Release);
        ATTACH.store(attach_word(generation, DECIDED), Release);
        return std::ptr::null();
    }
    let several = crate::process::gpus::cuda_visible().is_ok_and(|v| v.len() > 1);
    if several {
        MULTI.store(true, Release);
        ATTACH.store(attach_word(generation, DECIDED), Release);
        register_handlers();
        return gate_of_current_context();
    }
    let r = std::panic::catch_unwind(|| {
        let gpu = crate::memory::current_gpu()?;
        let (ledger, m) = gpu.ledger()?;
        Some(attach(ledger, m, driver_ops()?))
    });
    log_attach(r.map(|x| x.map(|y| y.map(|_| ()))));
    ATTACH.store(attach_word(generation, DECIDED), Release);
    GATE.load(Acquire)
}

fn log_attach(r: std::thread::Result<Option<Result<(), String>>>) {
    match r {
        Ok(Some(Ok(()))) => tracing::debug!("cgpu: compute scheduling on"),
        Ok(Some(Err(e))) => tracing::error!("cgpu: {e}"),
        Ok(None) => {
            tracing::debug!(
                "cgpu: no shared ledger for this GPU: its kernel launches are not scheduled"
            )
        }
        Err(_) => {
            tracing::error!("cgpu: scheduler attach panicked: kernel launches are not scheduled")
        }
    }
}

/// Several GPUs: the gate of the current context's device (cached per
/// thread by context; attached on the device's first launch).
fn gate_of_current_context() -> *const Gate {
    use crate::process::real;
    let (Some(get_ctx), Some(get_dev)) = (real::cuCtxGetCurrent.get(), real::cuCtxGetDevice.get())
    else {
        return std::ptr::null();
    };
    let mut ctx: CUcontext = std::ptr::null_mut();
    // SAFETY: the real driver function with a valid out-pointer.
    if unsafe { get_ctx(&mut ctx) } != 0 || ctx.is_null() {
        return std::ptr::null();
    }
    let (cached_ctx, cached) = CTX_GATE.with(|c| c.get());
    if cached_ctx == ctx as usize && current(cached).is_some() {
        return cached;
    }
    let mut dev: i32 = -1;
    // SAFETY: as above.
    if unsafe { get_dev(&mut dev) } != 0 {
        return std::ptr::null();
    }
    let Some(i) = usize::try_from(dev).ok().filter(|&i| i < MAX_DEVS) else {
        return std::ptr::null();
    };
    let mut g = current(GATES[i].load(Acquire)).map_or(std::ptr::null(), |g| g as *const Gate);
    // Devices attach once this generation's attachment is decided (a forked
    // child first drops its parent's gates, see `attach_lazily`).
    if g.is_null()
        && ATTACH.load(Acquire) == attach_word(fork::generation(), DECIDED)
        && DEV_ATTACH[i]
            .compare_exchange(UNDECIDED, ATTACHING, AcqRel, Acquire)
            .is_ok()
    {
        let r = std::panic::catch_unwind(|| {
            let gpu = crate::memory::cuda_gpu(dev)?;
            let (ledger, m) = gpu.ledger()?;
            Some(make_gate(ledger, m, driver_ops()?))
        });
        match r {
            Ok(Some(Ok(gate))) => {
                GATES[i].store(gate as *const Gate as *mut Gate, Release);
                g = gate;
                tracing::debug!("cgpu: compute scheduling on for device {dev}");
            }
            other => log_attach(other.map(|x| x.map(|y| y.map(|_| ())))),
        }
        DEV_ATTACH[i].store(DECIDED, Release);
    }
    if !g.is_null() {
        CTX_GATE.with(|c| c.set((ctx as usize, g)));
    }
    g
}

/// A gate for `m` in `ledger`, with its helper thread running.
fn make_gate(
    ledger: &'static Ledger,
    m: &Membership,
    drv: DriverOps,
) -> Result<&'static Gate, String> {
    let gate: &'static Gate = Box::leak(Box::new(Gate::new(ledger, m.container, m.process, drv)));
    gate.beat();
    let spawned = std::thread::Builder::new()
        .name("cgpu-sched".into())
        .spawn(move || gate.helper_loop())
        .and_then(|_| {
            std::thread::Builder::new()
                .name("cgpu-beat".into())
                .spawn(move || gate.beat_loop())
        });
    if let Err(e) = spawned {
        gate.stop.store(true, Release);
        return Err(format!(
            "cannot start the scheduler threads: {e}; kernel launches are not held back"
        ));
    }
    register_handlers();
    Ok(gate)
}

/// Join the compute scheduler of the GPU whose ledger is `ledger`, as the
/// process slot of membership `m`, for a process that uses one GPU. `drv`
/// are the real driver's functions. Starts the process's helper thread
/// (slice timer and drainer). Replaces an earlier attachment.
/// Without a successful attach, launches are not held back.
pub fn attach(ledger: &'static Ledger, m: &Membership, drv: DriverOps) -> Result<(), String> {
    ATTACH.store(attach_word(fork::generation(), DECIDED), Release);
    let gate = make_gate(ledger, m, drv)?;
    let old = GATE.swap(gate as *const Gate as *mut Gate, AcqRel);
    if !old.is_null() {
        // SAFETY: leaked, never freed.
        unsafe { &*old }.stop.store(true, Release);
    }
    Ok(())
}

/// From now on this process's launches go through secure mode's gate `g`
/// (the launch benchmark, after it measured the cooperative gate).
#[doc(hidden)]
pub fn secure_install_for_bench(g: &'static SecureGate) {
    detach();
    SECURE_MODE.store(true, Release);
    secure::install_for_bench(g);
}

/// `pthread_atfork` child handler: the parent's scheduling connections
/// (secure mode) are closed in the child.
pub fn secure_after_fork_child() {
    secure::after_fork_child();
}

/// Stop holding launches back in this process (e.g. at exit).
pub fn detach() {
    secure::detach();
    MULTI.store(false, Release);
    ATTACH.store(attach_word(fork::generation(), DECIDED), Release);
    let olds = std::iter::once(&GATE).chain(GATES.iter());
    for g in olds {
        let old = g.swap(std::ptr::null_mut(), AcqRel);
        if !old.is_null() {
            // SAFETY: leaked, never freed.
            unsafe { &*old }.stop.store(true, Release);
        }
    }
}

/// Every gate of this process (at most one per device, plus the single one)
/// made in this fork generation (a gate copied from the parent may name a
/// context its drain was synchronising when the parent forked).
fn each_gate(mut f: impl FnMut(&Gate)) {
    for g in std::iter::once(&GATE).chain(GATES.iter()) {
        if let Some(g) = current(g.load(Acquire)) {
            f(g);
        }
    }
}

/// A thread of this process inside a synchronise call, while it lives: the
/// scheduler counts the process as waiting for its GPU work (a holder that
/// waits for its work is not idle). A process that sees one GPU counts it on
/// its gate. A process that drives several GPUs counts it on every one of
/// its gates: a thread that synchronises GPU 0 is about to launch on GPU 1
/// again (it queued work there too), so its slice on GPU 1 must not be
/// handed over as idle meanwhile. Atomics only; a no-op when not
/// scheduling.
pub struct WaitingForGpu {
    marked: GateMask,
    /// The gate of the current context's device, and what it saw when the
    /// call began (null: not scheduling).
    own: *const Gate,
    began: Option<gate::SyncStart>,
}

impl WaitingForGpu {
    #[inline]
    pub fn new() -> WaitingForGpu {
        if SECURE_MODE.load(Relaxed) {
            secure::in_sync(true);
            return WaitingForGpu {
                marked: GateMask::Secure,
                own: std::ptr::null(),
                began: None,
            };
        }
        let (marked, own) = if MULTI.load(Acquire) {
            (mark_busy(std::ptr::null(), true), gate_of_current_context())
        } else {
            let g = current(GATE.load(Acquire));
            if let Some(g) = g {
                g.in_sync(true);
            }
            let g = g.map_or(std::ptr::null(), |g| g as *const Gate);
            (GateMask::One(g), g)
        };
        // SAFETY: as above.
        let began = (!own.is_null()).then(|| unsafe { &*own }.sync_began());
        WaitingForGpu { marked, own, began }
    }

    /// The synchronise call returned `rc` after waiting for `what` (its
    /// process's work may then be known done: see `Gate::sync_returned`).
    #[inline]
    pub fn returned(&self, rc: CUresult, what: Synced) {
        if let Some(b) = self.began {
            // SAFETY: as in `new`.
            unsafe { &*self.own }.sync_returned(b, rc, what);
        }
    }
}

impl Default for WaitingForGpu {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for WaitingForGpu {
    #[inline]
    fn drop(&mut self) {
        unmark_busy(self.marked);
    }
}

/// Gates a thread counted itself busy on (see [`WaitingForGpu`]).
#[derive(Clone, Copy, Debug)]
pub(crate) enum GateMask {
    /// The single gate (or none: null).
    One(*const Gate),
    /// The per-device gates `GATES[i]` whose bit `i` is set.
    Devices(u32),
    /// Every secure gate of this process (secure mode).
    Secure,
}

/// Count the calling thread as waiting for the GPU on every per-device gate
/// of this process but `except` (`on`), for a thread inside a synchronise
/// call, or waiting for its turn on one device while its process holds
/// others: a process blocked on one GPU is not idle on the rest.
pub(crate) fn mark_busy(except: *const Gate, on: bool) -> GateMask {
    let mut mask = 0u32;
    if on {
        for (i, g) in GATES.iter().enumerate() {
            if let Some(g) = current(g.load(Acquire)).filter(|&g| !std::ptr::eq(g, except)) {
                g.in_sync(true);
                mask |= 1 << i;
            }
        }
    }
    GateMask::Devices(mask)
}

/// Undo [`mark_busy`] or [`WaitingForGpu::new`] on exactly the gates marked.
pub(crate) fn unmark_busy(m: GateMask) {
    match m {
        GateMask::Secure => secure::in_sync(false),
        GateMask::One(g) => {
            if !g.is_null() {
                // SAFETY: as in `mark_busy`.
                unsafe { &*g }.in_sync(false);
            }
        }
        GateMask::Devices(mut mask) => {
            while mask != 0 {
                let i = mask.trailing_zeros() as usize;
                mask &= mask - 1;
                if let Some(g) = current(GATES[i].load(Acquire)) {
                    g.in_sync(false);
                }
            }
        }
    }
}

/// Context `ctx` is about to be destroyed (`cuCtxDestroy`): the handover
/// drain forgets it, and this returns once no drain is synchronising it.
/// Call before the real destroy.
pub fn forget_context(ctx: usize) {
    each_gate(|g| g.forget_ctx(ctx));
    secure::forget_context(ctx);
}

/// The primary context of device `dev` (the real driver's ordinal) is about
/// to be released or reset: the drain forgets the device's contexts (a
/// context still in use is registered again at its next slice). Call
/// before the real release/reset.
pub fn forget_device_contexts(dev: i32) {
    each_gate(|g| g.forget_device(dev));
    secure::forget_device(dev);
}

/// At exit, the helper threads stop touching the driver while it is torn
/// down. (A forked child needs no handler: it has no helper thread, never
/// uses its parent's gates, and attaches again at its first launch, the
/// memory side re-joining the ledger lazily; see `GATE`.)
fn register_handlers() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    extern "C" fn at_exit() {
        detach();
    }
    ONCE.call_once(|| {
        // SAFETY: registering a plain extern "C" handler that only stores atomics.
        unsafe { libc::atexit(at_exit) };
    });
}

#[cfg(test)]
mod tests {
    use super::words::{gpu as gw, Token, DRAINING, RUNNING};
    use super::*;
    use crate::ledger::JoinRequest;
    use std::sync::atomic::AtomicU32;
    use std::time::{Duration, Instant};

    /// The fake driver's synchronise blocks while this is set (a drain that
    /// is synchronising when the process forks).
    static HOLD_SYNC: AtomicBool = AtomicBool::new(true);
    static SYNCS: AtomicU32 = AtomicU32::new(0);
    const CTX: usize = 0x1000;

    unsafe extern "C" fn get_current(c: *mut CUcontext) -> CUresult {
        // SAFETY: the drain passes a valid out-pointer.
        unsafe { *c = CTX as CUcontext };
        0
    }
    unsafe extern "C" fn set_current(_: CUcontext) -> CUresult {
        0
    }
    unsafe extern "C" fn synchronize() -> CUresult {
        SYNCS.fetch_add(1, SeqCst);
        let t0 = Instant::now();
        while HOLD_SYNC.load(SeqCst) && t0.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(1));
        }
        0
    }
    unsafe extern "C" fn get_device(d: *mut i32) -> CUresult {
        // SAFETY: a valid out-pointer.
        unsafe { *d = 0 };
        0
    }
    unsafe extern "C" fn stream_query(_: *mut std::ffi::c_void) -> CUresult {
        0
    }

    /// Runs `f` in a forked child; its answer, or None when it did not
    /// answer within 10 s (then it is killed).
    fn in_child(f: impl FnOnce() -> [u64; 4]) -> Option<[u64; 4]> {
        let mut fds = [0i32; 2];
        // SAFETY: a pipe for the child's answer; the child runs `f` (the
        // scheduler's entry points) and `_exit`s without unwinding or
        // running the parent's exit handlers.
        let pid = unsafe {
            assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
            libc::fork()
        };
        if pid == 0 {
            let v = f();
            // SAFETY: as above.
            unsafe {
                libc::write(fds[1], v.as_ptr().cast(), std::mem::size_of_val(&v));
                libc::_exit(0);
            }
        }
        let mut v = [u64::MAX; 4];
        let mut pfd = libc::pollfd {
            fd: fds[0],
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: valid descriptors and buffers; the child is ours.
        unsafe {
            let ok = libc::poll(&mut pfd, 1, 10_000) == 1
                && libc::read(fds[0], v.as_mut_ptr().cast(), std::mem::size_of_val(&v))
                    == std::mem::size_of_val(&v) as isize;
            if !ok {
                libc::kill(pid, libc::SIGKILL);
            }
            libc::waitpid(pid, std::ptr::null_mut(), 0);
            libc::close(fds[0]);
            libc::close(fds[1]);
            ok.then_some(v)
        }
    }

    /// A process forks while its helper drains (inside the driver's
    /// synchronise of a context). The child neither uses the parent's gate
    /// (whose drain would wait for a synchronise that does not exist in the
    /// child, and whose process slot is the parent's) nor its capture table:
    /// its first launch, a synchronise call, a context's destruction and a
    /// capture's begin return at once, and the parent's ledger words are
    /// untouched. Then the parent's drain finishes and the GPU moves on; a
    /// second child, forked inside the parent's slice by a thread whose
    /// launches pass the fast path, is not admitted under the parent's
    /// gate either. (Each child's attach finds no driver here and says so
    /// on stderr.)
    #[test]
    fn a_child_forked_mid_drain_starts_afresh() {
        use std::sync::atomic::Ordering::SeqCst;
        let dir = std::env::temp_dir().join(format!("cgpu-sched-fork-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let ledger: &'static Ledger = Box::leak(Box::new(
            Ledger::open_or_create(&dir, "GPU-fork-test", 0, 16 << 30).expect("ledger"),
        ));
        ledger.set_policy(1).unwrap();
        let m = ledger
            .join(&JoinRequest {
                container_id: "parent",
                key: 0,
                quota: 0,
                weight: 1,
                highprio: false,
                enforce_off: false,
            })
            .expect("join");
        let drv = DriverOps {
            ctx_get_current: get_current,
            ctx_set_current: set_current,
            ctx_synchronize: synchronize,
            ctx_get_device: get_device,
            stream_query,
            events: None,
        };
        attach(ledger, &m, drv).expect("attach");
        admit_launch(std::ptr::null_mut());
        launched(std::ptr::null_mut(), 0);
        let f = ledger.file();
        let token = &f.header.sched[gw::TOKEN];
        let t = Token::unpack(token.load(SeqCst));
        assert_eq!((t.state, t.holder), (RUNNING, Some(m.container)), "{t:?}");
        // End the slice as a waiter of another container would: the helper
        // drains, and stays inside the synchronise.
        let d = t.next(DRAINING, t.holder, None);
        f.header.sched[gw::STATE_SINCE].store(crate::process::clock::monotonic_ns(), SeqCst);
        assert!(token
            .compare_exchange(t.pack(), d.pack(), SeqCst, SeqCst)
            .is_ok());
        sys::futex_wake(token);
        let t0 = Instant::now();
        while SYNCS.load(SeqCst) == 0 {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "the helper never drained"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        let in_sync = &f.processes[m.process].sched_in_sync;
        let want = &f.containers[m.container].sched[words::container::WANT + m.process / 64];
        let v = in_child(|| {
            let t0 = Instant::now();
            admit_launch(std::ptr::null_mut());
            launched(std::ptr::null_mut(), 0);
            let w = WaitingForGpu::new();
            let counted = in_sync.load(SeqCst);
            w.returned(0, Synced::Context);
            drop(w);
            forget_context(CTX);
            let b = capture::CAPTURES.begin(0x30);
            capture::CAPTURES.begun(b, 0);
            [
                t0.elapsed().as_millis() as u64,
                counted,
                want.load(SeqCst),
                token.load(SeqCst),
            ]
        });
        HOLD_SYNC.store(false, SeqCst);
        let [ms, counted, child_want, child_token] = v.expect("the child hung in the scheduler");
        assert!(ms < 1000, "the child's first calls took {ms} ms");
        assert_eq!(
            counted, 0,
            "the child counted itself in the parent's process slot"
        );
        assert_eq!(
            child_want, 0,
            "the child asked for the GPU as the parent's process"
        );
        assert_eq!(child_token, d.pack(), "the child moved the parent's token");
        // The parent's drain ends and its container holds the GPU again.
        let t0 = Instant::now();
        let held = loop {
            let t = Token::unpack(token.load(SeqCst));
            if t.state == RUNNING && t.seq != d.seq {
                break t;
            }
            assert!(t0.elapsed() < Duration::from_secs(10), "stuck at {t:?}");
            admit_launch(std::ptr::null_mut());
            launched(std::ptr::null_mut(), 0);
            std::thread::sleep(Duration::from_millis(1));
        };
        // Fork again inside the parent's slice, from a thread that launched
        // in it (its launches pass the fast path): the child's first launch
        // is not admitted under the parent's gate.
        admit_launch(std::ptr::null_mut());
        launched(std::ptr::null_mut(), 0);
        let v = in_child(|| {
            admit_launch(std::ptr::null_mut());
            let (g, n) = ADMITTED.with(|a| a.get());
            launched(std::ptr::null_mut(), 0);
            [g as u64, u64::from(n), 0, 0]
        });
        let [g, n, ..] = v.expect("the child hung in the scheduler");
        let parents = GATE.load(SeqCst) as u64;
        assert!(
            !(g == parents && n > 0),
            "the child launched under its parent's gate (token {held:?})"
        );
        detach();
        let _ = std::fs::remove_dir_all(&dir);
    }
}
