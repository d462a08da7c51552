//! The C ABI is the real one: cuclient, compiled against the real cuda.h /
//! nvml.h, runs on the sim linked with -lcuda, through dlopen+dlsym, and
//! through cuGetProcAddress_v2.

use cgpu_testkit::{field, line, num, LinkMode, SimEnv};

const MIB: u64 = 1 << 20;

#[test]
fn all_three_bindings_work() {
    let env = SimEnv::new()
        .gpus("23028:NVIDIA A10,15109:Tesla T4")
        .ctx_mib(300);
    for mode in LinkMode::ALL {
        let out = env.cuclient(
            mode,
            &[
                "devcount",
                "name",
                "totalmem",
                "meminfo",
                "alloc",
                "1048576",
                "meminfo",
                "memcpy_roundtrip",
                "3000001",
                "alloc_managed",
                "1000",
                "alloc_pitch",
                "1000",
                "10",
                "alloc_async",
                "4096",
                "alloc_vmm",
                "1",
                "array",
                "100",
                "100",
                "meminfo",
                "freeall",
                "meminfo",
                "spin",
                "2000000",
                "5",
                "spin_events",
                "1000000",
                "4",
                "graph",
                "500000",
                "4",
                "nvml_count",
                "nvml_meminfo",
                "nvml_meminfo_v2",
                "nvml_procs",
                "nvml_uuid",
            ],
        );
        let m = mode.name();
        assert_eq!(num(&out, "devcount", "n"), 2, "{m}: {out}");
        assert_eq!(field(line(&out, "name"), "name"), Some("NVIDIA"), "{m}");
        assert!(
            line(&out, "name").ends_with("name=NVIDIA A10"),
            "{m}: {out}"
        );
        assert_eq!(num(&out, "totalmem", "bytes"), 23028 * MIB);
        let metas: Vec<(u64, u64)> = out
            .lines()
            .filter(|l| l.starts_with("meminfo ok"))
            .map(|l| {
                (
                    field(l, "free").unwrap().parse().unwrap(),
                    field(l, "total").unwrap().parse().unwrap(),
                )
            })
            .collect();
        assert_eq!(metas.len(), 4, "{m}: {out}");
        assert!(metas.iter().all(|(_, t)| *t == 23028 * MIB));
        // the primary context reserves 300 MiB
        assert_eq!(metas[0].0, (23028 - 300) * MIB, "{m}");
        assert_eq!(metas[0].0 - metas[1].0, MIB, "{m}: 1 MiB alloc");
        // managed 1000 B -> 1024, pitch 1024*10, async 4096, vmm 2 MiB, array 10000 -> 10240
        assert_eq!(
            metas[1].0 - metas[2].0,
            1024 + 10240 + 4096 + 2 * MIB + 10240,
            "{m}: {out}"
        );
        assert_eq!(metas[3].0, metas[0].0, "{m}: freeall returns everything");
        assert!(out.contains("memcpy_roundtrip ok"), "{m}: {out}");
        let spin_ns = num(&out, "spin", "wall_ns");
        assert!(spin_ns >= 10_000_000, "{m}: 5 x 2 ms took {spin_ns} ns");
        let ms: f64 = field(line(&out, "spin_events"), "ms")
            .unwrap()
            .parse()
            .unwrap();
        let wall = num(&out, "spin_events", "wall_ns") as f64 / 1e6;
        assert!(
            ms >= 4.0 && ms <= wall + 0.5,
            "{m}: events measured {ms} ms for 4 ms of kernels (wall {wall} ms)"
        );
        assert!(num(&out, "graph", "wall_ns") >= 2_000_000, "{m}: {out}");
        assert_eq!(num(&out, "nvml_count", "n"), 2);
        let total = num(&out, "nvml_meminfo", "total");
        let used = num(&out, "nvml_meminfo", "used");
        assert_eq!(total, 23028 * MIB);
        assert_eq!(used, 300 * MIB, "{m}: only the context is left");
        assert_eq!(num(&out, "nvml_meminfo_v2", "used"), 300 * MIB);
        let procs = line(&out, "nvml_procs");
        assert!(procs.contains(&format!(":{}", 300 * MIB)), "{m}: {procs}");
        assert!(field(line(&out, "nvml_uuid"), "uuid")
            .unwrap()
            .starts_with("GPU-"));
    }
}

