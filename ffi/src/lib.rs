//! `repr(C)` types and constants of the CUDA driver API (`cuda.h`) and NVML
//! (`nvml.h`) that cgpu and the simulated driver use: one place for the ABI.
//! Only what we need, with the real values; `tests/abi.rs` (in `cgpu-sim`)
//! checks them against the real headers (sizes, offsets, values).
//!
//! Layout: CUDA handles and scalars, `CUresult` codes (generated, see
//! `cuda_errors.rs`), CUDA enums/flags, CUDA structs, then NVML.

#![allow(non_camel_case_types, non_snake_case, non_upper_case_globals)]

use std::ffi::c_void;

mod cuda_errors;
pub use cuda_errors::*;

// ---------------------------------------------------------------- CUDA scalars

/// `CUresult`.
pub type CUresult = u32;
/// `CUdevice` (`CUdevice_v1`: an `int` ordinal).
pub type CUdevice = i32;
/// `CUdeviceptr` (`CUdeviceptr_v2`: an unsigned 64-bit integer).
pub type CUdeviceptr = u64;
/// `CUdeviceptr_v1` (legacy 32-bit device pointer of the un-suffixed symbols).
pub type CUdeviceptr_v1 = u32;
/// `CUmemGenericAllocationHandle`.
pub type CUmemGenericAllocationHandle = u64;

/// Opaque handle types (pointers in `cuda.h`).
pub type CUcontext = *mut c_void;
pub type CUmodule = *mut c_void;
pub type CUfunction = *mut c_void;
pub type CUlibrary = *mut c_void;
pub type CUkernel = *mut c_void;
pub type CUstream = *mut c_void;
pub type CUevent = *mut c_void;
pub type CUgraph = *mut c_void;
pub type CUgraphNode = *mut c_void;
pub type CUgraphExec = *mut c_void;
pub type CUmemoryPool = *mut c_void;
pub type CUarray = *mut c_void;
pub type CUmipmappedArray = *mut c_void;
/// `cuuint64_t`.
pub type cuuint64_t = u64;

/// `CU_STREAM_LEGACY`: the legacy default stream handle.
pub const CU_STREAM_LEGACY: usize = 0x1;
/// `CU_STREAM_PER_THREAD`: the per-thread default stream handle.
pub const CU_STREAM_PER_THREAD: usize = 0x2;

// ------------------------------------------------------------- cuGetProcAddress

/// `CUdriverProcAddress_flags`.
pub const CU_GET_PROC_ADDRESS_DEFAULT: u64 = 0;
pub const CU_GET_PROC_ADDRESS_LEGACY_STREAM: u64 = 1;
pub const CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM: u64 = 2;

/// `CUdriverProcAddressQueryResult`.
pub type CUdriverProcAddressQueryResult = u32;
pub const CU_GET_PROC_ADDRESS_SUCCESS: CUdriverProcAddressQueryResult = 0;
pub const CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND: CUdriverProcAddressQueryResult = 1;
pub const CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT: CUdriverProcAddressQueryResult = 2;

// ------------------------------------------------------------- device attributes

