/* A driver-API + NVML client for cgpu's entry-path tests, compiled three ways
 * against the real cuda.h / nvml.h:
 *   -DPATH_LINKED    calls the functions linked with -lcuda -lnvidia-ml
 *   -DPATH_DLSYM     dlopen("libcuda.so.1") + dlsym on that handle
 *   -DPATH_PROCADDR  dlsym only cuGetProcAddress_v2, every other function
 *                    through it (as libcudart and cuda-bindings do)
 * Prints JSON lines: {"op":"info",...} {"op":"nvml",...} {"op":"alloc",...}
 * and, with argument "variants", the pointers cuGetProcAddress_v2 returns.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <nvml.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef CUresult (*fInit)(unsigned);
typedef CUresult (*fDeviceGet)(CUdevice *, int);
typedef CUresult (*fCtxCreate)(CUcontext *, unsigned, CUdevice);
typedef CUresult (*fMemGetInfo)(size_t *, size_t *);
typedef CUresult (*fDeviceTotalMem)(size_t *, CUdevice);
typedef CUresult (*fMemAlloc)(CUdeviceptr *, size_t);
typedef CUresult (*fMemFree)(CUdeviceptr);
typedef CUresult (*fGetProcAddress)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef nvmlReturn_t (*fNvmlInit)(void);
typedef nvmlReturn_t (*fNvmlCount)(unsigned *);
typedef nvmlReturn_t (*fNvmlHandle)(unsigned, nvmlDevice_t *);
typedef nvmlReturn_t (*fNvmlMem)(nvmlDevice_t, nvmlMemory_t *);
typedef nvmlReturn_t (*fNvmlMem2)(nvmlDevice_t, nvmlMemory_v2_t *);

static fInit p_cuInit;
static fDeviceGet p_cuDeviceGet;
static fCtxCreate p_cuCtxCreate;
static fMemGetInfo p_cuMemGetInfo;
static fDeviceTotalMem p_cuDeviceTotalMem;
static fMemAlloc p_cuMemAlloc;
static fMemFree p_cuMemFree;
static fNvmlInit p_nvmlInit;
static fNvmlCount p_nvmlCount;
static fNvmlHandle p_nvmlHandle;
static fNvmlMem p_nvmlMem;
static fNvmlMem2 p_nvmlMem2;
static fGetProcAddress gpa;

static void *must(void *p, const char *name) {
    if (!p) {
        printf("{\"op\":\"error\",\"what\":\"resolve %s\"}\n", name);
        exit(2);
    }
    return p;
}

static void resolve(void) {
#if defined(PATH_LINKED)
    p_cuInit = cuInit;
    p_cuDeviceGet = cuDeviceGet;
    p_cuCtxCreate = cuCtxCreate; /* cuda.h: cuCtxCreate_v2 */
    p_cuMemGetInfo = cuMemGetInfo;
    p_cuDeviceTotalMem = cuDeviceTotalMem;
    p_cuMemAlloc = cuMemAlloc;
    p_cuMemFree = cuMemFree;
    p_nvmlInit = nvmlInit;
    p_nvmlCount = nvmlDeviceGetCount;
    p_nvmlHandle = nvmlDeviceGetHandleByIndex;
    p_nvmlMem = nvmlDeviceGetMemoryInfo;
    p_nvmlMem2 = nvmlDeviceGetMemoryInfo_v2;
#else
    void *h = must(dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL), "libcuda.so.1");
    void *n = must(dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL), "libnvidia-ml.so.1");
#if defined(PATH_DLSYM)
    p_cuInit = (fInit)must(dlsym(h, "cuInit"), "cuInit");
    p_cuDeviceGet = (fDeviceGet)must(dlsym(h, "cuDeviceGet"), "cuDeviceGet");
    p_cuCtxCreate = (fCtxCreate)must(dlsym(h, "cuCtxCreate_v2"), "cuCtxCreate_v2");
    p_cuMemGetInfo = (fMemGetInfo)must(dlsym(h, "cuMemGetInfo_v2"), "cuMemGetInfo_v2");
    p_cuDeviceTotalMem = (fDeviceTotalMem)must(dlsym(h, "cuDeviceTotalMem_v2"), "cuDeviceTotalMem_v2");
    p_cuMemAlloc = (fMemAlloc)must(dlsym(h, "cuMemAlloc_v2"), "cuMemAlloc_v2");
    p_cuMemFree = (fMemFree)must(dlsym(h, "cuMemFree_v2"), "cuMemFree_v2");
