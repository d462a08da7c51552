//! Loading the real driver: `libcuda.so.1` and `libnvidia-ml.so.1` (or
//! `CGPU_REAL_LIBCUDA` / `CGPU_REAL_LIBNVML`), and resolving real functions
//! only on those handles, through the real `dlsym` (found once with `dlvsym`,
//! never through `dlsym`, which we override).
//!
//! A missing driver is one clear error in the log; every hook then returns
//! what the loader would have made of it (`CUDA_ERROR_NOT_INITIALIZED`,
//! `NVML_ERROR_LIBRARY_NOT_FOUND`), never a crash.

use std::cell::Cell;
use std::ffi::{c_char, c_void, CStr};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

/// `dlsym`'s signature.
pub type DlsymFn = unsafe extern "C" fn(*mut c_void, *const c_char) -> *mut c_void;

/// The real `dlsym` (0 = not resolved yet). Read by the `dlsym` trampoline.
pub(crate) static REAL_DLSYM: AtomicUsize = AtomicUsize::new(0);

/// Which library a function lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lib {
    Cuda,
    Nvml,
}

fn resolve_real_dlsym() -> usize {
    #[cfg(target_arch = "aarch64")]
    const VERSIONS: [&CStr; 2] = [c"GLIBC_2.34", c"GLIBC_2.17"];
    #[cfg(not(target_arch = "aarch64"))]
    const VERSIONS: [&CStr; 2] = [c"GLIBC_2.34", c"GLIBC_2.2.5"];
    for v in VERSIONS {
        // SAFETY: dlvsym is given valid NUL-terminated strings; RTLD_NEXT from
        // this library finds libc's dlsym, not our own export.
        let p = unsafe { libc::dlvsym(libc::RTLD_NEXT, c"dlsym".as_ptr(), v.as_ptr()) };
        if !p.is_null() {
            return p as usize;
        }
    }
    0
}

/// The real `dlsym`. Lock-free, allocation-free.
#[inline]
pub fn real_dlsym() -> Option<DlsymFn> {
    let mut p = REAL_DLSYM.load(Ordering::Acquire);
    if p == 0 {
        p = resolve_real_dlsym();
        if p == 0 {
            return None;
        }
        REAL_DLSYM.store(p, Ordering::Release);
    }
    // SAFETY: p is the non-null address of libc's dlsym, which has this signature.
    Some(unsafe { std::mem::transmute::<usize, DlsymFn>(p) })
}

/// Early resolution of the real `dlsym`, so that the `dlsym` trampoline can
/// forward `RTLD_NEXT` with the caller's own return address from the first
/// call. Touches nothing but `dlvsym` (no std I/O, no allocation).
extern "C" fn early_init() {
    let _ = real_dlsym();
}

#[used]
#[link_section = ".init_array"]
static EARLY_INIT: extern "C" fn() = early_init;

struct Handle {
    /// 0 untried, 1 opening, 2 open, 3 missing.
    state: AtomicU8,
    handle: AtomicUsize,
    lock: parking_lot::Mutex<()>,
}

static CUDA: Handle = Handle::new();
static NVML: Handle = Handle::new();

thread_local! {
    /// Set while this thread runs `dlopen` of a driver: the driver's own
    /// constructors may call `dlsym`, which must not recurse into opening.
    static OPENING: Cell<bool> = const { Cell::new(false) };
}

impl Handle {
    const fn new() -> Self {
        Handle {
            state: AtomicU8::new(0),
            handle: AtomicUsize::new(0),
            lock: parking_lot::Mutex::new(()),
        }
    }

