#!/usr/bin/env bash
# Builds Echo's container images for real, with podman, without any image registry:
#
#   scripts/images.sh                  build what is missing, load it into the test cluster's containerd
#                                      image store; print the JSON image list's path (last line)
#   scripts/images.sh import SOCKET LIST   copy the images of LIST that containerd (at SOCKET) lacks into it
#
# 1. a base image made from Debian packages: debootstrap (minbase + python3, python3-venv,
#    ca-certificates) from the Debian mirror, imported into podman's store;
# 2. a wheelhouse: the wheels the images install, downloaded once from PyPI with pip;
# 3. images/{operator,worker-cpu,trainer}.Dockerfile and the test images in tests/e2e/images/, built
#    with BASE=<that base> and PIP_INDEX_URL=http://127.0.0.1:3141/simple, a package index over the
#    wheelhouse (scripts/pyindex.py). Builds run inside a network namespace of their own that has
#    nothing but loopback: they reach that index and nothing else;
# 4. the images the test cluster's containerd image store (~/.cache/echorl/cluster/containerd) lacks
#    are imported into it by a containerd of its own, started just for that (no CRI, no network), so
#    that the cluster starts without importing; skipped while a cluster holds that store.
#
# Everything is cached under $ECHORL_E2E_CACHE/images (default ~/.cache/echorl/images), keyed by
# content: the base by its recipe, the wheelhouse by pyproject.toml, each image by its Dockerfile,
# build arguments, base, wheelhouse and the files it copies. A warm cache builds nothing. Needs root
# (podman's and containerd's stores, network namespaces). images/README.md says why it is built so.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD

# --- the recipe ------------------------------------------------------------------------------
SUITE="${ECHORL_DEBIAN_SUITE:-bookworm}"                     # Python 3.11, like the project
MIRROR="${ECHORL_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
BASE_PACKAGES="python3,python3-venv,ca-certificates,libjemalloc2"
INDEX_PORT=3141   # fixed: the index URL is a build argument, part of every layer's cache key
RECIPE=1          # bump when this script's recipe changes, so images rebuild
IMAGES=(operator worker-cpu trainer)                        # images/<name>.Dockerfile
TEST_IMAGES=(pause minio failing-trainer)                   # tests/e2e/images/<name>.Dockerfile
# ---------------------------------------------------------------------------------------------

