//! A plain-data copy of a ledger for the tools (`cgpu-tools`, `cgpu-smi
//! --json`). Values are read one by one with relaxed loads: each is exact,
//! the whole is a near-instant picture, not a transaction.

use super::*;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub path: PathBuf,
    pub uuid: String,
    pub gpu_index: u32,
    pub format_version: u32,
    pub physical_total: u64,
    pub created_ns: u64,
    pub policy: u32,
    pub policy_explicit: bool,
    pub max_inst: u32,
    pub prio_ratio: u32,
    pub default_memsize: u64,
    pub knob_generation: u64,
    pub free_weight: u32,
    /// Per-GPU scheduler words.
    pub sched: Vec<u64>,
    /// Live containers, by slot index.
    pub containers: Vec<ContainerSnapshot>,
    /// Process slots in use (dead but not yet reaped ones have `alive: false`).
    pub processes: Vec<ProcessSnapshot>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerSnapshot {
    pub slot: usize,
    pub id: String,
    /// Bytes; 0 = not limited.
    pub quota: u64,
    pub used: u64,
    pub peak: u64,
    pub weight: u32,
    pub highprio: bool,
    pub enforce_off: bool,
    pub nprocs: u32,
    pub oom_count: u64,
    /// Bytes `used` may still count for processes that died mid-operation.
    pub suspect: u64,
    /// Times `used` was recounted after such a death.
    pub recounts: u64,
    pub created_ns: u64,
    /// Per-container scheduler words.
    pub sched: Vec<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessSnapshot {
    pub slot: usize,
    /// Container slot index.
    pub container: usize,
    pub container_id: String,
    /// In the process's own PID namespace.
    pub pid: i32,
    pub pidns: u64,
    pub start_time: u64,
    pub used: u64,
    pub pending: u64,
    pub gpu_time_ns: u64,
    pub launches: u64,
    pub alive: bool,
}

fn words(w: &[AtomicU64]) -> Vec<u64> {
    w.iter().map(|x| x.load(Ordering::Relaxed)).collect()
}

impl Snapshot {
    pub(super) fn take(l: &Ledger) -> Snapshot {
        let f = l.file();
        let h = &f.header;
        let r = Ordering::Relaxed;
        let containers = l
            .containers()
            .map(|(slot, c)| ContainerSnapshot {
                slot,
                id: c.id_str(),
                quota: c.quota.load(r),
                used: c.used.load(r),
                peak: c.peak.load(r),
                weight: c.weight.load(r),
                highprio: c.highprio.load(r) != 0,
                enforce_off: c.enforce_off.load(r) != 0,
                nprocs: c.nprocs.load(r),
                oom_count: c.oom_count.load(r),
                suspect: c.suspect.load(r),
                recounts: c.recounts.load(r),
                created_ns: c.created_ns.load(r),
                sched: words(&c.sched),
            })
            .collect();
        let processes = f
            .processes
            .iter()
            .enumerate()
            .filter(|(_, p)| p.state.load(Ordering::Acquire) == SLOT_LIVE)
            .map(|(slot, p)| {
                let container = p.container.load(r) as usize;
                ProcessSnapshot {
                    slot,
                    container,
                    container_id: f
                        .containers
                        .get(container)
                        .map(|c| c.id_str())
                        .unwrap_or_default(),
                    pid: p.pid.load(r),
                    pidns: p.pidns.load(r),
                    start_time: p.start_time.load(r),
                    used: p.used.load(r),
                    pending: p.pending.load(r),
                    gpu_time_ns: p.gpu_time_ns.load(r),
                    launches: p.launches.load(r),
                    alive: l.is_alive(slot),
                }
            })
            .collect();
        Snapshot {
            path: l.path().to_owned(),
            uuid: h.uuid_str(),
            gpu_index: h.read_gpu_index(),
            format_version: h.read_version(),
            physical_total: h.read_physical_total(),
            created_ns: h.read_created_ns(),
            policy: h.policy.load(r),
            policy_explicit: h.policy_explicit.load(r) != 0,
            max_inst: h.max_inst.load(r),
            prio_ratio: h.prio_ratio.load(r),
            default_memsize: h.default_memsize.load(r),
            knob_generation: h.knob_generation.load(r),
            free_weight: free_weight(f),
            sched: words(&h.sched),
            containers,
            processes,
        }
    }
}

/// Lookups any process or tool may make.
impl Ledger {
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
