//! GPU core dump settings and callbacks, and asynchronous device
//! notifications. The settings are kept (globally and per context) and read
//! back; callbacks are registered and deregistered. Nothing in the sim ever
//! raises a GPU exception or a notification, so none is ever called, as on a
//! healthy GPU.
//!
//! Core dump attributes (`CUcoredumpSettings`): 1 enable on exception,
//! 2 trigger host, 3 lightweight, 4 enable user trigger (booleans, one
//! byte), 5 file, 6 pipe (NUL-terminated strings), 7 generation flags
//! (`int`). Defaults: off, on, off, off, `core_%t_%h_%p.nvcudmp`,
//! `corepipe.cuda.%h.%p`, 0.

use crate::driver::cu;
use crate::{exports, put, CuRes};
use cgpu_ffi::*;
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::ffi::c_void;
use std::sync::atomic::{AtomicUsize, Ordering::*};
use std::sync::OnceLock;

#[derive(Clone, PartialEq, Debug)]
enum Setting {
    Bool(bool),
    Str(Vec<u8>),
    Int(i32),
}

fn default_setting(attr: u32) -> Option<Setting> {
    Some(match attr {
        1 | 3 | 4 => Setting::Bool(false),
        2 => Setting::Bool(true),
        5 => Setting::Str(b"core_%t_%h_%p.nvcudmp".to_vec()),
        6 => Setting::Str(b"corepipe.cuda.%h.%p".to_vec()),
        7 => Setting::Int(0),
        _ => return None,
    })
}

/// (context handle or 0 for the global settings, attribute) → value.
fn settings() -> &'static Mutex<HashMap<(usize, u32), Setting>> {
    static S: OnceLock<Mutex<HashMap<(usize, u32), Setting>>> = OnceLock::new();
    S.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The scope of a call: the global one, or the current context's.
fn scope(global: bool) -> Result<usize, CUresult> {
    let d = cu()?;
    if global {
        Ok(0)
    } else {
        Ok(d.cur_ctx()?.0)
    }
}

fn get_attr(attr: u32, value: *mut c_void, size: *mut usize, global: bool) -> CuRes {
    let sc = scope(global)?;
    if value.is_null() || size.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let v = {
        let s = settings().lock();
        s.get(&(sc, attr))
            .or_else(|| s.get(&(0, attr)))
            .cloned()
            .or_else(|| default_setting(attr))
            .ok_or(CUDA_ERROR_INVALID_VALUE)?
    };
    // SAFETY: non-null in/out size from the caller.
    let room = unsafe { *size };
    let bytes: Vec<u8> = match v {
        Setting::Bool(b) => vec![b as u8],
        Setting::Int(i) => i.to_ne_bytes().to_vec(),
        Setting::Str(mut s) => {
            s.push(0);
            s
        }
    };
    if room < bytes.len() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: value holds `room` >= bytes.len() bytes by the caller's contract.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), value as *mut u8, bytes.len());
        *size = bytes.len();
    }
    Ok(())
}

fn set_attr(attr: u32, value: *mut c_void, size: *mut usize, global: bool) -> CuRes {
    let sc = scope(global)?;
    if value.is_null() || size.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null size from the caller.
    let n = unsafe { *size };
    let kind = default_setting(attr).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let v = match kind {
        Setting::Bool(_) if n >= 1 => {
            // SAFETY: value holds at least one byte.
            Setting::Bool(unsafe { *(value as *const u8) } != 0)
        }
        Setting::Int(_) if n >= 4 => {
            // SAFETY: value holds at least 4 bytes.
            Setting::Int(unsafe { (value as *const i32).read_unaligned() })
        }
        Setting::Str(_) if (1..=4096).contains(&n) => {
            // SAFETY: value holds n bytes; the string ends at the first NUL.
            let b = unsafe { std::slice::from_raw_parts(value as *const u8, n) };
            Setting::Str(b.iter().take_while(|c| **c != 0).copied().collect())
        }
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    };
    settings().lock().insert((sc, attr), v);
    Ok(())
}

static HANDLES: AtomicUsize = AtomicUsize::new(0);

/// Registered callbacks (core dump start/complete, device notifications).
fn callbacks() -> &'static Mutex<HashSet<(u8, usize)>> {
    static C: OnceLock<Mutex<HashSet<(u8, usize)>>> = OnceLock::new();
    C.get_or_init(|| Mutex::new(HashSet::new()))
}

fn register(kind: u8, f: *const c_void, out: *mut usize) -> CuRes {
    cu()?;
    if f.is_null() || out.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let h = 0x5e00_0000_0000 + (HANDLES.fetch_add(1, Relaxed) + 1) * 0x40;
    callbacks().lock().insert((kind, h));
    // SAFETY: out pointer from the caller (checked non-null).
    unsafe { put(out, h, CUDA_ERROR_INVALID_VALUE) }
}

fn deregister(kind: u8, h: usize) -> CuRes {
    cu()?;
    if callbacks().lock().remove(&(kind, h)) {
        Ok(())
    } else {
        Err(CUDA_ERROR_INVALID_VALUE)
    }
}

const START: u8 = 0;
const COMPLETE: u8 = 1;
const NOTIFY: u8 = 2;

exports! {
    cuCoredumpGetAttribute(attr: u32, value: *mut c_void, size: *mut usize) => get_attr(attr, value, size, false);
    cuCoredumpGetAttributeGlobal(attr: u32, value: *mut c_void, size: *mut usize) => get_attr(attr, value, size, true);
    cuCoredumpSetAttribute(attr: u32, value: *mut c_void, size: *mut usize) => set_attr(attr, value, size, false);
    cuCoredumpSetAttributeGlobal(attr: u32, value: *mut c_void, size: *mut usize) => set_attr(attr, value, size, true);
    cuCoredumpRegisterStartCallback(f: *const c_void, _data: *mut c_void, out: *mut usize) => register(START, f, out);
    cuCoredumpRegisterCompleteCallback(f: *const c_void, _data: *mut c_void, out: *mut usize) => register(COMPLETE, f, out);
    cuCoredumpDeregisterStartCallback(h: usize) => deregister(START, h);
    cuCoredumpDeregisterCompleteCallback(h: usize) => deregister(COMPLETE, h);
    cuDeviceRegisterAsyncNotification(dev: CUdevice, f: *const c_void, _data: *mut c_void, out: *mut usize) => {
        cu()?.check_dev(dev)?;
        register(NOTIFY, f, out)
    };
    cuDeviceUnregisterAsyncNotification(dev: CUdevice, h: usize) => {
        cu()?.check_dev(dev)?;
        deregister(NOTIFY, h)
    };
}
