//! Test doubles for cgpu's cluster layer.

pub mod apiserver;
