//! This process's account on one GPU: the ledger membership through which
//! its allocations are charged to its container, and what happens when that
//! membership cannot be had or is lost.
//!
//! | situation | state | allocations |
//! |---|---|---|
//! | joined | `Joined` | charged to the container's shared quota |
//! | the slot-table lock is held by a process that does not let go (stopped by `SIGSTOP`, `docker pause`, a debugger; swapped out) | `Waiting` | **refused** (`CUDA_ERROR_OUT_OF_MEMORY`) until the join succeeds; retried at most every [`RETRY_INTERVAL`] without waiting |
//! | no free container or process slot | `Waiting` | refused likewise, until a slot frees |
//! | the ledger cannot be used at all (directory not writable, filesystem full, another format version) | `Alone` | charged to this process alone against the quota, with an error (always printed) saying the container's other processes are not counted |
//! | the joined ledger was truncated, wiped, deleted or replaced while in use | `Rejoin` | charged within this process against the quota last seen, counting from what the whole container held when last seen; every [`RETRY_INTERVAL`] (and from a watcher thread every [`WATCH_INTERVAL`]) the GPU's ledger is opened again (a corrupt one is set aside and rebuilt) and joined, and what this process holds is re-registered there |
//!
//! Waiting never lets an allocation through uncharged: a stalled process
//! can delay other processes' first allocation on that GPU (by at most
//! [`JOIN_WAIT`], then they are refused), never make the container pass its
//! quota.
use super::*;
use crate::process::clock::monotonic_ns;
use std::sync::atomic::{AtomicPtr, AtomicU8};

/// Longest the first join on a GPU waits for the slot-table lock. A live
/// holder keeps it for microseconds; a holder that keeps it longer is
/// stalled, and the process then refuses allocations until it can join.
pub const JOIN_WAIT: Duration = Duration::from_millis(500);
/// Least time between two join attempts while waiting or rejoining (each
/// is one attempt that does not wait for the lock).
pub const RETRY_INTERVAL: Duration = Duration::from_millis(10);
/// How often the watcher thread checks that each joined ledger is still
/// the file its path names, and intact.
pub const WATCH_INTERVAL: Duration = Duration::from_millis(250);

const JOINED: u8 = 0;
const WAITING: u8 = 1;
const ALONE: u8 = 2;
const REJOIN: u8 = 3;
/// Left at exit: the watcher and later calls leave the ledger alone.
const LEFT: u8 = 4;

/// What this process asks of a GPU's ledger (owned [`JoinRequest`]).
#[derive(Debug, Clone)]
pub struct JoinSpec {
    pub container_id: String,
    /// As [`JoinRequest::key`].
    pub key: u64,
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
            key: self.key,
            quota: self.quota,
            weight: self.weight,
            highprio: self.highprio,
            enforce_off: self.enforce_off,
        }
    }
}

/// An import recorded in the table of shared allocations of the ledger
/// this process was joined to when it imported (see `Account::share_register`).
#[derive(Clone, Copy)]
pub struct ShareLink {
    j: &'static Joined,
    entry: usize,
}

impl ShareLink {
    /// Mapped up to `extent`: who pays (see [`Ledger::share_grow`]).
    pub fn grow(&self, extent: u64) -> SharePayer {
        self.j.ledger.share_grow(&self.j.m, self.entry, extent)
    }

    /// Let go of: what this process's slot bore is given back (see
    /// [`Ledger::share_release`]).
    pub fn release(&self) -> u64 {
        self.j.ledger.share_release(&self.j.m, self.entry)
    }
}

/// A ledger joined (never freed once published: other threads may still
/// hold references to it after it was replaced).
struct Joined {
    ledger: Ledger,
    m: Membership,
}

/// Where the GPU's ledger lives.
struct Place {
    dir: PathBuf,
    uuid: String,
    gpu_index: u32,
    physical_total: u64,
}

