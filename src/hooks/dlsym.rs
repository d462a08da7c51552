//! Our `dlsym` export: clients that `dlopen` the driver and resolve functions
//! on their own handle (ctypes, pynvml, TensorFlow, `nvidia-smi`) get our
//! hooks, which plain symbol interposition cannot give them.
//!
//! - Every name we do not hook (anything not in the `api!` list, `cu*` and
//!   `nvml*` names included) and every `RTLD_NEXT` lookup: a tail jump
//!   (x86-64, aarch64) to the real `dlsym`, so glibc sees the caller's own
//!   return address. It decides "next" for `RTLD_NEXT`, and the scope of
//!   `RTLD_DEFAULT` (a library loaded `RTLD_LOCAL` finds its own symbols),
//!   from that address: the answer is exactly what it would have been
//!   without us. No allocation, no lock, no recursion (Rust's std and libc
//!   resolve weak symbols through `dlsym`).
//! - Names we hook: forwarded; when the real result is non-null and is
//!   the real driver's function of a name we hook (or our own export, for
//!   `RTLD_DEFAULT`), our hook is returned instead. A same-named function of
//!   some other library is left alone.

use std::ffi::{c_char, c_void, CStr};

use crate::driver;

/// The body of `dlsym` (reached from the trampoline for every handle but
/// `RTLD_NEXT`).
///
/// # Safety
/// `dlsym`'s contract: `name` is NULL or a NUL-terminated string.
pub unsafe extern "C" fn dlsym_impl(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    let Some(real) = driver::real_dlsym() else {
        return std::ptr::null_mut();
    };
    // SAFETY: forwarded with the caller's own arguments.
    let r = unsafe { real(handle, name) };
    if r.is_null() || name.is_null() {
        return r;
    }
    // SAFETY: name is NUL-terminated; we read at most up to its NUL.
    let is_ours = unsafe {
        let b0 = *name as u8;
        let b1 = if b0 != 0 { *name.add(1) as u8 } else { 0 };
        match (b0, b1) {
            (b'c', b'u') => true,
            (b'n', b'v') => *name.add(2) as u8 == b'm' && *name.add(3) as u8 == b'l',
            _ => false,
        }
    };
    if !is_ours {
        return r;
    }
    // SAFETY: name is a NUL-terminated string (dlsym's contract).
    let bytes = unsafe { CStr::from_ptr(name) }.to_bytes();
    match std::panic::catch_unwind(|| substitute(bytes, r)) {
        Ok(p) => p,
        Err(_) => r,
    }
}

/// Our hook for `name` if `r` is the driver's function of that name (or our
/// export). While a quota is asked for, also when `r` is a same-named
/// function of another library (a driver the program opened by another
/// path, or the system's while `CGPU_REAL_LIBCUDA` names something
/// unusable): every path to a GPU goes through the hooks then, which
/// answer with an error rather than let an unaccounted driver through.
pub fn substitute(name: &[u8], r: *mut c_void) -> *mut c_void {
    match super::hook_by_name(name) {
        Some((ours, real)) if r == ours || real.addr() == r as usize => ours,
        Some((ours, _)) if crate::memory::tracking() => ours,
        _ => r,
    }
}

/// Does cgpu hook `name` (a `cu*`/`nvml*` function in the `api!` list)?
/// Called from the trampoline before anything else: no allocation, no lock,
/// no panic (a NULL name is "no").
///
/// # Safety
/// `name` is NULL or a NUL-terminated string (`dlsym`'s contract).
pub unsafe extern "C" fn dlsym_name_is_hooked(name: *const c_char) -> bool {
    if name.is_null() {
        return false;
    }
    // SAFETY: name is NUL-terminated; we read at most up to its NUL.
    let prefix = unsafe {
        let b0 = *name as u8;
        let b1 = if b0 != 0 { *name.add(1) as u8 } else { 0 };
        match (b0, b1) {
            (b'c', b'u') => true,
            (b'n', b'v') => *name.add(2) as u8 == b'm' && *name.add(3) as u8 == b'l',
            _ => false,
        }
    };
    if !prefix {
        return false;
    }
    // SAFETY: as above.
    let bytes = unsafe { CStr::from_ptr(name) }.to_bytes();
    super::hook_by_name(bytes).is_some()
}

#[cfg(target_arch = "x86_64")]
/// Exported `dlsym`: a trampoline that keeps the caller's return address.
///
/// Every name cgpu does not hook, and every `RTLD_NEXT` lookup, is a tail
/// jump to the real `dlsym`, which then sees the caller's own return
/// address: glibc decides `RTLD_NEXT` and the scope of `RTLD_DEFAULT` (a
/// library loaded `RTLD_LOCAL` finds its own symbols) from it, so the
/// answer is exactly what it would have been without cgpu. Only names we
/// hook go to the body.
///
/// # Safety
/// `dlsym`'s contract.
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    core::arch::naked_asm!(
        // RTLD_NEXT (-1): straight to the real dlsym.
        "cmp rdi, -1",
        "je 3f",
        // Ask whether we hook `name`, keeping both arguments. Entry rsp is
        // 8 mod 16; two pushes and 8 bytes make it 16-aligned for the call.
        "push rdi",
        "push rsi",
        "sub rsp, 8",
        "mov rdi, rsi",
        "call {hooked}",
        "add rsp, 8",
        "pop rsi",
        "pop rdi",
        "test al, al",
        "jnz 2f",
        "3:",
        "mov rax, qword ptr [rip + {real}]",
        "test rax, rax",
        "jz 2f",
        "jmp rax",
        "2:",
        "jmp {body}",
        real = sym driver::REAL_DLSYM,
        hooked = sym dlsym_name_is_hooked,
        body = sym dlsym_impl,
    )
}

#[cfg(target_arch = "aarch64")]
/// Exported `dlsym`: a trampoline that keeps the caller's return address
/// (see the x86-64 version).
///
/// # Safety
/// `dlsym`'s contract.
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    core::arch::naked_asm!(
        "cmn x0, #1",
        "b.eq 3f",
        // Keep x0, x1 and the return address (x30) across the call.
        "stp x0, x1, [sp, #-32]!",
        "str x30, [sp, #16]",
        "mov x0, x1",
        "bl {hooked}",
        "and w9, w0, #0xff",
        "ldr x30, [sp, #16]",
        "ldp x0, x1, [sp], #32",
        "cbnz w9, 2f",
        "3:",
        "adrp x16, {real}",
        "ldr x16, [x16, :lo12:{real}]",
        "cbz x16, 2f",
        "br x16",
        "2:",
        "b {body}",
        real = sym driver::REAL_DLSYM,
        hooked = sym dlsym_name_is_hooked,
        body = sym dlsym_impl,
    )
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
/// Exported `dlsym` (no trampoline on this architecture: `RTLD_NEXT` is
/// answered as seen from libcgpu).
///
/// # Safety
/// `dlsym`'s contract.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void {
    // SAFETY: same contract.
    unsafe { dlsym_impl(handle, name) }
}
