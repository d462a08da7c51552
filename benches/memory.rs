//! What the interposer adds to the memory paths, as ratios against the bare
//! simulated driver measured in the same run.
//!
//! This process `dlopen`s the simulated driver and `libcgpu.so` (with
//! `CGPU_REAL_LIBCUDA` pointing at the sim) and calls through both:
//! - `cuMemAlloc_v2`+`cuMemFree_v2` pair, `cuMemGetInfo_v2`, and a pass-through
//!   function (`cuCtxGetDevice`, as `cuGetProcAddress_v2` of libcgpu hands it out);
//! - library load to first hooked call (fresh child processes);
//! - p99 allocation latency with 8 processes allocating at once vs 1 alone.
//!
//! `cargo bench --bench memory` (criterion), then a summary table.

use std::ffi::{c_char, c_int, c_void, CString};
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use criterion::Criterion;

type Alloc = unsafe extern "C" fn(*mut u64, usize) -> u32;
type Free = unsafe extern "C" fn(u64) -> u32;
type MemInfo = unsafe extern "C" fn(*mut usize, *mut usize) -> u32;
type CtxGetDevice = unsafe extern "C" fn(*mut c_int) -> u32;
type Init = unsafe extern "C" fn(u32) -> u32;
type DeviceGet = unsafe extern "C" fn(*mut c_int, c_int) -> u32;
type CtxCreate = unsafe extern "C" fn(*mut *mut c_void, u32, c_int) -> u32;
type GetProc = unsafe extern "C" fn(*const c_char, *mut *mut c_void, c_int, u64, *mut c_int) -> u32;

struct Api {
    alloc: Alloc,
    free: Free,
    meminfo: MemInfo,
    ctx_get_device: CtxGetDevice,
}

fn open(path: &Path) -> *mut c_void {
    let c = CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: valid path string; the library stays loaded for the process.
    let h = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    assert!(!h.is_null(), "dlopen {}", path.display());
    h
}

fn sym<T: Copy>(h: *mut c_void, name: &str) -> T {
    let c = CString::new(name).unwrap();
    // SAFETY: libc's dlsym on a live handle (libcgpu is RTLD_LOCAL, so this
    // process's dlsym is libc's, not libcgpu's override).
    let p = unsafe { libc::dlsym(h, c.as_ptr()) };
    assert!(!p.is_null(), "{name} missing");
    // SAFETY: T is the function-pointer type of `name` (from cuda.h).
    unsafe { std::mem::transmute_copy(&p) }
}

struct Setup {
    bare: Api,
    cgpu: Api,
    libcgpu: PathBuf,
    libsim: PathBuf,
}

fn env_for_children(dir: &Path, libsim: &Path) -> Vec<(String, String)> {
    vec![
        (
            "CGPU_SIM_STATE".into(),
            dir.join("state").display().to_string(),
        ),
        (
            "CGPU_LEDGER_DIR".into(),
            dir.join("ledger").display().to_string(),
        ),
        ("CGPU_REAL_LIBCUDA".into(), libsim.display().to_string()),
        ("CGPU_REAL_LIBNVML".into(), libsim.display().to_string()),
        ("CGPU_SIM_GPUS".into(), "23028:NVIDIA A10".into()),
        ("ALIYUN_COM_GPU_MEM_CONTAINER".into(), "20".into()),
        ("CGPU_CONTAINER_ID".into(), "bench".into()),
    ]
}

