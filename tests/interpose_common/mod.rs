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

/// `libcgpu.so` and the simulated driver (built by `cgpu_testkit`).
pub fn artifacts() -> (PathBuf, PathBuf) {
    let a = cgpu_testkit::artifacts();
    assert!(a.libcgpu.exists(), "{} missing", a.libcgpu.display());
    (a.libcgpu.clone(), sim_lib())
}

/// The simulated driver (`CGPU_TEST_SIM` overrides).
pub fn sim_lib() -> PathBuf {
    match std::env::var_os("CGPU_TEST_SIM") {
        Some(p) => PathBuf::from(p),
        None => cgpu_testkit::artifacts().libsim.clone(),
    }
}

/// The venv with cuda-bindings, nvidia-ml-py and the real headers.
pub fn venv() -> Option<PathBuf> {
    Some(cgpu_testkit::test_deps().venv.clone())
}

/// Include directories holding the real `cuda.h` and `nvml.h`.
pub fn cuda_include_dirs() -> Vec<PathBuf> {
    let d = cgpu_testkit::test_deps();
    vec![d.cuda_include.clone(), d.nvml_include.clone()]
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
    cgpu_testkit::test_deps().python.clone()
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

/// Compile the C file `src` against the real `cuda.h`/`nvml.h` with the
/// testkit (cached, shared by the tests), as `-D` `defines`; linked with
/// `-lcuda -lnvidia-ml` (against the simulated driver) when `link_driver`.
pub fn cc(src: &Path, name: &str, defines: &[&str], link_driver: bool) -> PathBuf {
    use cgpu_testkit::LinkMode;
    let mode = if link_driver {
        LinkMode::Link
    } else {
        LinkMode::Dlsym
    };
    cgpu_testkit::compile_c_with(src, name, defines, mode, &[])
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
