"""Unmodified NVIDIA cuda-bindings on the simulated driver: graphs (memory
nodes, node kinds, queries, ids, user objects, conditionals, capture joins),
pools and pointers, occupancy, 3D copies, arrays, textures, error strings.

Prints one JSON object: each section's results, or "error: ..." for a
section that raised. shim/tests/coverage.rs checks it.
Usage: python coverage_client.py
"""
import ctypes
import json
import os
import sys
import time

from cuda.bindings import driver as d

PTX = b""".version 7.0
.target sm_52
.address_size 64
.visible .entry cgpu_sim_spin(.param .u64 ns)
{
  ret;
}
"""
MIB = 1 << 20


def ok(res, what=""):
    err = res[0]
    if err != d.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{what}: {err!r}")
    if len(res) == 1:
        return None
    return res[1] if len(res) == 2 else res[1:]


out = {}
ok(d.cuInit(0))
dev = ok(d.cuDeviceGet(0))
ctx = ok(d.cuDevicePrimaryCtxRetain(dev))
ok(d.cuCtxSetCurrent(ctx))
stream = ok(d.cuStreamCreate(0))
mod = ok(d.cuModuleLoadData(PTX))
spin = ok(d.cuModuleGetFunction(mod, b"cgpu_sim_spin"))


def section(name):
    def wrap(f):
        try:
            out[name] = f()
        except Exception as e:  # noqa: BLE001 - reported to the test
            out[name] = f"error: {e}"
        return f

    return wrap


def free_bytes():
    return int(ok(d.cuMemGetInfo())[0])


def graph_mem(attr):
    v = ok(d.cuDeviceGetGraphMemAttribute(dev, attr), "cuDeviceGetGraphMemAttribute")
    return int(v)


A = d.CUgraphMem_attribute


@section("graph_mem")
def _():
    r = {}
    g = ok(d.cuGraphCreate(0))
    p = d.CUDA_MEM_ALLOC_NODE_PARAMS()
    p.poolProps.allocType = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    p.poolProps.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    p.poolProps.location.id = 0
    p.bytesize = 64 * MIB
    free0 = free_bytes()
    alloc = ok(d.cuGraphAddMemAllocNode(g, None, 0, p), "cuGraphAddMemAllocNode")
    ptr = int(p.dptr)
    r["dptr_set"] = ptr != 0
    r["free_after_add"] = free0 - free_bytes()
    ms = d.CUDA_MEMSET_NODE_PARAMS()
    ms.dst = ptr
    ms.value = 0x5A
    ms.elementSize = 1
    ms.width = 4096
    ms.height = 1
    ms.pitch = 0
    mset = ok(d.cuGraphAddMemsetNode(g, [alloc], 1, ms, ctx), "cuGraphAddMemsetNode")
    r["alloc_params_bytes"] = int(ok(d.cuGraphMemAllocNodeGetParams(alloc)).bytesize)
    ex = ok(d.cuGraphInstantiate(g, 0), "cuGraphInstantiate")
    ok(d.cuGraphLaunch(ex, stream), "cuGraphLaunch")
    ok(d.cuStreamSynchronize(stream))
    r["held_after_launch"] = free0 - free_bytes()
    r["used_current"] = graph_mem(A.CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT)
    r["reserved_current"] = graph_mem(A.CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT)
    buf = bytearray(16)
    ok(d.cuMemcpyDtoH(buf, ptr + 100, 16), "cuMemcpyDtoH")
    r["memset_bytes"] = list(buf[:4])
    # Launching again before freeing is refused (the allocation is live).
    r["relaunch_live"] = d.cuGraphLaunch(ex, stream)[0].name
    ok(d.cuMemFreeAsync(ptr, stream), "cuMemFreeAsync")
    ok(d.cuStreamSynchronize(stream))
    r["used_after_free"] = graph_mem(A.CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT)
    r["reserved_after_free"] = graph_mem(A.CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT)
    r["held_after_free"] = free0 - free_bytes()
    # A second graph with alloc + free nodes reuses the reserve.
    g2 = ok(d.cuGraphCreate(0))
    p2 = d.CUDA_MEM_ALLOC_NODE_PARAMS()
    p2.poolProps.allocType = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    p2.poolProps.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    p2.poolProps.location.id = 0
    p2.bytesize = 32 * MIB
    a2 = ok(d.cuGraphAddMemAllocNode(g2, None, 0, p2))
    f2 = ok(d.cuGraphAddMemFreeNode(g2, [a2], 1, p2.dptr), "cuGraphAddMemFreeNode")
    r["free_node_ptr_ok"] = int(ok(d.cuGraphMemFreeNodeGetParams(f2))) == int(p2.dptr)
    ex2 = ok(d.cuGraphInstantiate(g2, 0))
    for _ in range(3):
        ok(d.cuGraphLaunch(ex2, stream))
    ok(d.cuStreamSynchronize(stream))
    r["reserved_after_reuse"] = graph_mem(A.CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT)
    r["used_high"] = graph_mem(A.CU_GRAPH_MEM_ATTR_USED_MEM_HIGH)
    ok(d.cuDeviceGraphMemTrim(dev), "cuDeviceGraphMemTrim")
    r["reserved_after_trim"] = graph_mem(A.CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT)
    r["held_after_trim"] = free0 - free_bytes()
    ok(d.cuDeviceSetGraphMemAttribute(dev, A.CU_GRAPH_MEM_ATTR_USED_MEM_HIGH, d.cuuint64_t(0)))
    r["used_high_reset"] = graph_mem(A.CU_GRAPH_MEM_ATTR_USED_MEM_HIGH)
    # One executable at a time for a graph with memory nodes; no clones.
    r["second_exec"] = d.cuGraphInstantiate(g2, 0)[0].name
    r["clone_mem_graph"] = d.cuGraphClone(g2)[0].name
    # Auto-free on launch: relaunching frees the previous allocation.
    ok(d.cuGraphExecDestroy(ex))
    ex3 = ok(d.cuGraphInstantiate(g, d.CUgraphInstantiate_flags.CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH))
    ok(d.cuGraphLaunch(ex3, stream))
    r["auto_free_relaunch"] = d.cuGraphLaunch(ex3, stream)[0].name
    ok(d.cuStreamSynchronize(stream))
    r["auto_free_used"] = graph_mem(A.CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT)
    ok(d.cuMemFree(p.dptr))
    ex = ex3
    # Stream-ordered allocation inside a capture: a memory alloc node (the
    # address now, the memory at launch) and a free node.
    cs = ok(d.cuStreamCreate(0))
    ok(d.cuStreamBeginCapture(cs, d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL))
    before = free_bytes()
    cp = ok(d.cuMemAllocAsync(16 * MIB, cs), "cuMemAllocAsync(captured)")
    r["captured_alloc_held_before_launch"] = before - free_bytes()
    r["captured_ptr_type"] = int(ok(d.cuPointerGetAttribute(d.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE, cp)))
    ok(d.cuMemsetD8Async(cp, 7, 1024, cs))
    ok(d.cuMemFreeAsync(cp, cs), "cuMemFreeAsync(captured)")
    cg = ok(d.cuStreamEndCapture(cs))
    kinds = [ok(d.cuGraphNodeGetType(n)).name for n in ok(d.cuGraphGetNodes(cg, 8))[0] if n is not None and int(n) != 0]
    r["captured_kinds"] = kinds
    cex = ok(d.cuGraphInstantiate(cg, 0))
    ok(d.cuGraphLaunch(cex, cs))
    ok(d.cuStreamSynchronize(cs))
    r["captured_reserved_after_launch"] = graph_mem(A.CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT)
    r["captured_used_after_launch"] = graph_mem(A.CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT)
    ok(d.cuGraphExecDestroy(cex))
    ok(d.cuDeviceGraphMemTrim(dev))
    for x in (ex, ex2):
        ok(d.cuGraphExecDestroy(x))
    for x in (g, g2):
        ok(d.cuGraphDestroy(x))
    return r


