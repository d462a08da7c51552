//! The shared file's layout: the header, the container and process slots,
//! and the helpers that read and write their fields.

use super::*;

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

/// Byte offset of process slot `i` in the file; its liveness lock covers
/// `[offset, offset + size_of::<ProcessSlot>())`.
pub fn process_slot_offset(i: usize) -> u64 {
    (std::mem::offset_of!(LedgerFile, processes) + i * std::mem::size_of::<ProcessSlot>()) as u64
}

/// The table lock covers the magic's 8 bytes (locks are advisory: this
/// never stops anyone from reading the magic).
pub(crate) const TABLE_LOCK: (u64, u64) = (0, 8);

/// Copy of a NUL-padded byte field that other processes may rewrite at any
/// time: read byte by byte through atomics (never a reference to shared
/// bytes), so a torn read is at worst a wrong string, never undefined
/// behaviour.
pub(crate) fn load_bytes<const N: usize>(field: &[AtomicU8; N]) -> [u8; N] {
    let mut out = [0u8; N];
    for (o, b) in out.iter_mut().zip(field) {
        *o = b.load(Ordering::Relaxed);
    }
    out
}

pub(crate) fn store_bytes<const N: usize>(field: &[AtomicU8; N], value: &[u8]) {
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
        crate::cstr::text_lossy(&load_bytes(&self.uuid))
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
static HOST_PID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

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
        crate::cstr::text_lossy(&load_bytes(&self.id))
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
    pub(crate) fn is(&self, id: &str) -> bool {
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
