"""Status conditions the Kubernetes way: typed, with a CamelCase reason, a message, and stable times.

A condition's ``lastTransitionTime`` changes only when its ``status`` changes (API conventions), so
re-computing the same state every few seconds writes nothing new. :func:`merge` applies that rule;
:func:`transitions` lists the changes worth an Event. The types and what "good" means for each
(``Succeeded`` and ``Failed`` appear only once the job is over, like a Kubernetes Job's):

=================  ============  =========================================================
type               good status   meaning
=================  ============  =========================================================
Ready              True          coordinator serving, trainer ready, every in-cluster pool has a worker
Progressing        True          policy versions are advancing (False: Completed or Suspended)
StalenessBounded   True          every pool keeps up with Δmax (False names the pools that do not)
LearningSignal     True          batches carry groups whose rewards differ (False: the job learns nothing,
                                 or dynamic sampling filters nearly every group)
Degraded           False         something needs a human: a missing reference, storage, the bound
Suspended          False         ``spec.suspend`` scaled the job to zero
Succeeded          True          the final version and its checkpoint are in the store
Failed             False         the trainer failed more often than ``spec.backoffLimit``
=================  ============  =========================================================
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from echo_runtime.spec.status import ConditionType

Status = Literal["True", "False", "Unknown"]
TYPES: tuple[ConditionType, ...] = (
    "Ready", "Progressing", "StalenessBounded", "LearningSignal", "Degraded", "Suspended", "Succeeded", "Failed"
)  # fmt: skip
GOOD: Mapping[str, Status] = {
    "Ready": "True",
    "Progressing": "True",
    "StalenessBounded": "True",
    "LearningSignal": "True",
    "Degraded": "False",
    "Suspended": "False",
    "Succeeded": "True",
    "Failed": "False",
}


@dataclasses.dataclass(frozen=True)
class Condition:
    """One condition, before it gets its transition time: an EchoJob's (:data:`TYPES`) or one the
    operator writes on another object (a Kueue Workload's, :mod:`echo_operator.queueing`)."""

    type: str
    status: Status
    reason: str
    message: str

    def to_status(self, generation: int | None, transition_time: str) -> dict[str, Any]:
        out: dict[str, Any] = {
            "type": self.type,
            "status": self.status,
            "reason": self.reason,
            "message": self.message,
            "lastTransitionTime": transition_time,
        }
        if generation is not None:
            out["observedGeneration"] = generation
        return out


def merge(
    previous: Sequence[Mapping[str, Any]],
    current: Iterable[Condition],
    generation: int | None,
    now: str,
) -> list[dict[str, Any]]:
    """The new ``status.conditions``: ``lastTransitionTime`` kept where ``status`` did not change.

    Conditions of other types in ``previous`` (set by someone else) are kept as they are.
    """
    old = {str(c.get("type")): c for c in previous}
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for cond in current:
        before = old.get(cond.type)
        when = now
        if before is not None and before.get("status") == cond.status and before.get("lastTransitionTime"):
            when = str(before["lastTransitionTime"])
        out.append(cond.to_status(generation, when))
        seen.add(cond.type)
    out.extend(dict(c) for t, c in old.items() if t not in seen)
    return out


_ENDED_WELL = frozenset({"JobSucceeded", "Completed", "TrainerFinished"})
"""Reasons of a not-Ready, not-Progressing job that is simply done."""


@dataclasses.dataclass(frozen=True)
class Transition:
    """A condition whose status or reason changed: the raw material of an Event."""

    condition: Condition
    previous_status: str

    @property
    def warning(self) -> bool:
        """Warning when the new state is a bad one (Suspended is a user's choice, not a problem)."""
        if self.condition.type == "Suspended" or self.condition.reason in _ENDED_WELL:
            return False
        return self.condition.status != GOOD[self.condition.type]


def transitions(previous: Sequence[Mapping[str, Any]], current: Iterable[Condition]) -> list[Transition]:
    """Conditions whose ``status`` or ``reason`` differ from ``previous`` (new ones included).

    A condition's first value is not news: a new job is not Ready yet, and the problems that make a
    first status Degraded have their own Events already.
    """
    old = {str(c.get("type")): c for c in previous}
    out: list[Transition] = []
    for cond in current:
        before = old.get(cond.type)
        if before is None:
            continue
        if before.get("status") != cond.status or before.get("reason") != cond.reason:
            out.append(Transition(cond, str(before.get("status"))))
    return out


def find(conditions: Sequence[Mapping[str, Any]], type_: str) -> Mapping[str, Any] | None:
    return next((c for c in conditions if c.get("type") == type_), None)
