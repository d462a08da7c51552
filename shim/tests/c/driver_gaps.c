/*
 * driver_gaps: driver behaviours real clients rely on, each checked through
 * the real cuda.h (linked with -lcuda against the simulated driver).
 *
 * Usage: driver_gaps CHECK...   Each check prints one line
 * "<check> ok key=value..." or "<check> FAIL <what>" (and the client goes
 * on with the next check). A crash is a failure of the test that runs it.
 *
 *   capture_info       cuStreamGetCaptureInfo_v3 during a capture: the
 *                      dependencies and edge data arrays are readable (edge
 *                      data zeroed: default edges), NULL with a count of 0
 *                      before the first captured node
 *   cond_params        cuGraphNodeGetParams of an IF node hands back the
 *                      node's body graph, usable to add nodes; a handle made
 *                      for another graph is refused
 *   host_order         cuLaunchHostFunc runs after the stream's earlier kernel;
 *                      cuStreamSynchronize and cuCtxSynchronize wait for it
 *                      (its data is freed right after the synchronisation);
 *                      a host function that synchronises gets NOT_PERMITTED;
 *                      cuLaunchHostFunc_v2 the same in both sync modes
 *   host_capture       cuLaunchHostFunc into a capturing stream is a host node:
 *                      nothing runs at capture, once per graph launch
 *   kernel_node_kern   a kernel node given a CUkernel in .kern with .func NULL
 *   vmm_span           two cuMemMap mappings side by side are one range for
 *                      copies, memsets and pointer attributes; memory without
 *                      access (cuMemSetAccess) is refused, never a fault
 *   pool_handle_types  CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES
 *   graph_alloc_replay what PyTorch's cudaMallocAsync backend does with a CUDA
 *                      graph: stream-ordered allocations captured (one freed in
 *                      the capture, one kept), instantiated with
 *                      AUTO_FREE_ON_LAUNCH, the graph destroyed, then replayed
 *   managed_pool       CUDA 13's managed memory pools: cuMemGetMemPool of the
 *                      managed type, cuMemPoolCreate of one, allocations from
 *                      them are managed memory of that pool, also as graph
 *                      allocations (captured, or memory nodes of that type)
 *   user_objects       a user object's references follow graph clones, child
 *                      graph nodes and executable graphs: its destructor runs
 *                      once the last of them is gone
 *   ipc_event_owner    (with ipc_event_user in another process) an interprocess
 *                      event recorded behind a host function that waits for a
 *                      line on stdin: prints "handle HEX", then, once the line
 *                      came, "ipc_event_owner ok"
 *   module_globals     a module's __device__ globals are device memory from the
 *                      load on (cuMemGetInfo's free drops at cuModuleLoadData
 *                      and cuLibraryLoadData, not at the look-up), keep their
 *                      bytes, and are given back at unload; a module whose
 *                      globals do not fit is refused at load (OUT_OF_MEMORY)
 *   graph_update       cuGraphExecUpdate's result info: a graph of another shape
 *                      (node count, a node's dependencies, a node's type, a 2D
 *                      memset's size) is refused with the documented result,
 *                      error node and "from" node; a refused update changes
 *                      nothing; a matching one takes the new parameters and
 *                      the new graph's user objects (the old ones released)
 *   graph_mem_destroy  nodes and edges of a graph with memory nodes cannot be
 *                      deleted: the refusal keeps the node and its edge
 *   child_move         a graph with memory nodes becomes a child node only when
 *                      moved (CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE): the parent
 *                      owns it (no destroy, instantiate or second parent for it)
 *                      and runs its allocation and free at every launch
 *   ipc_event_user HEX opens the handle: the event is pending ("pending" line)
 *                      for cuEventQuery and for a stream that waits for it,
 *                      then cuEventSynchronize and the stream complete
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *ptx =
    ".version 7.0\n.target sm_52\n.address_size 64\n"
    ".visible .entry cgpu_sim_spin(.param .u64 ns)\n{\n ret;\n}\n";

static CUdevice dev;
static CUcontext ctx;
static CUmodule mod;
static CUfunction spin;

#define CHECK(call)                                                             \
    do {                                                                        \
        CUresult r_ = (call);                                                   \
        if (r_ != CUDA_SUCCESS) {                                               \
            printf("%s FAIL %s = %d (line %d)\n", name, #call, r_, __LINE__);   \
            return;                                                             \
        }                                                                       \
    } while (0)
#define EXPECT(cond, ...)                                                       \
    do {                                                                        \
        if (!(cond)) {                                                          \
            printf("%s FAIL %s: ", name, #cond);                                \
            printf(__VA_ARGS__);                                                \
            printf("\n");                                                       \
            return;                                                             \
        }                                                                       \
    } while (0)

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static CUresult launch_spin(CUstream s, uint64_t ns) {
    void *args[] = {&ns};
    return cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, s, args, NULL);
}

/* ------------------------------------------------------------ capture_info */

static void capture_info(void) {
    const char *name = "capture_info";
    CUstream s;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CUstreamCaptureStatus st;
    cuuint64_t id;
    CUgraph g;
    const CUgraphNode *deps = (const CUgraphNode *)1;
    const CUgraphEdgeData *edges = (const CUgraphEdgeData *)1;
    size_t n = 99;
    CHECK(cuStreamGetCaptureInfo_v3(s, &st, &id, &g, &deps, &edges, &n));
    EXPECT(st == CU_STREAM_CAPTURE_STATUS_ACTIVE && n == 0, "status %d n %zu", st, n);
    size_t before = n;
    CHECK(launch_spin(s, 1000));
    CHECK(launch_spin(s, 1000));
    CHECK(cuStreamGetCaptureInfo_v3(s, &st, &id, &g, &deps, &edges, &n));
    EXPECT(n == 1 && deps && edges, "n %zu deps %p edges %p", n, (void *)deps, (void *)edges);
    /* The client reads them: a real driver's arrays are readable. */
    CUgraphNodeType t;
    CHECK(cuGraphNodeGetType(deps[0], &t));
    EXPECT(t == CU_GRAPH_NODE_TYPE_KERNEL, "type %d", t);
    const unsigned char *e = (const unsigned char *)&edges[0];
    int zero = 1;
    for (size_t i = 0; i < sizeof(CUgraphEdgeData); i++) zero &= e[i] == 0;
    EXPECT(zero, "edge data not a default edge");
    /* The dependencies only (edge data not asked for). */
    CHECK(cuStreamGetCaptureInfo_v3(s, &st, NULL, NULL, &deps, NULL, &n));
    EXPECT(n == 1 && deps, "deps only: n %zu", n);
    CUgraph out;
    CHECK(cuStreamEndCapture(s, &out));
    size_t count = 0;
    CHECK(cuGraphGetNodes(out, NULL, &count));
    /* Not capturing: no arrays. */
    CHECK(cuStreamGetCaptureInfo_v3(s, &st, NULL, NULL, &deps, &edges, &n));
    EXPECT(st == CU_STREAM_CAPTURE_STATUS_NONE && n == 0, "after: status %d n %zu", st, n);
    printf("%s ok before=%zu deps=1 nodes=%zu\n", name, before, count);
    cuGraphDestroy(out);
    cuStreamDestroy(s);
}

