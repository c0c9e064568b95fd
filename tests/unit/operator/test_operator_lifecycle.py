"""An EchoJob's life as a Job's: Succeeded, gang restarts counted against backoffLimit, Failed, TTL."""

from __future__ import annotations

import datetime
from typing import Any

from echo_operator import lifecycle
from echo_operator import status as status_mod


def job(
    condition: str | None = None, reason: str = "BackoffLimitExceeded", deleting: bool = False
) -> dict[str, Any]:
    obj: dict[str, Any] = {"metadata": {"name": "j-trainer", "uid": "u1"}, "status": {}}
    if condition:
        obj["status"]["conditions"] = [{"type": condition, "status": "True", "reason": reason}]
    if deleting:
        obj["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    return obj


def pod(
    name: str,
    exit_code: int,
    message: str = "",
    index: str = "0",
    at: str = "2026-12-01T00:00:01Z",
    reason: str = "Error",
) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"batch.kubernetes.io/job-completion-index": index}},
        "status": {
            "phase": "Failed" if exit_code else "Succeeded",
            "containerStatuses": [
                {
                    "state": {
                        "terminated": {
                            "exitCode": exit_code,
                            "reason": reason,
                            "message": message,
                            "finishedAt": at,
                        }
                    }
                }
            ],
        },
    }


def test_the_trainer_jobs_phase() -> None:
    assert lifecycle.trainer_phase(None) == "Missing"
    assert lifecycle.trainer_phase(job()) == "Running"
    assert lifecycle.trainer_phase(job("Complete", "CompletionsReached")) == "Complete"
    assert lifecycle.trainer_phase(job("Failed")) == "Failed"
    assert lifecycle.trainer_phase(job("Failed", deleting=True)) == "Terminating"


def test_complete_with_the_final_version_and_checkpoint_in_the_store_succeeds() -> None:
    done = lifecycle.decide("Complete", None, lifecycle.Progress(40, 40), 40, restarts=1, backoff_limit=3)
    assert (done.action, done.reason) == ("Succeed", "TrainingCompleted")
    assert "40" in done.message
    # Exited 0 without the final checkpoint: a failure, counted like any other.
    early = lifecycle.decide("Complete", None, lifecycle.Progress(40, 30), 40, restarts=0, backoff_limit=3)
    assert (early.action, early.counted) == ("Restart", True)
    assert "before maxSteps 40" in early.message
    unknown = lifecycle.decide("Complete", None, None, 40, restarts=0, backoff_limit=3)
    assert unknown.action == "Wait"


def test_failures_restart_every_rank_until_the_backoff_limit_then_the_job_fails() -> None:
    tail = "\n".join(f"line {i}" for i in range(30))
    failure = lifecycle.failure_of(
        job("Failed"),
        [pod("j-trainer-1-x", 1, tail, index="1"), pod("j-trainer-0-y", 143, at="2026-12-01T00:00:05Z")],
    )
    # The first rank that failed on its own is the one quoted, with the last lines of its log.
    assert failure.counted
    assert "j-trainer-1-x (rank 1) exited with code 1" in failure.summary
    assert failure.log_tail.splitlines() == [f"line {i}" for i in range(30 - lifecycle.TAIL_LINES, 30)]
    for restarts in range(3):
        again = lifecycle.decide("Failed", failure, None, 40, restarts=restarts, backoff_limit=3)
        assert (again.action, again.reason, again.counted) == ("Restart", "TrainerFailed", True)
        assert f"failure {restarts + 1} of backoffLimit 3" in again.message
        # The trainer Job's own BackoffLimitExceeded (it retries nothing itself) is not news on a restart.
        assert "BackoffLimitExceeded" not in again.message
    final = lifecycle.decide("Failed", failure, None, 40, restarts=3, backoff_limit=3)
    assert (final.action, final.reason) == ("Fail", "BackoffLimitExceeded")
    assert "line 29" in final.message and "exited with code 1" in final.message
    assert lifecycle.decide("Failed", failure, None, 40, restarts=0, backoff_limit=0).action == "Fail"


def test_a_disruption_says_so_and_other_job_reasons_are_quoted() -> None:
    gone = lifecycle.failure_of(job("Failed", "PodFailurePolicy"), [])
    assert not gone.counted and "disruption" in gone.summary and "pods are gone" in gone.summary
    late = lifecycle.failure_of(job("Failed", "DeadlineExceeded"), [pod("j-trainer-0-d", 1)])
    assert late.summary.endswith("the trainer Job's reason: DeadlineExceeded")


