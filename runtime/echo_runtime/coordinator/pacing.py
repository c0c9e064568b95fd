"""Pacing: lease only what can still be consumed within the bound, and preferably to who is fast enough.

The rules read forwards live in :mod:`echo_runtime.staleness` (``lease_floor``, ``lease_room``,
``ahead``, ``time_budget``, ``fast_enough``); this module keeps what they are fed — the trainer's step
time, each worker's and the swarm's typical group time, when the trainer began waiting — and applies
them to one lease request (docs/coordinator.md, "Pacing").

Promises (:class:`Pacing`), with ``bound`` Δmax (Async) or the refresh threshold (Sequential):

* a task leased at ``position`` behind the groups buffered and in flight is tagged with
  :meth:`~Pacing.floor`, the oldest version its group may have and still be consumed in bound; a lease
  is granted only while some published version reaches the floor (:meth:`~Pacing.paced`), so a worker
  that generates and submits before the trainer takes another batch never makes a group born too stale;
* a worker known to be slower than the time budget is granted nothing while a faster one exists, and
  everyone is granted work when nobody is fast enough (the trainer must not starve);
* a lease held longer than ``STRAGGLER_FACTOR`` typical group times no longer counts ahead;
* with ``pacing`` off (comparisons only) every task is tagged ``t_train − bound`` and only the buffer
  bounds leasing.

Pure: no I/O, no clock of its own (``now`` is passed in); the roster and the ledger are read, never
changed, except a worker's own group time.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import Any

from echo_runtime import staleness
from echo_runtime.coordinator import buffer, roster
from echo_runtime.coordinator.config import CoordinatorConfig


@dataclasses.dataclass(frozen=True)
class Versions:
    """Where the trainer stands when pacing decides."""

    t_train: int
    published: int
    next_step: int
    """The step whose batch is not taken yet: ``t_train``, or ``t_train + 1`` once its batch went out."""


class Pacing:
    """What pacing has measured, and its decisions for one lease; see the module docstring."""

    def __init__(self, config: CoordinatorConfig) -> None:
        self.config = config
        self.trainer_seconds: float | None = None
        """The trainer's own time per step — from handing it a batch to its asking for the next, waits for
        groups excluded, or the ``stepSeconds`` it sends — a moving average."""
        self.trainer_busy_seconds = 0.0
        """The sum of the trainer's measured step times (each step once): its rate is the fraction of
        wall-clock the trainer spends stepping rather than waiting for batches."""
        self.typical_group_seconds: float | None = None
        """Lease to submission over all workers (a moving average): what makes a lease a straggler's."""
        self._last_take_at: float | None = None
        self._asked: tuple[int, float] | None = None
        """(version, when) of the trainer's first request for the batch it waits for now."""
        self._fastest: tuple[float, float | None] = (-math.inf, None)
        """(when computed, the fastest live worker's group seconds): refreshed at most once a second."""
        self.keep = 1.0
        """How much of a group a leased task is expected to yield: 1, or with dynamic sampling the
        fraction of groups kept (:mod:`.signal`)."""

    # ------------------------------------------------------------------------------------- decisions
    def floor(self, position: int, at: Versions) -> int:
        """The ``minVersion`` of a task leased now at ``position`` (0-based) behind the groups buffered and
        in flight: :func:`~echo_runtime.staleness.lease_floor`, or ``t_train − bound`` without pacing."""
        if not self.config.pacing:
            return self.config.policy.min_version(at.t_train)
        return staleness.lease_floor(at.next_step, position, self.config.batch_size, self.config.policy)

    def ahead(self, ledger: buffer.TaskLedger[Any, Any], now: float) -> int:
        """Groups counted ahead of a new lease (:func:`~echo_runtime.staleness.ahead`): buffered and
        leased, less the stragglers' leases."""
        stragglers = 0
        if self.config.pacing and self.typical_group_seconds is not None:
            late = now - staleness.STRAGGLER_FACTOR * self.typical_group_seconds
            stragglers = ledger.leased_before(late)
        if self.keep >= 1.0:
            return staleness.ahead(ledger.buffered, ledger.leased, stragglers)
        return ledger.buffered + math.ceil(max(0, ledger.leased - stragglers) * self.keep)

    def need(self, ledger: buffer.TaskLedger[Any, Any], at: Versions, now: float) -> int:
        """The oldest version a worker's next task accepts, at most ``published``: in Async the floor of
        the next position, in Sequential the round's ``t − refreshThreshold``."""
        if self.config.policy.mode == "Sequential":
            return min(self.config.policy.min_version(at.t_train), at.published)
        return min(self.floor(self.ahead(ledger, now), at), at.published)

    def paced(
        self,
        want: int,
        worker: roster.WorkerRecord,
        ahead: int,
        at: Versions,
        now: float,
        workers: Iterable[roster.WorkerRecord],
    ) -> int:
        """How many of the ``want`` leases ``worker`` asks for pacing grants it, ``ahead`` groups counted
        before them: none past the room a published version can fill, none for a worker too slow for
        the time budget while a faster one is live (``workers``)."""
        if not self.config.pacing:
            return want
        room = staleness.lease_room(
            at.next_step, ahead, self.config.batch_size, self.config.policy, at.published
        )
        if self.keep < 1.0:
            room = math.floor(room / self.keep)  # tasks, of which ``keep`` become groups
        budget = staleness.time_budget(
            self.pace_seconds(now, at), at.next_step, at.published, self.config.policy
        )
        fast = staleness.fast_enough(worker.group_seconds, budget, self.fastest_group_seconds(now, workers))
        return min(want, room) if fast else 0

    def pace_seconds(self, now: float, at: Versions) -> float | None:
        """Seconds per version for pacing in time: the trainer's own step time, or — while it waits for
        a batch — how long it has waited, if longer: a trainer starved by the workers fast enough for
        its pace admits slower ones, the longer it waits (:func:`~echo_runtime.staleness.fast_enough`)."""
        if self.trainer_seconds is None:
            return None
        waiting = self._asked is not None and at.next_step == self._asked[0] == at.t_train
        waited = now - self._asked[1] if waiting and self._asked is not None else 0.0
        return max(self.trainer_seconds, waited)

    def fastest_group_seconds(self, now: float, workers: Iterable[roster.WorkerRecord]) -> float | None:
        """The group time of the fastest live worker whose speed is known (refreshed once a second)."""
        at, value = self._fastest
        if now - at >= 1.0:
            speeds = [
                w.group_seconds for w in workers if w.group_seconds is not None and w.quarantine is None
            ]
            value = min(speeds) if speeds else None
            self._fastest = (now, value)
        return value

    # ------------------------------------------------------------------------------------- observations
    def delivered(self, worker: roster.WorkerRecord, took: float) -> None:
        """``worker`` delivered a group ``took`` seconds after leasing it."""
        worker.group_seconds = (
            took if worker.group_seconds is None else 0.7 * worker.group_seconds + 0.3 * took
        )
        typical = self.typical_group_seconds
        self.typical_group_seconds = took if typical is None else 0.9 * typical + 0.1 * took

    def asked(self, version: int, now: float, step_seconds: float | None, last_version: int | None) -> None:
        """The trainer asks for the batch of ``version`` (``last_version``: the last batch handed out). Its
        first request for a step measures its step time: the ``step_seconds`` it sends, else the time
        since it was handed the batch of the step before."""
        if self._asked is not None and self._asked[0] == version:
            return
        took: float | None = None
        if step_seconds is not None:
            took = max(0.0, step_seconds)
        elif self._last_take_at is not None and last_version == version - 1:
            took = max(0.0, now - self._last_take_at)
        if took is not None:
            own = self.trainer_seconds
            self.trainer_seconds = took if own is None else 0.8 * own + 0.2 * took
            self.trainer_busy_seconds += took
        self._asked = (version, now)

    def taken(self, now: float) -> None:
        """The trainer was handed a batch at ``now``."""
        self._last_take_at = now

    def rewound(self) -> None:
        """The trainer went back a version (:meth:`.handout.Handout.rewind`): its next request is a first."""
        self._asked = None
