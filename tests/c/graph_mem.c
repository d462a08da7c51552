/*
 * Graph memory client for tests/graph_memory.rs, linked with -lcuda against
 * the real cuda.h. Every step prints one JSON line.
 *
 *   graph_mem alloc MIB              cuMemAlloc(MIB), then a graph with one
 *                                    MIB alloc node launched once
 *   graph_mem relaunch MIB N PROBE   a graph with a MIB alloc node and its
 *                                    free node, launched N times; then
 *                                    cuMemAlloc(PROBE MiB), trim, and
 *                                    cuMemAlloc(PROBE MiB) again
 *   graph_mem capture MIB            cuMemAllocAsync/cuMemFreeAsync of MIB
 *                                    captured into a graph, launched
 *   graph_mem capture_keep MIB       cuMemAllocAsync of MIB captured into a
 *                                    graph that never frees it, launched;
 *                                    then freed outside the graph, and the
 *                                    graph memory trimmed
 *   graph_mem upload MIB             a graph allocating and freeing MIB,
 *                                    instantiated with the upload flag,
 *                                    (without it if that is refused),
 *                                    uploaded, launched
 *   graph_mem hold MIB               a graph allocating and freeing MIB,
 *                                    launched once; prints "ready" and
 *                                    exits at the end of stdin
 */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static CUdevice dev;

static unsigned long long reserved(void) {
    cuuint64_t v = ~0ull;
    cuDeviceGetGraphMemAttribute(dev, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &v);
    return (unsigned long long)v;
}

static unsigned long long mem_free(void) {
    size_t f = 0, t = 0;
    cuMemGetInfo(&f, &t);
    return (unsigned long long)f;
}

static void report(const char *op, int i, CUresult rc) {
    printf("{\"op\":\"%s\",\"i\":%d,\"rc\":%d,\"reserved\":%llu,\"free\":%llu}\n", op, i, (int)rc,
           reserved(), mem_free());
    fflush(stdout);
}

static CUDA_MEM_ALLOC_NODE_PARAMS alloc_params(size_t bytes) {
    CUDA_MEM_ALLOC_NODE_PARAMS p;
    memset(&p, 0, sizeof p);
    p.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    /* GRAPH_MEM_LOCATION: the pool's device as given (else the CUdevice). */
    const char *loc = getenv("GRAPH_MEM_LOCATION");
    p.poolProps.location.id = loc ? atoi(loc) : dev;
    p.bytesize = bytes;
    return p;
}

/* A graph of one `bytes` allocation node and the node freeing it: 0, or 4
 * if the graph could not be built. */
static int alloc_free_graph(CUgraph *g, size_t bytes) {
    CUgraphNode a, f;
    CUDA_MEM_ALLOC_NODE_PARAMS ap = alloc_params(bytes);
    if (cuGraphCreate(g, 0) || cuGraphAddMemAllocNode(&a, *g, NULL, 0, &ap)) return 4;
    if (cuGraphAddMemFreeNode(&f, *g, &a, 1, ap.dptr)) return 4;
    return 0;
}

/* Launches `e` on `s`, waits for it, and reports the launch as step `i`. */
static void launch(CUgraphExec e, CUstream s, int i) {
    CUresult rc = cuGraphLaunch(e, s);
    cuStreamSynchronize(s);
    report("graph_launch", i, rc);
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    size_t bytes = (size_t)strtoull(argv[2], NULL, 10) << 20;
    CUcontext ctx;
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuCtxCreate(&ctx, 0, dev)) return 3;
    report("start", 0, CUDA_SUCCESS);

    CUgraph g;
    CUgraphExec e;
    if (!strcmp(argv[1], "alloc")) {
        CUgraphNode a;
        CUdeviceptr p = 0;
        CUresult rc = cuMemAlloc(&p, bytes);
        report("mem_alloc", 0, rc);
        if (rc == CUDA_SUCCESS) cuMemFree(p);
        CUDA_MEM_ALLOC_NODE_PARAMS ap = alloc_params(bytes);
        if (cuGraphCreate(&g, 0) || cuGraphAddMemAllocNode(&a, g, NULL, 0, &ap)) return 4;
        if (cuGraphInstantiate(&e, g, 0)) return 5;
        launch(e, 0, 0);
    } else if (!strcmp(argv[1], "relaunch") && argc >= 5) {
        int n = atoi(argv[3]);
        size_t probe = (size_t)strtoull(argv[4], NULL, 10) << 20;
        if (alloc_free_graph(&g, bytes)) return 4;
        if (cuGraphInstantiate(&e, g, 0)) return 5;
        for (int i = 0; i < n; i++) launch(e, 0, i);
        CUdeviceptr p = 0;
        CUresult rc = cuMemAlloc(&p, probe);
        report("probe_before_trim", 0, rc);
        if (rc == CUDA_SUCCESS) cuMemFree(p);
        report("trim", 0, cuDeviceGraphMemTrim(dev));
        rc = cuMemAlloc(&p, probe);
        report("probe_after_trim", 0, rc);
        if (rc == CUDA_SUCCESS) cuMemFree(p);
    } else if (!strcmp(argv[1], "upload")) {
        if (alloc_free_graph(&g, bytes)) return 4;
        CUDA_GRAPH_INSTANTIATE_PARAMS ip;
        memset(&ip, 0, sizeof ip);
        ip.flags = CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD;
        CUresult rc = cuGraphInstantiateWithParams(&e, g, &ip);
        report("instantiate_upload", 0, rc);
        if (rc && cuGraphInstantiate(&e, g, 0)) return 5; /* refused: without the flag */
        report("upload", 0, cuGraphUpload(e, 0));
        launch(e, 0, 0);
    } else if (!strcmp(argv[1], "hold")) {
        if (alloc_free_graph(&g, bytes)) return 4;
        if (cuGraphInstantiate(&e, g, 0)) return 5;
        launch(e, 0, 0);
        printf("{\"op\":\"ready\"}\n");
        fflush(stdout);
        char buf[64];
        while (fgets(buf, sizeof buf, stdin)) {
        }
    } else if (!strcmp(argv[1], "capture") || !strcmp(argv[1], "capture_keep")) {
        int keep = !strcmp(argv[1], "capture_keep");
        CUstream s;
        CUdeviceptr p = 0;
        if (cuStreamCreate(&s, CU_STREAM_NON_BLOCKING)) return 4;
        if (cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL)) return 4;
        report("capture_alloc", 0, cuMemAllocAsync(&p, bytes, s));
        if (!keep) report("capture_free", 0, cuMemFreeAsync(p, s));
        if (cuStreamEndCapture(s, &g)) return 4;
        if (cuGraphInstantiate(&e, g, 0)) return 5;
        launch(e, s, 0);
        if (keep) {
            CUresult rc = cuMemFreeAsync(p, s);
            cuStreamSynchronize(s);
            report("free_outside", 0, rc);
            report("trim", 0, cuDeviceGraphMemTrim(dev));
        }
    } else {
        return 2;
    }
    cuGraphExecDestroy(e);
    cuGraphDestroy(g);
    report("end", 0, CUDA_SUCCESS);
    return 0;
}
