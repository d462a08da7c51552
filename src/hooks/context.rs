//! Contexts: what a context reserves on the device counts against the quota
//! (real drivers take a few hundred MiB). We measure it as the driver reports
//! it: this process's device memory (NVML's per-process `usedGpuMemory`, else
//! the device's used memory) just before and after the real creation, with
//! this process's allocations held off meanwhile. The reservation is charged
//! after the fact; if it would pass the quota, the new context is destroyed
//! again and `CUDA_ERROR_OUT_OF_MEMORY` returned. Destroying a context (or
//! releasing the primary context to zero, or resetting it) gives back its
//! reservation and everything allocated in it.
//!
//! Context limits that reserve device memory (`cuCtxSetLimit`: the malloc
//! heap, the printf FIFO, the per-thread stack for every thread the device
//! holds resident, and whatever else a driver reserves for a limit) are
//! charged to the context too: see [`ctx_set_limit`].

use std::cell::Cell;
use std::ffi::CString;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::device::{cuda_gpu, current_device, current_gpu};
use super::real;
use super::sig;
use super::types::*;
use crate::driver::RealFn;
use crate::memory::{proc_state, Gpu, Kind, Owner};
use crate::process::fork::ForkLocal;

/// Allocations take it shared, context creation exclusively (so a
/// concurrent allocation is not mistaken for the context's reservation).
/// One per fork generation: a child forked while another thread of its
/// parent measured a creation does not wait for that thread, which it does
/// not have.
static MEASURE: ForkLocal<RwLock<()>> = ForkLocal::new(|| RwLock::new(()));

thread_local! {
    static IN_MEASURE: Cell<bool> = const { Cell::new(false) };
}

/// Held by allocation paths (shared; skipped when nested in a measurement).
pub fn alloc_guard() -> Option<RwLockReadGuard<'static, ()>> {
    if IN_MEASURE.with(|m| m.get()) {
        None
    } else {
        Some(MEASURE.get().read())
    }
}

