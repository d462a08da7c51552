//! cgpu-sim-stat: read a simulated GPU's state directory, or make the
//! library directory that exposes the simulator as libcuda/libnvidia-ml.
//!
//! ```text
//! cgpu-sim-stat [--state DIR] [--json]       devices and processes (default DIR: $CGPU_SIM_STATE or /dev/shm/cgpu-sim-<uid>)
//! cgpu-sim-stat --install-dir DIR [--lib P]  symlinks libcuda.so{,.1}, libnvidia-ml.so{,.1} -> P (default: libcgpu_sim.so next to this binary)
//! ```

use cgpu_sim::stat;
use std::path::PathBuf;

const HELP: &str = "\
cgpu-sim-stat: read a simulated GPU's state, or expose the simulator as a driver

USAGE:
    cgpu-sim-stat [--state DIR] [--json]
    cgpu-sim-stat --install-dir DIR [--lib PATH]

OPTIONS:
    --state DIR        state directory (default: $CGPU_SIM_STATE, else
                       /dev/shm/cgpu-sim-<uid>); prints devices, memory,
                       device time and processes
    --json             the same as JSON (schema in shim/README.md)
    --install-dir DIR  make DIR hold libcuda.so{,.1} and libnvidia-ml.so{,.1}
                       as symlinks to the simulator, for LD_LIBRARY_PATH
    --lib PATH         the simulator library to link to (default:
                       libcgpu_sim.so next to this binary)
    -h, --help         this help
";

/// A usage error: what was wrong, the short usage, exit status 2.
fn usage(what: &str) -> ! {
    eprintln!(
        "cgpu-sim-stat: error: {what}\nusage: cgpu-sim-stat [--state DIR] [--json]\n       cgpu-sim-stat --install-dir DIR [--lib PATH]\n(cgpu-sim-stat --help for more)"
    );
    std::process::exit(2)
}

fn main() {
    // Output piped into `head` and closed early: end quietly, as Unix tools
    // do, instead of panicking on the write.
    // SAFETY: restoring the default disposition of SIGPIPE before any thread
    // or handler exists.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    let mut state = None;
    let mut json = false;
    let mut install = None;
    let mut lib = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || {
            PathBuf::from(
                args.next()
                    .unwrap_or_else(|| usage(&format!("{a} needs a value"))),
            )
        };
        match a.as_str() {
            "--state" => state = Some(value()),
            "--json" => json = true,
            "--install-dir" => install = Some(value()),
            "--lib" => lib = Some(value()),
            "-h" | "--help" => {
                print!("{HELP}");
                return;
            }
            other => usage(&format!("unknown option `{other}`")),
        }
    }
    if let Some(dir) = install {
        let lib = lib.unwrap_or_else(|| {
            std::env::current_exe()
                .ok()
                .and_then(|p| p.parent().map(|d| d.join("libcgpu_sim.so")))
                .unwrap_or_else(|| PathBuf::from("libcgpu_sim.so"))
        });
        if let Err(e) = stat::install_dir(&dir, &lib) {
            eprintln!(
                "cgpu-sim-stat: cannot install {} -> {}: {e}",
                dir.display(),
                lib.display()
            );
            std::process::exit(1);
        }
        println!("{}", dir.display());
        return;
    }
    let dir = state.unwrap_or_else(cgpu_sim::config::state_dir_from_env);
    let snap = match stat::snapshot(&dir) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("cgpu-sim-stat: {e}");
            std::process::exit(1);
        }
    };
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&snap).unwrap_or_default()
        );
        return;
    }
    println!("state: {}", snap.state_dir);
    for d in &snap.devices {
        println!(
            "GPU {} {} {}  mem {}/{} MiB  busy {:.3} s  kernels {}",
            d.index,
            d.name,
            d.uuid,
            d.used_bytes >> 20,
            d.total_bytes >> 20,
            d.busy_ns as f64 / 1e9,
            d.kernels
        );
    }
    for p in &snap.processes {
        println!(
            "  pid {:>7} {:<16} gpu {} {:<6} mem {:>8} MiB  time {:.3} s  kernels {}",
            p.pid,
            p.comm,
            p.device,
            if p.alive { "alive" } else { "exited" },
            p.mem_bytes >> 20,
            p.device_time_ns as f64 / 1e9,
            p.kernels
        );
    }
    if snap.stubs.is_empty() {
        println!("stubs called: none");
    } else {
        let total: u64 = snap.stubs.iter().map(|s| s.calls).sum();
        println!(
            "stubs called: {} functions, {total} calls",
            snap.stubs.len()
        );
        for s in &snap.stubs {
            println!("  {:<48} {}", s.name, s.calls);
        }
    }
}
