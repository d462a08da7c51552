//! Test support for cgpu (dev-dependency only).
//!
//! - [`artifacts`]: builds the workspace once per test process (`cargo test`
//!   does not build cdylibs for integration tests) and returns the paths of
//!   `libcgpu.so`, `libcgpu_sim.so`, the simulated-driver library directory
//!   (`libcuda.so.1` etc. → the sim) and the binaries.
//! - [`test_deps`]: the venv under `target/test-deps/venv` with
//!   `cuda-bindings`, `nvidia-ml-py`, `prometheus-client` and the real
//!   `cuda.h`/`nvml.h` at pinned versions
//!   (via `scripts/test-deps.sh`, once, under a file lock).
//! - [`compile_c`]: compiles a C client against the real headers, linked one
//!   of three ways ([`LinkMode`]); [`cuclient`] builds `tests/c/cuclient.c`.
//! - [`SimEnv`]: a fresh simulated machine (temp state dir, `CGPU_SIM_*`,
//!   `LD_LIBRARY_PATH`, optional `LD_PRELOAD`) to spawn processes in.
//! - [`sim_stats`]: the state directory read through `cgpu-sim-stat --json`.
//! - [`secure`]: the secure-mode rig (tenants of uid 65534, cgroups of the
//!   test's own, the host's settings, `cgpu-agent --secure` serving).

pub mod secure;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The workspace root (this crate lives in `<root>/testkit`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// `target/` of the workspace (honours `CARGO_TARGET_DIR`).
pub fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) => {
            let p = PathBuf::from(d);
            if p.is_absolute() {
                p
            } else {
                workspace_root().join(p)
            }
        }
        None => workspace_root().join("target"),
    }
}

#[derive(Debug, Clone)]
pub struct Artifacts {
    /// `target/<profile>`.
    pub profile_dir: PathBuf,
    /// The interposer, `libcgpu.so` (`CGPU_TEST_LIBCGPU` overrides it).
    pub libcgpu: PathBuf,
    /// The simulated driver, `libcgpu_sim.so`.
    pub libsim: PathBuf,
    /// A directory with `libcuda.so{,.1}` and `libnvidia-ml.so{,.1}` → `libsim`.
    pub sim_lib_dir: PathBuf,
    /// `cgpu-sim-stat`.
    pub sim_stat: PathBuf,
}

impl Artifacts {
    /// A binary of the workspace, e.g. `bin("cgpu-smi")`; a Kubernetes
    /// component's (`cgpu-device-plugin`, …) is built on first use.
    pub fn bin(&self, name: &str) -> PathBuf {
        if !ROOT_BINS.contains(&name) {
            static CLUSTER: OnceLock<()> = OnceLock::new();
            CLUSTER.get_or_init(|| cargo_build(&["build", "-p", "cgpu-cluster", "--bins"]));
        }
        self.profile_dir.join(name)
    }
}

/// The profile the tests were built with.
pub fn profile() -> &'static str {
    if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    }
}

/// Show cargo's own progress (its `Compiling …` lines on stderr) while
/// [`artifacts`] builds, instead of collecting it for an error message: for a
/// program a person watches (the demo), where a first build takes minutes.
pub fn show_build_progress() {
    SHOW_BUILD.store(true, std::sync::atomic::Ordering::Relaxed);
}

