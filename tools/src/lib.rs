//! cgpu-tools: reading ledgers for the operator tools (`cgpu-smi`, `cgpuctl`).
//!
//! Everything here turns a mapped ledger into plain data ([`GpuEntry`],
//! [`ContainerInfo`], [`ProcessInfo`]) and renders it. Reading never takes a
//! lock a job could wait on and never writes: the ledger's fields are atomics
//! and are loaded one by one. A ledger that cannot be opened, is of another
//! format version, or holds values no cgpu would write, is reported as such
//! ([`Status`] and `error`) and none of its numbers are shown.
//!
//! Knob writes (`cgpuctl set`) live in [`knobs`]; they are plain atomic
//! stores into the header or a container slot, followed by a bump of
//! `knob_generation`, which is how running jobs notice.
//!
//! The JSON schema (`cgpu-smi --json`), the metric names of the exporter and
//! the tree layout are documented in `docs/tools.md`.

pub mod agent;
pub mod args;
pub mod exporter;
pub mod inspect;
pub mod installed;
pub mod knobs;
pub mod nvml;
pub mod table;
pub mod tree;

use cgpu_ledger::words as scheduler;
use cgpu_ledger::{
    ContainerSlot, Ledger, LedgerError, LedgerFile, MAX_CONTAINERS, MAX_PROCESSES, SLOT_LIVE,
};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Acquire;
use std::time::Instant;

/// Version of the `cgpu-smi --json` document. Bumped only on an incompatible
/// change (a field removed or its meaning changed); new fields may appear
/// without a bump.
pub const SCHEMA_VERSION: u32 = 1;
/// Version of this crate (library and tools).
pub const CGPU_VERSION: &str = env!("CARGO_PKG_VERSION");
/// 1 MiB.
pub const MIB: u64 = 1 << 20;
/// 1 GiB.
pub const GIB: u64 = 1 << 30;

/// Whether a ledger could be read and trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Read and consistent; the numbers are shown.
    Ok,
    /// Unreadable: I/O error or permission.
    Io,
    /// Wrong magic, size, or values no cgpu writes: nothing in it is trusted.
    Corrupt,
    /// Written by another format version: nothing in it is trusted.
    Version,
    /// Still being created by a job (header not ready yet).
    NotReady,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Io => "io",
            Status::Corrupt => "corrupt",
            Status::Version => "version",
            Status::NotReady => "not_ready",
        }
    }
}

/// One process slot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProcessInfo {
    /// Index of the process slot in the ledger.
    pub slot: usize,
    /// Pid in the process's own PID namespace.
    pub pid: i32,
    /// Inode of its PID namespace.
    pub pidns: u64,
    /// Whether it still holds its liveness lock (false: dead, not yet reaped).
    pub alive: bool,
    /// Device memory it holds, bytes.
    pub used_bytes: u64,
    /// GPU time charged to it, ns.
    pub gpu_time_ns: u64,
    /// Kernel launches admitted.
    pub launches: u64,
}

/// One container on one GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContainerInfo {
    /// Index of the container slot in the ledger.
    pub slot: usize,
    /// Container id (`pod` in the table).
    pub id: String,
    /// CLOCK_REALTIME ns when the slot was claimed (tells reused slots apart).
    pub created_ns: u64,
    pub highprio: bool,
    /// Compute weight (0: arrived when `free_weight` was 0, gets no compute).
    pub weight: u32,
    /// Memory quota, bytes; 0 = not limited.
    pub quota_bytes: u64,
    /// Bytes held by all its processes.
    pub used_bytes: u64,
    /// Highest `used_bytes` ever reached.
    pub peak_bytes: u64,
    /// The quota, or the GPU's physical memory when not limited.
    pub total_bytes: u64,
    /// `total_bytes − used_bytes`, never below 0 (cGPU's `meminfo` `Free:`).
    pub free_bytes: u64,
    /// Memory enforcement on (false: `CGPU_DISABLE`, usage recorded only).
    pub enforce: bool,
    /// Live processes as the ledger counts them.
    pub nprocs: u32,
    /// Allocations refused for quota.
    pub oom_count: u64,
    /// GPU time charged to the container, ns.
    pub gpu_time_ns: u64,
    /// Time its threads spent held back in launch hooks, ns.
    pub throttled_ns: u64,
    /// Kernel launches admitted.
    pub launches: u64,
    /// Compute limit its policy and weight give it now, percent of the GPU.
    pub limit_percent: u32,
    /// GPU time over the last sampling window, percent of the GPU; `null`
    /// when there is only one sample (or the slot was reused in between).
    pub util_percent: Option<f64>,
    /// Why its kernel launches are held back now (`null`: it holds the GPU,
    /// or none of its threads waits to launch); weight 0 says so.
    pub waiting: Option<String>,
    pub processes: Vec<ProcessInfo>,
}

