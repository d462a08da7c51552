//! `cgpuctl exporter`: Prometheus text metrics over a minimal HTTP/1.1
//! server (std only), names and labels in the style of NVIDIA's DCGM
//! exporter (`DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-…"}` → here
//! `CGPU_FB_USED{gpu="0",UUID="GPU-…",container="…"}`). Memory is in MiB
//! like DCGM's, written exactly (bytes / 2^20, so fractions appear).
//! The metric list is in `docs/tools.md`.

use super::{apply_util, sample_dir, Report, Sample, MIB};
use prometheus::{CounterVec, GaugeVec, Opts, Registry, TextEncoder};
use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering::AcqRel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const GPU: &[&str] = &["gpu", "UUID"];
const CONTAINER: &[&str] = &["gpu", "UUID", "container"];
const PROCESS: &[&str] = &["gpu", "UUID", "container", "pid", "alive"];

/// One metric family registered in a scrape's registry.
fn gauge(reg: &Registry, name: &str, help: &str, labels: &[&str]) -> GaugeVec {
    let g = GaugeVec::new(Opts::new(name, help), labels).expect("valid metric name and labels");
    reg.register(Box::new(g.clone()))
        .expect("metric registered once");
    g
}

fn counter(reg: &Registry, name: &str, help: &str, labels: &[&str]) -> CounterVec {
    let c = CounterVec::new(Opts::new(name, help), labels).expect("valid metric name and labels");
    reg.register(Box::new(c.clone()))
        .expect("metric registered once");
    c
}

