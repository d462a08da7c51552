#!/usr/bin/env python3
"""NVML's per-process utilisation of one GPU over a window, through
nvidia-ml-py (pynvml): nvmlDeviceGetProcessUtilization polled every 0.2 s
(asking each time only for samples newer than the last one seen), SM
utilisation summed per process. The sums are in proportion to the device
time each process got (every sample covers the same period for all
processes), which is what the weight check compares. Prints one JSON object:
{"samples": N, "sm": {"<pid>": summed smUtil, ...}} or {"error": "..."}.

usage: nvml_procutil.py INDEX SECONDS
"""

import json
import sys
import time


def main():
    idx, secs = int(sys.argv[1]), float(sys.argv[2])
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as e:  # no pynvml, no NVML
        print(json.dumps({"error": "NVML: %s" % e}))
        return
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(idx)
        sm, n = {}, 0
        last = int(time.time() * 1e6)  # NVML timestamps: CPU microseconds
        end = time.time() + secs
        while time.time() < end:
            time.sleep(0.2)
            try:
                samples = pynvml.nvmlDeviceGetProcessUtilization(h, last)
            except pynvml.NVMLError as e:
                if "Not Found" in str(e):  # no new sample yet
                    continue
                raise
            for s in samples:
                sm[str(s.pid)] = sm.get(str(s.pid), 0) + int(s.smUtil)
                last = max(last, int(s.timeStamp))
                n += 1
        print(json.dumps({"samples": n, "sm": sm}))
    except Exception as e:
        print(json.dumps({"error": "%s: %s" % (type(e).__name__, e)}))
    finally:
        pynvml.nvmlShutdown()


if __name__ == "__main__":
    main()
