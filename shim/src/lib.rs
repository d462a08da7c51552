//! cgpu-sim: a simulated NVIDIA driver. One shared library exports the CUDA
//! driver API and NVML, to be exposed as `libcuda.so.1` and
//! `libnvidia-ml.so.1`; see `shim/README.md`.
//!
//! Modules by API area: `cuda::{init, logs, export_tables, device, multicast,
//! diagnostics, context, limits, green, checkpoint, memory, managed, vmm, ipc,
//! array, stream, module, link, launch, occupancy, graph, tensor_map,
//! unsupported, procaddr}`, `nvml`, `nvml_monitoring`; the machinery
//! underneath: `config` (environment), `state` (the shared mmap'd file),
//! `exec` (device time), `driver` (per-process objects and handles), `image`
//! (what module images define), `integrity` (the runtime's integrity check),
//! `stubs` (counted calls to functions that are only stubs).
//!
//! Every exported function catches panics (`guard`) and returns the driver's
//! own error codes; none dereferences a handle it did not hand out.

#![allow(non_snake_case, clippy::missing_safety_doc)]

pub mod config;
pub mod cuda;
pub mod driver;
pub mod exec;
pub mod image;
pub mod integrity;
pub mod nvml;
pub mod nvml_monitoring;
pub mod stat;
pub mod stat_schema;
pub mod state;
pub mod stubs;

use cgpu_ffi::*;

/// Result type of the API bodies: `Err(code)` becomes the returned `CUresult`.
pub type CuRes = Result<(), CUresult>;

/// Runs an API body, turning a panic into `CUDA_ERROR_UNKNOWN`.
///
/// `#[track_caller]` gives every exported function a body of its own (its
/// call-site location), so LLVM never merges two variants with the same code
/// into one address: like the real driver, every symbol has its own address,
/// which interposers use to tell variants apart.
#[inline]
#[track_caller]
pub fn guard(f: impl FnOnce() -> CuRes) -> CUresult {
    driver::checkpoint_gate();
    guard_ungated(f)
}

/// [`guard`] without waiting for a checkpoint lock (the checkpoint calls
/// themselves).
#[inline]
#[track_caller]
pub fn guard_ungated(f: impl FnOnce() -> CuRes) -> CUresult {
    let at = std::hint::black_box(std::panic::Location::caller());
    let r = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => CUDA_SUCCESS,
        Ok(Err(e)) => e,
        Err(_) => CUDA_ERROR_UNKNOWN,
    };
    if r != CUDA_SUCCESS {
        cuda::logs::failed(r);
        if trace_failures() {
            eprintln!("cgpu-sim: call at {}:{} failed: {r}", at.file(), at.line());
        }
    }
    r
}

/// `CGPU_SIM_TRACE=2`: every CUDA call that fails is logged (the source
/// line of the function and its error code).
fn trace_failures() -> bool {
    use std::sync::atomic::{AtomicU8, Ordering::Relaxed};
    static LEVEL: AtomicU8 = AtomicU8::new(u8::MAX);
    let mut l = LEVEL.load(Relaxed);
    if l == u8::MAX {
        l = std::env::var("CGPU_SIM_TRACE")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        LEVEL.store(l, Relaxed);
    }
    l >= 2
}

/// Runs an NVML body, turning a panic into `NVML_ERROR_UNKNOWN`.
#[inline]
#[track_caller]
pub fn nvml_guard(f: impl FnOnce() -> Result<(), nvmlReturn_t>) -> nvmlReturn_t {
    std::hint::black_box(std::panic::Location::caller());
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => NVML_SUCCESS,
        Ok(Err(e)) => e,
        Err(_) => NVML_ERROR_UNKNOWN,
    }
}

/// Writes `v` through an out pointer supplied by the caller, failing with
/// `err` when it is NULL.
///
/// # Safety
/// `p` is NULL or valid for writing a `T` (the API contract of the caller).
#[inline]
pub unsafe fn put<T, E>(p: *mut T, v: T, err: E) -> Result<(), E> {
    if p.is_null() {
        return Err(err);
    }
    // SAFETY: non-null, and valid for writes by the caller's contract.
    unsafe { p.write_unaligned(v) };
    Ok(())
}

/// Writes a NUL-terminated string into a caller buffer of `len` bytes,
/// truncating.
///
/// # Safety
/// `buf` is NULL or valid for `len` bytes of writes.
pub unsafe fn put_cstr(buf: *mut std::ffi::c_char, len: usize, s: &str) -> bool {
    if buf.is_null() || len == 0 {
        return false;
    }
    let n = s.len().min(len - 1);
    // SAFETY: buf holds len >= n + 1 bytes by the caller's contract.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf as *mut u8, n);
        *buf.add(n) = 0;
    }
    true
}

/// Reads a C string argument (lossy UTF-8), NULL → `None`.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string.
pub unsafe fn read_cstr(p: *const std::ffi::c_char) -> Option<String> {
    if p.is_null() {
        return None;
    }
    // SAFETY: non-null NUL-terminated string by the caller's contract.
    Some(
        unsafe { std::ffi::CStr::from_ptr(p) }
            .to_string_lossy()
            .into_owned(),
    )
}

/// Declares exported driver functions: one declaration per function, its
/// per-thread-default-stream (`_ptsz`/`_ptds`) and other twins listed by
/// name, all with the same parameters and one body (run under [`guard`]):
///
/// ```ignore
/// exports! {
///     cuGraphLaunch | cuGraphLaunch_ptsz (e: CUgraphExec, s: CUstream) => graph_launch(e, s);
/// }
/// ```
///
/// Each symbol gets a body of its own (so a distinct address, which
/// interposers use to tell variants apart).
#[macro_export]
macro_rules! exports {
    () => {};
    ($first:ident $(| $more:ident)* ($($args:tt)*) => $body:expr; $($rest:tt)*) => {
        $crate::exports!(@each [$first $($more)*] ($($args)*) $body);
        $crate::exports!($($rest)*);
    };
    (@each [$($name:ident)*] $args:tt $body:expr) => {
        $( $crate::exports!(@one $name $args $body); )*
    };
    (@one $name:ident ($($a:ident : $t:ty),* $(,)?) $body:expr) => {
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($a: $t),*) -> cgpu_ffi::CUresult {
            $crate::version_gate!(stringify!($name));
            $crate::guard(|| $body)
        }
    };
}
