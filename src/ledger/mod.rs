//! The per-GPU shared-memory ledger (docs/ledger.md).
//!
//! One file per physical GPU, named by UUID (`<dir>/<uuid>.ledger`), mapped
//! `MAP_SHARED` by every process of every container on the host. The layout
//! is `repr(C)`, versioned, and written down for C tools in `include/cgpu.h`
//! (a test checks the two agree).
//!
//! Concurrency model:
//! - hot path (reserve/release bytes, scheduler counters): atomics only;
//! - slot-table changes (join, leave, reap): an OFD record lock on the
//!   table-lock byte range, released by the kernel if the holder dies;
//! - liveness: each process holds an OFD write lock on its own process slot's
//!   byte range for its lifetime; a slot whose range is unlocked is dead,
//!   whatever its pid says (pids mean nothing across PID namespaces).
//!
//! Design, locking protocol and crash semantics: `docs/ledger.md`.

mod account;
mod file;
mod guard;
mod lock;
mod shared;
mod snapshot;

pub use account::{Account, JoinSpec, ShareLink, JOIN_WAIT, RETRY_INTERVAL, WATCH_INTERVAL};
pub use shared::{SharePayer, SharedSlot, MAX_SHARED, SHARED_BORNE, SHARED_BYTES, SHARED_RELEASED};
pub use snapshot::{ContainerSnapshot, ProcessSnapshot, Snapshot};

use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::time::Duration;

use crate::process::clock::realtime_ns;

/// `b"CGPULEDG"` read as a little-endian u64.
pub const LEDGER_MAGIC: u64 = u64::from_le_bytes(*b"CGPULEDG");
/// Bumped on any layout change (2: 128 container and 1024 process slots,
/// 48 scheduler words per container; 3: the table of shared allocations).
pub const FORMAT_VERSION: u32 = 3;
/// Container slots per GPU. cGPU's `max_inst` allows at most 25 containers
/// with compute weight; containers that arrive with weight 0, run with
/// `CGPU_DISABLE` or only hold memory need slots too: 128 is five times
/// that, for a few hundred bytes each.
pub const MAX_CONTAINERS: usize = 128;
/// Process slots per GPU: 1024 (40 per container at 25 containers, 8 at
/// 128). When a table is full, a newcomer is refused (out of memory, with a
/// message), never run unaccounted.
pub const MAX_PROCESSES: usize = 1024;
/// Bytes for a container id, NUL-padded.
pub const ID_LEN: usize = 64;
/// Bytes for a GPU UUID string (`GPU-…`), NUL-padded.
pub const UUID_LEN: usize = 96;
/// Words of per-GPU scheduler state (owned by `scheduler`).
pub const SCHED_GPU_WORDS: usize = 32;
/// Words of per-container scheduler state (owned by `scheduler`; two bit
/// sets of `MAX_PROCESSES` bits among them).
pub const SCHED_CONTAINER_WORDS: usize = 48;

/// Additions to format version 3 (bits of [`LedgerHeader::additions`]
/// and [`LedgerHeader::required`]), each a field in space older writers
/// leave zero.
pub const ADD_CONTAINER_KEY: u64 = 1 << 0;
/// [`ProcessSlot::host_pid`].
pub const ADD_HOST_PID: u64 = 1 << 1;
/// [`ContainerSlot::id_sum`].
pub const ADD_ID_SUM: u64 = 1 << 2;
/// Every addition this build understands.
pub const ADDITIONS: u64 = ADD_CONTAINER_KEY | ADD_HOST_PID | ADD_ID_SUM;

/// Slot states (containers and processes).
pub const SLOT_FREE: u32 = 0;
pub const SLOT_CLAIMING: u32 = 1;
pub const SLOT_LIVE: u32 = 2;

/// Knob defaults written when a ledger is created (see docs/ledger.md).
pub const DEFAULT_POLICY: u32 = 1;
pub const DEFAULT_MAX_INST: u32 = 16;
pub const DEFAULT_PRIO_RATIO: u32 = 80;
/// Knob ranges (cGPU's `/proc/cgpu_km` nodes; README, docs/tools.md).
pub const POLICY_MAX: u32 = 5;
pub const MAX_INST_RANGE: std::ops::RangeInclusive<u32> = 1..=25;
pub const PRIO_RATIO_RANGE: std::ops::RangeInclusive<u32> = 20..=99;

/// The directory used when `CGPU_LEDGER_DIR` is not set: one per node, the
/// same for every process of every uid.
pub const DEFAULT_DIR: &str = "/run/cgpu";
/// [`DEFAULT_DIR`], as a list.
pub const DEFAULT_DIRS: [&str; 1] = [DEFAULT_DIR];

/// `JoinRequest::quota` value meaning "explicitly not limited" (a `0` inside
/// `ALIYUN_COM_GPU_MEM_CONTAINER`'s list); a plain 0 means "no quota set",
/// which gets the GPU's `default_memsize`.
pub const QUOTA_UNLIMITED: u64 = u64::MAX;

/// Per-GPU header and knobs (cGPU's `/proc/cgpu_km/<gpu>/…`).
#[repr(C)]
pub struct LedgerHeader {
    pub magic: u64,
    pub version: u32,
    /// `size_of::<LedgerHeader>()`.
    pub header_size: u32,
    /// `size_of::<LedgerFile>()`; the file is exactly this long.
    pub file_size: u64,
    /// 0 while being created, 1 when ready.
    pub ready: AtomicU32,
    /// Index of the GPU as the host driver numbers it (informational).
    pub gpu_index: u32,
    /// GPU UUID, NUL-padded (bytes: read with [`LedgerHeader::uuid_str`]).
    pub uuid: [AtomicU8; UUID_LEN],
    /// Physical memory in bytes, as the driver reports it.
    pub physical_total: u64,
    /// CLOCK_REALTIME ns at creation.
    pub created_ns: u64,
    /// Compute policy 0..=5 (docs/scheduling.md).
    pub policy: AtomicU32,
    /// 1 once an operator set the policy explicitly (then a weight > 1 does not switch it to 2).
    pub policy_explicit: AtomicU32,
    /// 1..=25.
    pub max_inst: AtomicU32,
    /// 20..=99.
    pub prio_ratio: AtomicU32,
    /// Quota in bytes for containers that set none (0 = pass-through).
    pub default_memsize: AtomicU64,
    /// Bumped on every knob write, so running jobs notice changes cheaply.
    pub knob_generation: AtomicU64,
    /// Scheduler state (`scheduler` defines the words).
    pub sched: [AtomicU64; SCHED_GPU_WORDS],
    /// CLOCK_MONOTONIC ns of the last `maybe_reap` (rate limit shared by all processes).
    pub last_reap_ns: AtomicU64,
    /// Additions to this format version that the file's creator wrote
    /// ([`ADDITIONS`] bits; 0: a creator that knew none). Informational:
    /// every addition's zero value means "unknown" (docs/ledger.md).
    pub additions: AtomicU64,
    /// Additions every process must understand to use this file: a process
    /// that finds a bit here it does not know refuses to join (and so
    /// refuses allocations) rather than keep books it cannot keep right.
    pub required: AtomicU64,
    pub reserved: [u64; 13],
}

/// One container on this GPU.
#[repr(C)]
pub struct ContainerSlot {
    pub state: AtomicU32,
    pub highprio: AtomicU32,
    /// Container id, NUL-padded UTF-8 (bytes: other processes rewrite them
    /// when they claim the slot; read with [`ContainerSlot::id_str`]).
    pub id: [AtomicU8; ID_LEN],
    /// Bytes; 0 = not limited.
    pub quota: AtomicU64,
    /// Bytes held by all its processes (allocations + context reservations).
    pub used: AtomicU64,
    /// Highest `used` ever reached.
    pub peak: AtomicU64,
    /// Compute weight (0 = no compute: arrived when `free_weight` was 0).
    pub weight: AtomicU32,
    /// Live processes.
    pub nprocs: AtomicU32,
    /// Allocations refused for quota.
    pub oom_count: AtomicU64,
    /// CLOCK_REALTIME ns when the slot was claimed.
    pub created_ns: AtomicU64,
    /// 1 when memory enforcement is off (`CGPU_DISABLE`): usage recorded only.
    pub enforce_off: AtomicU32,
    /// Bumped (wrapping) by every reserve/release before it touches `used`:
    /// lets `reap` recognise an instant when no operation is in flight.
    pub ops: AtomicU32,
    /// Scheduler state (`scheduler` defines the words).
    pub sched: [AtomicU64; SCHED_CONTAINER_WORDS],
    /// Upper bound of bytes `used` may still count for processes that died
    /// mid-operation; cleared when `reap` recounts `used` exactly.
    pub suspect: AtomicU64,
    /// Times `reap` recounted `used` after such a death.
    pub recounts: AtomicU64,
    /// The container's identity key (`crate::identity`; written while the
    /// slot is claimed). 0: claimed by a process that did not know keys,
    /// which is then known by its id alone.
    pub key: AtomicU64,
    /// The `created_ns` written with `key`. A slot claimed since by a
    /// process that does not know keys (it rewrites `created_ns`, never
    /// `key`) has another `created_ns`: its `key` is stale, as if 0.
    pub key_created: AtomicU64,
    /// Check of the slot's identity ([`id_sum`] of `id`, `key` and
    /// `key_created`), written with them while the slot is claimed. 0, or
    /// `key_created` not this `created_ns` (claimed since by a process
    /// that does not know it): unknown. Any other mismatch is damage.
    pub id_sum: AtomicU64,
    pub reserved: [u64; 3],
}

/// One process using this GPU.
#[repr(C)]
pub struct ProcessSlot {
    pub state: AtomicU32,
    /// Index of its container slot.
    pub container: AtomicU32,
    /// Pid in the process's own PID namespace (informational).
    pub pid: AtomicI32,
    pub _pad: u32,
    /// Inode of its `/proc/self/ns/pid` (tells namespaces apart).
    pub pidns: AtomicU64,
    /// `starttime` field of `/proc/self/stat` (with pid and pidns: a unique key).
    pub start_time: AtomicU64,
    /// Bytes it holds now.
    pub used: AtomicU64,
    /// Bytes of a reservation in flight (crash-consistency, see `try_reserve`).
    pub pending: AtomicU64,
    /// GPU time charged to this process, ns (scheduler).
    pub gpu_time_ns: AtomicU64,
    /// Kernel launches admitted (scheduler).
    pub launches: AtomicU64,
    /// `CLOCK_MONOTONIC` ns of the scheduler's last sign of life from this
    /// process (0: none yet): a process that stops answering (SIGSTOP, a
    /// debugger) loses its turn (`src/scheduler/gate.rs`).
    pub sched_beat_ns: AtomicU64,
    /// Threads of this process inside a synchronise call (`cuCtxSynchronize`,
    /// `cuStreamSynchronize`, `cuEventSynchronize`): it waits for its GPU
    /// work, so the GPU is not idle for it (scheduler).
    pub sched_in_sync: AtomicU64,
    /// Its pid as the host (and NVML) numbers it; 0: not known (a process
    /// in a PID namespace before it found it, or one that does not write it).
    pub host_pid: AtomicU64,
    pub reserved: [u64; 1],
}

