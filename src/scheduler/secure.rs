//! Secure mode's gate: the node agent holds the token and decides; this
//! process reads the token from the GPU's ledger (mapped read-only) and
//! writes only its own scheduling page, which the agent handed it over a
//! scheduling connection of its own (`cgpu_ledger::page`, the agent's
//! `sched` module).
//!
//! - a launch passes when the token says "RUNNING, held by my container"
//!   and the slice's launch allowance is not used up: a few loads and one
//!   increment in the page, no system call, no lock;
//! - otherwise the thread counts itself in the page's `WANTS`, sends one
//!   packet on the scheduling connection (the agent wakes up) and sleeps
//!   on the token's futex (bounded waits) until its container holds it;
//! - the helper thread drains: when the token says DRAINING for my
//!   container and this process launched since its last drain, it waits
//!   for launches in flight, synchronises its contexts and writes
//!   `DRAINED`, then rings.
//!
//! Attaching (asking the agent for the page) is done by a thread of its
//! own, never by a launching thread: launches pass unscheduled until the
//! gate is there. A process the agent cannot place (no scheduling in that
//! agent, the process not placed on the GPU yet) is asked for again a
//! second later; the reason is said once. A gate whose agent went away
//! (its connection ended) or stopped answering (its beat in the ledger
//! older than 2 s) lets launches pass unscheduled.

use super::contexts::Contexts;
use super::gate::DriverOps;
use super::sys::{futex_wait, now_ns};
use super::words::{gpu as gw, Token, DRAINING};
use crate::ledger::page::{self, word as pw, Page};
use crate::ledger::wire::{Op, Reply, Request, Status, REPLY_LEN};
use crate::ledger::Ledger;
use crate::process::fork;
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU64, Ordering::*};
use std::time::Duration;

/// Devices with a gate of their own (as the cooperative gates).
const MAX_DEVS: usize = crate::memory::MAX_GPUS;
/// The process's gate when it sees one GPU; per device when several.
static ONE: AtomicPtr<SecureGate> = AtomicPtr::new(std::ptr::null_mut());
static PER_DEV: [AtomicPtr<SecureGate>; MAX_DEVS] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; MAX_DEVS];
/// Earliest next attach attempt (monotonic ns) and its fork generation,
/// per device (index `MAX_DEVS`: the single GPU).
static NEXT_TRY: [AtomicU64; MAX_DEVS + 1] = [const { AtomicU64::new(0) }; MAX_DEVS + 1];
static TRY_GEN: [AtomicU64; MAX_DEVS + 1] = [const { AtomicU64::new(u64::MAX) }; MAX_DEVS + 1];
/// Several GPUs visible (decided at the first launch).
static SEVERAL: AtomicI32 = AtomicI32::new(-1);
/// An attempt that failed waits this long before the next.
const RETRY_NS: u64 = 1_000_000_000;
/// The longest single futex sleep of a waiting thread (it re-reads the
/// token, and rings again, after each).
const WAIT_NS: u64 = 50_000_000;
/// Launch allowance assumed before the agent wrote one.
const DEFAULT_ALLOW: u64 = 8;
/// A scheduler that has not looked at the GPU for this long does not
/// answer (its thread stopped or hangs): a waiting launch passes
/// unscheduled rather than wait for it.
const AGENT_STALE_NS: u64 = 2_000_000_000;

thread_local! {
    /// This thread's admitted launches in flight and their gate.
    static ADMITTED: Cell<(*const SecureGate, u32)> = const { Cell::new((std::ptr::null(), 0)) };
}

/// One process on one GPU in secure mode.
pub struct SecureGate {
    generation: u64,
    ledger: &'static Ledger,
    page: &'static Page,
    /// High half of the token word when my container holds it RUNNING.
    running_hi: u32,
    container: usize,
    /// The scheduling connection (-1: closed in a forked child).
    conn: AtomicI32,
    in_launch: AtomicU64,
    ctxs: Contexts,
    /// At exit: launches pass unscheduled, the helper ends.
    stop: AtomicBool,
    /// The scheduling connection ended (the agent went away): launches
    /// pass unscheduled until a new gate is attached.
    dead: AtomicBool,
    /// When a waiting thread last rang (monotonic ns).
    rung_at: AtomicU64,
}

