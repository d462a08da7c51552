//! Secure mode, the library's side, with real processes under
//! `LD_PRELOAD` against the simulated driver, run as an unprivileged uid
//! (65534) in a ledger directory only root writes, beside an agent that
//! speaks the wire protocol (`cgpu_ledger::wire`) on `agent.sock`: the
//! quota holds exactly, frees give back, a killed process's bytes come
//! back, an agent that goes away refuses allocations with one clear error
//! and heals when one is back, a tenant cannot write the books, and the
//! library never writes its read-only mapping.
//!
//! The agent here is a small server of the protocol: it keeps a container's
//! row in a real ledger file (root's, mode 0644) through the ledger's own
//! `join`/`try_reserve`/`release`, and gives back what a connection held
//! when it closes.

mod interpose_common;

use cgpu::ledger::wire::{Op, Reply, Status, SOCKET_NAME};
use cgpu::ledger::Ledger;
use cgpu_testkit::secure::{self as rig, Cgroups, Row, SecureAgent, NOBODY};
use cgpu_testkit::LinkMode;
use interpose_common::*;
use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

const T4: &str = "15109:Tesla T4";
const OOM: &str = "err=2";

/// The books the agent keeps: one container on one GPU.
struct Books {
    dir: PathBuf,
    quota: u64,
    /// The container's row, from the first request on.
    row: Option<Row>,
    /// The agent hangs: requests are read, never answered.
    mute: bool,
}

/// A minimal agent: a listening `SOCK_SEQPACKET` socket, one thread per
/// connection.
struct Agent {
    listen: i32,
    conns: Arc<Mutex<Vec<i32>>>,
    books: Arc<Mutex<Books>>,
}

impl Agent {
    fn start(books: Arc<Mutex<Books>>) -> Agent {
        let dir = books.lock().unwrap().dir.clone();
        let path = dir.join(SOCKET_NAME);
        let _ = std::fs::remove_file(&path);
        let listen = rig::listen(&path);
        let conns = Arc::new(Mutex::new(Vec::new()));
        let (c2, b2) = (conns.clone(), books.clone());
        rig::serve_each(listen, move |fd| {
            c2.lock().unwrap().push(fd);
            let b = b2.clone();
            move || serve(fd, b)
        });
        Agent {
            listen,
            conns,
            books,
        }
    }

    /// The agent dies: its listening socket and every connection close;
    /// the socket file stays (as after `SIGKILL`).
    fn kill(self) -> Arc<Mutex<Books>> {
        // SAFETY: our descriptors; shutdown wakes the threads blocked on them.
        unsafe {
            libc::shutdown(self.listen, libc::SHUT_RDWR);
            libc::close(self.listen);
            for fd in self.conns.lock().unwrap().drain(..) {
                libc::shutdown(fd, libc::SHUT_RDWR);
            }
        }
        self.books
    }
}

/// One connection: requests until it closes, then what it held is given back.
fn serve(fd: i32, books: Arc<Mutex<Books>>) {
    let mut held: HashMap<String, u64> = HashMap::new();
    let mut hello = std::collections::HashSet::new();
    while let Some(req) = rig::recv_request(fd) {
        let Ok(req) = req else {
            rig::send_reply(fd, &Reply::refuse(Status::BadRequest, 0));
            break;
        };
        let gpu = req.gpu_str().to_string();
        let mut bk = books.lock().unwrap();
        if bk.mute {
            continue;
        }
        if bk.row.is_none() {
            bk.row = Some(Row::join(&bk.dir, &gpu, 15109 << 20, "tenant", bk.quota));
        }
        let row = bk.row.as_ref().unwrap();
        let (l, m) = (&row.ledger, &row.m);
        let status = match req.op {
            Op::Hello => {
                hello.insert(gpu.clone());
                Status::Ok
            }
            _ if !hello.contains(&gpu) => Status::NotJoined,
            Op::Reserve => match l.try_reserve(m, req.bytes) {
                Ok(()) => {
                    *held.entry(gpu.clone()).or_default() += req.bytes;
                    Status::Ok
                }
                Err(_) => Status::OverQuota,
            },
            // This small agent schedules nothing (as an agent before
            // compute scheduling): the library launches unscheduled.
            Op::Sched => Status::BadRequest,
            Op::Release => {
                let h = held.entry(gpu.clone()).or_default();
                let take = req.bytes.min(*h);
                *h -= take;
                l.release(m, take);
                Status::Ok
            }
        };
        rig::send_reply(fd, &row.reply(status, req.seq));
    }
    if let Some(row) = books.lock().unwrap().row.as_ref() {
        for (_, b) in held {
            row.ledger.release(&row.m, b);
        }
    }
    // SAFETY: our connection.
    unsafe { libc::close(fd) };
}

