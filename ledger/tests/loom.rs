//! Model checks of the shared-memory protocol with loom: every
//! interleaving (up to a bound on preemptions) of the threads below, over
//! the real steps of the quota (`cgpu_ledger::books`) and of the
//! scheduler's token (`cgpu_ledger::words::transition`). Threads stand for
//! processes: they share nothing but the slots' atomics. A process's
//! death is a thread that stops at one of the protocol's death points
//! (each in turn), after which the reaper must put the books right.
//!
//! Run: `RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom cargo test -p cgpu-ledger --release --test loom`.
#![cfg(loom)]

use cgpu_ledger::books;
use cgpu_ledger::sync::model::{die_after, enter, mortal, passed};
use cgpu_ledger::sync::{AtomicU64, Ordering::SeqCst};
use cgpu_ledger::words::transition::{self, Renew, Renewal};
use cgpu_ledger::words::{Token, DECIDING, DRAINING, RUNNING};
use cgpu_ledger::{ContainerSlot, Membership, ProcessSlot};
use loom::sync::Arc;
use loom::thread;

/// Preemptions explored per execution (`LOOM_MAX_PREEMPTIONS` overrides):
/// every race of one step against another thread's, and of two steps
/// against a third's, in seconds on a small machine.
const PREEMPTIONS: usize = 2;

fn check(f: impl Fn() + Sync + Send + 'static) {
    check_within(PREEMPTIONS, f)
}

/// [`check`] with `bound` preemptions (the token's models are small:
/// every race of three steps of one thread against another's).
fn check_within(bound: usize, f: impl Fn() + Sync + Send + 'static) {
    let mut b = loom::model::Builder::new();
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(bound);
    }
    b.check(f);
}

/// One container of quota `quota` and its processes (slot `i` of
/// `procs` is process slot `i`).
struct Books {
    c: ContainerSlot,
    p: Vec<ProcessSlot>,
    m: Vec<Membership>,
}

impl Books {
    fn new(quota: u64, procs: usize) -> Arc<Books> {
        Arc::new(Books {
            c: ContainerSlot::model(quota),
            p: (0..procs).map(|_| ProcessSlot::model(0)).collect(),
            m: (0..procs).map(|i| Membership::model(0, i)).collect(),
        })
    }
    /// Process `i` already holds `bytes`.
    fn hold(&self, i: usize, bytes: u64) {
        books::register_held(&self.m[i], &self.c, &self.p[i], bytes);
    }
    fn reserve(&self, i: usize, bytes: u64) -> bool {
        books::reserve(&self.m[i], &self.c, &self.p[i], bytes).is_ok()
    }
    fn release(&self, i: usize, bytes: u64) {
        books::release(&self.m[i], &self.c, &self.p[i], bytes);
    }
    fn used(&self) -> u64 {
        self.c.used.load(SeqCst)
    }
    fn held(&self, i: usize) -> u64 {
        self.p[i].used.load(SeqCst)
    }
    /// The reaper, under the table lock: a recount over the processes in
    /// `live` (one look, or `tries`).
    fn recount(&self, live: &[usize], tries: u32) -> Option<(u64, u64)> {
        books::recount(&self.c, || live.iter().map(|&i| &self.p[i]), tries)
    }
    /// Quiet now (every thread joined): the next reap's recount must make
    /// the books exact, and they must be within the quota.
    fn settle(&self, live: &[usize], quota: u64) {
        if self.c.suspect.load(SeqCst) != 0 {
            assert!(
                self.recount(live, 1).is_some(),
                "a quiet container recounts"
            );
        }
        let sum: u64 = live.iter().map(|&i| self.held(i)).sum();
        assert_eq!(self.used(), sum, "container counts what its processes hold");
        assert_eq!(self.c.suspect.load(SeqCst), 0);
        for &i in live {
            assert_eq!(self.p[i].pending.load(SeqCst), 0);
        }
        assert!(
            self.used() <= quota,
            "used {} over quota {quota}",
            self.used()
        );
    }
}

