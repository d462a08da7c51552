//! The C types the hooks' signatures use: the layer's (`process::types`).

pub use crate::process::types::*;