/// A machine in secure mode: the ledger directory root's, mode 0755, the
/// sim's state writable by the tenant.
fn secure_machine(name: &str, quota: u64) -> (Machine, Agent) {
    let m = Machine::new(name, T4);
    for d in [&m.root, &m.ledger] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::set_permissions(&m.state, std::fs::Permissions::from_mode(0o777)).unwrap();
    let books = Arc::new(Mutex::new(Books {
        dir: m.ledger.clone(),
        quota,
        row: None,
        mute: false,
    }));
    let agent = Agent::start(books);
    (m, agent)
}

/// cuclient as the tenant (uid 65534), no cgpu settings in its environment
/// but the sim's context size (0: the quota is the allocations' alone).
fn tenant(m: &Machine, args: &[&str]) -> Command {
    let mut c = m.preloaded(
        cgpu_testkit::cuclient(LinkMode::Link),
        &[("CGPU_SIM_CTX_MIB", "0")],
    );
    rig::as_nobody(c.args(args));
    c
}

fn row_used(m: &Machine) -> u64 {
    let l = Ledger::open_read_only(&m.ledger_file().expect("a ledger")).unwrap();
    let c = l.find_container("tenant").expect("the container's row");
    l.file().containers[c].used.load(Ordering::Acquire)
}

/// A running tenant process, killed when dropped.
struct Kid(Child, BufReader<std::process::ChildStdout>);

impl Kid {
    fn spawn(mut c: Command) -> Kid {
        c.stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut ch = c.spawn().expect("spawn tenant");
        let out = BufReader::new(ch.stdout.take().unwrap());
        Kid(ch, out)
    }
    /// The next line of output (panics at EOF).
    fn line(&mut self) -> String {
        let mut l = String::new();
        assert!(
            self.1.read_line(&mut l).unwrap() > 0,
            "tenant ended early: {:?}",
            self.0.try_wait()
        );
        l.trim_end().to_string()
    }
    fn stderr(mut self) -> String {
        let _ = self.0.kill();
        let _ = self.0.wait();
        let mut s = String::new();
        std::io::Read::read_to_string(self.0.stderr.as_mut().unwrap(), &mut s).unwrap();
        s
    }
}