/// A process that died mid-step left 4 bytes counted on the container
/// (`suspect`); two processes reserve 5 each under a quota of 10 while
/// the reaper recounts. Neither grant may pass the quota, the leftover
/// may refuse one of them but never be counted twice or lost.
#[test]
fn two_reservers_and_a_reaper() {
    check(|| {
        let b = Books::new(10, 3);
        b.hold(2, 4);
        books::reap_process(&b.c, &b.p[2]); // its bytes stay: died with 4 in flight
        b.c.used.fetch_add(4, SeqCst);
        b.c.suspect.fetch_add(4, SeqCst);
        let r: Vec<_> = (0..2)
            .map(|i| {
                let b = b.clone();
                thread::spawn(move || b.reserve(i, 5))
            })
            .collect();
        let reaper = {
            let b = b.clone();
            thread::spawn(move || b.recount(&[0, 1], 1))
        };
        let got: Vec<bool> = r.into_iter().map(|h| h.join().unwrap()).collect();
        let recounted = reaper.join().unwrap();
        assert!(got[0] || got[1], "with 6 of 10 free one of the two fits");
        for (i, g) in got.iter().enumerate() {
            assert_eq!(b.held(i), if *g { 5 } else { 0 });
        }
        let left = if b.c.suspect.load(SeqCst) == 0 { 0 } else { 4 };
        assert_eq!(recounted.is_some(), left == 0);
        assert_eq!(b.used(), b.held(0) + b.held(1) + left);
        assert!(b.used() <= 10);
        b.settle(&[0, 1], 10);
    });
}

/// One process gives back what it holds while another reserves and the
/// reaper recounts: the release frees room exactly once.
#[test]
fn a_releaser_a_reserver_and_a_reaper() {
    check(|| {
        let b = Books::new(10, 2);
        b.hold(0, 6);
        b.c.used.fetch_add(2, SeqCst); // left by a process that died mid-step
        b.c.suspect.fetch_add(2, SeqCst);
        let rel = {
            let b = b.clone();
            thread::spawn(move || b.release(0, 6))
        };
        let res = {
            let b = b.clone();
            thread::spawn(move || b.reserve(1, 5))
        };
        let reaper = {
            let b = b.clone();
            thread::spawn(move || b.recount(&[0, 1], 1))
        };
        rel.join().unwrap();
        let got = res.join().unwrap();
        reaper.join().unwrap();
        assert_eq!(b.held(0), 0);
        assert_eq!(b.held(1), if got { 5 } else { 0 });
        b.settle(&[0, 1], 10);
    });
}

/// Run `step` on process 0 dying at each death point in turn, beside
/// process 1 reserving `other` bytes `times` times (so that a count the
/// reaper left too low would let it pass the quota); the reaper waits for the death
/// (the kernel drops the liveness lock), reaps process 0's slot and
/// recounts, as `reap_locked` does, while process 1 goes on.
fn die_at_each_point(
    name: &str,
    quota: u64,
    setup: fn(&Books),
    step: fn(&Books),
    (other, times): (u64, u32),
) -> u32 {
    let mut points = 0;
    for k in 0.. {
        let survived = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let max_passed = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
        {
            let (survived, max_passed) = (survived.clone(), max_passed.clone());
            check(move || {
                let b = Books::new(quota, 2);
                setup(&b);
                let dying = {
                    let b = b.clone();
                    thread::spawn(move || {
                        die_after(k);
                        let r = mortal(|| step(&b));
                        (r.is_some(), passed())
                    })
                };
                let other_t = {
                    let b = b.clone();
                    thread::spawn(move || (0..times).filter(|_| b.reserve(1, other)).count() as u64)
                };
                let reaper = {
                    let b = b.clone();
                    thread::spawn(move || {
                        let (lived, n) = dying.join().unwrap();
                        books::reap_process(&b.c, &b.p[0]);
                        b.p[0].state.store(cgpu_ledger::SLOT_FREE, SeqCst);
                        if b.c.suspect.load(SeqCst) != 0 {
                            b.recount(&[1], 1);
                        }
                        (lived, n)
                    })
                };
                let got = other_t.join().unwrap();
                let (lived, n) = reaper.join().unwrap();
                if lived {
                    survived.store(true, std::sync::atomic::Ordering::Relaxed);
                }
                max_passed.fetch_max(n, std::sync::atomic::Ordering::Relaxed);
                assert_eq!(b.held(1), got * other);
                b.settle(&[1], quota);
            });
        }
        points = k;
        if survived.load(std::sync::atomic::Ordering::Relaxed)
            && max_passed.load(std::sync::atomic::Ordering::Relaxed) <= k
        {
            break; // no execution reached a point past k: every point was tried
        }
    }
    eprintln!("{name}: a death at each of {points} points restored by the reaper");
    points
}

