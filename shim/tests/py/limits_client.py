"""Context limits through unmodified cuda-bindings and nvidia-ml-py: what
cuCtxSetLimit reserves on the device, seen by cuMemGetInfo, NVML (device and
process memory) and cgpu-sim-stat --json, read back by cuCtxGetLimit.

Prints one JSON object; shim/tests/python.rs checks it.
Usage: python limits_client.py CGPU_SIM_STAT
"""
import json
import os
import subprocess
import sys

import pynvml as n
from cuda.bindings import driver as d

L = d.CUlimit
stat_bin = sys.argv[1]


def ok(res, what=""):
    if res[0] != d.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{what}: {res[0]!r}")
    return res[1] if len(res) == 2 else res[1:]


n.nvmlInit()
ok(d.cuInit(0))
dev = ok(d.cuDeviceGet(0))
nv = n.nvmlDeviceGetHandleByIndex(0)


def used():
    """Used bytes of device 0, as each client sees it."""
    err, free, total = d.cuMemGetInfo()  # no current context: None
    st = json.loads(subprocess.run([stat_bin, "--json"], check=True, capture_output=True).stdout)
    mine = [p["mem_bytes"] for p in st["processes"] if p["pid"] == os.getpid() and p["alive"]]
    procs = [p.usedGpuMemory for p in n.nvmlDeviceGetComputeRunningProcesses(nv) if p.pid == os.getpid()]
    return {
        "cu": int(total) - int(free) if err == d.CUresult.CUDA_SUCCESS else None,
        "nvml": n.nvmlDeviceGetMemoryInfo(nv).used,
        "nvml_process": procs[0] if procs else None,
        "stat": st["devices"][0]["used_bytes"],
        "stat_process": mine[0] if mine else None,
    }


def get(limit):
    return int(ok(d.cuCtxGetLimit(limit), "cuCtxGetLimit"))


out = {"threads": ok(d.cuDeviceGetAttribute(d.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, dev))
       * ok(d.cuDeviceGetAttribute(d.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev))}
ctx = ok(d.cuCtxCreate(None, 0, dev), "cuCtxCreate")
out["defaults"] = [get(L.CU_LIMIT_STACK_SIZE), get(L.CU_LIMIT_PRINTF_FIFO_SIZE), get(L.CU_LIMIT_MALLOC_HEAP_SIZE)]
out["base"] = used()
ok(d.cuCtxSetLimit(L.CU_LIMIT_STACK_SIZE, 4096), "stack")
out["stack_4k"] = used()
out["stack_read"] = get(L.CU_LIMIT_STACK_SIZE)
ok(d.cuCtxSetLimit(L.CU_LIMIT_MALLOC_HEAP_SIZE, 64 << 20), "heap")
ok(d.cuCtxSetLimit(L.CU_LIMIT_PRINTF_FIFO_SIZE, 4 << 20), "printf")
out["all_three"] = used()
out["heap_read"] = get(L.CU_LIMIT_MALLOC_HEAP_SIZE)
out["printf_read"] = get(L.CU_LIMIT_PRINTF_FIFO_SIZE)
# A reservation that does not fit: refused, nothing changes.
out["stack_huge"] = d.cuCtxSetLimit(L.CU_LIMIT_STACK_SIZE, 1 << 20)[0].name
out["heap_huge"] = d.cuCtxSetLimit(L.CU_LIMIT_MALLOC_HEAP_SIZE, 1 << 50)[0].name
out["after_refusals"] = used()
out["stack_after_refusal"] = get(L.CU_LIMIT_STACK_SIZE)
out["heap_after_refusal"] = get(L.CU_LIMIT_MALLOC_HEAP_SIZE)
# Lowered to below the defaults: the defaults' share stays (the context's own).
ok(d.cuCtxSetLimit(L.CU_LIMIT_STACK_SIZE, 512), "stack down")
out["stack_low"] = used()
out["stack_low_read"] = get(L.CU_LIMIT_STACK_SIZE)
# Other limits are stored and read back (hints clamped), read-only ones refused.
ok(d.cuCtxSetLimit(L.CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT, 4096))
out["pending_read"] = get(L.CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT)
ok(d.cuCtxSetLimit(L.CU_LIMIT_MAX_L2_FETCH_GRANULARITY, 1000))
out["l2_fetch_read"] = get(L.CU_LIMIT_MAX_L2_FETCH_GRANULARITY)
ok(d.cuCtxSetLimit(L.CU_LIMIT_PERSISTING_L2_CACHE_SIZE, 1 << 30))
out["persisting_read"] = get(L.CU_LIMIT_PERSISTING_L2_CACHE_SIZE)
out["persisting_max"] = ok(d.cuDeviceGetAttribute(d.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE, dev))
out["cig_set"] = d.cuCtxSetLimit(L.CU_LIMIT_CIG_ENABLED, 1)[0].name
out["sync_depth_25"] = d.cuCtxSetLimit(L.CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH, 25)[0].name
out["bad_limit"] = d.cuCtxSetLimit(99, 1)[0].name
# The context's end gives it all back; a new context starts from the defaults.
ok(d.cuCtxDestroy(ctx))
out["destroyed"] = used()
ctx = ok(d.cuCtxCreate(None, 0, dev), "cuCtxCreate")
out["new_ctx_stack"] = get(L.CU_LIMIT_STACK_SIZE)
# The primary context: released to zero, everything returns.
ok(d.cuCtxDestroy(ctx))
p = ok(d.cuDevicePrimaryCtxRetain(dev))
ok(d.cuCtxSetCurrent(p))
ok(d.cuCtxSetLimit(L.CU_LIMIT_MALLOC_HEAP_SIZE, 16 << 20), "heap primary")
out["primary_heap"] = used()
ok(d.cuDevicePrimaryCtxRelease(dev))
out["primary_released"] = used()
p = ok(d.cuDevicePrimaryCtxRetain(dev))
ok(d.cuCtxSetCurrent(p))
out["primary_heap_again"] = get(L.CU_LIMIT_MALLOC_HEAP_SIZE)
print(json.dumps(out))
