//! The scheduling scenarios: one table, run by `cargo test --test sched`
//! (short windows, each row asserted) and by
//! `cargo run --release --example share` (long windows, every row printed).
//!
//! Utilisation and throughput are never compared with a fixed number: the
//! same processes run without cgpu (no `LD_PRELOAD`, the simulated driver's
//! own time-slicing) in the same run, and the row is cgpu's value over that
//! bare value, so load on the machine weighs on both alike.

use super::*;
use cgpu::scheduler::words::{container as cw, gpu as gw, Token, DRAINING, RUNNING};
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

const MS: u64 = 1_000_000;

/// How a row's achieved value is judged against its target.
#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Kind {
    /// Within the tolerance of the target (relative error).
    Share,
    /// At least the target (no tolerance: the target already is a
    /// fraction of a value measured in the same run).
    AtLeast,
    /// At most the target (no tolerance, as above).
    AtMost,
    /// Printed, not judged (a goal not met today, or context).
    Info,
    /// Within `[lo, hi]` (a share that depends on the host's free CPU, as
    /// `cargo test` judges it: see [`Rows::host_share`]).
    Within(f64, f64),
}

#[derive(Clone, Debug)]
pub struct Row {
    pub scenario: String,
    pub what: String,
    pub target: f64,
    pub achieved: f64,
    pub kind: Kind,
}

impl Row {
    /// Relative shortfall against the target (0 when the row holds).
    pub fn err(&self) -> f64 {
        match self.kind {
            Kind::AtLeast if self.achieved >= self.target => 0.0,
            Kind::AtMost if self.achieved <= self.target => 0.0,
            Kind::Info if self.target.is_nan() => 0.0,
            Kind::Within(lo, hi) if (lo..=hi).contains(&self.achieved) => 0.0,
            Kind::Within(lo, hi) => rel_err(self.achieved, self.achieved.clamp(lo, hi)),
            _ => rel_err(self.achieved, self.target),
        }
    }
    /// Does the row hold, with `tol` for [`Kind::Share`] rows?
    pub fn holds(&self, tol: f64) -> bool {
        match self.kind {
            Kind::Share => self.err() <= tol,
            Kind::AtLeast | Kind::AtMost | Kind::Within(..) => self.err() == 0.0,
            Kind::Info => true,
        }
    }
    pub fn target_str(&self) -> String {
        match self.kind {
            Kind::AtLeast => format!("≥ {:.4}", self.target),
            Kind::AtMost => format!("≤ {:.4}", self.target),
            Kind::Info if self.target.is_nan() => "—".into(),
            Kind::Info => format!("({:.4})", self.target),
            Kind::Share => format!("{:.4}", self.target),
            Kind::Within(lo, hi) => format!("{lo:.4}–{hi:.4}"),
        }
    }
}

/// Window lengths.
#[derive(Clone, Copy, Debug)]
pub struct Opts {
    pub window: Duration,
    pub warm: Duration,
    /// Judge only what holds whatever the host's load (`cargo test`): a
    /// measurement that depends on the host's free CPU is shown, or judged
    /// by bounds that hold at any load (see [`Rows::host_share`]).
    pub any_load: bool,
}

impl Opts {
    /// `cargo test`: short windows.
    pub fn test() -> Opts {
        Opts {
            window: Duration::from_millis(2000),
            warm: Duration::from_millis(600),
            any_load: true,
        }
    }
    /// `examples/share`: `secs` windows.
    pub fn long(secs: u64) -> Opts {
        Opts {
            window: Duration::from_secs(secs),
            warm: Duration::from_millis(1000),
            any_load: false,
        }
    }
    /// These windows, long enough that the smallest share `min_share`
    /// spans at least 20 slices of 40 ms: a window's edges cut a slice of
    /// any container, so a share over N of its slices is off by up to 1/N
    /// (over a 2 s window a weight-1 container of 1:1:2:4 has about 6
    /// slices: one more or less is 17%).
    pub fn for_share(&self, min_share: f64) -> Opts {
        let slice = cgpu::scheduler::SLICE_NS as f64 / 1e9;
        let need = Duration::from_secs_f64(20.0 * slice / min_share);
        Opts {
            window: self.window.max(need),
            ..*self
        }
    }
    /// These windows, at least 6 s: mixes of jobs that synchronise often,
    /// whose slices end early at irregular moments (idle hand-overs) and
    /// whose charges depend on when their threads get a CPU, so that a 2 s
    /// window holds only a few rounds (a container that fills the holder's
    /// gaps as its guest takes few slices of its own) and a share over it
    /// swings by a whole slice.
    pub fn for_sync_heavy(&self) -> Opts {
        Opts {
            window: self.window.max(Duration::from_secs(6)),
            ..*self
        }
    }
    /// These windows, long enough for `n` requests 5 ms apart (over the
    /// 800 or so counted after the warm-up, the difference of the two runs'
    /// shares of slow requests, see [`SLOW_EXCESS`], has a standard error
    /// of half a point when 1% of each run's are slow).
    pub fn for_requests(&self, n: u32) -> Opts {
        Opts {
            window: self.window.max(Duration::from_millis(5 * u64::from(n))),
            ..*self
        }
    }
    /// How long the workload processes run: warm-up, window, and slack.
    pub fn run_ms(&self) -> u64 {
        (self.warm + self.window).as_millis() as u64 + 6000
    }
}

/// One scenario: a name and what it measures.
pub struct Spec {
    pub name: &'static str,
    pub run: fn(&Opts, &mut Rows),
}

