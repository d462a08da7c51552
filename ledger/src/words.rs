//! Names of the scheduler's words in the ledger (`LedgerHeader::sched`,
//! `ContainerSlot::sched`) and the packing of the token word.
//!
//! All words are `AtomicU64`; signed quantities are stored as `i64 as u64`.
//! Times are `CLOCK_MONOTONIC` nanoseconds (one clock for every process on
//! the host, whatever its PID namespace).
//!
//! The readers at the end ([`waiting`], [`limit_percent`], ...) say what
//! the words mean for one container; any process or tool may call them.

use self::container as cw;
use crate::policy;
use crate::{ContainerSlot, LedgerFile, MAX_CONTAINERS, SLOT_LIVE};
use std::sync::atomic::Ordering::Relaxed;

/// Per-GPU words (`LedgerHeader::sched[..]`).
pub mod gpu {
    /// The token: who holds the GPU and in which state (see [`super::Token`]).
    /// Its low 32 bits (the sequence number, changed by every transition)
    /// are the futex word every waiter sleeps on.
    pub const TOKEN: usize = 0;
    /// When the current slice (or the current decision) started.
    pub const SLICE_START: usize = 1;
    /// Time budget of the current slice, ns.
    pub const SLICE_BUDGET: usize = 2;
    /// Launches the current holder may make in this slice (queue bound).
    pub const SLICE_ALLOW: usize = 3;
    /// Last time the buckets were refilled.
    pub const LAST_REFILL: usize = 4;
    /// While IDLE: the earliest time a waiting container becomes eligible.
    pub const IDLE_UNTIL: usize = 5;
    /// When the current DRAINING or DECIDING state began.
    pub const STATE_SINCE: usize = 6;
    /// GPU time charged to all containers, ns.
    pub const BUSY_NS: usize = 7;
    /// Slices granted on this GPU.
    pub const SLICES: usize = 8;
    /// `knob_generation` seen by the last decision (informational).
    pub const KNOB_GEN_SEEN: usize = 9;
    /// Processes in the holder's DRAIN set when its slice ended (each is
    /// charged an equal part of the slice in its own process slot).
    pub const DRAIN_COUNT: usize = 10;
    /// GPU time charged to guests (containers running beside the holder)
    /// during the current slice, ns: not the holder's (see
    /// `Gate::charge_slice`). Emptied at each slice's charge.
    pub const GUEST_IN_SLICE: usize = 11;
    /// The guest seat: 1 + the process slot of the one process that runs
    /// beside the holder now (0: free), and since when (see `Gate::guest`).
    pub const GUEST_SEAT: usize = 12;
    pub const GUEST_SEAT_AT: usize = 13;
    /// Host time the guest seat was held, ns: a running sum (wrapping) of
    /// its closed tenures (see `Gate::seat_time`).
    pub const GUEST_SEAT_NS: usize = 14;
    /// The seat's time (`Gate::seat_time`) when the holder's current gap
    /// began (its container's `EMPTY_SINCE`): the time a guest held the seat
    /// in the gap is what it has grown by since.
    pub const GAP_SEAT0: usize = 15;
    /// The holder's closed gaps in the current slice less the time a guest
    /// held the seat in them, ns: the GPU's idle time in the slice, as far
    /// as measured (no work of the holder's queued, no guest's running).
    pub const GAP_IDLE_NS: usize = 16;
    /// Bit set of container slots that arrived with weight 0 because no
    /// weight was free ([`WEIGHTLESS_WORDS`] words): any of their processes
    /// takes weight 1 by itself once one frees up (see
    /// [`super::note_arrival`]). A weight 0 an operator set is not in it.
    pub const WEIGHTLESS: usize = 17;
    pub const WEIGHTLESS_WORDS: usize = crate::MAX_CONTAINERS / 64;
    /// Secure mode: when the node agent's scheduler last looked at the GPU
    /// (`CLOCK_MONOTONIC` ns, at least every 100 ms while it runs). A
    /// waiting process that sees it stale launches unscheduled rather than
    /// wait for a scheduler that does not answer.
    pub const AGENT_BEAT: usize = WEIGHTLESS + WEIGHTLESS_WORDS;
}

