//! Driver logs (`cuLogs*`, CUDA 12.9): every CUDA call that fails (other
//! than with `CUDA_ERROR_NOT_READY`, the answer of a query, not an error)
//! logs one error message, `CUDA_ERROR_<NAME>: <description>`. Messages go
//! to every registered callback, at once, on the failing thread, and into a
//! buffer of at most 25600 bytes (the driver's size; the oldest are dropped)
//! that `cuLogsDumpToMemory`/`cuLogsDumpToFile` copy out from an iterator
//! (`cuLogsCurrent`: the next message's number).

use crate::{guard, read_cstr, CuRes};
use cgpu_ffi::*;
use parking_lot::Mutex;
use std::cell::Cell;
use std::collections::VecDeque;
use std::ffi::{c_char, c_void};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

/// The driver keeps this many bytes of messages.
const BUFFER_BYTES: usize = 25600;
const CU_LOG_LEVEL_ERROR: u32 = 0;

type Callback = unsafe extern "C" fn(*mut c_void, u32, *const c_char, usize);

struct Logs {
    /// Messages still buffered: (number, text without newline).
    msgs: VecDeque<(u32, String)>,
    bytes: usize,
    /// Number of the next message.
    next: u32,
    /// Registered callbacks: (handle, function, user data).
    callbacks: Vec<(usize, usize, usize)>,
}

static LOGS: Mutex<Logs> = Mutex::new(Logs {
    msgs: VecDeque::new(),
    bytes: 0,
    next: 0,
    callbacks: Vec::new(),
});
static NEXT_HANDLE: AtomicUsize = AtomicUsize::new(1);

thread_local! {
    /// Set while this thread runs a log callback: a failing call made by
    /// the callback is not logged again (no recursion).
    static IN_CALLBACK: Cell<bool> = const { Cell::new(false) };
}

/// A CUDA call returned `r` (not success): log it.
pub fn failed(r: CUresult) {
    if r == CUDA_ERROR_NOT_READY || IN_CALLBACK.with(|c| c.get()) {
        return;
    }
    let (name, desc) = CU_RESULTS
        .iter()
        .find(|(v, _, _)| *v == r)
        .map(|(_, n, d)| (*n, super::init::short_string(r).unwrap_or(d)))
        .unwrap_or(("CUDA_ERROR_UNKNOWN", "unknown error"));
    let msg = format!("{name}: {desc}");
    let callbacks = {
        let mut l = LOGS.lock();
        let n = l.next;
        l.next = n.wrapping_add(1);
        l.bytes += msg.len() + 1;
        l.msgs.push_back((n, msg.clone()));
        while l.bytes > BUFFER_BYTES {
            match l.msgs.pop_front() {
                Some((_, m)) => l.bytes -= m.len() + 1,
                None => break,
            }
        }
        l.callbacks.clone()
    };
    if callbacks.is_empty() {
        return;
    }
    let text = std::ffi::CString::new(msg).unwrap_or_default();
    IN_CALLBACK.with(|c| c.set(true));
    for (_, f, user) in callbacks {
        // SAFETY: `f` was registered as a CUlogsCallback; the message is a
        // NUL-terminated string that lives across the call.
        unsafe {
            let f: Callback = std::mem::transmute::<usize, Callback>(f);
            f(
                user as *mut c_void,
                CU_LOG_LEVEL_ERROR,
                text.as_ptr(),
                text.as_bytes().len(),
            );
        }
    }
    IN_CALLBACK.with(|c| c.set(false));
}