/* ------------------------------------------------------------- cond_params */

static void cond_params(void) {
    const char *name = "cond_params";
    CUgraph g;
    CHECK(cuGraphCreate(&g, 0));
    CUgraphConditionalHandle h;
    CHECK(cuGraphConditionalHandleCreate(&h, g, ctx, 1, CU_GRAPH_COND_ASSIGN_DEFAULT));
    CUgraphNodeParams p;
    memset(&p, 0, sizeof p);
    p.type = CU_GRAPH_NODE_TYPE_CONDITIONAL;
    p.conditional.handle = h;
    p.conditional.type = CU_GRAPH_COND_TYPE_IF;
    p.conditional.size = 1;
    p.conditional.ctx = ctx;
    CUgraphNode n;
    CHECK(cuGraphAddNode(&n, g, NULL, NULL, 0, &p));
    CUgraph body = p.conditional.phGraph_out[0];
    CUgraphNodeParams q;
    memset(&q, 0xab, sizeof q);
    CHECK(cuGraphNodeGetParams(n, &q));
    EXPECT(q.type == CU_GRAPH_NODE_TYPE_CONDITIONAL, "type %d", q.type);
    EXPECT(q.conditional.phGraph_out != NULL, "phGraph_out NULL");
    EXPECT(q.conditional.size == 1 && q.conditional.handle == h, "size %u", q.conditional.size);
    EXPECT(q.conditional.phGraph_out[0] == body, "body %p vs %p", (void *)q.conditional.phGraph_out[0],
           (void *)body);
    /* The body is a graph the client may fill. */
    CUgraphNode e;
    CHECK(cuGraphAddEmptyNode(&e, q.conditional.phGraph_out[0], NULL, 0));
    size_t count = 0;
    CHECK(cuGraphGetNodes(body, NULL, &count));
    EXPECT(count == 1, "body nodes %zu", count);
    /* A handle created for another graph is refused. */
    CUgraph other;
    CHECK(cuGraphCreate(&other, 0));
    CUgraphConditionalHandle foreign;
    CHECK(cuGraphConditionalHandleCreate(&foreign, other, ctx, 1, 0));
    p.conditional.handle = foreign;
    CUgraphNode bad;
    CUresult r = cuGraphAddNode(&bad, g, NULL, NULL, 0, &p);
    EXPECT(r == CUDA_ERROR_INVALID_VALUE, "a handle of another graph: %d", r);
    cuGraphDestroy(other);
    CUgraphExec x;
    CHECK(cuGraphInstantiate(&x, g, 0));
    CHECK(cuGraphLaunch(x, 0));
    CHECK(cuCtxSynchronize());
    printf("%s ok body_nodes=%zu\n", name, count);
    cuGraphExecDestroy(x);
    cuGraphDestroy(g);
}

/* ------------------------------------------------------------ host funcs */

struct host_rec {
    uint64_t ran_at;
    uint64_t sleep_ms;
    /* With `gated`, the function returns once the client opens the gate. */
    int gated;
    volatile int gate;
    volatile int calls;
};

static void CUDA_CB host_fn(void *data) {
    struct host_rec *r = data;
    r->ran_at = now_ns();
    if (r->sleep_ms) usleep(r->sleep_ms * 1000);
    while (r->gated && !r->gate) usleep(1000);
    r->calls++;
}

static CUstream sync_target;
static volatile CUresult sync_from_host[3] = {-1, -1, -1};

/* A host function that breaks the rule and synchronises. */
static void CUDA_CB sync_in_host_fn(void *data) {
    (void)data;
    sync_from_host[0] = cuStreamSynchronize(sync_target);
    sync_from_host[1] = cuCtxSynchronize();
    CUevent e = (CUevent)0;
    sync_from_host[2] = cuEventSynchronize(e);
}

static void host_order(void) {
    const char *name = "host_order";
    CUstream s;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    /* After a 30 ms kernel; sleeps 50 ms: the synchronisation waits. */
    struct host_rec *r = calloc(1, sizeof *r);
    r->sleep_ms = 50;
    uint64_t t0 = now_ns();
    CHECK(launch_spin(s, 30000000));
    CHECK(cuLaunchHostFunc(s, host_fn, r));
    CHECK(cuStreamSynchronize(s));
    uint64_t t1 = now_ns();
    EXPECT(r->calls == 1, "not run when cuStreamSynchronize returned");
    uint64_t after_kernel = r->ran_at - t0, sync_ns = t1 - t0;
    EXPECT(after_kernel >= 30000000, "ran %llu ns after the launch, before the 30 ms kernel ended",
           (unsigned long long)after_kernel);
    EXPECT(sync_ns >= 80000000, "synchronised after %llu ns", (unsigned long long)sync_ns);
    free(r);
    /* Context synchronisation waits for it too; the next kernel runs after it. */
    r = calloc(1, sizeof *r);
    r->sleep_ms = 30;
    CHECK(cuLaunchHostFunc(s, host_fn, r));
    CUevent ev;
    CHECK(cuEventCreate(&ev, CU_EVENT_DEFAULT));
    CHECK(launch_spin(s, 1000));
    CHECK(cuEventRecord(ev, s));
    CHECK(cuCtxSynchronize());
    EXPECT(r->calls == 1, "not run when cuCtxSynchronize returned");
    CHECK(cuEventQuery(ev));
    free(r);
    /* An event recorded after it is not complete before it returns. */
    r = calloc(1, sizeof *r);
    r->gated = 1;
    CHECK(cuLaunchHostFunc(s, host_fn, r));
    CHECK(cuEventRecord(ev, s));
    usleep(20000);
    CUresult q1 = cuEventQuery(ev), q2 = cuStreamQuery(s);
    r->gate = 1;
    CHECK(cuEventSynchronize(ev));
    EXPECT(q1 == CUDA_ERROR_NOT_READY && q2 == CUDA_ERROR_NOT_READY && r->calls == 1,
           "event query %d stream query %d calls %d", q1, q2, r->calls);
    free(r);
    /* cuLaunchHostFunc_v2 in either sync mode (blocking, spin-wait): in
     * stream order, after a 20 ms kernel, waited for by the stream. */
    for (unsigned mode = CU_HOST_TASK_BLOCKING; mode <= CU_HOST_TASK_SPINWAIT; mode++) {
        r = calloc(1, sizeof *r);
        t0 = now_ns();
        CHECK(launch_spin(s, 20000000));
        CHECK(cuLaunchHostFunc_v2(s, host_fn, r, mode));
        CHECK(cuStreamSynchronize(s));
        EXPECT(r->calls == 1 && r->ran_at - t0 >= 20000000, "_v2 mode %u: calls %d", mode,
               r->calls);
        free(r);
    }
    CUresult bad = cuLaunchHostFunc_v2(s, host_fn, NULL, 2);
    EXPECT(bad == CUDA_ERROR_INVALID_VALUE, "_v2 with mode 2: %d", bad);
    /* A host function that synchronises is refused, never a hang. */
    sync_target = s;
    CHECK(cuLaunchHostFunc(s, sync_in_host_fn, NULL));
    CHECK(cuStreamSynchronize(s));
    EXPECT(sync_from_host[0] == CUDA_ERROR_NOT_PERMITTED && sync_from_host[1] == CUDA_ERROR_NOT_PERMITTED &&
               sync_from_host[2] == CUDA_ERROR_NOT_PERMITTED,
           "synchronising from a host function: %d %d %d", sync_from_host[0], sync_from_host[1],
           sync_from_host[2]);
    printf("%s ok after_kernel_ns=%llu sync_ns=%llu\n", name, (unsigned long long)after_kernel,
           (unsigned long long)sync_ns);
    cuEventDestroy(ev);
    cuStreamDestroy(s);
}

