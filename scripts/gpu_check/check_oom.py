#!/usr/bin/env python3
"""Check 2: allocating past the quota fails the way the framework fails on a
full GPU (torch.cuda.OutOfMemoryError / CUDA_ERROR_OUT_OF_MEMORY), with the
default allocator and with expandable segments (cuMemCreate + cuMemMap), and
memory freed is usable again."""

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


if __name__ == "__main__":
    c.main_wrapper(main)
