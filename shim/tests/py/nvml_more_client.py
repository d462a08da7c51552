"""Unmodified nvidia-ml-py (pynvml): CPU and memory affinity, extended PCI
info, field values, retired pages, versioned temperature, capabilities and
UUID look-up, topology, performance states, fans and coolers, system event
sets. Prints one JSON object; shim/tests/nvml_more.rs checks it."""
import ctypes
import json
import time

import pynvml as n

n.nvmlInit()
out = {}


def q(name, f, *args):
    try:
        v = f(*args)
        if isinstance(v, bytes):
            v = v.decode()
        out[name] = v
    except n.NVMLError as e:
        out[name] = f"error: {e}"


h0 = n.nvmlDeviceGetHandleByIndex(0)
h1 = n.nvmlDeviceGetHandleByIndex(1)
idx = n.nvmlDeviceGetIndex
uuid = n.nvmlDeviceGetUUID(h1)
if isinstance(uuid, bytes):
    uuid = uuid.decode()

q("cpu_affinity_scope", lambda: list(n.nvmlDeviceGetCpuAffinityWithinScope(h0, 1, 0)))
q("mem_affinity", lambda: list(n.nvmlDeviceGetMemoryAffinity(h0, 1, 0)))
q("set_cpu_affinity", lambda: n.nvmlDeviceSetCpuAffinity(h0))
q("clear_cpu_affinity", lambda: n.nvmlDeviceClearCpuAffinity(h0))


def pci_ext():
    info = n.nvmlPciInfoExt_v1_t()
    info.version = n.nvmlPciInfoExt_v1
    n.nvmlDeviceGetPciInfoExt(h1, ctypes.byref(info))
    bus_id = info.busId.decode() if isinstance(info.busId, bytes) else info.busId
    return [info.bus, info.baseClass, info.subClass, bus_id, info.pciDeviceId]


q("pci_ext", pci_ext)
q("pci_v3_bus", lambda: n.nvmlDeviceGetPciInfo_v3(h1).bus)
q(
    "fields",
    lambda: [v.nvmlReturn for v in n.nvmlDeviceGetFieldValues(h0, [n.NVML_FI_DEV_NVLINK_LINK_COUNT])],
)
q("retired", lambda: list(n.nvmlDeviceGetRetiredPages(h0, 0)))
q("retired_v2", lambda: [list(x) for x in n.nvmlDeviceGetRetiredPages_v2(h0, 1)])
q("temperature_v", lambda: n.nvmlDeviceGetTemperatureV(h0, n.NVML_TEMPERATURE_GPU))


def caps():
    c = n.c_nvmlDeviceCapabilities_v1_t()
    c.version = n.nvmlDeviceCapabilities_v1
    rc = n.nvmlDeviceGetCapabilities(h0, ctypes.byref(c))
    return [rc, c.capMask]


q("capabilities", caps)
q("by_uuid_v_ascii", lambda: idx(n.nvmlDeviceGetHandleByUUIDV(uuid.encode(), n.NVML_UUID_TYPE_ASCII)))
q("nearest_hostbridge", lambda: [idx(x) for x in n.nvmlDeviceGetTopologyNearestGpus(h0, n.NVML_TOPOLOGY_HOSTBRIDGE)])
q("nearest_single", lambda: [idx(x) for x in n.nvmlDeviceGetTopologyNearestGpus(h0, n.NVML_TOPOLOGY_SINGLE)])
q("gpu_set", lambda: [idx(x) for x in n.nvmlSystemGetTopologyGpuSet(0)])
q("pstates", lambda: list(n.nvmlDeviceGetSupportedPerformanceStates(h0)))
q("fan_rpm", n.nvmlDeviceGetFanSpeedRPM, h0)
q("fan_target", n.nvmlDeviceGetTargetFanSpeed, h0, 0)
q("fan_minmax", lambda: list(n.nvmlDeviceGetMinMaxFanSpeed(h0)))
q("fan_policy", n.nvmlDeviceGetFanControlPolicy_v2, h0, 0)
q("cooler", lambda: list(n.nvmlDeviceGetCoolerInfo(h0)))
q("set_fan", n.nvmlDeviceSetFanSpeed_v2, h0, 0, 50)


def system_events():
    s = n.nvmlSystemEventSetCreate(n.nvmlSystemEventSetCreateRequest_v1)
    n.nvmlSystemRegisterEvents(
        n.nvmlSystemRegisterEventRequest_v1,
        n.nvmlSystemEventTypeGpuDriverUnbind | n.nvmlSystemEventTypeGpuDriverBind,
        s,
    )
    data = (n.c_nvmlSystemEventData_v1_t * 4)()
    t0 = time.monotonic()
    # A timeout with no event: pynvml returns no events.
    waited = n.nvmlSystemEventSetWait(n.nvmlSystemEventSetWaitRequest_v1, s, 50, data, 4)
    ms = (time.monotonic() - t0) * 1000
    n.nvmlSystemEventSetFree(n.nvmlSystemEventSetFreeRequest_v1, s)
    return [waited, ms >= 50]


q("system_events", system_events)
print(json.dumps(out))
