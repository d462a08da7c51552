/*
 * cuclient: one scriptable CUDA driver API + NVML client for cgpu's tests.
 *
 * Built against the real cuda.h / cudaTypedefs.h / nvml.h in three ways
 * (choose with -D at compile time; testkit::compile_c does this):
 *   -DCUCLIENT_LINK      (default) calls the functions linked with -lcuda -lnvidia-ml
 *   -DCUCLIENT_DLSYM     dlopen("libcuda.so.1")/("libnvidia-ml.so.1") + dlsym(real symbol names)
 *   -DCUCLIENT_PROCADDR  dlopen + dlsym("cuGetProcAddress_v2") only, every other CUDA
 *                        function through cuGetProcAddress_v2(name, each variant's
 *                        version, flags) like cudart/cuda-bindings; flags = 2
 *                        (per-thread default stream) when CUCLIENT_PTDS=1.
 *
 * Usage: cuclient [-d DEV] CMD [ARGS]... CMD [ARGS]...
 * Commands run in order; the first CUDA command runs cuInit(0), cuDeviceGet,
 * retains the primary context of DEV and makes it current. Every command prints
 * one line "<cmd> ok key=value..." or "<cmd> err=<CUresult/nvmlReturn_t> ...",
 * flushed at once (tests parse them). Unknown command: "usage" on stderr, exit 2.
 *
 *   init                      just the implicit initialisation ("init ok")
 *   devcount                  devcount ok n=N
 *   name                      name ok name=<device name>
 *   totalmem                  totalmem ok bytes=B
 *   meminfo                   meminfo ok free=F total=T          (cuMemGetInfo_v2)
 *   alloc BYTES               alloc ok ptr=0x.. | alloc err=2    (cuMemAlloc_v2, kept on a stack)
 *   alloc_managed BYTES       same with cuMemAllocManaged
 *   alloc_pitch W H           alloc_pitch ok ptr=.. pitch=P
 *   alloc_async BYTES         cuMemAllocAsync on the default stream
 *   alloc_vmm BYTES           cuMemCreate+AddressReserve+Map+SetAccess (BYTES rounded to granularity)
 *   array W H                 cuArrayCreate_v2 (UINT8, 1 channel)
 *   array_v1 W H              the legacy cuArrayCreate (CUDA_ARRAY_DESCRIPTOR_v1, 32-bit
 *                             sizes), resolved with cuGetProcAddress_v2 at version 2000:
 *                             array_v1 ok | array_v1 err=E (the array is not kept)
 *   free                      frees the last allocation of the stack (any kind)
 *   freeall                   frees all
 *   alloc_until_oom CHUNK     alloc_until_oom ok count=N bytes=B err=E  (keeps them)
 *   memcpy_roundtrip BYTES    memcpy_roundtrip ok | memcpy_roundtrip mismatch | err=
 *   ctx_create / ctx_destroy  cuCtxCreate_v2 on DEV (made current) / destroy it
 *   spin NS COUNT             COUNT launches of cgpu_sim_spin(NS), then cuCtxSynchronize:
 *                             spin ok count=C ns=NS wall_ns=W
 *   spin_async NS COUNT       the launches only (no synchronisation)
 *   spin_events NS COUNT      events around COUNT launches on a new stream:
 *                             spin_events ok ms=<cuEventElapsedTime> wall_ns=W
 *   spin_for MS NS            keep the device busy for MS ms of wall time (batches of NS kernels,
 *                             ~4 ms queued ahead): spin_for ok kernels=K wall_ns=W
 *   graph NS COUNT            a graph of COUNT kernel nodes, launched once and synchronised
 *   launch_ways NS            one cgpu_sim_spin(NS) launch each way: cuLaunchKernel with kernelParams,
 *                             with an `extra` buffer, cuLaunchKernelEx, cuLaunchCooperativeKernel;
 *                             synchronised: launch_ways ok launches=4 wall_ns=W
 *   kernel NAME COUNT         COUNT launches of a no-argument kernel NAME from a PTX module
 *                             (device time CGPU_SIM_KERNEL_NS each), synchronised:
 *                             kernel ok count=C wall_ns=W | kernel err=E
 *   kernel_bin NAME COUNT     same from a binary (ELF) image: any name resolves
 *   sync                      cuCtxSynchronize: sync ok
 *   capture_begin             a new stream, cuStreamBeginCapture_v2(GLOBAL) on it: capture_begin ok
 *   capture_spin NS COUNT     COUNT launches of cgpu_sim_spin(NS) into the capturing stream
 *                             (recorded, not run): capture_spin ok count=C
 *   capture_status            cuStreamIsCapturing: capture_status ok status=0|1|2 (NONE/ACTIVE/INVALIDATED)
 *   capture_sync              cuStreamSynchronize of the capturing stream: capture_sync ok | err=E
 *   capture_end               cuStreamEndCapture: capture_end ok graph=set | capture_end err=E graph=null|set
 *                             (the graph is kept for graph_launch_last)
 *   graph_launch_last         instantiate the last captured graph, cuGraphLaunch it on the capture
 *                             stream, cuStreamSynchronize: graph_launch_last ok wall_ns=W | err=E
 *   sleep MS                  sleep ok
 *   clock                     clock ms=M  (CLOCK_MONOTONIC, in milliseconds)
 *   wait_file PATH            waits until PATH exists (at most 120 s): wait_file ok | wait_file err=timeout
 *   fork_sleep S              fork a child that sleeps S seconds then _exit(0)s
 *                             without touching CUDA: fork_sleep ok child=<pid>
 *   ready                     prints "ready" (a synchronisation point for tests)
 *   hold                      prints "holding" and sleeps until killed (at most
 *                             $CUCLIENT_HOLD_MAX_S seconds, default 600, so that a
 *                             failed test leaves no process behind for long)
 *   pid                       pid ok pid=<getpid()>
 *   procaddr NAME VER FLAGS   procaddr ok|err=E name=NAME status=S ptr=0x.. (cuGetProcAddress_v2)
 *   variants                  for a fixed list of (name, version, flags) that covers distinct ABIs,
 *                             what cuGetProcAddress_v2 returned, one line each:
 *                             variant sym=S ver=V flags=F rc=R status=S null=0|1 hook=H aliases=A
 *                             hook: the libcgpu export it is (what RTLD_DEFAULT finds, if that
 *                             lies in libcgpu), else "driver"; aliases: the names under which
 *                             the libcuda.so.1 handle exports that address ("-" if none);
 *                             meaningful without the preload, where both are the driver's
 *   nvml_init                 nvml_init ok (nvmlInit_v2; the NVML commands do it implicitly)
 *   nvml_count                nvml_count ok n=N
 *   nvml_meminfo              nvml_meminfo ok total= used= free=  (nvmlDeviceGetMemoryInfo)
 *   nvml_meminfo_v2           nvml_meminfo_v2 ok total= reserved= used= free= version=
 *   nvml_procs                nvml_procs ok n=N <pid>:<bytes>...  (ComputeRunningProcesses_v3)
 *   nvml_util                 nvml_util ok gpu=P               (UtilizationRates)
 *   nvml_uuid                 nvml_uuid ok uuid=GPU-...
 *   nvml_putil                nvml_putil ok n=N <pid>:<smUtil%>...  (ProcessUtilization)
 *   same_lib                  same_lib ok same=1|0: dlopen("libcuda.so.1") and
 *                             dlopen("libnvidia-ml.so.1") give the same loaded library
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <cudaTypedefs.h>
#include <nvml.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#if !defined(CUCLIENT_LINK) && !defined(CUCLIENT_DLSYM) && !defined(CUCLIENT_PROCADDR)
#define CUCLIENT_LINK 1
#endif

/* X(field, PFN type, exported symbol, API name for cuGetProcAddress, version) */
#define CU_FUNCS(X)                                                                          \
    X(Init, PFN_cuInit_v2000, "cuInit", "cuInit", 2000)                                      \
    X(DeviceGet, PFN_cuDeviceGet_v2000, "cuDeviceGet", "cuDeviceGet", 2000)                  \
    X(DeviceGetCount, PFN_cuDeviceGetCount_v2000, "cuDeviceGetCount", "cuDeviceGetCount", 2000) \
    X(DeviceGetName, PFN_cuDeviceGetName_v2000, "cuDeviceGetName", "cuDeviceGetName", 2000)  \
    X(DeviceTotalMem, PFN_cuDeviceTotalMem_v3020, "cuDeviceTotalMem_v2", "cuDeviceTotalMem", 3020) \
    X(DevicePrimaryCtxRetain, PFN_cuDevicePrimaryCtxRetain_v7000, "cuDevicePrimaryCtxRetain", "cuDevicePrimaryCtxRetain", 7000) \
    X(CtxSetCurrent, PFN_cuCtxSetCurrent_v4000, "cuCtxSetCurrent", "cuCtxSetCurrent", 4000)  \
    X(CtxCreate, PFN_cuCtxCreate_v3020, "cuCtxCreate_v2", "cuCtxCreate", 3020)               \
    X(CtxDestroy, PFN_cuCtxDestroy_v4000, "cuCtxDestroy_v2", "cuCtxDestroy", 4000)           \
    X(CtxSynchronize, PFN_cuCtxSynchronize_v2000, "cuCtxSynchronize", "cuCtxSynchronize", 2000) \
    X(MemGetInfo, PFN_cuMemGetInfo_v3020, "cuMemGetInfo_v2", "cuMemGetInfo", 3020)           \
    X(MemAlloc, PFN_cuMemAlloc_v3020, "cuMemAlloc_v2", "cuMemAlloc", 3020)                   \
    X(MemAllocManaged, PFN_cuMemAllocManaged_v6000, "cuMemAllocManaged", "cuMemAllocManaged", 6000) \
    X(MemAllocPitch, PFN_cuMemAllocPitch_v3020, "cuMemAllocPitch_v2", "cuMemAllocPitch", 3020) \
    X(MemAllocAsync, PFN_cuMemAllocAsync_v11020, "cuMemAllocAsync", "cuMemAllocAsync", 11020) \
    X(MemFree, PFN_cuMemFree_v3020, "cuMemFree_v2", "cuMemFree", 3020)                       \
    X(MemFreeAsync, PFN_cuMemFreeAsync_v11020, "cuMemFreeAsync", "cuMemFreeAsync", 11020)    \
    X(MemcpyHtoD, PFN_cuMemcpyHtoD_v3020, "cuMemcpyHtoD_v2", "cuMemcpyHtoD", 3020)           \
    X(MemcpyDtoH, PFN_cuMemcpyDtoH_v3020, "cuMemcpyDtoH_v2", "cuMemcpyDtoH", 3020)           \
    X(MemcpyDtoD, PFN_cuMemcpyDtoD_v3020, "cuMemcpyDtoD_v2", "cuMemcpyDtoD", 3020)           \
    X(MemsetD8, PFN_cuMemsetD8_v3020, "cuMemsetD8_v2", "cuMemsetD8", 3020)                   \
    X(MemCreate, PFN_cuMemCreate_v10020, "cuMemCreate", "cuMemCreate", 10020)                \
    X(MemRelease, PFN_cuMemRelease_v10020, "cuMemRelease", "cuMemRelease", 10020)            \
    X(MemAddressReserve, PFN_cuMemAddressReserve_v10020, "cuMemAddressReserve", "cuMemAddressReserve", 10020) \
    X(MemAddressFree, PFN_cuMemAddressFree_v10020, "cuMemAddressFree", "cuMemAddressFree", 10020) \
    X(MemMap, PFN_cuMemMap_v10020, "cuMemMap", "cuMemMap", 10020)                            \
    X(MemUnmap, PFN_cuMemUnmap_v10020, "cuMemUnmap", "cuMemUnmap", 10020)                    \
    X(MemSetAccess, PFN_cuMemSetAccess_v10020, "cuMemSetAccess", "cuMemSetAccess", 10020)    \
    X(MemGetAllocationGranularity, PFN_cuMemGetAllocationGranularity_v10020, "cuMemGetAllocationGranularity", "cuMemGetAllocationGranularity", 10020) \
    X(ArrayCreate, PFN_cuArrayCreate_v3020, "cuArrayCreate_v2", "cuArrayCreate", 3020)       \
    X(ArrayDestroy, PFN_cuArrayDestroy_v2000, "cuArrayDestroy", "cuArrayDestroy", 2000)      \
    X(ModuleLoadData, PFN_cuModuleLoadData_v2000, "cuModuleLoadData", "cuModuleLoadData", 2000) \
    X(ModuleGetFunction, PFN_cuModuleGetFunction_v2000, "cuModuleGetFunction", "cuModuleGetFunction", 2000) \
    X(LaunchKernel, PFN_cuLaunchKernel_v4000, "cuLaunchKernel", "cuLaunchKernel", 4000)      \
    X(LaunchKernelEx, PFN_cuLaunchKernelEx_v11060, "cuLaunchKernelEx", "cuLaunchKernelEx", 11060) \
    X(LaunchCooperativeKernel, PFN_cuLaunchCooperativeKernel_v9000, "cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel", 9000) \
    X(StreamCreate, PFN_cuStreamCreate_v2000, "cuStreamCreate", "cuStreamCreate", 2000)      \
    X(StreamSynchronize, PFN_cuStreamSynchronize_v2000, "cuStreamSynchronize", "cuStreamSynchronize", 2000) \
    X(StreamDestroy, PFN_cuStreamDestroy_v4000, "cuStreamDestroy_v2", "cuStreamDestroy", 4000) \
    X(EventCreate, PFN_cuEventCreate_v2000, "cuEventCreate", "cuEventCreate", 2000)          \
    X(EventRecord, PFN_cuEventRecord_v2000, "cuEventRecord", "cuEventRecord", 2000)          \
    X(EventSynchronize, PFN_cuEventSynchronize_v2000, "cuEventSynchronize", "cuEventSynchronize", 2000) \
    X(EventElapsedTime, PFN_cuEventElapsedTime_v2000, "cuEventElapsedTime", "cuEventElapsedTime", 2000) \
    X(EventDestroy, PFN_cuEventDestroy_v4000, "cuEventDestroy_v2", "cuEventDestroy", 4000)   \
    X(GraphCreate, PFN_cuGraphCreate_v10000, "cuGraphCreate", "cuGraphCreate", 10000)        \
    X(GraphAddKernelNode, PFN_cuGraphAddKernelNode_v12000, "cuGraphAddKernelNode_v2", "cuGraphAddKernelNode", 12000) \
    X(GraphInstantiateWithFlags, PFN_cuGraphInstantiateWithFlags_v11040, "cuGraphInstantiateWithFlags", "cuGraphInstantiateWithFlags", 11040) \
    X(GraphLaunch, PFN_cuGraphLaunch_v10000, "cuGraphLaunch", "cuGraphLaunch", 10000)        \
    X(GraphExecDestroy, PFN_cuGraphExecDestroy_v10000, "cuGraphExecDestroy", "cuGraphExecDestroy", 10000) \
    X(GraphDestroy, PFN_cuGraphDestroy_v10000, "cuGraphDestroy", "cuGraphDestroy", 10000)  \
    X(StreamBeginCapture, PFN_cuStreamBeginCapture_v10010, "cuStreamBeginCapture_v2", "cuStreamBeginCapture", 10010) \
    X(StreamEndCapture, PFN_cuStreamEndCapture_v10000, "cuStreamEndCapture", "cuStreamEndCapture", 10000) \
    X(StreamIsCapturing, PFN_cuStreamIsCapturing_v10000, "cuStreamIsCapturing", "cuStreamIsCapturing", 10000)

