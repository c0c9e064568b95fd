"""Helpers for the operator's integration tests: waiting, applying YAML, reading children."""

from __future__ import annotations

import base64
import json
import pathlib
import subprocess
import time
from collections.abc import Callable
from typing import Any, TypeVar

import yaml

from services.kube import KubeApiServer

T = TypeVar("T")
REPO_KINDS = ("deployments", "jobs.batch", "services", "configmaps", "secrets")


def eventually(fn: Callable[[], T], timeout: float = 30.0, interval: float = 0.1) -> T:
    """Call ``fn`` until it stops raising; re-raise its last error after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(interval)


def until(fn: Callable[[], T | bool | None], timeout: float = 30.0) -> T:
    """``fn()`` once it returns something true (``eventually`` waits only for it to stop raising)."""

    def truthy() -> T:
        value = fn()
        assert value, "not yet"
        return value  # type: ignore[return-value]

    return eventually(truthy, timeout=timeout, interval=0.3)


def kubectl_ok(kube: KubeApiServer, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    proc = kube.kubectl(*args, input=input)
    if proc.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr}")
    return proc


def apply(kube: KubeApiServer, namespace: str, text: str, *extra: str) -> None:
    kubectl_ok(kube, "apply", "-n", namespace, "-f", "-", *extra, input=text)


def get(kube: KubeApiServer, namespace: str, kind: str, name: str) -> dict[str, Any]:
    return dict(kube.kubectl_json("get", "-n", namespace, kind, name))


def children_of(kube: KubeApiServer, namespace: str, job: str) -> dict[tuple[str, str], dict[str, Any]]:
    """Every Deployment/Job/Service/ConfigMap/Secret labelled with the job, by (kind, name)."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    listed = kube.kubectl_json("get", "-n", namespace, ",".join(REPO_KINDS), "-l", f"echorl.dev/job={job}")
    for item in listed["items"]:
        out[(item["kind"], item["metadata"]["name"])] = item
    return out


def secret_value(secret: dict[str, Any], key: str) -> str:
    return base64.b64decode(secret["data"][key]).decode()


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    for cond in obj.get("status", {}).get("conditions", []):
        if cond["type"] == type_:
            return dict(cond)
    raise AssertionError(f"no {type_} condition in {json.dumps(obj.get('status'))[:500]}")


def events(kube: KubeApiServer, namespace: str, name: str) -> list[dict[str, Any]]:
    listed = kube.kubectl_json(
        "get", "-n", namespace, "events", "--field-selector", f"involvedObject.name={name}"
    )
    return list(listed["items"])


def reasons(kube: KubeApiServer, namespace: str, name: str) -> set[str]:
    return {e["reason"] for e in events(kube, namespace, name)}


def service_account_kubeconfig(
    kube: KubeApiServer, namespace: str, account: str, path: pathlib.Path
) -> pathlib.Path:
    """A kubeconfig at ``path`` holding a real token of ``namespace/account`` (TokenRequest API)."""
    proc = kube.kubectl("create", "token", account, "-n", namespace, "--duration=2h")
    assert proc.returncode == 0, proc.stderr
    token = proc.stdout.strip()
    ca = base64.b64encode(kube.pki.ca_cert.read_bytes()).decode()
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": {"server": kube.url, "certificate-authority-data": ca}}],
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [{"name": "operator", "context": {"cluster": "test", "user": account}}],
        "current-context": "operator",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path
