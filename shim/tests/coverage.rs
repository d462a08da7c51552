//! What real clients call beyond the basics, through NVIDIA's own Python
//! packages: graphs (memory nodes held on the device, node kinds, queries,
//! ids, user objects, conditionals, capture joins), pools and pointers,
//! occupancy, 3D copies, arrays and textures, error strings, green contexts
//! and device resources, driver logs, tensor maps, 64-bit stream memory
//! operations, managed library variables, recapture (cuda-bindings), and the
//! NVML queries of monitoring agents (nvidia-ml-py). None of it may touch a
//! stub. Also: every function cuda-bindings resolves at start exists in the
//! sim, and every one that is only a stub is named in shim/README.md.

use cgpu_sim::stat::snapshot;
use cgpu_testkit::{test_deps, SimEnv};
use serde_json::{json, Value};

const MIB: u64 = 1 << 20;

fn run_py(env: &SimEnv, script: &str) -> Value {
    let path = cgpu_testkit::workspace_root()
        .join("shim/tests/py")
        .join(script);
    let o = env.run(&test_deps().python, &[path.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(
        o.status.success(),
        "{script}: {:?}\n{stdout}\n{stderr}",
        o.status
    );
    serde_json::from_str(stdout.lines().last().unwrap_or(""))
        .unwrap_or_else(|e| panic!("{e}: {stdout}\n{stderr}"))
}

#[test]
fn graphs_pools_occupancy_and_arrays_through_cuda_bindings() {
    // A driver as new as the bindings (graph ids are CUDA 13.1 functions).
    let env = SimEnv::new()
        .gpus("23028:NVIDIA A10,23028:NVIDIA A10")
        .env("CGPU_SIM_DRIVER_VERSION", "13050");
    let v = run_py(&env, "coverage_client.py");

    // Graph memory: the address is fixed at node creation, the memory is
    // taken from the device at launch, stays reserved after the free until
    // cuDeviceGraphMemTrim.
    let g = &v["graph_mem"];
    assert_eq!(g["dptr_set"], true, "{v:#}");
    assert_eq!(g["free_after_add"], 0);
    assert_eq!(g["alloc_params_bytes"], 64 * MIB);
    assert_eq!(g["held_after_launch"], 64 * MIB);
    assert_eq!(g["used_current"], 64 * MIB);
    assert_eq!(g["reserved_current"], 64 * MIB);
    assert_eq!(g["memset_bytes"], json!([0x5a, 0x5a, 0x5a, 0x5a]));
    assert_eq!(g["relaunch_live"], "CUDA_ERROR_INVALID_VALUE");
    assert_eq!(g["used_after_free"], 0);
    assert_eq!(g["reserved_after_free"], 64 * MIB);
    assert_eq!(g["held_after_free"], 64 * MIB);
    assert_eq!(g["free_node_ptr_ok"], true);
    assert_eq!(g["reserved_after_reuse"], 64 * MIB);
    assert_eq!(g["used_high"], 64 * MIB);
    assert_eq!(g["reserved_after_trim"], 0);
    assert_eq!(g["held_after_trim"], 0);
    assert_eq!(g["used_high_reset"], 0);
    assert_eq!(g["second_exec"], "CUDA_ERROR_NOT_SUPPORTED");
    assert_eq!(g["clone_mem_graph"], "CUDA_ERROR_NOT_SUPPORTED");
    assert_eq!(g["auto_free_relaunch"], "CUDA_SUCCESS");
    assert_eq!(g["auto_free_used"], 64 * MIB);
    // Captured cuMemAllocAsync/cuMemFreeAsync: alloc, memset and free nodes;
    // nothing held until the launch, which takes it from the pool's reserve
    // (64 MiB, left by the graphs above) and frees it again.
    assert_eq!(g["captured_alloc_held_before_launch"], 0);
    assert_eq!(g["captured_ptr_type"], 2); // CU_MEMORYTYPE_DEVICE
    assert_eq!(
        g["captured_kinds"],
        json!([
            "CU_GRAPH_NODE_TYPE_MEM_ALLOC",
            "CU_GRAPH_NODE_TYPE_MEMSET",
            "CU_GRAPH_NODE_TYPE_MEM_FREE"
        ])
    );
    assert_eq!(g["captured_reserved_after_launch"], 64 * MIB);
    assert_eq!(g["captured_used_after_launch"], 0);

    let s = &v["graph_structure"];
    assert_eq!(s["nodes"], 4, "{v:#}");
    assert_eq!(s["nodes_listed"], 4);
    assert_eq!(s["roots"], 1);
    assert_eq!(s["edges"], 4);
    assert_eq!(s["deps_of_last"], 2);
    assert_eq!(s["dependents_of_first"], 2);
    assert_eq!(s["deps_of_c"], 2);
    assert_eq!(s["nodes_after_destroy"], 3);
    assert_eq!(s["deps_of_last_after"], 1);
    assert_eq!(s["type_empty"], "CU_GRAPH_NODE_TYPE_EMPTY");
    assert_eq!(s["distinct_graph_ids"], 2);
    assert_eq!(s["distinct_exec_ids"], true);
    assert_eq!(s["local_ids_differ"], true);
    assert_eq!(s["containing_graph"], true);
    assert_eq!(s["clone_nodes"], 3);
    assert_eq!(s["clone_node_type"], "CU_GRAPH_NODE_TYPE_EMPTY");
    assert_eq!(s["child_type"], "CU_GRAPH_NODE_TYPE_GRAPH");
    assert_eq!(s["child_inner_nodes"], 1);
    // The child's 2 ms kernel runs; disabled, it does not.
    let child_ms = s["child_ms"].as_f64().unwrap();
    assert!(child_ms >= 2.0, "{child_ms}");
    assert_eq!(s["enabled_after"], 0);
    assert!(s["disabled_ms"].as_f64().unwrap() < child_ms - 1.5, "{s}");
    assert_eq!(s["instantiate_result"], "CUDA_GRAPH_INSTANTIATE_SUCCESS");
    assert_eq!(s["nodes_after_addnode"], 4);

    let h = &v["host_and_events"];
    assert_eq!(h["host_calls"], 2, "{v:#}");
    assert_eq!(h["event_recorded"], "CUDA_SUCCESS");
    assert_eq!(h["dtor_before_exec_destroy"], 0);
    assert_eq!(h["dtor_after"], 1);

    let c = &v["conditional"];
    assert_eq!(c["type"], "CU_GRAPH_NODE_TYPE_CONDITIONAL", "{v:#}");
    assert!(c["if_true_ms"].as_f64().unwrap() >= 3.0, "{c}");

    let j = &v["capture_join"];
    assert_eq!(
        j["s2_capturing"], "CU_STREAM_CAPTURE_STATUS_ACTIVE",
        "{v:#}"
    );
    assert_eq!(j["s2_after_end"], "CU_STREAM_CAPTURE_STATUS_NONE");
    assert_eq!(j["nodes"], 3);
    assert_eq!(j["edges"], 3);
    assert_eq!(j["unjoined"], "CUDA_ERROR_STREAM_CAPTURE_UNJOINED");
    assert_eq!(j["to_graph_same"], true);
    assert_eq!(j["to_graph_nodes"], 3);
    assert_eq!(j["to_graph_root_dependents"], 2);

    let p = &v["pools"];
    assert_eq!(p["get_mem_pool_same"], true, "{v:#}");
    assert_eq!(p["default_pool_same"], true);
    assert_eq!(p["own_access"], "CU_MEM_ACCESS_FLAGS_PROT_READWRITE");
    assert_eq!(p["peer_access"], "CU_MEM_ACCESS_FLAGS_PROT_READWRITE");
    assert_eq!(p["own_access_none"], "CUDA_ERROR_INVALID_DEVICE");
    assert_eq!(p["zero_ptr"], 0);
    assert_eq!(p["zero_free"], "CUDA_SUCCESS");
    assert_eq!(p["cross_ordinal"], 1);
    assert_eq!(p["cross_pool_handle"], true);

    let m = &v["managed"];
    assert_eq!(m["read_mostly_before"], 0, "{v:#}");
    assert_eq!(m["read_mostly_after"], 1);
    assert_eq!(m["preferred"], 0);
    assert_eq!(m["last_prefetch"], 0);
    assert_eq!(m["is_managed"], 1);
    assert_eq!(m["host_ptr_same"], true);
    assert_eq!(m["sync_memops_before"], 0);
    assert_eq!(m["sync_memops_after"], 1);

    // A10 (8.6): 1536 threads, 167936 B of shared memory, 64 K registers per SM.
    let o = &v["occupancy"];
    assert_eq!(o["blocks_256"], 6, "{v:#}");
    assert_eq!(o["blocks_256_32k"], 4);
    assert_eq!(o["blocks_too_much_smem"], 0);
    assert_eq!(o["blocks_flags"], 12);
    assert_eq!(o["potential"], json!([144, 768]));
    assert_eq!(o["avail_smem_2"], 49152);

    let a = &v["arrays"];
    assert_eq!(a["descriptor"], json!([64, 32, 4, 4]), "{v:#}");
    assert_eq!(a["roundtrip"], true);
    assert_eq!(a["overrun"], "CUDA_ERROR_INVALID_VALUE");
    // 7 levels of 64x64 RGBA8, each rounded up to 512 bytes.
    assert_eq!(a["mipmap_charged"], 16384 + 4096 + 1024 + 4 * 512);
    assert_eq!(a["level6"], json!([1, 1]));
    assert_eq!(a["too_many_levels"], "CUDA_ERROR_INVALID_VALUE");
    assert_eq!(a["levels_huge"], "CUDA_ERROR_INVALID_VALUE");
    assert_eq!(a["tex_res_array_same"], true);
    assert_eq!(a["tex_surf_nonzero"], true);
    assert_eq!(a["tex_destroyed_again"], "CUDA_ERROR_INVALID_VALUE");
    assert_eq!(a["mipmap_returned"], 1024);
    assert_eq!(a["all_returned"], true);
    assert_eq!(a["copy2d_fits"], "CUDA_SUCCESS");
    assert_eq!(a["copy2d_overrun"], "CUDA_ERROR_INVALID_VALUE");
    assert_eq!(a["copy3d_at_capture"], 0);
    assert_eq!(a["copy3d_at_replay"], 0x42);

    let x = &v["more"];
    assert_eq!(x["attr_prio"], 3, "{v:#}");
    assert_eq!(x["attr_prio_other_before"], 0);
    assert_eq!(x["attr_prio_copied"], 3);
    assert!(x["legacy_ms"].as_f64().unwrap() >= 4.0, "{x}");
    assert_eq!(x["batch_copy"], json!([0x33, 0x33, 0x33, 0x33]));
    assert_eq!(x["batch_prefetch_host"], -1); // CU_DEVICE_CPU
    assert_eq!(x["exec_affinity"], "CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY");
    assert_eq!(x["param_info"], json!([[0, 4], [8, 8], [16, 24]]));
    assert_eq!(x["param_count"], 3);
    assert_eq!(x["param_past_end"], "CUDA_ERROR_INVALID_VALUE");
    assert_eq!(x["kernel_param_2"], json!([16, 24]));
    assert_eq!(x["coredump_trigger_host"], true);
    assert_eq!(x["coredump_on_exception"], true);
    assert_eq!(x["coredump_ctx_override"], false);
    assert_eq!(x["coredump_global_kept"], true);
    assert_eq!(x["coredump_dereg"], "CUDA_SUCCESS");
    assert_eq!(x["coredump_dereg_again"], "CUDA_ERROR_INVALID_VALUE");
    assert_eq!(x["notify_unreg"], "CUDA_SUCCESS");
    // Both devices ran their 3 ms kernel (in parallel: not twice as long).
    assert!(x["multi_device_wall_ms"].as_f64().unwrap() >= 3.0, "{x}");
    assert_eq!(x["multi_device_too_many"], "CUDA_ERROR_INVALID_VALUE");

    let e = &v["errors"];
    assert_eq!(e["name_2"], "CUDA_ERROR_OUT_OF_MEMORY", "{v:#}");
    // The driver's own short strings (as CuPy and PyTorch print them).
    assert_eq!(e["string_2"], "out of memory");
    assert_eq!(e["string_904"], "capturing stream has unjoined work");

    // Green contexts over a split of the A10's 72 SMs (pairs co-scheduled).
    let g = &v["green"];
    assert_eq!(g["device_sms"], json!([72, 2, 2]), "{v:#}");
    assert_eq!(g["wq_config"], json!([0, 8]));
    assert_eq!(g["groups_possible"], 4); // 72 / 16
    assert_eq!(g["split"], json!([2, [16, 16], 40])); // 15 rounds up to 16
    assert_eq!(
        g["split_too_big"],
        "CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION"
    );
    // 8 SMs, then the 64 left discovered; nothing remains (type INVALID).
    assert_eq!(g["structured"], json!([8, 64, 0]));
    assert_eq!(
        g["mixed_splits"],
        "CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION"
    );
    // It holds the (already active) primary context: no memory of its own.
    assert_eq!(g["green_charged"], 0);
    for k in ["green_sms", "ctx_sms", "stream_sms"] {
        assert_eq!(g[k], 16, "{k}: {g}");
    }
    assert_eq!(g["primary_ctx_sms"], 72);
    assert_eq!(g["stream_green_same"], true);
    assert_eq!(g["plain_stream_green"], 0);
    assert_eq!(g["ctx_v2"], json!([0, true]));
    assert_eq!(g["green_id_nonzero"], true);
    assert_eq!(g["destroy_as_ctx"], "CUDA_ERROR_INVALID_CONTEXT");
    assert_eq!(g["destroy_again"], "CUDA_ERROR_CONTEXT_IS_DESTROYED");
    assert_eq!(g["stream_after"], "CUDA_ERROR_CONTEXT_IS_DESTROYED");
    // Memory allocated in it outlives it (the primary context's).
    assert_eq!(g["memory_kept"], "CUDA_SUCCESS");
    assert_eq!(g["after_destroy_charged"], 0);

    let l = &v["logs"];
    assert_eq!(l["oom"], "CUDA_ERROR_OUT_OF_MEMORY", "{v:#}");
    assert_eq!(
        l["callback"],
        json!([[0, "CUDA_ERROR_OUT_OF_MEMORY: out of memory"]])
    );
    assert_eq!(
        l["dump"],
        json!([
            "CUDA_SUCCESS",
            "CUDA_ERROR_OUT_OF_MEMORY: out of memory\n",
            40,
            0
        ])
    );
    assert_eq!(l["dump_again"], json!(["CUDA_SUCCESS", 0]));
    assert_eq!(l["dump_small"], "CUDA_ERROR_INVALID_VALUE");
    assert_eq!(l["file_has_oom"], true);
    // The failed small dump was logged too; nothing after unregistering.
    assert_eq!(l["before_unregister"], 2);
    assert_eq!(l["after_unregister"], 2);

    let t = &v["tensor_map"];
    for k in ["tiled", "replace", "im2col", "im2col_wide"] {
        assert_eq!(t[k], "CUDA_SUCCESS", "{k}: {v:#}");
    }
    assert_eq!(t["tiled_addr"], true);
    assert_eq!(t["replaced_addr"], true);
    for k in [
        "misaligned_addr",
        "stride_not_16",
        "box_too_wide_for_swizzle",
        "box_257",
        "nan_fill_int",
        "replace_misaligned",
        "foreign_map",
        "im2col_corner_range",
    ] {
        assert_eq!(t[k], "CUDA_ERROR_INVALID_VALUE", "{k}: {t}");
    }
    assert_eq!(t["alloc_class"], json!(["CUDA_SUCCESS", 1])); // SMALL

    let m = &v["memops64"];
    assert_eq!(m["written"], true, "{v:#}");
    assert_eq!(m["wait_geq"], "CUDA_SUCCESS");
    assert_eq!(m["misaligned"], "CUDA_ERROR_INVALID_VALUE");

    let lm = &v["library_managed"];
    assert_eq!(lm["managed_bytes"], 32, "{v:#}");
    assert_eq!(lm["managed_same_as_global"], true);
    assert_eq!(lm["plain_not_managed"], "CUDA_ERROR_NOT_FOUND");
    assert_eq!(lm["unified"], "CUDA_ERROR_NOT_FOUND");
    assert_eq!(lm["multicast_create"], "CUDA_ERROR_NOT_SUPPORTED");
    assert_eq!(lm["multicast_bind"], "CUDA_ERROR_INVALID_VALUE");

    // Recapture into an existing graph: its nodes take the new parameters
    // (2 + 3 ms of kernels become 2 + 7 ms), the changed one is reported.
    let r = &v["recapture"];
    assert!(r["first_ms"].as_f64().unwrap() >= 5.0, "{v:#}");
    assert_eq!(r["same_graph"], true);
    assert_eq!(r["same_nodes"], true);
    assert_eq!(r["callbacks"], json!([[true, 0]])); // ELIGIBLE_FOR_UPDATE
    assert!(r["recaptured_ms"].as_f64().unwrap() >= 9.0, "{r}");
    assert_eq!(
        r["topology"],
        json!(["CUDA_ERROR_GRAPH_RECAPTURE_FAILURE", true])
    );

    // VMM memory shared through a POSIX file descriptor: another process
    // and this one import it and see (and write) the same bytes; it is
    // charged once, to the process that created it.
    let sh = &v["shareable"];
    assert_eq!(sh["not_requested"], "CUDA_ERROR_INVALID_VALUE", "{v:#}");
    assert_eq!(sh["fabric"], "CUDA_ERROR_NOT_SUPPORTED");
    assert_eq!(sh["props_types"], 1);
    assert_eq!(
        sh["child"],
        json!({"bytes": [0x42, 0x42, 0x42, 0x42], "charged": 0})
    );
    assert_eq!(sh["written_by_child"], json!([0x77, 0x77, 0x77, 0x77]));
    assert_eq!(sh["import_here_bytes"], json!([0x42, 0x42, 0x42, 0x42]));
    assert_eq!(sh["charged_once"], 2 * MIB);
    assert_eq!(sh["bad_fd"], "CUDA_ERROR_INVALID_VALUE");
    assert_eq!(sh["charged_after"], 0);

    let mo = &v["more_ops"];
    assert_eq!(mo["batch"], json!([7, 1u64 << 40]), "{v:#}");
    assert_eq!(mo["copied"], json!([7, 1u64 << 40]));
    // PCIe parts: no native host or peer atomics.
    assert_eq!(mo["host_atomics"], json!([0, 0]));
    assert_eq!(mo["p2p_atomics"], json!([0]));
    assert_eq!(mo["p2p_same_device"], "CUDA_ERROR_INVALID_DEVICE");
    assert_eq!(mo["array_plane"], "CUDA_ERROR_INVALID_VALUE");

    // No sparse or deferred-mapping arrays on the simulated GPUs; 3D batch
    // copies between a pitched buffer and an array, at an offset.
    let am = &v["arrays_more"];
    assert_eq!(am["sparse_props"], "CUDA_ERROR_INVALID_VALUE", "{v:#}");
    assert_eq!(am["mem_requirements"], "CUDA_ERROR_INVALID_VALUE");
    assert_eq!(am["create_sparse"], "CUDA_ERROR_NOT_SUPPORTED");
    assert_eq!(am["map_array"], "CUDA_ERROR_INVALID_VALUE");
    assert_eq!(
        am["batch3d"],
        json!([0, 1, 2, 3, 10, 11, 12, 13, 20, 21, 22, 23])
    );
    assert_eq!(am["batch3d_out_of_bounds"], "CUDA_ERROR_INVALID_VALUE");

    // Deprecated usage counts: a created context lives until its last detach.
    let ca = &v["ctx_attach"];
    assert_eq!(ca["created"], 300 * MIB, "{v:#}");
    assert_eq!(ca["attached_same"], true);
    assert_eq!(ca["attach_flags"], "CUDA_ERROR_INVALID_VALUE");
    assert_eq!(ca["after_one_detach"], 300 * MIB);
    assert_eq!(ca["gone"], "CUDA_ERROR_INVALID_CONTEXT");
    assert_eq!(ca["after_last_detach"], 0);

    // A batch memory operation node writes at each launch, with the
    // parameters an executable was given.
    let bn = &v["batch_node"];
    assert_eq!(bn["type"], 12, "{v:#}"); // CU_GRAPH_NODE_TYPE_BATCH_MEM_OP
    assert_eq!(bn["get_count"], 2);
    assert_eq!(bn["launched"], json!([5, 6]));
    assert_eq!(bn["exec_updated"], json!([7, 8]));

    // cuMemAlloc memory shared with another process by IPC handle: it reads
    // this process's bytes, writes its own, opens twice (one mapping),
    // cannot cuMemFree it, and is charged nothing.
    let ipc = &v["ipc"];
    assert_eq!(ipc["again_same"], true, "{v:#}");
    assert_eq!(ipc["interior"], "CUDA_ERROR_INVALID_VALUE");
    assert_eq!(ipc["own_open"], "CUDA_ERROR_INVALID_CONTEXT");
    assert_eq!(
        ipc["child"],
        json!({"bytes": [0x31, 0x31, 0x31, 0x31], "same_ptr": true, "charged": 0,
               "free_it": "CUDA_ERROR_INVALID_VALUE", "close1": "CUDA_SUCCESS",
               "close2": "CUDA_SUCCESS", "close3": "CUDA_ERROR_INVALID_VALUE"})
    );
    assert_eq!(ipc["written_by_child"], json!([0x99, 0x99, 0x99, 0x99]));
    assert_eq!(ipc["still_mine"], json!([true]));
    assert_eq!(ipc["freed"], 0);

    // Residency: untouched managed memory is nowhere, touched on the host,
    // prefetched on the device; pageable memory on the host.
    let li = &v["location_info"];
    assert_eq!(li["untouched"], json!(["CUDA_SUCCESS", 0, 0]), "{v:#}");
    assert_eq!(li["touched"], json!(["CUDA_SUCCESS", 2, 0]));
    assert_eq!(li["prefetched"], json!(["CUDA_SUCCESS", 1, 0]));
    assert_eq!(li["pageable"], json!(["CUDA_SUCCESS", 2, 0]));
    assert_eq!(li["device_memory"], "CUDA_ERROR_INVALID_VALUE");
    assert_eq!(li["sampling_too_big"], "CUDA_ERROR_INVALID_VALUE");

    // An exportable pool and one of its allocations, imported by another
    // process: same bytes, charged nothing there, freed with cuMemFree.
    let pe = &v["pool_export"];
    assert_eq!(pe["not_exportable"], "CUDA_ERROR_INVALID_VALUE", "{v:#}");
    assert_eq!(
        pe["child"],
        json!({"bytes": [0x44, 0x44, 0x44, 0x44], "charged": 0,
               "alloc_from_imported": "CUDA_ERROR_INVALID_VALUE", "free": "CUDA_SUCCESS"})
    );
    assert_eq!(pe["written_by_child"], json!([0x66, 0x66, 0x66, 0x66]));

    let st = snapshot(&env.state_dir).unwrap();
    assert!(st.stubs.is_empty(), "stubs were hit: {:?}", st.stubs);
}

#[test]
fn nvml_queries_of_monitoring_agents_through_pynvml() {
    let env = SimEnv::new().gpus("23028:NVIDIA A10");
    let v = run_py(&env, "nvml_monitoring_client.py");
    assert_eq!(v["branch"], "r580_00", "{v:#}");
    assert_eq!(v["arch"], 7); // NVML_DEVICE_ARCH_AMPERE
    assert_eq!(v["serial"], "1324020000000");
    for k in [
        "by_uuid_prefixed",
        "by_uuid_bare",
        "by_uuid_upper",
        "by_serial",
    ] {
        assert_eq!(v[k], 0, "{k}: {v:#}");
    }
    assert_eq!(v["max_clock_sm"], 1695);
    assert_eq!(v["max_clock_mem"], 6251);
    assert_eq!(v["power_limit"], 150_000);
    assert_eq!(v["limit_constraints"], json!([75_000, 150_000]));
    assert_eq!(v["pstate"], 0);
    // Energy grows by at least the idle 30 W over the 200 ms between reads.
    let de = v["energy2"].as_u64().unwrap() - v["energy1"].as_u64().unwrap();
    assert!(de >= 6000, "{de} mJ");
    assert_eq!(v["temp_slowdown"], 87);
    assert_eq!(v["pcie_gen"], 4);
    assert_eq!(v["pcie_width"], 16);
    assert_eq!(v["bar1_total"], 256 * MIB);
    assert_eq!(v["ecc"], json!([0, 0]));
    assert_eq!(v["mig"], json!([0, 0]));
    assert_eq!(v["encoder"], json!([0, 167_000]));
    assert_eq!(v["remapped"], json!([0, 0, 0, 0]));
    assert_eq!(v["topology_self"], 0);
    assert_eq!(v["affinity_nonzero"], true);
    assert!(
        v["process_name"].as_str().unwrap().contains("python"),
        "{v:#}"
    );
    assert_eq!(v["unit_count"], 0);
    assert_eq!(v["event_wait"], "Timeout");
    assert!(v["event_wait_ms"].as_f64().unwrap() >= 100.0);
    let st = snapshot(&env.state_dir).unwrap();
    assert!(st.stubs.is_empty(), "stubs were hit: {:?}", st.stubs);
}

/// gpustat, a monitoring tool on NVML, shows what the sim holds: devices,
/// memory in use, the process using it, power limits, no stub touched.
#[test]
fn gpustat_shows_the_simulated_gpus() {
    let env = SimEnv::new()
        .gpus("23028:NVIDIA A10,15109:Tesla T4")
        .ctx_mib(300);
    let mut holder = env.spawn(
        cgpu_testkit::cuclient(cgpu_testkit::LinkMode::Link),
        &["alloc", "268435456", "pid", "hold"],
    );
    let lines =
        cgpu_testkit::read_until(&mut holder, "holding", std::time::Duration::from_secs(60));
    let pid: u64 = lines
        .iter()
        .find(|l| l.starts_with("pid ok"))
        .and_then(|l| cgpu_testkit::field(l, "pid"))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{lines:?}"));
    let gpustat = test_deps().venv.join("bin/gpustat");
    let o = env.run(&gpustat, &["--json"]);
    let _ = holder.kill();
    let _ = holder.wait();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(v["driver_version"], "580.82.07");
    let g = &v["gpus"];
    assert_eq!(g[0]["name"], "NVIDIA A10", "{v:#}");
    assert_eq!(g[1]["name"], "Tesla T4");
    assert_eq!(g[0]["memory.total"], 23028);
    assert_eq!(g[1]["memory.total"], 15109);
    // The context's 300 MiB and the 256 MiB allocation.
    assert_eq!(g[0]["memory.used"], 556);
    assert_eq!(g[1]["memory.used"], 0);
    assert_eq!(g[0]["enforced.power.limit"], 150);
    assert_eq!(g[1]["enforced.power.limit"], 70);
    let procs = g[0]["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 1, "{v:#}");
    assert_eq!(procs[0]["pid"], pid);
    assert_eq!(procs[0]["gpu_memory_usage"], 556);
    let st = snapshot(&env.state_dir).unwrap();
    assert!(st.stubs.is_empty(), "stubs were hit: {:?}", st.stubs);
}

/// How many of the names cuda-bindings 13.5.0 resolves at start are only
/// counted stubs in the sim (`shim/tools/coverage.sh`). It may only shrink.
const MAX_STUBS_RESOLVED: usize = 105;

#[test]
fn what_cuda_bindings_resolves_exists_or_is_a_named_stub() {
    let env = SimEnv::new()
        .env("CGPU_SIM_TRACE", "1")
        .env("CGPU_SIM_DRIVER_VERSION", "13050");
    let o = env.run(
        &test_deps().python,
        &[
            "-c",
            "from cuda.bindings import driver as d\nassert d.cuInit(0)[0] == d.CUresult.CUDA_SUCCESS",
        ],
    );
    let trace = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{trace}");
    let readme =
        std::fs::read_to_string(cgpu_testkit::workspace_root().join("shim/README.md")).unwrap();
    let mut asked = std::collections::BTreeSet::new();
    let mut missing = std::collections::BTreeSet::new();
    let mut found = std::collections::BTreeSet::new();
    let mut unlisted_stubs = Vec::new();
    let mut stubs = std::collections::BTreeSet::new();
    for l in trace.lines() {
        let Some(rest) = l.strip_prefix("cgpu-sim: cuGetProcAddress(") else {
            continue;
        };
        let name = rest.split(',').next().unwrap().to_string();
        let answer = rest.split(" -> ").nth(1).unwrap_or("");
        asked.insert(name.clone());
        if answer == "SYMBOL_NOT_FOUND" || answer == "VERSION_NOT_SUFFICIENT" {
            missing.insert(name);
        } else {
            if answer.ends_with(" (stub)") {
                stubs.insert(name.clone());
                if !readme.contains(&format!("`{name}`")) {
                    unlisted_stubs.push(name.clone());
                }
            }
            found.insert(name);
        }
    }
    let missing: Vec<_> = missing.difference(&found).cloned().collect();
    assert!(asked.len() > 500, "{} names: {trace}", asked.len());
    assert!(missing.is_empty(), "missing: {missing:?}");
    assert!(
        stubs.len() <= MAX_STUBS_RESOLVED,
        "{} stubs resolved (at most {MAX_STUBS_RESOLVED}): {stubs:?}",
        stubs.len()
    );
    assert!(
        unlisted_stubs.is_empty(),
        "stubs not named in shim/README.md: {unlisted_stubs:?}"
    );
}