#[test]
fn procaddr_resolves_variants_by_version_and_flags() {
    let env = SimEnv::new();
    let out = env.cuclient(
        LinkMode::Dlsym,
        &[
            "procaddr",
            "cuMemAlloc",
            "3020",
            "0",
            "procaddr",
            "cuMemAlloc",
            "2000",
            "0",
            "procaddr",
            "cuCtxCreate",
            "12050",
            "0",
            "procaddr",
            "cuCtxCreate",
            "11040",
            "0",
            "procaddr",
            "cuCtxCreate",
            "3020",
            "0",
            "procaddr",
            "cuMemcpyHtoD",
            "12000",
            "2",
            "procaddr",
            "cuMemcpyHtoD",
            "12000",
            "0",
            "procaddr",
            "cuStreamSynchronize",
            "12000",
            "2",
            "procaddr",
            "cuLaunchKernel",
            "12000",
            "2",
            "procaddr",
            "cuNoSuchThing",
            "12000",
            "0",
            "procaddr",
            "cuMemAllocAsync",
            "11000",
            "0",
            "procaddr",
            "cuGetProcAddress",
            "12000",
            "0",
        ],
    );
    let got: Vec<(String, String, String)> = out
        .lines()
        .filter(|l| l.starts_with("procaddr"))
        .map(|l| {
            (
                field(l, "name").unwrap().to_string(),
                field(l, "status").unwrap().to_string(),
                field(l, "sym").unwrap().to_string(),
            )
        })
        .collect();
    let want = [
        ("cuMemAlloc", "0", "cuMemAlloc_v2"),
        ("cuMemAlloc", "0", "cuMemAlloc"),
        ("cuCtxCreate", "0", "cuCtxCreate_v4"),
        ("cuCtxCreate", "0", "cuCtxCreate_v3"),
        ("cuCtxCreate", "0", "cuCtxCreate_v2"),
        ("cuMemcpyHtoD", "0", "cuMemcpyHtoD_v2_ptds"),
        ("cuMemcpyHtoD", "0", "cuMemcpyHtoD_v2"),
        ("cuStreamSynchronize", "0", "cuStreamSynchronize_ptsz"),
        ("cuLaunchKernel", "0", "cuLaunchKernel_ptsz"),
        ("cuNoSuchThing", "1", "?"),
        ("cuMemAllocAsync", "2", "?"),
        ("cuGetProcAddress", "0", "cuGetProcAddress_v2"),
    ];
    assert_eq!(got.len(), want.len(), "{out}");
    for (g, w) in got.iter().zip(want) {
        assert_eq!((g.0.as_str(), g.1.as_str(), g.2.as_str()), w, "{out}");
    }
    assert!(out.contains("procaddr err=500 name=cuNoSuchThing"), "{out}");
}

