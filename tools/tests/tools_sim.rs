//! The operator tools against ledgers written by real processes under
//! `LD_PRELOAD=libcgpu.so` on the simulated driver (`cuclient`): the numbers
//! `cgpu-smi` shows equal the ledger's and the sim's own, and a knob set with
//! `cgpuctl` reaches a running process.

mod tools_support;

use cgpu_ledger::Ledger;
use cgpu_testkit::{artifacts, cuclient, field, read_until, LinkMode, SimEnv};
use serde_json::Value;
use std::process::{Child, Stdio};
use std::sync::atomic::Ordering::Acquire;
use std::time::Duration;
use tools_support::*;

const T4: &str = "15109:Tesla T4";
const CTX: u64 = 300 * MIB;

struct Sim {
    env: SimEnv,
    dir: std::path::PathBuf,
}

impl Sim {
    fn new(name: &str) -> Sim {
        let a = artifacts();
        let dir = tmpdir(&format!("sim-{name}"));
        let env = SimEnv::new()
            .gpus(T4)
            .ctx_mib(CTX / MIB)
            .preload(&a.libcgpu)
            .env("CGPU_LEDGER_DIR", &dir.display().to_string());
        Sim { env, dir }
    }

    /// A cuclient of container `id` (quota `gib`, weight `w`) running `args`.
    fn client(&self, id: &str, gib: &str, w: &str, args: &[&str]) -> Child {
        self.env
            .command(cuclient(LinkMode::Link))
            .env("CGPU_CONTAINER_ID", id)
            .env("ALIYUN_COM_GPU_MEM_CONTAINER", gib)
            .env("ALIYUN_COM_GPU_SCHD_WEIGHT", w)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn cuclient")
    }

