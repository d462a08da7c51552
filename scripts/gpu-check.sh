#!/usr/bin/env bash
# gpu-check.sh — prove cgpu on a real NVIDIA GPU, with unchanged frameworks.
#
# Runs on a machine with an NVIDIA GPU, its driver, CUDA and PyTorch installed,
# and no network. Checks, with libcgpu.so in LD_PRELOAD:
#   1  mem_get_info / cuDeviceTotalMem / nvidia-smi show the container's quota
#      (with and without ALIYUN_COM_GPU_MEM_DEV); CGPU_DISABLE=true the physical
#      total; a quota list (3,4,5,6) over every GPU (--sim: four A10s)
#   2  allocating past the quota raises the framework's OOM (default allocator
#      and expandable segments / cuMemCreate); freed memory is usable again;
#      cuBLAS workspaces are charged, one that does not fit is an OOM; what
#      the driver holds for a process vs what it is charged
#   3  processes of one container share one quota; containers have their own
#   4  weights 1:2 under policy 2 give a 1:2 ratio of device time (NVML per
#      process; --sim: the sim's counters); under policy 1 an idle container
#      costs a busy one nothing
#   5  overhead of the library on a training-like loop
#   6  CuPy, JAX (and cuda-bindings) where installed
#   7  TensorFlow (--tensorflow): devices, memory info, over-quota error, Keras fit
#   8  (--sim) no function the simulated driver only stubs was relied on
#   9  (PyTorch) expandable segments, CUDA IPC between processes, torch.profiler
# Without PyTorch the same checks run on the driver API through cuda-bindings,
# and without nvidia-smi NVML is read through nvidia-ml-py; so `--sim` runs the
# whole script on the simulated driver (target/*/libcgpu_sim.so), as CI does.
# `--sim --framework torch --tensorflow` runs it with the real frameworks on
# the simulated driver (pinned, from scripts/frameworks.sh): ~8 minutes more.
#
# Writes a full log (--log FILE, default gpu-check-<date>.log), prints a table
# (check, expected, measured, PASS/FAIL/SKIP) at the end, exits 1 when a check
# failed, 2 when it could not start. Finishes in under 9 minutes (--quick: ~2).
set -uo pipefail

usage() {
  cat <<'EOF'
usage: scripts/gpu-check.sh [options]
  --lib PATH        libcgpu.so (default: $CGPU_LIB, target/release/libcgpu.so,
                    else built with `cargo build --release --offline`)
  --cgpuctl PATH    cgpuctl (default: $CGPU_CTL, next to libcgpu.so, $PATH)
  --python PATH     Python with torch (or cuda-bindings) (default: $CGPU_CHECK_PYTHON, python3;
                    with --sim: target/test-deps/venv/bin/python, installed by
                    scripts/test-deps.sh when missing)
  --backend NAME    auto (default: torch, else cuda-bindings), torch or cuda
  --framework torch use the pinned PyTorch of scripts/frameworks.sh (installed
                    into a cached virtualenv on first use) as --python, backend torch
  --tensorflow      also check TensorFlow (check 7), from scripts/frameworks.sh
                    tensorflow (pinned, cached virtualenv; --tf-python PATH instead)
  --gpu N           GPU index to use (default 0)
  --only LIST       run only these checks, e.g. 1,2,3
  --quick           shorter measuring windows
  --sim             run on the simulated driver (libcgpu_sim.so: --sim-lib PATH,
                    $CGPU_SIM_LIB, next to libcgpu.so, target/{release,debug})
  --log FILE        full log (default gpu-check-<date>.log in the current directory)
  --results FILE    also write the table as TSV (check, expected, measured, status)
  --markdown FILE   also write the table as Markdown, with GPU, driver and date (for a report)
  --keep            keep the temporary directory (ledgers, per-check output)
EOF
}

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HERE="$ROOT/scripts/gpu_check"
STAMP="$(date -u +%Y%m%d-%H%M%S)"
LIB="${CGPU_LIB:-}"
CTL="${CGPU_CTL:-}"
PY="${CGPU_CHECK_PYTHON:-}"
BACKEND=auto
GPU_INDEX=0
ONLY=""
QUICK=0
SIM=0
SIM_LIB="${CGPU_SIM_LIB:-}"
FRAMEWORK=""
TF=0
TF_PY="${CGPU_CHECK_TF_PYTHON:-}"
LOG=""
RESULTS=""
MARKDOWN=""
KEEP=0

