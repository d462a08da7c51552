//! Single-process ledger tests: files, validation, join/leave, reserve/release,
//! knobs, free_weight. Multi-process races and kills: `ledger_procs.rs`.

use cgpu::ledger::*;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

const GIB: u64 = 1 << 30;

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("cgpu-ledger-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn req(id: &str, quota: u64) -> JoinRequest<'_> {
    JoinRequest {
        container_id: id,
        key: 0,
        quota,
        weight: 1,
        highprio: false,
        enforce_off: false,
    }
}

fn open(dir: &Path) -> Ledger {
    Ledger::open_or_create(dir, "GPU-test-0", 0, 16 * GIB).unwrap()
}

/// After a handle is dropped, wait (bounded) until its process slot is seen
/// dead. Dropping closes the handle's open file descriptions, and with them
/// its liveness lock, unless another test of this binary is starting a child
/// process at that moment: between fork and exec the child holds copies of
/// every descriptor (close-on-exec ones too), so the lock lives a little
/// longer. Without this wait a reap right after the drop finds nobody dead.
fn wait_dead(l: &Ledger, slot: usize) {
    let t0 = std::time::Instant::now();
    while l.is_alive(slot) {
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(10),
            "slot {slot} still alive 10 s after its handle was dropped"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

#[test]
fn create_defaults_and_reopen() {
    let d = tmpdir("create");
    let l = open(&d);
    let h = &l.file().header;
    assert_eq!(h.magic, LEDGER_MAGIC);
    assert_eq!(h.version, FORMAT_VERSION);
    assert_eq!(h.file_size as usize, std::mem::size_of::<LedgerFile>());
    assert_eq!(h.ready.load(Ordering::Relaxed), 1);
    assert_eq!(h.policy.load(Ordering::Relaxed), DEFAULT_POLICY);
    assert_eq!(h.max_inst.load(Ordering::Relaxed), 16);
    assert_eq!(h.prio_ratio.load(Ordering::Relaxed), 80);
    assert_eq!(h.physical_total, 16 * GIB);
    assert_eq!(l.uuid(), "GPU-test-0");
    let path = Ledger::path_for(&d, "GPU-test-0");
    let md = std::fs::metadata(&path).unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(md.permissions().mode() & 0o777, 0o666);
    assert_eq!(md.len() as usize, std::mem::size_of::<LedgerFile>());
    // A second handle sees the same memory.
    let l2 = Ledger::open(&path).unwrap();
    l.file().header.default_memsize.store(7, Ordering::Relaxed);
    assert_eq!(l2.file().header.default_memsize.load(Ordering::Relaxed), 7);
    assert_eq!(Ledger::list(&d), vec![path]);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn reserve_release_quota() {
    let d = tmpdir("quota");
    let l = open(&d);
    let m = l.join(&req("c1", 3 * GIB)).unwrap();
    assert!(l.try_reserve(&m, 2 * GIB).is_ok());
    assert!(l.try_reserve(&m, GIB).is_ok());
    let e = l.try_reserve(&m, 1).unwrap_err();
    assert_eq!(
        e,
        QuotaExceeded {
            quota: 3 * GIB,
            used: 3 * GIB,
            requested: 1
        }
    );
    let c = &l.file().containers[m.container];
    assert_eq!(c.oom_count.load(Ordering::Relaxed), 1);
    assert_eq!(c.peak.load(Ordering::Relaxed), 3 * GIB);
    l.release(&m, GIB);
    assert_eq!(c.used.load(Ordering::Relaxed), 2 * GIB);
    assert_eq!(
        l.file().processes[m.process].used.load(Ordering::Relaxed),
        2 * GIB
    );
    // Releasing more than held clamps, never wraps.
    l.release(&m, 10 * GIB);
    assert_eq!(c.used.load(Ordering::Relaxed), 0);
    assert_eq!(
        l.file().processes[m.process].used.load(Ordering::Relaxed),
        0
    );
    assert_eq!(
        l.file().processes[m.process]
            .pending
            .load(Ordering::Relaxed),
        0
    );
    // Quota lowered below what is held: refuses, never wraps.
    l.try_reserve(&m, 2 * GIB).unwrap();
    l.set_memsize(m.container, GIB).unwrap();
    assert!(l.try_reserve(&m, 1).is_err());
    assert_eq!(l.container_of(&m).free_bytes(), Some(0), "never wraps");
    assert_eq!(l.process_of(&m).used.load(Ordering::Relaxed), 2 * GIB);
    let snap = l.snapshot();
    assert_eq!(snap.containers[0].used, 2 * GIB);
    assert_eq!(snap.containers[0].quota, GIB);
    assert_eq!(snap.processes[0].used, 2 * GIB);
    assert!(snap.processes[0].alive);
    l.release(&m, 2 * GIB);
    assert!(l.try_reserve(&m, GIB).is_ok());
    l.leave(m);
    assert_eq!(
        l.containers().count(),
        0,
        "last process gone: container freed"
    );
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn enforce_off_and_unlimited_record_only() {
    let d = tmpdir("off");
    let l = open(&d);
    let mut r = req("off", GIB);
    r.enforce_off = true;
    let m = l.join(&r).unwrap();
    l.try_reserve(&m, 5 * GIB).unwrap();
    assert_eq!(
        l.file().containers[m.container]
            .used
            .load(Ordering::Relaxed),
        5 * GIB
    );
    assert_eq!(l.container_of(&m).free_bytes(), None);
    let m2 = l.join(&req("unl", QUOTA_UNLIMITED)).unwrap();
    assert_eq!(
        l.file().containers[m2.container]
            .quota
            .load(Ordering::Relaxed),
        0
    );
    l.try_reserve(&m2, 100 * GIB).unwrap();
    // No quota set: default_memsize applies.
    l.set_default_memsize(2 * GIB).unwrap();
    let m3 = l.join(&req("dflt", 0)).unwrap();
    assert_eq!(
        l.file().containers[m3.container]
            .quota
            .load(Ordering::Relaxed),
        2 * GIB
    );
    assert!(l.try_reserve(&m3, 3 * GIB).is_err());
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn same_container_shares_quota_first_joiner_wins() {
    let d = tmpdir("share");
    let l = open(&d);
    let a = l.join(&req("pod", 2 * GIB)).unwrap();
    let b = l.join(&req("pod", 8 * GIB)).unwrap();
    assert_eq!(a.container, b.container);
    assert_ne!(a.process, b.process);
    let c = &l.file().containers[a.container];
    assert_eq!(c.quota.load(Ordering::Relaxed), 2 * GIB);
    assert_eq!(c.nprocs.load(Ordering::Relaxed), 2);
    l.try_reserve(&a, GIB).unwrap();
    l.try_reserve(&b, GIB).unwrap();
    assert!(l.try_reserve(&b, 1).is_err());
    assert!(l.is_alive(a.process) && l.is_alive(b.process));
    l.leave(a);
    assert_eq!(c.used.load(Ordering::Relaxed), GIB);
    assert_eq!(c.nprocs.load(Ordering::Relaxed), 1);
    assert_eq!(l.containers().count(), 1);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn weights_free_weight_and_policy_switch() {
    let d = tmpdir("weight");
    let l = open(&d);
    l.set_max_inst(4).unwrap();
    let mut r = req("w3", 0);
    r.weight = 3;
    let a = l.join(&r).unwrap();
    assert_eq!(free_weight(l.file()), 1);
    assert_eq!(
        l.file().header.policy.load(Ordering::Relaxed),
        2,
        "weight > 1 switches to 2"
    );
    let mut r = req("w2", 0);
    r.weight = 2;
    let b = l.join(&r).unwrap();
    assert_eq!(
        l.file().containers[b.container]
            .weight
            .load(Ordering::Relaxed),
        1,
        "clamped to free"
    );
    assert_eq!(free_weight(l.file()), 0);
    let c = l.join(&req("late", 0)).unwrap();
    assert_eq!(
        l.file().containers[c.container]
            .weight
            .load(Ordering::Relaxed),
        0
    );
    l.leave(a);
    assert_eq!(free_weight(l.file()), 3);
    // Explicit policy sticks.
    l.set_policy(1).unwrap();
    let mut r = req("w2b", 0);
    r.weight = 2;
    l.join(&r).unwrap();
    assert_eq!(l.file().header.policy.load(Ordering::Relaxed), 1);
    assert!(l.set_policy(6).is_err());
    assert!(l.set_max_inst(0).is_err() && l.set_max_inst(26).is_err());
    assert!(l.set_prio_ratio(19).is_err() && l.set_prio_ratio(100).is_err());
    assert!(l.set_prio_ratio(99).is_ok());
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn corrupt_version_and_unwritable() {
    let d = tmpdir("bad");
    let path = Ledger::path_for(&d, "GPU-test-0");
    let size = std::mem::size_of::<LedgerFile>();

    // Wrong version: an error, and the file is left alone.
    {
        let l = open(&d);
        drop(l);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[8..12].copy_from_slice(&7u32.to_le_bytes());
        std::fs::write(&path, &bytes).unwrap();
        match Ledger::open_or_create(&d, "GPU-test-0", 0, 0) {
            Err(LedgerError::Version { found: 7, .. }) => {}
            other => panic!("expected Version, got {other:?}"),
        }
        assert_eq!(std::fs::read(&path).unwrap(), bytes, "never rewritten");
        let msg = Ledger::open(&path).unwrap_err().to_string();
        assert!(msg.contains("version 7"), "{msg}");
    }

    // Garbage, even while a live process holds a lock on it (or has it
    // mapped): nobody can use it, so the next generation is built beside
    // it (never renamed: in a sticky directory only its owner could), and
    // its users notice and move to the new file (see `Account`).
    std::fs::write(&path, vec![0xAB; size]).unwrap();
    let holder = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    {
        use std::os::fd::AsRawFd;
        // SAFETY: zeroed flock is valid; the fd is open.
        let mut fl: libc::flock = unsafe { std::mem::zeroed() };
        fl.l_type = libc::F_WRLCK as _;
        fl.l_start = 100;
        fl.l_len = 10;
        // SAFETY: valid fd and flock.
        assert_eq!(
            unsafe { libc::fcntl(holder.as_raw_fd(), libc::F_OFD_SETLK, &fl) },
            0
        );
    }
    assert!(matches!(
        Ledger::open(&path),
        Err(LedgerError::Corrupt { .. })
    ));
    let l = open(&d);
    assert_eq!(l.file().header.magic, LEDGER_MAGIC);
    let g1 = d.join("GPU-test-0.g1.ledger");
    assert_eq!(l.path(), g1);
    assert_eq!(Ledger::live_path(&d, "GPU-test-0"), g1);
    assert_eq!(
        Ledger::list(&d),
        vec![g1.clone()],
        "only the live generation is listed"
    );
    drop(l);
    drop(holder);
    std::fs::remove_file(&g1).unwrap();

    // Truncated file: Corrupt from open().
    std::fs::write(&path, b"CGPULEDG").unwrap();
    assert!(matches!(
        Ledger::open(&path),
        Err(LedgerError::Corrupt { .. })
    ));

    // A path under a regular file can never be created, root or not.
    let file_as_dir = d.join("plainfile");
    std::fs::write(&file_as_dir, b"x").unwrap();
    match Ledger::open_or_create(&file_as_dir, "GPU-x", 0, 0) {
        Err(e @ LedgerError::Io { .. }) => assert!(e.to_string().contains("plainfile")),
        other => panic!("expected Io, got {other:?}"),
    }
    let _ = std::fs::remove_dir_all(&d);
}

/// A directory the process may not write: `LedgerError::Io`. Root may
/// write anywhere, so as root (how CI runs) the test runs itself again in a
/// user namespace where it is not root (`unshare -U`); it never skips.
#[test]
fn unwritable_directory_is_an_io_error() {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if let Ok(ro) = std::env::var("CGPU_TEST_UNWRITABLE_DIR") {
        assert!(!root, "the re-run must not be root");
        match Ledger::open_or_create(Path::new(&ro), "GPU-x", 0, 0) {
            Err(e @ LedgerError::Io { .. }) => assert!(e.to_string().contains("ro"), "{e}"),
            other => panic!("expected Io, got {other:?}"),
        }
        return;
    }
    let d = tmpdir("unwritable");
    let ro = d.join("ro");
    std::fs::create_dir(&ro).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).unwrap();
    if !root {
        assert!(matches!(
            Ledger::open_or_create(&ro, "GPU-x", 0, 0),
            Err(LedgerError::Io { .. })
        ));
    } else {
        let exe = std::env::current_exe().unwrap();
        let o = std::process::Command::new("unshare")
            .args(["-U", "--"])
            .arg(exe)
            .args([
                "--exact",
                "unwritable_directory_is_an_io_error",
                "--nocapture",
            ])
            .env("CGPU_TEST_UNWRITABLE_DIR", &ro)
            .output()
            .expect("run unshare");
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success() && out.contains("1 passed"),
            "as root, this test re-runs itself unprivileged in a user namespace (unshare -U); that failed: {o:?}"
        );
    }
    let _ = std::fs::remove_dir_all(&d);
}

/// Tools run as root over a shared directory: a `*.ledger` that is a
/// symbolic link, a FIFO or a device node is never listed, followed or
/// opened (`open` refuses without blocking).
#[test]
fn links_fifos_and_devices_are_never_opened() {
    let d = tmpdir("nonregular");
    let real = open(&d);
    let target = Ledger::path_for(&d, "GPU-test-0");
    std::os::unix::fs::symlink(&target, d.join("GPU-link.ledger")).unwrap();
    let fifo = d.join("GPU-fifo.ledger");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: valid path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o666) }, 0);
    let listed = Ledger::list(&d);
    assert_eq!(listed, vec![target.clone()], "only the regular file");
    for p in [d.join("GPU-link.ledger"), fifo] {
        let t0 = std::time::Instant::now();
        let e = Ledger::open(&p).unwrap_err().to_string();
        assert!(e.contains("not a regular file"), "{e}");
        assert!(t0.elapsed() < std::time::Duration::from_secs(1));
    }
    drop(real);
    let _ = std::fs::remove_dir_all(&d);
}

/// A tool (or job) has a ledger mapped and the file is truncated under
/// it: reading it faults, the SIGBUS guard swaps in private memory, the
/// reader survives and sees the ledger as damaged (so it reports, never
/// trusts it). Without the guard this test dies of SIGBUS.
#[test]
fn truncated_under_a_reader_is_damaged_not_fatal() {
    let d = tmpdir("truncated-reader");
    let l = open(&d);
    let m = l.join(&req("t", GIB)).unwrap();
    l.try_reserve(&m, 4096).unwrap();
    assert!(!l.is_damaged());
    std::fs::OpenOptions::new()
        .write(true)
        .open(Ledger::path_for(&d, "GPU-test-0"))
        .unwrap()
        .set_len(0)
        .unwrap();
    // Touch every page (as a snapshot does): each faults, none kills.
    let snap = l.snapshot();
    assert!(l.is_damaged());
    assert_eq!(snap.containers.len(), 0, "a wiped picture, not the old one");
    assert!(!l.membership_intact(&m));
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn threads_race_one_process() {
    let d = tmpdir("threads");
    let l = open(&d);
    let quota = 1000u64;
    let m = l.join(&req("t", quota)).unwrap();
    let max_seen = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let (l, m, max_seen) = (&l, &m, &max_seen);
            s.spawn(move || {
                let mut held = Vec::new();
                let mut x = t + 1;
                for _ in 0..20000 {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let sz = (x >> 33) % 97 + 1;
                    if x & 1 == 0 && l.try_reserve(m, sz).is_ok() {
                        held.push(sz);
                    } else if let Some(b) = held.pop() {
                        l.release(m, b);
                    }
                    let u = l.file().containers[m.container]
                        .used
                        .load(Ordering::Relaxed);
                    max_seen.fetch_max(u, Ordering::Relaxed);
                }
                for b in held {
                    l.release(m, b);
                }
            });
        }
    });
    assert!(max_seen.load(Ordering::Relaxed) <= quota);
    assert_eq!(
        l.file().containers[m.container]
            .used
            .load(Ordering::Relaxed),
        0
    );
    let _ = std::fs::remove_dir_all(&d);
}