/// Render a report as Prometheus text exposition format 0.0.4, through the
/// `prometheus` crate's registry and text encoder (a fresh registry per
/// scrape: every value is read from the ledgers at that moment). Families
/// without samples are left out; label values are escaped by the encoder.
pub fn render(r: &Report) -> String {
    let reg = Registry::new();
    let ledger_up = gauge(&reg, "CGPU_LEDGER_UP", "1 if the GPU's ledger is readable and trusted, 0 if corrupt, of another format version or unreadable.", &["path", "status"]);
    let fb_total = gauge(&reg, "CGPU_FB_TOTAL", "Physical GPU memory (in MiB).", GPU);
    let policy = gauge(&reg, "CGPU_POLICY", "Compute policy 0..5 (0 fair share, 1 preemptive, 2 weight-based, 3 fixed, 4 soft, 5 native).", GPU);
    let max_inst = gauge(
        &reg,
        "CGPU_MAX_INST",
        "Maximum containers on the GPU (also its number of time slices).",
        GPU,
    );
    let prio_ratio = gauge(
        &reg,
        "CGPU_PRIO_RATIO",
        "Most compute a high-priority container may take (in %).",
        GPU,
    );
    let free_weight = gauge(
        &reg,
        "CGPU_FREE_WEIGHT",
        "max_inst minus the weights of live containers.",
        GPU,
    );
    let fb_quota = gauge(
        &reg,
        "CGPU_FB_QUOTA",
        "Container's GPU memory quota (in MiB; 0 = not limited).",
        CONTAINER,
    );
    let fb_used = gauge(
        &reg,
        "CGPU_FB_USED",
        "GPU memory held by the container's processes (in MiB).",
        CONTAINER,
    );
    let fb_free = gauge(
        &reg,
        "CGPU_FB_FREE",
        "Quota (or physical memory when not limited) minus used (in MiB).",
        CONTAINER,
    );
    let fb_peak = gauge(
        &reg,
        "CGPU_FB_PEAK",
        "Highest GPU memory the container ever held (in MiB).",
        CONTAINER,
    );
    let proc_used = gauge(
        &reg,
        "CGPU_PROCESS_FB_USED",
        "GPU memory held by one process (in MiB).",
        PROCESS,
    );
    let oom = counter(
        &reg,
        "CGPU_OOM_TOTAL",
        "Allocations refused because they would pass the quota.",
        CONTAINER,
    );
    let gpu_time = counter(
        &reg,
        "CGPU_GPU_TIME_SECONDS_TOTAL",
        "GPU time charged to the container (in s).",
        CONTAINER,
    );
    let throttled = counter(
        &reg,
        "CGPU_THROTTLED_SECONDS_TOTAL",
        "Time the container's threads were held back before a launch (in s, summed over threads).",
        CONTAINER,
    );
    let launches = counter(
        &reg,
        "CGPU_LAUNCHES_TOTAL",
        "Kernel launches admitted.",
        CONTAINER,
    );
    let util = gauge(
        &reg,
        "CGPU_UTIL",
        "GPU time used by the container over the last second (in %).",
        CONTAINER,
    );
    let util_limit = gauge(
        &reg,
        "CGPU_UTIL_LIMIT",
        "Compute limit the policy and weight give the container now (in %).",
        CONTAINER,
    );
    let weight = gauge(
        &reg,
        "CGPU_WEIGHT",
        "Container's compute weight.",
        CONTAINER,
    );
    let highprio = gauge(
        &reg,
        "CGPU_HIGHPRIO",
        "1 for a high-priority container.",
        CONTAINER,
    );
    let agent_age = gauge(
        &reg,
        "CGPU_AGENT_STATUS_AGE_SECONDS",
        "Age of cgpu-agent's status file (in s); the device gauges are left out when it is stale.",
        &[],
    );
    let device_used = gauge(
        &reg,
        "CGPU_DEVICE_FB_USED",
        "GPU memory the device says the container's processes hold, by cgpu-agent, including processes outside the library (in MiB).",
        CONTAINER,
    );
    let over_quota = gauge(
        &reg,
        "CGPU_OVER_QUOTA",
        "1 if the container holds more than its quota by the device's numbers (cgpu-agent), else 0.",
        CONTAINER,
    );
    let unseen = gauge(
        &reg,
        "CGPU_UNSEEN_FB_CHARGED",
        "GPU memory the container's processes hold beyond what the library charged them (contexts, modules, processes outside it), charged to its quota by cgpu-agent in secure mode (in MiB).",
        CONTAINER,
    );
    let device_time = gauge(
        &reg,
        "CGPU_DEVICE_TIME_SECONDS",
        "Device time of the container's processes since cgpu-agent started, from the device's per-process utilization (in seconds).",
        CONTAINER,
    );

    let mb = |b: u64| b as f64 / MIB as f64;
    if let Some(a) = &r.agent {
        agent_age
            .with_label_values::<&str>(&[])
            .set(a.age_ms as f64 / 1000.0);
        for c in a.containers.iter().filter(|_| !a.stale) {
            let gi = c.gpu.map(|i| i.to_string()).unwrap_or_default();
            let cl = [gi.as_str(), c.uuid.as_str(), c.id.as_str()];
            // Added, not set: one container is one series even if a
            // document lists it twice.
            device_used.with_label_values(&cl).add(mb(c.device_bytes));
            over_quota
                .with_label_values(&cl)
                .set(if c.over { 1.0 } else { 0.0 });
            unseen.with_label_values(&cl).add(mb(c.unseen_bytes));
            if let Some(ns) = c.device_time_ns {
                device_time.with_label_values(&cl).add(ns as f64 / 1e9);
            }
        }
    }
    for e in &r.gpus {
        ledger_up
            .with_label_values(&[e.path.as_str(), e.status.as_str()])
            .set(if e.gpu.is_some() { 1.0 } else { 0.0 });
        let Some(g) = &e.gpu else { continue };
        let gi = g.index.to_string();
        let gl = [gi.as_str(), g.uuid.as_str()];
        fb_total
            .with_label_values(&gl)
            .set(mb(g.physical_total_bytes));
        policy.with_label_values(&gl).set(g.policy.into());
        max_inst.with_label_values(&gl).set(g.max_inst.into());
        prio_ratio.with_label_values(&gl).set(g.prio_ratio.into());
        free_weight.with_label_values(&gl).set(g.free_weight.into());
        for c in &g.containers {
            let cl = [gi.as_str(), g.uuid.as_str(), c.id.as_str()];
            fb_quota.with_label_values(&cl).set(mb(c.quota_bytes));
            fb_used.with_label_values(&cl).set(mb(c.used_bytes));
            fb_free.with_label_values(&cl).set(mb(c.free_bytes));
            fb_peak.with_label_values(&cl).set(mb(c.peak_bytes));
            for p in &c.processes {
                let pid = p.pid.to_string();
                let alive = if p.alive { "1" } else { "0" };
                // Added, not set: two slots with one pid (a reused pid
                // whose old slot is not reaped yet) are one series.
                proc_used
                    .with_label_values(&[
                        gi.as_str(),
                        g.uuid.as_str(),
                        c.id.as_str(),
                        pid.as_str(),
                        alive,
                    ])
                    .add(mb(p.used_bytes));
            }
            oom.with_label_values(&cl).inc_by(c.oom_count as f64);
            gpu_time
                .with_label_values(&cl)
                .inc_by(c.gpu_time_ns as f64 / 1e9);
            throttled
                .with_label_values(&cl)
                .inc_by(c.throttled_ns as f64 / 1e9);
            launches.with_label_values(&cl).inc_by(c.launches as f64);
            if let Some(u) = c.util_percent {
                util.with_label_values(&cl).set(u);
            }
            util_limit
                .with_label_values(&cl)
                .set(c.limit_percent.into());
            weight.with_label_values(&cl).set(c.weight.into());
            highprio
                .with_label_values(&cl)
                .set(u8::from(c.highprio).into());
        }
    }
    TextEncoder::new()
        .encode_to_string(&reg.gather())
        .unwrap_or_else(|e| format!("# cgpu: encoding the metrics failed: {e}\n"))
}

