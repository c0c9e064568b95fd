"""Kueue admits, queues, preempts and resumes EchoJobs: the operator and a real Kueue manager together.

A real kube-apiserver (no pods run: envtest), the operator as its service account, and Kueue's manager
built from ``sigs.k8s.io/kueue``, with its own webhooks registered (every Workload the operator writes
passes Kueue's admission) and ``waitForPodsReady`` on, with a timeout none of these tests reaches
(test_operator_kueue_pods_ready.py: the timeout passing, and not passing). The quota is CPU: every
job asks for 1250m (coordinator 250m, one worker 500m, the trainer 500m) and the ClusterQueue has 2
CPUs, so exactly one job runs at a time.
The same flow with real pods — every pod gone before the quota is given back, the preempted job
resuming from its checkpoint — runs on the real node (tests/e2e/test_e2e_kueue.py).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from kopf.testing import KopfRunner
from operator_kit import apply, condition, get, kubectl_ok, reasons, until

from services.kube import KubeApiServer
from services.kueue import Kueue, queues

pytestmark = [pytest.mark.services, pytest.mark.usefixtures("delete_jobs")]


def job(name: str, storage: str, priority: str, queue: str = "team", suspend: bool = False) -> str:
    return f"""
apiVersion: echorl.dev/v1alpha1
kind: EchoJob
metadata:
  name: {name}
  labels: {{kueue.x-k8s.io/queue-name: {queue}, kueue.x-k8s.io/priority-class: {priority}}}
spec:
  suspend: {str(suspend).lower()}
  model: {{path: echorl:tiny}}
  storage: {storage}
  trainingSwarm: {{resources: {{requests: {{cpu: 500m, memory: 256Mi}}}}}}
  inferenceSwarms:
  - {{name: cpu, replicas: 1, resources: {{requests: {{cpu: 500m, memory: 256Mi}}}}}}
"""


def workload(kube: KubeApiServer, ns: str, name: str) -> dict[str, Any]:
    return get(kube, ns, "workloads.kueue.x-k8s.io", f"echojob-{name}")


def wl_condition(wl: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in wl.get("status", {}).get("conditions", []) if c["type"] == kind), {})


def replicas(kube: KubeApiServer, ns: str, name: str) -> dict[str, int]:
    """The job's Deployments → spec.replicas, and whether its trainer Job exists (1) or not (0)."""
    out = {
        d["metadata"]["name"]: d["spec"].get("replicas", 1)
        for d in kube.kubectl_json("get", "deployments", "-n", ns, "-l", f"echorl.dev/job={name}")["items"]
    }
    jobs = kube.kubectl_json("get", "jobs", "-n", ns, "-l", f"echorl.dev/job={name}")["items"]
    out["trainer-job"] = sum(not j["metadata"].get("deletionTimestamp") for j in jobs)
    return out


RUNNING = {"coordinator": 1, "cpu": 1, "trainer-job": 1}
STOPPED = {"coordinator": 0, "cpu": 0, "trainer-job": 0}


def shape(kube: KubeApiServer, ns: str, name: str) -> dict[str, int]:
    found = replicas(kube, ns, name)
    return {
        "coordinator": found.get(f"{name}-coordinator", -1),
        "cpu": found.get(f"{name}-cpu", -1),
        "trainer-job": found["trainer-job"],
    }


def suspended(kube: KubeApiServer, ns: str, name: str) -> dict[str, Any]:
    return condition(get(kube, ns, "echojob", name), "Suspended")