/// A process that dies mid-operation leaves `pending` set; whether its CAS
/// on the container happened is unknowable from its slot. The reap keeps
/// the bytes counted (never under-counts), then recounts exactly. Each
/// handle has its own lock descriptions, so dropping one is a death.
#[test]
fn death_mid_operation_is_recounted_exactly() {
    let d = tmpdir("midop");
    let survivor = open(&d);
    let m = survivor.join(&req("pod", 10 * GIB)).unwrap();
    survivor.try_reserve(&m, GIB).unwrap();
    let c = &survivor.file().containers[m.container];
    // (a) died after the container CAS, before moving pending to used;
    // (b) died after setting pending, before the CAS;
    // (c) died in release after the process slot gave bytes back, before the container.
    for (case, cas_done) in [("a", true), ("b", false), ("c", true)] {
        let victim = open(&d);
        let vm = victim.join(&req("pod", 0)).unwrap();
        victim.try_reserve(&vm, 3 * GIB).unwrap();
        let p = &victim.file().processes[vm.process];
        let x = 2 * GIB;
        p.pending.fetch_add(x, Ordering::SeqCst);
        match case {
            "c" => {
                p.used.fetch_sub(x, Ordering::SeqCst); // slot gave back, container not yet
            }
            _ if cas_done => {
                c.used.fetch_add(x, Ordering::SeqCst);
            }
            _ => {}
        }
        let before = c.used.load(Ordering::SeqCst);
        drop(victim); // its liveness lock goes: dead
        wait_dead(&survivor, vm.process);
        assert_eq!(survivor.reap(), 1, "case {case}");
        assert_eq!(
            c.used.load(Ordering::SeqCst),
            GIB,
            "case {case}: whole again, exactly"
        );
        assert_eq!(c.suspect.load(Ordering::SeqCst), 0);
        assert!(before >= GIB);
        assert_eq!(c.nprocs.load(Ordering::SeqCst), 1);
    }
    assert_eq!(c.recounts.load(Ordering::SeqCst), 3);
    // The survivor still works normally.
    survivor.try_reserve(&m, 9 * GIB).unwrap();
    assert!(survivor.try_reserve(&m, 1).is_err());
    let _ = std::fs::remove_dir_all(&d);
}

