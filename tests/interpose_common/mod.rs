//! Shared support for the interposer tests: a fresh simulated machine (sim
//! state, ledger directory, `libcuda.so.1`/`libnvidia-ml.so.1` links) per
//! test, processes run under `LD_PRELOAD=libcgpu.so`, JSON-line output.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;

/// `target/<profile>` of this test binary.
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `libcgpu.so` (built with this test) and the simulated driver.
pub fn artifacts() -> (PathBuf, PathBuf) {
    let dir = profile_dir();
    let cgpu = dir.join("libcgpu.so");
    assert!(cgpu.exists(), "{} missing", cgpu.display());
    (cgpu, sim_lib())
}

/// The simulated driver: `target/<profile>/libcgpu_sim.so` when the
/// workspace build made it, else built once into `target/it-sim/`.
pub fn sim_lib() -> PathBuf {
    static SIM: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    SIM.get_or_init(|| {
        if let Some(p) = std::env::var_os("CGPU_TEST_SIM") {
            return PathBuf::from(p);
        }
        let p = profile_dir().join("libcgpu_sim.so");
        if p.exists() {
            return p;
        }
        let release = profile_dir().ends_with("release");
        let td = repo().join("target/it-sim");
        let mut c = Command::new(env!("CARGO"));
        c.args(["build", "-q", "-p", "cgpu-sim", "--target-dir"])
            .arg(&td)
            .current_dir(repo());
        if release {
            c.arg("--release");
        }
        let st = c.status().expect("cargo build -p cgpu-sim");
        assert!(st.success(), "building the simulated driver failed");
        let p = td
            .join(if release { "release" } else { "debug" })
            .join("libcgpu_sim.so");
        assert!(p.exists(), "{} missing", p.display());
        p
    })
    .clone()
}

/// `target/test-deps/venv` (cuda-bindings, nvidia-ml-py, real headers),
/// made by `scripts/test-deps.sh` when missing.
pub fn venv() -> Option<PathBuf> {
    static V: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    V.get_or_init(|| {
        let v = repo().join("target/test-deps/venv");
        if !v.join(".cgpu-test-deps-v1").exists() {
            let script = repo().join("scripts/test-deps.sh");
            if script.exists() {
                let _ = Command::new("bash").arg(script).arg(&v).status();
            }
        }
        v.join(".cgpu-test-deps-v1").exists().then_some(v)
    })
    .clone()
}

/// Include directories holding the real `cuda.h` and `nvml.h`.
pub fn cuda_include_dirs() -> Vec<PathBuf> {
    let v =
        venv().expect("test deps (scripts/test-deps.sh) unavailable: cannot fetch cuda.h/nvml.h");
    let mut out = Vec::new();
    fn walk(d: &Path, out: &mut Vec<PathBuf>, depth: u32) {
        let Ok(rd) = std::fs::read_dir(d) else { return };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() && depth < 8 {
                walk(&p, out, depth + 1);
            } else if matches!(
                p.file_name().and_then(|n| n.to_str()),
                Some("cuda.h" | "nvml.h")
            ) {
                let dir = p.parent().unwrap().to_path_buf();
                if !out.contains(&dir) {
                    out.push(dir);
                }
            }
        }
    }
    walk(&v.join("lib"), &mut out, 0);
    out
}

static SEQ: AtomicU32 = AtomicU32::new(0);

/// One simulated machine.
pub struct Machine {
    pub root: PathBuf,
    pub libdir: PathBuf,
    pub state: PathBuf,
    pub ledger: PathBuf,
    pub cgpu: PathBuf,
    pub gpus: String,
}

