#!/usr/bin/env python3
"""What the driver holds for each process on one GPU, through nvidia-ml-py
(pynvml): nvmlDeviceGetComputeRunningProcesses' usedGpuMemory. Run without
LD_PRELOAD, so NVML's answer is the driver's, not the container's view.
Prints one JSON object: {"<pid>": bytes, ...} or {"error": "..."}.

usage: nvml_procmem.py INDEX
"""

import sys

from nvml_session import print_query


def used_memory(pynvml, h):
    out = {}
    for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
        if p.usedGpuMemory is not None:
            out[str(p.pid)] = int(p.usedGpuMemory)
    return out


def main():
    print_query(sys.argv[1], used_memory)


if __name__ == "__main__":
    main()
