//! Secure mode's compute scheduling, with the node agent itself
//! (`cgpu-agent --secure`) holding the token: two containers, each a real
//! process under `LD_PRELOAD` run as an unprivileged uid (65534) in a
//! cgroup of its own, share one simulated GPU by their weights; a holder
//! killed mid-slice never leaves the other waiting; the tenants' mappings
//! of the ledger stay read-only. Shares are judged by the simulated
//! device's own per-process time, over windows of many slices (they hold
//! at any load: both processes keep work queued).
//!
//! Needs root (cgroups, a root-owned ledger directory), as the other
//! secure-mode tests.

mod interpose_common;

use cgpu::ledger::Ledger;
use cgpu::scheduler::words::{container as cw, gpu as gw};
use cgpu_testkit::secure::{
    as_nobody, enter, host_settings, secure_agent_command, set_mode, share_tree, AgentClient,
    Cgroups, SecureAgent,
};
use cgpu_testkit::LinkMode;
use interpose_common::*;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering::{Acquire, Relaxed};
use std::time::Duration;

const T4: &str = "15109:Tesla T4";

/// One container: its id (the cgroup's name, how the agent finds it).
struct Ctr {
    id: String,
    cgroup: PathBuf,
}

/// A host in secure mode with the node agent and `n` containers.
struct Host {
    m: Machine,
    agent: Option<SecureAgent>,
    settings: PathBuf,
    ctrs: Vec<Ctr>,
    _cgroups: Cgroups,
    _serial: std::sync::MutexGuard<'static, ()>,
}

