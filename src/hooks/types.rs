//! The C types our hooks' signatures use (from `cuda.h` / `nvml.h`), beyond
//! the few in `cgpu-ffi`. Opaque handles are pointers; structs are only the
//! fields we read, laid out as the real headers lay them out.

#![allow(non_camel_case_types, non_snake_case)]

pub use std::ffi::{c_char, c_void};
use std::ffi::{c_int, c_uint};

pub use cgpu_ffi::{nvmlReturn_t, CUdevice, CUdeviceptr, CUresult};

pub type CUcontext = *mut c_void;
pub type CUstream = *mut c_void;
pub type CUfunction = *mut c_void;
pub type CUarray = *mut c_void;
pub type CUmipmappedArray = *mut c_void;
pub type CUmemoryPool = *mut c_void;
pub type CUgraphExec = *mut c_void;
pub type CUmemGenericAllocationHandle = u64;
pub type nvmlDevice_t = *mut c_void;
pub type cuuint64_t = u64;

pub const CUDA_SUCCESS: CUresult = 0;
pub const CUDA_ERROR_INVALID_VALUE: CUresult = 1;
pub const CUDA_ERROR_OUT_OF_MEMORY: CUresult = 2;
pub const CUDA_ERROR_NOT_INITIALIZED: CUresult = 3;
pub const CUDA_ERROR_INVALID_DEVICE: CUresult = 101;
pub const CUDA_ERROR_NOT_FOUND: CUresult = 500;
pub const CUDA_ERROR_UNKNOWN: CUresult = 999;

pub const NVML_SUCCESS: nvmlReturn_t = 0;
pub const NVML_ERROR_UNINITIALIZED: nvmlReturn_t = 1;
pub const NVML_ERROR_INVALID_ARGUMENT: nvmlReturn_t = 2;
pub const NVML_ERROR_NOT_FOUND: nvmlReturn_t = 6;
pub const NVML_ERROR_INSUFFICIENT_SIZE: nvmlReturn_t = 7;
pub const NVML_ERROR_LIBRARY_NOT_FOUND: nvmlReturn_t = 12;
pub const NVML_ERROR_FUNCTION_NOT_FOUND: nvmlReturn_t = 13;
pub const NVML_ERROR_UNKNOWN: nvmlReturn_t = 999;

/// `nvmlMemory_v2` version word: `sizeof | 2 << 24`.
pub const NVML_MEMORY_V2: c_uint = 0x0200_0028;

/// `CUmemLocation`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUmemLocation {
    pub type_: c_int,
    pub id: c_int,
}

/// `CUmemAllocationProp` (32 bytes; the fields we read first).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUmemAllocationProp {
    pub type_: c_int,
    pub requestedHandleTypes: c_int,
    pub location: CUmemLocation,
    pub win32HandleMetaData: *mut c_void,
    pub allocFlags: [u8; 8],
}

/// `CUmemAccessDesc`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUmemAccessDesc {
    pub location: CUmemLocation,
    pub flags: c_int,
}

/// `CUmemPoolProps` (88 bytes; the location is what we translate).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUmemPoolProps {
    pub allocType: c_int,
    pub handleTypes: c_int,
    pub location: CUmemLocation,
    pub rest: [u64; 9],
}

/// `CUDA_ARRAY_DESCRIPTOR` (`_v2`).
#[repr(C)]
pub struct CUDA_ARRAY_DESCRIPTOR {
    pub Width: usize,
    pub Height: usize,
    pub Format: c_int,
    pub NumChannels: c_uint,
}

/// `CUDA_ARRAY3D_DESCRIPTOR` (`_v2`).
#[repr(C)]
pub struct CUDA_ARRAY3D_DESCRIPTOR {
    pub Width: usize,
    pub Height: usize,
    pub Depth: usize,
    pub Format: c_int,
    pub NumChannels: c_uint,
    pub Flags: c_uint,
}

/// `CUlaunchConfig` (the fields up to the stream).
#[repr(C)]
pub struct CUlaunchConfig {
    pub gridDimX: c_uint,
    pub gridDimY: c_uint,
    pub gridDimZ: c_uint,
    pub blockDimX: c_uint,
    pub blockDimY: c_uint,
    pub blockDimZ: c_uint,
    pub sharedMemBytes: c_uint,
    pub hStream: CUstream,
    pub attrs: *mut c_void,
    pub numAttrs: c_uint,
}

/// `CUDA_LAUNCH_PARAMS`.
#[repr(C)]
pub struct CUDA_LAUNCH_PARAMS {
    pub function: CUfunction,
    pub gridDimX: c_uint,
    pub gridDimY: c_uint,
    pub gridDimZ: c_uint,
    pub blockDimX: c_uint,
    pub blockDimY: c_uint,
    pub blockDimZ: c_uint,
    pub sharedMemBytes: c_uint,
    pub hStream: CUstream,
    pub kernelParams: *mut *mut c_void,
}

/// `CUuuid`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct CUuuid {
    pub bytes: [u8; 16],
}

/// `nvmlMemory_t` (v1).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct nvmlMemory_t {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlMemory_v2_t`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct nvmlMemory_v2_t {
    pub version: c_uint,
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlProcessInfo_v1_t`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct nvmlProcessInfo_v1_t {
    pub pid: c_uint,
    pub usedGpuMemory: u64,
}

/// `nvmlProcessInfo_v2_t` / `nvmlProcessInfo_t` (v3 API).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct nvmlProcessInfo_t {
    pub pid: c_uint,
    pub usedGpuMemory: u64,
    pub gpuInstanceId: c_uint,
    pub computeInstanceId: c_uint,
}

/// Opaque `CUexecAffinityParam` / `CUctxCreateParams` / `CUdriverProcAddressQueryResult`.
pub type CUexecAffinityParam = c_void;
pub type CUctxCreateParams = c_void;
pub type CUdriverProcAddressQueryResult = c_int;
pub type CStrP = *const c_char;
/// `void *`.
pub type Ptr = *mut c_void;

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn layouts_match_the_headers() {
        assert_eq!(size_of::<nvmlMemory_v2_t>(), 40);
        assert_eq!(
            NVML_MEMORY_V2,
            (size_of::<nvmlMemory_v2_t>() as u32) | (2 << 24)
        );
        assert_eq!(size_of::<nvmlProcessInfo_v1_t>(), 16);
        assert_eq!(size_of::<nvmlProcessInfo_t>(), 24);
        assert_eq!(offset_of!(CUlaunchConfig, hStream), 32);
        assert_eq!(offset_of!(CUDA_LAUNCH_PARAMS, hStream), 40);
        assert_eq!(size_of::<CUDA_LAUNCH_PARAMS>(), 56);
        assert_eq!(offset_of!(CUmemAllocationProp, location), 8);
        assert_eq!(size_of::<CUmemAllocationProp>(), 32);
        assert_eq!(size_of::<CUmemAccessDesc>(), 12);
        assert_eq!(size_of::<CUmemPoolProps>(), 88);
        assert_eq!(offset_of!(CUmemPoolProps, location), 8);
        assert_eq!(size_of::<CUDA_ARRAY_DESCRIPTOR>(), 24);
        assert_eq!(size_of::<CUDA_ARRAY3D_DESCRIPTOR>(), 40);
    }
}
