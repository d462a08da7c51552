"""CUDA checkpointing through unmodified cuda-bindings and nvidia-ml-py: this
process (the tool, as cuda-checkpoint is) locks, checkpoints, restores and
unlocks another CUDA process it starts (the target), and watches the
device's memory through NVML and the target's calls wait while it is locked.

Prints one JSON object; shim/tests/python.rs checks it.
Usage: python checkpoint_client.py
"""
import json
import os
import select
import subprocess
import sys
import time

import pynvml as n
from cuda.bindings import driver as d

MIB = 1 << 20

TARGET = r"""
import ctypes, sys, time
from cuda.bindings import driver as d
assert d.cuInit(0)[0] == 0
dev = d.cuDeviceGet(0)[1]
ctx = d.cuDevicePrimaryCtxRetain(dev)[1]
d.cuCtxSetCurrent(ctx)
m = d.cuMemAlloc(256 << 20)[1]
d.cuMemsetD8(m, 0x5A, 16)
print("ready", flush=True)
for line in sys.stdin:
    cmd = line.strip()
    if cmd == "call":
        t0 = time.time()
        err = d.cuMemGetInfo()[0]
        print("done", int(err), int((time.time() - t0) * 1000), flush=True)
    elif cmd == "check":
        buf = (ctypes.c_uint8 * 16)()
        d.cuMemcpyDtoH(buf, m, 16)
        print("bytes", int(all(b == 0x5A for b in buf)), flush=True)
    else:
        break
"""


def ok(res, what=""):
    if res[0] != d.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{what}: {res[0]!r}")
    return res[1] if len(res) == 2 else None


def line_within(proc, seconds):
    """The target's next line, or None if it prints nothing in time."""
    r, _, _ = select.select([proc.stdout], [], [], seconds)
    return proc.stdout.readline().split() if r else None


n.nvmlInit()
ok(d.cuInit(0))
nv = n.nvmlDeviceGetHandleByIndex(0)


def used():
    return n.nvmlDeviceGetMemoryInfo(nv).used


target = subprocess.Popen([sys.executable, "-c", TARGET], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.DEVNULL, text=True)
out = {}
try:
    assert line_within(target, 60) == ["ready"]
    pid = target.pid
    S = d.CUprocessState

    def state():
        return int(ok(d.cuCheckpointProcessGetState(pid), "GetState"))

    out["running"] = [state(), used()]
    out["restore_thread"] = int(ok(d.cuCheckpointProcessGetRestoreThreadId(pid))) == pid
    out["unlock_running"] = d.cuCheckpointProcessUnlock(pid, None)[0].name
    ok(d.cuCheckpointProcessLock(pid, None), "Lock")
    out["locked"] = state()
    out["lock_again"] = d.cuCheckpointProcessLock(pid, None)[0].name
    out["restore_locked"] = d.cuCheckpointProcessRestore(pid, None)[0].name
    # The target's next CUDA call waits while it is locked.
    target.stdin.write("call\n")
    target.stdin.flush()
    out["call_while_locked"] = line_within(target, 0.3)
    ok(d.cuCheckpointProcessCheckpoint(pid, None), "Checkpoint")
    out["checkpointed"] = [state(), used()]
    # Something else takes the device meanwhile: the restore does not fit.
    total = n.nvmlDeviceGetMemoryInfo(nv).total
    dev = ok(d.cuDeviceGet(0))
    ctx = ok(d.cuDevicePrimaryCtxRetain(dev))
    ok(d.cuCtxSetCurrent(ctx))
    filler = ok(d.cuMemAlloc(total - used() - 100 * MIB), "filler")
    out["restore_no_room"] = [d.cuCheckpointProcessRestore(pid, None)[0].name, state()]
    ok(d.cuMemFree(filler))
    ok(d.cuDevicePrimaryCtxRelease(dev))
    ok(d.cuCheckpointProcessRestore(pid, None), "Restore")
    out["restored"] = [state(), used()]
    # Still waiting after all that; it completes once unlocked.
    out["call_before_unlock"] = line_within(target, 0.05)
    ok(d.cuCheckpointProcessUnlock(pid, None), "Unlock")
    out["unlocked"] = state()
    done = line_within(target, 30)
    out["call_after_unlock"] = done[:2] if done else None
    target.stdin.write("check\n")
    target.stdin.flush()
    out["bytes_kept"] = line_within(target, 30)
    sleeper = subprocess.Popen(["sleep", "30"])
    out["not_cuda"] = d.cuCheckpointProcessGetState(sleeper.pid)[0].name
    sleeper.kill()
    out["complete_unknown"] = d.cuCheckpointOperationComplete(None)[0].name
finally:
    # Leave the target running whatever happened, then let it exit.
    d.cuCheckpointProcessRestore(target.pid, None)
    d.cuCheckpointProcessUnlock(target.pid, None)
    target.stdin.write("exit\n")
    target.stdin.flush()
    try:
        target.wait(timeout=30)
    except subprocess.TimeoutExpired:
        target.kill()
print(json.dumps(out))
