//! Secure mode's compute scheduler: the agent holds each GPU's token and
//! makes every decision; processes only read the token (the ledger is
//! read-only to them) and write their own scheduling page.
//!
//! The mechanism is the cooperative one's (exclusive time slices, drained
//! and charged at each handover, token buckets refilled at each container's
//! share: `cgpu_ledger::decide`), moved into one thread of the agent:
//!
//! - a process joins with a scheduling connection of its own (`Op::Sched`,
//!   after its memory `Hello`): the agent hands it a sealed page
//!   (`cgpu_ledger::page`) and keeps the connection; its end is the
//!   process's end;
//! - a thread of the process that may not launch counts itself in its
//!   page's `WANTS`, sends one packet on the connection (the agent wakes),
//!   and sleeps on the token's futex until its container holds the GPU;
//! - the holder's threads launch with a few loads and one increment in
//!   their own page (`SLICE_LAUNCHES`), no system call;
//! - at the slice's end (its budget spent while another container waits, or
//!   the holder idle for [`IDLE_GRACE_NS`] while another waits) the agent
//!   moves the token to DRAINING; each process of the holder that launched
//!   since its last drain synchronises its contexts and writes `DRAINED`;
//!   once all have (or after [`DRAIN_LIMIT_NS`], or when a process's
//!   connection ends) the agent charges the holder the slice and decides.
//!
//! Everything read from a page is the process's word: it steers decisions
//! about its own container only (a process that claims to have drained
//! while its work still runs takes GPU time the device's per-process time,
//! reported by the agent, shows; the library never does).

use cgpu_ledger::decide::{allowance, decide_with, update_estimate, Decision, Entry, Params};
use cgpu_ledger::page::{self, word as pw, Page};
use cgpu_ledger::words::{container as cw, gpu as gw, Token, DRAINING, IDLE, RUNNING};
use cgpu_ledger::{Ledger, MAX_CONTAINERS, MAX_PROCESSES, SLOT_LIVE};
use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release, SeqCst};
use std::sync::{Arc, Mutex};

/// A holder that made no launch, and has no thread waiting for its GPU work,
/// for this long while another container waits gives the GPU up.
pub const IDLE_GRACE_NS: u64 = 2_000_000;
/// A drain that takes longer than this (a process that stopped answering)
/// is given up on: the GPU changes hands anyway.
pub const DRAIN_LIMIT_NS: u64 = 2_000_000_000;
/// How often the holder's activity is looked at while another container
/// waits (the idle hand-over's resolution).
const WATCH_NS: u64 = 1_000_000;
/// The longest sleep with nothing due (a wake-up packet or a new process
/// ends it sooner).
const REST_NS: u64 = 100_000_000;
/// Wake-up packets read from one connection in one turn.
const RUNG_MAX: usize = 64;

/// One process on one GPU, as the scheduler knows it.
pub struct Participant {
    /// The scheduling connection (the agent's end).
    conn: OwnedFd,
    gpu: usize,
    container: usize,
    process: usize,
    /// The container's identity key when it joined: a row reused by
    /// another container since is not this process's.
    key: u64,
    /// On the host.
    pid: u32,
    /// Stopped (`SIGSTOP`, a debugger) when last looked at, and when.
    stopped: bool,
    looked_at: u64,
    /// The process's page, mapped by the agent (unmapped when it goes;
    /// private so that no reference outlives it).
    page: &'static Page,
    /// Its page's (`SLICE_OF`, `SLICE_LAUNCHES`) and `THROTTLED_NS` when
    /// last looked at.
    seen: (u64, u64),
    throttled_seen: u64,
}

impl Participant {
    /// `page` was mapped by [`page::map`] for this participant alone; it
    /// is unmapped when the participant is dropped.
    pub fn new(
        conn: OwnedFd,
        gpu: usize,
        (container, process, key): (usize, usize, u64),
        pid: u32,
        page: &'static Page,
    ) -> Participant {
        Participant {
            conn,
            gpu,
            container,
            process,
            key,
            pid,
            stopped: false,
            looked_at: 0,
            page,
            seen: (0, 0),
            throttled_seen: page.w(pw::THROTTLED_NS).load(Acquire),
        }
    }

    /// A thread of it waits to launch (and it is not stopped: a stopped
    /// process's waiting threads cannot launch if given the GPU).
    fn wants(&self) -> bool {
        self.page.w(pw::WANTS).load(Acquire) > 0 && !self.stopped
    }