static SHOW_BUILD: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn cargo_build(args: &[&str]) {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(workspace_root()).args(args);
    if !cfg!(debug_assertions) {
        cmd.arg("--release");
    }
    if SHOW_BUILD.load(std::sync::atomic::Ordering::Relaxed) {
        let status = cmd.status().expect("run cargo build");
        assert!(
            status.success(),
            "cargo {} failed (its messages are above)",
            args.join(" ")
        );
        return;
    }
    let out = cmd.output().expect("run cargo build");
    assert!(
        out.status.success(),
        "cargo {} failed:\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The binaries `cargo build` at the root makes; any other name asked of
/// [`Artifacts::bin`] is a Kubernetes component, built then.
const ROOT_BINS: &[&str] = &["cgpu-smi", "cgpuctl", "cgpu-sim-stat"];

/// Builds, once per test process, what `cargo build` at the root builds
/// (the library, the simulated driver, the tools) and returns the artifact
/// paths; `--release` for release builds (the demo). The same command as the
/// README's, so `libcgpu.so` is built with the same features as there, as by
/// `cargo run --release --example demo` and as by `cargo test -p cgpu`: none
/// of them rebuilds another's. The Kubernetes components are built when
/// [`Artifacts::bin`] is first asked for one of theirs, in an invocation of
/// their own: their dependencies (tonic, kube) turn on features of `tracing`
/// and `smallvec` that would otherwise change the library's build.
pub fn artifacts() -> &'static Artifacts {
    static A: OnceLock<Artifacts> = OnceLock::new();
    A.get_or_init(|| {
        cargo_build(&["build", "--bins", "--lib"]);
        let profile_dir = target_dir().join(profile());
        let libsim = profile_dir.join("libcgpu_sim.so");
        let sim_lib_dir = profile_dir.join("sim-libdir");
        make_sim_lib_dir(&sim_lib_dir, &libsim);
        Artifacts {
            libcgpu: libcgpu_under_test(&profile_dir),
            sim_stat: profile_dir.join("cgpu-sim-stat"),
            libsim,
            sim_lib_dir,
            profile_dir,
        }
    })
}

/// The interposer the tests preload: `CGPU_TEST_LIBCGPU` when set (e.g.
/// `dist/libcgpu.so`, built by `scripts/build-dist.sh`, which runs the
/// interposer tests against it), else the one this build just made.
fn libcgpu_under_test(profile_dir: &Path) -> PathBuf {
    match std::env::var_os("CGPU_TEST_LIBCGPU") {
        Some(p) if !p.is_empty() => {
            let p = PathBuf::from(p);
            let p = if p.is_absolute() {
                p
            } else {
                workspace_root().join(p)
            };
            assert!(
                p.is_file(),
                "CGPU_TEST_LIBCGPU={} is not a file",
                p.display()
            );
            eprintln!(
                "cgpu-testkit: preloading {} (CGPU_TEST_LIBCGPU)",
                p.display()
            );
            p
        }
        _ => profile_dir.join("libcgpu.so"),
    }
}

fn make_sim_lib_dir(dir: &Path, lib: &Path) {
    std::fs::create_dir_all(dir).expect("create sim lib dir");
    for name in [
        "libcuda.so.1",
        "libcuda.so",
        "libnvidia-ml.so.1",
        "libnvidia-ml.so",
    ] {
        let p = dir.join(name);
        if std::fs::read_link(&p).ok().as_deref() == Some(lib) {
            continue;
        }
        let tmp = dir.join(format!(".{name}.{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(lib, &tmp).expect("symlink");
        std::fs::rename(&tmp, &p).expect("rename symlink");
    }
}

// ------------------------------------------------------------------ test deps

#[derive(Debug, Clone)]
pub struct TestDeps {
    pub venv: PathBuf,
    /// `<venv>/bin/python`.
    pub python: PathBuf,
    /// Directory holding `cuda.h` and `cudaTypedefs.h`.
    pub cuda_include: PathBuf,
    /// Directory holding `nvml.h`.
    pub nvml_include: PathBuf,
}

fn flock(path: &Path) -> std::fs::File {
    use std::os::fd::AsRawFd;
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .expect("open lock file");
    // SAFETY: a valid open fd; flock has no memory effects.
    unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
    f
}

fn find_file(root: &Path, name: &str) -> Option<PathBuf> {
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.file_name().is_some_and(|n| n == name) {
                return Some(p);
            }
        }
    }
    None
}

/// Ensures the venv with the Python test deps and the real headers exists
/// (runs `scripts/test-deps.sh` once, under a lock shared by all tests).
pub fn test_deps() -> &'static TestDeps {
    static D: OnceLock<Result<TestDeps, String>> = OnceLock::new();
    let deps = D.get_or_init(|| {
        let dir = target_dir().join("test-deps");
        std::fs::create_dir_all(&dir).expect("create target/test-deps");
        let _lock = flock(&dir.join(".lock"));
        let venv = dir.join("venv");
        // stderr goes straight to the terminal, past the test harness's
        // capture: the one-time "fetching ..." line, and what to do when
        // the registry cannot be reached.
        let out = Command::new("bash")
            .arg(workspace_root().join("scripts/test-deps.sh"))
            .arg(&venv)
            .stderr(Stdio::inherit())
            .output()
            .expect("run scripts/test-deps.sh");
        if !out.status.success() {
            return Err(
                "scripts/test-deps.sh failed (its message is above): the Python test \
                 dependencies and the real CUDA headers are missing"
                    .to_owned(),
            );
        }
        let site = venv.join("lib");
        let cuda_h = find_file(&site, "cudaTypedefs.h").expect("cudaTypedefs.h in the venv");
        let nvml_h = find_file(&site, "nvml.h").expect("nvml.h in the venv");
        Ok(TestDeps {
            python: venv.join("bin/python"),
            cuda_include: cuda_h.parent().expect("include dir").to_path_buf(),
            nvml_include: nvml_h.parent().expect("include dir").to_path_buf(),
            venv,
        })
    });
    match deps {
        Ok(d) => d,
        Err(e) => panic!("{e}"),
    }
}