#else
    gpa = (fGetProcAddress)must(dlsym(h, "cuGetProcAddress_v2"), "cuGetProcAddress_v2");
#define GPA(var, name, ver)                                                    \
    do {                                                                       \
        void *p_ = NULL;                                                       \
        CUdriverProcAddressQueryResult st_;                                   \
        if (gpa(name, &p_, ver, CU_GET_PROC_ADDRESS_DEFAULT, &st_) != CUDA_SUCCESS) \
            p_ = NULL;                                                         \
        var = must(p_, name);                                                  \
    } while (0)
    GPA(p_cuInit, "cuInit", 2000);
    GPA(p_cuDeviceGet, "cuDeviceGet", 2000);
    GPA(p_cuCtxCreate, "cuCtxCreate", 3020);
    GPA(p_cuMemGetInfo, "cuMemGetInfo", 3020);
    GPA(p_cuDeviceTotalMem, "cuDeviceTotalMem", 3020);
    GPA(p_cuMemAlloc, "cuMemAlloc", 3020);
    GPA(p_cuMemFree, "cuMemFree", 3020);
#endif
    p_nvmlInit = (fNvmlInit)must(dlsym(n, "nvmlInit_v2"), "nvmlInit_v2");
    p_nvmlCount = (fNvmlCount)must(dlsym(n, "nvmlDeviceGetCount_v2"), "nvmlDeviceGetCount_v2");
    p_nvmlHandle = (fNvmlHandle)must(dlsym(n, "nvmlDeviceGetHandleByIndex_v2"), "nvmlDeviceGetHandleByIndex_v2");
    p_nvmlMem = (fNvmlMem)must(dlsym(n, "nvmlDeviceGetMemoryInfo"), "nvmlDeviceGetMemoryInfo");
    p_nvmlMem2 = (fNvmlMem2)must(dlsym(n, "nvmlDeviceGetMemoryInfo_v2"), "nvmlDeviceGetMemoryInfo_v2");
#endif
}

/* With "variants": which of libcgpu's exports cuGetProcAddress_v2 returned. */
static void variants(void) {
    void *h = must(dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL), "libcuda.so.1");
    if (!gpa)
        gpa = (fGetProcAddress)must(dlsym(h, "cuGetProcAddress_v2"), "cuGetProcAddress_v2");
    struct { const char *sym; int ver; cuuint64_t flags; } q[] = {
        {"cuCtxCreate", 3020, 0}, {"cuCtxCreate", 11040, 0}, {"cuCtxCreate", 12050, 0},
        {"cuMemAlloc", 3020, 0}, {"cuMemGetInfo", 3020, 0}, {"cuMemFree", 3020, 0},
        {"cuMemAllocAsync", 11020, 0}, {"cuMemAllocAsync", 11020, 2},
        {"cuLaunchKernel", 4000, 0}, {"cuLaunchKernel", 7000, 2},
        {"cuGraphLaunch", 10000, 2}, {"cuMemFreeAsync", 11020, 2},
        {"cuDevicePrimaryCtxRelease", 11000, 0}, {"cuGetProcAddress", 11030, 0},
        {"cuGetProcAddress", 12000, 0}, {"cuCtxGetDevice", 2000, 0}, {"cuGetExportTable", 3000, 0},
    };
    const char *ours[] = {
        "cuCtxCreate", "cuCtxCreate_v2", "cuCtxCreate_v3", "cuCtxCreate_v4", "cuMemAlloc_v2",
        "cuMemGetInfo_v2", "cuMemFree_v2", "cuMemAllocAsync", "cuMemAllocAsync_ptsz",
        "cuLaunchKernel", "cuLaunchKernel_ptsz", "cuGraphLaunch", "cuGraphLaunch_ptsz",
        "cuMemFreeAsync", "cuMemFreeAsync_ptsz", "cuDevicePrimaryCtxRelease",
        "cuDevicePrimaryCtxRelease_v2", "cuGetProcAddress", "cuGetProcAddress_v2",
    };
    for (size_t i = 0; i < sizeof q / sizeof q[0]; i++) {
        void *p = NULL;
        CUdriverProcAddressQueryResult st = 0;
        CUresult rc = gpa(q[i].sym, &p, q[i].ver, q[i].flags, &st);
        const char *which = "driver";
        /* Our exports are what RTLD_DEFAULT finds first under LD_PRELOAD. */
        for (size_t j = 0; j < sizeof ours / sizeof ours[0]; j++) {
            void *o = dlsym(RTLD_DEFAULT, ours[j]);
            Dl_info di;
            if (o && o == p && dladdr(o, &di) && di.dli_fname && strstr(di.dli_fname, "libcgpu")) {
                which = ours[j];
                break;
            }
        }
        /* Names under which the driver handle exports the returned address
         * (meaningful without the preload: then dlsym is the driver's own). */
        char aliases[1024] = "";
        for (size_t j = 0; j < sizeof ours / sizeof ours[0]; j++) {
            if (p && dlsym(h, ours[j]) == p) {
                if (aliases[0])
                    strcat(aliases, ",");
                strcat(aliases, "\"");
                strcat(aliases, ours[j]);
                strcat(aliases, "\"");
            }
        }
        printf("{\"op\":\"variant\",\"sym\":\"%s\",\"ver\":%d,\"flags\":%llu,\"rc\":%d,\"status\":%d,\"hook\":\"%s\",\"null\":%d,\"aliases\":[%s]}\n",
               q[i].sym, q[i].ver, (unsigned long long)q[i].flags, (int)rc, (int)st, which, p == NULL, aliases);
    }
}

