//! `cgpu-smi`: who holds what on every GPU. Read-only.

use cgpu_tools::{args::Args, table, Report, Sample, Status};
use std::io::Write;
use std::time::{Duration, Instant};

const HELP: &str = "\
cgpu-smi: show every container on every GPU of this host (read-only)

USAGE:
    cgpu-smi [OPTIONS]

OPTIONS:
    -d, --detail          per-process lines (pid, MiB: cGPU's meminfo), weight,
                          time held back, free memory
        --json            machine-readable output (schema in docs/tools.md);
                          with -l, one JSON document per line
    -l, --loop SECONDS    refresh every SECONDS, 0.1 to 86400 (like nvidia-smi
                          -l); the utilisation is over the time since the last
                          refresh
        --instant         do not wait 1 s to measure utilisation (shows `-`)
        --dir DIR         ledger directory (default: $CGPU_LEDGER_DIR, else
                          /run/cgpu)
    -h, --help            this help
    -V, --version         print the version

COLUMNS:
    GPU        GPU index            pod       container id
    highprio   1: high priority     GPU-Util/Limit   percent of GPU time used
               over the last second / the limit its policy and weight give
    GPU Memory Usage/Total   MiB held / the container's quota (or the GPU's
               memory when it has none)

CGPU-AGENT:
    When cgpu-agent's status file ($CGPU_AGENT_STATUS, else
    /run/cgpu-agent/agent.json, else agent.json in the ledger directory) is
    fresh, a container whose memory on the device differs from the ledger's
    count gets a line `the device holds N MiB`, and each container over its
    quota by the device's numbers a line under the table:
    ! GPU CONTAINER: the device holds N MiB, quota Q MiB: ... (pid P)
    An old status is reported as stale; no status, nothing is added.

Never blocks or alters a job. A ledger that is corrupt or of another format
version is shown as such and none of its numbers are used; the exit status is
then 3 (0 otherwise; 2 for usage errors, a --loop out of range, or a ledger
directory named by --dir or $CGPU_LEDGER_DIR that does not exist or cannot be
read).
";

struct Opts {
    detail: bool,
    json: bool,
    every: Option<Duration>,
    instant: bool,
    dir: std::path::PathBuf,
}

fn parse() -> Result<Option<Opts>, String> {
    let mut a = Args::from_env();
    if a.flag(&["-h", "--help"]) {
        print!("{HELP}");
        return Ok(None);
    }
    if a.flag(&["-V", "--version"]) {
        println!(
            "cgpu-smi {} (ledger format {})",
            cgpu_tools::CGPU_VERSION,
            cgpu_ledger::FORMAT_VERSION
        );
        return Ok(None);
    }
    let detail = a.flag(&["-d", "--detail"]);
    let json = a.flag(&["--json"]);
    let instant = a.flag(&["--instant"]);
    let every = match a.value(&["-l", "--loop"])? {
        None => None,
        Some(s) => Some(loop_period(&s)?),
    };
    let dir = a.value(&["--dir"])?;
    a.finish()?;
    Ok(Some(Opts {
        detail,
        json,
        every,
        instant,
        dir: cgpu_tools::ledger_dir(dir.as_deref())?,
    }))
}

/// Shortest and longest `--loop` period: a shorter one would only burn a
/// core re-reading the ledgers (they change no faster); a longer one is a
/// typo (and past `Duration`'s range, a crash).
const LOOP_MIN_SECS: f64 = 0.1;
const LOOP_MAX_SECS: f64 = 86_400.0;

fn loop_period(s: &str) -> Result<Duration, String> {
    match s.parse::<f64>() {
        Ok(x) if (LOOP_MIN_SECS..=LOOP_MAX_SECS).contains(&x) => Ok(Duration::from_secs_f64(x)),
        Ok(x) if x.is_finite() && x > 0.0 => Err(format!(
            "--loop: {s} s is out of range ({LOOP_MIN_SECS} to {LOOP_MAX_SECS} seconds)"
        )),
        _ => Err(format!(
            "--loop: `{s}` is not a number of seconds ({LOOP_MIN_SECS} to {LOOP_MAX_SECS})"
        )),
    }
}

fn print(r: &Report, o: &Opts) {
    let text = if o.json {
        // serialising plain data cannot fail
        let mut s = if o.every.is_some() {
            serde_json::to_string(r).unwrap_or_default()
        } else {
            serde_json::to_string_pretty(r).unwrap_or_default()
        };
        s.push('\n');
        s
    } else {
        table::render(r, o.detail)
    };
    let mut out = std::io::stdout().lock();
    // a closed pipe (`cgpu-smi | head`) is not an error worth a panic
    if out
        .write_all(text.as_bytes())
        .and_then(|_| out.flush())
        .is_err()
    {
        std::process::exit(0);
    }
}

fn untrusted(r: &Report) -> bool {
    r.gpus.iter().any(|g| g.status != Status::Ok)
}

fn main() {
    cgpu_tools_log();
    let o = match parse() {
        Ok(Some(o)) => o,
        Ok(None) => return,
        Err(e) => {
            eprintln!("cgpu-smi: error: {e}");
            std::process::exit(2);
        }
    };
    match o.every {
        None => {
            let mut cur: Sample = cgpu_tools::sample_dir(&o.dir);
            if !o.instant {
                std::thread::sleep(Duration::from_secs(1));
                let prev = cur;
                cur = cgpu_tools::sample_dir(&o.dir);
                cgpu_tools::apply_util(&prev, &mut cur);
            }
            print(&cur.report, &o);
            if untrusted(&cur.report) {
                std::process::exit(3);
            }
        }
        Some(period) => {
            let mut prev: Option<Sample> = None;
            let mut next = Instant::now();
            loop {
                let mut cur = cgpu_tools::sample_dir(&o.dir);
                if let Some(p) = &prev {
                    cgpu_tools::apply_util(p, &mut cur);
                }
                print(&cur.report, &o);
                prev = Some(cur);
                next += period;
                let now = Instant::now();
                if next > now {
                    std::thread::sleep(next - now);
                } else {
                    next = now;
                }
            }
        }
    }
}

/// Log to stderr at the level `CGPU_LOG` gives (default: warnings).
fn cgpu_tools_log() {
    let filter = std::env::var("CGPU_LOG").unwrap_or_else(|_| "warn".into());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .try_init();
}
