"""An EchoJob's life after it starts, as a Kubernetes Job has one: pure decisions, no I/O.

The trainer runs as an indexed Job with ``backoffLimit: 0`` (:func:`echo_operator.children.trainer.trainer_job`),
so the Job controller reports the gang as a whole: every rank Complete, or Failed as soon as one rank
fails (and then stops the others). From that, and from the snapshot store, :func:`decide` chooses:

* the Job is **Complete** and the store holds the final version (``maxSteps``) and its checkpoint →
  the EchoJob **Succeeded** (``completionTime``); everything is scaled to zero, the store keeps the
  snapshots. Complete without the final version (a trainer that exited 0 too early) is a failure;
* the Job **Failed** → restart every rank together (a new Job; ``--resume`` continues from the last
  checkpoint) and count it in ``status.restarts``, unless the failure was a disruption (the Job's
  ``podFailurePolicy`` turned an eviction or preemption into reason ``PodFailurePolicy``), which is
  restarted without counting. When ``restarts`` would exceed ``spec.backoffLimit`` the EchoJob
  **Failed**, with the failed pod's exit code and the last lines of its log (its termination message,
  ``FallbackToLogsOnError``) in the condition's message.

A rank killed for running out of memory (its container's reason ``OOMKilled``) fails the EchoJob at
once with that reason unless ``spec.oomPolicy`` is ``Retry``; a job still running
``spec.activeDeadlineSeconds`` after its start or last resume (:func:`past_deadline`) fails with
``DeadlineExceeded``.

Outcomes are final, like a Job's: the job's processes stay scaled to zero, and
``ttlSecondsAfterFinished`` (:func:`expired`) later deletes its children. To run again, create a new
EchoJob (``--resume`` semantics make it continue from the store if it uses the same name and prefix).
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping, Sequence
from typing import Any, Literal

Object = dict[str, Any]
TAIL_LINES = 20
"""How many lines of a failed trainer's log go into the Failed condition's message."""


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How the job ended."""

    type: Literal["Succeeded", "Failed"]
    reason: str
    message: str
    time: str
    """RFC 3339 time it ended (``status.completionTime`` for Succeeded)."""


def outcome_of(status: Mapping[str, Any] | None) -> Outcome | None:
    """The outcome recorded in an EchoJob's ``status`` (None while it runs)."""
    for cond in (status or {}).get("conditions") or []:
        if cond.get("type") in ("Succeeded", "Failed") and cond.get("status") == "True":
            return Outcome(
                cond["type"], str(cond.get("reason", "")), str(cond.get("message", "")),
                str(cond.get("lastTransitionTime") or (status or {}).get("completionTime") or ""),
            )  # fmt: skip
    return None


def expired(outcome: Outcome | None, ttl_s: int | None, now: datetime.datetime) -> bool:
    """Whether ``ttlSecondsAfterFinished`` has passed since the job ended."""
    if outcome is None or ttl_s is None or not outcome.time:
        return False
    return (now - _time(outcome.time)).total_seconds() >= ttl_s


def _time(value: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))


def deadline_start(status: Mapping[str, Any] | None) -> str | None:
    """When ``activeDeadlineSeconds`` started counting: the job's start, or its last resume (the
    ``Suspended`` condition turned False later), as a Job's clock restarts when it is resumed."""
    status = status or {}
    start = status.get("startTime")
    for cond in status.get("conditions") or []:
        if (
            cond.get("type") == "Suspended"
            and cond.get("status") == "False"
            and cond.get("lastTransitionTime")
        ):
            resumed = str(cond["lastTransitionTime"])
            if start is None or _time(resumed) > _time(str(start)):
                start = resumed
    return str(start) if start else None


def past_deadline(
    limit_s: int | None, status: Mapping[str, Any] | None, now: datetime.datetime
) -> Decision | None:
    """``Fail`` with ``DeadlineExceeded`` once the job has run ``limit_s`` seconds (None: not yet, or no
    limit)."""
    start = deadline_start(status) if limit_s is not None else None
    if limit_s is None or start is None:
        return None
    ran = (now - _time(start)).total_seconds()
    if ran < limit_s:
        return None
    return Decision(
        "Fail", "DeadlineExceeded",
        f"the job ran {ran:.0f} s since {start}, longer than activeDeadlineSeconds {limit_s}; every process "
        "was stopped (the snapshots and checkpoints stay in the store)",
    )  # fmt: skip


# ---------------------------------------------------------------------------------------------
# The trainer Job


TrainerPhase = Literal["Missing", "Terminating", "Running", "Complete", "Failed"]


def trainer_phase(job: Mapping[str, Any] | None) -> TrainerPhase:
    if job is None:
        return "Missing"
    if job.get("metadata", {}).get("deletionTimestamp"):
        return "Terminating"
    for cond in job.get("status", {}).get("conditions") or []:
        if cond.get("status") == "True" and cond.get("type") in ("Complete", "Failed"):
            return "Complete" if cond["type"] == "Complete" else "Failed"
    return "Running"


def failure_reason(job: Mapping[str, Any]) -> str:
    """The Job's Failed condition reason (``BackoffLimitExceeded``, ``PodFailurePolicy``, ...)."""
    for cond in job.get("status", {}).get("conditions") or []:
        if cond.get("type") == "Failed" and cond.get("status") == "True":
            return str(cond.get("reason") or "Failed")
    return "Failed"


