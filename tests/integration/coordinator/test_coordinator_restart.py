"""Restart: the coordinator recovers t_train from a real local snapshot store after SIGKILL; workers and
the trainer reconnect by themselves; leases from before the restart are rejected."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from coordinator_procs import RunningCoordinator

from echo_runtime import snapshots
from echo_runtime.coordinator import client, wire
from echo_runtime.spec import Storage

pytestmark = pytest.mark.timeout(180)  # a hang fails fast, with a traceback


def publish(store_path: Path, job: str, version: int, tmp: Path) -> None:
    payload = tmp / f"adapter-{version}.safetensors"
    payload.write_bytes(b"not really weights %d" % version)
    store = snapshots.open_store(Storage(type="Local", path=str(store_path)), job)
    store.publish(version, {"adapter_model.safetensors": payload}, kind="lora", base_model="echorl:tiny")


def group(task: wire.TaskOut, version: int) -> list[dict[str, object]]:
    answer = str(eval(task.prompt.rstrip("=")))
    return [
        {"completion": answer, "tokenIds": [1], "logprobs": [-1.0], "policyVersion": version}
    ] * task.group_size


def test_restart_recovers_t_train_and_everyone_reconnects(
    coordinator_factory: Callable[..., RunningCoordinator], tmp_path: Path
) -> None:
    c = coordinator_factory("Async", max_staleness=1, batch_size=1, use_store=True, start=False)
    for version in range(3):
        publish(c.store, c.job, version, tmp_path)
    c.start()
    assert c.status().policy_version == 2  # recovered, not 0

    worker, trainer = c.worker(), c.trainer()
    before = worker.lease(2)
    assert before.policy_version == 2 and before.tasks
    stale_task = before.tasks[0]
    submitted = worker.submit(before.tasks[1].task_id, group(before.tasks[1], 2))
    assert submitted.outcome == "buffered"  # in memory only: a restart loses it (regenerable)

    c.kill()
    publish(c.store, c.job, 3, tmp_path)  # the trainer keeps publishing while the coordinator is down
    result: list[wire.BatchReply] = []
    waiting = threading.Thread(target=lambda: result.append(trainer.wait_batch(3, timeout=60)))
    waiting.start()  # retries through the outage
    c.start()

    assert c.status().policy_version == 3 and c.status().buffer.groups == 0
    with pytest.raises(client.LeaseLost):
        worker.submit(stale_task.task_id, group(stale_task, 2))  # a lease from before the restart
    reply = worker.lease(1)  # re-registers by itself
    assert worker.registrations == 2 and reply.load_version == 3
    worker.submit(reply.tasks[0].task_id, group(reply.tasks[0], 3))
    waiting.join(timeout=60)
    assert result and result[0].ready and result[0].groups[0].policy_version == 3
    assert c.status().max_observed_staleness == 0
