//! Everything the interposer exports.
//!
//! ONE declaration list ([`api!`] below) generates, for every hooked driver
//! function:
//! - the exported `extern "C"` symbol (programs linked with `-lcuda`/`-lnvidia-ml`);
//! - its entry in the table our `dlsym` override consults ([`hook_by_name`]);
//! - its entry in the table `cuGetProcAddress(_v2)` uses to map the real
//!   pointer the driver returned back to the variant it is ([`hook_by_real`]);
//! - `real::<name>`: the real function, resolved lazily on the driver's handle.
//!
//! Pass-through functions are not exported at all: linked programs bind them
//! to the driver directly, `dlsym` and `cuGetProcAddress` hand out the
//! driver's own pointer (zero added cost). The `real` section declares the
//! ones cgpu itself calls.

pub mod context;
pub mod device;
pub mod dlsym;
pub mod launch;
pub mod memory;
pub mod nvml;
pub mod procaddr;
pub mod stream;
pub mod types;

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};

use types::*;

/// Run a hook body; a panic becomes `CUDA_ERROR_UNKNOWN` / `NVML_ERROR_UNKNOWN`
/// (both 999) instead of unwinding into C.
#[inline(always)]
pub fn guard(f: impl FnOnce() -> u32) -> u32 {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(_) => CUDA_ERROR_UNKNOWN,
    }
}

/// Call the real function or return the loader's code for a missing one.
macro_rules! call_real {
    ($real:expr, $($arg:expr),* $(,)?) => {
        match $real.get() {
            // SAFETY: the real driver function with the caller's own arguments,
            // which the C contract of this entry point makes valid.
            Some(f) => unsafe { f($($arg),*) },
            None => $real.missing(),
        }
    };
}
pub(crate) use call_real;

macro_rules! api {
    (
        hooks { $( fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) -> $ret:ty => $hook:path ; )* }
        real { $( fn $rname:ident ( $($rarg:ident : $rty:ty),* $(,)? ) -> $rret:ty ; )* }
    ) => {
        /// C signatures of the declared functions.
        #[allow(non_camel_case_types)]
        pub mod sig {
            use super::types::*;
            $( pub type $name = unsafe extern "C" fn($($ty),*) -> $ret; )*
            $( pub type $rname = unsafe extern "C" fn($($rty),*) -> $rret; )*
        }

        /// The real driver functions, resolved on the driver's handle.
        #[allow(non_upper_case_globals)]
        pub mod real {
            use crate::driver::RealFn;
            $( pub static $name: RealFn<super::sig::$name> = RealFn::new(
                match std::ffi::CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes()) {
                    Ok(c) => c,
                    Err(_) => panic!(),
                }); )*
            $( pub static $rname: RealFn<super::sig::$rname> = RealFn::new(
                match std::ffi::CStr::from_bytes_with_nul(concat!(stringify!($rname), "\0").as_bytes()) {
                    Ok(c) => c,
                    Err(_) => panic!(),
                }); )*
        }

        /// The exported hooks.
        pub mod exports {
            #[allow(unused_imports)]
            use super::types::*;
            #[allow(unused_imports)]
            use super::{context, device, launch, memory, nvml, procaddr, stream};
            $(
                /// Exported hook (see the declaration list in `hooks/mod.rs`).
                ///
                /// # Safety
                /// The C contract of the driver function of the same name.
                #[unsafe(no_mangle)]
                #[allow(non_snake_case, clippy::too_many_arguments)]
                pub unsafe extern "C" fn $name($($arg: $ty),*) -> $ret {
                    // SAFETY: forwarded with the caller's arguments; the hook
                    // upholds the same contract as the driver function.
                    super::guard(|| unsafe { $hook(&super::real::$name, $($arg),*) })
                }
            )*
        }

        /// Names of all hooked functions (tests, docs).
        pub const HOOKED: &[&str] = &[ $( stringify!($name) ),* ];

        /// Our hook for a hooked function `name`, with its real symbol.
        pub fn hook_by_name(name: &[u8]) -> Option<(*mut c_void, &'static crate::driver::RealSym)> {
            $(
                if name == stringify!($name).as_bytes() {
                    return Some((exports::$name as *const () as *mut c_void, real::$name.sym()));
                }
            )*
            None
        }

        /// Our hook for the variant whose real address is `p` (what the driver's
        /// `cuGetProcAddress` returned), identified by address, never by version.
        pub fn hook_by_real(p: usize) -> Option<(*mut c_void, &'static str)> {
            if p == 0 {
                return None;
            }
            $(
                if real::$name.sym().lib() == crate::driver::Lib::Cuda && real::$name.sym().addr() == p {
                    return Some((exports::$name as *const () as *mut c_void, stringify!($name)));
                }
            )*
            None
        }
    };
}