@section("graph_structure")
def _():
    r = {}
    g = ok(d.cuGraphCreate(0))
    a = ok(d.cuGraphAddEmptyNode(g, None, 0))
    b = ok(d.cuGraphAddEmptyNode(g, [a], 1))
    c = ok(d.cuGraphAddEmptyNode(g, [a], 1))
    e = ok(d.cuGraphAddEmptyNode(g, [b, c], 2))
    _, n = ok(d.cuGraphGetNodes(g))
    r["nodes"] = int(n)
    nodes, n = ok(d.cuGraphGetNodes(g, n))
    r["nodes_listed"] = len(nodes)
    r["roots"] = int(ok(d.cuGraphGetRootNodes(g, 4))[-1])
    res = ok(d.cuGraphGetEdges(g, 8), "cuGraphGetEdges")
    r["edges"] = int(res[-1])
    res = ok(d.cuGraphNodeGetDependencies(e, 4), "cuGraphNodeGetDependencies")
    r["deps_of_last"] = int(res[-1])
    res = ok(d.cuGraphNodeGetDependentNodes(a, 4), "cuGraphNodeGetDependentNodes")
    r["dependents_of_first"] = int(res[-1])
    ok(d.cuGraphAddDependencies(g, [b], [c], None, 1), "cuGraphAddDependencies")
    r["deps_of_c"] = int(ok(d.cuGraphNodeGetDependencies(c, 4))[-1])
    ok(d.cuGraphRemoveDependencies(g, [b], [c], None, 1), "cuGraphRemoveDependencies")
    ok(d.cuGraphDestroyNode(b), "cuGraphDestroyNode")
    r["nodes_after_destroy"] = int(ok(d.cuGraphGetNodes(g))[-1])
    r["deps_of_last_after"] = int(ok(d.cuGraphNodeGetDependencies(e, 4))[-1])
    r["type_empty"] = ok(d.cuGraphNodeGetType(e)).name
    ids = {int(ok(d.cuGraphGetId(g), "cuGraphGetId"))}
    g2 = ok(d.cuGraphCreate(0))
    ids.add(int(ok(d.cuGraphGetId(g2))))
    r["distinct_graph_ids"] = len(ids)
    ex = ok(d.cuGraphInstantiate(g, 0))
    ex2 = ok(d.cuGraphInstantiate(g, 0))
    r["distinct_exec_ids"] = int(ok(d.cuGraphExecGetId(ex))) != int(ok(d.cuGraphExecGetId(ex2)))
    r["local_ids_differ"] = int(ok(d.cuGraphNodeGetLocalId(a))) != int(ok(d.cuGraphNodeGetLocalId(e)))
    r["containing_graph"] = int(ok(d.cuGraphNodeGetContainingGraph(a))) == int(g)
    clone = ok(d.cuGraphClone(g), "cuGraphClone")
    r["clone_nodes"] = int(ok(d.cuGraphGetNodes(clone))[-1])
    found = ok(d.cuGraphNodeFindInClone(e, clone), "cuGraphNodeFindInClone")
    r["clone_node_type"] = ok(d.cuGraphNodeGetType(found)).name
    # Child graph with a kernel; the parent runs it.
    child = ok(d.cuGraphCreate(0))
    kp = d.CUDA_KERNEL_NODE_PARAMS()
    kp.func = spin
    kp.gridDimX = kp.gridDimY = kp.gridDimZ = 1
    kp.blockDimX = kp.blockDimY = kp.blockDimZ = 1
    ns = ctypes.c_uint64(2_000_000)
    kp.kernelParams = ((ns,), (ctypes.c_uint64,))
    ok(d.cuGraphAddKernelNode(child, None, 0, kp), "cuGraphAddKernelNode")
    parent = ok(d.cuGraphCreate(0))
    cn = ok(d.cuGraphAddChildGraphNode(parent, None, 0, child), "cuGraphAddChildGraphNode")
    r["child_type"] = ok(d.cuGraphNodeGetType(cn)).name
    inner = ok(d.cuGraphChildGraphNodeGetGraph(cn))
    r["child_inner_nodes"] = int(ok(d.cuGraphGetNodes(inner))[-1])
    pex = ok(d.cuGraphInstantiate(parent, 0))
    ev0, ev1 = ok(d.cuEventCreate(0)), ok(d.cuEventCreate(0))
    ok(d.cuEventRecord(ev0, stream))
    ok(d.cuGraphLaunch(pex, stream))
    ok(d.cuEventRecord(ev1, stream))
    ok(d.cuEventSynchronize(ev1))
    r["child_ms"] = ok(d.cuEventElapsedTime(ev0, ev1))
    # Disabled node: the kernel does not run.
    kn = ok(d.cuGraphGetNodes(child, 1))[0][0]
    cex = ok(d.cuGraphInstantiate(child, 0))
    ok(d.cuGraphNodeSetEnabled(cex, kn, 0), "cuGraphNodeSetEnabled")
    r["enabled_after"] = int(ok(d.cuGraphNodeGetEnabled(cex, kn)))
    ok(d.cuEventRecord(ev0, stream))
    ok(d.cuGraphLaunch(cex, stream))
    ok(d.cuEventRecord(ev1, stream))
    ok(d.cuEventSynchronize(ev1))
    r["disabled_ms"] = ok(d.cuEventElapsedTime(ev0, ev1))
    # InstantiateWithParams and AddNode (generic).
    ip = d.CUDA_GRAPH_INSTANTIATE_PARAMS()
    ip.flags = 0
    ok(d.cuGraphInstantiateWithParams(parent, ip), "cuGraphInstantiateWithParams")
    r["instantiate_result"] = ip.result_out.name
    np_ = d.CUgraphNodeParams()
    np_.type = d.CUgraphNodeType.CU_GRAPH_NODE_TYPE_EMPTY
    ok(d.cuGraphAddNode(g, None, None, 0, np_), "cuGraphAddNode")
    r["nodes_after_addnode"] = int(ok(d.cuGraphGetNodes(g))[-1])
    return r


@section("host_and_events")
def _():
    r = {}
    hits = []
    cb_type = ctypes.CFUNCTYPE(None, ctypes.c_void_p)

    def cb(_):
        hits.append(1)

    cfn = cb_type(cb)
    g = ok(d.cuGraphCreate(0))
    hp = d.CUDA_HOST_NODE_PARAMS()
    hp.fn = ctypes.cast(cfn, ctypes.c_void_p).value
    hp.userData = 0
    ok(d.cuGraphAddHostNode(g, None, 0, hp), "cuGraphAddHostNode")
    ev = ok(d.cuEventCreate(0))
    ok(d.cuGraphAddEventRecordNode(g, None, 0, ev), "cuGraphAddEventRecordNode")
    ex = ok(d.cuGraphInstantiate(g, 0))
    ok(d.cuGraphLaunch(ex, stream))
    ok(d.cuGraphLaunch(ex, stream))
    ok(d.cuStreamSynchronize(stream))
    deadline = time.time() + 5
    while len(hits) < 2 and time.time() < deadline:
        time.sleep(0.01)
    r["host_calls"] = len(hits)
    r["event_recorded"] = d.cuEventQuery(ev)[0].name
    # User objects: the destructor runs when the graph and the exec let go.
    dtor_hits = []
    dfn = cb_type(lambda _: dtor_hits.append(1))
    uo = ok(d.cuUserObjectCreate(0, ctypes.cast(dfn, ctypes.c_void_p).value, 1, 1), "cuUserObjectCreate")
    g2 = ok(d.cuGraphCreate(0))
    ok(d.cuGraphRetainUserObject(g2, uo, 1, 1), "cuGraphRetainUserObject")  # moves our ref
    ex2 = ok(d.cuGraphInstantiate(g2, 0))
    ok(d.cuGraphDestroy(g2))
    time.sleep(0.2)
    r["dtor_before_exec_destroy"] = len(dtor_hits)
    ok(d.cuGraphExecDestroy(ex2))
    deadline = time.time() + 5
    while not dtor_hits and time.time() < deadline:
        time.sleep(0.01)
    r["dtor_after"] = len(dtor_hits)
    return r


@section("conditional")
def _():
    r = {}
    g = ok(d.cuGraphCreate(0))
    h = ok(d.cuGraphConditionalHandleCreate(g, ctx, 1, 1), "cuGraphConditionalHandleCreate")
    np_ = d.CUgraphNodeParams()
    np_.type = d.CUgraphNodeType.CU_GRAPH_NODE_TYPE_CONDITIONAL
    np_.conditional.handle = h
    np_.conditional.type = d.CUgraphConditionalNodeType.CU_GRAPH_COND_TYPE_IF
    np_.conditional.size = 1
    np_.conditional.ctx = ctx
    node = ok(d.cuGraphAddNode(g, None, None, 0, np_), "cuGraphAddNode(conditional)")
    body = np_.conditional.phGraph_out[0]
    kp = d.CUDA_KERNEL_NODE_PARAMS()
    kp.func = spin
    kp.gridDimX = kp.gridDimY = kp.gridDimZ = 1
    kp.blockDimX = kp.blockDimY = kp.blockDimZ = 1
    ns = ctypes.c_uint64(3_000_000)
    kp.kernelParams = ((ns,), (ctypes.c_uint64,))
    ok(d.cuGraphAddKernelNode(body, None, 0, kp))
    r["type"] = ok(d.cuGraphNodeGetType(node)).name
    ex = ok(d.cuGraphInstantiate(g, 0))
    ev0, ev1 = ok(d.cuEventCreate(0)), ok(d.cuEventCreate(0))
    ok(d.cuEventRecord(ev0, stream))
    ok(d.cuGraphLaunch(ex, stream))
    ok(d.cuEventRecord(ev1, stream))
    ok(d.cuEventSynchronize(ev1))
    r["if_true_ms"] = ok(d.cuEventElapsedTime(ev0, ev1))
    return r


