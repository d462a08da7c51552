//! The JIT linker, `cuLink*`: inputs (PTX, cubins, fat binaries) are
//! collected, and `cuLinkComplete` hands out one fat binary holding them all,
//! which `cuModuleLoadData` loads with every kernel and global of the
//! inputs. Nothing is compiled; an input the sim cannot read keeps the
//! result opaque (every name resolves), and inputs that need a compiler
//! (host objects, libraries, NVVM IR) are refused with
//! `CUDA_ERROR_NOT_SUPPORTED` (counted as a stub).

use crate::driver::{cu, Obj};
use crate::image::{self, FATBIN_MAGIC, KIND_ELF, KIND_PTX};
use crate::{guard, put, read_cstr, CuRes};
use cgpu_ffi::*;
use parking_lot::Mutex;
use std::ffi::{c_char, c_void};
use std::sync::Arc;

/// `CUlinkState`: an opaque handle.
pub type CUlinkState = *mut c_void;

/// `CUjitInputType`.
const INPUT_CUBIN: u32 = 0;
const INPUT_PTX: u32 = 1;
const INPUT_FATBINARY: u32 = 2;

/// A link in progress: the fat binary entries of its inputs so far.
#[derive(Default)]
pub struct LinkState {
    entries: Vec<u8>,
    inputs: usize,
    /// The output of `cuLinkComplete`, alive until `cuLinkDestroy`.
    out: Vec<u8>,
}

fn state(h: usize) -> Result<Arc<Mutex<LinkState>>, CUresult> {
    match cu()?.objs.lock().get(h) {
        Some(Obj::Link(l)) => Ok(Arc::clone(l)),
        _ => Err(CUDA_ERROR_INVALID_HANDLE),
    }
}

/// One fat binary entry (64-byte header, payload padded to 8).
fn entry(kind: u16, payload: &[u8]) -> Vec<u8> {
    let padded = payload.len().div_ceil(8) * 8;
    let mut e = vec![0u8; 64];
    e[0..2].copy_from_slice(&kind.to_le_bytes());
    e[2..4].copy_from_slice(&0x0101u16.to_le_bytes());
    e[4..8].copy_from_slice(&64u32.to_le_bytes());
    e[8..12].copy_from_slice(&(padded as u32).to_le_bytes());
    e.extend_from_slice(payload);
    e.resize(64 + padded, 0);
    e
}

fn add(h: usize, kind: u32, data: &[u8]) -> CuRes {
    let st = state(h)?;
    let bytes = match kind {
        INPUT_PTX => {
            let text = data.split(|c| *c == 0).next().unwrap_or(&[]);
            image::parse_ptx(&String::from_utf8_lossy(text)).ok_or(CUDA_ERROR_INVALID_PTX)?;
            let mut t = text.to_vec();
            t.push(0);
            entry(KIND_PTX, &t)
        }
        INPUT_CUBIN if data.starts_with(b"\x7fELF") => entry(KIND_ELF, data),
        INPUT_FATBINARY if data.get(..4) == Some(&FATBIN_MAGIC.to_le_bytes()[..]) => {
            // Its entries, as they are (compression flags included).
            let hsize = u16::from_le_bytes([data[6], data[7]]) as usize;
            data.get(hsize..).ok_or(CUDA_ERROR_INVALID_IMAGE)?.to_vec()
        }
        INPUT_CUBIN | INPUT_FATBINARY => return Err(CUDA_ERROR_INVALID_IMAGE),
        3..=5 => {
            crate::stub_hit!("cuLinkAddData(object/library/NVVM input)");
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    };
    let mut s = st.lock();
    s.entries.extend_from_slice(&bytes);
    s.inputs += 1;
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLinkCreate_v2(
    _n: u32,
    _opts: *mut u32,
    _vals: *mut *mut c_void,
    out: *mut CUlinkState,
) -> CUresult {
    guard(|| {
        let d = cu()?;
        d.cur_ctx()?;
        if out.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let h = d
            .objs
            .lock()
            .insert(Obj::Link(Arc::new(Mutex::new(LinkState::default()))));
        // SAFETY: out pointer from the caller (checked non-null).
        unsafe { put(out, h as CUlinkState, CUDA_ERROR_INVALID_VALUE) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLinkAddData_v2(
    st: CUlinkState,
    kind: u32,
    data: *mut c_void,
    size: usize,
    _name: *const c_char,
    _n: u32,
    _opts: *mut u32,
    _vals: *mut *mut c_void,
) -> CUresult {
    guard(|| {
        if data.is_null() || size == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: `size` bytes at `data` by the caller's contract.
        add(st as usize, kind, unsafe {
            std::slice::from_raw_parts(data as *const u8, size)
        })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLinkAddFile_v2(
    st: CUlinkState,
    kind: u32,
    path: *const c_char,
    _n: u32,
    _opts: *mut u32,
    _vals: *mut *mut c_void,
) -> CUresult {
    guard(|| {
        // SAFETY: NUL-terminated path from the caller.
        let p = unsafe { read_cstr(path) }.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let bytes = std::fs::read(p).map_err(|_| CUDA_ERROR_FILE_NOT_FOUND)?;
        add(st as usize, kind, &bytes)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLinkComplete(
    st: CUlinkState,
    out: *mut *mut c_void,
    size: *mut usize,
) -> CUresult {
    guard(|| {
        let l = state(st as usize)?;
        if out.is_null() || size.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut s = l.lock();
        if s.inputs == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let mut f = Vec::with_capacity(16 + s.entries.len());
        f.extend_from_slice(&FATBIN_MAGIC.to_le_bytes());
        f.extend_from_slice(&1u16.to_le_bytes());
        f.extend_from_slice(&16u16.to_le_bytes());
        f.extend_from_slice(&(s.entries.len() as u64).to_le_bytes());
        f.extend_from_slice(&s.entries);
        s.out = f;
        // SAFETY: out pointers from the caller (checked non-null); the buffer
        // lives in the link state until cuLinkDestroy.
        unsafe {
            *out = s.out.as_mut_ptr() as *mut c_void;
            *size = s.out.len();
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLinkDestroy(st: CUlinkState) -> CUresult {
    guard(|| {
        let d = cu()?;
        state(st as usize)?;
        d.objs.lock().remove(st as usize);
        Ok(())
    })
}

// CUDA 5.5's variants of the same functions (same arguments).

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLinkCreate(
    n: u32,
    opts: *mut u32,
    vals: *mut *mut c_void,
    out: *mut CUlinkState,
) -> CUresult {
    std::hint::black_box("cuLinkCreate");
    // SAFETY: same contract.
    unsafe { cuLinkCreate_v2(n, opts, vals, out) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLinkAddData(
    st: CUlinkState,
    kind: u32,
    data: *mut c_void,
    size: usize,
    name: *const c_char,
    n: u32,
    opts: *mut u32,
    vals: *mut *mut c_void,
) -> CUresult {
    std::hint::black_box("cuLinkAddData");
    // SAFETY: same contract.
    unsafe { cuLinkAddData_v2(st, kind, data, size, name, n, opts, vals) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLinkAddFile(
    st: CUlinkState,
    kind: u32,
    path: *const c_char,
    n: u32,
    opts: *mut u32,
    vals: *mut *mut c_void,
) -> CUresult {
    std::hint::black_box("cuLinkAddFile");
    // SAFETY: same contract.
    unsafe { cuLinkAddFile_v2(st, kind, path, n, opts, vals) }
}
