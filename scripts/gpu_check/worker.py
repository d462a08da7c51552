#!/usr/bin/env python3
"""One GPU process of a gpu-check scenario ("a process of a container").

Started by the check programs, usually under LD_PRELOAD=libcgpu.so with the
container's environment. Talks a line protocol: one JSON command per line on
stdin, one reply per line on stdout prefixed with "@@CGPU " (anything else a
framework prints is ignored by the parent). Diagnostics go to stderr, which
ends up in the gpu-check log.

Backends (what touches the GPU):
  torch  PyTorch, unchanged (the real-hardware case)
  cuda   NVIDIA's cuda-bindings on the driver API (fallback; the simulated driver)
  cupy   CuPy (memory checks only)
  jax    JAX (memory checks only)

Commands ({"op": ...}):
  info                      device name, totals, versions
  meminfo                   {"free", "total"} as the framework reports them
  procmem                   this process's pid, meminfo and what its framework
                            holds from the driver (PyTorch: memory_reserved)
  devices                   every visible device's index, name, mem_get_info
                            total/free and device total (one context each)
  fill   chunk, limit       allocate `chunk`-byte blocks until out of memory or
                            `limit` bytes; keeps them. Reports bytes, the error
                            type that stopped it, and whether it was an OOM.
  alloc  bytes              one allocation of `bytes`, kept on success
  free                      free everything held
  loop   start_at, end_at   the compute loop (bf16 matmuls / spin kernels);
                            counts iterations completed in [start_at, end_at]
  train  seconds            the training-like loop, timed; returns s/iteration
  blas_ws leave             (torch) cuBLAS workspaces: a matmul warms cuBLAS up,
                            one on a fresh stream gets a workspace of its own
                            (memory deltas reported); after empty_cache() the
                            quota is filled to `leave` bytes free and a matmul
                            on another fresh stream needs a workspace again
                            (outcome reported); then everything is freed and
                            that stream's matmul is tried once more
                            (leave < 0: the first part only)
  capture steps             capture a fresh CUDA graph now and replay it
  exit
"""

import ctypes
import json
import os
import signal
import sys
import time
import traceback

MiB = 1 << 20

# A real spin kernel: loops on %globaltimer until `ns` nanoseconds have passed.
# On the simulated driver a kernel named cgpu_sim_spin* runs for its first u64
# parameter in ns, so the same PTX serves both.
SPIN_PTX = b"""
.version 7.0
.target sm_70
.address_size 64

.visible .entry cgpu_sim_spin(
    .param .u64 cgpu_sim_spin_param_0
)
{
    .reg .pred  %p<2>;
    .reg .b64   %rd<6>;

    ld.param.u64    %rd1, [cgpu_sim_spin_param_0];
    mov.u64         %rd2, %globaltimer;
$L_spin:
    mov.u64         %rd3, %globaltimer;
    sub.s64         %rd4, %rd3, %rd2;
    setp.lt.u64     %p1, %rd4, %rd1;
    @%p1 bra        $L_spin;
    ret;
}
\x00"""


def log(*a):
    print("[worker %d]" % os.getpid(), *a, file=sys.stderr, flush=True)


