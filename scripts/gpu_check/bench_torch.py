#!/usr/bin/env python3
"""PyTorch with and without libcgpu.so, in the same run (scripts/bench-torch.sh
sets the environment up; on the simulated driver by default).

startup  time from `import torch` to `torch.zeros(1, device='cuda')` done, in
         fresh processes, bare and preloaded alternately: medians and ratio
step     time per step of a training-like loop (three Linear+GELU+LayerNorm
         layers forward and backward, AdamW, a replayed CUDA graph of small
         kernels, more small kernels), one bare and one preloaded process
         measuring in alternating rounds: medians of the rounds and ratio

Prints one line per measurement and a final `ratio` line per benchmark.
"""

import json
import os
import statistics
import subprocess
import sys
import time

PY = sys.executable
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "7"))
STEP_SECONDS = float(os.environ.get("BENCH_STEP_SECONDS", "2.0"))

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
    n, t0 = 0, time.perf_counter()
    while True:
        step()
        n += 1
        if n % 4 == 0:
            torch.cuda.synchronize()
            if time.perf_counter() - t0 >= secs:
                break
    print(json.dumps({"per_step": (time.perf_counter() - t0) / n, "steps": n}), flush=True)
'''


def report(what, times, scale, unit):
    """Median and best (least disturbed) round of each, as ratios."""
    b, p = statistics.median(times[False]), statistics.median(times[True])
    bb, pb = min(times[False]), min(times[True])
    print("ratio %s: %.3fx median (%.3f vs %.3f %s), %.3fx best (%.3f vs %.3f %s), "
          "with vs without libcgpu.so, %d rounds"
          % (what, p / b, p * scale, b * scale, unit, pb / bb, pb * scale, bb * scale, unit,
             ROUNDS), flush=True)


def env(preload):
    e = dict(os.environ)
    e.pop("LD_PRELOAD", None)
    if preload:
        e["LD_PRELOAD"] = os.environ["BENCH_LIB"]
        e["ALIYUN_COM_GPU_MEM_CONTAINER"] = "8"
        e["CGPU_CONTAINER_ID"] = "bench"
    return e


def startup():
    times = {False: [], True: []}
    for i in range(ROUNDS):
        for pre in ((False, True) if i % 2 == 0 else (True, False)):
            out = subprocess.run([PY, "-c", STARTUP], env=env(pre), capture_output=True,
                                 text=True, timeout=600, check=True).stdout
            t = float(out.strip().splitlines()[-1])
            times[pre].append(t)
            print("startup %-7s round %d: %.3f s" % ("preload" if pre else "bare", i, t), flush=True)
    report("startup", times, 1.0, "s")


def steps():
    procs = {}
    for pre in (False, True):
        procs[pre] = subprocess.Popen([PY, "-c", TRAINER], env=env(pre), stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True)
    for p in procs.values():
        assert p.stdout.readline().strip() == "ready"
    times = {False: [], True: []}
    for i in range(ROUNDS):
        for pre in ((False, True) if i % 2 == 0 else (True, False)):
            p = procs[pre]
            p.stdin.write("%f\n" % STEP_SECONDS)
            p.stdin.flush()
            r = json.loads(p.stdout.readline())
            times[pre].append(r["per_step"])
            print("step %-7s round %d: %.3f ms/step (%d steps)"
                  % ("preload" if pre else "bare", i, r["per_step"] * 1e3, r["steps"]), flush=True)
    for p in procs.values():
        p.stdin.close()
        p.wait(timeout=60)
    report("step", times, 1e3, "ms/step")


if __name__ == "__main__":
    what = sys.argv[1:] or ["startup", "step"]
    if "startup" in what:
        startup()
    if "step" in what:
        steps()
