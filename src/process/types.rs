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

/// `CUDA_MEM_ALLOC_NODE_PARAMS` (`_v1`): what `cuGraphMemAllocNodeGetParams`
/// fills in (graph memory accounting reads the pool's device and the size).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUDA_MEM_ALLOC_NODE_PARAMS {
    pub poolProps: CUmemPoolProps,
    pub accessDescs: *const c_void,
    pub accessDescCount: usize,
    pub bytesize: usize,
    pub dptr: CUdeviceptr,
}
/// `CUDA_GRAPH_INSTANTIATE_PARAMS` (only passed through).
pub type CUDA_GRAPH_INSTANTIATE_PARAMS = c_void;
/// `CUgraphNodeType` (a C enum).
pub type CUgraphNodeType = u32;
/// `CUgraphMem_attribute` (a C enum).
pub type CUgraphMem_attribute = u32;
/// `CUstreamCaptureStatus` (a C enum).
pub type CUstreamCaptureStatus = u32;
/// `CU_STREAM_CAPTURE_STATUS_ACTIVE`: the stream is being captured.
pub const CU_STREAM_CAPTURE_STATUS_ACTIVE: CUstreamCaptureStatus = 1;
/// `CUmemAllocationHandleType` (a C enum).
pub type CUmemAllocationHandleType = u32;
/// `CUlimit` (a C enum).
pub type CUlimit = u32;
/// `CUjit_option` (a C enum; module load options are passed through).
pub type CUjit_option = u32;
/// `CUlibraryOption` (a C enum; library load options are passed through).
pub type CUlibraryOption = u32;
