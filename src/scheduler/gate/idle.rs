//! The holder's idle gaps: a synchronise call that sees this process's
//! queue empty opens a gap, its next launch closes it; the GPU's time in
//! those gaps (less what guests used) is not charged to the holder. Also
//! the synchronise bookkeeping that tells a holder waiting for its GPU
//! work (busy) from one that stopped launching (idle), and the watcher
//! that hands an idle holder's slice over.

use super::*;

impl Gate {
    /// A thread of this process enters (`true`) or leaves a synchronise call.
    #[inline]
    pub(crate) fn in_sync(&self, enter: bool) {
        let w = &self.file().processes[self.process].sched_in_sync;
        if enter {
            w.fetch_add(1, AcqRel);
        } else {
            // Saturating: a call that began before this gate existed.
            let _ = w.fetch_update(AcqRel, Acquire, |n| n.checked_sub(1));
            self.c(cw::SYNC_AT).store(now_ns(), Release);
        }
    }

    /// Does a process of container `h` that launched in this slice (DRAIN
    /// set) and still answers wait inside a synchronise call? Then its GPU
    /// work is still running: the holder is busy, not idle.
    pub(super) fn holder_busy(&self, h: usize) -> bool {
        let f = self.file();
        let now = now_ns();
        (0..cw::SET_WORDS).any(|wi| {
            let mut bits = f.containers[h].sched[cw::DRAIN + wi].load(Acquire);
            while bits != 0 {
                let p = wi * 64 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                if f.processes[p].sched_in_sync.load(Acquire) > 0 && self.answers(p, now) {
                    return true;
                }
            }
            false
        })
    }

    /// Is container `h` busy with its GPU work: a process of it that
    /// answers is inside a synchronise call, or one returned within the
    /// idle grace?
    pub(super) fn holder_active(&self, h: usize, now: u64) -> bool {
        let f = self.file();
        let at = f.containers[h].sched[cw::SYNC_AT].load(Acquire);
        if at <= now && now - at < IDLE_GRACE_NS {
            return true;
        }
        f.processes.iter().enumerate().any(|(p, ps)| {
            ps.state.load(Acquire) == SLOT_LIVE
                && ps.container.load(Acquire) as usize == h
                && ps.sched_in_sync.load(Acquire) > 0
                && self.answers(p, now)
        })
    }

    /// The holder launches again after its work was seen done: the GPU was
    /// idle for it since then; count that time as not used.
    #[cold]
    #[inline(never)]
    pub(super) fn close_gap(&self) {
        let since = self.c(cw::EMPTY_SINCE).swap(0, AcqRel);
        let now = now_ns();
        if since != 0 && since >= self.g(gw::SLICE_START).load(Acquire) && now > since {
            self.c(cw::IDLE_NS).fetch_add(now - since, AcqRel);
            self.g(gw::GAP_IDLE_NS)
                .fetch_add(self.gap_idle(since, now), AcqRel);
        }
    }

    /// Of the holder's gap from `since` to `now`, the time no guest held
    /// the seat: the GPU had no work then.
    pub(super) fn gap_idle(&self, since: u64, now: u64) -> u64 {
        let gap = now.saturating_sub(since);
        let seated = self
            .seat_time(now)
            .wrapping_sub(self.g(gw::GAP_SEAT0).load(Acquire));
        gap - seated.min(gap)
    }

    /// A gap of the holder begins at `at`.
    pub(super) fn open_gap(&self, at: u64) {
        self.g(gw::GAP_SEAT0).store(self.seat_time(at), Release);
    }

    /// A synchronise call of a thread of this process begins.
    pub fn sync_began(&self) -> SyncStart {
        SyncStart {
            token: self.token().load(SeqCst),
            launches: self.c(cw::SLICE_LAUNCHES).load(SeqCst),
            guests: self.guest_launches.load(SeqCst),
        }
    }

    /// A synchronise call that began at `b` returned `rc` after waiting for
    /// `what`. When it succeeded, this process's queue is then empty (a
    /// context, or the only stream it launched on), no launch of its
    /// container was admitted meanwhile and no other process of it launched
    /// in this slice, the GPU is idle for the holder from now until its
    /// next launch: that time is not charged to it.
    pub fn sync_returned(&self, b: SyncStart, rc: CUresult, what: Synced) {
        if rc != 0 {
            return;
        }
        let empty = match what {
            Synced::Context => true,
            Synced::Stream(s) => self.last_stream.load(Relaxed) == launch_key(s),
        };
        if !empty {
            return;
        }
        self.empty_at.store(now_ns(), Release);
        self.last_stream.store(NO_STREAM, Relaxed);
        if self.guest_since.load(Acquire) != 0
            && self.in_launch.load(SeqCst) == 0
            && self.guest_launches.load(SeqCst) == b.guests
        {
            // Its work as a guest is done: charge it.
            self.guest_done(now_ns(), true);
        }
        let t = Token::unpack(b.token);
        let alone = (0..cw::SET_WORDS).all(|wi| {
            let bits = self.c(cw::DRAIN + wi).load(Acquire);
            if wi == self.process / 64 {
                bits & !(1u64 << (self.process % 64)) == 0
            } else {
                bits == 0
            }
        });
        if t.state == RUNNING
            && t.holder == Some(self.container)
            && alone
            && self.in_launch.load(SeqCst) == 0
            && self.c(cw::SLICE_LAUNCHES).load(SeqCst) == b.launches
            && self.token().load(SeqCst) == b.token
        {
            let now = now_ns();
            let empty = self
                .c(cw::EMPTY_SINCE)
                .compare_exchange(0, now, AcqRel, Acquire)
                .is_ok();
            if empty {
                self.open_gap(now);
            }
            if empty
                && self.g(gw::GUEST_SEAT).load(Acquire) == 0
                && self.others_want(Some(self.container))
            {
                // The holder's queue is empty and nobody runs beside it: a
                // waiting container may fill the gap as its guest (see
                // `guest`).
                futex_wake(self.token());
            }
        }
    }