#[test]
fn a_preload_that_only_exports_is_bypassed() {
    let a = cgpu_testkit::artifacts();
    let lib = cgpu_testkit::compile_c_with(
        &cgpu_testkit::workspace_root().join("tests/c/preload_memalloc.c"),
        "preload_memalloc.so",
        &[],
        LinkMode::Dlsym,
        &["-shared", "-fPIC"],
    );
    let _ = a;
    let env = SimEnv::new().preload(&lib);
    // Linked clients are interposed (the preload works) ...
    let o = env.run(cgpu_testkit::cuclient(LinkMode::Link), &["alloc", "4096"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("alloc err=999"), "{out}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("intercepted"));
    // ... but dlsym on the driver's handle and cuGetProcAddress are not.
    for mode in [LinkMode::Dlsym, LinkMode::ProcAddr] {
        let o = env.run(
            cgpu_testkit::cuclient(mode),
            &["alloc", "4096", "procaddr", "cuMemAlloc", "12000", "0"],
        );
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(out.contains("alloc ok"), "{}: {out}", mode.name());
        assert!(
            line(&out, "procaddr").ends_with("sym=cuMemAlloc_v2"),
            "{out}"
        );
        assert!(
            !String::from_utf8_lossy(&o.stderr).contains("intercepted"),
            "{}",
            mode.name()
        );
    }
}

#[test]
fn calls_before_init_and_bad_arguments() {
    let env = SimEnv::new();
    let src = cgpu_testkit::workspace_root().join("tests/c/badinput.c");
    let bin = cgpu_testkit::compile_c(&src, &[], LinkMode::Link);
    let o = env.run(&bin, &[]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "badinput crashed: {:?}\n{out}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(out.contains("ALL OK"), "{out}");
}

/// Every launch path runs timed kernels (spin from kernelParams and from an
/// `extra` buffer, cuLaunchKernelEx, cooperative), other kernels take
/// CGPU_SIM_KERNEL_NS, PTX names are checked and binary images resolve any name.
#[test]
fn launch_paths_and_kernel_timing() {
    let env = SimEnv::new().env("CGPU_SIM_KERNEL_NS", "2000000");
    for mode in LinkMode::ALL {
        let out = env.cuclient(
            mode,
            &[
                "pid",
                "launch_ways",
                "3000000",
                "kernel",
                "my_kernel",
                "3",
                "kernel_bin",
                "anything_at_all",
                "2",
            ],
        );
        let pid = num(&out, "pid", "pid") as u32;
        assert!(num(&out, "launch_ways", "wall_ns") >= 12_000_000, "{out}");
        assert!(num(&out, "kernel", "wall_ns") >= 6_000_000, "{out}");
        assert!(num(&out, "kernel_bin", "wall_ns") >= 4_000_000, "{out}");
        let st = env.stats();
        let p = st.process(pid, 0).unwrap();
        assert_eq!(p.kernels, 4 + 3 + 2, "{}", mode.name());
        assert_eq!(
            p.device_time_ns,
            4 * 3_000_000 + 5 * 2_000_000,
            "{}",
            mode.name()
        );
    }
}

/// Stream capture: launches into a capturing stream are recorded (not run)
/// and become the kernel nodes of the graph cuStreamEndCapture returns;
/// cuCtxSynchronize or cuStreamSynchronize of the capturing stream during a
/// capture fails with STREAM_CAPTURE_UNSUPPORTED (900) and invalidates it, so
/// cuStreamEndCapture then fails with STREAM_CAPTURE_INVALIDATED (901) and a
/// null graph, as on the real driver.
#[test]
fn stream_capture_records_and_sync_invalidates() {
    let env = SimEnv::new();
    for mode in LinkMode::ALL {
        let out = env.cuclient(
            mode,
            &[
                "pid",
                "capture_begin",
                "capture_status",
                "capture_spin",
                "20000000",
                "5",
                "capture_status",
                "capture_end",
                "graph_launch_last",
                // invalidated by cuCtxSynchronize
                "capture_begin",
                "capture_spin",
                "1000000",
                "2",
                "sync",
                "capture_status",
                "capture_end",
                // invalidated by cuStreamSynchronize of the capturing stream
                "capture_begin",
                "capture_spin",
                "1000000",
                "1",
                "capture_sync",
                "capture_end",
                "sync",
            ],
        );
        let pid = num(&out, "pid", "pid") as u32;
        let got: Vec<String> = out
            .lines()
            .skip(1)
            .map(|l| {
                l.split_whitespace()
                    .filter(|w| !w.starts_with("wall_ns="))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect();
        let want = [
            "capture_begin ok",
            "capture_status ok status=1",
            "capture_spin ok count=5",
            "capture_status ok status=1",
            "capture_end ok graph=set",
            "graph_launch_last ok",
            "capture_begin ok",
            "capture_spin ok count=2",
            "sync err=900",
            "capture_status ok status=2",
            "capture_end err=901 graph=null",
            "capture_begin ok",
            "capture_spin ok count=1",
            "capture_sync err=900",
            "capture_end err=901 graph=null",
            "sync ok",
        ];
        assert_eq!(got, want, "{}:\n{out}", mode.name());
        // The captured graph ran its 5 recorded kernels, once.
        assert!(
            num(&out, "graph_launch_last", "wall_ns") >= 100_000_000,
            "{out}"
        );
        // Only the graph launch ran: captured launches never executed.
        let p = env.stats().process(pid, 0).unwrap().clone();
        assert_eq!(p.kernels, 5, "{}", mode.name());
        assert_eq!(p.device_time_ns, 5 * 20_000_000, "{}", mode.name());
    }
}