/// The whole file.
#[repr(C)]
pub struct LedgerFile {
    pub header: LedgerHeader,
    pub containers: [ContainerSlot; MAX_CONTAINERS],
    pub processes: [ProcessSlot; MAX_PROCESSES],
    /// Memory a process exported and another of its container imported
    /// (`shared.rs`).
    pub shared: [SharedSlot; MAX_SHARED],
}

/// Why a ledger could not be used.
#[derive(Debug)]
pub enum LedgerError {
    Io {
        path: PathBuf,
        err: std::io::Error,
    },
    Corrupt {
        path: PathBuf,
        why: String,
    },
    Version {
        path: PathBuf,
        found: u32,
    },
    /// No free container or process slot.
    Full {
        path: PathBuf,
        what: &'static str,
    },
}

/// An allocation refused because it would pass the quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaExceeded {
    pub quota: u64,
    pub used: u64,
    pub requested: u64,
}

/// What a process asks for when it joins a GPU's ledger.
#[derive(Debug, Clone)]
pub struct JoinRequest<'a> {
    /// The container's name (written when the process claims its slot).
    pub container_id: &'a str,
    /// The container's identity key (`crate::identity`); 0: known by its
    /// name alone ([`crate::identity::key_of_name`]).
    pub key: u64,
    /// Bytes. 0 = none set: the GPU's `default_memsize` applies (itself 0 =
    /// not limited); [`QUOTA_UNLIMITED`] = explicitly not limited. Only the
    /// container's first joiner sets it; later joiners' values are ignored
    /// (`cgpuctl set memsize` changes it).
    pub quota: u64,
    /// Requested compute weight (1..=max_inst).
    pub weight: u32,
    pub highprio: bool,
    /// `CGPU_DISABLE`: record usage without enforcing.
    pub enforce_off: bool,
}

/// This process's place in one ledger: its container and process slot. Holds
/// the liveness lock for as long as it lives.
///
/// It also counts the reservations of this process's threads that are in
/// flight, so that [`Ledger::leave`] (run by an exit handler while other
/// threads may still allocate) waits for them and no reservation writes
/// into a slot after it was freed (and perhaps claimed by someone else).
#[derive(Debug)]
pub struct Membership {
    pub container: usize,
    pub process: usize,
    /// Reserve/release calls in flight through this membership.
    inflight: AtomicU32,
    /// Set by `leave`: later reservations are refused, releases ignored.
    left: AtomicBool,
}

impl Membership {
    fn new(container: usize, process: usize) -> Self {
        Membership {
            container,
            process,
            inflight: AtomicU32::new(0),
            left: AtomicBool::new(false),
        }
    }
    /// True once `leave` ran: the slot is no longer this process's.
    pub fn has_left(&self) -> bool {
        self.left.load(Ordering::SeqCst)
    }
    /// Stop charging through this membership (its ledger is being given
    /// up): later reservations are refused, and the ones in flight finish
    /// before this returns (waiting at most [`LEAVE_WAIT`]).
    pub fn retire(&self) {
        self.left.store(true, Ordering::SeqCst);
        let t0 = std::time::Instant::now();
        while self.inflight.load(Ordering::SeqCst) != 0 && t0.elapsed() < LEAVE_WAIT {
            std::thread::yield_now();
        }
    }
    /// Enter a reserve/release; `None` once left. The `SeqCst` pair
    /// (increment, then read `left`) against `leave`'s (set `left`, then read
    /// the count) makes sure one of the two sees the other.
    #[inline]
    fn enter(&self) -> Option<InFlight<'_>> {
        if self.left.load(Ordering::Relaxed) {
            return None; // cheap early out; the check below is the one that counts
        }
        self.inflight.fetch_add(1, Ordering::SeqCst);
        let g = InFlight(&self.inflight);
        if self.left.load(Ordering::SeqCst) {
            return None; // `g` drops: count restored
        }
        Some(g)
    }
}

/// One reserve/release in flight (see [`Membership`]).
struct InFlight<'a>(&'a AtomicU32);

impl Drop for InFlight<'_> {
    #[inline]
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl JoinRequest<'_> {
    /// The identity key: [`JoinRequest::key`], or the name's.
    pub fn key(&self) -> u64 {
        match self.key {
            0 => crate::identity::key_of_name(self.container_id),
            k => k,
        }
    }
}

impl std::fmt::Display for LedgerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LedgerError::Io { path, err } => write!(f, "ledger {}: {err}", path.display()),
            LedgerError::Corrupt { path, why } => {
                write!(f, "ledger {} is corrupt: {why}", path.display())
            }
            LedgerError::Version { path, found } => write!(
                f,
                "ledger {} has format version {found}, this build speaks {FORMAT_VERSION}",
                path.display()
            ),
            LedgerError::Full { path, what } => {
                write!(f, "ledger {} has no free {what} slot", path.display())
            }
        }
    }
}

impl std::error::Error for LedgerError {}

impl std::fmt::Display for QuotaExceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} bytes requested, {} of {} held",
            self.requested, self.used, self.quota
        )
    }
}

impl LedgerError {
    /// The table lock stayed held by a live process (a stopped one, or one
    /// that is not scheduled) for the whole wait. Passing; try again.
    pub fn is_busy(&self) -> bool {
        matches!(self, LedgerError::Io { err, .. } if err.kind() == std::io::ErrorKind::TimedOut)
    }
    /// No free slot (passing, when processes or containers leave).
    pub fn is_full(&self) -> bool {
        matches!(self, LedgerError::Full { .. })
    }
    fn io(path: &Path, err: std::io::Error) -> Self {
        LedgerError::Io {
            path: path.to_owned(),
            err,
        }
    }
}

/// Byte offset of process slot `i` in the file; its liveness lock covers
/// `[offset, offset + size_of::<ProcessSlot>())`.
pub fn process_slot_offset(i: usize) -> u64 {
    (std::mem::offset_of!(LedgerFile, processes) + i * std::mem::size_of::<ProcessSlot>()) as u64
}

/// The table lock covers the magic's 8 bytes (locks are advisory: this
/// never stops anyone from reading the magic).
const TABLE_LOCK: (u64, u64) = (0, 8);

/// Copy of a NUL-padded byte field that other processes may rewrite at any
/// time: read byte by byte through atomics (never a reference to shared
/// bytes), so a torn read is at worst a wrong string, never undefined
/// behaviour.
fn load_bytes<const N: usize>(field: &[AtomicU8; N]) -> [u8; N] {
    let mut out = [0u8; N];
    for (o, b) in out.iter_mut().zip(field) {
        *o = b.load(Ordering::Relaxed);
    }
    out
}

fn store_bytes<const N: usize>(field: &[AtomicU8; N], value: &[u8]) {
    for (i, b) in field.iter().enumerate() {
        b.store(value.get(i).copied().unwrap_or(0), Ordering::Relaxed);
    }
}

