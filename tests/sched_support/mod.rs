//! Shared harness of the scheduling tests and the `share` example: real
//! client processes under `LD_PRELOAD=libcgpu.so` on the simulated driver,
//! one simulated GPU per scenario, shares measured from the sim's ground
//! truth (`cgpu-sim-stat --json`, per-process device time).
#![allow(dead_code)]

pub mod scenarios;

use cgpu::ledger::Ledger;
use cgpu_testkit::{self as tk, LinkMode, SimEnv, SimStats};
use std::collections::HashMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::{Duration, Instant};

/// One container of a scenario.
#[derive(Clone, Debug)]
pub struct Ctr {
    pub id: String,
    pub weight: u32,
    pub highprio: bool,
    /// Processes, each a cuclient command line.
    pub procs: Vec<Vec<String>>,
    pub mode: LinkMode,
    pub extra_env: Vec<(String, String)>,
    /// Another client than cuclient (its processes' arguments are its own).
    pub exe: Option<PathBuf>,
}

impl Ctr {
    pub fn new(id: &str, weight: u32) -> Ctr {
        Ctr {
            id: id.into(),
            weight,
            highprio: false,
            procs: Vec::new(),
            mode: LinkMode::Link,
            extra_env: Vec::new(),
            exe: None,
        }
    }
    /// A process that keeps the GPU busy for `ms` with kernels of `ns`.
    pub fn busy(mut self, ms: u64, ns: u64) -> Ctr {
        self.procs.push(vec![
            "init".into(),
            "ready".into(),
            "spin_for".into(),
            ms.to_string(),
            ns.to_string(),
        ]);
        self
    }
    /// A process that joins (holds a context) and does no GPU work.
    pub fn idle(mut self) -> Ctr {
        self.procs
            .push(vec!["init".into(), "ready".into(), "hold".into()]);
        self
    }
    /// A process running `args` (cuclient commands).
    pub fn cmd(mut self, args: &[&str]) -> Ctr {
        self.procs
            .push(args.iter().map(|s| s.to_string()).collect());
        self
    }
    pub fn highprio(mut self) -> Ctr {
        self.highprio = true;
        self
    }
    pub fn mode(mut self, m: LinkMode) -> Ctr {
        self.mode = m;
        self
    }
    /// `THREADS` threads of one process keeping the GPU busy for `ms`
    /// (`tests/c/sched_threads.c`).
    pub fn threads(mut self, threads: u32, ms: u64, ns: u64) -> Ctr {
        let src = tk::workspace_root().join("tests/c/sched_threads.c");
        self.exe = Some(tk::compile_c(&src, &[], LinkMode::Link));
        self.procs
            .push(vec![threads.to_string(), ms.to_string(), ns.to_string()]);
        self
    }
    /// One process driving GPUs 0 and 1 in turn for `ms`
    /// (`tests/c/sched_twogpu.c`).
    pub fn two_gpus(mut self, ms: u64, ns: u64) -> Ctr {
        let src = tk::workspace_root().join("tests/c/sched_twogpu.c");
        self.exe = Some(tk::compile_c(&src, &[], LinkMode::Link));
        self.procs.push(vec![ms.to_string(), ns.to_string()]);
        self
    }
    /// A cuclient on GPU `d` (`-d d`) keeping it busy for `ms`.
    pub fn busy_on(mut self, d: u32, ms: u64, ns: u64) -> Ctr {
        self.procs.push(
            [
                "-d",
                &d.to_string(),
                "init",
                "ready",
                "spin_for",
                &ms.to_string(),
                &ns.to_string(),
            ]
            .iter()
            .map(|s| s.to_string())
            .collect(),
        );
        self
    }
    /// One `sched_load MODE` process (`tests/c/sched_load.c`): `sync`, a
    /// loop of KERNELS kernels of NS, a synchronise and PAUSE_US on the
    /// host; `requests`, the same as timed requests.
    pub fn load(mut self, mode: &str, ms: u64, ns: u64, kernels: u32, pause_us: u64) -> Ctr {
        let src = tk::workspace_root().join("tests/c/sched_load.c");
        self.exe = Some(tk::compile_c(&src, &[], LinkMode::Link));
        self.procs.push(vec![
            mode.into(),
            ms.to_string(),
            ns.to_string(),
            kernels.to_string(),
            pause_us.to_string(),
        ]);
        self
    }
    pub fn env(mut self, k: &str, v: &str) -> Ctr {
        self.extra_env.push((k.into(), v.into()));
        self
    }
}

