//! The operator tools (`cgpu-smi`, `cgpuctl`) against ledgers held by real
//! client processes (this test binary re-executed, joining through the
//! ledger API). The same tools against processes under `LD_PRELOAD` on the
//! simulated driver: `tools_sim.rs`.

mod tools_support;

use cgpu_ledger::{Ledger, LedgerFile, LedgerHeader};
use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::sync::atomic::Ordering::Acquire;
use tools_support::*;

/// Not a test: the body of the client processes (see `tools_support`).
#[test]
fn client_process() {
    client_main_if_asked();
}

fn spec(uuid: &str, index: u32, id: &str, quota: u64, weight: u32, bytes: u64) -> ClientSpec {
    ClientSpec {
        uuid: uuid.into(),
        index,
        id: id.into(),
        quota,
        weight,
        highprio: false,
        bytes,
        join_pause_ms: 0,
    }
}

fn start(dir: &Path, s: ClientSpec) -> Client {
    Client::start("client_process", dir, &s)
}

fn ledger(dir: &Path, uuid: &str) -> Ledger {
    Ledger::open(&Ledger::path_for(dir, uuid)).unwrap()
}

fn json(o: &std::process::Output) -> Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("not JSON ({e}):\n{}", stdout(o)))
}

/// The table row of container `id`.
fn row<'a>(table: &'a str, id: &str) -> &'a str {
    table
        .lines()
        .find(|l| l.contains(&format!("| {id} ")))
        .unwrap_or_else(|| panic!("no row for {id}:\n{table}"))
}

/// Columns of a table row, trimmed.
fn cols(row: &str) -> Vec<String> {
    row.trim_matches('|')
        .split('|')
        .map(|c| c.trim().to_owned())
        .collect()
}

