//! Driver behaviours real clients rely on, through the real `cuda.h` of
//! CUDA 13.5 (`tests/c/driver_gaps.c`, linked with `-lcuda`; the sim's
//! default driver is as new): capture queries whose
//! arrays the client reads, a conditional node's body handed back by
//! `cuGraphNodeGetParams`, host functions in stream order (waited for by
//! synchronisation, captured into graphs), kernel nodes given a `CUkernel`,
//! VMM mappings side by side as one range, the pool handle types, a graph
//! that allocates replayed after its graph is destroyed, user objects held
//! through clones, child graphs and executables, managed memory pools, an
//! interprocess
//! event between two processes. Each check
//! runs in its own process: a crash fails only its test.

use cgpu_testkit::{artifacts, read_until, test_deps, wait_output, workspace_root, SimEnv};
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

/// The client, built once per test process against CUDA 13.5's `cuda.h`
/// (from `nvidia-cuda-runtime`, in the test venv), linked with the sim.
fn client() -> &'static PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let a = artifacts();
        let include = test_deps().venv.join("cuda13/nvidia/cu13/include");
        let dir = a.profile_dir.join("c-clients");
        std::fs::create_dir_all(&dir).expect("create c-clients dir");
        let out = dir.join("driver_gaps-cuda13");
        let tmp = dir.join(format!("driver_gaps-cuda13.tmp{}", std::process::id()));
        let o = Command::new("gcc")
            .args([
                "-O1",
                "-g",
                "-Wall",
                "-Werror",
                "-Wno-deprecated-declarations",
            ])
            .arg(format!("-I{}", include.display()))
            .arg(workspace_root().join("shim/tests/c/driver_gaps.c"))
            .arg("-o")
            .arg(&tmp)
            .arg(format!("-L{}", a.sim_lib_dir.display()))
            .args(["-lcuda", "-lpthread"])
            .output()
            .expect("run gcc");
        assert!(
            o.status.success(),
            "gcc driver_gaps.c:\n{}",
            String::from_utf8_lossy(&o.stderr)
        );
        std::fs::rename(&tmp, &out).expect("rename the client");
        out
    })
}

/// Runs the client's `check` on a fresh simulated machine; returns its
/// "<check> ok ..." line.
fn run_check(check: &str) -> String {
    let bin = client();
    let env = SimEnv::new().gpus("23028:NVIDIA A10");
    let o = env.run(bin, &[check]);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success(),
        "driver_gaps {check}: {:?}\n{out}\n{err}",
        o.status
    );
    let line = out
        .lines()
        .find(|l| l.starts_with(&format!("{check} ")))
        .unwrap_or_default()
        .to_owned();
    assert!(
        line.starts_with(&format!("{check} ok")),
        "{check}: {out}\n{err}"
    );
    line
}

#[test]
fn capture_info_arrays_are_readable() {
    let l = run_check("capture_info");
    assert!(l.contains("before=0 deps=1 nodes=2"), "{l}");
}

#[test]
fn conditional_node_params_give_the_body_graph() {
    let l = run_check("cond_params");
    assert!(l.contains("body_nodes=1"), "{l}");
}

#[test]
fn host_functions_run_in_stream_order() {
    run_check("host_order");
}

#[test]
fn host_functions_are_captured_into_graphs() {
    let l = run_check("host_capture");
    assert!(l.contains("calls=2"), "{l}");
}

#[test]
fn kernel_nodes_take_a_cukernel() {
    run_check("kernel_node_kern");
}

#[test]
fn vmm_mappings_side_by_side_are_one_range() {
    run_check("vmm_span");
}

/// A module's `__device__` globals are taken on the device when it is loaded
/// (a module or a library), never at the look-up, and given back at unload;
/// globals larger than the device are refused at load.
#[test]
fn module_globals_are_device_memory_from_the_load_on() {
    let l = run_check("module_globals");
    let mib: u64 = l
        .split("load_mib=")
        .nth(1)
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    assert!(
        (64..=66).contains(&mib),
        "64 MiB of globals (2 MiB pages): {l}"
    );
}

/// `cuGraphExecUpdate` with graphs of another shape: the documented result
/// (topology changed, node type changed, parameters changed), error node
/// and "from" node, CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, and nothing
/// changed; a matching graph's parameters and user objects are taken.
#[test]
fn graph_exec_update_reports_what_changed() {
    run_check("graph_update");
}

/// A graph with memory nodes refuses to delete nodes and edges, and the
/// refused node keeps its edge and runs.
#[test]
fn graphs_with_memory_nodes_keep_their_nodes() {
    run_check("graph_mem_destroy");
}

/// A graph with memory nodes becomes a child node only when moved
/// (`CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE`); the parent then owns it and runs
/// its allocation and free at every launch.
#[test]
fn graphs_with_memory_nodes_move_into_child_nodes() {
    run_check("child_move");
}

#[test]
fn pools_report_posix_fd_handles() {
    let l = run_check("pool_handle_types");
    assert!(l.contains("types=1"), "{l}");
}

#[test]
fn graph_allocations_replay_after_the_graph_is_destroyed() {
    let l = run_check("graph_alloc_replay");
    assert!(l.contains("replays=3"), "{l}");
}

/// An interprocess event recorded in one process (behind a host function
/// the test releases) is pending in another that opened its handle, for a
/// query and for a stream waiting on it, until the record completes.
#[test]
fn interprocess_events_between_processes() {
    let env = SimEnv::new().gpus("23028:NVIDIA A10");
    let mut owner = env
        .command(client())
        .arg("ipc_event_owner")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the owner");
    let lines = read_until(&mut owner, "handle ", Duration::from_secs(120));
    let hex = lines
        .last()
        .and_then(|l| l.strip_prefix("handle "))
        .unwrap_or_else(|| panic!("no handle from the owner: {lines:?}"))
        .to_owned();
    let mut user = env.spawn(client(), &["ipc_event_user", &hex]);
    let seen = read_until(&mut user, "pending", Duration::from_secs(120));
    assert_eq!(seen.last().map(String::as_str), Some("pending"), "{seen:?}");
    owner
        .stdin
        .take()
        .expect("owner stdin")
        .write_all(b"go\n")
        .expect("release the owner");
    let u = wait_output(user, Duration::from_secs(120));
    let o = wait_output(owner, Duration::from_secs(120));
    let (uo, oo) = (
        String::from_utf8_lossy(&u.stdout),
        String::from_utf8_lossy(&o.stdout),
    );
    assert!(
        u.status.success() && uo.contains("ipc_event_user ok"),
        "user: {seen:?} {uo}\n{}",
        String::from_utf8_lossy(&u.stderr)
    );
    assert!(
        o.status.success() && oo.contains("ipc_event_owner ok"),
        "owner: {oo}\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn user_objects_follow_clones_children_and_executables() {
    run_check("user_objects");
}

#[test]
fn managed_memory_pools() {
    run_check("managed_pool");
}