#define NVML_FUNCS(X)                                                                        \
    X(Init_v2, __typeof__(&nvmlInit_v2), "nvmlInit_v2")                                         \
    X(DeviceGetCount_v2, __typeof__(&nvmlDeviceGetCount_v2), "nvmlDeviceGetCount_v2")          \
    X(DeviceGetHandleByIndex_v2, __typeof__(&nvmlDeviceGetHandleByIndex_v2), "nvmlDeviceGetHandleByIndex_v2") \
    X(DeviceGetMemoryInfo, __typeof__(&nvmlDeviceGetMemoryInfo), "nvmlDeviceGetMemoryInfo") \
    X(DeviceGetMemoryInfo_v2, __typeof__(&nvmlDeviceGetMemoryInfo_v2), "nvmlDeviceGetMemoryInfo_v2") \
    X(DeviceGetComputeRunningProcesses_v3, __typeof__(&nvmlDeviceGetComputeRunningProcesses_v3), "nvmlDeviceGetComputeRunningProcesses_v3") \
    X(DeviceGetUtilizationRates, __typeof__(&nvmlDeviceGetUtilizationRates), "nvmlDeviceGetUtilizationRates") \
    X(DeviceGetUUID, __typeof__(&nvmlDeviceGetUUID), "nvmlDeviceGetUUID")                  \
    X(DeviceGetProcessUtilization, __typeof__(&nvmlDeviceGetProcessUtilization), "nvmlDeviceGetProcessUtilization")

