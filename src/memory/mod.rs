//! The memory quota: per-GPU accounting against the ledger and the quota
//! view of memory info. Which object owns each charge (so that every free
//! path gives back exactly what was taken, once) is [`charges`]; which tracked
//! GPU a CUDA device or an NVML handle is (joining on first use) is
//! `lookup`.
//!
//! - A GPU is joined lazily, at the first call that needs it: its UUID and
//!   physical total come from the real driver (CUDA or NVML, whichever the
//!   process uses first), its quota from the config, its ledger from
//!   [`Ledger::open_or_create`]. While the ledger cannot be used, new
//!   allocations are refused with one clear error naming the cause and the
//!   fix, and the process joins by itself once it can (never granted on
//!   this process's word alone).
//! - Reserve before the real allocator; give back on its failure; over quota
//!   → `CUDA_ERROR_OUT_OF_MEMORY` without calling the driver.
//! - Stream-ordered pools: an allocation is charged when `cuMemAllocAsync` /
//!   `cuMemAllocFromPoolAsync` returns it and released when it is freed
//!   (`cuMemFreeAsync` or `cuMemFree`). Memory a pool keeps cached after a
//!   free is not charged (the driver may hold it until `cuMemPoolTrimTo`).
//! - `fork`: the child handler only resets atomics (and lets the ledger
//!   forget the parent's slot); the child re-joins lazily.
//! - Secure mode (the host's node agent serves `agent.sock` in a ledger
//!   directory only root writes): the ledger is only read, and every charge
//!   goes through the agent ([`secure`]).

use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicUsize, Ordering};
use std::sync::Once;

use parking_lot::Mutex;

use crate::config::{self, Mode};
use crate::ledger::{Account, JoinSpec, Ledger, Membership, ShareLink, QUOTA_UNLIMITED};
pub mod charges;
mod lookup;
pub mod secure;

pub use crate::process::gpus::{format_uuid, GpuInfo};
pub use charges::{Charges, Entry, Kind, Owner, PoolPlace};
pub(crate) use lookup::nvml_peek;
pub use lookup::{cuda_gpu, cuda_view_quota, current_gpu};

/// Most GPUs per host we track (CUDA ordinals above are passed through).
pub const MAX_GPUS: usize = 64;

/// One GPU this process uses.
pub struct Gpu {
    pub uuid: String,
    /// Index as the host driver numbers it.
    pub host_index: u32,
    /// Index as the container sees it (`ALIYUN_COM_GPU_VISIBLE_DEVICES`).
    pub visible_index: usize,
    pub physical_total: u64,
    /// Bytes visible to the container; `None` = not limited (physical view).
    pub quota: Option<u64>,
    /// Refuse allocations past the quota (false with `CGPU_DISABLE`).
    pub enforce: bool,
    /// How this process's allocations are charged.
    books: Books,
    left: AtomicBool,
    /// Primary-context retains by this process (what the primary context
    /// reserved is charged to it in [`charges`]).
    pub primary_refs: AtomicU32,
    /// The primary context's handle (0 = none yet).
    pub primary_ctx: AtomicUsize,
}

/// Where a GPU's charges go.
enum Books {
    /// Cooperative: this process's account on the GPU's ledger (joined, or
    /// waiting to join: allocations refused; see `ledger::Account`).
    Shared(Account),
    /// Secure: through the node agent; the ledger is only read.
    Secure(secure::SecureAccount),
}

impl Gpu {
    /// The cooperative account (`None` in secure mode: nothing here may
    /// write the books).
    fn acct(&self) -> Option<&Account> {
        match &self.books {
            Books::Shared(a) => Some(a),
            Books::Secure(_) => None,
        }
    }

    /// Before a view: dead processes' bytes reaped (cooperative), or this
    /// process's releases applied by the agent (secure).
    fn maybe_reap(&self) {
        match &self.books {
            Books::Shared(a) => a.maybe_reap(),
            Books::Secure(s) => s.settle(),
        }
    }

    /// Before a view in secure mode: placed by the agent if it answers in
    /// time (see `secure::SecureAccount::glance`).
    fn glance(&self) {
        if let Books::Secure(s) = &self.books {
            s.glance();
        }
    }

    /// Reserve `bytes`; false = over quota, or not joined to the ledger
    /// yet (nothing taken).
    pub fn reserve(&self, bytes: u64) -> bool {
        if bytes == 0 {
            return true;
        }
        if self.left.load(Ordering::Relaxed) {
            // The exit handler ran: nothing can be charged any more.
            return false;
        }
        match &self.books {
            Books::Shared(a) => a.reserve(bytes),
            Books::Secure(s) => s.reserve(bytes),
        }
    }

