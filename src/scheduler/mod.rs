//! Compute scheduling (SPEC §4): policies 0–5, weights, high priority.
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

mod decide;
mod gate;
pub mod policy;
mod sys;
pub mod words;

pub use decide::{allowance, Params, SLICE_NS};
pub use gate::{CUcontext, DriverOps, Gate};

use crate::ledger::{ContainerSlot, Ledger, LedgerFile, Membership, MAX_CONTAINERS, SLOT_LIVE};
use cgpu_ffi::CUresult;
use std::cell::Cell;
use std::sync::atomic::{AtomicPtr, AtomicU8, Ordering::*};
use words::container as cw;

/// Opaque `CUstream` as the launch hooks see it.
pub type Stream = *mut std::ffi::c_void;

/// The gate of this process (null: not scheduling, every launch passes).
static GATE: AtomicPtr<Gate> = AtomicPtr::new(std::ptr::null_mut());

/// Lazy attachment: not tried yet / attached or given up.
const UNDECIDED: u8 = 0;
const ATTACHING: u8 = 1;
const DECIDED: u8 = 2;
static ATTACH: AtomicU8 = AtomicU8::new(UNDECIDED);

thread_local! {
    /// This thread's launches in flight admitted through `GATE` (more than
    /// one for `cuLaunchCooperativeKernelMultiDevice`, admitted per stream).
    static ADMITTED: Cell<u32> = const { Cell::new(0) };
}

/// Called by every launch hook before calling the real driver. Returns
/// immediately when the container holds the GPU and is within its slice
/// (a few atomics, no lock, no allocation); otherwise blocks the calling
/// thread until it may launch.
#[inline]
pub fn admit_launch(_stream: Stream) {
    let mut g = GATE.load(Acquire);
    if g.is_null() {
        if ATTACH.load(Relaxed) != UNDECIDED {
            return;
        }
        g = attach_lazily();
        if g.is_null() {
            return;
        }
    }
    // SAFETY: a gate, once published, is never freed (leaked on attach).
    let g = unsafe { &*g };
    if g.admit() {
        ADMITTED.with(|a| a.set(a.get() + 1));
    }
}

/// Called by every launch hook after the real driver returned `_result`.
#[inline]
pub fn launched(_stream: Stream, _result: CUresult) {
    if ADMITTED.with(|a| {
        let n = a.get();
        a.set(n.saturating_sub(1));
        n > 0
    }) {
        let g = GATE.load(Acquire);
        if !g.is_null() {
            // SAFETY: as in `admit_launch`.
            unsafe { &*g }.done();
        }
    }
}

/// First launch of the process (or of a forked child): attach to the GPU of
/// the current context if the process is in its ledger (memory isolation on,
/// as with cGPU: no `ALIYUN_COM_GPU_MEM_CONTAINER`, no cGPU).
#[cold]
#[inline(never)]
fn attach_lazily() -> *mut Gate {
    use crate::hooks::real;
    // One thread attaches; others launch unscheduled meanwhile (no lock, so
    // a fork in the middle cannot leave the child stuck).
    if ATTACH
        .compare_exchange(UNDECIDED, ATTACHING, AcqRel, Acquire)
        .is_err()
    {
        return GATE.load(Acquire);
    }
    let r = std::panic::catch_unwind(|| {
        let gpu = crate::hooks::device::current_gpu()?;
        let (ledger, m) = gpu.ledger()?;
        let drv = DriverOps {
            ctx_get_current: real::cuCtxGetCurrent.get()?,
            ctx_set_current: real::cuCtxSetCurrent.get()?,
            ctx_synchronize: real::cuCtxSynchronize.get()?,
        };
        Some(attach(ledger, m, drv))
    });
    match r {
        Ok(Some(Ok(()))) => {
            tracing::debug!("cgpu: compute scheduling on");
        }
        Ok(Some(Err(e))) => tracing::error!("cgpu: {e}"),
        Ok(None) => tracing::debug!(
            "cgpu: no shared ledger for this GPU: kernel launches are not scheduled"
        ),
        Err(_) => {
            tracing::error!("cgpu: scheduler attach panicked: kernel launches are not scheduled")
        }
    }
    ATTACH.store(DECIDED, Release);
    GATE.load(Acquire)
}

