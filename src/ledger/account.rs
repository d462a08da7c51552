//! This process's account on one GPU: the ledger membership through which
//! its allocations are charged to its container, and what happens when that
//! membership cannot be had.
//!
//! | situation | state | allocations |
//! |---|---|---|
//! | joined | `Joined` | charged to the container's shared quota |
//! | the slot-table lock is held by a process that does not let go (stopped by `SIGSTOP`, `docker pause`, a debugger; swapped out) | `Waiting` | **refused** (`CUDA_ERROR_OUT_OF_MEMORY`) until the join succeeds; retried at most every [`RETRY_INTERVAL`] without waiting |
//! | no free container or process slot | `Waiting` | refused likewise, until a slot frees |
//! | the ledger cannot be used at all (directory not writable, filesystem full, a corrupt file in use, another format version) | `Alone` | charged to this process alone against the quota, with an error (always printed) saying the container's other processes are not counted |
//!
//! Waiting never lets an allocation through uncharged: a stalled process
//! can delay other processes' first allocation on that GPU (by at most
//! [`JOIN_WAIT`], then they are refused), never make the container pass its
//! quota.

use super::*;
use std::sync::atomic::AtomicU8;
use std::sync::OnceLock;

/// Longest the first join on a GPU waits for the slot-table lock. A live
/// holder keeps it for microseconds; a holder that keeps it longer is
/// stalled, and the process then refuses allocations until it can join.
pub const JOIN_WAIT: Duration = Duration::from_millis(500);
/// Least time between two join attempts while waiting (each is one
/// non-blocking try).
pub const RETRY_INTERVAL: Duration = Duration::from_millis(10);

const JOINED: u8 = 0;
const WAITING: u8 = 1;
const ALONE: u8 = 2;

/// What this process asks of a GPU's ledger (owned [`JoinRequest`]).
#[derive(Debug, Clone)]
pub struct JoinSpec {
    pub container_id: String,
    /// As [`JoinRequest::quota`].
    pub quota: u64,
    pub weight: u32,
    pub highprio: bool,
    pub enforce_off: bool,
}

impl JoinSpec {
    fn request(&self) -> JoinRequest<'_> {
        JoinRequest {
            container_id: &self.container_id,
            quota: self.quota,
            weight: self.weight,
            highprio: self.highprio,
            enforce_off: self.enforce_off,
        }
    }
}

/// This process's account on one GPU (see the module docs).
pub struct Account {
    /// For messages: `GPU <index> (<uuid>)`.
    gpu: String,
    spec: JoinSpec,
    /// The limit used when alone (`None`: not limited).
    alone_limit: Option<u64>,
    state: AtomicU8,
    ledger: OnceLock<Ledger>,
    member: OnceLock<Membership>,
    /// Serialises join attempts of this process's threads.
    joining: parking_lot::Mutex<()>,
    /// CLOCK_MONOTONIC ns before which no new join attempt is made.
    next_try_ns: AtomicU64,
    /// Refusals while waiting (the first, then every 1000th, is logged).
    refused: AtomicU64,
    /// Used when alone.
    used: AtomicU64,
    peak: AtomicU64,
}

impl std::fmt::Debug for Account {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Account")
            .field("gpu", &self.gpu)
            .field("state", &self.state.load(Ordering::Relaxed))
            .finish()
    }
}