/// Installs the pinned PyPI package `pkg` (`name==version`, no
/// dependencies) once, under a lock shared by all tests, into
/// `target/test-deps/<group>/<name-version>/`, and returns that directory:
/// libraries the simulated driver is tested with (CUPTI, NVRTC) that the
/// test venv does not carry.
pub fn pip_target(group: &str, pkg: &str) -> PathBuf {
    let deps = test_deps();
    let base = deps.venv.parent().expect("test-deps dir").join(group);
    std::fs::create_dir_all(&base).expect("create the package dir");
    let _lock = flock(&base.join(".lock"));
    let dir = base.join(pkg.replace("==", "-"));
    if !dir.join(".done").exists() {
        let _ = std::fs::remove_dir_all(&dir);
        let o = Command::new(deps.venv.join("bin/pip"))
            .args([
                "install",
                "--disable-pip-version-check",
                "-q",
                "--no-deps",
                "--target",
            ])
            .arg(&dir)
            .arg(pkg)
            .output()
            .expect("run pip");
        assert!(
            o.status.success(),
            "could not install {pkg} from PyPI (make PyPI reachable or set PIP_INDEX_URL):\n{}",
            String::from_utf8_lossy(&o.stderr)
        );
        std::fs::write(dir.join(".done"), "").expect("mark the install done");
    }
    dir
}

// ------------------------------------------------------------------ C clients

/// How a C client reaches the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkMode {
    /// `-lcuda -lnvidia-ml` against the simulated library directory.
    Link,
    /// `dlopen("libcuda.so.1")` + `dlsym` of each symbol (`-DCUCLIENT_DLSYM`).
    Dlsym,
    /// `dlsym("cuGetProcAddress_v2")` only, the rest through it (`-DCUCLIENT_PROCADDR`).
    ProcAddr,
}

impl LinkMode {
    pub const ALL: [LinkMode; 3] = [LinkMode::Link, LinkMode::Dlsym, LinkMode::ProcAddr];
    pub fn name(self) -> &'static str {
        match self {
            LinkMode::Link => "link",
            LinkMode::Dlsym => "dlsym",
            LinkMode::ProcAddr => "procaddr",
        }
    }
}