/// A line a child printed, with when it arrived.
pub struct Line {
    pub at: Instant,
    pub text: String,
}

pub struct Proc {
    pub container: String,
    pub child: Child,
    pub lines: Receiver<Line>,
    pub seen: Vec<Line>,
}

impl Proc {
    /// Wait (up to `timeout`) for a line starting with `prefix`.
    pub fn wait_line(&mut self, prefix: &str, timeout: Duration) -> Option<&Line> {
        let end = Instant::now() + timeout;
        if let Some(i) = self.seen.iter().position(|l| l.text.starts_with(prefix)) {
            return Some(&self.seen[i]);
        }
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    let hit = l.text.starts_with(prefix);
                    self.seen.push(l);
                    if hit {
                        return self.seen.last();
                    }
                }
                Err(_) => return None,
            }
        }
    }
    /// Lines received so far (without waiting).
    pub fn drain_lines(&mut self) -> &[Line] {
        while let Ok(l) = self.lines.try_recv() {
            self.seen.push(l);
        }
        &self.seen
    }
}

/// A running scenario: one simulated GPU, its ledger directory, processes.
pub struct Scenario {
    pub env: SimEnv,
    pub ledger_dir: PathBuf,
    pub procs: Vec<Proc>,
    pub started: Instant,
}

pub fn artifacts() -> &'static tk::Artifacts {
    tk::artifacts()
}

impl Scenario {
    /// Start every process of `ctrs`, wait until all printed `ready` (the
    /// ones that do), and return with the ledger open.
    pub fn start(ctrs: &[Ctr]) -> Scenario {
        Scenario::start_on(ctrs, None)
    }

    /// [`Scenario::start`] on the simulated GPUs `gpus` (`CGPU_SIM_GPUS`).
    pub fn start_on(ctrs: &[Ctr], gpus: Option<&str>) -> Scenario {
        Scenario::start_with(ctrs, gpus, true)
    }

    /// The same processes on the simulated driver without cgpu (no
    /// `LD_PRELOAD`): the baseline a scenario is compared with.
    pub fn start_bare(ctrs: &[Ctr]) -> Scenario {
        Scenario::start_with(ctrs, None, false)
    }

