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

/// A value of one fork generation, made on its first use in it: a forked
/// child gets a fresh one, never its parent's (a lock a parent thread held
/// when the parent forked stays held for ever in the child, where that
/// thread does not exist). The value of an earlier generation is leaked,
/// never touched again. Reading it is an atomic load and a comparison; a
/// new generation's first use allocates once.
pub struct ForkLocal<T: 'static> {
    cur: std::sync::atomic::AtomicPtr<(u64, T)>,
    make: fn() -> T,
}

impl<T: 'static> ForkLocal<T> {
    pub const fn new(make: fn() -> T) -> ForkLocal<T> {
        ForkLocal {
            cur: std::sync::atomic::AtomicPtr::new(std::ptr::null_mut()),
            make,
        }
    }

    /// This generation's value.
    pub fn get(&'static self) -> &'static T {
        let g = generation();
        loop {
            let cur = self.cur.load(Ordering::Acquire);
            // SAFETY: a non-null pointer here is a leaked Box, never freed.
            if let Some((cg, v)) = unsafe { cur.as_ref() } {
                if *cg == g {
                    return v;
                }
            }
            let new = Box::into_raw(Box::new((g, (self.make)())));
            match self
                .cur
                .compare_exchange(cur, new, Ordering::AcqRel, Ordering::Acquire)
            {
                // SAFETY: just published; leaked from here on.
                Ok(_) => return unsafe { &(*new).1 },
                // SAFETY: `new` was never published: ours to free.
                Err(_) => drop(unsafe { Box::from_raw(new) }),
            }
        }
    }
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

    /// A lock held by a parent thread when the parent forks is not the
    /// child's: the child takes its own at once.
    #[test]
    fn a_forked_child_does_not_wait_on_its_parents_lock() {
        static LOCK: ForkLocal<parking_lot::Mutex<()>> =
            ForkLocal::new(|| parking_lot::Mutex::new(()));
        let held = LOCK.get().lock();
        let mut fds = [0i32; 2];
        // SAFETY: a pipe for the child's answer; the child takes the lock
        // (atomics; its first use allocates, as any child's hook may),
        // writes and `_exit`s.
        unsafe {
            assert_eq!(libc::pipe(fds.as_mut_ptr()), 0);
            let pid = libc::fork();
            if pid == 0 {
                let v: u8 = LOCK.get().try_lock().is_some() as u8;
                libc::write(fds[1], (&v as *const u8).cast(), 1);
                libc::_exit(0);
            }
            let mut v = 9u8;
            assert_eq!(libc::read(fds[0], (&mut v as *mut u8).cast(), 1), 1);
            libc::waitpid(pid, std::ptr::null_mut(), 0);
            libc::close(fds[0]);
            libc::close(fds[1]);
            assert_eq!(v, 1, "the child took its own lock");
        }
        assert!(
            LOCK.get().try_lock().is_none(),
            "the parent's is still held"
        );
        drop(held);
    }
}