    /// Give back `bytes` reserved earlier.
    pub fn release(&self, bytes: u64) {
        if bytes == 0 || self.left.load(Ordering::Relaxed) {
            return;
        }
        match &self.books {
            Books::Shared(a) => a.release(bytes),
            Books::Secure(s) => s.release(bytes),
        }
    }

    /// Bytes held by the whole container on this GPU.
    pub fn container_used(&self) -> u64 {
        match &self.books {
            Books::Shared(a) => a.container_used(),
            // Not placed by the agent yet: nothing is free (never the whole GPU).
            Books::Secure(s) if !s.known() => self.physical_total,
            Books::Secure(s) => s.container_used(),
        }
    }

    /// Bytes held by this process on this GPU.
    pub fn process_used(&self) -> u64 {
        match &self.books {
            Books::Shared(a) => a.process_used(),
            Books::Secure(s) => s.process_used(),
        }
    }

    /// Is this process joined to the GPU's ledger (allocations are charged
    /// to the container)?
    pub fn shared(&self) -> bool {
        self.acct().is_some_and(|a| a.is_shared())
    }

    /// The ledger and membership, when joined in cooperative mode (the
    /// scheduler writes its words there). `None` in secure mode: the
    /// ledger is mapped read-only and nothing of this process may write it.
    pub fn ledger(&self) -> Option<(&Ledger, &Membership)> {
        self.acct()?.ledger()
    }

    /// Secure mode, once the agent placed this process on the GPU: the
    /// agent's socket, the GPU's UUID and its ledger, read-only (what the
    /// compute scheduler's secure gate needs). `None` in cooperative mode
    /// or before the agent answered.
    pub fn secure_sched(&self) -> Option<(std::path::PathBuf, &str, &Ledger)> {
        match &self.books {
            Books::Secure(s) => {
                // Placed on a connection that still lives (the agent may
                // have restarted since the last allocation).
                s.rejoin();
                s.known().then_some(())?;
                Some((s.socket(), &self.uuid, s.ledger_view()?))
            }
            _ => None,
        }
    }

    /// The quota view: `Some(total)` when the container sees its slice (its
    /// quota, never more than the GPU: [`shown_total`]),
    /// `None` for the physical view (not limited, or `CGPU_DISABLE`). Read
    /// live from the ledger, so `cgpuctl` changing `memsize` shows at once.
    pub fn view_quota(&self) -> Option<u64> {
        self.ledger_quota()
            .map(|q| shown_total(q, self.physical_total))
    }

    /// The quota the container's row holds now (or the configured one
    /// before joining); `None` for the physical view.
    fn ledger_quota(&self) -> Option<u64> {
        if !self.enforce {
            return None;
        }
        if let Books::Secure(s) = &self.books {
            // Not placed yet: the GPU's size, all of it used (see `container_used`).
            return if s.known() { s.quota() } else { Some(u64::MAX) };
        }
        match self.ledger() {
            Some((ledger, m)) => {
                let c = ledger.container_of(m);
                let q = c.quota.load(Ordering::Acquire);
                (q != 0 && c.enforce_off.load(Ordering::Relaxed) == 0).then_some(q)
            }
            None => self.quota,
        }
    }

    /// `(free, total)` the container sees, given the physical numbers.
    pub fn view(&self, phys_free: u64, phys_total: u64) -> (u64, u64) {
        self.glance();
        match self.view_quota() {
            Some(q) => {
                self.maybe_reap();
                (quota_free(q, self.container_used(), phys_free), q)
            }
            None => (phys_free, phys_total),
        }
    }

    /// The container's view of this GPU as a [`Peek`] (dead processes'
    /// bytes reaped first, at most every 200 ms).
    pub fn peek(&self) -> Peek {
        self.glance();
        self.maybe_reap();
        Peek {
            quota: self.view_quota(),
            used: self.container_used(),
            pids: self.container_pids(),
        }
    }

