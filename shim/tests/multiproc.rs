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

/// Two processes that keep the device busy get ~50% each, whatever their
/// kernel lengths (50 us vs 1 ms), measured over a window where both run.
#[test]
fn two_busy_processes_share_the_device_equally() {
    let env = SimEnv::new();
    let c = cuclient(LinkMode::Link);
    let mut a = env.spawn(&c, &["pid", "spin_for", "5000", "50000"]);
    let mut b = env.spawn(&c, &["pid", "spin_for", "5000", "1000000"]);
    let pa: u32 = read_until(&mut a, "pid", Duration::from_secs(30))
        .last()
        .and_then(|l| cgpu_testkit::field(l, "pid"))
        .unwrap()
        .parse()
        .unwrap();
    let pb: u32 = read_until(&mut b, "pid", Duration::from_secs(30))
        .last()
        .and_then(|l| cgpu_testkit::field(l, "pid"))
        .unwrap()
        .parse()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1000));
    let s1 = env.stats();
    std::thread::sleep(Duration::from_millis(2500));
    let s2 = env.stats();
    let d = |p: u32| {
        let t1 = s1.process(p, 0).map(|x| x.device_time_ns).unwrap_or(0);
        let t2 = s2.process(p, 0).map(|x| x.device_time_ns).unwrap_or(0);
        (t2 - t1) as f64
    };
    let (ta, tb) = (d(pa), d(pb));
    let share = ta / (ta + tb);
    eprintln!(
        "device time in window: a {:.3} s, b {:.3} s, share a {:.3}",
        ta / 1e9,
        tb / 1e9,
        share
    );
    assert!(
        ta + tb > 1.0e9,
        "the device was busy most of the 2.5 s window: {}",
        (ta + tb) / 1e9
    );
    assert!((0.45..=0.55).contains(&share), "share of a = {share:.3}");
    for ch in [a, b] {
        let o = cgpu_testkit::wait_output(ch, Duration::from_secs(60));
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            out.contains("spin_for ok"),
            "{out}\n{}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

/// A process killed while it owns the device does not block the others.
#[test]
fn a_process_killed_on_the_device_does_not_block_others() {
    let env = SimEnv::new();
    let c = cuclient(LinkMode::Link);
    let mut a = env.spawn(&c, &["ready", "spin_for", "60000", "2000000"]);
    read_until(&mut a, "ready", Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(300));
    let mut b = env.spawn(&c, &["ready", "spin", "1000000", "300"]);
    read_until(&mut b, "ready", Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(200));
    a.kill().unwrap();
    a.wait().unwrap();
    let t = std::time::Instant::now();
    let o = cgpu_testkit::wait_output(b, Duration::from_secs(60));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("spin ok count=300"), "{out}");
    // B had at most 300 ms of work left; generous bound for a slow machine.
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
    let st = env.stats();
    assert_eq!(st.processes.iter().filter(|p| p.alive).count(), 0);
}

/// NVML utilisation reflects device time: a busy process shows ~100%.
#[test]
fn nvml_utilisation_follows_device_time() {
    let env = SimEnv::new();
    let c = cuclient(LinkMode::Link);
    // 20 s of device work queued at once: the device stays busy however
    // late this process gets the CPU on a loaded machine (it is killed below).
    let mut a = env.spawn(&c, &["pid", "spin_async", "1000000", "20000", "hold"]);
    let pa: u32 = read_until(&mut a, "pid", Duration::from_secs(30))
        .last()
        .and_then(|l| cgpu_testkit::field(l, "pid"))
        .unwrap()
        .parse()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let out = env.cuclient(
        LinkMode::Dlsym,
        // 2 s windows: the sim credits device time when a batch completes,
        // so a starved executor thread blurs short windows on a loaded host.
        &[
            "nvml_util",
            "sleep",
            "2000",
            "nvml_util",
            "sleep",
            "2000",
            "nvml_putil",
        ],
    );
    let last_util = out
        .lines()
        .rfind(|l| l.starts_with("nvml_util ok"))
        .unwrap();
    let gpu: u32 = cgpu_testkit::field(last_util, "gpu")
        .unwrap()
        .parse()
        .unwrap();
    assert!(gpu >= 80, "{out}");
    let putil = cgpu_testkit::line(&out, "nvml_putil");
    let sm: u32 = putil
        .split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{pa}:")))
        .unwrap_or_else(|| panic!("{putil}"))
        .parse()
        .unwrap();
    assert!(sm >= 80, "{putil}");
    let _ = a.kill();
    let _ = a.wait();
}

/// Eight processes racing to allocate never over-commit the device: together
/// they get exactly floor(total / chunk) chunks.
#[test]
fn racing_processes_never_overcommit() {
    let env = SimEnv::new().gpus("2000:Tesla T4").ctx_mib(0);
    let c = cuclient(LinkMode::Link);
    let mut kids: Vec<_> = (0..8)
        .map(|_| env.spawn(&c, &["init", "alloc_until_oom", "67108864", "hold"]))
        .collect();
    let mut total = 0;
    for k in kids.iter_mut() {
        let lines = read_until(k, "holding", Duration::from_secs(60));
        let l = lines
            .iter()
            .find(|l| l.starts_with("alloc_until_oom ok"))
            .unwrap_or_else(|| panic!("{lines:?}"));
        assert_eq!(cgpu_testkit::field(l, "err"), Some("2"), "{l}");
        total += cgpu_testkit::field(l, "count")
            .unwrap()
            .parse::<u64>()
            .unwrap();
    }
    assert_eq!(total, 2000 / 64, "chunks granted in total");
    let st = env.stats();
    assert_eq!(st.devices[0].used_bytes, 31 * 64 * MIB);
    for mut k in kids {
        let _ = k.kill();
        let _ = k.wait();
    }
    assert_eq!(env.stats().devices[0].used_bytes, 0);
}

