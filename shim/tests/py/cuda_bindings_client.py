"""Unmodified NVIDIA cuda-bindings on the simulated driver.

Prints one JSON object with what it saw; shim/tests/python.rs checks it.
Usage: python cuda_bindings_client.py CHUNK_BYTES SPIN_NS SPIN_COUNT
"""
import ctypes
import json
import sys
import time

from cuda.bindings import driver as d

CHUNK, SPIN_NS, SPIN_COUNT = (int(a) for a in sys.argv[1:4])
PTX = b""".version 7.0
.target sm_52
.address_size 64
.visible .entry cgpu_sim_spin(.param .u64 ns)
{
  ret;
}
"""


def ok(res):
    err = res[0]
    if err != d.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{err!r}")
    return res[1] if len(res) == 2 else res[1:]


out = {}
ok(d.cuInit(0))
out["driver_version"] = ok(d.cuDriverGetVersion())
out["count"] = ok(d.cuDeviceGetCount())
dev = ok(d.cuDeviceGet(0))
out["name"] = ok(d.cuDeviceGetName(256, dev)).split(b"\0")[0].decode()
out["total"] = ok(d.cuDeviceTotalMem(dev))
out["cc"] = [
    ok(d.cuDeviceGetAttribute(d.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)),
    ok(d.cuDeviceGetAttribute(d.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)),
]

# A created context (13.x bindings call cuCtxCreate with the v4 signature).
ctx = ok(d.cuCtxCreate(None, 0, dev))
out["ctx_device"] = int(ok(d.cuCtxGetDevice()))
free0, total0 = ok(d.cuMemGetInfo())
out["meminfo"] = [free0, total0]

# Allocate until CUDA_ERROR_OUT_OF_MEMORY.
ptrs = []
while True:
    err, p = d.cuMemAlloc(CHUNK)
    if err != d.CUresult.CUDA_SUCCESS:
        out["oom_error"] = err.name
        break
    ptrs.append(p)
out["oom_count"] = len(ptrs)
out["free_at_oom"] = ok(d.cuMemGetInfo())[0]
for p in ptrs:
    ok(d.cuMemFree(p))
out["free_after"] = ok(d.cuMemGetInfo())[0]

# Copies round-trip bytes.
n = 1 << 20
src = bytes((i * 7 + 3) % 256 for i in range(n))
dst = bytearray(n)
a = ok(d.cuMemAlloc(n))
b = ok(d.cuMemAlloc(n))
ok(d.cuMemcpyHtoD(a, src, n))
ok(d.cuMemcpyDtoD(b, a, n))
ok(d.cuMemsetD8(a, 0, 16))
ok(d.cuMemcpyDtoH(dst, b, n))
out["copy_ok"] = bytes(dst) == src
stream = ok(d.cuStreamCreate(0))
ok(d.cuMemcpyHtoDAsync(a, src, n, stream))
dst2 = bytearray(n)
ok(d.cuMemcpyDtoHAsync(dst2, a, n, stream))
ok(d.cuStreamSynchronize(stream))
out["async_copy_ok"] = bytes(dst2) == src

# A cgpu_sim_spin launch timed with events.
mod = ok(d.cuModuleLoadData(PTX))
fn = ok(d.cuModuleGetFunction(mod, b"cgpu_sim_spin"))
err, _ = d.cuModuleGetFunction(mod, b"not_there")
out["missing_kernel_error"] = err.name
e0 = ok(d.cuEventCreate(0))
e1 = ok(d.cuEventCreate(0))
t0 = time.monotonic()
ok(d.cuEventRecord(e0, stream))
for _ in range(SPIN_COUNT):
    ok(d.cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, stream, ((SPIN_NS,), (ctypes.c_uint64,)), 0))
ok(d.cuEventRecord(e1, stream))
ok(d.cuEventSynchronize(e1))
out["wall_ms"] = (time.monotonic() - t0) * 1000
out["elapsed_ms"] = ok(d.cuEventElapsedTime(e0, e1))

# Libraries and kernels (context-independent loading), launched as functions.
lib = ok(d.cuLibraryLoadData(PTX, None, None, 0, None, None, 0))
kern = ok(d.cuLibraryGetKernel(lib, b"cgpu_sim_spin"))
kfn = ok(d.cuKernelGetFunction(kern))
e2 = ok(d.cuEventCreate(0))
ok(d.cuEventRecord(e0, stream))
ok(d.cuLaunchKernel(kfn, 1, 1, 1, 32, 1, 1, 0, stream, ((3_000_000,), (ctypes.c_uint64,)), 0))
ok(d.cuEventRecord(e2, stream))
ok(d.cuEventSynchronize(e2))
out["library_kernel_ms"] = ok(d.cuEventElapsedTime(e0, e2))
ok(d.cuLibraryUnload(lib))

# Stream-ordered allocation from the default pool.
pool = ok(d.cuDeviceGetDefaultMemPool(dev))
before = ok(d.cuMemGetInfo())[0]
pp = ok(d.cuMemAllocFromPoolAsync(1 << 20, pool, stream))
out["pool_charged"] = before - ok(d.cuMemGetInfo())[0]
ok(d.cuMemFreeAsync(pp, stream))
ok(d.cuStreamSynchronize(stream))
out["pool_returned"] = ok(d.cuMemGetInfo())[0] == before
ok(d.cuStreamDestroy(stream))
ok(d.cuMemFree(a))
ok(d.cuMemFree(b))
ok(d.cuCtxDestroy(ctx))
print(json.dumps(out))