/// Reads of the header's plain fields. They are written once, before the
/// file gets its name, but another process (or damage) may write them
/// while this one reads: read them as volatile loads of whole words (as
/// `Ledger::is_damaged` does), never through a plain shared reference.
macro_rules! header_reads {
    ($($(#[$m:meta])* $name:ident: $field:ident -> $t:ty;)*) => {
        impl LedgerHeader {
            $(
                $(#[$m])*
                #[inline]
                pub fn $name(&self) -> $t {
                    // SAFETY: an aligned field of a live mapping; a
                    // volatile load of a whole word observes some value
                    // another process wrote, never a torn one on the
                    // platforms cgpu runs on (x86-64, aarch64).
                    unsafe { std::ptr::read_volatile(std::ptr::addr_of!(self.$field)) }
                }
            )*
        }
    };
}

header_reads! {
    /// `magic`.
    read_magic: magic -> u64;
    /// `version`.
    read_version: version -> u32;
    /// `header_size`.
    read_header_size: header_size -> u32;
    /// `file_size`.
    read_file_size: file_size -> u64;
    /// `gpu_index`.
    read_gpu_index: gpu_index -> u32;
    /// `physical_total`.
    read_physical_total: physical_total -> u64;
    /// `created_ns`.
    read_created_ns: created_ns -> u64;
}

impl LedgerHeader {
    /// A copy of the GPU UUID.
    pub fn uuid_str(&self) -> String {
        crate::process::cstr::text_lossy(&load_bytes(&self.uuid))
    }
    /// A copy of the raw UUID bytes.
    pub fn uuid_bytes(&self) -> [u8; UUID_LEN] {
        load_bytes(&self.uuid)
    }
    /// Write the UUID (NUL-padded; cut at `UUID_LEN`).
    pub fn set_uuid(&self, uuid: &str) {
        store_bytes(&self.uuid, uuid.as_bytes());
    }
}

/// This process's pid as the host (and NVML) numbers it, when found inside
/// a PID namespace: `getpid() << 32 | host pid` (0: not found; a forked
/// child, whose `getpid()` differs, never uses its parent's).
static HOST_PID: AtomicU64 = AtomicU64::new(0);

/// Is this process in the host's PID namespace (its `getpid()` is the
/// pid NVML lists)? Read once.
pub fn in_host_pidns() -> bool {
    static HOST: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HOST.get_or_init(|| crate::identity::ns_inode("pid") == crate::identity::HOST_PIDNS)
}

/// This process's pid as the host and NVML number it; `None` inside a PID
/// namespace until it was found ([`set_host_pid`]). Never a bare pid of
/// another namespace.
pub fn host_pid() -> Option<u32> {
    let me = std::process::id();
    let v = HOST_PID.load(Ordering::Acquire);
    if v >> 32 == u64::from(me) && v as u32 != 0 {
        return Some(v as u32);
    }
    in_host_pidns().then_some(me)
}

/// Record this process's host pid, found inside a PID namespace (it is
/// written into the process slots it claims from now on).
pub fn set_host_pid(pid: u32) {
    HOST_PID.store(
        u64::from(std::process::id()) << 32 | u64::from(pid),
        Ordering::Release,
    );
}

impl ProcessSlot {
    /// Its pid as the host and NVML number it, if known: the one it wrote
    /// (checked against its `start_time`, so that a value left by an
    /// earlier owner of the slot is never taken for it), else its `pid`
    /// when it runs in the host's PID namespace.
    pub fn host_pid(&self) -> Option<u32> {
        let v = self.host_pid.load(Ordering::Acquire);
        let start = self.start_time.load(Ordering::Acquire) as u32;
        if v as u32 != 0 && (v >> 32) as u32 == start {
            return Some(v as u32);
        }
        let pid = self.pid.load(Ordering::Acquire);
        (pid > 0 && self.pidns.load(Ordering::Acquire) == crate::identity::HOST_PIDNS)
            .then_some(pid as u32)
    }
    /// Write its host pid (stamped with its `start_time`).
    pub fn set_host_pid(&self, pid: u32) {
        let start = self.start_time.load(Ordering::Acquire) as u32;
        self.host_pid
            .store(u64::from(start) << 32 | u64::from(pid), Ordering::Release);
    }
}

impl ContainerSlot {
    /// A copy of the container id (lossy UTF-8). Stable while the slot is
    /// `SLOT_LIVE`: ids are only written while a slot is being claimed.
    pub fn id_str(&self) -> String {
        crate::process::cstr::text_lossy(&load_bytes(&self.id))
    }
    /// A copy of the raw id bytes.
    pub fn id_bytes(&self) -> [u8; ID_LEN] {
        load_bytes(&self.id)
    }
    /// Write the id (NUL-padded; cut at `ID_LEN`).
    pub fn set_id(&self, id: &str) {
        store_bytes(&self.id, id.as_bytes());
    }
    /// Bytes it may still allocate: `quota − used`, never below 0 (also when
    /// an operator lowered the quota under what is held); `None` when not
    /// limited (quota 0) or not enforcing.
    pub fn free_bytes(&self) -> Option<u64> {
        let quota = self.quota.load(Ordering::Acquire);
        if quota == 0 || self.enforce_off.load(Ordering::Relaxed) != 0 {
            return None;
        }
        Some(quota.saturating_sub(self.used.load(Ordering::Acquire)))
    }
    /// Live and the container with identity `key` and name `id`: by its key
    /// when it has one, else (a slot claimed by a process that did not know
    /// keys) by its name.
    pub fn is_container(&self, key: u64, id: &str) -> bool {
        if self.state.load(Ordering::Acquire) != SLOT_LIVE {
            return false;
        }
        match self.current_key() {
            0 => self.is(id),
            k => k == key,
        }
    }
    /// The slot's identity key, 0 when unknown (never written, or stale:
    /// see [`ContainerSlot::key_created`]).
    pub fn current_key(&self) -> u64 {
        let k = self.key.load(Ordering::Acquire);
        if k != 0
            && self.key_created.load(Ordering::Acquire) == self.created_ns.load(Ordering::Acquire)
        {
            k
        } else {
            0
        }
    }
    /// Does the slot's identity check out? `None` when it cannot be told
    /// (no `id_sum`, or a stale one: see [`ContainerSlot::id_sum`]);
    /// `Some(false)`: its id, key or sum was damaged.
    pub fn id_intact(&self) -> Option<bool> {
        let sum = self.id_sum.load(Ordering::Acquire);
        let created = self.key_created.load(Ordering::Acquire);
        if sum == 0 || created != self.created_ns.load(Ordering::Acquire) {
            return None;
        }
        Some(sum == id_sum(&self.id_bytes(), self.key.load(Ordering::Acquire), created))
    }
    /// Live and named `id`?
    fn is(&self, id: &str) -> bool {
        if self.state.load(Ordering::Acquire) != SLOT_LIVE || id.len() > ID_LEN {
            return false;
        }
        let b = self.id_bytes();
        b[..id.len()] == *id.as_bytes() && b.get(id.len()).is_none_or(|&c| c == 0)
    }
}

/// How long after a generation is built its joins wait for the processes
/// of the damaged one to move (`Ledger::previous_generation_settled`).
pub const SETTLE_LIMIT: Duration = Duration::from_secs(1);

/// The check written in [`ContainerSlot::id_sum`]: FNV-1a (64 bit) of
/// the 64 id bytes, then `key` and `key_created` (little-endian); never 0
/// (0 means unknown).
pub fn id_sum(id: &[u8; ID_LEN], key: u64, key_created: u64) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in id
        .iter()
        .chain(&key.to_le_bytes())
        .chain(&key_created.to_le_bytes())
    {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h.max(1)
}

/// One mapped GPU ledger.
pub struct Ledger {
    path: PathBuf,
    /// `MAP_SHARED` mapping of exactly `size_of::<LedgerFile>()` bytes.
    map: NonNull<LedgerFile>,
    /// Descriptor through which this process holds the table lock and its
    /// liveness locks. Nothing else may reference its open file description
    /// (no mapping, no dup), so that it dies with this process. -1 once
    /// closed (after `fork`).
    fd: AtomicI32,
    /// A second open file description: the mapping is made through it, and
    /// it probes slots' locks (`F_OFD_GETLK` ignores the prober's own
    /// description, so probing through `fd` would see our own slots as dead).
    probe_fd: AtomicI32,
    /// Threads of one process share `fd`, and OFD locks do not exclude each
    /// other within one description: this serialises them first.
    table: parking_lot::Mutex<()>,
    /// Set in a forked child: this mapping's memberships belong to the parent.
    stale: AtomicBool,
    /// Its slot in the SIGBUS guard (`guard::NONE`: unguarded).
    guard: usize,
    /// (device, inode) of the file it maps.
    ino: (u64, u64),
    /// Its generation (see [`Ledger::live_path`]).
    generation: u64,
    /// The header's GPU uuid bytes when opened.
    uuid0: [u8; UUID_LEN],
    /// CLOCK_MONOTONIC ns of the last [`Ledger::take_free_weight`] attempt.
    weight_try_ns: AtomicU64,
    /// 1 + the container slot this process claimed with weight 0 because
    /// none was free (0: none): only such a container takes a weight by
    /// itself later; a weight 0 an operator set is left alone.
    weightless: AtomicU32,
}

// SAFETY: everything mutable in the mapping is an atomic or is written only
// under the table lock (ids, timestamps, via raw pointers); the fds are
// atomics and the mutex is Sync. The mapping lives as long as the `Ledger`.
unsafe impl Send for Ledger {}
// SAFETY: as above.
unsafe impl Sync for Ledger {}

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ledger")
            .field("path", &self.path)
            .field("fd", &self.fd.load(Ordering::Relaxed))
            .field("stale", &self.stale.load(Ordering::Relaxed))
            .finish()
    }
}

impl Drop for Ledger {
    fn drop(&mut self) {
        for fd in [&self.fd, &self.probe_fd] {
            let fd = fd.swap(-1, Ordering::AcqRel);
            if fd >= 0 {
                // SAFETY: we own this descriptor; closing it drops our OFD
                // locks (any membership not left is then reaped by others).
                unsafe { libc::close(fd) };
            }
        }
        guard::unregister(self.guard);
        // SAFETY: `map` is the mapping created in `file::map` with exactly
        // this length; no reference into it outlives `self`.
        unsafe {
            libc::munmap(self.map.as_ptr().cast(), std::mem::size_of::<LedgerFile>());
        }
    }
}

/// Held while the slot table may change: the in-process mutex plus the OFD
/// lock on `TABLE_LOCK`. Dropping it releases both.
struct TableGuard<'a> {
    fd: i32,
    _inner: parking_lot::MutexGuard<'a, ()>,
}

impl Drop for TableGuard<'_> {
    fn drop(&mut self) {
        let _ = lock::unlock(self.fd, TABLE_LOCK.0, TABLE_LOCK.1);
    }
}

/// Test hook: how long `join` sleeps while holding the table lock with a
/// process slot half-claimed (so that tests can `kill -9` a process there).
#[doc(hidden)]
pub static TEST_JOIN_PAUSE_MS: AtomicU64 = AtomicU64::new(0);

/// Times this process lost a creation race (its fully built ledger could
/// not be linked into place because another process's was first): lets
/// tests prove that the race they stage really happened.
#[doc(hidden)]
pub static TEST_CREATE_LOST: AtomicU64 = AtomicU64::new(0);

/// Test hook: how long `open_or_create` sleeps between building a new
/// ledger and linking it into place (widens the creation race for tests).
#[doc(hidden)]
pub static TEST_CREATE_PAUSE_MS: AtomicU64 = AtomicU64::new(0);

/// Test hook: how long `set_weight` sleeps between its check and its write
/// (so that tests can run two operators into each other).
#[doc(hidden)]
pub static TEST_SET_WEIGHT_PAUSE_MS: AtomicU64 = AtomicU64::new(0);

/// Longest [`Ledger::reclaim_for`] waits for the table lock.
pub const RECLAIM_WAIT: Duration = Duration::from_millis(5);

/// Longest `leave` waits for this process's reservations in flight (a few
/// atomic operations each: only a thread preempted mid-way takes long).
pub const LEAVE_WAIT: Duration = Duration::from_secs(1);
/// Longest `leave` waits for the table lock (then the slot is reaped later).
pub const LEAVE_LOCK_WAIT: Duration = Duration::from_millis(100);

/// Default minimum interval between two `maybe_reap` scans (all processes together).
pub const REAP_INTERVAL: Duration = Duration::from_millis(200);

/// Bytes for people: `1.50 GiB`, `300.0 MiB`, `12 KiB`, `17 bytes`.
pub fn human_bytes(b: u64) -> String {
    const K: u64 = 1 << 10;
    const M: u64 = 1 << 20;
    const G: u64 = 1 << 30;
    match b {
        b if b >= G => format!("{:.2} GiB", b as f64 / G as f64),
        b if b >= M => format!("{:.1} MiB", b as f64 / M as f64),
        b if b >= K => format!("{} KiB", b / K),
        b => format!("{b} bytes"),
    }
}

/// Saturating subtract on a shared counter; returns what was subtracted.
fn sat_sub(a: &AtomicU64, v: u64) -> u64 {
    let mut cur = a.load(Ordering::Acquire);
    loop {
        let take = v.min(cur);
        match a.compare_exchange_weak(cur, cur - take, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return take,
            Err(x) => cur = x,
        }
    }
}

