#!/usr/bin/env bash
# The README's first command: sets up Echo's Python environment (cached) and runs the main job.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
echorl validate examples/quickstart.yaml
echorl model init --size tiny