/// While a live process has an operation in flight the recount waits (the
/// bytes stay counted: safe), and happens at the next quiet reap.
#[test]
fn recount_postponed_while_busy() {
    let d = tmpdir("busy");
    let a = open(&d);
    let m = a.join(&req("pod", 0)).unwrap();
    a.try_reserve(&m, 100).unwrap();
    let c = &a.file().containers[m.container];
    let victim = open(&d);
    let vm = victim.join(&req("pod", 0)).unwrap();
    victim.file().processes[vm.process]
        .pending
        .store(50, Ordering::SeqCst);
    c.used.fetch_add(50, Ordering::SeqCst);
    drop(victim);
    wait_dead(&a, vm.process);
    // The survivor looks busy (in-flight op).
    a.file().processes[m.process]
        .pending
        .store(7, Ordering::SeqCst);
    assert_eq!(a.reap(), 1);
    assert_eq!(
        c.used.load(Ordering::SeqCst),
        150,
        "kept counted while busy"
    );
    assert_eq!(c.suspect.load(Ordering::SeqCst), 50);
    a.file().processes[m.process]
        .pending
        .store(0, Ordering::SeqCst);
    assert_eq!(a.maybe_reap(std::time::Duration::ZERO), 0);
    assert_eq!(c.used.load(Ordering::SeqCst), 100, "recounted once quiet");
    assert_eq!(c.suspect.load(Ordering::SeqCst), 0);
    let _ = std::fs::remove_dir_all(&d);
}

