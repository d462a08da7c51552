#!/usr/bin/env python3
"""Check 8 (--sim only): no function the simulated driver only stubs (answers
"not supported" or a constant without simulating anything) was relied on by
the checks above. The sim counts every call to a stub in its shared state;
`cgpu-sim-stat --json` lists them. A stub on the list below was hit for a
known, harmless reason (the client tolerates the answer and the run passed);
any other is a FAIL naming it: the run's results may rest on it.
"""

import json
import os

import common as c

# stub name -> why being called is harmless
HARMLESS = {
    "TOOLS_RUNTIME_CALLBACK_HOOKS[1]":
        "NVIDIA's runtime notifies tools (profilers) around launches and captures; "
        "it tolerates 'not supported' (no tool attached)",
    "TOOLS_RUNTIME_CALLBACK_HOOKS[4]":
        "same table, the paired notification",
    "TOOLS_CONTEXT[39]": "cuBLASLt 12.9 queries it once; success without output was enough",
    "TOOLS_CONTEXT[51]": "cuBLASLt 12.9 queries it once; success without output was enough",
}


def main():
    name = "8a stubs of the simulated driver"
    stat = c.setting("SIM_STAT")
    state = os.environ.get("CGPU_SIM_STATE", "")
    if not stat or not state:
        c.result(name, "cgpu-sim-stat next to libcgpu_sim.so", "not found", None)
        return
    rc, out, err = c.run_cmd([stat, "--state", state, "--json"], os.environ.copy(), 15)
    if rc != 0:
        c.result(name, "cgpu-sim-stat --json", "exit %s: %s" % (rc, err.strip()[:200]), False)
        return
    stubs = json.loads(out).get("stubs", [])
    for s in stubs:
        c.say("  stub %s: %d calls%s" % (s["name"], s["calls"],
                                          " (harmless: %s)" % HARMLESS[s["name"]]
                                          if s["name"] in HARMLESS else ""))
    bad = [s for s in stubs if s["name"] not in HARMLESS]
    known = [s for s in stubs if s["name"] in HARMLESS]
    parts = []
    if bad:
        parts.append("relied on: " + ", ".join("%s (%d)" % (s["name"], s["calls"]) for s in bad))
    if known:
        parts.append("harmless: " + ", ".join("%s (%d)" % (s["name"], s["calls"]) for s in known))
    measured = "; ".join(parts) or "none"
    c.result(name, "none, or only known-harmless ones (listed in the log)", measured, not bad)


if __name__ == "__main__":
    c.main_wrapper(main)
