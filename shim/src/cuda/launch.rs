//! Kernel launches: asynchronous, queued on the device's executor.

use crate::driver::{cu, Driver, Func, KernelNode, Timing};
use crate::{exports, CuRes};
use cgpu_ffi::*;
use std::ffi::c_void;
use std::sync::atomic::Ordering::*;

/// Device time of one launch of `f`.
///
/// # Safety
/// `params`/`extra` follow `cuLaunchKernel`'s contract.
pub unsafe fn kernel_ns(
    d: &Driver,
    f: &Func,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> Result<u64, CUresult> {
    match f.timing {
        Timing::Fixed => Ok(d.cfg.kernel_ns),
        Timing::Spin => {
            if !params.is_null() {
                // SAFETY: kernelParams[0] points to the first parameter (a u64).
                let p0 = unsafe { *params };
                if p0.is_null() {
                    return Err(CUDA_ERROR_INVALID_VALUE);
                }
                // SAFETY: as above.
                return Ok(unsafe { (p0 as *const u64).read_unaligned() });
            }
            if !extra.is_null() {
                let (mut buf, mut size) = (std::ptr::null::<u8>(), 0usize);
                let mut i = 0;
                loop {
                    // SAFETY: extra is a CU_LAUNCH_PARAM_END-terminated list of pairs.
                    let k = unsafe { *extra.add(i) } as usize;
                    if k == CU_LAUNCH_PARAM_END || i > 64 {
                        break;
                    }
                    // SAFETY: each key is followed by its value.
                    let v = unsafe { *extra.add(i + 1) };
                    match k {
                        CU_LAUNCH_PARAM_BUFFER_POINTER => buf = v as *const u8,
                        // SAFETY: the value of BUFFER_SIZE points to a size_t.
                        CU_LAUNCH_PARAM_BUFFER_SIZE if !v.is_null() => {
                            size = unsafe { *(v as *const usize) }
                        }
                        _ => {}
                    }
                    i += 2;
                }
                if !buf.is_null() && size >= 8 {
                    // SAFETY: the argument buffer holds at least 8 bytes.
                    return Ok(unsafe { (buf as *const u64).read_unaligned() });
                }
            }
            Err(CUDA_ERROR_INVALID_VALUE)
        }
    }
}

pub struct Dims {
    pub grid: [u32; 3],
    pub block: [u32; 3],
}

fn check_dims(dm: &Dims) -> CuRes {
    if dm.grid.contains(&0) || dm.block.contains(&0) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if dm.grid[1] > 65535 || dm.grid[2] > 65535 || dm.grid[0] > i32::MAX as u32 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let threads = dm.block[0] as u64 * dm.block[1] as u64 * dm.block[2] as u64;
    if threads > 1024 || dm.block[2] > 64 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(())
}

/// Queues `ns` of device time on `stream`.
pub fn submit(d: &Driver, stream: usize, ns: u64) -> CuRes {
    let (dev, s) = d.stream(stream)?;
    let seq = d.exec(dev).launch(ns);
    if let Some(s) = s {
        s.last_seq.fetch_max(seq, AcqRel);
    }
    Ok(())
}

fn launch(
    f: CUfunction,
    dm: Dims,
    shmem: u32,
    stream: CUstream,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CuRes {
    let d = cu()?;
    d.cur_ctx()?;
    let func = d.func(f as usize)?;
    check_dims(&dm)?;
    if shmem > 227 * 1024 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: params/extra per cuLaunchKernel's contract.
    let ns = unsafe { kernel_ns(d, &func, params, extra) }?;
    // Into a capturing stream, a launch is recorded, not run.
    if super::stream::record_if_capturing(stream as usize, &KernelNode { func, ns })? {
        return Ok(());
    }
    submit(d, stream as usize, ns)
}

exports! {
    cuLaunchKernel | cuLaunchKernel_ptsz(
        f: CUfunction, gx: u32, gy: u32, gz: u32, bx: u32, by: u32, bz: u32,
        shmem: u32, stream: CUstream, params: *mut *mut c_void, extra: *mut *mut c_void,
    ) => launch(f, Dims { grid: [gx, gy, gz], block: [bx, by, bz] }, shmem, stream, params, extra);
    cuLaunchCooperativeKernel | cuLaunchCooperativeKernel_ptsz(
        f: CUfunction, gx: u32, gy: u32, gz: u32, bx: u32, by: u32, bz: u32,
        shmem: u32, stream: CUstream, params: *mut *mut c_void,
    ) => launch(f, Dims { grid: [gx, gy, gz], block: [bx, by, bz] }, shmem, stream, params, std::ptr::null_mut());
}

fn launch_ex(
    cfg: *const CUlaunchConfig,
    f: CUfunction,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CuRes {
    if cfg.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null config from the caller.
    let c = unsafe { cfg.read_unaligned() };
    if c.numAttrs > 0 && c.attrs.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let dm = Dims {
        grid: [c.gridDimX, c.gridDimY, c.gridDimZ],
        block: [c.blockDimX, c.blockDimY, c.blockDimZ],
    };
    launch(f, dm, c.sharedMemBytes, c.hStream, params, extra)
}

exports! {
    cuLaunchKernelEx | cuLaunchKernelEx_ptsz(cfg: *const CUlaunchConfig, f: CUfunction, params: *mut *mut c_void, extra: *mut *mut c_void) => launch_ex(cfg, f, params, extra);
}
