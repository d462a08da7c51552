"""Unmodified nvidia-ml-py (pynvml): the queries monitoring agents make.
Prints one JSON object; shim/tests/coverage.rs checks it."""
import json
import os
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


h = n.nvmlDeviceGetHandleByIndex(0)
uuid = n.nvmlDeviceGetUUID(h)
q("branch", lambda: n.nvmlSystemGetDriverBranch().branch)
q("arch", n.nvmlDeviceGetArchitecture, h)
q("serial", n.nvmlDeviceGetSerial, h)
q("by_uuid_prefixed", lambda: n.nvmlDeviceGetIndex(n.nvmlDeviceGetHandleByUUID(uuid)))
q("by_uuid_bare", lambda: n.nvmlDeviceGetIndex(n.nvmlDeviceGetHandleByUUID(uuid[4:])))
q("by_uuid_upper", lambda: n.nvmlDeviceGetIndex(n.nvmlDeviceGetHandleByUUID(uuid.upper())))
q("by_serial", lambda: n.nvmlDeviceGetIndex(n.nvmlDeviceGetHandleBySerial(n.nvmlDeviceGetSerial(h))))
q("brand", n.nvmlDeviceGetBrand, h)
q("vbios", n.nvmlDeviceGetVbiosVersion, h)
q("clock_sm", n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_SM)
q("max_clock_sm", n.nvmlDeviceGetMaxClockInfo, h, n.NVML_CLOCK_SM)
q("max_clock_mem", n.nvmlDeviceGetMaxClockInfo, h, n.NVML_CLOCK_MEM)
q("power_limit", n.nvmlDeviceGetPowerManagementLimit, h)
q("enforced_limit", n.nvmlDeviceGetEnforcedPowerLimit, h)
q("limit_constraints", lambda: list(n.nvmlDeviceGetPowerManagementLimitConstraints(h)))
q("pstate", n.nvmlDeviceGetPerformanceState, h)
q("energy1", n.nvmlDeviceGetTotalEnergyConsumption, h)
time.sleep(0.2)
q("energy2", n.nvmlDeviceGetTotalEnergyConsumption, h)
q("temp_slowdown", n.nvmlDeviceGetTemperatureThreshold, h, n.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
q("pcie_gen", n.nvmlDeviceGetCurrPcieLinkGeneration, h)
q("pcie_width", n.nvmlDeviceGetCurrPcieLinkWidth, h)
q("pcie_tx", n.nvmlDeviceGetPcieThroughput, h, n.NVML_PCIE_UTIL_TX_BYTES)
q("bar1_total", lambda: n.nvmlDeviceGetBAR1MemoryInfo(h).bar1Total)
q("ecc", lambda: list(n.nvmlDeviceGetEccMode(h)))
q("mig", lambda: list(n.nvmlDeviceGetMigMode(h)))
q("throttle", n.nvmlDeviceGetCurrentClocksEventReasons, h)
q("encoder", lambda: list(n.nvmlDeviceGetEncoderUtilization(h)))
q("decoder", lambda: list(n.nvmlDeviceGetDecoderUtilization(h)))
q("fan_v2", n.nvmlDeviceGetFanSpeed_v2, h, 0)
q("display", n.nvmlDeviceGetDisplayMode, h)
q("remapped", lambda: list(n.nvmlDeviceGetRemappedRows(h)))
q("topology_self", n.nvmlDeviceGetTopologyCommonAncestor, h, h)
q("affinity_nonzero", lambda: any(n.nvmlDeviceGetCpuAffinity(h, 4)))
q("process_name", n.nvmlSystemGetProcessName, os.getpid())
q("unit_count", n.nvmlUnitGetCount)
q("event_types", n.nvmlDeviceGetSupportedEventTypes, h)
es = n.nvmlEventSetCreate()
n.nvmlDeviceRegisterEvents(h, n.nvmlEventTypeXidCriticalError, es)
t0 = time.time()
try:
    n.nvmlEventSetWait_v2(es, 100)
    out["event_wait"] = "event"
except n.NVMLError as e:
    out["event_wait"] = str(e)
out["event_wait_ms"] = (time.time() - t0) * 1000
n.nvmlEventSetFree(es)
n.nvmlShutdown()
print(json.dumps(out))