static struct {
#define F(field, type, sym, api, ver) type field;
    CU_FUNCS(F)
#undef F
} cu;

static struct {
#define F(field, type, sym) type field;
    NVML_FUNCS(F)
#undef F
} nv;

static PFN_cuGetProcAddress_v12000 get_proc;

static void die(const char *what) {
    fprintf(stderr, "cuclient: %s\n", what);
    exit(3);
}

#if defined(CUCLIENT_LINK)
static void load_cuda(void) {
#define F(field, type, sym, api, ver) cu.field = (type)cu##field;
    CU_FUNCS(F)
#undef F
    get_proc = (PFN_cuGetProcAddress_v12000)cuGetProcAddress;
}
static void load_nvml(void) {
#define F(field, type, sym) nv.field = (type)nvml##field;
    NVML_FUNCS(F)
#undef F
}
#else
static void *cuda_handle(void) {
    static void *h;
    if (!h && !(h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL))) die(dlerror());
    return h;
}
static void load_cuda(void) {
    void *h = cuda_handle();
    get_proc = (PFN_cuGetProcAddress_v12000)dlsym(h, "cuGetProcAddress_v2");
#if defined(CUCLIENT_DLSYM)
#define F(field, type, sym, api, ver) \
    if (!(cu.field = (type)dlsym(h, sym))) die("dlsym " sym);
    CU_FUNCS(F)
#undef F
#else
    if (!get_proc) die("dlsym cuGetProcAddress_v2");
    const char *e = getenv("CUCLIENT_PTDS");
    cuuint64_t flags = (e && *e == '1') ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0;
    CUdriverProcAddressQueryResult st;
#define F(field, type, sym, api, ver)                                           \
    if (get_proc(api, (void **)&cu.field, ver, flags, &st) != CUDA_SUCCESS ||   \
        st != CU_GET_PROC_ADDRESS_SUCCESS || !cu.field)                         \
        die("cuGetProcAddress_v2 " api);
    CU_FUNCS(F)
#undef F
#endif
}
static void load_nvml(void) {
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) die(dlerror());
#define F(field, type, sym) \
    if (!(nv.field = (type)dlsym(h, sym))) die("dlsym " sym);
    NVML_FUNCS(F)
#undef F
}
#endif

static int dev_ordinal = 0;
static CUdevice dev;
static CUcontext primary, created;
static int cuda_ready, nvml_ready;
static CUresult init_err;

