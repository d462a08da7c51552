//! Calls to functions the sim only stubs are counted per name in the shared
//! state, summed over processes, and shown by `cgpu-sim-stat` (text and
//! `--json`).

use cgpu_sim::stat::{snapshot, Snapshot};
use cgpu_testkit::{artifacts, LinkMode, SimEnv};

fn stub_calls(s: &Snapshot, name: &str) -> u64 {
    s.stubs
        .iter()
        .find(|x| x.name == name)
        .map_or(0, |x| x.calls)
}

#[test]
fn stub_calls_are_counted_per_name_across_processes() {
    let env = SimEnv::new();
    // A scenario that uses only simulated functions hits no stub.
    let out = env.cuclient(LinkMode::Link, &["alloc", "4096", "array", "8", "8"]);
    assert!(out.contains("array ok"), "{out}");
    let s = snapshot(&env.state_dir).unwrap();
    assert!(s.stubs.is_empty(), "{:?}", s.stubs);

    // The legacy cuArrayCreate (32-bit descriptor) is only a stub in the sim.
    let out = env.cuclient(
        LinkMode::ProcAddr,
        &["array_v1", "8", "8", "array_v1", "8", "8"],
    );
    assert_eq!(out.matches("array_v1 err=801").count(), 2, "{out}");
    let out = env.cuclient(LinkMode::ProcAddr, &["array_v1", "4", "4"]);
    assert!(out.contains("array_v1 err=801"), "{out}");
    let s = snapshot(&env.state_dir).unwrap();
    assert_eq!(stub_calls(&s, "cuArrayCreate"), 3, "{:?}", s.stubs);
    assert_eq!(s.stubs.len(), 1, "{:?}", s.stubs);

    // The tool shows the same, in JSON and as text.
    let o = std::process::Command::new(&artifacts().sim_stat)
        .args(["--json", "--state"])
        .arg(&env.state_dir)
        .output()
        .unwrap();
    assert!(o.status.success());
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        j["stubs"],
        serde_json::json!([{"name": "cuArrayCreate", "calls": 3}])
    );
    let o = std::process::Command::new(&artifacts().sim_stat)
        .arg("--state")
        .arg(&env.state_dir)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("stubs called: 1 functions, 3 calls"),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.trim_start().starts_with("cuArrayCreate") && l.ends_with(" 3")),
        "{text}"
    );
}
