#!/usr/bin/env python3
"""Check 9 (PyTorch): driver paths PyTorch takes beyond plain allocations,
each in a fresh process under LD_PRELOAD with a 2 GiB quota:

9a  expandable segments (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True,
    memory mapped with cuMemCreate/cuMemMap, several mappings side by side):
    a model moves to the GPU and trains a step, a tensor spanning mappings
    comes back byte for byte, allocating past the quota raises
    torch.OutOfMemoryError and the process still works
9b  CUDA IPC (torch.multiprocessing): a CUDA tensor sent to a spawned child
    process of the same container reads back byte for byte there, and the
    child's in-place change is seen by the parent
9c  torch.profiler with CUDA activities around GPU work: the profiler runs
    to the end (no crash) and CUDA works after it; on a GPU it records the
    CUDA kernels too (the simulated driver gives the profiler no records)

Without PyTorch as the backend (--framework torch) the rows are SKIP.
"""

import json
import os

import common as c

QUOTA_GIB = 2

PROGRAM = r'''
import json, os, sys
import torch


def roundtrip(dev, n):
    src = (torch.arange(n, dtype=torch.int64) * 7919 % 251).to(torch.uint8)
    back = src.to(dev).cpu()
    return bool(torch.equal(src, back))


def expandable(dev, out, past):
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
                                torch.nn.Linear(4096, 1024)).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loss = model(torch.randn(64, 1024, device=dev)).square().mean()
    loss.backward()
    opt.step()
    torch.cuda.synchronize()
    out["trained"] = True
    # Segments grow in 20 MiB mappings: a 96 MiB tensor spans several.
    held = [torch.empty(8 << 20, dtype=torch.uint8, device=dev) for _ in range(3)]
    out["spanning"] = roundtrip(dev, 96 << 20)
    out["reserved"] = torch.cuda.memory_reserved()
    try:
        big = torch.empty(past, dtype=torch.uint8, device=dev)
        out["oom"] = None
    except torch.OutOfMemoryError:
        out["oom"] = "torch.OutOfMemoryError"
    except Exception as e:
        out["oom"] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:200])
    del held
    torch.cuda.empty_cache()
    out["after"] = roundtrip(dev, 1 << 20)


def child(q, r):
    t = q.get()
    host = t.cpu()
    ok = bool(torch.equal(host, (torch.arange(t.numel()) % 256).to(torch.uint8)))
    t.copy_(torch.full_like(host, 42).to(t.device))
    torch.cuda.synchronize()
    r.put({"child_read": ok})
    q.get()  # holds the tensor until the parent has looked


def ipc(dev, out):
    import torch.multiprocessing as mp
    ctx = mp.get_context("spawn")
    q, r = ctx.Queue(), ctx.Queue()
    t = (torch.arange(64 << 20) % 256).to(torch.uint8).to(dev)
    p = ctx.Process(target=child, args=(q, r))
    p.start()
    q.put(t)
    out.update(r.get(timeout=120))
    torch.cuda.synchronize()
    out["parent_sees_child"] = bool((t.cpu() == 42).all())
    q.put(None)
    p.join(60)
    out["child_rc"] = p.exitcode


def profiler(dev, out):
    from torch.profiler import profile, ProfilerActivity
    x = torch.randn(512, 512, device=dev)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            x @ x
        torch.cuda.synchronize()
    events = prof.key_averages()
    out["events"] = len(events)
    out["cuda_events"] = sum(1 for e in events if e.device_time_total > 0)
    out["after"] = roundtrip(dev, 1 << 20)


if __name__ == "__main__":
    what = sys.argv[1]
    out = {"version": torch.__version__}
    dev = torch.device("cuda", 0)
    if what == "expandable":
        expandable(dev, out, int(sys.argv[2]))
    elif what == "ipc":
        ipc(dev, out)
    elif what == "profiler":
        profiler(dev, out)
    print("@@TP " + json.dumps(out), flush=True)
'''


def run(args, env_extra=None, timeout=300):
    env = c.container_env("torchpaths", c.new_ledger_dir("tp"),
                          ALIYUN_COM_GPU_MEM_CONTAINER=QUOTA_GIB, **(env_extra or {}))
    # A file, not `-c`: spawned children import the program's functions.
    prog = os.path.join(c.WORKDIR, "torch_paths_program.py")
    with open(prog, "w") as f:
        f.write(PROGRAM)
    rc, out, err = c.run_cmd([c.PYTHON, prog] + args, env, timeout)
    c.say("  --- torch %s, rc=%s\n%s%s" % (" ".join(args), rc, out[-3000:], err[-3000:]))
    for line in out.splitlines():
        if line.startswith("@@TP "):
            return json.loads(line[5:])
    raise c.WorkerError("torch %s: no result (rc=%s): %s" % (args, rc, err.strip()[-300:]))


def main():
    p = c.probe()
    names = ["9a expandable segments", "9b CUDA IPC between processes",
             "9c torch.profiler with CUDA activities"]
    if p["backend"] != "torch":
        for n in names:
            c.result(n, "PyTorch (--framework torch)", "backend %s" % p["backend"], None)
        return
    q = QUOTA_GIB * c.GiB
    with c.section(names[0]):
        r = run(["expandable", str(q + c.GiB)],
                {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
        ok = (r.get("trained") and r.get("spanning") and r.get("oom") == "torch.OutOfMemoryError"
              and r.get("after"))
        c.result(names[0], "trains; spanning tensor intact; OutOfMemoryError past %d GiB; works after"
                 % QUOTA_GIB,
                 "trained %s; spanning %s; %s; after %s" % (r.get("trained"), r.get("spanning"),
                                                            r.get("oom") or "allocated!",
                                                            r.get("after")),
                 bool(ok))
    with c.section(names[1]):
        r = run(["ipc"])
        ok = r.get("child_read") and r.get("parent_sees_child") and r.get("child_rc") == 0
        c.result(names[1], "child reads the bytes; parent sees the child's write",
                 "child read %s; parent sees %s; child exit %s"
                 % (r.get("child_read"), r.get("parent_sees_child"), r.get("child_rc")),
                 bool(ok))
    with c.section(names[2]):
        r = run(["profiler"])
        ok = r.get("after") and (c.SIM or r.get("cuda_events", 0) > 0)
        c.result(names[2], "completes; CUDA works after%s" % ("" if c.SIM else "; CUDA kernels recorded"),
                 "%s events (%s CUDA); after %s" % (r.get("events"), r.get("cuda_events"),
                                                    r.get("after")),
                 bool(ok))


if __name__ == "__main__":
    c.main_wrapper(main)