/// A process frozen (SIGSTOP) while it owns the device loses it after a
/// while, as a GPU would time-slice its context out; resumed, it finishes.
#[test]
fn a_frozen_owner_does_not_block_others_forever() {
    let env = SimEnv::new();
    let c = cuclient(LinkMode::Link);
    let mut a = env.spawn(&c, &["ready", "spin_for", "2000", "2000000"]);
    read_until(&mut a, "ready", Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(a.id() as i32, libc::SIGSTOP) };
    let t = std::time::Instant::now();
    let out = env.cuclient(LinkMode::Link, &["spin", "1000000", "100"]);
    assert!(out.contains("spin ok count=100"), "{out}");
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
    // SAFETY: as above.
    unsafe { libc::kill(a.id() as i32, libc::SIGCONT) };
    let o = cgpu_testkit::wait_output(a, Duration::from_secs(60));
    assert!(String::from_utf8_lossy(&o.stdout).contains("spin_for ok"));
}

/// A forked child that never touches CUDA shares its parent's file
/// descriptions; it must not keep a killed parent's memory held.
#[test]
fn a_forked_child_does_not_keep_a_killed_parents_memory() {
    let env = SimEnv::new().gpus("8000:Tesla T4").ctx_mib(300);
    let mut a = env.spawn(
        cuclient(LinkMode::Link),
        &["alloc", "1073741824", "fork_sleep", "20", "hold"],
    );
    let lines = read_until(&mut a, "holding", Duration::from_secs(60));
    let child: i32 = lines
        .iter()
        .find_map(|l| cgpu_testkit::field(l, "child"))
        .expect("fork_sleep printed the child")
        .parse()
        .unwrap();
    assert_eq!(env.stats().devices[0].used_bytes, (300 + 1024) * MIB);
    a.kill().unwrap();
    a.wait().unwrap();
    // SAFETY: signal 0 only checks that the child (a plain sleeping process) exists.
    assert_eq!(unsafe { libc::kill(child, 0) }, 0, "the child lives on");
    let out = env.cuclient(LinkMode::Link, &["meminfo"]);
    // SAFETY: the child is ours to stop; it only sleeps.
    unsafe { libc::kill(child, libc::SIGKILL) };
    assert_eq!(
        num(&out, "meminfo", "free"),
        (8000 - 300) * MIB,
        "the killed parent's memory came back while its child lived: {out}"
    );
    assert_eq!(env.stats().devices[0].used_bytes, 0);
}

/// Events time a process's own work on a device it shares: an event
/// recorded on an empty stream while another process runs on the device
/// takes its timestamp when this process's turn comes (a GPU processes a
/// context's commands only while it runs that context), so events around a
/// 0.2 ms kernel beside a busy neighbour (2 ms time-slices of 1 ms kernels)
/// measure about 0.2 ms while the caller waited for the neighbour's turn
/// too. (When markers completed at once, the same events measured the wait
/// as well: about 1.1 ms.)
#[test]
fn events_beside_a_busy_process_time_only_the_callers_work() {
    let env = SimEnv::new();
    let c = cuclient(LinkMode::Link);
    let mut busy = env.spawn(&c, &["init", "ready", "spin_for", "3000", "1000000"]);
    read_until(&mut busy, "ready", Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(200));
    let mut args = vec!["spin", "1", "1"];
    for _ in 0..40 {
        args.extend(["spin_events", "200000", "1"]);
    }
    let out = env.cuclient(LinkMode::Link, &args);
    let (mut ms, mut wall) = (Vec::new(), Vec::new());
    for l in out.lines().filter(|l| l.starts_with("spin_events")) {
        assert!(l.starts_with("spin_events ok"), "{out}");
        ms.push(
            cgpu_testkit::field(l, "ms")
                .unwrap()
                .parse::<f64>()
                .unwrap(),
        );
        wall.push(
            cgpu_testkit::field(l, "wall_ns")
                .unwrap()
                .parse::<f64>()
                .unwrap()
                / 1e6,
        );
    }
    assert_eq!(ms.len(), 40, "{out}");
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
    eprintln!(
        "beside a busy process: events {:.3} ms, wall {:.3} ms per 0.2 ms kernel",
        mean(&ms),
        mean(&wall)
    );
    // Each measures its own kernel (0.2 ms), never less, and not the wait.
    // The median: an end event the client records only after its kernel
    // completed (a client thread kept off the CPU on a loaded machine) is
    // recorded on an empty stream and waits for the next turn, as on a GPU;
    // a few such pairs measure a time-slice more.
    assert!(ms.iter().all(|&m| m >= 0.199), "{ms:?}");
    let mut sorted = ms.clone();
    sorted.sort_by(f64::total_cmp);
    let median = sorted[sorted.len() / 2];
    assert!(
        median < 0.3,
        "events measured {median:.3} ms (median): {ms:?}"
    );
    // The neighbour did hold the device: the calls themselves waited.
    assert!(mean(&wall) > 0.5, "wall {:.3} ms: {wall:?}", mean(&wall));
    let o = cgpu_testkit::wait_output(busy, Duration::from_secs(60));
    assert!(String::from_utf8_lossy(&o.stdout).contains("spin_for ok"));
}