def die_with_parent():
    """Never outlive the check program that started us (PR_SET_PDEATHSIG)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG = 1
        if os.getppid() == 1:
            os._exit(3)
    except Exception:  # pragma: no cover - best effort
        pass


def sleep_until(t):
    while True:
        d = t - time.time()
        if d <= 0:
            return
        time.sleep(min(d, 0.05))


class OOM(Exception):
    """An allocation refused as out of memory (the framework's own type in .kind)."""

    def __init__(self, kind, msg):
        super().__init__(msg)
        self.kind = kind


# --------------------------------------------------------------------------
# torch
# --------------------------------------------------------------------------
class TorchBackend:
    name = "torch"

    def __init__(self, args):
        import torch

        self.torch = torch
        if not torch.cuda.is_available():
            raise RuntimeError("torch.cuda.is_available() is False")
        torch.cuda.set_device(0)
        self.dev = torch.device("cuda", 0)
        torch.zeros(1, device=self.dev)  # create the context
        torch.cuda.synchronize()
        self.held = []
        self.n = int(args.get("matmul_n", 8192))

    def info(self):
        t = self.torch
        p = t.cuda.get_device_properties(0)
        free, total = t.cuda.mem_get_info()
        return {
            "name": p.name,
            "total": total,
            "free": free,
            "props_total": p.total_memory,
            "framework": "torch " + t.__version__,
            "cuda": t.version.cuda,
            "driver": t._C._cuda_getDriverVersion() if hasattr(t._C, "_cuda_getDriverVersion") else None,
        }

    def meminfo(self):
        free, total = self.torch.cuda.mem_get_info()
        return free, total

    def framework_reserved(self):
        return self.torch.cuda.memory_reserved()

    def devices(self):
        t = self.torch
        out = []
        for i in range(t.cuda.device_count()):
            free, total = t.cuda.mem_get_info(i)
            p = t.cuda.get_device_properties(i)
            out.append({"index": i, "name": p.name, "total": total, "free": free,
                        "props_total": p.total_memory})
        return out

    def alloc(self, nbytes):
        t = self.torch
        try:
            x = t.empty(int(nbytes), dtype=t.uint8, device=self.dev)
        except t.cuda.OutOfMemoryError as e:
            raise OOM("torch.cuda.OutOfMemoryError", str(e).splitlines()[0])
        self.held.append(x)

    def free(self):
        self.held.clear()
        self.torch.cuda.synchronize()
        self.torch.cuda.empty_cache()

    # --- compute
    def loop_setup(self):
        t = self.torch
        if not hasattr(self, "_mm"):
            n = self.n
            g = t.Generator(device=self.dev).manual_seed(1)
            a = t.randn(n, n, device=self.dev, dtype=t.bfloat16, generator=g)
            b = t.randn(n, n, device=self.dev, dtype=t.bfloat16, generator=g)
            c = t.empty(n, n, device=self.dev, dtype=t.bfloat16)
            self._mm = (a, b, c)

    def loop_step(self, k):
        a, b, c = self._mm
        for _ in range(k):
            self.torch.matmul(a, b, out=c)

    def sync(self):
        self.torch.cuda.synchronize()

    def mark(self):
        ev = self.torch.cuda.Event()
        ev.record()
        return ev

    def wait_mark(self, ev):
        ev.synchronize()

    def train_setup(self):
        t = self.torch
        if hasattr(self, "_train"):
            return
        nn = t.nn
        d = int(os.environ.get("CGPU_CHECK_TRAIN_DIM", "2048"))
        model = nn.Sequential(
            nn.Linear(d, d), nn.GELU(), nn.LayerNorm(d),
            nn.Linear(d, d), nn.GELU(), nn.LayerNorm(d),
            nn.Linear(d, d),
        ).to(self.dev, dtype=t.bfloat16)
        # fp32 conv2d (cuDNN) and fp32/fp16 matmuls (cuBLAS) besides the bf16 model
        conv = nn.Conv2d(16, 16, 3, padding=1).to(self.dev)
        img = t.randn(8, 16, 32, 32, device=self.dev)
        m32 = t.randn(512, 512, device=self.dev)
        self._extra = (conv, img, m32, m32.half())
        # foreach=False: one small kernel per parameter and op, as many as we can get
        opt = t.optim.AdamW(list(model.parameters()) + list(conv.parameters()), lr=1e-4,
                            foreach=False)
        x = t.randn(256, d, device=self.dev, dtype=t.bfloat16)
        # a captured CUDA graph of many small elementwise kernels, replayed each step
        small = t.randn(64, 1024, device=self.dev)
        s = t.cuda.Stream()
        s.wait_stream(t.cuda.current_stream())
        with t.cuda.stream(s):
            for _ in range(3):
                y = small
                for _ in range(32):
                    y = (y * 1.0001 + 0.5).relu_()
        t.cuda.current_stream().wait_stream(s)
        g = t.cuda.CUDAGraph()
        with t.cuda.graph(g):
            y = small
            for _ in range(32):
                y = (y * 1.0001 + 0.5).relu_()
        self._train = (model, opt, x, g, small)

    def blas_ws(self, leave):
        t = self.torch
        MiBf = float(MiB)

        def used():
            f, tot = t.cuda.mem_get_info()
            return tot - f

        def snap():
            t.cuda.synchronize()
            return {"used": used(), "reserved": t.cuda.memory_reserved(),
                    "total": t.cuda.mem_get_info()[1]}

        a = t.randn(512, 512, device=self.dev)
        b = t.randn(512, 512, device=self.dev)
        c = t.empty(512, 512, device=self.dev)
        t.matmul(a, b, out=c)  # loads cuBLAS, its handle, the default stream's workspace
        s0 = snap()
        with t.cuda.stream(t.cuda.Stream()):
            t.matmul(a, b, out=c)
        s1 = snap()
        r = {"fresh_used": s1["used"] - s0["used"], "fresh_reserved": s1["reserved"] - s0["reserved"]}
        if leave < 0:  # the first part only
            return r
        t.cuda.empty_cache()
        free = t.cuda.mem_get_info()[0]
        filler = t.empty(max(free - int(leave), 0), dtype=t.uint8, device=self.dev)
        s2 = snap()
        r["filled_free"] = s2["total"] - s2["used"]
        st = t.cuda.Stream()
        try:
            with t.cuda.stream(st):
                t.matmul(a, b, out=c)
            t.cuda.synchronize()
            r["full_error"] = None
        except Exception as e:  # what a job would see
            r["full_error"] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:160])
            r["full_oom"] = isinstance(e, t.cuda.OutOfMemoryError)
        s3 = snap()
        r["after_used"], r["total"] = s3["used"], s3["total"]
        r["after_delta"] = s3["used"] - s2["used"]
        del filler
        t.cuda.empty_cache()
        with t.cuda.stream(st):
            t.matmul(a, b, out=c)
        t.cuda.synchronize()
        r["recovered"] = True
        log("blas_ws: " + ", ".join("%s=%s" % (k, ("%.2f MiB" % (v / MiBf)) if isinstance(v, int)
                                            and not isinstance(v, bool) else v)
                                    for k, v in r.items()))
        return r

    def capture(self, steps):
        """Capture a fresh CUDA graph (forward pass + elementwise chain) now,
        and replay it `steps` times."""
        t = self.torch
        self.train_setup()
        model, _opt, x, _g, small = self._train
        s = t.cuda.Stream()
        s.wait_stream(t.cuda.current_stream())
        with t.cuda.stream(s), t.no_grad():
            for _ in range(2):
                model(x)
        t.cuda.current_stream().wait_stream(s)
        g = t.cuda.CUDAGraph()
        with t.no_grad(), t.cuda.graph(g):
            y = model(x)
            z = small
            for _ in range(16):
                z = (z * 0.999 + 0.25).relu_()
        for _ in range(steps):
            g.replay()
        t.cuda.synchronize()
        ok = bool(t.isfinite(y.float()).all().item())
        return {"replays": steps, "finite": ok}

    def train_step(self):
        model, opt, x, g, small = self._train
        conv, img, m32, m16 = self._extra
        out = model(x)
        loss = out.float().pow(2).mean() + conv(img).relu().mean()
        loss.backward()
        m32 @ m32
        m16 @ m16
        opt.step()
        opt.zero_grad(set_to_none=True)
        g.replay()
        # many tiny kernels outside the graph too
        z = small[:8]
        for _ in range(16):
            z = z + 1.0


