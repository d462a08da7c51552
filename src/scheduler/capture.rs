//! Stream captures (CUDA graphs) open in this process.
//!
//! On a real driver, `cuCtxSynchronize` on a context while one of its streams
//! is being captured fails (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`) and
//! invalidates the capture: the application's `cuStreamEndCapture` then fails
//! (PyTorch's `torch.cuda.graph` raises). So the drain at a slice's end does
//! not synchronise this process's contexts while it has a capture open: the
//! captured launches do not run on the GPU, so there is nothing of theirs to
//! wait for. Work on other streams of the process is then not waited for at
//! that handover (it keeps running into the next holder's slice, as work of
//! a drain that timed out does).
//!
//! A handshake closes the race between the drain's check and its
//! `cuCtxSynchronize`: the drain announces itself (`SYNCING`) before looking
//! at `OPEN`; `cuStreamBeginCapture` counts itself in `OPEN` before looking at
//! `SYNCING` and, if a drain is synchronising, waits for it to finish before
//! the real call (all `SeqCst`: one of the two sees the other). Atomics only.

use std::sync::atomic::{AtomicU32, Ordering::SeqCst};

/// The counters (one process-wide instance, [`CAPTURES`]).
pub struct Captures {
    /// Captures begun (successfully, or being begun) and not yet ended.
    open: AtomicU32,
    /// Drains between their check of `open` and the end of their synchronisation.
    syncing: AtomicU32,
}

/// This process's captures.
pub static CAPTURES: Captures = Captures::new();

fn dec_saturating(a: &AtomicU32) {
    let _ = a.fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1));
}

impl Captures {
    pub const fn new() -> Captures {
        Captures {
            open: AtomicU32::new(0),
            syncing: AtomicU32::new(0),
        }
    }

    /// Before the real `cuStreamBeginCapture*`: counts the capture as open
    /// and waits while a drain is inside `cuCtxSynchronize` (bounded by it).
    pub fn begin(&self) {
        self.open.fetch_add(1, SeqCst);
        while self.syncing.load(SeqCst) > 0 {
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
    }

    /// After the real `cuStreamBeginCapture*` returned `rc`: a failed begin
    /// does not count.
    pub fn begun(&self, rc: u32) {
        if rc != 0 {
            dec_saturating(&self.open);
        }
    }

    /// After the real `cuStreamEndCapture`, whatever it returned (the
    /// capture is over either way); saturating.
    pub fn ended(&self) {
        dec_saturating(&self.open);
    }

    /// Captures open now.
    pub fn open(&self) -> u32 {
        self.open.load(SeqCst)
    }

    /// The drain may synchronise this process's contexts while the guard
    /// lives; `None`: a capture is open, do not synchronise.
    pub fn sync_guard(&self) -> Option<SyncGuard<'_>> {
        self.syncing.fetch_add(1, SeqCst);
        if self.open.load(SeqCst) > 0 {
            self.syncing.fetch_sub(1, SeqCst);
            return None;
        }
        Some(SyncGuard(&self.syncing))
    }
}

impl Default for Captures {
    fn default() -> Self {
        Self::new()
    }
}

pub struct SyncGuard<'a>(&'a AtomicU32);

impl Drop for SyncGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, SeqCst);
    }
}

/// `CUDA_ERROR_STREAM_CAPTURE_*` (900–907): the context is alive.
pub fn is_capture_error(rc: u32) -> bool {
    (900..=907).contains(&rc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counting_and_guard() {
        let c = Captures::new();
        assert_eq!(c.open(), 0);
        assert!(c.sync_guard().is_some());
        c.begin();
        c.begun(901); // failed: not counted
        assert_eq!(c.open(), 0);
        c.begin();
        c.begun(0);
        assert_eq!(c.open(), 1);
        assert!(c.sync_guard().is_none());
        assert_eq!(c.syncing.load(SeqCst), 0);
        c.ended();
        c.ended(); // unmatched end: saturates
        assert_eq!(c.open(), 0);
        let g = c.sync_guard();
        assert!(g.is_some());
        assert_eq!(c.syncing.load(SeqCst), 1);
        drop(g);
        assert_eq!(c.syncing.load(SeqCst), 0);
        assert!(is_capture_error(900) && is_capture_error(907));
        assert!(!is_capture_error(201) && !is_capture_error(908));
    }

    #[test]
    fn begin_waits_for_a_syncing_drain() {
        let c: &'static Captures = Box::leak(Box::new(Captures::new()));
        let g = c.sync_guard().unwrap();
        let t = std::thread::spawn(move || {
            c.begin();
            c.begun(0);
        });
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(!t.is_finished(), "begin must wait for the drain's sync");
        assert_eq!(c.open(), 1); // counted before waiting: a new drain skips
        assert!(c.sync_guard().is_none());
        drop(g);
        t.join().unwrap();
        assert_eq!(c.open(), 1);
    }
}
