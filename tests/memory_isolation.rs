//! Memory isolation on the simulated driver, with real processes
//! under `LD_PRELOAD`: every allocation family, the container's quota shared
//! by its processes and never passed under racing, containers isolated from
//! each other, `kill -9` at random points, `fork` and threads, pass-through
//! when unset, documented behaviour for bad values, hidden GPUs.

mod interpose_common;

use cgpu::ledger::Ledger;
use interpose_common::*;
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::process::Stdio;
use std::time::{Duration, Instant};

const T4: &str = "15109:Tesla T4";
const CTX: u64 = 300 * MIB; // the sim's default context reservation

fn ledger(m: &Machine) -> Ledger {
    Ledger::open(&m.ledger_file().expect("a ledger file")).expect("ledger opens")
}

/// (used, peak, quota) of container `id`, and its processes' (pid, used).
/// (used, peak, quota, [(pid, used)]).
type View = (u64, u64, u64, Vec<(u32, u64)>);

fn container(l: &Ledger, id: &str) -> Option<View> {
    let c = l.find_container(id)?;
    let s = &l.file().containers[c];
    let ld = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Acquire);
    let procs = l
        .processes_of(c)
        .map(|(_, p)| {
            (
                p.pid.load(std::sync::atomic::Ordering::Acquire) as u32,
                ld(&p.used),
            )
        })
        .collect();
    Some((ld(&s.used), ld(&s.peak), ld(&s.quota), procs))
}

fn vars<'a>(id: &'a str, gib: &'a str) -> [(&'a str, &'a str); 2] {
    [
        ("CGPU_CONTAINER_ID", id),
        ("ALIYUN_COM_GPU_MEM_CONTAINER", gib),
    ]
}

/// A client process, killed (and waited for) when dropped: when its test
/// ends, passed or failed, no client keeps running.
struct Kid(Option<std::process::Child>);

impl Kid {
    /// The child, no longer killed on drop (for [`wait_timeout`], which
    /// kills it when it does not end in time).
    fn into_inner(mut self) -> std::process::Child {
        self.0.take().expect("a child")
    }
}

impl std::ops::Deref for Kid {
    type Target = std::process::Child;
    fn deref(&self) -> &std::process::Child {
        self.0.as_ref().expect("a child")
    }
}

impl std::ops::DerefMut for Kid {
    fn deref_mut(&mut self) -> &mut std::process::Child {
        self.0.as_mut().expect("a child")
    }
}

impl Drop for Kid {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            if let Ok(None) = c.try_wait() {
                let _ = c.kill();
            }
            let _ = c.wait();
        }
    }
}

/// Spawn a client that reports `ready`; returns the child and its stdout reader.
fn spawn_ready(c: std::process::Command) -> (Kid, BufReader<std::process::ChildStdout>) {
    let (child, r, _) = spawn_ready_out(c);
    (child, r)
}

/// [`spawn_ready`], also returning what the client printed before `ready`.
fn spawn_ready_out(
    mut c: std::process::Command,
) -> (Kid, BufReader<std::process::ChildStdout>, String) {
    c.stdout(Stdio::piped()).stderr(Stdio::inherit());
    let mut child = Kid(Some(c.spawn().unwrap()));
    let mut r = BufReader::new(child.stdout.take().unwrap());
    let start = Instant::now();
    let mut out = String::new();
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap() == 0 {
            panic!("client exited before ready: {:?}\n{out}", child.wait());
        }
        if line.contains("\"ready\"") {
            break;
        }
        assert!(line.contains("\"op\""), "unexpected output: {line}");
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "not ready after 60 s"
        );
        out.push_str(&line);
    }
    (child, r, out)
}

#[test]
fn every_allocation_family_is_charged_and_given_back_exactly() {
    let m = Machine::new("families", T4);
    let v = vars("fam", "4");
    let out = run_ok(&mut m.client(
        Some(&v),
        &[
            "ctx", "info", "alloc", "1000", "pitch", "1000", "10", "managed", "5000", "async",
            "3000", "vmm", "1", "array", "100", "10", "info", "nvml", "freeall", "info",
        ],
    ));
    let infos: Vec<_> = lines(&out)
        .into_iter()
        .filter(|j| j["op"] == "info")
        .collect();
    let quota = 4 * GIB;
    assert_eq!(infos[0]["total"].as_u64().unwrap(), quota);
    assert_eq!(infos[0]["free"].as_u64().unwrap(), quota - CTX, "{out}");
    for fam in ["alloc", "pitch", "managed", "async", "vmm", "array"] {
        assert_eq!(op(&out, fam)["rc"], 0, "{fam}: {out}");
    }
    // 1000 -> 1024 (granule), pitch 1024 x 10, 5000 -> 5120, 3000 -> 3072,
    // one VMM granule, 100 x 10 floats 4000 -> 4096.
    let vmm = op(&out, "vmm")["bytes"].as_u64().unwrap();
    let charged = 1024 + 10240 + 5120 + 3072 + vmm + 4096;
    assert_eq!(
        infos[1]["free"].as_u64().unwrap(),
        quota - CTX - charged,
        "{out}"
    );
    // The sim's own per-process number agrees to the byte (NVML, unfiltered pid).
    let nvml = op(&out, "nvml");
    let sim_used = nvml["procs"][0][1].as_u64().unwrap();
    assert_eq!(sim_used, CTX + charged, "{out}");
    assert_eq!(nvml["v1"]["used"].as_u64().unwrap(), CTX + charged);
    assert!(
        op(&out, "freeall")["rcs"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r == 0),
        "{out}"
    );
    assert_eq!(
        infos[2]["free"].as_u64().unwrap(),
        quota - CTX,
        "everything given back: {out}"
    );
}

#[test]
fn over_quota_is_out_of_memory_and_leaks_nothing() {
    let m = Machine::new("oom", T4);
    let v = vars("oom", "1");
    let out = run_ok(&mut m.client(
        Some(&v),
        &[
            "ctx",
            "alloc",
            "734003200",
            "alloc",
            "104857600",
            "alloc",
            "1048576",
            "info",
            "freeall",
            "info",
        ],
    ));
    let allocs: Vec<_> = lines(&out)
        .into_iter()
        .filter(|j| j["op"] == "alloc")
        .collect();
    // 300 MiB context + 700 MiB fits 1 GiB; +100 MiB does not; 1 MiB still does.
    assert_eq!(allocs[0]["rc"], 0, "{out}");
    assert_eq!(allocs[1]["rc"], 2, "CUDA_ERROR_OUT_OF_MEMORY: {out}");
    assert_eq!(allocs[2]["rc"], 0, "{out}");
    let infos: Vec<_> = lines(&out)
        .into_iter()
        .filter(|j| j["op"] == "info")
        .collect();
    assert_eq!(infos[0]["free"].as_u64().unwrap(), GIB - CTX - 701 * MIB);
    assert_eq!(infos[1]["free"].as_u64().unwrap(), GIB - CTX);
}

/// A primary context the driver re-creates on a retain while this process
/// still holds references to it (a reset, then the driver's own release for
/// a green context dropped it) is refused when its reservation does not fit,
/// as a first retain is: the device never holds more than the books.
#[test]
fn a_re_created_primary_context_over_quota_is_refused() {
    let m = Machine::new("recreate", T4);
    let v = vars("recreate", "1");
    let fill = (GIB - CTX - 100 * MIB).to_string();
    let (mut kid, _r, out) = spawn_ready_out(m.client(
        Some(&v),
        &[
            "init",
            "green",
            "preset",
            "green",
            "pretain",
            "greendestroy",
            "0",
            "greendestroy",
            "1",
            "ctx",
            "alloc",
            &fill,
            "pretain",
            "hold",
        ],
    ));
    let r: Vec<_> = lines(&out)
        .into_iter()
        // (the context and the allocation that fill the quota succeed)
        .filter(|j| !(j["rc"] == 0 && (j["op"] == "alloc" || j["op"] == "ctx")))
        .map(|j| (j["op"].as_str().unwrap_or("").to_string(), j["rc"].clone()))
        .collect();
    let rcs: Vec<_> = r.iter().map(|(o, rc)| format!("{o}={rc}")).collect();
    // The first retain finds the context made (nothing new to charge); the
    // second finds it gone and re-creates it, with 100 MiB of quota left
    // for a 300 MiB reservation.
    assert_eq!(
        rcs,
        [
            "green=0",
            "preset=0",
            "green=0",
            "pretain=0",
            "greendestroy=0",
            "greendestroy=0",
            "pretain=2"
        ],
        "{out}"
    );
    let pid = kid.id();
    let device = m
        .sim_process_bytes()
        .into_iter()
        .find(|(p, _)| *p == pid)
        .map_or(0, |(_, b)| b);
    let (used, _, _, _) = container(&ledger(&m), "recreate").expect("the container's row");
    assert_eq!(device, CTX + GIB - CTX - 100 * MIB, "the driver's books");
    assert!(
        device <= used,
        "the device holds {device} bytes for the process, its container's books {used}"
    );
    let _ = kid.kill();
}