/// Compiles C `source` (a path) with gcc against the real headers into
/// `target/<profile>/c-clients/<name>-<mode>`; `defines` are `-D` flags
/// (`"X"` or `"X=1"`). Recompiles only when the source is newer. Returns the
/// executable. Extra gcc arguments may be given in `extra` (e.g. `-shared`).
pub fn compile_c_with(
    source: &Path,
    name: &str,
    defines: &[&str],
    mode: LinkMode,
    extra: &[&str],
) -> PathBuf {
    let deps = test_deps();
    let a = artifacts();
    let out_dir = a.profile_dir.join("c-clients");
    std::fs::create_dir_all(&out_dir).expect("create c-clients dir");
    let mut tag = defines.join("_").replace(['=', '/', ' '], "-");
    if !tag.is_empty() {
        tag = format!("-{tag}");
    }
    let out = out_dir.join(format!("{name}-{}{tag}", mode.name()));
    let _lock = flock(&out_dir.join(".lock"));
    let newer = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    if let (Some(o), Some(s)) = (newer(&out), newer(source)) {
        if o >= s {
            return out;
        }
    }
    let mut cmd = Command::new("gcc");
    cmd.args([
        "-O1",
        "-g",
        "-Wall",
        "-Wno-unused-function",
        "-Wno-deprecated-declarations",
    ])
    .arg(format!("-I{}", deps.cuda_include.display()))
    .arg(format!("-I{}", deps.nvml_include.display()));
    for d in defines {
        cmd.arg(format!("-D{d}"));
    }
    match mode {
        LinkMode::Link => {
            cmd.arg("-DCUCLIENT_LINK");
        }
        LinkMode::Dlsym => {
            cmd.arg("-DCUCLIENT_DLSYM");
        }
        LinkMode::ProcAddr => {
            cmd.arg("-DCUCLIENT_PROCADDR");
        }
    }
    cmd.args(extra);
    let tmp = out.with_extension(format!("tmp{}", std::process::id()));
    cmd.arg(source).arg("-o").arg(&tmp);
    if mode == LinkMode::Link {
        cmd.arg(format!("-L{}", a.sim_lib_dir.display()))
            .args(["-lcuda", "-lnvidia-ml"]);
    }
    cmd.args(["-ldl", "-lpthread"]);
    let o = cmd.output().expect("run gcc");
    assert!(
        o.status.success(),
        "gcc failed for {}:\n{}",
        source.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    std::fs::rename(&tmp, &out).expect("rename compiled client");
    out
}

/// [`compile_c_with`] without extra arguments.
pub fn compile_c(source: &Path, defines: &[&str], mode: LinkMode) -> PathBuf {
    let name = source
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("client")
        .to_string();
    compile_c_with(source, &name, defines, mode, &[])
}

/// `tests/c/cuclient.c` (see the top of that file for its commands), built for `mode`.
pub fn cuclient(mode: LinkMode) -> PathBuf {
    compile_c(&workspace_root().join("tests/c/cuclient.c"), &[], mode)
}

// ------------------------------------------------------------ CUDA runtime

/// One version row of NVIDIA's CUDA runtime (`libcudart`), pinned in
/// `scripts/test-deps.sh`: CUDA 12 from `nvidia-cuda-runtime-cu12`, CUDA 13
/// from `nvidia-cuda-runtime` (installed apart, under `<venv>/cuda13`).
#[derive(Debug, Clone)]
pub struct CudartRow {
    pub major: u32,
    /// Holds this version's `cuda_runtime_api.h`.
    pub include: PathBuf,
    /// Holds `libcudart.so.<major>`.
    pub lib_dir: PathBuf,
}

/// The CUDA runtime rows: 12 and 13.
pub fn cudart_rows() -> Vec<CudartRow> {
    let deps = test_deps();
    let so12 = find_file(&deps.venv.join("lib"), "libcudart.so.12").expect("libcudart.so.12");
    let dir12 = so12.parent().expect("lib dir").to_path_buf();
    let cu13 = deps.venv.join("cuda13/nvidia/cu13");
    vec![
        CudartRow {
            major: 12,
            include: dir12.parent().expect("cuda_runtime dir").join("include"),
            lib_dir: dir12,
        },
        CudartRow {
            major: 13,
            include: cu13.join("include"),
            lib_dir: cu13.join("lib"),
        },
    ]
}

/// Compiles a CUDA runtime program (C) against `row`'s `cuda_runtime_api.h`,
/// linked with its `libcudart.so.<major>` (found at run time through an
/// rpath), into `target/<profile>/c-clients/<stem>-cudart<major>`. The
/// `crt/` headers come from `nvidia-cuda-crt` (they define only macros).
pub fn compile_cudart_client(source: &Path, row: &CudartRow) -> PathBuf {
    let deps = test_deps();
    let out_dir = artifacts().profile_dir.join("c-clients");
    std::fs::create_dir_all(&out_dir).expect("create c-clients dir");
    let stem = source
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("client");
    let out = out_dir.join(format!("{stem}-cudart{}", row.major));
    let _lock = flock(&out_dir.join(".lock"));
    let newer = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    if let (Some(o), Some(s)) = (newer(&out), newer(source)) {
        if o >= s {
            return out;
        }
    }
    let tmp = out.with_extension(format!("tmp{}", std::process::id()));
    let o = Command::new("gcc")
        .args(["-O1", "-g", "-Wall"])
        .arg(format!("-I{}", row.include.display()))
        .arg("-idirafter")
        .arg(deps.venv.join("cuda13/nvidia/cu13/include"))
        .arg(source)
        .arg("-o")
        .arg(&tmp)
        .arg(format!("-L{}", row.lib_dir.display()))
        .arg(format!("-l:libcudart.so.{}", row.major))
        .arg(format!("-Wl,-rpath,{}", row.lib_dir.display()))
        .args(["-ldl", "-lpthread"])
        .output()
        .expect("run gcc");
    assert!(
        o.status.success(),
        "gcc failed for {} (CUDA {}):\n{}",
        source.display(),
        row.major,
        String::from_utf8_lossy(&o.stderr)
    );
    std::fs::rename(&tmp, &out).expect("rename compiled client");
    out
}

// ------------------------------------------------------------------ SimEnv

static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// A fresh simulated machine: its own state directory (removed on drop) and
/// the environment that points processes at the simulated driver.
pub struct SimEnv {
    pub state_dir: PathBuf,
    pub envs: Vec<(String, String)>,
    pub preload: Option<PathBuf>,
}

impl Default for SimEnv {
    fn default() -> Self {
        Self::new()
    }
}

impl SimEnv {
    /// A new machine with the default GPU (`15109:Tesla T4`), a 300 MiB
    /// context reservation and no `LD_PRELOAD`.
    pub fn new() -> SimEnv {
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let base = std::env::temp_dir().join(format!("cgpu-test-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).expect("create sim state dir");
        SimEnv {
            state_dir: base,
            envs: Vec::new(),
            preload: None,
        }
    }

    /// `CGPU_SIM_GPUS`, e.g. `"23028:NVIDIA A10,23028:NVIDIA A10"`.
    pub fn gpus(self, spec: &str) -> Self {
        self.env("CGPU_SIM_GPUS", spec)
    }

    /// `CGPU_SIM_CTX_MIB`.
    pub fn ctx_mib(self, mib: u64) -> Self {
        self.env("CGPU_SIM_CTX_MIB", &mib.to_string())
    }

    /// Any extra environment variable for the processes.
    pub fn env(mut self, k: &str, v: &str) -> Self {
        self.envs.retain(|(a, _)| a != k);
        self.envs.push((k.to_string(), v.to_string()));
        self
    }

    /// `LD_PRELOAD` for the processes (e.g. `artifacts().libcgpu`).
    pub fn preload(mut self, lib: impl Into<PathBuf>) -> Self {
        self.preload = Some(lib.into());
        self
    }

    /// A command with this machine's environment.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let a = artifacts();
        let mut c = Command::new(program);
        let mut ld = a.sim_lib_dir.display().to_string();
        if let Ok(old) = std::env::var("LD_LIBRARY_PATH") {
            if !old.is_empty() {
                ld = format!("{ld}:{old}");
            }
        }
        c.env("LD_LIBRARY_PATH", ld)
            .env("CGPU_SIM_STATE", &self.state_dir)
            .env_remove("LD_PRELOAD");
        for (k, v) in &self.envs {
            c.env(k, v);
        }
        if let Some(p) = &self.preload {
            c.env("LD_PRELOAD", p);
        }
        c
    }

    /// Runs `program args...` to completion (timeout: 120 s), capturing output.
    pub fn run(&self, program: impl AsRef<std::ffi::OsStr>, args: &[&str]) -> Output {
        let child = self
            .command(program)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        wait_output(child, Duration::from_secs(120))
    }

    /// Runs cuclient (`mode`) with `args`; returns its stdout, panicking with
    /// its stderr if it did not exit 0.
    pub fn cuclient(&self, mode: LinkMode, args: &[&str]) -> String {
        let o = self.run(cuclient(mode), args);
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        assert!(
            o.status.success(),
            "cuclient {args:?} failed: {:?}\nstdout:\n{out}\nstderr:\n{}",
            o.status,
            String::from_utf8_lossy(&o.stderr)
        );
        out
    }

    /// Spawns `program args...` with piped stdout/stderr.
    pub fn spawn(&self, program: impl AsRef<std::ffi::OsStr>, args: &[&str]) -> Child {
        self.command(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn")
    }

    /// The state directory through `cgpu-sim-stat --json`.
    pub fn stats(&self) -> SimStats {
        sim_stats(&self.state_dir)
    }

    /// What the simulated driver says live process `pid` holds, bytes.
    pub fn live_bytes(&self, pid: u32) -> u64 {
        self.stats()
            .processes
            .iter()
            .filter(|p| p.alive && p.pid == pid)
            .map(|p| p.mem_bytes)
            .sum()
    }
}

impl Drop for SimEnv {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.state_dir);
    }
}

/// Waits for a child with a timeout (then kills it), collecting its output.
pub fn wait_output(mut child: Child, timeout: Duration) -> Output {
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if start.elapsed() > timeout => {
                let _ = child.kill();
                break;
            }
            _ => std::thread::sleep(Duration::from_millis(10)),
        }
    }
    child.wait_with_output().expect("wait child")
}

