//! What `cgpu-agent` last saw: the device's own numbers per container, read
//! from the agent's status file: `$CGPU_AGENT_STATUS` when set, else the
//! first of `/run/cgpu-agent/agent.json` (where the shipped systemd unit
//! writes it, a directory only root can write) and `<ledger dir>/agent.json`
//! (the agent's default) that exists.
//!
//! The file lives in a directory containers may be able to write, so it is
//! read with suspicion: opened without following a link (`O_NOFOLLOW`),
//! without blocking on a FIFO (`O_NONBLOCK`), only when it is a regular file
//! owned by root or by the user running the tool, at most
//! [`MAX_STATUS_BYTES`] long, and only when it parses as the agent's
//! schema. A file that fails any of these is treated as absent, with one
//! warning (repeated only when the reason changes). No file: nothing is
//! shown and nothing is said.

use super::{Report, MIB};
use serde::{Deserialize, Serialize};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The status file's name in the ledger directory (the agent's default).
pub const STATUS_FILE: &str = "agent.json";
/// Largest status file read (an agent on a host with many GPUs and
/// containers writes a few hundred KiB at most).
pub const MAX_STATUS_BYTES: u64 = 4 << 20;
/// A status older than this is stale: the agent writes one every interval
/// (500 ms by default), so ten missed intervals mean it is not running (or
/// stuck). When the file states its interval (`interval_ms`), three
/// intervals are allowed if that is longer.
pub const STALE_AFTER_NS: u64 = 5_000_000_000;

/// The agent's document, the fields the tools use (`cgpu-agent --once`
/// prints the same document).
#[derive(Debug, Clone, Deserialize)]
struct File {
    schema_version: u32,
    time_ns: u64,
    policy: String,
    #[serde(default)]
    interval_ms: Option<u64>,
    gpus: Vec<FileGpu>,
}

#[derive(Debug, Clone, Deserialize)]
struct FileGpu {
    uuid: String,
    error: Option<String>,
    containers: Vec<FileContainer>,
}

#[derive(Debug, Clone, Deserialize)]
struct FileContainer {
    name: String,
    in_ledger: bool,
    quota: u64,
    ledger_used: u64,
    enforce_off: bool,
    device_bytes: u64,
    over: bool,
    /// Secure mode: bytes its processes hold on the device beyond what the
    /// ledger charged them, charged to its row by the agent.
    #[serde(default)]
    unseen_charged: u64,
    #[serde(default)]
    device_time_ns: Option<u64>,
    processes: Vec<FileProcess>,
}

#[derive(Debug, Clone, Deserialize)]
struct FileProcess {
    pid: u32,
    bytes: u64,
    registered: bool,
    stopped: bool,
    action: Option<String>,
}

/// One process of a container, as the device counts it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentProcess {
    /// Pid on the host.
    pub pid: u32,
    /// Device memory it holds, bytes.
    pub device_bytes: u64,
    /// It runs under the library (the ledger lists it).
    pub in_library: bool,
    /// Stopped (by the agent's `stop` policy or otherwise).
    pub stopped: bool,
    /// What the agent did to it in its last pass (`stopped`, `killed`).
    pub action: Option<String>,
}

/// One container on one GPU, as the device counts it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentContainer {
    /// GPU index (`null` when no readable ledger has the agent's GPU).
    pub gpu: Option<u32>,
    pub uuid: String,
    /// Container id, as in the ledger.
    pub id: String,
    /// It has a row in the GPU's ledger.
    pub in_ledger: bool,
    /// Device memory its processes hold, bytes.
    pub device_bytes: u64,
    /// What the ledger counted for it when the agent read it, bytes.
    pub ledger_used_bytes: u64,
    /// Its quota, bytes (0: not limited).
    pub quota_bytes: u64,
    /// Its row records without enforcing: the quota is not a limit.
    pub enforce_off: bool,
    /// It holds more than its quota: by the device's numbers, or (secure
    /// mode) by its books once the agent charged what the device shows
    /// beyond them.
    pub over: bool,
    /// Bytes its processes hold on the device that the library did not
    /// charge (contexts, modules, memory taken around it), which the agent
    /// charged to its row (secure mode; 0 otherwise).
    #[serde(default)]
    pub unseen_bytes: u64,
    /// Device time of its processes since the agent started, ns (`None`
    /// when the device does not report per-process time).
    #[serde(default)]
    pub device_time_ns: Option<u64>,
    pub processes: Vec<AgentProcess>,
}

