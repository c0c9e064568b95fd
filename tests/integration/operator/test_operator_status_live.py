"""EchoJob status follows a real coordinator process: versions, pools, Δmax, restarts of stuck workers.

The test plays the parts envtest lacks: it starts the coordinator (``python -m echo_runtime.coordinator``,
the process the coordinator Deployment runs) from the job's own ConfigMap and tokens Secret, marks the
trainer Job's pod ready as the Job controller would report it, registers a worker with its pool's join token, and
announces policy versions as the trainer would. The operator reads the coordinator through
``ECHORL_COORDINATOR_URL`` instead of the in-cluster Service name.
"""

from __future__ import annotations

import base64
import pathlib
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from kopf.testing import KopfRunner
from operator_kit import apply, children_of, condition, eventually, get, kubectl_ok, reasons, secret_value

from echo_runtime.coordinator import client
from services.kube import KubeApiServer
from services.procs import ManagedProcess, free_ports

pytestmark = pytest.mark.services

(PORT,) = free_ports(1)
URL = f"http://127.0.0.1:{PORT}"


@pytest.fixture(scope="module")
def operator(start_operator: Callable[..., Any]) -> Iterator[KopfRunner]:
    with start_operator(ECHORL_COORDINATOR_URL=URL, ECHORL_STATUS_INTERVAL="0.3") as runner:
        yield runner


