"""Two operator replicas for real (``python -m echo_operator``, as the Deployment runs it, with the
service account's RBAC) against the real kube-apiserver: one leads, the other waits answering its
liveness probe; the leader paused (SIGSTOP: a frozen node or process) loses the Lease, the follower
takes over and reconciles, and the old leader, woken, writes nothing and exits. The API server's
audit log is the witness: it records each replica's writes by its User-Agent.

The Lease is shortened here (4 s, renew deadline 3 s, tries every 0.5 s) so the test waits seconds;
the manifests run client-go's 15/10/2.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from operator_kit import apply, children_of, kubectl_ok, until

from services.kube import KubeApiServer
from services.procs import free_ports

pytestmark = [pytest.mark.services, pytest.mark.usefixtures("delete_jobs")]

LEASE = {"ECHORL_LEASE_DURATION": "4", "ECHORL_RENEW_DEADLINE": "3", "ECHORL_RETRY_PERIOD": "0.5"}


def job(name: str, storage: str) -> str:
    return f"""
apiVersion: echorl.dev/v1alpha1
kind: EchoJob
metadata: {{name: {name}}}
spec:
  model: {{path: echorl:tiny}}
  storage: {storage}
  inferenceSwarms: [{{name: cpu, replicas: 1}}]
"""


class Replica:
    def __init__(self, identity: str, kubeconfig: Path, log: Path, **lease: str) -> None:
        self.port, self.metrics_port = free_ports(2)
        self.identity = identity
        self.log = log
        env = {
            **os.environ,
            "KUBECONFIG": str(kubeconfig),
            "ECHORL_LEADER_ELECTION": "true",
            "POD_NAME": identity,
            "POD_NAMESPACE": "echorl-system",
            "ECHORL_STATUS_INTERVAL": "0.5",
            "ECHORL_RESYNC_INTERVAL": "3",
            "ECHORL_COORDINATOR_URL": "http://127.0.0.1:9/{job}",
            "ECHORL_METRICS_PORT": str(self.metrics_port),
            "ECHORL_METRICS_ADDRESS": "127.0.0.1",  # loopback only
            **LEASE,
            **lease,
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "echo_operator", f"--liveness=http://127.0.0.1:{self.port}/healthz"],
            env=env,
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
        )

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/healthz", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def metrics(self) -> dict[str, float]:
        """Its ``/metrics``: each sample line's name and labels → value."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            text = r.read().decode()
        return {
            line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("echorl_operator_")
        }

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@pytest.fixture
def replicas(operator_kubeconfig: Path, tmp_path: Path) -> Iterator[Callable[..., Replica]]:
    started: list[Replica] = []

    def start(identity: str, **lease: str) -> Replica:
        started.append(Replica(identity, operator_kubeconfig, tmp_path / f"{identity}.log", **lease))
        return started[-1]

    yield start
    for r in started:
        r.stop()


def holder(kube: KubeApiServer) -> str:
    proc = kube.kubectl("get", "lease", "echorl-operator", "-n", "echorl-system", "-o", "json")
    if proc.returncode != 0:
        return ""
    return str(json.loads(proc.stdout)["spec"].get("holderIdentity") or "")


def writes_by(kube: KubeApiServer, identity: str, since: str = "") -> list[dict[str, Any]]:
    """The audit events of writes made with ``identity``'s client (its User-Agent), after ``since``."""
    agent = f"echorl-operator/{identity}"
    return [
        e
        for e in kube.audit()
        if e.get("userAgent", "").startswith(agent)
        and e["stageTimestamp"] > since
        and (e.get("objectRef") or {}).get("resource") != "leases"
    ]


