//! `cuGetExportTable`: the private tables NVIDIA's CUDA runtime (`libcudart`
//! 12.x/13.x, and the static copies inside cuBLAS and cuBLASLt) asks the
//! driver for before it runs anything. With them, the unmodified runtime —
//! and so PyTorch, TensorFlow, cuBLAS — runs on the sim.
//!
//! A table is an array of pointers; slot 0 holds its size in bytes (the
//! context-local-storage table has no size word). An unknown table id gets
//! `CUDA_ERROR_INVALID_VALUE` and a NULL table. Every slot holds a function:
//! a slot the sim does not implement logs its table and index once, counts
//! as a stub, and returns `CUDA_ERROR_NOT_SUPPORTED` — it never jumps to NULL.
//!
//! | table | slots | what works |
//! |---|---|---|
//! | CUDART_INTERFACE | 13 | [1] [6] [8] load a module from a fat binary, [2] the device's primary context *without* retaining it, [7] no-op, [12] "load compilers" (success) |
//! | TOOLS_RUNTIME_CALLBACK_HOOKS | 7 | [2] a zeroed 1024-byte buffer, [6] a zeroed 14 × u32 buffer |
//! | TOOLS_TLS | 4 | [2] the current context |
//! | CONTEXT_LOCAL_STORAGE | 4 | [0] put, [1] delete, [2] get (per context and key; destructors run when the context dies) |
//! | CONTEXT_CHECKS | 4 | [2] success with 0, [3] 0 |
//! | INTEGRITY_CHECK | 3 | [1] the runtime's integrity check (`crate::integrity`) |
//! | TOOLS_CONTEXT | 95 | [4] the context's id; [39] and [51] success without output (stubs) |
//! | CUPTI | size word 8 | none: CUPTI takes the empty table as a driver without its support |

// The `[n]` in the table above are slot numbers, not links.
#![allow(rustdoc::broken_intra_doc_links)]
use crate::driver::{cu, Obj, CTX_STACK};
use crate::integrity;
use crate::{guard, put};
use cgpu_ffi::*;
use parking_lot::Mutex;
use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering::*};

type Slot = *const c_void;

/// A table as the runtime reads it: `N` pointer-sized words.
#[repr(C)]
pub struct Table<const N: usize>([Slot; N]);

// SAFETY: the tables are immutable after compilation (function addresses and
// a size word); sharing them between threads is sharing constants.
unsafe impl<const N: usize> Sync for Table<N> {}

impl<const N: usize> Table<N> {
    fn ptr(&'static self) -> *const c_void {
        self.0.as_ptr() as *const c_void
    }
}

/// The tables, by index in `NAMES` and `TABLES`.
const CUDART: usize = 0;
const HOOKS: usize = 1;
const TLS: usize = 2;
const CLS: usize = 3;
const CHECKS: usize = 4;
const INTEGRITY: usize = 5;
const TOOLS_CTX: usize = 6;
const CUPTI: usize = 7;

const NAMES: [&str; 8] = [
    "CUDART_INTERFACE",
    "TOOLS_RUNTIME_CALLBACK_HOOKS",
    "TOOLS_TLS",
    "CONTEXT_LOCAL_STORAGE",
    "CONTEXT_CHECKS",
    "INTEGRITY_CHECK",
    "TOOLS_CONTEXT",
    "CUPTI",
];

/// Table ids (the UUID's 16 bytes in the order the runtime passes them).
const IDS: [[u8; 16]; 8] = [
    uuid("6bd5fb6c-5bf4-e74a-8987-d93912fd9df9"),
    uuid("a094798c-2e74-2e74-93f2-0800200c0a66"),
    uuid("42d85a81-23f6-cb47-8298-f6e78a3aecdc"),
    uuid("c693336e-1121-df11-a8c3-68f355d89593"),
    uuid("263e8860-7cd2-6143-92f6-bbd5006dfa7e"),
    uuid("d4082055-bde6-704b-8d34-ba123c66e1f2"),
    uuid("21318c60-9714-3248-8ca6-41ff7324c8f2"),
    uuid("7cb63f9b-9ca4-8e42-a484-beb66e6aed7f"),
];

