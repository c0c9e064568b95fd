#!/usr/bin/env bash
# Sourced by the other scripts, or by hand (`source scripts/env.sh` puts `echorl` on PATH): creates
# (once) and activates Echo's Python environment.
# The virtual environment lives outside the repo, keyed by a hash of pyproject.toml, so a warm
# machine reuses it and a change of pins builds a fresh one. Every checkout shares its packages, never
# its code: the project is installed editable once (for its metadata and the `echorl` command), and
# this file puts *this* checkout's runtime/ and operator/ first on PYTHONPATH, so two checkouts used
# at once each import their own code. One caller creates the environment at a time (flock where the
# system has it): a second one waits, then finds it complete.
# It leaves the caller's shell options as they were (an interactive shell that sources it does not
# start exiting on its next failing command) and, when a step fails, returns non-zero instead of
# exiting the caller's shell; a caller running with `set -e` stops there, as before.
# `set +o` runs in a command substitution, which never inherits errexit (bash drops -e there unless
# inherit_errexit is on): errexit is read from $- here, in the caller's shell, or a script running with
# `set -e` that sources this file would silently stop stopping on errors.
_echorl_options="$(set +o)"
case $- in *e*) _echorl_options="$_echorl_options
set -e" ;; esac
set -uo pipefail

_echorl_env() {
  local repo cache extras py hash venv
  repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)" || return 1
  cache="${ECHORL_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/echorl}"
  extras="${ECHORL_EXTRAS:-dev,mlx,bench,tensorboard,mlflow,wandb,trackio,reasoning-gym,math-verify}"
  py="$(command -v python3.11 || command -v python3)" || { echo "[env] no python3 on PATH" >&2; return 1; }
  hash="$( (cat "$repo/pyproject.toml"; echo "$extras"; "$py" --version) | sha256sum | cut -c1-12)" || return 1
  venv="$cache/venv/$hash"
  if [ ! -f "$venv/.complete" ]; then
    mkdir -p "$cache/venv" || return 1
    (
      if command -v flock >/dev/null 2>&1; then flock 9 || exit 1; fi
      [ -f "$venv/.complete" ] && exit 0  # another caller made it while this one waited
      echo "[env] creating Python environment $venv (first time: a few minutes, torch is large)" >&2
      rm -rf "$venv"
      "$py" -m venv "$venv" || exit 1
      "$venv/bin/pip" install -q --upgrade pip || exit 1
      "$venv/bin/pip" install --progress-bar off -e "$repo[$extras]" || exit 1
      touch "$venv/.complete"
    ) 9>"$venv.lock" || return 1
  fi
  # The editable install points at the checkout that made it; if that one is gone, point it here
  # (-I: what the environment imports by itself, whatever PYTHONPATH says).
  if ! "$venv/bin/python" -I -c 'import echo_runtime' 2>/dev/null; then
    (
      if command -v flock >/dev/null 2>&1; then flock 9 || exit 1; fi
      "$venv/bin/python" -I -c 'import echo_runtime' 2>/dev/null \
        || "$venv/bin/pip" install -q --no-deps --no-build-isolation -e "$repo" >/dev/null
    ) 9>"$venv.lock" || return 1
  fi
  # This checkout's code before the editable install's (which may be another checkout's), in this
  # shell and every process it starts.
  case ":${PYTHONPATH-}:" in
    *":$repo/runtime:$repo/operator:"*) ;;
    *) export PYTHONPATH="$repo/runtime:$repo/operator${PYTHONPATH:+:$PYTHONPATH}" ;;
  esac
  export PATH="$venv/bin:$PATH"
  export VIRTUAL_ENV="$venv"
  export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}"
}

_echorl_env
_echorl_status=$?
unset -f _echorl_env
# The caller's options back, our two variables gone, and the status returned (`exit` only when the
# file is run instead of sourced).
eval "$_echorl_options
unset -v _echorl_options _echorl_status
return $_echorl_status 2>/dev/null || exit $_echorl_status"
