//! A process's request to join a container, and its membership once joined.

use super::*;

/// What a process asks for when it joins a GPU's ledger.
#[derive(Debug, Clone)]
pub struct JoinRequest<'a> {
    /// The container's name (written when the process claims its slot).
    pub container_id: &'a str,
    /// The container's identity key (`crate::identity`); 0: known by its
    /// name alone ([`crate::identity::key_of_name`]).
    pub key: u64,
    /// Bytes. 0 = none set: the GPU's `default_memsize` applies (itself 0 =
    /// not limited); [`QUOTA_UNLIMITED`] = explicitly not limited. Only the
    /// container's first joiner sets it; later joiners' values are ignored
    /// (`cgpuctl set memsize` changes it).
    pub quota: u64,
    /// Requested compute weight (1..=max_inst).
    pub weight: u32,
    pub highprio: bool,
    /// `CGPU_DISABLE`: record usage without enforcing.
    pub enforce_off: bool,
}

/// This process's place in one ledger: its container and process slot. Holds
/// the liveness lock for as long as it lives.
///
/// It also counts the reservations of this process's threads that are in
/// flight, so that [`Ledger::leave`] (run by an exit handler while other
/// threads may still allocate) waits for them and no reservation writes
/// into a slot after it was freed (and perhaps claimed by someone else).
#[derive(Debug)]
pub struct Membership {
    pub container: usize,
    pub process: usize,
    /// Reserve/release calls in flight through this membership.
    pub(crate) inflight: AtomicU32,
    /// Reserve/release calls entered so far (wrapping): lets the watcher
    /// tell that none started while it looked (`books::repair_own`).
    pub(crate) entered: AtomicU32,
    /// Set by `leave`: later reservations are refused, releases ignored.
    pub(crate) left: AtomicBool,
}

impl Membership {
    pub(crate) fn new(container: usize, process: usize) -> Self {
        Membership {
            container,
            process,
            inflight: AtomicU32::new(0),
            entered: AtomicU32::new(0),
            left: AtomicBool::new(false),
        }
    }
    /// True once `leave` ran: the slot is no longer this process's.
    pub fn has_left(&self) -> bool {
        self.left.load(Ordering::SeqCst)
    }
    /// Stop charging through this membership (its ledger is being given
    /// up): later reservations are refused, and the ones in flight finish
    /// before this returns (waiting at most [`LEAVE_WAIT`]).
    pub fn retire(&self) {
        self.left.store(true, Ordering::SeqCst);
        crate::sync::fence(Ordering::SeqCst); // see `enter`
        let t0 = std::time::Instant::now();
        while self.inflight.load(Ordering::SeqCst) != 0 && t0.elapsed() < LEAVE_WAIT {
            crate::sync::yield_now();
        }
    }
    /// Enter a reserve/release; `None` once left. The pair (increment,
    /// then read `left`) against `leave`'s (set `left`, then read the
    /// count), each with a `SeqCst` fence between its two accesses, makes
    /// sure one of the two sees the other.
    #[inline]
    pub(crate) fn enter(&self) -> Option<InFlight<'_>> {
        if self.left.load(Ordering::Relaxed) {
            return None; // cheap early out; the check below is the one that counts
        }
        self.inflight.fetch_add(1, Ordering::SeqCst);
        self.entered.fetch_add(1, Ordering::SeqCst);
        crate::sync::fence(Ordering::SeqCst);
        let g = InFlight(&self.inflight);
        if self.left.load(Ordering::SeqCst) {
            return None; // `g` drops: count restored
        }
        Some(g)
    }
}

/// One reserve/release in flight (see [`Membership`]).
pub(crate) struct InFlight<'a>(&'a AtomicU32);

impl Drop for InFlight<'_> {
    #[inline]
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl JoinRequest<'_> {
    /// The identity key: [`JoinRequest::key`], or the name's.
    pub fn key(&self) -> u64 {
        match self.key {
            0 => crate::identity::key_of_name(self.container_id),
            k => k,
        }
    }
}
