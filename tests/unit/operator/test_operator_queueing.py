"""Kueue admission: the Workload a queued job gets, and what the operator makes of Kueue's answer."""

from __future__ import annotations

import copy
import dataclasses
import textwrap
from typing import Any

import pytest

from echo_operator import children, queueing
from echo_operator import status as status_mod
from echo_operator.children import inputs
from echo_operator.config import Settings

SETTINGS = Settings()
NOW = "2026-12-04T08:00:00Z"
EARLIER = "2026-12-04T07:00:00Z"


def by_name(pod_sets: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {p["name"]: p for p in pod_sets}


def container(pod_set: dict[str, Any]) -> dict[str, Any]:
    [only] = pod_set["template"]["spec"]["containers"]
    return only


def test_pod_sets_charge_every_pod_the_job_runs_and_nothing_for_external_workers(make_job: Any) -> None:
    sets = queueing.pod_sets(make_job(), SETTINGS)
    # The manifest: 1 coordinator, 2 trainer nodes, gpu replicas 3, cpu unset (one pod), the shared
    # swarm's 2 (this job is its only user), and the external Mac pool runs no pod in the cluster.
    assert [(p["name"], p["count"]) for p in sets] == [
        ("coordinator", 1),
        ("trainer", 2),
        ("gpu", 3),
        ("cpu", 1),
        ("shared", 2),
    ]


def test_pod_sets_carry_the_requests_and_placement_kueue_needs(make_job: Any) -> None:
    sets = by_name(queueing.pod_sets(make_job(), SETTINGS))
    gpu = sets["gpu"]["template"]["spec"]
    assert container(sets["gpu"])["resources"]["requests"] == {"cpu": "8", "memory": "64Gi"}
    assert gpu["nodeSelector"] == {"nvidia.com/gpu.product": "H100"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in gpu["tolerations"]
    assert "nodeAffinity" in gpu["affinity"]
    assert container(sets["cpu"])["resources"] == {"requests": {"cpu": "4"}, "limits": {"memory": "8Gi"}}
    trainer = sets["trainer"]["template"]["spec"]
    assert trainer["nodeSelector"] == {"echorl.dev/pool": "train"}
    assert container(sets["trainer"])["resources"]["limits"]["nvidia.com/gpu"] == "2"  # gpusPerNode
    # Only what places and charges a pod: no command, env or volumes travel into the Workload.
    assert set(container(sets["gpu"])) == {"name", "image", "resources"}


def test_a_suspended_held_or_finished_job_is_charged_for_the_pods_it_will_run(make_job: Any) -> None:
    job = make_job()
    held = dataclasses.replace(job, held=inputs.Hold("Queued", "waiting"))
    suspended = dataclasses.replace(job, spec=job.spec.model_copy(update={"suspend": True}))
    assert not held.active and not suspended.active
    for other in (held, suspended, dataclasses.replace(job, finished=True)):
        assert queueing.pod_sets(other, SETTINGS) == queueing.pod_sets(job, SETTINGS)


def test_the_workload_is_owned_by_the_job_and_names_its_queue_priority_and_activity(make_job: Any) -> None:
    job = make_job(uid="u-7")
    wl = queueing.workload(job, SETTINGS, "team-a", ("high", 1000))
    assert (wl["apiVersion"], wl["kind"]) == ("kueue.x-k8s.io/v1beta2", "Workload")
    assert wl["metadata"]["name"] == "echojob-demo" and wl["metadata"]["namespace"] == "ml"
    [owner] = wl["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "EchoJob",
        "demo",
        "u-7",
        True,
    )
    assert wl["spec"]["queueName"] == "team-a"
    assert wl["spec"]["priority"] == 1000
    assert wl["spec"]["priorityClassRef"] == {
        "group": "kueue.x-k8s.io",
        "kind": "WorkloadPriorityClass",
        "name": "high",
    }
    assert wl["spec"]["active"] is True
    plain = queueing.workload(
        dataclasses.replace(job, spec=job.spec.model_copy(update={"suspend": True})), SETTINGS, "team-a", None
    )
    assert plain["spec"]["active"] is False  # spec.suspend deactivates it: Kueue gives its quota back
    assert "priority" not in plain["spec"] and "priorityClassRef" not in plain["spec"]


def test_the_operator_never_reactivates_a_workload_it_did_not_deactivate(make_job: Any) -> None:
    """Kueue (waitForPodsReady's requeue limit) or an admin (kueuectl stop) deactivated it: it stays so.
    The operator's own deactivation, for spec.suspend, is marked, and undone when the job resumes."""
    job = make_job()
    by_admin = workload(active=False)
    assert queueing.workload(job, SETTINGS, "q", None, by_admin)["spec"]["active"] is False
    for_suspend = workload(active=False, for_suspend=True)
    resumed = queueing.workload(job, SETTINGS, "q", None, for_suspend)
    assert resumed["spec"]["active"] is True
    assert queueing.SUSPENDED_MARK not in resumed["metadata"].get("annotations", {})
    suspended = dataclasses.replace(job, spec=job.spec.model_copy(update={"suspend": True}))
    applied = queueing.workload(suspended, SETTINGS, "q", None, workload())
    assert applied["spec"]["active"] is False
    assert applied["metadata"]["annotations"] == {queueing.SUSPENDED_MARK: "true"}
    assert queueing.workload(job, SETTINGS, "q", None, workload())["spec"]["active"] is True


def test_queue_and_priority_come_from_kueues_own_labels() -> None:
    body = {"metadata": {"labels": {"kueue.x-k8s.io/queue-name": "q", "kueue.x-k8s.io/priority-class": "p"}}}
    assert (queueing.queue_name(body), queueing.priority_class(body)) == ("q", "p")
    assert queueing.queue_name({"metadata": {}}) is None
    assert queueing.queue_name({"metadata": {"labels": {"kueue.x-k8s.io/queue-name": ""}}}) is None


def test_more_pod_sets_than_kueue_takes_is_refused_with_the_count(make_job: Any) -> None:
    pools = "".join(f"\n  - name: p{i}\n    replicas: 1" for i in range(7))
    text = textwrap.dedent(
        """
        apiVersion: echorl.dev/v1alpha1
        kind: EchoJob
        metadata: {name: wide, namespace: ml}
        spec:
          storage: {type: S3, endpoint: "minio:9000", bucket: echorl, credentialsSecret: creds}
          inferenceSwarms:"""
    )
    job = make_job(text + pools)
    message = queueing.too_many_pod_sets(job, SETTINGS)
    assert message is not None and "at most 8" in message and "needs 9" in message
    assert queueing.too_many_pod_sets(make_job(), SETTINGS) is None
    assert queueing.too_many_pod_sets(job, SETTINGS, limit=16) is None  # a Kueue that takes more


def cond(kind: str, status: str, reason: str = "R", message: str = "", when: str = EARLIER) -> dict[str, Any]:
    return {"type": kind, "status": status, "reason": reason, "message": message, "lastTransitionTime": when}


def workload(
    *conditions: dict[str, Any], admission: bool = False, active: bool = True, for_suspend: bool = False
) -> dict[str, Any]:
    """A stored Workload; ``for_suspend``: deactivated by the operator for ``spec.suspend`` (its mark)."""
    status: dict[str, Any] = {"conditions": list(conditions)}
    if admission:
        status["admission"] = {
            "clusterQueue": "cq",
            "podSetAssignments": [{"name": "coordinator", "count": 1}],
        }
    marks = {"annotations": {queueing.SUSPENDED_MARK: "true"}} if for_suspend else {}
    return {
        "metadata": {"name": "echojob-demo", "generation": 3, "uid": "w-1", **marks},
        "spec": {"queueName": "q", "active": active},
        "status": status,
    }


ADMITTED = (cond("QuotaReserved", "True", "QuotaReserved"), cond("Admitted", "True", "Admitted"))
PREEMPTED = cond(
    "Evicted", "True", "Preempted", "Preempted to accommodate a workload (UID: x) due to prioritization"
)


@pytest.mark.parametrize(
    ("wl", "reason", "in_message"),
    [
        (None, "Queued", "not admitted yet"),
        (
            workload(
                cond("QuotaReserved", "False", "Pending", "insufficient unused quota for cpu in flavor f")
            ),
            "Queued",
            "insufficient unused quota for cpu",
        ),
        (workload(*ADMITTED), None, None),
        (workload(*ADMITTED, PREEMPTED, admission=True), "Preempted", "Preempted to accommodate"),
        (
            workload(
                *ADMITTED,
                cond("Evicted", "True", "PodsReadyTimeout", "Exceeded the PodsReady timeout ns/echojob-demo"),
                admission=True,
            ),
            "PodsReadyTimeout",
            "(PodsReadyTimeout: Exceeded the PodsReady timeout ns/echojob-demo)",
        ),
        (
            workload(*ADMITTED, cond("Evicted", "True", "Deactivated", "deactivated"), admission=True),
            "EvictedByKueue",
            "Deactivated",
        ),
        (
            workload(cond("QuotaReserved", "False", "Pending"), active=False, for_suspend=True),
            "Deactivated",
            "spec.suspend",
        ),
        (
            workload(
                cond("Evicted", "True", "InactiveWorkload", "The workload is deactivated"), active=False
            ),
            "WorkloadDeactivated",
            "deactivated by Kueue or an admin (InactiveWorkload: The workload is deactivated)",
        ),
        (workload(*ADMITTED, cond("Finished", "True", "Succeeded")), None, None),
    ],
    ids=[
        "no-workload",
        "pending",
        "admitted",
        "preempted",
        "pods-ready-timeout",
        "deactivated-evicted",
        "inactive",
        "deactivated-by-others",
        "finished",
    ],
)
def test_the_job_runs_only_while_kueue_admits_it(
    wl: dict[str, Any] | None, reason: str | None, in_message: str | None
) -> None:
    held = queueing.hold(wl, "q", "echojob-demo")
    if reason is None:
        assert held is None
        return
    assert held is not None and held.reason == reason
    assert in_message is not None and in_message in held.message and "echojob-demo" in held.message


def test_an_eviction_holds_quota_until_released() -> None:
    evicted = workload(*ADMITTED, PREEMPTED, admission=True)
    assert queueing.evicted(evicted) and queueing.holds_quota(evicted) and not queueing.admitted(evicted)
    released = queueing.released(evicted, NOW)
    assert not queueing.evicted(released) and not queueing.holds_quota(released)
    assert not queueing.evicted(workload(*ADMITTED, admission=True))


def conditions_of(wl: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in wl["status"]["conditions"]}


def test_releasing_a_preempted_workload_gives_its_quota_back_and_requeues_it() -> None:
    evicted = workload(*ADMITTED, PREEMPTED, admission=True)
    before = copy.deepcopy(evicted)
    out = queueing.released(evicted, NOW)
    assert evicted == before  # pure: the stored object is not touched
    assert "admission" not in out["status"]
    c = conditions_of(out)
    assert (c["QuotaReserved"]["status"], c["QuotaReserved"]["reason"]) == ("False", "Pending")
    assert c["QuotaReserved"]["message"] == PREEMPTED["message"]
    assert (c["Admitted"]["status"], c["Admitted"]["reason"]) == ("False", "NoReservation")
    assert (c["Requeued"]["status"], c["Requeued"]["reason"]) == ("True", "Preempted")
    assert c["Evicted"] == PREEMPTED  # left as Kueue wrote it
    assert c["QuotaReserved"]["lastTransitionTime"] == NOW and c["Requeued"]["lastTransitionTime"] == NOW
    assert all(c[k]["observedGeneration"] == 3 for k in ("QuotaReserved", "Admitted", "Requeued"))


def test_a_deactivated_workload_is_released_without_requeueing() -> None:
    evicted = workload(
        *ADMITTED, cond("Evicted", "True", "Deactivated", "deactivated"), admission=True, active=False
    )
    c = conditions_of(queueing.released(evicted, NOW))
    assert (c["Requeued"]["status"], c["Requeued"]["reason"]) == ("False", "Deactivated")


def test_a_condition_keeps_its_transition_time_when_its_status_does_not_change() -> None:
    already = workload(
        cond("QuotaReserved", "False", "Pending", when=EARLIER),
        cond("Admitted", "True", "Admitted"),
        PREEMPTED,
        admission=True,
    )
    c = conditions_of(queueing.released(already, NOW))
    assert c["QuotaReserved"]["lastTransitionTime"] == EARLIER
    assert c["Admitted"]["lastTransitionTime"] == NOW


def test_a_finished_job_marks_its_workload_finished_and_keeps_the_admission() -> None:
    wl = workload(*ADMITTED, admission=True)
    out = queueing.with_finished(wl, "Succeeded", "the EchoJob succeeded", NOW)
    c = conditions_of(out)
    assert (c["Finished"]["status"], c["Finished"]["reason"]) == ("True", "Succeeded")
    assert out["status"]["admission"] == wl["status"]["admission"]
    assert queueing.finished(out) and not queueing.finished(wl)


def test_kueues_defaults_are_not_a_change_but_other_pods_are(make_job: Any) -> None:
    job = make_job()
    wanted = queueing.workload(job, SETTINGS, "q", None)
    stored = copy.deepcopy(wanted)
    for pod_set in stored["spec"]["podSets"]:  # what the API server and Kueue add to a stored Workload
        pod_set["template"]["metadata"] = {}
        pod_set["minCount"] = None
    stored["spec"]["maximumExecutionTimeSeconds"] = None
    assert queueing.same_pods(stored, wanted)
    bigger = copy.deepcopy(wanted)
    bigger["spec"]["podSets"][2]["count"] = 4
    assert not queueing.same_pods(bigger, wanted)
    hungrier = copy.deepcopy(wanted)
    hungrier["spec"]["podSets"][0]["template"]["spec"]["containers"][0]["resources"] = {
        "requests": {"cpu": "9"}
    }
    assert not queueing.same_pods(hungrier, wanted)


def test_status_says_why_kueue_holds_the_job(make_job: Any) -> None:
    job = make_job()
    hold = inputs.Hold("Queued", "waiting for Kueue to admit Workload echojob-demo from LocalQueue q")
    obs = status_mod.Observation(generation=1, suspended=True, job=dataclasses.replace(job, held=hold))
    conds = {c.type: c for c in status_mod.conditions(obs, {})}
    assert (conds["Suspended"].status, conds["Suspended"].reason) == ("True", "Queued")
    assert conds["Suspended"].message == hold.message
    assert conds["Ready"].status == "False" and hold.message in conds["Ready"].message
    assert conds["Progressing"].status == "False"
    # A user's spec.suspend says so, whatever the queue says.
    mine = dataclasses.replace(job, spec=job.spec.model_copy(update={"suspend": True}), held=hold)
    conds = {c.type: c for c in status_mod.conditions(status_mod.Observation(1, True, mine), {})}
    assert conds["Suspended"].reason == "JobSuspended"


def test_a_held_job_runs_no_process(make_job: Any) -> None:
    held = dataclasses.replace(make_job(), held=inputs.Hold("Queued", "waiting"))
    objs = children.desired(held, SETTINGS)
    assert not [o for o in objs if o["kind"] == "Job"]
    assert all(o["spec"].get("replicas") == 0 for o in objs if o["kind"] == "Deployment")


SPOT = {
    "metadata": {"name": "spot"},
    "spec": {
        "nodeLabels": {"echorl.dev/flavor": "spot", "topology.kubernetes.io/zone": "z1"},
        "tolerations": [{"key": "spot", "operator": "Exists", "effect": "NoSchedule"}],
    },
}


def admitted_on(assignments: list[dict[str, Any]], **status: Any) -> dict[str, Any]:
    wl = workload(*ADMITTED, admission=True)
    wl["status"]["admission"]["podSetAssignments"] = assignments
    wl["status"].update(status)
    return wl


def test_the_admitted_flavors_node_labels_and_tolerations_reach_each_pod_set(make_job: Any) -> None:
    wl = admitted_on([
        {"name": "coordinator", "flavors": {"cpu": "default", "memory": "default"}, "count": 1},
        {"name": "trainer", "flavors": {"cpu": "spot", "memory": "spot"}, "count": 1},
        {"name": "cpu", "flavors": {"cpu": "spot"}, "count": 1},
    ])  # fmt: skip
    assert queueing.flavor_names(wl) == ["default", "spot"]
    where = queueing.placement(wl, {"default": {"spec": {}}, "spot": SPOT})
    assert where["coordinator"] == inputs.Placement({}, ())
    assert dict(where["trainer"].node_selector) == SPOT["spec"]["nodeLabels"]
    assert list(where["trainer"].tolerations) == SPOT["spec"]["tolerations"]
    # Not admitted (queued, or evicted): nowhere in particular.
    assert queueing.placement(workload(*ADMITTED, PREEMPTED, admission=True), {"spot": SPOT}) == {}
    assert queueing.placement(None, {}) == {}

    # The pods get it beside their own selector and tolerations; the Workload's pod sets do not.
    job = dataclasses.replace(make_job(), placement=where)
    objs = {children.pod_set_name(o): o for o in children.desired(job, SETTINGS) if children.pod_set_name(o)}
    trainer = objs["trainer"]["spec"]["template"]["spec"]
    assert trainer["nodeSelector"].items() >= SPOT["spec"]["nodeLabels"].items()
    assert SPOT["spec"]["tolerations"][0] in trainer["tolerations"]
    pool = objs["cpu"]["spec"]["template"]["spec"]
    assert pool["nodeSelector"]["echorl.dev/flavor"] == "spot"
    assert "nodeSelector" not in objs["coordinator"]["spec"]["template"]["spec"] or (
        "echorl.dev/flavor" not in objs["coordinator"]["spec"]["template"]["spec"]["nodeSelector"]
    )
    assert queueing.pod_sets(job, SETTINGS) == queueing.pod_sets(make_job(), SETTINGS)


def test_an_admission_checks_pod_set_updates_add_to_the_flavors() -> None:
    check = {"name": "provisioning", "state": "Ready", "podSetUpdates": [
        {"name": "trainer", "nodeSelector": {"cloud.example.com/provisioned": "req-1"},
         "tolerations": [{"key": "provisioned", "operator": "Exists"}]},
    ]}  # fmt: skip
    wl = admitted_on([{"name": "trainer", "flavors": {"cpu": "spot"}, "count": 1}], admissionChecks=[check])
    where = queueing.placement(wl, {"spot": SPOT})["trainer"]
    assert where.node_selector["cloud.example.com/provisioned"] == "req-1"
    assert where.node_selector["echorl.dev/flavor"] == "spot"
    assert {"key": "provisioned", "operator": "Exists"} in where.tolerations and len(where.tolerations) == 2


def test_the_pod_set_limit_is_the_installed_kueues_and_a_kueue_too_old_is_named() -> None:
    def crd(*versions: tuple[str, bool, int | None]) -> dict[str, Any]:
        return {"spec": {"versions": [
            {"name": name, "served": served, "schema": {"openAPIV3Schema": {"properties": {"spec": {"properties": {
                "podSets": {"type": "array", **({"maxItems": most} if most else {})}}}}}}}
            for name, served, most in versions
        ]}}  # fmt: skip

    assert queueing.pod_set_limit(crd(("v1beta1", True, 8), ("v1beta2", True, 16))) == 16
    assert queueing.pod_set_limit(crd(("v1beta2", True, None))) == queueing.MAX_POD_SETS
    assert queueing.pod_set_limit(crd(("v1beta1", True, 8))) is None  # Kueue < v0.15
    assert queueing.pod_set_limit(crd(("v1beta1", True, 8), ("v1beta2", False, 8))) is None


def test_pods_ready_is_written_with_kueues_reasons() -> None:
    wl = workload(*ADMITTED, admission=True)
    waiting = queueing.with_pods_ready(wl, False, NOW)
    assert waiting is not None
    cond = conditions_of(waiting)["PodsReady"]
    assert (cond["status"], cond["reason"]) == ("False", "WaitForStart")
    assert queueing.with_pods_ready(waiting, False, NOW) is None  # says so already: no write
    ready = queueing.with_pods_ready(waiting, True, NOW)
    assert ready is not None and conditions_of(ready)["PodsReady"]["status"] == "True"
    assert conditions_of(ready)["Admitted"] == conditions_of(wl)["Admitted"]  # Kueue's own kept
    lost = queueing.with_pods_ready(ready, False, NOW)
    assert lost is not None and conditions_of(lost)["PodsReady"]["reason"] == "WaitForRecovery"