    /// Record an import of memory exported by `pid` (as this process's PID
    /// namespace numbers it) in the ledger's table of shared allocations,
    /// if `pid` is a live process of this container on this GPU: its
    /// exporter then pays for it while it lives, this process after (see
    /// `ledger::Account::share_register`). `None`: charge it here.
    pub fn share_register(&'static self, pid: u32) -> Option<ShareLink> {
        let pid = i32::try_from(pid).ok()?;
        // Secure mode: the table of shared allocations is the agent's to
        // write; the importer is charged.
        let acct: &'static Account = match &self.books {
            Books::Shared(a) => a,
            Books::Secure(_) => return None,
        };
        match acct.share_register(pid) {
            Ok(link) => link,
            Err(e) => {
                tracing::warn!(
                    "cgpu: GPU {}: {e}; memory imported from pid {pid} of this container is charged to the importer too",
                    self.visible_index
                );
                None
            }
        }
    }

    /// See `ledger::Account::share_current`.
    pub fn share_current(&self, link: &ShareLink) -> bool {
        self.acct().is_some_and(|a| a.share_current(link))
    }

    /// See `ledger::Account::share_adopt`.
    pub fn share_adopt(&self, link: &ShareLink, bytes: u64) -> u64 {
        self.acct().map_or(0, |a| a.share_adopt(link, bytes))
    }

    /// Pids of the container's live processes on this GPU as NVML lists
    /// them (host pids): a process in a PID namespace whose host pid is
    /// not known yet is left out, never listed by a pid of its namespace
    /// (which may be another container's host pid).
    pub fn container_pids(&self) -> Vec<u32> {
        let mut pids: Vec<u32> = crate::ledger::host_pid().into_iter().collect();
        if let Books::Secure(s) = &self.books {
            s.container_pids(&mut pids);
        }
        if let Some((ledger, m)) = self.ledger() {
            let f = ledger.file();
            for p in f.processes.iter() {
                if p.state.load(Ordering::Acquire) == crate::ledger::SLOT_LIVE
                    && p.container.load(Ordering::Acquire) as usize == m.container
                {
                    if let Some(pid) = p.host_pid() {
                        if !pids.contains(&pid) {
                            pids.push(pid);
                        }
                    }
                }
            }
        }
        pids
    }

    /// This process found its host pid (inside a PID namespace): written
    /// into its slot, so that its container's NVML lists show it.
    pub fn publish_host_pid(&self, pid: u32) {
        if let Some((ledger, m)) = self.ledger() {
            ledger.process_of(m).set_host_pid(pid);
        }
    }
}

/// The total a container is shown for a quota of `quota` bytes on a GPU of
/// `physical` bytes: the quota, but never more than the GPU has (a quota
/// larger than the GPU, or one not limited, shows the GPU's own size).
/// `physical` 0: not known, the quota as it is.
pub fn shown_total(quota: u64, physical: u64) -> u64 {
    if physical == 0 {
        quota
    } else {
        quota.min(physical)
    }
}

/// `min(quota − used, physical free)`, saturating (usage above the quota
/// never wraps into a huge free).
pub fn quota_free(quota: u64, used: u64, phys_free: u64) -> u64 {
    quota.saturating_sub(used).min(phys_free)
}

/// This process's state. Replaced (the old one leaked, never touched: its
/// locks may be held by threads that do not exist in the child) after `fork`.
pub struct Proc {
    /// The fork generation it was made in (`process::fork`).
    generation: u64,
    /// GPU ledgers opened read-only to answer views ([`peek`]).
    peeked: Mutex<Vec<(String, &'static Ledger)>>,
    pid: u32,
    gpus: Mutex<Vec<&'static Gpu>>,
    by_cuda: [AtomicPtr<Gpu>; MAX_GPUS],
    /// Which object owns each of this process's charges.
    pub charges: Charges,
    /// The connection to the node agent (secure mode; made on first need).
    client: secure::Client,
}

static PROC: AtomicPtr<Proc> = AtomicPtr::new(std::ptr::null_mut());
/// Every GPU joined, for the fork and exit handlers (lock-free).
static JOINED: [AtomicPtr<Gpu>; MAX_GPUS] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; MAX_GPUS];
static HANDLERS: Once = Once::new();

extern "C" fn atfork_child() {
    // Only atomics: the parent's state (and its locks) is abandoned.
    PROC.store(std::ptr::null_mut(), Ordering::Release);
    for g in JOINED.iter() {
        let p = g.swap(std::ptr::null_mut(), Ordering::AcqRel);
        if !p.is_null() {
            // SAFETY: joined GPUs are leaked ('static) and never freed.
            let gpu = unsafe { &*p };
            if let Some(a) = gpu.acct() {
                a.after_fork_child();
            }
        }
    }
    secure::after_fork_child();
    crate::scheduler::secure_after_fork_child();
}

extern "C" fn at_exit() {
    for g in JOINED.iter() {
        let p = g.swap(std::ptr::null_mut(), Ordering::AcqRel);
        if p.is_null() {
            continue;
        }
        // SAFETY: joined GPUs are leaked ('static) and never freed.
        let gpu = unsafe { &*p };
        if gpu.left.swap(true, Ordering::AcqRel) {
            continue;
        }
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match &gpu.books {
            Books::Shared(a) => a.leave(),
            Books::Secure(s) => s.leave(),
        }));
    }
}

