#!/usr/bin/env bash
# Builds the deployable files into dist/:
#   dist/libcgpu.so            the interposer (LD_PRELOAD), stripped
#   dist/cgpu-smi, dist/cgpuctl the operator tools (the exporter is `cgpuctl exporter`), stripped
#   dist/debug/*.debug         their debug info, linked back with .gnu_debuglink
# libcgpu.so is loaded into the jobs' own images, so it is linked against
# glibc 2.17 (CentOS 7, UBI 8, Ubuntu 18.04 and newer load it): a cross-linker
# with a glibc version target, zig through cargo-zigbuild, both installed from
# PyPI at pinned versions into target/dist-tools/venv (nothing system-wide).
# The tools run on the node or in the tools image and are linked against this
# machine's C library (zig's linker cannot hide the interposer's `dlsym` that
# they carry; the system linker's --exclude-libs does).
#
# Usage: scripts/build-dist.sh          build dist/
#        scripts/build-dist.sh --test   build, then check dist/ (glibc floor,
#                                       size) and run the interposer tests with
#                                       dist/libcgpu.so preloaded
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

TEST=0
case "${1:-}" in
  "") ;;
  --test) TEST=1 ;;
  -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  *) echo "build-dist: unknown option '$1' (try --help)" >&2; exit 2 ;;
esac

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
# Two builds, so that the tools' dependencies never turn on features in the
# library's (cargo unifies features within one invocation).
echo "build-dist: cargo zigbuild --release --target $TRIPLE.$GLIBC -p cgpu --lib" >&2
cargo zigbuild --release --target "$TRIPLE.$GLIBC" -p cgpu --lib
echo "build-dist: cargo build --release -p cgpu-tools --bins" >&2
cargo build --release -p cgpu-tools --bins

rm -rf dist
mkdir -p dist/debug
for f in libcgpu.so cgpu-smi cgpuctl; do
  if [ "$f" = libcgpu.so ]; then OUT=target/$TRIPLE/release; else OUT=target/release; fi
  objcopy --only-keep-debug "$OUT/$f" "dist/debug/$f.debug"
  if [ "$f" = libcgpu.so ]; then
    objcopy --strip-unneeded "$OUT/$f" "dist/$f"
  else
    objcopy --strip-all "$OUT/$f" "dist/$f"
  fi
  objcopy --add-gnu-debuglink="dist/debug/$f.debug" "dist/$f"
done
chmod 0644 dist/debug/*.debug
size=$(stat -c %s dist/libcgpu.so)
echo "build-dist: dist/libcgpu.so $((size / 1024)) KiB, needs glibc $(
  readelf -V --wide dist/libcgpu.so | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)" >&2
echo "build-dist: built in $(( $(date +%s) - start )) s" >&2
ls -l dist dist/debug

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
