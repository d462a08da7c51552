//! Cost of the scheduler on the launch path when the container is within
//! its share, against the bare simulated driver in the same run:
//!
//! - `bare sim launch`: `cuLaunchKernel` of the sim (a 0 ns `cgpu_sim_spin`),
//!   in batches of 256 and one `cuCtxSynchronize`;
//! - `gated sim launch`: the same with `admit_launch` + `launched` around each
//!   launch, the process attached to a real ledger and holding the GPU (slice
//!   ends, drains and re-grants included, as they come);
//! - `gate alone`: `admit_launch` + `launched` around nothing;
//! - `secure gate alone`, `secure gated sim launch`: the same through
//!   secure mode's gate (the node agent holds the token; the process reads
//!   it from the ledger and writes only its own page), its container
//!   holding the GPU as the agent's token says, measured after the
//!   cooperative gate was detached (a process has one mode).
//!
//! Criterion reports time per element (launch); the added cost is gated − bare.
//! At the end, paired interleaved batches give the same difference with the
//! machine's drift taken out (median of per-pair differences).
//!
//!     cargo bench --bench launch
//!
//! The sim is loaded with `dlopen` (its exports would clash with ours if
//! linked); the ledger lives in a temporary directory.

use cgpu::ledger::{JoinRequest, Ledger};
use cgpu::scheduler::words::{self, Token};
use cgpu::scheduler::{self, DriverOps};
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};

static MEMBER: AtomicUsize = AtomicUsize::new(0);
static SECURE: AtomicPtr<scheduler::SecureGate> = AtomicPtr::new(std::ptr::null_mut());
static LEDGER: AtomicPtr<Ledger> = AtomicPtr::new(std::ptr::null_mut());
use criterion::{criterion_group, Criterion};
use std::ffi::{c_char, c_void};
use std::hint::black_box;
use std::time::Duration;

type Ptr = *mut c_void;
const BATCH: u64 = 256;
type LaunchFn =
    unsafe extern "C" fn(Ptr, u32, u32, u32, u32, u32, u32, u32, Ptr, *mut Ptr, *mut Ptr) -> u32;

/// The sim stays loaded for the whole run (its handle is never closed).
struct Sim {
    launch: LaunchFn,
    sync: unsafe extern "C" fn() -> u32,
    f: Ptr,
}

/// The run's simulated GPU state and ledger (removed at the end).
fn bench_dir() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("cgpu-sched-bench-{}", std::process::id()))
}

