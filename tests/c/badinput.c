/*
 * Bad input never crashes the sim and gets the driver's codes: calls before
 * cuInit, NULL pointers, unknown/freed/foreign handles and pointers, bad
 * launch shapes, unknown kernel names. Prints "ALL OK" when every check holds.
 */
#include <cuda.h>
#include <nvml.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fails;
#define EXPECT(call, want) do { CUresult r_ = (call); if (r_ != (want)) { printf("FAIL %s = %d, want %d\n", #call, r_, (want)); fails++; } } while (0)
#define EXPECT_NV(call, want) do { nvmlReturn_t r_ = (call); if (r_ != (want)) { printf("FAIL %s = %d, want %d\n", #call, r_, (want)); fails++; } } while (0)

int main(void) {
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr p;
    size_t f, t;
    int v;
    const char *s;
    unsigned n;
    nvmlDevice_t nd;

    /* before cuInit / nvmlInit */
    EXPECT(cuDeviceGet(&dev, 0), CUDA_ERROR_NOT_INITIALIZED);
    EXPECT(cuMemAlloc(&p, 16), CUDA_ERROR_NOT_INITIALIZED);
    EXPECT(cuCtxCreate(&ctx, 0, 0), CUDA_ERROR_NOT_INITIALIZED);
    EXPECT(cuDriverGetVersion(&v), CUDA_SUCCESS);
    EXPECT(cuDriverGetVersion(NULL), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuGetErrorName(CUDA_ERROR_OUT_OF_MEMORY, &s), CUDA_SUCCESS);
    if (strcmp(s, "CUDA_ERROR_OUT_OF_MEMORY")) { printf("FAIL name %s\n", s); fails++; }
    EXPECT(cuGetErrorString(12345, &s), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuGetExportTable((const void **)&s, NULL), CUDA_ERROR_INVALID_VALUE); /* a NULL id */
    EXPECT_NV(nvmlDeviceGetCount_v2(&n), NVML_ERROR_UNINITIALIZED);

    EXPECT(cuInit(1), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuInit(0), CUDA_SUCCESS);
    EXPECT(cuDeviceGet(&dev, 7), CUDA_ERROR_INVALID_DEVICE);
    EXPECT(cuDeviceGet(NULL, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuDeviceGet(&dev, 0), CUDA_SUCCESS);
    EXPECT(cuDeviceGetAttribute(&v, 100000, dev), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuDeviceGetAttribute(NULL, CU_DEVICE_ATTRIBUTE_WARP_SIZE, dev), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuDeviceGetName(NULL, 10, dev), CUDA_ERROR_INVALID_VALUE);

    /* no current context */
    EXPECT(cuMemAlloc(&p, 16), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT(cuMemGetInfo(&f, &t), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT(cuCtxSynchronize(), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT(cuCtxSetCurrent((CUcontext)0x1234), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT(cuCtxDestroy((CUcontext)0xdeadbeef), CUDA_ERROR_INVALID_CONTEXT);

    EXPECT(cuCtxCreate(NULL, 0, dev), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuCtxCreate(&ctx, 0, 99), CUDA_ERROR_INVALID_DEVICE);
    EXPECT(cuCtxCreate(&ctx, 0, dev), CUDA_SUCCESS);
    EXPECT(cuMemAlloc(NULL, 16), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemAlloc(&p, 0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemAlloc(&p, (size_t)1 << 50), CUDA_ERROR_OUT_OF_MEMORY);
    EXPECT(cuMemGetInfo(NULL, &t), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemAlloc(&p, 4096), CUDA_SUCCESS);
    char buf[8192];
    EXPECT(cuMemcpyHtoD(p, buf, 8192), CUDA_ERROR_INVALID_VALUE);  /* past the end */
    EXPECT(cuMemcpyHtoD(p, NULL, 16), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuMemcpyDtoH(buf, (CUdeviceptr)buf, 16), CUDA_ERROR_INVALID_VALUE);  /* host pointer as device */
    EXPECT(cuMemsetD32(p + 1, 0, 4), CUDA_ERROR_INVALID_VALUE);  /* misaligned */
    EXPECT(cuMemFree(p), CUDA_SUCCESS);
    EXPECT(cuMemFree(p), CUDA_ERROR_INVALID_VALUE);  /* double free */
    EXPECT(cuMemFree((CUdeviceptr)buf), CUDA_ERROR_INVALID_VALUE);  /* foreign */
    EXPECT(cuMemcpyHtoD(p, buf, 16), CUDA_ERROR_INVALID_VALUE);  /* freed */

    /* streams, events, modules, launches */
    CUstream st;
    CUevent e0, e1;
    EXPECT(cuStreamSynchronize((CUstream)0x77), CUDA_ERROR_INVALID_HANDLE);
    EXPECT(cuStreamCreate(&st, 0), CUDA_SUCCESS);
    EXPECT(cuStreamDestroy(st), CUDA_SUCCESS);
    EXPECT(cuStreamDestroy(st), CUDA_ERROR_INVALID_HANDLE);
    EXPECT(cuEventCreate(&e0, 0), CUDA_SUCCESS);
    EXPECT(cuEventCreate(&e1, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    float ms;
    EXPECT(cuEventElapsedTime(&ms, e0, e0), CUDA_ERROR_INVALID_HANDLE);  /* never recorded */
    EXPECT(cuEventRecord(e0, 0), CUDA_SUCCESS);
    EXPECT(cuEventRecord(e1, 0), CUDA_SUCCESS);
    EXPECT(cuEventElapsedTime(&ms, e0, e1), CUDA_ERROR_INVALID_HANDLE);  /* timing disabled */
    EXPECT(cuEventElapsedTime(NULL, e0, e0), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuEventQuery((CUevent)0x99), CUDA_ERROR_INVALID_HANDLE);

    CUmodule m;
    CUfunction fn;
    const char *ptx = ".version 7.0\n.target sm_52\n.visible .entry cgpu_sim_spin(.param .u64 a)\n{ ret; }\n";
    EXPECT(cuModuleLoadData(&m, NULL), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuModuleLoadData(&m, ptx), CUDA_SUCCESS);
    EXPECT(cuModuleGetFunction(&fn, m, "no_such_kernel"), CUDA_ERROR_NOT_FOUND);
    EXPECT(cuModuleGetFunction(&fn, (CUmodule)0x5, "cgpu_sim_spin"), CUDA_ERROR_INVALID_HANDLE);
    EXPECT(cuModuleGetFunction(&fn, m, "cgpu_sim_spin"), CUDA_SUCCESS);
    unsigned long long ns = 1000;
    void *args[] = {&ns};
    EXPECT(cuLaunchKernel(fn, 0, 1, 1, 1, 1, 1, 0, 0, args, NULL), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuLaunchKernel(fn, 1, 1, 1, 2048, 1, 1, 0, 0, args, NULL), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, 0, NULL, NULL), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuLaunchKernel((CUfunction)0x42, 1, 1, 1, 1, 1, 1, 0, 0, args, NULL), CUDA_ERROR_INVALID_HANDLE);
    EXPECT(cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, (CUstream)0x4242, args, NULL), CUDA_ERROR_INVALID_HANDLE);
    EXPECT(cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, 0, args, NULL), CUDA_SUCCESS);
    EXPECT(cuCtxSynchronize(), CUDA_SUCCESS);

    void *pfn;
    CUdriverProcAddressQueryResult q;
    EXPECT(cuGetProcAddress("cuMemAlloc", NULL, 12000, 0, &q), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuGetProcAddress(NULL, &pfn, 12000, 0, &q), CUDA_ERROR_INVALID_VALUE);
    EXPECT(cuGetProcAddress("cuMemAlloc", &pfn, 12000, 0, NULL), CUDA_SUCCESS);

    EXPECT(cuCtxDestroy(ctx), CUDA_SUCCESS);
    EXPECT(cuCtxDestroy(ctx), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT(cuMemAlloc(&p, 16), CUDA_ERROR_INVALID_CONTEXT);

    /* The primary context keeps its handle across release and retain. */
    CUcontext p1, p2;
    EXPECT(cuDevicePrimaryCtxRetain(&p1, dev), CUDA_SUCCESS);
    EXPECT(cuDevicePrimaryCtxRelease(dev), CUDA_SUCCESS);
    EXPECT(cuDevicePrimaryCtxRelease(dev), CUDA_ERROR_INVALID_CONTEXT);
    EXPECT(cuDevicePrimaryCtxRetain(&p2, dev), CUDA_SUCCESS);
    if (p1 != p2) { printf("FAIL primary handle changed\n"); fails++; }
    EXPECT(cuCtxSetCurrent(p2), CUDA_SUCCESS);
    EXPECT(cuMemAlloc(&p, 16), CUDA_SUCCESS);
    EXPECT(cuDevicePrimaryCtxRelease(dev), CUDA_SUCCESS);
    EXPECT(cuMemFree(p), CUDA_ERROR_INVALID_VALUE);  /* went with the context */
    EXPECT(cuCtxSetCurrent(NULL), CUDA_SUCCESS);

    /* NVML */
    EXPECT_NV(nvmlInit_v2(), NVML_SUCCESS);
    EXPECT_NV(nvmlDeviceGetHandleByIndex_v2(9, &nd), NVML_ERROR_INVALID_ARGUMENT);
    EXPECT_NV(nvmlDeviceGetHandleByIndex_v2(0, &nd), NVML_SUCCESS);
    EXPECT_NV(nvmlDeviceGetMemoryInfo((nvmlDevice_t)0x1234, NULL), NVML_ERROR_INVALID_ARGUMENT);
    nvmlMemory_v2_t m2;
    m2.version = 1;
    EXPECT_NV(nvmlDeviceGetMemoryInfo_v2(nd, &m2), NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    char small[4];
    EXPECT_NV(nvmlDeviceGetName(nd, small, sizeof small), NVML_ERROR_INSUFFICIENT_SIZE);
    n = 0;
    EXPECT_NV(nvmlDeviceGetComputeRunningProcesses_v3(nd, &n, NULL), NVML_SUCCESS); /* no context left: none */
    if (strcmp(nvmlErrorString(NVML_ERROR_INVALID_ARGUMENT), "Invalid Argument")) { printf("FAIL nvmlErrorString\n"); fails++; }
    EXPECT_NV(nvmlShutdown(), NVML_SUCCESS);
    EXPECT_NV(nvmlShutdown(), NVML_ERROR_UNINITIALIZED);

    if (!fails) printf("ALL OK\n");
    return 0;
}