const fn hex(c: u8) -> u8 {
    match c {
        b'0'..=b'9' => c - b'0',
        b'a'..=b'f' => c - b'a' + 10,
        _ => panic!("bad hex digit"),
    }
}

/// `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` → its 16 bytes, in text order.
const fn uuid(s: &str) -> [u8; 16] {
    let b = s.as_bytes();
    let mut out = [0u8; 16];
    let (mut i, mut o) = (0, 0);
    while i < b.len() {
        if b[i] == b'-' {
            i += 1;
            continue;
        }
        out[o] = hex(b[i]) << 4 | hex(b[i + 1]);
        o += 1;
        i += 2;
    }
    out
}

// ------------------------------------------------------------ missing slots

/// Whether (table, index) was already reported.
static REPORTED: [[AtomicBool; 96]; 8] = [const { [const { AtomicBool::new(false) }; 96] }; 8];

fn missing_slot(table: usize, index: usize) -> CUresult {
    let name = NAMES[table];
    if !REPORTED[table][index].swap(true, Relaxed) {
        eprintln!(
            "cgpu-sim: cuGetExportTable: {name} slot {index} is not simulated (CUDA_ERROR_NOT_SUPPORTED)"
        );
    }
    crate::stubs::hit_named(&format!("{name}[{index}]"));
    CUDA_ERROR_NOT_SUPPORTED
}

/// A slot the sim does not implement: one function per (table, index), so
/// that a call says which slot it was.
unsafe extern "C" fn missing<const T: usize, const I: usize>() -> CUresult {
    guard(|| Err(missing_slot(T, I)))
}

macro_rules! missing_row {
    ($t:expr; $($i:literal)*) => {
        [$(missing::<{ $t }, $i> as Slot),*]
    };
}

/// A table of `N` missing slots, with `size` words of it counted in slot 0
/// (0: no size word).
const fn base<const N: usize>(all: [Slot; 96], with_size: bool) -> [Slot; N] {
    let mut t = [std::ptr::null(); N];
    let mut i = 0;
    while i < N {
        t[i] = all[i];
        i += 1;
    }
    if with_size {
        t[0] = (N * std::mem::size_of::<Slot>()) as Slot;
    }
    t
}

const fn set<const N: usize>(mut t: [Slot; N], i: usize, f: Slot) -> [Slot; N] {
    t[i] = f;
    t
}

macro_rules! all_missing {
    ($t:expr) => {
        missing_row!($t;
            0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29
            30 31 32 33 34 35 36 37 38 39 40 41 42 43 44 45 46 47 48 49 50 51 52 53 54 55 56 57 58 59
            60 61 62 63 64 65 66 67 68 69 70 71 72 73 74 75 76 77 78 79 80 81 82 83 84 85 86 87 88 89
            90 91 92 93 94 95)
    };
}

// -------------------------------------------------------------- the tables

static CUDART_TABLE: Table<13> = Table({
    let t = base::<13>(all_missing!(CUDART), true);
    let t = set(t, 1, cudart_module_from_fatbin as Slot);
    let t = set(t, 2, cudart_primary_ctx as Slot);
    let t = set(t, 6, cudart_module_from_fatbin_ext as Slot);
    let t = set(t, 7, cudart_noop as Slot);
    let t = set(t, 8, cudart_module_from_fatbin_header as Slot);
    set(t, 12, cudart_load_compilers as Slot)
});

static HOOKS_TABLE: Table<7> = Table({
    let t = base::<7>(all_missing!(HOOKS), true);
    let t = set(t, 2, hooks_buffer_1024 as Slot);
    set(t, 6, hooks_buffer_14 as Slot)
});

static TLS_TABLE: Table<4> = Table({
    let t = base::<4>(all_missing!(TLS), true);
    set(t, 2, tls_current_ctx as Slot)
});

static CLS_TABLE: Table<4> = Table({
    let t = base::<4>(all_missing!(CLS), false);
    let t = set(t, 0, cls_put as Slot);
    let t = set(t, 1, cls_delete as Slot);
    set(t, 2, cls_get as Slot)
});

