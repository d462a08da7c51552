//! `cgpuctl exporter`: Prometheus text metrics over a minimal HTTP/1.1
//! server (std only), names and labels in the style of NVIDIA's DCGM
//! exporter (`DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-…"}` → here
//! `CGPU_FB_USED{gpu="0",UUID="GPU-…",container="…"}`). Memory is in MiB
//! like DCGM's, written exactly (bytes / 2^20, so fractions appear).
//! The metric list is in `docs/tools.md`.

use super::{apply_util, sample_dir, Report, Sample, MIB};
use std::collections::VecDeque;
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Escape a label value (backslash, double quote, newline).
pub fn escape(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for ch in v.chars() {
        match ch {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

struct Family {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
    samples: Vec<(String, f64)>,
}

impl Family {
    fn new(name: &'static str, kind: &'static str, help: &'static str) -> Self {
        Family {
            name,
            kind,
            help,
            samples: Vec::new(),
        }
    }
    fn add(&mut self, labels: &[(&str, &str)], v: f64) {
        let l: Vec<String> = labels
            .iter()
            .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
            .collect();
        self.samples.push((l.join(","), v));
    }
}

fn num(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v == v.trunc() && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

/// Render a report as Prometheus text exposition format 0.0.4.
pub fn render(r: &Report) -> String {
    let mut fams = vec![
        Family::new("CGPU_LEDGER_UP", "gauge", "1 if the GPU's ledger is readable and trusted, 0 if corrupt, of another format version or unreadable."),
        Family::new("CGPU_FB_TOTAL", "gauge", "Physical GPU memory (in MiB)."),
        Family::new("CGPU_POLICY", "gauge", "Compute policy 0..5 (0 fair share, 1 preemptive, 2 weight-based, 3 fixed, 4 soft, 5 native)."),
        Family::new("CGPU_MAX_INST", "gauge", "Maximum containers on the GPU (also its number of time slices)."),
        Family::new("CGPU_PRIO_RATIO", "gauge", "Most compute a high-priority container may take (in %)."),
        Family::new("CGPU_FREE_WEIGHT", "gauge", "max_inst minus the weights of live containers."),
        Family::new("CGPU_FB_QUOTA", "gauge", "Container's GPU memory quota (in MiB; 0 = not limited)."),
        Family::new("CGPU_FB_USED", "gauge", "GPU memory held by the container's processes (in MiB)."),
        Family::new("CGPU_FB_FREE", "gauge", "Quota (or physical memory when not limited) minus used (in MiB)."),
        Family::new("CGPU_FB_PEAK", "gauge", "Highest GPU memory the container ever held (in MiB)."),
        Family::new("CGPU_PROCESS_FB_USED", "gauge", "GPU memory held by one process (in MiB)."),
        Family::new("CGPU_OOM_TOTAL", "counter", "Allocations refused because they would pass the quota."),
        Family::new("CGPU_GPU_TIME_SECONDS_TOTAL", "counter", "GPU time charged to the container (in s)."),
        Family::new("CGPU_THROTTLED_SECONDS_TOTAL", "counter", "Time the container's threads were held back before a launch (in s, summed over threads)."),
        Family::new("CGPU_LAUNCHES_TOTAL", "counter", "Kernel launches admitted."),
        Family::new("CGPU_UTIL", "gauge", "GPU time used by the container over the last second (in %)."),
        Family::new("CGPU_UTIL_LIMIT", "gauge", "Compute limit the policy and weight give the container now (in %)."),
        Family::new("CGPU_WEIGHT", "gauge", "Container's compute weight."),
        Family::new("CGPU_HIGHPRIO", "gauge", "1 for a high-priority container."),
    ];
    let mb = |b: u64| b as f64 / MIB as f64;
    for e in &r.gpus {
        fams[0].add(
            &[("path", &e.path), ("status", e.status.as_str())],
            if e.gpu.is_some() { 1.0 } else { 0.0 },
        );
        let Some(g) = &e.gpu else { continue };
        let gi = g.index.to_string();
        let gl = [("gpu", gi.as_str()), ("UUID", g.uuid.as_str())];
        fams[1].add(&gl, mb(g.physical_total_bytes));
        fams[2].add(&gl, g.policy.into());
        fams[3].add(&gl, g.max_inst.into());
        fams[4].add(&gl, g.prio_ratio.into());
        fams[5].add(&gl, g.free_weight.into());
        for c in &g.containers {
            let cl = [
                ("gpu", gi.as_str()),
                ("UUID", g.uuid.as_str()),
                ("container", c.id.as_str()),
            ];
            fams[6].add(&cl, mb(c.quota_bytes));
            fams[7].add(&cl, mb(c.used_bytes));
            fams[8].add(&cl, mb(c.free_bytes));
            fams[9].add(&cl, mb(c.peak_bytes));
            for p in &c.processes {
                let pid = p.pid.to_string();
                let alive = if p.alive { "1" } else { "0" };
                fams[10].add(
                    &[
                        ("gpu", gi.as_str()),
                        ("UUID", g.uuid.as_str()),
                        ("container", c.id.as_str()),
                        ("pid", pid.as_str()),
                        ("alive", alive),
                    ],
                    mb(p.used_bytes),
                );
            }
            fams[11].add(&cl, c.oom_count as f64);
            fams[12].add(&cl, c.gpu_time_ns as f64 / 1e9);
            fams[13].add(&cl, c.throttled_ns as f64 / 1e9);
            fams[14].add(&cl, c.launches as f64);
            if let Some(u) = c.util_percent {
                fams[15].add(&cl, u);
            }
            fams[16].add(&cl, c.limit_percent.into());
            fams[17].add(&cl, c.weight.into());
            fams[18].add(&cl, u8::from(c.highprio).into());
        }
    }
    let mut out = String::new();
    for f in &fams {
        let _ = writeln!(out, "# HELP {} {}", f.name, f.help);
        let _ = writeln!(out, "# TYPE {} {}", f.name, f.kind);
        for (l, v) in &f.samples {
            let _ = writeln!(out, "{}{{{l}}} {}", f.name, num(*v));
        }
    }
    out
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

/// Serve forever on `listener`; one short-lived thread per connection.
pub fn serve(listener: TcpListener, dir: &Path) -> ! {
    let sampler = Sampler::new(dir);
    loop {
        match listener.accept() {
            Ok((s, _)) => {
                let sm = Arc::clone(&sampler);
                let _ = std::thread::Builder::new()
                    .name("cgpu-http".into())
                    .spawn(move || handle(s, &sm));
            }
            Err(e) => {
                tracing::warn!("exporter: accept failed: {e}");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_escaping() {
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
        assert_eq!(num(3.0), "3");
        assert_eq!(num(1.5), "1.5");
        assert_eq!(num(190.9990234375), "190.9990234375");
    }
}
