"""Kueue on the real node: a queued EchoJob is admitted, preempted (every pod gone, quota released) and
resumed from its checkpoint, and another waits behind the full quota, driven with kubectl as a
cluster admin would.

Kueue's manager runs in the cluster (``cluster_kueue``). The ClusterQueue has 600m CPU; each job asks
for 450m (coordinator 250m, one worker and the trainer 100m each), so one job runs at a time.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from e2e_kit import E2E, published
from test_e2e_echojob import echojob

from services.kueue import Kueue
from services.kueue import queues as kueue_queues

LOW_STEPS = 150
"""Long enough that the preempted job is still training when it is preempted (the tiny model publishes
about a version a second on this node, and preemption takes a few status passes)."""


@pytest.fixture
def queues(e2e: E2E, cluster_kueue: Kueue) -> Iterator[str]:
    """A flavor, a ClusterQueue for the test's namespace, its LocalQueue ``team``, two priorities."""
    ns = e2e.namespace
    e2e.apply(kueue_queues(ns, ns, cpu="600m", memory="8Gi"))
    yield ns
    # The namespace (and its Workloads) goes with the e2e fixture; the cluster-scoped objects go here.
    e2e.kubectl("delete", "echojobs", "--all", "--wait=true", "--timeout=180s", check=False)
    for kind, name in (
        ("clusterqueue", ns),
        ("resourceflavor", ns),
        ("workloadpriorityclass", f"{ns}-low"),
        ("workloadpriorityclass", f"{ns}-high"),
    ):
        e2e.kubectl("delete", kind, name, "--wait=false", check=False, namespaced=False)


def queued(name: str, max_steps: int, queue: str, priority: str) -> dict[str, Any]:
    job = echojob(name, max_steps=max_steps)
    job["metadata"]["labels"] = {
        "kueue.x-k8s.io/queue-name": queue,
        "kueue.x-k8s.io/priority-class": priority,
    }
    return job


def workload(e2e: E2E, job: str) -> dict[str, Any]:
    return dict(e2e.json("get", "workloads.kueue.x-k8s.io", f"echojob-{job}"))


def wl_condition(wl: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in wl.get("status", {}).get("conditions", []) if c["type"] == kind), {})


def cpu_used(e2e: E2E, queue: str) -> str:
    usage = e2e.json("get", "clusterqueue", queue).get("status", {}).get("flavorsUsage") or [{}]
    return next((r["total"] for r in usage[0].get("resources", []) if r["name"] == "cpu"), "0")


def test_kueue_preempts_a_running_job_which_then_resumes_from_its_checkpoint(e2e: E2E, queues: str) -> None:
    low, high = f"{queues}-low", f"{queues}-high"
    e2e.apply(queued("kq-low", LOW_STEPS, "team", low))
    e2e.until("Kueue admits the job and its version advances", lambda: e2e.version("kq-low") >= 7)
    assert wl_condition(workload(e2e, "kq-low"), "Admitted")["status"] == "True"
    assert cpu_used(e2e, queues) == "450m"
    # waitForPodsReady is on: the operator tells Kueue the job's pods are ready, or Kueue would evict it.
    ready = e2e.until(
        "kq-low's Workload PodsReady",
        lambda: (c := wl_condition(workload(e2e, "kq-low"), "PodsReady")).get("status") == "True" and c,
        timeout=120,
    )
    assert wl_condition(workload(e2e, "kq-low"), "Evicted").get("status") != "True"
    e2e.note(
        f"kq-low admitted, at version {e2e.version('kq-low')}; PodsReady ({ready['reason']}); cpu used 450m"
    )

    # A higher-priority job: Kueue preempts the running one, whose pods all go before the quota does.
    e2e.apply(queued("kq-high", 12, "team", high))
    preempted = e2e.until(
        "kq-low preempted",
        lambda: (c := e2e.condition("kq-low", "Suspended")).get("reason") == "Preempted" and c,
        timeout=120,
    )
    assert preempted["status"] == "True" and "echojob-kq-low" in preempted["message"]
    e2e.until("every pod of kq-low gone", lambda: not e2e.pods("echorl.dev/job=kq-low") and True)
    at = max(published(e2e.store("kq-low/"), "kq-low"))
    checkpoint = max(published(e2e.store("kq-low/"), "kq-low", "checkpoints"))
    wl = e2e.until(
        "kq-low's quota given back",
        lambda: (w := workload(e2e, "kq-low")) and "admission" not in w.get("status", {}) and w,
        timeout=120,
    )
    assert wl_condition(wl, "Requeued")["status"] == "True"
    assert wl_condition(wl, "Evicted")["reason"] == "Preempted"
    e2e.note(f"kq-low preempted at version {at} (checkpoint {checkpoint}); its pods gone, quota released")
    assert e2e.health("kq-low")[0] == "Suspended", e2e.health("kq-low")

    # Queued behind the full quota: a new job waits, says why in Kueue's words, and runs no pod. (It
    # goes again at once; deleted, its Workload goes with it and holds nothing.)
    e2e.apply(queued("kq-wait", 1000, "team", low))
    waiting = e2e.until(
        "kq-wait queued behind the full quota",
        lambda: "insufficient" in (c := e2e.condition("kq-wait", "Suspended")).get("message", "") and c,
        timeout=120,
    )
    assert waiting["reason"] == "Queued" and not e2e.pods("echorl.dev/job=kq-wait")
    e2e.note(f"kq-wait queued: {waiting['message'][:200]}")
    e2e.kubectl("delete", "echojob", "kq-wait", "--wait=true", "--timeout=120s")

    # The high-priority job runs on that quota to Succeeded; its Workload is Finished, quota freed.
    e2e.wait_condition("kq-high", "Succeeded")
    e2e.until("kq-high's Workload Finished", lambda: wl_condition(workload(e2e, "kq-high"), "Finished"))
    e2e.note("kq-high Succeeded; its Workload is Finished")

    # Re-admitted, the preempted job resumes from the store: no version repeated or skipped.
    e2e.until(
        "kq-low re-admitted and training past its preemption",
        lambda: max(published(e2e.store("kq-low/"), "kq-low")) > at + 2,
    )
    logs = e2e.kubectl("logs", "job/kq-low-trainer")
    resumed = re.search(r"resuming at version (\d+)", logs)
    assert resumed, logs[:2000]
    assert checkpoint <= int(resumed.group(1)) <= max(published(e2e.store("kq-low/"), "kq-low"))
    e2e.note(f"kq-low re-admitted: {resumed.group(0)}")
    e2e.wait_condition("kq-low", "Succeeded")
    versions = published(e2e.store("kq-low/"), "kq-low")
    assert sorted(versions) == list(range(1, LOW_STEPS + 1))
    assert wl_condition(workload(e2e, "kq-low"), "Finished")["reason"] == "Succeeded"
    e2e.until("the ClusterQueue empty again", lambda: cpu_used(e2e, queues) in ("0", "0m") or None)