/// A readable ledger: one GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// GPU index as the host driver numbers it.
    pub index: u32,
    pub uuid: String,
    pub physical_total_bytes: u64,
    pub created_ns: u64,
    pub policy: u32,
    pub policy_explicit: bool,
    pub max_inst: u32,
    pub prio_ratio: u32,
    pub default_memsize_bytes: u64,
    pub free_weight: u32,
    pub knob_generation: u64,
    pub containers: Vec<ContainerInfo>,
}

/// One ledger file, read or not.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuEntry {
    pub path: String,
    pub status: Status,
    /// Why the ledger is not trusted (`null` when `status` is `ok`).
    pub error: Option<String>,
    /// Present when `status` is `ok`.
    pub gpu: Option<GpuInfo>,
}

impl GpuEntry {
    fn failed(path: &Path, status: Status, error: String) -> Self {
        GpuEntry {
            path: path.display().to_string(),
            status,
            error: Some(error),
            gpu: None,
        }
    }
}

/// The whole document `cgpu-smi --json` prints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub schema_version: u32,
    pub cgpu_version: String,
    pub ledger_format: u32,
    pub ledger_dir: String,
    /// CLOCK_REALTIME ns of the (last) sample.
    pub timestamp_ns: u64,
    /// Length of the utilisation window, ms (`null`: one sample only).
    pub util_window_ms: Option<u64>,
    pub gpus: Vec<GpuEntry>,
    /// What `cgpu-agent` last saw (the device's own numbers), when its
    /// status file is there ([`agent::status_paths`]); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<agent::AgentView>,
    /// The mode of every GPU of the ledger directory ([`mode_of`]): `secure`
    /// (`cgpu-agent --secure`: the agent alone writes the books), `secure
    /// (agent not answering)`, or `cooperative` (the processes of the
    /// containers write them).
    #[serde(default = "cooperative")]
    pub mode: String,
}

/// The cooperative mode's name.
pub fn cooperative() -> String {
    "cooperative".into()
}

/// The ledger directory's mode, as the library decides it
/// ([`cgpu_ledger::mode::secure`]): `secure` when the books are the node
/// agent's and it answers on its socket, `secure (agent not answering)`
/// when they are its books but it does not answer (allocations are refused
/// until it is back), else `cooperative`. Connecting is all it does (the
/// connection asks nothing).
pub fn mode_of(dir: &Path) -> String {
    if cgpu_ledger::mode::secure(dir) != Ok(true) {
        return cooperative();
    }
    let sock = dir.join(cgpu_ledger::wire::SOCKET_NAME);
    if cgpu_ledger::wire::connect(&sock, None).is_ok() {
        "secure".into()
    } else {
        "secure (agent not answering)".into()
    }
}

impl Report {
    /// Entries that are readable, sorted by GPU index.
    pub fn gpus_ok(&self) -> impl Iterator<Item = &GpuInfo> {
        self.gpus.iter().filter_map(|g| g.gpu.as_ref())
    }
}

/// A [`Report`] and when it was taken.
#[derive(Debug, Clone)]
pub struct Sample {
    pub report: Report,
    pub at: Instant,
}

/// NUL-padded bytes to a string; `None` if not UTF-8.
pub use cgpu_ledger::cstr::text as cstr;

/// Is container slot `c` in use?
pub fn container_live(s: &ContainerSlot) -> bool {
    s.state.load(Acquire) == SLOT_LIVE
}