/// Rows being collected for one scenario.
pub struct Rows {
    pub scenario: String,
    pub rows: Vec<Row>,
    /// Print each row as it is measured.
    pub echo: bool,
    /// [`Opts::any_load`]: rows that depend on the host's free CPU are
    /// shown, not judged (see [`Rows::host`]).
    pub any_load: bool,
}

impl Rows {
    pub fn new(scenario: &str, echo: bool) -> Rows {
        Rows {
            scenario: scenario.into(),
            rows: Vec::new(),
            echo,
            any_load: false,
        }
    }
    pub fn push(&mut self, what: &str, target: f64, achieved: f64, kind: Kind) {
        let r = Row {
            scenario: self.scenario.clone(),
            what: what.into(),
            target,
            achieved,
            kind,
        };
        if self.echo {
            eprintln!(
                "  {:<46} {:<40} {:>9} {:>9.4} {:>6.2}%",
                r.scenario,
                r.what,
                r.target_str(),
                r.achieved,
                r.err() * 100.0
            );
        }
        self.rows.push(r);
    }
    /// A row that compares wall-clock measurements (utilisation, a
    /// process's GPU time over wall time or over a bare run's, request
    /// latency): they depend on how much CPU the host leaves the processes
    /// (a hand-over, a drain, a guest's admission each need a thread to
    /// run; a bare run's processes need less), so the share example judges
    /// them and `cargo test` ([`Opts::any_load`]) shows them.
    pub fn host(&mut self, what: &str, target: f64, achieved: f64, kind: Kind) {
        let kind = if self.any_load { Kind::Info } else { kind };
        self.push(what, target, achieved, kind);
    }
    /// The share of the GPU's wall time of `id` under a policy that caps it
    /// (`target`: the policy's fixed share). The share example judges it
    /// within ±[`SHARE_TOL`]. At any load ([`Opts::any_load`]) the cap
    /// still holds (never more than `target`, widened by [`SHARE_TOL`] and
    /// two of its slices in the window), but how much of each slice it
    /// fills depends on its threads getting a CPU: at least half.
    fn cap_share(&mut self, o: &Opts, m: &Measure, id: &str, target: f64) {
        let what = format!("{id} of GPU");
        if !o.any_load {
            return self.push(&what, target, m.of_wall(id), Kind::Share);
        }
        let slices = m.slices.get(id).copied().unwrap_or(0).max(1) as f64;
        let e = SHARE_TOL + 2.0 / slices;
        self.push(
            &format!("{what} ({slices} slices)"),
            target,
            m.of_wall(id),
            Kind::Within(target / 2.0, target * (1.0 + e)),
        );
    }
    /// The share of `id` (of all containers' device time): within
    /// ±[`SHARE_TOL`] of `target`; at any load ([`Rows::any_load`], the
    /// window measured over whole rounds) also widened by two of its slices
    /// in the window ([`slices_of`]): a share over N slices is off by up to
    /// 1/N where the window's edges cut one, and a slice whose holder's
    /// launching thread gets no CPU for the idle grace ends early.
    fn share(&mut self, m: &Measure, id: &str, target: f64) {
        if !self.any_load || m.slices.is_empty() {
            return self.push(&format!("{id} share"), target, m.of_busy(id), Kind::Share);
        }
        let n = slices_of(m, id, target);
        let e = SHARE_TOL + 2.0 / n;
        self.push(
            &format!("{id} share ({n} slices)"),
            target,
            m.of_busy(id),
            Kind::Within(target * (1.0 - e), target * (1.0 + e)),
        );
    }
    /// The share of `id`, one of `n` containers, in a mix whose processes
    /// need the host's CPU between their GPU work (a synchronise, host work,
    /// the next launch). Where every process gets a CPU when it asks, each
    /// container gets its weighted share (`target`, ±[`SHARE_TOL`]): that
    /// is how the share example judges it. On a host whose CPUs are all
    /// busy, each loop runs only as often as it gets a CPU, whatever its
    /// weight, and the shares tend to equal ones (1/`n`): a container's
    /// share then lies between its weighted share and the equal share.
    /// With `o.any_load` that interval is the bound, widened by
    /// [`SHARE_TOL`] and by two of the container's slices in the window (its
    /// own, or its share of all slices when it runs mostly as a guest; a
    /// share over N of its slices is off by up to 1/N where the window's
    /// edges cut one, and a slice whose holder's threads get no CPU in its
    /// first gap ends at the idle grace nearly unused): it holds at any
    /// load, and fails when the scheduler starves a container or gives it
    /// more than both a weighted and an equal share.
    fn host_share(&mut self, o: &Opts, m: &Measure, id: &str, target: f64, n: usize) {
        if !o.any_load {
            return self.share(m, id, target);
        }
        let equal = 1.0 / n as f64;
        let slices = slices_of(m, id, target);
        let e = SHARE_TOL + 2.0 / slices;
        let (lo, hi) = (target.min(equal) * (1.0 - e), target.max(equal) * (1.0 + e));
        self.push(
            &format!("{id} share (weighted {target:.4}, equal {equal:.4}, {slices} slices)"),
            target,
            m.of_busy(id),
            Kind::Within(lo, hi),
        );
    }
    fn util_vs_bare(&mut self, m: &Measure, bare: &Measure) {
        let (u, b) = (m.utilisation(), bare.utilisation());
        self.host(
            &format!("utilisation ÷ bare ({u:.3} / {b:.3})"),
            0.97,
            u / b,
            Kind::AtLeast,
        );
    }
}

/// The tolerance of a share against its target (relative error).
pub const SHARE_TOL: f64 = 0.10;

