//! The device's truth as a backstop: real processes on the simulated GPU,
//! one of a container under `LD_PRELOAD=libcgpu.so`, another of the same
//! container without it (it allocates past the library's books), and
//! `cgpu-agent` reading the device through the simulated driver's NVML.
//! The simulated driver's own per-process books (`cgpu-sim-stat`) judge
//! the numbers.
//!
//! On this test bed the processes are host processes: their container is
//! the one `CGPU_CONTAINER_ID` in their environment names (the library's
//! host rule), which the agent reads only with `--include-host`.

use cgpu_testkit::{artifacts, cuclient, LinkMode, SimEnv};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// A simulated T4 and a ledger directory.
struct Rig {
    sim: SimEnv,
    dir: PathBuf,
    children: Vec<Child>,
}

impl Rig {
    fn new(name: &str) -> Rig {
        let sim = SimEnv::new().gpus("15109:Tesla T4");
        let dir = sim.state_dir.join(format!("ledger-{name}"));
        std::fs::create_dir_all(&dir).unwrap();
        Rig {
            sim,
            dir,
            children: Vec::new(),
        }
    }

    /// A command that reaches the simulated driver and the ledger, and
    /// nothing else from this environment.
    fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new(program);
        c.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("LD_LIBRARY_PATH", &artifacts().sim_lib_dir)
            .env("CGPU_SIM_STATE", &self.sim.state_dir)
            .env("CGPU_LEDGER_DIR", &self.dir)
            .env("CUCLIENT_HOLD_MAX_S", "120");
        for (k, v) in &self.sim.envs {
            c.env(k, v);
        }
        c.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    }

    /// Starts a cuclient of container `name` (under the library when
    /// `quota_gib` is given, with that quota; else bare) that allocates
    /// `bytes` and holds them; returns its index once it holds.
    fn start(&mut self, name: &str, quota_gib: Option<&str>, bytes: u64) -> usize {
        let mut c = self.command(cuclient(LinkMode::Link));
        c.env("CGPU_CONTAINER_ID", name);
        if let Some(q) = quota_gib {
            c.env("LD_PRELOAD", &artifacts().libcgpu)
                .env("ALIYUN_COM_GPU_MEM_CONTAINER", q);
        }
        c.args(["alloc", &bytes.to_string(), "hold"]);
        self.start_command(c, name)
    }

    /// Starts `c` (a cuclient that allocates and holds) and waits until it
    /// holds; its index.
    fn start_command(&mut self, mut c: Command, name: &str) -> usize {
        let mut child = c.spawn().expect("spawn cuclient");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut lines = Vec::new();
        let t0 = Instant::now();
        loop {
            let mut l = String::new();
            if out.read_line(&mut l).unwrap_or(0) == 0 || t0.elapsed() > Duration::from_secs(60) {
                let _ = child.kill();
                let o = child.wait_with_output().unwrap();
                panic!(
                    "{name}: no `holding`: {lines:?}\n{}",
                    String::from_utf8_lossy(&o.stderr)
                );
            }
            let done = l.starts_with("holding");
            lines.push(l.trim_end().to_string());
            if done {
                break;
            }
        }
        assert!(
            lines.iter().any(|l| l.starts_with("alloc ok")),
            "{name}: {lines:?}"
        );
        self.children.push(child);
        self.children.len() - 1
    }

    fn pid(&self, i: usize) -> u32 {
        self.children[i].id()
    }

    /// `cgpu-agent --once --ledger-dir DIR args...`: exit code and JSON.
    fn agent_once(&self, args: &[&str]) -> (i32, Value, String) {
        let mut c = self.command(env!("CARGO_BIN_EXE_cgpu-agent"));
        c.arg("--once")
            .arg("--ledger-dir")
            .arg(&self.dir)
            .args(args);
        let o: Output = c.output().expect("run cgpu-agent");
        let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
        let doc: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| {
            panic!(
                "cgpu-agent printed no JSON ({e}): {}\n{stderr}",
                String::from_utf8_lossy(&o.stdout)
            )
        });
        (o.status.code().unwrap_or(-1), doc, stderr)
    }

    /// What the simulated driver says each live process holds.
    fn sim_bytes(&self, pid: u32) -> u64 {
        self.sim.live_bytes(pid)
    }

    /// Waits (up to 30 s) for child `i` to end; its status.
    fn wait_end(&mut self, i: usize) -> Option<std::process::ExitStatus> {
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(30) {
            if let Some(st) = self.children[i].try_wait().unwrap() {
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    fn is_running(&mut self, i: usize) -> bool {
        self.children[i].try_wait().unwrap().is_none()
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn container<'a>(doc: &'a Value, name: &str) -> &'a Value {
    doc["gpus"][0]["containers"]
        .as_array()
        .unwrap_or_else(|| panic!("no containers: {doc:#}"))
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no container {name}: {doc:#}"))
}

fn process(c: &Value, pid: u32) -> &Value {
    c["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["pid"] == pid)
        .unwrap_or_else(|| panic!("no pid {pid} in {c:#}"))
}

/// `/proc/<pid>/stat`'s state letter.
fn state(pid: u32) -> char {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    s.rfind(')')
        .and_then(|i| s[i + 1..].trim_start().chars().next())
        .unwrap_or('?')
}

/// A container with a quota of 1 GiB: one process under the library holds
/// 256 MiB, another of the same container, without the preload, 2 GiB.
/// One pass reports it: exit 3, the container's device bytes and each
/// process's are the simulated driver's own, the library's process is in
/// the ledger and the other is not; nobody is signalled under `report`.
#[test]
fn a_container_over_its_quota_by_a_process_without_the_preload_is_reported() {
    let mut rig = Rig::new("report");
    let lib = rig.start("team-a", Some("1"), 256 * MIB);
    let bare = rig.start("team-a", None, 2 * GIB);
    let (lib_pid, bare_pid) = (rig.pid(lib), rig.pid(bare));
    let status = rig.dir.join("status.json");
    let (rc, doc, err) =
        rig.agent_once(&["--include-host", "--status-file", status.to_str().unwrap()]);
    assert_eq!(rc, 3, "over quota: exit 3\n{doc:#}\n{err}");
    assert_eq!(doc["over"], 1, "{doc:#}");
    let c = container(&doc, "team-a");
    assert_eq!(c["over"], true);
    assert_eq!(c["in_ledger"], true);
    assert_eq!(c["quota"].as_u64().unwrap(), GIB);
    let (lib_sim, bare_sim) = (rig.sim_bytes(lib_pid), rig.sim_bytes(bare_pid));
    assert!(
        lib_sim >= 256 * MIB && bare_sim >= 2 * GIB,
        "{lib_sim} {bare_sim}"
    );
    assert_eq!(
        c["device_bytes"].as_u64().unwrap(),
        lib_sim + bare_sim,
        "{c:#}"
    );
    let (pl, pb) = (process(c, lib_pid), process(c, bare_pid));
    assert_eq!(pl["bytes"].as_u64().unwrap(), lib_sim);
    assert_eq!(pb["bytes"].as_u64().unwrap(), bare_sim);
    assert_eq!(pl["registered"], true, "{c:#}");
    assert_eq!(pb["registered"], false, "{c:#}");
    assert!(pl["action"].is_null() && pb["action"].is_null(), "{c:#}");
    // The ledger counts only what the library saw: within the quota.
    let used = c["ledger_used"].as_u64().unwrap();
    assert!(used > 0 && used <= GIB, "{c:#}");
    // One log line names the container, the GPU, the numbers and the pids.
    let line = err
        .lines()
        .find(|l| l.contains("over quota"))
        .unwrap_or_else(|| panic!("no event line: {err}"));
    for want in [
        "team-a".to_string(),
        doc["gpus"][0]["uuid"].as_str().unwrap().to_string(),
        (lib_sim + bare_sim).to_string(),
        GIB.to_string(),
        format!("{bare_pid}:{bare_sim}(unregistered)"),
        format!("{lib_pid}:{lib_sim}"),
    ] {
        assert!(line.contains(&want), "`{want}` not in: {line}");
    }
    // The status file holds the same document.
    let written: Value = serde_json::from_slice(&std::fs::read(&status).unwrap()).unwrap();
    assert_eq!(written["gpus"], doc["gpus"]);
    assert!(
        rig.is_running(lib) && rig.is_running(bare),
        "report touches nobody"
    );

    // Without --include-host, host processes are not judged at all.
    let (rc, doc, err) = rig.agent_once(&["--policy", "kill"]);
    assert_eq!(rc, 0, "{doc:#}\n{err}");
    let outside = doc["gpus"][0]["outside_containers"].as_array().unwrap();
    assert_eq!(outside.len(), 2, "{doc:#}");
    assert!(doc["gpus"][0]["containers"].as_array().unwrap().is_empty());
    assert!(
        rig.is_running(lib) && rig.is_running(bare),
        "host processes are left alone"
    );
}

/// Under `--policy kill` the process that bypasses the library is killed
/// and the library's process of the same container keeps running and
/// holding what it held; the next pass finds the container within its
/// quota.
#[test]
fn policy_kill_kills_the_bypassing_process_and_spares_the_librarys() {
    let mut rig = Rig::new("kill");
    let lib = rig.start("team-a", Some("1"), 256 * MIB);
    let bare = rig.start("team-a", None, 2 * GIB);
    let (lib_pid, bare_pid) = (rig.pid(lib), rig.pid(bare));
    let lib_before = rig.sim_bytes(lib_pid);
    let (rc, doc, err) = rig.agent_once(&["--include-host", "--policy", "kill"]);
    assert_eq!(rc, 3, "{doc:#}\n{err}");
    let c = container(&doc, "team-a");
    assert_eq!(process(c, bare_pid)["action"], "killed", "{c:#}");
    assert!(process(c, lib_pid)["action"].is_null(), "{c:#}");
    assert!(err.contains(&format!("killed pid {bare_pid}")), "{err}");
    let st = rig.wait_end(bare).expect("the bypassing process ends");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(st.signal(), Some(libc::SIGKILL), "{st:?}");
    assert!(rig.is_running(lib), "the library's process is untouched");
    assert_eq!(state(lib_pid), 'S', "not stopped either");
    assert_eq!(rig.sim_bytes(lib_pid), lib_before);
    assert_eq!(rig.sim_bytes(bare_pid), 0, "the device freed what it held");
    let (rc, doc, err) = rig.agent_once(&["--include-host", "--policy", "kill"]);
    assert_eq!(rc, 0, "within quota now\n{doc:#}\n{err}");
    assert_eq!(container(&doc, "team-a")["over"], false);
    assert!(rig.is_running(lib));
}

/// Under `--policy stop` the bypassing process is stopped (it keeps what
/// it holds: an operator decides), the library's keeps running.
#[test]
fn policy_stop_stops_the_bypassing_process_only() {
    let mut rig = Rig::new("stop");
    let lib = rig.start("team-a", Some("1"), 256 * MIB);
    let bare = rig.start("team-a", None, 2 * GIB);
    let (lib_pid, bare_pid) = (rig.pid(lib), rig.pid(bare));
    let (rc, doc, err) = rig.agent_once(&["--include-host", "--policy", "stop"]);
    assert_eq!(rc, 3, "{doc:#}\n{err}");
    assert_eq!(
        process(container(&doc, "team-a"), bare_pid)["action"],
        "stopped"
    );
    let t0 = Instant::now();
    while state(bare_pid) != 'T' && t0.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(state(bare_pid), 'T');
    assert_eq!(state(lib_pid), 'S');
    // A second pass sees it stopped and signals nobody more.
    let (rc, doc, err) = rig.agent_once(&["--include-host", "--policy", "stop"]);
    assert_eq!(rc, 3, "still holding: {doc:#}");
    let c = container(&doc, "team-a");
    assert_eq!(process(c, bare_pid)["stopped"], true, "{c:#}");
    assert!(process(c, bare_pid)["action"].is_null(), "{c:#}");
    assert!(!err.contains("stopped pid"), "{err}");
    assert_eq!(state(lib_pid), 'S');
}

/// A container within its quota (256 MiB of 1 GiB) and a container with
/// no quota on this GPU (no ledger row: the library never ran there) that
/// holds 2 GiB: nothing to report, exit 0, nobody signalled even under
/// `kill`.
#[test]
fn containers_within_their_quota_or_without_one_are_left_alone() {
    let mut rig = Rig::new("within");
    let lib = rig.start("team-b", Some("1"), 256 * MIB);
    let other = rig.start("team-c", None, 2 * GIB);
    let (rc, doc, err) = rig.agent_once(&["--include-host", "--policy", "kill"]);
    assert_eq!(rc, 0, "{doc:#}\n{err}");
    assert_eq!(doc["over"], 0);
    let b = container(&doc, "team-b");
    assert_eq!(b["over"], false);
    assert_eq!(b["quota"].as_u64().unwrap(), GIB);
    assert_eq!(
        b["device_bytes"].as_u64().unwrap(),
        rig.sim_bytes(rig.pid(lib))
    );
    let c = container(&doc, "team-c");
    assert_eq!(c["in_ledger"], false);
    assert_eq!(c["quota"], 0);
    assert!(rig.is_running(lib) && rig.is_running(other));
    assert!(!err.contains("over quota"), "{err}");
}

/// Running as a service: a bypassing process started while the agent runs
/// is killed within a few of its intervals, the event is logged once, and
/// the status file is rewritten every pass.
#[test]
fn the_running_agent_kills_a_bypassing_process_started_later() {
    let mut rig = Rig::new("daemon");
    let lib = rig.start("team-a", Some("1"), 256 * MIB);
    let status = rig.dir.join("agent.json");
    let mut agent = rig.command(env!("CARGO_BIN_EXE_cgpu-agent"));
    agent.arg("--ledger-dir").arg(&rig.dir).args([
        "--interval",
        "100ms",
        "--include-host",
        "--policy",
        "kill",
    ]);
    let agent = agent.spawn().expect("spawn cgpu-agent");
    rig.children.push(agent);
    let agent_i = rig.children.len() - 1;
    wait_for(&status, |d| {
        d["gpus"][0]["containers"]
            .as_array()
            .is_some_and(|a| !a.is_empty())
    });
    let bare = rig.start("team-a", None, 2 * GIB);
    let bare_pid = rig.pid(bare);
    let st = rig.wait_end(bare).expect("killed by the running agent");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(st.signal(), Some(libc::SIGKILL));
    assert!(rig.is_running(lib));
    // Back within quota in the status file, in a pass after the kill.
    let after = now_ns();
    let doc = wait_for(&status, |d| {
        d["time_ns"].as_u64().is_some_and(|t| t > after)
            && d["over"] == 0
            && d["gpus"][0]["containers"][0]["processes"]
                .as_array()
                .is_some_and(|p| p.iter().all(|p| p["pid"] != bare_pid))
    });
    assert_eq!(container(&doc, "team-a")["over"], false);
    assert!(rig.is_running(agent_i), "the agent keeps running");
    let mut agent = rig.children.remove(agent_i);
    let _ = agent.kill();
    let o = agent.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.matches("over quota on GPU").count(), 1, "{err}");
    assert!(err.contains(&format!("killed pid {bare_pid}")), "{err}");
    assert!(err.contains("within its quota again"), "{err}");
}

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

/// How namespaces are made here: `Some(false)` as root, `Some(true)` in a
/// user namespace of the test's own (`unshare -U -r`), `None` not at all.
fn ns_mode() -> Option<bool> {
    let works = |pre: &[&str]| {
        Command::new("unshare")
            .args(pre)
            .args(["-p", "-f", "true"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let want_user = std::env::var_os("CGPU_TEST_USERNS").is_some_and(|v| v == "1");
    if !want_user && works(&[]) {
        Some(false)
    } else if works(&["-U", "-r"]) {
        Some(true)
    } else {
        None
    }
}

/// The pid (host numbering) of the only child of `pid`.
fn only_child(pid: u32) -> u32 {
    let t0 = Instant::now();
    loop {
        let s =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        if let Some(c) = s.split_whitespace().next().and_then(|c| c.parse().ok()) {
            return c;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "no child of {pid}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A container made as a runtime makes one (a PID namespace of its own,
/// `unshare -p -f`), with no `CGPU_CONTAINER_ID` anywhere: its first
/// process runs under the library with a quota of 1 GiB; a second one,
/// entered into it (`nsenter`, as `docker exec` does) without the preload,
/// takes 2 GiB. The agent finds the container from what the kernel shows
/// of each process (no `--include-host`, no environment read), reports it
/// and kills the second process only.
#[test]
fn a_container_of_its_own_pid_namespace_is_judged_without_the_host_rule() {
    let Some(userns) = ns_mode() else {
        eprintln!("skipped: `unshare -p -f` is not possible here (neither as root nor in a user namespace)");
        return;
    };
    let mut rig = Rig::new("pidns");
    let client = cuclient(LinkMode::Link);
    let mut first = rig.command("unshare");
    if userns {
        first.args(["-U", "-r"]);
    }
    first
        .env("LD_PRELOAD", &artifacts().libcgpu)
        .env("ALIYUN_COM_GPU_MEM_CONTAINER", "1")
        .args(["-p", "-f", "--kill-child"])
        .arg(&client)
        .args(["alloc", &(256 * MIB).to_string(), "hold"]);
    let first = rig.start_command(first, "the container's first process");
    let lib_pid = only_child(rig.pid(first));
    let mut second = rig.command("nsenter");
    if userns {
        second.arg("-U");
    }
    second
        .args(["-t", &lib_pid.to_string(), "-p", "--"])
        .arg(&client)
        .args(["alloc", &(2 * GIB).to_string(), "hold"]);
    let second = rig.start_command(second, "a process entered without the preload");
    let bare_pid = only_child(rig.pid(second));

    let (rc, doc, err) = rig.agent_once(&["--policy", "kill"]);
    assert_eq!(rc, 3, "{doc:#}\n{err}");
    let containers = doc["gpus"][0]["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1, "{doc:#}");
    let c = &containers[0];
    assert_eq!(c["source"], "pid-namespace", "{c:#}");
    assert_eq!(c["in_ledger"], true, "{c:#}");
    assert_eq!(c["quota"].as_u64().unwrap(), GIB);
    assert_eq!(process(c, lib_pid)["registered"], true, "{c:#}");
    assert_eq!(process(c, bare_pid)["action"], "killed", "{c:#}");
    assert!(process(c, lib_pid)["action"].is_null(), "{c:#}");
    // The entering process (nsenter) ends when its child is killed.
    assert!(rig.wait_end(second).is_some(), "the bypassing process ends");
    assert!(rig.is_running(first), "the library's process is untouched");
    assert_eq!(state(lib_pid), 'S');
    let (rc, doc, err) = rig.agent_once(&["--policy", "kill"]);
    assert_eq!(rc, 0, "{doc:#}\n{err}");
}

/// Waits (up to 60 s) until the status file satisfies `ok`.
fn wait_for(path: &Path, ok: impl Fn(&Value) -> bool) -> Value {
    let t0 = Instant::now();
    loop {
        if let Some(d) = std::fs::read(path)
            .ok()
            .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        {
            if ok(&d) {
                return d;
            }
            if t0.elapsed() > Duration::from_secs(60) {
                panic!("status file never matched: {d:#}");
            }
        } else if t0.elapsed() > Duration::from_secs(60) {
            panic!("no status file at {}", path.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