/// Turn a mapped ledger into plain data. `alive(i)` says whether process
/// slot `i` holds its liveness lock. Only loads; never writes.
pub fn read_file(
    f: &LedgerFile,
    alive: &dyn Fn(usize) -> bool,
) -> Result<GpuInfo, (Status, String)> {
    let h = &f.header;
    if h.ready.load(Acquire) != 1 {
        return Err((Status::NotReady, "ledger is still being created".into()));
    }
    let corrupt = |why: String| Err((Status::Corrupt, why));
    let uuid = match cstr(&h.uuid_bytes()) {
        Some(u) => u,
        None => return corrupt("GPU uuid is not UTF-8".into()),
    };
    let policy = h.policy.load(Acquire);
    let max_inst = h.max_inst.load(Acquire);
    let prio_ratio = h.prio_ratio.load(Acquire);
    if policy > 5 {
        return corrupt(format!("policy {policy} is not 0..5"));
    }
    if !(1..=25).contains(&max_inst) {
        return corrupt(format!("max_inst {max_inst} is not 1..25"));
    }
    if !(20..=99).contains(&prio_ratio) {
        return corrupt(format!("prio_ratio {prio_ratio} is not 20..99"));
    }
    let physical = h.read_physical_total();
    let mut containers = Vec::new();
    for (i, s) in f.containers.iter().enumerate() {
        if !container_live(s) {
            continue;
        }
        let id = match cstr(&s.id_bytes()) {
            Some(id) if !id.is_empty() => id,
            _ => return corrupt(format!("container slot {i}: id is empty or not UTF-8")),
        };
        let quota = s.quota.load(Acquire);
        let used = s.used.load(Acquire);
        let weight = s.weight.load(Acquire);
        if weight > 25 {
            return corrupt(format!("container {id}: weight {weight} is not 0..25"));
        }
        let total = if quota == 0 { physical } else { quota };
        let st = scheduler::container_stats(s);
        containers.push(ContainerInfo {
            slot: i,
            id,
            created_ns: s.created_ns.load(Acquire),
            highprio: s.highprio.load(Acquire) != 0,
            weight,
            quota_bytes: quota,
            used_bytes: used,
            peak_bytes: s.peak.load(Acquire),
            total_bytes: total,
            free_bytes: total.saturating_sub(used),
            enforce: s.enforce_off.load(Acquire) == 0,
            nprocs: s.nprocs.load(Acquire),
            oom_count: s.oom_count.load(Acquire),
            gpu_time_ns: st.gpu_time_ns,
            throttled_ns: st.throttled_ns,
            launches: st.launches,
            limit_percent: scheduler::limit_percent(f, i),
            util_percent: None,
            waiting: scheduler::waiting(f, i).map(|w| w.reason().to_owned()),
            processes: Vec::new(),
        });
    }
    for (i, p) in f.processes.iter().enumerate().take(MAX_PROCESSES) {
        if p.state.load(Acquire) != SLOT_LIVE {
            continue;
        }
        let c = p.container.load(Acquire) as usize;
        if c >= MAX_CONTAINERS {
            return corrupt(format!(
                "process slot {i}: container index {c} out of range"
            ));
        }
        // A process whose container slot is not live is mid-join or
        // mid-reap: not shown.
        if let Some(ci) = containers.iter_mut().find(|ci| ci.slot == c) {
            ci.processes.push(ProcessInfo {
                slot: i,
                pid: p.pid.load(Acquire),
                pidns: p.pidns.load(Acquire),
                alive: alive(i),
                used_bytes: p.used.load(Acquire),
                gpu_time_ns: p.gpu_time_ns.load(Acquire),
                launches: p.launches.load(Acquire),
            });
        }
    }
    Ok(GpuInfo {
        index: h.read_gpu_index(),
        uuid,
        physical_total_bytes: physical,
        created_ns: h.read_created_ns(),
        policy,
        policy_explicit: h.policy_explicit.load(Acquire) != 0,
        max_inst,
        prio_ratio,
        default_memsize_bytes: h.default_memsize.load(Acquire),
        free_weight: cgpu_ledger::free_weight(f),
        knob_generation: h.knob_generation.load(Acquire),
        containers,
    })
}

/// Map a ledger open error to a status and message.
pub fn open_error(e: &LedgerError) -> (Status, String) {
    match e {
        LedgerError::Io { err, .. } => (Status::Io, format!("cannot open: {err}")),
        LedgerError::Corrupt { why, .. } => (Status::Corrupt, format!("corrupt ledger: {why}")),
        LedgerError::Version { found, .. } => (
            Status::Version,
            format!(
                "ledger format {found}, this cgpu reads format {}: not trusted",
                cgpu_ledger::FORMAT_VERSION
            ),
        ),
        LedgerError::Full { what, .. } => (Status::Io, format!("no free {what} slot")),
    }
}

