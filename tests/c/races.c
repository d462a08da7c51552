/*
 * Races between threads of one process, for tests/memory_isolation.rs;
 * linked with -lcuda against the real cuda.h. Every step prints one JSON
 * line.
 *
 *   races capture_race MIB N   one thread begins and ends a (relaxed)
 *                              capture of stream S again and again while
 *                              another makes N cuMemAllocAsync(MIB) on S,
 *                              never freed; prints "ready" and exits at the
 *                              end of stdin
 *   races fork_ctx N           one thread creates and destroys contexts
 *                              again and again while the main thread forks
 *                              N times; each child calls cuMemFree on an
 *                              allocation of the parent's and exits; a child
 *                              not gone after 2 s is counted hung (killed)
 *   races module MIB BIG       a PTX module with a MIB global, looked up;
 *                              prints "ready"; at a line on stdin, a module
 *                              with a BIG MiB global (looked up twice), then
 *                              the first one unloaded
 *   races hidden DEV           on device ordinal DEV: cuCtxCreate,
 *                              cuDevicePrimaryCtxRetain, cuDeviceTotalMem,
 *                              and (with a context) cuMemAlloc(64 MiB)
 */
#include <cuda.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static CUcontext ctx;
static CUstream S;
static volatile int stop;

static void ms_sleep(long ms) {
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

static void *capturer(void *arg) {
    (void)arg;
    cuCtxSetCurrent(ctx);
    long begun = 0;
    while (!stop) {
        if (cuStreamBeginCapture(S, CU_STREAM_CAPTURE_MODE_RELAXED) != CUDA_SUCCESS) continue;
        begun++;
        CUgraph g = NULL;
        if (cuStreamEndCapture(S, &g) == CUDA_SUCCESS && g) cuGraphDestroy(g);
    }
    return (void *)begun;
}

static int capture_race(size_t mib, int n) {
    if (cuStreamCreate(&S, CU_STREAM_NON_BLOCKING)) return 1;
    pthread_t t;
    pthread_create(&t, NULL, capturer, NULL);
    int ok = 0, oom = 0, other = 0;
    for (int i = 0; i < n; i++) {
        CUdeviceptr p = 0;
        CUresult r = cuMemAllocAsync(&p, mib << 20, S);
        if (r == CUDA_SUCCESS) ok++;
        else if (r == CUDA_ERROR_OUT_OF_MEMORY) oom++;
        else other++;
    }
    stop = 1;
    void *begun;
    pthread_join(t, &begun);
    cuStreamSynchronize(S);
    printf("{\"op\":\"capture_race\",\"ok\":%d,\"oom\":%d,\"other\":%d,\"captures\":%ld}\n", ok, oom,
           other, (long)begun);
    printf("{\"op\":\"ready\"}\n");
    fflush(stdout);
    char buf[64];
    while (fgets(buf, sizeof buf, stdin)) {
    }
    return 0;
}

static void *ctx_churn(void *arg) {
    CUdevice dev = *(CUdevice *)arg;
    while (!stop) {
        CUcontext c;
        if (cuCtxCreate(&c, 0, dev) == CUDA_SUCCESS) cuCtxDestroy(c);
    }
    return NULL;
}

static int fork_ctx(CUdevice dev, int n) {
    CUdeviceptr p = 0;
    cuMemAlloc(&p, 1 << 20);
    pthread_t t;
    pthread_create(&t, NULL, ctx_churn, &dev);
    int hung = 0, done = 0;
    for (int i = 0; i < n; i++) {
        ms_sleep(3 + i % 7);
        fflush(stdout);
        pid_t c = fork();
        if (c == 0) {
            cuMemFree(p);
            _exit(0);
        }
        if (c < 0) continue;
        int st = 0, gone = 0;
        for (int k = 0; k < 400 && !gone; k++) {
            if (waitpid(c, &st, WNOHANG) == c) gone = 1;
            else ms_sleep(5);
        }
        if (!gone) {
            hung++;
            kill(c, SIGKILL);
            waitpid(c, &st, 0);
        } else {
            done++;
        }
    }
    stop = 1;
    pthread_join(t, NULL);
    printf("{\"op\":\"fork_ctx\",\"forks\":%d,\"done\":%d,\"hung\":%d}\n", n, done, hung);
    return 0;
}

static int hidden(CUdevice dev) {
    CUcontext c = NULL, pc = NULL;
    CUresult rc = cuCtxCreate(&c, 0, dev);
    CUresult ra = CUDA_ERROR_INVALID_CONTEXT;
    if (rc == CUDA_SUCCESS) {
        CUdeviceptr p = 0;
        ra = cuMemAlloc(&p, 64 << 20);
    }
    CUresult rp = cuDevicePrimaryCtxRetain(&pc, dev);
    CUresult rpa = CUDA_ERROR_INVALID_CONTEXT;
    if (rp == CUDA_SUCCESS) {
        cuCtxSetCurrent(pc);
        CUdeviceptr p = 0;
        rpa = cuMemAlloc(&p, 64 << 20);
    }
    size_t total = 0;
    CUresult rt = cuDeviceTotalMem(&total, dev);
    printf("{\"op\":\"hidden\",\"ctx_create\":%d,\"alloc\":%d,\"primary_retain\":%d,"
           "\"primary_alloc\":%d,\"total_mem\":%d}\n",
           (int)rc, (int)ra, (int)rp, (int)rpa, (int)rt);
    printf("{\"op\":\"ready\"}\n");
    fflush(stdout);
    char buf[64];
    while (fgets(buf, sizeof buf, stdin)) {
    }
    return 0;
}

static const char *ptx_with_global(size_t bytes) {
    static char buf[512];
    snprintf(buf, sizeof buf,
             ".version 7.0\n.target sm_70\n.address_size 64\n"
             ".global .align 8 .b8 g[%zu];\n"
             ".visible .entry k() { ret; }\n",
             bytes);
    return buf;
}

static size_t free_now(void) {
    size_t f = 0, t = 0;
    cuMemGetInfo(&f, &t);
    return f;
}

static int module_globals(size_t mib, size_t big_mib) {
    CUmodule m = NULL, big = NULL;
    CUresult rl = cuModuleLoadData(&m, ptx_with_global(mib << 20));
    CUdeviceptr p = 0;
    size_t sz = 0;
    CUresult rg = rl ? rl : cuModuleGetGlobal(&p, &sz, m, "g");
    printf("{\"op\":\"global\",\"load\":%d,\"get\":%d,\"bytes\":%zu,\"free\":%zu}\n", (int)rl,
           (int)rg, sz, free_now());
    printf("{\"op\":\"ready\"}\n");
    fflush(stdout);
    char buf[64];
    if (!fgets(buf, sizeof buf, stdin)) return 0;
    CUresult rb = cuModuleLoadData(&big, ptx_with_global(big_mib << 20));
    CUresult rb1 = rb ? rb : cuModuleGetGlobal(&p, &sz, big, "g");
    CUresult rb2 = rb ? rb : cuModuleGetGlobal(&p, &sz, big, "g");
    CUresult ru = cuModuleUnload(m);
    printf("{\"op\":\"big\",\"load\":%d,\"get\":%d,\"again\":%d,\"unload\":%d,\"free\":%zu}\n",
           (int)rb, (int)rb1, (int)rb2, (int)ru, free_now());
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    if (cuInit(0) != CUDA_SUCCESS) return 3;
    CUdevice dev;
    if (cuDeviceGet(&dev, 0) != CUDA_SUCCESS) return 3;
    if (!strcmp(argv[1], "hidden")) return hidden(atoi(argv[2]));
    if (cuCtxCreate(&ctx, 0, dev) != CUDA_SUCCESS) return 3;
    if (!strcmp(argv[1], "capture_race") && argc > 3)
        return capture_race((size_t)atol(argv[2]), atoi(argv[3]));
    if (!strcmp(argv[1], "fork_ctx")) return fork_ctx(dev, atoi(argv[2]));
    if (!strcmp(argv[1], "module") && argc > 3)
        return module_globals((size_t)atol(argv[2]), (size_t)atol(argv[3]));
    return 2;
}
