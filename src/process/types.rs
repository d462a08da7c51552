//! The C types of the declaration list: everything comes from `cgpu-ffi`
//! (one place for the CUDA/NVML ABI, checked against the real headers), plus
//! three spellings of our own.

#![allow(non_camel_case_types, non_snake_case)]

pub use std::ffi::{c_char, c_void};

pub use cgpu_ffi::*;

/// `CUexecAffinityParam` (only passed through).
pub type CUexecAffinityParam = c_void;
/// `const char *`.
pub type CStrP = *const c_char;
/// `void *`.
pub type Ptr = *mut c_void;
