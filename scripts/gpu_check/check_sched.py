#!/usr/bin/env python3
"""Check 4: compute shares (docs/scheduling.md).

4a  two containers at weights 1:2 (ALIYUN_COM_GPU_SCHD_WEIGHT, policy 2, also
    set with `cgpuctl set policy 2` when cgpuctl is there) run the same loop
    (bf16 matmuls; spin kernels on the driver-API fallback) at once: the
    throughput ratio against 2.00.
4b  policy 1 (`cgpuctl set policy 1`; it is also the ledger's default), one
    container busy and one alive but idle: the busy one's throughput against
    its own throughput alone.
"""

import time

import common as c

MEM_GIB = 4


def windows():
    """(warm-up s, window s) for the run's mode."""
    if c.SIM:
        return (1.0, 3.0) if c.QUICK else (1.5, 6.0)
    return (3.0, 8.0) if c.QUICK else (5.0, 20.0)


def tol():
    # the goal on real hardware is an error <= 3% (docs/scheduling.md); we pass at 5%
    # there, 10% on the noisy simulated machine (as tests/sched.rs)
    return 0.10 if c.SIM else 0.05


def loop_args(b):
    if b == "torch":
        return {"matmul_n": 4096 if c.QUICK else 8192}
    return {"kernel_ns": 1_000_000}


def sim_env(b):
    """On the simulated GPU a framework's kernels take CGPU_SIM_KERNEL_NS of
    device time each (they compute nothing): 300 us makes the matmul loop
    bound by the device, as on a GPU, not by Python."""
    return {"CGPU_SIM_KERNEL_NS": 300_000} if c.SIM and b == "torch" else {}


def run_together(workers, warm, window):
    start = time.time() + warm + 0.5
    for w in workers:
        w.send({"op": "loop", "start_at": start, "end_at": start + window})
    out = []
    for w in workers:
        r = w.recv(timeout=warm + window + 120)
        c.say("  [%s] loop -> %.2f it/s (%d it in %.2f s, started %.3f s late)"
              % (w.label, r["rate"], r["iters"], r["seconds"], r["late_start"]))
        out.append(r)
    return out


def weights(b, warm, window):
    name = "4a policy 2, weights 1:2, both busy: throughput ratio"
    with c.section(name):
        ledger = c.new_ledger_dir("sched")
        w1 = c.Worker("weight-1", b, c.container_env(
            "sched-w1", ledger, ALIYUN_COM_GPU_MEM_CONTAINER=MEM_GIB,
            ALIYUN_COM_GPU_SCHD_WEIGHT=1, **sim_env(b)), wait=False, **loop_args(b))
        w2 = c.Worker("weight-2", b, c.container_env(
            "sched-w2", ledger, ALIYUN_COM_GPU_MEM_CONTAINER=MEM_GIB,
            ALIYUN_COM_GPU_SCHD_WEIGHT=2, **sim_env(b)), wait=False, **loop_args(b))
        w1.ready()
        w2.ready()
        ok_ctl, text = c.cgpuctl(["set", "policy", "2"], ledger)
        if ok_ctl is False:
            c.say("  cgpuctl could not set policy 2 (%s); relying on the weight-2 switch" % text)
        r1, r2 = run_together([w1, w2], warm, window)
        c.log_ledger(ledger, "after the 1:2 run")
        ratio = r2["rate"] / max(r1["rate"], 1e-9)
        t = tol()
        c.result(name, "2.00 +-%d%%" % round(t * 100),
                 "%.2f (%.1f vs %.1f it/s)" % (ratio, r2["rate"], r1["rate"]),
                 abs(ratio - 2.0) <= 2.0 * t)
        w1.close()
        w2.close()


def idle(b, warm, window):
    name = "4b policy 1, one busy + one idle: busy vs alone"
    with c.section(name):
        ledger = c.new_ledger_dir("sched")
        busy = c.Worker("busy", b, c.container_env(
            "sched-busy", ledger, ALIYUN_COM_GPU_MEM_CONTAINER=MEM_GIB, **sim_env(b)),
            **loop_args(b))
        ok_ctl, text = c.cgpuctl(["set", "policy", "1"], ledger)
        if ok_ctl is False:
            c.say("  cgpuctl could not set policy 1 (%s); relying on the default policy" % text)
        (alone,) = run_together([busy], warm, window)
        idler = c.Worker("idle", b, c.container_env(
            "sched-idle", ledger, ALIYUN_COM_GPU_MEM_CONTAINER=MEM_GIB, **sim_env(b)),
            **loop_args(b))
        idler.call("meminfo")
        (shared,) = run_together([busy], warm, window)
        c.log_ledger(ledger, "busy + idle")
        frac = shared["rate"] / max(alone["rate"], 1e-9)
        need = 0.90 if c.SIM else 0.97
        c.result(name, ">= %.2f of alone" % need,
                 "%.3f (%.1f vs %.1f it/s alone)" % (frac, shared["rate"], alone["rate"]),
                 frac >= need)
        busy.close()
        idler.close()


def main():
    b = c.probe()["backend"]
    warm, window = windows()
    weights(b, warm, window)
    idle(b, warm, window)


if __name__ == "__main__":
    c.main_wrapper(main)
