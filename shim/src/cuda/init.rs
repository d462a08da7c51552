//! Initialisation, versions, error strings, `cuGetExportTable`.

use crate::driver::{cu, cuda_init};
use crate::{guard, put};
use cgpu_ffi::*;
use std::ffi::{c_char, c_void};

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuInit(flags: u32) -> CUresult {
    guard(|| {
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        cuda_init().map(|_| ())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDriverGetVersion(version: *mut i32) -> CUresult {
    guard(|| {
        let v = crate::driver::driver_version();
        // SAFETY: out pointer from the caller.
        unsafe { put(version, v, CUDA_ERROR_INVALID_VALUE) }
    })
}

fn lookup(e: CUresult) -> Option<&'static (CUresult, &'static str, &'static str)> {
    CU_RESULTS.iter().find(|r| r.0 == e)
}

// NUL-terminated copies of the names/descriptions, built once.
fn cstrings() -> &'static Vec<(CUresult, std::ffi::CString, std::ffi::CString)> {
    static S: std::sync::OnceLock<Vec<(CUresult, std::ffi::CString, std::ffi::CString)>> =
        std::sync::OnceLock::new();
    S.get_or_init(|| {
        CU_RESULTS
            .iter()
            .map(|(v, n, d)| {
                (
                    *v,
                    std::ffi::CString::new(*n).unwrap_or_default(),
                    std::ffi::CString::new(*d).unwrap_or_default(),
                )
            })
            .collect()
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorName(error: CUresult, pstr: *mut *const c_char) -> CUresult {
    guard(|| {
        let r = lookup(error).map(|_| ());
        let s = cstrings()
            .iter()
            .find(|c| c.0 == error)
            .map(|c| c.1.as_ptr());
        match (r, s) {
            (Some(()), Some(p)) => {
                // SAFETY: out pointer from the caller.
                unsafe { put(pstr, p, CUDA_ERROR_INVALID_VALUE) }
            }
            _ => {
                if !pstr.is_null() {
                    // SAFETY: non-null out pointer from the caller.
                    unsafe { *pstr = std::ptr::null() };
                }
                Err(CUDA_ERROR_INVALID_VALUE)
            }
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorString(error: CUresult, pstr: *mut *const c_char) -> CUresult {
    guard(|| {
        match cstrings()
            .iter()
            .find(|c| c.0 == error)
            .map(|c| c.2.as_ptr())
        {
            // SAFETY: out pointer from the caller.
            Some(p) => unsafe { put(pstr, p, CUDA_ERROR_INVALID_VALUE) },
            None => {
                if !pstr.is_null() {
                    // SAFETY: non-null out pointer from the caller.
                    unsafe { *pstr = std::ptr::null() };
                }
                Err(CUDA_ERROR_INVALID_VALUE)
            }
        }
    })
}

/// Private tables of NVIDIA's runtime: not provided by the simulation.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetExportTable(
    table: *mut *const c_void,
    _id: *const c_void,
) -> CUresult {
    guard(|| {
        if !table.is_null() {
            // SAFETY: non-null out pointer from the caller.
            unsafe { *table = std::ptr::null() };
        }
        Err(CUDA_ERROR_NOT_SUPPORTED)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuProfilerStart() -> CUresult {
    guard(|| cu().map(|_| ()))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuProfilerStop() -> CUresult {
    guard(|| cu().map(|_| ()))
}