def test_an_out_of_memory_rank_fails_the_job_at_once_unless_the_spec_retries_it() -> None:
    failure = lifecycle.failure_of(job("Failed"), [pod("j-trainer-0-m", 137, "CUDA", reason="OOMKilled")])
    assert failure.oom and failure.counted
    final = lifecycle.decide("Failed", failure, None, 40, restarts=0, backoff_limit=3)
    assert (final.action, final.reason, final.counted) == ("Fail", "OOMKilled", True)
    assert "out of memory" in final.message and "oomPolicy: Retry" in final.message
    retried = lifecycle.decide("Failed", failure, None, 40, restarts=0, backoff_limit=3, oom_policy="Retry")
    assert (retried.action, retried.reason) == ("Restart", "TrainerFailed")
    # Killed with 137 for another reason (a liveness kill, kill -9) is an ordinary failure.
    plain = lifecycle.failure_of(job("Failed"), [pod("j-trainer-0-k", 137)])
    assert not plain.oom
    assert lifecycle.decide("Failed", plain, None, 40, restarts=0, backoff_limit=3).action == "Restart"


def test_the_deadline_counts_from_the_start_or_the_last_resume() -> None:
    t0 = datetime.datetime(2026, 12, 1, tzinfo=datetime.UTC)
    started = {"startTime": "2026-12-01T00:00:00Z"}
    assert lifecycle.past_deadline(None, started, t0 + datetime.timedelta(days=9)) is None
    assert lifecycle.past_deadline(60, started, t0 + datetime.timedelta(seconds=59)) is None
    over = lifecycle.past_deadline(60, started, t0 + datetime.timedelta(seconds=61))
    assert over is not None and (over.action, over.reason, over.counted) == (
        "Fail",
        "DeadlineExceeded",
        False,
    )
    assert "activeDeadlineSeconds 60" in over.message
    # Suspended for an hour and resumed at 01:00: the clock restarts there.
    resumed = {
        **started,
        "conditions": [
            {"type": "Suspended", "status": "False", "lastTransitionTime": "2026-12-01T01:00:00Z"}
        ],
    }
    assert lifecycle.deadline_start(resumed) == "2026-12-01T01:00:00Z"
    assert lifecycle.past_deadline(60, resumed, t0 + datetime.timedelta(seconds=3630)) is None
    assert lifecycle.past_deadline(60, resumed, t0 + datetime.timedelta(seconds=3661)) is not None
    # Never started (queued from the first): nothing counts yet.
    assert lifecycle.past_deadline(60, {}, t0) is None


def test_disruptions_restart_without_counting() -> None:
    evicted = lifecycle.failure_of(job("Failed", reason="PodFailurePolicy"), [pod("j-trainer-0-z", 137)])
    assert not evicted.counted
    decision = lifecycle.decide("Failed", evicted, None, 40, restarts=3, backoff_limit=3)
    assert (decision.action, decision.reason, decision.counted) == ("Restart", "TrainerDisrupted", False)


def test_a_failed_job_whose_pods_were_deleted_says_so() -> None:
    gone = {
        "metadata": {"name": "j-trainer-0-q", "deletionTimestamp": "2026-12-01T00:00:00Z"},
        "status": {"phase": "Running"},
    }
    failure = lifecycle.failure_of(job("Failed"), [gone])
    assert failure.counted and "j-trainer-0-q deleted" in failure.summary


def test_outcome_is_read_back_from_status_and_ttl_counts_from_its_time() -> None:
    assert lifecycle.outcome_of({"conditions": [{"type": "Ready", "status": "True"}]}) is None
    status = {
        "conditions": [
            {"type": "Succeeded", "status": "True", "reason": "TrainingCompleted", "message": "m",
             "lastTransitionTime": "2026-12-01T10:00:00Z"}
        ]
    }  # fmt: skip
    outcome = lifecycle.outcome_of(status)
    assert outcome is not None and (outcome.type, outcome.time) == ("Succeeded", "2026-12-01T10:00:00Z")
    at = datetime.datetime(2026, 12, 1, 10, 0, 59, tzinfo=datetime.UTC)
    assert not lifecycle.expired(outcome, 60, at)
    assert lifecycle.expired(outcome, 60, at + datetime.timedelta(seconds=1))
    assert not lifecycle.expired(outcome, None, at + datetime.timedelta(days=9))
    assert not lifecycle.expired(None, 0, at)


def test_pending_pods_are_explained_per_pool_with_the_schedulers_words() -> None:
    unschedulable = {
        "metadata": {"name": "j-big-abc", "labels": {"echorl.dev/pool": "big", "echorl.dev/component": "inference"}},
        "status": {
            "phase": "Pending",
            "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                 "message": "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector."}
            ],
        },
    }  # fmt: skip
    running = {
        "metadata": {"name": "j-cpu-1", "labels": {"echorl.dev/pool": "cpu"}},
        "status": {"phase": "Running"},
    }
    why, count = status_mod.pending([unschedulable, running])
    assert count == {"big": 1}
    assert why["big"].startswith("pod j-big-abc: Unschedulable: 0/3 nodes are available")
