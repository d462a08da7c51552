#!/usr/bin/env python3
"""Check 3: the processes of one container share one quota; another
container has its own. Quota 2 GiB each (no DEV):

  A1 (container A) holds 1 GiB;
  A2 (container A) sees at most quota - 1 GiB free and can take no more;
  B1 (container B) is not charged for A's memory: it gets about 1 GiB more than A2;
  A1 frees its 1 GiB: A2 can now take it.
"""

import common as c

QUOTA_GIB = 2
HOLD = 1 * c.GiB
CHUNK = 64 * c.MiB


def main():
    b = c.probe()["backend"]
    q = QUOTA_GIB * c.GiB
    ledger = c.new_ledger_dir("share")
    names = ("3a one container, 2 processes: one quota",
             "3b two containers: a quota each",
             "3c freed by one process, usable by the other")
    with c.section(*names):
        envA = c.container_env("share-a", ledger, ALIYUN_COM_GPU_MEM_CONTAINER=QUOTA_GIB)
        envB = c.container_env("share-b", ledger, ALIYUN_COM_GPU_MEM_CONTAINER=QUOTA_GIB)
        # all three start (import, context) at once; the order of what they
        # hold is set by the commands below
        a1 = c.Worker("A1", b, envA, wait=False)
        a2 = c.Worker("A2", b, envA, wait=False)
        b1 = c.Worker("B1", b, envB, wait=False)
        for w in (a1, a2, b1):
            w.ready()
        h = a1.call("fill", chunk=CHUNK, limit=HOLD)
        if h["bytes"] != HOLD:
            raise c.WorkerError("A1 could not take %d MiB of its own quota: %s" % (HOLD // c.MiB, h))
        mA2 = a2.call("meminfo")
        fA2 = a2.call("fill", chunk=CHUNK, limit=2 * q, timeout=180)
        mB1 = b1.call("meminfo")
        fB1 = b1.call("fill", chunk=CHUNK, limit=2 * q, timeout=180)

        ok = (mA2["total"] == q and mA2["free"] <= q - HOLD and fA2["oom"]
              and fA2["bytes"] + HOLD <= q and fA2["bytes"] <= mA2["free"])
        c.result(names[0],
                 "A2 sees total %d GiB, free <= %.2f GiB; A1+A2 <= %d GiB"
                 % (QUOTA_GIB, (q - HOLD) / c.GiB, QUOTA_GIB),
                 "A2 total %.2f GiB free %.2f GiB; A1 %.2f + A2 %.2f GiB (%s)"
                 % (mA2["total"] / c.GiB, mA2["free"] / c.GiB, HOLD / c.GiB,
                    fA2["bytes"] / c.GiB, fA2["error"] or "no OOM"),
                 ok)
        ok = (mB1["total"] == q and mB1["free"] > q - HOLD and fB1["oom"] and fB1["bytes"] <= q
              and fB1["bytes"] >= fA2["bytes"] + HOLD - 2 * CHUNK)
        c.result(names[1],
                 "B1 free > %.2f GiB; B1 gets ~A2 + 1 GiB (>= %.2f GiB), <= %d GiB"
                 % ((q - HOLD) / c.GiB, (fA2["bytes"] + HOLD - 2 * CHUNK) / c.GiB, QUOTA_GIB),
                 "B1 free %.2f GiB, got %.2f GiB (%s)"
                 % (mB1["free"] / c.GiB, fB1["bytes"] / c.GiB, fB1["error"] or "no OOM"),
                 ok)
        a1.call("free")
        more = a2.call("fill", chunk=CHUNK, limit=2 * q, timeout=180)
        ok = more["bytes"] >= HOLD - CHUNK and more["oom"] and fA2["bytes"] + more["bytes"] <= q
        c.result(names[2], "A2 takes A1's freed %.2f GiB (>= %.2f)" % (HOLD / c.GiB, (HOLD - CHUNK) / c.GiB),
                 "A2 took %.2f GiB more (%s)" % (more["bytes"] / c.GiB, more["error"] or "no OOM"),
                 ok)
        for w in (a1, a2, b1):
            w.close()


if __name__ == "__main__":
    c.main_wrapper(main)
