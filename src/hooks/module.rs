//! Modules and libraries: what loading one takes on the device (its code,
//! its `__device__` globals, whatever else the driver reserves for it)
//! counts against the quota. It is measured as a context's reservation is
//! (this process's device memory just before and after the real call, its
//! other allocations held off meanwhile), at the load and at each look-up
//! of a global: a driver that loads lazily may make a global's memory at
//! its first look-up (the simulated one makes it at the load), and a look-up that takes nothing is charged
//! nothing. Everything is charged to the module (which dies with its
//! context; a library is the device's until it is unloaded). A load that
//! would pass the quota is undone (the module unloaded again) and refused
//! with `CUDA_ERROR_OUT_OF_MEMORY`; a look-up whose memory would pass it is
//! refused the same way, and so is every later look-up in that module (the
//! driver keeps the global's memory until the module is unloaded).
//! Unloading gives it all back.

use super::device::current_gpu;
use super::memory::current_ctx;
use super::sig;
use super::types::*;
use crate::driver::RealFn;
use crate::memory::{proc_state, Gpu, Kind, Owner};
use crate::process::fork::ForkLocal;
use parking_lot::Mutex;

/// Modules (and libraries) a look-up of a global was refused for: the
/// driver made the global's memory at the look-up and keeps it until the
/// module is unloaded, so every later look-up in it is refused too (one
/// per fork generation).
static REFUSED: ForkLocal<Mutex<Vec<u64>>> = ForkLocal::new(|| Mutex::new(Vec::new()));

/// Charge `bytes` more to module (or library) `h`, owned by `owner`; false
/// when they would pass the quota (nothing charged).
fn charge(gpu: &'static Gpu, h: u64, owner: Owner, bytes: u64) -> bool {
    let st = proc_state();
    if !gpu.reserve(bytes) {
        return false;
    }
    let held = st.charges.untrack(Kind::Module, h);
    let (total, owner) = match held {
        Some(e) => (e.bytes.saturating_add(bytes), e.owner),
        None => (bytes, owner),
    };
    st.charges.track(Kind::Module, h, gpu, total, owner);
    true
}