# --------------------------------------------------------------------------
# cuda-bindings (driver API)
# --------------------------------------------------------------------------
def _import_driver():
    try:
        from cuda.bindings import driver  # cuda-bindings >= 12.6
        return driver
    except ImportError:
        from cuda import cuda as driver  # older cuda-python
        return driver


class CudaBackend:
    name = "cuda"

    def __init__(self, args):
        self.cu = _import_driver()
        cu = self.cu
        self.OOM = cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY
        self.check(cu.cuInit(0), "cuInit")
        self.dev = self.check(cu.cuDeviceGet(0), "cuDeviceGet")
        self.ctx = self.check(cu.cuDevicePrimaryCtxRetain(self.dev), "cuDevicePrimaryCtxRetain")
        self.check(cu.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")
        self.vmm = bool(args.get("vmm"))
        self.held = []
        self.kernel_ns = int(args.get("kernel_ns", 1_000_000))
        self._mod = None

    def check(self, res, what):
        err = res[0] if isinstance(res, tuple) else res
        if int(err) != 0:
            raise RuntimeError("%s failed: %s" % (what, self.errname(err)))
        if isinstance(res, tuple):
            rest = res[1:]
            return rest[0] if len(rest) == 1 else (rest or None)
        return None

    def errname(self, err):
        try:
            e, s = self.cu.cuGetErrorName(err)
            if int(e) == 0:
                return s.decode() if isinstance(s, bytes) else str(s)
        except Exception:
            pass
        return str(err)

    def info(self):
        cu = self.cu
        name = self.check(cu.cuDeviceGetName(256, self.dev), "cuDeviceGetName")
        name = name.split(b"\x00", 1)[0].decode(errors="replace")
        free, total = self.meminfo()
        devtotal = self.check(cu.cuDeviceTotalMem(self.dev), "cuDeviceTotalMem")
        ver = self.check(cu.cuDriverGetVersion(), "cuDriverGetVersion")
        try:
            import cuda.bindings as cb
            fw = "cuda-bindings " + cb.__version__
        except Exception:
            fw = "cuda-python"
        return {"name": name, "total": total, "free": free, "props_total": int(devtotal),
                "framework": fw, "cuda_driver_version": int(ver)}

    def meminfo(self):
        free, total = self.check(self.cu.cuMemGetInfo(), "cuMemGetInfo")
        return int(free), int(total)

    def framework_reserved(self):
        return sum(size for _kind, _h, size in self.held)

    def devices(self):
        cu = self.cu
        out = []
        for i in range(int(self.check(cu.cuDeviceGetCount(), "cuDeviceGetCount"))):
            d = self.check(cu.cuDeviceGet(i), "cuDeviceGet")
            ctx = self.check(cu.cuDevicePrimaryCtxRetain(d), "cuDevicePrimaryCtxRetain")
            self.check(cu.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
            free, total = self.meminfo()
            name = self.check(cu.cuDeviceGetName(256, d), "cuDeviceGetName")
            out.append({"index": i, "name": name.split(b"\x00", 1)[0].decode(errors="replace"),
                        "total": total, "free": free,
                        "props_total": int(self.check(cu.cuDeviceTotalMem(d), "cuDeviceTotalMem"))})
        self.check(cu.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")
        return out

    def alloc(self, nbytes):
        cu = self.cu
        nbytes = int(nbytes)
        if not self.vmm:
            res = cu.cuMemAlloc(nbytes)
            if int(res[0]) == int(self.OOM):
                raise OOM("CUDA_ERROR_OUT_OF_MEMORY", "cuMemAlloc(%d)" % nbytes)
            ptr = self.check(res, "cuMemAlloc")
            self.held.append(("alloc", ptr, nbytes))
            return
        # The expandable-segments path: physical memory from cuMemCreate,
        # mapped into a reserved VA range with cuMemMap/cuMemSetAccess.
        prop = cu.CUmemAllocationProp()
        prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = int(self.dev)
        gran = self.check(cu.cuMemGetAllocationGranularity(
            prop, cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM),
            "cuMemGetAllocationGranularity")
        gran = max(int(gran), 1)
        size = (nbytes + gran - 1) // gran * gran
        res = cu.cuMemCreate(size, prop, 0)
        if int(res[0]) == int(self.OOM):
            raise OOM("CUDA_ERROR_OUT_OF_MEMORY", "cuMemCreate(%d)" % size)
        handle = self.check(res, "cuMemCreate")
        ptr = self.check(cu.cuMemAddressReserve(size, 0, 0, 0), "cuMemAddressReserve")
        self.check(cu.cuMemMap(ptr, size, 0, handle, 0), "cuMemMap")
        desc = cu.CUmemAccessDesc()
        desc.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        desc.location.id = int(self.dev)
        desc.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        self.check(cu.cuMemSetAccess(ptr, size, [desc], 1), "cuMemSetAccess")
        self.held.append(("vmm", (ptr, handle), size))

    def free(self):
        cu = self.cu
        self.check(cu.cuCtxSynchronize(), "cuCtxSynchronize")
        for kind, h, size in reversed(self.held):
            if kind == "alloc":
                self.check(cu.cuMemFree(h), "cuMemFree")
            else:
                ptr, handle = h
                self.check(cu.cuMemUnmap(ptr, size), "cuMemUnmap")
                self.check(cu.cuMemAddressFree(ptr, size), "cuMemAddressFree")
                self.check(cu.cuMemRelease(handle), "cuMemRelease")
        self.held.clear()

    # --- compute
    def _module(self):
        if self._mod is None:
            cu = self.cu
            self._mod = self.check(cu.cuModuleLoadData(SPIN_PTX), "cuModuleLoadData")
            self._fn = self.check(cu.cuModuleGetFunction(self._mod, b"cgpu_sim_spin"),
                                  "cuModuleGetFunction")
            self._stream = self.check(cu.cuStreamCreate(0), "cuStreamCreate")
            self._params = {}
        return self._fn

    def _kparams(self, ns):
        """void** for one u64 parameter, kept alive in a cache (address as int)."""
        p = self._params.get(ns)
        if p is None:
            val = ctypes.c_uint64(ns)
            arr = (ctypes.c_void_p * 1)(ctypes.addressof(val))
            p = (val, arr)
            self._params[ns] = p
        return ctypes.addressof(p[1])

    def spin(self, ns, stream=None):
        cu = self.cu
        fn = self._module()
        self.check(cu.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0,
                                     stream if stream is not None else self._stream,
                                     self._kparams(int(ns)), 0), "cuLaunchKernel")

    def loop_setup(self):
        self._module()

    def loop_step(self, k):
        for _ in range(k):
            self.spin(self.kernel_ns)

    def sync(self):
        if self._mod is None:  # no stream of ours yet
            self.check(self.cu.cuCtxSynchronize(), "cuCtxSynchronize")
            return
        self.check(self.cu.cuStreamSynchronize(self._stream), "cuStreamSynchronize")

    def mark(self):
        if not getattr(self, "_free_events", None):
            self._free_events = [self.check(self.cu.cuEventCreate(0), "cuEventCreate")
                                 for _ in range(4)]
        ev = self._free_events.pop()
        self.check(self.cu.cuEventRecord(ev, self._stream), "cuEventRecord")
        return ev

    def wait_mark(self, ev):
        self.check(self.cu.cuEventSynchronize(ev), "cuEventSynchronize")
        self._free_events.append(ev)

    def train_setup(self):
        if hasattr(self, "_graph_exec"):
            return
        cu = self.cu
        fn = self._module()
        graph = self.check(cu.cuGraphCreate(0), "cuGraphCreate")
        prev = None
        self._graph_params = []
        for _ in range(8):
            p = cu.CUDA_KERNEL_NODE_PARAMS()
            p.func = fn
            p.gridDimX = p.gridDimY = p.gridDimZ = 1
            p.blockDimX = p.blockDimY = p.blockDimZ = 1
            p.sharedMemBytes = 0
            p.kernelParams = self._kparams(20_000)
            p.extra = 0
            deps = [prev] if prev is not None else None
            node = self.check(cu.cuGraphAddKernelNode(graph, deps, 1 if prev is not None else 0, p),
                              "cuGraphAddKernelNode")
            self._graph_params.append(p)
            prev = node
        self._graph = graph
        self._graph_exec = self.check(cu.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")

    def capture(self, steps):
        """A fresh graph of 8 kernel nodes, instantiated now and launched
        `steps` times (built node by node: the simulated driver has no stream
        capture)."""
        cu = self.cu
        fn = self._module()
        graph = self.check(cu.cuGraphCreate(0), "cuGraphCreate")
        keep, prev = [], None
        for _ in range(8):
            p = cu.CUDA_KERNEL_NODE_PARAMS()
            p.func = fn
            p.gridDimX = p.gridDimY = p.gridDimZ = 1
            p.blockDimX = p.blockDimY = p.blockDimZ = 1
            p.sharedMemBytes = 0
            p.kernelParams = self._kparams(20_000)
            p.extra = 0
            node = self.check(cu.cuGraphAddKernelNode(graph, [prev] if prev is not None else None,
                                                      1 if prev is not None else 0, p),
                              "cuGraphAddKernelNode")
            keep.append(p)
            prev = node
        ex = self.check(cu.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
        for _ in range(steps):
            self.check(cu.cuGraphLaunch(ex, self._stream), "cuGraphLaunch")
        self.sync()
        self.check(cu.cuGraphExecDestroy(ex), "cuGraphExecDestroy")
        self.check(cu.cuGraphDestroy(graph), "cuGraphDestroy")
        return {"replays": steps, "finite": True}

    def train_step(self):
        # "matmuls": a few long kernels; "elementwise": many small ones; a graph replay
        for _ in range(4):
            self.spin(200_000)
        for _ in range(24):
            self.spin(5_000)
        self.check(self.cu.cuGraphLaunch(self._graph_exec, self._stream), "cuGraphLaunch")


# --------------------------------------------------------------------------
# CuPy, JAX (memory checks)
# --------------------------------------------------------------------------
class CupyBackend:
    name = "cupy"

    def __init__(self, args):
        import cupy

        self.cp = cupy
        cupy.cuda.Device(0).use()
        cupy.zeros(1)
        self.held = []

    def info(self):
        free, total = self.meminfo()
        return {"name": "?", "total": total, "free": free, "framework": "cupy " + self.cp.__version__}

    def meminfo(self):
        free, total = self.cp.cuda.runtime.memGetInfo()
        return int(free), int(total)

    def alloc(self, nbytes):
        cp = self.cp
        try:
            self.held.append(cp.empty(int(nbytes), dtype=cp.uint8))
        except cp.cuda.memory.OutOfMemoryError as e:
            raise OOM("cupy.cuda.memory.OutOfMemoryError", str(e).splitlines()[0])

    def free(self):
        self.held.clear()
        self.cp.cuda.Device(0).synchronize()
        self.cp.get_default_memory_pool().free_all_blocks()


class JaxBackend:
    name = "jax"

    def __init__(self, args):
        import jax
        import jax.numpy as jnp

        self.jax, self.jnp = jax, jnp
        self.dev = [d for d in jax.devices() if d.platform == "gpu"][0]
        jnp.zeros(1).block_until_ready()
        self.held = []

    def info(self):
        free, total = self.meminfo()
        return {"name": str(self.dev), "total": total, "free": free,
                "framework": "jax " + self.jax.__version__}

    def meminfo(self):
        st = self.dev.memory_stats() or {}
        limit = int(st.get("bytes_limit", 0))
        return limit - int(st.get("bytes_in_use", 0)), limit

    def alloc(self, nbytes):
        jnp = self.jnp
        try:
            x = jnp.zeros(int(nbytes), dtype=jnp.uint8)
            x.block_until_ready()
        except Exception as e:  # XlaRuntimeError; its module moved between versions
            s = str(e)
            if "RESOURCE_EXHAUSTED" in s or "out of memory" in s.lower():
                raise OOM(type(e).__name__ + ":RESOURCE_EXHAUSTED", s.splitlines()[0][:200])
            raise
        self.held.append(x)

    def free(self):
        for x in self.held:
            x.delete()
        self.held.clear()


BACKENDS = {"torch": TorchBackend, "cuda": CudaBackend, "cupy": CupyBackend, "jax": JaxBackend}


# --------------------------------------------------------------------------
def op_fill(b, cmd):
    chunk = int(cmd["chunk"])
    limit = int(cmd.get("limit", 1 << 62))
    got = 0
    n = 0
    t0 = time.time()
    try:
        while got + chunk <= limit:
            b.alloc(chunk)
            got += chunk
            n += 1
    except OOM as e:
        return {"bytes": got, "chunks": n, "oom": True, "error": e.kind, "message": str(e),
                "seconds": time.time() - t0}
    return {"bytes": got, "chunks": n, "oom": False, "error": None, "seconds": time.time() - t0}


def op_alloc(b, cmd):
    try:
        b.alloc(int(cmd["bytes"]))
    except OOM as e:
        return {"allocated": False, "oom": True, "error": e.kind, "message": str(e)}
    return {"allocated": True, "oom": False, "error": None}


def op_loop(b, cmd):
    """Iterations completed inside [start_at, end_at] (wall clock, shared by
    peers). Two batches stay in flight (an event per batch), so the device is
    never idle waiting for the host: throughput is the device's, not Python's."""
    b.loop_setup()
    k = int(cmd.get("batch", 4))
    start_at, end_at = float(cmd["start_at"]), float(cmd["end_at"])
    pending = []
    t0 = None
    iters = 0
    while True:
        b.loop_step(k)
        pending.append(b.mark())
        if len(pending) < 2:
            continue
        b.wait_mark(pending.pop(0))
        t = time.time()
        if t0 is None:
            if t >= start_at:
                t0 = t
            continue
        iters += k
        if t >= end_at:
            break
    for ev in pending:
        b.wait_mark(ev)
    return {"iters": iters, "seconds": t - t0, "rate": iters / max(t - t0, 1e-9),
            "late_start": t0 - start_at}


def op_train(b, cmd):
    b.train_setup()
    secs = float(cmd.get("seconds", 2.0))
    warm = int(cmd.get("warmup", 3))
    for _ in range(warm):
        b.train_step()
    b.sync()
    t0 = time.time()
    n = 0
    while True:
        b.train_step()
        n += 1
        if n % 4 == 0:
            b.sync()
            if time.time() - t0 >= secs:
                break
    dt = time.time() - t0
    return {"iters": n, "seconds": dt, "per_iter": dt / n}


def main():
    die_with_parent()
    args = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    out = sys.stdout

    def reply(obj):
        out.write("@@CGPU " + json.dumps(obj) + "\n")
        out.flush()

    bname = args.get("backend", "torch")
    try:
        b = BACKENDS[bname](args)
        reply({"ok": True, "ready": True, "pid": os.getpid(), "backend": bname})
    except Exception as e:
        traceback.print_exc()
        reply({"ok": False, "ready": False, "error": "%s: %s" % (type(e).__name__, e)})
        return 1

    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            cmd = json.loads(line)
            op = cmd["op"]
            if op == "exit":
                reply({"ok": True})
                return 0
            if op == "info":
                r = b.info()
            elif op == "meminfo":
                f, t = b.meminfo()
                r = {"free": f, "total": t}
            elif op == "devices":
                r = {"devices": b.devices()}
            elif op == "procmem":
                b.sync()
                f, t = b.meminfo()
                r = {"pid": os.getpid(), "free": f, "total": t,
                     "framework_reserved": b.framework_reserved()}
            elif op == "blas_ws":
                r = b.blas_ws(int(cmd["leave"]))
            elif op == "fill":
                r = op_fill(b, cmd)
            elif op == "alloc":
                r = op_alloc(b, cmd)
            elif op == "free":
                b.free()
                r = {}
            elif op == "loop":
                r = op_loop(b, cmd)
            elif op == "train":
                r = op_train(b, cmd)
            elif op == "capture":
                t0 = time.time()
                r = b.capture(int(cmd.get("steps", 20)))
                r["seconds"] = time.time() - t0
            else:
                raise ValueError("unknown op %r" % op)
            r["ok"] = True
            reply(r)
        except Exception as e:
            traceback.print_exc()
            reply({"ok": False, "error": "%s: %s" % (type(e).__name__, e)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