static void host_capture(void) {
    const char *name = "host_capture";
    CUstream s;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    struct host_rec *r = calloc(1, sizeof *r);
    CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CHECK(launch_spin(s, 1000));
    CHECK(cuLaunchHostFunc(s, host_fn, r));
    CUgraph g;
    CHECK(cuStreamEndCapture(s, &g));
    usleep(20000);
    EXPECT(r->calls == 0, "ran at capture (%d calls)", r->calls);
    CUgraphNode nodes[4];
    size_t n = 4;
    CHECK(cuGraphGetNodes(g, nodes, &n));
    EXPECT(n == 2, "%zu nodes", n);
    CUgraphNodeType t;
    CHECK(cuGraphNodeGetType(nodes[1], &t));
    EXPECT(t == CU_GRAPH_NODE_TYPE_HOST, "second node type %d", t);
    CUDA_HOST_NODE_PARAMS hp;
    CHECK(cuGraphHostNodeGetParams(nodes[1], &hp));
    EXPECT(hp.fn == host_fn && hp.userData == r, "host node params");
    CUgraphExec x;
    CHECK(cuGraphInstantiate(&x, g, 0));
    CHECK(cuGraphLaunch(x, s));
    CHECK(cuGraphLaunch(x, s));
    CHECK(cuStreamSynchronize(s));
    EXPECT(r->calls == 2, "%d calls after two launches", r->calls);
    /* A stream callback is refused in a capture, as by the driver. */
    CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CUresult cb = cuStreamAddCallback(s, (CUstreamCallback)(void *)host_fn, r, 0);
    CUgraph g2 = NULL;
    CUresult end = cuStreamEndCapture(s, &g2);
    EXPECT(cb == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED && end == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED,
           "callback %d end %d", cb, end);
    free(r);
    printf("%s ok calls=2\n", name);
    cuGraphExecDestroy(x);
    cuGraphDestroy(g);
    cuStreamDestroy(s);
}

/* -------------------------------------------------------- kernel_node_kern */

static void kernel_node_kern(void) {
    const char *name = "kernel_node_kern";
    CUlibrary lib;
    CHECK(cuLibraryLoadData(&lib, ptx, NULL, NULL, 0, NULL, NULL, 0));
    CUkernel k;
    CHECK(cuLibraryGetKernel(&k, lib, "cgpu_sim_spin"));
    CUgraph g;
    CHECK(cuGraphCreate(&g, 0));
    uint64_t ns = 2000000;
    void *args[] = {&ns};
    CUDA_KERNEL_NODE_PARAMS p;
    memset(&p, 0, sizeof p);
    p.func = NULL;
    p.kern = k;
    p.ctx = NULL;
    p.gridDimX = p.gridDimY = p.gridDimZ = 1;
    p.blockDimX = p.blockDimY = p.blockDimZ = 1;
    p.kernelParams = args;
    CUgraphNode n;
    CHECK(cuGraphAddKernelNode(&n, g, NULL, 0, &p));
    CUDA_KERNEL_NODE_PARAMS back;
    memset(&back, 0, sizeof back);
    CHECK(cuGraphKernelNodeGetParams(n, &back));
    EXPECT(back.kern == k && back.func == NULL, "params back: kern %p func %p", (void *)back.kern,
           (void *)back.func);
    /* Through cuGraphAddNode too. */
    CUgraphNodeParams gp;
    memset(&gp, 0, sizeof gp);
    gp.type = CU_GRAPH_NODE_TYPE_KERNEL;
    gp.kernel.kern = k;
    gp.kernel.ctx = ctx;
    gp.kernel.gridDimX = gp.kernel.gridDimY = gp.kernel.gridDimZ = 1;
    gp.kernel.blockDimX = gp.kernel.blockDimY = gp.kernel.blockDimZ = 1;
    gp.kernel.kernelParams = args;
    CUgraphNode n2;
    CHECK(cuGraphAddNode(&n2, g, &n, NULL, 1, &gp));
    /* Neither a function nor a kernel: refused. */
    p.kern = NULL;
    CUgraphNode bad;
    CUresult r = cuGraphAddKernelNode(&bad, g, NULL, 0, &p);
    EXPECT(r != CUDA_SUCCESS, "a node with neither func nor kern accepted");
    CUgraphExec x;
    CHECK(cuGraphInstantiate(&x, g, 0));
    uint64_t t0 = now_ns();
    CHECK(cuGraphLaunch(x, 0));
    CHECK(cuCtxSynchronize());
    uint64_t wall = now_ns() - t0;
    EXPECT(wall >= 4000000, "two 2 ms kernels took %llu ns", (unsigned long long)wall);
    printf("%s ok wall_ns=%llu\n", name, (unsigned long long)wall);
    cuGraphExecDestroy(x);
    cuGraphDestroy(g);
}

/* ---------------------------------------------------------------- vmm_span */

