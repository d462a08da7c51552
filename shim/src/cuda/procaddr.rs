//! `cuGetProcAddress` / `cuGetProcAddress_v2` with the real driver's rules.
//!
//! `procaddr_table.rs` lists, for every API name, each variant we export with
//! the CUDA version that introduced it and its flavour (default, or the
//! per-thread-default-stream `_ptds`/`_ptsz` one). It is generated from the
//! real `cudaTypedefs.h` by `shim/tools/gen_procaddr.py` (variant `i` of a
//! name, by version, is `name` for i = 0 and `name_v{i+1}` after; a ptds
//! variant is the default variant in force at its version plus the suffix);
//! `tests/procaddr.rs` checks it against the headers.
//!
//! Resolution of (name, version, flags): with `CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM`,
//! the newest ptds variant introduced at or before the version, if any; else
//! the newest default variant introduced at or before it. The version is
//! capped at the simulated driver's version (an older driver does not know
//! newer variants). Pointers are our own functions (the library is linked
//! with `-Bsymbolic`, so they cannot be interposed).

use crate::driver::trace;
use crate::{guard, put, read_cstr};
use cgpu_ffi::*;
use std::collections::HashMap;
use std::ffi::{c_char, c_void};
use std::sync::atomic::{AtomicU8, Ordering::Relaxed};
use std::sync::OnceLock;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavour {
    Default,
    /// `_ptds` / `_ptsz`: per-thread default stream.
    PerThread,
}

#[derive(Clone, Copy, Debug)]
pub struct Entry {
    pub name: &'static str,
    pub version: u32,
    pub flavour: Flavour,
    pub symbol: &'static str,
    pub ptr: usize,
}

macro_rules! flavour {
    () => {
        $crate::cuda::procaddr::Flavour::Default
    };
    (ptds) => {
        $crate::cuda::procaddr::Flavour::PerThread
    };
}
pub(crate) use flavour;

/// The one declaration list: `api: version [ptds] => symbol, ...;`.
macro_rules! proc_table {
    ($($api:ident : $($ver:literal $($fl:ident)? => $sym:ident),+ ;)*) => {
        pub(super) fn entries() -> Vec<$crate::cuda::procaddr::Entry> {
            vec![$($(
                $crate::cuda::procaddr::Entry {
                    name: stringify!($api),
                    version: $ver,
                    flavour: $crate::cuda::procaddr::flavour!($($fl)?),
                    symbol: stringify!($sym),
                    ptr: $sym as *const () as usize,
                },
            )+)*]
        }
    };
}
pub(crate) use proc_table;

/// Legacy variants we keep only for their names: counted stubs that answer
/// NOT_SUPPORTED (safe to call with any arguments under the C calling
/// convention). Each body counts its own name, so addresses are distinct.
macro_rules! legacy_stubs {
    ($($sym:ident),* $(,)?) => {
        $crate::stub_fns! { cgpu_ffi::CUresult = cgpu_ffi::CUDA_ERROR_NOT_SUPPORTED => $($sym),*; }
    };
}
pub(crate) use legacy_stubs;

type Table = HashMap<&'static str, Vec<Entry>>;

pub fn table() -> &'static Table {
    static T: OnceLock<Table> = OnceLock::new();
    T.get_or_init(|| {
        let mut t: Table = HashMap::new();
        for e in super::procaddr_table::entries() {
            t.entry(e.name).or_default().push(e);
        }
        for v in t.values_mut() {
            v.sort_by_key(|e| e.version);
        }
        t
    })
}

/// The CUDA version that introduced `symbol` (its oldest entry in the
/// table); `None` for a symbol not in it.
pub fn introduced(symbol: &str) -> Option<u32> {
    static T: OnceLock<HashMap<&'static str, u32>> = OnceLock::new();
    T.get_or_init(|| {
        let mut m: HashMap<&'static str, u32> = HashMap::new();
        for e in table().values().flatten() {
            let v = m.entry(e.symbol).or_insert(e.version);
            *v = (*v).min(e.version);
        }
        m
    })
    .get(symbol)
    .copied()
}

