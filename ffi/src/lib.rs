//! `repr(C)` types and constants of the CUDA driver API (`cuda.h`) and NVML
//! (`nvml.h`) that cgpu and the simulated driver use. Only what we need, with
//! the real values; `tests/abi.rs` checks them against the real headers.

#![allow(non_camel_case_types)]

/// `CUresult`.
pub type CUresult = u32;
/// `CUdevice`.
pub type CUdevice = i32;
/// `CUdeviceptr` (`CUdeviceptr_v2`: an unsigned 64-bit integer).
pub type CUdeviceptr = u64;

pub const CUDA_SUCCESS: CUresult = 0;
pub const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
pub const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
pub const CUDA_ERROR_NOT_SUPPORTED: CUresult = 801;

/// `nvmlReturn_t`.
pub type nvmlReturn_t = u32;
pub const NVML_SUCCESS: nvmlReturn_t = 0;