def _job_reason_words(reason: str) -> str:
    """The trainer Job's Failed reason as an admin should read it. Its own ``BackoffLimitExceeded`` means
    only that a rank failed (each trainer Job has ``backoffLimit: 0``: the operator restarts the gang
    and counts against the EchoJob's ``backoffLimit``), so it is not quoted: it would read as the end of
    the job on its first restart."""
    if reason in ("BackoffLimitExceeded", "Failed"):
        return ""
    if reason == "PodFailurePolicy":
        return "; a disruption (preemption, eviction or node drain), not counted against backoffLimit"
    return f"; the trainer Job's reason: {reason}"


@dataclasses.dataclass(frozen=True)
class Failure:
    """What one failed trainer attempt tells a human."""

    counted: bool
    """False for disruptions (eviction, preemption): restarted without counting."""
    summary: str
    """One line: which pod, exit code and reason."""
    log_tail: str
    """The last lines of the failed container's log (its termination message), may be empty."""
    oom: bool = False
    """The failed rank was killed for running out of memory (container reason ``OOMKilled``)."""

    def describe(self) -> str:
        return self.summary + (f"; last lines of its log:\n{self.log_tail}" if self.log_tail else "")


def failure_of(job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> Failure:
    """Explain a Failed trainer Job from its pods: the first rank that failed on its own."""
    reason = failure_reason(job)
    counted = reason != "PodFailurePolicy"
    terminated = []
    for pod in pods:
        for status in pod.get("status", {}).get("containerStatuses") or []:
            state = (status.get("state") or {}).get("terminated") or (status.get("lastState") or {}).get(
                "terminated"
            )
            if state and int(state.get("exitCode", 0)) != 0:
                terminated.append((str(state.get("finishedAt") or ""), pod, state))
    if not terminated:
        deleted = [p["metadata"]["name"] for p in pods if p.get("metadata", {}).get("deletionTimestamp")]
        what = f"pod(s) {', '.join(deleted)} deleted" if deleted else "its pods are gone (deleted or evicted)"
        return Failure(counted, f"the trainer stopped: {what}{_job_reason_words(reason)}", "")
    _, pod, state = sorted(terminated, key=lambda t: t[0])[0]
    index = pod.get("metadata", {}).get("labels", {}).get("batch.kubernetes.io/job-completion-index", "?")
    summary = (
        f"trainer pod {pod['metadata']['name']} (rank {index}) exited with code {state.get('exitCode')}"
        f" ({state.get('reason') or 'Error'}){_job_reason_words(reason)}"
    )
    lines = [line for line in str(state.get("message") or "").splitlines() if line.strip()]
    return Failure(counted, summary, "\n".join(lines[-TAIL_LINES:]), oom=state.get("reason") == "OOMKilled")


# ---------------------------------------------------------------------------------------------
# What to do


@dataclasses.dataclass(frozen=True)
class Progress:
    """What the snapshot store holds of the job."""

    latest_version: int | None
    latest_checkpoint: int | None


@dataclasses.dataclass(frozen=True)
class Decision:
    """``action``: Wait (nothing to do), Succeed, Restart (a new trainer Job) or Fail."""

    action: Literal["Wait", "Succeed", "Restart", "Fail"]
    reason: str = ""
    message: str = ""
    counted: bool = False
    """Restart/Fail: whether this failure counts against ``backoffLimit``."""


def decide(
    phase: TrainerPhase,
    failure: Failure | None,
    progress: Progress | None,
    max_steps: int,
    restarts: int,
    backoff_limit: int,
    oom_policy: str = "Fail",
) -> Decision:
    """What the operator does about the trainer Job in ``phase`` (see the module docstring)."""
    if phase == "Complete":
        if progress is None:
            return Decision("Wait", "StoreUnreadable", "the trainer finished; waiting to read the store")
        version, checkpoint = progress.latest_version, progress.latest_checkpoint
        if (
            version is not None
            and version >= max_steps
            and checkpoint is not None
            and checkpoint >= max_steps
        ):
            return Decision(
                "Succeed", "TrainingCompleted",
                f"policy version {version} (maxSteps {max_steps}) and its checkpoint are in the snapshot store",
            )  # fmt: skip
        failure = Failure(
            True,
            f"the trainer exited 0 at policy version {version} (checkpoint {checkpoint}) before maxSteps {max_steps}",
            "",
        )
    elif phase != "Failed":
        return Decision("Wait")
    assert failure is not None
    if failure.oom and oom_policy == "Fail":
        return Decision(
            "Fail", "OOMKilled",
            f"{failure.describe()}; out of memory: the same step would run out again, so the job is not "
            "retried (raise the trainer's memory limit, or lower algorithm.microBatchSize or set "
            "microBatchTokens; oomPolicy: Retry retries it against backoffLimit)",
            counted=True,
        )  # fmt: skip
    if failure.counted and restarts + 1 > backoff_limit:
        return Decision(
            "Fail", "BackoffLimitExceeded",
            f"the trainer failed {restarts + 1} time(s), more than backoffLimit {backoff_limit}; "
            f"last failure: {failure.describe()}",
            counted=True,
        )  # fmt: skip
    return Decision(
        "Restart",
        "TrainerFailed" if failure.counted else "TrainerDisrupted",
        f"{failure.describe()}; restarting every rank from the last checkpoint"
        + (
            f" (failure {restarts + 1} of backoffLimit {backoff_limit})"
            if failure.counted
            else " (not counted)"
        ),
        counted=failure.counted,
    )
