//! Initialisation, versions, error strings (`cuGetExportTable` is in
//! `export_tables`).

use crate::driver::{cu, cuda_init};
use crate::{guard, put};
use cgpu_ffi::*;
use std::ffi::c_char;

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

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuProfilerStart() -> CUresult {
    guard(|| cu().map(|_| ()))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuProfilerStop() -> CUresult {
    guard(|| cu().map(|_| ()))
}

// ------------------------------------------------------------ log callbacks

/// Registered `cuLogsRegisterCallback` callbacks (the sim never logs, so
/// they are kept and never called): handle → (callback, user data).
static LOG_CALLBACKS: parking_lot::Mutex<Vec<(usize, usize, usize)>> =
    parking_lot::Mutex::new(Vec::new());
static NEXT_LOG_HANDLE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLogsRegisterCallback(
    callback: Option<unsafe extern "C" fn(*mut std::ffi::c_void, u32, *const c_char, usize)>,
    user: *mut std::ffi::c_void,
    handle: *mut *mut std::ffi::c_void,
) -> CUresult {
    guard(|| {
        let f = callback.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let h = NEXT_LOG_HANDLE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        LOG_CALLBACKS.lock().push((h, f as usize, user as usize));
        if !handle.is_null() {
            // SAFETY: non-null out pointer from the caller.
            unsafe { *handle = h as *mut std::ffi::c_void };
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLogsUnregisterCallback(handle: *mut std::ffi::c_void) -> CUresult {
    guard(|| {
        let mut cbs = LOG_CALLBACKS.lock();
        let n = cbs.len();
        cbs.retain(|c| c.0 != handle as usize);
        if cbs.len() == n {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        Ok(())
    })
}
