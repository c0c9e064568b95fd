"""The Helm chart (``charts/echorl-operator``) with a real helm (built from the Go module proxy by
scripts/testbin.sh): it lints clean, renders with its default values exactly the objects of the
kustomize install (``manifests/``; Helm's own labels aside, and the Namespace, which ``helm install
--create-namespace`` makes), with ``watchNamespaces`` those of the namespaced install, its monitors
select what they should, and the real API server takes the install.
"""

from __future__ import annotations

import copy
import json
import os
import pathlib
import subprocess
from typing import Any

import pytest
import yaml

from echo_operator import names
from services.kube import KubeApiServer
from services.prometheus import DASHBOARD

pytestmark = pytest.mark.services

REPO = pathlib.Path(__file__).resolve().parents[3]
CHART = REPO / "charts" / "echorl-operator"
HELM_LABELS = ("helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance")


@pytest.fixture(scope="module")
def helm(testbin_dir: pathlib.Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    home = tmp_path_factory.mktemp("helm")
    env = {
        **os.environ,
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }

    def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [str(testbin_dir / "helm"), *args], capture_output=True, text=True, env=env, timeout=120
        )
        if check:
            assert proc.returncode == 0, proc.stdout + proc.stderr
        return proc

    return run


def docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def key(d: dict[str, Any]) -> tuple[str, str, str]:
    return (d["kind"], d["metadata"].get("namespace") or "", d["metadata"]["name"])


