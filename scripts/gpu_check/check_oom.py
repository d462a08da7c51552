#!/usr/bin/env python3
"""Check 2: allocating past the quota fails the way the framework fails on a
full GPU (torch.cuda.OutOfMemoryError / CUDA_ERROR_OUT_OF_MEMORY), with the
default allocator and with expandable segments (cuMemCreate + cuMemMap), and
memory freed is usable again.

2e/2f (PyTorch): cuBLAS workspaces, with CUBLAS_WORKSPACE_CONFIG=:65536:4
(256 MiB, large enough to tell apart). 2e: after a warm-up matmul, a matmul
on a fresh stream makes PyTorch allocate that stream's workspace; the
container's used memory (mem_get_info under cgpu) grows by exactly what
PyTorch reserved, the workspace, and by what the same step costs a process
without cgpu on the driver. 2f: the quota filled to 128 MiB free, a matmul
on another fresh stream needs a workspace that does not fit: PyTorch raises
torch.cuda.OutOfMemoryError (as on a full GPU), the container's memory does
not move, and after the filler is freed the same stream's matmul runs.

2g: what the driver holds for a process (NVML's per-process used memory,
read by a process without LD_PRELOAD) against what cgpu charges for it,
after the training-like loop of check 5 (cuBLAS, cuDNN and the framework's
own kernels loaded, their workspaces allocated). The difference is what the
quota does not see: the memory a driver takes for loaded modules (code and
`__device__` variables), which cgpu does not count; it must be smaller than
the context's own reservation (docs/memory.md: module memory is not counted), and cgpu must
not charge more than the driver holds.
"""

import json
import os

import common as c

QUOTA_GIB = 2
CHUNK = 64 * c.MiB


def spawn(b, label, vmm, extra_env):
    env = c.container_env("oom-" + label, c.new_ledger_dir("oom"),
                          ALIYUN_COM_GPU_MEM_CONTAINER=QUOTA_GIB, **extra_env)
    return c.Worker("oom-" + label, b, env, wait=False, vmm=vmm)


def variant(b, w, label, ids):
    q = QUOTA_GIB * c.GiB
    want = "torch.cuda.OutOfMemoryError" if b == "torch" else "CUDA_ERROR_OUT_OF_MEMORY"
    w.ready()
    m0 = w.call("meminfo")
    free0 = m0["free"]
    big = w.call("alloc", bytes=q + c.GiB)
    f1 = w.call("fill", chunk=CHUNK, limit=q + 2 * c.GiB, timeout=180)
    m1 = w.call("meminfo")
    w.call("free")
    m2 = w.call("meminfo")
    f2 = w.call("fill", chunk=CHUNK, limit=q + 2 * c.GiB, timeout=180)
    w.call("free")
    w.close()

    ok_big = big["oom"] and big["error"] == want
    ok_fill = (f1["oom"] and f1["error"] == want and f1["bytes"] <= min(free0, q)
               and f1["bytes"] >= free0 - 3 * CHUNK)
    c.result("%s over quota -> OOM (%s)" % (ids[0], label),
             "%s; quota+1GiB refused; fill stops at free %.2f GiB"
             % (want.split(".")[-1], free0 / c.GiB),
             "big: %s; fill: %s at %.2f GiB, free left %.0f MiB"
             % (big["error"] or "succeeded!", f1["error"] or "no error", f1["bytes"] / c.GiB,
                m1["free"] / c.MiB),
             ok_big and ok_fill)
    ok_reuse = (m2["free"] >= free0 - CHUNK and f2["bytes"] >= f1["bytes"] - CHUNK
                and f2["bytes"] <= min(free0, q) and f2["oom"])
    c.result("%s freed memory usable again (%s)" % (ids[1], label),
             "free back to %.2f GiB, same fill again" % (free0 / c.GiB),
             "free %.2f GiB, refill %.2f GiB" % (m2["free"] / c.GiB, f2["bytes"] / c.GiB),
             ok_reuse)


WS_CONFIG = ":65536:4"
WS = 65536 * 1024 * 4
LEAVE = 128 * c.MiB


