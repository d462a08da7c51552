//! `cgpuctl`: cGPU's `/proc/cgpu_km` knobs, tree, inspect view, gc and a
//! Prometheus exporter, over the ledgers of this host.

use cgpu_ledger::{Ledger, FORMAT_VERSION};
use cgpu_tools::knobs::{self, Knob};
use cgpu_tools::{args::Args, exporter, inspect, installed, tree, GpuInfo};
use std::path::{Path, PathBuf};
use std::process::exit;

const HELP: &str = "\
cgpuctl: read and change cGPU's knobs on this host's GPUs

USAGE:
    cgpuctl [--dir DIR] COMMAND [ARGS]

COMMANDS:
    get KNOB              print a knob (see `cgpuctl get --help`)
    set KNOB VALUE        change a knob in running jobs (see `cgpuctl set --help`)
    tree                  the ledgers as cGPU's /proc/cgpu_km tree
    inspect               allocated/total GPU memory (`kubectl inspect cgpu`)
    gc                    reclaim the slots of dead processes now
    settings ID [K=V...]  a container's settings, written on the host
    exporter              serve Prometheus metrics over HTTP
    version               library and ledger format versions
    help [COMMAND]        this help, or a command's

OPTIONS:
    --dir DIR             ledger directory (default: $CGPU_LEDGER_DIR, else
                          /run/cgpu)
    -h, --help            help

Exit status: 0 done, 1 failed (e.g. a corrupt ledger), 2 usage or range
error (also: a ledger directory named by --dir or $CGPU_LEDGER_DIR that does
not exist or cannot be read).
";

const HELP_GET: &str = "\
cgpuctl get KNOB [--gpu N|UUID] [--container ID]

Print a knob. Per GPU: policy, max_inst, prio_ratio, default_memsize,
free_weight. Per container: weight, memsize, highprio (every container when
--container is not given). Memory values are in bytes, like cGPU's nodes.

With exactly one GPU and (for per-container knobs) one container selected,
prints the bare value (like `cat /proc/cgpu_km/0/policy`); otherwise one
`PATH: VALUE` line per target, PATH as in `cgpuctl tree --flat`.

    --gpu N|UUID          one GPU, by index or UUID (or a unique UUID prefix)
    --container ID        one container (id or a unique prefix)
";

const HELP_SET: &str = "\
cgpuctl set KNOB VALUE [--gpu N|UUID] [--container ID]

Change a knob in the ledger; running jobs pick it up without restart (compute
knobs within 100 ms). Every target is checked before any is written.

    policy            0..5 (0 fair share, 1 preemptive, 2 weight-based
                      preemptive, 3 fixed, 4 soft, 5 native); marks the policy
                      as set by the operator, so weights no longer switch it
    max_inst          1..25, not below the sum of live containers' weights
    prio_ratio        20..99 (percent a high-priority container may take)
    default_memsize   quota for containers that set none: GiB (plain number)
                      or bytes with a suffix (B, K, M, G); 0 = pass-through
    weight            per container, 1..max_inst; the weights of live
                      containers must sum to at most max_inst
    memsize           per container quota: GiB (plain number) or bytes with a
                      suffix (512M, 1073741824B). Lowering it below what the
                      container holds refuses its further allocations; it
                      never frees memory under a job
    highprio          per container, a boolean (1/true/yes/on, 0/false/no/off)

    --gpu N|UUID          only this GPU (default: every GPU; for per-container
                          knobs, every GPU the container is on)
    --container ID        the container (required for per-container knobs)
";

const HELP_TREE: &str = "\
cgpuctl tree [--flat]

Print the ledgers as cGPU's /proc/cgpu_km tree: default_memsize, version,
and per GPU <index>/ with free_weight, max_inst, policy, prio_ratio and a
directory per container with highprio, id, meminfo (Free: <bytes>, then
PID: <pid> Mem: <bytes> per process), memsize (bytes), weight.

    --flat            `PATH: VALUE` lines, like `grep -r . /proc/cgpu_km`
