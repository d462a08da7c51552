//! Measures every scheduling scenario (the table in
//! `tests/sched_support/scenarios.rs`, the same one `cargo test --test sched`
//! asserts over short windows) over long windows on the simulated driver,
//! and prints target, achieved and error per row. Utilisation, throughput
//! and latency rows compare cgpu with the same processes run without it,
//! in the same run.
//!
//!     cargo run --release --example share                  # every scenario, 6 s windows
//!     cargo run --release --example share -- 10            # 10 s windows
//!     cargo run --release --example share -- 6 sync-heavy  # scenarios whose name contains "sync-heavy"
//!
//! Shares come from the sim's ground truth (per-process device time from
//! `cgpu-sim-stat --json`), processes are real clients under
//! `LD_PRELOAD=libcgpu.so`, one simulated GPU per scenario.

#[path = "../tests/sched_support/mod.rs"]
mod sched_support;

use sched_support::scenarios::{self, Kind, Opts, Row, Rows};

fn main() {
    let secs: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(6);
    let filter = std::env::args().nth(2).unwrap_or_default();
    let o = Opts::long(secs);
    eprintln!("building and measuring ({secs} s windows)...");
    let mut rows: Vec<Row> = Vec::new();
    for spec in scenarios::table() {
        if !spec.name.contains(filter.as_str()) {
            continue;
        }
        let mut r = Rows::new(spec.name, true);
        (spec.run)(&o, &mut r);
        rows.extend(r.rows);
    }
    println!("| scenario | measure | target | achieved | error |");
    println!("|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {:.4} | {} |",
            r.scenario,
            r.what,
            r.target_str(),
            r.achieved,
            if r.kind == Kind::Info {
                "—".to_string()
            } else {
                format!("{:.2}%", r.err() * 100.0)
            }
        );
    }
    let shares: Vec<&Row> = rows.iter().filter(|r| r.kind == Kind::Share).collect();
    let worst = shares.iter().map(|r| r.err()).fold(0.0, f64::max);
    let missed: Vec<&Row> = rows
        .iter()
        .filter(|r| matches!(r.kind, Kind::AtLeast | Kind::AtMost) && r.err() > 0.0)
        .collect();
    println!(
        "\nworst share error: {:.2}% ({} share rows); bounds missed: {} of {} ({secs} s windows)",
        worst * 100.0,
        shares.len(),
        missed.len(),
        rows.iter()
            .filter(|r| matches!(r.kind, Kind::AtLeast | Kind::AtMost))
            .count(),
    );
    for r in missed {
        println!(
            "  missed: {} / {}: {:.4} against {}",
            r.scenario,
            r.what,
            r.achieved,
            r.target_str()
        );
    }
}
