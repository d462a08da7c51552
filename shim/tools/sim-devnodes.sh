#!/usr/bin/env bash
# sim-devnodes.sh — runs a command on a machine without an NVIDIA GPU as if
# the GPU's device nodes were there: inside a private mount namespace,
# /dev/nvidiactl and /dev/nvidia<i> (one per simulated GPU: CGPU_SIM_GPUS,
# default one) exist as empty files. Nothing outside the namespace changes.
#
# Usage: shim/tools/sim-devnodes.sh COMMAND [ARGS...]
#
# Why: some frameworks look for the device nodes before they try CUDA at all.
# JAX (jax/_src/hardware_utils.py, has_visible_nvidia_gpu) skips its CUDA
# backend unless /dev/nvidia0, /dev/nvidiactl or /dev/dxg exists, even with
# JAX_PLATFORMS=cuda. Nothing opens the nodes: the simulated driver replaces
# the library that would. In a container whose /dev is its own (as root),
# `touch /dev/nvidiactl` does the same.
#
# How: /dev becomes an overlay of itself (the real nodes stay usable), with
# its mounts (/dev/shm, /dev/pts, /dev/mqueue, /dev/hugepages) bound back, so
# processes inside and outside still share /dev/shm (the simulated driver's
# state, the cgpu ledgers). Needs root, or unprivileged user namespaces with
# overlayfs in them (Linux 5.11 or later); the command then runs as root of a
# user namespace.
set -euo pipefail
if [ $# -eq 0 ]; then
  echo "usage: shim/tools/sim-devnodes.sh COMMAND [ARGS...]" >&2
  exit 2
fi
if [ "$(id -u)" = 0 ]; then
  NS=(unshare --mount --propagation private)
else
  NS=(unshare --user --map-root-user --mount --propagation private)
fi
gpus="${CGPU_SIM_GPUS:-x}"
n=$(($(tr -cd ',' <<<"$gpus" | wc -c) + 1))
# The overlay's own directories live on a tmpfs of the namespace, mounted on
# an empty directory removed once the command is done.
t=$(mktemp -d)
trap 'rmdir "$t" 2>/dev/null || true' EXIT
rc=0
"${NS[@]}" bash -c '
  set -euo pipefail
  t=$1 n=$2; shift 2
  mount -t tmpfs tmpfs "$t"
  mkdir "$t/orig" "$t/up" "$t/work"
  mount --rbind /dev "$t/orig"
  mount -t overlay overlay -o "lowerdir=/dev,upperdir=$t/up,workdir=$t/work" /dev
  for m in shm pts mqueue hugepages; do
    if [ -d "$t/orig/$m" ] && mountpoint -q "$t/orig/$m"; then
      mount --rbind "$t/orig/$m" "/dev/$m"
    fi
  done
  : >/dev/nvidiactl
  for ((i = 0; i < n; i++)); do [ -e "/dev/nvidia$i" ] || : >"/dev/nvidia$i"; done
  exec "$@"' sim-devnodes "$t" "$n" "$@" || rc=$?
exit "$rc"
