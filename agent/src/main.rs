//! `cgpu-agent`: checks, every interval, what each container really holds
//! on each GPU (NVML) against its quota (the GPU's ledger); reports and, by
//! policy, stops or kills the processes of a container over its quota.

use cgpu_agent::{status_json, write_atomic, Agent, Options, Policy};
use std::path::PathBuf;
use std::time::{Duration, Instant};

const USAGE: &str = "usage: cgpu-agent [--once] [--interval DURATION] [--ledger-dir DIR]
                  [--status-file PATH] [--policy report|stop|kill] [--include-host]

Every interval (default 500ms) reads what each process holds on each GPU
(NVML), maps it to its container and compares each container's sum with its
quota in the GPU's ledger. A container over its quota is logged (one line per
event), written to the status file (default <ledger dir>/agent.json) and, by
--policy, its processes not in the ledger (not under the library) are sent
SIGSTOP or SIGKILL, biggest first, until what is left fits the quota.
Processes outside any container are only judged with --include-host (then
named by the host rule: CGPU_CONTAINER_ID in their environment, else the
hostname).

--once: one pass, print the status JSON, exit 0 if every container is within
its quota, 3 if any is over, 1 if a GPU could not be checked.";

struct Args {
    once: bool,
    interval: Duration,
    status_file: Option<PathBuf>,
    opts: Options,
}

fn parse_duration(s: &str) -> Option<Duration> {
    let (num, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => s.split_at(i),
        None => (s, "ms"),
    };
    let n: u64 = num.parse().ok()?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "s" => Duration::from_secs(n),
        _ => return None,
    };
    (!d.is_zero()).then_some(d)
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        once: false,
        interval: Duration::from_millis(500),
        status_file: None,
        opts: Options {
            ledger_dir: PathBuf::new(),
            policy: Policy::Report,
            include_host: false,
        },
    };
    let mut ledger_dir = None;
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
            _ => (arg.clone(), None),
        };
        let mut value = |what: &str| {
            inline
                .clone()
                .or_else(|| it.next())
                .ok_or_else(|| format!("{flag} needs {what}"))
        };
        match flag.as_str() {
            "--once" => a.once = true,
            "--include-host" => a.opts.include_host = true,
            "--interval" => {
                let v = value("a duration (500ms, 1s)")?;
                a.interval = parse_duration(&v)
                    .ok_or_else(|| format!("--interval {v}: expected e.g. 500ms or 1s"))?;
            }
            "--ledger-dir" => ledger_dir = Some(PathBuf::from(value("a directory")?)),
            "--status-file" => a.status_file = Some(PathBuf::from(value("a path")?)),
            "--policy" => {
                let v = value("report, stop or kill")?;
                a.opts.policy = Policy::parse(&v)
                    .ok_or_else(|| format!("--policy {v}: expected report, stop or kill"))?;
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            _ => return Err(format!("unknown argument {arg}")),
        }
    }
    a.opts.ledger_dir = ledger_dir.unwrap_or_else(cgpu_ledger::Ledger::default_dir);
    if !a.opts.ledger_dir.is_absolute() {
        return Err(format!(
            "--ledger-dir {}: expected an absolute path",
            a.opts.ledger_dir.display()
        ));
    }
    Ok(a)
}

fn main() {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("cgpu-agent: {e}\n{USAGE}");
            std::process::exit(2);
        }
    };
    let mut agent = match Agent::new(args.opts.clone()) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("cgpu-agent: NVML is unavailable ({e}): the device's numbers cannot be read");
            std::process::exit(1);
        }
    };
    let status_file = args
        .status_file
        .clone()
        .unwrap_or_else(|| args.opts.ledger_dir.join("agent.json"));
    if !args.once {
        eprintln!(
            "cgpu-agent: checking the GPUs of {} every {:?}, policy {}{}; status in {}",
            args.opts.ledger_dir.display(),
            args.interval,
            args.opts.policy.name(),
            if args.opts.include_host {
                ", host processes included"
            } else {
                ""
            },
            status_file.display()
        );
    }
    let mut said_write_error = false;
    loop {
        let started = Instant::now();
        let pass = agent.pass();
        for e in &pass.events {
            eprintln!("{e}");
        }
        let mut doc = status_json(&args.opts, &pass, cgpu_ledger::clock::realtime_ns());
        // Readers (cgpu-smi, the exporter) judge the file stale after three
        // intervals: say how long one is.
        doc["interval_ms"] = serde_json::json!(args.interval.as_millis() as u64);
        let text = serde_json::to_string_pretty(&doc).expect("JSON of plain values");
        // --once prints its document; it writes the status file only when asked.
        if !args.once || args.status_file.is_some() {
            match write_atomic(&status_file, &text) {
                Ok(()) => said_write_error = false,
                Err(e) if !said_write_error => {
                    eprintln!("cgpu-agent: cannot write {}: {e}", status_file.display());
                    said_write_error = true;
                }
                Err(_) => {}
            }
        }
        if args.once {
            println!("{text}");
            let rc = if pass.any_over() {
                3
            } else if pass.any_error() {
                1
            } else {
                0
            };
            std::process::exit(rc);
        }
        std::thread::sleep(args.interval.saturating_sub(started.elapsed()));
    }
}