/// Per-container words (`ContainerSlot::sched[..]`).
pub mod container {
    /// GPU time charged to the container, ns (slice start → drain complete).
    pub const GPU_NS: usize = 0;
    /// Time its threads spent held back in launch hooks, ns (summed over threads).
    pub const THROTTLED_NS: usize = 1;
    /// Launches admitted (counted per slice, added at the slice's end).
    pub const LAUNCHES: usize = 2;
    /// Token bucket, ns of GPU time (`i64`; negative = deficit).
    pub const TOKENS: usize = 3;
    /// Estimated GPU ns per launch (EWMA), for the queue bound.
    pub const NS_PER_LAUNCH: usize = 4;
    /// Launch attempts in the current slice (fast path counter).
    pub const SLICE_LAUNCHES: usize = 5;
    /// Slices it was granted.
    pub const SLICES: usize = 6;
    /// Bit set of process slots with a thread waiting to launch (`SET_WORDS` words).
    pub const WANT: usize = 7;
    /// Bit set of process slots that launched in the current slice and must
    /// drain before the GPU changes hands (`SET_WORDS` words).
    pub const DRAIN: usize = WANT + SET_WORDS;
    /// GPU time of work that was seen to have run after its drain had been
    /// given up on (a process that stopped answering), ns: charged to the
    /// bucket at the next decision.
    pub const OWED_NS: usize = DRAIN + SET_WORDS;
    /// While the container holds the GPU with one process launching: when
    /// that process's queued work was last seen done (a synchronise call
    /// returned with no launch meanwhile) and it has launched nothing since,
    /// ns; 0 = it has work queued (or not known).
    pub const EMPTY_SINCE: usize = OWED_NS + 1;
    /// Closed periods of [`EMPTY_SINCE`] in the current slice, ns: GPU time
    /// the holder held but did not use (not charged to it).
    pub const IDLE_NS: usize = OWED_NS + 2;
    /// When a synchronise call of one of its processes last returned, ns:
    /// a holder that just got its results back is about to launch again,
    /// not idle.
    pub const SYNC_AT: usize = OWED_NS + 3;
    /// GPU time charged for work its processes ran beside another
    /// container's slice (as a guest: it used less than its share), ns, not
    /// yet taken from its bucket (the next decision does).
    pub const GUEST_NS: usize = OWED_NS + 4;
    /// Its recent use of the GPU: charged ns per ns (`f64` bits), a moving
    /// average over about a second, updated at [`RATE_AT`] when `GPU_NS`
    /// was [`RATE_NS`].
    pub const RATE: usize = OWED_NS + 5;
    pub const RATE_AT: usize = OWED_NS + 6;
    pub const RATE_NS: usize = OWED_NS + 7;
    /// GPU time charged for its last slice, ns (0: none yet): a container
    /// that fills its slices is busy, never a guest.
    pub const LAST_SLICE_NS: usize = OWED_NS + 8;
    /// Words of a process bit set (one bit per process slot).
    pub const SET_WORDS: usize = crate::MAX_PROCESSES / 64;
}

/// A process's join was a claim of container slot `c` with no other
/// process in it (`nprocs` 1, claimed within the last second): record in
/// the GPU's [`gpu::WEIGHTLESS`] set whether it arrived with weight 0 (the
/// ledger gives weight 0 at a claim only when none is free). Any other
/// join leaves the set alone: a process that joins a container claimed
/// earlier and finds weight 0 cannot tell an operator's 0 from an
/// arrival's, and leaving it alone never takes a weight an operator took
/// away.
pub fn note_arrival(f: &crate::LedgerFile, c: usize) {
    use std::sync::atomic::Ordering::{AcqRel, Acquire};
    let Some(slot) = f.containers.get(c) else {
        return;
    };
    let now = crate::clock::realtime_ns();
    let created = slot.created_ns.load(Acquire);
    if slot.nprocs.load(Acquire) != 1 || created > now || now - created > 1_000_000_000 {
        return;
    }
    let (word, bit) = weightless_bit(c);
    if slot.weight.load(Acquire) == 0 {
        f.header.sched[word].fetch_or(bit, AcqRel);
    } else {
        f.header.sched[word].fetch_and(!bit, AcqRel);
    }
}

