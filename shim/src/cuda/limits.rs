//! Context limits (`cuCtxSetLimit`/`cuCtxGetLimit`) and the device memory
//! three of them reserve, as the real driver reserves it:
//!
//! - `CU_LIMIT_STACK_SIZE`: the per-thread stack, for every thread the device
//!   can hold resident: `value × MAX_THREADS_PER_MULTIPROCESSOR × SM count`;
//! - `CU_LIMIT_MALLOC_HEAP_SIZE`: the device `malloc` heap, `value` bytes;
//! - `CU_LIMIT_PRINTF_FIFO_SIZE`: the `printf` buffer, `value` bytes.
//!
//! The defaults (1 KiB of stack, 8 MiB of heap, 1 MiB of FIFO) are part of
//! what every context reserves anyway (`CGPU_SIM_CTX_MIB`); a context holds
//! on top of it, for each of the three, what its value reserves beyond what
//! the default does (never less than nothing). Raising a limit charges the
//! difference or fails with `CUDA_ERROR_OUT_OF_MEMORY` (the limit keeps its
//! value); lowering it gives the difference back; the context's destruction
//! gives everything back and the limits return to their defaults.

use super::device::CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE;
use crate::driver::{cu, Ctx, Driver};
use crate::{guard, put, CuRes};
use cgpu_ffi::*;

pub const CU_LIMIT_STACK_SIZE: u32 = 0;
pub const CU_LIMIT_PRINTF_FIFO_SIZE: u32 = 1;
pub const CU_LIMIT_MALLOC_HEAP_SIZE: u32 = 2;
pub const CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH: u32 = 3;
pub const CU_LIMIT_MAX_L2_FETCH_GRANULARITY: u32 = 5;
pub const CU_LIMIT_PERSISTING_L2_CACHE_SIZE: u32 = 6;
pub const CU_LIMIT_SHMEM_SIZE: u32 = 7;
pub const CU_LIMIT_CIG_ENABLED: u32 = 8;
/// Number of limits (`CU_LIMIT_MAX` of CUDA 13.5: the last is
/// `CU_LIMIT_PER_BLOCK_MEMORY_SIZE`, 10).
const N_LIMITS: usize = 11;

/// Every limit's default: stack 1 KiB, printf FIFO 1 MiB, heap 8 MiB, sync
/// depth 2, 2048 pending launches, 32 B L2 fetches, the rest 0.
const DEFAULTS: [usize; N_LIMITS] = [1024, 1 << 20, 8 << 20, 2, 2048, 32, 0, 0, 0, 0, 0];

/// A context's limits and the bytes they hold on its device beyond the
/// context's own reservation.
pub struct Limits {
    values: [usize; N_LIMITS],
    reserved: u64,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            values: DEFAULTS,
            reserved: 0,
        }
    }
}

/// Threads the device holds resident: what one byte of per-thread stack
/// costs.
fn resident_threads(d: &Driver, dev: usize) -> u64 {
    let a = |attr| super::device::attribute(&d.devs[dev], dev, attr).unwrap_or(0) as u64;
    a(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)
        * a(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
}

/// Bytes reserved beyond the context's own reservation by limits `v`;
/// `None` if it does not even fit in 64 bits.
fn reservation(v: &[usize; N_LIMITS], threads: u64) -> Option<u64> {
    let over =
        |limit: u32| (v[limit as usize] as u64).saturating_sub(DEFAULTS[limit as usize] as u64);
    over(CU_LIMIT_STACK_SIZE)
        .checked_mul(threads)?
        .checked_add(over(CU_LIMIT_PRINTF_FIFO_SIZE))?
        .checked_add(over(CU_LIMIT_MALLOC_HEAP_SIZE))
}

/// Bytes context `c`'s limits hold on its device (beyond `CGPU_SIM_CTX_MIB`).
pub fn reserved(c: &Ctx) -> u64 {
    c.limits.lock().reserved
}

/// The context is going away: its limits' memory returns, they reset.
pub fn release(d: &Driver, c: &Ctx) {
    let mut l = c.limits.lock();
    d.uncharge(c.dev, l.reserved);
    *l = Limits::default();
}

fn set_limit(limit: u32, value: usize) -> CuRes {
    let d = cu()?;
    let (_, c) = d.cur_ctx()?;
    let i = limit as usize;
    if i >= N_LIMITS {
        return Err(CUDA_ERROR_UNSUPPORTED_LIMIT);
    }
    let value = match limit {
        // Only CIG contexts have these, and there they are read-only.
        CU_LIMIT_SHMEM_SIZE | CU_LIMIT_CIG_ENABLED => return Err(CUDA_ERROR_INVALID_VALUE),
        CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH => {
            if d.devs[c.dev].cc.0 >= 9 {
                return Err(CUDA_ERROR_UNSUPPORTED_LIMIT);
            }
            if value > 24 {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            value
        }
        // Hints, clamped to what the device has.
        CU_LIMIT_MAX_L2_FETCH_GRANULARITY => value.min(128),
        CU_LIMIT_PERSISTING_L2_CACHE_SIZE => {
            let max = super::device::attribute(
                &d.devs[c.dev],
                c.dev,
                CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE,
            )
            .unwrap_or(0);
            value.min(max.max(0) as usize)
        }
        _ => value,
    };
    if limit == CU_LIMIT_STACK_SIZE {
        // The new stack takes effect once the device's earlier work is done.
        if let Some(e) = d.exec_if_started(c.dev) {
            e.wait(e.submitted_seq());
        }
    }
    let mut l = c.limits.lock();
    let mut next = l.values;
    next[i] = value;
    let want = reservation(&next, resident_threads(d, c.dev)).ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
    if want > l.reserved {
        d.charge(c.dev, want - l.reserved)?;
    } else {
        d.uncharge(c.dev, l.reserved - want);
    }
    l.values = next;
    l.reserved = want;
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxSetLimit(limit: u32, value: usize) -> CUresult {
    guard(|| set_limit(limit, value))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetLimit(value: *mut usize, limit: u32) -> CUresult {
    guard(|| {
        let d = cu()?;
        let (_, c) = d.cur_ctx()?;
        let v = *c
            .limits
            .lock()
            .values
            .get(limit as usize)
            .ok_or(CUDA_ERROR_UNSUPPORTED_LIMIT)?;
        // SAFETY: out pointer from the caller.
        unsafe { put(value, v, CUDA_ERROR_INVALID_VALUE) }
    })
}