@section("capture_join")
def _():
    r = {}
    s1, s2 = ok(d.cuStreamCreate(0)), ok(d.cuStreamCreate(0))
    fork, join = ok(d.cuEventCreate(0)), ok(d.cuEventCreate(0))
    ns = ctypes.c_uint64(1_000_000)
    args = ((ns,), (ctypes.c_uint64,))
    ok(d.cuStreamBeginCapture(s1, d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL))
    ok(d.cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, s1, args, 0))
    ok(d.cuEventRecord(fork, s1))
    ok(d.cuStreamWaitEvent(s2, fork, 0), "cuStreamWaitEvent(fork)")
    r["s2_capturing"] = ok(d.cuStreamIsCapturing(s2)).name
    ok(d.cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, s2, args, 0))
    ok(d.cuEventRecord(join, s2))
    ok(d.cuStreamWaitEvent(s1, join, 0), "cuStreamWaitEvent(join)")
    ok(d.cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, s1, args, 0))
    g = ok(d.cuStreamEndCapture(s1), "cuStreamEndCapture")
    r["s2_after_end"] = ok(d.cuStreamIsCapturing(s2)).name
    r["nodes"] = int(ok(d.cuGraphGetNodes(g))[-1])
    r["edges"] = int(ok(d.cuGraphGetEdges(g))[-1])
    # A fork never joined: the capture fails with UNJOINED.
    ok(d.cuStreamBeginCapture(s1, d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL))
    ok(d.cuEventRecord(fork, s1))
    ok(d.cuStreamWaitEvent(s2, fork, 0))
    ok(d.cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, s2, args, 0))
    r["unjoined"] = d.cuStreamEndCapture(s1)[0].name
    # Capture into an existing graph after one of its nodes; then make the
    # next captured work depend on the root only (SET).
    g2 = ok(d.cuGraphCreate(0))
    root = ok(d.cuGraphAddEmptyNode(g2, None, 0))
    ok(d.cuStreamBeginCaptureToGraph(s1, g2, [root], None, 1, d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL), "cuStreamBeginCaptureToGraph")
    ok(d.cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, s1, args, 0))
    ok(d.cuStreamUpdateCaptureDependencies(s1, [root], None, 1, 1), "cuStreamUpdateCaptureDependencies")
    ok(d.cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, s1, args, 0))
    g3 = ok(d.cuStreamEndCapture(s1))
    r["to_graph_same"] = int(g3) == int(g2)
    r["to_graph_nodes"] = int(ok(d.cuGraphGetNodes(g2))[-1])
    r["to_graph_root_dependents"] = int(ok(d.cuGraphNodeGetDependentNodes(root, 4))[-1])
    return r


@section("pools")
def _():
    r = {}
    pool = ok(d.cuDeviceGetMemPool(dev))
    loc = d.CUmemLocation()
    loc.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    loc.id = 0
    r["get_mem_pool_same"] = int(ok(d.cuMemGetMemPool(loc, d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED), "cuMemGetMemPool")) == int(pool)
    r["default_pool_same"] = int(ok(d.cuMemGetDefaultMemPool(loc, d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED))) == int(ok(d.cuDeviceGetDefaultMemPool(dev)))
    r["own_access"] = ok(d.cuMemPoolGetAccess(pool, loc), "cuMemPoolGetAccess").name
    acc = d.CUmemAccessDesc()
    acc.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    acc.location.id = 1
    acc.flags = d.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    ok(d.cuMemPoolSetAccess(pool, [acc], 1), "cuMemPoolSetAccess")
    loc1 = d.CUmemLocation()
    loc1.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    loc1.id = 1
    r["peer_access"] = ok(d.cuMemPoolGetAccess(pool, loc1)).name
    bad = d.CUmemAccessDesc()
    bad.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    bad.location.id = 0
    bad.flags = d.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_NONE
    r["own_access_none"] = d.cuMemPoolSetAccess(pool, [bad], 1)[0].name
    # Zero bytes: success and NULL, freed without error.
    z = ok(d.cuMemAllocAsync(0, stream), "cuMemAllocAsync(0)")
    r["zero_ptr"] = int(z)
    r["zero_free"] = d.cuMemFreeAsync(z, stream)[0].name
    # The pool of device 1, used from a stream of device 0: memory on GPU 1.
    dev1 = ok(d.cuDeviceGet(1))
    pool1 = ok(d.cuDeviceGetDefaultMemPool(dev1))
    p = ok(d.cuMemAllocFromPoolAsync(8 * MIB, pool1, stream), "cuMemAllocFromPoolAsync(other device)")
    r["cross_ordinal"] = int(ok(d.cuPointerGetAttribute(d.CUpointer_attribute.CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p)))
    r["cross_pool_handle"] = int(ok(d.cuPointerGetAttribute(d.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, p))) == int(pool1)
    ok(d.cuMemFreeAsync(p, stream))
    ok(d.cuStreamSynchronize(stream))
    return r


def loc_dev0():
    loc = d.CUmemLocation()
    loc.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    loc.id = 0
    return loc


@section("managed")
def _():
    r = {}
    p = ok(d.cuMemAllocManaged(4 * MIB, d.CUmemAttach_flags.CU_MEM_ATTACH_GLOBAL.value))
    RA = d.CUmem_range_attribute
    r["read_mostly_before"] = int(ok(d.cuMemRangeGetAttribute(4, RA.CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, p, 4 * MIB), "cuMemRangeGetAttribute"))
    ok(d.cuMemAdvise(p, 4 * MIB, d.CUmem_advise.CU_MEM_ADVISE_SET_READ_MOSTLY, loc_dev0()))
    r["read_mostly_after"] = int(ok(d.cuMemRangeGetAttribute(4, RA.CU_MEM_RANGE_ATTRIBUTE_READ_MOSTLY, p, 4 * MIB)))
    ok(d.cuMemAdvise(p, 4 * MIB, d.CUmem_advise.CU_MEM_ADVISE_SET_PREFERRED_LOCATION, loc_dev0()))
    r["preferred"] = int(ok(d.cuMemRangeGetAttribute(4, RA.CU_MEM_RANGE_ATTRIBUTE_PREFERRED_LOCATION, p, 4 * MIB)))
    ok(d.cuMemPrefetchAsync(p, 4 * MIB, loc_dev0(), 0, stream))
    r["last_prefetch"] = int(ok(d.cuMemRangeGetAttribute(4, RA.CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION, p, 4 * MIB)))
    PA = d.CUpointer_attribute
    r["is_managed"] = int(ok(d.cuPointerGetAttribute(PA.CU_POINTER_ATTRIBUTE_IS_MANAGED, p)))
    r["host_ptr_same"] = int(ok(d.cuPointerGetAttribute(PA.CU_POINTER_ATTRIBUTE_HOST_POINTER, p))) == int(p)
    r["sync_memops_before"] = int(ok(d.cuPointerGetAttribute(PA.CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, p)))
    one = ctypes.c_uint(1)
    ok(d.cuPointerSetAttribute(ctypes.addressof(one), PA.CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, p), "cuPointerSetAttribute")
    r["sync_memops_after"] = int(ok(d.cuPointerGetAttribute(PA.CU_POINTER_ATTRIBUTE_SYNC_MEMOPS, p)))
    ok(d.cuMemFree(p))
    return r


@section("occupancy")
def _():
    r = {}
    r["blocks_256"] = int(ok(d.cuOccupancyMaxActiveBlocksPerMultiprocessor(spin, 256, 0)))
    r["blocks_256_32k"] = int(ok(d.cuOccupancyMaxActiveBlocksPerMultiprocessor(spin, 256, 32 * 1024)))
    r["blocks_too_much_smem"] = int(ok(d.cuOccupancyMaxActiveBlocksPerMultiprocessor(spin, 256, 64 * 1024)))
    r["blocks_flags"] = int(ok(d.cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(spin, 128, 0, 0)))
    grid, block = ok(d.cuOccupancyMaxPotentialBlockSize(spin, None, 0, 0), "cuOccupancyMaxPotentialBlockSize")
    r["potential"] = [int(grid), int(block)]
    r["avail_smem_2"] = int(ok(d.cuOccupancyAvailableDynamicSMemPerBlock(spin, 2, 256), "cuOccupancyAvailableDynamicSMemPerBlock"))
    return r


