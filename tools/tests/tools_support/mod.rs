//! Support for the tools' tests: ledger-level client processes, running the
//! binaries, and the reference Prometheus text parser (Python `prometheus_client`).
#![allow(dead_code)]

use cgpu_ledger::{JoinRequest, Ledger};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Output, Stdio};

pub const GIB: u64 = 1 << 30;
pub const MIB: u64 = 1 << 20;

pub fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cgpu-tools-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

pub fn smi() -> Command {
    Command::new(env!("CARGO_BIN_EXE_cgpu-smi"))
}

pub fn ctl() -> Command {
    Command::new(env!("CARGO_BIN_EXE_cgpuctl"))
}

/// Run with `--dir dir` and the given args.
pub fn run(mut c: Command, dir: &Path, args: &[&str]) -> Output {
    c.arg("--dir").arg(dir).args(args);
    c.env_remove("CGPU_LEDGER_DIR");
    c.output().expect("run tool")
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A child process killed when the test ends, passed or not.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What a client process is asked to be.
#[derive(Clone, Debug)]
pub struct ClientSpec {
    pub uuid: String,
    pub index: u32,
    pub id: String,
    pub quota: u64,
    pub weight: u32,
    pub highprio: bool,
    pub bytes: u64,
    /// Hold the table lock this long while joining (0: no pause).
    pub join_pause_ms: u64,
}

/// A separate process (this test binary re-executed) that joined a ledger
/// through the ledger API and holds `bytes`; it answers `alloc N` / `free N`
/// on stdin with `R: ok` / `R: oom` and stays until `exit` or killed.
pub struct Client {
    pub child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
    pub pid: u32,
    pub container: usize,
    pub process: usize,
}

/// Env var that turns this test binary into a client.
pub const HELPER_ENV: &str = "CGPU_TOOLS_TEST_CLIENT";

impl Client {
    pub fn start(test_name: &str, dir: &Path, s: &ClientSpec) -> Client {
        Client::spawn(test_name, dir, s).wait_ready()
    }

    /// Start without waiting for it to have joined.
    pub fn spawn(test_name: &str, dir: &Path, s: &ClientSpec) -> Starting {
        let child = Command::new(std::env::current_exe().unwrap())
            .args([test_name, "--exact", "--nocapture", "--test-threads=1"])
            .env(HELPER_ENV, "1")
            .env("T_DIR", dir)
            .env("T_UUID", &s.uuid)
            .env("T_INDEX", s.index.to_string())
            .env("T_ID", &s.id)
            .env("T_QUOTA", s.quota.to_string())
            .env("T_WEIGHT", s.weight.to_string())
            .env("T_HIGHPRIO", if s.highprio { "1" } else { "0" })
            .env("T_BYTES", s.bytes.to_string())
            .env("T_JOIN_PAUSE_MS", s.join_pause_ms.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn client");
        Starting(Some(child))
    }
}

/// A client process that may not have joined yet.
pub struct Starting(Option<Child>);

impl Drop for Starting {
    fn drop(&mut self) {
        if let Some(c) = &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Starting {
    /// Wait until it joined and holds its bytes.
    pub fn wait_ready(mut self) -> Client {
        let mut child = self.0.take().unwrap();
        let pid = child.id();
        let input = child.stdin.take().unwrap();
        let mut output = BufReader::new(child.stdout.take().unwrap());
        let line = read_tagged(&mut output, "ready ");
        let v: Vec<usize> = line
            .split_whitespace()
            .map(|x| x.parse().unwrap())
            .collect();
        Client {
            child,
            input,
            output,
            pid,
            container: v[0],
            process: v[1],
        }
    }
}

impl Client {
    fn ask(&mut self, cmd: &str) -> String {
        writeln!(self.input, "{cmd}").unwrap();
        self.input.flush().unwrap();
        read_tagged(&mut self.output, "R: ")
    }

    /// Ask for `bytes` more: true if granted.
    pub fn alloc(&mut self, bytes: u64) -> bool {
        match self.ask(&format!("alloc {bytes}")).as_str() {
            "ok" => true,
            "oom" => false,
            other => panic!("client said {other}"),
        }
    }

    pub fn free(&mut self, bytes: u64) {
        assert_eq!(self.ask(&format!("free {bytes}")), "ok");
    }

    pub fn kill9(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn exit(mut self) {
        let _ = writeln!(self.input, "exit");
        let _ = self.child.wait();
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn read_tagged(r: &mut impl BufRead, tag: &str) -> String {
    let mut line = String::new();
    loop {
        line.clear();
        if r.read_line(&mut line).unwrap() == 0 {
            panic!("client exited before saying `{tag}`");
        }
        // libtest may have printed `test client_process ... ` before it
        if let Some(i) = line.find(tag) {
            return line[i + tag.len()..].trim_end().to_owned();
        }
    }
}

/// Body of the client process: call first thing in the helper test.
pub fn client_main_if_asked() -> bool {
    if std::env::var_os(HELPER_ENV).is_none() {
        return false;
    }
    let e = |k: &str| std::env::var(k).unwrap();
    let dir = PathBuf::from(e("T_DIR"));
    let l = Ledger::open_or_create(&dir, &e("T_UUID"), e("T_INDEX").parse().unwrap(), 16 * GIB)
        .unwrap();
    let id = e("T_ID");
    if let Ok(ms) = std::env::var("T_JOIN_PAUSE_MS") {
        // hold the ledger's table lock this long in the middle of joining
        cgpu_ledger::TEST_JOIN_PAUSE_MS
            .store(ms.parse().unwrap(), std::sync::atomic::Ordering::Relaxed);
    }
    let m = l
        .join(&JoinRequest {
            container_id: &id,
            key: 0,
            quota: e("T_QUOTA").parse().unwrap(),
            weight: e("T_WEIGHT").parse().unwrap(),
            highprio: e("T_HIGHPRIO") == "1",
            enforce_off: false,
        })
        .unwrap();
    let bytes: u64 = e("T_BYTES").parse().unwrap();
    if bytes > 0 {
        l.try_reserve(&m, bytes).unwrap();
    }
    let out = std::io::stdout();
    {
        let mut o = out.lock();
        writeln!(o, "ready {} {}", m.container, m.process).unwrap();
        o.flush().unwrap();
    }
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        let line = line.unwrap();
        let mut it = line.split_whitespace();
        let reply = match (it.next(), it.next().and_then(|x| x.parse::<u64>().ok())) {
            (Some("alloc"), Some(n)) => {
                if l.try_reserve(&m, n).is_ok() {
                    "ok"
                } else {
                    "oom"
                }
            }
            (Some("free"), Some(n)) => {
                l.release(&m, n);
                "ok"
            }
            (Some("exit"), _) => break,
            _ => "?",
        };
        let mut o = out.lock();
        writeln!(o, "R: {reply}").unwrap();
        o.flush().unwrap();
    }
    l.leave(m);
    true
}

/// One sample of Prometheus text, as the reference parser read it.
#[derive(Debug, Clone)]
pub struct PromSample {
    /// The family (the name in `# TYPE`, what the exporter documents).
    pub family: String,
    /// The sample's own name as the parser reports it (for a counter the
    /// reference parser appends `_total` to a family that does not end in it).
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Parses Prometheus text with the reference parser, the `prometheus_client`
/// Python package's `text_string_to_metric_families` (in the test venv,
/// `scripts/test-deps.sh`). Returns the samples and each family's type,
/// keyed by family name; `Err` with the parser's message when it rejects
/// the text.
pub fn parse_prometheus(text: &str) -> Result<(Vec<PromSample>, BTreeMap<String, String>), String> {
    let deps = cgpu_testkit::test_deps();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/parse_prometheus.py");
    let mut child = Command::new(&deps.python)
        .arg(&script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the test venv's python");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into_owned());
    }
    let fams: serde_json::Value = serde_json::from_slice(&out.stdout).expect("parser JSON");
    let mut types = BTreeMap::new();
    let mut samples = Vec::new();
    for f in fams.as_array().unwrap() {
        let name = f["name"].as_str().unwrap().to_owned();
        types.insert(name.clone(), f["type"].as_str().unwrap().to_owned());
        for s in f["samples"].as_array().unwrap() {
            samples.push(PromSample {
                family: name.clone(),
                name: s["name"].as_str().unwrap().to_owned(),
                labels: s["labels"]
                    .as_object()
                    .unwrap()
                    .iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
                    .collect(),
                value: s["value"].as_str().unwrap().parse().unwrap(),
            });
        }
    }
    Ok((samples, types))
}

/// Find the one sample of family `name` whose labels include all of `want`.
pub fn find<'a>(s: &'a [PromSample], name: &str, want: &[(&str, &str)]) -> Option<&'a PromSample> {
    let m: Vec<&PromSample> = s
        .iter()
        .filter(|x| {
            x.family == name
                && want
                    .iter()
                    .all(|(k, v)| x.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .collect();
    assert!(m.len() <= 1, "{name} {want:?}: several samples");
    m.first().copied()
}
