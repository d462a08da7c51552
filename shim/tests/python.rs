//! Unmodified NVIDIA Python packages on the sim: cuda-bindings (driver API)
//! and nvidia-ml-py (pynvml), from PyPI, in the test venv.

use cgpu_testkit::{read_until, test_deps, LinkMode, SimEnv};
use serde_json::Value;
use std::time::Duration;

const MIB: u64 = 1 << 20;

fn run_py(env: &SimEnv, script: &str, args: &[&str]) -> (Value, String) {
    let deps = test_deps();
    let path = cgpu_testkit::workspace_root()
        .join("shim/tests/py")
        .join(script);
    let mut full = vec![path.to_str().unwrap()];
    full.extend_from_slice(args);
    let o = env.run(&deps.python, &full);
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(
        o.status.success(),
        "{script} failed: {:?}\n{stdout}\n{stderr}",
        o.status
    );
    let v: Value = serde_json::from_str(stdout.lines().last().unwrap_or(""))
        .unwrap_or_else(|e| panic!("{e}: {stdout}"));
    (v, stderr)
}

fn check_bindings(v: &Value) {
    assert_eq!(v["driver_version"], 13050);
    assert_eq!(v["count"], 1);
    assert_eq!(v["name"], "NVIDIA A10");
    assert_eq!(v["total"], 4000 * MIB);
    assert_eq!(v["cc"], serde_json::json!([8, 6]));
    assert_eq!(
        v["meminfo"],
        serde_json::json!([(4000 - 300) * MIB, 4000 * MIB])
    );
    assert_eq!(v["oom_error"], "CUDA_ERROR_OUT_OF_MEMORY");
    // 3700 MiB free in 256 MiB chunks
    assert_eq!(v["oom_count"], 14);
    assert_eq!(v["free_at_oom"], (3700 - 14 * 256) * MIB);
    assert_eq!(v["free_after"], 3700 * MIB);
    assert_eq!(v["copy_ok"], true);
    assert_eq!(v["async_copy_ok"], true);
    assert_eq!(v["missing_kernel_error"], "CUDA_ERROR_NOT_FOUND");
    // 10 kernels x 2 ms, timed with events on the device clock: at least the
    // kernels' device time, at most the host's wall time around it (idle gaps
    // between slow launches count, as on a real GPU).
    let ms = v["elapsed_ms"].as_f64().unwrap();
    let wall = v["wall_ms"].as_f64().unwrap();
    assert!(
        ms >= 20.0 && ms <= wall + 0.5,
        "elapsed {ms} ms, wall {wall} ms"
    );
    // a library kernel launched as a function, and a pool allocation
    assert!(v["library_kernel_ms"].as_f64().unwrap() >= 3.0, "{v}");
    assert_eq!(v["pool_charged"], MIB);
    assert_eq!(v["pool_returned"], true);
}

#[test]
fn cuda_bindings_runs_unmodified() {
    let env = SimEnv::new().gpus("4000:NVIDIA A10");
    let (v, _) = run_py(
        &env,
        "cuda_bindings_client.py",
        &["268435456", "2000000", "10"],
    );
    check_bindings(&v);
}

