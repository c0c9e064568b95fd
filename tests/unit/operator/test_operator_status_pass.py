"""The status pass's own decisions: when the coordinator is read, an InferenceSwarm's status."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import pytest

from echo_operator import lifecycle, names, status_pass
from echo_operator.children import inputs

MakeJob = Callable[..., inputs.JobInput]  # the make_job fixture (tests/unit/operator/conftest.py)

NOW = "2026-02-03T04:05:06Z"


def test_the_coordinator_is_read_only_while_the_job_runs(make_job: MakeJob) -> None:
    job = make_job()
    assert status_pass.why_unread(job, token_known=True) is None
    assert status_pass.why_unread(None, token_known=False) == "not reconciled yet"
    suspended = dataclasses.replace(job, spec=job.spec.model_copy(update={"suspend": True}))
    assert status_pass.why_unread(suspended, token_known=True) == "suspended"
    assert (
        status_pass.why_unread(dataclasses.replace(job, finished=True), token_known=True) == "the job is over"
    )


def swarm(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "cpu-pool", "generation": 4}, "spec": spec, "status": {}}


def dep(replicas: int, ready: int) -> dict[str, Any]:
    return {"status": {"replicas": replicas, "readyReplicas": ready}}


def ready_of(status: dict[str, Any]) -> tuple[str, str, str]:
    (cond,) = status["conditions"]
    assert cond["type"] == "Ready"
    return cond["status"], cond["reason"], cond["message"]


def test_a_swarm_counts_the_pods_of_every_job_using_it() -> None:
    status = status_pass.swarm_status(swarm(), [dep(2, 2), dep(3, 1)], ["a", "b"], NOW)
    assert status["replicas"] == 5
    assert status["usedBy"] == ["a", "b"]
    assert status["selector"] == f"{names.INFERENCE_SWARM}=cpu-pool"
    assert status["observedGeneration"] == 4
    assert ready_of(status) == ("False", "PodsNotReady", "3 of 5 worker pod(s) ready")
    assert status["conditions"][0]["observedGeneration"] == 4


def test_a_swarm_is_ready_when_every_pod_is() -> None:
    status = status_pass.swarm_status(swarm(), [dep(2, 2), dep(1, 1)], ["a"], NOW)
    assert ready_of(status) == ("True", "PodsReady", "3 worker pod(s) ready")


@pytest.mark.parametrize(
    ("deployments", "used_by", "spec", "expected"),
    [
        ([dep(2, 2)], [], {}, ("False", "Unused")),
        ([], ["a"], {"external": True}, ("True", "External")),
        ([], ["a"], {}, ("False", "PodsNotReady")),
        ([dep(0, 0)], ["a"], {}, ("False", "PodsNotReady")),  # scaled to zero: nothing ready
        ([dep(None, None)], ["a"], {}, ("False", "PodsNotReady")),  # type: ignore[arg-type]
    ],
)
def test_swarm_readiness(
    deployments: list[dict[str, Any]], used_by: list[str], spec: dict[str, Any], expected: tuple[str, str]
) -> None:
    assert ready_of(status_pass.swarm_status(swarm(**spec), deployments, used_by, NOW))[:2] == expected


def test_a_swarms_ready_time_is_kept_while_its_status_stays() -> None:
    before = swarm()
    before["status"] = {
        "conditions": [
            {"type": "Ready", "status": "True", "reason": "PodsReady", "lastTransitionTime": "earlier"}
        ]
    }
    status = status_pass.swarm_status(before, [dep(1, 1)], ["a"], NOW)
    assert status["conditions"][0]["lastTransitionTime"] == "earlier"
    status = status_pass.swarm_status(before, [dep(1, 0)], ["a"], NOW)
    assert status["conditions"][0]["lastTransitionTime"] == NOW


def test_an_ended_job_says_so_in_an_event_of_the_right_type() -> None:
    succeed = lifecycle.Decision("Succeed", "TrainingCompleted", "done")
    fail = lifecycle.Decision("Fail", "BackoffLimitExceeded", "failed")
    assert status_pass.outcome_event(succeed) == ("Normal", "JobSucceeded")
    assert status_pass.outcome_event(fail) == ("Warning", "JobFailed")


def test_observed_generation_is_the_last_one_applied_not_the_one_looked_at() -> None:
    assert status_pass.observed_generation(3, {"observedGeneration": 2}) == 3
    # Nothing applied in this operator run yet (it restarted, or every apply failed): keep status's.
    assert status_pass.observed_generation(None, {"observedGeneration": 2}) == 2
    assert status_pass.observed_generation(None, {}) is None


class _Settings:
    http_timeout_s = 1.0

    @staticmethod
    def status_url(name: str, namespace: str) -> str:
        return f"http://{name}.{namespace}/status"


def test_one_failed_read_is_retried_and_a_lasting_failure_is_timed(
    make_job: MakeJob, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A coordinator whose status fails to read once (a new operator's first read) is read again at
    once; only consecutive failures start the clock that Degraded waits on."""
    from echo_operator import context, observe

    answers: list[Any] = []

    def fetch_status(url: str, token: str, timeout: float) -> Any:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    monkeypatch.setattr(observe, "fetch_status", fetch_status)
    monkeypatch.setattr(status_pass, "RETRY_READ_S", 0.0)
    ctx = type("Ctx", (), {"settings": _Settings()})()
    mem = context.JobMemory(job=make_job(), status_token="t")
    answers[:] = [observe.Unreachable("connection refused"), "the document"]
    status_pass.fetch(ctx, mem, "ns", "demo")  # type: ignore[arg-type]
    assert (mem.doc, mem.doc_error, mem.doc_error_since) == ("the document", None, None)
    answers[:] = [observe.Unreachable("refused"), observe.Unreachable("refused again")]
    status_pass.fetch(ctx, mem, "ns", "demo")  # type: ignore[arg-type]
    assert mem.doc is None and mem.doc_error == "refused again" and mem.doc_error_since is not None
    since = mem.doc_error_since
    answers[:] = [observe.Unreachable("x"), observe.Unreachable("y")]
    status_pass.fetch(ctx, mem, "ns", "demo")  # type: ignore[arg-type]
    assert mem.doc_error_since == since  # the clock runs from the first of the consecutive failures
    answers[:] = ["back"]
    status_pass.fetch(ctx, mem, "ns", "demo")  # type: ignore[arg-type]
    assert (mem.doc, mem.doc_error_since) == ("back", None)


