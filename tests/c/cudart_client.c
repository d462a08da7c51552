/* cudart_client.c: a CUDA *runtime* program, built against NVIDIA's own
 * cuda_runtime_api.h and linked with NVIDIA's own libcudart.so.12 or .13.
 * The simulated driver (and libcgpu.so in LD_PRELOAD) must host it
 * unchanged.
 *
 * It registers a kernel the way nvcc output does (__cudaRegisterFatBinary
 * with a fat binary wrapper holding a PTX image, __cudaRegisterFunction,
 * __cudaRegisterVar, __cudaRegisterFatBinaryEnd), then runs the commands
 * given on the command line, printing one `cmd key=value ...` line each:
 *
 *   info                 pid, runtime/driver versions, device count, name, total
 *   meminfo              cudaMemGetInfo: free= total=
 *   roundtrip BYTES      cudaMalloc, H2D, D2D, D2H, bytes compared, cudaFree
 *   malloc BYTES         cudaMalloc: rc= (0, or 2 = cudaErrorMemoryAllocation)
 *   symbol               cudaMemcpyToSymbol/FromSymbol on a __device__ u64
 *   launch NS N          N launches of the kernel (NS ns each) on a stream,
 *                        events around the first: ms= (device time)
 *   graph NS N R         capture N launches + a memset + a D2H copy on a
 *                        stream, replay R times: before= after= (copied byte)
 *   --linger-at-exit MS  (first) an exit handler, registered before any CUDA
 *                        call and so run after the libraries', sleeps MS ms
 *                        (as a framework's long teardown does)
 *   tables               where the driver's export tables live: the
 *                        library and offset of CUDART_INTERFACE and of
 *                        INTEGRITY_CHECK slot 1, from cuGetExportTable as
 *                        the runtime resolves it
 *
 * Exits 3 (after an `error` line) when a runtime call fails unexpectedly.
 */
#define _GNU_SOURCE
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* What nvcc-generated host code calls (crt/host_runtime.h); exported by libcudart. */
extern void **__cudaRegisterFatBinary(void *fatCubin);
extern void __cudaRegisterFatBinaryEnd(void **fatCubinHandle);
extern void __cudaUnregisterFatBinary(void **fatCubinHandle);
extern void __cudaRegisterFunction(void **fatCubinHandle, const char *hostFun, char *deviceFun,
                                   const char *deviceName, int thread_limit, uint3 *tid,
                                   uint3 *bid, dim3 *bDim, dim3 *gDim, int *wSize);
extern void __cudaRegisterVar(void **fatCubinHandle, char *hostVar, char *deviceAddress,
                              const char *deviceName, int ext, size_t size, int constant,
                              int global);