";

const HELP_INSPECT: &str = "\
cgpuctl inspect [-d] [--gpu-mem-dev GIB]

GPU memory allocated (containers' quotas) over total, in GiB, per GPU of this
host and in total with a percentage, like `kubectl inspect cgpu`. A GPU's
total is floor(MiB / 1024), as the cluster view counts it, unless stated.

    -d, --detail          per-container allocation on each GPU
    --gpu-mem-dev GIB     the GPUs' size as the operator counts it (default:
                          $ALIYUN_COM_GPU_MEM_DEV when set)
";

const HELP_GC: &str = "\
cgpuctl gc

Reclaim now the slots and memory of processes that died (their liveness lock
is gone) and of containers left without processes, and print what was
reclaimed. Jobs do this on their own within a second; this is for operators.
";

const HELP_EXPORTER: &str = "\
cgpuctl exporter [--listen ADDR]

Serve Prometheus metrics at http://ADDR/metrics (default 127.0.0.1:9400),
names and labels in the style of NVIDIA's DCGM exporter: CGPU_FB_QUOTA,
CGPU_FB_USED, CGPU_PROCESS_FB_USED (MiB), CGPU_GPU_TIME_SECONDS_TOTAL,
CGPU_THROTTLED_SECONDS_TOTAL, CGPU_UTIL, CGPU_UTIL_LIMIT (%), … with labels
gpu, UUID, container (and pid). Full list in docs/tools.md. Prints the bound
address on its first line (use port 0 for any free port).
";

const HELP_VERSION: &str = "\
cgpuctl version [--lib PATH]

Print the version of the tools, of the installed libcgpu.so (read from the
file, not loaded: the cgpu entries of /etc/ld.so.preload and the usual paths,
/opt/cgpu/libcgpu.so first; or the file given with --lib), the ledger format
they read and write, and the format of each ledger found. Exit status 1 when
a library file found has no cgpu version in it or cannot be read.

    --lib PATH            the library file to read instead of looking
";

const HELP_SETTINGS: &str = "\
cgpuctl settings CONTAINER-ID [KEY=VALUE...] [--rm] [--settings-dir DIR]

Give a container its settings from the host (docker without Kubernetes):
writes DIR/CONTAINER-ID.env, which every process of that container reads at
its first GPU use, whatever its own environment; its values win over the
container's environment. Mount DIR read-only into the containers at
/etc/cgpu/containers (docker run -v /etc/cgpu/containers:/etc/cgpu/containers:ro).
Write it before the container starts (docker create, then docker start) or
after: processes that start later read it, and a single-value
ALIYUN_COM_GPU_MEM_CONTAINER also becomes the memsize of the container on
every GPU where it runs now.

CONTAINER-ID is the runtime's full id, 64 hex digits
(docker inspect -f '{{.Id}}' NAME). Without KEY=VALUE, prints the file.
Keys: ALIYUN_COM_GPU_MEM_CONTAINER (required), ALIYUN_COM_GPU_MEM_DEV,
ALIYUN_COM_GPU_VISIBLE_DEVICES, ALIYUN_COM_GPU_SCHD_WEIGHT,
ALIYUN_COM_GPU_HIGH_PRIO, CGPU_DISABLE, CGPU_CONTAINER_ID (the name shown).

    --rm                  remove the file (processes that start later run
                          without host settings)
    --settings-dir DIR    default: $CGPU_SETTINGS_DIR, else /etc/cgpu/containers
";

