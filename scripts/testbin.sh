#!/usr/bin/env bash
# Builds the real services the test suite runs against, from the package registries only:
#   minio           the MinIO server (Go module proxy)
#   kube-apiserver  from k8s.io/kubernetes, in a throwaway Go module that pins the k8s.io/* staging
#   kubectl           modules to the matching v0.X.Y with `replace` lines (they are `./staging/...`
#   etcd              replaces in Kubernetes' own go.mod, which `go build` of a dependency cannot use)
#   kubelet, kube-controller-manager, kube-scheduler, kube-proxy
#                   the node and the rest of the control plane, from the same module (the e2e tier)
#   coredns         the cluster DNS (github.com/coredns/coredns)
#   kwok            simulated nodes (sigs.k8s.io/kwok), with its Stage manifests in ../kwok-stages/
#   crictl          the CRI client (sigs.k8s.io/cri-tools): the harness removes pod sandboxes with it
#   metrics-server  the resource metrics API the HPA controller reads (sigs.k8s.io/metrics-server)
#   kueue           Kueue's manager (sigs.k8s.io/kueue), with its CRDs in ../kueue-crds/ and its
#                   webhook configurations in ../kueue-webhooks/
#   helm            Helm (helm.sh/helm/v4), for the chart's lint, template and install tests
#   prometheus      Prometheus (github.com/prometheus/prometheus), scraping the operator and a
#                   coordinator for the dashboard's e2e test; built without service discovery plugins
# Idempotent: binaries are cached under $ECHORL_TESTBIN (default ~/.cache/echorl/testbin/<pins>/bin);
# a warm cache returns in well under a second. Prints the bin directory on the last line of stdout.
set -euo pipefail

# --- the one place where versions are pinned -------------------------------------------------
KUBERNETES_VERSION="${KUBERNETES_VERSION:-v1.34.4}"            # kube-apiserver, kubectl
ETCD_VERSION="${ETCD_VERSION:-v3.6.4}"                          # the etcd Kubernetes v1.34 is tested with
MINIO_VERSION="${MINIO_VERSION:-v0.0.0-20260212201848-7aac2a2c5b7c}"  # MinIO publishes pseudo-versions only
COREDNS_VERSION="${COREDNS_VERSION:-v1.15.0}"
KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"
CRICTL_VERSION="${CRICTL_VERSION:-v1.34.0}"
METRICS_SERVER_VERSION="${METRICS_SERVER_VERSION:-v0.8.0}"     # not in the tag: its .ok file names it
KUEUE_VERSION="${KUEUE_VERSION:-v0.17.0}"                       # likewise
HELM_VERSION="${HELM_VERSION:-v4.3.2}"                          # likewise
PROMETHEUS_VERSION="${PROMETHEUS_VERSION:-v0.316.0}"            # likewise (Prometheus v3.x's Go module version)
# ---------------------------------------------------------------------------------------------

