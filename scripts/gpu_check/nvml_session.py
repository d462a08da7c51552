"""One NVML session on one GPU through nvidia-ml-py (pynvml), for the helper
scripts that read NVML without LD_PRELOAD: initialise, ask, print the answer
as one JSON object, shut down. A missing pynvml or NVML, or a failing query,
prints {"error": "..."} instead (the caller reports it; nothing raises).
"""

import json


def print_query(index, query):
    """Prints query(pynvml, handle of GPU `index`), a JSON-serialisable
    object, or {"error": "..."} (a bad `index` too)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as e:  # no pynvml, no NVML
        print(json.dumps({"error": "NVML: %s" % e}))
        return
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(int(index))
        print(json.dumps(query(pynvml, h)))
    except Exception as e:
        print(json.dumps({"error": "%s: %s" % (type(e).__name__, e)}))
    finally:
        pynvml.nvmlShutdown()
