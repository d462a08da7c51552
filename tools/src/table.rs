//! The `cgpu-smi` table (the layout of cGPU's `cgpu-smi`).

use super::{mib, Report, CGPU_VERSION};
use cgpu_ledger::FORMAT_VERSION;
use std::fmt::Write;

const SEP: &str = "+---+----------------+----------+----------------+-----------------------+";
const SEP2: &str = "+===+================+==========+================+=======================+";
/// Width between the outer `|`s.
const INNER: usize = SEP.len() - 2;

/// Fit `s` in `w` characters (truncated with `~` when longer).
fn fit(s: &str, w: usize) -> String {
    if s.chars().count() <= w {
        s.to_owned()
    } else {
        let mut t: String = s.chars().take(w.saturating_sub(1)).collect();
        t.push('~');
        t
    }
}

/// A line spanning the whole table.
fn wide(out: &mut String, s: &str) {
    let _ = writeln!(out, "|{:<w$}|", fit(s, INNER), w = INNER);
}

/// Render the table. `detail` adds per-process lines (cGPU's `meminfo`).
///
/// With a fresh status from `cgpu-agent`, a container whose memory on the
/// device differs from what the ledger counts gets a line saying what the
/// device holds, and each container over its quota by the device's numbers
/// a marker line (`! GPU container: …`) under the table. A stale status is
/// one line saying so; no status, nothing.
pub fn render(r: &Report, detail: bool) -> String {
    let mut out = String::new();
    let agent = r.agent.as_ref().filter(|a| !a.stale);
    let title = format!("  cgpu {CGPU_VERSION}");
    let _ = writeln!(
        out,
        "|{title:<36}ledger format: {FORMAT_VERSION}   mode: {}",
        r.mode
    );
    let _ = writeln!(out, "{SEP}");
    let _ = writeln!(
        out,
        "|GPU|       pod      | highprio | GPU-Util/Limit | GPU Memory Usage/Total|"
    );
    let _ = writeln!(out, "{SEP2}");
    if r.gpus.is_empty() {
        // Where it looked, and the two reasons there may be nothing there.
        wide(&mut out, &format!(" no ledgers in {}", r.ledger_dir));
        wide(
            &mut out,
            " (a ledger appears when a job under libcgpu.so first uses a GPU;",
        );
        wide(
            &mut out,
            "  jobs that mount another directory: cgpu-smi --dir DIR)",
        );
    }
    for e in &r.gpus {
        let Some(g) = &e.gpu else {
            let name = std::path::Path::new(&e.path)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| e.path.clone());
            let why = e.error.as_deref().unwrap_or("unreadable");
            wide(&mut out, &format!("  ?| {name}: {why}"));
            continue;
        };
        if g.containers.is_empty() {
            let _ = writeln!(
                out,
                "|{:>3}| {:<15}|{:^10}|{:^16}|{:>21}  |",
                g.index,
                "(no containers)",
                "-",
                "-",
                format!("-/{}", mib(g.physical_total_bytes))
            );
        }
        for c in &g.containers {
            let util = match c.util_percent {
                Some(u) => format!("{:>3}", u.round() as u64),
                None => "  -".to_owned(),
            };
            let _ = writeln!(
                out,
                "|{:>3}| {:<15}|{:^10}|{:^16}|{:>21}  |",
                g.index,
                fit(&c.id, 15),
                u8::from(c.highprio),
                format!("{util}/{:>3}", c.limit_percent),
                format!("{}/{}", mib(c.used_bytes), mib(c.total_bytes)),
            );
            if let Some(d) = agent.and_then(|a| a.container(&g.uuid, &c.id)) {
                if mib(d.device_bytes) != mib(c.used_bytes) {
                    wide(
                        &mut out,
                        &format!(
                            "   the device holds {} MiB (cgpu-agent)",
                            mib(d.device_bytes)
                        ),
                    );
                }
            }
            // A container held back for lack of weight is always shown as
            // such; one waiting for its turn only in the detailed view.
            if let Some(w) = c.waiting.as_deref().filter(|_| detail || c.weight == 0) {
                wide(&mut out, &format!("   {w}"));
            }
            if detail {
                let _ = writeln!(
                    out,
                    "|   |   weight {:<6}| {:<9}|{:^16}| {:<22}|",
                    c.weight,
                    if c.enforce { "enforced" } else { "disabled" },
                    format!("held {:.1}s", c.throttled_ns as f64 / 1e9),
                    format!("Free: {} MiB", mib(c.free_bytes)),
                );
                for p in &c.processes {
                    let pid = if p.alive {
                        format!("PID {}", p.pid)
                    } else {
                        format!("PID {} dead", p.pid)
                    };
                    let _ = writeln!(
                        out,
                        "|   |   {:<13}|          |{:^16}|{:>21}  |",
                        fit(&pid, 13),
                        // per-process GPU time only where the scheduler records it
                        if p.gpu_time_ns > 0 {
                            format!("gpu {:.1}s", p.gpu_time_ns as f64 / 1e9)
                        } else {
                            String::new()
                        },
                        format!("{} MiB", mib(p.used_bytes)),
                    );
                }
            }
        }
    }
    let _ = writeln!(out, "{SEP}");
    match &r.agent {
        Some(a) if a.stale => {
            let _ = writeln!(
                out,
                "cgpu-agent status {} is stale (written {} s ago): the device's numbers are not shown",
                a.path,
                a.age_ms / 1000
            );
        }
        Some(a) => {
            for c in a.over() {
                let _ = writeln!(out, "{}", crate::agent::over_line(c));
            }
            for e in &a.gpu_errors {
                let _ = writeln!(out, "cgpu-agent could not check {e}");
            }
        }
        None => {}
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::super::*;
    use super::*;

    #[test]
    fn seed_row_layout() {
        let mut f = fake_file(0, "GPU-aaaa", 16 * GIB);
        add_container(&mut f, 0, "7db8fff70a0d", 11463 * MIB, 9459 * MIB, 1);
        add_process(&mut f, 0, 0, 19772, 9459 * MIB);
        let mut g = read_file(&f, &|_| true).unwrap();
        g.containers[0].util_percent = Some(41.0);
        g.containers[0].limit_percent = 50;
        let r = Report {
            schema_version: 1,
            cgpu_version: "0.1.0".into(),
            ledger_format: 1,
            ledger_dir: "/x".into(),
            timestamp_ns: 0,
            util_window_ms: Some(1000),
            agent: None,
            mode: crate::cooperative(),
            gpus: vec![
                GpuEntry {
                    path: "x".into(),
                    status: Status::Ok,
                    error: None,
                    gpu: Some(g),
                },
                GpuEntry {
                    path: "/x/GPU-b.ledger".into(),
                    status: Status::Corrupt,
                    error: Some("corrupt ledger: bad magic".into()),
                    gpu: None,
                },
            ],
        };
        let t = render(&r, false);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines[4],
            "|  0| 7db8fff70a0d   |    0     |     41/ 50     |           9459/11463  |"
        );
        assert!(lines[5].contains("GPU-b.ledger: corrupt ledger: bad magic"));
        assert_eq!(lines[5].len(), SEP.len());
        let d = render(&r, true);
        assert!(d.contains("PID 19772"), "{d}");
        assert!(d.contains("9459 MiB"), "{d}");
        for l in d.lines().skip(1) {
            assert_eq!(l.len(), SEP.len(), "{l}");
        }
    }

    /// No ledgers: the table says where it looked and why there may be none.
    #[test]
    fn no_ledgers_says_where_and_why() {
        let r = Report {
            schema_version: 1,
            cgpu_version: "0.1.0".into(),
            ledger_format: 1,
            ledger_dir: "/run/cgpu".into(),
            timestamp_ns: 0,
            util_window_ms: None,
            agent: None,
            mode: crate::cooperative(),
            gpus: vec![],
        };
        let t = render(&r, false);
        assert!(t.contains("no ledgers in /run/cgpu"), "{t}");
        assert!(t.contains("first uses a GPU"), "{t}");
        assert!(t.contains("cgpu-smi --dir DIR"), "{t}");
        for l in t.lines().skip(1) {
            assert_eq!(l.chars().count(), SEP.len(), "{l}");
        }
    }

    /// A container that waits because it has weight 0 is shown as waiting,
    /// with the reason; one waiting for its turn only with `-d`.
    #[test]
    fn waiting_containers_say_why() {
        use cgpu_ledger::words::container as cw;
        use std::sync::atomic::Ordering::Relaxed;
        let mut f = fake_file(0, "GPU-aaaa", 16 * GIB);
        add_container(&mut f, 0, "noweight", GIB, 0, 0);
        add_container(&mut f, 1, "turn", GIB, 0, 1);
        add_process(&mut f, 0, 0, 10, 0);
        add_process(&mut f, 1, 1, 11, 0);
        f.containers[0].sched[cw::WANT].store(1, Relaxed);
        f.containers[1].sched[cw::WANT].store(2, Relaxed);
        let g = read_file(&f, &|_| true).unwrap();
        assert_eq!(
            g.containers[0].waiting.as_deref(),
            Some(cgpu_ledger::words::Waiting::NoWeight.reason())
        );
        assert_eq!(
            g.containers[1].waiting.as_deref(),
            Some("waiting for its turn")
        );
        let r = Report {
            schema_version: 1,
            cgpu_version: "0.1.0".into(),
            ledger_format: 1,
            ledger_dir: "/x".into(),
            timestamp_ns: 0,
            util_window_ms: None,
            agent: None,
            mode: crate::cooperative(),
            gpus: vec![GpuEntry {
                path: "x".into(),
                status: Status::Ok,
                error: None,
                gpu: Some(g),
            }],
        };
        let t = render(&r, false);
        assert!(t.contains("waiting: weight 0 (free_weight was 0"), "{t}");
        assert!(!t.contains("waiting for its turn"), "{t}");
        for l in t.lines().skip(1) {
            assert_eq!(l.len(), SEP.len(), "{l}");
        }
        assert!(render(&r, true).contains("waiting for its turn"));
        let i = crate::inspect::render(&r, false, "h", "1.2.3.4", None);
        assert!(i.contains("GPU0 noweight: waiting: weight 0"), "{i}");
        assert!(!i.contains("turn"), "{i}");
    }
}
