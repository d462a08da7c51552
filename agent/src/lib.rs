//! `cgpu-agent`: the node agent. On the host, beside the jobs, it reads
//! what each process really holds on each GPU (NVML, the device's own
//! books), maps each process to its container (the same identity the
//! library gives it, worked out from `/proc/<pid>` on the host), sums per
//! container per GPU and compares with that container's quota in the GPU's
//! ledger. A container holding more than its quota by a path the library
//! cannot see (a process without the preload, a static binary) is reported
//! and, by policy, its offending processes are stopped or killed.

/// What the GPU itself says each process holds (NVML).
pub use cgpu_nvml as nvml;
pub mod sched;
pub mod secure;
pub mod unseen;

use cgpu_ledger::identity::{self, Identity, Source};
use cgpu_ledger::{Ledger, Snapshot};
use nvml::{DeviceProcess, Nvml};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// What the agent does to a container over its quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Log and write the status file only.
    Report,
    /// `SIGSTOP` its offending processes (they keep what they hold; an
    /// operator resumes them with `SIGCONT` or ends them).
    Stop,
    /// `SIGKILL` its offending processes (the device frees what they held).
    Kill,
}

impl Policy {
    pub fn parse(s: &str) -> Option<Policy> {
        match s {
            "report" => Some(Policy::Report),
            "stop" => Some(Policy::Stop),
            "kill" => Some(Policy::Kill),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Policy::Report => "report",
            Policy::Stop => "stop",
            Policy::Kill => "kill",
        }
    }
}

/// How the agent runs.
#[derive(Debug, Clone)]
pub struct Options {
    pub ledger_dir: PathBuf,
    pub policy: Policy,
    /// Also judge processes outside any container (the host's), by the
    /// host rule: `CGPU_CONTAINER_ID` in their environment, else the
    /// hostname.
    pub include_host: bool,
}

/// One process on one GPU, as the agent sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcUse {
    pub pid: u32,
    pub bytes: u64,
    /// The process is in the ledger (it runs under the library).
    pub registered: bool,
    /// Already stopped (`T` in `/proc/<pid>/stat`).
    pub stopped: bool,
    /// Start time (clock ticks after boot, `/proc/<pid>/stat`): checked
    /// again before a signal, so a reused pid is never signalled.
    pub start_time: u64,
    /// What the ledger charges this process (its own process slots).
    pub ledger_bytes: u64,
    /// What the device shows it holding beyond that (contexts, modules,
    /// memory taken around the library): charged to its container's row
    /// in secure mode.
    pub unseen: u64,
    /// Device time its kernels ran since the agent first saw it (NVML's
    /// per-process utilization, integrated over the passes); `None` when
    /// NVML does not give it.
    pub gpu_time_ns: Option<u64>,
    /// What the agent did to it in this pass.
    pub action: Option<&'static str>,
}

/// One container on one GPU.
#[derive(Debug, Clone)]
pub struct ContainerUse {
    pub identity: Identity,
    /// Its ledger row, when it has one on this GPU.
    pub slot: Option<usize>,
    /// Bytes; 0: no quota (not limited, or no row).
    pub quota: u64,
    /// What the ledger counts for it.
    pub ledger_used: u64,
    /// Its row records without enforcing (the library's record mode): the
    /// quota is not a limit.
    pub enforce_off: bool,
    /// What the device says its processes hold.
    pub device_bytes: u64,
    /// What its processes hold on the device beyond what the ledger
    /// charges them (the sum of [`ProcUse::unseen`]).
    pub unseen_bytes: u64,
    /// Of that, what the agent charges to its row now (secure mode; 0
    /// otherwise, or without a row the agent may charge).
    pub charged: u64,
    /// Device time of its processes since the agent started (those that
    /// ended included), as [`ProcUse::gpu_time_ns`].
    pub gpu_time_ns: Option<u64>,
    pub procs: Vec<ProcUse>,
}

impl ContainerUse {
    /// Over its quota: by the device's numbers, or (secure mode) by its
    /// books once what the library cannot see is charged to them. Either
    /// way its offending processes are judged by [`offenders`].
    pub fn is_over(&self) -> bool {
        self.is_over_on_device() || self.is_over_in_books()
    }
    /// What the device says its processes hold exceeds its quota.
    pub fn is_over_on_device(&self) -> bool {
        self.quota > 0 && !self.enforce_off && self.device_bytes > self.quota
    }
    /// Its row counts more than its quota once what the library cannot
    /// see is charged (secure mode): its allocations are refused until it
    /// holds less.
    pub fn is_over_in_books(&self) -> bool {
        self.charged > 0 && self.quota > 0 && !self.enforce_off && self.ledger_used > self.quota
    }
}