@section("arrays")
def _():
    r = {}
    desc = d.CUDA_ARRAY3D_DESCRIPTOR()
    desc.Width, desc.Height, desc.Depth = 64, 32, 4
    desc.Format = d.CUarray_format.CU_AD_FORMAT_UNSIGNED_INT8
    desc.NumChannels = 4
    free0 = free_bytes()
    arr = ok(d.cuArray3DCreate(desc))
    got = ok(d.cuArray3DGetDescriptor(arr), "cuArray3DGetDescriptor")
    r["descriptor"] = [int(got.Width), int(got.Height), int(got.Depth), int(got.NumChannels)]
    host = bytes(range(256)) * (64 * 4 * 32 * 4 // 256)
    src = ctypes.create_string_buffer(host, len(host))
    cp = d.CUDA_MEMCPY3D()
    cp.srcMemoryType = d.CUmemorytype.CU_MEMORYTYPE_HOST
    cp.srcHost = ctypes.addressof(src)
    cp.srcPitch = 64 * 4
    cp.srcHeight = 32
    cp.dstMemoryType = d.CUmemorytype.CU_MEMORYTYPE_ARRAY
    cp.dstArray = arr
    cp.WidthInBytes, cp.Height, cp.Depth = 64 * 4, 32, 4
    ok(d.cuMemcpy3DAsync(cp, stream), "cuMemcpy3DAsync")
    back = ctypes.create_string_buffer(len(host))
    cp2 = d.CUDA_MEMCPY3D()
    cp2.srcMemoryType = d.CUmemorytype.CU_MEMORYTYPE_ARRAY
    cp2.srcArray = arr
    cp2.dstMemoryType = d.CUmemorytype.CU_MEMORYTYPE_HOST
    cp2.dstHost = ctypes.addressof(back)
    cp2.dstPitch = 64 * 4
    cp2.dstHeight = 32
    cp2.WidthInBytes, cp2.Height, cp2.Depth = 64 * 4, 32, 4
    ok(d.cuMemcpy3D(cp2), "cuMemcpy3D")
    r["roundtrip"] = back.raw == host
    # A copy that runs past the array is refused.
    cp2.Depth = 5
    r["overrun"] = d.cuMemcpy3D(cp2)[0].name
    ok(d.cuArrayDestroy(arr))
    # Mipmapped: 64x64 RGBA8, 7 levels = 16384+4096+...+4 bytes, charged.
    md = d.CUDA_ARRAY3D_DESCRIPTOR()
    md.Width, md.Height, md.Depth = 64, 64, 0
    md.Format = d.CUarray_format.CU_AD_FORMAT_UNSIGNED_INT8
    md.NumChannels = 4
    before = free_bytes()
    mm = ok(d.cuMipmappedArrayCreate(md, 7), "cuMipmappedArrayCreate")
    r["mipmap_charged"] = before - free_bytes()
    lvl = ok(d.cuMipmappedArrayGetLevel(mm, 6), "cuMipmappedArrayGetLevel")
    ld = ok(d.cuArray3DGetDescriptor(lvl))
    r["level6"] = [int(ld.Width), int(ld.Height)]
    r["too_many_levels"] = d.cuMipmappedArrayCreate(md, 8)[0].name
    r["levels_huge"] = d.cuMipmappedArrayCreate(md, 0xFFFFFFFF)[0].name
    # Texture and surface objects over an array.
    arr2d = d.CUDA_ARRAY_DESCRIPTOR()
    arr2d.Width, arr2d.Height = 16, 16
    arr2d.Format = d.CUarray_format.CU_AD_FORMAT_FLOAT
    arr2d.NumChannels = 1
    a2 = ok(d.cuArrayCreate(arr2d))
    res = d.CUDA_RESOURCE_DESC()
    res.resType = d.CUresourcetype.CU_RESOURCE_TYPE_ARRAY
    res.res.array.hArray = a2
    td = d.CUDA_TEXTURE_DESC()
    td.filterMode = d.CUfilter_mode.CU_TR_FILTER_MODE_POINT
    tex = ok(d.cuTexObjectCreate(res, td, None), "cuTexObjectCreate")
    rd = ok(d.cuTexObjectGetResourceDesc(tex), "cuTexObjectGetResourceDesc")
    r["tex_res_array_same"] = int(rd.res.array.hArray) == int(a2)
    surf = ok(d.cuSurfObjectCreate(res), "cuSurfObjectCreate")
    r["tex_surf_nonzero"] = int(tex) != 0 and int(surf) != 0
    ok(d.cuTexObjectDestroy(tex))
    ok(d.cuSurfObjectDestroy(surf))
    r["tex_destroyed_again"] = d.cuTexObjectDestroy(tex)[0].name
    ok(d.cuMipmappedArrayDestroy(mm))
    r["mipmap_returned"] = before - free_bytes()
    # A 2D copy into an array stays inside it (17 rows into 16: refused).
    c2 = d.CUDA_MEMCPY2D()
    hbuf = ctypes.create_string_buffer(64 * 17)
    c2.srcMemoryType = d.CUmemorytype.CU_MEMORYTYPE_HOST
    c2.srcHost = ctypes.addressof(hbuf)
    c2.srcPitch = 64
    c2.dstMemoryType = d.CUmemorytype.CU_MEMORYTYPE_ARRAY
    c2.dstArray = a2
    c2.WidthInBytes, c2.Height = 64, 16
    r["copy2d_fits"] = d.cuMemcpy2D(c2)[0].name
    c2.Height = 17
    r["copy2d_overrun"] = d.cuMemcpy2D(c2)[0].name
    ok(d.cuArrayDestroy(a2))
    r["all_returned"] = free0 == free_bytes()
    # A 3D copy issued into a capturing stream runs at replay, not at capture.
    dbuf = ok(d.cuMemAlloc(256))
    ok(d.cuMemsetD8(dbuf, 0, 256))
    src3 = ctypes.create_string_buffer(b"\x42" * 256, 256)
    c3 = d.CUDA_MEMCPY3D()
    c3.srcMemoryType = d.CUmemorytype.CU_MEMORYTYPE_HOST
    c3.srcHost = ctypes.addressof(src3)
    c3.dstMemoryType = d.CUmemorytype.CU_MEMORYTYPE_DEVICE
    c3.dstDevice = dbuf
    c3.WidthInBytes, c3.Height, c3.Depth = 256, 1, 1
    cs = ok(d.cuStreamCreate(0))
    ok(d.cuStreamBeginCapture(cs, d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL))
    ok(d.cuMemcpy3DAsync(c3, cs), "cuMemcpy3DAsync(captured)")
    g3 = ok(d.cuStreamEndCapture(cs))
    chk = bytearray(1)
    ok(d.cuMemcpyDtoH(chk, dbuf, 1))
    r["copy3d_at_capture"] = chk[0]
    ok(d.cuGraphLaunch(ok(d.cuGraphInstantiate(g3, 0)), cs))
    ok(d.cuStreamSynchronize(cs))
    ok(d.cuMemcpyDtoH(chk, int(dbuf) + 255, 1))
    r["copy3d_at_replay"] = chk[0]
    return r


@section("more")
def _():
    r = {}
    # Kernel node launch attributes are kept per node and copied.
    g = ok(d.cuGraphCreate(0))
    kp = d.CUDA_KERNEL_NODE_PARAMS()
    kp.func = spin
    kp.gridDimX = kp.gridDimY = kp.gridDimZ = 1
    kp.blockDimX = kp.blockDimY = kp.blockDimZ = 1
    ns = ctypes.c_uint64(1000)
    kp.kernelParams = ((ns,), (ctypes.c_uint64,))
    k1 = ok(d.cuGraphAddKernelNode(g, None, 0, kp))
    k2 = ok(d.cuGraphAddKernelNode(g, None, 0, kp))
    PRIO = d.CUkernelNodeAttrID.CU_LAUNCH_ATTRIBUTE_PRIORITY
    v = d.CUkernelNodeAttrValue()
    v.priority = 3
    ok(d.cuGraphKernelNodeSetAttribute(k1, PRIO, v), "cuGraphKernelNodeSetAttribute")
    r["attr_prio"] = ok(d.cuGraphKernelNodeGetAttribute(k1, PRIO), "cuGraphKernelNodeGetAttribute").priority
    r["attr_prio_other_before"] = ok(d.cuGraphKernelNodeGetAttribute(k2, PRIO)).priority
    ok(d.cuGraphKernelNodeCopyAttributes(k2, k1), "cuGraphKernelNodeCopyAttributes")
    r["attr_prio_copied"] = ok(d.cuGraphKernelNodeGetAttribute(k2, PRIO)).priority
    # The pre-4.0 launch API: block shape, parameter buffer, cuLaunchGrid.
    ok(d.cuFuncSetBlockShape(spin, 32, 1, 1), "cuFuncSetBlockShape")
    arg = ctypes.c_uint64(4_000_000)
    ok(d.cuParamSetv(spin, 0, ctypes.addressof(arg), 8), "cuParamSetv")
    ok(d.cuParamSetSize(spin, 8), "cuParamSetSize")
    ev0, ev1 = ok(d.cuEventCreate(0)), ok(d.cuEventCreate(0))
    ok(d.cuEventRecord(ev0, 0))
    ok(d.cuLaunchGrid(spin, 1, 1), "cuLaunchGrid")
    ok(d.cuEventRecord(ev1, 0))
    ok(d.cuEventSynchronize(ev1))
    r["legacy_ms"] = ok(d.cuEventElapsedTime(ev0, ev1))
    # Batched copies.
    a = ok(d.cuMemAlloc(4096))
    b = ok(d.cuMemAlloc(4096))
    ok(d.cuMemsetD8(a, 0x33, 4096))
    attr = d.CUmemcpyAttributes()
    attr.srcAccessOrder = d.CUmemcpySrcAccessOrder.CU_MEMCPY_SRC_ACCESS_ORDER_STREAM
    ok(d.cuMemcpyBatchAsync([b], [a], [4096], 1, [attr], [0], 1, stream), "cuMemcpyBatchAsync")
    ok(d.cuStreamSynchronize(stream))
    buf = bytearray(4)
    ok(d.cuMemcpyDtoH(buf, int(b) + 4092, 4))
    r["batch_copy"] = list(buf)
    # Batched prefetch of managed memory, read back as the last prefetch.
    m = ok(d.cuMemAllocManaged(MIB, d.CUmemAttach_flags.CU_MEM_ATTACH_GLOBAL.value))
    host = d.CUmemLocation()
    host.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_HOST
    ok(d.cuMemPrefetchBatchAsync([m], [MIB], 1, [host], [0], 1, 0, stream), "cuMemPrefetchBatchAsync")
    r["batch_prefetch_host"] = int(ok(d.cuMemRangeGetAttribute(4, d.CUmem_range_attribute.CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION, m, MIB)))
    # A cooperative launch on both devices at once (deprecated API).
    dev1 = ok(d.cuDeviceGet(1))
    ctx1 = ok(d.cuDevicePrimaryCtxRetain(dev1))
    ok(d.cuCtxSetCurrent(ctx1))
    spin1 = ok(d.cuModuleGetFunction(ok(d.cuModuleLoadData(PTX)), b"cgpu_sim_spin"))
    s1 = ok(d.cuStreamCreate(0))
    ok(d.cuCtxSetCurrent(ctx))
    ns2 = ctypes.c_uint64(3_000_000)
    argv = (ctypes.c_void_p * 1)(ctypes.addressof(ns2))
    lps = []
    for f, s in ((spin, stream), (spin1, s1)):
        lp = d.CUDA_LAUNCH_PARAMS()
        lp.function = f
        lp.gridDimX = lp.gridDimY = lp.gridDimZ = 1
        lp.blockDimX = lp.blockDimY = lp.blockDimZ = 1
        lp.hStream = s
        lp.kernelParams = ctypes.addressof(argv)
        lps.append(lp)
    t0 = time.time()
    ok(d.cuLaunchCooperativeKernelMultiDevice(lps, 2, 0), "cuLaunchCooperativeKernelMultiDevice")
    ok(d.cuStreamSynchronize(stream))
    ok(d.cuStreamSynchronize(s1))
    r["multi_device_wall_ms"] = (time.time() - t0) * 1000
    r["multi_device_too_many"] = d.cuLaunchCooperativeKernelMultiDevice(lps + [lps[0]], 3, 0)[0].name
    # Parameter layout of a PTX kernel.
    ptx2 = b""".version 7.0
.target sm_52
.address_size 64
.visible .entry k3(.param .u32 a, .param .u64 b, .param .align 16 .b8 c[24])
{
  ret;
}
"""
    k3 = ok(d.cuModuleGetFunction(ok(d.cuModuleLoadData(ptx2)), b"k3"))
    r["param_info"] = [list(ok(d.cuFuncGetParamInfo(k3, i), "cuFuncGetParamInfo")) for i in range(3)]
    r["param_count"] = int(ok(d.cuFuncGetParamCount(k3), "cuFuncGetParamCount"))
    r["param_past_end"] = d.cuFuncGetParamInfo(k3, 3)[0].name
    lib = ok(d.cuLibraryLoadData(ptx2, None, None, 0, None, None, 0))
    kk = ok(d.cuLibraryGetKernel(lib, b"k3"))
    r["kernel_param_2"] = list(ok(d.cuKernelGetParamInfo(kk, 2), "cuKernelGetParamInfo"))
    # Core dump settings: defaults, a global setting seen by the context,
    # a context setting overriding it; callbacks register and deregister.
    CD = d.CUcoredumpSettings
    r["coredump_trigger_host"] = bool(ok(d.cuCoredumpGetAttribute(CD.CU_COREDUMP_TRIGGER_HOST), "cuCoredumpGetAttribute"))
    ok(d.cuCoredumpSetAttributeGlobal(CD.CU_COREDUMP_ENABLE_ON_EXCEPTION, True), "cuCoredumpSetAttributeGlobal")
    r["coredump_on_exception"] = bool(ok(d.cuCoredumpGetAttribute(CD.CU_COREDUMP_ENABLE_ON_EXCEPTION)))
    ok(d.cuCoredumpSetAttribute(CD.CU_COREDUMP_ENABLE_ON_EXCEPTION, False), "cuCoredumpSetAttribute")
    r["coredump_ctx_override"] = bool(ok(d.cuCoredumpGetAttribute(CD.CU_COREDUMP_ENABLE_ON_EXCEPTION)))
    r["coredump_global_kept"] = bool(ok(d.cuCoredumpGetAttributeGlobal(CD.CU_COREDUMP_ENABLE_ON_EXCEPTION)))
    cbt = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_int)
    cdcb = cbt(lambda *a: None)
    h = ok(d.cuCoredumpRegisterStartCallback(ctypes.cast(cdcb, ctypes.c_void_p).value, 0), "cuCoredumpRegisterStartCallback")
    r["coredump_dereg"] = d.cuCoredumpDeregisterStartCallback(h)[0].name
    r["coredump_dereg_again"] = d.cuCoredumpDeregisterStartCallback(h)[0].name
    ncb = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)(lambda *a: None)
    nh = ok(d.cuDeviceRegisterAsyncNotification(dev, ctypes.cast(ncb, ctypes.c_void_p).value, 0), "cuDeviceRegisterAsyncNotification")
    r["notify_unreg"] = d.cuDeviceUnregisterAsyncNotification(dev, nh)[0].name
    r["exec_affinity"] = d.cuCtxGetExecAffinity(d.CUexecAffinityType.CU_EXEC_AFFINITY_TYPE_SM_COUNT)[0].name
    return r