    /// Launched in the holder's current tenure (slices `first..=last` of
    /// the token, renewals included) and not drained since: work of it may
    /// still be queued. A `LAUNCHED` naming no slice of the tenure is a
    /// word the agent never granted: nothing to wait for.
    fn undrained(&self, (first, last): (u32, u32)) -> bool {
        let l = self.page.w(pw::LAUNCHED).load(SeqCst);
        let Ok(l32) = u32::try_from(l) else {
            return false;
        };
        last.wrapping_sub(l32) <= last.wrapping_sub(first)
            && l != self.page.w(pw::DRAINED).load(SeqCst)
            && !self.stopped
    }

    /// Its launches admitted in slice `seq` (the allowance bounds them).
    fn launches_in(&self, seq: u32, allow: u64) -> u64 {
        if self.page.w(pw::SLICE_OF).load(Acquire) != u64::from(seq) {
            return 0;
        }
        self.page.w(pw::SLICE_LAUNCHES).load(Acquire).min(allow)
    }

    /// Look at most every [`LOOK_NS`] whether the process is stopped, while
    /// it matters (it waits, or has work to drain).
    fn look(&mut self, now: u64) {
        let matters = self.page.w(pw::WANTS).load(Acquire) > 0
            || self.page.w(pw::LAUNCHED).load(Acquire) != self.page.w(pw::DRAINED).load(Acquire);
        if !matters {
            self.stopped = false;
            return;
        }
        if now.saturating_sub(self.looked_at) >= LOOK_NS {
            self.looked_at = now;
            self.stopped = is_stopped(self.pid);
        }
    }

    /// Is it still the process of the row and slot it joined as: its
    /// process slot live and naming it, its row still its container's? A
    /// process whose memory connection ended (its slot given back, maybe
    /// to another container) is not.
    fn still_placed(&self, f: &cgpu_ledger::LedgerFile) -> bool {
        let (Some(ps), Some(cs)) = (
            f.processes.get(self.process),
            f.containers.get(self.container),
        ) else {
            return false;
        };
        ps.state.load(Acquire) == SLOT_LIVE
            && ps.host_pid() == Some(self.pid)
            && ps.container.load(Acquire) as usize == self.container
            && cs.state.load(Acquire) == SLOT_LIVE
            && cs.key.load(Acquire) == self.key
    }
}

/// How often a waiting or draining process is looked at for being stopped.
const LOOK_NS: u64 = 50_000_000;
/// The longest wait for the drain of a process a drain gave up on within
/// the last [`SUSPECT_NS`] (a process that stopped answering, or one that
/// says it launched and never drains): it holds the GPU no longer than
/// this beyond its slice.
pub const SUSPECT_LIMIT_NS: u64 = 50_000_000;
/// How long a process a drain gave up on stays suspect.
pub const SUSPECT_NS: u64 = 10_000_000_000;

/// Is process `pid` stopped (`T` or `t` in `/proc/<pid>/stat`)?
fn is_stopped(pid: u32) -> bool {
    let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the command's closing parenthesis.
    s.rfind(')')
        .and_then(|i| s[i + 1..].split_whitespace().next())
        .is_some_and(|st| st == "T" || st == "t")
}

impl Drop for Participant {
    fn drop(&mut self) {
        // SAFETY: the page was mapped for this participant alone, and no
        // reference to it outlives the participant (the scheduler only
        // reads it through `self`).
        unsafe { page::unmap(self.page) };
    }
}

/// Where the server hands new processes to the scheduler thread.
#[derive(Clone)]
pub struct Handle {
    inbox: Arc<Mutex<Vec<Participant>>>,
    /// False once the thread ended (it never should): processes are then
    /// refused, so that none waits for a scheduler that is gone.
    alive: Arc<std::sync::atomic::AtomicBool>,
    /// An eventfd the thread waits on besides the connections.
    wake: Arc<OwnedFd>,
}

impl Handle {
    /// Whether the scheduler's thread still runs.
    pub fn alive(&self) -> bool {
        self.alive.load(Acquire)
    }