    /// Time of the slice that began at `start` during which its holder (one
    /// process: `drained` processes launched in it) had no work queued,
    /// up to `now`, and the part of it no guest held the seat (the GPU's
    /// idle time); taken out of the words (0 for several processes: one's
    /// idle time may be another's busy time).
    pub(super) fn unused(
        &self,
        cs: &[AtomicU64],
        start: u64,
        now: u64,
        drained: u64,
    ) -> (u64, u64) {
        self.gaps(cs, start, now, drained, true)
    }

    /// As [`Gate::unused`]; the words are taken out of the ledger when
    /// `take`, else only read (a process's part of the slice, charged
    /// before the decision that takes them).
    pub(super) fn gaps(
        &self,
        cs: &[AtomicU64],
        start: u64,
        now: u64,
        drained: u64,
        take: bool,
    ) -> (u64, u64) {
        let read = |w: &AtomicU64| {
            if take {
                w.swap(0, AcqRel)
            } else {
                w.load(Acquire)
            }
        };
        let since = read(&cs[cw::EMPTY_SINCE]);
        let mut idle = read(&cs[cw::IDLE_NS]);
        let mut gap_idle = read(self.g(gw::GAP_IDLE_NS));
        if drained > 1 {
            return (0, 0);
        }
        if since != 0 && since >= start && now > since {
            idle = idle.saturating_add(now - since);
            gap_idle = gap_idle.saturating_add(self.gap_idle(since, now));
        }
        let idle = idle.min(now.saturating_sub(start));
        (idle, gap_idle.min(idle))
    }
}

/// What one waiting thread (or a helper) remembers between looks.
#[derive(Default, Clone, Copy)]
pub(super) struct Watch {
    seq: Option<u32>,
    count: u64,
    since: u64,
    /// This wait already decided once from IDLE.
    pub(super) arrived: bool,
}

impl Watch {
    /// The holder `h` of RUNNING slice `t` has made no launch and had no
    /// synchronise call return (its counters unchanged) for the idle grace.
    /// A returning synchronise call counts as a sign of life because a
    /// loop that waits for its kernels and then works on the host has
    /// launched nothing during that host work: counted from its last
    /// launch alone, it would look idle in every host gap and lose its
    /// slice after a kernel or two.
    pub(super) fn idle(&mut self, t: Token, h: &ContainerSlot, now: u64) -> bool {
        let cnt = h.sched[cw::SLICE_LAUNCHES]
            .load(Relaxed)
            .wrapping_add(h.sched[cw::SYNC_AT].load(Acquire));
        if self.seq != Some(t.seq) || self.count != cnt {
            *self = Watch {
                seq: Some(t.seq),
                count: cnt,
                since: now,
                ..*self
            };
            false
        } else {
            now.saturating_sub(self.since) >= IDLE_GRACE_NS
        }
    }
}

/// What the holder of a slice did not use, ns: what its guests were
/// charged (their work ran beside or between its own) and the GPU's idle
/// time in its gaps (`gap_idle`: it had nothing queued and no guest held
/// the seat), of `unused`, the whole of its gaps. That is the sum of the
/// two, kept at least the larger of `unused` and `guests` (the seat's
/// tenure overstates a guest's part of a gap: its wake-up after its work
/// is in it) and at most their sum (guest work wholly outside the gaps).
/// Taking only the larger of the two as unused would make the holder pay
/// for the smaller: the GPU's idle time in its gaps, or guest work that
/// ran beside its own.
pub(super) fn not_used(unused: u64, guests: u64, gap_idle: u64) -> u64 {
    guests
        .saturating_add(gap_idle.min(unused))
        .clamp(unused.max(guests), unused.saturating_add(guests))
}

#[cfg(test)]
mod tests {
    use super::not_used;

    const MS: u64 = 1_000_000;

    #[test]
    fn a_holder_leaves_its_guests_time_and_the_idle_part_of_its_gaps() {
        // Guests filled its 0.3 ms of gaps and ran 1.7 ms beside its work.
        assert_eq!(not_used(3 * MS / 10, 2 * MS, 0), 2 * MS);
        // The same guests, but its gaps stayed idle: both come off.
        assert_eq!(not_used(3 * MS / 10, 2 * MS, 3 * MS / 10), 23 * MS / 10);
        // No guests: its gaps, idle.
        assert_eq!(not_used(MS, 0, MS), MS);
    }

    #[test]
    fn what_a_holder_leaves_stays_between_the_larger_and_the_sum() {
        // The seat's time overstated the guest's part of the gaps.
        assert_eq!(not_used(MS, MS / 5, 0), MS);
        // Idle time measured beyond the gaps counts the gaps only.
        assert_eq!(not_used(MS, MS / 5, 5 * MS), MS + MS / 5);
        // Corrupt words never overflow.
        assert_eq!(not_used(u64::MAX, u64::MAX, u64::MAX), u64::MAX);
    }
}