#define CK(call)                                                                      \
    do {                                                                              \
        cudaError_t e_ = (call);                                                      \
        if (e_ != cudaSuccess) {                                                      \
            printf("error call=%s code=%d name=%s\n", #call, (int)e_, cudaGetErrorName(e_)); \
            fflush(stdout);                                                           \
            exit(3);                                                                  \
        }                                                                             \
    } while (0)

/* ------------------------------------------------------------ the image */

static const char PTX[] =
    ".version 8.0\n"
    ".target sm_75\n"
    ".address_size 64\n"
    ".visible .global .align 8 .u64 cgpu_counter;\n"
    ".visible .entry cgpu_sim_spin_kernel(\n"
    "    .param .u64 ns\n"
    ")\n"
    "{\n"
    "    ret;\n"
    "}\n";

/* A fat binary: 16-byte header, one 64-byte PTX entry header, the text. */
static uint64_t fatbin[(16 + 64 + sizeof(PTX) + 7) / 8 + 1];

struct fatbin_wrapper {
    int magic;
    int version;
    const unsigned long long *data;
    void *filename_or_fatbins;
};
static struct fatbin_wrapper wrapper;

static void build_fatbin(void) {
    uint8_t *b = (uint8_t *)fatbin;
    uint32_t payload = (uint32_t)((sizeof(PTX) + 7) / 8 * 8);
    uint32_t magic = 0xBA55ED50u;
    uint16_t version = 1, hsize = 16;
    uint64_t files = 64 + payload;
    memcpy(b, &magic, 4);
    memcpy(b + 4, &version, 2);
    memcpy(b + 6, &hsize, 2);
    memcpy(b + 8, &files, 8);
    uint8_t *e = b + 16;
    uint16_t kind = 1 /* PTX */, ever = 0x0101;
    uint32_t ehsize = 64, arch = 75;
    memcpy(e, &kind, 2);
    memcpy(e + 2, &ever, 2);
    memcpy(e + 4, &ehsize, 4);
    memcpy(e + 8, &payload, 4);
    memcpy(e + 28, &arch, 4);
    memcpy(e + 64, PTX, sizeof(PTX));
    wrapper.magic = 0x466243B1;
    wrapper.version = 1;
    wrapper.data = (const unsigned long long *)fatbin;
    wrapper.filename_or_fatbins = NULL;
}

/* The host side of the kernel and of the global, as nvcc would emit them. */
static void cgpu_sim_spin_kernel(unsigned long long ns) { (void)ns; }
static unsigned long long cgpu_counter;
static void **fatbin_handle;

static void register_image(void) {
    build_fatbin();
    fatbin_handle = __cudaRegisterFatBinary(&wrapper);
    __cudaRegisterFunction(fatbin_handle, (const char *)cgpu_sim_spin_kernel,
                           (char *)"cgpu_sim_spin_kernel", "cgpu_sim_spin_kernel", -1, NULL,
                           NULL, NULL, NULL, NULL);
    __cudaRegisterVar(fatbin_handle, (char *)&cgpu_counter, (char *)"cgpu_counter",
                      "cgpu_counter", 0, sizeof(cgpu_counter), 0, 0);
    __cudaRegisterFatBinaryEnd(fatbin_handle);
}

static cudaError_t launch(unsigned long long ns, cudaStream_t s) {
    void *args[] = {&ns};
    dim3 one = {1, 1, 1};
    return cudaLaunchKernel((const void *)cgpu_sim_spin_kernel, one, one, args, 0, s);
}

/* ------------------------------------------------------------- commands */

static int need(int i, int argc, int n) {
    if (i + n >= argc) {
        printf("error call=args code=0\n");
        exit(2);
    }
    return 1;
}

static void cmd_info(void) {
    int rt = 0, drv = 0, n = 0;
    CK(cudaRuntimeGetVersion(&rt));
    CK(cudaDriverGetVersion(&drv));
    CK(cudaGetDeviceCount(&n));
    struct cudaDeviceProp p;
    CK(cudaGetDeviceProperties(&p, 0));
    printf("info pid=%d runtime=%d driver=%d devices=%d cc=%d.%d total=%zu name=%s\n", (int)getpid(),
           rt, drv, n, p.major, p.minor, p.totalGlobalMem, p.name);
}

static void cmd_meminfo(void) {
    size_t free_b = 0, total = 0;
    CK(cudaMemGetInfo(&free_b, &total));
    printf("meminfo free=%zu total=%zu\n", free_b, total);
}

static void cmd_roundtrip(size_t n) {
    unsigned char *h = malloc(n), *back = malloc(n);
    void *d1, *d2;
    for (size_t i = 0; i < n; i++) h[i] = (unsigned char)(i * 7 + 3);
    memset(back, 0, n);
    CK(cudaMalloc(&d1, n));
    CK(cudaMalloc(&d2, n));
    CK(cudaMemcpy(d1, h, n, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(d2, d1, n, cudaMemcpyDeviceToDevice));
    CK(cudaMemcpy(back, d2, n, cudaMemcpyDeviceToHost));
    int same = memcmp(h, back, n) == 0;
    CK(cudaFree(d1));
    CK(cudaFree(d2));
    printf("roundtrip bytes=%zu same=%d\n", n, same);
    free(h);
    free(back);
}

static void cmd_malloc(size_t n) {
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, n);
    printf("malloc bytes=%zu rc=%d\n", n, (int)e);
    if (e == cudaSuccess) CK(cudaFree(p));
    else (void)cudaGetLastError(); /* clear the sticky-free error */
}

static void cmd_symbol(void) {
    unsigned long long v = 0x1122334455667788ull, back = 0, zero = 1;
    size_t size = 0;
    CK(cudaMemcpyFromSymbol(&zero, &cgpu_counter, sizeof(zero), 0, cudaMemcpyDeviceToHost));
    CK(cudaGetSymbolSize(&size, &cgpu_counter));
    CK(cudaMemcpyToSymbol(&cgpu_counter, &v, sizeof(v), 0, cudaMemcpyHostToDevice));
    CK(cudaMemcpyFromSymbol(&back, &cgpu_counter, sizeof(back), 0, cudaMemcpyDeviceToHost));
    printf("symbol size=%zu initial=%llu same=%d\n", size, zero, back == v);
}

static void cmd_launch(unsigned long long ns, int n) {
    cudaStream_t s;
    cudaEvent_t a, b;
    CK(cudaStreamCreate(&s));
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    CK(cudaEventRecord(a, s));
    CK(launch(ns, s));
    CK(cudaEventRecord(b, s));
    for (int i = 1; i < n; i++) CK(launch(ns, s));
    CK(cudaStreamSynchronize(s));
    CK(cudaStreamQuery(s));
    CK(cudaGetLastError());
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    CK(cudaStreamDestroy(s));
    printf("launch n=%d ms=%.6f\n", n, ms);
}

static void cmd_graph(unsigned long long ns, int n, int replays) {
    cudaStream_t s;
    cudaGraph_t g;
    cudaGraphExec_t ge;
    unsigned char *d, *h;
    CK(cudaStreamCreate(&s));
    CK(cudaMalloc((void **)&d, 4096));
    CK(cudaMallocHost((void **)&h, 4096));
    memset(h, 0, 4096);
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    for (int i = 0; i < n; i++) CK(launch(ns, s));
    CK(cudaMemsetAsync(d, 0x5a, 4096, s));
    CK(cudaMemcpyAsync(h, d, 4096, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamEndCapture(s, &g));
    size_t nodes = 0;
    CK(cudaGraphGetNodes(g, NULL, &nodes));
    int before = h[100];
    CK(cudaGraphInstantiate(&ge, g, 0));
    for (int r = 0; r < replays; r++) CK(cudaGraphLaunch(ge, s));
    CK(cudaStreamSynchronize(s));
    printf("graph nodes=%zu replays=%d before=%d after=%d\n", nodes, replays, before, h[100]);
    CK(cudaGraphExecDestroy(ge));
    CK(cudaGraphDestroy(g));
    CK(cudaFreeHost(h));
    CK(cudaFree(d));
    CK(cudaStreamDestroy(s));
}

typedef struct {
    unsigned char bytes[16];
} uuid16;
typedef int (*get_export_table_fn)(const void **, const uuid16 *);

static void where(const char *what, const void *p) {
    Dl_info info;
    if (dladdr(p, &info) && info.dli_fname) {
        const char *base = strrchr(info.dli_fname, '/');
        printf(" %s_lib=%s %s_offset=%#lx", what, base ? base + 1 : info.dli_fname, what,
               (unsigned long)((const char *)p - (const char *)info.dli_fbase));
    } else {
        printf(" %s_lib=? %s_offset=?", what, what);
    }
}

static void cmd_tables(void) {
    void *fn = NULL;
    enum cudaDriverEntryPointQueryResult q;
    CK(cudaGetDriverEntryPointByVersion("cuGetExportTable", &fn, 12000, cudaEnableDefault, &q));
    static const uuid16 cudart = {{0x6b, 0xd5, 0xfb, 0x6c, 0x5b, 0xf4, 0xe7, 0x4a, 0x89, 0x87,
                                   0xd9, 0x39, 0x12, 0xfd, 0x9d, 0xf9}};
    static const uuid16 integrity = {{0xd4, 0x08, 0x20, 0x55, 0xbd, 0xe6, 0x70, 0x4b, 0x8d, 0x34,
                                      0xba, 0x12, 0x3c, 0x66, 0xe1, 0xf2}};
    static const uuid16 unknown = {{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}};
    const void *t1 = NULL, *t2 = NULL, *t3 = (const void *)1;
    int r1 = ((get_export_table_fn)fn)(&t1, &cudart);
    int r2 = ((get_export_table_fn)fn)(&t2, &integrity);
    int r3 = ((get_export_table_fn)fn)(&t3, &unknown);
    printf("tables rc=%d,%d unknown_rc=%d unknown_null=%d", r1, r2, r3, t3 == NULL);
    where("resolver", fn);
    if (t1) where("cudart_table", t1);
    if (t2) where("integrity_fn", ((const void *const *)t2)[1]);
    printf("\n");
}

static int linger_ms;
static void linger(void) { usleep((useconds_t)linger_ms * 1000); }

int main(int argc, char **argv) {
    int first = 1;
    if (argc > 2 && !strcmp(argv[1], "--linger-at-exit")) {
        linger_ms = atoi(argv[2]);
        atexit(linger);
        first = 3;
    }
    register_image();
    for (int i = first; i < argc; i++) {
        const char *c = argv[i];
        if (!strcmp(c, "info")) cmd_info();
        else if (!strcmp(c, "meminfo")) cmd_meminfo();
        else if (!strcmp(c, "roundtrip") && need(i, argc, 1)) cmd_roundtrip(strtoull(argv[++i], 0, 0));
        else if (!strcmp(c, "malloc") && need(i, argc, 1)) cmd_malloc(strtoull(argv[++i], 0, 0));
        else if (!strcmp(c, "symbol")) cmd_symbol();
        else if (!strcmp(c, "launch") && need(i, argc, 2)) {
            unsigned long long ns = strtoull(argv[++i], 0, 0);
            cmd_launch(ns, atoi(argv[++i]));
        } else if (!strcmp(c, "graph") && need(i, argc, 3)) {
            unsigned long long ns = strtoull(argv[++i], 0, 0);
            int n = atoi(argv[++i]);
            cmd_graph(ns, n, atoi(argv[++i]));
        } else if (!strcmp(c, "tables")) cmd_tables();
        else {
            printf("error call=unknown-command code=0 name=%s\n", c);
            return 2;
        }
        fflush(stdout);
    }
    CK(cudaDeviceSynchronize());
    __cudaUnregisterFatBinary(fatbin_handle);
    printf("done\n");
    return 0;
}