/// One GPU (one ledger file).
#[derive(Debug, Clone, Default)]
pub struct GpuUse {
    pub uuid: String,
    pub ledger: PathBuf,
    pub containers: Vec<ContainerUse>,
    /// Processes outside any container (not judged without
    /// `--include-host`), and processes gone before they could be read.
    pub outside: Vec<ProcUse>,
    /// Why this GPU could not be checked.
    pub error: Option<String>,
}

/// One pass over every GPU that has a ledger.
#[derive(Debug, Clone, Default)]
pub struct Pass {
    pub gpus: Vec<GpuUse>,
    /// Lines to log: one per event (a container found over its quota, or
    /// back within it, and each signal sent).
    pub events: Vec<String>,
}

impl Pass {
    pub fn any_over(&self) -> bool {
        self.gpus
            .iter()
            .any(|g| g.containers.iter().any(ContainerUse::is_over))
    }
    pub fn any_error(&self) -> bool {
        self.gpus.iter().any(|g| g.error.is_some())
    }
}

/// `(state, start time)` from `/proc/<pid>/stat`.
pub(crate) fn proc_stat(pid: u32) -> Option<(char, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command may hold spaces and parentheses: fields follow the last ')'.
    let rest = &s[s.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest[0] is field 3 (state); start time is field 22.
    let state = f.first()?.chars().next()?;
    let start = f.get(19)?.parse().ok()?;
    Some((state, start))
}

/// `CGPU_CONTAINER_ID` in a host process's environment (the host rule of
/// the library: how jobs of a host without containers are told apart).
/// Read only for processes whose identity is the host's, and only with
/// `--include-host`: in a container the identity comes from what the
/// kernel shows of it, never from a variable.
fn host_rule_name(pid: u32) -> Option<String> {
    let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    env.split(|&b| b == 0).find_map(|kv| {
        let v = kv.strip_prefix(b"CGPU_CONTAINER_ID=")?;
        let v = String::from_utf8_lossy(v);
        cgpu_ledger::settings::parse_container_id(&v).ok()
    })
}

/// The identity of a host pid: `None` for a process outside any container
/// when the host is not judged (or a process gone meanwhile). `secure`:
/// named as the secure server names its callers (the host's view of the
/// cgroup wins, see `secure::pinned_to_cgroup`), so that a process's
/// device charge goes to the row its requests use.
fn identity_of(pid: u32, include_host: bool, secure: bool) -> Option<Identity> {
    let facts = identity::ProcessFacts::read(pid)?;
    let mut id = facts.resolve(None);
    if secure {
        id = secure::pinned_to_cgroup(
            id,
            identity::read_proc(&format!("/proc/{pid}/cgroup")).as_deref(),
        );
    }
    if id.source != Source::Host {
        return Some(id);
    }
    if !include_host {
        return None;
    }
    let name = host_rule_name(pid);
    Some(facts.resolve(name.as_deref()))
}

/// Checks one GPU: the device's processes against the ledger `l`.
pub fn check_gpu(l: &Ledger, device: &[DeviceProcess], include_host: bool, secure: bool) -> GpuUse {
    let snap: Snapshot = l.snapshot();
    // Live processes of the ledger, by (pid in their namespace, namespace):
    // their container's slot.
    let registered: HashMap<(i32, u64), usize> = snap
        .processes
        .iter()
        .filter(|p| p.alive)
        .map(|p| ((p.pid, p.pidns), p.container))
        .collect();
    // What the ledger charges each live process, by its host pid when the
    // slot names one (secure mode stamps it), else by (pid, namespace).
    let mut by_host: HashMap<u32, u64> = HashMap::new();
    let mut by_ns: HashMap<(i32, u64), u64> = HashMap::new();
    let slots = &l.file().processes;
    for p in snap.processes.iter().filter(|p| p.alive) {
        match slots.get(p.slot).and_then(|s| s.host_pid()) {
            Some(h) => *by_host.entry(h).or_default() += p.used,
            None => *by_ns.entry((p.pid, p.pidns)).or_default() += p.used,
        }
    }
    let mut by_key: BTreeMap<u64, ContainerUse> = BTreeMap::new();
    let mut outside = Vec::new();
    for d in device {
        let Some((state, start_time)) = proc_stat(d.pid) else {
            continue; // gone
        };
        if state == 'Z' || state == 'X' {
            continue; // exited: what it held is being freed, nothing to signal
        }
        let mut p = ProcUse {
            pid: d.pid,
            bytes: d.bytes.unwrap_or(0),
            registered: false,
            stopped: state == 'T',
            start_time,
            ledger_bytes: 0,
            unseen: 0,
            gpu_time_ns: None,
            action: None,
        };
        let ns = identity::ns_pid(d.pid);
        let in_ledger = ns.and_then(|k| registered.get(&k).copied());
        p.registered = in_ledger.is_some();
        p.ledger_bytes = by_host.get(&d.pid).copied().unwrap_or(0)
            + ns.and_then(|k| by_ns.get(&k).copied()).unwrap_or(0);
        p.unseen = p.bytes.saturating_sub(p.ledger_bytes);
        let Some(id) = identity_of(d.pid, include_host, secure) else {
            outside.push(p);
            continue;
        };
        let c = by_key.entry(id.key).or_insert_with(|| ContainerUse {
            slot: l.find_container_keyed(id.key, &id.name),
            quota: 0,
            ledger_used: 0,
            enforce_off: false,
            device_bytes: 0,
            unseen_bytes: 0,
            charged: 0,
            gpu_time_ns: None,
            procs: Vec::new(),
            identity: id.clone(),
        });
        // A process under the library names its container's row itself.
        c.slot = c.slot.or(in_ledger);
        c.device_bytes += p.bytes;
        c.unseen_bytes += p.unseen;
        c.procs.push(p);
    }
    for c in by_key.values_mut() {
        if let Some(row) = c
            .slot
            .and_then(|s| snap.containers.iter().find(|r| r.slot == s))
        {
            c.quota = row.quota;
            c.ledger_used = row.used;
            c.enforce_off = row.enforce_off;
        }
    }
    GpuUse {
        uuid: snap.uuid.clone(),
        ledger: l.path().to_owned(),
        containers: by_key.into_values().collect(),
        outside,
        error: None,
    }
}

/// The processes to signal in a container over its quota: those not in
/// the ledger (they hold memory around the library), biggest first, until
/// what is left (not counting processes already stopped, under `stop`)
/// fits the quota. What is left is judged as the container was found
/// over: by the device's numbers, and in secure mode also by its books
/// (the library's grants and what the agent charged), from which a
/// process's end takes what it holds beyond its own grants. The library's
/// own processes are never signalled: it holds them to the quota itself,
/// and a quota lowered below what they hold refuses their next
/// allocations, it never takes memory from under a job (nor lets whoever
/// lowered it have them killed). Pure: indexes into `c.procs`.
pub fn offenders(c: &ContainerUse, policy: Policy) -> Vec<usize> {
    if !c.is_over() || policy == Policy::Report {
        return Vec::new();
    }
    let mut order: Vec<usize> = (0..c.procs.len()).collect();
    order.sort_by_key(|&i| {
        let p = &c.procs[i];
        (p.registered, std::cmp::Reverse(p.bytes), p.pid)
    });
    // What the device holds, and what the books count (only where the
    // agent keeps them, 0 otherwise: never over).
    let mut device_left = c.device_bytes;
    let mut books_left = if c.charged > 0 { c.ledger_used } else { 0 };
    let in_books = |p: &ProcUse| p.unseen + p.ledger_bytes;
    if policy == Policy::Stop {
        for p in c.procs.iter().filter(|p| p.stopped) {
            device_left = device_left.saturating_sub(p.bytes);
            books_left = books_left.saturating_sub(in_books(p));
        }
    }
    let mut out = Vec::new();
    for i in order {
        if device_left <= c.quota && books_left <= c.quota {
            break;
        }
        let p = &c.procs[i];
        if p.registered {
            break; // the rest run under the library
        }
        if policy == Policy::Stop && p.stopped {
            continue;
        }
        out.push(i);
        device_left = device_left.saturating_sub(p.bytes);
        books_left = books_left.saturating_sub(in_books(p));
    }
    out
}

/// Sends `sig` to `p` if it is still the process that was read (same
/// start time).
fn signal(p: &ProcUse, sig: i32) -> Result<(), String> {
    match proc_stat(p.pid) {
        Some((_, start)) if start == p.start_time => {}
        _ => return Err("gone before the signal".into()),
    }
    // SAFETY: kill(2) with a pid and a signal number; no memory is shared.
    if unsafe { libc::kill(p.pid as libc::pid_t, sig) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error().to_string())
    }
}

