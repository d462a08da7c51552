//! This process's account on one GPU: the ledger membership through which
//! its allocations are charged to its container, and what happens when that
//! membership cannot be had or is lost.
//!
//! The rule: **when cgpu cannot account for an allocation together with the
//! rest of the container, it refuses it, and says so.** An allocation is
//! never granted on this process's word alone.
//!
//! | situation | state | allocations |
//! |---|---|---|
//! | joined | `Joined` | charged to the container's shared quota |
//! | the slot-table lock is held by a process that does not let go (stopped by `SIGSTOP`, `docker pause`, a debugger; swapped out) | `Waiting` | **refused** (`CUDA_ERROR_OUT_OF_MEMORY`) until the join succeeds |
//! | no free container or process slot | `Waiting` | refused likewise, until a slot frees |
//! | the ledger cannot be used at all (directory missing, not a directory, not writable or read-only, filesystem full, no descriptor left, a format version this build cannot share, a damaged file being rebuilt) | `Waiting` | refused likewise, with one error (always printed) naming the cause and the fix, until it can be used |
//! | the joined ledger was truncated, wiped, deleted, replaced or damaged while in use | `Waiting` | refused likewise; the GPU's ledger is opened again (a damaged one is rebuilt as a new generation) and joined, and what this process holds is re-registered there |
//!
//! While waiting, a join is tried again at most every [`RETRY_INTERVAL`]
//! from the allocation path and every [`WATCH_INTERVAL`] from a watcher
//! thread, so a process heals by itself (space back, descriptors back,
//! directory fixed) even when it does not allocate. A process whose ledger
//! keeps being lost soon after each join backs off (up to
//! [`MAX_REJOIN_BACKOFF`] between joins), so another process rewriting its
//! slot cannot make it re-map the file without bound.
//!
//! Waiting never lets an allocation through uncharged: a stalled process
//! can delay other processes' first allocation on that GPU (by at most
//! [`JOIN_WAIT`], then they are refused), never make the container pass its
//! quota.
use super::*;
use crate::clock::monotonic_ns;
use std::sync::atomic::{AtomicPtr, AtomicU8};

/// Longest the first join on a GPU waits for the slot-table lock. A live
/// holder keeps it for microseconds; a holder that keeps it longer is
/// stalled, and the process then refuses allocations until it can join.
pub const JOIN_WAIT: Duration = Duration::from_millis(500);
/// Least time between two join attempts while waiting (each is one attempt
/// that does not wait for the lock).
pub const RETRY_INTERVAL: Duration = Duration::from_millis(10);
/// How often the watcher thread checks that each joined ledger is still
/// the file its path names, and intact, and tries again to join where a
/// join is awaited.
pub const WATCH_INTERVAL: Duration = Duration::from_millis(250);
/// Longest wait between joins for a process whose ledger keeps being lost
/// within a second of each join (the wait doubles from [`RETRY_INTERVAL`]).
pub const MAX_REJOIN_BACKOFF: Duration = Duration::from_secs(1);

/// Why a joined ledger was given up when its path names another file.
const REPLACED: &str = "was deleted or replaced by another file";