/// Whether exported function `symbol` is newer than the simulated driver
/// (`CGPU_SIM_DRIVER_VERSION`): a real driver of that version would not
/// export it, so when a client finds it anyway (`dlsym`) and calls it, it
/// answers `CUDA_ERROR_NOT_SUPPORTED` and does nothing. `gate` caches the
/// answer per call site (one relaxed load after the first call).
pub fn too_new(gate: &AtomicU8, symbol: &str) -> bool {
    match gate.load(Relaxed) {
        1 => false,
        2 => true,
        _ => {
            let driver = crate::driver::driver_version().max(0) as u32;
            let newer = introduced(symbol).is_some_and(|v| v > driver);
            gate.store(if newer { 2 } else { 1 }, Relaxed);
            if newer {
                trace(format_args!(
                    "{symbol} is newer than driver version {driver}: CUDA_ERROR_NOT_SUPPORTED"
                ));
            }
            newer
        }
    }
}

/// Returns `CUDA_ERROR_NOT_SUPPORTED` from the exported function `$name`
/// when it is newer than the simulated driver (see [`too_new`]).
#[macro_export]
macro_rules! version_gate {
    ($name:expr) => {{
        static GATE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);
        if $crate::cuda::procaddr::too_new(&GATE, $name) {
            return cgpu_ffi::CUDA_ERROR_NOT_SUPPORTED;
        }
    }};
}

/// Variants newer than the typedef headers the table is generated from.
pub use super::procaddr_table::EXTRA;

/// Whether `symbol` is only a counted stub.
pub fn is_stub(symbol: &str) -> bool {
    super::procaddr_table::STUBS.contains(&symbol)
}

/// Every entry (for tests and tools).
pub fn all_entries() -> Vec<Entry> {
    let mut v: Vec<Entry> = table().values().flatten().copied().collect();
    v.sort_by(|a, b| (a.name, a.version, a.symbol).cmp(&(b.name, b.version, b.symbol)));
    v
}

/// Resolves a name as the real driver does.
pub fn resolve(
    name: &str,
    version: i32,
    flags: u64,
) -> Result<&'static Entry, CUdriverProcAddressQueryResult> {
    let list = table()
        .get(name)
        .ok_or(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND)?;
    let driver = crate::driver::driver_version().max(0) as u32;
    // A driver older than the function does not have it at all.
    if list.first().is_none_or(|e| e.version > driver) {
        return Err(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    }
    let v = (version.max(0) as u32).min(driver);
    let pick = |fl: Flavour| {
        list.iter()
            .rev()
            .find(|e| e.flavour == fl && e.version <= v)
    };
    if flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM != 0 {
        if let Some(e) = pick(Flavour::PerThread) {
            return Ok(e);
        }
    }
    pick(Flavour::Default).ok_or(CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT)
}

fn get_proc(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: i32,
    flags: u64,
    status: *mut CUdriverProcAddressQueryResult,
) -> crate::CuRes {
    if pfn.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null out pointer from the caller.
    unsafe { *pfn = std::ptr::null_mut() };
    // SAFETY: NUL-terminated name from the caller.
    let name = unsafe { read_cstr(symbol) }.ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if flags > 2 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let r = resolve(&name, version, flags);
    trace(format_args!(
        "cuGetProcAddress({name}, {version}, {flags}) -> {}",
        match &r {
            Ok(e) if super::procaddr_table::STUBS.contains(&e.symbol) =>
                format!("{} (stub)", e.symbol),
            Ok(e) => e.symbol.to_string(),
            Err(1) => "SYMBOL_NOT_FOUND".to_string(),
            Err(_) => "VERSION_NOT_SUFFICIENT".to_string(),
        }
    ));
    let (st, res) = match r {
        Ok(e) => {
            // SAFETY: non-null out pointer from the caller.
            unsafe { *pfn = e.ptr as *mut c_void };
            (CU_GET_PROC_ADDRESS_SUCCESS, Ok(()))
        }
        Err(s) => (s, Err(CUDA_ERROR_NOT_FOUND)),
    };
    if !status.is_null() {
        // SAFETY: non-null out pointer from the caller.
        unsafe { put(status, st, CUDA_ERROR_INVALID_VALUE)? };
    }
    res
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: i32,
    flags: u64,
) -> CUresult {
    guard(|| get_proc(symbol, pfn, version, flags, std::ptr::null_mut()))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetProcAddress_v2(
    symbol: *const c_char,
    pfn: *mut *mut c_void,
    version: i32,
    flags: u64,
    status: *mut CUdriverProcAddressQueryResult,
) -> CUresult {
    guard(|| get_proc(symbol, pfn, version, flags, status))
}
