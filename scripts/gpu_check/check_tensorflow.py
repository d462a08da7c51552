#!/usr/bin/env python3
"""Check 7 (--tensorflow): TensorFlow 2.x, from its own Python (TensorFlow and
PyTorch do not share a virtualenv), under LD_PRELOAD with a 6 GiB quota on a
device of ALIYUN_COM_GPU_MEM_DEV GiB (on a T4 counted as 15 GiB: 6043 MiB):

7a  tf.config.list_physical_devices('GPU') sees the GPU
7b  the device TensorFlow creates fits the quota (TF keeps a fixed reserve
    out of the free memory cuMemGetInfo reports: ~1 GiB on compute 7.x)
7c  allocating past the quota raises ResourceExhaustedError; the process
    still computes afterwards
7d  a small Keras model fits (two epochs)

Each step runs in a fresh TensorFlow process (its allocator grabs memory at
start-up), the same program without LD_PRELOAD first: a TensorFlow that
cannot use the GPU without cgpu either is SKIP.
"""

import json
import os

import common as c

QUOTA_GIB = 6

PROGRAM = r'''
import json, os, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf
out = {"version": tf.__version__}
gpus = tf.config.list_physical_devices("GPU")
out["gpus"] = len(gpus)
if gpus:
    from tensorflow.python.client import device_lib
    out["limit"] = [d.memory_limit for d in device_lib.list_local_devices()
                    if d.device_type == "GPU"][0]
    what = sys.argv[1]
    if what == "oom":
        try:
            with tf.device("/GPU:0"):
                big = tf.zeros([int(sys.argv[2])], dtype=tf.uint8)
                big.numpy()[:1]
            out["oom"] = None
        except tf.errors.ResourceExhaustedError as e:
            out["oom"] = "ResourceExhaustedError"
        except Exception as e:
            out["oom"] = "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:200])
        with tf.device("/GPU:0"):
            x = tf.ones([256, 256])
            out["after"] = float(tf.reduce_sum(tf.matmul(x, x)).numpy()) is not None
    elif what == "fit":
        import numpy as np
        model = tf.keras.Sequential([tf.keras.Input(shape=(32,)),
                                     tf.keras.layers.Dense(64, activation="relu"),
                                     tf.keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
        x = np.random.rand(512, 32).astype("float32")
        y = np.random.rand(512, 1).astype("float32")
        h = model.fit(x, y, epochs=2, batch_size=64, verbose=0)
        out["epochs"] = len(h.history["loss"])
print("@@TF " + json.dumps(out), flush=True)
'''


def tf_env(preload):
    env = c.container_env("tf", c.new_ledger_dir("tf"), preload=preload,
                          ALIYUN_COM_GPU_MEM_CONTAINER=QUOTA_GIB if preload else None,
                          ALIYUN_COM_GPU_MEM_DEV=c.probe().get("mem_dev", 15) if preload else None)
    # The wheels' library path misses cuSOLVER's directory: without it
    # TensorFlow finds no GPU ("Cannot dlopen some GPU libraries").
    py = c.setting("TF_PYTHON")
    site = os.path.join(os.path.dirname(os.path.dirname(py)), "lib")
    extra = []
    for root, dirs, _files in os.walk(site):
        if root.endswith(os.path.join("nvidia", "cusolver")) and "lib" in dirs:
            extra.append(os.path.join(root, "lib"))
        if root.count(os.sep) - site.count(os.sep) > 4:
            dirs[:] = []
    env["LD_LIBRARY_PATH"] = ":".join(extra + [env.get("LD_LIBRARY_PATH", "")])
    # XLA's command buffers build CUDA graphs with node kinds the simulated
    # driver may lack; on a GPU they stay on.
    if c.SIM:
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_gpu_enable_command_buffer=").strip()
    return env


def run_tf(args, preload, timeout=240):
    rc, out, err = c.run_cmd([c.setting("TF_PYTHON"), "-c", PROGRAM] + args, tf_env(preload), timeout)
    c.say("  --- tensorflow %s (%s), rc=%s\n%s%s" % (" ".join(args), "preload" if preload else "bare",
                                                    rc, out[-3000:], err[-3000:]))
    for line in out.splitlines():
        if line.startswith("@@TF "):
            return json.loads(line[5:])
    raise c.WorkerError("tensorflow %s: no result (rc=%s): %s" % (args, rc, err.strip()[-300:]))


def main():
    py = c.setting("TF_PYTHON")
    n = ["7a TensorFlow sees the GPU", "7b TensorFlow device fits the quota",
         "7c TensorFlow over quota -> ResourceExhaustedError", "7d TensorFlow Keras fit"]
    if not py:
        c.result(n[0], "--tensorflow", "not requested", None)
        return
    try:
        bare = run_tf(["info"], preload=False)
    except c.WorkerError as e:
        c.result(n[0], "usable without cgpu", "not usable: %s" % str(e)[:150], None)
        return
    if not bare.get("gpus"):
        c.result(n[0], "usable without cgpu", "no GPU without cgpu either (TF %s)" % bare["version"], None)
        return
    p = c.probe()
    q = p["cuda_total"] * QUOTA_GIB // p["mem_dev"]  # floor(physical × 6 / DEV)
    with c.section(*n):
        r = run_tf(["oom", str(q + c.GiB)], preload=True)
        c.result(n[0], "1 GPU (TF %s)" % r["version"], "%d GPU" % r["gpus"], r["gpus"] == 1)
        lim = r.get("limit", 0)
        c.result(n[1], "<= quota %d B, > quota - 1.5 GiB (bare: %d B)" % (q, bare.get("limit", 0)),
                 "%d B (%.0f MB)" % (lim, lim / 1e6), q - 1.5 * c.GiB < lim <= q)
        c.result(n[2], "ResourceExhaustedError at quota + 1 GiB; computes after",
                 "%s; after: %s" % (r.get("oom") or "allocated!", "ok" if r.get("after") else "FAILED"),
                 r.get("oom") == "ResourceExhaustedError" and bool(r.get("after")))
        f = run_tf(["fit"], preload=True)
        c.result(n[3], "2 epochs", "%s epochs" % f.get("epochs"), f.get("epochs") == 2)


if __name__ == "__main__":
    c.main_wrapper(main)
