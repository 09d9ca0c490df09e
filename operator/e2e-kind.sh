#!/usr/bin/env bash
# make e2e-kind: the sandbox scenarios on a real cluster (kind), where Docker and kind exist.
# Without them it says why and exits 0, so `make e2e-kind` is safe everywhere.
#
# The operator runs on this machine against the kind apiserver (out of cluster), without
# webhooks: a kind apiserver cannot call back into a process on the host without extra
# networking. The CompactionService scenarios (create, status, update, scale, delete) run as in
# tests/operator; the webhook scenarios stay with the emulator tests.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
KUBECTL="$BIN/kubectl"

if ! command -v docker >/dev/null 2>&1 || ! docker info >/dev/null 2>&1; then
  echo "e2e-kind: skipped: Docker is not available on this machine"
  exit 0
fi
if ! command -v kind >/dev/null 2>&1; then
  echo "e2e-kind: skipped: kind is not installed (https://kind.sigs.k8s.io)"
  exit 0
fi

CLUSTER=statetier-e2e
WORK=$(mktemp -d)
KUBECONFIG="$WORK/kubeconfig"
export KUBECONFIG
OPERATOR_PID=
cleanup() {
  if [ -n "$OPERATOR_PID" ]; then kill "$OPERATOR_PID" 2>/dev/null || true; wait "$OPERATOR_PID" 2>/dev/null || true; fi
  kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT

kind create cluster --name "$CLUSTER" --kubeconfig "$KUBECONFIG" --wait 120s
"$KUBECTL" apply -f crds/
"$KUBECTL" wait --for condition=established --timeout=60s crd/compactionservices.statetier.io

"$BIN/statetier-operator" run --namespace default --standalone --no-webhooks \
  --metrics-addr 127.0.0.1 --metrics-port 19090 --log-format plain >"$WORK/operator.log" 2>&1 &
OPERATOR_PID=$!

fail() { echo "e2e-kind: FAILED: $*"; tail -50 "$WORK/operator.log"; exit 1; }
wait_for() {  # wait_for DESCRIPTION COMMAND...
  local what=$1; shift
  for _ in $(seq 1 120); do "$@" >/dev/null 2>&1 && return 0; sleep 1; done
  fail "timed out waiting for $what"
}

"$KUBECTL" apply -f examples/compactionservice.yaml
wait_for "the worker Deployment" "$KUBECTL" get deployment compaction-workers
wait_for "the gateway Service" "$KUBECTL" get service compaction-gateway
wait_for "the status endpoint" sh -c "'$KUBECTL' get compsvc compaction -o jsonpath='{.status.endpoint}' | grep -q compaction-gateway"

"$KUBECTL" patch compsvc compaction --type merge -p '{"spec":{"image":"statetier/compaction:e2e","workers":{"min":2,"max":3}}}'
wait_for "min=2 rolled out" sh -c "test \"\$('$KUBECTL' get deployment compaction-workers -o jsonpath='{.spec.replicas}')\" = 2"
wait_for "new image" sh -c "'$KUBECTL' get deployment compaction-gateway -o jsonpath='{.spec.template.spec.containers[0].image}' | grep -q e2e"

"$KUBECTL" scale compsvc/compaction --replicas=10
wait_for "clamped to max=3" sh -c "test \"\$('$KUBECTL' get deployment compaction-workers -o jsonpath='{.spec.replicas}')\" = 3"
"$KUBECTL" get compsvc -o wide
"$KUBECTL" get events --field-selector involvedObject.name=compaction

"$KUBECTL" delete compsvc compaction --wait=true
wait_for "garbage collection" sh -c "! '$KUBECTL' get deployment compaction-workers"
echo "e2e-kind: passed"
