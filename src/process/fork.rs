//! The fork generation: one counter, bumped in a forked child (by a
//! `pthread_atfork` child handler that only touches this atomic, which is
//! async-signal-safe). A cache or lock word made before a fork records the
//! generation it was made in and is not trusted in another one: a child
//! never uses its parent's caches, nor waits on a lock a parent thread held
//! (that thread does not exist in the child).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;

static GENERATION: AtomicU64 = AtomicU64::new(0);
static HANDLER: Once = Once::new();

extern "C" fn bump() {
    GENERATION.fetch_add(1, Ordering::AcqRel);
}

/// The current fork generation (0 in the process that loaded the library,
/// +1 in each forked child). Registers the child handler on first use.
#[inline]
pub fn generation() -> u64 {
    HANDLER.call_once(|| {
        // SAFETY: registering a plain extern "C" child handler that only
        // increments an atomic.
        unsafe { libc::pthread_atfork(None, None, Some(bump)) };
    });
    GENERATION.load(Ordering::Acquire)
}

/// The current fork generation without the registration check, for a hot
/// path that compares it with a generation taken from [`generation`] (which
/// registered the handler before that value could exist).
#[inline(always)]
pub fn current() -> u64 {
    GENERATION.load(Ordering::Acquire)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forked_child_sees_a_new_generation() {
        let g = generation();
        let mut fds = [0i32; 2];
        // SAFETY: a pipe for the child's answer; the child only writes to it
        // and _exits (async-signal-safe calls only).
        unsafe {
            assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
            let pid = libc::fork();
            if pid == 0 {
                let v = GENERATION.load(Ordering::Acquire);
                libc::write(fds[1], (&v as *const u64).cast(), 8);
                libc::_exit(0);
            }
            let mut v = 0u64;
            assert_eq!(libc::read(fds[0], (&mut v as *mut u64).cast(), 8), 8);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
            libc::close(fds[0]);
            libc::close(fds[1]);
            assert_eq!(v, g + 1);
        }
        assert_eq!(generation(), g, "the parent's generation is unchanged");
    }
}
