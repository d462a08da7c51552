//! Counting calls to stubs: functions the sim exports so that real clients
//! find them, but whose behaviour it does not simulate (they answer "not
//! supported" or a constant). Every stub body counts itself with
//! `stub_hit!` (or is declared with `stub_fns!`, which does it), so a test
//! can assert that a scenario never relied on one, and `cgpu-sim-stat` shows
//! which were called.
//!
//! Counts live in the shared state (`StateFile::stubs`), per function name,
//! summed over every process using the state directory. A name gets its
//! record on its first call (under the table lock); each call site caches the
//! record's index, so later calls cost one atomic add.

use crate::state::{Shared, StubRec, MAX_STUBS, STUB_NAME_WORDS};
use std::sync::atomic::{AtomicU32, Ordering::*};

/// One call site of a stub (a `static` made by `stub_hit!`).
pub struct StubSite {
    name: &'static str,
    /// Index of the name's record in the shared table; `u32::MAX`: unknown.
    idx: AtomicU32,
}

impl StubSite {
    pub const fn new(name: &'static str) -> StubSite {
        StubSite {
            name,
            idx: AtomicU32::new(u32::MAX),
        }
    }

    /// Counts one call. Initialises the sim's state if needed (a stub may be
    /// the first thing a process calls); a process that cannot reach the
    /// state (a forked child, an unusable directory) counts nothing.
    pub fn hit(&self) {
        let Ok(d) = crate::driver::core() else {
            return;
        };
        let mut i = self.idx.load(Relaxed);
        if i == u32::MAX {
            match record_index(d.shared, self.name) {
                Some(x) => {
                    i = x as u32;
                    self.idx.store(i, Relaxed);
                }
                None => return,
            }
        }
        if let Some(r) = d.shared.map().stubs.get(i as usize) {
            r.calls.fetch_add(1, Relaxed);
        }
    }
}

/// Counts one call of a stub whose name is only known at run time (a slot of
/// one of the runtime's export tables, say). Slower than `stub_hit!`: the
/// record is looked up on every call.
pub fn hit_named(name: &str) {
    crate::driver::trace(format_args!("stub called: {name}"));
    let Ok(d) = crate::driver::core() else {
        return;
    };
    if let Some(r) = record_index(d.shared, name).and_then(|i| d.shared.map().stubs.get(i)) {
        r.calls.fetch_add(1, Relaxed);
    }
}

/// Packs a name into the record's words (NUL-padded, truncated to fit).
fn name_words(name: &str) -> [u64; STUB_NAME_WORDS] {
    let mut b = [0u8; STUB_NAME_WORDS * 8];
    let n = name.len().min(b.len() - 1);
    b[..n].copy_from_slice(&name.as_bytes()[..n]);
    let mut w = [0u64; STUB_NAME_WORDS];
    for (i, x) in w.iter_mut().enumerate() {
        *x = u64::from_ne_bytes(b[i * 8..i * 8 + 8].try_into().unwrap_or_default());
    }
    w
}

/// The name stored in a record, `None` while it is free.
pub fn record_name(r: &StubRec) -> Option<String> {
    // Word 0 is published last (Release): once it is nonzero the rest is set.
    let first = r.name[0].load(Acquire);
    if first == 0 {
        return None;
    }
    let mut b = Vec::with_capacity(STUB_NAME_WORDS * 8);
    b.extend_from_slice(&first.to_ne_bytes());
    for w in &r.name[1..] {
        b.extend_from_slice(&w.load(Relaxed).to_ne_bytes());
    }
    let n = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    Some(String::from_utf8_lossy(&b[..n]).into_owned())
}

/// Finds (or claims) the record of `name`; `None` when the table is full.
fn record_index(sh: &Shared, name: &str) -> Option<usize> {
    let want = name_words(name);
    let same = |r: &StubRec| r.name.iter().zip(want).all(|(a, b)| a.load(Acquire) == b);
    let table = &sh.map().stubs;
    // Fast path without the lock: another process may have claimed it.
    if let Some(i) = table.iter().position(same) {
        return Some(i);
    }
    let _g = sh.lock_table();
    for (i, r) in table.iter().enumerate() {
        if r.name[0].load(Acquire) == 0 {
            for (w, v) in r.name.iter().zip(want).skip(1) {
                w.store(v, Relaxed);
            }
            r.name[0].store(want[0], Release);
            return Some(i);
        }
        if same(r) {
            return Some(i);
        }
    }
    None
}

/// Every stub called so far in a state: (name, calls), sorted by name.
pub fn counts(sh: &Shared) -> Vec<(String, u64)> {
    let mut v: Vec<(String, u64)> = sh.map().stubs[..MAX_STUBS]
        .iter()
        .filter_map(|r| record_name(r).map(|n| (n, r.calls.load(Relaxed))))
        .collect();
    v.sort();
    v
}

/// Counts one call of the stub named `$name` (a string literal or
/// `stringify!(fn_name)`). Use it in every body that only pretends.
#[macro_export]
macro_rules! stub_hit {
    ($name:expr) => {{
        static SITE: $crate::stubs::StubSite = $crate::stubs::StubSite::new($name);
        SITE.hit();
    }};
}

/// Declares exported functions that are pure stubs: each counts its call and
/// returns `$ret` (a `CUresult` or `nvmlReturn_t` constant). They take no
/// parameters, which is safe to call with any arguments under the C calling
/// convention (the caller owns its arguments).
///
/// ```ignore
/// stub_fns! { CUresult = CUDA_ERROR_NOT_SUPPORTED => cuFoo, cuBar; }
/// ```
#[macro_export]
macro_rules! stub_fns {
    ($($ty:ty = $ret:expr => $($sym:ident),* $(,)?;)*) => {$($(
        #[unsafe(no_mangle)]
        pub extern "C" fn $sym() -> $ty {
            $crate::stub_hit!(stringify!($sym));
            $ret
        }
    )*)*};
}