impl SecureGate {
    #[inline(always)]
    fn token(&self) -> &AtomicU64 {
        &self.ledger.file().header.sched[gw::TOKEN]
    }

    #[inline(always)]
    fn w(&self, i: usize) -> &AtomicU64 {
        self.page.w(i)
    }

    /// Admit a launch: true = admitted (the caller calls [`Self::done`]);
    /// false = launched unscheduled (the policy is native, or the gate is
    /// stopping).
    #[inline]
    fn admit(&self) -> bool {
        self.in_launch.fetch_add(1, SeqCst);
        // `SLICE_OF` before the token: whoever wrote it wrote `LAUNCHED`
        // first, so the agent, which publishes DRAINING before it reads
        // `LAUNCHED`, sees it if this thread sees the slice still running.
        let of = self.w(pw::SLICE_OF).load(Acquire);
        let w = self.token().load(SeqCst);
        if (w >> 32) as u32 == self.running_hi
            && of == u64::from(w as u32)
            && self.w(pw::SLICE_LAUNCHES).fetch_add(1, Relaxed) < self.allow()
        {
            return true;
        }
        self.in_launch.fetch_sub(1, SeqCst);
        self.admit_slow()
    }

    #[inline(always)]
    fn allow(&self) -> u64 {
        match self.ledger.file().header.sched[gw::SLICE_ALLOW].load(Relaxed) {
            0 => DEFAULT_ALLOW,
            a => a,
        }
    }

    /// After the real launch returned.
    #[inline]
    fn done(&self) {
        self.in_launch.fetch_sub(1, Release);
    }

    /// Wait until my container holds the GPU (or the policy schedules
    /// nothing). True = admitted.
    #[cold]
    #[inline(never)]
    fn admit_slow(&self) -> bool {
        let mut since: Option<u64> = None;
        let admitted = loop {
            if self.stop.load(Acquire) || self.dead.load(Acquire) {
                break false;
            }
            if crate::scheduler::words::knobs(self.ledger.file()).native() {
                break false;
            }
            self.in_launch.fetch_add(1, SeqCst);
            let w = self.token().load(SeqCst);
            if (w >> 32) as u32 == self.running_hi {
                let seq = u64::from(w as u32);
                if self.w(pw::SLICE_OF).load(Acquire) != seq {
                    // My first launch in this slice: record the context,
                    // say so (the drain's condition: `LAUNCHED`, before
                    // the slice's `SLICE_OF` that other threads' fast path
                    // reads), then check that the slice did not end
                    // meanwhile (the agent publishes DRAINING before it
                    // reads `LAUNCHED`: one of the two sees the other).
                    self.ctxs.register();
                    self.w(pw::LAUNCHED).store(seq, SeqCst);
                    self.w(pw::SLICE_LAUNCHES).store(0, Relaxed);
                    self.w(pw::SLICE_OF).store(seq, Release);
                }
                if self.token().load(SeqCst) == w
                    && self.w(pw::SLICE_LAUNCHES).fetch_add(1, Relaxed) < self.allow()
                {
                    break true;
                }
            }
            self.in_launch.fetch_sub(1, SeqCst);
            let now = now_ns();
            let mut first_wait = false;
            if since.is_none() {
                since = Some(now);
                first_wait = self.w(pw::WANTS).fetch_add(1, SeqCst) == 0;
            }
            let beat = self.ledger.file().header.sched[gw::AGENT_BEAT].load(Acquire);
            if beat != 0 && now.saturating_sub(beat) > AGENT_STALE_NS {
                say_stale();
                break false;
            }
            // Ring when the process starts to want the GPU, and at most
            // every `WAIT_NS` per process while it waits (the agent may
            // have slept through the first): never once per waiting
            // thread per change of the token.
            if first_wait || now.saturating_sub(self.rung_at.load(Relaxed)) >= WAIT_NS {
                self.rung_at.store(now, Relaxed);
                self.ring();
            }
            // Until the token changes or `WAIT_NS` passed: a wake-up with
            // the token unchanged (anyone may wake the word) sleeps on.
            let deadline = now + WAIT_NS;
            loop {
                let left = deadline.saturating_sub(now_ns());
                if left == 0 || self.token().load(Acquire) != w {
                    break;
                }
                futex_wait(self.token(), w as u32, left);
            }
        };
        if let Some(t0) = since {
            self.w(pw::WANTS).fetch_sub(1, SeqCst);
            self.w(pw::THROTTLED_NS)
                .fetch_add(now_ns().saturating_sub(t0), Relaxed);
        }
        admitted
    }