#[test]
fn death_in_reserve() {
    let n = die_at_each_point(
        "reserve",
        10,
        |_| {},
        |b| {
            b.reserve(0, 5);
        },
        (4, 1),
    );
    assert!(n >= 4);
}

#[test]
fn death_in_release() {
    let n = die_at_each_point("release", 10, |b| b.hold(0, 6), |b| b.release(0, 6), (4, 3));
    assert!(n >= 4);
}

#[test]
fn death_in_register_held() {
    let n = die_at_each_point(
        "register_held",
        10,
        |_| {},
        |b| books::register_held(&b.m[0], &b.c, &b.p[0], 7),
        (3, 1),
    );
    assert!(n >= 4);
}

#[test]
fn death_in_leave() {
    let n = die_at_each_point(
        "leave",
        10,
        |b| b.hold(0, 6),
        |b| {
            books::give_back_all(&b.c, &b.p[0]);
        },
        (4, 1),
    );
    assert!(n >= 4);
}

/// The reaper itself is killed at each point of its reap of a dead slot
/// (it held the table lock; the kernel drops it): the next reaper, finding
/// the slot still there, must still leave the books exact, while another
/// process of the container goes on reserving.
#[test]
fn reaper_dies_at_each_point() {
    for k in 0..4u32 {
        check(move || {
            let b = Books::new(10, 2);
            b.hold(0, 6); // process 0 died holding 6
            let other = {
                let b = b.clone();
                thread::spawn(move || b.reserve(1, 4))
            };
            let first = {
                let b = b.clone();
                thread::spawn(move || {
                    die_after(k);
                    mortal(|| books::reap_process(&b.c, &b.p[0]))
                })
            };
            let finished = first.join().unwrap().is_some();
            // The next reaper: the slot was not freed, so it reaps it again.
            books::reap_process(&b.c, &b.p[0]);
            if b.c.suspect.load(SeqCst) != 0 {
                b.recount(&[1], 1);
            }
            let got = other.join().unwrap();
            assert_eq!(b.held(1), if got { 4 } else { 0 });
            assert!(finished || k < 3);
            b.settle(&[1], 10);
        });
    }
}

/// A process leaves (`retire`, then its give-back) while another of its
/// threads reserves: the reservation is refused, or made and then given
/// back; never charged to a slot that was given up.
#[test]
fn leave_waits_for_a_reservation_in_flight() {
    check(|| {
        let b = Books::new(10, 1);
        let r = {
            let b = b.clone();
            thread::spawn(move || b.reserve(0, 5))
        };
        b.m[0].retire();
        books::give_back_all(&b.c, &b.p[0]);
        r.join().unwrap();
        assert_eq!(b.held(0), 0, "nothing charged after the give-back");
        assert_eq!(b.used(), 0);
    });
}

/// The watcher's repair of a process's own counter, while a thread of
/// the process reserves and then records what it holds (`truth`, as the
/// account does: inside its own entry): a count the reservation just
/// made must never be taken for damage and reset.
#[test]
fn repair_never_undoes_a_reservation() {
    check(|| {
        let b = Books::new(10, 1);
        let truth = Arc::new(AtomicU64::new(0));
        let r = {
            let (b, truth) = (b.clone(), truth.clone());
            thread::spawn(move || {
                let g = enter(&b.m[0]);
                if b.reserve(0, 5) {
                    truth.fetch_add(5, SeqCst);
                }
                drop(g);
            })
        };
        let fixed = books::repair_own(&b.m[0], &b.p[0], &truth, || false);
        r.join().unwrap();
        assert_eq!(fixed.flatten(), None, "nothing was damaged");
        assert_eq!(b.held(0), truth.load(SeqCst));
        assert_eq!(b.used(), 5);
    });
}