impl Ledger {
    /// `CGPU_LEDGER_DIR` when set, else [`DEFAULT_DIR`]: the same choice
    /// for every process of every uid, so that the processes of a
    /// container never keep their books in two places. Whether the
    /// directory can be used is decided when a ledger is opened
    /// ([`Ledger::open_or_create`]): a relative path, a path that is not a
    /// directory, a directory that is not writable, or a default directory
    /// that is a symbolic link or owned by another user is an error there,
    /// for everyone, and allocations are refused until it is fixed.
    pub fn default_dir() -> PathBuf {
        match std::env::var_os("CGPU_LEDGER_DIR").filter(|d| !d.is_empty()) {
            Some(d) => PathBuf::from(d),
            None => PathBuf::from(DEFAULT_DIR),
        }
    }
    /// `<dir>/<uuid>.ledger`: the name of a GPU's first ledger generation.
    pub fn path_for(dir: &Path, uuid: &str) -> PathBuf {
        file::generation_path(dir, uuid, 0)
    }
    /// The GPU's live ledger in `dir`: its highest generation
    /// (`<uuid>.ledger`, then `<uuid>.g<n>.ledger` for each rebuild),
    /// whether or not it exists yet.
    pub fn live_path(dir: &Path, uuid: &str) -> PathBuf {
        file::generation_path(dir, uuid, file::live_generation(dir, uuid).unwrap_or(0))
    }
    /// The live ledger file of each GPU in `dir`, sorted: regular files
    /// only (symbolic links, FIFOs and device nodes named `*.ledger` are
    /// skipped, never followed or opened), and of each GPU only its highest
    /// generation (older ones are damaged files kept where they could not
    /// be removed).
    ///
    /// A default directory that is not trusted (a symbolic link, or owned
    /// by another user) lists nothing.
    pub fn list(dir: &Path) -> Vec<PathBuf> {
        if DEFAULT_DIRS.iter().any(|d| Path::new(d) == dir) && file::trusted_dir(dir).is_err() {
            return Vec::new();
        }
        let Ok(rd) = std::fs::read_dir(dir) else {
            return Vec::new();
        };
        let mut live: std::collections::BTreeMap<String, u64> = Default::default();
        for e in rd.filter_map(|e| e.ok()) {
            if !e.file_type().is_ok_and(|t| t.is_file()) {
                continue;
            }
            let n = e.file_name();
            if let Some((uuid, g)) = file::parse_name(&n.to_string_lossy()) {
                let cur = live.entry(uuid).or_insert(g);
                *cur = (*cur).max(g);
            }
        }
        live.into_iter()
            .map(|(uuid, g)| file::generation_path(dir, &uuid, g))
            .collect()
    }
    /// Open the GPU's ledger, creating and initialising it if absent.
    pub fn open_or_create(
        dir: &Path,
        uuid: &str,
        gpu_index: u32,
        physical_total: u64,
    ) -> Result<Ledger, LedgerError> {
        file::open_or_create(dir, uuid, gpu_index, physical_total, None)
    }
    /// Open an existing ledger for reading and knob writes (tools). Validates
    /// magic, version and size; never creates, never joins.
    pub fn open(path: &Path) -> Result<Ledger, LedgerError> {
        file::open(path)
    }
    pub fn path(&self) -> &Path {
        &self.path
    }
    pub fn file(&self) -> &LedgerFile {
        // SAFETY: the mapping is valid, aligned (page) and of the right size
        // for as long as `self` lives; shared mutation goes through atomics.
        unsafe { self.map.as_ref() }
    }
    /// The GPU UUID recorded in the header.
    pub fn uuid(&self) -> String {
        self.file().header.uuid_str()
    }
    fn fd(&self) -> Result<i32, LedgerError> {
        match self.fd.load(Ordering::Acquire) {
            fd if fd >= 0 && !self.stale.load(Ordering::Acquire) => Ok(fd),
            _ => Err(LedgerError::io(
                &self.path,
                std::io::Error::other("ledger handle inherited across fork: re-open and re-join"),
            )),
        }
    }

