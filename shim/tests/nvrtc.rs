//! Cubins made by NVIDIA's NVRTC (the runtime compiler frameworks use for
//! their own kernels) on the simulated driver: a template kernel, a weak
//! symbol in the cubin, is found by its lowered name, and every kernel's
//! parameters (`cuFuncGetParamCount`/`cuFuncGetParamInfo`) are read from the
//! image (`.nv.info.<kernel>`), as the driver reads them.
//!
//! NVRTC (pinned) comes from PyPI into `target/test-deps/nvrtc`, through the
//! test venv's pip, once.

use cgpu_testkit::{artifacts, test_deps, workspace_root, SimEnv};
use std::path::PathBuf;
use std::process::Command;

const NVRTC: &str = "nvidia-cuda-nvrtc-cu12==12.9.86";

/// Installs NVRTC (once); returns `libnvrtc.so.12`.
fn nvrtc() -> PathBuf {
    cgpu_testkit::pip_target("nvrtc", NVRTC).join("nvidia/cuda_nvrtc/lib/libnvrtc.so.12")
}

#[test]
fn nvrtc_cubins_weak_template_kernels_and_parameters() {
    let a = artifacts();
    let include = test_deps().venv.join("cuda13/nvidia/cu13/include");
    let out = a.profile_dir.join("c-clients");
    std::fs::create_dir_all(&out).expect("create c-clients dir");
    let bin = out.join(format!("nvrtc_client.tmp{}", std::process::id()));
    let o = Command::new("gcc")
        .args(["-O1", "-g", "-Wall", "-Werror"])
        .arg(format!("-I{}", include.display()))
        .arg(workspace_root().join("shim/tests/c/nvrtc_client.c"))
        .arg("-o")
        .arg(&bin)
        .arg(format!("-L{}", a.sim_lib_dir.display()))
        .args(["-lcuda", "-ldl"])
        .output()
        .expect("run gcc");
    assert!(
        o.status.success(),
        "gcc nvrtc_client.c:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let final_bin = out.join("nvrtc_client");
    std::fs::rename(&bin, &final_bin).expect("rename the client");
    let lib = nvrtc();
    let env = SimEnv::new().gpus("23028:NVIDIA A10");
    let o = env.run(&final_bin, &[lib.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{:?}\n{stdout}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    // scale<float>(float *, float, int); plain(float *, double, char, int); none().
    assert!(
        stdout.contains("_Z5scaleIfEvPT_S0_i ok params=0:8,8:4,12:4"),
        "{stdout}"
    );
    assert!(
        stdout.contains("plain ok params=0:8,8:8,16:1,20:4"),
        "{stdout}"
    );
    assert!(stdout.contains("none ok params=-"), "{stdout}");
    assert!(stdout.contains("not_there ok"), "{stdout}");
}