/// Open and read one ledger file.
pub fn read_path(path: &Path) -> GpuEntry {
    match Ledger::open_for_reading(path) {
        Ok(l) => read_ledger(&l),
        Err(e) => {
            let (st, msg) = open_error(&e);
            GpuEntry::failed(path, st, msg)
        }
    }
}

/// Read an opened ledger.
pub fn read_ledger(l: &Ledger) -> GpuEntry {
    let path = l.path();
    // A read-only handle (a tenant reading a secure-mode ledger) cannot see
    // the agent's liveness locks; there a live slot is live.
    let read_only = l.is_read_only();
    match read_file(l.file(), &|i| read_only || l.is_alive(i)) {
        Ok(gpu) => GpuEntry {
            path: path.display().to_string(),
            status: Status::Ok,
            error: None,
            gpu: Some(gpu),
        },
        Err((st, msg)) => {
            let msg = if st == Status::Corrupt {
                format!("corrupt ledger: {msg}")
            } else {
                msg
            };
            GpuEntry::failed(path, st, msg)
        }
    }
}

/// Sort entries: readable ones by GPU index, then the rest by path.
pub fn sort_entries(v: &mut [GpuEntry]) {
    v.sort_by(|a, b| {
        let ka = (
            a.gpu.is_none(),
            a.gpu.as_ref().map(|g| g.index).unwrap_or(0),
            &a.path,
        );
        let kb = (
            b.gpu.is_none(),
            b.gpu.as_ref().map(|g| g.index).unwrap_or(0),
            &b.path,
        );
        ka.cmp(&kb)
    });
}

/// Read every ledger in `dir`.
pub fn sample_dir(dir: &Path) -> Sample {
    let at = Instant::now();
    let mut gpus: Vec<GpuEntry> = Ledger::list(dir).iter().map(|p| read_path(p)).collect();
    sort_entries(&mut gpus);
    let mut report = Report {
        schema_version: SCHEMA_VERSION,
        cgpu_version: CGPU_VERSION.into(),
        ledger_format: cgpu_ledger::FORMAT_VERSION,
        ledger_dir: dir.display().to_string(),
        timestamp_ns: cgpu_ledger::clock::realtime_ns(),
        util_window_ms: None,
        gpus,
        agent: None,
        mode: mode_of(dir),
    };
    report.agent = agent::find(dir, &report);
    Sample { report, at }
}

/// Fill `cur`'s `util_percent` from the GPU time charged since `prev`.
/// Containers are matched by GPU uuid, slot, id and creation time. Under
/// policy 5 (native) nobody is charged: the utilisation is then what NVML
/// reports for the container's processes since `prev` (`null` without
/// NVML).
pub fn apply_util(prev: &Sample, cur: &mut Sample) {
    apply_ledger_util(prev, cur);
    let native = cur.report.gpus_ok().any(|g| g.policy == NATIVE_POLICY);
    if native {
        apply_native_util(prev, cur, nvml::get());
    }
}

/// Policy 5: no compute control, no charges.
const NATIVE_POLICY: u32 = 5;

/// `util_percent` of the containers of GPUs under policy 5 from NVML's
/// per-process utilisation since `prev` (`null` without NVML).
pub fn apply_native_util(prev: &Sample, cur: &mut Sample, nvml: Option<&nvml::Nvml>) {
    let since_us = prev.report.timestamp_ns / 1000;
    let mut ids: HashMap<u32, Option<(i32, u64)>> = HashMap::new();
    for g in cur.report.gpus.iter_mut().filter_map(|e| e.gpu.as_mut()) {
        if g.policy != NATIVE_POLICY {
            continue;
        }
        let per = nvml.and_then(|n| nvml::process_util(n, &g.uuid, since_us));
        // NVML's host pids as the ledger names them (pid in own namespace).
        let by_ns: HashMap<(i32, u64), f64> = per
            .iter()
            .flatten()
            .filter_map(|(&host, &u)| {
                let id = *ids
                    .entry(host)
                    .or_insert_with(|| cgpu_ledger::identity::ns_pid(host));
                id.map(|i| (i, u))
            })
            .collect();
        for c in &mut g.containers {
            c.util_percent = per.as_ref().map(|_| {
                let sum: f64 = c
                    .processes
                    .iter()
                    .filter_map(|p| by_ns.get(&(p.pid, p.pidns)))
                    .sum();
                (sum.clamp(0.0, 100.0) * 10.0).round() / 10.0
            });
        }
    }
}