int main(int argc, char **argv) {
    resolve();
    if (argc > 1 && strcmp(argv[1], "variants") == 0) {
        variants();
        return 0;
    }
    CUdevice dev;
    CUcontext ctx;
    size_t freeb = 0, total = 0, devtotal = 0;
    if (p_cuInit(0) || p_cuDeviceGet(&dev, 0) || p_cuCtxCreate(&ctx, 0, dev)) {
        printf("{\"op\":\"error\",\"what\":\"init\"}\n");
        return 3;
    }
    CUresult rc = p_cuMemGetInfo(&freeb, &total);
    p_cuDeviceTotalMem(&devtotal, dev);
    printf("{\"op\":\"info\",\"rc\":%d,\"free\":%zu,\"total\":%zu,\"devtotal\":%zu}\n", (int)rc, freeb, total, devtotal);
    /* One allocation that fits, one that passes the visible total. */
    CUdeviceptr a = 0, b = 0;
    CUresult r1 = p_cuMemAlloc(&a, 64 << 20);
    CUresult r2 = p_cuMemAlloc(&b, total);
    size_t free2 = 0, total2 = 0;
    p_cuMemGetInfo(&free2, &total2);
    if (r1 == CUDA_SUCCESS)
        p_cuMemFree(a);
    if (r2 == CUDA_SUCCESS)
        p_cuMemFree(b);
    printf("{\"op\":\"alloc\",\"fit\":%d,\"over\":%d,\"free_after\":%zu}\n", (int)r1, (int)r2, free2);
    nvmlDevice_t h;
    unsigned n = 0;
    nvmlMemory_t m;
    nvmlMemory_v2_t m2;
    memset(&m2, 0, sizeof m2);
    m2.version = nvmlMemory_v2;
    if (p_nvmlInit() || p_nvmlCount(&n) || p_nvmlHandle(0, &h)) {
        printf("{\"op\":\"error\",\"what\":\"nvml\"}\n");
        return 4;
    }
    nvmlReturn_t q1 = p_nvmlMem(h, &m), q2 = p_nvmlMem2(h, &m2);
    printf("{\"op\":\"nvml\",\"count\":%u,\"rc\":[%d,%d],\"v1\":{\"total\":%llu,\"used\":%llu,\"free\":%llu},"
           "\"v2\":{\"total\":%llu,\"used\":%llu,\"free\":%llu,\"version\":%u}}\n",
           n, (int)q1, (int)q2, m.total, m.used, m.free, m2.total, m2.used, m2.free, m2.version);
    return 0;
}
