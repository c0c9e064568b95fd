"""EchoJobs on the real cluster, driven with kubectl as a user would: they train to Succeeded, survive
their pods being deleted, suspend and resume, fail with a reason, wait for nodes that do not exist,
and are cleaned up by the real garbage collector.

Every job is small (Echo's tiny model on the arithmetic task, CPU pods with small requests): the
e2e proves the operator's lifecycle, not learning (docs/benchmarks does that).
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest
import yaml
from e2e_kit import E2E, published

pytestmark = pytest.mark.timeout(1500)

RESOURCES = {"requests": {"cpu": "100m", "memory": "256Mi"}}


def echojob(name: str, max_steps: int, max_staleness: int = 2, **spec: Any) -> dict[str, Any]:
    """An EchoJob of the tiny model with S3 storage on the dev MinIO; ``spec`` overrides/extends."""
    body: dict[str, Any] = {
        "model": {"path": "echorl:tiny"},
        "task": {"name": "arithmetic"},
        "algorithm": {"groupSize": 4, "batchSize": 4, "maxSteps": max_steps},
        # Keep every snapshot, so the test can read the whole run back from the store.
        "syncPolicy": {"mode": "Async", "maxStaleness": max_staleness, "retention": {"keepLast": 1000}},
        "storage": {
            "type": "S3",
            "endpoint": "minio.echorl-system.svc:9000",
            "secure": False,
            "bucket": "echorl",
            "credentialsSecret": "minio-credentials",
        },
        "trainingSwarm": {"threads": 1, "checkpointInterval": 5, "resources": RESOURCES},
        "inferenceSwarms": [{"name": "cpu", "replicas": 1, "threads": 1, "resources": RESOURCES}],
    }
    body.update(spec)
    return {"apiVersion": "echorl.dev/v1alpha1", "kind": "EchoJob", "metadata": {"name": name}, "spec": body}


def running(e2e: E2E, selector: str) -> list[dict[str, Any]]:
    return [
        p
        for p in e2e.pods(selector)
        if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    ]


TRAINER_LINE = re.compile(r"(echo_runtime|echorl)\.trainer\S* (INFO|WARNING) ")
"""A line the trainer's own loggers write (``memory allocator: …``, ``step {…}``, ``signal 15: …``)."""
UNAVAILABLE = "(log unavailable: "


def assert_trainer_logs_kept(e2e: E2E, job: str, deleted: str) -> None:
    """The trainer Job the operator replaced after ``deleted`` (rank 1's pod) was deleted left its pods'
    last log lines in ``<job>-trainer-logs-1`` and its story in ``status.trainerHistory``.

    Each rank's entry holds the log its container wrote, or why it could not be read — and only because
    the pod was gone: since Kubernetes 1.31 a Job is Failed only once its pods stopped, and the Job
    controller deletes the ranks still running, so a rank's log is readable only while the operator's
    status pass (every 10 s) catches its pod, terminating or failed (it reads at once when it sees one).
    """
    entry = e2e.until(
        "restart 1 in status.trainerHistory",
        lambda: next(
            (e for e in e2e.job(job)["status"].get("trainerHistory") or [] if e["restart"] == 1), None
        ),
    )
    assert entry["reason"] == "TrainerFailed" and entry["logsConfigMap"] == f"{job}-trainer-logs-1", entry
    pods = {p["rank"]: p for p in entry["pods"]}
    assert pods[1]["name"] == deleted, entry  # named, though the pod may be long gone
    cm = e2e.json("get", "configmap", f"{job}-trainer-logs-1")
    assert cm["metadata"]["ownerReferences"][0]["name"] == job
    data = cm["data"]
    assert f"pod {deleted}" in data["summary"], data["summary"]
    kept = {}
    for rank in (0, 1):
        text = data[f"rank-{rank}.trainer.log"]
        kept[rank] = "text" if TRAINER_LINE.search(text) else text
        if not TRAINER_LINE.search(text):
            # Not read: only because its pod was gone (never forbidden, never a bad request).
            assert text.startswith(UNAVAILABLE) and pods[rank]["phase"] == "Gone", (rank, text, pods[rank])
            assert f"pod {pods[rank]['name']} " in text and "before the operator could read its log" in text
    e2e.note(f"{job}-trainer-logs-1: rank 0 {kept[0]!r}; rank 1 (deleted) {kept[1]!r}; history {pods}")


