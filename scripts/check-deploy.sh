#!/usr/bin/env bash
# Renders deploy/ with kustomize (`kubectl kustomize deploy/`) and validates
# every object against the Kubernetes API schemas of the oldest supported
# version (1.25) and of the API the components are built against (1.33),
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
for v in 1.25.0 1.33.0; do
  "$VENV/bin/kubernetes-validate" --strict --quiet -k "$v" "$out"
done
echo "check-deploy: $(grep -c '^kind:' "$out") objects from deploy/ valid against Kubernetes 1.25 and 1.33" >&2
