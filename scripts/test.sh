#!/usr/bin/env bash
# The one test command (README and .ci/run call it): installs everything the tests need from the
# package registries (Python packages; MinIO, etcd and Kubernetes' binaries, CoreDNS, kwok,
# metrics-server and Kueue built with Go; containerd, runc, CNI plugins, podman and debootstrap from
# Debian), caching outside the repo, then runs the linters, the type checker and the whole pytest suite. pytest builds the e2e
# tier's images (scripts/images.sh) when an e2e test is selected, and starts its cluster.
# Extra arguments go to pytest (e.g. `scripts/test.sh tests/unit -x`, `scripts/test.sh -m "not e2e"`).
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
source scripts/env.sh
echo "[test] python env ready ($((SECONDS - start)) s)"
ECHORL_TESTBIN_DIR="$(scripts/testbin.sh | tail -n 1)"
export ECHORL_TESTBIN_DIR
echo "[test] services built: $ECHORL_TESTBIN_DIR ($((SECONDS - start)) s)"
if [ "$(id -u)" = 0 ]; then
  scripts/hostpkgs.sh
  echo "[test] host packages ready ($((SECONDS - start)) s)"
fi
echo "[test] ruff"
ruff check runtime operator tests benchmarks scripts
ruff format --check runtime operator tests benchmarks scripts
echo "[test] mypy --strict"
mypy
mypy benchmarks/*.py  # the benchmark scripts subclass and call the runtime: keep them in step with it
echo "[test] pytest"
status=0
python -m pytest --durations=30 "$@" || status=$?  # the 30 slowest: where the suite's time goes
echo "[test] finished in $((SECONDS - start)) s"
exit $status
