/*
 * sched_twogpu MS NS: one thread driving devices 0 and 1 of one process:
 * each round makes each device's primary context current in turn, launches
 * four cgpu_sim_spin(NS) there, then synchronises both; for MS ms.
 * Prints "ready" once initialised, then "done rounds=R". For the scheduling
 * tests (each device's launches are gated by that device's ledger).
 */
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define CHECK(x)                                                    \
    do {                                                            \
        CUresult r_ = (x);                                          \
        if (r_) { fprintf(stderr, "%s: %d\n", #x, r_); exit(1); }   \
    } while (0)

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + t.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc != 3) { fprintf(stderr, "usage: sched_twogpu MS NS\n"); return 2; }
    uint64_t ms = strtoull(argv[1], NULL, 0), ns = strtoull(argv[2], NULL, 0);
    const char *ptx = ".version 7.0\n.target sm_52\n.address_size 64\n"
                      ".visible .entry cgpu_sim_spin(.param .u64 ns)\n{\n ret;\n}\n";
    CUcontext ctx[2];
    CUfunction fn[2];
    CHECK(cuInit(0));
    for (int d = 0; d < 2; d++) {
        CUdevice dev;
        CUmodule m;
        CHECK(cuDeviceGet(&dev, d));
        CHECK(cuDevicePrimaryCtxRetain(&ctx[d], dev));
        CHECK(cuCtxSetCurrent(ctx[d]));
        CHECK(cuModuleLoadData(&m, ptx));
        CHECK(cuModuleGetFunction(&fn[d], m, "cgpu_sim_spin"));
    }
    printf("ready\n");
    fflush(stdout);
    uint64_t end = now_ns() + ms * 1000000ull;
    long rounds = 0;
    while (now_ns() < end) {
        for (int d = 0; d < 2; d++) {
            CHECK(cuCtxSetCurrent(ctx[d]));
            for (int i = 0; i < 4; i++) {
                void *args[] = {&ns};
                CHECK(cuLaunchKernel(fn[d], 1, 1, 1, 32, 1, 1, 0, NULL, args, NULL));
            }
        }
        for (int d = 0; d < 2; d++) {
            CHECK(cuCtxSetCurrent(ctx[d]));
            CHECK(cuCtxSynchronize());
        }
        rounds++;
    }
    printf("done rounds=%ld\n", rounds);
    fflush(stdout);
    return 0;
}
