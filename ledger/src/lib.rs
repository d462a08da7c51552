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

// The books themselves: one room per concern.
mod account;
mod damage;
mod error;
mod file;
mod guard;
mod join;
mod knobs;
mod layout;
mod lock;
mod membership;
mod open;
mod quota;
mod reap;
mod shared;
mod snapshot;
pub mod sync;

// What every process and tool on the host shares besides the books.
pub mod clock;
pub mod cstr;
pub mod decide;
pub mod futex;
pub mod identity;
pub mod mode;
pub mod page;
pub mod policy;
pub mod settings;
pub mod wire;
pub mod words;

/// `cgpu-library-version=X.Y.Z` between NULs, as `libcgpu.so` carries it in
/// its `CGPU_LIBRARY_VERSION` symbol: how the tools read the version of an
/// installed library from its file, without loading it (`cgpuctl version`).
/// One version for the library, the tools and the ledger (the workspace's).
pub const VERSION_TAG: &str = concat!("\0cgpu-library-version=", env!("CARGO_PKG_VERSION"), "\0");

pub use error::{LedgerError, QuotaExceeded};
pub use knobs::free_weight;
pub use layout::*;
pub use membership::{JoinRequest, Membership};
pub use quota::books;

pub use account::{Account, JoinSpec, ShareLink, JOIN_WAIT, RETRY_INTERVAL, WATCH_INTERVAL};
pub use shared::{SharePayer, SharedSlot, MAX_SHARED, SHARED_BORNE, SHARED_BYTES, SHARED_RELEASED};
pub use snapshot::{ContainerSnapshot, ProcessSnapshot, Snapshot};

use crate::sync::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::time::Duration;

use crate::clock::realtime_ns;

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

/// Permissions of a ledger in the cooperative mode: every process of
/// every uid reads and writes the books.
pub const SHARED_MODE: u32 = 0o666;
/// Permissions of a ledger the node agent owns (secure mode): its owner
/// writes, everyone else only reads.
pub const AGENT_MODE: u32 = 0o644;

/// `JoinRequest::quota` value meaning "explicitly not limited" (a `0` inside
/// `ALIYUN_COM_GPU_MEM_CONTAINER`'s list); a plain 0 means "no quota set",
/// which gets the GPU's `default_memsize`.
pub const QUOTA_UNLIMITED: u64 = u64::MAX;

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
pub static TEST_JOIN_PAUSE_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Times this process lost a creation race (its fully built ledger could
/// not be linked into place because another process's was first): lets
/// tests prove that the race they stage really happened.
#[doc(hidden)]
pub static TEST_CREATE_LOST: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Test hook: how long `open_or_create` sleeps between building a new
/// ledger and linking it into place (widens the creation race for tests).
#[doc(hidden)]
pub static TEST_CREATE_PAUSE_MS: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(0);

/// Test hook: how long `set_weight` sleeps between its check and its write
/// (so that tests can run two operators into each other).
#[doc(hidden)]
pub static TEST_SET_WEIGHT_PAUSE_MS: std::sync::atomic::AtomicU64 =
    std::sync::atomic::AtomicU64::new(0);

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