@section("green")
def _():
    r = {}
    T = d.CUdevResourceType
    res = ok(d.cuDeviceGetDevResource(dev, T.CU_DEV_RESOURCE_TYPE_SM), "cuDeviceGetDevResource")
    r["device_sms"] = [res.sm.smCount, res.sm.minSmPartitionSize, res.sm.smCoscheduledAlignment]
    wq = ok(d.cuDeviceGetDevResource(dev, T.CU_DEV_RESOURCE_TYPE_WORKQUEUE_CONFIG))
    r["wq_config"] = [int(wq.wqConfig.device), wq.wqConfig.wqConcurrencyLimit]
    r["groups_possible"] = ok(d.cuDevSmResourceSplitByCount(0, res, 0, 16), "split query")[1]
    groups, n, rem = ok(d.cuDevSmResourceSplitByCount(2, res, 0, 15), "cuDevSmResourceSplitByCount")
    r["split"] = [n, [g.sm.smCount for g in groups[:n]], rem.sm.smCount]
    r["split_too_big"] = d.cuDevSmResourceSplitByCount(1, res, 0, 1000)[0].name
    # Structured split: 8 SMs in pairs, then discover the rest in a group.
    P = d.CU_DEV_SM_RESOURCE_GROUP_PARAMS
    p0, p1 = P(), P()
    p0.smCount, p0.coscheduledSmCount = 8, 2
    p1.smCount, p1.coscheduledSmCount = 0, 2
    sg, srem = ok(d.cuDevSmResourceSplit(2, res, 0, [p0, p1]), "cuDevSmResourceSplit")
    r["structured"] = [sg[0].sm.smCount, sg[1].sm.smCount, int(srem.type)]
    desc = ok(d.cuDevResourceGenerateDesc([groups[0]], 1), "cuDevResourceGenerateDesc")
    r["mixed_splits"] = d.cuDevResourceGenerateDesc([groups[0], sg[0]], 2)[0].name
    before = free_bytes()
    g = ok(d.cuGreenCtxCreate(desc, dev, d.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM), "cuGreenCtxCreate")
    r["green_charged"] = before - free_bytes()
    gres = ok(d.cuGreenCtxGetDevResource(g, T.CU_DEV_RESOURCE_TYPE_SM))
    r["green_sms"] = gres.sm.smCount
    gctx = ok(d.cuCtxFromGreenCtx(g), "cuCtxFromGreenCtx")
    r["ctx_sms"] = ok(d.cuCtxGetDevResource(gctx, T.CU_DEV_RESOURCE_TYPE_SM)).sm.smCount
    r["primary_ctx_sms"] = ok(d.cuCtxGetDevResource(ctx, T.CU_DEV_RESOURCE_TYPE_SM)).sm.smCount
    gs = ok(d.cuGreenCtxStreamCreate(g, d.CUstream_flags.CU_STREAM_NON_BLOCKING, 0), "cuGreenCtxStreamCreate")
    r["stream_sms"] = ok(d.cuStreamGetDevResource(gs, T.CU_DEV_RESOURCE_TYPE_SM)).sm.smCount
    r["stream_green_same"] = int(ok(d.cuStreamGetGreenCtx(gs))) == int(g)
    r["plain_stream_green"] = int(ok(d.cuStreamGetGreenCtx(stream)))
    c2, g2 = ok(d.cuStreamGetCtx_v2(gs))
    r["ctx_v2"] = [int(c2), int(g2) == int(g)]
    r["green_id_nonzero"] = int(ok(d.cuGreenCtxGetId(g))) > 0
    r["destroy_as_ctx"] = d.cuCtxDestroy(gctx)[0].name
    # Work in the green context: a kernel on its stream, events on it.
    ok(d.cuCtxPushCurrent(gctx))
    m = ok(d.cuMemAlloc(MIB))
    ns = ctypes.c_uint64(1_000_000)
    argv = (ctypes.c_void_p * 1)(ctypes.addressof(ns))
    ok(d.cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, gs, ctypes.addressof(argv), 0), "launch in green stream")
    ev = ok(d.cuEventCreate(0))
    ok(d.cuGreenCtxRecordEvent(g, ev), "cuGreenCtxRecordEvent")
    ok(d.cuEventSynchronize(ev))
    ok(d.cuGreenCtxWaitEvent(g, ev), "cuGreenCtxWaitEvent")
    ok(d.cuCtxPopCurrent())
    ok(d.cuGreenCtxDestroy(g), "cuGreenCtxDestroy")
    r["destroy_again"] = d.cuGreenCtxDestroy(g)[0].name
    r["stream_after"] = d.cuStreamSynchronize(gs)[0].name
    r["memory_kept"] = d.cuMemsetD8(m, 1, MIB)[0].name
    ok(d.cuMemFree(m))
    r["after_destroy_charged"] = before - free_bytes()
    return r


@section("logs")
def _():
    r = {}
    got = []
    cbt = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t)
    cb = cbt(lambda data, level, msg, n: got.append((level, msg[:n].decode())))
    h = ok(d.cuLogsRegisterCallback(ctypes.cast(cb, ctypes.c_void_p).value, 0), "cuLogsRegisterCallback")
    it = ok(d.cuLogsCurrent(0), "cuLogsCurrent")
    r["oom"] = d.cuMemAlloc(1 << 50)[0].name
    r["callback"] = got[:]
    buf = bytearray(4096)
    err, it2, size = d.cuLogsDumpToMemory(it, buf, 4096, 0)
    r["dump"] = [err.name, bytes(buf[:int(size)]).decode(errors="replace"), int(size), buf[int(size)]]
    err, _, size = d.cuLogsDumpToMemory(it2, buf, 4096, 0)
    r["dump_again"] = [err.name, int(size)]
    small = bytearray(8)
    r["dump_small"] = d.cuLogsDumpToMemory(None, small, 8, 0)[0].name
    path = f"/tmp/cgpu-sim-logs-{os.getpid()}.txt"
    ok(d.cuLogsDumpToFile(None, path.encode(), 0), "cuLogsDumpToFile")
    with open(path) as f:
        r["file_has_oom"] = "CUDA_ERROR_OUT_OF_MEMORY: out of memory" in f.read()
    os.unlink(path)
    r["before_unregister"] = len(got)
    ok(d.cuLogsUnregisterCallback(h))
    d.cuMemAlloc(1 << 50)
    r["after_unregister"] = len(got)
    return r