#[test]
fn two_containers_on_one_gpu_one_going_over_fails_alone() {
    // Seed: Pod 1 asks 5 GiB, Pod 2 10 GiB of a 15 GiB T4.
    let m = Machine::new("pods", T4);
    let p2v = vars("pod2", "10");
    let (mut pod2, _r) =
        spawn_ready(m.client(Some(&p2v), &["ctx", "alloc", "8589934592", "info", "hold"]));
    let p1v = vars("pod1", "5");
    let out = run_ok(&mut m.client(
        Some(&p1v),
        &[
            "ctx",
            "alloc",
            "4294967296",
            "alloc",
            "1073741824",
            "info",
            "freeall",
        ],
    ));
    let allocs: Vec<_> = lines(&out)
        .into_iter()
        .filter(|j| j["op"] == "alloc")
        .collect();
    assert_eq!(allocs[0]["rc"], 0, "{out}");
    assert_eq!(allocs[1]["rc"], 2, "pod 1 over its 5 GiB fails: {out}");
    assert_eq!(op(&out, "info")["total"].as_u64().unwrap(), 5 * GIB);
    // Pod 2 is unaffected: it still holds its 8 GiB and can take 1 more.
    let l = ledger(&m);
    let (used2, _, quota2, _) = container(&l, "pod2").unwrap();
    assert_eq!(quota2, 10 * GIB);
    assert_eq!(used2, CTX + 8 * GIB);
    let out = run_ok(&mut m.client(Some(&p2v), &["ctx", "alloc", "1073741824", "info"]));
    assert_eq!(op(&out, "alloc")["rc"], 0, "{out}");
    let _ = pod2.kill();
    let _ = pod2.wait();
}

#[test]
fn eight_processes_racing_never_pass_the_quota_and_agree_with_the_driver() {
    let m = Machine::new("race", "23028:NVIDIA A10");
    let v = vars("racers", "6");
    let quota = 6 * GIB;
    let mut kids = Vec::new();
    for seed in 0..8 {
        let s = seed.to_string();
        let hold = (1 + seed as u64 * 7) * MIB;
        let args = [
            "ctx",
            "race",
            &s,
            "150",
            "400000000",
            "alloc",
            &hold.to_string(),
            "hold",
        ];
        kids.push(spawn_ready(m.client(Some(&v), &args)));
    }
    // All eight are done racing and hold their context and one allocation.
    let l = ledger(&m);
    let (used, peak, q, procs) = container(&l, "racers").unwrap();
    assert_eq!(q, quota);
    assert!(peak <= quota, "peak {peak} passed the quota {quota}");
    assert_eq!(procs.len(), 8);
    let sim: HashMap<u32, u64> = m.sim_process_bytes().into_iter().collect();
    let mut sum = 0;
    for (pid, bytes) in &procs {
        assert_eq!(
            sim.get(pid),
            Some(bytes),
            "pid {pid}: ledger {bytes}, sim {:?}",
            sim.get(pid)
        );
        sum += bytes;
    }
    assert_eq!(sum, used, "container total is the sum of its processes");
    let expect: u64 = (0..8u64).map(|s| CTX + (1 + s * 7) * MIB).sum();
    assert_eq!(used, expect);
    // The race really pressed against the quota.
    assert!(
        peak > quota - 400_000_000,
        "peak {peak}: the racers never came near the quota"
    );
    for (mut k, _) in kids {
        let _ = k.kill();
        let _ = k.wait();
    }
}

#[test]
fn threads_of_one_process_share_the_quota_exactly() {
    let m = Machine::new("threads", T4);
    let v = vars("thr", "2");
    let out = run_ok(&mut m.client(
        Some(&v),
        &["ctx", "threads", "8", "200", "100000000", "info", "nvml"],
    ));
    let t = op(&out, "threads");
    assert!(t["ok"].as_u64().unwrap() > 100, "{out}");
    assert!(
        t["oom"].as_u64().unwrap() > 0,
        "8 threads x 100 MB must press on 2 GiB: {out}"
    );
    assert_eq!(
        op(&out, "info")["free"].as_u64().unwrap(),
        2 * GIB - CTX,
        "{out}"
    );
    assert_eq!(op(&out, "nvml")["procs"][0][1].as_u64().unwrap(), CTX);
}

#[test]
fn kill_9_at_random_points_gives_the_quota_back_within_a_second() {
    let m = Machine::new("kill", T4);
    let v = vars("victims", "3");
    let quota = 3 * GIB;
    let mut worst = Duration::ZERO;
    for i in 0..15u64 {
        // A survivor of the same container waits, then polls its free memory.
        let mut sc = m.client(
            Some(&v),
            &[
                "ctx",
                "ready",
                "waitline",
                "poll",
                &(quota - CTX).to_string(),
                "5",
            ],
        );
        sc.stdin(Stdio::piped());
        let (mut survivor, mut sr) = spawn_ready(sc);
        let (mut victim, _vr) = spawn_ready(m.client(Some(&v), &["ctx", "loop", "300000000"]));
        std::thread::sleep(Duration::from_millis(20 + (i * 37) % 200));
        victim.kill().unwrap();
        victim.wait().unwrap();
        let killed = Instant::now();
        survivor.stdin.take().unwrap().write_all(b"go\n").unwrap();
        let mut line = String::new();
        sr.read_line(&mut line).unwrap();
        let j: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|_| panic!("{line}"));
        assert_eq!(j["ok"], true, "round {i}: quota not whole again: {line}");
        let took = killed.elapsed();
        assert!(took < Duration::from_secs(5), "survivor hung");
        assert!(j["ms"].as_f64().unwrap() < 1000.0, "round {i}: {line}");
        worst = worst.max(Duration::from_secs_f64(j["ms"].as_f64().unwrap() / 1000.0));
        let st = wait_timeout(survivor.into_inner(), Duration::from_secs(30));
        assert!(st.status.success());
    }
    eprintln!("worst time to whole quota after kill -9: {worst:?}");
}

#[test]
fn fork_child_neither_keeps_the_parent_alive_nor_double_frees() {
    let m = Machine::new("fork", T4);
    let v = vars("forker", "4");
    // The parent holds 1 GiB, forks a child that sleeps 20 s (sharing its file
    // descriptions), then the parent is killed: its bytes must come back
    // although the child lives on.
    let (mut parent, _r) = spawn_ready(m.client(
        Some(&v),
        &[
            "ctx",
            "alloc",
            "1073741824",
            "forksleep",
            "20",
            "fork",
            "info",
            "hold",
        ],
    ));
    let l = ledger(&m);
    let (used, ..) = container(&l, "forker").unwrap();
    assert_eq!(
        used,
        CTX + GIB,
        "the forked children did not change the parent's charge"
    );
    parent.kill().unwrap();
    parent.wait().unwrap();
    let probe = |m: &Machine| {
        let out = run_ok(&mut m.client(Some(&v), &["ctx", "info"]));
        op(&out, "info")["free"].as_u64().unwrap()
    };
    let t = eventually(Duration::from_secs(3), || probe(&m) == 4 * GIB - CTX);
    assert!(
        t.is_some(),
        "the killed parent's bytes never came back while its child lived"
    );
}

