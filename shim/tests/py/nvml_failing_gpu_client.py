"""A GPU made to fail, seen through unmodified nvidia-ml-py: XID errors
arrive on an event set, a lost GPU answers NVML_ERROR_GPU_IS_LOST.
Argument: the sim's state directory."""
import ctypes
import json
import os
import sys

import pynvml as n

state = sys.argv[1]


def addr(h):
    return ctypes.cast(h, ctypes.c_void_p).value


out = {}
n.nvmlInit()
h0 = n.nvmlDeviceGetHandleByIndex(0)
h1 = n.nvmlDeviceGetHandleByIndex(1)
uuid1 = n.nvmlDeviceGetUUID(h1)
es = n.nvmlEventSetCreate()
# An error reported before the registration is not delivered.
with open(os.path.join(state, "gpu0.xid"), "w") as f:
    f.write("31\n")
n.nvmlDeviceRegisterEvents(h0, n.nvmlEventTypeXidCriticalError, es)
n.nvmlDeviceRegisterEvents(h1, n.nvmlEventTypeXidCriticalError, es)
with open(os.path.join(state, "gpu0.xid"), "a") as f:
    f.write("48\n")
open(os.path.join(state, "gpu1.lost"), "w").close()
events = []
while True:
    try:
        e = n.nvmlEventSetWait_v2(es, 2000)
    except n.NVMLError as err:
        out["last_wait"] = str(err)
        break
    events.append([[addr(h0), addr(h1)].index(addr(e.device)), e.eventType, e.eventData])
out["events"] = events
out["count"] = n.nvmlDeviceGetCount()
for name, f in [("handle1", lambda: n.nvmlDeviceGetHandleByIndex(1)),
                ("memory1", lambda: n.nvmlDeviceGetMemoryInfo(h1)),
                ("uuid1", lambda: n.nvmlDeviceGetHandleByUUID(uuid1)),
                ("name0", lambda: n.nvmlDeviceGetName(h0))]:
    try:
        r = f()
        out[name] = r if isinstance(r, str) else "ok"
    except n.NVMLError as err:
        out[name] = str(err)
n.nvmlEventSetFree(es)
n.nvmlShutdown()
print(json.dumps(out))
