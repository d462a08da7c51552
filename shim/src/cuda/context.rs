//! Primary and created contexts, the per-thread context stack.
//! Each context reserves `CGPU_SIM_CTX_MIB` of device memory while it lives,
//! plus what its limits reserve (`limits.rs`).

use crate::driver::{cu, Ctx, Driver, Obj, CTX_STACK};
use crate::{guard, put, CuRes};
use cgpu_ffi::*;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::*};
use std::sync::Arc;

fn new_ctx(d: &Driver, dev: usize, primary: bool, flags: u32) -> Result<usize, CUresult> {
    d.charge(dev, d.cfg.ctx_bytes)?;
    d.touch_dev(dev);
    d.ctx_alive(dev, true);
    let c = Ctx {
        dev,
        primary,
        flags: AtomicU32::new(flags),
        destroyed: AtomicBool::new(false),
        limits: Default::default(),
        usage: AtomicU32::new(1),
        green: Default::default(),
    };
    Ok(d.objs.lock().insert(Obj::Ctx(Arc::new(c))))
}

/// Tears a context down: waits for its device work, frees its memory.
fn destroy_ctx(d: &Driver, h: usize, c: &Ctx) {
    if c.destroyed.swap(true, AcqRel) {
        return;
    }
    if let Some(e) = d.exec_if_started(c.dev) {
        e.wait(e.submitted_seq());
    }
    super::memory::free_ctx_allocs(d, h);
    d.uncharge(c.dev, d.cfg.ctx_bytes);
    super::limits::release(d, c);
    d.ctx_alive(c.dev, false);
    // Streams, events, modules of the context go with it.
    let mut objs = d.objs.lock();
    let dead: Vec<usize> = objs
        .iter()
        .filter(|(_, o)| match o {
            Obj::Stream(s) => s.ctx == h,
            Obj::Module(m) => m.ctx == h,
            _ => false,
        })
        .map(|(k, _)| *k)
        .collect();
    for k in dead {
        objs.remove(k);
    }
}

fn push(h: usize) {
    CTX_STACK.with(|s| s.borrow_mut().push(h));
}