fn describe(c: &ContainerUse) -> String {
    let procs: Vec<String> = c
        .procs
        .iter()
        .map(|p| {
            format!(
                "{}:{}{}",
                p.pid,
                p.bytes,
                if p.registered { "" } else { "(unregistered)" }
            )
        })
        .collect();
    // Secure mode: the books, with what the agent charged beyond the
    // library's grants, are judged too.
    let books = if c.charged > 0 {
        format!(
            ", books {} bytes ({}, {} of it charged by the agent)",
            c.ledger_used,
            cgpu_ledger::human_bytes(c.ledger_used),
            cgpu_ledger::human_bytes(c.charged)
        )
    } else {
        String::new()
    };
    format!(
        "container {} (key {:016x}) device {} bytes ({}){books}, quota {} bytes ({}), pids {}",
        c.identity.name,
        c.identity.key,
        c.device_bytes,
        cgpu_ledger::human_bytes(c.device_bytes),
        c.quota,
        cgpu_ledger::human_bytes(c.quota),
        procs.join(" ")
    )
}

/// The agent between passes: NVML, and which containers were over quota
/// at the last pass (so that each event is logged once).
pub struct Agent {
    pub opts: Options,
    nvml: Nvml,
    over: HashMap<(String, u64), Vec<u32>>,
    /// Why each ledger's GPU could not be checked at the last pass.
    errors: HashMap<PathBuf, String>,
    /// Secure mode: the device charges the agent keeps in the books.
    books: Option<unseen::Books>,
    /// Containers charged for bytes the library cannot see at the last
    /// pass (so that each start and end is logged once).
    charged: HashMap<(String, u64), u64>,
    /// Device time per GPU (by UUID).
    clocks: HashMap<String, DeviceClock>,
}