/// The process state, created on first use (and again in a forked child).
pub fn proc_state() -> &'static Proc {
    let generation = crate::process::fork::generation();
    let mut p = PROC.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: PROC only ever holds leaked Box<Proc>s.
        let cur = unsafe { &*p };
        if cur.generation == generation {
            return cur;
        }
        // Made before a fork (its locks may be held by threads this child
        // does not have): abandoned, never touched again.
    } else {
        p = std::ptr::null_mut();
    }
    HANDLERS.call_once(|| {
        // SAFETY: registering plain extern "C" handlers that touch only atomics
        // (child) or leave the ledgers (exit).
        unsafe {
            libc::pthread_atfork(None, None, Some(atfork_child));
            libc::atexit(at_exit);
        }
    });
    let fresh = Box::into_raw(Box::new(Proc {
        generation,
        peeked: Mutex::new(Vec::new()),
        pid: std::process::id(),
        gpus: Mutex::new(Vec::new()),
        by_cuda: [const { AtomicPtr::new(std::ptr::null_mut()) }; MAX_GPUS],
        charges: Charges::default(),
        client: secure::Client::default(),
    }));
    match PROC.compare_exchange(p, fresh, Ordering::AcqRel, Ordering::Acquire) {
        // SAFETY: we just published our leaked box.
        Ok(_) => unsafe { &*fresh },
        Err(winner) => {
            // SAFETY: fresh was never published.
            drop(unsafe { Box::from_raw(fresh) });
            if winner.is_null() {
                return proc_state();
            }
            // SAFETY: winner is a leaked box; it is checked like any other.
            let w = unsafe { &*winner };
            if w.generation == generation {
                w
            } else {
                proc_state()
            }
        }
    }
}

/// Sentinel in `by_cuda`: this device is decided not to be tracked.
fn not_tracked() -> *mut Gpu {
    std::ptr::dangling_mut::<Gpu>()
}

impl Proc {
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The tracked GPU for CUDA device `dev` (fast, lock-free after the first
    /// decision, negative ones included).
    pub fn gpu_for_cuda(
        &'static self,
        dev: i32,
        info: impl FnOnce() -> Option<GpuInfo>,
    ) -> Option<&'static Gpu> {
        let slot = self.by_cuda.get(usize::try_from(dev).ok()?)?;
        let p = slot.load(Ordering::Acquire);
        if p == not_tracked() {
            return None;
        }
        if !p.is_null() {
            // SAFETY: slots hold leaked, never-freed Gpus (or the sentinel, checked above).
            return Some(unsafe { &*p });
        }
        match self.gpu_by_info(info()?) {
            Some(g) => {
                slot.store(g as *const Gpu as *mut Gpu, Ordering::Release);
                Some(g)
            }
            None => {
                slot.store(not_tracked(), Ordering::Release);
                None
            }
        }
    }

    /// The tracked GPU with this identity, joining its ledger if new.
    pub fn gpu_by_info(&'static self, info: GpuInfo) -> Option<&'static Gpu> {
        let mut gpus = self.gpus.lock();
        if let Some(g) = gpus
            .iter()
            .find(|g| g.uuid.eq_ignore_ascii_case(&info.uuid))
        {
            return Some(g);
        }
        let g: &'static Gpu = Box::leak(Box::new(if secure::on() {
            join_secure(info, &self.client)
        } else {
            join(info)?
        }));
        if let Some(a) = g.acct() {
            a.watch();
        }
        gpus.push(g);
        if let Some(s) = JOINED.iter().find(|s| s.load(Ordering::Acquire).is_null()) {
            s.store(g as *const Gpu as *mut Gpu, Ordering::Release);
        }
        Some(g)
    }

    /// The GPU of CUDA device `dev` if this process joined it (never joins).
    pub fn joined_cuda(&self, dev: i32) -> Option<&'static Gpu> {
        let slot = self.by_cuda.get(usize::try_from(dev).ok()?)?;
        let p = slot.load(Ordering::Acquire);
        if p.is_null() || p == not_tracked() {
            return None;
        }
        // SAFETY: slots hold leaked, never-freed Gpus (or the sentinel, checked above).
        Some(unsafe { &*p })
    }

    /// The tracked GPU by UUID, if this process joined it.
    pub fn gpu_by_uuid(&self, uuid: &str) -> Option<&'static Gpu> {
        self.gpus
            .lock()
            .iter()
            .find(|g| g.uuid.eq_ignore_ascii_case(uuid))
            .copied()
    }

    /// All GPUs joined so far.
    pub fn gpus(&self) -> Vec<&'static Gpu> {
        self.gpus.lock().clone()
    }
}