/// `CUdevice_attribute` values the simulated driver answers.
pub type CUdevice_attribute = u32;
pub const CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: CUdevice_attribute = 1;
pub const CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: CUdevice_attribute = 2;
pub const CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: CUdevice_attribute = 3;
pub const CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: CUdevice_attribute = 4;
pub const CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: CUdevice_attribute = 5;
pub const CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: CUdevice_attribute = 6;
pub const CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: CUdevice_attribute = 7;
pub const CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: CUdevice_attribute = 8;
pub const CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: CUdevice_attribute = 9;
pub const CU_DEVICE_ATTRIBUTE_WARP_SIZE: CUdevice_attribute = 10;
pub const CU_DEVICE_ATTRIBUTE_MAX_PITCH: CUdevice_attribute = 11;
pub const CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: CUdevice_attribute = 12;
pub const CU_DEVICE_ATTRIBUTE_CLOCK_RATE: CUdevice_attribute = 13;
pub const CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT: CUdevice_attribute = 14;
pub const CU_DEVICE_ATTRIBUTE_GPU_OVERLAP: CUdevice_attribute = 15;
pub const CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: CUdevice_attribute = 16;
pub const CU_DEVICE_ATTRIBUTE_KERNEL_EXEC_TIMEOUT: CUdevice_attribute = 17;
pub const CU_DEVICE_ATTRIBUTE_INTEGRATED: CUdevice_attribute = 18;
pub const CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: CUdevice_attribute = 19;
pub const CU_DEVICE_ATTRIBUTE_COMPUTE_MODE: CUdevice_attribute = 20;
pub const CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: CUdevice_attribute = 31;
pub const CU_DEVICE_ATTRIBUTE_ECC_ENABLED: CUdevice_attribute = 32;
pub const CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: CUdevice_attribute = 33;
pub const CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: CUdevice_attribute = 34;
pub const CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: CUdevice_attribute = 36;
pub const CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: CUdevice_attribute = 37;
pub const CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: CUdevice_attribute = 38;
pub const CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: CUdevice_attribute = 39;
pub const CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: CUdevice_attribute = 40;
pub const CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: CUdevice_attribute = 41;
pub const CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: CUdevice_attribute = 50;
pub const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: CUdevice_attribute = 75;
pub const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: CUdevice_attribute = 76;
pub const CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED: CUdevice_attribute = 78;
pub const CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: CUdevice_attribute = 81;
pub const CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR: CUdevice_attribute = 82;
pub const CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: CUdevice_attribute = 83;
pub const CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS: CUdevice_attribute = 89;
pub const CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED: CUdevice_attribute = 90;
pub const CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH: CUdevice_attribute = 95;
pub const CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: CUdevice_attribute = 97;
pub const CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: CUdevice_attribute = 102;
pub const CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR: CUdevice_attribute = 106;
pub const CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED: CUdevice_attribute = 115;
/// One past the last attribute of CUDA 12.9's `CUdevice_attribute`.
pub const CU_DEVICE_ATTRIBUTE_MAX: CUdevice_attribute = 144;

// -------------------------------------------------------------------- launches

/// `CU_LAUNCH_PARAM_END` / `_BUFFER_POINTER` / `_BUFFER_SIZE` (in `extra`).
pub const CU_LAUNCH_PARAM_END: usize = 0x00;
pub const CU_LAUNCH_PARAM_BUFFER_POINTER: usize = 0x01;
pub const CU_LAUNCH_PARAM_BUFFER_SIZE: usize = 0x02;

/// `CUlaunchAttribute` (id, padding, a 64-byte value union).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUlaunchAttribute {
    pub id: u32,
    pub pad: [u8; 4],
    pub value: [u8; 64],
}

/// `CUlaunchConfig` (for `cuLaunchKernelEx`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUlaunchConfig {
    pub gridDimX: u32,
    pub gridDimY: u32,
    pub gridDimZ: u32,
    pub blockDimX: u32,
    pub blockDimY: u32,
    pub blockDimZ: u32,
    pub sharedMemBytes: u32,
    pub hStream: CUstream,
    pub attrs: *mut CUlaunchAttribute,
    pub numAttrs: u32,
}

/// `CUctxCreateParams` (for `cuCtxCreate_v4`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUctxCreateParams {
    pub execAffinityParams: *mut c_void,
    pub numExecAffinityParams: i32,
    pub cigParams: *mut c_void,
}

/// `CUDA_LAUNCH_PARAMS` (for `cuLaunchCooperativeKernelMultiDevice`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUDA_LAUNCH_PARAMS {
    pub function: CUfunction,
    pub gridDimX: u32,
    pub gridDimY: u32,
    pub gridDimZ: u32,
    pub blockDimX: u32,
    pub blockDimY: u32,
    pub blockDimZ: u32,
    pub sharedMemBytes: u32,
    pub hStream: CUstream,
    pub kernelParams: *mut *mut c_void,
}

/// `CUgraphEdgeData` (CUDA 12.3).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct CUgraphEdgeData {
    pub from_port: u8,
    pub to_port: u8,
    pub type_: u8,
    pub reserved: [u8; 5],
}

/// `CUuuid`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct CUuuid {
    pub bytes: [u8; 16],
}

