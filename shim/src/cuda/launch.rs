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

/// `cuLaunchCooperativeKernelMultiDevice` (deprecated): one launch per
/// entry, each on its own device's stream. The count is checked against the
/// devices there are before any entry is read.
fn launch_multi_device(list: *const CUDA_LAUNCH_PARAMS, n: u32, flags: u32) -> CuRes {
    let d = cu()?;
    if list.is_null() || n == 0 || n as usize > d.devs.len() || flags > 3 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: `list` holds `n` entries by the caller's contract (n is at most
    // the number of devices).
    let entries: Vec<CUDA_LAUNCH_PARAMS> = (0..n as usize)
        .map(|i| unsafe { list.add(i).read_unaligned() })
        .collect();
    let mut devs = std::collections::HashSet::new();
    for e in &entries {
        let (dev, s) = d.stream(e.hStream as usize)?;
        // Explicit streams on distinct devices only.
        if s.is_none() || !devs.insert(dev) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
    }
    for e in entries {
        let dm = Dims {
            grid: [e.gridDimX, e.gridDimY, e.gridDimZ],
            block: [e.blockDimX, e.blockDimY, e.blockDimZ],
        };
        launch(
            e.function,
            dm,
            e.sharedMemBytes,
            e.hStream,
            e.kernelParams,
            std::ptr::null_mut(),
        )?;
    }
    Ok(())
}

// ------------------------------------------------------ the pre-4.0 launch API

/// What `cuFuncSetBlockShape`, `cuFuncSetSharedSize` and `cuParamSet*` set
/// for a function, used by `cuLaunch`/`cuLaunchGrid(Async)`.
#[derive(Default)]
struct LegacyLaunch {
    block: [u32; 3],
    shmem: u32,
    params: Vec<u8>,
}

fn legacy() -> &'static parking_lot::Mutex<std::collections::HashMap<usize, LegacyLaunch>> {
    static L: std::sync::OnceLock<
        parking_lot::Mutex<std::collections::HashMap<usize, LegacyLaunch>>,
    > = std::sync::OnceLock::new();
    L.get_or_init(|| parking_lot::Mutex::new(std::collections::HashMap::new()))
}

/// Parameter buffers are at most 4 KiB (the driver's limit).
const LEGACY_PARAM_MAX: usize = 4096;

fn legacy_set(f: CUfunction, set: impl FnOnce(&mut LegacyLaunch) -> CuRes) -> CuRes {
    cu()?.func(f as usize)?;
    let mut l = legacy().lock();
    set(l.entry(f as usize).or_default())
}

fn legacy_param(f: CUfunction, off: u32, bytes: &[u8]) -> CuRes {
    legacy_set(f, |l| {
        let end = off as usize + bytes.len();
        if end > LEGACY_PARAM_MAX {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if l.params.len() < end {
            l.params.resize(end, 0);
        }
        l.params[off as usize..end].copy_from_slice(bytes);
        Ok(())
    })
}

fn legacy_launch(f: CUfunction, w: i32, h: i32, stream: CUstream) -> CuRes {
    cu()?.func(f as usize)?;
    if w <= 0 || h <= 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (block, shmem, mut params) = {
        let l = legacy().lock();
        let x = l.get(&(f as usize)).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        (x.block, x.shmem, x.params.clone())
    };
    if block.contains(&0) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut size = params.len();
    let mut extra = [
        CU_LAUNCH_PARAM_BUFFER_POINTER as *mut c_void,
        params.as_mut_ptr() as *mut c_void,
        CU_LAUNCH_PARAM_BUFFER_SIZE as *mut c_void,
        &mut size as *mut usize as *mut c_void,
        CU_LAUNCH_PARAM_END as *mut c_void,
    ];
    let dm = Dims {
        grid: [w as u32, h as u32, 1],
        block,
    };
    launch(
        f,
        dm,
        shmem,
        stream,
        std::ptr::null_mut(),
        extra.as_mut_ptr(),
    )
}

exports! {
    cuLaunchCooperativeKernelMultiDevice(list: *const CUDA_LAUNCH_PARAMS, n: u32, flags: u32)
        => launch_multi_device(list, n, flags);
    cuFuncSetBlockShape(f: CUfunction, x: i32, y: i32, z: i32) => legacy_set(f, |l| {
        if x <= 0 || y <= 0 || z <= 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        l.block = [x as u32, y as u32, z as u32];
        Ok(())
    });
    cuFuncSetSharedSize(f: CUfunction, bytes: u32) => legacy_set(f, |l| {
        l.shmem = bytes;
        Ok(())
    });
    cuParamSetSize(f: CUfunction, n: u32) => legacy_set(f, |l| {
        if n as usize > LEGACY_PARAM_MAX {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        l.params.resize(n as usize, 0);
        Ok(())
    });
    cuParamSeti(f: CUfunction, off: i32, v: u32) => legacy_param(f, off.max(0) as u32, &v.to_ne_bytes());
    cuParamSetf(f: CUfunction, off: i32, v: f32) => legacy_param(f, off.max(0) as u32, &v.to_ne_bytes());
    cuParamSetv(f: CUfunction, off: i32, p: *const c_void, n: u32) => {
        if p.is_null() || n as usize > LEGACY_PARAM_MAX {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: p holds n bytes by the caller's contract (n is bounded).
        let bytes = unsafe { std::slice::from_raw_parts(p as *const u8, n as usize) }.to_vec();
        legacy_param(f, off.max(0) as u32, &bytes)
    };
    cuLaunch(f: CUfunction) => legacy_launch(f, 1, 1, std::ptr::null_mut());
    cuLaunchGrid(f: CUfunction, w: i32, h: i32) => legacy_launch(f, w, h, std::ptr::null_mut());
    cuLaunchGridAsync(f: CUfunction, w: i32, h: i32, stream: CUstream) => legacy_launch(f, w, h, stream);
}