fn setup() -> Sim {
    let a = cgpu_testkit::artifacts();
    let dir = bench_dir();
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::env::set_var("CGPU_SIM_STATE", dir.join("sim"));
    // SAFETY: loading the simulated driver, a plain C library.
    let lib = unsafe { libloading::Library::new(&a.libsim) }.expect("load the sim");
    let handle = libloading::os::unix::Library::from(lib).into_raw();
    // The sim's functions through glibc's own `dlsym`: this binary links
    // the interposer, whose `dlsym` export would otherwise answer (and, for
    // a hooked name, look for the real driver this machine does not have).
    let real_dlsym = cgpu::driver::real_dlsym().expect("glibc's dlsym");
    let sym = |name: &std::ffi::CStr| -> Ptr {
        // SAFETY: a live handle from dlopen and a NUL-terminated name.
        let p = unsafe { real_dlsym(handle, name.as_ptr()) };
        assert!(!p.is_null(), "the sim exports {name:?}");
        p
    };
    let ptx =
        c".version 7.0\n.target sm_52\n.visible .entry cgpu_sim_spin(.param .u64 a)\n{ ret; }\n";
    // SAFETY: each pointer is the sim's export of that name, transmuted to
    // its C signature; the calls pass valid arguments.
    unsafe {
        let init: unsafe extern "C" fn(u32) -> u32 = std::mem::transmute(sym(c"cuInit"));
        let retain: unsafe extern "C" fn(*mut Ptr, i32) -> u32 =
            std::mem::transmute(sym(c"cuDevicePrimaryCtxRetain"));
        let set: unsafe extern "C" fn(Ptr) -> u32 = std::mem::transmute(sym(c"cuCtxSetCurrent"));
        let load: unsafe extern "C" fn(*mut Ptr, *const c_void) -> u32 =
            std::mem::transmute(sym(c"cuModuleLoadData"));
        let getf: unsafe extern "C" fn(*mut Ptr, Ptr, *const c_char) -> u32 =
            std::mem::transmute(sym(c"cuModuleGetFunction"));
        assert_eq!(init(0), 0);
        let mut ctx = std::ptr::null_mut();
        assert_eq!(retain(&mut ctx, 0), 0);
        assert_eq!(set(ctx), 0);
        let mut m = std::ptr::null_mut();
        assert_eq!(load(&mut m, ptx.as_ptr() as *const c_void), 0);
        let mut f = std::ptr::null_mut();
        assert_eq!(getf(&mut f, m, c"cgpu_sim_spin".as_ptr()), 0);
        let launch: LaunchFn = std::mem::transmute(sym(c"cuLaunchKernel"));
        let sync: unsafe extern "C" fn() -> u32 = std::mem::transmute(sym(c"cuCtxSynchronize"));
        let drv = DriverOps {
            ctx_get_current: std::mem::transmute::<Ptr, unsafe extern "C" fn(*mut Ptr) -> u32>(
                sym(c"cuCtxGetCurrent"),
            ),
            ctx_set_current: std::mem::transmute::<Ptr, unsafe extern "C" fn(Ptr) -> u32>(sym(
                c"cuCtxSetCurrent",
            )),
            ctx_synchronize: sync,
            ctx_get_device: std::mem::transmute::<Ptr, unsafe extern "C" fn(*mut i32) -> u32>(sym(
                c"cuCtxGetDevice",
            )),
            stream_query: std::mem::transmute::<Ptr, unsafe extern "C" fn(Ptr) -> u32>(sym(
                c"cuStreamQuery",
            )),
            events: None,
        };
        // Join a ledger as a container of weight 1 and attach the scheduler.
        let ledger: &'static Ledger = Box::leak(Box::new(
            Ledger::open_or_create(&dir, "GPU-bench", 0, 16 << 30).expect("ledger"),
        ));
        ledger.set_policy(1).unwrap();
        let m = ledger
            .join(&JoinRequest {
                container_id: "bench",
                key: 0,
                quota: 0,
                weight: 1,
                highprio: false,
                enforce_off: false,
            })
            .expect("join");
        scheduler::attach(ledger, &m, drv).expect("attach");
        // The first launch takes the GPU (slow path); check that this process
        // now holds it, so the loops below measure the fast path.
        scheduler::admit_launch(std::ptr::null_mut());
        scheduler::launched(std::ptr::null_mut(), 0);
        let tok =
            Token::unpack(ledger.file().header.sched[words::gpu::TOKEN].load(Ordering::Acquire));
        assert_eq!(
            (tok.state, tok.holder),
            (words::RUNNING, Some(m.container)),
            "{tok:?}"
        );
        MEMBER.store(m.container, Ordering::Relaxed);
        // Secure mode's gate, on a second ledger whose token says its
        // container holds the GPU (as the agent writes it), with a page of
        // its own.
        let sdir = dir.join("secure");
        std::fs::create_dir_all(&sdir).unwrap();
        let sl: &'static Ledger = Box::leak(Box::new(
            Ledger::open_or_create(&sdir, "GPU-bench-secure", 0, 16 << 30).expect("ledger"),
        ));
        sl.set_policy(1).unwrap();
        let sf = sl.file();
        sf.header.sched[words::gpu::TOKEN].store(Token::running(7, 3), Ordering::Release);
        sf.header.sched[words::gpu::SLICE_ALLOW].store(u64::MAX, Ordering::Release);
        let pf = cgpu::ledger::page::create("bench").expect("a page");
        let page = cgpu::ledger::page::map(std::os::fd::AsRawFd::as_raw_fd(&pf)).expect("mapped");
        std::mem::forget(pf);
        let sg = scheduler::secure_gate_for_bench(sl, page, 3, drv);
        assert!(sg.bench_launch(), "the secure gate admits its holder");
        SECURE.store(sg as *const _ as *mut _, Ordering::Relaxed);
        LEDGER.store(ledger as *const Ledger as *mut Ledger, Ordering::Relaxed);
        Sim { launch, sync, f }
    }
}

