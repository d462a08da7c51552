//! The README's quick start without a GPU: `cuda-driver-example`
//! (examples/driver_api.rs, built by `cargo build`) on the simulated driver,
//! with and without `libcgpu.so`, prints what the README shows.

use cgpu_testkit::{artifacts, SimEnv};

const A10: &str = "23028:NVIDIA A10";

fn example() -> std::path::PathBuf {
    artifacts().profile_dir.join("cuda-driver-example")
}

fn stdout(o: &std::process::Output) -> String {
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "exit {:?}\nstdout:\n{out}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

#[test]
fn under_libcgpu_it_sees_its_quota_and_is_refused_at_it() {
    let env = SimEnv::new().gpus(A10).ctx_mib(300);
    let ledger = env.state_dir.join("ledger");
    std::fs::create_dir_all(&ledger).unwrap();
    let env = env
        .env("CGPU_LEDGER_DIR", ledger.to_str().unwrap())
        .env("ALIYUN_COM_GPU_MEM_CONTAINER", "4")
        .preload(&artifacts().libcgpu);
    let out = stdout(&env.run(example(), &[]));
    assert!(
        out.contains("GPU 0: NVIDIA A10, 4096 MiB (cuDeviceTotalMem)"),
        "{out}"
    );
    assert!(
        out.contains("cuMemGetInfo: 3796 MiB free of 4096 MiB"),
        "{out}"
    );
    // 4096 MiB less the context's 300: 14 blocks of 256 MiB fit, the 15th not.
    assert!(
        out.contains(
            "got 14 blocks (3584 MiB), then cuMemAlloc returned 2 (CUDA_ERROR_OUT_OF_MEMORY)"
        ),
        "{out}"
    );
    assert!(
        out.contains("kernel cgpu_example_fill: launched on 1048576 words, synchronised"),
        "{out}"
    );
}

#[test]
fn without_libcgpu_it_sees_the_whole_gpu() {
    let env = SimEnv::new().gpus(A10).ctx_mib(300);
    let out = stdout(&env.run(example(), &["--max-blocks", "4"]));
    assert!(
        out.contains("GPU 0: NVIDIA A10, 23028 MiB (cuDeviceTotalMem)"),
        "{out}"
    );
    assert!(
        out.contains("got 4 blocks (1024 MiB), the most asked for"),
        "{out}"
    );
}

#[test]
fn a_bad_argument_is_refused_with_a_message() {
    let env = SimEnv::new().gpus(A10);
    let o = env.run(example(), &["--block-mib", "lots"]);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--block-mib takes a positive number"), "{err}");
}