/// The slices container `id` held over the window of `m`, or, when it ran
/// mostly beside the holders as their guest (then it holds few slices of
/// its own and its share moves with the GPU's rounds), its `target` share
/// of all the slices granted in the window; at least 1.
fn slices_of(m: &Measure, id: &str, target: f64) -> f64 {
    let all = m.slices.values().sum::<u64>() as f64;
    (m.slices.get(id).copied().unwrap_or(0) as f64)
        .max(all * target)
        .max(1.0)
        .round()
}

/// Start `ctrs` under cgpu with the knobs, warm up.
pub fn start(
    o: &Opts,
    ctrs: &[Ctr],
    policy: u32,
    max_inst: Option<u32>,
    prio: Option<u32>,
) -> Scenario {
    let s = Scenario::start(ctrs);
    let l = s.ledger();
    if let Some(m) = max_inst {
        l.set_max_inst(m).unwrap();
    }
    if let Some(p) = prio {
        l.set_prio_ratio(p).unwrap();
    }
    l.set_policy(policy).unwrap();
    std::thread::sleep(o.warm);
    s
}

/// The same processes without cgpu, measured over the window.
pub fn bare(o: &Opts, ctrs: &[Ctr]) -> Measure {
    let s = Scenario::start_bare(ctrs);
    std::thread::sleep(o.warm);
    s.measure(o.window)
}

/// `ctrs` under cgpu with the knobs and, at the same time on a simulated
/// GPU of their own, the same processes without cgpu; warmed up. Measure
/// them with [`Scenario::measure_rounds_beside`]: a baseline taken at
/// another moment would see another load on the machine.
pub fn side_by_side(
    o: &Opts,
    ctrs: &[Ctr],
    policy: u32,
    max_inst: Option<u32>,
    prio: Option<u32>,
) -> (Scenario, Scenario) {
    let bare = Scenario::start_bare(ctrs);
    let s = start(o, ctrs, policy, max_inst, prio);
    (s, bare)
}

/// [`side_by_side`], measured over the window: (cgpu, bare).
pub fn measure_side_by_side(
    o: &Opts,
    ctrs: &[Ctr],
    policy: u32,
    max_inst: Option<u32>,
    prio: Option<u32>,
) -> (Measure, Measure) {
    let (s, bare) = side_by_side(o, ctrs, policy, max_inst, prio);
    s.measure_rounds_beside(&bare, o.window)
}

fn busy_pair(o: &Opts, w: (u32, u32), ns: u64) -> Vec<Ctr> {
    vec![
        Ctr::new("w1", w.0).busy(o.run_ms(), ns),
        Ctr::new("w2", w.1).busy(o.run_ms(), ns),
    ]
}

fn weighted_one_to_two(o: &Opts, r: &mut Rows, ns: u64) {
    let o = &o.for_share(1.0 / 3.0);
    let ctrs = busy_pair(o, (1, 2), ns);
    let (m, b) = measure_side_by_side(o, &ctrs, 2, None, None);
    r.share(&m, "w1", 1.0 / 3.0);
    r.share(&m, "w2", 2.0 / 3.0);
    r.util_vs_bare(&m, &b);
}

/// The least utilisation of a sync-heavy mix, as a fraction of the same
/// loops' without cgpu (the goal on a host with a free CPU is 0.97). With
/// the host's CPUs saturated it is lower: without cgpu every loop keeps
/// work queued, so the GPU always finds some whichever threads wait for a
/// CPU; under cgpu only the holder and one guest do. Without a guest in the
/// holder's host gaps the GPU would idle in every gap (0.3 ms of every
/// 2.3 ms of these loops, and the wake-up after each synchronise): the
/// floor sits between the two.
pub const SYNC_HEAVY_FLOOR: f64 = 0.90;

/// A training loop that synchronises often: two 1 ms kernels, a
/// synchronise, 0.3 ms on the host.
fn sync_heavy(id: &str, w: u32, o: &Opts) -> Ctr {
    Ctr::new(id, w).load("sync", o.run_ms(), MS, 2, 300)
}

/// The shares, and the utilisation against the same loops without cgpu
/// (side by side, on a simulated GPU of their own): at least
/// [`SYNC_HEAVY_FLOOR`] of it when `bound`, else shown only (see the 1:2
/// row).
fn sync_heavy_rows(
    o: &Opts,
    r: &mut Rows,
    policy: u32,
    ctrs: Vec<Ctr>,
    targets: &[(&str, f64)],
    bound: bool,
) {
    let (m, b) = measure_side_by_side(o, &ctrs, policy, None, None);
    for (id, t) in targets {
        r.host_share(o, &m, id, *t, targets.len());
    }
    let (u, bu) = (m.utilisation(), b.utilisation());
    if bound {
        r.host(
            &format!("utilisation ÷ bare ({u:.3} / {bu:.3})"),
            SYNC_HEAVY_FLOOR,
            u / bu,
            Kind::AtLeast,
        );
    } else {
        r.push(
            &format!("utilisation ÷ bare ({u:.3} / {bu:.3}), unbounded"),
            f64::NAN,
            u / bu,
            Kind::Info,
        );
    }
}

