//! JAX (`jax[cuda12]`, pinned) on the simulated driver. JAX tries CUDA only
//! when a device node of an NVIDIA GPU exists (`/dev/nvidia0`,
//! `/dev/nvidiactl` or `/dev/dxg`); `shim/tools/sim-devnodes.sh` runs a
//! command with them in a private mount namespace. Without them JAX falls
//! back to the CPU; with them it runs on the simulated GPU: its device, XLA's
//! memory limit from the driver's free memory, data in and out, and an
//! allocation past the device refused with XLA's RESOURCE_EXHAUSTED.
//!
//! Both tests are ignored by default: JAX with its CUDA libraries is ~5.5 GB
//! from PyPI (installed once into `target/test-deps/jax-0.10.2`), and the
//! device nodes need root or unprivileged user namespaces with overlayfs.
//! Run them with `cargo test -p cgpu-sim --test jax -- --ignored`
//! (`CGPU_TEST_JAX_PYTHON=/path/to/python` uses a Python that has it).

use cgpu_testkit::{test_deps, workspace_root, SimEnv};
use std::path::PathBuf;
use std::process::Command;

const JAX: &str = "jax[cuda12]==0.10.2";

/// The pinned JAX in a venv of its own, installed once under a lock
/// (`CGPU_TEST_JAX_PYTHON`: a Python that already has it).
fn jax_python() -> PathBuf {
    if let Some(p) = std::env::var_os("CGPU_TEST_JAX_PYTHON") {
        return PathBuf::from(p);
    }
    let deps = test_deps();
    let dir = deps
        .venv
        .parent()
        .expect("test-deps dir")
        .join("jax-0.10.2");
    let lock = dir.with_extension("lock");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock)
        .expect("open the lock");
    // SAFETY: a valid open fd; flock has no memory effects.
    unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&f), libc::LOCK_EX) };
    let py = dir.join("bin/python");
    if !dir.join(".done").exists() {
        let _ = std::fs::remove_dir_all(&dir);
        let st = Command::new(deps.venv.join("bin/python"))
            .args(["-m", "venv"])
            .arg(&dir)
            .status()
            .expect("make the venv");
        assert!(st.success(), "python -m venv {}", dir.display());
        let o = Command::new(dir.join("bin/pip"))
            .args(["install", "--disable-pip-version-check", "-q", JAX])
            .output()
            .expect("run pip");
        assert!(
            o.status.success(),
            "could not install {JAX} from PyPI:\n{}",
            String::from_utf8_lossy(&o.stderr)
        );
        std::fs::write(dir.join(".done"), "").expect("mark the install done");
    }
    py
}

fn devnodes() -> PathBuf {
    workspace_root().join("shim/tools/sim-devnodes.sh")
}

fn run_client(env: &SimEnv, wrapped: bool) -> serde_json::Value {
    let py = jax_python();
    let client = workspace_root().join("shim/tests/py/jax_client.py");
    let mut c = if wrapped {
        let mut c = env.command(devnodes());
        c.arg(&py);
        c
    } else {
        env.command(&py)
    };
    let o = c
        .arg(&client)
        .env("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
        .output()
        .expect("run the JAX client");
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success(),
        "jax client: {:?}\n{out}\n{err}",
        o.status
    );
    let line = out.lines().last().unwrap_or_default();
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {out}\n{err}"))
}

/// The device nodes exist inside the wrapper only, the real `/dev` stays
/// usable in it, and the command's exit status comes back.
#[test]
#[ignore = "needs root or unprivileged user namespaces with overlayfs"]
fn device_nodes_exist_only_inside_the_wrapper() {
    let o = Command::new(devnodes())
        .env("CGPU_SIM_GPUS", "23028:NVIDIA A10,23028:NVIDIA A10")
        .args([
            "sh",
            "-c",
            "test -e /dev/nvidiactl && test -e /dev/nvidia0 && test -e /dev/nvidia1 \
             && ! test -e /dev/nvidia2 && echo x >/dev/null && test -d /dev/shm && exit 7",
        ])
        .output()
        .expect("run the wrapper");
    assert_eq!(
        o.status.code(),
        Some(7),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(!std::path::Path::new("/dev/nvidiactl").exists() || nvidia_machine());
}

/// A machine with a real NVIDIA driver has the nodes anyway.
fn nvidia_machine() -> bool {
    std::path::Path::new("/proc/driver/nvidia").exists()
}

#[test]
#[ignore = "installs JAX with its CUDA 12 libraries (~5.5 GB) on the first run"]
fn jax_runs_on_the_simulated_gpu_given_device_nodes() {
    let env = SimEnv::new().gpus("23028:NVIDIA A10");
    if !nvidia_machine() {
        let bare = run_client(&env, false);
        assert_eq!(bare["devnode"], false, "{bare}");
        assert_eq!(
            bare["platform"], "cpu",
            "JAX skips CUDA without a device node: {bare}"
        );
    }
    let v = run_client(&env, true);
    assert_eq!(v["devnode"], true, "{v}");
    assert_eq!(v["platform"], "gpu", "{v}");
    assert_eq!(v["kind"], "NVIDIA A10", "{v}");
    let limit = v["bytes_limit"].as_u64().unwrap_or(0);
    let total = 23028u64 << 20;
    assert!(
        limit > total / 2 && limit < total,
        "XLA's limit comes from the driver's free memory: {v}"
    );
    assert_eq!(v["roundtrip"], 1023, "{v}");
    let big = v["big"].as_str().unwrap_or_default();
    assert!(big.contains("RESOURCE_EXHAUSTED"), "{v}");
    assert_eq!(v["after"], 1 << 20, "{v}");
}
