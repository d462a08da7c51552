//! Multi-process ledger tests: real processes (this test binary re-executed
//! as `--exact child --ignored` with `CGPU_LEDGER_CHILD=<role>`) racing,
//! being killed with SIGKILL at random points (also while holding the table
//! lock), forking, creating the same ledger at once. Every wait is bounded.
//! Children speak in lines starting with `@@` (libtest's own output around
//! them is ignored). `CGPU_TEST_SEED` replays a run.

use cgpu::ledger::*;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

const UUID: &str = "GPU-procs-0";
const KIB: u64 = 1024;

// ---------------------------------------------------------------- helpers

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("child needs {name}"))
}
fn env_u64(name: &str) -> u64 {
    env(name).parse().unwrap()
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn seed() -> u64 {
    std::env::var("CGPU_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        })
}

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cgpu-ledger-procs-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

struct Child {
    proc: std::process::Child,
    lines: mpsc::Receiver<String>,
}

impl Child {
    fn spawn(role: &str, dir: &Path, envs: &[(&str, String)]) -> Child {
        Self::spawn_under(&[], role, dir, envs)
    }
    /// Run this binary under `wrapper` (e.g. `unshare …`).
    fn spawn_under(wrapper: &[&str], role: &str, dir: &Path, envs: &[(&str, String)]) -> Child {
        let exe = std::env::current_exe().unwrap();
        let mut cmd = match wrapper.split_first() {
            None => Command::new(&exe),
            Some((w, rest)) => {
                let mut c = Command::new(w);
                c.args(rest).arg(&exe);
                c
            }
        };
        cmd.args([
            "--exact",
            "child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ]);
        cmd.env("CGPU_LEDGER_CHILD", role)
            .env("DIR", dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let mut proc = cmd.spawn().unwrap();
        let out = proc.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let Some(line) = line.strip_prefix("@@") else {
                    continue; // libtest's own lines
                };
                if tx.send(line.to_string()).is_err() {
                    break;
                }
            }
        });
        Child { proc, lines }
    }
    fn pid(&self) -> i32 {
        self.proc.id() as i32
    }
    /// The next line starting with `prefix` (bounded wait).
    fn expect(&self, prefix: &str, timeout: Duration) -> String {
        let t0 = Instant::now();
        loop {
            let left = timeout.checked_sub(t0.elapsed()).unwrap_or_else(|| {
                panic!(
                    "child {} gave no {prefix:?} line within {timeout:?}",
                    self.pid()
                )
            });
            match self.lines.recv_timeout(left) {
                Ok(l) if l.starts_with(prefix) => return l,
                Ok(_) => continue,
                Err(_) => panic!(
                    "child {} gave no {prefix:?} line within {timeout:?}",
                    self.pid()
                ),
            }
        }
    }
    /// SIGKILL and wait. Its stdin stays open until it is gone: `wait`
    /// alone would close it first, and EOF on stdin is a holder's cue to
    /// leave normally, so a child that had not died yet (a namespaced
    /// grandchild killed only once its `unshare` parent is) would leave,
    /// or be killed half-way through leaving, instead of simply dying.
    fn kill9(&mut self) {
        let stdin = self.proc.stdin.take();
        // SAFETY: kill(2) on our own child's pid, not yet waited for.
        unsafe { libc::kill(self.pid(), libc::SIGKILL) };
        let _ = self.proc.wait();
        drop(stdin);
    }
    /// Close its stdin (its cue to finish) and wait, bounded.
    fn finish(mut self, timeout: Duration) -> std::process::ExitStatus {
        drop(self.proc.stdin.take());
        let t0 = Instant::now();
        loop {
            if let Some(st) = self.proc.try_wait().unwrap() {
                return st;
            }
            assert!(
                t0.elapsed() < timeout,
                "child {} did not exit within {timeout:?}",
                self.pid()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if self.proc.try_wait().ok().flatten().is_none() {
            self.kill9();
        }
    }
}

fn join_req(id: &str, quota: u64) -> JoinRequest<'_> {
    JoinRequest {
        container_id: id,
        key: 0,
        quota,
        weight: 1,
        highprio: false,
        enforce_off: false,
    }
}

fn wait_stdin_eof() {
    let mut buf = [0u8; 64];
    while std::io::stdin()
        .read(&mut buf)
        .map(|n| n > 0)
        .unwrap_or(false)
    {}
}

fn say(s: &str) {
    let mut o = std::io::stdout().lock();
    // On a line of its own (libtest may have written "test child ... ").
    writeln!(o, "\n@@{s}").unwrap();
    o.flush().unwrap();
}

/// Does any process hold the ledger's table lock (bytes [0, 8))?
fn table_locked(path: &Path) -> bool {
    use std::os::fd::AsRawFd;
    let f = std::fs::File::open(path).unwrap();
    // SAFETY: all-zero is a valid flock; l_pid must be 0 for OFD locks.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = libc::F_WRLCK as _;
    fl.l_whence = libc::SEEK_SET as _;
    fl.l_start = 0;
    fl.l_len = 8;
    // SAFETY: valid fd and flock.
    assert_eq!(
        unsafe { libc::fcntl(f.as_raw_fd(), libc::F_OFD_GETLK, &mut fl) },
        0
    );
    fl.l_type != libc::F_UNLCK as libc::c_short
}

/// Wait (bounded) until `f` holds; returns how long it took.
fn within(timeout: Duration, mut f: impl FnMut() -> bool) -> Option<Duration> {
    let t0 = Instant::now();
    loop {
        if f() {
            return Some(t0.elapsed());
        }
        if t0.elapsed() > timeout {
            return None;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Random reserve/release until `stop`; returns bytes still held.
fn hammer(
    l: &Ledger,
    m: &Membership,
    rng: &mut Rng,
    max_size: u64,
    stop: &AtomicBool,
    max_seen: &AtomicU64,
    iters: u64,
) -> u64 {
    let c = &l.file().containers[m.container];
    let mut held: Vec<u64> = Vec::new();
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) && n < iters {
        n += 1;
        let x = rng.next();
        if x & 1 == 0 {
            let sz = 1 + rng.below(max_size);
            if l.try_reserve(m, sz).is_ok() {
                held.push(sz);
                max_seen.fetch_max(c.used.load(Ordering::Relaxed), Ordering::Relaxed);
            }
        } else if !held.is_empty() {
            let i = rng.below(held.len() as u64) as usize;
            l.release(m, held.swap_remove(i));
        }
    }
    held.iter().sum()
}

// ---------------------------------------------------------------- child roles

fn child_main(role: &str) {
    let dir = PathBuf::from(env("DIR"));
    match role {
        // Join, race THREADS threads of random reserve/release, report, wait.
        "racer" => {
            let l = Ledger::open_or_create(&dir, UUID, 0, 0).unwrap();
            let m = l.join(&join_req(&env("ID"), env_u64("QUOTA"))).unwrap();
            say("joined");
            let threads = env_u64("THREADS");
            let max_seen = AtomicU64::new(0);
            let never = AtomicBool::new(false);
            let held: u64 = std::thread::scope(|s| {
                let hs: Vec<_> = (0..threads)
                    .map(|t| {
                        let (l, m, max_seen, never) = (&l, &m, &max_seen, &never);
                        let mut rng =
                            Rng(env_u64("SEED") ^ (t + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
                        s.spawn(move || {
                            hammer(
                                l,
                                m,
                                &mut rng,
                                env_u64("MAXSZ"),
                                never,
                                max_seen,
                                env_u64("ITERS"),
                            )
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).sum()
            });
            let slot = l.file().processes[m.process].used.load(Ordering::SeqCst);
            say(&format!(
                "held {held} slot {slot} max {}",
                max_seen.load(Ordering::Relaxed)
            ));
            wait_stdin_eof();
            if env_u64("LEAVE") == 1 {
                l.leave(m);
            }
        }
        // Join (optionally pausing inside join while holding the table lock),
        // then hammer until killed.
        "victim" => {
            let l = Ledger::open_or_create(&dir, UUID, 0, 0).unwrap();
            let pause = env_u64("PAUSE_MS");
            TEST_JOIN_PAUSE_MS.store(pause, Ordering::Relaxed);
            say("joining");
            let m = l.join(&join_req(&env("ID"), env_u64("QUOTA"))).unwrap();
            say("joined");
            let never = AtomicBool::new(false);
            let max_seen = AtomicU64::new(0);
            std::thread::scope(|s| {
                for t in 0..2u64 {
                    let (l, m, never, max_seen) = (&l, &m, &never, &max_seen);
                    let mut rng = Rng(env_u64("SEED") ^ (t + 7));
                    s.spawn(move || {
                        hammer(l, m, &mut rng, env_u64("MAXSZ"), never, max_seen, u64::MAX)
                    });
                }
            });
        }
        // Join, hold HOLD bytes, wait for stdin EOF, leave.
        "holder" => {
            let l = Ledger::open_or_create(&dir, UUID, 0, 0).unwrap();
            let m = l.join(&join_req(&env("ID"), env_u64("QUOTA"))).unwrap();
            l.try_reserve(&m, env_u64("HOLD")).unwrap();
            say("held");
            wait_stdin_eof();
            l.leave(m);
        }
        // Join, hold, fork a child that (maybe) calls after_fork_child and
        // lives on; then wait to be killed.
        "forker" => {
            let l = Ledger::open_or_create(&dir, UUID, 0, 0).unwrap();
            let m = l.join(&join_req(&env("ID"), 0)).unwrap();
            l.try_reserve(&m, env_u64("HOLD")).unwrap();
            let after = env_u64("AFTER_FORK") == 1;
            // SAFETY: this role is single-threaded here (main thread only),
            // and the child only makes async-signal-safe calls.
            let pid = unsafe { libc::fork() };
            if pid == 0 {
                if after {
                    l.after_fork_child();
                }
                // SAFETY: async-signal-safe calls only, in the forked child.
                unsafe {
                    libc::sleep(30);
                    libc::_exit(0);
                }
            }
            say(&format!("forked {pid} slot {}", m.process));
            wait_stdin_eof();
        }
        // Open-or-create the (new) ledger at a common instant, join, report.
        "creator" => {
            TEST_CREATE_PAUSE_MS.store(env_u64("CREATE_PAUSE_MS"), Ordering::Relaxed);
            let go = env_u64("GO_NS");
            while now_ns() < go {
                std::hint::spin_loop();
            }
            let l = Ledger::open_or_create(&dir, UUID, 0, 0).unwrap();
            use std::os::unix::fs::MetadataExt;
            let ino = std::fs::metadata(l.path()).unwrap().ino();
            let m = l.join(&join_req(&env("ID"), KIB)).unwrap();
            let lost = TEST_CREATE_LOST.load(Ordering::Relaxed);
            say(&format!("ok {ino} {} {lost}", m.container));
            wait_stdin_eof();
        }
        "default_dir" => say(&format!("dir {}", Ledger::default_dir().display())),
        other => panic!("unknown child role {other}"),
    }
}

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

// ---------------------------------------------------------------- tests

/// 8 processes × 4 threads race random reserve/release on one container.
/// The container never passes its quota; at the end the container's used,
/// the sum of the process slots and the sum the processes report agree to
/// the byte.
fn race_8_processes(seed: u64) {
    let dir = tmpdir("race");
    let quota = 1024 * KIB;
    let l = Ledger::open_or_create(&dir, UUID, 0, 0).unwrap();
    let kids: Vec<Child> = (0..8u64)
        .map(|i| {
            Child::spawn(
                "racer",
                &dir,
                &[
                    ("ID", "racepod".into()),
                    ("QUOTA", quota.to_string()),
                    ("THREADS", "4".into()),
                    ("ITERS", "50000".into()),
                    ("MAXSZ", (64 * KIB).to_string()),
                    ("SEED", (seed ^ (i * 0x1000_0001)).to_string()),
                    ("LEAVE", (i % 2).to_string()),
                ],
            )
        })
        .collect();
    for k in &kids {
        k.expect("joined", Duration::from_secs(60));
    }
    let c = l.find_container("racepod").expect("container joined");
    let cs = &l.file().containers[c];
    // Sample from outside too while they race.
    let stop = Arc::new(AtomicBool::new(false));
    let sampled_max = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (stop, sampled_max) = (stop.clone(), sampled_max.clone());
        let l = Ledger::open(l.path()).unwrap();
        std::thread::spawn(move || {
            let cs = &l.file().containers[c];
            while !stop.load(Ordering::Relaxed) {
                sampled_max.fetch_max(cs.used.load(Ordering::Relaxed), Ordering::Relaxed);
                std::hint::spin_loop();
            }
        })
    };
    let mut reported = 0u64;
    let mut child_max = 0u64;
    for k in &kids {
        let line = k.expect("held", Duration::from_secs(300));
        let v: Vec<u64> = line
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect();
        assert_eq!(v[0], v[1], "child's own tally equals its slot: {line}");
        reported += v[0];
        child_max = child_max.max(v[2]);
    }
    stop.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    let used = cs.used.load(Ordering::SeqCst);
    let slots: u64 = l
        .processes_of(c)
        .map(|(_, p)| p.used.load(Ordering::SeqCst))
        .sum();
    let peak = cs.peak.load(Ordering::SeqCst);
    let ooms = cs.oom_count.load(Ordering::SeqCst);
    println!(
        "  race: quota {quota}, peak {peak}, max seen by racers {child_max}, by sampler {}, refusals {ooms}, held at end {used}",
        sampled_max.load(Ordering::Relaxed)
    );
    assert!(peak <= quota && child_max <= quota && sampled_max.load(Ordering::Relaxed) <= quota);
    assert!(
        ooms > 0,
        "the quota was contended (else the test proves little)"
    );
    assert!(peak > quota - 64 * KIB, "got near the quota");
    assert_eq!(used, slots, "container used == sum of process slots");
    assert_eq!(used, reported, "container used == sum the processes hold");
    assert_eq!(cs.nprocs.load(Ordering::SeqCst), 8);
    for k in kids {
        assert!(k.finish(Duration::from_secs(30)).success());
    }
    // Half left, half just exited: all reaped, container freed.
    assert!(within(Duration::from_secs(2), || {
        l.reap();
        l.containers().count() == 0
    })
    .is_some());
    let _ = std::fs::remove_dir_all(&dir);
}

/// SIGKILL at random points, 50 times: in the hot path (often with an
/// operation in flight) and inside `join` holding the table lock. Survivors
/// (this process, hammering on its own threads, and two holder processes)
/// never hang, and the container's used equals what the survivors hold
/// within 1 s, via the rate-limited `maybe_reap` the hooks use.
fn kill9_random_points(seed: u64) {
    let dir = tmpdir("kill");
    let mut rng = Rng(seed);
    // CGPU_TEST_ROUNDS for longer soaks; every 10th round (from the 4th)
    // kills inside join, holding the table lock.
    let rounds: u32 = std::env::var("CGPU_TEST_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(50);
    let quota = 4096 * KIB;
    let id = "killpod";
    let l = Ledger::open_or_create(&dir, UUID, 0, 0).unwrap();
    let me = l.join(&join_req(id, quota)).unwrap();
    let c = me.container;
    let cs = &l.file().containers[c];
    let holds = [100 * KIB, 250 * KIB];
    let holders: Vec<Child> = holds
        .iter()
        .map(|h| {
            Child::spawn(
                "holder",
                &dir,
                &[
                    ("ID", id.into()),
                    ("QUOTA", quota.to_string()),
                    ("HOLD", h.to_string()),
                ],
            )
        })
        .collect();
    for h in &holders {
        h.expect("held", Duration::from_secs(60));
    }

    // This process's own hammer threads, pausable, counting operations.
    let pause = AtomicBool::new(false);
    let paused = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let my_held = AtomicU64::new(0);
    let ops = AtomicU64::new(0);
    let mut worst = Duration::ZERO;
    let mut table_kills = 0;
    /// Stops the hammer thread even when an assertion fails (else the
    /// scope would wait for it forever).
    struct StopOnDrop<'a>(&'a AtomicBool);
    impl Drop for StopOnDrop<'_> {
        fn drop(&mut self) {
            self.0.store(true, Ordering::Relaxed);
        }
    }
    std::thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        s.spawn(|| {
            let mut rng = Rng(seed ^ 0xABCD);
            let mut held: Vec<u64> = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                if pause.load(Ordering::Acquire) {
                    my_held.store(held.iter().sum(), Ordering::Release);
                    paused.store(1, Ordering::Release);
                    // A failed round sets `stop` while paused: the thread
                    // must end then, or the scope would wait for it for
                    // ever instead of failing.
                    while pause.load(Ordering::Acquire) && !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_micros(200));
                    }
                    paused.store(0, Ordering::Release);
                }
                if rng.next() & 1 == 0 {
                    let sz = 1 + rng.below(64 * KIB);
                    if l.try_reserve(&me, sz).is_ok() {
                        held.push(sz);
                    }
                } else if let Some(b) = held.pop() {
                    l.release(&me, b);
                }
                l.maybe_reap(REAP_INTERVAL);
                ops.fetch_add(1, Ordering::Relaxed);
            }
            for b in held {
                l.release(&me, b);
            }
        });

        for round in 0..rounds {
            let in_join = round % 10 == 3;
            let n = if in_join { 1 } else { 1 + rng.below(3) };
            let victims: Vec<Child> = (0..n)
                .map(|_| {
                    Child::spawn(
                        "victim",
                        &dir,
                        &[
                            ("ID", id.into()),
                            ("QUOTA", quota.to_string()),
                            ("MAXSZ", (64 * KIB).to_string()),
                            ("SEED", rng.next().to_string()),
                            (
                                "PAUSE_MS",
                                if in_join { "10000".into() } else { "0".into() },
                            ),
                        ],
                    )
                })
                .collect();
            for mut v in victims {
                if in_join {
                    v.expect("joining", Duration::from_secs(60));
                    // Wait until it is inside join: table lock held, a
                    // process slot half-claimed.
                    let inside = within(Duration::from_secs(30), || {
                        table_locked(l.path())
                            && l.file()
                                .processes
                                .iter()
                                .any(|p| p.state.load(Ordering::SeqCst) == SLOT_CLAIMING)
                    });
                    assert!(
                        inside.is_some(),
                        "round {round}: victim never paused inside join"
                    );
                    // A live holder: a slot-table operation gives up in bounded
                    // time, and the hot path keeps going meanwhile.
                    let before = ops.load(Ordering::Relaxed);
                    let t0 = Instant::now();
                    let n = l.reap();
                    let waited = t0.elapsed();
                    assert_eq!(n, 0);
                    assert!(waited < Duration::from_secs(5), "reap waited {waited:?}");
                    assert!(
                        waited >= Duration::from_millis(1900),
                        "reap waited the 2 s bound: {waited:?}"
                    );
                    table_kills += 1;
                    assert!(ops.load(Ordering::Relaxed) > before, "hot path blocked");
                } else {
                    v.expect("joined", Duration::from_secs(60));
                    std::thread::sleep(Duration::from_micros(rng.below(20_000)));
                }
                v.kill9();
            }
            let killed_at = Instant::now();
            // Survivors' truth: holders + what our hammer holds once paused.
            pause.store(true, Ordering::Release);
            assert!(
                within(Duration::from_secs(10), || paused.load(Ordering::Acquire)
                    == 1)
                .is_some()
            );
            let expect = holds.iter().sum::<u64>() + my_held.load(Ordering::Acquire);
            let took = within(Duration::from_secs(3), || {
                l.maybe_reap(REAP_INTERVAL);
                cs.used.load(Ordering::SeqCst) == expect && cs.nprocs.load(Ordering::SeqCst) == 3
            });
            let took = took.unwrap_or_else(|| {
                panic!(
                    "round {round}: used {} != survivors' {expect} or nprocs {} != 3 after 3 s (suspect {})",
                    cs.used.load(Ordering::SeqCst),
                    cs.nprocs.load(Ordering::SeqCst),
                    cs.suspect.load(Ordering::SeqCst)
                )
            });
            let since_kill = killed_at.elapsed();
            worst = worst.max(since_kill);
            assert_eq!(
                cs.nprocs.load(Ordering::SeqCst),
                3,
                "round {round}: victims' slots freed"
            );
            assert!(
                took <= Duration::from_secs(1),
                "round {round}: whole again after {took:?}"
            );
            pause.store(false, Ordering::Release);
        }
        stop.store(true, Ordering::Relaxed);
    });
    println!(
        "  kill9: {rounds} rounds, {table_kills} kills while holding the table lock, {} recounts after a death mid-operation, worst time from kill to whole {worst:?}",
        cs.recounts.load(Ordering::SeqCst)
    );
    assert_eq!(table_kills, (0..rounds).filter(|r| r % 10 == 3).count());
    assert_eq!(cs.used.load(Ordering::SeqCst), holds.iter().sum::<u64>());
    for h in holders {
        assert!(h.finish(Duration::from_secs(30)).success());
    }
    l.leave(me);
    assert_eq!(l.containers().count(), 0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A forked child shares the parent's lock-holding file description: with
/// `after_fork_child` the parent's death is still seen; without it the
/// child keeps the parent's slot alive (why hooks must call it).
fn fork_child(_seed: u64) {
    let dir = tmpdir("fork");
    let l = Ledger::open_or_create(&dir, UUID, 0, 0).unwrap();
    for after in [1, 0] {
        let mut k = Child::spawn(
            "forker",
            &dir,
            &[
                ("ID", "forkpod".into()),
                ("HOLD", "4096".into()),
                ("AFTER_FORK", after.to_string()),
            ],
        );
        let line = k.expect("forked", Duration::from_secs(60));
        let v: Vec<i32> = line
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect();
        let (grandchild, slot) = (v[0], v[1] as usize);
        assert!(l.is_alive(slot));
        k.kill9();
        let reaped = within(Duration::from_secs(1), || {
            l.reap();
            !l.is_alive(slot) && l.containers().count() == 0
        });
        if after == 1 {
            assert!(
                reaped.is_some(),
                "parent's slot reaped although its forked child lives"
            );
        } else {
            assert!(
                reaped.is_none(),
                "without after_fork_child the child keeps the slot alive"
            );
        }
        // SAFETY: kill(2) of the grandchild we were told about; then reap.
        unsafe { libc::kill(grandchild, libc::SIGKILL) };
        assert!(within(Duration::from_secs(2), || {
            l.reap();
            l.containers().count() == 0
        })
        .is_some());
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// 8 processes create the same absent ledger at the same instant: one file,
/// all valid, all 8 containers in it.
/// Eight processes create the same ledger at one instant: one file, eight
/// distinct container slots, no temporary left. The race must really have
/// happened (at least one creator built its file and lost the link to
/// another's); a round where it did not is run again, at most 10 times.
fn concurrent_creation(_seed: u64) {
    for round in 0..10 {
        let dir = tmpdir(&format!("create-{round}"));
        let go = now_ns() + 300_000_000;
        let kids: Vec<Child> = (0..8)
            .map(|i| {
                Child::spawn(
                    "creator",
                    &dir,
                    &[
                        ("ID", format!("c{i}")),
                        ("GO_NS", go.to_string()),
                        // Each creator holds its finished file 100 ms
                        // before linking it: creators that start within
                        // that window race for the name.
                        ("CREATE_PAUSE_MS", "100".to_string()),
                    ],
                )
            })
            .collect();
        let mut inos = Vec::new();
        let mut slots = Vec::new();
        let mut lost = 0;
        for k in &kids {
            let line = k.expect("ok", Duration::from_secs(60));
            let v: Vec<u64> = line
                .split_whitespace()
                .filter_map(|w| w.parse().ok())
                .collect();
            inos.push(v[0]);
            slots.push(v[1]);
            lost += v[2];
        }
        assert!(
            inos.iter().all(|&i| i == inos[0]),
            "one file for all: {inos:?}"
        );
        slots.sort();
        slots.dedup();
        assert_eq!(slots.len(), 8, "8 distinct container slots");
        let l = Ledger::open(&Ledger::path_for(&dir, UUID)).unwrap();
        assert_eq!(l.containers().count(), 8);
        let leftovers: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name())
            .collect();
        assert_eq!(leftovers.len(), 1, "no temporary files left: {leftovers:?}");
        for k in kids {
            assert!(k.finish(Duration::from_secs(30)).success());
        }
        let _ = std::fs::remove_dir_all(&dir);
        if lost > 0 {
            println!("  creation: {lost} creators lost the race in round {round}");
            return;
        }
    }
    panic!("in 10 rounds no two creators ever raced: the test proved nothing");
}

/// `CGPU_LEDGER_DIR` names the directory (checked in a child process, whose
/// environment we set before it starts).
fn default_dir_env(_seed: u64) {
    let dir = tmpdir("defaultdir");
    let want = dir.join("custom");
    let k = Child::spawn(
        "default_dir",
        &dir,
        &[("CGPU_LEDGER_DIR", want.display().to_string())],
    );
    assert_eq!(
        k.expect("dir", Duration::from_secs(60)),
        format!("dir {}", want.display())
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A process in its own PID namespace (where it is pid 1, a pid that is
/// always "alive" to `kill(pid, 0)` on the host) is told apart and reaped
/// by its lock alone. As root with `unshare --pid`; otherwise inside a user
/// namespace (`unshare --user --map-root-user --pid`). Where neither can be
/// made the test fails, saying so: it never passes without running.
fn pid_namespace(_seed: u64) {
    let plain: &[&str] = &["unshare", "--pid", "--fork", "--kill-child", "--mount-proc"];
    let userns: &[&str] = &[
        "unshare",
        "--user",
        "--map-root-user",
        "--pid",
        "--fork",
        "--kill-child",
        "--mount-proc",
    ];
    let works = |w: &[&str]| {
        Command::new(w[0])
            .args(&w[1..])
            .arg("true")
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    };
    let wrapper = [plain, userns]
        .into_iter()
        .find(|w| works(w))
        .expect("cannot create a PID namespace here, neither as root nor in a user namespace (unshare): this test needs one");
    let dir = tmpdir("pidns");
    let l = Ledger::open_or_create(&dir, UUID, 0, 0).unwrap();
    let me = l.join(&join_req("nspod", 0)).unwrap();
    let mut k = Child::spawn_under(
        wrapper,
        "holder",
        &dir,
        &[
            ("ID", "nspod".into()),
            ("QUOTA", "0".into()),
            ("HOLD", "12345".into()),
        ],
    );
    k.expect("held", Duration::from_secs(60));
    let snap = l.snapshot();
    let mine = snap
        .processes
        .iter()
        .find(|p| p.slot == me.process)
        .unwrap();
    let theirs = snap
        .processes
        .iter()
        .find(|p| p.slot != me.process)
        .unwrap();
    println!(
        "  pidns: host process pid {} ns {}, namespaced pid {} ns {}",
        mine.pid, mine.pidns, theirs.pid, theirs.pidns
    );
    assert_eq!(theirs.pid, 1, "pid 1 inside its namespace");
    assert_ne!(theirs.pidns, mine.pidns);
    assert!(theirs.alive);
    let c = &l.file().containers[me.container];
    assert_eq!(c.used.load(Ordering::SeqCst), 12345);
    k.kill9(); // kills unshare; --kill-child takes the namespaced process down with it
    let took = within(Duration::from_secs(3), || {
        l.reap();
        c.used.load(Ordering::SeqCst) == 0 && c.nprocs.load(Ordering::SeqCst) == 1
    });
    assert!(took.is_some(), "namespaced process reaped by its lock");
    l.leave(me);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Entry point of the child processes (this binary re-run by the tests
/// below): not a test itself, hence ignored in normal runs.
#[test]
#[ignore = "child process entry point, run by the other tests"]
fn child() {
    let role = std::env::var("CGPU_LEDGER_CHILD").expect("run by the tests with CGPU_LEDGER_CHILD");
    child_main(&role);
}

macro_rules! ledger_procs_tests {
    ($($name:ident),* $(,)?) => {
        mod cases {
            $(
                #[test]
                fn $name() {
                    let s = super::seed();
                    println!("{}: seed {s} (set CGPU_TEST_SEED to replay)", stringify!($name));
                    super::$name(s);
                }
            )*
        }
    };
}

ledger_procs_tests!(
    default_dir_env,
    concurrent_creation,
    race_8_processes,
    fork_child,
    pid_namespace,
    kill9_random_points,
);
