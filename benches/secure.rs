//! What secure mode adds to an allocation: a `cuMemAlloc_v2`+`cuMemFree_v2`
//! pair (1 MiB) through `libcgpu.so` on the simulated driver, with the
//! books kept cooperatively (the process writes the shared ledger) vs in
//! secure mode (a `Reserve` round trip to the node agent's socket, and a
//! `Release` whose reply is read before the next request), measured in the
//! same run, as a ratio.
//!
//! The agent here is a server of the wire protocol in this process (one
//! thread per connection) that charges the container's row of a real
//! ledger with the ledger's own `try_reserve`/`release`: the work the node
//! agent does per request, without its per-connection identity checks
//! (done once, at `Hello`).
//!
//! Where it can (root, and a cgroup of its own), the same pair is also measured
//! against `cgpu-agent --secure` itself: its children are put in a cgroup
//! named by a container id the host gave a 20 GiB quota (`cgpuctl
//! settings`), which is how the agent places them.
//!
//! Each mode runs in its own process (the mode is decided once per
//! process): criterion times `iters` pairs in a child per sample
//! (`iter_custom`); then a summary of per-pair p50 and p99 over 5
//! interleaved rounds of 5000 pairs.
//!
//! `cargo bench --bench secure`.

use std::ffi::{c_int, c_void, CString};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cgpu::ledger::wire::{Op, Status, SOCKET_NAME};
use cgpu_testkit::secure::{self as rig, Cgroups, Row, SecureAgent};
use criterion::Criterion;

type Alloc = unsafe extern "C" fn(*mut u64, usize) -> u32;
type Free = unsafe extern "C" fn(u64) -> u32;
type Init = unsafe extern "C" fn(u32) -> u32;
type DeviceGet = unsafe extern "C" fn(*mut c_int, c_int) -> u32;
type CtxCreate = unsafe extern "C" fn(*mut *mut c_void, u32, c_int) -> u32;

fn open(path: &Path) -> *mut c_void {
    let c = CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: valid path string; the library stays loaded for the process.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!h.is_null(), "dlopen {}", path.display());
    h
}

fn sym<T: Copy>(h: *mut c_void, name: &str) -> T {
    let c = CString::new(name).unwrap();
    // SAFETY: dlsym on a live handle.
    let p = unsafe { libc::dlsym(h, c.as_ptr()) };
    assert!(!p.is_null(), "{name} missing");
    // SAFETY: T is the function-pointer type of `name` (from cuda.h).
    unsafe { std::mem::transmute_copy(&p) }
}

