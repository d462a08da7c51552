//! The atomics the shared books are made of: the standard library's, or,
//! when the crate is built with `--cfg loom` (the model tests in
//! `tests/loom.rs`), loom's, which explore every interleaving of the
//! threads that use them and every value the memory model lets a load see.
//!
//! Only the words other processes share (the file's slots) and the
//! per-process counters of the same protocol ([`crate::Membership`]) come
//! from here; process-wide statics stay on the standard library's types
//! (loom's cannot be built in a `static`).
//!
//! Under `--cfg loom` a step function can also "die" between two of its
//! stores (`point`): the model tests stop a thread at each such point in
//! turn, as a process killed there would stop, and check that what the
//! reaper then does restores the books.

#[cfg(not(loom))]
pub use std::sync::atomic::{fence, AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicU8};

#[cfg(loom)]
pub use loom::sync::atomic::{fence, AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicU8};

pub use std::sync::atomic::Ordering;

/// Give the processor to another thread (a spin's back-off).
#[inline]
pub(crate) fn yield_now() {
    #[cfg(not(loom))]
    std::thread::yield_now();
    #[cfg(loom)]
    loom::thread::yield_now();
}

/// A point between two stores of the shared protocol where a process may
/// die. Nothing in a normal build; under `--cfg loom`, the thread stops
/// here (unwinds, as if killed: nothing after this point runs) once it has
/// passed the number of points [`model::die_after`] gave it.
#[inline(always)]
pub(crate) fn point() {
    #[cfg(loom)]
    model::tick();
}

/// What the model tests need that a normal build never has: slots built
/// in memory (not a mapped file) and the death points' countdown.
#[cfg(loom)]
pub mod model {
    use super::*;
    use crate::{ContainerSlot, Membership, ProcessSlot, SCHED_CONTAINER_WORDS, SLOT_LIVE};
    use std::cell::Cell;

    // Loom's threads share the OS thread: their locals are loom's.
    loom::thread_local! {
        /// Death points this thread may still pass (`None`: immortal).
        static LEFT: Cell<Option<u32>> = Cell::new(None);
        /// Death points passed since `die_after`.
        static PASSED: Cell<u32> = Cell::new(0);
    }

    /// The unwinding payload of a thread that "died" at a death point.
    #[derive(Debug)]
    pub struct Died;

    /// From now on this thread dies at the `n`-th death point it reaches
    /// (0: the first one).
    pub fn die_after(n: u32) {
        LEFT.with(|l| l.set(Some(n)));
        PASSED.with(|p| p.set(0));
    }

    /// Death points this thread passed since [`die_after`] (for a test to
    /// know it has tried every one).
    pub fn passed() -> u32 {
        PASSED.with(|p| p.get())
    }

    /// Run `f` on a thread that may die at a death point: `None` when it
    /// did (what it had done so far stays done, as in a killed process).
    pub fn mortal<R>(f: impl FnOnce() -> R) -> Option<R> {
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
            Ok(r) => Some(r),
            Err(e) if e.is::<Died>() => None,
            Err(e) => std::panic::resume_unwind(e),
        }
    }

    pub(crate) fn tick() {
        let die = LEFT.with(|l| match l.get() {
            Some(0) => {
                l.set(None);
                true
            }
            Some(n) => {
                l.set(Some(n - 1));
                false
            }
            None => false,
        });
        if die {
            // `resume_unwind`: no panic message, no panic hook.
            std::panic::resume_unwind(Box::new(Died));
        }
        PASSED.with(|p| p.set(p.get() + 1));
    }

    fn words<T, const N: usize>(f: impl Fn() -> T) -> [T; N] {
        std::array::from_fn(|_| f())
    }

    impl ContainerSlot {
        /// A live container slot in memory, with `quota` bytes (0: not limited).
        pub fn model(quota: u64) -> ContainerSlot {
            ContainerSlot {
                state: AtomicU32::new(SLOT_LIVE),
                highprio: AtomicU32::new(0),
                id: words(|| AtomicU8::new(0)),
                quota: AtomicU64::new(quota),
                used: AtomicU64::new(0),
                peak: AtomicU64::new(0),
                weight: AtomicU32::new(1),
                nprocs: AtomicU32::new(0),
                oom_count: AtomicU64::new(0),
                created_ns: AtomicU64::new(0),
                enforce_off: AtomicU32::new(0),
                ops: AtomicU32::new(0),
                sched: words::<_, SCHED_CONTAINER_WORDS>(|| AtomicU64::new(0)),
                suspect: AtomicU64::new(0),
                recounts: AtomicU64::new(0),
                key: AtomicU64::new(0),
                key_created: AtomicU64::new(0),
                id_sum: AtomicU64::new(0),
                reserved: [0; 3],
            }
        }
    }

    impl ProcessSlot {
        /// A live process slot in memory, of container slot `container`.
        pub fn model(container: u32) -> ProcessSlot {
            ProcessSlot {
                state: AtomicU32::new(SLOT_LIVE),
                container: AtomicU32::new(container),
                pid: AtomicI32::new(0),
                _pad: 0,
                pidns: AtomicU64::new(0),
                start_time: AtomicU64::new(0),
                used: AtomicU64::new(0),
                pending: AtomicU64::new(0),
                gpu_time_ns: AtomicU64::new(0),
                launches: AtomicU64::new(0),
                sched_beat_ns: AtomicU64::new(0),
                sched_in_sync: AtomicU64::new(0),
                host_pid: AtomicU64::new(0),
                reserved: [0; 1],
            }
        }
    }

    /// Count a reserve/release in flight on `m`, as the account does
    /// around its own steps (`None` once left).
    pub fn enter(m: &Membership) -> Option<impl Drop + '_> {
        m.enter()
    }

    impl crate::SharedSlot {
        /// A live entry: process slot `holder` imported `extent` bytes of
        /// what process slot `exporter` exported, both of container slot 0.
        pub fn model(exporter: u32, holder: u32, extent: u64) -> crate::SharedSlot {
            crate::SharedSlot {
                state: AtomicU32::new(SLOT_LIVE),
                container: AtomicU32::new(0),
                exporter: AtomicU32::new(exporter),
                holder: AtomicU32::new(holder),
                exporter_pid: AtomicI32::new(0),
                holder_pid: AtomicI32::new(0),
                bytes: AtomicU64::new(extent),
            }
        }
    }

    impl Membership {
        /// A membership of container slot `container`, process slot `process`.
        pub fn model(container: usize, process: usize) -> Membership {
            Membership::new(container, process)
        }
    }
}