/// Samples taken in the background so a scrape can report utilisation
/// over the last second without waiting for one.
pub struct Sampler {
    dir: PathBuf,
    history: Mutex<VecDeque<Sample>>,
}

impl Sampler {
    pub fn new(dir: &Path) -> Arc<Sampler> {
        let s = Arc::new(Sampler {
            dir: dir.to_owned(),
            history: Mutex::new(VecDeque::new()),
        });
        let bg = Arc::clone(&s);
        std::thread::Builder::new()
            .name("cgpu-sampler".into())
            .spawn(move || loop {
                let smp = sample_dir(&bg.dir);
                {
                    let mut h = bg.history.lock().unwrap_or_else(|e| e.into_inner());
                    h.push_back(smp);
                    while h.len() > 2 && h[1].at.elapsed() >= Duration::from_millis(1000) {
                        h.pop_front();
                    }
                }
                std::thread::sleep(Duration::from_millis(200));
            })
            .expect("spawn sampler thread");
        s
    }

    /// A fresh sample with utilisation over the last ~second.
    pub fn now(&self) -> Report {
        let mut cur = sample_dir(&self.dir);
        let h = self.history.lock().unwrap_or_else(|e| e.into_inner());
        // the newest sample at least 1 s old, else the oldest we have
        let prev = h
            .iter()
            .rev()
            .find(|s| s.at.elapsed() >= Duration::from_millis(1000))
            .or_else(|| h.front());
        if let Some(p) = prev {
            if cur.at.saturating_duration_since(p.at) >= Duration::from_millis(100) {
                apply_util(p, &mut cur);
            }
        }
        cur.report
    }
}