/// What a process that has not joined a GPU sees of it: answered from the
/// configuration and the GPU's ledger, read only (asking never joins: a
/// process joins a GPU when it allocates, creates a context or launches
/// there; in secure mode the first view of a GPU says `Hello` to the node
/// agent, which places the process in its container's row).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Peek {
    /// The quota view (`None`: the physical view).
    pub quota: Option<u64>,
    /// Bytes the container holds on the GPU (its live processes).
    pub used: u64,
    /// Pids of the container's processes on the GPU.
    pub pids: Vec<u32>,
}

impl Peek {
    /// `(free, total)` the container sees, given the physical numbers.
    pub fn view(&self, phys_free: u64, phys_total: u64) -> (u64, u64) {
        match self.quota {
            Some(q) => (quota_free(q, self.used, phys_free), q),
            None => (phys_free, phys_total),
        }
    }
}

/// The GPU's ledger, opened once per process for reading (never created).
fn peek_ledger(uuid: &str) -> Option<&'static Ledger> {
    let mut opened = proc_state().peeked.lock();
    if let Some((_, l)) = opened.iter().find(|(u, _)| u.eq_ignore_ascii_case(uuid)) {
        return Some(l);
    }
    let path = Ledger::live_path(&Ledger::default_dir(), uuid);
    if !path.exists() {
        return None;
    }
    let l: &'static Ledger = Box::leak(Box::new(Ledger::open(&path).ok()?));
    opened.push((uuid.to_string(), l));
    Some(l)
}

/// What this process sees of a GPU it has not joined (`None`: not tracked,
/// the physical view).
pub fn peek(info: &GpuInfo) -> Option<Peek> {
    if secure::on() {
        // The container's row is known from the agent's answer to Hello:
        // the GPU is joined through the agent (once), then read locally.
        let g = proc_state().gpu_by_info(GpuInfo {
            uuid: info.uuid.clone(),
            host_index: info.host_index,
            visible_index: info.visible_index,
            physical_total: info.physical_total,
        })?;
        return Some(g.peek());
    }
    let cfg = config::get();
    let me = container();
    let ledger = peek_ledger(&info.uuid);
    let row = ledger.and_then(|l| l.find_container_keyed(me.key, &me.name).map(|c| (l, c)));
    // A process with no settings of its own sees its container's, if it is
    // in one (a host's own processes adopt nothing).
    let adopt = row.filter(|_| me.source.is_container());
    let (mut quota, enforce) = if cfg.isolating() {
        (
            cfg.quota_bytes(info.visible_index, info.physical_total),
            cfg.mode == Mode::Enforce,
        )
    } else if cfg.unset() {
        match adopt {
            // No settings of its own: its container's (read below).
            Some((l, c)) => (
                None,
                l.file().containers[c].enforce_off.load(Ordering::Relaxed) == 0,
            ),
            None => {
                let d = ledger?
                    .file()
                    .header
                    .default_memsize
                    .load(Ordering::Acquire);
                if d == 0 {
                    return None;
                }
                (Some(d), true)
            }
        }
    } else {
        return None;
    };
    let mut p = Peek {
        pids: crate::ledger::host_pid().into_iter().collect(),
        ..Peek::default()
    };
    if let Some((l, c)) = if cfg.isolating() { row } else { adopt } {
        // The container is there: its live quota (cgpuctl may have changed it).
        let slot = &l.file().containers[c];
        let q = slot.quota.load(Ordering::Acquire);
        quota = (q != 0 && slot.enforce_off.load(Ordering::Relaxed) == 0).then_some(q);
        p.used = slot.used.load(Ordering::Acquire);
        for (_, ps) in l.processes_of(c) {
            if let Some(pid) = ps.host_pid() {
                if !p.pids.contains(&pid) {
                    p.pids.push(pid);
                }
            }
        }
    }
    p.quota = if enforce {
        quota.map(|q| shown_total(q, info.physical_total))
    } else {
        None
    };
    Some(p)
}

/// This process's container (`crate::identity`): worked out at its first
/// use of a GPU, never on a launch or an allocation.
pub fn container() -> &'static crate::identity::Identity {
    static ME: std::sync::OnceLock<crate::identity::Identity> = std::sync::OnceLock::new();
    ME.get_or_init(|| crate::identity::current(config::get().container_name.as_deref()))
}

/// Is there any GPU ledger on this host (a container with settings, or an
/// operator's `default_memsize`, may then apply to a process that has no
/// settings of its own)? Checked once, by listing the ledger directory:
/// a host where cgpu keeps no books pays nothing more.
fn ledgers_exist() -> bool {
    static P: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *P.get_or_init(|| !Ledger::list(&Ledger::default_dir()).is_empty())
}