fn bench(c: &mut Criterion) {
    let sim = setup();
    let mut ns: u64 = 0;
    let mut args = [&mut ns as *mut u64 as Ptr];
    let args_p = args.as_mut_ptr();
    let launch = || {
        // SAFETY: a valid function of the sim's current context and its parameters.
        unsafe {
            (sim.launch)(
                sim.f,
                1,
                1,
                1,
                32,
                1,
                1,
                0,
                std::ptr::null_mut(),
                args_p,
                std::ptr::null_mut(),
            )
        }
    };
    let mut g = c.benchmark_group("launch");
    g.measurement_time(Duration::from_secs(4)).sample_size(30);
    // Batches of 256 launches + one synchronisation, so the sim's queue
    // stays short in both (a full queue would make launches block).
    g.throughput(criterion::Throughput::Elements(BATCH));
    g.bench_function("bare sim launch", |b| {
        b.iter(|| {
            for _ in 0..BATCH {
                black_box(launch());
            }
            // SAFETY: a current context exists.
            unsafe { (sim.sync)() }
        })
    });
    // A batch through the gate of this process's mode, and the gate alone
    // (measured for both modes).
    let gated = || {
        for _ in 0..BATCH {
            scheduler::admit_launch(std::ptr::null_mut());
            let r = launch();
            scheduler::launched(std::ptr::null_mut(), r);
            black_box(r);
        }
        // SAFETY: a current context exists.
        unsafe { (sim.sync)() }
    };
    let gate_alone = || {
        for _ in 0..BATCH {
            scheduler::admit_launch(std::ptr::null_mut());
            scheduler::launched(std::ptr::null_mut(), 0);
        }
    };
    g.bench_function("gated sim launch", |b| b.iter(gated));
    g.bench_function("gate alone", |b| b.iter(gate_alone));
    g.finish();

    // Paired, interleaved batches (bare, gated, bare, gated, ...): the sim's
    // own launch time drifts with the machine's load by more than the gate
    // costs, so compare each gated batch with the bare one just before it.
    let batch = |gated: bool| {
        let t = std::time::Instant::now();
        for _ in 0..BATCH {
            if gated {
                scheduler::admit_launch(std::ptr::null_mut());
            }
            let r = launch();
            if gated {
                scheduler::launched(std::ptr::null_mut(), r);
            }
            black_box(r);
        }
        // SAFETY: a current context exists.
        unsafe { (sim.sync)() };
        t.elapsed().as_nanos() as f64 / BATCH as f64
    };
    let paired = |what: &str| {
        let (mut bare, mut gated, mut diff) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..2000 {
            let b = batch(false);
            let g = batch(true);
            bare.push(b);
            gated.push(g);
            diff.push(g - b);
        }
        let med = |v: &mut Vec<f64>| {
            v.sort_by(|a, b| a.total_cmp(b));
            v[v.len() / 2]
        };
        eprintln!(
            "interleaved, {what}, ns per launch (median of 2000 paired batches of {BATCH}): bare {:.1}, gated {:.1}, gated - bare {:.1}",
            med(&mut bare),
            med(&mut gated),
            med(&mut diff)
        );
    };
    paired("cooperative gate");
    // SAFETY: set in setup to a leaked ledger.
    let l = unsafe { &*LEDGER.load(Ordering::Relaxed) };
    let slot = &l.file().containers[MEMBER.load(Ordering::Relaxed)];
    let st = scheduler::container_stats(slot);
    let slices = slot.sched[words::container::SLICES].load(Ordering::Relaxed);
    eprintln!(
        "scheduler: {} launches admitted in {slices} slices, {} ns held back",
        st.launches, st.throttled_ns
    );

    // Secure mode's gate through the same entry points (the cooperative
    // gate is detached first: a process has one mode).
    // SAFETY: set in setup to a leaked gate.
    let sg = unsafe { &*SECURE.load(Ordering::Relaxed) };
    scheduler::secure_install_for_bench(sg);
    let mut g = c.benchmark_group("launch");
    g.measurement_time(Duration::from_secs(4)).sample_size(30);
    g.throughput(criterion::Throughput::Elements(BATCH));
    g.bench_function("secure gate alone", |b| b.iter(gate_alone));
    g.bench_function("secure gated sim launch", |b| b.iter(gated));
    g.finish();
    paired("secure gate");
    let page = sg.page_words();
    eprintln!(
        "secure gate: {} launches in its slice, {} ns held back",
        page.0, page.1
    );
}

criterion_group!(benches, bench);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    let _ = std::fs::remove_dir_all(bench_dir());
}