/// `cgpuctl settings`.
fn cmd_settings(mut a: Args, ledger_dir: Option<PathBuf>) {
    let rm = a.flag(&["--rm"]);
    let dir = a
        .value(&["--settings-dir"])
        .unwrap_or_else(|e| usage(e))
        .or_else(|| {
            std::env::var("CGPU_SETTINGS_DIR")
                .ok()
                .filter(|d| !d.is_empty())
        })
        .unwrap_or_else(|| cgpu_ledger::settings::DEFAULT_SETTINGS_DIR.to_string());
    let Some(id) = a.positional() else {
        usage("settings: the container's id is missing (see cgpuctl help settings)".into())
    };
    let id = id.to_ascii_lowercase();
    if id.len() != 64 || !id.bytes().all(|c| c.is_ascii_hexdigit()) {
        usage(format!(
            "settings: `{id}` is not a container id of 64 hex digits (docker inspect -f '{{{{.Id}}}}' NAME)"
        ));
    }
    let mut kv = Vec::new();
    while let Some(p) = a.positional() {
        kv.push(p);
    }
    a.finish().unwrap_or_else(|e| usage(e));
    let path = Path::new(&dir).join(format!("{id}.env"));
    if rm {
        match std::fs::remove_file(&path) {
            Ok(()) => println!("removed {}", path.display()),
            Err(e) => die(1, &format!("{}: {e}", path.display())),
        }
        return;
    }
    if kv.is_empty() {
        match std::fs::read_to_string(&path) {
            Ok(t) => print!("{t}"),
            Err(e) => die(1, &format!("{}: {e}", path.display())),
        }
        return;
    }
    let text = kv.join("\n") + "\n";
    let vals = cgpu_ledger::settings::parse_settings_file(&text)
        .unwrap_or_else(|e| usage(format!("settings: {e}")));
    let get = |k: &str| vals.iter().find(|(h, _)| h == k).map(|(_, v)| v.clone());
    let c = cgpu_ledger::settings::from_lookup(&get, None);
    if !c.errors.is_empty() {
        usage(format!("settings: {}", c.errors.join("; ")));
    }
    if let Err(e) = write_settings(Path::new(&dir), &path, &text) {
        die(1, &format!("{}: {e}", path.display()));
    }
    println!("wrote {}", path.display());
    // Containers running now: a single quota value is their memsize on
    // every GPU where they are.
    let (Some(ldir), [gib]) = (ledger_dir, c.mem_container.as_slice()) else {
        return;
    };
    let key = cgpu_ledger::identity::key_of_container_id(&id);
    for p in Ledger::list(&ldir) {
        let Ok(l) = Ledger::open(&p) else { continue };
        let f = l.file();
        let physical = f.header.read_physical_total();
        for (ci, slot) in l.containers() {
            if slot.current_key() != key {
                continue;
            }
            let bytes = match gib {
                0 => 0,
                g => cgpu_ledger::settings::visible_total(physical, *g, c.mem_dev),
            };
            match l.set_memsize(ci, bytes) {
                Ok(()) => println!(
                    "{}: container {} memsize {bytes}",
                    p.display(),
                    slot.id_str()
                ),
                Err(e) => eprintln!("cgpuctl: {}: {e}", p.display()),
            }
        }
    }
}

/// Writes the settings file whole (a reader never sees half of it),
/// readable by everyone, writable by its owner only.
fn write_settings(dir: &Path, path: &Path, text: &str) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(
        ".{}.tmp{}",
        path.file_name().unwrap_or_default().to_string_lossy(),
        std::process::id()
    ));
    std::fs::write(&tmp, text)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644))?;
    std::fs::rename(&tmp, path)
}

fn die(code: i32, msg: &str) -> ! {
    eprintln!("cgpuctl: error: {msg}");
    exit(code)
}

fn usage(e: String) -> ! {
    die(2, &e)
}

/// An opened ledger that passed validation.
struct Gpu {
    ledger: Ledger,
    info: GpuInfo,
}