@section("tensor_map")
def _():
    r = {}
    DT = d.CUtensorMapDataType
    ptr = ok(d.cuMemAlloc(4 * MIB))
    u64 = lambda xs: [d.cuuint64_t(x) for x in xs]  # noqa: E731
    u32 = lambda xs: [d.cuuint32_t(x) for x in xs]  # noqa: E731
    args = dict(
        interleave=d.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        swizzle=d.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        l2Promotion=d.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
        oobFill=d.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)

    def tiled(dtype=DT.CU_TENSOR_MAP_DATA_TYPE_FLOAT16, addr=None, box=(64, 64), strides=(2048,), **kw):
        a = dict(args, **kw)
        return d.cuTensorMapEncodeTiled(dtype, 2, addr if addr is not None else ptr, u64([1024, 1024]), u64(strides),
                                        u32(box), u32([1, 1]), a["interleave"], a["swizzle"], a["l2Promotion"], a["oobFill"])
    err, tm = tiled()
    r["tiled"] = err.name
    r["tiled_addr"] = int(tm.opaque[0]) == int(ptr)
    r["misaligned_addr"] = tiled(addr=int(ptr) + 8)[0].name
    r["stride_not_16"] = tiled(strides=(2056,))[0].name
    r["box_too_wide_for_swizzle"] = tiled(box=(128, 64))[0].name
    r["box_257"] = tiled(box=(64, 257), swizzle=d.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE)[0].name
    r["nan_fill_int"] = tiled(dtype=DT.CU_TENSOR_MAP_DATA_TYPE_INT32, box=(32, 8),
                              oobFill=d.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NAN_REQUEST_ZERO_FMA)[0].name
    r["replace"] = d.cuTensorMapReplaceAddress(tm, int(ptr) + 4096)[0].name
    r["replaced_addr"] = int(tm.opaque[0]) == int(ptr) + 4096
    r["replace_misaligned"] = d.cuTensorMapReplaceAddress(tm, int(ptr) + 4)[0].name
    res = d.cuTensorMapSetAllocationClass(tm, d.CUtensorMapAllocClass.CU_TENSOR_MAP_ALLOC_CLASS_LARGE)
    r["alloc_class"] = [res[0].name, int(res[1])]
    r["foreign_map"] = d.cuTensorMapReplaceAddress(d.CUtensorMap(), int(ptr))[0].name
    # NHWC activations: im2col with a 3x3 window (corners -1 .. -1).
    err, _ = d.cuTensorMapEncodeIm2col(DT.CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4, ptr, u64([64, 32, 32, 4]),
                                        u64([128, 128 * 32, 128 * 32 * 32]), [-1, -1], [-1, -1], 64, 128, u32([1, 1, 1, 1]),
                                        args["interleave"], args["swizzle"], args["l2Promotion"], args["oobFill"])
    r["im2col"] = err.name
    err, _ = d.cuTensorMapEncodeIm2col(DT.CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 4, ptr, u64([64, 32, 32, 4]),
                                        u64([128, 128 * 32, 128 * 32 * 32]), [-200, -1], [-1, -1], 64, 128, u32([1, 1, 1, 1]),
                                        args["interleave"], args["swizzle"], args["l2Promotion"], args["oobFill"])
    r["im2col_corner_range"] = err.name
    err, _ = d.cuTensorMapEncodeIm2colWide(DT.CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3, ptr, u64([64, 32, 4]), u64([128, 128 * 32]),
                                            -1, 1, 64, 128, u32([1, 1, 1]), args["interleave"],
                                            d.CUtensorMapIm2ColWideMode.CU_TENSOR_MAP_IM2COL_WIDE_MODE_W, args["swizzle"],
                                            args["l2Promotion"], args["oobFill"])
    r["im2col_wide"] = err.name
    ok(d.cuMemFree(ptr))
    return r


@section("memops64")
def _():
    r = {}
    m = ok(d.cuMemAlloc(64))
    ok(d.cuStreamWriteValue64(stream, m, 0x1122334455667788, 0), "cuStreamWriteValue64")
    ok(d.cuStreamSynchronize(stream))
    buf = (ctypes.c_uint64 * 1)()
    ok(d.cuMemcpyDtoH(buf, m, 8))
    r["written"] = buf[0] == 0x1122334455667788
    r["wait_geq"] = d.cuStreamWaitValue64(stream, m, 0x1122334455667788, 0)[0].name
    r["misaligned"] = d.cuStreamWriteValue64(stream, int(m) + 4, 1, 0)[0].name
    ok(d.cuMemFree(m))
    return r


@section("library_managed")
def _():
    r = {}
    ptx = b""".version 7.0
.target sm_52
.address_size 64
.visible .global .attribute(.managed) .align 8 .u64 counter[4];
.visible .global .align 4 .u32 plain;
.visible .entry k() { ret; }
"""
    lib = ok(d.cuLibraryLoadData(ptx, None, None, 0, None, None, 0))
    p, n = ok(d.cuLibraryGetManaged(lib, b"counter"), "cuLibraryGetManaged")
    r["managed_bytes"] = int(n)
    r["managed_same_as_global"] = int(ok(d.cuLibraryGetGlobal(lib, b"counter"))[0]) == int(p)
    r["plain_not_managed"] = d.cuLibraryGetManaged(lib, b"plain")[0].name
    r["unified"] = d.cuLibraryGetUnifiedFunction(lib, b"k")[0].name
    r["multicast_create"] = d.cuMulticastCreate(d.CUmulticastObjectProp())[0].name
    r["multicast_bind"] = d.cuMulticastBindAddr(1, 0, p, 32, 0)[0].name
    return r


@section("recapture")
def _():
    r = {}
    M = d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_GLOBAL
    s = ok(d.cuStreamCreate(0))

    def launches(*ns_list):
        keep = []
        for ns in ns_list:
            v = ctypes.c_uint64(ns)
            argv = (ctypes.c_void_p * 1)(ctypes.addressof(v))
            keep.append((v, argv))
            ok(d.cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, s, ctypes.addressof(argv), 0), "launch")
        return keep

    def device_ms(graph):
        ge = ok(d.cuGraphInstantiate(graph, 0))
        e0, e1 = ok(d.cuEventCreate(0)), ok(d.cuEventCreate(0))
        ok(d.cuEventRecord(e0, s))
        ok(d.cuGraphLaunch(ge, s))
        ok(d.cuEventRecord(e1, s))
        ok(d.cuEventSynchronize(e1))
        ok(d.cuGraphExecDestroy(ge))
        return ok(d.cuEventElapsedTime(e0, e1))

    ok(d.cuStreamBeginCapture(s, M))
    keep = launches(2_000_000, 3_000_000)
    g = ok(d.cuStreamEndCapture(s))
    nodes_before = [int(n) for n in ok(d.cuGraphGetNodes(g, 8))[0][:2]]
    r["first_ms"] = device_ms(g)
    seen = []
    cbt = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int)
    cb = cbt(lambda data, node, orig, new, status: seen.append([node in nodes_before, status]) or 0)
    cbp = d.CUgraphRecaptureCallback(ctypes.cast(cb, ctypes.c_void_p).value)
    ok(d.cuStreamBeginRecaptureToGraph(s, M, g, cbp, 0), "cuStreamBeginRecaptureToGraph")
    keep += launches(2_000_000, 7_000_000)
    g2 = ok(d.cuStreamEndCapture(s), "end recapture")
    r["same_graph"] = int(g2) == int(g)
    r["callbacks"] = seen
    r["same_nodes"] = [int(n) for n in ok(d.cuGraphGetNodes(g, 8))[0][:2]] == nodes_before
    r["recaptured_ms"] = device_ms(g)
    # A different topology (three kernels for two) fails the recapture.
    ok(d.cuStreamBeginRecaptureToGraph(s, M, g, 0, 0))
    keep += launches(1, 1, 1)
    err, g3 = d.cuStreamEndCapture(s)
    r["topology"] = [err.name, g3 is None or int(g3) == 0]
    return r


CHILD_IMPORT = r"""
import ctypes, json, sys
from cuda.bindings import driver as d
fd, size = int(sys.argv[1]), int(sys.argv[2])
assert d.cuInit(0)[0] == 0
dev = d.cuDeviceGet(0)[1]
ctx = d.cuDevicePrimaryCtxRetain(dev)[1]
d.cuCtxSetCurrent(ctx)
free0 = int(d.cuMemGetInfo()[1])
err, h = d.cuMemImportFromShareableHandle(fd, d.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
assert err == 0, err
va = d.cuMemAddressReserve(size, 0, 0, 0)[1]
assert d.cuMemMap(va, size, 0, h, 0)[0] == 0
acc = d.CUmemAccessDesc()
acc.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
acc.location.id = 0
acc.flags = d.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
assert d.cuMemSetAccess(va, size, [acc], 1)[0] == 0
buf = (ctypes.c_uint8 * 4)()
assert d.cuMemcpyDtoH(buf, va, 4)[0] == 0
assert d.cuMemsetD8(int(va) + 4, 0x77, 4)[0] == 0
print(json.dumps({"bytes": list(buf), "charged": free0 - int(d.cuMemGetInfo()[1])}))
"""


