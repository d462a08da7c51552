//! Reaping: finding dead processes and containers and giving back what they held.

use super::*;

impl Ledger {
    /// Reclaim the slots and bytes of dead processes and containers without
    /// processes. Returns how many process slots were reclaimed. Waits at
    /// most 2 s for the table lock (returns 0 and logs if it could not).
    pub fn reap(&self) -> usize {
        if !self.needs_reap() {
            return 0;
        }
        match self.lock_table() {
            Ok(_g) => self.reap_locked(),
            Err(e) => {
                tracing::warn!("reap: {e}");
                0
            }
        }
    }

    /// Never blocks: reap if no process reaped in the last `min_interval`
    /// (the timestamp is shared in the header) and the table lock is free
    /// right now. Cheap enough for allocation and meminfo paths.
    pub fn maybe_reap(&self, min_interval: Duration) -> usize {
        let h = &self.file().header;
        let now = crate::clock::monotonic_ns();
        let last = h.last_reap_ns.load(Ordering::Relaxed);
        let due = now < last || now - last >= min_interval.as_nanos() as u64;
        if !due
            || h.last_reap_ns
                .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
        {
            return 0;
        }
        if !self.needs_reap() {
            return 0;
        }
        match self.try_lock_table() {
            Some(_g) => self.reap_locked(),
            None => 0,
        }
    }

    /// For a refused reservation: did a process of `m`'s container die
    /// holding bytes (or mid-operation)? If so, reap now, waiting at most
    /// [`RECLAIM_WAIT`] for the table lock, and return true: the caller
    /// tries once more. Not rate-limited, so a survivor gets a dead
    /// sibling's bytes as soon as the kernel has dropped its liveness lock;
    /// cheap when nothing died (one pass over the slot states, one
    /// `F_OFD_GETLK` per other live process of this container, no lock).
    pub fn reclaim_for(&self, m: &Membership) -> bool {
        let f = self.file();
        let Some(slot) = f.containers.get(m.container) else {
            return false;
        };
        let suspect = slot.suspect.load(Ordering::Acquire) != 0;
        let dead = f.processes.iter().enumerate().any(|(i, p)| {
            i != m.process
                && p.state.load(Ordering::Acquire) == SLOT_LIVE
                && p.container.load(Ordering::Relaxed) as usize == m.container
                && !self.is_alive(i)
        });
        if !dead && !suspect {
            return false;
        }
        match self.lock_table_within(RECLAIM_WAIT) {
            Ok(_g) => {
                let n = self.reap_locked();
                n > 0 || (suspect && slot.suspect.load(Ordering::Acquire) == 0)
            }
            Err(_) => false,
        }
    }

    /// Lock-free pre-check: any dead or half-claimed process slot, a live
    /// container without live processes, or one whose `nprocs` is not its
    /// number of live processes? The last happens when a process dies
    /// inside `reap_locked` after freeing a slot and before the recount (a
    /// process killed while leaving): nothing else would ever correct it.
    pub(crate) fn needs_reap(&self) -> bool {
        let f = self.file();
        let mut live = [0u32; MAX_CONTAINERS];
        for (i, p) in f.processes.iter().enumerate() {
            match p.state.load(Ordering::Acquire) {
                SLOT_FREE => {}
                SLOT_LIVE if self.is_alive(i) => {
                    let c = p.container.load(Ordering::Relaxed) as usize;
                    if c < MAX_CONTAINERS {
                        live[c] += 1;
                    }
                }
                _ => return true,
            }
        }
        f.containers.iter().enumerate().any(|(c, s)| {
            s.state.load(Ordering::Acquire) != SLOT_FREE
                && (live[c] == 0
                    || s.suspect.load(Ordering::Relaxed) != 0
                    || s.nprocs.load(Ordering::Relaxed) != live[c])
        })
    }

    /// Under the table lock (so no join is half-way): free dead and
    /// half-claimed process slots, recount `nprocs`, free containers left
    /// without processes.
    pub(crate) fn reap_locked(&self) -> usize {
        let f = self.file();
        let mut reaped = 0;
        let mut nprocs = [0u32; MAX_CONTAINERS];
        for (i, p) in f.processes.iter().enumerate() {
            match p.state.load(Ordering::Acquire) {
                SLOT_FREE => continue,
                SLOT_LIVE if self.is_alive(i) => {
                    let c = p.container.load(Ordering::Relaxed) as usize;
                    if c < MAX_CONTAINERS {
                        nprocs[c] += 1;
                        continue;
                    }
                    tracing::warn!("process slot {i} names container slot {c}: freed");
                }
                SLOT_LIVE => {}
                _ => tracing::debug!("process slot {i}: claimer died mid-join"),
            }
            tracing::debug!(
                "reaping process slot {i} (pid {}, {} bytes)",
                p.pid.load(Ordering::Relaxed),
                p.used.load(Ordering::Relaxed)
            );
            self.free_process(i);
            reaped += 1;
        }
        for (c, s) in f.containers.iter().enumerate() {
            if s.state.load(Ordering::Acquire) == SLOT_FREE {
                continue;
            }
            s.nprocs.store(nprocs[c], Ordering::Release);
            if nprocs[c] == 0 {
                tracing::debug!("container {} has no process left: slot freed", s.id_str());
                self.free_container(c);
            } else if s.suspect.load(Ordering::Acquire) != 0 {
                self.resync(c);
            }
        }
        reaped
    }

    /// Under the table lock (dead slots already freed): make container `c`'s
    /// `used` exactly the sum of its live processes' `used`
    /// ([`books::recount`], up to 256 looks; the next reap retries).
    pub(crate) fn resync(&self, c: usize) -> bool {
        let s = &self.file().containers[c];
        match books::recount(s, || self.processes_of(c).map(|(_, p)| p), 256) {
            Some((given_back, suspect)) => {
                tracing::info!(
                    "container {}: recounted used after a process died mid-operation ({given_back} bytes given back, at most {suspect} suspected)",
                    s.id_str()
                );
                true
            }
            None => {
                tracing::debug!("container {}: busy, recount postponed", s.id_str());
                false
            }
        }
    }

    /// Is the process in slot `i` alive (its liveness lock held)? A lock held
    /// through this very handle counts as alive.
    pub fn is_alive(&self, i: usize) -> bool {
        let fd = self.probe_fd.load(Ordering::Acquire);
        if i >= MAX_PROCESSES || fd < 0 {
            return false;
        }
        // On an error (cannot happen on a valid fd) say alive: never reap on doubt.
        lock::is_locked(
            fd,
            process_slot_offset(i),
            std::mem::size_of::<ProcessSlot>() as u64,
        )
        .unwrap_or(true)
    }

    /// For a `pthread_atfork` child handler; async-signal-safe (two `close`s
    /// and atomic stores). The child shares the parent's open file
    /// descriptions, hence its locks: keeping them would make the parent look
    /// alive after its death. Closing only drops the child's reference. After
    /// this, the handle must not be used for reserve/release (its
    /// memberships are the parent's); `join`/`reap` return errors or do
    /// nothing; open a new `Ledger` and join again.
    pub fn after_fork_child(&self) {
        self.stale.store(true, Ordering::Release);
        for fd in [&self.fd, &self.probe_fd] {
            let fd = fd.swap(-1, Ordering::AcqRel);
            if fd >= 0 {
                // SAFETY: close(2) is async-signal-safe; the child owns its
                // copy of the descriptor. The parent's locks survive (they go
                // only when the last reference to the description closes).
                unsafe { libc::close(fd) };
            }
        }
    }
}