/* Retried by the next CUDA command until it succeeds (a refused primary
 * context may be granted later, once cgpu can account for it). */
static int cuda_init(void) {
    static int loaded;
    if (cuda_ready) return 1;
    if (!loaded) { loaded = 1; load_cuda(); }
    if ((init_err = cu.Init(0)) || (init_err = cu.DeviceGet(&dev, dev_ordinal)) ||
        (init_err = cu.DevicePrimaryCtxRetain(&primary, dev)) || (init_err = cu.CtxSetCurrent(primary)))
        return 0;
    cuda_ready = 1;
    return 1;
}

static nvmlDevice_t nvml_dev(void) {
    static nvmlDevice_t h;
    if (!nvml_ready) {
        nvml_ready = 1;
        load_nvml();
        nvmlReturn_t r = nv.Init_v2();
        if (r) { printf("nvml_init err=%d\n", r); return NULL; }
        if ((r = nv.DeviceGetHandleByIndex_v2(dev_ordinal, &h))) { printf("nvml_handle err=%d\n", r); return NULL; }
    }
    return h;
}

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + t.tv_nsec;
}

enum kind { K_DEV, K_ASYNC, K_VMM, K_ARRAY };
struct alloc { CUdeviceptr p; size_t size; enum kind kind; CUmemGenericAllocationHandle h; CUarray arr; };
static struct alloc allocs[1 << 16];
static int nallocs;

static const char *ptx =
    ".version 7.0\n.target sm_52\n.address_size 64\n"
    ".visible .entry cgpu_sim_spin(.param .u64 ns)\n{\n ret;\n}\n";
static CUfunction spin_fn;
static CUstream cap_stream; /* capture_* commands */
static CUgraph cap_graph;

static CUresult spin_func(void) {
    if (spin_fn) return CUDA_SUCCESS;
    CUmodule m;
    CUresult r = cu.ModuleLoadData(&m, ptx);
    if (r) return r;
    return cu.ModuleGetFunction(&spin_fn, m, "cgpu_sim_spin");
}

static CUresult launch_spin(uint64_t ns, CUstream s) {
    void *args[] = {&ns};
    return cu.LaunchKernel(spin_fn, 1, 1, 1, 32, 1, 1, 0, s, args, NULL);
}

static CUresult free_one(struct alloc *a) {
    switch (a->kind) {
    case K_DEV: return cu.MemFree(a->p);
    case K_ASYNC: return cu.MemFreeAsync(a->p, 0);
    case K_ARRAY: return cu.ArrayDestroy(a->arr);
    case K_VMM: {
        CUresult r = cu.MemUnmap(a->p, a->size);
        if (!r) r = cu.MemAddressFree(a->p, a->size);
        if (!r) r = cu.MemRelease(a->h);
        return r;
    }
    }
    return CUDA_ERROR_INVALID_VALUE;
}

static CUresult alloc_vmm(size_t bytes, struct alloc *a) {
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = dev;
    size_t gran = 0;
    CUresult r = cu.MemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
    if (r) return r;
    size_t size = (bytes + gran - 1) / gran * gran;
    CUmemGenericAllocationHandle h;
    if ((r = cu.MemCreate(&h, size, &prop, 0))) return r;
    CUdeviceptr p;
    if ((r = cu.MemAddressReserve(&p, size, 0, 0, 0))) { cu.MemRelease(h); return r; }
    if ((r = cu.MemMap(p, size, 0, h, 0))) { cu.MemAddressFree(p, size); cu.MemRelease(h); return r; }
    CUmemAccessDesc acc;
    memset(&acc, 0, sizeof acc);
    acc.location = prop.location;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if ((r = cu.MemSetAccess(p, size, &acc, 1))) return r;
    a->p = p; a->size = size; a->h = h; a->kind = K_VMM;
    return CUDA_SUCCESS;
}

#define NEED(n) do { if (i + (n) >= argc) { fprintf(stderr, "usage: %s needs %d args\n", c, n); return 2; } } while (0)
#define CUDA_OR_ERR(cmd) do { if (!cuda_init()) { printf("%s err=%d\n", cmd, init_err); continue; } } while (0)

