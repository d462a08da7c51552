//! The library's one clock, in nanoseconds, on the two kernel clocks it
//! needs:
//!
//! - [`monotonic_ns`] (`CLOCK_MONOTONIC`): for intervals and deadlines, and
//!   for every timestamp written into a ledger word that other processes
//!   compare with their own reading (the scheduler's token, reap
//!   intervals). One clock for every process on the host, whatever its PID
//!   namespace, never set back.
//! - [`realtime_ns`] (`CLOCK_REALTIME`): wall time, for records people read
//!   (when a ledger or a container slot was made, a report's timestamp, a
//!   file set aside).

fn read(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; both clock ids exist on
    // every Linux kernel (the call cannot fail with them).
    unsafe { libc::clock_gettime(clock, &mut ts) };
    (ts.tv_sec as u64)
        .saturating_mul(1_000_000_000)
        .saturating_add(ts.tv_nsec as u64)
}

/// `CLOCK_MONOTONIC` in ns.
#[inline]
pub fn monotonic_ns() -> u64 {
    read(libc::CLOCK_MONOTONIC)
}

/// `CLOCK_REALTIME` in ns since the Unix epoch.
#[inline]
pub fn realtime_ns() -> u64 {
    read(libc::CLOCK_REALTIME)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_two_clocks() {
        let a = monotonic_ns();
        let b = monotonic_ns();
        assert!(b >= a);
        let wall = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        let r = realtime_ns();
        assert!(r.abs_diff(wall) < 5_000_000_000, "{r} vs {wall}");
    }
}
