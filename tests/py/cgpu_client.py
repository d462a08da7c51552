#!/usr/bin/env python3
"""A ctypes driver-API/NVML client for cgpu's tests (the `dlsym` entry path:
ctypes resolves every function with dlsym on its own libcuda.so.1 handle).

Usage: cgpu_client.py CMD [ARGS] [CMD [ARGS] ...]   (commands run in order)

  init               cuInit(0)
  ctx [DEV]          cuDeviceGet + cuCtxCreate_v2 (made current)
  pctx [DEV]         cuDevicePrimaryCtxRetain + cuCtxSetCurrent
  info               print {"op":"info", free, total, devtotal, count}
  destroy            cuCtxDestroy_v2 of the context made by `ctx` (allocations left in it)
  prelease           cuDevicePrimaryCtxRelease_v2 of device 0 (to zero after one `pctx`)
  pretain            cuDevicePrimaryCtxRetain of device 0, print {"op":"pretain", rc}
  preset             cuDevicePrimaryCtxReset_v2 of device 0, print {"op":"preset", rc}
  green              cuGreenCtxCreate on all of device 0's SMs (the driver retains the
                     primary context for it), print {"op":"green", rc}
  greendestroy N     cuGreenCtxDestroy of the N-th green context made (0-based): the
                     driver releases the primary context, print {"op":"greendestroy", rc}
  nvmluuid UUID      nvmlDeviceGetHandleByUUID, print its rc
  nvmlraw            print {"op":"nvmlraw", count_rc, shutdown_rc}: nvmlDeviceGetCount_v2
                     and nvmlShutdown as they are, without nvmlInit first
  nvml               print {"op":"nvml", count, v1:{..}, v2:{..}, pids:[..]} for device 0
  alloc BYTES        cuMemAlloc_v2, print {"op":"alloc", rc}
  pitch W H          cuMemAllocPitch_v2(elem 4), print rc and pitch
  managed BYTES      cuMemAllocManaged
  async BYTES        cuMemAllocAsync on the null stream
  vmm BYTES          cuMemCreate on device 0 (BYTES rounded to the granularity)
  array W H          cuArrayCreate_v2 (float, 1 channel)
  vmmmap BYTES [DEV] cuMemCreate + AddressReserve + Map + SetAccess (kept on a
                     mapping stack); print {"op":"vmmmap", rc, bytes}
  vmmrelease         cuMemRelease of the top mapping's handle (it stays mapped)
  vmmunmap           cuMemUnmap + cuMemAddressFree of the top mapping (popped)
  vmmretain          cuMemRetainAllocationHandle on the top mapping: print rc and
                     whether it is the mapping's handle; the new reference is kept
  vmmrelretained     cuMemRelease of the last retained reference
  vmmexport          cuMemExportToShareableHandle (POSIX fd) of the top mapping's
                     handle: print {"op":"vmmexport", rc, fd, pid}
  vmmimport PATH N   open PATH (another process's exported fd, as
                     /proc/PID/fd/FD: a new open of the file), then
                     cuMemImportFromShareableHandle, AddressReserve + Map +
                     SetAccess of N bytes (pushed on the mapping stack): print
                     {"op":"vmmimport", rc, rc_map}
  vmmimportfd PID FD N  the same with process PID's descriptor FD itself
                     (pidfd_getfd, as PyTorch passes them)
  ipcget             cuIpcGetMemHandle of the last `alloc`: print
                     {"op":"ipcget", rc, handle (hex)}
  ipcopen HEX        cuIpcOpenMemHandle_v2 (lazy peer access) of that handle:
                     print {"op":"ipcopen", rc}; ipcclose closes it
  pool [DEV|host]    cuMemPoolCreate on device DEV (default 0) or in host memory
  defpool DEV        cuDeviceGetDefaultMemPool of device DEV (used by poolalloc)
  poolalloc BYTES    cuMemAllocFromPoolAsync from the last pool on the current
                     context's stream S (see `stream`), or the null stream
  pooldestroy        cuMemPoolDestroy of the last pool (its allocations go with it)
  stream             cuStreamCreate in the current context (used by poolalloc)
  setctx N           make the N-th context made by `ctx` current (0-based)
  freeall            free everything this client holds (by its own family)
  setlimit L VALUE   cuCtxSetLimit(L, VALUE), print {"op":"setlimit", limit, value, rc}
  getlimit L         cuCtxGetLimit, print {"op":"getlimit", limit, rc, value}
  resident           print {"op":"resident", threads}: MAX_THREADS_PER_MULTIPROCESSOR
                     x MULTIPROCESSOR_COUNT of the current context's device
  race SEED N MAX    N random allocs/frees of 1..MAX bytes; frees all at the end
  sleep SECS         sleep
  ready              print {"op":"ready"} and flush
  hold               print ready, then sleep forever (killed by the test)
  loop MAX           allocate/free random sizes forever (killed by the test)
  waitline           read one line from stdin
  poll BYTES SECS    call cuMemGetInfo until free >= BYTES; print {"op":"poll", ms, ok}
  forksleep SECS     fork a child that only sleeps SECS (holding what fork gave it)
  fork               fork (before this process touched CUDA): the child runs
                     `ctx`, allocs 1 MiB, prints info and nvml, exits 0
  threads T N MAX    T threads each running `race` with N steps
"""
import ctypes as C
import json
import os
import random
import sys
import threading
import time