/* `variants`: which of libcgpu's exports cuGetProcAddress_v2 hands back. */
static void variants(void) {
    static const struct { const char *sym; int ver; cuuint64_t flags; } q[] = {
        {"cuCtxCreate", 3020, 0}, {"cuCtxCreate", 11040, 0}, {"cuCtxCreate", 12050, 0},
        {"cuMemAlloc", 3020, 0}, {"cuMemGetInfo", 3020, 0}, {"cuMemFree", 3020, 0},
        {"cuMemAllocAsync", 11020, 0}, {"cuMemAllocAsync", 11020, 2},
        {"cuLaunchKernel", 4000, 0}, {"cuLaunchKernel", 7000, 2},
        {"cuGraphLaunch", 10000, 2}, {"cuMemFreeAsync", 11020, 2},
        {"cuDevicePrimaryCtxRelease", 11000, 0}, {"cuGetProcAddress", 11030, 0},
        {"cuGetProcAddress", 12000, 0}, {"cuCtxGetDevice", 2000, 0}, {"cuGetExportTable", 3000, 0},
    };
    static const char *const ours[] = {
        "cuCtxCreate", "cuCtxCreate_v2", "cuCtxCreate_v3", "cuCtxCreate_v4", "cuMemAlloc_v2",
        "cuMemGetInfo_v2", "cuMemFree_v2", "cuMemAllocAsync", "cuMemAllocAsync_ptsz",
        "cuLaunchKernel", "cuLaunchKernel_ptsz", "cuGraphLaunch", "cuGraphLaunch_ptsz",
        "cuMemFreeAsync", "cuMemFreeAsync_ptsz", "cuDevicePrimaryCtxRelease",
        "cuDevicePrimaryCtxRelease_v2", "cuGetProcAddress", "cuGetProcAddress_v2",
    };
    void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) die(dlerror());
    if (!get_proc) load_cuda();
    for (size_t i = 0; i < sizeof q / sizeof q[0]; i++) {
        void *p = NULL;
        CUdriverProcAddressQueryResult st = 0;
        CUresult rc = get_proc(q[i].sym, &p, q[i].ver, q[i].flags, &st);
        const char *which = "driver";
        for (size_t j = 0; j < sizeof ours / sizeof ours[0]; j++) {
            void *o = dlsym(RTLD_DEFAULT, ours[j]);
            Dl_info di;
            if (o && o == p && dladdr(o, &di) && di.dli_fname && strstr(di.dli_fname, "libcgpu")) {
                which = ours[j];
                break;
            }
        }
        char aliases[1024] = "";
        for (size_t j = 0; j < sizeof ours / sizeof ours[0]; j++) {
            if (p && dlsym(h, ours[j]) == p) {
                if (aliases[0]) strcat(aliases, ",");
                strcat(aliases, ours[j]);
            }
        }
        printf("variant sym=%s ver=%d flags=%llu rc=%d status=%d null=%d hook=%s aliases=%s\n", q[i].sym,
               q[i].ver, (unsigned long long)q[i].flags, (int)rc, (int)st, p == NULL, which,
               aliases[0] ? aliases : "-");
    }
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    int i = 1;
    if (argc > 2 && !strcmp(argv[1], "-d")) { dev_ordinal = atoi(argv[2]); i = 3; }
    for (; i < argc; i++) {
        const char *c = argv[i];
        CUresult r;
        if (!strcmp(c, "init")) {
            CUDA_OR_ERR(c);
            printf("init ok\n");
        } else if (!strcmp(c, "devcount")) {
            CUDA_OR_ERR(c);
            int n = 0;
            if ((r = cu.DeviceGetCount(&n))) printf("devcount err=%d\n", r);
            else printf("devcount ok n=%d\n", n);
        } else if (!strcmp(c, "name")) {
            CUDA_OR_ERR(c);
            char name[256];
            if ((r = cu.DeviceGetName(name, sizeof name, dev))) printf("name err=%d\n", r);
            else printf("name ok name=%s\n", name);
        } else if (!strcmp(c, "totalmem")) {
            CUDA_OR_ERR(c);
            size_t t = 0;
            if ((r = cu.DeviceTotalMem(&t, dev))) printf("totalmem err=%d\n", r);
            else printf("totalmem ok bytes=%zu\n", t);
        } else if (!strcmp(c, "meminfo")) {
            CUDA_OR_ERR(c);
            size_t f = 0, t = 0;
            if ((r = cu.MemGetInfo(&f, &t))) printf("meminfo err=%d\n", r);
            else printf("meminfo ok free=%zu total=%zu\n", f, t);
        } else if (!strcmp(c, "alloc") || !strcmp(c, "alloc_managed") || !strcmp(c, "alloc_async") ||
                   !strcmp(c, "alloc_vmm")) {
            NEED(1);
            size_t n = strtoull(argv[++i], NULL, 0);
            CUDA_OR_ERR(c);
            struct alloc a = {0, n, K_DEV, 0, NULL};
            if (!strcmp(c, "alloc")) r = cu.MemAlloc(&a.p, n);
            else if (!strcmp(c, "alloc_managed")) r = cu.MemAllocManaged(&a.p, n, CU_MEM_ATTACH_GLOBAL);
            else if (!strcmp(c, "alloc_async")) { a.kind = K_ASYNC; r = cu.MemAllocAsync(&a.p, n, 0); }
            else r = alloc_vmm(n, &a);
            if (r) printf("%s err=%d\n", c, r);
            else { allocs[nallocs++] = a; printf("%s ok ptr=0x%llx size=%zu\n", c, (unsigned long long)a.p, a.size); }
        } else if (!strcmp(c, "alloc_pitch")) {
            NEED(2);
            size_t w = strtoull(argv[i + 1], NULL, 0), h = strtoull(argv[i + 2], NULL, 0);
            i += 2;
            CUDA_OR_ERR(c);
            struct alloc a = {0, 0, K_DEV, 0, NULL};
            size_t pitch = 0;
            if ((r = cu.MemAllocPitch(&a.p, &pitch, w, h, 4))) printf("alloc_pitch err=%d\n", r);
            else { a.size = pitch * h; allocs[nallocs++] = a; printf("alloc_pitch ok ptr=0x%llx pitch=%zu\n", (unsigned long long)a.p, pitch); }
        } else if (!strcmp(c, "array")) {
            NEED(2);
            CUDA_ARRAY_DESCRIPTOR d = {strtoull(argv[i + 1], NULL, 0), strtoull(argv[i + 2], NULL, 0), CU_AD_FORMAT_UNSIGNED_INT8, 1};
            i += 2;
            CUDA_OR_ERR(c);
            struct alloc a = {0, d.Width * d.Height, K_ARRAY, 0, NULL};
            if ((r = cu.ArrayCreate(&a.arr, &d))) printf("array err=%d\n", r);
            else { allocs[nallocs++] = a; printf("array ok\n"); }
        } else if (!strcmp(c, "array_v1")) {
            NEED(2);
            /* CUDA_ARRAY_DESCRIPTOR_v1: cuda.h declares it only for the driver's own build */
            struct { unsigned Width, Height; CUarray_format Format; unsigned NumChannels; } d = {
                (unsigned)strtoul(argv[i + 1], NULL, 0), (unsigned)strtoul(argv[i + 2], NULL, 0),
                CU_AD_FORMAT_UNSIGNED_INT8, 1};
            i += 2;
            CUDA_OR_ERR(c);
            CUresult (*create_v1)(CUarray *, const void *) = NULL;
            CUdriverProcAddressQueryResult st = 99;
            r = get_proc("cuArrayCreate", (void **)&create_v1, 2000, 0, &st);
            if (r || !create_v1) { printf("array_v1 err=%d status=%d\n", r, (int)st); continue; }
            CUarray arr = NULL;
            if ((r = create_v1(&arr, &d))) printf("array_v1 err=%d\n", r);
            else { cu.ArrayDestroy(arr); printf("array_v1 ok\n"); }
        } else if (!strcmp(c, "free")) {
            CUDA_OR_ERR(c);
            if (!nallocs) { printf("free err=none\n"); continue; }
            r = free_one(&allocs[--nallocs]);
            if (r) printf("free err=%d\n", r); else printf("free ok\n");
        } else if (!strcmp(c, "freeall")) {
            CUDA_OR_ERR(c);
            int n = 0;
            r = CUDA_SUCCESS;
            while (nallocs) { CUresult e = free_one(&allocs[--nallocs]); if (e && !r) r = e; n++; }
            if (r) printf("freeall err=%d\n", r); else printf("freeall ok n=%d\n", n);
        } else if (!strcmp(c, "alloc_until_oom")) {
            NEED(1);
            size_t chunk = strtoull(argv[++i], NULL, 0);
            CUDA_OR_ERR(c);
            size_t count = 0;
            for (;;) {
                struct alloc a = {0, chunk, K_DEV, 0, NULL};
                if ((r = cu.MemAlloc(&a.p, chunk))) break;
                if (nallocs < (int)(sizeof allocs / sizeof *allocs)) allocs[nallocs++] = a;
                count++;
            }
            printf("alloc_until_oom ok count=%zu bytes=%zu err=%d\n", count, count * chunk, r);
        } else if (!strcmp(c, "memcpy_roundtrip")) {
            NEED(1);
            size_t n = strtoull(argv[++i], NULL, 0);
            CUDA_OR_ERR(c);
            unsigned char *a = malloc(n), *b = malloc(n);
            for (size_t k = 0; k < n; k++) a[k] = (unsigned char)(k * 131 + 7);
            memset(b, 0, n);
            CUdeviceptr d1 = 0, d2 = 0;
            if ((r = cu.MemAlloc(&d1, n)) || (r = cu.MemAlloc(&d2, n)) || (r = cu.MemcpyHtoD(d1, a, n)) ||
                (r = cu.MemcpyDtoD(d2, d1, n)) || (r = cu.MemcpyDtoH(b, d2, n)))
                printf("memcpy_roundtrip err=%d\n", r);
            else
                printf("memcpy_roundtrip %s\n", memcmp(a, b, n) ? "mismatch" : "ok");
            if (d1) cu.MemFree(d1);
            if (d2) cu.MemFree(d2);
            free(a); free(b);
        } else if (!strcmp(c, "ctx_create")) {
            CUDA_OR_ERR(c);
            if ((r = cu.CtxCreate(&created, 0, dev))) printf("ctx_create err=%d\n", r);
            else printf("ctx_create ok\n");
        } else if (!strcmp(c, "ctx_destroy")) {
            CUDA_OR_ERR(c);
            if ((r = cu.CtxDestroy(created))) printf("ctx_destroy err=%d\n", r);
            else { created = NULL; cu.CtxSetCurrent(primary); printf("ctx_destroy ok\n"); }
        } else if (!strcmp(c, "spin") || !strcmp(c, "spin_async")) {
            NEED(2);
            uint64_t ns = strtoull(argv[i + 1], NULL, 0);
            long count = atol(argv[i + 2]);
            i += 2;
            CUDA_OR_ERR(c);
            if ((r = spin_func())) { printf("%s err=%d\n", c, r); continue; }
            uint64_t t0 = now_ns();
            r = CUDA_SUCCESS;
            for (long k = 0; k < count && !r; k++) r = launch_spin(ns, 0);
            if (!r && !strcmp(c, "spin")) r = cu.CtxSynchronize();
            if (r) printf("%s err=%d\n", c, r);
            else printf("%s ok count=%ld ns=%llu wall_ns=%llu\n", c, count, (unsigned long long)ns, (unsigned long long)(now_ns() - t0));
        } else if (!strcmp(c, "spin_events")) {
            NEED(2);
            uint64_t ns = strtoull(argv[i + 1], NULL, 0);
            long count = atol(argv[i + 2]);
            i += 2;
            CUDA_OR_ERR(c);
            CUstream s; CUevent e0, e1;
            if ((r = spin_func()) || (r = cu.StreamCreate(&s, 0)) || (r = cu.EventCreate(&e0, 0)) ||
                (r = cu.EventCreate(&e1, 0))) { printf("spin_events err=%d\n", r); continue; }
            uint64_t t0 = now_ns();
            r = cu.EventRecord(e0, s);
            for (long k = 0; k < count && !r; k++) r = launch_spin(ns, s);
            if (!r) r = cu.EventRecord(e1, s);
            if (!r) r = cu.EventSynchronize(e1);
            float ms = 0;
            if (!r) r = cu.EventElapsedTime(&ms, e0, e1);
            if (r) printf("spin_events err=%d\n", r);
            else printf("spin_events ok ms=%.6f wall_ns=%llu\n", ms, (unsigned long long)(now_ns() - t0));
            cu.EventDestroy(e0); cu.EventDestroy(e1); cu.StreamDestroy(s);
        } else if (!strcmp(c, "spin_for")) {
            NEED(2);
            uint64_t ms = strtoull(argv[i + 1], NULL, 0), ns = strtoull(argv[i + 2], NULL, 0);
            i += 2;
            CUDA_OR_ERR(c);
            if ((r = spin_func())) { printf("spin_for err=%d\n", r); continue; }
            if (!ns) ns = 1;
            long batch = (long)(4000000 / ns) + 1;
            CUstream s;
            CUevent ev[2];
            if ((r = cu.StreamCreate(&s, 0)) || (r = cu.EventCreate(&ev[0], 2)) || (r = cu.EventCreate(&ev[1], 2))) {
                printf("spin_for err=%d\n", r); continue;
            }
            uint64_t t0 = now_ns(), end = t0 + ms * 1000000ull;
            long kernels = 0;
            int cur = 0, pending = 0;
            /* Double-buffered: keep ~one batch queued while waiting on the previous. */
            while (!r && now_ns() < end) {
                for (long k = 0; k < batch && !r; k++) r = launch_spin(ns, s);
                kernels += batch;
                if (!r) r = cu.EventRecord(ev[cur], s);
                if (!r && pending) r = cu.EventSynchronize(ev[cur ^ 1]);
                pending = 1;
                cur ^= 1;
            }
            if (!r) r = cu.StreamSynchronize(s);
            if (r) printf("spin_for err=%d\n", r);
            else printf("spin_for ok kernels=%ld wall_ns=%llu\n", kernels, (unsigned long long)(now_ns() - t0));
            cu.StreamDestroy(s);
        } else if (!strcmp(c, "graph")) {
            NEED(2);
            uint64_t ns = strtoull(argv[i + 1], NULL, 0);
            long count = atol(argv[i + 2]);
            i += 2;
            CUDA_OR_ERR(c);
            CUgraph g; CUgraphExec ge; CUgraphNode prev = NULL, node;
            if ((r = spin_func()) || (r = cu.GraphCreate(&g, 0))) { printf("graph err=%d\n", r); continue; }
            void *args[] = {&ns};
            CUDA_KERNEL_NODE_PARAMS p;
            memset(&p, 0, sizeof p);
            p.func = spin_fn; p.gridDimX = p.gridDimY = p.gridDimZ = 1; p.blockDimX = 32; p.blockDimY = p.blockDimZ = 1;
            p.kernelParams = args;
            for (long k = 0; k < count && !r; k++) { r = cu.GraphAddKernelNode(&node, g, prev ? &prev : NULL, prev ? 1 : 0, &p); prev = node; }
            uint64_t t0 = now_ns();
            if (!r) r = cu.GraphInstantiateWithFlags(&ge, g, 0);
            if (!r) r = cu.GraphLaunch(ge, 0);
            if (!r) r = cu.CtxSynchronize();
            if (r) printf("graph err=%d\n", r);
            else { printf("graph ok nodes=%ld wall_ns=%llu\n", count, (unsigned long long)(now_ns() - t0)); cu.GraphExecDestroy(ge); }
            cu.GraphDestroy(g);
        } else if (!strcmp(c, "launch_ways")) {
            NEED(1);
            uint64_t ns = strtoull(argv[++i], NULL, 0);
            CUDA_OR_ERR(c);
            if ((r = spin_func())) { printf("launch_ways err=%d\n", r); continue; }
            uint64_t t0 = now_ns();
            void *args[] = {&ns};
            uint64_t buf = ns;
            size_t bufsize = sizeof buf;
            void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, &buf, CU_LAUNCH_PARAM_BUFFER_SIZE, &bufsize, CU_LAUNCH_PARAM_END};
            CUlaunchConfig cfg;
            memset(&cfg, 0, sizeof cfg);
            cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = 1;
            cfg.blockDimX = 32; cfg.blockDimY = cfg.blockDimZ = 1;
            r = cu.LaunchKernel(spin_fn, 1, 1, 1, 32, 1, 1, 0, 0, args, NULL);
            if (!r) r = cu.LaunchKernel(spin_fn, 1, 1, 1, 32, 1, 1, 0, 0, NULL, extra);
            if (!r) r = cu.LaunchKernelEx(&cfg, spin_fn, args, NULL);
            if (!r) r = cu.LaunchCooperativeKernel(spin_fn, 1, 1, 1, 32, 1, 1, 0, 0, args);
            if (!r) r = cu.CtxSynchronize();
            if (r) printf("launch_ways err=%d\n", r);
            else printf("launch_ways ok launches=4 wall_ns=%llu\n", (unsigned long long)(now_ns() - t0));
        } else if (!strcmp(c, "kernel") || !strcmp(c, "kernel_bin")) {
            NEED(2);
            const char *name = argv[i + 1];
            long count = atol(argv[i + 2]);
            i += 2;
            CUDA_OR_ERR(c);
            char image[512];
            if (!strcmp(c, "kernel"))
                snprintf(image, sizeof image, ".version 7.0\n.target sm_52\n.visible .entry %s()\n{\n ret;\n}\n", name);
            else {
                memset(image, 0, sizeof image);
                memcpy(image, "\x7f" "ELF\x02\x01\x01", 7);
            }
            CUmodule m;
            CUfunction f;
            if ((r = cu.ModuleLoadData(&m, image)) || (r = cu.ModuleGetFunction(&f, m, name))) { printf("%s err=%d\n", c, r); continue; }
            uint64_t t0 = now_ns();
            r = CUDA_SUCCESS;
            for (long k = 0; k < count && !r; k++) r = cu.LaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, 0, NULL, NULL);
            if (!r) r = cu.CtxSynchronize();
            if (r) printf("%s err=%d\n", c, r);
            else printf("%s ok count=%ld wall_ns=%llu\n", c, count, (unsigned long long)(now_ns() - t0));
        } else if (!strcmp(c, "sync")) {
            CUDA_OR_ERR(c);
            if ((r = cu.CtxSynchronize())) printf("sync err=%d\n", r); else printf("sync ok\n");
        } else if (!strcmp(c, "capture_begin")) {
            CUDA_OR_ERR(c);
            if (!(r = cu.StreamCreate(&cap_stream, 0))) r = cu.StreamBeginCapture(cap_stream, CU_STREAM_CAPTURE_MODE_GLOBAL);
            if (r) printf("capture_begin err=%d\n", r); else printf("capture_begin ok\n");
        } else if (!strcmp(c, "capture_spin")) {
            NEED(2);
            uint64_t ns = strtoull(argv[i + 1], NULL, 0);
            long count = atol(argv[i + 2]);
            i += 2;
            CUDA_OR_ERR(c);
            if (!(r = spin_func()))
                for (long k = 0; k < count && !r; k++) r = launch_spin(ns, cap_stream);
            if (r) printf("capture_spin err=%d\n", r); else printf("capture_spin ok count=%ld\n", count);
        } else if (!strcmp(c, "capture_status")) {
            CUDA_OR_ERR(c);
            CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
            if ((r = cu.StreamIsCapturing(cap_stream, &st))) printf("capture_status err=%d\n", r);
            else printf("capture_status ok status=%d\n", (int)st);
        } else if (!strcmp(c, "capture_sync")) {
            CUDA_OR_ERR(c);
            if ((r = cu.StreamSynchronize(cap_stream))) printf("capture_sync err=%d\n", r); else printf("capture_sync ok\n");
        } else if (!strcmp(c, "capture_end")) {
            CUDA_OR_ERR(c);
            cap_graph = (CUgraph)(uintptr_t)1; /* must be overwritten */
            r = cu.StreamEndCapture(cap_stream, &cap_graph);
            const char *gs = cap_graph ? "set" : "null";
            if (r) { printf("capture_end err=%d graph=%s\n", r, gs); cap_graph = NULL; }
            else printf("capture_end ok graph=%s\n", gs);
        } else if (!strcmp(c, "capture_end_null")) {
            /* refused (a NULL graph pointer): the capture goes on */
            CUDA_OR_ERR(c);
            r = cu.StreamEndCapture(cap_stream, NULL);
            printf("capture_end_null rc=%d\n", r);
        } else if (!strcmp(c, "graph_launch_last")) {
            CUDA_OR_ERR(c);
            CUgraphExec ge;
            uint64_t t0 = now_ns();
            if (!cap_graph) r = CUDA_ERROR_INVALID_VALUE;
            else if (!(r = cu.GraphInstantiateWithFlags(&ge, cap_graph, 0))) {
                if (!(r = cu.GraphLaunch(ge, cap_stream))) r = cu.StreamSynchronize(cap_stream);
                cu.GraphExecDestroy(ge);
            }
            if (r) printf("graph_launch_last err=%d\n", r);
            else printf("graph_launch_last ok wall_ns=%llu\n", (unsigned long long)(now_ns() - t0));
        } else if (!strcmp(c, "wait_file")) {
            NEED(1);
            const char *path = argv[++i];
            int n = 0;
            while (access(path, F_OK) && n++ < 120000) usleep(1000);
            if (access(path, F_OK)) printf("wait_file err=timeout\n");
            else printf("wait_file ok\n");
        } else if (!strcmp(c, "clock")) {
            struct timespec t;
            clock_gettime(CLOCK_MONOTONIC, &t);
            printf("clock ms=%lld\n", (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000);
        } else if (!strcmp(c, "sleep")) {
            NEED(1);
            long ms = atol(argv[++i]);
            struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
            nanosleep(&t, NULL);
            printf("sleep ok\n");
        } else if (!strcmp(c, "wait_file")) {
            /* wait (up to 10 min) until PATH exists: a go signal from the test */
            NEED(1);
            const char *path = argv[++i];
            struct timespec t = {0, 5000000L};
            for (long k = 0; k < 120000 && access(path, F_OK) != 0; k++) nanosleep(&t, NULL);
            printf("wait_file %s\n", access(path, F_OK) == 0 ? "ok" : "err=timeout");
        } else if (!strcmp(c, "fork_sleep")) {
            NEED(1);
            unsigned s = (unsigned)atoi(argv[++i]);
            fflush(stdout);
            pid_t child = fork();
            if (child == 0) {
                sleep(s);
                _exit(0);
            }
            printf("fork_sleep ok child=%d\n", (int)child);
        } else if (!strcmp(c, "same_lib")) {
            void *a = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL), *b = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
            if (!a || !b) printf("same_lib err=dlopen\n");
            else printf("same_lib ok same=%d\n", a == b);
        } else if (!strcmp(c, "ready")) {
            printf("ready\n");
        } else if (!strcmp(c, "pid")) {
            printf("pid ok pid=%d\n", (int)getpid());
        } else if (!strcmp(c, "hold")) {
            printf("holding\n");
            const char *mx = getenv("CUCLIENT_HOLD_MAX_S");
            long max_s = mx ? atol(mx) : 600;
            for (long s = 0; s < max_s; s++) sleep(1);
            printf("hold timeout\n");
        } else if (!strcmp(c, "procaddr")) {
            NEED(3);
            const char *name = argv[i + 1];
            int ver = atoi(argv[i + 2]);
            cuuint64_t flags = strtoull(argv[i + 3], NULL, 0);
            i += 3;
            if (!get_proc) load_cuda();
            void *p = NULL;
            CUdriverProcAddressQueryResult st = 99;
            r = get_proc(name, &p, ver, flags, &st);
            Dl_info info;
            const char *sym = (p && dladdr(p, &info) && info.dli_sname) ? info.dli_sname : "?";
            if (r) printf("procaddr err=%d name=%s status=%d ptr=%p sym=%s\n", r, name, (int)st, p, sym);
            else printf("procaddr ok name=%s status=%d ptr=%p sym=%s\n", name, (int)st, p, sym);
        } else if (!strcmp(c, "variants")) {
            variants();
        } else if (!strcmp(c, "nvml_init")) {
            if (nvml_dev()) printf("nvml_init ok\n");
        } else if (!strcmp(c, "nvml_count")) {
            if (!nvml_dev()) continue;
            unsigned n = 0;
            nvmlReturn_t e = nv.DeviceGetCount_v2(&n);
            if (e) printf("nvml_count err=%d\n", e); else printf("nvml_count ok n=%u\n", n);
        } else if (!strcmp(c, "nvml_meminfo")) {
            nvmlDevice_t h = nvml_dev();
            if (!h) continue;
            nvmlMemory_t m;
            nvmlReturn_t e = nv.DeviceGetMemoryInfo(h, &m);
            if (e) printf("nvml_meminfo err=%d\n", e);
            else printf("nvml_meminfo ok total=%llu used=%llu free=%llu\n", m.total, m.used, m.free);
        } else if (!strcmp(c, "nvml_meminfo_v2")) {
            nvmlDevice_t h = nvml_dev();
            if (!h) continue;
            nvmlMemory_v2_t m;
            memset(&m, 0, sizeof m);
            m.version = nvmlMemory_v2;
            nvmlReturn_t e = nv.DeviceGetMemoryInfo_v2(h, &m);
            if (e) printf("nvml_meminfo_v2 err=%d\n", e);
            else printf("nvml_meminfo_v2 ok total=%llu reserved=%llu used=%llu free=%llu version=%u\n", m.total, m.reserved, m.used, m.free, m.version);
        } else if (!strcmp(c, "nvml_procs")) {
            nvmlDevice_t h = nvml_dev();
            if (!h) continue;
            nvmlProcessInfo_t ps[256];
            unsigned n = 256;
            nvmlReturn_t e = nv.DeviceGetComputeRunningProcesses_v3(h, &n, ps);
            if (e) { printf("nvml_procs err=%d\n", e); continue; }
            printf("nvml_procs ok n=%u", n);
            for (unsigned k = 0; k < n; k++) printf(" %u:%llu", ps[k].pid, ps[k].usedGpuMemory);
            printf("\n");
        } else if (!strcmp(c, "nvml_util")) {
            nvmlDevice_t h = nvml_dev();
            if (!h) continue;
            nvmlUtilization_t u;
            nvmlReturn_t e = nv.DeviceGetUtilizationRates(h, &u);
            if (e) printf("nvml_util err=%d\n", e); else printf("nvml_util ok gpu=%u\n", u.gpu);
        } else if (!strcmp(c, "nvml_putil")) {
            nvmlDevice_t h = nvml_dev();
            if (!h) continue;
            unsigned n = 0;
            nvmlReturn_t e = nv.DeviceGetProcessUtilization(h, NULL, &n, 0);
            if (e && e != NVML_ERROR_INSUFFICIENT_SIZE) { printf("nvml_putil err=%d\n", e); continue; }
            nvmlProcessUtilizationSample_t s[256];
            n = 256;
            if ((e = nv.DeviceGetProcessUtilization(h, s, &n, 0))) { printf("nvml_putil err=%d\n", e); continue; }
            printf("nvml_putil ok n=%u", n);
            for (unsigned k = 0; k < n; k++) printf(" %u:%u", s[k].pid, s[k].smUtil);
            printf("\n");
        } else if (!strcmp(c, "nvml_uuid")) {
            nvmlDevice_t h = nvml_dev();
            if (!h) continue;
            char u[96];
            nvmlReturn_t e = nv.DeviceGetUUID(h, u, sizeof u);
            if (e) printf("nvml_uuid err=%d\n", e); else printf("nvml_uuid ok uuid=%s\n", u);
        } else {
            fprintf(stderr, "usage: unknown command %s (see the top of tests/c/cuclient.c)\n", c);
            return 2;
        }
    }
    return 0;
}