impl AgentContainer {
    /// Its processes that do not run under the library.
    pub fn outside(&self) -> impl Iterator<Item = &AgentProcess> {
        self.processes.iter().filter(|p| !p.in_library)
    }
}

/// What the agent's status file says, in `cgpu-smi --json` (`agent`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentView {
    pub path: String,
    /// CLOCK_REALTIME ns when the agent wrote it.
    pub time_ns: u64,
    /// Its age when read, ms (0 if written after the report's timestamp).
    pub age_ms: u64,
    /// Older than a few of the agent's intervals: the agent is not running
    /// or stuck, and its numbers are not shown in the table.
    pub stale: bool,
    /// The agent's policy: `report`, `stop` or `kill`.
    pub policy: String,
    /// GPUs the agent could not check, with why.
    pub gpu_errors: Vec<String>,
    /// Every container the agent saw on a GPU.
    pub containers: Vec<AgentContainer>,
}

impl AgentView {
    /// The agent's numbers for container `id` on GPU `uuid`.
    pub fn container(&self, uuid: &str, id: &str) -> Option<&AgentContainer> {
        self.containers
            .iter()
            .find(|c| c.uuid == uuid && c.id == id)
    }

    /// Fresh containers over their quota (none when stale).
    pub fn over(&self) -> impl Iterator<Item = &AgentContainer> {
        self.containers.iter().filter(|c| c.over && !self.stale)
    }
}

/// The marker line for a container over its quota, e.g.
/// `! 0 team-1: the device holds 3460 MiB, quota 2048 MiB: 1 process outside the library (pid 1234)`.
pub fn over_line(c: &AgentContainer) -> String {
    let gpu = c.gpu.map(|i| i.to_string()).unwrap_or_else(|| "?".into());
    let outside: Vec<String> = c
        .outside()
        .map(|p| match &p.action {
            Some(a) => format!("{} {a}", p.pid),
            None if p.stopped => format!("{} stopped", p.pid),
            None => p.pid.to_string(),
        })
        .collect();
    // Over by the device's numbers, or (secure mode) only by the books,
    // which count the library's grants and what the agent charged.
    let on_device = c.device_bytes > c.quota_bytes;
    let why = match outside.len() {
        0 if on_device => {
            "all its processes run under the library (its quota was lowered below what they hold)"
                .to_owned()
        }
        0 => "all its processes run under the library (what they hold beyond their grants, or a quota lowered below them)"
            .to_owned(),
        1 => format!("1 process outside the library (pid {})", outside[0]),
        n => format!(
            "{n} processes outside the library (pids {})",
            outside.join(", ")
        ),
    };
    let held = if on_device {
        format!("the device holds {} MiB", c.device_bytes / MIB)
    } else {
        format!(
            "the books count {} MiB with {} MiB unseen by the library",
            c.ledger_used_bytes / MIB,
            c.unseen_bytes / MIB
        )
    };
    format!(
        "! {gpu} {}: {held}, quota {} MiB: {why}",
        c.id,
        c.quota_bytes / MIB
    )
}

/// Last warning given, so that a tool reading the file again and again
/// (`--loop`, the exporter) says it once.
static WARNED: Mutex<Option<String>> = Mutex::new(None);

fn warn_once(msg: String) {
    let mut w = WARNED.lock().unwrap_or_else(|e| e.into_inner());
    if w.as_deref() != Some(msg.as_str()) {
        tracing::warn!("{msg}");
        *w = Some(msg);
    }
}