api! {
    hooks {
        // --- entry points -------------------------------------------------
        fn cuGetProcAddress(symbol: CStrP, pfn: *mut Ptr, cuda_version: i32, flags: u64) -> CUresult => procaddr::get_proc_address;
        fn cuGetProcAddress_v2(symbol: CStrP, pfn: *mut Ptr, cuda_version: i32, flags: u64, status: *mut CUdriverProcAddressQueryResult) -> CUresult => procaddr::get_proc_address_v2;

        // --- memory: allocation -------------------------------------------
        fn cuMemAlloc(dptr: *mut u32, bytesize: u32) -> CUresult => memory::mem_alloc_v1;
        fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult => memory::mem_alloc;
        fn cuMemAllocPitch(dptr: *mut u32, pitch: *mut u32, width: u32, height: u32, elem: u32) -> CUresult => memory::mem_alloc_pitch_v1;
        fn cuMemAllocPitch_v2(dptr: *mut CUdeviceptr, pitch: *mut usize, width: usize, height: usize, elem: u32) -> CUresult => memory::mem_alloc_pitch;
        fn cuMemAllocManaged(dptr: *mut CUdeviceptr, bytesize: usize, flags: u32) -> CUresult => memory::mem_alloc_managed;
        fn cuMemAllocAsync(dptr: *mut CUdeviceptr, bytesize: usize, stream: CUstream) -> CUresult => memory::mem_alloc_async;
        fn cuMemAllocAsync_ptsz(dptr: *mut CUdeviceptr, bytesize: usize, stream: CUstream) -> CUresult => memory::mem_alloc_async;
        fn cuMemAllocFromPoolAsync(dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, stream: CUstream) -> CUresult => memory::mem_alloc_from_pool_async;
        fn cuMemAllocFromPoolAsync_ptsz(dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, stream: CUstream) -> CUresult => memory::mem_alloc_from_pool_async;
        fn cuMemCreate(handle: *mut CUmemGenericAllocationHandle, size: usize, prop: *const CUmemAllocationProp, flags: u64) -> CUresult => memory::mem_create;
        fn cuMemMap(ptr: CUdeviceptr, size: usize, offset: usize, handle: CUmemGenericAllocationHandle, flags: u64) -> CUresult => memory::mem_map;
        fn cuMemRetainAllocationHandle(handle: *mut CUmemGenericAllocationHandle, addr: *mut c_void) -> CUresult => memory::mem_retain_allocation_handle;
        fn cuArrayCreate(arr: *mut CUarray, desc: *const CUDA_ARRAY_DESCRIPTOR_v1) -> CUresult => memory::array_create_v1;
        fn cuArrayCreate_v2(arr: *mut CUarray, desc: *const CUDA_ARRAY_DESCRIPTOR) -> CUresult => memory::array_create;
        fn cuArray3DCreate(arr: *mut CUarray, desc: *const CUDA_ARRAY3D_DESCRIPTOR_v1) -> CUresult => memory::array3d_create_v1;
        fn cuArray3DCreate_v2(arr: *mut CUarray, desc: *const CUDA_ARRAY3D_DESCRIPTOR) -> CUresult => memory::array3d_create;
        fn cuMemSetAccess(ptr: CUdeviceptr, size: usize, desc: *const CUmemAccessDesc, count: usize) -> CUresult => memory::mem_set_access;
        fn cuMemGetAllocationGranularity(gran: *mut usize, prop: *const CUmemAllocationProp, option: u32) -> CUresult => memory::mem_get_allocation_granularity;
        fn cuMemPoolCreate(pool: *mut CUmemoryPool, props: *const CUmemPoolProps) -> CUresult => memory::mem_pool_create;
        fn cuMipmappedArrayCreate(arr: *mut CUmipmappedArray, desc: *const CUDA_ARRAY3D_DESCRIPTOR, levels: u32) -> CUresult => memory::mipmapped_array_create;

        // --- memory: free -------------------------------------------------
        fn cuMemFree(dptr: u32) -> CUresult => memory::mem_free_v1;
        fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult => memory::mem_free;
        fn cuMemFreeAsync(dptr: CUdeviceptr, stream: CUstream) -> CUresult => memory::mem_free_async;
        fn cuMemFreeAsync_ptsz(dptr: CUdeviceptr, stream: CUstream) -> CUresult => memory::mem_free_async;
        fn cuMemRelease(handle: CUmemGenericAllocationHandle) -> CUresult => memory::mem_release;
        fn cuMemUnmap(ptr: CUdeviceptr, size: usize) -> CUresult => memory::mem_unmap;
        fn cuMemPoolDestroy(pool: CUmemoryPool) -> CUresult => memory::mem_pool_destroy;
        fn cuArrayDestroy(arr: CUarray) -> CUresult => memory::array_destroy;
        fn cuMipmappedArrayDestroy(arr: CUmipmappedArray) -> CUresult => memory::mipmapped_array_destroy;

        // --- memory: views ------------------------------------------------
        fn cuMemGetInfo(free: *mut u32, total: *mut u32) -> CUresult => memory::mem_get_info_v1;
        fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult => memory::mem_get_info;
        fn cuDeviceTotalMem(bytes: *mut u32, dev: CUdevice) -> CUresult => memory::device_total_mem_v1;
        fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult => memory::device_total_mem;

        // --- contexts (their reservation counts) ---------------------------
        fn cuCtxCreate(ctx: *mut CUcontext, flags: u32, dev: CUdevice) -> CUresult => context::ctx_create;
        fn cuCtxCreate_v2(ctx: *mut CUcontext, flags: u32, dev: CUdevice) -> CUresult => context::ctx_create;
        fn cuCtxCreate_v3(ctx: *mut CUcontext, params: *mut CUexecAffinityParam, n: i32, flags: u32, dev: CUdevice) -> CUresult => context::ctx_create_v3;
        fn cuCtxCreate_v4(ctx: *mut CUcontext, params: *mut CUctxCreateParams, flags: u32, dev: CUdevice) -> CUresult => context::ctx_create_v4;
        fn cuCtxDestroy(ctx: CUcontext) -> CUresult => context::ctx_destroy;
        fn cuCtxDestroy_v2(ctx: CUcontext) -> CUresult => context::ctx_destroy;
        fn cuDevicePrimaryCtxRetain(ctx: *mut CUcontext, dev: CUdevice) -> CUresult => context::primary_retain;
        fn cuDevicePrimaryCtxRelease(dev: CUdevice) -> CUresult => context::primary_release;
        fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) -> CUresult => context::primary_release;
        fn cuDevicePrimaryCtxReset(dev: CUdevice) -> CUresult => context::primary_reset;
        fn cuDevicePrimaryCtxReset_v2(dev: CUdevice) -> CUresult => context::primary_reset;

        // --- devices (ALIYUN_COM_GPU_VISIBLE_DEVICES) ----------------------
        fn cuDeviceGetCount(count: *mut i32) -> CUresult => device::device_get_count;
        fn cuDeviceGet(dev: *mut CUdevice, ordinal: i32) -> CUresult => device::device_get;
        fn cuDeviceGetByPCIBusId(dev: *mut CUdevice, bus_id: CStrP) -> CUresult => device::device_get_by_pci_bus_id;

        // --- launches (scheduler admission point) -------------------------
        fn cuLaunchKernel(f: CUfunction, gx: u32, gy: u32, gz: u32, bx: u32, by: u32, bz: u32, shmem: u32, stream: CUstream, params: *mut Ptr, extra: *mut Ptr) -> CUresult => launch::launch_kernel;
        fn cuLaunchKernel_ptsz(f: CUfunction, gx: u32, gy: u32, gz: u32, bx: u32, by: u32, bz: u32, shmem: u32, stream: CUstream, params: *mut Ptr, extra: *mut Ptr) -> CUresult => launch::launch_kernel;
        fn cuLaunchKernelEx(config: *const CUlaunchConfig, f: CUfunction, params: *mut Ptr, extra: *mut Ptr) -> CUresult => launch::launch_kernel_ex;
        fn cuLaunchKernelEx_ptsz(config: *const CUlaunchConfig, f: CUfunction, params: *mut Ptr, extra: *mut Ptr) -> CUresult => launch::launch_kernel_ex;
        fn cuLaunchCooperativeKernel(f: CUfunction, gx: u32, gy: u32, gz: u32, bx: u32, by: u32, bz: u32, shmem: u32, stream: CUstream, params: *mut Ptr) -> CUresult => launch::launch_cooperative;
        fn cuLaunchCooperativeKernel_ptsz(f: CUfunction, gx: u32, gy: u32, gz: u32, bx: u32, by: u32, bz: u32, shmem: u32, stream: CUstream, params: *mut Ptr) -> CUresult => launch::launch_cooperative;
        fn cuLaunchCooperativeKernelMultiDevice(list: *mut CUDA_LAUNCH_PARAMS, n: u32, flags: u32) -> CUresult => launch::launch_cooperative_multi;
        fn cuGraphLaunch(exec: CUgraphExec, stream: CUstream) -> CUresult => launch::graph_launch;
        fn cuGraphLaunch_ptsz(exec: CUgraphExec, stream: CUstream) -> CUresult => launch::graph_launch;

        // --- stream capture (the scheduler's drain must not invalidate it) --
        fn cuStreamBeginCapture(stream: CUstream) -> CUresult => stream::begin_capture_v1;
        fn cuStreamBeginCapture_ptsz(stream: CUstream) -> CUresult => stream::begin_capture_v1;
        fn cuStreamBeginCapture_v2(stream: CUstream, mode: u32) -> CUresult => stream::begin_capture;
        fn cuStreamBeginCapture_v2_ptsz(stream: CUstream, mode: u32) -> CUresult => stream::begin_capture;
        fn cuStreamBeginCaptureToGraph(stream: CUstream, graph: CUgraph, deps: *const CUgraphNode, edges: *const c_void, n: usize, mode: u32) -> CUresult => stream::begin_capture_to_graph;
        fn cuStreamBeginCaptureToGraph_ptsz(stream: CUstream, graph: CUgraph, deps: *const CUgraphNode, edges: *const c_void, n: usize, mode: u32) -> CUresult => stream::begin_capture_to_graph;
        fn cuStreamEndCapture(stream: CUstream, graph: *mut CUgraph) -> CUresult => stream::end_capture;
        fn cuStreamEndCapture_ptsz(stream: CUstream, graph: *mut CUgraph) -> CUresult => stream::end_capture;
        fn cuCtxSynchronize() -> CUresult => stream::ctx_synchronize;
        fn cuStreamSynchronize(stream: CUstream) -> CUresult => stream::stream_synchronize;
        fn cuStreamSynchronize_ptsz(stream: CUstream) -> CUresult => stream::stream_synchronize;
        fn cuEventSynchronize(event: CUevent) -> CUresult => stream::event_synchronize;

        // --- NVML ---------------------------------------------------------
        fn nvmlInit() -> nvmlReturn_t => nvml::init;
        fn nvmlInit_v2() -> nvmlReturn_t => nvml::init;
        fn nvmlInitWithFlags(flags: u32) -> nvmlReturn_t => nvml::init_with_flags;
        fn nvmlDeviceGetCount(count: *mut u32) -> nvmlReturn_t => nvml::device_get_count;
        fn nvmlDeviceGetCount_v2(count: *mut u32) -> nvmlReturn_t => nvml::device_get_count;
        fn nvmlDeviceGetHandleByIndex(index: u32, dev: *mut nvmlDevice_t) -> nvmlReturn_t => nvml::handle_by_index;
        fn nvmlDeviceGetHandleByIndex_v2(index: u32, dev: *mut nvmlDevice_t) -> nvmlReturn_t => nvml::handle_by_index;
        fn nvmlDeviceGetHandleByUUID(uuid: CStrP, dev: *mut nvmlDevice_t) -> nvmlReturn_t => nvml::handle_by_uuid;
        fn nvmlDeviceGetHandleByPciBusId(bus: CStrP, dev: *mut nvmlDevice_t) -> nvmlReturn_t => nvml::handle_by_pci;
        fn nvmlDeviceGetHandleByPciBusId_v2(bus: CStrP, dev: *mut nvmlDevice_t) -> nvmlReturn_t => nvml::handle_by_pci;
        fn nvmlDeviceGetIndex(dev: nvmlDevice_t, index: *mut u32) -> nvmlReturn_t => nvml::device_get_index;
        fn nvmlDeviceGetMemoryInfo(dev: nvmlDevice_t, mem: *mut nvmlMemory_t) -> nvmlReturn_t => nvml::memory_info;
        fn nvmlDeviceGetMemoryInfo_v2(dev: nvmlDevice_t, mem: *mut nvmlMemory_v2_t) -> nvmlReturn_t => nvml::memory_info_v2;
        fn nvmlDeviceGetComputeRunningProcesses(dev: nvmlDevice_t, count: *mut u32, infos: *mut nvmlProcessInfo_v1_t) -> nvmlReturn_t => nvml::processes_v1;
        fn nvmlDeviceGetComputeRunningProcesses_v2(dev: nvmlDevice_t, count: *mut u32, infos: *mut nvmlProcessInfo_t) -> nvmlReturn_t => nvml::processes;
        fn nvmlDeviceGetComputeRunningProcesses_v3(dev: nvmlDevice_t, count: *mut u32, infos: *mut nvmlProcessInfo_t) -> nvmlReturn_t => nvml::processes;
    }
    real {
        fn cuInit(flags: u32) -> CUresult;
        fn cuCtxGetDevice(dev: *mut CUdevice) -> CUresult;
        fn cuCtxGetCurrent(ctx: *mut CUcontext) -> CUresult;
        fn cuCtxSetCurrent(ctx: CUcontext) -> CUresult;
        fn cuCtxPushCurrent_v2(ctx: CUcontext) -> CUresult;
        fn cuCtxPopCurrent_v2(ctx: *mut CUcontext) -> CUresult;
        fn cuCtxGetDevice_v2(dev: *mut CUdevice, ctx: CUcontext) -> CUresult;
        fn cuDeviceGetUuid(uuid: *mut CUuuid, dev: CUdevice) -> CUresult;
        fn cuDeviceGetUuid_v2(uuid: *mut CUuuid, dev: CUdevice) -> CUresult;
        fn cuDeviceGetPCIBusId(bus: *mut c_char, len: i32, dev: CUdevice) -> CUresult;
        fn cuMemPoolTrimTo(pool: CUmemoryPool, keep: usize) -> CUresult;
        fn cuStreamGetDevice(stream: CUstream, dev: *mut CUdevice) -> CUresult;
        fn cuStreamGetCtx(stream: CUstream, ctx: *mut CUcontext) -> CUresult;
        fn nvmlShutdown() -> nvmlReturn_t;
        fn nvmlDeviceGetUUID(dev: nvmlDevice_t, uuid: *mut c_char, len: u32) -> nvmlReturn_t;
        fn nvmlDeviceGetPciInfo_v3(dev: nvmlDevice_t, pci: *mut c_void) -> nvmlReturn_t;
    }
}