def assert_released(e2e: E2E, name: str) -> None:
    """Nothing of a finished job runs: Deployments at zero, no pod Running or Pending."""
    for deployment in e2e.json("get", "deployments", "-l", f"echorl.dev/job={name}")["items"]:
        assert deployment["spec"]["replicas"] == 0, deployment["metadata"]["name"]
    live = [
        p["metadata"]["name"]
        for p in e2e.pods(f"echorl.dev/job={name}")
        if p["status"].get("phase") in ("Running", "Pending")
    ]
    assert live == [], live


def test_a_job_trains_to_succeeded_and_releases_everything(e2e: E2E) -> None:
    """kubectl apply → pods Running → version advancing → kubectl scale the pool → Succeeded."""
    swarm = {
        "apiVersion": "echorl.dev/v1alpha1",
        "kind": "InferenceSwarm",
        "metadata": {"name": "cpu-pool"},
        "spec": {
            "backend": "transformers",
            "device": "cpu",
            "replicas": 2,
            "threads": 1,
            "resources": RESOURCES,
        },
    }
    # Long enough that the third worker's pod (image start, torch import) registers before the job ends:
    # on an idle machine the tiny model trains ~1 step/s.
    job = echojob("quick", max_steps=150, inferenceSwarms=[{"name": "cpu", "swarmRef": "cpu-pool"}])
    manifest = yaml.safe_dump_all([swarm, job], sort_keys=False)
    e2e.apply(manifest, server_side=True)  # as Argo CD and Flux apply
    e2e.until("the job's pods Running", lambda: len(running(e2e, "echorl.dev/job=quick")) >= 4)
    e2e.note(f"pods running: {[p['metadata']['name'] for p in running(e2e, 'echorl.dev/job=quick')]}")
    first = e2e.until("a first policy version", lambda: e2e.version("quick") or None)
    wide = e2e.kubectl("get", "echojob", "quick", "-o", "wide")
    e2e.note(f"kubectl get echojob -o wide:\n{wide}")
    assert "quick" in wide and "Async" in wide
    # Argo CD's health check, on the object the operator really wrote.
    e2e.until("Argo CD: Healthy while training", lambda: e2e.health("quick")[0] == "Healthy")

    # GitOps: the same manifests again, server-side, change nothing: no diff, no field-manager
    # conflict with the operator, no new generation of the job or of anything it made.
    def generations() -> dict[str, Any]:
        objs = e2e.json("get", "echojob,inferenceswarm,deploy,job", "-l", "echorl.dev/job=quick")["items"]
        objs += [e2e.job("quick"), e2e.json("get", "inferenceswarm", "cpu-pool")]
        return {f"{o['kind']}/{o['metadata']['name']}": o["metadata"].get("generation") for o in objs}

    before = generations()
    diff = e2e.cluster.kubectl("-n", e2e.namespace, "diff", "--server-side", "-f", "-", input=manifest)
    assert diff.returncode == 0, f"a server-side diff of the same manifests:\n{diff.stdout}{diff.stderr}"
    e2e.apply(manifest, server_side=True)
    assert generations() == before
    e2e.note(f"re-applied server-side: no diff, generations unchanged ({len(before)} objects)")
    # kubectl scale on the pool's scale subresource: the coordinator sees a third worker.
    e2e.kubectl("scale", "inferenceswarm/cpu-pool", "--replicas=3")
    e2e.until(
        "three workers registered",
        lambda: (
            next((p["workers"] for p in e2e.job("quick")["status"]["pools"] if p["name"] == "cpu"), 0) >= 3
        ),
    )
    later = e2e.until("the version advancing", lambda: (v := e2e.version("quick")) > first and v)
    e2e.note(f"policy version {first} → {later}; three workers")
    # The images preload jemalloc (images/README.md): the workers and the trainer say what they run on.
    jemalloc = re.compile(
        r"memory allocator: jemalloc \(/usr/lib/\S*libjemalloc\.so\.2\)"
    )  # the link's target
    worker = running(e2e, "echorl.dev/job=quick,echorl.dev/pool=cpu")[0]["metadata"]["name"]
    assert jemalloc.search(e2e.kubectl("logs", worker)), worker
    done = e2e.wait_condition("quick", "Succeeded")
    assert done["status"] == "True" and done["reason"] == "TrainingCompleted", done
    assert e2e.health("quick")[0] == "Healthy", e2e.health("quick")
    status = e2e.job("quick")["status"]
    e2e.note(f"Succeeded: {done['message']}; completionTime {status.get('completionTime')}")
    assert status["completionTime"] and status["startTime"]
    assert status["policyVersion"] == 150
    assert status["maxObservedStaleness"] is not None and status["maxObservedStaleness"] <= 2
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["StalenessBounded"]["status"] == "True"
    assert conditions["Progressing"]["reason"] == "Completed"
    assert "Failed" not in conditions
    e2e.until("every pod released", lambda: assert_released(e2e, "quick") is None)
    assert_released(e2e, "quick")
    trainer = e2e.json("get", "job", "quick-trainer")
    assert trainer["status"].get("succeeded") == 1  # the finished trainer Job stays, with its pods' logs
    assert jemalloc.search(e2e.kubectl("logs", "job/quick-trainer"))
    # The snapshots stay in the store, up to the final version and its checkpoint.
    store = e2e.store("quick/")
    assert max(published(store, "quick")) == 150
    assert max(published(store, "quick", "checkpoints")) == 150


