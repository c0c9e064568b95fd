#!/usr/bin/env bash
# Installs the Debian packages the tests need (a real node, a real image builder, certificates), if missing:
#   containerd, runc                    the container runtime the kubelet drives (crun fails on cgroup v1 hybrid)
#   containernetworking-plugins         CNI plugins in /usr/lib/cni (ptp, host-local, loopback)
#   iptables, conntrack                 kube-proxy's Service rules
#   podman, buildah                     the image builder (images/*.Dockerfile)
#   debootstrap                         the base image, made from Debian packages (no registry)
#   openssl                             the TLS tests make their CA and certificates with it
#   libjemalloc2                        the allocator `echorl run` gives its processes when installed
# Needs root. Idempotent: with everything installed it only checks (well under a second).
set -euo pipefail
PACKAGES=(containerd runc containernetworking-plugins iptables conntrack podman buildah debootstrap openssl libjemalloc2)
missing=()
for pkg in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then
  echo "scripts/hostpkgs.sh: the tests need these Debian packages, and root to install them: ${missing[*]}" >&2
  exit 1
fi
echo "[hostpkgs] installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
if ! apt-get install -y -q --no-install-recommends "${missing[@]}" >&2; then
  apt-get update -q >&2
  apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
fi
# The package starts nothing here (no systemd), but make sure of it: the test cluster runs its own
# containerd, with its own state, inside its own network namespace.
if pgrep -x containerd >/dev/null; then
  echo "[hostpkgs] note: a system containerd is running; the test cluster does not use it" >&2
fi
