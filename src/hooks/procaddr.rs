//! `cuGetProcAddress` and `cuGetProcAddress_v2`: how the CUDA runtime,
//! PyTorch and cuda-python reach every driver function.
//!
//! We call the real one with the caller's own arguments (symbol, version,
//! flags, status), so the driver decides the variant (`cuCtxCreate`@12050 →
//! `_v4`, per-thread flag → `_ptsz`, …). If the pointer it returns is the real
//! address of a function we hook, we hand back our hook for exactly that
//! variant; otherwise the driver's own pointer, untouched (so
//! `cuGetExportTable` and every pass-through function cost nothing). Looking
//! up `cuGetProcAddress` itself returns our own.

use std::ffi::{c_char, c_void};

use super::sig;
use super::types::*;
use crate::driver::RealFn;

fn substitute(pfn: *mut *mut c_void, symbol: *const c_char) {
    if pfn.is_null() {
        return;
    }
    // SAFETY: pfn is the caller's out-pointer, non-null, just written by the driver.
    let p = unsafe { *pfn };
    if let Some((ours, variant)) = super::hook_by_real(p as usize) {
        if tracing::enabled!(tracing::Level::TRACE) && !symbol.is_null() {
            // SAFETY: symbol is the caller's NUL-terminated name.
            let s = unsafe { std::ffi::CStr::from_ptr(symbol) };
            tracing::trace!("cgpu: cuGetProcAddress({s:?}) -> hook {variant}");
        }
        // SAFETY: as above.
        unsafe { *pfn = ours };
    }
}

/// `cuGetProcAddress` (CUDA 11.3 ABI, 4 arguments).
///
/// # Safety
/// The driver's contract for `cuGetProcAddress`.
pub unsafe fn get_proc_address(
    real: &RealFn<sig::cuGetProcAddress>,
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: i32,
    flags: u64,
) -> CUresult {
    let rc = super::call_real!(real, symbol, pfn, version, flags);
    if rc == CUDA_SUCCESS {
        substitute(pfn, symbol);
    }
    rc
}

/// `cuGetProcAddress_v2` (CUDA 12 ABI, with the status out-parameter).
///
/// # Safety
/// The driver's contract for `cuGetProcAddress_v2`.
pub unsafe fn get_proc_address_v2(
    real: &RealFn<sig::cuGetProcAddress_v2>,
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: i32,
    flags: u64,
    status: *mut CUdriverProcAddressQueryResult,
) -> CUresult {
    let rc = super::call_real!(real, symbol, pfn, version, flags, status);
    if rc == CUDA_SUCCESS {
        substitute(pfn, symbol);
    }
    rc
}
