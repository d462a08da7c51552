//! Occupancy, from the device's attributes (`device.rs`) and the function's
//! (`cuFuncGetAttribute`): blocks per SM are the least of the block limit,
//! the threads per SM over the block's warps, the shared memory per SM over
//! the block's (static + dynamic + the 1 KiB the driver reserves per block
//! on compute capability 8.0 and later), and the registers per SM over the
//! block's (32 per thread unless the function says otherwise). Dynamic
//! shared memory above the function's limit gives 0 blocks, as the driver.

use crate::driver::{cu, DevInfo, Driver, Func};
use crate::{exports, put, CuRes};
use cgpu_ffi::*;
use std::sync::Arc;

struct Limits {
    threads_sm: i64,
    blocks_sm: i64,
    smem_sm: i64,
    regs_sm: i64,
    reserved: i64,
    sms: i64,
    max_cluster: i64,
}

fn dev_attr(dev: &DevInfo, index: usize, a: CUdevice_attribute) -> i64 {
    super::device::attribute(dev, index, a).unwrap_or(0) as i64
}

fn limits(d: &Driver, dev: usize) -> Limits {
    let i = &d.devs[dev];
    Limits {
        threads_sm: dev_attr(i, dev, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR),
        blocks_sm: dev_attr(i, dev, CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR),
        smem_sm: dev_attr(
            i,
            dev,
            CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
        ),
        regs_sm: dev_attr(i, dev, CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR),
        reserved: if i.cc.0 >= 8 { 1024 } else { 0 },
        sms: i.sms as i64,
        // Thread block clusters: compute capability 9.0 and later, up to 8.
        max_cluster: if i.cc.0 >= 9 { 8 } else { 0 },
    }
}

struct FuncLimits {
    max_threads: i64,
    static_smem: i64,
    max_dyn_smem: i64,
    regs: i64,
}

fn func_limits(f: &Func) -> FuncLimits {
    let a = f.attrs.lock();
    let get = |k: i32, dflt: i64| a.get(&k).map(|v| *v as i64).unwrap_or(dflt);
    let static_smem = get(1, 0);
    FuncLimits {
        max_threads: get(0, 1024),
        static_smem,
        // Without cuFuncSetAttribute the limit is 48 KiB in all.
        max_dyn_smem: a
            .get(&8)
            .map(|v| *v as i64)
            .filter(|v| *v > 0)
            .unwrap_or(49152 - static_smem),
        regs: get(4, 32),
    }
}

/// The function and the current context's device.
fn target(f: CUfunction) -> Result<(&'static Driver, Arc<Func>, usize), CUresult> {
    let d = cu()?;
    let func = d.func(f as usize)?;
    let (_, c) = d.cur_ctx()?;
    Ok((d, func, c.dev))
}

fn blocks_per_sm(l: &Limits, fl: &FuncLimits, block: i64, dyn_smem: i64) -> i64 {
    if block <= 0 || block > fl.max_threads || dyn_smem > fl.max_dyn_smem {
        return 0;
    }
    let warps = (block + 31) / 32;
    let by_threads = l.threads_sm / (warps * 32);
    let smem = fl.static_smem + dyn_smem + l.reserved;
    let by_smem = if smem > 0 { l.smem_sm / smem } else { i64::MAX };
    let regs = fl.regs * warps * 32;
    let by_regs = if regs > 0 { l.regs_sm / regs } else { i64::MAX };
    l.blocks_sm.min(by_threads).min(by_smem).min(by_regs).max(0)
}

fn max_active_blocks(
    nb: *mut i32,
    f: CUfunction,
    block: i32,
    dyn_smem: usize,
    flags: u32,
) -> CuRes {
    let (d, func, dev) = target(f)?;
    // CU_OCCUPANCY_DEFAULT 0, CU_OCCUPANCY_DISABLE_CACHING_OVERRIDE 1
    if nb.is_null() || block <= 0 || flags > 1 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let n = blocks_per_sm(
        &limits(d, dev),
        &func_limits(&func),
        block as i64,
        dyn_smem as i64,
    );
    // SAFETY: out pointer from the caller (checked non-null).
    unsafe { put(nb, n as i32, CUDA_ERROR_INVALID_VALUE) }
}

/// `size_t (*)(int blockSize)`: dynamic shared memory for a block size.
pub type SmemFn = Option<unsafe extern "C" fn(i32) -> usize>;

/// The block size with the highest occupancy (the largest of equals), and
/// the grid that fills the device at it.
fn max_potential_block(
    min_grid: *mut i32,
    block_out: *mut i32,
    f: CUfunction,
    smem_fn: SmemFn,
    dyn_smem: usize,
    limit: i32,
) -> CuRes {
    let (d, func, dev) = target(f)?;
    if min_grid.is_null() || block_out.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let l = limits(d, dev);
    let fl = func_limits(&func);
    let mut top = fl.max_threads.min(1024);
    if limit > 0 {
        top = top.min(limit as i64);
    }
    let (mut best, mut best_bs, mut best_blocks) = (0i64, 0i64, 0i64);
    let mut bs = (top / 32) * 32;
    if bs == 0 {
        bs = top;
    }
    while bs > 0 {
        let smem = match smem_fn {
            // SAFETY: the caller's callback, with a block size.
            Some(cb) => (unsafe { cb(bs as i32) }) as i64,
            None => dyn_smem as i64,
        };
        let blocks = blocks_per_sm(&l, &fl, bs, smem);
        let occ = blocks * bs;
        if occ > best {
            (best, best_bs, best_blocks) = (occ, bs, blocks);
        }
        bs -= 32;
    }
    // SAFETY: out pointers from the caller (checked non-null).
    unsafe {
        put(
            min_grid,
            (best_blocks * l.sms) as i32,
            CUDA_ERROR_INVALID_VALUE,
        )?;
        put(block_out, best_bs as i32, CUDA_ERROR_INVALID_VALUE)
    }
}