/// Request latency of a light container beside `neighbour`, under cgpu and
/// for the same pair without cgpu, run side by side (the same load on the
/// machine weighs on both): p50 and p99 shown, and judged by the requests
/// slower than twice the bare run's median (see [`SLOW_EXCESS`]).
fn latency_rows(o: &Opts, r: &mut Rows, policy: u32, light: Ctr, neighbour: Ctr) {
    let light_id = light.id.clone();
    let ctrs = vec![light, neighbour];
    let (mut s, mut bare_s) = side_by_side(o, &ctrs, policy, None, Some(80));
    let l = s.ledger();
    let lc = s.slot(&l, &light_id);
    let slices = || l.file().containers[lc].sched[cw::SLICES].load(Relaxed);
    let n0 = slices();
    let bare = bare_s.procs[0]
        .wait_line("done", o.window + Duration::from_secs(60))
        .map(|l| Latency::parse(&l.text))
        .expect("bare requests never finished");
    let got = s.procs[0]
        .wait_line("done", o.window + Duration::from_secs(60))
        .map(|l| Latency::parse(&l.text))
        .expect("requests never finished");
    // The shares below mean something only over many requests (a run whose
    // requests all waited would make few).
    assert!(
        got.n >= 100 && bare.n >= 100,
        "too few requests counted: {} under cgpu, {} without",
        got.n,
        bare.n
    );
    // Its requests run beside the holder's slice (as its guest), not each
    // in a slice of its own after the holder's: its container is granted
    // few slices for its requests, at any load (a guest needs no CPU to be
    // admitted beyond its own thread's).
    let n1 = slices();
    r.push(
        &format!("light container's slices per request ({} slices)", n1 - n0),
        0.25,
        (n1 - n0) as f64 / got.n.max(1) as f64,
        Kind::AtMost,
    );
    r.push("p50 ms (bare in brackets)", bare.p50, got.p50, Kind::Info);
    r.push("p99 ms (bare in brackets)", bare.p99, got.p99, Kind::Info);
    let slow = 2.0 * bare.p50;
    let (c, b) = (got.slower_than(slow), bare.slower_than(slow));
    // The standard error of the difference of the two fractions.
    let se = (c * (1.0 - c) / got.all.len().max(1) as f64
        + b * (1.0 - b) / bare.all.len().max(1) as f64)
        .sqrt();
    r.host(
        &format!(
            "% slower than 2× bare p50 ({slow:.2} ms) − bare's ({:.2})",
            b * 100.0
        ),
        (SLOW_EXCESS + 3.0 * se) * 100.0,
        (c - b) * 100.0,
        Kind::AtMost,
    );
}

/// How many more requests (a fraction of all) may be slower than twice the
/// bare run's median under cgpu than without it, beyond three standard
/// errors of the difference. On a quiet host the bare run has none, and
/// over 800 requests this lets at most 2.8% of cgpu's be slower than twice
/// the bare median (with none slow, 1% plus three standard errors of
/// 2.8% over 800 is 2.8%). On a busy one, late wake-ups of the host (a sleep of 1 ms
/// overshoots by 1 to 8 ms in 0.2 to 0.6% of sleeps on the 2-core
/// development VM, several per request) slow about 1% of requests in both
/// runs, so each run's p99 falls at random inside or outside that noise,
/// and comparing two p99s failed one run in five with the same latency
/// distributions under cgpu and without it. The fractions slower than one
/// threshold cancel that noise; the standard errors say how much of their
/// difference is chance.
const SLOW_EXCESS: f64 = 0.01;

/// The light container: 0.2 ms requests (launch, synchronise), 5 ms apart,
/// for the warm-up and the window; latency counted over the window (steady
/// state: not the first launches, which attach to the scheduler).
fn requests(id: &str, o: &Opts) -> Ctr {
    let ms = (o.warm + o.window).as_millis() as u64;
    let mut c = Ctr::new(id, 1).load("requests", ms, 200_000, 1, 5000);
    if let Some(p) = c.procs.last_mut() {
        p.push(o.warm.as_millis().to_string());
    }
    c
}

/// Wait until the token is in `state` held by `victim`'s container.
fn await_state(s: &Scenario, victim: &str, st: u8) {
    let l = s.ledger();
    let c = s.slot(&l, victim);
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let t = Token::unpack(l.file().header.sched[gw::TOKEN].load(Relaxed));
        if t.state == st && t.holder == Some(c) {
            return;
        }
        assert!(
            Instant::now() < end,
            "the token never reached state {st} by {victim}"
        );
        std::hint::spin_loop();
    }
}

/// Stop `victim`'s process in each of `runs` at the same moment (under
/// cgpu, the first, once the token is in `state` held by its container;
/// any state when None), for `stop`; returns, per run, the other
/// container's share of the GPU's wall time during the stop, and when the
/// first run is under cgpu, how long after the stop the other container
/// was first seen holding the GPU (the token polled every 0.2 ms; None when
/// it never was, or already held it).
fn stop_once(
    runs: &[&Scenario],
    victim: &str,
    other: &str,
    state: Option<u8>,
    stop: Duration,
) -> (Vec<f64>, Option<Duration>) {
    if let Some(st) = state {
        await_state(runs[0], victim, st);
    }
    let pids: Vec<i32> = runs.iter().map(|s| s.pid_of(victim)).collect();
    let s0: Vec<_> = runs.iter().map(|s| s.env.stats()).collect();
    let t0 = Instant::now();
    for &pid in &pids {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(pid, libc::SIGSTOP) };
    }
    let ledger = Ledger::list(&runs[0].ledger_dir)
        .first()
        .and_then(|p| Ledger::open(p).ok());
    let mut handover = None;
    if let Some(l) = &ledger {
        let oc = runs[0].slot(l, other);
        let token = &l.file().header.sched[gw::TOKEN];
        let held = |w: u64| {
            let t = Token::unpack(w);
            t.state == RUNNING && t.holder == Some(oc)
        };
        let mut before = held(token.load(Relaxed));
        while t0.elapsed() < stop {
            let now = held(token.load(Relaxed));
            if now && !before && handover.is_none() {
                handover = Some(t0.elapsed());
            }
            before = now;
            std::thread::sleep(Duration::from_micros(200));
        }
    } else {
        std::thread::sleep(stop);
    }
    let s1: Vec<_> = runs.iter().map(|s| s.env.stats()).collect();
    let wall = t0.elapsed().as_nanos() as f64;
    for &pid in &pids {
        // SAFETY: as above.
        unsafe { libc::kill(pid, libc::SIGCONT) };
    }
    let got = runs
        .iter()
        .zip(s0.iter().zip(&s1))
        .map(|(s, (s0, s1))| {
            let opid = s.pid_of(other) as u32;
            let a = s0.process(opid, 0).map_or(0, |x| x.device_time_ns);
            let b = s1.process(opid, 0).map_or(a, |x| x.device_time_ns);
            b.saturating_sub(a) as f64 / wall
        })
        .collect();
    (got, handover)
}

