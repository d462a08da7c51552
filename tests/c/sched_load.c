/*
 * sched_load MODE MS KERNEL_NS KERNELS PAUSE_US [WARM_MS]: workloads of the scheduling
 * tests and of `examples/share`, on device 0's primary context, for MS ms
 * of wall time; prints "ready" once initialised.
 *
 *   sync      a training loop that synchronises often: launch KERNELS
 *             cgpu_sim_spin(KERNEL_NS) on a stream, synchronise it, spend
 *             PAUSE_US on the host (a metric, a data wait), again.
 *             Prints "done kernels=K".
 *   requests  an online service: every request launches KERNELS kernels,
 *             synchronises, and records its latency (launch to result);
 *             then it pauses PAUSE_US. Prints
 *             "done requests=N p50_us=.. p90_us=.. p99_us=.. max_us=..
 *             all_us=A,B,.." over the requests that began WARM_MS (default
 *             0) or more after the start (steady state, not the first
 *             launches); all_us lists every latency, fastest first.
 *   timed     the same requests, each also timed by two CUDA events on its
 *             stream (one before its kernels, one after): the done line
 *             adds "ev_us=" (their spans summed, steady requests only), what
 *             CUDA events say the requests took on the device.
 *
 * Latencies are measured on CLOCK_MONOTONIC around the launch and the
 * synchronise, as a client of the service would see them.
 */
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

static void pause_us(uint64_t us) {
    if (!us) return;
    struct timespec t = {(time_t)(us / 1000000), (long)(us % 1000000) * 1000};
    nanosleep(&t, NULL);
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    if (argc != 6 && argc != 7) {
        fprintf(stderr, "usage: sched_load sync|requests|timed MS KERNEL_NS KERNELS PAUSE_US [WARM_MS]\n");
        return 2;
    }
    uint64_t warm_ms = argc == 7 ? strtoull(argv[6], NULL, 0) : 0;
    const char *mode = argv[1];
    uint64_t ms = strtoull(argv[2], NULL, 0), ns = strtoull(argv[3], NULL, 0);
    long kernels = atol(argv[4]);
    uint64_t pause = strtoull(argv[5], NULL, 0);
    const char *ptx = ".version 7.0\n.target sm_52\n.address_size 64\n"
                      ".visible .entry cgpu_sim_spin(.param .u64 ns)\n{\n ret;\n}\n";
    CUdevice dev;
    CUcontext ctx;
    CUmodule m;
    CUfunction fn;
    CUstream s;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoadData(&m, ptx));
    CHECK(cuModuleGetFunction(&fn, m, "cgpu_sim_spin"));
    CHECK(cuStreamCreate(&s, 0));
    printf("ready\n");
    fflush(stdout);
    int timed = !strcmp(mode, "timed");
    int requests = timed || !strcmp(mode, "requests");
    CUevent e0 = NULL, e1 = NULL;
    if (timed) {
        CHECK(cuEventCreate(&e0, CU_EVENT_DEFAULT));
        CHECK(cuEventCreate(&e1, CU_EVENT_DEFAULT));
    }
    double ev_ms = 0;
    size_t cap = 1 << 20, n = 0;
    uint64_t *lat = requests ? malloc(cap * sizeof *lat) : NULL;
    long done = 0;
    uint64_t begin = now_ns();
    uint64_t end = begin + ms * 1000000ull, steady = begin + warm_ms * 1000000ull;
    while (now_ns() < end) {
        uint64_t t0 = now_ns();
        if (timed) CHECK(cuEventRecord(e0, s));
        for (long k = 0; k < kernels; k++) {
            void *args[] = {&ns};
            CHECK(cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, s, args, NULL));
        }
        if (timed) CHECK(cuEventRecord(e1, s));
        CHECK(cuStreamSynchronize(s));
        done += kernels;
        if (requests && n < cap && t0 >= steady) {
            lat[n++] = now_ns() - t0;
            if (timed) {
                float m = 0;
                CHECK(cuEventElapsedTime(&m, e0, e1));
                ev_ms += m;
            }
        }
        pause_us(pause);
    }
    if (requests) {
        qsort(lat, n, sizeof *lat, cmp_u64);
#define PCT(p) (n ? lat[(size_t)((n - 1) * (p) / 100)] / 1000 : 0)
        printf("done requests=%zu p50_us=%llu p90_us=%llu p99_us=%llu max_us=%llu", n,
               (unsigned long long)PCT(50), (unsigned long long)PCT(90),
               (unsigned long long)PCT(99), (unsigned long long)PCT(100));
        printf(" all_us=");
        for (size_t i = 0; i < n; i++)
            printf("%s%llu", i ? "," : "", (unsigned long long)(lat[i] / 1000));
        if (timed) printf(" ev_us=%llu", (unsigned long long)(ev_ms * 1000.0));
        printf("\n");
    } else {
        printf("done kernels=%ld\n", done);
    }
    fflush(stdout);
    return 0;
}
