//! Compute scheduling on the simulated driver: every scenario of the table
//! in `tests/sched_support/scenarios.rs` (shared with
//! `cargo run --release --example share`, which judges every row over
//! longer windows), with real processes under `LD_PRELOAD`; plus the
//! mechanism's own tests (every launch path gated, the idle hand-over,
//! kills, threads, several processes, two GPUs, stream capture, corrupt
//! ledger words).
//!
//! What these tests assert holds at any load on the host (they run in CI
//! beside two CPU-bound loops): shares come from the sim's per-process
//! device time over whole scheduler rounds, within ±10% where every
//! process keeps work queued, and within bounds derived from the slice
//! count where the processes need the host's CPU between their GPU work
//! (see `Rows::host_share`); mechanisms are judged by the ledger's counts
//! (slices, launches, held-back time). Wall-clock measurements that depend
//! on the host's free CPU (utilisation against a bare run, latency) are
//! shown here and judged by the share example.

mod sched_support;

use cgpu_testkit::LinkMode;
use sched_support::scenarios::{self, Opts};
use sched_support::*;
use std::time::{Duration, Instant};

const TOL: f64 = 0.10;

/// One scenario at a time: each is a handful of processes sharing one
/// simulated GPU, and the CI machine has two cores.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}
const WARMUP: Duration = Duration::from_millis(600);
/// Long enough for warm-up, window and slack on a slow machine.
const RUN_MS: u64 = 8000;
const MS: u64 = 1_000_000;

fn check(what: &str, got: f64, want: f64) {
    let e = rel_err(got, want);
    eprintln!(
        "{what}: target {want:.4} achieved {got:.4} error {:.1}%",
        e * 100.0
    );
    assert!(
        e <= TOL,
        "{what}: achieved {got:.4}, target {want:.4} (error {:.1}% > {:.0}%)",
        e * 100.0,
        TOL * 100.0
    );
}

/// Start, set the knobs, warm up, measure.
fn run(ctrs: &[Ctr], policy: u32) -> (Scenario, Measure) {
    let o = Opts::test();
    let s = scenarios::start(&o, ctrs, policy, None, None);
    let m = s.measure_rounds(o.window);
    (s, m)
}