def test_deleting_a_worker_the_trainer_the_coordinator_and_the_operator_leader_mid_run_still_succeeds(
    e2e: E2E,
) -> None:
    """The trainer is a sharded gang of two pods (FSDP, one rank each): the pod of rank 1 is deleted, and
    the operator restarts both ranks, which resume from the checkpoint the two wrote shard by shard. Then
    the operator replica that leads is killed: the other takes the Lease over and finishes the job."""
    trainer = {"nodes": 2, "strategy": "FSDP", "threads": 1, "checkpointInterval": 5, "resources": RESOURCES}
    # Enough versions for four disruptions, each waited out, on a quiet machine too (60 ran out there).
    steps = 200
    e2e.apply(echojob("restarts", max_steps=steps, ttlSecondsAfterFinished=5, trainingSwarm=trainer))
    e2e.until("version 3", lambda: e2e.version("restarts") >= 3)
    ranks = running(e2e, "echorl.dev/job=restarts,echorl.dev/component=trainer")
    assert len(ranks) == 2, [p["metadata"]["name"] for p in ranks]

    def delete_one(component: str, extra: str = "") -> str:
        selector = f"echorl.dev/job=restarts,echorl.dev/component={component}{extra}"
        (pod,) = running(e2e, selector)[:1]
        name = str(pod["metadata"]["name"])
        e2e.kubectl("delete", "pod", name, "--wait=false")
        at = e2e.version("restarts")
        e2e.note(f"deleted {component} pod {name} at policy version {at}")
        # Replaced (a new pod Running), and the job keeps training past where it was.
        e2e.until(
            f"a new {component} pod",
            lambda: [p for p in running(e2e, selector) if p["metadata"]["name"] != name],
        )
        e2e.until(
            f"training past version {at} after the {component} restart",
            lambda: e2e.version("restarts") > at + 2,
        )
        return name

    def lease_holder() -> str:
        lease = json.loads(e2e.kubectl("-n", "echorl-system", "get", "lease", "echorl-operator", "-o", "json",
                                       namespaced=False))  # fmt: skip
        return str(lease["spec"].get("holderIdentity") or "")

    def kill_the_operator_leader() -> None:
        # Killed, not stopped: no time to release the Lease, so the other replica waits out its 15 s.
        leader = lease_holder()
        at = e2e.version("restarts")
        killed = time.monotonic()
        e2e.kubectl("-n", "echorl-system", "delete", "pod", leader, "--grace-period=0", "--force",
                    "--wait=false", namespaced=False)  # fmt: skip
        new = e2e.until(
            "the other operator replica leads", lambda: (h := lease_holder()) != leader and h, every=0.5
        )
        e2e.note(
            f"operator leader {leader} killed at version {at}: {new} leads after {time.monotonic() - killed:.1f} s"
        )
        # status.policyVersion is the operator's to write: it moves on only through the new leader.
        e2e.until("status written by the new leader", lambda: e2e.version("restarts") > at + 2)

    delete_one("inference")
    deleted = delete_one("trainer", ",batch.kubernetes.io/job-completion-index=1")
    assert_trainer_logs_kept(e2e, "restarts", deleted)
    delete_one("coordinator")
    kill_the_operator_leader()
    done = e2e.wait_condition("restarts", "Succeeded")
    status = e2e.job("restarts")["status"]
    e2e.note(f"Succeeded after restarts: {done['message']}; status.restarts {status['restarts']}")
    # A deleted trainer pod is a counted failure, as for a Kubernetes Job; its gang was restarted.
    assert status["restarts"] == 1
    assert [e["restart"] for e in status["trainerHistory"]] == [1]  # a finished trainer is not a stop
    assert status["maxObservedStaleness"] <= 2
    # The store: every version 1..steps once, published in order, none overwritten or repeated.
    versions = published(e2e.store("restarts/"), "restarts")
    assert sorted(versions) == list(range(1, steps + 1))
    created = [versions[v].created for v in sorted(versions)]
    assert created == sorted(created)
    cut_short = [v for v, p in versions.items() if p.folders - {p.data}]
    assert len(cut_short) <= 1, cut_short  # at most the publish the trainer was killed in
    # Checkpoints written shard by shard: each rank uploaded its own part.
    objects = e2e.store("restarts/")
    last = max(published(objects, "restarts", "checkpoints"))
    files = {f["name"] for f in objects[f"restarts/checkpoints/{last}/manifest.json"]["files"]}
    assert {"state/__0_0.distcp", "state/__1_0.distcp", "state/metadata.dcp"} <= files, files
    # ttlSecondsAfterFinished: the children go, the EchoJob and its status stay.
    e2e.until(
        "children deleted by the TTL",
        lambda: (
            not e2e.kubectl(
                "get", "deploy,job,svc,cm,secret", "-l", "echorl.dev/job=restarts", "-o", "name"
            ).strip()
        ),
    )
    assert e2e.condition("restarts", "Succeeded")["status"] == "True"