/// A child: a context on the sim, `libcgpu.so` loaded; then `n` pairs.
/// Prints the total ns (`CGPU_BENCH_EACH` unset) or each pair's ns.
fn child() {
    let libsim = PathBuf::from(std::env::var("CGPU_BENCH_SIM").unwrap());
    let libcgpu = PathBuf::from(std::env::var("CGPU_BENCH_CGPU").unwrap());
    let n: u64 = std::env::var("CGPU_BENCH_N").unwrap().parse().unwrap();
    let each = std::env::var_os("CGPU_BENCH_EACH").is_some();
    if let Some(go) = std::env::var_os("CGPU_BENCH_GO") {
        // In the container's cgroup first (the agent places a process by it).
        let t = Instant::now();
        while !Path::new(&go).exists() && t.elapsed() < Duration::from_secs(60) {
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let sim = open(&libsim);
    // SAFETY: the sim's entry points with their cuda.h signatures.
    unsafe {
        let init: Init = sym(sim, "cuInit");
        let get: DeviceGet = sym(sim, "cuDeviceGet");
        let create: CtxCreate = sym(sim, "cuCtxCreate_v2");
        assert_eq!(init(0), 0);
        let mut d = 0;
        assert_eq!(get(&mut d, 0), 0);
        let mut ctx = std::ptr::null_mut();
        assert_eq!(create(&mut ctx, 0, d), 0);
    }
    let cg = open(&libcgpu);
    let alloc: Alloc = sym(cg, "cuMemAlloc_v2");
    let free: Free = sym(cg, "cuMemFree_v2");
    let pair = || {
        let mut p = 0u64;
        // SAFETY: a valid out-pointer; a context is current.
        let rc = unsafe { alloc(&mut p, 1 << 20) };
        assert_eq!(rc, 0, "cuMemAlloc_v2");
        // SAFETY: p was just allocated.
        unsafe { free(p) };
    };
    // The GPU's first use (joining, Hello) is not what is measured.
    pair();
    if each {
        let mut out = String::new();
        for _ in 0..n {
            let t = Instant::now();
            pair();
            out.push_str(&format!("{}\n", t.elapsed().as_nanos()));
        }
        print!("{out}");
    } else {
        let t = Instant::now();
        for _ in 0..n {
            pair();
        }
        println!("{}", t.elapsed().as_nanos());
    }
}

struct Books {
    dir: PathBuf,
    /// The container's row, from the first request on.
    row: Option<Row>,
}

fn serve(fd: i32, books: Arc<Mutex<Books>>) {
    let mut held = 0u64;
    while let Some(req) = rig::recv_request(fd) {
        let req = req.expect("a request");
        let mut bk = books.lock().unwrap();
        if bk.row.is_none() {
            bk.row = Some(Row::join(
                &bk.dir,
                req.gpu_str(),
                23028 << 20,
                "bench",
                20 << 30,
            ));
        }
        let row = bk.row.as_ref().unwrap();
        let (l, m) = (&row.ledger, &row.m);
        let status = match req.op {
            Op::Hello => Status::Ok,
            // Allocations are measured: this agent schedules nothing.
            Op::Sched => Status::BadRequest,
            Op::Reserve => match l.try_reserve(m, req.bytes) {
                Ok(()) => {
                    held += req.bytes;
                    Status::Ok
                }
                Err(_) => Status::OverQuota,
            },
            Op::Release => {
                let take = req.bytes.min(held);
                held -= take;
                l.release(m, take);
                Status::Ok
            }
        };
        let r = row.reply(status, req.seq);
        drop(bk);
        rig::send_reply(fd, &r);
    }
    if let Some(row) = books.lock().unwrap().row.as_ref() {
        row.ledger.release(&row.m, held);
    }
    // SAFETY: our connection.
    unsafe { libc::close(fd) };
}

/// The agent's socket in `dir`, served by threads of this process.
fn start_agent(dir: &Path) {
    let listen = rig::listen(&dir.join(SOCKET_NAME));
    let books = Arc::new(Mutex::new(Books {
        dir: dir.to_owned(),
        row: None,
    }));
    rig::serve_each(listen, move |fd| {
        let b = books.clone();
        move || serve(fd, b)
    });
}

struct Modes {
    root: PathBuf,
    libsim: PathBuf,
    libcgpu: PathBuf,
    /// The container's cgroup, when `cgpu-agent --secure` runs ("agent").
    cgroup: Option<PathBuf>,
}

/// `cgpu-agent --secure` on `root/agent`, serving a container of 20 GiB
/// whose processes are in a cgroup named by its id (the tree is removed
/// when the [`Cgroups`] returned drops); or why this machine cannot (not
/// root, or no cgroup of its own).
fn start_real_agent(
    a: &cgpu_testkit::Artifacts,
    root: &Path,
) -> Result<(SecureAgent, Cgroups, PathBuf), String> {
    if !rig::is_root() {
        return Err("not root".into());
    }
    let id = format!("{:08x}{}", std::process::id(), "b".repeat(56));
    let cgroups = Cgroups::new(&format!("cgpu-bench-secure-{}", std::process::id()));
    let cg = cgroups
        .try_make(&id)
        .map_err(|e| format!("no cgroup of our own ({e})"))?;
    let settings = root.join("containers");
    std::fs::create_dir_all(&settings).unwrap();
    rig::host_settings(&settings, &id, &["ALIYUN_COM_GPU_MEM_CONTAINER=20"], None)?;
    let mut base = Command::new(a.profile_dir.join("cgpu-agent"));
    base.env("LD_LIBRARY_PATH", &a.sim_lib_dir)
        .env("CGPU_SIM_STATE", root.join("state"))
        .env("CGPU_SIM_GPUS", "23028:NVIDIA A10");
    let mut c = rig::secure_agent_command(base, &root.join("agent"), &settings, "1s");
    let agent = SecureAgent::start(&mut c, Duration::from_secs(120))
        .map_err(|log| format!("cgpu-agent ended: {}", log.join("\n")))?;
    Ok((agent, cgroups, cg))
}

impl Modes {
    /// Run a child in `mode` ("cooperative", "secure" or "agent") for `n` pairs.
    fn run(&self, mode: &str, n: u64, each: bool) -> Vec<u64> {
        let exe = std::env::current_exe().unwrap();
        let mut c = Command::new(exe);
        c.env("CGPU_BENCH_CHILD", "1")
            .env("CGPU_BENCH_SIM", &self.libsim)
            .env("CGPU_BENCH_CGPU", &self.libcgpu)
            .env("CGPU_BENCH_N", n.to_string())
            .env("CGPU_REAL_LIBCUDA", &self.libsim)
            .env("CGPU_REAL_LIBNVML", &self.libsim)
            .env("CGPU_SIM_STATE", self.root.join("state"))
            .env("CGPU_SIM_GPUS", "23028:NVIDIA A10")
            .env("CGPU_CONTAINER_ID", "bench")
            .env("CGPU_LEDGER_DIR", self.root.join(mode))
            .stdout(std::process::Stdio::piped());
        if mode == "cooperative" {
            c.env("ALIYUN_COM_GPU_MEM_CONTAINER", "20");
        }
        if each {
            c.env("CGPU_BENCH_EACH", "1");
        }
        let go = self.root.join("go");
        let _ = std::fs::remove_file(&go);
        if mode == "agent" {
            c.env("CGPU_BENCH_GO", &go);
        }
        let kid = c.spawn().unwrap();
        if let (Some(cg), "agent") = (&self.cgroup, mode) {
            rig::enter(cg, kid.id());
            std::fs::write(&go, "").unwrap();
        }
        let o = kid.wait_with_output().unwrap();
        assert!(o.status.success(), "bench child ({mode}) failed");
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }
}

fn pct(v: &mut [u64], p: f64) -> u64 {
    v.sort_unstable();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn main() {
    if std::env::var_os("CGPU_BENCH_CHILD").is_some() {
        child();
        return;
    }
    let a = cgpu_testkit::artifacts();
    let root = std::env::temp_dir().join(format!("cgpu-bench-secure-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    for (d, mode) in [("state", 0o777), ("cooperative", 0o1777), ("secure", 0o755)] {
        std::fs::create_dir_all(root.join(d)).unwrap();
        std::fs::set_permissions(root.join(d), std::fs::Permissions::from_mode(mode)).unwrap();
    }
    start_agent(&root.join("secure"));
    let (agent, cgroups, cgroup) = match start_real_agent(a, &root) {
        Ok((agent, cgroups, cg)) => (Some(agent), Some(cgroups), Some(cg)),
        Err(why) => {
            println!("cgpu-agent --secure not measured: {why}");
            (None, None, None)
        }
    };
    let m = Modes {
        root: root.clone(),
        libsim: a.libsim.clone(),
        libcgpu: a.libcgpu.clone(),
        cgroup,
    };
    let modes: Vec<&str> = ["cooperative", "secure", "agent"]
        .into_iter()
        .filter(|&x| x != "agent" || m.cgroup.is_some())
        .collect();

    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20)
        .configure_from_args();
    {
        let mut g = c.benchmark_group("alloc_free_1MiB_round_trip");
        for &mode in &modes {
            g.bench_function(mode, |b| {
                b.iter_custom(|iters| Duration::from_nanos(m.run(mode, iters, false)[0]))
            });
        }
        g.finish();
    }
    c.final_summary();

    // Per pair, 5 interleaved rounds of 5000, medians of the rounds.
    let n = 5000;
    let mut p50 = vec![Vec::new(); modes.len()];
    let mut p99 = vec![Vec::new(); modes.len()];
    for _ in 0..5 {
        for (i, mode) in modes.iter().enumerate() {
            let mut v = m.run(mode, n, true);
            p50[i].push(pct(&mut v, 0.5) as f64);
            p99[i].push(pct(&mut v, 0.99) as f64);
        }
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v[v.len() / 2] / 1e3
    };
    let p50: Vec<f64> = p50.iter_mut().map(med).collect();
    let p99: Vec<f64> = p99.iter_mut().map(med).collect();
    println!("\n| cuMemAlloc+cuMemFree (1 MiB) | p50 | p99 | p50 added (ratio) | p99 added (ratio), goal ≤ 20 µs |");
    println!("|---|---|---|---|---|");
    for (i, mode) in modes.iter().enumerate() {
        let what = match *mode {
            "cooperative" => "cooperative",
            "secure" => "secure, in-bench agent (Reserve + Release)",
            _ => "secure, `cgpu-agent --secure`",
        };
        println!(
            "| {what} | {:.1} µs | {:.1} µs | {:+.1} µs ({:.2}x) | {:+.1} µs ({:.2}x) |",
            p50[i],
            p99[i],
            p50[i] - p50[0],
            p50[i] / p50[0],
            p99[i] - p99[0],
            p99[i] / p99[0]
        );
    }
    println!(
        "(machine: {} CPUs)",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0)
    );
    drop(agent);
    drop(cgroups);
    let _ = std::fs::remove_dir_all(&root);
}