fn apply_ledger_util(prev: &Sample, cur: &mut Sample) {
    let window = cur.at.saturating_duration_since(prev.at);
    let window_ns = window.as_nanos() as f64;
    if window_ns <= 0.0 {
        return;
    }
    cur.report.util_window_ms = Some(window.as_millis() as u64);
    for g in cur.report.gpus.iter_mut().filter_map(|e| e.gpu.as_mut()) {
        let pg = prev.report.gpus_ok().find(|p| p.uuid == g.uuid);
        for c in &mut g.containers {
            let pc = pg.and_then(|pg| {
                pg.containers
                    .iter()
                    .find(|p| p.slot == c.slot && p.id == c.id && p.created_ns == c.created_ns)
            });
            c.util_percent = pc.map(|pc| {
                let d = c.gpu_time_ns.saturating_sub(pc.gpu_time_ns) as f64;
                let pct = (d / window_ns * 100.0).clamp(0.0, 100.0);
                (pct * 10.0).round() / 10.0
            });
        }
    }
}

/// The ledger directory for the tools: `--dir`, else `CGPU_LEDGER_DIR`,
/// else the jobs' one default, `/run/cgpu` (every job of every uid uses
/// the same directory; one that cannot be used is an error for the jobs,
/// never a fallback elsewhere). Creates nothing.
///
/// A directory named by the operator (`--dir` or `CGPU_LEDGER_DIR`) must
/// exist and be readable: a typo is an error naming it, not an empty
/// listing. The default may be absent (no job has run on this host).
pub fn ledger_dir(arg: Option<&str>) -> Result<PathBuf, String> {
    let named = match arg {
        Some(d) => Some((PathBuf::from(d), "--dir")),
        None => std::env::var_os("CGPU_LEDGER_DIR")
            .filter(|d| !d.is_empty())
            .map(|d| (PathBuf::from(d), "CGPU_LEDGER_DIR")),
    };
    if let Some((d, from)) = named {
        return match std::fs::read_dir(&d) {
            Ok(_) => Ok(d),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(format!(
                "ledger directory {} (from {from}) does not exist",
                d.display()
            )),
            Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => Err(format!(
                "ledger directory {} (from {from}) is not a directory",
                d.display()
            )),
            Err(e) => Err(format!(
                "ledger directory {} (from {from}) cannot be read: {e}",
                d.display()
            )),
        };
    }
    Ok(PathBuf::from(cgpu_ledger::DEFAULT_DIR))
}

/// Bytes to whole MiB (floor).
pub fn mib(bytes: u64) -> u64 {
    bytes / MIB
}

#[cfg(test)]
pub(crate) mod testutil {
    use super::*;
    use std::sync::atomic::Ordering::Relaxed;

    /// A zeroed, ready ledger image in memory (no file), for rendering tests.
    pub fn fake_file(index: u32, uuid: &str, physical: u64) -> Box<LedgerFile> {
        // SAFETY: LedgerFile is repr(C) plain integers, atomics and arrays of
        // them; all-zero bytes are a valid value of each.
        let mut f: Box<LedgerFile> = unsafe { Box::new_zeroed().assume_init() };
        f.header.magic = cgpu_ledger::LEDGER_MAGIC;
        f.header.version = cgpu_ledger::FORMAT_VERSION;
        f.header.gpu_index = index;
        f.header.set_uuid(uuid);
        f.header.physical_total = physical;
        f.header.ready.store(1, Relaxed);
        f.header.max_inst.store(16, Relaxed);
        f.header.prio_ratio.store(80, Relaxed);
        f.header.policy.store(1, Relaxed);
        f
    }

    /// Put a live container into slot `c`.
    pub fn add_container(f: &mut LedgerFile, c: usize, id: &str, quota: u64, used: u64, w: u32) {
        let s = &mut f.containers[c];
        s.state.store(SLOT_LIVE, Relaxed);
        s.set_id(id);
        s.quota.store(quota, Relaxed);
        s.used.store(used, Relaxed);
        s.weight.store(w, Relaxed);
        s.created_ns.store(1000 + c as u64, Relaxed);
    }

