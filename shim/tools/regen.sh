#!/usr/bin/env bash
# Regenerates shim/src/cuda/procaddr_table.rs from the real headers and the
# symbols the built library exports by hand. Run from the repo root after
# adding API functions: shim/tools/regen.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
VENV=$(scripts/test-deps.sh)
INC=$(ls -d "$VENV"/lib/python3*/site-packages/nvidia/cuda_runtime/include):$(ls -d "$VENV"/cuda13/nvidia/cu13/include)
OUT=shim/src/cuda/procaddr_table.rs
# Build once with no stubs so that only hand-written functions are listed.
cp "$OUT" "$OUT.bak"
printf '%s\n' '// bootstrap' 'use super::procaddr::proc_table;' '#[allow(unused_imports)]' 'use super::*;' 'proc_table! { cuInit: 2000 => cuInit; }' 'pub const STUBS: &[&str] = &[];' 'pub const EXTRA: &[(&str, u32)] = &[];' > "$OUT"
if ! cargo build -q -p cgpu-sim --lib; then mv "$OUT.bak" "$OUT"; exit 1; fi
nm -D --defined-only target/debug/libcgpu_sim.so | awk '$2=="T"{print $3}' | grep '^cu' > target/sim-exports.txt
python3 shim/tools/gen_procaddr.py "$INC" target/sim-exports.txt > "$OUT.new"
mv "$OUT.new" "$OUT"; rm -f "$OUT.bak"
rustfmt --edition 2021 "$OUT"
cargo build -q -p cgpu-sim
echo "regenerated $OUT ($(grep -c ' => ' "$OUT") APIs)"