static void vmm_span(void) {
    const char *name = "vmm_span";
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = (int)dev;
    size_t gran = 0;
    CHECK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    CUdeviceptr base;
    CHECK(cuMemAddressReserve(&base, 4 * gran, 0, 0, 0));
    CUmemGenericAllocationHandle h[2];
    for (int i = 0; i < 2; i++) {
        CHECK(cuMemCreate(&h[i], gran, &prop, 0));
        CHECK(cuMemMap(base + i * gran, gran, 0, h[i], 0));
    }
    /* No access set yet: refused, never a fault in the client. */
    CUresult noacc = cuMemsetD8(base, 1, 16);
    EXPECT(noacc == CUDA_ERROR_INVALID_VALUE, "memset before cuMemSetAccess: %d", noacc);
    CUmemAccessDesc acc;
    memset(&acc, 0, sizeof acc);
    acc.location = prop.location;
    acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    CHECK(cuMemSetAccess(base, gran, &acc, 1));
    noacc = cuMemsetD8(base + gran - 8, 1, 16);
    EXPECT(noacc == CUDA_ERROR_INVALID_VALUE, "memset into the mapping without access: %d", noacc);
    CHECK(cuMemSetAccess(base, 2 * gran, &acc, 1));
    /* A copy across the boundary of the two mappings. */
    size_t len = gran;
    unsigned char *src = malloc(len), *dst = malloc(2 * gran);
    for (size_t i = 0; i < len; i++) src[i] = (unsigned char)(i * 7 + 1);
    CUdeviceptr mid = base + gran / 2;
    CHECK(cuMemcpyHtoD(mid, src, len));
    CHECK(cuMemsetD8(base, 0x5a, gran / 2));
    CHECK(cuMemsetD8(mid + len, 0xa5, gran / 2));
    CHECK(cuMemcpyDtoH(dst, base, 2 * gran));
    EXPECT(dst[0] == 0x5a && dst[2 * gran - 1] == 0xa5, "memset ends");
    EXPECT(memcmp(dst + gran / 2, src, len) == 0, "bytes across the mappings");
    /* Device to device across the boundary, and asynchronously. */
    CHECK(cuMemcpyDtoD(base, mid, len));
    CHECK(cuMemcpyDtoHAsync(dst, base, len, 0));
    CHECK(cuStreamSynchronize(0));
    EXPECT(memcmp(dst, src, len) == 0, "DtoD across the mappings");
    /* Past the last mapping: refused. */
    CUresult past = cuMemsetD8(base + gran, 0, 2 * gran);
    EXPECT(past == CUDA_ERROR_INVALID_VALUE, "past the mappings: %d", past);
    /* Pointer attributes of VMM memory. */
    unsigned int mt = 0;
    int ord = -1;
    CUdeviceptr start = 0;
    size_t size = 0;
    CHECK(cuPointerGetAttribute(&mt, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, mid + gran));
    CHECK(cuPointerGetAttribute(&ord, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, mid));
    CHECK(cuPointerGetAttribute(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, base + gran + 8));
    CHECK(cuPointerGetAttribute(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, base + gran + 8));
    EXPECT(mt == CU_MEMORYTYPE_DEVICE && ord == (int)dev, "type %u ordinal %d", mt, ord);
    EXPECT(start == base + gran && size == gran, "range %llx+%zu", (unsigned long long)start, size);
    CUdeviceptr rb;
    size_t rs;
    CHECK(cuMemGetAddressRange(&rb, &rs, base + 8));
    EXPECT(rb == base && rs == gran, "address range");
    unsigned int attrs[2] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_MAPPED};
    unsigned int mt2 = 0, mapped = 0;
    void *outs[2] = {&mt2, &mapped};
    CHECK(cuPointerGetAttributes(2, (CUpointer_attribute *)attrs, outs, base));
    EXPECT(mt2 == CU_MEMORYTYPE_DEVICE && mapped == 1, "attributes %u %u", mt2, mapped);
    for (int i = 0; i < 2; i++) {
        CHECK(cuMemUnmap(base + i * gran, gran));
        CHECK(cuMemRelease(h[i]));
    }
    CHECK(cuMemAddressFree(base, 4 * gran));
    free(src);
    free(dst);
    printf("%s ok gran=%zu\n", name, gran);
}

static void pool_handle_types(void) {
    const char *name = "pool_handle_types";
    int v = -1;
    CHECK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MEMPOOL_SUPPORTED_HANDLE_TYPES, dev));
    EXPECT(v & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, "handle types %d", v);
    printf("%s ok types=%d\n", name, v);
}

static void graph_alloc_replay(void) {
    const char *name = "graph_alloc_replay";
    CUstream s;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
    CUdeviceptr tmp, kept;
    size_t len = 3 << 20;
    CHECK(cuMemAllocAsync(&tmp, len, s));
    CHECK(cuMemAllocAsync(&kept, len, s));
    CHECK(cuMemsetD8Async(tmp, 0x11, len, s));
    CHECK(launch_spin(s, 1000));
    CHECK(cuMemcpyDtoDAsync(kept, tmp, len, s));
    CHECK(cuMemsetD8Async(kept, 0x22, 16, s));
    CHECK(cuMemFreeAsync(tmp, s));
    CUgraph g;
    CHECK(cuStreamEndCapture(s, &g));
    CUgraphExec x;
    CHECK(cuGraphInstantiateWithFlags(&x, g, CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH));
    CHECK(cuGraphDestroy(g));
    unsigned char b[2];
    for (int i = 0; i < 3; i++) {
        CHECK(cuGraphLaunch(x, s));
        CHECK(cuStreamSynchronize(s));
        CHECK(cuMemcpyDtoH(&b[0], kept, 1));
        CHECK(cuMemcpyDtoH(&b[1], kept + len - 1, 1));
        EXPECT(b[0] == 0x22 && b[1] == 0x11, "replay %d: bytes %x %x", i, b[0], b[1]);
    }
    /* The kept allocation is the client's to free. */
    CHECK(cuMemFreeAsync(kept, s));
    CHECK(cuStreamSynchronize(s));
    CHECK(cuGraphExecDestroy(x));
    cuStreamDestroy(s);
    printf("%s ok replays=3\n", name);
}