/// Every row of the scenario table's `name`, within ±10% for shares, and
/// exactly for the rows judged against a bare run of the same processes
/// measured in the same test.
fn table(name: &str) {
    let _serial = serial();
    let rows = scenarios::run_named(name, &Opts::test(), true);
    let bad: Vec<String> = rows
        .iter()
        .filter(|r| !r.holds(TOL))
        .map(|r| {
            format!(
                "{}: {} achieved {:.4}, target {} (error {:.1}%)",
                r.scenario,
                r.what,
                r.achieved,
                r.target_str(),
                r.err() * 100.0
            )
        })
        .collect();
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// After the other containers' processes were killed, container `id` has
/// the GPU to itself, as a container alone has it: over `window`, it ran
/// (the sim's device time), every slice granted on the GPU was its own
/// (the ledger's slice counts: none went to a container whose processes
/// are dead), it took fresh slices, and its threads were held back for
/// at most 1% of the device time it ran (a hand-over to a dead holder, or
/// a drain for nobody, would hold it back for about half a slice each
/// time; `alone_is_never_held_back` explains the bound). Nothing here is
/// a wall-clock share: it holds at any load.
fn has_the_gpu_alone(s: &Scenario, id: &str, window: Duration) {
    use cgpu::scheduler::words::{container as cw, gpu as gw};
    use std::sync::atomic::Ordering::Relaxed;
    let l = s.ledger();
    let c = s.slot(&l, id);
    let f = l.file();
    let read = || {
        (
            cgpu::scheduler::container_stats(&f.containers[c]),
            f.containers[c].sched[cw::SLICES].load(Relaxed),
            f.header.sched[gw::SLICES].load(Relaxed),
        )
    };
    let (before, mine0, all0) = read();
    let m = s.measure(window);
    let (after, mine1, all1) = read();
    let (mine, all) = (mine1 - mine0, all1 - all0);
    let held_back = after.throttled_ns - before.throttled_ns;
    let ran = m.per.get(id).copied().unwrap_or(0);
    eprintln!(
        "{id} alone after the kills: ran {ran} ns (sim), held back {held_back} ns, {mine} of the GPU's {all} slices"
    );
    assert!(ran > 0, "{id} did not run: {m:?}");
    assert!(mine >= 2, "{id} took no fresh slices ({mine})");
    assert_eq!(
        mine, all,
        "slices went to containers whose processes are dead"
    );
    assert!(
        held_back <= ran / 100,
        "{id} was held back {held_back} ns of the {ran} ns it ran"
    );
}

#[test]
fn weighted_one_to_two_1ms_kernels() {
    table("policy 2, weights 1:2, 1 ms kernels");
}

#[test]
fn weighted_one_to_two_50us_kernels() {
    table("policy 2, weights 1:2, 50 µs kernels");
}

#[test]
fn weighted_one_to_two_20ms_kernels() {
    table("policy 2, weights 1:2, 20 ms kernels");
}

#[test]
fn weighted_one_one_two_four() {
    table("policy 2, weights 1:1:2:4");
}

#[test]
fn preemptive_three_busy() {
    table("policy 1, three busy");
}

#[test]
fn preemptive_one_busy_one_idle() {
    table("policy 1, one busy, one idle");
}

#[test]
fn weighted_idle_weight_two_keeps_its_slices() {
    table("policy 2, 1:2, weight-2 alive but idle");
}

#[test]
fn fair_share_max_inst_four_alone() {
    table("policy 0, max_inst 4, alone");
}

#[test]
fn fixed_weight_three_of_ten() {
    table("policy 3, weight 3, max_inst 10");
}

#[test]
fn soft_policy_four_shares_and_slice_length() {
    table("policy 4 (soft), two busy");
}

#[test]
fn high_priority_takes_prio_ratio_then_gives_all_back() {
    table("high priority, prio_ratio 80, policy 1");
}

#[test]
fn policy_change_native_to_weighted_within_a_second() {
    table("policy 5 -> 2 while running, 1:2");
}

/// A holder that goes idle while another container waits hands the GPU
/// over after the idle grace (2 ms), not at its slice's end (40 ms). The
/// hand-over itself, with guests ruled out: both containers' kernels are
/// too long for either to run beside the other (a guest's two launches
/// must fit in a quarter slice), so the waiter gets the GPU only when the
/// holder's slice ends. The holder launches one 6 ms kernel, synchronises,
/// and spends 12 ms on the host: each of its slices ends in the first gap,
/// so it holds one launch per slice. Were the grace as long as the gap or
/// the slice, its slices would run to their end, 40 ms, and hold two or
/// three. Counted by the ledger over whole slices: no wall-clock window
/// (a loaded host stretches the gaps, which only makes the hand-over surer
/// to happen in them).
#[test]
fn idle_holder_hands_over_after_the_grace() {
    use cgpu::scheduler::words::container as cw;
    use std::sync::atomic::Ordering::Relaxed;
    let _serial = serial();
    let s = Scenario::start(&[
        Ctr::new("idler", 1).load("sync", 2 * RUN_MS, 6 * MS, 1, 12_000),
        Ctr::new("busy", 1).busy(2 * RUN_MS, 20 * MS),
    ]);
    let l = s.ledger();
    l.set_policy(1).unwrap();
    std::thread::sleep(WARMUP * 2);
    let (idler, busy) = (s.slot(&l, "idler"), s.slot(&l, "busy"));
    let word = |c: usize, w: usize| l.file().containers[c].sched[w].load(Relaxed);
    let read = || {
        (
            word(idler, cw::LAUNCHES),
            word(idler, cw::SLICES),
            word(busy, cw::SLICES),
        )
    };
    let (l0, s0, b0) = read();
    // Until the idler has had 40 slices more (bounded, for a hung run).
    let end = Instant::now() + Duration::from_secs(60);
    while read().1 < s0 + 40 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
    }
    let (l1, s1, b1) = read();
    let (launches, slices, busy_slices) = (l1 - l0, s1 - s0, b1 - b0);
    let per = launches as f64 / slices.max(1) as f64;
    eprintln!(
        "idle holder: {launches} launches in {slices} slices ({per:.2} per slice); the other container had {busy_slices} slices"
    );
    assert!(slices >= 40, "the idler had {slices} slices");
    // Both ran: the idler launched, the other was handed the GPU (on a host
    // whose CPUs are all busy, many of the idler's slices end before its
    // thread gets a CPU to launch: fewer launches per slice, never more).
    assert!(launches >= 10, "the idler launched {launches} times");
    assert!(busy_slices >= 1, "the waiting container had no slice");
    assert!(
        per <= 1.5,
        "the idle holder kept its slices past the idle grace: {per:.2} launches per slice"
    );
}

/// A process stopped (SIGSTOP) for 5 s while its container holds the GPU
/// loses its turn: the other container's GPU time during the stop is at
/// least 0.9 of what the same stop leaves it without cgpu.
#[test]
fn stopped_while_holding_loses_its_turn() {
    table("stopped 5 s while holding its slice");
}

/// The same, stopped while its helper thread drains (20 ms kernels queued).
#[test]
fn stopped_mid_drain_loses_its_turn() {
    table("stopped 5 s mid-drain (20 ms kernels)");
}

/// Stop/continue cycles, the stops alternately while each container holds
/// the GPU (see the scenario for why not at arbitrary moments).
#[test]
fn stop_continue_cycles_do_not_starve_the_other() {
    table("stop/continue cycles (8 × 300 ms stopped, 700 ms running)");
}

