"""Both sync protocols end to end against a real coordinator process over loopback HTTP, driven by
worker threads and a trainer loop using the client library; and the command line's errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from coordinator_procs import POOL_TOKEN, REPO, RunningCoordinator

from echo_runtime import staleness
from echo_runtime.coordinator import client, wire

pytestmark = pytest.mark.timeout(180)  # a hang fails fast, with a traceback


def run_worker(c: RunningCoordinator, stop: threading.Event, lag: int = 0) -> None:
    """A worker thread: heartbeat, load what it is told (``lag`` versions behind, if it can), generate."""
    w = c.worker(capacity=2)
    loaded = w.register().load_version or 0
    while not stop.is_set():
        reply = w.lease(2)
        if reply.load_version is not None:
            loaded = max(loaded, reply.load_version - lag)
        for task in reply.tasks:
            answer = str(eval(task.prompt.rstrip("=")))
            roll = {
                "completion": answer,
                "tokenIds": [3, 4, 5],
                "logprobs": [-0.1, -0.2, -0.3],
                "policyVersion": loaded,
            }
            w.submit(task.task_id, [roll] * task.group_size)
        if not reply.tasks:
            stop.wait(reply.retry_after_seconds or 0.05)
        hb = w.heartbeat(loaded)
        if hb.load_version is not None:
            loaded = max(loaded, hb.load_version - lag)


def train(
    c: RunningCoordinator, policy: staleness.StalenessPolicy, steps: int, lags: tuple[int, ...] = (0, 0)
) -> list[wire.BatchReply]:
    stop = threading.Event()
    threads = [threading.Thread(target=run_worker, args=(c, stop, lag), daemon=True) for lag in lags]
    for t in threads:
        t.start()
    trainer, batches = c.trainer(), []
    try:
        for version in range(steps):
            trainer.announce(version)  # the trainer publishes version t, then asks for the batch of step t
            batches.append(trainer.wait_batch(version, policy, timeout=60))
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=10)
    return batches


@pytest.mark.parametrize("action", ["Drop", "ImportanceWeight"])
def test_async_mode(coordinator_factory: Callable[..., RunningCoordinator], action: str) -> None:
    c = coordinator_factory("Async", max_staleness=1, batch_size=2, buffer_size=6)
    policy = staleness.StalenessPolicy("Async", 1, action)  # type: ignore[arg-type]
    batches = train(c, policy, steps=6, lags=(0, 1))  # one worker always loads a version late
    delivered = [g.task_id for b in batches for g in b.groups]
    assert len(delivered) == len(set(delivered)) == 12
    status = c.status()
    assert status.mode == "Async" and status.consumed_groups == 12 and status.policy_version == 5
    assert status.max_observed_staleness is not None and status.max_observed_staleness <= 1
    assert sum(status.staleness_histogram.values()) == 12
    assert status.reward == 1.0 and status.rollouts_per_second > 0
    metrics = httpx.get(f"{c.url}/metrics").text
    assert 'echorl_coordinator_groups_consumed_total{job="job0"} 12.0' in metrics


def test_sequential_mode(coordinator_factory: Callable[..., RunningCoordinator]) -> None:
    c = coordinator_factory("Sequential", max_staleness=1, refresh=0, batch_size=2)
    policy = staleness.StalenessPolicy("Sequential", 1, "Drop", 0)
    batches = train(c, policy, steps=4)
    for batch in batches:
        assert {g.policy_version for g in batch.groups} == {batch.version}  # on-policy: refresh threshold 0
    status = c.status()
    assert status.max_observed_staleness == 0 and status.staleness_histogram == {"0": 8}
    assert status.buffer.capacity == 2


def test_the_schema_is_published(coordinator_factory: Callable[..., RunningCoordinator]) -> None:
    c = coordinator_factory()
    schema = httpx.get(f"{c.url}/openapi.json").json()
    assert schema["info"]["title"] == "Echo coordinator"
    assert "SubmitRequest" in schema["components"]["schemas"]
    assert httpx.get(f"{c.url}/docs").status_code == 200


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "runtime")}
    return subprocess.run(
        [sys.executable, "-m", "echo_runtime.coordinator", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )


def test_command_line_errors_say_what_to_fix(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(
        json.dumps(
            {
                "apiVersion": "echorl.dev/v1alpha1",
                "kind": "EchoJob",
                "metadata": {"name": "j"},
                "spec": {"inferenceSwarms": [{"name": "cpu"}, {"name": "gpu"}]},
            }
        )
    )
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({"trainer": "t" * 20, "pools": {"cpu": "c" * 20}}))
    r = run_cli("--job", str(job), "--tokens-file", str(tokens), "--vocab-size", "10", "--no-store")
    assert r.returncode == 1 and "no join token for pool(s) gpu" in r.stderr
    tokens.write_text(json.dumps({"trainer": "short", "pools": {"cpu": "c" * 20}}))
    r = run_cli("--job", str(job), "--tokens-file", str(tokens), "--vocab-size", "10", "--no-store")
    assert r.returncode == 1 and "trainer: a token needs at least 16 characters" in r.stderr
    job.write_text(
        "apiVersion: echorl.dev/v1alpha1\nkind: EchoJob\nmetadata: {name: j}\n"
        "spec: {syncPolicy: {maxStaleness: -1}}\n"
    )
    r = run_cli("--job", str(job), "--tokens-file", str(tokens))
    assert r.returncode == 1 and "spec.syncPolicy.maxStaleness" in r.stderr


def test_clients_wait_for_a_coordinator_that_is_not_up_yet(
    coordinator_factory: Callable[..., RunningCoordinator],
) -> None:
    c = coordinator_factory(start=False)
    results: list[object] = []
    t = threading.Thread(target=lambda: results.append(c.worker().heartbeat(None)))
    t.start()  # retries with backoff while the coordinator starts
    c.start()
    t.join(timeout=30)
    assert results and isinstance(results[0], wire.HeartbeatReply)
    impatient = client.TrainerClient(
        "http://127.0.0.1:9", "x" * 20, retry=client.RetryPolicy(attempts=2, base=0.01, deadline=1.0)
    )
    with pytest.raises(client.Unavailable, match="after 2 attempt"):
        impatient.status()


def test_a_hanging_verifier_stalls_neither_heartbeats_nor_leases(
    coordinator_factory: Callable[..., RunningCoordinator],
) -> None:
    """The verifier hangs in native code on one completion ("native"): the submission waits out its
    allowance (1 s per rollout + grace) and scores 0, while the same worker's heartbeats and another
    worker's leases are answered as usual, and no worker expires. Scored on the event loop, as before,
    the hang would have stopped every request for good."""
    c = coordinator_factory(
        max_staleness=2, group_size=2, lease_timeout=3.0, heartbeat_interval=0.5,
        task="misbehaving_tasks:misbehaving", extra=("--score-timeout", "1"),
    )  # fmt: skip
    other = c.worker()
    slow = client.WorkerClient(  # a reply that takes the verifier's allowance must not time out
        c.url, POOL_TOKEN, pool="cpu", backend="transformers", device="cpu", dtype="float32", timeout=30.0
    )
    c.clients.append(slow)
    slow.register()
    other.register()
    task = slow.lease(1).tasks[0]
    answer = str(eval(task.prompt.rstrip("=")))
    body = [
        {"completion": c_, "tokenIds": [1], "logprobs": [-0.5], "policyVersion": 0}
        for c_ in ("native", answer)
    ]
    reply: list[wire.SubmitReply] = []
    submitting = threading.Thread(target=lambda: reply.append(slow.submit(task.task_id, body)))
    started = time.monotonic()
    submitting.start()
    beats = 0
    while submitting.is_alive() and time.monotonic() - started < 60:
        slow.heartbeat(0)  # answered while the verifier hangs: the event loop is free
        assert other.lease(1).policy_version == 0  # answered (not stuck behind the verifier)
        beats += 1
        time.sleep(0.5)
    submitting.join(timeout=30)
    assert beats >= 4 and reply, "the submission never came back"
    assert reply[0].outcome == "buffered" and reply[0].rewards == [0.0, 0.0]
    status = c.status()
    assert status.verifier_timeouts == 2
    assert {w.id for w in status.workers} == {slow.worker_id, other.worker_id}  # nobody expired
