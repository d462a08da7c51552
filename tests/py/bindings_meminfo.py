#!/usr/bin/env python3
"""Unmodified NVIDIA cuda-bindings (cuGetProcAddress_v2 entry path): init,
context, cuMemGetInfo, cuDeviceTotalMem, an allocation that fits and one that
does not. Prints one JSON line."""
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
free, total = ok(cuda.cuMemGetInfo())
devtotal = ok(cuda.cuDeviceTotalMem(dev))
want = int(sys.argv[1]) if len(sys.argv) > 1 else 1 << 20
err, ptr = cuda.cuMemAlloc(want)
rc_fit = int(err)
err2, _ = cuda.cuMemAlloc(int(total) + (1 << 30))
free2, _ = ok(cuda.cuMemGetInfo())
if rc_fit == 0:
    ok(cuda.cuMemFree(ptr))
# A second context through cuCtxCreate (the v4 ABI in 13.x bindings): its
# reservation counts, and is given back when it is destroyed.
ctx2 = ok(cuda.cuCtxCreate(None, 0, dev))
free3, _ = ok(cuda.cuMemGetInfo())
ok(cuda.cuCtxDestroy(ctx2))
ok(cuda.cuCtxSetCurrent(ctx))
free4, _ = ok(cuda.cuMemGetInfo())
print(json.dumps({"free": int(free), "total": int(total), "devtotal": int(devtotal),
                  "alloc_rc": rc_fit, "over_rc": int(err2), "free_after_alloc": int(free2),
                  "free_with_ctx2": int(free3), "free_after_ctx2": int(free4)}))