impl Drop for Kid {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_quota_holds_to_the_byte_and_frees_give_back() {
    let q = 64 * MIB;
    let (m, _agent) = secure_machine("quota", q);
    let out = run_ok(&mut tenant(
        &m,
        &[
            "alloc", "33554432", "alloc", "33554432", "alloc", "1", "meminfo", "free", "alloc",
            "1", "free", "free", "meminfo",
        ],
    ));
    let ls: Vec<&str> = out.lines().collect();
    assert!(ls[0].starts_with("alloc ok"), "{out}");
    assert!(ls[1].starts_with("alloc ok"), "up to the quota: {out}");
    assert!(ls[2].ends_with(OOM), "one byte past the quota: {out}");
    assert_eq!(ls[3], format!("meminfo ok free=0 total={q}"), "{out}");
    assert!(ls[5].starts_with("alloc ok"), "a free gives back: {out}");
    assert_eq!(ls[8], format!("meminfo ok free={q} total={q}"), "{out}");
    assert_eq!(row_used(&m), 0, "everything given back");
}

#[test]
fn a_process_killed_gets_its_bytes_back_through_the_agent() {
    let (m, _agent) = secure_machine("kill9", 64 * MIB);
    let mut k = Kid::spawn(tenant(&m, &["alloc", "16777216", "ready", "hold"]));
    assert!(k.line().starts_with("alloc ok"));
    assert_eq!(k.line(), "ready");
    assert_eq!(row_used(&m), 16 * MIB);
    // SAFETY: kill(2) of our child.
    unsafe { libc::kill(k.0.id() as i32, libc::SIGKILL) };
    let _ = k.0.wait();
    assert!(
        eventually(Duration::from_secs(60), || row_used(&m) == 0).is_some(),
        "the bytes came back: {}",
        row_used(&m)
    );
}

#[test]
fn an_agent_gone_refuses_with_one_clear_error_and_heals_when_back() {
    let (m, agent) = secure_machine("heal", 64 * MIB);
    let go1 = m.root.join("go1");
    let go2 = m.root.join("go2");
    let mut k = Kid::spawn(tenant(
        &m,
        &[
            "alloc",
            "4194304",
            "wait_file",
            go1.to_str().unwrap(),
            "alloc",
            "4194304",
            "alloc",
            "4194304",
            "wait_file",
            go2.to_str().unwrap(),
            "alloc",
            "4194304",
            "meminfo",
            "hold",
        ],
    ));
    assert!(k.line().starts_with("alloc ok"));
    let books = agent.kill();
    // The killed agent's connection gave back what it held.
    assert!(eventually(Duration::from_secs(60), || row_used(&m) == 0).is_some());
    std::fs::write(&go1, "").unwrap();
    assert_eq!(k.line(), "wait_file ok");
    assert!(k.line().ends_with(OOM), "refused while the agent is gone");
    assert!(k.line().ends_with(OOM), "refused again");
    let _agent = Agent::start(books);
    std::fs::write(&go2, "").unwrap();
    assert_eq!(k.line(), "wait_file ok");
    assert!(k.line().starts_with("alloc ok"), "healed by itself");
    // What it held (4 MiB) was re-registered with the new agent.
    assert_eq!(
        k.line(),
        format!("meminfo ok free={} total={}", 56 * MIB, 64 * MIB)
    );
    assert_eq!(row_used(&m), 8 * MIB);
    let err = k.stderr();
    let said: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("node agent cannot be reached"))
        .collect();
    assert_eq!(said.len(), 1, "said once:\n{err}");
    assert!(said[0].contains("fix: start the node agent"), "{err}");
    assert!(err.contains("allocations are accepted"), "{err}");
}

/// Process `pid` maps `file` only read-only and shared, and never dirtied
/// a page of it.
fn assert_mapped_read_only(pid: u32, file: &Path) {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let name = file.to_str().unwrap();
    let mut found = 0;
    let mut blocks = maps.split('\n').peekable();
    while let Some(l) = blocks.next() {
        if l.ends_with(name) {
            found += 1;
            let perms = l.split_whitespace().nth(1).unwrap();
            assert_eq!(perms, "r--s", "{l}");
            while let Some(f) = blocks.peek() {
                if f.starts_with("Private_Dirty:") {
                    assert!(f.ends_with(" 0 kB"), "{f}");
                }
                if f.starts_with("VmFlags") {
                    break;
                }
                blocks.next();
            }
        }
    }
    assert!(found >= 1, "the ledger is mapped:\n{maps}");
}

/// A tenant (uid 65534) that writes `file` is refused by the kernel.
fn assert_tenant_cannot_write(file: &Path) {
    let o = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "printf xxxx | dd of={} conv=notrunc bs=1 seek=64",
            file.display()
        ))
        .uid(NOBODY)
        .gid(NOBODY)
        .output()
        .unwrap();
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("Permission denied"), "{err}");
}

