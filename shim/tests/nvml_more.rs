//! NVML queries beyond the monitoring basics, through unmodified
//! nvidia-ml-py: affinity, extended PCI info, field values, retired pages,
//! versioned temperature, capabilities, UUID look-up by struct, topology,
//! performance states, fans and coolers, system event sets — answered as a
//! driver of the simulated generation would (data-centre PCIe GPUs on one
//! host bridge, one NUMA node, no NVLink, no ECC events), none a stub.

use cgpu_sim::stat::snapshot;
use cgpu_testkit::{test_deps, workspace_root, SimEnv};
use serde_json::{json, Value};

#[test]
fn more_nvml_queries_through_pynvml() {
    let env = SimEnv::new().gpus("23028:NVIDIA A10,23028:NVIDIA A10");
    let script = workspace_root().join("shim/tests/py/nvml_more_client.py");
    let o = env.run(&test_deps().python, &[script.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{:?}\n{stdout}\n{stderr}", o.status);
    let v: Value = serde_json::from_str(stdout.lines().last().unwrap_or(""))
        .unwrap_or_else(|e| panic!("{e}: {stdout}\n{stderr}"));
    assert!(
        v["cpu_affinity_scope"][0].as_u64().unwrap_or(0) & 1 == 1,
        "{v:#}"
    );
    assert_eq!(v["mem_affinity"], json!([1]), "{v:#}");
    assert_eq!(v["set_cpu_affinity"], Value::Null, "{v:#}");
    assert_eq!(v["clear_cpu_affinity"], Value::Null, "{v:#}");
    // The second GPU's bus (0x27), a 3D controller, the same bus id as v3.
    let pci = &v["pci_ext"];
    assert_eq!(pci[0], v["pci_v3_bus"], "{v:#}");
    assert_eq!(pci[0], 0x27, "{v:#}");
    assert_eq!((pci[1].clone(), pci[2].clone()), (json!(3), json!(2)));
    assert_eq!(pci[3], "00000000:27:00.0", "{v:#}");
    // A field the GPU does not have: NOT_SUPPORTED (3) for that field.
    assert_eq!(v["fields"], json!([3]), "{v:#}");
    assert_eq!(v["retired"], json!([]), "{v:#}");
    assert_eq!(v["retired_v2"], json!([]), "{v:#}");
    assert_eq!(v["temperature_v"], 40, "{v:#}");
    assert_eq!(v["capabilities"], json!([0, 0]), "{v:#}");
    assert_eq!(v["by_uuid_v_ascii"], 1, "{v:#}");
    assert_eq!(v["nearest_hostbridge"], json!([1]), "{v:#}");
    assert_eq!(v["nearest_single"], json!([]), "{v:#}");
    assert_eq!(v["gpu_set"], json!([0, 1]), "{v:#}");
    assert_eq!(v["pstates"], json!([0, 8]), "{v:#}");
    assert_eq!(v["fan_rpm"], 1500, "{v:#}");
    assert_eq!(v["fan_target"], 30, "{v:#}");
    assert_eq!(v["fan_minmax"], json!([30, 100]), "{v:#}");
    assert_eq!(v["fan_policy"], 0, "{v:#}");
    assert_eq!(v["cooler"], json!([2, 14]), "{v:#}");
    assert_eq!(v["set_fan"], "error: Insufficient Permissions", "{v:#}");
    assert_eq!(v["system_events"], json!([[], true]), "{v:#}");
    let st = snapshot(&env.state_dir).unwrap();
    assert!(st.stubs.is_empty(), "stubs were hit: {:?}", st.stubs);
}

/// A GPU made to fail through the state directory's `gpu<i>.xid` and
/// `gpu<i>.lost`: the XID errors reported after registration arrive as
/// critical-error events in order, the lost GPU's XID 79 last, and the lost
/// GPU's handle answers NVML_ERROR_GPU_IS_LOST while the other GPU works.
#[test]
fn a_failing_gpu_through_pynvml() {
    let env = SimEnv::new().gpus("23028:NVIDIA A10,23028:NVIDIA A10");
    let script = workspace_root().join("shim/tests/py/nvml_failing_gpu_client.py");
    let o = env.run(
        &test_deps().python,
        &[script.to_str().unwrap(), env.state_dir.to_str().unwrap()],
    );
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{:?}\n{stdout}\n{stderr}", o.status);
    let v: Value = serde_json::from_str(stdout.lines().last().unwrap_or(""))
        .unwrap_or_else(|e| panic!("{e}: {stdout}\n{stderr}"));
    assert_eq!(v["events"], json!([[0, 8, 48], [1, 8, 79]]), "{v:#}");
    assert_eq!(v["last_wait"], "Timeout", "{v:#}");
    assert_eq!(v["count"], 2, "{v:#}");
    assert_eq!(v["handle1"], "GPU is lost", "{v:#}");
    assert_eq!(v["memory1"], "GPU is lost", "{v:#}");
    assert_eq!(v["uuid1"], "GPU is lost", "{v:#}");
    assert_eq!(v["name0"], "NVIDIA A10", "{v:#}");
}
