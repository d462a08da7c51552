//! `--policy stop|kill` in secure mode: `cgpu-agent --secure` on a
//! temporary ledger directory with the simulated GPU's NVML. A container is
//! a cgroup named by a runtime container id (how the agent finds it); its
//! processes are a tenant of uid 65534 that asks the agent for memory over
//! the socket, a process that joined the agent's books and allocates what
//! it was granted, and processes without the library (no `LD_PRELOAD`,
//! linked to the simulated driver) that allocate around it. What the
//! kernel says of each process (its `/proc` state, its wait status) and
//! the agent's log and status file judge.
//!
//! These tests need root (they create cgroups and run processes of other
//! uids); without it they fail, they do not pass silently.

use cgpu_testkit::{artifacts, SimEnv};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const NOBODY: u32 = 65534;
/// Generous: a test never fails because the machine is slow.
const PATIENCE: Duration = Duration::from_secs(60);

fn agent_bin() -> &'static str {
    env!("CARGO_BIN_EXE_cgpu-agent")
}

/// A runtime container id unique to this test process and call.
fn container_id() -> String {
    cgpu_testkit::secure::container_id('d')
}

/// The simulated host: its GPU, the agent (with the test's policy), the
/// host's settings and the cgroups made.
struct Rig {
    sim: SimEnv,
    dir: PathBuf,
    settings: PathBuf,
    agent: Child,
    log: Receiver<String>,
    /// Every log line read so far.
    seen: Vec<String>,
    uuid: String,
    parent: PathBuf,
    cgroups: Vec<PathBuf>,
}