#[test]
fn multi_process_container_shares_one_bucket() {
    let _serial = serial();
    // Container "pair" runs two processes, "single" one; 1:1 by container.
    let (s, m) = run(
        &[
            Ctr::new("pair", 1).busy(RUN_MS, MS).busy(RUN_MS, MS),
            Ctr::new("single", 1).busy(RUN_MS, MS),
        ],
        2,
    );
    check(
        "policy 2, 1:1, two-process container",
        m.of_busy("pair"),
        0.5,
    );
    check(
        "policy 2, 1:1, one-process container",
        m.of_busy("single"),
        0.5,
    );
    // Per-process GPU time (`cgpu-smi -d`): each of the pair's processes
    // has its part, and the parts add up to the container's time.
    let l = s.ledger();
    let f = l.file();
    let c = s.slot(&l, "pair");
    let container_ns = cgpu::scheduler::container_stats(&f.containers[c]).gpu_time_ns;
    let parts: Vec<u64> = f
        .processes
        .iter()
        .filter(|p| {
            p.state.load(std::sync::atomic::Ordering::Relaxed) == cgpu::ledger::SLOT_LIVE
                && p.container.load(std::sync::atomic::Ordering::Relaxed) as usize == c
        })
        .map(|p| p.gpu_time_ns.load(std::sync::atomic::Ordering::Relaxed))
        .collect();
    let sum: u64 = parts.iter().sum();
    eprintln!("pair: container {container_ns} ns, processes {parts:?}");
    assert_eq!(parts.len(), 2, "{parts:?}");
    assert!(
        parts.iter().all(|&p| p > container_ns / 10),
        "{parts:?} of {container_ns}"
    );
    check(
        "per-process GPU time adds up to the container's",
        sum as f64,
        container_ns as f64,
    );
}

#[test]
fn killed_holder_never_leaves_others_waiting() {
    let _serial = serial();
    let mut s = Scenario::start(&[
        Ctr::new("victim", 1).busy(RUN_MS, MS),
        Ctr::new("survivor", 1).busy(RUN_MS, MS),
    ]);
    let l = s.ledger();
    l.set_policy(1).unwrap();
    std::thread::sleep(WARMUP);
    // Kill the victim at an arbitrary point (holding the GPU or waiting).
    let victim = s
        .procs
        .iter_mut()
        .find(|p| p.container == "victim")
        .unwrap();
    std::thread::sleep(Duration::from_millis(333));
    unsafe { libc::kill(victim.child.id() as i32, libc::SIGKILL) };
    let _ = victim.child.wait();
    // The simulated driver itself takes up to ~250 ms to hand the device
    // on from a process killed while it owned it: judge after that.
    std::thread::sleep(Duration::from_millis(1000));
    has_the_gpu_alone(&s, "survivor", Duration::from_millis(1500));
}

/// A busy container alone on the GPU under a work-conserving policy is
/// never held back: when its slice's launch allowance or time runs out and
/// nobody else waits, its slice is renewed in place (charged, counted)
/// without a drain. Over a window after warm-up its held-back time grows
/// by at most 1% of its GPU time (0 on a host with a free CPU) while it is
/// charged its GPU time and takes fresh slices.
#[test]
fn alone_is_never_held_back() {
    use cgpu::scheduler::words::container as cw;
    let _serial = serial();
    for policy in [1, 2] {
        let s = Scenario::start(&[Ctr::new("alone", 1).busy(RUN_MS, MS)]);
        let l = s.ledger();
        l.set_policy(policy).unwrap();
        std::thread::sleep(WARMUP);
        let c = s.slot(&l, "alone");
        let words = &l.file().containers[c].sched;
        let before = cgpu::scheduler::container_stats(&l.file().containers[c]);
        let slices0 = words[cw::SLICES].load(std::sync::atomic::Ordering::Relaxed);
        let m = s.measure(Duration::from_millis(2000));
        let after = cgpu::scheduler::container_stats(&l.file().containers[c]);
        let slices = words[cw::SLICES].load(std::sync::atomic::Ordering::Relaxed) - slices0;
        let held_back = after.throttled_ns - before.throttled_ns;
        let charged = after.gpu_time_ns - before.gpu_time_ns;
        let ran = m.per.get("alone").copied().unwrap_or(0);
        eprintln!(
            "policy {policy}, alone: held back {held_back} ns, charged {charged} ns, ran {ran} ns (sim), {slices} slices, {} launches",
            after.launches - before.launches
        );
        // Renewed in place, it never waits for a drain or a decision. On a
        // host whose CPUs are all busy its launching thread may not run for
        // the idle grace, and its slice then ends as an idle one's does: its
        // next launch waits for a grant (tens of µs). A slice ended with a
        // drain would hold it back for its queued work each time (about half
        // a slice): at most 1% of the time it ran tells the two apart.
        assert!(
            held_back <= ran / 100,
            "policy {policy}: a container alone was held back {held_back} ns of {ran} ns"
        );
        assert!(ran > 0, "policy {policy}: the container did not run: {m:?}");
        // Its slices were charged while it ran alone (each renewal charges
        // the slice so far): at least one slice's worth of the time it ran.
        assert!(slices >= 2, "policy {policy}: no fresh slices ({slices})");
        assert!(
            charged >= ran / 2,
            "policy {policy}: charged {charged} ns for {ran} ns of GPU time"
        );
    }
}

