#!/usr/bin/env python3
"""NVML's view of one GPU through nvidia-ml-py (pynvml), for machines without
nvidia-smi (the simulated driver). Prints one JSON object.

usage: nvml_query.py INDEX
"""

import json
import sys


def main():
    import pynvml

    idx = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    pynvml.nvmlInit()
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(idx)
        name = pynvml.nvmlDeviceGetName(h)
        drv = pynvml.nvmlSystemGetDriverVersion()
        m = pynvml.nvmlDeviceGetMemoryInfo(h)
        out = {
            "name": name.decode() if isinstance(name, bytes) else name,
            "driver": drv.decode() if isinstance(drv, bytes) else drv,
            "total": int(m.total),
            "used": int(m.used),
            "free": int(m.free),
        }
        try:
            m2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
            out["v2"] = {"total": int(m2.total), "used": int(m2.used), "free": int(m2.free),
                         "reserved": int(m2.reserved)}
        except Exception as e:  # older drivers / bindings
            out["v2_error"] = str(e)
    finally:
        pynvml.nvmlShutdown()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