/// This process's account on one GPU (see the module docs).
pub struct Account {
    /// For messages: `GPU <index> (<uuid>)`.
    gpu: String,
    place: Option<Place>,
    spec: JoinSpec,
    /// The limit used when alone (`None`: not limited).
    alone_limit: Option<u64>,
    state: AtomicU8,
    /// The ledger being joined while waiting (leaked, never freed).
    opened: AtomicPtr<Ledger>,
    /// The ledger joined (leaked, never freed; replaced after a rejoin).
    joined: AtomicPtr<Joined>,
    /// Serialises join attempts and the switch in and out of `Rejoin`.
    joining: parking_lot::Mutex<()>,
    /// CLOCK_MONOTONIC ns before which no new join attempt is made.
    next_try_ns: AtomicU64,
    /// Refusals while waiting (the first, then every 1000th, is logged).
    refused: AtomicU64,
    /// Used when alone or rejoining (the count enforced within the process).
    used: AtomicU64,
    peak: AtomicU64,
    /// Bytes this process holds through this account, whatever the state.
    mine: AtomicU64,
    /// The container's quota (0: none) and enforcement, and what it held,
    /// when the joined ledger was last seen intact.
    seen_quota: AtomicU64,
    seen_enforce: AtomicBool,
    seen_used: AtomicU64,
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
        let place = Place {
            dir: dir.to_owned(),
            uuid: uuid.to_owned(),
            gpu_index,
            physical_total,
        };
        let a = Account::new(gpu, Some(place), spec, alone_limit, WAITING);
        match a.open_ledger() {
            Ok(l) => {
                a.opened
                    .store(Box::into_raw(Box::new(l)), Ordering::Release);
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
            key: 0,
            quota: 0,
            weight: 1,
            highprio: false,
            enforce_off: false,
        };
        Account::new(gpu, None, spec, alone_limit, ALONE)
    }

    fn new(
        gpu: String,
        place: Option<Place>,
        spec: JoinSpec,
        alone_limit: Option<u64>,
        state: u8,
    ) -> Account {
        Account {
            gpu,
            place,
            spec,
            alone_limit,
            state: AtomicU8::new(state),
            opened: AtomicPtr::new(std::ptr::null_mut()),
            joined: AtomicPtr::new(std::ptr::null_mut()),
            joining: parking_lot::Mutex::new(()),
            next_try_ns: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            used: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            mine: AtomicU64::new(0),
            seen_quota: AtomicU64::new(0),
            seen_enforce: AtomicBool::new(false),
            seen_used: AtomicU64::new(0),
        }
    }