@section("shareable")
def _():
    import subprocess
    r = {}
    H = d.CUmemAllocationHandleType
    prop = d.CUmemAllocationProp()
    prop.type = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = 0
    size = 2 * MIB
    plain = ok(d.cuMemCreate(size, prop, 0))
    r["not_requested"] = d.cuMemExportToShareableHandle(plain, H.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0)[0].name
    r["fabric"] = d.cuMemExportToShareableHandle(plain, H.CU_MEM_HANDLE_TYPE_FABRIC, 0)[0].name
    ok(d.cuMemRelease(plain))
    prop.requestedHandleTypes = H.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    before = free_bytes()
    h = ok(d.cuMemCreate(size, prop, 0), "cuMemCreate exportable")
    r["props_types"] = int(ok(d.cuMemGetAllocationPropertiesFromHandle(h)).requestedHandleTypes)
    va = ok(d.cuMemAddressReserve(size, 0, 0, 0))
    ok(d.cuMemMap(va, size, 0, h, 0))
    acc = d.CUmemAccessDesc()
    acc.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    acc.location.id = 0
    acc.flags = d.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    ok(d.cuMemSetAccess(va, size, [acc], 1))
    ok(d.cuMemsetD8(va, 0x42, 4))
    fd = int(ok(d.cuMemExportToShareableHandle(h, H.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0), "export"))
    # Another process imports it, reads what this one wrote, writes back.
    out = subprocess.run([sys.executable, "-c", CHILD_IMPORT, str(fd), str(size)], pass_fds=[fd],
                         capture_output=True, text=True, timeout=60)
    child = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else {"error": out.stderr[-400:]}
    r["child"] = child
    back = (ctypes.c_uint8 * 4)()
    ok(d.cuMemcpyDtoH(back, int(va) + 4, 4))
    r["written_by_child"] = list(back)
    # This process imports it too: a second handle on the same bytes.
    h2 = ok(d.cuMemImportFromShareableHandle(fd, H.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR), "import here")
    os.close(fd)
    va2 = ok(d.cuMemAddressReserve(size, 0, 0, 0))
    ok(d.cuMemMap(va2, size, 0, h2, 0))
    ok(d.cuMemSetAccess(va2, size, [acc], 1))
    same = (ctypes.c_uint8 * 4)()
    ok(d.cuMemcpyDtoH(same, va2, 4))
    r["import_here_bytes"] = list(same)
    r["charged_once"] = before - free_bytes()
    r["bad_fd"] = d.cuMemImportFromShareableHandle(0, H.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)[0].name
    for v, hh in ((va, h), (va2, h2)):
        ok(d.cuMemUnmap(v, size))
        ok(d.cuMemAddressFree(v, size))
        ok(d.cuMemRelease(hh))
    r["charged_after"] = before - free_bytes()
    return r


@section("more_ops")
def _():
    r = {}
    m = ok(d.cuMemAlloc(64))
    ops = []
    for op, off, val in ((d.CUstreamBatchMemOpType.CU_STREAM_MEM_OP_WRITE_VALUE_32, 0, 7),
                         (d.CUstreamBatchMemOpType.CU_STREAM_MEM_OP_WRITE_VALUE_64, 8, 1 << 40),
                         (d.CUstreamBatchMemOpType.CU_STREAM_MEM_OP_BARRIER, 0, 0),
                         (d.CUstreamBatchMemOpType.CU_STREAM_MEM_OP_WAIT_VALUE_32, 0, 7)):
        p = d.CUstreamBatchMemOpParams()
        p.operation = op
        if op in (d.CUstreamBatchMemOpType.CU_STREAM_MEM_OP_WRITE_VALUE_32, d.CUstreamBatchMemOpType.CU_STREAM_MEM_OP_WRITE_VALUE_64):
            p.writeValue.address = int(m) + off
            p.writeValue.value64 = val
        elif op == d.CUstreamBatchMemOpType.CU_STREAM_MEM_OP_WAIT_VALUE_32:
            p.waitValue.address = int(m) + off
            p.waitValue.value = val
            p.waitValue.flags = 1  # EQ
        ops.append(p)
    ok(d.cuStreamBatchMemOp(stream, len(ops), ops, 0), "cuStreamBatchMemOp")
    ok(d.cuStreamSynchronize(stream))
    buf = (ctypes.c_uint64 * 2)()
    ok(d.cuMemcpyDtoH(buf, m, 16))
    r["batch"] = [buf[0] & 0xffffffff, buf[1]]
    attr = d.CUmemcpyAttributes()
    attr.srcAccessOrder = d.CUmemcpySrcAccessOrder.CU_MEMCPY_SRC_ACCESS_ORDER_STREAM
    m2 = ok(d.cuMemAlloc(64))
    ok(d.cuMemcpyWithAttributesAsync(m2, m, 16, attr, stream), "cuMemcpyWithAttributesAsync")
    ok(d.cuStreamSynchronize(stream))
    ok(d.cuMemcpyDtoH(buf, m2, 16))
    r["copied"] = [buf[0] & 0xffffffff, buf[1]]
    A = d.CUatomicOperation
    caps = ok(d.cuDeviceGetHostAtomicCapabilities([A.CU_ATOMIC_OPERATION_INTEGER_ADD, A.CU_ATOMIC_OPERATION_CAS], 2, dev), "host atomics")
    r["host_atomics"] = [int(c) for c in caps]
    dev1 = ok(d.cuDeviceGet(1))
    caps = ok(d.cuDeviceGetP2PAtomicCapabilities([A.CU_ATOMIC_OPERATION_INTEGER_ADD], 1, dev, dev1), "p2p atomics")
    r["p2p_atomics"] = [int(c) for c in caps]
    r["p2p_same_device"] = d.cuDeviceGetP2PAtomicCapabilities([A.CU_ATOMIC_OPERATION_INTEGER_ADD], 1, dev, dev)[0].name
    desc = d.CUDA_ARRAY_DESCRIPTOR()
    desc.Width, desc.Height = 64, 64
    desc.Format = d.CUarray_format.CU_AD_FORMAT_UNSIGNED_INT8
    desc.NumChannels = 1
    arr = ok(d.cuArrayCreate(desc))
    r["array_plane"] = d.cuArrayGetPlane(arr, 0)[0].name
    ok(d.cuArrayDestroy(arr))
    return r


@section("arrays_more")
def _():
    r = {}
    desc = d.CUDA_ARRAY3D_DESCRIPTOR()
    desc.Width, desc.Height, desc.Depth = 16, 8, 0
    desc.Format = d.CUarray_format.CU_AD_FORMAT_UNSIGNED_INT32
    desc.NumChannels = 1
    arr = ok(d.cuArray3DCreate(desc))
    r["sparse_props"] = d.cuArrayGetSparseProperties(arr)[0].name
    r["mem_requirements"] = d.cuArrayGetMemoryRequirements(arr, dev)[0].name
    desc.Flags = 0x40  # CUDA_ARRAY3D_SPARSE
    r["create_sparse"] = d.cuArray3DCreate(desc)[0].name
    r["map_array"] = d.cuMemMapArrayAsync([d.CUarrayMapInfo()], 1, stream)[0].name
    # A 4x3 block of u32 from a 10-wide host-visible buffer into the array
    # at (2, 1), and back out into a tight buffer.
    O = d.CUmemcpy3DOperandType
    src = ok(d.cuMemAlloc(10 * 8 * 4))
    host = (ctypes.c_uint32 * 80)(*range(80))
    ok(d.cuMemcpyHtoD(src, host, 320))
    out = ok(d.cuMemAlloc(12 * 4))
    ops = [d.CUDA_MEMCPY3D_BATCH_OP(), d.CUDA_MEMCPY3D_BATCH_OP()]
    a, b = ops
    a.src.type = O.CU_MEMCPY_OPERAND_TYPE_POINTER
    a.src.op.ptr.ptr = src
    a.src.op.ptr.rowLength = 10
    a.dst.type = O.CU_MEMCPY_OPERAND_TYPE_ARRAY
    a.dst.op.array.array = arr
    a.dst.op.array.offset.x, a.dst.op.array.offset.y = 2, 1
    b.src.type = O.CU_MEMCPY_OPERAND_TYPE_ARRAY
    b.src.op.array.array = arr
    b.src.op.array.offset.x, b.src.op.array.offset.y = 2, 1
    b.dst.type = O.CU_MEMCPY_OPERAND_TYPE_POINTER
    b.dst.op.ptr.ptr = out
    for o in ops:
        o.extent.width, o.extent.height, o.extent.depth = 4, 3, 1
        o.srcAccessOrder = d.CUmemcpySrcAccessOrder.CU_MEMCPY_SRC_ACCESS_ORDER_STREAM
    ok(d.cuMemcpy3DBatchAsync(2, ops, 0, stream), "cuMemcpy3DBatchAsync")
    ok(d.cuStreamSynchronize(stream))
    back = (ctypes.c_uint32 * 12)()
    ok(d.cuMemcpyDtoH(back, out, 48))
    r["batch3d"] = list(back)
    b.extent.width = 20  # past the array's width
    r["batch3d_out_of_bounds"] = d.cuMemcpy3DWithAttributesAsync(b, 0, stream)[0].name
    ok(d.cuArrayDestroy(arr))
    return r


