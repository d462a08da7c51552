"""Shared by the gpu-check programs: the run's settings, GPU worker processes
with a timeout on every exchange, and the result lines the shell aggregates.

Result lines (stdout), one per table row, tab-separated:
    @@RESULT<TAB>check<TAB>expected<TAB>measured<TAB>PASS|FAIL|SKIP
Everything else a check prints is log.
"""

import json
import os
import select
import signal
import subprocess
import sys
import time

MiB = 1 << 20
GiB = 1 << 30
HERE = os.path.dirname(os.path.abspath(__file__))

# ---------------------------------------------------------------- settings


def setting(name, default=""):
    return os.environ.get("CGPU_CHECK_" + name, default)


SIM = setting("SIM") == "1"
QUICK = setting("QUICK") == "1"
LIB = setting("LIB")
CGPUCTL = setting("CGPUCTL")
CGPUSMI = setting("CGPUSMI")
PYTHON = setting("PYTHON", sys.executable)
WORKDIR = setting("WORKDIR", "/tmp")
NVIDIA_SMI = setting("NVIDIA_SMI")
GPU = setting("GPU", "0")


def probe():
    """What probe.py found (physical totals, backends), or {} before it ran."""
    try:
        with open(os.path.join(WORKDIR, "probe.json")) as f:
            return json.load(f)
    except OSError:
        return {}


def say(*a):
    print(*a, flush=True)