    fn lock_table(&self) -> Result<TableGuard<'_>, LedgerError> {
        self.lock_table_within(lock::TABLE_LOCK_TIMEOUT)
    }

    /// Take the table lock, waiting at most `wait` (zero: one attempt).
    /// `Err` with `ErrorKind::TimedOut` ([`LedgerError::is_busy`]) when a
    /// live process (perhaps a stopped one) holds it all that time.
    fn lock_table_within(&self, wait: Duration) -> Result<TableGuard<'_>, LedgerError> {
        let fd = self.fd()?;
        let t0 = std::time::Instant::now();
        let busy = |what: &str| {
            LedgerError::io(
                &self.path,
                std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "the slot-table lock is held by {what} (waited {} ms)",
                        wait.as_millis()
                    ),
                ),
            )
        };
        let inner = if wait.is_zero() {
            self.table.try_lock()
        } else {
            self.table.try_lock_for(wait)
        }
        .ok_or_else(|| busy("another thread of this process"))?;
        let left = wait.saturating_sub(t0.elapsed());
        match lock::lock_timeout(fd, TABLE_LOCK.0, TABLE_LOCK.1, left) {
            Ok(()) => Ok(TableGuard { fd, _inner: inner }),
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => Err(busy(
                "another process that is not making progress (stopped, paused or swapped out?)",
            )),
            Err(e) => Err(LedgerError::io(&self.path, e)),
        }
    }

    /// One attempt, no waiting: for paths that must not block.
    fn try_lock_table(&self) -> Option<TableGuard<'_>> {
        let fd = self.fd().ok()?;
        let inner = self.table.try_lock()?;
        match lock::try_lock(fd, TABLE_LOCK.0, TABLE_LOCK.1) {
            Ok(true) => Some(TableGuard { fd, _inner: inner }),
            _ => None,
        }
    }

    /// Claim (or find, by id) the container slot and a process slot; take the
    /// liveness lock. Reaps dead slots first. Waits at most 2 s for the
    /// table lock (see [`Ledger::join_within`]).
    pub fn join(&self, req: &JoinRequest<'_>) -> Result<Membership, LedgerError> {
        self.join_within(req, lock::TABLE_LOCK_TIMEOUT)
    }

    /// [`Ledger::join`], waiting at most `wait` for the table lock (zero:
    /// one attempt). A lock still held after that is
    /// [`LedgerError::is_busy`]: the caller must not allocate unaccounted
    /// (refuse, and try again later).
    pub fn join_within(
        &self,
        req: &JoinRequest<'_>,
        wait: Duration,
    ) -> Result<Membership, LedgerError> {
        let id = req.container_id;
        if id.is_empty() || id.len() > ID_LEN || id.contains('\0') {
            return Err(LedgerError::io(
                &self.path,
                std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!("container id {id:?} must be 1..={ID_LEN} bytes without NUL"),
                ),
            ));
        }
        let fd = self.fd()?;
        self.check_required()?;
        self.previous_generation_settled()?;
        let key = req.key();
        let _g = self.lock_table_within(wait)?;
        self.reap_locked();
        if let Some(why) = self.identity_damage() {
            return Err(LedgerError::Corrupt {
                path: self.path.clone(),
                why,
            });
        }
        let f = self.file();

        let (c, created) = match f.containers.iter().position(|c| c.is_container(key, id)) {
            Some(c) => {
                if let Some(diff) = settings_differ(&f.containers[c], req) {
                    tracing::warn!(
                        "container {} already runs on GPU {} with {}; this process asked for {}: it gets the container's settings (the first process's; change them with cgpuctl set)",
                        f.containers[c].id_str(),
                        f.header.uuid_str(),
                        diff.0,
                        diff.1
                    );
                }
                (c, false)
            }
            None => (self.claim_container(req)?, true),
        };

        let Some(p) = self.claim_process(fd, c) else {
            if created {
                self.free_container(c);
            }
            return Err(LedgerError::Full {
                path: self.path.clone(),
                what: "process",
            });
        };
        f.containers[c].nprocs.fetch_add(1, Ordering::AcqRel);
        Ok(Membership::new(c, p))
    }

    /// Under the table lock: claim a free container slot for `req`.
    fn claim_container(&self, req: &JoinRequest<'_>) -> Result<usize, LedgerError> {
        let f = self.file();
        let h = &f.header;
        let c = f
            .containers
            .iter()
            .position(|c| c.state.load(Ordering::Acquire) == SLOT_FREE)
            .ok_or_else(|| LedgerError::Full {
                path: self.path.clone(),
                what: "container",
            })?;
        let slot = &f.containers[c];
        slot.state.store(SLOT_CLAIMING, Ordering::Release);

        let quota = match req.quota {
            0 => h.default_memsize.load(Ordering::Relaxed),
            QUOTA_UNLIMITED => 0,
            q => q,
        };
        let fw = free_weight(f);
        let want = req.weight.max(1);
        let weight = if fw == 0 {
            self.weightless.store(c as u32 + 1, Ordering::Release);
            tracing::warn!(
                "container {}: free_weight is 0 on GPU {} (max_inst {} taken): it gets weight 0 and no compute until weight frees up",
                req.container_id,
                h.uuid_str(),
                h.max_inst.load(Ordering::Relaxed)
            );
            0
        } else if want > fw {
            let max = h.max_inst.load(Ordering::Relaxed);
            tracing::warn!(
                "container {}: asked for weight {want} on GPU {}, {}: it gets weight {fw}",
                req.container_id,
                h.uuid_str(),
                if want > max {
                    format!("more than the GPU's max_inst {max}")
                } else {
                    format!("but only {fw} of max_inst {max} is free")
                }
            );
            fw
        } else {
            want
        };

        // The slot is CLAIMING under the table lock: no other process
        // writes it, and readers only trust the id once the slot is LIVE.
        slot.set_id(req.container_id);
        let now = realtime_ns();
        slot.created_ns.store(now, Ordering::Relaxed);
        slot.key.store(req.key(), Ordering::Relaxed);
        slot.key_created.store(now, Ordering::Relaxed);
        slot.id_sum
            .store(id_sum(&slot.id_bytes(), req.key(), now), Ordering::Relaxed);
        slot.quota.store(quota, Ordering::Relaxed);
        slot.used.store(0, Ordering::Relaxed);
        slot.peak.store(0, Ordering::Relaxed);
        slot.weight.store(weight, Ordering::Relaxed);
        slot.nprocs.store(0, Ordering::Relaxed);
        slot.oom_count.store(0, Ordering::Relaxed);
        slot.suspect.store(0, Ordering::Relaxed);
        slot.recounts.store(0, Ordering::Relaxed);
        slot.highprio.store(req.highprio as u32, Ordering::Relaxed);
        slot.enforce_off
            .store(req.enforce_off as u32, Ordering::Relaxed);
        for w in &slot.sched {
            w.store(0, Ordering::Relaxed);
        }
        // The requested weight counts, even if clamped (`ALIYUN_COM_GPU_SCHD_WEIGHT`, README).
        self.weight_switches_policy(req.weight);
        slot.state.store(SLOT_LIVE, Ordering::Release);
        Ok(c)
    }

    /// Under the table lock: claim a free process slot for container `c` and
    /// take its liveness lock through `fd`.
    fn claim_process(&self, fd: i32, c: usize) -> Option<usize> {
        let f = self.file();
        let (pid, pidns, start_time) = file::self_identity();
        for (i, p) in f.processes.iter().enumerate() {
            if p.state.load(Ordering::Acquire) != SLOT_FREE {
                continue;
            }
            // A free slot whose range is still locked (cannot normally
            // happen) is skipped rather than shared.
            let off = process_slot_offset(i);
            match lock::try_lock(fd, off, std::mem::size_of::<ProcessSlot>() as u64) {
                Ok(true) => {}
                _ => continue,
            }
            p.state.store(SLOT_CLAIMING, Ordering::Release);
            let pause = TEST_JOIN_PAUSE_MS.load(Ordering::Relaxed);
            if pause > 0 {
                std::thread::sleep(Duration::from_millis(pause));
            }
            p.container.store(c as u32, Ordering::Relaxed);
            p.pid.store(pid, Ordering::Relaxed);
            p.pidns.store(pidns, Ordering::Relaxed);
            p.start_time.store(start_time, Ordering::Relaxed);
            match host_pid() {
                Some(h) => p.set_host_pid(h),
                None => p.host_pid.store(0, Ordering::Relaxed),
            }
            p.used.store(0, Ordering::Relaxed);
            p.pending.store(0, Ordering::Relaxed);
            p.gpu_time_ns.store(0, Ordering::Relaxed);
            p.launches.store(0, Ordering::Relaxed);
            p.sched_beat_ns.store(0, Ordering::Relaxed);
            p.sched_in_sync.store(0, Ordering::Relaxed);
            p.state.store(SLOT_LIVE, Ordering::Release);
            return Some(i);
        }
        None
    }

    /// Under the table lock: free container slot `c` (its knobs go with it).
    fn free_container(&self, c: usize) {
        let s = &self.file().containers[c];
        s.used.store(0, Ordering::Relaxed);
        s.nprocs.store(0, Ordering::Relaxed);
        s.weight.store(0, Ordering::Relaxed);
        s.state.store(SLOT_FREE, Ordering::Release);
    }

    /// Under the table lock: free process slot `i` after moving what it holds
    /// off its container.
    fn free_process(&self, i: usize) {
        let f = self.file();
        let p = &f.processes[i];
        let c = p.container.load(Ordering::Acquire) as usize;
        let live = p.state.load(Ordering::Acquire) == SLOT_LIVE && c < MAX_CONTAINERS;
        // What importers of its container hold of its exports is theirs to
        // pay for from now on (counted on them first); its own imports'
        // entries go with the slot, whatever state it was in.
        self.share_pass_on(i, live);
        if live {
            let held = p.used.swap(0, Ordering::AcqRel);
            sat_sub(&f.containers[c].used, held);
            let pending = p.pending.swap(0, Ordering::AcqRel);
            if pending != 0 {
                // Did its last CAS on the container happen? Unknowable here:
                // keep the bytes counted (safe) and recount when quiet.
                f.containers[c].suspect.fetch_add(pending, Ordering::AcqRel);
                tracing::debug!(
                    "process slot {i} (pid {}) died with {pending} bytes in flight: container {} recounts",
                    p.pid.load(Ordering::Relaxed),
                    f.containers[c].id_str()
                );
            }
        }
        p.state.store(SLOT_FREE, Ordering::Release);
    }

    /// Give back everything `m` holds and free its process slot (normal
    /// exit). Safe to call while other threads of this process allocate:
    /// it first waits (at most [`LEAVE_WAIT`]) for reservations in flight
    /// through `m` to finish; later ones are refused and releases ignored.
    /// If some thread stays inside a reservation longer than that, the slot
    /// is kept (still counted, never under-counted) and freed when this
    /// process dies. Idempotent. Returns true when this call gave the
    /// bytes back and dropped the liveness lock.
    pub fn leave(&self, m: impl std::borrow::Borrow<Membership>) -> bool {
        let m = m.borrow();
        if self.stale.load(Ordering::Acquire) {
            return false; // the parent's membership: not ours to give back
        }
        if m.left.swap(true, Ordering::SeqCst) {
            return false;
        }
        let t0 = std::time::Instant::now();
        while m.inflight.load(Ordering::SeqCst) != 0 {
            if t0.elapsed() > LEAVE_WAIT {
                tracing::warn!(
                    "leaving ledger {}: a thread is still inside an allocation after {} ms; the process slot is freed when the process ends",
                    self.path.display(),
                    LEAVE_WAIT.as_millis()
                );
                return false;
            }
            std::thread::yield_now();
        }
        let f = self.file();
        let p = &f.processes[m.process];
        let c = &f.containers[m.container];
        // Under the table lock (waiting at most LEAVE_LOCK_WAIT: an exit
        // never hangs on a stalled lock holder), so that no import of what
        // this process exported can be recorded between the look and the
        // give-back. Memory it exported that an importer of its container
        // holds is passed on by the reap below, before its bytes go; then
        // nothing is given back here. Without the lock nothing is given
        // back either: the next reap does it all (counted meanwhile).
        let table = self.lock_table_within(LEAVE_LOCK_WAIT);
        if table.is_ok() && !self.exports_shared(m.process) {
            // Move the bytes under the same `pending` marker as a release (a
            // concurrent recount then cannot subtract them a second time),
            // then drop the liveness lock: a reaper that sees us dead finds
            // nothing left to subtract twice.
            let held = p.used.load(Ordering::Acquire);
            p.pending.fetch_add(held, Ordering::AcqRel);
            c.ops.fetch_add(1, Ordering::AcqRel);
            let took = sat_sub(&p.used, held);
            sat_sub(&c.used, took);
            p.pending.fetch_sub(held, Ordering::AcqRel);
        }
        if let Ok(fd) = self.fd() {
            let _ = lock::unlock(
                fd,
                process_slot_offset(m.process),
                std::mem::size_of::<ProcessSlot>() as u64,
            );
        }
        // Free the slot now if we hold the lock; otherwise the next reap
        // does, our liveness lock being gone.
        match table {
            Ok(_g) => {
                self.reap_locked();
            }
            Err(e) => tracing::debug!("leave: {e}; the slot and its bytes are reaped later"),
        }
        true
    }

    /// Lock-free: reserve `bytes` against the container's quota in one atomic
    /// step (CAS), recording them on the process slot. Never lets the
    /// container's `used` pass its quota when enforcing.
    #[inline]
    pub fn try_reserve(&self, m: &Membership, bytes: u64) -> Result<(), QuotaExceeded> {
        if bytes == 0 {
            return Ok(());
        }
        let Some(_in) = m.enter() else {
            // Left (the process is exiting): nothing may be charged any more.
            return Err(QuotaExceeded {
                quota: 0,
                used: 0,
                requested: bytes,
            });
        };
        let f = self.file();
        let c = &f.containers[m.container];
        let p = &f.processes[m.process];
        // Crash consistency: while `pending` is non-zero the container may
        // count up to `pending` bytes that the process slot does not show
        // (yet). `ops` is bumped before `used` changes (see `resync`).
        p.pending.fetch_add(bytes, Ordering::AcqRel);
        c.ops.fetch_add(1, Ordering::AcqRel);
        let mut cur = c.used.load(Ordering::Acquire);
        loop {
            let quota = c.quota.load(Ordering::Acquire);
            let enforce = quota != 0 && c.enforce_off.load(Ordering::Relaxed) == 0;
            let new = match cur.checked_add(bytes) {
                Some(n) if !enforce || n <= quota => n,
                _ => {
                    p.pending.fetch_sub(bytes, Ordering::AcqRel);
                    c.oom_count.fetch_add(1, Ordering::Relaxed);
                    return Err(QuotaExceeded {
                        quota,
                        used: cur,
                        requested: bytes,
                    });
                }
            };
            match c
                .used
                .compare_exchange_weak(cur, new, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    if new > c.peak.load(Ordering::Relaxed) {
                        c.peak.fetch_max(new, Ordering::Relaxed);
                    }
                    p.used.fetch_add(bytes, Ordering::AcqRel);
                    p.pending.fetch_sub(bytes, Ordering::AcqRel);
                    return Ok(());
                }
                Err(x) => cur = x,
            }
        }
    }

    /// Lock-free: give back `bytes` previously reserved by `m`. Giving back
    /// more than the process holds logs a warning and clamps.
    #[inline]
    pub fn release(&self, m: &Membership, bytes: u64) {
        if bytes == 0 {
            return;
        }
        let Some(_in) = m.enter() else {
            return; // left: `leave` gave everything back already
        };
        let f = self.file();
        let p = &f.processes[m.process];
        let c = &f.containers[m.container];
        // Process first, container second, `pending` around both: a crash in
        // between leaves the container over-counted (safe), never
        // under-counted, and flagged for an exact recount.
        p.pending.fetch_add(bytes, Ordering::AcqRel);
        c.ops.fetch_add(1, Ordering::AcqRel);
        let took = sat_sub(&p.used, bytes);
        sat_sub(&c.used, took);
        p.pending.fetch_sub(bytes, Ordering::AcqRel);
        if took != bytes {
            tracing::warn!(
                "release of {bytes} bytes but process slot {} held {took}: clamped",
                m.process
            );
        }
    }

    /// Reclaim the slots and bytes of dead processes and containers without
    /// processes. Returns how many process slots were reclaimed. Waits at
    /// most 2 s for the table lock (returns 0 and logs if it could not).
    pub fn reap(&self) -> usize {
        if !self.needs_reap() {
            return 0;
        }
        match self.lock_table() {
            Ok(_g) => self.reap_locked(),
            Err(e) => {
                tracing::warn!("reap: {e}");
                0
            }
        }
    }

    /// Never blocks: reap if no process reaped in the last `min_interval`
    /// (the timestamp is shared in the header) and the table lock is free
    /// right now. Cheap enough for allocation and meminfo paths.
    pub fn maybe_reap(&self, min_interval: Duration) -> usize {
        let h = &self.file().header;
        let now = crate::process::clock::monotonic_ns();
        let last = h.last_reap_ns.load(Ordering::Relaxed);
        let due = now < last || now - last >= min_interval.as_nanos() as u64;
        if !due
            || h.last_reap_ns
                .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
        {
            return 0;
        }
        if !self.needs_reap() {
            return 0;
        }
        match self.try_lock_table() {
            Some(_g) => self.reap_locked(),
            None => 0,
        }
    }

    /// For a refused reservation: did a process of `m`'s container die
    /// holding bytes (or mid-operation)? If so, reap now, waiting at most
    /// [`RECLAIM_WAIT`] for the table lock, and return true: the caller
    /// tries once more. Not rate-limited, so a survivor gets a dead
    /// sibling's bytes as soon as the kernel has dropped its liveness lock;
    /// cheap when nothing died (one pass over the slot states, one
    /// `F_OFD_GETLK` per other live process of this container, no lock).
    pub fn reclaim_for(&self, m: &Membership) -> bool {
        let f = self.file();
        let Some(slot) = f.containers.get(m.container) else {
            return false;
        };
        let suspect = slot.suspect.load(Ordering::Acquire) != 0;
        let dead = f.processes.iter().enumerate().any(|(i, p)| {
            i != m.process
                && p.state.load(Ordering::Acquire) == SLOT_LIVE
                && p.container.load(Ordering::Relaxed) as usize == m.container
                && !self.is_alive(i)
        });
        if !dead && !suspect {
            return false;
        }
        match self.lock_table_within(RECLAIM_WAIT) {
            Ok(_g) => {
                let n = self.reap_locked();
                n > 0 || (suspect && slot.suspect.load(Ordering::Acquire) == 0)
            }
            Err(_) => false,
        }
    }

    /// Lock-free pre-check: any dead or half-claimed process slot, a live
    /// container without live processes, or one whose `nprocs` is not its
    /// number of live processes? The last happens when a process dies
    /// inside `reap_locked` after freeing a slot and before the recount (a
    /// process killed while leaving): nothing else would ever correct it.
    fn needs_reap(&self) -> bool {
        let f = self.file();
        let mut live = [0u32; MAX_CONTAINERS];
        for (i, p) in f.processes.iter().enumerate() {
            match p.state.load(Ordering::Acquire) {
                SLOT_FREE => {}
                SLOT_LIVE if self.is_alive(i) => {
                    let c = p.container.load(Ordering::Relaxed) as usize;
                    if c < MAX_CONTAINERS {
                        live[c] += 1;
                    }
                }
                _ => return true,
            }
        }
        f.containers.iter().enumerate().any(|(c, s)| {
            s.state.load(Ordering::Acquire) != SLOT_FREE
                && (live[c] == 0
                    || s.suspect.load(Ordering::Relaxed) != 0
                    || s.nprocs.load(Ordering::Relaxed) != live[c])
        })
    }

    /// Under the table lock (so no join is half-way): free dead and
    /// half-claimed process slots, recount `nprocs`, free containers left
    /// without processes.
    fn reap_locked(&self) -> usize {
        let f = self.file();
        let mut reaped = 0;
        let mut nprocs = [0u32; MAX_CONTAINERS];
        for (i, p) in f.processes.iter().enumerate() {
            match p.state.load(Ordering::Acquire) {
                SLOT_FREE => continue,
                SLOT_LIVE if self.is_alive(i) => {
                    let c = p.container.load(Ordering::Relaxed) as usize;
                    if c < MAX_CONTAINERS {
                        nprocs[c] += 1;
                        continue;
                    }
                    tracing::warn!("process slot {i} names container slot {c}: freed");
                }
                SLOT_LIVE => {}
                _ => tracing::debug!("process slot {i}: claimer died mid-join"),
            }
            tracing::debug!(
                "reaping process slot {i} (pid {}, {} bytes)",
                p.pid.load(Ordering::Relaxed),
                p.used.load(Ordering::Relaxed)
            );
            self.free_process(i);
            reaped += 1;
        }
        for (c, s) in f.containers.iter().enumerate() {
            if s.state.load(Ordering::Acquire) == SLOT_FREE {
                continue;
            }
            s.nprocs.store(nprocs[c], Ordering::Release);
            if nprocs[c] == 0 {
                tracing::debug!("container {} has no process left: slot freed", s.id_str());
                self.free_container(c);
            } else if s.suspect.load(Ordering::Acquire) != 0 {
                self.resync(c);
            }
        }
        reaped
    }

    /// Under the table lock (dead slots already freed): make container `c`'s
    /// `used` exactly the sum of its live processes' `used`, removing what
    /// processes that died mid-operation left behind. Needs an instant when
    /// none of its processes has an operation in flight: read `ops`, `used`,
    /// every live slot (all `pending` zero), `used` and `ops` again; if
    /// nothing moved, `used − Σ` is exactly the leftover, and subtracting it
    /// (rather than storing Σ) stays right whatever completes meanwhile.
    /// Gives up after a bounded number of tries (the next reap retries).
    fn resync(&self, c: usize) -> bool {
        let f = self.file();
        let s = &f.containers[c];
        let sc = Ordering::SeqCst;
        for attempt in 0..256 {
            if attempt > 0 {
                std::thread::yield_now();
            }
            let o0 = s.ops.load(sc);
            let c1 = s.used.load(sc);
            let mut sum = 0u64;
            let mut busy = false;
            for (_, p) in self.processes_of(c) {
                if p.pending.load(sc) != 0 {
                    busy = true;
                    break;
                }
                sum = sum.saturating_add(p.used.load(sc));
            }
            if busy || s.used.load(sc) != c1 || s.ops.load(sc) != o0 {
                continue;
            }
            if c1 >= sum {
                sat_sub(&s.used, c1 - sum);
            } else {
                // Under-counted (cannot happen by this protocol): count up, the safe way.
                tracing::warn!(
                    "container {}: used {c1} < sum of its processes {sum}",
                    s.id_str()
                );
                s.used.fetch_add(sum - c1, sc);
            }
            let suspect = s.suspect.swap(0, sc);
            s.recounts.fetch_add(1, Ordering::Relaxed);
            tracing::info!(
                "container {}: recounted used after a process died mid-operation ({} bytes given back, at most {suspect} suspected)",
                s.id_str(),
                c1.saturating_sub(sum)
            );
            return true;
        }
        tracing::debug!("container {}: busy, recount postponed", s.id_str());
        false
    }

    /// Is the process in slot `i` alive (its liveness lock held)? A lock held
    /// through this very handle counts as alive.
    pub fn is_alive(&self, i: usize) -> bool {
        let fd = self.probe_fd.load(Ordering::Acquire);
        if i >= MAX_PROCESSES || fd < 0 {
            return false;
        }
        // On an error (cannot happen on a valid fd) say alive: never reap on doubt.
        lock::is_locked(
            fd,
            process_slot_offset(i),
            std::mem::size_of::<ProcessSlot>() as u64,
        )
        .unwrap_or(true)
    }

    /// For a `pthread_atfork` child handler; async-signal-safe (two `close`s
    /// and atomic stores). The child shares the parent's open file
    /// descriptions, hence its locks: keeping them would make the parent look
    /// alive after its death. Closing only drops the child's reference. After
    /// this, the handle must not be used for reserve/release (its
    /// memberships are the parent's); `join`/`reap` return errors or do
    /// nothing; open a new `Ledger` and join again.
    pub fn after_fork_child(&self) {
        self.stale.store(true, Ordering::Release);
        for fd in [&self.fd, &self.probe_fd] {
            let fd = fd.swap(-1, Ordering::AcqRel);
            if fd >= 0 {
                // SAFETY: close(2) is async-signal-safe; the child owns its
                // copy of the descriptor. The parent's locks survive (they go
                // only when the last reference to the description closes).
                unsafe { libc::close(fd) };
            }
        }
    }

    /// Can this mapping still be trusted? False once another process
    /// truncated the file under it (the access faulted and the SIGBUS guard
    /// put anonymous memory in its place), or wiped or overwrote its header.
    #[inline]
    pub fn is_damaged(&self) -> bool {
        if guard::is_damaged(self.guard) {
            return true;
        }
        let h = &self.file().header;
        // Volatile loads: another process may rewrite them.
        let (magic, version, header_size, file_size) = (
            h.read_magic(),
            h.read_version(),
            h.read_header_size(),
            h.read_file_size(),
        );
        magic != LEDGER_MAGIC
            || version != FORMAT_VERSION
            || header_size as usize != std::mem::size_of::<LedgerHeader>()
            || file_size as usize != std::mem::size_of::<LedgerFile>()
            || h.ready.load(Ordering::Acquire) != 1
    }

    /// A live container slot whose identity fails its check
    /// ([`ContainerSlot::id_intact`]): why, for the error. Under the table
    /// lock (claims are made under it, so no slot is seen half-written).
    fn identity_damage(&self) -> Option<String> {
        let f = self.file();
        // A live process (dead ones are reaped first) always belongs to a
        // live container: otherwise a container's state was damaged, and
        // its processes' bytes would be missing from a fresh slot's books.
        let orphan = f.processes.iter().enumerate().find_map(|(i, p)| {
            if p.state.load(Ordering::Acquire) != SLOT_LIVE {
                return None;
            }
            let c = p.container.load(Ordering::Acquire) as usize;
            let live = f
                .containers
                .get(c)
                .is_some_and(|s| s.state.load(Ordering::Acquire) == SLOT_LIVE);
            (!live).then(|| {
                format!("live process slot {i} belongs to container slot {c}, which is not live (damaged)")
            })
        });
        if orphan.is_some() {
            return orphan;
        }
        // A process holding its liveness lock on a slot that does not say
        // LIVE: that slot's state was damaged (its bytes would be reaped
        // from the books while it holds them).
        let mut unlisted = None;
        self.locked_slots(0, MAX_PROCESSES, &mut |i| {
            if f.processes[i].state.load(Ordering::Acquire) != SLOT_LIVE {
                unlisted = Some(format!(
                    "process slot {i} is held by a live process but is not marked live (damaged)"
                ));
            }
            unlisted.is_none()
        });
        if unlisted.is_some() {
            return unlisted;
        }
        f.containers.iter().enumerate().find_map(|(i, c)| {
            (c.state.load(Ordering::Acquire) == SLOT_LIVE && c.id_intact() == Some(false)).then(
                || {
                    format!(
                        "container slot {i} ({:?}): its id or key does not match its id_sum (damaged)",
                        c.id_str()
                    )
                },
            )
        })
    }

    /// Calls `each` with every process slot in `[lo, hi)` whose liveness
    /// lock a process holds (our own included: probed through `probe_fd`),
    /// until it returns false. One lock query per held slot and per gap
    /// between them, not one per slot.
    fn locked_slots(&self, lo: usize, hi: usize, each: &mut dyn FnMut(usize) -> bool) -> bool {
        let fd = self.probe_fd.load(Ordering::Acquire);
        if lo >= hi || fd < 0 {
            return true;
        }
        let size = std::mem::size_of::<ProcessSlot>() as u64;
        let start = process_slot_offset(lo);
        let Ok(Some((s, len))) = lock::held_lock(fd, start, (hi - lo) as u64 * size) else {
            return true;
        };
        let base = process_slot_offset(0);
        let first = (s.max(start) - base) / size;
        let end = if len == 0 {
            hi as u64
        } else {
            (s + len - base).div_ceil(size)
        };
        let (first, end) = (first as usize, (end as usize).clamp(first as usize + 1, hi));
        self.locked_slots(lo, first, each)
            && (first..end).all(&mut *each)
            && self.locked_slots(end, hi, each)
    }

    /// [`Ledger::identity_damage`], taking the table lock for at most
    /// `wait` (`None` also when it could not be taken: the join checks
    /// again under the lock).
    pub(super) fn identity_damage_within(&self, wait: Duration) -> Option<String> {
        let _g = self.lock_table_within(wait).ok()?;
        self.reap_locked();
        self.identity_damage()
    }

    /// A new generation is joined only once the processes still mapped to
    /// the damaged one it replaced have moved (each leaves it within one
    /// watcher period and re-registers what it holds here): joined before,
    /// a newcomer would see books without their bytes. Waited for at most
    /// [`SETTLE_LIMIT`] after the generation was built (a stopped process
    /// does not hold newcomers back for longer). `Err` ([`LedgerError::is_busy`]):
    /// refuse, and try again later.
    fn previous_generation_settled(&self) -> Result<(), LedgerError> {
        if self.generation == 0 {
            return Ok(());
        }
        let created = self.file().header.created_ns;
        if realtime_ns().saturating_sub(created) > SETTLE_LIMIT.as_nanos() as u64 {
            return Ok(());
        }
        let dir = self.path.parent().unwrap_or(Path::new("/"));
        let name = self.path.file_name().unwrap_or_default().to_string_lossy();
        let Some((uuid, _)) = file::parse_name(&name) else {
            return Ok(());
        };
        let prev = file::generation_path(dir, &uuid, self.generation - 1);
        if !file::has_live_processes(&prev) {
            return Ok(());
        }
        Err(LedgerError::io(
            &self.path,
            std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "was just built past the damaged {}, whose processes have not all moved here yet",
                    prev.display()
                ),
            ),
        ))
    }

    /// Are the header's identity fields as they were when this handle was
    /// opened (the GPU's uuid), besides [`Ledger::is_damaged`]'s checks?
    /// For the allocation path and the watcher (it reads the uuid's bytes).
    pub fn header_intact(&self) -> bool {
        !self.is_damaged() && self.file().header.uuid_bytes() == self.uuid0
    }

    /// Stop referring to the file at all (after [`Ledger::abandon`], when
    /// the handle is replaced by another): its mapping is swapped, in
    /// place, for private zeroed memory (every pointer into it stays valid
    /// and reads a damaged ledger), and its SIGBUS guard slot is freed for
    /// the live mapping. A handle that is dropped instead is unmapped.
    pub fn retire(&self) {
        // SAFETY: `[map, map + size)` is our own mapping; replacing it in
        // place keeps every reference into it valid (zeroed memory is a
        // valid value of every field). It is never unmapped while
        // references may exist (retired handles are never dropped).
        let p = unsafe {
            libc::mmap(
                self.map.as_ptr().cast(),
                std::mem::size_of::<LedgerFile>(),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_FIXED | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == self.map.as_ptr().cast() {
            guard::unregister(self.guard);
        }
    }

    /// Can this handle still be used for shared state (scheduling)? False
    /// once damaged, abandoned (its file was replaced: the process moved to
    /// another ledger) or inherited across `fork`.
    #[inline]
    pub fn is_usable(&self) -> bool {
        !self.is_stale() && !self.is_damaged()
    }

    /// Is `m` still this process's place here (slots live, as joined)?
    #[inline]
    pub fn membership_intact(&self, m: &Membership) -> bool {
        let f = self.file();
        let (Some(p), Some(c)) = (f.processes.get(m.process), f.containers.get(m.container)) else {
            return false;
        };
        p.state.load(Ordering::Acquire) == SLOT_LIVE
            && p.container.load(Ordering::Acquire) as usize == m.container
            && c.state.load(Ordering::Acquire) == SLOT_LIVE
    }

    /// Does the ledger's path now name another file (deleted, or replaced
    /// by another file), so that new processes no longer see this one?
    /// Two `stat`s: for a periodic check, not the hot path.
    pub fn is_replaced(&self) -> bool {
        use std::os::unix::fs::MetadataExt;
        match std::fs::metadata(&self.path) {
            Ok(m) if (m.dev(), m.ino()) == self.ino => {}
            _ => return true,
        }
        // A newer generation was built (this one was found damaged).
        let name = self.path.file_name().unwrap_or_default().to_string_lossy();
        let Some((uuid, _)) = file::parse_name(&name) else {
            return false;
        };
        let dir = self.path.parent().unwrap_or(Path::new("/"));
        file::generation_path(dir, &uuid, self.generation + 1).exists()
    }

    /// Stop using this handle because its file is damaged or replaced:
    /// close both descriptors, which drops this process's locks on it (so
    /// that a damaged file can be set aside and rebuilt). The mapping stays
    /// (other threads may still be reading it); later reserve/release on it
    /// do nothing harmful, `join` fails.
    pub fn abandon(&self) {
        self.stale.store(true, Ordering::Release);
        for fd in [&self.fd, &self.probe_fd] {
            let fd = fd.swap(-1, Ordering::AcqRel);
            if fd >= 0 {
                // SAFETY: we own this descriptor and nobody uses it after
                // the swap.
                unsafe { libc::close(fd) };
            }
        }
    }

    /// Put this process's own counter back to `truth` (what it holds, as
    /// it knows) if damage changed it, and have the container recounted
    /// from its processes' counters (see `resync`). Only while no
    /// reservation of this process is in flight. While an entry of the
    /// table of shared allocations names this process, a counter above
    /// `truth` is left alone (it may carry what an exporter that died
    /// passed on and this process has not adopted yet; a count too high
    /// only refuses more). Returns whether anything was wrong. For the
    /// watcher: the books converge to what the processes hold after stray
    /// writes.
    pub fn repair_counts(&self, m: &Membership, truth: u64) -> bool {
        let Some(_in) = m.enter() else { return false };
        if m.inflight.load(Ordering::SeqCst) != 1 {
            return false; // another thread is reserving: look next time
        }
        let f = self.file();
        let p = &f.processes[m.process];
        let c = &f.containers[m.container];
        if p.pending.load(Ordering::SeqCst) != 0 {
            return false;
        }
        let seen = p.used.load(Ordering::SeqCst);
        let me = m.process as u32;
        let sharing = f.shared.iter().any(|e| {
            e.state.load(Ordering::Acquire) != SLOT_FREE
                && (e.holder.load(Ordering::Acquire) == me
                    || e.exporter.load(Ordering::Acquire) == me)
        });
        let own_wrong = seen < truth || (seen > truth && !sharing);
        if own_wrong
            && p.used
                .compare_exchange(seen, truth, Ordering::SeqCst, Ordering::SeqCst)
                .is_err()
        {
            return false;
        }
        // The container's count must equal the sum of its processes'; a
        // recount is cheap under the table lock and exact (`resync`).
        let sum: u64 = self
            .processes_of(m.container)
            .map(|(_, p)| p.used.load(Ordering::SeqCst))
            .fold(0u64, |a, b| a.saturating_add(b));
        let busy = self
            .processes_of(m.container)
            .any(|(_, p)| p.pending.load(Ordering::SeqCst) != 0);
        let container_wrong = !busy && c.used.load(Ordering::SeqCst) != sum;
        if !own_wrong && !container_wrong {
            return false;
        }
        drop(_in);
        c.suspect.fetch_add(1, Ordering::SeqCst);
        if let Some(_g) = self.try_lock_table() {
            self.resync(m.container);
        }
        tracing::warn!(
            "ledger {}: container {}'s counts were damaged (this process's slot said {seen}, it holds {truth}); recounted from its processes",
            self.path.display(),
            c.id_str()
        );
        true
    }

    /// Charge `bytes` that this process already holds on the device to
    /// `m`, whatever the quota (re-registering after a move to a rebuilt
    /// ledger: they exist, so they count; the container then refuses until
    /// it is back under its quota).
    pub fn register_held(&self, m: &Membership, bytes: u64) {
        if bytes == 0 {
            return;
        }
        let Some(_in) = m.enter() else { return };
        let f = self.file();
        let p = &f.processes[m.process];
        let c = &f.containers[m.container];
        p.pending.fetch_add(bytes, Ordering::AcqRel);
        c.ops.fetch_add(1, Ordering::AcqRel);
        let new = c
            .used
            .fetch_add(bytes, Ordering::AcqRel)
            .saturating_add(bytes);
        c.peak.fetch_max(new, Ordering::Relaxed);
        p.used.fetch_add(bytes, Ordering::AcqRel);
        p.pending.fetch_sub(bytes, Ordering::AcqRel);
    }

    /// True after `after_fork_child`: this handle must be replaced.
    pub fn is_stale(&self) -> bool {
        self.stale.load(Ordering::Acquire)
    }

    /// The container slot of a membership.
    #[inline]
    pub fn container_of(&self, m: &Membership) -> &ContainerSlot {
        &self.file().containers[m.container]
    }

    /// The process slot of a membership.
    #[inline]
    pub fn process_of(&self, m: &Membership) -> &ProcessSlot {
        &self.file().processes[m.process]
    }

    /// Live containers (slot index, slot).
    pub fn containers(&self) -> impl Iterator<Item = (usize, &ContainerSlot)> {
        self.file()
            .containers
            .iter()
            .enumerate()
            .filter(|(_, c)| c.state.load(Ordering::Acquire) == SLOT_LIVE)
    }

    /// Live container slot named `id`.
    pub fn find_container(&self, id: &str) -> Option<usize> {
        self.file().containers.iter().position(|c| c.is(id))
    }

    /// The live container slot a process of identity `key` and name `id`
    /// joins (see [`ContainerSlot::is_container`]).
    pub fn find_container_keyed(&self, key: u64, id: &str) -> Option<usize> {
        self.file()
            .containers
            .iter()
            .position(|c| c.is_container(key, id))
    }

    /// `Err` when the file requires an addition this build does not know
    /// ([`LedgerHeader::required`]): its books cannot be kept right here.
    pub fn check_required(&self) -> Result<(), LedgerError> {
        let req = self.file().header.required.load(Ordering::Acquire);
        let unknown = req & !ADDITIONS;
        if unknown == 0 {
            return Ok(());
        }
        Err(LedgerError::io(
            &self.path,
            std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                format!(
                    "written by a newer cgpu that requires format additions {unknown:#x} this version does not know; upgrade libcgpu.so to share it"
                ),
            ),
        ))
    }

    /// Process slots in use by container `c` (slot index, slot). Includes
    /// slots of processes that died and were not reaped yet (`is_alive`).
    pub fn processes_of(&self, c: usize) -> impl Iterator<Item = (usize, &ProcessSlot)> {
        self.file()
            .processes
            .iter()
            .enumerate()
            .filter(move |(_, p)| {
                p.state.load(Ordering::Acquire) == SLOT_LIVE
                    && p.container.load(Ordering::Relaxed) as usize == c
            })
    }

    /// Plain-data copy of the whole ledger for tools.
    pub fn snapshot(&self) -> Snapshot {
        Snapshot::take(self)
    }
}

