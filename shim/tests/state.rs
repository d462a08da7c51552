//! The state directory: corrupt or foreign state files are moved aside with
//! a clear message; both library names share one state; UUIDs are stable.

use cgpu_testkit::{line, num, LinkMode, SimEnv};

#[test]
fn a_corrupt_state_file_is_moved_aside() {
    let env = SimEnv::new();
    std::fs::write(
        env.state_dir.join("state"),
        b"this is not a cgpu-sim state file",
    )
    .unwrap();
    let o = env.run(
        cgpu_testkit::cuclient(LinkMode::Link),
        &["meminfo", "nvml_meminfo"],
    );
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{out}\n{err}");
    assert_eq!(num(&out, "meminfo", "total"), 15109 << 20, "{out}");
    assert!(
        err.contains("corrupt or of another format version"),
        "{err}"
    );
    let aside: Vec<_> = std::fs::read_dir(&env.state_dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("state.bad-"))
        .collect();
    assert_eq!(aside.len(), 1);
    assert_eq!(
        std::fs::read(aside[0].path()).unwrap(),
        b"this is not a cgpu-sim state file"
    );
    // A state of another version (valid magic, wrong version) too.
    let mut bytes = std::fs::read(env.state_dir.join("state")).unwrap();
    bytes[8] = 99;
    std::fs::write(env.state_dir.join("state"), &bytes).unwrap();
    let o = env.run(cgpu_testkit::cuclient(LinkMode::Link), &["meminfo"]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("meminfo ok"));
    assert!(String::from_utf8_lossy(&o.stderr).contains("another format version"));
}

#[test]
fn both_names_are_one_library_and_one_state() {
    let env = SimEnv::new().gpus("1000:A,2000:B");
    for mode in [LinkMode::Dlsym, LinkMode::Link] {
        let out = env.cuclient(
            mode,
            &[
                "same_lib",
                "alloc",
                "1048576",
                "meminfo",
                "nvml_meminfo",
                "nvml_uuid",
            ],
        );
        assert!(out.contains("same_lib ok same=1"), "{out}");
        let free = num(&out, "meminfo", "free");
        let total = num(&out, "meminfo", "total");
        assert_eq!(num(&out, "nvml_meminfo", "used"), total - free);
        assert_eq!(num(&out, "nvml_meminfo", "free"), free);
    }
    // UUIDs are stable across processes and differ between devices.
    let a = env.cuclient(LinkMode::Link, &["nvml_uuid"]);
    let b = env.cuclient(LinkMode::Link, &["-d", "1", "nvml_uuid"]);
    let b2 = env.cuclient(LinkMode::Dlsym, &["-d", "1", "nvml_uuid"]);
    assert_ne!(line(&a, "nvml_uuid"), line(&b, "nvml_uuid"));
    assert_eq!(line(&b, "nvml_uuid"), line(&b2, "nvml_uuid"));
    let st = env.stats();
    assert_eq!(st.devices.len(), 2);
    assert_eq!(st.devices[1].total_bytes, 2000 << 20);
    assert!(line(&b, "nvml_uuid").ends_with(&st.devices[1].uuid));
}

/// NVML lists a process while it has a context, even one that reserves no
/// memory, and not after the context is gone.
#[test]
fn nvml_lists_processes_with_a_context() {
    let env = SimEnv::new().ctx_mib(0);
    let out = env.cuclient(
        LinkMode::Link,
        &[
            "pid",
            "ctx_create",
            "nvml_procs",
            "ctx_destroy",
            "nvml_procs",
        ],
    );
    let pid = num(&out, "pid", "pid");
    let procs: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("nvml_procs"))
        .collect();
    // the primary context of cuclient's initialisation stays: count contexts
    assert!(procs[0].contains(&format!(" {pid}:0")), "{out}");
    assert!(
        procs[1].contains(&format!(" {pid}:0")),
        "primary context still alive: {out}"
    );
    let out = env.cuclient(LinkMode::Link, &["nvml_procs"]);
    assert!(!out.contains(&format!(" {pid}:")), "{out}");
    // Relative and absolute state paths name the same GPUs.
    let rel = env.state_dir.strip_prefix("/").unwrap();
    let o1 = env.cuclient(LinkMode::Link, &["nvml_uuid"]);
    let o2 = {
        let mut c = env.command(cgpu_testkit::cuclient(LinkMode::Link));
        c.current_dir("/")
            .env("CGPU_SIM_STATE", rel)
            .arg("nvml_uuid");
        String::from_utf8(c.output().unwrap().stdout).unwrap()
    };
    assert_eq!(line(&o1, "nvml_uuid"), line(&o2, "nvml_uuid"));
}

/// `cgpu-sim-stat`: the human view, a missing state, and --install-dir.
#[test]
fn sim_stat_tool() {
    let a = cgpu_testkit::artifacts();
    let env = SimEnv::new().gpus("1000:NVIDIA A10");
    let stat = |args: &[&str]| {
        std::process::Command::new(&a.sim_stat)
            .args(args)
            .output()
            .unwrap()
    };
    let dir = env.state_dir.to_str().unwrap();
    let o = stat(&["--state", dir]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("no simulated GPU state"));
    env.cuclient(LinkMode::Link, &["spin", "1000000", "3"]);
    let o = stat(&["--state", dir]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("GPU 0 NVIDIA A10"), "{out}");
    assert!(out.contains("exited") && out.contains("kernels 3"), "{out}");
    let libdir = env.state_dir.join("libdir");
    let o = stat(&["--install-dir", libdir.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for n in [
        "libcuda.so.1",
        "libcuda.so",
        "libnvidia-ml.so.1",
        "libnvidia-ml.so",
    ] {
        assert_eq!(
            std::fs::canonicalize(libdir.join(n)).unwrap(),
            std::fs::canonicalize(&a.libsim).unwrap()
        );
    }
    assert_eq!(stat(&["--bogus"]).status.code(), Some(2));
}
