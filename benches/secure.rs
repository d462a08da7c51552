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
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cgpu::ledger::wire::{Op, Reply, Request, Status, REQUEST_LEN, SOCKET_NAME};
use cgpu::ledger::{JoinRequest, Ledger, Membership};
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
    ledger: Option<(Ledger, Membership)>,
}

fn serve(fd: i32, books: Arc<Mutex<Books>>) {
    let mut held = 0u64;
    loop {
        let mut b = [0u8; REQUEST_LEN + 1];
        // SAFETY: valid buffer of its length.
        let n = unsafe { libc::recv(fd, b.as_mut_ptr().cast(), b.len(), 0) };
        if n <= 0 {
            break;
        }
        let req = Request::decode(&b[..n as usize]).expect("a request");
        let mut bk = books.lock().unwrap();
        if bk.ledger.is_none() {
            let l = Ledger::open_or_create(&bk.dir, req.gpu_str(), 0, 23028 << 20).unwrap();
            std::fs::set_permissions(l.path(), std::fs::Permissions::from_mode(0o644)).unwrap();
            let m = l
                .join(&JoinRequest {
                    container_id: "bench",
                    key: 0,
                    quota: 20 << 30,
                    weight: 1,
                    highprio: false,
                    enforce_off: false,
                })
                .unwrap();
            bk.ledger = Some((l, m));
        }
        let (l, m) = bk.ledger.as_ref().unwrap();
        let status = match req.op {
            Op::Hello => Status::Ok,
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
        let row = &l.file().containers[m.container];
        let r = Reply {
            status,
            seq: req.seq,
            used: row.used.load(Ordering::Acquire),
            quota: row.quota.load(Ordering::Acquire),
            container: m.container as u32,
            process: m.process as u32,
        }
        .encode();
        drop(bk);
        // SAFETY: valid buffer of its length.
        unsafe { libc::send(fd, r.as_ptr().cast(), r.len(), libc::MSG_NOSIGNAL) };
    }
    if let Some((l, m)) = books.lock().unwrap().ledger.as_ref() {
        l.release(m, held);
    }
    // SAFETY: our connection.
    unsafe { libc::close(fd) };
}

/// The agent's socket in `dir`, served by threads of this process.
fn start_agent(dir: &Path) {
    let path = dir.join(SOCKET_NAME);
    // SAFETY: plain socket calls with valid arguments.
    let listen =
        unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    assert!(listen >= 0);
    // SAFETY: zeroed sockaddr_un is valid; the path fits (checked).
    let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    a.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let b = path.to_str().unwrap().as_bytes();
    assert!(b.len() < a.sun_path.len());
    for (d, s) in a.sun_path.iter_mut().zip(b) {
        *d = *s as libc::c_char;
    }
    // SAFETY: as above.
    let ok = unsafe {
        libc::bind(
            listen,
            (&a as *const libc::sockaddr_un).cast(),
            std::mem::size_of::<libc::sockaddr_un>() as u32,
        ) == 0
            && libc::listen(listen, 64) == 0
    };
    assert!(ok, "bind {}", path.display());
    let books = Arc::new(Mutex::new(Books {
        dir: dir.to_owned(),
        ledger: None,
    }));
    std::thread::spawn(move || loop {
        // SAFETY: accept on our listening socket.
        let fd = unsafe {
            libc::accept4(
                listen,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_CLOEXEC,
            )
        };
        if fd < 0 {
            return;
        }
        let b = books.clone();
        std::thread::spawn(move || serve(fd, b));
    });
}

struct Modes {
    root: PathBuf,
    libsim: PathBuf,
    libcgpu: PathBuf,
}

impl Modes {
    /// Run a child in `mode` ("cooperative" or "secure") for `n` pairs.
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
        let o = c.output().unwrap();
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
    let m = Modes {
        root: root.clone(),
        libsim: a.libsim.clone(),
        libcgpu: a.libcgpu.clone(),
    };

    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20)
        .configure_from_args();
    {
        let mut g = c.benchmark_group("alloc_free_1MiB_round_trip");
        for mode in ["cooperative", "secure"] {
            g.bench_function(mode, |b| {
                b.iter_custom(|iters| Duration::from_nanos(m.run(mode, iters, false)[0]))
            });
        }
        g.finish();
    }
    c.final_summary();

    // Per pair, 5 interleaved rounds of 5000, medians of the rounds.
    let n = 5000;
    let (mut c50, mut c99, mut s50, mut s99) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..5 {
        let mut co = m.run("cooperative", n, true);
        let mut se = m.run("secure", n, true);
        c50.push(pct(&mut co, 0.5) as f64);
        c99.push(pct(&mut co, 0.99) as f64);
        s50.push(pct(&mut se, 0.5) as f64);
        s99.push(pct(&mut se, 0.99) as f64);
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v[v.len() / 2] / 1e3
    };
    let (c50, c99, s50, s99) = (med(&mut c50), med(&mut c99), med(&mut s50), med(&mut s99));
    println!("\n| cuMemAlloc+cuMemFree (1 MiB) | p50 | p99 |");
    println!("|---|---|---|");
    println!("| cooperative | {c50:.1} µs | {c99:.1} µs |");
    println!("| secure (Reserve + Release to the agent) | {s50:.1} µs | {s99:.1} µs |");
    println!(
        "| secure / cooperative | {:.2}x | {:.2}x |",
        s50 / c50,
        s99 / c99
    );
    println!(
        "| added by secure mode | {:.1} µs | {:.1} µs (goal ≤ 20 µs) |",
        s50 - c50,
        s99 - c99
    );
    println!(
        "(machine: {} CPUs)",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0)
    );
    let _ = std::fs::remove_dir_all(&root);
}