/// Every launch path, through every entry path, waits while the container
/// has no compute (weight 0) and runs once it gets weight again.
#[test]
fn every_launch_path_is_gated() {
    let _serial = serial();
    // The processes launch once the test has taken the container's weight
    // away (a file it creates says so), however long they took to start.
    let go = std::env::temp_dir().join(format!("cgpu-gated-go-{}", std::process::id()));
    let _ = std::fs::remove_file(&go);
    let go_s = go.to_str().unwrap().to_string();
    let script = [
        "init",
        "ready",
        "wait_file",
        &go_s,
        "launch_ways",
        "1000000",
        "graph",
        "1000000",
        "2",
    ];
    let s = Scenario::start(&[
        Ctr::new("gated", 1).mode(LinkMode::Link).cmd(&script),
        Ctr::new("gated", 1).mode(LinkMode::Dlsym).cmd(&script),
        Ctr::new("gated", 1).mode(LinkMode::ProcAddr).cmd(&script),
        Ctr::new("gated", 1)
            .mode(LinkMode::ProcAddr)
            .env("CUCLIENT_PTDS", "1")
            .cmd(&script),
    ]);
    let l = s.ledger();
    let c = s.slot(&l, "gated");
    l.set_weight(c, 0).unwrap();
    let mut s = s;
    std::fs::write(&go, b"go").unwrap();
    std::thread::sleep(Duration::from_millis(3000));
    for p in &mut s.procs {
        let lines: Vec<String> = p.drain_lines().iter().map(|l| l.text.clone()).collect();
        assert!(
            !lines
                .iter()
                .any(|t| t.starts_with("launch_ways") || t.starts_with("graph")),
            "a launch passed while the container had weight 0: {lines:?}"
        );
    }
    let released = Instant::now();
    l.set_weight(c, 1).unwrap();
    for p in &mut s.procs {
        let lw = p
            .wait_line("launch_ways", Duration::from_secs(20))
            .map(|l| (l.at, l.text.clone()));
        let (at, text) = lw.expect("launch_ways never completed after weight came back");
        assert!(text.starts_with("launch_ways ok launches=4"), "{text}");
        assert!(at >= released);
        let g = p
            .wait_line("graph", Duration::from_secs(20))
            .map(|l| l.text.clone());
        assert!(
            g.as_deref().is_some_and(|t| t.starts_with("graph ok")),
            "{g:?}"
        );
    }
    let st = cgpu::scheduler::container_stats(&l.file().containers[c]);
    let _ = std::fs::remove_file(&go);
    // Each process was held back for over a second.
    assert!(
        st.throttled_ns >= 4 * 1_000_000_000,
        "held-back time not counted: {st:?}"
    );
}

