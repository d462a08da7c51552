#!/usr/bin/env bash
# Prints the numbers README.md and docs/ state as facts about this checkout,
# each read from where it is defined, so that they are never copied by hand:
#   scripts/readme-numbers.sh           print them, with their sources
#   scripts/readme-numbers.sh --check   also fail (exit 1) when README.md or
#                                       docs/ state another value (CI runs this)
# Sizes of the deployable files are printed when dist/ is built
# (scripts/build-dist.sh). Measured numbers (shares, benchmarks) are in
# docs/measurements.md, each with the command that printed it.
set -euo pipefail
cd "$(dirname "$0")/.."

field() { # field FILE KEY: the first `KEY = "VALUE"` in FILE
  sed -n "s/^$2 *= *\"\\([^\"]*\\)\".*/\\1/p" "$1" | head -1
}
RUST_LIB=$(field Cargo.toml rust-version)
RUST_ALL=$(for f in Cargo.toml cluster/*/Cargo.toml; do field "$f" rust-version; done | sort -V | tail -1)
VERSION=$(field Cargo.toml version)
GLIBC=$(sed -n 's/^GLIBC=//p' scripts/build-dist.sh)
FORMAT=$(sed -n 's/^pub const FORMAT_VERSION: u32 = \([0-9]*\);/\1/p' ledger/src/lib.rs)
K8S=$(sed -n 's/^VERSIONS="\(.*\)"/\1/p' scripts/check-deploy.sh)
K8S_MIN=$(echo "$K8S" | tr ' ' '\n' | sort -V | head -1 | sed 's/\.0$//')
# The worked memory examples: (physical MiB, DEV, CONTAINER, expected MiB).
T4=$(grep -o '(15109, "15", "6", [0-9]*)' tests/entry_paths.rs | grep -o '[0-9]*)$' | tr -d ')')
V100=$(grep -o '(16160, "15", "4", [0-9]*)' tests/entry_paths.rs | grep -o '[0-9]*)$' | tr -d ')')

printf '%-58s %s\n' \
  "Rust for the library, the tools, the simulated GPU: $RUST_LIB" "rust-version, Cargo.toml" \
  "Rust for the whole workspace (Kubernetes crates): $RUST_ALL" "rust-version, cluster/*/Cargo.toml" \
  "cgpu version: $VERSION" "Cargo.toml" \
  "glibc floor of every file in dist/: $GLIBC" "GLIBC=, scripts/build-dist.sh" \
  "ledger format: $FORMAT" "FORMAT_VERSION, ledger/src/lib.rs" \
  "Kubernetes schemas deploy/ is checked against: $K8S" "scripts/check-deploy.sh" \
  "T4 (15109 MiB), DEV 15, 6 GiB -> $T4 MiB" "tests/entry_paths.rs" \
  "V100 (16160 MiB), DEV 15, 4 GiB -> $V100 MiB" "tests/entry_paths.rs"
for f in libcgpu.so cgpu-smi cgpuctl cgpu-scheduler-extender cgpu-device-plugin kubectl-inspect-cgpu; do
  [ -f "dist/$f" ] && printf '%-58s %s\n' "dist/$f: $(( $(stat -c %s "dist/$f") / 1024 )) KiB" "scripts/build-dist.sh"
done
[ "${1:-}" = --check ] || exit 0

bad=0
need() { # need FILE TEXT: FILE must state TEXT
  grep -qF -- "$2" "$1" || { echo "readme-numbers: $1 does not say \"$2\"" >&2; bad=1; }
}
need README.md "Rust $RUST_ALL or newer"
need README.md "alone: $RUST_LIB"
need docs/install.md "Rust $RUST_ALL or newer"
need docs/install.md "alone build with $RUST_LIB"
need README.md "glibc $GLIBC or newer"
need docs/install.md "glibc $GLIBC or newer"
need README.md "Kubernetes $K8S_MIN or later"
need docs/kubernetes.md "Kubernetes $K8S_MIN or later"
need docs/install.md "| $K8S_MIN or later"
need README.md "a total of $T4 MiB"
need README.md "each .../ ${V100}MiB"
# Every sample of the tools' header shows this format.
for f in README.md docs/*.md; do
  if grep -n 'ledger format[: ]*[0-9]' "$f" | grep -v "ledger format[: ]*$FORMAT\\b" >/dev/null; then
    echo "readme-numbers: $f shows a ledger format other than $FORMAT:" >&2
    grep -n 'ledger format[: ]*[0-9]' "$f" | grep -v "ledger format[: ]*$FORMAT\\b" >&2
    bad=1
  fi
done
[ "$bad" = 0 ] && echo "readme-numbers: README.md and docs/ agree with the checkout" >&2
exit "$bad"