def test_kueue_admits_queues_preempts_and_resumes_echojobs(
    kueue: Kueue,
    operator: KopfRunner,
    kube_apiserver: KubeApiServer,
    kube_namespace: str,
    storage_secret: str,
    storage_yaml: Callable[..., str],
    bucket: str,
) -> None:
    kube, ns = kube_apiserver, kube_namespace
    apply(kube, ns, queues(ns, ns, cpu="2", memory="64Gi"), "--server-side")
    storage = storage_yaml(bucket)

    # 1. Admitted: the job's Workload charges its pods to the queue and, once Kueue admits it, it runs.
    apply(kube, ns, job("low-a", storage, f"{ns}-low"))
    until(lambda: shape(kube, ns, "low-a") == RUNNING or None, timeout=60)
    wl = workload(kube, ns, "low-a")
    assert wl_condition(wl, "Admitted")["status"] == "True"
    assert wl["spec"]["queueName"] == "team" and wl["spec"]["priority"] == 100
    counts = {p["name"]: p["count"] for p in wl["spec"]["podSets"]}
    assert counts == {"coordinator": 1, "trainer": 1, "cpu": 1}

    def cpu_used() -> str:
        usage = kube.kubectl_json("get", "clusterqueue", ns)["status"]["flavorsUsage"][0]["resources"]
        return str({r["name"]: r["total"] for r in usage}["cpu"])

    # The ClusterQueue's status follows the admission a moment later (seen as "0" on a loaded machine).
    until(lambda: cpu_used() != "0" or None)
    assert cpu_used() == "1250m"
    assert suspended(kube, ns, "low-a")["status"] == "False"

    # 2. Preempted by a higher priority: scaled to zero, the quota given back, queued again.
    apply(kube, ns, job("high-c", storage, f"{ns}-high"))
    until(lambda: shape(kube, ns, "high-c") == RUNNING or None, timeout=60)

    def preempted() -> dict[str, Any] | None:
        wl = workload(kube, ns, "low-a")
        done = (
            wl_condition(wl, "Evicted").get("reason") == "Preempted"
            and wl_condition(wl, "Requeued").get("status") == "True"
            and "admission" not in wl.get("status", {})
        )
        seen.append((wl.get("status"), shape(kube, ns, "low-a")))
        return wl if done and shape(kube, ns, "low-a") == STOPPED else None

    seen: list[Any] = []
    try:
        wl = until(preempted, timeout=60)
    except AssertionError:
        raise AssertionError(f"not preempted; last seen {seen[-1]}") from None
    assert wl_condition(wl, "QuotaReserved")["status"] == "False"
    cond = until(lambda: ((c := suspended(kube, ns, "low-a"))["reason"] == "Preempted" and c) or None)
    assert cond["status"] == "True" and "echojob-low-a" in cond["message"]
    assert {"Preempted", "QuotaReleased"} <= reasons(kube, ns, "low-a")

    # 3. Queued behind a full quota: a third job waits, suspended, and says why.
    apply(kube, ns, job("low-b", storage, f"{ns}-low"))
    # Kueue's own reason reaches the job's status (first "not admitted yet", then Kueue's message).
    cond = until(lambda: ((c := suspended(kube, ns, "low-b"))["reason"] == "Queued" and c) or None)
    assert "LocalQueue team" in cond["message"]
    until(lambda: "insufficient" in suspended(kube, ns, "low-b")["message"] or None)
    assert shape(kube, ns, "low-b") == STOPPED
    ready = condition(get(kube, ns, "echojob", "low-b"), "Ready")
    assert ready["status"] == "False" and "held by its queue" in ready["message"]

    # 4. Resumed: suspending the high-priority job deactivates its Workload; its quota goes back without
    #    a requeue, and the preempted job (first in line: evicted before low-b was made) runs again.
    kubectl_ok(
        kube, "patch", "echojob", "high-c", "-n", ns, "--type=merge", "-p", '{"spec": {"suspend": true}}'
    )
    wl = until(
        lambda: (
            (w := workload(kube, ns, "high-c")).get("spec", {}).get("active") is False
            and wl_condition(w, "Requeued").get("status") == "False"
            and w
        ),
        timeout=60,
    )
    assert "admission" not in wl.get("status", {})
    until(lambda: suspended(kube, ns, "high-c")["reason"] == "JobSuspended" or None)
    until(lambda: suspended(kube, ns, "low-a")["status"] == "False" or None, timeout=60)
    # envtest has no garbage collector: the trainer Job deleted at the preemption stays Terminating, so
    # only the Deployments can come back here (the real node shows the trainer resuming).
    until(lambda: {k: v for k, v in shape(kube, ns, "low-a").items() if k != "trainer-job"}
               == {"coordinator": 1, "cpu": 1} or None, timeout=30)  # fmt: skip
    assert wl_condition(workload(kube, ns, "low-a"), "Admitted")["status"] == "True"
    assert suspended(kube, ns, "low-b")["reason"] == "Queued"  # still no room for it

    # 5. Out of the queue: without the label the job no longer waits, and its Workload is gone.
    kubectl_ok(kube, "label", "echojob", "low-b", "-n", ns, "kueue.x-k8s.io/queue-name-")
    until(lambda: shape(kube, ns, "low-b") == RUNNING or None, timeout=60)
    gone = kube.kubectl("get", "workloads.kueue.x-k8s.io", "echojob-low-b", "-n", ns)
    assert gone.returncode != 0 and "NotFound" in gone.stderr
    assert "WorkloadDeleted" in reasons(kube, ns, "low-b")

    # 6. Deactivated by an admin (as `kueuectl stop workload` does): the job stops and says why, and
    #    the operator leaves the Workload inactive (it used to re-apply active: true) until the admin
    #    reactivates it.
    def set_active(active: bool) -> None:
        patch = json.dumps({"spec": {"active": active}})
        kubectl_ok(
            kube, "patch", "workloads.kueue.x-k8s.io", "echojob-low-a", "-n", ns, "--type=merge", "-p", patch
        )

    set_active(False)
    cond = until(
        lambda: ((c := suspended(kube, ns, "low-a"))["reason"] == "WorkloadDeactivated" and c) or None,
        timeout=90,  # Kueue evicts, then the operator scales to zero and releases: slower on a loaded CI
    )
    assert "kueuectl resume workload echojob-low-a" in cond["message"]
    until(lambda: {k: v for k, v in shape(kube, ns, "low-a").items() if k != "trainer-job"}
               == {"coordinator": 0, "cpu": 0} or None, timeout=90)  # fmt: skip
    time.sleep(3)  # six status passes (every 0.5 s here), each of which used to re-activate it
    assert workload(kube, ns, "low-a")["spec"]["active"] is False
    assert suspended(kube, ns, "low-a")["reason"] == "WorkloadDeactivated"
    set_active(True)
    until(lambda: suspended(kube, ns, "low-a")["status"] == "False" or None, timeout=120)
    until(lambda: {k: v for k, v in shape(kube, ns, "low-a").items() if k != "trainer-job"}
               == {"coordinator": 1, "cpu": 1} or None, timeout=120)  # fmt: skip


