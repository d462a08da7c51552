//! `cgpu-agent`: checks, every interval, what each container really holds
//! on each GPU (NVML) against its quota (the GPU's ledger); reports and, by
//! policy, stops or kills the processes of a container over its quota.

use cgpu_agent::{status_json, write_atomic, Agent, Options, Policy};
use std::path::PathBuf;
use std::time::{Duration, Instant};

const USAGE: &str = "usage: cgpu-agent [--once] [--interval DURATION] [--ledger-dir DIR]
                  [--status-file PATH] [--policy report|stop|kill] [--include-host]
                  [--secure [--settings-dir DIR] [--max-per-container N]]
       cgpu-agent client SOCKET

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
its quota, 3 if any is over, 1 if a GPU could not be checked.

--secure: the agent also owns the books. It makes the ledger directory
root's (mode 0755; it refuses one writable by others or not root's),
creates each GPU's ledger there readable by all and writable by root only,
and serves <ledger dir>/agent.sock, through which the processes of
containers ask it for memory. A container's settings come from the host's
file <settings dir>/<container id>.env (default CGPU_SETTINGS_DIR, else
/etc/cgpu/containers; written by cgpuctl settings). --max-per-container:
connections one container may hold open (default 256). Every pass it also
charges to each container's row what its processes hold on the device
beyond what the ledger charges them (contexts, modules, memory taken
around the library); the row's quota then refuses what no longer fits, and
a container whose row then counts more than its quota is over for --policy
too (its processes not in the ledger are stopped or killed until both the
device and the row fit).

client SOCKET: speaks to a secure agent's socket, one command per line on
standard input (hello UUID, reserve UUID BYTES, release UUID BYTES, exec
PROGRAM ARGS...), one reply per line on standard output.";

struct Args {
    once: bool,
    secure: bool,
    settings_dir: Option<PathBuf>,
    max_per_container: usize,
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
        secure: false,
        settings_dir: None,
        max_per_container: cgpu_agent::secure::MAX_PER_CONTAINER,
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
            "--secure" => a.secure = true,
            "--settings-dir" => a.settings_dir = Some(PathBuf::from(value("a directory")?)),
            "--max-per-container" => {
                let v = value("a number")?;
                a.max_per_container = v.parse().ok().filter(|&n| n > 0).ok_or_else(|| {
                    format!("--max-per-container {v}: expected a positive number")
                })?;
            }
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
    if a.secure && a.once {
        return Err("--secure serves until stopped; it does not go with --once".into());
    }
    Ok(a)
}

fn main() {
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some("client") {
        let Some(sock) = argv.get(2) else {
            eprintln!("cgpu-agent: client needs the socket's path\n{USAGE}");
            std::process::exit(2);
        };
        std::process::exit(cgpu_agent::secure::client(std::path::Path::new(sock)));
    }
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
    if args.secure {
        let settings_dir = args
            .settings_dir
            .clone()
            .unwrap_or_else(cgpu_agent::secure::default_settings_dir);
        let opts = cgpu_agent::secure::SecureOptions {
            ledger_dir: args.opts.ledger_dir.clone(),
            settings_dir: settings_dir.clone(),
            max_per_container: args.max_per_container,
            max_connections: cgpu_agent::secure::MAX_CONNECTIONS,
        };
        let server = cgpu_agent::nvml::Nvml::open()
            .and_then(|nvml| cgpu_agent::secure::Server::start(opts, &nvml));
        let server = match server {
            Ok(s) => s,
            Err(e) => {
                eprintln!("cgpu-agent: secure mode cannot start: {e}");
                std::process::exit(1);
            }
        };
        for (index, uuid, path) in server.gpus() {
            eprintln!("cgpu-agent: secure: GPU {index} {uuid}: {}", path.display());
        }
        // The agent owns the books: what the device shows and they do not
        // is charged to the container's row every pass, the first one
        // before any request is served (after a restart, the charges of
        // the previous agent went with it).
        agent.charge_unseen(settings_dir.clone());
        for e in &agent.pass().events {
            eprintln!("{e}");
        }
        eprintln!(
            "cgpu-agent: secure: serving {} (settings from {}, at most {} connections per container, {} rows of running processes taken over)",
            args.opts.ledger_dir.join(cgpu_ledger::wire::SOCKET_NAME).display(),
            settings_dir.display(),
            args.max_per_container,
            server.orphans()
        );
        std::thread::Builder::new()
            .name("cgpu-secure".into())
            .spawn(move || server.run())
            .expect("spawn the server thread");
    }
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
