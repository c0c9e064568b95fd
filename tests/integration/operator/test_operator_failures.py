"""A trainer failure is counted once, whatever happens to the operator in between: the count reaches
the EchoJob's status (with the failed Job's UID) before the Job is deleted. Against the real API server:
an operator whose service account may not delete Jobs is stopped after the count (as if killed between
the two); the next operator deletes the Job and does not count it again.

envtest runs no kubelet or Job controller: the test marks the trainer Job Failed through its status, as
the Job controller would, and removes the foreground-deletion finalizer, as the garbage collector would.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from kopf.testing import KopfRunner
from operator_kit import apply, children_of, get, kubectl_ok, reasons, service_account_kubeconfig, until

from echo_operator import handlers
from services.kube import KubeApiServer

pytestmark = [pytest.mark.services, pytest.mark.usefixtures("delete_jobs")]


def job(storage: str) -> str:
    return f"""
apiVersion: echorl.dev/v1alpha1
kind: EchoJob
metadata: {{name: flaky}}
spec:
  model: {{path: echorl:tiny}}
  storage: {storage}
  backoffLimit: 3
  inferenceSwarms: [{{name: cpu, replicas: 1}}]
"""


def fail(kube: KubeApiServer, namespace: str, name: str) -> None:
    """What the Job controller writes when a Job runs out of retries."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    conds = [
        {"type": t, "status": "True", "reason": "BackoffLimitExceeded", "message": "Job has reached the "
         "specified backoff limit", "lastTransitionTime": now}
        for t in ("FailureTarget", "Failed")
    ]  # fmt: skip
    status = {"status": {"startTime": now, "failed": 1, "conditions": conds}}
    kubectl_ok(kube, "patch", "job", name, "-n", namespace, "--subresource=status", "--type=merge",
               "-p", json.dumps(status))  # fmt: skip


@pytest.fixture(scope="module")
def no_delete_kubeconfig(kube_apiserver: KubeApiServer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The operator's rules without ``delete`` on Jobs, for a service account of its own."""
    role = kube_apiserver.kubectl_json("get", "clusterrole", "echorl-operator")
    for rule in role["rules"]:
        if "jobs" in rule.get("resources", []):
            rule["verbs"] = [v for v in rule["verbs"] if v != "delete"]
    docs = [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": "operator-no-delete", "namespace": "echorl-system"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": "operator-no-delete"}, "rules": role["rules"]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "operator-no-delete"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "operator-no-delete"},
         "subjects": [{"kind": "ServiceAccount", "name": "operator-no-delete", "namespace": "echorl-system"}]},
    ]  # fmt: skip
    kubectl_ok(kube_apiserver, "apply", "-f", "-", input=yaml.safe_dump_all(docs))
    path = tmp_path_factory.mktemp("no-delete") / "kubeconfig"
    return service_account_kubeconfig(kube_apiserver, "echorl-system", "operator-no-delete", path)


