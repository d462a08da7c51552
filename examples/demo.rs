//! The first run: two containers sharing one simulated GPU, end to end.
//!
//! ```sh
//! cargo run --release --example demo
//! ```
//!
//! Builds `libcgpu.so`, the simulated driver and the tools (through the test
//! kit), starts two "containers" as real processes under
//! `LD_PRELOAD=libcgpu.so` on a simulated NVIDIA A10 with different memory
//! quotas and compute weights, and shows with `cgpu-smi` / `cgpuctl`:
//! the quota view, one container hitting its quota with a clean
//! `CUDA_ERROR_OUT_OF_MEMORY` while the other carries on, compute shares
//! following the weights (measured by the simulator), and a weight changed
//! live. Exits non-zero if anything that should happen did not.
//!
//! The container processes are this same program started with `--client`: a
//! small driver-API client that `dlopen`s `libcuda.so.1` (the simulator) and
//! reads commands from stdin. It deliberately does not link the `cgpu`
//! crate, so the only cgpu code in those processes is the preloaded library.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const GPU: &str = "23028:NVIDIA A10";
const CTX_MIB: u64 = 300;
/// Length of one simulated kernel.
const KERNEL_NS: u64 = 1_000_000;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--client") {
        std::process::exit(client::main());
    }
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("cargo run --release --example demo   (no arguments; see examples/demo.rs)");
        return;
    }
    std::process::exit(Demo::run());
}

// ---------------------------------------------------------------- the demo

struct Pod {
    name: &'static str,
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
    pid: u32,
}

impl Pod {
    fn send(&mut self, cmd: &str) {
        // a dead client shows up as EOF on the next read
        let _ = writeln!(self.input, "{cmd}");
        let _ = self.input.flush();
    }

    /// The next reply line (`R ...`), or None if the client died.
    fn reply(&mut self) -> Option<String> {
        let mut line = String::new();
        loop {
            line.clear();
            if self.output.read_line(&mut line).ok()? == 0 {
                return None;
            }
            if let Some(r) = line.trim_end().strip_prefix("R ") {
                return Some(r.to_owned());
            }
        }
    }

    fn ask(&mut self, cmd: &str) -> String {
        self.send(cmd);
        self.reply()
            .unwrap_or_else(|| format!("died (exit {:?})", self.child.try_wait().ok().flatten()))
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Demo {
    t0: Instant,
    checks: Vec<(String, bool)>,
    ledger_dir: PathBuf,
    env: cgpu_testkit::SimEnv,
    smi: PathBuf,
    ctl: PathBuf,
}

fn kv<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    cgpu_testkit::field(line, key)
}

fn kvn(line: &str, key: &str) -> u64 {
    kv(line, key).and_then(|v| v.parse().ok()).unwrap_or(0)
}

fn indent(s: &str) -> String {
    s.lines().map(|l| format!("      {l}\n")).collect()
}

impl Demo {
    fn step(&self, n: u32, what: &str) {
        println!(
            "\n[{n}/6] {what}   (t={:.1}s)",
            self.t0.elapsed().as_secs_f64()
        );
    }

    fn check(&mut self, what: impl Into<String>, ok: bool) -> bool {
        let what = what.into();
        println!("      {} {what}", if ok { "ok  " } else { "FAIL" });
        self.checks.push((what, ok));
        ok
    }

