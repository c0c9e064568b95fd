"""Kueue's waitForPodsReady with the operator: a real Kueue manager (its webhooks registered) whose
timeout is short, so a test sees it pass.

An admitted EchoJob whose pods never get ready is evicted by Kueue (``PodsReadyTimeout``), scaled to
zero, given back to the queue and, after Kueue's backoff, admitted again; one whose pods get ready in
time is told ``PodsReady`` and keeps running past the timeout. envtest runs no pods (no scheduler, no
kubelet, no controllers): the ready job's Deployments' and trainer Job's status is written by the test
as their controllers would; the real node runs the same flow with real pods
(tests/e2e/test_e2e_kueue.py, with Kueue's timeout longer than a job takes to start there).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest
from kopf.testing import KopfRunner
from operator_kit import apply, kubectl_ok, reasons, until
from test_operator_kueue import RUNNING, STOPPED, job, shape, suspended, wl_condition, workload

from services.kube import KubeApiServer
from services.kueue import INSTANCE_LABEL, Kueue, WaitForPodsReady, queues

pytestmark = [pytest.mark.services, pytest.mark.usefixtures("delete_jobs")]

TIMEOUT_S = 30
BACKOFF_S = 15
KUEUE_PODS_READY = WaitForPodsReady(timeout_s=TIMEOUT_S, backoff_base_s=BACKOFF_S, backoff_max_s=60)
"""This module's Kueue (the ``kueue`` fixture reads it): evicted 30 s after admission unless ready,
requeued 15 s later (Kueue's default backoff is 60 s, doubling). The backoff is the window in which the
test sees the job stopped: at 1 s, a loaded machine re-admitted it before the test looked (seen in CI)."""


def seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def pods(kube: KubeApiServer, ns: str, name: str) -> list[Any]:
    return list(kube.kubectl_json("get", "pods", "-n", ns, "-l", f"echorl.dev/job={name}")["items"])


def test_kueues_own_webhooks_are_registered_and_answer(
    kueue: Kueue, kube_apiserver: KubeApiServer, kube_namespace: str
) -> None:
    """Only this manager's webhook configurations are registered (an earlier module's Kueue removed
    its own), they call it on loopback, and the API server asks them: Kueue's defaulting puts its
    finalizer on a new ClusterQueue, and its validation refuses a Workload that asks for ``pods``."""
    kube = kube_apiserver
    found = kube.kubectl_json(
        "get", "mutatingwebhookconfigurations,validatingwebhookconfigurations", "-l", INSTANCE_LABEL
    )["items"]
    assert {c["metadata"]["name"] for c in found} == {
        f"{kueue.instance}-mutating",
        f"{kueue.instance}-validating",
    }
    hooks = {h["name"]: h for c in found for h in c["webhooks"]}
    assert {"mworkload.kb.io", "vworkload.kb.io", "mjob.kb.io", "vjob.kb.io"} <= hooks.keys()
    assert all(h["clientConfig"]["url"].startswith("https://127.0.0.1:") for h in hooks.values())
    assert all(h["failurePolicy"] == "Fail" for h in hooks.values())
    # The kustomization's scoping came along: Kueue's pod webhook leaves kube-system alone.
    assert "kube-system" in json.dumps(hooks["mpod.kb.io"]["namespaceSelector"])

    cq = kube.kubectl(
        "create", "--dry-run=server", "-o", "json", "-f", "-",
        input=json.dumps({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
                          "metadata": {"name": f"{kube_namespace}-probe"}, "spec": {}}),
    )  # fmt: skip
    assert cq.returncode == 0, cq.stderr
    assert "kueue.x-k8s.io/resource-in-use" in json.loads(cq.stdout)["metadata"]["finalizers"]
    container = {"name": "c", "image": "x", "resources": {"requests": {"pods": "1"}}}
    wl = {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": "asks-for-pods", "namespace": kube_namespace},
        "spec": {
            "podSets": [{"name": "main", "count": 1, "template": {"spec": {"containers": [container]}}}]
        },
    }
    refused = kube.kubectl("create", "--dry-run=server", "-f", "-", input=json.dumps(wl))
    assert refused.returncode != 0
    assert 'admission webhook "vworkload.kb.io" denied the request' in refused.stderr, refused.stderr


def admitted_and_starting(kube: KubeApiServer, ns: str, name: str, storage: str) -> float:
    """Queue EchoJob ``name`` on a roomy ClusterQueue, see Kueue admit it and the operator run it and tell
    Kueue its pods are not ready yet (PodsReady False, WaitForStart); the time of the admission."""
    apply(kube, ns, queues(ns, ns, cpu="4", memory="64Gi"), "--server-side")
    apply(kube, ns, job(name, storage, f"{ns}-low"))
    until(lambda: shape(kube, ns, name) == RUNNING or None, timeout=60)
    admitted_at = seconds(wl_condition(workload(kube, ns, name), "Admitted")["lastTransitionTime"])
    waiting = until(lambda: wl_condition(workload(kube, ns, name), "PodsReady") or None)
    assert (waiting["status"], waiting["reason"]) == ("False", "WaitForStart")
    return admitted_at


def test_an_admitted_job_whose_pods_never_get_ready_is_evicted_and_requeued(
    kueue: Kueue,
    operator: KopfRunner,
    kube_apiserver: KubeApiServer,
    kube_namespace: str,
    storage_secret: str,
    storage_yaml: Callable[..., str],
    bucket: str,
) -> None:
    kube, ns = kube_apiserver, kube_namespace
    admitted_at = admitted_and_starting(kube, ns, "stuck", storage_yaml(bucket))

    # 1. Evicted by Kueue once the timeout passed, and counted for the backoff.
    def evicted() -> dict[str, Any] | None:
        wl = workload(kube, ns, "stuck")
        return wl if wl_condition(wl, "Evicted").get("status") == "True" else None

    wl = until(evicted, timeout=TIMEOUT_S + 60)
    ev = wl_condition(wl, "Evicted")
    assert ev["reason"] == "PodsReadyTimeout", ev
    assert seconds(ev["lastTransitionTime"]) >= admitted_at + TIMEOUT_S - 1  # not before the timeout
    assert wl["status"]["requeueState"]["count"] == 1

    # 2. The job stops and says why; with no pod of it left, the quota goes back as Kueue's own job
    #    reconciler gives it back after this eviction (Requeued False until Kueue's backoff ends).
    cond = until(lambda: ((c := suspended(kube, ns, "stuck"))["reason"] == "PodsReadyTimeout" and c) or None)
    assert cond["status"] == "True" and "Exceeded the PodsReady timeout" in cond["message"]
    until(lambda: shape(kube, ns, "stuck") == STOPPED or None, timeout=30)
    assert pods(kube, ns, "stuck") == []
    until(lambda: "QuotaReleased" in reasons(kube, ns, "stuck") or None, timeout=30)

    # 3. Requeued by Kueue after its backoff, and admitted again: the job runs again.
    seen: list[Any] = []

    def readmitted() -> dict[str, Any] | None:
        wl = workload(kube, ns, "stuck")
        seen.append(wl.get("status"))
        again = (
            wl_condition(wl, "Admitted").get("status") == "True"
            and wl_condition(wl, "Evicted").get("status") != "True"
            and seconds(wl_condition(wl, "Admitted")["lastTransitionTime"]) > admitted_at
        )
        return wl if again else None

    try:
        wl = until(readmitted, timeout=BACKOFF_S + 60)
    except AssertionError:
        raise AssertionError(f"not admitted again; last seen {seen[-1]}") from None
    requeued = wl_condition(wl, "Requeued")
    assert (requeued["status"], requeued["reason"]) == ("True", "BackoffFinished"), requeued
    assert wl["status"]["requeueState"]["count"] == 1
    until(lambda: suspended(kube, ns, "stuck")["status"] == "False" or None, timeout=60)
    # envtest has no garbage collector: the deleted trainer Job stays Terminating (as in
    # test_operator_kueue.py); the Deployments come back.
    until(lambda: {k: v for k, v in shape(kube, ns, "stuck").items() if k != "trainer-job"}
               == {"coordinator": 1, "cpu": 1} or None, timeout=60)  # fmt: skip


def test_a_job_whose_pods_get_ready_in_time_is_told_ready_and_keeps_running(
    kueue: Kueue,
    operator: KopfRunner,
    kube_apiserver: KubeApiServer,
    kube_namespace: str,
    storage_secret: str,
    storage_yaml: Callable[..., str],
    bucket: str,
) -> None:
    """The Workload's PodsReady: False (WaitForStart) while the admitted job's pods start, True once the
    coordinator, the pool and the trainer rank are ready; then Kueue's timeout passes and the job is
    still admitted and running. The test writes the Deployments' and the Job's status as their
    controllers would (no kubelet here)."""
    kube, ns = kube_apiserver, kube_namespace
    admitted_at = admitted_and_starting(kube, ns, "prompt", storage_yaml(bucket))

    ready = json.dumps(
        {"status": {"replicas": 1, "readyReplicas": 1, "availableReplicas": 1, "updatedReplicas": 1}}
    )
    for name in ("prompt-coordinator", "prompt-cpu"):
        kubectl_ok(
            kube, "patch", "deployment", name, "-n", ns, "--subresource=status", "--type=merge", "-p", ready
        )
        time.sleep(1.5)  # three status passes: not ready while the trainer is not
        assert wl_condition(workload(kube, ns, "prompt"), "PodsReady")["status"] == "False"
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    started = json.dumps({"status": {"startTime": now, "active": 1, "ready": 1}})
    kubectl_ok(
        kube,
        "patch",
        "job",
        "prompt-trainer",
        "-n",
        ns,
        "--subresource=status",
        "--type=merge",
        "-p",
        started,
    )
    cond = until(
        lambda: (c := wl_condition(workload(kube, ns, "prompt"), "PodsReady"))["status"] == "True" and c
    )
    assert cond["reason"] == "PodsReady"
    assert seconds(cond["lastTransitionTime"]) < admitted_at + TIMEOUT_S  # else this test proves nothing

    # Past Kueue's timeout (and a margin for its clock and queue): still admitted, never evicted.
    time.sleep(max(0.0, admitted_at + TIMEOUT_S + 10 - time.time()))
    wl = workload(kube, ns, "prompt")
    assert wl_condition(wl, "Admitted")["status"] == "True"
    assert wl_condition(wl, "Evicted").get("status") != "True", wl_condition(wl, "Evicted")
    assert wl_condition(wl, "PodsReady")["status"] == "True"
    assert "requeueState" not in wl["status"]
    assert suspended(kube, ns, "prompt")["status"] == "False"
    assert shape(kube, ns, "prompt") == RUNNING