def test_a_missing_priority_class_or_queue_api_is_reported_on_the_field(
    kueue: Kueue,
    operator: KopfRunner,
    kube_apiserver: KubeApiServer,
    kube_namespace: str,
    storage_secret: str,
    storage_yaml: Callable[..., str],
    bucket: str,
) -> None:
    kube, ns = kube_apiserver, kube_namespace
    apply(kube, ns, job("nopri", storage_yaml(bucket), "no-such-class"))

    def reported() -> dict[str, Any] | None:
        ready = condition(get(kube, ns, "echojob", "nopri"), "Ready")
        return ready if ready.get("reason") == "PriorityClassNotFound" else None

    ready = until(reported, timeout=30)
    assert "kueue.x-k8s.io/priority-class" in ready["message"] and "no-such-class" in ready["message"]
    assert shape(kube, ns, "nopri")["trainer-job"] == 0


def test_the_pods_go_where_kueue_admitted_them(
    kueue: Kueue,
    operator: KopfRunner,
    kube_apiserver: KubeApiServer,
    kube_namespace: str,
    storage_secret: str,
    storage_yaml: Callable[..., str],
    bucket: str,
) -> None:
    """Two ResourceFlavors; the first has no CPU to give, so Kueue admits the job on the second (spot),
    and the job's pods get that flavor's node labels and toleration, as Kueue's own integrations do.
    The Workload keeps asking for the pods as the job wrote them."""
    kube, ns = kube_apiserver, kube_namespace
    kq = "apiVersion: kueue.x-k8s.io/v1beta2"
    apply(kube, ns, f"""
{kq}
kind: ResourceFlavor
metadata: {{name: {ns}-reserved}}
spec: {{nodeLabels: {{echorl.dev/flavor: reserved}}}}
---
{kq}
kind: ResourceFlavor
metadata: {{name: {ns}-spot}}
spec:
  nodeLabels: {{echorl.dev/flavor: spot}}
  tolerations: [{{key: spot, operator: Exists, effect: NoSchedule}}]
---
{kq}
kind: ClusterQueue
metadata: {{name: {ns}-flavors}}
spec:
  namespaceSelector: {{matchLabels: {{kubernetes.io/metadata.name: {ns}}}}}
  resourceGroups:
  - coveredResources: [cpu, memory]
    flavors:
    - name: {ns}-reserved
      resources: [{{name: cpu, nominalQuota: "0"}}, {{name: memory, nominalQuota: 64Gi}}]
    - name: {ns}-spot
      resources: [{{name: cpu, nominalQuota: "4"}}, {{name: memory, nominalQuota: 64Gi}}]
---
{kq}
kind: LocalQueue
metadata: {{name: flavored, namespace: {ns}}}
spec: {{clusterQueue: {ns}-flavors}}
""", "--server-side")  # fmt: skip
    text = job("spotted", storage_yaml(bucket), "unused", queue="flavored").replace(
        ", kueue.x-k8s.io/priority-class: unused", ""
    )
    apply(kube, ns, text)
    until(lambda: shape(kube, ns, "spotted") == RUNNING or None, timeout=60)
    wl = workload(kube, ns, "spotted")
    assignments = {
        a["name"]: set(a["flavors"].values()) for a in wl["status"]["admission"]["podSetAssignments"]
    }
    assert assignments == {"coordinator": {f"{ns}-spot"}, "trainer": {f"{ns}-spot"}, "cpu": {f"{ns}-spot"}}
    toleration = {"key": "spot", "operator": "Exists", "effect": "NoSchedule"}
    templates = [
        get(kube, ns, "deployment", "spotted-coordinator"),
        get(kube, ns, "deployment", "spotted-cpu"),
        get(kube, ns, "job", "spotted-trainer"),
    ]
    for obj in templates:
        pod = obj["spec"]["template"]["spec"]
        assert pod.get("nodeSelector", {}).get("echorl.dev/flavor") == "spot", obj["metadata"]["name"]
        assert toleration in pod.get("tolerations", []), obj["metadata"]["name"]
    # What the Workload charges stays the job's own request: no flavor labels in its pod sets.
    for pod_set in wl["spec"]["podSets"]:
        assert "echorl.dev/flavor" not in (pod_set["template"]["spec"].get("nodeSelector") or {})


def test_the_pod_set_limit_is_read_from_the_installed_kueue(
    kueue: Kueue, kube_apiserver: KubeApiServer
) -> None:
    from echo_operator import queueing

    crd = kube_apiserver.kubectl_json("get", "crd", queueing.WORKLOAD_CRD)
    assert queueing.pod_set_limit(crd) == 8  # Kueue v0.17's Workload CRD: podSets maxItems 8
