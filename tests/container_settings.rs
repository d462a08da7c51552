//! Every process of a container runs under its container's settings, and
//! two containers are never taken for one: real processes under
//! `LD_PRELOAD=libcgpu.so` on the simulated driver, the simulated driver's
//! own per-process books (`cgpu-sim-stat`) as the judge.
//!
//! "Containers" are made as a runtime makes them, with the tools at hand:
//! `unshare` (a PID and a mount namespace of their own, the host's network
//! and hostname: what `hostNetwork: true` pods and `docker --network host`
//! containers look like from inside), and bind mounts of the files a
//! runtime binds in (`/etc/hostname` from `…/containers/<id>/hostname`).
//! Namespaces are made as root, else inside a user namespace of the test's
//! own (`unshare -U -r`; `CGPU_TEST_USERNS=1` asks for that even as root);
//! where neither works, the tests that need them skip with a line saying so.

use cgpu_testkit::{artifacts, cuclient, LinkMode, SimEnv};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// 256 MiB: the allocation chunk.
const CHUNK: &str = "268435456";

/// A simulated T4 with its own ledger directory.
struct Rig {
    sim: SimEnv,
    dir: PathBuf,
}

impl Rig {
    fn new(name: &str) -> Rig {
        Rig::with_gpus(name, "15109:Tesla T4")
    }

    fn with_gpus(name: &str, gpus: &str) -> Rig {
        let sim = SimEnv::new().gpus(gpus);
        let dir = sim.state_dir.join(format!("ledger-{name}"));
        std::fs::create_dir_all(&dir).unwrap();
        Rig { sim, dir }
    }

    /// A command for `program` with only what reaches the driver and the
    /// ledger (the library preloaded, the simulated driver's path and
    /// state, the ledger directory): no setting at all, as after `env -i`
    /// with the library in `/etc/ld.so.preload`.
    fn bare(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new(program);
        c.env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("LD_LIBRARY_PATH", &artifacts().sim_lib_dir)
            .env("CGPU_SIM_STATE", &self.sim.state_dir)
            .env("CGPU_LEDGER_DIR", &self.dir)
            .env("LD_PRELOAD", &artifacts().libcgpu)
            .env("CUCLIENT_HOLD_MAX_S", "60");
        for (k, v) in &self.sim.envs {
            c.env(k, v);
        }
        c.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    }

    /// Device bytes of every live process on the simulated GPU.
    fn device_bytes(&self) -> u64 {
        self.sim
            .stats()
            .processes
            .iter()
            .filter(|p| p.alive)
            .map(|p| p.mem_bytes)
            .sum()
    }
}

/// Reads stdout lines until one starts with `prefix` (or EOF / 60 s).
fn read_until(out: &mut BufReader<ChildStdout>, prefix: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let t0 = Instant::now();
    loop {
        let mut l = String::new();
        if out.read_line(&mut l).unwrap_or(0) == 0 {
            return lines;
        }
        let done = l.starts_with(prefix);
        lines.push(l.trim_end().to_string());
        if done || t0.elapsed() > Duration::from_secs(60) {
            return lines;
        }
    }
}

/// Starts `c`, waits until it prints `holding` (or ends); returns the
/// child (still running when it holds) and its lines.
fn start_holding(mut c: Command, what: &str) -> (Child, Vec<String>) {
    let mut child = c.spawn().unwrap_or_else(|e| panic!("spawn {what}: {e}"));
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let lines = read_until(&mut out, "holding");
    (child, lines)
}