    /// Put a live process into slot `p`.
    pub fn add_process(f: &mut LedgerFile, p: usize, c: usize, pid: i32, used: u64) {
        let s = &mut f.processes[p];
        s.state.store(SLOT_LIVE, Relaxed);
        s.container.store(c as u32, Relaxed);
        s.pid.store(pid, Relaxed);
        s.used.store(used, Relaxed);
        f.containers[c].nprocs.fetch_add(1, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::testutil::*;
    use super::*;
    use std::sync::atomic::Ordering::Relaxed;

    #[test]
    fn reads_containers_and_processes() {
        let mut f = fake_file(0, "GPU-aaaa", 16 * GIB);
        add_container(&mut f, 0, "7db8fff70a0d", 6 * GIB, 200 * MIB, 1);
        add_container(&mut f, 3, "91b1e19795ee", 0, 100 * MIB, 2);
        add_process(&mut f, 5, 0, 4242, 200 * MIB);
        add_process(&mut f, 9, 3, 77, 100 * MIB);
        let g = read_file(&f, &|i| i == 5).unwrap();
        assert_eq!(g.containers.len(), 2);
        let a = &g.containers[0];
        assert_eq!(a.id, "7db8fff70a0d");
        assert_eq!(a.total_bytes, 6 * GIB);
        assert_eq!(a.free_bytes, 6 * GIB - 200 * MIB);
        assert_eq!(a.processes.len(), 1);
        assert_eq!(a.processes[0].pid, 4242);
        assert!(a.processes[0].alive);
        let b = &g.containers[1];
        assert_eq!(b.slot, 3);
        assert_eq!(b.total_bytes, 16 * GIB, "unlimited: total is the GPU's");
        assert!(!b.processes[0].alive);
    }

    #[test]
    fn bad_values_are_not_trusted() {
        let f = fake_file(0, "GPU-aaaa", 16 * GIB);
        f.header.policy.store(9, Relaxed);
        let e = read_file(&f, &|_| true).unwrap_err();
        assert_eq!(e.0, Status::Corrupt);
        assert!(e.1.contains("policy 9"), "{}", e.1);

        let mut f = fake_file(0, "GPU-aaaa", 16 * GIB);
        add_container(&mut f, 0, "c", GIB, 0, 1);
        f.containers[0].id[0].store(0xff, Relaxed);
        let e = read_file(&f, &|_| true).unwrap_err();
        assert_eq!(e.0, Status::Corrupt);

        let mut f = fake_file(0, "GPU-aaaa", 16 * GIB);
        add_container(&mut f, 0, "c", GIB, 0, 1);
        add_process(&mut f, 0, 0, 1, 0);
        f.processes[0].container.store(999, Relaxed);
        let e = read_file(&f, &|_| true).unwrap_err();
        assert!(e.1.contains("out of range"), "{}", e.1);

        let f = fake_file(0, "GPU-aaaa", 16 * GIB);
        f.header.ready.store(0, Relaxed);
        let e = read_file(&f, &|_| true).unwrap_err();
        assert_eq!(e.0, Status::NotReady);
    }

    #[test]
    fn json_round_trips() {
        let mut f = fake_file(1, "GPU-bbbb", 16 * GIB);
        add_container(&mut f, 0, "abc", GIB, 0, 1);
        let g = read_file(&f, &|_| true).unwrap();
        let r = Report {
            schema_version: SCHEMA_VERSION,
            cgpu_version: CGPU_VERSION.into(),
            ledger_format: cgpu_ledger::FORMAT_VERSION,
            ledger_dir: "/x".into(),
            timestamp_ns: 1,
            util_window_ms: Some(1000),
            agent: None,
            mode: cooperative(),
            gpus: vec![
                GpuEntry {
                    path: "/x/GPU-bbbb.ledger".into(),
                    status: Status::Ok,
                    error: None,
                    gpu: Some(g),
                },
                GpuEntry::failed(Path::new("/x/bad.ledger"), Status::Corrupt, "bad".into()),
            ],
        };
        let s = serde_json::to_string(&r).unwrap();
        let back: Report = serde_json::from_str(&s).unwrap();
        assert_eq!(back, r);
        let v: serde_json::Value = serde_json::from_str(&s).unwrap();
        assert_eq!(v["gpus"][1]["status"], "corrupt");
        assert_eq!(v["gpus"][0]["gpu"]["containers"][0]["id"], "abc");
    }
}
