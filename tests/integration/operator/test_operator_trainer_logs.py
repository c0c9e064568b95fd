"""A trainer Job the operator stops leaves its pods' last log lines in a ConfigMap and its story in
``status.trainerHistory``, against the real API server and the operator's own RBAC.

envtest runs no kubelet, Job controller or garbage collector: the test makes the trainer's pods itself
(owned by the trainer Job, as the Job controller makes them), writes their status and the Job's as the
kubelet and the Job controller would, and removes the finalizers the garbage collector would. No log
can be read here (no kubelet answers): what is tested is that the operator asks, records why it got
nothing, and restarts, suspends and counts exactly as before.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable
from typing import Any

import pytest
import yaml
from kopf.testing import KopfRunner
from operator_kit import apply, events, get, kubectl_ok, until

from services.kube import KubeApiServer

pytestmark = [pytest.mark.services, pytest.mark.usefixtures("delete_jobs")]

HOLD = "echorl.dev/test-hold"
UNAVAILABLE = "(log unavailable: "


def job(storage: str) -> str:
    return f"""
apiVersion: echorl.dev/v1alpha1
kind: EchoJob
metadata: {{name: logged}}
spec:
  model: {{path: echorl:tiny}}
  storage: {storage}
  backoffLimit: 3
  trainingSwarm: {{nodes: 2}}
  inferenceSwarms: [{{name: cpu, replicas: 1}}]
"""


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def rank_pod(
    kube: KubeApiServer, ns: str, trainer: dict[str, Any], rank: int, name: str, node: str, hold: bool = False
) -> None:
    """A running rank of ``trainer``, as the Job controller creates it and the kubelet reports it."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {"echorl.dev/job": "logged", "echorl.dev/component": "trainer",
                       "batch.kubernetes.io/job-completion-index": str(rank)},
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": trainer["metadata"]["name"],
                                 "uid": trainer["metadata"]["uid"], "controller": True}],
            **({"finalizers": [HOLD]} if hold else {}),
        },
        "spec": {"nodeName": node, "containers": [{"name": "trainer", "image": "trainer"}],
                 "restartPolicy": "Never"},
    }  # fmt: skip
    kubectl_ok(kube, "apply", "-n", ns, "-f", "-", input=yaml.safe_dump(pod))
    set_state(kube, ns, name, "Running", {"running": {"startedAt": now()}})


def set_state(kube: KubeApiServer, ns: str, name: str, phase: str, state: dict[str, Any]) -> None:
    status = {"status": {"phase": phase, "containerStatuses": [
        {"name": "trainer", "image": "trainer", "imageID": "", "ready": phase == "Running", "restartCount": 0,
         "state": state}]}}  # fmt: skip
    kubectl_ok(kube, "patch", "pod", name, "-n", ns, "--subresource=status", "--type=merge",
               "-p", json.dumps(status))  # fmt: skip


def fail(kube: KubeApiServer, ns: str, name: str, reason: str) -> None:
    """What the Job controller writes when the gang fails (``PodFailurePolicy``: a disruption)."""
    conds = [{"type": t, "status": "True", "reason": reason, "message": "failed", "lastTransitionTime": now()}
             for t in ("FailureTarget", "Failed")]  # fmt: skip
    kubectl_ok(kube, "patch", "job", name, "-n", ns, "--subresource=status", "--type=merge",
               "-p", json.dumps({"status": {"startTime": now(), "failed": 1, "conditions": conds}}))  # fmt: skip


def let_go(kube: KubeApiServer, ns: str, kind: str, name: str) -> None:
    """Remove an object's finalizers (what the garbage collector does once a Job's pods are gone)."""
    kube.kubectl("patch", kind, name, "-n", ns, "--type=merge", "-p", '{"metadata": {"finalizers": null}}')


def history(kube: KubeApiServer, ns: str) -> list[dict[str, Any]]:
    return list((get(kube, ns, "echojob", "logged").get("status") or {}).get("trainerHistory") or [])


def recorded(kube: KubeApiServer, ns: str, restart: int) -> dict[str, Any] | None:
    return next((e for e in history(kube, ns) if e["restart"] == restart), None)


