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

import sys
import time

from nvml_session import print_query


def sm_utilisation(secs):
    def query(pynvml, h):
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
        return {"samples": n, "sm": sm}

    return query


def main():
    idx, secs = int(sys.argv[1]), float(sys.argv[2])
    print_query(idx, sm_utilisation(secs))


if __name__ == "__main__":
    main()
