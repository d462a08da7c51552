//! The per-GPU shared-memory ledger (SPEC §2–§3).
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
//! STATUS: API and layout fixed by the lead; bodies are being implemented on
//! the `ledger` branch. Code against the signatures.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64};

/// `b"CGPULEDG"` read as a little-endian u64.
pub const LEDGER_MAGIC: u64 = u64::from_le_bytes(*b"CGPULEDG");
/// Bumped on any layout change.
pub const FORMAT_VERSION: u32 = 1;
/// Container slots per GPU (cGPU's `max_inst` is at most 25).
pub const MAX_CONTAINERS: usize = 32;
/// Process slots per GPU.
pub const MAX_PROCESSES: usize = 256;
/// Bytes for a container id, NUL-padded.
pub const ID_LEN: usize = 64;
/// Bytes for a GPU UUID string (`GPU-…`), NUL-padded.
pub const UUID_LEN: usize = 96;
/// Words of per-GPU scheduler state (owned by `scheduler`).
pub const SCHED_GPU_WORDS: usize = 32;
/// Words of per-container scheduler state (owned by `scheduler`).
pub const SCHED_CONTAINER_WORDS: usize = 16;

/// Slot states (containers and processes).
pub const SLOT_FREE: u32 = 0;
pub const SLOT_CLAIMING: u32 = 1;
pub const SLOT_LIVE: u32 = 2;

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
    pub uuid: [u8; UUID_LEN],
    /// Physical memory in bytes, as the driver reports it.
    pub physical_total: u64,
    /// CLOCK_REALTIME ns at creation.
    pub created_ns: u64,
    /// Compute policy 0..=5 (SPEC §4).
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
    pub reserved: [u64; 16],
}

/// One container on this GPU.
#[repr(C)]
pub struct ContainerSlot {
    pub state: AtomicU32,
    pub highprio: AtomicU32,
    /// Container id, NUL-padded UTF-8.
    pub id: [u8; ID_LEN],
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
    pub created_ns: u64,
    /// 1 when memory enforcement is off (`CGPU_DISABLE`): usage recorded only.
    pub enforce_off: AtomicU32,
    pub _pad: u32,
    /// Scheduler state (`scheduler` defines the words).
    pub sched: [AtomicU64; SCHED_CONTAINER_WORDS],
    pub reserved: [u64; 8],
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
    pub reserved: [u64; 4],
}

/// The whole file.
#[repr(C)]
pub struct LedgerFile {
    pub header: LedgerHeader,
    pub containers: [ContainerSlot; MAX_CONTAINERS],
    pub processes: [ProcessSlot; MAX_PROCESSES],
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
    pub container_id: &'a str,
    /// Bytes, 0 = not limited.
    pub quota: u64,
    /// Requested compute weight (1..=max_inst).
    pub weight: u32,
    pub highprio: bool,
    /// `CGPU_DISABLE`: record usage without enforcing.
    pub enforce_off: bool,
}

/// This process's place in one ledger: its container and process slot. Holds
/// the liveness lock for as long as it lives.
#[derive(Debug)]
pub struct Membership {
    pub container: usize,
    pub process: usize,
}

/// One mapped GPU ledger.
#[derive(Debug)]
pub struct Ledger {
    _private: (),
}

impl Ledger {
    /// `CGPU_LEDGER_DIR`, else `/run/cgpu` if writable (created), else `/dev/shm/cgpu`.
    pub fn default_dir() -> PathBuf {
        todo!()
    }
    /// `<dir>/<uuid>.ledger`.
    pub fn path_for(dir: &Path, uuid: &str) -> PathBuf {
        dir.join(format!("{uuid}.ledger"))
    }
    /// All ledger files in `dir`, sorted.
    pub fn list(_dir: &Path) -> Vec<PathBuf> {
        todo!()
    }
    /// Open the GPU's ledger, creating and initialising it if absent.
    pub fn open_or_create(
        _dir: &Path,
        _uuid: &str,
        _gpu_index: u32,
        _physical_total: u64,
    ) -> Result<Ledger, LedgerError> {
        todo!()
    }
    /// Open an existing ledger for reading and knob writes (tools). Validates
    /// magic, version and size; never creates, never joins.
    pub fn open(_path: &Path) -> Result<Ledger, LedgerError> {
        todo!()
    }
    pub fn path(&self) -> &Path {
        todo!()
    }
    pub fn file(&self) -> &LedgerFile {
        todo!()
    }
    /// Claim (or find, by id) the container slot and a process slot; take the
    /// liveness lock. Reaps dead slots first.
    pub fn join(&self, _req: &JoinRequest<'_>) -> Result<Membership, LedgerError> {
        todo!()
    }
    /// Give back everything `m` holds and free its process slot (normal exit).
    pub fn leave(&self, _m: Membership) {
        todo!()
    }
    /// Lock-free: reserve `bytes` against the container's quota in one atomic
    /// step (CAS), recording them on the process slot. Never lets the
    /// container's `used` pass its quota when enforcing.
    pub fn try_reserve(&self, _m: &Membership, _bytes: u64) -> Result<(), QuotaExceeded> {
        todo!()
    }
    /// Lock-free: give back `bytes` previously reserved by `m`.
    pub fn release(&self, _m: &Membership, _bytes: u64) {
        todo!()
    }
    /// Reclaim the slots and bytes of dead processes and containers without
    /// processes. Returns how many process slots were reclaimed.
    pub fn reap(&self) -> usize {
        todo!()
    }
    /// Is the process in slot `i` alive (its liveness lock held)?
    pub fn is_alive(&self, _i: usize) -> bool {
        todo!()
    }
}

/// `free_weight` of SPEC §3: `max_inst − Σ weights of live containers`, never below 0.
pub fn free_weight(_f: &LedgerFile) -> u32 {
    todo!()
}
