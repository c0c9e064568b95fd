"""Argo CD's health check for EchoJobs (manifests/argocd/echojob-health.lua), run as Argo CD runs it.

Argo CD evaluates resource health scripts in gopher-lua (Lua 5.1) with the live object as the global
``obj``; :func:`health` does the same with Lua 5.1 from the ``lupa`` package, so the unit tests can feed
it constructed objects and the e2e tier the EchoJobs the operator really wrote.
"""

from __future__ import annotations

from typing import Any

from services.procs import REPO_ROOT

SCRIPT_PATH = REPO_ROOT / "manifests" / "argocd" / "echojob-health.lua"


def _to_lua(runtime: Any, value: Any) -> Any:
    if isinstance(value, dict):
        return runtime.table_from({k: _to_lua(runtime, v) for k, v in value.items()})
    if isinstance(value, list):
        return runtime.table_from([_to_lua(runtime, v) for v in value])
    return value


def health(obj: dict[str, Any]) -> tuple[str, str]:
    """(status, message) the health script gives the object ``obj``."""
    from lupa import lua51

    runtime = lua51.LuaRuntime(unpack_returned_tuples=True)
    runtime.globals().obj = _to_lua(runtime, obj)
    result = runtime.execute(SCRIPT_PATH.read_text())
    return str(result["status"]), str(result["message"])
