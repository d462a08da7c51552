#!/usr/bin/env python3
"""PyTorch with and without libcgpu.so, in the same run (scripts/bench-torch.sh
sets the environment up; on the simulated driver by default).

startup  time from `import torch` to `torch.zeros(1, device='cuda')` done, in
         fresh processes, bare and preloaded alternately: medians and ratio
step     time per step of a training-like loop (three Linear+GELU+LayerNorm
         layers forward and backward, AdamW, a replayed CUDA graph of small
         kernels, more small kernels). One long-lived process per variant:
           bare     no libcgpu.so
           cgpu     LD_PRELOAD=libcgpu.so, 8 GiB quota, the default policy
           native   (BENCH_VARIANTS) the same with `cgpuctl set policy 5`:
                    memory isolation only, no compute control
         They measure in turns, BENCH_ROUNDS rounds of BENCH_STEP_SECONDS
         each, the order rotating every round. Each round's time per step
         of a variant is divided by the bare process's in the same round
         (neighbours in time, so a load that changes slowly cancels); the
         median of these per-round ratios is the result, with the quartiles
         and the extremes as its spread. Wall time and CPU time (all the
         process's threads) per step are both reported.
         BENCH_PERF=1: also record each process with `perf` during the
         rounds and print the share of its CPU samples spent in libcgpu.so
         (the hooks' own cost), in the dynamic loader and in the kernel.

Prints one line per measurement and a final `ratio` line per comparison.
"""

import json
import os
import signal
import statistics
import subprocess
import sys
import time

PY = sys.executable
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "15"))
STEP_SECONDS = float(os.environ.get("BENCH_STEP_SECONDS", "1.0"))
VARIANTS = ["bare", "cgpu"] + [v for v in os.environ.get("BENCH_VARIANTS", "").split(",")
                               if v and v not in ("bare", "cgpu")]
PERF = os.environ.get("BENCH_PERF") == "1"
STARTUP_ROUNDS = int(os.environ.get("BENCH_STARTUP_ROUNDS", "7"))

STARTUP = r'''
import time
t = time.perf_counter()
import torch
torch.zeros(1, device="cuda")
torch.cuda.synchronize()
print(time.perf_counter() - t)
'''

TRAINER = r'''
import json, sys, time
import torch
nn = torch.nn
dev = torch.device("cuda", 0)
d = 1024
model = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.LayerNorm(d),
                      nn.Linear(d, d), nn.GELU(), nn.LayerNorm(d),
                      nn.Linear(d, d)).to(dev, dtype=torch.bfloat16)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
x = torch.randn(128, d, device=dev, dtype=torch.bfloat16)
small = torch.randn(64, 1024, device=dev)
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    for _ in range(3):
        y = small
        for _ in range(16):
            y = (y * 1.0001 + 0.5).relu_()
torch.cuda.current_stream().wait_stream(s)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    y = small
    for _ in range(16):
        y = (y * 1.0001 + 0.5).relu_()

def step():
    out = model(x)
    loss = out.float().pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    g.replay()
    z = small[:8]
    for _ in range(8):
        z = z + 1.0

for _ in range(5):
    step()
torch.cuda.synchronize()
print("ready", flush=True)
for line in sys.stdin:
    secs = float(line)
    torch.cuda.synchronize()
    n, t0, c0 = 0, time.perf_counter(), time.process_time()
    while True:
        step()
        n += 1
        if n % 4 == 0:
            torch.cuda.synchronize()
            if time.perf_counter() - t0 >= secs:
                break
    print(json.dumps({"per_step": (time.perf_counter() - t0) / n,
                      "cpu_per_step": (time.process_time() - c0) / n, "steps": n}), flush=True)
'''


def report(what, times, scale, unit, rounds):
    """Median and best (least disturbed) round of each, as ratios."""
    b, p = statistics.median(times[False]), statistics.median(times[True])
    bb, pb = min(times[False]), min(times[True])
    print("ratio %s: %.3fx median (%.3f vs %.3f %s), %.3fx best (%.3f vs %.3f %s), "
          "with vs without libcgpu.so, %d rounds"
          % (what, p / b, p * scale, b * scale, unit, pb / bb, pb * scale, bb * scale, unit,
             rounds), flush=True)


def report_pairs(variant, metric, base, other, scale, unit):
    """Per-round ratios other/base: median, quartiles, extremes."""
    ratios = [o / b for o, b in zip(other, base)]
    q1, med, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
    print("ratio step %s/bare (%s): %.3fx median of %d per-round ratios "
          "(quartiles %.3f-%.3f, range %.3f-%.3f); medians %.3f vs %.3f %s"
          % (variant, metric, med, len(ratios), q1, q3, min(ratios), max(ratios),
             statistics.median(other) * scale, statistics.median(base) * scale, unit),
          flush=True)


def env(variant):
    e = dict(os.environ)
    e.pop("LD_PRELOAD", None)
    if variant != "bare":
        e["LD_PRELOAD"] = os.environ["BENCH_LIB"]
        e["ALIYUN_COM_GPU_MEM_CONTAINER"] = "8"
        e["CGPU_CONTAINER_ID"] = "bench-" + variant
        e["CGPU_LEDGER_DIR"] = os.path.join(os.environ["CGPU_LEDGER_DIR"], variant)
        os.makedirs(e["CGPU_LEDGER_DIR"], exist_ok=True)
    return e


