//! Secure mode as a tenant meets it: `cgpu-agent --secure` on a temporary
//! ledger directory with the simulated GPU's NVML, and clients that are
//! real processes of uid 65534 speaking the wire protocol
//! (`cgpu-agent client`), each placed in a cgroup named by a runtime
//! container id (as docker and containerd name theirs), which is how the
//! agent finds their container. The ledger file, read by root, judges.
//!
//! These tests need root (they create cgroups and run processes of other
//! uids); without it they say so and pass nothing silently: they fail.

use cgpu_ledger::wire::{MAGIC, REQUEST_LEN, VERSION};
use cgpu_ledger::Ledger;
use cgpu_testkit::secure::{self as rig, AgentClient, Cgroups, SecureAgent, NOBODY};
use cgpu_testkit::{artifacts, SimEnv};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// Generous: a test never fails because the machine is slow.
const PATIENCE: Duration = Duration::from_secs(60);

fn agent_bin() -> &'static str {
    env!("CARGO_BIN_EXE_cgpu-agent")
}

/// A runtime container id unique to this test process and call.
fn container_id() -> String {
    cgpu_testkit::secure::container_id('e')
}

/// The simulated host: the GPU, the ledger directory (the agent makes
/// it), the host's settings directory, the agent, and the cgroups made.
struct Rig {
    sim: SimEnv,
    dir: PathBuf,
    settings: PathBuf,
    agent: Option<SecureAgent>,
    uuid: String,
    cgroups: Cgroups,
    /// The agent's descriptor limit (soft and hard), when one is set.
    nofile: Option<u64>,
}

impl Rig {
    fn new() -> Rig {
        assert!(
            rig::is_root(),
            "the secure-mode tests run as root (cgroups, processes of other uids)"
        );
        let sim = SimEnv::new().gpus("15109:Tesla T4");
        // The tenant's processes must reach the socket: the whole path is
        // searchable by others.
        rig::set_mode(&sim.state_dir, 0o755);
        let dir = sim.state_dir.join("ledger");
        let settings = sim.state_dir.join("containers");
        std::fs::create_dir_all(&settings).unwrap();
        rig::set_mode(&settings, 0o755);
        let cgroups = Cgroups::new(&format!(
            "cgpu-test-{}-{}",
            std::process::id(),
            sim.state_dir.file_name().unwrap().to_string_lossy()
        ));
        let mut r = Rig {
            sim,
            dir,
            settings,
            agent: None,
            uuid: String::new(),
            cgroups,
            nofile: None,
        };
        r.start_agent(&[]);
        r
    }

