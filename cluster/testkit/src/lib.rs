//! Test doubles for cgpu's cluster layer.

pub mod apiserver;
pub mod scheduler;
