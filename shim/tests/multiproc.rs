//! Several processes on one state directory: memory taken by one is missing
//! for the other; a killed process's memory comes back; two busy processes
//! share the device about equally; device time and kernel counts are
//! readable from the state directory after the processes exit.

use cgpu_testkit::{cuclient, num, read_until, LinkMode, SimEnv};
use std::time::Duration;

const MIB: u64 = 1 << 20;

#[test]
fn memory_is_shared_and_a_killed_process_gives_it_back() {
    let env = SimEnv::new().gpus("8000:Tesla T4").ctx_mib(300);
    let before = env.cuclient(LinkMode::Link, &["meminfo"]);
    assert_eq!(num(&before, "meminfo", "free"), (8000 - 300) * MIB);

    // A holds its context + 2000 MiB, then waits to be killed.
    let mut a = env.spawn(
        cuclient(LinkMode::Dlsym),
        &["alloc", "2097152000", "pid", "hold"],
    );
    let lines = read_until(&mut a, "holding", Duration::from_secs(60));
    assert!(lines.iter().any(|l| l.starts_with("alloc ok")), "{lines:?}");
    let pid_a: u32 = lines
        .iter()
        .find_map(|l| cgpu_testkit::field(l, "pid"))
        .unwrap()
        .parse()
        .unwrap();

    // B sees A's memory gone, in CUDA and NVML, and cannot take more than is left.
    let out = env.cuclient(
        LinkMode::ProcAddr,
        &[
            "meminfo",
            "nvml_meminfo",
            "nvml_procs",
            "alloc_until_oom",
            "268435456",
        ],
    );
    assert_eq!(
        num(&out, "meminfo", "free"),
        (8000 - 300 - 300 - 2000) * MIB,
        "{out}"
    );
    assert_eq!(
        num(&out, "nvml_meminfo", "used"),
        (300 + 300 + 2000) * MIB,
        "{out}"
    );
    assert!(out.contains(&format!(" {pid_a}:{}", 2300 * MIB)), "{out}");
    // 5400 MiB were free: 21 chunks of 256 MiB, then OUT_OF_MEMORY (2)
    assert_eq!(num(&out, "alloc_until_oom", "count"), 21, "{out}");
    assert_eq!(num(&out, "alloc_until_oom", "err"), 2, "{out}");

    let st = env.stats();
    assert_eq!(
        st.process(pid_a, 0).map(|p| (p.alive, p.mem_bytes)),
        Some((true, 2300 * MIB))
    );

    a.kill().unwrap();
    a.wait().unwrap();
    let out = env.cuclient(LinkMode::Link, &["meminfo", "nvml_meminfo"]);
    assert_eq!(
        num(&out, "meminfo", "free"),
        (8000 - 300) * MIB,
        "A's memory came back: {out}"
    );
    assert_eq!(num(&out, "nvml_meminfo", "used"), 300 * MIB, "{out}");
    let st = env.stats();
    let pa = st.process(pid_a, 0).expect("A's record is kept");
    assert!(!pa.alive);
    assert_eq!(pa.mem_bytes, 0);
    assert_eq!(st.devices[0].used_bytes, 0);
}

#[test]
fn device_time_and_kernels_are_recorded_per_process() {
    let env = SimEnv::new();
    let out = env.cuclient(
        LinkMode::Link,
        &["pid", "spin", "1000000", "20", "spin", "5000", "1000"],
    );
    let pid = num(&out, "pid", "pid") as u32;
    let st = env.stats();
    let p = st.process(pid, 0).expect("record");
    assert!(!p.alive, "exited");
    assert_eq!(p.kernels, 1020);
    assert_eq!(p.device_time_ns, 20 * 1_000_000 + 1000 * 5000);
    assert_eq!(st.devices[0].busy_ns, p.device_time_ns);
    assert_eq!(st.devices[0].kernels, 1020);
    // 1000 kernels of 5 us are batched: far less than 1000 wake-ups' worth of wall time
    let wall = out
        .lines()
        .filter(|l| l.starts_with("spin ok"))
        .nth(1)
        .map(|l| num(l, "spin", "wall_ns"))
        .unwrap();
    assert!((5_000_000..1_000_000_000).contains(&wall), "{wall}");
}