/// A process stopped for `stop`, `n` times, `gap` apart: the other
/// container's share of the GPU during the stops, under cgpu (stopped in
/// `state`) over the same without cgpu.
fn stop_rows(
    o: &Opts,
    r: &mut Rows,
    state: Option<u8>,
    kernel_ns: u64,
    stop: Duration,
    n: u32,
    gap: Duration,
) {
    let run = o.run_ms() + n as u64 * (stop + gap).as_millis() as u64 + 80 * n as u64;
    let ctrs = vec![
        Ctr::new("stopped", 1).busy(run, kernel_ns),
        Ctr::new("other", 1).busy(run, kernel_ns),
    ];
    let mut sum = [0.0f64; 2];
    // After stops while the stopped container held the GPU.
    let mut handovers: Vec<Duration> = Vec::new();
    if state.is_some() {
        // Stopped in a given state: the bare pair beside, stopped at the
        // same moments.
        let (s, bare) = side_by_side(o, &ctrs, 1, None, None);
        for _ in 0..n {
            let (got, h) = stop_once(&[&s, &bare], "stopped", "other", state, stop);
            sum[0] += got[0];
            sum[1] += got[1];
            handovers.extend(h);
            std::thread::sleep(gap);
        }
    } else {
        // Short stops, cycled; each run on its own (stopped at the same
        // moments, the two runs' phases stay tied cycle after cycle).
        // Under cgpu, where a stop lands decides what the other gets. While
        // the other holds the GPU it keeps running (about 0.8 of the GPU;
        // the stopped one is granted a few empty slices until it does not
        // answer, 100 ms). While the stopped one holds it (or drains), the
        // other gets the GPU once the stopped one does not answer (~100 ms),
        // and only then starts to wait for the simulated device, which the
        // stopped process owns: the sim takes it from a frozen owner after
        // 250 ms of waiting, so the other gets nothing in a 300 ms stop
        // (without cgpu it waits from the start: about 0.15). Stops at
        // arbitrary moments made the row a draw of how many of the 8 landed
        // in that phase (7 of 8: 0.6 of bare, in about 1 run of 10); the
        // stops alternate between the two phases instead, half and half as
        // stops at random moments land on average, and each phase is shown.
        // The bare run's gaps are spread over a scheduler round (80 ms for
        // two containers).
        let gap_of = |i: u32| gap + Duration::from_millis(u64::from(i) * 37 % 80);
        let other_ns = |s: &Scenario| {
            let opid = s.pid_of("other") as u32;
            s.env
                .stats()
                .process(opid, 0)
                .map_or(0, |x| x.device_time_ns)
        };
        let bare = Scenario::start_bare(&ctrs);
        std::thread::sleep(o.warm);
        let (b0, t0) = (other_ns(&bare), Instant::now());
        for i in 0..n {
            sum[1] += stop_once(&[&bare], "stopped", "other", None, stop).0[0];
            std::thread::sleep(gap_of(i));
        }
        let whole_bare = other_ns(&bare).saturating_sub(b0) as f64 / t0.elapsed().as_nanos() as f64;
        drop(bare);
        let s = start(o, &ctrs, 1, None, None);
        let mut by_phase = [0.0f64; 2];
        let (c0, t0) = (other_ns(&s), Instant::now());
        for i in 0..n {
            let holder = ["stopped", "other"][i as usize % 2];
            await_state(&s, holder, RUNNING);
            let (got, h) = stop_once(&[&s], "stopped", "other", None, stop);
            let got = got[0];
            if i % 2 == 0 {
                handovers.extend(h);
            }
            sum[0] += got;
            by_phase[i as usize % 2] += got;
            std::thread::sleep(gap);
        }
        let whole = other_ns(&s).saturating_sub(c0) as f64 / t0.elapsed().as_nanos() as f64;
        let b = sum[1] / n as f64;
        let half = n.div_ceil(2) as f64;
        for (k, what) in [(0, "it holds the GPU"), (1, "the other holds it")] {
            let got = by_phase[k] / half;
            r.push(
                &format!("other's GPU during stops while {what} ÷ bare ({got:.3} / {b:.3})"),
                f64::NAN,
                got / b,
                Kind::Info,
            );
        }
        r.push(
            &format!("other's GPU over the whole cycles ÷ bare ({whole:.3} / {whole_bare:.3})"),
            f64::NAN,
            whole / whole_bare,
            Kind::Info,
        );
    }
    if let Some(worst) = handovers.iter().max() {
        r.push(
            &format!(
                "GPU handed to the other after a stop while it holds, ms (worst of {})",
                handovers.len()
            ),
            f64::NAN,
            worst.as_secs_f64() * 1e3,
            Kind::Info,
        );
    }
    // The other container is handed the GPU during stops of the one that
    // holds it (once it stops answering), at any load: after each long
    // stop, and after at least half of the short ones while it held it.
    let (held_stops, want) = if state.is_some() {
        (n, n)
    } else {
        (n.div_ceil(2), n.div_ceil(2).div_ceil(2))
    };
    r.push(
        &format!("stops while it holds after which the other held the GPU (of {held_stops})"),
        f64::from(want),
        handovers.len() as f64,
        Kind::AtLeast,
    );
    let (cg, b) = (sum[0] / n as f64, sum[1] / n as f64);
    r.host(
        &format!("other's GPU during stops ÷ bare ({cg:.3} / {b:.3})"),
        0.9,
        cg / b,
        Kind::AtLeast,
    );
}