/// Open every ledger in `dir`; untrusted ones are reported on stderr and
/// returned separately.
fn open_all(dir: &Path) -> (Vec<Gpu>, Vec<String>) {
    let mut ok = Vec::new();
    let mut bad = Vec::new();
    for p in Ledger::list(dir) {
        match Ledger::open(&p) {
            Ok(l) => match cgpu_tools::read_ledger(&l) {
                cgpu_tools::GpuEntry {
                    gpu: Some(info), ..
                } => ok.push(Gpu { ledger: l, info }),
                e => bad.push(format!(
                    "{}: {}",
                    p.display(),
                    e.error.unwrap_or_else(|| "unreadable".into())
                )),
            },
            Err(e) => bad.push(format!("{}: {}", p.display(), cgpu_tools::open_error(&e).1)),
        }
    }
    ok.sort_by_key(|g| g.info.index);
    (ok, bad)
}

fn select_gpus(gpus: Vec<Gpu>, sel: Option<&str>, bad: &[String]) -> Vec<Gpu> {
    let Some(sel) = sel else { return gpus };
    let by_index = sel.parse::<u32>().ok();
    let exact: Vec<usize> = gpus
        .iter()
        .enumerate()
        .filter(|(_, g)| Some(g.info.index) == by_index || g.info.uuid == sel)
        .map(|(i, _)| i)
        .collect();
    let pick = if !exact.is_empty() {
        exact
    } else {
        gpus.iter()
            .enumerate()
            .filter(|(_, g)| sel.len() >= 5 && g.info.uuid.starts_with(sel))
            .map(|(i, _)| i)
            .collect()
    };
    if pick.len() != 1 {
        let known: Vec<String> = gpus
            .iter()
            .map(|g| format!("{} ({})", g.info.index, g.info.uuid))
            .collect();
        let mut msg = if pick.is_empty() {
            format!("no GPU `{sel}`")
        } else {
            format!("`{sel}` matches several GPUs")
        };
        msg += &format!(
            "; GPUs: {}",
            if known.is_empty() {
                "none".into()
            } else {
                known.join(", ")
            }
        );
        if !bad.is_empty() {
            msg += &format!("; not trusted: {}", bad.join("; "));
        }
        die(1, &msg);
    }
    gpus.into_iter()
        .enumerate()
        .filter(|(i, _)| pick.contains(i))
        .map(|(_, g)| g)
        .collect()
}

/// (gpu index in `gpus`, container slot or None, tree path)
type Target = (usize, Option<usize>, String);

fn targets(gpus: &[Gpu], k: Knob, container: Option<&str>, for_set: bool) -> Vec<Target> {
    let mut t = Vec::new();
    if !k.per_container() {
        if container.is_some() {
            usage(format!(
                "{} is a per-GPU knob; --container does not apply",
                k.name()
            ));
        }
        for (i, g) in gpus.iter().enumerate() {
            t.push((i, None, format!("{}/{}", g.info.index, k.name())));
        }
        return t;
    }
    if container.is_none() && for_set {
        usage(format!(
            "{} is per container: give --container ID",
            k.name()
        ));
    }
    for (i, g) in gpus.iter().enumerate() {
        let f = g.ledger.file();
        match container {
            Some(id) => {
                if let Some(c) = knobs::find_container(f, id) {
                    let cid = knobs::container_id(f, c).unwrap_or_default();
                    t.push((i, Some(c), format!("{}/{cid}/{}", g.info.index, k.name())));
                }
            }
            None => {
                for c in &g.info.containers {
                    t.push((
                        i,
                        Some(c.slot),
                        format!("{}/{}/{}", g.info.index, c.id, k.name()),
                    ));
                }
            }
        }
    }
    if t.is_empty() {
        if let Some(id) = container {
            die(
                1,
                &format!("no live container `{id}` on the selected GPU(s)"),
            );
        }
    }
    t
}