impl Account {
    /// Open (or create) the GPU's ledger in `dir` and join it, waiting at
    /// most [`JOIN_WAIT`] for the table lock. Never fails: see the states
    /// in the module docs. `alone_limit` is the quota applied if the ledger
    /// cannot be used at all.
    pub fn open(
        dir: &Path,
        uuid: &str,
        gpu_index: u32,
        physical_total: u64,
        gpu: String,
        spec: JoinSpec,
        alone_limit: Option<u64>,
    ) -> Account {
        let a = Account::new(gpu, spec, alone_limit, WAITING);
        let opened = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            Ledger::open_or_create(dir, uuid, gpu_index, physical_total)
        }))
        .unwrap_or_else(|_| {
            Err(LedgerError::io(
                dir,
                std::io::Error::other("ledger code panicked"),
            ))
        });
        match opened {
            Ok(l) => {
                let _ = a.ledger.set(l);
                a.try_join(JOIN_WAIT);
            }
            Err(e) => a.go_alone(&e),
        }
        a
    }

    /// An account that is alone from the start (tests, and callers that
    /// know no ledger can be used).
    pub fn alone(gpu: String, alone_limit: Option<u64>) -> Account {
        let spec = JoinSpec {
            container_id: String::new(),
            quota: 0,
            weight: 1,
            highprio: false,
            enforce_off: false,
        };
        Account::new(gpu, spec, alone_limit, ALONE)
    }

    fn new(gpu: String, spec: JoinSpec, alone_limit: Option<u64>, state: u8) -> Account {
        Account {
            gpu,
            spec,
            alone_limit,
            state: AtomicU8::new(state),
            ledger: OnceLock::new(),
            member: OnceLock::new(),
            joining: parking_lot::Mutex::new(()),
            next_try_ns: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            used: AtomicU64::new(0),
            peak: AtomicU64::new(0),
        }
    }

    fn go_alone(&self, e: &LedgerError) {
        let limit = match self.alone_limit {
            Some(q) => format!("its quota ({})", crate::ledger::human_bytes(q)),
            None => "no limit (none was set)".to_string(),
        };
        tracing::error!(
            "{}: the ledger cannot be used ({e}); this process alone is held to {limit}: the container's other processes on this GPU are NOT counted against it",
            self.gpu
        );
        self.state.store(ALONE, Ordering::Release);
    }

    /// One join attempt (waiting at most `wait` for the table lock).
    fn try_join(&self, wait: Duration) -> bool {
        let Some(l) = self.ledger.get() else {
            return false;
        };
        let Some(_g) = self.joining.try_lock() else {
            return self.state.load(Ordering::Acquire) == JOINED;
        };
        if self.state.load(Ordering::Acquire) != WAITING {
            return self.state.load(Ordering::Acquire) == JOINED;
        }
        let first = self.next_try_ns.load(Ordering::Relaxed) == 0;
        self.next_try_ns.store(
            now_ns(libc::CLOCK_MONOTONIC) + RETRY_INTERVAL.as_nanos() as u64,
            Ordering::Relaxed,
        );
        let joined = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            l.join_within(&self.spec.request(), wait)
        }))
        .unwrap_or_else(|_| {
            Err(LedgerError::io(
                l.path(),
                std::io::Error::other("ledger code panicked"),
            ))
        });
        match joined {
            Ok(m) => {
                let _ = self.member.set(m);
                self.state.store(JOINED, Ordering::Release);
                if !first {
                    tracing::warn!(
                        "{}: joined ledger {} after waiting; allocations are accepted again",
                        self.gpu,
                        l.path().display()
                    );
                }
                true
            }
            Err(e) if e.is_busy() || e.is_full() => {
                if first {
                    tracing::error!(
                        "{}: cannot join ledger {} yet ({e}); allocations on this GPU are refused (out of memory) until it can",
                        self.gpu,
                        l.path().display()
                    );
                }
                false
            }
            Err(e) => {
                self.go_alone(&e);
                false
            }
        }
    }

    /// While waiting: try again if the retry interval has passed.
    fn retry(&self) -> bool {
        let now = now_ns(libc::CLOCK_MONOTONIC);
        if now < self.next_try_ns.load(Ordering::Relaxed) {
            return false;
        }
        self.try_join(Duration::ZERO)
    }

    /// Charge `bytes`; false = refused (over quota, or waiting to join).
    pub fn reserve(&self, bytes: u64) -> bool {
        if bytes == 0 {
            return true;
        }
        loop {
            match self.state.load(Ordering::Acquire) {
                JOINED => {
                    let (Some(l), Some(m)) = (self.ledger.get(), self.member.get()) else {
                        return false;
                    };
                    if l.try_reserve(m, bytes).is_ok() {
                        return true;
                    }
                    // A dead sibling may still hold bytes: take them back
                    // now, then try once more.
                    return l.reclaim_for(m) && l.try_reserve(m, bytes).is_ok();
                }
                WAITING => {
                    if self.retry() {
                        continue;
                    }
                    if self.state.load(Ordering::Acquire) != WAITING {
                        continue;
                    }
                    let n = self.refused.fetch_add(1, Ordering::Relaxed);
                    if n % 1000 == 0 {
                        tracing::warn!(
                            "{}: allocation of {} refused: not joined to the GPU's ledger yet ({} refused so far)",
                            self.gpu,
                            crate::ledger::human_bytes(bytes),
                            n + 1
                        );
                    }
                    return false;
                }
                _ => return self.reserve_alone(bytes),
            }
        }
    }

    fn reserve_alone(&self, bytes: u64) -> bool {
        let limit = self.alone_limit.unwrap_or(u64::MAX);
        let mut cur = self.used.load(Ordering::Relaxed);
        loop {
            let Some(next) = cur.checked_add(bytes).filter(|n| *n <= limit) else {
                return false;
            };
            match self
                .used
                .compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => {
                    self.peak.fetch_max(next, Ordering::Relaxed);
                    return true;
                }
                Err(c) => cur = c,
            }
        }
    }

    /// Give back `bytes` charged earlier.
    pub fn release(&self, bytes: u64) {
        if bytes == 0 {
            return;
        }
        match self.state.load(Ordering::Acquire) {
            JOINED => {
                if let (Some(l), Some(m)) = (self.ledger.get(), self.member.get()) {
                    l.release(m, bytes)
                }
            }
            // Nothing was charged while waiting.
            WAITING => {}
            _ => {
                let _ = self
                    .used
                    .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |u| {
                        Some(u.saturating_sub(bytes))
                    });
            }
        }
    }

    /// The ledger and membership, once joined.
    pub fn ledger(&self) -> Option<(&Ledger, &Membership)> {
        if self.state.load(Ordering::Acquire) != JOINED {
            return None;
        }
        Some((self.ledger.get()?, self.member.get()?))
    }

    /// Joined (charges are shared with the container's other processes)?
    pub fn is_shared(&self) -> bool {
        self.ledger().is_some()
    }

    /// Not joined yet, allocations refused until it is.
    pub fn is_waiting(&self) -> bool {
        self.state.load(Ordering::Acquire) == WAITING
    }

    /// Bytes held by the whole container (this process alone when not joined).
    pub fn container_used(&self) -> u64 {
        match self.ledger() {
            Some((l, m)) => l.container_of(m).used.load(Ordering::Acquire),
            None => self.used.load(Ordering::Acquire),
        }
    }

    /// Bytes held by this process.
    pub fn process_used(&self) -> u64 {
        match self.ledger() {
            Some((l, m)) => l.process_of(m).used.load(Ordering::Acquire),
            None => self.used.load(Ordering::Acquire),
        }
    }

    /// Highest use when alone.
    pub fn alone_peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }

    /// Rate-limited, never blocking reap (memory-info paths).
    pub fn maybe_reap(&self) {
        if let Some((l, _)) = self.ledger() {
            l.maybe_reap(REAP_INTERVAL);
        }
    }

    /// Leave the ledger (exit handler). Safe while other threads allocate.
    pub fn leave(&self) {
        if let Some((l, m)) = self.ledger() {
            l.leave(m);
        }
    }

    /// `pthread_atfork` child handler: async-signal-safe.
    pub fn after_fork_child(&self) {
        if let Some(l) = self.ledger.get() {
            l.after_fork_child();
        }
    }
}