def blas_workspace(b):
    n1, n2 = "2e cuBLAS workspace charged to the quota", "2f cuBLAS workspace that does not fit"
    if b != "torch":
        for n in (n1, n2):
            c.result(n, "PyTorch (cuBLAS)", "backend %s has no cuBLAS" % b, None)
        return
    with c.section(n1, n2):
        bare = c.Worker("ws-bare", b, c.container_env(preload=False, CUBLAS_WORKSPACE_CONFIG=WS_CONFIG),
                        wait=False)
        w = c.Worker("ws-cgpu", b, c.container_env("oom-ws", c.new_ledger_dir("oom"),
                                                   ALIYUN_COM_GPU_MEM_CONTAINER=QUOTA_GIB,
                                                   CUBLAS_WORKSPACE_CONFIG=WS_CONFIG), wait=False)
        bare.ready()
        rb = bare.call("blas_ws", leave=-1, timeout=120)
        bare.close()
        w.ready()
        r = w.call("blas_ws", leave=LEAVE, timeout=180)
        w.close()
        mib = lambda x: "%.1f MiB" % (x / c.MiB)  # noqa: E731
        # a real driver may round a block to its page size: 2 MiB either way there
        near = rb["fresh_used"] == WS if c.SIM else abs(rb["fresh_used"] - WS) <= 2 * c.MiB
        c.result(n1, "fresh stream: used, torch reserved, driver without cgpu: all +%s" % mib(WS),
                 "used +%s, torch reserved +%s, driver (no cgpu) +%s"
                 % (mib(r["fresh_used"]), mib(r["fresh_reserved"]), mib(rb["fresh_used"])),
                 r["fresh_used"] == r["fresh_reserved"] == WS and near)
        ok = (r["full_error"] is not None and r.get("full_oom") and r["after_delta"] == 0
              and r["after_used"] <= r["total"] and r["recovered"])
        c.result(n2, "%s free: torch.cuda.OutOfMemoryError, used unchanged, runs after free"
                 % mib(LEAVE),
                 "%s free: %s; used %+d B (%s of %s); after free: %s"
                 % (mib(r["filled_free"]), (r["full_error"] or "no error (it fit)")[:90],
                    r["after_delta"], mib(r["after_used"]), mib(r["total"]),
                    "ran" if r["recovered"] else "failed"),
                 ok)


def nvml_procmem():
    rc, out, err = c.run_cmd([c.PYTHON, os.path.join(c.HERE, "nvml_procmem.py"), c.GPU],
                             c.base_env(), 30)
    try:
        return json.loads(out.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": "nvml_procmem.py: rc=%s %s" % (rc, (out + err).strip()[-300:])}


def driver_view(b):
    name = "2g driver's memory for a process vs its charge, after training"
    with c.section(name):
        w = c.Worker("drv", b, c.container_env("oom-drv", c.new_ledger_dir("oom"),
                                               ALIYUN_COM_GPU_MEM_CONTAINER=QUOTA_GIB))
        p0 = w.call("procmem")  # the context (and the framework's first block)
        w.call("train", seconds=1.0 if c.SIM else 3.0, timeout=180)
        p1 = w.call("procmem")
        drv = nvml_procmem()
        w.close()
        charged = p1["total"] - p1["free"]
        held = drv.get(str(p1["pid"]))
        if held is None:
            c.result(name, "NVML lists the process", "not listed: %s" % drv, False)
            return
        ctx = (p0["total"] - p0["free"]) - p0["framework_reserved"]
        missing = held - charged
        mib = lambda x: "%.2f MiB" % (x / c.MiB)  # noqa: E731
        c.result(name, "0 <= driver - charged < context (%s)" % mib(ctx),
                 "driver %s, charged %s: %d B not counted (%.2f%% of the quota)"
                 % (mib(held), mib(charged), missing,
                    100.0 * missing / (QUOTA_GIB * c.GiB)),
                 0 <= missing < ctx)


def main():
    b = c.probe()["backend"]
    if b == "torch":
        runs = [("default allocator", False, {}),
                ("expandable_segments", False,
                 {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})]
    else:
        runs = [("cuMemAlloc", False, {}), ("cuMemCreate+cuMemMap", True, {})]
    # both containers' processes start at once; they fill one after the other
    ws = [spawn(b, label, vmm, env) for label, vmm, env in runs]
    for i, (label, vmm, env) in enumerate(runs):
        ids = ("2a", "2b") if i == 0 else ("2c", "2d")
        with c.section("%s over quota -> OOM (%s)" % (ids[0], label),
                       "%s freed memory usable again (%s)" % (ids[1], label)):
            variant(b, ws[i], label, ids)
    blas_workspace(b)
    driver_view(b)


if __name__ == "__main__":
    c.main_wrapper(main)
