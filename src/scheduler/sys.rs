//! Clock and futex on the shared ledger words.

use std::sync::atomic::AtomicU64;

/// `CLOCK_MONOTONIC` ns: one clock for every process on the host (the
/// library's one clock, `process::clock`).
pub use crate::process::clock::monotonic_ns as now_ns;

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
/// `timeout_ns` (always bounded). Shared (not private) futex: the word lives
/// in a `MAP_SHARED` file mapping used by many processes.
pub fn futex_wait(w: &AtomicU64, expect: u32, timeout_ns: u64) {
    let t = timeout_ns.clamp(1_000, 1_000_000_000);
    let ts = libc::timespec {
        tv_sec: (t / 1_000_000_000) as _,
        tv_nsec: (t % 1_000_000_000) as _,
    };
    // SAFETY: the address is a live, 4-byte aligned word of our mapping; the
    // kernel only reads it; `ts` outlives the call.
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
pub fn futex_wake(w: &AtomicU64) {
    // SAFETY: as in `futex_wait`; FUTEX_WAKE does not touch user memory.
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