impl Rig {
    /// The agent in secure mode with `extra` options (its default
    /// interval unless they name one), serving.
    fn new(extra: &[&str]) -> Rig {
        // SAFETY: geteuid has no preconditions.
        assert_eq!(
            unsafe { libc::geteuid() },
            0,
            "the secure-mode tests run as root (cgroups, processes of other uids)"
        );
        let sim = SimEnv::new().gpus("15109:Tesla T4");
        // The tenant's processes must reach the socket.
        std::fs::set_permissions(&sim.state_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let dir = sim.state_dir.join("ledger");
        let settings = sim.state_dir.join("containers");
        std::fs::create_dir_all(&settings).unwrap();
        let mut agent = sim
            .command(agent_bin())
            .arg("--secure")
            .arg("--ledger-dir")
            .arg(&dir)
            .arg("--settings-dir")
            .arg(&settings)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn cgpu-agent");
        let err = agent.stderr.take().unwrap();
        let (tx, log) = channel();
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        let parent = PathBuf::from(format!(
            "{}/cgpu-test-{}-{}",
            cgpu_testkit::cgroup_root(),
            std::process::id(),
            sim.state_dir.file_name().unwrap().to_string_lossy()
        ));
        let mut r = Rig {
            sim,
            dir,
            settings,
            agent,
            log,
            seen: Vec::new(),
            uuid: String::new(),
            parent,
            cgroups: Vec::new(),
        };
        let l = r.wait_log("cgpu-agent: secure: GPU 0 ");
        r.uuid = l["cgpu-agent: secure: GPU 0 ".len()..]
            .split(':')
            .next()
            .unwrap()
            .to_string();
        r.wait_log("cgpu-agent: checking the GPUs");
        r
    }

    /// Reads the agent's log until a line starts with `prefix`; that line.
    fn wait_log(&mut self, prefix: &str) -> String {
        if let Some(l) = self.seen.iter().find(|l| l.starts_with(prefix)) {
            return l.clone();
        }
        let t0 = Instant::now();
        loop {
            let l = self
                .log
                .recv_timeout(PATIENCE.saturating_sub(t0.elapsed()))
                .unwrap_or_else(|_| panic!("no {prefix:?} in the agent's log: {:#?}", self.seen));
            self.seen.push(l.clone());
            if l.starts_with(prefix) {
                return l;
            }
        }
    }

    /// Every log line so far, without waiting.
    fn log_now(&mut self) -> &[String] {
        while let Ok(l) = self.log.try_recv() {
            self.seen.push(l);
        }
        &self.seen
    }

    /// The host's settings for a container (`cgpuctl settings`, root).
    fn settings_for(&self, id: &str, kv: &[&str]) {
        let o = Command::new(artifacts().bin("cgpuctl"))
            .args(["settings", id])
            .args(kv)
            .arg("--settings-dir")
            .arg(&self.settings)
            .env("CGPU_LEDGER_DIR", &self.dir)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "cgpuctl settings: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }

    /// The cgroup named by container id `id`.
    fn cgroup(&mut self, id: &str) -> PathBuf {
        let p = self.parent.join(id);
        std::fs::create_dir_all(&p).expect("create a cgroup (root; cgroup v2, or v1 with pids)");
        if !self.cgroups.contains(&p) {
            self.cgroups.push(p.clone());
        }
        p
    }

    /// A client of the agent's socket in container `id`: of uid 65534
    /// (a tenant), or of root with the simulated GPU at hand (it may
    /// `exec` a program that allocates what it was granted).
    fn client(&mut self, id: &str, tenant: bool) -> Client {
        let mut c = if tenant {
            let mut c = Command::new(agent_bin());
            c.uid(NOBODY).gid(NOBODY);
            c
        } else {
            self.sim.command(agent_bin())
        };
        c.arg("client")
            .arg(self.dir.join("agent.sock"))
            .env("CUCLIENT_HOLD_MAX_S", "300")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let mut child = c.spawn().expect("spawn the client");
        // Placed before its first command (it connects at its first).
        std::fs::write(self.cgroup(id).join("cgroup.procs"), child.id().to_string())
            .expect("move into the cgroup");
        let out = child.stdout.take().unwrap();
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Client {
            stdin: child.stdin.take(),
            child,
            rx,
        }
    }

    /// A process of container `id` that does not load the library: it
    /// allocates `bytes` on the simulated GPU and holds them. Returned
    /// once it says so.
    fn bypasser(&mut self, id: &str, bytes: u64) -> Child {
        let mut c = self.start_bypasser(id, bytes);
        let out = cgpu_testkit::read_until(&mut c, "holding", PATIENCE);
        assert!(out.iter().any(|l| l.starts_with("alloc ok")), "{out:?}");
        c
    }

    /// [`Rig::bypasser`], returned at once (the agent may stop or kill
    /// it before it says anything).
    fn start_bypasser(&mut self, id: &str, bytes: u64) -> Child {
        let cg = self.cgroup(id);
        self.sim
            .command("sh")
            .arg("-c")
            .arg(format!(
                "echo $$ > {}/cgroup.procs && exec {} alloc {bytes} hold",
                cg.display(),
                cgpu_testkit::cuclient(cgpu_testkit::LinkMode::Link).display(),
            ))
            .env("CUCLIENT_HOLD_MAX_S", "300")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    }

    /// What the simulated driver says live process `pid` holds.
    fn sim_bytes(&self, pid: u32) -> u64 {
        self.sim
            .stats()
            .processes
            .iter()
            .filter(|p| p.alive && p.pid == pid)
            .map(|p| p.mem_bytes)
            .sum()
    }

    /// The status file, when there is a whole one.
    fn status(&self) -> Option<serde_json::Value> {
        std::fs::read(self.dir.join("agent.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
    }

    /// Container `id` in the first status file read from now on in which
    /// `ok` holds for it (at most [`PATIENCE`]).
    fn status_until(&self, id: &str, ok: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
        self.status_after(id, 0, ok)
    }

    /// [`Rig::status_until`] among the files written after `since_ns`
    /// (wall time).
    fn status_after(
        &self,
        id: &str,
        since_ns: u64,
        ok: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let t0 = Instant::now();
        loop {
            let c = self.status().and_then(|d| {
                if d["time_ns"].as_u64()? <= since_ns {
                    return None;
                }
                d["gpus"][0]["containers"]
                    .as_array()?
                    .iter()
                    .find(|c| c["container_id"] == id)
                    .cloned()
            });
            match c {
                Some(c) if ok(&c) => return c,
                c if t0.elapsed() > PATIENCE => panic!("no such status for {id}: {c:#?}"),
                _ => std::thread::sleep(Duration::from_millis(10)),
            }
        }
    }

    /// Waits until the agent has written `n` more status files.
    fn passes(&self, n: usize) {
        let t0 = Instant::now();
        let mut times = Vec::new();
        let first = self.status().and_then(|d| d["time_ns"].as_u64());
        while times.len() < n {
            let t = self.status().and_then(|d| d["time_ns"].as_u64());
            if let Some(t) = t.filter(|t| Some(*t) != first && !times.contains(t)) {
                times.push(t);
            }
            assert!(t0.elapsed() < PATIENCE, "the agent writes no status");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        let _ = self.agent.kill();
        let _ = self.agent.wait();
        for cg in &self.cgroups {
            let _ = std::fs::remove_dir(cg);
        }
        let _ = std::fs::remove_dir(&self.parent);
    }
}

struct Client {
    child: Child,
    stdin: Option<ChildStdin>,
    rx: Receiver<String>,
}

impl Client {
    /// One command; its reply line.
    fn cmd(&mut self, line: &str) -> String {
        let s = self.stdin.as_mut().unwrap();
        writeln!(s, "{line}").unwrap();
        s.flush().unwrap();
        self.rx
            .recv_timeout(PATIENCE)
            .unwrap_or_else(|_| panic!("no answer to {line:?}"))
    }

    /// `(status, used)` of a reply.
    fn ask(&mut self, line: &str) -> (String, u64) {
        let l = self.cmd(line);
        let f = |k: &str| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix(&format!("{k}=")))
                .unwrap_or_else(|| panic!("{line:?}: no {k} in {l:?}"))
                .to_string()
        };
        (f("status"), f("used").parse().unwrap())
    }

    /// Becomes cuclient allocating `bytes` with its connection kept (the
    /// process under the agent's books then holds what it was granted).
    fn exec_alloc(&mut self, bytes: u64) {
        let s = self.stdin.as_mut().unwrap();
        writeln!(
            s,
            "exec {} alloc {bytes} hold",
            cgpu_testkit::cuclient(cgpu_testkit::LinkMode::Link).display()
        )
        .unwrap();
        s.flush().unwrap();
        let t0 = Instant::now();
        let mut lines = Vec::new();
        loop {
            let l = self
                .rx
                .recv_timeout(PATIENCE.saturating_sub(t0.elapsed()))
                .unwrap_or_else(|_| panic!("no \"holding\" after {lines:?}"));
            let done = l.starts_with("holding");
            lines.push(l);
            if done {
                break;
            }
        }
        assert!(lines.iter().any(|l| l.starts_with("alloc ok")), "{lines:?}");
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The state letter of `/proc/<pid>/stat` (`T` stopped, `S` sleeping),
/// `None` once it is gone.
fn state(pid: u32) -> Option<char> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s[s.rfind(')')? + 1..]
        .split_whitespace()
        .next()?
        .chars()
        .next()
}

/// Running, neither stopped nor dead.
fn runs(pid: u32) -> bool {
    matches!(state(pid), Some('S' | 'R' | 'D'))
}

/// Waits until `pid` is in state `want`; how long it took.
fn wait_state(pid: u32, want: char) -> Duration {
    let t0 = Instant::now();
    while state(pid) != Some(want) {
        assert!(
            t0.elapsed() < PATIENCE,
            "pid {pid} is {:?}, not {want}",
            state(pid)
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    t0.elapsed()
}

/// Waits for `c` to end; its wait status.
fn wait_end(c: &mut Child) -> std::process::ExitStatus {
    let t0 = Instant::now();
    loop {
        if let Some(st) = c.try_wait().unwrap() {
            return st;
        }
        assert!(t0.elapsed() < PATIENCE, "pid {} still runs", c.id());
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Process `pid` of a container in the status, if it is listed.
fn listed(c: &serde_json::Value, pid: u32) -> Option<&serde_json::Value> {
    c["processes"].as_array()?.iter().find(|p| p["pid"] == pid)
}

/// Process `pid` of a container in the status.
fn process(c: &serde_json::Value, pid: u32) -> &serde_json::Value {
    listed(c, pid).unwrap_or_else(|| panic!("pid {pid} not in {c:#}"))
}

/// How many processes the status lists for a container.
fn count(c: &serde_json::Value) -> usize {
    c["processes"].as_array().map_or(0, Vec::len)
}

/// `cgpu-smi --json`, `cgpu-smi` and `cgpuctl exporter` (root, on the
/// host) on the agent's status: container `name` is over its quota by its
/// books, with process `pid` outside the library `stopped`. They read a
/// copy of the agent's last status that states an interval of 10 minutes
/// (the tools count a status fresh for three intervals), so that it is
/// fresh however slowly this machine runs them.
fn tools_say_over_in_books(rig: &Rig, name: &str, pid: u32) {
    let mut doc = rig.status().expect("a status");
    doc["interval_ms"] = 600_000.into();
    let status = rig.sim.state_dir.join("agent-status-copy.json");
    std::fs::write(&status, serde_json::to_string(&doc).unwrap()).unwrap();
    let smi = |args: &[&str]| {
        let o = Command::new(artifacts().bin("cgpu-smi"))
            .arg("--dir")
            .arg(&rig.dir)
            .args(args)
            .env("CGPU_AGENT_STATUS", &status)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stdout).unwrap()
    };
    let v: serde_json::Value = serde_json::from_str(&smi(&["--json"])).unwrap();
    let c = v["agent"]["containers"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["id"] == name))
        .unwrap_or_else(|| panic!("{name} not in {v:#}"));
    assert_eq!(c["over"], true, "{c:#}");
    let p = c["processes"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["pid"] == pid))
        .unwrap_or_else(|| panic!("{pid} not in {c:#}"));
    assert_eq!(
        (&p["in_library"], &p["stopped"]),
        (&false.into(), &true.into())
    );
    let table = smi(&[]);
    let marker = table
        .lines()
        .find(|l| l.starts_with('!') && l.contains(name))
        .unwrap_or_else(|| panic!("no marker for {name} in\n{table}"));
    assert!(
        marker.contains(&format!(
            "the books count {} MiB",
            c["ledger_used_bytes"].as_u64().unwrap() / MIB
        )) && marker.contains(&format!("{pid} stopped)")),
        "{marker}"
    );

    // The exporter, scraped once.
    let mut exp = Command::new(artifacts().bin("cgpuctl"))
        .args(["exporter", "--listen", "127.0.0.1:0"])
        .env("CGPU_LEDGER_DIR", &rig.dir)
        .env("CGPU_AGENT_STATUS", &status)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let first = cgpu_testkit::read_until(&mut exp, "cgpuctl exporter: serving", PATIENCE);
    let url = first.last().cloned().unwrap_or_default();
    let addr = url
        .split("http://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .unwrap_or_else(|| panic!("no address in {first:?}"))
        .to_string();
    let mut body = String::new();
    {
        use std::io::Read;
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        s.set_read_timeout(Some(PATIENCE)).unwrap();
        write!(s, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
        s.read_to_string(&mut body).unwrap();
    }
    let _ = exp.kill();
    let _ = exp.wait();
    let over = body
        .lines()
        .find(|l| l.starts_with("CGPU_OVER_QUOTA{") && l.contains(&format!("container=\"{name}\"")))
        .unwrap_or_else(|| panic!("no CGPU_OVER_QUOTA for {name} in\n{body}"));
    assert!(over.ends_with(" 1"), "{over}");
}

/// Container A (quota 2 GiB) holds, through the agent, a tenant's 1 GiB
/// grant and a process that allocates the 128 MiB it was granted, and,
/// around the library, a 64 MiB process; container B (quota 1 GiB) a
/// process around the library within its quota. Then a process of A
/// without the library starts and allocates 256 MiB: on the device A then
/// holds less than its quota, but its books, with what the agent charges
/// of the device's numbers, count more.
struct OverInBooks {
    a: String,
    b: String,
    tenant: Client,
    lib: Client,
    small: Child,
    other: Child,
    /// A's last process, just started, and when.
    last: Child,
    started: Instant,
    /// What A's books count without it.
    books_before: u64,
}

impl OverInBooks {
    /// The processes never to be signalled.
    fn innocent(&self) -> [u32; 3] {
        [self.lib.child.id(), self.small.id(), self.other.id()]
    }
}

fn over_in_books(rig: &mut Rig) -> OverInBooks {
    let (a, b) = (container_id(), container_id());
    rig.settings_for(&a, &["ALIYUN_COM_GPU_MEM_CONTAINER=2"]);
    rig.settings_for(&b, &["ALIYUN_COM_GPU_MEM_CONTAINER=1"]);
    let gpu = rig.uuid.clone();
    let mut tenant = rig.client(&a, true);
    assert_eq!(tenant.ask(&format!("hello {gpu}")).0, "Ok");
    assert_eq!(
        tenant.ask(&format!("reserve {gpu} {GIB}")),
        ("Ok".into(), GIB)
    );
    let mut lib = rig.client(&a, false);
    assert_eq!(lib.ask(&format!("hello {gpu}")).0, "Ok");
    assert_eq!(lib.ask(&format!("reserve {gpu} {}", 128 * MIB)).0, "Ok");
    lib.exec_alloc(128 * MIB);
    let small = rig.bypasser(&a, 64 * MIB);
    let other = rig.bypasser(&b, 256 * MIB);
    let (lib_pid, small_pid) = (lib.child.id(), small.id());
    let lib_dev = rig.sim_bytes(lib_pid);
    let small_dev = rig.sim_bytes(small_pid);
    // The same allocation as B's process: what A's last one will hold.
    let last_dev = rig.sim_bytes(other.id());
    assert!(lib_dev > 128 * MIB && small_dev > 64 * MIB && last_dev > 256 * MIB);
    // A pass that sees them all: A within its quota, in its books too,
    // which count the grants and what the device shows beyond them.
    let books_before = GIB + 128 * MIB + (lib_dev - 128 * MIB) + small_dev;
    let c = rig.status_until(&a, |c| c["ledger_used"] == books_before && count(c) == 2);
    assert_eq!(c["over"], false, "{c:#}");
    assert_eq!(process(&c, lib_pid)["registered"], true, "{c:#}");
    assert_eq!(process(&c, small_pid)["registered"], false, "{c:#}");
    let b_row = rig.status_until(&b, |c| count(c) == 1);
    assert_eq!(b_row["over"], false, "{b_row:#}");
    // The last one takes the books over the quota, not the device.
    let device = lib_dev + small_dev + last_dev;
    assert!(device <= 2 * GIB, "{device}");
    assert!(books_before <= 2 * GIB && books_before + last_dev > 2 * GIB);
    let started = Instant::now();
    let last = rig.start_bypasser(&a, 256 * MIB);
    OverInBooks {
        a,
        b,
        tenant,
        lib,
        small,
        other,
        last,
        started,
        books_before,
    }
}

/// The gap the books leave: a container over its quota only once the
/// agent charges what its processes hold around the library. Under
/// `--policy stop` the process around the library that put it over is
/// stopped (`T`), in the pass that finds it; the container's other
/// processes, under the books or not, and the other container's are not;
/// the status says over, by the books, with the process stopped; later
/// passes stop nobody more. Prints how long the stop took (not asserted).
#[test]
fn stop_stops_the_process_that_put_the_books_over_the_quota() {
    let mut rig = Rig::new(&["--policy", "stop"]);
    let mut t = over_in_books(&mut rig);
    let last = t.last.id();
    wait_state(last, 'T');
    let took = t.started.elapsed();
    eprintln!(
        "a process around the library taking a container's books past its quota, from its start to SIGSTOP, default interval: {took:?}"
    );
    let c = rig.status_until(&t.a, |c| {
        listed(c, last).is_some_and(|p| p["stopped"] == true)
    });
    assert_eq!(c["over"], true, "{c:#}");
    assert_eq!(c["over_in_books"], true, "{c:#}");
    assert!(c["device_bytes"].as_u64().unwrap() <= 2 * GIB, "{c:#}");
    assert!(c["ledger_used"].as_u64().unwrap() > 2 * GIB, "{c:#}");
    assert_eq!(process(&c, last)["registered"], false, "{c:#}");
    let line = rig.wait_log(&format!("cgpu-agent: stopped pid {last} "));
    assert!(line.contains("not in the ledger"), "{line}");
    assert!(line.contains(&t.a[..12]), "{line}");
    tools_say_over_in_books(&rig, c["name"].as_str().unwrap(), last);
    let over = rig.wait_log("cgpu-agent: over quota on GPU");
    assert!(over.contains(&format!(" {last}:")), "{over}");
    assert!(over.contains(", books "), "{over}");
    // The books stay over while it holds its memory: the container's
    // requests are refused, and nobody else is stopped in later passes.
    let gpu = rig.uuid.clone();
    assert_eq!(t.tenant.ask(&format!("reserve {gpu} {MIB}")).0, "OverQuota");
    rig.passes(3);
    for pid in t.innocent() {
        assert!(runs(pid), "pid {pid} is {:?}", state(pid));
    }
    assert_eq!(state(last), Some('T'));
    let stops: Vec<&String> = rig
        .log_now()
        .iter()
        .filter(|l| l.contains("stopped pid"))
        .collect();
    assert_eq!(stops.len(), 1, "{stops:#?}");
    let c = rig.status_until(&t.b, |_| true);
    assert_eq!(c["over"], false, "{c:#}");
    // Ended, its charge goes back and the container is within its quota.
    let _ = t.last.kill();
    let _ = t.last.wait();
    let c = rig.status_until(&t.a, |c| c["over"] == false);
    assert_eq!(c["ledger_used"], t.books_before, "{c:#}");
    assert_eq!(t.tenant.ask(&format!("reserve {gpu} {MIB}")).0, "Ok");
}

/// Under `--policy kill` the process around the library that takes its
/// container over the quota is killed (its wait status says `SIGKILL`):
/// first one that takes the books over; then, the tenant's grant given
/// back, one that takes what the device holds over. The biggest first and
/// no more than needed: the container's smaller one stays, as do its
/// processes under the books and the other container's. The device frees
/// what it held and the books give its charge back. Prints how long each
/// kill took (not asserted).
#[test]
fn kill_kills_the_process_that_put_the_container_over_the_quota() {
    let mut rig = Rig::new(&["--policy", "kill"]);
    let mut t = over_in_books(&mut rig);
    let st = wait_end(&mut t.last);
    let ended = cgpu_ledger::clock::realtime_ns();
    eprintln!(
        "a process around the library taking a container's books past its quota, from its start to SIGKILL, default interval: {:?}",
        t.started.elapsed()
    );
    assert_eq!(st.signal(), Some(libc::SIGKILL), "{st:?}");
    let line = rig.wait_log(&format!("cgpu-agent: killed pid {} ", t.last.id()));
    assert!(line.contains("not in the ledger"), "{line}");
    // Its charge goes back in the next pass.
    let c = rig.status_after(&t.a, ended, |c| c["over"] == false && count(c) == 2);
    assert_eq!(c["ledger_used"], t.books_before, "{c:#}");

    // The tenant gives its grant back; 1 GiB around the library then
    // takes what the device holds over the quota (its context alone
    // does not).
    let gpu = rig.uuid.clone();
    let books = t.books_before - GIB;
    assert_eq!(
        t.tenant.ask(&format!("release {gpu} {GIB}")),
        ("Ok".into(), books)
    );
    let ctx = rig.sim_bytes(t.other.id()) - 256 * MIB;
    assert!(books + ctx <= 2 * GIB && books + ctx + GIB > 2 * GIB);
    let t0 = Instant::now();
    let mut big = rig.start_bypasser(&t.a, GIB);
    let big_pid = big.id();
    let st = wait_end(&mut big);
    let ended = cgpu_ledger::clock::realtime_ns();
    eprintln!(
        "a process around the library taking 1 GiB past a container's quota, from its start to SIGKILL, default interval: {:?}",
        t0.elapsed()
    );
    assert_eq!(st.signal(), Some(libc::SIGKILL), "{st:?}");
    let line = rig.wait_log(&format!("cgpu-agent: killed pid {big_pid} "));
    assert!(line.contains("not in the ledger"), "{line}");
    let over = rig
        .log_now()
        .iter()
        .rev()
        .find(|l| {
            l.starts_with("cgpu-agent: over quota on GPU") && l.contains(&format!(" {big_pid}:"))
        })
        .cloned()
        .unwrap_or_else(|| panic!("no over-quota event naming {big_pid}"));
    assert!(over.contains(&t.a[..12]), "{over}");
    let device: u64 = over
        .split(" device ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no device bytes in {over}"));
    assert_eq!(device, books + ctx + GIB, "{over}");
    // In a pass after the kill: back within the quota, its charge given
    // back; the rest run and were never signalled.
    let c = rig.status_after(&t.a, ended, |c| c["over"] == false && count(c) == 2);
    assert_eq!(c["ledger_used"], books, "{c:#}");
    for pid in t.innocent() {
        assert!(runs(pid), "pid {pid} is {:?}", state(pid));
    }
    let kills = rig
        .log_now()
        .iter()
        .filter(|l| l.contains("killed pid"))
        .count();
    assert_eq!(kills, 2, "{:#?}", rig.seen);
    let c = rig.status_until(&t.b, |_| true);
    assert_eq!(c["over"], false, "{c:#}");
}

/// Under the default policy, `report`, the same container is found over
/// (status and log) and nobody is signalled.
#[test]
fn report_signals_nobody() {
    let mut rig = Rig::new(&[]);
    let mut t = over_in_books(&mut rig);
    let out = cgpu_testkit::read_until(&mut t.last, "holding", PATIENCE);
    assert!(out.iter().any(|l| l.starts_with("alloc ok")), "{out:?}");
    let last = t.last.id();
    let c = rig.status_until(&t.a, |c| c["over"] == true && count(c) == 3);
    assert_eq!(c["over_in_books"], true, "{c:#}");
    assert_eq!(process(&c, last)["action"], serde_json::Value::Null);
    let over = rig.wait_log("cgpu-agent: over quota on GPU");
    assert!(over.contains(&format!(" {last}:")), "{over}");
    rig.passes(3);
    for pid in t.innocent().into_iter().chain([last]) {
        assert!(runs(pid), "pid {pid} is {:?}", state(pid));
    }
    let signalled: Vec<&String> = rig
        .log_now()
        .iter()
        .filter(|l| l.contains("stopped pid") || l.contains("killed pid"))
        .collect();
    assert!(signalled.is_empty(), "{signalled:#?}");
    assert_eq!(rig.status().unwrap()["policy"], "report");
    let c = rig.status_until(&t.b, |_| true);
    assert_eq!(c["over"], false, "{c:#}");
}