fn cmd_get(mut a: Args, dir: &Path) {
    if a.flag(&["-h", "--help"]) {
        print!("{HELP_GET}");
        return;
    }
    let gpu = a.value(&["--gpu", "-g"]).unwrap_or_else(|e| usage(e));
    let container = a.value(&["--container", "-c"]).unwrap_or_else(|e| usage(e));
    let Some(name) = a.positional() else {
        usage("get: which knob? (policy, max_inst, prio_ratio, default_memsize, free_weight, weight, memsize, highprio)".into())
    };
    a.finish().unwrap_or_else(|e| usage(e));
    let k = Knob::parse(&name).unwrap_or_else(|e| usage(e));
    let (gpus, bad) = open_all(dir);
    for b in &bad {
        eprintln!("cgpuctl: warning: not trusted, skipped: {b}");
    }
    let gpus = select_gpus(gpus, gpu.as_deref(), &bad);
    if gpus.is_empty() {
        die(1, &format!("no usable ledger in {}", dir.display()));
    }
    let t = targets(&gpus, k, container.as_deref(), false);
    let bare = t.len() == 1;
    for (gi, c, path) in &t {
        let v = knobs::get(gpus[*gi].ledger.file(), k, *c);
        if bare {
            println!("{v}");
        } else {
            println!("{path}: {v}");
        }
    }
    if !bad.is_empty() && gpu.is_none() {
        exit(1);
    }
}

fn cmd_set(mut a: Args, dir: &Path) {
    if a.flag(&["-h", "--help"]) {
        print!("{HELP_SET}");
        return;
    }
    let gpu = a.value(&["--gpu", "-g"]).unwrap_or_else(|e| usage(e));
    let container = a.value(&["--container", "-c"]).unwrap_or_else(|e| usage(e));
    let (Some(name), Some(value)) = (a.positional(), a.positional()) else {
        usage("usage: cgpuctl set KNOB VALUE [--gpu N|UUID] [--container ID]".into())
    };
    a.finish().unwrap_or_else(|e| usage(e));
    let k = Knob::parse(&name).unwrap_or_else(|e| usage(e));
    if k.read_only() {
        usage(format!("{} is read-only", k.name()));
    }
    let v = k.parse_value(&value).unwrap_or_else(|e| usage(e));
    let (gpus, bad) = open_all(dir);
    for b in &bad {
        eprintln!("cgpuctl: warning: not trusted, not written: {b}");
    }
    let gpus = select_gpus(gpus, gpu.as_deref(), &bad);
    if gpus.is_empty() {
        die(1, &format!("no usable ledger in {}", dir.display()));
    }
    let t = targets(&gpus, k, container.as_deref(), true);
    // check every target before writing any
    for (gi, c, path) in &t {
        if let Err(e) = knobs::check(gpus[*gi].ledger.file(), k, *c, v) {
            usage(format!("{path}: {e}"));
        }
    }
    for (gi, c, path) in &t {
        let f = gpus[*gi].ledger.file();
        match knobs::set(&gpus[*gi].ledger, k, *c, v) {
            Ok(prev) => println!("{path}: {prev} -> {v}"),
            Err(e) => usage(format!("{path}: {e}")),
        }
        if k == Knob::Memsize {
            if let Some(c) = c {
                let used = f.containers[*c]
                    .used
                    .load(std::sync::atomic::Ordering::Acquire);
                if used > v {
                    eprintln!(
                        "cgpuctl: note: {path}: the container holds {used} bytes, more than the new memsize; \
                         its further allocations are refused until it frees (nothing is freed under it)"
                    );
                }
            }
        }
    }
    if !bad.is_empty() && gpu.is_none() {
        exit(1);
    }
}

fn cmd_tree(mut a: Args, dir: &Path) {
    if a.flag(&["-h", "--help"]) {
        print!("{HELP_TREE}");
        return;
    }
    let flat = a.flag(&["--flat"]);
    a.finish().unwrap_or_else(|e| usage(e));
    let s = cgpu_tools::sample_dir(dir);
    print!("{}", tree::render(&s.report, flat));
    if s.report.gpus.iter().any(|g| g.gpu.is_none()) {
        exit(1);
    }
}