/// `CUmemLocationType`.
pub const CU_MEM_LOCATION_TYPE_INVALID: i32 = 0;
pub const CU_MEM_LOCATION_TYPE_DEVICE: i32 = 1;
pub const CU_MEM_LOCATION_TYPE_HOST: i32 = 2;
pub const CU_MEM_LOCATION_TYPE_HOST_NUMA: i32 = 3;
pub const CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT: i32 = 4;

/// `CUmemLocation`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CUmemLocation {
    pub type_: i32,
    pub id: i32,
}

/// `CUmemAllocationProp` (`allocFlags` kept as its 8 raw bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUmemAllocationProp {
    pub type_: i32,
    pub requestedHandleTypes: i32,
    pub location: CUmemLocation,
    pub win32HandleMetaData: *mut c_void,
    pub allocFlags: [u8; 8],
}

/// `CUmemAccessDesc`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUmemAccessDesc {
    pub location: CUmemLocation,
    pub flags: i32,
}

/// `CUmemPoolProps` (the fields after the location kept as raw words).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUmemPoolProps {
    pub allocType: i32,
    pub handleTypes: i32,
    pub location: CUmemLocation,
    pub rest: [u64; 9],
}

/// `CUDA_ARRAY_DESCRIPTOR` (`_v2`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUDA_ARRAY_DESCRIPTOR {
    pub Width: usize,
    pub Height: usize,
    pub Format: i32,
    pub NumChannels: u32,
}

/// `CUDA_ARRAY_DESCRIPTOR_v1` (legacy `cuArrayCreate`: 32-bit sizes). The
/// header declares the `_v1` structs only under `__CUDA_API_VERSION_INTERNAL`;
/// `tests/entry_paths.rs` (`v1_descriptors_match_cuda_h`) compiles against
/// them with it defined and compares their layout with ours.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUDA_ARRAY_DESCRIPTOR_v1 {
    pub Width: u32,
    pub Height: u32,
    pub Format: i32,
    pub NumChannels: u32,
}

/// `CUDA_ARRAY3D_DESCRIPTOR_v1` (legacy `cuArray3DCreate`: 32-bit sizes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUDA_ARRAY3D_DESCRIPTOR_v1 {
    pub Width: u32,
    pub Height: u32,
    pub Depth: u32,
    pub Format: i32,
    pub NumChannels: u32,
    pub Flags: u32,
}

/// `CUDA_ARRAY3D_DESCRIPTOR` (`_v2`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CUDA_ARRAY3D_DESCRIPTOR {
    pub Width: usize,
    pub Height: usize,
    pub Depth: usize,
    pub Format: i32,
    pub NumChannels: u32,
    pub Flags: u32,
}

// ------------------------------------------------------------------ flags

pub const CU_EVENT_DEFAULT: u32 = 0x0;
pub const CU_EVENT_BLOCKING_SYNC: u32 = 0x1;
pub const CU_EVENT_DISABLE_TIMING: u32 = 0x2;
pub const CU_EVENT_INTERPROCESS: u32 = 0x4;

pub const CU_STREAM_DEFAULT: u32 = 0x0;
pub const CU_STREAM_NON_BLOCKING: u32 = 0x1;

pub const CU_MEM_ATTACH_GLOBAL: u32 = 0x1;
pub const CU_MEM_ATTACH_HOST: u32 = 0x2;
pub const CU_MEM_ATTACH_SINGLE: u32 = 0x4;

// ========================================================================= NVML

/// `nvmlReturn_t`.
pub type nvmlReturn_t = u32;
pub const NVML_SUCCESS: nvmlReturn_t = 0;
pub const NVML_ERROR_UNINITIALIZED: nvmlReturn_t = 1;
pub const NVML_ERROR_INVALID_ARGUMENT: nvmlReturn_t = 2;
pub const NVML_ERROR_NOT_SUPPORTED: nvmlReturn_t = 3;
pub const NVML_ERROR_NO_PERMISSION: nvmlReturn_t = 4;
pub const NVML_ERROR_ALREADY_INITIALIZED: nvmlReturn_t = 5;
pub const NVML_ERROR_NOT_FOUND: nvmlReturn_t = 6;
pub const NVML_ERROR_INSUFFICIENT_SIZE: nvmlReturn_t = 7;
pub const NVML_ERROR_DRIVER_NOT_LOADED: nvmlReturn_t = 9;
pub const NVML_ERROR_LIBRARY_NOT_FOUND: nvmlReturn_t = 12;
pub const NVML_ERROR_FUNCTION_NOT_FOUND: nvmlReturn_t = 13;
pub const NVML_ERROR_GPU_IS_LOST: nvmlReturn_t = 15;
pub const NVML_ERROR_ARGUMENT_VERSION_MISMATCH: nvmlReturn_t = 25;
pub const NVML_ERROR_NO_DATA: nvmlReturn_t = 21;
pub const NVML_ERROR_GPU_NOT_FOUND: nvmlReturn_t = 28;
pub const NVML_ERROR_UNKNOWN: nvmlReturn_t = 999;