/// Device time on one GPU, integrated from NVML's per-process
/// utilization samples: each sample's percent times the time since the
/// previous sample of that process (or since the previous query, for a
/// process seen for the first time).
#[derive(Default)]
struct DeviceClock {
    /// The newest sample's end (or the query's time when there was none),
    /// µs since the epoch; 0 before the first query.
    last_us: u64,
    /// Per host pid: (its newest sample's end, its device time).
    per_pid: HashMap<u32, (u64, u64)>,
    /// Per container key: its device time.
    per_key: HashMap<u64, u64>,
    /// Why the last query failed (logged when it changes).
    error: Option<String>,
}

impl DeviceClock {
    /// Adds `samples` to the processes and containers of `g`, and writes
    /// their device times into it.
    fn add(&mut self, samples: &mut [nvml::Utilization], g: &mut GpuUse, now_us: u64) {
        let mut key_of: HashMap<u32, u64> = HashMap::new();
        for c in &g.containers {
            for p in &c.procs {
                key_of.insert(p.pid, c.identity.key);
            }
        }
        samples.sort_by_key(|s| s.time_us);
        let mut fed = Vec::new();
        let first = self.last_us == 0;
        let mut newest = self.last_us;
        for s in samples.iter() {
            let since = self.per_pid.get(&s.pid).map_or(self.last_us, |e| e.0);
            newest = newest.max(s.time_us);
            let e = self.per_pid.entry(s.pid).or_default();
            if first || s.time_us <= since {
                e.0 = e.0.max(s.time_us);
                continue; // no earlier sample to measure the period from
            }
            let ns = (s.time_us - since) * 1000 * u64::from(s.sm_percent) / 100;
            *e = (s.time_us, e.1 + ns);
            if let Some(k) = key_of.get(&s.pid) {
                *self.per_key.entry(*k).or_default() += ns;
                fed.push((*k, since, s.time_us, ns));
            }
        }
        self.last_us = if samples.is_empty() { now_us } else { newest };
        // Secure mode's scheduler charges what ran outside the containers'
        // slices (nothing where it does not schedule).
        crate::sched::device_times(&g.uuid, &fed);
        // Processes no longer on the device: their time stays with their
        // containers.
        let on: std::collections::HashSet<u32> = g
            .containers
            .iter()
            .flat_map(|c| c.procs.iter().map(|p| p.pid))
            .chain(g.outside.iter().map(|p| p.pid))
            .collect();
        self.per_pid.retain(|pid, _| on.contains(pid));
        for c in &mut g.containers {
            c.gpu_time_ns = Some(self.per_key.get(&c.identity.key).copied().unwrap_or(0));
            for p in &mut c.procs {
                p.gpu_time_ns = Some(self.per_pid.get(&p.pid).map_or(0, |e| e.1));
            }
        }
    }
}