/// Read one request head (up to 16 KiB, until an empty line).
fn read_head(s: &mut TcpStream) -> std::io::Result<String> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    let deadline = Instant::now() + Duration::from_secs(5);
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && !buf.windows(2).any(|w| w == b"\n\n") {
        if buf.len() > 16 * 1024 || Instant::now() > deadline {
            break;
        }
        let n = s.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

fn respond(s: &mut TcpStream, code: &str, ctype: &str, extra: &str, body: &str, head_only: bool) {
    let head = format!(
        "HTTP/1.1 {code}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n{extra}\r\n",
        body.len()
    );
    let _ = s.write_all(head.as_bytes());
    if !head_only {
        let _ = s.write_all(body.as_bytes());
    }
    let _ = s.flush();
}

/// Answer one connection.
pub fn handle(mut s: TcpStream, sampler: &Sampler) {
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = s.set_write_timeout(Some(Duration::from_secs(5)));
    let head = match read_head(&mut s) {
        Ok(h) => h,
        Err(_) => return,
    };
    let line = head.lines().next().unwrap_or("");
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or("");
    let target = parts.next().unwrap_or("");
    let path = target.split('?').next().unwrap_or("");
    let head_only = method == "HEAD";
    if method != "GET" && !head_only {
        respond(
            &mut s,
            "405 Method Not Allowed",
            "text/plain; charset=utf-8",
            "Allow: GET, HEAD\r\n",
            "only GET\n",
            false,
        );
        return;
    }
    match path {
        "/metrics" => {
            let body = render(&sampler.now());
            respond(
                &mut s,
                "200 OK",
                "text/plain; version=0.0.4; charset=utf-8",
                "",
                &body,
                head_only,
            );
        }
        "/" => respond(
            &mut s,
            "200 OK",
            "text/html; charset=utf-8",
            "",
            "<html><body><a href=\"/metrics\">cgpu metrics</a></body></html>\n",
            head_only,
        ),
        _ => respond(
            &mut s,
            "404 Not Found",
            "text/plain; charset=utf-8",
            "",
            "not found: try /metrics\n",
            head_only,
        ),
    }
}

/// Connections answered at once. Each holds a thread for at most the read
/// and write timeouts (5 s each); past the cap a connection gets `503` at
/// once from the accepting thread, so idle or slow clients can hold up
/// scrapes for at most those timeouts, never exhaust threads or memory.
pub const MAX_CONNECTIONS: usize = 32;

/// Decrements the count of open connections when a handler ends, however.
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, AcqRel);
    }
}

/// `503` on the accepting thread: never waits for the client (whatever
/// request bytes have already arrived are read without blocking, so that
/// closing does not reset the connection before the client reads the answer).
fn refuse(mut s: TcpStream) {
    let _ = s.set_nonblocking(true);
    let mut sink = [0u8; 4096];
    for _ in 0..4 {
        match s.read(&mut sink) {
            Ok(n) if n > 0 => continue,
            _ => break,
        }
    }
    let _ = s.set_nonblocking(false);
    let _ = s.set_write_timeout(Some(Duration::from_millis(200)));
    respond(
        &mut s,
        "503 Service Unavailable",
        "text/plain; charset=utf-8",
        "Retry-After: 1\r\n",
        "too many connections\n",
        false,
    );
}

/// Serve forever on `listener`: one short-lived thread per connection, at
/// most [`MAX_CONNECTIONS`] at once.
pub fn serve(listener: TcpListener, dir: &Path) -> ! {
    let sampler = Sampler::new(dir);
    let open = Arc::new(AtomicUsize::new(0));
    loop {
        match listener.accept() {
            Ok((s, _)) => {
                if open.fetch_add(1, AcqRel) >= MAX_CONNECTIONS {
                    open.fetch_sub(1, AcqRel);
                    refuse(s);
                    continue;
                }
                let slot = Slot(Arc::clone(&open));
                let sm = Arc::clone(&sampler);
                let Ok(fallback) = s.try_clone() else {
                    drop(slot);
                    continue;
                };
                let spawned =
                    std::thread::Builder::new()
                        .name("cgpu-http".into())
                        .spawn(move || {
                            let _slot = slot;
                            handle(s, &sm)
                        });
                if let Err(e) = spawned {
                    // The closure (and the slot in it) is dropped already.
                    tracing::warn!("exporter: cannot start a thread for a connection: {e}");
                    refuse(fallback);
                }
            }
            Err(e) => {
                tracing::warn!("exporter: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}
