//! Modules, libraries, functions, kernels and globals. What an image defines
//! (kernel names, globals and their sizes) comes from `crate::image`: PTX
//! text, ELF, fat binaries and the runtime's fat binary wrappers; names an
//! image does not define are `CUDA_ERROR_NOT_FOUND`, except in images the sim
//! cannot read (every name resolves). A function whose name starts with
//! `cgpu_sim_spin` runs for its first parameter's ns.

use crate::driver::{cu, AllocKind, Driver, Func, Module, Obj, Timing};
use crate::image::{self, Image};
use crate::{guard, put, read_cstr, CuRes};
use cgpu_ffi::*;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::{c_char, c_void};
use std::sync::Arc;

pub const SPIN_PREFIX: &str = "cgpu_sim_spin";

/// Alignment of each global in a module's data segment.
const GLOBAL_ALIGN: u64 = 256;

/// Where a module's globals live: a module in its context; a library's in
/// the current context's device (device 0 without one), owned by no context.
fn home(d: &Driver, md: &Module) -> Result<(usize, usize), CUresult> {
    match d.ctx(md.ctx) {
        Ok(c) => Ok((md.ctx, c.dev)),
        Err(_) => match d.cur_ctx() {
            Ok((h, c)) => Ok((if md.library { 0 } else { h }, c.dev)),
            Err(_) if md.library => Ok((0, 0)),
            Err(e) => Err(e),
        },
    }
}

/// Registers a module (or library) defined by `image` in the current
/// context (libraries: the current one if any), with its globals allocated
/// on the device now: a load whose globals do not fit is
/// `CUDA_ERROR_OUT_OF_MEMORY` and registers nothing.
pub fn load_image(image: Image, library: bool) -> Result<usize, CUresult> {
    let d = cu()?;
    let ctx = if library {
        d.cur_ctx().map(|c| c.0).unwrap_or(0)
    } else {
        d.cur_ctx()?.0
    };
    let md = Module {
        ctx,
        image,
        library,
        globals: Mutex::new(HashMap::new()),
        segments: Mutex::new(Vec::new()),
    };
    let mut offsets = Vec::with_capacity(md.image.globals.len());
    let mut end = 0u64;
    for (name, size) in &md.image.globals {
        let at = end.div_ceil(GLOBAL_ALIGN) * GLOBAL_ALIGN;
        offsets.push((name.clone(), at, *size));
        end = at.saturating_add(*size);
    }
    if end > 0 {
        let (hctx, dev) = home(d, &md)?;
        let base = super::memory::alloc_on(d, hctx, dev, end, AllocKind::Global, 0)?;
        md.segments.lock().push(base);
        let mut g = md.globals.lock();
        for (name, at, size) in offsets {
            g.insert(name, (base + at, size));
        }
    }
    Ok(d.objs.lock().insert(Obj::Module(Arc::new(md))))
}

