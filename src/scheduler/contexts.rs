//! The contexts one process launched into on one GPU, and their drain when
//! the GPU changes hands: `cuCtxSynchronize` on each, with the real
//! driver's functions only (never our own hooks). A context being
//! destroyed is forgotten first, and its destruction waits while a drain
//! synchronises it. Shared by both gates (cooperative and secure mode).

use super::gate::{CUcontext, DriverOps};
use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering::*};

/// Up to eight contexts (more are launched into unscheduled-drained, with a
/// warning).
pub struct Contexts {
    drv: DriverOps,
    ctxs: [AtomicUsize; 8],
    devs: [AtomicI32; 8],
    /// The context a drain is synchronising now (0: none).
    using: AtomicUsize,
}

impl Contexts {
    pub fn new(drv: DriverOps) -> Contexts {
        Contexts {
            drv,
            ctxs: Default::default(),
            devs: Default::default(),
            using: AtomicUsize::new(0),
        }
    }

    /// Record the calling thread's current context (at its first launch
    /// in a slice).
    pub fn register(&self) {
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the real driver's function, not a hook.
        let r = unsafe { (self.drv.ctx_get_current)(&mut ctx) };
        if r != 0 || ctx.is_null() {
            return;
        }
        let v = ctx as usize;
        if self.ctxs.iter().any(|c| c.load(Acquire) == v) {
            return;
        }
        let mut dev: i32 = -1;
        // SAFETY: a valid out-pointer; the real driver's function.
        if unsafe { (self.drv.ctx_get_device)(&mut dev) } != 0 {
            dev = -1;
        }
        for (c, d) in self.ctxs.iter().zip(&self.devs) {
            if c.compare_exchange(0, v, AcqRel, Acquire).is_ok() {
                d.store(dev, Release);
                return;
            }
            if c.load(Acquire) == v {
                return;
            }
        }
        tracing::warn!(
            "cgpu: more than {} contexts in one process: the extra ones are not drained at handover",
            self.ctxs.len()
        );
    }

    /// Synchronise every recorded context (not while a stream capture is
    /// open in this process: synchronising would invalidate it, and the
    /// process counts as drained, see `capture.rs`).
    pub fn sync(&self) {
        let guard = crate::scheduler::capture::CAPTURES.sync_guard();
        if guard.is_none() {
            tracing::debug!(
                "cgpu: stream capture open: contexts not synchronised at this handover"
            );
            return;
        }
        let mut synced = false;
        for c in &self.ctxs {
            let v = c.load(Acquire);
            if v == 0 {
                continue;
            }
            // Announce the use before re-checking the entry: a context being
            // destroyed is removed first, then waits while it is in use
            // (`forget`); one of the two sees the other (SeqCst).
            self.using.store(v, SeqCst);
            if c.load(SeqCst) != v {
                self.using.store(0, SeqCst);
                continue;
            }
            synced = true;
            // SAFETY: real driver functions; `v` is a context this process
            // launched into and that was not destroyed: destruction goes
            // through `forget`, which waits while `using` names it.
            let r = unsafe {
                match (self.drv.ctx_set_current)(v as CUcontext) {
                    0 => (self.drv.ctx_synchronize)(),
                    e => e,
                }
            };
            self.using.store(0, SeqCst);
            if r != 0 && !crate::scheduler::capture::is_capture_error(r) {
                tracing::debug!("cgpu: drain of context {v:#x} returned {r}: forgotten");
                let _ = c.compare_exchange(v, 0, AcqRel, Acquire);
            } else if r != 0 {
                tracing::debug!("cgpu: drain of context {v:#x} returned {r} (stream capture)");
            }
        }
        if synced {
            // Keep no destroyed context current on this thread.
            // SAFETY: the real driver function; a null context is valid.
            unsafe { (self.drv.ctx_set_current)(std::ptr::null_mut()) };
        }
        drop(guard);
    }

    /// Forget context `v` (it is being destroyed); returns once no drain
    /// uses it.
    pub fn forget(&self, v: usize) {
        if v == 0 {
            return;
        }
        for c in &self.ctxs {
            let _ = c.compare_exchange(v, 0, SeqCst, SeqCst);
        }
        while self.using.load(SeqCst) == v {
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
    }

    /// Forget every context of device `dev` (its primary context is being
    /// released or reset). A live one is recorded again at its next slice.
    pub fn forget_device(&self, dev: i32) {
        for (c, d) in self.ctxs.iter().zip(&self.devs) {
            let v = c.load(SeqCst);
            if v != 0 && d.load(Acquire) == dev {
                self.forget(v);
            }
        }
    }
}
