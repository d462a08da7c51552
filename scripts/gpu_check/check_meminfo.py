#!/usr/bin/env python3
"""Check 1: the memory the container sees.

With ALIYUN_COM_GPU_MEM_CONTAINER=6 and ALIYUN_COM_GPU_MEM_DEV=<GPU's GiB>,
the framework's mem_get_info/cuMemGetInfo total and device total, and NVML
(nvidia-smi, or pynvml where there is no nvidia-smi) under LD_PRELOAD show
floor(physical_bytes * 6 / DEV); without DEV exactly 6 GiB; with
CGPU_DISABLE=true the physical total. NVML's used shows the container's use.
"""

import os

import common as c
from probe import nvml_view

CONTAINER = 6


def nvml_expect(label, exp_bytes_by_source, nv, used_bytes=None):
    """One NVML row. exp_bytes_by_source: [(source, bytes)], the first is the
    one that API's own physical total gives; nvidia-smi prints whole MiB."""
    tool = c.probe().get("nvml_tool") or "NVML"
    if "error" in nv:
        c.result(label % tool, "%d MiB" % (exp_bytes_by_source[0][1] // c.MiB),
                 "error: " + nv["error"][:200], False)
        return
    got = int(nv["total_mib"])
    match = None
    for src, b in exp_bytes_by_source:
        if abs(got - b // c.MiB) <= 1:
            match = src
            break
    ok = match is not None
    measured = "total %d MiB" % got
    if match and match != exp_bytes_by_source[0][0]:
        measured += " (= from %s physical)" % match
    if used_bytes is not None:
        exp_used = used_bytes // c.MiB
        used_ok = abs(int(nv["used_mib"]) - exp_used) <= 2
        measured += ", used %d MiB (container: %d)" % (int(nv["used_mib"]), exp_used)
        ok = ok and used_ok
    c.result(label % tool, "total %d MiB" % (exp_bytes_by_source[0][1] // c.MiB), measured, ok)


def main():
    p = c.probe()
    b = p["backend"]
    fw = "torch.cuda.mem_get_info" if b == "torch" else "cuMemGetInfo"
    devfw = "get_device_properties" if b == "torch" else "cuDeviceTotalMem"
    phys = p["cuda_total"]
    nvml_phys = p.get("nvml_total")
    dev = p["mem_dev"]
    have_nvml = p.get("nvml_tool") is not None

    # the three containers' processes start (import, context) in parallel
    envs = {
        "dev": c.container_env("mem-a", c.new_ledger_dir("mem"),
                               ALIYUN_COM_GPU_MEM_CONTAINER=CONTAINER, ALIYUN_COM_GPU_MEM_DEV=dev),
        "nodev": c.container_env("mem-b", c.new_ledger_dir("mem"),
                                 ALIYUN_COM_GPU_MEM_CONTAINER=CONTAINER),
        "disabled": c.container_env("mem-c", c.new_ledger_dir("mem"), ALIYUN_COM_GPU_MEM_CONTAINER=3,
                                    ALIYUN_COM_GPU_MEM_DEV=dev, CGPU_DISABLE="true"),
    }
    ws = {k: c.Worker("mem-" + k, b, e, wait=False) for k, e in envs.items()}

    # --- CONTAINER + DEV
    tag = "C=%d DEV=%d" % (CONTAINER, dev)
    with c.section("1a %s total, %s" % (fw, tag), "1b %s total, %s" % (devfw, tag),
                   *(["1c NVML memory.total/used, " + tag] if have_nvml else [])):
        with_dev(ws["dev"], envs["dev"], fw, devfw, phys, nvml_phys, dev, have_nvml, tag)
    tag = "C=%d, no DEV" % CONTAINER
    with c.section("1d %s total, %s" % (fw, tag),
                   *(["1e NVML memory.total, " + tag] if have_nvml else [])):
        no_dev(ws["nodev"], envs["nodev"], fw, have_nvml, tag)
    tag = "CGPU_DISABLE=true, C=3"
    with c.section("1f %s total, %s" % (fw, tag),
                   *(["1g NVML memory.total, " + tag] if have_nvml else [])):
        disabled(ws["disabled"], envs["disabled"], fw, phys, nvml_phys, have_nvml, tag)
    if not have_nvml:
        c.result("1c-1g NVML view", "nvidia-smi or pynvml", "neither found", None)


def with_dev(w, env, fw, devfw, phys, nvml_phys, dev, have_nvml, tag):
    exp = phys * CONTAINER // dev
    w.ready()
    m = w.call("meminfo")
    info = w.call("info")
    c.result("1a %s total, %s" % (fw, tag), "%d B (%s)" % (exp, c.fmt_mib(exp)),
             "%d B (%s)" % (m["total"], c.fmt_mib(m["total"])), m["total"] == exp)
    c.result("1b %s total, %s" % (devfw, tag), "%d B" % exp, "%d B" % int(info["props_total"]),
             int(info["props_total"]) == exp)
    if have_nvml:
        # hold 1 GiB so NVML's "used" has something to show
        w.call("fill", chunk=64 * c.MiB, limit=c.GiB)
        m = w.call("meminfo")
        used = m["total"] - m["free"]
        _, nv = nvml_view(env)
        c.say("  NVML view under LD_PRELOAD: %s" % nv)
        srcs = [("NVML", nvml_phys * CONTAINER // dev)] if nvml_phys else []
        srcs.append(("CUDA", exp))
        nvml_expect("1c %%s memory.total/used, %s" % tag, srcs, nv, used)
    w.close()


def no_dev(w, env, fw, have_nvml, tag):
    exp = CONTAINER * c.GiB
    w.ready()
    m = w.call("meminfo")
    c.result("1d %s total, %s" % (fw, tag), "%d B (%s)" % (exp, c.fmt_mib(exp)),
             "%d B (%s)" % (m["total"], c.fmt_mib(m["total"])), m["total"] == exp)
    if have_nvml:
        _, nv = nvml_view(env)
        c.say("  NVML view under LD_PRELOAD: %s" % nv)
        nvml_expect("1e %%s memory.total, %s" % tag, [("spec", exp)], nv)
    w.close()


def disabled(w, env, fw, phys, nvml_phys, have_nvml, tag):
    w.ready()
    m = w.call("meminfo")
    c.result("1f %s total, %s" % (fw, tag), "physical %d B" % phys, "%d B" % m["total"],
             m["total"] == phys)
    if have_nvml:
        _, nv = nvml_view(env)
        c.say("  NVML view under LD_PRELOAD: %s" % nv)
        srcs = [("NVML", nvml_phys)] if nvml_phys else []
        srcs.append(("CUDA", phys))
        nvml_expect("1g %%s memory.total, %s" % tag, srcs, nv)
    w.close()


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    c.main_wrapper(main)
