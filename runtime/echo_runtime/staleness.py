"""The staleness rule: may a group be consumed at a trainer version, and how. One pure function.

It lives at the top of the runtime because every part that reasons about Δmax imports it: the
coordinator (admission, pacing), the trainer (its own check on every batch), the simulator and the
operator (which pools cannot keep up).

Definitions (DESIGN.md): a rollout produced by policy version ``v`` and consumed by the optimizer step
that turns ``t`` into ``t+1`` has *staleness* ``t - v``. A group's version is the *oldest* version of its
rollouts, so the group's staleness is the largest of its rollouts'. ``maxStaleness`` (Δmax) bounds it.

:func:`admit` is the only place this rule lives. The coordinator calls it when a group arrives, when a
new version is announced and when it assembles a batch; the trainer calls it again on every group it
receives; the property tests call it as the oracle. :func:`lease_floor` is the same rule read forwards:
the coordinator's *pacing* (lease only what can still be consumed in bound), shared with the simulator.
Promises:

* ``admit(v, t, p).consume`` implies ``0 <= t - v <= p.bound <= p.max_staleness``: nothing consumed ever
  has staleness above Δmax, in either mode and with either stale action. The bound is absolute.
* The bound is Δmax in ``Async`` mode and the refresh threshold in ``Sequential`` mode (the versions a
  sequential batch permits, ``t - refreshThreshold .. t``; the spec guarantees refreshThreshold ≤ Δmax).
* Monotone: once a group is refused as stale at ``t`` it is refused at every ``t' > t``, so the
  coordinator may drop it for good.
* ``staleAction: ImportanceWeight`` never widens the window; it marks the consumed groups that are
  off-policy (staleness > 0) as ``importance_weighted``, telling the trainer to apply truncated
  importance weights (capped at ``importanceWeightCap``) and the coordinator to count them in
  ``weightedStale``. With ``Drop`` they are consumed as they are (the PPO ratio to the behaviour
  log-probs still applies). Groups beyond the bound are dropped and counted in ``droppedStale`` with
  either action.
"""

from __future__ import annotations

import dataclasses
from typing import Literal, Protocol

Mode = Literal["Sequential", "Async"]
"""The modes with a coordinator. A ``Colocated`` spec (one process samples and trains, no coordinator)
becomes ``Sequential`` with refresh threshold 0 in :meth:`StalenessPolicy.from_spec`: staleness 0 only."""
SpecMode = Literal["Sequential", "Async", "Colocated"]
StaleAction = Literal["Drop", "ImportanceWeight"]
Verdict = Literal["fresh", "weighted", "stale", "future"]


class SyncPolicyLike(Protocol):
    """The fields of :class:`echo_runtime.spec.SyncPolicySpec` the rule reads."""

    @property
    def mode(self) -> SpecMode: ...

    @property
    def max_staleness(self) -> int: ...

    @property
    def stale_action(self) -> StaleAction: ...

    @property
    def refresh_threshold(self) -> int: ...


@dataclasses.dataclass(frozen=True)
class StalenessPolicy:
    """The staleness parameters of a sync policy (a frozen copy of the SyncPolicySpec fields)."""

    mode: Mode = "Async"
    max_staleness: int = 1
    stale_action: StaleAction = "Drop"
    refresh_threshold: int = 0

    def __post_init__(self) -> None:
        if self.mode not in ("Sequential", "Async"):
            raise ValueError(f"mode: must be Sequential or Async, got {self.mode!r}")
        if self.max_staleness < 0:
            raise ValueError(f"maxStaleness: must be ≥ 0, got {self.max_staleness}")
        if not 0 <= self.refresh_threshold <= self.max_staleness:
            raise ValueError(
                f"refreshThreshold: must be in 0..maxStaleness ({self.max_staleness}), got {self.refresh_threshold}"
            )

    @classmethod
    def from_spec(cls, spec: SyncPolicyLike) -> StalenessPolicy:
        """The policy of a ``SyncPolicySpec`` (or anything with the same four fields). ``Colocated`` is
        ``Sequential`` with refresh threshold 0: every consumed rollout has staleness 0."""
        if spec.mode == "Colocated":
            return cls("Sequential", spec.max_staleness, spec.stale_action, 0)
        return cls(spec.mode, spec.max_staleness, spec.stale_action, spec.refresh_threshold)

    @property
    def bound(self) -> int:
        """The largest staleness a consumed group may have: Δmax (Async) or refreshThreshold (Sequential)."""
        return self.refresh_threshold if self.mode == "Sequential" else self.max_staleness

    def min_version(self, t_train: int) -> int:
        """The oldest policy version whose groups can still be consumed at ``t_train``."""
        return max(0, t_train - self.bound)


@dataclasses.dataclass(frozen=True)
class Admission:
    """The verdict on one group at one trainer version."""

    consume: bool
    """True if an optimizer step at this version may consume the group."""
    staleness: int
    """``t_train - group_version`` (negative for a version from the future)."""
    importance_weighted: bool
    """True if the trainer must apply truncated importance weights (ImportanceWeight, staleness > 0)."""
    verdict: Verdict
    """``fresh`` or ``weighted`` (consumed), ``stale`` (beyond the bound: drop and count), or
    ``future`` (a version the trainer has not reached: never consumable at this ``t_train``)."""
    reason: str
    """Why, in words, for logs and error messages."""