impl Machine {
    /// `gpus`: `CGPU_SIM_GPUS` (e.g. `15109:Tesla T4`).
    pub fn new(name: &str, gpus: &str) -> Machine {
        let (cgpu, sim) = artifacts();
        let root = std::env::temp_dir().join(format!(
            "cgpu-it-{}-{}-{}",
            name,
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&root);
        let libdir = root.join("lib");
        std::fs::create_dir_all(&libdir).unwrap();
        for l in [
            "libcuda.so.1",
            "libcuda.so",
            "libnvidia-ml.so.1",
            "libnvidia-ml.so",
        ] {
            std::os::unix::fs::symlink(&sim, libdir.join(l)).unwrap();
        }
        let m = Machine {
            state: root.join("state"),
            ledger: root.join("ledger"),
            libdir,
            root,
            cgpu,
            gpus: gpus.to_string(),
        };
        std::fs::create_dir_all(&m.state).unwrap();
        std::fs::create_dir_all(&m.ledger).unwrap();
        m
    }

    /// A command with the machine's environment (no cgpu variables, no preload).
    pub fn bare(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new(program);
        for (k, _) in std::env::vars() {
            if k.starts_with("ALIYUN_COM_GPU") || k.starts_with("CGPU_") || k == "LD_PRELOAD" {
                c.env_remove(k);
            }
        }
        c.env("LD_LIBRARY_PATH", &self.libdir)
            .env("CGPU_SIM_STATE", &self.state)
            .env("CGPU_SIM_GPUS", &self.gpus)
            .env("CGPU_LEDGER_DIR", &self.ledger)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .stdin(Stdio::null());
        c
    }

    /// A command under `LD_PRELOAD=libcgpu.so` with `vars` set.
    pub fn preloaded(
        &self,
        program: impl AsRef<std::ffi::OsStr>,
        vars: &[(&str, &str)],
    ) -> Command {
        let mut c = self.bare(program);
        c.env("LD_PRELOAD", &self.cgpu);
        for (k, v) in vars {
            c.env(k, v);
        }
        c
    }

    /// The Python ctypes client (`tests/py/cgpu_client.py`).
    pub fn client(&self, vars: Option<&[(&str, &str)]>, args: &[&str]) -> Command {
        let mut c = match vars {
            Some(v) => self.preloaded(python(), v),
            None => self.bare(python()),
        };
        c.arg(repo().join("tests/py/cgpu_client.py")).args(args);
        c
    }

    /// The sim's per-process device memory (NVML, without cgpu), by pid.
    pub fn sim_process_bytes(&self) -> Vec<(u32, u64)> {
        let out = run_ok(&mut self.client(None, &["nvml"]));
        let j = lines(&out).into_iter().find(|j| j["op"] == "nvml").unwrap();
        j["procs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| (p[0].as_u64().unwrap() as u32, p[1].as_u64().unwrap()))
            .collect()
    }

    /// The ledger file of the (only) GPU.
    pub fn ledger_file(&self) -> Option<PathBuf> {
        cgpu::ledger::Ledger::list(&self.ledger).into_iter().next()
    }
}

impl Drop for Machine {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.root);
        }
    }
}

/// The Python that has cuda-bindings and nvidia-ml-py (for ctypes any will do).
pub fn python() -> PathBuf {
    match venv() {
        Some(v) => v.join("bin/python"),
        None => PathBuf::from("python3"),
    }
}

/// Run to completion, assert success, return stdout.
pub fn run_ok(c: &mut Command) -> String {
    let o = run(c);
    assert!(
        o.status.success(),
        "{c:?} failed: {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn run(c: &mut Command) -> Output {
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = c.spawn().unwrap_or_else(|e| panic!("spawn {c:?}: {e}"));
    wait_timeout(child, Duration::from_secs(120))
}

/// Wait for a child, killing it after `t` (then the test fails).
pub fn wait_timeout(mut child: Child, t: Duration) -> Output {
    let start = Instant::now();
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if start.elapsed() > t {
            let _ = child.kill();
            let o = child.wait_with_output().unwrap();
            panic!(
                "process hung for {t:?}\nstdout:\n{}\nstderr:\n{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Parse JSON lines.
pub fn lines(s: &str) -> Vec<serde_json::Value> {
    s.lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The first JSON line whose `op` is `op`.
pub fn op(s: &str, op: &str) -> serde_json::Value {
    lines(s)
        .into_iter()
        .find(|j| j["op"] == op)
        .unwrap_or_else(|| panic!("no {op} line in:\n{s}"))
}

/// Compile a C file with `cc`, against the real `cuda.h`/`nvml.h`.
pub fn cc(src: &Path, out: &Path, extra: &[&str]) {
    let inc = cuda_include_dirs();
    let mut c = Command::new("cc");
    c.arg("-O1").arg("-o").arg(out).arg(src);
    for i in inc {
        c.arg("-I").arg(i);
    }
    c.args(extra);
    let o = c.output().expect("cc");
    assert!(
        o.status.success(),
        "cc failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Poll `f` until it returns true or `t` passes; returns the elapsed time.
pub fn eventually(t: Duration, mut f: impl FnMut() -> bool) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < t {
        if f() {
            return Some(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}