/// Container slot `c`'s word and bit in [`gpu::WEIGHTLESS`].
#[inline]
pub fn weightless_bit(c: usize) -> (usize, u64) {
    (gpu::WEIGHTLESS + c / 64, 1u64 << (c % 64))
}

/// Token states.
pub const IDLE: u8 = 0;
pub const RUNNING: u8 = 1;
pub const DRAINING: u8 = 2;
pub const DECIDING: u8 = 3;

/// The token word unpacked: `seq` (bits 0..32) | `state` (32..40) |
/// `holder + 1` (40..48, 0 = none) | `aux` (48..64: process slot + 1 of the
/// decider while DECIDING).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Token {
    pub seq: u32,
    pub state: u8,
    pub holder: Option<usize>,
    pub aux: Option<usize>,
}

impl Token {
    #[inline]
    pub fn unpack(w: u64) -> Token {
        let h = ((w >> 40) & 0xff) as usize;
        let a = (w >> 48) as usize;
        Token {
            seq: w as u32,
            state: (w >> 32) as u8,
            holder: h.checked_sub(1),
            aux: a.checked_sub(1),
        }
    }
    #[inline]
    pub fn pack(self) -> u64 {
        let h = self.holder.map_or(0, |h| (h as u64 + 1) & 0xff);
        let a = self.aux.map_or(0, |a| (a as u64 + 1) & 0xffff);
        self.seq as u64 | (self.state as u64) << 32 | h << 40 | a << 48
    }
    /// The word a holder's fast path compares against: RUNNING by `c` at `seq`.
    #[inline]
    pub fn running(seq: u32, c: usize) -> u64 {
        Token {
            seq,
            state: RUNNING,
            holder: Some(c),
            aux: None,
        }
        .pack()
    }
    /// The holder as a container slot index, if it is one: the word is
    /// shared memory that any process can write, so every use as an index
    /// goes through here.
    #[inline]
    pub fn holder_slot(&self) -> Option<usize> {
        self.holder.filter(|&h| h < crate::MAX_CONTAINERS)
    }
    /// The next state, with the sequence number advanced.
    #[inline]
    pub fn next(self, state: u8, holder: Option<usize>, aux: Option<usize>) -> Token {
        Token {
            seq: self.seq.wrapping_add(1),
            state,
            holder,
            aux,
        }
    }
}

/// The token's transitions. Each takes the word from exactly the token a
/// thread saw (`t`) by one compare-and-swap, so of the threads of all
/// processes that saw the same token at most one moves it; a thread that
/// loses looks again. A thread that takes the DECIDING state owns it:
/// only it moves the token out of its DECIDING word, unless it stopped
/// answering and another took over (a newer DECIDING word, which the
/// owner's final compare-and-swap then finds: it changes nothing).
pub mod transition {
    use super::*;
    use crate::sync::{point, AtomicU64, Ordering::SeqCst};

    /// Move `word` from exactly `from` to `to`; false when it was no longer `from`.
    #[inline]
    pub fn cas(word: &AtomicU64, from: Token, to: Token) -> bool {
        word.compare_exchange(from.pack(), to.pack(), SeqCst, SeqCst)
            .is_ok()
    }

    /// RUNNING → DRAINING (only from exactly `t`): the holder's slice ends.
    /// The DRAINING token, if this thread moved it.
    #[inline]
    pub fn end_slice(word: &AtomicU64, t: Token) -> Option<Token> {
        let next = t.next(DRAINING, t.holder, None);
        cas(word, t, next).then_some(next)
    }