impl Agent {
    pub fn new(opts: Options) -> Result<Agent, String> {
        Ok(Agent {
            nvml: Nvml::open()?,
            opts,
            over: HashMap::new(),
            errors: HashMap::new(),
            books: None,
            charged: HashMap::new(),
            clocks: HashMap::new(),
        })
    }

    /// Secure mode: from now on each pass also charges, to each
    /// container's row, what its processes hold on the device beyond what
    /// the ledger charges them (rows missing are made from the host's
    /// settings in `settings_dir`). See [`unseen`].
    pub fn charge_unseen(&mut self, settings_dir: PathBuf) {
        self.books = Some(unseen::Books::new(settings_dir));
    }

    /// One pass: reads every GPU with a ledger, acts by policy, returns
    /// what it saw and the events to log.
    pub fn pass(&mut self) -> Pass {
        let mut pass = Pass::default();
        let mut now_over = HashMap::new();
        let mut now_charged = HashMap::new();
        let secure = self.books.is_some();
        for path in Ledger::list(&self.opts.ledger_dir) {
            let opened;
            let l = match &mut self.books {
                Some(b) => b.ledger(&path).map_err(|e| e.to_string()),
                None => {
                    opened = Ledger::open(&path).map_err(|e| e.to_string());
                    opened.as_ref().map_err(Clone::clone)
                }
            };
            let l = match l {
                Ok(l) => l,
                Err(e) => {
                    pass.gpus.push(GpuUse {
                        ledger: path.clone(),
                        error: Some(format!("cannot read the ledger: {e}")),
                        ..GpuUse::default()
                    });
                    continue;
                }
            };
            let uuid = l.uuid();
            let device = match self.nvml.processes(&uuid) {
                Ok(d) => d,
                Err(e) => {
                    pass.gpus.push(GpuUse {
                        uuid,
                        ledger: path.clone(),
                        error: Some(e),
                        ..GpuUse::default()
                    });
                    continue;
                }
            };
            let mut g = check_gpu(l, &device, self.opts.include_host, secure);
            if let Some(b) = &mut self.books {
                b.settle(&mut g);
            }
            let clock = self.clocks.entry(g.uuid.clone()).or_default();
            match self.nvml.utilization(&g.uuid, clock.last_us) {
                Ok(Some(mut samples)) => {
                    let now_us = cgpu_ledger::clock::realtime_ns() / 1000;
                    clock.add(&mut samples, &mut g, now_us);
                    clock.error = None;
                }
                Ok(None) => {}
                Err(e) => {
                    if clock.error.as_ref() != Some(&e) {
                        pass.events.push(format!(
                            "cgpu-agent: GPU {}: no per-process device time: {e}",
                            g.uuid
                        ));
                    }
                    clock.error = Some(e);
                }
            }
            for c in g.containers.iter().filter(|c| c.charged > 0) {
                let k = (g.uuid.clone(), c.identity.key);
                if !self.charged.contains_key(&k) {
                    pass.events.push(format!(
                        "cgpu-agent: charged {} bytes ({}) the library cannot see on GPU {} to container {} (key {:016x}): now {} of quota {}",
                        c.charged,
                        cgpu_ledger::human_bytes(c.charged),
                        g.uuid,
                        c.identity.name,
                        c.identity.key,
                        cgpu_ledger::human_bytes(c.ledger_used),
                        cgpu_ledger::human_bytes(c.quota),
                    ));
                }
                now_charged.insert(k, c.charged);
            }
            for c in &mut g.containers {
                if !c.is_over() {
                    continue;
                }
                let k = (g.uuid.clone(), c.identity.key);
                let mut pids: Vec<u32> = c.procs.iter().map(|p| p.pid).collect();
                pids.sort_unstable();
                if self.over.get(&k) != Some(&pids) {
                    pass.events.push(format!(
                        "cgpu-agent: over quota on GPU {}: {}",
                        g.uuid,
                        describe(c)
                    ));
                }
                let sig = match self.opts.policy {
                    Policy::Report => None,
                    Policy::Stop => Some((libc::SIGSTOP, "stopped")),
                    Policy::Kill => Some((libc::SIGKILL, "killed")),
                };
                if let Some((sig, what)) = sig {
                    for i in offenders(c, self.opts.policy) {
                        let p = &mut c.procs[i];
                        match signal(p, sig) {
                            Ok(()) => {
                                p.action = Some(what);
                                pass.events.push(format!(
                                    "cgpu-agent: {what} pid {} ({} bytes on GPU {}, {}) of container {} over its quota",
                                    p.pid,
                                    p.bytes,
                                    g.uuid,
                                    if p.registered { "under the library" } else { "not in the ledger" },
                                    c.identity.name
                                ));
                            }
                            Err(e) => pass.events.push(format!(
                                "cgpu-agent: could not signal pid {} of container {}: {e}",
                                p.pid, c.identity.name
                            )),
                        }
                    }
                }
                now_over.insert(k, pids);
            }
            pass.gpus.push(g);
        }
        for ((uuid, key), _) in self.over.iter() {
            if !now_over.contains_key(&(uuid.clone(), *key)) {
                pass.events.push(format!(
                    "cgpu-agent: container key {key:016x} on GPU {uuid} is within its quota again (or gone)"
                ));
            }
        }
        self.over = now_over;
        for (uuid, key) in self.charged.keys() {
            if !now_charged.contains_key(&(uuid.clone(), *key)) {
                pass.events.push(format!(
                    "cgpu-agent: container key {key:016x} on GPU {uuid}: nothing the library cannot see is charged any more"
                ));
            }
        }
        self.charged = now_charged;
        let mut errors = HashMap::new();
        for g in &pass.gpus {
            if let Some(e) = &g.error {
                if self.errors.get(&g.ledger) != Some(e) {
                    pass.events.push(format!(
                        "cgpu-agent: GPU {} ({}) not checked: {e}",
                        g.uuid,
                        g.ledger.display()
                    ));
                }
                errors.insert(g.ledger.clone(), e.clone());
            }
        }
        self.errors = errors;
        pass
    }
}

