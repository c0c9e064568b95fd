"""The client (coordinator.client): retries and backoff, error classes, re-registration, and a real
round trip over loopback HTTP against an in-process server."""

from __future__ import annotations

import threading
from collections.abc import Callable

import httpx
import pytest
from coordinator_helpers import CPU_TOKEN, TRAINER_TOKEN, answer, config

from echo_runtime import staleness
from echo_runtime.coordinator import api, client, wire

FAST = client.RetryPolicy(attempts=4, base=0.01, cap=0.02, deadline=5.0)
REGISTERED = wire.RegisterReply(
    policy_version=0,
    min_version=0,
    worker_id="w-1",
    session_key="key",
    capacity=1,
    lease_timeout_seconds=30,
    heartbeat_interval_seconds=5,
).model_dump_json(by_alias=True)


def worker(
    handler: Callable[[httpx.Request], httpx.Response] | None = None,
    retry: client.RetryPolicy = FAST,
    *,
    url: str = "http://coordinator",
    capacity: int = 1,
) -> client.WorkerClient:
    """A cpu-pool worker's client: against ``handler`` (a mock transport), or real HTTP at ``url``."""
    return client.WorkerClient(
        url,
        CPU_TOKEN,
        pool="cpu",
        backend="transformers",
        device="cpu",
        dtype="float32",
        capacity=capacity,
        retry=retry,
        transport=httpx.MockTransport(handler) if handler is not None else None,
    )


def problem(status: int, code: str, field: str) -> httpx.Response:
    return httpx.Response(status, json={"error": {"code": code, "field": field, "message": "because"}})


def test_connection_errors_and_5xx_are_retried_then_succeed() -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        if len(calls) == 1:
            raise httpx.ConnectError("refused")
        if len(calls) == 2:
            return httpx.Response(503, headers={"Retry-After": "0"})
        return httpx.Response(201, content=REGISTERED)

    w = worker(handler)
    assert w.register().worker_id == "w-1"
    assert calls == ["/v1/workers"] * 3
    assert w.worker_id == "w-1" and w.heartbeat_interval == 5


def test_retries_run_out_as_unavailable() -> None:
    sleeps: list[float] = []
    t = client.Transport(
        "http://c",
        "tok",
        retry=client.RetryPolicy(attempts=5, base=1.0, cap=4.0, deadline=None),
        transport=httpx.MockTransport(lambda r: httpx.Response(500, text="boom")),
        sleep=sleeps.append,
        seed=1,
    )
    with pytest.raises(client.Unavailable, match="after 5 attempt"):
        t.call("GET", "/healthz", wire.Health)
    assert len(sleeps) == 4 and all(0 <= s <= min(4.0, 2**i) for i, s in enumerate(sleeps))


def test_give_up_after_cuts_short_a_retry_loop_in_flight() -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        w.give_up_after(0.0)  # what Worker.stop() does when SIGTERM arrives mid-call
        return httpx.Response(503, text="restarting")

    w = worker(handler)  # FAST would try 4 times
    with pytest.raises(client.Unavailable):
        w.register()
    assert calls == ["/v1/workers"]
    w.give_up_after(30.0)  # never lengthens what was shortened
    assert w._t.retry.deadline == 0.0


def test_4xx_are_not_retried_and_name_the_field() -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        return problem(422, "invalid", "pool")

    with pytest.raises(client.Invalid) as caught:
        worker(handler).register()
    assert (caught.value.status, caught.value.field, len(calls)) == (422, "pool", 1)
    with pytest.raises(client.Unauthorized):
        worker(lambda r: problem(401, "unauthorized", "Authorization")).register()


def test_a_forgotten_worker_registers_again_and_its_submission_is_lease_lost() -> None:
    registrations = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/workers":
            registrations.append(1)
            return httpx.Response(201, content=REGISTERED.replace("w-1", f"w-{len(registrations)}"))
        if request.url.path == "/v1/workers/w-1/heartbeat":
            return problem(404, "unknown_worker", "workerId")
        if request.url.path.endswith("/heartbeat"):
            assert request.headers["X-Echo-Session"] == "key"
            assert request.headers["Authorization"] == f"Bearer {CPU_TOKEN}"
            return httpx.Response(
                200,
                content=wire.HeartbeatReply(
                    policy_version=3,
                    min_version=2,
                    load_version=3,
                    lease_timeout_seconds=30,
                    heartbeat_interval_seconds=5,
                ).model_dump_json(by_alias=True),
            )
        return problem(404, "unknown_worker", "workerId")

    w = worker(handler)
    w.register()
    assert w.heartbeat(0).load_version == 3  # re-registered as w-2 in between
    assert (w.worker_id, w.registrations) == ("w-2", 2)
    with pytest.raises(client.LeaseLost):
        w.submit("t-1", [{"completion": "1", "tokenIds": [1], "logprobs": [-1.0], "policyVersion": 0}])