fn available_dyn_smem(out: *mut usize, f: CUfunction, blocks: i32, block: i32) -> CuRes {
    let (d, func, dev) = target(f)?;
    if out.is_null() || blocks <= 0 || block <= 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let l = limits(d, dev);
    let fl = func_limits(&func);
    // Can `blocks` blocks fit at all (threads, registers, block limit)?
    if blocks_per_sm(&l, &fl, block as i64, 0) < blocks as i64 {
        // SAFETY: out pointer from the caller (checked non-null).
        return unsafe { put(out, 0, CUDA_ERROR_INVALID_VALUE) };
    }
    let per_block = l.smem_sm / blocks as i64 - l.reserved - fl.static_smem;
    let v = per_block.clamp(0, fl.max_dyn_smem.max(0));
    // SAFETY: out pointer from the caller (checked non-null).
    unsafe { put(out, v as usize, CUDA_ERROR_INVALID_VALUE) }
}

fn cluster_dims(cfg: *const CUlaunchConfig) -> Result<(CUlaunchConfig, i64), CUresult> {
    if cfg.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null config from the caller.
    let c = unsafe { cfg.read_unaligned() };
    let mut size = 1i64;
    for i in 0..c.numAttrs as usize {
        // SAFETY: attrs holds numAttrs entries by the caller's contract.
        let a = unsafe { c.attrs.add(i).read_unaligned() };
        // CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4: three u32 in the value.
        if a.id == 4 {
            let v = a.value;
            let dims = [
                u32::from_ne_bytes([v[0], v[1], v[2], v[3]]),
                u32::from_ne_bytes([v[4], v[5], v[6], v[7]]),
                u32::from_ne_bytes([v[8], v[9], v[10], v[11]]),
            ];
            size = dims.iter().map(|x| (*x).max(1) as i64).product();
        }
    }
    Ok((c, size))
}

fn max_cluster_size(out: *mut i32, f: CUfunction, cfg: *const CUlaunchConfig) -> CuRes {
    let (d, _, dev) = target(f)?;
    cluster_dims(cfg)?;
    let l = limits(d, dev);
    if l.max_cluster == 0 {
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    // SAFETY: out pointer from the caller.
    unsafe { put(out, l.max_cluster as i32, CUDA_ERROR_INVALID_VALUE) }
}

fn max_active_clusters(out: *mut i32, f: CUfunction, cfg: *const CUlaunchConfig) -> CuRes {
    let (d, func, dev) = target(f)?;
    let (c, size) = cluster_dims(cfg)?;
    let l = limits(d, dev);
    if l.max_cluster == 0 {
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    if size > l.max_cluster {
        return Err(CUDA_ERROR_INVALID_CLUSTER_SIZE);
    }
    let block = c.blockDimX as i64 * c.blockDimY as i64 * c.blockDimZ as i64;
    let per_sm = blocks_per_sm(&l, &func_limits(&func), block, c.sharedMemBytes as i64);
    let n = per_sm * l.sms / size;
    // SAFETY: out pointer from the caller.
    unsafe { put(out, n as i32, CUDA_ERROR_INVALID_VALUE) }
}

exports! {
    cuOccupancyMaxActiveBlocksPerMultiprocessor(nb: *mut i32, f: CUfunction, block: i32, dyn_smem: usize)
        => max_active_blocks(nb, f, block, dyn_smem, 0);
    cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(nb: *mut i32, f: CUfunction, block: i32, dyn_smem: usize, flags: u32)
        => max_active_blocks(nb, f, block, dyn_smem, flags);
    cuOccupancyMaxPotentialBlockSize(min_grid: *mut i32, block: *mut i32, f: CUfunction, smem_fn: SmemFn, dyn_smem: usize, limit: i32)
        => max_potential_block(min_grid, block, f, smem_fn, dyn_smem, limit);
    cuOccupancyMaxPotentialBlockSizeWithFlags(min_grid: *mut i32, block: *mut i32, f: CUfunction, smem_fn: SmemFn, dyn_smem: usize, limit: i32, flags: u32) => {
        if flags > 1 { return Err(CUDA_ERROR_INVALID_VALUE) }
        max_potential_block(min_grid, block, f, smem_fn, dyn_smem, limit)
    };
    cuOccupancyAvailableDynamicSMemPerBlock(out: *mut usize, f: CUfunction, blocks: i32, block: i32)
        => available_dyn_smem(out, f, blocks, block);
    cuOccupancyMaxPotentialClusterSize(out: *mut i32, f: CUfunction, cfg: *const CUlaunchConfig)
        => max_cluster_size(out, f, cfg);
    cuOccupancyMaxActiveClusters(out: *mut i32, f: CUfunction, cfg: *const CUlaunchConfig)
        => max_active_clusters(out, f, cfg);
}