def startup():
    times = {False: [], True: []}
    for i in range(STARTUP_ROUNDS):
        for pre in ((False, True) if i % 2 == 0 else (True, False)):
            out = subprocess.run([PY, "-c", STARTUP], env=env("cgpu" if pre else "bare"),
                                 capture_output=True, text=True, timeout=600, check=True).stdout
            t = float(out.strip().splitlines()[-1])
            times[pre].append(t)
            print("startup %-7s round %d: %.3f s" % ("preload" if pre else "bare", i, t), flush=True)
    report("startup", times, 1.0, "s", STARTUP_ROUNDS)


def set_native(e):
    """Policy 5 on the ledger of `e` (the process has joined it by now)."""
    ctl = os.environ.get("BENCH_CGPUCTL") or os.path.join(
        os.path.dirname(os.environ["BENCH_LIB"]), "cgpuctl")
    r = subprocess.run([ctl, "set", "policy", "5"], env=e, capture_output=True, text=True,
                       timeout=30)
    if r.returncode != 0:
        raise SystemExit("bench-torch: cgpuctl set policy 5 failed: %s%s" % (r.stdout, r.stderr))


def held_back(variant):
    """(ns launches were held back, launches) of the variant's container so
    far, from `cgpu-smi --json` on its ledger; None if unreadable."""
    smi = os.path.join(os.path.dirname(os.environ["BENCH_LIB"]), "cgpu-smi")
    try:
        r = subprocess.run([smi, "--json"], env=env(variant), capture_output=True, text=True,
                           timeout=30)
        for g in json.loads(r.stdout)["gpus"]:
            for ct in (g.get("gpu") or {}).get("containers", []):
                if ct["id"] == "bench-" + variant:
                    return ct["throttled_ns"], ct["launches"]
    except (OSError, ValueError, KeyError, subprocess.TimeoutExpired):
        pass
    return None


def perf_start(pid, name):
    out = os.path.join(os.environ.get("BENCH_WORK", "/tmp"), "perf-%s.data" % name)
    p = subprocess.Popen(["perf", "record", "-q", "-F", "1999", "-p", str(pid), "-o", out],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return p, out


def perf_report(name, proc, out):
    """Share of the process's samples by shared object: libcgpu.so, ld.so, kernel."""
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=60)
    r = subprocess.run(["perf", "report", "-i", out, "--sort", "dso", "--stdio", "-q"],
                       capture_output=True, text=True, timeout=120)
    shares = {}
    for line in r.stdout.splitlines():
        f = line.split()
        if len(f) >= 2 and f[0].endswith("%"):
            shares[f[1]] = float(f[0][:-1])
    pick = lambda k: sum(v for d, v in shares.items() if k in d)  # noqa: E731
    print("perf %-6s: %.2f%% of CPU samples in libcgpu.so, %.2f%% in ld.so, %.2f%% in the kernel, "
          "%.2f%% in the driver (libcuda)"
          % (name, pick("libcgpu.so"), pick("ld-linux"), pick("[kernel"),
             pick("libcgpu_sim") + pick("libcuda")), flush=True)


def steps():
    procs = {}
    for v in VARIANTS:
        procs[v] = subprocess.Popen([PY, "-c", TRAINER], env=env(v), stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, text=True)
    for v, p in procs.items():
        assert p.stdout.readline().strip() == "ready", v
        if v == "native":
            set_native(env(v))
    perfs = {v: perf_start(p.pid, v) for v, p in procs.items()} if PERF else {}
    held0 = {v: held_back(v) for v in VARIANTS if v != "bare"}
    wall = {v: [] for v in VARIANTS}
    cpu = {v: [] for v in VARIANTS}
    n = len(VARIANTS)
    for i in range(ROUNDS):
        # rotate the order: each variant goes first, middle and last equally often
        for v in VARIANTS[i % n:] + VARIANTS[:i % n]:
            p = procs[v]
            p.stdin.write("%f\n" % STEP_SECONDS)
            p.stdin.flush()
            r = json.loads(p.stdout.readline())
            wall[v].append(r["per_step"])
            cpu[v].append(r["cpu_per_step"])
            print("step %-6s round %2d: %.3f ms/step wall, %.3f ms/step CPU (%d steps)"
                  % (v, i, r["per_step"] * 1e3, r["cpu_per_step"] * 1e3, r["steps"]), flush=True)
    for v, h0 in held0.items():
        h1 = held_back(v)
        if h0 and h1:
            busy = STEP_SECONDS * ROUNDS  # at least; a round ends on a whole step
            print("held back %-6s: %.1f ms in the hooks' admission waits over %.0f s of rounds "
                  "(%.2f%%), %d launches admitted"
                  % (v, (h1[0] - h0[0]) / 1e6, busy, (h1[0] - h0[0]) / 1e7 / busy,
                     h1[1] - h0[1]), flush=True)
    for v, (pp, out) in perfs.items():
        perf_report(v, pp, out)
    for p in procs.values():
        p.stdin.close()
        p.wait(timeout=60)
    for v in VARIANTS[1:]:
        report_pairs(v, "wall", wall["bare"], wall[v], 1e3, "ms/step")
        report_pairs(v, "CPU", cpu["bare"], cpu[v], 1e3, "ms/step")


if __name__ == "__main__":
    what = sys.argv[1:] or ["startup", "step"]
    if "startup" in what:
        startup()
    if "step" in what:
        steps()