#[test]
fn a_tenant_cannot_write_the_books_and_the_mapping_is_read_only() {
    let (m, _agent) = secure_machine("readonly", 64 * MIB);
    let mut k = Kid::spawn(tenant(
        &m,
        &[
            "alloc", "8388608", "meminfo", "free", "alloc", "4194304", "spin", "100000", "20",
            "ready", "hold",
        ],
    ));
    let mut seen = Vec::new();
    loop {
        let l = k.line();
        if l == "ready" {
            break;
        }
        assert!(!l.contains("err="), "{l}");
        seen.push(l);
    }
    let file = m.ledger_file().unwrap();
    assert_mapped_read_only(k.0.id(), &file);
    // A tenant that writes the file is refused, and the books do not move.
    let before = std::fs::read(&file).unwrap();
    assert_tenant_cannot_write(&file);
    let after = std::fs::read(&file).unwrap();
    assert!(before == after, "the books moved");
    assert_eq!(row_used(&m), 4 * MIB);
}

#[test]
fn a_forked_child_does_not_keep_its_parents_connection() {
    let (m, _agent) = secure_machine("fork", 64 * MIB);
    let mut k = Kid::spawn(tenant(
        &m,
        &["alloc", "16777216", "fork_sleep", "120", "ready", "hold"],
    ));
    assert!(k.line().starts_with("alloc ok"));
    let child: i32 = k
        .line()
        .split("child=")
        .nth(1)
        .and_then(|c| c.parse().ok())
        .expect("fork_sleep ok child=<pid>");
    assert_eq!(k.line(), "ready");
    assert_eq!(row_used(&m), 16 * MIB);
    // SAFETY: kill(2) of our child, then of its child.
    unsafe { libc::kill(k.0.id() as i32, libc::SIGKILL) };
    let _ = k.0.wait();
    let back = eventually(Duration::from_secs(60), || row_used(&m) == 0);
    // The grandchild still lives: it must not have kept the connection open.
    let alive = Path::new(&format!("/proc/{child}")).exists();
    // SAFETY: as above.
    unsafe { libc::kill(child, libc::SIGKILL) };
    assert!(alive, "the forked child lived through the check");
    assert!(
        back.is_some(),
        "the parent's bytes came back while its child lives"
    );
}

// ------------------------------------------------ against `cgpu-agent --secure`

/// The node agent itself on a machine: the ledger directory is its (root,
/// 0755), the host's settings directory names the container's quota, and
/// the tenant runs in a cgroup named by its container id (how the agent
/// finds its container).
struct Host {
    m: Machine,
    settings: PathBuf,
    agent: Option<SecureAgent>,
    /// The container's cgroup, in a tree of the test's own.
    cgroup: PathBuf,
    _cgroups: Cgroups,
    id: String,
}

static GO: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

impl Host {
    fn new(name: &str, gib: &str) -> Host {
        let m = Machine::new(name, T4);
        std::fs::set_permissions(&m.root, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&m.ledger, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&m.state, std::fs::Permissions::from_mode(0o777)).unwrap();
        let settings = m.root.join("containers");
        std::fs::create_dir_all(&settings).unwrap();
        let id = format!("{:08x}{}", std::process::id(), "5".repeat(56));
        let cgroups = Cgroups::new(&format!("cgpu-secure-lib-{}-{name}", std::process::id()));
        let cgroup = cgroups.make(&id);
        rig::host_settings(
            &settings,
            &id,
            &[&format!("ALIYUN_COM_GPU_MEM_CONTAINER={gib}")],
            None,
        )
        .unwrap();
        let mut h = Host {
            m,
            settings,
            agent: None,
            cgroup,
            _cgroups: cgroups,
            id,
        };
        h.start_agent();
        h
    }

