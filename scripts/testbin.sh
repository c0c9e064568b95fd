#!/usr/bin/env bash
# Builds the real services the test suite runs against, from the package registries only:
#   minio           the MinIO server (Go module proxy)
#   kube-apiserver  from k8s.io/kubernetes, in a throwaway Go module that pins the k8s.io/* staging
#   kubectl           modules to the matching v0.X.Y with `replace` lines (they are `./staging/...`
#   etcd              replaces in Kubernetes' own go.mod, which `go build` of a dependency cannot use)
# Idempotent: binaries are cached under $ECHORL_TESTBIN (default ~/.cache/echorl/testbin/<pins>/bin);
# a warm cache returns in well under a second. Prints the bin directory on the last line of stdout.
set -euo pipefail

# --- the one place where versions are pinned -------------------------------------------------
KUBERNETES_VERSION="${KUBERNETES_VERSION:-v1.34.4}"            # kube-apiserver, kubectl
ETCD_VERSION="${ETCD_VERSION:-v3.6.4}"                          # the etcd Kubernetes v1.34 is tested with
MINIO_VERSION="${MINIO_VERSION:-v0.0.0-20260212201848-7aac2a2c5b7c}"  # MinIO publishes pseudo-versions only
# ---------------------------------------------------------------------------------------------

RECIPE=2  # bump when the build recipe below changes, so caches rebuild
tag="r${RECIPE}_k8s-${KUBERNETES_VERSION}_etcd-${ETCD_VERSION}_minio-${MINIO_VERSION##*-}"
root="${ECHORL_TESTBIN:-${XDG_CACHE_HOME:-$HOME/.cache}/echorl/testbin}/${tag}"
bin="$root/bin"
mkdir -p "$bin"
log() { printf '[testbin %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

export GOFLAGS="-mod=mod -buildvcs=false"
export CGO_ENABLED=0
export GOTOOLCHAIN=local

have() { [ -x "$bin/$1" ] && [ -f "$bin/$1.ok" ]; }

build_minio() {
  have minio && return 0
  log "building minio ${MINIO_VERSION} (first time only; several minutes on 2 cores)"
  local start=$SECONDS
  GOBIN="$bin" go install "github.com/minio/minio@${MINIO_VERSION}"
  touch "$bin/minio.ok"
  log "minio built in $((SECONDS - start)) s"
}

build_kube() {
  if have kube-apiserver && have kubectl && have etcd; then return 0; fi
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
    log "compiling kube-apiserver (first time only; the longest step)"
    go build -ldflags "$ldflags" -o "$bin/kube-apiserver" k8s.io/kubernetes/cmd/kube-apiserver && touch "$bin/kube-apiserver.ok"
    log "compiling kubectl"
    go build -ldflags "$ldflags" -o "$bin/kubectl" k8s.io/kubernetes/cmd/kubectl && touch "$bin/kubectl.ok"
    log "compiling etcd ${ETCD_VERSION}"
    go build -o "$bin/etcd" go.etcd.io/etcd/server/v3 && touch "$bin/etcd.ok"
  )
  log "Kubernetes binaries built in $((SECONDS - start)) s"
}

# One build at a time per cache: a second caller (another test run, a helper) waits for the first.
if ! { have minio && have kube-apiserver && have kubectl && have etcd; }; then
  exec 9>"$root/.lock"
  if ! flock -n 9; then
    log "another build is running in $root; waiting for it"
    flock 9
  fi
  build_minio
  build_kube
fi
"$bin/kube-apiserver" --version >&2
"$bin/etcd" --version | sed -n 1p >&2
log "ready: $bin"
echo "$bin"