fn create(pctx: *mut CUcontext, flags: u32, dev: CUdevice) -> CuRes {
    let d = cu()?;
    if pctx.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let dev = d.check_dev(dev)?;
    if flags & !0xff != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let h = new_ctx(d, dev, false, flags)?;
    push(h);
    // SAFETY: out pointer from the caller (checked non-null).
    unsafe { put(pctx, h as CUcontext, CUDA_ERROR_INVALID_VALUE) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate(pctx: *mut CUcontext, flags: u32, dev: CUdevice) -> CUresult {
    guard(|| create(pctx, flags, dev))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v2(
    pctx: *mut CUcontext,
    flags: u32,
    dev: CUdevice,
) -> CUresult {
    guard(|| create(pctx, flags, dev))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v3(
    pctx: *mut CUcontext,
    params: *mut c_void,
    num_params: i32,
    flags: u32,
    dev: CUdevice,
) -> CUresult {
    guard(|| {
        if num_params < 0 || (num_params > 0 && params.is_null()) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        create(pctx, flags, dev)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v4(
    pctx: *mut CUcontext,
    params: *mut CUctxCreateParams,
    flags: u32,
    dev: CUdevice,
) -> CUresult {
    crate::version_gate!("cuCtxCreate_v4");
    guard(|| {
        if !params.is_null() {
            // SAFETY: non-null pointer to a CUctxCreateParams from the caller.
            let p = unsafe { params.read_unaligned() };
            if p.numExecAffinityParams < 0
                || (p.numExecAffinityParams > 0 && p.execAffinityParams.is_null())
            {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
        }
        create(pctx, flags, dev)
    })
}

fn destroy(ctx: CUcontext) -> CuRes {
    let d = cu()?;
    let h = ctx as usize;
    let c = match d.objs.lock().get(h) {
        Some(Obj::Ctx(c)) => Arc::clone(c),
        _ => return Err(CUDA_ERROR_INVALID_CONTEXT),
    };
    if c.primary || super::green::green_handle_of_ctx(d, h).is_some() {
        // The primary context is released, not destroyed; a green
        // context's with cuGreenCtxDestroy.
        return Err(CUDA_ERROR_INVALID_CONTEXT);
    }
    if c.destroyed.load(Acquire) {
        return Err(CUDA_ERROR_CONTEXT_IS_DESTROYED);
    }
    super::export_tables::cls_context_gone(h);
    destroy_ctx(d, h, &c);
    d.objs.lock().remove(h);
    CTX_STACK.with(|s| s.borrow_mut().retain(|&x| x != h));
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxDestroy(ctx: CUcontext) -> CUresult {
    guard(|| destroy(ctx))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxDestroy_v2(ctx: CUcontext) -> CUresult {
    guard(|| destroy(ctx))
}

fn push_current(ctx: CUcontext) -> CuRes {
    let d = cu()?;
    d.ctx(ctx as usize)?;
    push(ctx as usize);
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxPushCurrent(ctx: CUcontext) -> CUresult {
    guard(|| push_current(ctx))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxPushCurrent_v2(ctx: CUcontext) -> CUresult {
    guard(|| push_current(ctx))
}

fn pop_current(pctx: *mut CUcontext) -> CuRes {
    cu()?;
    let h = CTX_STACK
        .with(|s| s.borrow_mut().pop())
        .ok_or(CUDA_ERROR_INVALID_CONTEXT)?;
    if !pctx.is_null() {
        // SAFETY: non-null out pointer from the caller.
        unsafe { put(pctx, h as CUcontext, CUDA_ERROR_INVALID_VALUE)? };
    }
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxPopCurrent(pctx: *mut CUcontext) -> CUresult {
    guard(|| pop_current(pctx))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxPopCurrent_v2(pctx: *mut CUcontext) -> CUresult {
    guard(|| pop_current(pctx))
}

/// Whether `h` is a primary context, active or not.
fn is_primary(d: &Driver, h: usize) -> bool {
    matches!(d.objs.lock().get(h), Some(Obj::Ctx(c)) if c.primary)
}

/// The handle of device `dev`'s primary context, created inactive (not
/// retained, nothing reserved) if it never existed: what the runtime's
/// private table hands out before it retains the context.
pub fn primary_handle(d: &Driver, dev: usize) -> usize {
    let mut p = d.primary[dev].lock();
    if !is_primary(d, p.handle) {
        let c = Ctx {
            dev,
            primary: true,
            flags: AtomicU32::new(p.flags),
            destroyed: AtomicBool::new(true),
            limits: Default::default(),
            usage: AtomicU32::new(1),
            green: Default::default(),
        };
        p.handle = d.objs.lock().insert(Obj::Ctx(Arc::new(c)));
    }
    p.handle
}

/// `cuCtxSetCurrent` accepts a primary context that is not active (yet), as
/// the real driver does: the runtime makes it current, then retains it.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxSetCurrent(ctx: CUcontext) -> CUresult {
    guard(|| {
        let d = cu()?;
        let h = ctx as usize;
        if h != 0 && !is_primary(d, h) {
            d.ctx(h)?;
        }
        CTX_STACK.with(|s| {
            let mut s = s.borrow_mut();
            if h == 0 {
                s.pop();
            } else if let Some(top) = s.last_mut() {
                *top = h;
            } else {
                s.push(h);
            }
        });
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetCurrent(pctx: *mut CUcontext) -> CUresult {
    guard(|| {
        cu()?;
        let h = CTX_STACK.with(|s| s.borrow().last().copied()).unwrap_or(0);
        // SAFETY: out pointer from the caller.
        unsafe { put(pctx, h as CUcontext, CUDA_ERROR_INVALID_VALUE) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetDevice(device: *mut CUdevice) -> CUresult {
    guard(|| {
        let d = cu()?;
        if device.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let (_, c) = d.cur_ctx()?;
        // SAFETY: out pointer from the caller.
        unsafe { put(device, c.dev as CUdevice, CUDA_ERROR_INVALID_VALUE) }
    })
}

/// CUDA 13: the device of `ctx` (NULL = current).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetDevice_v2(device: *mut CUdevice, ctx: CUcontext) -> CUresult {
    crate::version_gate!("cuCtxGetDevice_v2");
    guard(|| {
        let d = cu()?;
        if device.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let c = if ctx.is_null() {
            d.cur_ctx()?.1
        } else {
            d.ctx(ctx as usize)?
        };
        // SAFETY: out pointer from the caller.
        unsafe { put(device, c.dev as CUdevice, CUDA_ERROR_INVALID_VALUE) }
    })
}

fn sync_ctx(c: &Ctx) {
    if let Ok(d) = crate::driver::cu() {
        if let Some(e) = d.exec_if_started(c.dev) {
            e.wait(e.submitted_seq());
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxSynchronize() -> CUresult {
    guard(|| {
        let d = cu()?;
        if crate::exec::in_host_fn() {
            return Err(CUDA_ERROR_NOT_PERMITTED);
        }
        let (h, c) = d.cur_ctx()?;
        if d.invalidate_captures(h) {
            return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        }
        sync_ctx(&c);
        Ok(())
    })
}

/// CUDA 13: synchronise `ctx` (NULL = current).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxSynchronize_v2(ctx: CUcontext) -> CUresult {
    crate::version_gate!("cuCtxSynchronize_v2");
    guard(|| {
        let d = cu()?;
        let (h, c) = if ctx.is_null() {
            d.cur_ctx()?
        } else {
            (ctx as usize, d.ctx(ctx as usize)?)
        };
        if d.invalidate_captures(h) {
            return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        }
        sync_ctx(&c);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetApiVersion(ctx: CUcontext, version: *mut u32) -> CUresult {
    guard(|| {
        let d = cu()?;
        if ctx.is_null() {
            d.cur_ctx()?;
        } else {
            d.ctx(ctx as usize)?;
        }
        // SAFETY: out pointer from the caller.
        unsafe { put(version, 3020, CUDA_ERROR_INVALID_VALUE) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetFlags(flags: *mut u32) -> CUresult {
    guard(|| {
        let d = cu()?;
        let (_, c) = d.cur_ctx()?;
        // SAFETY: out pointer from the caller.
        unsafe { put(flags, c.flags.load(Relaxed), CUDA_ERROR_INVALID_VALUE) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxSetFlags(flags: u32) -> CUresult {
    crate::version_gate!("cuCtxSetFlags");
    guard(|| {
        let d = cu()?;
        let (_, c) = d.cur_ctx()?;
        c.flags.store(flags, Relaxed);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetId(ctx: CUcontext, id: *mut u64) -> CUresult {
    guard(|| {
        let d = cu()?;
        let h = if ctx.is_null() {
            d.cur_ctx()?.0
        } else {
            d.ctx(ctx as usize).map(|_| ctx as usize)?
        };
        // SAFETY: out pointer from the caller.
        unsafe {
            put(
                id,
                (h as u64 - 0x5c00_0000_0000) / 0x40,
                CUDA_ERROR_INVALID_VALUE,
            )
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetCacheConfig(cfg: *mut u32) -> CUresult {
    guard(|| {
        let d = cu()?;
        d.cur_ctx()?;
        // SAFETY: out pointer from the caller.
        unsafe { put(cfg, 0, CUDA_ERROR_INVALID_VALUE) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxSetCacheConfig(_cfg: u32) -> CUresult {
    guard(|| cu()?.cur_ctx().map(|_| ()))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetStreamPriorityRange(
    least: *mut i32,
    greatest: *mut i32,
) -> CUresult {
    guard(|| {
        cu()?.cur_ctx()?;
        if !least.is_null() {
            // SAFETY: non-null out pointer from the caller.
            unsafe { *least = 0 };
        }
        if !greatest.is_null() {
            // SAFETY: non-null out pointer from the caller.
            unsafe { *greatest = -5 };
        }
        Ok(())
    })
}

// ------------------------------------------------------------ primary context

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(pctx: *mut CUcontext, dev: CUdevice) -> CUresult {
    guard(|| {
        let d = cu()?;
        if pctx.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let i = d.check_dev(dev)?;
        let mut p = d.primary[i].lock();
        if p.refs == 0 {
            // The primary context keeps its handle across release/retain.
            let old = match d.objs.lock().get(p.handle) {
                Some(Obj::Ctx(c)) => Some(Arc::clone(c)),
                _ => None,
            };
            match old {
                Some(c) => {
                    d.charge(i, d.cfg.ctx_bytes)?;
                    d.touch_dev(i);
                    d.ctx_alive(i, true);
                    c.flags.store(p.flags, Relaxed);
                    c.destroyed.store(false, Release);
                }
                None => p.handle = new_ctx(d, i, true, p.flags)?,
            }
        }
        p.refs += 1;
        // SAFETY: out pointer from the caller (checked non-null).
        unsafe { put(pctx, p.handle as CUcontext, CUDA_ERROR_INVALID_VALUE) }
    })
}

/// Releases one reference to `dev`'s primary context (destroyed with the last).
pub(crate) fn primary_release(dev: CUdevice) -> CuRes {
    let d = cu()?;
    let i = d.check_dev(dev)?;
    let last = {
        let p = d.primary[i].lock();
        match p.refs {
            0 => return Err(CUDA_ERROR_INVALID_CONTEXT),
            1 => Some(p.handle),
            _ => None,
        }
    };
    if let Some(h) = last {
        // Outside our locks: a destructor may call the driver.
        super::export_tables::cls_context_gone(h);
    }
    let mut p = d.primary[i].lock();
    if p.refs == 0 {
        return Err(CUDA_ERROR_INVALID_CONTEXT);
    }
    p.refs -= 1;
    if p.refs == 0 {
        let h = p.handle;
        if let Ok(c) = d.ctx(h) {
            destroy_ctx(d, h, &c);
        }
    }
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease(dev: CUdevice) -> CUresult {
    guard(|| primary_release(dev))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult {
    guard(|| primary_release(dev))
}

fn primary_reset(dev: CUdevice) -> CuRes {
    let d = cu()?;
    let i = d.check_dev(dev)?;
    let h = d.primary[i].lock().handle;
    if h != 0 {
        // Outside our locks: a destructor may call the driver.
        super::export_tables::cls_context_gone(h);
    }
    let mut p = d.primary[i].lock();
    if p.refs > 0 {
        let h = p.handle;
        if let Ok(c) = d.ctx(h) {
            destroy_ctx(d, h, &c);
        }
        p.refs = 0;
    }
    p.flags = 0;
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset(dev: CUdevice) -> CUresult {
    guard(|| primary_reset(dev))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) -> CUresult {
    guard(|| primary_reset(dev))
}

fn primary_set_flags(dev: CUdevice, flags: u32) -> CuRes {
    let d = cu()?;
    let i = d.check_dev(dev)?;
    if flags & !0xff != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut p = d.primary[i].lock();
    p.flags = flags;
    if let Ok(c) = d.ctx(p.handle) {
        c.flags.store(flags, Relaxed);
    }
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxSetFlags(dev: CUdevice, flags: u32) -> CUresult {
    guard(|| primary_set_flags(dev, flags))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxSetFlags_v2(dev: CUdevice, flags: u32) -> CUresult {
    guard(|| primary_set_flags(dev, flags))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxGetState(
    dev: CUdevice,
    flags: *mut u32,
    active: *mut i32,
) -> CUresult {
    guard(|| {
        let d = cu()?;
        let i = d.check_dev(dev)?;
        if flags.is_null() || active.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let p = d.primary[i].lock();
        // SAFETY: out pointers from the caller (checked non-null).
        unsafe {
            put(flags, p.flags, CUDA_ERROR_INVALID_VALUE)?;
            put(active, (p.refs > 0) as i32, CUDA_ERROR_INVALID_VALUE)
        }
    })
}

fn peer(peer_ctx: CUcontext) -> CuRes {
    let d = cu()?;
    let (_, c) = d.cur_ctx()?;
    let p = d.ctx(peer_ctx as usize)?;
    if p.dev == c.dev {
        return Err(CUDA_ERROR_INVALID_DEVICE);
    }
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxEnablePeerAccess(peer_ctx: CUcontext, flags: u32) -> CUresult {
    guard(|| {
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        peer(peer_ctx)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxDisablePeerAccess(peer_ctx: CUcontext) -> CUresult {
    guard(|| peer(peer_ctx))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxResetPersistingL2Cache() -> CUresult {
    guard(|| cu()?.cur_ctx().map(|_| ()))
}

/// Deprecated `cuCtxAttach`: the current context, its usage count one more.
fn attach(pctx: *mut CUcontext, flags: u32) -> CuRes {
    let d = cu()?;
    if pctx.is_null() || flags != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (h, c) = d.cur_ctx()?;
    c.usage.fetch_add(1, AcqRel);
    // SAFETY: out pointer from the caller (checked non-null).
    unsafe { put(pctx, h as CUcontext, CUDA_ERROR_INVALID_VALUE) }
}

/// Deprecated `cuCtxDetach`: the usage count of `ctx` (current to the
/// thread) one less; a created context is destroyed when it reaches 0.
fn detach(ctx: CUcontext) -> CuRes {
    let d = cu()?;
    let (h, c) = d.cur_ctx()?;
    if h != ctx as usize {
        return Err(CUDA_ERROR_INVALID_CONTEXT);
    }
    let before = c
        .usage
        .fetch_update(AcqRel, Acquire, |u| u.checked_sub(1))
        .map_err(|_| CUDA_ERROR_INVALID_CONTEXT)?;
    if before == 1 && !c.primary && super::green::green_handle_of_ctx(d, h).is_none() {
        return destroy(ctx);
    }
    Ok(())
}

crate::exports! {
    cuCtxAttach(pctx: *mut CUcontext, flags: u32) => attach(pctx, flags);
    cuCtxDetach(ctx: CUcontext) => detach(ctx);
}