/// With per-thread default streams, cuda-bindings asks with flags=2 and gets
/// the _ptds/_ptsz variants; every name it resolves eagerly is a real
/// implementation (none is a NOT_SUPPORTED legacy stub).
#[test]
fn cuda_bindings_per_thread_default_stream() {
    let env = SimEnv::new()
        .gpus("4000:NVIDIA A10")
        .env("CUDA_PYTHON_CUDA_PER_THREAD_DEFAULT_STREAM", "1")
        .env("CGPU_SIM_TRACE", "1");
    let (v, trace) = run_py(
        &env,
        "cuda_bindings_client.py",
        &["268435456", "2000000", "10"],
    );
    check_bindings(&v);
    let reqs: Vec<&str> = trace
        .lines()
        .filter(|l| l.contains("cuGetProcAddress("))
        .collect();
    assert!(
        reqs.len() > 300,
        "eager resolution pass: {} requests",
        reqs.len()
    );
    assert!(
        reqs.iter().all(|l| l.contains(", 2) -> ")),
        "all with the PTDS flag"
    );
    assert!(!trace.contains("legacy stub"), "{trace}");
    for want in [
        "cuGetProcAddress(cuMemcpyHtoD, 7000, 2) -> cuMemcpyHtoD_v2_ptds",
        "cuGetProcAddress(cuLaunchKernel, 7000, 2) -> cuLaunchKernel_ptsz",
        "cuGetProcAddress(cuStreamSynchronize, 7000, 2) -> cuStreamSynchronize_ptsz",
        "cuGetProcAddress(cuMemAlloc, 3020, 2) -> cuMemAlloc_v2",
        "cuGetProcAddress(cuCtxCreate, 12050, 2) -> cuCtxCreate_v4",
        "cuGetProcAddress(cuCtxGetDevice, 13000, 2) -> cuCtxGetDevice_v2",
    ] {
        assert!(trace.contains(want), "missing `{want}` in\n{trace}");
    }
}

#[test]
fn pynvml_reads_devices_memory_and_processes() {
    let env = SimEnv::new()
        .gpus("4000:NVIDIA A10,8000:Tesla T4")
        .ctx_mib(300);
    let mut holder = env.spawn(
        cgpu_testkit::cuclient(LinkMode::Link),
        &["pid", "alloc", "104857600", "hold"],
    );
    let lines = read_until(&mut holder, "holding", Duration::from_secs(60));
    let pid: u64 = lines
        .iter()
        .find_map(|l| cgpu_testkit::field(l, "pid"))
        .unwrap()
        .parse()
        .unwrap();
    let (v, _) = run_py(&env, "pynvml_client.py", &[]);
    holder.kill().unwrap();
    holder.wait().unwrap();
    assert_eq!(v["cuda"], 13050);
    assert_eq!(v["bad_index"], "Invalid Argument");
    let devs = v["devices"].as_array().unwrap();
    assert_eq!(devs.len(), 2);
    assert_eq!(devs[0]["name"], "NVIDIA A10");
    assert_eq!(devs[1]["name"], "Tesla T4");
    assert_ne!(devs[0]["uuid"], devs[1]["uuid"]);
    assert_eq!(devs[0]["total"], 4000 * MIB);
    assert_eq!(devs[0]["used"], 400 * MIB);
    assert_eq!(devs[0]["free"], 3600 * MIB);
    assert_eq!(devs[0]["v2"]["used"], 400 * MIB);
    assert_eq!(devs[0]["v2"]["total"], 4000 * MIB);
    assert_eq!(devs[0]["procs"], serde_json::json!([[pid, 400 * MIB]]));
    assert_eq!(devs[1]["used"], 0);
    assert_eq!(devs[1]["procs"], serde_json::json!([]));
    assert_eq!(devs[0]["cc"], serde_json::json!([8, 6]));
}