static CHECKS_TABLE: Table<4> = Table({
    let t = base::<4>(all_missing!(CHECKS), true);
    let t = set(t, 2, checks_context as Slot);
    set(t, 3, checks_zero as Slot)
});

static INTEGRITY_TABLE: Table<3> = Table({
    let t = base::<3>(all_missing!(INTEGRITY), true);
    set(t, 1, integrity_check as Slot)
});

static TOOLS_CTX_TABLE: Table<95> = Table({
    let t = base::<95>(all_missing!(TOOLS_CTX), true);
    let t = set(t, 4, tools_ctx_id as Slot);
    let t = set(t, 39, tools_ctx_39 as Slot);
    set(t, 51, tools_ctx_51 as Slot)
});

/// The table CUPTI (NVIDIA's profiling library) asks for: its size word
/// counts no function (slot 0 alone), which CUPTI 13 takes as a driver
/// without its support (every CUPTI call then fails with
/// `CUPTI_ERROR_UNKNOWN`, and CUDA goes on working). Refusing the id made
/// CUPTI 13.2 ask again and again until its stack overflowed. Slots past
/// the size word still hold functions that fail cleanly, for a reader that
/// does not check the size.
static CUPTI_TABLE: Table<96> = Table({
    let mut t = all_missing!(CUPTI);
    t[0] = std::mem::size_of::<Slot>() as Slot;
    t
});