static void managed_pool(void) {
    const char *name = "managed_pool";
    CUmemLocation loc;
    memset(&loc, 0, sizeof loc);
    loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
    loc.id = (int)dev;
    CUmemoryPool mp, mp_default, dp;
    CHECK(cuMemGetMemPool(&mp, &loc, CU_MEM_ALLOCATION_TYPE_MANAGED));
    CHECK(cuMemGetDefaultMemPool(&mp_default, &loc, CU_MEM_ALLOCATION_TYPE_MANAGED));
    CHECK(cuMemGetMemPool(&dp, &loc, CU_MEM_ALLOCATION_TYPE_PINNED));
    EXPECT(mp == mp_default && mp != dp, "managed pool %p default %p device %p", (void *)mp,
           (void *)mp_default, (void *)dp);
    CUstream s;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CUdeviceptr p;
    CHECK(cuMemAllocFromPoolAsync(&p, 1 << 20, mp, s));
    CHECK(cuStreamSynchronize(s));
    unsigned int managed = 0;
    CUmemoryPool owner = NULL;
    CHECK(cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, p));
    CHECK(cuPointerGetAttribute(&owner, CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, p));
    EXPECT(managed == 1 && owner == mp, "is_managed %u pool %p", managed, (void *)owner);
    /* Managed memory: the host reads and writes it directly. */
    ((volatile unsigned char *)(uintptr_t)p)[7] = 0x77;
    unsigned char b = 0;
    CHECK(cuMemcpyDtoH(&b, p + 7, 1));
    EXPECT(b == 0x77, "byte %x", b);
    CHECK(cuMemFreeAsync(p, s));
    /* A managed pool of one's own, made current for the device. */
    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = CU_MEM_ALLOCATION_TYPE_MANAGED;
    props.location = loc;
    CUmemoryPool mine;
    CHECK(cuMemPoolCreate(&mine, &props));
    CHECK(cuMemSetMemPool(&loc, CU_MEM_ALLOCATION_TYPE_MANAGED, mine));
    CUmemoryPool cur;
    CHECK(cuMemGetMemPool(&cur, &loc, CU_MEM_ALLOCATION_TYPE_MANAGED));
    EXPECT(cur == mine, "current managed pool");
    CUresult wrong = cuMemSetMemPool(&loc, CU_MEM_ALLOCATION_TYPE_PINNED, mine);
    EXPECT(wrong == CUDA_ERROR_INVALID_VALUE, "a managed pool as the device pool: %d", wrong);
    CHECK(cuMemAllocFromPoolAsync(&p, 4096, mine, s));
    CHECK(cuPointerGetAttribute(&managed, CU_POINTER_ATTRIBUTE_IS_MANAGED, p));
    EXPECT(managed == 1, "from my pool: is_managed %u", managed);
    CHECK(cuMemFreeAsync(p, s));
    CHECK(cuStreamSynchronize(s));
    CHECK(cuMemSetMemPool(&loc, CU_MEM_ALLOCATION_TYPE_MANAGED, mp));
    CHECK(cuMemPoolDestroy(mine));
    CUresult dd = cuMemPoolDestroy(mp);
    EXPECT(dd == CUDA_ERROR_INVALID_VALUE, "destroying the default managed pool: %d", dd);
    /* Graph allocations of managed memory: captured from the managed pool,
     * and a memory node of the managed type. */
    CHECK(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL));
    CHECK(cuMemAllocFromPoolAsync(&p, 1 << 20, mp, s));
    CUgraph g;
    CHECK(cuStreamEndCapture(s, &g));
    CUgraphNode nodes[2];
    size_t nn = 2;
    CHECK(cuGraphGetNodes(g, nodes, &nn));
    CUDA_MEM_ALLOC_NODE_PARAMS ap;
    memset(&ap, 0, sizeof ap);
    CHECK(cuGraphMemAllocNodeGetParams(nodes[0], &ap));
    EXPECT(nn == 1 && ap.poolProps.allocType == CU_MEM_ALLOCATION_TYPE_MANAGED && ap.dptr == p,
           "captured managed allocation: %zu nodes, type %d", nn, ap.poolProps.allocType);
    CUDA_MEM_ALLOC_NODE_PARAMS np;
    memset(&np, 0, sizeof np);
    np.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_MANAGED;
    np.poolProps.location = loc;
    np.bytesize = 4096;
    CUgraphNode an;
    CHECK(cuGraphAddMemAllocNode(&an, g, nodes, 1, &np));
    CUgraphExec x;
    CHECK(cuGraphInstantiate(&x, g, 0));
    CHECK(cuGraphLaunch(x, s));
    CHECK(cuStreamSynchronize(s));
    unsigned int m1 = 0, m2 = 0;
    CHECK(cuPointerGetAttribute(&m1, CU_POINTER_ATTRIBUTE_IS_MANAGED, p));
    CHECK(cuPointerGetAttribute(&m2, CU_POINTER_ATTRIBUTE_IS_MANAGED, np.dptr));
    EXPECT(m1 == 1 && m2 == 1, "graph managed memory: is_managed %u %u", m1, m2);
    CHECK(cuMemFreeAsync(p, s));
    CHECK(cuMemFreeAsync(np.dptr, s));
    CHECK(cuStreamSynchronize(s));
    CHECK(cuGraphExecDestroy(x));
    CHECK(cuGraphDestroy(g));
    cuStreamDestroy(s);
    printf("%s ok\n", name);
}

static volatile int destroyed;

static void CUDA_CB destroy_obj(void *data) {
    (void)data;
    __sync_fetch_and_add(&destroyed, 1);
}

static void user_objects(void) {
    const char *name = "user_objects";
    CUuserObject o;
    CHECK(cuUserObjectCreate(&o, NULL, destroy_obj, 1, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC));
    CUgraph g, copy, parent;
    CHECK(cuGraphCreate(&g, 0));
    CUgraphNode n;
    CHECK(cuGraphAddEmptyNode(&n, g, NULL, 0));
    /* The graph takes over the creator's reference. */
    CHECK(cuGraphRetainUserObject(g, o, 1, CU_GRAPH_USER_OBJECT_MOVE));
    CHECK(cuGraphClone(&copy, g));
    CHECK(cuGraphDestroy(g));
    CHECK(cuGraphCreate(&parent, 0));
    CHECK(cuGraphAddChildGraphNode(&n, parent, NULL, 0, copy));
    CHECK(cuGraphDestroy(copy));
    CUgraphExec x;
    CHECK(cuGraphInstantiate(&x, parent, 0));
    CHECK(cuGraphDestroy(parent));
    CHECK(cuGraphLaunch(x, 0));
    CHECK(cuCtxSynchronize());
    usleep(50000);
    EXPECT(destroyed == 0, "destroyed while an executable graph holds it");
    CHECK(cuGraphExecDestroy(x));
    for (int i = 0; i < 10000 && !destroyed; i++) usleep(1000);
    EXPECT(destroyed == 1, "destructor ran %d times", destroyed);
    printf("%s ok\n", name);
}

static volatile int ipc_gate;

static void CUDA_CB wait_gate(void *data) {
    (void)data;
    while (!ipc_gate) usleep(1000);
}

static void ipc_event_owner(void) {
    const char *name = "ipc_event_owner";
    CUstream s;
    CUevent ev;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CUresult timed = cuEventCreate(&ev, CU_EVENT_INTERPROCESS);
    EXPECT(timed == CUDA_ERROR_INVALID_VALUE, "interprocess with timing: %d", timed);
    CHECK(cuEventCreate(&ev, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING));
    CUevent plain;
    CHECK(cuEventCreate(&plain, CU_EVENT_DISABLE_TIMING));
    CUipcEventHandle h;
    CUresult r = cuIpcGetEventHandle(&h, plain);
    EXPECT(r == CUDA_ERROR_INVALID_VALUE, "handle of a plain event: %d", r);
    CHECK(cuLaunchHostFunc(s, wait_gate, NULL));
    CHECK(cuEventRecord(ev, s));
    CHECK(cuIpcGetEventHandle(&h, ev));
    printf("handle ");
    for (size_t i = 0; i < sizeof h.reserved; i++) printf("%02x", (unsigned char)h.reserved[i]);
    printf("\n");
    char line[64];
    if (!fgets(line, sizeof line, stdin)) {
        printf("%s FAIL no line on stdin\n", name);
        return;
    }
    ipc_gate = 1;
    CHECK(cuEventSynchronize(ev));
    printf("%s ok\n", name);
}

static void ipc_event_user(const char *hex) {
    const char *name = "ipc_event_user";
    CUipcEventHandle h;
    memset(&h, 0, sizeof h);
    for (size_t i = 0; i < sizeof h.reserved && hex[2 * i] && hex[2 * i + 1]; i++) {
        unsigned v;
        sscanf(hex + 2 * i, "%2x", &v);
        h.reserved[i] = (char)v;
    }
    CUevent ev, after;
    CHECK(cuIpcOpenEventHandle(&ev, h));
    CUstream s;
    CHECK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    CHECK(cuEventCreate(&after, CU_EVENT_DISABLE_TIMING));
    CHECK(cuStreamWaitEvent(s, ev, 0));
    CHECK(cuEventRecord(after, s));
    CUresult q1 = cuEventQuery(ev), q2 = cuEventQuery(after);
    EXPECT(q1 == CUDA_ERROR_NOT_READY && q2 == CUDA_ERROR_NOT_READY, "queries %d %d", q1, q2);
    printf("pending\n");
    CHECK(cuEventSynchronize(ev));
    CHECK(cuStreamSynchronize(s));
    CHECK(cuEventQuery(after));
    CHECK(cuEventDestroy(ev));
    printf("%s ok\n", name);
}