    /// Wake the agent's scheduler (one packet; a full queue means it has
    /// wake-ups pending already). A connection that ended marks the gate
    /// dead.
    fn ring(&self) {
        let fd = self.conn.load(Acquire);
        if fd < 0 {
            return;
        }
        // SAFETY: our connection's descriptor; one byte from a live buffer.
        let n = unsafe {
            libc::send(
                fd,
                [1u8].as_ptr().cast(),
                1,
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error().raw_os_error();
            if !matches!(e, Some(libc::EAGAIN | libc::EINTR | libc::ENOBUFS))
                && !self.dead.swap(true, AcqRel)
            {
                tracing::warn!("cgpu: the node agent's scheduler went away: kernel launches pass unscheduled until it is back");
            }
        }
    }

    /// The helper thread: drains this process's work at each hand-over of
    /// its container's slice.
    fn helper_loop(&self) {
        while !self.stop.load(Acquire)
            && !self.dead.load(Acquire)
            && self.generation == fork::current()
        {
            let w = self.token().load(SeqCst);
            let t = Token::unpack(w);
            if t.state == DRAINING
                && t.holder == Some(self.container)
                && self.w(pw::LAUNCHED).load(SeqCst) != self.w(pw::DRAINED).load(SeqCst)
            {
                self.drain();
                continue;
            }
            futex_wait(self.token(), w as u32, 100_000_000);
        }
    }

    fn drain(&self) {
        let deadline = now_ns() + 500_000_000;
        while self.in_launch.load(SeqCst) > 0 && now_ns() < deadline {
            std::thread::sleep(Duration::from_micros(20));
        }
        let launched = self.w(pw::LAUNCHED).load(SeqCst);
        self.ctxs.sync();
        self.w(pw::DRAINED).store(launched, SeqCst);
        self.ring();
    }
}

/// Called by `admit_launch` in secure mode.
#[inline]
pub(super) fn admit_launch() {
    let g = gate();
    if g.is_null() {
        return;
    }
    // SAFETY: gates are leaked when made and never freed.
    if unsafe { &*g }.admit() {
        ADMITTED.with(|a| super::admitted(a, g));
    }
}

/// Called by `launched` in secure mode.
#[inline]
pub(super) fn launched() {
    ADMITTED.with(super::launch_ended);
}

impl super::Admits for SecureGate {
    #[inline]
    fn done(&self) {
        SecureGate::done(self)
    }
}

/// The gate of this launch's GPU, attaching (rate-limited) when there is
/// none of this fork generation yet. Null: launch unscheduled.
#[inline]
fn gate() -> *const SecureGate {
    let several = match SEVERAL.load(Relaxed) {
        -1 => {
            let s = crate::process::gpus::cuda_visible().is_ok_and(|v| v.len() > 1);
            SEVERAL.store(i32::from(s), Relaxed);
            s
        }
        v => v == 1,
    };
    if !several {
        return usable(ONE.load(Acquire)).unwrap_or_else(|| request(MAX_DEVS, None));
    }
    let Some(dev) = current_device() else {
        return std::ptr::null();
    };
    usable(PER_DEV[dev].load(Acquire)).unwrap_or_else(|| request(dev, Some(dev)))
}

/// `Some(p)` when `p` is a live gate of this fork generation; `Some(null)`
/// when launches pass unscheduled for good (at exit); `None` when a gate
/// must be attached (none yet, a parent's, or one whose agent went away).
#[inline(always)]
fn usable(p: *mut SecureGate) -> Option<*const SecureGate> {
    if p.is_null() {
        return None;
    }
    // SAFETY: leaked gates, never freed (only the generation is read of a
    // parent's copy before it is trusted).
    let g = unsafe { &*p };
    if g.generation != fork::current() || g.dead.load(Relaxed) {
        return None;
    }
    if g.stop.load(Relaxed) {
        return Some(std::ptr::null());
    }
    Some(p)
}

fn current_device() -> Option<usize> {
    let get_dev = crate::process::real::cuCtxGetDevice.get()?;
    let mut dev: i32 = -1;
    // SAFETY: the real driver function with a valid out-pointer.
    if unsafe { get_dev(&mut dev) } != 0 {
        return None;
    }
    usize::try_from(dev).ok().filter(|&d| d < MAX_DEVS)
}

/// Ask the attacher thread to attach gate `slot` (a device index, or
/// [`MAX_DEVS`] for the one GPU of a process that sees one) to the
/// scheduler of device `dev` (`None`: the calling thread's context's),
/// unless an attempt began less than [`RETRY_NS`] ago. The launch passes
/// unscheduled meanwhile: the calling thread never waits for the agent.
#[cold]
#[inline(never)]
fn request(slot: usize, dev: Option<usize>) -> *const SecureGate {
    let now = now_ns();
    let generation = fork::generation();
    let next = NEXT_TRY[slot].load(Acquire);
    if TRY_GEN[slot].load(Acquire) == generation && now < next {
        return std::ptr::null();
    }
    // One thread asks; others launch unscheduled meanwhile.
    if NEXT_TRY[slot]
        .compare_exchange(next, now + RETRY_NS, AcqRel, Acquire)
        .is_err()
    {
        return std::ptr::null();
    }
    TRY_GEN[slot].store(generation, Release);
    let Some(dev) = dev.or_else(current_device) else {
        return std::ptr::null();
    };
    REQUEST[slot].store(dev as i32 + 1, Release);
    wake_attacher(generation);
    std::ptr::null()
}

/// Attach requests: per gate slot, the device + 1 (0: none).
static REQUEST: [AtomicI32; MAX_DEVS + 1] = [const { AtomicI32::new(0) }; MAX_DEVS + 1];

/// The attacher thread of this fork generation (started at the first
/// request), woken by each request.
fn wake_attacher(generation: u64) {
    static ATTACHER: parking_lot::Mutex<Option<(u64, std::thread::Thread)>> =
        parking_lot::Mutex::new(None);
    let mut a = ATTACHER.lock();
    match &*a {
        Some((g, t)) if *g == generation => t.unpark(),
        _ => {
            match std::thread::Builder::new()
                .name("cgpu-attach".into())
                .spawn(move || attacher_loop(generation))
            {
                Ok(h) => *a = Some((generation, h.thread().clone())),
                Err(e) => say_once(&format!("cannot start the attaching thread: {e}")),
            }
        }
    }
}

/// Attach what is asked for, until the process exits or forks away.
fn attacher_loop(generation: u64) {
    while generation == fork::current() && !EXITING.load(Acquire) {
        for (slot, req) in REQUEST.iter().enumerate() {
            let r = req.swap(0, AcqRel);
            if r > 0 {
                attach(slot, r as usize - 1);
            }
        }
        std::thread::park_timeout(Duration::from_secs(1));
    }
}

/// Set at exit: nothing is attached any more.
static EXITING: AtomicBool = AtomicBool::new(false);

/// Attach gate `slot` to the scheduler of device `dev` (on the attacher
/// thread: it may wait for the agent).
fn attach(slot: usize, dev: usize) {
    let r = std::panic::catch_unwind(|| -> Result<&'static SecureGate, String> {
        let gpu = crate::memory::cuda_gpu(dev as i32)
            .ok_or("no GPU of this process's context is accounted")?;
        let (sock, uuid, ledger) = gpu
            .secure_sched()
            .ok_or("the node agent has not placed this process on the GPU yet")?;
        // SAFETY: the ledger view is leaked by the memory side (never freed).
        let ledger: &'static Ledger = unsafe { &*(ledger as *const Ledger) };
        make(&sock, uuid, ledger)
    });
    let target = if slot == MAX_DEVS {
        &ONE
    } else {
        &PER_DEV[slot]
    };
    match r {
        Ok(Ok(g)) => {
            target.store(g as *const SecureGate as *mut SecureGate, Release);
            tracing::debug!("cgpu: compute scheduling on (by the node agent)");
        }
        Ok(Err(why)) => say_once(&why),
        Err(_) => say_once("the scheduler's attach panicked"),
    }
}