def test_a_counted_failure_survives_an_operator_stopped_before_the_delete_and_is_counted_once(
    kube_apiserver: KubeApiServer,
    kube_namespace: str,
    start_operator: Callable[..., contextlib.AbstractContextManager[KopfRunner]],
    no_delete_kubeconfig: Path,
    storage_secret: str,
    bucket: str,
    storage_yaml: Callable[..., str],
) -> None:
    kube, ns = kube_apiserver, kube_namespace
    trainer = "flaky-trainer"

    with start_operator(kubeconfig=no_delete_kubeconfig):
        apply(kube, ns, job(storage_yaml(bucket)))
        first = until(lambda: get_or_none(kube, ns, trainer))
        uid = first["metadata"]["uid"]
        trainer_pod(kube, ns, "flaky", first, "Error")
        fail(kube, ns, trainer)
        # Counted in status while the failed Job is still there (this operator cannot delete it).
        status = until(lambda: counted(kube, ns, uid))
        assert status["restarts"] == 1
        # Its pods' logs kept and the stop recorded before the delete (refused here) was tried.
        (entry,) = until(lambda: get(kube, ns, "echojob", "flaky")["status"].get("trainerHistory"))
        assert (entry["restart"], entry["uid"], entry["logsConfigMap"]) == (1, uid, "flaky-trainer-logs-1")
        kept = get(kube, ns, "configmap", "flaky-trainer-logs-1")["data"]["rank-0.trainer.log"]
        assert kept.startswith("(log unavailable: ") and "never scheduled" in kept, kept
        until(lambda: "ReconcileFailed" in reasons(kube, ns, "flaky") or "TrainerFailed"
                   in reasons(kube, ns, "flaky"))  # fmt: skip
        assert get(kube, ns, "job", trainer)["metadata"]["uid"] == uid
        assert not get(kube, ns, "job", trainer)["metadata"].get("deletionTimestamp")

    # A new operator (the operator's own rules): it deletes the failed Job, and does not count it again.
    with start_operator():
        deleting = until(lambda: get(kube, ns, "job", trainer)["metadata"].get("deletionTimestamp"))
        assert deleting
        kubectl_ok(kube, "patch", "job", trainer, "-n", ns, "--type=json",
                   "-p", '[{"op": "remove", "path": "/metadata/finalizers"}]')  # fmt: skip
        second = until(lambda: (j := get_or_none(kube, ns, trainer)) and j["metadata"]["uid"] != uid and j)
        assert second["metadata"]["uid"] != uid
        status = get(kube, ns, "echojob", "flaky")["status"]
        assert status["restarts"] == 1 and status["lastCountedTrainer"] == uid
        # Recorded once, by the first operator: the second neither adds an entry nor another ConfigMap.
        assert status["trainerHistory"] == [entry]
        logs = kube.kubectl_json("get", "configmaps", "-n", ns, "-l", "echorl.dev/component=trainer-logs")
        assert [c["metadata"]["name"] for c in logs["items"]] == ["flaky-trainer-logs-1"]

        # Its own failure is the second (it had no pod: no logs to keep).
        fail(kube, ns, trainer)
        status = until(lambda: counted(kube, ns, second["metadata"]["uid"]))
        assert status["restarts"] == 2
        history = until(
            lambda: len(h := get(kube, ns, "echojob", "flaky")["status"]["trainerHistory"]) == 2 and h
        )
        assert history[1]["restart"] == 2 and "logsConfigMap" not in history[1], history


def counted(kube: KubeApiServer, ns: str, uid: str) -> dict[str, Any] | None:
    """The EchoJob's status once it counted the trainer Job ``uid``."""
    status: dict[str, Any] = get(kube, ns, "echojob", "flaky").get("status") or {}
    return status if status.get("lastCountedTrainer") == uid else None


def get_or_none(kube: KubeApiServer, ns: str, name: str) -> dict[str, Any] | None:
    proc = kube.kubectl("get", "job", name, "-n", ns, "-o", "json")
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def trainer_pod(kube: KubeApiServer, ns: str, job: str, trainer_job: dict[str, Any], reason: str) -> None:
    """A rank of ``trainer_job`` whose container ended with ``reason``, as the kubelet reports it."""
    name = f"{job}-trainer-0-abcde"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {"echorl.dev/job": job, "echorl.dev/component": "trainer",
                       "batch.kubernetes.io/job-completion-index": "0"},
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": trainer_job["metadata"]["name"],
                                 "uid": trainer_job["metadata"]["uid"], "controller": True}],
        },
        "spec": {"containers": [{"name": "trainer", "image": "trainer"}], "restartPolicy": "Never"},
    }  # fmt: skip
    kubectl_ok(kube, "apply", "-n", ns, "-f", "-", input=yaml.safe_dump(pod))
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    terminated = {"exitCode": 137, "reason": reason, "finishedAt": now, "startedAt": now}
    status = {"status": {"phase": "Failed", "containerStatuses": [
        {"name": "trainer", "image": "trainer", "imageID": "", "ready": False, "restartCount": 0,
         "state": {"terminated": terminated}}]}}  # fmt: skip
    kubectl_ok(kube, "patch", "pod", name, "-n", ns, "--subresource=status", "--type=merge",
               "-p", json.dumps(status))  # fmt: skip


def failed_condition(kube: KubeApiServer, ns: str, name: str) -> dict[str, Any] | None:
    for cond in (get(kube, ns, "echojob", name).get("status") or {}).get("conditions") or []:
        if cond["type"] == "Failed" and cond["status"] == "True":
            return dict(cond)
    return None


