#!/usr/bin/env python3
"""Check 1: the memory the container sees.

With ALIYUN_COM_GPU_MEM_CONTAINER=6 and ALIYUN_COM_GPU_MEM_DEV=<GPU's GiB>,
the framework's mem_get_info/cuMemGetInfo total and device total, and NVML
(nvidia-smi, or pynvml where there is no nvidia-smi) under LD_PRELOAD show
floor(physical_bytes * 6 / DEV); without DEV exactly 6 GiB; with
CGPU_DISABLE=true the physical total. NVML's used shows the container's use.

1h/1i a multi-GPU container with one quota per GPU,
ALIYUN_COM_GPU_MEM_CONTAINER=3,4,5,6: on the simulated driver four A10s of
23028 MiB with ALIYUN_COM_GPU_MEM_DEV=23 (3003, 4004,
5006 and 6007 MiB); on a real machine every GPU it has (the list cut to
their number) with the operator DEV of GPU 0. Each GPU's total through the
framework (mem_get_info(i), device total) and through NVML is
floor(physical_i * C_i / DEV), physical_i read without cgpu.
"""

import json
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
    with c.section("1h %s per GPU, C=3,4,5,6" % fw,
                   *(["1i NVML memory.total per GPU, C=3,4,5,6"] if have_nvml else [])):
        per_gpu(b, fw, dev, have_nvml)


A10_MIB = 23028
LIST = (3, 4, 5, 6)


def nvml_totals(env, n):
    """NVML memory.total in MiB of GPUs 0..n-1 under `env` (nvidia-smi, else pynvml)."""
    out = []
    for i in range(n):
        if c.NVIDIA_SMI:
            rc, o, e = c.run_cmd([c.NVIDIA_SMI, "-i", str(i), "--query-gpu=memory.total",
                                  "--format=csv,noheader,nounits"], env, 30)
            out.append(int(float(o.strip().splitlines()[0])) if rc == 0 and o.strip() else None)
        else:
            rc, o, e = c.run_cmd([c.PYTHON, os.path.join(c.HERE, "nvml_query.py"), str(i)], env, 30)
            try:
                out.append(int(json.loads(o.strip().splitlines()[-1])["total"]) // c.MiB)
            except (ValueError, IndexError, KeyError):
                c.say("  nvml_query.py %d: rc=%s %s %s" % (i, rc, o.strip(), e.strip()[-300:]))
                out.append(None)
    return out


def per_gpu(b, fw, dev, have_nvml):
    extra = {}
    if c.SIM:
        # a simulated machine of its own: four A10s, counted as 23 GiB each
        extra = {"CGPU_SIM_STATE": os.path.join(c.WORKDIR, "simstate-4xa10"),
                 "CGPU_SIM_GPUS": ",".join(["%d:NVIDIA A10" % A10_MIB] * 4)}
        dev = 23
    bare = c.base_env()
    bare.pop("CUDA_VISIBLE_DEVICES", None)  # every GPU of the machine
    bare.update(extra)
    w = c.Worker("gpus-bare", b, bare)
    phys = w.call("devices")["devices"]
    w.close()
    n = min(len(phys), len(LIST))
    quota = ",".join(str(x) for x in LIST[:n])
    env = c.container_env("mem-list", c.new_ledger_dir("mem"),
                          ALIYUN_COM_GPU_MEM_CONTAINER=quota, ALIYUN_COM_GPU_MEM_DEV=dev, **extra)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    w = c.Worker("gpus-list", b, env)
    got = w.call("devices")["devices"]
    exp = [phys[i]["total"] * LIST[i] // dev for i in range(n)]
    what = "%d x %s, DEV=%d" % (n, phys[0]["name"], dev)
    c.result("1h %s per GPU, C=%s" % (fw, quota),
             "%s MiB on %s" % ("/".join(str(x // c.MiB) for x in exp), what),
             "%s MiB (%s); device totals %s" % (
                 "/".join(str(g["total"] // c.MiB) for g in got),
                 "exact bytes" if [g["total"] for g in got[:n]] == exp else "bytes differ",
                 "equal" if [g["props_total"] for g in got[:n]] == exp else
                 "/".join(str(g["props_total"]) for g in got)),
             len(got) == n and [g["total"] for g in got] == exp
             and [g["props_total"] for g in got] == exp)
    if have_nvml:
        nv = nvml_totals(env, n)
        c.result("1i NVML memory.total per GPU, C=%s" % quota,
                 "%s MiB" % "/".join(str(x // c.MiB) for x in exp),
                 "/".join(str(x) for x in nv) + " MiB",
                 all(x is not None and abs(x - e // c.MiB) <= 1 for x, e in zip(nv, exp)))
    w.close()


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