while [ $# -gt 0 ]; do
  case "$1" in
    --lib) LIB="$2"; shift 2 ;;
    --cgpuctl) CTL="$2"; shift 2 ;;
    --python) PY="$2"; shift 2 ;;
    --backend) BACKEND="$2"; shift 2 ;;
    --framework) FRAMEWORK="$2"; shift 2 ;;
    --tensorflow) TF=1; shift ;;
    --tf-python) TF=1; TF_PY="$2"; shift 2 ;;
    --gpu) GPU_INDEX="$2"; shift 2 ;;
    --only) ONLY="$2"; shift 2 ;;
    --quick) QUICK=1; shift ;;
    --sim) SIM=1; shift ;;
    --sim-lib) SIM_LIB="$2"; shift 2 ;;
    --log) LOG="$2"; shift 2 ;;
    --results) RESULTS="$2"; shift 2 ;;
    --markdown) MARKDOWN="$2"; shift 2 ;;
    --keep) KEEP=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "gpu-check: unknown argument: $1" >&2; usage >&2; exit 2 ;;
  esac
done

LOG="${LOG:-gpu-check-$STAMP.log}"
: >"$LOG" || { echo "gpu-check: cannot write log $LOG" >&2; exit 2; }
LOG="$(cd "$(dirname "$LOG")" && pwd)/$(basename "$LOG")"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/gpu-check.XXXXXX")"
ALL="$WORK/results.tsv"
: >"$ALL"
T0=$(date +%s)