CACHE="${ECHORL_E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/echorl}/images"
log() { printf '[images %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
sha() { sha256sum | cut -c1-"${1:-16}"; }
mkdir -p "$CACHE"/{podman,tmp,wheels}

# podman with a store of its own (not the system's), runc (crun fails on cgroup v1 hybrid), the
# rlimits root may actually set here, no registry to resolve short names against.
STORE_KEY=$(printf '%s' "$CACHE" | sha 12)
cat >"$CACHE/podman/storage.conf" <<EOF
[storage]
driver = "overlay"
graphroot = "$CACHE/podman/storage"
runroot = "/run/echorl-podman/$STORE_KEY"
EOF
cat >"$CACHE/podman/containers.conf" <<'EOF'
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
netns = "host"
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
printf 'unqualified-search-registries = []\n' >"$CACHE/podman/registries.conf"
export CONTAINERS_STORAGE_CONF="$CACHE/podman/storage.conf"
export CONTAINERS_CONF="$CACHE/podman/containers.conf"
export CONTAINERS_REGISTRIES_CONF="$CACHE/podman/registries.conf"
export TMPDIR="$CACHE/tmp"
pm() { podman --events-backend file "$@"; }

# --- import into a containerd ----------------------------------------------------------------
if [ "${1:-}" = import ]; then
  sock="${2:?usage: scripts/images.sh import CONTAINERD_SOCKET IMAGE_LIST}"
  list="${3:?usage: scripts/images.sh import CONTAINERD_SOCKET IMAGE_LIST}"
  c() { ctr --address "$sock" -n k8s.io "$@"; }
  wanted=$(python3 -c 'import json,sys; print("\n".join(json.load(open(sys.argv[1])).values()))' "$list")
  have=$(c images ls -q)
  for ref in $wanted; do
    grep -qxF "$ref" <<<"$have" && continue
    log "importing $ref into containerd"
    start=$SECONDS
    # Streamed: a docker-archive is written layer by layer, so no copy of the image lands on disk.
    pm save --format docker-archive "$ref" | c images import - >&2
    # Unpacked layers live on as snapshots: let containerd's garbage collector drop the layer
    # blobs (as its CRI plugin's discard_unpacked_layers does), halving the disk an image takes.
    for manifest in $(python3 "$REPO/scripts/images-manifests.py" "$sock" "$ref"); do
      labels=$(c content ls | awk -v d="$manifest" '$1 == d {print $NF}' | tr ',' '\n' \
        | sed -n 's/^\(containerd.io\/gc.ref.content.l[^=]*\)=.*/\1=/p')
      if [ -n "$labels" ]; then c content label "$manifest" $labels >/dev/null; fi
    done
    log "imported $ref in $((SECONDS - start)) s"
  done
  # One generation only: images of ours that the list does not name go, and with them the snapshots
  # nothing else uses (after the import, so that layers the new images share stay unpacked).
  for old in $(c images ls -q | grep '^localhost/echorl/' | grep -vxF "$wanted" || true); do
    log "removing $old from containerd (not in $list)"
    c images rm "$old" >/dev/null
  done
  exit 0
fi

scripts/hostpkgs.sh
# One build at a time per store (a second caller waits): builds prune what the list does not name.
exec 7>"$CACHE/.build-lock"
if ! flock -n 7; then
  log "another scripts/images.sh is using $CACHE; waiting for it"
  flock 7
fi

# A build killed outright (SIGKILL: no EXIT trap runs) leaves its namespace echorl-build-<pid> and
# perhaps its package index inside it. Remove every one whose images.sh is gone; a live one may be
# another store's build.
for path in /run/netns/echorl-build-*; do
  [ -e "$path" ] || continue
  owner=${path##*-}
  if [ "$owner" != $$ ] && grep -qs images.sh "/proc/$owner/cmdline"; then continue; fi
  stale=${path##*/}
  ip netns pids "$stale" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
  ip netns delete "$stale" && log "removed the network namespace $stale left by a killed build"
done

# --- 1. the base: Debian packages, no registry -----------------------------------------------
base="localhost/echorl/debian-python:$(printf '%s\n' "$RECIPE" "$SUITE" "$MIRROR" "$BASE_PACKAGES" | sha 12)"
if ! pm image exists "$base"; then
  log "making the base image $base (debootstrap $SUITE: $BASE_PACKAGES)"
  start=$SECONDS
  rootfs="$TMPDIR/rootfs.$$"
  trap 'umount -R "$rootfs/proc" "$rootfs/sys" 2>/dev/null || true; rm -rf "$rootfs"' EXIT
  debootstrap --variant=minbase --include="$BASE_PACKAGES" "$SUITE" "$rootfs" "$MIRROR" >"$TMPDIR/debootstrap.log" 2>&1 \
    || { tail -20 "$TMPDIR/debootstrap.log" >&2; exit 1; }
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/*.log
  tar --numeric-owner -C "$rootfs" -c . | pm import --message "debootstrap $SUITE $BASE_PACKAGES" - "$base" >&2
  rm -rf "$rootfs"
  trap - EXIT
  log "base image ready in $((SECONDS - start)) s"
fi

# --- 2. the wheelhouse: every wheel the images install, from PyPI, once ----------------------
requirements() {
  python3 - "$REPO/pyproject.toml" <<'PY'
import sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
print("\n".join(project["dependencies"] + project["optional-dependencies"]["mlx"]))
print("setuptools>=69\nwheel")
PY
}
wheels="$CACHE/wheels/$( (requirements; python3 --version) | sha 12)"
if [ ! -f "$wheels/.complete" ]; then
  log "downloading the wheelhouse into $wheels (first time: a few GB from PyPI)"
  start=$SECONDS
  rm -rf "$wheels" && mkdir -p "$wheels"
  # A dependency change re-keys the wheelhouse: start from the last complete one (hard links), so
  # pip fetches only the wheels that are new ("already downloaded" for the rest), not a few GB.
  previous=$(ls -td "$CACHE"/wheels/*/.complete 2>/dev/null | head -1 || true)
  if [ -n "$previous" ]; then cp -al "$(dirname "$previous")"/*.whl "$wheels"/ 2>/dev/null || true; fi
  requirements >"$wheels/requirements.txt"
  # Debian's python3 has no pip; a small venv of its own has (the images' Python is the same 3.11).
  [ -x "$CACHE/pip/bin/pip" ] || python3 -m venv "$CACHE/pip"
  "$CACHE/pip/bin/pip" download --progress-bar off --disable-pip-version-check --only-binary=:all: \
    -d "$wheels" -r "$wheels/requirements.txt" >"$TMPDIR/pip-download.log" 2>&1 \
    || { tail -20 "$TMPDIR/pip-download.log" >&2; exit 1; }
  # ...and keep only what pip chose this time (a seeded wheel of an old version goes).
  sed -n -e 's|^ *Saved ||p' -e 's|^ *File was already downloaded ||p' "$TMPDIR/pip-download.log" \
    | xargs -r -n1 basename | sort -u >"$wheels/.chosen"
  for whl in "$wheels"/*.whl; do grep -qxF "$(basename "$whl")" "$wheels/.chosen" || rm -f "$whl"; done
  touch "$wheels/.complete"
  log "wheelhouse ready in $((SECONDS - start)) s ($(du -sh "$wheels" | cut -f1))"
fi

# --- 3. the images -----------------------------------------------------------------------------
# The build context: only the files a Dockerfile copies, as git sees them (tracked and new files,
# never ignored ones such as __pycache__), so the key below is a key of what goes in.
context="$TMPDIR/context.$$"
rm -rf "$context" && mkdir -p "$context"
cleanup() {
  if [ -n "${index_pid:-}" ]; then kill "$index_pid" 2>/dev/null || true; wait "$index_pid" 2>/dev/null || true; fi
  if [ -n "${netns:-}" ]; then ip netns delete "$netns" 2>/dev/null || true; fi
  # The import's containerd (step 4): a run killed mid-import must not leave it holding the store.
  if [ -n "${containerd_pid:-}" ]; then
    kill "$containerd_pid" 2>/dev/null || true; wait "$containerd_pid" 2>/dev/null || true
    rm -rf "/run/echorl-images-$$"
  fi
  rm -rf "$context" "$TMPDIR/test-context.$$"
  # A build cut short leaves its working containers mounted in the store: remove them, and with
  # the last one podman unmounts the store (we hold the build lock: none is anyone else's).
  local leftover
  leftover=$(pm ps -a --external -q 2>/dev/null || true)
  if [ -n "$leftover" ]; then pm rm -f --storage $leftover >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT
git ls-files -z -c -o --exclude-standard -- pyproject.toml README.md runtime operator \
  | tar --null -T - -c | tar -x -C "$context"
src_key=$(tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$context" -c . | sha)

netns=""
start_builder() {  # a network namespace with only loopback, and the package index inside it
  [ -n "$netns" ] && return 0
  netns="echorl-build-$$"
  ip netns add "$netns"
  ip -n "$netns" link set lo up
  nsenter --net="/run/netns/$netns" python3 scripts/pyindex.py "$wheels" --port "$INDEX_PORT" >"$TMPDIR/pyindex.log" 2>&1 &
  index_pid=$!
  for _ in $(seq 50); do
    nsenter --net="/run/netns/$netns" python3 -c \
      "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$INDEX_PORT/simple/')" 2>/dev/null && return 0
    sleep 0.2
  done
  cat "$TMPDIR/pyindex.log" >&2
  return 1
}

torch=$(requirements | grep -E '^torch([=<>~ ]|$)' | head -n 1)
declare -A built
build() {  # NAME DOCKERFILE CONTEXT KEY-EXTRA
  local name=$1 dockerfile=$2 ctx=$3 extra=$4 key ref start
  key=$( (cat "$dockerfile"; echo "$RECIPE $base $wheels $extra") | sha)
  ref="localhost/echorl/$name:$key"
  built[$name]=$ref
  pm image exists "$ref" && return 0
  start_builder
  log "building $ref from $dockerfile"
  start=$SECONDS
  nsenter --net="/run/netns/$netns" podman --events-backend file build --pull=never --layers \
    --network host --runtime runc \
    --build-arg "BASE=$base" \
    --build-arg "PIP_INDEX_URL=http://127.0.0.1:$INDEX_PORT/simple" \
    --build-arg "TORCH_INDEX_URL=" \
    --build-arg "TORCH=$torch" \
    -t "$ref" -f "$dockerfile" "$ctx" >"$TMPDIR/build-$name.log" 2>&1 \
    || { tail -40 "$TMPDIR/build-$name.log" >&2; log "build of $name failed (log: $TMPDIR/build-$name.log)"; exit 1; }
  log "built $ref in $((SECONDS - start)) s ($(pm image inspect --format '{{.Size}}' "$ref" | awk '{printf "%.0f MB", $1/1e6}'))"
}

for name in "${IMAGES[@]}"; do
  build "$name" "images/$name.Dockerfile" "$context" "$src_key"
done

# Test images: a pause container (the pod sandbox containerd expects), the dev MinIO of
# manifests/dev/minio.yaml from the minio this repo builds, and a trainer that fails on purpose.
bin="${ECHORL_TESTBIN_DIR:-$(scripts/testbin.sh | tail -n 1)}"
test_ctx="$TMPDIR/test-context.$$"
rm -rf "$test_ctx" && mkdir -p "$test_ctx"
cp tests/e2e/images/* "$test_ctx/"
gcc -static -O2 -o "$test_ctx/pause" tests/e2e/images/pause.c
cp "$bin/minio" "$test_ctx/minio"
test_key=$(tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$test_ctx" -c . | sha)
for name in "${TEST_IMAGES[@]}"; do
  build "test-$name" "tests/e2e/images/$name.Dockerfile" "$test_ctx" "$test_key"
done

# One generation only in podman's store too: our images the list does not name, and the layers
# nothing uses any more, go (the wheelhouse likewise).
keep=$(printf '%s\n' "${built[@]}")
for old in $(pm images --format '{{.Repository}}:{{.Tag}}' | grep '^localhost/echorl/' | grep -v '^localhost/echorl/debian-python:' | grep -vxF "$keep" || true); do
  pm rmi "$old" >/dev/null 2>&1 || true
done
pm image prune -f >/dev/null 2>&1 || true
for dir in "$CACHE"/wheels/*/; do [ "${dir%/}" = "$wheels" ] || rm -rf "$dir"; done

mkdir -p "$CACHE/lists"
list="$CACHE/lists/$(for n in "${!built[@]}"; do echo "$n ${built[$n]}"; done | sort | sha 12).json"
{
  echo "{"
  first=1
  for name in "${IMAGES[@]}" "${TEST_IMAGES[@]/#/test-}"; do
    [ $first = 1 ] || echo ","
    first=0
    printf '  "%s": "%s"' "$name" "${built[$name]}"
  done
  echo
  echo "}"
} >"$list.tmp"
mv "$list.tmp" "$list"

# --- 4. into the test cluster's image store ---------------------------------------------------
store="${ECHORL_E2E_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/echorl}/cluster/containerd"
mkdir -p "$store"
exec 8>"$store/.lock"
if flock -n 8; then
  run="/run/echorl-images-$$"
  mkdir -p "$run"
  printf '%s\n' 'version = 2' "root = \"$store\"" "state = \"$run/state\"" \
    'disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]' \
    '[grpc]' "  address = \"$run/containerd.sock\"" >"$run/config.toml"
  # Without the build lock's descriptor (7): a containerd that outlived this script would hold it.
  containerd --config "$run/config.toml" --log-level warn >"$TMPDIR/containerd-import.log" 2>&1 7>&- &
  containerd_pid=$!
  for _ in $(seq 100); do ctr --address "$run/containerd.sock" version >/dev/null 2>&1 && break; sleep 0.2; done
  status=0
  "$REPO/scripts/images.sh" import "$run/containerd.sock" "$list" || status=$?
  kill "$containerd_pid" 2>/dev/null || true
  wait "$containerd_pid" 2>/dev/null || true
  containerd_pid=""
  rm -rf "$run"
  [ "$status" = 0 ] || exit "$status"
  flock -u 8
else
  log "a test cluster holds $store: it imports the images itself when it starts"
fi
exec 8>&-

log "ready: $list"
echo "$list"