/// Knob writes (`cgpuctl set`), range-checked as cGPU does. Each bumps
/// `knob_generation` so running jobs notice. A smaller `memsize` than what
/// is held refuses further allocations; it never frees memory under a job.
impl Ledger {
    /// A weight > 1 switches the GPU to policy 2 unless an
    /// operator set the policy explicitly (at join and on `set_weight`).
    fn weight_switches_policy(&self, weight: u32) {
        let h = &self.file().header;
        if weight > 1
            && h.policy_explicit.load(Ordering::Acquire) == 0
            && h.policy.swap(2, Ordering::AcqRel) != 2
        {
            h.knob_generation.fetch_add(1, Ordering::AcqRel);
            tracing::info!(
                "GPU {}: weight {weight} > 1 switches policy to 2",
                h.uuid_str()
            );
        }
    }
    fn bump(&self) {
        self.file()
            .header
            .knob_generation
            .fetch_add(1, Ordering::AcqRel);
    }
    fn live_container(&self, c: usize) -> Result<&ContainerSlot, String> {
        self.file()
            .containers
            .get(c)
            .filter(|s| s.state.load(Ordering::Acquire) == SLOT_LIVE)
            .ok_or_else(|| format!("no live container in slot {c}"))
    }
    /// Policy 0..=5; marks it explicit (a weight > 1 no longer switches it).
    pub fn set_policy(&self, policy: u32) -> Result<(), String> {
        if policy > POLICY_MAX {
            return Err(format!("policy {policy} out of range 0..={POLICY_MAX}"));
        }
        let h = &self.file().header;
        h.policy.store(policy, Ordering::Release);
        h.policy_explicit.store(1, Ordering::Release);
        self.bump();
        Ok(())
    }
    pub fn set_max_inst(&self, v: u32) -> Result<(), String> {
        if !MAX_INST_RANGE.contains(&v) {
            return Err(format!("max_inst {v} out of range {MAX_INST_RANGE:?}"));
        }
        self.file().header.max_inst.store(v, Ordering::Release);
        self.bump();
        Ok(())
    }
    pub fn set_prio_ratio(&self, v: u32) -> Result<(), String> {
        if !PRIO_RATIO_RANGE.contains(&v) {
            return Err(format!("prio_ratio {v} out of range {PRIO_RATIO_RANGE:?}"));
        }
        self.file().header.prio_ratio.store(v, Ordering::Release);
        self.bump();
        Ok(())
    }
    /// Bytes; 0 = containers without a quota are not limited.
    pub fn set_default_memsize(&self, bytes: u64) -> Result<(), String> {
        self.file()
            .header
            .default_memsize
            .store(bytes, Ordering::Release);
        self.bump();
        Ok(())
    }
    /// Weight of container slot `c` (0 = no compute). As in cGPU, the
    /// weights of live containers may not sum to more than `max_inst`: the
    /// most it may get is its current weight plus `free_weight`.
    ///
    /// Check and write happen under the table lock (the same lock `join`
    /// takes to hand out weights), so two operators, or an operator and an
    /// arriving container, can never together push the sum past `max_inst`.
    pub fn set_weight(&self, c: usize, w: u32) -> Result<(), String> {
        let _g = self.lock_table().map_err(|e| e.to_string())?;
        let slot = self.live_container(c)?;
        let max = self.file().header.max_inst.load(Ordering::Acquire);
        let most = slot
            .weight
            .load(Ordering::Acquire)
            .saturating_add(free_weight(self.file()));
        if w > max || w > most {
            return Err(format!(
                "weight {w} out of range 0..={} (max_inst {max}, weights of live containers may not sum past it)",
                most.min(max)
            ));
        }
        let pause = TEST_SET_WEIGHT_PAUSE_MS.load(Ordering::Relaxed);
        if pause > 0 {
            std::thread::sleep(Duration::from_millis(pause));
        }
        slot.weight.store(w, Ordering::Release);
        self.weight_switches_policy(w);
        self.bump();
        Ok(())
    }
    /// Container slot `c` has weight 0 because this process claimed it
    /// when none was free: give it weight 1 if one is free now (a weight 0
    /// an operator set is never overridden). One attempt at the table lock,
    /// never waiting; rate-limited per GPU handle (at most every 10 ms), so
    /// a waiting launch may call it on each turn of its wait. True when it
    /// took a weight.
    pub fn take_free_weight(&self, c: usize) -> bool {
        if self.weightless.load(Ordering::Acquire) != c as u32 + 1 {
            return false; // not a container that arrived with no weight free
        }
        let now = crate::process::clock::monotonic_ns();
        let last = self.weight_try_ns.load(Ordering::Relaxed);
        if now < last.saturating_add(10_000_000)
            || self
                .weight_try_ns
                .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
        {
            return false;
        }
        let Some(_g) = self.try_lock_table() else {
            return false;
        };
        let Ok(slot) = self.live_container(c) else {
            return false;
        };
        if slot.weight.load(Ordering::Acquire) != 0 {
            // It got weight another way (an operator): from now on a
            // weight 0 is theirs to give.
            self.weightless.store(0, Ordering::Release);
            return false;
        }
        if free_weight(self.file()) == 0 {
            // A container that held weight may have died: reap first.
            if self.needs_reap() {
                self.reap_locked();
            }
            if free_weight(self.file()) == 0 {
                return false;
            }
        }
        slot.weight.store(1, Ordering::Release);
        self.weightless.store(0, Ordering::Release);
        self.bump();
        true
    }
    /// Quota in bytes of container slot `c` (0 = not limited).
    pub fn set_memsize(&self, c: usize, bytes: u64) -> Result<(), String> {
        self.live_container(c)?
            .quota
            .store(bytes, Ordering::Release);
        self.bump();
        Ok(())
    }
    pub fn set_highprio(&self, c: usize, on: bool) -> Result<(), String> {
        self.live_container(c)?
            .highprio
            .store(on as u32, Ordering::Release);
        self.bump();
        Ok(())
    }
}

