//! CUDA checkpointing (`cuCheckpointProcess*`, as `cuda-checkpoint` and
//! CRIU's CUDA plugin drive it), with the GPU memory checkpointed to host
//! memory — which, in the sim, is where it already is.
//!
//! A tool process (or the process itself) moves a CUDA process of the same
//! state directory, named by its pid, through the driver's states:
//! `cuCheckpointProcessLock` (running → locked: from then on every CUDA call
//! of that process waits until it is unlocked), `Checkpoint` (locked →
//! checkpointed: its device memory is released — the devices no longer count
//! it, in `cuMemGetInfo`, NVML and `cgpu-sim-stat` — while its bytes stay),
//! `Restore` (checkpointed → locked: the memory is charged again, or
//! `CUDA_ERROR_OUT_OF_MEMORY` if the devices no longer have room, and the
//! process stays checkpointed), `Unlock` (locked → running). A call in the
//! wrong state is `CUDA_ERROR_ILLEGAL_STATE`; a pid that is no CUDA process
//! of the state directory `CUDA_ERROR_INVALID_VALUE`. The states live in the
//! shared state file (the target's slot), so any process can drive any
//! other.
//!
//! Not simulated (counted stubs): custom storage (the memory mapped into the
//! tool for it to copy) and remapping onto other GPUs at restore. A call
//! already past the lock when it is taken completes; one that frees memory
//! while the process is checkpointed is not seen by the restore.

use crate::driver::core;
use crate::state::{futex_wake, Shared, SlotRec, SLOT_ALIVE};
use crate::{guard_ungated, put, CuRes};
use cgpu_ffi::*;
use std::sync::atomic::Ordering::*;

const RUNNING: u32 = 0;
const LOCKED: u32 = 1;
const CHECKPOINTED: u32 = 2;

/// The slot of live CUDA process `pid` in our state directory.
fn target(pid: i32) -> Result<(&'static Shared, usize), CUresult> {
    let d = core().map_err(|_| CUDA_ERROR_NOT_INITIALIZED)?;
    d.shared.reap(Some(d.slot));
    (0..d.shared.nslots())
        .find(|&s| {
            let r = d.shared.slot(s);
            r.state.load(Acquire) == SLOT_ALIVE && r.pid.load(Acquire) as i32 == pid
        })
        .map(|s| (d.shared, s))
        .ok_or(CUDA_ERROR_INVALID_VALUE)
}

/// Moves slot `r` from state `from` to `to`, or fails with ILLEGAL_STATE.
fn transition(r: &SlotRec, from: u32, to: u32) -> CuRes {
    r.ckpt
        .compare_exchange(from, to, AcqRel, Acquire)
        .map(|_| ())
        .map_err(|_| CUDA_ERROR_ILLEGAL_STATE)
}

/// Reserved argument words must be zero.
fn zeroed_args(p: *const u8, len: usize, skip: usize) -> CuRes {
    if p.is_null() {
        return Ok(());
    }
    // SAFETY: the caller's argument struct of `len` bytes.
    let b = unsafe { std::slice::from_raw_parts(p, len) };
    if b[skip..].iter().any(|&x| x != 0) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(())
}

fn get_state(pid: i32, out: *mut u32) -> CuRes {
    let (sh, s) = target(pid)?;
    // SAFETY: out pointer from the caller.
    unsafe { put(out, sh.slot(s).ckpt.load(Acquire), CUDA_ERROR_INVALID_VALUE) }
}

/// The thread that restores: the sim restores from the calling thread and
/// answers with the process's main thread.
fn restore_thread(pid: i32, out: *mut i32) -> CuRes {
    target(pid)?;
    // SAFETY: out pointer from the caller.
    unsafe { put(out, pid, CUDA_ERROR_INVALID_VALUE) }
}

/// `CUcheckpointLockArgs`: a timeout (ms), then reserved words.
fn lock(pid: i32, args: *const u8) -> CuRes {
    zeroed_args(args, 64, 4)?;
    let (sh, s) = target(pid)?;
    transition(sh.slot(s), RUNNING, LOCKED)
}