fn stop(mut c: Child) -> String {
    let _ = c.kill();
    let o = c.wait_with_output().unwrap();
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn gib(b: u64) -> f64 {
    b as f64 / GIB as f64
}

/// How this sandbox makes namespaces: `Some(false)` as root, `Some(true)`
/// inside a user namespace of its own (`unshare -U -r`: no root needed,
/// and what `CGPU_TEST_USERNS=1` asks for), `None` not at all.
fn ns_mode() -> Option<bool> {
    static MODE: std::sync::OnceLock<Option<bool>> = std::sync::OnceLock::new();
    *MODE.get_or_init(|| {
        let works = |pre: &[&str]| {
            Command::new("unshare")
                .args(pre)
                .args(["-p", "-f", "-m", "true"])
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
    })
}

/// Can this sandbox make PID and mount namespaces (as root, or in a user
/// namespace)?
fn namespaces_possible() -> bool {
    let ok = ns_mode().is_some();
    if !ok {
        eprintln!("skipped: `unshare -p -f -m` is not possible here (neither as root nor in a user namespace)");
    }
    ok
}

impl Rig {
    /// `unshare` (inside a user namespace of its own where that is how
    /// namespaces are made here), with no settings.
    fn unshare(&self) -> Command {
        let mut c = self.bare("unshare");
        if ns_mode() == Some(true) {
            c.args(["-U", "-r"]);
        }
        c
    }

    /// `nsenter` (into the target's user namespace too, where there is one).
    fn nsenter(&self) -> Command {
        let mut c = self.bare("nsenter");
        if ns_mode() == Some(true) {
            c.arg("-U");
        }
        c
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

/// A container's first process holds 256 MiB of its 1 GiB; a second one
/// of the same container (entered as `docker exec` or `ssh` would) starts
/// with no setting in its environment (the library preloaded the way
/// `/etc/ld.so.preload` does): it runs under the container's quota, and
/// its allocations are refused at it. A process of the host beside them,
/// without settings either, is in no container and passes through.
#[test]
fn a_process_without_settings_runs_under_its_containers() {
    if !namespaces_possible() {
        return;
    }
    let rig = Rig::new("noenv");
    let client = cuclient(LinkMode::Link);
    let mut first = rig.unshare();
    first
        .env("ALIYUN_COM_GPU_MEM_CONTAINER", "1")
        .args(["-p", "-f", "--kill-child"])
        .arg(&client)
        .args(["alloc", "268435456", "hold"]);
    let (p1, l1) = start_holding(first, "first");
    assert!(l1.iter().any(|l| l.starts_with("alloc ok")), "{l1:?}");

    let mut second = rig.nsenter();
    second
        .args(["-t", &only_child(p1.id()).to_string(), "-p", "--"])
        .arg(&client)
        .args(["totalmem", "alloc_until_oom", "134217728", "hold"]);
    let (p2, l2) = start_holding(second, "second");
    let held = rig.device_bytes();
    let mut host = rig.bare(&client);
    host.args(["totalmem", "hold"]);
    let (p3, l3) = start_holding(host, "a host process");
    stop(p3);
    stop(p1);
    let e2 = stop(p2);
    assert!(
        held <= GIB,
        "the container holds {:.2} GiB on the device, its quota is 1 GiB: {l2:?}\n{e2}",
        gib(held)
    );
    let oom = l2
        .iter()
        .find(|l| l.starts_with("alloc_until_oom"))
        .unwrap_or_else(|| panic!("{l2:?}\n{e2}"));
    assert!(oom.contains("err=2"), "refused as out of memory: {oom}");
    // It sees the container's quota as the GPU's size.
    let total = l2.iter().find(|l| l.starts_with("totalmem")).unwrap();
    assert!(total.contains(&format!("bytes={GIB}")), "{total}");
    let total = l3.iter().find(|l| l.starts_with("totalmem")).unwrap();
    assert!(
        total.contains(&format!("bytes={}", 15109 * MIB)),
        "the host's process sees the GPU: {total}"
    );
}

/// A process of a host where no container has settings (no ledger at
/// all) passes through as before.
#[test]
fn a_process_of_a_host_without_settings_passes_through() {
    let rig = Rig::new("none");
    let mut c = rig.bare(cuclient(LinkMode::Link));
    c.args(["alloc", "4294967296", "totalmem", "hold"]);
    let (p, l) = start_holding(c, "bare");
    let e = stop(p);
    assert!(l.iter().any(|l| l.starts_with("alloc ok")), "{l:?}\n{e}");
    let total = l.iter().find(|l| l.starts_with("totalmem")).unwrap();
    assert!(total.contains(&format!("bytes={}", 15109 * MIB)), "{total}");
    assert!(
        std::fs::read_dir(&rig.dir).unwrap().next().is_none(),
        "no ledger was made for a process without settings"
    );
}

/// Two host-network containers (a PID and mount namespace each, the
/// node's hostname in both) with quotas of 2 and 4 GiB keep their own
/// quotas; a process that enters the second one without its environment,
/// and renames its hostname in a UTS namespace of its own, is held to that
/// container's quota.
#[test]
fn two_host_network_containers_made_with_unshare_keep_their_own_quotas() {
    if !namespaces_possible() {
        return;
    }
    let rig = Rig::new("hostnet");
    let client = cuclient(LinkMode::Link);
    let container = |gib: &str| {
        let mut c = rig.unshare();
        c.env("ALIYUN_COM_GPU_MEM_CONTAINER", gib)
            .args(["-p", "-f", "--kill-child", "-m"])
            .arg(&client)
            .args(["alloc_until_oom", CHUNK, "hold"]);
        c
    };
    let (a, la) = start_holding(container("2"), "container A");
    let held_a = rig.device_bytes();
    assert!(
        held_a <= 2 * GIB && held_a > GIB,
        "A holds {:.2} GiB of its 2: {la:?}",
        gib(held_a)
    );
    let (b, lb) = start_holding(container("4"), "container B");
    let held_b = rig.device_bytes() - held_a;
    assert!(
        held_b <= 4 * GIB && held_b > 3 * GIB,
        "B holds {:.2} GiB of its 4 (taken for A, it would get what A left of 2): {lb:?}",
        gib(held_b)
    );

    // Into B's PID and mount namespaces, without B's environment, in a
    // UTS namespace of its own with another hostname.
    let b_pid = only_child(b.id());
    let mut c = rig.nsenter();
    c.args([
        "-t",
        &b_pid.to_string(),
        "-p",
        "-m",
        "--",
        "unshare",
        "-u",
        "sh",
        "-c",
    ])
    .arg(format!(
        "hostname renamed-job && exec {} alloc_until_oom {CHUNK} hold",
        client.display()
    ));
    let (b2, lb2) = start_holding(c, "B's second process");
    let held_b_all = rig.device_bytes() - held_a;
    // Killing B's first process (its PID namespace's init) ends the
    // second one too.
    stop(b);
    let e = stop(b2);
    stop(a);
    assert!(
        held_b_all <= 4 * GIB,
        "container B holds {:.2} GiB with its second process, its quota is 4: {lb2:?}\n{e}",
        gib(held_b_all)
    );
    assert!(
        lb2.iter().any(|l| l.contains("err=2")) || e.contains("out of memory"),
        "the second process was refused: {lb2:?}\n{e}"
    );
}

/// `docker run --network host`: two containers with the node's hostname,
/// each with the hostname, hosts and resolv.conf docker binds in from
/// `/var/lib/docker/containers/<id>/`. The binds name each container; a
/// process that lost the environment lands in its own.
#[test]
fn runtime_binds_name_the_container() {
    if !namespaces_possible() {
        return;
    }
    let rig = Rig::new("binds");
    let root = rig.sim.state_dir.join("var/lib/docker/containers");
    let ids = [
        "3f4c0a6d2b1e9f8a7c6b5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f40",
        "9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f9a8b",
    ];
    for id in ids {
        let d = root.join(id);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("hostname"), "vm\n").unwrap();
    }
    let client = cuclient(LinkMode::Link);
    // `sh` binds the container's hostname file over /etc/hostname in a
    // mount namespace of its own (as the runtime does), then runs `cmd`
    // (env-less unless `gib` is given). The host's PID namespace: --pid host.
    let run = |id: &str, env: &[(&str, &str)]| {
        let mut c = rig.unshare();
        for (k, v) in env {
            c.env(k, v);
        }
        c.args(["-m", "--propagation", "private", "sh", "-c"])
            .arg(format!(
                "mount --bind {} /etc/hostname && exec {} alloc_until_oom {CHUNK} hold",
                root.join(id).join("hostname").display(),
                client.display()
            ));
        c
    };
    let quota = |g| ("ALIYUN_COM_GPU_MEM_CONTAINER", g);
    let (a, la) = start_holding(run(ids[0], &[quota("1")]), "container A");
    let held_a = rig.device_bytes();
    let (b, lb) = start_holding(run(ids[1], &[quota("3")]), "container B");
    let held_b = rig.device_bytes() - held_a;
    let (a2, la2) = start_holding(run(ids[0], &[]), "A's second process");
    let held_a_all = rig.device_bytes() - held_b;
    // A third process of A asks for another quota under another name: it
    // lands in A all the same, gets A's settings and says so.
    let (a3, la3) = start_holding(
        run(ids[0], &[quota("8"), ("CGPU_CONTAINER_ID", "renamed")]),
        "A's third process",
    );
    let held_a_3 = rig.device_bytes() - held_b;
    let e3 = stop(a3);
    // The ledger shows docker's short ids.
    let l = cgpu::ledger::Ledger::list(&rig.dir);
    let l = cgpu::ledger::Ledger::open(&l[0]).unwrap();
    let names: Vec<String> = l.containers().map(|(_, c)| c.id_str()).collect();
    let e = stop(a2);
    stop(b);
    stop(a);
    assert!(held_a <= GIB && held_a > GIB / 2, "A: {la:?}");
    assert!(
        held_b <= 3 * GIB && held_b > 2 * GIB,
        "B holds {:.2} GiB of its 3: {lb:?}",
        gib(held_b)
    );
    assert!(
        held_a_all <= GIB,
        "A with its env-less process holds {:.2} GiB of its 1: {la2:?}\n{e}",
        gib(held_a_all)
    );
    assert!(names.contains(&"3f4c0a6d2b1e".to_string()), "{names:?}");
    assert!(names.contains(&"9a8b7c6d5e4f".to_string()), "{names:?}");
    assert!(
        held_a_3 <= GIB,
        "A with a process asking for 8 GiB holds {:.2} GiB of its 1: {la3:?}\n{e3}",
        gib(held_a_3)
    );
    assert!(
        e3.contains("container 3f4c0a6d2b1e already runs on GPU")
            && e3.contains("this process asked for quota 8.00 GiB, name renamed"),
        "one warning names what it asked and what it got: {e3}"
    );
}

/// A docker-like container on the host's PID namespace and network: a
/// mount namespace of its own where `/etc` is an overlay (so that files
/// put there never reach the host), docker's hostname file bound over
/// `/etc/hostname`, `mounts` (source, target) bound read-only, then
/// `exec cuclient args`.
struct Docker<'a> {
    rig: &'a Rig,
    work: PathBuf,
}

impl<'a> Docker<'a> {
    fn new(rig: &'a Rig, name: &str) -> Docker<'a> {
        let work = rig.sim.state_dir.join(format!("docker-{name}"));
        std::fs::create_dir_all(&work).unwrap();
        Docker { rig, work }
    }

    /// `/var/lib/docker/containers/<id>/hostname` of container `id`.
    fn hostname_file(&self, id: &str) -> PathBuf {
        let d = self.work.join("var/lib/docker/containers").join(id);
        std::fs::create_dir_all(&d).unwrap();
        let f = d.join("hostname");
        std::fs::write(&f, "vm\n").unwrap();
        f
    }

    fn run(
        &self,
        id: &str,
        n: usize,
        mounts: &[(PathBuf, &str)],
        env: &[(&str, &str)],
        args: &str,
    ) -> Command {
        let up = self.work.join(format!("etc-{id}-{n}"));
        let (upper, workdir) = (up.join("upper"), up.join("work"));
        std::fs::create_dir_all(&upper).unwrap();
        std::fs::create_dir_all(&workdir).unwrap();
        let mut script = format!(
            "mount -t overlay overlay -o lowerdir=/etc,upperdir={},workdir={} /etc && mount --bind {} /etc/hostname",
            upper.display(),
            workdir.display(),
            self.hostname_file(id).display()
        );
        for (src, target) in mounts {
            let make = if src.is_dir() {
                format!("mkdir -p {target}")
            } else {
                format!("mkdir -p $(dirname {target}) && touch {target}")
            };
            script += &format!(
                " && {make} && mount --bind -o ro {} {target}",
                src.display()
            );
        }
        script += &format!(" && exec {} {args}", cuclient(LinkMode::Link).display());
        let mut c = self.rig.unshare();
        for (k, v) in env {
            c.env(k, v);
        }
        c.args(["-m", "--propagation", "private", "sh", "-c", &script]);
        c
    }
}

fn cgpuctl(args: &[&str]) -> std::process::Output {
    Command::new(artifacts().profile_dir.join("cgpuctl"))
        .args(args)
        .output()
        .unwrap()
}

/// Docker without Kubernetes: the operator gives a container its settings
/// on the host (`cgpuctl settings`, before it starts), in a directory
/// mounted read-only into it. A process that asks for more, and one with
/// no environment at all, both run under the host's settings; changed
/// while the container runs, they become its memsize at once.
#[test]
fn host_settings_reach_every_process_of_a_docker_container() {
    if !namespaces_possible() {
        return;
    }
    let rig = Rig::new("hostset");
    let docker = Docker::new(&rig, "hostset");
    let id = "5e2a9c4b7d1f3e6a8b0c2d4e6f8a1b3c5d7e9f0a2b4c6d8e1f3a5b7c9d0e2f4a";
    let settings = rig.sim.state_dir.join("etc-cgpu-containers");
    let o = cgpuctl(&[
        "settings",
        id,
        "ALIYUN_COM_GPU_MEM_CONTAINER=1",
        "CGPU_CONTAINER_ID=web-1",
        "--settings-dir",
        settings.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mounts = [(settings.clone(), "/etc/cgpu/containers")];
    let greedy = docker.run(
        id,
        0,
        &mounts,
        &[("ALIYUN_COM_GPU_MEM_CONTAINER", "8")],
        &format!("alloc_until_oom {CHUNK} hold"),
    );
    let (p1, l1) = start_holding(greedy, "a process asking for 8 GiB");
    let held1 = rig.device_bytes();
    let bare = docker.run(id, 1, &mounts, &[], "alloc_until_oom 134217728 hold");
    let (p2, l2) = start_holding(bare, "a process without environment");
    let held = rig.device_bytes();
    let l = cgpu::ledger::Ledger::open(&cgpu::ledger::Ledger::list(&rig.dir)[0]).unwrap();
    let (c, name) = l
        .containers()
        .map(|(c, s)| (c, s.id_str()))
        .next()
        .expect("the container's row");
    // After it started: the operator raises it to 2 GiB.
    let o = cgpuctl(&[
        "--dir",
        rig.dir.to_str().unwrap(),
        "settings",
        id,
        "ALIYUN_COM_GPU_MEM_CONTAINER=2",
        "--settings-dir",
        settings.to_str().unwrap(),
    ]);
    let quota = l.file().containers[c]
        .quota
        .load(std::sync::atomic::Ordering::Acquire);
    let e2 = stop(p2);
    let e1 = stop(p1);
    assert!(
        held1 <= GIB && held1 > GIB / 2,
        "asked for 8 GiB, the host gave 1: held {:.2} GiB {l1:?}\n{e1}",
        gib(held1)
    );
    assert!(
        held <= GIB,
        "with its env-less process the container holds {:.2} GiB of 1: {l2:?}\n{e2}",
        gib(held)
    );
    assert!(
        e1.contains("ignored from the environment: ALIYUN_COM_GPU_MEM_CONTAINER=8"),
        "one line says the environment's quota is ignored: {e1}"
    );
    assert_eq!(name, "web-1", "the name the host gave");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(quota, 2 * GIB, "{}", String::from_utf8_lossy(&o.stdout));
    // The file is the container's to read, not to write.
    let text = std::fs::read_to_string(settings.join(format!("{id}.env"))).unwrap();
    assert!(text.contains("ALIYUN_COM_GPU_MEM_CONTAINER=2"), "{text}");
}

/// Kubernetes: the device plugin mounts the allocation file at
/// `/etc/cgpu/alloc.env`; a process that lost `CGPU_ALLOC_FILE` (and the
/// rest of its environment) reads it there.
#[test]
fn the_allocation_file_at_its_default_path_reaches_env_less_processes() {
    if !namespaces_possible() {
        return;
    }
    let rig = Rig::new("allocdefault");
    let docker = Docker::new(&rig, "alloc");
    let id = "7c1e3a5b9d2f4e6a8c0b1d3f5a7e9c2b4d6f8a0c1e3b5d7f9a2c4e6b8d0f1a3c";
    let alloc = rig.sim.state_dir.join("alloc.env");
    std::fs::write(
        &alloc,
        "CGPU_CONTAINER_ID=default/train/main\nALIYUN_COM_GPU_MEM_CONTAINER=1\nALIYUN_COM_GPU_MEM_DEV=15\nALIYUN_COM_GPU_VISIBLE_DEVICES=0\n",
    )
    .unwrap();
    let mounts = [(alloc, "/etc/cgpu/alloc.env")];
    let c = docker.run(
        id,
        0,
        &mounts,
        &[],
        &format!("totalmem alloc_until_oom {CHUNK} hold"),
    );
    let (p, l) = start_holding(c, "an env-less process");
    let held = rig.device_bytes();
    let names: Vec<String> = cgpu::ledger::Ledger::list(&rig.dir)
        .first()
        .and_then(|p| cgpu::ledger::Ledger::open(p).ok())
        .map(|l| l.containers().map(|(_, c)| c.id_str()).collect())
        .unwrap_or_default();
    let e = stop(p);
    // 1 GiB of a 15 GiB T4 of 15109 MiB: floor(15109 MiB / 15).
    let quota = 15109 * MIB / 15;
    assert!(
        held <= quota && held > quota / 2,
        "held {:.2} GiB: {l:?}\n{e}",
        gib(held)
    );
    let total = l.iter().find(|l| l.starts_with("totalmem")).unwrap();
    assert!(total.contains(&format!("bytes={quota}")), "{total}");
    assert_eq!(names, vec!["default/train/main".to_string()]);
}

/// A process in a PID namespace of its own whose pid there equals another
/// container's host pid (NVML lists host pids): its context is still
/// charged to its own container, and its NVML process list shows its own
/// processes, not the other container's.
#[test]
fn a_namespaced_pid_equal_to_another_containers_host_pid_is_not_confused() {
    if !namespaces_possible() {
        return;
    }
    let rig = Rig::new("pidclash");
    let client = cuclient(LinkMode::Link);
    let mut x = rig.bare(&client);
    x.env("ALIYUN_COM_GPU_MEM_CONTAINER", "4")
        .env("CGPU_CONTAINER_ID", "x")
        .args(["alloc", "268435456", "hold"]);
    let (px, lx) = start_holding(x, "container X");
    assert!(lx.iter().any(|l| l.starts_with("alloc ok")), "{lx:?}");
    let host_pid_x = px.id();
    // Container Y: a PID namespace where the next pid is X's host pid.
    let mut y = rig.unshare();
    y.env("ALIYUN_COM_GPU_MEM_CONTAINER", "1")
        .args(["-p", "-f", "--kill-child", "sh", "-c"])
        .arg(format!(
            "echo {} > /proc/sys/kernel/ns_last_pid && {} pid nvml_procs alloc_until_oom 134217728 nvml_procs hold; true",
            host_pid_x - 1,
            client.display()
        ));
    let (py, ly) = start_holding(y, "container Y");
    let stats = rig.sim.stats();
    let y_bytes: u64 = stats
        .processes
        .iter()
        .filter(|p| p.alive && p.pid != host_pid_x)
        .map(|p| p.mem_bytes)
        .sum();
    let y_host: Vec<u32> = stats
        .processes
        .iter()
        .filter(|p| p.alive && p.pid != host_pid_x)
        .map(|p| p.pid)
        .collect();
    stop(py);
    stop(px);
    let ns_pid = ly
        .iter()
        .find(|l| l.starts_with("pid ok"))
        .and_then(|l| l.split("pid=").nth(1))
        .and_then(|v| v.trim().parse::<u32>().ok());
    if ns_pid != Some(host_pid_x) {
        eprintln!("skipped: could not give Y's process pid {host_pid_x} in its namespace: {ly:?}");
        return;
    }
    assert!(
        y_bytes <= GIB,
        "Y holds {:.2} GiB on the device with a 1 GiB quota (its context not charged?): {ly:?}",
        gib(y_bytes)
    );
    let procs: Vec<&String> = ly.iter().filter(|l| l.starts_with("nvml_procs")).collect();
    let last = procs.last().unwrap_or_else(|| panic!("{ly:?}"));
    assert!(
        !last.contains(&format!(" {host_pid_x}:")),
        "Y's NVML list shows X's process {host_pid_x}: {last}"
    );
    assert!(
        y_host.iter().any(|p| last.contains(&format!(" {p}:"))),
        "Y's NVML list shows Y's own process ({y_host:?}): {last}"
    );
}

/// `cgpuctl settings` writes nothing it would not accept: a short or
/// non-hex id, an unknown key, a malformed value or a missing quota is a
/// usage error (exit 2) and leaves no file; `--rm` removes one.
#[test]
fn cgpuctl_settings_refuses_bad_input() {
    let rig = Rig::new("ctlbad");
    let dir = rig.sim.state_dir.join("settings");
    let d = dir.to_str().unwrap();
    let id = "ab".repeat(32);
    for (args, why) in [
        (
            vec!["settings", "abc123", "ALIYUN_COM_GPU_MEM_CONTAINER=1"],
            "64 hex",
        ),
        (vec!["settings", &id, "LD_PRELOAD=/x"], "unknown key"),
        (
            vec!["settings", &id, "ALIYUN_COM_GPU_MEM_CONTAINER=lots"],
            "lots",
        ),
        (
            vec!["settings", &id, "ALIYUN_COM_GPU_SCHD_WEIGHT=2"],
            "is missing",
        ),
    ] {
        let mut a = args.clone();
        a.extend(["--settings-dir", d]);
        let o = cgpuctl(&a);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(why), "{args:?}: {err}");
    }
    assert!(!dir.join(format!("{id}.env")).exists());
    let o = cgpuctl(&[
        "settings",
        &id,
        "ALIYUN_COM_GPU_MEM_CONTAINER=3",
        "--settings-dir",
        d,
    ]);
    assert!(o.status.success());
    let o = cgpuctl(&["settings", &id, "--settings-dir", d]);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "ALIYUN_COM_GPU_MEM_CONTAINER=3\n"
    );
    let o = cgpuctl(&["settings", &id, "--rm", "--settings-dir", d]);
    assert!(o.status.success());
    assert!(!dir.join(format!("{id}.env")).exists());
}

/// Two GPUs; the container's first process uses GPU 0 only. A process of
/// the container without settings that allocates on GPU 1, where the
/// container has no slot yet, gets the quota of its slot on GPU 0, never
/// the whole GPU.
#[test]
fn a_process_without_settings_on_another_gpu_gets_the_containers_quota() {
    if !namespaces_possible() {
        return;
    }
    let rig = Rig::with_gpus("twogpu", "15109:Tesla T4,15109:Tesla T4");
    let client = cuclient(LinkMode::Link);
    let mut first = rig.unshare();
    first
        .env("ALIYUN_COM_GPU_MEM_CONTAINER", "1")
        .args(["-p", "-f", "--kill-child"])
        .arg(&client)
        .args(["-d", "0", "alloc", "268435456", "hold"]);
    let (p1, l1) = start_holding(first, "first");
    assert!(l1.iter().any(|l| l.starts_with("alloc ok")), "{l1:?}");
    let mut second = rig.nsenter();
    second
        .args(["-t", &only_child(p1.id()).to_string(), "-p", "--"])
        .arg(&client)
        .args(["-d", "1", "alloc_until_oom", "134217728", "hold"]);
    let (p2, l2) = start_holding(second, "second");
    let on_gpu1: u64 = rig
        .sim
        .stats()
        .processes
        .iter()
        .filter(|p| p.alive && p.device == 1)
        .map(|p| p.mem_bytes)
        .sum();
    stop(p1);
    let e2 = stop(p2);
    assert!(
        on_gpu1 <= GIB,
        "the container holds {:.2} GiB on GPU 1, its quota is 1 GiB: {l2:?}\n{e2}",
        gib(on_gpu1)
    );
    assert!(l2.iter().any(|l| l.contains("err=2")), "{l2:?}");
}