/// Reads the file at `path` with the checks above: `Ok(None)` when there is
/// none, `Err(why)` when there is one that is not to be read.
fn read_bounded(path: &Path) -> Result<Option<Vec<u8>>, String> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path);
    let f = match f {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err("it is a symbolic link".into())
        }
        Err(e) => return Err(format!("cannot open it: {e}")),
    };
    let md = f.metadata().map_err(|e| format!("cannot stat it: {e}"))?;
    if !md.file_type().is_file() {
        return Err("it is not a regular file".into());
    }
    // SAFETY: geteuid(2) takes nothing and cannot fail.
    let me = unsafe { libc::geteuid() };
    if md.uid() != 0 && md.uid() != me {
        return Err(format!(
            "it is owned by uid {}, not root (the agent) nor this user",
            md.uid()
        ));
    }
    if md.len() > MAX_STATUS_BYTES {
        return Err(format!(
            "it is {} bytes, more than the {MAX_STATUS_BYTES} an agent writes",
            md.len()
        ));
    }
    let mut buf = Vec::new();
    f.take(MAX_STATUS_BYTES + 1)
        .read_to_end(&mut buf)
        .map_err(|e| format!("cannot read it: {e}"))?;
    if buf.len() as u64 > MAX_STATUS_BYTES {
        return Err(format!("it is more than {MAX_STATUS_BYTES} bytes"));
    }
    Ok(Some(buf))
}

/// Parses and checks the agent's document.
fn parse(bytes: &[u8]) -> Result<File, String> {
    let f: File =
        serde_json::from_slice(bytes).map_err(|e| format!("not the agent's JSON: {e}"))?;
    if f.schema_version != 1 {
        return Err(format!(
            "schema_version {} (this cgpu reads 1)",
            f.schema_version
        ));
    }
    for g in &f.gpus {
        for c in &g.containers {
            let sum = c
                .processes
                .iter()
                .try_fold(0u64, |s, p| s.checked_add(p.bytes));
            if sum != Some(c.device_bytes) {
                return Err(format!(
                    "container {} on GPU {}: device_bytes is not the sum of its processes",
                    c.name, g.uuid
                ));
            }
            let limited = c.quota > 0 && !c.enforce_off;
            let on_device = limited && c.device_bytes > c.quota;
            // Secure mode: the books, once the agent charged what the
            // device shows beyond them, are judged too (an agent that
            // judged the device only said `false` there).
            let in_books = limited && c.unseen_charged > 0 && c.ledger_used > c.quota;
            if c.over != on_device && !(c.over && in_books) {
                return Err(format!(
                    "container {} on GPU {}: `over` disagrees with its numbers",
                    c.name, g.uuid
                ));
            }
        }
    }
    Ok(f)
}

/// Reads the agent's status at `path` for report `r` (its GPU indexes and
/// timestamp). `None` when there is no file, or one not to be trusted (then
/// with one warning).
pub fn load(path: &Path, r: &Report) -> Option<AgentView> {
    let bytes = match read_bounded(path) {
        Ok(Some(b)) => b,
        Ok(None) => return None,
        Err(why) => {
            warn_once(format!("agent status {} not used: {why}", path.display()));
            return None;
        }
    };
    let f = match parse(&bytes) {
        Ok(f) => f,
        Err(why) => {
            warn_once(format!("agent status {} not used: {why}", path.display()));
            return None;
        }
    };
    let age_ns = r.timestamp_ns.saturating_sub(f.time_ns);
    let stale_after = f
        .interval_ms
        .map(|ms| ms.saturating_mul(3_000_000))
        .unwrap_or(0)
        .max(STALE_AFTER_NS);
    // A time far in the future is no more believable than one in the past.
    let future = f.time_ns > r.timestamp_ns.saturating_add(STALE_AFTER_NS);
    let index = |uuid: &str| r.gpus_ok().find(|g| g.uuid == uuid).map(|g| g.index);
    let mut gpu_errors = Vec::new();
    let mut containers = Vec::new();
    for g in f.gpus {
        if let Some(e) = g.error {
            gpu_errors.push(format!("GPU {}: {e}", g.uuid));
        }
        let gpu = index(&g.uuid);
        for c in g.containers {
            containers.push(AgentContainer {
                gpu,
                uuid: g.uuid.clone(),
                id: c.name,
                in_ledger: c.in_ledger,
                device_bytes: c.device_bytes,
                ledger_used_bytes: c.ledger_used,
                quota_bytes: c.quota,
                enforce_off: c.enforce_off,
                over: c.over,
                unseen_bytes: c.unseen_charged,
                device_time_ns: c.device_time_ns,
                processes: c
                    .processes
                    .into_iter()
                    .map(|p| AgentProcess {
                        pid: p.pid,
                        device_bytes: p.bytes,
                        in_library: p.registered,
                        stopped: p.stopped,
                        action: p.action,
                    })
                    .collect(),
            });
        }
    }
    Some(AgentView {
        path: path.display().to_string(),
        time_ns: f.time_ns,
        age_ms: age_ns / 1_000_000,
        stale: age_ns > stale_after || future,
        policy: f.policy,
        gpu_errors,
        containers,
    })
}

