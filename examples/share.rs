//! Measures every scheduling scenario over long windows on the
//! simulated driver and prints target, achieved and error per row, plus the
//! GPU's utilisation where the policy is work-conserving.
//!
//!     cargo run --release --example share            # all scenarios, 6 s windows
//!     cargo run --release --example share -- 10      # 10 s windows
//!
//! Shares come from the sim's ground truth (per-process device time from
//! `cgpu-sim-stat --json`), processes are real `cuclient`s under
//! `LD_PRELOAD=libcgpu.so`, one simulated GPU per scenario.

#[path = "../tests/sched_support/mod.rs"]
mod sched_support;

use sched_support::*;
use std::time::Duration;

const MS: u64 = 1_000_000;

struct Row {
    scenario: String,
    what: String,
    target: f64,
    achieved: f64,
    /// "≥" rows only count a shortfall as error.
    at_least: bool,
}

impl Row {
    fn err(&self) -> f64 {
        if self.at_least && self.achieved >= self.target {
            0.0
        } else {
            rel_err(self.achieved, self.target)
        }
    }
}

fn main() {
    let secs: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(6);
    let window = Duration::from_secs(secs);
    let warm = Duration::from_millis(1000);
    let run_ms = (secs + 4) * 1000;
    let mut rows: Vec<Row> = Vec::new();
    let push =
        |rows: &mut Vec<Row>, sc: &str, what: &str, target: f64, achieved: f64, at_least: bool| {
            let r = Row {
                scenario: sc.into(),
                what: what.into(),
                target,
                achieved,
                at_least,
            };
            eprintln!(
                "  {:<44} {:<22} {}{:>7.4} {:>9.4} {:>6.2}%",
                r.scenario,
                r.what,
                if at_least { "≥" } else { " " },
                r.target,
                r.achieved,
                r.err() * 100.0
            );
            rows.push(r);
        };
    let start = |ctrs: &[Ctr], policy: u32, max_inst: Option<u32>, prio: Option<u32>| {
        let s = Scenario::start(ctrs);
        let l = s.ledger();
        if let Some(m) = max_inst {
            l.set_max_inst(m).unwrap();
        }
        if let Some(p) = prio {
            l.set_prio_ratio(p).unwrap();
        }
        l.set_policy(policy).unwrap();
        std::thread::sleep(warm);
        s
    };
    eprintln!("building and measuring ({secs} s windows)...");

    for (name, ns) in [("1 ms", MS), ("50 µs", 50_000), ("20 ms", 20 * MS)] {
        let sc = format!("policy 2, weights 1:2, {name} kernels");
        let s = start(
            &[
                Ctr::new("w1", 1).busy(run_ms, ns),
                Ctr::new("w2", 2).busy(run_ms, ns),
            ],
            2,
            None,
            None,
        );
        let m = s.measure(window);
        push(
            &mut rows,
            &sc,
            "w1 share",
            1.0 / 3.0,
            m.of_busy("w1"),
            false,
        );
        push(
            &mut rows,
            &sc,
            "w2 share",
            2.0 / 3.0,
            m.of_busy("w2"),
            false,
        );
        push(
            &mut rows,
            &sc,
            "w2/w1 ratio",
            2.0,
            m.of_busy("w2") / m.of_busy("w1"),
            false,
        );
        push(&mut rows, &sc, "utilisation", 0.97, m.utilisation(), true);
    }
    {
        let sc = "policy 2, weights 1:1:2:4, all busy";
        let s = start(
            &[
                Ctr::new("a", 1).busy(run_ms, MS),
                Ctr::new("b", 1).busy(run_ms, MS),
                Ctr::new("c", 2).busy(run_ms, MS),
                Ctr::new("d", 4).busy(run_ms, MS),
            ],
            2,
            None,
            None,
        );
        let m = s.measure(window);
        for (id, t) in [("a", 0.125), ("b", 0.125), ("c", 0.25), ("d", 0.5)] {
            push(
                &mut rows,
                sc,
                &format!("{id} (w {}) share", (t * 8.0) as u32),
                t,
                m.of_busy(id),
                false,
            );
        }
        push(&mut rows, sc, "utilisation", 0.97, m.utilisation(), true);
    }
    {
        let sc = "policy 1, three busy";
        let s = start(
            &[
                Ctr::new("a", 1).busy(run_ms, MS),
                Ctr::new("b", 1).busy(run_ms, MS),
                Ctr::new("c", 1).busy(run_ms, MS),
            ],
            1,
            None,
            None,
        );
        let m = s.measure(window);
        for id in ["a", "b", "c"] {
            push(
                &mut rows,
                sc,
                &format!("{id} share"),
                1.0 / 3.0,
                m.of_busy(id),
                false,
            );
        }
        push(&mut rows, sc, "utilisation", 0.97, m.utilisation(), true);
    }
    {
        let sc = "policy 1, one busy, one idle";
        let s = start(
            &[
                Ctr::new("busy", 1).busy(run_ms, MS),
                Ctr::new("idle", 1).idle(),
            ],
            1,
            None,
            None,
        );
        let m = s.measure(window);
        push(&mut rows, sc, "busy of GPU", 0.97, m.of_wall("busy"), true);
    }
    {
        let sc = "policy 2, 1:2, weight-2 alive but idle";
        let s = start(
            &[Ctr::new("w1", 1).busy(run_ms, MS), Ctr::new("w2", 2).idle()],
            2,
            None,
            None,
        );
        let m = s.measure(window);
        push(
            &mut rows,
            sc,
            "w1 of GPU (≤ 1/3)",
            1.0 / 3.0,
            m.of_wall("w1"),
            false,
        );
    }
    {
        let sc = "policy 0, max_inst 4, one container alone";
        let s = start(&[Ctr::new("solo", 1).busy(run_ms, MS)], 0, Some(4), None);
        let m = s.measure(window);
        push(&mut rows, sc, "solo of GPU", 0.25, m.of_wall("solo"), false);
    }
    {
        let sc = "policy 3, weight 3, max_inst 10";
        let s = start(&[Ctr::new("fixed", 3).busy(run_ms, MS)], 3, Some(10), None);
        let m = s.measure(window);
        push(
            &mut rows,
            sc,
            "fixed of GPU",
            0.30,
            m.of_wall("fixed"),
            false,
        );
    }
    {
        let sc = "high priority, prio_ratio 80, policy 1";
        let hp_ms = (1000 + secs * 1000 + 500).to_string();
        let s = start(
            &[
                Ctr::new("hp", 1)
                    .highprio()
                    .cmd(&["init", "ready", "spin_for", &hp_ms, "1000000", "hold"]),
                Ctr::new("normal", 1).busy(run_ms + secs * 1000 + 2000, MS),
            ],
            1,
            None,
            Some(80),
        );
        let m = s.measure(window);
        push(
            &mut rows,
            sc,
            "hp share (busy)",
            0.80,
            m.of_busy("hp"),
            false,
        );
        push(
            &mut rows,
            sc,
            "normal share",
            0.20,
            m.of_busy("normal"),
            false,
        );
        push(&mut rows, sc, "utilisation", 0.97, m.utilisation(), true);
        std::thread::sleep(Duration::from_millis(1500));
        let m = s.measure(window);
        push(
            &mut rows,
            sc,
            "normal of GPU, hp idle",
            0.97,
            m.of_wall("normal"),
            true,
        );
    }
    {
        let sc = "policy 5 -> 2 while running, 1:2";
        let s = start(
            &[
                Ctr::new("w1", 1).busy(run_ms + 3000, MS),
                Ctr::new("w2", 2).busy(run_ms + 3000, MS),
            ],
            5,
            None,
            None,
        );
        let m = s.measure(Duration::from_secs(2));
        push(
            &mut rows,
            sc,
            "w1 share, native",
            0.5,
            m.of_busy("w1"),
            false,
        );
        s.ledger().set_policy(2).unwrap();
        std::thread::sleep(Duration::from_secs(1));
        let m = s.measure(window);
        push(
            &mut rows,
            sc,
            "w1 share, from +1 s",
            1.0 / 3.0,
            m.of_busy("w1"),
            false,
        );
        push(
            &mut rows,
            sc,
            "w2 share, from +1 s",
            2.0 / 3.0,
            m.of_busy("w2"),
            false,
        );
    }

    println!("| scenario | measure | target | achieved | error |");
    println!("|---|---|---|---|---|");
    for r in &rows {
        println!(
            "| {} | {} | {}{:.4} | {:.4} | {:.2}% |",
            r.scenario,
            r.what,
            if r.at_least { "≥ " } else { "" },
            r.target,
            r.achieved,
            r.err() * 100.0
        );
    }
    let worst = rows.iter().map(Row::err).fold(0.0, f64::max);
    println!(
        "\nworst error: {:.2}% ({} rows, {secs} s windows)",
        worst * 100.0,
        rows.len()
    );
}
