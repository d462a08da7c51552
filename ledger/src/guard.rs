//! Surviving what other processes do to a mapped ledger file.
//!
//! The ledger directory is shared: another container, a buggy tool or an
//! operator can truncate, shrink or rewrite a ledger file while jobs have it
//! mapped. Touching a mapped page past the end of a shrunk file raises
//! `SIGBUS`, which would kill the job. So every ledger mapping is registered
//! here, and a `SIGBUS` handler (installed once, chaining to whatever
//! handler the program had) replaces a registered mapping that faults with
//! private anonymous memory of the same size, marks it damaged, and returns:
//! the faulting access is retried on that memory and the job goes on. The
//! owner of the mapping sees [`is_damaged`] and stops trusting it (see
//! `Account`: it keeps enforcing what it knew and joins a usable ledger).
//!
//! A fault anywhere else is not ours: the program's own handler gets it, or,
//! with none, the default action (the process dies of `SIGBUS` as it would
//! without cgpu).
//!
//! The handler only loads and stores atomics and calls `mmap`, `sigaction`
//! and `raise` (system calls; `mmap` is not on POSIX's async-signal-safe
//! list, but on Linux it is a plain system call with no user-space lock).

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Once;

/// Most ledger mappings guarded at once (one per GPU, plus tools' handles).
const SLOTS: usize = 128;

struct Slot {
    base: AtomicUsize,
    len: AtomicUsize,
    damaged: AtomicBool,
}

static MAPS: [Slot; SLOTS] = [const {
    Slot {
        base: AtomicUsize::new(0),
        len: AtomicUsize::new(0),
        damaged: AtomicBool::new(false),
    }
}; SLOTS];

/// The handler that was installed before ours (written once, before ours is
/// installed; read only by our handler afterwards).
struct Prev(UnsafeCell<Option<libc::sigaction>>);
// SAFETY: written once inside `INSTALL.call_once` before our handler can
// run, read-only afterwards.
unsafe impl Sync for Prev {}
static PREV: Prev = Prev(UnsafeCell::new(None));
static INSTALL: Once = Once::new();

/// A registered mapping; `NONE` when the table was full (then unguarded).
pub(super) const NONE: usize = usize::MAX;

/// Guard `[base, base + len)`; returns its slot (or [`NONE`]).
pub(super) fn register(base: usize, len: usize) -> usize {
    install();
    for (i, s) in MAPS.iter().enumerate() {
        if s.base
            .compare_exchange(0, base, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            s.damaged.store(false, Ordering::Release);
            s.len.store(len, Ordering::Release);
            return i;
        }
    }
    tracing::warn!("more than {SLOTS} ledger mappings: this one is not guarded against truncation");
    NONE
}

/// Stop guarding (before the mapping is unmapped).
pub(super) fn unregister(slot: usize) {
    if let Some(s) = MAPS.get(slot) {
        s.len.store(0, Ordering::Release);
        s.base.store(0, Ordering::Release);
    }
}

/// Did the mapping in `slot` fault (and was replaced by anonymous memory)?
#[inline]
pub(super) fn is_damaged(slot: usize) -> bool {
    MAPS.get(slot)
        .is_some_and(|s| s.damaged.load(Ordering::Acquire))
}

fn install() {
    INSTALL.call_once(|| {
        // SAFETY: zeroed sigaction is a valid value; we fill the fields we use.
        let mut sa: libc::sigaction = unsafe { std::mem::zeroed() };
        sa.sa_sigaction = on_sigbus as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_RESTART;
        // SAFETY: valid pointers; `sa_mask` is a valid sigset to empty.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        unsafe { libc::sigemptyset(&mut sa.sa_mask) };
        // SAFETY: `sa` and `old` are valid sigaction structs.
        if unsafe { libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut old) } == 0 {
            // SAFETY: our handler is not installed yet: nobody reads PREV.
            unsafe { *PREV.0.get() = Some(old) };
        }
        // SAFETY: as above.
        unsafe { libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut()) };
    });
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let addr = if info.is_null() {
        0
    } else {
        unsafe { (*info).si_addr() as usize }
    };
    for s in MAPS.iter() {
        let base = s.base.load(Ordering::Acquire);
        let len = s.len.load(Ordering::Acquire);
        if base == 0 || addr < base || addr >= base + len {
            continue;
        }
        // SAFETY: `[base, base+len)` is one of our own ledger mappings
        // (registered while mapped, unregistered before unmapping); replacing
        // it in place with private anonymous memory keeps every pointer into
        // it valid. Nothing else lives in that range.
        let p = unsafe {
            libc::mmap(
                base as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_FIXED | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p as usize == base {
            s.damaged.store(true, Ordering::Release);
            return; // the access is retried on the anonymous pages
        }
        break; // could not replace it: not recoverable, fall through
    }
    // Not ours: whatever the program had.
    // SAFETY: PREV was written before this handler was installed.
    let prev = unsafe { *PREV.0.get() };
    match prev {
        Some(p) if p.sa_sigaction != libc::SIG_DFL && p.sa_sigaction != libc::SIG_IGN => {
            if p.sa_flags & libc::SA_SIGINFO != 0 {
                // SAFETY: the program installed this handler with SA_SIGINFO.
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    unsafe { std::mem::transmute(p.sa_sigaction) };
                f(sig, info, ctx);
            } else {
                // SAFETY: the program installed this plain handler.
                let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(p.sa_sigaction) };
                f(sig);
            }
        }
        _ => {
            // Default action: die of SIGBUS as without cgpu.
            // SAFETY: zeroed sigaction with SIG_DFL is valid; raise is
            // async-signal-safe. The signal is blocked while we run, so it
            // is delivered (and kills) as soon as we return.
            unsafe {
                let mut dfl: libc::sigaction = std::mem::zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(libc::SIGBUS, &dfl, std::ptr::null_mut());
                libc::raise(libc::SIGBUS);
            }
        }
    }
}