#[test]
fn smi_numbers_equal_the_ledger() {
    let dir = tmpdir("smi");
    let _a1 = start(
        &dir,
        spec("GPU-t0", 0, "alpha", 6 * GIB, 1, 1000 * MIB + 12345),
    );
    let _a2 = start(&dir, spec("GPU-t0", 0, "alpha", 6 * GIB, 1, 500 * MIB));
    let mut bs = spec("GPU-t0", 0, "beta", 4 * GIB, 2, 300 * MIB);
    bs.highprio = true;
    let _b = start(&dir, bs);
    let _c = start(&dir, spec("GPU-t1", 1, "gamma", 0, 1, 7 * MIB));
    let pids = [_a1.pid, _a2.pid, _b.pid, _c.pid];

    // JSON: every number equals what the ledger holds
    let o = run(smi(), &dir, &["--json", "--instant"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v = json(&o);
    assert_eq!(v["schema_version"], 1);
    assert_eq!(v["ledger_format"], cgpu_ledger::FORMAT_VERSION);
    let gpus = v["gpus"].as_array().unwrap();
    assert_eq!(gpus.len(), 2);
    for (gi, uuid) in [(0, "GPU-t0"), (1, "GPU-t1")] {
        let e = &gpus[gi];
        assert_eq!(e["status"], "ok");
        assert_eq!(e["error"], Value::Null);
        let g = &e["gpu"];
        assert_eq!(g["uuid"], uuid);
        assert_eq!(g["index"], gi);
        let l = ledger(&dir, uuid);
        let f: &LedgerFile = l.file();
        assert_eq!(g["policy"], f.header.policy.load(Acquire));
        assert_eq!(g["max_inst"], f.header.max_inst.load(Acquire));
        assert_eq!(g["free_weight"], cgpu_ledger::free_weight(f));
        assert_eq!(g["physical_total_bytes"], 16 * GIB);
        let live: Vec<(usize, &cgpu_ledger::ContainerSlot)> = l.containers().collect();
        let cs = g["containers"].as_array().unwrap();
        assert_eq!(cs.len(), live.len());
        for (slot, s) in live {
            let c = cs.iter().find(|c| c["slot"] == slot).unwrap();
            assert_eq!(c["id"], s.id_str());
            assert_eq!(c["used_bytes"], s.used.load(Acquire));
            assert_eq!(c["quota_bytes"], s.quota.load(Acquire));
            assert_eq!(c["weight"], s.weight.load(Acquire));
            assert_eq!(c["highprio"], s.highprio.load(Acquire) == 1);
            assert_eq!(c["nprocs"], s.nprocs.load(Acquire));
            assert_eq!(
                c["limit_percent"],
                cgpu_ledger::words::limit_percent(f, slot)
            );
            let procs = c["processes"].as_array().unwrap();
            let mine: Vec<_> = l.processes_of(slot).collect();
            assert_eq!(procs.len(), mine.len());
            let sum: u64 = procs
                .iter()
                .map(|p| p["used_bytes"].as_u64().unwrap())
                .sum();
            assert_eq!(
                sum,
                s.used.load(Acquire),
                "processes add up to the container"
            );
            for p in procs {
                assert!(pids.contains(&(p["pid"].as_u64().unwrap() as u32)));
                assert_eq!(p["alive"], true);
            }
        }
    }
    let alpha = &gpus[0]["gpu"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == "alpha")
        .unwrap()
        .clone();
    assert_eq!(alpha["used_bytes"], 1500 * MIB + 12345);
    assert_eq!(alpha["total_bytes"], 6 * GIB);
    assert_eq!(alpha["free_bytes"], 6 * GIB - 1500 * MIB - 12345);
    let gamma = &gpus[1]["gpu"]["containers"][0];
    assert_eq!(gamma["total_bytes"], 16 * GIB, "no quota: the GPU's total");

    // the table, measured over 1 s
    let o = run(smi(), &dir, &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let t = stdout(&o);
    let r = cols(row(&t, "alpha"));
    assert_eq!(r[0], "0");
    assert_eq!(r[2], "0");
    let l0 = ledger(&dir, "GPU-t0");
    let a = l0.find_container("alpha").unwrap();
    let lim = cgpu_ledger::words::limit_percent(l0.file(), a);
    let (u, limit) = r[3].split_once('/').unwrap();
    assert_eq!(limit.trim(), lim.to_string());
    assert!(u.trim().parse::<u32>().is_ok(), "util measured: {}", r[3]);
    assert_eq!(r[4], format!("{}/{}", (1500 * MIB + 12345) / MIB, 6 * 1024));
    let r = cols(row(&t, "beta"));
    assert_eq!(r[2], "1", "highprio");
    assert_eq!(r[4], "300/4096");
    let r = cols(row(&t, "gamma"));
    assert_eq!(r[0], "1");
    assert_eq!(r[4], "7/16384");

    // -d: one line per process with its pid and MiB
    let o = run(smi(), &dir, &["-d", "--instant"]);
    let t = stdout(&o);
    for (c, mib) in [(&_a1, 1000), (&_a2, 500), (&_b, 300), (&_c, 7)] {
        let line = t
            .lines()
            .find(|l| l.contains(&format!("PID {} ", c.pid)))
            .unwrap_or_else(|| panic!("no line for pid {}:\n{t}", c.pid));
        assert!(line.contains(&format!(" {mib} MiB")), "{line}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn smi_loop_refreshes() {
    let dir = tmpdir("loop");
    let _a = start(&dir, spec("GPU-l0", 0, "alpha", GIB, 1, MIB));
    let mut child = KillOnDrop(
        smi()
            .args(["--dir"])
            .arg(&dir)
            .args(["--json", "-l", "0.2"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut r = BufReader::new(child.0.stdout.take().unwrap());
    let mut docs = Vec::new();
    for _ in 0..3 {
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        docs.push(serde_json::from_str::<Value>(&line).unwrap());
    }
    drop(child);
    assert_eq!(docs[0]["util_window_ms"], Value::Null);
    for d in &docs[1..] {
        assert!(d["util_window_ms"].as_u64().unwrap() >= 150, "{d}");
        let c = &d["gpus"][0]["gpu"]["containers"][0];
        assert!(c["util_percent"].as_f64().is_some(), "{c}");
        assert_eq!(c["used_bytes"], MIB);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn set_reaches_the_ledger_and_a_running_client() {
    let dir = tmpdir("set");
    let mut a = start(&dir, spec("GPU-s0", 0, "alpha", 2 * GIB, 1, GIB));
    let _b = start(&dir, spec("GPU-s0", 0, "beta", GIB, 1, 0));
    let _c = start(&dir, spec("GPU-s1", 1, "alpha", GIB, 1, 0));
    let l = ledger(&dir, "GPU-s0");
    let l1 = ledger(&dir, "GPU-s1");
    let f = l.file();
    let gen = |f: &LedgerFile| f.header.knob_generation.load(Acquire);
    let slot = a.container;

    // memsize lowered: the client's next allocation past it is refused
    let g0 = gen(f);
    let o = run(
        ctl(),
        &dir,
        &[
            "set",
            "memsize",
            "1536M",
            "--gpu",
            "0",
            "--container",
            "alpha",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        stdout(&o).trim(),
        format!("0/alpha/memsize: {} -> {}", 2 * GIB, 1536 * MIB)
    );
    assert_eq!(f.containers[slot].quota.load(Acquire), 1536 * MIB);
    assert!(gen(f) > g0, "knob_generation bumped");
    assert!(!a.alloc(600 * MIB), "over the new quota");
    assert!(a.alloc(500 * MIB), "within it");
    // below what is held: refused further, nothing freed
    let o = run(
        ctl(),
        &dir,
        &[
            "set",
            "memsize",
            "512M",
            "--gpu",
            "GPU-s0",
            "--container",
            "alpha",
        ],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("further allocations are refused"),
        "{}",
        stderr(&o)
    );
    assert!(!a.alloc(1));
    assert_eq!(
        f.containers[slot].used.load(Acquire),
        GIB + 500 * MIB,
        "never frees"
    );
    a.free(1400 * MIB);
    assert!(a.alloc(MIB), "room again once it freed");
    // a plain number is GiB
    let o = run(
        ctl(),
        &dir,
        &["set", "memsize", "1", "--gpu", "0", "--container", "alpha"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(f.containers[slot].quota.load(Acquire), GIB);

    // per-GPU knobs: all GPUs by default
    for (k, v, expect) in [
        ("policy", "2", 2u64),
        ("max_inst", "10", 10),
        ("prio_ratio", "50", 50),
        ("default_memsize", "3", 3 * GIB),
    ] {
        let g = gen(f);
        let o = run(ctl(), &dir, &["set", k, v]);
        assert!(o.status.success(), "{k}: {}", stderr(&o));
        assert_eq!(stdout(&o).lines().count(), 2, "both GPUs: {}", stdout(&o));
        assert!(gen(f) > g);
        for ll in [&l, &l1] {
            let h = &ll.file().header;
            let got = match k {
                "policy" => h.policy.load(Acquire).into(),
                "max_inst" => h.max_inst.load(Acquire).into(),
                "prio_ratio" => h.prio_ratio.load(Acquire).into(),
                _ => h.default_memsize.load(Acquire),
            };
            assert_eq!(got, expect, "{k}");
        }
        // get: bare value for one GPU, path lines for all
        let o = run(ctl(), &dir, &["get", k, "--gpu", "1"]);
        assert_eq!(stdout(&o).trim(), expect.to_string());
        let o = run(ctl(), &dir, &["get", k]);
        assert_eq!(
            stdout(&o),
            format!("0/{k}: {expect}\n1/{k}: {expect}\n"),
            "{k}"
        );
    }
    assert_eq!(f.header.policy_explicit.load(Acquire), 1);

    // per-container knobs, one GPU only
    let o = run(
        ctl(),
        &dir,
        &["set", "weight", "4", "--gpu", "0", "--container", "alpha"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(f.containers[slot].weight.load(Acquire), 4);
    assert_eq!(
        l1.file().containers[_c.container].weight.load(Acquire),
        1,
        "GPU 1 untouched"
    );
    let o = run(
        ctl(),
        &dir,
        &["set", "highprio", "1", "--container", "beta"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(f.containers[_b.container].highprio.load(Acquire), 1);
    // without --gpu, a container knob goes to every GPU the container is on
    let o = run(ctl(), &dir, &["set", "weight", "2", "--container", "alpha"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(f.containers[slot].weight.load(Acquire), 2);
    assert_eq!(l1.file().containers[_c.container].weight.load(Acquire), 2);
    let o = run(ctl(), &dir, &["get", "weight", "--gpu", "0"]);
    assert_eq!(stdout(&o), "0/alpha/weight: 2\n0/beta/weight: 1\n");
    let o = run(ctl(), &dir, &["get", "free_weight", "--gpu", "0"]);
    assert_eq!(stdout(&o).trim(), "7");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn ranges_are_refused() {
    let dir = tmpdir("ranges");
    let _a = start(&dir, spec("GPU-r0", 0, "alpha", GIB, 3, 0));
    let _b = start(&dir, spec("GPU-r0", 0, "beta", GIB, 2, 0));
    let l = ledger(&dir, "GPU-r0");
    let f = l.file();
    let before = (
        f.header.knob_generation.load(Acquire),
        f.header.policy.load(Acquire),
    );
    let cases: &[(&[&str], &str)] = &[
        (&["set", "policy", "6"], "policy 6 is out of range 0..5"),
        (&["set", "policy", "-1"], "not a whole number"),
        (&["set", "policy", "two"], "not a whole number"),
        (&["set", "max_inst", "0"], "out of range 1..25"),
        (&["set", "max_inst", "26"], "out of range 1..25"),
        (&["set", "max_inst", "4"], "below the weights"),
        (&["set", "prio_ratio", "19"], "out of range 20..99"),
        (&["set", "prio_ratio", "100"], "out of range 20..99"),
        (
            &["set", "weight", "0", "--container", "alpha"],
            "out of range 1..16",
        ),
        (
            &["set", "weight", "17", "--container", "alpha"],
            "out of range 1..16",
        ),
        (
            &["set", "weight", "15", "--container", "alpha"],
            "> max_inst 16",
        ),
        (&["set", "weight", "2"], "give --container"),
        (
            &["set", "highprio", "2", "--container", "alpha"],
            "expected a boolean",
        ),
        (
            &["set", "memsize", "0", "--container", "alpha"],
            "at least 1 byte",
        ),
        (
            &["set", "memsize", "17", "--container", "alpha"],
            "more than the GPU",
        ),
        (
            &["set", "memsize", "5 parsecs", "--container", "alpha"],
            "unknown unit",
        ),
        (&["set", "default_memsize", "17"], "more than the GPU"),
        (&["set", "free_weight", "3"], "read-only"),
        (
            &["set", "policy", "2", "--container", "alpha"],
            "per-GPU knob",
        ),
        (&["set", "colour", "2"], "unknown knob"),
        (&["set", "policy"], "usage"),
        (&["get", "nothing"], "unknown knob"),
        (&["frobnicate"], "unknown command"),
        (&["tree", "--bogus"], "unknown option"),
    ];
    for (args, msg) in cases {
        let o = run(ctl(), &dir, args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(
            stderr(&o).contains(msg),
            "{args:?}: wanted `{msg}` in: {}",
            stderr(&o)
        );
        assert!(stderr(&o).starts_with("cgpuctl: error: "), "{}", stderr(&o));
    }
    // not found is a failure, not a usage error
    let o = run(
        ctl(),
        &dir,
        &["set", "weight", "1", "--container", "nobody"],
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("no live container `nobody`"));
    let o = run(ctl(), &dir, &["get", "policy", "--gpu", "7"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("no GPU `7`; GPUs: 0 (GPU-r0)"),
        "{}",
        stderr(&o)
    );
    // nothing was written
    assert_eq!(
        (
            f.header.knob_generation.load(Acquire),
            f.header.policy.load(Acquire)
        ),
        before
    );
    assert_eq!(f.containers[_a.container].weight.load(Acquire), 3);
    assert_eq!(f.containers[_a.container].quota.load(Acquire), GIB);
    let o = run(smi(), &dir, &["--loop", "0"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("--loop"), "{}", stderr(&o));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn help_for_every_command() {
    let o = ctl().arg("--help").output().unwrap();
    assert!(o.status.success());
    for c in ["get", "set", "tree", "inspect", "gc", "exporter", "version"] {
        assert!(stdout(&o).contains(c), "{c}");
        let o = ctl().args([c, "--help"]).output().unwrap();
        assert!(o.status.success(), "{c}");
        assert!(
            stdout(&o).starts_with(&format!("cgpuctl {c}")),
            "{c}: {}",
            stdout(&o)
        );
    }
    let o = ctl().output().unwrap();
    assert_eq!(o.status.code(), Some(2), "no command");
    let o = ctl().arg("--version").output().unwrap();
    assert!(o.status.success());
    assert_eq!(
        stdout(&o),
        format!(
            "cgpuctl {} (ledger format {})\n",
            env!("CARGO_PKG_VERSION"),
            cgpu_ledger::FORMAT_VERSION
        )
    );
    let o = smi().arg("--help").output().unwrap();
    assert!(o.status.success());
    assert!(stdout(&o).contains("--loop SECONDS"));
}

#[test]
fn reading_never_waits_for_a_job_holding_the_table_lock() {
    let dir = tmpdir("nowait");
    let a = start(&dir, spec("GPU-w0", 0, "alpha", GIB, 1, 3 * MIB));
    // beta holds the ledger's table lock for 120 s in the middle of joining
    let mut bs = spec("GPU-w0", 0, "beta", GIB, 1, 0);
    bs.join_pause_ms = 120_000;
    let b = Client::spawn("client_process", &dir, &bs);
    let l = ledger(&dir, "GPU-w0");
    let t = std::time::Instant::now();
    while l.find_container("beta").is_none() {
        assert!(t.elapsed().as_secs() < 60, "beta never started joining");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let held = std::time::Instant::now();
    for (tool, args) in [
        (
            smi as fn() -> std::process::Command,
            &["--json", "--instant"][..],
        ),
        (smi, &["-d", "--instant"][..]),
        (ctl, &["tree"][..]),
        (ctl, &["inspect"][..]),
        (ctl, &["get", "policy"][..]),
        (ctl, &["set", "prio_ratio", "60"][..]),
    ] {
        let o = run(tool(), &dir, args);
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
    }
    let o = run(smi(), &dir, &["--json", "--instant"]);
    let v = json(&o);
    let cs = v["gpus"][0]["gpu"]["containers"].as_array().unwrap();
    assert!(cs
        .iter()
        .any(|c| c["id"] == "alpha" && c["used_bytes"] == 3 * MIB));
    // all of that while the lock was held (the tools did not wait for it)
    assert!(
        held.elapsed().as_secs() < 120,
        "the tools took {:?}: they waited for the lock",
        held.elapsed()
    );
    assert_eq!(l.file().header.prio_ratio.load(Acquire), 60);
    drop(b);
    drop(a);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Write a copy of ledger `src` as `dst` with `patch` applied to its bytes.
fn patched_copy(src: &Path, dst: &Path, patch: impl FnOnce(&mut Vec<u8>)) {
    let mut b = std::fs::read(src).unwrap();
    patch(&mut b);
    std::fs::write(dst, b).unwrap();
}

#[test]
fn corrupt_ledgers_are_reported_not_trusted() {
    let dir = tmpdir("corrupt");
    let _a = start(&dir, spec("GPU-c0", 0, "alpha", GIB, 1, 5 * MIB));
    let good = Ledger::path_for(&dir, "GPU-c0");
    // wrong magic
    patched_copy(&good, &dir.join("GPU-magic.ledger"), |b| b[0] ^= 0xff);
    // another format version
    let vo = std::mem::offset_of!(LedgerHeader, version);
    patched_copy(&good, &dir.join("GPU-version.ledger"), |b| {
        b[vo..vo + 4].copy_from_slice(&99u32.to_le_bytes())
    });
    // right header, values no cgpu writes (policy 9)
    let po = std::mem::offset_of!(LedgerHeader, policy);
    patched_copy(&good, &dir.join("GPU-values.ledger"), |b| {
        b[po..po + 4].copy_from_slice(&9u32.to_le_bytes())
    });
    // truncated
    patched_copy(&good, &dir.join("GPU-short.ledger"), |b| b.truncate(100));

    let o = run(smi(), &dir, &["--json", "--instant"]);
    assert_eq!(o.status.code(), Some(3), "untrusted ledgers: exit 3");
    let v = json(&o);
    let entries = v["gpus"].as_array().unwrap();
    assert_eq!(entries.len(), 5);
    let by = |name: &str| {
        entries
            .iter()
            .find(|e| e["path"].as_str().unwrap().ends_with(name))
            .unwrap()
            .clone()
    };
    assert_eq!(by("GPU-c0.ledger")["status"], "ok");
    for (name, status, msg) in [
        ("GPU-magic.ledger", "corrupt", "magic"),
        ("GPU-version.ledger", "version", "format 99"),
        ("GPU-values.ledger", "corrupt", "policy 9"),
        ("GPU-short.ledger", "corrupt", ""),
    ] {
        let e = by(name);
        assert_eq!(e["status"], status, "{name}: {e}");
        assert_eq!(e["gpu"], Value::Null, "{name}: no numbers shown");
        assert!(e["error"].as_str().unwrap().contains(msg), "{name}: {e}");
    }
    let o = run(smi(), &dir, &["--instant"]);
    assert_eq!(o.status.code(), Some(3));
    let t = stdout(&o);
    assert!(cols(row(&t, "alpha"))[4] == "5/1024", "{t}");
    for name in ["GPU-magic", "GPU-version", "GPU-values", "GPU-short"] {
        let l = t.lines().find(|l| l.contains(name)).unwrap();
        assert!(l.starts_with("|  ?| "), "{l}");
    }
    // tree and inspect say so too; set does not write into them
    let o = run(ctl(), &dir, &["tree", "--flat"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stdout(&o).contains("?GPU-values.ledger: NOT TRUSTED: corrupt ledger: policy 9"));
    let o = run(ctl(), &dir, &["inspect"]);
    assert!(
        stdout(&o).contains("GPU-version.ledger: ledger format 99"),
        "{}",
        stdout(&o)
    );
    let before = std::fs::read(dir.join("GPU-values.ledger")).unwrap();
    let o = run(ctl(), &dir, &["set", "prio_ratio", "40"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("not trusted, not written"),
        "{}",
        stderr(&o)
    );
    assert_eq!(
        std::fs::read(dir.join("GPU-values.ledger")).unwrap(),
        before
    );
    assert_eq!(
        ledger(&dir, "GPU-c0")
            .file()
            .header
            .prio_ratio
            .load(Acquire),
        40
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn scrape(addr: &str, path: &str) -> (String, String) {
    try_scrape(addr, path).unwrap()
}

fn try_scrape(addr: &str, path: &str) -> std::io::Result<(String, String)> {
    let mut s = std::net::TcpStream::connect(addr)?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: */*\r\n\r\n"
    )?;
    let mut resp = String::new();
    s.read_to_string(&mut resp)?;
    let (head, body) = resp.split_once("\r\n\r\n").unwrap();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(body.len(), len);
    Ok((head.to_owned(), body.to_owned()))
}

/// `cgpuctl exporter` on an ephemeral loopback port; its address.
fn start_exporter(dir: &Path) -> (KillOnDrop, String) {
    let mut child = KillOnDrop(
        ctl()
            .arg("--dir")
            .arg(dir)
            .args(["exporter", "--listen", "127.0.0.1:0"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut first = String::new();
    BufReader::new(child.0.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let addr = first
        .split("http://")
        .nth(1)
        .and_then(|s| s.split('/').next())
        .unwrap_or_else(|| panic!("no address in {first:?}"))
        .to_owned();
    (child, addr)
}

fn threads_of(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .count()
}

/// Idle connections (a port scanner, a stuck client) never take more than
/// the cap's worth of threads; past the cap a client gets `503` at once, and
/// scrapes are answered again as soon as the idle ones go.
#[test]
fn exporter_caps_concurrent_connections() {
    const CAP: usize = 32; // cgpu_tools::exporter::MAX_CONNECTIONS
    let dir = tmpdir("exporter-cap");
    let _a = start(&dir, spec("GPU-k0", 0, "alpha", GIB, 1, MIB));
    let (child, addr) = start_exporter(&dir);
    let idle: Vec<std::net::TcpStream> = (0..3 * CAP)
        .map(|_| std::net::TcpStream::connect(&addr).unwrap())
        .collect();
    // The accepting thread answers the ones past the cap with 503 and
    // closes them: read one of the last to know it got that far.
    let mut last = idle.last().unwrap().try_clone().unwrap();
    last.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let mut resp = String::new();
    last.read_to_string(&mut resp).unwrap();
    assert!(
        resp.starts_with("HTTP/1.1 503 Service Unavailable"),
        "{resp}"
    );
    // The exporter's own threads: main (accepting) and the sampler.
    let threads = threads_of(child.0.id());
    assert!(
        threads <= 2 + CAP,
        "{threads} threads with {} idle connections (cap {CAP})",
        idle.len()
    );
    // A client now is refused, not queued behind the idle ones (read
    // without writing: the refusal does not wait for a request).
    let t = std::time::Instant::now();
    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    // A client queued behind the idle connections would wait forever.
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp)
        .expect("no refusal within 10 s: the client was queued");
    assert!(resp.starts_with("HTTP/1.1 503"), "{resp}");
    assert!(
        t.elapsed() < std::time::Duration::from_secs(4),
        "{:?}",
        t.elapsed()
    );
    drop(idle);
    // Their handlers see the end of stream and leave; scrapes work again.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        // While handlers are still leaving, a refusal may reset the
        // connection before the request is read: retry then too.
        let (head, body) = try_scrape(&addr, "/metrics").unwrap_or_default();
        if head.starts_with("HTTP/1.1 200") {
            assert!(body.contains("CGPU_FB_USED{"), "{body}");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "still {head}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    drop(child);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn exporter_scraped_over_loopback() {
    let dir = tmpdir("exporter");
    let _a = start(
        &dir,
        spec("GPU-e0", 0, "alpha", 6 * GIB, 2, 1000 * MIB + 512 * 1024),
    );
    let _b = start(&dir, spec("GPU-e0", 0, "be\"ta", 4 * GIB, 1, 3 * MIB));
    patched_copy(
        &Ledger::path_for(&dir, "GPU-e0"),
        &dir.join("GPU-bad.ledger"),
        |b| b[0] ^= 1,
    );
    let (child, addr) = start_exporter(&dir);
    let (head, body) = scrape(&addr, "/metrics");
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
    assert!(
        head.contains("Content-Type: text/plain; version=0.0.4"),
        "{head}"
    );
    let (samples, types) = parse_prometheus(&body).unwrap_or_else(|e| panic!("{e}\n{body}"));
    for (n, t) in &types {
        assert!(n.starts_with("CGPU_"), "{n}");
        if t == "counter" {
            assert!(n.ends_with("_TOTAL"), "counter {n}");
        }
        assert!(body.contains(&format!("# HELP {n} ")), "{n} has HELP");
    }
    let l = ledger(&dir, "GPU-e0");
    let f = l.file();
    for (id, c) in [("alpha", &_a), ("be\"ta", &_b)] {
        let lab = [("gpu", "0"), ("UUID", "GPU-e0"), ("container", id)];
        let s = &f.containers[c.container];
        let get = |n: &str| {
            find(&samples, n, &lab)
                .unwrap_or_else(|| panic!("{n} {id}"))
                .value
        };
        assert_eq!(
            get("CGPU_FB_USED"),
            s.used.load(Acquire) as f64 / MIB as f64
        );
        assert_eq!(
            get("CGPU_FB_QUOTA"),
            s.quota.load(Acquire) as f64 / MIB as f64
        );
        assert_eq!(get("CGPU_WEIGHT"), s.weight.load(Acquire) as f64);
        assert_eq!(
            get("CGPU_UTIL_LIMIT"),
            cgpu_ledger::words::limit_percent(f, c.container) as f64
        );
        let st = cgpu_ledger::words::container_stats(s);
        assert_eq!(
            get("CGPU_GPU_TIME_SECONDS_TOTAL"),
            st.gpu_time_ns as f64 / 1e9
        );
        assert!(get("CGPU_THROTTLED_SECONDS_TOTAL") >= 0.0);
        let pid = c.pid.to_string();
        let p = find(
            &samples,
            "CGPU_PROCESS_FB_USED",
            &[("container", id), ("pid", &pid)],
        )
        .unwrap();
        assert_eq!(
            p.value,
            f.processes[c.process].used.load(Acquire) as f64 / MIB as f64
        );
    }
    assert_eq!(
        find(&samples, "CGPU_FB_USED", &[("container", "alpha")])
            .unwrap()
            .value,
        1000.5
    );
    let bad = find(&samples, "CGPU_LEDGER_UP", &[("status", "corrupt")]).unwrap();
    assert_eq!(bad.value, 0.0);
    assert!(bad.labels["path"].ends_with("GPU-bad.ledger"));
    // after a second the utilisation is there too
    std::thread::sleep(std::time::Duration::from_millis(1300));
    let (_, body) = scrape(&addr, "/metrics");
    let (samples, _) = parse_prometheus(&body).unwrap();
    let u = find(&samples, "CGPU_UTIL", &[("container", "alpha")]).expect("CGPU_UTIL");
    assert!((0.0..=100.0).contains(&u.value));
    let (head, _) = scrape(&addr, "/nope");
    assert!(head.starts_with("HTTP/1.1 404"), "{head}");
    drop(child);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The parser the exporter's tests rely on does reject bad text (so a
/// scrape that parses is well-formed, not merely accepted).
#[test]
fn prometheus_parser_rejects_garbage() {
    for bad in [
        "# TYPE CGPU_X gauge\nCGPU_X{a=\"1} 1\n",     // unterminated
        "# TYPE CGPU_X gauge\nCGPU_X{a=1} 1\n",       // unquoted
        "# TYPE CGPU_X gauge\nCGPU_X{a=\"1\"} one\n", // bad value
        "# TYPE 1X gauge\n",
    ] {
        assert!(parse_prometheus(bad).is_err(), "{bad}");
    }
    let (s, t) = parse_prometheus("# TYPE A gauge\nA{x=\"a\\\"b\"} 2.5\n").unwrap();
    assert_eq!(s[0].labels["x"], "a\"b");
    assert_eq!(s[0].value, 2.5);
    assert_eq!(t["A"], "gauge");
}

#[test]
fn tree_inspect_version_gc() {
    let dir = tmpdir("tree");
    let a = start(
        &dir,
        spec("GPU-x0", 0, "012b2edccd7a", 6 * GIB, 1, 200278016),
    );
    let b = start(&dir, spec("GPU-x0", 0, "0852a381c0cf", 3 * GIB, 2, 0));
    let _c = start(&dir, spec("GPU-x1", 1, "0852a381c0cf", 4 * GIB, 1, 0));

    let o = run(ctl(), &dir, &["tree", "--flat"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let t = stdout(&o);
    for want in [
        "0/free_weight: 13".to_owned(),
        "0/max_inst: 16".to_owned(),
        "0/policy: 2".to_owned(), // a weight > 1 switched it (no explicit policy)
        "1/policy: 1".to_owned(),
        "0/prio_ratio: 80".to_owned(),
        "0/012b2edccd7a/id: 012b2edccd7a".to_owned(),
        "0/012b2edccd7a/highprio: 0".to_owned(),
        format!("0/012b2edccd7a/memsize: {}", 6 * GIB),
        format!("0/012b2edccd7a/meminfo: Free: {}", 6 * GIB - 200278016),
        format!("0/012b2edccd7a/meminfo: PID: {} Mem: 200278016", a.pid),
        "0/0852a381c0cf/weight: 2".to_owned(),
        format!("1/0852a381c0cf/memsize: {}", 4 * GIB),
        "default_memsize: 0".to_owned(),
        format!(
            "version: {} (ledger format {})",
            env!("CARGO_PKG_VERSION"),
            cgpu_ledger::FORMAT_VERSION
        ),
    ] {
        assert!(t.lines().any(|l| l == want), "missing `{want}` in:\n{t}");
    }
    let o = run(ctl(), &dir, &["tree"]);
    let t = stdout(&o);
    assert!(
        t.contains("├── 0/") && t.contains("│   ├── 012b2edccd7a/"),
        "{t}"
    );

    let o = run(ctl(), &dir, &["inspect"]);
    assert!(o.status.success());
    let t = stdout(&o);
    assert!(
        t.contains("GPU0(Allocated/Total)") && t.contains("GPU1(Allocated/Total)"),
        "{t}"
    );
    assert!(t.contains(" 9/16 ") && t.contains(" 4/16 "), "{t}");
    assert!(
        t.ends_with("Allocated/Total GPU Memory In Cluster:\n13/32 (40%)\n"),
        "{t}"
    );
    let o = run(ctl(), &dir, &["inspect", "-d"]);
    let t = stdout(&o);
    let line = t.lines().find(|l| l.starts_with("0852a381c0cf")).unwrap();
    assert_eq!(
        line.split_whitespace().collect::<Vec<_>>(),
        ["0852a381c0cf", "3", "4"]
    );

    let o = run(ctl(), &dir, &["version"]);
    let t = stdout(&o);
    let v = cgpu_ledger::FORMAT_VERSION;
    assert!(t.contains(&format!("ledger format: {v}")), "{t}");
    assert!(t.contains(&format!("GPU-x1.ledger: format {v}")), "{t}");

    // gc: a killed client's slot and bytes are reaped and reported
    let (pid, bslot) = (a.pid, a.container);
    a.kill9();
    let o = run(ctl(), &dir, &["gc"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let t = stdout(&o);
    assert!(
        t.contains("GPU 0 (GPU-x0): reaped 1 process slot(s)"),
        "{t}"
    );
    assert!(
        t.contains(&format!(
            "pid {pid} of container 012b2edccd7a (200278016 bytes)"
        )),
        "{t}"
    );
    assert!(
        t.contains("container 012b2edccd7a (no live process left)"),
        "{t}"
    );
    let l = ledger(&dir, "GPU-x0");
    assert!(
        l.find_container("012b2edccd7a").is_none(),
        "container freed"
    );
    assert_eq!(l.file().containers[bslot].state.load(Acquire), 0);
    assert!(l.find_container("0852a381c0cf").is_some(), "live one kept");
    let o = run(ctl(), &dir, &["gc"]);
    assert!(stdout(&o).contains("nothing to reap"), "{}", stdout(&o));
    drop(b);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The tools link the interposer crate as an rlib; they must not export its hooks (a
/// `dlsym` exported from an executable would catch every library it loads).
#[test]
fn the_tools_export_no_hooks() {
    for exe in [
        env!("CARGO_BIN_EXE_cgpu-smi"),
        env!("CARGO_BIN_EXE_cgpuctl"),
    ] {
        let o = std::process::Command::new("nm")
            .args(["-D", "--defined-only", exe])
            .output()
            .expect("nm (binutils)");
        assert!(o.status.success(), "nm {exe}");
        let syms = String::from_utf8_lossy(&o.stdout);
        let leaked: Vec<&str> = syms
            .lines()
            .filter_map(|l| l.split_whitespace().last())
            .filter(|n| *n == "dlsym" || n.starts_with("cu") || n.starts_with("nvml"))
            .collect();
        assert!(leaked.is_empty(), "{exe} exports {leaked:?}");
    }
}

/// `--loop` periods that cannot be meant (a crash at 1e308, a busy loop at
/// 1e-9 before) and ledger directories that do not exist (an empty listing
/// and exit 0 before): a message naming the value and exit status 2, at once.
#[test]
fn absurd_intervals_and_missing_directories_are_usage_errors() {
    let dir = tmpdir("bad-args");
    let file = dir.join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let missing = dir.join("no-such-dir");
    let missing_s = missing.to_str().unwrap();
    let file_s = file.to_str().unwrap();
    for (what, o, want) in [
        (
            "-l 1e308",
            run(smi(), &dir, &["-l", "1e308"]),
            "out of range",
        ),
        ("-l 1e-9", run(smi(), &dir, &["-l", "1e-9"]), "out of range"),
        (
            "-l 0.05",
            run(smi(), &dir, &["--loop", "0.05"]),
            "out of range",
        ),
        (
            "-l inf",
            run(smi(), &dir, &["-l", "inf"]),
            "not a number of seconds",
        ),
        (
            "-l nan",
            run(smi(), &dir, &["-l", "nan"]),
            "not a number of seconds",
        ),
        (
            "-l -1",
            run(smi(), &dir, &["-l", "-1"]),
            "not a number of seconds",
        ),
        (
            "smi --dir missing",
            run(smi(), &missing, &["--instant"]),
            "does not exist",
        ),
        (
            "smi --dir file",
            run(smi(), &file, &["--instant"]),
            "is not a directory",
        ),
        (
            "smi CGPU_LEDGER_DIR missing",
            smi()
                .arg("--instant")
                .env("CGPU_LEDGER_DIR", &missing)
                .output()
                .unwrap(),
            "(from CGPU_LEDGER_DIR) does not exist",
        ),
        (
            "ctl --dir missing tree",
            run(ctl(), &missing, &["tree"]),
            "does not exist",
        ),
        (
            "ctl --dir missing exporter",
            run(ctl(), &missing, &["exporter", "--listen", "127.0.0.1:0"]),
            "does not exist",
        ),
        (
            "ctl --dir file get",
            run(ctl(), &file, &["get", "policy"]),
            "is not a directory",
        ),
    ] {
        assert_eq!(o.status.code(), Some(2), "{what}: {}", stderr(&o));
        let e = stderr(&o);
        assert!(e.contains(want), "{what}: {e}");
        assert!(stdout(&o).is_empty(), "{what}: {}", stdout(&o));
        if what.contains("missing") {
            assert!(e.contains(missing_s), "{what} names the directory: {e}");
        }
        if what.contains("file") {
            assert!(e.contains(file_s), "{what} names the path: {e}");
        }
    }
    // The shortest period is accepted and prints a sample per period.
    let mut c = smi();
    c.arg("--dir")
        .arg(&dir)
        .args(["--json", "-l", "0.1"])
        .stdout(std::process::Stdio::piped());
    let mut child = KillOnDrop(c.spawn().unwrap());
    let mut lines = BufReader::new(child.0.stdout.take().unwrap()).lines();
    for _ in 0..3 {
        let l = lines.next().unwrap().unwrap();
        let v: Value = serde_json::from_str(&l).unwrap();
        assert_eq!(v["gpus"].as_array().map(Vec::len), Some(0), "{l}");
    }
    drop(child);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `cgpuctl version` reads the version out of the library file it finds (or
/// is given), stripped or not: a library carrying another version says so.
#[test]
fn version_is_read_from_the_installed_library() {
    let lib = &cgpu_testkit::artifacts().libcgpu;
    let dir = tmpdir("version");
    let o = run(ctl(), &dir, &["version", "--lib", lib.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v = env!("CARGO_PKG_VERSION");
    assert!(
        stdout(&o).contains(&format!("library: {} {v}\n", lib.display())),
        "{}",
        stdout(&o)
    );
    // The same library, stripped and carrying another version string.
    let other = dir.join("libcgpu.so");
    let st = std::process::Command::new("objcopy")
        .arg("--strip-all")
        .arg(lib)
        .arg(&other)
        .status()
        .expect("objcopy (binutils)");
    assert!(st.success());
    let mut bytes = std::fs::read(&other).unwrap();
    let tag = cgpu_ledger::VERSION_TAG.as_bytes();
    let at = bytes
        .windows(tag.len())
        .position(|w| w == tag)
        .expect("tag in the stripped library");
    let fake = format!("\0cgpu-library-version={}\0", "9".repeat(v.len()));
    bytes[at..at + tag.len()].copy_from_slice(fake.as_bytes());
    std::fs::write(&other, &bytes).unwrap();
    let o = run(ctl(), &dir, &["version", "--lib", other.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains(&format!(
            "library: {} {} (the tools are {v})\n",
            other.display(),
            "9".repeat(v.len())
        )),
        "{}",
        stdout(&o)
    );
    // Not a cgpu library: said, and exit 1.
    let not_lib = dir.join("libnot.so");
    std::fs::write(&not_lib, b"\x7fELF and nothing of ours").unwrap();
    let o = run(
        ctl(),
        &dir,
        &["version", "--lib", not_lib.to_str().unwrap()],
    );
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(
        stdout(&o).contains("no cgpu version in it"),
        "{}",
        stdout(&o)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
