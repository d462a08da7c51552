//! NVIDIA's CUDA runtime under `LD_PRELOAD=libcgpu.so`, on the simulated
//! driver: the same unmodified `libcudart.so.12`/`.13` program as the sim's
//! own test sees the container's quota, gets `cudaErrorMemoryAllocation`
//! past it, still runs kernels and graphs, and the runtime's private driver
//! tables reach it untouched (same tables, same functions, as without
//! cgpu: the runtime's integrity check hashes their addresses).

mod interpose_common;

use cgpu_testkit::{compile_cudart_client, cudart_rows, field, line, num, CudartRow};
use interpose_common::*;

const T4: &str = "15109:Tesla T4";
const CTX: u64 = 300 * MIB;
/// floor(15109 MiB × 6 / 15): a 6-of-15 GiB quota on a T4.
const QUOTA: u64 = 15109 * MIB * 6 / 15;
const VARS: &[(&str, &str)] = &[
    ("ALIYUN_COM_GPU_MEM_CONTAINER", "6"),
    ("ALIYUN_COM_GPU_MEM_DEV", "15"),
    ("CGPU_CONTAINER_ID", "cudart-a"),
];

fn client(row: &CudartRow) -> std::path::PathBuf {
    compile_cudart_client(&repo().join("tests/c/cudart_client.c"), row)
}

fn val<'a>(out: &'a str, cmd: &str, key: &str) -> &'a str {
    let l = line(out, cmd);
    field(l, key).unwrap_or_else(|| panic!("no {key} in `{l}`"))
}

#[test]
fn cudart_sees_the_quota_and_is_refused_past_it() {
    for row in cudart_rows() {
        let m = Machine::new("cudart", T4);
        let exe = client(&row);
        let out = run_ok(m.preloaded(&exe, VARS).args([
            "info",
            "meminfo",
            "malloc",
            "1048576",
            "malloc",
            "3000000000",
            "meminfo",
            "malloc",
            "7000000000",
            "roundtrip",
            "1000003",
            "launch",
            "1000000",
            "2",
            "graph",
            "500000",
            "2",
            "2",
            "symbol",
        ]));
        let v = row.major;
        assert_eq!(num(&out, "info", "runtime") / 1000, v as u64);
        // The quota is what the runtime sees as the device's memory.
        assert_eq!(num(&out, "info", "total"), QUOTA, "CUDA {v}: {out}");
        let totals: Vec<u64> = out
            .lines()
            .filter(|l| l.starts_with("meminfo "))
            .map(|l| field(l, "total").unwrap().parse().unwrap())
            .collect();
        assert_eq!(totals, [QUOTA, QUOTA], "CUDA {v}");
        let free = num(&out, "meminfo", "free");
        assert!(
            (QUOTA - CTX - 512..=QUOTA - CTX).contains(&free),
            "CUDA {v}: free {free} of {QUOTA}"
        );
        // 1 MiB and 3 GB fit; 7 GB is past the quota (not the device).
        let rcs: Vec<&str> = out
            .lines()
            .filter(|l| l.starts_with("malloc "))
            .map(|l| field(l, "rc").unwrap())
            .collect();
        assert_eq!(rcs, ["0", "0", "2"], "CUDA {v}: {out}");
        assert_eq!(num(&out, "roundtrip", "same"), 1);
        assert_eq!(num(&out, "graph", "after"), 0x5a);
        assert_eq!(num(&out, "symbol", "same"), 1);
        assert!(val(&out, "launch", "ms").parse::<f64>().unwrap() >= 1.0);
    }
}

#[test]
fn cudart_private_tables_pass_through_untouched() {
    for row in cudart_rows() {
        let m = Machine::new("cudart-tables", T4);
        let exe = client(&row);
        let bare = run_ok(m.bare(&exe).arg("tables"));
        let pre = run_ok(m.preloaded(&exe, VARS).arg("tables"));
        let v = row.major;
        for out in [&bare, &pre] {
            assert_eq!(val(out, "tables", "rc"), "0,0", "CUDA {v}: {out}");
            // cuGetExportTable as the runtime resolves it is the driver's own,
            // and so are the tables and the integrity function it returns.
            for k in ["resolver_lib", "cudart_table_lib", "integrity_fn_lib"] {
                assert_eq!(
                    val(out, "tables", k),
                    "libcuda.so.1",
                    "CUDA {v}: {k} in {out}"
                );
            }
        }
        for k in [
            "resolver_offset",
            "cudart_table_offset",
            "integrity_fn_offset",
        ] {
            assert_eq!(
                val(&bare, "tables", k),
                val(&pre, "tables", k),
                "CUDA {v}: {k} differs under libcgpu.so"
            );
        }
    }
}

