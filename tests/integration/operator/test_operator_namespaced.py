"""The namespaced install (manifests/namespaced/) against the real API server.

Its RoleBinding (watched.yaml) is applied for a second service account in the test's namespace, so
the cluster-wide install the other tests use stays as it is. That account may do the operator's work
in the watched namespace and nothing anywhere else (no Secret outside it, no namespaces, no CRDs);
kopf runs as it with ``--namespace`` and reconciles a job there, while a job in another namespace is
never touched.
"""

from __future__ import annotations

import contextlib
import pathlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml
from kopf.testing import KopfRunner
from operator_kit import (
    apply,
    children_of,
    condition,
    eventually,
    get,
    kubectl_ok,
    service_account_kubeconfig,
)

from services.kube import KubeApiServer

pytestmark = [pytest.mark.services, pytest.mark.usefixtures("delete_jobs")]

REPO = pathlib.Path(__file__).resolve().parents[3]
NAMESPACED = REPO / "manifests" / "namespaced"
ACCOUNT = "echorl-operator-scoped"


def built(kube: KubeApiServer, path: pathlib.Path) -> list[dict[str, Any]]:
    proc = kube.kubectl("kustomize", str(path))
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def test_the_namespaced_install_grants_nothing_cluster_wide(kube_apiserver: KubeApiServer) -> None:
    docs = built(kube_apiserver, NAMESPACED)
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert not [k for k in kinds if k[0] == "ClusterRoleBinding"], sorted(kinds)
    assert ("ClusterRole", "echorl-operator-discovery") not in kinds
    # One RoleBinding per watched namespace, and one in echorl-system for the leader election's Lease.
    (lease,) = [
        d for d in docs if d["kind"] == "RoleBinding" and d["metadata"]["namespace"] == "echorl-system"
    ]
    assert lease["roleRef"]["kind"] == "Role" and lease["roleRef"]["name"] == "echorl-leader-election"
    (binding,) = [d for d in docs if d["kind"] == "RoleBinding" and d is not lease]
    assert binding["metadata"]["namespace"] == "echorl-jobs"
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": "echorl-operator",
    }
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=echorl-jobs" in args and "--all-namespaces" not in args
    # The same operator, CRDs and aggregated roles as the cluster-wide install.
    cluster_wide = {(d["kind"], d["metadata"]["name"]) for d in built(kube_apiserver, REPO / "manifests")}
    assert cluster_wide - kinds == {
        ("ClusterRole", "echorl-operator-discovery"),
        ("ClusterRoleBinding", "echorl-operator"),
        ("ClusterRoleBinding", "echorl-operator-discovery"),
    }
    assert kinds - cluster_wide == {("Namespace", "echorl-jobs"), ("RoleBinding", "echorl-operator")}


@pytest.fixture
def other_namespace(kube_apiserver: KubeApiServer, kube_namespace: str) -> Iterator[str]:
    name = (kube_namespace[:55] + "-other").strip("-")
    kubectl_ok(kube_apiserver, "create", "namespace", name)
    yield name
    kube_apiserver.kubectl("delete", "echojobs", "--all", "-n", name, "--wait=false")
    kube_apiserver.kubectl("delete", "namespace", name, "--wait=false")


