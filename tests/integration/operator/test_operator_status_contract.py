"""Status a user (or Argo CD, or Kueue) can build on, against a real kube-apiserver.

* ``status.observedGeneration`` names the generation whose children were applied: a spec the API
  server refuses to turn into children (a pool asking for more CPU than its limit) leaves it at the
  last good generation, with ``Degraded=True, ApplyFailed``; fixing the spec moves it on.
* A problem that persists is one Event whose ``count`` grows with every resync (as client-go's
  recorder does for the built-in controllers), not a new Event each time.
* Suspending and resuming a job gives a pool back the replicas someone set with ``kubectl scale``
  (the scale subresource, as an HPA uses it) while the pool's own ``replicas`` is unset.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from kopf.testing import KopfRunner
from operator_kit import apply, condition, events, eventually, get, kubectl_ok

from services.kube import KubeApiServer

pytestmark = [pytest.mark.services, pytest.mark.usefixtures("delete_jobs")]


def job_yaml(storage: str, cpu_pool: str = "{name: cpu}") -> str:
    return f"""
apiVersion: echorl.dev/v1alpha1
kind: EchoJob
metadata: {{name: honest}}
spec:
  model: {{path: echorl:tiny}}
  storage: {storage}
  inferenceSwarms:
  - {cpu_pool}
"""


def patch_job(kube: KubeApiServer, ns: str, patch: str) -> None:
    kubectl_ok(kube, "patch", "-n", ns, "echojob/honest", "--type=merge", "-p", patch)


def test_observed_generation_waits_for_a_generation_whose_children_were_applied(
    operator: KopfRunner,
    kube_apiserver: KubeApiServer,
    kube_namespace: str,
    storage_secret: str,
    storage_yaml: Callable[..., str],
    bucket: str,
) -> None:
    ns = kube_namespace
    apply(kube_apiserver, ns, job_yaml(storage_yaml(bucket)))

    def observed(generation: int) -> dict[str, Any]:
        job = get(kube_apiserver, ns, "echojob", "honest")
        assert job["metadata"]["generation"] == generation
        assert job["status"]["observedGeneration"] == generation
        return job

    eventually(lambda: observed(1))
    # Valid for the CRD, refused by the apiserver for the Deployment: requests above limits.
    bad = '{"spec": {"inferenceSwarms": [{"name": "cpu", "resources": {"requests": {"cpu": "4"}, "limits": {"cpu": "2"}}}]}}'
    patch_job(kube_apiserver, ns, bad)

    def refused() -> dict[str, Any]:
        job = get(kube_apiserver, ns, "echojob", "honest")
        degraded = condition(job, "Degraded")
        assert (degraded["status"], degraded["reason"]) == ("True", "ApplyFailed"), degraded
        return job

    job = eventually(refused)
    time.sleep(4)  # a resync (ECHORL_RESYNC_INTERVAL 3 s) and several status passes later
    job = refused()
    assert job["metadata"]["generation"] == 2
    assert job["status"]["observedGeneration"] == 1, "generation 2 was never applied"
    assert all(c.get("observedGeneration") == 1 for c in job["status"]["conditions"])
    assert "cpu" not in str(
        get(kube_apiserver, ns, "deployment", "honest-cpu")["spec"]["template"]["spec"]["containers"][0][
            "resources"
        ]
    )

    patch_job(kube_apiserver, ns, '{"spec": {"inferenceSwarms": [{"name": "cpu", "threads": 2}]}}')
    job = eventually(lambda: observed(3))
    assert condition(job, "Degraded")["status"] == "False"


def test_a_persistent_problem_is_one_event_whose_count_grows(
    operator: KopfRunner,
    kube_apiserver: KubeApiServer,
    kube_namespace: str,
    storage_secret: str,
    storage_yaml: Callable[..., str],
    bucket: str,
) -> None:
    ns = kube_namespace
    text = job_yaml(storage_yaml(bucket)).replace(
        "  inferenceSwarms:", "  syncPolicyRef: absent\n  inferenceSwarms:"
    )
    apply(kube_apiserver, ns, text)

    def missing() -> list[dict[str, Any]]:
        found = [e for e in events(kube_apiserver, ns, "honest") if e["reason"] == "ReferenceNotFound"]
        assert found
        return found

    def met_three_times() -> list[dict[str, Any]]:
        found = missing()
        assert len(found) == 1, [(e["metadata"]["name"], e.get("count")) for e in found]
        assert found[0]["count"] >= 3, found[0]
        return found

    # Two resyncs at least (ECHORL_RESYNC_INTERVAL 3 s), each meeting the problem again: waited for, not
    # timed, so that a slow machine only takes longer. A second Event never goes away: it fails.
    (event,) = eventually(met_three_times, timeout=60.0)
    assert event["type"] == "Warning"
    assert event["lastTimestamp"] > event["firstTimestamp"]


def test_resuming_gives_a_pool_back_the_replicas_it_was_scaled_to(
    operator: KopfRunner,
    kube_apiserver: KubeApiServer,
    kube_namespace: str,
    storage_secret: str,
    storage_yaml: Callable[..., str],
    bucket: str,
) -> None:
    ns = kube_namespace
    apply(kube_apiserver, ns, job_yaml(storage_yaml(bucket)))

    def replicas(wanted: int) -> None:
        assert get(kube_apiserver, ns, "deployment", "honest-cpu")["spec"]["replicas"] == wanted

    eventually(lambda: replicas(1))  # replicas unset in the spec: the Deployment's default
    kubectl_ok(kube_apiserver, "scale", "-n", ns, "deployment/honest-cpu", "--replicas=3")
    time.sleep(3.5)  # a resync: the operator leaves a scale it does not own alone
    replicas(3)

    patch_job(kube_apiserver, ns, '{"spec": {"suspend": true}}')
    eventually(lambda: replicas(0))
    time.sleep(3.5)  # resyncs while suspended keep it at zero
    replicas(0)
    patch_job(kube_apiserver, ns, '{"spec": {"suspend": false}}')
    eventually(lambda: replicas(3))

    def resumed() -> None:  # status is written once the children are applied, a moment after them
        assert condition(get(kube_apiserver, ns, "echojob", "honest"), "Suspended")["status"] == "False"

    eventually(resumed)

    # Afterwards the scale is the user's (or the HPA's) again: the operator does not fight it.
    kubectl_ok(kube_apiserver, "scale", "-n", ns, "deployment/honest-cpu", "--replicas=5")
    time.sleep(3.5)
    replicas(5)
