//! `cgpuctl inspect`: the `kubectl inspect cgpu` view for this host.
//!
//! Allocated = the quotas of live containers in whole GiB (rounded to
//! nearest: a quota of `ALIYUN_COM_GPU_MEM_CONTAINER=6` on a T4 counted as
//! 15 GiB is 6043 MiB, shown as 6). Total = the GPU's size as the cluster
//! view counts it: `floor(MiB / 1024)` (16130 MiB → 15, 15109 MiB → 14),
//! unless the operator states it (`--gpu-mem-dev 15`, the node's
//! `ALIYUN_COM_GPU_MEM_DEV`), so that this view and `kubectl inspect cgpu`
//! show the same number for the same node. Containers without a quota
//! allocate nothing.

use super::{GpuInfo, Report, GIB};
use std::fmt::Write;

/// Bytes to whole GiB, rounded to nearest.
pub fn gib_round(bytes: u64) -> u64 {
    (bytes + GIB / 2) / GIB
}

/// A GPU's total in whole GiB: what the operator stated, else
/// `floor(bytes / GiB)`.
pub fn gpu_gib(bytes: u64, stated: Option<u64>) -> u64 {
    stated.unwrap_or(bytes / GIB)
}

/// This host's name.
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: buf is writable for its full length, which we pass; gethostname
    // NUL-terminates within it on success (we also cap at the first NUL).
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "localhost".into();
    }
    super::cstr(&buf).unwrap_or_else(|| "localhost".into())
}

/// The first non-loopback IPv4 address of this host, else 127.0.0.1.
pub fn ip_address() -> String {
    let mut ifap: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list head into ifap; we free it below.
    if unsafe { libc::getifaddrs(&mut ifap) } != 0 {
        return "127.0.0.1".into();
    }
    let mut found = None;
    let mut p = ifap;
    while !p.is_null() {
        // SAFETY: p is a node of the list getifaddrs returned, not yet freed.
        let ifa = unsafe { &*p };
        if !ifa.ifa_addr.is_null() {
            // SAFETY: ifa_addr points to a sockaddr of at least sa_family's size.
            let fam = unsafe { (*ifa.ifa_addr).sa_family };
            if i32::from(fam) == libc::AF_INET {
                // SAFETY: family AF_INET means the sockaddr is a sockaddr_in.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                let ip = std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
                if !ip.is_loopback() {
                    found = Some(ip.to_string());
                    break;
                }
            }
        }
        p = ifa.ifa_next;
    }
    // SAFETY: ifap came from a successful getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(ifap) };
    found.unwrap_or_else(|| "127.0.0.1".into())
}

fn allocated(g: &GpuInfo) -> u64 {
    g.containers.iter().map(|c| gib_round(c.quota_bytes)).sum()
}

fn percent(a: u64, t: u64) -> u64 {
    (a * 100).checked_div(t).unwrap_or(0)
}

fn row(out: &mut String, cols: &[String], widths: &[usize]) {
    let line: Vec<String> = cols
        .iter()
        .zip(widths)
        .map(|(c, w)| format!("{c:<w$}"))
        .collect();
    let _ = writeln!(out, "{}", line.join("  ").trim_end());
}