cu = C.CDLL("libcuda.so.1")
nv = None

def out(d):
    sys.stdout.write(json.dumps(d) + "\n")
    sys.stdout.flush()

def check(rc, what):
    if rc != 0:
        out({"op": "error", "what": what, "rc": rc})
        sys.exit(3)

held = []  # (kind, handle, bytes)
lock = threading.Lock()

def do_alloc(n):
    p = C.c_uint64()
    rc = cu.cuMemAlloc_v2(C.byref(p), C.c_size_t(n))
    if rc == 0:
        with lock:
            held.append(("ptr", p.value, n))
    return rc

def free_one(item):
    kind, h, _ = item
    if kind in ("ptr",):
        return cu.cuMemFree_v2(C.c_uint64(h))
    if kind == "async":
        return cu.cuMemFreeAsync(C.c_uint64(h), None)
    if kind == "vmm":
        return cu.cuMemRelease(C.c_uint64(h))
    if kind == "array":
        return cu.cuArrayDestroy(C.c_void_p(h))
    return -1

def make_ctx(dev, primary):
    check(cu.cuInit(0), "cuInit")
    d = C.c_int()
    check(cu.cuDeviceGet(C.byref(d), dev), "cuDeviceGet")
    ctx = C.c_void_p()
    if primary:
        check(cu.cuDevicePrimaryCtxRetain(C.byref(ctx), d), "cuDevicePrimaryCtxRetain")
        check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
    else:
        rc = cu.cuCtxCreate_v2(C.byref(ctx), 0, d)
        out({"op": "ctx", "rc": rc})
        if rc != 0:
            sys.exit(4)
    CTX.value = ctx.value
    CTXS.append(ctx.value)

def info():
    f, t = C.c_size_t(), C.c_size_t()
    rc = cu.cuMemGetInfo_v2(C.byref(f), C.byref(t))
    d = C.c_int()
    cu.cuCtxGetDevice(C.byref(d))
    dt = C.c_size_t()
    cu.cuDeviceTotalMem_v2(C.byref(dt), d)
    n = C.c_int()
    cu.cuDeviceGetCount(C.byref(n))
    out({"op": "info", "rc": rc, "free": f.value, "total": t.value, "devtotal": dt.value, "count": n.value})

class Mem(C.Structure):
    _fields_ = [("total", C.c_ulonglong), ("free", C.c_ulonglong), ("used", C.c_ulonglong)]

class Mem2(C.Structure):
    _fields_ = [("version", C.c_uint), ("total", C.c_ulonglong), ("reserved", C.c_ulonglong),
                ("free", C.c_ulonglong), ("used", C.c_ulonglong)]