fn load(pm: *mut CUmodule, image: Image) -> CuRes {
    let h = load_image(image, false)?;
    // SAFETY: out pointer from the caller.
    unsafe { put(pm, h as CUmodule, CUDA_ERROR_INVALID_VALUE) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoadData(pm: *mut CUmodule, image: *const c_void) -> CUresult {
    guard(|| {
        cu()?;
        if pm.is_null() || image.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: image from the caller (checked non-null).
        load(pm, unsafe { image::parse_ptr(image as *const u8) })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoadDataEx(
    pm: *mut CUmodule,
    image: *const c_void,
    _n: u32,
    _opts: *mut u32,
    _vals: *mut *mut c_void,
) -> CUresult {
    std::hint::black_box(concat!(file!(), line!()));
    // SAFETY: same contract.
    unsafe { cuModuleLoadData(pm, image) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoadFatBinary(
    pm: *mut CUmodule,
    image: *const c_void,
) -> CUresult {
    guard(|| {
        cu()?;
        if pm.is_null() || image.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: a fat binary from the caller (checked non-null).
        load(pm, unsafe { image::parse_ptr(image as *const u8) })
    })
}

/// # Safety
/// `fname` is NULL or a NUL-terminated path.
pub unsafe fn read_file(fname: *const c_char) -> Result<Image, CUresult> {
    // SAFETY: NUL-terminated path from the caller.
    let path = unsafe { read_cstr(fname) }.ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let bytes = std::fs::read(&path).map_err(|_| CUDA_ERROR_FILE_NOT_FOUND)?;
    Ok(image::parse_bytes(&bytes))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoad(pm: *mut CUmodule, fname: *const c_char) -> CUresult {
    guard(|| {
        cu()?;
        if pm.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: path from the caller.
        load(pm, unsafe { read_file(fname) }?)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleUnload(m: CUmodule) -> CUresult {
    guard(|| {
        let d = cu()?;
        unload(d, m as usize, false)
    })
}

fn get_function(pf: *mut CUfunction, m: usize, name: *const c_char) -> CuRes {
    let d = cu()?;
    if pf.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: NUL-terminated name from the caller.
    let name = unsafe { read_cstr(name) }.ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let md = match d.objs.lock().get(m) {
        Some(Obj::Module(md)) => Arc::clone(md),
        _ => return Err(CUDA_ERROR_INVALID_HANDLE),
    };
    if !md.image.has_kernel(&name) {
        return Err(CUDA_ERROR_NOT_FOUND);
    }
    // One handle per (module, name), as the driver returns.
    let mut objs = d.objs.lock();
    let existing = objs
        .iter()
        .find(|(_, o)| matches!(o, Obj::Func(f) if f.module == m && f.name == name))
        .map(|(h, _)| *h);
    let h = match existing {
        Some(h) => h,
        None => {
            let timing = if name.starts_with(SPIN_PREFIX) {
                Timing::Spin
            } else {
                Timing::Fixed
            };
            objs.insert(Obj::Func(Arc::new(Func {
                module: m,
                name,
                timing,
                attrs: Mutex::new(HashMap::new()),
            })))
        }
    };
    // SAFETY: out pointer from the caller (checked non-null).
    unsafe { put(pf, h as CUfunction, CUDA_ERROR_INVALID_VALUE) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleGetFunction(
    pf: *mut CUfunction,
    m: CUmodule,
    name: *const c_char,
) -> CUresult {
    guard(|| get_function(pf, m as usize, name))
}

/// Removes a module (or library) and frees its globals.
fn unload(d: &Driver, h: usize, library: bool) -> CuRes {
    let md = {
        let mut objs = d.objs.lock();
        match objs.get(h) {
            Some(Obj::Module(md)) if md.library == library => {
                let md = Arc::clone(md);
                objs.remove(h);
                md
            }
            _ => return Err(CUDA_ERROR_INVALID_HANDLE),
        }
    };
    free_globals(d, &md);
    Ok(())
}

/// Frees the globals of a module that is going away.
pub fn free_globals(d: &Driver, md: &Module) {
    md.globals.lock().clear();
    for p in md.segments.lock().drain(..) {
        let _ = super::memory::free_dev(d, p, &[AllocKind::Global]);
    }
}

/// `cuModuleGetGlobal_v2` / `cuLibraryGetGlobal`: the device address and
/// size of global `name`, allocated when the module was loaded (a name an
/// unreadable image may define gets its memory at its first look-up).
fn get_global(
    dptr: *mut CUdeviceptr,
    bytes: *mut usize,
    m: usize,
    name: *const c_char,
    library: bool,
) -> CuRes {
    let d = cu()?;
    // SAFETY: NUL-terminated name from the caller.
    let name = unsafe { read_cstr(name) }.ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let md = match d.objs.lock().get(m) {
        Some(Obj::Module(md)) if md.library == library || !library => Arc::clone(md),
        _ => return Err(CUDA_ERROR_INVALID_HANDLE),
    };
    let size = md.image.global_size(&name).ok_or(CUDA_ERROR_NOT_FOUND)?;
    let mut globals = md.globals.lock();
    let (p, size) = match globals.get(&name) {
        Some(g) => *g,
        None => {
            let (ctx, dev) = home(d, &md)?;
            let p = super::memory::alloc_on(d, ctx, dev, size.max(1), AllocKind::Global, 0)?;
            md.segments.lock().push(p);
            globals.insert(name, (p, size));
            (p, size)
        }
    };
    if !dptr.is_null() {
        // SAFETY: non-null out pointer from the caller.
        unsafe { *dptr = p };
    }
    if !bytes.is_null() {
        // SAFETY: non-null out pointer from the caller.
        unsafe { *bytes = size as usize };
    }
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleGetGlobal_v2(
    dptr: *mut CUdeviceptr,
    bytes: *mut usize,
    m: CUmodule,
    name: *const c_char,
) -> CUresult {
    guard(|| get_global(dptr, bytes, m as usize, name, false))
}

/// `cuLibraryGetManaged`: a `__managed__` variable of the library (its
/// address is the global's, which the host can read and write in the sim).
fn get_managed(
    dptr: *mut CUdeviceptr,
    bytes: *mut usize,
    lib: usize,
    name: *const c_char,
) -> CuRes {
    let d = cu()?;
    // SAFETY: NUL-terminated name from the caller.
    let n = unsafe { read_cstr(name) }.ok_or(CUDA_ERROR_INVALID_VALUE)?;
    match d.objs.lock().get(lib) {
        Some(Obj::Module(md)) if md.library => {
            if !md.image.is_managed(&n) {
                return Err(CUDA_ERROR_NOT_FOUND);
            }
        }
        _ => return Err(CUDA_ERROR_INVALID_HANDLE),
    }
    get_global(dptr, bytes, lib, name, true)
}

/// `cuLibraryGetUnifiedFunction`: unified functions are host code compiled
/// into the library; the images the sim reads never hold one.
fn get_unified(fptr: *mut *mut std::ffi::c_void, lib: usize, name: *const c_char) -> CuRes {
    let d = cu()?;
    if fptr.is_null() || name.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    match d.objs.lock().get(lib) {
        Some(Obj::Module(md)) if md.library => Err(CUDA_ERROR_NOT_FOUND),
        _ => Err(CUDA_ERROR_INVALID_HANDLE),
    }
}

crate::exports! {
    cuLibraryGetManaged(dptr: *mut CUdeviceptr, bytes: *mut usize, lib: CUlibrary, name: *const c_char)
        => get_managed(dptr, bytes, lib as usize, name);
    cuLibraryGetUnifiedFunction(fptr: *mut *mut std::ffi::c_void, lib: CUlibrary, name: *const c_char)
        => get_unified(fptr, lib as usize, name);
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryGetGlobal(
    dptr: *mut CUdeviceptr,
    bytes: *mut usize,
    lib: CUlibrary,
    name: *const c_char,
) -> CUresult {
    guard(|| get_global(dptr, bytes, lib as usize, name, true))
}

// -------------------------------------------------------------------- libraries

fn library_load(lib: *mut CUlibrary, image: Image) -> CuRes {
    if lib.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let h = load_image(image, true)?;
    // SAFETY: out pointer from the caller (checked non-null).
    unsafe { put(lib, h as CUlibrary, CUDA_ERROR_INVALID_VALUE) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryLoadData(
    lib: *mut CUlibrary,
    code: *const c_void,
    _jit_opts: *mut u32,
    _jit_vals: *mut *mut c_void,
    _n_jit: u32,
    _lib_opts: *mut u32,
    _lib_vals: *mut *mut c_void,
    _n_lib: u32,
) -> CUresult {
    guard(|| {
        cu()?;
        if code.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: image from the caller (checked non-null).
        library_load(lib, unsafe { image::parse_ptr(code as *const u8) })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryLoadFromFile(
    lib: *mut CUlibrary,
    fname: *const c_char,
    _jit_opts: *mut u32,
    _jit_vals: *mut *mut c_void,
    _n_jit: u32,
    _lib_opts: *mut u32,
    _lib_vals: *mut *mut c_void,
    _n_lib: u32,
) -> CUresult {
    guard(|| {
        cu()?;
        // SAFETY: path from the caller.
        library_load(lib, unsafe { read_file(fname) }?)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryUnload(lib: CUlibrary) -> CUresult {
    guard(|| {
        let d = cu()?;
        unload(d, lib as usize, true)
    })
}

/// A `CUkernel` is also accepted wherever a `CUfunction` is (as in CUDA 12).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryGetKernel(
    pk: *mut CUkernel,
    lib: CUlibrary,
    name: *const c_char,
) -> CUresult {
    guard(|| get_function(pk, lib as usize, name))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryGetModule(pm: *mut CUmodule, lib: CUlibrary) -> CUresult {
    guard(|| {
        let d = cu()?;
        match d.objs.lock().get(lib as usize) {
            Some(Obj::Module(md)) if md.library => {}
            _ => return Err(CUDA_ERROR_INVALID_HANDLE),
        }
        // SAFETY: out pointer from the caller.
        unsafe { put(pm, lib as CUmodule, CUDA_ERROR_INVALID_VALUE) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuKernelGetFunction(pf: *mut CUfunction, k: CUkernel) -> CUresult {
    guard(|| {
        let d = cu()?;
        d.func(k as usize)?;
        // SAFETY: out pointer from the caller.
        unsafe { put(pf, k as CUfunction, CUDA_ERROR_INVALID_VALUE) }
    })
}

// --------------------------------------------------------- function attributes

fn func_attr(f: &Func, attrib: i32) -> Option<i32> {
    if let Some(v) = f.attrs.lock().get(&attrib) {
        return Some(*v);
    }
    Some(match attrib {
        0 => 1024, // MAX_THREADS_PER_BLOCK
        1 => 0,    // SHARED_SIZE_BYTES
        2 => 0,    // CONST_SIZE_BYTES
        3 => 0,    // LOCAL_SIZE_BYTES
        4 => 32,   // NUM_REGS
        5 => 80,   // PTX_VERSION
        6 => 80,   // BINARY_VERSION
        7 => 0,    // CACHE_MODE_CA
        8 => 0,    // MAX_DYNAMIC_SHARED_SIZE_BYTES
        9 => -1,   // PREFERRED_SHARED_MEMORY_CARVEOUT
        10..=15 => 0,
        _ => return None,
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuFuncGetAttribute(pi: *mut i32, attrib: i32, f: CUfunction) -> CUresult {
    guard(|| {
        let func = cu()?.func(f as usize)?;
        let v = func_attr(&func, attrib).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: out pointer from the caller.
        unsafe { put(pi, v, CUDA_ERROR_INVALID_VALUE) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuFuncSetAttribute(f: CUfunction, attrib: i32, value: i32) -> CUresult {
    guard(|| {
        let func = cu()?.func(f as usize)?;
        if !matches!(attrib, 8..=15) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        func.attrs.lock().insert(attrib, value);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuKernelGetAttribute(
    pi: *mut i32,
    attrib: i32,
    k: CUkernel,
    _dev: CUdevice,
) -> CUresult {
    std::hint::black_box(concat!(file!(), line!()));
    // SAFETY: same contract.
    unsafe { cuFuncGetAttribute(pi, attrib, k as CUfunction) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuKernelSetAttribute(
    attrib: i32,
    value: i32,
    k: CUkernel,
    _dev: CUdevice,
) -> CUresult {
    std::hint::black_box(concat!(file!(), line!()));
    // SAFETY: same contract.
    unsafe { cuFuncSetAttribute(k as CUfunction, attrib, value) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuFuncSetCacheConfig(f: CUfunction, _cfg: u32) -> CUresult {
    guard(|| cu()?.func(f as usize).map(|_| ()))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuFuncGetName(name: *mut *const c_char, f: CUfunction) -> CUresult {
    crate::version_gate!("cuFuncGetName");
    guard(|| {
        let func = cu()?.func(f as usize)?;
        // Names live as long as the process (leaked once per function handle).
        static NAMES: std::sync::OnceLock<Mutex<HashMap<usize, std::ffi::CString>>> =
            std::sync::OnceLock::new();
        let mut names = NAMES.get_or_init(|| Mutex::new(HashMap::new())).lock();
        let c = names
            .entry(f as usize)
            .or_insert_with(|| std::ffi::CString::new(func.name.clone()).unwrap_or_default());
        // SAFETY: out pointer from the caller; the string outlives the call.
        unsafe { put(name, c.as_ptr(), CUDA_ERROR_INVALID_VALUE) }
    })
}

// ------------------------------------------------------ enumeration, loading

fn module_funcs(m: usize, library: bool, count: *mut u32, out: *mut CUfunction, cap: u32) -> CuRes {
    let d = cu()?;
    let md = match d.objs.lock().get(m) {
        Some(Obj::Module(md)) if md.library == library || !library => Arc::clone(md),
        _ => return Err(CUDA_ERROR_INVALID_HANDLE),
    };
    let names = md.image.kernels.clone();
    if !count.is_null() {
        // SAFETY: non-null out pointer from the caller.
        unsafe { *count = names.len() as u32 };
        return Ok(());
    }
    if out.is_null() || (cap as usize) < names.len() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    for (i, n) in names.iter().enumerate() {
        let c = std::ffi::CString::new(n.as_str()).map_err(|_| CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: out holds cap >= names.len() entries.
        get_function(unsafe { out.add(i) }, m, c.as_ptr())?;
    }
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleGetFunctionCount(count: *mut u32, m: CUmodule) -> CUresult {
    crate::version_gate!("cuModuleGetFunctionCount");
    guard(|| {
        if count.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        module_funcs(m as usize, false, count, std::ptr::null_mut(), 0)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleEnumerateFunctions(
    out: *mut CUfunction,
    n: u32,
    m: CUmodule,
) -> CUresult {
    crate::version_gate!("cuModuleEnumerateFunctions");
    guard(|| module_funcs(m as usize, false, std::ptr::null_mut(), out, n))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryGetKernelCount(count: *mut u32, lib: CUlibrary) -> CUresult {
    crate::version_gate!("cuLibraryGetKernelCount");
    guard(|| {
        if count.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        module_funcs(lib as usize, true, count, std::ptr::null_mut(), 0)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLibraryEnumerateKernels(
    out: *mut CUkernel,
    n: u32,
    lib: CUlibrary,
) -> CUresult {
    crate::version_gate!("cuLibraryEnumerateKernels");
    guard(|| module_funcs(lib as usize, true, std::ptr::null_mut(), out, n))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuKernelGetName(name: *mut *const c_char, k: CUkernel) -> CUresult {
    crate::version_gate!("cuKernelGetName");
    std::hint::black_box(concat!(file!(), line!()));
    // SAFETY: same contract.
    unsafe { cuFuncGetName(name, k as CUfunction) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuFuncGetModule(pm: *mut CUmodule, f: CUfunction) -> CUresult {
    guard(|| {
        let func = cu()?.func(f as usize)?;
        // SAFETY: out pointer from the caller.
        unsafe { put(pm, func.module as CUmodule, CUDA_ERROR_INVALID_VALUE) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuKernelGetLibrary(pl: *mut CUlibrary, k: CUkernel) -> CUresult {
    crate::version_gate!("cuKernelGetLibrary");
    std::hint::black_box(concat!(file!(), line!()));
    // SAFETY: same contract.
    unsafe { cuFuncGetModule(pl as *mut CUmodule, k as CUfunction) }
}

/// `CU_MODULE_EAGER_LOADING`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleGetLoadingMode(mode: *mut u32) -> CUresult {
    guard(|| {
        cu()?;
        // SAFETY: out pointer from the caller.
        unsafe { put(mode, 1, CUDA_ERROR_INVALID_VALUE) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuFuncIsLoaded(state: *mut u32, f: CUfunction) -> CUresult {
    crate::version_gate!("cuFuncIsLoaded");
    guard(|| {
        cu()?.func(f as usize)?;
        // SAFETY: out pointer from the caller (CU_FUNCTION_LOADING_STATE_LOADED).
        unsafe { put(state, 1, CUDA_ERROR_INVALID_VALUE) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuFuncLoad(f: CUfunction) -> CUresult {
    crate::version_gate!("cuFuncLoad");
    guard(|| cu()?.func(f as usize).map(|_| ()))
}