cleanup() {
  if [ "$KEEP" = 1 ]; then echo "(kept $WORK)" >>"$LOG"; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'echo "gpu-check: interrupted" | tee -a "$LOG" >&2; exit 130' INT TERM

log() { printf '%s\n' "$*" >>"$LOG"; }
say() { printf '%s\n' "$*" | tee -a "$LOG"; }
fail_setup() {
  say "gpu-check: $*"
  printf '0 setup\t%s\t%s\tFAIL\n' "ready to run" "$*" >>"$ALL"
  print_table
  exit 2
}

print_table() {
  local w1=5 w2=8 w3=8
  while IFS=$'\t' read -r a b c d; do
    [ ${#a} -gt $w1 ] && w1=${#a}; [ ${#b} -gt $w2 ] && w2=${#b}; [ ${#c} -gt $w3 ] && w3=${#c}
  done <"$ALL"
  [ $w1 -gt 60 ] && w1=60; [ $w2 -gt 60 ] && w2=60; [ $w3 -gt 70 ] && w3=70
  {
    echo
    printf '%-*s | %-*s | %-*s | %s\n' $w1 check $w2 expected $w3 measured result
    printf '%s\n' "$(printf '%*s' $((w1 + w2 + w3 + 16)) '' | tr ' ' -)"
    while IFS=$'\t' read -r a b c d; do
      printf '%-*s | %-*s | %-*s | %s\n' $w1 "$a" $w2 "$b" $w3 "$c" "$d"
    done <"$ALL"
    echo
    echo "PASS $(grep -c $'\tPASS$' "$ALL")  FAIL $(grep -c $'\tFAIL$' "$ALL")  SKIP $(grep -c $'\tSKIP$' "$ALL")  ($(( $(date +%s) - T0 )) s; log: $LOG)"
  } | tee -a "$LOG"
  if [ -n "$RESULTS" ]; then cp "$ALL" "$RESULTS"; fi
  if [ -n "$MARKDOWN" ]; then
    {
      echo "$(date -u '+%Y-%m-%d'), $(sed -n 's/^GPU: *//p' "$WORK/probe.out" 2>/dev/null | head -1),"\
        "driver $(sed -n 's/^driver: *//p' "$WORK/probe.out" 2>/dev/null | head -1),"\
        "$(sed -n 's/^framework: *//p' "$WORK/probe.out" 2>/dev/null | head -1),"\
        "$([ "$SIM" = 1 ] && echo "simulated driver, ")$([ "$QUICK" = 1 ] && echo "--quick, ")commit $(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo unknown):"
      echo
      echo "| check | expected | measured | result |"
      echo "|---|---|---|---|"
      sed 's/|/\\|/g; s/\t/ | /g; s/^/| /; s/$/ |/' "$ALL"
    } >"$MARKDOWN"
  fi
}

# ------------------------------------------------------------------ libraries
if [ -z "$LIB" ]; then
  if [ -f "$ROOT/target/release/libcgpu.so" ]; then
    LIB="$ROOT/target/release/libcgpu.so"
  elif [ "$SIM" = 1 ] && [ -f "$ROOT/target/debug/libcgpu.so" ]; then
    LIB="$ROOT/target/debug/libcgpu.so"
  elif command -v cargo >/dev/null 2>&1; then
    say "building libcgpu.so: cargo build --release --offline (output in the log)"
    (cd "$ROOT" && timeout 900 cargo build --release --offline) >>"$LOG" 2>&1 \
      || fail_setup "cargo build --release --offline failed (see $LOG)"
    LIB="$ROOT/target/release/libcgpu.so"
  fi
fi
[ -n "$LIB" ] && [ -f "$LIB" ] || fail_setup "libcgpu.so not found: pass --lib PATH or set CGPU_LIB (or build with cargo build --release)"
LIB="$(cd "$(dirname "$LIB")" && pwd)/$(basename "$LIB")"
LIBDIR="$(dirname "$LIB")"
if [ -z "$CTL" ]; then
  if [ -x "$LIBDIR/cgpuctl" ]; then CTL="$LIBDIR/cgpuctl"
  elif command -v cgpuctl >/dev/null 2>&1; then CTL="$(command -v cgpuctl)"; fi
fi

SMI=""
for c in "$(dirname "${CTL:-/nonexistent/x}")/cgpu-smi" "$LIBDIR/cgpu-smi"; do
  if [ -x "$c" ]; then SMI="$c"; break; fi
done

if [ "$SIM" = 1 ]; then
  if [ -z "$SIM_LIB" ]; then
    for c in "$LIBDIR/libcgpu_sim.so" "$ROOT/target/release/libcgpu_sim.so" "$ROOT/target/debug/libcgpu_sim.so"; do
      if [ -f "$c" ]; then SIM_LIB="$c"; break; fi
    done
  fi
  [ -n "$SIM_LIB" ] && [ -f "$SIM_LIB" ] || fail_setup "--sim: libcgpu_sim.so not found (cargo build -p cgpu-sim, or --sim-lib PATH)"
  SIM_LIB="$(cd "$(dirname "$SIM_LIB")" && pwd)/$(basename "$SIM_LIB")"
  mkdir -p "$WORK/simlib" "$WORK/simstate"
  for n in libcuda.so.1 libcuda.so libnvidia-ml.so.1 libnvidia-ml.so; do ln -sf "$SIM_LIB" "$WORK/simlib/$n"; done
  export LD_LIBRARY_PATH="$WORK/simlib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export CGPU_SIM_STATE="$WORK/simstate"
  export CGPU_SIM_GPUS="${CGPU_SIM_GPUS:-15109:Tesla T4}"
  NVSMI=""
  if [ -z "$PY" ] && [ -z "$FRAMEWORK" ]; then
    # The driver-API backend needs NVIDIA's cuda-bindings and nvidia-ml-py,
    # pinned by scripts/test-deps.sh (which the tests run too); a fresh
    # checkout has none yet: install them now rather than fail the probe.
    if [ ! -x "$ROOT/target/test-deps/venv/bin/python" ]; then
      say "gpu-check: installing cuda-bindings and nvidia-ml-py (pinned) with scripts/test-deps.sh, once (output in the log)"
      "$ROOT/scripts/test-deps.sh" >>"$LOG" 2>&1 \
        || fail_setup "scripts/test-deps.sh failed (PyPI unreachable? see $LOG); or give a Python with cuda-bindings: --python PATH"
    fi
    PY="$ROOT/target/test-deps/venv/bin/python"
  fi
else
  NVSMI="$(command -v nvidia-smi || true)"
fi
case "$FRAMEWORK" in
  "") ;;
  torch)
    if [ -z "$PY" ]; then
      say "framework: PyTorch from scripts/frameworks.sh torch (installs on first use; output in the log)"
      PY="$("$ROOT/scripts/frameworks.sh" torch 2>>"$LOG")" || fail_setup "scripts/frameworks.sh torch failed (see $LOG)"
    fi
    BACKEND=torch ;;
  *) fail_setup "--framework: only torch is supported (TensorFlow: --tensorflow)" ;;
