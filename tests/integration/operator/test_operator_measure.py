"""How fast the operator is against the real API server: apply → children, and one reconcile pass.

Printed (run with ``-s`` to see them) and recorded as test properties:

* ``apply_to_children_3_pools_s``: from ``kubectl apply`` of a job with 3 pools until every child
  (ConfigMap, Secrets, Services, Deployments, the trainer Job) exists, median of 3 jobs;
* ``apply_to_children_20_pools_s``: the same for one job with 20 pools;
* ``reconcile_20_pools_s``: one full reconcile pass of the 20-pool job (resolve, storage, tokens,
  server-side apply of every child, prune, status), median of 5, measured on a second
  :class:`~echo_operator.reconcile.Reconciler` running as the operator's service account.
"""

from __future__ import annotations

import pathlib
import statistics
import time
from collections.abc import Callable

import pytest
from kubernetes import config as k8s_config
from operator_kit import apply, children_of, get

from echo_operator import config, kube, reconcile
from services.kube import KubeApiServer

pytestmark = pytest.mark.services


def job_yaml(name: str, pools: int, storage: str) -> str:
    lines = [
        "apiVersion: echorl.dev/v1alpha1",
        "kind: EchoJob",
        f"metadata: {{name: {name}}}",
        "spec:",
        "  model: {path: echorl:tiny}",
        f"  storage: {storage}",
        "  inferenceSwarms:",
    ]
    for i in range(pools):
        backend = "vllm" if i % 3 == 0 else "transformers"
        lines.append(f"  - {{name: pool{i}, backend: {backend}, replicas: 2, nodeSelector: {{pool: p{i}}}}}")
    return "\n".join(lines) + "\n"


def time_to_children(kube_api: KubeApiServer, ns: str, name: str, pools: int, storage: str) -> float:
    want = {("Deployment", f"{name}-pool{i}") for i in range(pools)} | {
        ("Deployment", f"{name}-coordinator"),
        ("Job", f"{name}-trainer"),
        ("ConfigMap", f"{name}-config"),
        ("Secret", f"{name}-tokens"),
        ("Service", f"{name}-coordinator"),
        ("Service", f"{name}-trainer"),
        *{("Secret", f"{name}-pool{i}-join") for i in range(pools)},
    }
    start = time.monotonic()
    apply(kube_api, ns, job_yaml(name, pools, storage))
    deadline = start + 60
    while True:
        if want <= set(children_of(kube_api, ns, name)):
            return time.monotonic() - start
        assert time.monotonic() < deadline, f"children of {name} not created within 60 s"
        time.sleep(0.02)


def test_apply_to_children_and_reconcile_time(
    start_operator: Callable[..., object],
    kube_apiserver: KubeApiServer,
    kube_namespace: str,
    storage_secret: str,
    storage_yaml: Callable[..., str],
    operator_kubeconfig: pathlib.Path,
    record_property: Callable[[str, object], None],
) -> None:
    ns = kube_namespace
    storage = storage_yaml(ns[:40].rstrip("-") + "-bench")
    with start_operator(ECHORL_STATUS_INTERVAL="2"):
        time.sleep(1.0)  # let kopf finish its initial listing
        three = [time_to_children(kube_apiserver, ns, f"three{i}", 3, storage) for i in range(3)]
        twenty = time_to_children(kube_apiserver, ns, "twenty", 20, storage)

    api = kube.Kube(k8s_config.new_client_from_config(config_file=str(operator_kubeconfig)))
    reconciler = reconcile.Reconciler(api, config.Settings(coordinator_url="http://127.0.0.1:9/{job}"))
    body = get(kube_apiserver, ns, "echojob", "twenty")
    passes = []
    for _ in range(5):
        start = time.monotonic()
        assert reconciler.reconcile(body) is not None
        passes.append(time.monotonic() - start)
    api.close()
    kube_apiserver.kubectl("delete", "echojobs", "--all", "-n", ns, "--wait=false")

    results = {
        "apply_to_children_3_pools_s": round(statistics.median(three), 3),
        "apply_to_children_20_pools_s": round(twenty, 3),
        "reconcile_20_pools_s": round(statistics.median(passes), 3),
    }
    for key, value in results.items():
        record_property(key, value)
    print(f"\noperator timings (real kube-apiserver, operator as its service account): {results}")
    print(
        f"  3 pools, each of 3 jobs: {[round(t, 3) for t in three]}; 20-pool reconcile passes: "
        f"{[round(t, 3) for t in passes]}"
    )
    assert results["apply_to_children_3_pools_s"] < 15
    assert results["reconcile_20_pools_s"] < 30