    fn open_ledger(&self) -> Result<Ledger, LedgerError> {
        let Some(p) = &self.place else {
            return Err(LedgerError::io(
                Path::new("-"),
                std::io::Error::other("no ledger"),
            ));
        };
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            Ledger::open_or_create(&p.dir, &p.uuid, p.gpu_index, p.physical_total)
        }))
        .unwrap_or_else(|_| {
            Err(LedgerError::io(
                &p.dir,
                std::io::Error::other("ledger code panicked"),
            ))
        })
    }

    fn go_alone(&self, e: &LedgerError) {
        let limit = match self.alone_limit {
            Some(q) => format!("its quota ({})", human_bytes(q)),
            None => "no limit (none was set)".to_string(),
        };
        tracing::error!(
            "{}: the ledger cannot be used ({e}); enforcing {limit} within this process alone: the container's other processes on this GPU are NOT counted against it",
            self.gpu
        );
        self.state.store(ALONE, Ordering::Release);
    }

    fn joined(&self) -> Option<&Joined> {
        let p = self.joined.load(Ordering::Acquire);
        // SAFETY: `joined` only ever holds leaked boxes (never freed).
        (!p.is_null()).then(|| unsafe { &*p })
    }

    fn publish(&self, l: Ledger, m: Membership) {
        let j = Box::into_raw(Box::new(Joined { ledger: l, m }));
        self.joined.store(j, Ordering::Release);
        // SAFETY: just published, never freed.
        self.note_seen(unsafe { &*j });
        self.state.store(JOINED, Ordering::Release);
    }

    /// One join attempt on the opened ledger (waiting at most `wait`).
    fn try_join(&self, wait: Duration) -> bool {
        let p = self.opened.load(Ordering::Acquire);
        if p.is_null() {
            return false;
        }
        let Some(_g) = self.joining.try_lock() else {
            return self.state.load(Ordering::Acquire) == JOINED;
        };
        if self.state.load(Ordering::Acquire) != WAITING {
            return self.state.load(Ordering::Acquire) == JOINED;
        }
        // SAFETY: `opened` holds a leaked box, never freed.
        let l: &Ledger = unsafe { &*p };
        let first = self.next_try_ns.load(Ordering::Relaxed) == 0;
        self.next_try_ns.store(
            monotonic_ns() + RETRY_INTERVAL.as_nanos() as u64,
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
                // Hand the handle over to `joined` (the leaked box in
                // `opened` is never read again).
                self.opened.store(std::ptr::null_mut(), Ordering::Release);
                // SAFETY: `p` came from Box::into_raw and nobody else takes it.
                let l = *unsafe { Box::from_raw(p) };
                let path = l.path().display().to_string();
                self.publish(l, m);
                if !first {
                    tracing::warn!(
                        "{}: joined ledger {path} after waiting; allocations are accepted again",
                        self.gpu
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

    /// Remember the container's quota and use, for a possible `Rejoin`.
    #[inline]
    fn note_seen(&self, j: &Joined) {
        let c = j.ledger.container_of(&j.m);
        let q = c.quota.load(Ordering::Acquire);
        self.seen_quota.store(q, Ordering::Relaxed);
        self.seen_enforce.store(
            c.enforce_off.load(Ordering::Relaxed) == 0,
            Ordering::Relaxed,
        );
        self.seen_used
            .store(c.used.load(Ordering::Acquire), Ordering::Relaxed);
    }

    /// Is the joined ledger still one we can trust?
    #[inline]
    fn healthy(j: &Joined) -> bool {
        !j.ledger.is_damaged() && j.ledger.membership_intact(&j.m)
    }

    /// The joined ledger `j` is damaged or replaced: enforce what was known
    /// within the process, drop our locks on it, and look for a usable one.
    fn lose(&self, j: &Joined, why: &str) {
        {
            let _g = self.joining.lock();
            if self.state.load(Ordering::Acquire) != JOINED
                || !std::ptr::eq(self.joined.load(Ordering::Acquire), j)
            {
                return; // another thread did it
            }
            let mine = self.mine.load(Ordering::Acquire);
            let start = self.seen_used.load(Ordering::Relaxed).max(mine);
            self.used.store(start, Ordering::Release);
            self.state.store(REJOIN, Ordering::Release);
            let q = self.seen_quota.load(Ordering::Relaxed);
            tracing::error!(
                "{}: ledger {} {why} while in use; holding this process to the last known quota ({}) counting from what the container held ({}; this process {}) until a usable ledger is back",
                self.gpu,
                j.ledger.path().display(),
                if q == 0 { "none".to_string() } else { human_bytes(q) },
                human_bytes(start),
                human_bytes(mine)
            );
            j.ledger.abandon();
            self.next_try_ns.store(0, Ordering::Relaxed);
        }
        self.try_rejoin();
    }

    /// In `Rejoin`: open the GPU's ledger again (a corrupt file is set
    /// aside and rebuilt), join it, re-register what this process holds.
    fn try_rejoin(&self) -> bool {
        let now = monotonic_ns();
        if now < self.next_try_ns.load(Ordering::Relaxed) {
            return false;
        }
        self.next_try_ns
            .store(now + RETRY_INTERVAL.as_nanos() as u64, Ordering::Relaxed);
        let Ok(l) = self.open_ledger() else {
            return false;
        };
        let Ok(m) = l.join_within(&self.spec.request(), Duration::ZERO) else {
            return false;
        };
        let _g = self.joining.lock();
        if self.state.load(Ordering::Acquire) != REJOIN {
            drop(_g);
            l.leave(&m);
            return self.state.load(Ordering::Acquire) == JOINED;
        }
        let mine = self.mine.load(Ordering::Acquire);
        l.register_held(&m, mine);
        let path = l.path().display().to_string();
        self.publish(l, m);
        tracing::warn!(
            "{}: joined ledger {path} again; re-registered the {} this process holds",
            self.gpu,
            human_bytes(mine)
        );
        true
    }

    /// While waiting: try again if the retry interval has passed.
    fn retry(&self) -> bool {
        if monotonic_ns() < self.next_try_ns.load(Ordering::Relaxed) {
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
                    let Some(j) = self.joined() else { return false };
                    if !Self::healthy(j) {
                        self.lose(j, "was truncated, wiped or overwritten");
                        continue;
                    }
                    let mut ok = j.ledger.try_reserve(&j.m, bytes).is_ok();
                    // A dead sibling may still hold bytes: take them back
                    // now, then try once more.
                    if !ok && j.ledger.reclaim_for(&j.m) {
                        ok = j.ledger.try_reserve(&j.m, bytes).is_ok();
                    }
                    if !Self::healthy(j) {
                        // Whatever happened went to memory we no longer
                        // trust: decide again from what we know.
                        self.lose(j, "was truncated, wiped or overwritten");
                        continue;
                    }
                    if ok {
                        self.mine.fetch_add(bytes, Ordering::AcqRel);
                    }
                    self.note_seen(j);
                    return ok;
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
                            human_bytes(bytes),
                            n + 1
                        );
                    }
                    return false;
                }
                REJOIN => {
                    if self.try_rejoin() {
                        continue;
                    }
                    let _g = self.joining.lock();
                    if self.state.load(Ordering::Acquire) != REJOIN {
                        continue;
                    }
                    let q = self.seen_quota.load(Ordering::Relaxed);
                    let limit = (q != 0 && self.seen_enforce.load(Ordering::Relaxed)).then_some(q);
                    let ok = self.reserve_local(bytes, limit);
                    if ok {
                        self.mine.fetch_add(bytes, Ordering::AcqRel);
                    }
                    return ok;
                }
                _ => {
                    let ok = self.reserve_local(bytes, self.alone_limit);
                    if ok {
                        self.mine.fetch_add(bytes, Ordering::AcqRel);
                    }
                    return ok;
                }
            }
        }
    }

    fn reserve_local(&self, bytes: u64, limit: Option<u64>) -> bool {
        let limit = limit.unwrap_or(u64::MAX);
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
        loop {
            match self.state.load(Ordering::Acquire) {
                JOINED => {
                    let Some(j) = self.joined() else { return };
                    if !Self::healthy(j) {
                        self.lose(j, "was truncated, wiped or overwritten");
                        continue;
                    }
                    j.ledger.release(&j.m, bytes);
                }
                // Nothing was charged while waiting.
                WAITING => return,
                REJOIN => {
                    let _g = self.joining.lock();
                    if self.state.load(Ordering::Acquire) != REJOIN {
                        continue;
                    }
                    sat_sub(&self.used, bytes);
                }
                _ => {
                    sat_sub(&self.used, bytes);
                }
            }
            sat_sub(&self.mine, bytes);
            return;
        }
    }

    /// `cuMemImportFromShareableHandle` of memory exported by `exporter_pid`
    /// (as this process's PID namespace numbers it): if that is a live
    /// process of this container, the import is recorded in the ledger's
    /// table of shared allocations and the link returned (the exporter
    /// pays while it lives, this process after). `Ok(None)`: not joined, or
    /// not a live process of the container.
    pub fn share_register(
        &'static self,
        exporter_pid: i32,
    ) -> Result<Option<ShareLink>, LedgerError> {
        if self.state.load(Ordering::Acquire) != JOINED {
            return Ok(None);
        }
        let Some(j) = self.joined() else {
            return Ok(None);
        };
        Ok(j.ledger
            .share_register(&j.m, exporter_pid)?
            .map(|entry| ShareLink { j, entry }))
    }

    /// Is `link` on the ledger this process is joined to now? (Not after
    /// the file was deleted or replaced and joined again: its entries are
    /// nobody's to pass on any more.)
    pub fn share_current(&self, link: &ShareLink) -> bool {
        self.state.load(Ordering::Acquire) == JOINED
            && self.joined().is_some_and(|j| std::ptr::eq(j, link.j))
    }

    /// The exporter of `link`'s import went and this process's slot was
    /// charged `bytes` for it: count them as this process's own from now
    /// on. Returns what is counted (0 when `link` is on a ledger this
    /// process has since left: its bytes are given back there, and the
    /// caller charges itself afresh).
    pub fn share_adopt(&self, link: &ShareLink, bytes: u64) -> u64 {
        if self.share_current(link) {
            self.mine.fetch_add(bytes, Ordering::AcqRel);
            return bytes;
        }
        link.j.ledger.release(&link.j.m, bytes);
        0
    }

    /// The ledger and membership, once joined.
    pub fn ledger(&self) -> Option<(&Ledger, &Membership)> {
        if self.state.load(Ordering::Acquire) != JOINED {
            return None;
        }
        let j = self.joined()?;
        Some((&j.ledger, &j.m))
    }

    /// Joined (charges are shared with the container's other processes)?
    pub fn is_shared(&self) -> bool {
        self.ledger().is_some()
    }

    /// Not joined yet, allocations refused until it is.
    pub fn is_waiting(&self) -> bool {
        self.state.load(Ordering::Acquire) == WAITING
    }

    /// Lost its ledger and enforcing what it knew until it joins again.
    pub fn is_rejoining(&self) -> bool {
        self.state.load(Ordering::Acquire) == REJOIN
    }

    /// Bytes held by the whole container (as far as this process knows when
    /// not joined).
    pub fn container_used(&self) -> u64 {
        match self.ledger() {
            Some((l, m)) => l.container_of(m).used.load(Ordering::Acquire),
            None => self.used.load(Ordering::Acquire),
        }
    }

    /// Bytes held by this process.
    pub fn process_used(&self) -> u64 {
        self.mine.load(Ordering::Acquire)
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

    /// One check (the watcher thread, every [`WATCH_INTERVAL`]): is the
    /// joined ledger intact and still the file its path names? If not,
    /// move on (see `Rejoin`); when rejoining, try again.
    pub fn check(&self) {
        match self.state.load(Ordering::Acquire) {
            JOINED => {
                let Some(j) = self.joined() else { return };
                if j.ledger.is_stale() {
                    return; // a forked child's copy
                }
                if !Self::healthy(j) {
                    self.lose(j, "was truncated, wiped or overwritten");
                } else if j.ledger.is_replaced() {
                    self.lose(j, "was deleted or replaced by another file");
                } else {
                    self.note_seen(j);
                }
            }
            REJOIN => {
                self.try_rejoin();
            }
            _ => {}
        }
    }

    /// Check this account every [`WATCH_INTERVAL`] from a watcher thread
    /// (one per process, started on first use, again in a forked child),
    /// so that a process that does not allocate still notices a damaged or
    /// replaced ledger and re-registers what it holds.
    pub fn watch(&'static self) {
        watcher::add(self);
    }

    /// Leave the ledger (exit handler). Safe while other threads allocate.
    /// The account is LEFT first, so that the watcher thread (and any call
    /// still made during a long teardown) does not take the slot we just
    /// gave up for a damaged ledger and register the process again.
    pub fn leave(&self) {
        let joined = self.ledger();
        self.state.store(LEFT, Ordering::Release);
        if let Some((l, m)) = joined {
            l.leave(m);
        }
    }

    /// `pthread_atfork` child handler: async-signal-safe.
    pub fn after_fork_child(&self) {
        let p = self.opened.load(Ordering::Acquire);
        if !p.is_null() {
            // SAFETY: leaked box, never freed.
            unsafe { &*p }.after_fork_child();
        }
        if let Some(j) = self.joined() {
            j.ledger.after_fork_child();
        }
        watcher::forget_after_fork();
    }
}