def test_suspend_releases_every_pod_and_resume_continues_from_the_checkpoint(e2e: E2E) -> None:
    e2e.apply(echojob("pause", max_steps=200))
    e2e.until("version 6", lambda: e2e.version("pause") >= 6)
    e2e.kubectl("patch", "echojob", "pause", "--type=merge", "-p", '{"spec": {"suspend": true}}')
    e2e.wait_condition("pause", "Suspended")
    e2e.until("every pod gone", lambda: not e2e.pods("echorl.dev/job=pause") and True)
    # The store, not the status: the status lags it by up to a status interval, and a new coordinator
    # reports what the store holds at once.
    at = max(published(e2e.store("pause/"), "pause"))
    checkpoint = max(published(e2e.store("pause/"), "pause", "checkpoints"))
    e2e.note(f"suspended at version {at}, checkpoint {checkpoint}; no pods")
    assert e2e.condition("pause", "Ready")["reason"] == "Suspended"
    assert e2e.health("pause")[0] == "Suspended", e2e.health("pause")
    e2e.kubectl("patch", "echojob", "pause", "--type=merge", "-p", '{"spec": {"suspend": false}}')
    e2e.until("training past the suspension", lambda: max(published(e2e.store("pause/"), "pause")) > at + 2)
    # The new trainer started from the store: at least the checkpoint it had, at most what was published.
    logs = e2e.kubectl("logs", "job/pause-trainer")
    resumed = re.search(r"resuming at version (\d+)", logs)
    assert resumed, logs[:2000]
    e2e.note(f"resumed: {resumed.group(0)}")
    assert checkpoint <= int(resumed.group(1)) <= max(published(e2e.store("pause/"), "pause"))
    versions = published(e2e.store("pause/"), "pause")
    assert sorted(versions) == list(range(1, max(versions) + 1))
    e2e.kubectl("delete", "echojob", "pause", "--wait=true", "--timeout=180s")


