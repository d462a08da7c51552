#!/usr/bin/env bash
# Builds every deployable file into dist/, all linked against glibc 2.17 (CentOS 7,
# UBI 8, Ubuntu 18.04 and newer run them) and needing nothing but the C library:
#   dist/libcgpu.so              the interposer (LD_PRELOAD), stripped
#   dist/cgpu-smi, dist/cgpuctl  the operator tools (the exporter is `cgpuctl exporter`)
#   dist/cgpu-agent              the node agent (docs/agent.md)
#   dist/cgpu.tmpfiles.conf      creates /run/cgpu at every boot (systemd-tmpfiles)
#   with --cluster, also the Kubernetes components:
#   dist/cgpu-scheduler-extender, dist/cgpu-device-plugin, dist/kubectl-inspect-cgpu
#   dist/debug/*.debug           the debug info of each, linked back with .gnu_debuglink
# The linker is zig through cargo-zigbuild (a glibc version target), both
# installed from PyPI at pinned versions into target/dist-tools/venv (nothing
# system-wide). The tools and the agent share the ledger's crate with the
# library (`cgpu-ledger`), never the interposer itself: they export no hook.
# deploy/docker/ has the Dockerfiles that package dist/ as the node and
# extender images.
#
# Usage: scripts/build-dist.sh [--cluster] [--test]
#   --cluster   also build the Kubernetes components (a long build: about
#               13 minutes from nothing on 2 cores, seconds when cached)
#   --test      then check dist/ (glibc floor, size, exports) and run the
#               interposer tests with dist/libcgpu.so preloaded
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

TEST=0
CLUSTER=0
for arg in "$@"; do
  case "$arg" in
    --test) TEST=1 ;;
    --cluster) CLUSTER=1 ;;
    -h|--help) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "build-dist: unknown option '$arg' (try --help)" >&2; exit 2 ;;
  esac
done

GLIBC=2.17
TRIPLE=x86_64-unknown-linux-gnu
ZIGLANG=0.17.0
ZIGBUILD=0.24.0
VENV=target/dist-tools/venv
STAMP="$VENV/.cgpu-dist-tools-$ZIGLANG-$ZIGBUILD"

if [ "$(uname -m)" != x86_64 ]; then
  echo "build-dist: only x86_64 hosts are supported (this is $(uname -m))" >&2
  exit 1
fi
for tool in python3 objcopy readelf; do
  command -v "$tool" >/dev/null || {
    echo "build-dist: '$tool' is missing (apt-get install python3-venv binutils)" >&2
    exit 1
  }
done

if [ ! -f "$STAMP" ]; then
  echo "build-dist: installing ziglang $ZIGLANG and cargo-zigbuild $ZIGBUILD from PyPI into $VENV" >&2
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  if ! "$VENV/bin/pip" install --disable-pip-version-check -q \
      "ziglang==$ZIGLANG" "cargo-zigbuild==$ZIGBUILD"; then
    echo "build-dist: could not install ziglang/cargo-zigbuild from PyPI." >&2
    echo "  Check the network or a PyPI mirror (PIP_INDEX_URL), then run $0 again." >&2
    exit 1
  fi
  touch "$STAMP"
fi
export PATH="$ROOT/$VENV/bin:$PATH"

start=$(date +%s)
step() { echo "build-dist: [$(( $(date +%s) - start )) s] $*" >&2; }
# Separate builds, so that the tools' and the cluster's dependencies never
# turn on features in the library's (cargo unifies features within one
# invocation).
step "cargo zigbuild --release --target $TRIPLE.$GLIBC -p cgpu --lib"
cargo zigbuild --release --target "$TRIPLE.$GLIBC" -p cgpu --lib
step "cargo zigbuild --release --target $TRIPLE.$GLIBC -p cgpu-tools -p cgpu-agent --bins"
cargo zigbuild --release --target "$TRIPLE.$GLIBC" -p cgpu-tools -p cgpu-agent --bins
FILES="libcgpu.so:target/$TRIPLE/release"
for b in cgpu-smi cgpuctl cgpu-agent; do
  FILES="$FILES $b:target/$TRIPLE/release"
done
if [ "$CLUSTER" = 1 ]; then
  step "cargo zigbuild --release --target $TRIPLE.$GLIBC -p cgpu-cluster --bins (long the first time)"
  cargo zigbuild --release --target "$TRIPLE.$GLIBC" -p cgpu-cluster --bins
  for b in cgpu-scheduler-extender cgpu-device-plugin kubectl-inspect-cgpu; do
    FILES="$FILES $b:target/$TRIPLE/release"
  done
fi

step "stripping into dist/"
rm -rf dist
mkdir -p dist/debug
for entry in $FILES; do
  f=${entry%%:*}
  dir=${entry#*:}
  objcopy --only-keep-debug "$dir/$f" "dist/debug/$f.debug"
  if [ "$f" = libcgpu.so ]; then
    objcopy --strip-unneeded "$dir/$f" "dist/$f"
  else
    objcopy --strip-all "$dir/$f" "dist/$f"
  fi
  objcopy --add-gnu-debuglink="dist/debug/$f.debug" "dist/$f"
done
chmod 0644 dist/debug/*.debug
install -m 0644 deploy/host/cgpu.tmpfiles.conf dist/cgpu.tmpfiles.conf
for entry in $FILES; do
  f=${entry%%:*}
  size=$(stat -c %s "dist/$f")
  glibc=$(readelf -V --wide "dist/$f" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)
  printf 'build-dist: dist/%-24s %6d KiB, needs %s\n' "$f" $((size / 1024)) "${glibc:-no glibc version}" >&2
done
step "built"
if [ "$CLUSTER" = 0 ]; then
  echo "build-dist: the Kubernetes components: scripts/build-dist.sh --cluster" >&2
else
  echo "build-dist: images: docker build -f deploy/docker/node.Dockerfile -t REGISTRY/cgpu-node:0.1.0 ." >&2
  echo "build-dist:         docker build -f deploy/docker/extender.Dockerfile -t REGISTRY/cgpu-extender:0.1.0 ." >&2
fi

if [ "$TEST" = 1 ]; then
  start=$(date +%s)
  echo "build-dist: checking dist/ (tests/dist.rs)" >&2
  cargo test -p cgpu --test dist -- --ignored
  echo "build-dist: interposer tests with LD_PRELOAD=dist/libcgpu.so" >&2
  export CGPU_TEST_LIBCGPU="$ROOT/dist/libcgpu.so"
  cargo test -p cgpu --test memory_isolation --test entry_paths --test sched
  cargo test -p cgpu-tools --test tools_sim
  echo "build-dist: dist/ checked in $(( $(date +%s) - start )) s" >&2
fi
