//! `cgpuctl tree`: the ledgers shown as cGPU's `/proc/cgpu_km` tree.
//!
//! ```text
//! cgpu_km/                                  (from /run/cgpu)
//! ├── 0/                                    (GPU-…)
//! │   ├── 012b2edccd7a/
//! │   │   ├── highprio: 0
//! │   │   ├── id: 012b2edccd7a
//! │   │   ├── meminfo: Free: 6730809344
//! │   │   │            PID: 19772 Mem: 200278016
//! │   │   ├── memsize: 6442450944
//! │   │   └── weight: 1
//! │   ├── free_weight: 14
//! …
//! ```
//! Names sort as `ls` sorts them. `--flat` prints `path: value` lines instead
//! (like `grep -r . /proc/cgpu_km`).

use super::{GpuInfo, Report, CGPU_VERSION};
use cgpu_ledger::FORMAT_VERSION;

/// A node: name, value lines (empty for a directory), children.
struct Node {
    name: String,
    note: String,
    value: Vec<String>,
    children: Vec<Node>,
}

impl Node {
    fn file(name: &str, value: impl ToString) -> Node {
        Node {
            name: name.into(),
            note: String::new(),
            value: vec![value.to_string()],
            children: vec![],
        }
    }
    fn multi(name: &str, value: Vec<String>) -> Node {
        Node {
            name: name.into(),
            note: String::new(),
            value,
            children: vec![],
        }
    }
    fn dir(name: &str, note: String, mut children: Vec<Node>) -> Node {
        children.sort_by(|a, b| a.name.cmp(&b.name));
        Node {
            name: name.into(),
            note,
            value: vec![],
            children,
        }
    }
}

/// cGPU's `meminfo`: `Free: <bytes>` then `PID: <pid> Mem: <bytes>` per process.
pub fn meminfo(c: &super::ContainerInfo) -> Vec<String> {
    let mut v = vec![format!("Free: {}", c.free_bytes)];
    for p in &c.processes {
        v.push(format!("PID: {} Mem: {}", p.pid, p.used_bytes));
    }
    v
}

fn gpu_node(g: &GpuInfo) -> Node {
    let mut ch = vec![
        Node::file("free_weight", g.free_weight),
        Node::file("max_inst", g.max_inst),
        Node::file("policy", g.policy),
        Node::file("prio_ratio", g.prio_ratio),
    ];
    for c in &g.containers {
        ch.push(Node::dir(
            &c.id,
            String::new(),
            vec![
                Node::file("highprio", u8::from(c.highprio)),
                Node::file("id", &c.id),
                Node::multi("meminfo", meminfo(c)),
                Node::file("memsize", c.quota_bytes),
                Node::file("weight", c.weight),
            ],
        ));
    }
    Node::dir(&g.index.to_string(), format!("({})", g.uuid), ch)
}

fn root(r: &Report) -> Node {
    let mut ch = vec![Node::file(
        "version",
        format!("{CGPU_VERSION} (ledger format {FORMAT_VERSION})"),
    )];
    let dm: Vec<u64> = r.gpus_ok().map(|g| g.default_memsize_bytes).collect();
    let dm_value = match dm.first() {
        None => "0".to_owned(),
        Some(v) if dm.iter().all(|x| x == v) => v.to_string(),
        Some(_) => r
            .gpus_ok()
            .map(|g| format!("{}:{}", g.index, g.default_memsize_bytes))
            .collect::<Vec<_>>()
            .join(" "),
    };
    ch.push(Node::file("default_memsize", dm_value));
    for g in r.gpus_ok() {
        ch.push(gpu_node(g));
    }
    for e in r.gpus.iter().filter(|e| e.gpu.is_none()) {
        let name = std::path::Path::new(&e.path)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| e.path.clone());
        ch.push(Node::file(
            &format!("?{name}"),
            format!(
                "NOT TRUSTED: {}",
                e.error.as_deref().unwrap_or("unreadable")
            ),
        ));
    }
    Node::dir("cgpu_km", format!("(from {})", r.ledger_dir), ch)
}