fn cmd_inspect(mut a: Args, dir: &Path) {
    if a.flag(&["-h", "--help"]) {
        print!("{HELP_INSPECT}");
        return;
    }
    let d = a.flag(&["-d", "--detail"]);
    let stated = a.value(&["--gpu-mem-dev"]).unwrap_or_else(|e| usage(e));
    a.finish().unwrap_or_else(|e| usage(e));
    let stated = stated
        .or_else(|| std::env::var("ALIYUN_COM_GPU_MEM_DEV").ok())
        .map(|v| match v.trim().parse::<u64>() {
            Ok(n) if n > 0 => n,
            _ => usage(format!(
                "--gpu-mem-dev / ALIYUN_COM_GPU_MEM_DEV: '{v}' is not a whole number of GiB"
            )),
        });
    let s = cgpu_tools::sample_dir(dir);
    print!(
        "{}",
        inspect::render(
            &s.report,
            d,
            &inspect::hostname(),
            &inspect::ip_address(),
            stated
        )
    );
    if s.report.gpus.iter().any(|g| g.gpu.is_none()) {
        exit(1);
    }
}

fn cmd_version(mut a: Args, dir: &Path) {
    if a.flag(&["-h", "--help"]) {
        print!("{HELP_VERSION}");
        return;
    }
    let lib = a.value(&["--lib"]).unwrap_or_else(|e| usage(e));
    a.finish().unwrap_or_else(|e| usage(e));
    let tools = cgpu_tools::CGPU_VERSION;
    println!("cgpuctl {tools}");
    let mut failed = false;
    let libs = match &lib {
        Some(p) => vec![PathBuf::from(p)],
        None => installed::find_installed(),
    };
    if libs.is_empty() {
        println!(
            "library: no libcgpu.so found (looked in /etc/ld.so.preload, {}; name one with --lib PATH)",
            installed::USUAL_PATHS.join(", ")
        );
    }
    for p in &libs {
        match installed::library_version(p) {
            Ok(Some(v)) if v == tools => println!("library: {} {v}", p.display()),
            Ok(Some(v)) => println!("library: {} {v} (the tools are {tools})", p.display()),
            Ok(None) => {
                failed = true;
                println!(
                    "library: {}: no cgpu version in it (not a cgpu library, or one built before versions were recorded)",
                    p.display()
                )
            }
            Err(e) => {
                failed = true;
                println!("library: {}: {e}", p.display())
            }
        }
    }
    println!("ledger format: {FORMAT_VERSION}");
    for p in Ledger::list(dir) {
        let what = match Ledger::open_for_reading(&p) {
            Ok(l) => format!("format {}", l.file().header.read_version()),
            Err(cgpu_ledger::LedgerError::Version { found, .. }) => {
                format!("format {found} (not readable by this version)")
            }
            Err(e) => cgpu_tools::open_error(&e).1,
        };
        println!("{}: {what}", p.display());
    }
    if failed {
        exit(1);
    }
}