/* ---------------------------------------------------------- module_globals */

#define GLOBAL_MIB 64

static void module_globals(void) {
    const char *name = "module_globals";
    char text[512];
    snprintf(text, sizeof text,
             ".version 7.0\n.target sm_52\n.address_size 64\n"
             ".visible .global .align 4 .b8 big[%llu];\n"
             ".visible .global .align 4 .u32 small;\n"
             ".visible .entry k()\n{\n ret;\n}\n",
             (unsigned long long)GLOBAL_MIB << 20);
    size_t free0, free1, free2, free3, total;
    CHECK(cuMemGetInfo(&free0, &total));
    CUmodule m;
    CHECK(cuModuleLoadData(&m, text));
    CHECK(cuMemGetInfo(&free1, &total));
    EXPECT(free0 - free1 >= ((size_t)GLOBAL_MIB << 20), "load took %zu bytes", free0 - free1);
    CUdeviceptr big, small;
    size_t big_n, small_n;
    CHECK(cuModuleGetGlobal(&big, &big_n, m, "big"));
    CHECK(cuModuleGetGlobal(&small, &small_n, m, "small"));
    CHECK(cuMemGetInfo(&free2, &total));
    EXPECT(free2 == free1, "the look-ups took %zd bytes", (ssize_t)(free1 - free2));
    EXPECT(big_n == ((size_t)GLOBAL_MIB << 20) && small_n == 4, "sizes %zu %zu", big_n, small_n);
    CUdeviceptr again;
    CHECK(cuModuleGetGlobal(&again, NULL, m, "small"));
    EXPECT(again == small, "a second look-up moved the global");
    uint32_t zero = 7, v = 0xC0FFEE, back = 0;
    CHECK(cuMemcpyDtoH(&zero, small, 4));
    EXPECT(zero == 0, "a fresh global holds %u", zero);
    CHECK(cuMemcpyHtoD(small, &v, 4));
    CHECK(cuMemcpyDtoH(&back, small, 4));
    EXPECT(back == v, "read back %x", back);
    CUresult r = cuModuleGetGlobal(&again, NULL, m, "nope");
    EXPECT(r == CUDA_ERROR_NOT_FOUND, "unknown global: %d", r);
    CHECK(cuModuleUnload(m));
    CHECK(cuMemGetInfo(&free3, &total));
    EXPECT(free3 == free0, "unload gave back %zu of %zu", free3 - free1, free0 - free1);
    /* A library: the same at cuLibraryLoadData. */
    CUlibrary lib;
    CHECK(cuLibraryLoadData(&lib, text, NULL, NULL, 0, NULL, NULL, 0));
    CHECK(cuMemGetInfo(&free1, &total));
    EXPECT(free0 - free1 >= ((size_t)GLOBAL_MIB << 20), "library load took %zu", free0 - free1);
    CHECK(cuLibraryGetGlobal(&big, &big_n, lib, "big"));
    CHECK(cuMemGetInfo(&free2, &total));
    EXPECT(free2 == free1 && big_n == ((size_t)GLOBAL_MIB << 20), "library look-up took %zd",
           (ssize_t)(free1 - free2));
    CHECK(cuLibraryUnload(lib));
    CHECK(cuMemGetInfo(&free3, &total));
    EXPECT(free3 == free0, "library unload gave back %zu", free3 - free1);
    /* Globals larger than the device: refused at load. */
    snprintf(text, sizeof text,
             ".version 7.0\n.target sm_52\n.address_size 64\n"
             ".visible .global .align 4 .b8 huge[%zu];\n"
             ".visible .entry k()\n{\n ret;\n}\n",
             total + ((size_t)1 << 30));
    r = cuModuleLoadData(&m, text);
    EXPECT(r == CUDA_ERROR_OUT_OF_MEMORY, "a module larger than the device: %d", r);
    CHECK(cuMemGetInfo(&free3, &total));
    EXPECT(free3 == free0, "the refused load kept %zu", free0 - free3);
    printf("%s ok load_mib=%zu\n", name, (free0 - free1) >> 20);
}

/* ------------------------------------------------------------ graph_update */

static void CUDA_CB bump(void *data) { (*(volatile int *)data)++; }

static volatile int released[2];
static void CUDA_CB release_obj(void *data) { released[(intptr_t)data]++; }

/* A host node (bumping *counter), then two kernels after it; `c_dep`: 0 for
 * C after A, 1 for C after B, -1 for C with no dependency; `b_memset`: B is a
 * memset node instead of a kernel; `extra`: a fourth node. */
static CUresult build(CUgraph *g, CUgraphNode nodes[4], volatile int *counter, int c_dep,
                      int b_memset, int extra, CUdeviceptr buf) {
    CUresult r;
    if ((r = cuGraphCreate(g, 0))) return r;
    CUDA_HOST_NODE_PARAMS h = {bump, (void *)counter};
    if ((r = cuGraphAddHostNode(&nodes[0], *g, NULL, 0, &h))) return r;
    static uint64_t ns = 1000;
    static void *args[] = {&ns};
    CUDA_KERNEL_NODE_PARAMS k;
    memset(&k, 0, sizeof k);
    k.func = spin;
    k.gridDimX = k.gridDimY = k.gridDimZ = 1;
    k.blockDimX = k.blockDimY = k.blockDimZ = 1;
    k.kernelParams = args;
    if (b_memset) {
        CUDA_MEMSET_NODE_PARAMS m = {buf, 0, 0, 4, 1, 1};
        r = cuGraphAddMemsetNode(&nodes[1], *g, &nodes[0], 1, &m, ctx);
    } else {
        r = cuGraphAddKernelNode(&nodes[1], *g, &nodes[0], 1, &k);
    }
    if (r) return r;
    if (c_dep < 0) r = cuGraphAddKernelNode(&nodes[2], *g, NULL, 0, &k);
    else r = cuGraphAddKernelNode(&nodes[2], *g, &nodes[c_dep], 1, &k);
    if (r) return r;
    if (extra) r = cuGraphAddEmptyNode(&nodes[3], *g, &nodes[2], 1);
    return r;
}