    fn start_with(ctrs: &[Ctr], gpus: Option<&str>, cgpu: bool) -> Scenario {
        let a = tk::artifacts();
        let mut env = SimEnv::new().ctx_mib(16);
        if cgpu {
            env = env.preload(&a.libcgpu);
        }
        if let Some(g) = gpus {
            env = env.gpus(g);
        }
        let ledger_dir = env.state_dir.with_extension("ledger");
        let _ = std::fs::remove_dir_all(&ledger_dir);
        std::fs::create_dir_all(&ledger_dir).unwrap();
        let env = env
            .env("CGPU_LEDGER_DIR", ledger_dir.to_str().unwrap())
            .env("ALIYUN_COM_GPU_MEM_CONTAINER", "1")
            // `CGPU_SCHED_TEST_LOG=debug cargo test …` shows the library's log.
            .env(
                "CGPU_LOG",
                &std::env::var("CGPU_SCHED_TEST_LOG").unwrap_or_else(|_| "warn".into()),
            );
        let mut procs = Vec::new();
        for c in ctrs {
            let exe = c.exe.clone().unwrap_or_else(|| tk::cuclient(c.mode));
            for args in &c.procs {
                let mut cmd = env.command(&exe);
                cmd.args(args)
                    .env("CGPU_CONTAINER_ID", &c.id)
                    .env("ALIYUN_COM_GPU_SCHD_WEIGHT", c.weight.max(1).to_string())
                    .env(
                        "ALIYUN_COM_GPU_HIGH_PRIO",
                        if c.highprio { "1" } else { "0" },
                    )
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::inherit());
                for (k, v) in &c.extra_env {
                    cmd.env(k, v);
                }
                let mut child = cmd.spawn().expect("spawn cuclient");
                let out = child.stdout.take().unwrap();
                let (tx, rx) = channel();
                std::thread::spawn(move || {
                    let r = std::io::BufReader::new(out);
                    for l in r.lines() {
                        let Ok(text) = l else { break };
                        if tx
                            .send(Line {
                                at: Instant::now(),
                                text,
                            })
                            .is_err()
                        {
                            break;
                        }
                    }
                });
                procs.push(Proc {
                    container: c.id.clone(),
                    child,
                    lines: rx,
                    seen: Vec::new(),
                });
            }
        }
        let mut s = Scenario {
            env,
            ledger_dir,
            procs,
            started: Instant::now(),
        };
        for p in &mut s.procs {
            let wants_ready = true;
            if wants_ready {
                p.wait_line("ready", Duration::from_secs(60));
            }
        }
        s
    }

    /// The ledgers of `n` GPUs (waits for them to appear), sorted by path.
    pub fn ledgers(&self, n: usize) -> Vec<Ledger> {
        let end = Instant::now() + Duration::from_secs(30);
        loop {
            let paths = Ledger::list(&self.ledger_dir);
            if paths.len() >= n {
                if let Ok(v) = paths
                    .iter()
                    .map(|p| Ledger::open(p))
                    .collect::<Result<Vec<_>, _>>()
                {
                    return v;
                }
            }
            assert!(
                Instant::now() < end,
                "fewer than {n} ledgers in {}",
                self.ledger_dir.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The GPU's ledger (waits for it to appear).
    pub fn ledger(&self) -> Ledger {
        let end = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(p) = Ledger::list(&self.ledger_dir).first() {
                if let Ok(l) = Ledger::open(p) {
                    return l;
                }
            }
            assert!(
                Instant::now() < end,
                "no ledger in {}",
                self.ledger_dir.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The pid of container `id`'s first process.
    pub fn pid_of(&self, id: &str) -> i32 {
        self.procs
            .iter()
            .find(|p| p.container == id)
            .unwrap_or_else(|| panic!("no process of {id}"))
            .child
            .id() as i32
    }

    /// [`Scenario::measure_rounds`], and the median length (ns) of the
    /// slices held over the window: from the token's grant (RUNNING) to the
    /// end of that slice (DRAINING), as a thread watching the token every
    /// 100 µs sees them (what the policy's slice length governs; the drain
    /// after it is the holder's queue, the same whatever the policy). The
    /// median, not the mean: a slice cut short because the holder's thread
    /// got no CPU for the idle grace on a loaded machine is not the
    /// policy's slice length.
    pub fn measure_slices(&self, window: Duration) -> (Measure, f64) {
        use cgpu::scheduler::words::{gpu as gw, Token, DRAINING, RUNNING};
        use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
        let l = self.ledger();
        let h = &l.file().header;
        let stop = AtomicBool::new(false);
        std::thread::scope(|sc| {
            let watcher = sc.spawn(|| {
                let mut running: Option<(u32, Instant)> = None;
                // A slice already running when the watch begins is seen
                // from its middle: not counted.
                let first = Token::unpack(h.sched[gw::TOKEN].load(Relaxed)).seq;
                let mut slices: Vec<Duration> = Vec::new();
                while !stop.load(Relaxed) {
                    let t = Token::unpack(h.sched[gw::TOKEN].load(Relaxed));
                    match (t.state, running) {
                        (RUNNING, _) if t.seq == first => {}
                        (RUNNING, Some((seq, _))) if seq == t.seq => {}
                        (RUNNING, _) => running = Some((t.seq, Instant::now())),
                        (DRAINING, Some((seq, at))) if t.seq == seq.wrapping_add(1) => {
                            slices.push(at.elapsed());
                            running = None;
                        }
                        _ => running = None,
                    }
                    std::thread::sleep(Duration::from_micros(100));
                }
                slices.sort();
                slices
                    .get(slices.len() / 2)
                    .map_or(0.0, |d| d.as_nanos() as f64)
            });
            let m = self.measure_rounds(window);
            stop.store(true, Relaxed);
            (m, watcher.join().unwrap())
        })
    }

    pub fn slot(&self, l: &Ledger, id: &str) -> usize {
        l.find_container(id)
            .unwrap_or_else(|| panic!("container {id} not in the ledger"))
    }

    /// Device time per container over `window` (ground truth from the sim),
    /// and the window's wall time.
    pub fn measure(&self, window: Duration) -> Measure {
        self.measure_on(0, window)
    }

    /// [`Scenario::measure`] over whole rounds of the scheduler: the window
    /// opens when a slice is granted to some container and closes, once
    /// `window` has passed, when a slice is granted to that container again.
    /// A share measured over a fixed window is off by up to one slice in
    /// the window (8% of a 2 s window for 160 ms slices); over whole rounds
    /// it is not. Without a ledger, or when no slice is granted within a
    /// second (a stopped or idle GPU), it measures the plain window.
    pub fn measure_rounds(&self, window: Duration) -> Measure {
        let Some(l) = Ledger::list(&self.ledger_dir)
            .first()
            .and_then(|p| Ledger::open(p).ok())
        else {
            return self.measure(window);
        };
        self.measure_rounds_on(0, &l, None, window)
    }

    /// [`Scenario::measure_rounds`] on GPU `dev`, whose ledger is `l`,
    /// opening at a grant to container slot `first` when given (the one
    /// with the fewest slices: its share then counts whole slices only).
    pub fn measure_rounds_on(
        &self,
        dev: usize,
        l: &Ledger,
        first: Option<usize>,
        window: Duration,
    ) -> Measure {
        let limit = Duration::from_secs(1);
        let Some(first) = await_grant(l, first, limit) else {
            return self.measure_on(dev, window);
        };
        let slices = |l: &Ledger| -> HashMap<String, u64> {
            use cgpu::scheduler::words::container as cw;
            use std::sync::atomic::Ordering::Relaxed;
            let mut out = HashMap::new();
            for p in &self.procs {
                if let Some(c) = l.find_container(&p.container) {
                    out.insert(
                        p.container.clone(),
                        l.file().containers[c].sched[cw::SLICES].load(Relaxed),
                    );
                }
            }
            out
        };
        let n0 = slices(l);
        let s0 = self.env.stats();
        let t0 = Instant::now();
        std::thread::sleep(window);
        // A second window's worth of slices at most: the same holder comes
        // back within one round unless it stopped asking.
        let _ = await_grant(l, Some(first), limit.max(window / 2));
        let mut m = self.measure_between(dev, s0, t0);
        for (id, n) in slices(l) {
            m.slices.insert(
                id.clone(),
                n.saturating_sub(n0.get(&id).copied().unwrap_or(n)),
            );
        }
        m
    }

    /// [`Scenario::measure_rounds`] of this scenario and, over the same
    /// time, [`Scenario::measure`] of `bare` (the same processes without
    /// cgpu on a simulated GPU of their own, started alongside): whatever
    /// load the machine is under weighs on both alike.
    pub fn measure_rounds_beside(&self, bare: &Scenario, window: Duration) -> (Measure, Measure) {
        let s0 = bare.env.stats();
        let t0 = Instant::now();
        let m = self.measure_rounds(window);
        (m, bare.measure_between(0, s0, t0))
    }

    /// [`Scenario::measure`] of this scenario and of `bare` over the same
    /// time (see [`Scenario::measure_rounds_beside`]).
    pub fn measure_beside(&self, bare: &Scenario, window: Duration) -> (Measure, Measure) {
        let s0 = bare.env.stats();
        let t0 = Instant::now();
        let m = self.measure(window);
        (m, bare.measure_between(0, s0, t0))
    }

    /// [`Scenario::measure`] on GPU `dev`.
    pub fn measure_on(&self, dev: usize, window: Duration) -> Measure {
        let s0 = self.env.stats();
        let t0 = Instant::now();
        std::thread::sleep(window);
        self.measure_between(dev, s0, t0)
    }

    /// Device time per container on GPU `dev` from `s0` (taken at `t0`) to now.
    pub fn measure_between(&self, dev: usize, s0: SimStats, t0: Instant) -> Measure {
        let s1 = self.env.stats();
        let wall = t0.elapsed().as_nanos() as u64;
        let mut per: HashMap<String, u64> = HashMap::new();
        for p in &self.procs {
            let pid = p.child.id();
            let a = s0.process(pid, dev).map_or(0, |x| x.device_time_ns);
            let b = s1.process(pid, dev).map_or(a, |x| x.device_time_ns);
            *per.entry(p.container.clone()).or_default() += b.saturating_sub(a);
        }
        let busy = s1.devices[dev]
            .busy_ns
            .saturating_sub(s0.devices[dev].busy_ns);
        Measure {
            per,
            wall,
            busy,
            slices: HashMap::new(),
        }
    }

    pub fn kill_all(&mut self) {
        for p in &mut self.procs {
            let _ = p.child.kill();
            let _ = p.child.wait();
        }
    }
}

impl Drop for Scenario {
    fn drop(&mut self) {
        self.kill_all();
        let _ = std::fs::remove_dir_all(&self.ledger_dir);
    }
}

/// Waits at most `limit` for the ledger to grant a new slice (to `want`
/// when given) and returns the container it went to.
fn await_grant(l: &Ledger, want: Option<usize>, limit: Duration) -> Option<usize> {
    use cgpu::scheduler::words::{gpu as gw, Token};
    use std::sync::atomic::Ordering::Relaxed;
    let h = &l.file().header;
    let end = Instant::now() + limit;
    let mut seen = h.sched[gw::SLICES].load(Relaxed);
    while Instant::now() < end {
        let n = h.sched[gw::SLICES].load(Relaxed);
        if n != seen {
            seen = n;
            let holder = Token::unpack(h.sched[gw::TOKEN].load(Relaxed)).holder_slot();
            if holder.is_some() && (want.is_none() || holder == want) {
                return holder;
            }
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    None
}

#[derive(Debug, Clone)]
pub struct Measure {
    pub per: HashMap<String, u64>,
    pub wall: u64,
    pub busy: u64,
    /// Slices granted to each container over the window (measured over
    /// whole rounds with a ledger; empty otherwise).
    pub slices: HashMap<String, u64>,
}

impl Measure {
    /// Device time of `id` over the wall time of the window.
    pub fn of_wall(&self, id: &str) -> f64 {
        self.per.get(id).copied().unwrap_or(0) as f64 / self.wall as f64
    }
    /// Device time of `id` over all containers' device time.
    pub fn of_busy(&self, id: &str) -> f64 {
        let sum: u64 = self.per.values().sum();
        self.per.get(id).copied().unwrap_or(0) as f64 / sum.max(1) as f64
    }
    /// All containers' device time over wall time.
    pub fn utilisation(&self) -> f64 {
        self.per.values().sum::<u64>() as f64 / self.wall as f64
    }
}

/// Relative error of `got` against `want`.
pub fn rel_err(got: f64, want: f64) -> f64 {
    (got - want).abs() / want
}

pub fn path_str(p: &Path) -> &str {
    p.to_str().unwrap()
}
