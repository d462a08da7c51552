//! Clock and futex on the shared ledger words.

/// `CLOCK_MONOTONIC` ns: one clock for every process on the host (the
/// library's one clock, `process::clock`).
pub use crate::process::clock::monotonic_ns as now_ns;
/// Futex wait and wake on a shared word's low half (the token's sequence
/// number), shared with the node agent.
pub use cgpu_ledger::futex::{wait as futex_wait, wake as futex_wake};
