//! Stream captures (CUDA graphs) open in this process, tracked per stream.
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
//! Captures are kept per stream (a small table of stream handles), so that a
//! `cuStreamEndCapture` on a stream that is not capturing (the driver refuses
//! it) closes nothing, and an end that the driver refuses while the capture
//! goes on (`CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD`) leaves it open.
//!
//! A handshake closes the race between the drain's check and its
//! `cuCtxSynchronize`: the drain announces itself (`syncing`) before looking
//! at the table; `cuStreamBeginCapture` enters its stream in the table before
//! looking at `syncing` and, if a drain is synchronising, waits for it to
//! finish before the real call (all `SeqCst`: one of the two sees the other).
//! Atomics only; every wait is bounded.
//!
//! After a `fork` the table is the parent's: the child has none of its
//! captures' threads, and no drain (a drain that was synchronising when the
//! parent forked would make the child's `cuStreamBeginCapture` wait). The
//! table records the fork generation it belongs to (`process::fork`); the
//! first use in another generation empties it.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering::SeqCst};

/// Streams with a capture open (or being begun); 0 = free entry.
const SLOTS: usize = 64;
/// A stream handle is never this (a free entry is 0; the legacy stream, also
/// 0, is entered as this value).
const NULL_STREAM: usize = usize::MAX;
/// Longest a `cuStreamBeginCapture` waits for a synchronising drain.
const BEGIN_WAIT_LIMIT: std::time::Duration = std::time::Duration::from_secs(2);
/// `CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD`: the end is refused, the capture goes on.
const WRONG_THREAD: u32 = 908;
/// `CUDA_ERROR_INVALID_VALUE` (a NULL graph pointer): the end is refused
/// before the driver looks at the capture, which goes on.
const INVALID_VALUE: u32 = 1;
/// [`Captures::generation`] while a thread of generation `g` empties the
/// table: `RESETTING | g`.
const RESETTING: u64 = 1 << 63;

/// The table (one process-wide instance, [`CAPTURES`]).
pub struct Captures {
    streams: [AtomicUsize; SLOTS],
    /// Captures begun while the table was full (counted, not keyed).
    overflow: AtomicU32,
    /// Drains between their check of the table and the end of their synchronisation.
    syncing: AtomicU32,
    /// The fork generation the table belongs to (see [`RESETTING`]).
    generation: AtomicU64,
}

/// This process's captures.
pub static CAPTURES: Captures = Captures::new();

fn key(stream: usize) -> usize {
    if stream == 0 {
        NULL_STREAM
    } else {
        stream
    }
}

fn dec_saturating(a: &AtomicU32) -> bool {
    a.fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1)).is_ok()
}

/// One capture being begun: [`Captures::begun`] consumes it.
#[must_use]
pub struct Begin(Option<usize>);

impl Captures {
    pub const fn new() -> Captures {
        Captures {
            streams: [const { AtomicUsize::new(0) }; SLOTS],
            overflow: AtomicU32::new(0),
            syncing: AtomicU32::new(0),
            generation: AtomicU64::new(0),
        }
    }

    /// A table of an earlier fork generation (this is a forked child) is
    /// emptied before its first use here: one thread empties it, any other
    /// waits for those few stores.
    fn fresh(&self) {
        let g = crate::process::fork::generation();
        loop {
            let w = self.generation.load(SeqCst);
            if w == g {
                return;
            }
            if w == RESETTING | g {
                std::thread::yield_now();
                continue;
            }
            // Of an earlier generation (a reset that a fork interrupted
            // included: its thread is not in this process).
            if self
                .generation
                .compare_exchange(w, RESETTING | g, SeqCst, SeqCst)
                .is_ok()
            {
                for s in &self.streams {
                    s.store(0, SeqCst);
                }
                self.overflow.store(0, SeqCst);
                self.syncing.store(0, SeqCst);
                self.generation.store(g, SeqCst);
                return;
            }
        }
    }

    /// Before the real `cuStreamBeginCapture*` on `stream`: counts the
    /// capture as open and waits while a drain is inside `cuCtxSynchronize`
    /// (bounded by it, and by 2 s whatever happens).
    pub fn begin(&self, stream: usize) -> Begin {
        self.fresh();
        let k = key(stream);
        let entry = self
            .streams
            .iter()
            .position(|s| s.compare_exchange(0, k, SeqCst, SeqCst).is_ok());
        if entry.is_none() {
            self.overflow.fetch_add(1, SeqCst);
        }
        let t0 = std::time::Instant::now();
        while self.syncing.load(SeqCst) > 0 && t0.elapsed() < BEGIN_WAIT_LIMIT {
            std::thread::sleep(std::time::Duration::from_micros(50));
        }
        Begin(entry)
    }

    /// After the real `cuStreamBeginCapture*` returned `rc`: a failed begin
    /// does not count.
    pub fn begun(&self, b: Begin, rc: u32) {
        if rc == 0 {
            return;
        }
        match b.0 {
            Some(i) => self.streams[i].store(0, SeqCst),
            None => {
                dec_saturating(&self.overflow);
            }
        }
    }

    /// After the real `cuStreamEndCapture(stream)` returned `rc`. A stream
    /// this process did not begin capturing closes nothing; a refused end
    /// that leaves the capture going (wrong thread, a NULL graph pointer)
    /// closes nothing.
    pub fn ended(&self, stream: usize, rc: u32) {
        self.fresh();
        if rc == WRONG_THREAD || rc == INVALID_VALUE {
            return;
        }
        let k = key(stream);
        if let Some(s) = self.streams.iter().find(|s| s.load(SeqCst) == k) {
            // Another thread may end the same stream concurrently (the
            // driver refuses one of them): whichever CAS wins clears it.
            let _ = s.compare_exchange(k, 0, SeqCst, SeqCst);
        } else if rc == 0 {
            // A capture begun while the table was full.
            dec_saturating(&self.overflow);
        }
    }