/// Reads lines of a child's stdout until one starts with `prefix` (or the
/// timeout passes); returns the lines read so far (the last one matching).
pub fn read_until(child: &mut Child, prefix: &str, timeout: Duration) -> Vec<String> {
    use std::io::BufRead;
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    let prefix = prefix.to_string();
    std::thread::spawn(move || {
        let mut r = std::io::BufReader::new(stdout);
        let mut lines = Vec::new();
        let mut l = String::new();
        while r.read_line(&mut l).unwrap_or(0) > 0 {
            let done = l.starts_with(&prefix);
            lines.push(l.trim_end().to_string());
            l.clear();
            if done {
                break;
            }
        }
        let _ = tx.send((lines, r));
    });
    match rx.recv_timeout(timeout) {
        Ok((lines, r)) => {
            child.stdout = Some(r.into_inner());
            lines
        }
        Err(_) => Vec::new(),
    }
}

/// `key=value` of a cuclient output line, e.g. `field(line, "free")`.
pub fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(key).and_then(|r| r.strip_prefix('=')))
}

/// The first line of `out` starting with `cmd ` (or equal to it).
pub fn line<'a>(out: &'a str, cmd: &str) -> &'a str {
    out.lines()
        .find(|l| l.split_whitespace().next() == Some(cmd))
        .unwrap_or_else(|| panic!("no `{cmd}` line in:\n{out}"))
}