def configmap(kube: KubeApiServer, ns: str, name: str) -> dict[str, Any] | None:
    proc = kube.kubectl("get", "configmap", name, "-n", ns, "-o", "json")
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def logs_configmaps(kube: KubeApiServer, ns: str) -> list[str]:
    listed = kube.kubectl_json("get", "configmaps", "-n", ns, "-l",
                               "echorl.dev/job=logged,echorl.dev/component=trainer-logs")  # fmt: skip
    return sorted((i["metadata"]["name"] for i in listed["items"]), key=lambda n: int(n.rsplit("-", 1)[1]))


def trainer_job(kube: KubeApiServer, ns: str, not_uid: str = "") -> dict[str, Any] | None:
    proc = kube.kubectl("get", "job", "logged-trainer", "-n", ns, "-o", "json")
    if proc.returncode != 0:
        return None
    found: dict[str, Any] = json.loads(proc.stdout)
    fresh = found["metadata"]["uid"] != not_uid and not found["metadata"].get("deletionTimestamp")
    return found if fresh else None


def replaced(kube: KubeApiServer, ns: str, uid: str) -> dict[str, Any]:
    """The next trainer Job, once the operator deleted ``uid`` (its deletion finished as the GC would)."""
    until(lambda: (j := trainer_job_any(kube, ns)) is None or j["metadata"]["uid"] != uid
          or j["metadata"].get("deletionTimestamp"))  # fmt: skip
    let_go(kube, ns, "job", "logged-trainer")
    return until(lambda: trainer_job(kube, ns, not_uid=uid))