    fn start_agent(&mut self) {
        let mut c = rig::secure_agent_command(
            self.m
                .bare(cgpu_testkit::artifacts().profile_dir.join("cgpu-agent")),
            &self.m.ledger,
            &self.settings,
            "1s",
        );
        let a = SecureAgent::start(&mut c, Duration::from_secs(120))
            .unwrap_or_else(|log| panic!("the agent ended: {log:?}"));
        self.agent = Some(a);
        // The simulated device's state, which the agent (root) opened first,
        // stays the tenant's to use too (a real device node is everyone's).
        rig::share_tree(&self.m.state);
    }

    fn kill_agent(&mut self) {
        self.agent = None;
    }

    /// A tenant process in the container: it waits for `go` before its
    /// first CUDA call, so that it is in the container's cgroup first.
    fn tenant(&self, args: &[&str]) -> Kid {
        let go = self
            .m
            .root
            .join(format!("go-{}", GO.fetch_add(1, Ordering::Relaxed)));
        let mut all = vec!["wait_file", go.to_str().unwrap()];
        all.extend_from_slice(args);
        let mut k = Kid::spawn(tenant(&self.m, &all));
        rig::enter(&self.cgroup, k.0.id());
        std::fs::write(&go, "").unwrap();
        assert_eq!(k.line(), "wait_file ok");
        k
    }

    /// What the ledger counts for the container (its row is named by the
    /// id's first 12 digits).
    fn used(&self) -> u64 {
        let Some(f) = self.m.ledger_file() else {
            return 0;
        };
        rig::row_used(&Ledger::open_read_only(&f).unwrap(), &self.id)
    }
}

impl Drop for Host {
    fn drop(&mut self) {
        self.kill_agent();
    }
}

#[test]
fn with_the_node_agent_the_quota_holds_survives_its_restart_and_a_kill_gives_back() {
    let mut h = Host::new("real", "1");
    let go2 = h.m.root.join("go2");
    let go3 = h.m.root.join("go3");
    let mut k = h.tenant(&[
        "alloc",
        "1073741824",
        "alloc",
        "1",
        "meminfo",
        "free",
        "alloc",
        "536870912",
        "nvml_meminfo",
        "alloc",
        "268435456",
        "ready",
        "wait_file",
        go2.to_str().unwrap(),
        "alloc",
        "4194304",
        "free",
        "wait_file",
        go3.to_str().unwrap(),
        "alloc",
        "4194304",
        "meminfo",
        "ready",
        "hold",
    ]);
    let first = k.line();
    if !first.starts_with("alloc ok") {
        panic!("the whole quota: {first}\n{}", k.stderr());
    }
    assert!(k.line().ends_with(OOM), "one byte past it");
    assert_eq!(k.line(), format!("meminfo ok free=0 total={GIB}"));
    assert_eq!(k.line(), "free ok");
    assert!(k.line().starts_with("alloc ok"));
    let nv = k.line();
    assert_eq!(
        (
            cgpu_testkit::num(&nv, "nvml_meminfo", "total"),
            cgpu_testkit::num(&nv, "nvml_meminfo", "free")
        ),
        (GIB, 512 * MIB),
        "NVML shows the container's row: {nv}"
    );
    assert!(k.line().starts_with("alloc ok"));
    assert_eq!(k.line(), "ready");
    assert_eq!(h.used(), 768 * MIB, "frees gave back");

    // The agent dies: refused, with the clear error; the books keep what
    // the running process holds.
    h.kill_agent();
    std::fs::write(&go2, "").unwrap();
    assert_eq!(k.line(), "wait_file ok");
    assert!(k.line().ends_with(OOM), "refused without the agent");
    assert_eq!(k.line(), "free ok", "a free while it is away");
    assert_eq!(
        h.used(),
        768 * MIB,
        "the books keep the running process's row"
    );

    // Back: healed; what the process holds is counted once, and what it
    // freed meanwhile is given back.
    h.start_agent();
    std::fs::write(&go3, "").unwrap();
    assert_eq!(k.line(), "wait_file ok");
    assert!(k.line().starts_with("alloc ok"), "healed by itself");
    assert_eq!(
        k.line(),
        format!("meminfo ok free={} total={GIB}", GIB - 516 * MIB)
    );
    assert_eq!(k.line(), "ready");
    assert_eq!(h.used(), 516 * MIB);
    // The agent's books: mapped read-only by the tenant, never dirtied, and
    // not writable by it.
    let file = h.m.ledger_file().unwrap();
    assert_mapped_read_only(k.0.id(), &file);
    assert_tenant_cannot_write(&file);
    assert_eq!(h.used(), 516 * MIB);
    // Another process of the container that only looks (NVML, no CUDA)
    // sees the container's use.
    let mut v = h.tenant(&["nvml_meminfo"]);
    let nv = v.line();
    assert_eq!(
        cgpu_testkit::num(&nv, "nvml_meminfo", "free"),
        GIB - 516 * MIB,
        "{nv}"
    );

    // SIGKILL: the agent gives its bytes back.
    // SAFETY: kill(2) of our child.
    unsafe { libc::kill(k.0.id() as i32, libc::SIGKILL) };
    let _ = k.0.wait();
    assert!(
        eventually(Duration::from_secs(60), || h.used() == 0).is_some(),
        "a killed process's bytes come back: {}",
        h.used()
    );
    let err = k.stderr();
    assert_eq!(
        err.matches("node agent cannot be reached").count(),
        1,
        "one clear error:\n{err}"
    );
}

