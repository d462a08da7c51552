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

/// What the driver's `cuGetErrorString` says: a short phrase (the same as
/// the runtime's for the matching error), not the header's description.
/// Codes not listed here answer with the header's description.
pub fn short_string(e: CUresult) -> Option<&'static str> {
    Some(match e {
        0 => "no error",
        1 => "invalid argument",
        2 => "out of memory",
        3 => "initialization error",
        4 => "driver shutting down",
        5 => "profiler disabled for this context",
        6 => "profiler not initialized for this context",
        7 => "profiler already started",
        8 => "profiler already stopped",
        34 => "CUDA driver is a stub library",
        46 => "CUDA-capable device(s) is/are busy or unavailable",
        100 => "no CUDA-capable device is detected",
        101 => "invalid device ordinal",
        200 => "device kernel image is invalid",
        201 => "invalid device context",
        202 => "context already current",
        205 => "mapping of buffer object failed",
        206 => "unmapping of buffer object failed",
        207 => "array is mapped",
        208 => "resource already mapped",
        209 => "no kernel image is available for execution on the device",
        210 => "resource already acquired",
        211 => "resource not mapped",
        212 => "resource not mapped as array",
        213 => "resource not mapped as pointer",
        214 => "uncorrectable ECC error encountered",
        215 => "limit is not supported on this architecture",
        216 => "exclusive-thread device already in use by a different thread",
        217 => "peer access is not supported between these two devices",
        218 => "a PTX JIT compilation failed",
        219 => "invalid OpenGL or DirectX context",
        220 => "uncorrectable NVLink error detected during the execution",
        221 => "PTX JIT compiler library not found",
        222 => "the provided PTX was compiled with an unsupported toolchain.",
        300 => "invalid source",
        301 => "file not found",
        302 => "link to a shared object failed to resolve",
        303 => "shared object initialization failed",
        304 => "OS call failed or operation not supported on this OS",
        400 => "invalid resource handle",
        401 => "the operation cannot be performed in the present state",
        500 => "named symbol not found",
        600 => "device not ready",
        700 => "an illegal memory access was encountered",
        701 => "too many resources requested for launch",
        702 => "the launch timed out and was terminated",
        703 => "launch uses incompatible texturing mode",
        704 => "peer access is already enabled",
        705 => "peer access has not been enabled",
        708 => "cannot set while device is active in this process",
        709 => "context is destroyed",
        710 => "device-side assert triggered",
        711 => "peer mapping resources exhausted",
        712 => "part or all of the requested memory range is already mapped",
        713 => "pointer does not correspond to a registered memory region",
        714 => "hardware stack error",
        715 => "an illegal instruction was encountered",
        716 => "misaligned address",
        717 => "operation not supported on global/shared address space",
        718 => "invalid program counter",
        719 => "unspecified launch failure",
        720 => "too many blocks in cooperative launch",
        800 => "operation not permitted",
        801 => "operation not supported",
        802 => "system not yet initialized",
        803 => "system has unsupported display driver / cuda driver combination",
        900 => "operation not permitted when stream is capturing",
        901 => "operation failed due to a previous error during capture",
        902 => "operation would result in a merge of separate capture sequences",
        903 => "capture was not ended in the same stream as it began",
        904 => "capturing stream has unjoined work",
        905 => "dependency created on uncaptured work in another stream",
        906 => "operation would make the legacy stream depend on a capturing blocking stream",
        907 => "operation not permitted on an event last recorded in a capturing stream",
        908 => "attempt to terminate a thread-local capture sequence from another thread",
        909 => "wait operation timed out",
        910 => "the graph update was not performed because it included changes which violated constraints specific to instantiated graph update",
        999 => "unknown error",
        _ => return None,
    })
}

// NUL-terminated copies of the names and strings, built once.
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
                    std::ffi::CString::new(short_string(*v).unwrap_or(d)).unwrap_or_default(),
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
