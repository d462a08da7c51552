//! Two library versions on one node keep one set of books: a process that
//! speaks only the previous release's ledger format (a C client compiled
//! from that release's `cgpu.h`, kept in `tests/c/cgpu-previous/`) and the
//! current library share one container's quota exactly, whichever arrives
//! first; what the current version adds never misleads it (a slot it
//! reclaims keeps no stale identity) and a file that requires more than a
//! version understands is refused by it.

use cgpu::ledger::*;
use cgpu_testkit::{artifacts, cuclient, LinkMode, SimEnv};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// The previous release's client, compiled once.
fn v3_client() -> PathBuf {
    static BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ledger_v3_client");
        let o = Command::new("gcc")
            .args(["-std=c11", "-O1", "-Wall", "-Werror", "-I"])
            .arg(root.join("tests/c/cgpu-previous"))
            .arg(root.join("tests/c/ledger_v3_client.c"))
            .arg("-o")
            .arg(&out)
            .output()
            .expect("gcc");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        out
    })
    .clone()
}

struct Rig {
    sim: SimEnv,
}

impl Rig {
    /// A simulated T4 and its ledger, created before anyone arrives.
    fn new(name: &str) -> (Rig, PathBuf) {
        let sim = SimEnv::new().gpus("15109:Tesla T4");
        let dir = sim.state_dir.join(format!("ledger-{name}"));
        std::fs::create_dir_all(&dir).unwrap();
        let sim = sim.env("CGPU_LEDGER_DIR", dir.to_str().unwrap());
        let o = sim.run(cuclient(LinkMode::Link), &["init"]);
        assert!(o.status.success());
        let uuid = sim.stats().devices[0].uuid.clone();
        let l = Ledger::open_or_create(&dir, &uuid, 0, 15109 * MIB).unwrap();
        let path = l.path().to_owned();
        (Rig { sim }, path)
    }

    fn current(&self, id: &str, args: &[&str]) -> Child {
        let mut c = self.sim.command(cuclient(LinkMode::Link));
        c.env("LD_PRELOAD", &artifacts().libcgpu)
            .env("CGPU_CONTAINER_ID", id)
            .env("ALIYUN_COM_GPU_MEM_CONTAINER", "1")
            .env("CUCLIENT_HOLD_MAX_S", "60")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c.spawn().unwrap()
    }

