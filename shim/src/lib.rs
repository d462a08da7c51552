//! cgpu-sim: a simulated NVIDIA driver. See `shim/README.md`.
