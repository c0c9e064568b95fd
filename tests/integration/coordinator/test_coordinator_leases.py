"""Leases against a real coordinator process and real worker processes killed with SIGKILL or frozen
with SIGSTOP: a dead worker's tasks go to others, and a late submission is rejected."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable

import pytest
from coordinator_procs import RunningCoordinator, SimWorker

pytestmark = pytest.mark.timeout(180)  # a hang fails fast, with a traceback

LEASE_TIMEOUT = 1.5


def wait_until(condition: Callable[[], bool], timeout: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def worker_ids(c: RunningCoordinator) -> set[str]:
    return {w.id for w in c.status().workers}


def drain(c: RunningCoordinator, groups: int) -> list[str]:
    """Pull batches as the trainer until ``groups`` groups came out; their task ids."""
    trainer = c.trainer()
    delivered: list[str] = []
    version = 0
    while len(delivered) < groups:
        batch = trainer.wait_batch(version, timeout=30)
        delivered += [g.task_id for g in batch.groups]
        version += 1
        trainer.announce(version)
    return delivered


def test_a_killed_workers_tasks_go_to_another_worker(
    coordinator_factory: Callable[..., RunningCoordinator], spawn_worker: Callable[..., SimWorker]
) -> None:
    c = coordinator_factory(
        max_staleness=4, batch_size=2, buffer_size=4, lease_timeout=LEASE_TIMEOUT, heartbeat_interval=0.3
    )
    doomed = spawn_worker(c.url, "hold", capacity=2)
    held = doomed.line()
    assert len(held["tasks"]) == 2 and worker_ids(c) == {held["worker"]}
    time.sleep(2 * LEASE_TIMEOUT)  # heartbeats keep the leases alive past the timeout
    assert worker_ids(c) == {held["worker"]}
    os.kill(doomed.popen.pid, signal.SIGKILL)
    doomed.popen.wait(timeout=10)
    wait_until(lambda: not worker_ids(c), what="the killed worker to expire")
    heir = spawn_worker(c.url, "work", capacity=2)
    submitted = {heir.line()["task"] for _ in range(4)}
    assert set(held["tasks"]) <= submitted  # re-issued first, to the live worker
    delivered = drain(c, 4)
    assert set(held["tasks"]) <= set(delivered) and len(delivered) == len(set(delivered))


def test_a_late_submission_for_an_expired_lease_is_rejected(
    coordinator_factory: Callable[..., RunningCoordinator], spawn_worker: Callable[..., SimWorker]
) -> None:
    c = coordinator_factory(
        max_staleness=4, batch_size=2, buffer_size=4, lease_timeout=LEASE_TIMEOUT, heartbeat_interval=0.3
    )
    late = spawn_worker(c.url, "late", capacity=2)
    held = late.line()
    os.kill(late.popen.pid, signal.SIGSTOP)  # frozen mid-generation: no heartbeats
    wait_until(lambda: not worker_ids(c), what="the frozen worker to expire")
    heir = spawn_worker(c.url, "work", capacity=2)
    results = [heir.line() for _ in range(2)]
    assert {r["task"] for r in results} == set(held["tasks"]) and {r["result"] for r in results} == {
        "buffered"
    }
    os.kill(late.popen.pid, signal.SIGCONT)
    late.send("submit now")
    answers = [late.line(), late.line()]
    assert {a["result"] for a in answers} == {"lease_not_held"}
    status = c.status()
    assert status.dropped_stale == 0
    delivered = drain(c, 2)
    assert sorted(delivered[:2]) == sorted(held["tasks"])  # each exactly once, from the heir
