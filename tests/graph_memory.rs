//! Graph memory under a quota, with real processes on the simulated driver:
//! a client linked with `-lcuda` (`tests/c/graph_mem.c`) builds graphs with
//! memory-alloc nodes and launches them under `LD_PRELOAD=libcgpu.so`. The
//! driver's own report (`CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT`) and the
//! sim's per-process memory (NVML without the preload) are the ground truth.

mod interpose_common;

use interpose_common::*;
use std::io::{BufRead, BufReader};
use std::process::Stdio;

const T4: &str = "15109:Tesla T4";
/// The sim's context reservation (charged to the quota).
const CTX: u64 = 300 * MIB;

fn client() -> std::path::PathBuf {
    cc(&repo().join("tests/c/graph_mem.c"), "graph_mem", &[], true)
}

fn vars<'a>(id: &'a str, gib: &'a str) -> [(&'a str, &'a str); 2] {
    [
        ("CGPU_CONTAINER_ID", id),
        ("ALIYUN_COM_GPU_MEM_CONTAINER", gib),
    ]
}

/// Steps of `op` in the client's output.
fn steps<'a>(all: &'a [serde_json::Value], op: &str) -> Vec<&'a serde_json::Value> {
    all.iter().filter(|j| j["op"] == op).collect()
}

fn u(j: &serde_json::Value, k: &str) -> u64 {
    j[k].as_u64().unwrap_or_else(|| panic!("{k} in {j}"))
}

/// The escape: with a 1 GiB quota, `cuMemAlloc(2 GiB)` is refused, and a
/// graph whose alloc node takes 2 GiB must be refused too, before the
/// driver reserves anything.
#[test]
fn a_graph_alloc_node_past_the_quota_is_refused() {
    let m = Machine::new("graph-escape", T4);
    let exe = client();
    let out = run_ok(
        m.preloaded(&exe, &vars("gm-a", "1"))
            .args(["alloc", "2048"]),
    );
    let all = lines(&out);
    assert_eq!(u(steps(&all, "mem_alloc")[0], "rc"), 2, "{out}");
    let launch = steps(&all, "graph_launch")[0];
    assert_eq!(u(launch, "rc"), 2, "graph launch past the quota: {out}");
    assert_eq!(
        u(launch, "reserved"),
        0,
        "the driver reserved graph memory: {out}"
    );
    // Within the quota the same client's graph launches, and is charged.
    let out = run_ok(m.preloaded(&exe, &vars("gm-b", "1")).args(["alloc", "512"]));
    let all = lines(&out);
    let start = steps(&all, "start")[0];
    let launch = steps(&all, "graph_launch")[0];
    assert_eq!(u(launch, "rc"), 0, "{out}");
    assert_eq!(u(launch, "reserved"), 512 * MIB, "{out}");
    assert_eq!(u(start, "free") - u(launch, "free"), 512 * MIB, "{out}");
    assert_eq!(u(start, "free"), (1 << 30) - CTX, "{out}");
}

/// A graph that allocates and frees 400 MiB, relaunched: the pool keeps
/// 400 MiB reserved (charged once, not per launch, so relaunches fit a
/// 1 GiB quota), the charge outlives the free node until
/// `cuDeviceGraphMemTrim`, and the trim gives it back.
#[test]
fn graph_memory_is_charged_while_the_pool_holds_it() {
    let m = Machine::new("graph-pool", T4);
    let exe = client();
    let mut cmd = m.preloaded(&exe, &vars("gm-p", "1"));
    let out = run_ok(cmd.args(["relaunch", "400", "4", "400"]));
    let all = lines(&out);
    let start = steps(&all, "start")[0];
    let launches = steps(&all, "graph_launch");
    assert_eq!(launches.len(), 4);
    for l in &launches {
        assert_eq!(u(l, "rc"), 0, "relaunch refused: {out}");
        assert_eq!(u(l, "reserved"), 400 * MIB, "{out}");
        assert_eq!(u(start, "free") - u(l, "free"), 400 * MIB, "{out}");
    }
    // 1 GiB − 300 MiB context − 400 MiB pool: 324 MiB left.
    assert_eq!(u(steps(&all, "probe_before_trim")[0], "rc"), 2, "{out}");
    let trim = steps(&all, "trim")[0];
    assert_eq!(u(trim, "rc"), 0);
    assert_eq!(u(trim, "reserved"), 0, "{out}");
    assert_eq!(u(trim, "free"), u(start, "free"), "trim gave back: {out}");
    assert_eq!(u(steps(&all, "probe_after_trim")[0], "rc"), 0, "{out}");
}