def admit(group_version: int, t_train: int, policy: StalenessPolicy) -> Admission:
    """Decide whether a group of ``group_version`` may be consumed by the step ``t_train -> t_train+1``."""
    staleness = t_train - group_version
    if staleness < 0:
        return Admission(
            False,
            staleness,
            False,
            "future",
            f"policy version {group_version} is newer than the trainer's version {t_train}",
        )
    bound = policy.bound
    if staleness > bound:
        what = "refreshThreshold" if policy.mode == "Sequential" else "maxStaleness"
        return Admission(
            False,
            staleness,
            False,
            "stale",
            f"staleness {staleness} (version {group_version} at trainer version {t_train}) exceeds {what} {bound}",
        )
    if policy.stale_action == "ImportanceWeight" and staleness > 0:
        return Admission(
            True, staleness, True, "weighted", f"staleness {staleness} ≤ {bound}: importance-weighted"
        )
    return Admission(True, staleness, False, "fresh", f"staleness {staleness} ≤ {bound}")


def consuming_step(next_step: int, position: int, batch_size: int) -> int:
    """The latest step that consumes the group at 0-based ``position`` of the consumption order.

    ``next_step`` is the step whose batch has not been taken yet (``t`` while the trainer waits for the
    batch of ``t``, ``t + 1`` once it took it and trains). Every step takes exactly ``batch_size`` groups,
    oldest version first, so the groups at positions ``k·B .. (k+1)·B − 1`` go to step ``next_step + k`` —
    or earlier, if groups ahead of them are dropped."""
    if batch_size < 1:
        raise ValueError(f"batchSize: must be ≥ 1, got {batch_size}")
    if position < 0:
        raise ValueError(f"position: must be ≥ 0, got {position}")
    return next_step + position // batch_size


def lease_floor(next_step: int, position: int, batch_size: int, policy: StalenessPolicy) -> int:
    """Pacing: the oldest policy version a group leased now may be generated with and still be consumed
    within the bound, if it is the ``position``-th group not yet consumed (0-based: the groups buffered
    and in flight come first).

    The coordinator tags each leased task with this floor as its ``minVersion`` (the worker loads a newer
    snapshot first if it holds an older one) and leases nothing whose floor no published version reaches,
    so generation runs at most ``(bound + 1) · batchSize`` groups ahead of the trainer instead of
    producing groups that are born too stale. Promise: a group of version ``v ≥ lease_floor(...)`` that is
    consumed no later than :func:`consuming_step` passes :func:`admit` there."""
    return policy.min_version(consuming_step(next_step, position, batch_size))


def lease_room(next_step: int, ahead: int, batch_size: int, policy: StalenessPolicy, published: int) -> int:
    """Pacing: how many more groups may be leased now, behind the ``ahead`` groups buffered and in
    flight, so that each can still be consumed in bound when generated with the newest ``published``
    version — the positions whose :func:`lease_floor` is at most ``published``."""
    last_step = published + policy.bound  # the latest step that may consume a group of ``published``
    if last_step < next_step:
        return 0
    return max(0, (last_step - next_step + 1) * batch_size - ahead)


STRAGGLER_FACTOR = 3.0
"""A lease held this many times longer than the swarm's typical group is a straggler's (see
:func:`ahead`)."""


def ahead(buffered: int, leased: int, stragglers: int) -> int:
    """The groups pacing counts ahead of a new lease: buffered ones, and leased ones except stragglers'.

    A lease held more than :data:`STRAGGLER_FACTOR` × the typical group time is not counted: its
    position goes to a worker that will deliver, as a backup task does. Without this a straggler's lease
    would keep the step it was counted in from filling — at Δmax 0 and in Sequential mode the trainer
    would wait for the slowest worker. If the straggler delivers after all, its group is consumed within
    the bound or dropped and counted, like any late group."""
    return max(0, buffered + leased - stragglers)


def time_budget(
    pace_seconds: float | None, next_step: int, published: int, policy: StalenessPolicy
) -> float | None:
    """Pacing in time: how long a group leased now may take and still be consumed in bound.

    A group generated with the newest ``published`` version can be consumed until step
    ``published + bound``; a version goes by every ``pace_seconds``, so ``published + bound − next_step + 1``
    of those are left. The coordinator's pace is the trainer's own step time — or, while the trainer
    waits for groups, how long it has waited, if that is longer. None while the pace is unknown."""
    if pace_seconds is None:
        return None
    return max(0, published + policy.bound - next_step + 1) * pace_seconds


def fast_enough(group_seconds: float | None, budget: float | None, fastest: float | None) -> bool:
    """May a worker whose groups take ``group_seconds`` be leased a task, given the :func:`time_budget`
    and the fastest worker's group time? A worker slower than the budget would hold a task only to hand
    in a group born too stale — or, at Δmax 0 and in Sequential mode, hold up the step while faster
    workers wait — so it is passed over while some worker is fast enough; faster workers take the work.
    Unknown speeds never refuse, and neither does a swarm in which nobody is fast enough (the trainer
    would starve)."""
    if group_seconds is None or budget is None or group_seconds <= budget:
        return True
    return fastest is None or fastest > budget