@section("ctx_attach")
def _():
    r = {}
    before = free_bytes()
    c = ok(d.cuCtxCreate(None, 0, dev), "cuCtxCreate")
    r["created"] = before - free_bytes()
    r["attached_same"] = int(ok(d.cuCtxAttach(0), "cuCtxAttach")) == int(c)
    r["attach_flags"] = d.cuCtxAttach(1)[0].name
    ok(d.cuCtxDetach(c), "cuCtxDetach")
    r["after_one_detach"] = before - free_bytes()
    ok(d.cuCtxDetach(c), "cuCtxDetach last")
    r["gone"] = d.cuCtxGetApiVersion(c)[0].name
    ok(d.cuCtxSetCurrent(ctx))
    r["after_last_detach"] = before - free_bytes()
    return r


@section("batch_node")
def _():
    r = {}
    T = d.CUstreamBatchMemOpType
    m = ok(d.cuMemAlloc(64))
    ok(d.cuMemsetD8(m, 0, 64))

    def params(v32, v64):
        ops = []
        for op, off, val in ((T.CU_STREAM_MEM_OP_WRITE_VALUE_32, 0, v32), (T.CU_STREAM_MEM_OP_WRITE_VALUE_64, 8, v64)):
            p = d.CUstreamBatchMemOpParams()
            p.operation = op
            p.writeValue.address = int(m) + off
            p.writeValue.value64 = val
            ops.append(p)
        bp = d.CUDA_BATCH_MEM_OP_NODE_PARAMS()
        bp.ctx = ctx
        bp.count = 2
        bp.paramArray = ops
        bp.flags = 0
        return bp, ops

    bp, keep = params(5, 6)
    g = ok(d.cuGraphCreate(0))
    n = ok(d.cuGraphAddBatchMemOpNode(g, None, 0, bp), "cuGraphAddBatchMemOpNode")
    r["type"] = int(ok(d.cuGraphNodeGetType(n)))
    got = ok(d.cuGraphBatchMemOpNodeGetParams(n), "cuGraphBatchMemOpNodeGetParams")
    r["get_count"] = int(got.count)
    ge = ok(d.cuGraphInstantiate(g, 0))
    buf = (ctypes.c_uint64 * 2)()

    def launch():
        ok(d.cuGraphLaunch(ge, stream))
        ok(d.cuStreamSynchronize(stream))
        ok(d.cuMemcpyDtoH(buf, m, 16))
        return [buf[0] & 0xffffffff, buf[1]]

    r["launched"] = launch()
    bp2, keep2 = params(7, 8)
    ok(d.cuGraphExecBatchMemOpNodeSetParams(ge, n, bp2), "cuGraphExecBatchMemOpNodeSetParams")
    r["exec_updated"] = launch()
    return r


CHILD_IPC = r"""
import ctypes, json, sys
from cuda.bindings import driver as d
raw = bytes.fromhex(sys.argv[1])
assert d.cuInit(0)[0] == 0
dev = d.cuDeviceGet(0)[1]
ctx = d.cuDevicePrimaryCtxRetain(dev)[1]
d.cuCtxSetCurrent(ctx)
h = d.CUipcMemHandle()
ctypes.memmove(h.getPtr(), raw, 64)
free0 = int(d.cuMemGetInfo()[1])
F = d.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
err, p = d.cuIpcOpenMemHandle(h, F)
assert err == 0, err
err2, p2 = d.cuIpcOpenMemHandle(h, F)
buf = (ctypes.c_uint8 * 4)()
assert d.cuMemcpyDtoH(buf, p, 4)[0] == 0
assert d.cuMemsetD8(int(p) + 4, 0x99, 4)[0] == 0
out = {"bytes": list(buf), "same_ptr": int(p2) == int(p), "charged": free0 - int(d.cuMemGetInfo()[1]),
       "free_it": d.cuMemFree(p)[0].name}
out["close1"] = d.cuIpcCloseMemHandle(p)[0].name
out["close2"] = d.cuIpcCloseMemHandle(p)[0].name
out["close3"] = d.cuIpcCloseMemHandle(p)[0].name
print(json.dumps(out))
"""


@section("ipc")
def _():
    import subprocess
    r = {}
    before = free_bytes()
    m = ok(d.cuMemAlloc(8 * MIB))
    ok(d.cuMemsetD8(m, 0x31, 8))
    h = ok(d.cuIpcGetMemHandle(m), "cuIpcGetMemHandle")
    raw = ctypes.string_at(h.getPtr(), 64)
    r["again_same"] = ctypes.string_at(ok(d.cuIpcGetMemHandle(m)).getPtr(), 64) == raw
    r["interior"] = d.cuIpcGetMemHandle(int(m) + 512)[0].name
    r["own_open"] = d.cuIpcOpenMemHandle(h, d.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)[0].name
    out = subprocess.run([sys.executable, "-c", CHILD_IPC, raw.hex()], capture_output=True, text=True, timeout=60)
    r["child"] = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else {"error": out.stderr[-400:]}
    back = (ctypes.c_uint8 * 4)()
    ok(d.cuMemcpyDtoH(back, int(m) + 4, 4))
    r["written_by_child"] = list(back)
    r["still_mine"] = [free_bytes() == before - 8 * MIB]
    ok(d.cuMemFree(m))
    r["freed"] = before - free_bytes()
    return r


@section("location_info")
def _():
    r = {}

    def where(ptr, n):
        loc = d.CUmemLocation()
        err = d.cuMemGetLocationInfo(ptr, n, n, 0, loc)[0]
        return [err.name, int(loc.type), int(loc.id)] if err == d.CUresult.CUDA_SUCCESS else err.name

    m = ok(d.cuMemAllocManaged(8 * MIB, d.CUmemAttach_flags.CU_MEM_ATTACH_GLOBAL.value))
    r["untouched"] = where(m, 2 * MIB)
    ok(d.cuMemsetD8(m, 1, 2 * MIB))
    r["touched"] = where(m, 2 * MIB)
    ok(d.cuMemPrefetchAsync(m, 8 * MIB, loc_dev0(), 0, stream))
    r["prefetched"] = where(int(m) + 4 * MIB, 2 * MIB)
    host = (ctypes.c_uint8 * (1 << 16))()
    host[0] = 1
    r["pageable"] = where(ctypes.addressof(host), 4096)
    dm = ok(d.cuMemAlloc(MIB))
    r["device_memory"] = where(dm, MIB)
    loc = d.CUmemLocation()
    r["sampling_too_big"] = d.cuMemGetLocationInfo(m, MIB, MIB, 2 * MIB, loc)[0].name
    return r


CHILD_POOL = r"""
import ctypes, json, sys
from cuda.bindings import driver as d
fd, raw = int(sys.argv[1]), bytes.fromhex(sys.argv[2])
assert d.cuInit(0)[0] == 0
dev = d.cuDeviceGet(0)[1]
ctx = d.cuDevicePrimaryCtxRetain(dev)[1]
d.cuCtxSetCurrent(ctx)
free0 = int(d.cuMemGetInfo()[1])
H = d.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
err, pool = d.cuMemPoolImportFromShareableHandle(fd, H, 0)
assert err == 0, err
data = d.CUmemPoolPtrExportData()
ctypes.memmove(data.getPtr(), raw, 64)
err, p = d.cuMemPoolImportPointer(pool, data)
assert err == 0, err
buf = (ctypes.c_uint8 * 4)()
d.cuMemcpyDtoH(buf, p, 4)
d.cuMemsetD8(int(p) + 4, 0x66, 4)
out = {"bytes": list(buf), "charged": free0 - int(d.cuMemGetInfo()[1]),
       "alloc_from_imported": d.cuMemAllocFromPoolAsync(1 << 20, pool, 0)[0].name,
       "free": d.cuMemFree(p)[0].name}
print(json.dumps(out))
"""


@section("pool_export")
def _():
    import subprocess
    r = {}
    H = d.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    props = d.CUmemPoolProps()
    props.allocType = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    props.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    props.location.id = 0
    plain = ok(d.cuMemPoolCreate(props))
    r["not_exportable"] = d.cuMemPoolExportToShareableHandle(plain, H, 0)[0].name
    props.handleTypes = H
    pool = ok(d.cuMemPoolCreate(props), "cuMemPoolCreate exportable")
    p = ok(d.cuMemAllocFromPoolAsync(4 * MIB, pool, stream))
    ok(d.cuStreamSynchronize(stream))
    ok(d.cuMemsetD8(p, 0x44, 8))
    fd = int(ok(d.cuMemPoolExportToShareableHandle(pool, H, 0), "cuMemPoolExportToShareableHandle"))
    data = ok(d.cuMemPoolExportPointer(p), "cuMemPoolExportPointer")
    raw = ctypes.string_at(data.getPtr(), 64)
    out = subprocess.run([sys.executable, "-c", CHILD_POOL, str(fd), raw.hex()], pass_fds=[fd],
                         capture_output=True, text=True, timeout=60)
    os.close(fd)
    r["child"] = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else {"error": out.stderr[-400:]}
    back = (ctypes.c_uint8 * 4)()
    ok(d.cuMemcpyDtoH(back, int(p) + 4, 4))
    r["written_by_child"] = list(back)
    ok(d.cuMemFreeAsync(p, stream))
    ok(d.cuStreamSynchronize(stream))
    return r


@section("errors")
def _():
    r = {}
    r["name_2"] = ok(d.cuGetErrorName(d.CUresult.CUDA_ERROR_OUT_OF_MEMORY)).decode()
    r["string_2"] = ok(d.cuGetErrorString(d.CUresult.CUDA_ERROR_OUT_OF_MEMORY)).decode()
    r["string_904"] = ok(d.cuGetErrorString(d.CUresult.CUDA_ERROR_STREAM_CAPTURE_UNJOINED)).decode()
    return r


print(json.dumps(out))