/// How a joining process's request differs from the live container it
/// joins: `(what the container has, what was asked)`, each a readable list
/// of the settings that differ; `None` when they agree. Settings the
/// request leaves at their defaults (no quota, weight 1, not high
/// priority) never count as asking for something.
fn settings_differ(slot: &ContainerSlot, req: &JoinRequest<'_>) -> Option<(String, String)> {
    let quota = slot.quota.load(Ordering::Relaxed);
    let off = slot.enforce_off.load(Ordering::Relaxed) != 0;
    let weight = slot.weight.load(Ordering::Relaxed);
    let high = slot.highprio.load(Ordering::Relaxed) != 0;
    let q = |b: u64| {
        if b == 0 || b == QUOTA_UNLIMITED {
            "no quota".to_string()
        } else {
            format!("quota {}", human_bytes(b))
        }
    };
    let (mut has, mut asked) = (Vec::new(), Vec::new());
    let asked_quota = match req.quota {
        0 => None,
        QUOTA_UNLIMITED => Some(0),
        b => Some(b),
    };
    if asked_quota.is_some_and(|a| a != quota) {
        has.push(q(quota));
        asked.push(q(req.quota));
    }
    if req.enforce_off != off {
        has.push(format!("CGPU_DISABLE {}", if off { "on" } else { "off" }));
        asked.push(format!(
            "CGPU_DISABLE {}",
            if req.enforce_off { "on" } else { "off" }
        ));
    }
    if req.weight > 1 && req.weight != weight {
        has.push(format!("weight {weight}"));
        asked.push(format!("weight {}", req.weight));
    }
    if req.highprio != high {
        has.push(format!("high priority {}", if high { "on" } else { "off" }));
        asked.push(format!(
            "high priority {}",
            if req.highprio { "on" } else { "off" }
        ));
    }
    // The same container (by identity) under another name: the first
    // process's name stays.
    let name = slot.id_str();
    if name != req.container_id {
        has.push(format!("name {name}"));
        asked.push(format!("name {}", req.container_id));
    }
    (!has.is_empty()).then(|| (has.join(", "), asked.join(", ")))
}

/// `free_weight`: `max_inst − Σ weights of live containers`, never below 0.
pub fn free_weight(f: &LedgerFile) -> u32 {
    let used: u32 = f
        .containers
        .iter()
        .filter(|c| c.state.load(Ordering::Acquire) == SLOT_LIVE)
        .map(|c| c.weight.load(Ordering::Relaxed))
        .fold(0u32, |a, w| a.saturating_add(w));
    f.header
        .max_inst
        .load(Ordering::Relaxed)
        .saturating_sub(used)
}
