#!/usr/bin/env python3
"""Check 5: overhead of the library on a training-like loop (matmuls, many
small kernels, a CUDA graph replay; spin kernels and cuGraphLaunch on the
driver-API fallback), with and without LD_PRELOAD, as a ratio of time per
step. The two processes take turns, several rounds; the best round of each
counts (the least disturbed one)."""

import common as c


def main():
    b = c.probe()["backend"]
    if c.SIM:
        rounds, secs, limit = (2, 1.0, 1.30) if c.QUICK else (3, 1.5, 1.30)
    else:
        rounds, secs, limit = (2, 2.0, 1.05) if c.QUICK else (3, 4.0, 1.05)
    name = "5 overhead, training-like loop: with/without LD_PRELOAD"
    with c.section(name):
        base = c.Worker("bare", b, c.container_env(preload=False))
        pre = c.Worker("preload", b, c.container_env(
            "overhead", c.new_ledger_dir("ovh"), ALIYUN_COM_GPU_MEM_CONTAINER=8))
        tb, tp = [], []
        for i in range(rounds):
            order = (base, pre) if i % 2 == 0 else (pre, base)
            for w in order:
                r = w.call("train", seconds=secs, timeout=secs * 10 + 120)
                (tb if w is base else tp).append(r["per_iter"])
        best_b, best_p = min(tb), min(tp)
        ratio = best_p / best_b
        c.result(name, "<= %.2fx" % limit,
                 "%.3fx (%.3f vs %.3f ms/step, best of %d)"
                 % (ratio, best_p * 1e3, best_b * 1e3, rounds),
                 ratio <= limit)
        base.close()
        pre.close()


if __name__ == "__main__":
    c.main_wrapper(main)