class Proc(C.Structure):
    _fields_ = [("pid", C.c_uint), ("used", C.c_ulonglong), ("gi", C.c_uint), ("ci", C.c_uint)]

def nvml():
    global nv
    if nv is None:
        nv = C.CDLL("libnvidia-ml.so.1")
        check(nv.nvmlInit_v2(), "nvmlInit_v2")
    n = C.c_uint()
    nv.nvmlDeviceGetCount_v2(C.byref(n))
    h = C.c_void_p()
    check(nv.nvmlDeviceGetHandleByIndex_v2(0, C.byref(h)), "nvmlDeviceGetHandleByIndex_v2")
    m = Mem()
    rc1 = nv.nvmlDeviceGetMemoryInfo(h, C.byref(m))
    m2 = Mem2()
    m2.version = 0x02000028
    rc2 = nv.nvmlDeviceGetMemoryInfo_v2(h, C.byref(m2))
    procs = (Proc * 64)()
    cnt = C.c_uint(64)
    rc3 = nv.nvmlDeviceGetComputeRunningProcesses_v3(h, C.byref(cnt), procs)
    pids = [[procs[i].pid, procs[i].used] for i in range(cnt.value)] if rc3 == 0 else []
    uuids = []
    for i in range(n.value):
        hi = C.c_void_p()
        buf = C.create_string_buffer(96)
        if nv.nvmlDeviceGetHandleByIndex_v2(i, C.byref(hi)) == 0 and nv.nvmlDeviceGetUUID(hi, buf, 96) == 0:
            uuids.append(buf.value.decode())
    out({"op": "nvml", "count": n.value, "rc": [rc1, rc2, rc3], "uuids": uuids,
         "v1": {"total": m.total, "free": m.free, "used": m.used},
         "v2": {"total": m2.total, "free": m2.free, "used": m2.used, "reserved": m2.reserved},
         "procs": pids})

CTX = C.c_void_p()
CTXS = []
GREENS = []  # green contexts made by `green`
maps = []      # (handle, va, size, released)
retained = []  # handles from cuMemRetainAllocationHandle
pools = []
IPC = []       # pointers from cuIpcOpenMemHandle
STREAM = C.c_void_p()

def vmm_prop(dev):
    # CUmemAllocationProp: type=1 (pinned), requested handle types 1 (POSIX
    # file descriptor: exportable), location {type 1 (device), id dev}
    return (C.c_int * 8)(1, 1, 1, dev, 0, 0, 0, 0)

def vmm_map(n, dev):
    prop = vmm_prop(dev)
    gran = C.c_size_t()
    rc = cu.cuMemGetAllocationGranularity(C.byref(gran), prop, 0)
    if rc != 0:
        return rc, n
    n = (n + gran.value - 1) // gran.value * gran.value
    h = C.c_uint64()
    rc = cu.cuMemCreate(C.byref(h), C.c_size_t(n), prop, C.c_uint64(0))
    if rc != 0:
        return rc, n
    va = C.c_uint64()
    check(cu.cuMemAddressReserve(C.byref(va), C.c_size_t(n), C.c_size_t(0), C.c_uint64(0), C.c_uint64(0)), "cuMemAddressReserve")
    check(cu.cuMemMap(C.c_uint64(va.value), C.c_size_t(n), C.c_size_t(0), h, C.c_uint64(0)), "cuMemMap")
    # CUmemAccessDesc: location {type 1, id dev}, flags 3 (read-write)
    acc = (C.c_int * 4)(1, dev, 3, 0)
    check(cu.cuMemSetAccess(C.c_uint64(va.value), C.c_size_t(n), acc, C.c_size_t(1)), "cuMemSetAccess")
    maps.append([h.value, va.value, n])
    return 0, n