    fn get(&self, lib: Lib) -> Option<*mut c_void> {
        match self.state.load(Ordering::Acquire) {
            2 => return Some(self.handle.load(Ordering::Acquire) as *mut c_void),
            3 => return None,
            _ => {}
        }
        if OPENING.with(|o| o.get()) {
            return None;
        }
        let _g = self.lock.lock();
        match self.state.load(Ordering::Acquire) {
            2 => return Some(self.handle.load(Ordering::Acquire) as *mut c_void),
            3 => return None,
            _ => {}
        }
        self.state.store(1, Ordering::Release);
        let cfg = crate::config::get();
        let path = match lib {
            Lib::Cuda => &cfg.real_libcuda,
            Lib::Nvml => &cfg.real_libnvml,
        };
        OPENING.with(|o| o.set(true));
        // SAFETY: path is a valid C string; dlopen is thread-safe.
        let h = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        OPENING.with(|o| o.set(false));
        if h.is_null() {
            // SAFETY: dlerror returns NULL or a valid C string owned by libc.
            let err = unsafe {
                let e = libc::dlerror();
                if e.is_null() {
                    String::from("unknown error")
                } else {
                    CStr::from_ptr(e).to_string_lossy().into_owned()
                }
            };
            let (var, code) = match lib {
                Lib::Cuda => ("CGPU_REAL_LIBCUDA", "CUDA_ERROR_NOT_INITIALIZED"),
                Lib::Nvml => ("CGPU_REAL_LIBNVML", "NVML_ERROR_LIBRARY_NOT_FOUND"),
            };
            tracing::error!(
                "cgpu: cannot load the real driver '{}' ({err}); set {var} to its path. Calls through cgpu return {code}",
                path.to_string_lossy()
            );
            self.state.store(3, Ordering::Release);
            return None;
        }
        if let Some(why) = not_a_driver(lib, h) {
            let var = match lib {
                Lib::Cuda => "CGPU_REAL_LIBCUDA",
                Lib::Nvml => "CGPU_REAL_LIBNVML",
            };
            tracing::error!(
                "cgpu: '{}' is not the real driver ({why}); set {var} to the driver's path. Calls through cgpu return an error",
                path.to_string_lossy()
            );
            self.state.store(3, Ordering::Release);
            return None;
        }
        tracing::debug!("cgpu: loaded real driver {}", path.to_string_lossy());
        self.handle.store(h as usize, Ordering::Release);
        self.state.store(2, Ordering::Release);
        Some(h)
    }
}

/// Why the library `h` cannot be the real driver: it is libcgpu itself
/// (every call would come back to our hooks, forever), or it lacks the
/// driver's entry point. `None`: it looks like the driver.
fn not_a_driver(lib: Lib, h: *mut c_void) -> Option<&'static str> {
    // (a function we export, the driver's entry point)
    let (ours, entry): (&CStr, &CStr) = match lib {
        Lib::Cuda => (c"cuMemAlloc_v2", c"cuInit"),
        Lib::Nvml => (c"nvmlDeviceGetMemoryInfo", c"nvmlInit_v2"),
    };
    let dlsym = real_dlsym()?;
    // SAFETY: h is a live dlopen handle, the names valid C strings.
    let (p, e) = unsafe { (dlsym(h, ours.as_ptr()), dlsym(h, entry.as_ptr())) };
    if !p.is_null() && in_this_library(p) {
        return Some("it is libcgpu itself");
    }
    if e.is_null() {
        return Some(match lib {
            Lib::Cuda => "it has no cuInit",
            Lib::Nvml => "it has no nvmlInit_v2",
        });
    }
    None
}

/// Does address `p` lie in this library (libcgpu) itself?
fn in_this_library(p: *mut c_void) -> bool {
    // SAFETY: dladdr only reads the loader's tables; both infos are
    // zero-initialised plain C structs it fills.
    unsafe {
        let mut a: libc::Dl_info = std::mem::zeroed();
        let mut b: libc::Dl_info = std::mem::zeroed();
        let here = in_this_library as fn(*mut c_void) -> bool as *const c_void;
        libc::dladdr(p, &mut a) != 0
            && libc::dladdr(here, &mut b) != 0
            && !a.dli_fbase.is_null()
            && a.dli_fbase == b.dli_fbase
    }
}

/// The real driver's handle, opened on first use.
pub fn handle(lib: Lib) -> Option<*mut c_void> {
    match lib {
        Lib::Cuda => CUDA.get(lib),
        Lib::Nvml => NVML.get(lib),
    }
}

/// Resolve `name` on the real driver's handle (never on `RTLD_DEFAULT`,
/// which would find our own export). Null when absent.
pub fn real_sym(lib: Lib, name: &CStr) -> *mut c_void {
    let (Some(h), Some(dlsym)) = (handle(lib), real_dlsym()) else {
        return std::ptr::null_mut();
    };
    // SAFETY: h is a live dlopen handle, name a valid C string.
    unsafe { dlsym(h, name.as_ptr()) }
}