    /// Hand `p` over (its connection is the scheduler's from now on). With
    /// the thread gone, `p` is dropped: its connection ends, and the
    /// process launches unscheduled rather than wait.
    pub fn add(&self, p: Participant) {
        if !self.alive() {
            return;
        }
        let mut inbox = self.inbox.lock().unwrap_or_else(|e| e.into_inner());
        inbox.push(p);
        if !self.alive() {
            // The thread ended meanwhile (it cleared the inbox first).
            inbox.clear();
        }
        drop(inbox);
        let one: u64 = 1;
        // SAFETY: an eventfd of ours; 8 bytes from a live u64.
        unsafe { libc::write(self.wake.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }
}

/// One GPU's token as the agent keeps it.
struct Gpu {
    ledger: Arc<Ledger>,
    /// When the current slice began (RUNNING) and its budget.
    slice_start: u64,
    budget: u64,
    /// When DRAINING began.
    drain_since: u64,
    /// While IDLE: no decision before this, unless the containers that
    /// wait are others than `idle_wants`.
    idle_until: u64,
    idle_wants: [bool; MAX_CONTAINERS],
    /// The holder was last seen busy (launching, or waiting for its work).
    active_at: u64,
    /// The token's sequence number of the current (or last) RUNNING slice,
    /// and of the first slice of its holder's tenure (renewals continue a
    /// tenure).
    running_seq: u32,
    tenure_first: u32,
    /// The holder's identity key when its slice was granted (a row reused
    /// since is not charged for it).
    holder_key: u64,
    last_refill: u64,
    /// Containers (by key) a drain gave up on, until when (monotonic ns):
    /// their drains are waited for at most [`SUSPECT_LIMIT_NS`], whatever
    /// connection their processes come back on.
    suspects: HashMap<u64, u64>,
}

impl Gpu {
    fn token(&self) -> &std::sync::atomic::AtomicU64 {
        &self.ledger.file().header.sched[gw::TOKEN]
    }
    fn g(&self, i: usize) -> &std::sync::atomic::AtomicU64 {
        &self.ledger.file().header.sched[i]
    }
    fn now_token(&self) -> Token {
        Token::unpack(self.token().load(Acquire))
    }
    /// Publish `next` and wake every process sleeping on the token.
    fn publish(&self, next: Token) {
        // SeqCst: a process writes `LAUNCHED` then reads the token; the
        // agent publishes DRAINING then reads `LAUNCHED` (one of the two
        // sees the other).
        self.token().store(next.pack(), SeqCst);
        cgpu_ledger::futex::wake(self.token());
    }
}

fn now_ns() -> u64 {
    cgpu_ledger::clock::monotonic_ns()
}

// ---- The device's truth: GPU time used outside a container's slices ----
//
// Every pass, the agent integrates NVML's per-process utilisation samples
// into device time per process (`DeviceClock` in `lib.rs`) and hands each
// sample's device time to [`device_time`]. What a container's processes ran
// on the device beyond the time its slices held the GPU (widened by
// [`HELD_MARGIN_US`] at each end, less [`slack_ns`] for the samples'
// rounding) ran outside the scheduler: a program without the library, a
// process that said it drained while its work still ran. It is charged to
// the container's bucket at the next decision, as if it had held the GPU
// that long, so the container's share holds over time.

/// A held slice is widened by this at each end (clock and sampling
/// mismatch between the device's timestamps and the agent's).
const HELD_MARGIN_US: u64 = 5_000;
/// Slices remembered, per GPU (a pass interval's worth and more).
const HELD_KEEP_US: u64 = 120_000_000;
/// The most a container's pending debit (or give-back) holds.
const DEBIT_MAX_NS: i64 = 10_000_000_000;

impl Feed {
    fn debit(&mut self, uuid: &str, key: u64, ns: i64) {
        let d = self.debits.entry((uuid.to_owned(), key)).or_insert(0);
        *d = d.saturating_add(ns).clamp(-DEBIT_MAX_NS, DEBIT_MAX_NS);
    }
}

/// One slice, realtime µs (`end_us` `u64::MAX`: still held).
struct HeldSlice {
    start_us: u64,
    end_us: u64,
    key: u64,
}

#[derive(Default)]
struct Feed {
    /// Per GPU UUID (present only where this agent schedules).
    held: HashMap<String, VecDeque<HeldSlice>>,
    /// Per (GPU UUID, container key): ns not charged yet (negative: to give
    /// back), within ±[`DEBIT_MAX_NS`].
    debits: HashMap<(String, u64), i64>,
}

static FEED: std::sync::LazyLock<Mutex<Feed>> = std::sync::LazyLock::new(Default::default);

fn feed() -> std::sync::MutexGuard<'static, Feed> {
    FEED.lock().unwrap_or_else(|e| e.into_inner())
}

fn realtime_us() -> u64 {
    cgpu_ledger::clock::realtime_ns() / 1000
}

/// What the samples' rounding may add: NVML reports whole percents.
fn slack_ns(period_us: u64) -> u64 {
    period_us * 1000 / 100 + 1_000_000
}

/// One pass's device time on GPU `uuid`: `(container key, from_us, to_us,
/// ns)` per process sample, realtime µs. Per container, what its processes
/// ran over the pass's samples and does not fit in the time its slices held
/// the GPU then is charged to it at the next decision. Nothing where this
/// agent does not schedule the GPU.
pub fn device_times(uuid: &str, samples: &[(u64, u64, u64, u64)]) {
    let mut per: Vec<(u64, u64, u64, u64)> = Vec::new();
    for &(key, from, to, ns) in samples {
        match per.iter_mut().find(|e| e.0 == key) {
            Some(e) => {
                e.1 = e.1.min(from);
                e.2 = e.2.max(to);
                e.3 += ns;
            }
            None => per.push((key, from, to, ns)),
        }
    }
    for (key, from, to, ns) in per {
        container_time(uuid, key, from, to, ns);
    }
}

/// Device time `ns` of container `key`'s processes on GPU `uuid` over
/// (`from_us`, `to_us`], realtime µs (see [`device_times`]).
fn container_time(uuid: &str, key: u64, from_us: u64, to_us: u64, ns: u64) {
    if key == 0 || to_us <= from_us {
        return;
    }
    let mut f = feed();
    let Some(held) = f.held.get(uuid) else {
        return;
    };
    let by_key = held_by_key(held, from_us, to_us, realtime_us());
    let mine = by_key.iter().find(|(k, _)| *k == key).map_or(0, |e| e.1);
    let outside = ns.saturating_sub(mine.saturating_add(slack_ns(to_us - from_us)));
    if outside == 0 {
        return;
    }
    f.debit(uuid, key, outside as i64);
    // It ran in other containers' slices: they are charged for time they
    // did not have, which is given back to them in proportion to what
    // each held then.
    let others: u64 = by_key.iter().filter(|(k, _)| *k != key).map(|e| e.1).sum();
    if others > 0 {
        for (k, d) in by_key.iter().filter(|(k, _)| *k != key) {
            let back = (outside as u128 * *d as u128 / others as u128).min(*d as u128) as i64;
            f.debit(uuid, *k, -back);
        }
    }
}

/// Each container's (by key) held time within (`from_us`, `to_us`], ns:
/// its slices widened by [`HELD_MARGIN_US`] at each end and clipped to the
/// period, overlaps merged (widened neighbours overlap), then summed.
fn held_by_key(held: &VecDeque<HeldSlice>, from_us: u64, to_us: u64, now: u64) -> Vec<(u64, u64)> {
    let mut spans: Vec<(u64, u64, u64)> = held
        .iter()
        .map(|h| {
            let a = h.start_us.saturating_sub(HELD_MARGIN_US).max(from_us);
            let b = h.end_us.min(now).saturating_add(HELD_MARGIN_US).min(to_us);
            (h.key, a, b)
        })
        .filter(|&(_, a, b)| b > a)
        .collect();
    spans.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::new();
    let mut open: Option<(u64, u64, u64)> = None;
    for (k, a, b) in spans {
        match open {
            Some((ok, oa, ob)) if ok == k && a <= ob => open = Some((ok, oa, ob.max(b))),
            _ => {
                if let Some((ok, oa, ob)) = open.replace((k, a, b)) {
                    add_span(&mut out, ok, ob - oa);
                }
            }
        }
    }
    if let Some((ok, oa, ob)) = open {
        add_span(&mut out, ok, ob - oa);
    }
    out
}

fn add_span(out: &mut Vec<(u64, u64)>, key: u64, us: u64) {
    match out.iter_mut().find(|(k, _)| *k == key) {
        Some(e) => e.1 += us * 1000,
        None => out.push((key, us * 1000)),
    }
}

/// GPU `uuid` is scheduled by this agent from now on.
fn feed_gpu(uuid: &str) {
    feed().held.entry(uuid.to_owned()).or_default();
}

/// Container `key` holds GPU `uuid` from now (`true`), or no longer.
fn feed_held(uuid: &str, key: u64, holds: bool) {
    let now = realtime_us();
    let mut f = feed();
    let Some(v) = f.held.get_mut(uuid) else {
        return;
    };
    if let Some(last) = v.back_mut().filter(|h| h.end_us == u64::MAX) {
        last.end_us = now;
    }
    if holds {
        v.push_back(HeldSlice {
            start_us: now,
            end_us: u64::MAX,
            key,
        });
    }
    while v
        .front()
        .is_some_and(|h| h.end_us != u64::MAX && now.saturating_sub(h.end_us) > HELD_KEEP_US)
    {
        v.pop_front();
    }
}

/// The debits of GPU `uuid` not charged yet.
fn take_debits(uuid: &str) -> Vec<(u64, i64)> {
    let mut f = feed();
    let mut out = Vec::new();
    f.debits.retain(|(u, k), ns| {
        if u == uuid {
            out.push((*k, *ns));
            false
        } else {
            true
        }
    });
    out
}

/// Start the scheduler thread for `ledgers` (the served GPUs, by index).
pub fn start(ledgers: Vec<Arc<Ledger>>) -> std::io::Result<Handle> {
    // SAFETY: plain eventfd(2).
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor just made, owned from here.
    let wake = Arc::new(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) });
    let h = Handle {
        inbox: Arc::new(Mutex::new(Vec::new())),
        alive: Arc::new(std::sync::atomic::AtomicBool::new(true)),
        wake,
    };
    let now = now_ns();
    let gpus: Vec<Gpu> = ledgers
        .into_iter()
        .map(|ledger| {
            let g = Gpu {
                ledger,
                slice_start: now,
                budget: 0,
                drain_since: now,
                idle_until: 0,
                idle_wants: [false; MAX_CONTAINERS],
                active_at: now,
                running_seq: 0,
                tenure_first: 0,
                holder_key: 0,
                suspects: HashMap::new(),
                last_refill: now,
            };
            feed_gpu(&g.ledger.uuid());
            // A token left by an earlier agent (or a cooperative process)
            // names nobody any more: start from IDLE.
            let t = g.now_token();
            g.publish(t.next(IDLE, None, None));
            g
        })
        .collect();
    let mut s = Sched {
        gpus,
        parts: HashMap::new(),
        inbox: h.inbox.clone(),
        wake: h.wake.clone(),
        epoll: -1,
        said_outside: HashMap::new(),
    };
    // SAFETY: plain epoll_create1(2).
    s.epoll = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if s.epoll < 0 {
        return Err(std::io::Error::last_os_error());
    }
    s.watch(h.wake.as_raw_fd());
    let alive = h.alive.clone();
    std::thread::Builder::new()
        .name("cgpu-sched".into())
        .spawn(move || {
            // Should the thread ever end (a panic), every connection it held
            // ends with it, and so do those handed over later (`add`): no
            // process waits for it.
            struct Gone(Arc<std::sync::atomic::AtomicBool>, Arc<Mutex<Vec<Participant>>>);
            impl Drop for Gone {
                fn drop(&mut self) {
                    self.0.store(false, Release);
                    self.1.lock().unwrap_or_else(|e| e.into_inner()).clear();
                    eprintln!("cgpu-agent: the compute scheduler stopped: kernel launches are no longer held back");
                }
            }
            let _gone = Gone(alive, s.inbox.clone());
            s.run()
        })?;
    Ok(h)
}