    fn tool(&self, bin: &Path, args: &[&str]) -> (bool, String, String) {
        let o = Command::new(bin)
            .arg("--dir")
            .arg(&self.ledger_dir)
            .args(args)
            .env_remove("LD_PRELOAD")
            .output()
            .expect("run tool");
        (
            o.status.success(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    }

    fn show(&self, bin: &Path, name: &str, args: &[&str]) -> String {
        let (_, out, err) = self.tool(bin, args);
        println!("      $ {name} {}", args.join(" "));
        print!("{}", indent(&out));
        if !err.trim().is_empty() {
            print!("{}", indent(err.trim_end()));
        }
        out
    }

    fn smi_json(&self, args: &[&str]) -> serde_json::Value {
        let mut a = vec!["--json"];
        a.extend_from_slice(args);
        let (_, out, _) = self.tool(&self.smi, &a);
        serde_json::from_str(&out).unwrap_or(serde_json::Value::Null)
    }

    fn start_pod(&self, name: &'static str, gib: u32, weight: u32) -> Pod {
        let exe = std::env::current_exe().expect("current exe");
        let mut child = self
            .env
            .command(exe)
            .arg("--client")
            .env("CGPU_LEDGER_DIR", &self.ledger_dir)
            .env("CGPU_CONTAINER_ID", name)
            .env("ALIYUN_COM_GPU_MEM_CONTAINER", gib.to_string())
            .env("ALIYUN_COM_GPU_SCHD_WEIGHT", weight.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start a container process");
        let pid = child.id();
        Pod {
            name,
            input: child.stdin.take().expect("stdin"),
            output: BufReader::new(child.stdout.take().expect("stdout")),
            child,
            pid,
        }
    }

    /// Device time per pid from the simulator's ground truth.
    fn device_ns(&self, pods: &[&Pod]) -> Vec<u64> {
        let st = self.env.stats();
        pods.iter()
            .map(|p| st.process(p.pid, 0).map(|x| x.device_time_ns).unwrap_or(0))
            .collect()
    }

    /// Both pods busy for `ms`; measure shares over the middle of it.
    /// Returns the shares (fractions of the GPU) from the simulator, and
    /// what `cgpu-smi --json` measured over one second in the middle.
    fn measure(&mut self, a: &mut Pod, b: &mut Pod, ms: u64) -> (f64, f64, serde_json::Value) {
        a.send(&format!("spin {ms}"));
        b.send(&format!("spin {ms}"));
        let start = Instant::now();
        std::thread::sleep(Duration::from_millis(1000));
        // cgpu-smi's own 1-second utilisation, in the background
        let smi = Command::new(&self.smi)
            .arg("--dir")
            .arg(&self.ledger_dir)
            .arg("--json")
            .stdout(Stdio::piped())
            .spawn()
            .ok();
        let mut last = Instant::now();
        let first = self.device_ns(&[a, b]);
        let mut prev = first.clone();
        let end = Duration::from_millis(ms.saturating_sub(300));
        while start.elapsed() + Duration::from_millis(1000) <= end {
            std::thread::sleep(Duration::from_millis(1000));
            let now = self.device_ns(&[a, b]);
            let wall = last.elapsed().as_nanos() as f64;
            last = Instant::now();
            let da = now[0].saturating_sub(prev[0]) as f64 / wall;
            let db = now[1].saturating_sub(prev[1]) as f64 / wall;
            println!(
                "      t+{:>3.0}s  {} {:>5.1}%  {} {:>5.1}%  of the GPU (busy {:>5.1}%)",
                start.elapsed().as_secs_f64(),
                a.name,
                da * 100.0,
                b.name,
                db * 100.0,
                (da + db) * 100.0
            );
            prev = now;
        }
        let smi = smi
            .and_then(|c| c.wait_with_output().ok())
            .and_then(|o| serde_json::from_slice(&o.stdout).ok())
            .unwrap_or_default();
        for p in [&mut *a, &mut *b] {
            let r = p.reply().unwrap_or_default();
            if !r.starts_with("spin ok") {
                self.check(format!("{} kept computing ({r})", p.name), false);
            }
        }
        let sa = prev[0].saturating_sub(first[0]) as f64;
        let sb = prev[1].saturating_sub(first[1]) as f64;
        let tot = (sa + sb).max(1.0);
        (sa / tot, sb / tot, smi)
    }

    fn util_of(v: &serde_json::Value, id: &str) -> (Option<f64>, Option<u64>) {
        let c = v["gpus"][0]["gpu"]["containers"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["id"] == id).cloned())
            .unwrap_or_default();
        (c["util_percent"].as_f64(), c["limit_percent"].as_u64())
    }

    fn report_shares(
        &mut self,
        a: &Pod,
        b: &Pod,
        wa: u32,
        wb: u32,
        m: (f64, f64, serde_json::Value),
    ) {
        let (sa, sb, smi) = m;
        let ta = f64::from(wa) / f64::from(wa + wb);
        let tb = 1.0 - ta;
        println!(
            "      simulator: {} {:.1}% / {} {:.1}% of the compute  (weights {wa}:{wb} → target {:.1}% / {:.1}%)",
            a.name,
            sa * 100.0,
            b.name,
            sb * 100.0,
            ta * 100.0,
            tb * 100.0
        );
        for p in [a, b] {
            if let (Some(u), Some(l)) = Self::util_of(&smi, p.name) {
                println!("      cgpu-smi:  {} GPU-Util/Limit {u:.0}/{l}", p.name);
            }
        }
        let ok = (sa - ta).abs() <= 0.1 * ta && (sb - tb).abs() <= 0.1 * tb;
        if !self.check(
            format!(
                "shares follow the weights {wa}:{wb} within 10% (measured {wa} : {:.2})",
                sb / sa.max(1e-9) * f64::from(wa)
            ),
            ok,
        ) {
            println!(
                "           the compute scheduler (src/scheduler/, the launch hooks in\n           src/hooks/launch.rs) is not holding launches back to the weights."
            );
        }
    }

    fn run() -> i32 {
        let t0 = Instant::now();
        println!(
            "cgpu demo: two containers share one simulated NVIDIA A10 (23028 MiB), no GPU needed"
        );
        println!("\n[1/6] building libcgpu.so, the simulated driver and the tools (cargo build --release --bins --lib;");
        println!("      a few minutes the first time, cargo's progress below)");
        cgpu_testkit::show_build_progress();
        let a = cgpu_testkit::artifacts();
        println!(
            "      done in {:.1}s: {}",
            t0.elapsed().as_secs_f64(),
            a.libcgpu.display()
        );
        let base = std::env::temp_dir().join(format!("cgpu-demo-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let ledger_dir = base.join("ledger");
        std::fs::create_dir_all(&ledger_dir).expect("create ledger dir");
        let env = cgpu_testkit::SimEnv::new()
            .gpus(GPU)
            .ctx_mib(CTX_MIB)
            .preload(&a.libcgpu);
        let mut d = Demo {
            t0,
            checks: Vec::new(),
            ledger_dir,
            env,
            smi: a.bin("cgpu-smi"),
            ctl: a.bin("cgpuctl"),
        };
        let code = d.body();
        let _ = std::fs::remove_dir_all(&base);
        code
    }

    fn body(&mut self) -> i32 {
        self.step(
            2,
            "starting two containers as real processes under LD_PRELOAD=libcgpu.so",
        );
        println!("      pod-a: ALIYUN_COM_GPU_MEM_CONTAINER=4 ALIYUN_COM_GPU_SCHD_WEIGHT=1");
        println!("      pod-b: ALIYUN_COM_GPU_MEM_CONTAINER=8 ALIYUN_COM_GPU_SCHD_WEIGHT=2");
        let mut a = self.start_pod("pod-a", 4, 1);
        let mut b = self.start_pod("pod-b", 8, 2);
        for (p, quota) in [(&mut a, 4 * GIB), (&mut b, 8 * GIB)] {
            let r = p.ask("init");
            if !r.starts_with("init ok") {
                self.check(format!("{} initialised CUDA ({r})", p.name), false);
                return self.finish();
            }
            let r = p.ask("meminfo");
            self.check(
                format!(
                    "{} (pid {}) sees a {} MiB GPU through cuMemGetInfo ({} MiB free: its context holds {CTX_MIB} MiB)",
                    p.name,
                    p.pid,
                    kvn(&r, "total") / MIB,
                    kvn(&r, "free") / MIB
                ),
                kvn(&r, "total") == quota,
            );
        }
        let r = b.ask(&format!("alloc {}", 2 * GIB));
        self.check(
            format!("pod-b allocated 2 GiB ({r})"),
            r.starts_with("alloc ok"),
        );
        let r = a.ask(&format!("alloc {}", GIB));
        self.check(
            format!("pod-a allocated 1 GiB ({r})"),
            r.starts_with("alloc ok"),
        );
        let ctl = self.ctl.clone();
        let smi = self.smi.clone();
        self.show(&smi, "cgpu-smi", &["-d"]);

        self.step(
            3,
            "memory isolation: pod-a asks for 1 GiB at a time until its 4 GiB quota stops it",
        );
        let r = a.ask(&format!("alloc_until_oom {GIB}"));
        let (n, err) = (kvn(&r, "count"), kvn(&r, "err"));
        self.check(
            format!(
                "pod-a got {n} more GiB, then cuMemAlloc returned {err} = CUDA_ERROR_OUT_OF_MEMORY"
            ),
            n == 2 && err == 2,
        );
        let r = b.ask(&format!("alloc {}", 4 * GIB));
        self.check(
            format!("pod-b carries on: 4 GiB more granted ({r}); the GPU still has room"),
            r.starts_with("alloc ok"),
        );
        let v = self.smi_json(&["--instant"]);
        let cs = v["gpus"][0]["gpu"]["containers"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let st = self.env.stats();
        for (p, quota) in [(&a, 4 * GIB), (&b, 8 * GIB)] {
            let c = cs
                .iter()
                .find(|c| c["id"] == p.name)
                .cloned()
                .unwrap_or_default();
            let used = c["used_bytes"].as_u64().unwrap_or(u64::MAX);
            let sim = st.process(p.pid, 0).map(|x| x.mem_bytes).unwrap_or(0);
            self.check(
                format!(
                    "{}: ledger {} MiB = simulator {} MiB, within its {} MiB quota",
                    p.name,
                    used / MIB,
                    sim / MIB,
                    quota / MIB
                ),
                used == sim && used <= quota,
            );
        }
        self.show(&smi, "cgpu-smi", &["--instant"]);
        self.show(&ctl, "cgpuctl", &["inspect"]);

        self.step(
            4,
            "compute: both containers launch 1 ms kernels for 6 s (policy 2, weights 1:2)",
        );
        let m = self.measure(&mut a, &mut b, 6000);
        self.report_shares(&a, &b, 1, 2, m);

        self.step(
            5,
            "changing pod-a's weight live: cgpuctl set weight 4 --container pod-a",
        );
        let (ok, out, err) = self.tool(&ctl, &["set", "weight", "4", "--container", "pod-a"]);
        print!("{}", indent(out.trim_end()));
        self.check(
            format!("cgpuctl set weight 4 {}", err.trim()).trim_end(),
            ok,
        );
        let m = self.measure(&mut a, &mut b, 5000);
        self.report_shares(&a, &b, 4, 2, m);
        self.show(&ctl, "cgpuctl", &["tree"]);

        a.send("exit");
        b.send("exit");
        self.finish()
    }

    fn finish(&mut self) -> i32 {
        let failed: Vec<&String> = self.checks.iter().filter(|c| !c.1).map(|c| &c.0).collect();
        println!(
            "\n[6/6] done in {:.1}s: {} checks, {} failed",
            self.t0.elapsed().as_secs_f64(),
            self.checks.len(),
            failed.len()
        );
        for f in &failed {
            println!("      FAILED: {f}");
        }
        if failed.is_empty() {
            println!("      Next: README.md (a docker host, Kubernetes, your own program on the simulated GPU), docs/, `cargo test --workspace`.");
            0
        } else {
            1
        }
    }
}

// ---------------------------------------------------------------- the client

/// A driver-API client of the simulated GPU, run as a container process.
/// Commands on stdin, one reply line each (`R ...`):
/// `init`, `meminfo`, `alloc BYTES`, `alloc_until_oom CHUNK`, `spin MS`, `exit`.
mod client {
    use libloading::{Library, Symbol};
    use std::ffi::{c_char, c_int, c_uint, c_void};
    use std::io::{BufRead, Write};
    use std::time::{Duration, Instant};

    type R = c_uint;
    type Ptr = *mut c_void;

    struct Cu {
        _lib: Library,
        init: unsafe extern "C" fn(c_uint) -> R,
        device_get: unsafe extern "C" fn(*mut c_int, c_int) -> R,
        primary_retain: unsafe extern "C" fn(*mut Ptr, c_int) -> R,
        set_current: unsafe extern "C" fn(Ptr) -> R,
        mem_get_info: unsafe extern "C" fn(*mut usize, *mut usize) -> R,
        mem_alloc: unsafe extern "C" fn(*mut u64, usize) -> R,
        module_load_data: unsafe extern "C" fn(*mut Ptr, *const c_void) -> R,
        module_get_function: unsafe extern "C" fn(*mut Ptr, Ptr, *const c_char) -> R,
        #[allow(clippy::type_complexity)]
        launch_kernel: unsafe extern "C" fn(
            Ptr,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            c_uint,
            Ptr,
            *mut *mut c_void,
            *mut *mut c_void,
        ) -> R,
        stream_create: unsafe extern "C" fn(*mut Ptr, c_uint) -> R,
        stream_synchronize: unsafe extern "C" fn(Ptr) -> R,
        event_create: unsafe extern "C" fn(*mut Ptr, c_uint) -> R,
        event_record: unsafe extern "C" fn(Ptr, Ptr) -> R,
        event_synchronize: unsafe extern "C" fn(Ptr) -> R,
    }

    fn sym<T: Copy>(lib: &Library, name: &str) -> Result<T, String> {
        let n = format!("{name}\0");
        // SAFETY: each call site names the driver function whose C signature
        // the type parameter spells out (from cuda.h).
        unsafe {
            let s: Symbol<T> = lib.get(n.as_bytes()).map_err(|e| format!("{name}: {e}"))?;
            Ok(*s)
        }
    }

    impl Cu {
        fn load() -> Result<Cu, String> {
            // SAFETY: loading the driver runs its initialisers, which is what
            // every CUDA program does.
            let lib = unsafe { Library::new("libcuda.so.1") }.map_err(|e| e.to_string())?;
            Ok(Cu {
                init: sym(&lib, "cuInit")?,
                device_get: sym(&lib, "cuDeviceGet")?,
                primary_retain: sym(&lib, "cuDevicePrimaryCtxRetain")?,
                set_current: sym(&lib, "cuCtxSetCurrent")?,
                mem_get_info: sym(&lib, "cuMemGetInfo_v2")?,
                mem_alloc: sym(&lib, "cuMemAlloc_v2")?,
                module_load_data: sym(&lib, "cuModuleLoadData")?,
                module_get_function: sym(&lib, "cuModuleGetFunction")?,
                launch_kernel: sym(&lib, "cuLaunchKernel")?,
                stream_create: sym(&lib, "cuStreamCreate")?,
                stream_synchronize: sym(&lib, "cuStreamSynchronize")?,
                event_create: sym(&lib, "cuEventCreate")?,
                event_record: sym(&lib, "cuEventRecord")?,
                event_synchronize: sym(&lib, "cuEventSynchronize")?,
                _lib: lib,
            })
        }
    }

    const PTX: &str = ".version 7.0\n.target sm_52\n.address_size 64\n.visible .entry cgpu_sim_spin(.param .u64 ns)\n{\n ret;\n}\n\0";

    struct State {
        cu: Cu,
        spin: Ptr,
        stream: Ptr,
        ev: [Ptr; 2],
    }

    impl State {
        fn init() -> Result<State, String> {
            let cu = Cu::load()?;
            let mut dev = 0;
            let mut ctx: Ptr = std::ptr::null_mut();
            let mut m: Ptr = std::ptr::null_mut();
            let mut f: Ptr = std::ptr::null_mut();
            let mut s: Ptr = std::ptr::null_mut();
            let mut ev: [Ptr; 2] = [std::ptr::null_mut(); 2];
            // SAFETY: driver calls with valid out-pointers to locals, in the
            // order the driver API requires (init, device, context current,
            // then module/stream/event objects of that context).
            unsafe {
                let ck = |r: R, what: &str| {
                    if r == 0 {
                        Ok(())
                    } else {
                        Err(format!("{what} err={r}"))
                    }
                };
                ck((cu.init)(0), "cuInit")?;
                ck((cu.device_get)(&mut dev, 0), "cuDeviceGet")?;
                ck(
                    (cu.primary_retain)(&mut ctx, dev),
                    "cuDevicePrimaryCtxRetain",
                )?;
                ck((cu.set_current)(ctx), "cuCtxSetCurrent")?;
                ck(
                    (cu.module_load_data)(&mut m, PTX.as_ptr().cast()),
                    "cuModuleLoadData",
                )?;
                ck(
                    (cu.module_get_function)(&mut f, m, c"cgpu_sim_spin".as_ptr()),
                    "cuModuleGetFunction",
                )?;
                ck((cu.stream_create)(&mut s, 0), "cuStreamCreate")?;
                // CU_EVENT_DISABLE_TIMING = 2
                ck((cu.event_create)(&mut ev[0], 2), "cuEventCreate")?;
                ck((cu.event_create)(&mut ev[1], 2), "cuEventCreate")?;
            }
            Ok(State {
                cu,
                spin: f,
                stream: s,
                ev,
            })
        }

        fn alloc(&self, bytes: u64) -> R {
            let mut p = 0u64;
            // SAFETY: valid out-pointer; the allocation is kept (never freed)
            // on purpose: the process holds it until it exits.
            unsafe { (self.cu.mem_alloc)(&mut p, bytes as usize) }
        }

        fn meminfo(&self) -> (R, usize, usize) {
            let (mut f, mut t) = (0usize, 0usize);
            // SAFETY: valid out-pointers to locals.
            let r = unsafe { (self.cu.mem_get_info)(&mut f, &mut t) };
            (r, f, t)
        }

        /// Keep the device busy for `ms` with kernels of `KERNEL_NS`, about
        /// 4 ms queued ahead (double-buffered on two events).
        fn spin(&self, ms: u64) -> Result<u64, String> {
            let batch = 4_000_000 / super::KERNEL_NS + 1;
            let end = Instant::now() + Duration::from_millis(ms);
            let mut kernels = 0u64;
            let (mut cur, mut pending) = (0usize, false);
            let mut ns = super::KERNEL_NS;
            while Instant::now() < end {
                for _ in 0..batch {
                    let mut params: [*mut c_void; 1] = [(&mut ns as *mut u64).cast()];
                    // SAFETY: a function of this context's module taking one
                    // u64, its parameter array pointing at a live u64.
                    let r = unsafe {
                        (self.cu.launch_kernel)(
                            self.spin,
                            1,
                            1,
                            1,
                            32,
                            1,
                            1,
                            0,
                            self.stream,
                            params.as_mut_ptr(),
                            std::ptr::null_mut(),
                        )
                    };
                    if r != 0 {
                        return Err(format!("cuLaunchKernel err={r}"));
                    }
                    kernels += 1;
                }
                // SAFETY: events and stream of the current context.
                unsafe {
                    let r = (self.cu.event_record)(self.ev[cur], self.stream);
                    if r != 0 {
                        return Err(format!("cuEventRecord err={r}"));
                    }
                    if pending {
                        (self.cu.event_synchronize)(self.ev[cur ^ 1]);
                    }
                }
                pending = true;
                cur ^= 1;
            }
            // SAFETY: the stream of the current context.
            unsafe { (self.cu.stream_synchronize)(self.stream) };
            Ok(kernels)
        }
    }

    pub fn main() -> i32 {
        let stdin = std::io::stdin();
        let mut out = std::io::stdout();
        let mut st: Option<State> = None;
        let mut say = |s: String| {
            let _ = writeln!(out, "R {s}");
            let _ = out.flush();
        };
        for line in stdin.lock().lines() {
            let Ok(line) = line else { break };
            let mut w = line.split_whitespace();
            let cmd = w.next().unwrap_or("");
            let n: u64 = w.next().and_then(|x| x.parse().ok()).unwrap_or(0);
            if cmd == "exit" {
                break;
            }
            if cmd == "init" {
                match State::init() {
                    Ok(s) => {
                        st = Some(s);
                        say("init ok".into());
                    }
                    Err(e) => say(format!("init failed: {e}")),
                }
                continue;
            }
            let Some(s) = &st else {
                say(format!("{cmd} err=not-initialised"));
                continue;
            };
            match cmd {
                "meminfo" => {
                    let (r, f, t) = s.meminfo();
                    say(format!("meminfo r={r} free={f} total={t}"));
                }
                "alloc" => match s.alloc(n) {
                    0 => say("alloc ok".into()),
                    r => say(format!("alloc err={r}")),
                },
                "alloc_until_oom" => {
                    let mut count = 0;
                    let err = loop {
                        match s.alloc(n) {
                            0 => count += 1,
                            r => break r,
                        }
                        if count > 1000 {
                            break 0;
                        }
                    };
                    say(format!("alloc_until_oom count={count} err={err}"));
                }
                "spin" => match s.spin(n) {
                    Ok(k) => say(format!("spin ok kernels={k}")),
                    Err(e) => say(format!("spin failed: {e}")),
                },
                other => say(format!("unknown command {other}")),
            }
        }
        0
    }
}
