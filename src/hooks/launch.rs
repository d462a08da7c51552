//! Kernel launches: every launch path, whichever way it was reached (export,
//! `dlsym`, `cuGetProcAddress`, `_ptsz` variants), goes through one
//! admission point of the scheduler before the real launch.
//!
//! Hot path: no allocation, no lock here; `RealFn::get` is one atomic load.

use std::ffi::c_void;

use super::sig;
use super::types::*;
use crate::driver::RealFn;

type Ptr = *mut c_void;

/// SCHEDULER ADMISSION POINT: every launch hook calls this before the real
/// launch, with the stream the work goes to. It may hold the calling thread
/// back (see `crate::scheduler`); it never allocates or locks when the container is within
/// its share.
#[inline(always)]
fn admit(stream: CUstream) {
    crate::scheduler::admit_launch(stream);
}

/// SCHEDULER COMPLETION POINT: after the real launch returned `rc`.
#[inline(always)]
fn launched(stream: CUstream, rc: CUresult) -> CUresult {
    crate::scheduler::launched(stream, rc);
    rc
}

/// `cuLaunchKernel` and `_ptsz`.
///
/// # Safety
/// The driver's contract for `cuLaunchKernel`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn launch_kernel(
    real: &RealFn<sig::cuLaunchKernel>,
    f: CUfunction,
    gx: u32,
    gy: u32,
    gz: u32,
    bx: u32,
    by: u32,
    bz: u32,
    shmem: u32,
    stream: CUstream,
    params: *mut Ptr,
    extra: *mut Ptr,
) -> CUresult {
    admit(stream);
    launched(
        stream,
        super::call_real!(real, f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra),
    )
}

/// `cuLaunchKernelEx` and `_ptsz`.
///
/// # Safety
/// The driver's contract for `cuLaunchKernelEx`.
pub unsafe fn launch_kernel_ex(
    real: &RealFn<sig::cuLaunchKernelEx>,
    config: *const CUlaunchConfig,
    f: CUfunction,
    params: *mut Ptr,
    extra: *mut Ptr,
) -> CUresult {
    let stream = if config.is_null() {
        std::ptr::null_mut()
    } else {
        // SAFETY: config is the caller's non-null CUlaunchConfig.
        unsafe { (*config).hStream }
    };
    admit(stream);
    launched(stream, super::call_real!(real, config, f, params, extra))
}

/// `cuLaunchCooperativeKernel` and `_ptsz`.
///
/// # Safety
/// The driver's contract for `cuLaunchCooperativeKernel`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn launch_cooperative(
    real: &RealFn<sig::cuLaunchCooperativeKernel>,
    f: CUfunction,
    gx: u32,
    gy: u32,
    gz: u32,
    bx: u32,
    by: u32,
    bz: u32,
    shmem: u32,
    stream: CUstream,
    params: *mut Ptr,
) -> CUresult {
    admit(stream);
    launched(
        stream,
        super::call_real!(real, f, gx, gy, gz, bx, by, bz, shmem, stream, params),
    )
}

/// `cuLaunchCooperativeKernelMultiDevice` (deprecated): admits each stream.
/// The caller's `n` is believed only up to the number of devices (each entry
/// is a distinct device): beyond that, or with no list, the driver answers
/// alone (it refuses the launch), and no entry past the real list is read.
///
/// # Safety
/// The driver's contract: `list` holds `n` launch descriptions.
pub unsafe fn launch_cooperative_multi(
    real: &RealFn<sig::cuLaunchCooperativeKernelMultiDevice>,
    list: *mut CUDA_LAUNCH_PARAMS,
    n: u32,
    flags: u32,
) -> CUresult {
    let mut devices: i32 = 0;
    let counted = match super::real::cuDeviceGetCount.get() {
        // SAFETY: the real driver function with a valid out-pointer.
        Some(f) => (unsafe { f(&mut devices) }) == CUDA_SUCCESS,
        None => false,
    };
    if list.is_null() || n == 0 || !counted || n > devices.max(0) as u32 {
        return super::call_real!(real, list, n, flags);
    }
    for i in 0..n as usize {
        // SAFETY: the caller passes n valid entries (n ≤ the device count).
        admit(unsafe { (*list.add(i)).hStream });
    }
    let rc = super::call_real!(real, list, n, flags);
    for i in 0..n as usize {
        // SAFETY: as above.
        launched(unsafe { (*list.add(i)).hStream }, rc);
    }
    rc
}

/// `cuGraphLaunch` and `_ptsz`.
///
/// # Safety
/// The driver's contract for `cuGraphLaunch`.
pub unsafe fn graph_launch(
    real: &RealFn<sig::cuGraphLaunch>,
    exec: CUgraphExec,
    stream: CUstream,
) -> CUresult {
    admit(stream);
    launched(stream, super::call_real!(real, exec, stream))
}