/// Said once per process: the agent's scheduler stopped looking at a GPU.
fn say_stale() {
    static SAID: AtomicBool = AtomicBool::new(false);
    if !SAID.swap(true, AcqRel) {
        tracing::warn!(
            "cgpu: the node agent's scheduler has not answered for {} s: kernel launches that would wait pass unscheduled until it does",
            AGENT_STALE_NS / 1_000_000_000
        );
    }
}

fn say_once(why: &str) {
    static SAID: AtomicBool = AtomicBool::new(false);
    if !SAID.swap(true, AcqRel) {
        tracing::info!(
            "cgpu: kernel launches are not held back yet: {why} (tried again every second)"
        );
    } else {
        tracing::debug!("cgpu: secure scheduling not attached: {why}");
    }
}

/// Ask the agent for a scheduling page on `uuid`, map it, start the helper.
fn make(
    sock: &std::path::Path,
    uuid: &str,
    ledger: &'static Ledger,
) -> Result<&'static SecureGate, String> {
    let drv = super::driver_ops().ok_or("the driver lacks a context function")?;
    let fd = crate::memory::secure::connect_agent(sock, Duration::from_millis(500))?;
    let close = |why: String| {
        // SAFETY: our descriptor, not published.
        unsafe { libc::close(fd) };
        why
    };
    let req = Request::new(Op::Sched, 1, uuid, 0).ok_or_else(|| close("bad GPU UUID".into()))?;
    let b = req.encode();
    // SAFETY: our connection; `b` holds its length.
    let n = unsafe { libc::send(fd, b.as_ptr().cast(), b.len(), libc::MSG_NOSIGNAL) };
    if n != b.len() as isize {
        return Err(close(format!(
            "cannot ask the node agent: {}",
            std::io::Error::last_os_error()
        )));
    }
    let mut buf = [0u8; REPLY_LEN + 1];
    let (n, fds) = page::recv_fds(fd, &mut buf)
        .map_err(|e| close(format!("no answer from the node agent: {e}")))?;
    let r = Reply::decode(&buf[..n.min(buf.len())])
        .map_err(|e| close(format!("the node agent's answer is not understood: {e}")))?;
    if r.status != Status::Ok {
        return Err(close(format!(
            "the node agent does not schedule this process ({:?})",
            r.status
        )));
    }
    let pf = fds
        .first()
        .ok_or_else(|| close("the node agent sent no scheduling page".into()))?;
    use std::os::fd::AsRawFd;
    if !page::is_sealed_page(pf.as_raw_fd()) {
        return Err(close("the scheduling page is not a sealed page".into()));
    }
    let pg = page::map(pf.as_raw_fd())
        .map_err(|e| close(format!("cannot map the scheduling page: {e}")))?;
    let container = r.container as usize;
    if container >= crate::ledger::MAX_CONTAINERS {
        return Err(close("the node agent named no container".into()));
    }
    let g: &'static SecureGate = Box::leak(Box::new(SecureGate {
        generation: fork::generation(),
        ledger,
        page: pg,
        running_hi: (Token::running(0, container) >> 32) as u32,
        container,
        conn: AtomicI32::new(fd),
        in_launch: AtomicU64::new(0),
        ctxs: Contexts::new(drv),
        stop: AtomicBool::new(false),
        dead: AtomicBool::new(false),
        rung_at: AtomicU64::new(0),
    }));
    std::thread::Builder::new()
        .name("cgpu-sched".into())
        .spawn(move || g.helper_loop())
        .map_err(|e| {
            g.stop.store(true, Release);
            let fd = g.conn.swap(-1, AcqRel);
            // SAFETY: our descriptor, published only in this gate, which
            // is never used (it was not stored anywhere).
            unsafe { libc::close(fd) };
            format!("cannot start the scheduler's thread: {e}")
        })?;
    super::register_handlers();
    Ok(g)
}