/// `CUcheckpointCheckpointArgs`: the custom storage out pointer first.
fn checkpoint(pid: i32, args: *const u8) -> CuRes {
    if !args.is_null() {
        // SAFETY: the caller's 64-byte argument struct; a pointer first.
        if unsafe { (args as *const usize).read_unaligned() } != 0 {
            crate::stub_hit!("cuCheckpointProcessCheckpoint (custom storage)");
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        zeroed_args(args, 64, 8)?;
    }
    let (sh, s) = target(pid)?;
    let r = sh.slot(s);
    transition(r, LOCKED, CHECKPOINTED)?;
    for dev in 0..sh.ndev() {
        let _g = sh.lock_dev(dev);
        let m = r.mem[dev].swap(0, AcqRel);
        r.ckpt_mem[dev].fetch_add(m, AcqRel);
    }
    Ok(())
}

/// `CUcheckpointRestoreArgs`: GPU pairs (pointer, count), custom storage.
fn restore(pid: i32, args: *const u8) -> CuRes {
    if !args.is_null() {
        // SAFETY: the caller's 64-byte argument struct: pairs pointer at 0,
        // count at 8, custom storage pointer at 16.
        let (pairs, n, custom) = unsafe {
            (
                (args as *const *const [u8; 32]).read_unaligned(),
                (args.add(8) as *const u32).read_unaligned(),
                (args.add(16) as *const usize).read_unaligned(),
            )
        };
        if custom != 0 {
            crate::stub_hit!("cuCheckpointProcessRestore (custom storage)");
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        if n > 0 && pairs.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        for i in 0..n as usize {
            // SAFETY: the caller's array of `n` (old UUID, new UUID) pairs.
            let p = unsafe { pairs.add(i).read_unaligned() };
            if p[..16] != p[16..] {
                crate::stub_hit!("cuCheckpointProcessRestore (GPU remapping)");
                return Err(CUDA_ERROR_NOT_SUPPORTED);
            }
        }
    }
    let (sh, s) = target(pid)?;
    let r = sh.slot(s);
    if r.ckpt.load(Acquire) != CHECKPOINTED {
        return Err(CUDA_ERROR_ILLEGAL_STATE);
    }
    // All or nothing: the memory comes back on every device, or on none.
    let mut done = Vec::new();
    for dev in 0..sh.ndev() {
        let m = r.ckpt_mem[dev].load(Acquire);
        if m > 0 && !sh.try_charge(s, dev, m) {
            for (d2, m2) in done {
                sh.uncharge(s, d2, m2);
            }
            return Err(CUDA_ERROR_OUT_OF_MEMORY);
        }
        done.push((dev, m));
    }
    for dev in 0..sh.ndev() {
        r.ckpt_mem[dev].store(0, Release);
    }
    transition(r, CHECKPOINTED, LOCKED)
}

fn unlock(pid: i32, args: *const u8) -> CuRes {
    zeroed_args(args, 64, 0)?;
    let (sh, s) = target(pid)?;
    let r = sh.slot(s);
    transition(r, LOCKED, RUNNING)?;
    futex_wake(&r.ckpt);
    Ok(())
}

/// Runs a checkpoint call: not held by a lock on this process itself.
macro_rules! ckpt_fns {
    ($($name:ident($($a:ident: $t:ty),*) => $body:expr;)*) => {$(
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($a: $t),*) -> CUresult {
            $crate::version_gate!(stringify!($name));
            guard_ungated(|| $body)
        }
    )*};
}

ckpt_fns! {
    cuCheckpointProcessGetState(pid: i32, out: *mut u32) => get_state(pid, out);
    cuCheckpointProcessGetRestoreThreadId(pid: i32, out: *mut i32) => restore_thread(pid, out);
    cuCheckpointProcessLock(pid: i32, args: *const u8) => lock(pid, args);
    cuCheckpointProcessCheckpoint(pid: i32, args: *const u8) => checkpoint(pid, args);
    cuCheckpointProcessRestore(pid: i32, args: *const u8) => restore(pid, args);
    cuCheckpointProcessUnlock(pid: i32, args: *const u8) => unlock(pid, args);
    // Only custom-storage operations complete this way, and the sim makes
    // none: any handle is unknown.
    cuCheckpointOperationComplete(_handle: *const u8) => {
        core().map_err(|_| CUDA_ERROR_NOT_INITIALIZED)?;
        Err(CUDA_ERROR_INVALID_VALUE)
    };
}