/// Every `nvmlReturn_t` the sim returns: (value, `nvmlErrorString` text).
pub const NVML_RETURNS: &[(nvmlReturn_t, &str)] = &[
    (NVML_SUCCESS, "Success"),
    (NVML_ERROR_UNINITIALIZED, "Uninitialized"),
    (NVML_ERROR_INVALID_ARGUMENT, "Invalid Argument"),
    (NVML_ERROR_NOT_SUPPORTED, "Not Supported"),
    (NVML_ERROR_NO_PERMISSION, "Insufficient Permissions"),
    (NVML_ERROR_ALREADY_INITIALIZED, "Already Initialized"),
    (NVML_ERROR_NOT_FOUND, "Not Found"),
    (NVML_ERROR_INSUFFICIENT_SIZE, "Insufficient Size"),
    (NVML_ERROR_DRIVER_NOT_LOADED, "Driver Not Loaded"),
    (NVML_ERROR_FUNCTION_NOT_FOUND, "Function Not Found"),
    (NVML_ERROR_GPU_IS_LOST, "GPU is lost"),
    (NVML_ERROR_NO_DATA, "No data"),
    (
        NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
        "Argument version mismatch",
    ),
    (NVML_ERROR_UNKNOWN, "Unknown Error"),
];

/// `nvmlDevice_t` (opaque pointer).
pub type nvmlDevice_t = *mut c_void;

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
    pub version: u32,
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}
/// `nvmlMemory_v2` = `NVML_STRUCT_VERSION(Memory, 2)` = sizeof | 2 << 24.
pub const nvmlMemory_v2: u32 = (std::mem::size_of::<nvmlMemory_v2_t>() as u32) | (2 << 24);

/// `nvmlProcessInfo_v1_t`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct nvmlProcessInfo_v1_t {
    pub pid: u32,
    pub usedGpuMemory: u64,
}

/// `nvmlProcessInfo_t` / `nvmlProcessInfo_v2_t` (same layout).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct nvmlProcessInfo_t {
    pub pid: u32,
    pub usedGpuMemory: u64,
    pub gpuInstanceId: u32,
    pub computeInstanceId: u32,
}

/// `nvmlUtilization_t`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct nvmlUtilization_t {
    pub gpu: u32,
    pub memory: u32,
}

/// `nvmlProcessUtilizationSample_t`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct nvmlProcessUtilizationSample_t {
    pub pid: u32,
    pub timeStamp: u64,
    pub smUtil: u32,
    pub memUtil: u32,
    pub encUtil: u32,
    pub decUtil: u32,
}

/// `nvmlPciInfo_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct nvmlPciInfo_t {
    pub busIdLegacy: [u8; 16],
    pub domain: u32,
    pub bus: u32,
    pub device: u32,
    pub pciDeviceId: u32,
    pub pciSubSystemId: u32,
    pub busId: [u8; 32],
}

/// `NVML_VALUE_NOT_AVAILABLE` for `unsigned long long` fields.
pub const NVML_VALUE_NOT_AVAILABLE_ULL: u64 = u64::MAX;
pub const NVML_DEVICE_NAME_BUFFER_SIZE: u32 = 64;
pub const NVML_DEVICE_NAME_V2_BUFFER_SIZE: u32 = 96;
pub const NVML_DEVICE_UUID_BUFFER_SIZE: u32 = 80;
pub const NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE: u32 = 80;