fn each(mut f: impl FnMut(&SecureGate)) {
    for p in std::iter::once(&ONE).chain(PER_DEV.iter()) {
        let g = p.load(Acquire);
        if !g.is_null() {
            // SAFETY: leaked gates, never freed.
            f(unsafe { &*g });
        }
    }
}

/// At exit: stop holding launches back and stop the helpers.
pub(super) fn detach() {
    EXITING.store(true, Release);
    each(|g| g.stop.store(true, Release));
}

/// `pthread_atfork` child handler (atomics and `close` only): the parent's
/// scheduling connections are the parent's, closed so that the agent sees
/// the parent's end when it comes; the child attaches anew.
pub fn after_fork_child() {
    each(|g| {
        let fd = g.conn.swap(-1, AcqRel);
        if fd >= 0 {
            // SAFETY: the inherited descriptor of the parent's connection.
            unsafe { libc::close(fd) };
        }
    });
}

/// Context `v` is being destroyed / device `dev`'s primary context is
/// released: the drains forget them.
pub(super) fn forget_context(v: usize) {
    each(|g| g.ctxs.forget(v));
}
pub(super) fn forget_device(dev: i32) {
    each(|g| g.ctxs.forget_device(dev));
}

/// A thread entered (`true`) or left a synchronise call: the holder waits
/// for its GPU work (busy, not idle).
pub(super) fn in_sync(entering: bool) {
    each(|g| {
        if g.generation == fork::current() {
            if entering {
                g.w(pw::SYNCING).fetch_add(1, Relaxed);
            } else {
                // Never below zero (a gate made while the call was in it).
                let _ = g
                    .w(pw::SYNCING)
                    .fetch_update(Relaxed, Relaxed, |v| v.checked_sub(1));
            }
        }
    });
}

