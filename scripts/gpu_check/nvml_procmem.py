#!/usr/bin/env python3
"""What the driver holds for each process on one GPU, through nvidia-ml-py
(pynvml): nvmlDeviceGetComputeRunningProcesses' usedGpuMemory. Run without
LD_PRELOAD, so NVML's answer is the driver's, not the container's view.
Prints one JSON object: {"<pid>": bytes, ...} or {"error": "..."}.

usage: nvml_procmem.py INDEX
"""

import json
import sys


def main():
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as e:  # no pynvml, no NVML
        print(json.dumps({"error": "NVML: %s" % e}))
        return
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(int(sys.argv[1]))
        out = {}
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
            if p.usedGpuMemory is not None:
                out[str(p.pid)] = int(p.usedGpuMemory)
        print(json.dumps(out))
    except Exception as e:
        print(json.dumps({"error": "%s: %s" % (type(e).__name__, e)}))
    finally:
        pynvml.nvmlShutdown()


if __name__ == "__main__":
    main()