    /// Anything → IDLE, nobody holding (only from exactly `t`).
    #[inline]
    pub fn void(word: &AtomicU64, t: Token) -> bool {
        cas(word, t, t.next(IDLE, None, None))
    }

    /// Decide the next holder: take the DECIDING state from exactly `t`
    /// (DRAINING, IDLE, or a DECIDING whose owner stopped answering) for
    /// process slot `me`, run `choose` on the DECIDING token taken (it
    /// charges the slice that ended and returns the next token, made with
    /// [`Token::next`] from it), and publish its choice unless another
    /// took the state over meanwhile. `None`: `t` was gone; else the
    /// token chosen and whether it was published.
    pub fn decide(
        word: &AtomicU64,
        t: Token,
        me: usize,
        choose: impl FnOnce(Token) -> Token,
    ) -> Option<(Token, bool)> {
        let mine = t.next(DECIDING, None, Some(me));
        if !cas(word, t, mine) {
            return None;
        }
        point();
        let next = choose(mine);
        point();
        Some((next, cas(word, mine, next)))
    }

    /// How a renewal ended (see [`renew`]).
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Renewal {
        /// The token was not `t` any more: nothing changed.
        Gone,
        /// Renewed: the token is `t` again, its slice started afresh.
        Renewed,
        /// Out of credit: the slice ended (DRAINING, charged so far).
        Ended,
    }

    /// What the renewal's work says (see [`renew`]).
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub enum Renew {
        Renewed,
        Ended,
    }

    /// Renew the RUNNING slice `t` in place for its holder: take a
    /// DECIDING state that names the holder (its threads go on
    /// launching), do `work` (charge, refill, start a new slice), then put
    /// back exactly `t` (so that what was registered against `t` stays
    /// valid), or, out of credit, end the slice: DRAINING at the DECIDING
    /// state's sequence number. Nothing is put back when another took
    /// the state over meanwhile.
    pub fn renew(word: &AtomicU64, t: Token, me: usize, work: impl FnOnce() -> Renew) -> Renewal {
        let mine = t.next(DECIDING, t.holder, Some(me));
        if t.state != RUNNING || !cas(word, t, mine) {
            return Renewal::Gone;
        }
        point();
        let r = work();
        point();
        match r {
            Renew::Renewed => {
                cas(word, mine, t);
                Renewal::Renewed
            }
            Renew::Ended => {
                let draining = Token {
                    state: DRAINING,
                    aux: None,
                    ..mine
                };
                cas(word, mine, draining);
                Renewal::Ended
            }
        }
    }
}

// ---- What the words say, for any process or tool ----

/// Per-container compute counters kept in the ledger.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ContainerSchedStats {
    /// GPU time charged to the container since it joined, ns.
    pub gpu_time_ns: u64,
    /// Time its threads spent held back in launch hooks, ns (summed over threads).
    pub throttled_ns: u64,
    /// Launches admitted.
    pub launches: u64,
}

/// Counters of one container slot.
pub fn container_stats(slot: &ContainerSlot) -> ContainerSchedStats {
    ContainerSchedStats {
        gpu_time_ns: slot.sched[cw::GPU_NS].load(Relaxed),
        throttled_ns: slot.sched[cw::THROTTLED_NS].load(Relaxed),
        launches: slot.sched[cw::LAUNCHES].load(Relaxed),
    }
}

/// Why a container's launches are held back now, for the tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waiting {
    /// A thread of it waits for its turn on the GPU.
    Turn,
    /// A thread of it waits and it has compute weight 0 (it arrived when
    /// `free_weight` was 0, or an operator set it): it waits until an
    /// operator gives it weight.
    NoWeight,
}

impl Waiting {
    /// One line for operators.
    pub fn reason(self) -> &'static str {
        match self {
            Waiting::Turn => "waiting for its turn",
            Waiting::NoWeight => {
                "waiting: weight 0 (free_weight was 0 when it arrived, or set to 0)"
            }
        }
    }
}