const JOINED: u8 = 0;
const WAITING: u8 = 1;
/// Left at exit: the watcher and later calls leave the ledger alone, and
/// allocations are refused.
const LEFT: u8 = 4;
/// Unit tests of callers only: accounting within the process.
#[cfg(any(test, feature = "test-local"))]
const LOCAL: u8 = 5;

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
/// hold references to it after it was replaced; its mapping is then
/// swapped for private memory, see [`Ledger::retire`]).
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
    /// The limit of a [`LOCAL`] account (unit tests).
    #[cfg(any(test, feature = "test-local"))]
    local_limit: Option<u64>,
    state: AtomicU8,
    /// The ledger opened but not joined yet, while waiting (a box owned by
    /// the account; read and replaced only under `joining`).
    opened: AtomicPtr<Ledger>,
    /// The ledger joined (leaked, never freed; replaced after a rejoin).
    joined: AtomicPtr<Joined>,
    /// Serialises join attempts, the switch out of `Joined`, and releases
    /// while waiting (so that what is re-registered at a join is exact).
    joining: parking_lot::Mutex<()>,
    /// CLOCK_MONOTONIC ns before which no new join attempt is made.
    next_try_ns: AtomicU64,
    /// CLOCK_MONOTONIC ns of the last join, and the wait before the next
    /// join after a loss (see [`MAX_REJOIN_BACKOFF`]).
    joined_ns: AtomicU64,
    backoff_ns: AtomicU64,
    /// (device, inode) of the ledger file last lost to damage: opened
    /// again, it is rebuilt whatever it claims to be (see `file::open_or_create`).
    lost: parking_lot::Mutex<Option<(u64, u64)>>,
    /// Refusals while waiting (the first, then every 1000th, is logged).
    refused: AtomicU64,
    /// A hash of the last cause logged while waiting (each new cause is
    /// logged once, as an error).
    said: AtomicU64,
    /// Used by a [`LOCAL`] account (unit tests).
    #[cfg(any(test, feature = "test-local"))]
    used: AtomicU64,
    #[cfg(any(test, feature = "test-local"))]
    peak: AtomicU64,
    /// Bytes this process holds through this account, whatever the state
    /// (re-registered at each join).
    mine: AtomicU64,
}

impl std::fmt::Debug for Account {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Account")
            .field("gpu", &self.gpu)
            .field("state", &self.state.load(Ordering::Relaxed))
            .finish()
    }
}

/// The fix to suggest for a ledger that cannot be used.
fn fix_for(e: &LedgerError, dir: &Path) -> String {
    let dir = dir.display();
    match e {
        LedgerError::Io { err, .. } => {
            use std::io::ErrorKind as K;
            match (err.raw_os_error(), err.kind()) {
                (Some(libc::ENOSPC) | Some(libc::EDQUOT), _) | (_, K::StorageFull) => {
                    format!("free space on the filesystem of {dir}")
                }
                (Some(libc::EMFILE) | Some(libc::ENFILE), _) => {
                    "raise the process's descriptor limit (ulimit -n) or close descriptors".into()
                }
                (Some(libc::ENOENT), _) | (_, K::NotFound) => format!(
                    "create it on the host (`systemd-tmpfiles --create` with cgpu's tmpfiles.d entry, or `mkdir -m 1777 {dir}`) and mount it into the container (-v {dir}:{dir})"
                ),
                (Some(libc::ENOTDIR), _) | (_, K::NotADirectory) => {
                    format!("make {dir} a directory (mode 1777) or point CGPU_LEDGER_DIR at one")
                }
                (_, K::TimedOut) => "resume or end the stopped process that holds the lock".into(),
                (Some(libc::EROFS) | Some(libc::EACCES) | Some(libc::EPERM), _)
                | (_, K::ReadOnlyFilesystem | K::PermissionDenied | K::InvalidInput) => format!(
                    "make {dir} a real directory (not a symbolic link) owned by root, mode 1777, writable by every container's uid and not mounted read-only; or point CGPU_LEDGER_DIR at an absolute path of one"
                ),
                _ => format!("make {dir} usable (a writable directory on a filesystem with space)"),
            }
        }
        LedgerError::Version { .. } => {
            "run one cgpu version on this GPU: let the jobs of the other version finish, or upgrade them".into()
        }
        LedgerError::Corrupt { .. } => "none needed: a new ledger is being built".into(),
        LedgerError::Full { .. } => "wait for containers or processes on this GPU to end".into(),
    }
}

fn hash(s: &str) -> u64 {
    // FNV-1a: only to tell one message from the next.
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    })
}