/// `cuMemAllocAsync` captured into a graph becomes an alloc node: past the
/// quota it is refused (at capture, or at the launch), within it the launch
/// is charged what the pool reserves.
#[test]
fn captured_stream_allocations_are_charged_at_launch() {
    let m = Machine::new("graph-capture", T4);
    let exe = client();
    let out = run_ok(
        m.preloaded(&exe, &vars("gm-c", "1"))
            .args(["capture", "2048"]),
    );
    let all = lines(&out);
    let launch = steps(&all, "graph_launch")[0];
    assert!(
        u(steps(&all, "capture_alloc")[0], "rc") == 2 || u(launch, "rc") == 2,
        "{out}"
    );
    assert_eq!(u(launch, "reserved"), 0, "{out}");
    let out = run_ok(
        m.preloaded(&exe, &vars("gm-d", "1"))
            .args(["capture", "100"]),
    );
    let all = lines(&out);
    let launch = steps(&all, "graph_launch")[0];
    assert_eq!(u(launch, "rc"), 0, "{out}");
    assert_eq!(u(launch, "reserved"), 100 * MIB, "{out}");
    assert_eq!(
        u(steps(&all, "start")[0], "free") - u(launch, "free"),
        100 * MIB,
        "{out}"
    );
}

/// A captured `cuMemAllocAsync` that its graph never frees: the address is
/// handed out at capture, the memory reserved by the launch. It is charged
/// once (as graph memory, at the launch), not also as a stream-ordered
/// allocation until the address is freed; freeing it outside the graph
/// leaves it in the graph pool (still charged, as the driver still holds
/// it) until the trim gives it back.
#[test]
fn a_captured_allocation_the_graph_keeps_is_charged_once() {
    let m = Machine::new("graph-keep", T4);
    let exe = client();
    let out = run_ok(
        m.preloaded(&exe, &vars("gm-k", "1"))
            .args(["capture_keep", "300"]),
    );
    let all = lines(&out);
    let start = u(steps(&all, "start")[0], "free");
    assert_eq!(start, (1 << 30) - CTX, "{out}");
    assert_eq!(u(steps(&all, "capture_alloc")[0], "rc"), 0, "{out}");
    assert_eq!(u(steps(&all, "capture_alloc")[0], "free"), start, "{out}");
    let launch = steps(&all, "graph_launch")[0];
    assert_eq!(u(launch, "rc"), 0, "{out}");
    assert_eq!(u(launch, "reserved"), 300 * MIB, "{out}");
    assert_eq!(start - u(launch, "free"), 300 * MIB, "charged once: {out}");
    let freed = steps(&all, "free_outside")[0];
    assert_eq!(u(freed, "rc"), 0, "{out}");
    assert_eq!(u(freed, "reserved"), 300 * MIB, "the pool keeps it: {out}");
    assert_eq!(start - u(freed, "free"), 300 * MIB, "{out}");
    let trim = steps(&all, "trim")[0];
    assert_eq!((u(trim, "rc"), u(trim, "reserved")), (0, 0), "{out}");
    assert_eq!(u(trim, "free"), start, "{out}");
}

