#!/usr/bin/env bash
# Sourced by the other scripts: creates (once) and activates Echo's Python environment.
# The virtual environment lives outside the repo, keyed by a hash of pyproject.toml, so a warm
# machine reuses it and a change of pins builds a fresh one. The project itself is installed
# editable from *this* checkout on every call (a few seconds), so any clone can use the cache.
set -euo pipefail
ECHORL_REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ECHORL_CACHE="${ECHORL_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/echorl}"
ECHORL_EXTRAS="${ECHORL_EXTRAS:-dev,mlx,bench}"
py="$(command -v python3.11 || command -v python3)"
hash="$( (cat "$ECHORL_REPO/pyproject.toml"; echo "$ECHORL_EXTRAS"; "$py" --version) | sha256sum | cut -c1-12)"
ECHORL_VENV="$ECHORL_CACHE/venv/$hash"
if [ ! -f "$ECHORL_VENV/.complete" ]; then
  echo "[env] creating Python environment $ECHORL_VENV (first time: a few minutes, torch is large)" >&2
  rm -rf "$ECHORL_VENV"
  "$py" -m venv "$ECHORL_VENV"
  "$ECHORL_VENV/bin/pip" install -q --upgrade pip
  "$ECHORL_VENV/bin/pip" install --progress-bar off -e "$ECHORL_REPO[$ECHORL_EXTRAS]"
  touch "$ECHORL_VENV/.complete"
fi
"$ECHORL_VENV/bin/pip" install -q --no-deps --no-build-isolation -e "$ECHORL_REPO" >/dev/null
export PATH="$ECHORL_VENV/bin:$PATH"
export VIRTUAL_ENV="$ECHORL_VENV"
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}"
