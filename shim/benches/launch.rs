//! Per-launch overhead of the simulated device: N back-to-back 5 us
//! `cgpu_sim_spin` kernels + one synchronisation, against the ideal (one
//! sleep of N x 5 us) measured in the same run. The ratio is the sim's
//! overhead on wall time; it should stay close to 1.
//!
//! `cargo bench -p cgpu-sim --bench launch`

use cgpu_ffi::*;
use cgpu_sim::cuda::*;
use criterion::{criterion_group, Criterion};
use std::ffi::c_void;
use std::time::Duration;

const N: u64 = 2000;
const NS: u64 = 5_000;

/// The simulated GPU's state directory of this run (removed at the end).
fn state_dir() -> std::path::PathBuf {
    std::env::temp_dir().join(format!("cgpu-sim-bench-{}", std::process::id()))
}

fn setup() -> CUfunction {
    let dir = state_dir();
    std::env::set_var("CGPU_SIM_STATE", &dir);
    let ptx =
        c".version 7.0\n.target sm_52\n.visible .entry cgpu_sim_spin(.param .u64 a)\n{ ret; }\n";
    // SAFETY: the driver API with valid arguments.
    unsafe {
        assert_eq!(cuInit(0), CUDA_SUCCESS);
        let mut ctx = std::ptr::null_mut();
        assert_eq!(cuDevicePrimaryCtxRetain(&mut ctx, 0), CUDA_SUCCESS);
        assert_eq!(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
        let mut m = std::ptr::null_mut();
        assert_eq!(
            cuModuleLoadData(&mut m, ptx.as_ptr() as *const c_void),
            CUDA_SUCCESS
        );
        let mut f = std::ptr::null_mut();
        assert_eq!(
            cuModuleGetFunction(&mut f, m, c"cgpu_sim_spin".as_ptr()),
            CUDA_SUCCESS
        );
        f
    }
}

fn bench(c: &mut Criterion) {
    let f = setup();
    let mut g = c.benchmark_group("2000 x 5us kernels");
    g.measurement_time(Duration::from_secs(5)).sample_size(20);
    g.bench_function("ideal (one sleep of 10 ms)", |b| {
        b.iter(|| {
            let t = cgpu_sim::state::now_mono_ns() + N * NS;
            cgpu_sim::exec::sleep_until(t);
        })
    });
    g.bench_function("launch + synchronize", |b| {
        b.iter(|| {
            let mut ns = NS;
            let mut args = [&mut ns as *mut u64 as *mut c_void];
            for _ in 0..N {
                // SAFETY: valid function handle and parameters.
                let r = unsafe {
                    cuLaunchKernel(
                        f,
                        1,
                        1,
                        1,
                        32,
                        1,
                        1,
                        0,
                        std::ptr::null_mut(),
                        args.as_mut_ptr(),
                        std::ptr::null_mut(),
                    )
                };
                assert_eq!(r, CUDA_SUCCESS);
            }
            // SAFETY: a current context exists.
            assert_eq!(unsafe { cuCtxSynchronize() }, CUDA_SUCCESS);
        })
    });
    g.finish();
}

criterion_group!(benches, bench);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    let _ = std::fs::remove_dir_all(state_dir());
}