/// A container that arrived when no compute weight was free (`max_inst` 1,
/// taken by a container that holds it) waits; the process that claimed it
/// exits, a sibling keeps trying to launch; then the holder exits: the
/// sibling takes the freed weight by itself and its launches go on. Before:
/// only the claiming process could take a weight, so the sibling waited for
/// an operator for ever. Judged by events (processes joined and gone, a
/// thread waiting in the ledger's set, the launches' completion line);
/// the timeouts only guard against a hang.
#[test]
fn a_weightless_container_heals_after_its_claiming_process_exits() {
    use cgpu::scheduler::words::container as cw;
    use std::sync::atomic::Ordering::Acquire;
    let _serial = serial();
    let tag = std::process::id();
    let go = |n: &str| std::env::temp_dir().join(format!("cgpu-weightless-{n}-{tag}"));
    let (claim, join, leave) = (go("claim"), go("join"), go("leave"));
    for f in [&claim, &join, &leave] {
        let _ = std::fs::remove_file(f);
    }
    let p = |f: &std::path::Path| f.to_str().unwrap().to_string();
    let (claim_s, join_s, leave_s) = (p(&claim), p(&join), p(&leave));
    let mut s = Scenario::start(&[
        Ctr::new("holder", 1).idle(),
        Ctr::new("late", 1).cmd(&[
            "ready",
            "wait_file",
            &claim_s,
            "init",
            "wait_file",
            &leave_s,
        ]),
        Ctr::new("late", 1).cmd(&[
            "ready",
            "wait_file",
            &join_s,
            "init",
            "spin",
            "100000",
            "5",
            "hold",
        ]),
    ]);
    let l = s.ledger();
    l.set_max_inst(1).unwrap();
    let wait = |what: &str, f: &dyn Fn() -> bool| {
        let end = Instant::now() + Duration::from_secs(60);
        while !f() {
            assert!(Instant::now() < end, "{what} (60 s)");
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    let nprocs = |l: &cgpu::ledger::Ledger| {
        l.find_container("late")
            .map(|c| l.file().containers[c].nprocs.load(Acquire))
    };
    // The first process claims the container: no weight is free.
    std::fs::write(&claim, b"go").unwrap();
    wait("the claiming process joined", &|| nprocs(&l) == Some(1));
    let c = l.find_container("late").unwrap();
    let slot = &l.file().containers[c];
    assert_eq!(
        slot.weight.load(Acquire),
        0,
        "it arrived with no weight free"
    );
    // A sibling joins and tries to launch: it waits.
    std::fs::write(&join, b"go").unwrap();
    wait("the sibling joined", &|| nprocs(&l) == Some(2));
    wait("the sibling waits to launch", &|| {
        (0..cw::SET_WORDS).any(|w| slot.sched[cw::WANT + w].load(Acquire) != 0)
    });
    // The claiming process exits.
    std::fs::write(&leave, b"go").unwrap();
    let end = Instant::now() + Duration::from_secs(60);
    while s.procs[1].child.try_wait().unwrap().is_none() {
        assert!(
            Instant::now() < end,
            "the claiming process never exited (60 s)"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    wait("the claiming process left", &|| nprocs(&l) == Some(1));
    assert_eq!(slot.weight.load(Acquire), 0, "no weight freed yet");
    assert!(
        !s.procs[2]
            .drain_lines()
            .iter()
            .any(|x| x.text.starts_with("spin")),
        "the sibling launched with weight 0"
    );
    // The holder exits: its weight frees up.
    let _ = s.procs[0].child.kill();
    let _ = s.procs[0].child.wait();
    let line = s.procs[2]
        .wait_line("spin", Duration::from_secs(60))
        .map(|x| x.text.clone());
    for f in [&claim, &join, &leave] {
        let _ = std::fs::remove_file(f);
    }
    let line = line.expect("the sibling's launches never went on after the holder exited (60 s)");
    assert!(line.starts_with("spin ok count=5"), "{line}");
    assert_eq!(slot.weight.load(Acquire), 1, "it took the freed weight");
}

/// Processes of one container killed at random points, again and again
/// (holding the GPU, draining, deciding or waiting): the other container
/// never stalls and gets the whole GPU once they are gone.
#[test]
fn repeated_kills_never_stall_the_other_container() {
    let _serial = serial();
    let s = Scenario::start(&[Ctr::new("steady", 1).busy(RUN_MS + 4000, MS)]);
    let l = s.ledger();
    l.set_policy(1).unwrap();
    let steady = s.procs[0].child.id();
    let exe = cgpu_testkit::cuclient(LinkMode::Link);
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let ran = || {
        s.env
            .stats()
            .process(steady, 0)
            .map_or(0, |p| p.device_time_ns)
    };
    let first = ran();
    let mut last = first;
    let mut still = 0;
    for _round in 0..8 {
        let mut victims = Vec::new();
        for _ in 0..2 {
            let mut cmd = s.env.command(&exe);
            cmd.args(["init", "spin_for", "5000", "1000000"])
                .env("CGPU_CONTAINER_ID", "victim")
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null());
            victims.push(cmd.spawn().expect("spawn victim"));
        }
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        std::thread::sleep(Duration::from_millis(150 + rng % 350));
        for v in &mut victims {
            unsafe { libc::kill(v.id() as i32, libc::SIGKILL) };
            let _ = v.wait();
        }
        // Shown, not judged per round (a round's length is wall time).
        let now = ran();
        if now == last {
            still += 1;
        }
        last = now;
    }
    eprintln!(
        "16 kills: steady ran {} ns (sim) meanwhile; no progress in {still} of 8 rounds",
        last - first
    );
    assert!(
        last > first,
        "the steady container never ran while the others were killed"
    );
    // The simulated driver itself takes up to ~250 ms to hand the device
    // on from a process killed while it owned it: judge after that.
    std::thread::sleep(Duration::from_millis(1000));
    has_the_gpu_alone(&s, "steady", Duration::from_millis(1500));
}

/// A process of four launching threads (each its own stream) and a
/// single-threaded one, in two containers of equal weight: 1:1 by container.
#[test]
fn multi_threaded_process_shares_one_bucket() {
    let _serial = serial();
    let ctrs = [
        Ctr::new("threads", 1).threads(4, RUN_MS, MS),
        Ctr::new("single", 1).busy(RUN_MS, MS),
    ];
    let (m, b) = scenarios::measure_side_by_side(&Opts::test(), &ctrs, 2, None, None);
    let bare = b.utilisation();
    // Over whole rounds, within the tolerance widened by two of the
    // container's slices in the window (the window's edges cut one, and a
    // slice whose launching threads get no CPU for the idle grace ends
    // early), as every share judged at any load.
    for (id, what) in [
        ("threads", "policy 2, 1:1, four-thread process"),
        ("single", "policy 2, 1:1, one-thread process"),
    ] {
        let n = m.slices.get(id).copied().unwrap_or(0).max(1) as f64;
        let got = m.of_busy(id);
        let e = rel_err(got, 0.5);
        let bound = TOL + 2.0 / n;
        eprintln!(
            "{what}: target 0.5000 achieved {got:.4} error {:.1}% (bound {:.1}%, {n} slices)",
            e * 100.0,
            bound * 100.0
        );
        assert!(
            e <= bound,
            "{what}: achieved {got:.4}, target 0.5000 (error {:.1}% > {:.1}%)",
            e * 100.0,
            bound * 100.0
        );
    }
    // Utilisation against a bare run is shown, not judged: it depends on
    // the host's free CPU (the launching threads must run to keep the
    // device busy), which a test cannot assume.
    let u = m.utilisation();
    eprintln!("policy 2, 1:1 with threads: utilisation {u:.4}, without cgpu {bare:.4}");
}

/// One process driving two GPUs: each device's launches are gated by that
/// device's ledger. On GPU 1 it competes at weight 1 with a weight-3
/// container: 1/4 vs 3/4 there, whatever happens on GPU 0 (where it is
/// alone, and waits for its own hand-overs). Its thread synchronises GPU 0
/// and then GPU 1, and waits for its turn on either: neither makes it look
/// idle on the other (a process waiting on one GPU is not idle on another).
#[test]
fn two_gpus_in_one_process_each_gated_by_its_own_ledger() {
    let _serial = serial();
    // 20 slices of the weight-1 container at least (see `Opts::for_share`).
    let o = Opts::test().for_share(0.25);
    let run_ms = o.run_ms();
    let s = Scenario::start_on(
        &[
            Ctr::new("both", 1).two_gpus(run_ms, MS),
            Ctr::new("one", 3).busy_on(1, run_ms, MS),
        ],
        Some("15109:Tesla T4,15109:Tesla T4"),
    );
    let ls = s.ledgers(2);
    for l in &ls {
        l.set_policy(2).unwrap();
    }
    let gpu1 = ls
        .iter()
        .find(|l| l.find_container("one").is_some())
        .expect("GPU 1's ledger");
    std::thread::sleep(o.warm);
    let cs = |id: &str| {
        let c = gpu1.find_container(id).unwrap();
        cgpu::scheduler::container_stats(&gpu1.file().containers[c]).gpu_time_ns
    };
    let (b0, o0) = (cs("both"), cs("one"));
    let both = s.slot(gpu1, "both");
    let m = s.measure_rounds_on(1, gpu1, Some(both), o.window);
    let (b1, o1) = (cs("both"), cs("one"));
    eprintln!(
        "GPU 1 charged: both {} ns, one {} ns (both's share {:.4}); device time: both {} ns, one {} ns",
        b1 - b0,
        o1 - o0,
        (b1 - b0) as f64 / ((b1 - b0) + (o1 - o0)) as f64,
        m.per["both"],
        m.per["one"]
    );
    // The scheduler splits GPU 1's time 1:3 by weight: the charges.
    check(
        "two GPUs, GPU 1, charged share of the weight-1 two-GPU process",
        (b1 - b0) as f64 / ((b1 - b0) + (o1 - o0)).max(1) as f64,
        0.25,
    );
    // How much of its slices on GPU 1 the two-GPU process fills depends on
    // its one thread getting a CPU between its synchronise on GPU 0 and its
    // launches on GPU 1: at any load its device time is at most its share
    // (widened by the tolerance and two of its slices; ungated, the GPU's
    // own time-slicing would give it about half) and at least half of it.
    let n = m.slices.get("both").copied().unwrap_or(0).max(1) as f64;
    let got = m.of_busy("both");
    let (lo, hi) = (0.125, 0.25 * (1.0 + TOL + 2.0 / n));
    eprintln!("two GPUs, GPU 1, device share of the two-GPU process: {got:.4} (bounds {lo:.4}–{hi:.4}, {n} slices)");
    assert!(
        (lo..=hi).contains(&got),
        "two GPUs, GPU 1: the two-GPU process's device share {got:.4} is outside {lo:.4}–{hi:.4}"
    );
}

/// CUDA graphs under the scheduler: a process captures a stream
/// (`cuStreamBeginCapture`, as `torch.cuda.graph` does in global mode)
/// across several slice ends while another container keeps the GPU busy.
/// The drain at each handover must not `cuCtxSynchronize` its context
/// (that invalidates the capture on a real driver, and on the sim); the
/// capture ends intact and the graph runs. Through each entry path, with
/// the `_ptsz` variants too.
#[test]
fn stream_capture_survives_slice_ends() {
    let _serial = serial();
    let mut script = vec![
        "init",
        "ready",
        "sleep",
        "600",
        // warm-up launches (the context is known to the drain)
        "spin",
        "1000000",
        "2",
        "capture_begin",
    ];
    for _ in 0..5 {
        // longer than a slice: the GPU changes hands between launches
        script.extend(["capture_spin", "2000000", "1", "sleep", "100"]);
    }
    script.extend(["capture_status", "capture_end", "graph_launch_last"]);
    // The same after an end the driver refused (a NULL graph pointer): the
    // capture goes on, and is not counted ended.
    let mut refused = script.clone();
    let at = refused.iter().position(|c| *c == "capture_begin").unwrap() + 1;
    refused.insert(at, "capture_end_null");
    let s = Scenario::start(&[
        Ctr::new("busy", 1).busy(RUN_MS, MS),
        Ctr::new("graph", 2).mode(LinkMode::Link).cmd(&refused),
        Ctr::new("graph", 2).mode(LinkMode::Link).cmd(&script),
        Ctr::new("graph", 2).mode(LinkMode::Dlsym).cmd(&script),
        Ctr::new("graph", 2)
            .mode(LinkMode::ProcAddr)
            .env("CUCLIENT_PTDS", "1")
            .cmd(&script),
    ]);
    let l = s.ledger();
    l.set_policy(2).unwrap();
    let busy = s.slot(&l, "busy");
    let mut s = s;
    let mut busy_ns_at_begin = None;
    for i in 0..s.procs.len() {
        if s.procs[i].container != "graph" {
            continue;
        }
        let p = &mut s.procs[i];
        let b = p
            .wait_line("capture_begin", Duration::from_secs(30))
            .map(|l| l.text.clone());
        assert_eq!(b.as_deref(), Some("capture_begin ok"), "{b:?}");
        if i == 1 {
            let n = p
                .wait_line("capture_end_null", Duration::from_secs(30))
                .map(|l| l.text.clone());
            assert_eq!(n.as_deref(), Some("capture_end_null rc=1"), "{n:?}");
        }
        if busy_ns_at_begin.is_none() {
            busy_ns_at_begin =
                Some(cgpu::scheduler::container_stats(&l.file().containers[busy]).gpu_time_ns);
        }
        let st = p
            .wait_line("capture_status", Duration::from_secs(60))
            .map(|l| l.text.clone());
        assert_eq!(
            st.as_deref(),
            Some("capture_status ok status=1"),
            "capture invalidated"
        );
        let e = p
            .wait_line("capture_end ", Duration::from_secs(30))
            .map(|l| l.text.clone());
        assert_eq!(e.as_deref(), Some("capture_end ok graph=set"), "{e:?}");
        let g = p
            .wait_line("graph_launch_last", Duration::from_secs(30))
            .map(|l| l.text.clone());
        assert!(
            g.as_deref()
                .is_some_and(|t| t.starts_with("graph_launch_last ok")),
            "{g:?}"
        );
    }
    // The GPU did change hands during the captures (the other container
    // was charged GPU time: handovers, hence drains, happened).
    let busy_now = cgpu::scheduler::container_stats(&l.file().containers[busy]).gpu_time_ns;
    let before = busy_ns_at_begin.unwrap();
    assert!(
        busy_now >= before + 100 * MS,
        "no handover during the captures: busy container charged {before} then {busy_now} ns"
    );
}

/// The scheduler's ledger words are shared memory that any process can
/// write. Garbage there (a token naming container 200 or process 60000, a
/// slice budget of centuries, times in the future, the largest launch
/// estimate, the most negative bucket) never makes a launch fail or panic,
/// and the GPU is shared again once the garbage stops.
#[test]
fn corrupt_scheduler_words_never_break_launches() {
    use cgpu::scheduler::words::{container as cw, gpu as gw, Token, DRAINING, IDLE, RUNNING};
    use std::sync::atomic::Ordering::SeqCst;
    let _serial = serial();
    let mut s = Scenario::start(&[
        Ctr::new("a", 1).busy(5000, MS),
        Ctr::new("b", 1).busy(5000, MS),
    ]);
    let l = s.ledger();
    l.set_policy(1).unwrap();
    std::thread::sleep(WARMUP);
    let f = l.file();
    let h = &f.header.sched;
    let tok = |state, holder, aux| {
        Token {
            seq: 0x5eed,
            state,
            holder,
            aux,
        }
        .pack()
    };
    let end = Instant::now() + Duration::from_millis(1500);
    let mut i = 0u32;
    while Instant::now() < end {
        i += 1;
        match i % 6 {
            0 => h[gw::TOKEN].store(tok(RUNNING, Some(200), None) + i as u64, SeqCst),
            1 => h[gw::TOKEN].store(tok(DRAINING, Some(40), Some(60000)) + i as u64, SeqCst),
            2 => {
                h[gw::SLICE_BUDGET].store(u64::MAX, SeqCst);
                h[gw::SLICE_START].store(u64::MAX / 2, SeqCst);
            }
            3 => h[gw::STATE_SINCE].store(u64::MAX, SeqCst),
            4 => {
                h[gw::IDLE_UNTIL].store(u64::MAX, SeqCst);
                h[gw::TOKEN].store(tok(IDLE, None, None) + i as u64, SeqCst);
            }
            _ => {
                for c in &f.containers {
                    c.sched[cw::NS_PER_LAUNCH].store(u64::MAX, SeqCst);
                    c.sched[cw::TOKENS].store(i64::MIN as u64, SeqCst);
                    c.sched[cw::OWED_NS].store(u64::MAX, SeqCst);
                    c.sched[cw::EMPTY_SINCE].store(u64::MAX, SeqCst);
                    c.sched[cw::IDLE_NS].store(u64::MAX, SeqCst);
                    c.sched[cw::SYNC_AT].store(u64::MAX, SeqCst);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(500));
    let m = s.measure(Duration::from_millis(1500));
    check("after corrupt words, policy 1, a", m.of_busy("a"), 0.5);
    check("after corrupt words, policy 1, b", m.of_busy("b"), 0.5);
    for p in &mut s.procs {
        let done = p
            .wait_line("spin_for", Duration::from_secs(30))
            .map(|l| l.text.clone());
        assert!(
            done.as_deref()
                .is_some_and(|t| t.starts_with("spin_for ok")),
            "a launch failed under corrupt scheduler words: {done:?}"
        );
    }
}

/// Sync-heavy training loops (two 1 ms kernels, a synchronise, 0.3 ms on
/// the host): the shares hold, and the GPU is kept about as busy as
/// without cgpu (the same loops run side by side on a simulated GPU of
/// their own; the floor asserted, `SYNC_HEAVY_FLOOR`, holds with the
/// host's CPUs saturated): a waiting container runs beside the holder, in
/// its host gaps, as a guest charged its device time.
#[test]
fn sync_heavy_one_to_one() {
    table("sync-heavy 1:1 (policy 1)");
}

/// At 1:2 the utilisation is shown, not bounded (its ceiling at exact
/// shares is about 0.96 of the bare run: see the scenario).
#[test]
fn sync_heavy_one_to_two() {
    table("sync-heavy 1:2 (policy 2)");
}

#[test]
fn sync_heavy_one_one_two_four() {
    table("sync-heavy 1:1:2:4 (policy 2)");
}

#[test]
fn sync_heavy_ten_containers() {
    table("sync-heavy, ten containers (policy 1)");
}

/// A sync-heavy container beside an always-busy one at equal weights gets
/// its half of the GPU's work: a host gap of its loop shorter than the idle
/// grace neither ends its slice nor is charged to it.
#[test]
fn sync_heavy_beside_always_busy() {
    table("sync-heavy vs always-busy 1:1 (policy 1)");
}

/// Request latency (0.2 ms requests, 5 ms apart) of a high-priority
/// container beside a busy one, against the same pair without cgpu run side
/// by side: at most 1 point more of its requests slower than twice the bare
/// median than in the bare run, beyond three standard errors (its launches
/// run beside the holder's slice: a request waits for the GPU's own
/// time-slicing, as without cgpu).
#[test]
fn latency_high_priority_beside_1ms_kernels() {
    table("latency: high priority beside 1 ms kernels");
}

#[test]
fn latency_high_priority_beside_20ms_kernels() {
    table("latency: high priority beside 20 ms kernels");
}

/// The same for a container under its share at equal weights (not high
/// priority): its bucket has credit, so it runs beside the holder too.
#[test]
fn latency_under_share_beside_1ms_kernels() {
    table("latency: under its share, equal weights, beside 1 ms kernels");
}

#[test]
fn latency_under_share_beside_20ms_kernels() {
    table("latency: under its share, equal weights, beside 20 ms kernels");
}

/// A light high-priority container that runs beside the holder (a guest)
/// is charged the device time of its requests, timed by two CUDA events on
/// its stream, not the wall time until its thread saw them done (which
/// adds the wait for the holder's GPU time-slice and for a CPU). The
/// requests time themselves with events too, as an application would: the
/// charge is at most what those events say, with a quarter of slack (on an
/// idle host both are the device time; on a busy one a start event can be
/// reached before its kernel is queued, and the GPU goes on with the
/// holder's time-slice meanwhile, which both then include), and at least
/// half the device time the simulated GPU counted.
#[test]
fn a_guest_is_charged_its_device_time() {
    use cgpu::scheduler::words::container as cw;
    let _serial = serial();
    let window = Duration::from_millis(2000);
    let ms = (WARMUP + window).as_millis() as u64;
    // Its requests count from 0.4 s after it started (its last argument),
    // the charges from `WARMUP` after the scenario started.
    let mut req = Ctr::new("req", 1)
        .highprio()
        .load("timed", ms, 200_000, 1, 5000);
    if let Some(p) = req.procs.last_mut() {
        p.push("400".into());
    }
    let mut s = Scenario::start(&[req, Ctr::new("busy", 1).busy(RUN_MS, 20 * MS)]);
    let l = s.ledger();
    l.set_policy(1).unwrap();
    std::thread::sleep(WARMUP);
    let c = s.slot(&l, "req");
    let words = &l.file().containers[c].sched;
    let charged0 = words[cw::GPU_NS].load(std::sync::atomic::Ordering::Relaxed);
    let (s0, t0) = (s.env.stats(), Instant::now());
    let done = s.procs[0]
        .wait_line("done", window + Duration::from_secs(30))
        .map(|l| l.text.clone())
        .expect("requests never finished");
    let charged = words[cw::GPU_NS].load(std::sync::atomic::Ordering::Relaxed) - charged0;
    let ran = s
        .measure_between(0, s0, t0)
        .per
        .get("req")
        .copied()
        .unwrap_or(0);
    let ev = cgpu_testkit::field(&done, "ev_us")
        .and_then(|v| v.parse::<u64>().ok())
        .expect("ev_us")
        * 1000;
    eprintln!("guest: charged {charged} ns; events around its requests: {ev} ns; device time (sim): {ran} ns; {done}");
    assert!(ran > 0 && ev > 0, "the requests did not run: {done}");
    assert!(
        charged <= ev + ev / 4 + 1_000_000,
        "charged {charged} ns for requests its own events timed at {ev} ns"
    );
    assert!(
        charged >= ran / 2,
        "charged {charged} ns for {ran} ns of device time"
    );
}
