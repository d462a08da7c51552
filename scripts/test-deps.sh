#!/usr/bin/env bash
# Fetches what the tests need from PyPI into a venv under target/ (never committed):
#   - cuda-bindings     NVIDIA's Python driver bindings (run unmodified on the sim)
#   - nvidia-ml-py      pynvml (run unmodified on the sim)
#   - nvidia-cuda-runtime-cu12, nvidia-nvml-dev: the real cuda.h / nvml.h headers
# Usage: scripts/test-deps.sh [VENV_DIR]   (default: target/test-deps/venv)
# Idempotent: does nothing when the venv is complete. Prints the venv path.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-target/test-deps/venv}"
STAMP="$VENV/.cgpu-test-deps-v1"
PKGS=(cuda-bindings nvidia-ml-py nvidia-cuda-runtime-cu12 nvidia-nvml-dev)
if [ -f "$STAMP" ]; then echo "$VENV"; exit 0; fi
if ! python3 -c 'import venv, ensurepip' 2>/dev/null; then
  echo "test-deps: python3-venv missing; installing it with apt-get" >&2
  (apt-get update && apt-get install -y python3-venv) >&2
fi
rm -rf "$VENV"
mkdir -p "$(dirname "$VENV")"
python3 -m venv "$VENV" >&2
"$VENV/bin/pip" install --disable-pip-version-check -q "${PKGS[@]}" >&2
# sanity: the headers are where the tests look for them
"$VENV/bin/python" - <<'PY' >&2
import glob, sys, sysconfig
site = sysconfig.get_paths(vars={"base": sys.argv[0] and sys.prefix})["purelib"]
for h in ("cuda.h", "nvml.h"):
    if not glob.glob(f"{site}/nvidia/**/include/{h}", recursive=True):
        sys.exit(f"test-deps: {h} not found under {site}/nvidia")
PY
touch "$STAMP"
echo "$VENV"