/// A secure gate of container slot `container` on `ledger`, writing
/// `page`, with no agent behind it (no connection, no helper thread): the
/// launch benchmark measures its admission beside the cooperative gate's.
#[doc(hidden)]
pub fn gate_for_bench(
    ledger: &'static Ledger,
    page: &'static Page,
    container: usize,
    drv: DriverOps,
) -> &'static SecureGate {
    Box::leak(Box::new(SecureGate {
        generation: fork::generation(),
        ledger,
        page,
        running_hi: (Token::running(0, container) >> 32) as u32,
        container,
        conn: AtomicI32::new(-1),
        in_launch: AtomicU64::new(0),
        ctxs: Contexts::new(drv),
        stop: AtomicBool::new(false),
        dead: AtomicBool::new(false),
        rung_at: AtomicU64::new(0),
    }))
}

/// Make `g` this process's one gate (benchmark).
pub(super) fn install_for_bench(g: &'static SecureGate) {
    SEVERAL.store(0, Relaxed);
    ONE.store(g as *const SecureGate as *mut SecureGate, Release);
}

impl SecureGate {
    /// Admission and its end, as the launch hooks make them (benchmark).
    #[doc(hidden)]
    #[inline]
    pub fn bench_launch(&self) -> bool {
        let a = self.admit();
        if a {
            self.done();
        }
        a
    }

    /// Its page's launches in the slice and time held back (benchmark).
    #[doc(hidden)]
    pub fn page_words(&self) -> (u64, u64) {
        (
            self.w(pw::SLICE_LAUNCHES).load(Relaxed),
            self.w(pw::THROTTLED_NS).load(Relaxed),
        )
    }
}