RECIPE=3  # bump when the build recipe below changes, so caches rebuild
tag="r${RECIPE}_k8s-${KUBERNETES_VERSION}_etcd-${ETCD_VERSION}_minio-${MINIO_VERSION##*-}"
tag+="_coredns-${COREDNS_VERSION}_kwok-${KWOK_VERSION}_crictl-${CRICTL_VERSION}"
KUBE_COMMANDS=(kube-apiserver kubectl kube-controller-manager kube-scheduler kubelet kube-proxy)
ALL=("${KUBE_COMMANDS[@]}" etcd minio coredns kwok crictl)
root="${ECHORL_TESTBIN:-${XDG_CACHE_HOME:-$HOME/.cache}/echorl/testbin}/${tag}"
bin="$root/bin"
mkdir -p "$bin"
log() { printf '[testbin %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

export GOFLAGS="-mod=mod -buildvcs=false"
export CGO_ENABLED=0
export GOTOOLCHAIN=local

have() { [ -x "$bin/$1" ] && [ -f "$bin/$1.ok" ]; }


# metrics-server joined after the tag was fixed; naming it there would rebuild every binary the tag
# covers (~25 min cold), so its stamp holds its version instead and only it rebuilds when that changes.
metrics_server_current() { have metrics-server && [ "$(cat "$bin/metrics-server.ok")" = "$METRICS_SERVER_VERSION" ]; }

build_metrics_server() {
  metrics_server_current && return 0
  rm -f "$bin/metrics-server.ok"
  build_go_install metrics-server "sigs.k8s.io/metrics-server/cmd/metrics-server@${METRICS_SERVER_VERSION}"
  echo "$METRICS_SERVER_VERSION" >"$bin/metrics-server.ok"
}

# Kueue, likewise outside the tag. Its CRDs (config/components/crd/bases) and its webhook
# configurations (config/components/webhook: the generated manifests and the kustomization whose
# patches keep kube-system and kueue-system out of the pod, Deployment and StatefulSet webhooks) come
# from the same module; the test harness installs the CRDs before it starts the manager and registers
# the webhooks, pointed at it, once it runs. Each copy carries the version it came from, so a cache
# that lacks one (made before it was copied) gets just that copy, not a rebuild of the manager.
kueue_binary_current() { have kueue && [ "$(cat "$bin/kueue.ok")" = "$KUEUE_VERSION" ]; }
kueue_copy_current() { [ -f "$root/$1/.version" ] && [ "$(cat "$root/$1/.version")" = "$KUEUE_VERSION" ]; }
kueue_current() { kueue_binary_current && kueue_copy_current kueue-crds && kueue_copy_current kueue-webhooks; }

kueue_copy() {  # DEST FILE...: the module's files into $root/DEST, stamped with the version
  local dest="$root/$1"; shift
  rm -rf "$dest.tmp" "$dest" && mkdir -p "$dest.tmp"
  cp "$@" "$dest.tmp/"
  chmod -R u+w "$dest.tmp"
  echo "$KUEUE_VERSION" >"$dest.tmp/.version"
  mv "$dest.tmp" "$dest"
}

build_kueue() {
  kueue_current && return 0
  if ! kueue_binary_current; then
    rm -f "$bin/kueue.ok"
    build_go_install kueue "sigs.k8s.io/kueue/cmd/kueue@${KUEUE_VERSION}"
    echo "$KUEUE_VERSION" >"$bin/kueue.ok"
  fi
  local dir
  dir=$(GOFLAGS= go mod download -json "sigs.k8s.io/kueue@${KUEUE_VERSION}" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  kueue_copy_current kueue-crds || kueue_copy kueue-crds "$dir"/config/components/crd/bases/*.yaml
  kueue_copy_current kueue-webhooks || kueue_copy kueue-webhooks \
    "$dir"/config/components/webhook/manifests.yaml "$dir"/config/components/webhook/kustomization.yaml
}

# Helm, for the chart's tests (charts/echorl-operator), likewise outside the tag.
helm_current() { have helm && [ "$(cat "$bin/helm.ok")" = "$HELM_VERSION" ]; }

build_helm() {
  helm_current && return 0
  rm -f "$bin/helm.ok"
  build_go_install helm "helm.sh/helm/v4/cmd/helm@${HELM_VERSION}"
  echo "$HELM_VERSION" >"$bin/helm.ok"
}

# Prometheus, likewise outside the tag. `remove_all_sd` leaves out every service discovery plugin
# (cloud SDKs, client-go): the tests give it static targets, and it builds in about a minute.
prometheus_current() { have prometheus && [ "$(cat "$bin/prometheus.ok")" = "$PROMETHEUS_VERSION" ]; }

build_prometheus() {
  prometheus_current && return 0
  rm -f "$bin/prometheus.ok"
  log "building prometheus (github.com/prometheus/prometheus@${PROMETHEUS_VERSION}, -tags remove_all_sd)"
  local start=$SECONDS
  GOBIN="$bin" go install -tags remove_all_sd "github.com/prometheus/prometheus/cmd/prometheus@${PROMETHEUS_VERSION}"
  echo "$PROMETHEUS_VERSION" >"$bin/prometheus.ok"
  log "prometheus built in $((SECONDS - start)) s"
}

have_all() {
  local name
  for name in "$@"; do have "$name" || return 1; done
}

build_go_install() {  # NAME MODULE-PATH@VERSION: a command whose module builds with plain `go install`
  have "$1" && return 0
  log "building $1 ($2)"
  local start=$SECONDS
  GOBIN="$bin" go install "$2"
  touch "$bin/$1.ok"
  log "$1 built in $((SECONDS - start)) s"
}

build_kwok() {
  # kwok exits with "no stages found" unless it is given its Stage manifests, which live in its
  # module: copy the ones the test cluster uses next to the binary.
  if have kwok && [ -d "$root/kwok-stages" ]; then return 0; fi
  rm -f "$bin/kwok.ok"
  build_go_install kwok "sigs.k8s.io/kwok/cmd/kwok@${KWOK_VERSION}"
  local dir
  dir=$(GOFLAGS= go mod download -json "sigs.k8s.io/kwok@${KWOK_VERSION}" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  rm -rf "$root/kwok-stages.tmp" && mkdir -p "$root/kwok-stages.tmp"
  cp "$dir"/kustomize/stage/node/fast/node-initialize.yaml \
    "$dir"/kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
    "$dir"/kustomize/stage/pod/fast/pod-ready.yaml \
    "$dir"/kustomize/stage/pod/fast/pod-complete.yaml \
    "$dir"/kustomize/stage/pod/fast/pod-delete.yaml "$root/kwok-stages.tmp/"
  chmod -R u+w "$root/kwok-stages.tmp"
  mv "$root/kwok-stages.tmp" "$root/kwok-stages"
}

build_kube() {
  if have_all "${KUBE_COMMANDS[@]}" etcd; then return 0; fi
  local mod="$root/kube-module" start=$SECONDS
  mkdir -p "$mod"
  log "preparing Go module for Kubernetes ${KUBERNETES_VERSION} (staging modules pinned by replace)"
  local k8s_gomod
  k8s_gomod=$(cd "$mod" && GOFLAGS= go mod download -json "k8s.io/kubernetes@${KUBERNETES_VERSION}" \
    | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  local staging="v0.${KUBERNETES_VERSION#v1.}"
  {
    echo "module echorl.dev/testbin"
    echo
    echo "go 1.24.0"
    echo
    echo "replace ("
    sed -n 's#^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*#\t\1 => \1 '"$staging"'#p' "$k8s_gomod"
    echo ")"
  } >"$mod/go.mod"
  cat >"$mod/tools.go" <<'GO'
//go:build tools

// Package tools only records the commands this module builds.
package tools
GO
  # Without these the binaries report v0.0.0-master, and version-aware clients misbehave.
  local minor="${KUBERNETES_VERSION#v1.}"; minor="${minor%%.*}"
  local ldflags=""
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=${KUBERNETES_VERSION} -X $pkg.gitMajor=1 -X $pkg.gitMinor=${minor}"
    ldflags+=" -X $pkg.gitTreeState=clean"
  done
  (
    cd "$mod"
    go get "k8s.io/kubernetes@${KUBERNETES_VERSION}" "go.etcd.io/etcd/server/v3@${ETCD_VERSION}"
    for cmd in "${KUBE_COMMANDS[@]}"; do
      have "$cmd" && continue
      log "compiling $cmd (the first, kube-apiserver, is the longest step)"
      local t=$SECONDS
      go build -ldflags "$ldflags" -o "$bin/$cmd" "k8s.io/kubernetes/cmd/$cmd" && touch "$bin/$cmd.ok"
      log "$cmd compiled in $((SECONDS - t)) s"
    done
    if ! have etcd; then
      log "compiling etcd ${ETCD_VERSION}"
      go build -o "$bin/etcd" go.etcd.io/etcd/server/v3 && touch "$bin/etcd.ok"
    fi
  )
  log "Kubernetes binaries built in $((SECONDS - start)) s"
}

# One build at a time per cache: a second caller (another test run, a helper) waits for the first.
if ! have_all "${ALL[@]}" || [ ! -d "$root/kwok-stages" ] || ! metrics_server_current || ! kueue_current \
  || ! helm_current || ! prometheus_current; then
  exec 9>"$root/.lock"
  if ! flock -n 9; then
    log "another build is running in $root; waiting for it"
    flock 9
  fi
  # MinIO publishes pseudo-versions only; several minutes on 2 cores the first time.
  build_go_install minio "github.com/minio/minio@${MINIO_VERSION}"
  build_kube
  build_go_install coredns "github.com/coredns/coredns@${COREDNS_VERSION}"
  build_kwok
  build_go_install crictl "sigs.k8s.io/cri-tools/cmd/crictl@${CRICTL_VERSION}"
  build_metrics_server
  build_kueue
  build_helm
  build_prometheus
fi
"$bin/kube-apiserver" --version >&2
"$bin/etcd" --version | sed -n 1p >&2
log "ready: $bin"
echo "$bin"