#[test]
fn unset_environment_is_pure_pass_through() {
    let m = Machine::new("unset", T4);
    let args = [
        "ctx", "info", "alloc", "1000000", "info", "nvml", "freeall", "info",
    ];
    let bare = run_ok(&mut m.client(None, &args));
    let pre = run_ok(&mut m.client(Some(&[]), &args));
    let strip = |s: &str| {
        lines(s)
            .into_iter()
            .map(|mut j| {
                if let Some(p) = j.get_mut("procs") {
                    *p = serde_json::Value::Null;
                }
                j
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(
        strip(&bare),
        strip(&pre),
        "numbers differ under the preload with no variables"
    );
    assert_eq!(op(&pre, "info")["total"].as_u64().unwrap(), 15109 * MIB);
    assert!(
        m.ledger_file().is_none(),
        "pass-through must not create a ledger"
    );
}

/// A container that asked for isolation with a malformed value gets no
/// GPU (none visible, no memory at all) and one error naming the variable
/// and the value; never the whole GPU with isolation off.
#[test]
fn bad_values_log_one_clear_error_and_leave_no_gpu() {
    let m = Machine::new("bad", T4);
    for (k, val) in [
        ("ALIYUN_COM_GPU_MEM_CONTAINER", "six"),
        ("ALIYUN_COM_GPU_MEM_CONTAINER", "-1"),
        ("ALIYUN_COM_GPU_MEM_CONTAINER", "2.0"),
        ("ALIYUN_COM_GPU_MEM_CONTAINER", ""),
        ("ALIYUN_COM_GPU_MEM_DEV", "0"),
        ("CGPU_DISABLE", "maybe"),
        ("ALIYUN_COM_GPU_VISIBLE_DEVICES", "first"),
        ("ALIYUN_COM_GPU_SCHD_WEIGHT", "0"),
        ("ALIYUN_COM_GPU_SCHD_WEIGHT", "26"),
        ("ALIYUN_COM_GPU_HIGH_PRIO", "yes please"),
    ] {
        let mut vars = vec![
            ("ALIYUN_COM_GPU_MEM_CONTAINER", "2"),
            ("ALIYUN_COM_GPU_MEM_DEV", "15"),
        ];
        vars.retain(|(n, _)| *n != k);
        vars.push((k, val));
        let o = run(&mut m.client(Some(&vars), &["ctx", "info", "alloc", "4294967296"]));
        let out = String::from_utf8_lossy(&o.stdout);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            !lines(&out)
                .iter()
                .any(|j| j["op"] == "alloc" && j["rc"] == 0),
            "{k}={val}: nothing allocated: {out}\n{err}"
        );
        let held: u64 = m.sim_process_bytes().iter().map(|(_, b)| b).sum();
        assert_eq!(held, 0, "{k}={val}: the device holds nothing");
        let named: Vec<_> = err
            .lines()
            .filter(|l| l.contains(&format!("{k}='{val}'")))
            .collect();
        assert_eq!(
            named.len(),
            1,
            "{k}={val}: one error naming variable and value:\n{err}"
        );
        assert!(err.contains("no GPU is visible"), "{k}={val}: {err}");
    }
}

#[test]
fn visible_devices_hide_the_other_gpus_from_cuda_and_nvml() {
    let m = Machine::new("visible", "23028:NVIDIA A10,15109:Tesla T4");
    let bare = run_ok(&mut m.client(None, &["ctx", "1", "info", "nvml"]));
    assert_eq!(op(&bare, "info")["count"], 2);
    let v = [
        ("ALIYUN_COM_GPU_MEM_CONTAINER", "5"),
        ("ALIYUN_COM_GPU_MEM_DEV", "14"),
        ("ALIYUN_COM_GPU_VISIBLE_DEVICES", "1"),
    ];
    let out = run_ok(&mut m.client(Some(&v), &["ctx", "0", "info", "nvml"]));
    let info = op(&out, "info");
    assert_eq!(info["count"], 1, "{out}");
    // Container GPU 0 is host GPU 1 (the T4): 15109 MiB * 5 / 14.
    assert_eq!(
        info["total"].as_u64().unwrap(),
        15109 * MIB * 5 / 14,
        "{out}"
    );
    let nvml = op(&out, "nvml");
    assert_eq!(nvml["count"], 1);
    assert_eq!(nvml["v1"]["total"], info["total"]);
    // Asking for container GPU 1 fails as for a missing device.
    let o = run(&mut m.client(Some(&v), &["ctx", "1"]));
    assert!(!o.status.success());

    // The same by UUID; the hidden GPU's UUID is not found through NVML.
    let uuids: Vec<String> = op(&bare, "nvml")["uuids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u.as_str().unwrap().to_string())
        .collect();
    assert_eq!(uuids.len(), 2, "{bare}");
    let vu = [
        ("ALIYUN_COM_GPU_MEM_CONTAINER", "5"),
        ("ALIYUN_COM_GPU_MEM_DEV", "14"),
        ("ALIYUN_COM_GPU_VISIBLE_DEVICES", uuids[1].as_str()),
    ];
    let out = run_ok(&mut m.client(
        Some(&vu),
        &[
            "ctx", "0", "info", "nvml", "nvmluuid", &uuids[0], "nvmluuid", &uuids[1],
        ],
    ));
    assert_eq!(op(&out, "info")["count"], 1, "{out}");
    assert_eq!(
        op(&out, "info")["total"].as_u64().unwrap(),
        15109 * MIB * 5 / 14,
        "{out}"
    );
    assert_eq!(
        op(&out, "nvml")["uuids"][0].as_str().unwrap(),
        uuids[1],
        "{out}"
    );
    let rcs: Vec<_> = lines(&out)
        .into_iter()
        .filter(|j| j["op"] == "nvmluuid")
        .map(|j| j["rc"].clone())
        .collect();
    assert_eq!(rcs[0], 6, "hidden GPU: NVML_ERROR_NOT_FOUND: {out}");
    assert_eq!(rcs[1], 0, "{out}");

    // cuMemCreate with location id 0 (the container's GPU 0, as PyTorch
    // passes it) lands on host GPU 1 and is charged there; host GPU 0 stays empty.
    let (mut k, _r) = spawn_ready(m.client(
        Some(&vu),
        &["ctx", "0", "vmm", "1", "info", "ready", "hold"],
    ));
    let host0 = m.sim_process_bytes();
    assert!(
        host0.is_empty(),
        "nothing may land on the hidden GPU: {host0:?}"
    );
    let l = Ledger::open(&Ledger::path_for(&m.ledger, &uuids[1])).unwrap();
    let c = l.containers().next().unwrap().1;
    assert!(
        c.used.load(std::sync::atomic::Ordering::Acquire) > CTX,
        "the VMM allocation is charged on host GPU 1"
    );
    let _ = k.kill();
    let _ = k.wait();
}

#[test]
fn cgpu_disable_records_usage_without_enforcing() {
    let m = Machine::new("record", T4);
    let v = [
        ("CGPU_CONTAINER_ID", "rec"),
        ("ALIYUN_COM_GPU_MEM_CONTAINER", "1"),
        ("CGPU_DISABLE", "1"),
    ];
    let (mut k, _r) =
        spawn_ready(m.client(Some(&v), &["ctx", "alloc", "2147483648", "info", "hold"]));
    let l = ledger(&m);
    let (used, _, quota, _) = container(&l, "rec").unwrap();
    assert_eq!(quota, GIB);
    assert_eq!(
        used,
        CTX + 2 * GIB,
        "usage is recorded past the (unenforced) quota"
    );
    let _ = k.kill();
    let _ = k.wait();
}

#[test]
fn memsize_changed_in_the_ledger_takes_effect_in_a_running_job() {
    let m = Machine::new("memsize", T4);
    let v = vars("resize", "4");
    let mut c = m.client(
        Some(&v),
        &[
            "ctx",
            "info",
            "ready",
            "waitline",
            "info",
            "alloc",
            "2147483648",
        ],
    );
    c.stdin(Stdio::piped());
    let (mut k, mut r) = spawn_ready(c);
    let l = ledger(&m);
    let id = l.find_container("resize").unwrap();
    l.set_memsize(id, 2 * GIB).unwrap();
    k.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let mut rest = String::new();
    for _ in 0..2 {
        r.read_line(&mut rest).unwrap();
    }
    let info = op(&rest, "info");
    assert_eq!(info["total"].as_u64().unwrap(), 2 * GIB, "{rest}");
    assert_eq!(info["free"].as_u64().unwrap(), 2 * GIB - CTX, "{rest}");
    assert_eq!(
        op(&rest, "alloc")["rc"],
        2,
        "the new quota is enforced: {rest}"
    );
    let _ = wait_timeout(k.into_inner(), Duration::from_secs(30));
}

#[test]
fn default_memsize_applies_to_a_container_that_sets_no_quota() {
    let m = Machine::new("default", T4);
    // Some container made the GPU's ledger; the operator sets a default.
    run_ok(&mut m.client(Some(&vars("first", "4")), &["ctx", "info"]));
    let l = ledger(&m);
    l.set_default_memsize(2 * GIB).unwrap();
    let v = [("CGPU_CONTAINER_ID", "nodefault")];
    let out = run_ok(&mut m.client(
        Some(&v),
        &[
            "ctx",
            "info",
            "alloc",
            "1073741824",
            "alloc",
            "1073741824",
            "nvml",
        ],
    ));
    assert_eq!(
        op(&out, "info")["total"].as_u64().unwrap(),
        2 * GIB,
        "{out}"
    );
    let allocs: Vec<_> = lines(&out)
        .into_iter()
        .filter(|j| j["op"] == "alloc")
        .collect();
    assert_eq!(allocs[0]["rc"], 0);
    assert_eq!(
        allocs[1]["rc"], 2,
        "300 MiB + 2 x 1 GiB passes the 2 GiB default: {out}"
    );
    assert_eq!(op(&out, "nvml")["v1"]["total"].as_u64().unwrap(), 2 * GIB);
    // "0" is not "unset": explicitly pass-through.
    let v0 = [
        ("CGPU_CONTAINER_ID", "zero"),
        ("ALIYUN_COM_GPU_MEM_CONTAINER", "0"),
    ];
    let out = run_ok(&mut m.client(Some(&v0), &["ctx", "info"]));
    assert_eq!(
        op(&out, "info")["total"].as_u64().unwrap(),
        15109 * MIB,
        "{out}"
    );
}

/// A ledger directory that cannot be used: allocations (the context's
/// reservation first) are refused with one error naming the cause and the
/// fix; never granted on the process's word alone.
#[test]
fn unusable_ledger_directory_refuses_and_says_so() {
    let m = Machine::new("noledger", T4);
    let v = [
        ("CGPU_CONTAINER_ID", "alone"),
        ("ALIYUN_COM_GPU_MEM_CONTAINER", "1"),
        ("CGPU_LEDGER_DIR", "/proc/self/no-such-dir"),
    ];
    let o = run(&mut m.client(Some(&v), &["ctx", "info", "alloc", "1048576"]));
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("refused") && err.contains("/proc/self/no-such-dir") && err.contains("fix:"),
        "{err}"
    );
    assert!(
        !lines(&out)
            .iter()
            .any(|j| j["op"] == "alloc" && j["rc"] == 0),
        "{out}\n{err}"
    );
    let held: u64 = m.sim_process_bytes().iter().map(|(_, b)| b).sum();
    assert_eq!(held, 0, "the device holds nothing: {out}");
}

#[test]
fn missing_real_driver_is_a_clear_error_not_a_crash() {
    let m = Machine::new("nodriver", T4);
    let exe = cgpu_testkit::cuclient(cgpu_testkit::LinkMode::Link);
    let v = [
        ("ALIYUN_COM_GPU_MEM_CONTAINER", "2"),
        ("CGPU_REAL_LIBCUDA", "/nonexistent/libcuda.so.1"),
    ];
    let o = run(m.preloaded(&exe, &v).args(["init", "meminfo"]));
    let err = String::from_utf8_lossy(&o.stderr);
    let out = String::from_utf8_lossy(&o.stdout);
    // Our exported cuInit answers CUDA_ERROR_NOT_INITIALIZED (3): the client
    // reports the failed init and carries on to a clean exit (no signal, no hang).
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(out.lines().any(|l| l.starts_with("init err=3")), "{out}");
    assert!(
        err.contains("cannot load the real driver") && err.contains("CGPU_REAL_LIBCUDA"),
        "{err}"
    );
}

#[test]
fn nvml_process_lists_show_only_the_containers_processes() {
    let m = Machine::new("procs", T4);
    let (mut b, _rb) = spawn_ready(m.client(Some(&vars("B", "3")), &["ctx", "ready", "hold"]));
    let (mut a1, _ra) = spawn_ready(m.client(Some(&vars("A", "3")), &["ctx", "ready", "hold"]));
    let all = m.sim_process_bytes();
    assert_eq!(all.len(), 2, "bare NVML sees both: {all:?}");
    let out = run_ok(&mut m.client(Some(&vars("A", "3")), &["ctx", "nvml"]));
    let procs: Vec<u64> = op(&out, "nvml")["procs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p[0].as_u64().unwrap())
        .collect();
    assert_eq!(
        procs.len(),
        2,
        "A's two processes (the holder and this one): {out}"
    );
    assert!(procs.contains(&(a1.id() as u64)), "{out}");
    assert!(
        !procs.contains(&(b.id() as u64)),
        "container B's process must be hidden: {out}"
    );
    for k in [&mut a1, &mut b] {
        let _ = k.kill();
        let _ = k.wait();
    }
}

#[test]
fn destroying_a_context_gives_back_what_was_allocated_in_it() {
    let m = Machine::new("ctxfree", T4);
    let v = vars("ctxfree", "2");
    let out = run_ok(&mut m.client(
        Some(&v),
        &[
            "ctx",
            "alloc",
            "536870912",
            "managed",
            "1048576",
            "destroy",
            "ctx",
            "info",
            "destroy",
            "pctx",
            "alloc",
            "536870912",
            "prelease",
            "pctx",
            "info",
            "nvml",
        ],
    ));
    let infos: Vec<_> = lines(&out)
        .into_iter()
        .filter(|j| j["op"] == "info")
        .collect();
    assert_eq!(op(&out, "destroy")["rc"], 0, "{out}");
    assert_eq!(op(&out, "prelease")["rc"], 0, "{out}");
    // After each destroy only the one live context is held.
    assert_eq!(infos[0]["free"].as_u64().unwrap(), 2 * GIB - CTX, "{out}");
    assert_eq!(infos[1]["free"].as_u64().unwrap(), 2 * GIB - CTX, "{out}");
    // And the driver agrees.
    assert_eq!(
        op(&out, "nvml")["procs"][0][1].as_u64().unwrap(),
        CTX,
        "{out}"
    );
    assert_eq!(
        op(&out, "nvml")["v1"]["used"].as_u64().unwrap(),
        CTX,
        "{out}"
    );
}

#[test]
fn a_zero_in_the_list_leaves_that_gpu_unlimited_but_recorded() {
    let m = Machine::new("list", "23028:NVIDIA A10,23028:NVIDIA A10");
    let v = vars("listed", "1,0");
    let out0 = run_ok(&mut m.client(Some(&v), &["ctx", "0", "info"]));
    assert_eq!(op(&out0, "info")["total"].as_u64().unwrap(), GIB, "{out0}");
    let (mut k, _r) = spawn_ready(m.client(
        Some(&v),
        &["ctx", "1", "alloc", "2147483648", "info", "ready", "hold"],
    ));
    let l = cgpu::ledger::Ledger::list(&m.ledger)
        .into_iter()
        .map(|p| Ledger::open(&p).unwrap())
        .find(|l| {
            l.find_container("listed").is_some_and(|c| {
                l.file().containers[c]
                    .used
                    .load(std::sync::atomic::Ordering::Acquire)
                    > 0
            })
        })
        .expect("GPU 1's ledger records the container");
    let (used, _, quota, _) = container(&l, "listed").unwrap();
    assert_eq!(quota, 0, "not limited");
    assert_eq!(used, CTX + 2 * GIB);
    let _ = k.kill();
    let _ = k.wait();
    let out1 = run_ok(&mut m.client(Some(&v), &["ctx", "1", "info"]));
    assert_eq!(
        op(&out1, "info")["total"].as_u64().unwrap(),
        23028 * MIB,
        "{out1}"
    );
}

/// The legacy `cuArrayCreate` (reached through `cuGetProcAddress` at version
/// 2000) takes the `_v1` descriptor, 32-bit sizes: read with the `_v2` layout
/// its width would be garbage and the call refused. It must give the
/// driver's own answer, as without cgpu, and leave nothing charged.
#[test]
fn legacy_array_create_reads_the_v1_descriptor() {
    let m = Machine::new("arrayv1", T4);
    let v = vars("legacy", "4");
    let client = cgpu_testkit::cuclient(cgpu_testkit::LinkMode::ProcAddr);
    let args = ["array_v1", "1024", "1024", "meminfo"];
    let bare = run_ok(m.bare(&client).args(args));
    let pre = run_ok(m.preloaded(&client, &v).args(args));
    let line = |s: &str| cgpu_testkit::line(s, "array_v1").to_string();
    assert_eq!(line(&pre), line(&bare), "bare: {bare}\npreloaded: {pre}");
    assert!(!line(&pre).contains("err=2"), "{pre}");
    assert_eq!(
        cgpu_testkit::num(&pre, "meminfo", "free"),
        4 * GIB - CTX,
        "only the context is charged: {pre}"
    );
}

/// All `op` lines of `out` whose op is `name`.
fn ops(out: &str, name: &str) -> Vec<serde_json::Value> {
    lines(out).into_iter().filter(|j| j["op"] == name).collect()
}

/// The driver keeps a `cuMemCreate` allocation until its handle is released
/// AND its last mapping is gone (releasing right after mapping is the
/// pattern of NVIDIA's samples): the charge must last as long.
#[test]
fn vmm_released_while_mapped_stays_charged_until_unmapped() {
    let m = Machine::new("vmmmapped", T4);
    let v = vars("vmm", "1");
    let mib600 = (600 * MIB).to_string();
    let out = run_ok(&mut m.client(
        Some(&v),
        &[
            "ctx",
            "vmmmap",
            &mib600,
            "vmmrelease",
            "info",
            "nvml",
            "vmmmap",
            &mib600,
            "vmmunmap",
            "info",
            "nvml",
            "vmmmap",
            &mib600,
            "info",
        ],
    ));
    let maps = ops(&out, "vmmmap");
    let infos = ops(&out, "info");
    let nvmls = ops(&out, "nvml");
    assert_eq!(maps[0]["rc"], 0, "{out}");
    assert_eq!(op(&out, "vmmrelease")["rc"], 0, "{out}");
    // Released but mapped: the driver still holds it, and so does the quota.
    assert_eq!(nvmls[0]["procs"][0][1].as_u64().unwrap(), CTX + 600 * MIB);
    assert_eq!(
        infos[0]["free"].as_u64().unwrap(),
        GIB - CTX - 600 * MIB,
        "{out}"
    );
    assert_eq!(maps[1]["rc"], 2, "a second 600 MiB passes 1 GiB: {out}");
    // The last mapping gone: given back, once.
    assert_eq!(op(&out, "vmmunmap")["rc"], 0, "{out}");
    assert_eq!(nvmls[1]["procs"][0][1].as_u64().unwrap(), CTX);
    assert_eq!(infos[1]["free"].as_u64().unwrap(), GIB - CTX, "{out}");
    assert_eq!(maps[2]["rc"], 0, "{out}");
    assert_eq!(
        infos[2]["free"].as_u64().unwrap(),
        GIB - CTX - 600 * MIB,
        "{out}"
    );
}

/// `cuMemRetainAllocationHandle` is one more reference: the memory (and its
/// charge) stays until that one is released too.
#[test]
fn vmm_retained_handle_keeps_the_charge_until_released() {
    let m = Machine::new("vmmretain", T4);
    let v = vars("retain", "2");
    let mib600 = (600 * MIB).to_string();
    let out = run_ok(&mut m.client(
        Some(&v),
        &[
            "ctx",
            "vmmmap",
            &mib600,
            "vmmretain",
            "vmmrelease",
            "vmmunmap",
            "info",
            "nvml",
            "vmmrelretained",
            "info",
            "nvml",
        ],
    ));
    assert_eq!(op(&out, "vmmretain")["rc"], 0, "{out}");
    assert_eq!(op(&out, "vmmretain")["same"], true, "{out}");
    assert_eq!(op(&out, "vmmrelease")["rc"], 0, "{out}");
    assert_eq!(op(&out, "vmmunmap")["rc"], 0, "{out}");
    assert_eq!(op(&out, "vmmrelretained")["rc"], 0, "{out}");
    let infos = ops(&out, "info");
    let nvmls = ops(&out, "nvml");
    assert_eq!(nvmls[0]["procs"][0][1].as_u64().unwrap(), CTX + 600 * MIB);
    assert_eq!(
        infos[0]["free"].as_u64().unwrap(),
        2 * GIB - CTX - 600 * MIB,
        "{out}"
    );
    assert_eq!(nvmls[1]["procs"][0][1].as_u64().unwrap(), CTX);
    assert_eq!(infos[1]["free"].as_u64().unwrap(), 2 * GIB - CTX, "{out}");
}

/// `cuMemCreate` memory is the device's: destroying the context current
/// when it was made frees nothing, so its charge stays.
#[test]
fn vmm_memory_outlives_its_context_and_stays_charged() {
    let m = Machine::new("vmmctx", T4);
    let v = vars("outlive", "1");
    let mib600 = (600 * MIB).to_string();
    let out = run_ok(&mut m.client(
        Some(&v),
        &[
            "ctx",
            "vmmmap",
            &mib600,
            "destroy",
            "ctx",
            "info",
            "nvml",
            "alloc",
            &mib600,
            "vmmrelease",
            "vmmunmap",
            "info",
            "nvml",
        ],
    ));
    assert_eq!(op(&out, "destroy")["rc"], 0, "{out}");
    let infos = ops(&out, "info");
    let nvmls = ops(&out, "nvml");
    assert_eq!(
        nvmls[0]["procs"][0][1].as_u64().unwrap(),
        CTX + 600 * MIB,
        "{out}"
    );
    assert_eq!(
        infos[0]["free"].as_u64().unwrap(),
        GIB - CTX - 600 * MIB,
        "{out}"
    );
    assert_eq!(
        op(&out, "alloc")["rc"],
        2,
        "the quota still holds the 600 MiB: {out}"
    );
    assert_eq!(nvmls[1]["procs"][0][1].as_u64().unwrap(), CTX, "{out}");
    assert_eq!(infos[1]["free"].as_u64().unwrap(), GIB - CTX, "{out}");
}

/// A stream-ordered allocation from a pool lands on the pool's device (a
/// pool made with `cuMemPoolCreate` or a device's default pool), not the
/// current context's nor the stream's; destroying the pool frees what is
/// still out in it.
#[test]
fn pool_allocations_are_charged_to_the_pools_device_and_freed_with_it() {
    let m = Machine::new("pooldev", "23028:NVIDIA A10,23028:NVIDIA A10");
    let v = vars("pools", "2");
    let mib100 = (100 * MIB).to_string();
    let mut c = m.client(
        Some(&v),
        &[
            "ctx",
            "0",
            "ctx",
            "1",
            "stream",
            "pool",
            "1",
            "setctx",
            "0",
            "poolalloc",
            &mib100,
            "ready",
            "waitline",
            "pooldestroy",
            "setctx",
            "1",
            "defpool",
            "0",
            "poolalloc",
            &mib100,
            "ready",
            "hold",
        ],
    );
    c.stdin(Stdio::piped());
    let (mut k, mut r) = spawn_ready(c);
    let gpu_ledger = |dev: usize| {
        let st = cgpu_testkit::sim_stats(&m.state);
        let uuid = st.devices[dev].uuid.clone();
        Ledger::open(&Ledger::path_for(&m.ledger, &uuid)).expect("ledger of the GPU")
    };
    let used = |dev: usize| container(&gpu_ledger(dev), "pools").unwrap().0;
    let pid = k.id();
    let sim = |dev: usize| {
        let st = cgpu_testkit::sim_stats(&m.state);
        st.process(pid, dev).map(|p| p.mem_bytes).unwrap_or(0)
    };
    assert_eq!(sim(1), CTX + 100 * MIB, "the sim put it on GPU 1");
    assert_eq!(used(1), CTX + 100 * MIB, "charged on the pool's GPU");
    assert_eq!(used(0), CTX, "nothing charged on the current context's GPU");
    k.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let mut rest = String::new();
    while !rest.contains("\"ready\"") {
        assert!(r.read_line(&mut rest).unwrap() > 0, "client ended: {rest}");
    }
    assert_eq!(op(&rest, "pooldestroy")["rc"], 0, "{rest}");
    assert_eq!(sim(1), CTX, "the sim freed the pool's allocation");
    assert_eq!(used(1), CTX, "and the quota got it back");
    // GPU 0's default pool used from a stream of GPU 1: GPU 0's memory.
    assert_eq!(op(&rest, "poolalloc")["rc"], 0, "{rest}");
    assert_eq!(sim(0), CTX + 100 * MIB, "the sim put it on GPU 0");
    assert_eq!(used(0), CTX + 100 * MIB, "charged on the pool's GPU");
    assert_eq!(used(1), CTX, "not on the stream's");
    let _ = k.kill();
    let _ = k.wait();
}

/// Asking about a GPU (its total memory through CUDA, its memory info and
/// processes through NVML) answers with the container's view but does not
/// join it: no process slot, no container slot, no weight taken (frameworks
/// and monitors ask every GPU at start).
#[test]
fn asking_about_a_gpu_does_not_join_it() {
    let m = Machine::new("nojoin", T4);
    let (mut holder, _r) = spawn_ready(m.client(
        Some(&vars("A", "4")),
        &["ctx", "alloc", "1073741824", "ready", "hold"],
    ));
    let l = ledger(&m);
    let free_weight = || cgpu::ledger::free_weight(l.file());
    let fw0 = free_weight();
    let ask = ["init", "info", "nvml", "ready", "hold"];
    // A process of the same container, and one of a container not on the GPU.
    let (mut same, _rs, so) = spawn_ready_out(m.client(Some(&vars("A", "4")), &ask));
    let (mut other, _ro, oo) = spawn_ready_out(m.client(Some(&vars("B", "3")), &ask));
    // The answers are the containers' views all the same.
    assert_eq!(
        op(&so, "info")["devtotal"].as_u64().unwrap(),
        4 * GIB,
        "{so}"
    );
    assert_eq!(
        op(&so, "nvml")["v1"]["total"].as_u64().unwrap(),
        4 * GIB,
        "{so}"
    );
    assert_eq!(
        op(&so, "nvml")["v1"]["used"].as_u64().unwrap(),
        CTX + GIB,
        "the container's use, from the ledger: {so}"
    );
    assert_eq!(
        op(&so, "nvml")["v2"]["free"].as_u64().unwrap(),
        3 * GIB - CTX,
        "{so}"
    );
    let pids: Vec<u64> = op(&so, "nvml")["procs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p[0].as_u64().unwrap())
        .collect();
    assert_eq!(pids, vec![holder.id() as u64], "{so}");
    assert_eq!(
        op(&oo, "info")["devtotal"].as_u64().unwrap(),
        3 * GIB,
        "{oo}"
    );
    assert_eq!(
        op(&oo, "nvml")["v1"]["total"].as_u64().unwrap(),
        3 * GIB,
        "{oo}"
    );
    assert_eq!(op(&oo, "nvml")["v1"]["used"].as_u64().unwrap(), 0, "{oo}");
    assert_eq!(op(&oo, "nvml")["procs"], serde_json::json!([]), "{oo}");
    let (_, _, _, procs) = container(&l, "A").unwrap();
    assert_eq!(
        procs.len(),
        1,
        "only the holder is in the ledger: {procs:?}"
    );
    assert!(l.find_container("B").is_none(), "asking made B a container");
    assert_eq!(free_weight(), fw0, "asking took a weight");
    for k in [&mut holder, &mut same, &mut other] {
        let _ = k.kill();
        let _ = k.wait();
    }
}

/// The library's own use of NVML (measuring contexts) is invisible to the
/// application: NVML is not found initialised by a program that never
/// initialised it, an unbalanced `nvmlShutdown` fails as without cgpu, and
/// contexts made afterwards are still measured and charged.
#[test]
fn the_librarys_nvml_use_is_invisible_to_the_application() {
    let m = Machine::new("nvmlref", T4);
    let args = ["ctx", "nvmlraw", "nvmlraw", "ctx", "info"];
    let bare = run_ok(&mut m.client(None, &args));
    let pre = run_ok(&mut m.client(Some(&vars("nvml", "4")), &args));
    let raws = |s: &str| ops(s, "nvmlraw");
    assert_eq!(raws(&pre), raws(&bare), "bare: {bare}\npreloaded: {pre}");
    // NVML_ERROR_UNINITIALIZED, as without cgpu.
    assert_eq!(raws(&bare)[0]["count_rc"], 1, "{bare}");
    assert_eq!(raws(&bare)[0]["shutdown_rc"], 1, "{bare}");
    // The second context is measured and charged like the first.
    assert_eq!(
        op(&pre, "info")["free"].as_u64().unwrap(),
        4 * GIB - 2 * CTX,
        "{pre}"
    );
}

/// `cmd` run inside a new PID namespace (`unshare -Urp --fork`, a user
/// namespace so no privilege is needed; `/proc` stays the host's, so the
/// simulated driver lists the process by its host pid as NVML does).
fn in_pid_namespace(cmd: &std::process::Command) -> std::process::Command {
    let mut c = std::process::Command::new("unshare");
    c.args(["-Urp", "--fork", "--kill-child"])
        .arg(cmd.get_program())
        .args(cmd.get_args())
        .stdin(Stdio::null());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    c
}

/// Inside a PID namespace NVML does not list the process under its own
/// pid. What each context reserves must still be measured exactly, whatever
/// other containers allocate and free meanwhile (before: the device's used
/// memory before and after, so their activity was charged to the context).
#[test]
fn contexts_in_a_pid_namespace_are_measured_without_other_containers_noise() {
    let m = Machine::new("pidns", "81920:NVIDIA A100");
    let probe = std::process::Command::new("unshare")
        .args(["-Urp", "--fork", "true"])
        .status();
    assert!(
        probe.is_ok_and(|s| s.success()),
        "this test needs `unshare -Urp` (util-linux, user namespaces enabled)"
    );
    // Other containers allocate and free up to 300 MB at random, all along.
    let noisy = Reap(
        (0..3)
            .map(|i| {
                let id = format!("noisy{i}");
                spawn_ready(m.client(Some(&vars(&id, "8")), &["ctx", "loop", "300000000"])).0
            })
            .collect(),
    );
    let n = 60;
    let mut args = vec!["ctx"; n];
    args.extend(["info", "ready", "hold"]);
    let (ns, _r, out) = spawn_ready_out(in_pid_namespace(
        &m.client(Some(&vars("inns", "20")), &args),
    ));
    let _ns = Reap(vec![ns]);
    let l = ledger(&m);
    let (used, ..) = container(&l, "inns").unwrap();
    assert_eq!(used, n as u64 * CTX, "{n} contexts of 300 MiB each: {out}");
    assert_eq!(
        op(&out, "info")["free"].as_u64().unwrap(),
        20 * GIB - n as u64 * CTX,
        "{out}"
    );
    drop(noisy);
}

/// Children killed when dropped (also when a test fails).
struct Reap(Vec<Kid>);

impl Drop for Reap {
    fn drop(&mut self) {
        for k in &mut self.0 {
            let _ = k.kill();
            let _ = k.wait();
        }
    }
}

/// `cuCtxSetLimit` reserves device memory (the malloc heap and the printf
/// FIFO their size, the stack its size for every resident thread): it is
/// charged to the context, a raise past the quota is refused with
/// `CUDA_ERROR_OUT_OF_MEMORY` (the limit keeps its value), a lower value
/// gives the difference back, and destroying the context (or the primary
/// context's last release) gives it all back. The sim's per-process bytes
/// (NVML) are the ground truth.
#[test]
fn context_limits_are_charged_to_the_context() {
    const STACK: &str = "0";
    const FIFO: &str = "1";
    const HEAP: &str = "2";
    let m = Machine::new("limits", T4);
    let v = vars("limits", "1");
    let s = |b: u64| b.to_string();
    let (heap200, fifo9, heap800, heap8) = (s(200 * MIB), s(9 * MIB), s(800 * MIB), s(8 * MIB));
    let out = run_ok(&mut m.client(
        Some(&v),
        &[
            "ctx", "resident", "info", "setlimit", HEAP, &heap200, "info", "nvml", "setlimit",
            FIFO, &fifo9, "info", "setlimit", STACK, "4096", "info", "nvml", "setlimit", HEAP,
            &heap800, "getlimit", HEAP, "info", "nvml", "setlimit", HEAP, &heap8, "info", "nvml",
            "destroy", "ctx", "info", "nvml",
        ],
    ));
    let threads = op(&out, "resident")["threads"].as_u64().unwrap();
    assert!(threads > 0, "{out}");
    let stack = (4096 - 1024) * threads;
    let sets = ops(&out, "setlimit");
    let infos = ops(&out, "info");
    let nvmls = ops(&out, "nvml");
    let free = |i: usize| infos[i]["free"].as_u64().unwrap();
    let sim = |i: usize| nvmls[i]["procs"][0][1].as_u64().unwrap();
    assert_eq!(free(0), GIB - CTX, "{out}");
    // The heap beyond its default (8 MiB, inside the context's reservation).
    assert_eq!(sets[0]["rc"], 0, "{out}");
    assert_eq!(free(1), GIB - CTX - 192 * MIB, "{out}");
    assert_eq!(sim(0), CTX + 192 * MIB, "{out}");
    // The FIFO beyond its default (1 MiB), then the stack.
    assert_eq!(
        (&sets[1]["rc"], &sets[2]["rc"]),
        (&0.into(), &0.into()),
        "{out}"
    );
    assert_eq!(free(2), GIB - CTX - 200 * MIB, "{out}");
    assert_eq!(free(3), GIB - CTX - 200 * MIB - stack, "{out}");
    assert_eq!(sim(1), CTX + 200 * MIB + stack, "{out}");
    // 600 MiB more of heap does not fit what is left: refused, nothing
    // reserved, the heap as it was.
    assert!(free(3) < 600 * MIB, "{out}");
    assert_eq!(sets[3]["rc"], 2, "a raise past the quota: {out}");
    assert_eq!(
        op(&out, "getlimit")["value"].as_u64(),
        Some(200 * MIB),
        "{out}"
    );
    assert_eq!(free(4), free(3), "{out}");
    assert_eq!(sim(2), sim(1), "{out}");
    // Lowered back to the default: the 192 MiB come back.
    assert_eq!(sets[4]["rc"], 0, "{out}");
    assert_eq!(free(5), GIB - CTX - 8 * MIB - stack, "{out}");
    assert_eq!(sim(3), CTX + 8 * MIB + stack, "{out}");
    // A destroyed context gives back what its limits held.
    assert_eq!(op(&out, "destroy")["rc"], 0, "{out}");
    assert_eq!(free(6), GIB - CTX, "{out}");
    assert_eq!(sim(4), CTX, "{out}");

    // The primary context: its last release gives its limits back.
    let heap300 = s(300 * MIB);
    let out = run_ok(&mut m.client(
        Some(&vars("limits-primary", "1")),
        &[
            "pctx", "setlimit", HEAP, &heap300, "info", "prelease", "pctx", "info", "nvml",
        ],
    ));
    let infos = ops(&out, "info");
    assert_eq!(op(&out, "setlimit")["rc"], 0, "{out}");
    assert_eq!(
        infos[0]["free"].as_u64(),
        Some(GIB - CTX - 292 * MIB),
        "{out}"
    );
    assert_eq!(op(&out, "prelease")["rc"], 0, "{out}");
    assert_eq!(infos[1]["free"].as_u64(), Some(GIB - CTX), "{out}");
    assert_eq!(op(&out, "nvml")["procs"][0][1].as_u64(), Some(CTX), "{out}");
}

/// Lets a client blocked in `waitline` go on, and returns what it prints
/// up to its next `ready` (or its end).
fn go_on(
    stdin: &mut std::process::ChildStdin,
    r: &mut BufReader<std::process::ChildStdout>,
) -> String {
    stdin.write_all(b"go\n").unwrap();
    let mut out = String::new();
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap() == 0 || line.contains("\"ready\"") {
            return out;
        }
        out.push_str(&line);
    }
}

/// A client that stops at each `waitline` until [`Stepped::go_on`].
struct Stepped {
    child: Kid,
    stdin: std::process::ChildStdin,
    r: BufReader<std::process::ChildStdout>,
}

impl Stepped {
    /// Starts `c` with a stdin to drive it; also returns what it printed
    /// before its first `ready`.
    fn spawn(mut c: std::process::Command) -> (Self, String) {
        c.stdin(Stdio::piped());
        let (mut child, r, out) = spawn_ready_out(c);
        let stdin = child.stdin.take().unwrap();
        (Self { child, stdin, r }, out)
    }

    /// [`go_on`].
    fn go_on(&mut self) -> String {
        go_on(&mut self.stdin, &mut self.r)
    }

    /// Closes its stdin (its last `waitline` returns) and checks that it
    /// exits cleanly.
    fn finish(self) {
        drop(self.stdin);
        assert!(
            wait_timeout(self.child.into_inner(), Duration::from_secs(30))
                .status
                .success()
        );
    }
}

/// A client of container `id` (2 GiB) that maps 800 MiB of VMM memory and
/// exports it as a POSIX descriptor, then waits; let go on, it releases its
/// handle, unmaps, reports `info` and waits again. Also returns the
/// exporter's pid and descriptor number.
fn spawn_vmm_exporter(m: &Machine, id: &str) -> (Stepped, String, String) {
    let mib800 = (800 * MIB).to_string();
    let (exporter, before) = Stepped::spawn(m.client(
        Some(&vars(id, "2")),
        &[
            "ctx",
            "vmmmap",
            &mib800,
            "vmmexport",
            "ready",
            "waitline",
            "vmmrelease",
            "vmmunmap",
            "info",
            "ready",
            "waitline",
        ],
    ));
    let x = op(&before, "vmmexport");
    assert_eq!(x["rc"], 0, "{before}");
    (exporter, x["pid"].to_string(), x["fd"].to_string())
}

/// A client of container `id` (`gib` GiB) that imports the 800 MiB the
/// exporter `pid` shares as descriptor `fd` (from [`spawn_vmm_exporter`]),
/// maps it, reports `info` and waits, then goes on with `then`; asserts that
/// the import and the mapping succeeded.
fn spawn_vmm_importer(
    m: &Machine,
    (id, gib): (&str, &str),
    (pid, fd): (&str, &str),
    then: &[&str],
) -> (Stepped, String) {
    let mib800 = (800 * MIB).to_string();
    let mut args = vec![
        "ctx",
        "vmmimportfd",
        pid,
        fd,
        &mib800,
        "info",
        "ready",
        "waitline",
    ];
    args.extend_from_slice(then);
    let (importer, out) = Stepped::spawn(m.client(Some(&vars(id, gib)), &args));
    assert_vmm_import(&out, 0);
    (importer, out)
}

/// Asserts that the client's `vmmimport` imported (`rc` 0) and that its
/// mapping returned `rc_map`.
fn assert_vmm_import(out: &str, rc_map: u32) {
    let imp = op(out, "vmmimport");
    assert_eq!(
        (&imp["rc"], &imp["rc_map"]),
        (&0.into(), &rc_map.into()),
        "{out}"
    );
}

/// Memory one container exports (`cuMemExportToShareableHandle`, a POSIX
/// descriptor) and another imports is held once on the device, but the
/// driver keeps it while any exported descriptor or imported handle exists,
/// in any process. The exporter stays charged until it exits (releasing
/// and unmapping its own handle does not free memory a descriptor keeps),
/// and the importer is charged what it maps, so that neither can keep
/// memory alive unseen. Past the importer's quota the mapping is refused;
/// the exporter's exit leaves the importer's charge; the importer's own
/// release gives it back. An importer of the exporter's own container
/// (the descriptor itself passed on, as PyTorch and NCCL do) is not charged
/// again: the container holds it once.
#[test]
fn shared_vmm_memory_is_charged_while_the_driver_may_hold_it() {
    let m = Machine::new("vmmshare", T4);
    let mib800 = (800 * MIB).to_string();
    let (mut exporter, pid, fd) = spawn_vmm_exporter(&m, "exporter");
    let path = format!("/proc/{pid}/fd/{fd}");
    let used = |id: &str| container(&ledger(&m), id).map(|c| c.0);

    // The exporter's own container, 2 GiB: its context, the exporter's and
    // the 800 MiB once (twice would not fit: the mapping would be refused).
    let out = run_ok(&mut m.client(
        Some(&vars("exporter", "2")),
        &["ctx", "vmmimportfd", &pid, &fd, &mib800, "info"],
    ));
    assert_vmm_import(&out, 0);
    assert_eq!(
        op(&out, "info")["free"].as_u64(),
        Some(2 * GIB - 2 * CTX - 800 * MIB),
        "{out}"
    );
    assert_eq!(
        used("exporter"),
        Some(CTX + 800 * MIB),
        "the importer exited"
    );

    // 1 GiB less the context cannot hold 800 MiB: the mapping is refused.
    let out = run_ok(&mut m.client(
        Some(&vars("importer-small", "1")),
        &["ctx", "vmmimport", &path, &mib800, "info"],
    ));
    assert_vmm_import(&out, 2);
    assert_eq!(op(&out, "info")["free"].as_u64(), Some(GIB - CTX), "{out}");

    // Another container, 2 GiB, with the descriptor itself: charged to the
    // importer as well as to the exporter.
    let (mut importer, out) = spawn_vmm_importer(
        &m,
        ("importer", "2"),
        (&pid, &fd),
        &["vmmrelease", "vmmunmap", "info", "ready", "waitline"],
    );
    assert_eq!(
        op(&out, "info")["free"].as_u64(),
        Some(2 * GIB - CTX - 800 * MIB),
        "{out}"
    );
    assert_eq!(used("importer"), Some(CTX + 800 * MIB));
    assert_eq!(used("exporter"), Some(CTX + 800 * MIB));

    // The exporter lets go of its handle and mapping: the memory lives on
    // (the descriptor, the importer), and it stays charged.
    let out = exporter.go_on();
    assert_eq!(op(&out, "vmmunmap")["rc"], 0, "{out}");
    assert_eq!(
        op(&out, "info")["free"].as_u64(),
        Some(2 * GIB - CTX - 800 * MIB),
        "{out}"
    );
    assert_eq!(used("exporter"), Some(CTX + 800 * MIB));
    // The exporter exits: the importer still holds it, and pays for it.
    exporter.finish();
    assert_eq!(used("exporter").unwrap_or(0), 0);
    assert_eq!(used("importer"), Some(CTX + 800 * MIB));

    // The importer lets go: given back, once.
    let out = importer.go_on();
    assert_eq!(op(&out, "vmmrelease")["rc"], 0, "{out}");
    assert_eq!(op(&out, "vmmunmap")["rc"], 0, "{out}");
    assert_eq!(
        op(&out, "info")["free"].as_u64(),
        Some(2 * GIB - CTX),
        "{out}"
    );
    assert_eq!(used("importer"), Some(CTX));
    importer.finish();
}

/// Legacy IPC (`cuIpcGetMemHandle` / `cuIpcOpenMemHandle`): the memory is
/// the exporter's `cuMemAlloc` allocation, charged to it, once; an importer
/// of another container (here with too little quota left to hold it) or of
/// the same one is charged nothing (freeing it while an importer has it open
/// is undefined behaviour by CUDA's documentation).
#[test]
fn legacy_ipc_memory_is_charged_to_the_exporter_only() {
    let m = Machine::new("ipc", T4);
    let mib800 = (800 * MIB).to_string();
    let (exporter, before) = Stepped::spawn(m.client(
        Some(&vars("ipc-exp", "2")),
        &["ctx", "alloc", &mib800, "ipcget", "ready", "waitline"],
    ));
    let g = op(&before, "ipcget");
    assert_eq!(g["rc"], 0, "{before}");
    let handle = g["handle"].as_str().unwrap().to_string();
    let used = |id: &str| container(&ledger(&m), id).map(|c| c.0);
    for (id, gib, quota) in [("ipc-imp", "1", GIB), ("ipc-exp", "2", 2 * GIB)] {
        let out = run_ok(&mut m.client(
            Some(&vars(id, gib)),
            &["ctx", "ipcopen", &handle, "info", "ipcclose", "info"],
        ));
        assert_eq!(op(&out, "ipcopen")["rc"], 0, "{out}");
        assert_eq!(op(&out, "ipcclose")["rc"], 0, "{out}");
        let held = if id == "ipc-exp" { CTX + 800 * MIB } else { 0 };
        for i in ops(&out, "info") {
            assert_eq!(i["free"].as_u64(), Some(quota - CTX - held), "{id}: {out}");
        }
    }
    assert_eq!(used("ipc-exp"), Some(CTX + 800 * MIB));
    exporter.finish();
}

/// `cuCtxSetLimit` inside a PID namespace, while other containers allocate
/// and free at random: every raise and lower is charged exactly (this
/// process's own bytes, never the device's noise).
#[test]
fn context_limits_in_a_pid_namespace_are_charged_without_other_containers_noise() {
    let m = Machine::new("pidns-limits", "81920:NVIDIA A100");
    let noisy = Reap(
        (0..3)
            .map(|i| {
                let id = format!("noisy{i}");
                spawn_ready(m.client(Some(&vars(&id, "8")), &["ctx", "loop", "300000000"])).0
            })
            .collect(),
    );
    let sizes: Vec<String> = (1..=30u64)
        .map(|i| ((8 + (i * 37) % 200) * MIB).to_string())
        .chain([(100 * MIB).to_string()])
        .collect();
    let mut args = vec!["ctx"];
    for s in &sizes {
        args.extend(["setlimit", "2", s.as_str()]);
    }
    args.extend(["info", "ready", "hold"]);
    let (ns, _r, out) = spawn_ready_out(in_pid_namespace(
        &m.client(Some(&vars("inns-limits", "20")), &args),
    ));
    let _ns = Reap(vec![ns]);
    assert!(ops(&out, "setlimit").iter().all(|s| s["rc"] == 0), "{out}");
    let (used, ..) = container(&ledger(&m), "inns-limits").unwrap();
    assert_eq!(
        used,
        CTX + 92 * MIB,
        "a 100 MiB heap, 8 MiB of it the context's: {out}"
    );
    assert_eq!(
        op(&out, "info")["free"].as_u64(),
        Some(20 * GIB - CTX - 92 * MIB),
        "{out}"
    );
    drop(noisy);
}

/// Bytes of the simulated driver's VMM memory (`memfd`s) that process
/// `pid` has mapped, from `/proc/<pid>/maps`: the memory it keeps alive,
/// whoever created it.
fn vmm_mapped_bytes(pid: u32) -> u64 {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    maps.lines()
        .filter(|l| l.contains("memfd:cgpu-sim-vmm"))
        .map(|l| {
            let (a, b) = l
                .split_whitespace()
                .next()
                .unwrap()
                .split_once('-')
                .unwrap();
            u64::from_str_radix(b, 16).unwrap() - u64::from_str_radix(a, 16).unwrap()
        })
        .sum()
}

/// Within one container, memory an exporter shares with another of its
/// processes is charged once, to the exporter, while it lives; when it
/// goes (exits, or is killed) while the importer still holds the memory,
/// the charge passes on to the importer in the same step (the ledger's
/// table of shared allocations), so the container never holds less than
/// its processes keep alive; the importer's release gives it back, once.
/// The bytes kept alive are read from the importer's own mappings.
#[test]
fn shared_vmm_memory_stays_charged_to_the_container_after_its_exporter_goes() {
    for kill in [false, true] {
        let m = Machine::new(if kill { "vmmpass-kill" } else { "vmmpass" }, T4);
        let (mut exporter, pid, fd) = spawn_vmm_exporter(&m, "share");
        let (mut importer, out) = spawn_vmm_importer(
            &m,
            ("share", "2"),
            (&pid, &fd),
            &[
                "info",
                "ready",
                "waitline",
                "vmmrelease",
                "vmmunmap",
                "info",
                "ready",
                "waitline",
            ],
        );
        let ipid = importer.child.id();
        assert_eq!(vmm_mapped_bytes(ipid), 800 * MIB, "the importer maps it");
        let l = ledger(&m);
        let used = || container(&l, "share").unwrap();
        let procs = |v: &View| {
            let mut p = v.3.clone();
            p.sort();
            p
        };
        // Both live: charged once, to the exporter; the import recorded.
        assert_eq!(used().0, 2 * CTX + 800 * MIB);
        assert_eq!(
            op(&out, "info")["free"].as_u64(),
            Some(2 * GIB - 2 * CTX - 800 * MIB)
        );
        let epid: u32 = pid.parse().unwrap();
        assert_eq!(
            l.shared_allocations(),
            vec![(epid as i32, ipid as i32, 800 * MIB, false)]
        );
        // The exporter lets go of its handle and mapping: still its charge
        // (its descriptor may keep the memory), not the importer's.
        let o = exporter.go_on();
        assert_eq!(op(&o, "vmmunmap")["rc"], 0, "{o}");
        assert_eq!(used().0, 2 * CTX + 800 * MIB);

        // The exporter goes while the importer holds the memory.
        if kill {
            exporter.child.kill().unwrap();
        } else {
            drop(exporter.stdin);
        }
        let st = wait_timeout(exporter.child.into_inner(), Duration::from_secs(30)).status;
        assert_eq!(st.success(), !kill, "{st:?}");
        l.reap();
        let v = used();
        assert_eq!(
            v.0,
            CTX + 800 * MIB,
            "the importer's context and what it holds"
        );
        assert_eq!(procs(&v), vec![(ipid, CTX + 800 * MIB)]);
        assert_eq!(vmm_mapped_bytes(ipid), 800 * MIB, "still alive");
        assert_eq!(
            l.shared_allocations(),
            vec![(epid as i32, ipid as i32, 800 * MIB, true)]
        );
        let o = importer.go_on();
        assert_eq!(
            op(&o, "info")["free"].as_u64(),
            Some(2 * GIB - CTX - 800 * MIB),
            "{o}"
        );
        // A newcomer of the container finds exactly the rest.
        let rest = 2 * GIB - 2 * CTX - 800 * MIB;
        let out = run_ok(&mut m.client(
            Some(&vars("share", "2")),
            &[
                "ctx",
                "info",
                "alloc",
                &(rest + 2 * MIB).to_string(),
                "alloc",
                &rest.to_string(),
            ],
        ));
        assert_eq!(op(&out, "info")["free"].as_u64(), Some(rest), "{out}");
        let allocs = ops(&out, "alloc");
        assert_eq!(
            (&allocs[0]["rc"], &allocs[1]["rc"]),
            (&2.into(), &0.into()),
            "{out}"
        );

        // The importer lets go: given back, once.
        let o = importer.go_on();
        assert_eq!(op(&o, "vmmunmap")["rc"], 0, "{o}");
        assert_eq!(op(&o, "info")["free"].as_u64(), Some(2 * GIB - CTX), "{o}");
        assert_eq!(vmm_mapped_bytes(ipid), 0);
        assert_eq!(used().0, CTX);
        assert_eq!(procs(&used()), vec![(ipid, CTX)]);
        assert!(l.shared_allocations().is_empty());
        importer.finish();
        l.reap();
        assert_eq!(container(&l, "share"), None, "nothing left behind");
    }
}

/// `tests/c/races.c`: threads of one process racing each other.
fn races_client() -> std::path::PathBuf {
    cc(&repo().join("tests/c/races.c"), "races", &[], true)
}

/// A stream-ordered allocation asks whether its stream is being captured
/// (then it is a graph's node, charged when the graph is launched) and
/// makes the real call; another thread beginning and ending captures of
/// the same stream in a loop must never turn an allocation seen in a
/// capture into a real one charged to nobody. The sim's own bytes for the
/// process stay within the quota.
#[test]
fn async_allocations_racing_captures_never_pass_the_quota() {
    let m = Machine::new("capture-race", T4);
    let mut c = m.preloaded(races_client(), &vars("racer", "1"));
    c.args(["capture_race", "16", "20000"])
        .stdin(Stdio::piped());
    let (k, _r, out) = spawn_ready_out(c);
    let j = op(&out, "capture_race");
    let pid = k.id();
    let used = m
        .sim_process_bytes()
        .iter()
        .find(|(p, _)| *p == pid)
        .map_or(0, |(_, b)| *b);
    eprintln!("{j}: the sim holds {} MiB for the process", used / MIB);
    assert!(j["captures"].as_u64().unwrap() > 0, "{out}");
    assert!(j["ok"].as_u64().unwrap() > 0, "{out}");
    assert!(
        used <= GIB,
        "{} MiB on the device under a 1 GiB quota: {out}",
        used / MIB
    );
    drop(k);
}

/// A child forked while another thread of its parent creates a context
/// (which holds the measurement of the context's reservation) frees
/// memory at once: it never waits for a lock of a thread it does not have.
#[test]
fn a_child_forked_while_a_context_is_made_never_hangs() {
    let m = Machine::new("fork-ctx", T4);
    let out = run_ok(
        m.preloaded(races_client(), &vars("forkctx", "4"))
            .args(["fork_ctx", "40"]),
    );
    let j = op(&out, "fork_ctx");
    assert_eq!(j["hung"], 0, "children hung: {out}");
    assert_eq!(j["done"], 40, "{out}");
}

/// A GPU that `ALIYUN_COM_GPU_VISIBLE_DEVICES` hides is unusable by its
/// number too: a context on it (created or the primary one) is refused,
/// so nothing is allocated on it, and its memory is not reported.
#[test]
fn a_hidden_gpu_is_unusable_by_its_number() {
    let m = Machine::new("hidden", &format!("{T4},{T4}"));
    let v = [
        ("CGPU_CONTAINER_ID", "hider"),
        ("ALIYUN_COM_GPU_MEM_CONTAINER", "4"),
        ("ALIYUN_COM_GPU_VISIBLE_DEVICES", "0"),
    ];
    let mut c = m.preloaded(races_client(), &v);
    c.args(["hidden", "1"]).stdin(Stdio::piped());
    let (k, _r, out) = spawn_ready_out(c);
    let j = op(&out, "hidden");
    let pid = k.id();
    const INVALID_DEVICE: i64 = 101;
    assert_eq!(j["ctx_create"], INVALID_DEVICE, "{out}");
    assert_eq!(j["primary_retain"], INVALID_DEVICE, "{out}");
    assert_eq!(j["total_mem"], INVALID_DEVICE, "{out}");
    assert_ne!(j["alloc"], 0, "{out}");
    assert_ne!(j["primary_alloc"], 0, "{out}");
    // The sim holds nothing for the process (it has no context anywhere).
    let used = m
        .sim_process_bytes()
        .iter()
        .find(|(p, _)| *p == pid)
        .map_or(0, |(_, b)| *b);
    assert_eq!(used, 0, "{out}");
    drop(k);
}

/// What a loaded module takes on the device (here a `__device__` global of
/// 1 GiB, which the simulated driver makes when the module is loaded, as a
/// driver does) is charged: the ledger's bytes for the process are the
/// sim's own. A module whose global would pass the quota is refused at its
/// load, and unloading gives a module's bytes back.
#[test]
fn module_memory_is_charged_and_given_back() {
    let m = Machine::new("modules", T4);
    let mut c = m.preloaded(races_client(), &vars("mods", "4"));
    c.args(["module", "1024", "8192"]).stdin(Stdio::piped());
    let (mut k, mut r, out) = spawn_ready_out(c);
    let g = op(&out, "global");
    assert_eq!(g["load"], 0, "{out}");
    assert_eq!(g["get"], 0, "{out}");
    assert_eq!(g["bytes"].as_u64().unwrap(), GIB, "{out}");
    let pid = k.id();
    let sim = m
        .sim_process_bytes()
        .iter()
        .find(|(p, _)| *p == pid)
        .map_or(0, |(_, b)| *b);
    let l = ledger(&m);
    let (used, ..) = container(&l, "mods").unwrap();
    assert_eq!(sim, CTX + GIB, "the sim's bytes: {out}");
    assert_eq!(used, sim, "the ledger charges what the sim holds: {out}");
    assert_eq!(g["free"].as_u64().unwrap(), 4 * GIB - CTX - GIB, "{out}");
    writeln!(k.stdin.as_mut().unwrap(), "go").unwrap();
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    let b: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(b["load"], 2, "a module past the quota is refused: {line}");
    assert_eq!(b["unload"], 0, "{line}");
    assert_eq!(
        b["free"].as_u64().unwrap(),
        4 * GIB - CTX,
        "unloading gave the module's bytes back: {line}"
    );
}
