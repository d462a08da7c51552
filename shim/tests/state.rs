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