def fmt_mib(b):
    return "%d MiB" % (b // MiB) if b % MiB == 0 else "%.2f MiB" % (b / MiB)


# ---------------------------------------------------------------- results

_results = []


def result(check, expected, measured, ok):
    """ok: True (PASS), False (FAIL) or None (SKIP)."""
    status = "SKIP" if ok is None else ("PASS" if ok else "FAIL")
    clean = [str(x).replace("\t", " ").replace("\n", " ") for x in (check, expected, measured)]
    _results.append((clean[0], status))
    print("@@RESULT\t%s\t%s\t%s\t%s" % (clean[0], clean[1], clean[2], status), flush=True)


# ---------------------------------------------------------------- environments

# Variables of ours the caller's shell may carry; workers get only what we set.
_OURS = ("ALIYUN_COM_GPU_", "CGPU_", "LD_PRELOAD", "PYTORCH_CUDA_ALLOC_CONF")
_KEEP = ("CGPU_SIM_", "CGPU_LOG", "CGPU_REAL_")


def base_env():
    env = {}
    for k, v in os.environ.items():
        if k.startswith(_OURS) and not k.startswith(_KEEP):
            continue
        env[k] = v
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    env["CUDA_VISIBLE_DEVICES"] = GPU
    env.setdefault("CUDA_MODULE_LOADING", "LAZY")
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    return env


_ledger_n = [0]


def new_ledger_dir(tag):
    _ledger_n[0] += 1
    d = os.path.join(WORKDIR, "ledger-%s-%d-%d" % (tag, os.getpid(), _ledger_n[0]))
    os.makedirs(d, exist_ok=True)
    return d


def container_env(container=None, ledger=None, preload=True, **extra):
    """The environment of one process of container `container`.

    preload=False: no cgpu at all (the bare driver)."""
    env = base_env()
    if preload:
        if not LIB:
            raise RuntimeError("no libcgpu.so (CGPU_CHECK_LIB unset)")
        env["LD_PRELOAD"] = LIB
        env["CGPU_LEDGER_DIR"] = ledger or new_ledger_dir("x")
        env["CGPU_CONTAINER_ID"] = container or "gpucheck"
    for k, v in extra.items():
        if v is not None:
            env[k] = str(v)
    return env


def describe_env(env):
    keys = sorted(k for k in env if k.startswith(_OURS) and not k.startswith("CGPU_SIM_"))
    return " ".join("%s=%s" % (k, env[k]) for k in keys)


# ---------------------------------------------------------------- workers

_workers = []


class WorkerError(Exception):
    pass


class Worker:
    """A worker.py process. Every exchange has a deadline; a dead or silent
    worker raises WorkerError (the check turns it into FAIL)."""

    def __init__(self, label, backend, env, start_timeout=120.0, wait=True, **args):
        """wait=False: return at once; call ready() before the first command
        (so that several workers import their framework in parallel)."""
        self.label = label
        args["backend"] = backend
        say("  [%s] start %s backend, %s" % (label, backend, describe_env(env)))
        self.p = subprocess.Popen(
            [PYTHON, os.path.join(HERE, "worker.py"), json.dumps(args)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None,
            env=env, cwd=WORKDIR, bufsize=0)
        _workers.append(self)
        self.buf = b""
        self.started = False
        self.start_timeout = start_timeout
        if wait:
            self.ready()

    def ready(self, timeout=None):
        if self.started:
            return self
        r = self._read(timeout or self.start_timeout)
        if not r.get("ready"):
            self.kill()
            raise WorkerError("%s: did not start: %s" % (self.label, r.get("error")))
        self.started = True
        return self

    def _read(self, timeout):
        deadline = time.time() + timeout
        fd = self.p.stdout.fileno()
        while True:
            while b"\n" in self.buf:
                line, self.buf = self.buf.split(b"\n", 1)
                s = line.decode(errors="replace")
                if s.startswith("@@CGPU "):
                    return json.loads(s[7:])
                if s.strip():
                    say("  [%s] (stdout) %s" % (self.label, s))
            left = deadline - time.time()
            if left <= 0:
                self.kill()
                raise WorkerError("%s: no answer within %.0f s (killed)" % (self.label, timeout))
            r, _, _ = select.select([fd], [], [], min(left, 1.0))
            if r:
                chunk = os.read(fd, 65536)
                if not chunk:
                    rc = self.p.wait()
                    raise WorkerError("%s: exited with status %s (stderr is in the log above)"
                                      % (self.label, rc))
                self.buf += chunk

    def send(self, cmd):
        try:
            self.p.stdin.write((json.dumps(cmd) + "\n").encode())
            self.p.stdin.flush()
        except (BrokenPipeError, OSError) as e:
            raise WorkerError("%s: cannot send %s: %s" % (self.label, cmd.get("op"), e))

    def recv(self, timeout=60.0):
        r = self._read(timeout)
        if not r.get("ok"):
            raise WorkerError("%s: %s" % (self.label, r.get("error")))
        return r

    def call(self, op, timeout=60.0, **kw):
        kw["op"] = op
        self.send(kw)
        r = self.recv(timeout)
        brief = {k: v for k, v in r.items() if k not in ("ok",)}
        say("  [%s] %s -> %s" % (self.label, op, json.dumps(brief, sort_keys=True)))
        return r

    def close(self, timeout=20.0):
        if self.p.poll() is None:
            try:
                self.send({"op": "exit"})
                self._read(timeout)
            except WorkerError:
                pass
            try:
                self.p.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        if self in _workers:
            _workers.remove(self)

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                pass


def kill_all():
    for w in list(_workers):
        w.kill()
    _workers.clear()


def _on_signal(signum, _frame):
    kill_all()
    say("killed by signal %d" % signum)
    sys.exit(124)


signal.signal(signal.SIGTERM, _on_signal)
signal.signal(signal.SIGINT, _on_signal)


def run_cmd(argv, env, timeout=30.0):
    """A command with a timeout; returns (rc, stdout, stderr), rc None on timeout."""
    try:
        p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
        return p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        return None, e.stdout or "", e.stderr or ""
    except OSError as e:
        return 127, "", str(e)


def cgpuctl(args, ledger, timeout=15.0):
    """Run cgpuctl against `ledger`; returns (ok, text). ok None: no cgpuctl."""
    if not CGPUCTL:
        return None, "cgpuctl not found"
    env = base_env()
    env["CGPU_LEDGER_DIR"] = ledger
    rc, out, err = run_cmd([CGPUCTL] + list(args), env, timeout)
    text = (out + err).strip()
    say("  $ cgpuctl %s  -> rc=%s %s" % (" ".join(args), rc, text[:500]))
    return rc == 0, text


class section:
    """Rows `names` (each starting with its id, e.g. "2a ...") come from this
    block; if it raises, the rows it did not report yet are FAIL with the
    error, its workers are killed, and the check goes on with the next block."""

    def __init__(self, *names):
        self.names = names

    def __enter__(self):
        self.start = len(_results)
        return self

    def __exit__(self, et, e, tb):
        if e is None:
            return False
        if not isinstance(e, Exception):
            return False
        import traceback

        traceback.print_exception(et, e, tb)
        kill_all()
        done = {n.split()[0] for n, _ in _results[self.start:]}
        for n in self.names:
            if n.split()[0] not in done:
                result(n, "-", "error: %s: %s" % (type(e).__name__, e), False)
        return True


def sim_device_time():
    """{pid: device time in ns} of every process the simulated GPU has seen
    (its own counters, through `cgpu-sim-stat --json`); None off the sim or
    without cgpu-sim-stat."""
    stat = setting("SIM_STAT")
    state = os.environ.get("CGPU_SIM_STATE", "")
    if not SIM or not stat or not state:
        return None
    rc, out, err = run_cmd([stat, "--state", state, "--json"], os.environ.copy(), 15)
    if rc != 0:
        raise WorkerError("cgpu-sim-stat --json: exit %s: %s" % (rc, err.strip()[:200]))
    t = {}
    for p in json.loads(out).get("processes", []):
        t[int(p["pid"])] = t.get(int(p["pid"]), 0) + int(p["device_time_ns"])
    return t


class NvmlProcUtil:
    """NVML's per-process SM utilisation summed over a window
    (nvml_procutil.py, run without LD_PRELOAD so NVML sees every process):
    start() at the window's start, result() after it."""

    def __init__(self, seconds):
        self.seconds = seconds
        self.p = None

    def start(self):
        self.p = subprocess.Popen(
            [PYTHON, os.path.join(HERE, "nvml_procutil.py"), GPU, str(self.seconds)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=base_env())
        return self

    def result(self):
        """{"samples": n, "sm": {pid: summed smUtil}} or {"error": ...}."""
        try:
            out, err = self.p.communicate(timeout=self.seconds + 60)
        except subprocess.TimeoutExpired:
            self.p.kill()
            return {"error": "nvml_procutil.py did not finish"}
        try:
            d = json.loads(out.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return {"error": "nvml_procutil.py: %s" % (out + err).strip()[-300:]}
        if "sm" in d:
            d["sm"] = {int(k): v for k, v in d["sm"].items()}
        return d


def log_ledger(ledger, what):
    """Put the operator's view of `ledger` (cgpu-smi, cgpuctl tree) in the log."""
    env = base_env()
    env["CGPU_LEDGER_DIR"] = ledger
    for tool, args in ((CGPUSMI, []), (CGPUCTL, ["tree"])):
        if tool:
            rc, out, err = run_cmd([tool] + args, env, 15)
            say("  --- %s %s (%s), rc=%s\n%s%s" % (os.path.basename(tool), " ".join(args), what, rc,
                                                   out, err))


def main_wrapper(fn):
    """Run a check's main; an exception in our own code is one FAIL row, and
    every worker is gone when we return."""
    name = os.path.basename(sys.argv[0])
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the whole point
        import traceback

        traceback.print_exc()
        result(name, "runs to the end", "crashed: %s: %s" % (type(e).__name__, e), False)
    finally:
        kill_all()
    sys.exit(0)
