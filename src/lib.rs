//! cgpu: GPU sharing for containers. See README.md and docs/.

pub mod config;
pub mod driver;
pub mod hooks;
pub mod ledger;
pub mod memory;
pub mod scheduler;