def test_check_batch_is_the_trainers_own_staleness_check() -> None:
    policy = staleness.StalenessPolicy("Async", 1)
    roll = wire.RolloutOut(
        completion="",
        token_ids=[1],
        logprobs=[-1.0],
        policy_version=3,
        staleness=2,
        reward=0,
        reward_components={},
        reward_reason="",
        backend="b",
        device="d",
        dtype="t",
    )
    grp = wire.GroupOut(
        task_id="t",
        problem_id="p",
        prompt="",
        worker_id="w",
        policy_version=3,
        staleness=2,
        importance_weighted=False,
        rollouts=[roll],
    )
    with pytest.raises(client.StalenessViolation, match="exceeds maxStaleness 1"):
        client.check_batch(wire.BatchReply(ready=True, version=5, groups=[grp]), policy)
    client.check_batch(wire.BatchReply(ready=True, version=4, groups=[grp]), policy)


def test_real_round_trip_over_loopback(
    make_service: Callable[..., api.Service], serve: Callable[[api.Service], str]
) -> None:
    url = serve(make_service(config(pools=("cpu", "gpu"), batch_size=1)))
    with (
        worker(url=url, capacity=2) as w,
        client.TrainerClient(url, TRAINER_TOKEN, retry=FAST) as trainer,
    ):
        assert w.heartbeat(None).load_version == 0  # registers on first use
        waiting: list[wire.BatchReply] = []
        poll = threading.Thread(
            target=lambda: waiting.append(
                trainer.wait_batch(0, staleness.StalenessPolicy("Async", 1), timeout=10)
            )
        )
        poll.start()  # long-polls while the worker generates
        task = w.lease(1).tasks[0]
        roll = {
            "completion": answer(task.prompt),
            "tokenIds": [5, 6],
            "logprobs": [-0.2, -0.3],
            "policyVersion": 0,
        }
        assert w.submit(task.task_id, [roll, roll]).outcome == "buffered"
        assert w.submit(task.task_id, [roll, roll]).outcome == "duplicate"  # a retried submission
        poll.join(timeout=10)
        assert waiting and waiting[0].groups[0].task_id == task.task_id
        assert trainer.batch(0, wait=0).groups == waiting[0].groups  # a retried pull: the same batch
        assert trainer.announce(1).policy_version == 1
        status = trainer.status()
        assert status.consumed_groups == 1 and status.workers[0].id == w.worker_id
        stop = threading.Event()
        replies: list[wire.HeartbeatReply] = []
        beat = threading.Thread(target=w.run_heartbeats, args=(stop, lambda: 1, replies.append))
        beat.start()
        stop.set()
        beat.join(timeout=5)
        assert replies and replies[0].policy_version == 1
        w.leave()
        assert trainer.status().workers == []


def test_a_lease_long_poll_is_answered_when_a_sequential_round_opens(
    make_service: Callable[..., api.Service], serve: Callable[[api.Service], str]
) -> None:
    # No periodic re-check: only the wake-up of the round opening can answer the long-poll early.
    url = serve(make_service(config("Sequential", 0, pools=("cpu",), batch_size=2), recheck_interval=60.0))
    with (
        worker(url=url, capacity=2) as w,
        client.TrainerClient(url, TRAINER_TOKEN, retry=FAST) as trainer,
    ):
        w.register()
        assert w.lease(2).tasks == []  # Sequential: no round is open before the trainer asks
        leased: list[wire.LeaseReply] = []
        poll = threading.Thread(target=lambda: leased.append(w.lease(2, wait=25.0)))
        poll.start()
        assert trainer.batch(0, wait=0.0).ready is False  # opens the round for version 0
        poll.join(timeout=5.0)  # before the long-poll ends (25 s) and before the worker expires (10 s)
        assert not poll.is_alive(), "the lease long-poll was not woken by the round opening"
        assert len(leased[0].tasks) == 2 and all(t.min_version == 0 for t in leased[0].tasks)
        empty = w.lease(2, wait=0.3)  # nothing left this round: the long-poll ends empty at its deadline
        assert empty.tasks == [] and empty.retry_after_seconds is not None