/// Join the compute scheduler of the GPU whose ledger is `ledger`, as the
/// process slot of membership `m`. `drv` are the real driver's functions.
/// Starts the process's helper thread (slice timer and drainer). Replaces an
/// earlier attachment (after `fork`, the child attaches again).
/// Without a successful attach, launches are not held back.
pub fn attach(ledger: &'static Ledger, m: &Membership, drv: DriverOps) -> Result<(), String> {
    ATTACH.store(DECIDED, Release);
    let gate: &'static Gate = Box::leak(Box::new(Gate::new(ledger, m.container, m.process, drv)));
    std::thread::Builder::new()
        .name("cgpu-sched".into())
        .spawn(move || gate.helper_loop())
        .map_err(|e| {
            format!("cannot start the scheduler thread: {e}; kernel launches are not held back")
        })?;
    let old = GATE.swap(gate as *const Gate as *mut Gate, AcqRel);
    if !old.is_null() {
        // SAFETY: leaked, never freed.
        unsafe { &*old }.stop.store(true, Release);
    }
    register_atfork();
    Ok(())
}

/// Stop holding launches back in this process (e.g. at exit).
pub fn detach() {
    let old = GATE.swap(std::ptr::null_mut(), AcqRel);
    if !old.is_null() {
        // SAFETY: leaked, never freed.
        unsafe { &*old }.stop.store(true, Release);
    }
}

/// For a `pthread_atfork` child handler (async-signal-safe: atomic stores).
/// The child has no helper thread: it launches freely until it attaches
/// again (the hooks re-join the ledger in the child, then call [`attach`]).
pub fn after_fork_child() {
    GATE.store(std::ptr::null_mut(), Release);
    ATTACH.store(UNDECIDED, Release);
}

fn register_atfork() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    extern "C" fn child() {
        after_fork_child();
    }
    extern "C" fn at_exit() {
        // The helper thread stops touching the driver while it is torn down.
        detach();
    }
    ONCE.call_once(|| {
        // SAFETY: registering plain extern "C" handlers that only store atomics.
        unsafe {
            libc::pthread_atfork(None, None, Some(child));
            libc::atexit(at_exit);
        }
    });
}

/// Per-container compute counters kept in the ledger.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct ContainerSchedStats {
    /// GPU time charged to the container since it joined, ns.
    pub gpu_time_ns: u64,
    /// Time its threads spent held back in launch hooks, ns (summed over threads).
    pub throttled_ns: u64,
    /// Launches admitted.
    pub launches: u64,
}

/// Counters of one container slot.
pub fn container_stats(slot: &ContainerSlot) -> ContainerSchedStats {
    ContainerSchedStats {
        gpu_time_ns: slot.sched[cw::GPU_NS].load(Relaxed),
        throttled_ns: slot.sched[cw::THROTTLED_NS].load(Relaxed),
        launches: slot.sched[cw::LAUNCHES].load(Relaxed),
    }
}

/// The GPU's knobs, range-clamped.
pub fn knobs(file: &LedgerFile) -> policy::Knobs {
    let h = &file.header;
    policy::Knobs::sanitized(
        h.policy.load(Relaxed),
        h.max_inst.load(Relaxed),
        h.prio_ratio.load(Relaxed),
    )
}

/// The compute limit, in percent of the GPU, that the GPU's policy and the
/// container's weight give container slot `container` right now, counting
/// every live container as busy (what `cgpu-smi` shows as "Limit").
pub fn limit_percent(file: &LedgerFile, container: usize) -> u32 {
    let mut ms = [policy::Member::default(); MAX_CONTAINERS];
    for (i, s) in file.containers.iter().enumerate() {
        ms[i] = policy::Member {
            live: s.state.load(Relaxed) == SLOT_LIVE,
            weight: s.weight.load(Relaxed),
            highprio: s.highprio.load(Relaxed) != 0,
            active: false,
        };
    }
    policy::limit_percent(&knobs(file), &ms, container)
}