def test_a_trainer_that_keeps_failing_fails_the_job_with_its_log(e2e: E2E) -> None:
    job = echojob("broken", max_steps=20, backoffLimit=1)
    job["spec"]["trainingSwarm"]["image"] = e2e.cluster.images["test-failing-trainer"]
    e2e.apply(job)
    failed = e2e.wait_condition("broken", "Failed")
    e2e.note(f"Failed: {failed['reason']}: {failed['message']}")
    assert failed["status"] == "True" and failed["reason"] == "BackoffLimitExceeded"
    assert "exited with code 1" in failed["message"]
    assert "RuntimeError: injected trainer failure" in failed["message"]  # the last lines of its log
    status = e2e.job("broken")["status"]
    assert status["restarts"] == 2  # the first failure was retried, the second one exceeded the limit
    assert {c["type"]: c["status"] for c in status["conditions"]}["Degraded"] == "True"
    health, message = e2e.health("broken")
    assert health == "Degraded" and "BackoffLimitExceeded" in message, (health, message)
    e2e.until("every pod released", lambda: assert_released(e2e, "broken") is None)
    reasons = e2e.kubectl(
        "get", "events", "--field-selector=involvedObject.name=broken", "-o", "jsonpath={.items[*].reason}"
    )
    assert "TrainerFailed" in reasons and "JobFailed" in reasons