def test_an_out_of_memory_rank_fails_the_job_and_a_deadline_stops_one(
    kube_apiserver: KubeApiServer,
    kube_namespace: str,
    operator: KopfRunner,
    storage_secret: str,
    bucket: str,
    storage_yaml: Callable[..., str],
) -> None:
    kube, ns = kube_apiserver, kube_namespace
    apply(kube, ns, job(storage_yaml(bucket)))
    trainer = until(lambda: get_or_none(kube, ns, "flaky-trainer"))
    trainer_pod(kube, ns, "flaky", trainer, "OOMKilled")
    fail(kube, ns, "flaky-trainer")
    cond = until(lambda: failed_condition(kube, ns, "flaky"))
    assert cond["reason"] == "OOMKilled" and "out of memory" in cond["message"], cond
    assert (
        get(kube, ns, "job", "flaky-trainer")["metadata"]["uid"] == trainer["metadata"]["uid"]
    )  # not retried
    # Once its status settles, the finished job is not polled any more (its daemon idles).
    reconciler = handlers._state["reconciler"]
    until(lambda: reconciler.next_pass_in(get(kube, ns, "echojob", "flaky")) == math.inf)

    # A deadline: 3 s after it started, the job fails, its trainer Job is suspended (pods stopped) and
    # everything scaled to zero; ttlSecondsAfterFinished later removes the children, from the idle daemon.
    extra = "backoffLimit: 3\n  activeDeadlineSeconds: 3\n  ttlSecondsAfterFinished: 8"
    deadline = (
        job(storage_yaml(bucket)).replace("name: flaky", "name: hurried").replace("backoffLimit: 3", extra)
    )
    apply(kube, ns, deadline)
    cond = until(lambda: failed_condition(kube, ns, "hurried"), timeout=60)
    assert cond["reason"] == "DeadlineExceeded" and "activeDeadlineSeconds 3" in cond["message"], cond
    assert get(kube, ns, "job", "hurried-trainer")["spec"]["suspend"] is True
    assert get(kube, ns, "deployment", "hurried-coordinator")["spec"]["replicas"] == 0
    until(
        lambda: 0 < reconciler.next_pass_in(get(kube, ns, "echojob", "hurried")) < math.inf
    )  # idle till the TTL
    until(
        lambda: kube.kubectl("get", "deployment", "hurried-coordinator", "-n", ns).returncode != 0, timeout=60
    )
    assert get(kube, ns, "echojob", "hurried")["status"]["conditions"]  # the EchoJob and its status stay


def test_a_job_managed_by_another_controller_is_left_alone(
    kube_apiserver: KubeApiServer,
    kube_namespace: str,
    operator: KopfRunner,
    storage_secret: str,
    bucket: str,
    storage_yaml: Callable[..., str],
) -> None:
    """``spec.managedBy`` naming another controller (MultiKueue's, on a manager cluster): no children,
    no status, no finalizer; and the field can only be set at creation."""
    kube, ns = kube_apiserver, kube_namespace
    ours = job(storage_yaml(bucket)).replace("name: flaky", "name: ours")
    theirs = ours.replace("name: ours", "name: theirs").replace(
        "backoffLimit: 3", "backoffLimit: 3\n  managedBy: kueue.x-k8s.io/multikueue"
    )
    apply(kube, ns, theirs)
    apply(kube, ns, ours)
    until(lambda: get_or_none(kube, ns, "ours-trainer"))
    until(lambda: (get(kube, ns, "echojob", "ours").get("status") or {}).get("conditions"))
    time.sleep(3)  # six status passes of the operator here (every 0.5 s)
    left = get(kube, ns, "echojob", "theirs")
    assert "status" not in left or not left["status"], left.get("status")
    assert not left["metadata"].get("finalizers"), left["metadata"]
    assert not children_of(kube, ns, "theirs")
    # Immutable: neither removed from, nor added to, an existing job.
    refused = kube.kubectl("patch", "echojob", "theirs", "-n", ns, "--type=json",
                           "-p", '[{"op": "remove", "path": "/spec/managedBy"}]')  # fmt: skip
    assert refused.returncode != 0 and "managedBy is immutable" in refused.stderr, refused.stderr
    refused = kube.kubectl("patch", "echojob", "ours", "-n", ns, "--type=merge",
                           "-p", '{"spec": {"managedBy": "kueue.x-k8s.io/multikueue"}}')  # fmt: skip
    assert refused.returncode != 0 and "managedBy is immutable" in refused.stderr, refused.stderr