struct Sched {
    gpus: Vec<Gpu>,
    /// By scheduling connection.
    parts: HashMap<RawFd, Participant>,
    inbox: Arc<Mutex<Vec<Participant>>>,
    wake: Arc<OwnedFd>,
    epoll: i32,
    /// When device time outside its slices was last logged, per (GPU,
    /// container key).
    said_outside: HashMap<(String, u64), u64>,
}

impl Sched {
    fn watch(&self, fd: RawFd) {
        let mut ev = libc::epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLRDHUP) as u32,
            u64: fd as u64,
        };
        // SAFETY: our epoll instance; `ev` is a valid event.
        unsafe { libc::epoll_ctl(self.epoll, libc::EPOLL_CTL_ADD, fd, &mut ev) };
    }

    fn run(mut self) -> ! {
        let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 64];
        let mut sleep_ns = 0u64;
        loop {
            let ms = sleep_ns.div_ceil(1_000_000).min(i32::MAX as u64) as i32;
            // SAFETY: `events` holds that many entries.
            let n = unsafe {
                libc::epoll_wait(self.epoll, events.as_mut_ptr(), events.len() as i32, ms)
            };
            for ev in &events[..n.max(0) as usize] {
                let fd = ev.u64 as RawFd;
                if fd == self.wake.as_raw_fd() {
                    let mut v = 0u64;
                    // SAFETY: 8 bytes into a live u64 from our eventfd.
                    unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) };
                } else {
                    self.rung(fd);
                }
            }
            let new: Vec<Participant> =
                std::mem::take(&mut *self.inbox.lock().unwrap_or_else(|e| e.into_inner()));
            for p in new {
                let fd = p.conn.as_raw_fd();
                self.watch(fd);
                // One process, one place on each GPU: an earlier connection
                // of the same slot on that GPU is replaced.
                let old: Vec<RawFd> = self
                    .parts
                    .iter()
                    .filter(|(_, q)| q.gpu == p.gpu && q.process == p.process)
                    .map(|(f, _)| *f)
                    .collect();
                for f in old {
                    if let Some(q) = self.parts.remove(&f) {
                        self.account(&q);
                    }
                }
                self.parts.insert(fd, p);
            }
            let now = now_ns();
            sleep_ns = REST_NS;
            for g in 0..self.gpus.len() {
                sleep_ns = sleep_ns.min(self.step(g, now));
                // Alive: processes that wait look at this (see `AGENT_BEAT`).
                self.gpus[g].g(gw::AGENT_BEAT).store(now, Release);
            }
        }
    }

    /// Packets, or the end, on a scheduling connection. At most
    /// [`RUNG_MAX`] packets a turn: a process that floods its connection
    /// cannot keep the thread from its decisions (the rest wake the next
    /// turn: the epoll set is level-triggered).
    fn rung(&mut self, fd: RawFd) {
        let mut buf = [0u8; 16];
        for _ in 0..RUNG_MAX {
            // SAFETY: `buf` holds that many writable bytes.
            let n =
                unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
            if n > 0 {
                continue;
            }
            let e = std::io::Error::last_os_error();
            let ended = n == 0
                || !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted
                );
            if ended {
                self.drop_participant(fd);
            }
            return;
        }
    }

    /// The process of connection `fd` ended (or is no longer placed): its
    /// place goes (closing the descriptor takes it out of the epoll set).
    fn drop_participant(&mut self, fd: RawFd) {
        if let Some(p) = self.parts.remove(&fd) {
            self.account(&p);
        }
    }

    /// Carry a participant's counters into its container's words.
    fn account(&self, p: &Participant) {
        let Some(g) = self.gpus.get(p.gpu) else {
            return;
        };
        let c = &g.ledger.file().containers[p.container];
        if c.key.load(Acquire) != p.key {
            return; // its row is another container's now
        }
        let cs = &c.sched;
        let t = p.page.w(pw::THROTTLED_NS).load(Acquire);
        cs[cw::THROTTLED_NS].fetch_add(t.wrapping_sub(p.throttled_seen).min(1 << 40), Relaxed);
    }

    /// Advance GPU `gi`'s token as far as it can go now; returns how long
    /// until it must be looked at again.
    fn step(&mut self, gi: usize, now: u64) -> u64 {
        let ledger = self.gpus[gi].ledger.clone();
        let f = ledger.file();
        // A process whose memory connection ended (its slot given back,
        // maybe to another container since) is scheduled no more: its
        // connection closes, and its gate attaches anew.
        let gone: Vec<RawFd> = self
            .parts
            .iter()
            .filter(|(_, p)| p.gpu == gi && !p.still_placed(f))
            .map(|(fd, _)| *fd)
            .collect();
        for fd in gone {
            self.drop_participant(fd);
        }
        let k = cgpu_ledger::words::knobs(f);
        let mut wants = [false; MAX_CONTAINERS];
        let mut holder_busy = false;
        let mut holder_waits = false;
        let t = self.gpus[gi].now_token();
        let holder = t.holder_slot();
        for p in self.parts.values_mut().filter(|p| p.gpu == gi) {
            p.look(now);
            if p.wants() {
                wants[p.container] = true;
            }
            let cur = (
                p.page.w(pw::SLICE_OF).load(Acquire),
                p.page.w(pw::SLICE_LAUNCHES).load(Acquire),
            );
            let moved = cur != p.seen;
            p.seen = cur;
            let th = p.page.w(pw::THROTTLED_NS).load(Acquire);
            let cs = &f.containers[p.container].sched;
            cs[cw::THROTTLED_NS].fetch_add(th.wrapping_sub(p.throttled_seen).min(1 << 40), Relaxed);
            p.throttled_seen = th;
            if Some(p.container) == holder {
                holder_waits |= p.wants();
                holder_busy |= moved || p.page.w(pw::SYNCING).load(Acquire) > 0 || p.wants();
            }
        }
        let g = &mut self.gpus[gi];
        if k.native() {
            // No scheduling: the token stays IDLE and every launch passes.
            if t.state != IDLE {
                g.publish(t.next(IDLE, None, None));
            }
            return REST_NS;
        }
        match t.state {
            RUNNING => {
                let Some(h) = holder else {
                    g.publish(t.next(IDLE, None, None));
                    return 0;
                };
                if holder_busy {
                    g.active_at = now;
                }
                let others = wants.iter().enumerate().any(|(c, &w)| w && c != h);
                let end = g.slice_start.saturating_add(g.budget);
                let idle = others && now.saturating_sub(g.active_at) >= IDLE_GRACE_NS;
                // A holder alone that used its slice's launch allowance
                // gets its next slice now (a thread of it waits), not at
                // the slice's end.
                let used_up = holder_waits && !others;
                if now < end && !idle && !used_up {
                    return if others {
                        WATCH_NS.min(end - now)
                    } else {
                        end - now
                    };
                }
                // (`idle` implies `others`.)
                if others || !k.work_conserving() {
                    // Hand over (or, out of a policy that wastes idle
                    // time, end the slice): the holder's processes drain
                    // first.
                    g.drain_since = now;
                    g.publish(t.next(DRAINING, Some(h), None));
                    return self.step(gi, now);
                }
                // Nobody else waits: charge the slice and decide again
                // without a drain; a holder still at work keeps the GPU
                // (its threads launch without waiting, so it counts as
                // waiting while it was busy within the slice).
                let mut w = wants;
                w[h] |= now.saturating_sub(g.active_at) < g.budget.max(IDLE_GRACE_NS);
                self.charge_and_decide(gi, now, Some(h), &w);
                WATCH_NS
            }
            DRAINING => {
                let Some(h) = holder else {
                    g.publish(t.next(IDLE, None, None));
                    return 0;
                };
                let tenure = (g.tenure_first, g.running_seq);
                let waited = now.saturating_sub(g.drain_since);
                // A container a drain gave up on lately is waited for
                // briefly (whatever connection its processes come back on).
                let limit = match g.suspects.get(&g.holder_key) {
                    Some(&until) if now < until => SUSPECT_LIMIT_NS,
                    _ => DRAIN_LIMIT_NS,
                };
                let pending = self
                    .parts
                    .values()
                    .any(|p| p.gpu == gi && p.container == h && p.undrained(tenure));
                if pending && waited < limit {
                    return WATCH_NS;
                }
                if pending {
                    let g = &mut self.gpus[gi];
                    let was = g.suspects.insert(g.holder_key, now + SUSPECT_NS);
                    g.suspects.retain(|_, until| *until > now);
                    if was.is_none_or(|until| until <= now) {
                        eprintln!(
                            "cgpu-agent: GPU {gi}: a process of container slot {h} did not drain within {} ms: the GPU changes hands anyway; its container's drains are waited for at most {} ms for {} s",
                            waited / 1_000_000,
                            SUSPECT_LIMIT_NS / 1_000_000,
                            SUSPECT_NS / 1_000_000_000
                        );
                    }
                }
                self.charge_and_decide(gi, now, Some(h), &wants);
                0
            }
            _ => {
                // IDLE (or a word no agent wrote: decided afresh).
                if !wants.iter().any(|&w| w) && t.state == IDLE {
                    return REST_NS;
                }
                if now < g.idle_until && t.state == IDLE && wants == g.idle_wants {
                    return g.idle_until - now;
                }
                self.charge_and_decide(gi, now, None, &wants);
                0
            }
        }
    }

    /// Charge each container of GPU `uuid` the device time its processes
    /// ran outside its slices since the last decision (see
    /// [`device_time`]); logged at most every 10 s per container.
    fn charge_outside(
        &mut self,
        uuid: &str,
        f: &cgpu_ledger::LedgerFile,
        now: u64,
        k: &cgpu_ledger::policy::Knobs,
    ) {
        let debits = take_debits(uuid);
        if k.native() {
            return; // nothing is scheduled: nothing ran outside a slice
        }
        for (key, ns) in debits {
            let Some((i, s)) =
                f.containers.iter().enumerate().find(|(_, s)| {
                    s.state.load(Acquire) == SLOT_LIVE && s.key.load(Acquire) == key
                })
            else {
                continue;
            };
            let ns = ns.clamp(-10_000_000_000, 10_000_000_000);
            s.sched[cw::TOKENS].store(
                (s.sched[cw::TOKENS].load(Acquire) as i64).saturating_sub(ns) as u64,
                Relaxed,
            );
            if ns <= 0 {
                continue; // given back: its bucket only
            }
            s.sched[cw::GPU_NS].fetch_add(ns as u64, Relaxed);
            let said = self.said_outside.entry((uuid.to_owned(), key)).or_insert(0);
            if *said == 0 || now.saturating_sub(*said) >= 10_000_000_000 {
                *said = now.max(1);
                eprintln!(
                    "cgpu-agent: GPU {uuid}: container {} (slot {i}, key {key:016x}) ran {} ms on the device outside its slices (work the scheduler did not hold back): charged to its share",
                    s.id_str(),
                    ns / 1_000_000
                );
            }
        }
    }

    /// Charge `holder` (if any) the slice that ended now, refill every
    /// bucket, and publish the next holder.
    fn charge_and_decide(
        &mut self,
        gi: usize,
        now: u64,
        holder: Option<usize>,
        wants: &[bool; MAX_CONTAINERS],
    ) {
        let ledger = self.gpus[gi].ledger.clone();
        let f = ledger.file();
        let k = cgpu_ledger::words::knobs(f);
        let mut charge = None;
        // A holder's row reused by another container since its slice was
        // granted: nobody is charged for it.
        let holder =
            holder.filter(|&h| f.containers[h].key.load(Acquire) == self.gpus[gi].holder_key);
        if let Some(h) = holder {
            let g = &self.gpus[gi];
            let held = now
                .saturating_sub(g.slice_start)
                .min(8 * g.budget.max(1) + DRAIN_LIMIT_NS);
            let allow = g.g(gw::SLICE_ALLOW).load(Relaxed).max(1);
            let mut launches = 0u64;
            let mut launchers = 0u64;
            for p in self
                .parts
                .values()
                .filter(|p| p.gpu == gi && p.container == h)
            {
                let n = p.launches_in(g.running_seq, allow);
                launches += n;
                launchers += u64::from(n > 0);
            }
            let cs = &f.containers[h].sched;
            cs[cw::GPU_NS].fetch_add(held, Relaxed);
            cs[cw::LAUNCHES].fetch_add(launches, Relaxed);
            cs[cw::LAST_SLICE_NS].store(held.max(1), Relaxed);
            let est = update_estimate(cs[cw::NS_PER_LAUNCH].load(Relaxed), held, launches);
            cs[cw::NS_PER_LAUNCH].store(est, Relaxed);
            g.g(gw::BUSY_NS).fetch_add(held, Relaxed);
            // Each process that launched in the slice: an equal part, for
            // the tools' per-process GPU time.
            if let Some(part) = held.checked_div(launchers) {
                let running = g.running_seq;
                for p in self.parts.values().filter(|p| {
                    p.gpu == gi && p.container == h && p.launches_in(running, allow) > 0
                }) {
                    if p.process < MAX_PROCESSES {
                        f.processes[p.process].gpu_time_ns.fetch_add(part, Relaxed);
                    }
                }
            }
            charge = Some((h, held));
        }
        let uuid = ledger.uuid();
        self.charge_outside(&uuid, f, now, &k);
        let mut es = [Entry::default(); MAX_CONTAINERS];
        for (i, s) in f.containers.iter().enumerate() {
            // As the cooperative mechanism counts it: a row with processes.
            let live = s.state.load(Acquire) == SLOT_LIVE && s.nprocs.load(Acquire) > 0;
            es[i] = Entry {
                live,
                weight: s.weight.load(Acquire),
                highprio: s.highprio.load(Acquire) != 0,
                wants: live && wants[i],
                guest: false,
                tokens: s.sched[cw::TOKENS].load(Acquire) as i64,
                ns_per_launch: s.sched[cw::NS_PER_LAUNCH].load(Relaxed),
            };
        }
        let g = &mut self.gpus[gi];
        // Debt down to the longest a holder can be charged (its longest
        // slice and a drain given up on): a container that makes the GPU
        // wait for its drain pays for all of it.
        let mut params = Params::for_knobs(&k);
        params.floor_ns = params
            .floor_ns
            .min(-((8 * params.slice_ns + DRAIN_LIMIT_NS) as i64));
        let d = decide_with(&k, &params, now, g.last_refill, charge, &mut es);
        g.last_refill = now;
        g.g(gw::LAST_REFILL).store(now, Relaxed);
        for (s, e) in f.containers.iter().zip(&es) {
            s.sched[cw::TOKENS].store(e.tokens as u64, Relaxed);
        }
        let t = g.now_token();
        match d {
            Decision::Run {
                c,
                budget_ns,
                allow,
            } => {
                g.slice_start = now;
                g.budget = budget_ns;
                g.active_at = now;
                g.g(gw::SLICE_START).store(now, Relaxed);
                g.g(gw::SLICE_BUDGET).store(budget_ns, Relaxed);
                g.g(gw::SLICE_ALLOW)
                    .store(allow.max(allowance(budget_ns, 0)), Relaxed);
                g.g(gw::SLICES).fetch_add(1, Relaxed);
                f.containers[c].sched[cw::SLICES].fetch_add(1, AcqRel);
                feed_held(&uuid, f.containers[c].key.load(Acquire), true);
                let next = t.next(RUNNING, Some(c), None);
                if !(t.state == RUNNING && t.holder == Some(c)) {
                    g.tenure_first = next.seq;
                }
                g.holder_key = f.containers[c].key.load(Acquire);
                g.running_seq = next.seq;
                g.publish(next);
            }
            Decision::Idle { until } => {
                g.idle_until = until;
                g.idle_wants = *wants;
                g.g(gw::IDLE_UNTIL).store(until, Relaxed);
                feed_held(&uuid, 0, false);
                g.publish(t.next(IDLE, None, None));
            }
        }
    }
}
