//! Futex waits and wakes on a shared ledger word's low half (the token's
//! sequence number). Shared, not private, futexes: the word lives in a
//! `MAP_SHARED` file mapping used by many processes. A waiter may map the
//! file read-only (a tenant in secure mode): the kernel only reads the word.

use std::sync::atomic::AtomicU64;

/// The low 32 bits of a shared `AtomicU64` (the token's sequence number).
fn low_half(w: &AtomicU64) -> *const u32 {
    let p = w as *const AtomicU64 as *const u32;
    if cfg!(target_endian = "little") {
        p
    } else {
        p.wrapping_add(1)
    }
}

/// Sleep until the low half of `w` differs from `expect`, a wake-up, or
/// `timeout_ns` (always bounded: at least 1 µs, at most 1 s).
pub fn wait(w: &AtomicU64, expect: u32, timeout_ns: u64) {
    let t = timeout_ns.clamp(1_000, 1_000_000_000);
    let ts = libc::timespec {
        tv_sec: (t / 1_000_000_000) as _,
        tv_nsec: (t % 1_000_000_000) as _,
    };
    // SAFETY: the address is a live, 4-byte aligned word of the caller's
    // mapping; the kernel only reads it; `ts` outlives the call.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            low_half(w),
            libc::FUTEX_WAIT,
            expect,
            &ts as *const libc::timespec,
            0usize,
            0u32,
        );
    }
}

/// Wake every waiter on `w`.
pub fn wake(w: &AtomicU64) {
    // SAFETY: as in `wait`; FUTEX_WAKE does not touch user memory.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            low_half(w),
            libc::FUTEX_WAKE,
            i32::MAX,
            0usize,
            0usize,
            0u32,
        );
    }
}
