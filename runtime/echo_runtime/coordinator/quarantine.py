"""The coordinator's record of caught workers: who, why, at which version — kept for the job's life.

A worker is quarantined when the trainer finds its behaviour log-probs disagree with its own
recomputation (``POST /v1/trainer/quarantine``), or when it hoards leases: its leases run past the task
timeout :data:`HOARDING_EXPIRIES` sweeps in a row while it keeps heartbeating and submits nothing.

Promises (:class:`Quarantines`):

* the first record of a worker stands: a second report (the trainer retrying, or another reason)
  changes nothing, so the status names the reason it was caught for;
* a record outlives the worker's registration (it may expire or leave), so a caught worker keeps
  counting against its pool's ``maxWorkers`` and its id is never handed out again.

What quarantine *does* to the worker's leases, buffered groups and the batch in hand is the
composition's (:meth:`.state.CoordinatorState.quarantine`); this module is the record and the rule.
Pure and in-memory.
"""

from __future__ import annotations

import dataclasses

HOARDING_EXPIRIES = 3
"""A live worker whose leases run past the task timeout this many times in a row, with no submission
in between, is quarantined as a lease hoarder (or hung: its pod should be restarted either way)."""


@dataclasses.dataclass(frozen=True)
class Quarantine:
    """Why and when a worker was quarantined (kept for the job's life, also after it expires)."""

    worker_id: str
    pool: str
    host: str | None
    reason: str
    mismatch: float | None
    version: int
    """The trainer version at which the worker was caught."""
    trained_groups: int = 0
    """Its groups that optimizer steps had already trained on when it was caught (handed out in
    batches before the one it was caught in, which is withdrawn)."""


def hoarding(overdue: int) -> bool:
    """Whether a live worker whose leases overran ``overdue`` sweeps in a row is a lease hoarder."""
    return overdue >= HOARDING_EXPIRIES


def hoarding_reason(overdue: int, task_timeout: float) -> str:
    return (
        f"lease hoarding: its leases ran past the task timeout ({task_timeout:g}s) "
        f"{overdue} times in a row while it kept heartbeating, with no submission"
    )


class Quarantines:
    """Every worker caught so far, in the order they were caught."""

    def __init__(self) -> None:
        self.records: dict[str, Quarantine] = {}

    def __contains__(self, worker_id: object) -> bool:
        return worker_id in self.records

    def catch(
        self,
        worker_id: str,
        *,
        pool: str,
        host: str | None,
        reason: str,
        mismatch: float | None,
        version: int,
        trained_groups: int = 0,
    ) -> Quarantine:
        """Record ``worker_id`` as caught (unless it already is) and return its record."""
        known = self.records.get(worker_id)
        if known is not None:
            return known
        record = Quarantine(worker_id, pool, host, reason, mismatch, version, trained_groups)
        self.records[worker_id] = record
        return record

    def in_pool(self, pool: str) -> int:
        """How many of ``pool``'s workers were caught."""
        return sum(1 for q in self.records.values() if q.pool == pool)