/// The text from message `from` (all buffered ones: `None`) to the newest,
/// one message per line; a first line says if older messages were lost. The
/// iterator moves past the newest.
fn collect(iter: *mut u32) -> Vec<String> {
    let l = LOGS.lock();
    // SAFETY: NULL or the caller's iterator.
    let from = (!iter.is_null()).then(|| unsafe { iter.read_unaligned() });
    let oldest = l.msgs.front().map(|m| m.0).unwrap_or(l.next);
    let mut out = Vec::new();
    if let Some(f) = from {
        if l.next.wrapping_sub(f) > l.next.wrapping_sub(oldest) {
            out.push("[earlier log messages were overwritten]".to_string());
        }
    }
    out.extend(
        l.msgs
            .iter()
            .filter(|(n, _)| from.is_none_or(|f| n.wrapping_sub(f) < l.next.wrapping_sub(f)))
            .map(|(_, m)| m.clone()),
    );
    if !iter.is_null() {
        // SAFETY: as above.
        unsafe { iter.write_unaligned(l.next) };
    }
    out
}

fn dump_to_memory(iter: *mut u32, buf: *mut c_char, size: *mut usize, flags: u32) -> CuRes {
    if buf.is_null() || size.is_null() || flags != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null pointer from the caller.
    let cap = unsafe { size.read_unaligned() };
    let mut msgs = collect(iter);
    let len = |m: &[String]| m.iter().map(|s| s.len() + 1).sum::<usize>();
    let note = "[not all log messages fit in the buffer]".to_string();
    let mut cut = false;
    // Keep the newest messages that fit (with a first line saying so).
    while !msgs.is_empty() && len(&msgs) + if cut { note.len() + 1 } else { 0 } + 1 > cap {
        msgs.remove(0);
        cut = true;
    }
    if cut {
        if msgs.is_empty() {
            // SAFETY: as above.
            unsafe { size.write_unaligned(0) };
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        msgs.insert(0, note);
    }
    let text: String = msgs.iter().map(|m| format!("{m}\n")).collect();
    if cap > 0 {
        // SAFETY: `buf` holds `cap` > text.len() bytes (checked above).
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), buf as *mut u8, text.len());
            *buf.add(text.len()) = 0;
        }
    }
    // SAFETY: as above.
    unsafe { size.write_unaligned(text.len()) };
    Ok(())
}

fn dump_to_file(iter: *mut u32, path: *const c_char, flags: u32) -> CuRes {
    if flags != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: NULL or a NUL-terminated path from the caller.
    let path = unsafe { read_cstr(path) }.ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let text: String = collect(iter).iter().map(|m| format!("{m}\n")).collect();
    std::fs::write(path, text).map_err(|_| CUDA_ERROR_INVALID_VALUE)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLogsRegisterCallback(
    callback: Option<Callback>,
    user: *mut c_void,
    handle: *mut *mut c_void,
) -> CUresult {
    crate::version_gate!("cuLogsRegisterCallback");
    guard(|| {
        let f = callback.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let h = NEXT_HANDLE.fetch_add(1, Relaxed);
        LOGS.lock().callbacks.push((h, f as usize, user as usize));
        if !handle.is_null() {
            // SAFETY: non-null out pointer from the caller.
            unsafe { *handle = h as *mut c_void };
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLogsUnregisterCallback(handle: *mut c_void) -> CUresult {
    crate::version_gate!("cuLogsUnregisterCallback");
    guard(|| {
        let mut l = LOGS.lock();
        let n = l.callbacks.len();
        l.callbacks.retain(|c| c.0 != handle as usize);
        if l.callbacks.len() == n {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLogsCurrent(iter: *mut u32, flags: u32) -> CUresult {
    crate::version_gate!("cuLogsCurrent");
    guard(|| {
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let next = LOGS.lock().next;
        // SAFETY: out pointer from the caller.
        unsafe { crate::put(iter, next, CUDA_ERROR_INVALID_VALUE) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLogsDumpToMemory(
    iter: *mut u32,
    buf: *mut c_char,
    size: *mut usize,
    flags: u32,
) -> CUresult {
    crate::version_gate!("cuLogsDumpToMemory");
    guard(|| dump_to_memory(iter, buf, size, flags))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLogsDumpToFile(
    iter: *mut u32,
    path: *const c_char,
    flags: u32,
) -> CUresult {
    crate::version_gate!("cuLogsDumpToFile");
    guard(|| dump_to_file(iter, path, flags))
}