static void graph_update(void) {
    const char *name = "graph_update";
    static volatile int c0, c1;
    CUdeviceptr buf;
    CHECK(cuMemAlloc(&buf, 1 << 16));
    CUgraph g0, g;
    CUgraphNode n0[4], n[4];
    CHECK(build(&g0, n0, &c0, 0, 0, 0, buf));
    CUuserObject o0, o1;
    CHECK(cuUserObjectCreate(&o0, (void *)0, release_obj, 1, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC));
    CHECK(cuGraphRetainUserObject(g0, o0, 1, CU_GRAPH_USER_OBJECT_MOVE));
    CUgraphExec e;
    CHECK(cuGraphInstantiate(&e, g0, 0));
    CHECK(cuGraphLaunch(e, 0));
    CHECK(cuCtxSynchronize());
    EXPECT(c0 == 1 && c1 == 0, "first launch bumped %d %d", c0, c1);
    CUgraphExecUpdateResultInfo info;
    CUresult r;
    /* One node more: topology changed, no error node. */
    CHECK(build(&g, n, &c1, 0, 0, 1, buf));
    r = cuGraphExecUpdate(e, g, &info);
    EXPECT(r == CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE &&
               info.result == CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED && !info.errorNode &&
               !info.errorFromNode,
           "extra node: %d result %d node %p", r, info.result, (void *)info.errorNode);
    CHECK(cuGraphDestroy(g));
    /* C without its dependency: the error node is C. */
    CHECK(build(&g, n, &c1, -1, 0, 0, buf));
    r = cuGraphExecUpdate(e, g, &info);
    EXPECT(r == CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE &&
               info.result == CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED &&
               info.errorNode == n[2] && !info.errorFromNode,
           "dependency count: %d result %d", r, info.result);
    CHECK(cuGraphDestroy(g));
    /* C after B instead of A: error node C, from node B. */
    CHECK(build(&g, n, &c1, 1, 0, 0, buf));
    r = cuGraphExecUpdate(e, g, &info);
    EXPECT(r == CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE &&
               info.result == CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED &&
               info.errorNode == n[2] && info.errorFromNode == n[1],
           "other dependency: %d result %d node %d from %d", r, info.result,
           info.errorNode == n[2], info.errorFromNode == n[1]);
    CHECK(cuGraphDestroy(g));
    /* B a memset instead of a kernel: node type changed, error node B. */
    CHECK(build(&g, n, &c1, 0, 1, 0, buf));
    r = cuGraphExecUpdate(e, g, &info);
    EXPECT(r == CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE &&
               info.result == CU_GRAPH_EXEC_UPDATE_ERROR_NODE_TYPE_CHANGED &&
               info.errorNode == n[1] && !info.errorFromNode,
           "type: %d result %d", r, info.result);
    CHECK(cuGraphDestroy(g));
    /* The refused updates changed nothing. */
    CHECK(cuGraphLaunch(e, 0));
    CHECK(cuCtxSynchronize());
    EXPECT(c0 == 2 && c1 == 0, "after refused updates %d %d", c0, c1);
    /* A 2D memset may change its address and value, not its shape. */
    CUgraph m0, m1;
    CUgraphNode mn0, mn1;
    CUDA_MEMSET_NODE_PARAMS ms = {buf, 256, 0, 4, 16, 4};
    CHECK(cuGraphCreate(&m0, 0));
    CHECK(cuGraphAddMemsetNode(&mn0, m0, NULL, 0, &ms, ctx));
    CUgraphExec me;
    CHECK(cuGraphInstantiate(&me, m0, 0));
    ms.value = 7;
    ms.height = 8;
    CHECK(cuGraphCreate(&m1, 0));
    CHECK(cuGraphAddMemsetNode(&mn1, m1, NULL, 0, &ms, ctx));
    r = cuGraphExecUpdate(me, m1, &info);
    EXPECT(r == CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE &&
               info.result == CU_GRAPH_EXEC_UPDATE_ERROR_PARAMETERS_CHANGED &&
               info.errorNode == mn1,
           "2D memset shape: %d result %d", r, info.result);
    ms.height = 4;
    CHECK(cuMemsetD8(buf, 0, 1 << 16));
    CHECK(cuGraphMemsetNodeSetParams(mn1, &ms));
    CHECK(cuGraphExecUpdate(me, m1, &info));
    EXPECT(info.result == CU_GRAPH_EXEC_UPDATE_SUCCESS, "memset value: %d", info.result);
    CHECK(cuGraphLaunch(me, 0));
    CHECK(cuCtxSynchronize());
    uint32_t w = 0;
    CHECK(cuMemcpyDtoH(&w, buf + 256 * 3, 4));
    EXPECT(w == 7, "updated memset wrote %u", w);
    CHECK(cuGraphExecDestroy(me));
    CHECK(cuGraphDestroy(m0));
    CHECK(cuGraphDestroy(m1));
    /* The same shape: updated, the host node now bumps c1, and the exec holds
     * the new graph's user objects instead of the old ones. */
    CHECK(build(&g, n, &c1, 0, 0, 0, buf));
    CHECK(cuUserObjectCreate(&o1, (void *)1, release_obj, 1, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC));
    CHECK(cuGraphRetainUserObject(g, o1, 1, CU_GRAPH_USER_OBJECT_MOVE));
    memset(&info, 0xff, sizeof info);
    CHECK(cuGraphExecUpdate(e, g, &info));
    EXPECT(info.result == CU_GRAPH_EXEC_UPDATE_SUCCESS && !info.errorNode && !info.errorFromNode,
           "update: result %d", info.result);
    CHECK(cuGraphDestroy(g0));
    CHECK(cuGraphDestroy(g));
    for (int i = 0; i < 10000 && !released[0]; i++) usleep(1000);
    EXPECT(released[0] == 1 && released[1] == 0, "released %d %d after the update",
           released[0], released[1]);
    CHECK(cuGraphLaunch(e, 0));
    CHECK(cuCtxSynchronize());
    EXPECT(c0 == 2 && c1 == 1, "after the update %d %d", c0, c1);
    CHECK(cuGraphExecDestroy(e));
    for (int i = 0; i < 10000 && !released[1]; i++) usleep(1000);
    EXPECT(released[1] == 1, "the new graph's object released %d", released[1]);
    CHECK(cuMemFree(buf));
    printf("%s ok\n", name);
}

/* ------------------------------------------------------- graph_mem_destroy */

static void graph_mem_destroy(void) {
    const char *name = "graph_mem_destroy";
    static volatile int c;
    CUgraph g;
    CHECK(cuGraphCreate(&g, 0));
    CUDA_MEM_ALLOC_NODE_PARAMS a;
    memset(&a, 0, sizeof a);
    a.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    a.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    a.poolProps.location.id = dev;
    a.bytesize = 4;
    CUgraphNode alloc, host, empty;
    CHECK(cuGraphAddMemAllocNode(&alloc, g, NULL, 0, &a));
    CUDA_HOST_NODE_PARAMS h = {bump, (void *)&c};
    CHECK(cuGraphAddHostNode(&host, g, &alloc, 1, &h));
    CHECK(cuGraphAddEmptyNode(&empty, g, NULL, 0));
    CUresult r = cuGraphDestroyNode(host);
    EXPECT(r == CUDA_ERROR_NOT_SUPPORTED, "destroy of a node: %d", r);
    r = cuGraphDestroyNode(empty);
    EXPECT(r == CUDA_ERROR_NOT_SUPPORTED, "destroy of an unconnected node: %d", r);
    r = cuGraphRemoveDependencies(g, &alloc, &host, NULL, 1);
    EXPECT(r == CUDA_ERROR_NOT_SUPPORTED, "removal of an edge: %d", r);
    size_t count = 0;
    CHECK(cuGraphGetNodes(g, NULL, &count));
    EXPECT(count == 3, "%zu nodes left", count);
    CUgraphNode from[4], to[4];
    size_t edges = 4;
    CHECK(cuGraphGetEdges(g, from, to, NULL, &edges));
    EXPECT(edges == 1 && from[0] == alloc && to[0] == host, "%zu edges", edges);
    CUgraphExec e;
    CHECK(cuGraphInstantiate(&e, g, CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH));
    CHECK(cuGraphLaunch(e, 0));
    CHECK(cuCtxSynchronize());
    EXPECT(c == 1, "the kept host node ran %d times", c);
    CHECK(cuGraphExecDestroy(e));
    CHECK(cuGraphDestroy(g));
    /* Without memory nodes the same destroy succeeds. */
    CHECK(cuGraphCreate(&g, 0));
    CHECK(cuGraphAddEmptyNode(&empty, g, NULL, 0));
    CHECK(cuGraphAddHostNode(&host, g, &empty, 1, &h));
    CHECK(cuGraphDestroyNode(host));
    CHECK(cuGraphGetNodes(g, NULL, &count));
    EXPECT(count == 1, "%zu nodes after a destroy", count);
    CHECK(cuGraphDestroy(g));
    printf("%s ok\n", name);
}

