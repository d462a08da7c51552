"""Unmodified nvidia-ml-py (pynvml) on the simulated NVML. Prints JSON."""
import json

import pynvml as n

n.nvmlInit()
out = {"driver": n.nvmlSystemGetDriverVersion(), "cuda": n.nvmlSystemGetCudaDriverVersion(), "devices": []}
for i in range(n.nvmlDeviceGetCount()):
    h = n.nvmlDeviceGetHandleByIndex(i)
    m = n.nvmlDeviceGetMemoryInfo(h)
    m2 = n.nvmlDeviceGetMemoryInfo(h, version=n.nvmlMemory_v2)
    procs = n.nvmlDeviceGetComputeRunningProcesses(h)
    out["devices"].append({
        "name": n.nvmlDeviceGetName(h),
        "uuid": n.nvmlDeviceGetUUID(h),
        "total": m.total, "used": m.used, "free": m.free,
        "v2": {"total": m2.total, "used": m2.used, "free": m2.free, "reserved": m2.reserved},
        "procs": [[p.pid, p.usedGpuMemory] for p in procs],
        "util": n.nvmlDeviceGetUtilizationRates(h).gpu,
        "cc": list(n.nvmlDeviceGetCudaComputeCapability(h)),
        "bus": n.nvmlDeviceGetPciInfo(h).busId,
    })
try:
    n.nvmlDeviceGetHandleByIndex(99)
    out["bad_index"] = "no error"
except n.NVMLError as e:
    out["bad_index"] = str(e)
n.nvmlShutdown()
print(json.dumps(out))