fn widths(rows: &[Vec<String>]) -> Vec<usize> {
    let n = rows.iter().map(Vec::len).max().unwrap_or(0);
    (0..n)
        .map(|i| {
            rows.iter()
                .filter_map(|r| r.get(i))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect()
}

/// Render the summary (or per-container detail with `detail`); `gpu_gib`
/// is the GPUs' size in GiB when the operator states it.
pub fn render(r: &Report, detail: bool, host: &str, ip: &str, gpu_gib: Option<u64>) -> String {
    let gpus: Vec<&GpuInfo> = r.gpus_ok().collect();
    let size = |g: &GpuInfo| self::gpu_gib(g.physical_total_bytes, gpu_gib);
    let alloc_total: u64 = gpus.iter().map(|g| allocated(g)).sum();
    let total: u64 = gpus.iter().map(|g| size(g)).sum();
    let mut out = String::new();
    if !detail {
        let mut head = vec!["NAME".to_owned(), "IPADDRESS".to_owned()];
        let mut vals = vec![host.to_owned(), ip.to_owned()];
        for g in &gpus {
            head.push(format!("GPU{}(Allocated/Total)", g.index));
            vals.push(format!("{}/{}", allocated(g), size(g)));
        }
        head.push("GPU Memory(GiB)".into());
        vals.push(format!("{alloc_total}/{total}"));
        let rows = vec![head, vals];
        let w = widths(&rows);
        for rw in &rows {
            row(&mut out, rw, &w);
        }
        let _ = writeln!(out, "{}", "-".repeat(69));
        let _ = writeln!(out, "Allocated/Total GPU Memory In Cluster:");
        let _ = writeln!(
            out,
            "{alloc_total}/{total} ({}%)",
            percent(alloc_total, total)
        );
    } else {
        let _ = writeln!(out, "NAME:       {host}");
        let _ = writeln!(out, "IPADDRESS:  {ip}");
        let _ = writeln!(out);
        let mut head = vec!["NAME".to_owned()];
        for g in &gpus {
            head.push(format!("GPU{}(Allocated)", g.index));
        }
        let mut rows = vec![head];
        let mut ids: Vec<&str> = gpus
            .iter()
            .flat_map(|g| g.containers.iter().map(|c| c.id.as_str()))
            .collect();
        ids.sort_unstable();
        ids.dedup();
        for id in ids {
            let mut rw = vec![id.to_owned()];
            for g in &gpus {
                let a: u64 = g
                    .containers
                    .iter()
                    .filter(|c| c.id == id)
                    .map(|c| gib_round(c.quota_bytes))
                    .sum();
                rw.push(a.to_string());
            }
            rows.push(rw);
        }
        let mut a = vec!["Allocated :".to_owned()];
        let mut t = vec!["Total :".to_owned()];
        for g in &gpus {
            let al = allocated(g);
            let tt = size(g);
            a.push(format!("{al} ({}%)", percent(al, tt)));
            t.push(tt.to_string());
        }
        rows.push(a);
        rows.push(t);
        let w = widths(&rows);
        for rw in &rows {
            row(&mut out, rw, &w);
        }
        let _ = writeln!(out, "{}", "-".repeat(69));
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "Allocated/Total GPU Memory In Cluster:  {alloc_total}/{total} ({}%)",
            percent(alloc_total, total)
        );
    }
    // Containers held back for lack of compute weight (all waiting ones
    // with `detail`), with the reason.
    for g in &gpus {
        for c in &g.containers {
            if let Some(w) = c.waiting.as_deref().filter(|_| detail || c.weight == 0) {
                let _ = writeln!(out, "GPU{} {}: {w}", g.index, c.id);
            }
        }
    }
    for e in r.gpus.iter().filter(|e| e.gpu.is_none()) {
        let _ = writeln!(
            out,
            "! {}: {} (not counted)",
            e.path,
            e.error.as_deref().unwrap_or("unreadable")
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::super::*;
    use super::*;

    #[test]
    fn seed_numbers() {
        // T4 15109 MiB counted as 15 (stated); one container of 3 GiB: 3/15 (20%)
        let mut f = fake_file(0, "GPU-a", 15109 * MIB);
        add_container(&mut f, 0, "disable-cgpu", 3 * GIB, 0, 1);
        let g = read_file(&f, &|_| true).unwrap();
        let mut f2 = fake_file(1, "GPU-b", 15109 * MIB);
        add_container(&mut f2, 0, "other", 6043 * MIB, 0, 1);
        let g2 = read_file(&f2, &|_| true).unwrap();
        let ok = |g| GpuEntry {
            path: "x".into(),
            status: Status::Ok,
            error: None,
            gpu: Some(g),
        };
        let r = Report {
            schema_version: 1,
            cgpu_version: "0.1.0".into(),
            ledger_format: 1,
            ledger_dir: "/run/cgpu".into(),
            timestamp_ns: 0,
            util_window_ms: None,
            agent: None,
            mode: crate::cooperative(),
            gpus: vec![ok(g), ok(g2)],
        };
        let s = render(&r, false, "node1", "10.0.0.1", Some(15));
        assert!(s.contains("GPU0(Allocated/Total)"), "{s}");
        assert!(s.contains("3/15"), "{s}");
        assert!(s.contains("6/15"), "{s}");
        assert!(s.ends_with("9/30 (30%)\n"), "{s}");
        let d = render(&r, true, "node1", "10.0.0.1", Some(15));
        assert!(d.contains("disable-cgpu"), "{d}");
        assert!(d.contains("3 (20%)"), "{d}");
        assert!(d.contains("In Cluster:  9/30 (30%)"), "{d}");
        // Not stated: floor(15109 / 1024) = 14, as the cluster view counts it.
        let s = render(&r, false, "node1", "10.0.0.1", None);
        assert!(s.contains("3/14"), "{s}");
        assert!(s.ends_with("9/28 (32%)\n"), "{s}");
    }

    #[test]
    fn gpu_size_is_floored_unless_stated() {
        assert_eq!(gpu_gib(16130 * MIB, None), 15);
        assert_eq!(gpu_gib(15109 * MIB, None), 14);
        assert_eq!(gpu_gib(15109 * MIB, Some(15)), 15);
    }
}