/* -------------------------------------------------------------- child_move */

static void child_move(void) {
    const char *name = "child_move";
    static volatile int c;
    CUgraph child, parent, other;
    CHECK(cuGraphCreate(&child, 0));
    CUDA_MEM_ALLOC_NODE_PARAMS a;
    memset(&a, 0, sizeof a);
    a.poolProps.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
    a.poolProps.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    a.poolProps.location.id = dev;
    a.bytesize = 1 << 20;
    CUgraphNode alloc, host, fr;
    CHECK(cuGraphAddMemAllocNode(&alloc, child, NULL, 0, &a));
    CUDA_HOST_NODE_PARAMS h = {bump, (void *)&c};
    CHECK(cuGraphAddHostNode(&host, child, &alloc, 1, &h));
    CHECK(cuGraphAddMemFreeNode(&fr, child, &host, 1, a.dptr));
    CHECK(cuGraphCreate(&parent, 0));
    CUgraphNodeParams p;
    memset(&p, 0, sizeof p);
    p.type = CU_GRAPH_NODE_TYPE_GRAPH;
    p.graph.graph = child;
    p.graph.ownership = CU_GRAPH_CHILD_GRAPH_OWNERSHIP_CLONE;
    CUgraphNode n, n2, empty;
    CUresult r = cuGraphAddNode(&n, parent, NULL, NULL, 0, &p);
    EXPECT(r == CUDA_ERROR_NOT_SUPPORTED, "cloned in with memory nodes: %d", r);
    r = cuGraphAddChildGraphNode(&n, parent, NULL, 0, child);
    EXPECT(r == CUDA_ERROR_NOT_SUPPORTED, "cuGraphAddChildGraphNode with memory nodes: %d", r);
    p.graph.ownership = (CUgraphChildGraphNodeOwnership)7;
    r = cuGraphAddNode(&n, parent, NULL, NULL, 0, &p);
    EXPECT(r == CUDA_ERROR_INVALID_VALUE, "ownership 7: %d", r);
    p.graph.ownership = CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE;
    CHECK(cuGraphAddNode(&n, parent, NULL, NULL, 0, &p));
    CUgraph held;
    CHECK(cuGraphChildGraphNodeGetGraph(n, &held));
    EXPECT(held == child, "the node holds another graph");
    CUgraphNodeParams q;
    memset(&q, 0, sizeof q);
    CHECK(cuGraphNodeGetParams(n, &q));
    EXPECT(q.type == CU_GRAPH_NODE_TYPE_GRAPH && q.graph.graph == child &&
               q.graph.ownership == CU_GRAPH_CHILD_GRAPH_OWNERSHIP_INVALID,
           "params type %d ownership %d", q.type, q.graph.ownership);
    /* The moved graph is the parent's now. */
    CUgraphExec x;
    r = cuGraphInstantiate(&x, child, 0);
    EXPECT(r == CUDA_ERROR_INVALID_VALUE, "instantiate the moved graph: %d", r);
    r = cuGraphDestroy(child);
    EXPECT(r == CUDA_ERROR_INVALID_VALUE, "destroy the moved graph: %d", r);
    CHECK(cuGraphCreate(&other, 0));
    r = cuGraphAddNode(&n2, other, NULL, NULL, 0, &p);
    EXPECT(r == CUDA_ERROR_INVALID_VALUE, "moved again: %d", r);
    CUgraphNode extra;
    r = cuGraphAddMemAllocNode(&extra, child, NULL, 0, &a);
    EXPECT(r == CUDA_ERROR_INVALID_VALUE, "a memory node added to the moved graph: %d", r);
    CHECK(cuGraphDestroy(other));
    /* The parent now holds memory nodes: its nodes stay. */
    CHECK(cuGraphAddEmptyNode(&empty, parent, &n, 1));
    r = cuGraphDestroyNode(empty);
    EXPECT(r == CUDA_ERROR_NOT_SUPPORTED, "destroy in the parent: %d", r);
    /* It runs: the child's allocation, host node and free, at every launch. */
    CHECK(cuGraphInstantiate(&x, parent, 0));
    CHECK(cuGraphLaunch(x, 0));
    CHECK(cuGraphLaunch(x, 0));
    CHECK(cuCtxSynchronize());
    EXPECT(c == 2, "host node of the moved graph ran %d times", c);
    CHECK(cuGraphExecDestroy(x));
    CHECK(cuGraphDestroy(parent));
    printf("%s ok\n", name);
}

int main(int argc, char **argv) {
    const char *name = "init";
    setvbuf(stdout, NULL, _IONBF, 0);
    if (cuInit(0) || cuDeviceGet(&dev, 0) || cuDevicePrimaryCtxRetain(&ctx, dev) ||
        cuCtxSetCurrent(ctx) || cuModuleLoadData(&mod, ptx) ||
        cuModuleGetFunction(&spin, mod, "cgpu_sim_spin")) {
        printf("%s FAIL\n", name);
        return 1;
    }
    for (int i = 1; i < argc; i++) {
        const char *c = argv[i];
        if (!strcmp(c, "capture_info")) capture_info();
        else if (!strcmp(c, "cond_params")) cond_params();
        else if (!strcmp(c, "host_order")) host_order();
        else if (!strcmp(c, "host_capture")) host_capture();
        else if (!strcmp(c, "kernel_node_kern")) kernel_node_kern();
        else if (!strcmp(c, "vmm_span")) vmm_span();
        else if (!strcmp(c, "pool_handle_types")) pool_handle_types();
        else if (!strcmp(c, "graph_alloc_replay")) graph_alloc_replay();
        else if (!strcmp(c, "ipc_event_owner")) ipc_event_owner();
        else if (!strcmp(c, "user_objects")) user_objects();
        else if (!strcmp(c, "managed_pool")) managed_pool();
        else if (!strcmp(c, "module_globals")) module_globals();
        else if (!strcmp(c, "graph_update")) graph_update();
        else if (!strcmp(c, "graph_mem_destroy")) graph_mem_destroy();
        else if (!strcmp(c, "child_move")) child_move();
        else if (!strcmp(c, "ipc_event_user") && i + 1 < argc) ipc_event_user(argv[++i]);
        else {
            fprintf(stderr, "usage: driver_gaps CHECK...\n");
            return 2;
        }
    }
    return 0;
}