/// A numeric `key=value` of the first `cmd` line of `out`.
pub fn num(out: &str, cmd: &str, key: &str) -> u64 {
    let l = line(out, cmd);
    field(l, key)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no numeric {key} in `{l}`"))
}

// ------------------------------------------------------------------ stats

/// The `cgpu-sim-stat --json` document: the simulated driver's own
/// definition (`shim/src/stat_schema.rs`), compiled here too rather than
/// linked (the sim's library exports the driver's symbols).
#[path = "../../shim/src/stat_schema.rs"]
mod sim_stat_schema;
pub use sim_stat_schema::{
    DeviceStat, ProcessStat, Snapshot as SimStats, StubStat, SCHEMA_VERSION as SIM_STAT_SCHEMA,
};

/// Reads a state directory with `cgpu-sim-stat --state DIR --json`.
pub fn sim_stats(state_dir: &Path) -> SimStats {
    let a = artifacts();
    let o = Command::new(&a.sim_stat)
        .arg("--state")
        .arg(state_dir)
        .arg("--json")
        .output()
        .expect("run cgpu-sim-stat");
    assert!(
        o.status.success(),
        "cgpu-sim-stat failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    serde_json::from_slice(&o.stdout).expect("cgpu-sim-stat JSON")
}

/// Where a test makes a cgroup of its own for a "container" (the agent and
/// the library tell containers apart by their cgroup path): the unified
/// hierarchy on a cgroup v2 host, else cgroup v1's `pids` hierarchy. Making
/// one there needs root.
pub fn cgroup_root() -> &'static str {
    if std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
        "/sys/fs/cgroup"
    } else {
        "/sys/fs/cgroup/pids"
    }
}
