#!/usr/bin/env python3
"""Unmodified NVIDIA cuda-bindings (cuGetProcAddress_v2 entry path): a graph
with one memory-alloc node of argv[1] MiB and its free node, instantiated
(cuGraphInstantiate, which the bindings resolve to the flags variant),
launched twice, then the device's graph memory trimmed. Prints one JSON
line: each step's return code, the driver's reserved graph memory and
cuMemGetInfo's free."""
import json
import sys

try:
    from cuda.bindings import driver as cuda
except ImportError:  # older cuda-python layout
    from cuda import cuda


def ok(r):
    err = r[0]
    if int(err) != 0:
        print(json.dumps({"error": int(err)}))
        sys.exit(3)
    return r[1:] if len(r) > 2 else (r[1] if len(r) == 2 else None)


ok(cuda.cuInit(0))
dev = ok(cuda.cuDeviceGet(0))
ctx = ok(cuda.cuDevicePrimaryCtxRetain(dev))
ok(cuda.cuCtxSetCurrent(ctx))


def state(rc):
    r = ok(cuda.cuDeviceGetGraphMemAttribute(
        dev, cuda.CUgraphMem_attribute.CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT))
    free, _ = ok(cuda.cuMemGetInfo())
    return {"rc": int(rc), "reserved": int(r), "free": int(free)}


out = {"start": state(0)}
p = cuda.CUDA_MEM_ALLOC_NODE_PARAMS()
p.poolProps.allocType = cuda.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
p.poolProps.location.type = cuda.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
p.poolProps.location.id = int(dev)
p.bytesize = int(sys.argv[1]) << 20
g = ok(cuda.cuGraphCreate(0))
a = ok(cuda.cuGraphAddMemAllocNode(g, None, 0, p))
ok(cuda.cuGraphAddMemFreeNode(g, [a], 1, p.dptr))
e = ok(cuda.cuGraphInstantiate(g, 0))
for i in range(2):
    (err,) = cuda.cuGraphLaunch(e, 0)
    ok(cuda.cuStreamSynchronize(0))
    out["launch%d" % i] = state(err)
(err,) = cuda.cuDeviceGraphMemTrim(dev)
out["trim"] = state(err)
ok(cuda.cuGraphExecDestroy(e))
ok(cuda.cuGraphDestroy(g))
print(json.dumps(out))