def test_pools_land_on_their_own_simulated_nodes_a_pool_with_no_node_is_pending_and_gc_cleans_up(
    e2e: E2E,
) -> None:
    """kwok GPU and Apple-Silicon nodes beside the real one; the real scheduler places each pool."""
    nodes = {
        "gpu-node-0": (
            {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "echorl.dev/accelerator": "nvidia"},
            "nvidia.com/gpu",
            {"nvidia.com/gpu": "8"},
        ),
        "gpu-node-1": (
            {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "echorl.dev/accelerator": "nvidia"},
            "nvidia.com/gpu",
            {"nvidia.com/gpu": "8"},
        ),
        "mac-node-0": (
            {"echorl.dev/accelerator": "apple-silicon", "kubernetes.io/arch": "arm64"},
            "echorl.dev/apple-silicon",
            {},
        ),
    }
    for name, (labels, taint, extra) in nodes.items():
        capacity = {"cpu": "32", "memory": "256Gi", "pods": "110", **extra}
        e2e.apply(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "annotations": {"kwok.x-k8s.io/node": "fake"},
                    "labels": {
                        "type": "kwok",
                        "kubernetes.io/hostname": name,
                        "kubernetes.io/os": "linux",
                        **labels,
                    },
                },
                "spec": {"taints": [{"key": taint, "value": "present", "effect": "NoSchedule"}]},
                "status": {"capacity": capacity, "allocatable": capacity},
            }
        )
    try:
        e2e.until("kwok's nodes Ready", lambda: all(
            {c["type"]: c["status"] for c in e2e.cluster.kubectl_json("get", "node", n)["status"].get("conditions", [])}.get("Ready") == "True"
            for n in nodes
        ))  # fmt: skip
        gpu_pool = {
            "name": "gpu", "backend": "vllm", "device": "cuda", "replicas": 2,
            "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        }  # fmt: skip
        mac_pool = {
            "name": "mac", "backend": "mlx", "device": "cpu", "replicas": 1,
            "affinity": {"nodeAffinity": {"required": [{"matchExpressions": [
                {"key": "echorl.dev/accelerator", "operator": "In", "values": ["apple-silicon"]}]}]}},
            "tolerations": [{"key": "echorl.dev/apple-silicon", "operator": "Exists", "effect": "NoSchedule"}],
        }  # fmt: skip
        nowhere = {
            "name": "tpu",
            "replicas": 1,
            "nodeSelector": {"cloud.google.com/gke-tpu-accelerator": "tpu-v5"},
        }
        cpu_pool = {"name": "cpu", "replicas": 1, "threads": 1, "resources": RESOURCES}
        e2e.apply(echojob("hetero", max_steps=500, inferenceSwarms=[cpu_pool, gpu_pool, mac_pool, nowhere]))

        def placed() -> dict[str, list[str]] | None:
            pods = e2e.pods("echorl.dev/job=hetero")
            by_pool: dict[str, list[str]] = {}
            for pod in pods:
                pool = (
                    pod["metadata"]["labels"].get("echorl.dev/pool")
                    or pod["metadata"]["labels"]["echorl.dev/component"]
                )
                if pod["status"].get("phase") == "Running":
                    by_pool.setdefault(pool, []).append(pod["spec"]["nodeName"])
            want = {"cpu": 1, "gpu": 2, "mac": 1, "coordinator": 1, "trainer": 1}
            return by_pool if all(len(by_pool.get(k, [])) >= n for k, n in want.items()) else None

        where = e2e.until("every placeable pod Running", placed)
        e2e.note(f"placement: {where}")
        real = e2e.cluster.node_name
        assert set(where["gpu"]) <= {"gpu-node-0", "gpu-node-1"}
        assert where["mac"] == ["mac-node-0"]
        assert where["cpu"] == [real] and where["coordinator"] == [real] and where["trainer"] == [real]
        # Only the real node's pods run for real: containerd has sandboxes for them and no others.
        sandboxes = e2e.cluster.crictl("pods", "--namespace", e2e.namespace, "-o", "json").stdout
        assert "hetero-gpu" not in sandboxes and "hetero-mac" not in sandboxes and "hetero-cpu" in sandboxes
        # The pool whose nodeSelector matches no node: the job says which pool and why.
        ready = e2e.until(
            "the Pending pool reported",
            lambda: (c := e2e.condition("hetero", "Ready")).get("reason") == "PoolPending" and c,
        )
        e2e.note(f"Ready: {ready['reason']}: {ready['message']}")
        assert "pool tpu" in ready["message"] and "didn't match" in ready["message"]
        pools = {p["name"]: p for p in e2e.job("hetero")["status"]["pools"]}
        assert pools["tpu"]["pending"] == 1
        # Deleting the EchoJob: the real garbage collector removes every child.
        children = e2e.kubectl(
            "get", "deploy,job,svc,cm,secret", "-l", "echorl.dev/job=hetero", "-o", "name"
        ).split()
        assert len(children) >= 10, children
        e2e.kubectl("delete", "echojob", "hetero", "--wait=true", "--timeout=180s")
        e2e.until("every child garbage-collected", lambda: not e2e.kubectl(
            "get", "deploy,job,svc,cm,secret,pods", "-l", "echorl.dev/job=hetero", "-o", "name").strip())  # fmt: skip
    finally:
        e2e.kubectl("delete", "node", *nodes, "--wait=false", namespaced=False, check=False)


def test_pod_templates_reach_the_pods_and_a_pool_shares_a_model_cache_pvc(e2e: E2E) -> None:
    """podTemplate as a cluster admin writes it: the real admission, scheduler, kubelet and PV binder."""
    cache = e2e.cluster.workdir / f"pv-{e2e.namespace}"
    cache.mkdir()
    cache.chmod(0o777)  # a hostPath volume is not chowned to the pod's fsGroup
    cluster_wide = [
        {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": f"{e2e.namespace}-high"}, "value": 100000},
        {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": f"{e2e.namespace}-runc"}, "handler": "runc"},
        {
            "apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": f"{e2e.namespace}-models"},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"], "storageClassName": "",
                     "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": str(cache)}},
        },
    ]  # fmt: skip
    for obj in cluster_wide:
        e2e.kubectl("apply", "-f", "-", input=yaml.safe_dump(obj), namespaced=False)
    try:
        for obj in [
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "echorl-workers"}},
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "worker-env"}, "data": {"GREETING": "hello"}},
            {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "extra-files"}, "data": {"a.txt": "extra"}},
            {
                "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "model-cache"},
                "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": f"{e2e.namespace}-models",
                         "resources": {"requests": {"storage": "1Gi"}}},
            },
        ]:  # fmt: skip
            e2e.apply(obj)
        pool_template = {
            "metadata": {"labels": {"team": "rl"}, "annotations": {"example.com/owner": "rl-team"}},
            "spec": {
                "serviceAccountName": "echorl-workers",
                "priorityClassName": f"{e2e.namespace}-high",
                "runtimeClassName": f"{e2e.namespace}-runc",
                "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 10, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                                       "labelSelector": {"matchLabels": {"echorl.dev/pool": "cpu"}}}}]}},
                "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                                               "whenUnsatisfiable": "ScheduleAnyway"}],
                "volumes": [{"name": "models", "persistentVolumeClaim": {"claimName": "model-cache"}},
                            {"name": "extra", "configMap": {"name": "extra-files"}}],
                "containers": [{"name": "worker", "env": [{"name": "TEAM", "value": "rl"}],
                                "envFrom": [{"configMapRef": {"name": "worker-env"}}],
                                "volumeMounts": [{"name": "models", "mountPath": "/cache"},
                                                 {"name": "extra", "mountPath": "/etc/extra", "readOnly": True}]}],
            },
        }  # fmt: skip
        trainer_template = {
            "metadata": {"labels": {"team": "rl"}},
            "spec": {"priorityClassName": f"{e2e.namespace}-high"},
        }
        e2e.apply(
            echojob(
                "templated",
                max_steps=20,
                trainingSwarm={"threads": 1, "checkpointInterval": 5, "resources": RESOURCES, "podTemplate": trainer_template},
                inferenceSwarms=[{"name": "cpu", "replicas": 1, "threads": 1, "resources": RESOURCES, "podTemplate": pool_template}],
            )
        )  # fmt: skip
        # The pool is scaled to zero once the job succeeds: read its pod while it runs.
        (worker, *_) = e2e.until(
            "the templated worker Running",
            lambda: running(e2e, "echorl.dev/job=templated,echorl.dev/pool=cpu"),
        )
        done = e2e.wait_condition("templated", "Succeeded")
        e2e.note(f"Succeeded with pod templates: {done['message']}")
        meta, spec = worker["metadata"], worker["spec"]
        assert meta["labels"]["team"] == "rl" and meta["labels"]["echorl.dev/job"] == "templated"
        assert meta["annotations"]["example.com/owner"] == "rl-team"
        assert (
            spec["serviceAccountName"] == "echorl-workers"
            and spec["runtimeClassName"] == f"{e2e.namespace}-runc"
        )
        assert spec["priority"] == 100000  # the Priority admission plugin resolved the class
        (container,) = spec["containers"]
        assert {"name": "TEAM", "value": "rl"} in container["env"]
        assert container["envFrom"] == [{"configMapRef": {"name": "worker-env"}}]
        claims = [
            v["persistentVolumeClaim"]["claimName"] for v in spec["volumes"] if "persistentVolumeClaim" in v
        ]
        assert claims == ["model-cache"]
        pvc = e2e.json("get", "pvc", "model-cache")
        assert pvc["status"]["phase"] == "Bound"
        # The worker wrote its snapshot cache through the claim: the files are on the volume.
        written = [p for p in cache.rglob("*") if p.is_file()]
        e2e.note(
            f"model-cache volume holds {len(written)} file(s), e.g. {sorted(str(p.relative_to(cache)) for p in written)[:3]}"
        )
        assert written
        (trainer,) = e2e.pods("echorl.dev/job=templated,echorl.dev/component=trainer")
        assert trainer["metadata"]["labels"]["team"] == "rl" and trainer["spec"]["priority"] == 100000
    finally:
        for obj in cluster_wide:
            e2e.kubectl(
                "delete",
                obj["kind"],
                obj["metadata"]["name"],
                "--ignore-not-found",
                "--wait=false",
                namespaced=False,
            )