/// Where the shipped systemd unit has the agent write its status.
pub const SYSTEMD_STATUS: &str = "/run/cgpu-agent/agent.json";
/// Names the status file, instead of the places looked at by default.
pub const STATUS_ENV: &str = "CGPU_AGENT_STATUS";

/// The status files to look for, in order, for ledger directory `dir`.
pub fn status_paths(dir: &Path) -> Vec<PathBuf> {
    match std::env::var_os(STATUS_ENV).filter(|v| !v.is_empty()) {
        Some(p) => vec![PathBuf::from(p)],
        None => vec![PathBuf::from(SYSTEMD_STATUS), dir.join(STATUS_FILE)],
    }
}

/// The agent's status for report `r` of ledger directory `dir`: from the
/// first of [`status_paths`] that exists.
pub fn find(dir: &Path, r: &Report) -> Option<AgentView> {
    let paths = status_paths(dir);
    let path = paths
        .iter()
        .find(|p| std::fs::symlink_metadata(p).is_ok())?;
    load(path, r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_link_a_fifo_and_a_huge_file_are_not_read() {
        let dir = std::env::temp_dir().join(format!("cgpu-agent-read-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let target = dir.join("target");
        std::fs::write(&target, "{}").unwrap();
        let link = dir.join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(read_bounded(&link).unwrap_err().contains("symbolic link"));
        let fifo = dir.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo(3) with a NUL-terminated path and a mode.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(read_bounded(&fifo)
            .unwrap_err()
            .contains("not a regular file"));
        let big = dir.join("big");
        let f = std::fs::File::create(&big).unwrap();
        f.set_len(MAX_STATUS_BYTES + 1).unwrap();
        assert!(read_bounded(&big).unwrap_err().contains("bytes"));
        assert_eq!(read_bounded(&dir.join("none")).unwrap(), None);
        assert_eq!(read_bounded(&target).unwrap().unwrap(), b"{}");
        // SAFETY: geteuid(2) takes nothing and cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            // Written by someone else (a container's user): not the agent.
            let c = std::ffi::CString::new(target.to_str().unwrap()).unwrap();
            // SAFETY: chown(2) with a NUL-terminated path.
            assert_eq!(unsafe { libc::chown(c.as_ptr(), 12345, 12345) }, 0);
            assert!(read_bounded(&target).unwrap_err().contains("uid 12345"));
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn inconsistent_documents_are_refused() {
        let doc = |dev: u64, over: bool| {
            format!(
                r#"{{"schema_version":1,"time_ns":1,"policy":"report","gpus":[{{"uuid":"GPU-a","error":null,
                "containers":[{{"name":"c","in_ledger":true,"quota":10,"ledger_used":0,"enforce_off":false,
                "device_bytes":{dev},"over":{over},"processes":[{{"pid":1,"bytes":20,"registered":false,"stopped":false,"action":null}}]}}]}}]}}"#
            )
        };
        assert!(parse(doc(20, true).as_bytes()).is_ok());
        assert!(parse(doc(20, false).as_bytes())
            .unwrap_err()
            .contains("over"));
        assert!(parse(doc(5, false).as_bytes()).unwrap_err().contains("sum"));
        // Secure mode: over by the books (quota 10, 12 counted, 2 of them
        // charged by the agent) while the device holds less.
        let books = |over: bool, charged: u64| {
            doc(20, over)
                .replace("\"quota\":10", "\"quota\":30")
                .replace("\"ledger_used\":0", "\"ledger_used\":32")
                .replace(
                    "\"processes\"",
                    &format!("\"unseen_charged\":{charged},\"processes\""),
                )
        };
        assert!(parse(books(true, 2).as_bytes()).is_ok());
        assert!(parse(books(false, 2).as_bytes()).is_ok());
        assert!(parse(books(true, 0).as_bytes())
            .unwrap_err()
            .contains("over"));
        assert!(parse(b"[1,2]").is_err());
        assert!(parse(doc(20, true).replace(":1,\"time", ":2,\"time").as_bytes()).is_err());
    }

    #[test]
    fn the_over_line_says_by_which_numbers() {
        let mut c = AgentContainer {
            gpu: Some(0),
            uuid: "GPU-a".into(),
            id: "team-1".into(),
            in_ledger: true,
            device_bytes: 3148 * MIB,
            ledger_used_bytes: 800 * MIB,
            quota_bytes: 2048 * MIB,
            enforce_off: false,
            over: true,
            unseen_bytes: 0,
            device_time_ns: None,
            processes: vec![AgentProcess {
                pid: 26793,
                device_bytes: 2348 * MIB,
                in_library: false,
                stopped: false,
                action: Some("killed".into()),
            }],
        };
        assert_eq!(
            over_line(&c),
            "! 0 team-1: the device holds 3148 MiB, quota 2048 MiB: 1 process outside the library (pid 26793 killed)"
        );
        // Secure mode: the device holds less than the quota, the books
        // with the agent's charge more.
        c.device_bytes = 1348 * MIB;
        c.ledger_used_bytes = 2372 * MIB;
        c.unseen_bytes = 1220 * MIB;
        c.processes[0].action = Some("stopped".into());
        assert_eq!(
            over_line(&c),
            "! 0 team-1: the books count 2372 MiB with 1220 MiB unseen by the library, quota 2048 MiB: 1 process outside the library (pid 26793 stopped)"
        );
    }

    #[test]
    fn fresh_within_five_seconds_or_three_stated_intervals() {
        let dir = std::env::temp_dir().join(format!("cgpu-agent-age-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(STATUS_FILE);
        let now = 1_000_000_000_000u64;
        let r = Report {
            schema_version: 1,
            cgpu_version: "0".into(),
            ledger_format: 1,
            ledger_dir: dir.display().to_string(),
            timestamp_ns: now,
            util_window_ms: None,
            gpus: vec![],
            agent: None,
            mode: crate::cooperative(),
        };
        let stale = |time_ns: u64, interval: &str| {
            std::fs::write(
                &path,
                format!(r#"{{"schema_version":1,"time_ns":{time_ns},"policy":"kill"{interval},"gpus":[]}}"#),
            )
            .unwrap();
            let a = load(&path, &r).unwrap();
            assert_eq!(a.age_ms, now.saturating_sub(time_ns) / 1_000_000);
            a.stale
        };
        let s = 1_000_000_000;
        assert!(!stale(now - 4 * s, ""));
        assert!(stale(now - 6 * s, ""));
        assert!(!stale(now + s, ""), "a clock a little ahead");
        assert!(stale(now + 60 * s, ""), "a time far in the future");
        assert!(!stale(now - 20 * s, r#","interval_ms":10000"#));
        assert!(stale(now - 31 * s, r#","interval_ms":10000"#));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
