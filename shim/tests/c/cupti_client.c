/*
 * cupti_client LIBCUPTI: what a profiler (PyTorch's, through Kineto) asks of
 * NVIDIA's CUPTI on top of the CUDA runtime, against the simulated driver.
 * CUPTI is opened with dlopen (its path is the argument) and called through
 * its documented C entry points. Prints one line per step, "<step> <result>",
 * then "cuda ok" when the runtime still works afterwards; exits 0 unless a
 * runtime call failed (a crash is the failure this client exists to catch).
 */
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef void (*buf_request_fn)(uint8_t **, size_t *, size_t *);
typedef void (*buf_complete_fn)(void *, uint32_t, uint8_t *, size_t, size_t);
typedef int (*register_fn)(buf_request_fn, buf_complete_fn);
typedef int (*kind_fn)(int);
typedef int (*flush_fn)(uint32_t);
typedef int (*push_fn)(int, uint64_t);
typedef int (*timestamp_fn)(uint64_t *);
typedef int (*subscribe_fn)(void **, void (*)(void *, int, uint32_t, const void *), void *);
typedef int (*enable_domain_fn)(uint32_t, void *, int);
typedef int (*void_fn)(void);

static void buf_request(uint8_t **b, size_t *size, size_t *max) {
    *size = 1 << 20;
    *b = aligned_alloc(8, *size);
    *max = 0;
}
static void buf_complete(void *ctx, uint32_t stream, uint8_t *b, size_t size, size_t valid) {
    (void)ctx, (void)stream, (void)size, (void)valid;
    free(b);
}
static void callback(void *user, int domain, uint32_t id, const void *data) {
    (void)user, (void)domain, (void)id, (void)data;
}

#define SYM(type, name) ((type)need(h, name))
static void *need(void *h, const char *name) {
    void *f = dlsym(h, name);
    if (!f) {
        printf("dlsym %s missing\n", name);
        exit(3);
    }
    return f;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    if (argc < 2) return 2;
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) {
        printf("dlopen %s\n", dlerror());
        return 3;
    }
    /* The runtime is up before the profiler starts, as in PyTorch. */
    if (cudaFree(0) != cudaSuccess) return 4;
    void *sub = NULL;
    printf("subscribe %d\n", SYM(subscribe_fn, "cuptiSubscribe")(&sub, callback, NULL));
    printf("enable_domain %d\n", SYM(enable_domain_fn, "cuptiEnableDomain")(1, sub, 4 /* RESOURCE */));
    printf("register %d\n",
           SYM(register_fn, "cuptiActivityRegisterCallbacks")(buf_request, buf_complete));
    /* concurrent kernel, memcpy, memset, runtime, driver, synchronization,
     * external correlation, overhead, CUDA event */
    int kinds[] = {10, 1, 2, 5, 4, 38, 39, 17, 36};
    for (int i = 0; i < 9; i++)
        printf("enable_%d %d\n", kinds[i], SYM(kind_fn, "cuptiActivityEnable")(kinds[i]));
    printf("push %d\n", SYM(push_fn, "cuptiActivityPushExternalCorrelationId")(1, 42));
    uint64_t ts = 0;
    printf("timestamp %d\n", SYM(timestamp_fn, "cuptiGetTimestamp")(&ts));
    void *p = NULL;
    if (cudaMalloc(&p, 1 << 20) || cudaMemset(p, 1, 1 << 20) || cudaDeviceSynchronize() ||
        cudaFree(p))
        return 5;
    printf("flush %d\n", SYM(flush_fn, "cuptiActivityFlushAll")(1));
    for (int i = 0; i < 9; i++) SYM(kind_fn, "cuptiActivityDisable")(kinds[i]);
    printf("finalize %d\n", SYM(void_fn, "cuptiFinalize")());
    if (cudaMalloc(&p, 4096) || cudaFree(p)) return 6;
    printf("cuda ok\n");
    return 0;
}
