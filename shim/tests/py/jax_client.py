"""JAX on the simulated driver: prints one JSON line with the platform JAX
chose, the device's kind and XLA's memory limit, then (on a GPU) what an
allocation larger than the device and a small one after it gave."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np

out = {
    "devnode": any(os.path.exists(d) for d in ("/dev/nvidia0", "/dev/nvidiactl", "/dev/dxg")),
    "platform": jax.devices()[0].platform,
}
if out["platform"] == "gpu":
    d = jax.devices()[0]
    out["kind"] = d.device_kind
    out["bytes_limit"] = d.memory_stats()["bytes_limit"]
    # Copies in and out (kernels compute nothing on the sim).
    x = jax.device_put(np.arange(1024, dtype=np.int32), d).block_until_ready()
    out["roundtrip"] = int(np.asarray(x)[1023])
    try:
        jnp.ones((out["bytes_limit"] + (1 << 30),), dtype=jnp.uint8).block_until_ready()
        out["big"] = "allocated"
    except Exception as e:  # XLA's own error type
        out["big"] = str(e).splitlines()[0][:200]
    y = jnp.ones((1 << 20,), dtype=jnp.uint8).block_until_ready()
    out["after"] = int(y.nbytes)
print(json.dumps(out))