impl Account {
    /// Open (or create) the GPU's ledger in `dir` and join it, waiting at
    /// most [`JOIN_WAIT`] for the table lock. Never fails: see the states
    /// in the module docs.
    pub fn open(
        dir: &Path,
        uuid: &str,
        gpu_index: u32,
        physical_total: u64,
        gpu: String,
        spec: JoinSpec,
    ) -> Account {
        let place = Place {
            dir: dir.to_owned(),
            uuid: uuid.to_owned(),
            gpu_index,
            physical_total,
        };
        let a = Account::new(gpu, Some(place), spec, WAITING);
        a.try_join(JOIN_WAIT);
        a
    }

    /// An account that charges within the process only, against `limit`
    /// (unit tests of callers; never used outside tests).
    #[cfg(any(test, feature = "test-local"))]
    pub fn local(gpu: String, limit: Option<u64>) -> Account {
        let spec = JoinSpec {
            container_id: String::new(),
            key: 0,
            quota: 0,
            weight: 1,
            highprio: false,
            enforce_off: false,
        };
        let mut a = Account::new(gpu, None, spec, LOCAL);
        a.local_limit = limit;
        a
    }

    fn new(gpu: String, place: Option<Place>, spec: JoinSpec, state: u8) -> Account {
        Account {
            gpu,
            place,
            spec,
            #[cfg(any(test, feature = "test-local"))]
            local_limit: None,
            state: AtomicU8::new(state),
            opened: AtomicPtr::new(std::ptr::null_mut()),
            joined: AtomicPtr::new(std::ptr::null_mut()),
            joining: parking_lot::Mutex::new(()),
            next_try_ns: AtomicU64::new(0),
            joined_ns: AtomicU64::new(0),
            backoff_ns: AtomicU64::new(RETRY_INTERVAL.as_nanos() as u64),
            lost: parking_lot::Mutex::new(None),
            refused: AtomicU64::new(0),
            said: AtomicU64::new(0),
            #[cfg(any(test, feature = "test-local"))]
            used: AtomicU64::new(0),
            #[cfg(any(test, feature = "test-local"))]
            peak: AtomicU64::new(0),
            mine: AtomicU64::new(0),
        }
    }