def test_a_shared_swarm_scales_its_total_over_the_jobs_using_it(e2e: E2E) -> None:
    """Two jobs on one InferenceSwarm: its replicas are the pods of both, in spec and in status."""
    swarm = {"backend": "transformers", "device": "cpu", "replicas": 3, "threads": 1, "resources": RESOURCES}
    e2e.apply(
        {
            "apiVersion": "echorl.dev/v1alpha1",
            "kind": "InferenceSwarm",
            "metadata": {"name": "shared"},
            "spec": swarm,
        }
    )
    for name in ("share-a", "share-b"):
        e2e.apply(echojob(name, max_steps=100_000, inferenceSwarms=[{"name": "cpu", "swarmRef": "shared"}]))

    def workers() -> dict[str, int]:
        pods = running(e2e, "echorl.dev/inference-swarm=shared")
        return {
            job: sum(p["metadata"]["labels"]["echorl.dev/job"] == job for p in pods)
            for job in ("share-a", "share-b")
        }

    def scale_reads(total: int) -> dict[str, Any] | None:
        scale = e2e.json("get", "inferenceswarm/shared", "--subresource=scale")
        both = scale["spec"].get("replicas") == total and scale["status"].get("replicas") == total
        return scale if both and sum(workers().values()) == total else None

    scale = e2e.until(
        "3 worker pods over the two jobs, as the scale subresource says", lambda: scale_reads(3)
    )
    e2e.note(f"replicas 3: workers per job {workers()}; scale {scale['spec']} / {scale['status']}")
    assert sorted(workers().values()) == [1, 2]
    e2e.kubectl("scale", "inferenceswarm/shared", "--replicas=2")
    e2e.until(
        "2 worker pods, one per job", lambda: scale_reads(2) and workers() == {"share-a": 1, "share-b": 1}
    )
    e2e.note(f"kubectl scale --replicas=2: workers per job {workers()}")

    # The real HPA controller (kube-controller-manager) on the swarm's scale subresource, fed by
    # metrics-server with the worker pods' real CPU use. Its target is far below what a generating
    # worker uses, so it scales to maxReplicas: the pods of both jobs together are what it set, and
    # what the scale subresource reports back, so it settles there instead of running away.
    cpu_target = {"type": "Utilization", "averageUtilization": 5}
    e2e.apply(
        {
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "shared"},
            "spec": {
                "scaleTargetRef": {
                    "apiVersion": "echorl.dev/v1alpha1",
                    "kind": "InferenceSwarm",
                    "name": "shared",
                },
                "minReplicas": 2,
                "maxReplicas": 4,
                "metrics": [{"type": "Resource", "resource": {"name": "cpu", "target": cpu_target}}],
                "behavior": {"scaleDown": {"stabilizationWindowSeconds": 0}},
            },
        }
    )

    def hpa_at(replicas: int) -> dict[str, Any] | None:
        status: dict[str, Any] = e2e.json("get", "hpa/shared")["status"]
        reading = any(
            c["type"] == "ScalingActive" and c["status"] == "True" for c in status.get("conditions", [])
        )
        return (
            status
            if reading and status.get("desiredReplicas") == replicas and scale_reads(replicas)
            else None
        )

    def pods_of_swarm() -> int:  # every pod, Running or not: a run-away shows as pods, not only as Running
        return sum(
            not p["metadata"].get("deletionTimestamp") for p in e2e.pods("echorl.dev/inference-swarm=shared")
        )

    status = e2e.until(
        "the HPA reads the pods' CPU and scales the swarm to 4 pods over both jobs",
        lambda: hpa_at(4),
        timeout=300,
    )
    used = status["currentMetrics"][0]["resource"]["current"]["averageUtilization"]
    e2e.note(f"HPA at 4: workers per job {workers()}, CPU {used} % of requests")
    assert used > 5 and sorted(workers().values()) == [2, 2]
    # Several of its 5-second syncs later it still wants 4 and there are still 4 pods: no run-away.
    for _ in range(4):
        time.sleep(6)
        status = e2e.json("get", "hpa/shared")["status"]
        assert (status.get("currentReplicas"), status.get("desiredReplicas")) == (4, 4), status
        assert pods_of_swarm() == 4 and e2e.json("get", "inferenceswarm/shared")["spec"]["replicas"] == 4
    # A target no worker reaches: it scales the swarm down to minReplicas, one worker per job.
    e2e.kubectl(
        "patch", "hpa/shared", "--type=json",
        "-p", '[{"op": "replace", "path": "/spec/metrics/0/resource/target/averageUtilization", "value": 100000}]',
    )  # fmt: skip
    e2e.until(
        "the HPA scales the swarm down to 2, one worker per job",
        lambda: hpa_at(2) and workers() == {"share-a": 1, "share-b": 1},
        timeout=300,
    )
    e2e.note(f"HPA at 2: workers per job {workers()}")