def race(seed, steps, mx):
    if CTX.value:
        check(cu.cuCtxSetCurrent(CTX), "cuCtxSetCurrent")
    rnd = random.Random(seed)
    mine = []
    ok = oom = 0
    for _ in range(steps):
        if mine and rnd.random() < 0.45:
            item = mine.pop(rnd.randrange(len(mine)))
            check(cu.cuMemFree_v2(C.c_uint64(item)), "cuMemFree_v2")
        else:
            p = C.c_uint64()
            rc = cu.cuMemAlloc_v2(C.byref(p), C.c_size_t(rnd.randint(1, mx)))
            if rc == 0:
                mine.append(p.value)
                ok += 1
            elif rc == 2:
                oom += 1
            else:
                check(rc, "cuMemAlloc_v2")
    for p in mine:
        check(cu.cuMemFree_v2(C.c_uint64(p)), "cuMemFree_v2")
    return ok, oom

def main(argv):
    global nv
    i = 0
    while i < len(argv):
        cmd = argv[i]
        i += 1
        def arg():
            nonlocal i
            i += 1
            return argv[i - 1]
        if cmd == "init":
            check(cu.cuInit(0), "cuInit")
        elif cmd in ("ctx", "pctx"):
            dev = 0
            if i < len(argv) and argv[i].isdigit():
                dev = int(arg())
            make_ctx(dev, cmd == "pctx")
        elif cmd == "info":
            info()
        elif cmd == "nvml":
            nvml()
        elif cmd == "alloc":
            n = int(arg())
            out({"op": "alloc", "bytes": n, "rc": do_alloc(n)})
        elif cmd == "pitch":
            w, h = int(arg()), int(arg())
            p, pitch = C.c_uint64(), C.c_size_t()
            rc = cu.cuMemAllocPitch_v2(C.byref(p), C.byref(pitch), C.c_size_t(w), C.c_size_t(h), 4)
            if rc == 0:
                held.append(("ptr", p.value, pitch.value * h))
            out({"op": "pitch", "rc": rc, "pitch": pitch.value})
        elif cmd == "managed":
            n = int(arg())
            p = C.c_uint64()
            rc = cu.cuMemAllocManaged(C.byref(p), C.c_size_t(n), 1)
            if rc == 0:
                held.append(("ptr", p.value, n))
            out({"op": "managed", "rc": rc})
        elif cmd == "async":
            n = int(arg())
            p = C.c_uint64()
            rc = cu.cuMemAllocAsync(C.byref(p), C.c_size_t(n), None)
            if rc == 0:
                held.append(("async", p.value, n))
            out({"op": "async", "rc": rc})
        elif cmd == "setlimit":
            lim, v = int(arg()), int(arg())
            rc = cu.cuCtxSetLimit(C.c_int(lim), C.c_size_t(v))
            out({"op": "setlimit", "limit": lim, "value": v, "rc": rc})
        elif cmd == "getlimit":
            lim = int(arg())
            v = C.c_size_t()
            rc = cu.cuCtxGetLimit(C.byref(v), C.c_int(lim))
            out({"op": "getlimit", "limit": lim, "rc": rc, "value": v.value})
        elif cmd == "resident":
            d, a, b = C.c_int(), C.c_int(), C.c_int()
            cu.cuCtxGetDevice(C.byref(d))
            check(cu.cuDeviceGetAttribute(C.byref(a), 39, d), "cuDeviceGetAttribute")
            check(cu.cuDeviceGetAttribute(C.byref(b), 16, d), "cuDeviceGetAttribute")
            out({"op": "resident", "threads": a.value * b.value})
        elif cmd == "vmm":
            n = int(arg())
            # CUmemAllocationProp: type=1 (pinned), handle types 0, location {type 1 (device), id 0}
            prop = (C.c_int * 8)(1, 0, 1, 0, 0, 0, 0, 0)
            gran = C.c_size_t()
            try:
                rc = cu.cuMemGetAllocationGranularity(C.byref(gran), prop, 0)
            except AttributeError:
                rc, gran.value = 0, 2 << 20
            if rc == 0 and gran.value:
                n = (n + gran.value - 1) // gran.value * gran.value
            h = C.c_uint64()
            rc = cu.cuMemCreate(C.byref(h), C.c_size_t(n), prop, C.c_uint64(0))
            if rc == 0:
                held.append(("vmm", h.value, n))
            out({"op": "vmm", "rc": rc, "bytes": n})
        elif cmd == "vmmmap":
            n = int(arg())
            dev = 0
            if i < len(argv) and argv[i].isdigit():
                dev = int(arg())
            rc, n = vmm_map(n, dev)
            out({"op": "vmmmap", "rc": rc, "bytes": n})
        elif cmd == "vmmrelease":
            out({"op": "vmmrelease", "rc": cu.cuMemRelease(C.c_uint64(maps[-1][0]))})
        elif cmd == "vmmunmap":
            h, va, n = maps.pop()
            rc = cu.cuMemUnmap(C.c_uint64(va), C.c_size_t(n))
            rc2 = cu.cuMemAddressFree(C.c_uint64(va), C.c_size_t(n))
            out({"op": "vmmunmap", "rc": rc, "rc_free": rc2})
        elif cmd == "vmmretain":
            h = C.c_uint64()
            rc = cu.cuMemRetainAllocationHandle(C.byref(h), C.c_void_p(maps[-1][1]))
            if rc == 0:
                retained.append(h.value)
            out({"op": "vmmretain", "rc": rc, "same": h.value == maps[-1][0]})
        elif cmd == "vmmrelretained":
            out({"op": "vmmrelretained", "rc": cu.cuMemRelease(C.c_uint64(retained.pop()))})
        elif cmd == "vmmexport":
            fd = C.c_int(-1)
            rc = cu.cuMemExportToShareableHandle(C.byref(fd), C.c_uint64(maps[-1][0]), 1, C.c_uint64(0))
            out({"op": "vmmexport", "rc": rc, "fd": fd.value, "pid": os.getpid()})
        elif cmd in ("vmmimport", "vmmimportfd"):
            if cmd == "vmmimport":
                fd = os.open(arg(), os.O_RDWR)
            else:
                pid, their = int(arg()), int(arg())
                pidfd = os.pidfd_open(pid)
                libc = C.CDLL(None, use_errno=True)
                fd = libc.syscall(438, pidfd, their, 0)  # pidfd_getfd
                os.close(pidfd)
                if fd < 0:
                    raise OSError(C.get_errno(), "pidfd_getfd")
            n = int(arg())
            h = C.c_uint64()
            rc = cu.cuMemImportFromShareableHandle(C.byref(h), C.c_void_p(fd), 1)
            os.close(fd)
            rc_map = None
            if rc == 0:
                va = C.c_uint64()
                check(cu.cuMemAddressReserve(C.byref(va), C.c_size_t(n), C.c_size_t(0), C.c_uint64(0), C.c_uint64(0)), "cuMemAddressReserve")
                rc_map = cu.cuMemMap(C.c_uint64(va.value), C.c_size_t(n), C.c_size_t(0), h, C.c_uint64(0))
                if rc_map == 0:
                    acc = (C.c_int * 4)(1, 0, 3, 0)
                    check(cu.cuMemSetAccess(C.c_uint64(va.value), C.c_size_t(n), acc, C.c_size_t(1)), "cuMemSetAccess")
                    maps.append([h.value, va.value, n])
                else:
                    cu.cuMemAddressFree(C.c_uint64(va.value), C.c_size_t(n))
                    cu.cuMemRelease(h)
            out({"op": "vmmimport", "rc": rc, "rc_map": rc_map})
        elif cmd == "ipcget":
            h = (C.c_ubyte * 64)()
            ptr = [x for x in held if x[0] == "ptr"][-1][1]
            rc = cu.cuIpcGetMemHandle(h, C.c_uint64(ptr))
            out({"op": "ipcget", "rc": rc, "handle": bytes(h).hex()})
        elif cmd == "ipcopen":
            class IpcHandle(C.Structure):
                _fields_ = [("reserved", C.c_ubyte * 64)]
            h = IpcHandle()
            C.memmove(h.reserved, bytes.fromhex(arg()), 64)
            p = C.c_uint64()
            rc = cu.cuIpcOpenMemHandle_v2(C.byref(p), h, 1)
            IPC.append(p.value)
            out({"op": "ipcopen", "rc": rc})
        elif cmd == "ipcclose":
            out({"op": "ipcclose", "rc": cu.cuIpcCloseMemHandle(C.c_uint64(IPC.pop()))})
        elif cmd == "pool":
            where = arg() if i < len(argv) and (argv[i].isdigit() or argv[i] == "host") else "0"
            # CUmemPoolProps: allocType 1 (pinned), handleTypes 0, location {type, id}, ... (88 bytes)
            props = (C.c_int * 22)()
            props[0] = 1
            if where == "host":
                props[2], props[3] = 2, 0
            else:
                props[2], props[3] = 1, int(where)
            pool = C.c_void_p()
            rc = cu.cuMemPoolCreate(C.byref(pool), props)
            if rc == 0:
                pools.append(pool.value)
            out({"op": "pool", "rc": rc})
        elif cmd == "defpool":
            d = C.c_int()
            check(cu.cuDeviceGet(C.byref(d), int(arg())), "cuDeviceGet")
            pool = C.c_void_p()
            rc = cu.cuDeviceGetDefaultMemPool(C.byref(pool), d)
            if rc == 0:
                pools.append(pool.value)
            out({"op": "defpool", "rc": rc})
        elif cmd == "poolalloc":
            n = int(arg())
            p = C.c_uint64()
            rc = cu.cuMemAllocFromPoolAsync(C.byref(p), C.c_size_t(n), C.c_void_p(pools[-1]), STREAM)
            if rc == 0:
                held.append(("async", p.value, n))
            out({"op": "poolalloc", "rc": rc})
        elif cmd == "pooldestroy":
            rc = cu.cuMemPoolDestroy(C.c_void_p(pools.pop()))
            out({"op": "pooldestroy", "rc": rc})
        elif cmd == "stream":
            check(cu.cuStreamCreate(C.byref(STREAM), 0), "cuStreamCreate")
        elif cmd == "setctx":
            check(cu.cuCtxSetCurrent(C.c_void_p(CTXS[int(arg())])), "cuCtxSetCurrent")
        elif cmd == "array":
            w, h = int(arg()), int(arg())
            desc = (C.c_size_t * 3)(w, h, 0)
            C.cast(C.byref(desc, 16), C.POINTER(C.c_uint * 2))[0][0] = 0x20
            C.cast(C.byref(desc, 16), C.POINTER(C.c_uint * 2))[0][1] = 1
            a = C.c_void_p()
            rc = cu.cuArrayCreate_v2(C.byref(a), desc)
            if rc == 0:
                held.append(("array", a.value, w * h * 4))
            out({"op": "array", "rc": rc})
        elif cmd == "freeall":
            rcs = [free_one(x) for x in held]
            held.clear()
            out({"op": "freeall", "rcs": rcs})
        elif cmd == "race":
            seed, steps, mx = int(arg()), int(arg()), int(arg())
            ok, oom = race(seed, steps, mx)
            out({"op": "race", "ok": ok, "oom": oom})
        elif cmd == "threads":
            t, steps, mx = int(arg()), int(arg()), int(arg())
            res = []
            ths = [threading.Thread(target=lambda s=s: res.append(race(s, steps, mx))) for s in range(t)]
            for th in ths:
                th.start()
            for th in ths:
                th.join()
            out({"op": "threads", "ok": sum(r[0] for r in res), "oom": sum(r[1] for r in res)})
        elif cmd == "sleep":
            time.sleep(float(arg()))
        elif cmd == "ready":
            out({"op": "ready"})
        elif cmd == "hold":
            out({"op": "ready"})
            while True:
                time.sleep(3600)
        elif cmd == "loop":
            mx = int(arg())
            rnd = random.Random(os.getpid())
            out({"op": "ready"})
            mine = []
            while True:
                if mine and rnd.random() < 0.5:
                    cu.cuMemFree_v2(C.c_uint64(mine.pop()))
                else:
                    p = C.c_uint64()
                    if cu.cuMemAlloc_v2(C.byref(p), C.c_size_t(rnd.randint(1, mx))) == 0:
                        mine.append(p.value)
        elif cmd == "nvmlraw":
            lib = nv if nv is not None else C.CDLL("libnvidia-ml.so.1")
            n = C.c_uint()
            rc1 = lib.nvmlDeviceGetCount_v2(C.byref(n))
            rc2 = lib.nvmlShutdown()
            out({"op": "nvmlraw", "count_rc": rc1, "shutdown_rc": rc2})
        elif cmd == "nvmluuid":
            u = arg()
            if nv is None:
                nv = C.CDLL("libnvidia-ml.so.1")
                check(nv.nvmlInit_v2(), "nvmlInit_v2")
            hi = C.c_void_p()
            out({"op": "nvmluuid", "rc": nv.nvmlDeviceGetHandleByUUID(u.encode(), C.byref(hi))})
        elif cmd == "destroy":
            rc = cu.cuCtxDestroy_v2(CTX)
            held.clear()
            CTX.value = None
            out({"op": "destroy", "rc": rc})
        elif cmd == "prelease":
            d = C.c_int()
            cu.cuDeviceGet(C.byref(d), 0)
            rc = cu.cuDevicePrimaryCtxRelease_v2(d)
            held.clear()
            CTX.value = None
            out({"op": "prelease", "rc": rc})
        elif cmd == "pretain":
            d, c = C.c_int(), C.c_void_p()
            cu.cuDeviceGet(C.byref(d), 0)
            out({"op": "pretain", "rc": cu.cuDevicePrimaryCtxRetain(C.byref(c), d)})
        elif cmd == "preset":
            d = C.c_int()
            cu.cuDeviceGet(C.byref(d), 0)
            out({"op": "preset", "rc": cu.cuDevicePrimaryCtxReset_v2(d)})
        elif cmd == "green":
            d = C.c_int()
            cu.cuDeviceGet(C.byref(d), 0)
            res = C.create_string_buffer(256)  # a CUdevResource (144 bytes)
            desc, g = C.c_void_p(), C.c_void_p()
            rc = cu.cuDeviceGetDevResource(d, res, 1)  # CU_DEV_RESOURCE_TYPE_SM
            rc = rc or cu.cuDevResourceGenerateDesc(C.byref(desc), res, 1)
            rc = rc or cu.cuGreenCtxCreate(C.byref(g), desc, d, 1)  # DEFAULT_STREAM
            GREENS.append(g)
            out({"op": "green", "rc": rc})
        elif cmd == "greendestroy":
            g = GREENS[int(arg())]
            out({"op": "greendestroy", "rc": cu.cuGreenCtxDestroy(g)})
        elif cmd == "waitline":
            sys.stdin.readline()
        elif cmd == "poll":
            want, secs = int(arg()), float(arg())
            t0 = time.monotonic()
            f, t = C.c_size_t(), C.c_size_t()
            ok = False
            while time.monotonic() - t0 < secs:
                cu.cuMemGetInfo_v2(C.byref(f), C.byref(t))
                if f.value >= want:
                    ok = True
                    break
                time.sleep(0.005)
            out({"op": "poll", "ok": ok, "ms": (time.monotonic() - t0) * 1000, "free": f.value})
        elif cmd == "forksleep":
            secs = float(arg())
            sys.stdout.flush()
            if os.fork() == 0:
                time.sleep(secs)
                os._exit(0)
        elif cmd == "fork":
            sys.stdout.flush()
            pid = os.fork()
            if pid == 0:
                try:
                    make_ctx(0, False)
                    out({"op": "child_alloc", "rc": do_alloc(1 << 20)})
                    info()
                    nvml()
                finally:
                    os._exit(0)
            _, st = os.waitpid(pid, 0)
            out({"op": "fork", "status": st})
        else:
            out({"op": "error", "what": "unknown command " + cmd})
            sys.exit(2)

if __name__ == "__main__":
    main(sys.argv[1:])