/// Every scenario.
pub fn table() -> Vec<Spec> {
    vec![
        Spec {
            name: "policy 2, weights 1:2, 1 ms kernels",
            run: |o, r| weighted_one_to_two(o, r, MS),
        },
        Spec {
            name: "policy 2, weights 1:2, 50 µs kernels",
            run: |o, r| weighted_one_to_two(o, r, 50_000),
        },
        Spec {
            name: "policy 2, weights 1:2, 20 ms kernels",
            run: |o, r| weighted_one_to_two(o, r, 20 * MS),
        },
        Spec {
            name: "policy 2, weights 1:1:2:4",
            run: |o, r| {
                let o = &o.for_share(0.125);
                let ctrs = vec![
                    Ctr::new("a", 1).busy(o.run_ms(), MS),
                    Ctr::new("b", 1).busy(o.run_ms(), MS),
                    Ctr::new("c", 2).busy(o.run_ms(), MS),
                    Ctr::new("d", 4).busy(o.run_ms(), MS),
                ];
                let (m, b) = measure_side_by_side(o, &ctrs, 2, None, None);
                for (id, t) in [("a", 0.125), ("b", 0.125), ("c", 0.25), ("d", 0.5)] {
                    r.share(&m, id, t);
                }
                r.util_vs_bare(&m, &b);
            },
        },
        Spec {
            name: "policy 1, three busy",
            run: |o, r| {
                let o = &o.for_share(1.0 / 3.0);
                let ctrs: Vec<Ctr> = ["a", "b", "c"]
                    .iter()
                    .map(|id| Ctr::new(id, 1).busy(o.run_ms(), MS))
                    .collect();
                let (m, b) = measure_side_by_side(o, &ctrs, 1, None, None);
                for id in ["a", "b", "c"] {
                    r.share(&m, id, 1.0 / 3.0);
                }
                r.util_vs_bare(&m, &b);
            },
        },
        Spec {
            name: "policy 1, one busy, one idle",
            run: |o, r| {
                let ctrs = vec![
                    Ctr::new("busy", 1).busy(o.run_ms(), MS),
                    Ctr::new("idle", 1).idle(),
                ];
                let (s, bare_s) = side_by_side(o, &ctrs, 1, None, None);
                let l = s.ledger();
                let c = s.slot(&l, "busy");
                let held =
                    || cgpu::scheduler::container_stats(&l.file().containers[c]).throttled_ns;
                let h0 = held();
                let (m, b) = s.measure_rounds_beside(&bare_s, o.window);
                // Nobody else asks for the GPU: the busy container is not
                // held back (at most 1% of its GPU time: on a host whose
                // CPUs are all busy its slice may end idle while its thread
                // waits for a CPU, and its next launch waits for a grant).
                let ran_ms = m.per.get("busy").copied().unwrap_or(0) as f64 / 1e6;
                r.push(
                    "busy's held-back time, ms",
                    ran_ms / 100.0,
                    held().saturating_sub(h0) as f64 / 1e6,
                    Kind::AtMost,
                );
                let (g, bg) = (m.of_wall("busy"), b.of_wall("busy"));
                r.host(
                    &format!("busy's GPU ÷ bare ({g:.3} / {bg:.3})"),
                    0.97,
                    g / bg,
                    Kind::AtLeast,
                );
            },
        },
        Spec {
            name: "policy 2, 1:2, weight-2 alive but idle",
            run: |o, r| {
                let ctrs = vec![
                    Ctr::new("w1", 1).busy(o.run_ms(), MS),
                    Ctr::new("w2", 2).idle(),
                ];
                let m = start(o, &ctrs, 2, None, None).measure_rounds(o.window);
                r.cap_share(o, &m, "w1", 1.0 / 3.0);
            },
        },
        Spec {
            name: "policy 0, max_inst 4, alone",
            run: |o, r| {
                let ctrs = vec![Ctr::new("solo", 1).busy(o.run_ms(), MS)];
                let m = start(o, &ctrs, 0, Some(4), None).measure_rounds(o.window);
                r.cap_share(o, &m, "solo", 0.25);
            },
        },
        Spec {
            name: "policy 3, weight 3, max_inst 10",
            run: |o, r| {
                let ctrs = vec![Ctr::new("fixed", 3).busy(o.run_ms(), MS)];
                let m = start(o, &ctrs, 3, Some(10), None).measure_rounds(o.window);
                r.cap_share(o, &m, "fixed", 0.30);
            },
        },
        Spec {
            name: "policy 4 (soft), two busy",
            run: |o, r| {
                // Its slices are 160 ms and a container may take two in a
                // row on credit, so a share over a few rounds swings by a
                // whole slice: measure over at least 36 of them (6 s).
                let soft_window = o.window.max(Duration::from_secs(6));
                let run_ms = (o.warm * 2 + soft_window + o.window).as_millis() as u64 + 6000;
                let ctrs = vec![
                    Ctr::new("w1", 1).busy(run_ms, MS),
                    Ctr::new("w2", 1).busy(run_ms, MS),
                ];
                let (s, bare_s) = side_by_side(o, &ctrs, 4, None, None);
                let (s0, t0) = (bare_s.env.stats(), Instant::now());
                let (m, soft) = s.measure_slices(soft_window);
                let b = bare_s.measure_between(0, s0, t0);
                drop(bare_s);
                r.share(&m, "w1", 0.5);
                r.share(&m, "w2", 0.5);
                r.util_vs_bare(&m, &b);
                // Its slices are 4× policy 1's (160 ms against 40 ms): the
                // difference of the median times from grant to slice end is
                // 160 − 40 = 120 ms (a difference, so that what both share,
                // the watcher's lag, cancels).
                s.ledger().set_policy(1).unwrap();
                std::thread::sleep(o.warm);
                let (_, p1) = s.measure_slices(o.window);
                r.push(
                    &format!(
                        "median slice − policy 1's ({:.1} − {:.1} ms), ms",
                        soft / 1e6,
                        p1 / 1e6
                    ),
                    120.0,
                    (soft - p1) / 1e6,
                    Kind::Share,
                );
            },
        },
        Spec {
            name: "high priority, prio_ratio 80, policy 1",
            run: |o, r| {
                let o = &o.for_share(0.2);
                let hp_ms = (o.warm + o.window).as_millis() as u64 + 500;
                let ctrs = vec![
                    Ctr::new("hp", 1).highprio().cmd(&[
                        "init",
                        "ready",
                        "spin_for",
                        &hp_ms.to_string(),
                        "1000000",
                        "hold",
                    ]),
                    Ctr::new("normal", 1).busy(o.run_ms() + hp_ms, MS),
                ];
                let (s, bare_s) = side_by_side(o, &ctrs, 1, None, Some(80));
                let (m, b) = s.measure_rounds_beside(&bare_s, o.window);
                r.share(&m, "hp", 0.8);
                r.share(&m, "normal", 0.2);
                r.util_vs_bare(&m, &b);
                while s.started.elapsed() < Duration::from_millis(hp_ms + 1200) {
                    std::thread::sleep(Duration::from_millis(50));
                }
                let (s0, t0) = (bare_s.env.stats(), Instant::now());
                let m = s.measure(o.window);
                let b = bare_s.measure_between(0, s0, t0);
                let (g, bu) = (m.of_wall("normal"), b.utilisation());
                r.host(
                    &format!("normal's GPU, hp idle ÷ bare ({g:.3} / {bu:.3})"),
                    0.97,
                    g / bu,
                    Kind::AtLeast,
                );
            },
        },
        Spec {
            name: "policy 5 -> 2 while running, 1:2",
            run: |o, r| {
                let o = &o.for_share(1.0 / 3.0);
                let ctrs = busy_pair(o, (1, 2), MS);
                let s = start(o, &ctrs, 5, None, None);
                let m = s.measure(o.window.min(Duration::from_secs(2)));
                r.push("w1 share, native", 0.5, m.of_busy("w1"), Kind::Share);
                s.ledger().set_policy(2).unwrap();
                std::thread::sleep(Duration::from_secs(1));
                let m = s.measure_rounds(o.window);
                r.share(&m, "w1", 1.0 / 3.0);
                r.share(&m, "w2", 2.0 / 3.0);
            },
        },
        Spec {
            name: "idle holder hands over (policy 1)",
            run: |o, r| {
                // The holder launches one 1 ms kernel every 10 ms (idle 9 ms
                // of 10); the other sends 0.2 ms requests. A request that
                // arrives while the holder idles runs after the idle grace
                // (2 ms), not at the end of the 40 ms slice.
                let ms = (o.warm + o.window).as_millis() as u64;
                let ctrs = vec![
                    requests("req", o),
                    Ctr::new("idler", 1).load("sync", ms + 4000, MS, 1, 9000),
                ];
                let mut s = start(o, &ctrs, 1, None, None);
                let got = s.procs[0]
                    .wait_line("done", o.window + Duration::from_secs(60))
                    .map(|l| Latency::parse(&l.text))
                    .expect("requests never finished");
                // Wall-clock latencies: they grow with the host's load (the
                // requests' own threads wait for a CPU), so `cargo test`
                // shows them and judges the hand-over by slices instead
                // (`idle_holder_hands_over_after_the_grace`).
                let kind = if o.any_load { Kind::Info } else { Kind::AtMost };
                r.push("request p50 ms", 5.0, got.p50, kind);
                r.push("request p90 ms", 10.0, got.p90, kind);
            },
        },
        Spec {
            name: "stopped 5 s while holding its slice",
            run: |o, r| {
                stop_rows(
                    o,
                    r,
                    Some(RUNNING),
                    MS,
                    Duration::from_secs(5),
                    1,
                    Duration::ZERO,
                )
            },
        },
        Spec {
            name: "stopped 5 s mid-drain (20 ms kernels)",
            run: |o, r| {
                stop_rows(
                    o,
                    r,
                    Some(DRAINING),
                    20 * MS,
                    Duration::from_secs(5),
                    1,
                    Duration::ZERO,
                )
            },
        },
        Spec {
            name: "stop/continue cycles (8 × 300 ms stopped, 700 ms running)",
            run: |o, r| {
                stop_rows(
                    o,
                    r,
                    None,
                    MS,
                    Duration::from_millis(300),
                    8,
                    Duration::from_millis(700),
                )
            },
        },
        Spec {
            name: "sync-heavy 1:1 (policy 1)",
            run: |o, r| {
                let o = &o.for_sync_heavy();
                let ctrs = vec![sync_heavy("a", 1, o), sync_heavy("b", 1, o)];
                sync_heavy_rows(o, r, 1, ctrs, &[("a", 0.5), ("b", 0.5)], true);
            },
        },
        Spec {
            name: "sync-heavy 1:2 (policy 2)",
            run: |o, r| {
                let o = &o.for_sync_heavy();
                let o = &o.for_share(1.0 / 3.0);
                let ctrs = vec![sync_heavy("a", 1, o), sync_heavy("b", 2, o)];
                // Utilisation is shown, not bounded: without cgpu the GPU
                // time-slices the two loops 1:1 and fills each one's host
                // gaps with the other's work; at 1:2, `b` must also run
                // alone part of the time, when the GPU is only as busy as
                // `b` alone keeps it (0.87: two 1 ms kernels per 2.3 ms).
                // With exact shares that caps utilisation at 0.95, about
                // 0.96 of the bare run's 0.99 (x of the time both run and
                // each gets half, `b` alone the rest: x/2 = (x + 0.87(1-x))/3
                // gives x = 0.635, utilisation 0.635 + 0.87 × 0.365).
                sync_heavy_rows(o, r, 2, ctrs, &[("a", 1.0 / 3.0), ("b", 2.0 / 3.0)], false);
            },
        },
        Spec {
            name: "sync-heavy 1:1:2:4 (policy 2)",
            run: |o, r| {
                let o = &o.for_sync_heavy();
                let o = &o.for_share(0.125);
                let ctrs = vec![
                    sync_heavy("a", 1, o),
                    sync_heavy("b", 1, o),
                    sync_heavy("c", 2, o),
                    sync_heavy("d", 4, o),
                ];
                sync_heavy_rows(
                    o,
                    r,
                    2,
                    ctrs,
                    &[("a", 0.125), ("b", 0.125), ("c", 0.25), ("d", 0.5)],
                    true,
                );
            },
        },
        Spec {
            name: "sync-heavy, ten containers (policy 1)",
            run: |o, r| {
                let o = &o.for_sync_heavy();
                let o = &o.for_share(0.1);
                let ids = ["c0", "c1", "c2", "c3", "c4", "c5", "c6", "c7", "c8", "c9"];
                let ctrs: Vec<Ctr> = ids.iter().map(|id| sync_heavy(id, 1, o)).collect();
                let t: Vec<(&str, f64)> = ids.iter().map(|id| (*id, 0.1)).collect();
                sync_heavy_rows(o, r, 1, ctrs, &t, true);
            },
        },
        Spec {
            name: "sync-heavy vs always-busy 1:1 (policy 1)",
            run: |o, r| {
                let o = &o.for_sync_heavy();
                let ctrs = vec![
                    sync_heavy("sync", 1, o),
                    Ctr::new("busy", 1).busy(o.run_ms(), MS),
                ];
                sync_heavy_rows(o, r, 1, ctrs, &[("sync", 0.5), ("busy", 0.5)], true);
            },
        },
        Spec {
            name: "latency: high priority beside 1 ms kernels",
            run: |o, r| {
                let o = &o.for_requests(1000);
                latency_rows(
                    o,
                    r,
                    1,
                    requests("hp", o).highprio(),
                    Ctr::new("busy", 1).busy(o.run_ms(), MS),
                )
            },
        },
        Spec {
            name: "latency: high priority beside 20 ms kernels",
            run: |o, r| {
                let o = &o.for_requests(1000);
                latency_rows(
                    o,
                    r,
                    1,
                    requests("hp", o).highprio(),
                    Ctr::new("busy", 1).busy(o.run_ms(), 20 * MS),
                )
            },
        },
        Spec {
            name: "latency: under its share, equal weights, beside 1 ms kernels",
            run: |o, r| {
                let o = &o.for_requests(1000);
                latency_rows(
                    o,
                    r,
                    1,
                    requests("light", o),
                    Ctr::new("busy", 1).busy(o.run_ms(), MS),
                )
            },
        },
        Spec {
            name: "latency: under its share, equal weights, beside 20 ms kernels",
            run: |o, r| {
                let o = &o.for_requests(1000);
                latency_rows(
                    o,
                    r,
                    1,
                    requests("light", o),
                    Ctr::new("busy", 1).busy(o.run_ms(), 20 * MS),
                )
            },
        },
    ]
}