def running_status(**figures: Any) -> dict[str, Any]:
    pool = {"name": "cpu", "replicas": 2, "readyReplicas": 2, "workers": 2, "observedPolicyVersion": 7,
            "externalWorkers": [{"id": "mac", "loadedVersion": 7, "lastHeartbeat": "2026-12-01T00:00:00Z"}]}  # fmt: skip
    return {"policyVersion": 7, "reward": 0.5, "rolloutsPerSecond": 3.2, "restarts": 0, "pools": [pool],
            "conditions": [{"type": "Ready", "status": "True"}], **figures}  # fmt: skip


def test_moving_figures_are_written_at_most_every_interval_anything_else_at_once() -> None:
    before = running_status()
    figures = running_status(policyVersion=8, reward=0.6, rolloutsPerSecond=4.0)
    before["conditions"] = [
        {"type": "Ready", "status": "True"},
        {"type": "Progressing", "status": "True", "reason": "Training", "message": "policy version 7"},
        {"type": "Suspended", "status": "True", "reason": "Queued", "message": "not admitted yet"},
    ]
    figures["conditions"] = [{**c} for c in before["conditions"]]
    figures["conditions"][1]["message"] = "policy version 8 of 100; 4.0 rollouts/s"
    queued = [{**c} for c in figures["conditions"]]
    queued[2]["message"] = "insufficient unused quota for cpu in flavor f"  # Kueue's reason: not a figure
    figures["pools"][0]["externalWorkers"][0]["lastHeartbeat"] = "2026-12-01T00:00:09Z"
    now = time.monotonic()
    # Only figures moved: written if the last write is older than the interval (or never happened).
    assert status_pass.should_write(before, figures, written_at=None, interval_s=30)
    assert not status_pass.should_write(before, figures, written_at=now - 5, interval_s=30)
    assert status_pass.should_write(before, figures, written_at=now - 31, interval_s=30)
    # A condition, a pool's pods or workers, a new external worker, a restart: at once.
    for change in (
        {"conditions": queued},
        {"conditions": [{"type": "Ready", "status": "False"}]},
        {"restarts": 1},
        {"pools": [{**before["pools"][0], "readyReplicas": 1}]},
        {
            "pools": [
                {
                    **before["pools"][0],
                    "externalWorkers": [*before["pools"][0]["externalWorkers"], {"id": "pc"}],
                }
            ]
        },
    ):
        assert status_pass.should_write(before, {**figures, **change}, written_at=now - 1, interval_s=30), (
            change
        )