def trainer_job_any(kube: KubeApiServer, ns: str) -> dict[str, Any] | None:
    proc = kube.kubectl("get", "job", "logged-trainer", "-n", ns, "-o", "json")
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def test_a_stopped_trainer_leaves_its_pods_logs_and_where_it_stopped(
    kube_apiserver: KubeApiServer,
    kube_namespace: str,
    operator: KopfRunner,
    storage_secret: str,
    bucket: str,
    storage_yaml: Callable[..., str],
) -> None:
    kube, ns = kube_apiserver, kube_namespace
    apply(kube, ns, job(storage_yaml(bucket)))
    first = until(lambda: trainer_job(kube, ns))
    uid = first["metadata"]["uid"]

    # Two ranks run; rank 1's pod is deleted by hand (held a moment by a finalizer, as a pod is held while
    # its containers stop). The operator reads the logs at once: the Job still runs, but it will fail.
    rank_pod(kube, ns, first, 0, "logged-trainer-0-aaaaa", "node-a")
    rank_pod(kube, ns, first, 1, "logged-trainer-1-bbbbb", "node-b", hold=True)
    # (No kubelet here to finish a graceful deletion: the grace period is 0, the finalizer holds it.)
    kubectl_ok(kube, "delete", "pod", "logged-trainer-1-bbbbb", "-n", ns, "--wait=false", "--grace-period=0",
               "--force")  # fmt: skip
    early = until(lambda: configmap(kube, ns, "logged-trainer-logs-1"))
    assert set(early["data"]) == {"rank-0.trainer.log", "rank-1.trainer.log"}, early["data"]
    assert not history(kube, ns)  # read ahead; nothing stopped yet

    # The deleted pod goes; rank 0 fails; the Job controller fails the Job.
    let_go(kube, ns, "pod", "logged-trainer-1-bbbbb")
    until(lambda: kube.kubectl("get", "pod", "logged-trainer-1-bbbbb", "-n", ns).returncode != 0)
    set_state(kube, ns, "logged-trainer-0-aaaaa", "Failed",
              {"terminated": {"exitCode": 1, "reason": "Error", "startedAt": now(), "finishedAt": now()}})  # fmt: skip
    fail(kube, ns, "logged-trainer", "BackoffLimitExceeded")

    entry = until(lambda: recorded(kube, ns, 1))
    assert entry["reason"] == "TrainerFailed" and entry["uid"] == uid, entry
    assert entry["logsConfigMap"] == "logged-trainer-logs-1"
    assert "logged-trainer-0-aaaaa (rank 0) exited with code 1" in entry["message"], entry
    assert entry["pods"] == [
        {"rank": 0, "name": "logged-trainer-0-aaaaa", "node": "node-a", "phase": "Failed",
         "exitCode": 1, "reason": "Error"},
        {"rank": 1, "name": "logged-trainer-1-bbbbb", "node": "node-b", "phase": "Gone"},
    ]  # fmt: skip
    cm = configmap(kube, ns, "logged-trainer-logs-1")
    assert cm is not None
    owner = cm["metadata"]["ownerReferences"][0]
    job_uid = get(kube, ns, "echojob", "logged")["metadata"]["uid"]
    assert (owner["kind"], owner["name"], owner["uid"]) == ("EchoJob", "logged", job_uid)
    assert cm["metadata"]["labels"]["echorl.dev/trainer-restart"] == "1"
    assert cm["metadata"]["annotations"]["echorl.dev/trainer-uid"] == uid
    # No kubelet answers here: each entry says why it holds no log, in a line.
    rank0, rank1 = cm["data"]["rank-0.trainer.log"], cm["data"]["rank-1.trainer.log"]
    # (the API server's own words: it looked for node-a, to ask its kubelet, and found none)
    assert rank0.startswith(UNAVAILABLE) and "node-a" in rank0 and len(rank0) < 500, rank0
    assert rank1 == (
        f"{UNAVAILABLE}pod logged-trainer-1-bbbbb was deleted before the operator could read its log)"
    )
    summary = cm["data"]["summary"]
    assert "TrainerFailed" in summary and "rank 1: pod logged-trainer-1-bbbbb on node node-b, Gone" in summary
    # The Event says where the logs are; the restart went on, counted once.
    failed = [e for e in events(kube, ns, "logged") if e["reason"] == "TrainerFailed"]
    assert failed and "kubectl get configmap logged-trainer-logs-1 -o yaml" in failed[-1]["message"]
    current = replaced(kube, ns, uid)
    assert get(kube, ns, "echojob", "logged")["status"]["restarts"] == 1

    # Disruptions (not counted) each leave one; only the last five ConfigMaps stay, the history keeps all.
    for n in range(2, 7):
        rank_pod(kube, ns, current, 0, f"logged-trainer-0-r{n}", "node-a")
        fail(kube, ns, "logged-trainer", "PodFailurePolicy")
        entry = until(lambda n=n: recorded(kube, ns, n))
        assert entry["reason"] == "TrainerDisrupted" and entry["logsConfigMap"] == f"logged-trainer-logs-{n}"
        current = replaced(kube, ns, current["metadata"]["uid"])
    until(lambda: logs_configmaps(kube, ns) == [f"logged-trainer-logs-{n}" for n in range(2, 7)])
    assert [e["restart"] for e in history(kube, ns)] == [1, 2, 3, 4, 5, 6]
    assert get(kube, ns, "echojob", "logged")["status"]["restarts"] == 1

    # Suspended: the trainer Job is deleted, its logs kept first, the Event names them.
    rank_pod(kube, ns, current, 0, "logged-trainer-0-s", "node-a")
    kubectl_ok(
        kube, "patch", "echojob", "logged", "-n", ns, "--type=merge", "-p", '{"spec": {"suspend": true}}'
    )
    entry = until(lambda: recorded(kube, ns, 7))
    assert entry["reason"] == "Suspended" and entry["uid"] == current["metadata"]["uid"], entry
    assert entry["pods"][0]["name"] == "logged-trainer-0-s"
    until(lambda: logs_configmaps(kube, ns) == [f"logged-trainer-logs-{n}" for n in range(3, 8)])
    stopped = [e for e in events(kube, ns, "logged") if e["reason"] == "TrainerStopped"]
    assert stopped and "kubectl get configmap logged-trainer-logs-7 -o yaml" in stopped[-1]["message"]
    until(lambda: (j := trainer_job_any(kube, ns)) is None or j["metadata"].get("deletionTimestamp"))
    let_go(kube, ns, "job", "logged-trainer")