#[test]
fn frees_not_waited_for_still_show_in_the_next_view() {
    let q = 128 * MIB;
    let (m, _agent) = secure_machine("frees", q);
    let mut args: Vec<&str> = Vec::new();
    for _ in 0..40 {
        args.extend(["alloc", "2097152"]);
    }
    args.extend([
        "meminfo", "freeall", "meminfo", "alloc", "2097152", "meminfo",
    ]);
    let out = run_ok(&mut tenant(&m, &args));
    let ls: Vec<&str> = out.lines().skip(40).collect();
    assert_eq!(
        ls[0],
        format!("meminfo ok free={} total={q}", q - 80 * MIB),
        "{out}"
    );
    assert_eq!(ls[1], "freeall ok n=40", "{out}");
    assert_eq!(ls[2], format!("meminfo ok free={q} total={q}"), "{out}");
    assert!(ls[3].starts_with("alloc ok"), "{out}");
    assert_eq!(
        ls[4],
        format!("meminfo ok free={} total={q}", q - 2 * MIB),
        "{out}"
    );
}

/// The milliseconds between the `clock` lines around line `at` of a
/// cuclient's output (`clock`, the call, `clock`).
fn took_ms(ls: &[&str], at: usize) -> u64 {
    let ms = |l: &str| -> u64 {
        l.strip_prefix("clock ms=")
            .unwrap_or_else(|| panic!("a clock line: {l}"))
            .parse()
            .unwrap()
    };
    ms(ls[at + 1]) - ms(ls[at - 1])
}

/// An agent that accepts connections (the kernel's backlog does) and never
/// answers: the first view of a GPU shows nothing free within a bound,
/// instead of waiting for the agent's answer as long as an allocation does.
#[test]
fn a_view_never_waits_long_on_a_hung_agent() {
    let m = Machine::new("hungview", T4);
    for d in [&m.root, &m.ledger] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::set_permissions(&m.state, std::fs::Permissions::from_mode(0o777)).unwrap();
    let listen = rig::listen(&m.ledger.join(SOCKET_NAME));
    let out = run_ok(&mut tenant(
        &m,
        &[
            "nvml_init",
            "clock",
            "nvml_meminfo",
            "clock",
            "clock",
            "nvml_meminfo",
            "clock",
        ],
    ));
    let ls: Vec<&str> = out.lines().collect();
    let total = 15109 * MIB;
    for at in [2, 5] {
        assert_eq!(
            ls[at],
            format!("nvml_meminfo ok total={total} used={total} free=0"),
            "nothing free until the agent places the process: {out}"
        );
        let ms = took_ms(&ls, at);
        assert!(ms < 1500, "a view waited {ms} ms on the agent: {out}");
    }
    // SAFETY: our descriptor.
    unsafe { libc::close(listen) };
}