/// Two copies of the runtime in one process (as PyTorch holds three: its own
/// and cuBLAS's and cuBLASLt's static ones), racing from two threads to
/// retain the one primary context: its reservation is charged once, both
/// copies see the same quota, and the ledger holds exactly the context plus
/// both allocations.
#[test]
fn two_runtime_copies_share_one_primary_context() {
    use std::io::Write;
    let rows = cudart_rows();
    let libs: Vec<String> = rows
        .iter()
        .map(|r| {
            r.lib_dir
                .join(format!("libcudart.so.{}", r.major))
                .display()
                .to_string()
        })
        .collect();
    let exe = cc(
        &repo().join("tests/c/cudart_two_copies.c"),
        "cudart_two_copies",
        &[],
        false,
    );
    const BYTES: u64 = 64 * MIB;
    for round in 0..3 {
        let m = Machine::new("cudart-two", T4);
        let mut c = m.preloaded(&exe, VARS);
        c.args([&libs[0], &libs[1], &BYTES.to_string()])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = c.spawn().unwrap();
        let lines =
            cgpu_testkit::read_until(&mut child, "holding", std::time::Duration::from_secs(60));
        let out = lines.join("\n");
        assert!(out.contains("holding"), "round {round}: {out}");
        let copies: Vec<&str> = lines
            .iter()
            .filter(|l| l.starts_with("copy "))
            .map(|l| l.as_str())
            .collect();
        assert_eq!(copies.len(), 2, "{out}");
        let get = |l: &str, k: &str| -> u64 { field(l, k).unwrap().parse().unwrap() };
        for l in &copies {
            assert_eq!(get(l, "rc_info"), 0, "{out}");
            assert_eq!(get(l, "rc_malloc"), 0, "{out}");
            assert_eq!(get(l, "total"), QUOTA, "{out}");
        }
        // One context reservation, whichever copy came first.
        let first = copies.iter().map(|l| get(l, "free_before")).max().unwrap();
        let last = copies.iter().map(|l| get(l, "free_after")).min().unwrap();
        assert_eq!(first, QUOTA - CTX, "round {round}: {out}");
        assert_eq!(last, QUOTA - CTX - 2 * BYTES, "round {round}: {out}");
        let l = cgpu::ledger::Ledger::open(&m.ledger_file().expect("a ledger")).unwrap();
        let ci = l.find_container("cudart-a").expect("the container");
        let used = l.file().containers[ci]
            .used
            .load(std::sync::atomic::Ordering::Acquire);
        assert_eq!(used, CTX + 2 * BYTES, "round {round}: ledger");
        child.stdin.take().unwrap().write_all(b"\n").unwrap();
        let o = wait_timeout(child, std::time::Duration::from_secs(60));
        assert!(o.status.success());
    }
}

/// A framework's teardown outlives the library's exit handler (PyTorch's
/// takes seconds): the ledger watcher must not take the slot the process
/// just gave up for a damaged ledger, report it "wiped" and register the
/// exiting process again. The client lingers 800 ms in an exit handler run
/// after the library's (the watcher checks every 250 ms).
#[test]
fn long_teardown_after_the_library_left_is_quiet() {
    let row = &cudart_rows()[0];
    let m = Machine::new("cudart-exit", T4);
    let exe = client(row);
    let o =
        run(m
            .preloaded(&exe, VARS)
            .args(["--linger-at-exit", "800", "info", "malloc", "1048576"]));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    for bad in ["wiped", "overwritten", "joined ledger", "re-registered"] {
        assert!(!err.contains(bad), "`{bad}` at exit:\n{err}");
    }
    let l = cgpu::ledger::Ledger::open(&m.ledger_file().expect("a ledger")).unwrap();
    if let Some(ci) = l.find_container("cudart-a") {
        assert_eq!(
            l.processes_of(ci).count(),
            0,
            "the exited process is not registered"
        );
    }
}
