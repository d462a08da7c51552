//! `fcntl` open-file-description (OFD) record locks on byte ranges of the
//! ledger file.
//!
//! OFD locks belong to the open file description, not to the process: the
//! kernel drops them when the last descriptor referring to it is closed, which
//! includes the death of the process by any signal, in any PID namespace.
//! Two descriptors obtained by two `open` calls never share locks, even in one
//! process; descriptors shared by `fork`/`dup` do (see `after_fork_child`).

use std::io;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

/// Longest a slot-table operation waits for the table lock.
pub(crate) const TABLE_LOCK_TIMEOUT: Duration = Duration::from_secs(2);

fn flock(kind: libc::c_int, start: u64, len: u64) -> libc::flock {
    // SAFETY: `flock` is plain old data; all-zero is a valid value (and l_pid
    // must be 0 for OFD locks).
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = start as libc::off_t;
    fl.l_len = len as libc::off_t;
    fl
}

fn fcntl_lock(fd: RawFd, cmd: libc::c_int, fl: &mut libc::flock) -> io::Result<()> {
    loop {
        // SAFETY: `fl` is a valid, exclusively borrowed `struct flock`; the
        // kernel reads (and for GETLK writes) exactly that struct.
        let rc = unsafe { libc::fcntl(fd, cmd, fl as *mut libc::flock) };
        if rc == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINTR) {
            return Err(err);
        }
    }
}

/// Try once to take a write lock on `[start, start+len)` (`len` 0 = to the
/// end of the file and beyond). `Ok(false)`: another description holds a
/// conflicting lock.
pub(crate) fn try_lock(fd: RawFd, start: u64, len: u64) -> io::Result<bool> {
    let mut fl = flock(libc::F_WRLCK, start, len);
    match fcntl_lock(fd, libc::F_OFD_SETLK, &mut fl) {
        Ok(()) => Ok(true),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EACCES)) => Ok(false),
        Err(e) => Err(e),
    }
}

/// Release the range (no-op when not held). Async-signal-safe.
pub(crate) fn unlock(fd: RawFd, start: u64, len: u64) -> io::Result<()> {
    let mut fl = flock(libc::F_UNLCK, start, len);
    fcntl_lock(fd, libc::F_OFD_SETLK, &mut fl)
}

/// Does any other open file description hold a lock overlapping the range?
/// Locks held through `fd`'s own description never count.
pub(crate) fn is_locked(fd: RawFd, start: u64, len: u64) -> io::Result<bool> {
    let mut fl = flock(libc::F_WRLCK, start, len);
    fcntl_lock(fd, libc::F_OFD_GETLK, &mut fl)?;
    Ok(fl.l_type != libc::F_UNLCK as libc::c_short)
}

/// One lock another open file description holds overlapping the range, as
/// `(start, len)` (`len` 0: to the end of the file); `None`: none.
pub(crate) fn held_lock(fd: RawFd, start: u64, len: u64) -> io::Result<Option<(u64, u64)>> {
    let mut fl = flock(libc::F_WRLCK, start, len);
    fcntl_lock(fd, libc::F_OFD_GETLK, &mut fl)?;
    Ok((fl.l_type != libc::F_UNLCK as libc::c_short)
        .then_some((fl.l_start.max(0) as u64, fl.l_len.max(0) as u64)))
}

/// Take a write lock, waiting at most `timeout`. Polls with `F_OFD_SETLK`
/// and short sleeps rather than `F_OFD_SETLKW`, so that a live but stuck
/// holder costs us `timeout`, never forever.
pub(crate) fn lock_timeout(fd: RawFd, start: u64, len: u64, timeout: Duration) -> io::Result<()> {
    let t0 = Instant::now();
    let mut nap = Duration::from_micros(50);
    loop {
        if try_lock(fd, start, len)? {
            return Ok(());
        }
        if t0.elapsed() >= timeout {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "ledger lock [{start}, +{len}) held by a live process for {} ms",
                    timeout.as_millis()
                ),
            ));
        }
        std::thread::sleep(nap);
        nap = (nap * 2).min(Duration::from_millis(5));
    }
}