    fn ledger(&self) -> Ledger {
        let p = Ledger::list(&self.dir)
            .into_iter()
            .next()
            .expect("a ledger");
        Ledger::open(&p).unwrap()
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Wait for `tag` from the client; returns its pid (the client runs `pid` first).
fn wait_for(c: &mut Child, tag: &str) -> (u32, Vec<String>) {
    let lines = read_until(c, tag, Duration::from_secs(120));
    assert!(
        lines.last().is_some_and(|l| l.starts_with(tag)),
        "client never said {tag}: {lines:?}"
    );
    let pid = lines
        .iter()
        .find_map(|l| field(l, "pid"))
        .and_then(|p| p.parse().ok())
        .unwrap_or(c.id());
    (pid, lines)
}

fn containers(v: &Value) -> Vec<Value> {
    v["gpus"][0]["gpu"]["containers"]
        .as_array()
        .unwrap()
        .clone()
}

fn by_id(cs: &[Value], id: &str) -> Value {
    cs.iter().find(|c| c["id"] == id).unwrap().clone()
}

#[test]
fn smi_on_the_sim_equals_the_ledger_and_the_sim() {
    let s = Sim::new("numbers");
    let mut a1 = KillOnDrop(s.client("alpha", "4", "1", &["pid", "alloc", "1073741824", "hold"]));
    let mut a2 = KillOnDrop(s.client("alpha", "4", "1", &["pid", "alloc", "536870912", "hold"]));
    let mut b = KillOnDrop(s.client("beta", "2", "1", &["pid", "alloc", "104857600", "hold"]));
    let (pa1, _) = wait_for(&mut a1.0, "holding");
    let (pa2, _) = wait_for(&mut a2.0, "holding");
    let (pb, _) = wait_for(&mut b.0, "holding");

    let o = run(smi(), &s.dir, &["--json", "--instant"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let st = s.env.stats();
    assert_eq!(v["gpus"][0]["gpu"]["uuid"], st.devices[0].uuid.as_str());
    assert_eq!(
        v["gpus"][0]["gpu"]["physical_total_bytes"],
        st.devices[0].total_bytes
    );
    let cs = containers(&v);
    assert_eq!(cs.len(), 2);
    for (id, pids, quota, held) in [
        ("alpha", vec![pa1, pa2], 4 * GIB, 2 * CTX + 1536 * MIB),
        ("beta", vec![pb], 2 * GIB, CTX + 100 * MIB),
    ] {
        let c = by_id(&cs, id);
        assert_eq!(c["quota_bytes"], quota, "{id}");
        assert_eq!(c["used_bytes"], held, "{id}: the ledger");
        let sim: u64 = pids
            .iter()
            .map(|p| st.process(*p, 0).expect("sim knows the pid").mem_bytes)
            .sum();
        assert_eq!(c["used_bytes"], sim, "{id}: the sim");
        for p in c["processes"].as_array().unwrap() {
            let pid = p["pid"].as_u64().unwrap() as u32;
            assert!(pids.contains(&pid), "{id}: pid {pid}");
            assert_eq!(p["used_bytes"], st.process(pid, 0).unwrap().mem_bytes);
        }
        let l = s.ledger();
        let slot = l.find_container(id).unwrap();
        assert_eq!(
            c["used_bytes"],
            l.file().containers[slot].used.load(Acquire)
        );
    }
    // and the table says the same in MiB
    let o = run(smi(), &s.dir, &["--instant"]);
    let t = stdout(&o);
    let row = t.lines().find(|l| l.contains("| alpha ")).unwrap();
    assert!(
        row.contains(&format!(" {}/4096 ", (2 * CTX + 1536 * MIB) / MIB)),
        "{t}"
    );
    let row = t.lines().find(|l| l.contains("| beta ")).unwrap();
    assert!(row.contains(" 400/2048 "), "{t}");
    // the tree's meminfo lists each process with the sim's bytes
    let o = run(ctl(), &s.dir, &["tree", "--flat"]);
    let t = stdout(&o);
    let m1 = st.process(pa1, 0).unwrap().mem_bytes;
    assert!(
        t.contains(&format!("0/alpha/meminfo: PID: {pa1} Mem: {m1}\n")),
        "{t}"
    );
    assert!(
        t.contains(&format!(
            "0/beta/meminfo: Free: {}\n",
            2 * GIB - CTX - 100 * MIB
        )),
        "{t}"
    );
}

#[test]
fn lowered_memsize_refuses_a_running_clients_next_allocation() {
    let s = Sim::new("memsize");
    // holds its context + 1 GiB, waits 5 s, then asks for 512 MiB more
    let mut a = KillOnDrop(s.client(
        "alpha",
        "2",
        "1",
        &[
            "pid",
            "alloc",
            "1073741824",
            "ready",
            "sleep",
            "5000",
            "alloc",
            "536870912",
            "meminfo",
            "hold",
        ],
    ));
    let (pid, _) = wait_for(&mut a.0, "ready");
    let o = run(
        ctl(),
        &s.dir,
        &["set", "memsize", "1200M", "--container", "alpha"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("further allocations are refused"),
        "{}",
        stderr(&o)
    );
    let (_, lines) = wait_for(&mut a.0, "holding");
    let alloc = lines.iter().find(|l| l.starts_with("alloc")).unwrap();
    assert_eq!(alloc, "alloc err=2", "CUDA_ERROR_OUT_OF_MEMORY: {lines:?}");
    // nothing was freed under it
    let st = s.env.stats();
    assert_eq!(st.process(pid, 0).unwrap().mem_bytes, CTX + GIB);
    let l = s.ledger();
    let c = &l.file().containers[l.find_container("alpha").unwrap()];
    assert_eq!(c.used.load(Acquire), CTX + GIB);
    assert!(c.oom_count.load(Acquire) >= 1);
    let o = run(smi(), &s.dir, &["--json", "--instant"]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let c = by_id(&containers(&v), "alpha");
    assert_eq!(c["free_bytes"], 0, "never below 0");
    assert_eq!(c["total_bytes"], 1200 * MIB);
}

/// After `cgpuctl set memsize`, the running client's `cuMemGetInfo` shows the
/// new quota as its total (and 0 free when it holds more).
#[test]
fn lowered_memsize_shows_in_a_running_clients_meminfo() {
    let s = Sim::new("meminfo");
    let mut a = KillOnDrop(s.client(
        "alpha",
        "2",
        "1",
        &[
            "pid",
            "alloc",
            "1073741824",
            "ready",
            "sleep",
            "5000",
            "meminfo",
            "hold",
        ],
    ));
    wait_for(&mut a.0, "ready");
    let o = run(
        ctl(),
        &s.dir,
        &["set", "memsize", "1200M", "--container", "alpha"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    let (_, lines) = wait_for(&mut a.0, "holding");
    let mi = lines.iter().find(|l| l.starts_with("meminfo")).unwrap();
    assert_eq!(
        field(mi, "total"),
        Some((1200 * MIB).to_string().as_str()),
        "{mi}"
    );
    assert_eq!(field(mi, "free"), Some("0"), "{mi}");
}

/// `cgpu-smi -l`'s utilisation is the GPU time the ledger charged the
/// container over the window (exactly, to its 0.1 rounding), and that charge
/// is the device time the simulator gave it. Per container and window the
/// ledger is never below the simulator's count by more than the scheduler's
/// charging granularity (one slice and its drain tail: the ledger is charged
/// when a slice's drain completes)
/// plus the shift between the instants the two were read (measured here);
/// and never above it by more than that plus the time the device sat idle
/// in the window (measured here from the simulator): a holder is charged the
/// slice it held, less only the idle gaps the scheduler sees (see
/// docs/scheduling.md, "Unused time").
#[test]
fn utilisation_equals_the_sims_device_time() {
    use std::io::BufRead;
    let s = Sim::new("util");
    let busy = [
        "pid", "init", "ready", "spin_for", "5000", "1000000", "hold",
    ];
    let mut a = KillOnDrop(s.client("alpha", "1", "1", &busy));
    let mut b = KillOnDrop(s.client("beta", "1", "2", &busy));
    let (pa, _) = wait_for(&mut a.0, "ready");
    let (pb, _) = wait_for(&mut b.0, "ready");
    std::thread::sleep(Duration::from_millis(300));
    let mut smi_c = smi();
    smi_c
        .arg("--dir")
        .arg(&s.dir)
        .args(["--json", "-l", "1"])
        .stdout(Stdio::piped());
    let mut child = KillOnDrop(smi_c.spawn().unwrap());
    let mut lines = std::io::BufReader::new(child.0.stdout.take().unwrap()).lines();
    let wall_ns = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as i64
    };
    // Each document, the sim's state read right after it arrived, and the
    // spread of instants: [sample, sim read] lies within [arrived - latency,
    // read returned], latency = arrival - the document's own timestamp.
    struct Doc {
        v: Value,
        sim: cgpu_testkit::SimStats,
        after_sample_min_ns: i64,
        after_sample_max_ns: i64,
    }
    let mut docs = Vec::new();
    for _ in 0..4 {
        let l = lines.next().unwrap().unwrap();
        let arrived = wall_ns();
        let sim = s.env.stats();
        let returned = wall_ns();
        let v: Value = serde_json::from_str(&l).unwrap();
        let sampled = v["timestamp_ns"].as_i64().unwrap();
        docs.push(Doc {
            v,
            sim,
            after_sample_min_ns: arrived - sampled,
            after_sample_max_ns: returned - sampled,
        });
    }
    drop(child);
    // A slice is charged when its drain completes: one slice budget plus the
    // 1 ms kernels still queued when it ends (policy 1's charged slices
    // average 45 ms for a 40 ms budget; 8 kernels bound that tail).
    let slice = cgpu_ledger::policy::SLICE_NS as f64 + 8e6;
    for w in docs.windows(2) {
        let (d0, d1) = (&w[0], &w[1]);
        let window_ms = d1.v["util_window_ms"].as_u64().unwrap() as f64;
        // how far the sim's window may be shifted against cgpu-smi's, at
        // either end; a container uses the GPU at most all the time
        let shift = (d1.after_sample_max_ns - d0.after_sample_min_ns)
            .max(d0.after_sample_max_ns - d1.after_sample_min_ns) as f64;
        for (id, pid) in [("alpha", pa), ("beta", pb)] {
            let c0 = by_id(&containers(&d0.v), id);
            let c1 = by_id(&containers(&d1.v), id);
            let led =
                (c1["gpu_time_ns"].as_u64().unwrap() - c0["gpu_time_ns"].as_u64().unwrap()) as f64;
            let u = c1["util_percent"].as_f64().unwrap();
            // the window is reported in whole ms (truncated), the share to 0.1
            let hi = led / (window_ms * 1e6) * 100.0;
            let lo = led / ((window_ms + 1.0) * 1e6) * 100.0;
            assert!(
                u >= lo - 0.05 && u <= hi + 0.05,
                "{id}: cgpu-smi {u}% but the ledger charged {led} ns in {window_ms} ms"
            );
            let sim = (d1.sim.process(pid, 0).unwrap().device_time_ns
                - d0.sim.process(pid, 0).unwrap().device_time_ns) as f64;
            let busy = (d1.sim.devices[0].busy_ns - d0.sim.devices[0].busy_ns) as f64;
            let idle = (window_ms * 1e6 + shift - busy).max(0.0);
            eprintln!(
                "{id}: window {window_ms} ms, smi {u}%, ledger {:.1} ms, sim {:.1} ms, \
                 ledger - sim {:.1} ms; slice {:.0} ms, shift {:.1} ms, device idle {:.1} ms",
                led / 1e6,
                sim / 1e6,
                (led - sim) / 1e6,
                slice / 1e6,
                shift / 1e6,
                idle / 1e6
            );
            assert!(
                sim - led <= slice + shift,
                "{id}: ledger {led} ns, sim {sim} ns over cgpu-smi's {window_ms} ms window"
            );
            assert!(
                led - sim <= slice + shift + idle,
                "{id}: ledger {led} ns, sim {sim} ns over cgpu-smi's {window_ms} ms window \
                 (device idle {idle} ns)"
            );
        }
    }
}

/// `cgpuctl set policy` and `set weight` while two containers compute: the
/// simulator's device time follows the new weights within a couple of
/// seconds (shares within 10% of target).
#[test]
fn weight_set_live_reaches_running_jobs() {
    let s = Sim::new("weight");
    let busy = [
        "pid", "init", "ready", "spin_for", "20000", "1000000", "hold",
    ];
    let mut a = KillOnDrop(s.client("alpha", "1", "1", &busy));
    let mut b = KillOnDrop(s.client("beta", "1", "1", &busy));
    let (pa, _) = wait_for(&mut a.0, "ready");
    let (pb, _) = wait_for(&mut b.0, "ready");
    let share = |ms: u64| {
        let t0 = s.env.stats();
        std::thread::sleep(Duration::from_millis(ms));
        let t1 = s.env.stats();
        let d = |p| {
            (t1.process(p, 0).unwrap().device_time_ns - t0.process(p, 0).unwrap().device_time_ns)
                as f64
        };
        let (da, db) = (d(pa), d(pb));
        da / (da + db).max(1.0)
    };
    std::thread::sleep(Duration::from_millis(500));
    let before = share(1500);
    assert!((before - 0.5).abs() <= 0.05, "1:1 first: alpha {before:.3}");
    for args in [
        &["set", "policy", "2"][..],
        &["set", "weight", "3", "--container", "alpha"][..],
    ] {
        let o = run(ctl(), &s.dir, args);
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    }
    std::thread::sleep(Duration::from_millis(500));
    let after = share(2500);
    assert!(
        (after - 0.75).abs() <= 0.075,
        "3:1 after the set: alpha {after:.3} of the two"
    );
    let o = run(smi(), &s.dir, &["--json", "--instant"]);
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let cs = containers(&v);
    assert_eq!(by_id(&cs, "alpha")["limit_percent"], 75);
    assert_eq!(by_id(&cs, "beta")["limit_percent"], 25);
}

/// Under policy 5 (native) the scheduler charges nobody, so the ledger says
/// nothing of GPU use: `cgpu-smi`'s GPU-Util then comes from what the GPU
/// reports, NVML's per-process utilisation (here the simulator's, its own
/// device time), not 0. Two busy containers without compute control: each
/// shows what the simulator gave it over the window, within 10 points.
#[test]
fn native_policy_utilisation_comes_from_nvml() {
    use std::io::BufRead;
    let s = Sim::new("native");
    let busy = [
        "pid", "init", "ready", "spin_for", "8000", "1000000", "hold",
    ];
    let mut a = KillOnDrop(s.client("alpha", "1", "1", &busy));
    let mut b = KillOnDrop(s.client("beta", "1", "1", &busy));
    let (pa, _) = wait_for(&mut a.0, "ready");
    let (pb, _) = wait_for(&mut b.0, "ready");
    let o = run(ctl(), &s.dir, &["set", "policy", "5"]);
    assert!(o.status.success(), "{}", stderr(&o));
    std::thread::sleep(Duration::from_millis(300));
    // cgpu-smi on the host: the simulated NVML, no interposer.
    let mut smi_c = smi();
    smi_c
        .env("LD_LIBRARY_PATH", &artifacts().sim_lib_dir)
        .env("CGPU_SIM_STATE", &s.env.state_dir)
        .env_remove("LD_PRELOAD")
        .env_remove("CGPU_LEDGER_DIR")
        .arg("--dir")
        .arg(&s.dir)
        .args(["--json", "-l", "1"])
        .stdout(Stdio::piped());
    let mut child = KillOnDrop(smi_c.spawn().unwrap());
    let mut lines = std::io::BufReader::new(child.0.stdout.take().unwrap()).lines();
    let mut docs = Vec::new();
    for _ in 0..4 {
        let l = lines.next().unwrap().unwrap();
        docs.push((serde_json::from_str::<Value>(&l).unwrap(), s.env.stats()));
    }
    drop(child);
    // The first document has no window; the second's NVML window is NVML's
    // first call (a short one): judge the later ones.
    for w in docs[1..].windows(2) {
        let ((_, s0), (d1, s1)) = (&w[0], &w[1]);
        let window_ns = d1["util_window_ms"].as_u64().unwrap() as f64 * 1e6;
        for (id, pid) in [("alpha", pa), ("beta", pb)] {
            let c = by_id(&containers(d1), id);
            let u = c["util_percent"]
                .as_f64()
                .unwrap_or_else(|| panic!("{id}: {c}"));
            let sim = (s1.process(pid, 0).unwrap().device_time_ns
                - s0.process(pid, 0).unwrap().device_time_ns) as f64
                / window_ns
                * 100.0;
            eprintln!("{id}: cgpu-smi {u}%, simulator {sim:.1}%");
            assert!(u > 20.0, "{id}: {u}% under policy 5 (the GPU is busy)");
            assert!(
                (u - sim).abs() <= 10.0,
                "{id}: cgpu-smi {u}%, simulator {sim:.1}%"
            );
        }
    }
}

/// Env var that turns this test binary into one pass of the agent.
const AGENT_ENV: &str = "CGPU_TOOLS_TEST_AGENT_DIR";

/// Not a test: one pass of `cgpu-agent` (its library: the pass, the status
/// document and the atomic write its binary makes, with `--include-host`
/// since the sim's processes are host processes), in a process of its own
/// that reaches the simulated driver's NVML. Writes `<dir>/agent.json`.
#[test]
fn agent_pass_process() {
    let Some(dir) = std::env::var_os(AGENT_ENV) else {
        return;
    };
    let opts = cgpu_agent::Options {
        ledger_dir: dir.into(),
        policy: cgpu_agent::Policy::Report,
        include_host: true,
    };
    let mut agent = cgpu_agent::Agent::new(opts.clone()).expect("the sim's NVML");
    let pass = agent.pass();
    let doc = cgpu_agent::status_json(&opts, &pass, cgpu_ledger::clock::realtime_ns());
    cgpu_agent::write_atomic(
        &opts.ledger_dir.join("agent.json"),
        &serde_json::to_string_pretty(&doc).unwrap(),
    )
    .unwrap();
    std::process::exit(0);
}

/// Runs one agent pass over the sim's ledgers.
fn agent_pass(s: &Sim) {
    let o = s
        .env
        .command(std::env::current_exe().unwrap())
        .args([
            "agent_pass_process",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(AGENT_ENV, &s.dir)
        .output()
        .unwrap();
    assert!(o.status.success(), "agent pass: {}", stderr(&o));
}

/// What `cgpu-agent` writes is shown by `cgpu-smi` (table and JSON) and the
/// exporter: the device's bytes per container, and a container over its
/// quota through a process outside the library, with that process's pid.
/// A stale status is said to be stale and its numbers are left out; a
/// malformed one, or a link, is one warning and nothing else; no status,
/// nothing new at all.
#[test]
fn smi_and_exporter_show_what_the_agent_saw() {
    let s = Sim::new("agent");
    let lib_bytes = 500 * MIB;
    let mut lib = KillOnDrop(s.client(
        "team-1",
        "2",
        "1",
        &["pid", "alloc", &lib_bytes.to_string(), "hold"],
    ));
    let (plib, _) = wait_for(&mut lib.0, "holding");
    // The same container, without the library: the ledger never sees it.
    let mut bare = KillOnDrop(
        s.env
            .command(cuclient(LinkMode::Link))
            .env_remove("LD_PRELOAD")
            .env("CGPU_CONTAINER_ID", "team-1")
            .args(["pid", "alloc", &(2 * GIB).to_string(), "hold"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    let (pbare, _) = wait_for(&mut bare.0, "holding");
    let mut beta = KillOnDrop(s.client("beta", "2", "1", &["pid", "alloc", "104857600", "hold"]));
    let (pbeta, _) = wait_for(&mut beta.0, "holding");

    // No agent status: nothing about it, anywhere.
    let plain = run(smi(), &s.dir, &["--instant"]);
    assert!(plain.status.success(), "{}", stderr(&plain));
    let t = stdout(&plain);
    assert!(!t.contains("device holds") && !t.contains("agent"), "{t}");
    assert_eq!(stderr(&plain), "");
    let v: Value =
        serde_json::from_slice(&run(smi(), &s.dir, &["--json", "--instant"]).stdout).unwrap();
    assert!(v.get("agent").is_none(), "{v}");
    let body = cgpu_tools::exporter::render(&cgpu_tools::sample_dir(&s.dir).report);
    assert!(
        !body.contains("CGPU_AGENT") && !body.contains("CGPU_DEVICE"),
        "{body}"
    );

    agent_pass(&s);
    // The status says its agent passes every 10 minutes (a status may
    // state its interval; three of them count as fresh): what follows is
    // judged fresh however slowly this machine runs it.
    let path = s.dir.join("agent.json");
    let mut doc: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    doc["interval_ms"] = 600_000.into();
    std::fs::write(&path, serde_json::to_string(&doc).unwrap()).unwrap();
    let st = s.env.stats();
    let held = |pid: u32| st.process(pid, 0).expect("sim knows the pid").mem_bytes;
    let device = held(plib) + held(pbare);
    assert_eq!(device, 2 * CTX + lib_bytes + 2 * GIB, "the sim's books");
    let ledger_used = CTX + lib_bytes;

    // JSON: the agent's numbers, as the sim counts them.
    let o = run(smi(), &s.dir, &["--json", "--instant"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stderr(&o), "");
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    let a = &v["agent"];
    assert_eq!(a["stale"], false, "{a}");
    assert_eq!(a["policy"], "report");
    assert_eq!(a["path"], s.dir.join("agent.json").display().to_string());
    let cs = a["containers"].as_array().unwrap();
    let team = cs.iter().find(|c| c["id"] == "team-1").expect("team-1");
    assert_eq!(team["gpu"], 0);
    assert_eq!(team["uuid"], st.devices[0].uuid.as_str());
    assert_eq!(team["device_bytes"], device);
    assert_eq!(team["ledger_used_bytes"], ledger_used);
    assert_eq!(team["quota_bytes"], 2 * GIB);
    assert_eq!(team["over"], true);
    let outside: Vec<u64> = team["processes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["in_library"] == false)
        .map(|p| p["pid"].as_u64().unwrap())
        .collect();
    assert_eq!(outside, vec![u64::from(pbare)]);
    let b = cs.iter().find(|c| c["id"] == "beta").expect("beta");
    assert_eq!(b["device_bytes"], held(pbeta));
    assert_eq!(b["over"], false);

    // The table: what the device holds under team-1's row, and the marker.
    let o = run(smi(), &s.dir, &["--instant"]);
    let t = stdout(&o);
    let lines: Vec<&str> = t.lines().collect();
    let r = lines.iter().position(|l| l.contains("| team-1 ")).unwrap();
    assert!(
        lines[r + 1].contains(&format!("the device holds {} MiB", device / MIB)),
        "{t}"
    );
    let rb = lines.iter().position(|l| l.contains("| beta ")).unwrap();
    assert!(
        !lines[rb + 1].contains("device holds"),
        "beta: same as the ledger\n{t}"
    );
    let marker = format!(
        "! 0 team-1: the device holds {} MiB, quota 2048 MiB: 1 process outside the library (pid {pbare})",
        device / MIB
    );
    assert_eq!(
        t.lines().filter(|l| l.starts_with('!')).collect::<Vec<_>>(),
        vec![marker.as_str()],
        "{t}"
    );

    // The exporter, read by the reference parser.
    let body = cgpu_tools::exporter::render(&cgpu_tools::sample_dir(&s.dir).report);
    let (samples, types) = parse_prometheus(&body).unwrap_or_else(|e| panic!("{e}\n{body}"));
    for n in [
        "CGPU_DEVICE_FB_USED",
        "CGPU_OVER_QUOTA",
        "CGPU_UNSEEN_FB_CHARGED",
        "CGPU_DEVICE_TIME_SECONDS",
        "CGPU_AGENT_STATUS_AGE_SECONDS",
    ] {
        assert_eq!(
            types.get(n).map(String::as_str),
            Some("gauge"),
            "{n}\n{body}"
        );
    }
    let uuid = st.devices[0].uuid.as_str();
    let at = |name: &str, c: &str| {
        find(
            &samples,
            name,
            &[("gpu", "0"), ("UUID", uuid), ("container", c)],
        )
        .unwrap_or_else(|| panic!("{name} {c}\n{body}"))
        .value
    };
    assert_eq!(
        at("CGPU_DEVICE_FB_USED", "team-1"),
        device as f64 / MIB as f64
    );
    assert_eq!(
        at("CGPU_DEVICE_FB_USED", "beta"),
        held(pbeta) as f64 / MIB as f64
    );
    assert_eq!(at("CGPU_OVER_QUOTA", "team-1"), 1.0);
    assert_eq!(at("CGPU_OVER_QUOTA", "beta"), 0.0);
    // Not secure mode: nothing is charged beyond the library's books.
    assert_eq!(at("CGPU_UNSEEN_FB_CHARGED", "team-1"), 0.0);
    let age = find(&samples, "CGPU_AGENT_STATUS_AGE_SECONDS", &[])
        .unwrap()
        .value;
    assert!((0.0..600.0).contains(&age), "{age}");

    // Stale (older than three intervals): said once, numbers left out.
    let old = doc["time_ns"].as_u64().unwrap() - 3600 * 1_000_000_000;
    doc["time_ns"] = old.into();
    std::fs::write(&path, serde_json::to_string(&doc).unwrap()).unwrap();
    let o = run(smi(), &s.dir, &["--instant"]);
    let t = stdout(&o);
    assert!(t.contains("is stale (written 3"), "{t}");
    assert!(
        !t.contains("device holds") && !t.lines().any(|l| l.starts_with('!')),
        "{t}"
    );
    let v: Value =
        serde_json::from_slice(&run(smi(), &s.dir, &["--json", "--instant"]).stdout).unwrap();
    assert_eq!(v["agent"]["stale"], true);
    let body = cgpu_tools::exporter::render(&cgpu_tools::sample_dir(&s.dir).report);
    let (samples, _) = parse_prometheus(&body).unwrap();
    assert!(
        find(&samples, "CGPU_AGENT_STATUS_AGE_SECONDS", &[])
            .unwrap()
            .value
            >= 3600.0
    );
    assert!(
        find(&samples, "CGPU_DEVICE_FB_USED", &[]).is_none(),
        "{body}"
    );

    // Malformed, then a link to a good one: one warning, nothing shown.
    let good = serde_json::to_string(&doc).unwrap();
    std::fs::write(&path, "{\"schema_version\": 1, \"gpus\": [").unwrap();
    let o = run(smi(), &s.dir, &["--instant"]);
    assert!(o.status.success());
    assert_eq!(
        stderr(&o).matches("agent status").count(),
        1,
        "{}",
        stderr(&o)
    );
    assert!(!stdout(&o).contains("agent") && !stdout(&o).contains("device holds"));
    let elsewhere = s.dir.join("elsewhere.json");
    std::fs::write(&elsewhere, good).unwrap();
    std::fs::remove_file(&path).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &path).unwrap();
    let o = run(smi(), &s.dir, &["--json", "--instant"]);
    assert!(stderr(&o).contains("symbolic link"), "{}", stderr(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v.get("agent").is_none(), "{v}");
    // CGPU_AGENT_STATUS names the file (as `--status-file` put it elsewhere).
    let mut c = smi();
    c.env("CGPU_AGENT_STATUS", &elsewhere);
    let o = run(c, &s.dir, &["--json", "--instant"]);
    assert_eq!(stderr(&o), "");
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["agent"]["path"], elsewhere.display().to_string());
    assert_eq!(v["agent"]["stale"], true);
}