/// Does this process track memory at all? (Isolation configured, or no
/// settings of its own while the host keeps ledgers: its container's
/// settings or an operator's `default_memsize` may apply.)
#[inline]
pub fn tracking() -> bool {
    let cfg = config::get();
    cfg.isolating() || (cfg.unset() && ledgers_exist()) || secure::on()
}

/// The `default_memsize` of this GPU's existing ledger, if set.
fn default_memsize(l: &Ledger) -> Option<u64> {
    let d = l.file().header.default_memsize.load(Ordering::Acquire);
    (d > 0).then_some(d)
}

/// The settings of this process's container on a GPU, from its row in the
/// GPU's ledger: for a process that has none of its own (`ssh`, `su -`,
/// `env -i`, cron). `None`: the container has no row there.
fn container_settings(l: &Ledger) -> Option<JoinSpec> {
    let me = container();
    if !me.source.is_container() {
        // Not in a container (a host's own processes): no container's
        // settings to adopt; only the operator's default applies.
        return None;
    }
    let c = l.find_container_keyed(me.key, &me.name)?;
    let slot = &l.file().containers[c];
    let spec = JoinSpec {
        container_id: slot.id_str(),
        key: me.key,
        quota: match slot.quota.load(Ordering::Acquire) {
            0 => QUOTA_UNLIMITED,
            q => q,
        },
        weight: slot.weight.load(Ordering::Relaxed).max(1),
        highprio: slot.highprio.load(Ordering::Relaxed) != 0,
        enforce_off: slot.enforce_off.load(Ordering::Relaxed) != 0,
    };
    // Live still? (The id was copied while the slot may have been freed.)
    slot.is_container(me.key, &me.name).then_some(spec)
}

/// The settings of this process's container from its slot on another GPU,
/// for a GPU where the container has none yet (a process without settings
/// that is the first of its container there): the same quota, never the
/// whole GPU.
fn container_settings_elsewhere(dir: &std::path::Path, uuid: &str) -> Option<JoinSpec> {
    let here = Ledger::live_path(dir, uuid);
    Ledger::list(dir)
        .into_iter()
        .filter(|p| *p != here)
        .find_map(|p| container_settings(&Ledger::open(&p).ok()?))
}

/// Secure mode: the GPU's account through the node agent. Whatever this
/// process's environment says, the quota is the one the host set for its
/// container, enforced.
fn join_secure(info: GpuInfo, client: &'static secure::Client) -> Gpu {
    let name = format!("GPU {} ({})", info.visible_index, info.uuid);
    let s = secure::SecureAccount::open(client, &Ledger::default_dir(), &info.uuid, name);
    tracing::info!(
        "GPU {} ({}): secure mode, the quota kept by the node agent",
        info.visible_index,
        info.uuid,
    );
    Gpu {
        uuid: info.uuid,
        host_index: info.host_index,
        visible_index: info.visible_index,
        physical_total: info.physical_total,
        quota: None,
        enforce: true,
        books: Books::Secure(s),
        left: AtomicBool::new(false),
        primary_refs: AtomicU32::new(0),
        primary_ctx: AtomicUsize::new(0),
    }
}

