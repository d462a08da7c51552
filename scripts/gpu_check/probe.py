#!/usr/bin/env python3
"""The machine as it is without cgpu: GPU, driver, physical memory as CUDA
and NVML report it, which frameworks are there. Writes WORKDIR/probe.json for
the checks and prints the header of the report. Exit status 2: no framework
can reach the GPU (nothing else can be checked)."""

import importlib.util
import json
import os
import sys

import common as c


def nvml_view(env):
    """(tool, dict) of NVML's memory view under `env`: nvidia-smi, else pynvml."""
    if c.NVIDIA_SMI:
        rc, out, err = c.run_cmd(
            [c.NVIDIA_SMI, "-i", c.GPU,
             "--query-gpu=name,driver_version,memory.total,memory.used",
             "--format=csv,noheader,nounits"], env, 30)
        if rc == 0 and out.strip():
            f = [x.strip() for x in out.strip().splitlines()[0].split(",")]
            try:
                return "nvidia-smi", {"name": f[0], "driver": f[1],
                                      "total_mib": int(float(f[2])), "used_mib": int(float(f[3]))}
            except (IndexError, ValueError):
                pass
        return "nvidia-smi", {"error": "rc=%s %s %s" % (rc, out.strip(), err.strip()[-500:])}
    rc, out, err = c.run_cmd([c.PYTHON, os.path.join(c.HERE, "nvml_query.py"), c.GPU], env, 30)
    if rc == 0:
        try:
            d = json.loads(out.strip().splitlines()[-1])
            d["total_mib"] = d["total"] // c.MiB
            d["used_mib"] = d["used"] // c.MiB
            return "pynvml", d
        except (ValueError, IndexError, KeyError):
            pass
    return "pynvml", {"error": "rc=%s %s %s" % (rc, out.strip(), err.strip()[-500:])}


def have_pynvml():
    return importlib.util.find_spec("pynvml") is not None


def main():
    want = c.setting("BACKEND", "auto")
    order = [want] if want != "auto" else ["torch", "cuda"]
    info = None
    errors = {}
    for b in order:
        if b == "torch" and importlib.util.find_spec("torch") is None:
            errors[b] = "not installed"
            continue
        if b == "cuda" and importlib.util.find_spec("cuda") is None:
            errors[b] = "cuda-bindings not installed"
            continue
        try:
            w = c.Worker("probe-" + b, b, c.container_env(preload=False), start_timeout=180)
            info = w.call("info", timeout=60)
            w.close()
            backend = b
            break
        except c.WorkerError as e:
            errors[b] = str(e)
    if info is None:
        c.say("no framework reached the GPU without cgpu: %s" % errors)
        sys.exit(2)

    tool, nv = (None, {})
    if c.NVIDIA_SMI or have_pynvml():
        tool, nv = nvml_view(c.container_env(preload=False))
    nvml_total = None
    if "total" in nv:
        nvml_total = int(nv["total"])
    elif "total_mib" in nv:
        nvml_total = int(nv["total_mib"]) * c.MiB
    phys_for_dev = nvml_total or int(info["total"])
    mem_dev = max(1, int(round(phys_for_dev / c.GiB)))

    extras = {}
    for fw, mod in (("cupy", "cupy"), ("jax", "jax"), ("cuda", "cuda")):
        if fw == backend:
            continue
        extras[fw] = importlib.util.find_spec(mod) is not None

    p = {
        "backend": backend,
        "backend_errors": errors,
        "name": nv.get("name") or info.get("name"),
        "driver": nv.get("driver") or str(info.get("driver") or info.get("cuda_driver_version")),
        "framework": info.get("framework"),
        "cuda_total": int(info["total"]),
        "cuda_free": int(info["free"]),
        "cuda_devtotal": int(info.get("props_total") or 0),
        "nvml_tool": tool,
        "nvml": nv,
        "nvml_total": nvml_total,
        "mem_dev": mem_dev,
        "extras": extras,
    }
    with open(os.path.join(c.WORKDIR, "probe.json"), "w") as f:
        json.dump(p, f, indent=1)
    c.say("GPU:            %s (index %s)" % (p["name"], c.GPU))
    c.say("driver:         %s" % p["driver"])
    c.say("framework:      %s (backend %s)" % (p["framework"], backend))
    c.say("physical total: %d bytes (%d MiB) via CUDA; %s via %s"
          % (p["cuda_total"], p["cuda_total"] // c.MiB,
             ("%d MiB" % (nvml_total // c.MiB)) if nvml_total else "n/a", tool or "no NVML tool"))
    c.say("operator DEV:   %d GiB (ALIYUN_COM_GPU_MEM_DEV used by check 1)" % mem_dev)
    c.say("other frameworks: %s" % (", ".join(k for k, v in extras.items() if v) or "none"))
    if errors:
        c.say("backends not used: %s" % errors)


if __name__ == "__main__":
    main()