/// One host at a time: each is an agent and a handful of processes
/// sharing one simulated GPU, and shares are judged on what they get.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl Host {
    /// Containers of weights `weights`, each 2 GiB.
    fn new(name: &str, weights: &[u32]) -> Host {
        let serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let m = Machine::new(name, T4);
        set_mode(&m.root, 0o755);
        set_mode(&m.ledger, 0o755);
        set_mode(&m.state, 0o777);
        let settings = m.root.join("containers");
        std::fs::create_dir_all(&settings).unwrap();
        let cgroups = Cgroups::new(&format!("cgpu-secure-sched-{}-{name}", std::process::id()));
        let mut ctrs = Vec::new();
        for (i, w) in weights.iter().enumerate() {
            let digit = char::from_digit(10 + i as u32, 16).unwrap();
            let id = format!("{:08x}{}", std::process::id(), digit.to_string().repeat(56));
            let cgroup = cgroups.make(&id);
            host_settings(
                &settings,
                &id,
                &[
                    "ALIYUN_COM_GPU_MEM_CONTAINER=2",
                    &format!("ALIYUN_COM_GPU_SCHD_WEIGHT={w}"),
                ],
                None,
            )
            .unwrap();
            ctrs.push(Ctr { id, cgroup });
        }
        let mut h = Host {
            m,
            agent: None,
            settings,
            ctrs,
            _cgroups: cgroups,
            _serial: serial,
        };
        h.start_agent();
        h
    }

    fn start_agent(&mut self) {
        let base = self
            .m
            .bare(cgpu_testkit::artifacts().profile_dir.join("cgpu-agent"));
        let mut c = secure_agent_command(base, &self.m.ledger, &self.settings, "1s");
        let agent = SecureAgent::start(&mut c, Duration::from_secs(120))
            .unwrap_or_else(|log| panic!("the agent did not serve: {log:?}"));
        self.agent = Some(agent);
        share_tree(&self.m.state);
    }

    fn kill_agent(&mut self) {
        self.agent = None;
    }

    /// The GPU's ledger, as root (the agent's file).
    fn ledger(&self) -> Ledger {
        Ledger::open_read_only(&self.m.ledger_file().expect("the agent made the ledger")).unwrap()
    }

    /// Container `i`'s slot in the ledger (its row is named by the id's
    /// first 12 digits).
    fn slot(&self, l: &Ledger, i: usize) -> usize {
        l.file()
            .containers
            .iter()
            .position(|c| {
                c.state.load(Acquire) == cgpu::ledger::SLOT_LIVE
                    && c.id_str() == self.ctrs[i].id[..12]
            })
            .expect("the container's row")
    }

    /// A process of each container of `which` (`true`: under the library)
    /// keeping 1 ms kernels queued for `ms`, each ready (placed by the
    /// agent: its allocation said Hello).
    fn busy(&self, which: &[(usize, bool)], ms: u64) -> Vec<Kid> {
        let a = busy(ms);
        let mut kids: Vec<Kid> = which
            .iter()
            .map(|&(i, lib)| self.run_in(i, &args(&a), lib))
            .collect();
        for k in &mut kids {
            assert!(k.line().starts_with("init ok"));
            assert!(k.line().starts_with("alloc ok"));
            assert_eq!(k.line(), "ready");
        }
        kids
    }

    /// The GPU's ledger, with its policy set to `policy` first.
    fn with_policy(&self, policy: u32) -> Ledger {
        let l = self.ledger();
        Ledger::open(l.path()).unwrap().set_policy(policy).unwrap();
        l
    }

    /// A cuclient of container `i` running `args`, as the tenant uid, in
    /// the container's cgroup before its first CUDA call; `preload`: under
    /// the library (else a program that unset `LD_PRELOAD`).
    fn run_in(&self, i: usize, args: &[&str], preload: bool) -> Kid {
        let go = self.m.root.join(format!("go-{i}-{}-{preload}", args.len()));
        let exe = cgpu_testkit::cuclient(LinkMode::Link);
        let vars = [("CGPU_SIM_CTX_MIB", "0")];
        let mut c = if preload {
            self.m.preloaded(exe, &vars)
        } else {
            let mut c = self.m.bare(exe);
            c.envs(vars);
            c
        };
        as_nobody(c.arg("wait_file").arg(&go).args(args));
        c.stdout(Stdio::piped()).stderr(Stdio::inherit());
        let mut ch = c.spawn().expect("spawn tenant");
        let out = BufReader::new(ch.stdout.take().unwrap());
        enter(&self.ctrs[i].cgroup, ch.id());
        std::fs::write(&go, "").unwrap();
        let mut k = Kid(ch, out);
        assert_eq!(k.line(), "wait_file ok");
        k
    }

    /// Device time of each of `kids` (the sim's own books), ns.
    fn device_time(&self, kids: &[&Kid]) -> Vec<u64> {
        let s = cgpu_testkit::sim_stats(&self.m.state);
        kids.iter()
            .map(|k| s.process(k.0.id(), 0).map_or(0, |p| p.device_time_ns))
            .collect()
    }
}

/// A running tenant process, killed when dropped.
struct Kid(Child, BufReader<std::process::ChildStdout>);

impl Kid {
    fn line(&mut self) -> String {
        let mut l = String::new();
        self.1.read_line(&mut l).unwrap();
        l.trim_end().to_string()
    }
}

