//! Calls to functions the sim only stubs (they answer "not supported" or a
//! constant without simulating anything), counted per name, so that tests
//! can assert a real client never relied on one.
//!
//! This is the smallest version: counts live in this process and are
//! reported on stderr with `CGPU_SIM_TRACE=1`.

use parking_lot::Mutex;
use std::collections::HashMap;

static COUNTS: Mutex<Option<HashMap<String, u64>>> = Mutex::new(None);

/// Counts one call of stub `name`.
pub fn count(name: &str) {
    crate::driver::trace(format_args!("stub called: {name}"));
    *COUNTS
        .lock()
        .get_or_insert_with(HashMap::new)
        .entry(name.to_string())
        .or_default() += 1;
}

/// The counts so far, by name.
pub fn counts() -> Vec<(String, u64)> {
    let mut v: Vec<(String, u64)> = COUNTS
        .lock()
        .as_ref()
        .map(|m| m.iter().map(|(k, v)| (k.clone(), *v)).collect())
        .unwrap_or_default();
    v.sort();
    v
}