    /// Captures open now.
    pub fn open(&self) -> u32 {
        self.fresh();
        self.streams.iter().filter(|s| s.load(SeqCst) != 0).count() as u32
            + self.overflow.load(SeqCst)
    }

    /// The drain may synchronise this process's contexts while the guard
    /// lives; `None`: a capture is open, do not synchronise.
    pub fn sync_guard(&self) -> Option<SyncGuard<'_>> {
        self.fresh();
        self.syncing.fetch_add(1, SeqCst);
        if self.open() > 0 {
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
        let b = c.begin(0x10);
        c.begun(b, 901); // failed: not counted
        assert_eq!(c.open(), 0);
        let b = c.begin(0x10);
        c.begun(b, 0);
        assert_eq!(c.open(), 1);
        assert!(c.sync_guard().is_none());
        assert_eq!(c.syncing.load(SeqCst), 0);
        c.ended(0x10, 0);
        assert_eq!(c.open(), 0);
        let g = c.sync_guard();
        assert!(g.is_some());
        assert_eq!(c.syncing.load(SeqCst), 1);
        drop(g);
        assert_eq!(c.syncing.load(SeqCst), 0);
        assert!(is_capture_error(900) && is_capture_error(907));
        assert!(!is_capture_error(201) && !is_capture_error(908));
    }

    /// An unmatched or refused end never closes another stream's capture.
    #[test]
    fn per_stream_ends() {
        let c = Captures::new();
        let b = c.begin(0xa);
        c.begun(b, 0);
        // End on a stream that is not capturing (the driver says 401).
        c.ended(0xb, 401);
        assert_eq!(c.open(), 1);
        assert!(c.sync_guard().is_none());
        // End from the wrong thread: refused, the capture goes on.
        c.ended(0xa, WRONG_THREAD);
        assert_eq!(c.open(), 1);
        // End with a NULL graph pointer: refused, the capture goes on.
        c.ended(0xa, INVALID_VALUE);
        assert_eq!(c.open(), 1);
        // The same stream ended twice: the second is unmatched.
        c.ended(0xa, 0);
        c.ended(0xa, 401);
        assert_eq!(c.open(), 0);
        // Invalidated captures are over (901: EndCapture ends them).
        let b = c.begin(0);
        c.begun(b, 0);
        let b = c.begin(0xa);
        c.begun(b, 0);
        assert_eq!(c.open(), 2);
        c.ended(0, 901);
        assert_eq!(c.open(), 1);
        c.ended(0xa, 0);
        assert_eq!(c.open(), 0);
    }

    #[test]
    fn a_full_table_still_counts() {
        let c = Captures::new();
        for i in 0..SLOTS + 3 {
            let b = c.begin(0x100 + i);
            c.begun(b, 0);
        }
        assert_eq!(c.open(), SLOTS as u32 + 3);
        for i in 0..SLOTS + 3 {
            c.ended(0x100 + i, 0);
        }
        assert_eq!(c.open(), 0);
    }

    #[test]
    fn begin_waits_for_a_syncing_drain() {
        let c: &'static Captures = Box::leak(Box::new(Captures::new()));
        let g = c.sync_guard().unwrap();
        let t = std::thread::spawn(move || {
            let b = c.begin(0x20);
            c.begun(b, 0);
        });
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(!t.is_finished(), "begin must wait for the drain's sync");
        assert_eq!(c.open(), 1); // counted before waiting: a new drain skips
        assert!(c.sync_guard().is_none());
        drop(g);
        t.join().unwrap();
        assert_eq!(c.open(), 1);
    }

    /// A child forked while a drain synchronised, and a capture was open,
    /// inherits `syncing > 0` with no drain to finish it and a capture of a
    /// thread it does not have: in its fork generation the table is empty,
    /// its begin does not wait, and its drain may synchronise.
    #[test]
    fn a_forked_child_starts_with_an_empty_table() {
        let c: &'static Captures = Box::leak(Box::new(Captures::new()));
        let b = c.begin(0x40);
        c.begun(b, 0);
        let g = c.sync_guard();
        assert!(g.is_none(), "a capture is open");
        // The parent's drain, synchronising when the fork happens.
        c.syncing.fetch_add(1, SeqCst);
        let mut fds = [0i32; 2];
        // SAFETY: a pipe for the child's answer; the child runs the table's
        // code (atomics, a clock, at most a bounded sleep) and `_exit`s.
        unsafe {
            assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
            let pid = libc::fork();
            if pid == 0 {
                let t0 = std::time::Instant::now();
                let b = c.begin(0x30);
                c.begun(b, 0);
                let waited = t0.elapsed() >= BEGIN_WAIT_LIMIT / 2;
                let open = c.open();
                c.ended(0x30, 0);
                let guard = c.sync_guard().is_some();
                let v: [u8; 3] = [waited as u8, open as u8, guard as u8];
                libc::write(fds[1], v.as_ptr().cast(), 3);
                libc::_exit(0);
            }
            let mut v = [9u8; 3];
            assert_eq!(libc::read(fds[0], v.as_mut_ptr().cast(), 3), 3);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
            libc::close(fds[0]);
            libc::close(fds[1]);
            assert_eq!(
                v,
                [0, 1, 1],
                "[begin waited, open after its begin, drain may sync]"
            );
        }
        // The parent's table is its own.
        assert_eq!(c.open(), 1);
        assert_eq!(c.syncing.load(SeqCst), 1);
    }
}