impl Drop for Kid {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Both containers' processes keep 1 ms kernels queued for `ms`.
fn busy(ms: u64) -> Vec<String> {
    // The allocation says Hello (joins the container's row) first.
    [
        "init",
        "alloc",
        "1048576",
        "ready",
        "spin_for",
        &ms.to_string(),
        "1000000",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn args(v: &[String]) -> Vec<&str> {
    v.iter().map(|s| s.as_str()).collect()
}

/// The slices of container slots `slots`, and the GPU's, now.
fn slices(l: &Ledger, slots: &[usize]) -> (Vec<u64>, u64) {
    let f = l.file();
    let per = slots
        .iter()
        .map(|&c| f.containers[c].sched[cw::SLICES].load(Relaxed))
        .collect();
    (per, f.header.sched[gw::SLICES].load(Relaxed))
}

#[test]
fn weights_one_to_two_hold_with_the_agent_holding_the_token() {
    let h = Host::new("weights", &[1, 2]);
    let [ka, kb]: [Kid; 2] = h
        .busy(&[(0, true), (1, true)], 12_000)
        .try_into()
        .ok()
        .unwrap();
    // Weighted preemptive (the weights' shares while both are busy).
    let l = h.with_policy(2);
    std::thread::sleep(Duration::from_millis(1500));
    let slots = [h.slot(&l, 0), h.slot(&l, 1)];
    let (s0, g0) = slices(&l, &slots);
    let t0 = h.device_time(&[&ka, &kb]);
    std::thread::sleep(Duration::from_millis(5000));
    let t1 = h.device_time(&[&ka, &kb]);
    let (s1, g1) = slices(&l, &slots);
    let ran: Vec<u64> = t1.iter().zip(&t0).map(|(b, a)| b - a).collect();
    let share_b = ran[1] as f64 / (ran[0] + ran[1]) as f64;
    let (sa, sb) = (s1[0] - s0[0], s1[1] - s0[1]);
    let f = l.file();
    let throttled_a = f.containers[slots[0]].sched[cw::THROTTLED_NS].load(Acquire);
    eprintln!(
        "secure, weights 1:2: device time {ran:?} ns, B's share {share_b:.4} (target 0.6667), slices A {sa} B {sb} of {}, A held back {throttled_a} ns",
        g1 - g0
    );
    assert!(
        sa >= 5 && sb >= 5,
        "the token did not go round: A {sa}, B {sb}"
    );
    assert!(throttled_a > 0, "A was never held back");
    assert!(
        (share_b - 2.0 / 3.0).abs() <= 0.1 * 2.0 / 3.0,
        "B's share {share_b:.4}, target 0.6667 ±10%"
    );
}

/// Two busy containers of equal shares; once A holds the GPU, `to_a` is
/// done to A's process, and after `settle` B must have the GPU to itself:
/// over 2 s it ran, every slice granted was its own, and it was held back
/// for less than 1 s (waiting for A's drain would hold it back for the
/// drain limit, 2 s: the whole window; what is left is the agent's thread
/// being late to renew B's slices on a busy host).
fn b_alone_after(name: &str, what: &str, to_a: impl FnOnce(&mut Kid), settle: Duration) {
    let h = Host::new(name, &[1, 1]);
    let [mut ka, kb]: [Kid; 2] = h
        .busy(&[(0, true), (1, true)], 20_000)
        .try_into()
        .ok()
        .unwrap();
    let l = h.with_policy(1);
    let (slot_a, slot_b) = (h.slot(&l, 0), h.slot(&l, 1));
    let token =
        || cgpu::scheduler::words::Token::unpack(l.file().header.sched[gw::TOKEN].load(Acquire));
    let held = eventually(Duration::from_secs(10), || token().holder == Some(slot_a));
    assert!(held.is_some(), "A never held the GPU");
    to_a(&mut ka);
    std::thread::sleep(settle);
    let throttled = || l.file().containers[slot_b].sched[cw::THROTTLED_NS].load(Acquire);
    let (s0, g0) = slices(&l, &[slot_a, slot_b]);
    let (t0, thr0) = (h.device_time(&[&kb]), throttled());
    std::thread::sleep(Duration::from_millis(2000));
    let (t1, thr1) = (h.device_time(&[&kb]), throttled());
    let (s1, g1) = slices(&l, &[slot_a, slot_b]);
    let (ran, held_back) = (t1[0] - t0[0], thr1 - thr0);
    eprintln!(
        "B after A was {what}: ran {ran} ns (sim), held back {held_back} ns, {} of the GPU's {} slices (A {})",
        s1[1] - s0[1],
        g1 - g0,
        s1[0] - s0[0]
    );
    assert!(ran > 0, "B did not run");
    assert_eq!(s1[0], s0[0], "A, {what}, was given slices");
    assert_eq!(s1[1] - s0[1], g1 - g0, "slices went to another container");
    assert!(
        held_back < 1_000_000_000,
        "B was held back {held_back} ns in 2 s"
    );
}

#[test]
fn a_holder_killed_never_leaves_the_other_container_waiting() {
    // Killed while it holds the GPU (or is about to: either way its
    // connection ends mid-slice or mid-drain).
    let kill = |a: &mut Kid| {
        let _ = a.0.kill();
        let _ = a.0.wait();
    };
    b_alone_after("killed", "killed", kill, Duration::from_millis(500));
}

#[test]
fn launches_never_hang_while_the_agent_restarts_and_are_scheduled_again_after() {
    let mut h = Host::new("restart", &[1]);
    let [ka]: [Kid; 1] = h.busy(&[(0, true)], 30_000).try_into().ok().unwrap();
    let slot = {
        let l = h.ledger();
        let c = h.slot(&l, 0);
        let granted = eventually(Duration::from_secs(10), || {
            l.file().containers[c].sched[cw::SLICES].load(Relaxed) >= 3
        });
        assert!(granted.is_some(), "the agent never granted a slice");
        c
    };
    h.kill_agent();
    let before = h.ledger().file().containers[slot].sched[cw::SLICES].load(Relaxed);
    // The agent is gone: launches go on (unscheduled), never held.
    let t0 = h.device_time(&[&ka])[0];
    std::thread::sleep(Duration::from_millis(1500));
    let t1 = h.device_time(&[&ka])[0];
    eprintln!("without the agent: ran {} ns in 1.5 s", t1 - t0);
    assert!(t1 > t0, "launches stopped while the agent was away");
    h.start_agent();
    // Once it is back, the process is scheduled by it again (it says
    // Hello anew and takes a new scheduling page): slices are granted.
    let l = h.ledger();
    let c = h.slot(&l, 0);
    let again = eventually(Duration::from_secs(20), || {
        l.file().containers[c].sched[cw::SLICES].load(Relaxed) >= before + 3
    });
    eprintln!("scheduled again after the restart in {again:?} (slot {slot} then {c})");
    assert!(
        again.is_some(),
        "never scheduled again after the agent's restart"
    );
    let t2 = h.device_time(&[&ka])[0];
    std::thread::sleep(Duration::from_millis(1000));
    assert!(
        h.device_time(&[&ka])[0] > t2,
        "launches stopped after the restart"
    );
}

#[test]
fn a_holder_stopped_loses_its_turn_and_the_other_runs_alone() {
    // SAFETY: a child of ours (Kid's drop kills it, stopped or not).
    let stop = |a: &mut Kid| unsafe {
        libc::kill(a.0.id() as i32, libc::SIGSTOP);
    };
    // One drain may wait for it (the drain limit) before it is seen stopped.
    b_alone_after("stopped", "stopped", stop, Duration::from_millis(3000));
}

#[test]
fn device_time_outside_the_slices_is_charged_to_its_container() {
    // Container A: one process under the library and one without it (its
    // kernels are never held back); container B: one under the library.
    // Preemptive, equal shares. Without the device's truth, A's program
    // outside the library takes half of B's slices too (B gets about a
    // quarter of the GPU); charged to A and given back to B, each
    // container gets about half.
    let h = Host::new("outside", &[1, 1]);
    let [la, lb, x]: [Kid; 3] = h
        .busy(&[(0, true), (1, true), (0, false)], 30_000)
        .try_into()
        .ok()
        .unwrap();
    h.with_policy(1);
    // The agent's passes (every second) feed the device's time in; the
    // buckets settle within a few seconds.
    let mut t0 = h.device_time(&[&la, &x, &lb]);
    for w in 0..4 {
        std::thread::sleep(Duration::from_millis(3000));
        let t = h.device_time(&[&la, &x, &lb]);
        let r: Vec<u64> = t.iter().zip(&t0).map(|(b, a)| b - a).collect();
        eprintln!("window {w}: {r:?}");
        t0 = t;
    }
    std::thread::sleep(Duration::from_millis(6000));
    let t1 = h.device_time(&[&la, &x, &lb]);
    let ran: Vec<u64> = t1.iter().zip(&t0).map(|(b, a)| b - a).collect();
    let total: u64 = ran.iter().sum();
    let share_b = ran[2] as f64 / total as f64;
    eprintln!(
        "A under the library {} ns, A without it {} ns, B {} ns: B's share {share_b:.3} (target 0.5; about 0.25 when what ran outside the slices is not charged)",
        ran[0], ran[1], ran[2]
    );
    assert!(total > 0);
    // Halfway between the two outcomes.
    assert!(
        share_b >= 0.375,
        "B's share {share_b:.3}: what A ran outside its slices was not charged to it"
    );
}

/// `cgpu-agent client` as a tenant of container `i`: a process that
/// speaks the protocol itself.
fn raw_client(h: &Host, i: usize) -> AgentClient {
    let mut c = Command::new(cgpu_testkit::artifacts().profile_dir.join("cgpu-agent"));
    as_nobody(
        c.arg("client")
            .arg(h.m.ledger.join(cgpu::ledger::wire::SOCKET_NAME))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped()),
    );
    let child = c.spawn().expect("cgpu-agent client");
    enter(&h.ctrs[i].cgroup, child.id());
    AgentClient::new(child, Duration::from_secs(60))
}

/// [`raw_client`], placed on the GPU (`Hello`, a 4 KiB reservation) and
/// holding a scheduling page; and the GPU's UUID.
fn scheduled_raw_client(h: &Host, i: usize) -> (AgentClient, String) {
    let uuid = h.ledger().uuid();
    let mut a = raw_client(h, i);
    assert_eq!(a.ask(&format!("hello {uuid}")).status, "Ok");
    assert_eq!(a.ask(&format!("reserve {uuid} 4096")).status, "Ok");
    let s = a.cmd(&format!("sched {uuid}"));
    assert!(s.starts_with("sched Ok") && s.ends_with("page=true"), "{s}");
    (a, uuid)
}

#[test]
fn a_process_scribbling_on_its_page_moves_only_its_own_container() {
    // A: a process that joins through the protocol, takes a scheduling page
    // and writes garbage into every word of it, all the time (it says it
    // wants the GPU, that it launched in slices it never held, that it
    // drained or did not); B and C: busy under the library. Equal shares.
    let h = Host::new("scribble", &[1, 1, 1]);
    let (mut a, _) = scheduled_raw_client(&h, 0);
    let [kb, kc]: [Kid; 2] = h
        .busy(&[(1, true), (2, true)], 30_000)
        .try_into()
        .ok()
        .unwrap();
    let l = h.with_policy(1);
    let slots = [h.slot(&l, 0), h.slot(&l, 1), h.slot(&l, 2)];
    // Scribbling from now on, in the background.
    a.send("scribble 20000");
    std::thread::sleep(Duration::from_millis(3000));
    let charged = || -> Vec<u64> {
        slots
            .iter()
            .map(|&c| l.file().containers[c].sched[cw::GPU_NS].load(Acquire))
            .collect()
    };
    let (g0, t0) = (charged(), h.device_time(&[&kb, &kc]));
    std::thread::sleep(Duration::from_millis(8000));
    let (g1, t1) = (charged(), h.device_time(&[&kb, &kc]));
    let ran: Vec<u64> = t1.iter().zip(&t0).map(|(b, a)| b - a).collect();
    let held: Vec<u64> = g1.iter().zip(&g0).map(|(b, a)| b - a).collect();
    let share_b = ran[0] as f64 / (ran[0] + ran[1]) as f64;
    let share_a = held[0] as f64 / held.iter().sum::<u64>() as f64;
    eprintln!(
        "beside a scribbling process: B ran {} ns, C ran {} ns (B's part {share_b:.3}); charged A {} B {} C {} ns (A's part {share_a:.3}, its share 0.333)",
        ran[0], ran[1], held[0], held[1], held[2]
    );
    assert!(ran[0] > 0 && ran[1] > 0, "B or C did not run: {ran:?}");
    assert!(
        (share_b - 0.5).abs() <= 0.05,
        "B and C did not keep equal parts: B's {share_b:.3}"
    );
    assert!(
        share_a <= 0.4,
        "the scribbling container held more than its share: {share_a:.3}"
    );
}

#[test]
fn a_hung_agent_never_leaves_a_waiting_launch_waiting_for_good() {
    // The agent stops answering (SIGSTOP: a hung scheduler) while one
    // container holds the GPU and the other waits: the waiting one goes on
    // unscheduled once the agent's beat is 2 s old.
    let h = Host::new("hung", &[1, 1]);
    let [ka, kb]: [Kid; 2] = h
        .busy(&[(0, true), (1, true)], 30_000)
        .try_into()
        .ok()
        .unwrap();
    h.with_policy(1);
    std::thread::sleep(Duration::from_millis(1000));
    let agent = h.agent.as_ref().unwrap().id() as i32;
    // SAFETY: the agent is a child of ours.
    unsafe { libc::kill(agent, libc::SIGSTOP) };
    std::thread::sleep(Duration::from_millis(3000));
    let t0 = h.device_time(&[&ka, &kb]);
    std::thread::sleep(Duration::from_millis(2000));
    let t1 = h.device_time(&[&ka, &kb]);
    // SAFETY: as above.
    unsafe { libc::kill(agent, libc::SIGCONT) };
    let ran: Vec<u64> = t1.iter().zip(&t0).map(|(b, a)| b - a).collect();
    eprintln!(
        "with the agent stopped: A ran {} ns, B ran {} ns in 2 s",
        ran[0], ran[1]
    );
    assert!(
        ran[0] > 0 && ran[1] > 0,
        "a container waited for a stopped agent: {ran:?}"
    );
}

#[test]
fn scheduling_requests_a_tenant_forges_are_refused() {
    let h = Host::new("forged", &[1]);
    let uuid = h.ledger().uuid();
    let mut a = raw_client(&h, 0);
    // Before its Hello: the agent places no process it does not know.
    assert_eq!(
        a.cmd(&format!("sched {uuid}")),
        "sched NotJoined container=4294967295 page=false"
    );
    assert_eq!(a.ask(&format!("hello {uuid}")).status, "Ok");
    assert_eq!(a.ask(&format!("reserve {uuid} 4096")).status, "Ok");
    let pid = a.child.id();
    let l = h.ledger();
    let slots = || {
        l.file()
            .processes
            .iter()
            .filter(|p| {
                p.state.load(Acquire) == cgpu::ledger::SLOT_LIVE && p.host_pid() == Some(pid)
            })
            .count()
    };
    assert_eq!(slots(), 1);
    // On the connection that said Hello: refused, and the connection ends
    // with everything it held (its process slot, its 4096 bytes).
    assert_eq!(a.ask(&format!("sched-here {uuid}")).status, "BadRequest");
    let freed = eventually(Duration::from_secs(10), || slots() == 0);
    assert!(freed.is_some(), "the connection's process slot was kept");
    assert_eq!(cgpu_testkit::secure::row_used(&l, &h.ctrs[0].id), 0);
}

#[test]
fn a_process_that_never_drains_holds_no_more_than_its_share() {
    // A: a process speaking the protocol itself that always wants the GPU
    // and, whenever its container holds it, says it launched in that slice
    // and never drains, and takes a fresh scheduling connection every
    // 2.5 s (a new connection must not make it trusted again). B:
    // busy under the library. Equal shares: the first drain of A's that is
    // given up on costs the drain limit (charged to A); from then on A is
    // waited for 50 ms at most, whatever connection it comes back on.
    let h = Host::new("stall", &[1, 1]);
    let (mut a, uuid) = scheduled_raw_client(&h, 0);
    let [kb]: [Kid; 1] = h.busy(&[(1, true)], 30_000).try_into().ok().unwrap();
    let l = h.with_policy(1);
    let slots = [h.slot(&l, 0), h.slot(&l, 1)];
    a.send(&format!("stall {uuid} 20000 2500"));
    std::thread::sleep(Duration::from_millis(4000));
    let charged = || -> Vec<u64> {
        slots
            .iter()
            .map(|&c| l.file().containers[c].sched[cw::GPU_NS].load(Acquire))
            .collect()
    };
    let (g0, t0) = (charged(), h.device_time(&[&kb]));
    // B's longest wait for the GPU in the window (B always wants it).
    let token =
        || cgpu::scheduler::words::Token::unpack(l.file().header.sched[gw::TOKEN].load(Acquire));
    let start = std::time::Instant::now();
    let (mut last_b, mut longest) = (None::<std::time::Instant>, Duration::ZERO);
    while start.elapsed() < Duration::from_millis(8000) {
        let now = std::time::Instant::now();
        if token().holder == Some(slots[1]) {
            last_b = Some(now);
        } else if let Some(t) = last_b {
            longest = longest.max(now - t);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let (g1, t1) = (charged(), h.device_time(&[&kb]));
    let held: Vec<u64> = g1.iter().zip(&g0).map(|(b, a)| b - a).collect();
    let share_a = held[0] as f64 / (held[0] + held[1]) as f64;
    eprintln!(
        "beside a process that never drains: charged A {} B {} ns (A's part {share_a:.3}, its share 0.5); B ran {} ns in 8 s, its longest wait {} ms",
        held[0],
        held[1],
        t1[0] - t0[0],
        longest.as_millis()
    );
    assert!(t1[0] > t0[0], "B did not run");
    // Waited for the drain limit at each of A's turns (or at each of A's
    // new connections), B would wait 2 s at a time; waited for 50 ms, a
    // slice and that.
    assert!(
        longest < Duration::from_millis(1000),
        "B waited {} ms at once",
        longest.as_millis()
    );
    assert!(
        share_a <= 0.55,
        "the container that never drains held more than its share: {share_a:.3}"
    );
}

#[test]
fn a_flood_of_wake_ups_never_stops_the_agents_scheduler() {
    // A process floods its scheduling connection with wake-up packets; the
    // agent's scheduler goes on deciding (its beat in the ledger stays
    // fresh), and two busy containers keep equal parts.
    let h = Host::new("flood", &[1, 1, 1]);
    let (mut a, _) = scheduled_raw_client(&h, 0);
    let [kb, kc]: [Kid; 2] = h
        .busy(&[(1, true), (2, true)], 30_000)
        .try_into()
        .ok()
        .unwrap();
    let l = h.with_policy(1);
    a.send("ring 100000000");
    std::thread::sleep(Duration::from_millis(1000));
    let t0 = h.device_time(&[&kb, &kc]);
    let mut stalest = 0u64;
    for _ in 0..40 {
        std::thread::sleep(Duration::from_millis(100));
        let beat = l.file().header.sched[gw::AGENT_BEAT].load(Acquire);
        stalest = stalest.max(cgpu::process::clock::monotonic_ns().saturating_sub(beat));
    }
    let t1 = h.device_time(&[&kb, &kc]);
    let ran: Vec<u64> = t1.iter().zip(&t0).map(|(b, a)| b - a).collect();
    let share_b = ran[0] as f64 / (ran[0] + ran[1]) as f64;
    eprintln!(
        "during a flood of wake-ups: the agent's beat at most {} ms old; B ran {} ns, C {} ns (B's part {share_b:.3})",
        stalest / 1_000_000,
        ran[0],
        ran[1]
    );
    assert!(
        stalest < 2_000_000_000,
        "the agent's scheduler stopped for {} ms",
        stalest / 1_000_000
    );
    assert!(ran[0] > 0 && ran[1] > 0, "B or C did not run: {ran:?}");
    assert!(
        (share_b - 0.5).abs() <= 0.05,
        "B and C did not keep equal parts: B's {share_b:.3}"
    );
}