/// Load both libraries into this process and make a context current.
fn setup(libsim: &Path, libcgpu: &Path) -> Setup {
    let sim = open(libsim);
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
    let cg = open(libcgpu);
    let bare = Api {
        alloc: sym(sim, "cuMemAlloc_v2"),
        free: sym(sim, "cuMemFree_v2"),
        meminfo: sym(sim, "cuMemGetInfo_v2"),
        ctx_get_device: sym(sim, "cuCtxGetDevice"),
    };
    // A pass-through function as libcgpu hands it out: cuGetProcAddress_v2
    // returns the driver's own pointer for every function it does not hook.
    let gpa: GetProc = sym(cg, "cuGetProcAddress_v2");
    let mut p = std::ptr::null_mut();
    // SAFETY: libcgpu's cuGetProcAddress_v2 with valid out-pointers.
    let rc = unsafe {
        gpa(
            c"cuCtxGetDevice".as_ptr(),
            &mut p,
            12000,
            0,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(rc, 0);
    assert_eq!(
        p as usize, bare.ctx_get_device as usize,
        "pass-through must be the driver's own pointer"
    );
    let cgpu = Api {
        alloc: sym(cg, "cuMemAlloc_v2"),
        free: sym(cg, "cuMemFree_v2"),
        meminfo: sym(cg, "cuMemGetInfo_v2"),
        // SAFETY: the pointer cuGetProcAddress_v2 returned for cuCtxGetDevice.
        ctx_get_device: unsafe { std::mem::transmute::<*mut c_void, CtxGetDevice>(p) },
    };
    Setup {
        bare,
        cgpu,
        libcgpu: libcgpu.into(),
        libsim: libsim.into(),
    }
}

#[inline(always)]
fn pair(a: &Api) {
    let mut p = 0u64;
    // SAFETY: a valid out-pointer; a context is current.
    unsafe {
        let rc = (a.alloc)(&mut p, 1 << 20);
        debug_assert_eq!(rc, 0);
        (a.free)(black_box(p));
    }
}

#[inline(always)]
fn meminfo(a: &Api) {
    let (mut f, mut t) = (0usize, 0usize);
    // SAFETY: valid out-pointers.
    unsafe { (a.meminfo)(&mut f, &mut t) };
    black_box((f, t));
}

#[inline(always)]
fn passthrough(a: &Api) {
    let mut d = 0;
    // SAFETY: valid out-pointer.
    unsafe { (a.ctx_get_device)(&mut d) };
    black_box(d);
}

/// Mean ns per call of `bare` and `cgpu` over `n` iterations, in 15
/// interleaved rounds; returns the medians of (bare, cgpu, cgpu − bare).
fn ns_pair(n: u32, mut bare: impl FnMut(), mut cgpu: impl FnMut()) -> (f64, f64, f64) {
    let time = |f: &mut dyn FnMut()| {
        let t = Instant::now();
        for _ in 0..n {
            f();
        }
        t.elapsed().as_nanos() as f64 / n as f64
    };
    let (mut b, mut g, mut d) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..15 {
        let x = time(&mut bare);
        let y = time(&mut cgpu);
        b.push(x);
        g.push(y);
        d.push(y - x);
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v[v.len() / 2]
    };
    (med(&mut b), med(&mut g), med(&mut d))
}

/// Child modes (re-executed bench binary).
fn child(mode: &str) {
    let libsim = PathBuf::from(std::env::var("CGPU_BENCH_SIM").unwrap());
    let libcgpu = PathBuf::from(std::env::var("CGPU_BENCH_CGPU").unwrap());
    match mode {
        "load" => {
            // Context first (bare), then: load libcgpu + first hooked call.
            let sim = open(&libsim);
            // SAFETY: as in setup().
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
            let t = Instant::now();
            let cg = open(&libcgpu);
            let mi: MemInfo = sym(cg, "cuMemGetInfo_v2");
            let (mut f, mut tot) = (0usize, 0usize);
            // SAFETY: valid out-pointers.
            assert_eq!(unsafe { mi(&mut f, &mut tot) }, 0);
            let ns = t.elapsed().as_nanos();
            assert_eq!(
                tot as u64,
                20 << 30,
                "the first hooked call already sees the quota"
            );
            println!("{ns}");
        }
        "lat" | "latbare" => {
            let s = setup(&libsim, &libcgpu);
            let a = if mode == "lat" { &s.cgpu } else { &s.bare };
            let n: usize = std::env::var("CGPU_BENCH_N").unwrap().parse().unwrap();
            // Start together.
            let go: u128 = std::env::var("CGPU_BENCH_GO").unwrap().parse().unwrap();
            while (std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos())
                < go
            {
                std::hint::spin_loop();
            }
            let mut lat = Vec::with_capacity(n);
            for _ in 0..n {
                let mut p = 0u64;
                let t = Instant::now();
                // SAFETY: valid out-pointer; context current.
                let rc = unsafe { (a.alloc)(&mut p, 1 << 20) };
                lat.push(t.elapsed().as_nanos() as u64);
                assert_eq!(rc, 0);
                // SAFETY: p was just allocated.
                unsafe { (a.free)(p) };
            }
            for l in lat {
                println!("{l}");
            }
        }
        _ => panic!("unknown child mode {mode}"),
    }
}

fn children(env: &[(String, String)], s: &Setup, mode: &str, k: usize, n: usize) -> Vec<u64> {
    let exe = std::env::current_exe().unwrap();
    let go = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
        + 300_000_000;
    let kids: Vec<_> = (0..k)
        .map(|_| {
            let mut c = Command::new(&exe);
            c.envs(env.iter().map(|(a, b)| (a, b)))
                .env("CGPU_BENCH_CHILD", mode)
                .env("CGPU_BENCH_SIM", &s.libsim)
                .env("CGPU_BENCH_CGPU", &s.libcgpu)
                .env("CGPU_BENCH_N", n.to_string())
                .env("CGPU_BENCH_GO", go.to_string())
                .stdout(std::process::Stdio::piped());
            c.spawn().unwrap()
        })
        .collect();
    let mut all = Vec::new();
    for kid in kids {
        let o = kid.wait_with_output().unwrap();
        assert!(o.status.success(), "bench child failed");
        all.extend(
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter_map(|l| l.trim().parse::<u64>().ok()),
        );
    }
    all
}

fn pct(v: &mut [u64], p: f64) -> u64 {
    v.sort_unstable();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn main() {
    if let Ok(mode) = std::env::var("CGPU_BENCH_CHILD") {
        child(&mode);
        return;
    }
    let a = cgpu_testkit::artifacts();
    let dir = std::env::temp_dir().join(format!("cgpu-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("ledger")).unwrap();
    let env = env_for_children(&dir, &a.libsim);
    for (k, v) in &env {
        std::env::set_var(k, v);
    }
    let s = setup(&a.libsim, &a.libcgpu);

    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .configure_from_args();
    {
        let mut g = c.benchmark_group("alloc_free_1MiB");
        g.bench_function("bare", |b| b.iter(|| pair(&s.bare)));
        g.bench_function("cgpu", |b| b.iter(|| pair(&s.cgpu)));
        g.finish();
        let mut g = c.benchmark_group("cuMemGetInfo");
        g.bench_function("bare", |b| b.iter(|| meminfo(&s.bare)));
        g.bench_function("cgpu", |b| b.iter(|| meminfo(&s.cgpu)));
        g.finish();
        let mut g = c.benchmark_group("passthrough_cuCtxGetDevice");
        g.bench_function("bare", |b| b.iter(|| passthrough(&s.bare)));
        g.bench_function("cgpu", |b| b.iter(|| passthrough(&s.cgpu)));
        g.finish();
    }
    c.final_summary();

    // Summary table (same process, interleaved, best of 5).
    let rows = [
        (
            "cuMemAlloc+cuMemFree pair",
            5_000,
            1000.0,
            &(|x: &Api| pair(x)) as &dyn Fn(&Api),
        ),
        (
            "cuMemGetInfo",
            100_000,
            200.0,
            &(|x: &Api| meminfo(x)) as &dyn Fn(&Api),
        ),
        (
            "pass-through (cuCtxGetDevice)",
            1_000_000,
            20.0,
            &(|x: &Api| passthrough(x)) as &dyn Fn(&Api),
        ),
    ];
    println!("\n| path | bare sim | through cgpu | added | goal |");
    println!("|---|---|---|---|---|");
    for (name, n, goal, f) in rows {
        let (b, g, d) = ns_pair(n, || f(&s.bare), || f(&s.cgpu));
        println!(
            "| {name} | {b:.0} ns | {g:.0} ns | {d:.0} ns ({:.2}x) | ≤ {goal:.0} ns |",
            g / b
        );
    }
    let mut loads: Vec<u64> = (0..9)
        .flat_map(|_| children(&env, &s, "load", 1, 0))
        .collect();
    let med = pct(&mut loads, 0.5);
    println!(
        "| load libcgpu.so to first hooked call (median of 9) | – | {:.2} ms | | ≤ 5 ms |",
        med as f64 / 1e6
    );
    // p99 of 8 processes allocating at once vs 1 alone, through cgpu and on
    // the bare sim; 5 interleaved rounds, medians. On a machine with fewer
    // CPUs than processes the bare ratio itself is far above 1 (processes
    // are descheduled mid-call); the last column is what cgpu adds at 8.
    let n = 3000;
    let (mut r_cg, mut r_bare, mut r_8) = (Vec::new(), Vec::new(), Vec::new());
    let (mut c1s, mut c8s, mut b1s, mut b8s) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..5 {
        let b1 = pct(&mut children(&env, &s, "latbare", 1, n), 0.99) as f64;
        let c1 = pct(&mut children(&env, &s, "lat", 1, n), 0.99) as f64;
        let b8 = pct(&mut children(&env, &s, "latbare", 8, n), 0.99) as f64;
        let c8 = pct(&mut children(&env, &s, "lat", 8, n), 0.99) as f64;
        r_cg.push(c8 / c1);
        r_bare.push(b8 / b1);
        r_8.push(c8 / b8);
        c1s.push(c1);
        c8s.push(c8);
        b1s.push(b1);
        b8s.push(b8);
    }
    let med = |v: &mut Vec<f64>| {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v[v.len() / 2]
    };
    println!(
        "| p99 cuMemAlloc, 8 processes vs 1 (median of 5) | {:.1} vs {:.1} µs ({:.2}x) | {:.1} vs {:.1} µs ({:.2}x) | cgpu/bare at 8: {:.2}x | ≤ 2x |",
        med(&mut b8s) / 1e3,
        med(&mut b1s) / 1e3,
        med(&mut r_bare),
        med(&mut c8s) / 1e3,
        med(&mut c1s) / 1e3,
        med(&mut r_cg),
        med(&mut r_8)
    );
    println!(
        "(machine: {} CPUs)",
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
