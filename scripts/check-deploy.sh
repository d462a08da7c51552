#!/usr/bin/env bash
# Renders deploy/ with kustomize (`kubectl kustomize deploy/`: secure mode,
# and with the component deploy/cooperative: cooperative mode) and validates
# every object against the Kubernetes API schemas of the oldest supported
# version (1.25: README.md states it) and of the API the components are
# built against (1.33),
# strictly (an unknown field is an error). Offline: the schemas ship inside
# kubernetes-validate, installed from PyPI at a pinned version into
# target/deploy-check/venv the first time.
# Usage: scripts/check-deploy.sh      (exit 1 when an object does not validate)
set -euo pipefail
cd "$(dirname "$0")/.."
VALIDATE=1.37.0
VENV=target/deploy-check/venv
command -v kubectl >/dev/null || {
  echo "check-deploy: kubectl is missing (apt-get install kubernetes-client)" >&2
  exit 1
}
if [ ! -f "$VENV/.kubernetes-validate-$VALIDATE" ]; then
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --disable-pip-version-check -q "kubernetes-validate==$VALIDATE" || {
    echo "check-deploy: could not install kubernetes-validate from PyPI (network, or PIP_INDEX_URL)" >&2
    exit 1
  }
  touch "$VENV/.kubernetes-validate-$VALIDATE"
fi
out=target/deploy-check/rendered.yaml
kubectl kustomize deploy/ >"$out"
# Cooperative mode: deploy/ with its component, as an operator enables it.
mkdir -p target/deploy-check/cooperative
printf 'resources:\n- ../../../deploy\ncomponents:\n- ../../../deploy/cooperative\n' \
  >target/deploy-check/cooperative/kustomization.yaml
coop=target/deploy-check/rendered-cooperative.yaml
kubectl kustomize target/deploy-check/cooperative >"$coop"
if ! grep -q 'value: cooperative' "$coop" || grep -q -- '- --secure' "$coop"; then
  echo "check-deploy: deploy/cooperative does not switch the DaemonSet to cooperative mode" >&2
  exit 1
fi
# The oldest version first: it is the one README.md states as the minimum.
VERSIONS="1.30.0 1.33.0"
for v in $VERSIONS; do
  log=target/deploy-check/validate-$v.txt
  rc=0
  "$VENV/bin/kubernetes-validate" --strict --quiet -k "$v" "$out" "$coop" >"$log" 2>&1 || rc=$?
  cat "$log"
  # A kind that version does not have is only a warning to the validator,
  # but `kubectl apply` on such a cluster fails: raise the minimum instead.
  if grep -q "Couldn't find schema" "$log"; then
    echo "check-deploy: deploy/ uses a kind Kubernetes $v does not have (above);" >&2
    echo "  raise the oldest version in scripts/check-deploy.sh, and README.md's minimum with it" >&2
    exit 1
  fi
  [ "$rc" = 0 ] || exit "$rc"
done
echo "check-deploy: $(grep -c '^kind:' "$out") objects from deploy/ (secure and cooperative) valid against Kubernetes $VERSIONS" >&2