/// Does container slot `container` wait to launch now, and why (`None`: it
/// holds the GPU, or no thread of it waits)? Read from the ledger's WANT
/// set and weight; any process may call it.
pub fn waiting(file: &LedgerFile, container: usize) -> Option<Waiting> {
    let s = file.containers.get(container)?;
    if s.state.load(Relaxed) != SLOT_LIVE {
        return None;
    }
    let wants = (0..cw::SET_WORDS).any(|i| s.sched[cw::WANT + i].load(Relaxed) != 0);
    if !wants {
        return None;
    }
    if s.weight.load(Relaxed) == 0 {
        return Some(Waiting::NoWeight);
    }
    let t = Token::unpack(file.header.sched[gpu::TOKEN].load(Relaxed));
    if t.state == RUNNING && t.holder_slot() == Some(container) {
        None
    } else {
        Some(Waiting::Turn)
    }
}

/// The GPU's knobs, range-clamped.
pub fn knobs(file: &LedgerFile) -> policy::Knobs {
    let h = &file.header;
    policy::Knobs::sanitized(
        h.policy.load(Relaxed),
        h.max_inst.load(Relaxed),
        h.prio_ratio.load(Relaxed),
    )
}

/// The compute limit, in percent of the GPU, that the GPU's policy and the
/// container's weight give container slot `container` right now, counting
/// every live container as busy (what `cgpu-smi` shows as "Limit").
pub fn limit_percent(file: &LedgerFile, container: usize) -> u32 {
    let mut ms = [policy::Member::default(); MAX_CONTAINERS];
    for (i, s) in file.containers.iter().enumerate() {
        ms[i] = policy::Member {
            live: s.state.load(Relaxed) == SLOT_LIVE,
            weight: s.weight.load(Relaxed),
            highprio: s.highprio.load(Relaxed) != 0,
            active: false,
        };
    }
    policy::limit_percent(&knobs(file), &ms, container)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_round_trips() {
        for t in [
            Token {
                seq: 0,
                state: IDLE,
                holder: None,
                aux: None,
            },
            Token {
                seq: u32::MAX,
                state: RUNNING,
                holder: Some(31),
                aux: None,
            },
            Token {
                seq: 7,
                state: DECIDING,
                holder: None,
                aux: Some(255),
            },
            Token {
                seq: 9,
                state: DRAINING,
                holder: Some(0),
                aux: Some(0),
            },
        ] {
            assert_eq!(Token::unpack(t.pack()), t);
        }
        // A zeroed ledger reads as IDLE, nobody holding.
        assert_eq!(
            Token::unpack(0),
            Token {
                seq: 0,
                state: IDLE,
                holder: None,
                aux: None
            }
        );
        assert_eq!(
            Token::running(5, 3),
            Token {
                seq: 5,
                state: RUNNING,
                holder: Some(3),
                aux: None
            }
            .pack()
        );
        assert_eq!(container::DRAIN + container::SET_WORDS, container::OWED_NS);
        const { assert!(container::LAST_SLICE_NS < crate::SCHED_CONTAINER_WORDS) };
        const { assert!(gpu::WEIGHTLESS + gpu::WEIGHTLESS_WORDS <= crate::SCHED_GPU_WORDS) };
        const { assert!(gpu::AGENT_BEAT < crate::SCHED_GPU_WORDS) };
        const { assert!(gpu::DRAIN_COUNT < crate::SCHED_GPU_WORDS) };
        // Any process may write the token: an out-of-range holder is no slot.
        let last = crate::MAX_CONTAINERS - 1;
        let t = Token::unpack(Token::running(1, last) + (1u64 << 40));
        assert_eq!(t.holder, Some(last + 1));
        assert_eq!(t.holder_slot(), None);
        assert_eq!(Token::unpack(Token::running(1, 254)).holder_slot(), None);
        let t = Token::unpack(Token::running(1, last));
        assert_eq!(t.holder_slot(), Some(last));
        // The holder field (8 bits, holder + 1) can name every slot.
        const { assert!(crate::MAX_CONTAINERS < 0xff) };
    }
}