/// What a hook returns when the function is unavailable: the driver is
/// missing, or it lacks this symbol.
pub fn missing_code(lib: Lib) -> u32 {
    let open = handle(lib).is_some();
    match (lib, open) {
        (Lib::Cuda, false) => cgpu_ffi::CUDA_ERROR_NOT_INITIALIZED,
        (Lib::Cuda, true) => cgpu_ffi::CUDA_ERROR_NOT_FOUND,
        (Lib::Nvml, false) => cgpu_ffi::NVML_ERROR_LIBRARY_NOT_FOUND,
        (Lib::Nvml, true) => cgpu_ffi::NVML_ERROR_FUNCTION_NOT_FOUND,
    }
}

/// A real driver function's address, resolved once (lock-free afterwards).
pub struct RealSym {
    name: &'static CStr,
    lib: Lib,
    /// 0 = unresolved, 1 = absent, else the address.
    slot: AtomicUsize,
}

impl RealSym {
    pub const fn new(name: &'static CStr) -> Self {
        let b = name.to_bytes();
        let lib = if b.len() >= 4 && b[0] == b'n' && b[1] == b'v' && b[2] == b'm' && b[3] == b'l' {
            Lib::Nvml
        } else {
            Lib::Cuda
        };
        RealSym {
            name,
            lib,
            slot: AtomicUsize::new(0),
        }
    }

    pub fn name(&self) -> &'static CStr {
        self.name
    }

    pub fn lib(&self) -> Lib {
        self.lib
    }

    /// The real address, 0 when absent (or while the driver is being opened).
    #[inline]
    pub fn addr(&self) -> usize {
        match self.slot.load(Ordering::Acquire) {
            0 => self.resolve(),
            1 => 0,
            p => p,
        }
    }

    #[cold]
    fn resolve(&self) -> usize {
        let Some(h) = handle(self.lib) else { return 0 };
        let Some(dlsym) = real_dlsym() else { return 0 };
        // SAFETY: h is a live dlopen handle, name a valid C string.
        let p = unsafe { dlsym(h, self.name.as_ptr()) } as usize;
        self.slot
            .store(if p == 0 { 1 } else { p }, Ordering::Release);
        p
    }

    /// Forget the address (tests).
    pub fn reset(&self) {
        self.slot.store(0, Ordering::Release);
    }
}

/// A typed real function: `F` is its `unsafe extern "C" fn` type.
pub struct RealFn<F> {
    sym: RealSym,
    _f: PhantomData<F>,
}

// SAFETY: RealFn holds only atomics and a 'static CStr; F is a fn-pointer type
// used as a marker.
unsafe impl<F> Sync for RealFn<F> {}

impl<F: Copy> RealFn<F> {
    /// The driver's function `name`, typed `F`.
    ///
    /// # Safety
    /// `F` is an `unsafe extern "C" fn` pointer type with exactly the C
    /// signature of the driver's function `name` ([`get`](Self::get) turns
    /// the symbol's address into an `F`).
    pub const unsafe fn new(name: &'static CStr) -> Self {
        RealFn {
            sym: RealSym::new(name),
            _f: PhantomData,
        }
    }

    /// The real function, `None` when the driver or the symbol is missing.
    #[inline]
    pub fn get(&self) -> Option<F> {
        const { assert!(std::mem::size_of::<F>() == std::mem::size_of::<usize>()) };
        let p = self.sym.addr();
        if p == 0 {
            None
        } else {
            // SAFETY: p is the non-null address of the driver's function of
            // this name, whose C signature F is (the contract of `new`); F is
            // a pointer-sized fn-pointer type (asserted above).
            Some(unsafe { std::mem::transmute_copy::<usize, F>(&p) })
        }
    }

    pub fn sym(&'static self) -> &'static RealSym {
        &self.sym
    }

    /// What to return when [`get`](Self::get) is `None`.
    pub fn missing(&self) -> u32 {
        missing_code(self.sym.lib)
    }
}