    fn previous(&self, ledger: &Path, id: &str, chunk: u64) -> Child {
        Command::new(v3_client())
            .arg(ledger)
            .arg(id)
            .arg(GIB.to_string())
            .arg(chunk.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    fn device_bytes(&self) -> u64 {
        let s = self.sim.stats();
        s.processes
            .iter()
            .filter(|p| p.alive)
            .map(|p| p.mem_bytes)
            .sum()
    }
}

fn read_until(out: &mut BufReader<ChildStdout>, prefix: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let t0 = Instant::now();
    loop {
        let mut l = String::new();
        if out.read_line(&mut l).unwrap_or(0) == 0 {
            return lines;
        }
        let done = l.starts_with(prefix);
        lines.push(l.trim_end().to_string());
        if done || t0.elapsed() > Duration::from_secs(60) {
            return lines;
        }
    }
}

fn holding(c: &mut Child) -> Vec<String> {
    let mut out = BufReader::new(c.stdout.take().unwrap());
    read_until(&mut out, "holding")
}

fn num(lines: &[String], key: &str) -> u64 {
    lines
        .iter()
        .flat_map(|l| l.split_whitespace())
        .find_map(|w| w.strip_prefix(&format!("{key}=")))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {lines:?}"))
}

fn stop(mut c: Child) {
    let _ = c.kill();
    let _ = c.wait();
}

/// The previous version arrives first and holds 600 MiB of the
/// container's 1 GiB; the current library's process of the same container
/// gets the rest, to the chunk, and no more.
#[test]
fn previous_first_then_current_share_one_quota() {
    let (rig, ledger) = Rig::new("prevfirst");
    let mut old = rig.previous(&ledger, "mixed", 600 * MIB);
    let lo = holding(&mut old);
    assert_eq!(num(&lo, "granted"), 600 * MIB, "{lo:?}");
    let mut cur = rig.current("mixed", &["alloc_until_oom", "67108864", "hold"]);
    let lc = holding(&mut cur);
    let device = rig.device_bytes();
    let l = Ledger::open(&ledger).unwrap();
    let c = l.find_container("mixed").expect("one container");
    let (used, nprocs) = (
        l.file().containers[c].used.load(Ordering::Acquire),
        l.file().containers[c].nprocs.load(Ordering::Acquire),
    );
    stop(cur);
    stop(old);
    assert_eq!(nprocs, 2, "both in one container: {lc:?}");
    assert!(
        device + 600 * MIB <= GIB,
        "current {} MiB + previous 600 MiB passes 1 GiB: {lc:?}",
        device / MIB
    );
    assert!(
        device + 600 * MIB + 64 * MIB > GIB,
        "current {} MiB: refused before the quota was reached: {lc:?}",
        device / MIB
    );
    assert_eq!(used, device + 600 * MIB, "the books are the device's");
}

/// The current library arrives first; the previous version's process of
/// the same container finds its slot by name and is refused at the quota.
#[test]
fn current_first_then_previous_share_one_quota() {
    let (rig, ledger) = Rig::new("curfirst");
    let mut cur = rig.current("mixed", &["alloc", "536870912", "hold"]);
    let lc = holding(&mut cur);
    assert!(lc.iter().any(|l| l.starts_with("alloc ok")), "{lc:?}");
    let device = rig.device_bytes();
    let mut old = rig.previous(&ledger, "mixed", 64 * MIB);
    let lo = holding(&mut old);
    stop(old);
    stop(cur);
    let granted = num(&lo, "granted");
    assert_eq!(num(&lo, "nprocs"), 2, "{lo:?}");
    assert_eq!(
        num(&lo, "created"),
        0,
        "joined the current one's slot: {lo:?}"
    );
    assert!(
        device + granted <= GIB && device + granted + 64 * MIB > GIB,
        "current {} MiB + previous {} MiB against 1 GiB: {lo:?}",
        device / MIB,
        granted / MIB
    );
}

fn req(id: &str) -> JoinRequest<'_> {
    JoinRequest {
        container_id: id,
        key: 0,
        quota: GIB,
        weight: 1,
        highprio: false,
        enforce_off: false,
    }
}

/// A container slot the current version used and gave back is claimed by
/// a previous-version process of another container: the key left in it is
/// stale, never taken for the new owner's identity.
#[test]
fn a_slot_reclaimed_by_the_previous_version_keeps_no_stale_identity() {
    let (_rig, ledger) = Rig::new("stale");
    let l = Ledger::open(&ledger).unwrap();
    let m = l.join(&req("alpha")).unwrap();
    let slot = m.container;
    assert_ne!(l.file().containers[slot].current_key(), 0);
    l.leave(&m);
    let mut old = Command::new(v3_client())
        .arg(&ledger)
        .args(["beta", &GIB.to_string(), &(256 * MIB).to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let lo = holding(&mut old);
    let beta = l.find_container("beta").expect("beta's slot");
    assert_eq!(beta, slot, "the same slot reused: {lo:?}");
    assert_eq!(
        l.file().containers[beta].current_key(),
        0,
        "a stale key reads as unknown"
    );
    let a = l.join(&req("alpha")).unwrap();
    let b = l.join(&req("beta")).unwrap();
    stop(old);
    assert_ne!(a.container, beta, "alpha is not beta");
    assert_eq!(b.container, beta, "beta found by its name");
}

/// A file that requires an addition this version does not know is not
/// joined (books it cannot keep right), with a message naming the fix.
#[test]
fn a_file_requiring_an_unknown_addition_is_refused() {
    let (_rig, ledger) = Rig::new("required");
    let l = Ledger::open(&ledger).unwrap();
    assert_eq!(l.file().header.additions.load(Ordering::Acquire), ADDITIONS);
    l.file().header.required.store(1 << 40, Ordering::Release);
    let e = l.join(&req("x")).unwrap_err().to_string();
    assert!(
        e.contains("requires format additions") && e.contains("upgrade"),
        "{e}"
    );
    l.file()
        .header
        .required
        .store(ADD_CONTAINER_KEY, Ordering::Release);
    assert!(l.join(&req("x")).is_ok(), "a known one is fine");
}