/// The watcher thread (one per process) and the accounts it checks.
mod watcher {
    use super::*;
    use std::sync::atomic::AtomicU32;

    const MAX: usize = 64;
    static ACCOUNTS: [AtomicPtr<Account>; MAX] =
        [const { AtomicPtr::new(std::ptr::null_mut()) }; MAX];
    /// Pid of the process whose watcher runs (0: none).
    static RUNNING: AtomicU32 = AtomicU32::new(0);

    pub(super) fn add(a: &'static Account) {
        let p = a as *const Account as *mut Account;
        if !ACCOUNTS.iter().any(|s| {
            s.compare_exchange(std::ptr::null_mut(), p, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        }) {
            tracing::warn!(
                "{}: more than {MAX} GPUs watched; this one is checked on allocation only",
                a.gpu
            );
        }
        let pid = std::process::id();
        if RUNNING.swap(pid, Ordering::AcqRel) != pid {
            let spawned = std::thread::Builder::new()
                .name("cgpu-watch".into())
                .spawn(run);
            if let Err(e) = spawned {
                RUNNING.store(0, Ordering::Release);
                tracing::warn!("cannot start the ledger watcher thread ({e}); ledgers are checked on allocation only");
            }
        }
    }

    /// In a forked child (async-signal-safe: atomics only): the parent's
    /// accounts are not ours, and the watcher thread did not survive.
    pub(super) fn forget_after_fork() {
        for s in ACCOUNTS.iter() {
            s.store(std::ptr::null_mut(), Ordering::Release);
        }
        RUNNING.store(0, Ordering::Release);
    }

    fn run() {
        let me = std::process::id();
        loop {
            std::thread::sleep(WATCH_INTERVAL);
            if RUNNING.load(Ordering::Acquire) != me {
                return;
            }
            for s in ACCOUNTS.iter() {
                let p = s.load(Ordering::Acquire);
                if !p.is_null() {
                    // SAFETY: only leaked, 'static accounts are added.
                    let a = unsafe { &*p };
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| a.check()));
                }
            }
        }
    }
}