/// And it does put back a damaged counter when nothing is in flight.
#[test]
fn repair_puts_back_a_damaged_counter() {
    check(|| {
        let b = Books::new(10, 1);
        let truth = AtomicU64::new(0);
        assert!(b.reserve(0, 5));
        truth.store(5, SeqCst);
        b.p[0].used.store(1 << 40, SeqCst); // a stray write
        let fixed = books::repair_own(&b.m[0], &b.p[0], &truth, || false);
        assert_eq!(fixed, Some(Some((1 << 40, 5))));
        assert_eq!(b.held(0), 5);
    });
}

/// The exporter of memory another process of its container imported
/// (and mapped 4 bytes of) dies: the reaper passes the import on to the
/// importer, then takes the exporter's bytes off, while the importer lets
/// go of the import, or maps more of it. The bytes are counted once: on
/// the importer while it keeps them, on nobody once it let go.
#[test]
fn exporter_reaped_while_the_importer_lets_go_or_grows() {
    for grows in [false, true] {
        check(move || {
            let b = Books::new(16, 2);
            b.hold(0, 6); // the exporter's allocation
            let e = Arc::new(cgpu_ledger::SharedSlot::model(0, 1, 4));
            let importer = {
                let (b, e) = (b.clone(), e.clone());
                thread::spawn(move || {
                    if !grows {
                        e.release(&b.m[1], &b.c, &b.p[1]);
                        return 0;
                    }
                    // Mapped up to 6 now: while the exporter pays, recorded;
                    // once the importer bears the charge, it charges itself
                    // for what it maps beyond what was passed on.
                    match e.grow(6) {
                        cgpu_ledger::SharePayer::Exporter => 0,
                        cgpu_ledger::SharePayer::Importer(had) => {
                            assert!(b.reserve(1, 6 - had));
                            6 - had
                        }
                    }
                })
            };
            let reaper = {
                let (b, e) = (b.clone(), e.clone());
                thread::spawn(move || {
                    e.pass_on(&b.p[1], &b.c);
                    books::reap_process(&b.c, &b.p[0]);
                })
            };
            let own = importer.join().unwrap();
            reaper.join().unwrap();
            let w = e.bytes.load(SeqCst);
            if grows {
                assert_eq!(w & cgpu_ledger::SHARED_BORNE, cgpu_ledger::SHARED_BORNE);
                assert_eq!(
                    b.held(1),
                    6,
                    "the importer bears all it mapped ({own} charged itself)"
                );
            } else {
                assert_eq!(b.held(1), 0, "let go: nobody pays");
            }
            b.settle(&[1], 16);
        });
    }
}

// ---- The scheduler's token ----

fn token(w: &AtomicU64) -> Token {
    Token::unpack(w.load(SeqCst))
}

/// The slice of container 0 ended (DRAINING): two waiting processes (slots
/// 1 and 2) decide at once. One decision, one grant, one charge.
#[test]
fn two_deciders() {
    check_within(3, || {
        let t = Token::unpack(0).next(DRAINING, Some(0), None);
        let w = Arc::new(AtomicU64::new(t.pack()));
        let chose = Arc::new(AtomicU64::new(0));
        let hs: Vec<_> = [1usize, 2]
            .into_iter()
            .map(|me| {
                let (w, chose) = (w.clone(), chose.clone());
                thread::spawn(move || {
                    transition::decide(&w, t, me, |mine| {
                        chose.fetch_add(1, SeqCst);
                        mine.next(RUNNING, Some(me), None)
                    })
                })
            })
            .collect();
        let r: Vec<_> = hs.into_iter().map(|h| h.join().unwrap()).collect();
        let won: Vec<_> = r.iter().flatten().collect();
        assert_eq!(won.len(), 1, "exactly one decides");
        assert_eq!(*won[0], (token(&w), true));
        assert_eq!(chose.load(SeqCst), 1, "the slice is charged once");
        assert_eq!(token(&w).seq, t.seq + 2);
    });
}

