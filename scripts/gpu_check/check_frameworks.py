#!/usr/bin/env python3
"""Check 6: other frameworks, where installed: CuPy, JAX, and NVIDIA's
cuda-bindings when PyTorch is the main backend. Each one, under LD_PRELOAD
with a 2 GiB quota: its memory info shows the quota, and allocating past it
fails with the framework's own out-of-memory error, after which the process
still works. A framework that does not work without cgpu either is SKIP."""

import common as c

QUOTA_GIB = 2
CHUNK = 64 * c.MiB
LABEL = {"cupy": "CuPy", "jax": "JAX", "cuda": "cuda-bindings"}
OOM_KIND = {"cupy": "cupy.cuda.memory.OutOfMemoryError",
            "jax": ":RESOURCE_EXHAUSTED",
            "cuda": "CUDA_ERROR_OUT_OF_MEMORY"}


def one(fw, ids):
    q = QUOTA_GIB * c.GiB
    lab = LABEL[fw]
    n_info = "%s %s: memory info shows the quota" % (ids[0], lab)
    n_oom = "%s %s: over-allocation fails cleanly" % (ids[1], lab)
    # the bare process and the container's start at once
    wb = c.Worker("%s-bare" % fw, fw, c.container_env(preload=False), wait=False)
    w = c.Worker(fw, fw, c.container_env("fw-" + fw, c.new_ledger_dir("fw"),
                                         ALIYUN_COM_GPU_MEM_CONTAINER=QUOTA_GIB), wait=False)
    try:
        wb.ready()
        bare = wb.call("meminfo")
        wb.close()
    except c.WorkerError as e:
        w.kill()
        c.result("%s %s" % (ids[0], lab), "usable without cgpu", "not usable: %s" % str(e)[:150], None)
        return
    with c.section(n_info, n_oom):
        w.ready()
        m = w.call("meminfo")
        if fw == "jax":
            # XLA reports its allocator's limit, which it derives from the
            # driver's view: it must fit the quota.
            ok = 0 < m["total"] <= q
            exp = "0 < bytes_limit <= %d B (bare: %d B)" % (q, bare["total"])
        else:
            ok = m["total"] == q
            exp = "total %d B" % q
        c.result(n_info, exp, "total %d B, free %d B" % (m["total"], m["free"]), ok)
        big = w.call("alloc", bytes=q + c.GiB, timeout=120)
        f = w.call("fill", chunk=CHUNK, limit=2 * q, timeout=180)
        w.call("free")
        after = w.call("alloc", bytes=CHUNK)
        w.call("free")
        kind = OOM_KIND[fw]
        ok = (big["oom"] and kind in (big["error"] or "") and f["oom"] and kind in (f["error"] or "")
              and f["bytes"] <= q and after["allocated"])
        c.result(n_oom, "%s; <= %d GiB; usable after" % (kind.strip(":"), QUOTA_GIB),
                 "big: %s; fill: %s after %.2f GiB; then %s"
                 % (big["error"] or "succeeded!", f["error"] or "no error", f["bytes"] / c.GiB,
                    "alloc ok" if after["allocated"] else "alloc FAILED"),
                 ok)
        w.close()


def main():
    p = c.probe()
    extras = p.get("extras", {})
    ids = {"cupy": ("6a", "6b"), "jax": ("6c", "6d"), "cuda": ("6e", "6f")}
    for fw in ("cupy", "jax", "cuda"):
        if fw == p["backend"]:
            continue
        if not extras.get(fw):
            c.result("%s %s" % (ids[fw][0], LABEL[fw]), "if installed", "not installed", None)
            continue
        one(fw, ids[fw])


if __name__ == "__main__":
    c.main_wrapper(main)
