#!/usr/bin/env python3
"""Unmodified nvidia-ml-py (pynvml): what nvidia-smi reads. Prints one JSON line."""
import json
import os
import pynvml as N

N.nvmlInit()
n = N.nvmlDeviceGetCount()
h = N.nvmlDeviceGetHandleByIndex(0)
m = N.nvmlDeviceGetMemoryInfo(h)
try:
    m2 = N.nvmlDeviceGetMemoryInfo(h, version=N.nvmlMemory_v2)
    v2 = {"total": m2.total, "free": m2.free, "used": m2.used}
except Exception as e:  # older pynvml
    v2 = {"error": str(e)}
procs = [(p.pid, p.usedGpuMemory) for p in N.nvmlDeviceGetComputeRunningProcesses(h)]
uuid = N.nvmlDeviceGetUUID(h)
print(json.dumps({"count": n, "uuid": uuid if isinstance(uuid, str) else uuid.decode(),
                  "v1": {"total": m.total, "free": m.free, "used": m.used}, "v2": v2,
                  "procs": procs, "me": os.getpid()}))
N.nvmlShutdown()