fn label(n: &Node) -> String {
    if n.value.is_empty() {
        format!("{}/", n.name)
    } else {
        format!("{}: ", n.name)
    }
}

fn draw(n: &Node, prefix: &str, last: bool, top: bool, out: &mut String) {
    let (branch, cont) = if top {
        ("", "")
    } else if last {
        ("└── ", "    ")
    } else {
        ("├── ", "│   ")
    };
    let head = format!("{prefix}{branch}{}", label(n));
    if n.value.is_empty() {
        if n.note.is_empty() {
            out.push_str(&format!("{head}\n"));
        } else {
            out.push_str(&format!("{head:<40} {}\n", n.note));
        }
    } else {
        let width = head.chars().count();
        let sub = if n.children.is_empty() && !last && !top {
            format!("{prefix}│   ")
        } else {
            format!("{prefix}{cont}")
        };
        for (i, v) in n.value.iter().enumerate() {
            if i == 0 {
                out.push_str(&format!("{head}{v}\n"));
            } else {
                let pad = width.saturating_sub(sub.chars().count());
                out.push_str(&format!("{sub}{:pad$}{v}\n", ""));
            }
        }
    }
    let child_prefix = format!("{prefix}{cont}");
    for (i, c) in n.children.iter().enumerate() {
        draw(c, &child_prefix, i + 1 == n.children.len(), false, out);
    }
}

fn flat(n: &Node, path: &str, out: &mut String) {
    for c in &n.children {
        let p = if path.is_empty() {
            c.name.clone()
        } else {
            format!("{path}/{}", c.name)
        };
        if c.value.is_empty() {
            flat(c, &p, out);
        } else {
            for v in &c.value {
                out.push_str(&format!("{p}: {v}\n"));
            }
        }
    }
}

/// Render the tree (or `path: value` lines when `flat_lines`).
pub fn render(r: &Report, flat_lines: bool) -> String {
    let n = root(r);
    let mut out = String::new();
    if flat_lines {
        flat(&n, "", &mut out);
    } else {
        draw(&n, "", true, true, &mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::testutil::*;
    use super::super::*;
    use super::*;

    #[test]
    fn seed_names() {
        let mut f = fake_file(0, "GPU-aaaa", 16 * GIB);
        add_container(&mut f, 0, "012b2edccd7a", 6 * GIB, 200278016, 1);
        add_container(&mut f, 1, "0852a381c0cf", 6 * GIB, 0, 1);
        add_process(&mut f, 0, 0, 19772, 200278016);
        let g = read_file(&f, &|_| true).unwrap();
        let r = Report {
            schema_version: 1,
            cgpu_version: "0.1.0".into(),
            ledger_format: 1,
            ledger_dir: "/run/cgpu".into(),
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
        let fl = render(&r, true);
        assert!(fl.contains("0/policy: 1\n"), "{fl}");
        assert!(fl.contains("0/max_inst: 16\n"), "{fl}");
        assert!(
            fl.contains("0/012b2edccd7a/meminfo: Free: 6242172928\n"),
            "{fl}"
        );
        assert!(
            fl.contains("0/012b2edccd7a/meminfo: PID: 19772 Mem: 200278016\n"),
            "{fl}"
        );
        assert!(fl.contains("0/012b2edccd7a/memsize: 6442450944\n"), "{fl}");
        assert!(fl.contains("default_memsize: 0\n"), "{fl}");
        let t = render(&r, false);
        println!("{t}");
        assert!(t.contains("├── 012b2edccd7a/"), "{t}");
        assert!(t.contains("meminfo: Free: 6242172928"), "{t}");
        // `ls` order inside the GPU dir
        let i0 = t.find("012b2edccd7a/").unwrap();
        let i1 = t.find("0852a381c0cf/").unwrap();
        let i2 = t.find("free_weight").unwrap();
        let i3 = t.find("prio_ratio").unwrap();
        assert!(i0 < i1 && i1 < i2 && i2 < i3, "{t}");
    }
}