pub(super) struct Measuring(#[allow(dead_code)] RwLockWriteGuard<'static, ()>);

impl Measuring {
    fn start() -> Option<Measuring> {
        if IN_MEASURE.with(|m| m.get()) {
            return None;
        }
        let g = MEASURE.get().write();
        IN_MEASURE.with(|m| m.set(true));
        Some(Measuring(g))
    }
}

impl Drop for Measuring {
    fn drop(&mut self) {
        IN_MEASURE.with(|m| m.set(false));
    }
}

static WARNED: AtomicBool = AtomicBool::new(false);

/// One NVML reference of the library's own, for the length of one
/// measurement: `nvmlInit_v2` on creation, the matching `nvmlShutdown` on
/// drop. Holding none otherwise keeps the library's use of NVML invisible to
/// the application: one that never initialised NVML does not find it
/// initialised, and an unbalanced `nvmlShutdown` of its own fails as it
/// would without cgpu instead of dropping a reference of ours.
struct NvmlRef(bool);

impl NvmlRef {
    fn acquire() -> NvmlRef {
        NvmlRef(super::call_real!(real::nvmlInit_v2,) == NVML_SUCCESS)
    }
}

impl Drop for NvmlRef {
    fn drop(&mut self) {
        if self.0 {
            super::call_real!(real::nvmlShutdown,);
        }
    }
}

/// This process's pid as NVML lists it, and the `getpid()` it was found for
/// (`getpid << 32 | nvml pid`; 0 = not known). Inside a PID namespace
/// (Docker's default) NVML lists host pids, which `getpid()` is not; the
/// pid is found once, by a probe (see [`find_own_pid`]). A forked child has
/// another `getpid()`, so it never uses its parent's.
static OWN_PID: AtomicU64 = AtomicU64::new(0);

/// This process's pid in NVML's lists; 0 when not known: inside a PID
/// namespace `getpid()` is not a host pid (and may be another process's),
/// so it is never looked up there.
fn own_pid() -> u32 {
    let me = std::process::id();
    let v = OWN_PID.load(Ordering::Acquire);
    if v >> 32 == u64::from(me) && v as u32 != 0 {
        v as u32
    } else if crate::ledger::in_host_pidns() {
        me
    } else {
        0
    }
}

/// Was this process's pid in NVML's lists found by the probe?
fn own_pid_found() -> bool {
    let v = OWN_PID.load(Ordering::Acquire);
    v >> 32 == u64::from(std::process::id()) && v as u32 != 0
}

/// What the driver reports about device memory on `gpu`.
#[derive(Default, Clone, Copy)]
struct Sample {
    /// This process's bytes (NVML per-process; `None` when NVML does not list
    /// this pid: no context yet, or a PID namespace hides it).
    mine: Option<u64>,
    /// The device's used bytes.
    device: Option<u64>,
    /// What this process has charged on the GPU (its view of its own bytes
    /// when NVML does not list it yet).
    charged: u64,
}

/// The NVML handle of `gpu`.
fn nvml_handle(gpu: &Gpu) -> Option<nvmlDevice_t> {
    let uuid = CString::new(gpu.uuid.as_str()).ok()?;
    let mut h: nvmlDevice_t = std::ptr::null_mut();
    (super::call_real!(real::nvmlDeviceGetHandleByUUID, uuid.as_ptr(), &mut h) == NVML_SUCCESS)
        .then_some(h)
}

/// NVML's compute processes on `h`: (pid, bytes), summed per pid.
fn processes(h: nvmlDevice_t) -> Option<Vec<(u32, u64)>> {
    let mut infos = vec![nvmlProcessInfo_t::default(); 64];
    for _ in 0..3 {
        let mut n = infos.len() as u32;
        let rc = super::call_real!(
            real::nvmlDeviceGetComputeRunningProcesses_v3,
            h,
            &mut n,
            infos.as_mut_ptr()
        );
        if rc == NVML_ERROR_INSUFFICIENT_SIZE {
            infos.resize(n as usize + 16, nvmlProcessInfo_t::default());
            continue;
        }
        if rc != NVML_SUCCESS {
            return None;
        }
        let mut out: Vec<(u32, u64)> = Vec::new();
        for p in &infos[..(n as usize).min(infos.len())] {
            match out.iter_mut().find(|(pid, _)| *pid == p.pid) {
                Some((_, b)) => *b = b.saturating_add(p.usedGpuMemory),
                None => out.push((p.pid, p.usedGpuMemory)),
            }
        }
        return Some(out);
    }
    None
}

fn sample(gpu: &Gpu, nvml: &NvmlRef) -> Sample {
    let mut s = Sample {
        charged: gpu.process_used(),
        ..Sample::default()
    };
    if !nvml.0 {
        return s;
    }
    let Some(h) = nvml_handle(gpu) else {
        return s;
    };
    let me = own_pid();
    if let Some(ps) = processes(h) {
        s.mine = ps
            .iter()
            .find(|(p, _)| me != 0 && *p == me)
            .map(|(_, b)| *b);
    }
    let mut m = nvmlMemory_t::default();
    if super::call_real!(real::nvmlDeviceGetMemoryInfo, h, &mut m) == NVML_SUCCESS {
        s.device = Some(m.used);
    }
    s
}

/// Find this process's pid in NVML's list of `gpu` when it is not
/// `getpid()` (a PID namespace): allocate a probe of a size unlikely to be
/// anyone else's in the new context `ctx`, and take the one pid whose bytes
/// grew by exactly that much and fell by as much when it was freed. No
/// other process's activity can be mistaken for ours, unlike the device's
/// used memory. Runs once per process (the answer is kept).
fn find_own_pid(gpu: &Gpu, ctx: CUcontext) -> Option<u32> {
    let h = nvml_handle(gpu)?;
    let nanos = crate::process::clock::realtime_ns() % 1_000_000_000;
    let probe = (2 << 20) + 512 * (1 + nanos % 4093);
    if super::call_real!(real::cuCtxPushCurrent_v2, ctx) != CUDA_SUCCESS {
        return None;
    }
    let found = (|| {
        let p0 = processes(h)?;
        let mut dptr: CUdeviceptr = 0;
        if super::call_real!(real::cuMemAlloc_v2, &mut dptr, probe as usize) != CUDA_SUCCESS {
            return None;
        }
        let p1 = processes(h);
        super::call_real!(real::cuMemFree_v2, dptr);
        let p1 = p1?;
        let p2 = processes(h)?;
        let bytes =
            |ps: &[(u32, u64)], pid: u32| ps.iter().find(|(p, _)| *p == pid).map_or(0, |(_, b)| *b);
        let mut hits = p1.iter().map(|(pid, _)| *pid).filter(|&pid| {
            bytes(&p1, pid).checked_sub(bytes(&p0, pid)) == Some(probe)
                && bytes(&p1, pid).checked_sub(bytes(&p2, pid)) == Some(probe)
        });
        let pid = hits.next()?;
        hits.next().is_none().then_some(pid)
    })();
    let mut popped: CUcontext = std::ptr::null_mut();
    super::call_real!(real::cuCtxPopCurrent_v2, &mut popped);
    if let Some(pid) = found {
        tracing::debug!(
            "cgpu: NVML lists this process as pid {pid} (getpid {}: a PID namespace)",
            std::process::id()
        );
        OWN_PID.store(
            u64::from(std::process::id()) << 32 | u64::from(pid),
            Ordering::Release,
        );
        crate::ledger::set_host_pid(pid);
        gpu.publish_host_pid(pid);
    }
    found
}

/// What a context creation reserved, from samples before and after: this
/// process's bytes when NVML lists it afterwards, less what it held before
/// (what it had charged, when NVML did not list it then: no context yet);
/// else the device's used bytes (NVML lists no processes; other processes'
/// activity may then blur the measure).
fn reserved(before: Sample, after: Sample) -> Option<u64> {
    match (after.mine, before.device, after.device) {
        (Some(a), _, _) => Some(a.saturating_sub(before.mine.unwrap_or(before.charged))),
        (None, Some(b), Some(a)) => Some(a.saturating_sub(b)),
        _ => None,
    }
}

/// Run `create`, measuring the device memory it reserved; `new_ctx` reads
/// the context it made (called only on success). `None` if it could not be
/// measured (then nothing is charged, with a warning). The measurement's
/// exclusive hold comes back with it: a caller that charges the
/// reservation while holding it is never overtaken by another creation.
fn measured(
    gpu: &Gpu,
    create: impl FnOnce() -> CUresult,
    new_ctx: impl FnOnce() -> CUcontext,
) -> (CUresult, Option<u64>, Option<Measuring>) {
    measured_as(gpu, create, new_ctx, true)
}

/// [`measured`]; `a_context`: `create` makes a context (without NVML, what
/// a context reserves is then known from the driver's own count, see
/// [`probe_reservation`]; for anything else nothing is known then).
fn measured_as(
    gpu: &Gpu,
    create: impl FnOnce() -> CUresult,
    new_ctx: impl FnOnce() -> CUcontext,
    a_context: bool,
) -> (CUresult, Option<u64>, Option<Measuring>) {
    let m = Measuring::start();
    let nvml = NvmlRef::acquire();
    let before = sample(gpu, &nvml);
    let rc = create();
    let created = if rc == CUDA_SUCCESS {
        new_ctx()
    } else {
        std::ptr::null_mut()
    };
    let mut after = sample(gpu, &nvml);
    if rc == CUDA_SUCCESS && nvml.0 && after.mine.is_none() && !own_pid_found() {
        // Not listed under getpid() although it has a context now: a PID namespace.
        let c = created;
        if !c.is_null() && find_own_pid(gpu, c).is_some() {
            after = sample(gpu, &nvml);
        }
    }
    let mut delta = reserved(before, after);
    if delta.is_none() && rc == CUDA_SUCCESS && a_context {
        // NVML unavailable: what a context of this GPU reserves, measured
        // by the driver itself once (see `probe_reservation`), then reused.
        delta = match PROBED.load(Ordering::Acquire) {
            0 => {
                let c = created;
                let d = (!c.is_null()).then(|| probe_reservation(c)).flatten();
                if let Some(d) = d {
                    PROBED.store(d.max(1), Ordering::Release);
                    tracing::info!(
                        "cgpu: NVML unavailable: a context reserves {d} bytes (measured with a second context); charged for each context"
                    );
                }
                d
            }
            d => Some(d),
        };
    }
    if delta.is_none() && !WARNED.swap(true, Ordering::Relaxed) {
        tracing::error!(
            "cgpu: cannot measure what a context reserves (NVML unavailable, and the driver's own count failed); context reservations are not counted"
        );
    }
    (rc, delta, m)
}

/// What a context reserves, as the driver itself counts it, once NVML is
/// unavailable (0: not measured yet).
static PROBED: AtomicU64 = AtomicU64::new(0);

/// Without NVML: the device's free memory as the driver reports it
/// through `ctx`, before and after creating a second, temporary context on
/// the same device (destroyed at once); the difference is what a context
/// reserves there. Under the measurement's exclusive hold, so none of this
/// process's allocations blur it (other processes' may, as with NVML's
/// device count).
fn probe_reservation(ctx: CUcontext) -> Option<u64> {
    if super::call_real!(real::cuCtxPushCurrent_v2, ctx) != CUDA_SUCCESS {
        return None;
    }
    let got = (|| {
        let mut dev: CUdevice = 0;
        if super::call_real!(real::cuCtxGetDevice, &mut dev) != CUDA_SUCCESS {
            return None;
        }
        let (mut f1, mut t) = (0usize, 0usize);
        if super::call_real!(real::cuMemGetInfo_v2, &mut f1, &mut t) != CUDA_SUCCESS {
            return None;
        }
        let mut tmp: CUcontext = std::ptr::null_mut();
        if super::call_real!(real::cuCtxCreate_v2, &mut tmp, 0, dev) != CUDA_SUCCESS {
            return None;
        }
        let mut f2 = 0usize;
        let rc = super::call_real!(real::cuMemGetInfo_v2, &mut f2, &mut t);
        super::call_real!(real::cuCtxDestroy_v2, tmp);
        (rc == CUDA_SUCCESS && f1 > f2).then(|| (f1 - f2) as u64)
    })();
    let mut popped: CUcontext = std::ptr::null_mut();
    super::call_real!(real::cuCtxPopCurrent_v2, &mut popped);
    got
}

/// Run `call` (a module's load, a global's look-up) in the current
/// context, measuring the device memory it took on `gpu` as a context's
/// reservation is measured (see [`measured`]); the measurement's hold comes
/// back with it.
pub(super) fn measured_call(
    gpu: &Gpu,
    call: impl FnOnce() -> CUresult,
) -> (CUresult, Option<u64>, Option<Measuring>) {
    measured_as(
        gpu,
        call,
        || super::memory::current_ctx() as CUcontext,
        false,
    )
}

/// Reads the context a successful creation wrote to `ctx` (null if none).
fn new_ctx(ctx: *mut CUcontext) -> impl FnOnce() -> CUcontext {
    move || {
        if ctx.is_null() {
            std::ptr::null_mut()
        } else {
            // SAFETY: called only after the driver succeeded and wrote *ctx.
            unsafe { ctx.read() }
        }
    }
}

/// Charge a new context's reservation; on over-quota destroy it again.
fn charge_new_ctx(
    gpu: &'static Gpu,
    ctx: *mut CUcontext,
    rc: CUresult,
    delta: Option<u64>,
) -> CUresult {
    if rc != CUDA_SUCCESS || ctx.is_null() {
        return rc;
    }
    // SAFETY: ctx was written by the driver on success.
    let c = unsafe { *ctx };
    let bytes = delta.unwrap_or(0);
    if !gpu.reserve(bytes) {
        super::call_real!(real::cuCtxDestroy_v2, c);
        tracing::debug!("cgpu: context reservation of {bytes} bytes would pass the quota");
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    proc_state().charges.track(
        Kind::Context,
        c as u64,
        gpu,
        bytes,
        Owner::Context(c as usize),
    );
    rc
}

/// `cuCtxCreate` / `_v2`.
///
/// # Safety
/// The driver's contract.
pub unsafe fn ctx_create(
    real: &RealFn<sig::cuCtxCreate_v2>,
    ctx: *mut CUcontext,
    flags: u32,
    dev: CUdevice,
) -> CUresult {
    if super::device::hidden(dev) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    let Some(gpu) = cuda_gpu(dev) else {
        return super::call_real!(real, ctx, flags, dev);
    };
    let (rc, d, _) = measured(
        gpu,
        || super::call_real!(real, ctx, flags, dev),
        new_ctx(ctx),
    );
    charge_new_ctx(gpu, ctx, rc, d)
}

/// `cuCtxCreate_v3`.
///
/// # Safety
/// The driver's contract.
pub unsafe fn ctx_create_v3(
    real: &RealFn<sig::cuCtxCreate_v3>,
    ctx: *mut CUcontext,
    params: *mut CUexecAffinityParam,
    n: i32,
    flags: u32,
    dev: CUdevice,
) -> CUresult {
    if super::device::hidden(dev) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    let Some(gpu) = cuda_gpu(dev) else {
        return super::call_real!(real, ctx, params, n, flags, dev);
    };
    let (rc, d, _) = measured(
        gpu,
        || super::call_real!(real, ctx, params, n, flags, dev),
        new_ctx(ctx),
    );
    charge_new_ctx(gpu, ctx, rc, d)
}

/// `cuCtxCreate_v4`.
///
/// # Safety
/// The driver's contract.
pub unsafe fn ctx_create_v4(
    real: &RealFn<sig::cuCtxCreate_v4>,
    ctx: *mut CUcontext,
    params: *mut CUctxCreateParams,
    flags: u32,
    dev: CUdevice,
) -> CUresult {
    if super::device::hidden(dev) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    let Some(gpu) = cuda_gpu(dev) else {
        return super::call_real!(real, ctx, params, flags, dev);
    };
    let (rc, d, _) = measured(
        gpu,
        || super::call_real!(real, ctx, params, flags, dev),
        new_ctx(ctx),
    );
    charge_new_ctx(gpu, ctx, rc, d)
}

/// `cuCtxDestroy` / `_v2`: gives back the reservation and what was allocated in it.
///
/// # Safety
/// The driver's contract.
pub unsafe fn ctx_destroy(real: &RealFn<sig::cuCtxDestroy_v2>, ctx: CUcontext) -> CUresult {
    crate::scheduler::forget_context(ctx as usize);
    if !crate::memory::tracking() {
        return super::call_real!(real, ctx);
    }
    let rc = super::call_real!(real, ctx);
    if rc == CUDA_SUCCESS {
        let st = proc_state();
        let _g = alloc_guard();
        st.charges.release_context(ctx as usize);
        if let Some(e) = st.charges.untrack(Kind::Context, ctx as u64) {
            e.gpu.release(e.bytes);
        }
    }
    rc
}

/// `cuDevicePrimaryCtxRetain`: the first retain creates the primary context.
///
/// # Safety
/// The driver's contract.
pub unsafe fn primary_retain(
    real: &RealFn<sig::cuDevicePrimaryCtxRetain>,
    ctx: *mut CUcontext,
    dev: CUdevice,
) -> CUresult {
    if super::device::hidden(dev) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    let Some(gpu) = cuda_gpu(dev) else {
        return super::call_real!(real, ctx, dev);
    };
    // The hold of the measurement lasts until the reservation is charged:
    // a second runtime copy retaining the same primary context from another
    // thread (it finds it made, and charges nothing) returns only after the
    // first one's charge, so it never sees free memory without it.
    let (rc, delta, _m) = measured(gpu, || super::call_real!(real, ctx, dev), new_ctx(ctx));
    if rc != CUDA_SUCCESS || ctx.is_null() {
        return rc;
    }
    // SAFETY: written by the driver on success.
    let c = unsafe { *ctx } as usize;
    if gpu.primary_refs.fetch_add(1, Ordering::AcqRel) == 0 {
        let bytes = delta.unwrap_or(0);
        if !gpu.reserve(bytes) {
            gpu.primary_refs.fetch_sub(1, Ordering::AcqRel);
            super::call_real!(real::cuDevicePrimaryCtxRelease_v2, dev);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        primary_charged(gpu, c, bytes);
    } else if delta.unwrap_or(0) > 0 {
        // Re-created by this retain while references remain (the driver
        // released it on a path we do not see, after a reset): its new
        // reservation is charged, or refused as a first retain's is, so
        // the device never holds a context the books do not count.
        let bytes = delta.unwrap_or(0);
        if !gpu.reserve(bytes) {
            gpu.primary_refs.fetch_sub(1, Ordering::AcqRel);
            super::call_real!(real::cuDevicePrimaryCtxRelease_v2, dev);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        primary_charged(gpu, c, bytes);
    }
    rc
}

/// The primary context `c` of `gpu` reserved `bytes` more (already
/// reserved): charged to it, like a created context's.
fn primary_charged(gpu: &'static Gpu, c: usize, bytes: u64) {
    gpu.primary_ctx.store(c, Ordering::Release);
    proc_state()
        .charges
        .add(Kind::Context, c as u64, gpu, bytes, Owner::Context(c));
}

fn primary_gone(gpu: &Gpu) {
    let st = proc_state();
    let _g = alloc_guard();
    let c = gpu.primary_ctx.swap(0, Ordering::AcqRel);
    st.charges.release_context(c);
    if let Some(e) = st.charges.untrack(Kind::Context, c as u64) {
        e.gpu.release(e.bytes);
    }
}

/// `cuDevicePrimaryCtxRelease` / `_v2`: at zero the context is destroyed.
///
/// # Safety
/// The driver's contract.
pub unsafe fn primary_release(
    real: &RealFn<sig::cuDevicePrimaryCtxRelease_v2>,
    dev: CUdevice,
) -> CUresult {
    if super::device::hidden(dev) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    crate::scheduler::forget_device_contexts(dev);
    let rc = super::call_real!(real, dev);
    if rc == CUDA_SUCCESS {
        if let Some(gpu) = cuda_gpu(dev) {
            let prev = gpu
                .primary_refs
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| {
                    Some(r.saturating_sub(1))
                })
                .unwrap_or(0);
            if prev == 1 {
                primary_gone(gpu);
            }
        }
    }
    rc
}

/// `cuDevicePrimaryCtxReset` / `_v2`: destroys the primary context's state.
///
/// # Safety
/// The driver's contract.
pub unsafe fn primary_reset(
    real: &RealFn<sig::cuDevicePrimaryCtxReset_v2>,
    dev: CUdevice,
) -> CUresult {
    if super::device::hidden(dev) {
        return CUDA_ERROR_INVALID_DEVICE;
    }
    crate::scheduler::forget_device_contexts(dev);
    let rc = super::call_real!(real, dev);
    if rc == CUDA_SUCCESS {
        if let Some(gpu) = cuda_gpu(dev) {
            gpu.primary_refs.store(0, Ordering::Release);
            primary_gone(gpu);
        }
    }
    rc
}

/// `CU_LIMIT_STACK_SIZE`: bytes per thread, for every resident thread.
const LIMIT_STACK_SIZE: CUlimit = 0;
/// `CU_LIMIT_PRINTF_FIFO_SIZE`: bytes.
const LIMIT_PRINTF_FIFO_SIZE: CUlimit = 1;
/// `CU_LIMIT_MALLOC_HEAP_SIZE`: bytes.
const LIMIT_MALLOC_HEAP_SIZE: CUlimit = 2;

fn device_attribute(dev: CUdevice, attr: CUdevice_attribute) -> u64 {
    let mut v: i32 = 0;
    if super::call_real!(real::cuDeviceGetAttribute, &mut v, attr, dev) == CUDA_SUCCESS {
        v.max(0) as u64
    } else {
        0
    }
}

/// Device bytes one unit of `limit` reserves on `dev`, as drivers reserve
/// them (0: a limit not known to reserve memory, or a device that does not
/// say): the heap and the printf FIFO take their size, the stack its size
/// for every thread the device holds resident.
fn bytes_per_unit(limit: CUlimit, dev: CUdevice) -> u64 {
    match limit {
        LIMIT_PRINTF_FIFO_SIZE | LIMIT_MALLOC_HEAP_SIZE => 1,
        LIMIT_STACK_SIZE => {
            device_attribute(dev, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)
                .saturating_mul(device_attribute(
                    dev,
                    CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                ))
        }
        _ => 0,
    }
}

/// What a call changed of this process's device memory, from samples taken
/// around it (this process's bytes when NVML lists it both times, else the
/// device's used bytes); `None` when not measurable.
fn change(before: Sample, after: Sample) -> Option<i128> {
    match (before.mine, after.mine, before.device, after.device) {
        (Some(b), Some(a), _, _) => Some(i128::from(a) - i128::from(b)),
        (_, _, Some(b), Some(a)) => Some(i128::from(a) - i128::from(b)),
        _ => None,
    }
}

/// The charge a limit holds after a change: what it held plus what the call
/// reserved, never below nothing. For a limit whose reservation is
/// `predicted` (`known`), the larger of that and the `measured` change: a
/// driver may reserve the heap only at the next module load (so a raise
/// measures nothing yet) and keep it once loaded (so a lower value may give
/// nothing back); charging the prediction there, and giving back only what
/// was measured given back, never counts less than the driver holds. For
/// other limits, what was measured (nothing if it cannot be).
fn limit_charge(held: u64, measured: Option<i128>, predicted: i128, known: bool) -> u64 {
    let change = match (measured, known) {
        (Some(m), true) => m.max(predicted),
        (None, true) => predicted,
        (m, false) => m.unwrap_or(0),
    };
    (i128::from(held) + change).clamp(0, i128::from(u64::MAX)) as u64
}

/// `cuCtxSetLimit`: what the new value reserves on the device is charged to
/// the current context, and what a lower value gives back is released.
///
/// - Before the call, the growth the value predicts (the new value less the
///   current one, times `bytes_per_unit`) is reserved on the quota: a raise
///   that cannot fit is refused with `CUDA_ERROR_OUT_OF_MEMORY` and never
///   reaches the driver.
/// - After it, the charge is settled on what the driver reserved, measured
///   as for a context's creation (this process's allocations held off
///   meanwhile), and never below the prediction (see `limit_charge`); if
///   that is more than the quota holds, the limit is set back to its old
///   value and `CUDA_ERROR_OUT_OF_MEMORY` returned.
/// - The charge belongs to the context: destroying it (or the primary
///   context's last release, or its reset) gives it back.
///
/// # Safety
/// The driver's contract.
pub unsafe fn ctx_set_limit(
    real: &RealFn<sig::cuCtxSetLimit>,
    limit: CUlimit,
    value: usize,
) -> CUresult {
    let (Some(gpu), Some(dev)) = (current_gpu(), current_device()) else {
        return super::call_real!(real, limit, value);
    };
    let ctx = super::memory::current_ctx();
    if ctx == 0 {
        return super::call_real!(real, limit, value);
    }
    let _m = Measuring::start();
    let mut cur: usize = 0;
    let old =
        (super::call_real!(real::cuCtxGetLimit, &mut cur, limit) == CUDA_SUCCESS).then_some(cur);
    let unit = bytes_per_unit(limit, dev);
    let predicted = old.map_or(0, |o| (value as i128 - o as i128) * i128::from(unit));
    let upfront = predicted.clamp(0, i128::from(u64::MAX)) as u64;
    if !gpu.reserve(upfront) {
        tracing::debug!(
            "cgpu: cuCtxSetLimit({limit}, {value}) reserving {upfront} bytes refused: container would pass its quota on GPU {}",
            gpu.visible_index
        );
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    let st = proc_state();
    let key = Kind::Limit(limit);
    let held = st.charges.untrack(key, ctx as u64).map_or(0, |e| e.bytes);
    let keep = |bytes: u64| {
        if bytes > 0 {
            st.charges
                .track(key, ctx as u64, gpu, bytes, Owner::Context(ctx));
        }
    };
    let nvml = NvmlRef::acquire();
    let before = sample(gpu, &nvml);
    let rc = super::call_real!(real, limit, value);
    if rc != CUDA_SUCCESS {
        gpu.release(upfront);
        keep(held);
        return rc;
    }
    let after = sample(gpu, &nvml);
    let known = unit > 0 && old.is_some();
    // The device's used bytes move with other processes' allocations too:
    // for a limit whose reservation is known, only this process's own
    // bytes are a measure worth more than the prediction.
    let measured = if known && (before.mine.is_none() || after.mine.is_none()) {
        None
    } else {
        change(before, after)
    };
    let want = limit_charge(held, measured, predicted, known);
    let have = held.saturating_add(upfront);
    if want > have && !gpu.reserve(want - have) {
        match old {
            Some(o) if super::call_real!(real, limit, o) == CUDA_SUCCESS => {
                tracing::debug!(
                    "cgpu: cuCtxSetLimit({limit}, {value}) reserved {} bytes, past the container's quota on GPU {}: set back",
                    want - held,
                    gpu.visible_index
                );
                gpu.release(upfront);
                keep(held);
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
            _ => {
                tracing::error!(
                    "cgpu: cuCtxSetLimit({limit}, {value}) reserved {} bytes beyond the container's quota on GPU {} and could not be set back; {} bytes are not counted",
                    want - held,
                    gpu.visible_index,
                    want - have
                );
                keep(have);
                return rc;
            }
        }
    }
    if want < have {
        gpu.release(have - want);
    }
    keep(want);
    rc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservation_measures() {
        let s = |mine, device| Sample {
            mine,
            device,
            charged: 0,
        };
        // First context: not listed before, listed after.
        assert_eq!(
            reserved(s(None, Some(100)), s(Some(300), Some(400))),
            Some(300)
        );
        // Another context: per-process delta, whatever the device did.
        assert_eq!(
            reserved(s(Some(300), Some(400)), s(Some(600), Some(9000))),
            Some(300)
        );
        // PID namespace: never listed; the device's delta.
        assert_eq!(reserved(s(None, Some(100)), s(None, Some(400))), Some(300));
        // No NVML.
        assert_eq!(reserved(s(None, None), s(None, None)), None);
        // Not listed before (no context) while holding memory that outlived
        // its contexts: what it had charged is not the new context's.
        let before = Sample {
            charged: 200,
            ..s(None, Some(900))
        };
        assert_eq!(reserved(before, s(Some(500), Some(1200))), Some(300));
        // Never negative.
        assert_eq!(reserved(s(None, Some(500)), s(None, Some(400))), Some(0));
    }

    #[test]
    fn limit_changes_measure_signed() {
        let s = |mine, device| Sample {
            mine,
            device,
            charged: 0,
        };
        // This process's bytes, whatever the device did meanwhile.
        assert_eq!(
            change(s(Some(300), Some(900)), s(Some(350), Some(5000))),
            Some(50)
        );
        assert_eq!(
            change(s(Some(300), Some(900)), s(Some(250), Some(5000))),
            Some(-50)
        );
        // A PID namespace: the device's bytes.
        assert_eq!(change(s(None, Some(900)), s(None, Some(800))), Some(-100));
        assert_eq!(change(s(None, None), s(None, None)), None);
        // The charge follows the measure, else the prediction; never below 0.
        // Known limits: the measure when it is at least the prediction
        // (an eager driver), else the prediction (a heap reserved at the next
        // module load: a raise measures nothing, a lower value frees nothing).
        assert_eq!(limit_charge(100, Some(50), 50, true), 150);
        assert_eq!(limit_charge(100, Some(0), 50, true), 150);
        assert_eq!(limit_charge(100, Some(-30), -30, true), 70);
        assert_eq!(limit_charge(100, Some(0), -30, true), 100);
        assert_eq!(limit_charge(100, None, 50, true), 150);
        assert_eq!(limit_charge(100, None, -500, true), 0);
        // Other limits: what was measured; nothing when it cannot be.
        assert_eq!(limit_charge(100, Some(-30), 0, false), 70);
        assert_eq!(limit_charge(100, Some(-300), 0, false), 0);
        assert_eq!(limit_charge(100, None, 0, false), 100);
    }
}