/// Frees while the agent hangs return at once (their releases are kept
/// and counted until sent), and so does the next view, which shows the
/// books as the agent last kept them.
#[test]
fn frees_never_wait_long_on_a_hung_agent() {
    let q = 128 * MIB;
    let (m, agent) = secure_machine("hungfree", q);
    let go = m.root.join("go");
    let mut args: Vec<String> = Vec::new();
    for _ in 0..40 {
        args.extend(["alloc".into(), "1048576".into()]);
    }
    args.extend(["wait_file".into(), go.display().to_string()]);
    args.extend(["clock".into(), "freeall".into(), "clock".into()]);
    args.extend(["clock".into(), "meminfo".into(), "clock".into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut kid = Kid::spawn(tenant(&m, &args));
    for _ in 0..40 {
        let l = kid.line();
        assert!(l.starts_with("alloc ok"), "{l}");
    }
    agent.books.lock().unwrap().mute = true;
    std::fs::write(&go, "").unwrap();
    let mut ls = Vec::new();
    for _ in 0..7 {
        ls.push(kid.line());
    }
    let ls: Vec<&str> = ls.iter().map(String::as_str).collect();
    assert_eq!(ls[0], "wait_file ok", "{ls:?}");
    assert_eq!(ls[2], "freeall ok n=40", "{ls:?}");
    let ms = took_ms(&ls, 2);
    assert!(ms < 1500, "40 frees waited {ms} ms on the agent: {ls:?}");
    assert_eq!(
        ls[5],
        format!("meminfo ok free={} total={q}", q - 40 * MIB),
        "{ls:?}"
    );
    let ms = took_ms(&ls, 5);
    assert!(ms < 1500, "a view waited {ms} ms on the agent: {ls:?}");
}

#[test]
fn a_process_started_while_the_agent_is_away_waits_for_it() {
    let (m, agent) = secure_machine("away", 64 * MIB);
    // The agent made its books, then went, its socket with it.
    run_ok(&mut tenant(&m, &["alloc", "4194304"]));
    let books = agent.kill();
    std::fs::remove_file(m.ledger.join(SOCKET_NAME)).unwrap();
    let go = m.root.join("go");
    let mut k = Kid::spawn(tenant(
        &m,
        &[
            "alloc",
            "4194304",
            "wait_file",
            go.to_str().unwrap(),
            "alloc",
            "4194304",
            "ready",
            "hold",
        ],
    ));
    assert!(k.line().ends_with(OOM), "refused, never cooperative");
    let _agent = Agent::start(books);
    std::fs::write(&go, "").unwrap();
    assert_eq!(k.line(), "wait_file ok");
    assert!(
        k.line().starts_with("alloc ok"),
        "healed once the agent serves"
    );
    assert_eq!(k.line(), "ready");
    assert_eq!(row_used(&m), 4 * MIB);
    let err = k.stderr();
    assert!(err.contains("node agent cannot be reached"), "{err}");
}

#[test]
fn a_process_the_node_agent_cannot_place_is_refused_and_told_why() {
    let h = Host::new("stranger", "1");
    // Not in the container's cgroup: the agent does not know its container.
    let o = run(&mut tenant(&h.m, &["alloc", "1048576", "meminfo"]));
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(out.lines().next().unwrap().ends_with(OOM), "{out}\n{err}");
    assert_eq!(
        err.matches("does not know this process's container")
            .count(),
        1,
        "{err}"
    );
    assert!(
        err.contains("fix: give the container its GPU settings on the host"),
        "{err}"
    );
    assert_eq!(h.used(), 0);
}