fn table(i: usize) -> *const c_void {
    match i {
        CUDART => CUDART_TABLE.ptr(),
        HOOKS => HOOKS_TABLE.ptr(),
        TLS => TLS_TABLE.ptr(),
        CLS => CLS_TABLE.ptr(),
        CHECKS => CHECKS_TABLE.ptr(),
        INTEGRITY => INTEGRITY_TABLE.ptr(),
        CUPTI => CUPTI_TABLE.ptr(),
        _ => TOOLS_CTX_TABLE.ptr(),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetExportTable(
    table_out: *mut *const c_void,
    id: *const [u8; 16],
) -> CUresult {
    guard(|| {
        if table_out.is_null() || id.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: a CUuuid (16 bytes) from the caller (checked non-null).
        let id = unsafe { id.read_unaligned() };
        let found = IDS.iter().position(|u| *u == id);
        crate::driver::trace(format_args!(
            "cuGetExportTable({}) -> {}",
            id.iter().map(|b| format!("{b:02x}")).collect::<String>(),
            found
                .map(|i| NAMES[i])
                .unwrap_or("unknown: CUDA_ERROR_INVALID_VALUE")
        ));
        let t = found.map(table).unwrap_or(std::ptr::null());
        // SAFETY: non-null out pointer from the caller.
        unsafe { *table_out = t };
        if t.is_null() {
            Err(CUDA_ERROR_INVALID_VALUE)
        } else {
            Ok(())
        }
    })
}

// --------------------------------------------------------- CUDART_INTERFACE

/// [1] `(CUmodule *out, const wrapper *fatbin)`: loads a module.
unsafe extern "C" fn cudart_module_from_fatbin(
    out: *mut CUmodule,
    fatbin: *const c_void,
) -> CUresult {
    guard(|| {
        // SAFETY: the runtime's contract for this slot.
        unsafe { super::cuModuleLoadData(out, fatbin) }.into_result()
    })
}

/// [6] `(CUmodule *out, const wrapper *fatbin, void *, void *, u32)`.
unsafe extern "C" fn cudart_module_from_fatbin_ext(
    out: *mut CUmodule,
    fatbin: *const c_void,
    _a: *mut c_void,
    _b: *mut c_void,
    _c: u32,
) -> CUresult {
    guard(|| {
        // SAFETY: the runtime's contract for this slot.
        unsafe { super::cuModuleLoadData(out, fatbin) }.into_result()
    })
}

/// [8] `(const fatbin header *, CUmodule *out, void *, void *, u32)`.
unsafe extern "C" fn cudart_module_from_fatbin_header(
    fatbin: *const c_void,
    out: *mut CUmodule,
    _a: *mut c_void,
    _b: *mut c_void,
    _c: u32,
) -> CUresult {
    guard(|| {
        // SAFETY: the runtime's contract for this slot.
        unsafe { super::cuModuleLoadData(out, fatbin) }.into_result()
    })
}

/// [2] `(CUcontext *out, CUdevice)`: the primary context, not retained (it
/// may be inactive: `cuCtxSetCurrent` accepts it, and the runtime retains it
/// right after).
unsafe extern "C" fn cudart_primary_ctx(out: *mut CUcontext, dev: CUdevice) -> CUresult {
    guard(|| {
        let d = cu()?;
        if out.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let i = d.check_dev(dev)?;
        let h = super::context::primary_handle(d, i);
        // SAFETY: out pointer from the caller (checked non-null).
        unsafe { put(out, h as CUcontext, CUDA_ERROR_INVALID_VALUE) }
    })
}

/// [7] `(size_t)`: nothing to do.
unsafe extern "C" fn cudart_noop(_x: usize) -> CUresult {
    guard(|| Ok(()))
}

/// [12] `()`: load the JIT compilers (CUDA 13.1+); nothing to load.
unsafe extern "C" fn cudart_load_compilers() -> CUresult {
    guard(|| Ok(()))
}

// ----------------------------------------------- TOOLS_RUNTIME_CALLBACK_HOOKS

/// A writable zeroed buffer handed to the runtime once for the process,
/// followed by zeroed padding: the runtime reads past the size it is given
/// (filling the bytes after a buffer with 0xff makes cudart 12.9 call hook
/// slots 1, 3 and 4), so what follows must read as "no tool attached", not
/// as whatever static the linker put there.
#[repr(C, align(16))]
struct Buffer<const N: usize>(UnsafeCell<[u8; N]>, UnsafeCell<[u8; 4096]>);

// SAFETY: we never read or write the buffer; the runtime owns its contents.
unsafe impl<const N: usize> Sync for Buffer<N> {}

static HOOK_BUF_1024: Buffer<1024> = Buffer(UnsafeCell::new([0; 1024]), UnsafeCell::new([0; 4096]));
static HOOK_BUF_14: Buffer<56> = Buffer(UnsafeCell::new([0; 56]), UnsafeCell::new([0; 4096]));

unsafe fn hand_out<const N: usize>(b: &'static Buffer<N>, buf: *mut *mut c_void, size: *mut usize) {
    if !buf.is_null() {
        // SAFETY: non-null out pointer from the caller.
        unsafe { *buf = b.0.get() as *mut c_void };
    }
    if !size.is_null() {
        // SAFETY: non-null out pointer from the caller.
        unsafe { *size = N };
    }
}

/// [2] `(void **buf, size_t *size)`: a 1024-byte buffer.
unsafe extern "C" fn hooks_buffer_1024(buf: *mut *mut c_void, size: *mut usize) -> CUresult {
    guard(|| {
        // SAFETY: out pointers per the slot's contract.
        unsafe { hand_out(&HOOK_BUF_1024, buf, size) };
        Ok(())
    })
}

/// [6] `(void **buf, size_t *size)`: a 14 × u32 buffer.
unsafe extern "C" fn hooks_buffer_14(buf: *mut *mut c_void, size: *mut usize) -> CUresult {
    guard(|| {
        // SAFETY: out pointers per the slot's contract.
        unsafe { hand_out(&HOOK_BUF_14, buf, size) };
        Ok(())
    })
}

// ---------------------------------------------------------------- TOOLS_TLS

fn current_ctx() -> usize {
    CTX_STACK.with(|s| s.borrow().last().copied()).unwrap_or(0)
}

/// [2] `(CUcontext *out)`: the calling thread's current context (NULL if none).
unsafe extern "C" fn tls_current_ctx(out: *mut CUcontext) -> CUresult {
    guard(|| {
        cu()?;
        // SAFETY: out pointer from the caller.
        unsafe { put(out, current_ctx() as CUcontext, CUDA_ERROR_INVALID_VALUE) }
    })
}

// ---------------------------------------------------- CONTEXT_LOCAL_STORAGE

/// `void dtor(CUcontext, void *key, void *value)`.
pub type ClsDtor = Option<unsafe extern "C" fn(CUcontext, *mut c_void, *mut c_void)>;

/// (context, key) → (value, destructor).
type ClsMap = HashMap<(usize, usize), (usize, ClsDtor)>;

/// Per-(context, key) values stored by the runtime.
static CLS_STORE: Mutex<Option<ClsMap>> = Mutex::new(None);

/// A context handle: NULL means the current one; any context object of ours
/// (the inactive primary context included).
fn cls_ctx(ctx: CUcontext) -> Result<usize, CUresult> {
    let d = cu()?;
    let h = if ctx.is_null() {
        current_ctx()
    } else {
        ctx as usize
    };
    match d.objs.lock().get(h) {
        Some(Obj::Ctx(_)) => Ok(h),
        _ => Err(CUDA_ERROR_INVALID_CONTEXT),
    }
}

/// [0] `(ctx, key, value, dtor)`: stores `value` under (ctx, key).
unsafe extern "C" fn cls_put(
    ctx: CUcontext,
    key: *mut c_void,
    value: *mut c_void,
    dtor: ClsDtor,
) -> CUresult {
    guard(|| {
        let h = cls_ctx(ctx)?;
        CLS_STORE
            .lock()
            .get_or_insert_with(HashMap::new)
            .insert((h, key as usize), (value as usize, dtor));
        Ok(())
    })
}

/// [1] `(ctx, key)`: removes the value (its destructor does not run).
unsafe extern "C" fn cls_delete(ctx: CUcontext, key: *mut c_void) -> CUresult {
    guard(|| {
        let h = cls_ctx(ctx)?;
        match CLS_STORE
            .lock()
            .as_mut()
            .and_then(|m| m.remove(&(h, key as usize)))
        {
            Some(_) => Ok(()),
            None => Err(CUDA_ERROR_NOT_FOUND),
        }
    })
}

/// [2] `(void **value, ctx, key)`: the value, or an error when absent.
unsafe extern "C" fn cls_get(
    value: *mut *mut c_void,
    ctx: CUcontext,
    key: *mut c_void,
) -> CUresult {
    guard(|| {
        let h = cls_ctx(ctx)?;
        let v = CLS_STORE
            .lock()
            .as_ref()
            .and_then(|m| m.get(&(h, key as usize)).map(|e| e.0))
            .ok_or(CUDA_ERROR_NOT_FOUND)?;
        // SAFETY: out pointer from the caller.
        unsafe { put(value, v as *mut c_void, CUDA_ERROR_INVALID_VALUE) }
    })
}

/// Runs and forgets the destructors of context `ctx`'s values (the context
/// is being destroyed, or the primary context reset). Called with no lock
/// of ours held: a destructor may call the driver.
pub fn cls_context_gone(ctx: usize) {
    let gone: Vec<((usize, usize), (usize, ClsDtor))> = match CLS_STORE.lock().as_mut() {
        Some(m) => {
            let keys: Vec<(usize, usize)> = m.keys().filter(|k| k.0 == ctx).copied().collect();
            keys.into_iter()
                .filter_map(|k| m.remove(&k).map(|v| (k, v)))
                .collect()
        }
        None => return,
    };
    for ((c, key), (value, dtor)) in gone {
        if let Some(f) = dtor {
            // SAFETY: the destructor the runtime registered for this value,
            // called with the arguments it registered.
            unsafe { f(c as CUcontext, key as *mut c_void, value as *mut c_void) };
        }
    }
}

// ----------------------------------------------------------- CONTEXT_CHECKS

/// [2] `(ctx, u32 *out, void **)`: nothing to report (0).
unsafe extern "C" fn checks_context(
    _ctx: CUcontext,
    out: *mut u32,
    _p: *mut *mut c_void,
) -> CUresult {
    guard(|| {
        if !out.is_null() {
            // SAFETY: non-null out pointer from the caller.
            unsafe { *out = 0 };
        }
        Ok(())
    })
}

/// [3] `()`: 0.
unsafe extern "C" fn checks_zero() -> u32 {
    0
}

// ---------------------------------------------------------- INTEGRITY_CHECK

/// [1] `(u32 version, u64 unix_seconds, u64 out[2])`.
unsafe extern "C" fn integrity_check(
    version: u32,
    unix_seconds: u64,
    out: *mut [u64; 2],
) -> CUresult {
    guard(|| {
        let d = cu()?;
        if out.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let devices: Vec<integrity::DeviceId> = d
            .devs
            .iter()
            .enumerate()
            .map(|(i, dev)| {
                let attr = |a| super::device::attribute(dev, i, a).unwrap_or(0);
                integrity::DeviceId {
                    uuid: dev.uuid_bytes,
                    pci_domain: attr(CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID),
                    pci_bus: attr(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID),
                    pci_device: attr(CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID),
                }
            })
            .collect();
        let inputs = integrity::Inputs {
            driver_version: d.cfg.driver_version as u32,
            version,
            pid: std::process::id(),
            // SAFETY: pthread_self has no preconditions.
            thread: unsafe { libc::pthread_self() } as u32,
            cudart_table: CUDART_TABLE.ptr() as u64,
            integrity_table: INTEGRITY_TABLE.ptr() as u64,
            function: integrity_check as *const c_void as u64,
            unix_seconds,
        };
        // SAFETY: out pointer from the caller (checked non-null).
        unsafe { out.write_unaligned(integrity::answer(&inputs, &devices)) };
        Ok(())
    })
}

// ------------------------------------------------------------ TOOLS_CONTEXT

/// [4] `(ctx, u64 *id)`: the context's id, as `cuCtxGetId`.
unsafe extern "C" fn tools_ctx_id(ctx: CUcontext, id: *mut u64) -> CUresult {
    // SAFETY: same contract as cuCtxGetId.
    unsafe { super::cuCtxGetId(ctx, id) }
}

/// [39] `(ctx, ptr, out*, 0, 0, 1)`: success, nothing written (a stub).
unsafe extern "C" fn tools_ctx_39(
    _c: CUcontext,
    _p: *mut c_void,
    _o: *mut c_void,
    _a: u64,
    _b: u64,
    _e: u64,
) -> CUresult {
    guard(|| {
        crate::stub_hit!("TOOLS_CONTEXT[39]");
        Ok(())
    })
}

/// [51] `(ctx, stream, out*)`: success, nothing written (a stub).
unsafe extern "C" fn tools_ctx_51(_c: CUcontext, _s: CUstream, _o: *mut c_void) -> CUresult {
    guard(|| {
        crate::stub_hit!("TOOLS_CONTEXT[51]");
        Ok(())
    })
}

trait IntoResult {
    fn into_result(self) -> Result<(), CUresult>;
}

impl IntoResult for CUresult {
    fn into_result(self) -> Result<(), CUresult> {
        if self == CUDA_SUCCESS {
            Ok(())
        } else {
            Err(self)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_sizes() {
        assert_eq!(IDS[CUDART][..4], [0x6b, 0xd5, 0xfb, 0x6c]);
        assert_eq!(IDS[TOOLS_CTX][15], 0xf2);
        assert_eq!(CUDART_TABLE.0[0] as usize, 13 * 8);
        assert_eq!(TOOLS_CTX_TABLE.0[0] as usize, 95 * 8);
        assert_eq!(INTEGRITY_TABLE.0[0] as usize, 3 * 8);
        // CUPTI's table counts no function, yet no slot is NULL.
        assert_eq!(CUPTI_TABLE.0[0] as usize, 8);
        assert!(CUPTI_TABLE.0[1..].iter().all(|p| !p.is_null()));
        // The CLS table has no size word: slot 0 is `put`.
        assert_eq!(CLS_TABLE.0[0], cls_put as Slot);
        // No slot is NULL, and unimplemented ones are distinct functions.
        for t in [
            &TOOLS_CTX_TABLE.0[..],
            &CUDART_TABLE.0[..],
            &HOOKS_TABLE.0[..],
        ] {
            assert!(t.iter().all(|p| !p.is_null()));
        }
        assert_ne!(TOOLS_CTX_TABLE.0[5], TOOLS_CTX_TABLE.0[6]);
    }
}
