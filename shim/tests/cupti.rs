//! NVIDIA's CUPTI (the profiling library under `torch.profiler`) on the
//! simulated driver: the driver table CUPTI asks for is answered empty, so
//! CUPTI 12.9, 13.2 and 13.4 each report that they cannot profile (an error
//! from every call) and the CUDA runtime goes on working. Refused outright,
//! CUPTI 13.2 asked again and again until its stack overflowed.
//!
//! The CUPTI wheels (pinned) come from PyPI into `target/test-deps/cupti`,
//! through the test venv's pip, once.

use cgpu_testkit::{compile_cudart_client, cudart_rows, workspace_root, SimEnv};
use std::path::PathBuf;

/// (package, the CUDA major of its runtime, its library inside the install).
const CUPTI: [(&str, u32, &str); 3] = [
    (
        "nvidia-cuda-cupti-cu12==12.9.79",
        12,
        "nvidia/cuda_cupti/lib/libcupti.so.12",
    ),
    (
        "nvidia-cuda-cupti==13.2.86",
        13,
        "nvidia/cu13/lib/libcupti.so.13",
    ),
    (
        "nvidia-cuda-cupti==13.4.92",
        13,
        "nvidia/cu13/lib/libcupti.so.13",
    ),
];

/// Installs `pkg` (once) and returns its directory.
fn install(pkg: &str) -> PathBuf {
    cgpu_testkit::pip_target("cupti", pkg)
}

#[test]
fn cupti_refuses_cleanly_and_cuda_keeps_working() {
    let src = workspace_root().join("shim/tests/c/cupti_client.c");
    let rows = cudart_rows();
    for (pkg, major, lib) in CUPTI {
        let row = rows.iter().find(|r| r.major == major).expect("cudart row");
        let client = compile_cudart_client(&src, row);
        let libcupti = install(pkg).join(lib);
        let env = SimEnv::new().gpus("23028:NVIDIA A10");
        let o = env.run(&client, &[libcupti.to_str().unwrap()]);
        let out = String::from_utf8_lossy(&o.stdout);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            o.status.success() && out.contains("cuda ok"),
            "{pkg}: {:?}\n{out}\n{err}",
            o.status
        );
        // Every profiling request is refused with a CUPTI error (no
        // profiler runs on the sim), none of them crashes.
        for step in ["subscribe", "register", "enable_10", "flush"] {
            let rc: i32 = out
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{step} ")))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or_else(|| panic!("{pkg}: no {step} line:\n{out}"));
            assert_ne!(rc, 0, "{pkg}: {step} succeeded:\n{out}");
        }
    }
}
