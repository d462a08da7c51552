//! The declaration list: every driver function cgpu hooks (with the hook
//! that handles it) or calls itself, declared ONCE with its C signature.
//!
//! `for_each_api!(m)` hands the list to macro `m`. Two consumers:
//! - `process::table` (the layer below the hooks): `sig::<name>` (the C
//!   signature), `real::<name>` (the real function, resolved lazily on the
//!   driver's handle) and `SIGNATURES` (checked against the real
//!   `cuda.h`/`nvml.h` by `tests/entry_paths.rs`);
//! - `hooks`: the exported `extern "C"` symbols, the table our `dlsym`
//!   consults and the one `cuGetProcAddress` uses.
//!
//! Hooked functions go in `hooks` with the path of their body (relative to
//! `src/hooks/`); functions cgpu only calls go in `real`. Pass-through
//! functions are not declared at all: linked programs bind them to the
//! driver directly, and `dlsym`/`cuGetProcAddress` hand out the driver's own
//! pointer (zero added cost). Types are `cgpu-ffi`'s (the headers' names)
//! plus `process::types`' spellings.

macro_rules! for_each_api {
    ($m:ident) => {
        $m! {
            hooks {
                // --- entry points -------------------------------------------------
                fn cuGetProcAddress(symbol: CStrP, pfn: *mut Ptr, cuda_version: i32, flags: cuuint64_t) -> CUresult => procaddr::get_proc_address;
                fn cuGetProcAddress_v2(symbol: CStrP, pfn: *mut Ptr, cuda_version: i32, flags: cuuint64_t, status: *mut CUdriverProcAddressQueryResult) -> CUresult => procaddr::get_proc_address_v2;

                // --- memory: allocation -------------------------------------------
                fn cuMemAlloc(dptr: *mut u32, bytesize: u32) -> CUresult => memory::mem_alloc_v1;
                fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytesize: usize) -> CUresult => memory::mem_alloc;
                fn cuMemAllocPitch(dptr: *mut u32, pitch: *mut u32, width: u32, height: u32, elem: u32) -> CUresult => memory::mem_alloc_pitch_v1;
                fn cuMemAllocPitch_v2(dptr: *mut CUdeviceptr, pitch: *mut usize, width: usize, height: usize, elem: u32) -> CUresult => memory::mem_alloc_pitch;
                fn cuMemAllocManaged(dptr: *mut CUdeviceptr, bytesize: usize, flags: u32) -> CUresult => memory::mem_alloc_managed;
                fn cuMemAllocAsync(dptr: *mut CUdeviceptr, bytesize: usize, stream: CUstream) -> CUresult => memory::mem_alloc_async;
                fn cuMemAllocAsync_ptsz(dptr: *mut CUdeviceptr, bytesize: usize, stream: CUstream) -> CUresult => memory::mem_alloc_async_ptsz;
                fn cuMemAllocFromPoolAsync(dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, stream: CUstream) -> CUresult => memory::mem_alloc_from_pool_async;
                fn cuMemAllocFromPoolAsync_ptsz(dptr: *mut CUdeviceptr, bytesize: usize, pool: CUmemoryPool, stream: CUstream) -> CUresult => memory::mem_alloc_from_pool_async_ptsz;
                fn cuMemCreate(handle: *mut CUmemGenericAllocationHandle, size: usize, prop: *const CUmemAllocationProp, flags: u64) -> CUresult => memory::mem_create;
                fn cuMemMap(ptr: CUdeviceptr, size: usize, offset: usize, handle: CUmemGenericAllocationHandle, flags: u64) -> CUresult => memory::mem_map;
                fn cuMemRetainAllocationHandle(handle: *mut CUmemGenericAllocationHandle, addr: *mut c_void) -> CUresult => memory::mem_retain_allocation_handle;
                fn cuMemExportToShareableHandle(shareable: *mut c_void, handle: CUmemGenericAllocationHandle, handle_type: CUmemAllocationHandleType, flags: u64) -> CUresult => memory::mem_export_to_shareable_handle;
                fn cuMemImportFromShareableHandle(handle: *mut CUmemGenericAllocationHandle, os_handle: *mut c_void, handle_type: CUmemAllocationHandleType) -> CUresult => memory::mem_import_from_shareable_handle;
                fn cuArrayCreate(arr: *mut CUarray, desc: *const CUDA_ARRAY_DESCRIPTOR_v1) -> CUresult => memory::array_create_v1;
                fn cuArrayCreate_v2(arr: *mut CUarray, desc: *const CUDA_ARRAY_DESCRIPTOR) -> CUresult => memory::array_create;
                fn cuArray3DCreate(arr: *mut CUarray, desc: *const CUDA_ARRAY3D_DESCRIPTOR_v1) -> CUresult => memory::array3d_create_v1;
                fn cuArray3DCreate_v2(arr: *mut CUarray, desc: *const CUDA_ARRAY3D_DESCRIPTOR) -> CUresult => memory::array3d_create;
                fn cuMemSetAccess(ptr: CUdeviceptr, size: usize, desc: *const CUmemAccessDesc, count: usize) -> CUresult => memory::mem_set_access;
                fn cuMemGetAllocationGranularity(gran: *mut usize, prop: *const CUmemAllocationProp, option: u32) -> CUresult => memory::mem_get_allocation_granularity;
                fn cuMemPoolCreate(pool: *mut CUmemoryPool, props: *const CUmemPoolProps) -> CUresult => memory::mem_pool_create;
            fn cuDeviceGetDefaultMemPool(pool: *mut CUmemoryPool, dev: CUdevice) -> CUresult => memory::device_get_default_mem_pool;
            fn cuDeviceGetMemPool(pool: *mut CUmemoryPool, dev: CUdevice) -> CUresult => memory::device_get_mem_pool;
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

                // --- modules and libraries (what loading one takes counts) ----------
                fn cuModuleLoad(module: *mut CUmodule, fname: CStrP) -> CUresult => module::module_load;
                fn cuModuleLoadData(module: *mut CUmodule, image: *const c_void) -> CUresult => module::module_load_data;
                fn cuModuleLoadDataEx(module: *mut CUmodule, image: *const c_void, n: u32, options: *mut CUjit_option, values: *mut Ptr) -> CUresult => module::module_load_data_ex;
                fn cuModuleLoadFatBinary(module: *mut CUmodule, fat_cubin: *const c_void) -> CUresult => module::module_load_fat_binary;
                fn cuModuleUnload(module: CUmodule) -> CUresult => module::module_unload;
                fn cuModuleGetGlobal_v2(dptr: *mut CUdeviceptr, bytes: *mut usize, module: CUmodule, name: CStrP) -> CUresult => module::module_get_global;
                fn cuLibraryLoadData(library: *mut CUlibrary, code: *const c_void, jit_options: *mut CUjit_option, jit_values: *mut Ptr, n_jit: u32, lib_options: *mut CUlibraryOption, lib_values: *mut Ptr, n_lib: u32) -> CUresult => module::library_load_data;
                fn cuLibraryLoadFromFile(library: *mut CUlibrary, fname: CStrP, jit_options: *mut CUjit_option, jit_values: *mut Ptr, n_jit: u32, lib_options: *mut CUlibraryOption, lib_values: *mut Ptr, n_lib: u32) -> CUresult => module::library_load_from_file;
                fn cuLibraryUnload(library: CUlibrary) -> CUresult => module::library_unload;
                fn cuLibraryGetGlobal(dptr: *mut CUdeviceptr, bytes: *mut usize, library: CUlibrary, name: CStrP) -> CUresult => module::library_get_global;

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
                fn cuCtxSetLimit(limit: CUlimit, value: usize) -> CUresult => context::ctx_set_limit;

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

                // --- graph memory (alloc nodes: charged at launch) ------------------
                fn cuGraphAddMemAllocNode(pn: *mut CUgraphNode, g: CUgraph, deps: *const CUgraphNode, n: usize, p: *mut CUDA_MEM_ALLOC_NODE_PARAMS) -> CUresult => graph::add_mem_alloc_node;
                fn cuGraphInstantiate(pe: *mut CUgraphExec, g: CUgraph, err: *mut CUgraphNode, log: *mut c_char, n: usize) -> CUresult => graph::instantiate_legacy;
                fn cuGraphInstantiate_v2(pe: *mut CUgraphExec, g: CUgraph, err: *mut CUgraphNode, log: *mut c_char, n: usize) -> CUresult => graph::instantiate_legacy;
                fn cuGraphInstantiateWithFlags(pe: *mut CUgraphExec, g: CUgraph, flags: u64) -> CUresult => graph::instantiate_with_flags;
                fn cuGraphInstantiateWithParams(pe: *mut CUgraphExec, g: CUgraph, p: *mut CUDA_GRAPH_INSTANTIATE_PARAMS) -> CUresult => graph::instantiate_with_params;
                fn cuGraphInstantiateWithParams_ptsz(pe: *mut CUgraphExec, g: CUgraph, p: *mut CUDA_GRAPH_INSTANTIATE_PARAMS) -> CUresult => graph::instantiate_with_params;
                fn cuGraphExecDestroy(exec: CUgraphExec) -> CUresult => graph::exec_destroy;
                fn cuGraphUpload(exec: CUgraphExec, stream: CUstream) -> CUresult => graph::upload;
                fn cuGraphUpload_ptsz(exec: CUgraphExec, stream: CUstream) -> CUresult => graph::upload;
                fn cuDeviceGraphMemTrim(dev: CUdevice) -> CUresult => graph::device_graph_mem_trim;
                fn cuDeviceSetGraphMemAttribute(dev: CUdevice, attr: CUgraphMem_attribute, value: *mut c_void) -> CUresult => graph::device_set_graph_mem_attribute;

                // --- stream capture (the scheduler's drain must not invalidate it) --
                fn cuStreamBeginCapture(stream: CUstream) -> CUresult => stream::begin_capture_v1;
                fn cuStreamBeginCapture_ptsz(stream: CUstream) -> CUresult => stream::begin_capture_v1;
                fn cuStreamBeginCapture_v2(stream: CUstream, mode: u32) -> CUresult => stream::begin_capture;
                fn cuStreamBeginCapture_v2_ptsz(stream: CUstream, mode: u32) -> CUresult => stream::begin_capture;
                fn cuStreamBeginCaptureToGraph(stream: CUstream, graph: CUgraph, deps: *const CUgraphNode, edges: *const CUgraphEdgeData, n: usize, mode: u32) -> CUresult => stream::begin_capture_to_graph;
                fn cuStreamBeginCaptureToGraph_ptsz(stream: CUstream, graph: CUgraph, deps: *const CUgraphNode, edges: *const CUgraphEdgeData, n: usize, mode: u32) -> CUresult => stream::begin_capture_to_graph;
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
                fn cuCtxGetLimit(value: *mut usize, limit: CUlimit) -> CUresult;
                fn cuDeviceGetAttribute(value: *mut i32, attrib: CUdevice_attribute, dev: CUdevice) -> CUresult;
                fn cuDeviceGetUuid(uuid: *mut CUuuid, dev: CUdevice) -> CUresult;
                fn cuDeviceGetUuid_v2(uuid: *mut CUuuid, dev: CUdevice) -> CUresult;
                fn cuDeviceGetPCIBusId(bus: *mut c_char, len: i32, dev: CUdevice) -> CUresult;
                fn cuMemPoolTrimTo(pool: CUmemoryPool, keep: usize) -> CUresult;
                fn cuMemGetAllocationPropertiesFromHandle(prop: *mut CUmemAllocationProp, handle: CUmemGenericAllocationHandle) -> CUresult;
                fn cuStreamGetDevice(stream: CUstream, dev: *mut CUdevice) -> CUresult;
                fn cuStreamGetCtx(stream: CUstream, ctx: *mut CUcontext) -> CUresult;
                fn cuStreamQuery(stream: CUstream) -> CUresult;
                fn cuEventCreate(event: *mut CUevent, flags: u32) -> CUresult;
                fn cuEventRecord(event: CUevent, stream: CUstream) -> CUresult;
                fn cuEventElapsedTime(ms: *mut f32, start: CUevent, end: CUevent) -> CUresult;
                fn cuEventElapsedTime_v2(ms: *mut f32, start: CUevent, end: CUevent) -> CUresult;
                fn cuStreamIsCapturing(stream: CUstream, status: *mut CUstreamCaptureStatus) -> CUresult;
                fn cuGraphGetNodes(g: CUgraph, nodes: *mut CUgraphNode, n: *mut usize) -> CUresult;
                fn cuGraphNodeGetType(node: CUgraphNode, t: *mut CUgraphNodeType) -> CUresult;
                fn cuGraphMemAllocNodeGetParams(node: CUgraphNode, p: *mut CUDA_MEM_ALLOC_NODE_PARAMS) -> CUresult;
                fn cuGraphChildGraphNodeGetGraph(node: CUgraphNode, g: *mut CUgraph) -> CUresult;
                fn cuDeviceGetGraphMemAttribute(dev: CUdevice, attr: CUgraphMem_attribute, value: *mut c_void) -> CUresult;
                fn nvmlShutdown() -> nvmlReturn_t;
                fn nvmlDeviceGetUUID(dev: nvmlDevice_t, uuid: *mut c_char, len: u32) -> nvmlReturn_t;
                fn nvmlDeviceGetPciInfo_v3(dev: nvmlDevice_t, pci: *mut nvmlPciInfo_t) -> nvmlReturn_t;
            }
        }
    };
}
pub(crate) use for_each_api;