/// A load (`load`, the real call), measured and charged to the handle it
/// made (`handle` reads it: called only when the driver succeeded);
/// `unload` undoes it when its memory would pass the quota.
fn loaded(
    library: bool,
    load: impl FnOnce() -> CUresult,
    handle: impl FnOnce() -> Ptr,
    unload: impl FnOnce(Ptr) -> CUresult,
) -> CUresult {
    let Some(gpu) = current_gpu() else {
        return load();
    };
    let (rc, bytes, _m) = super::context::measured_call(gpu, load);
    if rc != CUDA_SUCCESS {
        return rc;
    }
    let h = handle();
    if h.is_null() {
        return rc;
    }
    let owner = if library {
        Owner::Context(0)
    } else {
        Owner::Context(current_ctx())
    };
    if !charge(gpu, h as u64, owner, bytes.unwrap_or(0)) {
        unload(h);
        tracing::debug!(
            "cgpu: module load of {} bytes refused: container would pass its quota of {:?} on GPU {}",
            bytes.unwrap_or(0),
            gpu.quota,
            gpu.visible_index
        );
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    rc
}

/// A global's look-up (`get`, the real call), measured and charged to its
/// module or library `h`.
fn looked_up(h: Ptr, library: bool, get: impl FnOnce() -> CUresult) -> CUresult {
    let Some(gpu) = current_gpu() else {
        return get();
    };
    let key = h as u64;
    if REFUSED.get().lock().contains(&key) {
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    let (rc, bytes, _m) = super::context::measured_call(gpu, get);
    let bytes = bytes.unwrap_or(0);
    if rc != CUDA_SUCCESS || bytes == 0 {
        return rc;
    }
    let owner = if library {
        Owner::Context(0)
    } else {
        Owner::Context(current_ctx())
    };
    if !charge(gpu, key, owner, bytes) {
        REFUSED.get().lock().push(key);
        tracing::debug!(
            "cgpu: a global of {bytes} bytes refused: container would pass its quota of {:?} on GPU {}",
            gpu.quota,
            gpu.visible_index
        );
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    rc
}

/// An unload (`unload`, the real call) gives back what the module held.
fn unloaded(h: Ptr, unload: impl FnOnce() -> CUresult) -> CUresult {
    if !crate::memory::tracking() {
        return unload();
    }
    let st = proc_state();
    let _g = super::context::alloc_guard();
    let entry = st.charges.untrack(Kind::Module, h as u64);
    let rc = unload();
    if rc == CUDA_SUCCESS {
        REFUSED.get().lock().retain(|&k| k != h as u64);
    }
    if let Some(e) = entry {
        if rc == CUDA_SUCCESS {
            e.gpu.release(e.bytes);
        } else {
            st.charges
                .track(Kind::Module, h as u64, e.gpu, e.bytes, e.owner);
        }
    }
    rc
}

fn unload_module(h: Ptr) -> CUresult {
    super::call_real!(super::real::cuModuleUnload, h)
}

fn unload_library(h: Ptr) -> CUresult {
    super::call_real!(super::real::cuLibraryUnload, h)
}

/// The handle a successful load wrote to `out` (null if `out` is null).
///
/// # Safety
/// `out` is null or valid for reads, and written by the driver.
unsafe fn written(out: *mut Ptr) -> Ptr {
    if out.is_null() {
        std::ptr::null_mut()
    } else {
        // SAFETY: per the contract above.
        unsafe { out.read_unaligned() }
    }
}

/// `cuModuleLoad`.
///
/// # Safety
/// The driver's contract.
pub unsafe fn module_load(
    real: &RealFn<sig::cuModuleLoad>,
    module: *mut CUmodule,
    fname: CStrP,
) -> CUresult {
    loaded(
        false,
        || super::call_real!(real, module, fname),
        // SAFETY: called only on success, when the driver wrote the
        // handle to the caller's out-pointer.
        || unsafe { written(module.cast()) },
        unload_module,
    )
}

/// `cuModuleLoadData`.
///
/// # Safety
/// The driver's contract.
pub unsafe fn module_load_data(
    real: &RealFn<sig::cuModuleLoadData>,
    module: *mut CUmodule,
    image: *const c_void,
) -> CUresult {
    loaded(
        false,
        || super::call_real!(real, module, image),
        // SAFETY: called only on success, when the driver wrote the
        // handle to the caller's out-pointer.
        || unsafe { written(module.cast()) },
        unload_module,
    )
}

/// `cuModuleLoadDataEx`.
///
/// # Safety
/// The driver's contract.
pub unsafe fn module_load_data_ex(
    real: &RealFn<sig::cuModuleLoadDataEx>,
    module: *mut CUmodule,
    image: *const c_void,
    n: u32,
    options: *mut CUjit_option,
    values: *mut Ptr,
) -> CUresult {
    loaded(
        false,
        || super::call_real!(real, module, image, n, options, values),
        // SAFETY: called only on success, when the driver wrote the
        // handle to the caller's out-pointer.
        || unsafe { written(module.cast()) },
        unload_module,
    )
}

/// `cuModuleLoadFatBinary`.
///
/// # Safety
/// The driver's contract.
pub unsafe fn module_load_fat_binary(
    real: &RealFn<sig::cuModuleLoadFatBinary>,
    module: *mut CUmodule,
    fat_cubin: *const c_void,
) -> CUresult {
    loaded(
        false,
        || super::call_real!(real, module, fat_cubin),
        // SAFETY: called only on success, when the driver wrote the
        // handle to the caller's out-pointer.
        || unsafe { written(module.cast()) },
        unload_module,
    )
}

/// `cuModuleUnload`.
///
/// # Safety
/// The driver's contract.
pub unsafe fn module_unload(real: &RealFn<sig::cuModuleUnload>, module: CUmodule) -> CUresult {
    unloaded(module, || super::call_real!(real, module))
}

/// `cuModuleGetGlobal_v2`.
///
/// # Safety
/// The driver's contract.
pub unsafe fn module_get_global(
    real: &RealFn<sig::cuModuleGetGlobal_v2>,
    dptr: *mut CUdeviceptr,
    bytes: *mut usize,
    module: CUmodule,
    name: CStrP,
) -> CUresult {
    looked_up(module, false, || {
        super::call_real!(real, dptr, bytes, module, name)
    })
}

/// `cuLibraryLoadData`.
///
/// # Safety
/// The driver's contract.
#[allow(clippy::too_many_arguments)]
pub unsafe fn library_load_data(
    real: &RealFn<sig::cuLibraryLoadData>,
    library: *mut CUlibrary,
    code: *const c_void,
    jit_options: *mut CUjit_option,
    jit_values: *mut Ptr,
    n_jit: u32,
    lib_options: *mut CUlibraryOption,
    lib_values: *mut Ptr,
    n_lib: u32,
) -> CUresult {
    loaded(
        true,
        || {
            super::call_real!(
                real,
                library,
                code,
                jit_options,
                jit_values,
                n_jit,
                lib_options,
                lib_values,
                n_lib
            )
        },
        // SAFETY: called only on success, when the driver wrote the
        // handle to the caller's out-pointer.
        || unsafe { written(library.cast()) },
        unload_library,
    )
}

/// `cuLibraryLoadFromFile`.
///
/// # Safety
/// The driver's contract.
#[allow(clippy::too_many_arguments)]
pub unsafe fn library_load_from_file(
    real: &RealFn<sig::cuLibraryLoadFromFile>,
    library: *mut CUlibrary,
    fname: CStrP,
    jit_options: *mut CUjit_option,
    jit_values: *mut Ptr,
    n_jit: u32,
    lib_options: *mut CUlibraryOption,
    lib_values: *mut Ptr,
    n_lib: u32,
) -> CUresult {
    loaded(
        true,
        || {
            super::call_real!(
                real,
                library,
                fname,
                jit_options,
                jit_values,
                n_jit,
                lib_options,
                lib_values,
                n_lib
            )
        },
        // SAFETY: called only on success, when the driver wrote the
        // handle to the caller's out-pointer.
        || unsafe { written(library.cast()) },
        unload_library,
    )
}

/// `cuLibraryUnload`.
///
/// # Safety
/// The driver's contract.
pub unsafe fn library_unload(real: &RealFn<sig::cuLibraryUnload>, library: CUlibrary) -> CUresult {
    unloaded(library, || super::call_real!(real, library))
}

/// `cuLibraryGetGlobal`.
///
/// # Safety
/// The driver's contract.
pub unsafe fn library_get_global(
    real: &RealFn<sig::cuLibraryGetGlobal>,
    dptr: *mut CUdeviceptr,
    bytes: *mut usize,
    library: CUlibrary,
    name: CStrP,
) -> CUresult {
    looked_up(library, true, || {
        super::call_real!(real, dptr, bytes, library, name)
    })
}