/// Join the ledger for one GPU (or wait to join, refusing allocations).
fn join(info: GpuInfo) -> Option<Gpu> {
    let cfg = config::get();
    let me = container();
    let mut spec = JoinSpec {
        container_id: me.name.clone(),
        key: me.key,
        quota: 0,
        weight: cfg.weight.unwrap_or(1),
        highprio: cfg.high_prio,
        enforce_off: false,
    };
    let (quota, enforce) = if cfg.isolating() {
        let q = cfg.quota_bytes(info.visible_index, info.physical_total);
        // A 0 in the list: explicitly not limited (not the GPU's default).
        spec.quota = q.unwrap_or(QUOTA_UNLIMITED);
        spec.enforce_off = cfg.mode == Mode::Record;
        (q, cfg.mode == Mode::Enforce)
    } else if cfg.unset() {
        let dir = Ledger::default_dir();
        let l = Ledger::open(&Ledger::live_path(&dir, &info.uuid)).ok();
        let here = l.as_ref().and_then(container_settings);
        if let Some(theirs) = here.or_else(|| container_settings_elsewhere(&dir, &info.uuid)) {
            // No settings of its own: the container's, whatever this
            // process's environment lost.
            tracing::info!(
                "cgpu: GPU {} ({}): no settings in this process's environment; it runs under its container {}'s",
                info.visible_index,
                info.uuid,
                theirs.container_id
            );
            spec = theirs;
            let q = (spec.quota != QUOTA_UNLIMITED).then_some(spec.quota);
            (q, !spec.enforce_off)
        } else {
            // No ALIYUN_COM_GPU_MEM_CONTAINER: the operator's default_memsize, if any.
            let d = default_memsize(l.as_ref()?)?;
            tracing::warn!(
                "cgpu: GPU {} ({}): no ALIYUN_COM_GPU_MEM_CONTAINER; the ledger's default_memsize {d} bytes applies",
                info.visible_index,
                info.uuid
            );
            (Some(d), true)
        }
    } else {
        return None;
    };
    for w in cfg.implausible(info.visible_index, info.physical_total) {
        tracing::warn!("{w}");
    }
    let name = format!("GPU {} ({})", info.visible_index, info.uuid);
    let acct = Account::open(
        &Ledger::default_dir(),
        &info.uuid,
        info.host_index,
        info.physical_total,
        name,
        spec,
    );
    if let Some((ledger, m)) = acct.ledger() {
        // Right after the join: whether the container arrived with no
        // weight free (then any of its processes may later take one).
        crate::ledger::words::note_arrival(ledger.file(), m.container);
        tracing::info!(
            "GPU {} ({}): container {}, quota {}, ledger {}",
            info.visible_index,
            info.uuid,
            me.name,
            quota.map_or("none".into(), crate::ledger::human_bytes),
            ledger.path().display()
        );
    }
    Some(Gpu {
        uuid: info.uuid,
        host_index: info.host_index,
        visible_index: info.visible_index,
        physical_total: info.physical_total,
        quota,
        enforce,
        books: Books::Shared(acct),
        left: AtomicBool::new(false),
        primary_refs: AtomicU32::new(0),
        primary_ctx: AtomicUsize::new(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_saturates() {
        assert_eq!(quota_free(10, 3, 100), 7);
        assert_eq!(quota_free(10, 3, 5), 5);
        assert_eq!(quota_free(10, 13, 100), 0);
        assert_eq!(quota_free(0, 0, 100), 0);
    }

    #[test]
    fn uuid_format() {
        let b = [
            0xb0, 0x84, 0xae, 0x33, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,
        ];
        assert_eq!(format_uuid(&b), "GPU-b084ae33-0102-0304-0506-0708090a0b0c");
    }

    fn local_gpu(quota: Option<u64>, enforce: bool) -> Gpu {
        Gpu {
            uuid: "GPU-test".into(),
            host_index: 0,
            visible_index: 0,
            physical_total: 100,
            quota,
            enforce,
            books: Books::Shared(Account::local(
                "GPU test".into(),
                if enforce { quota } else { None },
            )),
            left: AtomicBool::new(false),
            primary_refs: AtomicU32::new(0),
            primary_ctx: AtomicUsize::new(0),
        }
    }

    fn test_proc() -> Proc {
        Proc {
            generation: 0,
            peeked: Mutex::new(Vec::new()),
            pid: 1,
            gpus: Mutex::new(Vec::new()),
            by_cuda: [const { AtomicPtr::new(std::ptr::null_mut()) }; MAX_GPUS],
            charges: Charges::default(),
            client: secure::Client::default(),
        }
    }

    /// A `cuMemCreate` charge lasts until every handle reference is released
    /// and the last mapping is gone, in any order; unknown handles and
    /// ranges change nothing.
    #[test]
    fn vmm_charge_follows_references_and_mappings() {
        let g: &'static Gpu = Box::leak(Box::new(local_gpu(Some(1000), true)));
        let p = test_proc();
        assert!(g.reserve(100));
        p.charges.vmm_created(7, g, 100);
        p.charges.vmm_mapped(0x1000, 0x200, 7);
        p.charges.vmm_mapped(0x2000, 0x200, 7);
        p.charges.vmm_retained(7);
        p.charges.vmm_released(7);
        p.charges.vmm_released(7);
        assert_eq!(g.container_used(), 100, "still mapped twice");
        p.charges.vmm_unmapped(0x1000, 0x100);
        assert_eq!(g.container_used(), 100, "a partial range unmaps nothing");
        p.charges.vmm_unmapped(0x1000, 0x200);
        assert_eq!(g.container_used(), 100, "one mapping left");
        p.charges.vmm_unmapped(0x2000, 0x200);
        assert_eq!(g.container_used(), 0, "given back with the last mapping");
        p.charges.vmm_released(7);
        p.charges.vmm_unmapped(0x0, u64::MAX);
        assert_eq!(g.container_used(), 0, "once");
        // Released first, mappings gone in one wide unmap.
        assert!(g.reserve(50));
        p.charges.vmm_created(8, g, 50);
        p.charges.vmm_mapped(0x4000, 0x100, 8);
        p.charges.vmm_mapped(0x5000, 0x100, 8);
        p.charges.vmm_released(8);
        p.charges.vmm_unmapped(0x4000, 0x2000);
        assert_eq!(g.container_used(), 0);
        assert_eq!(p.charges.vmm_charged(), 0);
    }

    /// An imported allocation is charged for the largest extent mapped, once
    /// however many mappings or racing growths, and given back when its
    /// last reference and mapping are gone.
    #[test]
    fn imported_charge_follows_the_extent_mapped() {
        let g: &'static Gpu = Box::leak(Box::new(local_gpu(Some(1000), true)));
        let p = test_proc();
        let growth = |h, off, len| {
            p.charges
                .vmm_import_growth(h, off, len)
                .map(|(g, b)| (g as *const Gpu, b))
        };
        let gp = g as *const Gpu;
        p.charges.vmm_imported(9, g, None);
        assert_eq!(growth(9, 0, 100), Some((gp, 100)));
        // Two threads both saw the 100 missing and reserved it.
        assert!(g.reserve(100) && g.reserve(100));
        assert_eq!(p.charges.vmm_import_grown(9, 100, 100), 0);
        assert_eq!(p.charges.vmm_import_grown(9, 100, 100), 100, "the surplus");
        g.release(100);
        p.charges.vmm_mapped(0x1000, 100, 9);
        assert_eq!(growth(9, 0, 100), None, "covered");
        assert_eq!(growth(9, 50, 100), Some((gp, 50)));
        // A handle this process created is no import: never grown.
        p.charges.vmm_created(10, g, 0);
        assert_eq!(growth(10, 0, 100), None);
        p.charges.vmm_released(9);
        assert_eq!(g.container_used(), 100, "still mapped");
        p.charges.vmm_unmapped(0x1000, 100);
        assert_eq!(g.container_used(), 0);
    }

    /// An exported allocation stays charged after its last reference and
    /// mapping here are gone (a descriptor may keep it), even when the
    /// driver hands its handle value out again.
    #[test]
    fn exported_charge_is_kept_until_exit() {
        let g: &'static Gpu = Box::leak(Box::new(local_gpu(Some(1000), true)));
        let p = test_proc();
        assert!(g.reserve(200));
        p.charges.vmm_created(11, g, 200);
        p.charges.vmm_mapped(0x1000, 200, 11);
        p.charges.vmm_exported(11);
        p.charges.vmm_released(11);
        p.charges.vmm_unmapped(0x1000, 200);
        assert_eq!(g.container_used(), 200);
        assert!(g.reserve(100));
        p.charges.vmm_created(11, g, 100);
        p.charges.vmm_released(11);
        assert_eq!(
            g.container_used(),
            200,
            "the reused handle's own charge only"
        );
        assert_eq!(p.charges.vmm_charged(), 200);
    }

    #[test]
    fn local_fallback_enforces() {
        let g = local_gpu(Some(10), true);
        assert!(g.reserve(6));
        assert!(!g.reserve(5));
        assert!(g.reserve(4));
        assert!(!g.reserve(1));
        assert_eq!(g.container_used(), 10);
        assert_eq!(g.view(100, 100), (0, 10));
        g.release(6);
        assert_eq!(g.view(100, 100), (6, 10));
        assert_eq!(g.view(2, 100), (2, 10));
        // CGPU_DISABLE: records, does not refuse, physical view.
        let g = local_gpu(Some(10), false);
        assert!(g.reserve(60));
        assert_eq!(g.container_used(), 60);
        assert_eq!(g.view(40, 100), (40, 100));
    }

    #[test]
    fn local_fallback_never_passes_quota_under_threads() {
        let g: &'static Gpu = Box::leak(Box::new(local_gpu(Some(1000), true)));
        let hs: Vec<_> = (0..8)
            .map(|t| {
                std::thread::spawn(move || {
                    let mut held = Vec::new();
                    for i in 0..2000u64 {
                        let b = 1 + (i * 7 + t) % 97;
                        if g.reserve(b) {
                            held.push(b);
                        }
                        assert!(g.container_used() <= 1000);
                        if i % 3 == 0 {
                            if let Some(b) = held.pop() {
                                g.release(b);
                            }
                        }
                    }
                    for b in held {
                        g.release(b);
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(g.container_used(), 0);
        assert!(g.acct().unwrap().local_peak() <= 1000);
    }
}
