#!/usr/bin/env bash
# The e2e tier's test cluster, by hand: the same one `kube_cluster` starts (tests/services/cluster.py).
#
#   scripts/cluster.sh up               build what is missing (binaries, images), start it, return
#   scripts/cluster.sh status           nodes and pods
#   scripts/cluster.sh images           the image tags built here that the node holds (no registry)
#   scripts/cluster.sh install          Echo with those images: manifests/ and its dev MinIO, rolled out
#   scripts/cluster.sh kubectl ARGS...  kubectl inside the cluster's network namespace, as admin
#   scripts/cluster.sh shell            a shell inside that namespace, KUBECONFIG and kubectl set
#   scripts/cluster.sh down             stop it and remove everything it left on the host
#
# Needs root. The whole cluster (node address, pods, Services) lives in a network namespace with no
# route out: reach it only through these commands (nsenter --net), never from the host's network.
# ECHORL_CLUSTER_NAME (default dev) names the cluster; its state is in /tmp/echorl-cluster-NAME/.
# Paths in ARGS (`kubectl apply -k manifests/`) are the caller's, as kubectl's own are.
set -euo pipefail
caller="$PWD"
repo="$(cd "$(dirname "$0")/.." && pwd)"
source "$repo/scripts/env.sh"
"$repo/scripts/hostpkgs.sh"
cd "$caller"
PYTHONPATH="$repo/tests:$PYTHONPATH" exec python -m services.cluster "$@"