@pytest.fixture
def scoped_kubeconfig(
    kube_apiserver: KubeApiServer, echorl_system: None, kube_namespace: str, tmp_path: pathlib.Path
) -> Iterator[pathlib.Path]:
    """A service account bound to the operator's rules by watched.yaml's RoleBinding, in the test's namespace."""
    (binding,) = [
        d
        for d in built(kube_apiserver, NAMESPACED)
        if d["kind"] == "RoleBinding" and d["roleRef"]["name"] == "echorl-operator"
    ]
    binding["metadata"]["namespace"] = kube_namespace
    binding["subjects"] = [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": "echorl-system"}]
    kubectl_ok(kube_apiserver, "create", "serviceaccount", ACCOUNT, "-n", "echorl-system")
    try:
        apply(kube_apiserver, kube_namespace, yaml.safe_dump(binding))
        yield service_account_kubeconfig(
            kube_apiserver, "echorl-system", ACCOUNT, tmp_path / "scoped.kubeconfig"
        )
    finally:
        kube_apiserver.kubectl("delete", "serviceaccount", ACCOUNT, "-n", "echorl-system")


def test_the_scoped_account_may_act_only_in_its_namespace(
    kube_apiserver: KubeApiServer, scoped_kubeconfig: pathlib.Path, kube_namespace: str, other_namespace: str
) -> None:
    def can(verb: str, resource: str, *where: str) -> bool:
        proc = kube_apiserver.kubectl("auth", "can-i", verb, resource, *where, kubeconfig=scoped_kubeconfig)
        return proc.stdout.strip() == "yes"

    inside = ["-n", kube_namespace]
    for verb, resource in [
        ("get", "secrets"),
        ("create", "secrets"),
        ("patch", "deployments.apps"),
        ("create", "jobs.batch"),
        ("watch", "echojobs.echorl.dev"),
        ("patch", "echojobs.echorl.dev/status"),
    ]:
        assert can(verb, resource, *inside), (verb, resource)
    for where in (["-n", other_namespace], ["-n", "kube-system"], ["-n", "echorl-system"], ["-A"]):
        for verb, resource in [("get", "secrets"), ("list", "secrets"), ("create", "deployments.apps")]:
            assert not can(verb, resource, *where), (verb, resource, where)
    assert not can("list", "namespaces")
    assert not can("list", "customresourcedefinitions.apiextensions.k8s.io")
    assert not can("create", "clusterrolebindings.rbac.authorization.k8s.io")
    proc = kube_apiserver.kubectl("get", "secrets", "-n", "kube-system", kubeconfig=scoped_kubeconfig)
    assert proc.returncode != 0 and "forbidden" in proc.stderr


def job(name: str, storage: str) -> str:
    return f"""
apiVersion: echorl.dev/v1alpha1
kind: EchoJob
metadata: {{name: {name}}}
spec:
  model: {{path: echorl:tiny}}
  storage: {storage}
"""


def test_a_namespaced_operator_runs_jobs_in_its_namespace_only(
    start_operator: Callable[..., contextlib.AbstractContextManager[KopfRunner]],
    kube_apiserver: KubeApiServer,
    scoped_kubeconfig: pathlib.Path,
    kube_namespace: str,
    other_namespace: str,
    storage_secret: str,
    storage_yaml: Callable[..., str],
    bucket: str,
) -> None:
    ns = kube_namespace
    with start_operator(namespaces=[ns], kubeconfig=scoped_kubeconfig) as runner:
        apply(kube_apiserver, other_namespace, job("elsewhere", storage_yaml(bucket, prefix="other")))
        apply(kube_apiserver, ns, job("watched", storage_yaml(bucket)))

        def reconciled() -> None:
            found = children_of(kube_apiserver, ns, "watched")
            assert {("Deployment", "watched-coordinator"), ("Deployment", "watched-default")} <= set(found)
            status = get(kube_apiserver, ns, "echojob", "watched")
            assert condition(status, "Degraded")["status"] == "False"

        eventually(reconciled, timeout=60)
        time.sleep(
            4
        )  # longer than a resync pass (ECHORL_RESYNC_INTERVAL 3 s): the other job stays as applied
        other = get(kube_apiserver, other_namespace, "echojob", "elsewhere")
        assert "status" not in other and not other["metadata"].get("finalizers"), other
        assert children_of(kube_apiserver, other_namespace, "elsewhere") == {}
    # It found it may not list namespaces or CRDs, so kopf never tried (a 403 retried for ever otherwise).
    assert "watching only the given namespaces" in runner.output
    refused = [line for line in runner.output.splitlines() if "403" in line or "orbidden" in line]
    assert refused == [], refused[:5]