/// Two processes of one container share the quota with graph memory: what
/// one process's graph pool holds is refused to the other, and given back
/// when the first exits. The sim's per-process memory (NVML, without the
/// preload) agrees with the driver's report.
#[test]
fn graph_memory_is_shared_by_the_containers_processes() {
    let m = Machine::new("graph-procs", T4);
    let exe = client();
    // Process A: context 300 MiB + 300 MiB of graph memory, held.
    let mut a = m.preloaded(&exe, &vars("gm-s", "1"));
    a.args(["hold", "300"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    let mut child = a.spawn().unwrap();
    let stdin = child.stdin.take().unwrap();
    let mut r = BufReader::new(child.stdout.take().unwrap());
    let mut out = String::new();
    loop {
        let mut line = String::new();
        assert!(r.read_line(&mut line).unwrap() > 0, "A exited early: {out}");
        if line.contains("\"ready\"") {
            break;
        }
        out.push_str(&line);
    }
    let launch = steps(&lines(&out), "graph_launch")[0].clone();
    assert_eq!(u(&launch, "rc"), 0, "{out}");
    assert_eq!(u(&launch, "reserved"), 300 * MIB, "{out}");
    let sim: u64 = m
        .sim_process_bytes()
        .iter()
        .filter(|(pid, _)| *pid == child.id())
        .map(|(_, b)| b)
        .sum();
    assert_eq!(sim, CTX + 300 * MIB, "the sim's view of process A");
    // Process B: context 300 MiB; 300 MiB more would pass 1 GiB, as memory
    // or as graph memory.
    let out_b = run_ok(m.preloaded(&exe, &vars("gm-s", "1")).args(["alloc", "300"]));
    let all = lines(&out_b);
    assert_eq!(u(steps(&all, "mem_alloc")[0], "rc"), 2, "{out_b}");
    let lb = steps(&all, "graph_launch")[0];
    assert_eq!(u(lb, "rc"), 2, "{out_b}");
    assert_eq!(u(lb, "reserved"), 0, "{out_b}");
    // A exits: its graph memory is given back.
    drop(stdin);
    let st = wait_timeout(child, std::time::Duration::from_secs(60));
    assert!(st.status.success());
    let out_b = run_ok(m.preloaded(&exe, &vars("gm-s", "1")).args(["alloc", "300"]));
    let all = lines(&out_b);
    assert_eq!(u(steps(&all, "mem_alloc")[0], "rc"), 0, "{out_b}");
    assert_eq!(u(steps(&all, "graph_launch")[0], "rc"), 0, "{out_b}");
}

/// Instantiation with the upload flag and `cuGraphUpload` are charged like
/// a launch and settled on what the driver reserves (the simulated driver
/// reserves at the launch only): nothing is left charged that the driver
/// does not hold, and past the quota all three are refused.
#[test]
fn uploads_are_charged_like_launches_and_settled() {
    let m = Machine::new("graph-upload", T4);
    let exe = client();
    let out = run_ok(
        m.preloaded(&exe, &vars("gm-u", "1"))
            .args(["upload", "200"]),
    );
    let all = lines(&out);
    let start = u(steps(&all, "start")[0], "free");
    for s in ["instantiate_upload", "upload"] {
        let j = steps(&all, s)[0];
        assert_eq!(u(j, "rc"), 0, "{out}");
        assert_eq!(u(j, "free"), start - u(j, "reserved"), "{s}: {out}");
    }
    let launch = steps(&all, "graph_launch")[0];
    assert_eq!(u(launch, "rc"), 0, "{out}");
    assert_eq!(u(launch, "reserved"), 200 * MIB, "{out}");
    assert_eq!(start - u(launch, "free"), 200 * MIB, "{out}");
    let out = run_ok(
        m.preloaded(&exe, &vars("gm-v", "1"))
            .args(["upload", "2048"]),
    );
    let all = lines(&out);
    for s in ["upload", "graph_launch"] {
        let j = steps(&all, s)[0];
        assert_eq!(u(j, "free"), start - u(j, "reserved"), "{s}: {out}");
    }
    assert_eq!(u(steps(&all, "graph_launch")[0], "rc"), 2, "{out}");
}

/// NVIDIA's own cuda-bindings, unmodified (it reaches every function through
/// `cuGetProcAddress_v2`): its graph launch is refused past the quota,
/// charged within it, and given back by the trim.
#[test]
fn unmodified_cuda_bindings_graph_memory_is_counted() {
    let m = Machine::new("graph-bindings", T4);
    let script = repo().join("tests/py/bindings_graph_mem.py");
    let run_script = |id: &str, mib: &str| -> serde_json::Value {
        let out = run_ok(m.preloaded(python(), &vars(id, "1")).arg(&script).arg(mib));
        serde_json::from_str(out.lines().last().unwrap_or_default())
            .unwrap_or_else(|e| panic!("{e}: {out}"))
    };
    let j = run_script("gm-py-a", "2048");
    for step in ["launch0", "launch1"] {
        assert_eq!(j[step]["rc"], 2, "{j}");
        assert_eq!(j[step]["reserved"], 0, "{j}");
        assert_eq!(j[step]["free"], j["start"]["free"], "{j}");
    }
    let j = run_script("gm-py-b", "400");
    let start = j["start"]["free"].as_u64().unwrap();
    for step in ["launch0", "launch1"] {
        assert_eq!(j[step]["rc"], 0, "{j}");
        assert_eq!(j[step]["reserved"], 400 * MIB, "{j}");
        assert_eq!(start - j[step]["free"].as_u64().unwrap(), 400 * MIB, "{j}");
    }
    assert_eq!(j["trim"]["rc"], 0, "{j}");
    assert_eq!(j["trim"]["reserved"], 0, "{j}");
    assert_eq!(j["trim"]["free"].as_u64().unwrap(), start, "{j}");
}

/// With `ALIYUN_COM_GPU_VISIBLE_DEVICES=1`, an alloc node whose pool is on
/// the container's device 0 (host GPU 1) takes its memory there, charged on
/// that GPU's quota, never on the hidden host GPU 0.
#[test]
fn alloc_nodes_use_the_containers_device_numbering() {
    let m = Machine::new("graph-visible", "23028:NVIDIA A10,15109:Tesla T4");
    let exe = client();
    let v = [
        ("CGPU_CONTAINER_ID", "gm-vis"),
        ("ALIYUN_COM_GPU_MEM_CONTAINER", "1"),
        ("ALIYUN_COM_GPU_VISIBLE_DEVICES", "1"),
        ("GRAPH_MEM_LOCATION", "0"),
    ];
    let out = run_ok(m.preloaded(&exe, &v).args(["alloc", "512"]));
    let all = lines(&out);
    let launch = steps(&all, "graph_launch")[0];
    assert_eq!(u(launch, "rc"), 0, "{out}");
    assert_eq!(u(launch, "reserved"), 512 * MIB, "{out}");
    let start = u(steps(&all, "start")[0], "free");
    assert_eq!(start - u(launch, "free"), 512 * MIB, "{out}");
    let out = run_ok(m.preloaded(&exe, &v).args(["alloc", "2048"]));
    let launch = steps(&lines(&out), "graph_launch")[0].clone();
    assert_eq!(u(&launch, "rc"), 2, "{out}");
}