def start_coordinator(kube: KubeApiServer, ns: str, job: str, workdir: pathlib.Path) -> ManagedProcess:
    """The coordinator, from the files the operator made for its Deployment."""
    config = get(kube, ns, "configmap", f"{job}-config")["data"]["job.yaml"]
    tokens = base64.b64decode(get(kube, ns, "secret", f"{job}-tokens")["data"]["tokens.yaml"]).decode()
    (workdir / "job.yaml").write_text(config)
    (workdir / "tokens.yaml").write_text(tokens)
    proc = ManagedProcess(
        "coordinator",
        [
            sys.executable,
            "-m",
            "echo_runtime.coordinator",
            "--job",
            workdir / "job.yaml",
            "--tokens-file",
            workdir / "tokens.yaml",
            "--host",
            "127.0.0.1",
            "--port",
            str(PORT),
            "--no-store",
            "--vocab-size",
            "64",
            "--lease-timeout",
            "1.0",
            "--heartbeat-interval",
            "0.2",
        ],
        log_path=workdir / "coordinator.log",
    ).start()

    def healthy() -> bool:
        try:
            return httpx.get(f"{URL}/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    proc.wait_healthy(healthy, timeout=60)
    return proc


class Heartbeats:
    """A worker that keeps heartbeating the version in :attr:`loaded` (as a worker process would)."""

    def __init__(self, worker: client.WorkerClient) -> None:
        self.worker = worker
        self.loaded = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.worker.heartbeat(self.loaded)

    def __enter__(self) -> Heartbeats:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


JOB = """
apiVersion: echorl.dev/v1alpha1
kind: EchoJob
metadata: {{name: live}}
spec:
  model: {{path: echorl:tiny}}
  storage: {storage}
  syncPolicy: {{mode: Async, maxStaleness: 1}}
  algorithm: {{maxSteps: 50}}
  inferenceSwarms:
  - {{name: cpu, replicas: 1}}
"""


def test_status_follows_the_coordinator_and_stuck_workers_are_restarted(
    operator: KopfRunner,
    kube_apiserver: KubeApiServer,
    kube_namespace: str,
    storage_secret: str,
    storage_yaml: Callable[..., str],
    tmp_path: pathlib.Path,
) -> None:
    ns = kube_namespace
    apply(kube_apiserver, ns, JOB.format(storage=storage_yaml(ns[:40].rstrip("-") + "-live")))
    eventually(lambda: children_of(kube_apiserver, ns, "live")[("Secret", "live-tokens")])
    coordinator = start_coordinator(kube_apiserver, ns, "live", tmp_path)
    try:
        _exercise(kube_apiserver, ns)
    finally:
        coordinator.stop()
        kube_apiserver.kubectl("delete", "echojobs", "--all", "-n", ns, "--wait=false")


def _exercise(kube: KubeApiServer, ns: str) -> None:
    def waiting_for_workers() -> None:
        job = get(kube, ns, "echojob", "live")
        assert job["status"]["policyVersion"] == 0
        assert condition(job, "Progressing")["reason"] == "Training"
        assert condition(job, "StalenessBounded")["reason"] == "WithinBound"
        assert condition(job, "Ready")["reason"] == "TrainerNotReady"

    eventually(waiting_for_workers)

    # The kubelet's part: the trainer pod is ready.
    kubectl_ok(
        kube,
        "patch",
        "-n",
        ns,
        "job/live-trainer",
        "--subresource=status",
        "--type=merge",
        "-p",
        '{"status": {"active": 1, "ready": 1, "startTime": "2026-12-01T00:00:00Z"}}',
    )
    secrets = children_of(kube, ns, "live")
    pool_token = secret_value(secrets[("Secret", "live-cpu-join")], "token")
    trainer_token = secret_value(secrets[("Secret", "live-trainer-join")], "token")
    worker = client.WorkerClient(
        URL, pool_token, pool="cpu", backend="transformers", device="cpu", dtype="float32"
    )
    trainer = client.TrainerClient(URL, trainer_token)
    reply = worker.register()
    # The worker's pod, as its Deployment would have made it (named like the worker, so that the
    # operator can match the coordinator's report to it).
    pod = f"""
apiVersion: v1
kind: Pod
metadata:
  name: {reply.worker_id}
  labels: {{echorl.dev/job: live, echorl.dev/component: inference, echorl.dev/pool: cpu}}
spec:
  containers: [{{name: worker, image: ghcr.io/echorl/echorl-worker-cpu:0.1.0}}]
"""
    apply(kube, ns, pod)
    with Heartbeats(worker) as beats:

        def ready() -> None:
            job = get(kube, ns, "echojob", "live")
            assert condition(job, "Ready")["status"] == "True", condition(job, "Ready")
            (pool,) = job["status"]["pools"]
            assert (pool["workers"], pool["observedPolicyVersion"]) == (1, 0)

        eventually(ready)

        # The trainer moves on; the worker stays at version 0: beyond Δmax 1, then stuck.
        for version in (1, 2, 3):
            trainer.announce(version)

        def behind() -> None:
            job = get(kube, ns, "echojob", "live")
            assert job["status"]["policyVersion"] == 3
            cond = condition(job, "StalenessBounded")
            assert (cond["status"], cond["reason"]) == ("False", "PoolFallingBehind")
            assert "pool cpu is at policy version 0 while t_train is 3" in cond["message"]

        eventually(behind, timeout=20)

        def restarted() -> None:
            assert "WorkerRestarted" in reasons(kube, ns, "live")
            assert kube.kubectl("get", "-n", ns, f"pod/{reply.worker_id}").returncode != 0

        eventually(restarted, timeout=20)

        # The (replacement) worker loads the newest snapshot: the pool keeps up again.
        beats.loaded = 3

        def caught_up() -> None:
            job = get(kube, ns, "echojob", "live")
            cond = condition(job, "StalenessBounded")
            assert (cond["status"], cond["reason"]) == ("True", "WithinBound")
            assert job["status"]["pools"][0]["observedPolicyVersion"] == 3

        eventually(caught_up, timeout=20)
    assert {"PoolFallingBehind", "WithinBound", "AllComponentsReady"} <= reasons(kube, ns, "live")
    printed = kubectl_ok(kube, "get", "-n", ns, "echojob/live").stdout.split("\n")[1].split()
    assert printed[:4] == ["live", "Async", "1", "3"]  # NAME MODE Δmax VERSION
    worker.close()
    trainer.close()