/// A process killed inside a reap (leaving: its own slot just freed, the
/// container's `nprocs` not yet recounted) leaves `nprocs` one too high;
/// the next reap by anyone corrects it.
#[test]
fn stale_nprocs_from_a_death_inside_a_reap_is_recounted() {
    let d = tmpdir("stale-nprocs");
    let a = open(&d);
    let m = a.join(&req("pod", 0)).unwrap();
    let b = open(&d);
    let mb = b.join(&req("pod", 0)).unwrap();
    let c = &a.file().containers[m.container];
    assert_eq!(c.nprocs.load(Ordering::SeqCst), 2);
    // b's slot freed (as `reap_locked` does), then b dies before the recount.
    b.file().processes[mb.process]
        .state
        .store(SLOT_FREE, Ordering::SeqCst);
    drop(b);
    assert_eq!(c.nprocs.load(Ordering::SeqCst), 2, "stale");
    assert_eq!(a.reap(), 0, "no slot to free");
    assert_eq!(c.nprocs.load(Ordering::SeqCst), 1, "recounted");
    assert_eq!(a.snapshot().containers[0].nprocs, 1);
    assert!(a.leave(&m));
    assert_eq!(a.find_container("pod"), None);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn set_weight_respects_free_weight() {
    let d = tmpdir("setweight");
    let l = open(&d);
    l.set_max_inst(4).unwrap();
    let a = l.join(&req("a", 0)).unwrap();
    let b = l.join(&req("b", 0)).unwrap();
    assert_eq!(free_weight(l.file()), 2);
    assert_eq!(
        l.file().header.policy.load(Ordering::Relaxed),
        DEFAULT_POLICY
    );
    assert!(l.set_weight(a.container, 3).is_ok(), "1 own + 2 free");
    assert_eq!(free_weight(l.file()), 0);
    let e = l.set_weight(b.container, 2).unwrap_err();
    assert!(e.contains("max_inst"), "{e}");
    assert!(l.set_weight(b.container, 0).is_ok());
    assert!(l.set_weight(a.container, 4).is_ok());
    assert!(l.set_weight(a.container, 5).is_err());
    assert!(l.set_weight(31, 1).is_err(), "no live container there");
    assert_eq!(
        l.file().header.policy.load(Ordering::Relaxed),
        2,
        "weight > 1 switched policy"
    );
    let g = l.file().header.knob_generation.load(Ordering::Relaxed);
    l.set_highprio(a.container, true).unwrap();
    assert!(l.file().header.knob_generation.load(Ordering::Relaxed) > g);
    let _ = std::fs::remove_dir_all(&d);
}

/// Two operators (two open file descriptions, as two `cgpuctl` processes)
/// raise two containers' weights at the same instant: each write alone
/// fits, both together would pass `max_inst`. `set_weight` sleeps between
/// its check and its write (test hook) so that the two really overlap.
/// Check and write happen under the table lock: exactly one wins each
/// round, and the sum never passes `max_inst`.
#[test]
fn set_weight_from_two_operators_never_passes_max_inst() {
    let d = tmpdir("setweight-race");
    let l = open(&d);
    l.set_max_inst(16).unwrap();
    let a = l.join(&req("a", 0)).unwrap();
    let b = l.join(&req("b", 0)).unwrap();
    let path = Ledger::path_for(&d, "GPU-test-0");
    TEST_SET_WEIGHT_PAUSE_MS.store(20, Ordering::Relaxed);
    for round in 0..5 {
        let go = std::sync::Barrier::new(2);
        let wins: Vec<bool> = std::thread::scope(|s| {
            let hs: Vec<_> = [a.container, b.container]
                .into_iter()
                .map(|c| {
                    let (path, go) = (&path, &go);
                    s.spawn(move || {
                        let op = Ledger::open(path).unwrap();
                        go.wait();
                        op.set_weight(c, 15).is_ok()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let f = l.file();
        let sum = f.containers[a.container].weight.load(Ordering::Acquire)
            + f.containers[b.container].weight.load(Ordering::Acquire);
        assert!(
            sum <= 16,
            "round {round}: weights sum to {sum} > max_inst 16"
        );
        assert_eq!(
            wins.iter().filter(|w| **w).count(),
            1,
            "round {round}: {wins:?}"
        );
        l.set_weight(a.container, 1).unwrap();
        l.set_weight(b.container, 1).unwrap();
    }
    TEST_SET_WEIGHT_PAUSE_MS.store(0, Ordering::Relaxed);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn full_tables_and_missing_file() {
    let d = tmpdir("full");
    let l = open(&d);
    let ids: Vec<String> = (0..MAX_CONTAINERS + 1).map(|i| format!("c{i}")).collect();
    let mut ms = Vec::new();
    for id in &ids[..MAX_CONTAINERS] {
        ms.push(l.join(&req(id, 0)).unwrap());
    }
    match l.join(&req(&ids[MAX_CONTAINERS], 0)) {
        Err(LedgerError::Full {
            what: "container", ..
        }) => {}
        other => panic!("expected Full(container), got {other:?}"),
    }
    for _ in MAX_CONTAINERS..MAX_PROCESSES {
        ms.push(l.join(&req("c0", 0)).unwrap());
    }
    match l.join(&req("c1", 0)) {
        Err(LedgerError::Full {
            what: "process", ..
        }) => {}
        other => panic!("expected Full(process), got {other:?}"),
    }
    assert_eq!(
        l.containers().count(),
        MAX_CONTAINERS,
        "nothing half-claimed left"
    );
    // Bad ids are refused clearly.
    assert!(l.join(&req("", 0)).is_err());
    assert!(l.join(&req(&"x".repeat(ID_LEN + 1), 0)).is_err());
    for m in ms {
        l.leave(m);
    }
    assert_eq!(l.containers().count(), 0);
    assert_eq!(l.snapshot().processes.len(), 0);
    match Ledger::open(&d.join("absent.ledger")) {
        Err(LedgerError::Io { err, .. }) => assert_eq!(err.kind(), std::io::ErrorKind::NotFound),
        other => panic!("expected Io(NotFound), got {other:?}"),
    }
    let _ = std::fs::remove_dir_all(&d);
}

/// The table of shared allocations: an import of a live exporter of the
/// container is paid by the exporter; when the exporter leaves or dies
/// (its handle dropped: the kernel drops its locks), the extent passes on
/// to the importer, whose release gives it back; an import released first
/// passes nothing on. Two handles of one process stand for two processes
/// (each has its own open file descriptions, hence its own locks).
#[test]
fn shared_allocations_pass_on_to_the_importer() {
    let d = tmpdir("shared");
    let pid = std::process::id() as i32;
    const MIB: u64 = 1 << 20;
    let used = |l: &Ledger, m: &Membership| {
        (
            l.container_of(m).used.load(Ordering::Acquire),
            l.process_of(m).used.load(Ordering::Acquire),
        )
    };
    for (how, released_first) in [("leave", false), ("death", false), ("death", true)] {
        let exp = open(&d);
        let me = exp.join(&req("c", 2 * GIB)).unwrap();
        exp.try_reserve(&me, 800 * MIB).unwrap();
        let imp = open(&d);
        let mi = imp.join(&req("c", 2 * GIB)).unwrap();
        assert_eq!(
            imp.share_register(&mi, pid + 1_000_000).unwrap(),
            None,
            "no such process"
        );
        let e = imp
            .share_register(&mi, pid)
            .unwrap()
            .expect("the exporter is live");
        assert_eq!(imp.share_grow(&mi, e, 500 * MIB), SharePayer::Exporter);
        assert_eq!(imp.share_grow(&mi, e, 800 * MIB), SharePayer::Exporter);
        assert_eq!(imp.share_grow(&mi, e, 600 * MIB), SharePayer::Exporter);
        assert_eq!(used(&imp, &mi), (800 * MIB, 0), "once, the exporter's");
        assert_eq!(imp.shared_allocations(), vec![(pid, pid, 800 * MIB, false)]);
        if released_first {
            assert_eq!(imp.share_release(&mi, e), 0);
        }
        match how {
            "leave" => assert!(exp.leave(&me)),
            _ => {
                drop(exp);
                wait_dead(&imp, me.process);
                assert_eq!(imp.reap(), 1);
            }
        }
        if released_first {
            assert_eq!(used(&imp, &mi), (0, 0));
            assert!(imp.shared_allocations().is_empty());
        } else {
            assert_eq!(used(&imp, &mi), (800 * MIB, 800 * MIB), "{how}: passed on");
            assert_eq!(imp.shared_allocations(), vec![(pid, pid, 800 * MIB, true)]);
            assert_eq!(
                imp.share_grow(&mi, e, 900 * MIB),
                SharePayer::Importer(800 * MIB)
            );
            assert_eq!(imp.share_release(&mi, e), 800 * MIB);
            assert_eq!(imp.share_release(&mi, e), 0, "once");
            assert_eq!(used(&imp, &mi), (0, 0));
        }
        assert!(imp.leave(&mi));
        let l = open(&d);
        assert_eq!(l.find_container("c"), None, "{how}: nothing left behind");
        assert!(l
            .file()
            .shared
            .iter()
            .all(|s| s.state.load(Ordering::Acquire) == SLOT_FREE));
    }
    let _ = std::fs::remove_dir_all(&d);
}

/// The importer maps more and lets go while its exporter dies and is
/// reaped, at every moment relative to the pass-on: whichever comes first,
/// the extent passed on is the one recorded, counted once and given back
/// once (container and importer end at 0).
#[test]
fn shared_release_racing_the_pass_on_counts_once() {
    let d = tmpdir("shared-race");
    let pid = std::process::id() as i32;
    const B: u64 = 64 << 20;
    let imp = open(&d);
    let mi = imp.join(&req("r", 0)).unwrap();
    // Passed on before the growth, between growth and release, after the release.
    let mut seen = [0u32; 3];
    for round in 0..300u32 {
        let exp = open(&d);
        let me = exp.join(&req("r", 0)).unwrap();
        exp.try_reserve(&me, B).unwrap();
        let e = imp.share_register(&mi, pid).unwrap().unwrap();
        assert_eq!(imp.share_grow(&mi, e, B), SharePayer::Exporter);
        // Both sides start together, each after a spin that varies by round.
        let (spin, lead) = ((round * 7919) % 100_000, (round * 104_729) % 100_000);
        let go = std::sync::Barrier::new(2);
        let gave = std::thread::scope(|s| {
            let t = s.spawn(|| {
                go.wait();
                for _ in 0..spin {
                    std::hint::spin_loop();
                }
                // Maps more while the exporter may be going, then lets go.
                let g = imp.share_grow(&mi, e, 2 * B);
                for _ in 0..spin / 2 {
                    std::hint::spin_loop();
                }
                let r = imp.share_release(&mi, e);
                match g {
                    SharePayer::Importer(x) => assert_eq!((x, r), (B, B), "passed on first"),
                    SharePayer::Exporter => assert!(r == 0 || r == 2 * B, "{r}"),
                }
                (g, r)
            });
            go.wait();
            for _ in 0..lead {
                std::hint::spin_loop();
            }
            drop(exp);
            imp.reap();
            t.join().unwrap()
        });
        // Another test's child between fork and exec holds the exporter's
        // descriptions (and locks) for a moment: reap until it is gone.
        let t0 = std::time::Instant::now();
        while imp.processes_of(mi.container).count() > 1 {
            assert!(
                t0.elapsed().as_secs() < 10,
                "round {round}: exporter never reaped"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
            imp.reap();
        }
        match gave {
            (SharePayer::Importer(_), _) => seen[0] += 1,
            (_, 0) => seen[2] += 1,
            _ => seen[1] += 1,
        }
        let c = imp.container_of(&mi).used.load(Ordering::Acquire);
        let p = imp.process_of(&mi).used.load(Ordering::Acquire);
        assert_eq!((c, p), (0, 0), "round {round}");
    }
    eprintln!(
        "passed on before the growth {}, between growth and release {}, after the release {}",
        seen[0], seen[1], seen[2]
    );
    assert!(imp.leave(&mi));
    let _ = std::fs::remove_dir_all(&d);
}
