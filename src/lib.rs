//! cgpu: GPU sharing for containers. See README.md and docs/.

pub mod ledger;
pub mod monitor;
pub mod scheduler;
