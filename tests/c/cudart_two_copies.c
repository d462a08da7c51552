/* cudart_two_copies.c: two copies of NVIDIA's CUDA runtime in one process,
 * as in a PyTorch process (its own libcudart plus the static copies inside
 * cuBLAS and cuBLASLt). Each copy is dlopen'ed (RTLD_LOCAL) from the path
 * given, and driven from its own thread; the threads start together, so the
 * copies race to retain the device's one primary context.
 *
 * usage: cudart_two_copies LIBCUDART_A LIBCUDART_B BYTES
 * Each thread: cudaMemGetInfo (the runtime creates its context), cudaMalloc
 * BYTES, cudaMemGetInfo; after both, the main thread prints
 *   copy i=0|1 rc_info= rc_malloc= free_before= free_after= total=
 * then frees, holds a moment and exits 0 (3 if a library cannot be loaded).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

typedef int (*meminfo_fn)(size_t *, size_t *);
typedef int (*malloc_fn)(void **, size_t);
typedef int (*free_fn)(void *);

struct copy {
    const char *path;
    meminfo_fn meminfo;
    malloc_fn malloc_;
    free_fn free_;
    size_t bytes, free_before, free_after, total;
    int rc_info, rc_malloc;
    void *p;
};

static pthread_barrier_t start;

static void *run(void *arg) {
    struct copy *c = arg;
    pthread_barrier_wait(&start);
    c->rc_info = c->meminfo(&c->free_before, &c->total);
    c->rc_malloc = c->malloc_(&c->p, c->bytes);
    c->meminfo(&c->free_after, &c->total);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s LIBCUDART_A LIBCUDART_B BYTES\n", argv[0]);
        return 2;
    }
    struct copy c[2] = {{0}};
    for (int i = 0; i < 2; i++) {
        c[i].path = argv[1 + i];
        c[i].bytes = strtoull(argv[3], 0, 0);
        void *h = dlopen(c[i].path, RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            printf("error dlopen=%s\n", dlerror());
            return 3;
        }
        c[i].meminfo = (meminfo_fn)dlsym(h, "cudaMemGetInfo");
        c[i].malloc_ = (malloc_fn)dlsym(h, "cudaMalloc");
        c[i].free_ = (free_fn)dlsym(h, "cudaFree");
        if (!c[i].meminfo || !c[i].malloc_ || !c[i].free_) {
            printf("error dlsym=%s\n", c[i].path);
            return 3;
        }
    }
    pthread_barrier_init(&start, NULL, 2);
    pthread_t t[2];
    for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, run, &c[i]);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    for (int i = 0; i < 2; i++)
        printf("copy i=%d rc_info=%d rc_malloc=%d free_before=%zu free_after=%zu total=%zu\n", i,
               c[i].rc_info, c[i].rc_malloc, c[i].free_before, c[i].free_after, c[i].total);
    fflush(stdout);
    /* Both allocations live: the caller may look at the ledger and the sim. */
    printf("holding pid=%d\n", (int)getpid());
    fflush(stdout);
    char buf[8];
    if (fgets(buf, sizeof buf, stdin) == NULL) { /* EOF: go on */ }
    for (int i = 0; i < 2; i++)
        if (c[i].rc_malloc == 0) c[i].free_(c[i].p);
    printf("done\n");
    return 0;
}