    fn agent_command(&self, extra: &[&str]) -> Command {
        let mut c = rig::secure_agent_command(
            self.sim.command(agent_bin()),
            &self.dir,
            &self.settings,
            "1s",
        );
        c.args(extra);
        if let Some(n) = self.nofile {
            let r = libc::rlimit {
                rlim_cur: n,
                rlim_max: n,
            };
            // SAFETY: only setrlimit between fork and exec (async-signal-safe).
            unsafe {
                c.pre_exec(move || {
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &r) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        c
    }

    /// Starts the agent and waits until it serves; its log lines so far.
    fn start_agent(&mut self, extra: &[&str]) -> Vec<String> {
        let agent = SecureAgent::start(&mut self.agent_command(extra), PATIENCE)
            .unwrap_or_else(|lines| panic!("cgpu-agent --secure did not start: {lines:?}"));
        for l in &agent.started {
            if let Some(rest) = l.strip_prefix("cgpu-agent: secure: GPU 0 ") {
                self.uuid = rest.split(':').next().unwrap().to_string();
            }
        }
        let lines = agent.started.clone();
        self.agent = Some(agent);
        lines
    }

    fn kill_agent(&mut self) {
        self.agent = None;
    }

    fn sock(&self) -> PathBuf {
        self.dir.join("agent.sock")
    }

    fn ledger(&self) -> Ledger {
        Ledger::open(&Ledger::live_path(&self.dir, &self.uuid)).expect("open the ledger")
    }

    /// What the ledger counts for container `id` (by its name, the
    /// container id's first 12 digits), 0 without a row.
    fn used(&self, id: &str) -> u64 {
        rig::row_used(&self.ledger(), id)
    }

    /// The host's settings for a container, written by `cgpuctl settings`
    /// as root (as an operator does).
    fn settings_for(&self, id: &str, kv: &[&str]) {
        rig::host_settings(&self.settings, id, kv, Some(&self.dir)).unwrap();
    }

    /// The cgroup of container `id`.
    fn cgroup(&mut self, id: &str) -> PathBuf {
        self.cgroups.make(id)
    }

    /// A client process of uid 65534, in container `id` when given (else a
    /// host process).
    fn client(&mut self, id: Option<&str>) -> Client {
        let mut c = Command::new(agent_bin());
        rig::as_nobody(&mut c);
        self.client_from(c, id)
    }

    /// A client process of root in container `id` that reaches the
    /// simulated GPU (it may `exec` a program that uses it).
    fn gpu_client(&mut self, id: &str) -> Client {
        let c = self.sim.command(agent_bin());
        self.client_from(c, Some(id))
    }

    fn client_from(&mut self, mut c: Command, id: Option<&str>) -> Client {
        c.arg("client")
            .arg(self.sock())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let child = c.spawn().expect("spawn the client");
        if let Some(id) = id {
            rig::enter(&self.cgroups.make(id), child.id());
        }
        AgentClient::new(child, PATIENCE)
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.kill_agent();
    }
}

/// A client process (`cgpu-agent client`).
type Client = AgentClient;

/// A request's bytes with the GPU field `gpu` as given, unchecked.
fn raw_request(op: u16, seq: u64, gpu: &[u8], bytes: u64) -> String {
    let mut b = [0u8; REQUEST_LEN];
    b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    b[4..6].copy_from_slice(&VERSION.to_le_bytes());
    b[6..8].copy_from_slice(&op.to_le_bytes());
    b[8..16].copy_from_slice(&seq.to_le_bytes());
    b[16..24].copy_from_slice(&bytes.to_le_bytes());
    b[24..24 + gpu.len()].copy_from_slice(gpu);
    hex(&b)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn a_tenant_gets_what_the_host_allows_and_nothing_more() {
    let mut rig = Rig::new();
    let (a, b) = (container_id(), container_id());
    rig.settings_for(&a, &["ALIYUN_COM_GPU_MEM_CONTAINER=1"]);
    rig.settings_for(&b, &["ALIYUN_COM_GPU_MEM_CONTAINER=2"]);
    let gpu = rig.uuid.clone();
    let mut ca = rig.client(Some(&a));
    let mut cb = rig.client(Some(&b));

    // Before Hello nothing is charged.
    assert_eq!(ca.ask(&format!("reserve {gpu} 1024")).status, "NotJoined");
    let h = ca.ask(&format!("hello {gpu}"));
    assert_eq!(
        (h.status.as_str(), h.used, h.quota),
        ("Ok", 0, GIB),
        "{h:?}"
    );
    let r = ca.ask(&format!("reserve {gpu} {}", 512 * MIB));
    assert_eq!((r.status.as_str(), r.used), ("Ok", 512 * MIB));
    // Past the host's quota: refused, nothing charged.
    let r = ca.ask(&format!("reserve {gpu} {}", 600 * MIB));
    assert_eq!((r.status.as_str(), r.used), ("OverQuota", 512 * MIB));
    assert_eq!(rig.used(&a), 512 * MIB);

    assert_eq!(cb.ask(&format!("hello {gpu}")).quota, 2 * GIB);
    assert_eq!(cb.ask(&format!("reserve {gpu} {}", GIB)).status, "Ok");
    // Giving back more than it holds gives back only what it holds: the
    // other container's bytes stay counted.
    let r = ca.ask(&format!("release {gpu} {}", 4 * GIB));
    assert_eq!((r.status.as_str(), r.used), ("Ok", 0));
    assert_eq!(rig.used(&a), 0);
    assert_eq!(rig.used(&b), GIB);

    // A GPU the agent does not serve.
    let none = "GPU-00000000-0000-0000-0000-000000000000";
    assert_eq!(ca.ask(&format!("hello {none}")).status, "NoGpu");

    // A process outside any container, and a container the host gave no
    // settings: refused, whatever they say.
    let mut host = rig.client(None);
    assert_eq!(host.ask(&format!("hello {gpu}")).status, "Unknown");
    let mut stranger = rig.client(Some(&container_id()));
    assert_eq!(stranger.ask(&format!("hello {gpu}")).status, "Unknown");
    assert_eq!(
        stranger.ask(&format!("reserve {gpu} 1")).status,
        "NotJoined"
    );
    assert_eq!(rig.used(&b), GIB);
}

#[test]
fn malformed_messages_are_refused_and_end_the_connection() {
    let mut rig = Rig::new();
    let a = container_id();
    rig.settings_for(&a, &["ALIYUN_COM_GPU_MEM_CONTAINER=1"]);
    let gpu = rig.uuid.clone();
    let good = raw_request(1, 7, gpu.as_bytes(), 0);
    let cases: Vec<(&str, String)> = vec![
        ("a path for a GPU", raw_request(1, 7, b"../../x", 0)),
        (
            "a truncated request",
            good[..2 * (REQUEST_LEN - 1)].to_string(),
        ),
        ("a request and a byte more", format!("{good}00")),
        ("an unknown operation", raw_request(9, 7, gpu.as_bytes(), 0)),
        ("another version", {
            let mut b = good.clone();
            b.replace_range(8..12, "0200");
            b
        }),
        ("reserved bytes set", {
            let mut b = good.clone();
            b.replace_range(2 * REQUEST_LEN - 2.., "01");
            b
        }),
        ("no magic", format!("00{}", &good[2..])),
    ];
    for (what, msg) in cases {
        let mut c = rig.client(Some(&a));
        assert_eq!(c.ask(&format!("hello {gpu}")).status, "Ok", "{what}");
        assert_eq!(
            c.ask(&format!("reserve {gpu} {}", 100 * MIB)).used,
            100 * MIB,
            "{what}"
        );
        let r = c.cmd(&format!("raw {msg}"));
        assert!(r.contains("status=BadRequest"), "{what}: {r}");
        // The connection is over: what it held is back.
        assert_eq!(c.cmd(&format!("reserve {gpu} 1")), "closed", "{what}");
        let t0 = Instant::now();
        while rig.used(&a) != 0 && t0.elapsed() < PATIENCE {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(rig.used(&a), 0, "{what}");
    }
    // A well-formed request sent raw is served.
    let mut c = rig.client(Some(&a));
    assert!(c.cmd(&format!("raw {good}")).contains("status=Ok seq=7"));
}

#[test]
fn a_dying_process_gives_back_at_once() {
    let mut rig = Rig::new();
    let a = container_id();
    rig.settings_for(&a, &["ALIYUN_COM_GPU_MEM_CONTAINER=2"]);
    let gpu = rig.uuid.clone();
    let (mut times, mut exits) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        let mut c = rig.client(Some(&a));
        let l = rig.ledger();
        assert_eq!(c.ask(&format!("hello {gpu}")).status, "Ok");
        let r = c.ask(&format!("reserve {gpu} {}", 700 * MIB));
        assert_eq!((r.status.as_str(), r.used), ("Ok", 700 * MIB));
        let slot = r.process as usize;
        let cs = l.file().processes[slot].container.load(Ordering::Acquire) as usize;
        let used = &l.file().containers[cs].used;
        let t0 = Instant::now();
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(c.child.id() as i32, libc::SIGKILL) };
        while used.load(Ordering::Acquire) != 0 && t0.elapsed() < PATIENCE {
            std::hint::spin_loop();
        }
        times.push(t0.elapsed());
        // How long the kernel took to end it (its sockets close on the way).
        let _ = c.child.wait();
        exits.push(t0.elapsed());
        assert_eq!(used.load(Ordering::Acquire), 0);
        // Its slot is freed right after (the bytes go back first).
        let state = &l.file().processes[slot].state;
        while state.load(Ordering::Acquire) != cgpu_ledger::SLOT_FREE && t0.elapsed() < PATIENCE {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(
            state.load(Ordering::Acquire),
            cgpu_ledger::SLOT_FREE,
            "the process slot is freed with it"
        );
        c.kill();
    }
    times.sort();
    exits.sort();
    eprintln!(
        "SIGKILL to bytes back in the ledger: min {:?}, median {:?}, max {:?} (5 deaths); SIGKILL to the parent reaping the child: median {:?}",
        times[0], times[2], times[4], exits[2]
    );
}

#[test]
fn the_books_are_the_hosts() {
    let mut rig = Rig::new();
    let a = container_id();
    rig.settings_for(&a, &["ALIYUN_COM_GPU_MEM_CONTAINER=1"]);
    let gpu = rig.uuid.clone();
    let path = Ledger::live_path(&rig.dir, &gpu);
    let m = std::fs::metadata(&rig.dir).unwrap();
    assert_eq!((m.uid(), m.mode() & 0o777), (0, 0o755));
    let m = std::fs::metadata(&path).unwrap();
    assert_eq!((m.uid(), m.mode() & 0o777), (0, 0o644));
    let m = std::fs::metadata(rig.sock()).unwrap();
    assert_eq!(m.mode() & 0o777, 0o666);

    let mut c = rig.client(Some(&a));
    assert_eq!(c.ask(&format!("hello {gpu}")).quota, GIB);
    // The agent's first pass has written its status file.
    let t0 = Instant::now();
    while !rig.dir.join("agent.json").exists() && t0.elapsed() < PATIENCE {
        std::thread::sleep(Duration::from_millis(5));
    }
    // The file cannot be opened for writing, nor anything created beside it.
    assert_eq!(
        c.cmd(&format!("open-write {}", path.display())),
        "open errno=13"
    );
    assert_eq!(
        c.cmd(&format!(
            "open-write {}",
            rig.dir.join("agent.json").display()
        )),
        "open errno=13"
    );
    // The shipped tools, run by the tenant, change nothing.
    let tenant = |args: &[&str]| {
        let o = Command::new(artifacts().bin("cgpuctl"))
            .arg("--dir")
            .arg(&rig.dir)
            .args(args)
            .env("CGPU_SETTINGS_DIR", &rig.settings)
            .uid(NOBODY)
            .gid(NOBODY)
            .output()
            .unwrap();
        assert!(
            !o.status.success(),
            "cgpuctl {args:?} as uid {NOBODY} succeeded"
        );
    };
    tenant(&["set", "memsize", "100G", "--container", &a[..12]]);
    tenant(&["set", "default_memsize", "0"]);
    tenant(&["set", "policy", "0"]);
    tenant(&["settings", &a, "ALIYUN_COM_GPU_MEM_CONTAINER=100"]);
    let r = c.ask(&format!("reserve {gpu} {}", 2 * GIB));
    assert_eq!((r.status.as_str(), r.quota), ("OverQuota", GIB));
    assert_eq!(
        rig.ledger().file().header.policy.load(Ordering::Acquire),
        cgpu_ledger::DEFAULT_POLICY
    );
    assert_eq!(
        std::fs::read_to_string(rig.settings.join(format!("{a}.env")))
            .unwrap()
            .trim(),
        "ALIYUN_COM_GPU_MEM_CONTAINER=1"
    );
    // The host's operator changes them (root, on the host).
    rig.settings_for(&a, &["ALIYUN_COM_GPU_MEM_CONTAINER=3"]);
    let r = c.ask(&format!("reserve {gpu} {}", 2 * GIB));
    assert_eq!((r.status.as_str(), r.quota), ("Ok", 3 * GIB));
    let o = Command::new(artifacts().bin("cgpuctl"))
        .arg("--dir")
        .arg(&rig.dir)
        .args(["set", "memsize", "1", "--container", &a[..12]])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let r = c.ask(&format!("reserve {gpu} 1"));
    assert_eq!((r.status.as_str(), r.quota), ("OverQuota", GIB));
    assert_eq!(c.ask(&format!("release {gpu} {}", 2 * GIB)).used, 0);
}

#[test]
fn a_flood_of_connections_is_capped_per_container() {
    let mut rig = Rig::new();
    rig.kill_agent();
    rig.start_agent(&["--max-per-container", "16"]);
    let (a, b) = (container_id(), container_id());
    rig.settings_for(&a, &["ALIYUN_COM_GPU_MEM_CONTAINER=1"]);
    rig.settings_for(&b, &["ALIYUN_COM_GPU_MEM_CONTAINER=1"]);
    let gpu = rig.uuid.clone();
    let mut flood = rig.client(Some(&a));
    assert_eq!(flood.ask(&format!("hello {gpu}")).status, "Ok");
    // 1 connection held, 15 more allowed, the rest closed on arrival.
    assert_eq!(flood.cmd("flood 200"), "flood answered=15 refused=185");
    // Another container is served as before, and so is the flooder's
    // first connection.
    let mut other = rig.client(Some(&b));
    assert_eq!(other.ask(&format!("hello {gpu}")).status, "Ok");
    assert_eq!(other.ask(&format!("reserve {gpu} {}", MIB)).used, MIB);
    assert_eq!(flood.ask(&format!("reserve {gpu} {}", MIB)).used, MIB);
    // Closed, they free their places.
    assert_eq!(flood.cmd("unflood"), "unflooded");
    let t0 = Instant::now();
    loop {
        let l = flood.cmd("flood 1");
        if l == "flood answered=1 refused=0" || t0.elapsed() > PATIENCE {
            assert_eq!(l, "flood answered=1 refused=0");
            break;
        }
        flood.cmd("unflood");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// CPU time (clock ticks) the agent's server thread has used so far.
fn server_ticks(pid: u32) -> u64 {
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).expect("the agent's threads") {
        let t = t.unwrap().path();
        let comm = std::fs::read_to_string(t.join("comm")).unwrap_or_default();
        if comm.trim() != "cgpu-secure" {
            continue;
        }
        let stat = std::fs::read_to_string(t.join("stat")).unwrap();
        let rest = &stat[stat.rfind(')').unwrap() + 1..];
        let f: Vec<u64> = rest
            .split_whitespace()
            .skip(11)
            .take(2)
            .map(|v| v.parse().unwrap())
            .collect();
        return f[0] + f[1];
    }
    panic!("the agent has no cgpu-secure thread");
}

/// Out of descriptors, the agent leaves its queued connections waiting
/// (it does not spin on a listening socket it cannot accept from) and
/// serves again once descriptors are free.
#[test]
fn out_of_descriptors_the_agent_waits_and_recovers() {
    let mut rig = Rig::new();
    rig.kill_agent();
    rig.nofile = Some(48);
    rig.start_agent(&[]);
    let a = container_id();
    rig.settings_for(&a, &["ALIYUN_COM_GPU_MEM_CONTAINER=1"]);
    // More connections than the agent has descriptors: the rest stay
    // queued (the backlog holds them; connect returns at once).
    let sock = rig.sock();
    let mut held = Vec::new();
    for _ in 0..120 {
        held.push(cgpu_ledger::wire::connect(&sock, None).expect("connect"));
    }
    let pid = rig.agent.as_ref().unwrap().id();
    std::thread::sleep(Duration::from_millis(500));
    let t0 = server_ticks(pid);
    std::thread::sleep(Duration::from_secs(2));
    let used = server_ticks(pid) - t0;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    // A loop that spins uses the CPU it gets (a core's worth, less what
    // other work takes); one that waits, a few wake-ups.
    assert!(
        used * 10 < hz * 2,
        "the server thread used {used} ticks of CPU in 2 s (at {hz}/s) while out of descriptors"
    );
    drop(held);
    let gpu = rig.uuid.clone();
    let mut c = rig.client(Some(&a));
    assert_eq!(c.ask(&format!("hello {gpu}")).status, "Ok");
}

#[test]
fn a_restarted_agent_keeps_the_rows_of_running_processes() {
    let mut rig = Rig::new();
    let a = container_id();
    rig.settings_for(&a, &["ALIYUN_COM_GPU_MEM_CONTAINER=2"]);
    let gpu = rig.uuid.clone();
    let mut stays = rig.client(Some(&a));
    let mut dies = rig.client(Some(&a));
    let mut late = rig.client(Some(&a));
    assert_eq!(stays.ask(&format!("hello {gpu}")).status, "Ok");
    let r = stays.ask(&format!("reserve {gpu} {}", 300 * MIB));
    let slot = r.process;
    assert_eq!(dies.ask(&format!("hello {gpu}")).status, "Ok");
    assert_eq!(
        dies.ask(&format!("reserve {gpu} {}", 100 * MIB)).used,
        400 * MIB
    );
    assert_eq!(late.ask(&format!("hello {gpu}")).status, "Ok");
    assert_eq!(
        late.ask(&format!("reserve {gpu} {}", 50 * MIB)).used,
        450 * MIB
    );

    rig.kill_agent();
    // The connections went with the agent; the books did not.
    assert_eq!(stays.cmd(&format!("reserve {gpu} 1")), "closed");
    assert_eq!(rig.used(&a), 450 * MIB);
    dies.kill();

    let log = rig.start_agent(&[]);
    assert!(
        log.iter()
            .any(|l| l.contains("2 rows of running processes taken over")),
        "{log:?}"
    );
    // The dead process's bytes are back; the live ones' stay counted.
    assert_eq!(rig.used(&a), 350 * MIB);
    // One that ends before it says Hello again gives back too.
    late.kill();
    let t0 = Instant::now();
    while rig.used(&a) != 300 * MIB && t0.elapsed() < PATIENCE {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(rig.used(&a), 300 * MIB);
    // It says Hello again on a new connection and gets its row back.
    assert_eq!(stays.cmd("reconnect"), "connected");
    let h = stays.ask(&format!("hello {gpu}"));
    assert_eq!(
        (h.status.as_str(), h.used, h.process),
        ("Ok", 300 * MIB, slot)
    );
    let r = stays.ask(&format!("release {gpu} {}", 300 * MIB));
    assert_eq!(r.used, 0);
}

#[test]
fn a_directory_others_can_write_is_refused() {
    let sim = SimEnv::new().gpus("15109:Tesla T4");
    let dir = sim.state_dir.join("open");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let o = sim
        .command(agent_bin())
        .args(["--secure", "--ledger-dir"])
        .arg(&dir)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("writable by others"), "{err}");
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "nothing made there"
    );
}

#[test]
fn cgpu_smi_says_which_mode_the_gpus_are_in() {
    let mut rig = Rig::new();
    let smi = |rig: &Rig| {
        let o = Command::new(artifacts().bin("cgpu-smi"))
            .arg("--dir")
            .arg(&rig.dir)
            .arg("--json")
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["gpus"][0]["gpu"]["uuid"], rig.uuid.as_str());
        v["mode"].as_str().unwrap().to_string()
    };
    assert_eq!(smi(&rig), "secure");
    rig.kill_agent();
    // The socket is still there; nobody answers on it. The books are still
    // the agent's: allocations wait for it, and the tools say so.
    assert!(rig.sock().exists());
    assert_eq!(smi(&rig), "secure (agent not answering)");
}

#[test]
fn a_reader_s_locks_do_not_stall_the_agent() {
    let mut rig = Rig::new();
    let (a, b) = (container_id(), container_id());
    rig.settings_for(&a, &["ALIYUN_COM_GPU_MEM_CONTAINER=1"]);
    rig.settings_for(&b, &["ALIYUN_COM_GPU_MEM_CONTAINER=1"]);
    let gpu = rig.uuid.clone();
    let path = Ledger::live_path(&rig.dir, &gpu);
    let locks = Ledger::lock_file_path(&path);
    let m = std::fs::metadata(&locks).unwrap();
    assert_eq!((m.uid(), m.mode() & 0o777), (0, 0o600));
    // A tenant holds a read lock on the whole ledger (the table lock's
    // bytes and every process slot's among them) and cannot open the
    // agent's lock file.
    let mut locker = rig.client(Some(&a));
    assert_eq!(
        locker.cmd(&format!("lock-read {}", path.display())),
        "locked"
    );
    assert_eq!(
        locker.cmd(&format!("lock-read {}", locks.display())),
        "lock errno=13"
    );
    for _ in 0..3 {
        let mut c = rig.client(Some(&b));
        assert_eq!(c.ask(&format!("hello {gpu}")).status, "Ok");
        assert_eq!(
            c.ask(&format!("reserve {gpu} {}", 100 * MIB)).used,
            100 * MIB
        );
        c.kill();
        let t0 = Instant::now();
        while rig.used(&b) != 0 && t0.elapsed() < PATIENCE {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(rig.used(&b), 0);
    }
}

/// Not a timing assertion: prints what a round trip to the agent costs
/// here, and checks that every one was served and the books are back.
#[test]
fn round_trips_are_served_and_timed() {
    let mut rig = Rig::new();
    let a = container_id();
    rig.settings_for(&a, &["ALIYUN_COM_GPU_MEM_CONTAINER=1"]);
    let gpu = rig.uuid.clone();
    let mut c = rig.client(Some(&a));
    assert_eq!(c.ask(&format!("hello {gpu}")).status, "Ok");
    let out = c.cmd(&format!("bench {gpu} 5000"));
    assert!(out.starts_with("bench n=10000 bad=0 "), "{out}");
    assert_eq!(rig.used(&a), 0);
    eprintln!("Reserve or Release round trip through the agent: {out}");
}

/// What the simulated driver says live process `pid` holds.
fn sim_bytes(rig: &Rig, pid: u32) -> u64 {
    rig.sim.live_bytes(pid)
}

/// Waits until the ledger counts `want` for container `id` (at most
/// [`PATIENCE`]); how long it took.
fn wait_used(rig: &Rig, id: &str, want: u64) -> Duration {
    let t0 = Instant::now();
    while rig.used(id) != want && t0.elapsed() < PATIENCE {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(rig.used(id), want, "container {}", &id[..12]);
    t0.elapsed()
}

/// The container named `id[..12]` in the agent's status file once a pass
/// shows `field` == `want` (at most [`PATIENCE`]).
fn status_of(rig: &Rig, id: &str, field: &str, want: u64) -> serde_json::Value {
    let t0 = Instant::now();
    loop {
        let doc: Option<serde_json::Value> = std::fs::read(rig.dir.join("agent.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok());
        let c = doc.and_then(|d| {
            d["gpus"][0]["containers"]
                .as_array()?
                .iter()
                .find(|c| c["container_id"].as_str().is_some_and(|x| x == id))
                .cloned()
        });
        match c {
            Some(c) if c[field] == want => return c,
            c if t0.elapsed() > PATIENCE => panic!("no {field}={want} for {id}: {c:?}"),
            _ => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// The device's truth in the books: a process under the agent holds its
/// context beyond what it was granted, and processes of the same
/// container without the library allocate on the device; the agent
/// charges both to the container's row at its next pass, the row then
/// refuses what its quota no longer holds, and the bytes go back when the
/// processes end. The simulated driver's own books give the numbers.
/// Prints how long each detection took (not asserted).
#[test]
fn what_the_device_shows_and_the_books_do_not_is_charged() {
    let mut rig = Rig::new();
    rig.kill_agent();
    rig.start_agent(&["--interval", "500ms"]);
    let a = container_id();
    rig.settings_for(&a, &["ALIYUN_COM_GPU_MEM_CONTAINER=2"]);
    let gpu = rig.uuid.clone();
    let cuclient = cgpu_testkit::cuclient(cgpu_testkit::LinkMode::Link);

    // A process of the container granted 512 MiB by the agent allocates
    // them on the device: its context (and nothing else) is unseen.
    let mut lib = rig.gpu_client(&a);
    assert_eq!(lib.ask(&format!("hello {gpu}")).status, "Ok");
    assert_eq!(
        lib.ask(&format!("reserve {gpu} {}", 512 * MIB)).used,
        512 * MIB
    );
    lib.send(&format!(
        "exec {} alloc {} hold",
        cuclient.display(),
        512 * MIB
    ));
    let out = lib.until("holding");
    assert!(out.iter().any(|l| l.starts_with("alloc ok")), "{out:?}");
    let lib_dev = sim_bytes(&rig, lib.child.id());
    assert!(lib_dev > 512 * MIB, "the sim counts its context: {lib_dev}");
    wait_used(&rig, &a, lib_dev);
    let c = status_of(&rig, &a, "unseen_charged", lib_dev - 512 * MIB);
    let p = &c["processes"][0];
    assert_eq!(p["ledger_bytes"], 512 * MIB, "{c}");
    assert_eq!(p["unseen_bytes"], lib_dev - 512 * MIB, "{c}");

    // Another of its processes holds 600 MiB it was granted (no device
    // memory yet).
    let mut tenant = rig.client(Some(&a));
    assert_eq!(tenant.ask(&format!("hello {gpu}")).status, "Ok");
    let r = tenant.ask(&format!("reserve {gpu} {}", 600 * MIB));
    assert_eq!((r.status.as_str(), r.used), ("Ok", lib_dev + 600 * MIB));

    // Processes without the library allocate 512 MiB each, one at a
    // time: charged at the agent's next pass.
    let cg = rig.cgroup(&a);
    let mut times = Vec::new();
    for i in 0..4 {
        // Started at different points between two passes.
        std::thread::sleep(Duration::from_millis(125 * i));
        let mut bare = rig
            .sim
            .command("sh")
            .arg("-c")
            .arg(format!(
                "echo $$ > {}/cgroup.procs && exec {} alloc {} hold",
                cg.display(),
                cuclient.display(),
                512 * MIB
            ))
            .env("CUCLIENT_HOLD_MAX_S", "120")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let out = cgpu_testkit::read_until(&mut bare, "holding", PATIENCE);
        let t0 = Instant::now();
        assert!(out.iter().any(|l| l.starts_with("alloc ok")), "{out:?}");
        let bare_dev = sim_bytes(&rig, bare.id());
        assert!(bare_dev >= 512 * MIB, "{bare_dev}");
        let want = lib_dev + 600 * MIB + bare_dev;
        wait_used(&rig, &a, want);
        times.push(t0.elapsed());
        // Over its quota in the books (the device alone shows less than
        // the quota): refused, and reported as over.
        assert!(lib_dev + bare_dev <= 2 * GIB && want > 2 * GIB);
        let r = tenant.ask(&format!("reserve {gpu} {MIB}"));
        assert_eq!((r.status.as_str(), r.used), ("OverQuota", want));
        let c = status_of(&rig, &a, "unseen_charged", lib_dev - 512 * MIB + bare_dev);
        assert_eq!(c["over_in_books"], true, "{c}");
        assert_eq!(c["over"], true, "{c}");
        assert!(c["device_bytes"].as_u64().unwrap() <= 2 * GIB, "{c}");
        assert_eq!(c["ledger_used"], want, "{c}");
        let p = c["processes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["pid"] == bare.id())
            .cloned()
            .unwrap();
        assert_eq!(
            (&p["registered"], &p["unseen_bytes"]),
            (&false.into(), &bare_dev.into()),
            "{c}"
        );
        // cgpu-smi (root, on the host) shows it too.
        let o = Command::new(artifacts().bin("cgpu-smi"))
            .arg("--dir")
            .arg(&rig.dir)
            .arg("--json")
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let seen = v["agent"]["containers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["id"] == c["name"])
            .cloned()
            .unwrap_or_else(|| panic!("{v}"));
        assert_eq!(
            seen["unseen_bytes"],
            lib_dev - 512 * MIB + bare_dev,
            "{seen}"
        );
        let o = Command::new(artifacts().bin("cgpu-smi"))
            .arg("--dir")
            .arg(&rig.dir)
            .output()
            .unwrap();
        let table = String::from_utf8_lossy(&o.stdout);
        let line = format!(
            "{} MiB unseen by the library, charged by cgpu-agent",
            (lib_dev - 512 * MIB + bare_dev) / MIB
        );
        assert!(table.contains(&line), "{line:?} not in\n{table}");

        // It ends: its part goes back at the next pass.
        let _ = bare.kill();
        let _ = bare.wait();
        wait_used(&rig, &a, lib_dev + 600 * MIB);
        assert_eq!(tenant.ask(&format!("reserve {gpu} {MIB}")).status, "Ok");
        assert_eq!(tenant.ask(&format!("release {gpu} {MIB}")).status, "Ok");
    }
    times.sort();
    eprintln!(
        "memory the library cannot see (a process without it allocating 512 MiB) to the agent's charge in the books, --interval 500ms: min {:?}, median {:?}, max {:?} ({} runs)",
        times[0],
        times[times.len() / 2],
        times[times.len() - 1],
        times.len()
    );

    // The agent restarts: the rows of running processes are taken over
    // and what the device shows beyond them is charged again before the
    // new agent serves anyone.
    rig.kill_agent();
    rig.start_agent(&["--interval", "500ms"]);
    assert_eq!(rig.used(&a), lib_dev + 600 * MIB);
    assert_eq!(tenant.cmd("reconnect"), "connected");
    assert_eq!(
        tenant.ask(&format!("hello {gpu}")).used,
        lib_dev + 600 * MIB
    );

    // The process under the agent ends: what it was granted goes back at
    // once, its context at the next pass; the tenant's 600 MiB stay.
    lib.kill();
    wait_used(&rig, &a, 600 * MIB);
    assert_eq!(tenant.ask(&format!("release {gpu} {}", 600 * MIB)).used, 0);
}

/// The status file now, if there is a whole one.
fn status(rig: &Rig) -> Option<serde_json::Value> {
    std::fs::read(rig.dir.join("agent.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
}

/// The device's own per-process time, as the agent reads it (NVML's
/// per-process utilization, integrated over its passes), per container:
/// a process of the container without the library runs 200 kernels of
/// 2 ms, one at a time with 8 ms pauses; the agent's number for the
/// container is the simulated driver's own count for that process, to
/// within the rounding of NVML's percentages. Prints both.
#[test]
fn the_device_time_of_a_container_is_reported() {
    let mut rig = Rig::new();
    rig.kill_agent();
    rig.start_agent(&["--interval", "200ms"]);
    let a = container_id();
    rig.settings_for(&a, &["ALIYUN_COM_GPU_MEM_CONTAINER=2"]);
    let cuclient = cgpu_testkit::cuclient(cgpu_testkit::LinkMode::Link);
    let cg = rig.cgroup(&a);
    // Where the agent's last pass before the process ended: the process's
    // first period starts after it.
    let t0 = Instant::now();
    let before = loop {
        if let Some(t) = status(&rig).and_then(|d| d["time_ns"].as_u64()) {
            break t;
        }
        assert!(t0.elapsed() < PATIENCE, "no status");
        std::thread::sleep(Duration::from_millis(5));
    };
    // Synchronised one by one with pauses: the device is busy a fifth of
    // the time, so no sample period is ever full (a full one is capped at
    // 100 % and says less than the device ran).
    let work = " spin 2000000 1 sleep 8".repeat(200);
    let mut bare = rig
        .sim
        .command("sh")
        .arg("-c")
        .arg(format!(
            "echo $$ > {}/cgroup.procs && exec {} alloc {}{work} hold",
            cg.display(),
            cuclient.display(),
            MIB
        ))
        .env("CUCLIENT_HOLD_MAX_S", "120")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = cgpu_testkit::read_until(&mut bare, "holding", PATIENCE);
    assert_eq!(
        out.iter().filter(|l| l.starts_with("spin ok")).count(),
        200,
        "{out:?}"
    );
    let done_ns = cgpu_ledger::clock::realtime_ns();
    // Two passes written after the kernels ended: the second one's read
    // of the device began after they ended.
    let t0 = Instant::now();
    let mut after = Vec::new();
    let (c, last) = loop {
        if let Some(d) = status(&rig) {
            let t = d["time_ns"].as_u64().unwrap_or(0);
            if t > done_ns && !after.contains(&t) {
                after.push(t);
            }
            if after.len() >= 2 {
                let c = d["gpus"][0]["containers"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|c| c["container_id"] == a.as_str())
                    .cloned()
                    .unwrap_or_else(|| panic!("{a} not in {d}"));
                break (c, t);
            }
        }
        assert!(t0.elapsed() < PATIENCE, "no status after the kernels");
        std::thread::sleep(Duration::from_millis(20));
    };
    let sim: u64 = rig
        .sim
        .stats()
        .processes
        .iter()
        .filter(|p| p.pid == bare.id())
        .map(|p| p.device_time_ns)
        .sum();
    assert_eq!(sim, 400_000_000, "the sim ran 200 kernels of 2 ms");
    let agent = c["device_time_ns"].as_u64().expect("device_time_ns");
    let p = &c["processes"][0];
    assert_eq!(p["pid"], bare.id());
    assert_eq!(p["device_time_ns"], agent, "{c}");
    // NVML's percentages are whole: each sample period is off by at most
    // half a percent of its length, and the periods lie between the pass
    // before the process began (at most a second before the status file
    // read then said) and the last one read.
    let watched = last - before + 1_000_000_000;
    let slack = watched / 200 + 1_000_000;
    eprintln!(
        "device time of the container: agent {agent} ns (NVML per-process utilization, every 200ms), simulated driver {sim} ns, allowed ±{slack} ns"
    );
    assert!(
        agent + slack >= sim && agent <= sim + slack,
        "agent {agent} ns, sim {sim} ns, ±{slack}: {c}"
    );
    let _ = bare.kill();
    let _ = bare.wait();
}