    fn open_ledger(&self) -> Result<Ledger, LedgerError> {
        let Some(p) = &self.place else {
            return Err(LedgerError::io(
                Path::new("-"),
                std::io::Error::other("no ledger"),
            ));
        };
        let lost = *self.lost.lock();
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            file::open_or_create(
                &p.dir,
                &p.uuid,
                p.gpu_index,
                p.physical_total,
                lost,
                SHARED_MODE,
            )
        }))
        .unwrap_or_else(|_| {
            Err(LedgerError::io(
                &p.dir,
                std::io::Error::other("ledger code panicked"),
            ))
        })
    }

    /// While waiting: say why allocations are refused, once per cause (an
    /// error, printed whatever the log level).
    fn say_waiting(&self, e: &LedgerError) {
        let dir = self
            .place
            .as_ref()
            .map_or(Path::new("-"), |p| p.dir.as_path());
        let msg = format!(
            "{}: allocations on this GPU are refused (out of memory) until this process can join the GPU's ledger: {e}; fix: {}. cgpu retries on its own and accepts allocations again as soon as it joins",
            self.gpu,
            fix_for(e, dir)
        );
        let h = hash(&msg);
        if self.said.swap(h, Ordering::Relaxed) != h {
            tracing::error!("{msg}");
        }
    }

    fn joined(&self) -> Option<&Joined> {
        let p = self.joined.load(Ordering::Acquire);
        // SAFETY: `joined` only ever holds leaked boxes (never freed).
        (!p.is_null()).then(|| unsafe { &*p })
    }

    /// Drop the ledger opened while waiting (under `joining`).
    fn drop_opened(&self) {
        let p = self.opened.swap(std::ptr::null_mut(), Ordering::AcqRel);
        if !p.is_null() {
            // SAFETY: `opened` holds boxes made by `try_join`, read and
            // replaced only under `joining` (held by the caller): nobody
            // else references this one.
            drop(unsafe { Box::from_raw(p) });
        }
    }

    /// One join attempt (waiting at most `wait` for the table lock): open
    /// the ledger if not open yet, join it, re-register what this process
    /// holds. Rate-limited (see [`RETRY_INTERVAL`], [`MAX_REJOIN_BACKOFF`]).
    fn try_join(&self, wait: Duration) -> bool {
        // Another thread's attempt (the watcher's, say) is waited for, so
        // that an allocation made just as the ledger becomes usable is not
        // refused for having met it halfway.
        let Some(_g) = self.joining.try_lock_for(JOIN_WAIT) else {
            return self.state.load(Ordering::Acquire) == JOINED;
        };
        if self.state.load(Ordering::Acquire) != WAITING {
            return self.state.load(Ordering::Acquire) == JOINED;
        }
        let now = monotonic_ns();
        if now < self.next_try_ns.load(Ordering::Relaxed) {
            return false;
        }
        self.next_try_ns
            .store(now + RETRY_INTERVAL.as_nanos() as u64, Ordering::Relaxed);
        if self.opened.load(Ordering::Acquire).is_null() {
            match self.open_ledger() {
                Ok(l) => self
                    .opened
                    .store(Box::into_raw(Box::new(l)), Ordering::Release),
                Err(e) => {
                    self.say_waiting(&e);
                    return false;
                }
            }
        }
        // SAFETY: `opened` holds a box owned by the account, replaced only
        // under `joining`, which we hold.
        let l: &Ledger = unsafe { &*self.opened.load(Ordering::Acquire) };
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
                let p = self.opened.swap(std::ptr::null_mut(), Ordering::AcqRel);
                // SAFETY: `p` came from Box::into_raw; we hold `joining`
                // and just took it out of `opened`.
                let l = *unsafe { Box::from_raw(p) };
                // Under `joining`: releases while waiting take it too, and
                // reservations are refused, so `mine` is exact here.
                let mine = self.mine.load(Ordering::Acquire);
                l.register_held(&m, mine);
                let path = l.path().display().to_string();
                let again = self.said.swap(0, Ordering::Relaxed) != 0
                    || !self.joined.load(Ordering::Acquire).is_null();
                let j = Box::into_raw(Box::new(Joined { ledger: l, m }));
                self.joined.store(j, Ordering::Release);
                self.joined_ns.store(monotonic_ns(), Ordering::Relaxed);
                self.state.store(JOINED, Ordering::Release);
                if again {
                    tracing::warn!(
                        "{}: joined ledger {path}; re-registered the {} this process holds; allocations are accepted again",
                        self.gpu,
                        human_bytes(mine)
                    );
                }
                true
            }
            Err(e) => {
                self.say_waiting(&e);
                if !(e.is_busy() || e.is_full()) {
                    // Open again next time (the file may be rebuilt or
                    // replaced meanwhile).
                    self.drop_opened();
                }
                false
            }
        }
    }

    /// Is the joined ledger still one we can trust?
    #[inline]
    fn healthy(&self, j: &Joined) -> bool {
        j.ledger.header_intact()
            && j.ledger.membership_intact(&j.m)
            && j.ledger.container_of(&j.m).is(&self.spec.container_id)
            && j.ledger.container_of(&j.m).id_intact() != Some(false)
    }

    /// The joined ledger `j` is damaged or replaced: stop using it (its
    /// mapping is swapped for private memory and its locks dropped, so a
    /// damaged file can be rebuilt), refuse until a usable one is joined,
    /// and try to join now.
    fn lose(&self, j: &Joined, why: &str) {
        {
            let _g = self.joining.lock();
            if self.state.load(Ordering::Acquire) != JOINED
                || !std::ptr::eq(self.joined.load(Ordering::Acquire), j)
            {
                return; // another thread did it
            }
            self.state.store(WAITING, Ordering::Release);
            // Reservations in flight on `j` finish (and count in `mine`)
            // before `mine` is read for the next join; later ones see
            // WAITING.
            j.m.retire();
            tracing::error!(
                "{}: ledger {} {why} while in use; allocations on this GPU are refused (out of memory) until a usable ledger is joined and the {} this process holds is re-registered there",
                self.gpu,
                j.ledger.path().display(),
                human_bytes(self.mine.load(Ordering::Acquire))
            );
            if why != REPLACED {
                *self.lost.lock() = Some(j.ledger.ino);
            }
            j.ledger.abandon();
            j.ledger.retire();
            // Lost again within a second of joining: back off.
            let now = monotonic_ns();
            let quick = now.saturating_sub(self.joined_ns.load(Ordering::Relaxed)) < 1_000_000_000;
            let b = if quick {
                (self.backoff_ns.load(Ordering::Relaxed) * 2)
                    .min(MAX_REJOIN_BACKOFF.as_nanos() as u64)
            } else {
                RETRY_INTERVAL.as_nanos() as u64
            };
            self.backoff_ns.store(b, Ordering::Relaxed);
            self.next_try_ns
                .store(if quick { now + b } else { 0 }, Ordering::Relaxed);
        }
        self.try_join(Duration::ZERO);
    }

    /// Charge `bytes`; false = refused (over quota, or not joined).
    pub fn reserve(&self, bytes: u64) -> bool {
        if bytes == 0 {
            return true;
        }
        loop {
            match self.state.load(Ordering::Acquire) {
                JOINED => {
                    let Some(j) = self.joined() else { return false };
                    if !self.healthy(j) {
                        self.lose(j, "was truncated, wiped, overwritten or damaged");
                        continue;
                    }
                    // Counted in flight on `j.m`: a loss of `j` waits for
                    // this reservation, so that what it adds to `mine` is
                    // re-registered on the next ledger.
                    let Some(_in) = j.m.enter() else {
                        if self.state.load(Ordering::Acquire) == LEFT {
                            return false;
                        }
                        std::thread::yield_now();
                        continue;
                    };
                    let mut ok = j.ledger.try_reserve(&j.m, bytes).is_ok();
                    // A dead sibling may still hold bytes: take them back
                    // now, then try once more.
                    if !ok && j.ledger.reclaim_for(&j.m) {
                        ok = j.ledger.try_reserve(&j.m, bytes).is_ok();
                    }
                    if ok {
                        self.mine.fetch_add(bytes, Ordering::AcqRel);
                    }
                    drop(_in);
                    if !self.healthy(j) {
                        // Whatever happened went to memory we no longer
                        // trust: what we hold is re-registered at the next
                        // join (this reservation included when granted).
                        self.lose(j, "was truncated, wiped, overwritten or damaged");
                    }
                    return ok;
                }
                WAITING => {
                    if self.try_join(Duration::ZERO) {
                        continue;
                    }
                    if self.state.load(Ordering::Acquire) != WAITING {
                        continue;
                    }
                    let n = self.refused.fetch_add(1, Ordering::Relaxed);
                    if n % 1000 == 0 {
                        tracing::warn!(
                            "{}: allocation of {} refused: not joined to the GPU's ledger ({} refused so far)",
                            self.gpu,
                            human_bytes(bytes),
                            n + 1
                        );
                    }
                    return false;
                }
                #[cfg(any(test, feature = "test-local"))]
                LOCAL => {
                    let ok = self.reserve_local(bytes, self.local_limit);
                    if ok {
                        self.mine.fetch_add(bytes, Ordering::AcqRel);
                    }
                    return ok;
                }
                // Left: the process is exiting; nothing may be charged.
                _ => return false,
            }
        }
    }

    #[cfg(any(test, feature = "test-local"))]
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
                    if !self.healthy(j) {
                        self.lose(j, "was truncated, wiped, overwritten or damaged");
                        continue;
                    }
                    let Some(_in) = j.m.enter() else {
                        if self.state.load(Ordering::Acquire) == LEFT {
                            return;
                        }
                        std::thread::yield_now();
                        continue;
                    };
                    j.ledger.release(&j.m, bytes);
                    sat_sub(&self.mine, bytes);
                    return;
                }
                WAITING => {
                    // Nothing is charged anywhere while waiting; what this
                    // process holds is re-registered at the next join, under
                    // the same lock.
                    let _g = self.joining.lock();
                    if self.state.load(Ordering::Acquire) != WAITING {
                        continue;
                    }
                    sat_sub(&self.mine, bytes);
                    return;
                }
                #[cfg(any(test, feature = "test-local"))]
                LOCAL => {
                    sat_sub(&self.used, bytes);
                    sat_sub(&self.mine, bytes);
                    return;
                }
                _ => {
                    sat_sub(&self.mine, bytes);
                    return;
                }
            }
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

    /// Not joined, allocations refused until it is.
    pub fn is_waiting(&self) -> bool {
        self.state.load(Ordering::Acquire) == WAITING
    }

    /// Bytes held by the whole container (as far as this process knows when
    /// not joined: what it holds itself).
    pub fn container_used(&self) -> u64 {
        #[cfg(any(test, feature = "test-local"))]
        if self.state.load(Ordering::Acquire) == LOCAL {
            return self.used.load(Ordering::Acquire);
        }
        match self.ledger() {
            Some((l, m)) => l.container_of(m).used.load(Ordering::Acquire),
            None => self.mine.load(Ordering::Acquire),
        }
    }

    /// Bytes held by this process.
    pub fn process_used(&self) -> u64 {
        self.mine.load(Ordering::Acquire)
    }

    /// Highest use of a local (unit-test) account.
    #[cfg(any(test, feature = "test-local"))]
    pub fn local_peak(&self) -> u64 {
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
    /// move on; when waiting, try again to join.
    pub fn check(&self) {
        match self.state.load(Ordering::Acquire) {
            JOINED => {
                let Some(j) = self.joined() else { return };
                if j.ledger.is_stale() {
                    return; // a forked child's copy
                }
                if !self.healthy(j) {
                    self.lose(j, "was truncated, wiped, overwritten or damaged");
                } else if j.ledger.is_replaced() {
                    self.lose(j, REPLACED);
                } else {
                    j.ledger.repair_counts(&j.m, &self.mine);
                }
            }
            WAITING => {
                self.try_join(Duration::ZERO);
            }
            _ => {}
        }
    }

    /// Check this account every [`WATCH_INTERVAL`] from a watcher thread
    /// (one per process, started on first use, again in a forked child),
    /// so that a process that does not allocate still notices a damaged or
    /// replaced ledger, re-registers what it holds, and joins once a
    /// ledger it could not use becomes usable.
    pub fn watch(&'static self) {
        watcher::add(self);
    }

    /// Leave the ledger (exit handler). Safe while other threads allocate:
    /// their later allocations are refused. The account is LEFT first, so
    /// that the watcher thread (and any call still made during a long
    /// teardown) does not take the slot we just gave up for a damaged
    /// ledger and register the process again.
    pub fn leave(&self) {
        // Waits at most LEAVE_WAIT for a join in progress: an exit never hangs.
        let _g = self.joining.try_lock_for(LEAVE_WAIT);
        let joined = self.ledger();
        self.state.store(LEFT, Ordering::Release);
        if let Some((l, m)) = joined {
            l.leave(m);
        }
        self.drop_opened();
    }

    /// `pthread_atfork` child handler: async-signal-safe.
    pub fn after_fork_child(&self) {
        let p = self.opened.load(Ordering::Acquire);
        if !p.is_null() {
            // SAFETY: a box owned by the account; the child is single
            // threaded here, nobody replaces it meanwhile.
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