/// A decider that dies at each point in turn (after taking the DECIDING
/// state, after choosing) or stalls: another process takes the state over
/// once it sees the owner dead, or at once (a stalled owner is declared
/// dead after the decision limit). The token never stays DECIDING, and
/// a stalled owner's late publish never overwrites its successor's.
#[test]
fn decider_dies_or_stalls() {
    for k in 0..3u32 {
        for stalled in [false, true] {
            check_within(3, move || {
                let t = Token::unpack(0).next(DRAINING, Some(0), None);
                let w = Arc::new(AtomicU64::new(t.pack()));
                let a = {
                    let w = w.clone();
                    thread::spawn(move || {
                        die_after(k);
                        mortal(|| transition::decide(&w, t, 1, |m| m.next(RUNNING, Some(1), None)))
                    })
                };
                let a = if stalled {
                    Some(a)
                } else {
                    a.join().unwrap();
                    None
                };
                // The successor: one look, then take over a DECIDING or
                // DRAINING state.
                let cur = token(&w);
                let b = if cur.state == DECIDING || cur.state == DRAINING {
                    transition::decide(&w, cur, 2, |m| m.next(RUNNING, Some(2), None))
                } else {
                    None
                };
                if let Some(a) = a {
                    a.join().unwrap();
                }
                // Its next look, with the owner now dead or done.
                let cur = token(&w);
                if cur.state == DECIDING {
                    transition::decide(&w, cur, 2, |m| m.next(RUNNING, Some(2), None));
                }
                let end = token(&w);
                assert_eq!(end.state, RUNNING, "never left DECIDING: {end:?}");
                if let Some((next, published)) = b {
                    if published {
                        assert!(end.seq >= next.seq);
                    }
                }
            });
        }
    }
}

/// The holder's helper renews its slice in place (or ends it, out of
/// credit) while a waiter ends the same slice and decides; the helper may
/// die at each point of its renewal, after which the waiter takes over
/// its DECIDING state. The token never stays DECIDING, and a slice a
/// waiter ended is never put back to RUNNING by a renewal.
#[test]
fn renew_races_end_slice() {
    for k in 0..3u32 {
        for ended in [false, true] {
            check_within(3, move || {
                let t = Token::unpack(0).next(RUNNING, Some(0), None);
                let w = Arc::new(AtomicU64::new(t.pack()));
                let h = {
                    let w = w.clone();
                    thread::spawn(move || {
                        die_after(k);
                        mortal(|| {
                            transition::renew(&w, t, 1, || {
                                if ended {
                                    Renew::Ended
                                } else {
                                    Renew::Renewed
                                }
                            })
                        })
                    })
                };
                let ended_by_waiter = transition::end_slice(&w, t);
                let r = h.join().unwrap();
                // The waiter's next look: decide from DRAINING, or take
                // over a DECIDING state whose owner is dead.
                let cur = token(&w);
                if cur.state == DRAINING || (cur.state == DECIDING && r.is_none()) {
                    let d = transition::decide(&w, cur, 2, |m| m.next(RUNNING, Some(2), None));
                    assert!(matches!(d, Some((_, true))));
                }
                let end = token(&w);
                assert_ne!(end.state, DECIDING, "never left DECIDING: {end:?}");
                assert!(
                    !(ended_by_waiter.is_some() && r == Some(Renewal::Ended)),
                    "one slice ended twice"
                );
                assert!(
                    ended_by_waiter.is_some() || r != Some(Renewal::Gone),
                    "nobody moved the token"
                );
                if ended_by_waiter.is_some() || ended || r.is_none() {
                    assert_eq!(end.holder, Some(2), "the slice that ended was decided");
                } else {
                    assert_eq!(end, t, "a renewed slice is the same slice");
                }
            });
        }
    }
}
