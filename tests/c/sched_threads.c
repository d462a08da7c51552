/*
 * sched_threads THREADS MS NS: one process, THREADS threads sharing the
 * primary context, each on its own stream launching cgpu_sim_spin(NS) in
 * batches of 4 and synchronising its stream, for MS ms of wall time.
 * Prints "ready" once initialised, then "done kernels=K". For the
 * scheduling tests (a multi-threaded process draws from its container's
 * bucket and is drained whole at each handover).
 */
#include <cuda.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static CUcontext ctx;
static CUfunction fn;
static uint64_t run_ms, kernel_ns;

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + t.tv_nsec;
}

#define CHECK(x)                                                    \
    do {                                                            \
        CUresult r_ = (x);                                          \
        if (r_) { fprintf(stderr, "%s: %d\n", #x, r_); exit(1); }   \
    } while (0)

static void *worker(void *arg) {
    (void)arg;
    CHECK(cuCtxSetCurrent(ctx));
    CUstream s;
    CHECK(cuStreamCreate(&s, 0));
    uint64_t end = now_ns() + run_ms * 1000000ull;
    long k = 0;
    while (now_ns() < end) {
        for (int i = 0; i < 4; i++) {
            void *args[] = {&kernel_ns};
            CHECK(cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, s, args, NULL));
        }
        CHECK(cuStreamSynchronize(s));
        k += 4;
    }
    return (void *)k;
}

int main(int argc, char **argv) {
    if (argc != 4) { fprintf(stderr, "usage: sched_threads THREADS MS NS\n"); return 2; }
    int n = atoi(argv[1]);
    run_ms = strtoull(argv[2], NULL, 0);
    kernel_ns = strtoull(argv[3], NULL, 0);
    const char *ptx = ".version 7.0\n.target sm_52\n.address_size 64\n"
                      ".visible .entry cgpu_sim_spin(.param .u64 ns)\n{\n ret;\n}\n";
    CUdevice dev;
    CUmodule m;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoadData(&m, ptx));
    CHECK(cuModuleGetFunction(&fn, m, "cgpu_sim_spin"));
    printf("ready\n");
    fflush(stdout);
    pthread_t t[64];
    if (n < 1 || n > 64) n = 1;
    for (int i = 0; i < n; i++) pthread_create(&t[i], NULL, worker, NULL);
    long total = 0;
    for (int i = 0; i < n; i++) {
        void *k;
        pthread_join(t[i], &k);
        total += (long)k;
    }
    printf("done kernels=%ld\n", total);
    fflush(stdout);
    return 0;
}