def test_one_replica_leads_a_paused_leader_is_replaced_and_writes_nothing_after(
    kube_apiserver: KubeApiServer,
    kube_namespace: str,
    replicas: Callable[..., Replica],
    storage_secret: str,
    bucket: str,
    storage_yaml: Callable[..., str],
) -> None:
    kube = kube_apiserver
    kubectl_ok(kube, "delete", "lease", "echorl-operator", "-n", "echorl-system", "--ignore-not-found")
    a = replicas("op-a")
    until(lambda: holder(kube) == "op-a", timeout=60)
    b = replicas("op-b")
    # The follower answers its liveness probe (kopf's endpoint is not up in it), and acts on nothing.
    until(lambda: b.healthy(), timeout=60)
    assert holder(kube) == "op-a"

    apply(kube, kube_namespace, job("first", storage_yaml(bucket)))
    until(lambda: ("Deployment", "first-coordinator") in children_of(kube, kube_namespace, "first") or None)
    ns_writes = [e for e in writes_by(kube, "op-a") if (e["objectRef"].get("namespace") == kube_namespace)]
    assert ns_writes, "the leader's writes are not in the audit log"
    assert not writes_by(kube, "op-b"), "the follower wrote"
    # Both serve /metrics; only the leader reconciles.
    reconciled = 'echorl_operator_reconciles_total{kind="EchoJob",result="ok"}'
    led = until(lambda: (m := a.metrics()).get(reconciled, 0) >= 1 and m)  # counted once the call returns
    followed = b.metrics()
    assert led["echorl_operator_leader"] == 1.0 and followed["echorl_operator_leader"] == 0.0
    assert reconciled not in followed
    assert led['echorl_operator_jobs{phase="Running"}'] == 1.0
    assert led['echorl_operator_api_requests_total{code="200",verb="GET"}'] >= 1
    assert led['echorl_operator_status_writes_total{kind="EchoJob"}'] >= 1

    # The leader freezes. The follower takes the Lease once 4 s pass on its own clock without a renewal.
    paused = time.monotonic()
    a.proc.send_signal(signal.SIGSTOP)
    until(lambda: holder(kube) == "op-b", timeout=60)
    takeover = time.monotonic() - paused
    print(f"takeover after the leader froze: {takeover:.1f} s (Lease 4 s, tries every 0.5 s)")
    assert takeover >= 3.0  # never before the old leader's renew deadline (3 s) had passed

    apply(kube, kube_namespace, job("second", storage_yaml(bucket)))
    until(lambda: ("Deployment", "second-coordinator") in children_of(kube, kube_namespace, "second") or None)
    first_of_b = min(e["stageTimestamp"] for e in writes_by(kube, "op-b"))
    assert b.metrics()["echorl_operator_leader"] == 1.0

    # The old leader wakes: past its renew deadline, it writes nothing more and ends (its pod would restart
    # as a follower).
    a.proc.send_signal(signal.SIGCONT)
    assert a.proc.wait(30) == 1
    assert "lost leadership" in a.log.read_text()
    late = writes_by(kube, "op-a", since=first_of_b)
    assert late == [], f"the old leader wrote after the new one began: {late}"
    assert holder(kube) == "op-b"
    assert b.proc.poll() is None, b.log.read_text()[-3000:]


def test_a_leader_that_stops_cleanly_hands_over_at_once(
    kube_apiserver: KubeApiServer, replicas: Callable[..., Replica]
) -> None:
    kube = kube_apiserver
    kubectl_ok(kube, "delete", "lease", "echorl-operator", "-n", "echorl-system", "--ignore-not-found")
    # A Lease of 120 s: had the leader not released it, the follower would wait two minutes.
    slow = {"ECHORL_LEASE_DURATION": "120", "ECHORL_RENEW_DEADLINE": "60"}
    a = replicas("op-c", **slow)
    until(lambda: holder(kube) == "op-c", timeout=60)
    b = replicas("op-d", **slow)
    until(lambda: b.healthy(), timeout=60)
    stopped = time.monotonic()
    a.proc.terminate()  # a rolling update's SIGTERM: kopf stops, the Lease is released
    assert a.proc.wait(90) == 0, a.log.read_text()[-3000:]
    assert "released the Lease" in a.log.read_text()
    until(lambda: holder(kube) == "op-d", timeout=30)
    print(f"hand-over after a clean stop: {time.monotonic() - stopped:.1f} s")