fn cmd_gc(mut a: Args, dir: &Path) {
    if a.flag(&["-h", "--help"]) {
        print!("{HELP_GC}");
        return;
    }
    a.finish().unwrap_or_else(|e| usage(e));
    let (gpus, bad) = open_all(dir);
    for b in &bad {
        eprintln!("cgpuctl: warning: not trusted, not touched: {b}");
    }
    let mut total = 0;
    for g in &gpus {
        let dead: Vec<String> = g
            .info
            .containers
            .iter()
            .flat_map(|c| {
                c.processes.iter().filter(|p| !p.alive).map(move |p| {
                    format!(
                        "pid {} of container {} ({} bytes)",
                        p.pid, c.id, p.used_bytes
                    )
                })
            })
            .collect();
        let empty: Vec<&str> = g
            .info
            .containers
            .iter()
            .filter(|c| c.processes.iter().all(|p| !p.alive))
            .map(|c| c.id.as_str())
            .collect();
        let n = g.ledger.reap();
        total += n;
        println!(
            "GPU {} ({}): reaped {n} process slot(s)",
            g.info.index, g.info.uuid
        );
        for d in &dead {
            println!("  {d}");
        }
        let still: Vec<String> = cgpu_tools::read_ledger(&g.ledger)
            .gpu
            .map(|i| i.containers.into_iter().map(|c| c.id).collect())
            .unwrap_or_default();
        for id in empty {
            if !still.iter().any(|s| s == id) {
                println!("  container {id} (no live process left)");
            }
        }
    }
    if gpus.is_empty() && bad.is_empty() {
        println!("no ledgers in {}", dir.display());
    } else if total == 0 {
        println!("nothing to reap");
    }
    if !bad.is_empty() {
        exit(1);
    }
}

fn cmd_exporter(mut a: Args, dir: &Path) {
    if a.flag(&["-h", "--help"]) {
        print!("{HELP_EXPORTER}");
        return;
    }
    let listen = a
        .value(&["--listen", "-l"])
        .unwrap_or_else(|e| usage(e))
        .unwrap_or_else(|| "127.0.0.1:9400".into());
    a.finish().unwrap_or_else(|e| usage(e));
    let l = std::net::TcpListener::bind(&listen)
        .unwrap_or_else(|e| die(1, &format!("cannot listen on {listen}: {e}")));
    let addr = l.local_addr().map(|a| a.to_string()).unwrap_or(listen);
    println!(
        "cgpuctl exporter: serving http://{addr}/metrics (ledgers in {})",
        dir.display()
    );
    use std::io::Write;
    let _ = std::io::stdout().flush();
    exporter::serve(l, dir)
}

fn main() {
    let filter = std::env::var("CGPU_LOG").unwrap_or_else(|_| "warn".into());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(std::io::stderr)
        .try_init();

    let mut a = Args::from_env();
    let dir_arg = a.value(&["--dir"]).unwrap_or_else(|e| usage(e));
    if a.flag(&["-V", "--version"]) {
        println!(
            "cgpuctl {} (ledger format {FORMAT_VERSION})",
            cgpu_tools::CGPU_VERSION
        );
        return;
    }
    let cmd = a.positional();
    let dir =
        || -> PathBuf { cgpu_tools::ledger_dir(dir_arg.as_deref()).unwrap_or_else(|e| usage(e)) };
    match cmd.as_deref() {
        None | Some("help") => match a.positional().as_deref() {
            Some("get") => print!("{HELP_GET}"),
            Some("set") => print!("{HELP_SET}"),
            Some("tree") => print!("{HELP_TREE}"),
            Some("inspect") => print!("{HELP_INSPECT}"),
            Some("gc") => print!("{HELP_GC}"),
            Some("exporter") => print!("{HELP_EXPORTER}"),
            Some("version") => print!("{HELP_VERSION}"),
            Some("settings") => print!("{HELP_SETTINGS}"),
            _ => {
                if cmd.is_none() && !a.flag(&["-h", "--help"]) {
                    eprint!("{HELP}");
                    exit(2);
                }
                print!("{HELP}")
            }
        },
        Some("get") => cmd_get(a, &dir()),
        Some("set") => cmd_set(a, &dir()),
        Some("tree") => cmd_tree(a, &dir()),
        Some("inspect") => cmd_inspect(a, &dir()),
        Some("version") => cmd_version(a, &dir()),
        Some("gc") => cmd_gc(a, &dir()),
        Some("exporter") => cmd_exporter(a, &dir()),
        Some("settings") => cmd_settings(a, cgpu_tools::ledger_dir(dir_arg.as_deref()).ok()),
        Some(other) => usage(format!("unknown command `{other}` (see cgpuctl --help)")),
    }
}
