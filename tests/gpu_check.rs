//! Runs the real-GPU validation script, `scripts/gpu-check.sh`, end to end on
//! the simulated driver (`--sim --quick`: the driver-API fallback through
//! `cuda-bindings`, NVML through `nvidia-ml-py`), so that its first run on a
//! real GPU does not fail on a typo, and reads its table.
//!
//! Every row must be there and none may come from a crashed or timed-out
//! check program. Rows whose feature has landed must PASS; `MUST_PASS` grows
//! as the memory hooks and the scheduler land on main.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Instant;

/// Every row the script reports in `--sim` mode (driver-API backend, no
/// CuPy/JAX in the test venv: 6a and 6c are SKIP rows).
const ALL_ROWS: &[&str] = &[
    "1a", "1b", "1c", "1d", "1e", "1f", "1g", "2a", "2b", "2c", "2d", "3a", "3b", "3c", "4a", "4b",
    "5", "6a", "6c",
];

/// Rows that must PASS with what is on main now: the memory view, quota and
/// sharing rows (memory hooks landed), an idle container costing a busy one
/// nothing, and the overhead bound. 4a (weights 1:2) joins when the scheduler
/// lands.
const MUST_PASS: &[&str] = &[
    "1a", "1b", "1c", "1d", "1e", "1f", "1g", "2a", "2b", "2c", "2d", "3a", "3b", "3c", "4b", "5",
];

#[derive(Debug)]
struct Row {
    name: String,
    expected: String,
    measured: String,
    status: String,
}

#[test]
fn gpu_check_script_runs_on_the_sim() {
    let art = cgpu_testkit::artifacts();
    let deps = cgpu_testkit::test_deps();
    let root = cgpu_testkit::workspace_root();
    let out_dir = cgpu_testkit::target_dir().join(format!("gpu-check-test-{}", std::process::id()));
    std::fs::create_dir_all(&out_dir).unwrap();
    let log = out_dir.join("gpu-check.log");
    let tsv = out_dir.join("results.tsv");

    let t0 = Instant::now();
    let out = Command::new("bash")
        .arg(root.join("scripts/gpu-check.sh"))
        .arg("--sim")
        .arg("--quick")
        .arg("--lib")
        .arg(&art.libcgpu)
        .arg("--sim-lib")
        .arg(&art.libsim)
        .arg("--python")
        .arg(&deps.python)
        .arg("--log")
        .arg(&log)
        .arg("--results")
        .arg(&tsv)
        // our own environment must not leak into the script's containers
        .env_remove("LD_PRELOAD")
        .env_remove("CGPU_SIM_GPUS")
        .env_remove("CGPU_SIM_STATE")
        .output()
        .expect("run scripts/gpu-check.sh");
    let secs = t0.elapsed().as_secs_f64();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let log_text = std::fs::read_to_string(&log).unwrap_or_default();
    println!("{stdout}");
    println!(
        "gpu-check --sim --quick took {secs:.1} s (log {})",
        log.display()
    );
    let context = || {
        format!(
            "--- stdout\n{stdout}\n--- stderr\n{}\n--- log\n{log_text}",
            String::from_utf8_lossy(&out.stderr)
        )
    };

    let text = std::fs::read_to_string(&tsv)
        .unwrap_or_else(|e| panic!("no results file {}: {e}\n{}", tsv.display(), context()));
    let mut rows: BTreeMap<String, Row> = BTreeMap::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        let f: Vec<&str> = line.split('\t').collect();
        assert_eq!(f.len(), 4, "malformed result line {line:?}\n{}", context());
        let id = f[0].split_whitespace().next().unwrap_or("").to_string();
        let row = Row {
            name: f[0].into(),
            expected: f[1].into(),
            measured: f[2].into(),
            status: f[3].into(),
        };
        assert!(
            ["PASS", "FAIL", "SKIP"].contains(&row.status.as_str()),
            "bad status in {row:?}"
        );
        assert!(
            rows.insert(id.clone(), row).is_none(),
            "row {id} reported twice\n{}",
            context()
        );
    }

    // The script ran to the end: the header, every row, no setup failure, no
    // crashed, timed-out or skipped-for-time check program.
    assert!(
        stdout.contains("GPU:") && stdout.contains("Tesla T4"),
        "header without GPU\n{}",
        context()
    );
    assert!(
        stdout.contains("driver:"),
        "header without driver\n{}",
        context()
    );
    for id in ALL_ROWS {
        assert!(rows.contains_key(*id), "row {id} missing\n{}", context());
    }
    for (id, r) in &rows {
        assert!(
            ALL_ROWS.contains(&id.as_str()),
            "unexpected row {id}: {r:?}\n{}",
            context()
        );
        for bad in ["crashed", "timed out", "not run", "error:", "exit status"] {
            assert!(
                !r.measured.contains(bad),
                "row {id} is a broken check, not a measurement: {r:?}\n{}",
                context()
            );
        }
    }
    assert_eq!(rows["6a"].status, "SKIP", "CuPy is not in the test venv");
    assert_eq!(rows["6c"].status, "SKIP", "JAX is not in the test venv");

    // What has landed passes.
    for id in MUST_PASS {
        let r = &rows[*id];
        assert_eq!(
            r.status,
            "PASS",
            "row {id} must pass: {} (expected {}, measured {})\n{}",
            r.name,
            r.expected,
            r.measured,
            context()
        );
    }

    // The exit status agrees with the table.
    let any_fail = rows.values().any(|r| r.status == "FAIL");
    assert_eq!(
        out.status.code(),
        Some(if any_fail { 1 } else { 0 }),
        "exit status vs table\n{}",
        context()
    );
    let _ = std::fs::remove_dir_all(&out_dir);
}