fn proc_json(p: &ProcUse) -> Value {
    json!({
        "pid": p.pid,
        "bytes": p.bytes,
        "registered": p.registered,
        "ledger_bytes": p.ledger_bytes,
        "unseen_bytes": p.unseen,
        "device_time_ns": p.gpu_time_ns,
        "stopped": p.stopped || p.action == Some("stopped"),
        "action": p.action,
    })
}

fn source_name(s: Source) -> &'static str {
    match s {
        Source::Kubelet => "kubelet",
        Source::RuntimeBind => "runtime-bind",
        Source::Cgroup => "cgroup",
        Source::Overlay => "overlay",
        Source::Pod => "pod",
        Source::PidNamespace => "pid-namespace",
        Source::Host => "host",
    }
}

/// The status document (`--status-file`, and `--once`'s output).
pub fn status_json(opts: &Options, pass: &Pass, time_ns: u64) -> Value {
    let gpus: Vec<Value> = pass
        .gpus
        .iter()
        .map(|g| {
            json!({
                "uuid": g.uuid,
                "ledger": g.ledger.display().to_string(),
                "error": g.error,
                "containers": g.containers.iter().map(|c| json!({
                    "name": c.identity.name,
                    "key": format!("{:016x}", c.identity.key),
                    "source": source_name(c.identity.source),
                    "container_id": c.identity.container_id,
                    "in_ledger": c.slot.is_some(),
                    "quota": c.quota,
                    "ledger_used": c.ledger_used,
                    "enforce_off": c.enforce_off,
                    "device_bytes": c.device_bytes,
                    "unseen_bytes": c.unseen_bytes,
                    "unseen_charged": c.charged,
                    "over": c.is_over(),
                    "over_in_books": c.is_over_in_books(),
                    "device_time_ns": c.gpu_time_ns,
                    "processes": c.procs.iter().map(proc_json).collect::<Vec<_>>(),
                })).collect::<Vec<_>>(),
                "outside_containers": g.outside.iter().map(proc_json).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({
        "schema_version": 1,
        "time_ns": time_ns,
        "ledger_dir": opts.ledger_dir.display().to_string(),
        "policy": opts.policy.name(),
        "include_host": opts.include_host,
        "over": pass.gpus.iter().flat_map(|g| &g.containers).filter(|c| c.is_over()).count(),
        "gpus": gpus,
    })
}

/// Writes `text` to `path` atomically (a temporary file beside it, then
/// rename): a reader sees the old document or the new one, never half. A
/// link put at `path` is replaced, never followed.
pub fn write_atomic(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        name.as_deref().unwrap_or("agent.json"),
        std::process::id()
    ));
    // A new file only (O_EXCL: never through a link or a file someone put
    // there: the ledger directory may be writable by containers).
    let create = || {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .open(&tmp)
    };
    let mut f = match create() {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            std::fs::remove_file(&tmp)?;
            create()?
        }
        r => r?,
    };
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proc(pid: u32, gib: u64, registered: bool, stopped: bool) -> ProcUse {
        ProcUse {
            pid,
            bytes: gib << 30,
            registered,
            stopped,
            start_time: 0,
            ledger_bytes: 0,
            unseen: 0,
            gpu_time_ns: None,
            action: None,
        }
    }

    fn container(quota_gib: u64, procs: Vec<ProcUse>) -> ContainerUse {
        ContainerUse {
            identity: Identity {
                key: 1,
                name: "c".into(),
                source: Source::Host,
                container_id: None,
            },
            slot: Some(0),
            quota: quota_gib << 30,
            ledger_used: 0,
            enforce_off: false,
            device_bytes: procs.iter().map(|p| p.bytes).sum(),
            unseen_bytes: 0,
            charged: 0,
            gpu_time_ns: None,
            procs,
        }
    }

    #[test]
    fn unregistered_processes_go_first_and_only_until_the_quota_fits() {
        // 1 GiB under the library, 2 and 1 GiB outside it, quota 2 GiB.
        let c = container(
            2,
            vec![
                proc(10, 1, true, false),
                proc(11, 1, false, false),
                proc(12, 2, false, false),
            ],
        );
        assert!(c.is_over());
        // 4 GiB held: the 2 GiB bypasser goes, 2 GiB left fits.
        assert_eq!(offenders(&c, Policy::Kill), vec![2]);
        assert_eq!(offenders(&c, Policy::Report), Vec::<usize>::new());
        // Quota 1 GiB: both bypassers, the library's process stays.
        let c = container(1, c.procs.clone());
        assert_eq!(offenders(&c, Policy::Kill), vec![2, 1]);
    }

    #[test]
    fn the_librarys_processes_are_never_signalled() {
        // Over only through the library's processes (a quota lowered below
        // what they hold): nobody.
        let c = container(1, vec![proc(10, 1, true, false), proc(11, 2, true, false)]);
        assert!(c.is_over());
        assert!(offenders(&c, Policy::Kill).is_empty());
        // Killing the bypasser is not enough: still only the bypasser.
        let c = container(1, vec![proc(10, 2, true, false), proc(11, 1, false, false)]);
        assert_eq!(offenders(&c, Policy::Kill), vec![1]);
    }

    #[test]
    fn a_container_within_its_quota_or_without_one_is_never_touched() {
        let within = container(4, vec![proc(10, 1, true, false), proc(11, 3, false, false)]);
        assert!(!within.is_over());
        assert!(offenders(&within, Policy::Kill).is_empty());
        let mut recorded = container(1, vec![proc(11, 9, false, false)]);
        recorded.enforce_off = true;
        assert!(!recorded.is_over());
        assert!(offenders(&recorded, Policy::Kill).is_empty());
        let unlimited = container(0, vec![proc(11, 9, false, false)]);
        assert!(!unlimited.is_over());
        assert!(offenders(&unlimited, Policy::Kill).is_empty());
    }

    #[test]
    fn in_secure_mode_the_books_with_the_agents_charge_are_judged_too() {
        const MIB: u64 = 1 << 20;
        let with = |pid, bytes_mib: u64, ledger_mib: u64, registered, stopped| ProcUse {
            bytes: bytes_mib * MIB,
            ledger_bytes: ledger_mib * MIB,
            unseen: (bytes_mib - ledger_mib) * MIB,
            ..proc(pid, 0, registered, stopped)
        };
        // Quota 2048 MiB. Under the library: a process granted 256 MiB
        // holding 556 on the device (its context), and another granted
        // 1024 MiB not on the device yet. Around it: 364 and 556 MiB.
        let mut c = container(
            2,
            vec![
                with(10, 556, 256, true, false),
                with(11, 364, 0, false, false),
                with(12, 556, 0, false, false),
            ],
        );
        c.charged = c.procs.iter().map(|p| p.unseen).sum();
        c.ledger_used = (256 + 1024) * MIB + c.charged;
        assert_eq!(c.device_bytes, 1476 * MIB);
        assert!(!c.is_over_on_device());
        assert!(c.is_over_in_books() && c.is_over());
        // 2500 MiB in the books: the 556 MiB process takes them to 1944.
        assert_eq!(offenders(&c, Policy::Kill), vec![2]);
        assert_eq!(offenders(&c, Policy::Stop), vec![2]);
        assert!(offenders(&c, Policy::Report).is_empty());
        // Stopped, it counts as dealt with; killing takes it only.
        c.procs[2].stopped = true;
        assert!(offenders(&c, Policy::Stop).is_empty());
        assert_eq!(offenders(&c, Policy::Kill), vec![2]);
        // The library's grants alone over the quota (it was lowered): the
        // processes around it go, the library's stay.
        c.procs[2].stopped = false;
        c.ledger_used += 1024 * MIB;
        assert_eq!(offenders(&c, Policy::Kill), vec![2, 1]);
        // Without the agent's charge (the cooperative mode) the books are
        // not judged.
        c.charged = 0;
        assert!(!c.is_over());
        assert!(offenders(&c, Policy::Kill).is_empty());
    }

    #[test]
    fn under_stop_processes_already_stopped_count_as_dealt_with() {
        let c = container(1, vec![proc(10, 1, true, false), proc(11, 2, false, true)]);
        assert!(offenders(&c, Policy::Stop).is_empty());
        // Under kill, a stopped process still holds its memory: it goes.
        assert_eq!(offenders(&c, Policy::Kill), vec![1]);
    }

    #[test]
    fn the_status_file_is_replaced_never_written_through_a_link() {
        let dir = std::env::temp_dir().join(format!("cgpu-agent-ut-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let victim = dir.join("victim");
        std::fs::write(&victim, "keep").unwrap();
        let path = dir.join("agent.json");
        let tmp = dir.join(format!(".agent.json.{}.tmp", std::process::id()));
        std::os::unix::fs::symlink(&victim, &tmp).unwrap();
        std::os::unix::fs::symlink(&victim, &path).unwrap();
        write_atomic(&path, "{}").unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "{}");
        assert!(!std::fs::symlink_metadata(&path).unwrap().is_symlink());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn device_time_is_each_samples_share_of_the_time_since_the_previous() {
        let mut g = GpuUse {
            containers: vec![container(1, vec![proc(10, 1, true, false)])],
            ..GpuUse::default()
        };
        g.containers[0].procs.push(proc(11, 1, false, false));
        let s = |pid, time_us, sm_percent| nvml::Utilization {
            pid,
            time_us,
            sm_percent,
        };
        let mut clock = DeviceClock::default();
        // The first query only sets where time starts.
        clock.add(&mut [s(10, 1_000_000, 100)], &mut g, 1_000_000);
        assert_eq!(g.containers[0].gpu_time_ns, Some(0));
        // 0.5 s at 40 % for pid 10; pid 11's first sample counts from the
        // previous query: 0.5 s at 100 %.
        clock.add(
            &mut [s(10, 1_500_000, 40), s(11, 1_500_000, 100)],
            &mut g,
            1_500_000,
        );
        let c = &g.containers[0];
        assert_eq!(c.procs[0].gpu_time_ns, Some(200_000_000));
        assert_eq!(c.procs[1].gpu_time_ns, Some(500_000_000));
        assert_eq!(c.gpu_time_ns, Some(700_000_000));
        // A sample seen again (not newer) adds nothing; a process gone
        // keeps its time in its container.
        g.containers[0].procs.truncate(1);
        clock.add(&mut [s(10, 1_500_000, 40)], &mut g, 1_600_000);
        assert_eq!(g.containers[0].gpu_time_ns, Some(700_000_000));
        assert!(!clock.per_pid.contains_key(&11));
    }

    #[test]
    fn own_stat_is_read() {
        let (state, start) = proc_stat(std::process::id()).unwrap();
        assert!(state == 'R' || state == 'S', "{state}");
        assert!(start > 0);
        assert!(identity::ns_pid(std::process::id()).is_some());
    }
}