/// Run the scenario named `name` (panics if there is none).
pub fn run_named(name: &str, o: &Opts, echo: bool) -> Vec<Row> {
    let spec = table()
        .into_iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("no scenario {name:?}"));
    let mut rows = Rows::new(spec.name, echo);
    rows.any_load = o.any_load;
    (spec.run)(o, &mut rows);
    rows.rows
}

/// What `sched_load requests` printed, in ms.
#[derive(Clone, Debug)]
pub struct Latency {
    pub n: u64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    /// Every request's latency, fastest first.
    pub all: Vec<f64>,
}

impl Latency {
    pub fn parse(line: &str) -> Latency {
        let word = |k: &str| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix(k))
                .unwrap_or_else(|| panic!("no {k} in {line:?}"))
        };
        let f = |k: &str| -> f64 {
            word(k)
                .parse::<f64>()
                .unwrap_or_else(|_| panic!("bad {k} in {line:?}"))
        };
        let all: Vec<f64> = word("all_us=")
            .split(',')
            .filter(|v| !v.is_empty())
            .map(|v| v.parse::<f64>().expect("a latency in all_us") / 1000.0)
            .collect();
        let n = f("requests=") as u64;
        assert_eq!(all.len() as u64, n, "all_us lists every request");
        Latency {
            n,
            p50: f("p50_us=") / 1000.0,
            p90: f("p90_us=") / 1000.0,
            p99: f("p99_us=") / 1000.0,
            all,
        }
    }

    /// The fraction of requests slower than `ms`.
    pub fn slower_than(&self, ms: f64) -> f64 {
        if self.all.is_empty() {
            return 0.0;
        }
        self.all.iter().filter(|&&v| v > ms).count() as f64 / self.all.len() as f64
    }
}