/// `cuCtxSetLimit` reserves device memory as the driver does: the stack for
/// every resident thread, the malloc heap and the printf FIFO, beyond their
/// defaults (which the context's own reservation covers). cuMemGetInfo, NVML
/// and cgpu-sim-stat agree; a reservation that does not fit is refused.
#[test]
fn context_limits_reserve_device_memory() {
    let env = SimEnv::new().gpus("8000:NVIDIA A10").ctx_mib(300);
    let stat = cgpu_testkit::artifacts().sim_stat.clone();
    let (v, _) = run_py(&env, "limits_client.py", &[stat.to_str().unwrap()]);
    // A10: 1536 resident threads on each of 72 SMs.
    let threads = 1536 * 72;
    assert_eq!(v["threads"], threads);
    assert_eq!(v["defaults"], serde_json::json!([1024, MIB, 8 * MIB]));
    let all_agree = |key: &str, want: u64| {
        let u = &v[key];
        for k in ["cu", "nvml", "nvml_process", "stat", "stat_process"] {
            assert_eq!(u[k], want, "{key}.{k}: {v:#}");
        }
    };
    all_agree("base", 300 * MIB);
    let stack = (4096 - 1024) * threads;
    all_agree("stack_4k", 300 * MIB + stack);
    assert_eq!(v["stack_read"], 4096);
    let three = 300 * MIB + stack + (64 - 8) * MIB + (4 - 1) * MIB;
    all_agree("all_three", three);
    assert_eq!(v["heap_read"], 64 * MIB);
    assert_eq!(v["printf_read"], 4 * MIB);
    assert_eq!(v["stack_huge"], "CUDA_ERROR_OUT_OF_MEMORY");
    assert_eq!(v["heap_huge"], "CUDA_ERROR_OUT_OF_MEMORY");
    all_agree("after_refusals", three);
    assert_eq!(v["stack_after_refusal"], 4096);
    assert_eq!(v["heap_after_refusal"], 64 * MIB);
    all_agree("stack_low", three - stack);
    assert_eq!(v["stack_low_read"], 512);
    assert_eq!(v["pending_read"], 4096);
    assert_eq!(v["l2_fetch_read"], 128);
    assert_eq!(v["persisting_max"], 3 * MIB);
    assert_eq!(v["persisting_read"], 3 * MIB);
    assert_eq!(v["cig_set"], "CUDA_ERROR_INVALID_VALUE");
    assert_eq!(v["sync_depth_25"], "CUDA_ERROR_INVALID_VALUE");
    assert_eq!(v["bad_limit"], "CUDA_ERROR_UNSUPPORTED_LIMIT");
    for k in ["nvml", "stat"] {
        assert_eq!(v["destroyed"][k], 0, "{v:#}");
    }
    assert_eq!(v["new_ctx_stack"], 1024);
    all_agree("primary_heap", 300 * MIB + 8 * MIB);
    for k in ["nvml", "stat"] {
        assert_eq!(v["primary_released"][k], 0, "{v:#}");
    }
    assert_eq!(v["primary_heap_again"], 8 * MIB);
    assert!(cgpu_sim::stat::snapshot(&env.state_dir)
        .unwrap()
        .stubs
        .is_empty());
}

/// CUDA checkpointing driven by one process on another, through
/// cuda-bindings: a locked process's calls wait, a checkpointed one holds no
/// device memory (NVML), a restore that no longer fits fails and leaves it
/// checkpointed, a restore brings the memory and its bytes back.
#[test]
fn checkpoint_lock_release_restore_another_process() {
    let env = SimEnv::new()
        .gpus("8000:NVIDIA A10")
        .ctx_mib(300)
        .env("CGPU_SIM_DRIVER_VERSION", "13050");
    let (v, _) = run_py(&env, "checkpoint_client.py", &[]);
    let held = (300 + 256) * MIB;
    assert_eq!(v["running"], serde_json::json!([0, held]), "{v:#}");
    assert_eq!(v["restore_thread"], true);
    for k in ["unlock_running", "lock_again", "restore_locked"] {
        assert_eq!(v[k], "CUDA_ERROR_ILLEGAL_STATE", "{k}: {v:#}");
    }
    assert_eq!(v["locked"], 1);
    assert!(v["call_while_locked"].is_null(), "{v:#}");
    assert_eq!(v["checkpointed"], serde_json::json!([2, 0]));
    assert_eq!(
        v["restore_no_room"],
        serde_json::json!(["CUDA_ERROR_OUT_OF_MEMORY", 2])
    );
    assert_eq!(v["restored"], serde_json::json!([1, held]));
    assert!(v["call_before_unlock"].is_null(), "{v:#}");
    assert_eq!(v["unlocked"], 0);
    assert_eq!(v["call_after_unlock"], serde_json::json!(["done", "0"]));
    assert_eq!(v["bytes_kept"], serde_json::json!(["bytes", "1"]));
    assert_eq!(v["not_cuda"], "CUDA_ERROR_INVALID_VALUE");
    assert_eq!(v["complete_unknown"], "CUDA_ERROR_INVALID_VALUE");
    assert!(cgpu_sim::stat::snapshot(&env.state_dir)
        .unwrap()
        .stubs
        .is_empty());
}
