#!/usr/bin/env bash
# End-to-end test of the operator on a kind cluster, for machines with Docker (CI here has none).
#
#   scripts/e2e-kind.sh            # create cluster `echorl-e2e`, build + load images, run, delete cluster
#   KEEP=1 scripts/e2e-kind.sh     # keep the cluster afterwards (kubectl --context kind-echorl-e2e ...)
#
# Needs docker, kind and kubectl on PATH. Steps: build the operator, CPU-worker and trainer images
# (images/*.Dockerfile) with tag $TAG, load them into kind, install manifests/ (CRDs, RBAC, operator,
# dev MinIO), run manifests/examples/cpu-job.yaml with a short maxSteps, wait until the EchoJob is
# Ready, its policy version advances and StalenessBounded holds, then delete it and check that
# garbage collection removed every child (the part envtest cannot show).
set -euo pipefail
cd "$(dirname "$0")/.."

CLUSTER="${CLUSTER:-echorl-e2e}"
TAG="${TAG:-e2e}"
REGISTRY="${REGISTRY:-ghcr.io/echorl}"
NS="${NS:-echo-e2e}"
TIMEOUT="${TIMEOUT:-1200}"
KEEP="${KEEP:-0}"
log() { printf '[e2e %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

for tool in docker kind kubectl; do
  command -v "$tool" >/dev/null || { echo "scripts/e2e-kind.sh needs $tool on PATH" >&2; exit 2; }
done

if ! kind get clusters | grep -qx "$CLUSTER"; then
  log "creating kind cluster $CLUSTER"
  kind create cluster --name "$CLUSTER" --wait 120s
fi
ctx="kind-$CLUSTER"
k() { kubectl --context "$ctx" "$@"; }
cleanup() {
  if [ "$KEEP" != 1 ]; then log "deleting cluster $CLUSTER"; kind delete cluster --name "$CLUSTER"; fi
}
trap cleanup EXIT

for image in operator worker-cpu trainer; do
  ref="$REGISTRY/echorl-$image:$TAG"
  log "building $ref"
  docker build -f "images/$image.Dockerfile" -t "$ref" .
  kind load docker-image --name "$CLUSTER" "$ref"
done

log "installing manifests/"
k apply --server-side -k manifests/
k -n echorl-system set image deployment/echorl-operator "operator=$REGISTRY/echorl-operator:$TAG"
k -n echorl-system set env deployment/echorl-operator \
  "ECHORL_IMAGE_COORDINATOR=$REGISTRY/echorl-worker-cpu:$TAG" \
  "ECHORL_IMAGE_WORKER_CPU=$REGISTRY/echorl-worker-cpu:$TAG" \
  "ECHORL_IMAGE_TRAINER=$REGISTRY/echorl-trainer:$TAG" \
  ECHORL_IMAGE_PULL_POLICY=IfNotPresent ECHORL_STATUS_INTERVAL=5 ECHORL_EXTERNAL_SERVICE_TYPE=None
k -n echorl-system rollout status deployment/echorl-operator --timeout=300s
k -n echorl-system rollout status deployment/minio --timeout=300s

log "running the CPU example in namespace $NS"
k create namespace "$NS" --dry-run=client -o yaml | k apply -f -
k -n "$NS" apply -f manifests/examples/cpu-job.yaml
k -n "$NS" patch echojob/cpu-demo --type=merge -p '{"spec": {"algorithm": {"maxSteps": 5}}}'
k -n "$NS" wait echojob/cpu-demo --for=condition=Ready --timeout="${TIMEOUT}s"

log "waiting for the policy version to advance"
deadline=$((SECONDS + TIMEOUT))
until [ "$(k -n "$NS" get echojob/cpu-demo -o jsonpath='{.status.policyVersion}')" -ge 2 ] 2>/dev/null; do
  [ $SECONDS -lt $deadline ] || { k -n "$NS" describe echojob/cpu-demo; exit 1; }
  sleep 5
done
k -n "$NS" get echojob/cpu-demo -o wide
bounded=$(k -n "$NS" get echojob/cpu-demo -o jsonpath='{.status.conditions[?(@.type=="StalenessBounded")].status}')
[ "$bounded" = True ] || { log "StalenessBounded is $bounded"; k -n "$NS" describe echojob/cpu-demo; exit 1; }

log "deleting the job: every child must go (owner references)"
k -n "$NS" delete echojob/cpu-demo --wait=true --timeout=120s
deadline=$((SECONDS + 120))
until [ -z "$(k -n "$NS" get deploy,sts,svc,cm,secret -l echorl.dev/job=cpu-demo -o name)" ]; do
  [ $SECONDS -lt $deadline ] || { log "children left behind"; k -n "$NS" get all -l echorl.dev/job=cpu-demo; exit 1; }
  sleep 2
done
log "passed"
