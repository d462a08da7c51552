/*
 * A preload library that exports only cuMemAlloc_v2 and hooks nothing else:
 * it fails every allocation with CUDA_ERROR_UNKNOWN (999) and says so on
 * stderr. Clients linked with -lcuda are interposed; clients that use
 * cuGetProcAddress or dlsym on the driver's own handle must bypass it, as
 * they do with the real driver (the sim is linked -Bsymbolic).
 */
#include <stdio.h>
#include <stddef.h>
unsigned int cuMemAlloc_v2(unsigned long long *dptr, size_t bytesize) {
    (void)dptr;
    fprintf(stderr, "preload_memalloc: intercepted cuMemAlloc_v2(%zu)\n", bytesize);
    return 999;
}
