#!/usr/bin/env bash
# The README's first command: sets up Echo's Python environment (cached) and runs the main job
# locally. Extra arguments go to `echorl run` (e.g. --resume); without them a previous run of the
# quickstart is replaced (--fresh).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
args=("$@")
[ ${#args[@]} -eq 0 ] && args=(--fresh)
exec echorl run examples/quickstart.yaml --target-accuracy 0.5 "${args[@]}"