esac
if [ "$TF" = 1 ] && [ -z "$TF_PY" ]; then
  say "framework: TensorFlow from scripts/frameworks.sh tensorflow (installs on first use; output in the log)"
  TF_PY="$("$ROOT/scripts/frameworks.sh" tensorflow 2>>"$LOG")" || fail_setup "scripts/frameworks.sh tensorflow failed (see $LOG)"
fi
PY="${PY:-$(command -v python3 || command -v python || true)}"
[ -n "$PY" ] || fail_setup "no python3 found (--python PATH)"
# the checks run from scripts/gpu_check: make the paths given absolute
abspath() { case "$1" in */*) echo "$(cd "$(dirname "$1")" && pwd)/$(basename "$1")" ;; *) echo "$1" ;; esac; }
PY="$(abspath "$PY")"
[ -n "$CTL" ] && CTL="$(abspath "$CTL")"
[ -n "$SMI" ] && SMI="$(abspath "$SMI")"
[ -n "$TF_PY" ] && TF_PY="$(abspath "$TF_PY")"
SIM_STAT=""
[ "$SIM" = 1 ] && [ -x "$(dirname "$SIM_LIB")/cgpu-sim-stat" ] && SIM_STAT="$(dirname "$SIM_LIB")/cgpu-sim-stat"

export CGPU_CHECK_LIB="$LIB" CGPU_CHECK_CGPUCTL="$CTL" CGPU_CHECK_PYTHON="$PY" \
  CGPU_CHECK_CGPUSMI="$SMI" CGPU_CHECK_WORKDIR="$WORK" CGPU_CHECK_QUICK="$QUICK" CGPU_CHECK_SIM="$SIM" \
  CGPU_CHECK_BACKEND="$BACKEND" CGPU_CHECK_NVIDIA_SMI="$NVSMI" CGPU_CHECK_GPU="$GPU_INDEX" \
  CGPU_CHECK_TF_PYTHON="$TF_PY" CGPU_CHECK_SIM_STAT="$SIM_STAT" \
  PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1

# ------------------------------------------------------------------ budget
# Whole run under 9 minutes: each check gets its own limit, cut to what is
# left of the budget.
if [ "$SIM" = 1 ]; then
  BUDGET=$([ "$QUICK" = 1 ] && echo 170 || echo 400)
  declare -A LIMIT=([probe]=60 [1]=60 [2]=60 [3]=60 [4]=90 [5]=60 [6]=60 [7]=240 [8]=30 [9]=300)
else
  BUDGET=520
  declare -A LIMIT=([probe]=150 [1]=150 [2]=150 [3]=90 [4]=150 [5]=150 [6]=150 [7]=300 [8]=30 [9]=240)
fi
# A framework's import and first CUDA call take seconds on the simulated
# driver (~4 s and ~3 s for PyTorch): more time for the framework runs.
# Each check starts several framework processes: a limit of its own too.
if [ "$SIM" = 1 ] && { [ "$BACKEND" = torch ] || [ "$TF" = 1 ]; }; then
  BUDGET=$((BUDGET + 900))
  for k in probe 1 2 3 6; do LIMIT[$k]=$((LIMIT[$k] + 120)); done
  LIMIT[4]=$((LIMIT[4] + 180)); LIMIT[5]=$((LIMIT[5] + 180)); LIMIT[7]=$((LIMIT[7] + 240))
fi
[ "$TF" = 1 ] && BUDGET=$((BUDGET + ${LIMIT[7]}))
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }

# run_check ID NAME SCRIPT: runs one check program with a timeout, appends its
# result rows; a crash or timeout is a FAIL row with the output in the log.
run_check() {
  local id="$1" name="$2" script="$3" out="$WORK/check-$1.out" lim rc n
  lim=${LIMIT[$id]}
  if [ "$(left)" -lt $((lim < 20 ? lim : 20)) ]; then
    printf '%s %s\t%s\t%s\tFAIL\n' "$id" "$name" "runs" "not run: the run's time budget is spent" >>"$ALL"
    say "[$id] $name: not run (budget spent)"
    return
  fi
  [ "$(left)" -lt "$lim" ] && lim=$(left)
  printf '[%s] %s ... ' "$id" "$name"
  log ""; log "=============== [$id] $name ($script, limit ${lim}s) $(date -u +%T)"
  (cd "$HERE" && timeout -k 10 "$lim" "$PY" "$HERE/$script") >"$out" 2>&1
  rc=$?
  cat "$out" >>"$LOG"
  grep '^@@RESULT' "$out" | cut -f2- >>"$ALL"
  n=$(grep -c '^@@RESULT' "$out")
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    printf '%s %s\t%s\t%s\tFAIL\n' "$id" "$name" "done in ${lim}s" "timed out (killed), see log" >>"$ALL"
  elif [ $rc -ne 0 ] || [ "$n" -eq 0 ]; then
    printf '%s %s\t%s\t%s\tFAIL\n' "$id" "$name" "runs to the end" "exit status $rc, $n results (output in log)" >>"$ALL"
  fi
  log "--------------- [$id] exit status $rc, $(( $(date +%s) - T0 )) s so far"
  echo "$(grep '^@@RESULT' "$out" | cut -f5 | sort | uniq -c | tr -s ' \n' ' ')(rc=$rc)"
}

want() { [ -z "$ONLY" ] || [[ ",$ONLY," == *",$1,"* ]]; }

# ------------------------------------------------------------------ header
{
  echo "cgpu gpu-check  $(date -u '+%Y-%m-%d %H:%M:%S UTC')  host $(hostname)"
  echo "mode:           $([ "$SIM" = 1 ] && echo "simulated driver ($SIM_LIB, CGPU_SIM_GPUS=$CGPU_SIM_GPUS)" || echo "real driver")$([ "$QUICK" = 1 ] && echo ", quick")"
  echo "libcgpu.so:     $LIB ($(stat -c '%s bytes, %y' "$LIB" 2>/dev/null))"
  echo "cgpuctl:        ${CTL:-not found (policies set through ALIYUN_COM_GPU_SCHD_WEIGHT and defaults)}"
  echo "commit:         $(git -C "$ROOT" describe --always --dirty 2>/dev/null || echo unknown)"
  echo "python:         $PY ($("$PY" -c 'import sys; print(sys.version.split()[0])' 2>&1))"
  echo "nvidia-smi:     ${NVSMI:-not used}"
} | tee -a "$LOG"

if [ -n "$NVSMI" ]; then
  log ""; log "=============== nvidia-smi (no LD_PRELOAD)"
  timeout 30 "$NVSMI" >>"$LOG" 2>&1
fi
log ""; log "=============== probe (no LD_PRELOAD)"
(cd "$HERE" && timeout -k 10 "${LIMIT[probe]}" "$PY" "$HERE/probe.py") >"$WORK/probe.out" 2>&1
rc=$?
cat "$WORK/probe.out" >>"$LOG"
grep -v '^  \[' "$WORK/probe.out" | grep -E '^(GPU|driver|framework|physical|operator|other|backends)' || true
if [ $rc -ne 0 ] || [ ! -f "$WORK/probe.json" ]; then
  if [ "$SIM" = 1 ]; then
    hint="with --sim, a Python with NVIDIA's cuda-bindings (scripts/test-deps.sh installs it into target/test-deps/venv) or PyTorch (--framework torch)"
  else
    hint="a Python with PyTorch built for CUDA, or NVIDIA's cuda-bindings (pip install cuda-bindings nvidia-ml-py), chosen with --python PATH"
  fi
  fail_setup "probe failed (exit $rc): no framework reached the GPU without cgpu. It needs $hint. Details: $LOG"
fi
echo

want 1 && run_check 1 "memory view (mem_get_info, nvidia-smi)" check_meminfo.py
want 2 && run_check 2 "over-quota allocation, reuse" check_oom.py
want 3 && run_check 3 "one quota per container" check_share.py
want 4 && run_check 4 "compute shares (weights, idle)" check_sched.py
want 5 && run_check 5 "overhead" check_overhead.py
want 6 && run_check 6 "other frameworks" check_frameworks.py
# PyTorch's own driver paths, when PyTorch is the backend.
if "$PY" -c 'import json, sys; sys.exit(json.load(open(sys.argv[1]))["backend"] != "torch")' \
    "$WORK/probe.json" 2>/dev/null; then
  BUDGET=$((BUDGET + ${LIMIT[9]}))
  want 9 && run_check 9 "PyTorch paths (expandable segments, IPC, profiler)" check_torch_paths.py
fi
[ "$TF" = 1 ] && want 7 && run_check 7 "TensorFlow" check_tensorflow.py
[ "$SIM" = 1 ] && want 8 && run_check 8 "simulated driver: no stub relied on" check_stubs.py

print_table
if grep -q $'\tFAIL$' "$ALL"; then exit 1; fi
exit 0