def without_helm(d: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(d)
    labels = out["metadata"].get("labels") or {}
    for label in HELM_LABELS:
        labels.pop(label, None)
    return out


def kustomized(kube: KubeApiServer, path: pathlib.Path) -> dict[tuple[str, str, str], dict[str, Any]]:
    proc = kube.kubectl("kustomize", str(path))
    assert proc.returncode == 0, proc.stderr
    return {key(d): d for d in docs(proc.stdout) if d["kind"] != "Namespace"}


def rendered(helm: Any, *values: str) -> dict[tuple[str, str, str], dict[str, Any]]:
    proc = helm("template", "echorl", str(CHART), "--namespace", "echorl-system", "--include-crds", *values)
    return {key(d): d for d in docs(proc.stdout)}


def test_the_chart_lints_clean(helm: Any) -> None:
    proc = helm("lint", "--strict", str(CHART))
    assert "0 chart(s) failed" in proc.stdout, proc.stdout


def test_default_values_render_the_kustomize_install(kube_apiserver: KubeApiServer, helm: Any) -> None:
    chart, kust = rendered(helm), kustomized(kube_apiserver, REPO / "manifests")
    assert sorted(chart) == sorted(kust)
    for k, obj in chart.items():
        labels = obj["metadata"].get("labels") or {}
        if obj["kind"] != "CustomResourceDefinition":  # Helm installs crds/ as they are
            assert labels.get("app.kubernetes.io/managed-by") == "Helm", k
        assert without_helm(obj) == kust[k], f"{k} differs from manifests/"


def test_watch_namespaces_render_the_namespaced_install(kube_apiserver: KubeApiServer, helm: Any) -> None:
    chart = rendered(helm, "--set", "watchNamespaces={echorl-jobs}")
    kust = kustomized(kube_apiserver, REPO / "manifests" / "namespaced")
    assert sorted(chart) == sorted(kust)
    for k, obj in chart.items():
        assert without_helm(obj) == kust[k], f"{k} differs from manifests/namespaced/"
    # Two namespaces: a RoleBinding in each, still nothing cluster-wide granted.
    two = rendered(helm, "--set", "watchNamespaces={team-a,team-b}")
    assert {k for k in two if k[0] == "RoleBinding" and k[2] == "echorl-operator"} == {
        ("RoleBinding", "team-a", "echorl-operator"),
        ("RoleBinding", "team-b", "echorl-operator"),
    }
    assert not [k for k in two if k[0] == "ClusterRoleBinding"]
    (dep,) = [d for k, d in two.items() if k[0] == "Deployment"]
    args = dep["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:2] == ["--namespace=team-a", "--namespace=team-b"] and "--all-namespaces" not in args


def test_values_reach_the_operator(helm: Any) -> None:
    chart = rendered(
        helm,
        "--set", "replicaCount=3", "--set", "image.tag=0.2.0", "--set", "leaderElection.leaseDuration=30",
        "--set", "metrics.port=9100", "--set", "podDisruptionBudget.enabled=false",
        "--set-json", 'extraEnv=[{"name": "ECHORL_METRICS_AUTH", "value": "true"}]',
        "--set-json", 'tolerations=[{"key": "dedicated", "operator": "Exists"}]',
    )  # fmt: skip
    (dep,) = [d for k, d in chart.items() if k[0] == "Deployment"]
    pod = dep["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert dep["spec"]["replicas"] == 3 and container["image"] == "ghcr.io/echorl/echorl-operator:0.2.0"
    assert env["ECHORL_LEASE_DURATION"] == "30" and env["ECHORL_METRICS_PORT"] == "9100"
    assert env["ECHORL_METRICS_AUTH"] == "true"
    assert {"name": "metrics", "containerPort": 9100} in container["ports"]
    assert pod["tolerations"] == [{"key": "dedicated", "operator": "Exists"}]
    assert not [k for k in chart if k[0] == "PodDisruptionBudget"]
    (svc,) = [d for k, d in chart.items() if k[0] == "Service"]
    assert svc["spec"]["ports"][0]["port"] == 9100


def test_the_monitors_select_the_operator_and_the_coordinators(helm: Any) -> None:
    chart = rendered(
        helm, "--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.podMonitor.enabled=true"
    )
    (sm,) = [d for k, d in chart.items() if k[0] == "ServiceMonitor"]
    (pm,) = [d for k, d in chart.items() if k[0] == "PodMonitor"]
    (svc,) = [d for k, d in chart.items() if k[0] == "Service"]
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["endpoints"][0]["port"] == svc["spec"]["ports"][0]["name"]
    # The labels the operator gives a coordinator's pods, and the port it serves /metrics on
    # (echo_operator/children/coordinator.py names it "http").
    assert pm["spec"]["selector"]["matchLabels"].items() <= names.labels("job", "coordinator").items()
    assert pm["spec"]["podMetricsEndpoints"][0]["port"] == "http"
    assert (
        pm["spec"]["podMetricsEndpoints"][0]["honorLabels"] is True
    )  # job="<EchoJob>" kept for the dashboard
    assert not [k for k in rendered(helm) if k[0] in ("ServiceMonitor", "PodMonitor")]


def test_the_dashboard_ships_as_a_configmap_for_grafanas_sidecar(helm: Any) -> None:
    chart = rendered(helm, "--set", "dashboards.enabled=true", "--set", "dashboards.namespace=monitoring")
    (cm,) = [
        d for k, d in chart.items() if k[0] == "ConfigMap" and d["metadata"]["name"] == "echorl-dashboards"
    ]
    assert (
        cm["metadata"]["namespace"] == "monitoring" and cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    )
    shipped = json.loads(cm["data"]["echorl-echojob.json"])
    assert shipped == json.loads(DASHBOARD.read_text())
    assert not [k for k in rendered(helm) if k[0] == "ConfigMap" and k[2] == "echorl-dashboards"]


def test_the_api_server_takes_the_install(
    kube_apiserver: KubeApiServer, echorl_system: None, helm: Any
) -> None:
    """A server-side dry run of everything the chart renders, beside the kustomize install the other
    tests use (the same names: a real ``helm install`` would refuse to adopt them)."""
    proc = helm("template", "echorl", str(CHART), "--namespace", "echorl-system")
    applied = kube_apiserver.kubectl(
        "apply", "--server-side", "--dry-run=server", "--force-conflicts", "-f", "-", input=proc.stdout
    )
    assert applied.returncode == 0, applied.stderr
    assert "deployment.apps/echorl-operator serverside-applied (server dry run)" in applied.stdout
